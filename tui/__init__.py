"""gpupool's ops console (`gpupool-console`): Textual views over telemetry and the pool servers' API.

The public face is small and loads lazily, so ``tui.cli`` (and ``--help``) start without Textual:

- ``ConsoleApp``: the app; its parts (fleet source, pool, history source, clock) go to the constructor.
- the pool servers are reached through the pool's client library, ``server.client.ServerClient``.
- ``main``: the command line.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ConsoleApp", "main"]

_WHERE = {
    "ConsoleApp": "tui.app",
    "main": "tui.cli",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'tui' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_WHERE[name]), name)
