"""Rollups (collector.rollups builds them, analytics._rollup reads them) against hand-computed values and against the raw computation, and a
kill -9 in the middle of a rollup build."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
from test_analytics_data import GIB, T0, gpu_rows, write_rows

import analytics as A
from collector import build_rollups, expire_raw, rollups
from collector.schema import METADATA_ROLLUP_KEY
from reports import cli as report_cli

H = 3600.0
ROOT = Path(__file__).resolve().parent.parent


def _rollup_file(root: Path, level: str, day: str, host: str) -> Path:
    return root / f"gpu_rollup_{level}" / f"date={day}" / f"host={host}" / "rollup.parquet"


@pytest.fixture
def three_minutes(tmp_path):
    # GPU a/0, 1 s ticks from 09:00:00 to 09:02:59: 60 s at 50 % (SM 25 %), 60 s idle holding 2 GiB,
    # 60 s at 100 %.
    utils = [0.5] * 60 + [0.0] * 60 + [1.0] * 60
    rows = gpu_rows(
        "a", 0, utils, mem_used=[0] * 60 + [2 * GIB] * 60 + [0] * 60, sm=[0.25] * 60 + [None] * 120
    )
    write_rows(tmp_path, "gpu_samples", rows)
    return tmp_path


def assert_same_what_if(s, raw, exact: tuple[str, ...]) -> None:
    """The what-if from rollups is the raw one: `exact` fields equal, the means within float rounding."""
    for name in exact:
        assert getattr(s, name) == getattr(raw, name), name
    for name in (
        "observed_util_mean",
        "pooled_util_mean",
        "pooled_mem_allocated_mean",
        "oversubscribed_share",
    ):
        assert getattr(s, name) == pytest.approx(getattr(raw, name), rel=1e-9, abs=1e-12), name


def test_a_minute_rollup_holds_hand_computed_sums(three_minutes):
    raw = A.fleet_summary(A.open_telemetry(three_minutes))
    result = build_rollups(three_minutes, lag_s=60)
    # Newest sample 09:02:59, less 60 s, floored to the minute: minutes before 09:01 are rolled up.
    assert (result.hosts, result.samples, result.minute_rows, result.hour_rows) == (1, 180, 1, 0)
    path = _rollup_file(three_minutes, "1m", "2026-03-02", "a")
    table = pq.read_table(path, partitioning=None)
    (row,) = table.to_pylist()
    assert row["ts"] == T0 and row["samples"] == 60 and row["fb"] is None
    assert row["observed_s"] == pytest.approx(60.0)
    assert row["util_s"] == pytest.approx(60.0) and row["util_sum"] == pytest.approx(30.0)
    assert row["sm_s"] == pytest.approx(60.0) and row["sm_sum"] == pytest.approx(15.0)
    assert row["idle_s"] == 0 and row["held_idle_s"] == 0
    assert row["util_hist_bin"] == [50] and row["util_hist_s"] == pytest.approx([60.0])
    assert row["interval_us"] == [1_000_000] and row["interval_n"] == [60]  # 09:00:59 -> 09:01:00 included
    meta = json.loads(table.schema.metadata[METADATA_ROLLUP_KEY])
    assert meta["covers_to"] == (T0 + timedelta(minutes=1)).isoformat()
    assert (meta["idle_below"], meta["held_mem_bytes"], meta["period_s"]) == (0.05, GIB, 60)

    s = A.fleet_summary(A.open_telemetry(three_minutes))
    assert s.data_source.startswith("hourly rollups + minute rollups + raw samples")
    assert raw.data_source.startswith("raw samples")
    # Rollup (09:00) + raw (09:01 on): the same answer as raw alone, by hand too.
    assert s.samples == raw.samples == 180
    assert s.gpu_hours == pytest.approx(180 / H)
    assert s.util_gpu_mean == pytest.approx(0.5)
    assert s.idle_gpu_hours == pytest.approx(60 / H) and s.held_idle_gpu_hours == pytest.approx(60 / H)
    assert s.sm_activity_mean == pytest.approx(0.25) and s.gpm_gpu_hours == pytest.approx(60 / H)
    assert (s.util_gpu_p50, s.util_gpu_p95) == (0.5, 1.0)
    assert (s.first_sample, s.last_sample) == (raw.first_sample, raw.last_sample)
    assert s.per_gpu == raw.per_gpu


def _irregular(root: Path, seed: int = 3) -> None:
    """Two hosts over three hours: irregular ticks, a gap, duplicates, a GPU without GPM, one GPU
    with a single sample (it takes the fleet tick), values at 0.2 % steps and 0.001 steps."""
    rng = random.Random(seed)
    rows = []
    for host, gpus in (("h1", 2), ("h2", 1)):
        for g in range(gpus):
            t = T0 + timedelta(seconds=rng.random())
            end = T0 + timedelta(hours=3)
            while t < end:
                u = rng.choice([0.0, 0.01, 0.04, 0.05, 0.3, round(rng.random(), 3), 1.0])
                rows.append(
                    {
                        "host": host,
                        "ts": t,
                        "gpu_index": g,
                        "gpu_uuid": f"GPU-{host}-{g}",
                        "gpu_name": "H100",
                        "util_gpu_mean": u,
                        "mem_used_bytes": rng.choice([0, GIB // 2, 2 * GIB]),
                        "mem_total_bytes": 80 * GIB,
                        "sm_activity": None if g == 1 else round(rng.random(), 3),
                        "simulated": host == "h2",
                    }
                )
                if rng.random() < 0.02:
                    rows.append(dict(rows[-1]))  # the same instant twice
                step = rng.choice([1.0, 1.0, 1.0, 2.0, 0.5, 1.3])
                if rng.random() < 0.001:
                    step = 600.0  # a gap
                t += timedelta(seconds=step)
    rows.append({"host": "h3", "ts": T0 + timedelta(minutes=30), "gpu_index": 0, "gpu_uuid": "GPU-h3-0",
                 "gpu_name": "H100", "util_gpu_mean": 0.5, "mem_total_bytes": 80 * GIB})  # fmt: skip
    write_rows(root, "gpu_samples", rows)


def _assert_agree(s: A.FleetSummary, raw: A.FleetSummary) -> None:
    assert s.samples == raw.samples and (s.gpus, s.hosts) == (raw.gpus, raw.hosts)
    for name in ("gpu_hours", "gap_hours", "idle_gpu_hours", "held_idle_gpu_hours", "gpm_gpu_hours",
                 "lost_gpu_hours", "util_gpu_mean", "sm_activity_mean", "util_gpu_mean_where_gpm",
                 "mem_used_ratio_mean", "mem_headroom_bytes_mean", "simulated_share", "tick_s_median"):  # fmt: skip
        assert getattr(s, name) == pytest.approx(getattr(raw, name), rel=1e-9, abs=1e-12), name
    for name in ("util_gpu_p50", "util_gpu_p95", "sm_activity_p50", "sm_activity_p95"):
        # 1 % bins, reported at their lower edge: at most one bin below.
        if getattr(raw, name) is None:
            assert getattr(s, name) is None, name
            continue
        assert getattr(raw, name) - 0.01 - 1e-9 <= getattr(s, name) <= getattr(raw, name) + 1e-9, name
    assert (s.first_sample, s.last_sample, s.mem_used_ratio_peak) == (
        raw.first_sample,
        raw.last_sample,
        raw.mem_used_ratio_peak,
    )
    assert [(b, pytest.approx(h)) for b, h in raw.util_distribution.bins] == list(s.util_distribution.bins)
    for a, b in zip(s.per_gpu, raw.per_gpu, strict=True):
        assert (a.host, a.gpu_uuid, a.gpu_index, a.tick_s) == (b.host, b.gpu_uuid, b.gpu_index, b.tick_s)
        assert a.gpu_hours == pytest.approx(b.gpu_hours) and a.idle_gpu_hours == pytest.approx(
            b.idle_gpu_hours
        )
    assert [(h.host, h.samples, h.median_interval_s) for h in s.sampling] == [
        (h.host, h.samples, h.median_interval_s) for h in raw.sampling
    ]


def test_rollups_agree_with_raw_on_irregular_samples(tmp_path):
    _irregular(tmp_path)
    raw = A.fleet_summary(A.open_telemetry(tmp_path))
    build_rollups(tmp_path, lag_s=60)
    con = A.open_telemetry(tmp_path)
    s = A.fleet_summary(con)
    assert "hourly rollups" in s.data_source
    _assert_agree(s, raw)
    # A range on hour boundaries inside the data: hours from the rollups, the rest raw. Sampling is
    # irregular at the cuts, so compare with a range of regular data below; here: counts exactly.
    scope = A.Scope(T0 + timedelta(hours=1), T0 + timedelta(hours=2))
    assert A.fleet_summary(con, scope).samples == A.fleet_summary(A.open_telemetry(tmp_path), scope).samples


def test_a_range_on_minute_boundaries_agrees_with_raw_on_regular_samples(tmp_path):
    rng = random.Random(5)
    rows = []
    for g in range(2):
        utils = [rng.choice([0.0, 0.02, 0.5, 0.996]) for _ in range(3 * 3600)]
        rows += gpu_rows("a", g, utils, mem_used=[rng.choice([0, 3 * GIB]) for _ in utils], sm=utils)
    write_rows(tmp_path, "gpu_samples", rows)
    scopes = [
        A.Scope(T0 + timedelta(minutes=17), T0 + timedelta(minutes=143)),  # minutes only
        A.Scope(T0 + timedelta(hours=1), None),  # hours, then minutes, then raw
        A.Scope(None, T0 + timedelta(hours=2)),
    ]
    raws = [A.fleet_summary(A.open_telemetry(tmp_path), sc) for sc in scopes]
    build_rollups(tmp_path, lag_s=120)
    con = A.open_telemetry(tmp_path)
    for sc, raw in zip(scopes, raws, strict=True):
        s = A.fleet_summary(con, sc)
        assert "rollups" in s.data_source
        _assert_agree(s, raw)
    assert A.fleet_summary(con, scopes[0]).data_source.startswith("minute rollups + raw")


def test_other_thresholds_or_ranges_off_the_minute_read_raw_samples(three_minutes):
    build_rollups(three_minutes, lag_s=60)
    con = A.open_telemetry(three_minutes)
    other = A.fleet_summary(con, options=A.SummaryOptions(idle_below=0.10))
    assert other.data_source == "raw samples (thresholds differ from the rollups')"
    assert other.idle_gpu_hours == pytest.approx(60 / H)
    off = A.fleet_summary(con, A.Scope(T0 + timedelta(seconds=30), None))
    assert off.data_source == "raw samples (the range is not on minute boundaries)"
    assert off.samples == 150


def test_a_directory_with_the_hosts_samples_but_no_rollups_keeps_it_raw(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    write_rows(a, "gpu_samples", gpu_rows("h", 0, [0.5] * 600))
    write_rows(b, "gpu_samples", gpu_rows("h", 0, [1.0] * 600, start=T0 + timedelta(hours=1)))
    raw = A.fleet_summary(A.open_telemetry([a, b]))
    build_rollups(a, lag_s=60)
    s = A.fleet_summary(A.open_telemetry([a, b]))
    assert s.data_source.startswith("raw samples")
    assert s.samples == raw.samples == 1200


def test_the_rollup_command_prints_progress_and_a_summary(three_minutes, capsys):
    assert report_cli.main(["rollup", str(three_minutes)]) == 0
    out, err = capsys.readouterr()
    # Three minutes of samples, all within the last 10 minutes of the host: nothing to roll up yet.
    assert "rolled up 0 samples of 0 host(s)" in out
    assert "[1/1] a: nothing new to roll up (raw after 2026-03-02T09:00:00+00:00)" in err
    assert report_cli.main(["rollup", str(three_minutes / "nope")]) == 2
    assert "telemetry directory not found" in capsys.readouterr().err


# -- kill -9 in the middle of a build -----------------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    sys.path.insert(0, {root!r})
    import collector.rollups as R
    from collector import writer

    calls = [0]
    kill_at, mode = {kill_at!r}, {mode!r}

    def dying_write(path, table):
        calls[0] += 1
        # kill_at: the n-th file written, or the first file of the table named
        if calls[0] == kill_at if isinstance(kill_at, int) else kill_at in str(path):
            if mode == "mid-write":  # half a file under the temporary name, then the end
                tmp = path.with_name(f".{{path.name}}.tmp")
                tmp.write_bytes(b"PAR1" + b"x" * 1000)
            else:  # the file is in place; die before the next one
                writer.write_segment(path, table)
            os.kill(os.getpid(), signal.SIGKILL)
        writer.write_segment(path, table)

    R.write_segment = dying_write
    R.build_rollups({dir!r}, lag_s=120)
    """
)


def _days(root: Path, first: datetime, days: int) -> None:
    rows = []
    for host in ("x", "y"):
        for g in range(2):
            utils = [((i * 7 + g) % 11) / 10 for i in range(days * 24 * 60)]
            rows += gpu_rows(
                host, g, utils, tick_s=60, start=first, mem_used=[(i % 3) * GIB for i in range(len(utils))]
            )
    write_rows(root, "gpu_samples", rows)


@pytest.mark.parametrize(
    ("kill_at", "mode"),
    [(1, "mid-write"), (3, "mid-write"), (3, "after"), (6, "mid-write"), ("gpu_rollup_1d", "mid-write")],
)
def test_kill_9_during_a_rollup_build_leaves_readers_consistent(tmp_path, kill_at, mode):
    first = datetime(2026, 3, 1, tzinfo=UTC)
    _days(tmp_path, first, 2)
    build_rollups(tmp_path, lag_s=600)  # an old build over the first two days
    # Two more days arrive; the new build is killed part way (files: per host, minutes then hours, by day).
    _days(tmp_path, first + timedelta(days=2), 2)
    expected = A.fleet_summary(A.open_telemetry(tmp_path), options=A.SummaryOptions(idle_below=0.0499))
    code = _CHILD.format(root=str(ROOT), kill_at=kill_at, mode=mode, dir=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    if mode == "mid-write":
        assert list(tmp_path.glob("gpu_rollup_*/date=*/host=*/.rollup.parquet.tmp"))

    def check() -> None:
        con = A.open_telemetry(tmp_path)
        s = A.fleet_summary(con)
        raw = A.fleet_summary(
            con, options=A.SummaryOptions(idle_below=0.0499)
        )  # the same thresholds in effect
        assert "rollups" in s.data_source and raw.data_source.startswith("raw samples")
        assert s.samples == expected.samples == raw.samples == 4 * 4 * 24 * 60
        assert s.gpu_hours == pytest.approx(expected.gpu_hours, rel=1e-12)
        assert s.util_gpu_mean == pytest.approx(expected.util_gpu_mean, rel=1e-12)
        assert s.idle_gpu_hours == pytest.approx(expected.idle_gpu_hours, rel=1e-12)
        assert s.held_idle_gpu_hours == pytest.approx(expected.held_idle_gpu_hours, rel=1e-12)

    check()
    build_rollups(tmp_path, lag_s=120)  # the next build finishes the job and removes the debris
    assert not list(tmp_path.glob("gpu_rollup_*/date=*/host=*/.rollup.parquet.tmp"))
    check()
    assert os.path.exists(_rollup_file(tmp_path, "1m", "2026-03-04", "y"))


@pytest.mark.parametrize("bucket_s", [600, 3600])
def test_the_timeline_and_heatmap_from_rollups_agree_with_raw(tmp_path, bucket_s):
    _irregular(tmp_path)
    raw_con = A.open_telemetry(tmp_path)
    raw = A.utilization_timeline(raw_con, bucket_s=bucket_s)
    raw_heat = A.hour_of_week(raw_con, level="host")
    build_rollups(tmp_path, lag_s=60)
    con = A.open_telemetry(tmp_path)
    s = A.utilization_timeline(con, bucket_s=bucket_s)
    assert [p.start for p in s.points] == [p.start for p in raw.points]
    for a, b in zip(s.points, raw.points, strict=True):
        assert a.gpus == b.gpus
        for name in ("util_gpu_mean", "sm_activity_mean", "mem_used_ratio_mean", "gpu_hours"):
            assert getattr(a, name) == pytest.approx(getattr(b, name), rel=1e-9, abs=1e-12), (a.start, name)
    heat = A.hour_of_week(con, level="host")
    assert [h.key for h in heat] == [h.key for h in raw_heat]
    for a, b in zip(heat, raw_heat, strict=True):
        for d in range(7):
            for hour in range(24):
                assert a.gpu_hours[d][hour] == pytest.approx(b.gpu_hours[d][hour], abs=1e-12)
                assert a.util[d][hour] == pytest.approx(b.util[d][hour], rel=1e-9)


def test_hour_rollups_without_minute_rollups_are_not_used(three_minutes, tmp_path_factory):
    # Hours reach the raw samples only through the minutes after them: without the minute files,
    # the host is all raw (else its first hours would count twice).
    rows = gpu_rows("a", 0, [0.5] * 3 * 3600)
    root = tmp_path_factory.mktemp("hours")
    write_rows(root, "gpu_samples", rows)
    raw = A.fleet_summary(A.open_telemetry(root))
    build_rollups(root, lag_s=60)
    shutil.rmtree(root / "gpu_rollup_1m")
    s = A.fleet_summary(A.open_telemetry(root))
    assert s.data_source.startswith("raw samples") and s.samples == raw.samples == 3 * 3600


# -- daily rollups ------------------------------------------------------------------------------------


def test_a_day_row_merges_its_hour_rows_and_days_answer_as_raw(tmp_path):
    first = datetime(2026, 3, 1, 5, tzinfo=UTC)  # from 05:00: the first day is a partial one
    _days(tmp_path, first, 3)
    raw_con = A.open_telemetry(tmp_path, rollups=False)
    build_rollups(tmp_path, lag_s=600)
    rows = _rollup_rows(tmp_path)
    # Days before the hour mark floored to the day: 1, 2 and 3 March of each GPU (the hours reach 4 March 04:00).
    assert sorted({r["ts"].day for r in rows["1d"]}) == [1, 2, 3] and len(rows["1d"]) == 4 * 3
    for day in rows["1d"]:
        hours = [
            r
            for r in rows["1h"]
            if (r["host"], r["gpu_uuid"], r["fb"]) == (day["host"], day["gpu_uuid"], day["fb"])
            and r["ts"].date() == day["ts"].date()
        ]
        assert len(hours) == (19 if day["ts"].day == 1 else 24)
        assert day["samples"] == sum(h["samples"] for h in hours) == len(hours) * 60
        for name in ("observed_s", "util_sum", "idle_s", "held_idle_s", "mem_used_sum", "util_plain_sum"):
            assert day[name] == pytest.approx(sum(h[name] for h in hours), rel=1e-12), name
        assert (day["first_ts"], day["last_ts"]) == (hours[0]["first_ts"], hours[-1]["last_ts"])
        merged: dict[int, float] = {}
        for h in hours:
            for b, sec in zip(h["util_hist_bin"], h["util_hist_s"], strict=True):
                merged[b] = merged.get(b, 0.0) + sec
        assert day["util_hist_bin"] == sorted(merged)
        assert day["util_hist_s"] == pytest.approx([merged[b] for b in sorted(merged)])
        assert sum(day["interval_n"]) == sum(sum(h["interval_n"]) for h in hours)
    con = A.open_telemetry(tmp_path)
    # The whole range, and a range on the hour that is not on the day: whole days from daily rows,
    # the hours around them from hourly ones.
    for scope in (A.Scope(), A.Scope(first + timedelta(hours=7), first + timedelta(days=2, hours=3))):
        s = A.fleet_summary(con, scope)
        assert s.data_source.startswith("daily rollups + hourly rollups + minute rollups"), s.data_source
        _assert_agree(s, A.fleet_summary(raw_con, scope))
    # Buckets of whole days read days too; buckets of hours do not.
    for bucket_s in (86400, 3600):
        a = A.utilization_timeline(con, bucket_s=bucket_s).points
        b = A.utilization_timeline(raw_con, bucket_s=bucket_s).points
        assert [(p.start, p.gpus) for p in a] == [(p.start, p.gpus) for p in b]
        for x, y in zip(a, b, strict=True):
            assert x.util_gpu_mean == pytest.approx(y.util_gpu_mean, rel=1e-9)
            assert x.gpu_hours == pytest.approx(y.gpu_hours, rel=1e-9)
    plan = A._rollup.plan(con, A.Scope(), None, 3600)[0]
    assert plan.levels == ("1h", "1m", "raw")


def test_rollups_without_days_answer_from_hours_until_the_next_build_makes_them(tmp_path):
    # Rollups built before the daily level: hours answer; the next build, with nothing new to roll
    # up, makes the days from the hour rows.
    first = datetime(2026, 3, 1, tzinfo=UTC)
    _days(tmp_path, first, 3)
    raw = A.fleet_summary(A.open_telemetry(tmp_path, rollups=False))
    build_rollups(tmp_path, lag_s=600)
    shutil.rmtree(tmp_path / "gpu_rollup_1d")
    s = A.fleet_summary(A.open_telemetry(tmp_path))
    assert s.data_source.startswith("hourly rollups + minute rollups")
    _assert_agree(s, raw)
    lines: list[str] = []
    r = build_rollups(tmp_path, lag_s=600, progress=lines.append)
    assert r.hosts == 0 and r.day_rows == 2 * 2 * 2  # 1 and 2 March (the hours end on 3 March 23:00)
    assert sum("day rows made from the hour rows" in line for line in lines) == 2
    s = A.fleet_summary(A.open_telemetry(tmp_path))
    assert s.data_source.startswith("daily rollups")
    _assert_agree(s, raw)


@pytest.mark.parametrize("rollups", [False, True])
def test_fleet_patterns_from_one_hourly_read_are_the_three_figures(tmp_path, rollups):
    _irregular_days(tmp_path, datetime(2026, 3, 1, tzinfo=UTC), 3, seed=6)
    if rollups:
        build_rollups(tmp_path, lag_s=600)
    con = A.open_telemetry(tmp_path)
    scope = A.Scope(datetime(2026, 3, 1, 2, tzinfo=UTC), datetime(2026, 3, 5, tzinfo=UTC))
    for tz in ("UTC", "Europe/Berlin", "Asia/Kolkata"):  # Kolkata: half hours, the three one by one
        p = A.fleet_patterns(con, scope, tz=tz, max_points=40)
        tl = A.utilization_timeline(con, scope, max_points=40)
        assert p.timeline.bucket_s == tl.bucket_s == 3 * 3600
        assert [(x.start, x.gpus) for x in p.timeline.points] == [(x.start, x.gpus) for x in tl.points]
        for a, b in zip(p.timeline.points, tl.points, strict=True):
            for name in ("util_gpu_mean", "sm_activity_mean", "mem_used_ratio_mean", "gpu_hours"):
                assert getattr(a, name) == pytest.approx(getattr(b, name), rel=1e-9, abs=1e-12), name
        periods = A.busiest_idlest(con, scope)
        for mine, theirs in ((p.periods.busiest, periods.busiest), (p.periods.idlest, periods.idlest)):
            assert [(x.start, x.gpus) for x in mine] == [(x.start, x.gpus) for x in theirs]
            assert [x.util_gpu_mean for x in mine] == pytest.approx(
                [x.util_gpu_mean for x in theirs], rel=1e-9
            )
        (heat,) = A.hour_of_week(con, scope, tz=tz)
        (mine,) = p.heatmap
        for d in range(7):
            assert list(mine.gpu_hours[d]) == pytest.approx(list(heat.gpu_hours[d]), rel=1e-9, abs=1e-12)
            assert [u or 0.0 for u in mine.util[d]] == pytest.approx(
                [u or 0.0 for u in heat.util[d]], rel=1e-9
            )


def test_fleet_patterns_span_from_the_hourly_read_picks_the_timelines_bucket(tmp_path):
    """From rollups the span that picks the timeline's bucket comes with the hourly rows: the same
    bucket as ``utilization_timeline``'s own span, also where it is under an hour (a range wider than
    the data: the figures are then made one by one after that read)."""
    _irregular_days(tmp_path, datetime(2026, 3, 1, tzinfo=UTC), 3, seed=7)
    build_rollups(tmp_path, lag_s=600)
    con = A.open_telemetry(tmp_path)
    wide = A.Scope(datetime(2026, 2, 20, tzinfo=UTC), datetime(2026, 3, 6, tzinfo=UTC))
    for scope, max_points, hourly in ((wide, 200, False), (wide, 60, True), (A.Scope(), 30, True)):
        p = A.fleet_patterns(con, scope, max_points=max_points)
        tl = A.utilization_timeline(con, scope, max_points=max_points)
        assert p.timeline.bucket_s == tl.bucket_s
        assert (tl.bucket_s % 3600 == 0) is hourly, tl.bucket_s
        assert [(x.start, x.gpus) for x in p.timeline.points] == [(x.start, x.gpus) for x in tl.points]
        for a, b in zip(p.timeline.points, tl.points, strict=True):
            assert a.util_gpu_mean == pytest.approx(b.util_gpu_mean, rel=1e-9, abs=1e-12)
            assert a.gpu_hours == pytest.approx(b.gpu_hours, rel=1e-9, abs=1e-12)
    with pytest.raises(A.TelemetryError):
        A.fleet_patterns(con, A.Scope(datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 2, 1, tzinfo=UTC)))


# -- the raw tail, windowed once per connection ----------------------------------------------------------


def test_the_raw_tail_is_windowed_once_and_again_when_a_segment_lands(tmp_path):
    first = datetime(2026, 3, 1, tzinfo=UTC)
    _days(tmp_path, first, 2)
    build_rollups(tmp_path, lag_s=600)
    con = A.open_telemetry(tmp_path)
    s = A.fleet_summary(con)
    assert s.samples == 4 * 2 * 24 * 60
    plan = A._rollup.plan(con, A.Scope())[0]
    assert A._rollup.windowed_tail(con, plan, A.Scope()) == "raw_tail_windowed"
    # The tail: each GPU's samples from its mark (23:49, its newest less 10 minutes) on, with their weights.
    assert con.execute("SELECT count(*), sum(w) FROM raw_tail_windowed").fetchall() == [
        (4 * 11, 4 * 11 * 60.0)
    ]
    # Samples that land while the connection is open are seen by its next query, as without the cache.
    _days(tmp_path, first + timedelta(days=2), 1)
    again = A.fleet_summary(con)
    raw = A.fleet_summary(A.open_telemetry(tmp_path, rollups=False))
    assert again.samples == raw.samples == 4 * 3 * 24 * 60
    _assert_agree(again, raw)
    tl = A.utilization_timeline(con, bucket_s=3600)
    assert (
        tl.points == A.utilization_timeline(A.open_telemetry(tmp_path, rollups=False), bucket_s=3600).points
    )


def test_windowing_the_raw_tail_leaves_the_connections_settings_as_they_were(tmp_path):
    # The tail is windowed with insertion order off (faster); a caller's connection keeps its setting.
    _days(tmp_path, datetime(2026, 3, 1, tzinfo=UTC), 1)
    build_rollups(tmp_path, lag_s=600)
    for setting in ("true", "false"):
        con = duckdb.connect()
        con.execute(f"SET preserve_insertion_order = {setting}")
        A.fleet_summary(A.open_telemetry(tmp_path, con=con))
        assert con.execute("SELECT current_setting('preserve_insertion_order')").fetchone()[0] is (
            setting == "true"
        )
        assert con.execute("SELECT count(*) FROM raw_tail_windowed").fetchone()[0] == 4 * 11


def test_a_range_that_cuts_the_raw_tail_windows_its_own_rows(tmp_path):
    # Irregular samples: a range ending inside the raw tail weighs its last samples as the raw
    # computation does (one local tick), not as the connection's windowed tail does (the time to the next).
    _irregular_days(tmp_path, datetime(2026, 3, 1, tzinfo=UTC), 1, seed=4)
    build_rollups(tmp_path, lag_s=1800)
    con = A.open_telemetry(tmp_path)
    plan = A._rollup.plan(con, A.Scope())[0]
    mark = min(plan.raw_from_us.values())
    end = datetime.fromtimestamp(mark / 1e6 + 900, UTC)
    cut = A.Scope(end=end)
    assert A._rollup.windowed_tail(con, plan, A.Scope()) is not None
    assert A._rollup.windowed_tail(con, A._rollup.plan(con, cut)[0], cut) is None
    s = A.fleet_summary(con, cut)
    raw = A.fleet_summary(A.open_telemetry(tmp_path, rollups=False), cut)
    assert s.samples == raw.samples and s.gpu_hours == pytest.approx(raw.gpu_hours, rel=1e-9)


# -- incremental builds ---------------------------------------------------------------------------------


def _rollup_rows(root: Path) -> dict[str, list[dict]]:
    """Every rollup row of ``root`` per level, in a stable order."""
    out = {}
    for level in ("1m", "1h", "1d"):
        rows = []
        for path in sorted(root.glob(f"gpu_rollup_{level}/date=*/host=*/rollup.parquet")):
            host = path.parent.name.removeprefix("host=")
            rows += [{"host": host, **r} for r in pq.read_table(path, partitioning=None).to_pylist()]
        out[level] = sorted(rows, key=lambda r: (r["host"], r["gpu_uuid"], r["ts"], r["fb"] or 0))
    return out


def _assert_same_rollups(a: Path, b: Path) -> None:
    ra, rb = _rollup_rows(a), _rollup_rows(b)
    for level in ra:
        assert len(ra[level]) == len(rb[level]) > 0, level
        for x, y in zip(ra[level], rb[level], strict=True):
            assert x.keys() == y.keys()
            for k in x:
                if isinstance(x[k], float) or (
                    isinstance(x[k], list) and x[k] and isinstance(x[k][0], float)
                ):
                    assert x[k] == pytest.approx(y[k], rel=1e-12, abs=1e-9), (level, k, x["ts"])
                else:
                    assert x[k] == y[k], (level, k, x["ts"])
    for host in ("x", "y"):
        assert rollups.host_marks(a, host) == rollups.host_marks(b, host)
        assert rollups._mark(a, "gpu_rollup_1d", host) == rollups._mark(b, "gpu_rollup_1d", host)


def _irregular_days(root: Path, first: datetime, days: int, seed: int) -> None:
    """Two hosts, 20 s ticks with jitter, duplicates and gaps (one across midnight), values in 0.001 steps."""
    rng = random.Random(seed)
    rows = []
    end = first + timedelta(days=days)
    for host in ("x", "y"):
        for g in range(2):
            t = first + timedelta(seconds=rng.random() * 20)
            while t < end:
                rows.append(
                    {
                        "host": host,
                        "ts": t,
                        "gpu_index": g,
                        "gpu_uuid": f"GPU-{host}-{g}",
                        "gpu_name": "H100",
                        "util_gpu_mean": rng.choice([0.0, 0.03, 0.5, round(rng.random(), 3), 1.0]),
                        "mem_used_bytes": rng.choice([0, 2 * GIB]),
                        "mem_total_bytes": 80 * GIB,
                        "sm_activity": round(rng.random(), 3) if g == 0 else None,
                    }
                )
                if rng.random() < 0.01:
                    rows.append(dict(rows[-1]))
                step = rng.choice([20.0, 20.0, 19.5, 21.0, 40.0])
                if rng.random() < 0.002:
                    step = rng.choice([900.0, 5400.0])  # gaps longer than the build's margin
                if host == "x" and g == 1 and t.hour == 23 and t.minute == 55 and t.second < 20:
                    step = 2 * 3600.0  # across midnight, over a step boundary
                t += timedelta(seconds=step)
    write_rows(root, "gpu_samples", rows)


@pytest.mark.parametrize("step_rows", [4_000_000, 3_000])
def test_an_incremental_build_equals_a_build_from_scratch(tmp_path, monkeypatch, step_rows):
    monkeypatch.setattr(rollups, "STEP_ROWS", step_rows)  # 3 000: a step per day, some days split by GPU
    first = datetime(2026, 3, 1, tzinfo=UTC)
    inc, scratch = tmp_path / "inc", tmp_path / "scratch"
    _irregular_days(inc, first, 2, seed=1)
    build_rollups(inc, lag_s=600)
    before = {
        p: p.stat().st_mtime_ns for p in inc.glob("gpu_rollup_1m/date=2026-03-01/host=*/rollup.parquet")
    }
    assert len(before) == 2  # (the hours are a file per month: rewritten, its rows before the mark kept)
    # Two more days arrive (and more of the second day's end); the next build starts at the last mark.
    _irregular_days(inc, first + timedelta(days=2), 2, seed=2)
    lines: list[str] = []
    build_rollups(inc, lag_s=600, progress=lines.append)
    assert any("from 2026-03-02T23:00:00+00:00" in line for line in lines), lines
    assert {p: p.stat().st_mtime_ns for p in before} == before  # days before the mark are left as they are
    shutil.copytree(inc / "gpu_samples", scratch / "gpu_samples")
    build_rollups(scratch, lag_s=600)
    _assert_same_rollups(inc, scratch)
    # Nothing new: nothing to do.
    lines.clear()
    assert build_rollups(inc, lag_s=600, progress=lines.append).hosts == 0
    assert all("nothing new to roll up" in line for line in lines)
    # And the readers' answer is the raw one.
    s = A.fleet_summary(A.open_telemetry(inc))
    _assert_agree(s, A.fleet_summary(A.open_telemetry(inc, rollups=False)))


def test_an_import_of_older_samples_is_rolled_up_from_its_day_on(tmp_path):
    first = datetime(2026, 3, 1, tzinfo=UTC)
    _days(tmp_path, first, 3)
    build_rollups(tmp_path, lag_s=600)
    # A third host's logs and older samples of host x arrive (another GPU on day 2).
    rows = gpu_rows("x", 7, [0.25] * 600, tick_s=60, start=first + timedelta(days=1, hours=3))
    write_rows(tmp_path, "gpu_samples", rows)
    stale = A.fleet_summary(A.open_telemetry(tmp_path))
    raw = A.fleet_summary(A.open_telemetry(tmp_path, rollups=False))
    assert stale.samples == raw.samples - 600  # before the mark: not seen until the next build
    build_rollups(tmp_path, lag_s=600, hosts=("x",), since=first + timedelta(days=1, hours=3))
    _assert_agree(A.fleet_summary(A.open_telemetry(tmp_path)), raw)


# -- retention ----------------------------------------------------------------------------------------


def test_retention_never_deletes_raw_samples_without_a_rollup(tmp_path):
    first = datetime(2026, 3, 1, tzinfo=UTC)
    _days(tmp_path, first, 6)
    now = first + timedelta(days=6)
    raw = A.fleet_summary(A.open_telemetry(tmp_path))
    raw_heat = A.hour_of_week(A.open_telemetry(tmp_path), level="host")

    def raw_days(host: str) -> list[str]:
        return sorted(p.parent.name[5:] for p in tmp_path.glob(f"gpu_samples/date=*/host={host}"))

    # No rollups: nothing goes, however old.
    r = expire_raw(tmp_path, 2 * 86400, now=now)
    assert r.partitions == 0 and len(r.kept_no_rollup) == 2 * 4
    # Host x rolled up to 23:50 on the last day; host y not at all.
    build_rollups(tmp_path, hosts=("x",), lag_s=600)
    r = expire_raw(tmp_path, 2 * 86400, now=now)
    assert r.partitions == 4  # x's first four days: older than two days and covered
    assert raw_days("x") == ["2026-03-05", "2026-03-06"] and len(raw_days("y")) == 6
    assert r.kept_no_rollup == [f"y 2026-03-0{d}" for d in range(1, 5)]
    # A mark just short of a day's end (plus the margin an incremental build reads) keeps that day.
    r = expire_raw(tmp_path, 0, now=now + timedelta(days=1))
    assert r.partitions == 1 and "x 2026-03-06" in r.kept_no_rollup and raw_days("x") == ["2026-03-06"]
    # Readers answer as before: rollups where the raw days are gone.
    con = A.open_telemetry(tmp_path)
    s = A.fleet_summary(con)
    assert "rollups" in s.data_source
    _assert_agree(s, raw)
    heat = A.hour_of_week(con, level="host")
    for a, b in zip(heat, raw_heat, strict=True):
        assert a.key == b.key
        assert [list(r) for r in a.gpu_hours] == [pytest.approx(list(r)) for r in b.gpu_hours]
    ext = A.data_extent(con)
    assert (ext.start, ext.end) == (raw.first_sample, raw.last_sample) and len(ext.gpus) == 4
    # The next build goes on from the mark though the old raw days are gone.
    _days(tmp_path, first + timedelta(days=6), 1)
    build_rollups(tmp_path, lag_s=600)
    full = A.fleet_summary(A.open_telemetry(tmp_path))
    assert full.samples == 4 * 7 * 24 * 60


def test_the_rollup_command_rebuilds_and_expires(tmp_path, capsys):
    first = datetime(2026, 3, 1, tzinfo=UTC)
    _days(tmp_path, first, 3)
    assert report_cli.main(["rollup", str(tmp_path), "--keep-raw", "1d"]) == 0
    out, err = capsys.readouterr()
    assert "from 2026-03-01T00:00:00+00:00" in err
    assert "expired 4 raw day partition(s)" in out and "2 older one(s) kept" in out  # the last day: to 23:50
    assert report_cli.main(["rollup", str(tmp_path), "--rebuild"]) == 0
    out, err = capsys.readouterr()
    # The raw samples of the first two days are gone: a rebuild starts at the oldest kept, and the
    # rollups of the days before stay.
    assert "from 2026-03-03T00:00:00+00:00" in err
    s = A.fleet_summary(A.open_telemetry(tmp_path))
    assert s.samples == 4 * 3 * 24 * 60
    with pytest.raises(SystemExit) as bad:
        report_cli.main(["rollup", str(tmp_path), "--keep-raw", "soon"])
    assert bad.value.code == 2 and "not a duration: 'soon'" in capsys.readouterr().err


@pytest.mark.parametrize("step_s", [None, 60, 300, 3600])
def test_the_what_if_replays_gpu_demand_from_rollups_as_from_raw(tmp_path, step_s):
    _irregular(tmp_path)
    options = A.PoolOptions(step_s=step_s)
    raw = A.what_if(A.open_telemetry(tmp_path), options=options)
    build_rollups(tmp_path, lag_s=600)
    s = A.what_if(A.open_telemetry(tmp_path), options=options)
    assert raw.demand == s.demand == "gpu" and raw.data_source == "raw samples"
    assert "rollups + raw samples" in s.data_source
    assert_same_what_if(s, raw, ("step_s", "requests", "observed_gpus", "gpus_needed_p95", "gpus_needed_p99",
                                 "gpus_needed_peak", "pool_gpus", "waited_requests", "need_over_time", "simulated",
                                 "sampling_s", "span_hours"))  # fmt: skip


def test_rollups_of_the_first_layout_are_rebuilt_not_counted_twice(tmp_path):
    # The first slice wrote hours as a file per day and rows without util_n / util_plain_sum.
    first = datetime(2026, 3, 1, tzinfo=UTC)
    _days(tmp_path, first, 3)
    raw = A.fleet_summary(A.open_telemetry(tmp_path, rollups=False))
    build_rollups(tmp_path, lag_s=600)
    for path in tmp_path.glob("gpu_rollup_1h/date=*/host=*/rollup.parquet"):
        t = pq.read_table(path, partitioning=None)
        for day in ("2026-03-02", "2026-03-03"):  # the month's rows again under per-day names
            legacy = path.parent.parent.parent / f"date={day}" / path.parent.name / path.name
            legacy.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(t, legacy)
    for path in tmp_path.glob("gpu_rollup_1m/date=*/host=*/rollup.parquet"):
        t = pq.read_table(path, partitioning=None)
        pq.write_table(
            t.drop_columns(["util_n", "util_plain_sum"]).replace_schema_metadata(t.schema.metadata), path
        )
    lines: list[str] = []
    build_rollups(tmp_path, lag_s=600, progress=lines.append)
    assert sum("an earlier layout" in line for line in lines) == 2
    assert sorted(p.parent.parent.name for p in tmp_path.glob("gpu_rollup_1h/date=*/host=x/*")) == [
        "date=2026-03-01"
    ]
    s = A.fleet_summary(A.open_telemetry(tmp_path))
    assert "hourly rollups" in s.data_source
    _assert_agree(s, raw)


def test_the_what_if_replays_minutes_of_days_from_rollups_after_retention(tmp_path):
    # Six days of four GPUs at one sample a minute, replayed in minute steps: from raw samples, then
    # from minute rollups once the raw days older than two are gone. Every minute's demand is the
    # same, so every answer is.
    first = datetime(2026, 3, 1, tzinfo=UTC)
    _days(tmp_path, first, 6)
    # Halves of a GPU on a pool of one: the 1,050 requests need two, so some wait, and tenants'
    # busy shares overlap (oversubscribed).
    options = A.PoolOptions(step_s=60, granularity=2, policy="first-fit", pool_gpus=1)
    raw = A.what_if(A.open_telemetry(tmp_path), options=options)
    assert raw.requests == 1050 and raw.gpus_needed_p95 == 2 and raw.waited_requests > 0
    build_rollups(tmp_path, lag_s=600)
    assert expire_raw(tmp_path, 2 * 86400, now=first + timedelta(days=6)).partitions == 2 * 4
    s = A.what_if(A.open_telemetry(tmp_path), options=options)
    assert raw.data_source == "raw samples" and s.data_source.startswith("minute rollups + raw samples")
    assert s.step_s == 60 and len(s.need) == 6 * 24 * 60
    assert_same_what_if(s, raw, ("requests", "observed_gpus", "gpus_needed_p95", "gpus_needed_p99",
                                 "gpus_needed_peak", "gpus_needed_ideal_p95", "pool_gpus", "waited_requests",
                                 "wait_max_s", "need", "need_start", "span_hours"))  # fmt: skip
