"""The what-if pooling simulator, against hand-computed pools on small constructed telemetry.

Every case uses 10 s ticks replayed in 60 s steps, 80 GiB GPUs, and processes that sit on GPUs for
whole steps, so each expectation can be worked out on paper.
"""

from __future__ import annotations

import pytest
from test_analytics_data import GIB, gpu_rows, process_rows, write_rows

import analytics as A

TICK, STEP = 10, 60
PER_STEP = STEP // TICK


def fleet(tmp_path, procs: list[tuple[int, int, int, int, float]], gpus: int, steps: int):
    """procs: (gpu, first step, end step (exclusive), GiB, busy). One process per entry."""
    rows = []
    for g in range(gpus):
        rows += gpu_rows("h", g, [0.1] * (steps * PER_STEP), tick_s=TICK)
    prow = []
    for pid, (g, s0, s1, gib, busy) in enumerate(procs, start=100):
        prow += process_rows(
            "h", g, pid, range(s0 * PER_STEP, s1 * PER_STEP), mem=gib * GIB, sm_util=busy, tick_s=TICK
        )
    write_rows(tmp_path, "gpu_samples", rows)
    write_rows(tmp_path, "process_samples", prow)
    return A.open_telemetry(tmp_path)


def run(con, **kw):
    return A.what_if(con, options=A.PoolOptions(step_s=STEP, **kw))


def test_pooling_saves_gpus_when_jobs_are_small(tmp_path):
    # Four GPUs, each with one 16 GiB process busy 10 % for 5 steps. 16/80 = 4/20 partitions each:
    # all four fit on one pool GPU (16 of 20 partitions), busy 4 x 10 % = 40 %.
    con = fleet(tmp_path, [(g, 0, 5, 16, 0.1) for g in range(4)], gpus=4, steps=5)
    w = run(con)
    assert (w.requests, w.observed_gpus) == (4, 4)
    assert (w.gpus_needed_p95, w.gpus_needed_p99, w.gpus_needed_peak) == (1, 1, 1)
    assert w.pool_gpus == 1 and w.gpus_saved == 3
    assert w.pooled_util_mean == pytest.approx(0.4)
    assert w.pooled_mem_allocated_mean == pytest.approx(16 / 20)
    assert w.observed_util_mean == pytest.approx(0.1)
    assert w.waited_requests == 0 and w.oversubscribed_share == 0
    span_h = 5 * STEP / 3600
    assert w.span_hours == pytest.approx(span_h)
    assert w.cost_observed == pytest.approx(4 * span_h * 2.5)
    assert w.cost_saving == pytest.approx(3 * span_h * 2.5)
    assert any("Memory is the binding constraint" in a for a in w.assumptions)
    assert any("Compute is shared" in a for a in w.assumptions)


def test_coarser_partitions_need_more_gpus(tmp_path):
    con = fleet(tmp_path, [(g, 0, 5, 16, 0.1) for g in range(4)], gpus=4, steps=5)
    # Halves: 16 GiB rounds up to 1/2, two per GPU -> 2 GPUs. Whole GPUs: 4.
    assert run(con, granularity=2).gpus_needed_p95 == 2
    assert run(con, granularity=1).gpus_needed_p95 == 4


def test_pooling_cannot_save_when_memory_is_full(tmp_path):
    # Two processes holding 60 GiB (15/20) each, all the time: no two fit on one GPU.
    con = fleet(tmp_path, [(0, 0, 4, 60, 0.9), (1, 0, 4, 60, 0.9)], gpus=2, steps=4)
    w = run(con)
    assert (w.gpus_needed_p95, w.pool_gpus, w.observed_gpus) == (2, 2, 2)
    assert w.cost_saving == pytest.approx(0)
    assert w.gpus_needed_ideal_p95 == 2  # 30/20 partitions: even repacking needs two


def test_a_smaller_pool_makes_requests_wait(tmp_path):
    # r1: 60 GiB steps 0-2. r2: 60 GiB from step 1 for 2 steps. Unbounded need: 1, 2, 2, 0 -> p95 2.
    # On a pool of one GPU, r2 waits until r1 leaves at step 3: one of two requests waited 120 s.
    con = fleet(tmp_path, [(0, 0, 3, 60, 0.5), (1, 1, 3, 60, 0.5)], gpus=2, steps=4)
    w = run(con)
    assert w.gpus_needed_p95 == 2 and w.waited_requests == 0
    one = run(con, pool_gpus=1)
    assert one.pool_gpus == 1
    assert (one.waited_requests, one.waited_share) == (1, pytest.approx(0.5))
    assert one.wait_max_s == 120
    # Busy 50 % on the one GPU for steps 0-4 (r1 0-2, r2 3-4), 5 steps in all.
    assert one.pooled_util_mean == pytest.approx(0.5)


def test_packing_policy_matters(tmp_path):
    # Tenths of a GPU (8 GiB). a=5 and b=7 arrive at step 0 and stay; c=3 at step 1; d=5 at step 2.
    # first-fit puts c next to a (G0 left with 2), so d needs a third GPU;
    # best-fit puts c next to b (G1 full), so d fits beside a: two GPUs.
    procs = [(0, 0, 5, 40, 0.2), (1, 0, 5, 56, 0.2), (2, 1, 5, 24, 0.2), (3, 2, 5, 40, 0.2)]
    con = fleet(tmp_path, procs, gpus=4, steps=5)
    ff = run(con, granularity=10, policy="first-fit")
    bf = run(con, granularity=10, policy="best-fit")
    assert [n for _, n in ff.need_over_time] == [2, 2, 3, 3, 3]
    assert [n for _, n in bf.need_over_time] == [2, 2, 2, 2, 2]
    assert (ff.gpus_needed_p95, bf.gpus_needed_p95) == (3, 2)
    assert ff.gpus_needed_ideal_p95 == 2  # 20 tenths: repacking would fit two GPUs


def test_first_fit_decreasing_places_large_arrivals_first(tmp_path):
    # In one step: 3, 3, 3 tenths then 7 and 4. In arrival order (first-fit) 3+3+3 fill G0 to 9, 7 opens G1,
    # 4 opens G2. Largest first: 7+3 on G0, 4+3+3 on G1 -> two GPUs.
    procs = [
        (0, 0, 2, 24, 0.1),
        (1, 0, 2, 24, 0.1),
        (2, 0, 2, 24, 0.1),
        (3, 0, 2, 56, 0.1),
        (4, 0, 2, 32, 0.1),
    ]
    con = fleet(tmp_path, procs, gpus=5, steps=2)
    assert run(con, granularity=10, policy="first-fit").gpus_needed_peak == 3
    assert run(con, granularity=10, policy="first-fit-decreasing").gpus_needed_peak == 2


def test_compute_oversubscription_is_reported(tmp_path):
    # Two small jobs each busy 70 %: they share one GPU's memory but want 140 % of its compute.
    con = fleet(tmp_path, [(0, 0, 3, 8, 0.7), (1, 0, 3, 8, 0.7)], gpus=2, steps=3)
    w = run(con)
    assert w.pool_gpus == 1
    assert w.pooled_util_mean == pytest.approx(1.0)  # capped
    assert w.oversubscribed_share == pytest.approx(1.0)


def test_gpu_demand_without_process_rows(tmp_path):
    # Two GPUs hold 16 GiB each for 3 steps, a third is empty and idle: two requests, one pool GPU.
    rows = gpu_rows("h", 0, [0.3] * 18, tick_s=TICK, mem_used=16 * GIB)
    rows += gpu_rows("h", 1, [0.3] * 18, tick_s=TICK, mem_used=16 * GIB)
    rows += gpu_rows("h", 2, [0.0] * 18, tick_s=TICK, mem_used=0)
    write_rows(tmp_path, "gpu_samples", rows)
    con = A.open_telemetry(tmp_path)
    w = run(con, demand="gpu")
    assert (w.requests, w.observed_gpus, w.gpus_needed_p95) == (2, 3, 1)
    assert w.pooled_util_mean == pytest.approx(0.6)
    with pytest.raises(A.TelemetryError, match="no process rows"):
        run(con, demand="process")


def test_bad_options_are_refused(tmp_path):
    con = fleet(tmp_path, [(0, 0, 1, 8, 0.1)], gpus=1, steps=1)
    with pytest.raises(A.TelemetryError, match="packing policy"):
        run(con, policy="random")
    with pytest.raises(A.TelemetryError, match="granularity"):
        run(con, granularity=40)


def test_a_request_larger_than_a_pool_gpu_takes_whole_gpus(tmp_path):
    # One 100 GiB process replayed onto 40 GiB pool GPUs: two whole GPUs and half of a third (1/2
    # granularity), all for the same run, and still one request.
    con = fleet(tmp_path, [(0, 0, 2, 100, 0.5)], gpus=1, steps=2)
    w = run(con, gpu_mem_bytes=40 * GIB, granularity=2)
    assert w.requests == 1
    assert w.gpus_needed_peak == 3
    assert w.pooled_mem_allocated_mean == pytest.approx(5 / 6)  # 2 whole + 1 half of 3 GPUs
