"""Modal screens: help, a yes/no confirmation, a one-field prompt with validation, and the pick of a
migration's target GPU or server."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, OptionList, Static
from textual.widgets.option_list import Option

from server.api import Gpu, Lease
from tui import _format as fmt

# (section, [(keys, what they do)]): the help screen and docs/console.md say the same.
HELP: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    (
        "Everywhere",
        (
            ("1  2  3", "Fleet, Pool, History view"),
            ("enter", "on a host (Fleet): show only its GPUs"),
            ("tab  shift+tab", "next / previous table"),
            ("↑ ↓ pgup pgdn home end", "move in a table"),
            ("/", "filter the rows of this view (words, any column); esc clears"),
            ("s  S", "sort this table by the next column / reverse it (or click a header)"),
            ("r", "refresh now (also retries unreachable servers at once)"),
            ("ctrl+p", "command palette: every action by name"),
            ("?", "this help"),
            ("q", "quit"),
        ),
    ),
    (
        "Pool view (admin token)",
        (
            ("x", "release the selected lease (asks first)"),
            ("l", "set the selected client's GPU limit (sum of fractions; 'default' clears)"),
            ("i", "set the selected client's idle timeout (30m; 0 = never; 'default' clears)"),
            ("I", "set the default idle timeout of the selected server"),
            (
                "m",
                "migrate the selected remote lease to another GPU of its server or to another server, live (pick where)",
            ),
            (
                "d",
                "drain the selected GPU (its remote leases move off, no new ones) or, on the servers "
                "table, the server (no new leases) / undo a drain",
            ),
        ),
    ),
    ("History view", (("[  ]", "shorter / longer range: 1h 6h 24h 7d 30d all"),)),
)
HELP_NOTES = (
    "A failed action says why in a red notice; nothing changed on the server then.\n"
    "Util is the driver's duty cycle (some kernel was running); SM is GPM SM activity (how much of "
    "the GPU was busy), the truer measure of use on Hopper and later. – means not reported."
)


def help_renderable() -> Group:
    parts: list = [Text("gpupool console — keys", style="bold")]
    for section, rows in HELP:
        table = Table(title=section, title_justify="left", title_style="bold", expand=True, show_edge=False)
        table.add_column("key", style="bold cyan", no_wrap=True)
        table.add_column("what it does")
        for keys, what in rows:
            table.add_row(keys, what)
        parts += [Text(""), table]
    parts += [Text(""), Text(HELP_NOTES, style="dim")]
    return Group(*parts)


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,question_mark", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            yield Static(help_renderable())


class ConfirmScreen(ModalScreen[bool]):
    """Ask one question; `y`/enter on Yes confirms, `n`/esc cancels."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n,escape", "answer(False)", "No"),
    ]

    def __init__(self, question: str, *, yes: str = "Yes"):
        super().__init__()
        self.question = question
        self.yes_label = yes

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.question, classes="question")
            with Horizontal(classes="buttons"):
                yield Button(f"{self.yes_label} (y)", id="yes", variant="error")
                yield Button("Cancel (n)", id="no", variant="primary")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()  # the safe answer is the default

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


CANCELLED = object()  # what PromptScreen answers on escape (None can be a real answer: "default")


class PromptScreen(ModalScreen[Any]):
    """Ask for one value; ``parse`` turns the text into it or raises ValueError with the reason."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, question: str, parse: Callable[[str], Any], *, value: str = "", placeholder: str = ""):
        super().__init__()
        self.question = question
        self.parse = parse
        self.value = value
        self.placeholder = placeholder

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.question, classes="question")
            yield Input(value=self.value, placeholder=self.placeholder, id="prompt-input")
            yield Label("", id="prompt-error", classes="error")
            yield Label("enter: apply   esc: cancel", classes="hint")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        try:
            result = self.parse(event.value)
        except ValueError as exc:
            self.query_one("#prompt-error", Label).update(str(exc))
            return
        self.dismiss(result)

    def action_cancel(self) -> None:
        self.dismiss(CANCELLED)


@dataclass(frozen=True)
class MigrationChoice:
    """One move the operator can pick: a partition of the lease to one GPU it does not hold."""

    partition: int
    source: int  # GPU index the partition runs on now
    target: Gpu

    @property
    def label(self) -> str:
        g = self.target
        note = "   draining" if g.draining else ""
        return (
            f"partition {self.partition}: GPU {self.source} → GPU {g.index}  {g.name}  "
            f"free {fmt.mib(g.mem_free_bytes)} ({fmt.ratio(g.free_fraction)}){note}"
        )


def migration_choices(lease: Lease, gpus: Sequence[Gpu]) -> list[MigrationChoice]:
    """Every (partition, other GPU) pair, the most free memory first (draining GPUs last): the first is
    the default. Whether the server accepts one (model, order, room) is the server's to say."""
    held = {p.gpu_index for p in lease.partitions}
    choices = [
        MigrationChoice(i, p.gpu_index, g)
        for i, p in enumerate(lease.partitions)
        for g in gpus
        if g.index not in held
    ]
    return sorted(
        choices, key=lambda c: (c.target.draining, -c.target.mem_free_bytes, c.partition, c.target.index)
    )


@dataclass(frozen=True)
class ServerChoice:
    """Moving the whole lease to another server the console watches (`url`), whose roomiest GPU is `roomiest`."""

    url: str
    roomiest: Gpu

    @property
    def label(self) -> str:
        g = self.roomiest
        return (
            f"whole lease → server {self.url}  (GPU {g.index} {g.name} free {fmt.mib(g.mem_free_bytes)}; "
            "the program reconnects there)"
        )


def server_choices(here: str, states: Sequence) -> list[ServerChoice]:
    """Each other reachable server the console watches that grants leases (not draining) and has a GPU that
    is not draining, the one with the most free memory first. Whether it admits the lease (model, room) and
    whether the lease can leave its host is the servers' to say."""
    choices = []
    for state in states:
        health = getattr(state, "health", None)
        if state.url == here or not state.reachable or (health is not None and health.server.draining):
            continue
        open_gpus = [g for g in state.gpus if not g.draining]
        if open_gpus:
            choices.append(ServerChoice(state.url, max(open_gpus, key=lambda g: g.mem_free_bytes)))
    return sorted(choices, key=lambda c: -c.roomiest.mem_free_bytes)


class MigrateScreen(ModalScreen[MigrationChoice | ServerChoice | None]):
    """Pick where a lease moves: enter migrates to the highlighted GPU or server, esc cancels."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, question: str, choices: Sequence[MigrationChoice | ServerChoice]):
        super().__init__()
        self.question = question
        self.choices = list(choices)

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.question, classes="question")
            yield OptionList(*(Option(c.label) for c in self.choices), id="migrate-targets")
            yield Label("enter: migrate to the highlighted GPU or server   esc: cancel", classes="hint")

    def on_mount(self) -> None:
        targets = self.query_one(OptionList)
        targets.highlighted = 0  # the GPU with the most room
        targets.focus()

    @on(OptionList.OptionSelected)
    def _selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.choices[event.option_index])

    def action_cancel(self) -> None:
        self.dismiss(None)
