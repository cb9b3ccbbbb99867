"""The pool's client library, used by ``gpuattach`` and the console (``tui``).

- ``PoolClient``: the whole pool as ``gpuattach`` sees it: ask every server at once, choose, claim,
  keep alive (``Heartbeater``), release. Answers are ``server.api`` structs (``Lease``, ``Fit``, ...).
- ``ServerClient``: one server's documented answers and admin actions, as the console shows them.
- ``Heartbeater``: the one heartbeat loop, in a thread of ``gpuattach run`` and in the session keeper.
- ``LeaseRequest``: a lease request, the very struct the server decodes (``server.api``).
- ``HttpTransport``: the one transport both clients send through (``http.client``); a test or another
  transport plugs in at ``Transport``.
- errors: one tree, ``server.client_errors`` (``PoolClientError`` and below), re-exported here.

The standard library plus msgspec (which ``gpuattach``'s wire format needs anyway): it starts fast and
installs anywhere.
"""

from __future__ import annotations

import http.client
import random
import ssl
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, TypeVar

import msgspec

from collector.durations import format_duration
from collector.words import plural
from server import api
from server._backoff import delays
from server.api import Fit, Lease, LeaseRequest, ServerInfo
from server.client_config import ClientConfig, ServerRef, normalize_url
from server.client_errors import (
    ApiError,
    CannotFit,
    ConfigError,
    LeaseEnded,
    PoolClientError,
    Unreachable,
    WaitTimeout,
)
from server.client_errors import host as _host

__all__ = [
    "ApiError",
    "CannotFit",
    "ConfigError",
    "Heartbeater",
    "HttpTransport",
    "LeaseEnded",
    "LeaseRequest",
    "PoolClient",
    "PoolClientError",
    "ServerClient",
    "ServerClientOptions",
    "Transport",
    "Unreachable",
    "WaitTimeout",
    "describe",
    "normalize_url",
]

T = TypeVar("T")


def describe(req: LeaseRequest) -> str:
    """A request as a person says it: ``2 GPUs × 0.5 of a GPU [device.name=H100]``."""
    size = f"{req.mem_mib} MiB" if req.mem_mib is not None else f"{req.fraction:g} of a GPU"
    text = f"{req.n} GPU{'s' if req.n > 1 else ''} × {size}"
    return text + (f" [{', '.join(req.filters)}]" if req.filters else "")


# --- the transport ---------------------------------------------------------------------------------------
class Reply(NamedTuple):
    status: int
    reason: str
    body: bytes


class Transport(Protocol):
    """One HTTP exchange with one server. Raises ``OSError``/``http.client.HTTPException`` (``ssl.SSLError``
    for TLS) when the server does not answer, ``ValueError`` for a header that cannot be sent."""

    def exchange(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> Reply: ...


class HttpTransport:
    """``http.client`` to one server URL (http or https, verified against ``ca_cert`` or the system's CAs)."""

    def __init__(self, url: str, *, timeout_s: float, ca_cert: str | None = None):
        self.parts = urllib.parse.urlsplit(url)
        self.timeout_s = timeout_s
        self.tls = ssl.create_default_context(cafile=ca_cert) if self.parts.scheme == "https" else None

    def exchange(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> Reply:
        host, port = self.parts.hostname or "", self.parts.port
        if self.tls is not None:
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                host, port, timeout=self.timeout_s, context=self.tls
            )
        else:
            conn = http.client.HTTPConnection(host, port, timeout=self.timeout_s)
        try:
            conn.request(method, self.parts.path.rstrip("/") + path, body=body, headers=headers)
            resp = conn.getresponse()
            return Reply(resp.status, resp.reason, resp.read())
        finally:
            conn.close()


def _headers(token: str | None, user_agent: str) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "Accept": "application/json", "User-Agent": user_agent}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def _error_answer(raw: bytes, status: int, reason: str = "") -> api.Error:
    """A non-2xx answer's Error object; one that is not (a proxy's page, another program) as an ``Error``
    naming the HTTP status."""
    try:
        return api.read(raw, api.Error)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return api.Error(error=f"HTTP {status}" + (f" {reason}" if reason else ""), code="unknown")


QUORUM_HINT = "the etcd cluster has lost its majority; running leases keep running: try again when it is back"


def discover(cluster: str, timeout_s: float = 3.0) -> list[ServerRef]:
    """The servers registered in a cluster (their /gpupool/members/ keys), through the pool's etcd client."""
    from server._cluster import MEMBERS
    from server._etcd import EtcdClient, EtcdError, EtcdUnavailable

    try:
        etcd = EtcdClient.from_url(cluster, timeout=timeout_s)
    except ValueError as exc:
        raise ConfigError(
            f"cluster {cluster!r}: {exc}", "write etcd://host1:2379,host2:2379,host3:2379"
        ) from None
    try:
        members = [msgspec.json.decode(kv.value, type=api.Member) for kv in etcd.get_prefix(MEMBERS)]
    except (EtcdUnavailable, EtcdError) as exc:
        raise PoolClientError(
            f"pool state unavailable: no etcd quorum (cannot list the servers of {cluster}: "
            f"{getattr(exc, 'detail', None) or exc})",
            QUORUM_HINT,
        ) from None
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise PoolClientError(
            f"the cluster {cluster} holds a member key that is not a gpupool-server's: {exc}",
            "gpupool-server cluster members lists them",
        ) from None
    finally:
        etcd.close()
    return [ServerRef(m.url, None) for m in sorted(members, key=lambda m: m.name)]


class PoolClient:
    def __init__(self, cfg: ClientConfig, *, http_timeout_s: float = 10.0):
        if cfg.cluster:
            found = [s for s in discover(cfg.cluster) if s.url not in {x.url for x in cfg.servers}]
            cfg.servers = [*cfg.servers, *found]
            if not cfg.servers:
                raise ConfigError(
                    f"no gpupool-server is registered in the cluster {cfg.cluster}",
                    "start servers with gpupool-server --cluster (gpupool-server cluster members lists them)",
                )
        if not cfg.servers:
            raise ConfigError(
                "no servers configured",
                f'list them in {cfg.path or "~/.config/gpupool/client.toml"} (servers = ["host:56001"]) or pass --server',
            )
        self.cfg = cfg
        self.servers = cfg.servers
        self.http_timeout_s = http_timeout_s
        self._transports: dict[str, Transport] = {}
        self._pool = ThreadPoolExecutor(max_workers=max(4, len(self.servers)), thread_name_prefix="gpuattach")

    def close(self) -> None:
        self._pool.shutdown(wait=False)

    def server(self, url: str) -> ServerRef:
        return next((s for s in self.servers if s.url == url), ServerRef(url, None))

    def transport(self, server: ServerRef) -> Transport:
        if server.url not in self._transports:
            self._transports[server.url] = HttpTransport(
                server.url, timeout_s=self.http_timeout_s, ca_cert=self.cfg.ca_cert
            )
        return self._transports[server.url]

    # --- one call ---------------------------------------------------------------------------------------
    def call(
        self,
        server: ServerRef,
        method: str,
        path: str,
        kind: type[T],
        body: msgspec.Struct | None = None,
        *,
        auth: bool = True,
    ) -> T:
        """One call; the answer decoded as ``kind`` (a ``server.api`` struct)."""
        token = self.cfg.token_for(server)
        if auth and not token:
            raise ConfigError(
                "no token configured", 'put token = "gp_..." in client.toml, or pass --token / GPUPOOL_TOKEN'
            )
        payload = msgspec.json.encode(body) if body is not None else None
        try:
            reply = self.transport(server).exchange(
                method, path, payload, _headers(token if auth else None, "gpuattach")
            )
        except ssl.SSLError as exc:
            raise Unreachable(
                server.url, f"TLS failed ({exc.reason or exc}); set ca_cert in client.toml for a private CA"
            ) from None
        except ValueError as exc:  # after SSLError (a certificate error is also a ValueError): a bad header
            raise ConfigError(
                f"cannot send the request: {exc}", "check the token for stray characters"
            ) from None
        except (OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise Unreachable(server.url, reason) from None
        if reply.status >= 400:
            error = _error_answer(reply.body, reply.status)
            cls = LeaseEnded if error.code == "lease_ended" else ApiError
            raise cls(server.url, reply.status, error)
        try:
            return api.read(reply.body, kind)
        except msgspec.DecodeError:
            raise Unreachable(
                server.url, f"HTTP {reply.status} with a body that is not JSON (is this a gpupool-server?)"
            ) from None
        except msgspec.ValidationError as exc:
            raise Unreachable(
                server.url, f"HTTP {reply.status} with an answer that is not a {kind.__name__}: {exc}"
            ) from None

    def each(
        self,
        method: str,
        path: str,
        kind: type[T],
        body: msgspec.Struct | None = None,
        *,
        auth: bool = True,
        servers=None,
    ) -> list[tuple[ServerRef, T | PoolClientError]]:
        """The same call on every server at once; answers in the servers' order (errors as values)."""
        servers = servers or self.servers

        def one(s: ServerRef) -> tuple[ServerRef, T | PoolClientError]:
            try:
                return s, self.call(s, method, path, kind, body, auth=auth)
            except PoolClientError as exc:
                return s, exc

        return list(self._pool.map(one, servers))

    # --- leases -----------------------------------------------------------------------------------------
    def find_lease(self, lease_id: str) -> tuple[ServerRef, Lease]:
        answers = self.each("GET", f"/v1/leases/{urllib.parse.quote(lease_id)}", Lease)
        for server, answer in answers:
            if isinstance(answer, Lease):
                return server, answer
        for _, answer in answers:
            if isinstance(answer, ApiError) and answer.code != "not_found":
                raise answer
        unreachable = [a for _, a in answers if isinstance(a, Unreachable)]
        note = f" ({plural(len(unreachable), 'server')} unreachable)" if unreachable else ""
        raise PoolClientError(
            f"no lease {lease_id} on any server of the pool{note}", "gpuattach leases lists yours"
        )

    def release(self, server: ServerRef, lease_id: str) -> Lease:
        return self.call(server, "DELETE", f"/v1/leases/{urllib.parse.quote(lease_id)}", Lease)

    def heartbeat(self, server: ServerRef, lease_id: str, pids: list[int] | None = None) -> Lease:
        path = f"/v1/leases/{urllib.parse.quote(lease_id)}/heartbeat"
        return self.call(server, "POST", path, Lease, api.Heartbeat(pids=pids or []))

    def acquire(
        self,
        req: LeaseRequest,
        *,
        timeout_s: float,
        accept: Callable[[ServerInfo], str | None] | None = None,
        on_wait: Callable[[str], None] | None = None,
        rng: random.Random | None = None,
    ) -> tuple[ServerRef, Lease]:
        """Ask every server, claim on the best that fits; back off and retry until ``timeout_s``.

        ``accept(server_info)`` may refuse a server with a reason (``--local`` keeps only this host).
        Choice among servers that fit now: the tightest fit (lowest ``score``: least memory left on the
        chosen GPUs), so partial GPUs fill up and whole GPUs stay free for whole-GPU requests; ties are
        broken at random so concurrent clients spread over equal servers instead of racing for one.
        """
        rng = rng or random.Random()
        deadline = time.monotonic() + timeout_s
        waits = delays(rng=rng)
        told = False
        while True:
            answers = self.each("POST", "/v1/fit", Fit, req)
            fits: list[tuple[float, float, ServerRef]] = []
            busy: list[tuple[ServerRef, str]] = []
            limits: list[tuple[ServerRef, str]] = []
            never: list[tuple[ServerRef, str, ServerInfo]] = []
            no_remote: list[tuple[ServerRef, str, ServerInfo]] = []
            unreachable: list[PoolClientError] = []
            no_quorum: list[ApiError] = []
            for server, a in answers:
                if isinstance(a, ApiError):
                    if a.status in (400, 401, 403):
                        raise a  # bad request or bad token: retrying cannot help
                    if a.code == "no_quorum":  # cluster mode: the servers cannot reach etcd's majority
                        no_quorum.append(a)
                    unreachable.append(a)
                elif isinstance(a, PoolClientError):
                    unreachable.append(a)
                else:
                    refusal = accept(a.server) if accept else None
                    reason = a.reason or ""
                    if refusal:
                        never.append((server, refusal, a.server))
                    elif a.fits_now:
                        fits.append((a.score if a.score is not None else 1.0, rng.random(), server))
                    elif a.code in ("busy", "storage_full"):  # not now; this server may grant later
                        busy.append((server, reason))
                    elif a.code == "limit_exceeded":
                        limits.append((server, reason))
                    elif a.code == "remote_unavailable":
                        no_remote.append((server, reason, a.server))
                    else:
                        never.append((server, reason, a.server))
            for _, _, server in sorted(fits, key=lambda t: (t[0], t[1])):
                try:
                    return server, self.call(server, "POST", "/v1/leases", Lease, req)
                except ApiError as exc:
                    if exc.code in ("busy", "storage_full"):
                        continue  # taken between fit and claim, or its disk filled: try the next one
                    if exc.code == "limit_exceeded":
                        limits.append((server, exc.answer.error))
                        continue
                    raise
                except Unreachable as exc:
                    unreachable.append(exc)
            if not busy and not fits:
                if no_quorum:
                    raise PoolClientError(
                        f"pool state unavailable: no etcd quorum [{_host(no_quorum[0].url)}]", QUORUM_HINT
                    )
                if limits:
                    raise CannotFit(
                        limits[0][1],
                        "release a lease (gpuattach release LEASE) or ask the admin to raise your limit",
                    )
                if no_remote and not never and not unreachable:
                    raise CannotFit(
                        f"no server of the pool runs remote leases: {no_remote[0][1]} [{_host(no_remote[0][0].url)}]",
                        "run on a GPU host of the pool with --local, or add servers with real GPUs",
                    )
                never += no_remote
                if never and not unreachable:
                    raise CannotFit(
                        _impossible_summary(req, never),
                        "ask for fewer or smaller partitions, or loosen the filters",
                    )
                if unreachable and not never:
                    if len(unreachable) == 1:
                        raise unreachable[0]
                    raise PoolClientError(f"no server of the pool answered ({len(unreachable)} tried): {unreachable[0].title}",
                                          "check the servers in client.toml (gpuattach servers)")  # fmt: skip
            left = deadline - time.monotonic()
            if left <= 0:
                why = "; ".join(f"{_host(s.url)}: {r}" for s, r in busy[:3]) or "servers unreachable"
                raise WaitTimeout(
                    f"waited {format_duration(timeout_s)} for {describe(req)}; none became free ({why})",
                    "try again later, wait longer (--timeout), or ask for less",
                )
            if on_wait and not told:
                on_wait(
                    f"no server has {describe(req)} free now; waiting up to {format_duration(timeout_s)} (Ctrl-C to stop)"
                )
                told = True
            time.sleep(min(next(waits), max(0.0, left)))


def _impossible_summary(req: LeaseRequest, never: list[tuple[ServerRef, str, ServerInfo]]) -> str:
    sizes = [info.gpu_count for _, _, info in never]
    if sizes and req.n > max(sizes):
        biggest = max(never, key=lambda t: t[2].gpu_count)
        return (f"asks for {plural(req.n, 'GPU')} but the largest server of the pool has {max(sizes)} "
                f"({_host(biggest[0].url)}); a request's GPUs all come from one server")  # fmt: skip
    reasons = "; ".join(f"{_host(s.url)}: {r}" for s, r, _ in never[:4])
    return f"no server of the pool can ever serve {describe(req)} ({reasons})"


def heartbeat_interval(ttl_s: float) -> float:
    """A third of the lease's TTL (two beats may be lost before it expires), 0.2 s to 10 s."""
    return max(0.2, min(ttl_s / 3, 10.0))


class Heartbeater:
    """The one heartbeat loop of a lease: ``gpuattach run`` runs it in a thread (``start``), the session
    keeper (``virtualize.client._keeper``) in its main thread (``run``).

    It beats every ``interval_s``; the end of the lease (released, expired, reclaimed: 410) is reported
    once through ``on_end(state, reason)`` and ends the loop. Any other failure is reported once through
    ``on_trouble`` until a beat succeeds again; with ``give_up_after_s``, the loop ends when no beat has
    succeeded for that long. Each beat registers ``pids_from()`` when given, else the pids ``start`` got.
    """

    def __init__(
        self,
        client: PoolClient,
        server: ServerRef,
        lease_id: str,
        interval_s: float,
        *,
        on_end: Callable[[str, str], None],
        on_trouble: Callable[[PoolClientError], None] | None = None,
        give_up_after_s: float | None = None,
        pids_from: Callable[[], list[int]] | None = None,
        on_moved: Callable[[ServerRef], None] | None = None,
    ):
        self.client, self.server, self.lease_id = client, server, lease_id
        self.on_moved = on_moved  # the lease moved to this server (its heartbeats go there from now on)
        self.pids_from = pids_from  # read at each beat: processes that start after the lease (Slurm tasks)
        self.interval = interval_s
        self.on_end, self.on_trouble = on_end, on_trouble or _warn_heartbeat
        self.give_up_after_s = give_up_after_s
        self.pids: list[int] = []
        self.warned = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self.run, name="gpuattach-heartbeat", daemon=True)

    def start(self, pids: list[int] | None = None) -> None:
        self.pids = list(pids or [])
        self._thread.start()

    def beat_now(self) -> None:
        self.client.heartbeat(self.server, self.lease_id, self.pids_from() if self.pids_from else self.pids)

    def run(self) -> str:
        """Beat until stopped (``"stopped"``), the lease ends (``"ended"``) or the server stays away past
        ``give_up_after_s`` (``"gave up"``)."""
        last_ok = time.monotonic()
        while not self._stop.wait(self.interval):
            try:
                self.beat_now()
                last_ok, self.warned = time.monotonic(), False
            except LeaseEnded as exc:
                moved_to = getattr(exc.answer, "moved_to", None)
                if isinstance(moved_to, str) and moved_to:  # the lease runs on another server now: beat there
                    self.server = ServerRef(moved_to, self.server.token)
                    if self.on_moved is not None:
                        try:
                            self.on_moved(self.server)
                        except Exception as trouble:  # what follows the lease is best effort; the beats go on
                            print(f"gpuattach: warning: lease {self.lease_id} moved to {moved_to}, but {trouble}",
                                  file=sys.stderr, flush=True)  # fmt: skip
                    continue
                self.on_end(exc.answer.state or "ended", exc.answer.reason or exc.answer.error)
                return "ended"
            except PoolClientError as exc:
                if not self.warned:
                    self.on_trouble(exc)
                    self.warned = True
                if self.give_up_after_s is not None and time.monotonic() - last_ok > self.give_up_after_s:
                    return "gave up"
        return "stopped"

    def stop(self) -> None:
        self._stop.set()


def _warn_heartbeat(exc: PoolClientError) -> None:
    print(f"gpuattach: warning: heartbeat failed ({exc.title}); retrying", file=sys.stderr, flush=True)


# --- one server, as the console sees it -------------------------------------------------------------


@dataclass(frozen=True)
class ServerClientOptions:
    timeout_s: float = 3.0  # per call: a dead server must not stall a refresh for long
    user_agent: str = "gpupool-console"
    ca_cert: str | None = None  # PEM of the CA that signed the servers' certificates (private CA)


class ServerClient:
    """One server of the pool, as the console uses it. Every answer is decoded into its ``server.api``
    struct (``Health``, ``Gpu``, ``Lease``, ``Client``, ``Policy``, ...): an answer that is not one (a
    server of another version, another program) is an ``ApiError`` naming the struct, so the console
    reports that route and shows the others. Failures are ``Unreachable`` or ``ApiError`` with the
    console's wording and hints."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        options: ServerClientOptions | None = None,
        *,
        transport: Transport | None = None,
    ):
        self.url = normalize_url(url)
        self.token = token
        self.options = options or ServerClientOptions()
        self.transport = transport or HttpTransport(
            self.url, timeout_s=self.options.timeout_s, ca_cert=self.options.ca_cert
        )

    def __repr__(self) -> str:
        return f"ServerClient({self.url!r}, token={'set' if self.token else 'none'})"

    # Reads ---------------------------------------------------------------------------------------
    def health(self) -> api.Health:
        return self._typed(api.Health, "GET", "/v1/health", auth=False)

    def gpus(self) -> api.GpuList:
        return self._typed(api.GpuList, "GET", "/v1/gpus")

    def leases(self) -> list[Lease]:
        return self._typed(api.LeaseList, "GET", "/v1/leases?all=true&state=active").leases

    def clients(self) -> list[api.Client]:
        return self._typed(api.ClientList, "GET", "/v1/admin/clients").clients

    def policy(self) -> Any:
        """The policy in force: an ``api.Policy`` (a struct built from ``server.ranges.POLICY``)."""
        return self._typed(api.Policy, "GET", "/v1/admin/policy")

    # Operator actions (admin token): answers decoded into server.api's structs -------------------
    def release(self, lease_id: str) -> Lease:
        return self._typed(Lease, "DELETE", f"/v1/leases/{urllib.parse.quote(lease_id, safe='')}")

    def update_client(self, client: str, **fields: float | None) -> api.Client:
        """Set ``limit`` and/or ``idle_timeout_s`` of a client; None clears it back to the default."""
        body: msgspec.Struct = _update(api.ClientUpdate, fields)
        return self._typed(
            api.Client, "PUT", f"/v1/admin/clients/{urllib.parse.quote(client, safe='')}", body
        )

    def update_policy(self, **fields: float | None) -> Any:
        """Set policy values (``server.ranges.POLICY``); None clears one back to the config file's."""
        return self._typed(api.Policy, "PUT", "/v1/admin/policy", _update(api.PolicyUpdate, fields))

    def _typed(
        self, kind: type[T], method: str, path: str, body: msgspec.Struct | None = None, *, auth: bool = True
    ) -> T:
        try:
            return msgspec.convert(self._call(method, path, body, auth=auth), kind)
        except msgspec.ValidationError as exc:
            raise ApiError(
                self.url,
                200,
                api.Error(error=f"answer is not a {kind.__name__}: {exc}", code="unknown"),
                title=f"{method} {path.split('?')[0]} on {self.url}: answer is not a {kind.__name__} ({exc})",
                hint="is this a gpupool-server of this version?",
            ) from None

    def migrate(self, lease_id: str, to: int, partition: int = 0) -> api.MigratedLease:
        """Move a running remote lease's partition to GPU `to` of its server; the lease with its migration."""
        path = f"/v1/admin/leases/{urllib.parse.quote(lease_id, safe='')}/migrate"
        return self._typed(api.MigratedLease, "POST", path, api.MigrateRequest(to=to, partition=partition))

    def migrate_to_server(self, lease_id: str, server: str) -> api.MigratedLease:
        """Move a running remote lease to another server (`server`: its URL); the lease there, with its migration."""
        path = f"/v1/admin/leases/{urllib.parse.quote(lease_id, safe='')}/migrate"
        return self._typed(api.MigratedLease, "POST", path, api.MigrateRequest(server=server))

    def receive(self, lease_id: str, request: api.ReceiveRequest) -> api.Receiving:
        """Admit a lease another server moves here (that server asks); its GPUs and receiving worker."""
        path = f"/v1/admin/leases/{urllib.parse.quote(lease_id, safe='')}/receive"
        return self._typed(api.Receiving, "POST", path, request)

    def commit(self, lease_id: str) -> api.Lease:
        """The lease moved here: its admission becomes the lease (the server it left asks)."""
        path = f"/v1/admin/leases/{urllib.parse.quote(lease_id, safe='')}/receive"
        return self._typed(api.Lease, "PUT", path)

    def lease(self, lease_id: str) -> api.Lease:
        return self._typed(api.Lease, "GET", f"/v1/leases/{urllib.parse.quote(lease_id, safe='')}")

    def give_back(self, lease_id: str) -> api.Lease:
        """End the admission of a lease whose move here failed (its receiving worker stops)."""
        path = f"/v1/admin/leases/{urllib.parse.quote(lease_id, safe='')}/receive"
        return self._typed(api.Lease, "DELETE", path)

    def drain(self, gpu: int, *, undo: bool = False) -> api.Drain:
        """Stop granting on GPU `gpu` and move its remote leases off (undo: take leases again)."""
        return self._typed(api.Drain, "DELETE" if undo else "POST", f"/v1/admin/gpus/{gpu}/drain")

    def drain_server(self, *, undo: bool = False) -> api.ServerDrain:
        """Stop the server granting new leases; its running leases and why each stays (undo: grant again)."""
        return self._typed(api.ServerDrain, "DELETE" if undo else "POST", "/v1/admin/drain")

    def drain_server_moving(
        self, targets: list[str], tell: Callable[[str], None] | None = None
    ) -> tuple[api.ServerDrain, list[api.MigratedLease]]:
        """Drain the server, then move each of its remote leases, live, to the first of `targets` (other
        servers, host:port or URL) that takes it, one lease after the other (`tell`: each attempt, as it
        starts). The drain's answer with only what still stays (each with the last reason), and the moves."""
        done = self.drain_server()
        remote = {lease.id for lease in self.leases() if lease.remote}
        moved, stayed = [], []
        for stay in done.stayed:
            reason = stay.reason
            for target in targets if stay.lease in remote else ():
                if tell:
                    tell(f"{stay.lease}: moving to {target} ...")
                try:
                    moved.append(self.migrate_to_server(stay.lease, target))
                    break
                except PoolClientError as exc:
                    reason = exc.title
            else:
                stayed.append(type(stay)(lease=stay.lease, reason=reason))
        done.stayed = stayed
        return done, moved

    # Transport -----------------------------------------------------------------------------------
    def _call(self, method: str, path: str, body: msgspec.Struct | None = None, *, auth: bool = True) -> Any:
        payload = msgspec.json.encode(body) if body is not None else None
        headers = _headers(self.token if auth else None, self.options.user_agent)
        try:
            reply = self.transport.exchange(method, path, payload, headers)
        except (OSError, http.client.HTTPException) as exc:
            if isinstance(exc, ssl.SSLError):
                reason = f"TLS failed: {getattr(exc, 'verify_message', '') or exc}"
                raise Unreachable(
                    self.url,
                    reason,
                    title=f"{self.url} {reason}",
                    hint="for a private CA pass --ca-cert PATH (the CA that signed the server's certificate)",
                ) from None
            reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise Unreachable(
                self.url,
                reason,
                title=f"{self.url} unreachable: {reason}",
                hint="is gpupool-server running there? the console keeps retrying",
            ) from None
        if reply.status >= 400:
            raise self._answered_error(reply, method, path)
        try:
            return msgspec.json.decode(reply.body) if reply.body else {}
        except msgspec.DecodeError:
            raise ApiError(
                self.url,
                200,
                api.Error(error="answer is not JSON", code="unknown"),
                title=f"{self.url}{path}: answer is not JSON",
                hint="is this URL a gpupool-server?",
            ) from None

    def _answered_error(self, reply: Reply, method: str, path: str) -> ApiError:
        error = _error_answer(reply.body, reply.status, reply.reason)
        hint = error.hint or ""
        if reply.status in (401, 403):  # the server's hint speaks to gpuattach users; this is the console
            hint = "start the console with an admin token: --admin-token or GPUPOOL_ADMIN_TOKEN"
        if reply.status == 404 and error.code == "unknown":
            hint = "is this URL a gpupool-server of this version?"
        return ApiError(
            self.url,
            reply.status,
            error,
            title=f"{method} {path.split('?')[0]} on {self.url}: {error.error}",
            hint=hint,
        )


def _update(kind: type[T], fields: dict[str, float | None]) -> T:
    """An update body; a value out of its range (``server.ranges``) is refused here as the server would."""
    try:
        return kind(**fields)
    except (TypeError, ValueError) as exc:
        raise PoolClientError(str(exc), "see the ranges in docs/pool.md (Ranges)") from None
