"""The three views. Each lays out a snapshot it is handed; none fetches or computes data itself."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.widgets import Static

from server.api import Client, Gpu, Lease
from tui import _format as fmt
from tui._sources import FleetSnapshot, GpuKey, ServerState
from tui._table import Column, Row, SyncTable


def _heat(value: float | None, text: str | None = None) -> Text:
    """A ratio coloured by how busy: dim when idle, green when busy."""
    shown = text if text is not None else fmt.ratio(value)
    if value is None:
        return Text(shown, style="dim")
    style = "bold green" if value >= 0.6 else "yellow" if value >= 0.2 else "dim"
    return Text(shown, style=style)


def _age(now: datetime, then: datetime | None) -> float | None:
    return None if then is None else (now - then).total_seconds()


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


class View(Vertical):
    """A view: some tables that share one filter."""

    @property
    def tables(self) -> list[SyncTable]:
        return list(self.query(SyncTable))

    def set_filter(self, text: str) -> None:
        for table in self.tables:
            table.set_filter(text)


# Fleet ------------------------------------------------------------------------------------------


def gpu_key(host: str, uuid: str) -> str:
    return f"{host}\x1f{uuid}"


def split_gpu_key(key: str) -> GpuKey:
    host, uuid = key.split("\x1f", 1)
    return host, uuid


class FleetView(View):
    HOSTS = (
        Column("host", "Host"),
        Column("gpus", "GPUs"),
        Column("util", "Util"),
        Column("sm", "SM"),
        Column("mem", "Memory"),
        Column("power", "Power"),
        Column("age", "Last sample"),
        Column("note", "Note"),
    )
    GPUS = (
        Column("host", "Host"),
        Column("index", "#"),
        Column("name", "Name"),
        Column("util", "Util"),
        Column("util_trend", "Util trend"),
        Column("sm", "SM"),
        Column("sm_trend", "SM trend"),
        Column("mem", "Memory"),
        Column("power", "Power"),
        Column("temp", "Temp"),
        Column("state", "State"),
    )
    PROCS = (
        Column("pid", "PID"),
        Column("user", "User"),
        Column("container", "Container"),
        Column("process", "Process"),
        Column("mem", "GPU memory"),
        Column("busy", "Busy share"),
    )

    def compose(self) -> ComposeResult:
        yield Static("", id="fleet-status", classes="status")
        hosts = SyncTable(self.HOSTS, id="fleet-hosts", empty="no hosts in the telemetry yet")
        hosts.border_title = "Hosts"
        yield hosts
        gpus = SyncTable(self.GPUS, id="fleet-gpus", empty="no GPUs")
        gpus.border_title = "GPUs"
        yield gpus
        procs = SyncTable(self.PROCS, id="fleet-procs", empty="no processes on this GPU")
        procs.border_title = "Processes of the selected GPU"
        yield procs

    def show_unavailable(self, message: str) -> None:
        self.query_one("#fleet-status", Static).update(Text(message, style="dim"))

    def update_fleet(self, snap: FleetSnapshot, now: datetime) -> None:
        newest = snap.newest
        status = Text(snap.source, style="bold")
        if newest is not None:
            status.append(f"   newest sample {newest:%Y-%m-%d %H:%M:%S} UTC")
            age = _age(now, newest)
            if age is not None and age > 60:
                status.append(f" ({fmt.duration(age)} ago: stale)", style="bold yellow")
            else:
                status.append(f" ({fmt.duration(age)} ago)")
        if any(g.simulated for g in snap.gpus):
            status.append("   SIMULATED fleet", style="bold magenta")
        if snap.error:
            status.append(f"   {snap.error}", style="bold red")
        self.query_one("#fleet-status", Static).update(status)
        self.query_one("#fleet-gpus", SyncTable).set_rows(self._gpu_rows(snap))
        self.query_one("#fleet-hosts", SyncTable).set_rows(self._host_rows(snap, now))

    def _gpu_rows(self, snap: FleetSnapshot) -> list[Row]:
        rows = []
        for g in snap.gpus:
            key = (g.host, g.gpu_uuid)
            util_trend = fmt.sparkline(snap.util_series.get(key, []))
            sm_trend = fmt.sparkline(snap.sm_series.get(key, []))
            state = Text(g.state, style="bold red" if g.state != "ok" else "")
            rows.append(
                Row(
                    gpu_key(*key),
                    (
                        g.host,
                        str(g.gpu_index),
                        g.gpu_name,
                        _heat(g.util_gpu),
                        Text(util_trend, style="green"),
                        _heat(g.sm_activity),
                        Text(sm_trend, style="cyan"),
                        fmt.mem_used_total(g.mem_used_bytes, g.mem_total_bytes),
                        fmt.watts(g.power_w),
                        fmt.celsius(g.temperature_c),
                        state,
                    ),
                    (
                        g.host,
                        g.gpu_index,
                        g.gpu_name,
                        g.util_gpu,
                        _mean(snap.util_series.get(key)),
                        g.sm_activity,
                        _mean(snap.sm_series.get(key)),
                        g.mem_used_bytes,
                        g.power_w,
                        g.temperature_c,
                        g.state,
                    ),
                )
            )
        return rows

    def _host_rows(self, snap: FleetSnapshot, now: datetime) -> list[Row]:
        by_host: dict[str, list] = {}
        for g in snap.gpus:
            by_host.setdefault(g.host, []).append(g)
        rows = []
        for host, gs in by_host.items():
            util = _mean([g.util_gpu for g in gs])
            sm = _mean([g.sm_activity for g in gs])
            used = sum(g.mem_used_bytes or 0 for g in gs)
            total = sum(g.mem_total_bytes or 0 for g in gs)
            power = sum(g.power_w or 0 for g in gs) if any(g.power_w is not None for g in gs) else None
            newest = max(g.ts for g in gs)
            age = _age(now, newest)
            notes = []
            if any(g.simulated for g in gs):
                notes.append("simulated")
            lost = sum(g.state != "ok" for g in gs)
            if lost:
                notes.append(f"{lost} GPU lost")
            rows.append(
                Row(
                    host,
                    (
                        host,
                        str(len(gs)),
                        _heat(util),
                        _heat(sm),
                        fmt.mem_used_total(used, total),
                        fmt.watts(power),
                        Text(fmt.duration(age) + " ago", style="yellow" if (age or 0) > 60 else ""),
                        Text(", ".join(notes), style="red" if lost else "magenta"),
                    ),
                    (host, len(gs), util, sm, used, power, age, ", ".join(notes)),
                )
            )
        return rows

    def update_processes(self, procs: Sequence[Any]) -> None:
        rows = [
            Row(
                str(p.pid),
                (
                    str(p.pid),
                    p.user or fmt.MISSING,
                    (p.container_id or "")[:12] or fmt.MISSING,
                    p.process_name or fmt.MISSING,
                    fmt.mib(p.mem_used_bytes),
                    fmt.ratio(p.sm_util),
                ),
                (p.pid, p.user, p.container_id, p.process_name, p.mem_used_bytes, p.sm_util),
            )
            for p in procs
        ]
        table = self.query_one("#fleet-procs", SyncTable)
        table.set_rows(rows)
        gpu = self.selected_gpu
        table.border_title = f"Processes on {gpu[0]} GPU {self._index_of(gpu)}" if gpu else "Processes"

    def _index_of(self, gpu: GpuKey) -> str:
        row = self.query_one("#fleet-gpus", SyncTable).selected
        return row.cells[1] if row is not None else gpu[1]

    @property
    def selected_gpu(self) -> GpuKey | None:
        key = self.query_one("#fleet-gpus", SyncTable).selected_key
        return split_gpu_key(key) if key else None


def _mean(values: Sequence[float | None] | None) -> float | None:
    present = [v for v in values or [] if v is not None]
    return sum(present) / len(present) if present else None


# Pool -------------------------------------------------------------------------------------------


def row_key(server: str, item: str) -> str:
    return f"{server}\x1f{item}"


def split_row_key(key: str) -> tuple[str, str]:
    server, item = key.split("\x1f", 1)
    return server, item


class PoolView(View):
    # Operator actions: shown in the footer while the Pool view has focus; the app runs them.
    BINDINGS: ClassVar[list[BindingType]] = [
        # Short labels: with the global keys they must fit a 150-column footer (`?` explains each).
        Binding("x", "app.release_lease", "Release"),
        Binding("l", "app.set_client_limit", "Limit"),
        Binding("i", "app.set_client_idle_timeout", "Idle"),
        Binding("I", "app.set_default_idle_timeout", "Default idle"),
        Binding("m", "app.migrate_lease", "Migrate"),
        Binding("d", "app.drain", "Drain"),
    ]
    SERVERS = (
        Column("server", "Server"),
        Column("status", "Status"),
        Column("host", "Host"),
        Column("gpus", "GPUs"),
        Column("leases", "Leases"),
        Column("limit", "Default limit"),
        Column("idle", "Default idle timeout"),
        Column("mode", "Mode"),
        Column("note", "Note"),
    )
    GPUS = (
        Column("host", "Host"),
        Column("index", "#"),
        Column("name", "Name"),
        Column("free", "Free"),
        Column("partitions", "Partitions (lease client share)"),
    )
    LEASES = (
        Column("lease", "Lease"),
        Column("client", "Client"),
        Column("host", "Host"),
        Column("size", "Size"),
        Column("age", "Age"),
        Column("idle", "Idle / timeout"),
        Column("expires", "Expires in"),
        Column("label", "Label"),
    )
    CLIENTS = (
        Column("client", "Client"),
        Column("host", "Host"),
        Column("usage", "Usage / limit"),
        Column("leases", "Leases"),
        Column("idle", "Idle timeout"),
    )

    # The last operator action's outcome (or the one under way), kept on the status line across refreshes.
    action: Text | None = None

    def compose(self) -> ComposeResult:
        yield Static("", id="pool-status", classes="status")
        for ident, title, spec, empty in (
            ("pool-servers", "Servers", self.SERVERS, "no servers"),
            ("pool-gpus", "GPUs and partitions", self.GPUS, "no GPUs (needs an admin token)"),
            ("pool-leases", "Leases", self.LEASES, "no active leases"),
            ("pool-clients", "Clients", self.CLIENTS, "no clients"),
        ):
            table = SyncTable(spec, id=ident, empty=empty)
            table.border_title = title
            yield table

    def show_unavailable(self, message: str) -> None:
        self.query_one("#pool-status", Static).update(Text(message, style="dim"))

    def update_pool(self, states: Sequence[ServerState], now: datetime, *, has_token: bool) -> None:
        up = sum(s.reachable for s in states)
        status = Text(f"{len(states)} server(s), {up} reachable", style="bold")
        if up < len(states):
            status.append(f", {len(states) - up} unreachable (retrying)", style="bold red")
        if not has_token:
            status.append("   read-only: no admin token", style="yellow")
        if any(s.health and s.health.simulated for s in states):
            status.append("   SIMULATED GPUs", style="bold magenta")
        self._status = status
        self._show_status()
        self.query_one("#pool-servers", SyncTable).set_rows([self._server_row(s, now) for s in states])
        gpus, leases, clients = [], [], []
        for s in states:
            gpus += [self._gpu_row(s, g) for g in s.gpus]
            leases += [self._lease_row(s, lease, now) for lease in s.leases]
            clients += [self._client_row(s, c) for c in s.clients]
        self.query_one("#pool-gpus", SyncTable).set_rows(gpus)
        self.query_one("#pool-leases", SyncTable).set_rows(leases)
        self.query_one("#pool-clients", SyncTable).set_rows(clients)

    def show_action(
        self, text: str, *, failed: bool = False, partial: bool = False, running: bool = False
    ) -> None:
        """Put an action's outcome (or that it is under way) on the status line, until the next one."""
        style = "bold red" if failed else "bold yellow" if partial else "yellow" if running else "bold green"
        self.action = Text(text, style=style)
        self._show_status()

    def _show_status(self) -> None:
        status = getattr(self, "_status", None) or Text("")
        if self.action is not None:
            status = Text.assemble(status, "\n", self.action)
        self.query_one("#pool-status", Static).update(status)

    def _server_row(self, s: ServerState, now: datetime) -> Row:
        health, info, policy = s.health, s.health.server if s.health else None, s.policy
        draining = bool(s.reachable and info and info.draining)  # grants no new lease (gpupool-server drain)
        if draining:
            status = Text("draining", style="bold magenta")
        elif s.reachable:
            status = Text("ok", style="bold green")
        else:
            down = fmt.duration(_age(now, s.down_since)) if s.down_since else fmt.MISSING
            tries = "1 try" if s.failures == 1 else f"{s.failures} tries"
            status = Text(f"unreachable {down} ({tries})", style="bold red")
        mode = []
        if health and (health.simulated or health.server.simulated):
            mode.append("simulated")
        if info and info.mps:
            mode.append("mps")
        if info and info.tls:
            mode.append("tls")
        leases = health.leases_active if health else None
        note = s.error or ""
        return Row(
            s.url,
            (
                s.url,
                status,
                info.hostname if info else fmt.MISSING,
                str(info.gpu_count) if info else fmt.MISSING,
                fmt.MISSING if leases is None else str(leases),
                fmt.limit(policy.default_limit) if policy else fmt.MISSING,
                fmt.idle_timeout(policy.default_idle_timeout_s) if policy else fmt.MISSING,
                ", ".join(mode) or ("nvml" if health else fmt.MISSING),
                Text(note, style="red" if not s.reachable else "yellow"),
            ),
            (
                s.url,
                "draining" if draining else "ok" if s.reachable else "unreachable",
                info.hostname if info else None,
                info.gpu_count if info else None,
                leases,
                policy.default_limit if policy else None,
                policy.default_idle_timeout_s if policy else None,
                ", ".join(mode),
                note,
            ),
        )

    def _gpu_row(self, s: ServerState, g: Gpu) -> Row:
        parts = [f"{p.lease_id} {p.client} {p.fraction:g}" for p in g.partitions]
        free = g.free_fraction
        free_text = Text(
            f"{fmt.ratio(free)} ({fmt.mib(g.mem_free_bytes)})",
            style="green" if free >= 0.999 else "yellow" if free else "red",
        )
        if g.draining:  # its free memory takes no new lease (gpupool-server drain)
            free_text = Text.assemble(("draining ", "bold magenta"), free_text)
        return Row(
            row_key(s.url, g.uuid),
            (
                s.hostname,
                str(g.index),
                g.name,
                free_text,
                " | ".join(parts) or Text("free", style="dim"),
            ),
            (s.hostname, g.index, g.name, free, " ".join(parts)),
        )

    def _lease_row(self, s: ServerState, lease: Lease, now: datetime) -> Row:
        parts = lease.partitions
        fractions = sorted({round(p.fraction, 4) for p in parts})
        mem = sum(p.mem_bytes for p in parts)
        share = f"{fractions[0]:g}" if len(fractions) == 1 else "+".join(f"{f:g}" for f in fractions)
        size = f"{len(parts)} × {share} ({fmt.mib(mem)})"
        created = _parse_time(lease.created_at)
        last_active = _parse_time(lease.last_active_at) or created
        idle_for = _age(now, last_active)
        timeout = lease.idle_timeout_s
        idle_text = f"{fmt.duration(idle_for)} / {fmt.idle_timeout(timeout)}"
        style = ""
        if timeout and idle_for is not None:
            style = "bold red" if idle_for >= timeout else "yellow" if idle_for >= 0.75 * timeout else ""
        expires = _age(_parse_time(lease.expires_at) or now, now)
        return Row(
            row_key(s.url, lease.id),
            (
                lease.id,
                lease.client,
                s.hostname,
                size,
                fmt.duration(_age(now, created)),
                Text(idle_text, style=style),
                fmt.duration(expires),
                lease.label or "",
            ),
            (
                lease.id,
                lease.client,
                s.hostname,
                lease.fraction_total or sum(p.fraction for p in parts),
                _age(now, created),
                idle_for,
                expires,
                lease.label,
            ),
        )

    def _client_row(self, s: ServerState, c: Client) -> Row:
        usage, limit = c.usage, c.limit
        style = "bold red" if limit is not None and usage >= limit > 0 else ""
        source = lambda chosen: " (default)" if chosen == "default" else ""  # noqa: E731
        return Row(
            row_key(s.url, c.client),
            (
                c.client,
                s.hostname,
                Text(f"{usage:g} / {fmt.limit(limit)}{source(c.limit_source)}", style=style),
                str(c.leases_active),
                fmt.idle_timeout(c.idle_timeout_s) + source(c.idle_timeout_source),
            ),
            (c.client, s.hostname, usage, c.leases_active, c.idle_timeout_s),
        )
