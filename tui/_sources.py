"""Where the console's data comes from: one seam per view, called from worker threads only.

- ``TelemetryFleet``: telemetry directories, through ``analytics.live`` (DuckDB stays in analytics).
- ``PrometheusFleet`` (in ``_prometheus``): a collector's /metrics endpoint, for hosts without a
  shared telemetry directory.
- ``Pool``: one ``ServerClient`` per server; an unreachable server becomes a state, never an error.

Each returns plain snapshots (dataclasses) that the views lay out; none holds a Textual object.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from analytics import live
from analytics.live import GpuNow, ProcessNow
from server.api import Client, Gpu, Health, Lease
from server.client import PoolClientError, ServerClient

GpuKey = tuple[str, str]  # (host, gpu_uuid)

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class FleetSnapshot:
    """The fleet as one refresh saw it."""

    source: str
    gpus: list[GpuNow]
    util_series: dict[GpuKey, list[float | None]] = field(default_factory=dict)
    sm_series: dict[GpuKey, list[float | None]] = field(default_factory=dict)
    newest: datetime | None = None
    error: str | None = None


class FleetSource(Protocol):
    label: str
    process_details: bool  # False: the source knows no processes (Prometheus)

    def snapshot(self) -> FleetSnapshot: ...

    def processes(self, key: GpuKey) -> list[ProcessNow]: ...


@dataclass(frozen=True)
class SeriesOptions:
    minutes: float = 10.0  # how far back the sparklines reach
    buckets: int = 20  # characters per sparkline


class TelemetryFleet:
    """The fleet from telemetry directories (local, NFS, or synced from every host)."""

    def __init__(
        self, dirs: Sequence[str | Path], series: SeriesOptions | None = None, *, label: str | None = None
    ):
        self.dirs = [Path(d) for d in dirs]
        self.series = series or SeriesOptions()
        self.label = label or "telemetry: " + ", ".join(str(d) for d in self.dirs)
        self.process_details = True
        self._live = None
        self._lock = threading.Lock()  # one DuckDB connection, used by one worker at a time

    def _connection(self):
        # The last minutes in memory, fed only with new segments: a refresh costs the same over an
        # hour or a year of telemetry (bench/bench_console.py).
        if self._live is None:
            self._live = live.LiveWindow(self.dirs, timedelta(minutes=self.series.minutes + 1))
        self._live.poll()
        return self._live.con

    def snapshot(self) -> FleetSnapshot:
        with self._lock:
            try:
                con = self._connection()
                newest = live.newest_sample_time(con)
                gpus = live.latest_gpu_samples(con, at=newest) if newest else []
                minutes, buckets = self.series.minutes, self.series.buckets
                util = (
                    live.gpu_series(con, "util_gpu_mean", minutes=minutes, buckets=buckets, at=newest)
                    if newest
                    else {}
                )
                sm = (
                    live.gpu_series(con, "sm_activity", minutes=minutes, buckets=buckets, at=newest)
                    if newest
                    else {}
                )
            except Exception as exc:  # a half-written or foreign file must not kill the console
                return FleetSnapshot(self.label, [], error=f"telemetry unreadable: {_one_line(exc)}")
        return FleetSnapshot(self.label, gpus, util, sm, newest)

    def processes(self, key: GpuKey) -> list[ProcessNow]:
        with self._lock:
            try:
                con = self._live.con if self._live is not None else self._connection()
                return live.gpu_processes(con, key[0], key[1])
            except Exception:
                return []


@dataclass
class ServerState:
    """One pool server as the last refresh saw it."""

    url: str
    reachable: bool = False
    error: str | None = None  # why it is unreachable or why admin data is missing
    health: Health | None = None
    gpus: list[Gpu] = field(default_factory=list)
    leases: list[Lease] = field(default_factory=list)
    clients: list[Client] = field(default_factory=list)
    policy: Any = None  # an api.Policy (built from server.ranges.POLICY)
    checked_at: datetime | None = None
    failures: int = 0  # consecutive failed refreshes (drives the retry back-off)
    down_since: datetime | None = None  # first failure of the current outage

    @property
    def hostname(self) -> str:
        return self.health.server.hostname if self.health else self.url


def _short(exc: PoolClientError, url: str) -> str:
    # The server's row already names its URL and says it is retried: the note says what went wrong.
    text = exc.title if exc.unreachable or not exc.hint else f"{exc.title} ({exc.hint})"
    return text.replace(f" on {url}", "").replace(f"{url} ", "")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


class Pool:
    """All servers given to the console, refreshed concurrently; retries dead ones with back-off."""

    MAX_BACKOFF_S = 30.0

    def __init__(self, clients: Sequence[ServerClient], clock: Clock = utc_now):
        self.clients = list(clients)
        self.clock = clock
        self.states: dict[str, ServerState] = {c.url: ServerState(c.url) for c in self.clients}
        self._next_try: dict[str, datetime] = {}

    @property
    def has_admin_token(self) -> bool:
        return any(c.token for c in self.clients)

    def client(self, url: str) -> ServerClient:
        return next(c for c in self.clients if c.url == url)

    def patient_client(self, url: str, timeout_s: float) -> ServerClient:
        """The server's client with a longer per-call timeout, for an action that takes as long as its
        work (a migration's copy); the refreshes keep the short one."""
        c = self.client(url)
        return ServerClient(c.url, c.token, replace(c.options, timeout_s=timeout_s))

    def refresh(self, *, force: bool = False) -> list[ServerState]:
        now = self.clock()
        due = [c for c in self.clients if force or self._next_try.get(c.url, now) <= now]
        if due:
            with ThreadPoolExecutor(max_workers=min(8, len(due)), thread_name_prefix="pool") as ex:
                for state in ex.map(self._fetch, due):
                    self.states[state.url] = state
        return [self.states[c.url] for c in self.clients]

    def _fetch(self, client: ServerClient) -> ServerState:
        previous = self.states.get(client.url) or ServerState(client.url)
        checked_at = self.clock()
        state = ServerState(client.url, checked_at=checked_at)
        try:
            state.health = client.health()
        except PoolClientError as exc:
            state.error = _short(exc, client.url)
            state.failures = previous.failures + 1
            state.down_since = previous.down_since or checked_at
            backoff = min(self.MAX_BACKOFF_S, 2.0 ** min(state.failures, 5))
            self._next_try[client.url] = checked_at + timedelta(seconds=backoff)
            return state
        state.reachable = True
        self._next_try.pop(client.url, None)
        if not client.token:
            state.error = (
                "no admin token: health only (make one on a server with `gpupool-server token create ops "
                "--admin`, give it with --admin-token-file or GPUPOOL_ADMIN_TOKEN)"
            )
            return state
        # Each route on its own: one failing answer (a 403, a server bug, a server of another version
        # whose answer is not the struct) must not hide the others.
        errors = []
        calls: tuple[tuple[str, Callable[[], Any]], ...] = (
            ("gpus", lambda: client.gpus().gpus),
            ("leases", client.leases),
            ("clients", client.clients),
            ("policy", client.policy),
        )
        for name, call in calls:
            try:
                setattr(state, name, call())
            except PoolClientError as exc:
                errors.append(_short(exc, client.url))
                if exc.unreachable:  # it went away mid-refresh: the rest would time out too
                    state.reachable = False
                    state.failures = previous.failures + 1
                    state.down_since = previous.down_since or state.checked_at
                    break
        if errors:
            more = f" (and {len(errors) - 1} more failing call(s))" if len(errors) > 1 else ""
            state.error = errors[0] + more
        return state
