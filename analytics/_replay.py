"""The what-if's two replays of partition requests onto a pool of GPUs, event by event.

A pool's state only changes when a request arrives or leaves, so the replays visit those instants
(a Python step per arrival and per departure, each O(pool GPUs) in numpy), never every step: a
minute-resolution replay of 90 days is 129,600 steps but only as many events as requests. What is
asked per step (GPUs in use, partitions held, the tenants' busy shares added per GPU) is then
computed for all steps at once from each request's placement: difference arrays for the counts, a
scatter-add of the busy shares for the load, a block of pool GPUs at a time so memory stays bounded.

The rules are those of ``_whatif``'s docstring: within one step departures come first, then
arrivals in order (for ``first-fit-decreasing`` the step's arrivals largest first), each placed by
the policy; on a fixed pool a request that does not fit waits, and each step the waiting ones are
tried again oldest first (a later, smaller one may go first when it fits).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass

import numpy as np

# (pool GPU, step) cells of busy shares added up at once: 16 MiB of float64, and several index
# arrays of the busy cells beside them (with 8 M cells the replay's peak was the what-if's: 1.78 GiB
# at 512 GPUs over 90 days; with 2 M it stays under the grid's).
_CELLS = 2_000_000


@dataclass
class Pieces:
    """Requests cut to what one pool GPU holds, in arrival order (step, then source).

    A request larger than a pool GPU is several pieces (whole GPUs, then the rest) with the same
    ``origin``, start and duration. ``busy`` holds every request's busy share per step of its run,
    request after request: request r's are ``busy[offset[r] : offset[r] + steps of r]``.
    """

    start: np.ndarray  # step of arrival (int64)
    steps: np.ndarray  # duration in steps
    parts: np.ndarray  # partitions of one pool GPU
    origin: np.ndarray  # index of the request the piece belongs to
    busy: np.ndarray  # float64, per request and step
    offset: np.ndarray  # per request: where its busy shares start in ``busy``

    def __len__(self) -> int:
        return len(self.start)


class _Pool:
    """Free partitions per GPU (``free[:n]``), placement by policy; grows when allowed."""

    def __init__(self, size: int, gpus: int, growable: bool):
        self.size, self.growable, self.n = size, growable, gpus
        self.free = np.full(max(gpus, 16), size, np.int64)

    def place(self, parts: int, policy: str) -> int:
        """The GPU that takes ``parts`` (a fixed pool's caller has checked that one has room)."""
        free = self.free[: self.n]
        if policy == "best-fit":
            # The GPU left with the least room, the lowest-numbered of those.
            room = np.where(free >= parts, free, self.size + 1)
            gpu = int(room.argmin()) if len(room) else 0
            ok = len(room) > 0 and room[gpu] <= self.size
        else:
            fits = free >= parts
            gpu = int(fits.argmax()) if len(fits) else 0
            ok = len(fits) > 0 and bool(fits[gpu])
        if not ok:
            if not self.growable:
                raise RuntimeError(f"no GPU of the fixed pool has {parts} partition(s) free")
            if self.n == len(self.free):
                self.free = np.concatenate([self.free, np.full(len(self.free), self.size, np.int64)])
            gpu, self.n = self.n, self.n + 1
        self.free[gpu] -= parts
        return gpu


def _step_groups(p: Pieces, policy: str, rest_first: bool = False):
    """(step, piece indices in the order they are placed) per arrival step. ``rest_first``: a
    request's pieces in reverse (its partial GPU, then its whole ones), the fixed pool's order."""
    order = np.arange(len(p))
    if rest_first and len(p):
        request = np.cumsum(np.r_[True, p.origin[1:] != p.origin[:-1]])
        order = np.lexsort((-order, request))
    bounds = np.flatnonzero(np.diff(p.start[order])) + 1
    for idx in np.split(order, bounds):
        if len(idx) == 0:
            continue
        if policy == "first-fit-decreasing":
            idx = idx[np.argsort(-p.parts[idx], kind="stable")]
        yield int(p.start[idx[0]]), idx.tolist()


def unbounded(p: Pieces, horizon: int, size: int, policy: str) -> tuple[np.ndarray, np.ndarray]:
    """GPUs holding a partition per step when every arrival is placed at once (a GPU opens when
    none has room), and the repacked lower bound ceil(partitions held / size)."""
    pool = _Pool(size, 0, growable=True)
    opened = np.zeros(horizon + 1, np.int64)  # +1 where a GPU turns non-empty, -1 where it empties
    leaving: list[tuple[int, int, int]] = []  # (step, gpu, parts)
    parts, steps = p.parts.tolist(), p.steps.tolist()

    def depart_until(t: int) -> None:
        while leaving and leaving[0][0] <= t:
            end, gpu, n = heapq.heappop(leaving)
            pool.free[gpu] += n
            if pool.free[gpu] == size:
                opened[end] -= 1

    for t, idx in _step_groups(p, policy):
        depart_until(t)
        for i in idx:
            gpu = pool.place(parts[i], policy)
            if pool.free[gpu] + parts[i] == size:
                opened[t] += 1
            heapq.heappush(leaving, (t + steps[i], gpu, parts[i]))
    depart_until(horizon)
    held = np.zeros(horizon + 1, np.int64)
    np.add.at(held, p.start, p.parts)
    np.add.at(held, p.start + p.steps, -p.parts)
    need = np.cumsum(opened)[:horizon]
    ideal = -(-np.cumsum(held)[:horizon] // size)
    return need, ideal


@dataclass
class Bounded:
    placed: np.ndarray  # step each piece was placed
    util: float  # mean over the pool's GPUs and steps of min(1, tenants' busy shares)
    mem: float  # partitions held / partitions in the pool, averaged over the steps
    oversubscribed: float  # share of GPU-steps whose tenants' busy shares add to more than 1
    steps: int  # the observed span, or longer where waiting pushed work past its end


def bounded(p: Pieces, horizon: int, gpus: int, size: int, policy: str) -> Bounded:
    """Replay onto a fixed pool of ``gpus``: a piece that does not fit waits until one does."""
    pool = _Pool(size, gpus, growable=False)
    placed = np.full(len(p), -1, np.int64)
    on = np.full(len(p), -1, np.int64)
    parts, steps = p.parts.tolist(), p.steps.tolist()
    # Waiting pieces by size; across sizes the oldest (arrival step, then order) goes first. Free
    # room only shrinks while a step places, so once a size's oldest fails, all of that size wait.
    waiting: dict[int, deque[tuple[int, int]]] = {}
    seq = 0
    leaving: list[tuple[int, int]] = []  # (step, piece)
    groups = list(_step_groups(p, policy, rest_first=True))
    g = 0
    while g < len(groups) or leaving:
        t = groups[g][0] if g < len(groups) else leaving[0][0]
        if leaving:
            t = min(t, leaving[0][0])
        while leaving and leaving[0][0] <= t:
            _, i = heapq.heappop(leaving)
            pool.free[on[i]] += parts[i]
        if g < len(groups) and groups[g][0] == t:
            for i in groups[g][1]:
                waiting.setdefault(parts[i], deque()).append((seq, i))
                seq += 1
            g += 1
        heads = [(q[0][0], n) for n, q in waiting.items() if q]
        heapq.heapify(heads)
        while heads:
            _, n = heapq.heappop(heads)
            if n > pool.free[: pool.n].max():
                continue
            q = waiting[n]
            _, i = q.popleft()
            on[i] = pool.place(n, policy)
            placed[i] = t
            heapq.heappush(leaving, (t + steps[i], i))
            if q:
                heapq.heappush(heads, (q[0][0], n))
        if not leaving and any(waiting.values()):  # pragma: no cover - an empty pool fits any piece
            raise RuntimeError("what-if replay did not finish")
    total = max(horizon, int((placed + p.steps).max(initial=0)))
    util, over = _load(p, placed, on, gpus, total)
    cells = gpus * total
    return Bounded(
        placed=placed,
        util=util / cells if cells else 0.0,
        mem=float((p.parts * p.steps).sum()) / (cells * size) if cells else 0.0,
        oversubscribed=over / cells if cells else 0.0,
        steps=total,
    )


def _load(p: Pieces, placed: np.ndarray, on: np.ndarray, gpus: int, total: int) -> tuple[float, int]:
    """(sum over GPU-steps of min(1, busy), GPU-steps with busy above 1), busy being the tenants'
    shares added per GPU and step, a block of GPUs at a time."""
    order = np.argsort(on, kind="stable")
    per_block = max(1, _CELLS // max(total, 1))
    util, over = 0.0, 0
    for lo in range(0, gpus, per_block):
        hi = min(lo + per_block, gpus)
        sel = order[np.searchsorted(on[order], lo) : np.searchsorted(on[order], hi)]
        if len(sel) == 0:
            continue
        lengths = p.steps[sel]
        k = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        cell = np.repeat((on[sel] - lo) * total + placed[sel], lengths) + k
        share = p.busy[np.repeat(p.offset[p.origin[sel]], lengths) + k]
        busy = np.bincount(cell, weights=share, minlength=(hi - lo) * total)
        util += float(np.minimum(busy, 1.0).sum())
        over += int((busy > 1.0 + 1e-9).sum())
    return util, over


def percentile(values: np.ndarray, q: float) -> int:
    """Nearest rank: the smallest value that at least ``q`` of the values are at or below."""
    if len(values) == 0:
        return 0
    k = max(int(np.ceil(q * len(values))) - 1, 0)
    return int(np.partition(values, k)[k])
