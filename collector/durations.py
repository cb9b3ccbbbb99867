"""Durations as people write them: one parser for every command line and config file of gpupool.

``90`` or ``"90"`` (seconds), ``"500ms"``, ``"30s"``, ``"10m"`` (or ``"10min"``), ``"8h"``, ``"7d"``,
``"2w"``, ``"1y"``; units are case-insensitive. ``argument()`` makes it an argparse type, ``setting()``
reads a config file's or an API's value and names the setting in the caller's own error class; each
caller adds its own bounds; none is longer than ``LONGEST`` (``100000000d`` is a typo, and past the
calendar's end for any date it moves). ``format_duration`` is the one formatter (five styles).
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

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


def argument(*, positive: bool = True) -> Callable[[str], float]:
    """An argparse ``type`` for a duration option: the parser's message on a bad value; with ``positive``
    (the default) zero is refused too (an interval, a refresh period), else zero means "never"."""

    def parse(text: str) -> float:
        try:
            seconds = parse_duration(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if seconds < 0 or (positive and seconds == 0):
            raise argparse.ArgumentTypeError(f"duration must be more than zero: {text!r}")
        return seconds

    parse.__name__ = "duration"  # argparse names the type in its own messages
    return parse


def setting(value: object, what: str, error: Callable[[str, str], Exception]) -> float:
    """A duration from a config file, an option or an API body, naming the setting ``what`` when it is not
    one (``error(title, hint)``: the caller's own error class). One too long to be a duration is infinite:
    the setting's own range (``server.ranges``) then refuses it, naming that setting's bounds."""
    try:
        return parse_duration(value)
    except OutOfRange:
        return math.inf
    except ValueError:
        raise error(f"{what}: {value!r} is not a duration", f"write e.g. {EXAMPLES}") from None


# --- the one formatter ---------------------------------------------------------------------------------
# (name, seconds, word): the units a duration is shown in, largest first.
_SHOWN = (("y", UNITS["y"], "y"), ("d", UNITS["d"], "day"), ("h", UNITS["h"], "h"), ("m", UNITS["m"], "min"))


def format_duration(seconds: float, style: str = "short") -> str:
    """``seconds`` as people read it, in one of five styles (each place keeps the one its readers know):

    short     the largest unit it reaches, 3 significant digits: 45s, 1.5m, 2.5h, 3d (days: whole hours)
    exact     the largest unit that divides it, as parse_duration reads it back: 90s, 10m, 1d, 100y
    words     exact, spelled for a report: 45 s, 10 min, 3 h, 1 day, 2 days
    clock     two fields, whole seconds (a console's ages): 45s, 12m05s, 3h20m, 2d04h
    measured  3 significant digits from ms to h (intervals as measured): 250 ms, 1.5 s, 2.5 min, 3.1 h
    """
    if style == "short":
        if seconds >= UNITS["d"] and seconds % UNITS["h"] == 0:
            return f"{seconds / UNITS['d']:g}d"
        unit, size = next(((u, s) for u, s, _ in _SHOWN[2:] if seconds >= s), ("s", 1.0))
        return f"{seconds / size:.3g}{unit}"
    if style in ("exact", "words"):
        spelled = style == "words"
        for unit, size, word in _SHOWN[1:] if spelled else _SHOWN:
            if seconds >= size and seconds % size == 0:
                n = seconds / size
                return f"{n:g} {word}{'s' if word == 'day' and n != 1 else ''}" if spelled else f"{n:g}{unit}"
        return f"{seconds:g} s" if spelled else f"{seconds:g}s"
    if style == "clock":
        s = max(0, int(seconds))
        for big, small in (("d", "h"), ("h", "m"), ("m", "s")):
            if s >= UNITS[big]:
                rest = s % int(UNITS[big]) // int(UNITS[small])
                return f"{s // int(UNITS[big])}{big}{rest:02d}{small}"
        return f"{s}s"
    if style == "measured":
        if seconds < 1:
            return f"{seconds * 1000:.3g} ms"
        if seconds < 120:
            return f"{seconds:.3g} s"
        if seconds < 7200:
            return f"{seconds / 60:.3g} min"
        return f"{seconds / 3600:.3g} h"
    raise ValueError(f"unknown duration style {style!r}")
