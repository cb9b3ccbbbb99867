"""The executor seam of a lease's worker: what actually runs the CUDA calls a client forwards.

Two executors plug in here: `virtualize.server._cuda.CudaExecutor` (the real GPU through cuda-python) and
`virtualize.server._executor_host.HostExecutor` (host memory, for tests on machines without a GPU). Both get
calls already checked by `virtualize.server._executor_guard` (handles, pointers, quota), with plain ints, bytes
and memoryviews, and raise `CudaError` with the CUresult when CUDA says no.

Most methods carry the name of the CUDA call they execute, take its in-parameters in order (a name
as `str`, an image as `bytes`) and return its out-parameters (one value, a tuple, or None). The few
below with lower-case names are the shapes the wire needs, and the address windows each client
process's allocations live in: copies that stream chunk by chunk between
the socket and the device (the executor owns the buffers, so the CUDA one can use page-locked
memory and overlap the network with the DMA), memsets of any width,
launches with packed parameters, and a kernel's parameter layout.
"""

from __future__ import annotations

import abc
import mmap
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from virtualize.common._calls import CALLS, Call, Mode
from virtualize.common._results import CUresult
from virtualize.common._wire import NODE_PARAMS_BYTES


class CudaError(Exception):
    """A CUDA call failed with `code` (a CUresult)."""

    def __init__(self, code: int, detail: str = "") -> None:
        super().__init__(f"CUresult {code}" + (f": {detail}" if detail else ""))
        self.code = int(code)


# The CUresult codes the guard and the executors raise most (all codes: `virtualize.common._results`).
INVALID_VALUE = CUresult.INVALID_VALUE
OUT_OF_MEMORY = CUresult.OUT_OF_MEMORY
INVALID_CONTEXT = CUresult.INVALID_CONTEXT
INVALID_HANDLE = CUresult.INVALID_HANDLE
NOT_FOUND = CUresult.NOT_FOUND
NOT_SUPPORTED = CUresult.NOT_SUPPORTED


# CUmemDecompressParams (cuMemBatchDecompressAsync): source and destination sizes, the actual-size word's
# address, source, destination, algorithm (DEFLATE 1, SNAPPY 2, LZ4 4), padding.
DECOMPRESS_PARAMS = struct.Struct("<QQQQQi20x")
# CUDA_FABRIC_COPY_BATCH_OP (CUDA 13.5): two CUfabricCpyOperand (the type; a pointer and its location hint,
# or an endpoint id and an offset), the size, flags.
FABRIC_COPY = struct.Struct("<I4xQQI4xQQQI4x")
# One launch of cuLaunchCooperativeKernelMultiDevice on the wire: function, grid and block dimensions, shared
# memory, its parameters' length (they follow it), stream.
MULTI_LAUNCH = struct.Struct("<Q7IIQ")

# A recapture's question (cuStreamBeginRecaptureToGraph) carries each side's CUgraphNodeParams to the
# program: these fields, by CUgraphNodeType, are pointers into the worker's own memory (a kernel node's
# kernelParams and extra, a host node's function and data, external semaphore arrays, a memory node's
# access descriptors, a batch's operations, a conditional node's body array) and go zeroed.
KERNEL_NODE, MEMSET_NODE, HOST_NODE = 0, 2, 3
WORKER_POINTERS = {KERNEL_NODE: (56, 64), HOST_NODE: (16, 24), 8: (16, 24), 9: (16, 24), 10: (104,), 12: (32,),
                   13: (32,)}  # fmt: skip
KERNEL_NODE_PARAMS = struct.Struct("<Q7I4xQQQQ")  # CUDA_KERNEL_NODE_PARAMS_v3, 16 bytes into the node's
MEMSET_NODE_PARAMS = struct.Struct("<QQIIQQQ")  # CUDA_MEMSET_NODE_PARAMS_v2
RECAPTURE_ELIGIBLE = 0  # CU_GRAPH_RECAPTURE_ELIGIBLE_FOR_UPDATE


@dataclass(frozen=True, slots=True)
class RecapturedNode:
    """One side of a recapture's question: a node's CUgraphNodeParams in the program's terms (the worker's
    own pointers zeroed) and, for a kernel node, its function (the lease's handle) and its arguments packed
    by that function's layout."""

    params: bytes
    func: int = 0
    args: bytes = b""

    @classmethod
    def of(cls, raw: bytes, func: int = 0, args: bytes = b"") -> RecapturedNode:
        params = bytearray(bytes(raw[:NODE_PARAMS_BYTES]).ljust(NODE_PARAMS_BYTES, b"\0"))
        for offset in WORKER_POINTERS.get(struct.unpack_from("<i", params)[0], ()):
            params[offset : offset + 8] = bytes(8)
        return cls(bytes(params), func, args)

    @property
    def type(self) -> int:
        return struct.unpack_from("<i", self.params)[0]


# Forwarded calls that the seam's shaped methods (below) run; every other forwarded call of the table
# runs through the executor method of its own name.
SHAPED: dict[str, str] = {
    "gpSetContext": "set_context",
    "gpParamLayout": "param_layout",
    "cuMemcpyHtoD": "copy_to_device",
    "cuMemcpyHtoDAsync": "copy_to_device",
    "cuMemcpyDtoH": "copy_from_device",
    "cuMemcpyDtoHAsync": "copy_from_device",
    "gpMemcpyDtoHAsync": "copy_from_device_async",
    **dict.fromkeys(
        (
            "cuMemsetD8",
            "cuMemsetD16",
            "cuMemsetD32",
            "cuMemsetD8Async",
            "cuMemsetD16Async",
            "cuMemsetD32Async",
        ),
        "memset",
    ),
    "cuLaunchKernelEx": "launch",
    "gpMemcpy3D": "copy_3d",
    "cuOccupancyMaxActiveClusters": "cluster_occupancy",
    "cuOccupancyMaxPotentialClusterSize": "cluster_occupancy",
    "cuStreamGetCaptureInfo": "capture_info",
    "cuStreamBeginCaptureToGraph": "capture_to_graph",
    "cuStreamBeginRecaptureToGraph": "recapture_to_graph",
    "cuStreamUpdateCaptureDependencies": "update_capture_dependencies",
    "cuGraphAddChildGraphNode": "graph_add_child_node",
    "gpGraphAddConditionalNode": "graph_add_conditional_node",
    "cuGraphExecUpdate": "graph_exec_update",
    "cuDevSmResourceSplitByCount": "sm_split",
    "cuDevSmResourceSplit": "sm_split_structured",
    "cuDevResourceGenerateDesc": "resource_desc",
    "cuGraphAddEventRecordNode": "graph_add_event_node",
    "cuGraphAddEventWaitNode": "graph_add_event_node",
    "cuGraphAddHostNode": "graph_add_host_node",
    "cuGraphAddMemcpyNode": "graph_add_memcpy_node",
    "cuGraphAddMemAllocNode": "graph_add_mem_alloc_node",
    "cuGraphMemAllocNodeGetParams": "graph_mem_alloc_node_params",
    "cuGraphAddMemFreeNode": "graph_add_mem_free_node",
    "cuLaunchCooperativeKernelMultiDevice": "launch_multi_device",
    "cuGraphAddBatchMemOpNode": "graph_add_batch_mem_op_node",
    "cuGraphBatchMemOpNodeSetParams": "graph_batch_mem_op_node_set",
    "cuGraphExecBatchMemOpNodeSetParams": "graph_batch_mem_op_node_set",
    "cuGraphBatchMemOpNodeGetParams": "graph_batch_mem_op_node_params",
    "cuGraphExecMemsetNodeSetParams": "graph_exec_memset_node",
    "cuGraphExecMemcpyNodeSetParams": "graph_exec_memcpy_node",
    "cuGraphKernelNodeSetParams": "graph_kernel_node_set",
    "cuGraphMemsetNodeSetParams": "graph_memset_node_set",
    "cuGraphMemcpyNodeSetParams": "graph_memcpy_node_set",
    "cuGraphMemcpyNodeGetParams": "graph_memcpy_node_params",
    "cuGraphKernelNodeGetParams": "graph_kernel_node_params",
    "cuGraphRemoveDependencies": "graph_remove_dependencies",
    "cuGraphHostNodeSetParams": "graph_host_node_set",
    "cuGraphExecHostNodeSetParams": "graph_host_node_set",
    "cuGraphGetNodes": "graph_nodes",
    "cuGraphGetRootNodes": "graph_node_list",
    "cuGraphNodeGetDependencies": "graph_node_list",
    "cuGraphNodeGetDependentNodes": "graph_node_list",
    "cuGraphGetEdges": "graph_edges",
}


def linked_image(linked: dict[int, bytes], state: int, size: int) -> bytes:
    """gpLinkImage in every executor: the image cuLinkComplete made for `state`, asked for by its size."""
    image = linked.get(state)
    if image is None or size != len(image):
        raise CudaError(INVALID_VALUE, "no linked image of that size")
    return image


HANDSHAKE = ("gpHello", "gpProve")  # the worker's own, before any call reaches an executor
# Served by the guard itself: from the client process's address window (virtualize.server._address_window),
# host functions (through `Executor.launch_host_func`) and tensor maps (`Executor.tensor_map`).
GUARD_CALLS = (
    *("gpWindowOffer", "gpWindowAccept", "cuMemAddressReserve", "cuMemAddressFree"),
    "gpResume",  # a process whose lease moved here from another server (virtualize.server._migrate_out)
    "gpProcessStart",  # a process that asks for a worker of its own (virtualize.server._process_workers)
    "gpLeaseMemory",  # what the lease holds of a device, for the process's NVML (LeaseState.in_use)
    *("gpIpcImport", "gpIpcRelease", "gpIpcEventImport"),  # IPC of another worker of the lease (_ipc_workers)
    *("gpCallbackToken", "gpCallbackAttach", "cuLaunchHostFunc", "cuStreamAddCallback"),  # host functions
    "gpDeliveryAttach",  # more connections for the copies the callback connection carries
    "gpEventCreateNamed",  # an event the client has named, made as cuEventCreate makes one
    *("cuTensorMapEncodeTiled", "cuTensorMapEncodeIm2col", "cuTensorMapEncodeIm2colWide"),  # tensor maps
    "cuTensorMapReplaceAddress",
    "cuTensorMapSetAllocationClass",
    *(
        "cuGraphAddKernelNode",
        "cuGraphExecKernelNodeSetParams",
        "cuGraphAddMemsetNode",
        "cuGraphAddEmptyNode",
    ),
    "cuGraphAddDependencies",  # graphs built node by node
    "cuGraphHostNodeGetParams",  # the id of the program's function, which the guard keeps
    *("cuArrayCreate", "cuArrayGetDescriptor"),  # as cuArray3DCreate and cuArray3DGetDescriptor
    "cuMemGetAllocationPropertiesFromHandle",  # what the handle was created with
    "cuMemExportToShareableHandle",  # recorded in the lease: another process of it may import the handle
    # affinity: none offered at creation; a context's is its SMs (virtualize.server._guard_green)
    *("cuDeviceGetExecAffinitySupport", "cuCtxGetExecAffinity"),
    "gpEventElapsedMany",  # each pair as cuEventElapsedTime (virtualize.server._guard_launches)
    "gpCopiesFlush",  # asynchronous copies to the client's page-locked memory (virtualize.server._deliveries)
    # copies through memory shared with a client on this host (`Executor.copy_in_from`, `copy_out_piece`)
    *("gpShmAttach", "gpShmHtoD", "gpShmDtoH"),
    "gpRingAttach",  # the command ring: a connection's bytes through memory both map (worker.Channel)
    # the client's page-locked memory mapped by both (`Executor.copy_out_into`, `copy_in_from`)
    *("gpPinnedShare", "gpPinnedCopy", "gpPinnedSettle", "gpPinnedDrop"),
    *("gpLaneAttach", "gpLaneCopy", "gpLanePiece"),  # copies striped across a process's connections
    # NCCL at its API: the server's libnccl (virtualize.server._nccl) on `Executor.nccl_buffer`, `nccl_stream`
    *(c.name for c in CALLS if c.name.startswith("gpNccl")),
)


def executor_method(call: Call) -> str | None:
    """The Executor method that runs `call` on the worker; None for calls that never reach one
    (served in the client, or the worker's own hello)."""
    if call.mode is Mode.LOCAL or call.name in HANDSHAKE or call.name in GUARD_CALLS:
        return None
    return SHAPED.get(call.name, call.name)


# One method per forwarded call, named as the call (several ABI versions of a call share one).
PER_CALL: tuple[str, ...] = tuple(
    sorted({m for m in map(executor_method, CALLS) if m is not None} - set(SHAPED.values()))
)


def table_abis() -> dict[str, list[Call]]:
    """The call table's driver entry points by name, each name's ABIs oldest first."""
    abis: dict[str, list[Call]] = {}
    for call in sorted(CALLS, key=lambda c: c.since):
        if call.symbol != "-" and not call.name.startswith("gp"):
            abis.setdefault(call.name, []).append(call)
    return dict(sorted(abis.items()))


def lacked_abis(has: Callable[[Call], bool]) -> list[str]:
    """`name@since` for each ABI of the call table a driver does not have (`has(call)`: whether it does).
    The exception: a newer ABI the shim serves itself (Mode.LOCAL) of a name the driver has at an older
    ABI, because the shim reads the newer parameters and sends calls the driver has (CUDA 13.4's
    cuGraphAddNode_v3 on a 13.0 driver). Given these, the shim's cuGetProcAddress(name, version) answers
    as the driver: the newest ABI up to `version` the driver has, else not found."""
    lacks = []
    for name, abis in table_abis().items():
        has_older = False
        for call in abis:
            if has(call):
                has_older = True
            elif not (call.mode is Mode.LOCAL and has_older):
                lacks.append(f"{name}@{call.since}")
    return lacks


@dataclass(frozen=True, slots=True)
class Copy3D:
    """A copy node's copy: each side's first byte, pitch and height (rows per slice); the extent."""

    src: int
    src_pitch: int
    src_height: int
    dst: int
    dst_pitch: int
    dst_height: int
    width: int
    height: int
    depth: int

    def span(self, pitch: int, rows: int) -> int:
        """Bytes from a side's first byte to the end of the last row the copy touches there."""
        return (self.depth - 1) * pitch * rows + (self.height - 1) * pitch + self.width

    def rows(self):
        """(source, destination) address of each row."""
        for z in range(self.depth):
            for y in range(self.height):
                yield (
                    self.src + (z * self.src_height + y) * self.src_pitch,
                    self.dst + (z * self.dst_height + y) * self.dst_pitch,
                )


@dataclass(frozen=True, slots=True)
class CopySide:
    """One side of a copy in rows and slices (gpMemcpy3D): host memory (`kind` 1: the request's or the
    reply's bytes, rows packed), device memory (2: `at` is the address) or a CUDA array (3: `at` is
    the array); the copy starts `x` bytes, `y` rows and `z` slices in, rows `pitch` bytes apart and
    slices `height` rows apart (an array's own)."""

    kind: int
    at: int
    x: int
    y: int
    z: int
    pitch: int
    height: int


@dataclass(frozen=True, slots=True)
class Launch:
    """One kernel launch as the worker received it (cuLaunchKernelEx; cuLaunchKernel is one without
    attributes)."""

    func: int  # a CUfunction or CUkernel handle of the lease
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    stream: int
    params: bytes  # the parameters, packed at `layout`'s offsets
    layout: list[tuple[int, int]]  # (offset, size) of each parameter, from `param_layout`
    attributes: tuple[tuple[int, bytes], ...] = ()  # (CUlaunchAttributeID, its 64-byte value)
    is_kernel: bool = False  # `func` is a CUkernel (a graph's kernel node needs its function)


class SharedHostMemory:
    """Memory a client process on this host maps too (an anonymous file: its descriptor goes to the
    client over the local socket). Copies through it skip the socket (the guard's gpShm* calls)."""

    def __init__(self, size: int) -> None:
        self.fd = os.memfd_create("gpupool-copies", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, size)
        self.size = size
        self.map = mmap.mmap(self.fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        self.view = memoryview(self.map)
        self.address = 0  # set by an executor that pins it (its DMAs read and write it directly)

    def close(self) -> None:
        self.view.release()
        self.map.close()
        os.close(self.fd)


class StagedCopy(abc.ABC):
    """A copy from the device queued behind its stream into a host buffer of the executor's
    (`Executor.copy_from_device_async`): safe to ask from any thread."""

    @abc.abstractmethod
    def ready(self) -> bool:
        """Whether the stream has got past the copy (its bytes are in host memory, or it failed)."""

    @abc.abstractmethod
    def wait(self) -> None:
        """Block until `ready()`."""

    @abc.abstractmethod
    def view(self) -> memoryview:
        """The copied bytes, once ready; raises CudaError if the copy failed."""

    # True: `view()` is the device memory itself, valid only until the executor runs another call, so
    # the bytes are sent before the call that queued the copy returns (an executor whose streams run at
    # once needs no copy of its own).
    transient = False

    # Copies with the same key (not None) finish in the order they were queued: one stream's. While one of
    # them is not ready, the later ones are not either, so the delivery thread need not ask (each ask costs
    # driver calls).
    order: object = None

    def release(self) -> None:  # noqa: B027 - optional hook: a buffer that is plain memory needs nothing
        """The bytes have been sent: the buffer may be reused."""


class CopiedBytes(StagedCopy):
    """A copy whose bytes were taken before the call returned (nothing left in flight)."""

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self.data = data

    def ready(self) -> bool:
        return True

    def wait(self) -> None:
        return None

    def view(self) -> memoryview:
        return memoryview(self.data)


@dataclass
class HeldObjects:
    """An executor's own records of what the program made that the executor re-creates on a move, by the
    executor's handle values: CUDA arrays (array, its context, shape), mipmapped arrays (mipmap, context,
    level 0's shape, its levels' arrays in order), texture and surface objects (value, context, resource,
    texture (None: a surface) and view descriptors), and the program's own virtual memory: allocations
    (handle, size, lease device, handle types, usage, whether the program still holds it or only its
    mappings keep it), mappings (address, size, offset, handle) and the access granted (address, size,
    [(lease device, CUmemAccess_flags)])."""

    arrays: list[tuple] = field(default_factory=list)
    mipmaps: list[tuple] = field(default_factory=list)
    samplers: list[tuple] = field(default_factory=list)
    vm: list[tuple] = field(default_factory=list)
    vm_maps: list[tuple] = field(default_factory=list)
    vm_access: list[tuple] = field(default_factory=list)


class Executor(abc.ABC):
    """Runs checked CUDA calls: the shaped methods below, and one abstract method per name in `PER_CALL`,
    declared from the call table (an executor that misses one cannot be created)."""

    name = "executor"
    # `wait(address, value, timeout_ns) -> bool`: a 32-bit word of host memory waited for until it holds
    # `value`, with the GIL let go (the worker hands in its native loop's, _native_dispatch.word_waiter);
    # None: the executor asks its driver instead.
    word_waiter: Callable[[int, int, int], bool] | None = None
    # `queue(dst, src, count, stream, event, mark, value) -> (CUresult, which call failed)`: a copy to the host
    # with its event and mark in one C call (_native_dispatch.copy_queuer); None: one driver call each.
    copy_queuer: Callable[..., tuple[int, int]] | None = None

    @abc.abstractmethod
    def set_context(self, ctx: int) -> None:
        """Make `ctx` (0: none) current on the calling thread."""

    @abc.abstractmethod
    def copy_to_device(
        self, dst: int, count: int, stream: int | None, fill: Callable[[memoryview], None]
    ) -> None:
        """Copy `count` bytes to device address `dst`, chunk by chunk: `fill(view)` puts the next
        len(view) bytes of the client's data into a buffer of the executor's. Stream None is the
        synchronous copy (done before the next call runs)."""

    @abc.abstractmethod
    def copy_from_device(
        self, src: int, count: int, stream: int | None, send: Callable[[memoryview], None]
    ) -> None:
        """Copy `count` bytes from device address `src`, handing each chunk to `send` in order,
        once the chunk's bytes are in host memory."""

    def driver_lacks(self) -> list[str]:
        """ABIs of the call table this host's driver does not have (`lacked_abis`): the client's shim
        answers cuGetProcAddress for them as that driver does, so a program sees the server's driver."""
        return []

    def shared_host_memory(self, size: int) -> SharedHostMemory:
        """Memory to copy through with a client on this host (an executor with DMA pins it)."""
        return SharedHostMemory(size)

    def release_shared_host_memory(self, shared: SharedHostMemory) -> None:
        shared.close()

    def copy_in_from(
        self, dst: int, shared: SharedHostMemory, offset: int, count: int, stream, last: bool
    ) -> None:
        """`count` bytes of `shared` at `offset` to device address `dst`; `last`: the client's call ends
        here, so every piece of it must have been read from `shared` on return."""
        at = offset

        def fill(view: memoryview) -> None:
            nonlocal at
            view[:] = shared.view[at : at + len(view)]
            at += len(view)

        self.copy_to_device(dst, count, stream, fill)

    def copy_out_into(
        self, shared: SharedHostMemory, offset: int, src: int, count: int, stream
    ) -> StagedCopy:
        """`count` bytes of device address `src` into `shared` at `offset`, queued behind `stream` (None:
        synchronous); the answer says when they are there."""
        at = offset

        def put(view: memoryview) -> None:
            nonlocal at
            shared.view[at : at + len(view)] = view
            at += len(view)

        self.copy_from_device(src, count, stream, put)
        return CopiedBytes(b"")

    def copy_pinned_captured(
        self, device: int, shared: SharedHostMemory, offset: int, count: int, stream: int, to_device: bool
    ) -> None:
        """A copy between device address `device` and the client's page-locked memory this worker maps too
        (`shared` at `offset`) on `stream` while it is captured: a node of the graph that copies at each
        launch, as the driver captures a copy with page-locked memory (the pages are the client's own)."""
        raise CudaError(
            CUresult.STREAM_CAPTURE_UNSUPPORTED, "this executor captures no copies with host memory"
        )

    def copy_out_piece(self, shared: SharedHostMemory, offset: int, src: int, count: int, stream) -> None:
        """`count` bytes of device address `src` into `shared` at `offset`, there on return (queued
        behind `stream`'s work; None: the legacy stream): a piece of a copy through the memory a
        client on this host maps too (gpShmDtoH). Raises CudaError if the copy failed."""
        self.copy_out_into(shared, offset, src, count, stream).wait()

    def lane_staged(self, dst: int, count: int, stream: int):
        """Queue a copy of `count` bytes to device address `dst` behind `stream`'s work before its bytes are
        here: an object with `view` (the bytes' page-locked buffer, filled by any thread) and `filled()` (every
        byte is in: the stream goes on), or None where this executor cannot (the caller then waits for the
        bytes before the next frame). Raises CudaError if queuing failed."""
        return None

    @abc.abstractmethod
    def copy_from_device_async(self, src: int, count: int, stream: int) -> StagedCopy:
        """Queue a copy of `count` bytes from device address `src` behind `stream`'s work and return at
        once, without waiting for the stream: the bytes are the device's as the stream reaches the copy."""

    @abc.abstractmethod
    def memset(self, dst: int, value: int, element_size: int, count: int, stream: int | None) -> None: ...

    @abc.abstractmethod
    def copy_3d(
        self,
        src: CopySide,
        dst: CopySide,
        extent: tuple[int, int, int],
        stream: int | None,
        data: bytes | None,
    ) -> bytes | None:
        """Copy `extent` (bytes per row, rows, slices) from `src` to `dst` (checked: the lease's memory
        and arrays); a host source is `data`, a host destination is returned. Stream None: synchronous."""

    @abc.abstractmethod
    def param_layout(self, func: int, is_kernel: bool) -> list[tuple[int, int]]:
        """(offset, size) of each kernel parameter, in order."""

    @abc.abstractmethod
    def cluster_occupancy(self, name: str, launch: Launch) -> int:
        """cuOccupancyMaxActiveClusters or cuOccupancyMaxPotentialClusterSize (`name`) of a launch
        configuration (`launch` without parameters)."""

    @abc.abstractmethod
    def launch(self, launch: Launch) -> None:
        """Launch `launch.func` as `launch` says (parameters already packed at the layout's offsets)."""

    # Graphs built node by node (the guard checked the graph, the nodes and the memory).
    @abc.abstractmethod
    def graph_add_kernel_node(self, graph: int, deps: list[int], launch: Launch) -> int:
        """cuGraphAddKernelNode: `launch` (its stream unused) as a node after `deps`; the node."""

    @abc.abstractmethod
    def graph_exec_kernel_node(self, graph_exec: int, node: int, launch: Launch) -> None:
        """cuGraphExecKernelNodeSetParams."""

    @abc.abstractmethod
    def graph_add_memset_node(self, graph, deps, dst, pitch, value, element_size, width, height) -> int: ...

    @abc.abstractmethod
    def graph_add_empty_node(self, graph: int, deps: list[int]) -> int: ...

    @abc.abstractmethod
    def graph_add_dependencies(
        self, graph: int, edges: list[tuple[int, int]], edge_data: list[bytes] | None = None
    ) -> None:
        """`edge_data`: per edge, CUgraphEdgeData's 8 bytes (from port, to port, type; zero: the default)."""

    @abc.abstractmethod
    def graph_add_child_node(self, graph: int, deps: list[int], child: int) -> int:
        """cuGraphAddChildGraphNode: a copy of graph `child` as a node after `deps`; the node."""

    @abc.abstractmethod
    def graph_add_conditional_node(
        self, graph: int, deps: list[int], handle: int, kind: int, size: int, ctx: int
    ) -> tuple[int, list[int]]:
        """A conditional node (CU_GRAPH_COND_TYPE_IF 0, WHILE 1, SWITCH 2) on condition `handle` with
        `size` body graphs; the node and the body graphs (owned by the node)."""

    @abc.abstractmethod
    def graph_add_event_node(self, graph: int, deps: list[int], event: int, wait: bool) -> int:
        """cuGraphAddEventRecordNode, or cuGraphAddEventWaitNode when `wait`; the node."""

    @abc.abstractmethod
    def graph_add_memcpy_node(self, graph: int, deps: list[int], copy: Copy3D) -> int:
        """cuGraphAddMemcpyNode between device memory of the lease (`copy` checked); the node."""

    @abc.abstractmethod
    def graph_add_mem_alloc_node(
        self, graph: int, deps: list[int], device: int, size: int, access: list[tuple[int, int]]
    ) -> tuple[int, int]:
        """cuGraphAddMemAllocNode: `size` bytes of graph memory of lease device `device`, the lease devices
        of `access` given (device, CUmemAccess_flags) access; the node and the address the driver placed
        it at."""

    @abc.abstractmethod
    def graph_mem_alloc_node_params(self, node: int) -> tuple[int, int, int, list[tuple[int, int]]]:
        """cuGraphMemAllocNodeGetParams: the node's lease device, size, address and access."""

    @abc.abstractmethod
    def graph_add_mem_free_node(self, graph: int, deps: list[int], ptr: int) -> int:
        """cuGraphAddMemFreeNode of graph memory at `ptr`; the node."""

    @abc.abstractmethod
    def launch_multi_device(self, launches: list[Launch], flags: int) -> None:
        """cuLaunchCooperativeKernelMultiDevice: cooperative launches (checked, parameters padded), one per
        device, as one driver call; `flags` its CUDA_COOPERATIVE_LAUNCH_MULTI_DEVICE_NO_*_SYNC bits."""

    @abc.abstractmethod
    def graph_add_batch_mem_op_node(self, graph: int, deps: list[int], ops: bytes, flags: int) -> int:
        """cuGraphAddBatchMemOpNode of `ops` (CUstreamBatchMemOpParams, 48 bytes each, checked) in the
        current context; the node."""

    @abc.abstractmethod
    def graph_batch_mem_op_node_set(self, graph_exec: int, node: int, ops: bytes, flags: int) -> None:
        """A batch memory-operation node's operations anew: the graph's (`graph_exec` 0) or an instantiated
        graph's."""

    @abc.abstractmethod
    def graph_batch_mem_op_node_params(self, node: int) -> tuple[bytes, int]:
        """cuGraphBatchMemOpNodeGetParams: the node's operations and flags."""

    @abc.abstractmethod
    def graph_add_host_node(self, graph: int, deps: list[int], fn: Callable[[], None]) -> int:
        """cuGraphAddHostNode: `fn` runs (on a thread of the executor's) at every launch; the node."""

    @abc.abstractmethod
    def graph_exec_memset_node(
        self, graph_exec, node, dst, pitch, value, element_size, width, height
    ) -> None:
        """cuGraphExecMemsetNodeSetParams (the memory checked)."""

    @abc.abstractmethod
    def graph_exec_memcpy_node(self, graph_exec: int, node: int, copy: Copy3D) -> None:
        """cuGraphExecMemcpyNodeSetParams between device memory of the lease (`copy` checked)."""

    # A graph's nodes set anew (the graph's own; graphs instantiated before keep what they had).
    @abc.abstractmethod
    def graph_kernel_node_set(self, node: int, launch: Launch) -> None:
        """cuGraphKernelNodeSetParams."""

    @abc.abstractmethod
    def graph_memset_node_set(self, node, dst, pitch, value, element_size, width, height) -> None:
        """cuGraphMemsetNodeSetParams (the memory checked)."""

    @abc.abstractmethod
    def graph_kernel_node_params(
        self, node: int, layout_of: Callable[[int], list[tuple[int, int]]]
    ) -> tuple[int, tuple[int, int, int], tuple[int, int, int], int, bytes]:
        """cuGraphKernelNodeGetParams: the node's function, grid, block, shared memory and parameters
        packed at `layout_of(function)`'s offsets."""

    @abc.abstractmethod
    def graph_memcpy_node_params(self, node: int) -> Copy3D:
        """cuGraphMemcpyNodeGetParams: the node's copy, each side as its first byte's device address;
        CudaError(NOT_SUPPORTED) for a side that is not device memory (host memory, an array)."""

    @abc.abstractmethod
    def graph_memcpy_node_set(self, node: int, copy: Copy3D) -> None:
        """cuGraphMemcpyNodeSetParams between device memory of the lease (`copy` checked)."""

    @abc.abstractmethod
    def graph_host_node_set(self, graph_exec: int, node: int, fn: Callable[[], None]) -> None:
        """cuGraphHostNodeSetParams (`graph_exec` 0), or cuGraphExecHostNodeSetParams: `fn` runs instead."""

    @abc.abstractmethod
    def graph_remove_dependencies(
        self, graph: int, edges: list[tuple[int, int]], edge_data: list[bytes] | None = None
    ) -> None:
        """cuGraphRemoveDependencies: each edge (with its data) must be the graph's."""

    @abc.abstractmethod
    def graph_node_list(self, which: str, subject: int) -> tuple[list[int], list[bytes]]:
        """`which` is cuGraphGetRootNodes (of graph `subject`), cuGraphNodeGetDependencies or
        cuGraphNodeGetDependentNodes (of node `subject`): the nodes, and each edge's 8 bytes of data."""

    @abc.abstractmethod
    def graph_nodes(self, graph: int) -> list[int]:
        """cuGraphGetNodes: the graph's nodes."""

    @abc.abstractmethod
    def graph_host_node_fn(self, node: int) -> Callable[[], None]:
        """The function a host node calls (a move builds the node again with it)."""

    @abc.abstractmethod
    def graph_edges(self, graph: int) -> list[tuple[int, int]]:
        """cuGraphGetEdges: (from, to) of each edge."""

    @abc.abstractmethod
    def graph_exec_update(self, graph_exec: int, graph: int) -> tuple[int, int]:
        """cuGraphExecUpdate: (CUgraphExecUpdateResult, CUresult); a refused update is no exception."""

    @abc.abstractmethod
    def capture_info(self, stream: int) -> tuple[int, int, int, list[int]]:
        """cuStreamGetCaptureInfo: status, capture id, the capturing graph, the dependency nodes."""

    @abc.abstractmethod
    def capture_to_graph(self, stream: int, graph: int, deps: list[int], mode: int) -> None:
        """cuStreamBeginCaptureToGraph: capture into `graph`, after `deps`."""

    @abc.abstractmethod
    def recapture_to_graph(
        self,
        stream: int,
        mode: int,
        graph: int,
        on_mismatch: Callable[[int, RecapturedNode, RecapturedNode, int], int] | None,
        layout_of: Callable[[int], list[tuple[int, int]]],
    ) -> None:
        """cuStreamBeginRecaptureToGraph: capture again into `graph`, its nodes in the same order. For each
        node whose parameters differ, `on_mismatch(node, original, recaptured, CUgraphRecaptureStatus)`
        (None: the recaptured ones are taken) answers a CUresult; anything but CUDA_SUCCESS fails the
        capture. `layout_of(func)`: a kernel node's parameter layout (a function or kernel of the lease;
        empty where it is not one)."""

    @abc.abstractmethod
    def update_capture_dependencies(self, stream: int, deps: list[int], flags: int) -> None:
        """cuStreamUpdateCaptureDependencies (CU_STREAM_ADD_CAPTURE_DEPENDENCIES 0, SET 1)."""

    @abc.abstractmethod
    def tensor_map(self, name: str, ins: tuple, arrays: list[list[int]]) -> bytes:
        """cuTensorMapEncodeTiled, Im2col or Im2colWide (`name`): the table's in-parameters and the shape
        arrays in the C order (dims, strides, box or lower/upper corners, element strides); the 128-byte
        CUtensorMap."""

    @abc.abstractmethod
    def tensor_map_address(self, encoded: bytes, address: int) -> bytes:
        """cuTensorMapReplaceAddress on a 128-byte CUtensorMap."""

    @abc.abstractmethod
    def tensor_map_alloc_class(self, encoded: bytes, alloc_class: int) -> tuple[bytes, int]:
        """cuTensorMapSetAllocationClass on a 128-byte CUtensorMap: the map after, and the class in effect."""

    @abc.abstractmethod
    def launch_host_func(self, stream: int, fn: Callable[[], None]) -> None:
        """Call `fn` (on a thread of the executor's) when `stream` reaches this point; later work on the
        stream waits until it returns (cuLaunchHostFunc)."""

    # Device address windows (`virtualize.server._address_window`): reserved ranges of device addresses that
    # the worker maps memory into at addresses it chooses.
    @abc.abstractmethod
    def reserve_addresses(self, size: int, hint: int) -> int:
        """Reserve `size` bytes of device address space, at `hint` where it is free; returns the start."""

    @abc.abstractmethod
    def release_addresses(self, base: int, size: int) -> None: ...

    @abc.abstractmethod
    def map_memory(self, base: int, size: int, device: int, exportable: bool = False) -> object:
        """Back [base, base+size) of a reserved range (2 MiB multiples) with new memory of lease device
        `device`, readable and writable from every device of the lease that can reach it; returns what
        `unmap_memory` needs. `exportable`: memory `export_memory` can hand to another worker process of
        the lease (virtualize.server._ipc_workers)."""

    @abc.abstractmethod
    def unmap_memory(self, base: int, size: int, backing: object) -> None: ...

    # IPC between the worker processes of one lease (virtualize.server._ipc_workers).
    @abc.abstractmethod
    def export_memory(self, backing: object) -> int:
        """A POSIX file descriptor for exportable memory `map_memory` made (the caller closes it)."""

    @abc.abstractmethod
    def import_memory(self, fd: int, base: int, size: int, device: int) -> object:
        """Map another worker process's exported memory at `base`, the address it has there, inside a range
        `reserve_addresses` gave here; readable and writable as `map_memory`'s."""

    @abc.abstractmethod
    def unmap_imported(self, base: int, size: int, backing: object) -> None: ...

    @abc.abstractmethod
    def export_vm(self, handle: int) -> int:
        """A POSIX file descriptor for cuMemCreate memory made to be shared so (the caller closes it)."""

    @abc.abstractmethod
    def import_vm(self, fd: int, device: int) -> int:
        """A handle here to the memory of lease device `device` that another worker process's `export_vm`
        descriptor names."""

    @abc.abstractmethod
    def ipc_event_handle(self, event: int) -> bytes:
        """The driver's 64-byte IPC handle of interprocess event `event`, for another worker process."""

    @abc.abstractmethod
    def ipc_open_event(self, handle: bytes) -> int:
        """An event of this process opened from another worker process's `ipc_event_handle`."""

    # Green contexts (`virtualize.server._guard_green`). A device resource is an id of the executor's,
    # given with its SM fields as (id, smCount, minSmPartitionSize, smCoscheduledAlignment).
    @abc.abstractmethod
    def sm_split(
        self, resource: int, nb_groups: int, flags: int, min_count: int, count_only: bool
    ) -> tuple[list[tuple[int, int, int, int]], tuple[int, int, int, int] | int]:
        """cuDevSmResourceSplitByCount of `resource` into at most `nb_groups` groups of at least
        `min_count` SMs: (the groups, the remainder (id 0: none)); with `count_only`, ([], how many
        groups it would make)."""

    @abc.abstractmethod
    def sm_split_structured(
        self, resource: int, nb_groups: int, flags: int, params: bytes, want_groups: bool
    ) -> tuple[list[tuple[int, int, int, int]], tuple[int, int, int, int], bytes]:
        """cuDevSmResourceSplit (CUDA 13.1) of `resource` by `nb_groups` CU_DEV_SM_RESOURCE_GROUP_PARAMS
        (64 bytes each): (the groups, none unless `want_groups`; the remainder (id 0: none); the parameters
        after, with discovered SM counts filled in)."""

    @abc.abstractmethod
    def resource_desc(self, resources: list[int]) -> int:
        """cuDevResourceGenerateDesc of the resources: a descriptor's handle."""

    # Live migration (`virtualize.server._migrate`): the worker pauses the lease's calls around `migrate`.
    def migration_refusal(self, target: int, holding: dict[str, int], uuid: str = "") -> str | None:
        """Why this executor cannot move a lease device to GPU `target` of this host (`uuid`: its UUID,
        where known), or None. `holding`: how many objects of each handle kind the lease holds (and
        "global": module globals whose address it asked for)."""
        return f"the {self.name} executor cannot move a lease to another GPU yet"

    def migrate(
        self, device: int, target: int, mappings: list, recreate: Callable[[], list], uuid: str = ""
    ) -> dict:
        """Move lease device `device` onto GPU `target`, its calls paused and its contexts drained: copy
        its memory (`mappings`: the address windows' `Mapping`s of every device of the lease; this
        device's are moved, the others' granted to the target) to the same addresses there, and call
        `recreate()` once the target is where the device's new objects are made (it replays how the
        lease made them, `virtualize.server._handles`, and returns (kind, old value, new value) of each
        object it made anew). All or nothing: on an exception the lease is as
        it was, on its source. Returns {"bytes": copied, "uuid": the target's}."""
        raise CudaError(NOT_SUPPORTED, self.migration_refusal(target, {}, uuid) or "")

    def held_objects(self) -> HeldObjects:
        """What this executor re-creates itself on a move, as it holds it now (its own handle values and
        contexts): a move to another server's worker carries it (virtualize.server._migrate_carried)."""
        return HeldObjects()

    def carry_refusal(self) -> str:
        """What of `held_objects` cannot be made anew on another host ("" where all can), from the executor's
        records alone (asked while the lease runs)."""
        return ""

    def nccl_buffer(self, ptr: int, count: int) -> int:
        """The address the server's NCCL is given for `count` bytes of lease memory at `ptr` (checked by
        the guard): the same address on a GPU (the client's device addresses are the worker's)."""
        return ptr

    def nccl_stream(self, stream: int) -> int:
        """The cudaStream_t the server's NCCL enqueues on for the client's `stream`: the same handle on a
        GPU (a CUstream is a cudaStream_t; 0, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD read alike)."""
        return stream

    def end_thread(self) -> None:  # noqa: B027 - optional hook
        """A connection's thread is done: release what the executor keeps for it."""

    def close(self) -> None:  # noqa: B027 - optional hook: most executors hold nothing to release
        """Release what the executor holds (the worker is ending)."""


def _declare(name: str) -> Callable:
    def method(self, *args):
        raise NotImplementedError(name)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"Run {name}: its in-parameters in the table's order; returns its out-parameters."
    return abc.abstractmethod(method)


for _name in PER_CALL:
    setattr(Executor, _name, _declare(_name))
abc.update_abstractmethods(Executor)
