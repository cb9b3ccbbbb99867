"""Bad input to the importers: each bad row is skipped and counted with its reason, the rest imported;
no value outside its column's physical range is ever stored; odd encodings read; FIFOs refused; each
sample stored once; a failed import leaves nothing behind. Fuzzed with Hypothesis."""

from __future__ import annotations

import codecs
import datetime as dt
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collector._import_dcgm import import_files as import_dcgm
from collector._import_smi import FIELDS as SMI_FIELDS
from collector._import_smi import import_files as import_smi
from collector.schema import GPU_SAMPLES, valid_mask

CLI = [sys.executable, "-m", "collector.cli"]
HEADER = "timestamp, index, uuid, utilization.gpu [%], memory.used [MiB], temperature.gpu\n"
GOOD = "2024/05/01 12:00:0{s}, 0, GPU-a, 35 %, 1234 MiB, 40\n"

# One impossible value per line; each must be skipped, never stored, never a traceback.
IMPOSSIBLE_SMI = [
    "2024/05/01 12:00:10, 40000, GPU-a, 35 %, 1234 MiB, 40",  # index past any host's
    "2024/05/01 12:00:11, 12345678901234567890, GPU-a, 35 %, 1234 MiB, 40",  # a 20-digit index
    "2024/05/01 12:00:12, 0, GPU-a, 35 %, 100000000000000000000000 MiB, 40",  # 10^23 MiB
    "0001/01/01 00:00:00, 0, GPU-a, 35 %, 1234 MiB, 40",  # year 1 in a zone east of UTC
    "9999/12/31 23:59:59, 0, GPU-a, 35 %, 1234 MiB, 40",  # year 9999
    "2024/05/01 12:00:13, 0, GPU-a, 999999 %, 1234 MiB, 40",
    "2024/05/01 12:00:14, 0, GPU-a, -5 %, 1234 MiB, 40",
    "2024/05/01 12:00:15, 0, GPU-a, 35 %, -1 MiB, 40",
    "2024/05/01 12:00:16, 0, GPU-a, 35 %, 1234 MiB, -300",
    "2024/05/01 12:00:17, 0, GPU-a, +Inf %, 1234 MiB, 40",
    "2024/05/01 12:00:18, 0, GPU-a, NaN, 1234 MiB, 40",
]


def stored(out: Path) -> list[dict]:
    folder = out / "gpu_samples"
    if not folder.exists():
        return []
    return pq.read_table(folder, partitioning="hive").to_pylist()


def assert_all_in_range(out: Path) -> None:
    folder = out / "gpu_samples"
    if folder.exists():
        table = pq.read_table(folder, partitioning="hive")
        assert valid_mask(GPU_SAMPLES, table) is None, "a value outside its column's range was stored"


def run(*args, timeout=60):
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def test_impossible_nvidia_smi_values_skip_their_rows_and_keep_the_rest(tmp_path):
    """Each out-of-range or impossible value (index 40000, a 20-digit index, 10^23 MiB, year 1 and
    9999 in a time zone, 999999 %, -5 %, -1 MiB, -300 °C, +Inf, NaN) skips its row with a count and
    a reason; the good rows are stored and the headline never reads above 100 %."""
    log = tmp_path / "smi.csv"
    log.write_text(HEADER + GOOD.format(s=0) + "\n".join(IMPOSSIBLE_SMI) + "\n" + GOOD.format(s=1))
    report = import_smi([log], tmp_path / "out", host="h", tz="Asia/Tokyo")
    assert report.rows == 2
    assert report.rejected + report.malformed == len(IMPOSSIBLE_SMI)
    assert report.read == report.rows + report.rejected + report.malformed + report.duplicates
    assert report.first_rejected.startswith("smi.csv:line ")
    rows = stored(tmp_path / "out")
    assert sorted(r["util_gpu_mean"] for r in rows) == [pytest.approx(0.35)] * 2
    assert_all_in_range(tmp_path / "out")

    proc = run("import", "nvidia-smi", log, "--out", tmp_path / "cli", "--host", "h", "--tz", "Asia/Tokyo")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "impossible values rejected" in proc.stdout and "util_gpu_mean" in proc.stdout


def dcgm_line(metric: str, gpu: str, value: str, host: str = "node7") -> str:
    return f'{metric}{{gpu="{gpu}",UUID="GPU-{gpu}",Hostname="{host}"}} {value}\n'


def test_impossible_dcgm_values_skip_their_rows_and_keep_the_rest(tmp_path):
    """dcgm rows holding +Inf, NaN, 10^23 MiB, -300 °C or a 20-digit gpu label are skipped with a
    count and a reason; the GPUs with sane values are stored."""
    dump = tmp_path / "dcgm.txt"
    dump.write_text(
        dcgm_line("DCGM_FI_DEV_GPU_UTIL", "0", "35")
        + dcgm_line("DCGM_FI_DEV_GPU_UTIL", "1", "+Inf")
        + dcgm_line("DCGM_FI_DEV_FB_USED", "2", "NaN")
        + dcgm_line("DCGM_FI_DEV_FB_USED", "3", "100000000000000000000000")
        + dcgm_line("DCGM_FI_DEV_GPU_TEMP", "4", "-300")
        + dcgm_line("DCGM_FI_DEV_GPU_UTIL", "12345678901234567890", "35")
        + dcgm_line("DCGM_FI_DEV_GPU_UTIL", "5", "50")
    )
    when = dt.datetime(2026, 3, 4, 12, 0, tzinfo=dt.UTC).timestamp()
    os.utime(dump, (when, when))
    report = import_dcgm([dump], tmp_path / "out", host=None, interval_s=None)
    assert (report.rows, report.rejected, report.read) == (2, 5, 7)
    assert set(report.rejected_columns) == {"util_gpu_mean", "mem_used_bytes", "temperature_c", "gpu_index"}
    assert sorted(r["gpu_index"] for r in stored(tmp_path / "out")) == [0, 5]
    assert_all_in_range(tmp_path / "out")


def test_dcgm_timestamp_past_the_calendar_is_rejected_not_a_traceback(tmp_path):
    """A scrape stamped in year 9999 (or past what a date can hold) skips its rows with a reason."""
    dump = tmp_path / "dcgm.txt"
    dump.write_text(
        dcgm_line("DCGM_FI_DEV_GPU_UTIL", "0", "35 253402300799000")
        + dcgm_line("DCGM_FI_DEV_GPU_UTIL", "0", "35 99999999999999999999")
    )
    proc = run("import", "dcgm", dump, "--out", tmp_path / "out")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "ts" in proc.stdout and not (tmp_path / "out" / "gpu_samples").exists()


@pytest.mark.parametrize(
    "encoding, bom",
    [("utf-8", codecs.BOM_UTF8), ("utf-16-le", codecs.BOM_UTF16_LE), ("utf-16-be", codecs.BOM_UTF16_BE)],
)
def test_byte_order_marks_are_read(tmp_path, encoding, bom):
    """A log saved with a byte-order mark (UTF-8 from Excel, UTF-16 from PowerShell's >) imports whole."""
    log = tmp_path / "smi.csv"
    log.write_bytes(bom + (HEADER + GOOD.format(s=0) + GOOD.format(s=1)).encode(encoding))
    report = import_smi([log], tmp_path / "out", host="h", tz="UTC")
    assert (report.rows, report.malformed, report.rejected) == (2, 0, 0)


@pytest.mark.parametrize("kind", ["nvidia-smi", "dcgm"])
def test_a_fifo_is_refused_at_once(tmp_path, kind):
    """A FIFO (or another non-regular file) is refused in one line before anything is read: the
    import neither waits on it nor writes anything."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    good = tmp_path / "good.csv"
    good.write_text(HEADER + GOOD.format(s=0))
    proc = run("import", kind, good, fifo, "--out", tmp_path / "out", timeout=20)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "not a regular file" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_duplicate_rows_and_reimports_store_each_sample_once(tmp_path):
    """A log with repeated rows, the same file given twice, and the import run again all store each
    sample once; running it again is not an error."""
    log = tmp_path / "smi.csv"
    log.write_text(HEADER + GOOD.format(s=0) + GOOD.format(s=0) + GOOD.format(s=1))
    out = tmp_path / "out"
    first = run("import", "nvidia-smi", log, log, "--out", out, "--host", "h", "--tz", "UTC")
    assert first.returncode == 0, first.stderr
    again = run("import", "nvidia-smi", log, "--out", out, "--host", "h", "--tz", "UTC")
    assert again.returncode == 0, again.stderr
    rows = stored(out)
    assert len(rows) == 2
    assert len({(r["ts"], r["gpu_uuid"]) for r in rows}) == 2


def test_a_dcgm_import_that_fails_part_way_leaves_nothing(tmp_path):
    """When the second host's samples cannot be written, the first host's segments already written
    are removed: one line, a non-zero exit, nothing half-imported."""
    dump = tmp_path / "dcgm.txt"
    dump.write_text(
        dcgm_line("DCGM_FI_DEV_GPU_UTIL", "0", "35", host="a1")
        + dcgm_line("DCGM_FI_DEV_GPU_UTIL", "0", "40", host="b2")
    )
    when = dt.datetime(2026, 3, 4, 12, 0, tzinfo=dt.UTC).timestamp()
    os.utime(dump, (when, when))
    out = tmp_path / "out"
    blocked = out / "gpu_samples" / "date=2026-03-04" / "host=b2"
    blocked.parent.mkdir(parents=True)
    blocked.write_text("a file where host b2's folder would go")
    proc = run("import", "dcgm", dump, "--out", out)
    assert proc.returncode != 0 and proc.stderr.count("\n") == 1, proc.stderr
    assert list(out.rglob("*.parquet")) == []


# -- fuzzing --------------------------------------------------------------------------------------------
NUMBERS = st.one_of(
    st.integers(0, 100).map(str),  # mostly sane, so that rows get stored too
    st.integers(-(10**25), 10**25).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["[N/A]", "[Not Supported]", "", "nan", "inf", "-0", "1e5", "35 %", "12 MiB", "3 GHz"]),
)
CELLS = st.one_of(NUMBERS, st.text(max_size=12))
STAMPS = st.one_of(
    st.datetimes(dt.datetime(2001, 1, 1), dt.datetime(2098, 1, 1)).map(
        lambda d: d.strftime("%Y/%m/%d %H:%M:%S")
    ),
    st.datetimes(dt.datetime(1, 1, 2), dt.datetime(9999, 12, 30)).map(
        lambda d: d.strftime("%Y/%m/%d %H:%M:%S")
    ),
    st.text(max_size=20),
)
SMI_COLUMNS = sorted(SMI_FIELDS)
ENCODINGS = st.sampled_from([("utf-8", b""), ("utf-8", codecs.BOM_UTF8), ("utf-16-le", codecs.BOM_UTF16_LE)])


@st.composite
def smi_logs(draw) -> str:
    columns = [
        "timestamp",
        *draw(st.lists(st.sampled_from(SMI_COLUMNS), min_size=1, max_size=6, unique=True)),
    ]
    if not {"index", "uuid", "gpu_uuid"} & set(columns):
        columns.append("index")
    lines = [", ".join(columns)]
    for _ in range(draw(st.integers(0, 8))):
        cells = [draw(STAMPS), *(draw(CELLS) for _ in columns[1:])]
        if draw(st.booleans()):
            cells = cells[: draw(st.integers(0, len(cells)))]  # a short line now and then
        lines.append(", ".join(c.replace(",", ";").replace("\n", " ") for c in cells))
    return "\n".join(lines) + "\n"


FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(text=smi_logs(), encoding=ENCODINGS, tz=st.sampled_from(["UTC", "Pacific/Kiritimati", "America/Adak"]))
def test_fuzzed_nvidia_smi_logs_never_raise_and_store_only_sane_rows(text, encoding, tz):
    """Random columns, values and encodings: no exception, every row read is stored, malformed,
    rejected or a duplicate, and every value stored is within its column's physical range."""
    codec, bom = encoding
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp, "smi.csv")
        log.write_bytes(bom + text.encode(codec, errors="replace"))
        report = import_smi([log], Path(tmp, "out"), host="h", tz=tz)
        assert report.read == report.rows + report.malformed + report.rejected + report.duplicates
        assert len(stored(Path(tmp, "out"))) == report.rows
        assert_all_in_range(Path(tmp, "out"))


DCGM_METRICS = [
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
]


@st.composite
def dcgm_dumps(draw) -> str:
    lines = []
    for _ in range(draw(st.integers(0, 12))):
        metric = draw(st.sampled_from(DCGM_METRICS))
        gpu = draw(
            st.one_of(st.integers(0, 10**21).map(str), st.text(max_size=6).map(lambda t: t.replace('"', "")))
        )
        labels = f'gpu="{gpu}",UUID="GPU-{draw(st.integers(0, 3))}"'
        if draw(st.booleans()):
            labels += f',Hostname="{draw(st.text(max_size=8)).replace(chr(34), "")}"'
        value = draw(NUMBERS) if draw(st.booleans()) else draw(CELLS)
        stamp = f" {draw(st.integers(-(10**20), 10**20))}" if draw(st.booleans()) else ""
        lines.append(f"{metric}{{{labels}}} {value}{stamp}".replace("\n", " "))
    return "\n".join(lines) + "\n"


@FUZZ
@given(text=dcgm_dumps(), encoding=ENCODINGS)
def test_fuzzed_dcgm_dumps_never_raise_and_store_only_sane_rows(text, encoding):
    """Random metric lines, labels, values and timestamps: no exception, every row (a GPU in a scrape)
    is stored, rejected or a duplicate, and every value stored is within its column's range."""
    codec, bom = encoding
    with tempfile.TemporaryDirectory() as tmp:
        dump = Path(tmp, "dcgm.txt")
        dump.write_bytes(bom + text.encode(codec, errors="replace"))
        report = import_dcgm([dump], Path(tmp, "out"), host=None, interval_s=None)
        assert report.read == report.rows + report.rejected + report.duplicates
        assert len(stored(Path(tmp, "out"))) == report.rows
        assert_all_in_range(Path(tmp, "out"))
