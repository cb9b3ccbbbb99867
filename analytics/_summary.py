"""The fleet summary: how busy the GPUs in a scope really were.

Every figure is weighted by observed time, each sample by its weight as ``_weights`` defines it
(the time to the GPU's next sample; a gap in collection counts for one nominal interval, never for the
gap). One windowed pass over ``gpu_samples``, chunk by chunk, grouped two ways per GPU:

1. by utilization.gpu at 1/1000 resolution (and the flags held-but-idle, has-GPM, lost,
   simulated): weights, memory sums, first/last sample, gap time;
2. by SM activity at 1/1000 resolution.

Means, idle time and percentiles come from these weighted histograms. Values are taken rounded to
0.001 (0.1 %): NVML reports whole percents, so a reader loses nothing, and a histogram costs one
group-by where exact quantiles would sort every sample. The same pass bins every interval (10 ms)
for the sampling the report states: the median interval per host and the share of time in gaps.

"Idle" is utilization.gpu, rounded to 0.1 %, below ``idle_below``.

Percentiles are nearest-rank: p95 is the smallest value v such that samples at or below v cover at
least 95 % of the observed GPU time.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import duckdb

from analytics import _rollup
from analytics._scope import ALL, Scope, no_data_error
from collector.sample_columns import (
    DEFAULT_OPTIONS,
    HAS_GPM,
    HELD,
    HIST_RESOLUTION,
    LOST,
    SIMULATED,
    SummaryOptions,
    idle_bin,
)
from collector.sample_columns import (
    SAMPLE_COLUMNS as _COLUMNS,
)
from collector.weights import median_of, weighted_query

COARSE_INTERVAL_S = 10.0  # a median interval this long or longer: each sample is itself an average


@dataclass(frozen=True)
class GpuStat:
    """One GPU's share of the summary. Ratios 0-1, hours, bytes."""

    host: str
    gpu_index: int
    gpu_uuid: str
    gpu_name: str
    tick_s: float  # the GPU's median interval between samples
    gpu_hours: float
    util_gpu_mean: float | None
    sm_activity_mean: float | None
    idle_gpu_hours: float
    held_idle_gpu_hours: float
    mem_used_ratio_mean: float | None
    mem_total_bytes: int
    simulated: bool


@dataclass(frozen=True)
class HostSampling:
    """How one host's GPUs were sampled: what a reader needs to judge the figures."""

    host: str
    gpus: int
    samples: int
    median_interval_s: float | None  # median time between a GPU's consecutive samples
    observed_hours: float
    gap_hours: float  # time inside gaps (intervals over GAP_FACTOR nominal intervals), not counted

    @property
    def gap_share(self) -> float:
        """Share of the GPUs' sampled span that fell in gaps."""
        total = self.observed_hours + self.gap_hours
        return self.gap_hours / total if total else 0.0

    @property
    def coarse(self) -> bool:
        return self.median_interval_s is not None and self.median_interval_s >= COARSE_INTERVAL_S


@dataclass(frozen=True)
class Distribution:
    """Observed GPU-hours per value bin (bins of ``width``, labelled by their lower edge)."""

    metric: str
    width: float
    bins: tuple[tuple[float, float], ...]  # (lower edge ratio, GPU-hours)


@dataclass(frozen=True)
class FleetSummary:
    """How busy the GPUs in ``scope`` were. Utilization and memory are ratios 0-1, time in hours."""

    scope: Scope
    first_sample: datetime
    last_sample: datetime
    hosts: int
    gpus: int
    gpu_hours: float  # observed: the sum of the samples' weights (see _weights); gaps are not counted
    tick_s_median: float  # the median interval between consecutive samples, fleet-wide
    gap_hours: float  # GPU time inside gaps in collection (not in gpu_hours)
    util_gpu_mean: float | None  # utilization.gpu (duty cycle: any kernel running)
    util_gpu_p50: float | None
    util_gpu_p95: float | None
    gpm_gpu_hours: float  # observed hours that carry GPM SM activity (Hopper+)
    sm_activity_mean: float | None  # share of SMs with a warp resident; None without GPM data
    sm_activity_p50: float | None
    sm_activity_p95: float | None
    util_gpu_mean_where_gpm: float | None  # utilization.gpu on the same samples as sm_activity
    idle_gpu_hours: float
    held_idle_gpu_hours: float  # idle while at least options.held_mem_bytes of memory is in use
    mem_used_ratio_mean: float | None
    mem_used_ratio_peak: float | None  # the fullest any GPU got
    mem_headroom_bytes_mean: float | None  # free memory per GPU, averaged over observed time
    mem_total_bytes: int  # all GPUs' memory together
    lost_gpu_hours: float  # samples where a GPU had fallen off the bus
    simulated: bool
    simulated_share: float  # of observed GPU time
    options: SummaryOptions
    per_gpu: tuple[GpuStat, ...] = field(repr=False)
    util_distribution: Distribution = field(repr=False)
    sm_distribution: Distribution = field(repr=False)
    sampling: tuple[HostSampling, ...] = field(repr=False, default=())
    samples: int = 0
    data_source: str = "raw samples"  # which data answered: raw samples and/or rollups (analytics._rollup)

    @property
    def gap_share(self) -> float:
        total = self.gpu_hours + self.gap_hours
        return self.gap_hours / total if total else 0.0

    @property
    def coarse_hosts(self) -> tuple[HostSampling, ...]:
        """Hosts sampled every COARSE_INTERVAL_S or slower: a sample there is itself an average."""
        return tuple(h for h in self.sampling if h.coarse)

    @property
    def idle_share(self) -> float:
        return self.idle_gpu_hours / self.gpu_hours if self.gpu_hours else 0.0

    @property
    def held_idle_share(self) -> float:
        return self.held_idle_gpu_hours / self.gpu_hours if self.gpu_hours else 0.0

    @property
    def gpm_share(self) -> float:
        return self.gpm_gpu_hours / self.gpu_hours if self.gpu_hours else 0.0


_UTIL_KEYS = ("e", "ub", "flags")
_SM_KEYS = ("e", "ab")
_AGGREGATES = """
    sum(w) AS w, sum(w * mem_used_bytes) AS wmu, sum(w) FILTER (WHERE mem_used_bytes IS NOT NULL) AS wm,
    max(mem_used_bytes) AS mu_peak, max(mem_total_bytes) AS mem_total, min(t) AS first_us, max(t) AS last_us,
    sum(gap) AS gap_s
"""
# The newest index and name of each GPU. Read only from the days where GPUs last reported, so it
# touches one day of segments, not the whole range.
_NAMES = """
    SELECT hash(host, gpu_uuid), host, gpu_uuid, arg_max(gpu_index, ts) AS gpu_index,
           arg_max(gpu_name, ts) AS gpu_name
    FROM {table} WHERE {where} AND date >= ? GROUP BY host, gpu_uuid
"""


def percentile(weighted_bins: dict[int, float], p: float) -> float | None:
    """Nearest-rank percentile of a weighted histogram {bin: weight}, as a ratio."""
    total = sum(weighted_bins.values())
    if total <= 0:
        return None
    target, acc = p * total, 0.0
    for b in sorted(weighted_bins):
        acc += weighted_bins[b]
        if acc >= target - 1e-9 * total:
            return b / HIST_RESOLUTION
    return max(weighted_bins) / HIST_RESOLUTION


def _ratio(num: float | None, den: float) -> float | None:
    return None if not den or num is None else num / den


def fleet_summary(
    con: duckdb.DuckDBPyConnection, scope: Scope = ALL, options: SummaryOptions = DEFAULT_OPTIONS
) -> FleetSummary:
    """Summarise the GPUs of ``scope``; raises ``TelemetryError`` when the scope holds no samples.

    Reads rollups where they answer exactly (``_rollup.plan``: the thresholds they fixed, a range on
    their period boundaries) and raw samples after each host's rollup mark; ``data_source`` says which.
    """
    where, params = scope.where()
    plan, why = _rollup.plan(con, scope, options)
    # The raw samples after the rollups' marks: windowed once per connection where the scope allows.
    windowed, (raw_where, raw_params, extra_cols, extra_params, keep) = _rollup.raw_source(con, plan, scope)
    result = weighted_query(
        con,
        "gpu_samples",
        where + raw_where,
        [*params, *raw_params],
        (_UTIL_KEYS, _SM_KEYS),
        _AGGREGATES,
        columns=_COLUMNS + extra_cols,
        columns_params=[idle_bin(options.idle_below), options.held_mem_bytes, *extra_params],
        keep=keep,
        windowed=windowed,
    )
    rolled = _rollup.read(con, plan, where, params) if plan is not None else None
    util_rows, sm_rows = result.sets
    if not util_rows and not (rolled and rolled.gpus):
        raise no_data_error(con, scope)
    intervals = dict(result.intervals)
    for key, n in rolled.intervals.items() if rolled else ():
        intervals[key] = intervals.get(key, 0) + n
    tick = median_of(intervals.values(), [dq for _, dq in intervals])
    fleet_tick = None if tick is None else tick / 1e6
    per: dict[int, dict] = {}
    hists: dict[str, dict[int, float]] = {"util": defaultdict(float), "sm": defaultdict(float)}
    idle_under = idle_bin(options.idle_below)

    def gpu(e: int, lo: int, hi: int) -> dict:
        g = per.setdefault(
            e,
            dict.fromkeys(
                ("n", "w", "w_u", "s_u", "w_idle", "w_held", "w_ua", "s_ua", "w_lost", "w_sim"), 0.0
            )
            | {"wm": 0.0, "wmu": 0.0, "gap": 0.0, "mu_peak": 0, "mem_total": 0, "lo": lo, "hi": hi}
            | {"e": e, "host": None, "gpu_uuid": None, "gpu_index": None, "gpu_name": None},
        )
        g["lo"], g["hi"] = min(g["lo"], lo), max(g["hi"], hi)
        return g

    for e, ub, flags, fb, n, w, wmu, wm, mu_peak, mem_total, lo, hi, gap in util_rows:
        held, has_a, lost, sim = (bool(flags & bit) for bit in (HELD, HAS_GPM, LOST, SIMULATED))
        k = result.scale(fb, fleet_tick)
        w, wmu, wm = (w or 0.0) * k, (wmu or 0.0) * k, (wm or 0.0) * k
        g = gpu(e, lo, hi)
        g["n"] += n
        g["w"] += w
        g["wm"] += wm
        g["wmu"] += wmu
        g["gap"] += (gap or 0.0) if fb is None else 0.0
        g["mu_peak"] = max(g["mu_peak"], mu_peak or 0)
        g["mem_total"] = max(g["mem_total"], mem_total or 0)
        if ub is not None:
            g["w_u"] += w
            g["s_u"] += w * ub / HIST_RESOLUTION
            if ub < idle_under:
                g["w_idle"] += w
            if has_a:
                g["w_ua"] += w
                g["s_ua"] += w * ub / HIST_RESOLUTION
            hists["util"][ub] += w
        if held:
            g["w_held"] += w
        if lost:
            g["w_lost"] += w
        if sim:
            g["w_sim"] += w
    for e, ab, fb, _n, w, *_ in sm_rows:
        if ab is None:
            continue
        w = (w or 0.0) * result.scale(fb, fleet_tick)
        g = per[e]
        g["w_a"] = g.get("w_a", 0.0) + w
        g["s_a"] = g.get("s_a", 0.0) + w * ab / HIST_RESOLUTION
        hists["sm"][ab] += w
    if rolled is not None:
        _add_rolled(rolled, result.scale, fleet_tick, gpu, hists)

    # Each GPU's median interval; a GPU with none (a single sample) takes the fleet's.
    by_gpu: dict[int, dict[int, int]] = defaultdict(dict)
    for (e, dq), count in intervals.items():
        by_gpu[e][dq] = count
    for e, g in per.items():
        tick = median_of(by_gpu[e].values(), by_gpu[e].keys()) if e in by_gpu else None
        g["tick_s"] = tick / 1e6 if tick is not None else (fleet_tick or 0.0)

    # Host, UUID, newest index and name of each GPU, read from the days where GPUs last reported.
    # A day back: a segment's date is when it was written, and a sample at midnight may sit in the day before.
    # With rollups, only the raw samples after their marks are read (the rollups named the rest).
    last_day = min(datetime.fromtimestamp(g["hi"] / 1e6, UTC).date() for g in per.values()) - timedelta(
        days=1
    )
    names = con.execute(
        _NAMES.format(table=windowed or "gpu_samples", where=where + raw_where),
        [*params, *raw_params, last_day],
    ).fetchall()
    for e, host, uuid, index, name in names:
        if e in per:
            per[e].update(host=host, gpu_uuid=uuid, gpu_index=index, gpu_name=name)
    per_list = sorted(per.values(), key=lambda g: (g["host"], g["gpu_index"] or 0, g["gpu_uuid"]))

    def h(x: float) -> float:
        return x / 3600.0

    def total(key: str) -> float:
        return sum(g.get(key, 0.0) for g in per_list)

    def mem_ratio(g: dict) -> float | None:
        return g["wmu"] / g["mem_total"] / g["wm"] if g["mem_total"] and g["wm"] else None

    per_gpu = tuple(
        GpuStat(
            host=g["host"],
            gpu_index=int(g["gpu_index"] or 0),
            gpu_uuid=g["gpu_uuid"],
            gpu_name=g["gpu_name"] or "",
            tick_s=g["tick_s"],
            gpu_hours=h(g["w"]),
            util_gpu_mean=_ratio(g["s_u"], g["w_u"]),
            sm_activity_mean=_ratio(g.get("s_a"), g.get("w_a", 0.0)),
            idle_gpu_hours=h(g["w_idle"]),
            held_idle_gpu_hours=h(g["w_held"]),
            mem_used_ratio_mean=mem_ratio(g),
            mem_total_bytes=int(g["mem_total"] or 0),
            simulated=bool(g["w_sim"]),
        )
        for g in per_list
    )
    gpu_seconds = total("w")
    # Memory: a GPU's used ratio is its bytes over its size (a GPU's memory size does not change).
    m_seconds = sum(g["wm"] for g in per_list if g["mem_total"])
    mem_used = sum(g["wmu"] / g["mem_total"] for g in per_list if g["mem_total"])
    headroom = sum(g["wm"] * g["mem_total"] - g["wmu"] for g in per_list if g["mem_total"])
    return FleetSummary(
        scope=scope,
        first_sample=datetime.fromtimestamp(min(g["lo"] for g in per_list) / 1e6, UTC),
        last_sample=datetime.fromtimestamp(max(g["hi"] for g in per_list) / 1e6, UTC),
        hosts=len({g["host"] for g in per_list}),
        gpus=len(per_list),
        gpu_hours=h(gpu_seconds),
        tick_s_median=fleet_tick or 0.0,
        gap_hours=h(total("gap")),
        util_gpu_mean=_ratio(total("s_u"), total("w_u")),
        util_gpu_p50=percentile(hists["util"], 0.50),
        util_gpu_p95=percentile(hists["util"], 0.95),
        gpm_gpu_hours=h(total("w_a")),
        sm_activity_mean=_ratio(total("s_a"), total("w_a")),
        sm_activity_p50=percentile(hists["sm"], 0.50),
        sm_activity_p95=percentile(hists["sm"], 0.95),
        util_gpu_mean_where_gpm=_ratio(total("s_ua"), total("w_ua")),
        idle_gpu_hours=h(total("w_idle")),
        held_idle_gpu_hours=h(total("w_held")),
        mem_used_ratio_mean=_ratio(mem_used, m_seconds),
        mem_used_ratio_peak=max(
            (g["mu_peak"] / g["mem_total"] for g in per_list if g["mem_total"]), default=None
        ),
        mem_headroom_bytes_mean=_ratio(headroom, m_seconds),
        mem_total_bytes=sum(s.mem_total_bytes for s in per_gpu),
        lost_gpu_hours=h(total("w_lost")),
        simulated=any(s.simulated for s in per_gpu),
        simulated_share=total("w_sim") / gpu_seconds if gpu_seconds else 0.0,
        options=options,
        per_gpu=per_gpu,
        util_distribution=_coarse("util_gpu_mean", {b: h(w) for b, w in hists["util"].items()}),
        sm_distribution=_coarse("sm_activity", {b: h(w) for b, w in hists["sm"].items()}),
        sampling=_sampling(per_list, by_gpu),
        samples=int(total("n")),
        data_source=plan.describe() if plan is not None else f"raw samples ({why})",
    )


def _add_rolled(rolled, scale, fleet_tick: float | None, gpu, hists: dict[str, dict[int, float]]) -> None:
    """Add rollup rows (``_rollup.read``) to the per-GPU sums and the fleet histograms."""
    for e, fb, host, uuid, index, name, lo, hi, mu_peak, mem_total, *sums in rolled.gpus:
        v = dict(zip(("n", *_SUM_KEYS[1:]), sums, strict=True))
        k = scale(fb, fleet_tick)
        g = gpu(e, lo, hi)
        if g["host"] is None or hi >= g.get("name_at", 0):
            g.update(host=host, gpu_uuid=uuid, gpu_index=index, gpu_name=name, name_at=hi)
        g["n"] += v["n"] or 0
        for key in _SUM_KEYS[1:]:
            if key != "gap":
                g[key] = g.get(key, 0.0) + (v[key] or 0.0) * k
        g["gap"] += (v["gap"] or 0.0) if fb is None else 0.0
        g["mu_peak"] = max(g["mu_peak"], mu_peak or 0)
        g["mem_total"] = max(g["mem_total"], mem_total or 0)
    for name, rows in (("util", rolled.util_hist), ("sm", rolled.sm_hist)):
        for fb, b, w in rows:
            hists[name][b] += (w or 0.0) * scale(fb, fleet_tick)


# The rollup's sums (``_rollup.SUM_NAMES``, in that order) as the summary's per-GPU keys.
_SUM_KEYS = (
    "n",
    "w",
    "gap",
    "w_u",
    "s_u",
    "w_ua",
    "s_ua",
    "w_a",
    "s_a",
    "wm",
    "wmu",
    "w_idle",
    "w_held",
    "w_lost",
    "w_sim",
)


def _sampling(per_list: list[dict], by_gpu: dict[int, dict[int, int]]) -> tuple[HostSampling, ...]:
    hosts: dict[str, list[dict]] = defaultdict(list)
    for g in per_list:
        hosts[g["host"]].append(g)
    out = []
    for host, gs in sorted(hosts.items()):
        counts: dict[int, int] = defaultdict(int)
        for g in gs:
            for dq, c in by_gpu.get(g["e"], {}).items():
                counts[dq] += c
        med = median_of(counts.values(), counts.keys()) if counts else None
        out.append(
            HostSampling(
                host=host,
                gpus=len(gs),
                samples=int(sum(g["n"] for g in gs)),
                median_interval_s=None if med is None else med / 1e6,
                observed_hours=sum(g["w"] for g in gs) / 3600.0,
                gap_hours=sum(g["gap"] for g in gs) / 3600.0,
            )
        )
    return tuple(out)


def _coarse(metric: str, fine: dict[int, float], width: float = 0.05) -> Distribution:
    """Fine 1/1000 bins folded into ``width`` bins for a chart (the last bin includes 1.0)."""
    nbins = round(1 / width)
    out = [0.0] * nbins
    for b, h in fine.items():
        out[min(int(b / HIST_RESOLUTION / width + 1e-9), nbins - 1)] += h
    return Distribution(metric, width, tuple((i * width, h) for i, h in enumerate(out)))
