"""The lease logic of one server: fit, grant, heartbeat, release, expiry, idle reclaim, policy, auth.

Every method runs on the server's single database thread, and every decision that changes
capacity runs inside one ``BEGIN IMMEDIATE`` transaction of the store, so two requests racing for
the last partition cannot both win. Nothing here blocks on the network or on processes; the
caller (``server._app``) does that around these calls (starting workers, measuring activity).
"""

from __future__ import annotations

import functools
import json
import math
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
from msgspec import UNSET as _UNSET

from collector.durations import format_duration
from collector.words import plural
from server import ranges
from server._config import ServerConfig
from server._errors import (
    BadRequest,
    Busy,
    Forbidden,
    Gone,
    Impossible,
    LimitExceeded,
    NotFound,
    StorageFull,
    TokenExpired,
    Unauthorized,
)
from server._events import EventLog
from server._filters import gpu_matches, parse_filters, server_matches
from server._inventory import GIB, MIB, Gpu, Inventory
from server._procs import alive_pids, pid_identity, with_descendants
from server._store_api import LeaseStore, SettingsStore, TokenStore
from server.api import LeaseRequest
from server.workers import USAGE_FILE as WORKER_USAGE_FILE

if TYPE_CHECKING:
    from server._cluster import Cluster

EPS = 1e-9


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def human_bytes(n: int) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n // MIB} MiB"


@dataclass(frozen=True)
class Caller:
    client: str
    admin: bool


@dataclass(frozen=True)
class Placement:
    gpus: tuple[Gpu, ...]
    mem_bytes: tuple[int, ...]
    fractions: tuple[float, ...]
    score: float  # free memory left on the chosen GPUs, as a fraction of their total (lower = tighter)


def _job(req: LeaseRequest) -> dict | None:
    """The batch job a request names, as stored with the lease (only the fields given)."""
    if req.job is None:
        return None
    return {k: v for k, v in msgspec.to_builtins(req.job).items() if v is not None}


class Pool:
    def __init__(
        self,
        store: LeaseStore,
        inventory: Inventory,
        config: ServerConfig,
        events: EventLog,
        mps=None,
        cluster: Cluster | None = None,
    ):
        # Leases and partitions stay in the embedded store; in cluster mode tokens, policy, client
        # settings and the limit sums live in etcd (server._store_api says who keeps what).
        self.store = store
        self.cluster = cluster
        self.tokens: TokenStore = cluster if cluster is not None else store
        self.settings: SettingsStore = cluster if cluster is not None else store
        self.inv = inventory
        self.cfg = config
        self.events = events
        self.mps = mps  # server._mps.MpsDaemon or None
        self.gpus = {g.index: g for g in inventory.gpus}
        self.port = config.port
        self.tls = bool(config.tls_cert)
        self.started = time.time()
        self.live: dict[int, dict] = {}  # newest NVML sample per GPU index (real GPUs only)
        self.draining: set[int] = set()  # GPUs no new lease goes to (gpupool-server drain), until undone
        self.server_draining = False  # no new lease at all (gpupool-server drain of the whole server)
        # Leases another server is moving here, not committed (server._lease_transfer): the cluster's record
        # of each is still its server's, so this one neither puts nor deletes it.
        self.receiving: set[str] = set()
        # Leases that moved to another server (its URL): heartbeats here are told where; the cluster's record
        # of each is that server's now.
        self.moved_away: dict[str, str] = {}
        # newest process rows per GPU index: pid -> (memory bytes, busy share or None)
        self.live_procs: dict[int, dict[int, tuple[int | None, float | None]]] = {}

    # --- identity -----------------------------------------------------------------------------------
    def server_info(self) -> dict:
        return {
            "hostname": self.inv.hostname,
            "addr": self.inv.addr,
            "port": self.port,
            "version": _version(),
            "simulated": self.inv.simulated,
            "mps": self.mps is not None,
            "tls": self.tls,
            "driver_version": self.inv.driver_version,
            "cuda_version": self.inv.cuda_version,
            "gpu_count": len(self.inv.gpus),
            "started_at": iso(self.started),
            "draining": self.server_draining,
        }

    # --- auth ---------------------------------------------------------------------------------------
    def authenticate(self, header: str | None, now: float) -> Caller:
        if not header:
            raise Unauthorized(
                "missing token", "send 'Authorization: Bearer <token>' (gpupool-server token create)"
            )
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("malformed Authorization header", "send 'Authorization: Bearer <token>'")
        row = self.tokens.find_token(token.strip())
        if row is None:
            raise Unauthorized(
                "invalid token", "check the token in client.toml / --token; ask the admin for one"
            )
        if row["revoked"] is not None:
            raise Unauthorized(f"token revoked at {iso(row['revoked'])}", "ask the admin for a new token")
        if row["expires"] is not None and row["expires"] <= now:
            raise TokenExpired(f"token expired at {iso(row['expires'])}", "ask the admin for a new token")
        return Caller(client=row["client"], admin=bool(row["admin"]))

    # --- policy -------------------------------------------------------------------------------------
    def policy(self) -> dict:
        """The policy in force: the config's values, with the admin's stored overrides on top. A stored
        value outside its range (``server.ranges``: written by an older version, or by hand) is not
        applied; ``stored_problems`` names it, and the server logs it at start."""
        eff = {key: getattr(self.cfg, key) for key in ranges.POLICY}
        eff.update(
            {k: v for k, v in self.settings.policy_overrides().items() if _applies(ranges.POLICY, k, v)}
        )
        return eff

    def set_policy(self, update) -> dict:
        changes = {k: getattr(update, k) for k in ranges.POLICY if getattr(update, k) is not _UNSET}
        self.settings.set_policy(changes)
        return self.policy()

    def stored_problems(self) -> list[str]:
        """Stored policy and client settings that are out of range and therefore not applied."""
        out = []
        for key, value in self.settings.policy_overrides().items():
            if key in ranges.POLICY and (why := ranges.problem(ranges.POLICY, key, value)):
                out.append(f"policy {why}; not applied")
        names = self.store.known_clients() | (self.cluster.client_names() if self.cluster else set())
        for name in sorted(names):
            row = self.settings.client_row(name)
            for column, key in _CLIENT_COLUMNS.items():
                if row and (why := ranges.problem(ranges.CLIENT, key, row[column])):
                    out.append(f"client {name}: {why}; not applied")
        return out

    def client_settings(self, client: str, policy: dict | None = None, snapshot=None) -> dict:
        """The client's limit and idle timeout and where each comes from. In cluster mode a grant passes
        the ``snapshot`` it read the client's sum with, so both come from one etcd revision."""
        policy = policy or self.policy()
        if snapshot is not None and snapshot.client == client:
            row = snapshot.settings
        else:
            row = self.settings.client_row(client)
        file = self.cfg.clients.get(client)
        limit, limit_src = policy["default_limit"], "default"
        idle, idle_src = policy["default_idle_timeout_s"], "default"
        if file and file.limit is not None:
            limit, limit_src = file.limit, "client"
        if file and file.idle_timeout_s is not None:
            idle, idle_src = file.idle_timeout_s, "client"
        if row and _applies(ranges.CLIENT, "limit", row["limit_gpus"]):
            limit, limit_src = row["limit_gpus"], "client"
        if row and _applies(ranges.CLIENT, "idle_timeout_s", row["idle_timeout_s"]):
            idle, idle_src = row["idle_timeout_s"], "client"
        return {
            "client": client,
            "limit": limit,
            "limit_source": limit_src,
            "idle_timeout_s": idle or None,
            "idle_timeout_source": idle_src,
        }

    def usage(self, client: str, snapshot=None) -> float:
        if self.cluster is not None:  # cluster-wide: every server's leases of this client
            if snapshot is not None and snapshot.client == client:
                return snapshot.usage
            return self.cluster.client_snapshot(client).usage
        return self.store.client_usage(client)

    def clients(self) -> list[dict]:
        names = self.store.known_clients() | set(self.cfg.clients)
        tokens = [r for r in self.tokens.tokens() if r["revoked"] is None]
        if self.cluster is not None:
            names |= self.cluster.client_names() | {r["client"] for r in tokens}
        policy = self.policy()
        out = []
        for name in sorted(names):
            c = self.client_settings(name, policy)
            c["usage"] = round(self.usage(name), 6)
            c["leases_active"] = self.store.active_lease_count(name)
            c["workers_active"] = self.store.active_lease_count(name, remote=True)
            c["tokens"] = sum(1 for r in tokens if r["client"] == name)
            out.append(c)
        return out

    def set_client(self, client: str, update) -> dict:
        changes = {"limit_gpus": update.limit, "idle_timeout_s": update.idle_timeout_s}
        self.settings.set_client(client, {k: v for k, v in changes.items() if v is not _UNSET})
        return next(c for c in self.clients() if c["client"] == client)

    # --- capacity and placement ---------------------------------------------------------------------
    def used_bytes(self) -> dict[int, int]:
        return self.store.used_bytes()

    def gpus_view(self) -> list[dict]:
        used = self.used_bytes()
        parts: dict[int, list[dict]] = {}
        for r in self.store.active_partitions():
            parts.setdefault(r["gpu_index"], []).append(
                {
                    "lease_id": r["lease_id"],
                    "client": r["client"],
                    "mem_bytes": r["mem_bytes"],
                    "fraction": r["fraction"],
                    "sm_share": r["sm_share"],
                }
            )
        out = []
        for g in self.inv.gpus:
            free = max(0, g.mem_total_bytes - used.get(g.index, 0))
            out.append(
                {
                    "index": g.index,
                    "uuid": g.uuid,
                    "name": g.name,
                    "mem_total_bytes": g.mem_total_bytes,
                    "mem_free_bytes": free,
                    "free_fraction": round(free / g.mem_total_bytes, 6) if g.mem_total_bytes else 0.0,
                    "compute_capability": g.compute_capability,
                    "partitions": parts.get(g.index, []),
                    "live": self.live.get(g.index),
                    "draining": self.server_draining or g.index in self.draining,
                }
            )
        return out

    def _need(self, req: LeaseRequest, gpu: Gpu) -> int:
        if req.mem_mib is not None:
            return max(req.mem_mib * MIB, _floor_bytes(gpu))
        return math.ceil(req.fraction * gpu.mem_total_bytes)

    def _size_text(self, req: LeaseRequest) -> str:
        return f"{req.mem_mib} MiB" if req.mem_mib is not None else f"{req.fraction:g} of its memory"

    def _check_request(self, req: LeaseRequest) -> list:
        if (req.fraction is None) == (req.mem_mib is None):
            raise BadRequest(
                "give exactly one partition size: fraction (-p) or mem_mib (-m)",
                "e.g. {'n': 1, 'fraction': 0.25} or {'n': 1, 'mem_mib': 8192}",
            )
        if req.local and req.remote:
            raise BadRequest("a lease is either local or remote, not both", "drop one of local/remote")
        filters = parse_filters(req.filters)
        if req.ttl_s is not None and req.ttl_s > self.cfg.max_ttl_s:
            raise BadRequest(
                f"ttl_s {req.ttl_s:g} is above this server's maximum of {self.cfg.max_ttl_s:g}s",
                "heartbeat more often with a shorter TTL",
            )
        return filters

    def place(self, req: LeaseRequest, filters: list, used: dict[int, int]) -> Placement:
        """Choose n separate GPUs for the request, or raise Impossible (never fits) / Busy (not now)."""
        n, total = req.n, len(self.inv.gpus)
        if n > total:
            raise Impossible(
                f"asks for {plural(n, 'GPU')}; this server ({self.inv.hostname}) has {total}",
                "a request's GPUs all come from one server: ask for fewer, or split the work over several requests",
                gpu_count=total,
            )
        failed = server_matches(self.inv, filters)
        if failed is not None:
            raise Impossible(
                f"filter {failed} excludes this server ({self.inv.hostname})", "loosen the filter"
            )
        matching = [g for g in self.inv.gpus if gpu_matches(g, filters)]
        able = [g for g in matching if self._need(req, g) <= g.mem_total_bytes]
        if len(able) < n:
            detail = f"{len(matching)} of its {plural(total, 'GPU')} match the filters"
            if len(able) < len(matching):
                detail += f", {len(able)} of them can hold {self._size_text(req)}"
            raise Impossible(
                f"asks for {plural(n, 'GPU')}; on this server ({self.inv.hostname}) {detail}",
                "loosen the filters or ask for fewer or smaller partitions",
            )
        if self.server_draining:  # checked after what never fits: that answer is the more useful one
            raise Busy(
                f"this server ({self.inv.hostname}) is draining: it takes no new leases",
                "gpuattach asks the pool's other servers and retries (--timeout bounds the wait)",
            )
        free = {
            g.index: 0 if g.index in self.draining else g.mem_total_bytes - used.get(g.index, 0) for g in able
        }
        fitting = [g for g in able if self._need(req, g) <= free[g.index]]
        if len(fitting) < n:
            raise Busy(
                f"{n} GPU(s) with {self._size_text(req)} free are not available now: "
                f"{len(fitting)} of {len(able)} suitable GPUs on {self.inv.hostname} have room",
                "gpuattach waits and retries (--timeout bounds the wait)",
            )
        # Best fit: the GPUs that will have the least memory left, so large holes stay whole for large
        # requests; ties go to the lowest index, so placement is predictable.
        chosen = sorted(fitting, key=lambda g: (free[g.index] - self._need(req, g), g.index))[:n]
        chosen.sort(key=lambda g: g.index)
        if req.mem_mib is not None:
            mems = [self._need(req, g) for g in chosen]  # never below the smallest partition of its GPU
        else:
            # Every partition of a lease gets the same memory: p of the smallest chosen GPU, as the
            # Bitfusion FAQ says (programs using several GPUs expect them alike).
            smallest = min(g.mem_total_bytes for g in chosen)
            mems = [math.ceil(req.fraction * smallest)] * n
        fractions = tuple(min(1.0, m / g.mem_total_bytes) for m, g in zip(mems, chosen, strict=True))
        left = sum(free[g.index] - m for g, m in zip(chosen, mems, strict=True))
        score = left / sum(g.mem_total_bytes for g in chosen)
        return Placement(tuple(chosen), tuple(mems), fractions, round(score, 6))

    def _check_limits(self, client: str, req: LeaseRequest, needed: float, snapshot=None) -> None:
        self._check_caps(client, req)
        limit = self.client_settings(client, snapshot=snapshot)["limit"]
        if limit is None:
            return
        usage = self.usage(client, snapshot)
        if usage + needed > limit + EPS:
            raise LimitExceeded(
                f"client {client} holds {usage:.2f} GPUs of its limit of {limit:.2f}; this request needs {needed:.2f} more",
                "release a lease (gpuattach release LEASE) or ask the admin to raise the limit",
                usage=round(usage, 6),
                limit=limit,
            )

    def _check_caps(self, client: str, req: LeaseRequest) -> None:
        """The policy's caps on one client's leases and running workers on this server: a worker is a
        process (and a CUDA context) per remote lease, so tiny leases must not multiply them."""
        policy = self.policy()
        caps = [("max_leases_per_client", "leases", False)]
        if req.remote:
            caps.append(("max_workers_per_client", "remote workers", True))
        for key, what, remote in caps:
            held, cap = self.store.active_lease_count(client, remote=remote), policy[key]
            if held >= cap:
                raise LimitExceeded(
                    f"client {client} runs {held} {what} on {self.inv.hostname}, its cap ({key} = {cap})",
                    "release a lease (gpuattach release LEASE) or ask the admin to raise " + key,
                    cap=key,
                )

    def _estimated_fraction(self, req: LeaseRequest, filters: list) -> float:
        if req.fraction is not None:
            return req.n * req.fraction
        sizes = [g.mem_total_bytes for g in self.inv.gpus if gpu_matches(g, filters)] or [1]
        return req.n * min(1.0, max(req.mem_mib * MIB / max(sizes), ranges.MIN_FRACTION))

    def _decide(self, caller: Caller, req: LeaseRequest, filters: list, snapshot=None) -> Placement:
        """Where the request goes now, or why not: Impossible, LimitExceeded, Busy (in that order).

        An impossible request is impossible whatever the limit; a request over the limit fails now
        rather than after waiting for capacity it could never use.
        """
        try:
            placement = self.place(req, filters, self.used_bytes())
        except Busy:
            self._check_limits(caller.client, req, self._estimated_fraction(req, filters), snapshot)
            raise
        self._check_limits(caller.client, req, sum(placement.fractions), snapshot)
        return placement

    def prefetch(self, client: str):
        """Cluster mode: the client's cluster-wide holdings, read *before* queueing for the database
        thread, so that thread spends no etcd round trip on reads (None with the embedded store)."""
        return self.cluster.client_snapshot(client) if self.cluster is not None else None

    def fit(self, caller: Caller, req: LeaseRequest, snapshot=None) -> dict:
        filters = self._check_request(req)
        out = {
            "fits_now": False,
            "code": "ok",
            "reason": None,
            "score": None,
            "placement": [],
            "server": self.server_info(),
        }
        try:
            placement = self._decide(caller, req, filters, snapshot)
        except (Impossible, Busy, LimitExceeded) as exc:
            out.update(code=exc.code, reason=exc.title, hint=exc.hint)
            return out
        if not self.store.condition()["writable"]:  # it fits, but a grant could not be stored now
            out.update(
                code="storage_full",
                reason=f"this server's state disk is full ({self.inv.hostname}): no new leases until it has room",
                hint="gpuattach asks the other servers and retries this one later",
            )
            return out
        out.update(fits_now=True, score=placement.score, placement=[g.index for g in placement.gpus])
        return out

    # --- leases -------------------------------------------------------------------------------------
    def grant(self, caller: Caller, req: LeaseRequest, now: float, snapshot=None) -> dict:
        filters = self._check_request(req)
        pids = pid_identity(req.pids) if req.pids else []
        if req.pids and not pids:
            raise BadRequest(
                f"none of the processes {req.pids} runs on this server's host",
                "local leases need local processes",
            )
        for attempt in range(50):
            try:
                lease_id = self._grant_once(caller, req, filters, pids, now, snapshot)
                break
            except _Conflict:  # another server granted to this client meanwhile: re-read its sum
                snapshot = None
                time.sleep(min(0.05, 0.002 * 2**attempt) * secrets.randbelow(100) / 100)
        else:
            from server._cluster import ClusterBusy

            raise ClusterBusy(
                f"client {caller.client}'s cluster-wide usage kept changing during 50 attempts",
                "gpuattach retries; many concurrent requests of one client cause this",
            )
        lease = self.lease(lease_id)
        self.events.record("grant", lease, now)
        return lease

    def _grant_once(
        self, caller: Caller, req: LeaseRequest, filters: list, pids: list, now: float, snapshot=None
    ) -> str:
        """One attempt: decide and store in one sqlite transaction; in cluster mode it commits only if
        the etcd transaction (client's marker unchanged since its sum was read) succeeded."""
        if self.cluster is not None:
            snapshot = snapshot or self.cluster.client_snapshot(caller.client)
        lease_id, recorded = None, False
        try:
            with self.store.transaction():
                placement = self._decide(caller, req, filters, snapshot)
                policy = self.policy()
                ttl = min(req.ttl_s or policy["lease_ttl_s"], self.cfg.max_ttl_s)
                lease_id = "lease-" + secrets.token_hex(6)
                max_end = now + policy["max_lease_s"] if policy["max_lease_s"] else None
                env = self.lease_env(lease_id, placement, req.sm_share)
                lease = {"id": lease_id, "client": caller.client, "label": req.label, "created": now,
                         "expires": now + ttl, "max_end": max_end, "ttl_s": ttl, "last_active": now,
                         "local": req.local, "remote": req.remote, "pids": pids, "env": env,
                         "job": _job(req)}  # fmt: skip
                partitions = [
                    {
                        "gpu_index": g.index,
                        "gpu_uuid": g.uuid,
                        "mem_bytes": m,
                        "fraction": f,
                        "sm_share": req.sm_share,
                    }
                    for g, m, f in zip(placement.gpus, placement.mem_bytes, placement.fractions, strict=True)
                ]
                self.store.insert_lease(lease, partitions)
                if snapshot is not None:
                    recorded = self.cluster.record_grant(
                        snapshot, lease_id, round(sum(placement.fractions), 6)
                    )
                    if not recorded:
                        raise _Conflict
        except (Impossible, Busy, LimitExceeded) as exc:
            self.events.deny(caller.client, exc.title, now, _job(req))
            raise
        except StorageFull:
            if recorded:  # etcd counts a lease the disk could not store: take its share back
                self.cluster.forget_lease(caller.client, lease_id)
            raise
        return lease_id

    def lease_env(self, lease_id: str, placement: Placement, sm_share: float | None) -> dict[str, str]:
        """The environment a local run of the lease sets: its GPUs and, with MPS, the partition limits."""
        env = {
            "GPUPOOL_LEASE_ID": lease_id,
            "CUDA_VISIBLE_DEVICES": ",".join(g.uuid for g in placement.gpus),
            "GPUPOOL_MEM_LIMIT_BYTES": ",".join(str(m) for m in placement.mem_bytes),
        }
        if self.mps is not None:
            env.update(self.mps.client_env())
            # Ordinals as the process sees them: CUDA_VISIBLE_DEVICES renumbers the lease's GPUs 0..n-1.
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(
                f"{i}={m // MIB}M" for i, m in enumerate(placement.mem_bytes)
            )
            if sm_share is not None:
                env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, round(sm_share * 100)))
        return env

    def _row(self, lease_id: str):
        row = self.store.lease_row(lease_id)
        if row is None:
            raise NotFound(f"no lease {lease_id} on {self.inv.hostname}", "gpuattach list shows your leases")
        return row

    def lease(self, lease_id: str, *, owner_view: bool = True, usage: bool = False) -> dict:
        row = self._row(lease_id)
        parts = self.store.partitions([lease_id]).get(lease_id, [])
        out = self._lease_json(row, parts, owner_view)
        if usage:
            for position, part in enumerate(out["partitions"]):
                part["usage"] = self._usage(row, position, part["gpu_index"])
        return out

    def _usage(self, row, position: int, gpu_index: int) -> dict:
        """What the lease itself uses of one of its GPUs, for the NVML view of its runs (docs/remote.md).

        Memory: what the lease's worker holds (its usage file) for a remote lease, else the memory of
        the lease's processes in the newest NVML sample. Busy share: the sum of those processes' shares
        in that sample (None where the driver does not report per-process utilization, or no GPU is
        sampled). Temperature, power and clocks are the GPU's own.
        """
        worker = row["worker"] or {}
        mem = _worker_usage(worker.get("state_dir"), position)
        util = None
        procs = self.live_procs.get(gpu_index)
        if procs is not None:
            mine = with_descendants(row["pids"]) | ({worker["pid"]} if worker.get("pid") else set())
            held = [v for pid, v in procs.items() if pid in mine]
            if mem is None:
                mem = sum(m or 0 for m, _ in held)
            if all(u is not None for _, u in held):
                util = min(1.0, sum(u for _, u in held))
        live = self.live.get(gpu_index) or {}
        clock = live.get("sm_clock_hz")
        return {
            "mem_used_bytes": mem,
            "util_gpu": util,
            "temperature_c": live.get("temperature_c"),
            "power_w": live.get("power_w"),
            "sm_clock_mhz": None if clock is None else round(clock / 1e6),
        }

    def _lease_json(self, row, parts, owner_view: bool) -> dict:
        partitions = []
        for p in parts:
            g = self.gpus.get(p["gpu_index"])
            partitions.append(
                {
                    "gpu_index": p["gpu_index"],
                    "gpu_uuid": p["gpu_uuid"],
                    "gpu_name": g.name if g else "unknown",
                    "compute_capability": g.compute_capability if g else None,
                    "pci_bus_id": g.pci_bus_id if g else None,
                    "nvlinks": [
                        {"link": n.link, "remote_pci_bus_id": n.remote_pci_bus_id, "version": n.version}
                        for n in (g.nvlinks if g else ())
                    ],
                    "mem_total_bytes": g.mem_total_bytes if g else None,
                    "mem_bytes": p["mem_bytes"],
                    "fraction": p["fraction"],
                    "sm_share": p["sm_share"],
                }
            )
        worker = row["worker"]
        out = {
            "id": row["id"],
            "client": row["client"],
            "state": row["state"],
            "reason": row["reason"],
            "label": row["label"],
            "job": row["job"],
            "created_at": iso(row["created"]),
            "ended_at": iso(row["ended"]),
            "expires_at": iso(row["expires"]),
            "max_end_at": iso(row["max_end"]),
            "ttl_s": row["ttl_s"],
            "idle_timeout_s": self.client_settings(row["client"])["idle_timeout_s"],
            "last_active_at": iso(row["last_active"]),
            "local": bool(row["local"]),
            "remote": bool(row["remote"]),
            "pids": [p for p, _ in row["pids"]],
            "simulated": self.inv.simulated,
            "mps": self.mps is not None,
            "server": self.server_info(),
            "partitions": partitions,
            "fraction_total": round(sum(p["fraction"] for p in partitions), 6),
            "mem_bytes_total": sum(p["mem_bytes"] for p in partitions),
        }
        if owner_view:
            out["env"] = row["env"]
            # What the owner's shim needs: where, the secret, the certificate to pin, the local socket.
            keys = ("host", "port", "secret", "tls_sha256", "local")
            out["worker"] = (
                {**{k: worker.get(k, "") for k in keys}, "lacks": worker.get("lacks", [])} if worker else None
            )
        return out

    def _owned(self, caller: Caller, lease_id: str):
        row = self._row(lease_id)
        if row["client"] != caller.client and not caller.admin:
            raise Forbidden(f"lease {lease_id} belongs to another client", "use your own lease id")
        return row

    def get(self, caller: Caller, lease_id: str) -> dict:
        row = self._owned(caller, lease_id)
        return self.lease(lease_id, owner_view=row["client"] == caller.client, usage=True)

    def list(self, caller: Caller, everyone: bool, state: str) -> list[dict]:
        if everyone and not caller.admin:
            raise Forbidden("only an admin token lists every client's leases", "drop all=true")
        rows = self.store.lease_rows(None if everyone else caller.client, state)
        parts = self.store.partitions(r["id"] for r in rows)
        return [self._lease_json(r, parts.get(r["id"], []), r["client"] == caller.client) for r in rows]

    def heartbeat(self, caller: Caller, lease_id: str, pids: list[int], now: float) -> dict:
        with self.store.transaction():
            row = self._owned(caller, lease_id)
            if row["state"] != "active":
                moved = {"moved_to": self.moved_away[lease_id]} if lease_id in self.moved_away else {}
                raise Gone(
                    f"lease {lease_id} was {row['state']}: {row['reason']}",
                    "heartbeat the server it moved to" if moved else "request a new lease",
                    state=row["state"],
                    reason=row["reason"],
                    **moved,
                )
            known = row["pids"]
            if pids:
                fresh = pid_identity(pids)
                if not fresh:
                    raise BadRequest(
                        f"none of the processes {pids} runs on this server's host",
                        "local leases need local processes",
                    )
                known = sorted(set(alive_pids(known)) | set(fresh))
            self.store.renew_lease(lease_id, now + _ttl(row), known)
        return self.lease(lease_id)

    def release(self, caller: Caller, lease_id: str, now: float) -> tuple[dict, bool]:
        """Release; returns the lease and whether this call ended it (False: it had already ended)."""
        row = self._owned(caller, lease_id)
        own = row["client"] == caller.client
        ended = self.end(
            lease_id,
            "released",
            "released by its client" if own else f"released by admin {caller.client}",
            now,
        )
        return self.lease(lease_id, owner_view=own), ended is not None

    def end(self, lease_id: str, state: str, reason: str, now: float) -> dict | None:
        """End an active lease (state released/expired/reclaimed); None when it had already ended."""
        with self.store.transaction():
            row = self._row(lease_id)
            if row["state"] != "active":
                return None
            self.store.end_lease(lease_id, state, reason, now)
        if self.cluster is not None and lease_id not in self.receiving and lease_id not in self.moved_away:
            self.cluster.forget_lease(row["client"], lease_id)
        self.receiving.discard(lease_id)
        lease = self.lease(lease_id)
        self.events.record(
            {"released": "release", "expired": "expire", "reclaimed": "reclaim"}[state], lease, now
        )
        return lease

    def set_worker(self, lease_id: str, worker: dict) -> None:
        with self.store.transaction():
            self.store.set_worker(lease_id, worker)

    def stored_worker(self, lease_id: str) -> dict | None:
        """The worker recorded for a lease: after a restart, its pid is all there is to stop it by."""
        return self.store.lease_worker(lease_id)

    # --- liveness -----------------------------------------------------------------------------------
    def active_leases(self) -> list[dict]:
        """What the activity probe needs: id, local pids, remote flag, GPUs."""
        rows = self.store.lease_rows(None, "active")
        parts = self.store.partitions(r["id"] for r in rows)
        return [{"id": r["id"], "pids": r["pids"], "remote": bool(r["remote"]),
                 "gpus": [p["gpu_index"] for p in parts.get(r["id"], [])], "worker": r["worker"]}
                for r in rows]  # fmt: skip

    def reap(self, now: float, active_at: dict[str, float], dead_workers: dict[str, str]) -> list[dict]:
        """End leases past their TTL, their maximum length, their idle timeout, or whose worker died."""
        ended = []
        policy = self.policy()
        for row in self.store.lease_rows(None, "active"):
            lid = row["id"]
            if lid in dead_workers:
                ended.append(self.end(lid, "expired", dead_workers[lid], now))
                continue
            if row["expires"] <= now:
                reason = f"no heartbeat for {format_duration(row['ttl_s'])} (the client stopped or lost the network)"
                ended.append(self.end(lid, "expired", reason, now))
                continue
            if row["max_end"] is not None and row["max_end"] <= now:
                length = format_duration(row["max_end"] - row["created"])
                ended.append(self.end(lid, "expired", f"reached the maximum lease length of {length}", now))
                continue
            last = max(row["last_active"], active_at.get(lid, 0.0))
            if last > row["last_active"]:
                with self.store.transaction():
                    self.store.set_last_active(lid, last)
            idle = self.client_settings(row["client"], policy)["idle_timeout_s"]
            if idle and now - last >= idle:
                reason = (
                    f"idle for {format_duration(now - last)}: its GPUs did no work for the idle timeout of "
                    f"client {row['client']} ({format_duration(idle)})"
                )
                ended.append(self.end(lid, "reclaimed", reason, now))
        return [e for e in ended if e is not None]

    def purge_ended(self, now: float) -> int:
        """Forget leases that ended more than ``ended_retention_s`` ago (their events stay in telemetry)."""
        cutoff = now - self.cfg.ended_retention_s
        with self.store.transaction():
            return self.store.purge_ended(cutoff)

    def recover(self, now: float) -> list[str]:
        """After a restart: give live leases a fresh TTL, end those whose processes are gone."""
        notes = []
        for row in self.store.lease_rows(None, "active"):
            lid, pids, worker = row["id"], row["pids"], row["worker"]
            if pids and not alive_pids(pids):
                self.end(lid, "expired", "its processes are gone (found when the server restarted)", now)
                notes.append(f"{lid}: processes gone, ended")
            elif row["remote"] and not (worker and alive_pids([(worker["pid"], worker.get("create_time"))])):
                self.end(lid, "expired", "its remote worker is gone (found when the server restarted)", now)
                notes.append(f"{lid}: worker gone, ended")
            else:
                # Clients could not heartbeat while the server was down: give each a fresh TTL.
                with self.store.transaction():
                    self.store.extend_after_restart(lid, now + _ttl(row), now)
                notes.append(f"{lid}: kept ({row['client']})")
        return notes

    def cluster_records(self) -> list[dict]:
        """Live leases as cluster records (id, client, fraction sum), for the cluster's reconcile."""
        return [r for r in self.store.live_fractions() if r["id"] not in self.receiving]

    def active_count(self) -> int:
        return self.store.active_lease_count()


_CLIENT_COLUMNS = {"limit_gpus": "limit", "idle_timeout_s": "idle_timeout_s"}  # stored column -> API field


def _applies(table: dict, key: str, value: object) -> bool:
    """A stored setting takes effect: set (not None), known, and within its range."""
    return value is not None and key in table and ranges.problem(table, key, value) is None


def _ttl(row) -> float:
    """A lease's TTL, never below the floor (a lease stored by a version that took any TTL)."""
    return max(row["ttl_s"], ranges.TTL.lo)


def _floor_bytes(gpu: Gpu) -> int:
    """The smallest partition of ``gpu``: what any lease of it reserves at least."""
    return math.ceil(ranges.MIN_FRACTION * gpu.mem_total_bytes)


class _Conflict(Exception):
    """The etcd grant transaction lost a race; the sqlite transaction rolls back and grant retries."""


@functools.cache
def _version() -> str:
    try:
        from importlib.metadata import version

        return version("gpupool")
    except Exception:
        return "0+unknown"


def _worker_usage(state_dir: str | None, position: int) -> int | None:
    """The bytes a remote lease's worker holds on its `position`-th GPU (its usage file), None if unknown."""
    if not state_dir:
        return None
    try:
        used = json.loads((Path(state_dir) / WORKER_USAGE_FILE).read_text())
        return int(used[position])
    except (OSError, ValueError, IndexError, TypeError):
        return None
