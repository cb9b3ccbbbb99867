"""The what-if's replay as it was before ``analytics._replay`` (a Python step per step and request):
the reference the vectorised replay is checked against (tests/test_analytics_whatif.py)."""

from __future__ import annotations

import math
from bisect import insort
from dataclasses import dataclass


@dataclass
class Request:
    """One observed use of a GPU, replayed as one partition request."""

    source: str  # "host / GPU n / pid p" or "host / GPU n"
    start: int  # step index
    busy: list[float]  # busy share per step of the run (ratio 0-1)
    mem_bytes: int
    parts: int = 0  # partitions of one pool GPU (set by the replay)
    placed: int = -1  # step the pool placed it (replay 2)
    origin: int = 0  # the observed request a piece belongs to (a request larger than a GPU is several)

    @property
    def steps(self) -> int:
        return len(self.busy)


def _runs(rows, key_of, first_step: int) -> list[Request]:
    """Cut (key, step, mem, busy) rows sorted by key and step into continuous runs."""
    out: list[Request] = []
    cur: Request | None = None
    last_key, last_step = None, None
    for row in rows:
        key, step, mem, busy = key_of(row)
        if cur is None or key != last_key or step != last_step + 1:
            cur = Request(key, step - first_step, [], 0)
            out.append(cur)
        cur.busy.append(min(max(float(busy or 0.0), 0.0), 1.0))
        cur.mem_bytes = max(cur.mem_bytes, int(mem or 0))
        last_key, last_step = key, step
    return out


class _Pool:
    """GPUs of ``size`` partitions; ``free[i]`` partitions left on GPU i."""

    def __init__(self, size: int, gpus: int = 0, growable: bool = True):
        self.size, self.growable = size, growable
        self.free = [size] * gpus

    def place(self, parts: int, policy: str) -> int | None:
        fits = [i for i, f in enumerate(self.free) if f >= parts]
        if fits:
            gpu = min(fits, key=lambda i: (self.free[i], i)) if policy == "best-fit" else fits[0]
        elif self.growable:
            self.free.append(self.size)
            gpu = len(self.free) - 1
        else:
            return None
        self.free[gpu] -= parts
        return gpu

    def in_use(self) -> int:
        return sum(1 for f in self.free if f < self.size)


def _order(arrivals: list[Request], policy: str) -> list[Request]:
    return sorted(arrivals, key=lambda r: -r.parts) if policy == "first-fit-decreasing" else arrivals


def _percentile(values: list[int], p: float) -> int:
    ordered = sorted(values)
    return ordered[max(math.ceil(p * len(ordered)) - 1, 0)] if ordered else 0


def _replay_unbounded(
    pieces: list[Request], horizon: int, g: int, policy: str
) -> tuple[list[int], list[int]]:
    """GPUs in use per step when every arrival is placed at once, and the repacked lower bound."""
    pool = _Pool(g)
    by_start: dict[int, list[Request]] = {}
    for r in pieces:
        by_start.setdefault(r.start, []).append(r)
    leaving: dict[int, list[tuple[int, int]]] = {}
    need, ideal = [], []
    held = 0
    for t in range(horizon):
        for gpu, parts in leaving.pop(t, []):
            pool.free[gpu] += parts
            held -= parts
        for r in _order(by_start.get(t, []), policy):
            gpu = pool.place(r.parts, policy)
            leaving.setdefault(t + r.steps, []).append((gpu, r.parts))
            held += r.parts
        need.append(pool.in_use())
        ideal.append(math.ceil(held / g))
    return need, ideal


def _replay_bounded(pieces: list[Request], horizon: int, gpus: int, g: int, policy: str) -> dict[str, float]:
    """Replay onto a fixed pool; requests that do not fit wait. Sets ``placed``; returns the pool's
    means over the observed span, or longer where waiting pushed work past its end."""
    pool = _Pool(g, gpus, growable=False)
    pending = sorted(pieces, key=lambda r: (r.start, r.source), reverse=True)  # pop() takes the earliest
    waiting: list[tuple[int, int, Request]] = []  # (arrival step, order, request): oldest first
    running: dict[int, list[tuple[Request, int]]] = {}  # gpu -> [(request, placed step)]
    order = 0
    util_sum = mem_sum = 0.0
    over = steps = 0
    t = 0
    for r in pieces:
        r.placed = -1
    while True:
        # Departures first: a run that ended frees its partitions for this step's arrivals.
        for gpu, tenants in running.items():
            keep = [(r, s) for r, s in tenants if t < s + r.steps]
            for r, s in tenants:
                if t >= s + r.steps:
                    pool.free[gpu] += r.parts
            running[gpu] = keep
        if t >= horizon and not (pending or waiting or any(running.values())):
            break
        arrivals = []
        while pending and pending[-1].start <= t:
            arrivals.append(pending.pop())
        for r in _order(arrivals, policy):
            insort(waiting, (r.start, order, r), key=lambda w: (w[0], w[1]))
            order += 1
        still = []
        for item in waiting:
            r = item[2]
            gpu = pool.place(r.parts, policy)
            if gpu is None:
                still.append(item)
            else:
                r.placed = t
                running.setdefault(gpu, []).append((r, t))
        waiting = still
        busy = [sum(r.busy[t - s] for r, s in running.get(i, [])) for i in range(gpus)]
        util_sum += sum(min(b, 1.0) for b in busy) / gpus
        mem_sum += sum(g - f for f in pool.free) / (gpus * g)
        over += sum(1 for b in busy if b > 1.0 + 1e-9)
        steps += 1
        t += 1
        if t > 10_000_000:  # pragma: no cover - guards a bug, not data
            raise RuntimeError("what-if replay did not finish")
    return {
        "util": util_sum / steps if steps else 0.0,
        "mem": mem_sum / steps if steps else 0.0,
        "oversubscribed": over / (steps * gpus) if steps else 0.0,
    }


def cut(requests: list[Request], gpu_mem: int, g: int) -> list[Request]:
    """The requests as pieces of one pool GPU, sorted by (start, source), as ``what_if`` did."""
    pieces: list[Request] = []
    for n, req in enumerate(requests):
        whole, rest = divmod(req.mem_bytes, gpu_mem)
        for _ in range(int(whole)):
            pieces.append(Request(req.source, req.start, list(req.busy), gpu_mem, g, origin=n))
        if rest or not whole:
            parts = max(1, math.ceil(rest / gpu_mem * g - 1e-9))
            pieces.append(Request(req.source, req.start, list(req.busy), int(rest), parts, origin=n))
    pieces.sort(key=lambda r: (r.start, r.source))
    return pieces
