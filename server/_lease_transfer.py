"""Moving a running remote lease to another gpupool-server (``POST /v1/admin/leases/{id}/migrate`` with
``{"server": ...}``, ``gpupool-server lease migrate LEASE --to SERVER``): the pool's side of it.

Both servers take part. The lease's server (the source) checks the lease can move and asks the target
(``POST /v1/admin/leases/{id}/receive``, with the same admin token) to admit it: the target places each
partition on a GPU of the same model with room, records the lease as its own, active, and starts a
*receiving* worker: it knows the lease's secret (the lease's processes prove it when they reconnect) and
a one-time secret of its own, which only the source's worker learns, and waits a bounded time
(``wait_s``) for the lease's state on a port of its own; then it exits, and the target's reaper ends the
record and frees the GPUs, as for any worker that exits. The source then asks its worker to send the
lease's state there (``WorkerHandle.migrate_to_server``; ``virtualize.server._migrate_out``).

Until the target's worker holds everything, the lease runs on the source: any failure — the target
refusing, dying, the link dropping, a timeout, the source's worker refusing what cannot move — answers
``409 migration_failed`` naming why, and the source asks the target to give the admission back
(``DELETE /v1/admin/leases/{id}/receive``; should that fail too, the receiving worker's wait ends it).

Once the worker committed (the target's worker holds the lease; its processes reconnect there at their next
call), the target's admission becomes the lease (``PUT /v1/admin/leases/{id}/receive``: in cluster mode the
etcd record becomes the target's), the record here ends ``moved to SERVER`` (``Pool.moved_away``: heartbeats
here are answered with where it went, a release here is passed on), and the old worker is left to exit once
its processes have moved. An admission is no lease of the cluster until then (``Pool.receiving``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from types import SimpleNamespace

import msgspec

from server import api
from server._errors import Busy, Impossible, MigrationFailed, NotFound
from server._lease_migrate import one_move
from server._pool import Pool, human_bytes
from server.workers import START_TIMEOUT_S

log = logging.getLogger("gpupool.server")
RECEIVE_WAIT_S = 120.0  # how long a receiving worker waits for the lease's state (the copy is extra)


# -- the target: admitting a lease that moves here ---------------------------------------------------


def admit(pool: Pool, lease_id: str, req: api.ReceiveRequest, now: float) -> dict:
    """Record the moving lease as this server's, on GPUs of its models with room (database thread); the
    lease. The caller starts its receiving worker, or ends the record when that fails."""
    if pool.server_draining:
        raise Busy(f"this server ({pool.inv.hostname}) is draining: it takes no lease",
                   "move the lease to another server")  # fmt: skip
    row = pool.store.lease_row(lease_id)
    if row is not None and row["state"] == "active":
        raise Impossible(f"this server ({pool.inv.hostname}) already runs lease {lease_id}",
                         "it is being moved here, or runs here: see GET /v1/leases?all=true")  # fmt: skip
    with pool.store.transaction():
        if row is not None:  # an earlier move here that did not complete: its record goes
            pool.store.forget_ended(lease_id)
        gpus = _placed(pool, req.partitions)
        ttl = min(req.ttl_s, pool.cfg.max_ttl_s)
        placement = SimpleNamespace(gpus=gpus, mem_bytes=[p.mem_bytes for p in req.partitions])
        lease = {"id": lease_id, "client": req.client, "label": req.label, "created": now, "expires": now + ttl,
                 "max_end": None, "ttl_s": ttl, "last_active": now, "local": False, "remote": True, "pids": [],
                 "env": pool.lease_env(lease_id, placement, req.partitions[0].sm_share), "job": None}  # fmt: skip
        partitions = [{"gpu_index": g.index, "gpu_uuid": g.uuid, "mem_bytes": p.mem_bytes, "fraction": p.fraction,
                       "sm_share": p.sm_share} for g, p in zip(gpus, req.partitions, strict=True)]  # fmt: skip
        pool.store.insert_lease(lease, partitions)
        pool.receiving.add(lease_id)  # the cluster's record of the lease stays its server's
    log.info("lease %s of client %s admitted from %s on GPU(s) %s: waiting up to %.0f s for its state", lease_id,
             req.client, req.source, ",".join(str(g.index) for g in gpus), req.wait_s)  # fmt: skip
    return pool.lease(lease_id)


def _placed(pool: Pool, partitions: list[api.ReceivePartition]) -> list:
    """One GPU per partition: of its model, taking leases, with room (the most free first)."""
    used, taken = pool.used_bytes(), set()
    gpus = []
    for n, part in enumerate(partitions):
        alike = [g for g in pool.inv.gpus if (g.name, g.compute_capability or "") == (part.gpu_name,
                 part.compute_capability) and g.index not in pool.draining and g.index not in taken]  # fmt: skip
        if not alike:
            raise Impossible(f"this server ({pool.inv.hostname}) has no {part.gpu_name} (compute capability "
                             f"{part.compute_capability}) free for partition {n}: the program's kernels are for "
                             "that model", "move the lease to a server with GPUs of its model")  # fmt: skip
        best = max(alike, key=lambda g: (g.mem_total_bytes - used.get(g.index, 0), -g.index))
        free = best.mem_total_bytes - used.get(best.index, 0)
        if part.mem_bytes > free:
            raise Busy(f"this server ({pool.inv.hostname}) has {human_bytes(free)} free on a {part.gpu_name}; "
                       f"partition {n} needs {human_bytes(part.mem_bytes)}", "free room there first, or pick "
                       "another server")  # fmt: skip
        taken.add(best.index)
        gpus.append(best)
    return gpus


def commit(pool: Pool, lease_id: str) -> dict:
    """The lease's worker here holds the lease: the admission is the lease from now on (database thread)."""
    row = pool.store.lease_row(lease_id)
    if row is None or row["state"] != "active" or lease_id not in pool.receiving:
        raise NotFound(f"no lease {lease_id} is being received here", "only an admission can be committed")
    pool.receiving.discard(lease_id)
    lease = pool.lease(lease_id)
    if pool.cluster is not None:
        pool.cluster.adopt_lease(row["client"], lease_id, lease["fraction_total"])
    log.info("lease %s of client %s moved here: it runs on GPU(s) %s", lease_id, row["client"],
             ",".join(str(p["gpu_index"]) for p in lease["partitions"]))  # fmt: skip
    return lease


def moved_away(pool: Pool, lease_id: str, server: str, now: float) -> None:
    """The lease runs on `server` now (database thread): its record here ends, its heartbeats are sent there."""
    pool.moved_away[lease_id] = server
    pool.end(lease_id, "released", f"moved to {server}", now)


def give_back(pool: Pool, lease_id: str, reason: str, now: float) -> dict | None:
    """End a received lease that never arrived (database thread); None when there is no such record."""
    row = pool.store.lease_row(lease_id)
    if row is None or row["state"] != "active":
        return None
    return pool.end(lease_id, "released", reason, now)


# -- the source: sending the lease -------------------------------------------------------------------


def receive_request(pool: Pool, lease_id: str, has_worker: bool, secret: str) -> api.ReceiveRequest:
    """Check the lease can leave this server (database thread); what the target is asked to admit."""
    row = pool.store.lease_row(lease_id)
    if row is None or row["state"] != "active":
        raise NotFound(f"no active lease {lease_id} on {pool.inv.hostname}",
                       "gpupool-server's /v1/leases?all=true lists them")  # fmt: skip
    if not row["remote"]:
        raise Impossible(f"lease {lease_id} runs on its GPUs directly (not remote): its process holds the GPU state",
                         "only remote leases (gpuattach run --remote) can move")  # fmt: skip
    if not has_worker or not secret:
        raise Impossible(f"the worker of lease {lease_id} was started before this server restarted: the server "
                         "cannot ask it to move", "the lease's next run (a new lease) can be moved")  # fmt: skip
    gpus = {g.index: g for g in pool.inv.gpus}
    parts = pool.store.partitions([lease_id]).get(lease_id, [])
    now = time.time()
    return api.ReceiveRequest(
        client=row["client"], source=pool.inv.hostname, secret=secret, label=row["label"],
        ttl_s=max(1.0, min(row["ttl_s"], row["expires"] - now)) if row["expires"] else row["ttl_s"],
        partitions=[api.ReceivePartition(mem_bytes=p["mem_bytes"], gpu_name=gpus[p["gpu_index"]].name,
                                         compute_capability=gpus[p["gpu_index"]].compute_capability or "",
                                         fraction=p["fraction"], sm_share=p["sm_share"]) for p in parts],
        wait_s=RECEIVE_WAIT_S,
    )  # fmt: skip


async def migrate(st, lease_id: str, server: str, token: str) -> dict:
    """Move the lease to `server` (its URL); the lease as the target has it, with "migration", or an error
    (the lease then runs on here)."""
    with one_move(lease_id):
        return await _migrate(st, lease_id, server, token)


async def _migrate(st, lease_id: str, server: str, token: str) -> dict:
    from server.client import ServerClient, ServerClientOptions
    from server.client_errors import PoolClientError

    here = st.pool.inv.hostname
    handle = st.workers.get(lease_id)
    request = await st.db(receive_request, st.pool, lease_id, handle is not None,
                          getattr(handle, "secret", ""))  # fmt: skip
    refused = await asyncio.to_thread(handle.may_leave)
    if not refused.get("ok"):  # before the target starts a worker for it
        raise MigrationFailed(f"lease {lease_id} stays on {here}: {refused.get('error') or 'no reason given'}",
                              "the lease keeps running; see the server log")  # fmt: skip
    # The target answers once its receiving worker listens: a CUDA worker may take START_TIMEOUT_S to start.
    options = ServerClientOptions(timeout_s=START_TIMEOUT_S + 30, user_agent="gpupool-server")
    target = ServerClient(server, token, options)
    asked_first = ServerClient(
        server, token, ServerClientOptions(timeout_s=10.0, user_agent="gpupool-server")
    )
    try:
        there = (await asyncio.to_thread(asked_first.health)).server  # a dead address: seconds
        mine = st.pool.server_info()
        if (there.hostname, there.port, there.started_at) == (
            mine["hostname"],
            mine["port"],
            mine["started_at"],
        ):
            raise Impossible(
                f"{server} is this server ({here})", "to move the lease to another GPU here, give --to GPU"
            )
        receiving = await asyncio.to_thread(target.receive, lease_id, request)
    except PoolClientError as exc:
        raise MigrationFailed(f"{server} does not take lease {lease_id}: {exc.title}",
                              "the lease keeps running here; see that server's log") from None  # fmt: skip
    w = receiving.worker
    sent = await asyncio.to_thread(handle.migrate_to_server, {
        "host": w.host, "port": w.port, "migrate_port": w.migrate_port, "local": w.local, "tls_sha256": w.tls_sha256,
        "secret": receiving.migration_secret})  # fmt: skip
    if sent.get("ok"):
        return await _committed(st, lease_id, server, target, receiving, sent)
    reason = sent.get("error") or "no reason given"
    log.warning("lease %s stays on %s: %s", lease_id, here, reason)
    try:
        await asyncio.to_thread(target.give_back, lease_id)
    except PoolClientError as exc:  # its receiving worker's wait ends the admission there
        log.warning("%s did not give lease %s's admission back (%s); it ends when its worker's wait does",
                    server, lease_id, exc.title)  # fmt: skip
    raise MigrationFailed(f"lease {lease_id} stays on {here}: {reason}",
                          "the lease keeps running; see the server log")  # fmt: skip


async def _committed(st, lease_id: str, server: str, target, receiving, sent: dict) -> dict:
    """The lease's worker committed: the target's admission becomes the lease, the record here ends (its
    heartbeats told where it went), and the old worker goes once its processes have reconnected there."""
    from server.client_errors import PoolClientError

    source = [p["gpu_index"] for p in (await st.db(st.pool.lease, lease_id))["partitions"]]
    try:
        lease = await asyncio.to_thread(target.commit, lease_id)
    except PoolClientError as exc:  # the lease runs there all the same: its processes reconnect to it
        log.warning("%s did not record lease %s as its own (%s); it runs there", server, lease_id, exc.title)
        lease = None
    await st.db(moved_away, st.pool, lease_id, server, time.time())
    handle = st.workers.pop(lease_id, None)
    if handle is not None:  # it exits once every process was told: then its state directory goes
        handle.on_exit(lambda h: h.stop())
    log.info("lease %s moved to %s: %s copied, %d objects re-created, paused %.3f s", lease_id, server,
             human_bytes(sent["bytes"]), sent.get("objects", 0), sent["pause_s"])  # fmt: skip
    migration = {"device": 0, "from": source[0] if source else 0, "to": receiving.gpus[0], "bytes": sent["bytes"],
                 "pause_s": sent["pause_s"], "wait_s": sent["wait_s"], "objects": sent.get("objects", 0),
                 "stripes": sent.get("stripes", 1)}  # fmt: skip
    if lease is None:
        lease = await asyncio.to_thread(target.lease, lease_id)
    return {**msgspec.to_builtins(lease), "migration": migration}


async def release_moved(st, lease_id: str, request) -> dict:
    """A release of a lease that moved away reaches the server it runs on (with the caller's own token); the
    lease as that server answers, or as it ended here when that server does not answer."""
    from server.client import ServerClient, ServerClientOptions
    from server.client_errors import PoolClientError

    server = st.pool.moved_away[lease_id]
    token = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
    there = ServerClient(server, token, ServerClientOptions(timeout_s=10.0, user_agent="gpupool-server"))
    try:
        return msgspec.to_builtins(await asyncio.to_thread(there.release, lease_id))
    except PoolClientError as exc:
        log.warning("lease %s moved to %s, which did not release it (%s)", lease_id, server, exc.title)
        return await st.db(st.pool.lease, lease_id)
