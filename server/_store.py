"""The server's embedded, transactional store: leases, partitions, clients, policy, tokens (sqlite3).

Every SQL statement of the pool lives here; ``server._store_api`` declares what the pool calls.

Why sqlite: nothing to install or start, and a transaction per decision makes double booking
impossible: every grant runs in ``BEGIN IMMEDIATE`` (one writer at a time, also across processes
such as ``gpupool-server token create`` run beside a live server), reads the free capacity and
inserts the partitions before it commits. WAL mode lets readers run beside the writer.
``synchronous=NORMAL`` in WAL mode survives a killed process (``kill -9``); a power loss can drop
the last commits, which for leases means clients re-request.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import sqlite3
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from server._errors import PoolError

SCHEMA = """
CREATE TABLE IF NOT EXISTS leases (
    id TEXT PRIMARY KEY,
    client TEXT NOT NULL,
    state TEXT NOT NULL,            -- active, released, expired, reclaimed
    reason TEXT,
    label TEXT,
    created REAL NOT NULL,
    ended REAL,
    expires REAL NOT NULL,          -- heartbeat deadline
    max_end REAL,                   -- hard end from the maximum lease length
    ttl_s REAL NOT NULL,
    last_active REAL NOT NULL,
    local INTEGER NOT NULL,
    remote INTEGER NOT NULL,
    pids TEXT NOT NULL DEFAULT '[]',  -- [[pid, create_time], ...] of local processes
    worker TEXT,                      -- {"host", "port", "secret", "pid", "create_time"}
    env TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS leases_state ON leases(state);
CREATE TABLE IF NOT EXISTS partitions (
    lease_id TEXT NOT NULL REFERENCES leases(id),
    gpu_index INTEGER NOT NULL,
    gpu_uuid TEXT NOT NULL,
    mem_bytes INTEGER NOT NULL,
    fraction REAL NOT NULL,
    sm_share REAL,
    active INTEGER NOT NULL DEFAULT 1,  -- copy of the lease's state, so capacity is one indexed read
    PRIMARY KEY (lease_id, gpu_index)
);
CREATE INDEX IF NOT EXISTS partitions_active ON partitions(active, gpu_index);
CREATE TABLE IF NOT EXISTS clients (
    name TEXT PRIMARY KEY,
    limit_gpus REAL,                -- NULL: the default applies
    idle_timeout_s REAL             -- NULL: the default applies; 0: never reclaimed
);
CREATE TABLE IF NOT EXISTS policy (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tokens (
    id TEXT PRIMARY KEY,
    client TEXT NOT NULL,
    hash TEXT NOT NULL UNIQUE,      -- sha256 of the token; the token itself is never stored
    admin INTEGER NOT NULL,
    created REAL NOT NULL,
    expires REAL,
    revoked REAL
);
"""


def hash_token(token: str) -> str:
    # A plain hash is enough: tokens are 256 random bits, not passwords a dictionary could guess.
    return hashlib.sha256(token.encode()).hexdigest()


def new_token(
    client: str, *, admin: bool = False, expires_in_s: float | None = None, token: str | None = None
) -> tuple[str, dict]:
    """A token (new, or the one given, to use one token on many servers) and the row stored for it."""
    token = token or "gp_" + secrets.token_urlsafe(32)
    now = time.time()
    row = {
        "id": "tok_" + secrets.token_hex(4),
        "client": client,
        "hash": hash_token(token),
        "admin": int(admin),
        "created": now,
        "expires": now + expires_in_s if expires_in_s else None,
        "revoked": None,
    }
    return token, row


class Store:
    """The sqlite store: a ``TokenStore``, ``SettingsStore`` and ``LeaseStore`` (server._store_api)."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        # One connection, used by one thread at a time (the server's database thread).
        self.db = sqlite3.connect(path, timeout=10, isolation_level=None, check_same_thread=False)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA foreign_keys=ON")
        self.db.executescript(SCHEMA)  # idempotent: IF NOT EXISTS everywhere

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def close(self) -> None:
        self.db.close()

    # --- settings (server._store_api.SettingsStore) ------------------------------------------------
    def policy_overrides(self) -> dict[str, float | None]:
        return {r["key"]: json.loads(r["value"]) for r in self.db.execute("SELECT key, value FROM policy")}

    def set_policy(self, changes: dict[str, float | None]) -> None:
        with self.transaction():
            for key, value in changes.items():
                if value is None:
                    self.db.execute("DELETE FROM policy WHERE key = ?", (key,))
                else:
                    self.db.execute(
                        "INSERT INTO policy(key, value) VALUES (?, ?)"
                        " ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                        (key, json.dumps(value)),
                    )

    def client_row(self, client: str) -> sqlite3.Row | None:
        return self.db.execute("SELECT * FROM clients WHERE name = ?", (client,)).fetchone()

    def set_client(self, client: str, changes: dict[str, float | None]) -> None:
        with self.transaction():
            self.db.execute("INSERT OR IGNORE INTO clients(name) VALUES (?)", (client,))
            for column in ("limit_gpus", "idle_timeout_s"):  # never a column name from the caller
                if column in changes:
                    self.db.execute(
                        f"UPDATE clients SET {column} = ? WHERE name = ?", (changes[column], client)
                    )

    def client_overrides(self) -> list[sqlite3.Row]:
        """Clients with a limit or idle timeout of their own (what ``cluster migrate`` copies)."""
        return self.db.execute(
            "SELECT * FROM clients WHERE limit_gpus IS NOT NULL OR idle_timeout_s IS NOT NULL"
        ).fetchall()

    # --- tokens (server._store_api.TokenStore) -----------------------------------------------------
    def create_token(
        self, client: str, *, admin: bool = False, expires_in_s: float | None = None, token: str | None = None
    ) -> dict:
        """A new token for ``client`` (or store the hash of ``token``, to use one token on many servers)."""
        token, row = new_token(client, admin=admin, expires_in_s=expires_in_s, token=token)
        with self.transaction():
            self.db.execute(
                "INSERT INTO tokens VALUES (:id, :client, :hash, :admin, :created, :expires, :revoked)", row
            )
            self.db.execute("INSERT OR IGNORE INTO clients(name) VALUES (?)", (client,))
        return {**row, "token": token}

    def find_token(self, token: str) -> sqlite3.Row | None:
        return self.db.execute("SELECT * FROM tokens WHERE hash = ?", (hash_token(token),)).fetchone()

    def tokens(self) -> list[sqlite3.Row]:
        return self.db.execute("SELECT * FROM tokens ORDER BY created").fetchall()

    def revoke_token(self, token_id: str) -> sqlite3.Row | None:
        with self.transaction():
            self.db.execute(
                "UPDATE tokens SET revoked = ? WHERE id = ? AND revoked IS NULL", (time.time(), token_id)
            )
            return self.db.execute("SELECT * FROM tokens WHERE id = ?", (token_id,)).fetchone()

    # --- writing leases (server._store_api.LeaseStore) ---------------------------------------------
    def insert_lease(self, lease: dict, partitions: list[dict]) -> None:
        row = {**lease, "local": int(lease["local"]), "remote": int(lease["remote"]),
               "pids": json.dumps(lease["pids"]), "env": json.dumps(lease["env"])}  # fmt: skip
        self.db.execute(
            "INSERT INTO leases(id, client, state, label, created, expires, max_end, ttl_s, last_active,"
            " local, remote, pids, env) VALUES (:id, :client, 'active', :label, :created, :expires, :max_end,"
            " :ttl_s, :last_active, :local, :remote, :pids, :env)",
            row,
        )
        self.db.executemany(
            "INSERT INTO partitions(lease_id, gpu_index, gpu_uuid, mem_bytes, fraction, sm_share)"
            " VALUES (:lease_id, :gpu_index, :gpu_uuid, :mem_bytes, :fraction, :sm_share)",
            [{"lease_id": lease["id"], **p} for p in partitions],
        )
        self.db.execute("INSERT OR IGNORE INTO clients(name) VALUES (?)", (lease["client"],))

    def end_lease(self, lease_id: str, state: str, reason: str, ended: float) -> None:
        self.db.execute(
            "UPDATE leases SET state = ?, reason = ?, ended = ? WHERE id = ?",
            (state, reason, ended, lease_id),
        )
        self.db.execute("UPDATE partitions SET active = 0 WHERE lease_id = ?", (lease_id,))

    def renew_lease(self, lease_id: str, expires: float, pids: list[tuple]) -> None:
        self.db.execute(
            "UPDATE leases SET expires = ?, pids = ? WHERE id = ?", (expires, json.dumps(pids), lease_id)
        )

    def set_last_active(self, lease_id: str, last_active: float) -> None:
        self.db.execute("UPDATE leases SET last_active = ? WHERE id = ?", (last_active, lease_id))

    def extend_after_restart(self, lease_id: str, expires: float, now: float) -> None:
        self.db.execute(
            "UPDATE leases SET expires = MAX(expires, ?), last_active = MAX(last_active, ?) WHERE id = ?",
            (expires, now, lease_id),
        )

    def set_worker(self, lease_id: str, worker: dict) -> None:
        self.db.execute("UPDATE leases SET worker = ? WHERE id = ?", (json.dumps(worker), lease_id))

    def purge_ended(self, cutoff: float) -> int:
        old = "SELECT id FROM leases WHERE state != 'active' AND ended < ?"
        self.db.execute(f"DELETE FROM partitions WHERE lease_id IN ({old})", (cutoff,))
        return self.db.execute("DELETE FROM leases WHERE state != 'active' AND ended < ?", (cutoff,)).rowcount

    # --- reading leases ----------------------------------------------------------------------------
    def lease_row(self, lease_id: str) -> dict | None:
        row = self.db.execute("SELECT * FROM leases WHERE id = ?", (lease_id,)).fetchone()
        return _lease(row) if row is not None else None

    def lease_worker(self, lease_id: str) -> dict | None:
        row = self.db.execute("SELECT worker FROM leases WHERE id = ?", (lease_id,)).fetchone()
        return json.loads(row[0]) if row and row[0] else None

    def lease_rows(self, client: str | None, state: str) -> list[dict]:
        where, args = [], []
        if client is not None:
            where.append("client = ?")
            args.append(client)
        if state == "active":
            where.append("state = 'active'")
        elif state == "ended":
            where.append("state != 'active'")
        sql = (
            "SELECT * FROM leases" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY created"
        )
        return [_lease(r) for r in self.db.execute(sql, args).fetchall()]

    def partitions(self, lease_ids: Iterable[str]) -> dict[str, list[sqlite3.Row]]:
        ids, out = list(lease_ids), {}
        for chunk in range(0, len(ids), 500):  # below sqlite's limit on bound parameters
            sub = ids[chunk : chunk + 500]
            q = f"SELECT * FROM partitions WHERE lease_id IN ({','.join('?' * len(sub))}) ORDER BY gpu_index"
            for p in self.db.execute(q, sub):
                out.setdefault(p["lease_id"], []).append(p)
        return out

    def active_lease_count(self, client: str | None = None, *, remote: bool = False) -> int:
        sql, args = "SELECT COUNT(*) FROM leases WHERE state = 'active'", ()
        if client is not None:
            sql, args = sql + " AND client = ?", (client,)
        if remote:
            sql += " AND remote = 1"
        return self.db.execute(sql, args).fetchone()[0]

    def live_fractions(self) -> list[dict]:
        rows = self.db.execute(
            "SELECT l.id, l.client, COALESCE(SUM(p.fraction), 0) AS fraction FROM leases l"
            " LEFT JOIN partitions p ON p.lease_id = l.id WHERE l.state = 'active' GROUP BY l.id"
        )
        return [{"id": r["id"], "client": r["client"], "fraction": round(r["fraction"], 6)} for r in rows]

    # --- capacity ----------------------------------------------------------------------------------
    def used_bytes(self) -> dict[int, int]:
        rows = self.db.execute(
            "SELECT gpu_index, SUM(mem_bytes) FROM partitions WHERE active = 1 GROUP BY gpu_index"
        )
        return {r[0]: r[1] for r in rows}

    def active_partitions(self) -> list[sqlite3.Row]:
        return self.db.execute(
            "SELECT p.*, l.client FROM partitions p JOIN leases l ON l.id = p.lease_id WHERE p.active = 1"
        ).fetchall()

    def client_usage(self, client: str) -> float:
        row = self.db.execute(
            "SELECT COALESCE(SUM(p.fraction), 0) FROM partitions p JOIN leases l ON l.id = p.lease_id "
            "WHERE p.active = 1 AND l.client = ?",
            (client,),
        ).fetchone()
        return float(row[0])

    def known_clients(self) -> set[str]:
        names = {r[0] for r in self.db.execute("SELECT name FROM clients")}
        return names | {r[0] for r in self.db.execute("SELECT DISTINCT client FROM leases")}


def _lease(row: sqlite3.Row) -> dict:
    """A lease row with its JSON columns decoded (the pool never sees how they are stored)."""
    out = dict(row)
    out["pids"] = [tuple(p) for p in json.loads(row["pids"])]
    out["worker"] = json.loads(row["worker"]) if row["worker"] else None
    out["env"] = json.loads(row["env"])
    return out


def open_store(state_dir: Path) -> Store:
    """The store of a state directory; a PoolError with a hint when it cannot be opened."""
    try:
        return Store(state_dir / "pool.sqlite")
    except (OSError, sqlite3.Error) as exc:
        raise PoolError(
            f"cannot open the state directory {state_dir}: {exc}", "pass --state-dir to a writable directory"
        ) from None
