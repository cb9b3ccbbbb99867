"""The what-if pooling simulator, against hand-computed pools on small constructed telemetry.

Every case uses 10 s ticks replayed in 60 s steps, 80 GiB GPUs, and processes that sit on GPUs for
whole steps, so each expectation can be worked out on paper.
"""

from __future__ import annotations

from datetime import timedelta

import duckdb
import numpy as np
import pytest
import whatif_reference
from test_analytics_data import GIB, gpu_rows, process_rows, write_rows

import analytics as A
from analytics import _replay, _whatif

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


def test_a_pool_far_larger_than_the_need_is_replayed_at_the_peak(tmp_path, monkeypatch):
    """--pool-gpus 1000000000 (a typo, or "no bound"): the same answer as a pool of the peak need (no
    request waits), from a replay over the peak's 2 GPUs, not a billion (8 GB of room per GPU slot)."""
    con = fleet(tmp_path, [(0, 0, 3, 60, 0.5), (1, 1, 3, 60, 0.5)], gpus=2, steps=4)
    replayed = []
    bounded = _replay.bounded
    monkeypatch.setattr(
        _replay, "bounded", lambda p, h, gpus, *a: replayed.append(gpus) or bounded(p, h, gpus, *a)
    )
    huge, peak = run(con, pool_gpus=10**9), run(con, pool_gpus=2)
    assert replayed == [2, 2]
    assert huge.pool_gpus == 10**9 and huge.waited_requests == 0
    assert huge.pooled_util_mean == pytest.approx(peak.pooled_util_mean)
    assert huge.cost_pooled == pytest.approx(peak.cost_pooled * 10**9 / 2)  # priced as asked


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


# -- the replay against the step-by-step reference ---------------------------------------------------------
# The replay visits arrivals and departures only and adds busy shares per GPU-step in numpy; the
# reference (tests/whatif_reference.py) is the replay it replaced, a Python step per step and request.


def _random_rows(seed: int, keys: int, horizon: int):
    """(source, step, mem, busy) rows of ``keys`` sources sorted by source and step: runs of in-use
    steps with gaps, sizes from a few GiB to more than one pool GPU, busy shares in whole percents."""
    rng = np.random.default_rng(seed)
    rows = []
    for k in range(keys):
        t = int(rng.integers(0, 5))
        while t < horizon:
            length = int(rng.integers(1, 12))
            mem = int(rng.choice([2, 8, 16, 30, 41, 60, 80, 100])) * GIB
            for s in range(t, min(t + length, horizon)):
                rows.append(
                    (f"h / GPU {k}", s, mem - int(rng.integers(0, 2)) * GIB, rng.integers(0, 101) / 100)
                )
            t += length + int(rng.integers(1, 6))
    return sorted(rows, key=lambda r: (r[0], r[1]))


def _both(rows, gpu_mem, g, batch=7):
    """Pieces by the reference and by ``_whatif``'s process path (rows fed in batches, so runs cross
    batch ends)."""
    old = whatif_reference.cut(whatif_reference._runs(rows, lambda r: r, 0), gpu_mem, g)
    names = {name: n for n, name in enumerate(sorted({r[0] for r in rows}))}
    runs, cut = _whatif._Runs(), _whatif._Cut(gpu_mem, g)
    for lo in range(0, len(rows), batch):
        part = rows[lo : lo + batch]
        runs.add(
            np.array([names[r[0]] for r in part]),
            np.array([r[1] for r in part]),
            cut.units(np.array([r[2] for r in part])),
            np.array([r[3] for r in part]),
        )
    requests = runs.requests()
    return old, _whatif._pieces(requests, 0, g), len(requests[0])


def _same_pieces(old, new):
    # Pieces of one request with the same size are interchangeable: compare them as a multiset.
    assert sorted((r.start, r.steps, r.parts, r.origin) for r in old) == sorted(
        zip(new.start.tolist(), new.steps.tolist(), new.parts.tolist(), new.origin.tolist(), strict=True)
    )
    assert [(r.start, r.origin) for r in old] == list(
        zip(new.start.tolist(), new.origin.tolist(), strict=True)
    )


@pytest.mark.parametrize("policy", A.POLICIES)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_replay_gives_the_step_by_step_answers(policy, seed):
    horizon, g, gpu_mem = 60, 10, 80 * GIB
    rows = _random_rows(seed, keys=12, horizon=horizon)
    old, new, requests = _both(rows, gpu_mem, g)
    assert requests == len({r.origin for r in old})
    _same_pieces(old, new)
    need_ref, ideal_ref = whatif_reference._replay_unbounded(old, horizon, g, policy)
    need, ideal = _replay.unbounded(new, horizon, g, policy)
    assert need.tolist() == need_ref and ideal.tolist() == ideal_ref
    for q in (0.5, 0.95, 0.99, 1.0):
        assert _replay.percentile(need, q) == whatif_reference._percentile(need_ref, q)
    p95 = _replay.percentile(need, 0.95)
    for pool in sorted({1, max(p95 // 2, 1), p95, p95 + 2}):
        ref = whatif_reference._replay_bounded(old, horizon, pool, g, policy)
        got = _replay.bounded(new, horizon, pool, g, policy)
        assert got.placed.tolist() == [r.placed for r in old], pool
        assert got.util == pytest.approx(ref["util"], rel=1e-12), pool
        assert got.mem == pytest.approx(ref["mem"], rel=1e-12), pool
        assert got.oversubscribed == pytest.approx(ref["oversubscribed"], rel=1e-12), pool


def test_pieces_larger_than_a_pool_gpu_and_runs_across_batches():
    # 100 GiB on 40 GiB pool GPUs at halves: two whole GPUs and a half, one request; a run cut by
    # the batch boundary (batches of one row) is still one run.
    rows = [("h / GPU 0", s, 100 * GIB, 0.5) for s in range(4)] + [("h / GPU 0", 6, 10 * GIB, 0.1)]
    old, new, requests = _both(rows, 40 * GIB, 2, batch=1)
    assert requests == 2
    assert new.parts.tolist() == [2, 2, 1, 1] and new.steps.tolist() == [4, 4, 4, 1]
    _same_pieces(old, new)


@pytest.mark.parametrize("seed", [4, 5])
def test_gpu_demand_on_the_dense_grid_is_the_reference_runs(seed):
    # GPU demand: several rows per GPU-step (sums and counts of utilization, peak memory), in any
    # order, some steps idle with little memory (not in use), add up to the reference's requests.
    rng = np.random.default_rng(seed)
    horizon, g, gpu_mem, held, idle = 40, 20, 80 * GIB, 1 * GIB, 0.05
    cells = []  # (gpu, step, util sum, util n, peak memory)
    for gpu in range(6):
        for step in range(horizon):
            if rng.random() < 0.15:
                continue  # no sample in this step
            n = int(rng.integers(1, 4))
            utils = rng.choice([0.0, 0.02, 0.3, 0.9, 1.0], n)
            mems = rng.choice([0, 512 << 20, 8 * GIB, 60 * GIB, 100 * GIB], n)
            cells.append((gpu, step, utils, mems))
    ref_rows = [
        (f"h / GPU {gpu}", step, int(m.max()), u.mean())
        for gpu, step, u, m in cells
        if m.max() >= held or u.mean() >= idle
    ]
    old = whatif_reference.cut(whatif_reference._runs(ref_rows, lambda r: r, 0), gpu_mem, g)
    cut = _whatif._Cut(gpu_mem, g)
    grid = _whatif._Cells(6, horizon, 0)
    rows = [(gpu, step, u, 1, m) for gpu, step, us, ms in cells for u, m in zip(us, ms, strict=True)]
    rng.shuffle(rows)
    for lo in range(0, len(rows), 50):
        part = rows[lo : lo + 50]
        mem = np.array([r[4] for r in part])
        grid.add(
            np.array([r[0] for r in part]),
            np.array([r[1] for r in part]),
            np.array([r[2] for r in part]),
            np.array([r[3] for r in part]),
            mem >= held,
            cut.units(mem),
            np.zeros(len(part), bool),
        )
    requests, peak_gpus = grid.requests(idle)
    new = _whatif._pieces(requests, 0, g)
    _same_pieces(old, new)
    steps = {}
    for gpu, step, _, _ in cells:
        steps.setdefault(step, set()).add(gpu)
    assert peak_gpus == max(len(gs) for gs in steps.values())
    for r in old:  # every piece's busy shares: the step means, clipped
        i = new.offset[r.origin]
        assert new.busy[i : i + r.steps].tolist() == pytest.approx(r.busy)


def test_partition_units_in_duckdb_are_numpy_s_and_gpus_are_numbered_by_hash():
    gpu_mem, g = 80 * GIB, 20
    cut = _whatif._Cut(gpu_mem, g)
    mems = [
        0,
        1,
        GIB,
        4 * GIB - 1,
        4 * GIB,
        4 * GIB + (1 << 20),
        gpu_mem - 1,
        gpu_mem,
        gpu_mem + 1,
        2 * gpu_mem,
        250 * GIB + 7,
    ]
    con = duckdb.connect()
    sql = f"SELECT {cut.units_sql('m')} FROM (SELECT unnest(?::BIGINT[]) AS m)"
    assert [u for (u,) in con.execute(sql, [mems]).fetchall()] == cut.units(np.array(mems)).tolist()
    # 4 GiB is 1/20 of 80 GiB; a byte short of a GPU rounds up to 20 units (a GPU); 250 GiB: 3 GPUs + 3/20
    assert cut.units(np.array(mems)).tolist() == [1, 1, 1, 1, 1, 2, 20, 20, 21, 40, 63]
    hashes = np.array(
        [h for (h,) in con.execute("SELECT hash('h', 'GPU-' || i) FROM range(512) t(i)").fetchall()],
        np.uint64,
    )
    shift, table = _whatif._gpu_numbers(hashes)
    got = table[((hashes >> np.uint64(shift)) & np.uint64(len(table) - 1)).astype(np.int64)]
    assert got.tolist() == list(range(512))


def test_a_long_need_is_charted_as_its_peaks(tmp_path):
    # Two GPUs holding 60 GiB (15/20) each, the second only in steps 2-3: the need is 1, 1, 2, 2, 1.
    # Charted at most 2 points: peaks of steps 0-2 and 3-4 (2, 2), each standing for 3 minutes.
    from reports import _present as P

    con = fleet(tmp_path, [(0, 0, 5, 60, 0.5), (1, 2, 4, 60, 0.5)], gpus=2, steps=5)
    w = run(con)
    assert w.need == (1, 1, 2, 2, 1) and len(w.need_over_time) == 5
    assert w.need_over_time[1][0] - w.need_over_time[0][0] == timedelta(seconds=STEP)
    times, need, per = P.need_series(w, points=2)
    assert (need, per) == ([2, 2], 3) and times == [w.need_start, w.need_start + timedelta(seconds=3 * STEP)]
    assert P.need_series(w)[1] == list(w.need)
