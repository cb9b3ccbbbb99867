"""What a process's stream-ordered allocations hold of each memory pool, as the pool's attributes say it,
and what the pool keeps of freed memory, held against the lease as natively against the GPU.

The worker serves cuMemAllocAsync and cuMemAllocFromPoolAsync from the process's address window, not from
the driver's pool, so the driver's pool says it holds nothing: CuPy's MemoryAsyncPool (`used_bytes`,
`total_bytes`, `free_bytes`) and any allocator that reads CU_MEMPOOL_ATTR_USED_MEM_CURRENT saw 0 (CuPy's
own test_memory.py). Here each pool's bytes are counted per client process, as natively each process
has pools of its own:

- used: what is allocated from the pool and not freed;
- reserved: grows as the driver's does, in whole granules, to cover what is used. Memory freed to the
  pool stays reserved: a later allocation from the same pool reuses it, and it counts against the
  lease's partition (an allocation from elsewhere, cuMemAlloc, does not fit where it would not
  natively: CuPy's `test_free_all_blocks_large_chunk`). It goes back at the process's next
  synchronisation (cuCtxSynchronize, cuStreamSynchronize, cuEventSynchronize, served in Python or by
  the native loop) down to the pool's release threshold (0 unless the program sets one), and at
  cuMemPoolTrimTo, cuMemPoolDestroy and the process's end;
- the high marks, set back to the current figures when the program sets them to 0.

The window's pages themselves are unmapped at the free as before: what a pool keeps is the lease's
accounting only. Lock order: the lease's lock, then none here (every change runs under the lease's lock).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("gpupool.worker")

RELEASE_THRESHOLD = 4  # CU_MEMPOOL_ATTR_RELEASE_THRESHOLD
RESERVED_CURRENT, RESERVED_HIGH, USED_CURRENT, USED_HIGH = 5, 6, 7, 8  # CUmemPool_attribute
COUNTED = (RESERVED_CURRENT, RESERVED_HIGH, USED_CURRENT, USED_HIGH)
GRANULE = 2 << 20  # what the driver's pools reserve at a time, at the least


def _covering(size: int) -> int:
    return -(-size // GRANULE) * GRANULE


@dataclass
class _Pool:
    device: int
    used: int = 0
    used_high: int = 0
    reserved: int = 0
    reserved_high: int = 0
    freed_at: int | None = None  # the process's synchronisations when it last freed to the pool

    def grow(self) -> None:
        self.used_high = max(self.used_high, self.used)
        self.reserved = max(self.reserved, _covering(self.used))
        self.reserved_high = max(self.reserved_high, self.reserved)

    @property
    def held(self) -> int:
        """Freed memory the pool keeps: reserved beyond the granules that cover what is used."""
        return self.reserved - _covering(self.used)


class PoolUsage:
    """One client process's pools, by the driver's handle, and which pool each of its allocations is of.

    `lease`: the LeaseState whose `used` and `held` figures the pools' kept memory is part of;
    `synchronisations`: how many synchronisations of the process have succeeded so far."""

    def __init__(self, lease, synchronisations: Callable[[], int]) -> None:
        self.lease = lease
        self.synchronisations = synchronisations
        self._pools: dict[int, _Pool] = {}
        self._of: dict[int, tuple[int, int]] = {}  # allocation -> (pool, bytes)
        self._thresholds: dict[int, int] = {}  # CU_MEMPOOL_ATTR_RELEASE_THRESHOLD as this process set it
        with lease.lock:  # another connection's allocation may be going through the holders
            lease.pool_holders.add(self)

    def _change(self, p: _Pool, change: Callable[[], None]) -> None:
        """`change` applied to `p`, and the lease's figures moved by what it did to the kept memory
        (the caller holds the lease's lock)."""
        before = p.held
        change()
        delta = p.held - before
        if delta:
            self.lease.used[p.device] += delta
            self.lease.held[p.device] += delta
            log.debug("device %d pools keep %d bytes freed (%+d)", p.device, self.lease.held[p.device], delta)

    def _settle(self, pool: int, p: _Pool) -> None:
        """A synchronisation since the last free gives what is kept back, down to the release threshold."""
        if p.freed_at is None or self.synchronisations() <= p.freed_at:
            return
        p.freed_at = None
        keep = self._thresholds.get(pool, 0)
        self._change(p, lambda: setattr(p, "reserved", max(_covering(p.used), min(p.reserved, keep))))

    def settle(self) -> None:
        """Every pool of the process brought up to its synchronisations (the caller holds the lease's lock)."""
        for pool, p in self._pools.items():
            self._settle(pool, p)

    def reusable(self, pool: int, size: int) -> int:
        """How many of `size` more bytes allocated from `pool` its kept memory covers (they need no room
        in the partition)."""
        with self.lease.lock:
            p = self._pools.get(pool)
            if p is None:
                return 0
            self._settle(pool, p)
            return max(0, p.held - max(0, p.reserved - _covering(p.used + size)))

    def allocated(self, pool: int, device: int, ptr: int, size: int) -> None:
        with self.lease.lock:
            p = self._pools.setdefault(pool, _Pool(device))
            self._settle(pool, p)

            def grow() -> None:
                p.used += size
                p.grow()

            self._change(p, grow)
            self._of[ptr] = (pool, size)

    def freed(self, ptr: int) -> None:
        """`ptr` went back to its pool, which keeps it until a synchronisation (a no-op for memory that is
        not a pool's)."""
        with self.lease.lock:
            pool, size = self._of.pop(ptr, (0, 0))
            if not size:
                return
            p = self._pools[pool]
            self._settle(pool, p)
            self._change(p, lambda: setattr(p, "used", p.used - size))
            p.freed_at = self.synchronisations()

    def trimmed(self, pool: int, keep: int) -> None:
        """cuMemPoolTrimTo: what is reserved and unused goes, down to `keep` bytes."""
        with self.lease.lock:
            p = self._pools.get(pool)
            if p is not None:
                self._settle(pool, p)
                self._change(p, lambda: setattr(p, "reserved", max(_covering(p.used), min(p.reserved, keep))))

    def destroyed(self, pool: int) -> None:
        """cuMemPoolDestroy: the pool's kept memory goes with it."""
        self.trimmed(pool, 0)
        with self.lease.lock:
            self._pools.pop(pool, None)
            self._thresholds.pop(pool, None)

    def set_threshold(self, pool: int, value: int) -> None:
        with self.lease.lock:
            self._thresholds[pool] = value

    def close(self) -> None:
        """The process ended: its pools keep nothing any more."""
        with self.lease.lock:
            for p in self._pools.values():
                self._change(p, lambda p=p: setattr(p, "reserved", _covering(p.used)))
            self.lease.pool_holders.discard(self)

    def attribute(self, pool: int, attr: int) -> int:
        """The pool's figure for one of COUNTED (0 for a pool this process never allocated from)."""
        with self.lease.lock:
            p = self._pools.get(pool)
            if p is None:
                return 0
            self._settle(pool, p)
            return {RESERVED_CURRENT: p.reserved, RESERVED_HIGH: p.reserved_high,
                    USED_CURRENT: p.used, USED_HIGH: p.used_high}[attr]  # fmt: skip

    def reset_high(self, pool: int, attr: int) -> None:
        """A high mark set to 0: from now on it is the current figure."""
        with self.lease.lock:
            p = self._pools.get(pool)
            if p is not None:
                if attr == USED_HIGH:
                    p.used_high = p.used
                elif attr == RESERVED_HIGH:
                    p.reserved_high = p.reserved
