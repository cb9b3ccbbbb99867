"""gpupool's ops console (`gpupool-console`): Textual views over telemetry and the pool servers' API.

The public face is small and loads lazily, so ``tui.cli`` (and ``--help``) start without Textual:

- ``ConsoleApp``: the app; its parts (fleet source, pool, history source, clock) go to the constructor.
- ``PoolClient``, ``PoolClientOptions``, ``PoolError``: the console's client of one gpupool-server.
- ``main``: the command line.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ConsoleApp", "PoolClient", "PoolClientOptions", "PoolError", "main"]

_WHERE = {
    "ConsoleApp": "tui.app",
    "PoolClient": "tui._pool_client",
    "PoolClientOptions": "tui._pool_client",
    "PoolError": "tui._pool_client",
    "main": "tui.cli",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'tui' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_WHERE[name]), name)
