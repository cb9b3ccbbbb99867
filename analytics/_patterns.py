"""When the GPUs are busy: utilization over time, the hour-of-week heatmap, busiest and idlest periods.

Means are time-weighted: each sample counts for its GPU's tick (see ``_ticks``), so a host sampled
every 10 s weighs as much per hour as one sampled every second.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import duckdb

from analytics._scope import ALL, Scope, no_data_error
from analytics._telemetry import TelemetryError
from analytics._ticks import filled_tick_cte, tick_cte

DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
LEVELS = {"fleet": "'fleet'", "host": "host", "gpu": "host || ' / GPU ' || gpu_index"}


def _with_ticks(where: str) -> str:
    # Samples of the scope joined with their GPU's tick; `s` is the relation every query reads.
    return f"""
        scoped AS NOT MATERIALIZED (SELECT * FROM gpu_samples WHERE {where}),
        ticks AS ({tick_cte("scoped")}),
        filled AS ({filled_tick_cte("ticks")}),
        s AS (SELECT scoped.*, filled.tick_s FROM scoped JOIN filled USING (host, gpu_uuid))
    """


_METRICS = """
    sum(util_gpu_mean * tick_s) / nullif(sum(tick_s) FILTER (WHERE util_gpu_mean IS NOT NULL), 0) AS util,
    sum(sm_activity * tick_s) / nullif(sum(tick_s) FILTER (WHERE sm_activity IS NOT NULL), 0) AS sm,
    sum(mem_used_bytes / nullif(mem_total_bytes, 0) * tick_s)
        / nullif(sum(tick_s) FILTER (WHERE mem_total_bytes > 0), 0) AS mem,
    sum(tick_s) / 3600.0 AS gpu_hours,
    count(DISTINCT gpu_uuid) AS gpus,
    bool_or(simulated) AS simulated
"""


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
    rows = con.execute(
        f"""WITH {_with_ticks(where)}
            SELECT (epoch_us(ts) // ?) * ? AS b, {_METRICS}
            FROM s GROUP BY b ORDER BY b""",
        [*params, bucket_s * 1_000_000, bucket_s * 1_000_000],
    ).fetchall()
    if not rows:
        raise no_data_error(con, scope)
    points = tuple(
        TimePoint(datetime.fromtimestamp(b / 1e6, UTC), u, a, m, h, int(n)) for b, u, a, m, h, n, _ in rows
    )
    return Timeline(bucket_s, points, any(r[-1] for r in rows))


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
    where, params = scope.where()
    try:
        rows = con.execute(
            f"""WITH {_with_ticks(where)}
                SELECT {LEVELS[level]} AS key, isodow(timezone(?, ts)) - 1 AS d, hour(timezone(?, ts)) AS h, {_METRICS}
                FROM s GROUP BY ALL ORDER BY key""",
            [*params, tz, tz],
        ).fetchall()
    except duckdb.Error as exc:
        if "time zone" in str(exc).lower():
            raise TelemetryError(
                f"unknown time zone {tz!r}", "use an IANA name such as Europe/Berlin"
            ) from None
        raise
    if not rows:
        raise no_data_error(con, scope)
    grids: dict[str, dict] = {}
    for key, d, h, u, a, _m, hours, _n, sim in rows:
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
