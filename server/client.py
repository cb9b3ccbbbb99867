"""The pool's client library, used by ``gpuattach`` and the console (``tui``).

- ``PoolClient``: the whole pool as ``gpuattach`` sees it: ask every server at once, choose, claim,
  keep alive (``Heartbeater``), release.
- ``ServerClient``: one server's documented answers and admin actions, as the console shows them.
- ``Request``: a lease request (the ``LeaseRequest`` body of ``server.api``).
- errors: one tree, ``server.client_errors`` (``PoolClientError`` and below), re-exported here.

Only the standard library: ``gpuattach`` starts fast and installs anywhere.
"""

from __future__ import annotations

import http.client
import json
import random
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from collector.words import plural
from server._backoff import delays
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
    "LeaseEnded",
    "PoolClient",
    "PoolClientError",
    "Request",
    "ServerClient",
    "ServerClientOptions",
    "Unreachable",
    "WaitTimeout",
    "normalize_url",
]


@dataclass
class Request:
    n: int
    fraction: float | None = None
    mem_mib: int | None = None
    sm_share: float | None = None
    filters: tuple[str, ...] = ()
    local: bool = False
    remote: bool = False
    ttl_s: float | None = None
    pids: tuple[int, ...] = ()
    label: str | None = None
    job: dict[str, str] | None = None  # {"scheduler", "id", "account", "user"}: server.api.Job

    def body(self) -> dict:
        out: dict = {"n": self.n, "filters": list(self.filters), "local": self.local, "remote": self.remote}
        for key in ("fraction", "mem_mib", "sm_share", "ttl_s", "label"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.pids:
            out["pids"] = list(self.pids)
        if self.job:
            out["job"] = {k: v for k, v in self.job.items() if v is not None}
        return out

    def describe(self) -> str:
        size = f"{self.mem_mib} MiB" if self.mem_mib is not None else f"{self.fraction:g} of a GPU"
        text = f"{self.n} GPU{'s' if self.n > 1 else ''} × {size}"
        return text + (f" [{', '.join(self.filters)}]" if self.filters else "")


QUORUM_HINT = "the etcd cluster has lost its majority; running leases keep running: try again when it is back"


def discover(cluster: str, timeout_s: float = 3.0) -> list[ServerRef]:
    """The servers registered in a cluster (their /gpupool/members/ keys), through etcd's JSON gateway."""
    import base64

    body = json.dumps({"key": base64.b64encode(b"/gpupool/members/").decode(),
                       "range_end": base64.b64encode(b"/gpupool/members0").decode()}).encode()  # fmt: skip
    failures = []
    for endpoint in cluster.removeprefix("etcd://").split(","):
        host, _, port = endpoint.rpartition(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
        try:
            conn.request("POST", "/v3/kv/range", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = json.loads(resp.read() or b"{}")
        except (OSError, http.client.HTTPException, ValueError) as exc:
            failures.append(f"{endpoint}: {getattr(exc, 'strerror', None) or exc or type(exc).__name__}")
            continue
        finally:
            conn.close()
        if resp.status != 200:
            failures.append(f"{endpoint}: {data.get('message') or resp.status}")
            continue
        members = [json.loads(base64.b64decode(kv["value"])) for kv in data.get("kvs", [])]
        return [ServerRef(m["url"], None) for m in sorted(members, key=lambda m: m["name"])]
    raise PoolClientError(
        f"pool state unavailable: no etcd quorum (cannot list the servers of {cluster}: {'; '.join(failures)})",
        QUORUM_HINT,
    )


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
        self._ssl = (
            ssl.create_default_context(cafile=cfg.ca_cert) if cfg.ca_cert else ssl.create_default_context()
        )
        self._pool = ThreadPoolExecutor(max_workers=max(4, len(self.servers)), thread_name_prefix="gpuattach")

    def close(self) -> None:
        self._pool.shutdown(wait=False)

    def server(self, url: str) -> ServerRef:
        return next((s for s in self.servers if s.url == url), ServerRef(url, None))

    # --- one call ---------------------------------------------------------------------------------------
    def call(
        self, server: ServerRef, method: str, path: str, body: dict | None = None, *, auth: bool = True
    ) -> dict:
        parts = urllib.parse.urlsplit(server.url)
        try:
            if parts.scheme == "https":
                conn = http.client.HTTPSConnection(
                    parts.hostname, parts.port, timeout=self.http_timeout_s, context=self._ssl
                )
            else:
                conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=self.http_timeout_s)
            headers = {"Content-Type": "application/json", "Accept": "application/json"}
            token = self.cfg.token_for(server)
            if auth:
                if not token:
                    raise ConfigError(
                        "no token configured",
                        'put token = "gp_..." in client.toml, or pass --token / GPUPOOL_TOKEN',
                    )
                headers["Authorization"] = f"Bearer {token}"
            payload = json.dumps(body).encode() if body is not None else None
            try:
                conn.request(method, parts.path.rstrip("/") + path, body=payload, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
            finally:
                conn.close()
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
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            raise Unreachable(
                server.url, f"HTTP {resp.status} with a body that is not JSON (is this a gpupool-server?)"
            ) from None
        if resp.status >= 400:
            cls = LeaseEnded if data.get("code") == "lease_ended" else ApiError
            raise cls(server.url, resp.status, data if isinstance(data, dict) else {})
        return data

    def each(
        self, method: str, path: str, body: dict | None = None, *, auth: bool = True, servers=None
    ) -> list[tuple[ServerRef, dict | Exception]]:
        """The same call on every server at once; answers in the servers' order (errors as values)."""
        servers = servers or self.servers

        def one(s: ServerRef):
            try:
                return s, self.call(s, method, path, body, auth=auth)
            except PoolClientError as exc:
                return s, exc

        return list(self._pool.map(one, servers))

    # --- leases -----------------------------------------------------------------------------------------
    def find_lease(self, lease_id: str) -> tuple[ServerRef, dict]:
        answers = self.each("GET", f"/v1/leases/{urllib.parse.quote(lease_id)}")
        for server, answer in answers:
            if isinstance(answer, dict):
                return server, answer
        for _, answer in answers:
            if isinstance(answer, ApiError) and answer.code != "not_found":
                raise answer
        unreachable = [a for _, a in answers if isinstance(a, Unreachable)]
        note = f" ({plural(len(unreachable), 'server')} unreachable)" if unreachable else ""
        raise PoolClientError(
            f"no lease {lease_id} on any server of the pool{note}", "gpuattach leases lists yours"
        )

    def release(self, server: ServerRef, lease_id: str) -> dict:
        return self.call(server, "DELETE", f"/v1/leases/{urllib.parse.quote(lease_id)}")

    def heartbeat(self, server: ServerRef, lease_id: str, pids: list[int] | None = None) -> dict:
        return self.call(
            server, "POST", f"/v1/leases/{urllib.parse.quote(lease_id)}/heartbeat", {"pids": pids or []}
        )

    def acquire(
        self,
        req: Request,
        *,
        timeout_s: float,
        accept: Callable[[dict], str | None] | None = None,
        on_wait: Callable[[str], None] | None = None,
        rng: random.Random | None = None,
    ) -> tuple[ServerRef, dict]:
        """Ask every server, claim on the best that fits; back off and retry until ``timeout_s``.

        ``accept(server_info)`` may refuse a server with a reason (``--local`` keeps only this host).
        Choice among servers that fit now: the tightest fit (lowest ``score``: least memory left on the
        chosen GPUs), so partial GPUs fill up and whole GPUs stay free for whole-GPU requests; ties are
        broken at random so concurrent clients spread over equal servers instead of racing for one.
        """
        rng = rng or random.Random()
        deadline = time.monotonic() + timeout_s
        waits = delays(rng=rng)
        body = req.body()
        told = False
        while True:
            answers = self.each("POST", "/v1/fit", body)
            fits, busy, never, limits, unreachable, no_remote = [], [], [], [], [], []
            no_quorum = []
            for server, a in answers:
                if isinstance(a, Unreachable):
                    unreachable.append(a)
                elif isinstance(a, ApiError):
                    if a.status in (400, 401, 403):
                        raise a  # bad request or bad token: retrying cannot help
                    if a.code == "no_quorum":  # cluster mode: the servers cannot reach etcd's majority
                        no_quorum.append(a)
                    unreachable.append(a)
                else:
                    refusal = accept(a["server"]) if accept else None
                    if refusal:
                        never.append((server, refusal, a["server"]))
                    elif a["fits_now"]:
                        fits.append((a["score"], rng.random(), server))
                    elif a["code"] in ("busy", "storage_full"):  # not now; this server may grant later
                        busy.append((server, a["reason"]))
                    elif a["code"] == "limit_exceeded":
                        limits.append((server, a["reason"]))
                    elif a["code"] == "remote_unavailable":
                        no_remote.append((server, a["reason"], a["server"]))
                    else:
                        never.append((server, a["reason"], a["server"]))
            for _, _, server in sorted(fits, key=lambda t: (t[0], t[1])):
                try:
                    lease = self.call(server, "POST", "/v1/leases", body)
                    return server, lease
                except ApiError as exc:
                    if exc.code in ("busy", "storage_full"):
                        continue  # taken between fit and claim, or its disk filled: try the next one
                    if exc.code == "limit_exceeded":
                        limits.append((server, exc.message))
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
                    f"waited {_fmt(timeout_s)} for {req.describe()}; none became free ({why})",
                    "try again later, wait longer (--timeout), or ask for less",
                )
            if on_wait and not told:
                on_wait(
                    f"no server has {req.describe()} free now; waiting up to {_fmt(timeout_s)} (Ctrl-C to stop)"
                )
                told = True
            time.sleep(min(next(waits), max(0.0, left)))


def _impossible_summary(req: Request, never: list) -> str:
    sizes = [info.get("gpu_count", 0) for _, _, info in never]
    if sizes and req.n > max(sizes):
        biggest = max(never, key=lambda t: t[2].get("gpu_count", 0))
        return (f"asks for {plural(req.n, 'GPU')} but the largest server of the pool has {max(sizes)} "
                f"({_host(biggest[0].url)}); a request's GPUs all come from one server")  # fmt: skip
    reasons = "; ".join(f"{_host(s.url)}: {r}" for s, r, _ in never[:4])
    return f"no server of the pool can ever serve {req.describe()} ({reasons})"


def _fmt(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:g}h"
    if seconds >= 60:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"


class Heartbeater:
    """Keeps a lease alive from a thread; reports the end of the lease (reclaim, expiry) once."""

    def __init__(
        self, client: PoolClient, server: ServerRef, lease: dict, on_end: Callable[[str, str], None]
    ):
        self.client, self.server, self.lease_id = client, server, lease["id"]
        self.interval = max(0.2, min(lease["ttl_s"] / 3, 10.0))
        self.on_end = on_end
        self.pids: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpuattach-heartbeat", daemon=True)
        self.warned = False

    def start(self, pids: list[int] | None = None) -> None:
        self.pids = list(pids or [])
        self._thread.start()

    def beat_now(self) -> None:
        self.client.heartbeat(self.server, self.lease_id, self.pids)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.beat_now()
                self.warned = False
            except LeaseEnded as exc:
                self.on_end(exc.body.get("state", "ended"), exc.body.get("reason") or exc.message)
                return
            except PoolClientError as exc:
                if not self.warned:
                    import sys

                    print(
                        f"gpuattach: warning: heartbeat failed ({exc.title}); retrying",
                        file=sys.stderr,
                        flush=True,
                    )
                    self.warned = True

    def stop(self) -> None:
        self._stop.set()


# --- one server, as the console sees it -------------------------------------------------------------


@dataclass(frozen=True)
class ServerClientOptions:
    timeout_s: float = 3.0  # per call: a dead server must not stall a refresh for long
    user_agent: str = "gpupool-console"
    ca_cert: str | None = None  # PEM of the CA that signed the servers' certificates (private CA)


class ServerClient:
    """One server of the pool, as the console uses it. Methods return the decoded JSON of the documented
    answers; failures are ``Unreachable`` or ``ApiError`` with the console's wording and hints."""

    def __init__(self, url: str, token: str | None = None, options: ServerClientOptions | None = None):
        self.url = normalize_url(url)
        self.token = token
        self.options = options or ServerClientOptions()
        self._tls = (
            ssl.create_default_context(cafile=self.options.ca_cert) if self.url.startswith("https") else None
        )

    def __repr__(self) -> str:
        return f"ServerClient({self.url!r}, token={'set' if self.token else 'none'})"

    # Reads ---------------------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return self._call("GET", "/v1/health", auth=False)

    def gpus(self) -> dict[str, Any]:
        return self._call("GET", "/v1/gpus")

    def leases(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/leases?all=true&state=active")["leases"]

    def clients(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/admin/clients").get("clients", [])

    def policy(self) -> dict[str, Any]:
        return self._call("GET", "/v1/admin/policy")

    # Operator actions (admin token) --------------------------------------------------------------
    def release(self, lease_id: str) -> dict[str, Any]:
        return self._call("DELETE", f"/v1/leases/{urllib.parse.quote(lease_id, safe='')}")

    def update_client(self, client: str, **fields: float | None) -> dict[str, Any]:
        """Set ``limit`` and/or ``idle_timeout_s`` of a client; None clears it back to the default."""
        return self._call("PUT", f"/v1/admin/clients/{urllib.parse.quote(client, safe='')}", fields)

    def update_policy(self, **fields: float | None) -> dict[str, Any]:
        return self._call("PUT", "/v1/admin/policy", fields)

    def migrate(self, lease_id: str, to: int, partition: int = 0) -> dict[str, Any]:
        """Move a running remote lease's partition to GPU `to` of its server; the lease with "migration"."""
        path = f"/v1/admin/leases/{urllib.parse.quote(lease_id, safe='')}/migrate"
        return self._call("POST", path, {"to": to, "partition": partition})

    def drain(self, gpu: int, *, undo: bool = False) -> dict[str, Any]:
        """Stop granting on GPU `gpu` and move its remote leases off (undo: take leases again)."""
        return self._call("DELETE" if undo else "POST", f"/v1/admin/gpus/{gpu}/drain")

    # Transport -----------------------------------------------------------------------------------
    def _call(self, method: str, path: str, body: dict | None = None, *, auth: bool = True) -> Any:
        headers = {"Accept": "application/json", "User-Agent": self.options.user_agent}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if auth and self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(
                request, timeout=self.options.timeout_s, context=self._tls
            ) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise self._answered_error(exc, method, path) from None
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
            tls = exc if isinstance(exc, ssl.SSLError) else getattr(exc, "reason", None)
            if isinstance(tls, ssl.SSLError):
                reason = f"TLS failed: {getattr(tls, 'verify_message', '') or tls}"
                raise Unreachable(
                    self.url,
                    reason,
                    title=f"{self.url} {reason}",
                    hint="for a private CA pass --ca-cert PATH (the CA that signed the server's certificate)",
                ) from None
            reason = getattr(exc, "reason", exc)
            raise Unreachable(
                self.url,
                str(reason),
                title=f"{self.url} unreachable: {reason}",
                hint="is gpupool-server running there? the console keeps retrying",
            ) from None
        try:
            return json.loads(raw) if raw else {}
        except ValueError:
            raise ApiError(
                self.url,
                200,
                {},
                title=f"{self.url}{path}: answer is not JSON",
                hint="is this URL a gpupool-server?",
            ) from None

    def _answered_error(self, exc: urllib.error.HTTPError, method: str, path: str) -> ApiError:
        try:
            payload = json.loads(exc.read() or b"{}")
        except ValueError:
            payload = {}
        if not isinstance(payload, dict):
            payload = {}
        message = payload.get("error") or f"HTTP {exc.code} {exc.reason}"
        hint = payload.get("hint", "")
        if exc.code in (401, 403):  # the server's hint speaks to gpuattach users; this is the console
            hint = "start the console with an admin token: --admin-token or GPUPOOL_ADMIN_TOKEN"
        if exc.code == 404 and not payload:
            hint = "is this URL a gpupool-server of this version?"
        return ApiError(
            self.url,
            exc.code,
            payload,
            title=f"{method} {path.split('?')[0]} on {self.url}: {message}",
            hint=hint,
        )
