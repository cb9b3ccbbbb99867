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
import secrets
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from virtualize import _wire
from virtualize._address_window import GRANULE, WindowFull, WindowMemory
from virtualize._arrays import (
    ARRAY,
    DEVICE,
    HOST,
    RESOURCE_DESC_BYTES,
    TEXTURE_DESC_BYTES,
    VIEW_DESC_BYTES,
    ArrayShape,
    resource,
)
from virtualize._calls import CALLS, HANDLE_TYPES, Call, Mode
from virtualize._deliveries import Deliveries
from virtualize._executor import (
    HANDSHAKE,
    INVALID_CONTEXT,
    INVALID_HANDLE,
    INVALID_VALUE,
    OUT_OF_MEMORY,
    Copy3D,
    CopySide,
    CudaError,
    Executor,
    Launch,
    SharedHostMemory,
    StagedCopy,
)
from virtualize._lanes import Lanes
from virtualize._results import CUresult

log = logging.getLogger("gpupool.worker")

BUILTIN_STREAMS = frozenset({0, 1, 2})  # NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD
MEMSET_WIDTH = {"cuMemsetD8": 1, "cuMemsetD16": 2, "cuMemsetD32": 4}
LAUNCH_ATTRIBUTE_BYTES = 72
ALLOCATION_PROP_BYTES, ACCESS_DESC_BYTES = 32, 12  # CUmemAllocationProp, CUmemAccessDesc
POOL_PROPS_BYTES = 88  # CUmemPoolProps
TENSOR_MAP_BYTES, TENSOR_RANK_MAX = 128, 5  # CUtensorMap
# Each tensor-map call's shape arrays in the bulk, in the C order: (count as rank + offset, struct code).
TENSOR_SHAPE_ARRAYS = {
    "cuTensorMapEncodeTiled": (
        (0, "Q"),
        (-1, "Q"),
        (0, "I"),
        (0, "I"),
    ),  # dims, strides, box, element strides
    "cuTensorMapEncodeIm2col": (
        (0, "Q"),
        (-1, "Q"),
        (-2, "i"),
        (-2, "i"),
        (0, "I"),
    ),  # + lower, upper corners
    "cuTensorMapEncodeIm2colWide": ((0, "Q"), (-1, "Q"), (0, "I")),  # dims, strides, element strides
}
# Bytes of one element of each CUtensorMapDataType (the packed 4- and 6-bit types: at most one).
TENSOR_ELEMENT_BYTES = {
    0: 1,
    1: 2,
    2: 4,
    3: 4,
    4: 8,
    5: 8,
    6: 2,
    7: 4,
    8: 8,
    9: 2,
    10: 4,
    11: 4,
    12: 4,
    13: 1,
    14: 1,
    15: 1,
}
# CUstreamAttrID values whose CUstreamAttrValue is plain data, or (the access-policy window) a range the
# guard checks: access-policy window, synchronization policy, priority, memory sync domain map, domain.
ACCESS_POLICY_WINDOW, STREAM_ATTRIBUTE_BYTES = 1, 64
STREAM_ATTRIBUTES = frozenset({ACCESS_POLICY_WINDOW, 3, 8, 9, 10})
TENSOR_MAPS_KEPT = 65536  # maps a lease encoded, kept with their extent for cuTensorMapReplaceAddress
MAX_NODE_DEPS = 4096  # dependencies of one graph node (the shim's limit too)
MAX_CONDITIONAL_BODIES = 64  # body graphs of one conditional node (a switch's cases; the shim's limit too)
# CUdevice_attribute: PAGEABLE_MEMORY_ACCESS, CONCURRENT_MANAGED_ACCESS, PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES,
# DIRECT_MANAGED_MEM_ACCESS_FROM_HOST: 0 remotely (docs/remote.md, managed memory).
NOT_COHERENT_ATTRIBUTES = frozenset({88, 89, 100, 101})
# CUpointer_attribute values the guard answers for memory in a window (cuda.h numbering).
POINTER_CONTEXT, POINTER_DEVICE_ORDINAL, POINTER_LEGACY_IPC = 1, 9, 10
POINTER_RANGE_START, POINTER_RANGE_SIZE, POINTER_MEMPOOL = 11, 12, 17
WINDOW_POINTER_ATTRIBUTES = frozenset(
    {
        POINTER_CONTEXT,
        POINTER_DEVICE_ORDINAL,
        POINTER_LEGACY_IPC,
        POINTER_RANGE_START,
        POINTER_RANGE_SIZE,
        POINTER_MEMPOOL,
    }
)


def tensor_extent(dtype: int, dims: list[int], strides: list[int]) -> int:
    """Bytes from a tensor's address to the end of its last element: a row of dims[0] elements, and
    dims[i] steps of strides[i-1] bytes along each other dimension."""
    if dtype not in TENSOR_ELEMENT_BYTES:
        raise CudaError(INVALID_VALUE, f"tensor data type {dtype}")
    if not all(dims):
        raise CudaError(INVALID_VALUE, "a tensor dimension of 0")
    return dims[0] * TENSOR_ELEMENT_BYTES[dtype] + sum(
        (d - 1) * s for d, s in zip(dims[1:], strides, strict=True)
    )


@dataclass
class Allocation:
    base: int
    size: int
    device: int
    owned: bool  # False: a module global (not freed by the client, not counted against the quota)
    ctx: int = 0  # the context it was made in (a destroyed context takes its memory with it)
    window: WindowMemory | None = None  # the client process's window it lives in; None: the driver's


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
    layouts: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    callback_tokens: dict[int, Session] = field(default_factory=dict)  # token -> connection to call back for
    tensor_maps: dict[bytes, int] = field(default_factory=dict)  # encoded map -> its tensor's extent
    lock: threading.Lock = field(default_factory=threading.Lock)
    native: Any = None  # the worker's native hot path (a virtualize._native_dispatch.NativeLease), if any

    def __post_init__(self) -> None:
        self.used = [0] * len(self.limits)

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
            if a.owned:
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
            if a.owned:
                self.used[a.device] -= a.size
        return a

    def reserve(self, device: int, size: int) -> None:
        """Refuse an allocation that would take the lease past its partition of `device`."""
        if self.used[device] + size > self.limits[device]:
            raise CudaError(OUT_OF_MEMORY, f"partition of device {device} is {self.limits[device]} bytes")


class HostCallbacks:
    """The client process's callback connection: the worker's driver thread sends a host function's id
    when its stream reaches it and waits until the client answers that it has run (one at a time).
    Copies to the client's page-locked memory travel on it too (`virtualize._deliveries`); those done
    by then go first, so a host function after a copy sees its bytes."""

    def __init__(self, channel) -> None:
        self.channel = channel
        self.lock = threading.Lock()  # one host function at a time
        self.send_lock = threading.Lock()  # frames whole: host function ids and copies share the channel
        self.closed = threading.Event()  # the process's connection has ended: stop calling back
        self.deliveries = Deliveries(self.send, self.lock)

    def send(self, *parts) -> bool:
        with self.send_lock:
            if self.closed.is_set():
                return False
            try:
                self.channel.send(*parts)
                return True
            except (OSError, ConnectionError, EOFError) as exc:
                log.info("the client's callback connection is gone (%s); host functions are skipped", exc)
                self.closed.set()
                return False

    def call(self, ident: int, status: int = 0) -> None:
        with self.lock:
            self.deliveries.send_done()  # copies done by now land before the function runs
            if not self.send(_wire.REPLY.pack(status, 8, 0), struct.pack("<Q", ident)):
                return
            try:
                self.channel.read_exact(8)  # the id again: the function has returned
            except (OSError, ConnectionError, EOFError) as exc:
                log.info("the client's callback connection is gone (%s); host functions are skipped", exc)
                self.closed.set()

    def close(self) -> None:
        self.closed.set()
        self.deliveries.close()


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
        self.created_contexts: set[int] = set()  # cuCtxCreate's on this connection, destroyed when it closes
        self.window = WindowMemory(executor, lease.limits)  # this client process's device addresses
        self.spoiled_captures: set[int] = set()  # streams whose capture met a copy it cannot hold
        self.callbacks: HostCallbacks | None = None  # this process's callback connection, once attached
        self.copies_announced = 0  # copy frames the client was last told to wait for (_wire.COPIES_SENT)
        self.callback_token = 0
        self.calls_back_for: Session | None = None  # set on a callback connection: stop reading it
        # The virtual memory API on this connection: reserved ranges, mappings, and created memory.
        self.vm_ranges: dict[int, int] = {}  # base -> size
        self.vm_mapped: dict[int, int] = {}  # mapped address -> size
        self.vm_handles: dict[int, tuple[int, int]] = {}  # handle -> (size, device)
        self.vm_references: dict[int, int] = {}  # handle -> references beyond the first (retains)
        self.vm_props: dict[int, bytes] = {}  # handle -> the CUmemAllocationProp it was created with
        self.vm_mapping_of: dict[int, tuple[int, int, int]] = {}  # mapped address -> (handle, size, device)
        self.arrays: dict[
            int, tuple[str, int, int, int]
        ] = {}  # array or mipmap -> (kind, bytes, device, ctx)
        self.shared: SharedHostMemory | None = None  # memory the client maps too (gpShmAttach)
        self.shared_error = 0  # the first error of the pieces of a copy through it, for its answer
        # the client's page-locked allocations this worker maps too (gpPinnedShare): its address -> the
        # memory, and the copies into it not known to be done yet
        self.pinned: dict[int, SharedHostMemory] = {}
        self.pinned_landing: dict[int, list[StagedCopy]] = {}
        self.lanes: Lanes | None = None  # this process's extra connections' copies, once one attached
        self.lane_of: Session | None = None  # set on a lane: the connection whose copies it carries
        self.special: dict[str, Callable] = {
            "gpSetContext": self._set_context,
            "gpParamLayout": self._param_layout,
            "gpLinkImage": self._link_image,
            "cuStreamEndCapture": self._end_capture,
            "cuDeviceGetAttribute": self._device_attribute,
            "cuGraphAddKernelNode_v2": self._graph_kernel_node,
            "cuGraphExecKernelNodeSetParams_v2": self._graph_kernel_node,
            "cuGraphAddMemsetNode": self._graph_memset_node,
            "cuGraphAddEmptyNode": self._graph_empty_node,
            "cuGraphAddDependencies": self._graph_dependencies,
            "cuGraphAddDependencies_v2": self._graph_dependencies,
            "cuGraphAddChildGraphNode": self._graph_child_node,
            "cuGraphAddEventRecordNode": self._graph_event_node,
            "cuGraphAddEventWaitNode": self._graph_event_node,
            "cuGraphAddHostNode": self._graph_host_node,
            "cuGraphAddMemcpyNode": self._graph_memcpy_node,
            "cuGraphExecMemsetNodeSetParams": self._graph_memset_node,
            "cuGraphExecMemcpyNodeSetParams": self._graph_memcpy_node,
            "cuGraphGetNodes": self._graph_nodes,
            "cuGraphGetRootNodes": self._graph_node_list,
            "cuGraphNodeGetDependencies": self._graph_node_list,
            "cuGraphNodeGetDependencies_v2": self._graph_node_list,
            "cuGraphNodeGetDependentNodes": self._graph_node_list,
            "cuGraphNodeGetDependentNodes_v2": self._graph_node_list,
            "cuGraphGetEdges": self._graph_edges,
            "cuGraphGetEdges_v2": self._graph_edges,
            "gpGraphAddConditionalNode": self._graph_conditional_node,
            "cuGraphExecUpdate_v2": self._graph_exec_update,
            "cuStreamGetCaptureInfo_v2": self._capture_info,
            "cuStreamGetCaptureInfo_v3": self._capture_info,
            "cuStreamBeginCaptureToGraph": self._capture_to_graph,
            "cuStreamUpdateCaptureDependencies": self._capture_dependencies,
            "cuStreamUpdateCaptureDependencies_v2": self._capture_dependencies,
            "cuTensorMapEncodeTiled": self._tensor_map,
            "cuTensorMapEncodeIm2col": self._tensor_map,
            "cuTensorMapEncodeIm2colWide": self._tensor_map,
            "cuTensorMapReplaceAddress": self._tensor_map_address,
            "cuMemPoolCreate": self._pool_create,
            "gpCallbackToken": self._callback_token,
            "gpCallbackAttach": self._callback_attach,
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
            "cuArrayCreate_v2": self._array_create,
            "cuArray3DCreate_v2": self._array_create,
            "cuMipmappedArrayCreate": self._array_create,
            "cuArrayDestroy": self._array_destroy,
            "cuMipmappedArrayDestroy": self._array_destroy,
            "cuArrayGetDescriptor_v2": self._array_descriptor,
            "cuArray3DGetDescriptor_v2": self._array_descriptor,
            "cuMipmappedArrayGetLevel": self._mipmap_level,
            "gpMemcpy3D": self._copy_3d,
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
            "cuTexObjectCreate": self._texture_object,
            "cuSurfObjectCreate": self._surface_object,
            **dict.fromkeys(
                (
                    "cuTexObjectGetResourceDesc",
                    "cuTexObjectGetTextureDesc",
                    "cuTexObjectGetResourceViewDesc",
                    "cuSurfObjectGetResourceDesc",
                ),
                self._object_descriptor,
            ),
            "cuModuleEnumerateFunctions": self._enumerate,
            "cuLibraryEnumerateKernels": self._enumerate,
            "gpWindowOffer": self._window_offer,
            "gpWindowAccept": self._window_accept,
            "cuMemGetAddressRange_v2": self._address_range,
            "cuPointerGetAttribute": self._pointer_attribute,
            "cuDevicePrimaryCtxRetain": self._primary_ctx_retain,
            "cuDeviceTotalMem_v2": self._total_mem,
            "cuMemGetInfo_v2": self._mem_get_info,
            "cuCtxSynchronize_v2": self._ctx_synchronize_v2,
            "cuStreamGetCtx_v2": self._stream_get_ctx_v2,
            "cuMemAlloc_v2": self._alloc,
            "cuCtxCreate_v2": self._ctx_create,
            "cuCtxDestroy_v2": self._ctx_destroy,
            "cuMemAllocAsync": self._alloc,
            "cuMemAllocFromPoolAsync": self._alloc,
            "cuMemFree_v2": self._free,
            "cuMemFreeAsync": self._free,
            "cuMemcpyHtoD_v2": self._htod,
            "cuMemcpyHtoDAsync_v2": self._htod,
            "cuMemcpyDtoH_v2": self._dtoh,
            "cuMemcpyDtoHAsync_v2": self._dtoh,
            "gpMemcpyDtoHAsync": self._dtoh_async,
            "gpCopiesFlush": self._copies_flush,
            "gpShmAttach": self._shm_attach,
            "gpShmHtoD": self._shm_htod,
            "gpShmDtoH": self._shm_dtoh,
            "gpPinnedShare": self._pinned_share,
            "gpPinnedCopy": self._pinned_copy,
            "gpPinnedSettle": self._pinned_settle,
            "gpPinnedDrop": self._pinned_drop,
            "gpLaneAttach": self._lane_attach,
            "gpLaneCopy": self._lane_copy,
            "gpLanePiece": self._lane_piece,
            "cuMemcpyDtoD_v2": self._dtod,
            "cuMemcpyDtoDAsync_v2": self._dtod,
            "cuMemcpyPeer": self._peer,
            "cuMemcpyPeerAsync": self._peer,
            "cuModuleGetGlobal_v2": self._get_global,
            "cuLibraryGetGlobal": self._get_global,
            "cuLaunchKernelEx": self._launch,
            "cuOccupancyMaxActiveClusters": self._cluster_occupancy,
            "cuOccupancyMaxPotentialClusterSize": self._cluster_occupancy,
        }
        for name in ("cuMemsetD8_v2", "cuMemsetD16_v2", "cuMemsetD32_v2"):
            self.special[name] = self._memset
        for name in ("cuMemsetD8Async", "cuMemsetD16Async", "cuMemsetD32Async"):
            self.special[name] = self._memset
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
        except Exception:  # a bug here must not cost the client its connection: this call fails
            log.exception("%s failed inside the worker", call.symbol if call.symbol != "-" else call.name)
            answer, result = None, CUresult.UNKNOWN
        if self.channel.bulk_left:
            self.channel.skip(self.channel.bulk_left)
        if answer is _ANSWERED:
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
        for ctx in list(self.created_contexts):  # their memory goes with them
            try:
                self.executor.set_context(0)
                self._destroy_context(ctx)
            except CudaError as exc:
                log.warning("could not destroy context 0x%x after the client left: %s", ctx, exc)
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
            except CudaError as exc:
                log.warning("could not free 0x%x after the client left: %s", a.base, exc)
            self.lease.remove(a.base)
        self._vm_close()
        self._arrays_close()
        for base in list(self.pinned):
            self._pinned_release(base)
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
                if self.lease.find(value) is None:
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

    def _check_range(self, ptr: int, count: int) -> Allocation:
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
        self._check(call, ins)
        args = list(ins)
        for p in call.wire_params:
            if p.type == "cstr":
                args.append(self.channel.read_bulk(limit=4096).rstrip(b"\0").decode())
            elif p.type == "bytes":
                args.append(self.channel.read_bulk(limit=_wire.MAX_SMALL_BULK_BYTES))
        result = getattr(self.executor, call.name)(*args)
        outs = call.outs
        if not outs:
            if call.name in _DESTROYS:
                self._note_created(call, ins, ())
            return _EMPTY
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
        gone = _DESTROYS.get(call.name)
        if gone:
            handles[gone].discard(ins[0])
            for child in self.lease.children.pop(ins[0], ()):  # a module's functions, a graph's nodes
                for kind in ("func", "kernel", "node", "graph"):
                    handles[kind].discard(child)
                self.lease.layouts.pop(child, None)

    # -- calls that need the lease's state -----------------------------------------------------------

    def _set_context(self, call: Call, ins: tuple):
        (ctx,) = ins
        self._check(call, ins)
        self.executor.set_context(ctx)
        self.ctx = ctx

    def _primary_ctx_retain(self, call: Call, ins: tuple):
        (dev,) = ins
        if not 0 <= dev < len(self.lease.limits):
            raise CudaError(CUresult.INVALID_DEVICE, "device ordinal")
        ctx = self.executor.cuDevicePrimaryCtxRetain(dev)
        self.lease.handles["ctx"].add(ctx)
        self.lease.ctx_device[ctx] = dev
        self.lease.primary_ctx[dev] = ctx
        return struct.pack("<Q", ctx), b""

    def _total_mem(self, call: Call, ins: tuple):
        (dev,) = ins
        if not 0 <= dev < len(self.lease.limits):
            raise CudaError(CUresult.INVALID_DEVICE, "device ordinal")
        real = self.executor.cuDeviceTotalMem(dev)
        return struct.pack("<Q", min(real, self.lease.limits[dev])), b""

    def _mem_get_info(self, call: Call, ins: tuple):
        dev = self._device()
        free, total = self.executor.cuMemGetInfo()
        limit = min(total, self.lease.limits[dev])
        return struct.pack("<QQ", max(0, min(free, limit - self.lease.used[dev])), limit), b""

    def _ctx_synchronize_v2(self, call: Call, ins: tuple):
        (ctx,) = ins
        self._check(call, ins)
        if ctx and ctx != self.ctx:
            self.executor.set_context(ctx)
            try:
                self.executor.cuCtxSynchronize()
            finally:
                self.executor.set_context(self.ctx)
        else:
            self.executor.cuCtxSynchronize()

    def _stream_get_ctx_v2(self, call: Call, ins: tuple):
        self._check(call, ins)
        return struct.pack("<QQ", self.executor.cuStreamGetCtx(ins[0]), 0), b""

    def _alloc(self, call: Call, ins: tuple):
        self._check(call, ins)
        size = ins[0]
        dev = self._device()
        with self.lease.lock:
            self.lease.reserve(dev, size)
            self.lease.used[dev] += size  # held while the executor allocates, so racing threads see it
        window = self.window if self._in_window(call, ins) else None
        try:
            if window is not None:
                try:
                    ptr = window.allocate(size, dev)
                except WindowFull as exc:
                    log.warning("%s: the driver allocates instead", exc)
                    window = None
            if window is None:
                ptr = getattr(self.executor, call.name)(*ins)
        finally:
            with self.lease.lock:
                self.lease.used[dev] -= size
        self.lease.add(Allocation(ptr, size, dev, owned=True, ctx=self.ctx, window=window))
        self.owned.add(ptr)
        return struct.pack("<Q", ptr), b""

    def _in_window(self, call: Call, ins: tuple) -> bool:
        """Whether this allocation comes from the client's window: all of them once it has one, but a
        stream-ordered one during a capture (the graph's memory node places it, the driver picks)."""
        if not self.window.ready:
            return False
        return call.name == "cuMemAlloc" or not self.executor.cuStreamIsCapturing(ins[-1])

    def _device_attribute(self, call: Call, ins: tuple):
        """The device's answer, but no host access to managed or pageable memory while kernels run:
        the client's mirror of managed memory is kept in step at launches and synchronisations only."""
        if ins[0] in NOT_COHERENT_ATTRIBUTES:
            self._check(call, ins)
            return struct.pack("<i", 0), b""
        return self._plain(call, ins)

    # -- graphs built node by node -------------------------------------------------------------------

    def _nodes(self, raw: bytes, count: int) -> list[int]:
        """`count` node handles of this lease from the front of `raw`."""
        if len(raw) < 8 * count:
            raise CudaError(INVALID_VALUE, "dependency array")
        nodes = list(struct.unpack_from(f"<{count}Q", raw))
        if any(n not in self.lease.handles["node"] for n in nodes):
            raise CudaError(INVALID_VALUE, "a node that is not this lease's")
        return nodes

    def _new_node(self, node: int, graph: int):
        self.lease.handles["node"].add(node)
        self.lease.children.setdefault(graph, set()).add(node)
        return struct.pack("<Q", node), b""

    def _graph_kernel_node(self, call: Call, ins: tuple):
        self._check(call, ins)
        adding = call.name == "cuGraphAddKernelNode"
        owner, func, dims = ins[0], ins[1 + (not adding)], ins[2 + (not adding) : 9 + (not adding)]
        node = None if adding else ins[1]
        num_deps = ins[-1] if adding else 0
        data = self.channel.read_bulk(limit=MAX_NODE_DEPS * 8 + (1 << 20))
        deps = self._nodes(data, num_deps)
        params = data[8 * num_deps :]
        layout = self._layout(func)
        if len(params) < max((offset + size for offset, size in layout), default=0):
            raise CudaError(INVALID_VALUE, "kernel parameters shorter than the function's parameter layout")
        is_kernel = func in self.lease.handles["kernel"]
        launch = Launch(
            func, tuple(dims[:3]), tuple(dims[3:6]), dims[6], 0, params, layout, is_kernel=is_kernel
        )
        if not adding:
            self.executor.graph_exec_kernel_node(owner, node, launch)
            return _EMPTY
        return self._new_node(self.executor.graph_add_kernel_node(owner, deps, launch), owner)

    def _graph_memset_node(self, call: Call, ins: tuple):
        """cuGraphAddMemsetNode, or cuGraphExecMemsetNodeSetParams (an instantiated graph's node anew)."""
        self._check(call, ins)
        setting = call.name == "cuGraphExecMemsetNodeSetParams"
        owner, node = ins[0], ins[1] if setting else None
        dst, pitch, value, element_size, width, height = ins[1 + setting : 7 + setting]
        if element_size not in (1, 2, 4) or height < 1:
            raise CudaError(INVALID_VALUE, "memset node shape")
        self._check_range(dst, pitch * (height - 1) + width * element_size)
        if setting:
            self.executor.graph_exec_memset_node(owner, node, dst, pitch, value, element_size, width, height)
            return _EMPTY
        deps = self._nodes(self.channel.read_bulk(limit=MAX_NODE_DEPS * 8), ins[-1])
        node = self.executor.graph_add_memset_node(
            owner, deps, dst, pitch, value, element_size, width, height
        )
        return self._new_node(node, owner)

    def _graph_empty_node(self, call: Call, ins: tuple):
        self._check(call, ins)
        graph, num_deps = ins
        deps = self._nodes(self.channel.read_bulk(limit=MAX_NODE_DEPS * 8), num_deps)
        return self._new_node(self.executor.graph_add_empty_node(graph, deps), graph)

    def _graph_dependencies(self, call: Call, ins: tuple):
        """Edges as (from, to) pairs; cuGraphAddDependencies_v2's each with its 8 bytes of edge data (from
        port, to port, type: a programmatic dependency), which the driver checks."""
        self._check(call, ins)
        graph, count = ins
        words = 3 if call.symbol == "cuGraphAddDependencies_v2" else 2
        data = self.channel.read_bulk(limit=MAX_NODE_DEPS * 8 * words)
        if len(data) != 8 * words * count:
            raise CudaError(INVALID_VALUE, "graph edges")
        triples = [data[8 * words * i : 8 * words * (i + 1)] for i in range(count)]
        nodes = self._nodes(b"".join(t[:16] for t in triples), 2 * count)
        edge_data = [t[16:24] if words == 3 else bytes(8) for t in triples]
        self.executor.graph_add_dependencies(
            graph, list(zip(nodes[::2], nodes[1::2], strict=True)), edge_data
        )

    def _graph_child_node(self, call: Call, ins: tuple):
        self._check(call, ins)
        graph, child, num_deps = ins
        deps = self._nodes(self.channel.read_bulk(limit=MAX_NODE_DEPS * 8), num_deps)
        return self._new_node(self.executor.graph_add_child_node(graph, deps, child), graph)

    def _graph_event_node(self, call: Call, ins: tuple):
        self._check(call, ins)
        graph, event, num_deps = ins
        deps = self._nodes(self.channel.read_bulk(limit=MAX_NODE_DEPS * 8), num_deps)
        node = self.executor.graph_add_event_node(graph, deps, event, call.name == "cuGraphAddEventWaitNode")
        return self._new_node(node, graph)

    def _graph_memcpy_node(self, call: Call, ins: tuple):
        """cuGraphAddMemcpyNode, or cuGraphExecMemcpyNodeSetParams (an instantiated graph's node anew)."""
        self._check(call, ins)
        setting = call.name == "cuGraphExecMemcpyNodeSetParams"
        owner = ins[0]
        copy = Copy3D(*ins[2:11] if setting else ins[1:10])
        if copy.width == 0 or copy.height == 0 or copy.depth == 0:
            raise CudaError(INVALID_VALUE, "memcpy node extent")
        if copy.height > 1 and (copy.src_pitch < copy.width or copy.dst_pitch < copy.width):
            raise CudaError(INVALID_VALUE, "memcpy node pitch")
        self._check_range(copy.src, copy.span(copy.src_pitch, copy.src_height))
        self._check_range(copy.dst, copy.span(copy.dst_pitch, copy.dst_height))
        if setting:
            self.executor.graph_exec_memcpy_node(owner, ins[1], copy)
            return _EMPTY
        deps = self._nodes(self.channel.read_bulk(limit=MAX_NODE_DEPS * 8), ins[-1])
        return self._new_node(self.executor.graph_add_memcpy_node(owner, deps, copy), owner)

    def _graph_host_node(self, call: Call, ins: tuple):
        """A host node: the program's function `ident` (kept by its shim), called back at every launch."""
        self._check(call, ins)
        graph, ident, num_deps = ins
        deps = self._nodes(self.channel.read_bulk(limit=MAX_NODE_DEPS * 8), num_deps)
        callbacks = self.callbacks
        if callbacks is None:
            raise CudaError(CUresult.NOT_SUPPORTED, "no callback connection")
        return self._new_node(
            self.executor.graph_add_host_node(graph, deps, lambda: callbacks.call(ident)), graph
        )

    def _graph_nodes(self, call: Call, ins: tuple):
        """The count; the nodes (now this lease's) in the bulk."""
        self._check(call, ins)
        nodes = self.executor.graph_nodes(ins[0])
        self.lease.handles["node"].update(nodes)
        self.lease.children.setdefault(ins[0], set()).update(nodes)
        return call.out_struct.pack(len(nodes)), struct.pack(f"<{len(nodes)}Q", *nodes)

    def _graph_node_list(self, call: Call, ins: tuple):
        """A graph's root nodes, or a node's dependencies or dependents: the count; the nodes in the bulk,
        then (the _v2 calls) each edge's 8 bytes of data."""
        self._check(call, ins)
        nodes, edge_data = self.executor.graph_node_list(call.name, ins[0])
        self.lease.handles["node"].update(nodes)
        bulk = struct.pack(f"<{len(nodes)}Q", *nodes)
        if call.symbol.endswith("_v2"):
            bulk += b"".join(edge_data)
        return call.out_struct.pack(len(nodes)), bulk

    def _graph_edges(self, call: Call, ins: tuple):
        """The count; the (from, to) pairs in the bulk."""
        self._check(call, ins)
        edges = self.executor.graph_edges(ins[0])
        flat = [n for edge in edges for n in edge]
        self.lease.handles["node"].update(flat)
        return call.out_struct.pack(len(edges)), struct.pack(f"<{len(flat)}Q", *flat)

    def _graph_conditional_node(self, call: Call, ins: tuple):
        """A conditional node; its body graphs (the driver's, owned by the node's graph) become this
        lease's graphs, sent after the node's handle."""
        self._check(call, ins)
        graph, handle, kind, size, ctx, num_deps = ins
        if not 1 <= size <= MAX_CONDITIONAL_BODIES:
            raise CudaError(INVALID_VALUE, "conditional node size")
        deps = self._nodes(self.channel.read_bulk(limit=MAX_NODE_DEPS * 8), num_deps)
        node, bodies = self.executor.graph_add_conditional_node(graph, deps, handle, kind, size, ctx)
        self.lease.handles["graph"].update(bodies)
        self.lease.children.setdefault(graph, set()).update(bodies)
        out, _ = self._new_node(node, graph)
        return out, struct.pack(f"<{len(bodies)}Q", *bodies)

    def _graph_exec_update(self, call: Call, ins: tuple):
        """The update's result and status both travel: a refused update says why (its result)."""
        self._check(call, ins)
        result, status = self.executor.graph_exec_update(*ins)
        return call.out_struct.pack(result, status), b""

    def _capture_info(self, call: Call, ins: tuple):
        """Status, id, graph and the count; the dependency nodes (now this lease's) in the bulk."""
        self._check(call, ins)
        status, capture_id, graph, deps = self.executor.capture_info(ins[0])
        self.lease.handles["node"].update(deps)
        if graph:  # the graph being captured: nodes may be added to it (the one cuStreamEndCapture gives)
            self.lease.handles["graph"].add(graph)
            self.lease.children.setdefault(graph, set()).update(deps)
        return call.out_struct.pack(status, capture_id, graph, len(deps)), struct.pack(
            f"<{len(deps)}Q", *deps
        )

    def _capture_to_graph(self, call: Call, ins: tuple):
        self._check(call, ins)
        stream, graph, num_deps, mode = ins
        deps = self._nodes(self.channel.read_bulk(limit=MAX_NODE_DEPS * 8), num_deps)
        self.executor.capture_to_graph(stream, graph, deps, mode)
        return _EMPTY

    def _capture_dependencies(self, call: Call, ins: tuple):
        self._check(call, ins)
        stream, num_deps, flags = ins
        deps = self._nodes(self.channel.read_bulk(limit=MAX_NODE_DEPS * 8), num_deps)
        self.executor.update_capture_dependencies(stream, deps, flags)
        return _EMPTY

    # -- CUDA arrays, copies in rows and slices, textures and surfaces --------------------------------

    def _array_create(self, call: Call, ins: tuple):
        """cuArrayCreate / cuArray3DCreate / cuMipmappedArrayCreate: counted against the partition (a
        mipmapped array at twice its first level, more than its levels take)."""
        raw = self.channel.read_bulk(limit=64)
        shape = ArrayShape.from_2d(raw) if call.name == "cuArrayCreate" else ArrayShape.from_3d(raw)
        mipmapped = call.name == "cuMipmappedArrayCreate"
        size, device = shape.nbytes * (2 if mipmapped else 1), self._device()
        with self.lease.lock:
            self.lease.reserve(device, size)
            self.lease.used[device] += size
        try:
            if mipmapped:
                handle = self.executor.cuMipmappedArrayCreate(shape, ins[0])
            else:
                handle = self.executor.cuArray3DCreate(shape)
        except BaseException:
            with self.lease.lock:
                self.lease.used[device] -= size
            raise
        kind = "mipmap" if mipmapped else "array"
        self.lease.handles[kind].add(handle)
        self.arrays[handle] = (kind, size, device, self.ctx)
        return struct.pack("<Q", handle), b""

    def _array_destroy(self, call: Call, ins: tuple):
        self._check(call, ins)
        (handle,) = ins
        if handle not in self.arrays:
            raise CudaError(INVALID_VALUE, "not an array this process created")  # a mipmap's level, say
        kind, size, device, _ = self.arrays[handle]
        getattr(self.executor, call.name)(handle)
        del self.arrays[handle]
        self.lease.handles[kind].discard(handle)
        for level in self.lease.children.pop(handle, ()):
            self.lease.handles["array"].discard(level)
        with self.lease.lock:
            self.lease.used[device] -= size

    def _array_descriptor(self, call: Call, ins: tuple):
        self._check(call, ins)
        shape = self.executor.cuArray3DGetDescriptor(ins[0])
        return b"", shape.pack_2d() if call.name == "cuArrayGetDescriptor" else shape.pack_3d()

    def _mipmap_level(self, call: Call, ins: tuple):
        self._check(call, ins)
        handle, level = ins
        array = self.executor.cuMipmappedArrayGetLevel(handle, level)
        self.lease.handles["array"].add(array)
        self.lease.children.setdefault(handle, set()).add(array)
        return struct.pack("<Q", array), b""

    def _arrays_close(self) -> None:
        """The client is gone: destroy the arrays it left, in the contexts they were made in."""
        for handle, (kind, _size, _device, ctx) in list(self.arrays.items()):
            try:
                self.executor.set_context(ctx)
                self._array_destroy(CALL_OF[kind], (handle,))
            except CudaError as exc:
                log.warning("could not destroy the client's %s 0x%x: %s", kind, handle, exc)

    def _copy_side(self, side: CopySide, width: int, height: int, depth: int) -> None:
        """Host rows come packed; device rows must lie in the lease's memory; an array must be the lease's
        (its driver refuses rows outside it)."""
        if side.kind == HOST:
            if (side.x, side.y, side.z, side.pitch, side.height) != (0, 0, 0, width, height):
                raise CudaError(INVALID_VALUE, "host rows travel packed")
        elif side.kind == DEVICE:
            rows = side.height if depth > 1 or side.z else height
            if ((height > 1 or depth > 1) and side.pitch < width) or (depth > 1 and rows < height):
                raise CudaError(INVALID_VALUE, "a pitch shorter than a row, or a slice shorter than the copy")
            start = side.at + (side.z * rows + side.y) * side.pitch + side.x
            self._check_range(start, (depth - 1) * rows * side.pitch + (height - 1) * side.pitch + width)
        elif side.kind == ARRAY:
            if side.at not in self.lease.handles["array"]:
                raise CudaError(INVALID_HANDLE, "array")
        else:
            raise CudaError(INVALID_VALUE, f"memory type {side.kind}")

    def _copy_3d(self, call: Call, ins: tuple):
        """gpMemcpy3D: a host source's rows from the request, a host destination's into the reply."""
        self._check(call, ins)
        kinds, *sides, width, height, depth, stream, flags = ins
        src = CopySide(kinds & 0xFF, *sides[:6])
        dst = CopySide(kinds >> 8, *sides[6:])
        if not width or not height or not depth:
            raise CudaError(INVALID_VALUE, "an empty copy")
        for side in (src, dst):
            self._copy_side(side, width, height, depth)
        packed = width * height * depth
        data = None
        if src.kind == HOST:
            data = self.channel.read_bulk(limit=_wire.MAX_SMALL_BULK_BYTES)
            if len(data) != packed:
                raise CudaError(INVALID_VALUE, "the host rows' bytes")
        elif dst.kind == HOST and packed > _wire.MAX_SMALL_BULK_BYTES:
            raise CudaError(INVALID_VALUE, "a copy to the host of more than the reply can carry")
        out = self.executor.copy_3d(src, dst, (width, height, depth), stream if flags & 1 else None, data)
        return b"", bytes(out) if dst.kind == HOST else b""

    def _resource(self, raw: bytes) -> None:
        """What a resource descriptor names must be the lease's: an array, a mipmapped array, memory."""
        named = resource(raw)
        if named.kind in (0, 1):
            if named.handle not in self.lease.handles["array" if named.kind == 0 else "mipmap"]:
                raise CudaError(INVALID_HANDLE, "the resource's array")
        else:
            self._check_range(named.handle, named.size)

    def _texture_object(self, call: Call, ins: tuple):
        """cuTexObjectCreate: the resource, texture and (optional) view descriptors, one after another."""
        raw = self.channel.read_bulk(limit=RESOURCE_DESC_BYTES + TEXTURE_DESC_BYTES + VIEW_DESC_BYTES)
        texture_at, view_at = RESOURCE_DESC_BYTES, RESOURCE_DESC_BYTES + TEXTURE_DESC_BYTES
        if len(raw) not in (view_at, view_at + VIEW_DESC_BYTES):
            raise CudaError(INVALID_VALUE, "texture descriptors")
        self._resource(raw[:texture_at])
        tex = self.executor.cuTexObjectCreate(
            raw[:texture_at], raw[texture_at:view_at], raw[view_at:] or None
        )
        self.lease.handles["texobj"].add(tex)
        return struct.pack("<Q", tex), b""

    def _surface_object(self, call: Call, ins: tuple):
        raw = self.channel.read_bulk(limit=RESOURCE_DESC_BYTES)
        if resource(raw).kind != 0:
            raise CudaError(INVALID_VALUE, "a surface is made over an array")
        self._resource(raw)
        surf = self.executor.cuSurfObjectCreate(raw)
        self.lease.handles["surfobj"].add(surf)
        return struct.pack("<Q", surf), b""

    def _stream_value(self, call: Call, ins: tuple):
        """cuStreamWaitValue32/64, cuStreamWriteValue32/64: the whole word must be the lease's memory."""
        self._check(call, ins)
        stream, addr, value, flags = ins
        self._check_range(addr, 8 if call.name.endswith("64") else 4)
        getattr(self.executor, call.name)(stream, addr, value, flags)

    def _object_descriptor(self, call: Call, ins: tuple):
        """A texture's or surface's descriptor, as the executor's driver gives it, in the reply's bulk."""
        self._check(call, ins)
        return b"", bytes(getattr(self.executor, call.name)(ins[0]))

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
        return _EMPTY

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

    # -- tensor maps -----------------------------------------------------------------------------------

    def _tensor_map(self, call: Call, ins: tuple):
        """cuTensorMapEncodeTiled / Im2col / Im2colWide: the shape arrays from the bulk; the whole tensor
        (its dimensions and strides from its address) must be memory of this lease; the 128 bytes go
        back as bulk, and the tensor's extent is kept for cuTensorMapReplaceAddress."""
        self._check(call, ins)
        dtype, rank, address = ins[:3]
        if not 1 <= rank <= TENSOR_RANK_MAX:
            raise CudaError(INVALID_VALUE, "tensor rank")
        raw = self.channel.read_bulk(limit=TENSOR_RANK_MAX * 24)
        arrays, at = [], 0
        for offset, code in TENSOR_SHAPE_ARRAYS[call.name]:
            n = max(rank + offset, 0)
            if at + n * struct.calcsize(code) > len(raw):
                raise CudaError(INVALID_VALUE, "tensor shape arrays")
            arrays.append(list(struct.unpack_from(f"<{n}{code}", raw, at)))
            at += n * struct.calcsize(code)
        extent = tensor_extent(dtype, arrays[0], arrays[1])
        self._check_range(address, extent)
        encoded = self.executor.tensor_map(call.name, ins, arrays)
        self._keep_tensor_map(encoded, extent)
        return b"", encoded

    def _tensor_map_address(self, call: Call, ins: tuple):
        """cuTensorMapReplaceAddress: a map this lease encoded, its tensor moved to other lease memory."""
        self._check(call, ins)
        encoded = bytes(self.channel.read_bulk(limit=TENSOR_MAP_BYTES))
        if len(encoded) != TENSOR_MAP_BYTES:
            raise CudaError(INVALID_VALUE, "a tensor map is 128 bytes")
        extent = self.lease.tensor_maps.get(encoded)
        if extent is None:
            raise CudaError(INVALID_VALUE, "not a tensor map this lease encoded")
        self._check_range(ins[0], extent)
        replaced = self.executor.tensor_map_address(encoded, ins[0])
        self._keep_tensor_map(replaced, extent)
        return b"", replaced

    def _keep_tensor_map(self, encoded: bytes, extent: int) -> None:
        maps = self.lease.tensor_maps
        with self.lease.lock:
            maps[bytes(encoded)] = extent
            while len(maps) > TENSOR_MAPS_KEPT:  # the oldest first (dicts keep insertion order)
                del maps[next(iter(maps))]

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
        if not size or size % GRANULE:
            raise CudaError(INVALID_VALUE, "size must be a multiple of the granularity (2 MiB)")
        with self.lease.lock:
            self.lease.reserve(device, size)
            self.lease.used[device] += size
        try:
            handle = self.executor.cuMemCreate(size, device, handle_types)
        except BaseException:
            with self.lease.lock:
                self.lease.used[device] -= size
            raise
        self.vm_handles[handle] = (size, device)
        self.vm_props[handle] = bytes(prop)
        self.lease.handles["vmem"].add(handle)
        return struct.pack("<Q", handle), b""

    def _vm_release(self, call: Call, ins: tuple):
        (handle,) = ins
        if handle not in self.vm_handles:
            raise CudaError(INVALID_VALUE, "not memory this process created")
        self.executor.cuMemRelease(handle)
        if self.vm_references.get(handle):  # a retained reference: the memory has another holder
            self.vm_references[handle] -= 1
            return
        size, device = self.vm_handles.pop(handle)
        self.lease.handles["vmem"].discard(handle)
        with self.lease.lock:
            self.lease.used[device] -= size

    def _vm_map(self, call: Call, ins: tuple):
        ptr, size, offset, handle, flags = ins
        if handle not in self.vm_handles or offset + size > self.vm_handles[handle][0]:
            raise CudaError(INVALID_VALUE, "not memory this process created, or past its end")
        self._vm_inside(ptr, size)
        self.executor.cuMemMap(ptr, size, offset, handle, flags)
        self.vm_mapped[ptr] = size
        self.vm_mapping_of[ptr] = (handle, *self.vm_handles[handle])

    def _vm_unmap(self, call: Call, ins: tuple):
        ptr, size = ins
        inside = [m for m, n in self.vm_mapped.items() if ptr <= m and m + n <= ptr + size]
        if not inside or sum(self.vm_mapped[m] for m in inside) != size:
            raise CudaError(INVALID_VALUE, f"[0x{ptr:x}, +{size}) is not whole mappings of this process")
        self.executor.cuMemUnmap(ptr, size)
        for m in inside:
            del self.vm_mapped[m]
            self.vm_mapping_of.pop(m, None)

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
        else:  # its creator's reference was released: this one holds the memory now
            _, size, device = self.vm_mapping_of[mapped]
            self.vm_handles[handle] = (size, device)
            self.lease.handles["vmem"].add(handle)
            with self.lease.lock:
                self.lease.used[device] += size
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
        device, _ = self._vm_device(self.channel.read_bulk(limit=ALLOCATION_PROP_BYTES))
        return struct.pack("<Q", self.executor.cuMemGetAllocationGranularity(device, option)), b""

    def _vm_close(self) -> None:
        """The client is gone: unmap, release and free what it left of the virtual memory API."""
        try:
            if self.vm_mapped:
                self.executor.cuCtxSynchronize()
            for ptr, size in list(self.vm_mapped.items()):
                self.executor.cuMemUnmap(ptr, size)
                del self.vm_mapped[ptr]
            for handle in list(self.vm_handles):
                while handle in self.vm_handles:  # every reference, retained ones too
                    self._vm_release(None, (handle,))
            for base, size in list(self.vm_ranges.items()):
                self._vm_address_free(None, (base, size))
        except CudaError as exc:
            log.warning("could not release the client's mapped memory: %s", exc)

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
                POINTER_DEVICE_ORDINAL: a.device,
                POINTER_LEGACY_IPC: 1,
                POINTER_RANGE_START: a.base,
                POINTER_RANGE_SIZE: a.size,
                POINTER_MEMPOOL: 0,
            }[attr]
        else:
            value = self.executor.cuPointerGetAttribute(attr, ptr)
        return struct.pack("<Q", value), b""

    def _ctx_create(self, call: Call, ins: tuple):
        flags, dev = ins
        if not 0 <= dev < len(self.lease.limits):
            raise CudaError(CUresult.INVALID_DEVICE, "device ordinal")
        ctx = self.executor.cuCtxCreate(flags, dev)
        self.lease.handles["ctx"].add(ctx)
        self.lease.ctx_device[ctx] = dev
        self.created_contexts.add(ctx)
        return struct.pack("<Q", ctx), b""

    def _ctx_destroy(self, call: Call, ins: tuple):
        (ctx,) = ins
        if ctx not in self.created_contexts:  # a primary context, another process's, or none
            raise CudaError(INVALID_CONTEXT, "not a context this process created")
        self._destroy_context(ctx)

    def _destroy_context(self, ctx: int) -> None:
        """As the driver does: the context's memory goes with it, and comes back to the quota."""
        self.executor.cuCtxDestroy(ctx)
        self.created_contexts.discard(ctx)
        self.lease.handles["ctx"].discard(ctx)
        self.lease.ctx_device.pop(ctx, None)
        for base in [b for b in self.owned if getattr(self.lease.allocations.get(b), "ctx", None) == ctx]:
            a = self.lease.remove(base)
            if a is not None and a.window is not None:  # mapped memory outlives contexts: unmap it here
                a.window.free(base, wait=False)
            self.owned.discard(base)
        if self.ctx == ctx:
            self.ctx = 0

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

    def _capturing(self, call: Call, stream: int) -> bool:
        """A copy between the client's memory and the GPU on a stream being captured cannot become a
        graph node (the worker cannot read or write the client's memory when the graph is launched):
        the capture is spoiled, and cuStreamEndCapture says so, as the driver does after a call that
        a capture does not allow. Never a copy done once at capture time and missing from the replays."""
        if not call.name.endswith("Async") or not self.executor.cuStreamIsCapturing(stream):
            return False
        self.spoiled_captures.add(stream)
        log.warning(
            "%s during a stream capture: copies from or to the client's memory cannot be captured; "
            "the capture fails at cuStreamEndCapture (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)",
            call.symbol,
        )
        return True

    def _end_capture(self, call: Call, ins: tuple):
        answer = self._plain(call, ins)
        if ins[0] in self.spoiled_captures:
            self.spoiled_captures.discard(ins[0])
            (graph,) = struct.unpack("<Q", answer[0])
            self.executor.cuGraphDestroy(graph)
            self.lease.handles["graph"].discard(graph)
            raise CudaError(CUresult.STREAM_CAPTURE_INVALIDATED, "a copy from or to the client's memory")
        return answer

    def _htod(self, call: Call, ins: tuple):
        dst, count, stream = ins
        self._check(call, ins)
        if count != self.channel.bulk_left:
            raise CudaError(INVALID_VALUE, "copy size and data differ")
        self._check_range(dst, count)
        if self._capturing(call, stream):
            return _EMPTY  # the bytes are skipped
        channel = self.channel

        def fill(view: memoryview) -> None:
            channel.read_into(view)
            channel.bulk_left -= len(view)

        self.executor.copy_to_device(dst, count, stream if call.name.endswith("Async") else None, fill)

    def _dtoh(self, call: Call, ins: tuple):
        src, count, stream = ins
        self._check(call, ins)
        self._check_range(src, count)
        if self._capturing(call, stream):
            raise CudaError(CUresult.STREAM_CAPTURE_UNSUPPORTED, "a copy to the client's memory")
        if count == 0:
            return _EMPTY
        sent = 0

        def send(view: memoryview) -> None:
            nonlocal sent
            if sent == 0:  # the first chunk is in: the call has worked so far, answer with the header
                result, self.pending = (self.pending, 0) if call.sync_point else (0, self.pending)
                self._send_kernel_output()
                self._announce_copies()
                self.channel.send(_wire.REPLY.pack(result, 0, count), view)
            else:
                self.channel.send(view)
            sent += len(view)

        try:
            self.executor.copy_from_device(src, count, stream if call.name.endswith("Async") else None, send)
        except CudaError as exc:
            if sent == 0:
                raise  # nothing sent yet: the reply carries the error
            self.pending = self.pending or exc.code  # the header is out: send the length promised
            while sent < count:
                send(memoryview(bytes(min(count - sent, _wire.CHUNK_BYTES))))
        return _ANSWERED

    # -- copies through memory the client maps too (a process on this host) ------------------------

    def _shm_attach(self, call: Call, ins: tuple):
        if not self.channel.local:
            raise CudaError(CUresult.NOT_SUPPORTED, "shared memory is for a process on this host")
        if self.shared is None:
            self.shared = self.executor.shared_host_memory(SHARED_COPY_BYTES)
        outs = call.out_struct.pack(self.shared.size)
        self._announce_copies()
        self.channel.send_with_fd(self.shared.fd, _wire.REPLY.pack(0, len(outs), 0), outs)
        return _ANSWERED

    def _pinned_share(self, call: Call, ins: tuple):
        """The client's new page-locked allocation at `base`: memory of the worker's, pinned, that the
        client maps there (its descriptor with the answer), so copies go straight into and out of it."""
        base, size = ins
        if not self.channel.local:
            raise CudaError(CUresult.NOT_SUPPORTED, "shared memory is for a process on this host")
        if not size or size > PINNED_SHARE_MAX or base in self.pinned:
            raise CudaError(INVALID_VALUE, "not a new allocation of a size the worker shares")
        shared = self.executor.shared_host_memory(size)
        self.pinned[base] = shared
        self._announce_copies()
        self.channel.send_with_fd(shared.fd, _wire.REPLY.pack(0, 0, 0))
        return _ANSWERED

    def _pinned_at(self, host: int, count: int) -> tuple[int, SharedHostMemory]:
        for base, shared in self.pinned.items():
            if base <= host and host + count <= base + shared.size:
                return base, shared
        raise CudaError(
            INVALID_VALUE, f"[0x{host:x}, +{count}) is not page-locked memory shared with the worker"
        )

    def _pinned_copy(self, call: Call, ins: tuple):
        """A copy between the lease's memory and the client's shared page-locked memory, by the worker's
        DMA on the client's stream: nothing more to send; the stream orders it, as natively."""
        device, host, count, stream, flags = ins
        to_device, synchronous = flags & 1, flags & 2
        self._check(call, ins)
        self._check_range(device, count)
        base, shared = self._pinned_at(host, count)
        if not synchronous and self._capturing(_HTOD_ASYNC if to_device else _DTOH_ASYNC, stream):
            raise CudaError(CUresult.STREAM_CAPTURE_UNSUPPORTED, "a copy with the client's memory")
        on = None if synchronous else stream
        if to_device:
            self.executor.copy_in_from(device, shared, host - base, count, on, bool(synchronous))
            return _EMPTY
        landing = self.pinned_landing.setdefault(base, [])
        landing[:] = [c for c in landing if not c.ready()]
        landing.append(self.executor.copy_out_into(shared, host - base, device, count, on))
        return _EMPTY

    def _pinned_settle(self, call: Call, ins: tuple):
        """Answered once every copy into the client's shared memory at [host, +count) has landed."""
        host, count = ins
        for base, shared in self.pinned.items():
            if base < host + count and host < base + shared.size:
                for copy in self.pinned_landing.pop(base, []):
                    copy.wait()
        return _EMPTY

    def _pinned_drop(self, call: Call, ins: tuple):
        (base,) = ins
        if base not in self.pinned:
            raise CudaError(INVALID_VALUE, "not page-locked memory shared with the worker")
        self._pinned_release(base)
        return _EMPTY

    def _pinned_release(self, base: int) -> None:
        for copy in self.pinned_landing.pop(base, []):  # no DMA into memory that goes
            copy.wait()
        try:
            self.executor.release_shared_host_memory(self.pinned.pop(base))
        except (CudaError, OSError) as exc:
            log.warning("could not release page-locked memory shared with the client: %s", exc)

    def _shm_htod(self, call: Call, ins: tuple):
        """One piece of a copy to the device; the last piece is answered with the first error of all."""
        dst, count, stream, offset, flags = ins
        last, is_async = flags & 1, flags & 2
        try:
            self._check(call, ins)
            self._check_range(dst, count)
            if self.shared is None or offset + count > self.shared.size:
                raise CudaError(INVALID_VALUE, "not in the shared memory")
            if not self.shared_error and not (is_async and self._capturing(_HTOD_ASYNC, stream)):
                self.executor.copy_in_from(
                    dst, self.shared, offset, count, stream if is_async else None, bool(last)
                )
        except CudaError as exc:
            self.shared_error = self.shared_error or exc.code
        if last:
            result, self.shared_error = self.shared_error, 0
            self._answer(True, _EMPTY, result)
        return _ANSWERED

    def _shm_dtoh(self, call: Call, ins: tuple):
        """A copy to the client: answered once per `chunk` bytes as each is in the shared memory."""
        src, count, stream, flags, chunk = ins
        is_async = flags & 2
        self._check(call, ins)
        self._check_range(src, count)
        if self.shared is None or count > self.shared.size or not chunk:
            raise CudaError(INVALID_VALUE, "not in the shared memory")
        if is_async and self._capturing(_DTOH_ASYNC, stream):
            raise CudaError(CUresult.STREAM_CAPTURE_UNSUPPORTED, "a copy to the client's memory")
        if not is_async and self.pending:  # a synchronous copy reports the earlier asynchronous error
            result, self.pending = self.pending, 0
            raise CudaError(result, "an earlier asynchronous error")
        answered = False

        def ready(offset: int, n: int) -> None:
            nonlocal answered
            if not answered:
                self._send_kernel_output()
                self._announce_copies()
                answered = True
            outs = call.out_struct.pack(offset, n)
            self.channel.send(_wire.REPLY.pack(0, len(outs), 0), outs)

        try:
            self.executor.copy_out_to(self.shared, src, count, stream if is_async else None, chunk, ready)
        except CudaError as exc:
            self._answer(True, None, exc.code)
        return _ANSWERED

    # -- copies striped across the process's connections (virtualize/_lanes.py) ----------------------

    def _lane_attach(self, call: Call, ins: tuple):
        with self.lease.lock:
            owner = self.lease.callback_tokens.get(ins[0])
            if owner is None:
                raise CudaError(INVALID_VALUE, "not a connection of this lease")
            if owner.lanes is None:
                owner.lanes = Lanes()
            owner.lanes.attached += 1
        self.lane_of = owner

    def _lane_copy(self, call: Call, ins: tuple):
        """Checked like any copy, in order; answered (or its error kept) once every piece is done."""
        device, count, stream, flags, pieces, ident = ins
        to_device, is_async = bool(flags & 1), bool(flags & 2)
        lanes = self.lanes
        if lanes is None or lanes.lost:
            raise CudaError(INVALID_VALUE, "this connection has no lanes")
        allowed, error = True, 0
        try:
            self._check(call, ins)
            self._check_range(device, count)
            if not 0 < pieces <= MAX_LANE_PIECES:
                raise CudaError(INVALID_VALUE, "pieces")
            if is_async and self._capturing(_HTOD_ASYNC if to_device else _DTOH_ASYNC, stream):
                if not to_device:
                    raise CudaError(CUresult.STREAM_CAPTURE_UNSUPPORTED, "a copy to the client's memory")
                allowed = False  # the capture is spoiled; the bytes are consumed
            if not to_device and not is_async and self.pending:  # the earlier asynchronous error first
                result, self.pending = self.pending, 0
                raise CudaError(result, "an earlier asynchronous error")
        except CudaError as exc:
            allowed, error = False, exc.code
        where = {"device": device, "count": count, "stream": stream if is_async else None, "ctx": self.ctx}
        lanes.release(ident, pieces, allowed, error, to_device=to_device, **where)
        copy = lanes.wait_done(ident)
        if not to_device:
            self._send_kernel_output()  # a copy to the host is a synchronising call
        if copy.error:
            raise CudaError(copy.error, "a striped copy")
        return _EMPTY

    def _lane_piece(self, call: Call, ins: tuple):
        ident, offset, count = ins
        owner = self.lane_of
        if owner is None or owner.lanes is None:
            raise CudaError(INVALID_VALUE, "not a lane")
        copy = owner.lanes.piece(ident)
        if copy is None:
            raise CudaError(CUresult.DEVICE_UNAVAILABLE, "the copy was never checked")
        error = 0
        try:
            if offset + count > copy.count or (copy.to_device and count != self.channel.bulk_left):
                raise CudaError(INVALID_VALUE, "a piece outside its copy")
            if not copy.allowed:
                if copy.to_device:
                    return _EMPTY  # refused or spoiled: its bytes are consumed, nothing is written
                raise CudaError(copy.error or INVALID_VALUE, "the copy was refused")
            if self.ctx != copy.ctx:  # the copy runs in its connection's context
                self.executor.set_context(copy.ctx)
                self.ctx = copy.ctx
            if copy.to_device:
                channel = self.channel

                def fill(view: memoryview) -> None:
                    channel.read_into(view)
                    channel.bulk_left -= len(view)

                self.executor.copy_to_device(copy.device + offset, count, copy.stream, fill)
                return _EMPTY
            error = self._lane_send(copy.device + offset, count, copy.stream)
            return _ANSWERED
        except CudaError as exc:
            error = exc.code
            raise
        finally:
            owner.lanes.piece_done(copy, error)

    def _lane_send(self, src: int, count: int, stream: int | None) -> int:
        """A piece to the host: the reply header once its first chunk is in, then the bytes. Raises if
        it fails before anything is sent (the reply says so); later, the bytes promised are sent and the
        error returned (the copy's answer says so)."""
        sent = 0

        def send(view: memoryview) -> None:
            nonlocal sent
            if sent == 0:
                self.channel.send(_wire.REPLY.pack(0, 0, count), view)
            else:
                self.channel.send(view)
            sent += len(view)

        try:
            self.executor.copy_from_device(src, count, stream, send)
        except CudaError as exc:
            if sent == 0:
                raise
            while sent < count:
                send(memoryview(bytes(min(count - sent, _wire.CHUNK_BYTES))))
            return exc.code
        return 0

    def _dtoh_async(self, call: Call, ins: tuple):
        """gpMemcpyDtoHAsync: queued behind its stream; its bytes (or its error) go to the client later."""
        src, count, stream, ident = ins
        callbacks = self.callbacks
        if callbacks is None:  # the shim starts the callback connection first
            raise CudaError(CUresult.NOT_SUPPORTED, "no callback connection")
        try:
            self._check(call, ins)
            self._check_range(src, count)
            if self._capturing(call, stream):
                raise CudaError(CUresult.STREAM_CAPTURE_UNSUPPORTED, "a copy to the client's memory")
            staged = self.executor.copy_from_device_async(src, count, stream)
        except Exception as exc:  # the client stops waiting for it either way
            callbacks.deliveries.failed(ident, getattr(exc, "code", CUresult.UNKNOWN))
            raise  # and kept for the next synchronising call, as an asynchronous error is
        callbacks.deliveries.add(ident, staged)

    def _copies_flush(self, call: Call, ins: tuple):
        """Every copy done by now reaches the client before this answer (`wait`: every copy queued)."""
        self._announce_copies(wait=bool(ins[0]))

    def _dtod(self, call: Call, ins: tuple):
        self._check(call, ins)
        dst, src, count = ins[:3]
        self._check_range(dst, count)
        self._check_range(src, count)
        getattr(self.executor, call.name)(*ins)

    def _peer(self, call: Call, ins: tuple):
        self._check(call, ins)
        dst, _dst_ctx, src, _src_ctx, count = ins[:5]
        self._check_range(dst, count)
        self._check_range(src, count)
        getattr(self.executor, call.name)(*ins)

    def _memset(self, call: Call, ins: tuple):
        self._check(call, ins)
        dst, value, count = ins[:3]
        width = MEMSET_WIDTH[call.name.removesuffix("Async")]
        self._check_range(dst, count * width)
        self.executor.memset(dst, value, width, count, ins[3] if len(ins) > 3 else None)

    def _get_global(self, call: Call, ins: tuple):
        answer = self._plain(call, ins)
        ptr, size = struct.unpack("<QQ", answer[0])
        dev = self.lease.ctx_device.get(self.ctx, 0)
        if self.lease.find(ptr) is None:
            self.lease.add(Allocation(ptr, size, dev, owned=False))
        return answer

    def _layout(self, func: int) -> list[tuple[int, int]]:
        layout = self.lease.layouts.get(func)
        if layout is None:
            layout = self.executor.param_layout(func, func in self.lease.handles["kernel"])
            self.lease.layouts[func] = layout
        return layout

    def _param_layout(self, call: Call, ins: tuple):
        self._check(call, ins)
        layout = self._layout(ins[0])
        flat = [x for pair in layout for x in pair]
        return struct.pack("<I", len(layout)), struct.pack(f"<{len(flat)}I", *flat)

    def _link_image(self, call: Call, ins: tuple):
        self._check(call, ins)
        return b"", self.executor.gpLinkImage(*ins)  # the bytes as they are (not a NUL-padded string)

    def _check_launch(self, func: int, stream: int) -> None:
        handles = self.lease.handles
        if func not in handles["func"] and func not in handles["kernel"]:
            raise CudaError(INVALID_HANDLE, "function")
        if stream not in BUILTIN_STREAMS and stream not in handles["stream"]:
            raise CudaError(INVALID_HANDLE, "stream")

    @staticmethod
    def _attributes(raw: bytes) -> list[tuple[int, bytes]]:
        return [
            (struct.unpack_from("<i", raw, i)[0], raw[i + 8 : i + LAUNCH_ATTRIBUTE_BYTES])
            for i in range(0, len(raw) - LAUNCH_ATTRIBUTE_BYTES + 1, LAUNCH_ATTRIBUTE_BYTES)
        ]

    def _cluster_occupancy(self, call: Call, ins: tuple):
        func, gx, gy, gz, bx, by, bz, smem, stream, n_attrs = ins
        self._check_launch(func, stream)
        raw = self.channel.read_bulk(limit=64 * LAUNCH_ATTRIBUTE_BYTES)
        if len(raw) != n_attrs * LAUNCH_ATTRIBUTE_BYTES:
            raise CudaError(INVALID_VALUE, "launch attributes")
        config = Launch(func, (gx, gy, gz), (bx, by, bz), smem, stream, b"", [], tuple(self._attributes(raw)))
        return struct.pack("<i", self.executor.cluster_occupancy(call.name, config)), b""

    def _launch(self, call: Call, ins: tuple):
        func, gx, gy, gz, bx, by, bz, smem, stream = ins[:9]
        self._check_launch(func, stream)
        n_attrs = ins[9] if len(ins) > 9 else 0
        bulk = self.channel.read_bulk(limit=1 << 20)
        layout = self.lease.layouts.get(func)
        if layout is None:
            layout = self._layout(func)
        split = len(bulk) - n_attrs * LAUNCH_ATTRIBUTE_BYTES
        if split < 0:
            raise CudaError(INVALID_VALUE, "launch attributes")
        params, raw = bulk[:split], bulk[split:]
        if len(params) < max((offset + size for offset, size in layout), default=0):
            raise CudaError(INVALID_VALUE, "kernel parameters shorter than the function's parameter layout")
        attributes = tuple(self._attributes(raw))
        self.executor.launch(
            Launch(func, (gx, gy, gz), (bx, by, bz), smem, stream, params, layout, attributes)
        )
        if self.lease.native is not None:  # checked and launched once: the native loop may launch it now
            self.lease.native.learn(func, layout)
        return None


_ANSWERED = object()  # a handler that streamed its own reply
MAX_LANE_PIECES = 64
_HTOD_ASYNC = next(c for c in CALLS if c.symbol == "cuMemcpyHtoDAsync_v2")
_DTOH_ASYNC = next(c for c in CALLS if c.symbol == "cuMemcpyDtoHAsync_v2")
SHARED_COPY_BYTES = 64 << 20  # per client connection on this host: the largest piece of one copy
PINNED_SHARE_MAX = 1 << 40  # one page-locked allocation shared with a client (a sanity bound only)
_EMPTY = (b"", b"")
CALL_OF = {  # the call that destroys an array of each kind (a client's leftovers, at its end)
    "array": next(c for c in CALLS if c.name == "cuArrayDestroy"),
    "mipmap": next(c for c in CALLS if c.name == "cuMipmappedArrayDestroy"),
}
_DESTROYS = {
    "cuTexObjectDestroy": "texobj",
    "cuSurfObjectDestroy": "surfobj",
    "cuStreamDestroy": "stream",
    "cuEventDestroy": "event",
    "cuModuleUnload": "module",
    "cuLibraryUnload": "library",
    "cuGraphDestroy": "graph",
    "cuGraphExecDestroy": "graphexec",
    "cuLinkDestroy": "link",
    "cuMemPoolDestroy": "pool",
    "cuGraphDestroyNode": "node",
}
