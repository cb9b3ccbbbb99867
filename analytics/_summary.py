"""The fleet summary: how busy the GPUs in a scope really were.

Two passes over ``gpu_samples``, both streaming aggregates (nothing is loaded whole):

1. per GPU and hour bucket: sample counts and first/last time, which give each GPU's tick (see
   ``_ticks``), memory sums, and the few quantities that need two columns of a row together (held
   but idle; utilization.gpu on the samples that carry SM activity).
2. per GPU: histograms of utilization.gpu and SM activity at 1/1000 resolution. Their means, idle
   counts and percentiles come from these (weighted by each GPU's tick). Values are taken rounded
   to 0.001 (0.1 %): NVML reports whole percents, so a reader loses nothing, and a histogram costs
   one group-by where exact quantiles would sort every sample.

Every aggregate is an update per row, so the passes carry only what they must: on one month of 64
GPUs at 1 Hz that is the difference between seconds and minutes (bench/bench_analytics.py).

"Idle" is utilization.gpu, rounded to 0.1 %, below ``idle_below``.

Percentiles are nearest-rank: p95 is the smallest value v such that samples at or below v cover at
least 95 % of the observed GPU time.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import duckdb

from analytics._scope import ALL, Scope, no_data_error
from analytics._ticks import BUCKET_US, GPU_HASH, filled_tick_cte, unhash

HIST_RESOLUTION = 1000  # bins per unit ratio: 0.001 steps
GIB = 1 << 30


@dataclass(frozen=True)
class SummaryOptions:
    """Thresholds that decide what counts as idle. Ratios 0-1, bytes."""

    idle_below: float = 0.05  # utilization.gpu under this is idle
    held_mem_bytes: int = 1 * GIB  # an idle GPU with at least this much memory in use is "held but idle"


DEFAULT_OPTIONS = SummaryOptions()


@dataclass(frozen=True)
class GpuStat:
    """One GPU's share of the summary. Ratios 0-1, hours, bytes."""

    host: str
    gpu_index: int
    gpu_uuid: str
    gpu_name: str
    tick_s: float
    gpu_hours: float
    util_gpu_mean: float | None
    sm_activity_mean: float | None
    idle_gpu_hours: float
    held_idle_gpu_hours: float
    mem_used_ratio_mean: float | None
    mem_total_bytes: int
    simulated: bool


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
    gpu_hours: float  # observed: samples x each GPU's tick, so collection gaps are not counted
    tick_s_median: float
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

    @property
    def idle_share(self) -> float:
        return self.idle_gpu_hours / self.gpu_hours if self.gpu_hours else 0.0

    @property
    def held_idle_share(self) -> float:
        return self.held_idle_gpu_hours / self.gpu_hours if self.gpu_hours else 0.0

    @property
    def gpm_share(self) -> float:
        return self.gpm_gpu_hours / self.gpu_hours if self.gpu_hours else 0.0


def _buckets_sql(where: str) -> str:
    # Only what the histograms cannot give: the tick (count, first, last per hour bucket) and the
    # quantities that need two columns of one row at once. Aggregates are the cost here (each one is
    # an update per row), so everything a histogram gives is taken from the histograms.
    return f"""
        SELECT host, gpu_uuid, epoch_us(ts) // {BUCKET_US} AS bucket,
               count(*) AS n, min(epoch_us(ts)) AS lo, max(epoch_us(ts)) AS hi,
               sum((util_gpu_mean < ? AND mem_used_bytes >= ?)::INTEGER) AS n_held,
               sum(util_gpu_mean) FILTER (WHERE sm_activity IS NOT NULL) AS s_u_a,
               count(util_gpu_mean) FILTER (WHERE sm_activity IS NOT NULL) AS n_u_a,
               sum((state = 'lost')::INTEGER) AS n_lost,
               sum(simulated::INTEGER) AS n_sim,
               max(mem_total_bytes) AS mem_total,
               count(mem_used_bytes) AS n_m, sum(mem_used_bytes) AS s_mu, max(mem_used_bytes) AS mu_peak
        FROM gpu_samples WHERE {where}
        GROUP BY ALL
    """


_PER_GPU = f"""
    ticks AS (
        SELECT host, gpu_uuid,
               coalesce(median((hi - lo) / (n - 1)) FILTER (WHERE n > 1),
                        (max(hi) - min(lo)) / nullif(sum(n) - 1, 0)) / 1e6 AS tick_s
        FROM b GROUP BY ALL
    ),
    filled AS ({filled_tick_cte("ticks")}),
    g AS (
        SELECT host, gpu_uuid, max(mem_total) AS mem_total, sum(n) AS n, sum(n_held) AS n_held,
               sum(s_u_a) AS s_u_a, sum(n_u_a) AS n_u_a, sum(n_lost) AS n_lost, sum(n_sim) AS n_sim,
               sum(n_m) AS n_m, sum(s_mu) AS s_mu, max(mu_peak) AS mu_peak,
               min(lo) AS first_us, max(hi) AS last_us
        FROM b GROUP BY ALL
    )
    SELECT g.*, filled.tick_s FROM g JOIN filled USING (host, gpu_uuid)
"""

# The newest index and name of each GPU. Read only from the days where GPUs last reported, so it
# touches one day of segments, not the whole range.
_NAMES = """
    SELECT host, gpu_uuid, arg_max(gpu_index, ts) AS gpu_index, arg_max(gpu_name, ts) AS gpu_name
    FROM gpu_samples WHERE {where} AND date >= ? GROUP BY ALL
"""

# Keyed by hash(host, gpu_uuid): one integer instead of two strings per row in the hash table
# (a quarter less CPU on a month of samples); ``unhash`` maps the hashes back.
_HISTOGRAMS = """
    SELECT gpu, GROUPING(ub, ab) AS which, coalesce(ub, ab) AS bin, count(*) AS n
    FROM (
        SELECT {gpu_hash} AS gpu, round(util_gpu_mean * ?)::INTEGER AS ub,
               round(sm_activity * ?)::INTEGER AS ab
        FROM gpu_samples WHERE {where}
    )
    GROUP BY GROUPING SETS ((gpu, ub), (gpu, ab))
    HAVING coalesce(ub, ab) IS NOT NULL
"""

# GROUPING(ub, ab) is a bitmask of the columns *not* grouped: 0b01 -> grouped by ub, 0b10 -> by ab.
_WHICH = {0b01: "util", 0b10: "sm"}


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
    """Summarise the GPUs of ``scope``; raises ``TelemetryError`` when the scope holds no samples."""
    where, params = scope.where()
    rows = con.execute(
        f"WITH b AS ({_buckets_sql(where)}), {_PER_GPU}",
        [options.idle_below, options.held_mem_bytes, *params],
    ).fetchall()
    if not rows:
        raise no_data_error(con, scope)
    cols = [d[0] for d in con.description]
    per = {(r[0], r[1]): dict(zip(cols, r, strict=True)) for r in rows}
    # A day back: a segment's date is when it was written, and a sample at midnight may sit in the day before.
    last_day = min(datetime.fromtimestamp(g["last_us"] / 1e6, UTC).date() for g in per.values()) - timedelta(
        days=1
    )
    for host, uuid, index, name in con.execute(_NAMES.format(where=where), [*params, last_day]).fetchall():
        per[(host, uuid)].update(gpu_index=index, gpu_name=name)

    # Per GPU: bin -> samples, for each metric. Means, idle counts and percentiles all come from these.
    bins: dict[tuple, dict[str, dict[int, int]]] = {k: {"util": {}, "sm": {}} for k in per}
    by_hash = unhash(con, per)
    hist_rows = con.execute(
        _HISTOGRAMS.format(where=where, gpu_hash=GPU_HASH), [HIST_RESOLUTION] * 2 + params
    ).fetchall()
    for gpu, which, b, n in hist_rows:
        bins[by_hash[gpu]][_WHICH[which]][b] = n
    idle_bin = options.idle_below * HIST_RESOLUTION
    for key, g in per.items():
        h = bins[key]
        g["n_u"], g["s_u"] = (
            sum(h["util"].values()),
            sum(b * n for b, n in h["util"].items()) / HIST_RESOLUTION,
        )
        g["n_idle"] = sum(n for b, n in h["util"].items() if b < idle_bin - 1e-9)
        g["n_a"], g["s_a"] = sum(h["sm"].values()), sum(b * n for b, n in h["sm"].items()) / HIST_RESOLUTION
        # A GPU's memory size does not change, so its used ratio is its bytes over its size.
        total = g["mem_total"] or 0
        g["s_m"] = g["s_mu"] / total if total else None
        g["s_head"] = (g["n_m"] * total - g["s_mu"]) if total else None

    hists: dict[str, dict[int, float]] = {
        "util": defaultdict(float),
        "sm": defaultdict(float),
    }
    for key, h in bins.items():
        for metric, counts in h.items():
            for b, n in counts.items():
                hists[metric][b] += n * per[key]["tick_s"] / 3600.0

    per_list = sorted(per.values(), key=lambda g: (g["host"], g.get("gpu_index") or 0))

    def hours(g: dict, key: str) -> float:
        return (g[key] or 0) * g["tick_s"] / 3600.0

    def wsum(key: str) -> float:
        return sum(hours(g, key) for g in per_list)

    gpu_hours = wsum("n")
    u_hours, a_hours, m_hours, ua_hours = wsum("n_u"), wsum("n_a"), wsum("n_m"), wsum("n_u_a")
    per_gpu = tuple(
        GpuStat(
            host=g["host"],
            gpu_index=int(g.get("gpu_index") or 0),
            gpu_uuid=g["gpu_uuid"],
            gpu_name=g.get("gpu_name") or "",
            tick_s=g["tick_s"],
            gpu_hours=hours(g, "n"),
            util_gpu_mean=_ratio(g["s_u"], g["n_u"]),
            sm_activity_mean=_ratio(g["s_a"], g["n_a"]),
            idle_gpu_hours=hours(g, "n_idle"),
            held_idle_gpu_hours=hours(g, "n_held"),
            mem_used_ratio_mean=_ratio(g["s_m"], g["n_m"]),
            mem_total_bytes=int(g["mem_total"] or 0),
            simulated=bool(g["n_sim"]),
        )
        for g in per_list
    )
    ticks = sorted(g["tick_s"] for g in per_list)
    return FleetSummary(
        scope=scope,
        first_sample=datetime.fromtimestamp(min(g["first_us"] for g in per_list) / 1e6, UTC),
        last_sample=datetime.fromtimestamp(max(g["last_us"] for g in per_list) / 1e6, UTC),
        hosts=len({g["host"] for g in per_list}),
        gpus=len(per_list),
        gpu_hours=gpu_hours,
        tick_s_median=ticks[len(ticks) // 2],
        util_gpu_mean=_ratio(sum(hours(g, "s_u") for g in per_list), u_hours),
        util_gpu_p50=percentile(hists["util"], 0.50),
        util_gpu_p95=percentile(hists["util"], 0.95),
        gpm_gpu_hours=a_hours,
        sm_activity_mean=_ratio(sum(hours(g, "s_a") for g in per_list), a_hours),
        sm_activity_p50=percentile(hists["sm"], 0.50),
        sm_activity_p95=percentile(hists["sm"], 0.95),
        util_gpu_mean_where_gpm=_ratio(sum(hours(g, "s_u_a") for g in per_list), ua_hours),
        idle_gpu_hours=wsum("n_idle"),
        held_idle_gpu_hours=wsum("n_held"),
        mem_used_ratio_mean=_ratio(sum(hours(g, "s_m") for g in per_list), m_hours),
        mem_used_ratio_peak=max(
            (g["mu_peak"] / g["mem_total"] for g in per_list if g["mem_total"]), default=None
        ),
        mem_headroom_bytes_mean=_ratio(sum(hours(g, "s_head") for g in per_list), m_hours),
        mem_total_bytes=sum(s.mem_total_bytes for s in per_gpu),
        lost_gpu_hours=wsum("n_lost"),
        simulated=any(s.simulated for s in per_gpu),
        simulated_share=wsum("n_sim") / gpu_hours if gpu_hours else 0.0,
        options=options,
        per_gpu=per_gpu,
        util_distribution=_coarse("util_gpu_mean", hists["util"]),
        sm_distribution=_coarse("sm_activity", hists["sm"]),
    )


def _coarse(metric: str, fine: dict[int, float], width: float = 0.05) -> Distribution:
    """Fine 1/1000 bins folded into ``width`` bins for a chart (the last bin includes 1.0)."""
    nbins = round(1 / width)
    out = [0.0] * nbins
    for b, h in fine.items():
        out[min(int(b / HIST_RESOLUTION / width + 1e-9), nbins - 1)] += h
    return Distribution(metric, width, tuple((i * width, h) for i, h in enumerate(out)))
