"""The server's embedded, transactional store: leases, partitions, clients, policy, tokens (sqlite3).

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
from collections.abc import Iterator
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

    # --- policy overrides -------------------------------------------------------------------------
    def policy_overrides(self) -> dict[str, float | None]:
        return {r["key"]: json.loads(r["value"]) for r in self.db.execute("SELECT key, value FROM policy")}

    def set_policy(self, key: str, value: float | None) -> None:
        if value is None:
            self.db.execute("DELETE FROM policy WHERE key = ?", (key,))
        else:
            self.db.execute(
                "INSERT INTO policy(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (key, json.dumps(value)),
            )

    # --- tokens -----------------------------------------------------------------------------------
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


def open_store(state_dir: Path) -> Store:
    """The store of a state directory; a PoolError with a hint when it cannot be opened."""
    try:
        return Store(state_dir / "pool.sqlite")
    except (OSError, sqlite3.Error) as exc:
        raise PoolError(
            f"cannot open the state directory {state_dir}: {exc}", "pass --state-dir to a writable directory"
        ) from None
