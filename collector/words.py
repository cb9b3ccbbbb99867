"""Counts as people write them: ``plural(1, "server")`` is "1 server", ``plural(3, "GPU")`` "3 GPUs".

One helper for every message of gpupool (command lines, logs, the report), so none says "1 servers".
"""

from __future__ import annotations

__all__ = ["plural"]

_IRREGULAR = {"process": "processes", "day": "days", "entry": "entries", "is": "are", "was": "were"}


def plural(n: float, noun: str, many: str | None = None) -> str:
    """``n`` and ``noun`` in agreement; ``many`` overrides the plural form. Integers get thousands separators."""
    word = noun if n == 1 else (many or _IRREGULAR.get(noun) or noun + "s")
    count = f"{n:,}" if isinstance(n, int) else f"{n:g}"
    return f"{count} {word}"
