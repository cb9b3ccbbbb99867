"""The gpupool ops console: a Textual app over the fleet's telemetry and the pool servers' API.

Dependencies come in through the constructor (a fleet source, a pool, a history source, a clock),
so tests and the CLI build the same app from different parts. All I/O runs in thread workers that
post a Message back; handlers on the UI thread only lay data out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar, TypeVar

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Input, TabbedContent, TabPane

from collector.durations import parse_duration
from server import api
from server.client import PoolClientError, ServerClient
from server.ranges import CLIENT as CLIENT_RANGES
from server.workers import MIGRATE_TIMEOUT_S
from tui import _format as fmt
from tui._history import HistorySource, HistoryView
from tui._screens import (
    CANCELLED,
    ConfirmScreen,
    HelpScreen,
    MigrateScreen,
    MigrationChoice,
    PromptScreen,
    ServerChoice,
    migration_choices,
    server_choices,
)
from tui._sources import Clock, FleetSnapshot, FleetSource, GpuKey, Pool, ServerState, utc_now
from tui._table import SyncTable
from tui._views import FleetView, PoolView, View, split_row_key

# How long the console waits for a migration's answer: the worker's own limit for the copy, and the
# server's answer after it (as `gpupool-server lease migrate`); a drain, that for each lease on the GPU.
MIGRATE_WAIT_S = MIGRATE_TIMEOUT_S + 30.0

VIEWS = ("fleet", "pool", "history")
T = TypeVar("T")


class ConsoleApp(App):
    CSS_PATH = "console.tcss"
    TITLE = "gpupool console"
    ENABLE_COMMAND_PALETTE = True

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("1", "show_view('fleet')", "Fleet"),
        Binding("2", "show_view('pool')", "Pool"),
        Binding("3", "show_view('history')", "History"),
        # Priority: handled as the key arrives, so text typed right after `/` lands in the filter.
        Binding("slash", "filter", "Filter", priority=True),
        Binding("s", "sort", "Sort"),
        Binding("S", "reverse_sort", "Reverse", show=False),
        Binding("r", "refresh", "Refresh"),
        Binding("question_mark", "help", "Help"),
        Binding("q", "quit", "Quit"),
    ]

    # Messages from workers -----------------------------------------------------------------------
    class FleetLoaded(Message):
        def __init__(self, snapshot: FleetSnapshot):
            super().__init__()
            self.snapshot = snapshot

    class ProcessesLoaded(Message):
        def __init__(self, key: GpuKey, processes: list):
            super().__init__()
            self.key = key
            self.processes = processes

    class PoolLoaded(Message):
        def __init__(self, states: list[ServerState]):
            super().__init__()
            self.states = states

    class ActionDone(Message):
        """An operator action finished: ``error`` is None on success, else the one line why not;
        ``partial``: it happened but left something undone (a drain that could not move every lease)."""

        def __init__(self, what: str, error: str | None, *, partial: bool = False):
            super().__init__()
            self.what = what
            self.error = error
            self.partial = partial

    def __init__(
        self,
        *,
        fleet: FleetSource | None = None,
        pool: Pool | None = None,
        history: HistorySource | None = None,
        history_range: str = "24h",
        refresh_s: float | None = 2.0,
        clock: Clock = utc_now,
        start_view: str | None = None,
    ):
        super().__init__()
        self.fleet = fleet
        self.pool = pool
        self.history = history
        self.history_range = history_range
        self.refresh_s = refresh_s
        self.clock = clock
        self.start_view = start_view or ("fleet" if fleet else "pool" if pool else "history")
        self.last_fleet: FleetSnapshot | None = None
        self.last_pool: list[ServerState] = []
        self.action_log: list[tuple[str, str | None]] = []  # (what, error) of every operator action

    # Layout --------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        with TabbedContent(initial=self.start_view, id="views"):
            with TabPane("Fleet [1]", id="fleet"):
                yield FleetView(id="fleet-view")
            with TabPane("Pool [2]", id="pool"):
                yield PoolView(id="pool-view")
            with TabPane("History [3]", id="history"):
                yield HistoryView(self.history, range_label=self.history_range, id="history-view")
        yield Input(placeholder="filter: words that every row shown must contain", id="filter")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = self._subtitle()
        if self.fleet is None:
            self.query_one(FleetView).show_unavailable(
                "No telemetry: start with --telemetry DIR (a directory gpustat-collect writes) "
                "or --prometheus URL."
            )
        elif not self.fleet.process_details:
            procs = self.query_one("#fleet-procs", SyncTable)
            procs.empty_message = "Prometheus has no per-process details: use --telemetry DIR for them"
        if self.pool is None:
            self.query_one(PoolView).show_unavailable("No pool servers: start with --server URL.")
        self.refresh_all(force=True)
        if self.refresh_s:
            self.set_interval(self.refresh_s, self.refresh_all)
        self.call_after_refresh(self._focus_view)

    def _subtitle(self) -> str:
        parts = []
        if self.fleet is not None:
            parts.append(self.fleet.label)
        if self.pool is not None:
            parts.append(f"{len(self.pool.clients)} server(s)")
        return " · ".join(parts) or "nothing configured"

    @property
    def active_view(self) -> View:
        active = self.query_one("#views", TabbedContent).active or self.start_view
        return self.query_one(f"#{active}-view", View)

    def _focus_view(self, *, force: bool = False) -> None:
        box = self.query_one("#filter", Input)
        if not force and box.display and box.has_focus:
            return  # the operator is typing a filter (a tab switch just before must not steal it)
        tables = self.active_view.tables
        if tables:
            # The most useful table of each view first: the GPUs, the leases.
            preferred = {"fleet-view": "fleet-gpus", "pool-view": "pool-leases"}.get(
                self.active_view.id or ""
            )
            pick = next((t for t in tables if t.id == preferred), tables[0])
            # Synchronously: a deferred focus() landing after a quick view switch would pull the
            # view back (TabbedContent follows focus into its pane).
            self.screen.set_focus(pick)

    # Refreshing ----------------------------------------------------------------------------------
    def refresh_all(self, force: bool = False) -> None:
        if self.fleet is not None:
            self.load_fleet(self.query_one(FleetView).selected_gpu)
        if self.pool is not None:
            self.load_pool(force)
        if self.history is not None and force:
            self.query_one(HistoryView).reload()

    @work(thread=True, exclusive=True, group="fleet")
    def load_fleet(self, selected: GpuKey | None) -> None:
        if self.fleet is None:  # started only with a fleet source
            return
        snapshot = self.fleet.snapshot()
        self.post_message(self.FleetLoaded(snapshot))
        if selected is None and snapshot.gpus:
            selected = (snapshot.gpus[0].host, snapshot.gpus[0].gpu_uuid)
        if selected is not None:
            self.post_message(self.ProcessesLoaded(selected, self.fleet.processes(selected)))

    @work(thread=True, exclusive=True, group="processes")
    def load_processes(self, key: GpuKey) -> None:
        if self.fleet is not None:
            self.post_message(self.ProcessesLoaded(key, self.fleet.processes(key)))

    @work(thread=True, exclusive=True, group="pool")
    def load_pool(self, force: bool = False) -> None:
        if self.pool is not None:  # started only with pool servers
            self.post_message(self.PoolLoaded(self.pool.refresh(force=force)))

    @on(FleetLoaded)
    def _fleet_loaded(self, message: FleetLoaded) -> None:
        self.last_fleet = message.snapshot
        self.query_one(FleetView).update_fleet(message.snapshot, self.clock())

    @on(ProcessesLoaded)
    def _processes_loaded(self, message: ProcessesLoaded) -> None:
        view = self.query_one(FleetView)
        if view.selected_gpu in (None, message.key):
            view.update_processes(message.processes)

    @on(PoolLoaded)
    def _pool_loaded(self, message: PoolLoaded) -> None:
        self.last_pool = message.states
        has_token = self.pool is not None and self.pool.has_admin_token
        self.query_one(PoolView).update_pool(message.states, self.clock(), has_token=has_token)

    @on(DataTable.RowHighlighted, "#fleet-gpus")
    def _gpu_highlighted(self, event: DataTable.RowHighlighted) -> None:
        key = self.query_one(FleetView).selected_gpu
        if key is not None and self.fleet is not None:
            self.load_processes(key)

    @on(DataTable.RowSelected, "#fleet-hosts")
    def _host_selected(self, event: DataTable.RowSelected) -> None:
        # enter on a host: show only its GPUs (the filter line says so; esc shows all again)
        box = self.query_one("#filter", Input)
        box.value = str(event.row_key.value)
        box.display = True
        self.active_view.set_filter(box.value)
        self.screen.set_focus(self.query_one("#fleet-gpus", SyncTable))

    @on(TabbedContent.TabActivated)
    def _tab_activated(self, event: TabbedContent.TabActivated) -> None:
        text = self.query_one("#filter", Input).value
        self.active_view.set_filter(text)
        self.call_after_refresh(self._focus_view)

    # Keys ----------------------------------------------------------------------------------------
    def action_show_view(self, view: str) -> None:
        self.query_one("#views", TabbedContent).active = view
        self._focus_view()

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_refresh(self) -> None:
        self.refresh_all(force=True)
        self.notify("refreshing", timeout=1.5)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # Inside an input or a dialog, `/` is text.
        typing = isinstance(self.focused, Input) or len(self.screen_stack) > 1
        return not (action == "filter" and typing)

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.display = True
        # At once, not via focus() (which waits a turn): keys typed right after `/` are the filter's.
        self.screen.set_focus(box)

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.active_view.set_filter(event.value)

    @on(Input.Submitted, "#filter")
    def _filter_submitted(self, event: Input.Submitted) -> None:
        if not event.value.strip():
            event.input.display = False
        self._focus_view(force=True)

    def on_key(self, event) -> None:
        box = self.query_one("#filter", Input)
        if event.key == "escape" and (box.has_focus or box.value) and isinstance(self.screen, Screen):
            if self.screen is not self.screen_stack[0]:
                return
            box.value = ""
            box.display = False
            self.active_view.set_filter("")
            self._focus_view(force=True)
            event.stop()

    def _focused_table(self) -> SyncTable | None:
        focused = self.focused
        if isinstance(focused, SyncTable):
            return focused
        tables = self.active_view.tables
        return tables[0] if tables else None

    def action_sort(self) -> None:
        table = self._focused_table()
        if table is not None:
            self.notify(f"{table.border_title}: sorted by {table.cycle_sort()}", timeout=2)

    def action_reverse_sort(self) -> None:
        table = self._focused_table()
        if table is not None:
            table.reverse_sort()

    # Operator actions ----------------------------------------------------------------------------
    def _admin_client(self, server: str) -> ServerClient | None:
        client = self.pool.client(server) if self.pool and server else None
        if client is None or not client.token:
            self.notify(
                "This action needs an admin token: start the console with --admin-token TOKEN "
                "or set GPUPOOL_ADMIN_TOKEN.",
                title="No admin token",
                severity="error",
                timeout=8,
            )
            return None
        return client

    def _selected(self, table_id: str, what: str) -> tuple[str, str] | None:
        if self.pool is None:
            self.notify("No pool servers: start with --server URL.", severity="error")
            return None
        if not self.pool.has_admin_token:
            self._admin_client("")
            return None
        row = self.query_one(f"#{table_id}", SyncTable).selected
        if row is None:
            self.notify(f"Select a {what} first (in the Pool view).", severity="warning")
            return None
        return split_row_key(row.key) if "\x1f" in row.key else (row.key, "")

    def action_release_lease(self) -> None:
        picked = self._selected("pool-leases", "lease")
        if picked is None:
            return
        server, lease_id = picked
        client = self._admin_client(server)
        if client is None:
            return
        holder = next(
            (x.client for s in self.last_pool if s.url == server for x in s.leases if x.id == lease_id), "?"
        )
        question = (
            f"Release lease {lease_id} of client {holder} on {server}?\n"
            "Its holder loses the GPUs at once; running work on them fails."
        )

        def answered(yes: bool | None) -> None:
            if yes:
                self.pool_action(server, f"released lease {lease_id}", lambda c: c.release(lease_id))

        self.push_screen(ConfirmScreen(question, yes="Release"), answered)

    def action_set_client_limit(self) -> None:
        self._client_prompt(
            "limit",
            "GPU limit of {client} on {server} (sum of fractions, e.g. 2.5; 'default' clears):",
            parse_limit,
        )

    def action_set_client_idle_timeout(self) -> None:
        self._client_prompt(
            "idle_timeout_s",
            "Idle timeout of {client} on {server} (e.g. 30m; 0 = never reclaim; 'default' clears):",
            parse_idle_timeout,
        )

    def _client_prompt(self, field: str, question: str, parse: Callable[[str], Any]) -> None:
        picked = self._selected("pool-clients", "client")
        if picked is None:
            return
        server, name = picked
        if self._admin_client(server) is None:
            return

        def answered(value: Any) -> None:
            if value is CANCELLED:
                return
            shown = _shown_value(field, value)
            self.pool_action(
                server, f"set {field} of {name} to {shown}", lambda c: c.update_client(name, **{field: value})
            )

        self.push_screen(PromptScreen(question.format(client=name, server=server), parse), answered)

    def action_set_default_idle_timeout(self) -> None:
        picked = self._selected("pool-servers", "server")
        if picked is None:
            return
        server = picked[0]
        if self._admin_client(server) is None:
            return

        def answered(value: Any) -> None:
            if value is CANCELLED:
                return
            self.pool_action(
                server,
                f"set the default idle timeout of {server} to {_shown_value('idle_timeout_s', value)}",
                lambda c: c.update_policy(default_idle_timeout_s=value),
            )

        question = (
            f"Default idle timeout of {server} (e.g. 30m; 0 = no idle reclaim; 'default' = config file):"
        )
        self.push_screen(PromptScreen(question, parse_idle_timeout), answered)

    @work(thread=True, group="actions")
    def pool_action(
        self,
        server: str,
        what: str,
        call: Callable[[ServerClient], Any],
        *,
        outcome: Callable[[Any], tuple[str, bool]] | None = None,
        client: ServerClient | None = None,
    ) -> None:
        """Run `call` against `server`; ``outcome`` words its answer and says whether it was only partly
        done (else `what` is the outcome).
        ``client``: one with a longer timeout than the console's --timeout, for a long action."""
        if self.pool is None:  # the actions ask for a selected row of the Pool view first
            return
        client = client or self.pool.client(server)
        try:
            answer = call(client)
        except PoolClientError as exc:
            self.post_message(self.ActionDone(what, str(exc)))
        else:
            text, partial = outcome(answer) if outcome else (what, False)
            self.post_message(self.ActionDone(text, None, partial=partial))

    @on(ActionDone)
    def _action_done(self, message: ActionDone) -> None:
        self.action_log.append((message.what, message.error))
        view = self.query_one(PoolView)
        if message.error:
            self.notify(message.error, title="Action failed", severity="error", timeout=10)
            view.show_action(f"{message.what} failed: {message.error}", failed=True)
        elif message.partial:
            self.notify(message.what, title="Partly done", severity="warning", timeout=10)
            view.show_action(message.what, partial=True)
        else:
            self.notify(message.what, title="Done", timeout=4)
            view.show_action(message.what)
        self.load_pool(True)

    def _picked_item(
        self, table_id: str, what: str, items: Callable[[ServerState], Iterable[T]], key: Callable[[T], str]
    ) -> tuple[ServerState, T] | None:
        """The selected row's server and item as the last refresh saw them, the admin token checked;
        None when there is none (a notice says why) or the row went away with a refresh."""
        picked = self._selected(table_id, what)
        if picked is None or self._admin_client(picked[0]) is None:
            return None
        state = next((s for s in self.last_pool if s.url == picked[0]), None)
        item = next((x for x in items(state) if key(x) == picked[1]), None) if state else None
        return (state, item) if state is not None and item is not None else None

    def action_migrate_lease(self) -> None:
        picked = self._picked_item("pool-leases", "lease", lambda s: s.leases, lambda x: x.id)
        if picked is None:
            return
        state, lease = picked
        server, lease_id = state.url, lease.id
        choices: list[MigrationChoice | ServerChoice] = [
            *migration_choices(lease, state.gpus),
            *server_choices(server, self.last_pool),
        ]
        if not choices:
            self.notify(
                f"Lease {lease_id} holds every GPU of {server} and no other server is watched: nowhere to move it.",
                severity="warning",
            )
            return
        question = (
            f"Move lease {lease_id} of client {lease.client} on {server} to another GPU or server, live?\n"
            "Its calls pause while its memory is copied; the program goes on there."
        )

        def answered(choice: MigrationChoice | ServerChoice | None) -> None:
            if isinstance(choice, ServerChoice):
                self._move_to_server(server, lease_id, choice.url)
            elif choice is not None:
                self._migrate(server, lease_id, choice)

        self.push_screen(MigrateScreen(question, choices), answered)

    def _move_to_server(self, server: str, lease_id: str, target: str) -> None:
        """The lease's server sends it to `target` (as `gpupool-server lease migrate LEASE --to SERVER`)."""
        what = f"moving lease {lease_id} from {server} to {target}"
        self.query_one(PoolView).show_action(what + " …", running=True)

        def moved(lease: api.MigratedLease) -> tuple[str, bool]:
            m = lease.migration
            return (
                f"moved lease {lease_id} to {target} ({lease.server.hostname}), "
                f"paused {m.pause_s:.3f} s ({fmt.mib(m.bytes)} copied)"
            ), False

        call = lambda c: c.migrate_to_server(lease_id, target)  # noqa: E731
        # The target admits it and starts a worker first, then the memory crosses: as the CLI waits.
        patient = self.pool.patient_client(server, MIGRATE_WAIT_S + 60) if self.pool else None
        self.pool_action(server, what, call, outcome=moved, client=patient)

    def _migrate(self, server: str, lease_id: str, choice: MigrationChoice) -> None:
        to, partition = choice.target.index, choice.partition
        what = f"migrating lease {lease_id} partition {partition} from GPU {choice.source} to GPU {to}"
        self.query_one(PoolView).show_action(what + " …", running=True)

        def moved(lease: api.MigratedLease) -> tuple[str, bool]:
            m = lease.migration
            text = (
                f"moved lease {lease_id} partition {m.device}: GPU {m.from_} → GPU {m.to}, "
                f"paused {m.pause_s:.3f} s ({fmt.mib(m.bytes)} copied)"
            )
            return text, False

        call = lambda c: c.migrate(lease_id, to, partition)  # noqa: E731
        patient = self.pool.patient_client(server, MIGRATE_WAIT_S) if self.pool else None
        self.pool_action(server, what, call, outcome=moved, client=patient)

    def action_drain_gpu(self) -> None:
        picked = self._picked_item("pool-gpus", "GPU", lambda s: s.gpus, lambda g: g.uuid)
        if picked is None:
            return
        server, gpu = picked[0].url, picked[1]
        index, undo = gpu.index, gpu.draining
        if undo:
            question = f"GPU {index} of {server} is draining. Let it take new leases again?"
            what = f"GPU {index} of {server}: taking new leases again"
        else:
            question = (
                f"Drain GPU {index} ({gpu.name}) of {server}?\n"
                "No new lease goes to it; its remote leases move to other GPUs of its model, live "
                "(their calls pause while memory is copied). Local leases stay."
            )
            what = f"draining GPU {index} of {server}"

        def drained(done: api.Drain) -> tuple[str, bool]:
            if not done.draining:
                return f"GPU {done.gpu} of {server} takes new leases again", False
            moved = [f"{m.lease} → GPU {m.to} (paused {m.pause_s:.3f} s)" for m in done.moved]
            stayed = [f"{s.lease} stays: {s.reason}" for s in done.stayed]
            lines = "; ".join(moved + stayed) or "no lease on it"
            return f"GPU {done.gpu} of {server} draining, no new leases; {lines}", bool(stayed)

        def answered(yes: bool | None) -> None:
            if yes:
                self.query_one(PoolView).show_action(what + " …", running=True)
                call = lambda c: c.drain(index, undo=undo)  # noqa: E731
                # One move after another, each as long as a migration may take.
                wait = MIGRATE_WAIT_S * max(1, len(gpu.partitions))
                patient = self.pool.patient_client(server, wait) if self.pool else None
                self.pool_action(server, what, call, outcome=drained, client=patient)

        self.push_screen(ConfirmScreen(question, yes="Undo drain" if undo else "Drain"), answered)

    def action_drain(self) -> None:
        """`d`: the server on the servers table, else the selected GPU."""
        focused = self.focused
        if focused is not None and focused.id == "pool-servers":
            self.action_drain_server()
        else:
            self.action_drain_gpu()

    def action_drain_server(self) -> None:
        picked = self._selected("pool-servers", "server")
        if picked is None or self._admin_client(picked[0]) is None:
            return
        server = picked[0]
        state = next((s for s in self.last_pool if s.url == server), None)
        if state is None or state.health is None:
            self.notify(f"{server} did not answer: refresh, then try again.", severity="warning")
            return
        undo = state.health.server.draining
        # Where its remote leases may go: the other servers watched that grant leases and have a GPU open.
        targets = [] if undo else [c.url for c in server_choices(server, self.last_pool)]
        if undo:
            question = f"{server} is draining. Let it grant new leases again?"
            what = f"{server}: granting new leases again"
        else:
            elsewhere = (
                f"its remote leases move, live, to {', '.join(targets)} where there is room; the others go on "
                "until their programs end."
                if targets
                else "no other server is watched, so the leases running on it go on until their programs end."
            )
            question = f"Drain {server}?\nIt grants no new lease (clients take other servers); {elsewhere}"
            what = f"draining {server}"

        def drained(result: tuple[api.ServerDrain, list[api.MigratedLease]]) -> tuple[str, bool]:
            done, moves = result
            if not done.draining:
                return f"{server} grants new leases again", False
            moved = [f"{m.id} → {m.server.hostname} (paused {m.migration.pause_s:.3f} s)" for m in moves]
            stayed = [f"{s.lease} stays: {s.reason}" for s in done.stayed]
            lines = "; ".join(moved + stayed) or "no lease on it"
            return f"{server} draining, no new leases; {lines}", bool(done.stayed)

        def answered(yes: bool | None) -> None:
            if yes:
                self.query_one(PoolView).show_action(what + " …", running=True)

                def call(c):
                    return (c.drain_server(undo=True), []) if undo else c.drain_server_moving(targets)

                # One move after another, each as long as a move to another server may take.
                wait = (MIGRATE_WAIT_S + 60) * max(1, len(state.leases))
                patient = self.pool.patient_client(server, wait) if self.pool else None
                self.pool_action(server, what, call, outcome=drained, client=patient)

        self.push_screen(ConfirmScreen(question, yes="Undo drain" if undo else "Drain"), answered)

    # Command palette -----------------------------------------------------------------------------
    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand(
            "Fleet view", "Hosts, GPUs and processes from telemetry", lambda: self.action_show_view("fleet")
        )
        yield SystemCommand(
            "Pool view", "Servers, partitions, leases and clients", lambda: self.action_show_view("pool")
        )
        yield SystemCommand(
            "History view",
            "Fleet summary and idle holders for a range",
            lambda: self.action_show_view("history"),
        )
        yield SystemCommand(
            "Refresh now", "Reload everything and retry unreachable servers", self.action_refresh
        )
        yield SystemCommand("Filter rows", "Show only rows containing some words", self.action_filter)
        yield SystemCommand("Sort table", "Sort the focused table by the next column", self.action_sort)
        yield SystemCommand(
            "Release lease", "Release the selected lease (admin, asks first)", self.action_release_lease
        )
        yield SystemCommand(
            "Set client limit", "GPU limit of the selected client (admin)", self.action_set_client_limit
        )
        yield SystemCommand(
            "Set client idle timeout",
            "Idle timeout of the selected client (admin)",
            self.action_set_client_idle_timeout,
        )
        yield SystemCommand(
            "Set default idle timeout",
            "Default idle timeout of the selected server (admin)",
            self.action_set_default_idle_timeout,
        )
        yield SystemCommand(
            "Migrate lease",
            "Move the selected remote lease to another GPU, live (admin)",
            self.action_migrate_lease,
        )
        yield SystemCommand(
            "Drain GPU",
            "Drain the selected GPU, or undo its drain (admin, asks first)",
            self.action_drain_gpu,
        )
        yield SystemCommand(
            "Drain server",
            "Stop the selected server granting leases, or undo its drain (admin, asks first)",
            self.action_drain_server,
        )
        for label in HistoryView.RANGES:
            yield SystemCommand(
                f"History range {label}",
                f"Show the last {label} in History",
                lambda r=label: self._history_range(r),
            )
        yield SystemCommand("Keys", "Every key of the console", self.action_help)

    def _history_range(self, label: str) -> None:
        self.action_show_view("history")
        self.query_one(HistoryView).set_range(label)


def parse_limit(text: str) -> float | None:
    t = text.strip().lower()
    if t in ("default", ""):
        return None
    try:
        value = float(t)
    except ValueError:
        raise ValueError(f"not a number: {text!r} (e.g. 2.5, or 'default')") from None
    return _in_range("limit", value)


def parse_idle_timeout(text: str) -> float | None:
    t = text.strip().lower()
    if t in ("default", ""):
        return None
    if t == "never":
        return 0.0
    return _in_range("idle_timeout_s", parse_duration(t))


def _in_range(field: str, value: float) -> float:
    """The servers' range of a client setting (server.ranges), checked before the dialog closes."""
    if why := CLIENT_RANGES[field].problem(value):
        raise ValueError(why)
    return value


def _shown_value(field: str, value: float | None) -> str:
    if value is None:
        return "the default"
    if field == "limit":
        return f"{value:g}"
    return fmt.idle_timeout(value)
