"""The HTTP/JSON API (aiohttp) around ``Pool``, and the server's background loops.

Threads: the event loop serves HTTP; every store access runs on one dedicated database thread (so
transactions never interleave and a slow fsync never stalls the loop); process probes, worker
start/stop and NVML sampling run on the default thread pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import resources

from aiohttp import web

from collector.durations import format_duration
from server import _lease_migrate, _lease_transfer, api
from server._errors import BadRequest, Forbidden, NotFound, PoolError, RemoteUnavailable, StorageFull
from server._pool import Caller, Pool, iso
from server._procs import alive_pids, terminate
from server.api import (
    ClientUpdate,
    Heartbeat,
    LeaseRequest,
    MigrateRequest,
    PolicyUpdate,
    ReceiveRequest,
    TokenCreate,
    decode,
)
from server.workers import remote_refusal, start_remote_worker

log = logging.getLogger("gpupool.server")
LEASE_ID = re.compile(r"lease-[0-9a-f]{4,64}")

POOL = web.AppKey("pool", Pool)
STATE = web.AppKey("state", object)


class ServerState:
    """What the loops share: the database thread, the probe, live worker handles."""

    def __init__(self, pool: Pool, probe, bind_host: str, reap_interval_s: float):
        self.pool = pool
        self.probe = probe
        self.bind_host = bind_host
        self.reap_interval_s = reap_interval_s
        self.db_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpupool-db")
        self.workers: dict[str, object] = {}  # lease id -> WorkerHandle
        self.member_info = None  # cluster mode: () -> this server's member record (server._serve)
        self.stopping = threading.Event()
        self.last_purge = float("-inf")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reap_soon: asyncio.Event | None = None

    def wake_reaper(self, *_) -> None:
        """From any thread: sweep the leases now (a worker exited), not at the next interval."""
        if self._loop is not None and self._reap_soon is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: the server is stopping
                self._loop.call_soon_threadsafe(self._reap_soon.set)

    async def reap_pause(self) -> None:
        """Wait for the next sweep: the reap interval, or less when a worker exits."""
        if self._reap_soon is None:
            self._loop, self._reap_soon = asyncio.get_running_loop(), asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._reap_soon.wait(), self.reap_interval_s)
        self._reap_soon.clear()

    async def db(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.db_thread, fn, *args)


def _json(kind: type, data, status: int = 200) -> web.Response:
    """An answer encoded through its struct in ``server.api`` (the one declaration of its fields)."""
    return web.Response(body=api.answer(kind, data), status=status, content_type="application/json")


def _documented_queries() -> dict[tuple[str, str], frozenset[str]]:
    """(METHOD, path template) -> the query parameters /openapi.json documents for it."""
    document = json.loads(resources.files("server").joinpath("openapi.json").read_bytes())
    return {
        (method.upper(), path): frozenset(
            p["name"]
            for p in [*ops.get("parameters", []), *op.get("parameters", [])]
            if p.get("in") == "query"
        )
        for path, ops in document["paths"].items()
        for method, op in ops.items()
        if isinstance(op, dict)
    }


QUERIES = _documented_queries()


def _check_query(request: web.Request) -> None:
    """A query parameter the route does not take is refused, not ignored (?al=true is a typo)."""
    if not request.query:
        return
    route = request.match_info.route.resource
    allowed = QUERIES.get((request.method, route.canonical)) if route is not None else None
    unknown = sorted(set(request.query) - (allowed or frozenset()))
    if allowed is not None and unknown:
        raise BadRequest(
            f"unknown query parameter {unknown[0]!r} for {request.method} {route.canonical}",
            f"it takes: {', '.join(sorted(allowed)) or 'none'} (see /openapi.json)",
        )


@web.middleware
async def errors(request: web.Request, handler):
    try:
        _check_query(request)
        return await handler(request)
    except PoolError as exc:
        return _json(api.Error, exc.body(), exc.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        msg = {
            404: f"no route {request.method} {request.path}",
            405: f"{request.method} not allowed on {request.path}",
        }
        text = msg.get(exc.status, exc.reason)
        code = {404: "not_found", 413: "bad_request"}.get(exc.status, "bad_request")
        response = _json(api.Error, {"error": text, "code": code, "hint": "see /openapi.json"}, exc.status)
        if "Allow" in exc.headers:  # a 405 names the methods the path takes (RFC 9110)
            response.headers["Allow"] = exc.headers["Allow"]
        return response
    except Exception as exc:
        log.exception("internal error on %s %s", request.method, request.path)
        return _json(
            api.Error,
            {"error": f"internal server error: {type(exc).__name__}: {exc}", "code": "internal"},
            500,
        )


async def _caller(request: web.Request) -> Caller:
    st: ServerState = request.app[STATE]
    return await st.db(st.pool.authenticate, request.headers.get("Authorization"), time.time())


async def _admin(request: web.Request) -> Caller:
    caller = await _caller(request)
    if not caller.admin:
        raise Forbidden(f"{request.path} needs an admin token (client {caller.client} has a client token)",
                        "gpupool-server token create NAME --admin")  # fmt: skip
    return caller


def _flag(request: web.Request, name: str) -> bool:
    value = request.query.get(name, "false").lower()
    if value not in ("true", "false", "1", "0", "yes", "no"):
        raise BadRequest(f"query parameter {name}={value!r} is not a boolean", "use true or false")
    return value in ("true", "1", "yes")


# --- public ------------------------------------------------------------------------------------------
async def openapi(request: web.Request) -> web.Response:
    return web.Response(
        body=resources.files("server").joinpath("openapi.json").read_bytes(), content_type="application/json"
    )


async def health(request: web.Request) -> web.Response:
    st: ServerState = request.app[STATE]
    count = await st.db(st.pool.active_count)
    condition = await st.db(st.pool.store.condition)
    info = st.pool.server_info()
    out = {"status": "ok" if condition["writable"] else "degraded", "server": info,
           "simulated": info["simulated"], "leases_active": count,
           "uptime_s": round(time.time() - st.pool.started, 3), "store": _store_health(condition)}  # fmt: skip
    if st.pool.cluster is not None:
        out["cluster"] = st.pool.cluster.status()
    return _json(api.Health, out)


def _store_health(condition: dict) -> dict:
    out = {"writable": condition["writable"], "unsaved_leases": len(condition["unsaved_leases"])}
    if not condition["writable"]:
        out.update(
            problem=condition["problem"],
            since=iso(condition["full_since"]),
            hint="free space on the state directory's disk: running leases go on, nothing new is granted; "
            "kept releases and heartbeats are written as soon as it has room",
        )
    return out


async def gpus(request: web.Request) -> web.Response:
    st: ServerState = request.app[STATE]
    await _caller(request)
    view = await st.db(st.pool.gpus_view)
    return _json(
        api.GpuList, {"server": st.pool.server_info(), "simulated": st.pool.inv.simulated, "gpus": view}
    )


def _refuse_remote_if_simulated(pool: Pool, req: LeaseRequest) -> None:
    refusal = remote_refusal(pool.inv.simulated) if req.remote else None
    if refusal is not None:
        raise refusal


async def fit(request: web.Request) -> web.Response:
    st: ServerState = request.app[STATE]
    caller = await _caller(request)
    req = decode(await request.read(), LeaseRequest)
    try:
        _refuse_remote_if_simulated(st.pool, req)
    except RemoteUnavailable as exc:
        return _json(api.Fit, {"fits_now": False, "code": exc.code, "reason": exc.title, "hint": exc.hint,
                      "score": None, "placement": [], "server": st.pool.server_info()})  # fmt: skip
    snapshot = await asyncio.to_thread(st.pool.prefetch, caller.client)
    return _json(api.Fit, await st.db(st.pool.fit, caller, req, snapshot))


async def create_lease(request: web.Request) -> web.Response:
    st: ServerState = request.app[STATE]
    caller = await _caller(request)
    req = decode(await request.read(), LeaseRequest)
    _refuse_remote_if_simulated(st.pool, req)
    # No prefetch here: the grant reads the client's sum on the database thread right before its
    # etcd transaction, so grants on one server never conflict with each other (only across servers).
    lease = await st.db(st.pool.grant, caller, req, time.time())
    if req.remote:
        await _start_worker(st, lease)
        lease = await st.db(st.pool.lease, lease["id"])
    return _json(api.Lease, lease, 201)


async def _start_worker(st: ServerState, lease: dict, **receiving):
    """Start the remote lease's worker and record it; its handle. When it cannot start, the lease ends (with
    the reason) and RemoteUnavailable says why. `receiving`: a worker that receives the lease from another
    server (`start_remote_worker`'s secret and receive_s)."""
    try:
        handle = await asyncio.to_thread(start_remote_worker, lease, simulated=st.pool.inv.simulated,
                                         bind_host=st.bind_host, mps=st.pool.mps,
                                         host_gpus=len(st.pool.inv.gpus), **receiving)  # fmt: skip
    except RemoteUnavailable as exc:
        await st.db(st.pool.end, lease["id"], "released", exc.title, time.time())
        raise
    st.workers[lease["id"]] = handle
    handle.on_exit(st.wake_reaper)
    # A worker bound to every interface is reached at the server's advertised address.
    host = st.pool.inv.addr if handle.host in ("", "0.0.0.0", "::") else handle.host
    worker = {**handle.answer(host), "pid": handle.pid, "state_dir": str(handle.state_dir),
              "create_time": (alive_pids([(handle.pid, None)]) or [(0, None)])[0][1]}  # fmt: skip
    await st.db(st.pool.set_worker, lease["id"], worker)
    return handle


async def list_leases(request: web.Request) -> web.Response:
    st: ServerState = request.app[STATE]
    caller = await _caller(request)
    state = request.query.get("state", "active")
    if state not in ("active", "ended", "any"):
        raise BadRequest(f"state={state!r} is not one of active, ended, any", "e.g. /v1/leases?state=any")
    leases = await st.db(st.pool.list, caller, _flag(request, "all"), state)
    return _json(api.LeaseList, {"leases": leases})


async def get_lease(request: web.Request) -> web.Response:
    st: ServerState = request.app[STATE]
    caller = await _caller(request)
    return _json(api.Lease, await st.db(st.pool.get, caller, request.match_info["lease_id"]))


async def heartbeat(request: web.Request) -> web.Response:
    st: ServerState = request.app[STATE]
    caller = await _caller(request)
    body = decode(await request.read(), Heartbeat, empty_ok=True)
    return _json(
        api.Lease,
        await st.db(st.pool.heartbeat, caller, request.match_info["lease_id"], body.pids, time.time()),
    )


async def release(request: web.Request) -> web.Response:
    st: ServerState = request.app[STATE]
    caller = await _caller(request)
    lease, ended = await st.db(st.pool.release, caller, request.match_info["lease_id"], time.time())
    if not ended and lease["id"] in st.pool.moved_away:  # it runs on another server now: released there
        return _json(api.Lease, await _lease_transfer.release_moved(st, lease["id"], request))
    if st.pool.cluster is not None:  # its share leaves the cluster sum before the client hears back
        await asyncio.to_thread(st.pool.cluster.flush)
    if ended and lease["remote"]:
        await stop_worker(st, lease["id"])
    return _json(api.Lease, lease)


async def stop_worker(st: ServerState, lease_id: str) -> None:
    handle = st.workers.pop(lease_id, None)
    if handle is not None:
        try:
            await asyncio.to_thread(handle.stop)
        except Exception:
            log.exception("stopping the worker of %s failed", lease_id)
        return
    w = await st.db(st.pool.stored_worker, lease_id)
    if w is not None:  # a worker left from before a restart: we have no handle, only its pid
        await asyncio.to_thread(terminate, w["pid"], w.get("create_time"))


# --- admin -------------------------------------------------------------------------------------------
async def admin_clients(request: web.Request) -> web.Response:
    st: ServerState = request.app[STATE]
    await _admin(request)
    return _json(api.ClientList, {"clients": await st.db(st.pool.clients)})


async def admin_set_client(request: web.Request) -> web.Response:
    st: ServerState = request.app[STATE]
    await _admin(request)
    name = request.match_info["client"]
    decode(json.dumps({"client": name}).encode(), TokenCreate)  # same name rules as tokens
    update = decode(await request.read(), ClientUpdate)
    return _json(api.Client, await st.db(st.pool.set_client, name, update))


async def admin_migrate(request: web.Request) -> web.Response:
    st: ServerState = request.app[STATE]
    await _admin(request)
    req = decode(await request.read(), MigrateRequest)
    if (req.to is None) == (req.server is None):
        raise BadRequest("give exactly one of to (a GPU of this server) and server (another server)",
                         'e.g. {"to": 1} or {"server": "gpu2:56001"}')  # fmt: skip
    lease_id = request.match_info["lease_id"]
    if req.server is not None:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        lease = await _lease_transfer.migrate(st, lease_id, _server_url(req.server), token)
    else:
        lease = await _lease_migrate.migrate(st, lease_id, req.partition, req.to)
    return _json(api.MigratedLease, lease)


def _server_url(text: str) -> str:
    from server.client_config import ConfigError, normalize_url

    try:
        return normalize_url(text)
    except ConfigError as exc:
        raise BadRequest(f"server {text!r}: {exc.title}", exc.hint) from None


async def admin_receive(request: web.Request) -> web.Response:
    """Another server moves a running lease here: admit it and start the worker that receives it."""
    st: ServerState = request.app[STATE]
    await _admin(request)
    lease_id = request.match_info["lease_id"]
    if request.method == "PUT":  # its worker holds the lease: the admission is the lease from now on
        return _json(api.Lease, await st.db(_lease_transfer.commit, st.pool, lease_id))
    if request.method == "DELETE":
        handle = st.workers.get(lease_id)
        if handle is None or lease_id not in st.pool.receiving:
            raise NotFound(f"no lease {lease_id} is being received here", "only an admission that has not "
                           "completed can be given back")  # fmt: skip
        lease = await st.db(_lease_transfer.give_back, st.pool, lease_id, "its move here did not complete",
                            time.time())  # fmt: skip
        await stop_worker(st, lease_id)
        return _json(api.Lease, lease or await st.db(st.pool.lease, lease_id))
    req = decode(await request.read(), ReceiveRequest)
    if not LEASE_ID.fullmatch(lease_id):
        raise BadRequest(f"{lease_id!r} is not a lease id", "lease ids look like lease-3f2a9c01d4e7")
    refusal = remote_refusal(st.pool.inv.simulated)
    if refusal is not None:
        raise refusal
    lease = await st.db(_lease_transfer.admit, st.pool, lease_id, req, time.time())
    handle = await _start_worker(st, lease, secret=req.secret, receive_s=req.wait_s)
    host = st.pool.inv.addr if handle.host in ("", "0.0.0.0", "::") else handle.host
    return _json(api.Receiving, {
        "lease": lease_id, "server": st.pool.inv.hostname, "gpus": [p["gpu_index"] for p in lease["partitions"]],
        "worker": {"host": host, "port": handle.port, "migrate_port": handle.migrate_port,
                   "tls_sha256": handle.tls_sha256, "local": handle.local},
        "migration_secret": handle.migration_secret, "wait_s": req.wait_s,
    })  # fmt: skip


async def admin_drain(request: web.Request) -> web.Response:
    st: ServerState = request.app[STATE]
    await _admin(request)
    gpu = _gpu_index(request.match_info["index"])
    if request.method == "DELETE":
        return _json(api.Drain, _lease_migrate.undrain(st, gpu))
    return _json(api.Drain, await _lease_migrate.drain(st, gpu))


async def admin_drain_server(request: web.Request) -> web.Response:
    st: ServerState = request.app[STATE]
    await _admin(request)
    if request.method == "DELETE":
        return _json(api.ServerDrain, await _lease_migrate.undrain_server(st))
    return _json(api.ServerDrain, await _lease_migrate.drain_server(st))


def _gpu_index(text: str) -> int:
    if not text.isdigit() or len(text) > 4:
        raise BadRequest(f"GPU index {text!r} is not a number from 0", "GET /v1/gpus lists the GPUs")
    return int(text)


async def admin_policy(request: web.Request) -> web.Response:
    st: ServerState = request.app[STATE]
    await _admin(request)
    if request.method == "PUT":
        update = decode(await request.read(), PolicyUpdate)
        return _json(api.Policy, await st.db(st.pool.set_policy, update))
    return _json(api.Policy, await st.db(st.pool.policy))


def _token_json(row) -> dict:
    from server._pool import iso

    return {"id": row["id"], "client": row["client"], "admin": bool(row["admin"]), "created_at": iso(row["created"]),
            "expires_at": iso(row["expires"]), "revoked": row["revoked"] is not None}  # fmt: skip


async def admin_tokens(request: web.Request) -> web.Response:
    st: ServerState = request.app[STATE]
    await _admin(request)
    if request.method == "POST":
        req = decode(await request.read(), TokenCreate)
        row = await st.db(
            lambda: st.pool.tokens.create_token(req.client, admin=req.admin, expires_in_s=req.expires_in_s)
        )
        return _json(api.Token, {**_token_json(row), "token": row["token"]}, 201)
    rows = await st.db(st.pool.tokens.tokens)
    return _json(api.TokenList, {"tokens": [_token_json(r) for r in rows]})


async def admin_revoke(request: web.Request) -> web.Response:
    st: ServerState = request.app[STATE]
    await _admin(request)
    row = await st.db(st.pool.tokens.revoke_token, request.match_info["token_id"])
    if row is None:
        from server._errors import NotFound

        raise NotFound(f"no token {request.match_info['token_id']}", "GET /v1/admin/tokens lists them")
    return _json(api.Token, _token_json(row))


ROUTES = [
    ("GET", "/openapi.json", openapi),
    ("GET", "/v1/health", health),
    ("GET", "/v1/gpus", gpus),
    ("POST", "/v1/fit", fit),
    ("POST", "/v1/leases", create_lease),
    ("GET", "/v1/leases", list_leases),
    ("GET", "/v1/leases/{lease_id}", get_lease),
    ("DELETE", "/v1/leases/{lease_id}", release),
    ("POST", "/v1/leases/{lease_id}/heartbeat", heartbeat),
    ("GET", "/v1/admin/clients", admin_clients),
    ("PUT", "/v1/admin/clients/{client}", admin_set_client),
    ("GET", "/v1/admin/policy", admin_policy),
    ("PUT", "/v1/admin/policy", admin_policy),
    ("GET", "/v1/admin/tokens", admin_tokens),
    ("POST", "/v1/admin/tokens", admin_tokens),
    ("DELETE", "/v1/admin/tokens/{token_id}", admin_revoke),
    ("POST", "/v1/admin/leases/{lease_id}/migrate", admin_migrate),
    ("POST", "/v1/admin/leases/{lease_id}/receive", admin_receive),
    ("PUT", "/v1/admin/leases/{lease_id}/receive", admin_receive),
    ("DELETE", "/v1/admin/leases/{lease_id}/receive", admin_receive),
    ("POST", "/v1/admin/gpus/{index}/drain", admin_drain),
    ("DELETE", "/v1/admin/gpus/{index}/drain", admin_drain),
    ("POST", "/v1/admin/drain", admin_drain_server),
    ("DELETE", "/v1/admin/drain", admin_drain_server),
]


# --- background loops --------------------------------------------------------------------------------
async def reap_loop(st: ServerState) -> None:
    pool = st.pool
    while not st.stopping.is_set():
        await st.reap_pause()
        try:
            await st.db(pool.store.retry_writes)  # a full disk: what waits in memory, as soon as it has room
            now = time.time()
            leases = await st.db(pool.active_leases)
            active_at = await asyncio.to_thread(st.probe.busy_leases, leases, now)
            dead: dict[str, str] = {}
            for lease in leases:
                handle = st.workers.get(lease["id"])
                if _lease_migrate.under_way(lease["id"]):
                    continue  # its worker may exit on purpose (moved to another server): decided after it
                if handle is not None:
                    if not handle.alive():
                        dead[lease["id"]] = "its remote worker exited"
                    else:
                        active_at[lease["id"]] = max(active_at.get(lease["id"], 0.0), handle.last_activity())
                elif lease["worker"]:  # orphan from before a restart: alive means in use, as far as we know
                    w = lease["worker"]
                    if alive_pids([(w["pid"], w.get("create_time"))]):
                        active_at[lease["id"]] = now
                    else:
                        dead[lease["id"]] = "its remote worker exited"
            ended = await st.db(pool.reap, time.time(), active_at, dead)
            if ended and pool.cluster is not None:
                await asyncio.to_thread(pool.cluster.flush)
            if time.monotonic() - st.last_purge > 3600:
                st.last_purge = time.monotonic()
                with contextlib.suppress(StorageFull):  # on a full disk forgetting waits an hour more
                    if purged := await st.db(pool.purge_ended, time.time()):
                        log.info(
                            "forgot %d leases that ended over %s ago",
                            purged,
                            format_duration(pool.cfg.ended_retention_s),
                        )
            for lease in ended:
                if lease["remote"]:
                    await stop_worker(st, lease["id"])
        except Exception:
            log.exception("reaper pass failed; retrying")


def make_app(st: ServerState) -> web.Application:
    app = web.Application(middlewares=[errors], client_max_size=1 << 20)
    app[STATE] = st
    app[POOL] = st.pool
    for method, path, handler in ROUTES:
        app.router.add_route(method, path, handler)
    return app
