"""Who holds the GPUs: GPU-hours, memory-hours and idle-while-holding per user, process name, container.

Read from ``process_samples`` (one row per process per GPU per tick). A process's row counts for the
tick of its GPU's process rows (derived like the GPU tick, see ``_ticks``). A process is *idle while
holding* on a tick where it holds at least ``held_mem_bytes`` and is busy less than ``idle_below``:
its own busy share (``sm_util``) where NVML gave one, else its GPU's utilization.gpu in that minute.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from analytics._scope import ALL, Scope, no_data_error
from analytics._summary import DEFAULT_OPTIONS, GIB, SummaryOptions
from analytics._telemetry import TelemetryError
from analytics._ticks import filled_tick_cte, tick_cte

BY = {"user": "user", "process": "process_name", "container": "container_id"}
NONE_LABEL = {"user": "(unknown user)", "process": "(unknown)", "container": "(no container)"}


@dataclass(frozen=True)
class AttributionRow:
    """One user / process name / container. Hours are GPU-hours held (one process on one GPU for an
    hour is one), memory in GiB-hours, ratios 0-1."""

    key: str
    processes: int
    gpus: int
    gpu_hours: float
    busy_gpu_hours: float  # sum of busy share x time (sm_util; unknown counts as 0)
    memory_gib_hours: float
    mem_peak_bytes: int
    idle_holding_hours: float

    @property
    def idle_holding_share(self) -> float:
        return self.idle_holding_hours / self.gpu_hours if self.gpu_hours else 0.0


@dataclass(frozen=True)
class Attribution:
    by: str
    rows: tuple[AttributionRow, ...]  # most GPU-hours first
    simulated: bool
    options: SummaryOptions


def attribution(
    con: duckdb.DuckDBPyConnection,
    scope: Scope = ALL,
    *,
    by: str = "user",
    options: SummaryOptions = DEFAULT_OPTIONS,
) -> Attribution:
    """GPU-hours, memory-hours and idle-while-holding per ``by`` (user, process or container)."""
    if by not in BY:
        raise TelemetryError(f"unknown attribution key {by!r}", "use one of: " + ", ".join(BY))
    where, params = scope.where()
    col = BY[by]
    (unknown,) = con.execute(
        f"SELECT count(*) FROM process_samples WHERE {where} AND sm_util IS NULL", params
    ).fetchone()
    # Where NVML gave no busy share, the GPU's utilization.gpu in that minute stands in. Joined per
    # minute, not per sample: a per-sample join would hold a month of GPU samples in a hash table.
    fallback = (
        f"""LEFT JOIN (
                SELECT host, gpu_uuid, epoch_us(ts) // 60000000 AS minute, avg(util_gpu_mean) AS gpu_util
                FROM gpu_samples WHERE {where} GROUP BY ALL
            ) g ON g.host = p.host AND g.gpu_uuid = p.gpu_uuid AND g.minute = epoch_us(p.ts) // 60000000"""
        if unknown
        else ""
    )
    busy = "coalesce(p.sm_util, g.gpu_util)" if unknown else "p.sm_util"
    rows = con.execute(
        f"""
        WITH p AS NOT MATERIALIZED (SELECT * FROM process_samples WHERE {where}),
        ticks AS ({tick_cte("p", bucket_key=", pid")}),
        filled AS ({filled_tick_cte("ticks")}),
        j AS (
            SELECT p.*, filled.tick_s, {busy} AS busy
            FROM p JOIN filled ON filled.host = p.host AND filled.gpu_uuid = p.gpu_uuid {fallback}
        )
        SELECT {col} AS key,
               count(DISTINCT (host, pid)) AS processes,
               count(DISTINCT gpu_uuid) AS gpus,
               sum(tick_s) / 3600.0 AS gpu_hours,
               coalesce(sum(sm_util * tick_s), 0) / 3600.0 AS busy_gpu_hours,
               coalesce(sum(mem_used_bytes * tick_s), 0) / 3600.0 / {GIB} AS memory_gib_hours,
               coalesce(max(mem_used_bytes), 0) AS mem_peak_bytes,
               coalesce(sum(tick_s) FILTER (WHERE mem_used_bytes >= ? AND busy < ?), 0) / 3600.0 AS idle_holding_hours,
               bool_or(simulated) AS simulated
        FROM j GROUP BY key ORDER BY gpu_hours DESC, key
        """,
        [*params, *(params if unknown else []), options.held_mem_bytes, options.idle_below],
    ).fetchall()
    if not rows:
        raise no_data_error(con, scope, "process_samples")
    return Attribution(
        by,
        tuple(
            AttributionRow(key if key is not None else NONE_LABEL[by], int(n), int(g), h, b, m, int(pk), i)
            for key, n, g, h, b, m, pk, i, _ in rows
        ),
        simulated=any(r[-1] for r in rows),
        options=options,
    )
