"""After adoption: what the pool did, from the lease events ``gpupool-server`` writes (``pool_events``).

A lease event has one row per partition (GPU) of the lease, a denial one row without a GPU. A
lease's partition-hours are its memory fraction x its age at release, expiry or reclaim, so a 0.25
partition held for 4 hours counts as one GPU-hour; a lease still held counts once it ends.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from analytics._scope import ALL, Scope

ENDS = ("release", "expire", "reclaim")


@dataclass(frozen=True)
class ClientActivity:
    """One client's leases. Hours are partition GPU-hours (fraction x hours held)."""

    client: str
    leases: int
    denials: int
    reclaimed: int  # leases ended by idle reclaim
    gpu_hours: float
    reclaimed_gpu_hours: float  # GPU-hours of the leases that ended in idle reclaim


@dataclass(frozen=True)
class PoolActivity:
    """Lease counts per event and GPU-hours leased in ``scope``; empty before the pool is in use."""

    events: dict[str, int]  # leases per event kind (denials: requests)
    gpu_hours: float
    reclaimed_gpu_hours: float
    clients: tuple[ClientActivity, ...]  # most GPU-hours first
    simulated: bool

    @property
    def empty(self) -> bool:
        return not any(self.events.values())


def pool_activity(con: duckdb.DuckDBPyConnection, scope: Scope = ALL) -> PoolActivity:
    """Grants, denials, releases, expiries and reclaims, and the GPU-hours leases held."""
    where, params = scope.where()
    ends = ", ".join("?" for _ in ENDS)
    rows = con.execute(
        f"""
        SELECT coalesce(client, '(unknown)') AS client,
               count(DISTINCT lease_id) FILTER (WHERE event = 'grant') AS leases,
               count(*) FILTER (WHERE event = 'deny') AS denials,
               count(DISTINCT lease_id) FILTER (WHERE event = 'reclaim') AS reclaimed,
               coalesce(sum(fraction * duration_s) FILTER (WHERE event IN ({ends})), 0) / 3600.0 AS gpu_hours,
               coalesce(sum(fraction * duration_s) FILTER (WHERE event = 'reclaim'), 0) / 3600.0 AS reclaimed_hours,
               bool_or(simulated) AS simulated
        FROM pool_events WHERE {where}
        GROUP BY 1 ORDER BY gpu_hours DESC, client
        """,
        [*ENDS, *params],
    ).fetchall()
    counts = dict(
        con.execute(
            f"""SELECT event, CASE WHEN event = 'deny' THEN count(*) ELSE count(DISTINCT lease_id) END
                FROM pool_events WHERE {where} GROUP BY event""",
            params,
        ).fetchall()
    )
    clients = tuple(ClientActivity(c, int(n), int(d), int(r), h, rh) for c, n, d, r, h, rh, _ in rows)
    return PoolActivity(
        events={e: int(counts.get(e, 0)) for e in ("grant", "deny", *ENDS)},
        gpu_hours=sum(c.gpu_hours for c in clients),
        reclaimed_gpu_hours=sum(c.reclaimed_gpu_hours for c in clients),
        clients=clients,
        simulated=any(r[-1] for r in rows),
    )


JOB_KEYS = {"job": ("job_scheduler", "job_id", "job_account", "job_user"), "account": ("job_account",)}


@dataclass(frozen=True)
class JobUsage:
    """The leases of one batch job (``by="job"``) or one account (``by="account"``); hours as above.
    Leases taken outside a scheduler are one row with every job field None."""

    scheduler: str | None
    job_id: str | None
    account: str | None
    user: str | None
    leases: int
    denials: int
    gpu_hours: float


def pool_usage_by_job(
    con: duckdb.DuckDBPyConnection, scope: Scope = ALL, *, by: str = "job"
) -> tuple[JobUsage, ...]:
    """GPU-hours the pool's leases held per batch job or per account (the scheduler integrations fill in
    the job, e.g. deploy/slurm), most GPU-hours first. Telemetry written before leases carried a job
    has no job columns: all of it is then the one row without a job."""
    if by not in JOB_KEYS:
        raise ValueError(f"by must be one of {sorted(JOB_KEYS)}, not {by!r}")
    have = {d[0] for d in con.execute("SELECT * FROM pool_events LIMIT 0").description}
    keys = JOB_KEYS[by]
    cols = [k if k in have else f"NULL::VARCHAR AS {k}" for k in keys]
    where, params = scope.where()
    ends = ", ".join("?" for _ in ENDS)
    rows = con.execute(
        f"""
        SELECT {", ".join(keys)},
               count(DISTINCT lease_id) FILTER (WHERE event = 'grant') AS leases,
               count(*) FILTER (WHERE event = 'deny') AS denials,
               coalesce(sum(fraction * duration_s) FILTER (WHERE event IN ({ends})), 0) / 3600.0 AS gpu_hours
        FROM (SELECT {", ".join(cols)}, event, lease_id, fraction, duration_s FROM pool_events WHERE {where})
        GROUP BY ALL ORDER BY gpu_hours DESC, {", ".join(f"{k} NULLS LAST" for k in keys)}
        """,
        [*ENDS, *params],
    ).fetchall()
    out = []
    for row in rows:
        job = dict(zip(keys, row[: len(keys)], strict=True))
        leases, denials, hours = row[len(keys) :]
        out.append(JobUsage(job.get("job_scheduler"), job.get("job_id"), job.get("job_account"),
                            job.get("job_user"), int(leases), int(denials), float(hours)))  # fmt: skip
    return tuple(out)
