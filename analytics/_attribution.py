"""Who holds the GPUs: GPU-hours, memory-hours and idle-while-holding per user, process name, container.

Read from ``process_samples`` (one row per process per GPU per tick). A process's row counts for its
weight as ``_weights`` defines it, with one process on one GPU as the entity: the time to that
process's next row there, a gap (the process absent, or the collector stopped) counting one tick. A process is *idle while
holding* on a tick where it holds at least ``held_mem_bytes`` and is busy less than ``idle_below``:
its own busy share (``sm_util``) where NVML gave one, else its GPU's utilization.gpu in that minute.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from analytics._scope import ALL, Scope, no_data_error, one_row
from collector.reader import TelemetryError
from collector.sample_columns import DEFAULT_OPTIONS, GIB, SummaryOptions
from collector.weights import PROCESS_ENTITY, weighted_query

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
    (unknown,) = one_row(
        con, f"SELECT count(*) FROM process_samples WHERE {where} AND sm_util IS NULL", params
    )
    # Where NVML gave no busy share, the GPU's utilization.gpu in that minute stands in. Joined per
    # minute, not per sample (a per-sample join would hold a month of GPU samples in a hash table),
    # and computed once for all chunks.
    join, busy = "", "sm_util"
    if unknown:
        con.execute(
            "CREATE OR REPLACE TEMP TABLE _gpu_minutes AS SELECT hash(host, gpu_uuid) AS mg, "
            "epoch_us(ts) // 60000000 AS minute, avg(util_gpu_mean) AS gpu_util "
            f"FROM gpu_samples WHERE {where} GROUP BY ALL",
            params,
        )
        join = "LEFT JOIN _gpu_minutes gm ON gm.mg = wr.hg AND gm.minute = wr.t // 60000000"
        busy = "coalesce(sm_util, gm.gpu_util)"
    result = weighted_query(
        con,
        "process_samples",
        where,
        params,
        (("k", "hp", "hg"),),
        f"""sum(w) AS w, coalesce(sum(w * sm_util), 0) AS w_busy, coalesce(sum(w * mem_used_bytes), 0) AS w_mem,
            coalesce(max(mem_used_bytes), 0) AS mem_peak,
            coalesce(sum(w) FILTER (WHERE mem_used_bytes >= {int(options.held_mem_bytes)}
                                    AND {busy} < {float(options.idle_below)!r}), 0) AS w_idle,
            bool_or(simulated) AS sim""",
        columns=f"host, gpu_uuid, pid, ts, {col} AS k, hash(host, pid) AS hp, hash(host, gpu_uuid) AS hg, "
        "sm_util, mem_used_bytes, simulated",
        entity=PROCESS_ENTITY,
        join=join,
        intervals=False,
    )
    if unknown:
        con.execute("DROP TABLE IF EXISTS _gpu_minutes")
    tick = result.fleet_tick_s()
    acc: dict = {}
    for k, hp, hg, fb, _n, w, w_busy, w_mem, mem_peak, w_idle, sim in result.sets[0]:
        f = result.scale(fb, tick)
        a = acc.setdefault(k, {"p": set(), "g": set(), "v": [0.0] * 4, "peak": 0, "sim": False})
        a["p"].add(hp)
        a["g"].add(hg)
        for i, v in enumerate((w, w_busy, w_mem, w_idle)):
            a["v"][i] += (v or 0.0) * f
        a["peak"] = max(a["peak"], int(mem_peak or 0))
        a["sim"] = a["sim"] or bool(sim)
    rows = sorted(
        (
            (
                key,
                len(a["p"]),
                len(a["g"]),
                a["v"][0] / 3600,
                a["v"][1] / 3600,
                a["v"][2] / 3600 / GIB,
                a["peak"],
                a["v"][3] / 3600,
                a["sim"],
            )
            for key, a in acc.items()
        ),
        key=lambda r: (-r[3], r[0] is None, r[0] or ""),
    )
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
