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

Two replays in steps of ``step_s`` (a minute unless sampling is coarser; ``_replay`` visits only
the steps where a request arrives or leaves, so a minute over months costs no more than an hour):

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

import statistics
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import duckdb
import numpy as np

from analytics import _replay, _rollup
from analytics._gpu_models import memory_from_name
from analytics._scope import ALL, Scope, no_data_error
from analytics._summary import FleetSummary, fleet_summary
from collector.reader import TelemetryError
from collector.sample_columns import GIB

POLICIES = ("first-fit", "best-fit", "first-fit-decreasing")
DEMANDS = ("auto", "process", "gpu")
GRANULARITIES = (1, 2, 4, 5, 8, 10, 20)
_AUTO_STEPS = (60, 300, 900, 3600)
# Minutes over more than a year: the replay visits arrivals and departures, not steps, and holds
# a busy share per GPU-step in use (8 bytes), so the step only grows past a year of minutes.
MAX_STEPS = 600_000
# GPU demand is added up on a dense (GPU, step) grid of 15 bytes a cell: 512 GPUs x 90 days of
# minutes is 66 M cells; beyond this many the step grows.
MAX_CELLS = 80_000_000
DEFAULT_PRICE = 2.50  # per GPU-hour, where the user gave none (pages say it is the default)


@dataclass(frozen=True)
class PoolOptions:
    """Inputs of the what-if. Sizes in bytes, time in seconds, price per GPU-hour in ``currency``."""

    granularity: int = 20  # partitions per GPU: a request takes whole 1/granularity slices
    policy: str = "best-fit"
    demand: str = "auto"  # "process", "gpu", or "auto": process rows where the scope has them
    step_s: int | None = (
        None  # replay resolution; None: 60 s or more (>= 2 sampling intervals, <= 600,000 steps)
    )
    pool_gpus: int | None = None  # size of the pool replayed with waiting; None: the p95 need
    # Memory of one pool GPU; None: the largest GPU observed (memory.total), else inferred from the
    # GPU model's name (``_gpu_models``).
    gpu_mem_bytes: int | None = None
    held_mem_bytes: int = 1 * GIB  # demand="gpu": a GPU holding less (and idle) has no request
    idle_below: float = 0.05
    price_per_gpu_hour: float | None = None  # the user's price; None: DEFAULT_PRICE, flagged as such
    currency: str = "USD"

    @property
    def price(self) -> float:
        return DEFAULT_PRICE if self.price_per_gpu_hour is None else self.price_per_gpu_hour

    @property
    def price_is_default(self) -> bool:
        return self.price_per_gpu_hour is None

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
        if self.price_per_gpu_hour is not None and not self.price_per_gpu_hour >= 0:
            raise TelemetryError(
                f"price {self.price_per_gpu_hour} per GPU-hour out of range", "give 0 or more"
            )
        if self.gpu_mem_bytes is not None and not self.gpu_mem_bytes >= MIN_GPU_MEM:
            raise TelemetryError(
                f"GPU memory of {self.gpu_mem_bytes / GIB:g} GiB out of range",
                "give a pool GPU's memory in GiB (1 or more)",
            )


DEFAULT_POOL = PoolOptions()
MIN_GPU_MEM = GIB
MEMORY_HINT = (
    "give one pool GPU's memory: gpustat-report build --gpu-memory GIB, or the app's 'GPU memory (GiB)' field"
)


@dataclass(frozen=True)
class WhatIf:
    """The pool that would have served the observed demand. Ratios 0-1; cost in ``options.currency``."""

    options: PoolOptions
    step_s: int
    span_hours: float
    requests: int
    observed_gpus: int
    observed_util_mean: float | None  # the summary's utilization.gpu mean (time-weighted): one value per page
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
    cost_observed: float  # the GPU-hours observed (the summary's) x price: what was used
    cost_pooled: float  # pool_gpus x span x price: a pool is paid for all along
    need: tuple[int, ...] = field(repr=False)  # pool GPUs in use per step, the first at need_start
    need_start: datetime  # UTC
    assumptions: tuple[str, ...] = field(repr=False, default=())
    simulated: bool = False
    demand: str = "process"  # the demand basis used: "process" or "gpu" (options.demand may say "auto")
    sampling_s: float | None = None  # the typical interval between a GPU's samples
    observed_gpu_hours: float = 0.0  # the summary's observed GPU-hours: the cost baseline
    observed_peak_gpus: int = 0  # the most GPUs that reported in one step
    gpu_mem_bytes: int = 0  # the pool GPU's memory the replay used
    gpu_mem_from: str = "telemetry"  # where that came from: "telemetry", "given", or "model NAME"
    data_source: str = "raw samples"  # which data answered: rollups (GPU demand) and/or raw samples

    @property
    def need_over_time(self) -> tuple[tuple[datetime, int], ...]:
        """(start of the step, pool GPUs in use) per step (made on demand: 129,600 of them over 90
        days of minutes)."""
        step = timedelta(seconds=self.step_s)
        return tuple((self.need_start + t * step, n) for t, n in enumerate(self.need))

    @property
    def cost_saving(self) -> float:
        """What the pool saves against what was used; 0 where it saves nothing (``saves_nothing``)."""
        return 0.0 if self.saves_nothing else self.cost_observed - self.cost_pooled

    @property
    def saves_nothing(self) -> bool:
        """The pool needs as many GPUs as ran at once at the peak, or costs at least what was used."""
        return self.pool_gpus >= self.observed_peak_gpus or self.cost_pooled >= self.cost_observed

    @property
    def price(self) -> float:
        return self.options.price

    @property
    def gpus_saved(self) -> int:
        return self.observed_gpus - self.pool_gpus


def _auto_step(span_s: float, sampling_s: float = 0.0, gpus: int = 1) -> int:
    # At least two sampling intervals per step, so a GPU that ran through a step has a sample in it
    # (an nvidia-smi log every 57 s would otherwise leave 60 s steps empty and cut runs in pieces).
    def fits(step: float) -> bool:
        return span_s / step <= MAX_STEPS and gpus * span_s / step <= MAX_CELLS

    for step in _AUTO_STEPS:
        if fits(step) and step >= 2 * sampling_s:
            return step
    hours = 1
    while not fits(hours * 3600):
        hours += 1
    return hours * 3600


# Per GPU and step, the sums that make its mean utilization, whether memory was held and the peak
# units (``_Cut``): rows of rollups (before each host's mark) and raw samples (after it) in any
# order, added up per step in numpy (a DuckDB GROUP BY of 66 M GPU-minutes is minutes of CPU;
# adding into a dense array is seconds). ``{gpu}`` numbers the GPU, ``{units}`` and ``{held}`` read
# column ``m``: DuckDB computes them on its threads while numpy adds up the previous batch.
_GPU_ROWS_ROLLED = """
    SELECT {gpu} AS gpu, step, u, n, {held} AS held, {units} AS units, sim FROM (
        SELECT host, gpu_uuid, epoch_us(ts) // ? AS step, coalesce(util_plain_sum, 0) AS u, util_n AS n,
               coalesce(mem_used_peak, 0) AS m, coalesce(simulated_s > 0, false) AS sim
        FROM {rel}
        UNION ALL
        SELECT host, gpu_uuid, epoch_us(ts) // ?, coalesce(util_gpu_mean, 0), (util_gpu_mean IS NOT NULL)::BIGINT,
               coalesce(mem_used_bytes, 0), coalesce(simulated, false)
        FROM gpu_samples WHERE {where})
"""
# Raw samples only: grouped per step first (one row per GPU-step instead of a row per sample).
_GPU_ROWS_RAW = """
    SELECT {gpu} AS gpu, step, u, n, {held} AS held, {units} AS units, sim FROM (
        SELECT host, gpu_uuid, epoch_us(ts) // ? AS step, coalesce(sum(util_gpu_mean), 0) AS u,
               count(util_gpu_mean) AS n, coalesce(max(mem_used_bytes), 0) AS m, coalesce(bool_or(simulated), false) AS sim
        FROM gpu_samples WHERE {where} GROUP BY host, gpu_uuid, step)
"""
_GPU_STEPS = """
    SELECT host, gpu_uuid, epoch_us(ts) // ? AS step, avg(util_gpu_mean) AS util, bool_or(simulated) AS sim
    FROM gpu_samples WHERE {where} GROUP BY host, gpu_uuid, step
"""

_PROCESS_STEPS = """
    WITH gs AS ({gpu_steps}),
    ps AS (
        SELECT host, gpu_uuid, any_value(gpu_index) AS gpu_index, pid, epoch_us(ts) // ? AS step,
               max(mem_used_bytes) AS mem, avg(sm_util) AS busy, bool_or(simulated) AS sim
        FROM process_samples WHERE {where} GROUP BY host, gpu_uuid, pid, step
    ),
    unknown AS (SELECT host, gpu_uuid, step, count(*) AS n FROM ps WHERE busy IS NULL GROUP BY ALL)
    -- A run is one "host / GPU n / pid p" on consecutive steps; its number follows that name.
    SELECT dense_rank() OVER (ORDER BY ps.host || ' / GPU ' || coalesce(ps.gpu_index::VARCHAR, 'None') || ' / pid '
                              || coalesce(ps.pid::VARCHAR, 'None'), ps.gpu_uuid) AS k,
           ps.step, coalesce(ps.mem, 0), coalesce(ps.busy, gs.util / unknown.n, 0.0) AS busy, coalesce(ps.sim, false)
    FROM ps LEFT JOIN gs USING (host, gpu_uuid, step) LEFT JOIN unknown USING (host, gpu_uuid, step)
    ORDER BY k, ps.step
"""

# Rows fetched at a time: the batches in flight are the what-if's memory beside its grid (1 M rows:
# 0.55 GiB at 512 GPUs over 90 days, 250 k: 0.4 GiB, in the same time).
_STREAM_ROWS = 250_000


def _stream(con, sql: str, params: list):
    """The query's rows as numpy columns, a batch at a time (nulls as given by the query's coalesce)."""
    for batch in con.sql(sql, params=params).to_arrow_reader(_STREAM_ROWS):
        yield [c.to_numpy(zero_copy_only=False) for c in batch.columns]


@dataclass
class _Cut:
    """How a request's peak memory becomes partitions: ``units`` = its whole pool GPUs x granularity
    plus the rest rounded up to partitions (at least one). It grows with the memory, so the peak of a
    run's units is the units of its peak memory, and the pieces follow from it."""

    gpu_mem: int
    g: int

    def units(self, mem: np.ndarray) -> np.ndarray:
        whole, rest = np.divmod(mem.astype(np.int64), self.gpu_mem)
        part = np.maximum(1, np.ceil(rest / self.gpu_mem * self.g - 1e-9)).astype(np.int64)
        return whole * self.g + np.where((rest > 0) | (whole == 0), part, 0)

    def units_sql(self, m: str) -> str:
        """The same over column ``m`` in DuckDB (the same double operations, in the same order)."""
        gm, g = int(self.gpu_mem), int(self.g)
        return (
            f"({m} // {gm} * {g} + CASE WHEN {m} % {gm} > 0 OR {m} < {gm} "
            f"THEN greatest(1, ceil(({m} % {gm})::DOUBLE / {gm} * {g} - 1e-9))::BIGINT ELSE 0 END)"
        )


def _gpu_numbers(hashes: np.ndarray) -> tuple[int, np.ndarray]:
    """(shift, table): GPU i is ``table[(hash >> shift) & (len(table) - 1)]``, the 20 bits chosen so
    that no two GPUs' hashes share them (a lookup per row instead of a search)."""
    for bits in (20, 22, 24):
        mask = (1 << bits) - 1
        for shift in range(0, 64 - bits):
            slot = (hashes >> np.uint64(shift)) & np.uint64(mask)
            if len(np.unique(slot)) == len(hashes):
                table = np.full(mask + 1, -1, np.int32)
                table[slot.astype(np.int64)] = np.arange(len(hashes), dtype=np.int32)
                return shift, table
    raise RuntimeError("no distinct bits among the GPUs' hashes")  # pragma: no cover - 2^-40 odds


class _Runs:
    """Continuous runs of (key, step) rows arriving in (key, step) order, batch by batch (process
    demand): a run is one key on consecutive steps. Keeps per run its key, first step, length and
    peak units, and every step's busy share, run after run."""

    def __init__(self) -> None:
        self.key: list[np.ndarray] = []
        self.start: list[np.ndarray] = []
        self.steps: list[np.ndarray] = []
        self.units: list[np.ndarray] = []
        self.busy: list[np.ndarray] = []
        self._last: tuple[int, int] | None = None  # (key, step) of the last row seen

    def add(self, key: np.ndarray, step: np.ndarray, units: np.ndarray, busy: np.ndarray) -> None:
        if not len(key):
            return
        prev_key = np.concatenate([[-1 if self._last is None else self._last[0]], key[:-1]])
        prev_step = np.concatenate([[-2 if self._last is None else self._last[1]], step[:-1]])
        new = (key != prev_key) | (step != prev_step + 1)
        starts = np.flatnonzero(new)
        if not new[0]:  # the first rows carry on the previous batch's last run
            head = starts[0] if len(starts) else len(key)
            self.steps[-1][-1] += head
            self.units[-1][-1] = max(self.units[-1][-1], units[:head].max())
        if len(starts):
            self.key.append(key[starts])
            self.start.append(step[starts])
            self.steps.append(np.diff(np.append(starts, len(key))))
            self.units.append(np.maximum.reduceat(units, starts))
        self.busy.append(np.clip(busy, 0.0, 1.0).astype(np.float64))
        self._last = (int(key[-1]), int(step[-1]))

    def requests(self) -> tuple[np.ndarray, ...]:
        """(key, start, steps, units, busy, offset of each run's busy shares)."""

        def cat(parts, kind):
            return np.concatenate(parts).astype(kind) if parts else np.zeros(0, kind)

        steps = cat(self.steps, np.int64)
        return (
            cat(self.key, np.int64),
            cat(self.start, np.int64),
            steps,
            cat(self.units, np.int64),
            cat(self.busy, np.float64),
            np.cumsum(steps) - steps,
        )


class _Cells:
    """GPU demand on a dense (GPU, step) grid: per cell the utilization sum and count, whether
    memory was held, and the peak units; rows may come in any order and several per cell."""

    def __init__(self, gpus: int, horizon: int, first: int):
        self.horizon, self.first = horizon, first
        cells = gpus * horizon
        self.util_sum = np.zeros(cells, np.float64)
        self.util_n = np.zeros(cells, np.float32)  # exact counts up to 2^24 samples per cell
        self.held = np.zeros(cells, bool)
        self.units = np.zeros(cells, np.int16)
        self.simulated = False

    def add(self, gpu, step, u, n, held, units, sim) -> None:
        cell = gpu.astype(np.int64) * self.horizon + (step - self.first)
        np.add.at(self.util_sum, cell, u)
        np.add.at(self.util_n, cell, n.astype(np.float32))
        self.held[cell[held]] = True
        if len(units) and units.max() > np.iinfo(self.units.dtype).max:
            self.units = self.units.astype(np.int64)
        np.maximum.at(self.units, cell, units.astype(self.units.dtype))
        self.simulated = self.simulated or bool(sim.any())

    def requests(self, idle_below: float):
        """(key, start, steps, units, busy, offset) of the runs of cells in use (memory held or busy),
        the busy shares being the grid itself, and the most GPUs with samples in one step."""
        busy, n = self.util_sum, self.util_n
        np.divide(busy, n, out=busy, where=n > 0)
        observed = int((n.reshape(-1, self.horizon) > 0).sum(axis=0).max(initial=0))
        del self.util_n, n  # the grids are large: each goes as soon as it is used (this runs once)
        use = self.held
        use |= busy >= idle_below
        np.clip(busy, 0.0, 1.0, out=busy)
        grid = use.reshape(-1, self.horizon)
        before = np.zeros_like(grid)
        before[:, 1:] = grid[:, :-1]
        starts = np.flatnonzero(grid & ~before)
        before[:, :-1] = grid[:, 1:]  # now: the cell after
        before[:, -1] = False
        ends = np.flatnonzero(grid & ~before)
        del before, grid
        self.units[~use] = 0
        units = np.maximum.reduceat(self.units, starts).astype(np.int64) if len(starts) else starts
        del self.held, self.units
        return (
            starts // self.horizon,
            starts % self.horizon,
            ends - starts + 1,
            units,
            busy,
            starts,
        ), observed


def _pieces(requests: tuple[np.ndarray, ...], first: int, g: int) -> _replay.Pieces:
    """The requests as pieces of one pool GPU in arrival order (step, then source, then piece):
    whole GPUs for the units beyond a GPU, then the rest in partitions."""
    key, start, steps, units, busy, offset = requests
    whole, rest = np.divmod(units, g)
    per_request = whole + (rest > 0)
    origin = np.repeat(np.arange(len(key)), per_request)
    k = np.arange(len(origin)) - np.repeat(np.cumsum(per_request) - per_request, per_request)
    parts = np.where(k < whole[origin], g, rest[origin])
    order = np.lexsort((k, key[origin], start[origin]))
    origin = origin[order]
    return _replay.Pieces(
        start=start[origin] - first,
        steps=steps[origin],
        parts=parts[order].astype(np.int64),
        origin=origin,
        busy=busy,
        offset=offset,
    )


def what_if(
    con: duckdb.DuckDBPyConnection,
    scope: Scope = ALL,
    options: PoolOptions = DEFAULT_POOL,
    summary: FleetSummary | None = None,
) -> WhatIf:
    """Replay the demand of ``scope`` onto a partitioned pool (see the module docstring).

    The observed side (GPU-hours, the cost baseline, and utilization) is the fleet summary's, so a
    page shows one value for each: pass ``summary`` where it is at hand (``fleet_summary`` of the
    same scope), else it is computed here."""
    options.check()
    where, params = scope.where()
    demand = options.demand
    if demand == "auto":
        has_processes = con.execute(
            f"SELECT count(*) > 0 FROM (SELECT 1 FROM process_samples WHERE {where} LIMIT 1)", params
        ).fetchall()[0][0]
        demand = "process" if has_processes else "gpu"
    # GPU demand is plain per-step aggregates: rollups answer it where they cover the range (before
    # each host's mark; raw samples after it). Process demand reads process rows, which have none.
    whole = _rollup.plan(con, scope)[0] if demand == "gpu" else None
    gpus, sampling_s = _extent(con, where, params, whole)
    if not gpus:
        raise no_data_error(con, scope)
    lo, hi = min(r[3] for r in gpus), max(r[4] for r in gpus)
    mems = [r[5] for r in gpus if r[5] is not None]
    step_s = options.step_s or _auto_step((hi - lo) / 1e6, sampling_s or 0.0, len(gpus))
    step_us = step_s * 1_000_000
    first, last = lo // step_us, hi // step_us
    horizon = int(last - first + 1)
    gpu_mem, mem_from = _pool_gpu_memory(options, mems, [r[8] for r in gpus])
    cut = _Cut(gpu_mem, options.granularity)

    plan = _rollup.plan(con, scope, None, step_s)[0] if whole is not None else None
    if plan is not None:
        rel, rp = _rollup.rollup_relation(plan, where, params)
        try:
            con.execute(f"DESCRIBE SELECT util_n, util_plain_sum FROM {rel}", rp).fetchall()
        except duckdb.BinderException:  # rollups built before they held util_n: raw samples answer
            plan = None
    if demand == "gpu":
        # Each GPU's number in the order of its name ("host / GPU n"): arrivals of one step are
        # placed in that order.
        ranked = sorted(gpus, key=lambda r: (f"{r[0]} / GPU {r[6]}", r[1]))
        shift, table = _gpu_numbers(np.array([r[7] for r in ranked], np.uint64))
        cells = _Cells(len(ranked), horizon, first)
        sql = _GPU_ROWS_ROLLED if plan is not None else _GPU_ROWS_RAW
        cols = {
            "gpu": f"((hash(host, gpu_uuid) >> {shift}) & {len(table) - 1})::INTEGER",
            "held": f"m >= {int(options.held_mem_bytes)}",
            "units": cut.units_sql("m"),
        }
        if plan is not None:
            after, ap = _rollup.raw_after(plan)
            sql, sp = sql.format(rel=rel, where=where + after, **cols), [step_us, *rp, step_us, *params, *ap]
        else:
            sql, sp = sql.format(where=where, **cols), [step_us, *params]
        for gpu, *rest in _stream(con, sql, sp):
            number = table[gpu]
            if len(number) and number.min() < 0:  # pragma: no cover - the extent lists every GPU
                raise RuntimeError("what-if: a GPU's rows without its extent")
            cells.add(number, *rest)
        requests, peak_gpus = cells.requests(options.idle_below)
        simulated = cells.simulated
        del cells
    else:
        # The most GPUs reporting in a step from the GPU rows, demand from the process rows.
        peak_gpus, simulated = con.execute(
            f"""SELECT coalesce(max(n), 0), coalesce(bool_or(sim), false)
                FROM (SELECT step, count(*) AS n, bool_or(sim) AS sim FROM ({_GPU_STEPS.format(where=where)}) GROUP BY step)""",
            [step_us, *params],
        ).fetchall()[0]
        runs = _Runs()
        sql = _PROCESS_STEPS.format(gpu_steps=_GPU_STEPS.format(where=where), where=where)
        for key, step, mem, busy, sim in _stream(con, sql, [step_us, *params, step_us, *params]):
            simulated = simulated or bool(sim.any())
            runs.add(key, step, cut.units(mem), busy)
        requests = runs.requests()
        if not len(requests[0]):
            raise TelemetryError(
                f"no process rows for {scope.describe()}",
                "demand 'process' needs per-process telemetry; use demand 'gpu' (or 'auto') to replay "
                "each GPU's utilization and memory instead",
            )

    g = options.granularity
    n_requests = len(requests[0])
    pieces = _pieces(requests, 0 if demand == "gpu" else first, g)  # the grid's steps start at 0
    del requests
    need, ideal = _replay.unbounded(pieces, horizon, g, options.policy)
    p95, p99 = _replay.percentile(need, 0.95), _replay.percentile(need, 0.99)
    pool_gpus = options.pool_gpus or max(p95, 1)
    # A pool as large as the unbounded replay's peak never makes a piece wait, and more GPUs than that
    # stay empty: replay at most that many (a pool of 1e9 GPUs is then as quick as one of the peak).
    replayed = min(pool_gpus, max(int(need.max(initial=0)), 1))
    bounded = _replay.bounded(pieces, horizon, replayed, g, options.policy)

    span_hours = horizon * step_s / 3600.0
    price = options.price
    if summary is None:
        summary = fleet_summary(con, scope)
    # A request waited as long as its longest-waiting piece.
    waited = np.zeros(n_requests, np.int64)
    np.maximum.at(waited, pieces.origin, bounded.placed - pieces.start)
    waits = waited[waited > 0] * step_s
    return WhatIf(
        options=options,
        step_s=step_s,
        span_hours=span_hours,
        requests=n_requests,
        observed_gpus=len(gpus),
        observed_util_mean=summary.util_gpu_mean,
        gpus_needed_p95=p95,
        gpus_needed_p99=p99,
        gpus_needed_peak=int(need.max(initial=0)),
        gpus_needed_ideal_p95=_replay.percentile(ideal, 0.95),
        pool_gpus=pool_gpus,
        pooled_util_mean=bounded.util,
        pooled_mem_allocated_mean=bounded.mem,
        oversubscribed_share=bounded.oversubscribed,
        waited_requests=len(waits),
        waited_share=len(waits) / n_requests if n_requests else 0.0,
        wait_p95_s=float(_replay.percentile(waits, 0.95)),
        wait_max_s=float(waits.max(initial=0)),
        cost_observed=summary.gpu_hours * price,
        cost_pooled=pool_gpus * span_hours * price,
        observed_gpu_hours=summary.gpu_hours,
        observed_peak_gpus=int(peak_gpus),
        need=tuple(need.tolist()),
        need_start=datetime.fromtimestamp(first * step_s, UTC),
        assumptions=_assumptions(options, demand, step_s, gpu_mem, sampling_s, mem_from),
        simulated=simulated,
        demand=demand,
        sampling_s=sampling_s,
        gpu_mem_bytes=int(gpu_mem),
        gpu_mem_from=mem_from,
        data_source=plan.describe() if plan is not None and demand == "gpu" else "raw samples",
    )


def _extent(con, where: str, params: list, plan) -> tuple[list[tuple], float | None]:
    """Per GPU (host, uuid, samples, first and last sample in µs, memory, latest index, the hash the
    demand rows carry, latest name), and the typical spacing of a GPU's samples in s.

    The spacing chooses the step (it is not a weight: nothing here is weighted per sample; demand is
    averaged per step): the median over GPUs of their span over their samples less one.
    """
    per_gpu = (
        f"SELECT host, gpu_uuid, count(*) AS n, min(epoch_us(ts)) AS lo, max(epoch_us(ts)) AS hi, "
        f"max(mem_total_bytes) AS mem, arg_max(gpu_index, ts) AS idx, arg_max(gpu_name, ts) AS name "
        f"FROM gpu_samples WHERE {where}{{after}} GROUP BY host, gpu_uuid"
    )
    if plan is None:
        rows = con.execute(
            f"SELECT * EXCLUDE (name), hash(host, gpu_uuid), name FROM ({per_gpu.format(after='')})", params
        ).fetchall()
    else:
        rel, rp = _rollup.rollup_relation(plan, where, params)
        after, ap = _rollup.raw_after(plan)
        rows = con.execute(
            f"""SELECT host, gpu_uuid, sum(n), min(lo), max(hi), max(mem), arg_max(idx, hi), hash(host, gpu_uuid),
                       arg_max(name, hi)
                FROM (
                    SELECT host, gpu_uuid, sum(samples) AS n, epoch_us(min(first_ts)) AS lo,
                           epoch_us(max(last_ts)) AS hi, max(mem_total) AS mem, arg_max(gpu_index, last_ts) AS idx,
                           arg_max(gpu_name, last_ts) AS name
                    FROM {rel} GROUP BY host, gpu_uuid
                    UNION ALL {per_gpu.format(after=after)}) GROUP BY host, gpu_uuid""",
            [*rp, *params, *ap],
        ).fetchall()
    spacing = [(r[4] - r[3]) / (r[2] - 1) for r in rows if r[2] > 1]
    return rows, statistics.median(spacing) / 1e6 if spacing else None


def _pool_gpu_memory(options: PoolOptions, mems: list[int], names: list[str | None]) -> tuple[int, str]:
    """(one pool GPU's memory in bytes, where it came from): given, the largest memory.total in the
    telemetry, else the largest the GPU models' names imply (``_gpu_models``)."""
    if options.gpu_mem_bytes:
        return options.gpu_mem_bytes, "given"
    if mems and max(mems) > 0:
        return max(mems), "telemetry"
    inferred = sorted(
        ((m, n) for n in set(names) if (m := memory_from_name(n)) is not None),
        key=lambda mn: (mn[0], mn[1] or ""),
    )
    if inferred:
        return inferred[-1][0], f"model {inferred[-1][1]}"
    known = ", ".join(sorted({n for n in names if n})[:3]) or "none"
    raise TelemetryError(
        f"no GPU memory size in the telemetry (no memory.total; GPU models: {known})", MEMORY_HINT
    )


def memory_source(mem_from: str) -> str:
    """Where the pool GPU's memory came from, in words."""
    if mem_from.startswith("model "):
        return f"inferred from the GPU model name {mem_from.removeprefix('model ')!r}: the log has no memory.total"
    return "as given" if mem_from == "given" else "memory.total in the telemetry"


def _assumptions(
    options: PoolOptions, demand: str, step_s: int, gpu_mem: int, sampling_s: float | None, mem_from: str
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
        f"1/{options.granularity} partitions of a pool GPU of {gpu_mem / GIB:.0f} GiB "
        f"({memory_source(mem_from)}), for its whole run.",
        "Compute is shared: tenants of one GPU add their busy shares; above 1 they would slow each other "
        "(counted as oversubscribed), not fail.",
        f"Demand: {basis}; replayed in {step_s} s steps with the '{options.policy}' packing policy; "
        f"partitions never move once placed.{sampling}",
        "A request that does not fit waits and retries each step, then runs for its observed duration.",
        "Network cost of remote GPUs is not modelled: jobs are assumed to run as fast remotely.",
        f"Cost: the GPU-hours observed (what was used) against the pool's GPUs over the whole span (a pool "
        f"is paid for all along), at {options.price:,.2f} {options.currency} per GPU-hour"
        + (" (the default: set --price)." if options.price_is_default else " (your price)."),
    )
