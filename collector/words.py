"""Counts as people write them: ``plural(1, "server")`` is "1 server", ``plural(3, "GPU")`` "3 GPUs".

One helper for every message of gpupool (command lines, logs, the report), so none says "1 servers";
and the one sentence that tells of a clock stepping back, which the importer and every page say alike.
"""

from __future__ import annotations

import datetime as dt

__all__ = ["clock_steps", "plural", "span"]

_IRREGULAR = {"process": "processes", "day": "days", "entry": "entries", "is": "are", "was": "were"}


def plural(n: float, noun: str, many: str | None = None) -> str:
    """``n`` and ``noun`` in agreement; ``many`` overrides the plural form. Integers get thousands separators."""
    word = noun if n == 1 else (many or _IRREGULAR.get(noun) or noun + "s")
    count = f"{n:,}" if isinstance(n, int) else f"{n:g}"
    return f"{count} {word}"


def span(seconds: float) -> str:
    """A length of time as people say it: "0.5 s", "45 s", "5 min", "5 min 30 s", "1 h 30 min", "2 d 3 h"."""
    if seconds < 60:
        return f"{seconds:.3g} s"
    whole = round(seconds)
    for unit, size, small, small_size in (
        ("d", 86400, "h", 3600),
        ("h", 3600, "min", 60),
        ("min", 60, "s", 1),
    ):
        if whole >= size:
            count, rest = divmod(whole, size)
            return f"{count} {unit}" + (f" {rest // small_size} {small}" if rest >= small_size else "")
    return f"{whole} s"


def clock_steps(steps: list[tuple[str, str, float, dt.datetime, str, str, int]]) -> str:
    """Steps back of GPUs' clocks, each (GPU, host, step in seconds, the time the log stamped on the
    first sample after it, file, position in it, samples placed), and what the importer did, in one
    line: the step, or how many and the first."""
    gpu, host, step_s, stamped, file, position, samples = steps[0]
    first = (
        f"the clock of GPU {gpu} on host {host} stepped back {span(step_s)} at "
        f"{stamped.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S} UTC ({file} {position}); "
        f"{plural(samples, 'sample')} placed after their predecessors"
    )
    if len(steps) == 1:
        return first
    gpus, hosts = len({(s[1], s[0]) for s in steps}), len({s[1] for s in steps})
    return (
        f"clocks stepped back {plural(len(steps), 'time')} ({plural(gpus, 'GPU')} on {plural(hosts, 'host')}; "
        f"first: {first})"
    )
