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
