"""When the GPUs are busy: utilization over time, the hour-of-week heatmap, busiest and idlest periods.

Means are time-weighted: each sample counts for its weight as ``_weights`` defines it (the time to
its GPU's next sample, a gap counting one nominal interval), so a host sampled every 10 s weighs as much
per hour as one sampled every second, and a gap adds nothing. Each query is one windowed pass that
aggregates per GPU and group; the groups are folded together here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import duckdb

from analytics import _rollup
from analytics._scope import ALL, Scope, no_data_error, one_row
from collector.reader import TelemetryError
from collector.weights import median_of, weighted_query

DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
LEVELS = {
    "fleet": lambda host, index: "fleet",
    "host": lambda host, index: host,
    "gpu": lambda host, index: f"{host} / GPU {index}",
}
QUARTER_US = 900_000_000
HOUR_US = 3_600_000_000


def _whole_hour_zone(zone: ZoneInfo) -> bool:
    """Whether ``zone``'s offset from UTC is a whole number of hours (sampled twice a month over
    1990-2050; changes of offset then fall on whole UTC hours too), so a UTC hour is one local hour."""
    for year in range(1990, 2051):
        for month in range(1, 13):
            for day in (1, 15):
                off = datetime(year, month, day, tzinfo=UTC).astimezone(zone).utcoffset()
                if off is not None and off.total_seconds() % 3600:
                    return False
    return True


# Per GPU and group: weighted sums (``w`` is each sample's weight in seconds).
_COLUMNS = (
    "host, gpu_uuid, ts, gpu_index, util_gpu_mean, sm_activity, mem_used_bytes, mem_total_bytes, simulated"
)
_SUMS = """
    sum(w) AS w, sum(w) FILTER (WHERE util_gpu_mean IS NOT NULL) AS w_u, sum(w * util_gpu_mean) AS s_u,
    sum(w) FILTER (WHERE sm_activity IS NOT NULL) AS w_a, sum(w * sm_activity) AS s_a,
    sum(w) FILTER (WHERE mem_total_bytes > 0) AS w_m, sum(w * mem_used_bytes / nullif(mem_total_bytes, 0)) AS s_m,
    bool_or(simulated) AS sim, any_value(gpu_index) AS gpu_index
"""


def _grouped(
    con,
    scope: Scope,
    key: str,
    params: list | None = None,
    *,
    bucket_us: int | None = None,
    per: str = "gpu",
    span: list | None = None,
) -> list:
    """[(host, gpu_index, key value, w, w_u, s_u, w_a, s_a, w_m, s_m, sim, e)] per GPU and ``key``.

    A ``key`` that is ``epoch_us(ts) // bucket_us`` may be answered from rollups where they cover
    the range (``_rollup.plan``): rollup rows before each host's mark, raw samples after it. Where
    they do, a ``span`` list given gets the scope's first and last sample appended (epoch seconds,
    ``_rollup.span``'s answer) from the same read of the rollup rows.
    """
    where, wparams = scope.where()
    plan = _rollup.plan(con, scope, None, bucket_us // 1_000_000)[0] if bucket_us else None
    windowed, (raw_where, raw_params, extra_cols, extra_params, keep) = _rollup.raw_source(con, plan, scope)
    raw: dict[str, Any] = {
        "table": "gpu_samples",
        "where": where + raw_where,
        "params": [*wparams, *raw_params],
        "columns": f"{_COLUMNS}, {key} AS k{extra_cols}",
        "columns_params": [*(params or []), *extra_params],
        "keep": keep,
        "windowed": windowed,
    }
    # The interval histogram only gives the fleet tick, which only rows without a local spacing
    # (``fb``, rare) take: it is read (raw and rollups) only where some row needs it.
    result = weighted_query(con, key_sets=(("e", "k"),), aggregates=_SUMS, intervals=False, **raw)
    rolled = []
    if plan is not None and bucket_us is not None:  # a plan is made only for buckets
        rolled = _rollup.read_buckets(con, plan, where, wparams, bucket_us, per, span=span is not None)
        if span is not None:
            lo, hi = _rollup.span(con, plan, where, wparams, windowed, rollups=False)
            los = [r[-2] for r in rolled if r[-2] is not None] + ([lo] if lo is not None else [])
            his = [r[-1] for r in rolled if r[-1] is not None] + ([hi] if hi is not None else [])
            span.append((min(los, default=None), max(his, default=None)))
            rolled = [r[:-2] for r in rolled]
    intervals = result.intervals
    if plan is not None and any(r[2] is not None for rows in (result.sets[0], rolled) for r in rows):
        if not intervals:
            intervals = weighted_query(con, key_sets=(), aggregates="", **raw).intervals
        intervals = dict(intervals)
        for k, n in _rollup.read_intervals(con, plan, where, wparams).items():
            intervals[k] = intervals.get(k, 0) + n
    ticks = median_of(intervals.values(), [dq for _, dq in intervals])
    tick = None if ticks is None else ticks / 1e6
    out = []
    for e, k, fb, _n, w, w_u, s_u, w_a, s_a, w_m, s_m, sim, index in result.sets[0]:
        f = result.scale(fb, tick)
        out.append(
            (
                result.host_of[e],
                index,
                k,
                *((v or 0.0) * f for v in (w, w_u, s_u, w_a, s_a, w_m, s_m)),
                sim,
                e,
            )
        )
    for e, k, fb, host, index, w, w_u, s_u, w_a, s_a, w_m, s_m, sim in rolled:  # 100 k+ rows: kept tight
        f = 1.0 if fb is None else result.scale(fb, tick)
        out.append(
            (host, index, k, (w or 0.0) * f, (w_u or 0.0) * f, (s_u or 0.0) * f, (w_a or 0.0) * f,
             (s_a or 0.0) * f, (w_m or 0.0) * f, (s_m or 0.0) * f, sim, e)
        )  # fmt: skip
    return out


def _weighted(rows, key_of, gpus: bool = True) -> dict:
    """Fold ``_grouped`` rows into time-weighted means per key: {key: (util, sm, mem, gpu_hours, gpus, simulated)}.
    ``gpus=False`` counts no GPUs (0): the heatmap shows none, and at 512 GPUs over 90 days their
    sets are a million insertions."""
    acc: dict[Any, list[Any]] = {}
    for host, index, k, w, w_u, s_u, w_a, s_a, w_m, s_m, sim, e in rows:
        key = key_of(host, index, k)
        a = acc.get(key)
        if a is None:
            a = acc[key] = [0.0] * 7 + [set(), False]
        a[0] += w
        a[1] += w_u
        a[2] += s_u
        a[3] += w_a
        a[4] += s_a
        a[5] += w_m
        a[6] += s_m
        if gpus and isinstance(e, list):  # rollup rows of the whole fleet: the GPUs present (read_buckets)
            a[7].update(e)
        elif gpus:
            a[7].add(e)
        a[8] = a[8] or bool(sim)
    return {
        k: (
            a[2] / a[1] if a[1] else None,
            a[4] / a[3] if a[3] else None,
            a[6] / a[5] if a[5] else None,
            a[0] / 3600.0,
            len(a[7]),
            a[8],
        )
        for k, a in acc.items()
    }


@dataclass(frozen=True)
class TimePoint:
    """One time bucket of the fleet: time-weighted means (ratios 0-1) and observed GPU-hours."""

    start: datetime
    util_gpu_mean: float | None
    sm_activity_mean: float | None
    mem_used_ratio_mean: float | None
    gpu_hours: float
    gpus: int


@dataclass(frozen=True)
class Timeline:
    bucket_s: int
    points: tuple[TimePoint, ...]
    simulated: bool


def _bucket_for(con: duckdb.DuckDBPyConnection, scope: Scope, max_points: int) -> int:
    where, params = scope.where()
    plan = _rollup.plan(con, scope)[0]
    if plan is not None:  # the span from the rollups and the raw samples after them
        lo, hi = _rollup.span(con, plan, where, params, _rollup.raw_source(con, plan, scope)[0])
    else:
        lo, hi = one_row(con, f"SELECT min(epoch(ts)), max(epoch(ts)) FROM gpu_samples WHERE {where}", params)
    if lo is None or hi is None:  # both or neither: no rows
        raise no_data_error(con, scope)
    return _round_bucket(lo, hi, max_points)


def _round_bucket(lo: float, hi: float, max_points: int) -> int:
    span = max(hi - lo, 1.0)
    # Round up to a bucket a reader recognises.
    for step in (
        1,
        5,
        10,
        30,
        60,
        300,
        600,
        900,
        1800,
        3600,
        3 * 3600,
        6 * 3600,
        12 * 3600,
        86400,
        7 * 86400,
    ):
        if span / step <= max_points:
            return step
    return 30 * 86400


def utilization_timeline(
    con: duckdb.DuckDBPyConnection,
    scope: Scope = ALL,
    *,
    bucket_s: int | None = None,
    max_points: int = 400,
) -> Timeline:
    """Fleet means per time bucket (``bucket_s``, or the smallest round bucket giving <= max_points)."""
    bucket_s = bucket_s or _bucket_for(con, scope, max_points)
    rows = _grouped(
        con,
        scope,
        "epoch_us(ts) // ?",
        [bucket_s * 1_000_000],
        bucket_us=bucket_s * 1_000_000,
        per="fleet-gpus",
    )
    if not rows:
        raise no_data_error(con, scope)
    return _timeline(rows, bucket_s)


def _timeline(rows: list, bucket_s: int, fold: int = 1) -> Timeline:
    """``_grouped`` rows of buckets of ``bucket_s / fold`` as a timeline of buckets of ``bucket_s``."""
    per = _weighted(rows, lambda host, index, b: b // fold)
    points = tuple(
        TimePoint(datetime.fromtimestamp(b * bucket_s, UTC), u, a, m, h, n)
        for b, (u, a, m, h, n, _) in sorted(per.items())
    )
    return Timeline(bucket_s, points, any(v[-1] for v in per.values()))


@dataclass(frozen=True)
class HourOfWeek:
    """A 7 x 24 grid (Monday first, hours 0-23 in ``tz``) for one key of the chosen level.

    ``util[d][h]`` is the time-weighted mean utilization.gpu of that hour of the week over all weeks
    in scope, ``sm`` the same for SM activity, ``gpu_hours`` the observed time behind each cell.
    Cells with no samples are None (0.0 hours).
    """

    level: str
    key: str
    tz: str
    util: tuple[tuple[float | None, ...], ...]
    sm: tuple[tuple[float | None, ...], ...]
    gpu_hours: tuple[tuple[float, ...], ...]
    simulated: bool


def hour_of_week(
    con: duckdb.DuckDBPyConnection, scope: Scope = ALL, *, level: str = "fleet", tz: str = "UTC"
) -> list[HourOfWeek]:
    """Hour-of-week heatmaps for the fleet, each host or each GPU (``level``)."""
    if level not in LEVELS:
        raise TelemetryError(f"unknown heatmap level {level!r}", "use one of: " + ", ".join(LEVELS))
    zone = _zone(tz)
    # Hours (quarter hours in zones whose offset is not a whole number of hours) of UTC, mapped to
    # local hours of the week here: every zone's offset is a whole number of quarter hours, and
    # converting a few thousand bucket starts is cheaper than converting every sample. Whole hours
    # are read from hourly rollups where they exist.
    bucket_us = HOUR_US if _whole_hour_zone(zone) else QUARTER_US
    # The grid shows no GPU counts: rollup rows are added up per host (or fleet) in the query.
    per = {"fleet": "fleet", "host": "host"}.get(level, "gpu")
    rows = _grouped(con, scope, f"epoch_us(ts) // {bucket_us}", bucket_us=bucket_us, per=per)
    if not rows:
        raise no_data_error(con, scope)
    return _grids(rows, level, tz, zone, bucket_us)


def _zone(tz: str) -> ZoneInfo:
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise TelemetryError(f"unknown time zone {tz!r}", "use an IANA name such as Europe/Berlin") from None


def _grids(rows: list, level: str, tz: str, zone: ZoneInfo, bucket_us: int) -> list[HourOfWeek]:
    """``_grouped`` rows of UTC buckets of ``bucket_us`` folded into hour-of-week grids."""
    label = LEVELS[level]
    local: dict[int, tuple[int, int]] = {}

    def key_of(host, index, q):
        if q not in local:
            t = datetime.fromtimestamp(q * bucket_us / 1e6, UTC).astimezone(zone)
            local[q] = (t.weekday(), t.hour)
        return (label(host, index), *local[q])

    per = _weighted(rows, key_of, gpus=False)
    grids: dict[str, dict] = {}
    for (key, d, h), (u, a, _m, hours, _n, sim) in sorted(per.items()):
        g = grids.setdefault(
            key,
            {
                "util": [[None] * 24 for _ in range(7)],
                "sm": [[None] * 24 for _ in range(7)],
                "hours": [[0.0] * 24 for _ in range(7)],
                "sim": False,
            },
        )
        g["util"][d][h], g["sm"][d][h], g["hours"][d][h] = u, a, hours
        g["sim"] = g["sim"] or bool(sim)
    freeze = lambda grid: tuple(tuple(r) for r in grid)  # noqa: E731
    return [
        HourOfWeek(level, key, tz, freeze(g["util"]), freeze(g["sm"]), freeze(g["hours"]), g["sim"])
        for key, g in grids.items()
    ]


@dataclass(frozen=True)
class Period:
    start: datetime
    end: datetime
    util_gpu_mean: float | None
    sm_activity_mean: float | None
    gpus: int
    coverage: float = 1.0  # observed GPU-hours / (GPUs present x the period's length)


FULL_COVERAGE = 0.9  # a period ranks when its GPUs were observed for this share of it or more


@dataclass(frozen=True)
class Periods:
    """The ``n`` busiest and idlest buckets of ``bucket_s`` by fleet mean utilization.gpu, among the
    buckets with full coverage (``FULL_COVERAGE``: a 57-second sliver at the end of a log is not "the
    idlest hour"); ``partial`` when no bucket had it and all were ranked."""

    bucket_s: int
    busiest: tuple[Period, ...]
    idlest: tuple[Period, ...]
    simulated: bool
    partial: bool = False


def busiest_idlest(
    con: duckdb.DuckDBPyConnection, scope: Scope = ALL, *, bucket_s: int = 3600, n: int = 5
) -> Periods:
    """Busiest and idlest periods: buckets ranked by their time-weighted fleet mean, ties by time."""
    return _periods(con, scope, utilization_timeline(con, scope, bucket_s=bucket_s), n)


def _periods(con, scope: Scope, timeline: Timeline, n: int) -> Periods:
    bucket_s = timeline.bucket_s
    candidates = [p for p in timeline.points if p.util_gpu_mean is not None]
    if not candidates:
        raise no_data_error(con, scope)
    step = timedelta(seconds=bucket_s)

    def coverage(p: TimePoint) -> float:
        return p.gpu_hours * 3600 / (p.gpus * bucket_s) if p.gpus else 0.0

    full = [p for p in candidates if coverage(p) >= FULL_COVERAGE]
    partial = not full
    candidates = full or candidates

    def period(p: TimePoint) -> Period:
        return Period(p.start, p.start + step, p.util_gpu_mean, p.sm_activity_mean, p.gpus, coverage(p))

    by_util = sorted(candidates, key=lambda p: (p.util_gpu_mean, p.start))
    return Periods(
        bucket_s,
        busiest=tuple(
            period(p) for p in sorted(by_util, key=lambda p: (-(p.util_gpu_mean or 0.0), p.start))[:n]
        ),
        idlest=tuple(period(p) for p in by_util[:n]),
        simulated=timeline.simulated,
        partial=partial,
    )


@dataclass(frozen=True)
class FleetPatterns:
    """The fleet's timeline, busiest and idlest hours and hour-of-week heatmap (``fleet_patterns``)."""

    timeline: Timeline
    periods: Periods
    heatmap: list[HourOfWeek]


def fleet_patterns(
    con: duckdb.DuckDBPyConnection, scope: Scope = ALL, *, tz: str = "UTC", max_points: int = 400, n: int = 5
) -> FleetPatterns:
    """``utilization_timeline``, ``busiest_idlest`` (hours) and ``hour_of_week`` of the fleet in one
    read where they allow it: the timeline's buckets whole hours and ``tz`` a whole-hour zone. Then
    the three fold the same hourly fleet buckets (with the GPUs present in each) instead of each
    reading and adding up the rows again; otherwise they are computed one by one. Same answers."""
    zone = _zone(tz)
    if (
        _whole_hour_zone(zone)
        and _rollup.plan(con, scope, None, 3600)[0] is not None
        and (
            scope.start is None
            or scope.end is None
            or (scope.end - scope.start).total_seconds() > max_points * 1800
        )
    ):
        # From rollups, the span that picks the timeline's bucket comes with the hourly rows (a
        # read of its own binds the rollup files again: 0.4 s at 512 GPUs over 90 days). Ranges of
        # 1,800 s buckets or less (max_points of them) have their figures one by one, below.
        spans: list = []
        rows = _grouped(
            con, scope, "epoch_us(ts) // ?", [HOUR_US], bucket_us=HOUR_US, per="fleet-gpus", span=spans
        )
        lo, hi = spans[0]
        if lo is None or not rows:
            raise no_data_error(con, scope)
        bucket_s = _round_bucket(lo, hi, max_points)
        if bucket_s % 3600 == 0:
            return FleetPatterns(
                _timeline(rows, bucket_s, bucket_s // 3600),
                _periods(con, scope, _timeline(rows, 3600), n),
                _grids(rows, "fleet", tz, zone, HOUR_US),
            )
    else:
        bucket_s = _bucket_for(con, scope, max_points)
    if bucket_s % 3600 or not _whole_hour_zone(zone):
        return FleetPatterns(
            utilization_timeline(con, scope, bucket_s=bucket_s),
            busiest_idlest(con, scope, n=n),
            hour_of_week(con, scope, tz=tz),
        )
    rows = _grouped(con, scope, "epoch_us(ts) // ?", [HOUR_US], bucket_us=HOUR_US, per="fleet-gpus")
    if not rows:
        raise no_data_error(con, scope)
    return FleetPatterns(
        _timeline(rows, bucket_s, bucket_s // 3600),
        _periods(con, scope, _timeline(rows, 3600), n),
        _grids(rows, "fleet", tz, zone, HOUR_US),
    )
