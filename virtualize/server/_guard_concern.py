"""What each of the lease guard's per-concern handlers is: the calls it serves, by their names in the call
table, and the state it keeps for one connection (`_executor_guard.Session` registers them all)."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from virtualize.server._guard_rules import call_named

EMPTY = (b"", b"")  # an answer with no outs and no bulk
ANSWERED = object()  # what a handler returns that streamed its own reply


class Concern:
    """One concern of the guard for one connection. `session` is the connection's
    `_executor_guard.Session` (its lease, executor, channel, context and checks); it is not imported
    here, so the guard and its handlers import one way only."""

    # call (exported symbol, or an internal call's name) -> the method that serves it
    CALLS: ClassVar[dict[str, str]] = {}

    def __init__(self, session) -> None:
        self.session = session

    def handlers(self) -> dict[str, Callable]:
        """Each call this serves, by its name in the call table, to its method (Session.special); a name
        the table lacks fails here (call_named), when the first connection starts."""
        return {name: getattr(self, method) for name, method in self.CALLS.items() if call_named(name)}

    def close(self) -> None:
        """The client is gone: release what this concern kept for it (nothing, unless it says)."""
