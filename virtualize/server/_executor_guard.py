"""The lease guard in front of an executor: decodes each forwarded call, checks it, runs it, answers.

Everything a client names is checked against what its own lease created before an executor sees it:
handles (a garbage handle would crash the driver, and so the worker), device pointers and the byte
ranges of copies and memsets (a guessed address gets CUDA_ERROR_INVALID_VALUE), and the partition's
memory quota (CUDA_ERROR_OUT_OF_MEMORY beyond it). Memory queries report the partition, not the GPU.

Calls of mode ASYNC get no reply; their first error is kept and returned by the next synchronising
call (`sync_point` in the table), as CUDA reports asynchronous errors.
"""

from __future__ import annotations

import bisect
import logging
import os
import secrets
import struct
import threading
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from virtualize.common import _wire
from virtualize.common._calls import CALL_IDS, CALLS, DESTROYS, HANDLE_TYPES, Call, Mode
from virtualize.common._results import CUresult
from virtualize.server import _ipc_workers
from virtualize.server._address_window import GRANULE, WindowFull, WindowMemory
from virtualize.server._deliveries import Deliveries
from virtualize.server._executor import (
    HANDSHAKE,
    INVALID_CONTEXT,
    INVALID_HANDLE,
    INVALID_VALUE,
    NOT_SUPPORTED,
    OUT_OF_MEMORY,
    CudaError,
    Executor,
    SharedHostMemory,
    StagedCopy,
)
from virtualize.server._guard_arrays import ArrayCalls
from virtualize.server._guard_concern import ANSWERED, EMPTY
from virtualize.server._guard_contexts import ContextCalls
from virtualize.server._guard_copies import CopyCalls
from virtualize.server._guard_endpoints import EndpointCalls
from virtualize.server._guard_graph_memory import GraphMemoryCalls, graph_reserve_read
from virtualize.server._guard_graphs import GraphCalls
from virtualize.server._guard_green import GreenCalls
from virtualize.server._guard_launches import LaunchCalls
from virtualize.server._guard_multicast import MulticastCalls
from virtualize.server._guard_nccl import NcclCalls
from virtualize.server._guard_pool_usage import COUNTED as POOL_COUNTED
from virtualize.server._guard_pool_usage import RELEASE_THRESHOLD as POOL_RELEASE_THRESHOLD
from virtualize.server._guard_pool_usage import PoolUsage
from virtualize.server._guard_rules import (
    ACCESS_POLICY_WINDOW,
    BUILTIN_STREAMS,
    RANGES_BY_ID,
    STREAM_ATTRIBUTE_BYTES,
)
from virtualize.server._guard_tensor_maps import TensorMapCalls
from virtualize.server._lanes import Lanes
from virtualize.server._migrate import Gate

log = logging.getLogger("gpupool.worker")

ALLOCATION_PROP_BYTES, ACCESS_DESC_BYTES = 32, 12  # CUmemAllocationProp, CUmemAccessDesc
POSIX_FILE_DESCRIPTOR = 1  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
P2P_ATOMIC_OPERATIONS_MAX = (
    64  # operations one cuDeviceGetP2PAtomicCapabilities asks about (the shim's limit too)
)
POOL_PROPS_BYTES = 88  # CUmemPoolProps
# CUmemAllocationProp's allocFlags.usage, and the usages created remotely: memory for sparse arrays' tiles,
# memory the copy engines decompress from and into (cuMemBatchDecompressAsync)
ALLOCATION_USAGE_AT, USAGE_TILE_POOL, USAGE_HW_DECOMPRESS = 26, 0x1, 0x2
# CUstreamAttrID values whose CUstreamAttrValue is plain data, or (the access-policy window) a range the
# guard checks: access-policy window, synchronization policy, priority, memory sync domain map, domain.
STREAM_ATTRIBUTES = frozenset({ACCESS_POLICY_WINDOW, 3, 8, 9, 10})
# CUdevice_attribute: HOST_NATIVE_ATOMIC_SUPPORTED, PAGEABLE_MEMORY_ACCESS, CONCURRENT_MANAGED_ACCESS,
# PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES, DIRECT_MANAGED_MEM_ACCESS_FROM_HOST: 0 remotely (docs/remote.md,
# managed memory): the program's host memory reaches the GPU through a mirror, not over a coherent link.
NOT_COHERENT_ATTRIBUTES = frozenset({86, 88, 89, 100, 101})
# What a device offers that memory shared remotely cannot be (docs/remote.md, "Many GPUs in one run"), so
# that NCCL and others take the way that works: HANDLE_TYPE_FABRIC_SUPPORTED, MULTICAST_SUPPORTED,
# LOGICAL_ENDPOINT_MULTICAST_SUPPORTED answer 0, MEMPOOL_SUPPORTED_HANDLE_TYPES only POSIX descriptors;
# UNIFIED_FUNCTION_POINTERS 0: a unified function's host side would be the worker's (docs/driver-census.md).
ATTRIBUTE_MASKS = {
    **dict.fromkeys(NOT_COHERENT_ATTRIBUTES, 0),
    128: 0,
    129: 0,
    132: 0,
    154: 0,
    119: POSIX_FILE_DESCRIPTOR,
}
# The most the driver keeps of its log (cuLogsDumpToMemory): no dump is larger.
LOG_BYTES_MAX = 25600
# CUpointer_attribute values the guard answers for memory in a window (cuda.h numbering).
POINTER_CONTEXT, POINTER_SYNC_MEMOPS, POINTER_DEVICE_ORDINAL, POINTER_LEGACY_IPC = 1, 6, 9, 10
POINTER_RANGE_START, POINTER_RANGE_SIZE, POINTER_MEMPOOL = 11, 12, 17
WINDOW_POINTER_ATTRIBUTES = frozenset(
    {
        POINTER_SYNC_MEMOPS,
        POINTER_CONTEXT,
        POINTER_DEVICE_ORDINAL,
        POINTER_LEGACY_IPC,
        POINTER_RANGE_START,
        POINTER_RANGE_SIZE,
        POINTER_MEMPOOL,
    }
)


@dataclass
class Allocation:
    base: int
    size: int
    device: int
    owned: bool  # False: a module global (not freed by the client, not counted against the quota)
    ctx: int = 0  # the context it was made in (a destroyed context takes its memory with it)
    window: WindowMemory | None = None  # the client process's window it lives in; None: the driver's
    is_global: bool = False  # a module's global variable (its address is the module's, on its GPU)
    sync_memops: int = 0  # CU_POINTER_ATTRIBUTE_SYNC_MEMOPS as the program set it (window memory: here)
    graph: int = 0  # graph memory: the graph whose allocation node (or captured allocation) made it
    charged: bool = True  # counted against the partition (graph memory stops when its graphs are all gone)


@dataclass
class LeaseState:
    """What one lease created, shared by all connections of the lease (a program and its children)."""

    limits: list[int]
    used: list[int] = field(default_factory=list)
    allocations: dict[int, Allocation] = field(default_factory=dict)
    bases: list[int] = field(default_factory=list)
    handles: dict[str, set[int]] = field(default_factory=lambda: {t: set() for t in HANDLE_TYPES})
    children: dict[int, set[int]] = field(default_factory=dict)  # module/library -> functions/kernels
    ctx_device: dict[int, int] = field(default_factory=dict)
    primary_ctx: dict[int, int] = field(default_factory=dict)  # device -> its primary context
    # Green contexts (virtualize.server._guard_green): per kind ("devres", "resdesc", "greenctx"), each
    # object's device and SMs; device -> the lease's SM resource of it; green context -> its CUcontext.
    green: dict[str, dict] = field(default_factory=lambda: {"devres": {}, "resdesc": {}, "greenctx": {}})
    device_resource: dict[int, int] = field(default_factory=dict)
    green_context: dict[int, int] = field(default_factory=dict)
    layouts: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    callback_tokens: dict[int, Session] = field(default_factory=dict)  # token -> connection to call back for
    tensor_maps: dict[bytes, int] = field(default_factory=dict)  # encoded map -> its tensor's extent
    # encoded map -> (the encode's call name, its ins, its shape arrays, steps since: ("address"|"class", value))
    tensor_map_recipes: dict[bytes, tuple] = field(default_factory=dict)
    # Host node -> (the callback connection of the process whose function it runs, the function's id
    # there): what cuGraphHostNodeGetParams answers, to that process only.
    host_nodes: dict[int, tuple[object, int]] = field(default_factory=dict)
    # Kernel node -> the function or kernel handle the program gave it (what cuGraphKernelNodeGetParams
    # answers where the node's function is still that one's).
    kernel_nodes: dict[int, int] = field(default_factory=dict)
    # Memory of the virtual memory API a process exported (cuMemExportToShareableHandle) -> (size, device,
    # CUmemAllocationProp): what another process of this lease may import; nothing of another lease is here.
    vm_exported: dict[int, tuple[int, int, bytes]] = field(default_factory=dict)
    # The processes holding each such handle (the driver gives every process of the lease the same value
    # for one memory: they share the worker) and the addresses where the lease's processes map it.
    vm_holders: Counter = field(default_factory=Counter)
    # The memory a handle names (its first handle: an import inside the worker may give it another value),
    # how many references the lease's processes hold to it, and what it counts against the partition,
    # (size, device), from its first holder to its last.
    vm_memory_of: dict[int, int] = field(default_factory=dict)
    vm_memory_holders: Counter = field(default_factory=Counter)
    vm_charged: dict[int, tuple[int, int]] = field(default_factory=dict)
    vm_mapped_at: dict[int, set[int]] = field(default_factory=dict)
    # Each mapping's memory (its address -> the memory's key) and how many mappings each memory has: a
    # mapping keeps the memory, and its count, after the last handle's release (NCCL releases right after
    # it maps), until it is unmapped, as natively.
    vm_map_key: dict[int, int] = field(default_factory=dict)
    vm_key_mappings: Counter = field(default_factory=Counter)
    # Each process's count of the memory it opened from other workers' processes that have gone
    # (virtualize.server._ipc_workers.Imports.count_departed), run under `lock` before memory is counted.
    departed_exports: list[Callable[[], None]] = field(default_factory=list)
    # This worker's allocations other workers of the lease opened (by IPC handle): base -> the opening
    # workers' pids, one per open. One freed while still open elsewhere stays counted here, as natively the
    # memory stays allocated until its last opener closes it: base -> [size, device, the openers' pids].
    # Memory of the virtual memory API that other workers imported counts the same way, keyed ("vm", its
    # memory's key), the handle it was exported under mapped to that key (vm_opened_key) for their closes.
    opened_elsewhere: dict[int | tuple[str, int], list[int]] = field(default_factory=dict)
    held_for_others: dict[int | tuple[str, int], list] = field(default_factory=dict)
    vm_opened_key: dict[int, int] = field(default_factory=dict)
    # NCCL communicators made by the lease's processes: the id the client holds -> the server's
    # (virtualize.server._guard_nccl.Communicator)
    nccl_comms: dict[int, Any] = field(default_factory=dict)
    # Graph memory (virtualize.server._guard_graph_memory): each executable graph's graph, graphs destroyed
    # while an executable graph of theirs lives, and per device the driver's graph memory reserve counted
    # beyond the graph allocations counted one by one (once the lease has had graph memory).
    exec_graph: dict[int, int] = field(default_factory=dict)
    graphs_gone: set[int] = field(default_factory=set)
    graph_reserve: list[int] = field(default_factory=list)
    has_graph_memory: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    native: Any = (
        None  # the worker's native hot path (a virtualize.server._native_dispatch.NativeLease), if any
    )
    # Holds the lease's calls while it migrates (virtualize.server._migrate), which moves the memory of
    # every process's address window.
    gate: Gate = field(default_factory=Gate)
    windows: weakref.WeakSet = field(default_factory=weakref.WeakSet)
    # Processes of a lease that moved here from another server, until each reconnects with its token
    # (gpResume; virtualize.server._migrate_state.Parked).
    parked: dict[int, Any] = field(default_factory=dict)
    # Each process's stream-ordered pools (virtualize.server._guard_pool_usage.PoolUsage): per device,
    # `held` is the memory they keep freed until a synchronisation, a part of `used`.
    pool_holders: weakref.WeakSet = field(default_factory=weakref.WeakSet)

    def __post_init__(self) -> None:
        self.used = [0] * len(self.limits)
        self.held = [0] * len(self.limits)
        self.graph_reserve = [0] * len(self.limits)

    def holds(self, kind: str, handle: int) -> bool:
        """Whether a process of the lease holds `handle` of `kind` ("func": a function or a kernel)."""
        return handle in self.handles[kind] or (kind == "func" and handle in self.handles["kernel"])

    def find(self, ptr: int) -> Allocation | None:
        i = bisect.bisect_right(self.bases, ptr)
        if i == 0:
            return None
        a = self.allocations[self.bases[i - 1]]
        return a if ptr < a.base + max(a.size, 1) else None

    def add(self, a: Allocation) -> None:
        with self.lock:
            if a.base in self.allocations:
                self._drop(a.base)
            self.allocations[a.base] = a
            bisect.insort(self.bases, a.base)
            if a.owned and a.charged:
                self.used[a.device] += a.size
            if self.native is not None:  # the native loop checks small copies against the same ranges
                self.native.range_added(a.base, a.size)

    def remove(self, base: int) -> Allocation | None:
        with self.lock:
            return self._drop(base)

    def _drop(self, base: int) -> Allocation | None:
        if self.native is not None:  # out of the native loop's ranges before it is freed
            self.native.range_dropped(base)
        a = self.allocations.pop(base, None)
        if a is not None:
            self.bases.pop(bisect.bisect_left(self.bases, base))
            openers = self.opened_elsewhere.pop(base, None)
            if a.owned and a.charged and openers:  # still counted until the last opener closes it
                self.held_for_others[base] = [a.size, a.device, openers]
            elif a.owned and a.charged:
                self.used[a.device] -= a.size
        return a

    def opened_by(self, base: int, worker: int) -> None:
        """Another worker of the lease (pid `worker`) opened this worker's allocation at `base`."""
        with self.lock:
            if base in self.allocations:
                self.opened_elsewhere.setdefault(base, []).append(worker)

    def closed_by(self, base: int, worker: int) -> None:
        """That worker closed it again; a freed allocation's count goes with its last opener."""
        with self.lock:
            self._closed_by(base, worker)

    def _closed_by(self, base: int, worker: int) -> None:
        held = self.held_for_others.get(base)
        openers = held[2] if held is not None and worker in held[2] else self.opened_elsewhere.get(base, [])
        if worker in openers:
            openers.remove(worker)
        if held is not None and not held[2]:
            del self.held_for_others[base]
            self.used[held[1]] -= held[0]
        elif not openers:
            self.opened_elsewhere.pop(base, None)

    def vm_opened_by(self, handle: int, worker: int) -> None:
        """Another worker of the lease (pid `worker`) imported the memory exported here under `handle`."""
        with self.lock:
            key = self.vm_memory_of.get(handle)
            if key is not None and key in self.vm_charged:
                self.vm_opened_key[handle] = key
                self.opened_elsewhere.setdefault(("vm", key), []).append(worker)

    def vm_closed_by(self, handle: int, worker: int) -> None:
        """That worker's processes released it again; released here too, it stops counting with its last."""
        with self.lock:
            key = self.vm_opened_key.get(handle)
            if key is None:
                return
            self._closed_by(("vm", key), worker)
            if ("vm", key) not in self.opened_elsewhere and ("vm", key) not in self.held_for_others:
                del self.vm_opened_key[handle]

    def stop_holding_for_others(self) -> None:
        """The process whose allocations these were has ended: the workers that still have them open count
        them from now on (their Imports.count_departed), so this one no longer does."""
        with self.lock:
            for size, device, _ in self.held_for_others.values():
                self.used[device] -= size
            self.held_for_others.clear()
            self.opened_elsewhere.clear()
            self.vm_opened_key.clear()

    def count_openers_gone(self, running: Callable[[int], bool]) -> None:
        """Openers whose worker has ended (`running`: whether a pid runs; a process that crashed holding the
        memory) hold it no longer (the caller holds the lock)."""
        for base, (_, _, openers) in list(self.held_for_others.items()):
            for worker in [w for w in set(openers) if not running(w)]:
                while worker in openers:
                    self._closed_by(base, worker)
        for handle, key in list(self.vm_opened_key.items()):
            if ("vm", key) not in self.opened_elsewhere and ("vm", key) not in self.held_for_others:
                del self.vm_opened_key[handle]

    def vm_hold(self, handle: int, size: int, device: int, *, charged: bool = False, memory: int = 0) -> None:
        """A process of the lease holds `handle` now (created, retained or imported; `memory`: the handle
        it was imported from). The memory counts against the partition once, however many processes and
        handle values hold it (`charged`: already counted)."""
        with self.lock:
            key = self.vm_memory_of.setdefault(handle, self.vm_memory_of.get(memory, memory) or handle)
            self.vm_holders[handle] += 1
            self.vm_memory_holders[key] += 1
            self.handles["vmem"].add(handle)
            if key not in self.vm_charged:
                self.vm_charged[key] = (size, device)
                if not charged:
                    self.used[device] += size
            elif charged:
                self.used[device] -= size

    def vm_drop(self, handle: int) -> None:
        """A process let go of `handle`; the lease forgets a handle value (and its export) when none
        holds it, and stops counting the memory when no value of it is held."""
        with self.lock:
            key = self.vm_memory_of[handle]
            self.vm_holders[handle] -= 1
            if self.vm_holders[handle] <= 0:
                del self.vm_holders[handle], self.vm_memory_of[handle]
                self.handles["vmem"].discard(handle)
                self.vm_exported.pop(handle, None)
            self.vm_memory_holders[key] -= 1
            if self.vm_memory_holders[key] <= 0:
                del self.vm_memory_holders[key]
                if not self.vm_in_use(key):  # else counted until its last unmap (vm_mapping)
                    self._vm_uncharge(key)

    def vm_in_use(self, key: int) -> bool:
        """Whether a process of this worker holds a handle of the memory `key` or maps it (the caller holds
        the lock): natively the memory lives until both are gone."""
        return key in self.vm_memory_holders or self.vm_key_mappings[key] > 0

    def _vm_uncharge(self, key: int) -> None:
        """Memory no process of this worker holds or maps any more (the caller holds the lock)."""
        self.vm_key_mappings.pop(key, None)
        if key not in self.vm_charged:
            return
        size, device = self.vm_charged.pop(key)
        openers = self.opened_elsewhere.pop(("vm", key), None)
        if openers:  # imported by other workers' processes: counted here until their last release
            self.held_for_others[("vm", key)] = [size, device, openers]
        else:
            self.used[device] -= size

    def vm_mapping(self, handle: int, ptr: int, mapped: bool) -> None:
        with self.lock:
            at = self.vm_mapped_at.setdefault(handle, set())
            (at.add if mapped else at.discard)(ptr)
            if not at:
                del self.vm_mapped_at[handle]
            if mapped and handle in self.vm_memory_of:
                key = self.vm_map_key[ptr] = self.vm_memory_of[handle]
                self.vm_key_mappings[key] += 1
            elif not mapped and ptr in self.vm_map_key:
                key = self.vm_map_key.pop(ptr)
                self.vm_key_mappings[key] -= 1
                if not self.vm_in_use(key):
                    self._vm_uncharge(key)  # its handles were released before this last unmap

    def in_use(self, device: int) -> int:
        """What the lease uses of `device`: here, and in the workers of its other processes, where they have
        workers of their own (`_process_workers.SharedUsage`)."""
        elsewhere = getattr(self.used, "elsewhere", None)
        return self.used[device] + (elsewhere(device) if elsewhere is not None else 0)

    def reserve(self, device: int, size: int) -> None:
        """Refuse an allocation that would take the lease past its partition of `device` (the caller holds
        the lock). Memory pools keep after a free counts until their process synchronises, so it is
        brought up to date first where it is in the way."""
        self.count_departed_exports()
        if self.in_use(device) + size > self.limits[device]:
            self.settle_pools(device)
        departed = getattr(self.used, "wait_for_departed", None)
        if self.in_use(device) + size > self.limits[device] and departed is not None:
            departed(device)  # a process of the lease that has just exited: its worker is freeing its memory
        if self.in_use(device) + size > self.limits[device]:
            raise CudaError(OUT_OF_MEMORY, f"partition of device {device} is {self.limits[device]} bytes")

    def count_departed_exports(self) -> None:
        """Memory opened from another worker whose exporting process has gone is counted here from now on
        (the caller holds the lock)."""
        for count in self.departed_exports:
            count()

    def settle_pools(self, device: int) -> None:
        """What the processes' pools keep of `device` brought up to their synchronisations (the caller holds
        the lock)."""
        if self.held[device]:
            for holder in list(self.pool_holders):
                holder.settle()

    def take(self, device: int, size: int) -> None:
        """`size` bytes of `device` counted against the partition, or OUT_OF_MEMORY where they do not fit."""
        with self.lock:
            self.reserve(device, size)
            self.used[device] += size

    def give_back(self, device: int, size: int) -> None:
        with self.lock:
            self.used[device] -= size


class HostCallbacks:
    """The client process's callback connection: the worker's driver thread sends a host function's id
    when its stream reaches it and waits until the client answers that it has run (one at a time).
    Copies to the client's page-locked memory travel on it too (`virtualize.server._deliveries`); those done
    by then go first, so a host function after a copy sees its bytes."""

    def __init__(self, channel) -> None:
        self.channel = channel
        self.lock = threading.Lock()  # one host function at a time
        self.send_lock = threading.Lock()  # frames whole: host function ids and copies share the channel
        self.closed = threading.Event()  # the process's connection has ended: stop calling back
        self.deliveries = Deliveries(self.send, self.lock)

    def send(self, *parts) -> bool:
        with self.send_lock:
            if not self.send_on(
                self.channel, parts, "callback connection is gone (%s); host functions are skipped"
            ):
                self.closed.set()
                return False
            return True

    def send_on(self, channel, parts: tuple, gone: str) -> bool:
        """One frame on `channel` (this connection, or one of its delivery connections): False, logged as
        `gone` says, where the client's end has closed — or the process's connection has ended."""
        if self.closed.is_set():
            return False
        try:
            channel.send(*parts)
            return True
        except (OSError, ConnectionError, EOFError) as exc:
            log.info("the client's " + gone, exc)
            return False

    def _copies_first(self) -> bool:
        """Copies done by now land before what comes next on this connection runs in the client: those
        sent here are read first, and where pieces went on delivery connections too, the client hears how
        many frames to wait for (COPIES_SENT), as ahead of a reply."""
        sent = self.deliveries.send_done()
        if not self.deliveries.has_outlets():
            return True
        count = _wire.COPIES_COUNT.pack(sent)
        return self.send(_wire.REPLY.pack(_wire.COPIES_SENT, len(count), 0), count)

    def call(self, ident: int, status: int = 0) -> None:
        with self.lock:
            if not self._copies_first():
                return
            if not self.send(_wire.REPLY.pack(status, 8, 0), struct.pack("<Q", ident)):
                return
            try:
                self.channel.read_exact(8)  # the id again: the function has returned
            except (OSError, ConnectionError, EOFError) as exc:
                log.info("the client's callback connection is gone (%s); host functions are skipped", exc)
                self.closed.set()

    def ask(self, head: bytes, question: bytes) -> int:
        """A recapture's question (`_wire.RECAPTURE_CALL`) for the program's callback: its CUresult, or
        CUDA_ERROR_UNKNOWN where the connection is gone (the capture fails: no answer is none)."""
        with self.lock:
            if not self._copies_first() or not self.send(
                _wire.REPLY.pack(_wire.RECAPTURE_CALL, len(head), len(question)), head, question
            ):
                return CUresult.UNKNOWN
            try:
                _ident, result, _ = _wire.RECAPTURE_ANSWER.unpack(
                    self.channel.read_exact(_wire.RECAPTURE_ANSWER.size)
                )
            except (OSError, ConnectionError, EOFError) as exc:
                log.info("the client's callback connection is gone (%s); a recapture fails", exc)
                self.closed.set()
                return CUresult.UNKNOWN
            return result

    def close(self) -> None:
        self.closed.set()
        self.deliveries.close()


def _names_no_bytes(call: Call, ins: tuple, ptr: int) -> bool:
    """Whether argument `ptr` starts a range of no bytes (_guard_rules.DEVICE_RANGES): it names no memory, and
    any address passes, as the driver's copy of nothing does (XLA copies nothing from address 0)."""
    return any(at == ptr and ins[length] == 0 for at, length, _ in RANGES_BY_ID[CALL_IDS[call]])


class Session:
    """One client connection: its current context, its pending asynchronous error, its calls."""

    def __init__(self, lease: LeaseState, executor: Executor, channel, kernel_output=None) -> None:
        self.lease = lease
        self.executor = executor
        self.channel = channel
        self.kernel_output = (
            kernel_output  # () -> bytes kernels printed since the last call (worker's stdout)
        )
        self.ctx = 0
        self.pending = 0
        self.calls = 0
        self.owned: set[int] = set()  # allocations made on this connection, freed when it closes
        self.context_calls = ContextCalls(self)  # the current context, contexts this connection creates
        self.window = WindowMemory(executor, lease.limits)  # this client process's device addresses
        lease.windows.add(self.window)
        self.spoiled_captures: set[int] = set()  # streams whose capture met a copy it cannot hold
        self.callbacks: HostCallbacks | None = None  # this process's callback connection, once attached
        self.copies_announced = 0  # copy frames the client was last told to wait for (_wire.COPIES_SENT)
        self.callback_token = 0
        self.calls_back_for: Session | None = None  # set on a callback connection: stop reading it
        self.delivers = False  # and a delivery connection is one of those (gpDeliveryAttach)
        # The virtual memory API on this connection: reserved ranges, mappings, and created memory.
        self.vm_ranges: dict[int, int] = {}  # base -> size
        self.vm_mapped: dict[int, int] = {}  # mapped address -> size
        self.vm_handles: dict[int, tuple[int, int]] = {}  # handle -> (size, device)
        self.vm_references: dict[int, int] = {}  # handle -> references beyond the first (retains)
        self.vm_props: dict[int, bytes] = {}  # handle -> the CUmemAllocationProp it was created with
        self.vm_mapping_of: dict[int, tuple[int, int, int]] = {}  # mapped address -> (handle, size, device)
        self.array_calls = ArrayCalls(self)  # arrays, 3D copies, textures, surfaces
        self.graph_calls = GraphCalls(self)  # graphs built node by node, and from stream captures
        self.green_calls = GreenCalls(self)  # device resources and the green contexts made of them
        self.endpoint_calls = EndpointCalls(self)  # logical endpoint ids and endpoints
        self.nccl_calls = NcclCalls(self)  # NCCL at its API: the communicators this connection made
        self.shared: SharedHostMemory | None = None  # memory the client maps too (gpShmAttach)
        self.shared_error = 0  # the first error of the pieces of a copy through it, for its answer
        # the client's page-locked allocations this worker maps too (gpPinnedShare): its address -> the
        # memory, and the copies into it not known to be done yet (virtualize.server._guard_copies)
        self.pinned: dict[int, SharedHostMemory] = {}
        self.syncs = 0  # synchronisations served here that succeeded (the native loop counts its own)
        self.pool_usage = PoolUsage(lease, self.synchronisations)  # what its pools hold and keep
        self.pinned_landing: dict[int, list[StagedCopy]] = {}
        self.native = None  # this connection's native loop (_native_dispatch.NativeSession), if it has one
        self.lanes: Lanes | None = None  # this process's extra connections' copies, once one attached
        # gpProcessStart: the worker's answer to a process that asks for a worker of its own
        # (virtualize.server._process_workers); served here where nothing else is said
        self.process_start = lambda session, flags: (b"", b"")
        # other workers' memory this process opened by IPC handle (virtualize.server._ipc_workers.Imports),
        # set where the lease's processes each have a worker of their own
        self.ipc_imports = None
        # another worker's exported virtual memory handle -> a handle imported from it here
        self.vm_across: dict[int, int] = {}
        self.peer_pid = 0  # the client process's pid, where it is on this host (set by the worker)
        self.lane_of: Session | None = None  # set on a lane: the connection whose copies it carries
        self.special: dict[str, Callable] = {
            "cuDeviceGetAttribute": self._device_attribute,
            "cuMemPoolCreate": self._pool_create,
            "gpCallbackToken": self._callback_token,
            "gpCallbackAttach": self._callback_attach,
            "gpDeliveryAttach": self._delivery_attach,
            "gpEventCreateNamed": self._event_create_named,
            "cuLaunchHostFunc": self._host_function,
            "cuStreamAddCallback": self._host_function,
            "cuMemAddressReserve": self._vm_reserve,
            "cuMemAddressFree": self._vm_address_free,
            "cuMemCreate": self._vm_create,
            "cuMemRelease": self._vm_release,
            "cuMemMap": self._vm_map,
            "cuMemUnmap": self._vm_unmap,
            "cuMemSetAccess": self._vm_set_access,
            "cuMemGetAllocationGranularity": self._vm_granularity,
            "cuMemRetainAllocationHandle": self._vm_retain,
            "cuMemGetAllocationPropertiesFromHandle": self._vm_properties,
            "cuMemGetAccess": self._vm_access,
            "cuMemExportToShareableHandle": self._vm_export,
            "cuDeviceGetP2PAtomicCapabilities": self._p2p_atomics,
            "cuLogsDumpToMemory": self._logs_dump,
            "cuMemImportFromShareableHandle": self._vm_import,
            "cuStreamGetAttribute": self._stream_attribute,
            **dict.fromkeys(
                (
                    f"{op}{bits}{suffix}"
                    for op in ("cuStreamWaitValue", "cuStreamWriteValue")
                    for bits in ("32", "64")
                    for suffix in ("", "_v2")
                ),
                self._stream_value,
            ),
            "cuStreamSetAttribute": self._stream_attribute,
            "cuModuleEnumerateFunctions": self._enumerate,
            "cuLibraryEnumerateKernels": self._enumerate,
            "gpResume": self._resume,
            "gpProcessStart": lambda call, ins: self.process_start(self, ins[0]),
            "gpLeaseMemory": self._lease_memory,
            "gpIpcImport": self._ipc_import,
            "gpIpcRelease": self._ipc_release,
            "gpIpcEventImport": self._ipc_event_import,
            "gpWindowOffer": self._window_offer,
            "gpWindowAccept": self._window_accept,
            "cuMemGetAddressRange_v2": self._address_range,
            "cuPointerGetAttribute": self._pointer_attribute,
            "cuPointerSetAttribute": self._set_pointer_attribute,
            "cuDeviceTotalMem_v2": self._total_mem,
            "cuMemGetInfo_v2": self._mem_get_info,
            "cuMemAlloc_v2": self._alloc,
            "cuMemAllocAsync": self._alloc,
            "cuMemAllocFromPoolAsync": self._alloc,
            "cuMemFree_v2": self._free,
            "cuMemFreeAsync": self._free,
            "cuMemPoolGetAttribute": self._pool_get_attribute,
            "cuMemPoolSetAttribute": self._pool_set_attribute,
            "cuMemPoolTrimTo": self._pool_trim,
            "cuMemPoolDestroy": self._pool_destroy,
            **dict.fromkeys(
                ("cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize"), self._synchronize
            ),
            "cuModuleGetGlobal_v2": self._get_global,
            "cuLibraryGetGlobal": self._get_global,
            "cuLibraryGetManaged": self._get_global,
            **self.array_calls.handlers(),
            **self.graph_calls.handlers(),
            **GraphMemoryCalls(self).handlers(),
            **TensorMapCalls(self).handlers(),
            **CopyCalls(self).handlers(),
            **LaunchCalls(self).handlers(),
            **self.context_calls.handlers(),
            **self.green_calls.handlers(),
            **self.nccl_calls.handlers(),
            **MulticastCalls(self).handlers(),
            **self.endpoint_calls.handlers(),
        }
        # One handler per call id, looked up by index on every request. None: not the client's to send
        # (the handshake is the worker's own; LOCAL calls never leave the client).
        self.handlers: list[Callable | None] = [
            None
            if c.name in HANDSHAKE or c.mode is Mode.LOCAL
            else self.special.get(c.name if c.symbol == "-" else c.symbol, self._plain)
            for c in CALLS
        ]

    # -- the loop body -------------------------------------------------------------------------------

    def dispatch(self, call_id: int, flags: int, args: bytes, bulk_len: int) -> None:
        """Run one request; consumes its bulk bytes and answers it when it wants an answer."""
        self.calls += 1
        wants_reply = flags & _wire.FLAG_WANTS_REPLY
        handler = self.handlers[call_id] if 0 <= call_id < len(self.handlers) else None
        if handler is None:
            self.channel.skip(bulk_len)
            self._answer(wants_reply, None, INVALID_VALUE)
            return
        call = CALLS[call_id]
        self.channel.bulk_left = bulk_len
        if self.lease.native is not None:  # named events the native loop made or destroyed: known first
            self.lease.native.settle_events()
        try:
            answer = handler(call, call.in_struct.unpack(args) if call.ins else ())
            result = 0
        except CudaError as exc:
            answer, result = None, exc.code
            if log.isEnabledFor(logging.DEBUG):
                log.debug("%s -> %s", call.symbol, exc)
        except struct.error:
            answer, result = None, INVALID_VALUE
        except (ConnectionError, OSError, EOFError):
            raise  # the client is gone: the worker's loop ends this connection
        except RuntimeError as exc:  # cuda-bindings: this host's driver has no such entry point
            if "not found" not in str(exc):
                log.exception("%s failed inside the worker", call.symbol if call.symbol != "-" else call.name)
                answer, result = None, CUresult.UNKNOWN
            else:
                answer, result = None, CUresult.NOT_FOUND
        except Exception:  # a bug here must not cost the client its connection: this call fails
            log.exception("%s failed inside the worker", call.symbol if call.symbol != "-" else call.name)
            answer, result = None, CUresult.UNKNOWN
        if self.channel.bulk_left:
            self.channel.skip(self.channel.bulk_left)
        if answer is ANSWERED:
            return
        if call.sync_point and self.pending:  # the earlier asynchronous error comes first
            result, self.pending = self.pending, 0
        if call.sync_point and wants_reply:
            self._send_kernel_output()
        if not wants_reply or call.mode is Mode.ASYNC:
            if result and not self.pending:
                self.pending = result
            return
        self._answer(True, answer, result)

    def _send_kernel_output(self) -> None:
        """What kernels printed (the driver writes it at synchronising calls), ahead of the reply."""
        text = self.kernel_output() if self.kernel_output is not None else b""
        if text:
            self.channel.send(_wire.REPLY.pack(_wire.KERNEL_OUTPUT, 0, len(text)), text)

    def _answer(self, wants_reply: bool, answer, result: int) -> None:
        if not wants_reply:
            return
        self._announce_copies()
        outs, bulk = answer if (answer and result == 0) else (b"", b"")
        self.channel.send(_wire.REPLY.pack(result, len(outs), len(bulk)), outs, bulk)

    def _announce_copies(self, wait: bool = False) -> None:
        """Before any reply: the copies to the client's page-locked memory that are done by now go out,
        and the client hears how many it is to wait for — whatever the reply says (a synchronise, a
        query that says done), it returns with those bytes in place."""
        callbacks = self.callbacks
        if callbacks is None:
            return
        sent = callbacks.deliveries.flush(wait, inline=self.channel.send)
        if sent != self.copies_announced:
            self.copies_announced = sent
            count = _wire.COPIES_COUNT.pack(sent)
            self.channel.send(_wire.REPLY.pack(_wire.COPIES_SENT, len(count), 0), count)

    def close(self) -> None:
        """The client is gone: free what it left allocated, as process exit does on a local GPU."""
        if self.callbacks is not None:
            self.callbacks.close()  # its callback connection's thread ends, host functions are skipped
        for lanes in (self.lanes, self.lane_of.lanes if self.lane_of is not None else None):
            if lanes is not None:
                lanes.lane_lost()  # copies waiting for pieces fail rather than wait
        with self.lease.lock:
            self.lease.callback_tokens.pop(self.callback_token, None)
        self.nccl_calls.close()  # its NCCL communicators, aborted before their contexts go
        for base in list(self.ipc_imports.opened if self.ipc_imports is not None else ()):
            self._ipc_release(None, (base,))  # other workers' pages it opened
        self.green_calls.close()  # the green contexts it made
        self.endpoint_calls.close()  # its logical endpoints and ids, before the memory bound to them goes
        self.context_calls.close()  # the contexts it created, and their memory
        self.pool_usage.close()  # what its pools kept of freed memory
        contexts = self.lease.primary_ctx
        left = [a for a in map(self.lease.allocations.get, self.owned) if a is not None]
        for a in left:
            try:
                try:
                    self.executor.set_context(contexts.get(a.device, 0))
                except CudaError:
                    if a.window is None:
                        raise
                if a.window is not None:  # mapped memory outlives a released context: unmap it anyway
                    a.window.free(a.base)
                else:
                    self.executor.cuMemFree(a.base)
            except (
                CudaError
            ) as exc:  # graph memory whose graphs are gone may never have lived: nothing to free
                quiet = a.graph and not a.charged
                (log.debug if quiet else log.warning)(
                    "could not free 0x%x after the client left: %s", a.base, exc
                )
            self.lease.remove(a.base)
        self._vm_close()
        if self.ipc_imports is not None:  # its process has ended: other workers' openers count what they hold
            self.lease.stop_holding_for_others()
        self.array_calls.close()
        for base in list(self.pinned):
            CopyCalls.pinned_release(self, base)
        if self.shared is not None:
            try:
                self.executor.release_shared_host_memory(self.shared)
            except (CudaError, OSError) as exc:
                log.warning("could not release the memory shared with the client: %s", exc)
            self.shared = None
        try:
            self.window.close()
        except CudaError as exc:
            log.warning("could not release the client's device address window: %s", exc)
        if left:
            log.info(
                "freed %d allocation(s), %d bytes, the client left behind",
                len(left),
                sum(a.size for a in left),
            )
        self.owned.clear()

    # -- checks --------------------------------------------------------------------------------------

    def _check(self, call: Call, ins: tuple) -> None:
        handles = self.lease.handles
        for i, t in call.checked:
            value = ins[i]
            if t == "dptr":
                if self.lease.find(value) is None and not _names_no_bytes(call, ins, i):
                    raise CudaError(INVALID_VALUE, f"0x{value:x} is not memory of this lease")
            elif t == "stream":
                if value not in BUILTIN_STREAMS and value not in handles["stream"]:
                    raise CudaError(INVALID_HANDLE, "stream")
            elif t == "ctx":
                if value and value not in handles["ctx"]:
                    raise CudaError(INVALID_CONTEXT, "context")
            elif t == "func":
                if value not in handles["func"] and value not in handles["kernel"]:
                    raise CudaError(INVALID_HANDLE, "function")
            elif value not in handles[t]:
                raise CudaError(INVALID_HANDLE, t)

    def _check_ranges(self, call: Call, ins: tuple) -> None:
        """The call's handles (`_check`), then the device bytes it names (_guard_rules.DEVICE_RANGES)."""
        self._check(call, ins)
        for ptr, length, element in RANGES_BY_ID[CALL_IDS[call]]:
            self._check_range(ins[ptr], ins[length] * element)

    def _check_range(self, ptr: int, count: int) -> Allocation | None:
        if count == 0:  # no bytes: no memory named (None), as the driver touches none
            return None
        a = self.lease.find(ptr)
        if a is None or count > a.base + a.size - ptr:
            raise CudaError(INVALID_VALUE, f"[0x{ptr:x}, +{count}) is not memory of this lease")
        return a

    def _device(self) -> int:
        if not self.ctx:
            raise CudaError(INVALID_CONTEXT, "no current context")
        return self.lease.ctx_device[self.ctx]

    # -- plain calls: the table says everything ------------------------------------------------------

    def _plain(self, call: Call, ins: tuple):
        self._check_ranges(call, ins)
        args = list(ins)
        for p in call.wire_params:
            if p.type == "cstr":
                args.append(self.channel.read_bulk(limit=4096).rstrip(b"\0").decode())
            elif p.type == "bytes":
                args.append(self.channel.read_bulk(limit=_wire.MAX_SMALL_BULK_BYTES))
        result = getattr(self.executor, call.name)(*args)
        outs = call.outs
        if not outs:
            if call.name in DESTROYS:
                self._note_created(call, ins, ())
            return EMPTY
        values = result if len(outs) > 1 else (result,)
        self._note_created(call, ins, values)
        fixed = [v for p, v in zip(outs, values, strict=True) if p.struct_code]
        bulk = b""
        for p, v in zip(outs, values, strict=True):
            if p.type == "buf":
                limit = ins[[q.name for q in call.ins].index(p.length_from)]
                data = v.encode() if isinstance(v, str) else bytes(v)
                bulk = data[: max(limit - 1, 0)].ljust(max(limit, 0), b"\0")  # NUL-padded, as the driver does
            elif p.type == "b16":
                bulk = bytes(v)[:16].ljust(16, b"\0")
        return call.out_struct.pack(*fixed), bulk

    def _note_created(self, call: Call, ins: tuple, values: tuple) -> None:
        handles = self.lease.handles
        for p, v in zip(call.outs, values, strict=True):
            if p.type in HANDLE_TYPES and v:
                handles[p.type].add(v)
                parent = next(
                    (i for q, i in zip(call.ins, ins, strict=True) if q.type in ("module", "library")), None
                )
                if parent is not None:
                    self.lease.children.setdefault(parent, set()).add(v)
        gone = DESTROYS.get(call.name)
        if gone:
            handles[gone].discard(ins[0])
            children = self.lease.children.pop(ins[0], ())  # a module's functions, a graph's nodes
            for child in children:
                for kind in ("func", "kernel", "node", "graph", "texref", "surfref"):
                    handles[kind].discard(child)
                self.lease.layouts.pop(child, None)
            for node in (ins[0], *children):  # what the graph calls keep about a node goes with it
                self.lease.kernel_nodes.pop(node, None)
                self.lease.host_nodes.pop(node, None)

    # -- calls that need the lease's state -----------------------------------------------------------

    def _total_mem(self, call: Call, ins: tuple):
        (dev,) = ins
        if not 0 <= dev < len(self.lease.limits):
            raise CudaError(CUresult.INVALID_DEVICE, "device ordinal")
        real = self.executor.cuDeviceTotalMem(dev)
        return struct.pack("<Q", min(real, self.lease.limits[dev])), b""

    def _mem_get_info(self, call: Call, ins: tuple):
        dev = self._device()
        if self.lease.has_graph_memory:
            graph_reserve_read(self.lease, self.executor, dev)
        free, total = self.executor.cuMemGetInfo()
        limit = min(total, self.lease.limits[dev])
        with self.lease.lock:
            self.lease.count_departed_exports()
            self.lease.settle_pools(dev)
        return struct.pack("<QQ", max(0, min(free, limit - self.lease.in_use(dev))), limit), b""

    def _alloc(self, call: Call, ins: tuple):
        self._check(call, ins)
        size = ins[0]
        dev = self._device()
        window = self.window if self._in_window(call, ins) else None

        def allocate() -> int:
            nonlocal window
            if window is not None:
                try:
                    return window.allocate(size, dev)
                except WindowFull as exc:
                    log.warning("%s: the driver allocates instead", exc)
                    window = None
            return getattr(self.executor, call.name)(*ins)

        pool = 0
        if window is not None and call.name != "cuMemAlloc":  # a pool's, served from the window
            pool = ins[1] if call.name == "cuMemAllocFromPoolAsync" else self.executor.cuDeviceGetMemPool(dev)
        # what the pool keeps of memory freed to it is counted already, and reused here
        ptr = self.charged(dev, size - (self.pool_usage.reusable(pool, size) if pool else 0), allocate)
        self.own(ptr, size, dev, window, self._captured_into(call, ins) if window is None else 0)
        if pool and window is not None:
            self.pool_usage.allocated(pool, dev, ptr, size)
        return struct.pack("<Q", ptr), b""

    def synchronisations(self) -> int:
        """The process's synchronisations that succeeded so far, here and in the native loop."""
        return self.syncs + (self.native.syncs() if self.native is not None else 0)

    def _synchronize(self, call: Call, ins: tuple):
        answer = self._plain(call, ins)
        self.syncs += 1
        return answer

    def _pool_get_attribute(self, call: Call, ins: tuple):
        """The driver's answer, plus what this process's allocations served from its window hold of the
        pool for the counted attributes (virtualize.server._guard_pool_usage)."""
        answer = self._plain(call, ins)
        pool, attr = ins
        if attr not in POOL_COUNTED:
            return answer
        (value,) = struct.unpack("<Q", answer[0])
        return struct.pack("<Q", value + self.pool_usage.attribute(pool, attr)), b""

    def _pool_set_attribute(self, call: Call, ins: tuple):
        answer = self._plain(call, ins)  # the driver's checks: a high mark may only be set to 0
        pool, attr, value = ins
        if attr in POOL_COUNTED:
            self.pool_usage.reset_high(pool, attr)
        elif attr == POOL_RELEASE_THRESHOLD:
            self.pool_usage.set_threshold(pool, value)
        return answer

    def _pool_trim(self, call: Call, ins: tuple):
        answer = self._plain(call, ins)
        self.pool_usage.trimmed(*ins)
        return answer

    def _pool_destroy(self, call: Call, ins: tuple):
        answer = self._plain(call, ins)
        self.pool_usage.destroyed(ins[0])
        return answer

    def _captured_into(self, call: Call, ins: tuple) -> int:
        """The graph a stream-ordered allocation made during a capture is a node of (0: none)."""
        if call.name == "cuMemAlloc" or not self.executor.cuStreamIsCapturing(ins[-1]):
            return 0
        return self.executor.capture_info(ins[-1])[2]

    def charged(self, dev: int, size: int, allocate: Callable):
        """`allocate()`'s answer, `size` bytes of `dev` held against the lease's partition while it runs (so
        racing threads see them); refused with OUT_OF_MEMORY where they do not fit."""
        self.lease.take(dev, size)
        try:
            return allocate()
        finally:
            self.lease.give_back(dev, size)

    def own(self, ptr: int, size: int, dev: int, window: WindowMemory | None = None, graph: int = 0) -> None:
        """Memory this process allocated (in its window, or the driver's where None; graph memory of `graph`):
        the lease's, counted against its partition, freed when the process leaves if it has not freed it."""
        self.lease.add(Allocation(ptr, size, dev, owned=True, ctx=self.ctx, window=window, graph=graph))
        self.owned.add(ptr)
        if graph:
            self.lease.has_graph_memory = True

    def _in_window(self, call: Call, ins: tuple) -> bool:
        """Whether this allocation comes from the client's window: all of them once it has one, but a
        stream-ordered one during a capture (the graph's memory node places it, the driver picks)."""
        if not self.window.ready:
            return False
        return call.name == "cuMemAlloc" or not self.executor.cuStreamIsCapturing(ins[-1])

    def _device_attribute(self, call: Call, ins: tuple):
        """The device's answer, but no host access to managed or pageable memory while kernels run (the
        client's mirror of managed memory is kept in step at launches and synchronisations only), and no
        fabric handles or multicast objects, which are not forwarded (ATTRIBUTE_MASKS)."""
        mask = ATTRIBUTE_MASKS.get(ins[0])
        if mask == 0:
            self._check(call, ins)
            return struct.pack("<i", 0), b""
        answer = self._plain(call, ins)
        if mask is None:
            return answer
        (value,) = struct.unpack("<i", answer[0])
        return struct.pack("<i", value & mask), answer[1]

    def _stream_value(self, call: Call, ins: tuple):
        """cuStreamWaitValue32/64, cuStreamWriteValue32/64: the whole word must be the lease's memory."""
        self._check(call, ins)
        stream, addr, value, flags = ins
        self._check_range(addr, 8 if call.name.endswith("64") else 4)
        getattr(self.executor, call.name)(stream, addr, value, flags)

    # -- stream attributes ----------------------------------------------------------------------------

    def _stream_attribute(self, call: Call, ins: tuple):
        """cuStreamGetAttribute / SetAttribute: a CUstreamAttrValue (64 bytes) each way; an access-policy
        window (its base and length first) must be memory of the lease."""
        self._check(call, ins)
        stream, attr = ins
        if attr not in STREAM_ATTRIBUTES:
            raise CudaError(CUresult.NOT_SUPPORTED, f"stream attribute {attr} is not forwarded")
        if call.name == "cuStreamGetAttribute":
            return b"", bytes(self.executor.cuStreamGetAttribute(stream, attr))[:STREAM_ATTRIBUTE_BYTES]
        value = self.channel.read_bulk(limit=STREAM_ATTRIBUTE_BYTES)
        if len(value) != STREAM_ATTRIBUTE_BYTES:
            raise CudaError(INVALID_VALUE, "a stream attribute's value is 64 bytes")
        base, size = struct.unpack_from("<QQ", value)
        if attr == ACCESS_POLICY_WINDOW and size:
            self._check_range(base, size)
        self.executor.cuStreamSetAttribute(stream, attr, value)
        return EMPTY

    # -- what a module or library holds --------------------------------------------------------------

    def _enumerate(self, call: Call, ins: tuple):
        """cuModuleEnumerateFunctions / cuLibraryEnumerateKernels: the handles, now the lease's (children
        of their module or library, gone with it), in the reply's bulk."""
        self._check(call, ins)
        num, parent = ins
        found = getattr(self.executor, call.name)(num, parent)[:num]
        kind = "func" if call.name == "cuModuleEnumerateFunctions" else "kernel"
        with self.lease.lock:
            self.lease.handles[kind].update(found)
            self.lease.children.setdefault(parent, set()).update(found)
        return b"", struct.pack(f"<{len(found)}Q", *found)

    # -- host functions ------------------------------------------------------------------------------

    def _callback_token(self, call: Call, ins: tuple):
        """What this process's callback connection shows to be attached to this one."""
        with self.lease.lock:
            if not self.callback_token:
                self.callback_token = secrets.randbits(63) | 1
                self.lease.callback_tokens[self.callback_token] = self
        return struct.pack("<Q", self.callback_token), b""

    def _callback_attach(self, call: Call, ins: tuple):
        """This connection becomes `token`'s callback connection; the worker stops reading requests
        from it after this answer (the driver thread that calls back reads the answers)."""
        with self.lease.lock:
            owner = self.lease.callback_tokens.get(ins[0])
            if owner is None or owner.callbacks is not None:
                raise CudaError(INVALID_VALUE, "not a connection waiting for its callback connection")
            owner.callbacks = HostCallbacks(self.channel)
        self.calls_back_for = owner

    def _delivery_attach(self, call: Call, ins: tuple):
        """This connection carries pieces of `token`'s large copies into page-locked memory beside its
        callback connection (virtualize.server._deliveries); as there, the worker reads nothing more from it."""
        with self.lease.lock:
            owner = self.lease.callback_tokens.get(ins[0])
            if owner is None or owner.callbacks is None:
                raise CudaError(INVALID_VALUE, "not a connection with a callback connection")
            callbacks = owner.callbacks
        channel = self.channel
        self._answer(True, None, 0)  # answered before the connection is one the deliveries write to
        callbacks.deliveries.add_outlet(
            lambda *parts: callbacks.send_on(channel, parts, "delivery connection is gone (%s)")
        )
        self.calls_back_for, self.delivers = owner, True
        return ANSWERED

    def _event_create_named(self, call: Call, ins: tuple):
        """gpEventCreateNamed: an event made as cuEventCreate makes one, in the thread's context, that the
        client calls by the value it chose (`name`: from then on every call naming it names this event,
        `Translated.event_named`). Unanswered, as a launch: a refusal (bad flags, no memory, a value not
        a client's to choose or already an event of the lease) is the next synchronising call's error."""
        flags, name = ins
        handles = self.lease.handles["event"]
        if not _wire.is_event_name(name) or name in handles:
            raise CudaError(INVALID_VALUE, "not a value to name an event by")
        named = getattr(self.executor, "event_named", None)
        if named is None:  # an executor without the handle map (benchmarks of the dispatch alone)
            raise CudaError(NOT_SUPPORTED, "events named by the client")
        named(name, flags)
        handles.add(name)
        return EMPTY

    def _host_function(self, call: Call, ins: tuple):
        stream, ident = ins
        self._check(call, ins)
        callbacks = self.callbacks
        if callbacks is None:
            raise CudaError(CUresult.NOT_SUPPORTED, "no callback connection")
        self.executor.launch_host_func(stream, lambda: callbacks.call(ident))

    def _pool_create(self, call: Call, ins: tuple):
        """cuMemPoolCreate: a pool of the lease's device (its allocations come from the process's window,
        like the default pool's; the pool carries the attributes and the export)."""
        props = self.channel.read_bulk(limit=POOL_PROPS_BYTES)
        if len(props) != POOL_PROPS_BYTES:
            raise CudaError(INVALID_VALUE, "CUmemPoolProps")
        kind, handle_types, location, device = struct.unpack_from("<iiii", props)
        (max_size,) = struct.unpack_from("<Q", props, 24)
        if kind != 1 or location != 1:  # pinned, on a device
            raise CudaError(CUresult.NOT_SUPPORTED, "only pools of device memory are created remotely")
        if not 0 <= device < len(self.lease.limits):
            raise CudaError(CUresult.INVALID_DEVICE, "device ordinal")
        pool = self.executor.cuMemPoolCreate(device, handle_types, max_size)
        self.lease.handles["pool"].add(pool)
        return struct.pack("<Q", pool), b""

    # -- the virtual memory API ----------------------------------------------------------------------

    def _vm_reserve(self, call: Call, ins: tuple):
        size, align = ins[:2]
        if not size or size % GRANULE or (align & (align - 1)):
            raise CudaError(INVALID_VALUE, "size must be a multiple of 2 MiB, alignment a power of two")
        base = self.window.reserve_range(size, align)
        self.vm_ranges[base] = size
        self.lease.add(Allocation(base, size, 0, owned=False))  # copies and launches may name it
        return struct.pack("<Q", base), b""

    def _vm_address_free(self, call: Call, ins: tuple):
        base, size = ins
        if self.vm_ranges.get(base) != size:
            raise CudaError(INVALID_VALUE, f"[0x{base:x}, +{size}) is not a range this process reserved")
        if any(base <= m < base + size for m in self.vm_mapped):
            raise CudaError(INVALID_VALUE, "memory is still mapped in the range")
        self.window.release_range(base, size)
        del self.vm_ranges[base]
        self.lease.remove(base)

    def _vm_inside(self, ptr: int, size: int) -> None:
        """[ptr, +size) lies inside one range this process reserved."""
        for base, n in self.vm_ranges.items():
            if base <= ptr and ptr + size <= base + n:
                return
        raise CudaError(INVALID_VALUE, f"[0x{ptr:x}, +{size}) is not inside a range this process reserved")

    def _vm_device(self, prop: bytes) -> tuple[int, int]:
        """A CUmemAllocationProp's device (of the lease) and requested handle types; pinned device memory only."""
        if len(prop) != ALLOCATION_PROP_BYTES:
            raise CudaError(INVALID_VALUE, "CUmemAllocationProp")
        kind, handle_types, location, device = struct.unpack_from("<iiii", prop)
        if kind != 1 or location != 1:  # CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_LOCATION_TYPE_DEVICE
            raise CudaError(CUresult.NOT_SUPPORTED, "only pinned device memory is created remotely")
        if not 0 <= device < len(self.lease.limits):
            raise CudaError(CUresult.INVALID_DEVICE, "device ordinal")
        return device, handle_types

    def _vm_create(self, call: Call, ins: tuple):
        size, _flags = ins  # flags: reserved by CUDA, 0
        prop = self.channel.read_bulk(limit=ALLOCATION_PROP_BYTES)
        device, handle_types = self._vm_device(prop)
        (usage,) = struct.unpack_from("<H", prop, ALLOCATION_USAGE_AT)
        if not size or size % GRANULE:
            raise CudaError(INVALID_VALUE, "size must be a multiple of the granularity (2 MiB)")
        if usage & ~(USAGE_TILE_POOL | USAGE_HW_DECOMPRESS):
            raise CudaError(CUresult.NOT_SUPPORTED, f"memory of usage {usage:#x} is not created remotely")
        self.lease.take(device, size)
        try:
            handle = self.executor.cuMemCreate(size, device, handle_types, usage)
        except BaseException:
            self.lease.give_back(device, size)
            raise
        self.vm_handles[handle] = (size, device)
        self.vm_props[handle] = bytes(prop)
        self.lease.vm_hold(handle, size, device, charged=True)
        return struct.pack("<Q", handle), b""

    def _vm_release(self, call: Call, ins: tuple):
        (handle,) = ins
        if handle not in self.vm_handles:
            raise CudaError(INVALID_VALUE, "not memory this process created")
        self.executor.cuMemRelease(handle)
        if self.vm_references.get(handle):  # a retained reference: the memory has another holder
            self.vm_references[handle] -= 1
            return
        self.vm_handles.pop(handle)
        self.vm_props.pop(handle, None)
        self.lease.vm_drop(handle)
        if self.ipc_imports is not None:  # the last use of memory imported from another worker's process?
            self.ipc_imports.vm_released()
        for exported in [e for e, h in self.vm_across.items() if h == handle]:
            del self.vm_across[exported]  # a later import of that descriptor asks its exporter again

    def _vm_map(self, call: Call, ins: tuple):
        ptr, size, offset, handle, flags = ins
        if handle not in self.vm_handles or offset + size > self.vm_handles[handle][0]:
            raise CudaError(INVALID_VALUE, "not memory this process created, or past its end")
        self._vm_inside(ptr, size)
        self.executor.cuMemMap(ptr, size, offset, handle, flags)
        self.vm_mapped[ptr] = size
        self.vm_mapping_of[ptr] = (handle, *self.vm_handles[handle])
        self.lease.vm_mapping(handle, ptr, True)

    def _vm_unmap(self, call: Call, ins: tuple):
        ptr, size = ins
        inside = [m for m, n in self.vm_mapped.items() if ptr <= m and m + n <= ptr + size]
        if not inside or sum(self.vm_mapped[m] for m in inside) != size:
            raise CudaError(INVALID_VALUE, f"[0x{ptr:x}, +{size}) is not whole mappings of this process")
        self.executor.cuMemUnmap(ptr, size)
        for m in inside:
            del self.vm_mapped[m]
            self._vm_forget_mapping(m)

    def _vm_forget_mapping(self, ptr: int) -> None:
        mapping = self.vm_mapping_of.pop(ptr, None)
        if mapping is not None:
            self.lease.vm_mapping(mapping[0], ptr, False)
            if self.ipc_imports is not None:  # the last use of memory imported from another worker's process?
                self.ipc_imports.vm_released()

    def _vm_properties(self, call: Call, ins: tuple):
        """cuMemGetAllocationPropertiesFromHandle: as this process created it (its device, the lease's)."""
        (handle,) = ins
        if handle not in self.vm_handles or handle not in self.vm_props:
            raise CudaError(INVALID_VALUE, "not memory this process created")
        return b"", self.vm_props[handle]

    def _vm_access(self, call: Call, ins: tuple):
        """cuMemGetAccess: the access a device of the lease has to memory this process mapped."""
        location, device, ptr = ins
        if not any(m <= ptr < m + n for m, n in self.vm_mapped.items()):
            raise CudaError(INVALID_VALUE, f"0x{ptr:x} is not memory this process mapped")
        if location != 1 or not 0 <= device < len(self.lease.limits):  # CU_MEM_LOCATION_TYPE_DEVICE
            raise CudaError(CUresult.INVALID_DEVICE, "location")
        return struct.pack("<Q", self.executor.cuMemGetAccess(ptr, device)), b""

    def _vm_retain(self, call: Call, ins: tuple):
        """cuMemRetainAllocationHandle: another reference to the memory this process mapped at `addr`
        (never the memory of the process's window, which the worker maps for cuMemAlloc)."""
        (addr,) = ins
        mapped = next((m for m, n in self.vm_mapped.items() if m <= addr < m + n), None)
        if mapped is None:
            raise CudaError(INVALID_VALUE, f"0x{addr:x} is not memory this process mapped")
        handle = self.executor.cuMemRetainAllocationHandle(addr)
        if handle in self.vm_handles:
            self.vm_references[handle] = self.vm_references.get(handle, 0) + 1
        else:  # a reference of this process's own, its first (the memory's creator may be gone)
            _, size, device = self.vm_mapping_of[mapped]
            self.vm_handles[handle] = (size, device)
            self.lease.vm_hold(handle, size, device)
        return struct.pack("<Q", handle), b""

    def _p2p_atomics(self, call: Call, ins: tuple):
        """cuDeviceGetP2PAtomicCapabilities between two of the lease's devices: a mask per operation."""
        count, src, dst = ins
        raw = self.channel.read_bulk(limit=4 * P2P_ATOMIC_OPERATIONS_MAX)
        if not 0 < count <= P2P_ATOMIC_OPERATIONS_MAX or len(raw) != 4 * count:
            raise CudaError(INVALID_VALUE, "operations")
        for dev in (src, dst):
            if not 0 <= dev < len(self.lease.limits):
                raise CudaError(CUresult.INVALID_DEVICE, "device ordinal")
        operations = list(struct.unpack(f"<{count}i", raw))
        capabilities = self.executor.cuDeviceGetP2PAtomicCapabilities(operations, src, dst)
        return b"", struct.pack(f"<{count}I", *capabilities)

    def _logs_dump(self, call: Call, ins: tuple):
        """cuLogsDumpToMemory: the worker's driver log (this lease's process alone) from an iterator, or
        from its start; the bytes without the driver's NUL, the advanced iterator and their length."""
        from_start, iterator, size, flags = ins
        following, text = self.executor.cuLogsDumpToMemory(
            None if from_start else iterator, min(size, LOG_BYTES_MAX + 1), flags
        )
        text = bytes(text)[: max(size - 1, 0)]
        return struct.pack("<IQ", following, len(text)), text

    def _vm_export(self, call: Call, ins: tuple):
        """cuMemExportToShareableHandle: memory this process holds, created to be shared as a POSIX file
        descriptor, becomes importable by the lease's other processes (the shim makes the descriptor)."""
        handle, handle_type = ins
        if handle_type != POSIX_FILE_DESCRIPTOR:
            raise CudaError(CUresult.NOT_SUPPORTED, "only POSIX file descriptors are shared remotely")
        if handle not in self.vm_handles:
            raise CudaError(INVALID_VALUE, "not memory this process holds")
        prop = self.vm_props.get(handle) or self.lease.vm_exported.get(handle, (0, 0, b""))[2]
        if not prop or not struct.unpack_from("<i", prop, 4)[0] & POSIX_FILE_DESCRIPTOR:
            raise CudaError(INVALID_VALUE, "created without CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR")
        with self.lease.lock:
            self.lease.vm_exported[handle] = (*self.vm_handles[handle], prop)

    def _vm_import(self, call: Call, ins: tuple):
        """cuMemImportFromShareableHandle: a reference of this process's own to memory another process of
        the lease exported; a handle the lease did not export (another lease's) is refused."""
        (exported,) = ins
        with self.lease.lock:
            found = self.lease.vm_exported.get(exported)
        if found is None and self.ipc_imports is not None:  # exported by a process of another worker
            return self._vm_import_across(exported)
        if found is None:
            raise CudaError(INVALID_VALUE, "not memory exported by a process of this lease")
        size, device, prop = found
        # Another reference to the memory in the worker: retained where a process of the lease maps it
        # (the driver's own way, the same handle value), else through a descriptor exported and imported.
        with self.lease.lock:
            mapped = next(iter(self.lease.vm_mapped_at.get(exported, ())), None)
        if mapped is not None:
            handle = self.executor.cuMemRetainAllocationHandle(mapped)
        else:
            handle = self.executor.cuMemImportFromShareableHandle(exported)
        if handle in self.vm_handles:
            self.vm_references[handle] = self.vm_references.get(handle, 0) + 1
        else:
            self.vm_handles[handle] = (size, device)
            self.vm_props[handle] = prop
            self.lease.vm_hold(handle, size, device, memory=exported)
        return struct.pack("<Q", handle), b""

    def _vm_import_across(self, exported: int):
        """cuMemImportFromShareableHandle of memory a process of another worker of the lease exported
        (`gpuattach run --isolate`): the driver's descriptor of it, from that worker, imported here. Its
        exporter's worker counts it against the partition, and this one once the exporting process has gone
        (Imports.count_departed). While this process holds memory imported from `exported`, the descriptor
        names that memory still, the exporter gone or not, as the driver's does."""
        held = self.vm_across.get(exported)
        if held in self.vm_handles:  # the same memory again, counted as that is
            size, device = self.vm_handles[held]
            prop = self.vm_props[held]
            handle = self.executor.cuMemImportFromShareableHandle(held)
            memory = held
        else:
            found = _ipc_workers.fetch_vm(self.ipc_imports.state_dir, exported)
            if found is None:
                raise CudaError(INVALID_VALUE, "not memory exported by a process of this lease")
            fd, size, device, prop, exporter, exporter_worker = found
            try:
                handle = self.executor.import_vm(fd, device)
            except CudaError:
                _ipc_workers.tell_closed(self.ipc_imports.state_dir, exporter_worker, exported,
                                         _ipc_workers.VM_CLOSED)  # not imported after all  # fmt: skip
                raise
            finally:
                os.close(fd)
            self.vm_across[exported] = handle
            memory = 0
        self.vm_handles[handle] = (size, device)
        self.vm_props[handle] = prop
        self.lease.vm_hold(handle, 0, device, memory=memory)  # counted elsewhere, or with `held`
        if not memory:
            self.ipc_imports.note_vm(handle, exporter, size, device, exporter_worker, exported)
        return struct.pack("<Q", handle), b""

    def _vm_set_access(self, call: Call, ins: tuple):
        ptr, size, count = ins
        raw = self.channel.read_bulk(limit=64 * ACCESS_DESC_BYTES)
        if len(raw) != count * ACCESS_DESC_BYTES:
            raise CudaError(INVALID_VALUE, "CUmemAccessDesc")
        self._vm_inside(ptr, size)
        access = []
        for i in range(count):
            location, device, flags = struct.unpack_from("<iii", raw, i * ACCESS_DESC_BYTES)
            if location != 1 or not 0 <= device < len(self.lease.limits):
                raise CudaError(CUresult.INVALID_DEVICE, "access descriptor's device")
            access.append((device, flags))
        self.executor.cuMemSetAccess(ptr, size, access)

    def _vm_granularity(self, call: Call, ins: tuple):
        (option,) = ins
        prop = self.channel.read_bulk(limit=ALLOCATION_PROP_BYTES)
        if len(prop) == ALLOCATION_PROP_BYTES:
            kind, _, location, _ = struct.unpack_from("<iiii", prop)
            # Pinned host memory (CU_MEM_LOCATION_TYPE_HOST, _HOST_NUMA, _HOST_NUMA_CURRENT) is not created
            # remotely, but its granularity is a question the driver answers: NCCL asks it before it tries a
            # creation and falls back to /dev/shm when that fails, and stops when the question fails.
            if kind == 1 and location in (2, 3, 4):
                return struct.pack("<Q", self.executor.host_allocation_granularity(option)), b""
        device, _ = self._vm_device(prop)
        return struct.pack("<Q", self.executor.cuMemGetAllocationGranularity(device, option)), b""

    def _vm_close(self) -> None:
        """The client is gone: unmap, release and free what it left of the virtual memory API."""
        try:
            if self.vm_mapped:
                self.executor.cuCtxSynchronize()
            for ptr, size in list(self.vm_mapped.items()):
                self.executor.cuMemUnmap(ptr, size)
                del self.vm_mapped[ptr]
                self._vm_forget_mapping(ptr)
            for handle in list(self.vm_handles):
                while handle in self.vm_handles:  # every reference, retained ones too
                    self._vm_release(None, (handle,))
            for base, size in list(self.vm_ranges.items()):
                self._vm_address_free(None, (base, size))
        except CudaError as exc:
            log.warning("could not release the client's mapped memory: %s", exc)

    def _resume(self, call: Call, ins: tuple):
        """A process whose lease moved here: this connection adopts its state (virtualize.server._migrate_state)."""
        from virtualize.server import _migrate_state

        try:
            _migrate_state.resume(self, ins[0])
        except ValueError as exc:
            raise CudaError(INVALID_VALUE, str(exc)) from None
        return b"", b""

    def _lease_memory(self, call: Call, ins: tuple):
        """gpLeaseMemory: what the lease holds of the device now (its used memory, as NVML would say)."""
        if not 0 <= ins[0] < len(self.lease.limits):
            raise CudaError(INVALID_VALUE, f"device {ins[0]}")
        with self.lease.lock:
            self.lease.count_departed_exports()
        return struct.pack("<Q", self.lease.in_use(ins[0])), b""

    def _ipc_import(self, call: Call, ins: tuple):
        """gpIpcImport: the allocation an IPC handle names, where another worker of the lease holds it
        (`gpuattach run --isolate`): its pages mapped here at their address, the range served as memory of
        the lease that its exporter counts."""
        base, size = ins
        if self.lease.find(base) is not None:
            return  # memory this worker serves already
        if self.ipc_imports is None or size == 0:
            raise CudaError(INVALID_VALUE, f"0x{base:x} is not memory of this lease")
        device = self.ipc_imports.open(base, size)
        if device is None:
            raise _ipc_workers.not_found(base)
        self.lease.add(Allocation(base, size, device, owned=False, charged=False))

    def _ipc_release(self, call: Call | None, ins: tuple):
        """gpIpcRelease: the process closed the handle it opened (nothing to do for memory of this worker)."""
        if self.ipc_imports is not None and self.ipc_imports.close(ins[0]):
            self.lease.remove(ins[0])

    def _ipc_event_import(self, call: Call, ins: tuple):
        """gpIpcEventImport: an interprocess event another worker of the lease holds, opened here from the
        driver's IPC handle of it (an event of this worker that the exporter's records complete)."""
        event = ins[0]
        if event in self.lease.handles["event"]:
            return struct.pack("<Q", event), b""  # this worker's own
        handle = (
            None if self.ipc_imports is None else _ipc_workers.fetch_event(self.ipc_imports.state_dir, event)
        )
        if handle is None:
            raise CudaError(CUresult.INVALID_HANDLE, f"0x{event:x} is an event of no worker of this lease")
        opened = self.executor.ipc_open_event(handle)
        self.lease.handles["event"].add(opened)
        return struct.pack("<Q", opened), b""

    def _window_offer(self, call: Call, ins: tuple):
        return struct.pack("<QQ", *self.window.offer()), b""

    def _window_accept(self, call: Call, ins: tuple):
        self.window.accept(ins[0])

    def _address_range(self, call: Call, ins: tuple):
        """The allocation's own range (a window's pages hold several small ones)."""
        a = self.lease.find(ins[0])
        if a is None:
            raise CudaError(INVALID_VALUE, f"0x{ins[0]:x} is not memory of this lease")
        return struct.pack("<QQ", a.base, a.size), b""

    def _pointer_attribute(self, call: Call, ins: tuple):
        """What cuMemAlloc memory answers, for memory mapped into a window as well (the driver would
        give the window's range and no context)."""
        attr, ptr = ins
        a = self.lease.find(ptr)
        if a is None:
            raise CudaError(INVALID_VALUE, f"0x{ptr:x} is not memory of this lease")
        if a.window is not None and attr in WINDOW_POINTER_ATTRIBUTES:
            value = {
                POINTER_CONTEXT: a.ctx or self.lease.primary_ctx.get(a.device, 0),
                POINTER_SYNC_MEMOPS: a.sync_memops,
                POINTER_DEVICE_ORDINAL: a.device,
                POINTER_LEGACY_IPC: 1,
                POINTER_RANGE_START: a.base,
                POINTER_RANGE_SIZE: a.size,
                POINTER_MEMPOOL: 0,
            }[attr]
        else:
            value = self.executor.cuPointerGetAttribute(attr, ptr)
        return struct.pack("<Q", value), b""

    def _set_pointer_attribute(self, call: Call, ins: tuple):
        """SYNC_MEMOPS, the one settable attribute: the driver refuses it on memory mapped into a window
        (NOT_SUPPORTED; on an H100 cuMemAlloc memory takes it). A window's memory keeps the program's
        value here: a copy to or from the client is synchronous at its return anyway, as the flag asks."""
        attr, ptr, value = ins  # as the wire carries them
        a = self.lease.find(ptr)
        if a is None:
            raise CudaError(INVALID_VALUE, f"0x{ptr:x} is not memory of this lease")
        if a.window is not None and attr == POINTER_SYNC_MEMOPS:
            a.sync_memops = 1 if value else 0
            return EMPTY
        return self._plain(call, ins)

    def _free(self, call: Call, ins: tuple):
        self._check(call, ins)
        ptr = ins[0]
        a = self.lease.allocations.get(ptr)
        if a is None or not a.owned:
            raise CudaError(INVALID_VALUE, f"0x{ptr:x} is not an allocation of this lease")
        if a.window is None:
            getattr(self.executor, call.name)(*ins)
        elif call.name == "cuMemFreeAsync":
            a.window.free_after(ptr, ins[1])
        else:
            a.window.free(ptr)
        self.lease.remove(ptr)
        self.owned.discard(ptr)
        self.pool_usage.freed(ptr)

    def _get_global(self, call: Call, ins: tuple):
        answer = self._plain(call, ins)
        ptr, size = struct.unpack("<QQ", answer[0])
        dev = self.lease.ctx_device.get(self.ctx, 0)
        # Globals of modules unloaded since stay known (unloading does not say which were its), so the
        # driver may place a new module's global over one of them: the new range replaces what it
        # overlaps of those (JAX's FFT tests met a 24-byte global past an old one's end, refused).
        stale = [a.base for a in list(self.lease.allocations.values())
                 if a.is_global and a.base < ptr + max(size, 1) and ptr < a.base + max(a.size, 1)
                 and (a.base, a.size) != (ptr, size)]  # fmt: skip
        for base in stale:
            self.lease.remove(base)
        if self.lease.find(ptr) is None:
            self.lease.add(Allocation(ptr, size, dev, owned=False, is_global=True))
        return answer

    def _layout(self, func: int) -> list[tuple[int, int]]:
        layout = self.lease.layouts.get(func)
        if layout is None:
            layout = self.executor.param_layout(func, func in self.lease.handles["kernel"])
            self.lease.layouts[func] = layout
        return layout
