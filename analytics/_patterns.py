"""When the GPUs are busy: utilization over time, the hour-of-week heatmap, busiest and idlest periods.

Means are time-weighted: each sample counts for its GPU's tick (see ``_ticks``), so a host sampled
every 10 s weighs as much per hour as one sampled every second. Each query aggregates per GPU and
group in one streaming pass and applies the ticks to those few rows afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import duckdb

from analytics._scope import ALL, Scope, no_data_error
from analytics._telemetry import TelemetryError
from analytics._ticks import GPU_HASH, gpu_ticks, unhash

DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
LEVELS = {
    "fleet": lambda host, index: "fleet",
    "host": lambda host, index: host,
    "gpu": lambda host, index: f"{host} / GPU {index}",
}
QUARTER_US = 900_000_000


# Per GPU and group: sample counts and sums. Weighting by each GPU's tick happens afterwards, on
# these few rows, in ``_weighted``.
_SUMS = """
    count(*) AS n,
    count(util_gpu_mean) AS n_u, sum(util_gpu_mean) AS s_u,
    count(sm_activity) AS n_a, sum(sm_activity) AS s_a,
    count(*) FILTER (WHERE mem_total_bytes > 0) AS n_m, sum(mem_used_bytes / nullif(mem_total_bytes, 0)) AS s_m,
    sum(simulated::INTEGER) AS n_sim
"""


def _unhashed(con, ticks: dict, rows: list) -> list:
    """Rows grouped by GPU_HASH, with (host, gpu_uuid) back in front."""
    names = unhash(con, ticks)
    return [(*names[r[0]], *r[1:]) for r in rows]


def _weighted(rows, ticks: dict, key_of) -> dict:
    """Fold (host, gpu_uuid, *key, n, n_u, s_u, n_a, s_a, n_m, s_m, n_sim) rows into time-weighted
    means per key: {key: (util, sm, mem, gpu_hours, gpus, simulated)}."""
    acc: dict = {}
    for host, uuid, *rest in rows:
        *key, n, n_u, s_u, n_a, s_a, n_m, s_m, n_sim = rest
        w = ticks.get((host, uuid), 0.0)
        a = acc.setdefault(key_of(host, uuid, *key), [0.0] * 7 + [set(), False])
        for i, v in enumerate((n, n_u, s_u or 0, n_a, s_a or 0, n_m, s_m or 0)):
            a[i] += v * w
        a[7].add((host, uuid))
        a[8] = a[8] or bool(n_sim)
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
    lo, hi = con.execute(
        f"SELECT min(epoch(ts)), max(epoch(ts)) FROM gpu_samples WHERE {where}", params
    ).fetchone()
    if lo is None:
        raise no_data_error(con, scope)
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
    where, params = scope.where()
    ticks = gpu_ticks(con, where, params)
    rows = con.execute(
        f"SELECT {GPU_HASH} AS gpu, epoch_us(ts) // ? AS b, {_SUMS} FROM gpu_samples WHERE {where} GROUP BY ALL",
        [bucket_s * 1_000_000, *params],
    ).fetchall()
    rows = _unhashed(con, ticks, rows)
    if not rows:
        raise no_data_error(con, scope)
    per = _weighted(rows, ticks, lambda host, uuid, b: b)
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
    try:
        zone = ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise TelemetryError(f"unknown time zone {tz!r}", "use an IANA name such as Europe/Berlin") from None
    where, params = scope.where()
    ticks = gpu_ticks(con, where, params)
    # Quarter hours of UTC, mapped to local hours of the week here: every zone's offset is a whole
    # number of quarter hours, and converting a few thousand bucket starts is cheaper than
    # converting every sample.
    rows = con.execute(
        f"SELECT {GPU_HASH} AS gpu, any_value(gpu_index) AS gpu_index, epoch_us(ts) // {QUARTER_US} AS q, "
        f"{_SUMS} FROM gpu_samples WHERE {where} GROUP BY gpu, q",
        params,
    ).fetchall()
    rows = _unhashed(con, ticks, rows)
    if not rows:
        raise no_data_error(con, scope)
    label = LEVELS[level]
    local: dict[int, tuple[int, int]] = {}

    def key_of(host, uuid, index, q):
        if q not in local:
            t = datetime.fromtimestamp(q * QUARTER_US / 1e6, UTC).astimezone(zone)
            local[q] = (t.weekday(), t.hour)
        return (label(host, index), *local[q])

    per = _weighted(rows, ticks, key_of)
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


@dataclass(frozen=True)
class Periods:
    """The ``n`` busiest and idlest buckets of ``bucket_s`` by fleet mean utilization.gpu."""

    bucket_s: int
    busiest: tuple[Period, ...]
    idlest: tuple[Period, ...]
    simulated: bool


def busiest_idlest(
    con: duckdb.DuckDBPyConnection, scope: Scope = ALL, *, bucket_s: int = 3600, n: int = 5
) -> Periods:
    """Busiest and idlest periods: buckets ranked by their time-weighted fleet mean, ties by time."""
    timeline = utilization_timeline(con, scope, bucket_s=bucket_s)
    candidates = [p for p in timeline.points if p.util_gpu_mean is not None]
    if not candidates:
        raise no_data_error(con, scope)
    step = timedelta(seconds=bucket_s)

    def period(p: TimePoint) -> Period:
        return Period(p.start, p.start + step, p.util_gpu_mean, p.sm_activity_mean, p.gpus)

    by_util = sorted(candidates, key=lambda p: (p.util_gpu_mean, p.start))
    return Periods(
        bucket_s,
        busiest=tuple(period(p) for p in sorted(by_util, key=lambda p: (-p.util_gpu_mean, p.start))[:n]),
        idlest=tuple(period(p) for p in by_util[:n]),
        simulated=timeline.simulated,
    )
