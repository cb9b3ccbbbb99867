"""Moving a running remote lease's partition to another GPU of this server (``POST
/v1/admin/leases/{lease_id}/migrate``, ``gpupool-server lease migrate``).

The pool's side of live migration: check that the lease and the target can take it, move the
partition's row to the target (so the target's room is taken before the copy, and no grant can
take it meanwhile), let the lease's worker move the GPU state (``WorkerHandle.migrate``), and put
the row back when the worker refused or failed (the lease then still runs on its source).

Draining a GPU (``POST /v1/admin/gpus/{index}/drain``, ``gpupool-server drain --gpu N``): no new lease
goes to it from then on, and each remote lease on it moves to another GPU of the same model with
room; what cannot move stays, with the reason. ``DELETE`` of the route (``--undo``) takes leases again.

Draining the whole server (``POST /v1/admin/drain``, ``gpupool-server drain [SERVER]``): it grants no
new lease from then on (admission answers busy, naming the drain, so clients take another server) and
its running leases are listed with why each stays (``gpupool-server drain --move`` then moves each remote
lease to another server, through ``server._lease_transfer``; another GPU of this server is not "off" it).
``DELETE`` (``--undo``) grants again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from server._errors import Busy, Impossible, MigrationFailed, NotFound, PoolError
from server._pool import Pool, human_bytes

log = logging.getLogger("gpupool.server")
_moving: set[str] = set()  # leases a migration is under way for (touched on the event loop only)


def plan(pool: Pool, lease_id: str, partition: int, to: int, has_worker: bool) -> dict:
    """Check the move and take the target's room (on the database thread); what `undo` needs."""
    row = pool.store.lease_row(lease_id)
    if row is None or row["state"] != "active":
        raise NotFound(
            f"no active lease {lease_id} on {pool.inv.hostname}",
            "gpupool-server's /v1/leases?all=true lists them",
        )
    if row["remote"] and not has_worker:
        raise Impossible(f"the worker of lease {lease_id} was started before this server restarted: the server "
                         "cannot ask it to move", "the lease's next run (a new lease) can be moved")  # fmt: skip
    if not row["remote"]:
        raise Impossible(f"lease {lease_id} runs on its GPUs directly (not remote): its process holds the GPU state",
                         "only remote leases (gpuattach run --remote) can move")  # fmt: skip
    parts = pool.store.partitions([lease_id]).get(lease_id, [])
    if not 0 <= partition < len(parts):
        raise Impossible(f"lease {lease_id} has {len(parts)} partition(s); there is no partition {partition}",
                         "partitions count from 0, in the lease's order")  # fmt: skip
    gpu = next((g for g in pool.inv.gpus if g.index == to), None)
    if gpu is None:
        raise Impossible(f"this server ({pool.inv.hostname}) has no GPU {to}", "GET /v1/gpus lists its GPUs")
    source = parts[partition]
    was = next((g for g in pool.inv.gpus if g.index == source["gpu_index"]), None)
    if was is not None and (was.name, was.compute_capability) != (gpu.name, gpu.compute_capability):
        raise Impossible(f"GPU {to} is a {gpu.name}, the lease's GPU {was.index} a {was.name}: the program's kernels "
                         "and what it learnt of its device are for that model", "move it to a GPU of the same model")  # fmt: skip
    held = [p["gpu_index"] for p in parts]
    if to in held:
        raise Impossible(f"GPU {to} already holds a partition of lease {lease_id}", "pick another GPU")
    order = [*held[:partition], to, *held[partition + 1 :]]
    if order != sorted(order):  # the worker numbers the lease's GPUs in this order; it must not change
        raise Impossible(f"moving partition {partition} to GPU {to} would change the order of the lease's GPUs",
                         "move it to a GPU between its neighbours' indexes")  # fmt: skip
    free = gpu.mem_total_bytes - pool.used_bytes().get(to, 0)
    if source["mem_bytes"] > free:
        raise Busy(f"GPU {to} has {human_bytes(free)} free; the partition needs {human_bytes(source['mem_bytes'])}",
                   "free room there first, or pick another GPU")  # fmt: skip
    with pool.store.transaction():
        pool.store.move_partition(lease_id, source["gpu_index"], to, gpu.uuid)
    return {"from": source["gpu_index"], "from_uuid": source["gpu_uuid"], "to": to, "to_uuid": gpu.uuid}


def undo(pool: Pool, lease_id: str, moved: dict) -> None:
    with pool.store.transaction():
        pool.store.move_partition(lease_id, moved["to"], moved["from"], moved["from_uuid"])


async def migrate(st, lease_id: str, partition: int, to: int) -> dict:
    """The whole move; the lease's answer with "migration" (the worker's report), or an error."""
    with one_move(lease_id):
        return await _migrate(st, lease_id, partition, to)


def under_way(lease_id: str) -> bool:
    """Whether a migration of the lease is under way (the reaper leaves it alone meanwhile: a worker that
    sent its lease to another server exits when it is done, which is no failure)."""
    return lease_id in _moving


@contextlib.contextmanager
def one_move(lease_id: str):
    """One migration of a lease at a time (to a GPU here or to another server): a second one's undo could
    otherwise overwrite the first's record."""
    if lease_id in _moving:
        raise Busy(f"a migration of lease {lease_id} is under way", "wait for it to answer, then ask again")
    _moving.add(lease_id)
    try:
        yield
    finally:
        _moving.discard(lease_id)


async def _migrate(st, lease_id: str, partition: int, to: int) -> dict:
    handle = st.workers.get(lease_id)
    moved = await st.db(plan, st.pool, lease_id, partition, to, handle is not None)
    answer = await asyncio.to_thread(handle.migrate, partition, to, uuid=moved["to_uuid"])
    if not answer.get("ok"):
        log.warning("lease %s stays on GPU %d: %s", lease_id, moved["from"], answer.get("error"))
        await st.db(undo, st.pool, lease_id, moved)
        raise MigrationFailed(f"lease {lease_id} stays on GPU {moved['from']}: {answer.get('error')}",
                              "the lease keeps running; see the server log")  # fmt: skip
    answer.pop("ok")
    log.info("lease %s partition %d moved from GPU %d to GPU %d: %s copied, paused %.3f s", lease_id, partition,
             moved["from"], to, human_bytes(answer["bytes"]), answer["pause_s"])  # fmt: skip
    return {**await st.db(st.pool.lease, lease_id), "migration": answer}


async def drain(st, gpu: int) -> dict:
    """Stop granting on `gpu` and move every remote lease off it; what moved and what stayed (why)."""
    if gpu not in st.pool.gpus:
        raise NotFound(
            f"this server ({st.pool.inv.hostname}) has no GPU {gpu}", "GET /v1/gpus lists its GPUs"
        )
    st.pool.draining.add(gpu)
    log.info("GPU %d draining: no new leases go to it", gpu)
    moved, stayed = [], []
    for lease in await st.db(st.pool.active_leases):
        if gpu not in lease["gpus"]:
            continue
        if not lease["remote"]:
            stayed.append({"lease": lease["id"], "reason": "a local lease: its process holds the GPU state"})
            continue
        outcome = await _move_off(st, lease["id"], lease["gpus"].index(gpu), gpu)
        (moved if "to" in outcome else stayed).append(outcome)
    return {"gpu": gpu, "draining": True, "moved": moved, "stayed": stayed}


async def _move_off(st, lease_id: str, partition: int, gpu: int) -> dict:
    """Move one lease's partition off `gpu` to the first GPU that takes it: its report, or why it stayed."""
    reason = "no other GPU of the same model takes leases"
    for target in _targets(st.pool, gpu):
        try:
            answer = await migrate(st, lease_id, partition, target)
        except (Busy, Impossible) as exc:  # this target cannot take it: the next one may
            reason = exc.title
            continue
        except PoolError as exc:  # the worker refused or failed: another target changes nothing
            return {"lease": lease_id, "reason": exc.title}
        return {"lease": lease_id, **answer["migration"]}
    return {"lease": lease_id, "reason": reason}


def _targets(pool: Pool, gpu: int) -> list[int]:
    """Other GPUs of `gpu`'s model that take leases, the most free memory first."""
    used, source = pool.used_bytes(), pool.gpus[gpu]
    alike = [g for g in pool.inv.gpus if g.index != gpu and g.index not in pool.draining
             and (g.name, g.compute_capability) == (source.name, source.compute_capability)]  # fmt: skip
    return [g.index for g in sorted(alike, key=lambda g: (used.get(g.index, 0) - g.mem_total_bytes, g.index))]


# Why a lease stays on a draining server; each ends when its program does.
STAYS_LOCAL = "a local lease: its process holds the GPU state"
STAYS_REMOTE = (
    "a remote lease with no server named to move it to (drain with --cluster or --move-to moves it)"
)


async def drain_server(st) -> dict:
    """Stop granting on this server; its running leases, each with why it stays until its program ends."""
    st.pool.server_draining = True
    log.info("server draining: no new leases")
    await _publish(st)
    leases = await st.db(st.pool.active_leases)
    stayed = [
        {"lease": lease["id"], "reason": STAYS_REMOTE if lease["remote"] else STAYS_LOCAL} for lease in leases
    ]
    return {"server": st.pool.inv.hostname, "draining": True, "stayed": stayed}


async def undrain_server(st) -> dict:
    st.pool.server_draining = False
    log.info("server takes new leases again")
    await _publish(st)
    return {"server": st.pool.inv.hostname, "draining": False, "stayed": []}


async def _publish(st) -> None:
    """Cluster mode: the member record says whether the server drains (`gpupool-server cluster members`)."""
    if st.pool.cluster is None or st.member_info is None:
        return
    try:
        await asyncio.to_thread(st.pool.cluster.update_member, st.member_info())
    except PoolError as exc:  # no quorum now: the drain holds here all the same; re-registering puts it
        log.warning("the cluster's member record does not show the drain yet: %s", exc.title)


def undrain(st, gpu: int) -> dict:
    if gpu not in st.pool.gpus:
        raise NotFound(
            f"this server ({st.pool.inv.hostname}) has no GPU {gpu}", "GET /v1/gpus lists its GPUs"
        )
    st.pool.draining.discard(gpu)
    log.info("GPU %d takes new leases again", gpu)
    return {"gpu": gpu, "draining": False, "moved": [], "stayed": []}
