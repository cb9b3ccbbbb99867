"""Importing nvidia-smi CSV logs and dcgm-exporter /metrics dumps: good input, odd input, bad lines."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys

import pytest

import analytics
from collector._import_dcgm import import_files as import_dcgm
from collector._import_smi import import_files as import_smi

CLI = [sys.executable, "-m", "collector.cli"]

SMI_UNITS = """\
timestamp, index, name, uuid, utilization.gpu [%], utilization.memory [%], memory.used [MiB], memory.total [MiB], power.draw [W], temperature.gpu, clocks.sm [MHz], pstate
2024/05/01 12:00:00.123, 0, NVIDIA H100 80GB HBM3, GPU-aaaa, 35 %, 10 %, 1234 MiB, 81559 MiB, 123.45 W, 45, 1980 MHz, P0
2024/05/01 12:00:00.125, 1, NVIDIA H100 80GB HBM3, GPU-bbbb, [N/A], 0 %, 0 MiB, 81559 MiB, [Not Supported], 30, 345 MHz, P8

timestamp, index, name, uuid, utilization.gpu [%], utilization.memory [%], memory.used [MiB], memory.total [MiB], power.draw [W], temperature.gpu, clocks.sm [MHz], pstate
2024/05/01 12:00:01.124, 0, NVIDIA H100 80GB HBM3, GPU-aaaa, 100 %, 40 %, 2048 MiB, 81559 MiB, 650.00 W, 60, 1980 MHz, P0
2024/05/01 12:00:01.126, 1, NVIDIA H100 80GB HBM3, GPU-bbbb, 0 %, 0 %, 0 MiB, 81559 MiB, 70.10 W, 31, 345 MHz, P8
"""

SMI_NOUNITS = """\
timestamp, index, utilization.gpu [%], memory.used [MiB], power.draw [W], clocks.current.sm [MHz]
2024/05/01 12:00:00, 0, 35, 1234, 123.45, 1980
2024/05/01 12:00:01, 0, 50, 1300, N/A, 1980
"""

SMI_BAD = """\
2024/05/01 11:59:59.000, 0, 1
timestamp, index, utilization.gpu [%], memory.used [MiB]
2024/05/01 12:00:00.000, 0, 35 %, 1234 MiB
2024/05/01 12:00:01.000, 0, 35 %
2024/05/01 12:00:02.000, 0, lots %, 1234 MiB
yesterday, 0, 35 %, 1234 MiB
2024/05/01 12:00:04.000, 0, 36 %, 1235 MiB
"""


def query(root, sql):
    return analytics.open_telemetry(root).execute(sql).fetchall()


def test_nvidia_smi_with_units_and_repeated_headers(tmp_path):
    log = tmp_path / "smi.csv"
    log.write_text(SMI_UNITS)
    report = import_smi([log], tmp_path / "out", host="gpu-7", tz="UTC")
    assert report.rows == 4 and report.malformed == 0
    assert "pstate" in report.ignored_columns
    got = query(
        tmp_path / "out",
        "SELECT gpu_index, gpu_uuid, util_gpu_mean, util_mem_mean, mem_used_bytes, mem_total_bytes, power_w, "
        "temperature_c, sm_clock_hz, source, simulated, host, epoch_ms(ts) FROM gpu_samples ORDER BY ts, gpu_index",
    )
    first = got[0]
    assert first[:4] == (0, "GPU-aaaa", pytest.approx(0.35), pytest.approx(0.10))
    assert first[4:9] == (1234 * 2**20, 81559 * 2**20, pytest.approx(123.45), 45.0, 1980e6)
    assert first[9:12] == ("nvidia-smi", False, "gpu-7")
    assert first[12] == dt.datetime(2024, 5, 1, 12, 0, 0, 123000, tzinfo=dt.UTC).timestamp() * 1000
    assert got[1][2] is None and got[1][6] is None  # [N/A] and [Not Supported] are null, not 0
    assert got[2][2] == pytest.approx(1.0)


def test_nvidia_smi_nounits_and_time_zone(tmp_path):
    log = tmp_path / "smi.csv"
    log.write_text(SMI_NOUNITS)
    report = import_smi([log], tmp_path / "out", host="h", tz="Europe/Berlin")
    assert report.rows == 2 and report.malformed == 0
    got = query(
        tmp_path / "out",
        "SELECT util_gpu_mean, mem_used_bytes, power_w, sm_clock_hz, hour(ts AT TIME ZONE 'UTC') FROM gpu_samples ORDER BY ts",
    )
    assert got[0] == (pytest.approx(0.35), 1234 * 2**20, pytest.approx(123.45), 1980e6, 10)  # 12:00 CEST
    assert got[1][2] is None


def test_nvidia_smi_malformed_lines_are_counted_and_reported(tmp_path):
    log = tmp_path / "bad.csv"
    log.write_text(SMI_BAD)
    report = import_smi([log], tmp_path / "out", host="h", tz="UTC")
    assert report.rows == 2 and report.malformed == 4
    assert report.first_malformed.startswith("bad.csv:line 1: data before any header")
    summary = report.summary()
    assert "imported 2 rows" in summary and "4 malformed lines skipped (first: bad.csv:line 1" in summary


def test_nvidia_smi_import_cli(tmp_path):
    log = tmp_path / "smi.csv"
    log.write_text(SMI_UNITS)
    bad = tmp_path / "bad.csv"
    bad.write_text(SMI_BAD)
    proc = subprocess.run(
        [*CLI, "import", "nvidia-smi", str(log), str(bad), "--out", str(tmp_path / "out"), "--host", "gpu-7"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "TZ": "UTC"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (
        "imported 6 rows from 2 files (host gpu-7), 4 malformed lines skipped (first: bad.csv:line 1"
        in proc.stdout
    )
    missing = subprocess.run(
        [*CLI, "import", "nvidia-smi", str(tmp_path / "nope.csv"), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert missing.returncode != 0 and "Traceback" not in missing.stderr
    assert (
        missing.stderr.strip()
        == f"gpustat-collect: error: file not found: {tmp_path / 'nope.csv'} (hint: check the path)"
    )


LABELS = 'gpu="{g}",UUID="GPU-{g}{g}{g}",device="nvidia{g}",modelName="NVIDIA H100 80GB HBM3",Hostname="node7",DCGM_FI_DRIVER_VERSION="550.54.15"'


def dcgm_dump(util0: float, *, bad: bool = False) -> str:
    lines = [
        "# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).",
        "# TYPE DCGM_FI_DEV_SM_CLOCK gauge",
    ]
    for g in (0, 1):
        labels = LABELS.format(g=g)
        lines += [
            f"DCGM_FI_DEV_SM_CLOCK{{{labels}}} 1980",
            f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {util0 if g == 0 else 0}",
            f"DCGM_FI_DEV_FB_USED{{{labels}}} 1234",
            f"DCGM_FI_DEV_FB_FREE{{{labels}}} 80000",
            f"DCGM_FI_DEV_FB_RESERVED{{{labels}}} 325",
            f"DCGM_FI_DEV_POWER_USAGE{{{labels}}} 123.5",
            f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{labels}}} 5000000",
            f"DCGM_FI_PROF_SM_ACTIVE{{{labels}}} 0.42",
            f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{labels}}} 0.2",
            f"DCGM_FI_DEV_XID_ERRORS{{{labels}}} 0",
        ]
    if bad:
        lines.insert(5, 'DCGM_FI_DEV_GPU_UTIL{gpu="1" 35')
        lines.append("DCGM_FI_DEV_GPU_UTIL 12")  # no gpu label
    return "\n".join(lines) + "\n"


def test_dcgm_dump_imports_into_the_schema(tmp_path):
    dump = tmp_path / "dcgm.txt"
    dump.write_text(dcgm_dump(35) + dcgm_dump(70))  # two scrapes in one file
    when = dt.datetime(2026, 3, 4, 12, 0, tzinfo=dt.UTC).timestamp()
    os.utime(dump, (when, when))
    report = import_dcgm([dump], tmp_path / "out", host=None, interval_s=30.0)
    assert report.rows == 4 and report.malformed == 0 and report.hosts == {"node7"}
    got = query(
        tmp_path / "out",
        "SELECT epoch(ts), gpu_index, gpu_uuid, gpu_name, util_gpu_mean, mem_used_bytes, mem_total_bytes, power_w, "
        "energy_j, sm_clock_hz, sm_activity, tensor_activity, source, host FROM gpu_samples ORDER BY ts, gpu_index",
    )
    assert [r[0] for r in got] == [when - 30, when - 30, when, when]
    first = got[0]
    assert first[1:4] == (0, "GPU-000", "NVIDIA H100 80GB HBM3")
    assert first[4] == pytest.approx(0.35) and got[2][4] == pytest.approx(0.70)
    assert first[5:7] == (1234 * 2**20, (1234 + 80000 + 325) * 2**20)
    assert first[7:12] == (
        pytest.approx(123.5),
        pytest.approx(5000.0),
        1980e6,
        pytest.approx(0.42),
        pytest.approx(0.2),
    )
    assert first[12:] == ("dcgm", "node7")


def test_dcgm_malformed_lines_are_counted_and_the_rest_imported(tmp_path):
    dump = tmp_path / "dcgm.txt"
    dump.write_text(dcgm_dump(35, bad=True))
    proc = subprocess.run(
        [*CLI, "import", "dcgm", str(dump), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        "imported 2 rows from 1 file (host node7), 2 malformed lines skipped (first: dcgm.txt:line 6:"
        in proc.stdout
    )
    assert query(tmp_path / "out", "SELECT count(*) FROM gpu_samples WHERE util_gpu_mean IS NOT NULL") == [
        (2,)
    ]
