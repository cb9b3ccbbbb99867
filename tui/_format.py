"""How the console writes numbers: sizes, ratios, durations, ages and text sparklines.

Pure functions (no Textual), so they are tested directly and the views stay declarative.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from collector.durations import format_duration

MISSING = "–"  # a metric the GPU or server does not report: never shown as 0
SPARK_LEVELS = "▁▂▃▄▅▆▇█"


def ratio(value: float | None) -> str:
    return MISSING if value is None or math.isnan(value) else f"{value * 100:.0f}%"


def gib(value: int | float | None) -> str:
    if value is None:
        return MISSING
    return f"{value / (1 << 30):.1f}"


def mem_used_total(used: int | None, total: int | None) -> str:
    """``12.5/80.0 GiB``: both numbers in GiB, as nvidia-smi users read them."""
    if used is None and total is None:
        return MISSING
    return f"{gib(used)}/{gib(total)} GiB"


def mib(value: int | None) -> str:
    return MISSING if value is None else f"{value / (1 << 20):,.0f} MiB"


def watts(value: float | None) -> str:
    return MISSING if value is None else f"{value:.0f} W"


def celsius(value: float | None) -> str:
    return MISSING if value is None else f"{value:.0f} °C"


def duration(seconds: float | None) -> str:
    """A short human duration: ``45s``, ``12m05s``, ``3h20m``, ``2d04h`` (``collector.durations``)."""
    return MISSING if seconds is None else format_duration(seconds, "clock")


def sparkline(values: Sequence[float | None], *, low: float = 0.0, high: float = 1.0) -> str:
    """One character per value on a fixed scale; a gap (None) is a space, so missing data never looks idle."""
    span = high - low
    out = []
    for v in values:
        if v is None or math.isnan(v):
            out.append(" ")
            continue
        level = 0 if span <= 0 else (min(max(v, low), high) - low) / span
        out.append(SPARK_LEVELS[min(len(SPARK_LEVELS) - 1, int(level * len(SPARK_LEVELS)))])
    return "".join(out)


def limit(value: float | None) -> str:
    return "unlimited" if value is None else f"{value:g}"


def idle_timeout(seconds: float | None) -> str:
    return "never" if not seconds else duration(seconds)
