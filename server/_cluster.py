"""Cluster mode: the pool's shared state on etcd (membership, tokens, policy, cluster-wide limits).

Keys (all JSON values):

    /gpupool/members/<name>                  this server's URL, host and GPUs; under its membership lease
    /gpupool/tokens/<sha256>                 a token's row (id, client, admin, created, expires, revoked)
    /gpupool/settings/policy                 policy overrides set through the admin API
    /gpupool/settings/clients/<client>       a client's own limit / idle timeout
    /gpupool/clients/<client>/rev            the client's marker: rewritten by every grant
    /gpupool/clients/<client>/leases/<id>    one live lease: client, fraction sum, server; under the
                                             granting server's membership lease

Why leases live under their client and not under /gpupool/leases/: one range read of
/gpupool/clients/<client>/ returns the client's lease records *and* its marker at one revision, so
the limit check costs one round trip and the grant's transaction ("marker unchanged since that read")
makes the read and the write one atomic step. Two servers granting to the same client at once: one
transaction wins, the other sees the marker moved, re-reads the sum and decides again — never past
the limit, whatever the timing. Partitions stay in the owning server's sqlite: a GPU belongs to one
server, so its free check needs no consensus.

A dead server stops renewing its membership lease; etcd then deletes its member key and its lease
records together, so its share leaves every client's sum. Reads that must work without quorum
(token check, policy, idle timeouts: what heartbeats and the reaper need) come from a local copy
refreshed every loop; decisions that change shared state (grants, policy edits) need etcd.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from dataclasses import dataclass

from server._errors import PoolError
from server._etcd import (
    EtcdClient,
    EtcdError,
    EtcdUnavailable,
    _b64,
    _kv,
    _prefix_end,
    compare_mod_revision,
    compare_version,
    op_delete,
    op_put,
)
from server._store import hash_token, new_token

log = logging.getLogger("gpupool.cluster")

ROOT = "/gpupool/"
MEMBERS = ROOT + "members/"
TOKENS = ROOT + "tokens/"
POLICY = ROOT + "settings/policy"
CLIENT_SETTINGS = ROOT + "settings/clients/"
CLIENTS = ROOT + "clients/"
DEFAULT_TTL_S = 10
QUORUM_HINT = (
    "running leases keep running; new requests work again once a majority of the etcd members is back"
)


class ClusterUnavailable(PoolError):
    status, code = 503, "no_quorum"

    def __init__(self, detail: str = ""):
        super().__init__("pool state unavailable: no etcd quorum", QUORUM_HINT)
        self.detail = detail


class ClusterBusy(PoolError):
    status, code = 503, "cluster_busy"


def _lease_key(client: str, lease_id: str) -> str:
    return f"{CLIENTS}{client}/leases/{lease_id}"


@dataclass(frozen=True)
class ClientSnapshot:
    """A client's cluster-wide holdings, read at one etcd revision."""

    client: str
    usage: float
    marker_rev: int  # mod revision of the client's marker; 0: no marker yet
    settings: dict | None  # the client's own limit / idle timeout, read at the same revision


class Cluster:
    """This server's view of the cluster. Thread-safe: used from the database thread and the loop."""

    def __init__(self, url: str, name: str, *, ttl_s: float = DEFAULT_TTL_S, timeout_s: float = 2.0):
        self.url = url
        self.name = name
        self.ttl_s = max(2, int(ttl_s))
        self.etcd = EtcdClient.from_url(url, timeout=timeout_s)
        self.lease_id = 0  # the membership lease; 0 while not registered
        self.ready = False  # registered and reconciled: grants may attach records
        self.serving = False  # set by a running server: no shared-state decision before `ready`
        self.available = False
        self.last_error = ""
        self._lock = threading.Lock()
        self._tokens: dict[str, dict] = {}
        self._policy: dict | None = None
        self._clients: dict[str, dict] = {}
        self._pending_deletes: set[str] = set()

    # --- plumbing -----------------------------------------------------------------------------------
    def _call(self, fn, *args, retry_s: float = 2.5, **kwargs):
        """Run one etcd call; ride out a leader election (retry briefly), else ClusterUnavailable."""
        deadline = time.monotonic() + (retry_s if self.available else 0)
        while True:
            try:
                result = fn(*args, **kwargs)
                self.available = True
                return result
            except EtcdUnavailable as exc:
                if time.monotonic() >= deadline:
                    self._lost(exc.detail)
                    raise ClusterUnavailable(exc.detail) from None
                time.sleep(0.2)

    def _lost(self, detail: str) -> None:
        if self.serving and (self.available or detail != self.last_error):  # the CLI prints its own line
            log.error("pool state unavailable: no etcd quorum (%s)", detail)
        self.available = False
        self.ready = False
        self.last_error = detail

    def status(self) -> dict:
        return {"url": self.url, "member": self.name, "quorum": self.available, "registered": self.ready}

    # --- membership ---------------------------------------------------------------------------------
    def register(self, info: dict) -> None:
        """Put this server's member key under a fresh lease (on start, and after the lease was lost)."""
        self.lease_id = self._call(self.etcd.lease_grant, self.ttl_s)
        self._call(self.etcd.put, MEMBERS + self.name, json.dumps(info), lease=self.lease_id)
        log.info("registered in the cluster as %s (membership TTL %ss)", self.name, self.ttl_s)

    def update_member(self, info: dict) -> None:
        """Put this server's member record anew under its membership lease (its drain changed); nothing
        while unregistered: the next registration puts the record as it is then."""
        if self.lease_id:
            self._call(self.etcd.put, MEMBERS + self.name, json.dumps(info), lease=self.lease_id)

    def keepalive(self) -> bool:
        """Renew the membership lease; False when it is gone (expired during an outage)."""
        if not self.lease_id:
            return False
        return self._call(self.etcd.lease_keepalive, self.lease_id) > 0

    def members(self) -> list[dict]:
        return [json.loads(kv.value) for kv in self._call(self.etcd.get_prefix, MEMBERS)]

    def leave(self) -> None:
        """Graceful stop: clients stop choosing this server; its lease records stay until the TTL, so
        a restart within it keeps its leases."""
        with contextlib.suppress(EtcdUnavailable, EtcdError):
            self.etcd.delete(MEMBERS + self.name)

    # --- local copies (what heartbeats and the reaper read without quorum) ---------------------------
    def refresh(self) -> None:
        tokens = {
            kv.key[len(TOKENS) :]: json.loads(kv.value) for kv in self._call(self.etcd.get_prefix, TOKENS)
        }
        settings = self._call(self.etcd.get_prefix, ROOT + "settings/")
        policy, clients = {}, {}
        for kv in settings:
            if kv.key == POLICY:
                policy = json.loads(kv.value)
            elif kv.key.startswith(CLIENT_SETTINGS):
                clients[kv.key[len(CLIENT_SETTINGS) :]] = json.loads(kv.value)
        with self._lock:
            self._tokens, self._policy, self._clients = tokens, policy, clients
        self.flush()

    # --- tokens (server._store_api.TokenStore, as server._store.Store) --------------------------------
    def find_token(self, token: str) -> dict | None:
        digest = hash_token(token)
        with self._lock:
            row = self._tokens.get(digest)
        if row is not None:
            return row
        kv = self._call(self.etcd.get, TOKENS + digest)  # made on another server since the last refresh
        if kv is None:
            return None
        row = json.loads(kv.value)
        with self._lock:
            self._tokens[digest] = row
        return row

    def create_token(
        self, client: str, *, admin: bool = False, expires_in_s: float | None = None, token: str | None = None
    ) -> dict:
        token, row = new_token(client, admin=admin, expires_in_s=expires_in_s, token=token)
        digest = row.pop("hash")  # the key of the record in etcd, not a field of it
        self.put_token(digest, row)
        return {**row, "hash": digest, "token": token}

    def put_token(self, digest: str, row: dict) -> None:
        self._call(self.etcd.put, TOKENS + digest, json.dumps(row))
        with self._lock:
            self._tokens[digest] = row

    def tokens(self) -> list[dict]:
        rows = [json.loads(kv.value) for kv in self._call(self.etcd.get_prefix, TOKENS)]
        return sorted(rows, key=lambda r: r["created"])

    def revoke_token(self, token_id: str) -> dict | None:
        for kv in self._call(self.etcd.get_prefix, TOKENS):
            row = json.loads(kv.value)
            if row["id"] != token_id:
                continue
            if row["revoked"] is None:
                row["revoked"] = time.time()
                self.put_token(kv.key[len(TOKENS) :], row)
            return row
        return None

    # --- policy and clients (server._store_api.SettingsStore, as server._store.Store) ----------------
    def policy_overrides(self) -> dict:
        with self._lock:
            policy = self._policy
        if policy is None:
            kv = self._call(self.etcd.get, POLICY)
            policy = json.loads(kv.value) if kv else {}
            with self._lock:
                self._policy = policy
        return dict(policy)

    def set_policy(self, changes: dict) -> None:
        def update(current: dict) -> dict:
            for key, value in changes.items():
                if value is None:
                    current.pop(key, None)
                else:
                    current[key] = value
            return current

        self._policy = self._update(POLICY, update)

    def client_row(self, client: str) -> dict | None:
        with self._lock:
            return self._clients.get(client)

    def client_names(self) -> set[str]:
        with self._lock:
            return set(self._clients)

    def set_client(self, client: str, changes: dict) -> None:
        row = self._update(
            CLIENT_SETTINGS + client, lambda cur: {"limit_gpus": None, "idle_timeout_s": None} | cur | changes
        )
        with self._lock:
            self._clients[client] = row

    def _update(self, key: str, change) -> dict:
        """Read-modify-write of one JSON key, conditioned on it being unchanged (retries on a race)."""
        for _ in range(20):
            kv = self._call(self.etcd.get, key)
            new = change(json.loads(kv.value) if kv else {})
            cond = compare_mod_revision(key, kv.mod_revision) if kv else compare_version(key, 0)
            if self._call(self.etcd.txn, [cond], [op_put(key, json.dumps(new))]):
                return new
        raise ClusterBusy(f"{key} changed under every attempt", "try again")

    # --- leases and cluster-wide limits --------------------------------------------------------------
    def client_snapshot(self, client: str) -> ClientSnapshot:
        """The client's lease records, marker and own settings, read in one transaction (one revision),
        so the limit a grant checks is as fresh as the sum it checks it against."""
        if self.serving and not self.ready:  # fail fast while the loop waits for quorum
            raise ClusterUnavailable(self.last_error or "not registered in the cluster yet")
        prefix, settings_key = f"{CLIENTS}{client}/", CLIENT_SETTINGS + client
        ranges = [
            {"requestRange": {"key": _b64(prefix), "range_end": _prefix_end(prefix)}},
            {"requestRange": {"key": _b64(settings_key)}},
        ]
        data = self._call(self.etcd.call, "/v3/kv/txn", {"compare": [], "success": ranges, "failure": []})
        held, own = ([_kv(i) for i in r["response_range"].get("kvs", [])] for r in data["responses"])
        usage, marker = 0.0, 0
        for kv in held:
            if kv.key == prefix + "rev":
                marker = kv.mod_revision
            else:
                usage += float(json.loads(kv.value)["fraction"])
        settings = json.loads(own[0].value) if own else None
        with self._lock:
            if settings is None:
                self._clients.pop(client, None)
            else:
                self._clients[client] = settings
        return ClientSnapshot(client, usage, marker, settings)

    def record_grant(self, snap: ClientSnapshot, lease_id: str, fraction: float) -> bool:
        """Store the lease's record iff the client's marker is unchanged since ``snap`` was read."""
        if not self.ready:
            raise ClusterUnavailable("this server is not registered in the cluster yet")
        marker = f"{CLIENTS}{snap.client}/rev"
        cond = (
            compare_mod_revision(marker, snap.marker_rev) if snap.marker_rev else compare_version(marker, 0)
        )
        record = {"id": lease_id, "client": snap.client, "fraction": fraction, "server": self.name}
        key = _lease_key(snap.client, lease_id)
        ops = [op_put(marker, lease_id), op_put(key, json.dumps(record), self.lease_id)]
        try:
            if self._call(self.etcd.txn, [cond], ops):
                return True
            # Lost the race, or won it on a member whose answer timed out and the client re-sent the
            # transaction elsewhere (the re-send then fails its comparison): the record tells which.
            return self._call(self.etcd.get, key) is not None
        except EtcdError as exc:  # "requested lease not found": our membership expired under us
            self.ready = False
            raise ClusterUnavailable(f"membership lease lost ({exc}); re-registering") from None
        except ClusterUnavailable:
            # The transaction may have applied before the answer was lost; the grant is refused, so
            # its record must go (deleted when etcd answers again; deleting nothing is harmless).
            with self._lock:
                self._pending_deletes.add(key)
            raise

    def adopt_lease(self, client: str, lease_id: str, fraction: float) -> None:
        """A lease that moved here from another member: its record is this server's from now on (under this
        server's membership lease, so it goes with this server)."""
        record = {"id": lease_id, "client": client, "fraction": fraction, "server": self.name}
        self._call(self.etcd.put, _lease_key(client, lease_id), json.dumps(record), lease=self.lease_id)

    def forget_lease(self, client: str, lease_id: str) -> None:
        """Mark an ended lease's record for deletion; ``flush`` deletes it off the database thread
        (the release answer waits for it; without quorum it waits for the reconnect)."""
        with self._lock:
            self._pending_deletes.add(_lease_key(client, lease_id))

    def flush(self) -> None:
        """Delete the records of ended leases; never fails (what is left stays pending)."""
        with self._lock:
            pending = sorted(self._pending_deletes)
        if not pending or not self.available:  # without quorum: the loop's refresh flushes on return
            return
        try:
            self._call(self.etcd.txn, [], [op_delete(k) for k in pending], retry_s=0.5)
        except ClusterUnavailable:
            return
        with self._lock:
            self._pending_deletes.difference_update(pending)

    def own_records(self) -> dict[str, dict]:
        out = {}
        for kv in self._call(self.etcd.get_prefix, CLIENTS):
            if "/leases/" in kv.key:
                rec = json.loads(kv.value)
                if rec.get("server") == self.name:
                    out[rec["id"]] = rec
        return out

    def reconcile(self, live: list[dict], startup: bool) -> list[str]:
        """Re-attach the records of this server's live leases to its (new) membership lease.

        After a restart (``startup``) a live local lease whose record is gone was given back to the
        cluster while this server was away (its membership lease expired): it is returned as stale,
        to be ended. After a quorum loss the server kept running and its leases are legitimately
        alive: their records are put back. Records of leases no longer live here are deleted.
        """
        records = self.own_records()
        stale = []
        live_ids = set()
        for lease in live:
            if startup and lease["id"] not in records:
                stale.append(lease["id"])
                continue
            live_ids.add(lease["id"])
            rec = {
                "id": lease["id"],
                "client": lease["client"],
                "fraction": lease["fraction"],
                "server": self.name,
            }
            self._call(
                self.etcd.put, _lease_key(lease["client"], lease["id"]), json.dumps(rec), lease=self.lease_id
            )
        for lid, rec in records.items():
            if lid not in live_ids:
                self._call(self.etcd.delete, _lease_key(rec["client"], lid))
        self.ready = True
        return stale


def open_cluster(url: str, name: str, ttl_s: float = DEFAULT_TTL_S) -> Cluster:
    """A Cluster for ``etcd://h1:2379,h2:2379``, or a BadRequest naming what is wrong with the URL."""
    from server._errors import BadRequest

    if not url.startswith("etcd://") or not url.removeprefix("etcd://").strip(","):
        raise BadRequest(
            f"cluster {url!r} is not an etcd URL", "write etcd://host1:2379,host2:2379,host3:2379"
        )
    try:
        return Cluster(url, name, ttl_s=ttl_s)
    except ValueError as exc:
        raise BadRequest(f"cluster {url!r}: {exc}", "write etcd://host1:2379,host2:2379,host3:2379") from None


def member_name(hostname: str, port: int) -> str:
    return f"{hostname}:{port}"


async def cluster_loop(st, cluster: Cluster, member_info) -> None:
    """Keep the membership alive, refresh the local copies, re-register and reconcile after a loss."""
    pool = st.pool
    startup = True
    interval = max(0.5, cluster.ttl_s / 4)
    while not st.stopping.is_set():
        try:
            alive = await asyncio.to_thread(cluster.keepalive) if cluster.ready else False
            if not alive:
                await asyncio.to_thread(cluster.register, member_info())
                # On the database thread: no grant or release interleaves with the reconcile.
                stale = await st.db(_reconcile, pool, cluster, startup)
                for lid in stale:
                    log.info(
                        "lease %s ended: the cluster gave its share back while this server was away", lid
                    )
                if not startup:
                    log.info("etcd quorum is back: re-registered and re-put the records of live leases")
                startup = False
            await asyncio.to_thread(cluster.refresh)
        except (ClusterUnavailable, EtcdError) as exc:
            cluster.ready = False
            log.debug("cluster loop: %s", exc)
        except Exception:
            log.exception("cluster loop failed; retrying")
        await asyncio.sleep(interval)


def _reconcile(pool, cluster: Cluster, startup: bool) -> list[str]:
    stale = cluster.reconcile(pool.cluster_records(), startup)
    now = time.time()
    for lid in stale:
        pool.end(lid, "expired", "the server was away longer than its cluster membership TTL", now)
    return stale
