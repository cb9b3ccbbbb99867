"""The server's embedded, transactional store: leases, partitions, clients, policy, tokens (sqlite3).

Every SQL statement of the pool lives here; ``server._store_api`` declares what the pool calls.

Why sqlite: nothing to install or start, and a transaction per decision makes double booking
impossible: every grant runs in ``BEGIN IMMEDIATE`` (one writer at a time, also across processes
such as ``gpupool-server token create`` run beside a live server), reads the free capacity and
inserts the partitions before it commits. WAL mode lets readers run beside the writer.
``synchronous=NORMAL`` in WAL mode survives a killed process (``kill -9``); a power loss can drop
the last commits, which for leases means clients re-request.

A full disk (docs/pool.md, "A full disk"): a write the disk refuses is one of two kinds. What keeps a
running lease true — its end (release, expiry, reclaim), a heartbeat's new deadline, its last
activity, its worker — is *kept*: it stays in memory (``_unsaved``), every read applies it (a
released lease reads released and its partitions stop counting), and every later transaction writes
it first, so it lands as soon as the disk has room. Everything else (a grant, a token, a setting,
forgetting old leases) is refused with ``StorageFull`` (507) and nothing of it is stored. A store
that cannot even open normally (SQLite's shared-memory index needs room) opens with an exclusive lock
and no shared memory, reading everything, and reopens normally once a write passes.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import secrets
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from server._errors import PoolError, StorageFull

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
    env TEXT NOT NULL DEFAULT '{}',
    job TEXT                          -- {"scheduler", "id", "account", "user"} of a batch job, or NULL
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


# The lease columns whose changes are kept in memory when the disk refuses them (see the docstring).
KEPT_COLUMNS = frozenset({"state", "reason", "ended", "expires", "pids", "last_active", "worker"})
SQLITE_IOERR, SQLITE_FULL = 10, 13
LOW_SPACE_BYTES = 1 << 20  # an I/O error on a disk with less room than this is the disk being full


def disk_full(exc: BaseException, folder: Path) -> bool:
    """Whether a failed write means the disk has no room (so the same write passes once space is freed)."""
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
        if code == SQLITE_FULL:
            return True
        if code != SQLITE_IOERR:  # SQLite reports a shared-memory page it could not allocate as I/O
            return False
    elif isinstance(exc, OSError):
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
    else:
        return False
    try:
        return shutil.disk_usage(folder).free < LOW_SPACE_BYTES
    except OSError:
        return False


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

    def __init__(self, path: Path, report: Callable[[str], None] | None = None):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.folder = path.parent
        self.report = report  # where the full-disk condition is told as it comes and goes (the server's log)
        self.full_since: float | None = None  # when a write last found the disk full (None: writable)
        self.problem: str | None = None
        self._unsaved: dict[str, dict] = {}  # lease id -> kept column values not yet written
        self._memory_only: sqlite3.Error | None = None  # this transaction's writes failed: memory only
        self._strict = False  # this transaction wrote something that cannot be kept in memory
        self.exclusive = False
        try:
            # One connection, used by one thread at a time (the server's database thread).
            self.db = self._connect(exclusive=False)
        except sqlite3.Error as exc:
            if not disk_full(exc, self.folder):
                raise
            self.db = self._connect(exclusive=True)
            self.exclusive = True
            self._note_full(exc)

    def _connect(self, *, exclusive: bool) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=10, isolation_level=None, check_same_thread=False)
        try:
            db.row_factory = sqlite3.Row
            if exclusive:
                # No shared-memory WAL index (a full disk cannot allocate it): the index lives in this
                # connection's memory, and no other process opens the database meanwhile.
                db.execute("PRAGMA locking_mode=EXCLUSIVE")
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA foreign_keys=ON")
            try:
                db.executescript(SCHEMA)  # idempotent: IF NOT EXISTS everywhere
                _add_columns(db)
            except sqlite3.Error as exc:
                # A full disk where the schema is already there: nothing needed writing.
                have = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
                if not disk_full(exc, self.folder) or not {"leases", "partitions", "tokens"} <= have:
                    raise
            db.execute("SELECT count(*) FROM leases").fetchone()  # the first read opens the WAL index
        except BaseException:
            db.close()
            raise
        return db

    # --- transactions and the full-disk condition ----------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction. Changes kept in memory from earlier failures are written first. On a
        full disk: StorageFull if it wrote anything that cannot be kept, else its kept changes wait."""
        self.db.execute("BEGIN IMMEDIATE")
        self._memory_only, self._strict = None, False
        before = {lease: dict(columns) for lease, columns in self._unsaved.items()}
        try:
            for lease_id, columns in list(self._unsaved.items()):
                self._write_kept(lease_id, columns)
            yield self.db
        except BaseException as exc:
            self._rollback()
            if isinstance(exc, sqlite3.Error) and disk_full(exc, self.folder):
                self._note_full(exc)
                raise self.full_error() from None
            self._unsaved = before  # a refused decision keeps nothing it recorded
            raise
        try:
            if self._memory_only is not None:
                raise self._memory_only
            self.db.execute("COMMIT")
        except sqlite3.Error as exc:
            self._rollback()
            if exc is not self._memory_only and not disk_full(exc, self.folder):
                raise
            self._note_full(exc)
            if self._strict:
                raise self.full_error() from None
            return  # only kept changes: they wait in memory, and every read applies them
        self._unsaved.clear()
        self._note_writable()

    def _rollback(self) -> None:
        # SQLite may have rolled back already (it does on a full disk): then there is nothing to undo.
        if self.db.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self.db.execute("ROLLBACK")

    def _keep(self, lease_id: str, **columns) -> None:
        """A change that must not be lost: written in this transaction, and kept until it is."""
        self._unsaved.setdefault(lease_id, {}).update(columns)
        self._write_kept(lease_id, columns)

    def _write_kept(self, lease_id: str, columns: dict) -> None:
        if self._memory_only is not None:
            return  # the disk refused this transaction already: the rest waits in memory too
        names = [c for c in columns if c in KEPT_COLUMNS]  # never a column name from elsewhere
        try:
            self.db.execute(
                f"UPDATE leases SET {', '.join(f'{c} = ?' for c in names)} WHERE id = ?",
                [*(columns[c] for c in names), lease_id],
            )
            if columns.get("state", "active") != "active":
                self.db.execute("UPDATE partitions SET active = 0 WHERE lease_id = ?", (lease_id,))
        except sqlite3.Error as exc:
            if not disk_full(exc, self.folder):
                raise
            self._memory_only = exc

    def _must_write(self) -> None:
        """This transaction writes something that cannot wait in memory (a grant, a token, a setting)."""
        self._strict = True
        if self._memory_only is not None:
            raise self.full_error()

    def full_error(self) -> StorageFull:
        return StorageFull(
            f"the disk of the state directory {self.folder} is full: nothing new can be stored",
            "free space on that disk; running leases go on, and their releases and heartbeats are kept "
            "until it has room; GET /v1/health shows the state",
        )

    def _note_full(self, exc: BaseException) -> None:
        self.problem = f"disk full ({exc})"
        if self.full_since is None:
            self.full_since = time.time()
            if self.report:
                self.report(
                    f"state disk full: {self.folder} refused a write ({exc}); serving read-only: no new "
                    "leases, tokens or settings until space is freed; releases and heartbeats are kept in "
                    "memory and written when it has room"
                )

    def _note_writable(self) -> None:
        if self.full_since is None:
            return
        took = time.time() - self.full_since
        self.full_since, self.problem = None, None
        if self.report:
            self.report(f"state disk has room again after {took:.0f}s: every kept change is written")

    def _reopen_shared(self) -> None:
        """Back from the exclusive connection of a full-disk start to a normal one (other processes,
        such as ``gpupool-server token create``, can use the database again). The shared-memory index
        needs more room than a write: until it fits, the exclusive connection stays."""
        self.db.close()
        try:
            self.db = self._connect(exclusive=False)
            self.exclusive = False
        except sqlite3.Error:
            self.db = self._connect(exclusive=True)

    def retry_writes(self, probe: bool = False) -> bool:
        """While the disk is (or was last seen) full, or with ``probe``: write what waits in memory and
        find out by one small real write whether the disk has room. True when the store is writable."""
        if self.full_since is None and not self._unsaved and not probe and not self.exclusive:
            return True
        with self.transaction():
            if self._memory_only is None:
                try:
                    # A real write that changes nothing: rewrite the header's user_version.
                    version = self.db.execute("PRAGMA user_version").fetchone()[0]
                    self.db.execute(f"PRAGMA user_version = {int(version)}")
                except sqlite3.Error as exc:
                    if not disk_full(exc, self.folder):
                        raise
                    self._memory_only = exc
        if self.exclusive and self.full_since is None:
            self._reopen_shared()
        return self.full_since is None

    def condition(self) -> dict:
        """Whether the store can write, since when not, and how many lease changes wait in memory."""
        return {
            "writable": self.full_since is None,
            "problem": self.problem,
            "full_since": self.full_since,
            "unsaved_leases": sorted(self._unsaved),
        }

    def close(self) -> None:
        self.db.close()

    # --- settings (server._store_api.SettingsStore) ------------------------------------------------
    def policy_overrides(self) -> dict[str, float | None]:
        return {r["key"]: json.loads(r["value"]) for r in self.db.execute("SELECT key, value FROM policy")}

    def set_policy(self, changes: dict[str, float | None]) -> None:
        with self.transaction():
            self._must_write()
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
            self._must_write()
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
            self._must_write()
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
            self._must_write()
            self.db.execute(
                "UPDATE tokens SET revoked = ? WHERE id = ? AND revoked IS NULL", (time.time(), token_id)
            )
            return self.db.execute("SELECT * FROM tokens WHERE id = ?", (token_id,)).fetchone()

    # --- writing leases (server._store_api.LeaseStore) ---------------------------------------------
    def insert_lease(self, lease: dict, partitions: list[dict]) -> None:
        self._must_write()
        row = {**lease, "local": int(lease["local"]), "remote": int(lease["remote"]),
               "pids": json.dumps(lease["pids"]), "env": json.dumps(lease["env"]),
               "job": json.dumps(lease["job"]) if lease.get("job") else None}  # fmt: skip
        self.db.execute(
            "INSERT INTO leases(id, client, state, label, created, expires, max_end, ttl_s, last_active,"
            " local, remote, pids, env, job) VALUES (:id, :client, 'active', :label, :created, :expires,"
            " :max_end, :ttl_s, :last_active, :local, :remote, :pids, :env, :job)",
            row,
        )
        self.db.executemany(
            "INSERT INTO partitions(lease_id, gpu_index, gpu_uuid, mem_bytes, fraction, sm_share)"
            " VALUES (:lease_id, :gpu_index, :gpu_uuid, :mem_bytes, :fraction, :sm_share)",
            [{"lease_id": lease["id"], **p} for p in partitions],
        )
        self.db.execute("INSERT OR IGNORE INTO clients(name) VALUES (?)", (lease["client"],))

    # What keeps a running lease true is kept in memory when the disk refuses it (``_keep``).
    def end_lease(self, lease_id: str, state: str, reason: str, ended: float) -> None:
        self._keep(lease_id, state=state, reason=reason, ended=ended)

    def renew_lease(self, lease_id: str, expires: float, pids: list[tuple]) -> None:
        self._keep(lease_id, expires=expires, pids=json.dumps(pids))

    def set_last_active(self, lease_id: str, last_active: float) -> None:
        self._keep(lease_id, last_active=last_active)

    def extend_after_restart(self, lease_id: str, expires: float, now: float) -> None:
        row = self.lease_row(lease_id)
        if row is not None:
            self._keep(
                lease_id, expires=max(row["expires"], expires), last_active=max(row["last_active"], now)
            )

    def set_worker(self, lease_id: str, worker: dict) -> None:
        self._keep(lease_id, worker=json.dumps(worker))

    def move_partition(self, lease_id: str, gpu_from: int, gpu_to: int, gpu_uuid: str) -> None:
        self._must_write()
        self.db.execute(
            "UPDATE partitions SET gpu_index = ?, gpu_uuid = ? WHERE lease_id = ? AND gpu_index = ? AND active = 1",
            (gpu_to, gpu_uuid, lease_id, gpu_from),
        )

    def forget_ended(self, lease_id: str) -> None:
        """Delete one ended lease's rows now: its id is recorded again (a lease moving here once more)."""
        self._must_write()
        ended = "SELECT id FROM leases WHERE id = ? AND state != 'active'"
        self.db.execute(f"DELETE FROM partitions WHERE lease_id IN ({ended})", (lease_id,))
        self.db.execute("DELETE FROM leases WHERE id = ? AND state != 'active'", (lease_id,))

    def purge_ended(self, cutoff: float) -> int:
        self._must_write()
        old = "SELECT id FROM leases WHERE state != 'active' AND ended < ?"
        self.db.execute(f"DELETE FROM partitions WHERE lease_id IN ({old})", (cutoff,))
        return self.db.execute("DELETE FROM leases WHERE state != 'active' AND ended < ?", (cutoff,)).rowcount

    # --- reading leases ----------------------------------------------------------------------------
    def _with_unsaved(self, row: sqlite3.Row) -> dict:
        """A lease row as it is: what the table holds, with the changes still waiting in memory."""
        return {**dict(row), **self._unsaved.get(row["id"], {})}

    def _ended_unsaved(self) -> str:
        """Leases ended in memory only, as a JSON list for ``NOT IN (SELECT value FROM json_each(?))``:
        their partitions no longer count, although the table still says active."""
        return json.dumps([i for i, c in self._unsaved.items() if c.get("state", "active") != "active"])

    def lease_row(self, lease_id: str) -> dict | None:
        row = self.db.execute("SELECT * FROM leases WHERE id = ?", (lease_id,)).fetchone()
        return _lease(self._with_unsaved(row)) if row is not None else None

    def lease_worker(self, lease_id: str) -> dict | None:
        row = self.lease_row(lease_id)
        return row["worker"] if row else None

    def lease_rows(self, client: str | None, state: str) -> list[dict]:
        where, args = [], []
        if client is not None:
            where.append("client = ?")
            args.append(client)
        # With changes waiting in memory the state is decided after applying them, not by the table.
        if state == "active" and not self._unsaved:
            where.append("state = 'active'")
        elif state == "ended" and not self._unsaved:
            where.append("state != 'active'")
        sql = (
            "SELECT * FROM leases" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY created"
        )
        rows = [_lease(self._with_unsaved(r)) for r in self.db.execute(sql, args).fetchall()]
        if state in ("active", "ended"):
            rows = [r for r in rows if (r["state"] == "active") == (state == "active")]
        return rows

    def partitions(self, lease_ids: Iterable[str]) -> dict[str, list[sqlite3.Row]]:
        ids, out = list(lease_ids), {}
        for chunk in range(0, len(ids), 500):  # below sqlite's limit on bound parameters
            sub = ids[chunk : chunk + 500]
            q = f"SELECT * FROM partitions WHERE lease_id IN ({','.join('?' * len(sub))}) ORDER BY gpu_index"
            for p in self.db.execute(q, sub):
                out.setdefault(p["lease_id"], []).append(p)
        return out

    def active_lease_count(self, client: str | None = None, *, remote: bool = False) -> int:
        # Leases ended while the disk was full (kept in memory, _ended_unsaved) no longer count.
        sql, args = (
            "SELECT COUNT(*) FROM leases WHERE state = 'active' AND id NOT IN (SELECT value FROM json_each(?))",
            (self._ended_unsaved(),),
        )
        if client is not None:
            sql, args = sql + " AND client = ?", (*args, client)
        if remote:
            sql += " AND remote = 1"
        return self.db.execute(sql, args).fetchone()[0]

    def live_fractions(self) -> list[dict]:
        rows = self.db.execute(
            "SELECT l.id, l.client, COALESCE(SUM(p.fraction), 0) AS fraction FROM leases l"
            " LEFT JOIN partitions p ON p.lease_id = l.id WHERE l.state = 'active' AND l.id NOT IN (SELECT value FROM json_each(?))"
            " GROUP BY l.id",
            (self._ended_unsaved(),),
        )
        return [{"id": r["id"], "client": r["client"], "fraction": round(r["fraction"], 6)} for r in rows]

    # --- capacity ----------------------------------------------------------------------------------
    def used_bytes(self) -> dict[int, int]:
        rows = self.db.execute(
            "SELECT gpu_index, SUM(mem_bytes) FROM partitions WHERE active = 1 AND lease_id NOT IN (SELECT value FROM json_each(?))"
            " GROUP BY gpu_index",
            (self._ended_unsaved(),),
        )
        return {r[0]: r[1] for r in rows}

    def active_partitions(self) -> list[sqlite3.Row]:
        return self.db.execute(
            "SELECT p.*, l.client FROM partitions p JOIN leases l ON l.id = p.lease_id"
            " WHERE p.active = 1 AND p.lease_id NOT IN (SELECT value FROM json_each(?))",
            (self._ended_unsaved(),),
        ).fetchall()

    def client_usage(self, client: str) -> float:
        row = self.db.execute(
            "SELECT COALESCE(SUM(p.fraction), 0) FROM partitions p JOIN leases l ON l.id = p.lease_id "
            "WHERE p.active = 1 AND l.client = ? AND p.lease_id NOT IN (SELECT value FROM json_each(?))",
            (client, self._ended_unsaved()),
        ).fetchone()
        return float(row[0])

    def known_clients(self) -> set[str]:
        names = {r[0] for r in self.db.execute("SELECT name FROM clients")}
        return names | {r[0] for r in self.db.execute("SELECT DISTINCT client FROM leases")}


def _lease(row: dict) -> dict:
    """A lease row with its JSON columns decoded (the pool never sees how they are stored)."""
    out = dict(row)
    out["pids"] = [tuple(p) for p in json.loads(row["pids"])]
    out["worker"] = json.loads(row["worker"]) if row["worker"] else None
    out["env"] = json.loads(row["env"])
    out["job"] = json.loads(out["job"]) if out.get("job") else None  # absent: an old store on a full disk
    return out


# Columns added to a table after its first release: (table, column, declaration). A store written by an
# older version gets them at open (NULL in its old rows); SCHEMA above has them for a new store.
ADDED_COLUMNS = (("leases", "job", "TEXT"),)


def _add_columns(db: sqlite3.Connection) -> None:
    for table, column, declaration in ADDED_COLUMNS:
        have = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
        if column not in have:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")


def open_store(state_dir: Path, report: Callable[[str], None] | None = None) -> Store:
    """The store of a state directory; a PoolError with a hint when it cannot be opened. On a full disk
    an existing store opens read-only (``Store.condition()`` says so); a new one cannot be created."""
    try:
        return Store(state_dir / "pool.sqlite", report)
    except (OSError, sqlite3.Error) as exc:
        if disk_full(exc, state_dir):
            raise StorageFull(
                f"the disk of the state directory {state_dir} is full: cannot create or open the store",
                "free space on that disk, or pass --state-dir on another disk",
            ) from None
        if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
            raise PoolError(
                f"the store in {state_dir} is locked: {exc}",
                "a gpupool-server that started on a full disk holds it alone until the disk has room",
            ) from None
        raise PoolError(
            f"cannot open the state directory {state_dir}: {exc}", "pass --state-dir to a writable directory"
        ) from None
