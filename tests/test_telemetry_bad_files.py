"""Bad telemetry files and bad report options: a damaged segment is left out with a warning naming it
(report build, serve, the console's history, compact, which moves it aside); `-o DIR` and an endless
`--backfill` are refused in one line; hosts without rollups are said and built."""

from __future__ import annotations

import datetime as dt
import os
import socket
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

import analytics
from collector import build_rollups, reader
from collector.writer import TelemetryWriter

REPORT = [sys.executable, "-m", "reports.cli"]
COLLECT = [sys.executable, "-m", "collector.cli"]
T0 = dt.datetime(2026, 3, 2, 0, 0, tzinfo=dt.UTC)
STEP_S = 10
SEGMENTS = 6  # 3 a day over 2 days
ROWS_PER_SEGMENT = 360  # 2 GPUs x 180 ticks (30 minutes)


def sample(i: int, gpu: int) -> dict:
    return {
        "ts": T0 + dt.timedelta(seconds=STEP_S * i),
        "gpu_index": gpu,
        "gpu_uuid": f"GPU-{gpu}",
        "gpu_name": "NVIDIA H100 80GB HBM3",
        "state": "ok",
        "util_gpu_mean": 0.5,
        "mem_used_bytes": 2 << 30,
        "mem_total_bytes": 80 << 30,
        "source": "nvml",
        "simulated": False,
    }


def make_telemetry(root: Path) -> list[Path]:
    """Six segments of host h1: three on each of two days; returns their paths, oldest first."""
    writer = TelemetryWriter(root, "h1", flush_interval_s=0)
    ticks = ROWS_PER_SEGMENT // 2
    for seg in range(SEGMENTS):
        start = (seg // 3) * 8640 + (seg % 3) * ticks  # day 2 starts 86,400 s after day 1
        writer.append("gpu_samples", [sample(start + i, g) for i in range(ticks) for g in (0, 1)])
        writer.append("process_samples", [{**sample(start, 0), "pid": 42, "user": "ana"}])
        writer.flush()
    writer.close()
    return sorted(root.glob("gpu_samples/date=*/host=h1/*.parquet"))


def truncate(path: Path) -> None:
    """What a full disk or a partial copy leaves: the first half of the file, no footer."""
    os.truncate(path, path.stat().st_size // 2)


@pytest.fixture
def damaged(tmp_path) -> tuple[Path, Path]:
    root = tmp_path / "telemetry"
    segments = make_telemetry(root)
    truncate(segments[1])
    return root, segments[1]


def test_readers_leave_a_damaged_segment_out_and_name_it(damaged):
    """open_telemetry reads every whole segment, lists the damaged one, and the notes name it."""
    root, bad = damaged
    con = analytics.open_telemetry(root)
    assert con.execute("SELECT count(*) FROM gpu_samples").fetchone()[0] == (SEGMENTS - 1) * ROWS_PER_SEGMENT
    assert [p for p, _ in analytics.damaged_segments(con)] == [str(bad)]
    assert any(str(bad) in note for note in analytics.telemetry_notes(con))
    summary = analytics.fleet_summary(con, analytics.Scope())
    assert summary.gpus == 2


def test_report_build_skips_a_damaged_segment_with_a_warning(damaged, tmp_path):
    """gpustat-report build writes the report from the other segments; stderr and the page name
    the damaged file."""
    root, bad = damaged
    out = tmp_path / "report.html"
    proc = subprocess.run(
        [*REPORT, "build", str(root), "-o", str(out)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and str(bad) in warnings[0]
    assert bad.name in out.read_text()


def test_report_serve_gets_past_a_damaged_segment(damaged):
    """gpustat-report serve reads the telemetry before it starts: a damaged segment is a warning there,
    not a crash (the port in use then stops it, in one line)."""
    root, bad = damaged
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run(
            [*REPORT, "serve", str(root), "--port", str(port)], capture_output=True, text=True, timeout=120
        )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert str(bad) in proc.stderr and f":{port}" in proc.stderr.splitlines()[-1]


def test_console_history_shows_the_damaged_segment_and_the_summary(damaged):
    """The console's history view answers from the whole segments and says which one it left out."""
    from tui._history import HistorySource

    root, bad = damaged
    snap = HistorySource([root]).load("7d")
    assert snap.error is None and snap.summary is not None
    assert any(bad.name in note for note in snap.notes)


def test_compact_moves_a_damaged_segment_aside_and_merges_the_rest(damaged):
    """gpustat-collect compact moves the damaged file to DIR/damaged/<same path>, says where, and
    compacts and rolls up the rest; readers then see no damaged segment."""
    root, bad = damaged
    proc = subprocess.run([*COLLECT, "compact", str(root)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    aside = root / "damaged" / bad.relative_to(root)
    assert aside.is_file() and not bad.exists()
    assert str(aside) in proc.stderr
    con = analytics.open_telemetry(root)
    assert analytics.damaged_segments(con) == []
    assert con.execute("SELECT count(*) FROM gpu_samples").fetchone()[0] == (SEGMENTS - 1) * ROWS_PER_SEGMENT
    assert len(list(root.glob("gpu_samples/date=*/host=h1/*.parquet"))) == 2  # one per day


def test_report_build_into_a_directory_is_refused_in_one_line(tmp_path):
    """-o DIR is refused before any work, in one line, and leaves no temporary file anywhere."""
    root = tmp_path / "telemetry"
    make_telemetry(root)
    target = tmp_path / "reports"
    target.mkdir()
    proc = subprocess.run(
        [*REPORT, "build", str(root), "-o", str(target)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "directory" in proc.stderr
    assert list(target.iterdir()) == [] and not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("span", ["100000000d", "99y", "1e400"])
def test_an_endless_backfill_is_refused_in_one_line(tmp_path, span):
    """--backfill longer than the schema's time range (or not a number) is refused in one line, before
    anything is written."""
    proc = subprocess.run(
        [*COLLECT, "--simulate", "2", "--backfill", span, "--duration", "1", "--out", str(tmp_path / "t")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "--backfill" in proc.stderr and not (tmp_path / "t").exists()


def test_hosts_without_rollups_are_said(tmp_path, monkeypatch):
    """A host whose many raw samples have no rollups is named in the notes with the command that
    builds them; once built, the note is gone."""
    root = tmp_path / "telemetry"
    make_telemetry(root)
    monkeypatch.setattr(reader, "UNROLLED_ROWS", ROWS_PER_SEGMENT)
    con = analytics.open_telemetry(root)
    assert analytics.unrolled_hosts(con) == {"h1": SEGMENTS * ROWS_PER_SEGMENT}
    assert any("gpustat-report rollup" in n for n in analytics.telemetry_notes(con))
    build_rollups(root)
    con = analytics.open_telemetry(root)
    assert analytics.unrolled_hosts(con) == {} and analytics.telemetry_notes(con) == []


@pytest.mark.slow
def test_report_build_builds_missing_rollups_once(tmp_path):
    """gpustat-report build on telemetry of many raw samples and no rollups says so in one line and
    builds them; the next build has nothing to say."""
    root = tmp_path / "telemetry"
    gpus, ticks = 40, reader.UNROLLED_ROWS // 40
    ts = pa.array(
        [T0 + dt.timedelta(seconds=STEP_S * i) for i in range(ticks)] * gpus, pa.timestamp("us", "UTC")
    )
    data = pa.table(
        {
            "ts": ts,
            "gpu_index": pa.array([g for g in range(gpus) for _ in range(ticks)], pa.int16()),
            "gpu_uuid": [f"GPU-{g}" for g in range(gpus) for _ in range(ticks)],
            "util_gpu_mean": pa.array([0.25] * (gpus * ticks), pa.float32()),
            "state": ["ok"] * (gpus * ticks),
            "source": ["nvml"] * (gpus * ticks),
            "simulated": [False] * (gpus * ticks),
        }
    )
    TelemetryWriter(root, "h1", flush_interval_s=0).write_table("gpu_samples", data)
    first = subprocess.run(
        [*REPORT, "build", str(root), "-o", str(tmp_path / "a.html")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert first.returncode == 0, first.stderr
    assert [line for line in first.stderr.splitlines() if "without rollups" in line]
    assert list(root.glob("gpu_rollup_1m/date=*/host=h1/*.parquet"))
    second = subprocess.run(
        [*REPORT, "build", str(root), "-o", str(tmp_path / "b.html")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert second.returncode == 0 and "without rollups" not in second.stderr, second.stderr


def test_a_damaged_rollup_file_is_moved_aside_and_made_again(tmp_path):
    """A rollup file cut short is skipped by the report and, at the next rollup build, moved to
    DIR/damaged/ and made again from the raw samples: the figures then equal those before the damage."""
    root = tmp_path / "telemetry"
    make_telemetry(root)
    build_rollups(root)
    before = analytics.fleet_summary(analytics.open_telemetry(root), analytics.Scope()).gpu_hours
    newest = sorted(root.glob("gpu_rollup_1m/date=*/host=h1/rollup.parquet"))[-1]
    truncate(newest)
    out = tmp_path / "r.html"
    built = subprocess.run(
        [*REPORT, "build", str(root), "-o", str(out)], capture_output=True, text=True, timeout=120
    )
    assert built.returncode == 0 and str(newest) in built.stderr, built.stderr
    proc = subprocess.run([*REPORT, "rollup", str(root)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert (root / "damaged" / newest.relative_to(root)).is_file()
    con = analytics.open_telemetry(root)
    assert analytics.damaged_segments(con) == []
    assert analytics.fleet_summary(con, analytics.Scope()).gpu_hours == pytest.approx(before)


def test_the_app_shows_the_damaged_segment_above_the_figures(damaged, monkeypatch):
    """The Streamlit report opens on telemetry with a damaged segment, names it in a warning and
    lays out its figures from the rest."""
    from streamlit.testing.v1 import AppTest

    from reports.app import DIRS_ENV

    root, bad = damaged
    monkeypatch.setenv(DIRS_ENV, str(root))
    app = Path(__file__).resolve().parent.parent / "reports" / "app.py"
    at = AppTest.from_file(str(app), default_timeout=90).run()
    assert not at.exception and not at.error
    assert any(bad.name in w.value for w in at.warning)
    assert [h.value for h in at.header][:1] == ["Summary"]
