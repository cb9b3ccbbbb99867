"""What the lease logic (server._pool) needs of its stores, declared once.

Three parts, because cluster mode splits them: tokens and settings (policy overrides, a client's own
limit and idle timeout) live in the embedded store (server._store.Store) or, in cluster mode, in
etcd (server._cluster.Cluster), which both implement ``TokenStore`` and ``SettingsStore``; leases and
their partitions always stay in the embedded store (``LeaseStore``): a GPU belongs to one server.

Rows are read-only mappings (``row["client"]``); the JSON columns of a lease come back decoded:
``pids`` a list of (pid, create_time), ``worker`` a dict or None, ``env`` a dict.
``tests/test_store_api.py`` checks that both implementations keep every method declared here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

Row = Mapping[str, Any]


@runtime_checkable
class TokenStore(Protocol):
    def find_token(self, token: str) -> Row | None:
        """The row of a token (by its hash), revoked or expired ones included; None if unknown."""

    def create_token(
        self, client: str, *, admin: bool = False, expires_in_s: float | None = None, token: str | None = None
    ) -> dict:
        """Store a new token (or the hash of ``token``); its row plus the token itself under "token"."""

    def tokens(self) -> list[Row]:
        """Every token's row, oldest first."""

    def revoke_token(self, token_id: str) -> Row | None:
        """Mark a token revoked (once: a second revoke keeps the first time); None if no such id."""


@runtime_checkable
class SettingsStore(Protocol):
    def policy_overrides(self) -> dict[str, float | None]:
        """The policy keys set through the admin API (the rest come from the server's config)."""

    def set_policy(self, changes: dict[str, float | None]) -> None:
        """Set the given policy keys; a None value drops the override."""

    def client_row(self, client: str) -> Row | None:
        """The client's own ``limit_gpus`` and ``idle_timeout_s`` (None: the default applies)."""

    def set_client(self, client: str, changes: dict[str, float | None]) -> None:
        """Set the client's ``limit_gpus`` and/or ``idle_timeout_s`` (creating its row)."""


@runtime_checkable
class LeaseStore(Protocol):
    """Leases and partitions. Its writes run inside the caller's ``transaction()``, so a decision and
    what it writes commit together; token and settings writes commit on their own."""

    def transaction(self) -> AbstractContextManager[Any]:
        """One writer at a time: every decision that reads and then changes capacity runs in one."""

    # --- writing leases
    def insert_lease(self, lease: dict, partitions: list[dict]) -> None:
        """Store a new active lease and its partitions (and remember its client's name)."""

    def end_lease(self, lease_id: str, state: str, reason: str, ended: float) -> None:
        """Mark the lease ended (released/expired/reclaimed); its partitions stop counting."""

    def renew_lease(self, lease_id: str, expires: float, pids: list[tuple]) -> None:
        """A heartbeat: the new deadline and the lease's known local processes."""

    def set_last_active(self, lease_id: str, last_active: float) -> None: ...

    def extend_after_restart(self, lease_id: str, expires: float, now: float) -> None:
        """Give a kept lease a fresh deadline and count it active now (never moving either back)."""

    def set_worker(self, lease_id: str, worker: dict) -> None: ...

    def move_partition(self, lease_id: str, gpu_from: int, gpu_to: int, gpu_uuid: str) -> None:
        """The lease's partition on GPU `gpu_from` is on `gpu_to` from now on (a live migration)."""

    # On a full disk the lease writes above are kept in memory, applied by every read and written
    # when the disk has room; every other write raises StorageFull (server._store's docstring).
    def retry_writes(self, probe: bool = False) -> bool:
        """Write what waits in memory (``probe``: also test the disk by a real write); True if writable."""

    def condition(self) -> dict:
        """``writable``, ``problem``, ``full_since`` (epoch s or None), ``unsaved_leases`` (ids)."""

    def purge_ended(self, cutoff: float) -> int:
        """Forget leases (and their partitions) that ended before ``cutoff``; how many went."""

    # --- reading leases
    def lease_row(self, lease_id: str) -> Row | None: ...

    def lease_worker(self, lease_id: str) -> dict | None:
        """The worker stored for a lease (host, port, secret, pid, create_time), if any."""

    def lease_rows(self, client: str | None, state: str) -> list[Row]:
        """Leases oldest first, of one client (None: every client), state "active", "ended" or "all"."""

    def partitions(self, lease_ids: Iterable[str]) -> dict[str, list[Row]]:
        """The partitions of each lease, by lease id, each list by GPU index."""

    def active_lease_count(self, client: str | None = None, *, remote: bool = False) -> int:
        """Active leases (of one client; ``remote``: only those that run a worker)."""

    def live_fractions(self) -> list[Row]:
        """Every active lease's id, client and summed fraction (what cluster records carry)."""

    # --- capacity
    def used_bytes(self) -> dict[int, int]:
        """Memory held by active partitions, per GPU index."""

    def active_partitions(self) -> list[Row]:
        """Every active partition with its lease's client."""

    def client_usage(self, client: str) -> float:
        """The summed fraction of the client's active partitions on this server."""

    def known_clients(self) -> set[str]:
        """Every client this store has a row or a lease of."""
