"""History: the fleet summary and the top idle-while-holding users for a chosen range.

Every number comes from ``analytics`` (``fleet_summary``, ``attribution``); this module only picks the
range and lays the answers out. Ranges end at the newest sample in the telemetry, not at the wall
clock, so a replayed or copied directory shows its own last hours.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import Static

from tui import _format as fmt
from tui._table import Column, Row, SyncTable
from tui._views import View

RANGES: dict[str, timedelta | None] = {
    "1h": timedelta(hours=1),
    "6h": timedelta(hours=6),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
    "all": None,
}
TOP_USERS = 10


@dataclass(frozen=True)
class HistorySnapshot:
    range_label: str
    start: datetime | None
    end: datetime | None
    summary: Any | None  # analytics FleetSummary
    idle_users: tuple[Any, ...]  # analytics AttributionRow, most idle-while-holding hours first
    error: str | None = None
    pool: Any | None = None  # analytics PoolActivity: what the pool servers' lease events say
    notes: tuple[str, ...] = ()  # analytics.telemetry_notes: damaged segments, hosts without rollups


class HistorySource:
    """Asks analytics about one range of the telemetry directories."""

    def __init__(self, dirs: Sequence[str | Path]):
        self.dirs = [Path(d) for d in dirs]
        self._lock = threading.Lock()

    def load(self, range_label: str) -> HistorySnapshot:
        import analytics
        from analytics import live

        span = RANGES[range_label]
        with self._lock:
            try:
                con = analytics.open_telemetry(self.dirs, require_data=False, check_versions=False)
                notes = tuple(analytics.telemetry_notes(con))
                newest = live.newest_sample_time(con)
                if newest is None:
                    return HistorySnapshot(
                        range_label, None, None, None, (), "no telemetry in range yet", notes=notes
                    )
                end = newest + timedelta(seconds=1)  # scopes are start <= ts < end
                start = None if span is None else end - span
                scope = analytics.Scope(start=start, end=end)
                pool = analytics.pool_activity(con, scope)
            except analytics.TelemetryError as exc:
                return HistorySnapshot(range_label, None, None, None, (), exc.title)
            except Exception as exc:  # a damaged segment must not take the console down
                return HistorySnapshot(range_label, None, None, None, (), f"telemetry unreadable: {exc}")
            try:
                summary = analytics.fleet_summary(con, scope)
                users = analytics.attribution(con, scope, by="user")
            except analytics.TelemetryError as exc:  # no GPU samples in range: the pool may still have events
                return HistorySnapshot(range_label, start, end, None, (), exc.title, pool=pool, notes=notes)
            except Exception as exc:
                return HistorySnapshot(
                    range_label, start, end, None, (), f"telemetry unreadable: {exc}", pool=pool, notes=notes
                )
        idle = sorted(
            (r for r in users.rows if r.idle_holding_hours > 0), key=lambda r: (-r.idle_holding_hours, r.key)
        )
        return HistorySnapshot(
            range_label, start, end, summary, tuple(idle[:TOP_USERS]), pool=pool, notes=notes
        )


class HistoryView(View):
    RANGES = tuple(RANGES)
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left_square_bracket", "shorter", "Shorter range"),
        Binding("right_square_bracket", "longer", "Longer range"),
    ]
    SUMMARY = (Column("metric", "Fleet summary"), Column("value", "Value"))
    USERS = (
        Column("user", "User"),
        Column("idle", "Idle while holding"),
        Column("share", "Share of held"),
        Column("held", "GPU-hours held"),
        Column("busy", "Busy GPU-hours"),
        Column("peak", "Memory peak"),
        Column("gpus", "GPUs"),
    )

    POOL = (
        Column("client", "Client"),
        Column("leases", "Leases"),
        Column("denials", "Denied"),
        Column("reclaimed", "Reclaimed (idle)"),
        Column("hours", "GPU-hours leased"),
        Column("reclaimed_hours", "GPU-hours reclaimed"),
    )

    class Loaded(Message):
        def __init__(self, snapshot: HistorySnapshot):
            super().__init__()
            self.snapshot = snapshot

    def __init__(self, source: HistorySource | None, *, range_label: str = "24h", **kwargs):
        super().__init__(**kwargs)
        self.source = source
        self.range_label = range_label

    def compose(self) -> ComposeResult:
        yield Static("", id="history-status", classes="status")
        summary = SyncTable(self.SUMMARY, id="history-summary")
        summary.border_title = "Fleet summary"
        yield summary
        users = SyncTable(self.USERS, id="history-users", empty="nobody held a GPU idle in this range")
        users.border_title = f"Top {TOP_USERS} users holding GPUs idle"
        yield users
        pool = SyncTable(
            self.POOL,
            id="history-pool",
            empty="no lease events in this range (gpupool-server --telemetry DIR)",
        )
        pool.border_title = "Pool: leases by client"
        yield pool

    def on_mount(self) -> None:
        if self.source is None:
            self._status(Text("No telemetry: start with --telemetry DIR for history.", style="dim"))

    def _status(self, text: Text) -> None:
        self.query_one("#history-status", Static).update(text)

    def set_range(self, label: str) -> None:
        self.range_label = label
        self.reload()

    def action_shorter(self) -> None:
        i = self.RANGES.index(self.range_label)
        self.set_range(self.RANGES[max(0, i - 1)])

    def action_longer(self) -> None:
        i = self.RANGES.index(self.range_label)
        self.set_range(self.RANGES[min(len(self.RANGES) - 1, i + 1)])

    def reload(self) -> None:
        if self.source is None:
            return
        self._status(Text(f"range {self.range_label}: loading…", style="dim"))
        self._load(self.range_label)

    @work(thread=True, exclusive=True, group="history")
    def _load(self, label: str) -> None:
        if self.source is not None:  # reload() starts it only then
            self.post_message(self.Loaded(self.source.load(label)))

    @on(Loaded)
    def _loaded(self, message: Loaded) -> None:
        snap = message.snapshot
        if snap.range_label != self.range_label:
            return  # an older request answered late
        status = Text(f"range {snap.range_label}", style="bold")
        if snap.start or snap.end:
            start = f"{snap.start:%Y-%m-%d %H:%M}" if snap.start else "first sample"
            status.append(f"   {start} to {snap.end:%Y-%m-%d %H:%M} UTC (ends at the newest sample)")
        status.append("   keys [ ] change the range", style="dim")
        if snap.summary is not None and snap.summary.simulated:
            status.append("   SIMULATED data", style="bold magenta")
        if snap.error:
            status.append(f"   {snap.error}", style="bold yellow")
        for note in snap.notes:
            status.append(f"\n{note}", style="yellow")
        self._status(status)
        self.query_one("#history-summary", SyncTable).set_rows(summary_rows(snap.summary))
        self.query_one("#history-users", SyncTable).set_rows(user_rows(snap.idle_users))
        pool_table = self.query_one("#history-pool", SyncTable)
        pool_table.set_rows(pool_rows(snap.pool))
        pool_table.border_title = pool_title(snap.pool)


def summary_rows(s: Any | None) -> list[Row]:
    if s is None:
        return []

    def share(part: float) -> str:
        return f"{part:,.1f} GPU-h ({fmt.ratio(part / s.gpu_hours) if s.gpu_hours else fmt.MISSING})"

    items = [
        ("span", f"{s.first_sample:%Y-%m-%d %H:%M} to {s.last_sample:%Y-%m-%d %H:%M} UTC"),
        ("hosts / GPUs", f"{s.hosts} / {s.gpus}"),
        ("observed GPU-hours", f"{s.gpu_hours:,.1f}"),
        ("utilization (duty cycle), mean", fmt.ratio(s.util_gpu_mean)),
        ("SM activity (GPM), mean", fmt.ratio(s.sm_activity_mean)),
        ("idle", share(s.idle_gpu_hours)),
        ("held while idle (memory in use)", share(s.held_idle_gpu_hours)),
        ("memory used, mean", fmt.ratio(s.mem_used_ratio_mean)),
        ("lost GPUs (fell off the bus)", share(s.lost_gpu_hours)),
        ("simulated share", fmt.ratio(s.simulated_share)),
    ]
    return [Row(k, (k, v), (k, v)) for k, v in items]


def user_rows(users: Sequence[Any]) -> list[Row]:
    return [
        Row(
            u.key,
            (
                u.key,
                Text(f"{u.idle_holding_hours:,.2f} GPU-h", style="bold yellow"),
                fmt.ratio(u.idle_holding_share),
                f"{u.gpu_hours:,.2f}",
                f"{u.busy_gpu_hours:,.2f}",
                fmt.mib(u.mem_peak_bytes),
                str(u.gpus),
            ),
            (
                u.key,
                u.idle_holding_hours,
                u.idle_holding_share,
                u.gpu_hours,
                u.busy_gpu_hours,
                u.mem_peak_bytes,
                u.gpus,
            ),
        )
        for u in users
    ]


def pool_title(activity: Any | None) -> str:
    if activity is None or activity.empty:
        return "Pool: leases by client"
    e = activity.events
    return (
        f"Pool: {e['grant']} granted, {e['deny']} denied, {e['release']} released, {e['expire']} expired, "
        f"{e['reclaim']} reclaimed; {activity.gpu_hours:,.2f} GPU-h leased, "
        f"{activity.reclaimed_gpu_hours:,.2f} GPU-h reclaimed"
    )


def pool_rows(activity: Any | None) -> list[Row]:
    if activity is None:
        return []
    return [
        Row(
            c.client,
            (
                c.client,
                str(c.leases),
                str(c.denials),
                Text(str(c.reclaimed), style="bold yellow" if c.reclaimed else ""),
                f"{c.gpu_hours:,.2f}",
                f"{c.reclaimed_gpu_hours:,.2f}",
            ),
            (c.client, c.leases, c.denials, c.reclaimed, c.gpu_hours, c.reclaimed_gpu_hours),
        )
        for c in activity.clients
    ]
