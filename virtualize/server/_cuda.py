"""The CUDA executor: runs a lease's checked calls on the real GPU through cuda-python.

The only module of gpupool that imports `cuda.bindings` (an import-linter contract says so). Handles
travel as ints and are wrapped into cuda.bindings' types here; host buffers are passed by address.
Every call returns its values or raises `CudaError` with the driver's CUresult.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import logging
import mmap
import os
import struct
import tempfile
import threading
from collections.abc import Callable
from types import SimpleNamespace

from cuda.bindings import driver

from virtualize.common._calls import FORWARDED_LAUNCH_ATTRIBUTES, Call
from virtualize.common._results import CUresult
from virtualize.server._arrays import (
    DEVICE,
    HOST,
    MAP_INFO_DEVICES,
    MEMORY_REQUIREMENTS_BYTES,
    RESOURCE_DESC_BYTES,
    SPARSE_PROPERTIES_BYTES,
    TEXTURE_DESC_BYTES,
    VIEW_DESC_BYTES,
    ArrayShape,
    resource_mapped,
    unmovable,
)
from virtualize.server._executor import (
    DECOMPRESS_PARAMS,
    FABRIC_COPY,
    INVALID_VALUE,
    KERNEL_NODE,
    KERNEL_NODE_PARAMS,
    NODE_PARAMS_BYTES,
    NOT_FOUND,
    NOT_SUPPORTED,
    CopiedBytes,
    Copy3D,
    CudaError,
    Executor,
    HeldObjects,
    Launch,
    RecapturedNode,
    SharedHostMemory,
    StagedCopy,
    lacked_abis,
    linked_image,
)

_INVALID_VALUE_RESULT = driver.CUresult.CUDA_ERROR_INVALID_VALUE
DEV_RESOURCE_BYTES = 144  # sizeof(CUdevResource)
# What a lease may hold that a live migration does not re-create on another GPU (it is refused up front
# with these words): handle kind -> what the lease holds.
CANNOT_MOVE = {
    "link": "a link in progress (cuLinkCreate)",
    "comm": "NCCL communicators (NCCL's connections to the other ranks' workers are this GPU's)",
    "texref": "texture references", "surfref": "surface references",
}  # fmt: skip
SPARE_SAMPLERS = 4096  # texture objects a move makes, at most, to reach the values the program holds
MEM_OP_BYTES = 48  # CUstreamBatchMemOpParams
BATCH_NODE_PARAMS = struct.Struct("<QI4xQI4x")
LAUNCH_PARAMS = struct.Struct(
    "<Q7I4xQQ"
)  # CUDA_LAUNCH_PARAMS: function, dimensions, shared memory, stream, params  # CUDA_BATCH_MEM_OP_NODE_PARAMS: ctx, count, the ops, flags
# CUDA_MEM_ALLOC_NODE_PARAMS: CUmemPoolProps' allocation type, handle types, location type and id (then
# the rest of its 88 bytes), the access descriptors' address and count, the size, the address.
ALLOC_NODE_PARAMS = struct.Struct("<iiii72xQQQQ")
ACCESS_DESC = struct.Struct("<iiI")  # CUmemAccessDesc: location type, location id, flags
SMALL_COPY = 256 << 10  # up to this, copies go through pageable memory (one driver call)
STAGING_CHUNK = 8 << 20
_HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_size_t)  # CUhostFn: void (*)(void *userData)
# Asynchronous copies to the client: each one's own page-locked buffer, kept for reuse up to this much;
# a larger copy is staged before the call returns (as every copy to the host was before).
log = logging.getLogger("gpupool.worker")
ASYNC_STAGING_MAX = 256 << 20
ASYNC_STAGING_KEPT = 512 << 20
_POSIX_FD = 1  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: memory another worker process can open
# A copy's completion mark, which the host-function thread calling clients back reads (it may make no
# CUDA call): the stream writes a word into host memory behind the copy (cuStreamWriteValue32, no host
# thread involved), or, where stream memory operations are refused, the driver calls sem_post on a
# semaphore — a C function, so the stream never waits for the GIL (its int result, ignored, is fine on
# the 64-bit ABIs CUDA runs on). Other threads ask the copy's event.
_libc = ctypes.CDLL(None, use_errno=True)
_SEM_BYTES = 32  # sizeof(sem_t), 64-bit Linux
_SEM_POST = ctypes.cast(_libc.sem_post, ctypes.c_void_p).value
_kept: list = []  # marks a dead context never wrote or posted, and their memory: never freed
_MARK_BYTES = 4096  # after each staging buffer: the word the stream writes
_marks = itertools.count(1)
_driver_thread = threading.local()  # `calling_back` while the driver's thread runs a host function
EVENTS_KEPT = 64  # finished copies' events kept per context for the next copies (each saves two driver calls)
_MARK_ASK_NS = 1_000_000  # a copy's mark waited for this long between asks of the driver whether it failed


# Tensor maps go to the driver through its own entry points, written into a 64-byte-aligned CUtensorMap
# of ours: cuda.bindings keeps a CUtensorMap inside a Python object, which is only 16-byte aligned, and
# the driver refuses a map that is not 64-byte aligned with CUDA_ERROR_INVALID_VALUE (three encodes in
# four failed that way). Each call: its ABI version and its parameters after the CUtensorMap *.
TENSOR_MAP_BYTES, TENSOR_MAP_ALIGN = 128, 64
_int32, _uint32, _u64s, _u32s, _i32s = (
    ctypes.c_int32,
    ctypes.c_uint32,
    ctypes.POINTER(ctypes.c_uint64),
    ctypes.POINTER(ctypes.c_uint32),
    ctypes.POINTER(ctypes.c_int32),
)
TENSOR_MAP_CALLS: dict[str, tuple[int, tuple]] = {
    "cuTensorMapEncodeTiled": (12000, (_int32, _uint32, ctypes.c_void_p, _u64s, _u64s, _u32s, _u32s,
                                       _int32, _int32, _int32, _int32)),
    "cuTensorMapEncodeIm2col": (12000, (_int32, _uint32, ctypes.c_void_p, _u64s, _u64s, _i32s, _i32s, _uint32,
                                        _uint32, _u32s, _int32, _int32, _int32, _int32)),
    "cuTensorMapEncodeIm2colWide": (12080, (_int32, _uint32, ctypes.c_void_p, _u64s, _u64s, _int32, _int32,
                                            _uint32, _uint32, _u32s, _int32, _int32, _int32, _int32, _int32)),
    "cuTensorMapReplaceAddress": (12000, (ctypes.c_void_p,)),
    "cuTensorMapSetAllocationClass": (13050, (_int32, ctypes.c_void_p)),
}  # fmt: skip


# CUgraphRecaptureCallback: (data, node, original CUgraphNodeParams *, recaptured one, CUgraphRecaptureStatus).
_RECAPTURE_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int
)
_RECAPTURE_ARGS = (ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, _RECAPTURE_CALLBACK, ctypes.c_void_p)


def with_aligned_tensor_map(function: Callable[..., int], args: tuple, initial: bytes = b"") -> bytes:
    """Call `function(map, *args)` on a 64-byte-aligned CUtensorMap holding `initial`; its 128 bytes after."""
    storage = ctypes.create_string_buffer(TENSOR_MAP_BYTES + TENSOR_MAP_ALIGN)
    address = -(-ctypes.addressof(storage) // TENSOR_MAP_ALIGN) * TENSOR_MAP_ALIGN
    ctypes.memmove(address, bytes(initial).ljust(TENSOR_MAP_BYTES, b"\0"), TENSOR_MAP_BYTES)
    result = function(address, *args)
    if result:
        raise CudaError(result, "tensor map")
    return ctypes.string_at(address, TENSOR_MAP_BYTES)


def _ok(result):
    """(CUresult, values...) -> the values; raises CudaError for anything but CUDA_SUCCESS."""
    err = result[0]
    if err != driver.CUresult.CUDA_SUCCESS:
        raise CudaError(int(err))
    if len(result) == 1:
        return None
    if len(result) == 2:
        return result[1]
    return result[1:]


def _named(call: str, result):
    """_ok, with the failing entry point named in the error (for steps an operator's log has to tell apart)."""
    if result[0] != driver.CUresult.CUDA_SUCCESS:
        raise CudaError(int(result[0]), call)
    return _ok(result)


def _int(value) -> int:
    return int(value) if value is not None else 0


def _edge_data_bytes(edge) -> bytes:
    """CUgraphEdgeData as the wire carries it: from port, to port, type, five reserved bytes."""
    return bytes((int(edge.from_port), int(edge.to_port), int(edge.type))) + bytes(5)


def _enum(kind, value: int):
    try:
        return kind(value)
    except ValueError as exc:
        raise CudaError(INVALID_VALUE, f"{kind.__name__} {value}") from exc


def _address(view: memoryview) -> int:
    """The address of a writable buffer's first byte."""
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


class _Launchable:
    """A function's parameter buffer and the kernelParams array pointing into it, built once."""

    def __init__(self, func: int, layout: list[tuple[int, int]]) -> None:
        size = max((offset + size for offset, size in layout), default=0)
        self.buffer = ctypes.create_string_buffer(max(size, 1))
        base = ctypes.addressof(self.buffer)
        self.pointers = (ctypes.c_void_p * max(len(layout), 1))(*[base + offset for offset, _ in layout])
        self.params = ctypes.addressof(self.pointers) if layout else 0
        self.function = driver.CUfunction(func)
        self.layout = layout
        self.lock = threading.Lock()


class _Staging:
    """Two page-locked chunk buffers and their events, for one thread in one context."""

    def __init__(self) -> None:
        flags = 1  # CU_MEMHOSTALLOC_PORTABLE
        self.addresses = [int(_ok(driver.cuMemHostAlloc(STAGING_CHUNK, flags))) for _ in range(2)]
        self.views = [
            memoryview((ctypes.c_char * STAGING_CHUNK).from_address(a)).cast("B") for a in self.addresses
        ]
        self.events = [_ok(driver.cuEventCreate(2)) for _ in range(2)]  # CU_EVENT_DISABLE_TIMING
        self.busy = [False, False]

    def record(self, k: int, stream) -> None:
        _ok(driver.cuEventRecord(self.events[k], stream))
        self.busy[k] = True

    def wait(self, k: int) -> None:
        if self.busy[k]:
            _ok(driver.cuEventSynchronize(self.events[k]))
            self.busy[k] = False

    def free(self) -> None:
        for k in range(2):
            self.wait(k)
            driver.cuEventDestroy(self.events[k])
            driver.cuMemFreeHost(self.addresses[k])


class _Buffer:
    """Host memory of the worker's own (mmap), registered with the driver: it outlives any context, so
    a context the client destroys or resets leaves it valid (a copy into it is then merely synchronous).
    A page after it holds the word streams write as copies' marks, registered on its own, mapped for
    the device, once a stream is to write there."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.memory = mmap.mmap(-1, size + _MARK_BYTES)
        self.anchor = ctypes.c_char.from_buffer(self.memory)
        self.address = ctypes.addressof(self.anchor)
        self.mark = ctypes.c_uint32.from_address(self.address + size)
        # PORTABLE: page-locked for every context. Refused (no room): pageable, still correct.
        self.registered = driver.cuMemHostRegister(self.address, size, 1)[0] == 0
        self._mark_device: int | None = None
        self._mark_registered = False

    def mark_device(self) -> int:
        """The mark's device address (0: none to be had)."""
        if self._mark_device is None:
            self._mark_device = 0
            flags = 3  # PORTABLE | DEVICEMAP
            if driver.cuMemHostRegister(self.address + self.size, _MARK_BYTES, flags)[0] == 0:
                found = driver.cuMemHostGetDevicePointer(self.address + self.size, 0)
                self._mark_device = int(found[1]) if found[0] == 0 else 0
                self._mark_registered = True
        return self._mark_device

    def drop(self) -> None:
        if self.registered:
            driver.cuMemHostUnregister(self.address)
        if self._mark_registered:
            driver.cuMemHostUnregister(self.address + self.size)


class _PinnedPool:
    """Page-locked buffers of copies in flight to the client, by power-of-two size, and their events.
    Both come back on any thread (the host-function thread may make no CUDA call), so what is not kept
    is unregistered or destroyed at the next take, on a connection's thread."""

    def __init__(self) -> None:
        self.free: dict[int, list[_Buffer]] = {}
        self.kept = 0
        self.doomed: list[_Buffer] = []
        self.doomed_events: list = []
        # finished copies' events by context, recorded again by later copies
        self.events: dict[int, list] = {}
        self.lock = threading.Lock()

    def take(self, count: int) -> _Buffer:
        size = max(64 << 10, 1 << (count - 1).bit_length())
        with self.lock:
            doomed, self.doomed = self.doomed, []
            events, self.doomed_events = self.doomed_events, []
            free = self.free.get(size)
            buffer = free.pop() if free else None
            self.kept -= size if buffer else 0
        for old in doomed:
            old.drop()
        for event in events:
            driver.cuEventDestroy(event)
        return buffer or _Buffer(size)

    def drop_kept(self) -> None:
        """Before a context goes: the buffers kept for reuse were page-locked in it, maybe (registered
        while it was current); let go now, new ones are page-locked in the context current then."""
        with self.lock:
            kept, self.free, self.kept = [b for bs in self.free.values() for b in bs], {}, 0
        for buffer in kept:
            buffer.drop()

    def take_event(self, ctx: int):
        """An event of context `ctx` (current on this thread) for a copy: a finished copy's, or a new one."""
        with self.lock:
            kept = self.events.get(ctx)
            event = kept.pop() if kept else None
        return event if event is not None else _ok(driver.cuEventCreate(2))  # CU_EVENT_DISABLE_TIMING

    def destroy_events(self) -> None:
        """Before a context goes: the events given back may be its (the driver frees them with it, and
        destroying one after that would free freed memory)."""
        with self.lock:
            events, self.doomed_events = self.doomed_events, []
            for kept in self.events.values():
                events.extend(kept)
            self.events = {}
        for event in events:
            driver.cuEventDestroy(event)

    def give(self, buffer: _Buffer | None, event, ctx: int = 0) -> None:
        """`buffer` None: only the event comes back; `event` None: only the buffer. `ctx`: the event's
        context, given where its record is known to be over (it is recorded again there); else destroyed."""
        with self.lock:
            kept = self.events.setdefault(ctx, []) if ctx and event is not None else None
            if kept is not None and len(kept) < EVENTS_KEPT:
                kept.append(event)
            elif event is not None:
                self.doomed_events.append(event)
            if buffer is None:
                return
            if self.kept + buffer.size <= ASYNC_STAGING_KEPT:
                self.free.setdefault(buffer.size, []).append(buffer)
                self.kept += buffer.size
            else:
                self.doomed.append(buffer)


_WAIT_VALUE_EQ = 1  # CU_STREAM_WAIT_VALUE_EQ


class _StagedIn:
    """A copy to the device queued before its bytes are here (gpLaneCopy's LANE_LATER: the client's lanes send
    them after the process's next frames). Its stream waits for the buffer's mark (`cuStreamWaitValue32`), which
    `filled()` writes once the lanes have put every byte into the buffer; the stream then copies them and writes
    a second word, at which the buffer goes back to the pool (`done`, read by any thread: no CUDA call)."""

    def __init__(self, buffer: _Buffer, seq: int, count: int) -> None:
        self.buffer, self.seq, self.count = buffer, seq, count
        self._done = ctypes.c_uint32.from_address(buffer.address + buffer.size + 4)
        self.view = memoryview(buffer.memory)[:count]

    @classmethod
    def queued(cls, executor: CudaExecutor, dst: int, count: int, stream) -> _StagedIn | None:
        """The copy queued on `stream`, or None where it cannot be (no page-locked buffer with a mark the
        device reaches, no stream memory operations): nothing was queued then. CudaError: queuing failed."""
        buffer = executor.pinned.take(count)
        mark = buffer.mark_device() if buffer.registered else 0  # pageable: the copy would read it at once
        seq = next(_marks) & 0xFFFFFFFF or 1  # never the word left there before
        if not mark or driver.cuStreamWaitValue32(stream, mark, seq, _WAIT_VALUE_EQ)[0]:
            executor.pinned.give(buffer, None)
            return None
        staged = cls(buffer, seq, count)
        try:
            _ok(driver.cuMemcpyHtoDAsync(dst, buffer.address, count, stream))
            _ok(driver.cuStreamWriteValue32(stream, mark + 4, seq, 0))
        except CudaError:
            staged.filled()  # the stream must not wait for bytes that no copy will take
            raise
        return staged

    def filled(self) -> None:
        """Every byte is in the buffer (or the copy failed): the stream goes on."""
        self.buffer.mark.value = self.seq

    def done(self) -> bool:
        return self._done.value == self.seq


# The NULL stream, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD: a value that names a context's or a thread's own
# stream, so two copies with that value may be on different streams.
_SPECIAL_STREAMS = (0, 1, 2)


class _IpcHandle(ctypes.Structure):
    """CUipcEventHandle (and CUipcMemHandle): 64 bytes, passed by value."""

    _fields_ = [("reserved", ctypes.c_ubyte * 64)]


class _InFlight(StagedCopy):
    """A copy queued on a stream into a page-locked buffer, with an event and a mark behind it."""

    def __init__(self, executor: CudaExecutor, src: int, count: int, stream) -> None:
        self.executor, self.count = executor, count
        self.ctx = executor._local().ctx
        self.buffer = executor.pinned.take(count)
        self.address = self.buffer.address
        self.sem = None
        self.seq = next(_marks) & 0xFFFFFFFF or 1  # never the word left there before: no reset needed
        self.event = executor.pinned.take_event(self.ctx)
        self.error = 0
        self.done = False
        handle = _int(stream)
        if handle not in _SPECIAL_STREAMS:  # a stream the program made: one queue, whichever thread asks
            self.order = handle
        try:
            mark = self.buffer.mark_device() if executor.stream_marks else 0
            queue = executor.copy_queuer if mark else None
            if queue is not None:  # the three calls below in one C call: the GIL let go once
                err, failed = queue(self.address, src, count, handle, _int(self.event), mark, self.seq)
                if err and failed < 2:
                    raise CudaError(err)
                marked = not err
            else:
                _ok(driver.cuMemcpyDtoHAsync(self.address, src, count, stream))
                _ok(driver.cuEventRecord(self.event, stream))
                marked = bool(mark) and not driver.cuStreamWriteValue32(stream, mark, self.seq, 0)[0]
            if mark and not marked:
                executor.stream_marks = False  # refused (no stream memory operations): not asked again
            if not marked:
                self.sem = (ctypes.c_char * _SEM_BYTES)()
                _libc.sem_init(self.sem, 0, 0)
                executor.launch_host_fn(stream, _SEM_POST, ctypes.addressof(self.sem))
        except CudaError:
            driver.cuStreamSynchronize(stream)  # nothing of ours left in flight on it
            self.done = True
            self.release()
            raise

    def _marked(self) -> bool:
        if self.sem is None:
            return self.buffer.mark.value == self.seq
        value = ctypes.c_int()
        _libc.sem_getvalue(self.sem, ctypes.byref(value))
        return value.value > 0

    def ready(self) -> bool:
        if self.done or self._marked():
            return True
        if getattr(_driver_thread, "calling_back", False):
            return False  # the mark comes soon after the event; no CUDA call on the driver's thread
        return self._in_context(driver.cuEventQuery) == driver.CUresult.CUDA_SUCCESS

    def _in_context(self, ask):
        """`ask(event)`'s result, made in the copy's context from any thread."""
        err = driver.cuCtxPushCurrent(driver.CUcontext(self.ctx))[0]
        if err == driver.CUresult.CUDA_SUCCESS:
            err = ask(self.event)[0]
            driver.cuCtxPopCurrent()
        return err

    def wait(self) -> None:
        if self.done:
            return
        if self._mark_came():
            self.done = True
            return
        err = self._in_context(driver.cuEventSynchronize)
        if err != driver.CUresult.CUDA_SUCCESS:  # the context failed or is gone: no bytes to send
            self.error = int(err)
        self.done = True  # the event says the bytes are in; the mark may come later

    def _mark_came(self) -> bool:
        """Waits for the mark its stream writes, without a driver call while the copy runs (the delivery
        thread's cuEventSynchronize met the connection thread's next copies in the driver and the GIL,
        bench/RESULTS.md run CG). False: the copy's event is to say how it ended (no mark written here, the
        copy failed or its context did, or the waiter is not built)."""
        waiter = self.executor.word_waiter if self.sem is None else None
        if waiter is None:
            return False
        while not waiter(self.address + self.buffer.size, self.seq, _MARK_ASK_NS):
            if self._in_context(driver.cuEventQuery) != driver.CUresult.CUDA_ERROR_NOT_READY:
                return False  # done, the mark just behind it, or failed: its synchronise says which
        return True

    def view(self) -> memoryview:
        if self.error:
            raise CudaError(self.error, "the copy to the host failed")
        return memoryview((ctypes.c_char * self.count).from_address(self.address)).cast("B")

    def release(self) -> None:
        if self.address == 0:
            return
        if not self.ready():
            self.wait()  # the client is gone: the buffer goes back once the DMA is over
        if self._marked():
            if self.sem is not None:
                _libc.sem_destroy(self.sem)
            self.executor.pinned.give(self.buffer, self.event, self.ctx)  # the event's record is over
        else:  # the stream may still write its mark or the driver post it (a context that failed)
            _kept.append((self.sem, self.buffer))
            self.executor.pinned.give(None, self.event)
        self.address = 0


def _driver_lacks() -> list[str]:
    """The call table's ABIs this driver does not have, asked of it once (cuda-bindings may declare calls
    of a newer CUDA than the driver installed): cuGetProcAddress(name, the ABI's version) finds a function,
    and not the one the name's previous ABI's version finds (a driver without the newer ABI hands out its
    older one there) unless the driver exports the ABI's own symbol."""
    lib = ctypes.CDLL("libcuda.so.1")
    lookup = lib.cuGetProcAddress_v2
    lookup.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64,
                       ctypes.POINTER(ctypes.c_int)]  # fmt: skip

    def found(name: str, version: int) -> int | None:
        pfn, status = ctypes.c_void_p(), ctypes.c_int()
        if lookup(name.encode(), ctypes.byref(pfn), version, 0, ctypes.byref(status)) != 0:
            return None
        return pfn.value or None

    previous: dict[str, int | None] = {}  # table_abis is oldest first: each name's previous ABI's answer

    def has(call: Call) -> bool:
        function = found(call.name, call.since)
        before, previous[call.name] = previous.get(call.name), function
        return function is not None and (function != before or hasattr(lib, call.symbol))

    return lacked_abis(has)


class CudaExecutor(Executor):
    name = "cuda"

    def driver_lacks(self) -> list[str]:
        try:
            return _driver_lacks()
        except (
            Exception
        ) as exc:  # best effort (a driver older than cuGetProcAddress_v2): the worker still serves
            log.warning("could not ask the driver which entry points it has: %s", exc)
            return []

    def __init__(self, devices) -> None:
        """`devices`: the lease's GPUs (WorkerDevice), shown to the client as devices 0..n-1."""
        _ok(driver.cuInit(0))
        self.real = [self._find(d, position) for position, d in enumerate(devices)]
        self.launchables: dict[int, _Launchable] = {}
        self.streams: dict[int, driver.CUstream] = {}
        self.local = threading.local()  # per connection thread: scratch and staging buffers
        # Every thread's staging and copy-event maps (context -> ...), so that a context destroyed on one
        # thread is forgotten by all: what the driver freed with it must never be freed again.
        self._context_maps: list[tuple[dict, dict]] = []
        self._context_maps_lock = threading.Lock()
        self.linked: dict[int, bytes] = {}  # link state -> the image cuLinkComplete made
        # Host functions: one C thunk for the process's life (the driver calls it with a key).
        self.host_funcs: dict[int, Callable[[], None]] = {}
        self.kept_host_funcs: set[int] = set()  # host functions captured into graphs (never popped)
        self._host_keys = itertools.count(1)
        self._host_thunk = _HOST_FN(self._run_host_func)
        self._host_thunk_address = ctypes.cast(self._host_thunk, ctypes.c_void_p).value
        self._host_thunk_fn = driver.CUhostFn(self._host_thunk_address)
        self.pinned = _PinnedPool()  # buffers of asynchronous copies to the client
        self.stream_marks = True  # whether the streams write copies' marks (stream memory operations)
        self.staged_in: list[
            _StagedIn
        ] = []  # copies to the device whose buffers are not back yet (lane_staged)
        self.staged_lock = threading.Lock()
        # the driver's own entry points called through ctypes: tensor maps (aligned), border colors (float[4])
        self.driver_functions: dict[str, Callable[..., int]] = {}
        self.recapture_callbacks: dict[int, object] = {}  # stream -> its recapture's ctypes callback
        # Green contexts: the driver's CUdevResource structs by the ids the client holds, each green
        # context's device, and the ids' source.
        self.resources: dict[int, driver.CUdevResource] = {}
        self.green_devices: dict[int, int] = {}
        self._resource_ids = itertools.count(1)
        # References the lease's processes hold to each GPU's primary context (a move lets go of the source's).
        self.primary_retains: dict[int, int] = {}
        # What a move makes anew of the lease's arrays and samplers: each array's and mipmapped array's
        # context and shape (and levels), each texture or surface object's context and descriptions.
        self.array_homes: dict[int, tuple[int, ArrayShape]] = {}
        self.mipmap_homes: dict[int, tuple[int, ArrayShape, int]] = {}
        self.sampler_homes: dict[int, tuple[int, bytes, bytes | None, bytes | None]] = {}
        # The program's own virtual memory: each cuMemCreate handle's size, GPU, handle types and usage (while
        # the program holds it), each mapping (address -> size, offset, handle), the access each
        # cuMemSetAccess gave ((address, size) -> lease devices and flags), and the handles a move cannot
        # follow (imported, retained, bound to a multicast object: references it does not hold).
        self.vm_homes: dict[int, tuple[int, int, int, int]] = {}
        self.vm_maps: dict[int, tuple[int, int, int]] = {}
        self.vm_access: dict[tuple[int, int], list[tuple[int, int]]] = {}
        self.vm_shared: set[int] = set()
        self.vm_released: dict[int, tuple[int, int, int, int]] = {}  # let go of, kept alive by its mappings

    @staticmethod
    def _find(device, position: int) -> int:
        """The CUDA ordinal of a lease GPU: by UUID, else its position (start_worker makes the lease's
        GPUs the process's CUDA_VISIBLE_DEVICES, in order)."""
        count = _ok(driver.cuDeviceGetCount())
        if device.uuid:
            want = device.uuid.removeprefix("GPU-").replace("-", "").lower()
            for ordinal in range(count):
                if bytes(_ok(driver.cuDeviceGetUuid(ordinal)).bytes).hex() == want:
                    return ordinal
            raise CudaError(CUresult.INVALID_DEVICE, f"no CUDA device has UUID {device.uuid}")
        if not 0 <= position < count:
            raise CudaError(CUresult.INVALID_DEVICE, f"CUDA sees {count} device(s), the lease has more")
        return position

    # -- helpers -------------------------------------------------------------------------------------

    def _local(self) -> threading.local:
        local = self.local
        if not hasattr(local, "scratch"):
            local.scratch = memoryview(bytearray(SMALL_COPY))
            local.staging = {}
            local.copy_events = {}  # ctx -> events of copies through shared memory
            local.ctx = 0
            with self._context_maps_lock:
                self._context_maps.append((local.staging, local.copy_events))
        return local

    def _staging(self) -> _Staging:
        """This thread's staging buffers for the current context (events belong to a context)."""
        local = self._local()
        staging = local.staging.get(local.ctx)
        if staging is None:
            staging = local.staging[local.ctx] = _Staging()
        return staging

    def _d(self, dev: int) -> int:
        """The client's device ordinal (0..n-1 of the lease) -> this host's CUDA ordinal."""
        if not 0 <= dev < len(self.real):
            raise CudaError(CUresult.INVALID_DEVICE, f"device {dev} is not part of this lease")
        return self.real[dev]

    def _stream(self, handle: int):
        stream = self.streams.get(handle)
        if stream is None:
            stream = self.streams[handle] = driver.CUstream(handle)
        return stream

    # -- the seam ------------------------------------------------------------------------------------

    def end_thread(self) -> None:
        """A connection's thread is done: its page-locked staging buffers and copy events go (each pins
        host memory; a worker serving many short runs would otherwise keep every run's). A context the
        client destroyed took its own with it (`_forget_context`)."""
        local = self._local()
        with self._context_maps_lock:
            self._context_maps = [m for m in self._context_maps if m[0] is not local.staging]
        for ctx, staging in local.staging.items():
            with contextlib.suppress(CudaError):
                self.set_context(ctx)
                staging.free()
        local.staging.clear()
        for ctx, events in local.copy_events.items():
            with contextlib.suppress(CudaError):
                self.set_context(ctx)
                for event in events:
                    driver.cuEventDestroy(event)
        local.copy_events.clear()

    def set_context(self, ctx: int) -> None:
        _ok(driver.cuCtxSetCurrent(driver.CUcontext(ctx)))
        self._local().ctx = ctx

    def copy_to_device(self, dst, count, stream, fill) -> None:
        s = self._stream(stream or 0)  # None (the synchronous copy) runs on the legacy default stream
        if count <= SMALL_COPY:
            # Pageable memory: the driver has taken the bytes when the call returns.
            view = self._local().scratch[:count]
            fill(view)
            if stream is None:
                _ok(driver.cuMemcpyHtoD(dst, _address(view), count))
            else:
                _ok(driver.cuMemcpyHtoDAsync(dst, _address(view), count, s))
            return
        # Large: page-locked chunks, two in flight, so receiving chunk k+1 overlaps the DMA of chunk k.
        staging = self._staging()
        offset, k = 0, 0
        while offset < count:
            n = min(STAGING_CHUNK, count - offset)
            staging.wait(k)
            fill(staging.views[k][:n])
            _ok(driver.cuMemcpyHtoDAsync(dst + offset, staging.addresses[k], n, s))
            staging.record(k, s)
            offset += n
            k ^= 1
        if stream is None:
            staging.wait(k ^ 1)  # synchronous: on the device before the next call runs

    def copy_from_device(self, src, count, stream, send) -> None:
        s = self._stream(stream or 0)
        if count <= SMALL_COPY:
            view = self._local().scratch[:count]
            if stream is None:
                _ok(driver.cuMemcpyDtoH(_address(view), src, count))
            else:
                _ok(driver.cuMemcpyDtoHAsync(_address(view), src, count, s))
                _ok(driver.cuStreamSynchronize(s))
            send(view)
            return
        # Large: the DMA of chunk k+1 runs while chunk k goes out on the socket.
        staging = self._staging()
        sizes = []
        offset, k = 0, 0
        while offset < count or sizes:
            if offset < count:
                n = min(STAGING_CHUNK, count - offset)
                staging.wait(k)  # its previous chunk has been sent (send() returns when it has)
                _ok(driver.cuMemcpyDtoHAsync(staging.addresses[k], src + offset, n, s))
                staging.record(k, s)
                sizes.append((k, n))
                offset += n
                k ^= 1
                if len(sizes) < 2 and offset < count:
                    continue
            j, n = sizes.pop(0)
            staging.wait(j)
            send(staging.views[j][:n])

    def shared_host_memory(self, size: int) -> SharedHostMemory:
        shared = super().shared_host_memory(size)
        shared.address = _address(shared.view)
        try:
            _ok(driver.cuMemHostRegister(shared.address, size, 1))  # CU_MEMHOSTREGISTER_PORTABLE
        except CudaError:
            shared.close()
            raise
        return shared

    def release_shared_host_memory(self, shared: SharedHostMemory) -> None:
        driver.cuMemHostUnregister(shared.address)
        shared.close()

    def copy_in_from(self, dst, shared, offset, count, stream, last) -> None:
        s = self._stream(stream or 0)
        _ok(driver.cuMemcpyHtoDAsync(dst, shared.address + offset, count, s))
        if last:  # the client writes the memory again once answered: every piece read by then
            event = self._copy_event()
            _ok(driver.cuEventRecord(event, s))
            _ok(driver.cuEventSynchronize(event))

    def copy_out_into(self, shared, offset, src, count, stream) -> StagedCopy:
        s = self._stream(stream or 0)
        _ok(driver.cuMemcpyDtoHAsync(shared.address + offset, src, count, s))
        done = _ok(driver.cuEventCreate(2))  # CU_EVENT_DISABLE_TIMING
        _ok(driver.cuEventRecord(done, s))
        landed = _Landed(done)
        if stream is None:
            landed.wait()
        return landed

    def copy_pinned_captured(self, device, shared, offset, count, stream, to_device) -> None:
        s = self._stream(stream)  # the driver records a memcpy node with the worker's mapping of the pages
        if to_device:
            _ok(driver.cuMemcpyHtoDAsync(device, shared.address + offset, count, s))
        else:
            _ok(driver.cuMemcpyDtoHAsync(shared.address + offset, device, count, s))

    def copy_out_piece(self, shared, offset, src, count, stream) -> None:
        # as the native loop's shm_dtoh (dispatch.c): the copy, then its stream waited for
        s = self._stream(stream or 0)
        _ok(driver.cuMemcpyDtoHAsync(shared.address + offset, src, count, s))
        _ok(driver.cuStreamSynchronize(s))

    def _copy_event(self):
        """This thread's event for copies through shared memory, in the current context."""
        local = self._local()
        events = local.copy_events.get(local.ctx)
        if events is None:
            events = local.copy_events[local.ctx] = [_ok(driver.cuEventCreate(2))]  # DISABLE_TIMING
        return events[0]

    def lane_staged(self, dst, count, stream):
        if count > ASYNC_STAGING_MAX or not self.stream_marks:
            return None
        with self.staged_lock:  # the copies done by now give their buffers back
            done = [old for old in self.staged_in if old.done()]
            self.staged_in = [old for old in self.staged_in if old not in done]
        for old in done:
            self.pinned.give(old.buffer, None)
        new = _StagedIn.queued(self, dst, count, self._stream(stream))
        if new is None:
            return None
        with self.staged_lock:
            self.staged_in.append(new)
        return new

    def copy_from_device_async(self, src, count, stream) -> StagedCopy:
        if count > ASYNC_STAGING_MAX:  # not worth pinning that much: staged now, the stream waited for
            data = bytearray(count)
            at = 0

            def keep(view: memoryview) -> None:
                nonlocal at
                data[at : at + len(view)] = view
                at += len(view)

            self.copy_from_device(src, count, stream, keep)
            return CopiedBytes(data)
        return _InFlight(self, src, count, self._stream(stream))

    def memset(self, dst: int, value: int, element_size: int, count: int, stream: int | None) -> None:
        name = {1: "cuMemsetD8", 2: "cuMemsetD16", 4: "cuMemsetD32"}[element_size]
        if stream is None:
            _ok(getattr(driver, name)(dst, value, count))
        else:
            _ok(getattr(driver, name + "Async")(dst, value, count, self._stream(stream)))

    def cuStreamWaitValue32(self, stream, addr, value, flags):
        _ok(driver.cuStreamWaitValue32(self._stream(stream), addr, value, flags))

    def cuStreamWaitValue64(self, stream, addr, value, flags):
        _ok(driver.cuStreamWaitValue64(self._stream(stream), addr, value, flags))

    def cuStreamWriteValue32(self, stream, addr, value, flags):
        _ok(driver.cuStreamWriteValue32(self._stream(stream), addr, value, flags))

    def cuStreamWriteValue64(self, stream, addr, value, flags):
        _ok(driver.cuStreamWriteValue64(self._stream(stream), addr, value, flags))

    def cuStreamGetAttribute(self, stream, attr):
        value = _ok(driver.cuStreamGetAttribute(self._stream(stream), _enum(driver.CUstreamAttrID, attr)))
        return ctypes.string_at(value.getPtr(), 64)

    def cuStreamSetAttribute(self, stream, attr, value):
        kind = _enum(driver.CUstreamAttrID, attr)
        _ok(
            driver.cuStreamSetAttribute(
                self._stream(stream), kind, self._struct(driver.CUstreamAttrValue, value)
            )
        )

    def cuStreamCopyAttributes(self, dst, src):
        _ok(driver.cuStreamCopyAttributes(self._stream(dst), self._stream(src)))

    def copy_3d(self, src, dst, extent, stream, data):
        width, height, depth = extent
        host = (
            bytearray(data)
            if src.kind == HOST
            else bytearray(width * height * depth)
            if dst.kind == HOST
            else None
        )
        copy = driver.CUDA_MEMCPY3D()
        for prefix, side in (("src", src), ("dst", dst)):
            setattr(copy, f"{prefix}MemoryType", driver.CUmemorytype(side.kind))
            setattr(copy, f"{prefix}XInBytes", side.x)
            setattr(copy, f"{prefix}Y", side.y)
            setattr(copy, f"{prefix}Z", side.z)
            setattr(copy, f"{prefix}Pitch", side.pitch)
            setattr(copy, f"{prefix}Height", side.height)
            if side.kind == HOST:
                setattr(
                    copy, f"{prefix}Host", ctypes.addressof((ctypes.c_char * len(host)).from_buffer(host))
                )
            elif side.kind == DEVICE:
                setattr(copy, f"{prefix}Device", side.at)
            else:
                setattr(copy, f"{prefix}Array", driver.CUarray(side.at))
        copy.WidthInBytes, copy.Height, copy.Depth = width, height, depth
        if stream is None:
            _ok(driver.cuMemcpy3D(copy))
        else:
            _ok(driver.cuMemcpy3DAsync(copy, self._stream(stream)))
            if dst.kind == HOST:  # the bytes go back in this call's reply
                _ok(driver.cuStreamSynchronize(self._stream(stream)))
        return host if dst.kind == HOST else None

    def param_layout(self, func: int, is_kernel: bool) -> list[tuple[int, int]]:
        layout = []
        handle = driver.CUkernel(func) if is_kernel else driver.CUfunction(func)
        info = driver.cuKernelGetParamInfo if is_kernel else driver.cuFuncGetParamInfo
        while True:
            result = info(handle, len(layout))
            if result[0] == _INVALID_VALUE_RESULT:  # one past the last parameter
                return layout
            offset, size = _ok(result)
            layout.append((int(offset), int(size)))

    def launch(self, launch: Launch) -> None:
        func, layout, params = launch.func, launch.layout, launch.params
        target = self.launchables.get(func)
        if target is None or target.layout is not layout:  # new, or a reused handle of unloaded code
            target = self.launchables[func] = _Launchable(func, layout)
        with target.lock:  # the buffer is read by the driver during the call only
            ctypes.memmove(target.buffer, params, min(len(params), len(target.buffer)))
            stream = self._stream(launch.stream)
            if not launch.attributes:
                _ok(
                    driver.cuLaunchKernel(
                        target.function,
                        *launch.grid,
                        *launch.block,
                        launch.shared_mem,
                        stream,
                        target.params,
                        0,
                    )
                )
                return
            config = self._config(
                launch.grid, launch.block, launch.shared_mem, launch.stream, launch.attributes
            )
            _ok(driver.cuLaunchKernelEx(config, target.function, target.params, 0))

    def _config(self, grid, block, shared_mem, stream, attributes):
        config = driver.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = grid
        config.blockDimX, config.blockDimY, config.blockDimZ = block
        config.sharedMemBytes = shared_mem
        config.hStream = self._stream(stream)
        config.attrs = [self._attribute(i, v) for i, v in attributes]
        config.numAttrs = len(attributes)
        return config

    def tensor_map(self, name: str, ins: tuple, arrays: list[list[int]]) -> bytes:
        dims, strides = (
            (ctypes.c_uint64 * len(arrays[0]))(*arrays[0]),
            (ctypes.c_uint64 * len(arrays[1]))(*arrays[1]),
        )
        if name == "cuTensorMapEncodeTiled":
            dtype, rank, address, interleave, swizzle, l2, oob = ins
            box, element = ((ctypes.c_uint32 * len(a))(*a) for a in arrays[2:])
            args = (dtype, rank, address, dims, strides, box, element, interleave, swizzle, l2, oob)
        elif name == "cuTensorMapEncodeIm2col":
            dtype, rank, address, channels, pixels, interleave, swizzle, l2, oob = ins
            lower, upper = ((ctypes.c_int32 * len(a))(*a) for a in arrays[2:4])
            element = (ctypes.c_uint32 * len(arrays[4]))(*arrays[4])
            args = (dtype, rank, address, dims, strides, lower, upper, channels, pixels, element, interleave,
                    swizzle, l2, oob)  # fmt: skip
        else:  # cuTensorMapEncodeIm2colWide
            dtype, rank, address, lower, upper, channels, pixels, interleave, mode, swizzle, l2, oob = ins
            element = (ctypes.c_uint32 * len(arrays[2]))(*arrays[2])
            args = (dtype, rank, address, dims, strides, lower, upper, channels, pixels, element, interleave, mode,
                    swizzle, l2, oob)  # fmt: skip
        return with_aligned_tensor_map(self._tensor_map_function(name), args)

    def tensor_map_address(self, encoded: bytes, address: int) -> bytes:
        return with_aligned_tensor_map(
            self._tensor_map_function("cuTensorMapReplaceAddress"), (address,), encoded
        )

    def tensor_map_alloc_class(self, encoded: bytes, alloc_class: int) -> tuple[bytes, int]:
        effective = ctypes.c_int32(1)
        changed = with_aligned_tensor_map(
            self._tensor_map_function("cuTensorMapSetAllocationClass"),
            (alloc_class, ctypes.addressof(effective)),
            encoded,
        )
        return changed, effective.value

    def _tensor_map_function(self, name: str):
        version, argtypes = TENSOR_MAP_CALLS[name]
        return self._driver_function(name, version, (ctypes.c_void_p, *argtypes))

    def _driver_function(self, name: str, version: int, argtypes: tuple):
        """The driver's own entry point `name`, as a ctypes function returning a CUresult (looked up once)."""
        function = self.driver_functions.get(name)
        if function is None:
            flags = driver.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_DEFAULT
            pfn, _status = _ok(driver.cuGetProcAddress(name.encode(), version, flags))
            if not _int(pfn):
                raise CudaError(NOT_SUPPORTED, f"the driver has no {name}")
            function = ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)(_int(pfn))
            self.driver_functions[name] = function
        return function

    def launch_host_func(self, stream, fn) -> None:
        key = next(self._host_keys)
        self.host_funcs[key] = fn
        capturing = _ok(driver.cuStreamIsCapturing(self._stream(stream)))
        if capturing != driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE:
            self.kept_host_funcs.add(key)  # a graph's host node: it runs at every launch
        try:
            self.launch_host_fn(self._stream(stream), self._host_thunk_address, key)
        except BaseException:
            self.host_funcs.pop(key, None)
            raise

    def launch_host_fn(self, stream, fn: int, data: int) -> None:
        """cuLaunchHostFunc(stream, fn, data) through the driver's own entry point. cuda.bindings' wraps the
        function in a record it frees after the first call, so a host node captured into a graph called
        freed memory at the graph's second launch and crashed the worker (NVIDIA/cuda-python#790; CuPy's
        test_capture_launch_host_func)."""
        launch = self._driver_function(
            "cuLaunchHostFunc", 10000, (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
        )
        result = launch(_int(stream), fn, data)
        if result:
            raise CudaError(result, "cuLaunchHostFunc")

    def _run_host_func(self, key) -> None:
        """On the driver's callback thread: no CUDA call may be made here (none is)."""
        fn = self.host_funcs.get(key) if key in self.kept_host_funcs else self.host_funcs.pop(key, None)
        if fn is not None:
            _driver_thread.calling_back = True
            try:
                fn()
            except Exception:  # a failure here must not take the driver's thread down
                log.exception("host function failed")
            finally:
                _driver_thread.calling_back = False

    def reserve_addresses(self, size: int, hint: int) -> int:
        return _int(_ok(driver.cuMemAddressReserve(size, 1 << 30, hint, 0)))

    def release_addresses(self, base: int, size: int) -> None:
        _ok(driver.cuMemAddressFree(base, size))

    def _prop(self, device: int, handle_types: int = 0):
        return self._prop_at(self._d(device), handle_types)

    @staticmethod
    def _prop_at(ordinal: int, handle_types: int = 0):
        prop = driver.CUmemAllocationProp()
        prop.type = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = ordinal
        if handle_types:
            prop.requestedHandleTypes = _enum(driver.CUmemAllocationHandleType, handle_types)
        return prop

    def map_memory(self, base: int, size: int, device: int, exportable: bool = False):
        err, handle = driver.cuMemCreate(size, self._prop(device, _POSIX_FD if exportable else 0), 0)
        if err != driver.CUresult.CUDA_SUCCESS and exportable:  # refused as exportable: memory all the same
            log.info("exportable memory refused (%s): another worker of the lease cannot open it", err.name)
            err, handle = driver.cuMemCreate(size, self._prop(device), 0)
        handle = _ok((err, handle))
        mapped = False
        try:
            _ok(driver.cuMemMap(base, size, 0, handle, 0))
            mapped = True
            access = self._access(device)
            _ok(driver.cuMemSetAccess(base, size, access, len(access)))
        except BaseException:
            if mapped:
                driver.cuMemUnmap(base, size)
            driver.cuMemRelease(handle)
            raise
        return handle

    def _access(self, device: int) -> list:
        """Who may touch `device`'s memory: the device, and each lease device that can reach it as a peer
        (cuMemAlloc memory needs cuCtxEnablePeerAccess first; mapped memory is granted here, once)."""
        return self._descs(
            [
                (other, 3)  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                for other, real in enumerate(self.real)
                if other == device or _ok(driver.cuDeviceCanAccessPeer(real, self.real[device]))
            ]
        )

    def _descs(self, access: list[tuple[int, int]]) -> list:
        descs = []
        for device, flags in access:
            desc = driver.CUmemAccessDesc()
            desc.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            desc.location.id = self._d(device)
            desc.flags = _enum(driver.CUmemAccess_flags, flags)
            descs.append(desc)
        return descs

    @staticmethod
    def _descs_at(ordinals: list[int]) -> list:
        """Read-write access for these CUDA ordinals (a migration's scratch range)."""
        descs = []
        for ordinal in ordinals:
            desc = driver.CUmemAccessDesc()
            desc.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            desc.location.id = ordinal
            desc.flags = driver.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
            descs.append(desc)
        return descs

    # The virtual memory API as the program calls it (the guard checked ranges and handles).
    def cuMemCreate(self, size, device, handle_types, usage=0):
        prop = self._prop(device, handle_types)
        prop.allocFlags.usage = usage  # CU_MEM_CREATE_USAGE_TILE_POOL: tiles of sparse arrays
        handle = _int(_ok(driver.cuMemCreate(size, prop, 0)))
        self.vm_homes[handle] = (size, self._d(device), handle_types, usage)
        return handle

    # Multicast objects: their handle types are none (the guard's), devices are the lease's ordinals.
    @staticmethod
    def _multicast_prop(devices, size, flags):
        prop = driver.CUmulticastObjectProp()
        prop.numDevices, prop.size, prop.handleTypes, prop.flags = devices, size, 0, flags
        return prop

    def cuMulticastCreate(self, devices, size, flags):
        return _int(_ok(driver.cuMulticastCreate(self._multicast_prop(devices, size, flags))))

    def cuMulticastAddDevice(self, mc, dev):
        _ok(driver.cuMulticastAddDevice(driver.CUmemGenericAllocationHandle(mc), self._d(dev)))

    def cuMulticastBindMem(self, mc, mc_offset, memory, mem_offset, size, flags):
        handles = driver.CUmemGenericAllocationHandle(mc), driver.CUmemGenericAllocationHandle(memory)
        _ok(driver.cuMulticastBindMem(handles[0], mc_offset, handles[1], mem_offset, size, flags))
        self.vm_shared.add(memory)

    def cuMulticastBindAddr(self, mc, mc_offset, ptr, size, flags):
        _ok(driver.cuMulticastBindAddr(driver.CUmemGenericAllocationHandle(mc), mc_offset, ptr, size, flags))
        self.vm_shared.update(h for at, (n, _, h) in self.vm_maps.items() if at < ptr + size and ptr < at + n)

    def cuMulticastUnbind(self, mc, dev, mc_offset, size):
        _ok(driver.cuMulticastUnbind(driver.CUmemGenericAllocationHandle(mc), self._d(dev), mc_offset, size))

    def cuMulticastGetGranularity(self, devices, size, flags, option):
        kind = _enum(driver.CUmulticastGranularity_flags, option)
        return int(_ok(driver.cuMulticastGetGranularity(self._multicast_prop(devices, size, flags), kind)))

    def cuMemRelease(self, handle):
        _ok(driver.cuMemRelease(driver.CUmemGenericAllocationHandle(handle)))
        if handle not in self.vm_shared and handle in self.vm_homes:  # its mappings keep the memory alive
            home = self.vm_homes.pop(handle)
            if any(m[2] == handle for m in self.vm_maps.values()):
                self.vm_released[handle] = home

    def cuMemImportFromShareableHandle(self, handle):
        """Another reference to memory of the lease, for another of its processes: exported as a POSIX
        descriptor and imported back in this process, as the driver shares memory between processes."""
        posix = driver.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        fd = _int(
            _ok(driver.cuMemExportToShareableHandle(driver.CUmemGenericAllocationHandle(handle), posix, 0))
        )
        try:
            imported = _int(_ok(driver.cuMemImportFromShareableHandle(fd, posix)))
        finally:
            os.close(fd)
        self.vm_shared.update((handle, imported))
        return imported

    # -- CUDA arrays, textures and surfaces ------------------------------------------------------------

    @staticmethod
    def _array_descriptor(shape: ArrayShape):
        desc = driver.CUDA_ARRAY3D_DESCRIPTOR()
        desc.Width, desc.Height, desc.Depth = shape.width, shape.height, shape.depth
        desc.Format = _enum(driver.CUarray_format, shape.format)
        desc.NumChannels, desc.Flags = shape.channels, shape.flags
        return desc

    def cuArray3DCreate(self, shape):
        array = _int(_ok(driver.cuArray3DCreate(self._array_descriptor(shape))))
        self.array_homes[array] = (_int(_ok(driver.cuCtxGetCurrent())), shape)
        return array

    def cuArrayDestroy(self, handle):
        _ok(driver.cuArrayDestroy(driver.CUarray(handle)))
        self.array_homes.pop(handle, None)

    def cuArray3DGetDescriptor(self, handle):
        d = _ok(driver.cuArray3DGetDescriptor(driver.CUarray(handle)))
        return ArrayShape(
            int(d.Width), int(d.Height), int(d.Depth), int(d.Format), int(d.NumChannels), int(d.Flags)
        )

    def cuMipmappedArrayCreate(self, shape, levels):
        mipmap = _int(_ok(driver.cuMipmappedArrayCreate(self._array_descriptor(shape), levels)))
        self.mipmap_homes[mipmap] = (_int(_ok(driver.cuCtxGetCurrent())), shape, levels)
        return mipmap

    def cuMipmappedArrayGetLevel(self, handle, level):
        return _int(_ok(driver.cuMipmappedArrayGetLevel(driver.CUmipmappedArray(handle), level)))

    def cuMipmappedArrayDestroy(self, handle):
        _ok(driver.cuMipmappedArrayDestroy(driver.CUmipmappedArray(handle)))
        self.mipmap_homes.pop(handle, None)

    def cuArrayGetPlane(self, array, index):
        return _int(_ok(driver.cuArrayGetPlane(driver.CUarray(array), index)))

    def cuArrayGetSparseProperties(self, array):
        props = _ok(driver.cuArrayGetSparseProperties(driver.CUarray(array)))
        return ctypes.string_at(props.getPtr(), SPARSE_PROPERTIES_BYTES)

    def cuMipmappedArrayGetSparseProperties(self, mipmap):
        props = _ok(driver.cuMipmappedArrayGetSparseProperties(driver.CUmipmappedArray(mipmap)))
        return ctypes.string_at(props.getPtr(), SPARSE_PROPERTIES_BYTES)

    def cuArrayGetMemoryRequirements(self, array, dev):
        reqs = _ok(driver.cuArrayGetMemoryRequirements(driver.CUarray(array), self._d(dev)))
        return ctypes.string_at(reqs.getPtr(), MEMORY_REQUIREMENTS_BYTES)

    def cuMipmappedArrayGetMemoryRequirements(self, mipmap, dev):
        reqs = _ok(
            driver.cuMipmappedArrayGetMemoryRequirements(driver.CUmipmappedArray(mipmap), self._d(dev))
        )
        return ctypes.string_at(reqs.getPtr(), MEMORY_REQUIREMENTS_BYTES)

    def cuMemMapArrayAsync(self, mappings, stream):
        """The client's CUarrayMapInfo structs as they are (their handles are this worker's), each device
        mask rewritten from the lease's ordinals to this host's."""
        infos = []
        for m in mappings:
            mask = sum(1 << self._d(dev) for dev in range(len(self.real)) if m.devices >> dev & 1)
            raw = bytearray(m.raw)
            raw[MAP_INFO_DEVICES : MAP_INFO_DEVICES + 4] = mask.to_bytes(4, "little")
            infos.append(self._struct(driver.CUarrayMapInfo, bytes(raw)))
        _ok(driver.cuMemMapArrayAsync(infos, len(infos), self._stream(stream)))

    # Legacy texture and surface references (what they bind checked by the guard).
    def cuModuleGetTexRef(self, module, name):
        return _int(_ok(driver.cuModuleGetTexRef(driver.CUmodule(module), name.encode())))

    def cuModuleGetSurfRef(self, module, name):
        return _int(_ok(driver.cuModuleGetSurfRef(driver.CUmodule(module), name.encode())))

    def cuTexRefCreate(self):
        return _int(_ok(driver.cuTexRefCreate()))

    def cuTexRefDestroy(self, tex):
        _ok(driver.cuTexRefDestroy(driver.CUtexref(tex)))

    def cuTexRefSetArray(self, tex, array, flags):
        _ok(driver.cuTexRefSetArray(driver.CUtexref(tex), driver.CUarray(array), flags))

    def cuTexRefSetMipmappedArray(self, tex, mipmap, flags):
        _ok(driver.cuTexRefSetMipmappedArray(driver.CUtexref(tex), driver.CUmipmappedArray(mipmap), flags))

    def cuTexRefSetAddress(self, tex, ptr, size):
        return int(_ok(driver.cuTexRefSetAddress(driver.CUtexref(tex), ptr, size)))

    def cuTexRefSetAddress2D(self, tex, ptr, pitch, shape: ArrayShape):
        desc = driver.CUDA_ARRAY_DESCRIPTOR()
        desc.Width, desc.Height = shape.width, shape.height
        desc.Format, desc.NumChannels = _enum(driver.CUarray_format, shape.format), shape.channels
        _ok(driver.cuTexRefSetAddress2D(driver.CUtexref(tex), desc, ptr, pitch))

    def cuTexRefSetFormat(self, tex, format_, components):
        _ok(driver.cuTexRefSetFormat(driver.CUtexref(tex), _enum(driver.CUarray_format, format_), components))

    def cuTexRefSetAddressMode(self, tex, dim, mode):
        _ok(driver.cuTexRefSetAddressMode(driver.CUtexref(tex), dim, _enum(driver.CUaddress_mode, mode)))

    def cuTexRefSetFilterMode(self, tex, mode):
        _ok(driver.cuTexRefSetFilterMode(driver.CUtexref(tex), _enum(driver.CUfilter_mode, mode)))

    def cuTexRefSetMipmapFilterMode(self, tex, mode):
        _ok(driver.cuTexRefSetMipmapFilterMode(driver.CUtexref(tex), _enum(driver.CUfilter_mode, mode)))

    def cuTexRefSetMipmapLevelBias(self, tex, bias):
        _ok(driver.cuTexRefSetMipmapLevelBias(driver.CUtexref(tex), bias))

    def cuTexRefSetMipmapLevelClamp(self, tex, min_clamp, max_clamp):
        _ok(driver.cuTexRefSetMipmapLevelClamp(driver.CUtexref(tex), min_clamp, max_clamp))

    def cuTexRefSetMaxAnisotropy(self, tex, max_aniso):
        _ok(driver.cuTexRefSetMaxAnisotropy(driver.CUtexref(tex), max_aniso))

    def cuTexRefSetFlags(self, tex, flags):
        _ok(driver.cuTexRefSetFlags(driver.CUtexref(tex), flags))

    def _border_color(self, name: str, tex: int, color) -> None:
        """cuTexRefSetBorderColor / GetBorderColor through the driver's own entry point: a float[4] each way
        (cuda.bindings passes one float)."""
        function = self._driver_function(name, 8000, (ctypes.c_void_p, ctypes.c_void_p))
        result = function(tex, color) if name.startswith("cuTexRefSet") else function(color, tex)
        if result:
            raise CudaError(result, name)

    def cuTexRefSetBorderColor(self, tex, red, green, blue, alpha):
        self._border_color("cuTexRefSetBorderColor", tex, (ctypes.c_float * 4)(red, green, blue, alpha))

    def cuTexRefGetBorderColor(self, tex):
        color = (ctypes.c_float * 4)()
        self._border_color("cuTexRefGetBorderColor", tex, color)
        return tuple(color)

    def cuTexRefGetAddress(self, tex):
        return _int(_ok(driver.cuTexRefGetAddress(driver.CUtexref(tex))))

    def cuTexRefGetArray(self, tex):
        return _int(_ok(driver.cuTexRefGetArray(driver.CUtexref(tex))))

    def cuTexRefGetMipmappedArray(self, tex):
        return _int(_ok(driver.cuTexRefGetMipmappedArray(driver.CUtexref(tex))))

    def cuTexRefGetAddressMode(self, tex, dim):
        return int(_ok(driver.cuTexRefGetAddressMode(driver.CUtexref(tex), dim)))

    def cuTexRefGetFilterMode(self, tex):
        return int(_ok(driver.cuTexRefGetFilterMode(driver.CUtexref(tex))))

    def cuTexRefGetFormat(self, tex):
        format_, channels = _ok(driver.cuTexRefGetFormat(driver.CUtexref(tex)))
        return int(format_), int(channels)

    def cuTexRefGetMipmapFilterMode(self, tex):
        return int(_ok(driver.cuTexRefGetMipmapFilterMode(driver.CUtexref(tex))))

    def cuTexRefGetMipmapLevelBias(self, tex):
        return float(_ok(driver.cuTexRefGetMipmapLevelBias(driver.CUtexref(tex))))

    def cuTexRefGetMipmapLevelClamp(self, tex):
        low, high = _ok(driver.cuTexRefGetMipmapLevelClamp(driver.CUtexref(tex)))
        return float(low), float(high)

    def cuTexRefGetMaxAnisotropy(self, tex):
        return int(_ok(driver.cuTexRefGetMaxAnisotropy(driver.CUtexref(tex))))

    def cuTexRefGetFlags(self, tex):
        return int(_ok(driver.cuTexRefGetFlags(driver.CUtexref(tex))))

    def cuSurfRefSetArray(self, surf, array, flags):
        _ok(driver.cuSurfRefSetArray(driver.CUsurfref(surf), driver.CUarray(array), flags))

    def cuSurfRefGetArray(self, surf):
        return _int(_ok(driver.cuSurfRefGetArray(driver.CUsurfref(surf))))

    def cuParamSetTexRef(self, func, texunit, tex):
        _ok(driver.cuParamSetTexRef(driver.CUfunction(func), texunit, driver.CUtexref(tex)))

    def launch_multi_device(self, launches, flags):
        """CUDA_LAUNCH_PARAMS for each launch (its parameters in a buffer of its own, as a kernel node's), in
        one array for the driver's own entry point (cuda.bindings takes one)."""
        kept = [self._kernel_node(launch) for launch in launches]
        packed = b"".join(
            LAUNCH_PARAMS.pack(_int(target.function), *launch.grid, *launch.block, launch.shared_mem,
                               _int(self._stream(launch.stream)), target.params)
            for launch, (_, target) in zip(launches, kept, strict=True)
        )  # fmt: skip
        array = ctypes.create_string_buffer(packed, len(packed))
        argtypes = (ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint)
        function = self._driver_function("cuLaunchCooperativeKernelMultiDevice", 9000, argtypes)
        result = function(array, len(launches), flags)
        if result:
            raise CudaError(result, "multi-device cooperative launch")

    def cuMemBatchDecompressAsync(self, operations, flags, stream):
        """The operations' CUmemDecompressParams, packed from their checked fields (their pointers are device
        addresses of the lease), in one array for the driver's own entry point (cuda.bindings takes one);
        the index of the operation the driver refused, or SIZE_MAX."""
        packed = b"".join(DECOMPRESS_PARAMS.pack(*operation) for operation in operations)
        array = ctypes.create_string_buffer(packed, len(packed))
        index = ctypes.c_size_t(0)
        argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p)
        function = self._driver_function("cuMemBatchDecompressAsync", 12060, argtypes)
        result = function(array, len(operations), flags, ctypes.byref(index), stream)
        if result:
            raise CudaError(result, f"decompression operation {index.value}")
        return index.value

    @staticmethod
    def _struct(kind, raw: bytes):
        """A cuda.bindings structure holding the client's C struct as it is (its handles are this worker's)."""
        value = kind()
        ctypes.memmove(value.getPtr(), bytes(raw), len(raw))
        return value

    def cuTexObjectCreate(self, res, tex, view):
        descs = self._struct(driver.CUDA_RESOURCE_DESC, res), self._struct(driver.CUDA_TEXTURE_DESC, tex)
        view_desc = self._struct(driver.CUDA_RESOURCE_VIEW_DESC, view) if view else None
        tex_object = _int(_ok(driver.cuTexObjectCreate(*descs, view_desc)))
        self.sampler_homes[tex_object] = (_int(_ok(driver.cuCtxGetCurrent())), bytes(res), bytes(tex), view)
        return tex_object

    def cuTexObjectGetResourceDesc(self, tex):
        desc = _ok(driver.cuTexObjectGetResourceDesc(driver.CUtexObject(tex)))
        return ctypes.string_at(desc.getPtr(), RESOURCE_DESC_BYTES)

    def cuTexObjectGetTextureDesc(self, tex):
        desc = _ok(driver.cuTexObjectGetTextureDesc(driver.CUtexObject(tex)))
        return ctypes.string_at(desc.getPtr(), TEXTURE_DESC_BYTES)

    def cuTexObjectGetResourceViewDesc(self, tex):
        desc = _ok(driver.cuTexObjectGetResourceViewDesc(driver.CUtexObject(tex)))
        return ctypes.string_at(desc.getPtr(), VIEW_DESC_BYTES)

    def cuSurfObjectGetResourceDesc(self, surf):
        desc = _ok(driver.cuSurfObjectGetResourceDesc(driver.CUsurfObject(surf)))
        return ctypes.string_at(desc.getPtr(), RESOURCE_DESC_BYTES)

    def cuTexObjectDestroy(self, tex):
        _ok(driver.cuTexObjectDestroy(driver.CUtexObject(tex)))
        self.sampler_homes.pop(tex, None)

    def cuSurfObjectCreate(self, res):
        surf = _int(_ok(driver.cuSurfObjectCreate(self._struct(driver.CUDA_RESOURCE_DESC, res))))
        self.sampler_homes[surf] = (_int(_ok(driver.cuCtxGetCurrent())), bytes(res), None, None)
        return surf

    def cuSurfObjectDestroy(self, surf):
        _ok(driver.cuSurfObjectDestroy(driver.CUsurfObject(surf)))
        self.sampler_homes.pop(surf, None)

    def cuMemGetAccess(self, ptr, device):
        location = driver.CUmemLocation()
        location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        location.id = self._d(device)
        return int(_ok(driver.cuMemGetAccess(location, ptr)))

    def cuMemRetainAllocationHandle(self, addr):
        handle = _int(_ok(driver.cuMemRetainAllocationHandle(addr)))
        self.vm_shared.add(handle)
        return handle

    def cuMemMap(self, ptr, size, offset, handle, flags):
        _ok(driver.cuMemMap(ptr, size, offset, driver.CUmemGenericAllocationHandle(handle), flags))
        self.vm_maps[ptr] = (size, offset, handle)

    def cuMemUnmap(self, ptr, size):
        _ok(driver.cuMemUnmap(ptr, size))
        for at in [at for at in self.vm_maps if ptr <= at < ptr + size]:
            del self.vm_maps[at]
        for key in [k for k in self.vm_access if k[0] < ptr + size and ptr < k[0] + k[1]]:
            del self.vm_access[key]
        still = {handle for _, _, handle in self.vm_maps.values()}
        for handle in [h for h in self.vm_released if h not in still]:  # its last mapping went: freed
            del self.vm_released[handle]

    def cuMemSetAccess(self, ptr, size, access):
        descs = self._descs(access)
        _ok(driver.cuMemSetAccess(ptr, size, descs, len(descs)))
        self.vm_access[ptr, size] = list(access)

    def cuMemGetAllocationGranularity(self, device, option):
        kind = _enum(driver.CUmemAllocationGranularity_flags, option)
        return int(_ok(driver.cuMemGetAllocationGranularity(self._prop(device), kind)))

    def host_allocation_granularity(self, option):
        """The driver's granularity of pinned memory on this host's NUMA node 0 (asked, never created)."""
        prop = driver.CUmemAllocationProp()
        prop.type = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST_NUMA
        prop.location.id = 0
        kind = _enum(driver.CUmemAllocationGranularity_flags, option)
        return int(_ok(driver.cuMemGetAllocationGranularity(prop, kind)))

    def unmap_memory(self, base: int, size: int, backing) -> None:
        _ok(driver.cuMemUnmap(base, size))
        _ok(driver.cuMemRelease(backing))

    def export_memory(self, backing) -> int:
        posix = driver.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        return _int(_ok(driver.cuMemExportToShareableHandle(backing, posix, 0)))

    def import_memory(self, fd: int, base: int, size: int, device: int):
        """The sequence bench/bench_exportable_memory.py measured: import, map into the range reserved for
        it, grant access."""
        posix = driver.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        handle = _named("cuMemImportFromShareableHandle", driver.cuMemImportFromShareableHandle(fd, posix))
        try:
            _named("cuMemMap", driver.cuMemMap(base, size, 0, handle, 0))
            try:
                access = self._access(device)
                _named("cuMemSetAccess", driver.cuMemSetAccess(base, size, access, len(access)))
            except BaseException:
                driver.cuMemUnmap(base, size)
                raise
        except BaseException:
            driver.cuMemRelease(handle)
            raise
        return handle

    def unmap_imported(self, base: int, size: int, backing) -> None:
        self.unmap_memory(base, size, backing)

    def export_vm(self, handle: int) -> int:
        posix = driver.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        found = driver.cuMemExportToShareableHandle(driver.CUmemGenericAllocationHandle(handle), posix, 0)
        return _int(_named("cuMemExportToShareableHandle", found))

    def import_vm(self, fd: int, device: int) -> int:
        posix = driver.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        imported = _int(
            _named("cuMemImportFromShareableHandle", driver.cuMemImportFromShareableHandle(fd, posix))
        )
        self.vm_shared.add(imported)  # another process's memory: not this worker's to remake (_migrate)
        return imported

    def ipc_event_handle(self, event: int) -> bytes:
        """Through the driver's own entry point: the handle is a 64-byte struct."""
        handle = _IpcHandle()
        get = self._driver_function("cuIpcGetEventHandle", 4010, (ctypes.c_void_p, ctypes.c_void_p))
        result = get(ctypes.byref(handle), event)
        if result:
            raise CudaError(result, "cuIpcGetEventHandle")
        return bytes(handle.reserved)

    def ipc_open_event(self, handle: bytes) -> int:
        opened = ctypes.c_void_p()
        open_event = self._driver_function("cuIpcOpenEventHandle", 4010, (ctypes.c_void_p, _IpcHandle))
        result = open_event(ctypes.byref(opened), _IpcHandle.from_buffer_copy(handle))
        if result:
            raise CudaError(result, "cuIpcOpenEventHandle")
        return opened.value or 0

    # -- live migration (virtualize.server._migrate; the handles: virtualize.server._handles) -----------

    def migration_refusal(self, target: int, holding: dict[str, int], uuid: str = "") -> str | None:
        held = [what for kind, what in CANNOT_MOVE.items() if holding.get(kind)]
        if not held:
            shapes = [shape for _, shape in self.array_homes.values()]
            shapes += [shape for _, shape, _ in self.mipmap_homes.values()]
            held = sorted({unmovable(shape) for shape in shapes} - {""})
        if not held and self._vm_unmovable():
            held = [self._vm_unmovable()]
        if held:
            return f"the lease holds {', '.join(held)}, which the cuda executor does not move to another GPU"
        try:
            ordinal = self._find(SimpleNamespace(uuid=uuid), target)
        except CudaError as exc:
            return f"this worker does not see GPU {target} ({exc})"
        if ordinal in self.real:
            return f"GPU {target} already holds a partition of this lease"
        for real in self.real:
            if not _ok(driver.cuDeviceCanAccessPeer(real, ordinal)):
                return f"GPU {target} has no peer access to the lease's GPUs (a copy through the host is not done)"
        return None

    def migrate(
        self, device: int, target: int, mappings: list, recreate: Callable[[], list], uuid: str = ""
    ) -> dict:
        """The device's pages are copied GPU to GPU into new memory of the target, mapped meanwhile at a
        scratch range; the lease's objects are made there (`recreate`); then each page range is unmapped
        and the new memory mapped at the same address. Until that commit the source is untouched."""
        ordinal = self._find(SimpleNamespace(uuid=uuid), target)
        source = self.real[device]
        mine = [m for m in mappings if m.device == device]
        total = sum(m.size for m in mine)
        ctx = _ok(driver.cuDevicePrimaryCtxRetain(source))  # the copies run in the source's primary context
        staged: list = []  # the target's new memory, one handle per mapping
        scratch, stream = 0, None
        try:
            _ok(driver.cuCtxSetCurrent(ctx))
            stream = _ok(driver.cuStreamCreate(1))  # CU_STREAM_NON_BLOCKING
            if total:
                scratch = _int(_ok(driver.cuMemAddressReserve(total, 0, 0, 0)))
            prop, both = self._prop_at(ordinal), self._descs_at([source, ordinal])
            offset = 0
            for m in mine:
                handle = _ok(driver.cuMemCreate(m.size, prop, 0))
                try:
                    _ok(driver.cuMemMap(scratch + offset, m.size, 0, handle, 0))
                except CudaError:
                    driver.cuMemRelease(handle)
                    raise
                staged.append(handle)
                _ok(driver.cuMemSetAccess(scratch + offset, m.size, both, len(both)))
                _ok(driver.cuMemcpyDtoDAsync(scratch + offset, m.base, m.size, stream))
                offset += m.size
            _ok(driver.cuStreamSynchronize(stream))
            for m in mine:  # the target reaches the lease's memory at its addresses while its objects
                _ok(driver.cuMemSetAccess(m.base, m.size, both, len(both)))  # are made (graphs' nodes)
            self.real[device] = ordinal  # the device's objects are made on the target from here
            try:
                made = recreate()
                contexts = {old: new for ns, old, new in made if ns == "ctx"}
                arrays_made, arrays_moved = self._arrays_made(contexts)
                vm_made, vm_moved = self._vm_made(source, ordinal, ctx, stream)
            except BaseException:
                self.real[device] = source
                raise
        except BaseException:
            self._drop_scratch(scratch, total, mine, staged)
            raise
        finally:
            if stream is not None:
                driver.cuCtxSetCurrent(ctx)
                driver.cuStreamDestroy(stream)
            driver.cuDevicePrimaryCtxRelease(source)
        access = self._access(device)  # commit: the same addresses, the target's memory
        for m, handle in zip(mine, staged, strict=True):
            _ok(driver.cuMemUnmap(m.base, m.size))
            _ok(driver.cuMemMap(m.base, m.size, 0, handle, 0))
            _ok(driver.cuMemSetAccess(m.base, m.size, access, len(access)))
            _ok(driver.cuMemRelease(m.backing))  # the source's memory, no longer mapped anywhere
            m.backing = handle
        self._drop_scratch(scratch, total, mine, [])
        for m in mappings:  # the lease's other GPUs' memory, reachable from the target where it can be
            if m.device != device and _ok(driver.cuDeviceCanAccessPeer(ordinal, self.real[m.device])):
                reach = self._descs([(device, 3)])
                _ok(driver.cuMemSetAccess(m.base, m.size, reach, len(reach)))
        self.launchables.clear()  # functions of the source's contexts
        arrays_moved()
        vm_moved()
        found = bytes(_ok(driver.cuDeviceGetUuid(ordinal)).bytes).hex()
        return {
            "bytes": total,
            "uuid": uuid or f"GPU-{found[:8]}-{found[8:12]}-{found[12:16]}-{found[16:20]}-{found[20:]}",
            "made": arrays_made + vm_made,
            # Last, once the caller is through with the source's objects (its graphs destroyed).
            "release_source": lambda: self._release_source(source, _int(ctx), made),
        }

    def _arrays_made(self, contexts: dict[int, int]):
        """The CUDA arrays and mipmapped arrays of the moving contexts (`contexts`: each source context ->
        the target's) made anew in the target's with the same shapes, their bytes copied GPU to GPU
        (cuMemcpy3DPeer), and the texture and surface objects made anew over them with the same values (a
        kernel holds those in its parameters: a value the target's driver does not give back fails the
        move). ([(namespace, old, new)] of the arrays, mipmapped arrays and their levels; what to keep of
        them once the move commits)."""
        renamed: dict[int, int] = {}  # array or level -> its target's
        remipped: dict[int, int] = {}
        homes = {a: home for a, home in self.array_homes.items() if home[0] in contexts}
        mipmaps = {m: home for m, home in self.mipmap_homes.items() if home[0] in contexts}
        samplers = {v: home for v, home in self.sampler_homes.items() if home[0] in contexts}
        for old, (ctx, shape) in homes.items():
            _ok(driver.cuCtxSetCurrent(driver.CUcontext(contexts[ctx])))
            renamed[old] = _int(_ok(driver.cuArray3DCreate(self._array_descriptor(shape))))
            self._array_copied(old, ctx, renamed[old], contexts[ctx], shape)
        for old, (ctx, shape, levels) in mipmaps.items():
            _ok(driver.cuCtxSetCurrent(driver.CUcontext(contexts[ctx])))
            remipped[old] = _int(_ok(driver.cuMipmappedArrayCreate(self._array_descriptor(shape), levels)))
            for n in range(levels):
                level = _int(_ok(driver.cuMipmappedArrayGetLevel(driver.CUmipmappedArray(old), n)))
                renamed[level] = _int(
                    _ok(driver.cuMipmappedArrayGetLevel(driver.CUmipmappedArray(remipped[old]), n))
                )
                self._array_copied(level, ctx, renamed[level], contexts[ctx], shape.level(n))
        spare: list[tuple[bool, int]] = []  # values the target gave before the wanted one: let go after
        for value, (ctx, res, tex, view) in sorted(samplers.items()):
            _ok(driver.cuCtxSetCurrent(driver.CUcontext(contexts[ctx])))
            res = resource_mapped(res, lambda ns, h: (renamed if ns == "array" else remipped).get(h, h))
            made = self._sampler_made(res, tex, view)
            while made < value and len(spare) < SPARE_SAMPLERS:  # values destroyed since, in between
                spare.append((tex is not None, made))
                made = self._sampler_made(res, tex, view)
            if made != value:
                raise CudaError(
                    NOT_SUPPORTED,
                    f"a texture or surface object would have another value there ({made}, not {value})",
                )
        for is_texture, made in spare:
            if is_texture:
                driver.cuTexObjectDestroy(driver.CUtexObject(made))
            else:
                driver.cuSurfObjectDestroy(driver.CUsurfObject(made))

        def moved() -> None:
            for old, (ctx, shape) in homes.items():
                self.array_homes.pop(old, None)
                self.array_homes[renamed[old]] = (contexts[ctx], shape)
            for old, (ctx, shape, levels) in mipmaps.items():
                self.mipmap_homes.pop(old, None)
                self.mipmap_homes[remipped[old]] = (contexts[ctx], shape, levels)
            for value, (ctx, res, tex, view) in samplers.items():
                res = resource_mapped(res, lambda ns, h: (renamed if ns == "array" else remipped).get(h, h))
                self.sampler_homes[value] = (contexts[ctx], res, tex, view)

        made = [("array", old, new) for old, new in renamed.items()]
        return made + [("mipmap", old, new) for old, new in remipped.items()], moved

    def carry_refusal(self) -> str:
        shapes = [shape for _, shape in self.array_homes.values()]
        shapes += [shape for _, shape, _ in self.mipmap_homes.values()]
        return next((why for why in map(unmovable, shapes) if why), "") or self._vm_unmovable()

    def held_objects(self) -> HeldObjects:
        device_of = {ordinal: dev for dev, ordinal in enumerate(self.real)}

        def levels(mipmap: int, ctx: int, count: int) -> list[int]:
            self.set_context(ctx)
            return [self.cuMipmappedArrayGetLevel(mipmap, n) for n in range(count)]

        return HeldObjects(
            [(a, ctx, shape) for a, (ctx, shape) in self.array_homes.items()],
            [(m, ctx, shape, n, levels(m, ctx, n)) for m, (ctx, shape, n) in self.mipmap_homes.items()],
            [(value, *home) for value, home in self.sampler_homes.items()],
            [(h, size, device_of[ordinal], types, usage, h in self.vm_homes)
             for h, (size, ordinal, types, usage) in {**self.vm_released, **self.vm_homes}.items()],
            [(at, size, offset, h) for at, (size, offset, h) in self.vm_maps.items()],
            [(at, size, list(access)) for (at, size), access in self.vm_access.items()],
        )  # fmt: skip

    def _vm_unmovable(self) -> str:
        """Why the program's own virtual memory cannot move ("" where it can): memory another reference
        holds (imported from a descriptor, retained, bound to a multicast object), a mapping of a handle
        this worker did not make with cuMemCreate, tiles of sparse arrays."""
        mapped = {handle for _, _, handle in self.vm_maps.values()}
        if self.vm_shared & (mapped | set(self.vm_homes)):
            return "memory of the virtual memory API shared by another reference (imported, retained or multicast-bound)"
        known = set(self.vm_homes) | set(self.vm_released)
        if mapped - known:
            return "a mapping of memory the virtual memory API did not make here (cuMemCreate)"
        if any(usage for _, _, _, usage in [*self.vm_homes.values(), *self.vm_released.values()]):
            return "tiles of sparse CUDA arrays (memory of usage TILE_POOL)"
        return ""

    def _vm_made(self, source: int, ordinal: int, ctx, stream):
        """The program's own virtual memory on the source GPU (made with cuMemCreate, held or mapped) made
        anew on the target and its bytes copied GPU to GPU on `stream` (of `ctx`, the source's primary
        context) through a scratch mapping: all of an allocation the program still holds, the mapped parts of
        one it let go of (nothing else can reach the rest); ([("vmem", old, new)] of the handles the program
        holds; what to do once the move commits: each mapping remapped to the new memory at its address,
        its access granted again, the old memory let go)."""
        homes = {**self.vm_released, **self.vm_homes}
        moving = {h: home for h, home in homes.items() if home[1] == source}
        mapped = {at: m for at, m in self.vm_maps.items() if m[2] in moving}
        if not moving:
            return [], lambda: None
        new: dict[int, int] = {}
        for handle, (size, _, handle_types, usage) in moving.items():
            prop = self._prop_at(ordinal, handle_types)
            prop.allocFlags.usage = usage
            new[handle] = _int(_ok(driver.cuMemCreate(size, prop, 0)))
        both = self._descs_at([source, ordinal])
        _ok(driver.cuCtxSetCurrent(ctx))  # the stream's
        for handle, (size, *_) in moving.items():
            held = handle in self.vm_homes  # else only its mappings reach it
            scratch = _int(_ok(driver.cuMemAddressReserve(2 * size if held else size, 0, 0, 0)))
            mapped_here: list[int] = []
            try:
                for at, memory in ((scratch, new[handle]), (scratch + size, handle))[: 2 if held else 1]:
                    _ok(driver.cuMemMap(at, size, 0, driver.CUmemGenericAllocationHandle(memory), 0))
                    mapped_here.append(at)
                    _ok(driver.cuMemSetAccess(at, size, both, len(both)))
                if held:
                    _ok(driver.cuMemcpyDtoDAsync(scratch, scratch + size, size, stream))
                for at, (n, offset, _) in (
                    [] if held else [(at, m) for at, m in mapped.items() if m[2] == handle]
                ):
                    _ok(driver.cuMemcpyDtoDAsync(scratch + offset, at, n, stream))
                _ok(driver.cuStreamSynchronize(stream))
            finally:
                for at in mapped_here:
                    driver.cuMemUnmap(at, size)
                driver.cuMemAddressFree(scratch, 2 * size if held else size)

        def moved() -> None:
            for at, (n, offset, handle) in mapped.items():
                _ok(driver.cuMemUnmap(at, n))
                _ok(driver.cuMemMap(at, n, offset, driver.CUmemGenericAllocationHandle(new[handle]), 0))
                self.vm_maps[at] = (n, offset, new[handle])
            for (at, n), access in self.vm_access.items():  # granted again, now naming the target
                if any(at < m + mapped[m][0] and m < at + n for m in mapped):
                    descs = self._descs(access)
                    _ok(driver.cuMemSetAccess(at, n, descs, len(descs)))
            for handle in moving:
                home = homes[handle]
                if handle in self.vm_homes:  # the program's reference is to the new memory from here
                    driver.cuMemRelease(driver.CUmemGenericAllocationHandle(handle))  # unmapped now: freed
                    del self.vm_homes[handle]
                    self.vm_homes[new[handle]] = (home[0], ordinal, *home[2:])
                else:  # let go of by the program already: the mappings keep it
                    del self.vm_released[handle]
                    self.vm_released[new[handle]] = (home[0], ordinal, *home[2:])
                    driver.cuMemRelease(driver.CUmemGenericAllocationHandle(new[handle]))

        return [("vmem", old, made) for old, made in new.items() if old in self.vm_homes], moved

    def _sampler_made(self, res: bytes, tex: bytes | None, view: bytes | None) -> int:
        """A texture object (`tex` given) or a surface object over `res`, in the current context."""
        resource = self._struct(driver.CUDA_RESOURCE_DESC, res)
        if tex is None:
            return _int(_ok(driver.cuSurfObjectCreate(resource)))
        view_desc = self._struct(driver.CUDA_RESOURCE_VIEW_DESC, view) if view else None
        return _int(
            _ok(driver.cuTexObjectCreate(resource, self._struct(driver.CUDA_TEXTURE_DESC, tex), view_desc))
        )

    @staticmethod
    def _array_copied(src: int, src_ctx: int, dst: int, dst_ctx: int, shape: ArrayShape) -> None:
        """All of array `src`'s bytes into array `dst` of the same shape, GPU to GPU."""
        copy = driver.CUDA_MEMCPY3D_PEER()
        copy.srcMemoryType = copy.dstMemoryType = driver.CUmemorytype.CU_MEMORYTYPE_ARRAY
        copy.srcArray, copy.dstArray = driver.CUarray(src), driver.CUarray(dst)
        copy.srcContext, copy.dstContext = driver.CUcontext(src_ctx), driver.CUcontext(dst_ctx)
        copy.WidthInBytes, copy.Height, copy.Depth = shape.row_bytes, shape.rows, shape.slices
        _ok(driver.cuMemcpy3DPeer(copy))

    def _release_source(self, source: int, primary: int, made: list[tuple[str, int, int]]) -> None:
        """After a move has committed, what the lease held on the source GPU goes, as if it had never been
        there: the contexts its processes created, its memory pools, and every reference to the source's
        primary context (the last one lets the driver reset it: its streams, events and modules go, and
        its memory comes back). The lease runs on the target already: a failure here is logged."""
        self.pinned.destroy_events()  # some may be the source contexts' (freed with them)
        self.pinned.drop_kept()  # page-locked while a source context was current
        for ns, old, new in made:
            if old == new or ns not in ("ctx", "pool") or (ns == "ctx" and old == primary):
                continue
            try:
                if ns == "ctx":
                    _ok(driver.cuCtxDestroy(driver.CUcontext(old)))
                    self._forget_context(old)
                else:  # a device's default pool is the driver's to keep: refused, and left
                    _ok(driver.cuMemPoolDestroy(driver.CUmemoryPool(old)))
            except CudaError as exc:
                log.log(logging.DEBUG if ns == "pool" else logging.WARNING,
                        "the source GPU's %s 0x%x was not let go after the move: %s", ns, old, exc)  # fmt: skip
        for _ in range(self.primary_retains.pop(source, 0)):
            driver.cuDevicePrimaryCtxRelease(source)
        self._forget_context(primary)
        active = _ok(driver.cuDevicePrimaryCtxGetState(source))[1]
        if active:  # another library of the worker holds it (a CUDA runtime): it stays until the lease ends
            log.warning(
                "the source GPU %d's primary context is still held in the worker after the move", source
            )

    @staticmethod
    def _drop_scratch(scratch: int, total: int, mine: list, staged: list) -> None:
        """The scratch range of a move, and (a move that failed) the target's memory staged there."""
        if not scratch:
            return
        offset = 0
        for m, handle in zip(mine, staged, strict=False):
            driver.cuMemUnmap(scratch + offset, m.size)
            driver.cuMemRelease(handle)
            offset += m.size
        if not staged:
            driver.cuMemUnmap(scratch, total)
        driver.cuMemAddressFree(scratch, total)

    def cluster_occupancy(self, name: str, launch: Launch) -> int:
        config = self._config(launch.grid, launch.block, launch.shared_mem, launch.stream, launch.attributes)
        return int(_ok(getattr(driver, name)(driver.CUfunction(launch.func), config)))

    @staticmethod
    def _attribute(attr_id: int, value: bytes):
        """A launch attribute as the client built it: its 64-byte value goes over unchanged (addresses
        and event handles in it are this worker's own; a bogus one can only hurt this lease's worker)."""
        ids = driver.CUlaunchAttributeID
        if attr_id not in FORWARDED_LAUNCH_ATTRIBUTES:
            raise CudaError(NOT_SUPPORTED, f"launch attribute {attr_id} is not forwarded")
        attribute = driver.CUlaunchAttribute()
        attribute.id = _enum(ids, attr_id)
        ctypes.memmove(attribute.value.getPtr(), bytes(value[:64]).ljust(64, b"\0"), 64)
        return attribute

    # -- devices -------------------------------------------------------------------------------------

    def cuInit(self, flags):
        _ok(driver.cuInit(flags))

    def cuDriverGetVersion(self):
        return _ok(driver.cuDriverGetVersion())

    def cuDeviceGet(self, ordinal):
        self._d(ordinal)
        return ordinal

    def cuDeviceGetCount(self):
        return len(self.real)

    def cuDeviceGetName(self, length, dev):
        return bytes(_ok(driver.cuDeviceGetName(max(length, 1), self._d(dev)))).split(b"\0", 1)[0]

    def cuDeviceGetUuid(self, dev):
        return bytes(_ok(driver.cuDeviceGetUuid(self._d(dev))).bytes)

    # Logical endpoints (CUDA 13.3): the driver's, by cuda.bindings.
    def cuLogicalEndpointIdReserve(self, count):
        return int(_ok(driver.cuLogicalEndpointIdReserve(count)))

    def cuLogicalEndpointIdRelease(self, base, count):
        _ok(driver.cuLogicalEndpointIdRelease(base, count))

    @staticmethod
    def _endpoint_prop(kind, devices, size, flags):
        prop = driver.CUlogicalEndpointProp()
        prop.type = driver.CUlogicalEndpointType(kind)
        if kind == 1:  # CU_LOGICAL_ENDPOINT_TYPE_UNICAST: the owner device
            prop.unicast.device = devices
        else:
            prop.multicast.numDevices = devices
        prop.size, prop.flags = size, flags
        return prop

    def cuLogicalEndpointCreate(self, le, kind, devices, size, flags):
        if kind == 1:
            devices = self._d(devices)
        _ok(driver.cuLogicalEndpointCreate(le, self._endpoint_prop(kind, devices, size, flags)))

    def cuLogicalEndpointAddDevice(self, le, dev):
        _ok(driver.cuLogicalEndpointAddDevice(le, self._d(dev)))

    def cuLogicalEndpointDestroy(self, le):
        _ok(driver.cuLogicalEndpointDestroy(le))

    def cuLogicalEndpointBindAddr(self, le, dev, offset, ptr, size, flags):
        _ok(driver.cuLogicalEndpointBindAddr(le, self._d(dev), offset, ptr, size, flags))

    def cuLogicalEndpointBindMem(self, le, dev, offset, memory, mem_offset, size, flags):
        handle = driver.CUmemGenericAllocationHandle(memory)
        _ok(driver.cuLogicalEndpointBindMem(le, self._d(dev), offset, handle, mem_offset, size, flags))

    def cuLogicalEndpointUnbind(self, le, dev, offset, size):
        _ok(driver.cuLogicalEndpointUnbind(le, self._d(dev), offset, size))

    def cuLogicalEndpointGetLimits(self, kind, devices, size, flags):
        if kind == 1:
            devices = self._d(devices)
        alignment, max_size = _ok(
            driver.cuLogicalEndpointGetLimits(self._endpoint_prop(kind, devices, size, flags))
        )
        return int(alignment), int(max_size)

    def cuLogicalEndpointQuery(self, le, count):
        return int(_ok(driver.cuLogicalEndpointQuery(le, count)))

    def cuFabricCpyBatchAsync(self, operations, flags, stream):
        """The operations packed from their checked fields, in one array for the driver's own entry point."""
        packed = b"".join(FABRIC_COPY.pack(*operation) for operation in operations)
        array = ctypes.create_string_buffer(packed, len(packed))
        argtypes = (ctypes.c_size_t, ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_void_p)
        result = self._driver_function("cuFabricCpyBatchAsync", 13050, argtypes)(
            len(operations), array, flags, _int(self._stream(stream))
        )
        if result:
            raise CudaError(result, "fabric copies")

    def cuDeviceGetFabricClusterUuid(self, dev):
        return bytes(_ok(driver.cuDeviceGetFabricClusterUuid(self._d(dev))).bytes)

    def cuDeviceGetCliqueCount(self, dev):
        return int(_ok(driver.cuDeviceGetCliqueCount(self._d(dev))))

    def cuDeviceGetCliqueInfo(self, dev, capacity):
        if not capacity:
            return []
        cliques, count = _ok(driver.cuDeviceGetCliqueInfo(capacity, self._d(dev)))
        return [(int(c.type), int(c.id)) for c in list(cliques)[: int(count)]]

    def cuDeviceGetPCIBusId(self, length, dev):
        return bytes(_ok(driver.cuDeviceGetPCIBusId(max(length, 1), self._d(dev)))).split(b"\0", 1)[0]

    def cuDeviceTotalMem(self, dev):
        return _ok(driver.cuDeviceTotalMem(self._d(dev)))

    def cuDeviceGetAttribute(self, attrib, dev):
        return _ok(driver.cuDeviceGetAttribute(_enum(driver.CUdevice_attribute, attrib), self._d(dev)))

    def cuDeviceComputeCapability(self, dev):
        a = driver.CUdevice_attribute
        dev = self._d(dev)
        major = _ok(driver.cuDeviceGetAttribute(a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
        minor = _ok(driver.cuDeviceGetAttribute(a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
        return major, minor

    def cuDeviceGetP2PAttribute(self, attrib, src, dst):
        kind = _enum(driver.CUdevice_P2PAttribute, attrib)
        return int(_ok(driver.cuDeviceGetP2PAttribute(kind, self._d(src), self._d(dst))))

    def cuDeviceGetP2PAtomicCapabilities(self, operations, src, dst):
        kinds = [_enum(driver.CUatomicOperation, op) for op in operations]
        found = _ok(driver.cuDeviceGetP2PAtomicCapabilities(kinds, len(kinds), self._d(src), self._d(dst)))
        return [int(c) for c in found]

    def cuDeviceGetTexture1DLinearMaxWidth(self, format_, channels, dev):
        kind = _enum(driver.CUarray_format, format_)
        return int(_ok(driver.cuDeviceGetTexture1DLinearMaxWidth(kind, channels, self._d(dev))))

    def cuDeviceCanAccessPeer(self, dev, peer):
        return _ok(driver.cuDeviceCanAccessPeer(self._d(dev), self._d(peer)))

    def cuDeviceGetMemPool(self, dev):
        return _int(_ok(driver.cuDeviceGetMemPool(self._d(dev))))

    def cuDeviceGetDefaultMemPool(self, dev):
        return _int(_ok(driver.cuDeviceGetDefaultMemPool(self._d(dev))))

    def cuLogsCurrent(self, flags):
        return _int(_ok(driver.cuLogsCurrent(flags)))

    def cuLogsDumpToMemory(self, iterator, size, flags):
        """(the iterator after the dump, the log's bytes without the NUL)."""
        buffer = bytearray(size)
        start = None if iterator is None else driver.CUlogIterator(iterator)
        following, written = _ok(driver.cuLogsDumpToMemory(start, buffer, size, flags))
        return (0 if iterator is None else _int(following)), bytes(buffer[:written])

    def cuDeviceSetMemPool(self, dev, pool):
        _ok(driver.cuDeviceSetMemPool(self._d(dev), driver.CUmemoryPool(pool)))

    def cuFlushGPUDirectRDMAWrites(self, target, scope):
        _ok(
            driver.cuFlushGPUDirectRDMAWrites(
                _enum(driver.CUflushGPUDirectRDMAWritesTarget, target),
                _enum(driver.CUflushGPUDirectRDMAWritesScope, scope),
            )
        )

    def cuMemPoolCreate(self, device, handle_types, max_size):
        props = driver.CUmemPoolProps()
        props.allocType = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        props.handleTypes = _enum(driver.CUmemAllocationHandleType, handle_types)
        props.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        props.location.id = self._d(device)
        props.maxSize = max_size
        return _int(_ok(driver.cuMemPoolCreate(props)))

    def cuMemPoolDestroy(self, pool):
        _ok(driver.cuMemPoolDestroy(driver.CUmemoryPool(pool)))

    # -- contexts ------------------------------------------------------------------------------------

    def cuDevicePrimaryCtxRetain(self, dev):
        ctx = _int(_ok(driver.cuDevicePrimaryCtxRetain(self._d(dev))))
        self.primary_retains[self._d(dev)] = self.primary_retains.get(self._d(dev), 0) + 1
        return ctx

    def cuCtxCreate(self, flags, dev):
        try:  # cuda-bindings 13: cuCtxCreate(params, flags, dev); 12: cuCtxCreate(flags, dev)
            ctx = _ok(driver.cuCtxCreate(None, flags, self._d(dev)))
        except TypeError:
            ctx = _ok(driver.cuCtxCreate(flags, self._d(dev)))
        _ok(driver.cuCtxPopCurrent())  # it was pushed on this thread; the client's stack says what is current
        return _int(ctx)

    def cuCtxDestroy(self, ctx):
        self.pinned.destroy_events()
        _ok(driver.cuCtxDestroy(driver.CUcontext(ctx)))
        self._forget_context(ctx)

    def _forget_context(self, ctx: int) -> None:
        """`ctx` is destroyed, and with it the page-locked staging memory and events the worker made in
        it on any thread: drop them unfreed (freeing them again crashed the worker: a double free)."""
        with self._context_maps_lock:
            for staging, events in self._context_maps:
                staging.pop(ctx, None)
                events.pop(ctx, None)
        if getattr(self._local(), "ctx", 0) == ctx:
            self._local().ctx = 0

    def cuDevicePrimaryCtxRelease(self, dev):
        real = self._d(dev)
        last = self.primary_retains.get(real, 0) <= 1  # this worker's last reference: the context may end
        ctx = 0
        if last:
            ctx = _int(_ok(driver.cuDevicePrimaryCtxRetain(real)))  # its handle: retained, let go at once
            driver.cuDevicePrimaryCtxRelease(real)
            self.pinned.destroy_events()
        _ok(driver.cuDevicePrimaryCtxRelease(real))
        self.primary_retains[real] = max(0, self.primary_retains.get(real, 0) - 1)
        if last and not _ok(driver.cuDevicePrimaryCtxGetState(real))[1]:
            # It ended, and with it the staging memory and events made in it. The next retain may give a new
            # context the same handle: what is cached under it must not be used there (CONTEXT_IS_DESTROYED,
            # as a receiving worker met after it let go of the context its memory was copied in).
            self._forget_context(ctx)

    def cuDevicePrimaryCtxGetState(self, dev):
        flags, active = _ok(driver.cuDevicePrimaryCtxGetState(self._d(dev)))
        return int(flags), int(active)

    def cuDevicePrimaryCtxSetFlags(self, dev, flags):
        _ok(driver.cuDevicePrimaryCtxSetFlags(self._d(dev), flags))

    def cuDevicePrimaryCtxReset(self, dev):
        ctx = _int(_ok(driver.cuDevicePrimaryCtxRetain(self._d(dev))))  # its handle: retained, let go at once
        driver.cuDevicePrimaryCtxRelease(self._d(dev))
        self.pinned.destroy_events()
        _ok(driver.cuDevicePrimaryCtxReset(self._d(dev)))
        self._forget_context(ctx)

    def cuCtxSynchronize(self):
        _ok(driver.cuCtxSynchronize())

    def cuCtxGetApiVersion(self, ctx):
        return _ok(driver.cuCtxGetApiVersion(driver.CUcontext(ctx)))

    def cuModuleGetLoadingMode(self):
        return int(_ok(driver.cuModuleGetLoadingMode()))

    def cuCtxGetFlags(self):
        return int(_ok(driver.cuCtxGetFlags()))

    def cuCtxGetLimit(self, limit):
        return _ok(driver.cuCtxGetLimit(_enum(driver.CUlimit, limit)))

    def cuCtxSetLimit(self, limit, value):
        _ok(driver.cuCtxSetLimit(_enum(driver.CUlimit, limit), value))

    def cuCtxEnablePeerAccess(self, peer, flags):
        _ok(driver.cuCtxEnablePeerAccess(driver.CUcontext(peer), flags))

    def cuCtxDisablePeerAccess(self, peer):
        _ok(driver.cuCtxDisablePeerAccess(driver.CUcontext(peer)))

    def cuCtxSetFlags(self, flags):
        _ok(driver.cuCtxSetFlags(flags))

    def cuCtxResetPersistingL2Cache(self):
        _ok(driver.cuCtxResetPersistingL2Cache())

    def cuCtxRecordEvent(self, ctx, event):
        _ok(driver.cuCtxRecordEvent(driver.CUcontext(ctx), driver.CUevent(event)))

    def cuCtxWaitEvent(self, ctx, event):
        _ok(driver.cuCtxWaitEvent(driver.CUcontext(ctx), driver.CUevent(event)))

    # -- green contexts: device resources are structs here, ids for the guard and the client -----------

    def _resource(self, resource) -> tuple[int, int, int, int]:
        rid = next(self._resource_ids)
        self.resources[rid] = resource
        sm = resource.sm
        return rid, int(sm.smCount), int(sm.minSmPartitionSize), int(sm.smCoscheduledAlignment)

    def _known_resource(self, rid: int):
        resource = self.resources.get(rid)
        if resource is None:
            raise CudaError(CUresult.INVALID_VALUE, "device resource")
        return resource

    def cuDeviceGetDevResource(self, dev, kind):
        return self._resource(
            _ok(driver.cuDeviceGetDevResource(self._d(dev), driver.CUdevResourceType(kind)))
        )

    def cuCtxGetDevResource(self, ctx, kind):
        ctx = ctx or self._local().ctx
        return self._resource(
            _ok(driver.cuCtxGetDevResource(driver.CUcontext(ctx), driver.CUdevResourceType(kind)))
        )

    def cuGreenCtxGetDevResource(self, green, kind):
        resource = _ok(
            driver.cuGreenCtxGetDevResource(driver.CUgreenCtx(green), driver.CUdevResourceType(kind))
        )
        return self._resource(resource)

    def cuStreamGetDevResource(self, stream, kind):
        resource = _ok(driver.cuStreamGetDevResource(self._stream(stream), driver.CUdevResourceType(kind)))
        return self._resource(resource)

    def sm_split(self, resource, nb_groups, flags, min_count, count_only):
        source = self._known_resource(resource)
        if count_only:  # no result array: the driver says how many groups it would make
            _, count, _ = _ok(driver.cuDevSmResourceSplitByCount(0, source, flags, min_count))
            return [], int(count)
        groups, count, remaining = _ok(
            driver.cuDevSmResourceSplitByCount(nb_groups, source, flags, min_count)
        )
        made = [self._resource(g) for g in list(groups)[: int(count)]]
        left = self._resource(remaining) if int(remaining.sm.smCount) else (0, 0, 0, 0)
        return made, left

    def sm_split_structured(self, resource, nb_groups, flags, params, want_groups):
        # Through the driver's entry point itself: cuda.bindings always passes a result array, and a
        # discovery (`result` NULL) must not.
        source = self._known_resource(resource)
        split = self._driver_function(
            "cuDevSmResourceSplit", 13010,
            (ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p),
        )  # fmt: skip
        size = DEV_RESOURCE_BYTES
        result = ctypes.create_string_buffer(size * nb_groups) if want_groups else None
        remainder, group_params = (
            ctypes.create_string_buffer(size),
            ctypes.create_string_buffer(params, len(params)),
        )
        err = split(result, nb_groups, source.getPtr(), remainder, flags, group_params)
        if err:
            raise CudaError(err, "cuDevSmResourceSplit")

        def resource_at(buffer, offset: int):
            copied = driver.CUdevResource()
            ctypes.memmove(copied.getPtr(), ctypes.addressof(buffer) + offset, size)
            return copied

        groups = (
            [self._resource(resource_at(result, i * size)) for i in range(nb_groups)] if want_groups else []
        )
        left = resource_at(remainder, 0)
        return groups, self._resource(left) if int(left.sm.smCount) else (0, 0, 0, 0), group_params.raw

    def resource_desc(self, resources):
        chosen = [self._known_resource(r) for r in resources]
        return _int(_ok(driver.cuDevResourceGenerateDesc(chosen, len(chosen))))

    def cuGreenCtxCreate(self, desc, dev, flags):
        green = _int(_ok(driver.cuGreenCtxCreate(driver.CUdevResourceDesc(desc), self._d(dev), flags)))
        self.green_devices[green] = dev
        return green

    def cuGreenCtxDestroy(self, green):
        found, ctx = driver.cuCtxFromGreenCtx(driver.CUgreenCtx(green))  # goes with the green context
        self.pinned.destroy_events()
        _ok(driver.cuGreenCtxDestroy(driver.CUgreenCtx(green)))
        self.green_devices.pop(green, None)
        if found == driver.CUresult.CUDA_SUCCESS:
            self._forget_context(_int(ctx))

    def cuCtxFromGreenCtx(self, green):
        return _int(_ok(driver.cuCtxFromGreenCtx(driver.CUgreenCtx(green)))), self.green_devices.get(green, 0)

    def cuGreenCtxRecordEvent(self, green, event):
        _ok(driver.cuGreenCtxRecordEvent(driver.CUgreenCtx(green), driver.CUevent(event)))

    def cuGreenCtxWaitEvent(self, green, event):
        _ok(driver.cuGreenCtxWaitEvent(driver.CUgreenCtx(green), driver.CUevent(event)))

    def cuGreenCtxStreamCreate(self, green, flags, priority):
        return _int(_ok(driver.cuGreenCtxStreamCreate(driver.CUgreenCtx(green), flags, priority)))

    def cuStreamGetGreenCtx(self, stream):
        return _int(_ok(driver.cuStreamGetGreenCtx(self._stream(stream))))

    def cuGreenCtxGetId(self, green):
        return int(_ok(driver.cuGreenCtxGetId(driver.CUgreenCtx(green))))

    def cuCtxGetCacheConfig(self):
        return int(_ok(driver.cuCtxGetCacheConfig()))

    def cuCtxSetCacheConfig(self, config):
        _ok(driver.cuCtxSetCacheConfig(_enum(driver.CUfunc_cache, config)))

    def cuCtxGetSharedMemConfig(self):
        return int(_ok(driver.cuCtxGetSharedMemConfig()))

    def cuCtxSetSharedMemConfig(self, config):
        _ok(driver.cuCtxSetSharedMemConfig(_enum(driver.CUsharedconfig, config)))

    def cuCtxGetStreamPriorityRange(self):
        least, greatest = _ok(driver.cuCtxGetStreamPriorityRange())
        return least, greatest

    def cuCtxGetId(self, ctx):
        return _ok(driver.cuCtxGetId(driver.CUcontext(ctx)))

    def cuProfilerStart(self):
        _ok(driver.cuProfilerStart())

    def cuProfilerStop(self):
        _ok(driver.cuProfilerStop())

    # -- memory --------------------------------------------------------------------------------------

    def cuMemGetInfo(self):
        free, total = _ok(driver.cuMemGetInfo())
        return free, total

    def cuMemAlloc(self, size):
        return _int(_ok(driver.cuMemAlloc(size)))

    def cuMemAllocAsync(self, size, stream):
        return _int(_ok(driver.cuMemAllocAsync(size, self._stream(stream))))

    def cuMemAllocFromPoolAsync(self, size, pool, stream):
        return _int(
            _ok(driver.cuMemAllocFromPoolAsync(size, driver.CUmemoryPool(pool), self._stream(stream)))
        )

    def cuMemFree(self, dptr):
        _ok(driver.cuMemFree(dptr))

    def cuMemFreeAsync(self, dptr, stream):
        _ok(driver.cuMemFreeAsync(dptr, self._stream(stream)))

    def cuMemGetAddressRange(self, dptr):
        base, size = _ok(driver.cuMemGetAddressRange(dptr))
        return _int(base), int(size)

    def cuMemPoolSetAttribute(self, pool, attr, value):
        kind = _enum(driver.CUmemPool_attribute, attr)
        wrapped = value if attr in (1, 2, 3) else driver.cuuint64_t(value)
        _ok(driver.cuMemPoolSetAttribute(driver.CUmemoryPool(pool), kind, wrapped))

    def cuMemPoolGetAttribute(self, pool, attr):
        kind = _enum(driver.CUmemPool_attribute, attr)
        return _int(_ok(driver.cuMemPoolGetAttribute(driver.CUmemoryPool(pool), kind)))

    def cuMemPoolTrimTo(self, pool, keep):
        _ok(driver.cuMemPoolTrimTo(driver.CUmemoryPool(pool), keep))

    def cuMemcpyDtoD(self, dst, src, count):
        _ok(driver.cuMemcpyDtoD(dst, src, count))

    def cuMemcpyDtoDAsync(self, dst, src, count, stream):
        _ok(driver.cuMemcpyDtoDAsync(dst, src, count, self._stream(stream)))

    def cuMemcpyPeer(self, dst, dst_ctx, src, src_ctx, count):
        _ok(driver.cuMemcpyPeer(dst, driver.CUcontext(dst_ctx), src, driver.CUcontext(src_ctx), count))

    def cuMemcpyPeerAsync(self, dst, dst_ctx, src, src_ctx, count, stream):
        _ok(
            driver.cuMemcpyPeerAsync(
                dst, driver.CUcontext(dst_ctx), src, driver.CUcontext(src_ctx), count, self._stream(stream)
            )
        )

    def cuPointerGetAttribute(self, attr, ptr):
        value = _int(_ok(driver.cuPointerGetAttribute(_enum(driver.CUpointer_attribute, attr), ptr)))
        if attr == driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
            if value in self.real:
                return self.real.index(value)  # the client numbers the lease's devices 0..n-1
            # A GPU outside the lease (on GPU 1, JAX met 0): host memory the worker itself page-locked,
            # which every GPU reaches. Natively such memory reads as the device of the current context.
            current = _int(_ok(driver.cuCtxGetDevice()))
            return self.real.index(current) if current in self.real else 0
        return value

    def cuPointerSetAttribute(self, attr, ptr, value):
        word = ctypes.c_uint32(value)  # SYNC_MEMOPS, the one settable attribute, is a 4-byte bool
        _ok(
            driver.cuPointerSetAttribute(ctypes.addressof(word), _enum(driver.CUpointer_attribute, attr), ptr)
        )

    # -- modules, libraries, functions ---------------------------------------------------------------

    @staticmethod
    def _image(image: bytes):
        return ctypes.create_string_buffer(image, len(image))  # kept alive by the caller during the load

    def cuModuleLoadData(self, image):
        buf = self._image(image)
        return _int(_ok(driver.cuModuleLoadData(ctypes.addressof(buf))))

    cuModuleLoadDataEx = cuModuleLoadFatBinary = cuModuleLoadData

    def cuLibraryLoadData(self, image):
        buf = self._image(image)
        return _int(_ok(driver.cuLibraryLoadData(ctypes.addressof(buf), None, None, 0, None, None, 0)))

    # The driver's linker: inputs are copied by the driver; the linked image belongs to the link state
    # until cuLinkDestroy, so a copy is kept here for gpLinkImage.
    def cuLinkCreate(self):
        return _int(_ok(driver.cuLinkCreate(0, [], [])))

    def cuLinkAddData(self, state, kind, data):
        buf = self._image(data)
        _ok(driver.cuLinkAddData(driver.CUlinkState(state), _enum(driver.CUjitInputType, kind),
                                 ctypes.addressof(buf), len(data), b"input", 0, [], []))  # fmt: skip

    def cuLinkComplete(self, state):
        cubin, size = _ok(driver.cuLinkComplete(driver.CUlinkState(state)))
        self.linked[state] = ctypes.string_at(int(cubin), size)
        return size

    def gpLinkImage(self, state, size):
        return linked_image(self.linked, state, size)

    def cuLinkDestroy(self, state):
        self.linked.pop(state, None)
        _ok(driver.cuLinkDestroy(driver.CUlinkState(state)))

    def cuModuleUnload(self, module):
        _ok(driver.cuModuleUnload(driver.CUmodule(module)))

    def cuLibraryUnload(self, library):
        _ok(driver.cuLibraryUnload(driver.CUlibrary(library)))

    def cuModuleGetFunction(self, module, name):
        return _int(_ok(driver.cuModuleGetFunction(driver.CUmodule(module), name.encode())))

    def cuModuleGetGlobal(self, module, name):
        ptr, size = _ok(driver.cuModuleGetGlobal(driver.CUmodule(module), name.encode()))
        return _int(ptr), int(size)

    def cuLibraryGetKernel(self, library, name):
        return _int(_ok(driver.cuLibraryGetKernel(driver.CUlibrary(library), name.encode())))

    def cuLibraryGetModule(self, library):
        return _int(_ok(driver.cuLibraryGetModule(driver.CUlibrary(library))))

    def cuLibraryGetGlobal(self, library, name):
        ptr, size = _ok(driver.cuLibraryGetGlobal(driver.CUlibrary(library), name.encode()))
        return _int(ptr), int(size)

    def cuLibraryGetManaged(self, library, name):
        ptr, size = _ok(driver.cuLibraryGetManaged(driver.CUlibrary(library), name.encode()))
        return _int(ptr), int(size)

    def cuKernelGetFunction(self, kernel):
        return _int(_ok(driver.cuKernelGetFunction(driver.CUkernel(kernel))))

    def cuModuleGetFunctionCount(self, mod):
        return int(_ok(driver.cuModuleGetFunctionCount(driver.CUmodule(mod))))

    def cuModuleEnumerateFunctions(self, num, mod):
        return [_int(f) for f in _ok(driver.cuModuleEnumerateFunctions(num, driver.CUmodule(mod)))]

    def cuLibraryGetKernelCount(self, lib):
        return int(_ok(driver.cuLibraryGetKernelCount(driver.CUlibrary(lib))))

    def cuLibraryEnumerateKernels(self, num, lib):
        return [_int(k) for k in _ok(driver.cuLibraryEnumerateKernels(num, driver.CUlibrary(lib)))]

    def cuKernelGetLibrary(self, kernel):
        return _int(_ok(driver.cuKernelGetLibrary(driver.CUkernel(kernel))))

    def cuKernelGetName(self, kernel, length):
        return _ok(driver.cuKernelGetName(driver.CUkernel(kernel)))

    def cuFuncGetName(self, func, length):
        return _ok(driver.cuFuncGetName(driver.CUfunction(func)))

    def cuFuncIsLoaded(self, func):
        return int(_ok(driver.cuFuncIsLoaded(driver.CUfunction(func))))

    def cuFuncLoad(self, func):
        _ok(driver.cuFuncLoad(driver.CUfunction(func)))

    def cuKernelGetAttribute(self, attrib, kernel, dev):
        kind = _enum(driver.CUfunction_attribute, attrib)
        return _ok(driver.cuKernelGetAttribute(kind, driver.CUkernel(kernel), self._d(dev)))

    def cuKernelSetAttribute(self, attrib, value, kernel, dev):
        kind = _enum(driver.CUfunction_attribute, attrib)
        _ok(driver.cuKernelSetAttribute(kind, value, driver.CUkernel(kernel), self._d(dev)))

    def cuKernelGetParamInfo(self, kernel, index):
        offset, size = _ok(driver.cuKernelGetParamInfo(driver.CUkernel(kernel), index))
        return int(offset), int(size)

    def cuFuncGetParamInfo(self, func, index):
        offset, size = _ok(driver.cuFuncGetParamInfo(driver.CUfunction(func), index))
        return int(offset), int(size)

    def cuFuncGetAttribute(self, attrib, func):
        return _ok(
            driver.cuFuncGetAttribute(_enum(driver.CUfunction_attribute, attrib), driver.CUfunction(func))
        )

    def cuFuncSetAttribute(self, func, attrib, value):
        kind = _enum(driver.CUfunction_attribute, attrib)
        _ok(driver.cuFuncSetAttribute(driver.CUfunction(func), kind, value))

    def cuFuncSetCacheConfig(self, func, config):
        _ok(driver.cuFuncSetCacheConfig(driver.CUfunction(func), _enum(driver.CUfunc_cache, config)))

    def cuFuncSetSharedMemConfig(self, func, config):
        _ok(driver.cuFuncSetSharedMemConfig(driver.CUfunction(func), _enum(driver.CUsharedconfig, config)))

    def cuKernelSetCacheConfig(self, kernel, config, dev):
        cache = _enum(driver.CUfunc_cache, config)
        _ok(driver.cuKernelSetCacheConfig(driver.CUkernel(kernel), cache, self._d(dev)))

    def cuFuncGetModule(self, func):
        return _int(_ok(driver.cuFuncGetModule(driver.CUfunction(func))))

    def cuOccupancyMaxActiveBlocksPerMultiprocessor(self, func, block_size, smem):
        return _ok(
            driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(driver.CUfunction(func), block_size, smem)
        )

    def cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(self, func, block_size, smem, flags):
        f = driver.CUfunction(func)
        return _ok(driver.cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(f, block_size, smem, flags))

    def cuOccupancyMaxPotentialBlockSize(self, func, callback, smem, limit):
        if callback:
            raise CudaError(NOT_SUPPORTED, "a block-size callback runs in the client")
        grid, block = _ok(driver.cuOccupancyMaxPotentialBlockSize(driver.CUfunction(func), None, smem, limit))
        return grid, block

    def cuOccupancyMaxPotentialBlockSizeWithFlags(self, func, callback, smem, limit, flags):
        if callback:
            raise CudaError(NOT_SUPPORTED, "a block-size callback runs in the client")
        f = driver.CUfunction(func)
        grid, block = _ok(driver.cuOccupancyMaxPotentialBlockSizeWithFlags(f, None, smem, limit, flags))
        return grid, block

    def cuOccupancyAvailableDynamicSMemPerBlock(self, func, num_blocks, block_size):
        f = driver.CUfunction(func)
        return _ok(driver.cuOccupancyAvailableDynamicSMemPerBlock(f, num_blocks, block_size))

    # -- streams and events --------------------------------------------------------------------------

    def cuStreamCreate(self, flags):
        return _int(_ok(driver.cuStreamCreate(flags)))

    def cuStreamCreateWithPriority(self, flags, priority):
        return _int(_ok(driver.cuStreamCreateWithPriority(flags, priority)))

    def cuStreamDestroy(self, stream):
        _ok(driver.cuStreamDestroy(self._stream(stream)))
        self.streams.pop(stream, None)

    def cuStreamQuery(self, stream):
        _ok(driver.cuStreamQuery(self._stream(stream)))

    def cuStreamSynchronize(self, stream):
        _ok(driver.cuStreamSynchronize(self._stream(stream)))

    def cuStreamWaitEvent(self, stream, event, flags):
        _ok(driver.cuStreamWaitEvent(self._stream(stream), driver.CUevent(event), flags))

    def cuStreamIsCapturing(self, stream):
        return int(_ok(driver.cuStreamIsCapturing(self._stream(stream))))

    def cuStreamGetPriority(self, stream):
        return _ok(driver.cuStreamGetPriority(self._stream(stream)))

    def cuStreamGetFlags(self, stream):
        return int(_ok(driver.cuStreamGetFlags(self._stream(stream))))

    def cuStreamGetCtx(self, stream):
        return _int(_ok(driver.cuStreamGetCtx(self._stream(stream))))

    def cuStreamGetId(self, stream):
        return int(_ok(driver.cuStreamGetId(self._stream(stream))))

    def cuStreamGetDevice(self, stream):
        return self.real.index(_int(_ok(driver.cuStreamGetDevice(self._stream(stream)))))

    def cuStreamBeginCapture(self, stream, mode):
        _ok(driver.cuStreamBeginCapture(self._stream(stream), _enum(driver.CUstreamCaptureMode, mode)))

    def cuStreamEndCapture(self, stream):
        return _int(_ok(driver.cuStreamEndCapture(self._stream(stream))))

    def capture_info(self, stream):
        status, capture_id, graph, deps, _edges, count = _ok(
            driver.cuStreamGetCaptureInfo(self._stream(stream))
        )
        return int(status), int(capture_id), _int(graph), [_int(n) for n in list(deps)[:count]]

    def capture_to_graph(self, stream, graph, deps, mode):
        _ok(driver.cuStreamBeginCaptureToGraph(
            self._stream(stream), driver.CUgraph(graph), self._deps(deps), None, len(deps),
            _enum(driver.CUstreamCaptureMode, mode),
        ))  # fmt: skip

    def recapture_to_graph(self, stream, mode, graph, on_mismatch, layout_of):
        """Through the driver's own entry point (CUDA 13.3; cuda.bindings would take a Python callback only
        as a raw address): a driver without it answers as cuda.bindings' loader does, CUDA_ERROR_NOT_FOUND
        (the shim's cuGetProcAddress already says it is not found: the worker's `lacks`)."""
        try:
            begin = self._driver_function("cuStreamBeginRecaptureToGraph", 13030, _RECAPTURE_ARGS)
        except CudaError as exc:
            raise CudaError(NOT_FOUND, "the driver has no cuStreamBeginRecaptureToGraph") from exc
        callback = _RECAPTURE_CALLBACK()  # NULL: the driver takes the recaptured parameters
        if on_mismatch is not None:

            def called(_data, node, original, recaptured, status):
                try:  # on the thread of the captured call; an exception here must not reach the driver
                    sides = (self._recaptured(p, layout_of) for p in (original, recaptured))
                    return int(on_mismatch(int(node or 0), *sides, status))
                except Exception:
                    log.exception("a recapture's callback failed; the recapture fails")
                    return int(driver.CUresult.CUDA_ERROR_UNKNOWN)

            callback = _RECAPTURE_CALLBACK(called)
        mode = int(_enum(driver.CUstreamCaptureMode, mode))
        result = begin(_int(self._stream(stream)), mode, graph, callback, None)
        if result:
            raise CudaError(result, "cuStreamBeginRecaptureToGraph")
        self.recapture_callbacks[stream] = callback  # the driver calls it until the capture ends

    @staticmethod
    def _recaptured(address: int, layout_of) -> RecapturedNode:
        """One side of a recapture's question, read from the driver's CUgraphNodeParams: a kernel node's
        arguments copied through its kernelParams by the function's (or kernel's) layout."""
        raw = ctypes.string_at(address, NODE_PARAMS_BYTES)
        if struct.unpack_from("<i", raw)[0] != KERNEL_NODE:
            return RecapturedNode.of(raw)
        func, *_dims, pointers, _extra, kern, _ctx = KERNEL_NODE_PARAMS.unpack_from(raw, 16)
        handle, layout = next(((h, layout_of(h)) for h in (func, kern) if h and layout_of(h)), (func, []))
        args = bytearray(max((offset + size for offset, size in layout), default=0))
        for i, (offset, size) in enumerate(layout if pointers else ()):
            args[offset : offset + size] = ctypes.string_at(
                ctypes.c_void_p.from_address(pointers + 8 * i).value, size
            )
        return RecapturedNode.of(raw, handle, bytes(args))

    def update_capture_dependencies(self, stream, deps, flags):
        _ok(
            driver.cuStreamUpdateCaptureDependencies(
                self._stream(stream), self._deps(deps), None, len(deps), flags
            )
        )

    def cuThreadExchangeStreamCaptureMode(self, mode):
        return int(_ok(driver.cuThreadExchangeStreamCaptureMode(_enum(driver.CUstreamCaptureMode, mode))))

    @staticmethod
    def _listed(query, subject):
        """A graph query that fills arrays of the length it is given: asked for the count, then the lists."""
        count = _ok(query(subject))[-1]
        return _ok(query(subject, count)) if count else None

    def graph_nodes(self, graph):
        listed = self._listed(driver.cuGraphGetNodes, driver.CUgraph(graph))
        return [_int(n) for n in listed[0]] if listed else []

    def graph_edges(self, graph):
        listed = self._listed(driver.cuGraphGetEdges, driver.CUgraph(graph))
        return [(_int(a), _int(b)) for a, b in zip(listed[0], listed[1], strict=True)] if listed else []

    def graph_node_list(self, which, subject):
        if which == "cuGraphGetRootNodes":
            listed = self._listed(driver.cuGraphGetRootNodes, driver.CUgraph(subject))
            return ([_int(n) for n in listed[0]] if listed else []), []
        query = getattr(driver, which)  # cuGraphNodeGetDependencies / cuGraphNodeGetDependentNodes
        listed = self._listed(query, driver.CUgraphNode(subject))
        if not listed:
            return [], []
        nodes, data = listed[0], listed[1]
        return [_int(n) for n in nodes], [_edge_data_bytes(d) for d in data]

    def cuGraphClone(self, graph):
        return _int(_ok(driver.cuGraphClone(driver.CUgraph(graph))))

    def cuGraphNodeFindInClone(self, original, clone):
        return _int(_ok(driver.cuGraphNodeFindInClone(driver.CUgraphNode(original), driver.CUgraph(clone))))

    def cuGraphNodeGetType(self, node):
        return int(_ok(driver.cuGraphNodeGetType(driver.CUgraphNode(node))))

    def graph_add_event_node(self, graph, deps, event, wait):
        add = driver.cuGraphAddEventWaitNode if wait else driver.cuGraphAddEventRecordNode
        return _int(_ok(add(driver.CUgraph(graph), self._deps(deps), len(deps), driver.CUevent(event))))

    @staticmethod
    def _memcpy_node(copy: Copy3D):
        params = driver.CUDA_MEMCPY3D()
        params.srcMemoryType = params.dstMemoryType = driver.CUmemorytype.CU_MEMORYTYPE_DEVICE
        params.srcDevice, params.srcPitch, params.srcHeight = copy.src, copy.src_pitch, copy.src_height
        params.dstDevice, params.dstPitch, params.dstHeight = copy.dst, copy.dst_pitch, copy.dst_height
        params.WidthInBytes, params.Height, params.Depth = copy.width, copy.height, copy.depth
        return params

    def graph_add_memcpy_node(self, graph, deps, copy: Copy3D):
        params, ctx = self._memcpy_node(copy), _ok(driver.cuCtxGetCurrent())
        return _int(
            _ok(driver.cuGraphAddMemcpyNode(driver.CUgraph(graph), self._deps(deps), len(deps), params, ctx))
        )

    def graph_add_mem_alloc_node(self, graph, deps, device, size, access):
        params = driver.CUDA_MEM_ALLOC_NODE_PARAMS()
        params.poolProps.allocType = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        params.poolProps.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        params.poolProps.location.id = self._d(device)
        params.accessDescs = self._descs(access)
        params.accessDescCount = len(access)
        params.bytesize = size
        node = _ok(driver.cuGraphAddMemAllocNode(driver.CUgraph(graph), self._deps(deps), len(deps), params))
        return _int(node), _int(params.dptr)  # the driver wrote the address into the parameters

    def _batch_mem_op_node(self, ops: bytes, flags: int):
        params = driver.CUDA_BATCH_MEM_OP_NODE_PARAMS()
        params.ctx = _ok(driver.cuCtxGetCurrent())
        params.count = len(ops) // MEM_OP_BYTES
        params.paramArray = [
            self._struct(driver.CUstreamBatchMemOpParams, ops[at : at + MEM_OP_BYTES])
            for at in range(0, len(ops), MEM_OP_BYTES)
        ]
        params.flags = flags
        return params

    def graph_add_batch_mem_op_node(self, graph, deps, ops, flags):
        params = self._batch_mem_op_node(ops, flags)
        return _int(
            _ok(driver.cuGraphAddBatchMemOpNode(driver.CUgraph(graph), self._deps(deps), len(deps), params))
        )

    def graph_batch_mem_op_node_set(self, graph_exec, node, ops, flags):
        params, node = self._batch_mem_op_node(ops, flags), driver.CUgraphNode(node)
        if graph_exec:
            _ok(driver.cuGraphExecBatchMemOpNodeSetParams(driver.CUgraphExec(graph_exec), node, params))
        else:
            _ok(driver.cuGraphBatchMemOpNodeSetParams(node, params))

    def graph_batch_mem_op_node_params(self, node):
        """Read from the C structure the driver filled: context, count, the operations' address, flags."""
        params = _ok(driver.cuGraphBatchMemOpNodeGetParams(driver.CUgraphNode(node)))
        _, count, ops_at, flags = BATCH_NODE_PARAMS.unpack(
            ctypes.string_at(params.getPtr(), BATCH_NODE_PARAMS.size)
        )
        return (ctypes.string_at(ops_at, count * MEM_OP_BYTES) if count else b""), flags

    def graph_mem_alloc_node_params(self, node):
        """Read from the C structure the driver filled (cuda.bindings' `accessDescs` lists only descriptors
        it was given itself)."""
        params = _ok(driver.cuGraphMemAllocNodeGetParams(driver.CUgraphNode(node)))
        raw = ctypes.string_at(params.getPtr(), ALLOC_NODE_PARAMS.size)
        _, _, _, device, descs_at, count, size, ptr = ALLOC_NODE_PARAMS.unpack(raw)
        lease_device = {real: dev for dev, real in enumerate(self.real)}
        described = ctypes.string_at(descs_at, count * ACCESS_DESC.size) if count else b""
        access = [(lease_device[peer], flags) for _, peer, flags in ACCESS_DESC.iter_unpack(described)]
        return lease_device[device], size, ptr, access

    def graph_add_mem_free_node(self, graph, deps, ptr):
        return _int(
            _ok(driver.cuGraphAddMemFreeNode(driver.CUgraph(graph), self._deps(deps), len(deps), ptr))
        )

    def cuGraphMemFreeNodeGetParams(self, node):
        return _int(_ok(driver.cuGraphMemFreeNodeGetParams(driver.CUgraphNode(node))))

    def cuDeviceGraphMemTrim(self, dev):
        _ok(driver.cuDeviceGraphMemTrim(self._d(dev)))

    def cuDeviceGetGraphMemAttribute(self, dev, attr):
        kind = _enum(driver.CUgraphMem_attribute, attr)
        return int(_ok(driver.cuDeviceGetGraphMemAttribute(self._d(dev), kind)))

    def cuDeviceSetGraphMemAttribute(self, dev, attr, value):
        kind = _enum(driver.CUgraphMem_attribute, attr)
        _ok(driver.cuDeviceSetGraphMemAttribute(self._d(dev), kind, driver.cuuint64_t(value)))

    def graph_exec_memcpy_node(self, graph_exec, node, copy: Copy3D):
        params, ctx = self._memcpy_node(copy), _ok(driver.cuCtxGetCurrent())
        _ok(driver.cuGraphExecMemcpyNodeSetParams(
            driver.CUgraphExec(graph_exec), driver.CUgraphNode(node), params, ctx
        ))  # fmt: skip

    def cuGraphExecChildGraphNodeSetParams(self, graph_exec, node, child):
        _ok(driver.cuGraphExecChildGraphNodeSetParams(
            driver.CUgraphExec(graph_exec), driver.CUgraphNode(node), driver.CUgraph(child)
        ))  # fmt: skip

    def cuGraphNodeSetEnabled(self, graph_exec, node, enabled):
        _ok(driver.cuGraphNodeSetEnabled(driver.CUgraphExec(graph_exec), driver.CUgraphNode(node), enabled))

    def cuGraphNodeGetEnabled(self, graph_exec, node):
        return int(
            _ok(driver.cuGraphNodeGetEnabled(driver.CUgraphExec(graph_exec), driver.CUgraphNode(node)))
        )

    def cuGraphExecEventRecordNodeSetEvent(self, graph_exec, node, event):
        _ok(driver.cuGraphExecEventRecordNodeSetEvent(
            driver.CUgraphExec(graph_exec), driver.CUgraphNode(node), driver.CUevent(event)
        ))  # fmt: skip

    def cuGraphExecEventWaitNodeSetEvent(self, graph_exec, node, event):
        _ok(driver.cuGraphExecEventWaitNodeSetEvent(
            driver.CUgraphExec(graph_exec), driver.CUgraphNode(node), driver.CUevent(event)
        ))  # fmt: skip

    def cuGraphEventRecordNodeGetEvent(self, node):
        return _int(_ok(driver.cuGraphEventRecordNodeGetEvent(driver.CUgraphNode(node))))

    def cuGraphEventRecordNodeSetEvent(self, node, event):
        _ok(driver.cuGraphEventRecordNodeSetEvent(driver.CUgraphNode(node), driver.CUevent(event)))

    def cuGraphEventWaitNodeGetEvent(self, node):
        return _int(_ok(driver.cuGraphEventWaitNodeGetEvent(driver.CUgraphNode(node))))

    def cuGraphEventWaitNodeSetEvent(self, node, event):
        _ok(driver.cuGraphEventWaitNodeSetEvent(driver.CUgraphNode(node), driver.CUevent(event)))

    def cuGraphExecGetFlags(self, graph_exec):
        return int(_ok(driver.cuGraphExecGetFlags(driver.CUgraphExec(graph_exec))))

    def _host_node(self, fn):
        """CUDA_HOST_NODE_PARAMS that call `fn` (kept: it runs at every launch)."""
        key = next(self._host_keys)
        self.host_funcs[key] = fn
        self.kept_host_funcs.add(key)
        params = driver.CUDA_HOST_NODE_PARAMS()
        params.fn = self._host_thunk_fn
        params.userData = key
        return params

    def graph_host_node_fn(self, node):
        params = _ok(driver.cuGraphHostNodeGetParams(driver.CUgraphNode(node)))
        return self.host_funcs[int(params.userData)]

    def graph_add_host_node(self, graph, deps, fn):
        params = self._host_node(fn)
        return _int(
            _ok(driver.cuGraphAddHostNode(driver.CUgraph(graph), self._deps(deps), len(deps), params))
        )

    def graph_host_node_set(self, graph_exec, node, fn) -> None:
        params = self._host_node(fn)
        if graph_exec:
            _ok(
                driver.cuGraphExecHostNodeSetParams(
                    driver.CUgraphExec(graph_exec), driver.CUgraphNode(node), params
                )
            )
        else:
            _ok(driver.cuGraphHostNodeSetParams(driver.CUgraphNode(node), params))

    def cuGraphInstantiateWithFlags(self, graph, flags):
        return _int(_ok(driver.cuGraphInstantiate(driver.CUgraph(graph), flags)))

    def cuGraphLaunch(self, graph_exec, stream):
        _ok(driver.cuGraphLaunch(driver.CUgraphExec(graph_exec), self._stream(stream)))

    def cuGraphUpload(self, graph_exec, stream):
        _ok(driver.cuGraphUpload(driver.CUgraphExec(graph_exec), self._stream(stream)))

    def cuGraphExecDestroy(self, graph_exec):
        _ok(driver.cuGraphExecDestroy(driver.CUgraphExec(graph_exec)))

    def cuGraphDestroy(self, graph):
        _ok(driver.cuGraphDestroy(driver.CUgraph(graph)))

    def cuGraphCreate(self, flags):
        return _int(_ok(driver.cuGraphCreate(flags)))

    def cuGraphDestroyNode(self, node):
        _ok(driver.cuGraphDestroyNode(driver.CUgraphNode(node)))

    @staticmethod
    def _kernel_node(launch: Launch):
        """CUDA_KERNEL_NODE_PARAMS over a buffer of its own (the driver copies the parameters)."""
        func = launch.func
        if launch.is_kernel:  # a kernel node names a function (of the current context), not a CUkernel
            func = _int(_ok(driver.cuKernelGetFunction(driver.CUkernel(func))))
        target = _Launchable(func, launch.layout)
        ctypes.memmove(target.buffer, launch.params, min(len(launch.params), len(target.buffer)))
        params = driver.CUDA_KERNEL_NODE_PARAMS()
        params.func = target.function
        params.gridDimX, params.gridDimY, params.gridDimZ = launch.grid
        params.blockDimX, params.blockDimY, params.blockDimZ = launch.block
        params.sharedMemBytes = launch.shared_mem
        params.kernelParams = target.params
        return params, target

    @staticmethod
    def _deps(deps: list[int]) -> list:
        return [driver.CUgraphNode(d) for d in deps]

    def graph_add_kernel_node(self, graph, deps, launch) -> int:
        params, _keep = self._kernel_node(launch)
        return _int(
            _ok(driver.cuGraphAddKernelNode(driver.CUgraph(graph), self._deps(deps), len(deps), params))
        )

    def graph_exec_kernel_node(self, graph_exec, node, launch) -> None:
        params, _keep = self._kernel_node(launch)
        _ok(
            driver.cuGraphExecKernelNodeSetParams(
                driver.CUgraphExec(graph_exec), driver.CUgraphNode(node), params
            )
        )

    @staticmethod
    def _memset_node(dst, pitch, value, element_size, width, height):
        params = driver.CUDA_MEMSET_NODE_PARAMS()
        params.dst, params.pitch, params.value = dst, pitch, value
        params.elementSize, params.width, params.height = element_size, width, height
        return params

    def graph_add_memset_node(self, graph, deps, dst, pitch, value, element_size, width, height) -> int:
        params = self._memset_node(dst, pitch, value, element_size, width, height)
        ctx = _ok(driver.cuCtxGetCurrent())
        return _int(
            _ok(driver.cuGraphAddMemsetNode(driver.CUgraph(graph), self._deps(deps), len(deps), params, ctx))
        )

    def graph_exec_memset_node(
        self, graph_exec, node, dst, pitch, value, element_size, width, height
    ) -> None:
        params = self._memset_node(dst, pitch, value, element_size, width, height)
        ctx = _ok(driver.cuCtxGetCurrent())
        _ok(driver.cuGraphExecMemsetNodeSetParams(
            driver.CUgraphExec(graph_exec), driver.CUgraphNode(node), params, ctx
        ))  # fmt: skip

    def graph_add_empty_node(self, graph, deps) -> int:
        return _int(_ok(driver.cuGraphAddEmptyNode(driver.CUgraph(graph), self._deps(deps), len(deps))))

    def graph_add_child_node(self, graph, deps, child) -> int:
        return _int(_ok(driver.cuGraphAddChildGraphNode(
            driver.CUgraph(graph), self._deps(deps), len(deps), driver.CUgraph(child)
        )))  # fmt: skip

    def cuGraphChildGraphNodeGetGraph(self, node):
        return _int(_ok(driver.cuGraphChildGraphNodeGetGraph(driver.CUgraphNode(node))))

    def cuGraphConditionalHandleCreate(self, graph, ctx, default_value, flags):
        return _int(_ok(driver.cuGraphConditionalHandleCreate(
            driver.CUgraph(graph), driver.CUcontext(ctx) if ctx else _ok(driver.cuCtxGetCurrent()), default_value, flags
        )))  # fmt: skip

    def graph_add_conditional_node(self, graph, deps, handle, kind, size, ctx):
        params = driver.CUgraphNodeParams()
        params.type = driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
        params.conditional.handle = driver.CUgraphConditionalHandle(handle)
        params.conditional.type = _enum(driver.CUgraphConditionalNodeType, kind)
        params.conditional.size = size
        params.conditional.ctx = driver.CUcontext(ctx) if ctx else _ok(driver.cuCtxGetCurrent())
        node = _ok(driver.cuGraphAddNode(driver.CUgraph(graph), self._deps(deps), None, len(deps), params))
        return _int(node), [_int(params.conditional.phGraph_out[i]) for i in range(size)]

    def graph_exec_update(self, graph_exec, graph):
        err, info = driver.cuGraphExecUpdate(driver.CUgraphExec(graph_exec), driver.CUgraph(graph))
        return int(info.result) if info is not None else 0, int(err)

    def _edges(self, edges, edge_data):
        """The driver's (from, to, data) arrays for `edges`; no data where every edge is the default."""
        sources, targets = self._deps([a for a, _ in edges]), self._deps([b for _, b in edges])
        data = None
        if edge_data and any(any(d) for d in edge_data):
            data = []
            for raw in edge_data:
                e = driver.CUgraphEdgeData()
                e.from_port, e.to_port, e.type = raw[0], raw[1], raw[2]
                data.append(e)
        return sources, targets, data

    def graph_add_dependencies(self, graph, edges, edge_data=None) -> None:
        _ok(driver.cuGraphAddDependencies(driver.CUgraph(graph), *self._edges(edges, edge_data), len(edges)))

    def graph_remove_dependencies(self, graph, edges, edge_data=None) -> None:
        _ok(
            driver.cuGraphRemoveDependencies(
                driver.CUgraph(graph), *self._edges(edges, edge_data), len(edges)
            )
        )

    # A graph's nodes set anew, read back, and asked their ids (issue 25's graph calls).
    def graph_kernel_node_set(self, node, launch) -> None:
        params, _keep = self._kernel_node(launch)
        _ok(driver.cuGraphKernelNodeSetParams(driver.CUgraphNode(node), params))

    def graph_memset_node_set(self, node, dst, pitch, value, element_size, width, height) -> None:
        params = self._memset_node(dst, pitch, value, element_size, width, height)
        _ok(driver.cuGraphMemsetNodeSetParams(driver.CUgraphNode(node), params))

    def cuGraphMemsetNodeGetParams(self, node):
        p = _ok(driver.cuGraphMemsetNodeGetParams(driver.CUgraphNode(node)))
        return _int(p.dst), p.pitch, p.value, p.elementSize, p.width, p.height

    def cuGraphDebugDotPrint(self, graph, flags) -> bytes:
        with tempfile.TemporaryDirectory(prefix="gpupool-dot-") as folder:
            path = os.path.join(folder, "graph.dot")
            _ok(driver.cuGraphDebugDotPrint(driver.CUgraph(graph), path.encode(), flags))
            with open(path, "rb") as f:
                return f.read()

    def graph_kernel_node_params(self, node, layout_of):
        p = _ok(driver.cuGraphKernelNodeGetParams(driver.CUgraphNode(node)))
        func = _int(p.func)
        layout = layout_of(func)
        pointers = int(p.kernelParams or 0)
        if layout and not pointers:
            raise CudaError(NOT_SUPPORTED, "a kernel node whose parameters are in an extra buffer")
        packed = bytearray(max((offset + size for offset, size in layout), default=0))
        for i, (offset, size) in enumerate(layout):  # kernelParams: one pointer per parameter
            packed[offset : offset + size] = ctypes.string_at(
                ctypes.c_void_p.from_address(pointers + 8 * i).value, size
            )
        grid = (p.gridDimX, p.gridDimY, p.gridDimZ)
        return func, grid, (p.blockDimX, p.blockDimY, p.blockDimZ), p.sharedMemBytes, bytes(packed)

    def graph_memcpy_node_params(self, node) -> Copy3D:
        p = _ok(driver.cuGraphMemcpyNodeGetParams(driver.CUgraphNode(node)))
        device = (driver.CUmemorytype.CU_MEMORYTYPE_DEVICE, driver.CUmemorytype.CU_MEMORYTYPE_UNIFIED)
        if p.srcMemoryType not in device or p.dstMemoryType not in device:
            raise CudaError(NOT_SUPPORTED, "a copy node of host memory or an array")
        src = int(p.srcDevice) + (p.srcZ * p.srcHeight + p.srcY) * p.srcPitch + p.srcXInBytes
        dst = int(p.dstDevice) + (p.dstZ * p.dstHeight + p.dstY) * p.dstPitch + p.dstXInBytes
        return Copy3D(
            src, p.srcPitch, p.srcHeight, dst, p.dstPitch, p.dstHeight, p.WidthInBytes, p.Height, p.Depth
        )

    def graph_memcpy_node_set(self, node, copy: Copy3D) -> None:
        _ok(driver.cuGraphMemcpyNodeSetParams(driver.CUgraphNode(node), self._memcpy_node(copy)))

    def cuGraphKernelNodeGetAttribute(self, node, attr):
        kind = _enum(driver.CUkernelNodeAttrID, attr)
        value = _ok(driver.cuGraphKernelNodeGetAttribute(driver.CUgraphNode(node), kind))
        return ctypes.string_at(value.getPtr(), 64)

    def cuGraphKernelNodeSetAttribute(self, node, attr, value):
        kind = _enum(driver.CUkernelNodeAttrID, attr)
        raw = self._struct(driver.CUkernelNodeAttrValue, value)
        _ok(driver.cuGraphKernelNodeSetAttribute(driver.CUgraphNode(node), kind, raw))

    def cuGraphKernelNodeCopyAttributes(self, dst, src):
        _ok(driver.cuGraphKernelNodeCopyAttributes(driver.CUgraphNode(dst), driver.CUgraphNode(src)))

    def cuGraphNodeGetContainingGraph(self, node):
        return _int(_ok(driver.cuGraphNodeGetContainingGraph(driver.CUgraphNode(node))))

    def cuGraphNodeGetLocalId(self, node):
        return int(_ok(driver.cuGraphNodeGetLocalId(driver.CUgraphNode(node))))

    def cuGraphNodeGetToolsId(self, node):
        return int(_ok(driver.cuGraphNodeGetToolsId(driver.CUgraphNode(node))))

    def cuGraphGetId(self, graph):
        return int(_ok(driver.cuGraphGetId(driver.CUgraph(graph))))

    def cuGraphExecGetId(self, graph_exec):
        return int(_ok(driver.cuGraphExecGetId(driver.CUgraphExec(graph_exec))))

    def cuEventCreate(self, flags):
        return _int(_ok(driver.cuEventCreate(flags)))

    def cuEventRecord(self, event, stream):
        _ok(driver.cuEventRecord(driver.CUevent(event), self._stream(stream)))

    def cuEventRecordWithFlags(self, event, stream, flags):
        _ok(driver.cuEventRecordWithFlags(driver.CUevent(event), self._stream(stream), flags))

    def cuEventQuery(self, event):
        _ok(driver.cuEventQuery(driver.CUevent(event)))

    def cuEventSynchronize(self, event):
        _ok(driver.cuEventSynchronize(driver.CUevent(event)))

    def cuEventDestroy(self, event):
        _ok(driver.cuEventDestroy(driver.CUevent(event)))

    def cuEventElapsedTime(self, start, end):
        return float(_ok(driver.cuEventElapsedTime(driver.CUevent(start), driver.CUevent(end))))


class _Landed(StagedCopy):
    """A copy straight into memory the client maps: done once its event is (the event goes then)."""

    def __init__(self, event) -> None:
        self._event = event
        self._done = False

    def ready(self) -> bool:
        if not self._done and driver.cuEventQuery(self._event)[0] != driver.CUresult.CUDA_ERROR_NOT_READY:
            self._finish()
        return self._done

    def wait(self) -> None:
        if not self._done:
            driver.cuEventSynchronize(self._event)
            self._finish()

    def _finish(self) -> None:
        self._done = True
        driver.cuEventDestroy(self._event)

    def view(self) -> memoryview:
        return memoryview(b"")
