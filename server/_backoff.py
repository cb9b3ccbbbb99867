"""Bounded exponential back-off with jitter, for waiting until the pool has room.

"Equal jitter": each delay is half the exponential step plus a random part of the other half, so
delays grow (0.25 s, 0.5 s, 1 s, … up to ``max_s``) while clients that were refused together do not
come back together. The total wait is bounded by the caller's deadline.
"""

from __future__ import annotations

import random
from collections.abc import Iterator


def delays(
    initial_s: float = 0.25, factor: float = 2.0, max_s: float = 8.0, rng: random.Random | None = None
) -> Iterator[float]:
    rng = rng or random.Random()
    step = initial_s
    while True:
        yield step / 2 + rng.uniform(0, step / 2)
        step = min(max_s, step * factor)
