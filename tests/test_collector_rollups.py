"""Rollups kept up to date where telemetry is written: compact, import, the collector's and the
server's background keeper (collector._rollup_keeper), with retention (--keep-raw)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from test_analytics_data import GIB, gpu_rows, write_rows

import analytics as A
from collector import RollupKeeper, RollupOptions, cli, rollups

FIRST = datetime(2026, 3, 1, tzinfo=UTC)


def _minutes(root, host: str, start: datetime, days: int) -> None:
    rows = []
    for g in range(2):
        utils = [((i * 7 + g) % 11) / 10 for i in range(days * 24 * 60)]
        rows += gpu_rows(
            host, g, utils, tick_s=60, start=start, mem_used=[(i % 3) * GIB for i in range(len(utils))]
        )
    write_rows(root, "gpu_samples", rows)


def _raw_days(root, host: str) -> list[str]:
    return sorted(p.parent.name[5:] for p in root.glob(f"gpu_samples/date=*/host={host}"))


def test_compact_brings_rollups_up_to_date_and_expires_covered_raw_days(tmp_path, capsys):
    _minutes(tmp_path, "n1", FIRST, 5)
    raw = A.fleet_summary(A.open_telemetry(tmp_path))
    # Every day is older than 2 days (the data is from March 2026... as seen from "now", any later day).
    assert cli.main(["compact", str(tmp_path), "--keep-raw", "2d"]) == 0
    out = capsys.readouterr().out
    assert "rollups: 14,400 samples of 1 host rolled up" in out
    # The last day is only covered up to 23:50 (the newest sample less 10 minutes): it stays raw.
    assert "4 raw day partitions expired" in out and "1 old raw day partition kept" in out
    assert _raw_days(tmp_path, "n1") == ["2026-03-05"]
    s = A.fleet_summary(A.open_telemetry(tmp_path))
    assert "rollups" in s.data_source
    assert (s.samples, s.gpu_hours, s.idle_gpu_hours) == (
        raw.samples,
        pytest.approx(raw.gpu_hours),
        pytest.approx(raw.idle_gpu_hours),
    )
    # Without rollups nothing would have gone.
    other = tmp_path / "other"
    _minutes(other, "n2", FIRST, 3)
    assert cli.main(["compact", str(other), "--keep-raw", "1d", "--no-rollups"]) == 0
    assert len(_raw_days(other, "n2")) == 3 and not list(other.glob("gpu_rollup_*"))


def test_an_import_is_rolled_up_and_so_is_an_older_one_later(tmp_path, capsys):
    def smi(start: datetime, minutes: int) -> str:
        lines = ["timestamp, index, name, uuid, utilization.gpu [%], memory.used [MiB], memory.total [MiB]"]
        for i in range(minutes * 6):
            t = start + timedelta(seconds=10 * i)
            lines.append(
                f"{t:%Y/%m/%d %H:%M:%S}.000, 0, NVIDIA H100 80GB HBM3, GPU-aaaa, {i % 100} %, 1024 MiB, 81559 MiB"
            )
        return "\n".join(lines) + "\n"

    new, old = tmp_path / "new.csv", tmp_path / "old.csv"
    new.write_text(smi(FIRST + timedelta(hours=5), 60))
    old.write_text(smi(FIRST + timedelta(hours=2), 60))
    out = tmp_path / "t"
    assert (
        cli.main(["import", "nvidia-smi", str(new), "--out", str(out), "--host", "gpu-7", "--tz", "UTC"]) == 0
    )
    assert "rollups: 360 samples of 1 host rolled up" in capsys.readouterr().out
    marks = rollups.host_marks(out, "gpu-7")
    assert marks["1m"] == int((FIRST + timedelta(hours=5, minutes=49)).timestamp() * 1e6)
    assert (
        cli.main(["import", "nvidia-smi", str(old), "--out", str(out), "--host", "gpu-7", "--tz", "UTC"]) == 0
    )
    s = A.fleet_summary(A.open_telemetry(out))
    raw = A.fleet_summary(A.open_telemetry(out, rollups=False))
    assert "rollups" in s.data_source and s.samples == raw.samples == 720
    assert s.util_gpu_mean == pytest.approx(raw.util_gpu_mean) and s.gpu_hours == pytest.approx(raw.gpu_hours)
    assert cli.main(["import", "nvidia-smi", str(old), "--out", str(tmp_path / "u"), "--no-rollups"]) == 0
    assert not list((tmp_path / "u").glob("gpu_rollup_*"))


def test_the_keeper_updates_one_host_each_period_and_reports_failures(tmp_path):
    _minutes(tmp_path, "n1", FIRST, 1)
    _minutes(tmp_path, "n2", FIRST, 1)
    lines: list[str] = []
    keeper = RollupKeeper(tmp_path, "n1", RollupOptions(every_s=0.05), report=lines.append).start()
    deadline = time.monotonic() + 60
    while keeper.runs < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    keeper.stop()
    assert keeper.runs >= 1 and lines[0].startswith("rollups: 2,880 samples of 1 host rolled up")
    assert rollups.host_marks(tmp_path, "n1")["1m"] is not None
    assert rollups.host_marks(tmp_path, "n2")["1m"] is None  # another host's: its own collector's job
    broken = RollupKeeper(tmp_path / "gone", "n1", RollupOptions(every_s=3600), report=lines.append)
    broken.run_once()
    assert lines[-1].startswith("rollups not updated: telemetry directory not found")


def test_the_collector_takes_the_rollup_options(tmp_path):
    args = cli.collect_parser().parse_args(["--rollup-every", "30m", "--keep-raw", "14d"])
    assert (args.rollup_every, args.keep_raw) == (1800.0, 14 * 86400.0)
    assert cli.collect_parser().parse_args([]).rollup_every == 3600.0
