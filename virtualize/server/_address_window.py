"""Device addresses reserved up front: each client process's allocations land in a window of device
address space that the client has reserved in its own address space as well.

A client tells its own host pointers from device pointers by address, so a device address must never
be host memory of the client (nor become it later). Before its first allocation the shim asks the
worker for a window (gpWindowOffer): the worker reserves a range of device address space
(`Executor.reserve_addresses`, CUDA's cuMemAddressReserve) at a spot chosen far from where Linux puts
a process's own mappings, the shim reserves the same range in its process (PROT_NONE,
MAP_FIXED_NOREPLACE) and accepts it (gpWindowAccept); a range the shim cannot take is dropped and
another offered. From then on this module serves the process's cuMemAlloc and stream-ordered
allocations from its window, with the driver's virtual memory API (`map_memory`: cuMemCreate,
cuMemMap, cuMemSetAccess): the window is cut into 2 MiB pages (the driver's mapping granule), an
allocation above SMALL bytes gets pages of its own, mapped for it, and smaller ones share a page (a
slab) at SMALL_ALIGN-byte alignment, as the driver's own allocator packs small buffers.

The window is four times the lease's memory (at least 64 GiB): address space, not memory. Should
fragmentation still leave no room, the allocation is made by the driver as before the window
existed, and the shim reserves its address when it arrives (`WindowFull`).
"""

from __future__ import annotations

import bisect
import logging
import os
import random
import threading
from dataclasses import dataclass, field

from virtualize.server._executor import INVALID_VALUE, OUT_OF_MEMORY, CudaError, Executor

log = logging.getLogger("gpupool.worker")

GRANULE = 2 << 20  # the driver's mapping granularity on every current GPU
SMALL = 1 << 20  # allocations up to this share a page
SMALL_ALIGN = 512
WINDOW_ALIGN = 1 << 30
MIN_WINDOW = 64 << 30
# Where windows go: 16..80 TiB, below where Linux maps a position-independent executable and its heap
# (from 85 TiB), its libraries and stack (near 128 TiB), and above where CUDA puts its own ranges
# (the first TiB).
HINT_LOW, HINT_HIGH = 0x1000_0000_0000, 0x5000_0000_0000
MARKER_EVENT_FLAGS = 2  # CU_EVENT_DISABLE_TIMING: a marker, not a timer


# The windows' spots are random; GPUPOOL_WINDOW_SEED (the tests' seam) makes every worker draw the same ones.
_spots = random.Random(
    int(os.environ["GPUPOOL_WINDOW_SEED"]) if os.environ.get("GPUPOOL_WINDOW_SEED") else None
)


def _hint(size: int, avoid: list[tuple[int, int]] = ()) -> int:
    """A spot for `size` bytes in the windows' region, 1 GiB aligned, chosen at random, clear of `avoid`
    ((base, size) ranges: the windows of the lease's other workers) where a few draws find one."""
    slots = (HINT_HIGH - HINT_LOW - size) // WINDOW_ALIGN
    for _ in range(64):
        hint = HINT_LOW + _spots.randrange(max(slots, 1)) * WINDOW_ALIGN
        if not any(b < hint + size and hint < b + n for b, n in avoid):
            break
    return hint


class WindowFull(Exception):
    """No room in the accepted windows: the driver allocates instead."""


def window_size(limits: list[int]) -> int:
    size = max(MIN_WINDOW, 4 * sum(limits))
    return -(-size // WINDOW_ALIGN) * WINDOW_ALIGN


class FreeRanges:
    """Free [start, start+size) ranges of one address range: best fit, merged with neighbours on return."""

    def __init__(self, base: int, size: int) -> None:
        self.starts = [base]
        self.sizes = {base: size}

    def take(self, size: int, align: int = 1) -> int | None:
        best = None
        for start in self.starts:
            free = self.sizes[start]
            skip = -start % align
            if free >= size + skip and (best is None or free < self.sizes[best]):
                best = start
                if free == size and not skip:
                    break
        if best is None:
            return None
        free = self.sizes.pop(best)
        self.starts.pop(bisect.bisect_left(self.starts, best))
        at = best + (-best % align)
        if at > best:  # the part before the aligned start stays free
            self.give(best, at - best)
        if free - (at - best) > size:
            self.give(at + size, free - (at - best) - size)
        return at

    def give(self, start: int, size: int) -> None:
        i = bisect.bisect_left(self.starts, start)
        if i < len(self.starts) and start + size == self.starts[i]:  # merge with the range after
            size += self.sizes.pop(self.starts.pop(i))
        if i > 0 and self.starts[i - 1] + self.sizes[self.starts[i - 1]] == start:  # and before
            self.sizes[self.starts[i - 1]] += size
            return
        self.starts.insert(i, start)
        self.sizes[start] = size

    def empty(self, base: int, size: int) -> bool:
        return self.sizes.get(base) == size


@dataclass
class Mapping:
    """Pages mapped to memory of one device: one big allocation, or a slab of small ones."""

    base: int
    size: int
    device: int
    backing: object
    window: Window
    slab: FreeRanges | None = None  # a slab's free bytes
    users: int = 0  # a slab's live allocations


@dataclass
class Window:
    base: int
    size: int
    pages: FreeRanges = field(init=False)

    def __post_init__(self) -> None:
        self.pages = FreeRanges(self.base, self.size)


class WindowMemory:
    """One client process's windows and the allocations made in them (one per connection)."""

    def __init__(self, executor: Executor, limits: list[int], size: int | None = None) -> None:
        self.executor = executor
        self.size = size or window_size(limits)
        self.offered: Window | None = None
        self.windows: list[Window] = []
        self.mappings: dict[int, Mapping] = {}  # allocation address -> the pages it lives on
        self.slabs: dict[int, list[Mapping]] = {}  # device -> its slabs
        self.small_sizes: dict[int, int] = {}  # small allocation -> its size in its slab
        self.pending: list[tuple[int, int]] = []  # (allocation, event): freed once the event is reached
        self.ranges: dict[int, tuple[int, Window | None]] = {}  # cuMemAddressReserve'd: base -> size, window
        # pages another worker process of the lease can map, and the windows of the lease's other workers to
        # stay clear of, so that those pages' addresses are free here (virtualize.server._ipc_workers)
        self.exportable = False
        self.neighbours = None
        self.lock = threading.Lock()

    @property
    def ready(self) -> bool:
        return bool(self.windows)

    # -- the offer -------------------------------------------------------------------------------------

    def offer(self) -> tuple[int, int]:
        """Reserve a new window (dropping one offered and not taken) and say where it is."""
        with self.lock:
            self._drop_offer()
            avoid = self.neighbours.taken() if self.neighbours is not None else []
            base = self.executor.reserve_addresses(self.size, _hint(self.size, avoid))
            self.offered = Window(base, self.size)
            return base, self.size

    def accept(self, base: int) -> None:
        with self.lock:
            if self.offered is None or self.offered.base != base:
                raise CudaError(OUT_OF_MEMORY, f"0x{base:x} is not the window offered")
            self.windows.append(self.offered)
            self.offered = None
            if self.neighbours is not None:
                self.neighbours.note([(w.base, w.size) for w in self.windows])
        log.info("client reserved device addresses [0x%x, +%d GiB)", base, self.size >> 30)

    def _drop_offer(self) -> None:
        if self.offered is not None:
            self.executor.release_addresses(self.offered.base, self.offered.size)
            self.offered = None

    # -- allocations -------------------------------------------------------------------------------------

    def allocate(self, size: int, device: int) -> int:
        """An address for `size` bytes of `device`, inside a window; WindowFull if none has room."""
        with self.lock:
            self._reclaim(wait=False)
            try:
                return self._small(size, device) if size <= SMALL else self._big(size, device)
            except CudaError as exc:
                if exc.code != OUT_OF_MEMORY or not self.pending:
                    raise
            self._reclaim(wait=True)  # memory freed on streams not yet done: wait for it, once
            return self._small(size, device) if size <= SMALL else self._big(size, device)

    def reserve_range(self, size: int, align: int) -> int:
        """cuMemAddressReserve: `size` bytes of the window for the program to map memory into itself (or,
        with no room left, a range of its own that the client reserves when it arrives)."""
        with self.lock:
            for w in self.windows:
                base = w.pages.take(size, max(align, GRANULE))
                if base is not None:
                    self.ranges[base] = (size, w)
                    return base
            base = self.executor.reserve_addresses(size, _hint(size))
            self.ranges[base] = (size, None)
            return base

    def release_range(self, base: int, size: int) -> None:
        with self.lock:
            if self.ranges.get(base, (0,))[0] != size:
                raise CudaError(
                    INVALID_VALUE, f"[0x{base:x}, +{size}) is not a range cuMemAddressReserve gave"
                )
            _, w = self.ranges.pop(base)
            if w is None:
                self.executor.release_addresses(base, size)
            else:
                w.pages.give(base, size)

    def owns(self, ptr: int) -> bool:
        return ptr in self.mappings

    def pages_of(self, ptr: int) -> tuple[int, int, int, object] | None:
        """The pages allocation `ptr` lives on: (base, size, device, backing), for another worker to map."""
        with self.lock:
            m = self.mappings.get(ptr)
            return None if m is None else (m.base, m.size, m.device, m.backing)

    def free(self, ptr: int, wait: bool = True) -> None:
        """Give `ptr` back now (`wait`: once the GPU is done with the pages it unmaps)."""
        with self.lock:
            self._release(ptr, wait)

    def free_after(self, ptr: int, stream: int) -> None:
        """cuMemFreeAsync: give `ptr` back once `stream` reaches this point."""
        event = self.executor.cuEventCreate(MARKER_EVENT_FLAGS)
        self.executor.cuEventRecord(event, stream)
        with self.lock:
            self.pending.append((ptr, event))

    def close(self) -> None:
        """The client is gone (its allocations already freed): unmap what is left, release the windows."""
        with self.lock:
            self._reclaim(wait=True)
            for ptr in list(self.mappings):
                self._release(ptr, wait=False)
            for slabs in self.slabs.values():
                for m in slabs:
                    self._unmap(m)
            self.slabs.clear()
            for base, (size, w) in self.ranges.items():
                if w is None:
                    self.executor.release_addresses(base, size)
            self.ranges.clear()
            self._drop_offer()
            for w in self.windows:
                self.executor.release_addresses(w.base, w.size)
            self.windows.clear()

    # -- inside the lock ---------------------------------------------------------------------------------

    def _pages(self, size: int, device: int, slab: bool) -> Mapping:
        for w in self.windows:
            base = w.pages.take(size)
            if base is not None:
                break
        else:
            raise WindowFull(f"no {size}-byte range left in the client's windows")
        try:
            backing = self.executor.map_memory(base, size, device, self.exportable)
        except BaseException:
            w.pages.give(base, size)
            raise
        return Mapping(base, size, device, backing, w, FreeRanges(base, size) if slab else None)

    def _big(self, size: int, device: int) -> int:
        m = self._pages(-(-max(size, 1) // GRANULE) * GRANULE, device, slab=False)
        self.mappings[m.base] = m
        return m.base

    def _small(self, size: int, device: int) -> int:
        size = -(-max(size, 1) // SMALL_ALIGN) * SMALL_ALIGN
        slabs = self.slabs.setdefault(device, [])
        for m in slabs:
            ptr = m.slab.take(size)
            if ptr is not None:
                break
        else:
            m = self._pages(GRANULE, device, slab=True)
            slabs.append(m)
            ptr = m.slab.take(size)
        m.users += 1
        self.mappings[ptr] = m
        self.small_sizes[ptr] = size
        return ptr

    def _release(self, ptr: int, wait: bool) -> None:
        m = self.mappings.pop(ptr)
        if m.slab is None:
            if wait:
                self._synchronize()
            self._unmap(m)
            return
        m.slab.give(ptr, self.small_sizes.pop(ptr))
        m.users -= 1
        slabs = self.slabs[m.device]
        if m.users == 0 and sum(1 for s in slabs if s.users == 0) > 1:  # keep one empty slab a device
            if wait:
                self._synchronize()
            slabs.remove(m)
            self._unmap(m)

    def _synchronize(self) -> None:
        """As cuMemFree: no kernel may still use pages about to be unmapped. Mapped memory outlives
        contexts: with the program's context gone (released, destroyed), nothing of it runs."""
        try:
            self.executor.cuCtxSynchronize()
        except CudaError as exc:
            log.debug("unmapping without a synchronise: %s", exc)

    def _unmap(self, m: Mapping) -> None:
        self.executor.unmap_memory(m.base, m.size, m.backing)
        m.window.pages.give(m.base, m.size)

    def _reclaim(self, wait: bool) -> None:
        still = []
        for ptr, event in self.pending:
            if wait:
                try:
                    self.executor.cuEventSynchronize(event)
                except CudaError as exc:  # the stream failed: the client hears of it at its next sync
                    log.debug("freeing after a failed stream: %s", exc)
            else:
                try:
                    self.executor.cuEventQuery(event)
                except CudaError:  # not reached yet (or the stream failed: it is reported elsewhere)
                    still.append((ptr, event))
                    continue
            self.executor.cuEventDestroy(event)
            self._release(ptr, wait=False)
        self.pending = still
