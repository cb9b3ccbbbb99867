"""What a process's stream-ordered allocations hold of each memory pool, as the pool's attributes say it.

The worker serves cuMemAllocAsync and cuMemAllocFromPoolAsync from the process's address window, not from
the driver's pool, so the driver's pool says it holds nothing: CuPy's MemoryAsyncPool (`used_bytes`,
`total_bytes`, `free_bytes`) and any allocator that reads CU_MEMPOOL_ATTR_USED_MEM_CURRENT saw 0 (CuPy's
own test_memory.py). Here each pool's bytes are counted per client process, as natively each process
has pools of its own:

- used: what is allocated from the pool and not freed;
- reserved: grows as the driver's does, in whole granules, to cover what is used; it shrinks at
  cuMemPoolTrimTo. The driver also gives memory back at a synchronisation (above the release
  threshold); the worker does not see every synchronisation, so reserved may stay above the native
  figure until the program trims;
- the high marks, set back to the current figures when the program sets them to 0.

Freed memory goes back to the lease at once either way: it is not held against the partition.
"""

from __future__ import annotations

from dataclasses import dataclass

RESERVED_CURRENT, RESERVED_HIGH, USED_CURRENT, USED_HIGH = 5, 6, 7, 8  # CUmemPool_attribute
COUNTED = (RESERVED_CURRENT, RESERVED_HIGH, USED_CURRENT, USED_HIGH)
GRANULE = 2 << 20  # what the driver's pools reserve at a time, at the least


@dataclass
class _Pool:
    used: int = 0
    used_high: int = 0
    reserved: int = 0
    reserved_high: int = 0

    def grow(self) -> None:
        self.used_high = max(self.used_high, self.used)
        self.reserved = max(self.reserved, -(-self.used // GRANULE) * GRANULE)
        self.reserved_high = max(self.reserved_high, self.reserved)


class PoolUsage:
    """One client process's pools, by the driver's handle, and which pool each of its allocations is of."""

    def __init__(self) -> None:
        self._pools: dict[int, _Pool] = {}
        self._of: dict[int, tuple[int, int]] = {}  # allocation -> (pool, bytes)

    def allocated(self, pool: int, ptr: int, size: int) -> None:
        p = self._pools.setdefault(pool, _Pool())
        p.used += size
        p.grow()
        self._of[ptr] = (pool, size)

    def freed(self, ptr: int) -> None:
        """`ptr` went back (a no-op for memory that is not a pool's)."""
        pool, size = self._of.pop(ptr, (0, 0))
        if size:
            self._pools[pool].used -= size

    def trimmed(self, pool: int, keep: int) -> None:
        """cuMemPoolTrimTo: what is reserved and unused goes, down to `keep` bytes."""
        p = self._pools.get(pool)
        if p is not None:
            covered = -(-p.used // GRANULE) * GRANULE
            p.reserved = max(covered, min(p.reserved, keep))

    def attribute(self, pool: int, attr: int) -> int:
        """The pool's figure for one of COUNTED (0 for a pool this process never allocated from)."""
        p = self._pools.get(pool, _Pool())
        return {RESERVED_CURRENT: p.reserved, RESERVED_HIGH: p.reserved_high,
                USED_CURRENT: p.used, USED_HIGH: p.used_high}[attr]  # fmt: skip

    def reset_high(self, pool: int, attr: int) -> None:
        """A high mark set to 0: from now on it is the current figure."""
        p = self._pools.get(pool)
        if p is not None:
            if attr == USED_HIGH:
                p.used_high = p.used
            elif attr == RESERVED_HIGH:
                p.reserved_high = p.reserved
