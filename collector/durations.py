"""Durations as people write them: one parser for every command line and config file of gpupool.

``90`` or ``"90"`` (seconds), ``"500ms"``, ``"30s"``, ``"10m"`` (or ``"10min"``), ``"8h"``, ``"7d"``,
``"2w"``, ``"1y"``; units are case-insensitive. Each caller turns the ``ValueError`` into its own
one-line error (an argparse message, a 400 answer, a config error) and adds its own bounds; none is
longer than ``LONGEST`` (``100000000d`` is a typo, and past the calendar's end for any date it moves).
"""

from __future__ import annotations

import re

UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
UNITS["y"] = 365 * UNITS["d"]
LONGEST = 100 * UNITS["y"]
EXAMPLES = "500ms, 30s, 10m, 8h, 7d"
_PATTERN = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|min|[smhdwy])?\s*", re.IGNORECASE)


class OutOfRange(ValueError):
    """A duration written correctly but longer than ``LONGEST`` (or not finite)."""


def parse_duration(value: object) -> float:
    """Seconds in ``value`` (a number of seconds or a string with a unit); ValueError if it is neither."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        match = _PATTERN.fullmatch(value) if isinstance(value, str) else None
        if not match:
            raise ValueError(f"not a duration: {value!r} (write e.g. {EXAMPLES})")
        number, unit = match.groups()
        seconds = float(number) * UNITS[(unit or "s").lower()]
    if not abs(seconds) <= LONGEST:  # also NaN and infinities
        raise OutOfRange(f"duration out of range: {value!r} (at most 100y)")
    return seconds
