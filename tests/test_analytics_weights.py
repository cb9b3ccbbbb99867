"""Observed time on irregular sampling: hand-computed expectations per pattern, and a property test.

The weight of a sample (``collector.weights``): the time to its GPU's next later timestamp; an
interval longer than 1.5 nominal intervals (the median of its own interval, the four before it and
the four after it; of an even number the lower) is a gap and counts for one nominal interval; the last sample counts for one nominal
interval; where no local spacing exists the fleet's median interval stands in, capped at the interval.
"""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_analytics_data import GIB, T0, write_rows

import analytics as A

H = 3600.0


def rows_at(
    host: str, seconds: list[float], utils: list[float] | float = 0.5, *, gpu: int = 0, mem=0
) -> list[dict]:
    """One GPU's samples stamped at the given seconds after T0 (any order, repeats allowed)."""
    us = utils if isinstance(utils, list) else [utils] * len(seconds)
    mems = mem if isinstance(mem, list) else [mem] * len(seconds)
    return [
        {
            "host": host,
            "ts": T0 + timedelta(seconds=s),
            "gpu_index": gpu,
            "gpu_uuid": f"GPU-{host}-{gpu}",
            "gpu_name": "NVIDIA H100 80GB HBM3",
            "util_gpu_mean": u,
            "mem_used_bytes": m,
            "mem_total_bytes": 80 * GIB,
        }
        for s, u, m in zip(seconds, us, mems, strict=True)
    ]


def summary(tmp_path, rows):
    write_rows(tmp_path, "gpu_samples", rows)
    return A.fleet_summary(A.open_telemetry(tmp_path))


def observed_s(s: A.FleetSummary, host: str = "a") -> float:
    return next(g.gpu_hours for g in s.per_gpu if g.host == host) * H


def test_regular_ticks_count_samples_times_tick(tmp_path):
    s = summary(tmp_path, rows_at("a", [10.0 * i for i in range(10)]))
    assert observed_s(s) == pytest.approx(100)  # 9 intervals of 10 s + the last sample's tick
    assert s.gap_hours == 0
    assert s.per_gpu[0].tick_s == pytest.approx(10)


def test_gaps_of_any_length_count_one_tick(tmp_path):
    # 57 s sampling, 5 samples, a 3372 s gap, 5 samples, a 2-day gap and one last, lone sample.
    first = [57.0 * i for i in range(5)]
    second = [3600 + 57.0 * i for i in range(5)]
    last = [3600 + 2 * 86400.0]
    s = summary(tmp_path, rows_at("a", first + second + last))
    # Each sample 57 s; the two before a gap count one local tick (57 s), the lone last one too (the
    # shorter of the two intervals before it), not the two days before it.
    assert observed_s(s) == pytest.approx(11 * 57)
    assert s.gap_hours * H == pytest.approx((3600 - 4 * 57 - 57) + (2 * 86400 - 4 * 57 - 57))
    assert s.sampling[0].median_interval_s == pytest.approx(57)


def test_bursts_count_only_the_bursts(tmp_path):
    # The issue's log: three 10-sample bursts an hour, 10 s apart, for 6 hours: 180 samples, 0.5 h.
    seconds = [h * 3600 + b * 1200 + 10.0 * i for h in range(6) for b in range(3) for i in range(10)]
    s = summary(tmp_path, rows_at("a", seconds))
    assert observed_s(s) == pytest.approx(0.5 * H)
    assert s.gpu_hours == pytest.approx(0.5)


def test_the_issues_57_s_gpu_with_gaps_is_not_credited_more_than_it_existed(tmp_path):
    # 787 samples 57 s apart spread with gaps over 22.75 h: observed is 787 x 57 s, never the span.
    seconds, t = [], 0.0
    for i in range(787):
        seconds.append(t)
        t += 57.0 if i % 40 else 57.0 * 4 + 60  # a missed stretch every 40 samples
    s = summary(tmp_path, rows_at("a", seconds))
    assert observed_s(s) == pytest.approx(787 * 57)
    assert observed_s(s) <= seconds[-1] - seconds[0] + 57


def test_a_tick_that_changes_keeps_each_sides_tick(tmp_path):
    # A collector at 1 s (t = 0..19), restarted with --interval 10 (t = 30..120).
    seconds = [float(i) for i in range(20)] + [30.0 + 10 * i for i in range(10)]
    s = summary(tmp_path, rows_at("a", seconds))
    # t = 0..18: 1 s each (19). t = 19 -> 30 (11 s): its own and the intervals around it are 11, 1,
    # 1, 1, 1, 10, 10, 10, 10, median 10, and 11 s is not over 15 s: it counts whole (the first 10 s
    # sample, at 30, stands for 20..30). t = 30..110: 10 s each (90). t = 120, the last: 10 s.
    assert observed_s(s) == pytest.approx(19 + 11 + 90 + 10)
    # And the other way round: 10 s first, then 1 s.
    s = summary(
        tmp_path / "down", rows_at("a", [10.0 * i for i in range(10)] + [95.0 + i for i in range(20)])
    )
    # t = 0..80: 10 s (90; t = 80: its own 10 and 10, 10, 10, 10, 5, 1, 1, 1 -> 10). t = 90 -> 95
    # (5 s) against 10 x 4, 1 x 4 -> median 5: not over 7.5, it counts whole. t = 95..113: 1 s each
    # (19); t = 114, the last: 1 s.
    assert observed_s(s) == pytest.approx(90 + 5 + 19 + 1)


def test_duplicate_timestamps_count_once(tmp_path):
    seconds = [10.0 * i for i in range(10)]
    s = summary(tmp_path, rows_at("a", seconds + seconds))  # two overlapping copies of one log
    assert observed_s(s) == pytest.approx(100)
    assert s.samples == 20


def test_a_clock_stepping_back_counts_the_stamped_time_once(tmp_path):
    # 0..100 every 10 s, then the clock steps back 55 s: 55..155 every 10 s (11 + 11 samples).
    seconds = [10.0 * i for i in range(11)] + [55.0 + 10 * i for i in range(11)]
    s = summary(tmp_path, rows_at("a", seconds))
    # Sorted, the stamps run 0..155 with 5 s steps where they interleave: the 155 s they cover, plus
    # the last sample's tick (10 s). Never more than the span plus one tick.
    assert observed_s(s) == pytest.approx(155 + 10)


def test_overlapping_files_of_one_gpu(tmp_path):
    # File 1: 0..100 every 10 s; file 2 (another collector on the same GPU): 53..203 every 10 s.
    seconds = [10.0 * i for i in range(11)] + [53.0 + 10 * i for i in range(16)]
    s = summary(tmp_path, rows_at("a", seconds))
    assert observed_s(s) == pytest.approx(203 + 10)


def test_gpus_with_too_few_samples_take_the_fleet_tick(tmp_path):
    rows = rows_at("a", [10.0 * i for i in range(10)])
    rows += rows_at("b", [50.0])  # one sample
    rows += rows_at("c", [0.0, 3 * 3600.0])  # two samples, 3 h apart
    s = summary(tmp_path, rows)
    assert observed_s(s, "b") == pytest.approx(10)  # the fleet's median interval
    assert observed_s(s, "c") == pytest.approx(20)  # 10 s each, not the 3 h between them
    assert s.gpu_hours == pytest.approx(sum(g.gpu_hours for g in s.per_gpu))


def test_time_weighted_figures_use_the_weights(tmp_path):
    # Bursty GPU: per hour one burst of 6 samples 10 s apart (busy 0.9, 2 GiB) and one of 6 samples
    # (idle 0.0, 4 GiB held), 30 min apart, for 2 h. Each burst: 60 s observed.
    seconds, utils, mems = [], [], []
    for h in range(2):
        for b, (u, m) in enumerate(((0.9, 2 * GIB), (0.0, 4 * GIB))):
            for i in range(6):
                seconds.append(h * 3600 + b * 1800 + 10.0 * i)
                utils.append(u)
                mems.append(m)
    s = summary(tmp_path, rows_at("a", seconds, utils, mem=mems))
    assert s.gpu_hours * H == pytest.approx(240)
    assert s.idle_gpu_hours * H == pytest.approx(120)
    assert s.held_idle_gpu_hours * H == pytest.approx(120)
    assert s.util_gpu_mean == pytest.approx(0.45)
    assert s.mem_used_ratio_mean == pytest.approx(3 / 80)
    timeline = A.utilization_timeline(A.open_telemetry(tmp_path), bucket_s=3600)
    assert [p.gpu_hours * H for p in timeline.points] == pytest.approx([120, 120])
    assert [p.util_gpu_mean for p in timeline.points] == pytest.approx([0.45, 0.45])


# --- the property, over random patterns ------------------------------------------------------------


def reference_weights(stamps: list[float], fleet_tick: float) -> list[float]:
    """The definition, written out independently in plain Python, for one GPU (stamps in seconds;
    computed in whole microseconds, as the timestamps are stored, so boundaries compare exactly)."""
    t = sorted(round(x * 1e6) for x in stamps)
    fleet_tick = round(fleet_tick * 1e6)
    n = len(t)
    d = [t[i + 1] - t[i] if i + 1 < n and t[i + 1] > t[i] else None for i in range(n)]

    def diff(i, j):  # interval between rows i and j, None when out of range or zero
        if i < 0 or j >= n:
            return None
        return (t[j] - t[i]) or None

    out = []
    for i in range(n):
        final = i == n - 1
        if d[i] is None and not final:
            out.append(0.0)
            continue
        before = [diff(i - k - 1, i - k) for k in range(4)]
        after = [diff(i + k, i + k + 1) for k in range(1, 5)]
        around = sorted(x for x in [d[i], *before, *after] if x)
        if len(around) - (d[i] is not None) < (2 if final else 1):
            out.append(fleet_tick if d[i] is None else min(d[i], fleet_tick))
            continue
        tick = around[(len(around) + 1) // 2 - 1]  # the lower median
        out.append(tick if final or 2 * d[i] > 3 * tick else d[i])
    return [w / 1e6 for w in out]


def intervals_ms(stamps: list[float]) -> list[float]:
    t = sorted(stamps)
    return [round((b - a) * 100) / 100 for a, b in itertools.pairwise(t) if b > a]


# A pattern: runs of samples at some tick, separated by gaps, with duplicates and steps back.
_run = st.tuples(
    st.sampled_from([1.0, 2.0, 5.0, 10.0, 15.0, 57.0]),  # tick
    st.integers(1, 12),  # samples
    st.floats(0, 7200, allow_nan=False).map(lambda x: round(x, 2)),  # gap before the run (or step back)
    st.booleans(),  # this run's clock steps back instead of forward
    st.booleans(),  # every sample written twice
)


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(gpus=st.lists(st.lists(_run, min_size=1, max_size=5), min_size=1, max_size=3))
def test_observed_time_matches_the_definition_on_random_patterns(tmp_path_factory, gpus):
    root = tmp_path_factory.mktemp("pattern")
    rows, stamps_of = [], {}
    for g, runs in enumerate(gpus):
        t, stamps = 0.0, []
        for tick, count, gap, back, twice in runs:
            t = max(0.0, t - gap) if back else t + gap
            run = [round(t + tick * i, 2) for i in range(count)]
            t = run[-1] + tick
            stamps += run + (run if twice else [])
        rows += rows_at("h", stamps, gpu=g)
        stamps_of[f"GPU-h-{g}"] = stamps
    write_rows(root, "gpu_samples", rows)
    s = A.fleet_summary(A.open_telemetry(root))

    all_intervals = sorted(x for st_ in stamps_of.values() for x in intervals_ms(st_))
    fleet_tick = all_intervals[(len(all_intervals) - 1) // 2] if all_intervals else 0.0
    assert s.tick_s_median == pytest.approx(fleet_tick, abs=0.011)
    for gpu in s.per_gpu:
        stamps = stamps_of[gpu.gpu_uuid]
        weights = reference_weights(stamps, s.tick_s_median)
        assert gpu.gpu_hours * H == pytest.approx(sum(weights), abs=1e-6)
        # Never more than the span from first to last sample plus one tick (the last sample's).
        assert gpu.gpu_hours * H <= max(stamps) - min(stamps) + weights[-1] + 1e-6
    assert s.gpu_hours == pytest.approx(sum(g.gpu_hours for g in s.per_gpu))
    assert s.idle_gpu_hours <= s.gpu_hours + 1e-12
