"""What-if pooling: replay the observed demand onto a pool of GPUs cut into partitions.

The demand is read from telemetry and cut into *requests*, the way Bitfusion clients asked for GPUs:

- ``demand="process"``: each process's continuous presence on a GPU is one request; its size is the
  most memory it held during that run, its busy share per step is its ``sm_util`` (or, where NVML
  gave none, its GPU's utilization.gpu split among such processes).
- ``demand="gpu"``: each GPU's continuous stretch of holding at least ``held_mem_bytes`` (or being
  busy) is one request, sized by the peak memory of the stretch, busy by its utilization.gpu — for
  telemetry without process rows (an nvidia-smi or DCGM log).
- ``demand="auto"`` (the default): process demand where the scope has process rows, else GPU demand;
  ``WhatIf.demand`` says which one was used.

A request's memory is rounded up to whole partitions (``1/granularity`` of a pool GPU; Bitfusion
allowed down to 1/20) and held, unmoved, for its whole run: partitions are fixed at allocation and
leases do not migrate. Compute is shared: tenants of one GPU add their busy shares, capped at 1.

Two replays, step by step (``step_s``):

1. An unbounded pool: arrivals are placed by the packing policy, a new GPU opens when none has room.
   The GPUs holding at least one partition at each step give the *need*: its 95th and 99th
   percentile over time are the pool sizes that would have served the demand 95 % / 99 % of the time.
2. A pool of ``pool_gpus`` (default: the p95 need): a request that does not fit waits and retries
   each step (as a Bitfusion client backs off and retries) until partitions free up, then runs for
   its full duration. This gives how often a request would have waited, and how busy the pooled
   GPUs would be.

Packing policies: ``first-fit`` (lowest-numbered GPU with room), ``best-fit`` (the GPU left with the
least room), ``first-fit-decreasing`` (the requests arriving in one step placed largest first, each
first-fit).
"""

from __future__ import annotations

import math
import statistics
from bisect import insort
from dataclasses import dataclass, field
from datetime import UTC, datetime

import duckdb

from analytics import _rollup
from analytics._rows import GIB
from analytics._scope import ALL, Scope, no_data_error
from analytics._telemetry import TelemetryError

POLICIES = ("first-fit", "best-fit", "first-fit-decreasing")
DEMANDS = ("auto", "process", "gpu")
GRANULARITIES = (1, 2, 4, 5, 8, 10, 20)
_AUTO_STEPS = (60, 300, 900, 3600)
MAX_STEPS = 20_000


@dataclass(frozen=True)
class PoolOptions:
    """Inputs of the what-if. Sizes in bytes, time in seconds, price per GPU-hour in ``currency``."""

    granularity: int = 20  # partitions per GPU: a request takes whole 1/granularity slices
    policy: str = "best-fit"
    demand: str = "auto"  # "process", "gpu", or "auto": process rows where the scope has them
    step_s: int | None = (
        None  # replay resolution; None: 60 s or more (>= 2 sampling intervals, <= 20,000 steps)
    )
    pool_gpus: int | None = None  # size of the pool replayed with waiting; None: the p95 need
    gpu_mem_bytes: int | None = None  # memory of one pool GPU; None: the largest GPU observed
    held_mem_bytes: int = 1 * GIB  # demand="gpu": a GPU holding less (and idle) has no request
    idle_below: float = 0.05
    price_per_gpu_hour: float = 2.50
    currency: str = "USD"

    def check(self) -> None:
        if self.policy not in POLICIES:
            raise TelemetryError(
                f"unknown packing policy {self.policy!r}", "use one of: " + ", ".join(POLICIES)
            )
        if self.demand not in DEMANDS:
            raise TelemetryError(f"unknown demand basis {self.demand!r}", "use one of: " + ", ".join(DEMANDS))
        if not 1 <= self.granularity <= 20:
            raise TelemetryError(
                f"granularity {self.granularity} out of range", "partitions per GPU go from 1 to 20"
            )
        if self.pool_gpus is not None and self.pool_gpus < 1:
            raise TelemetryError("pool size must be at least 1 GPU", "leave it empty to use the p95 need")


DEFAULT_POOL = PoolOptions()


@dataclass
class Request:
    """One observed use of a GPU, replayed as one partition request."""

    source: str  # "host / GPU n / pid p" or "host / GPU n"
    start: int  # step index
    busy: list[float]  # busy share per step of the run (ratio 0-1)
    mem_bytes: int
    parts: int = 0  # partitions of one pool GPU (set by the replay)
    placed: int = -1  # step the pool placed it (replay 2)
    origin: int = 0  # the observed request a piece belongs to (a request larger than a GPU is several)

    @property
    def steps(self) -> int:
        return len(self.busy)


@dataclass(frozen=True)
class WhatIf:
    """The pool that would have served the observed demand. Ratios 0-1; cost in ``options.currency``."""

    options: PoolOptions
    step_s: int
    span_hours: float
    requests: int
    observed_gpus: int
    observed_util_mean: float | None  # utilization.gpu of the observed GPUs over the span
    gpus_needed_p95: int
    gpus_needed_p99: int
    gpus_needed_peak: int
    gpus_needed_ideal_p95: int  # if partitions could be repacked every step (a lower bound)
    pool_gpus: int  # the pool replayed with waiting
    pooled_util_mean: float  # mean over the pool's GPUs and steps of min(1, sum of tenants' busy)
    pooled_mem_allocated_mean: float  # partitions held / partitions in the pool
    oversubscribed_share: float  # GPU-steps where tenants' busy shares sum above 1 (they would slow)
    waited_requests: int
    waited_share: float  # of requests, on the pool of pool_gpus
    wait_p95_s: float  # among requests that waited
    wait_max_s: float
    cost_observed: float  # observed GPUs x span x price
    cost_pooled: float  # pool_gpus x span x price
    need_over_time: tuple[tuple[datetime, int], ...] = field(repr=False)
    assumptions: tuple[str, ...] = field(repr=False, default=())
    simulated: bool = False
    demand: str = "process"  # the demand basis used: "process" or "gpu" (options.demand may say "auto")
    sampling_s: float | None = None  # the typical interval between a GPU's samples
    data_source: str = "raw samples"  # which data answered: rollups (GPU demand) and/or raw samples

    @property
    def cost_saving(self) -> float:
        return self.cost_observed - self.cost_pooled

    @property
    def gpus_saved(self) -> int:
        return self.observed_gpus - self.pool_gpus


def _auto_step(span_s: float, sampling_s: float = 0.0) -> int:
    # At least two sampling intervals per step, so a GPU that ran through a step has a sample in it
    # (an nvidia-smi log every 57 s would otherwise leave 60 s steps empty and cut runs in pieces).
    for step in _AUTO_STEPS:
        if span_s / step <= MAX_STEPS and step >= 2 * sampling_s:
            return step
    return math.ceil(span_s / MAX_STEPS / 3600) * 3600


_GPU_STEPS = """
    SELECT host, gpu_uuid, any_value(gpu_index) AS gpu_index, epoch_us(ts) // ? AS step,
           avg(util_gpu_mean) AS util, max(mem_used_bytes) AS mem, max(mem_total_bytes) AS mem_total,
           bool_or(simulated) AS sim
    FROM gpu_samples WHERE {where} GROUP BY host, gpu_uuid, step
"""

# The same from rollup rows before each host's mark (plain sums and counts: the same means) and
# raw samples after it; a step that straddles a mark adds both.
_GPU_STEPS_ROLLED = """
    SELECT host, gpu_uuid, arg_max(gpu_index, t) AS gpu_index, step,
           sum(util_sum) / nullif(sum(util_n), 0) AS util, max(mem) AS mem, max(mem_total) AS mem_total,
           bool_or(sim) AS sim
    FROM (
        SELECT host, gpu_uuid, gpu_index, epoch_us(last_ts) AS t, epoch_us(ts) // ? AS step,
               util_plain_sum AS util_sum, util_n, mem_used_peak AS mem, mem_total, simulated_s > 0 AS sim
        FROM {rel}
        UNION ALL
        SELECT host, gpu_uuid, gpu_index, epoch_us(ts), epoch_us(ts) // ? AS step, util_gpu_mean,
               (util_gpu_mean IS NOT NULL)::BIGINT, mem_used_bytes, mem_total_bytes, simulated
        FROM gpu_samples WHERE {where}
    )
    GROUP BY host, gpu_uuid, step ORDER BY host, gpu_uuid, step
"""

_PROCESS_STEPS = """
    WITH gs AS ({gpu_steps}),
    ps AS (
        SELECT host, gpu_uuid, any_value(gpu_index) AS gpu_index, pid, epoch_us(ts) // ? AS step,
               max(mem_used_bytes) AS mem, avg(sm_util) AS busy, bool_or(simulated) AS sim
        FROM process_samples WHERE {where} GROUP BY host, gpu_uuid, pid, step
    ),
    unknown AS (SELECT host, gpu_uuid, step, count(*) AS n FROM ps WHERE busy IS NULL GROUP BY ALL)
    SELECT ps.host, ps.gpu_index, ps.pid, ps.step, ps.mem,
           coalesce(ps.busy, gs.util / unknown.n, 0.0) AS busy, ps.sim
    FROM ps LEFT JOIN gs USING (host, gpu_uuid, step) LEFT JOIN unknown USING (host, gpu_uuid, step)
    ORDER BY ps.host, ps.gpu_uuid, ps.pid, ps.step
"""


def _runs(rows, key_of, first_step: int) -> list[Request]:
    """Cut (key, step, mem, busy) rows sorted by key and step into continuous runs."""
    out: list[Request] = []
    cur: Request | None = None
    last_key, last_step = None, None
    for row in rows:
        key, step, mem, busy = key_of(row)
        if cur is None or key != last_key or step != last_step + 1:
            cur = Request(key, step - first_step, [], 0)
            out.append(cur)
        cur.busy.append(min(max(float(busy or 0.0), 0.0), 1.0))
        cur.mem_bytes = max(cur.mem_bytes, int(mem or 0))
        last_key, last_step = key, step
    return out


class _Pool:
    """GPUs of ``size`` partitions; ``free[i]`` partitions left on GPU i."""

    def __init__(self, size: int, gpus: int = 0, growable: bool = True):
        self.size, self.growable = size, growable
        self.free = [size] * gpus

    def place(self, parts: int, policy: str) -> int | None:
        fits = [i for i, f in enumerate(self.free) if f >= parts]
        if fits:
            gpu = min(fits, key=lambda i: (self.free[i], i)) if policy == "best-fit" else fits[0]
        elif self.growable:
            self.free.append(self.size)
            gpu = len(self.free) - 1
        else:
            return None
        self.free[gpu] -= parts
        return gpu

    def in_use(self) -> int:
        return sum(1 for f in self.free if f < self.size)


def _order(arrivals: list[Request], policy: str) -> list[Request]:
    return sorted(arrivals, key=lambda r: -r.parts) if policy == "first-fit-decreasing" else arrivals


def _percentile(values: list[int], p: float) -> int:
    ordered = sorted(values)
    return ordered[max(math.ceil(p * len(ordered)) - 1, 0)] if ordered else 0


def what_if(
    con: duckdb.DuckDBPyConnection, scope: Scope = ALL, options: PoolOptions = DEFAULT_POOL
) -> WhatIf:
    """Replay the demand of ``scope`` onto a partitioned pool (see the module docstring)."""
    options.check()
    where, params = scope.where()
    demand = options.demand
    if demand == "auto":
        has_processes = con.execute(
            f"SELECT count(*) > 0 FROM (SELECT 1 FROM process_samples WHERE {where} LIMIT 1)", params
        ).fetchone()[0]
        demand = "process" if has_processes else "gpu"
    # GPU demand is plain per-step aggregates: rollups answer it where they cover the range (before
    # each host's mark; raw samples after it). Process demand reads process rows, which have none.
    whole = _rollup.plan(con, scope)[0] if demand == "gpu" else None
    lo, hi, gpu_mem, sampling_s = _extent(con, where, params, whole)
    if lo is None:
        raise no_data_error(con, scope)
    step_s = options.step_s or _auto_step((hi - lo) / 1e6, sampling_s or 0.0)
    step_us = step_s * 1_000_000
    first, last = lo // step_us, hi // step_us
    horizon = int(last - first + 1)
    gpu_mem = options.gpu_mem_bytes or gpu_mem
    if not gpu_mem:
        raise TelemetryError(
            "no GPU memory size in the telemetry", "give the pool GPU's memory (gpu_mem_bytes)"
        )

    plan = _rollup.plan(con, scope, None, step_s)[0] if whole is not None else None
    if plan is not None:
        rel, rp = _rollup.rollup_relation(plan, where, params)
        after, ap = _rollup.raw_after(plan)
        try:
            gpu_steps = con.execute(
                _GPU_STEPS_ROLLED.format(rel=rel, where=where + after), [step_us, *rp, step_us, *params, *ap]
            ).fetchall()
        except duckdb.BinderException:  # rollups built before they held util_n: raw samples answer
            plan = None
    if plan is None:
        gpu_steps = con.execute(
            f"{_GPU_STEPS.format(where=where)} ORDER BY host, gpu_uuid, step", [step_us, *params]
        ).fetchall()
    observed_gpus = len({(r[0], r[1]) for r in gpu_steps})
    utils = [r[4] for r in gpu_steps if r[4] is not None]
    simulated = any(r[7] for r in gpu_steps)

    if demand == "process":
        rows = con.execute(
            _PROCESS_STEPS.format(gpu_steps=_GPU_STEPS.format(where=where), where=where),
            [step_us, *params, step_us, *params],
        ).fetchall()
        if not rows:
            raise TelemetryError(
                f"no process rows for {scope.describe()}",
                "demand 'process' needs per-process telemetry; use demand 'gpu' (or 'auto') to replay "
                "each GPU's utilization and memory instead",
            )
        simulated = simulated or any(r[6] for r in rows)
        requests = _runs(rows, lambda r: (f"{r[0]} / GPU {r[1]} / pid {r[2]}", r[3], r[4], r[5]), first)
    else:
        in_use = [
            r
            for r in gpu_steps
            if (r[5] or 0) >= options.held_mem_bytes or (r[4] or 0.0) >= options.idle_below
        ]
        requests = _runs(in_use, lambda r: (f"{r[0]} / GPU {r[2]}", r[3], r[5], r[4]), first)

    g = options.granularity
    pieces: list[Request] = []
    for n, req in enumerate(requests):
        # A request larger than one pool GPU takes whole GPUs for the excess (same lifetime).
        whole, rest = divmod(req.mem_bytes, gpu_mem)
        for _ in range(int(whole)):
            pieces.append(Request(req.source, req.start, list(req.busy), gpu_mem, g, origin=n))
        if rest or not whole:
            parts = max(1, math.ceil(rest / gpu_mem * g - 1e-9))
            pieces.append(Request(req.source, req.start, list(req.busy), int(rest), parts, origin=n))
    pieces.sort(key=lambda r: (r.start, r.source))

    need, ideal = _replay_unbounded(pieces, horizon, g, options.policy)
    p95, p99 = _percentile(need, 0.95), _percentile(need, 0.99)
    pool_gpus = options.pool_gpus or max(p95, 1)
    bounded = _replay_bounded(pieces, horizon, pool_gpus, g, options.policy)

    span_hours = horizon * step_s / 3600.0
    price = options.price_per_gpu_hour
    # A request waited as long as its longest-waiting piece.
    waited: dict[int, int] = {}
    for r in pieces:
        if r.placed > r.start:
            waited[r.origin] = max(waited.get(r.origin, 0), (r.placed - r.start) * step_s)
    waits = sorted(waited.values())
    return WhatIf(
        options=options,
        step_s=step_s,
        span_hours=span_hours,
        requests=len(requests),
        observed_gpus=observed_gpus,
        observed_util_mean=sum(utils) / len(utils) if utils else None,
        gpus_needed_p95=p95,
        gpus_needed_p99=p99,
        gpus_needed_peak=max(need, default=0),
        gpus_needed_ideal_p95=_percentile(ideal, 0.95),
        pool_gpus=pool_gpus,
        pooled_util_mean=bounded["util"],
        pooled_mem_allocated_mean=bounded["mem"],
        oversubscribed_share=bounded["oversubscribed"],
        waited_requests=len(waits),
        waited_share=len(waits) / len(requests) if requests else 0.0,
        wait_p95_s=float(_percentile(waits, 0.95)),
        wait_max_s=float(max(waits, default=0)),
        cost_observed=observed_gpus * span_hours * price,
        cost_pooled=pool_gpus * span_hours * price,
        need_over_time=tuple(
            (datetime.fromtimestamp((first + t) * step_s, UTC), n) for t, n in enumerate(need)
        ),
        assumptions=_assumptions(options, demand, step_s, gpu_mem, sampling_s),
        simulated=simulated,
        demand=demand,
        sampling_s=sampling_s,
        data_source=plan.describe() if plan is not None else "raw samples",
    )


def _extent(con, where: str, params: list, plan) -> tuple[int | None, int | None, int | None, float | None]:
    """(first, last sample in µs, largest GPU memory, the typical spacing of a GPU's samples in s).

    The spacing chooses the step (it is not a weight: nothing here is weighted per sample; demand is
    averaged per step): the median over GPUs of their span over their samples less one.
    """
    per_gpu = (
        f"SELECT host, gpu_uuid, count(*) AS n, min(epoch_us(ts)) AS lo, max(epoch_us(ts)) AS hi, "
        f"max(mem_total_bytes) AS mem FROM gpu_samples WHERE {where}{{after}} GROUP BY host, gpu_uuid"
    )
    if plan is None:
        rows = con.execute(per_gpu.format(after=""), params).fetchall()
    else:
        rel, rp = _rollup.rollup_relation(plan, where, params)
        after, ap = _rollup.raw_after(plan)
        rows = con.execute(
            f"""SELECT host, gpu_uuid, sum(n), min(lo), max(hi), max(mem) FROM (
                    SELECT host, gpu_uuid, sum(samples) AS n, epoch_us(min(first_ts)) AS lo,
                           epoch_us(max(last_ts)) AS hi, max(mem_total) AS mem
                    FROM {rel} GROUP BY host, gpu_uuid
                    UNION ALL {per_gpu.format(after=after)}) GROUP BY host, gpu_uuid""",
            [*rp, *params, *ap],
        ).fetchall()
    if not rows:
        return None, None, None, None
    spacing = [(hi - lo) / (n - 1) for _, _, n, lo, hi, _ in rows if n > 1]
    mems = [m for *_, m in rows if m is not None]
    return (
        min(r[3] for r in rows),
        max(r[4] for r in rows),
        max(mems) if mems else None,
        statistics.median(spacing) / 1e6 if spacing else None,
    )


def _replay_unbounded(
    pieces: list[Request], horizon: int, g: int, policy: str
) -> tuple[list[int], list[int]]:
    """GPUs in use per step when every arrival is placed at once, and the repacked lower bound."""
    pool = _Pool(g)
    by_start: dict[int, list[Request]] = {}
    for r in pieces:
        by_start.setdefault(r.start, []).append(r)
    leaving: dict[int, list[tuple[int, int]]] = {}
    need, ideal = [], []
    held = 0
    for t in range(horizon):
        for gpu, parts in leaving.pop(t, []):
            pool.free[gpu] += parts
            held -= parts
        for r in _order(by_start.get(t, []), policy):
            gpu = pool.place(r.parts, policy)
            leaving.setdefault(t + r.steps, []).append((gpu, r.parts))
            held += r.parts
        need.append(pool.in_use())
        ideal.append(math.ceil(held / g))
    return need, ideal


def _replay_bounded(pieces: list[Request], horizon: int, gpus: int, g: int, policy: str) -> dict[str, float]:
    """Replay onto a fixed pool; requests that do not fit wait. Sets ``placed``; returns the pool's
    means over the observed span, or longer where waiting pushed work past its end."""
    pool = _Pool(g, gpus, growable=False)
    pending = sorted(pieces, key=lambda r: (r.start, r.source), reverse=True)  # pop() takes the earliest
    waiting: list[tuple[int, int, Request]] = []  # (arrival step, order, request): oldest first
    running: dict[int, list[tuple[Request, int]]] = {}  # gpu -> [(request, placed step)]
    order = 0
    util_sum = mem_sum = 0.0
    over = steps = 0
    t = 0
    for r in pieces:
        r.placed = -1
    while True:
        # Departures first: a run that ended frees its partitions for this step's arrivals.
        for gpu, tenants in running.items():
            keep = [(r, s) for r, s in tenants if t < s + r.steps]
            for r, s in tenants:
                if t >= s + r.steps:
                    pool.free[gpu] += r.parts
            running[gpu] = keep
        if t >= horizon and not (pending or waiting or any(running.values())):
            break
        arrivals = []
        while pending and pending[-1].start <= t:
            arrivals.append(pending.pop())
        for r in _order(arrivals, policy):
            insort(waiting, (r.start, order, r), key=lambda w: (w[0], w[1]))
            order += 1
        still = []
        for item in waiting:
            r = item[2]
            gpu = pool.place(r.parts, policy)
            if gpu is None:
                still.append(item)
            else:
                r.placed = t
                running.setdefault(gpu, []).append((r, t))
        waiting = still
        busy = [sum(r.busy[t - s] for r, s in running.get(i, [])) for i in range(gpus)]
        util_sum += sum(min(b, 1.0) for b in busy) / gpus
        mem_sum += sum(g - f for f in pool.free) / (gpus * g)
        over += sum(1 for b in busy if b > 1.0 + 1e-9)
        steps += 1
        t += 1
        if t > 10_000_000:  # pragma: no cover - guards a bug, not data
            raise RuntimeError("what-if replay did not finish")
    return {
        "util": util_sum / steps if steps else 0.0,
        "mem": mem_sum / steps if steps else 0.0,
        "oversubscribed": over / (steps * gpus) if steps else 0.0,
    }


def _assumptions(
    options: PoolOptions, demand: str, step_s: int, gpu_mem: int, sampling_s: float | None
) -> tuple[str, ...]:
    if demand == "process":
        basis = (
            "per-process rows: each process's continuous run on a GPU is one request, its busy share its "
            "own sm_util (or its GPU's utilization.gpu split among such processes)"
        )
    else:
        basis = (
            "per-GPU demand (the telemetry has no process rows"
            + (", or 'gpu' was asked for" if options.demand == "gpu" else "")
            + f"): each GPU's continuous stretch holding >= {options.held_mem_bytes / GIB:g} GiB (or busy at "
            f"least {options.idle_below:.0%}) is one request, sized by the peak memory of the stretch and busy "
            "by the GPU's utilization.gpu. This assumes one tenant per GPU: what several processes on one GPU "
            "did together is replayed as one request, so a pool could do better than shown"
        )
    sampling = (
        f" Samples came every {sampling_s:.3g} s (typical): the demand of a step is the mean of the samples in it."
        if sampling_s
        else ""
    )
    return (
        "Memory is the binding constraint: a request takes its peak memory, rounded up to whole "
        f"1/{options.granularity} partitions of a pool GPU of {gpu_mem / GIB:.0f} GiB, for its whole run.",
        "Compute is shared: tenants of one GPU add their busy shares; above 1 they would slow each other "
        "(counted as oversubscribed), not fail.",
        f"Demand: {basis}; replayed in {step_s} s steps with the '{options.policy}' packing policy; "
        f"partitions never move once placed.{sampling}",
        "A request that does not fit waits and retries each step, then runs for its observed duration.",
        "Network cost of remote GPUs is not modelled: jobs are assumed to run as fast remotely.",
        f"Cost: GPUs x observed span x {options.price_per_gpu_hour:g} {options.currency} per GPU-hour.",
    )
