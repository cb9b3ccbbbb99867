"""A GPU's clock stepping back inside an imported log: every distinct sample counts once, in log order,
for its own interval (none is lost as a "duplicate" of one it shares a time with, none overlaps
another), rows the log repeats are stored once, and the report, the app and the import say where the
clock stepped back and by how much."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import tempfile
from itertools import pairwise
from pathlib import Path
from zoneinfo import ZoneInfo

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import analytics
from collector._import_dcgm import import_files as import_dcgm
from collector._import_smi import import_files as import_smi

CLI = [sys.executable, "-m", "collector.cli"]
HEADER = "timestamp, index, uuid, utilization.gpu [%], memory.used [MiB]\n"
T0 = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC)


def smi_line(stamp: dt.datetime, n: int, gpu: int = 3) -> str:
    """One nvidia-smi row; ``n`` makes its values distinct from every other sample's."""
    return f"{stamp:%Y/%m/%d %H:%M:%S}, {gpu}, GPU-{gpu}, {n % 101} %, {1000 + n} MiB\n"


def stored(out: Path, table: str = "gpu_samples") -> list[dict]:
    folder = out / table
    return pq.read_table(folder, partitioning="hive").to_pylist() if folder.exists() else []


def observed_s(out: Path, *, rollups: bool = False) -> float:
    con = analytics.open_telemetry(out, rollups=rollups)
    return analytics.fleet_summary(con, analytics.Scope()).gpu_hours * 3600


def issue_log(path: Path) -> None:
    """The issue's log: 40 samples a minute apart, the clock stepping back 5 minutes after the tenth
    (the 11th is stamped 12:05), and four rows written twice."""
    text = HEADER
    for i in range(40):
        line = smi_line(T0 + dt.timedelta(minutes=i if i < 10 else i - 5), i)
        text += line + (line if i % 9 == 4 else "")
    path.write_text(text)


def test_the_issue_log_is_credited_every_distinct_sample_and_says_where_the_clock_stepped_back(tmp_path):
    """Duplicate rows and a 5-minute step back: 40 distinct samples x 60 s = 2,400 s credited (raw and
    through the rollups the import builds), each repeated row stored once, and the import summary and
    the HTML report both say that the clock of GPU 3 stepped back 5 min, and where in the log."""
    from reports._html import build_html

    log, out = tmp_path / "smi.csv", tmp_path / "out"
    issue_log(log)
    proc = subprocess.run(
        [*CLI, "import", "nvidia-smi", log, "--out", out, "--host", "h", "--tz", "UTC"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "stepped back 5 min" in proc.stdout and "smi.csv line 13" in proc.stdout
    rows = stored(out)
    assert len(rows) == 40 and len({r["ts"] for r in rows}) == 40
    assert sorted(r["mem_used_bytes"] for r in rows) == [(1000 + i) << 20 for i in range(40)]
    assert observed_s(out) == pytest.approx(2400)
    assert observed_s(out, rollups=True) == pytest.approx(2400)
    (step,) = stored(out, "clock_steps")
    assert (step["step_s"], step["samples"], step["position"]) == (300.0, 30, "line 13")
    page = build_html([str(out)])
    note = next(line for line in page.splitlines() if "stepped back" in line)
    assert "GPU 3 on host h" in note and "5 min" in note and "smi.csv line 13" in note


def test_the_app_says_the_clock_stepped_back_above_the_figures(tmp_path, monkeypatch):
    """The Streamlit report names the step (GPU, host, size, place in the log) in a warning."""
    from streamlit.testing.v1 import AppTest

    from reports.app import DIRS_ENV

    log, out = tmp_path / "smi.csv", tmp_path / "out"
    issue_log(log)
    import_smi([log], out, host="h", tz="UTC")
    monkeypatch.setenv(DIRS_ENV, str(out))
    app = Path(__file__).resolve().parent.parent / "reports" / "app.py"
    at = AppTest.from_file(str(app), default_timeout=90).run()
    assert not at.exception and not at.error
    assert any("stepped back 5 min" in w.value and "smi.csv line 13" in w.value for w in at.warning)


def test_reimporting_a_log_with_a_step_back_stores_nothing_new(tmp_path):
    """The same file imported again (and given twice) stores no sample and no clock step twice: the
    placing is the same each time, so every sample is already there."""
    log, out = tmp_path / "smi.csv", tmp_path / "out"
    issue_log(log)
    first = import_smi([log, log], out, host="h", tz="UTC")
    assert first.rows == 40 and len(first.clock_steps) == 1  # the file's one step, though read twice
    before = sorted((r["ts"], r["mem_used_bytes"]) for r in stored(out))
    again = import_smi([log], out, host="h", tz="UTC")
    assert again.rows == 0 and again.duplicates == again.read
    assert sorted((r["ts"], r["mem_used_bytes"]) for r in stored(out)) == before
    assert len(stored(out, "clock_steps")) == 1
    assert observed_s(out) == pytest.approx(2400)


def dcgm_scrape(when: dt.datetime, n: int) -> str:
    ms = int(when.timestamp() * 1000)
    return "".join(
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="{g}",UUID="GPU-{g}",Hostname="node1"}} {(n + g) % 101} {ms}\n'
        for g in (0, 1)
    )


def test_a_dcgm_dump_whose_clock_steps_back_counts_each_scrape_once(tmp_path):
    """Scrapes 15 s apart whose timestamps step back 2 minutes after the 20th: every GPU's 40 scrapes
    count 15 s each (1,200 s for the two GPUs), and the step is recorded for each GPU."""
    dump, out = tmp_path / "metrics.txt", tmp_path / "out"
    step = dt.timedelta(seconds=15)
    dump.write_text("".join(dcgm_scrape(T0 + step * (i if i < 20 else i - 8), i) for i in range(40)))
    report = import_dcgm([dump], out, host=None, interval_s=None)
    assert report.rows == 80 and report.duplicates == 0
    assert "stepped back 2 min" in report.summary() and "metrics.txt scrape 21" in report.summary()
    steps = stored(out, "clock_steps")
    assert sorted(s["gpu_index"] for s in steps) == [0, 1] and {s["step_s"] for s in steps} == {120.0}
    assert observed_s(out) == pytest.approx(2 * 40 * 15)


# Stamps (minutes after T0) as the log gives them -> where the samples are placed.
PLACING = {
    "a step back then a gap longer than it: after the gap the clock's own time again": (
        [0, 1, 2, 3, 1, 2, 3, 30, 31],
        [0, 1, 2, 3, 4, 5, 6, 30, 31],
    ),
    "a log written newest first: each sample after its predecessor, a minute apart": (
        [5, 4, 3, 2, 1, 0],
        [5, 6, 7, 8, 9, 10],
    ),
    "two steps back: the second adds to the first": ([0, 1, 2, 0, 1, 0, 1, 2], [0, 1, 2, 3, 4, 5, 6, 7]),
    "the autumn's repeated hour of local time, as UTC stamps: placed an hour later": (
        [0, 1, 2, 3, -56, -55, -54, 7, 8],
        [0, 1, 2, 3, 4, 5, 6, 7, 8],
    ),
}


@pytest.mark.parametrize("case", PLACING)
def test_samples_after_a_step_back_are_placed_after_their_predecessors(tmp_path, case):
    """Each distinct sample is placed one interval after the latest one before it while the clock is
    behind, and keeps its own stamp once the clock has caught up."""
    stamps, placed = PLACING[case]
    log, out = tmp_path / "smi.csv", tmp_path / "out"
    log.write_text(HEADER + "".join(smi_line(T0 + dt.timedelta(minutes=m), n) for n, m in enumerate(stamps)))
    report = import_smi([log], out, host="h", tz="UTC")
    by_value = {r["mem_used_bytes"]: r["ts"] for r in stored(out)}
    assert [by_value[(1000 + n) << 20] for n in range(len(stamps))] == [
        T0 + dt.timedelta(minutes=m) for m in placed
    ]
    assert report.clock_steps


def test_a_repeated_block_and_a_repeated_instant_are_no_step_back(tmp_path):
    """A log holding its own first half again (rows equal in every value) stores each row once and
    reports no clock step; a second, different sample at the same instant stays one sample there."""
    log, out = tmp_path / "smi.csv", tmp_path / "out"
    block = "".join(smi_line(T0 + dt.timedelta(minutes=m), m) for m in range(10))
    other = smi_line(T0 + dt.timedelta(minutes=9), 99)
    log.write_text(HEADER + block + block[: len(block) // 2] + other)
    report = import_smi([log], out, host="h", tz="UTC")
    assert report.clock_steps == [] and report.rows == 10
    assert observed_s(out) == pytest.approx(600)


def test_a_log_repeating_its_samples_under_another_header_is_no_step_back(tmp_path):
    """Two logs of one GPU joined, the second with more columns and overlapping the first: the samples
    they share are stored once (the first's), no clock step is reported, the span is credited once."""
    log, out = tmp_path / "smi.csv", tmp_path / "out"
    first = "".join(smi_line(T0 + dt.timedelta(minutes=m), m) for m in range(10))
    wider = "".join(smi_line(T0 + dt.timedelta(minutes=m), m).rstrip("\n") + ", 40\n" for m in range(5, 15))
    log.write_text(HEADER + first + HEADER.rstrip("\n") + ", temperature.gpu\n" + wider)
    report = import_smi([log], out, host="h", tz="UTC")
    assert report.clock_steps == [] and report.rows == 15
    assert observed_s(out) == pytest.approx(15 * 60)


def test_the_autumn_change_of_local_time_keeps_every_sample_at_its_true_time(tmp_path):
    """nvidia-smi logging in local time across the end of summer time (Berlin's 02:00-03:00 twice):
    the second 02:xx hour is a clock step back of 1 h; each of the 180 samples, the half hour after the
    change included, is stored at its true UTC time, 10,800 s are credited, and the step is reported."""
    log, out = tmp_path / "smi.csv", tmp_path / "out"
    start = dt.datetime(2024, 10, 26, 23, 30, tzinfo=dt.UTC)  # 01:30 CEST
    true = [start + dt.timedelta(minutes=i) for i in range(180)]
    berlin = ZoneInfo("Europe/Berlin")
    log.write_text(HEADER + "".join(smi_line(t.astimezone(berlin), n) for n, t in enumerate(true)))
    report = import_smi([log], out, host="h", tz="Europe/Berlin")
    assert [s.step_s for s in report.clock_steps] == [3600.0]
    assert sorted(r["ts"] for r in stored(out)) == true
    assert observed_s(out) == pytest.approx(10_800)


@st.composite
def stepping_logs(draw) -> tuple[list[int], list[int], bool]:
    """Stamps (seconds) of one GPU sampled every 10 s in runs of 5 or more, its clock stepping back or
    jumping ahead (a gap) between runs; returns (stamps, rows written twice, whether every sample's
    interval can be told: no gap, and no step back so short that it only shortens one interval)."""
    t, stamps, exact = 0, [], True
    for run in range(draw(st.integers(1, 5))):
        if run:
            move = draw(st.integers(-900, 900).filter(lambda m: not -10 <= m < 16))
            t += move
            exact = exact and move < -10
        for _ in range(draw(st.integers(5, 12))):
            stamps.append(t)
            t += 10
    repeats = draw(st.lists(st.integers(0, len(stamps) - 1), max_size=5))
    return stamps, repeats, exact


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(log=stepping_logs())
def test_gpu_hours_never_exceed_distinct_samples_times_the_interval(log):
    """Random step backs, gaps and repeated rows: every distinct sample is stored once and the GPU is
    credited at most samples x 10 s (exactly that where every interval can be told), however the clock
    moved. The one allowance is the weights' own: a sample that follows its predecessor by up to 15 s
    (here: where the clock caught up after a step back and a jump ahead) counts its whole interval."""
    stamps, repeats, exact = log
    lines = [smi_line(T0 + dt.timedelta(seconds=s), n) for n, s in enumerate(stamps)]
    for r in repeats:
        lines.insert(r + 1, lines[r])  # a row written twice
    with tempfile.TemporaryDirectory() as tmp:
        path, out = Path(tmp, "smi.csv"), Path(tmp, "out")
        path.write_text(HEADER + "".join(lines))
        report = import_smi([path], out, host="h", tz="UTC")
        assert report.rows == len(stamps) and report.read == report.rows + report.duplicates
        placed = sorted(r["ts"] for r in stored(out))
        gaps = [(b - a).total_seconds() for a, b in pairwise(placed)]
        late = sum(d - 10 for d in gaps if 10 < d <= 15)
        credited = observed_s(out)
        assert credited <= len(stamps) * 10 + late + 1e-6
        if exact:
            assert credited == pytest.approx(len(stamps) * 10)
