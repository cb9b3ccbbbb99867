"""A host-memory executor, FOR TESTS ONLY: it lets CI run the shim and the worker end to end without a GPU.

It emulates what a CUDA program can observe through the driver API: device queries (a made-up
device with the lease's partitions), allocations at device-like addresses (GPUPOOL_HOST_EXECUTOR_BASE,
default 0x5e0000000000) backed by bytearrays, handles counted from GPUPOOL_HOST_EXECUTOR_FIRST_HANDLE
(default 0x1000: a test gives another server's workers other values, as another GPU's driver would), copies,
memsets, pools, streams and events (everything runs at once, in order; elapsed times are host clock times),
modules and pointer attributes. A copy into a client's page-locked memory is sent before its call returns, or
with GPUPOOL_HOST_EXECUTOR_COPIES=later by the worker's delivery thread, as a GPU's copy is.
Kernels: any image loads, and a few built-in functions run on host memory —
`fill_u32(u32 *ptr, u32 value, u32 n)`, `add_u32(u32 *ptr, u32 value, u32 n)`,
`saxpy(f32 *x, f32 *y, f32 a, u32 n)`, `printf_u32(u32)` (prints "kernel says N" as a device printf
would), `empty()`, `spin(ptr, u32)` (sleeps 10 ms, a stand-in for
a long kernel), `sleep_ms(u32 ms)`, `fault()`, which fails the way a GPU kernel that
touches a wild address does (CUDA_ERROR_ILLEGAL_ADDRESS, reported at the next synchronising call), and
`trap()`, a device-side assert: as a GPU context does, the executor (the worker's one context for every
process it serves) answers CUDA_ERROR_ASSERT to every launch, copy and synchronise from then on.
A kernel that a PTX image declares (`.entry`) also loads, with its parameter layout read from the
PTX, and runs as a no-op: programs that compile their own kernels (cuda.core, numba-cuda) go through
their whole call sequence, though their results are not computed. Any other name is
CUDA_ERROR_NOT_FOUND.
"""

from __future__ import annotations

import bisect
import ctypes
import itertools
import mmap
import os
import re
import struct
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace

from virtualize.common._calls import FORWARDED_LAUNCH_ATTRIBUTES
from virtualize.common._results import CUresult
from virtualize.server._arrays import (
    ARRAY,
    DEFERRED_MAPPING,
    FORMAT_BYTES,
    HOST,
    NV12,
    SPARSE,
    ArrayShape,
    resource_mapped,
    unmovable,
)
from virtualize.server._executor import (
    HOST_NODE,
    INVALID_HANDLE,
    INVALID_VALUE,
    KERNEL_NODE,
    KERNEL_NODE_PARAMS,
    MEMSET_NODE,
    MEMSET_NODE_PARAMS,
    NODE_PARAMS_BYTES,
    NOT_FOUND,
    RECAPTURE_ELIGIBLE,
    CopiedBytes,
    Copy3D,
    CopySide,
    CudaError,
    Executor,
    HeldObjects,
    Launch,
    RecapturedNode,
    StagedCopy,
    lacked_abis,
    linked_image,
    table_abis,
)

DEVICE_TOTAL = 80 << 30
COOPERATIVE = 2  # CU_LAUNCH_ATTRIBUTE_COOPERATIVE
CHUNK = 4 << 20
ALIGN = 1 << 21
HOST_KERNELS = {
    "fill_u32": [(0, 8), (8, 4), (12, 4)],
    "add_u32": [(0, 8), (8, 4), (12, 4)],
    "bounded_add_u32": [(0, 8), (8, 4), (12, 4)],  # add_u32 under __launch_bounds__(128)
    "fault": [],
    "trap": [],  # a device-side assert: sticky, as in a GPU context
    "spin": [(0, 8), (8, 4)],  # stands for a long kernel: sleeps 10 ms
    "empty": [],
    "sleep_ms": [(0, 4)],  # occupies the worker for a while, like a long kernel behind a sync
    "saxpy": [(0, 8), (8, 8), (16, 4), (20, 4)],  # y = a * x + y over float32
    "printf_u32": [(0, 4)],  # writes "kernel says N" to the worker's stdout, as a device printf does
    # Conditional nodes' conditions, as device code sets them (cudaGraphSetConditional):
    "set_condition": [(0, 8), (8, 4)],  # (handle, value)
    "count_down": [(0, 8), (8, 8)],  # (handle, u32 *counter): --*counter, the condition is *counter != 0
}
# A few attributes programs ask for; the rest read 0 (cuda.h numbering).
ATTRIBUTES = {
    1: 1024,
    2: 1024,
    3: 1024,
    4: 64,
    5: 2**31 - 1,
    6: 65535,
    7: 65535,
    8: 49152,
    10: 32,
    12: 65536,  # MAX_REGISTERS_PER_BLOCK
    16: 4,
    39: 2048,
    75: 9,
    76: 0,
    83: 1,  # MANAGED_MEMORY
    97: 232448,  # MAX_SHARED_MEMORY_PER_BLOCK_OPTIN (an H100's 227 KiB)
    95: 1,  # COOPERATIVE_LAUNCH
    115: 1,
    103: 1,  # HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
    119: 9,  # MEMPOOL_SUPPORTED_HANDLE_TYPES: POSIX descriptors and fabric handles, as on an NVLink system
    128: 1,  # HANDLE_TYPE_FABRIC_SUPPORTED
    132: 1,  # MULTICAST_SUPPORTED
}

NEWEST_ABI = max(call.since for abis in table_abis().values() for call in abis)


SM_MIN_PARTITION, SM_ALIGNMENT = 1, 1  # the modelled GPU's green-context partitions: any whole SM

CACHE_CONFIGS = range(4)  # CUfunc_cache: PREFER_NONE, SHARED, L1, EQUAL
SHARED_CONFIGS = range(3)  # CUsharedconfig: DEFAULT, FOUR_BYTE, EIGHT_BYTE bank size
CARVEOUT, MAX_DYNAMIC_SHARED = 9, 8  # CUfunction_attribute


MULTICAST_GRANULARITY = 2 << 20
# A PTX variable: `.global [.attribute(.managed)] [.align N] .TYPE name[COUNT]`, and each type's bytes.
VARIABLE = re.compile(
    rb"\.global\s+(\.attribute\(\.managed\)\s+)?(?:\.align\s+\d+\s+)?\.(\w+)\s+(\w+)(?:\[(\d+)\])?"
)
VARIABLE_BYTES = {
    **dict.fromkeys((b"b8", b"u8", b"s8"), 1), **dict.fromkeys((b"b16", b"u16", b"s16", b"f16"), 2),
    **dict.fromkeys((b"b32", b"u32", b"s32", b"f32"), 4), **dict.fromkeys((b"b64", b"u64", b"s64", b"f64"), 8),
}  # fmt: skip
DEFLATE, SIZE_MAX = 1, (1 << 64) - 1  # CU_MEM_DECOMPRESS_ALGORITHM_DEFLATE; no operation's error
SURFACE_LDST = 0x02  # CUDA_ARRAY3D_SURFACE_LDST
TILE_BYTES, TILE_ROWS = 64 << 10, 128  # a sparse array's tile, as the GPUs' 64 KiB tiles are
SPARSE_PROPERTIES = struct.Struct("<IIIIQI16x4x")  # CUDA_ARRAY_SPARSE_PROPERTIES: tile, mip tail, flags
MEMORY_REQUIREMENTS = struct.Struct("<QQ16x")  # CUDA_ARRAY_MEMORY_REQUIREMENTS: size, alignment


def _in_range(value: int, allowed: range, kind: str) -> int:
    if value not in allowed:
        raise CudaError(INVALID_VALUE, f"{kind} {value}")
    return value


def _settable_attribute(attrib: int, value: int) -> int:
    """What cuFuncSetAttribute accepts: a carve-out of -1 (the default) to 100 percent, dynamic shared
    memory up to the device's opt-in maximum; the attributes before them (0-7) are read-only."""
    if attrib < MAX_DYNAMIC_SHARED:
        raise CudaError(INVALID_VALUE, f"function attribute {attrib} is read-only")
    if attrib == CARVEOUT:
        return _in_range(value, range(-1, 101), "shared memory carve-out")
    if attrib == MAX_DYNAMIC_SHARED:
        return _in_range(value, range(ATTRIBUTES[97] + 1), "dynamic shared memory")
    return value


_PTX_ENTRY = re.compile(rb"\.entry\s+([A-Za-z_$][\w$]*)\s*\(([^)]*)\)")
_PTX_PARAM = re.compile(rb"\.param\s+(?:\.align\s+(\d+)\s+)?\.([busf])(\d+)\s+[\w$]+(?:\[(\d+)\])?")


def ptx_layouts(image: bytes) -> dict[str, list[tuple[int, int]]]:
    """Each `.entry` of a PTX image -> its parameters' (offset, size), laid out as the driver does."""
    kernels = {}
    for name, params in _PTX_ENTRY.findall(image):
        layout, offset = [], 0
        for align, _kind, bits, count in _PTX_PARAM.findall(params):
            size = int(bits) // 8 * (int(count) if count else 1)
            alignment = int(align) if align else int(bits) // 8
            offset = (offset + alignment - 1) // alignment * alignment
            layout.append((offset, size))
            offset += size
        kernels[name.decode()] = layout
    return kernels


_NOTHING = bytearray(1)  # where a range of zero bytes "lies" (`_span`)


class _Copied(CopiedBytes):
    """A copy done at once, its bytes where they lie: sent before the next call can change them."""

    transient = True


@dataclass
class _Recapture:
    """A recapture in progress (cuStreamBeginRecaptureToGraph): the graph's nodes in order, how many the
    captured work has taken, the program's callback, whether it failed."""

    order: list[int]
    on_mismatch: object
    at: int = 0
    failed: bool = False


def _launch_key(launch: Launch | None):
    """What a kernel node runs: the same function, shape and arguments are the same node's parameters."""
    if launch is None:
        return None
    return launch.func, launch.grid, launch.block, launch.shared_mem, bytes(launch.params)


class HostExecutor(Executor):
    name = "host (tests only)"

    def driver_lacks(self) -> list[str]:
        """Tests name what this pretend driver lacks (GPUPOOL_HOST_EXECUTOR_LACKS, commas): an entry point
        (every ABI of it) or one ABI, `name@since`."""
        named = set(filter(None, os.environ.get("GPUPOOL_HOST_EXECUTOR_LACKS", "").split(",")))
        return lacked_abis(lambda call: call.name not in named and f"{call.name}@{call.since}" not in named)

    def __init__(self, devices) -> None:
        self.trapped = 0  # CUDA_ERROR_ASSERT once a trap() kernel ran: the sticky error of a context
        # GPUPOOL_HOST_EXECUTOR_COPIES=later: copies into a client's page-locked memory go through the worker's
        # delivery thread, as on a GPU (bench_remote.py measures that path on a machine without one)
        self.copies_later = os.environ.get("GPUPOOL_HOST_EXECUTOR_COPIES") == "later"
        self.n = len(devices)
        base = int(os.environ.get("GPUPOOL_HOST_EXECUTOR_BASE", "0x5e0000000000"), 0)
        self.next_address = [base + i * (1 << 40) for i in range(self.n)]
        self.memory: dict[int, bytearray] = {}
        self.bases: list[int] = []
        self.owner: dict[int, int] = {}  # base -> device
        self.reserved: dict[int, int] = {}  # reserved address ranges: base -> size
        self.created: dict[int, int] = {}  # cuMemCreate handle -> device
        self.references: dict[int, int] = {}  # cuMemCreate handle -> references (create, retains)
        # cuMemCreate handle -> its bytes, shared by its mappings (a memfd's where made to be shared)
        self.backing: dict[int, bytearray | mmap.mmap] = {}
        self.vm_descriptors: dict[int, int] = {}  # memory created to be shared: its memfd (export_vm)
        self.mapped_handles: dict[int, int] = {}  # mapped address -> the handle mapped there
        self.access: dict[tuple[int, int], int] = {}  # (mapped address, device) -> CUmemAccess_flags
        self.nodes: dict[int, tuple[int, object]] = {}  # graph node -> (its graph, its work)
        self.edges: list[tuple[int, int]] = []  # (from, to) between nodes
        self.node_order: dict[int, list[int]] = {}  # graph -> its nodes in the order they run
        self.exec_order: dict[int, list[int]] = {}  # graph exec -> its graph's nodes at instantiation
        self.ids = itertools.count(int(os.environ.get("GPUPOOL_HOST_EXECUTOR_FIRST_HANDLE", "0x1000"), 0))
        self.contexts = {0xC0000 + d: d for d in range(self.n)}
        self.pools = {0xB0000 + d: d for d in range(self.n)}
        self.current_pools = {d: 0xB0000 + d for d in range(self.n)}  # cuDeviceSetMemPool's
        self.pool_attributes: dict[tuple[int, int], int] = {}  # (pool, CUmemPool_attribute) -> value set
        self.sync_memops: set[int] = set()  # allocations (bases) with CU_POINTER_ATTRIBUTE_SYNC_MEMOPS set
        self.mapped: set[int] = set()  # bases of memory mapped at a reserved address (cuMemMap's kind)
        self.exportable: dict[int, tuple[int, mmap.mmap]] = {}  # base -> its memfd and mapping (map_memory)
        self.functions: dict[int, str] = {}
        self.function_handles: dict[tuple[int, str], int] = {}  # (module or library, name) -> its handle
        self.parents: dict[int, int] = {}  # function or kernel -> its module or library
        self.kernel_of: dict[int, int] = {}  # a kernel's function in a context -> the kernel
        self.links: dict[int, list[bytes]] = {}  # link state -> its inputs
        self.linked: dict[int, bytes] = {}  # link state -> the image cuLinkComplete made
        self.function_attributes: dict[
            tuple[int, int], int
        ] = {}  # (function or kernel, attribute) -> set value
        # A primary context is the GPU's, as the driver keeps one per device of the process: retains and
        # flags by the host "GPU" a lease device is on (`_gpu`).
        self.gpu: dict[int, int] = {}  # lease device -> the GPU a move put it on
        self.primary_retains: dict[int, int] = {}  # GPU -> retains of its primary context
        self.primary_flags: dict[int, int] = {}
        self.cache_config: dict[int, int] = {}  # context -> CUfunc_cache
        self.context_flags: dict[int, int] = {}  # context -> cuCtxSetFlags' flags
        self.peers: set[tuple[int, int]] = set()  # (context, peer context) with peer access enabled
        self.stream_attributes: dict[tuple[int, int], bytes] = {}  # (stream, CUstreamAttrID) -> its value
        self.shared_config: dict[int, int] = {}  # context -> CUsharedconfig
        self.ptx_kernels: dict[int, dict[str, list[tuple[int, int]]]] = {}  # module -> kernels it declares
        # Module variables live in module memory, given back at unload and reused first-fit by the next
        # module's, as the driver places modules (a new global may sit where an old one was).
        self.module_memory: dict[int, list[tuple[int, int]]] = {}  # module -> its variables' (address, span)
        self.module_gaps: list[tuple[int, int]] = []  # (address, span) free again
        self.next_module_memory = base + (1 << 39)  # past device 0's allocations, below device 1's
        self.layouts: dict[int, list[tuple[int, int]]] = {}  # PTX-declared functions -> parameter layout
        self.events: dict[int, float | None] = {}
        self.untimed: set[int] = set()  # events made with CU_EVENT_DISABLE_TIMING
        self.streams: set[int] = set()
        # stream -> [its capture's graph, the nodes the next captured work depends on]
        self.capturing: dict[int, list] = {}
        self.conditions: dict[int, list[int]] = {}  # conditional handle -> [value, default, flags]
        self.child_graphs: dict[int, int] = {}  # child graph node -> its copy of the graph
        self.clones: dict[int, dict[int, int]] = {}  # cloned graph -> {original node: its twin}
        self.node_types: dict[int, int] = {}  # node -> CUgraphNodeType, where not a kernel's (0)
        self.edge_data: dict[tuple[int, int], bytes] = {}  # (from, to) -> CUgraphEdgeData, where not 0
        self.node_events: dict[int, int] = {}  # event record or wait node -> its event
        self.node_attributes: dict[tuple[int, int], bytes] = {}  # (kernel node, attribute) -> its value
        self.copies: dict[int, Copy3D] = {}  # copy node -> its copy
        self.launches: dict[int, Launch] = {}  # kernel node -> its launch
        self.memsets: dict[int, tuple] = {}  # memset node -> (dst, pitch, value, element size, width, height)
        # Graph memory: allocation node -> (device, size, address, access), free node -> the address it
        # frees; as the driver holds it: the allocations a launch made live and no free has freed, each
        # device's reserve (the memory its graph allocations have had at once, reused by later ones, until
        # a trim returns what no live allocation uses), and the high-water marks of both.
        self.mem_alloc_nodes: dict[int, tuple[int, int, int, list[tuple[int, int]]]] = {}
        self.mem_free_nodes: dict[int, int] = {}
        self.batch_ops: dict[int, tuple[bytes, int]] = {}  # batch memory-operation node -> (ops, flags)
        self.graph_live: dict[int, int] = {}  # live graph allocation -> its allocation node
        self.graph_reserved = [0] * self.n
        self.graph_memory_high = [[0, 0] for _ in range(self.n)]  # per device: used, reserved
        self.disabled: dict[tuple[int, int], object] = {}  # (graph exec, node) switched off -> its work
        self.exec_flags: dict[int, int] = {}  # graph exec -> the flags it was instantiated with
        self.graphs: dict[int, list] = {}  # graph or executable graph -> its work, in stream order
        self.arrays: dict[int, tuple[ArrayShape, bytearray]] = {}  # CUDA arrays: their shape and bytes
        self.array_device: dict[int, int] = {}  # CUDA array -> the device it was made on
        self.mipmaps: dict[int, list[int]] = {}  # mipmapped array -> its levels' arrays
        # Multicast objects: handle -> [devices it spans, devices added, {(device, offset): bound size}]
        self.multicast: dict[int, list] = {}
        self.endpoints: dict[int, list] = {}  # logical endpoint id -> [type, size, devices, bindings]
        self.next_endpoint_id = 1
        # Legacy texture and surface references: handle -> its settings; (module, name) -> its handle.
        self.references_of: dict[int, dict] = {}
        self.variables: dict[
            int, dict[str, list]
        ] = {}  # module -> name -> [size, managed, address once placed]
        self.module_references: dict[tuple[int, str], list] = {}  # -> [a surface's, its handle once asked]
        self.planes: dict[tuple[int, int], int] = {}  # (NV12 array, plane) -> the plane's array
        self.tiles_mapped: dict[int, int] = {}  # sparse or deferred array -> tile ranges mapped to memory
        self.samplers: dict[int, tuple] = {}  # texture or surface -> its resource, texture, view descriptors
        # Texture and surface objects are small numbers in the order they are made, as a GPU's driver gives
        # them (a move to another server makes them anew in that order, and must get the same values);
        # GPUPOOL_HOST_EXECUTOR_FIRST_SAMPLER (default 1) makes a driver that gives others (the tests' seam).
        self.sampler_values = itertools.count(
            int(os.environ.get("GPUPOOL_HOST_EXECUTOR_FIRST_SAMPLER", "1"), 0)
        )
        # array, mipmapped array, texture or surface object -> the context it was made in
        self.made_in: dict[int, int] = {}
        # cuMemCreate memory: handle -> (size, device, handle types, usage), while it or a mapping of it lives;
        # each mapped address's offset into its memory.
        self.vm_made: dict[int, tuple[int, int, int, int]] = {}
        self.map_offsets: dict[int, int] = {}
        # Green contexts over the modelled SMs: resource -> (device, SMs), descriptor -> (device, SMs),
        # green context -> (device, SMs, its CUcontext), stream -> the green context it was made in.
        self.resources: dict[int, tuple[int, int]] = {}
        self.resource_descs: dict[int, tuple[int, int]] = {}
        self.greens: dict[int, tuple[int, int, int]] = {}
        self.stream_green: dict[int, int] = {}
        self.local = threading.local()
        self.lock = threading.Lock()

    # -- helpers -------------------------------------------------------------------------------------

    def _ctx(self) -> int:
        ctx = getattr(self.local, "ctx", 0)
        if not ctx:
            raise CudaError(CUresult.INVALID_CONTEXT, "no current context")
        return ctx

    def _device(self, dev: int) -> int:
        if not 0 <= dev < self.n:
            raise CudaError(CUresult.INVALID_DEVICE, f"device {dev}")
        return dev

    def _ctx_device(self) -> int:
        return self.contexts[self._ctx()]

    def _find(self, ptr: int, count: int) -> tuple[bytearray, int]:
        with self.lock:
            i = bisect.bisect_right(self.bases, ptr)
            if i:
                base = self.bases[i - 1]
                mem = self.memory[base]
                if ptr - base + count <= len(mem):
                    return mem, ptr - base
        raise CudaError(CUresult.ILLEGAL_ADDRESS, f"illegal address 0x{ptr:x}")

    def _span(self, ptr: int, count: int) -> tuple[bytearray, int]:
        """The bytes a copy or memset of `count` at `ptr` touches: none at any address for a count of 0 (as the
        driver's copy of nothing, which XLA issues from and to address 0), else `_find`'s."""
        self._alive()
        return (_NOTHING, 0) if count == 0 else self._find(ptr, count)

    def nccl_buffer(self, ptr: int, count: int) -> int:
        """Host memory stands for the device here: the address in this process of the bytes behind `ptr`
        (the test's stand-in NCCL reads and writes them)."""
        mem, offset = self._find(ptr, count)
        return ctypes.addressof(ctypes.c_char.from_buffer(mem)) + offset

    def nccl_stream(self, stream: int) -> int:
        return 0  # every call here has run when it returns: the stand-in NCCL works at the call too

    def _alloc(self, size: int, dev: int | None = None) -> int:
        dev = self._ctx_device() if dev is None else dev
        with self.lock:
            ptr = self.next_address[dev]
            self.next_address[dev] += (max(size, 1) + ALIGN - 1) // ALIGN * ALIGN
        self._place(ptr, size, dev)
        return ptr

    def _place(self, ptr: int, size: int, dev: int) -> None:
        with self.lock:
            self.memory[ptr] = bytearray(size)
            self.owner[ptr] = dev
            bisect.insort(self.bases, ptr)

    def _free(self, ptr: int) -> None:
        with self.lock:
            if self.memory.pop(ptr, None) is None:
                raise CudaError(INVALID_VALUE)
            self.bases.remove(ptr)
            self.owner.pop(ptr)

    # -- the seam ------------------------------------------------------------------------------------

    def tensor_map(self, name: str, ins: tuple, arrays: list[list[int]]) -> bytes:
        # Not a real descriptor: the type, the rank, the address and the dimensions, so tests can see them.
        # The driver's own refusals: an address or a stride that is not a multiple of 16 bytes.
        dtype, rank, address = ins[:3]
        if address % 16 or any(stride % 16 for stride in arrays[1]):
            raise CudaError(INVALID_VALUE, "a tensor's address and strides are multiples of 16 bytes")
        return struct.pack("<iIQ", dtype, rank, address).ljust(32, b"\0") + struct.pack(
            f"<{rank}Q", *arrays[0]
        ).ljust(96, b"\0")

    def tensor_map_address(self, encoded: bytes, address: int) -> bytes:
        if address % 16:
            raise CudaError(INVALID_VALUE, "a tensor's address is a multiple of 16 bytes")
        return encoded[:8] + struct.pack("<Q", address) + encoded[16:]

    def tensor_map_alloc_class(self, encoded: bytes, alloc_class: int) -> tuple[bytes, int]:
        # The class in the pretend map's last word; AUTO is the conservative small window.
        effective = alloc_class or 1  # CU_TENSOR_MAP_ALLOC_CLASS_SMALL
        return encoded[:124] + struct.pack("<i", effective), effective

    # CUDA arrays: bytes row by row, slice by slice; texture and surface objects are plain handles.
    def cuArray3DCreate(self, shape):
        handle = next(self.ids)
        self.arrays[handle] = (shape, bytearray(shape.nbytes))
        self.array_device[handle] = self._ctx_device()
        self.made_in[handle] = self._ctx()
        return handle

    def cuArrayDestroy(self, handle):
        for index in (0, 1):  # an NV12 array's planes go with it
            self.arrays.pop(self.planes.pop((handle, index), 0), None)
        self.array_device.pop(handle, None)
        self.made_in.pop(handle, None)
        if self.arrays.pop(handle, None) is None:
            raise CudaError(INVALID_HANDLE, "array")

    def cuArray3DGetDescriptor(self, handle):
        return self.arrays[handle][0]

    def cuMipmappedArrayCreate(self, shape, levels):
        if not 1 <= levels <= max(shape.width, shape.height, shape.depth).bit_length():
            raise CudaError(INVALID_VALUE, f"{levels} levels")
        handle = next(self.ids)
        self.mipmaps[handle] = [self.cuArray3DCreate(shape.level(n)) for n in range(levels)]
        self.made_in[handle] = self._ctx()
        return handle

    def cuMipmappedArrayGetLevel(self, handle, level):
        levels = self.mipmaps[handle]
        if not 0 <= level < len(levels):
            raise CudaError(INVALID_VALUE, f"level {level}")
        return levels[level]

    def cuMipmappedArrayDestroy(self, handle):
        for level in self.mipmaps.pop(handle):
            self.arrays.pop(level, None)
        self.made_in.pop(handle, None)

    # The rest of arrays, modelled on 64 KiB tiles of 128 rows: an NV12 array's planes (the luma, and the
    # chroma at half the size in two channels), sparse properties, memory requirements, tile mappings.
    def cuArrayGetPlane(self, array, index):
        shape = self._array(array)
        if shape.format != NV12 or index not in (0, 1):
            raise CudaError(INVALID_VALUE, "a plane of an NV12 array: 0 or 1")
        if (array, index) not in self.planes:
            half = ArrayShape(max(shape.width // 2, 1), max(shape.height // 2, 1), 0, 0x01, 2)
            plane = ArrayShape(shape.width, shape.height, 0, 0x01, 1) if index == 0 else half
            self.planes[array, index] = self.cuArray3DCreate(plane)
        return self.planes[array, index]

    def _array(self, handle) -> ArrayShape:
        if handle not in self.arrays:
            raise CudaError(INVALID_HANDLE, "array")
        return self.arrays[handle][0]

    @staticmethod
    def _tile(shape: ArrayShape) -> tuple[int, int, int]:
        element = FORMAT_BYTES[shape.format] * shape.channels
        return max(TILE_BYTES // (element * TILE_ROWS), 1), TILE_ROWS if shape.height else 1, 1

    def _sparse_properties(self, shape: ArrayShape, levels: int) -> bytes:
        if not shape.flags & SPARSE:
            raise CudaError(INVALID_VALUE, "not a sparse array")
        tile = self._tile(shape)
        first = next(
            (n for n in range(levels) if shape.level(n).width < tile[0] or shape.level(n).rows < tile[1]),
            levels,
        )
        return SPARSE_PROPERTIES.pack(*tile, first, TILE_BYTES if first < levels else 0, 0)

    def cuArrayGetSparseProperties(self, array):
        return self._sparse_properties(self._array(array), 1)

    def cuMipmappedArrayGetSparseProperties(self, mipmap):
        levels = self._levels(mipmap)
        return self._sparse_properties(self._array(levels[0]), len(levels))

    def _levels(self, handle) -> list[int]:
        if handle not in self.mipmaps:
            raise CudaError(INVALID_HANDLE, "mipmapped array")
        return self.mipmaps[handle]

    def _requirements(self, shapes: list[ArrayShape], dev: int) -> bytes:
        self._device(dev)
        if not shapes[0].flags & DEFERRED_MAPPING:
            raise CudaError(INVALID_VALUE, "not an array of deferred mapping")
        size = sum(-(-s.nbytes // TILE_BYTES) * TILE_BYTES for s in shapes)
        return MEMORY_REQUIREMENTS.pack(size, TILE_BYTES)

    def cuArrayGetMemoryRequirements(self, array, dev):
        return self._requirements([self._array(array)], dev)

    def cuMipmappedArrayGetMemoryRequirements(self, mipmap, dev):
        return self._requirements([self._array(level) for level in self._levels(mipmap)], dev)

    def cuMemMapArrayAsync(self, mappings, stream):
        for m in mappings:
            shape = self._array(m.array) if m.kind == 0 else self._array(self._levels(m.array)[0])
            if not shape.flags & (SPARSE | DEFERRED_MAPPING):
                raise CudaError(
                    INVALID_VALUE, "tiles of an array that is neither sparse nor of deferred mapping"
                )
            if m.operation == 1 and m.memory not in self.created:
                raise CudaError(INVALID_HANDLE, "memory handle")
        for m in mappings:  # all checked: all done
            self.tiles_mapped[m.array] = self.tiles_mapped.get(m.array, 0) + (1 if m.operation == 1 else -1)

    # Legacy texture and surface references: settings kept per reference, what they bind checked.
    def _reference(self, module, name, surface: bool) -> int:
        declared = self.module_references.get((module, name))
        if declared is None or declared[0] != surface:
            raise CudaError(NOT_FOUND, name)
        if not declared[1]:  # one handle per name, as the driver gives
            declared[1] = self.cuTexRefCreate()
        return declared[1]

    def cuModuleGetTexRef(self, module, name):
        return self._reference(module, name, surface=False)

    def cuModuleGetSurfRef(self, module, name):
        return self._reference(module, name, surface=True)

    def cuTexRefCreate(self):
        handle = next(self.ids)
        self.references_of[handle] = {
            "array": 0, "mipmap": 0, "address": 0, "format": (0x20, 1), "modes": [0, 0, 0], "filter": 0,
            "mipmap_filter": 0, "bias": 0.0, "clamp": (0.0, 0.0), "anisotropy": 1, "border": (0.0,) * 4,
            "flags": 0,
        }  # fmt: skip
        return handle

    def _texref(self, tex) -> dict:
        if tex not in self.references_of:
            raise CudaError(INVALID_HANDLE, "texture reference")
        return self.references_of[tex]

    def cuTexRefDestroy(self, tex):
        self._texref(tex)
        del self.references_of[tex]

    def _bind_reference(self, tex, array=0, mipmap=0, address=0) -> None:
        self._texref(tex).update(array=array, mipmap=mipmap, address=address)

    def cuTexRefSetArray(self, tex, array, flags):
        self._array(array)
        self._bind_reference(tex, array=array)

    def cuTexRefSetMipmappedArray(self, tex, mipmap, flags):
        self._levels(mipmap)
        self._bind_reference(tex, mipmap=mipmap)

    def cuTexRefSetAddress(self, tex, ptr, size):
        self._find(ptr, size)
        self._bind_reference(tex, address=ptr)
        return 0  # no offset: any address is aligned here

    def cuTexRefSetAddress2D(self, tex, ptr, pitch, shape):
        self._find(ptr, pitch * (shape.rows - 1) + shape.row_bytes)
        self._bind_reference(tex, address=ptr)
        self._texref(tex)["format"] = (shape.format, shape.channels)

    def _set(self, tex, field, value, allowed: range | None = None):
        if allowed is not None:
            _in_range(value, allowed, field)
        self._texref(tex)[field] = value

    def cuTexRefSetFormat(self, tex, format_, components):
        if format_ not in FORMAT_BYTES or components not in (1, 2, 4):
            raise CudaError(INVALID_VALUE, "texture format")
        self._set(tex, "format", (format_, components))

    def cuTexRefSetAddressMode(self, tex, dim, mode):
        _in_range(mode, range(4), "address mode")  # WRAP, CLAMP, MIRROR, BORDER
        self._texref(tex)["modes"][_in_range(dim, range(3), "dimension")] = mode

    def cuTexRefSetFilterMode(self, tex, mode):
        self._set(tex, "filter", mode, range(2))  # POINT, LINEAR

    def cuTexRefSetMipmapFilterMode(self, tex, mode):
        self._set(tex, "mipmap_filter", mode, range(2))

    def cuTexRefSetMipmapLevelBias(self, tex, bias):
        self._set(tex, "bias", bias)

    def cuTexRefSetMipmapLevelClamp(self, tex, min_clamp, max_clamp):
        self._set(tex, "clamp", (min_clamp, max_clamp))

    def cuTexRefSetMaxAnisotropy(self, tex, max_aniso):
        self._set(tex, "anisotropy", max_aniso, range(1, 17))

    def cuTexRefSetBorderColor(self, tex, red, green, blue, alpha):
        self._set(tex, "border", (red, green, blue, alpha))

    def cuTexRefSetFlags(self, tex, flags):
        self._set(tex, "flags", flags, range(0x10))  # READ_AS_INTEGER, NORMALIZED_COORDINATES, SRGB, ...

    def _bound(self, tex, field) -> int:
        value = self._texref(tex)[field]
        if not value:
            raise CudaError(INVALID_VALUE, f"the reference is not bound to {field}")
        return value

    def cuTexRefGetAddress(self, tex):
        return self._bound(tex, "address")

    def cuTexRefGetArray(self, tex):
        return self._bound(tex, "array")

    def cuTexRefGetMipmappedArray(self, tex):
        return self._bound(tex, "mipmap")

    def cuTexRefGetAddressMode(self, tex, dim):
        return self._texref(tex)["modes"][_in_range(dim, range(3), "dimension")]

    def cuTexRefGetFilterMode(self, tex):
        return self._texref(tex)["filter"]

    def cuTexRefGetFormat(self, tex):
        return self._texref(tex)["format"]

    def cuTexRefGetMipmapFilterMode(self, tex):
        return self._texref(tex)["mipmap_filter"]

    def cuTexRefGetMipmapLevelBias(self, tex):
        return self._texref(tex)["bias"]

    def cuTexRefGetMipmapLevelClamp(self, tex):
        return self._texref(tex)["clamp"]

    def cuTexRefGetMaxAnisotropy(self, tex):
        return self._texref(tex)["anisotropy"]

    def cuTexRefGetBorderColor(self, tex):
        return self._texref(tex)["border"]

    def cuTexRefGetFlags(self, tex):
        return self._texref(tex)["flags"]

    def cuSurfRefSetArray(self, surf, array, flags):
        if not self._array(array).flags & SURFACE_LDST:
            raise CudaError(INVALID_VALUE, "a surface reference binds an array made for surfaces")
        self._bind_reference(surf, array=array)

    def cuSurfRefGetArray(self, surf):
        return self._bound(surf, "array")

    def cuParamSetTexRef(self, func, texunit, tex):
        self._texref(tex)
        if texunit != -1:  # CU_PARAM_TR_DEFAULT, the one texture unit
            raise CudaError(INVALID_VALUE, "texunit")

    def _sampler(self, res: bytes, tex: bytes = b"", view: bytes | None = None) -> int:
        handle = next(self.sampler_values)
        self.samplers[handle] = (bytes(res), bytes(tex), bytes(view) if view else None)
        self.made_in[handle] = getattr(self.local, "ctx", 0)
        return handle

    def cuTexObjectCreate(self, res, tex, view):
        return self._sampler(res, tex, view)

    def cuSurfObjectCreate(self, res):
        return self._sampler(res)

    def cuTexObjectDestroy(self, handle):
        if self.samplers.pop(handle, None) is None:
            raise CudaError(INVALID_VALUE)
        self.made_in.pop(handle, None)

    cuSurfObjectDestroy = cuTexObjectDestroy

    def cuTexObjectGetResourceDesc(self, tex):
        return self.samplers[tex][0]

    def cuTexObjectGetTextureDesc(self, tex):
        return self.samplers[tex][1]

    def cuTexObjectGetResourceViewDesc(self, tex):
        view = self.samplers[tex][2]
        if view is None:
            raise CudaError(INVALID_VALUE, "the texture has no resource view")
        return view

    cuSurfObjectGetResourceDesc = cuTexObjectGetResourceDesc

    def _rows(self, side: CopySide, extent: tuple[int, int, int], host: bytearray | bytes | None):
        """(buffer, offset) of each row a copy touches on one side, slice by slice."""
        width, height, depth = extent
        if side.kind == ARRAY:
            shape, data = self.arrays[side.at]
            if (
                side.x + width > shape.row_bytes
                or side.y + height > shape.rows
                or side.z + depth > shape.slices
            ):
                raise CudaError(INVALID_VALUE, "rows outside the array")
            pitch, rows = shape.row_bytes, shape.rows
        for k in range(depth):
            for j in range(height):
                if side.kind == HOST:
                    yield host, (k * height + j) * width
                elif side.kind == ARRAY:
                    yield data, side.x + ((side.z + k) * rows + side.y + j) * pitch
                else:
                    yield self._find(
                        side.at + side.x + ((side.z + k) * side.height + side.y + j) * side.pitch, width
                    )

    def copy_3d(self, src, dst, extent, stream, data):
        width, height, depth = extent
        out = bytearray(width * height * depth) if dst.kind == HOST else None
        pairs = list(zip(self._rows(src, extent, data), self._rows(dst, extent, out), strict=True))
        for (src_buffer, at), (dst_buffer, to) in pairs:
            dst_buffer[to : to + width] = src_buffer[at : at + width]
        return out

    def launch_host_func(self, stream, fn) -> None:
        self._on(stream, fn, kind=3)  # everything here runs at once, in order (or at each launch of a graph)

    def reserve_addresses(self, size: int, hint: int) -> int:
        with self.lock:  # at `hint` unless it overlaps a range reserved before, as the driver does
            while any(b < hint + size and hint < b + n for b, n in self.reserved.items()):
                hint += 1 << 40
            self.reserved[hint] = size
        return hint

    def release_addresses(self, base: int, size: int) -> None:
        with self.lock:
            if self.reserved.get(base) != size:
                raise CudaError(INVALID_VALUE, "not a reserved range")
            del self.reserved[base]

    def map_memory(self, base: int, size: int, device: int, exportable: bool = False):
        self._place(base, size, device)
        self.mapped.add(base)
        if not exportable:
            return base
        # exportable: the bytes live in a memfd, which another worker process of the lease maps too
        fd = os.memfd_create("gpupool-lease-memory")
        os.ftruncate(fd, size)
        shared = mmap.mmap(fd, size)
        with self.lock:
            self.memory[base] = memoryview(shared)
        self.exportable[base] = (fd, shared)
        return base

    def unmap_memory(self, base: int, size: int, backing) -> None:
        self._free(base)
        self.mapped.discard(base)
        shared = self.exportable.pop(base, None)
        if shared is not None:
            os.close(shared[0])  # the mapping goes with the last view of it

    def export_memory(self, backing) -> int:
        if backing not in self.exportable:
            raise CudaError(INVALID_VALUE, "memory made without an exportable handle type")
        return os.dup(self.exportable[backing][0])

    def import_memory(self, fd: int, base: int, size: int, device: int):
        with self.lock:  # into a range reserved for it, as cuMemMap wants
            if not any(b <= base and base + size <= b + n for b, n in self.reserved.items()):
                raise CudaError(INVALID_VALUE, f"[0x{base:x}, +{size}) is not in a reserved range")
        shared = mmap.mmap(fd, size)
        self._place(base, 0, device)
        with self.lock:
            self.memory[base] = memoryview(shared)
        return shared

    def unmap_imported(self, base: int, size: int, backing) -> None:
        self._free(base)

    def export_vm(self, handle: int) -> int:
        if handle not in self.created or handle not in self.vm_descriptors:
            raise CudaError(INVALID_VALUE, "not memory created here to be shared as a POSIX file descriptor")
        return os.dup(self.vm_descriptors[handle])

    def import_vm(self, fd: int, device: int) -> int:
        imported = next(self.ids)
        self.created[imported], self.references[imported] = device, 1
        self.backing[imported] = mmap.mmap(fd, os.fstat(fd).st_size)
        return imported

    def ipc_event_handle(self, event: int) -> bytes:
        self._event(event)
        return b"gpupool host event".ljust(64, b"\0")

    def ipc_open_event(self, handle: bytes) -> int:
        # every call here has run when it returns: the exporter's records are done, so is this event
        return self.cuEventCreate(0x6)  # DISABLE_TIMING | INTERPROCESS

    # The virtual memory API: each mapping is memory of its own here (two mappings of one handle do
    # not share bytes, as they do on a GPU).
    def cuMemCreate(self, size, device, handle_types, usage=0):
        handle = next(self.ids)
        self.created[handle] = device
        self.references[handle] = 1
        if handle_types & 1:  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: bytes another worker process can map
            fd = self.vm_descriptors[handle] = os.memfd_create("gpupool-vm-memory")
            os.ftruncate(fd, size)
            self.backing[handle] = mmap.mmap(fd, size)
        else:
            self.backing[handle] = bytearray(size)
        self.vm_made[handle] = (size, device, handle_types, usage)
        return handle

    def cuMemImportFromShareableHandle(self, handle):
        """Another handle to the same memory, as the driver's import of an exported descriptor gives."""
        if handle not in self.created:
            raise CudaError(INVALID_VALUE, "not created memory")
        imported = next(self.ids)
        self.created[imported] = self.created[handle]
        self.references[imported] = 1
        self.backing[imported] = self.backing[handle]
        return imported

    # Multicast objects: a handle mapped as created memory is, with bytes of its own here (the GPU's switch
    # copies a write through it to every bound memory, which this executor does not model); each device
    # added, each binding kept and checked as the driver checks it.
    def cuMulticastCreate(self, devices, size, flags):
        if not size or size % MULTICAST_GRANULARITY:
            raise CudaError(INVALID_VALUE, "a multicast object's size is a multiple of its granularity")
        handle = next(self.ids)
        self.created[handle], self.references[handle] = 0, 1
        self.backing[handle] = bytearray(size)
        self.multicast[handle] = [devices, set(), {}]
        return handle

    def _multicast(self, mc, offset, size) -> list:
        if mc not in self.multicast or mc not in self.created:
            raise CudaError(INVALID_VALUE, "not a multicast object")
        if offset % MULTICAST_GRANULARITY or size % MULTICAST_GRANULARITY:
            raise CudaError(INVALID_VALUE, "offsets and sizes are multiples of the granularity")
        return self.multicast[mc]

    def cuMulticastAddDevice(self, mc, dev):
        devices, added, _ = self._multicast(mc, 0, 0)
        if len(added | {self._device(dev)}) > devices:
            raise CudaError(INVALID_VALUE, "more devices than the multicast object was made for")
        added.add(dev)

    def _bind(self, mc, mc_offset, device, size) -> None:
        _, added, bound = self._multicast(mc, mc_offset, size)
        if device not in added:
            raise CudaError(CUresult.INVALID_DEVICE, "a device not added to the multicast object")
        bound[device, mc_offset] = size

    def cuMulticastBindMem(self, mc, mc_offset, memory, mem_offset, size, flags):
        if memory not in self.created or memory in self.multicast:
            raise CudaError(INVALID_HANDLE, "memory handle")
        self._bind(mc, mc_offset, self.created[memory], size)

    def cuMulticastBindAddr(self, mc, mc_offset, ptr, size, flags):
        _, offset = self._find(ptr, size)
        self._bind(mc, mc_offset, self.owner[ptr - offset], size)

    def cuMulticastUnbind(self, mc, dev, mc_offset, size):
        _, _, bound = self._multicast(mc, mc_offset, size)
        if bound.get((dev, mc_offset)) != size:
            raise CudaError(INVALID_VALUE, "not a binding of that device there")
        del bound[dev, mc_offset]

    # Logical endpoints: ids from a counter, endpoints as (type, size, devices, bindings); every binding
    # within the endpoint, as the driver checks.
    def cuLogicalEndpointIdReserve(self, count):
        base = self.next_endpoint_id
        self.next_endpoint_id += count
        return base

    def cuLogicalEndpointIdRelease(self, base, count):
        pass

    def cuLogicalEndpointCreate(self, le, kind, devices, size, flags):
        if not size or size % MULTICAST_GRANULARITY:
            raise CudaError(INVALID_VALUE, "an endpoint's size is a multiple of its bind alignment")
        self.endpoints[le] = [kind, size, {devices} if kind == 1 else set(), {}]

    def _endpoint(self, le, dev, offset, size):
        _, total, devices, bound = self.endpoints[le]
        if dev not in devices or offset % MULTICAST_GRANULARITY or size % MULTICAST_GRANULARITY:
            raise CudaError(INVALID_VALUE, "a device of the endpoint, at aligned offsets")
        if offset + size > total:
            raise CudaError(INVALID_VALUE, "past the endpoint's end")
        return bound

    def cuLogicalEndpointAddDevice(self, le, dev):
        kind, _, devices, _ = self.endpoints[le]
        if kind != 2:
            raise CudaError(INVALID_VALUE, "a unicast endpoint has its one device")
        devices.add(self._device(dev))

    def cuLogicalEndpointDestroy(self, le):
        del self.endpoints[le]

    def cuLogicalEndpointBindAddr(self, le, dev, offset, ptr, size, flags):
        self._find(ptr, size)
        self._endpoint(le, dev, offset, size)[dev, offset] = (size, ptr)

    def cuLogicalEndpointBindMem(self, le, dev, offset, memory, mem_offset, size, flags):
        if memory not in self.created:
            raise CudaError(INVALID_HANDLE, "memory handle")
        self._endpoint(le, dev, offset, size)[dev, offset] = (size, None)

    def cuLogicalEndpointUnbind(self, le, dev, offset, size):
        bound = self._endpoint(le, dev, offset, size)
        if bound.get((dev, offset), (None,))[0] != size:
            raise CudaError(INVALID_VALUE, "not a binding of that device there")
        del bound[dev, offset]

    def _endpoint_address(self, le, offset, size):
        """The device address behind [offset, offset + size) of a unicast endpoint: memory bound by address
        (memory bound as a handle is not modelled: CUDA_ERROR_NOT_SUPPORTED)."""
        for (_, at), (length, ptr) in self.endpoints[le][3].items():
            if at <= offset and offset + size <= at + length:
                if ptr is None:
                    raise CudaError(CUresult.NOT_SUPPORTED, "copies to memory bound as a handle")
                return ptr + offset - at
        raise CudaError(INVALID_VALUE, "no memory bound there")

    def cuFabricCpyBatchAsync(self, operations, flags, stream):
        if flags:
            raise CudaError(INVALID_VALUE, "flags")
        copies = []
        for src_type, src, src_at, dst_type, dst, dst_at, size, _ in operations:
            if not size:
                continue
            source = src if src_type == 0 else self._endpoint_address(src & 0xFFFFFFFF, src_at, size)
            target = dst if dst_type == 0 else self._endpoint_address(dst & 0xFFFFFFFF, dst_at, size)
            copies.append((target, source, size))
        for target, source, size in copies:
            self.cuMemcpyDtoDAsync(target, source, size, stream)

    def cuLogicalEndpointGetLimits(self, kind, devices, size, flags):
        return MULTICAST_GRANULARITY, DEVICE_TOTAL

    def cuLogicalEndpointQuery(self, le, count):
        return int(all(i in self.endpoints for i in range(le, le + count)))

    def cuMulticastGetGranularity(self, devices, size, flags, option):
        _in_range(option, range(2), "granularity option")  # MINIMUM, RECOMMENDED
        return MULTICAST_GRANULARITY

    def cuMemRelease(self, handle):
        if handle not in self.created:
            raise CudaError(INVALID_VALUE)
        self.references[handle] -= 1
        if not self.references[handle]:
            del self.created[handle], self.references[handle]
            self.backing.pop(handle, None)  # its mappings keep the bytes while they last
            if handle in self.vm_descriptors:
                os.close(self.vm_descriptors.pop(handle))
            self.multicast.pop(handle, None)
            self._vm_forget()

    def _vm_forget(self) -> None:
        """cuMemCreate memory neither held nor mapped any more is gone."""
        mapped = set(self.mapped_handles.values())
        for handle in [h for h in self.vm_made if h not in self.created and h not in mapped]:
            del self.vm_made[handle]

    def cuMemRetainAllocationHandle(self, addr):
        _, offset = self._find(addr, 0)
        handle = self.mapped_handles.get(addr - offset)
        if handle is None:
            raise CudaError(INVALID_VALUE, "not mapped memory")
        self.created.setdefault(handle, self.owner[addr - offset])
        self.references[handle] = self.references.get(handle, 0) + 1
        return handle

    def cuMemMap(self, ptr, size, offset, handle, flags):
        self._place(ptr, size, self.created[handle])
        backing = self.backing.get(handle)
        if backing is not None:  # every mapping of one memory (in any process of the lease) shares its bytes
            with self.lock:
                self.memory[ptr] = memoryview(backing)[offset : offset + size]
        self.mapped_handles[ptr] = handle
        self.map_offsets[ptr] = offset

    def cuMemUnmap(self, ptr, size):
        for base in [b for b in self.bases if ptr <= b < ptr + size]:
            self._free(base)
            self.mapped_handles.pop(base, None)
            self.map_offsets.pop(base, None)
            for key in [k for k in self.access if k[0] == base]:
                del self.access[key]
        self._vm_forget()

    def cuMemSetAccess(self, ptr, size, access):
        for base in [b for b in self.mapped_handles if ptr <= b < ptr + size]:
            for device, flags in access:
                self.access[base, device] = flags

    def cuMemGetAccess(self, ptr, device):
        _, offset = self._find(ptr, 0)
        return self.access.get((ptr - offset, device), 0)  # CU_MEM_ACCESS_FLAGS_PROT_NONE until granted

    def cuMemGetAllocationGranularity(self, device, option):
        return ALIGN

    def host_allocation_granularity(self, option):
        return mmap.PAGESIZE  # host memory comes in pages

    def set_context(self, ctx: int) -> None:
        self.local.ctx = ctx

    # Live migration. This host's "GPUs" are GPUPOOL_HOST_EXECUTOR_GPUS (default 2) labels on host memory;
    # a move copies the device's memory into new buffers at the same addresses (the target's memory),
    # re-creates the lease's contexts and their objects as the CUDA executor does (new handle values the
    # worker maps the client's to: CI exercises that translation), and swaps the memory in at the end.
    # GPUPOOL_HOST_EXECUTOR_FAILING_GPUS (a comma list) makes a copy to those GPUs fail after the first
    # allocation: a target that dies mid-way (the tests' seam).
    def _parts(self) -> set[int]:
        """Arrays that are parts of another: mipmapped arrays' levels, NV12 arrays' planes."""
        return {level for arrays in self.mipmaps.values() for level in arrays} | set(self.planes.values())

    def carry_refusal(self) -> str:
        parts = self._parts()
        shapes = [shape for a, (shape, _) in self.arrays.items() if a not in parts]
        return next((why for why in map(unmovable, shapes) if why), "")

    def held_objects(self) -> HeldObjects:
        parts = self._parts()
        held = [h for h in self.vm_made if h in self.created]
        released = [h for h in self.vm_made if h not in self.created]
        return HeldObjects(
            [(a, self.made_in[a], shape) for a, (shape, _) in self.arrays.items() if a not in parts],
            [(m, self.made_in[m], self.arrays[arrays[0]][0], len(arrays), list(arrays))
             for m, arrays in self.mipmaps.items()],
            [(value, self.made_in[value], res, tex or None, view)
             for value, (res, tex, view) in self.samplers.items()],
            [(h, *self.vm_made[h], h in self.created) for h in [*held, *released]],
            [(at, len(self.memory[at]), self.map_offsets.get(at, 0), h) for at, h in self.mapped_handles.items()],
            [(at, len(self.memory[at]), [(device, flags)]) for (at, device), flags in self.access.items()],
        )  # fmt: skip

    def migration_refusal(self, target: int, holding: dict[str, int], uuid: str = "") -> str | None:
        gpus = int(os.environ.get("GPUPOOL_HOST_EXECUTOR_GPUS", "2"))
        if not 0 <= target < gpus:
            return f"this host has no GPU {target} (it has {gpus})"
        return None

    def migrate(
        self, device: int, target: int, mappings: list, recreate: Callable[[], list], uuid: str = ""
    ) -> dict:
        failing = {int(g) for g in os.environ.get("GPUPOOL_HOST_EXECUTOR_FAILING_GPUS", "").split(",") if g}
        with self.lock:
            bases = [b for b in self.bases if self.owner[b] == device]
        arrays = [a for a in self.arrays if self.array_device.get(a) == device]
        copies: dict[int, bytearray] = {}
        array_copies: dict[int, tuple[ArrayShape, bytearray]] = {}
        for base in bases:  # the calls are paused: nothing changes these buffers while they are copied
            if target in failing and copies:
                raise CudaError(CUresult.DEVICE_UNAVAILABLE, f"GPU {target} failed during the copy")
            copies[base] = bytearray(self.memory[base])
        for array in arrays:
            shape, data = self.arrays[array]
            array_copies[array] = (shape, bytearray(data))
        source = self._gpu(device)
        self.gpu[device] = target  # its objects are made on the target from here
        try:
            made = recreate()  # the lease's contexts and their objects anew, with new handle values
        except BaseException:
            self.gpu[device] = source
            raise
        with self.lock:
            self._retire(made)  # commit: the lease's memory is the target's from here on
            self.memory.update(copies)
            arrays_made = self._arrays_renamed(array_copies) + self._memory_renamed(device)
        contexts = {old: new for ns, old, new in made if ns == "ctx"}
        renamed = {old: new for _, old, new in arrays_made}
        self.made_in = {renamed.get(h, h): contexts.get(ctx, ctx) for h, ctx in self.made_in.items()}
        # The source's primary context let go, as the CUDA executor does.
        self.primary_retains.pop(source, None)
        self.primary_flags.pop(source, None)
        moved = [*copies.values(), *(data for _, data in array_copies.values())]
        return {"bytes": sum(len(c) for c in moved), "uuid": f"GPU-host-{target}", "made": arrays_made}

    def _memory_renamed(self, device: int) -> list[tuple[str, int, int]]:
        """The program's own virtual memory of the moved device (cuMemCreate's) becomes the target's, with new
        handle values as the CUDA executor's move gives them (the worker maps the client's). [(namespace,
        old, new)]."""
        renamed = {
            h: next(self.ids) for h, d in self.created.items() if d == device and h not in self.multicast
        }
        for old, new in renamed.items():
            self.created[new] = self.created.pop(old)
            self.references[new] = self.references.pop(old)
            if old in self.backing:
                self.backing[new] = self.backing.pop(old)
            if old in self.vm_descriptors:
                self.vm_descriptors[new] = self.vm_descriptors.pop(old)
            if old in self.vm_made:
                self.vm_made[new] = self.vm_made.pop(old)
        self.mapped_handles = {at: renamed.get(h, h) for at, h in self.mapped_handles.items()}
        return [("vmem", *pair) for pair in renamed.items()]

    def _arrays_renamed(self, copies: dict[int, tuple[ArrayShape, bytearray]]) -> list[tuple[str, int, int]]:
        """The moved arrays become the target's arrays, with new handle values as a GPU's driver gives them
        (the worker maps the client's values: CI exercises that), and so do their mipmapped arrays, planes
        and tiles; texture and surface objects keep their values and name the new arrays. [(namespace, old,
        new)]."""
        renamed = {old: next(self.ids) for old in copies}
        for old, new in renamed.items():
            del self.arrays[old]
            self.arrays[new] = copies[old]
            self.array_device[new] = self.array_device.pop(old)
        remipped = {
            m: next(self.ids) for m, levels in self.mipmaps.items() if levels and levels[0] in renamed
        }
        for old, new in remipped.items():
            self.mipmaps[new] = [renamed.get(level, level) for level in self.mipmaps.pop(old)]
        self.planes = {(renamed.get(a, a), i): renamed.get(p, p) for (a, i), p in self.planes.items()}
        self.tiles_mapped = {renamed.get(a, remipped.get(a, a)): n for a, n in self.tiles_mapped.items()}

        def mapped(ns: str, handle: int) -> int:
            return (renamed if ns == "array" else remipped).get(handle, handle)

        for value, (res, tex, view) in list(self.samplers.items()):
            self.samplers[value] = (resource_mapped(res, mapped), tex, view)
        return [("array", *pair) for pair in renamed.items()] + [
            ("mipmap", *pair) for pair in remipped.items()
        ]

    def _retire(self, made: list[tuple[str, int, int]]) -> None:
        """The contexts, streams, events, functions and graph nodes a move re-created are gone from the
        source, as on a GPU: a call that still names one (the worker failed to map the client's value to
        the new one), or a graph left on the source that runs one, fails."""
        gone = {"ctx": self.contexts, "event": self.events, "node": self.nodes, "func": self.functions}
        for kind, old, new in made:
            if old == new:
                continue
            gone.get(kind, {}).pop(old, None)
            if kind == "stream":
                self.streams.discard(old)

    def copy_to_device(self, dst, count, stream, fill) -> None:
        self._ctx()  # as the driver: a copy needs a current context (CUDA_ERROR_INVALID_CONTEXT)
        mem, off = self._span(dst, count)
        view = memoryview(mem)
        for start in range(0, count, CHUNK):
            fill(view[off + start : off + min(count, start + CHUNK)])

    def copy_from_device(self, src, count, stream, send) -> None:
        self._ctx()
        mem, off = self._span(src, count)
        view = memoryview(mem)  # sent from where it lies, as the CUDA executor sends its staging buffer
        for start in range(0, count, CHUNK):
            send(view[off + start : off + min(count, start + CHUNK)])

    def copy_pinned_captured(self, device, shared, offset, count, stream, to_device) -> None:
        def copy() -> None:  # at each launch of the graph, with the pages as they are then
            mem, off = self._span(device, count)
            if to_device:
                mem[off : off + count] = shared.view[offset : offset + count]
            else:
                shared.view[offset : offset + count] = memoryview(mem)[off : off + count]

        self._on(stream, copy)

    def copy_from_device_async(self, src, count, stream) -> StagedCopy:
        mem, off = self._span(src, count)
        if self.copies_later:  # its bytes taken now, sent by the delivery thread as a GPU's copy is
            return CopiedBytes(bytes(memoryview(mem)[off : off + count]))
        return _Copied(memoryview(mem)[off : off + count])  # streams run at once here: the copy is done

    def _on(self, stream, work, kind: int = 0, described=None) -> None:
        """Run stream work now, or record it when the stream is being captured into a graph: a node of
        CUgraphNodeType `kind` that `described` describes (a kernel's launch, a copy, a memset's shape), as
        the driver's captured nodes can be read back."""
        capture = self.capturing.get(stream)
        if capture is None:
            work()
            return
        if isinstance(capture[2], _Recapture):
            capture[1] = [self._recapture_node(capture, work, kind, described)]
            return
        node = self._add_node(capture[0], capture[1], work)
        capture[1] = [node]  # the next captured work comes after it
        if kind:
            self.node_types[node] = kind
        if described is not None:
            {0: self.launches, 1: self.copies, 2: self.memsets}[kind][node] = described

    def memset(self, dst: int, value: int, element_size: int, count: int, stream: int | None) -> None:
        def work():
            mem, off = self._span(dst, element_size * count)
            mem[off : off + element_size * count] = value.to_bytes(element_size, "little") * count

        self._on(stream, work, kind=2, described=(dst, element_size * count, value, element_size, count, 1))

    def param_layout(self, func: int, is_kernel: bool) -> list[tuple[int, int]]:
        return self.layouts.get(func) or HOST_KERNELS[self.functions[func]]

    def launch(self, launch: Launch) -> None:
        func, grid, block, params = launch.func, launch.grid, launch.block, launch.params
        for attr_id, value in launch.attributes:
            if attr_id not in FORWARDED_LAUNCH_ATTRIBUTES:  # the same refusals as on a GPU
                raise CudaError(CUresult.NOT_SUPPORTED, f"launch attribute {attr_id} is not forwarded")
            if attr_id == COOPERATIVE and struct.unpack_from("<i", value)[0]:
                self._check_cooperative(launch)
        params = bytes(params)  # a captured launch runs later, with the parameters of its capture
        work = lambda: self._run_kernel(func, grid, block, params)  # noqa: E731
        self._on(launch.stream, work, described=replace(launch, params=params))

    def launch_multi_device(self, launches, flags):
        """Each launch checked as a cooperative one's, then all run, one after the other (the blocks of every
        launch run at once here, which any synchronisation across them needs)."""
        for launch in launches:
            self._check_cooperative(launch)
        for launch in launches:
            self.launch(launch)

    def _check_cooperative(self, launch: Launch) -> None:
        """All blocks of a cooperative launch must fit on the device at once (occupancy x SMs)."""
        threads = launch.block[0] * launch.block[1] * launch.block[2]
        per_sm = self.cuOccupancyMaxActiveBlocksPerMultiprocessor(launch.func, threads, launch.shared_mem)
        if launch.grid[0] * launch.grid[1] * launch.grid[2] > per_sm * ATTRIBUTES[16]:
            raise CudaError(
                CUresult.COOPERATIVE_LAUNCH_TOO_LARGE, "more blocks than fit on the device at once"
            )

    def _run_kernel(self, func, grid, block, params) -> None:
        if func in self.layouts:
            return  # a kernel of a PTX image: it runs as a no-op (its parameters did arrive)
        name = self.functions.get(func)
        if name is None:  # a function of a context a move left behind
            raise CudaError(INVALID_HANDLE, f"function 0x{func:x}")
        if self.trapped:
            raise CudaError(self.trapped, "a kernel asserted earlier: the context is unusable")
        if name == "fault":
            raise CudaError(CUresult.ILLEGAL_ADDRESS, "the fault kernel touched a wild address")
        if name == "trap":
            self.trapped = CUresult.ASSERT
            raise CudaError(CUresult.ASSERT, "the trap kernel asserted")
        if name == "spin":
            time.sleep(0.01)
            return
        if name == "empty":
            return
        if name == "sleep_ms":
            time.sleep(struct.unpack_from("<I", params)[0] / 1000)
            return
        if name == "printf_u32":  # the driver writes device printf output to the process's stdout
            os.write(1, f"kernel says {struct.unpack_from('<I', params)[0]}\n".encode())
            return
        if name in ("set_condition", "count_down"):
            handle, arg = struct.unpack_from("<QQ", params.ljust(16, b"\0"))
            if name == "count_down":
                mem, off = self._find(arg, 4)
                counter = memoryview(mem)[off : off + 4].cast("I")
                counter[0] = max(counter[0] - 1, 0)
                arg = counter[0]
            self.conditions[handle][0] = 1 if arg & 0xFFFFFFFF else 0
            return
        if name == "saxpy":
            x_ptr, y_ptr, a, n = struct.unpack_from("<QQfI", params)
            xm, xo = self._find(x_ptr, 4 * n)
            ym, yo = self._find(y_ptr, 4 * n)
            x = memoryview(xm)[xo : xo + 4 * n].cast("f")
            y = memoryview(ym)[yo : yo + 4 * n].cast("f")
            for i in range(n):
                y[i] = a * x[i] + y[i]
            return
        ptr, value, n = struct.unpack_from("<QII", params)
        mem, off = self._find(ptr, 4 * n)
        words = memoryview(mem)[off : off + 4 * n].cast("I")
        for i in range(min(n, grid[0] * block[0])):
            words[i] = value if name == "fill_u32" else (words[i] + value) & 0xFFFFFFFF

    def cluster_occupancy(self, name: str, launch: Launch) -> int:
        return 1  # one cluster at a time, of one block

    # -- the calls -----------------------------------------------------------------------------------

    def cuInit(self, flags):
        return None

    def cuDriverGetVersion(self):
        # a driver as new as the call table's newest ABI, unless a test names another (13000: the 580 driver)
        return int(os.environ.get("GPUPOOL_HOST_EXECUTOR_DRIVER", 0)) or NEWEST_ABI

    def cuDeviceGet(self, ordinal):
        if not 0 <= ordinal < self.n:
            raise CudaError(CUresult.INVALID_DEVICE)
        return ordinal

    def cuDeviceGetCount(self):
        return self.n

    def cuDeviceGetName(self, length, dev):
        return f"gpupool host executor {dev} (tests only)"

    def cuDeviceGetUuid(self, dev):
        return bytes([0x60 + dev] * 16)

    def cuDeviceGetPCIBusId(self, length, dev):
        return f"0000:{dev:02x}:00.0"

    def cuDeviceTotalMem(self, dev):
        return DEVICE_TOTAL

    def cuDeviceGetAttribute(self, attrib, dev):
        return ATTRIBUTES.get(attrib, 0)

    def cuDeviceComputeCapability(self, dev):
        return 9, 0

    def cuDeviceCanAccessPeer(self, dev, peer):
        return 1

    def cuDeviceGetP2PAttribute(self, attrib, src, dst):
        if self._device(src) == self._device(dst):
            raise CudaError(CUresult.INVALID_DEVICE, "a device is not its own peer")
        return {1: 0}.get(attrib, 1)  # PERFORMANCE_RANK 0; access, atomics, arrays supported

    def cuDeviceGetP2PAtomicCapabilities(self, operations, src, dst):
        if self._device(src) == self._device(dst):
            raise CudaError(CUresult.INVALID_DEVICE, "a device is not its own peer")
        # CUatomicOperationCapability: SIGNED | UNSIGNED | SCALAR_32 | SCALAR_64 for every operation kind
        return [1 | 2 | 8 | 16 for _ in operations]

    # The modelled GPUs are in no NVLink fabric: no cluster, no clique.
    def cuDeviceGetFabricClusterUuid(self, dev):
        self._device(dev)
        raise CudaError(CUresult.NOT_SUPPORTED, "the device is in no NVLink fabric")

    def cuDeviceGetCliqueCount(self, dev):
        self._device(dev)
        return 0

    def cuDeviceGetCliqueInfo(self, dev, capacity):
        self._device(dev)
        return []

    def cuDeviceGetTexture1DLinearMaxWidth(self, format_, channels, dev):
        self._device(dev)
        return 1 << 28

    def cuCtxEnablePeerAccess(self, peer, flags):
        mine, theirs = self._ctx(), peer
        if self.contexts[mine] == self.contexts[theirs]:
            raise CudaError(CUresult.INVALID_DEVICE, "a context of the same device")
        if (mine, theirs) in self.peers:
            raise CudaError(CUresult.PEER_ACCESS_ALREADY_ENABLED)
        self.peers.add((mine, theirs))

    def cuCtxDisablePeerAccess(self, peer):
        if (self._ctx(), peer) not in self.peers:
            raise CudaError(CUresult.PEER_ACCESS_NOT_ENABLED)
        self.peers.discard((self._ctx(), peer))

    def cuDeviceGetMemPool(self, dev):
        return self.current_pools[dev]

    def cuDeviceGetDefaultMemPool(self, dev):
        return 0xB0000 + dev

    def cuDeviceSetMemPool(self, dev, pool):
        if self.pools.get(pool) != dev:  # as the driver: a pool of another device is refused
            raise CudaError(CUresult.INVALID_VALUE, "the pool is not of this device")
        self.current_pools[dev] = pool

    # The host executor's driver writes no log messages: its log stays empty.
    def cuLogsCurrent(self, flags):
        if flags:
            raise CudaError(CUresult.INVALID_VALUE, "flags are reserved")
        return 0

    def cuLogsDumpToMemory(self, iterator, size, flags):
        if flags or not size:
            raise CudaError(CUresult.INVALID_VALUE, "flags are reserved; a buffer holds at least the NUL")
        return 0, b""

    def cuFlushGPUDirectRDMAWrites(self, target, scope):
        if target != 0 or scope not in (100, 200):  # CURRENT_CTX; TO_OWNER, TO_ALL_DEVICES
            raise CudaError(CUresult.INVALID_VALUE, "flush target or scope")

    def cuMemPoolCreate(self, device, handle_types, max_size):
        pool = next(self.ids)
        self.pools[pool] = device
        return pool

    def cuMemPoolDestroy(self, pool):
        if 0xB0000 <= pool < 0xB0000 + self.n or self.pools.pop(pool, None) is None:
            raise CudaError(INVALID_VALUE, "a device's own pool, or not a pool")
        for dev, current in self.current_pools.items():  # as the driver: the device's own pool again
            if current == pool:
                self.current_pools[dev] = 0xB0000 + dev

    def _gpu(self, dev: int) -> int:
        """The host "GPU" lease device `dev` is on: where a move put it; before any, one of its own."""
        return self.gpu.get(dev, -1 - dev)

    def cuDevicePrimaryCtxRetain(self, dev):
        gpu = self._gpu(dev)
        self.primary_retains[gpu] = self.primary_retains.get(gpu, 0) + 1
        return 0xC0000 + dev

    def cuCtxCreate(self, flags, dev):
        ctx = next(self.ids)
        self.contexts[ctx] = dev
        return ctx

    def cuCtxDestroy(self, ctx):
        if self.contexts.pop(ctx, None) is None:
            raise CudaError(CUresult.INVALID_CONTEXT, "context")

    def cuDevicePrimaryCtxRelease(self, dev):
        gpu = self._gpu(dev)
        self.primary_retains[gpu] = max(0, self.primary_retains.get(gpu, 0) - 1)

    def cuDevicePrimaryCtxGetState(self, dev):
        gpu = self._gpu(dev)
        return self.primary_flags.get(gpu, 0), int(self.primary_retains.get(gpu, 0) > 0)

    def cuDevicePrimaryCtxSetFlags(self, dev, flags):
        self.primary_flags[self._gpu(dev)] = flags

    def cuDevicePrimaryCtxReset(self, dev):
        self.primary_retains[self._gpu(dev)] = 0

    def cuCtxSynchronize(self):
        self._ctx_device()
        self._alive()

    def _alive(self) -> None:
        """A context where a kernel asserted fails everything after (a sticky error, until the process ends)."""
        if self.trapped:
            raise CudaError(self.trapped, "a kernel asserted earlier: the context is unusable")

    def cuCtxGetApiVersion(self, ctx):
        return 13000

    def cuCtxGetFlags(self):
        return self.context_flags.get(self._ctx(), 0)

    def cuCtxSetFlags(self, flags):
        self.context_flags[self._ctx()] = flags

    def cuCtxResetPersistingL2Cache(self):
        return None  # no L2 here

    def cuCtxRecordEvent(self, ctx, event):
        self.cuEventRecord(event, 0)  # all the context's work so far is done here

    def cuCtxWaitEvent(self, ctx, event):
        return None  # work here runs at once, in order

    def cuCtxGetLimit(self, limit):
        return 1024

    def cuCtxSetLimit(self, limit, value):
        return None

    # Cache and shared-memory configuration: kept per context, checked as the driver checks them.
    def cuCtxGetCacheConfig(self):
        return self.cache_config.get(self._ctx(), 0)  # CU_FUNC_CACHE_PREFER_NONE

    def cuCtxSetCacheConfig(self, config):
        self.cache_config[self._ctx()] = _in_range(config, CACHE_CONFIGS, "CUfunc_cache")

    def cuCtxGetSharedMemConfig(self):
        return self.shared_config.get(self._ctx(), 1)  # CU_SHARED_MEM_CONFIG_FOUR_BYTE_BANK_SIZE

    def cuCtxSetSharedMemConfig(self, config):
        self.shared_config[self._ctx()] = _in_range(config, SHARED_CONFIGS, "CUsharedconfig")

    def cuCtxGetStreamPriorityRange(self):
        return 0, -5

    def cuCtxGetId(self, ctx):
        return ctx

    def cuProfilerStart(self):
        return None  # no profiler here: a no-op, as on a GPU nothing profiles

    cuProfilerStop = cuProfilerStart

    def cuMemGetInfo(self):
        dev = self._ctx_device()
        used = sum(len(m) for b, m in self.memory.items() if self.owner[b] == dev)
        return DEVICE_TOTAL - used, DEVICE_TOTAL

    def cuMemAlloc(self, size):
        return self._alloc(size)

    def cuMemAllocAsync(self, size, stream):
        return self._alloc(size)

    def cuMemAllocFromPoolAsync(self, size, pool, stream):
        return self._alloc(size)

    def cuMemFree(self, dptr):
        self._free_any(dptr)

    def cuMemFreeAsync(self, dptr, stream):
        self._free_any(dptr)

    def _free_any(self, dptr) -> None:
        """Graph memory keeps its address for its allocation node (a launch makes it live again): a free
        ends only the live allocation."""
        if any(ptr == dptr for _, _, ptr, _ in self.mem_alloc_nodes.values()):
            self.graph_live.pop(dptr, None)
        else:
            self._free(dptr)

    def cuMemBatchDecompressAsync(self, operations, flags, stream):
        """DEFLATE (raw, RFC 1951) decompressed in order on the stream, each actual size written; the other
        algorithms are not modelled here (CUDA_ERROR_NOT_SUPPORTED, as on a GPU without them)."""
        if flags:
            raise CudaError(INVALID_VALUE, "flags")
        if any(operation[5] != DEFLATE for operation in operations):
            raise CudaError(CUresult.NOT_SUPPORTED, "only DEFLATE is modelled")

        def work():
            for src_bytes, dst_bytes, actual, src, dst, _ in operations:
                sm, so = self._find(src, src_bytes)
                out = zlib.decompressobj(-zlib.MAX_WBITS).decompress(
                    bytes(sm[so : so + src_bytes]), dst_bytes
                )
                dm, do = self._find(dst, len(out))
                dm[do : do + len(out)] = out
                am, ao = self._find(actual, 4)
                am[ao : ao + 4] = len(out).to_bytes(4, "little")

        self._on(stream, work)
        return SIZE_MAX

    def cuMemGetAddressRange(self, dptr):
        mem, off = self._find(dptr, 0)
        return dptr - off, len(mem)

    def cuMemPoolSetAttribute(self, pool, attr, value):
        # the reuse flags and the release threshold are kept; the counted figures are the guard's
        if attr <= 4:
            self.pool_attributes[(pool, attr)] = value

    def cuMemPoolGetAttribute(self, pool, attr):
        return self.pool_attributes.get((pool, attr), 0)

    def cuMemPoolTrimTo(self, pool, keep):
        return None

    def cuMemcpyDtoD(self, dst, src, count):
        smem, soff = self._span(src, count)
        data = bytes(smem[soff : soff + count])
        dmem, doff = self._span(dst, count)
        dmem[doff : doff + count] = data

    def cuMemcpyDtoDAsync(self, dst, src, count, stream):
        copy = Copy3D(src, count, 1, dst, count, 1, count, 1, 1)
        self._on(stream, lambda: self.cuMemcpyDtoD(dst, src, count), kind=1, described=copy)

    def cuMemcpyPeer(self, dst, dst_ctx, src, src_ctx, count):
        self.cuMemcpyDtoD(dst, src, count)

    def cuMemcpyPeerAsync(self, dst, dst_ctx, src, src_ctx, count, stream):
        self.cuMemcpyDtoD(dst, src, count)

    def cuPointerGetAttribute(self, attr, ptr):
        mem, off = self._find(ptr, 0)
        base = ptr - off
        dev = self.owner[base]
        return {
            1: 0xC0000 + dev,
            2: 2,
            3: ptr,
            6: int(base in self.sync_memops),
            9: dev,
            11: base,
            12: len(mem),
            17: 0xB0000 + dev,
        }.get(attr, 0)

    def cuPointerSetAttribute(self, attr, ptr, value):
        if attr != 6:  # CU_POINTER_ATTRIBUTE_SYNC_MEMOPS is the one settable attribute
            raise CudaError(CUresult.INVALID_VALUE, "pointer attribute is not settable")
        _, off = self._find(ptr, 0)
        if ptr - off in self.mapped:  # as the driver (580, H100) answers for memory mapped with cuMemMap
            raise CudaError(CUresult.NOT_SUPPORTED, "SYNC_MEMOPS on mapped memory")
        (self.sync_memops.add if value else self.sync_memops.discard)(ptr - off)

    def _load(self, image: bytes) -> int:
        if not image:
            raise CudaError(CUresult.INVALID_IMAGE, "empty image")
        handle = next(self.ids)
        self.ptx_kernels[handle] = ptx_layouts(image)
        self.variables[handle] = {
            name.decode(): [VARIABLE_BYTES[kind] * int(count or 1), bool(managed), 0]
            for managed, kind, name, count in VARIABLE.findall(image)
            if kind in VARIABLE_BYTES
        }
        # the texture and surface references the image declares (`.global .texref name;`)
        for kind, name in re.findall(rb"\.(tex|surf)ref\s+(\w+)\s*;", image):
            self.module_references[handle, name.decode()] = [kind == b"surf", 0]
        return handle

    def cuModuleLoadData(self, image):
        return self._load(image)

    cuModuleLoadDataEx = cuModuleLoadFatBinary = cuLibraryLoadData = cuModuleLoadData

    # The linker: an image is its inputs one after the other (the module loader reads PTX declarations).
    def cuLinkCreate(self):
        handle = next(self.ids)
        self.links[handle] = []
        return handle

    def cuLinkAddData(self, state, kind, data):
        if not data:
            raise CudaError(INVALID_VALUE, "empty link input")
        self.links[state].append(bytes(data).rstrip(b"\0") + b"\n")

    def cuLinkComplete(self, state):
        if not self.links[state]:
            raise CudaError(INVALID_VALUE, "nothing to link")
        self.linked[state] = b"".join(self.links[state]) + b"\0"
        return len(self.linked[state])

    def gpLinkImage(self, state, size):
        return linked_image(self.linked, state, size)

    def cuLinkDestroy(self, state):
        self.links.pop(state, None)
        self.linked.pop(state, None)

    def cuModuleGetLoadingMode(self):
        return 2  # CU_MODULE_LAZY_LOADING, the driver's default since CUDA 12.2

    def cuModuleUnload(self, module):
        for address, span in self.module_memory.pop(module, []):
            self._free(address)
            with self.lock:
                self.module_gaps.append((address, span))

    def cuLibraryUnload(
        self, library
    ):  # a library is a module here (its parameter named as the table names it)
        self.cuModuleUnload(library)

    def _function(self, module: int, name: str) -> int:
        """A module's function (a library's kernel) by name: one handle per name, as the driver gives."""
        declared = self.ptx_kernels.get(module, {})
        if name not in HOST_KERNELS and name not in declared:
            raise CudaError(NOT_FOUND, name)
        if (module, name) in self.function_handles:
            return self.function_handles[module, name]
        handle = next(self.ids)
        self.function_handles[module, name] = handle
        self.parents[handle] = module
        self.functions[handle] = name
        if name not in HOST_KERNELS:
            self.layouts[handle] = declared[name]
        return handle

    def cuModuleGetFunction(self, module, name):
        return self._function(module, name)

    def _names(self, module: int) -> list[str]:
        """What a module holds here: the kernels its PTX declares and the built-in ones, by name."""
        return sorted(set(self.ptx_kernels.get(module, {})) | set(HOST_KERNELS))

    def cuModuleGetFunctionCount(self, mod):
        return len(self._names(mod))

    def cuModuleEnumerateFunctions(self, num, mod):
        return [self._function(mod, name) for name in self._names(mod)[:num]]

    def cuLibraryGetKernelCount(self, lib):
        return self.cuModuleGetFunctionCount(lib)

    def cuLibraryEnumerateKernels(self, num, lib):
        return self.cuModuleEnumerateFunctions(num, lib)

    def cuKernelGetLibrary(self, kernel):
        return self.parents[kernel]

    def cuKernelGetName(self, kernel, length):
        return self.functions[kernel]

    def cuFuncGetName(self, func, length):
        return self.cuKernelGetName(func, length)

    def cuFuncIsLoaded(self, func):
        return 1  # CU_FUNCTION_LOADING_STATE_LOADED: everything here is loaded at once

    def cuFuncLoad(self, func):
        return None

    def cuLibraryGetKernel(self, library, name):
        return self._function(library, name)

    def cuLibraryGetModule(self, library):
        return library

    def cuKernelGetFunction(self, kernel):
        handle = next(self.ids)
        self.functions[handle] = self.functions[kernel]
        self.kernel_of[handle] = kernel  # a kernel's attribute, set on the kernel, is its functions' too
        if kernel in self.layouts:
            self.layouts[handle] = self.layouts[kernel]
        return handle

    # A module's (a library's) variables, as its PTX declares them: placed at the first ask, zero here.
    def _variable(self, module, name, managed_only: bool):
        declared = self.variables.get(module, {}).get(name)
        if declared is None or (managed_only and not declared[1]):
            raise CudaError(NOT_FOUND, name)
        size, _managed, ptr = declared
        if not ptr:
            ptr = declared[2] = self._module_alloc(module, size)
        return ptr, size

    def _module_alloc(self, module: int, size: int) -> int:
        span = (max(size, 1) + ALIGN - 1) // ALIGN * ALIGN
        with self.lock:
            gap = next((g for g in self.module_gaps if g[1] >= span), None)
            if gap is not None:
                self.module_gaps.remove(gap)
                ptr = gap[0]
            else:
                ptr, self.next_module_memory = self.next_module_memory, self.next_module_memory + span
        self._place(ptr, size, self._ctx_device())
        self.module_memory.setdefault(module, []).append((ptr, span))
        return ptr

    def cuModuleGetGlobal(self, module, name):
        return self._variable(module, name, managed_only=False)

    def cuLibraryGetGlobal(self, library, name):
        return self.cuModuleGetGlobal(library, name)

    def cuLibraryGetManaged(self, library, name):
        return self._variable(library, name, managed_only=True)

    def _param_info(self, func, index):
        layout = self.param_layout(func, False)
        if index >= len(layout):
            raise CudaError(INVALID_VALUE)
        return layout[index]

    def cuKernelGetParamInfo(self, kernel, index):
        return self._param_info(kernel, index)

    def cuFuncGetParamInfo(self, func, index):
        return self._param_info(func, index)

    def cuFuncGetAttribute(self, attrib, func):
        # MAX_THREADS_PER_BLOCK (0): saxpy stands for a kernel whose registers (NUM_REGS, 4) allow only
        # 256 threads, bounded_add_u32 for one whose launch bounds allow 128;
        # MAX_DYNAMIC_SHARED_SIZE_BYTES (8): 48 KiB until a program raises it.
        name = self.functions.get(func)
        limit = {"saxpy": 256, "bounded_add_u32": 128}.get(name, 1024)
        default = {0: limit, 4: 255 if name == "saxpy" else 32, 8: 49152}.get(attrib, 0)  # 4: NUM_REGS
        kernel_value = self.function_attributes.get((self.kernel_of.get(func), attrib), default)
        return self.function_attributes.get((func, attrib), kernel_value)

    def cuKernelGetAttribute(self, attrib, kernel, dev):
        return self.cuFuncGetAttribute(attrib, kernel)

    def cuFuncSetAttribute(self, func, attrib, value):
        self.function_attributes[func, attrib] = _settable_attribute(attrib, value)

    def cuKernelSetAttribute(self, attrib, value, kernel, dev):
        self._device(dev)
        self.function_attributes[kernel, attrib] = _settable_attribute(attrib, value)

    def cuFuncSetCacheConfig(self, func, config):
        _in_range(config, CACHE_CONFIGS, "CUfunc_cache")

    def cuFuncSetSharedMemConfig(self, func, config):
        _in_range(config, SHARED_CONFIGS, "CUsharedconfig")

    def cuKernelSetCacheConfig(self, kernel, config, dev):
        self._device(dev)
        _in_range(config, CACHE_CONFIGS, "CUfunc_cache")

    def cuFuncGetModule(self, func):
        raise CudaError(INVALID_HANDLE)

    def cuOccupancyMaxActiveBlocksPerMultiprocessor(self, func, block_size, smem):
        return 2048 // max(block_size, 1)

    def cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(self, func, block_size, smem, flags):
        return 2048 // max(block_size, 1)

    def cuOccupancyMaxPotentialBlockSize(self, func, callback, smem, limit):
        if callback:
            raise CudaError(CUresult.NOT_SUPPORTED, "a block-size callback runs in the client")
        return 8, min(limit or 1024, 1024)

    def cuOccupancyMaxPotentialBlockSizeWithFlags(self, func, callback, smem, limit, flags):
        return self.cuOccupancyMaxPotentialBlockSize(func, callback, smem, limit)

    def cuOccupancyAvailableDynamicSMemPerBlock(self, func, num_blocks, block_size):
        return 49152

    def cuStreamCreate(self, flags):
        stream = next(self.ids)
        self.streams.add(stream)
        return stream

    def cuStreamCreateWithPriority(self, flags, priority):
        return self.cuStreamCreate(flags)

    # Green contexts: partitions of the modelled SMs (ATTRIBUTES[16]), split as the driver splits them:
    # groups of at least the smallest partition, in whole co-scheduled groups.
    def _resource(self, device: int, sms: int) -> tuple[int, int, int, int]:
        rid = next(self.ids)
        self.resources[rid] = (device, sms)
        return rid, sms, SM_MIN_PARTITION, SM_ALIGNMENT

    def _green(self, green: int) -> tuple[int, int, int]:
        if green not in self.greens:
            raise CudaError(INVALID_HANDLE, "green context")
        return self.greens[green]

    def cuDeviceGetDevResource(self, dev, kind):
        return self._resource(self._device(dev), ATTRIBUTES[16])

    def cuCtxGetDevResource(self, ctx, kind):
        ctx = ctx or self._ctx()
        green = next((g for g, (_, _, c) in self.greens.items() if c == ctx), None)
        if green is not None:
            return self.cuGreenCtxGetDevResource(green, kind)
        if ctx not in self.contexts:
            raise CudaError(CUresult.INVALID_CONTEXT, "context")
        return self._resource(self.contexts[ctx], ATTRIBUTES[16])

    def cuGreenCtxGetDevResource(self, green, kind):
        device, sms, _ = self._green(green)
        return self._resource(device, sms)

    def cuStreamGetDevResource(self, stream, kind):
        green = self.cuStreamGetGreenCtx(stream) if stream else 0
        if green:
            return self.cuGreenCtxGetDevResource(green, kind)
        return self.cuCtxGetDevResource(self.cuStreamGetCtx(stream) if stream else 0, kind)

    def sm_split(self, resource, nb_groups, flags, min_count, count_only):
        if resource not in self.resources:
            raise CudaError(INVALID_VALUE, "resource")
        device, sms = self.resources[resource]
        size = max(min_count, SM_MIN_PARTITION)
        size += -size % SM_ALIGNMENT
        possible = sms // size
        if count_only:
            return [], possible
        if not possible or not nb_groups:
            raise CudaError(CUresult.INVALID_RESOURCE_CONFIGURATION, f"groups of {size} SMs from {sms}")
        groups = [self._resource(device, size) for _ in range(min(nb_groups, possible))]
        left = sms - size * len(groups)
        return groups, self._resource(device, left) if left else (0, 0, 0, 0)

    def sm_split_structured(self, resource, nb_groups, flags, params, want_groups):
        # The modelled GPU (compute capability below 9.0): SMs co-scheduled in pairs by default; each group
        # takes its SMs from what the groups before it left, an SM count of 0 discovers the rest.
        if resource not in self.resources:
            raise CudaError(INVALID_VALUE, "resource")
        if flags:
            raise CudaError(INVALID_VALUE, "split flags")
        device, sms = self.resources[resource]
        left, groups, out = sms, [], bytearray(params)
        for i in range(nb_groups):
            sm_count, cosched, _, group_flags = struct.unpack_from("<4I", params, 64 * i)
            unit, backfill = cosched or 2, bool(group_flags & 1)  # CU_DEV_SM_RESOURCE_GROUP_BACKFILL
            if sm_count == 0:
                sm_count = left if backfill else left - left % unit
                struct.pack_into("<I", out, 64 * i, sm_count)
            elif sm_count % 2 or sm_count > left or (sm_count % unit and not backfill):
                raise CudaError(
                    CUresult.INVALID_RESOURCE_CONFIGURATION, f"a group of {sm_count} SMs of {left}"
                )
            if want_groups:
                if sm_count < max(unit, 1) or sm_count == 0:
                    raise CudaError(CUresult.INVALID_RESOURCE_CONFIGURATION, f"a group of {sm_count} SMs")
                groups.append(self._resource(device, sm_count))
            left -= sm_count
        return groups, self._resource(device, left) if left else (0, 0, 0, 0), bytes(out)

    def resource_desc(self, resources):
        devices = {self.resources[r][0] for r in resources}
        if len(devices) != 1:
            raise CudaError(CUresult.INVALID_RESOURCE_CONFIGURATION, "resources of several devices")
        desc = next(self.ids)
        self.resource_descs[desc] = (devices.pop(), sum(self.resources[r][1] for r in resources))
        return desc

    def cuGreenCtxCreate(self, desc, dev, flags):
        if desc not in self.resource_descs or self.resource_descs[desc][0] != self._device(dev):
            raise CudaError(INVALID_VALUE, "resource descriptor")
        green, ctx = next(self.ids), next(self.ids)
        self.contexts[ctx] = dev
        self.greens[green] = (dev, self.resource_descs[desc][1], ctx)
        return green

    def cuGreenCtxDestroy(self, green):
        _, _, ctx = self._green(green)
        del self.greens[green]
        self.contexts.pop(ctx, None)
        for stream in [s for s, g in self.stream_green.items() if g == green]:
            del self.stream_green[stream]
            self.streams.discard(stream)

    def cuCtxFromGreenCtx(self, green):
        device, _, ctx = self._green(green)
        return ctx, device

    def cuGreenCtxRecordEvent(self, green, event):
        self._green(green)
        self.cuEventRecord(event, 0)  # all the green context's work so far is done here

    def cuGreenCtxWaitEvent(self, green, event):
        self._green(green)
        self._event(event)  # work here runs at once, in order

    def cuGreenCtxStreamCreate(self, green, flags, priority):
        self._green(green)
        stream = self.cuStreamCreate(flags)
        self.stream_green[stream] = green
        return stream

    def cuStreamGetGreenCtx(self, stream):
        self._stream(stream)
        return self.stream_green.get(stream, 0)

    def cuGreenCtxGetId(self, green):
        self._green(green)
        return green

    def cuStreamDestroy(self, stream):
        self._stream(stream)
        self.streams.discard(stream)

    def cuStreamQuery(self, stream):
        self._stream(stream)

    def cuStreamSynchronize(self, stream):
        self._stream(stream)
        self._alive()

    def _stream(self, stream: int) -> None:
        if stream not in self.streams and stream not in (0, 1, 2):
            raise CudaError(INVALID_HANDLE, "stream")

    def cuStreamWaitEvent(self, stream, event, flags):
        return None

    def cuStreamIsCapturing(self, stream):
        return 1 if stream in self.capturing else 0  # CU_STREAM_CAPTURE_STATUS_ACTIVE / NONE

    def cuStreamBeginCapture(self, stream, mode):
        if stream in (0, 1, 2):
            raise CudaError(900, "the legacy stream cannot be captured")
        if stream in self.capturing:
            raise CudaError(INVALID_VALUE, "already capturing")
        self.capturing[stream] = [self.cuGraphCreate(0), [], None]

    def capture_to_graph(self, stream, graph, deps, mode):
        if stream in (0, 1, 2) or stream in self.capturing or graph not in self.graphs:
            raise CudaError(INVALID_VALUE, "cannot capture there")
        self.capturing[stream] = [graph, list(deps), None]

    def recapture_to_graph(self, stream, mode, graph, on_mismatch, layout_of):
        if stream in (0, 1, 2) or stream in self.capturing or graph not in self.graphs:
            raise CudaError(INVALID_VALUE, "cannot recapture there")
        self.capturing[stream] = [graph, [], _Recapture(list(self.node_order.get(graph, [])), on_mismatch)]

    def _recapture_node(self, capture, work, kind, described) -> int:
        """The graph's next node, taken by captured work of its type that follows the same nodes: its
        parameters the recaptured ones where the program's callback (if any) agrees. Anything else fails
        the recapture (CUDA_ERROR_GRAPH_RECAPTURE_FAILURE), and the capture with it."""
        graph, after, recapture = capture
        if recapture.failed:
            raise CudaError(CUresult.STREAM_CAPTURE_INVALIDATED, "the recapture failed")
        node = recapture.order[recapture.at] if recapture.at < len(recapture.order) else None
        if node is None or self.node_types.get(node, 0) != kind or self._before(node) != set(after):
            recapture.failed = True
            raise CudaError(
                CUresult.GRAPH_RECAPTURE_FAILURE, "the recaptured work is not the graph's next node"
            )
        recapture.at += 1
        kept = {KERNEL_NODE: self.launches, 1: self.copies, MEMSET_NODE: self.memsets}.get(kind)
        before = kept.get(node) if kept is not None else None
        if kind == KERNEL_NODE and described is not None:
            changed = _launch_key(before) != _launch_key(described)
        else:
            changed = kind != HOST_NODE and before != described
        if changed and recapture.on_mismatch is not None:
            sides = (self._node_params(kind, before), self._node_params(kind, described))
            if recapture.on_mismatch(node, *sides, RECAPTURE_ELIGIBLE) != CUresult.SUCCESS:
                recapture.failed = True
                raise CudaError(CUresult.GRAPH_RECAPTURE_FAILURE, "the program's callback refused the change")
        self.nodes[node] = (graph, work)
        self.graphs[graph][self.node_order[graph].index(node)] = work
        if kept is not None and described is not None:
            kept[node] = described
        return node

    def _before(self, node) -> set[int]:
        return {a for a, b in self.edges if b == node}

    @staticmethod
    def _node_params(kind: int, described) -> RecapturedNode:
        """A node's CUgraphNodeParams as the driver writes it, from what this executor keeps of the node."""
        raw = bytearray(NODE_PARAMS_BYTES)
        struct.pack_into("<i", raw, 0, kind)
        if kind == KERNEL_NODE and described is not None:
            func, kern = (0, described.func) if described.is_kernel else (described.func, 0)
            dims = (*described.grid, *described.block, described.shared_mem)
            KERNEL_NODE_PARAMS.pack_into(raw, 16, func, *dims, 0, 0, kern, 0)
            return RecapturedNode.of(raw, described.func, bytes(described.params))
        if kind == MEMSET_NODE and described is not None:
            MEMSET_NODE_PARAMS.pack_into(raw, 16, *described, 0)
        return RecapturedNode.of(raw)

    def cuStreamEndCapture(self, stream):
        capture = self.capturing.pop(stream, None)
        if capture is None:
            raise CudaError(903, "not capturing")
        if isinstance(capture[2], _Recapture) and (
            capture[2].failed or capture[2].at != len(capture[2].order)
        ):
            raise CudaError(
                CUresult.GRAPH_RECAPTURE_FAILURE, "the recapture did not make every node of the graph"
            )
        return capture[0]

    def capture_info(self, stream):
        capture = self.capturing.get(stream)
        if capture is None:
            return 0, 0, 0, []
        return 1, stream, capture[0], list(capture[1])

    def update_capture_dependencies(self, stream, deps, flags):
        capture = self.capturing.get(stream)
        if capture is None:
            raise CudaError(401, "not capturing")  # CUDA_ERROR_ILLEGAL_STATE
        capture[1] = list(deps) if flags == 1 else capture[1] + [d for d in deps if d not in capture[1]]

    def cuThreadExchangeStreamCaptureMode(self, mode):
        previous = getattr(self.local, "capture_mode", 0)
        self.local.capture_mode = mode
        return previous

    def graph_nodes(self, graph):
        return list(self.node_order.get(graph, []))

    def graph_edges(self, graph):
        mine = set(self.node_order.get(graph, []))
        return [(a, b) for a, b in self.edges if a in mine]

    def cuGraphClone(self, graph):
        clone = self.cuGraphCreate(0)
        twins = {n: self._add_node(clone, [], self.nodes[n][1]) for n in self.node_order.get(graph, [])}
        self.graph_add_dependencies(clone, [(twins[a], twins[b]) for a, b in self.graph_edges(graph)])
        self.clones[clone] = twins
        for original, twin in twins.items():
            if original in self.node_types:
                self.node_types[twin] = self.node_types[original]
            for kept in (self.memsets, self.copies, self.launches, self.node_events, self.child_graphs):
                if original in kept:
                    kept[twin] = kept[original]
        for (node, attr), value in list(self.node_attributes.items()):
            if node in twins:
                self.node_attributes[twins[node], attr] = value
        return clone

    def cuGraphNodeFindInClone(self, original, clone):
        twin = self.clones.get(clone, {}).get(original)
        if twin is None:
            raise CudaError(INVALID_VALUE, "not a node of the graph that clone was made from")
        return twin

    def cuGraphNodeGetType(self, node):
        return self.node_types.get(node, 0)

    def graph_add_event_node(self, graph, deps, event, wait):
        node = self._add_node(graph, deps, lambda: None)  # everything here is done at once
        self.node_types[node] = 6 if wait else 7  # CU_GRAPH_NODE_TYPE_WAIT_EVENT / EVENT_RECORD
        self.node_events[node] = event
        return node

    def _event_node(self, node, *types) -> int:
        if self.node_types.get(node) not in types:
            raise CudaError(INVALID_VALUE, "not an event node of that kind")
        return node

    def cuGraphEventRecordNodeGetEvent(self, node):
        return self.node_events[self._event_node(node, 7)]

    def cuGraphEventWaitNodeGetEvent(self, node):
        return self.node_events[self._event_node(node, 6)]

    def cuGraphEventRecordNodeSetEvent(self, node, event):
        self.node_events[self._event_node(node, 7)] = event

    def cuGraphEventWaitNodeSetEvent(self, node, event):
        self.node_events[self._event_node(node, 6)] = event

    def cuGraphExecEventRecordNodeSetEvent(self, graph_exec, node, event):
        self._exec_index(graph_exec, self._event_node(node, 7))

    def cuGraphExecEventWaitNodeSetEvent(self, graph_exec, node, event):
        self._exec_index(graph_exec, self._event_node(node, 6))

    def _memcpy_work(self, copy: Copy3D):
        def work():
            for src, dst in copy.rows():
                sm, so = self._find(src, copy.width)
                dm, do = self._find(dst, copy.width)
                dm[do : do + copy.width] = sm[so : so + copy.width]

        return work

    def graph_add_memcpy_node(self, graph, deps, copy: Copy3D):
        node = self._add_node(graph, deps, self._memcpy_work(copy))
        self.node_types[node] = 1  # CU_GRAPH_NODE_TYPE_MEMCPY
        self.copies[node] = copy
        return node

    def graph_exec_memcpy_node(self, graph_exec, node, copy: Copy3D):
        self._set_exec_work(graph_exec, node, self._memcpy_work(copy), kind=1)

    def graph_host_node_fn(self, node):
        if self.node_types.get(node) != 3:
            raise CudaError(INVALID_VALUE, "not a host node")
        return self.nodes[node][1]

    # Graph memory is placed when its node is added, and stays for every launch (the driver's is mapped
    # while the graph runs between its allocation and free nodes); CU_GRAPH_NODE_TYPE_MEM_ALLOC 10, FREE 11.
    def graph_add_mem_alloc_node(self, graph, deps, device, size, access):
        self._device(device)
        for peer, _flags in access:
            self._device(peer)
        ptr = self._alloc(size, device)
        node = self._add_node(graph, deps, lambda: self._graph_allocated(node))
        self.node_types[node] = 10
        self.mem_alloc_nodes[node] = (device, size, ptr, list(access))
        return node, ptr

    def _graph_allocated(self, node) -> None:
        """A launch reached an allocation node: its allocation is live, in the reserve (which grows only
        where the live allocations outgrow it)."""
        device, _size, ptr, _ = self.mem_alloc_nodes[node]
        self.graph_live[ptr] = node
        self.graph_reserved[device] = max(self.graph_reserved[device], self._graph_memory(device)[0])
        high = self.graph_memory_high[device]
        high[:] = map(max, high, self._graph_memory(device))

    def _graph_memory(self, device) -> tuple[int, int]:
        """The device's graph memory in use (live allocations) and reserved."""
        used = sum(
            self.mem_alloc_nodes[n][1]
            for n in self.graph_live.values()
            if self.mem_alloc_nodes[n][0] == device
        )
        return used, self.graph_reserved[device]

    def graph_mem_alloc_node_params(self, node):
        if node not in self.mem_alloc_nodes:
            raise CudaError(INVALID_VALUE, "not a memory allocation node")
        device, size, ptr, access = self.mem_alloc_nodes[node]
        return device, size, ptr, list(access)

    def graph_add_mem_free_node(self, graph, deps, ptr):
        if not any(p == ptr for _, _, p, _ in self.mem_alloc_nodes.values()):
            raise CudaError(INVALID_VALUE, "not graph memory")
        node = self._add_node(graph, deps, lambda: self.graph_live.pop(ptr, None))
        self.node_types[node] = 11
        self.mem_free_nodes[node] = ptr
        return node

    # A batch memory-operation node (CU_GRAPH_NODE_TYPE_BATCH_MEM_OP 12): its writes done in order at every
    # launch; a wait is met at once (this executor runs one thing at a time, so nothing could meet it later).
    def _batch_work(self, ops: bytes):
        def work():
            for at in range(0, len(ops), 48):
                op, address, value = struct.unpack_from("<I4xQQ", ops, at)
                if op in (2, 5):  # CU_STREAM_MEM_OP_WRITE_VALUE_32 / _64
                    size = 4 if op == 2 else 8
                    mem, off = self._find(address, size)
                    mem[off : off + size] = (value & ((1 << 8 * size) - 1)).to_bytes(size, "little")

        return work

    def graph_add_batch_mem_op_node(self, graph, deps, ops, flags):
        node = self._add_node(graph, deps, self._batch_work(ops))
        self.node_types[node] = 12
        self.batch_ops[node] = (bytes(ops), flags)
        return node

    def graph_batch_mem_op_node_set(self, graph_exec, node, ops, flags):
        if graph_exec:
            self._set_exec_work(graph_exec, node, self._batch_work(ops), kind=12)
        else:
            self._set_node_work(node, self._batch_work(ops), kind=12)
            self.batch_ops[node] = (bytes(ops), flags)

    def graph_batch_mem_op_node_params(self, node):
        if node not in self.batch_ops:
            raise CudaError(INVALID_VALUE, "not a batch memory-operation node")
        return self.batch_ops[node]

    def cuGraphMemFreeNodeGetParams(self, node):
        if node not in self.mem_free_nodes:
            raise CudaError(INVALID_VALUE, "not a memory free node")
        return self.mem_free_nodes[node]

    def cuDeviceGraphMemTrim(self, dev):
        """The reserve no live allocation uses returns (nothing here runs later: no launch is pending)."""
        dev = self._device(dev)
        self.graph_reserved[dev] = self._graph_memory(dev)[0]

    def cuDeviceGetGraphMemAttribute(self, dev, attr):
        # CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, USED_MEM_HIGH, RESERVED_MEM_CURRENT, RESERVED_MEM_HIGH
        (used, reserved), high = self._graph_memory(self._device(dev)), self.graph_memory_high[dev]
        attr = _in_range(attr, range(4), "graph memory attribute")
        return {0: used, 1: high[0], 2: reserved, 3: high[1]}[attr]

    def cuDeviceSetGraphMemAttribute(self, dev, attr, value):
        if attr not in (1, 3) or value != 0:  # only a high-water mark is set, and only back to 0
            raise CudaError(INVALID_VALUE, "only a graph memory high-water mark is reset, to 0")
        dev = self._device(dev)
        self.graph_memory_high[dev][attr // 2] = self._graph_memory(dev)[attr // 2]

    def graph_add_host_node(self, graph, deps, fn):
        node = self._add_node(graph, deps, fn)
        self.node_types[node] = 3  # CU_GRAPH_NODE_TYPE_HOST
        return node

    def cuGraphInstantiateWithFlags(self, graph, flags):
        graph_exec = next(self.ids)
        self.exec_flags[graph_exec] = flags
        self.graphs[graph_exec] = list(self.graphs[graph])
        self.exec_order[graph_exec] = list(self.node_order.get(graph, []))
        return graph_exec

    # Graphs built node by node: each node is its work; a graph runs its nodes in an order that keeps
    # every dependency (insertion order where none says otherwise).
    def cuGraphCreate(self, flags):
        graph = next(self.ids)
        self.graphs[graph] = []
        return graph

    def _add_node(self, graph, deps, work) -> int:
        node = next(self.ids)
        self.nodes[node] = (graph, work)
        self.edges.extend((d, node) for d in deps)
        order = self.node_order.setdefault(graph, [])
        if set(deps) <= set(order):  # after all it depends on: the order stays one that keeps them
            order.append(node)
            self.graphs[graph].append(work)
        else:
            self._order(graph)
        return node

    def _order(self, graph) -> None:
        mine = [n for n, (g, _) in self.nodes.items() if g == graph]
        before = {n: {a for a, b in self.edges if b == n} for n in mine}
        order = []
        while before:
            ready = [n for n in mine if n in before and not before[n] - set(order)]
            if not ready:
                raise CudaError(INVALID_VALUE, "the graph's dependencies form a cycle")
            order.append(ready[0])
            del before[ready[0]]
        self.node_order[graph] = order
        self.graphs[graph] = [self.nodes[n][1] for n in order]

    def graph_add_kernel_node(self, graph, deps, launch) -> int:
        params = bytes(launch.params)
        node = self._add_node(
            graph, deps, lambda: self._run_kernel(launch.func, launch.grid, launch.block, params)
        )
        self.launches[node] = launch
        return node

    # An instantiated graph's nodes set anew: the node keeps its place (and its switch, on or off).
    def _exec_index(self, graph_exec, node) -> int:
        order = self.exec_order.get(graph_exec, [])
        if node not in order:
            raise CudaError(INVALID_VALUE, "not a node of that graph")
        return order.index(node)

    def _set_exec_work(self, graph_exec, node, work, kind: int) -> None:
        if self.node_types.get(node, 0) != kind:
            raise CudaError(INVALID_VALUE, "a node of another type")
        at = self._exec_index(graph_exec, node)
        if (graph_exec, node) in self.disabled:
            self.disabled[graph_exec, node] = work
        else:
            self.graphs[graph_exec][at] = work

    def graph_exec_kernel_node(self, graph_exec, node, launch) -> None:
        params = bytes(launch.params)
        work = lambda: self._run_kernel(launch.func, launch.grid, launch.block, params)  # noqa: E731
        self._set_exec_work(graph_exec, node, work, kind=0)

    def cuGraphNodeSetEnabled(self, graph_exec, node, enabled):
        if self.node_types.get(node, 0) not in (0, 1, 2):  # kernel, copy and memset nodes only
            raise CudaError(INVALID_VALUE, "only kernel, copy and memset nodes are switched")
        at = self._exec_index(graph_exec, node)
        if enabled and (graph_exec, node) in self.disabled:
            self.graphs[graph_exec][at] = self.disabled.pop((graph_exec, node))
        elif not enabled and (graph_exec, node) not in self.disabled:
            self.disabled[graph_exec, node] = self.graphs[graph_exec][at]
            self.graphs[graph_exec][at] = lambda: None

    def cuGraphNodeGetEnabled(self, graph_exec, node):
        self._exec_index(graph_exec, node)
        return 0 if (graph_exec, node) in self.disabled else 1

    def cuGraphExecGetFlags(self, graph_exec):
        if graph_exec not in self.exec_flags:
            raise CudaError(INVALID_VALUE, "not an instantiated graph")
        return self.exec_flags[graph_exec]

    def _memset_work(self, dst, pitch, value, element_size, width, height):
        def work():
            for row in range(height):
                mem, off = self._find(dst + row * pitch, element_size * width)
                mem[off : off + element_size * width] = value.to_bytes(element_size, "little") * width

        return work

    def graph_add_memset_node(self, graph, deps, dst, pitch, value, element_size, width, height) -> int:
        node = self._add_node(graph, deps, self._memset_work(dst, pitch, value, element_size, width, height))
        self.node_types[node] = 2  # CU_GRAPH_NODE_TYPE_MEMSET
        self.memsets[node] = (dst, pitch, value, element_size, width, height)
        return node

    # A graph's node set anew: the graph runs the new work from its next instantiation (graphs
    # instantiated before keep what they had, as the driver's do).
    def _set_node_work(self, node, work, kind: int) -> None:
        if node not in self.nodes or self.node_types.get(node, 0) != kind:
            raise CudaError(INVALID_VALUE, "not a node of that type")
        graph, _ = self.nodes[node]
        self.nodes[node] = (graph, work)
        self.graphs[graph][self.node_order[graph].index(node)] = work

    def graph_kernel_node_set(self, node, launch) -> None:
        params = bytes(launch.params)
        work = lambda: self._run_kernel(launch.func, launch.grid, launch.block, params)  # noqa: E731
        self._set_node_work(node, work, kind=0)
        self.launches[node] = launch

    def graph_kernel_node_params(self, node, layout_of):
        launch = self.launches.get(node)
        if launch is None or self.node_types.get(node, 0) != 0:
            raise CudaError(INVALID_VALUE, "not a kernel node")
        layout_of(launch.func)
        return launch.func, launch.grid, launch.block, launch.shared_mem, bytes(launch.params)

    def graph_memset_node_set(self, node, dst, pitch, value, element_size, width, height) -> None:
        self._set_node_work(node, self._memset_work(dst, pitch, value, element_size, width, height), kind=2)
        self.memsets[node] = (dst, pitch, value, element_size, width, height)

    def cuGraphMemsetNodeGetParams(self, node):
        if node not in self.memsets:
            raise CudaError(INVALID_VALUE, "not a memset node")
        return self.memsets[node]

    def graph_memcpy_node_set(self, node, copy: Copy3D) -> None:
        self._set_node_work(node, self._memcpy_work(copy), kind=1)
        self.copies[node] = copy

    def graph_memcpy_node_params(self, node) -> Copy3D:
        if node not in self.copies:
            raise CudaError(INVALID_VALUE, "not a copy node")
        return self.copies[node]

    def graph_host_node_set(self, graph_exec, node, fn) -> None:
        if graph_exec:
            self._set_exec_work(graph_exec, node, fn, kind=3)
        else:
            self._set_node_work(node, fn, kind=3)

    def graph_remove_dependencies(self, graph, edges, edge_data=None) -> None:
        mine = set(self.node_order.get(graph, []))
        if any(edge not in self.edges or edge[0] not in mine for edge in edges):
            raise CudaError(INVALID_VALUE, "an edge the graph does not have")
        for edge in edges:
            self.edges.remove(edge)
            self.edge_data.pop(edge, None)

    def _kernel_node(self, node) -> int:
        if node not in self.nodes or self.node_types.get(node, 0) != 0:
            raise CudaError(INVALID_VALUE, "not a kernel node")
        return node

    # A kernel node's launch attributes are kept, not acted on (this executor has no L2 or clusters).
    def cuGraphDebugDotPrint(self, graph, flags) -> bytes:
        """A DOT graph of the nodes (their handles and types) and edges, as the driver's names them."""
        if graph not in self.graphs:
            raise CudaError(INVALID_VALUE, "not a graph")
        lines = [
            f'  "{n}" [label="{n} type {self.node_types.get(n, 0)}"];' for n in self.node_order.get(graph, [])
        ]
        lines += [f'  "{a}" -> "{b}";' for a, b in self.graph_edges(graph)]
        return ("digraph dot {\n" + "\n".join(lines) + "\n}\n").encode()

    def cuGraphKernelNodeGetAttribute(self, node, attr):
        return self.node_attributes.get((self._kernel_node(node), attr), bytes(64))

    def cuGraphKernelNodeSetAttribute(self, node, attr, value):
        self.node_attributes[self._kernel_node(node), attr] = bytes(value)

    def cuGraphKernelNodeCopyAttributes(self, dst, src):
        self._kernel_node(dst)
        for (node, attr), value in list(self.node_attributes.items()):
            if node == self._kernel_node(src):
                self.node_attributes[dst, attr] = value

    def cuGraphNodeGetContainingGraph(self, node):
        if node not in self.nodes:
            raise CudaError(INVALID_VALUE, "not a node")
        return self.nodes[node][0]

    def cuGraphNodeGetLocalId(self, node):
        """The node's place among its graph's nodes in the order they were made."""
        graph = self.cuGraphNodeGetContainingGraph(node)
        return [n for n, (g, _) in self.nodes.items() if g == graph].index(node)

    def cuGraphNodeGetToolsId(self, node):
        return self.cuGraphGetId(self.nodes[node][0]) << 32 | self.cuGraphNodeGetLocalId(node)

    def cuGraphGetId(self, graph):
        if graph not in self.graphs:
            raise CudaError(INVALID_VALUE, "not a graph")
        return graph & 0xFFFFFFFF

    def cuGraphExecGetId(self, graph_exec):
        if graph_exec not in self.exec_order:
            raise CudaError(INVALID_VALUE, "not an instantiated graph")
        return graph_exec & 0xFFFFFFFF

    def graph_exec_memset_node(
        self, graph_exec, node, dst, pitch, value, element_size, width, height
    ) -> None:
        work = self._memset_work(dst, pitch, value, element_size, width, height)
        self._set_exec_work(graph_exec, node, work, kind=2)

    def graph_add_empty_node(self, graph, deps) -> int:
        node = self._add_node(graph, deps, lambda: None)
        self.node_types[node] = 5  # CU_GRAPH_NODE_TYPE_EMPTY
        return node

    def _child_work(self, child):
        copy = self.cuGraphClone(child)  # a copy of the child as it is now, as the driver takes
        return copy, lambda: [work() for work in list(self.graphs[copy])]

    def graph_add_child_node(self, graph, deps, child) -> int:
        copy, work = self._child_work(child)
        node = self._add_node(graph, deps, work)
        self.child_graphs[node] = copy
        self.node_types[node] = 4  # CU_GRAPH_NODE_TYPE_GRAPH
        return node

    def cuGraphExecChildGraphNodeSetParams(self, graph_exec, node, child):
        current = self.child_graphs.get(node)
        if current is not None and len(self.graphs.get(child, [])) != len(self.graphs.get(current, [])):
            raise CudaError(INVALID_VALUE, "the child graph's topology differs")  # as the driver requires
        self._set_exec_work(graph_exec, node, self._child_work(child)[1], kind=4)

    def graph_node_list(self, which, subject):
        if which == "cuGraphGetRootNodes":
            order = self.node_order.get(subject, [])
            targets = {b for _, b in self.edges}
            return [n for n in order if n not in targets], []
        if subject not in self.nodes:
            raise CudaError(INVALID_VALUE, "not a node")
        dependencies = which == "cuGraphNodeGetDependencies"
        edges = [(a, b) for a, b in self.edges if (b if dependencies else a) == subject]
        nodes = [a if dependencies else b for a, b in edges]
        return nodes, [self.edge_data.get(edge, bytes(8)) for edge in edges]

    def cuGraphChildGraphNodeGetGraph(self, node):
        if node not in self.child_graphs:
            raise CudaError(INVALID_VALUE, "not a child graph node")
        return self.child_graphs[node]

    def cuGraphConditionalHandleCreate(self, graph, ctx, default_value, flags):
        handle = next(self.ids)
        self.conditions[handle] = [default_value if flags & 1 else 0, default_value, flags]
        return handle

    def graph_add_conditional_node(self, graph, deps, handle, kind, size, ctx):
        if handle not in self.conditions or kind not in (0, 1, 2) or (kind == 1 and size != 1):
            raise CudaError(INVALID_VALUE, "conditional node")
        bodies = [self.cuGraphCreate(0) for _ in range(size)]
        condition = self.conditions[handle]

        def work():
            def run(body):
                for body_work in list(self.graphs[body]):
                    body_work()

            if kind == 0:  # if (and else, with two bodies)
                if condition[0] or size == 2:
                    run(bodies[0 if condition[0] else 1])
            elif kind == 1:  # while
                for _ in range(1_000_000):
                    if not condition[0]:
                        break
                    run(bodies[0])
            elif condition[0] < size:  # switch
                run(bodies[condition[0]])

        node = self._add_node(graph, deps, work)
        self.node_types[node] = 13  # CU_GRAPH_NODE_TYPE_CONDITIONAL
        return node, bodies

    def graph_exec_update(self, graph_exec, graph):
        if len(self.graphs.get(graph, [])) != len(self.graphs.get(graph_exec, [])):
            return 2, 910  # CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED, CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE
        self.graphs[graph_exec] = list(self.graphs[graph])
        self.exec_order[graph_exec] = list(self.node_order.get(graph, []))
        return 0, 0

    def graph_add_dependencies(self, graph, edges, edge_data=None) -> None:
        # A programmatic edge (nonzero data) still orders the two nodes here: this executor runs nodes
        # one after the other, which every kind of edge allows.
        self.edges.extend(edges)
        for edge, data in zip(edges, edge_data or (), strict=False):
            if any(data):
                self.edge_data[edge] = bytes(data)
        self._order(graph)

    def cuGraphDestroyNode(self, node):
        graph, _ = self.nodes.pop(node)
        self.edges[:] = [(a, b) for a, b in self.edges if node not in (a, b)]
        self._order(graph)

    def cuGraphLaunch(self, graph_exec, stream):
        for condition in self.conditions.values():  # CU_GRAPH_COND_ASSIGN_DEFAULT: at each launch
            if condition[2] & 1:
                condition[0] = condition[1]
        for work in self.graphs[graph_exec]:
            self._on(stream, work)

    def cuGraphUpload(self, graph_exec, stream):
        return None

    def cuGraphExecDestroy(self, graph_exec):
        self.graphs.pop(graph_exec, None)

    def cuGraphDestroy(self, graph):
        self.graphs.pop(graph, None)

    def cuStreamGetPriority(self, stream):
        return 0

    # Stream memory operations: a write lands at once; a wait is met at once (work here runs in order,
    # so what it waits for was written before it or never will be).
    def _write_value(self, stream, addr, value, size):
        mem, off = self._find(addr, size)
        write = lambda: mem.__setitem__(slice(off, off + size), value.to_bytes(size, "little"))  # noqa: E731
        self._on(stream, write, kind=12)  # CU_GRAPH_NODE_TYPE_BATCH_MEM_OP, captured

    def cuStreamWriteValue32(self, stream, addr, value, flags):
        self._write_value(stream, addr, value, 4)

    def cuStreamWriteValue64(self, stream, addr, value, flags):
        self._write_value(stream, addr, value, 8)

    def cuStreamWaitValue32(self, stream, addr, value, flags):
        self._find(addr, 4)

    def cuStreamWaitValue64(self, stream, addr, value, flags):
        self._find(addr, 8)

    def cuStreamGetAttribute(self, stream, attr):
        return self.stream_attributes.get((stream, attr), bytes(64))

    def cuStreamSetAttribute(self, stream, attr, value):
        self.stream_attributes[stream, attr] = bytes(value)

    def cuStreamCopyAttributes(self, dst, src):
        for (stream, attr), value in list(self.stream_attributes.items()):
            if stream == src:
                self.stream_attributes[dst, attr] = value

    def cuStreamGetFlags(self, stream):
        return 0

    def cuStreamGetCtx(self, stream):
        return getattr(self.local, "ctx", 0)

    def cuStreamGetId(self, stream):
        return stream

    def cuStreamGetDevice(self, stream):
        return self._ctx_device()

    def cuEventCreate(self, flags):
        if flags & ~0x7:  # CU_EVENT_BLOCKING_SYNC | DISABLE_TIMING | INTERPROCESS, as the driver checks
            raise CudaError(CUresult.INVALID_VALUE, "event flags")
        handle = next(self.ids)
        self.events[handle] = None
        if flags & 0x2:
            self.untimed.add(handle)
        return handle

    def cuEventRecord(self, event, stream):
        self._event(event)
        self.events[event] = time.perf_counter()

    def cuEventRecordWithFlags(self, event, stream, flags):
        self.cuEventRecord(event, stream)

    def cuEventQuery(self, event):
        self._event(event)

    def cuEventSynchronize(self, event):
        self._event(event)

    def _event(self, event: int) -> None:
        if event not in self.events:
            raise CudaError(INVALID_HANDLE, "event")

    def cuEventDestroy(self, event):
        self.events.pop(event, None)
        self.untimed.discard(event)

    def cuEventElapsedTime(self, start, end):
        if start in self.untimed or end in self.untimed:  # made with CU_EVENT_DISABLE_TIMING
            raise CudaError(CUresult.INVALID_HANDLE, "an event without timing")
        t0, t1 = self.events.get(start), self.events.get(end)
        if t0 is None or t1 is None:
            raise CudaError(CUresult.NOT_READY, "event not recorded")
        return (t1 - t0) * 1000.0
