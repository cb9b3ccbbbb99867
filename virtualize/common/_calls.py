"""The one table of CUDA driver calls gpupool's `libcuda.so.1` forwards, and how each crosses the wire.

Both sides read this table: `virtualize.common._shimgen` turns it into the shim's C (`shim/calls_gen.h`:
call ids, packed wire structs, and the body of every plain call), and the worker decodes requests,
checks handles and pointers, and dispatches with it. Change a call here, run
`python -m virtualize.common._shimgen`, commit both; a test fails while the generated C is stale.

A parameter is written `type name`. Wire types: `i32 u32 u64 u8 u16 f32`; handles (8 bytes on the wire,
checked on the worker against the lease's own objects): `ctx stream event module func kernel library
pool`; `dptr` is a device pointer (checked against the lease's allocations). A leading `o_` marks an
out parameter (a pointer in C, a value in the reply); a trailing `?` lets that pointer be NULL.
`cstr` is a NUL-terminated string sent in the request's bulk part, `obuf:LEN` an out buffer of the
length held by parameter LEN, `ob16` a 16-byte out struct (a UUID), `ptr` a raw client pointer that
only hand-written code reads.
"""

from __future__ import annotations

import enum
import struct
import zlib
from dataclasses import dataclass
from functools import cached_property

HANDLE_TYPES = (
    "ctx", "stream", "event", "module", "func", "kernel", "library", "pool", "graph", "graphexec", "link",
    "vmem",  # a CUmemGenericAllocationHandle (cuMemCreate)
    "node",  # a CUgraphNode
    "array", "mipmap",  # a CUarray, a CUmipmappedArray
    "texobj", "surfobj",  # a CUtexObject, a CUsurfObject
    "greenctx", "devres", "resdesc",  # a CUgreenCtx, a CUdevResource (its id), a CUdevResourceDesc
    "comm",  # an NCCL communicator made on the worker (virtualize.server._guard_nccl)
    "texref", "surfref",  # a CUtexref, a CUsurfref (legacy texture and surface references)
)  # fmt: skip
SCALAR_TYPES = {"i32": "i", "u32": "I", "u64": "Q", "u8": "B", "u16": "H", "f32": "f", "dptr": "Q"}
SCALAR_TYPES.update(dict.fromkeys(HANDLE_TYPES, "Q"))
SUBJECT_TYPES = ("func", "kernel", "module", "library")  # what kept answers are about (shim_memo.c)


class Mode(enum.Enum):
    REPLY = "reply"  # the shim waits for the worker's answer
    ASYNC = "async"  # sent without waiting; an error surfaces at the next synchronising call
    LOCAL = "local"  # served inside the client (host memory, context stack, error strings), or by
    # sending other calls of the table (cuMemcpy: HtoD/DtoH/DtoD; cuLaunchKernel: cuLaunchKernelEx)


@dataclass(frozen=True)
class Param:
    type: str  # wire type without the `o_` prefix and `?` suffix
    name: str
    out: bool = False
    optional: bool = False
    length_from: str | None = None  # obuf: the in-parameter that holds the length

    @property
    def struct_code(self) -> str:
        return SCALAR_TYPES.get(self.type, "")


@dataclass(frozen=True)
class Call:
    name: str  # what cuGetProcAddress is asked for; internal calls start with "gp"
    since: int  # the CUDA version whose ABI this is (cuGetProcAddress picks the newest <= asked)
    symbol: str  # exported C symbol ("" for internal calls)
    params: tuple[Param, ...]
    mode: Mode
    sync_point: bool = False  # reports errors left by earlier asynchronous calls
    custom: bool = False  # hand-written in shim/*.c (its wire layout is here)
    wire: tuple[Param, ...] | None = None  # the wire layout when it differs from the C parameters
    # Answers the client keeps (shim/shim_memo.c): the memo group whose answer this call's is, whether
    # the answer depends on the current context, the groups this call can change, and the group whose
    # answers are not to be trusted between this call and a `resumes` call (a stream capture); `forgets`:
    # the group whose answers about this call's subject (its first function, kernel, module or library)
    # it changes, and `links`: this call's out-handle came from its subject (a kernel from a library).
    memo: str = ""
    memo_ctx: bool = False
    invalidates: tuple[str, ...] = ()
    forgets: str = ""
    links: bool = False
    pauses: str = ""
    resumes: str = ""
    how: str = ""  # a LOCAL call: how the shim serves it (shown in docs/driver-census.md)

    # Derived once per call (the worker reads them on every request).
    @cached_property
    def wire_params(self) -> tuple[Param, ...]:
        return self.params if self.wire is None else self.wire

    @cached_property
    def ins(self) -> tuple[Param, ...]:
        return tuple(p for p in self.wire_params if not p.out and p.struct_code)

    @cached_property
    def outs(self) -> tuple[Param, ...]:
        return tuple(p for p in self.wire_params if p.out)

    @cached_property
    def in_format(self) -> str:
        return "<" + "".join(p.struct_code for p in self.ins)

    @cached_property
    def out_format(self) -> str:
        """Fixed-size outs only; `obuf`/`ob16` bytes follow them in the reply's bulk part."""
        return "<" + "".join(p.struct_code for p in self.outs if p.struct_code)

    @cached_property
    def in_struct(self) -> struct.Struct:
        return struct.Struct(self.in_format)

    @cached_property
    def out_struct(self) -> struct.Struct:
        return struct.Struct(self.out_format)

    @cached_property
    def checked(self) -> tuple[tuple[int, str], ...]:
        """(position, type) of each in-parameter the worker checks: handles and device pointers."""
        kinds = (*HANDLE_TYPES, "dptr")
        return tuple((i, p.type) for i, p in enumerate(self.ins) if p.type in kinds)

    @cached_property
    def subject(self) -> Param | None:
        """The function, kernel, module or library the call's answer is about (kept answers, forgets)."""
        return next((p for p in self.ins if p.type in SUBJECT_TYPES), None)

    @cached_property
    def bulk_in(self) -> bool:
        return any(p.type in ("cstr", "bytes") for p in self.wire_params if not p.out)


def _params(spec: str) -> tuple[Param, ...]:
    out = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        typ, name = item.split()
        is_out = typ.startswith("o_")
        typ = typ.removeprefix("o_")
        optional = typ.endswith("?")
        typ = typ.rstrip("?")
        length_from = None
        if typ.startswith("buf:"):
            typ, length_from = "buf", typ.split(":", 1)[1]
        out.append(Param(typ, name, is_out, optional, length_from))
    return tuple(out)


def _c(
    name: str,
    since: int,
    params: str,
    mode: Mode = Mode.REPLY,
    *,
    symbol: str = "",
    sync: bool = False,
    custom: bool = False,
    wire: str | None = None,
    memo: str = "",
    memo_ctx: bool = False,
    invalidates: tuple[str, ...] = (),
    forgets: str = "",
    links: bool = False,
    pauses: str = "",
    resumes: str = "",
    how: str = "",
) -> Call:
    return Call(
        name=name,
        since=since,
        symbol=symbol or name,
        params=_params(params),
        mode=mode,
        sync_point=sync,
        custom=custom,
        wire=None if wire is None else _params(wire),
        memo=memo,
        memo_ctx=memo_ctx,
        invalidates=invalidates,
        forgets=forgets,
        links=links,
        pauses=pauses,
        resumes=resumes,
        how=how,
    )


# Groups of answers the client keeps, and what each holds (virtualize/client/shim/shim_memo.c):
MEMO_GROUPS = {
    "constant": "facts of the device and driver that do not change while a process runs",
    "primary_ctx": "a device's primary-context state, changed by retain, release, set-flags, reset",
    "functions": "kernels' and functions' attributes, occupancies and the function of a kernel in a "
    "context, changed by attribute setters (of that kernel or function) and unloads (of its library or module)",
    "limits": "a context's limits, changed by cuCtxSetLimit and a primary-context reset",
    "capture": "whether a stream captures: kept only while no capture is under way",
    "elapsed": "the elapsed time between two events that have both completed (failures are not kept), "
    "changed when an event is recorded again (cuEventRecord, a graph's record nodes, a context's or a green "
    "context's record), created or destroyed, and by a reset",
}


R, A, L = Mode.REPLY, Mode.ASYNC, Mode.LOCAL
PRIMARY = ("primary_ctx",)
RESET = (
    "primary_ctx",
    "functions",
    "limits",
    "capture",
    "elapsed",
)  # a reset destroys everything of the context
RECORDS = ("elapsed",)  # a call that records an event again, or makes or ends one

# fmt: off
CALLS: tuple[Call, ...] = (
    # -- internal: the handshake, the thread's current context, a kernel's parameter layout ----------
    # The handshake (virtualize/common/_wire.py): nonces both ways, each side proves it holds the lease secret.
    _c("gpHello", 0, "u32 version, bytes nonce", symbol="-"),
    _c("gpProve", 0, "o_u32 device_count, bytes proof", symbol="-"),
    # A process whose lease moved here from another server's worker: its first frame, naming its state.
    _c("gpResume", 0, "u64 token", symbol="-"),
    # A process's first frame after the handshake when it asks for a worker process of its own (flags 1,
    # GPUPOOL_ISOLATE): answered here, or MOVED_TO (token 0) the worker that will serve it alone.
    _c("gpProcessStart", 0, "u32 flags", symbol="-"),
    # What the lease holds of device `dev` now, in every worker of it: NVML's used memory in the process
    # (virtualize/client/nvml), asked only once the process is connected.
    _c("gpLeaseMemory", 0, "i32 dev, o_u64 used", symbol="-"),
    # IPC between the workers of a lease whose processes each have one (GPUPOOL_ISOLATE): the allocation an
    # IPC handle names mapped from the worker that holds it, and let go when the program closes the handle.
    _c("gpIpcImport", 0, "u64 base, u64 size", symbol="-"),
    _c("gpIpcRelease", 0, "u64 base", symbol="-"),
    # ... and an interprocess event of another worker, opened as an event of this one (its value comes back).
    _c("gpIpcEventImport", 0, "u64 event, o_u64 opened", symbol="-"),
    _c("gpSetContext", 0, "ctx ctx", A, symbol="-"),
    _c("gpParamLayout", 0, "func func, o_u32 count, o_buf:count layout", symbol="-"),
    # -- initialisation and devices -----------------------------------------------------------------
    _c("cuInit", 2000, "u32 flags"),
    _c("cuDriverGetVersion", 2020, "o_i32 version", memo="constant"),
    _c("cuDeviceGet", 2000, "o_i32 device, i32 ordinal", memo="constant"),
    _c("cuDeviceGetCount", 2000, "o_i32 count", memo="constant"),
    _c("cuDeviceGetName", 2000, "o_buf:length name, i32 length, i32 dev"),
    _c("cuDeviceGetUuid", 9020, "o_b16 uuid, i32 dev"),
    _c("cuDeviceGetUuid", 11040, "o_b16 uuid, i32 dev", symbol="cuDeviceGetUuid_v2"),
    _c("cuDeviceGetPCIBusId", 4010, "o_buf:length bus_id, i32 length, i32 dev"),
    _c("cuDeviceTotalMem", 3020, "o_u64 bytes, i32 dev", symbol="cuDeviceTotalMem_v2", memo="constant"),
    _c("cuDeviceGetAttribute", 2000, "o_i32 value, i32 attrib, i32 dev", memo="constant"),
    _c("cuDeviceComputeCapability", 2000, "o_i32 major, o_i32 minor, i32 dev", memo="constant"),
    _c("cuDeviceCanAccessPeer", 4000, "o_i32 can_access, i32 dev, i32 peer_dev"),
    _c("cuDeviceGetProperties", 2000, "ptr prop, i32 dev", L, custom=True,
       how="CUdevprop's fourteen ints are device attributes 1 to 14, asked as cuDeviceGetAttribute (kept answers)"),
    _c("cuDeviceGetByPCIBusId", 4010, "o_i32 dev, cstr bus_id", L, custom=True,
       how="the lease's device whose cuDeviceGetPCIBusId names the same bus, device and function"),
    _c("cuDeviceGetTexture1DLinearMaxWidth", 11010, "o_u64 width, i32 format, u32 channels, i32 dev", memo="constant"),
    _c("cuDeviceGetP2PAttribute", 8000, "o_i32 value, i32 attrib, i32 src, i32 dst", memo="constant"),
    # Which atomic operations one of the lease's GPUs can make on another's memory: the operations go in the
    # request's bulk, a capability mask per operation comes back in the reply's.
    _c("cuDeviceGetP2PAtomicCapabilities", 13000, "ptr capabilities, ptr operations, u32 count, i32 src, i32 dst",
       custom=True, wire="u32 count, i32 src, i32 dst, bytes operations"),
    _c("cuDeviceGetMemPool", 11020, "o_pool pool, i32 dev"),
    _c("cuDeviceGetDefaultMemPool", 11020, "o_pool pool, i32 dev"),
    # -- contexts: primary contexts on the worker, the per-thread current context in the client -------
    _c("cuDevicePrimaryCtxRetain", 7000, "o_ctx ctx, i32 dev", custom=True, invalidates=PRIMARY),
    _c("cuDevicePrimaryCtxRelease", 7000, "i32 dev", invalidates=PRIMARY),
    _c("cuDevicePrimaryCtxRelease", 11000, "i32 dev", symbol="cuDevicePrimaryCtxRelease_v2", invalidates=PRIMARY),
    _c("cuDevicePrimaryCtxGetState", 7000, "i32 dev, o_u32 flags, o_i32 active", memo="primary_ctx"),
    _c("cuDevicePrimaryCtxSetFlags", 7000, "i32 dev, u32 flags", invalidates=PRIMARY),
    _c("cuDevicePrimaryCtxSetFlags", 11000, "i32 dev, u32 flags", symbol="cuDevicePrimaryCtxSetFlags_v2",
       invalidates=PRIMARY),
    _c("cuDevicePrimaryCtxReset", 7000, "i32 dev", invalidates=RESET),
    _c("cuDevicePrimaryCtxReset", 11000, "i32 dev", symbol="cuDevicePrimaryCtxReset_v2", invalidates=RESET),
    # Contexts a program creates live on the worker; the context stack stays in the client.
    _c("cuCtxCreate", 3020, "o_ctx ctx, u32 flags, i32 dev", custom=True, symbol="cuCtxCreate_v2"),
    _c("cuCtxCreate", 11040, "o_ctx ctx, ptr affinity, i32 n, u32 flags, i32 dev", L, custom=True,
       symbol="cuCtxCreate_v3", how="sent as cuCtxCreate_v2 (execution affinity is refused)"),
    _c("cuCtxCreate", 12050, "o_ctx ctx, ptr params, u32 flags, i32 dev", L, custom=True,
       symbol="cuCtxCreate_v4",
       how="sent as cuCtxCreate_v2 (execution affinity and CIG parameters are refused)"),
    _c("cuCtxDestroy", 4000, "ctx ctx", custom=True, symbol="cuCtxDestroy_v2", invalidates=RECORDS),
    _c("cuCtxGetCurrent", 4000, "o_ctx ctx", L, custom=True,
       how="the context stack is kept per client thread"),
    _c("cuCtxSetCurrent", 4000, "ctx ctx", L, custom=True, how="the context stack is kept per client thread"),
    _c("cuCtxPushCurrent", 4000, "ctx ctx", L, symbol="cuCtxPushCurrent_v2", custom=True,
       how="the context stack is kept per client thread"),
    _c("cuCtxPopCurrent", 4000, "o_ctx? ctx", L, symbol="cuCtxPopCurrent_v2", custom=True,
       how="the context stack is kept per client thread"),
    _c("cuCtxGetDevice", 2000, "o_i32 device", L, custom=True,
       how="from the current context, kept per client thread"),
    _c("cuCtxGetDevice", 13000, "o_i32 device, ctx ctx", L, symbol="cuCtxGetDevice_v2", custom=True,
       how="from the context, kept per client thread"),
    _c("cuCtxSynchronize", 2000, "", sync=True),
    _c("cuCtxSynchronize", 13000, "ctx ctx", symbol="cuCtxSynchronize_v2", sync=True),
    _c("cuCtxGetApiVersion", 3020, "ctx ctx, o_u32 version"),
    _c("cuCtxGetFlags", 7000, "o_u32 flags"),
    _c("cuCtxGetLimit", 3010, "o_u64 value, i32 limit", memo="limits", memo_ctx=True),
    _c("cuCtxSetLimit", 3010, "i32 limit, u64 value", invalidates=("limits",)),
    _c("cuCtxGetStreamPriorityRange", 5050, "o_i32? least, o_i32? greatest", memo="constant"),
    _c("cuCtxGetId", 12000, "ctx ctx, o_u64 id"),
    _c("cuCtxSetFlags", 12010, "u32 flags"),
    _c("cuCtxEnablePeerAccess", 4000, "ctx peer, u32 flags"),  # between the lease's own devices
    _c("cuCtxDisablePeerAccess", 4000, "ctx peer"),
    _c("cuCtxResetPersistingL2Cache", 11000, ""),
    _c("cuCtxRecordEvent", 12050, "ctx ctx, event event", A, invalidates=RECORDS),
    _c("cuCtxWaitEvent", 12050, "ctx ctx, event event", A),
    # The current context's preferred L1/shared split and (deprecated) shared memory bank size.
    _c("cuCtxGetCacheConfig", 3020, "o_i32 config"),
    _c("cuCtxSetCacheConfig", 3020, "i32 config"),
    _c("cuCtxGetSharedMemConfig", 4020, "o_i32 config"),
    _c("cuCtxSetSharedMemConfig", 4020, "i32 config"),
    # -- green contexts: partitions of the lease's share of a device's SMs (the worker's _guard_green) ---
    # A CUdevResource crosses as the id of the worker's (in its padding) and its SM fields; a device's or
    # context's is the lease's share of the SMs, splits and green contexts stay within it.
    _c("cuDeviceGetDevResource", 12040, "i32 dev, ptr resource, i32 type", custom=True,
       wire="o_devres resource, o_u32 sm_count, o_u32 min_partition, o_u32 alignment, i32 dev, i32 type"),
    _c("cuCtxGetDevResource", 12040, "ctx ctx, ptr resource, i32 type", custom=True,
       wire="o_devres resource, o_u32 sm_count, o_u32 min_partition, o_u32 alignment, ctx ctx, i32 type"),
    _c("cuGreenCtxGetDevResource", 12040, "greenctx green, ptr resource, i32 type", custom=True,
       wire="o_devres resource, o_u32 sm_count, o_u32 min_partition, o_u32 alignment, greenctx green, i32 type"),
    # A stream's: its green context's where it was made in one, else its context's (the lease's share).
    _c("cuStreamGetDevResource", 13010, "stream stream, ptr resource, i32 type", custom=True,
       wire="o_devres resource, o_u32 sm_count, o_u32 min_partition, o_u32 alignment, stream stream, i32 type"),
    # The groups come back in the reply's bulk: (id, smCount, minSmPartitionSize, smCoscheduledAlignment) each.
    _c("cuDevSmResourceSplitByCount", 12040,
       "ptr result, ptr nb_groups, ptr input, ptr remaining, u32 flags, u32 min_count", custom=True,
       wire="o_u32 groups, o_devres remaining, o_u32 sm_count, o_u32 min_partition, o_u32 alignment, "
            "devres input, u32 nb_groups, u32 flags, u32 min_count, u32 count_only"),
    # CUDA 13.1's structured split: CU_DEV_SM_RESOURCE_GROUP_PARAMS (64 bytes each) in the bulk, and back
    # (the driver fills in discovered SM counts), followed by the groups when `result` is asked for.
    _c("cuDevSmResourceSplit", 13010, "ptr result, u32 nb_groups, ptr input, ptr remainder, u32 flags, ptr params",
       custom=True, wire="o_devres remaining, o_u32 sm_count, o_u32 min_partition, o_u32 alignment, devres input, "
                         "u32 nb_groups, u32 flags, u32 want_groups, bytes params"),
    _c("cuDevResourceGenerateDesc", 12040, "ptr desc, ptr resources, u32 count", custom=True,
       wire="o_resdesc desc, u32 count, bytes resources"),
    _c("cuGreenCtxCreate", 12040, "o_greenctx green, resdesc desc, i32 dev, u32 flags"),
    _c("cuGreenCtxDestroy", 12040, "greenctx green"),
    _c("cuCtxFromGreenCtx", 12040, "ptr ctx, greenctx green", custom=True, wire="o_ctx ctx, o_i32 dev, greenctx green"),
    _c("cuGreenCtxRecordEvent", 12040, "greenctx green, event event", invalidates=RECORDS),
    _c("cuGreenCtxWaitEvent", 12040, "greenctx green, event event"),
    _c("cuStreamGetGreenCtx", 12040, "stream stream, o_greenctx green"),
    _c("cuGreenCtxStreamCreate", 12050, "o_stream stream, greenctx green, u32 flags, i32 priority"),
    _c("cuGreenCtxGetId", 12090, "greenctx green, o_u64 id"),
    # Execution affinity is not offered (answered 0 by the worker; cuCtxCreate_v3's is refused): green
    # contexts are how a program takes part of the lease's SMs.
    _c("cuDeviceGetExecAffinitySupport", 11040, "o_i32 supported, i32 type, i32 dev"),
    # A context's affinity is the SMs it runs on: the lease's share, or its green context's.
    _c("cuCtxGetExecAffinity", 11040, "ptr affinity, i32 type", custom=True, wire="o_u32 sm_count, i32 type"),
    # -- device memory: allocations are reserved in the client's address space ------------------------
    _c("cuMemGetInfo", 3020, "o_u64 free, o_u64 total", symbol="cuMemGetInfo_v2"),
    _c("cuMemAlloc", 3020, "o_dptr dptr, u64 bytesize", symbol="cuMemAlloc_v2", custom=True),
    _c("cuMemFree", 3020, "dptr dptr", symbol="cuMemFree_v2", custom=True),
    _c("cuMemAllocPitch", 3020, "o_dptr dptr, o_u64 pitch, u64 width, u64 height, u32 element_size", L,
       symbol="cuMemAllocPitch_v2", custom=True,
       how="sent as cuMemAlloc of the rows, each padded to the device's texture pitch alignment"),
    _c("cuMemGetAddressRange", 3020, "o_dptr? base, o_u64? size, dptr dptr", symbol="cuMemGetAddressRange_v2"),
    # Managed memory: a device allocation mirrored by host pages at the same address (shim_managed.c).
    # Where managed memory is (CUDA 13.4): the mirror's chunks, the host's where it touched them since the
    # last device work (shim_managed.c); the worker's driver holds only an ordinary allocation of it.
    _c("cuMemGetLocationInfo", 13041, "dptr ptr, u64 size, u64 summary, u64 sampling, ptr location_out", L,
       custom=True, how="managed memory's regions, each where most of its sampled chunks are: the host where the "
       "program touched them since the last device work, else the device"),
    _c("cuMemAllocManaged", 6000, "o_dptr dptr, u64 bytesize, u32 flags", L, custom=True,
       how="a device allocation of the lease mirrored by host pages at its address"),
    # Prefetch and advice: hints; a prefetch to a device sends what the host wrote (CUmemLocation by value).
    _c("cuMemPrefetchAsync", 8000, "dptr dptr, u64 count, i32 device, stream stream", L, custom=True,
       how="to a device: sends what the host wrote; to the host: the next touch fetches"),
    _c("cuMemPrefetchAsync", 12020, "dptr dptr, u64 count, u64 location, u32 flags, stream stream", L,
       symbol="cuMemPrefetchAsync_v2", custom=True,
       how="to a device: sends what the host wrote; to the host: the next touch fetches"),
    _c("cuMemAdvise", 8000, "dptr dptr, u64 count, i32 advice, i32 device", L, custom=True,
       how="a hint: checked (managed memory only) and kept for cuMemRangeGetAttribute"),
    _c("cuMemAdvise", 12020, "dptr dptr, u64 count, i32 advice, u64 location", L, symbol="cuMemAdvise_v2",
       custom=True, how="a hint: checked (managed memory only) and kept for cuMemRangeGetAttribute"),
    _c("cuMemAllocAsync", 11020, "o_dptr dptr, u64 bytesize, stream stream", custom=True),
    _c("cuMemAllocFromPoolAsync", 11020, "o_dptr dptr, u64 bytesize, pool pool, stream stream", custom=True),
    _c("cuMemFreeAsync", 11020, "dptr dptr, stream stream", A, custom=True),
    _c("cuMemPoolSetAttribute", 11020, "pool pool, i32 attr, ptr value", custom=True,
       wire="pool pool, i32 attr, u64 value"),
    _c("cuMemPoolGetAttribute", 11020, "pool pool, i32 attr, ptr value", custom=True,
       wire="pool pool, i32 attr, o_u64 value"),
    # Pools of page-locked host memory and of managed memory are answered in the client (shim_pools.c);
    # the device's own kind of pool is the worker's.
    _c("cuMemPoolTrimTo", 11020, "pool pool, u64 min_bytes_to_keep", custom=True),
    _c("cuMemPoolCreate", 11020, "o_pool pool, ptr props", custom=True, wire="o_pool pool, bytes props"),
    _c("cuMemPoolDestroy", 11020, "pool pool", custom=True),
    _c("cuMemGetMemPool", 13000, "o_pool pool, ptr location, i32 type", L, custom=True,
       how="host and managed pools are the client's (shim_pools.c); a device's pool is its cuDeviceGetMemPool on the worker"),
    _c("cuMemGetDefaultMemPool", 13000, "o_pool pool, ptr location, i32 type", L, custom=True,
       how="host and managed pools are the client's (shim_pools.c); a device's pool is its cuDeviceGetMemPool on the worker"),
    _c("cuMemSetMemPool", 13000, "ptr location, i32 type, pool pool", L, custom=True,
       how="host and managed pools are the client's (shim_pools.c); a device's is set by its cuDeviceSetMemPool on the worker"),
    _c("cuMemPoolSetAccess", 11020, "pool pool, ptr map, u64 count", L, custom=True,
       how="every device of the lease may read and write a pool's memory: answered in the client"),
    _c("cuMemPoolGetAccess", 11020, "ptr flags, pool pool, ptr location", L, custom=True,
       how="every device of the lease may read and write a pool's memory: answered in the client"),
    # Pools and their allocations shared between processes of one lease: an exported pool is a file
    # descriptor naming the lease's pool, an exported pointer 64 bytes naming the allocation.
    _c("cuMemPoolExportToShareableHandle", 11020, "ptr handle, pool pool, i32 type, u64 flags", L, custom=True,
       how="a memfd naming the lease's pool (POSIX descriptors only)"),
    _c("cuMemPoolImportFromShareableHandle", 11020, "o_pool pool, ptr handle, i32 type, u64 flags", L,
       custom=True, how="a descriptor of the same lease, checked by the worker"),
    _c("cuMemPoolExportPointer", 11020, "ptr data, dptr ptr", L, custom=True,
       how="64 bytes naming the allocation"),
    _c("cuMemPoolImportPointer", 11020, "o_dptr ptr, pool pool, ptr data", L, custom=True,
       how="opened as an IPC handle, checked by the worker"),
    # -- the virtual memory API: address ranges come from the process's window, memory is created, mapped
    # and released on the worker (PyTorch's expandable segments); the worker checks every range and handle.
    _c("cuMemAddressReserve", 10020, "o_dptr ptr, u64 size, u64 alignment, u64 addr, u64 flags", custom=True),
    _c("cuMemAddressFree", 10020, "dptr ptr, u64 size", custom=True),
    _c("cuMemCreate", 10020, "o_vmem handle, u64 size, ptr prop, u64 flags", custom=True,
       wire="o_vmem handle, u64 size, u64 flags, bytes prop"),
    _c("cuMemRelease", 10020, "vmem handle"),
    _c("cuMemMap", 10020, "dptr ptr, u64 size, u64 offset, vmem handle, u64 flags"),
    _c("cuMemUnmap", 10020, "dptr ptr, u64 size"),
    _c("cuMemSetAccess", 10020, "dptr ptr, u64 size, ptr desc, u64 count", custom=True,
       wire="dptr ptr, u64 size, u64 count, bytes desc"),
    # The handle of memory mapped at an address (NCCL frees through it): this process's mappings only.
    _c("cuMemRetainAllocationHandle", 11000, "o_vmem handle, dptr addr"),
    _c("cuMemGetAllocationPropertiesFromHandle", 10020, "ptr prop, vmem handle", custom=True,
       wire="vmem handle"),  # the CUmemAllocationProp it was created with, in the reply's bulk
    # Memory shared between the processes of one lease, as NCCL's cuMem transport shares its buffers: the
    # exported descriptor is a memfd naming the worker's handle; importing it in another process of the same
    # lease gives that process a reference of its own (the worker checks the handle was exported in the lease).
    _c("cuMemExportToShareableHandle", 10020, "ptr shareable, vmem handle, i32 type, u64 flags", custom=True,
       wire="vmem handle, i32 type"),
    _c("cuMemImportFromShareableHandle", 10020, "o_vmem handle, ptr os_handle, i32 type", custom=True,
       wire="o_vmem handle, u64 exported"),
    _c("cuMemGetAccess", 10020, "o_u64 flags, ptr location, dptr ptr", custom=True,
       wire="o_u64 flags, i32 location_type, i32 location_id, dptr ptr"),
    _c("cuMemGetAllocationGranularity", 10020, "o_u64 granularity, ptr prop, i32 option", custom=True,
       wire="o_u64 granularity, i32 option, bytes prop"),
    # Multicast objects (NVLink SHARP) over the lease's own GPUs: a handle of the virtual memory API (mapped,
    # given access and released as created memory is), bound to memory of the lease only; never shared with
    # another process (handle types none). The properties (CUmulticastObjectProp) travel in the bulk.
    _c("cuMulticastCreate", 12010, "o_vmem handle, ptr prop", custom=True, wire="o_vmem handle, bytes prop"),
    _c("cuMulticastAddDevice", 12010, "vmem mc, i32 dev"),
    _c("cuMulticastBindMem", 12010, "vmem mc, u64 mc_offset, vmem memory, u64 mem_offset, u64 size, u64 flags"),
    _c("cuMulticastBindAddr", 12010, "vmem mc, u64 mc_offset, u64 ptr, u64 size, u64 flags"),
    _c("cuMulticastUnbind", 12010, "vmem mc, i32 dev, u64 mc_offset, u64 size"),
    # CUDA 13.1's binds name the device whose memory is bound: that of the memory (or address) itself, so
    # the worker binds it as the older calls do (a CUDA 13.0 driver has only those).
    _c("cuMulticastBindMem", 13010, "vmem mc, i32 dev, u64 mc_offset, vmem memory, u64 mem_offset, u64 size, u64 flags",
       symbol="cuMulticastBindMem_v2"),
    _c("cuMulticastBindAddr", 13010, "vmem mc, i32 dev, u64 mc_offset, u64 ptr, u64 size, u64 flags",
       symbol="cuMulticastBindAddr_v2"),
    # The NVLink fabric the lease's GPUs are in (CUDA 13.4): its cluster's UUID, and the cliques (groups of
    # GPUs that reach each other over it) a device is part of, CUcliqueInfo (type, id) each in the bulk.
    _c("cuDeviceGetFabricClusterUuid", 13041, "o_b16 uuid, i32 dev"),
    _c("cuDeviceGetCliqueCount", 13041, "o_u64 count, i32 dev"),
    _c("cuDeviceGetCliqueInfo", 13041, "ptr info, ptr count, i32 dev", custom=True,
       wire="i32 dev, u64 capacity, o_u64 count"),
    # Logical endpoints (CUDA 13.3) over the lease's own GPUs: ids a process reserves, endpoints it creates
    # on them (CUlogicalEndpointProp, 24 bytes, in the bulk), bound only to the lease's memory
    # (virtualize.server._guard_endpoints); none exported or imported.
    _c("cuLogicalEndpointIdReserve", 13030, "o_u32 base, u32 count"),
    _c("cuLogicalEndpointIdRelease", 13030, "u32 base, u32 count"),
    _c("cuLogicalEndpointCreate", 13030, "u32 id, ptr prop", custom=True, wire="u32 id, bytes prop"),
    _c("cuLogicalEndpointAddDevice", 13030, "u32 id, i32 dev"),
    _c("cuLogicalEndpointDestroy", 13030, "u32 id"),
    _c("cuLogicalEndpointBindAddr", 13030, "u32 id, i32 dev, u64 offset, u64 ptr, u64 size, u64 flags"),
    _c("cuLogicalEndpointBindMem", 13030,
       "u32 id, i32 dev, u64 offset, vmem memory, u64 mem_offset, u64 size, u64 flags"),
    _c("cuLogicalEndpointUnbind", 13030, "u32 id, i32 dev, u64 offset, u64 size"),
    _c("cuLogicalEndpointGetLimits", 13030, "o_u64 alignment, o_u64 max_size, ptr prop", custom=True,
       wire="o_u64 alignment, o_u64 max_size, bytes prop"),
    _c("cuLogicalEndpointQuery", 13030, "u32 id, u32 count, o_i32 status"),
    # Copies over the NVLink fabric (CUDA 13.5) between the lease's memory and the process's endpoints:
    # CUDA_FABRIC_COPY_BATCH_OP (64 bytes each) in the bulk, every operand checked before any runs.
    _c("cuFabricCpyBatchAsync", 13050, "u64 count, ptr ops, u64 flags, stream stream", custom=True,
       wire="u64 count, u64 flags, stream stream, bytes ops"),
    _c("cuMulticastGetGranularity", 12010, "o_u64 granularity, ptr prop, i32 option", custom=True,
       wire="o_u64 granularity, i32 option, bytes prop"),
    # -- host memory stays in the client --------------------------------------------------------------
    _c("cuMemAllocHost", 3020, "o_u64 pp, u64 bytesize", L, symbol="cuMemAllocHost_v2", custom=True,
       how="host memory stays in the client"),
    _c("cuMemHostAlloc", 2020, "o_u64 pp, u64 bytesize, u32 flags", L, custom=True,
       how="host memory stays in the client"),
    _c("cuMemFreeHost", 2000, "ptr p", L, custom=True, how="host memory stays in the client"),
    # IPC between the processes of one lease: they share the lease's worker, so a handle names the
    # allocation itself, and the worker checks on open that it is this lease's memory.
    _c("cuIpcGetMemHandle", 4010, "ptr handle, dptr dptr", L, custom=True,
       how="64 bytes naming the allocation (processes of one lease share its worker)"),
    _c("cuIpcOpenMemHandle", 4010, "o_dptr pdptr, ipc handle, u32 flags", L, custom=True,
       how="the worker checks that the handle names this lease's live memory"),
    _c("cuIpcOpenMemHandle", 11000, "o_dptr pdptr, ipc handle, u32 flags", L, symbol="cuIpcOpenMemHandle_v2",
       custom=True, how="the worker checks that the handle names this lease's live memory"),
    _c("cuIpcCloseMemHandle", 4010, "dptr dptr", L, custom=True,
       how="ends this process's use; the exporter's allocation stays"),
    # An event's handle names the worker's event itself; the importer's cuEventDestroy closes only its own.
    _c("cuIpcGetEventHandle", 4010, "ptr handle, event event", L, custom=True,
       how="64 bytes naming the worker's event"),
    _c("cuIpcOpenEventHandle", 4010, "o_event event, ipc handle", L, custom=True,
       how="the exporter's own event; destroying it closes only this opening"),
    _c("cuMemHostRegister", 6050, "ptr p, u64 bytesize, u32 flags", L, symbol="cuMemHostRegister_v2", custom=True,
       how="host memory stays in the client"),
    _c("cuMemHostUnregister", 4000, "ptr p", L, custom=True, how="host memory stays in the client"),
    _c("cuMemHostGetFlags", 2030, "o_u32 flags, ptr p", L, custom=True,
       how="host memory stays in the client"),
    _c("cuMemHostGetDevicePointer", 3020, "o_u64 pdptr, ptr p, u32 flags", L,
       symbol="cuMemHostGetDevicePointer_v2", custom=True,
       how="the address a mapped allocation shares with the device"),
    # -- copies: bytes to the device travel in the request, bytes from it in the reply ----------------
    _c("cuMemcpyHtoD", 3020, "dptr dst, ptr src, u64 count", A, symbol="cuMemcpyHtoD_v2", custom=True,
       wire="dptr dst, u64 count, stream stream, bytes data"),
    _c("cuMemcpyHtoDAsync", 3020, "dptr dst, ptr src, u64 count, stream stream", A,
       symbol="cuMemcpyHtoDAsync_v2", custom=True, wire="dptr dst, u64 count, stream stream, bytes data"),
    _c("cuMemcpyDtoH", 3020, "ptr dst, dptr src, u64 count", symbol="cuMemcpyDtoH_v2", sync=True,
       custom=True, wire="dptr src, u64 count, stream stream, o_buf:count data"),
    _c("cuMemcpyDtoHAsync", 3020, "ptr dst, dptr src, u64 count, stream stream",
       symbol="cuMemcpyDtoHAsync_v2", sync=True, custom=True,
       wire="dptr src, u64 count, stream stream, o_buf:count data"),
    # An asynchronous copy into page-locked memory returns at once; its bytes come on the callback
    # connection when the stream gets there (virtualize/common/_wire.py COPY_DATA). Flush: the worker sends
    # every such copy done by now (`wait`: every one, waiting for each) before it answers.
    _c("gpMemcpyDtoHAsync", 0, "dptr src, u64 count, stream stream, u64 id", A, symbol="-"),
    _c("gpCopiesFlush", 0, "u32 wait", symbol="-"),
    # Large copies between a process and a worker on the same host go through memory both map (the
    # worker's, page-locked; its file descriptor comes with gpShmAttach's reply): one memcpy on the
    # client and a DMA on the worker instead of two trips through the socket. gpShmHtoD: `count` bytes
    # at `offset` in it to `dst` (flags: 1 the call's last piece, which is answered; 2 an Async copy);
    # gpShmDtoH: `count` bytes of `src` into it from offset 0, answered once per `chunk` as each lands
    # (outs: offset, bytes). See virtualize/client/shim/shim.c (gp_bulk_copy).
    _c("gpShmAttach", 0, "o_u64 size", symbol="-"),
    # The command ring (issue 31, GPUPOOL_SHIM_RING=1): answered with a file descriptor of memory both
    # map, `size` bytes for each direction (virtualize/common/include/gp_ring.h); every later byte of the
    # connection, both ways, goes through it instead of the socket.
    _c("gpRingAttach", 0, "o_u64 size", symbol="-"),
    _c("gpShmHtoD", 0, "dptr dst, u64 count, stream stream, u64 offset, u32 flags", symbol="-"),
    _c("gpShmDtoH", 0, "dptr src, u64 count, stream stream, u32 flags, u32 chunk, o_u64 offset, o_u64 size",
       symbol="-"),
    # Page-locked memory of a process on the worker's host is memory both map (issue 31): gpPinnedShare
    # (the allocation's address in the client and its size) is answered with a file descriptor of new
    # memory the worker has pinned, which the client maps there. gpPinnedCopy: `count` bytes between
    # `device` and the client's `host` address inside such memory on `stream`, by the worker's DMA
    # straight into or out of it (flags: 1 to the device, 2 synchronous, answered once done); an Async
    # one is unanswered and ordered by its stream alone, as natively. gpPinnedSettle: answered once
    # every copy into [host, +count) is in place (before the client reads it outside any stream).
    # gpPinnedDrop: the memory at `base` goes (the worker lets go of it once its copies are done).
    _c("gpPinnedShare", 0, "u64 base, u64 size", symbol="-"),
    _c("gpPinnedCopy", 0, "dptr device, u64 host, u64 count, stream stream, u32 flags", sync=True,
       symbol="-"),  # a synchronous one reports an earlier asynchronous error, as the driver's copies do
    _c("gpPinnedSettle", 0, "u64 host, u64 count", symbol="-"),
    _c("gpPinnedDrop", 0, "u64 base", symbol="-"),
    # Large copies over an encrypted connection, striped across the process's extra connections
    # (virtualize/server/_lanes.py). gpLaneAttach, on a new connection: a lane of the connection whose
    # gpCallbackToken it shows. gpLaneCopy, on the process's connection (flags: 1 to the device, 2 an
    # Async copy, 4 answered once before the pieces are sent, and to the device only then): the copy,
    # checked in order, done when its `pieces` are. gpLanePiece, on a lane: bytes
    # `offset`.. of copy `id` (to the device: its bulk, unanswered; to the host: answered with them).
    _c("gpLaneAttach", 0, "u64 token", symbol="-"),
    _c("gpLaneCopy", 0, "dptr device, u64 count, stream stream, u32 flags, u32 pieces, u64 id", symbol="-"),
    _c("gpLanePiece", 0, "u64 id, u64 offset, u64 count", symbol="-"),
    _c("cuMemcpyDtoD", 3020, "dptr dst, dptr src, u64 count", A, symbol="cuMemcpyDtoD_v2"),
    _c("cuMemcpyDtoDAsync", 3020, "dptr dst, dptr src, u64 count, stream stream", A,
       symbol="cuMemcpyDtoDAsync_v2"),
    _c("cuMemcpy", 4000, "u64 dst, u64 src, u64 count", L, custom=True,
       how="sent as cuMemcpyHtoD, DtoH or DtoD"),
    _c("cuMemcpyAsync", 4000, "u64 dst, u64 src, u64 count, stream stream", L, custom=True,
       how="sent as cuMemcpyHtoDAsync, DtoHAsync or DtoDAsync"),
    # Batched copies (cuda.core's batched memcpy, newer PyTorch): each copy sent as the single copy of its
    # direction (cuMemcpyAsync's), in the batch's order; 3D operands between pointers only.
    # Batched decompression (the copy engines' decompressor): each operation's source, destination and
    # actual-size word checked as memory of the lease; its CUmemDecompressParams (64 bytes) in the bulk.
    _c("cuMemBatchDecompressAsync", 12060, "ptr params, u64 count, u32 flags, ptr error_index, stream stream",
       custom=True, wire="o_u64 error_index, u64 count, u32 flags, stream stream, bytes params"),
    _c("cuMemcpyBatchAsync", 12080, "ptr dsts, ptr srcs, ptr sizes, u64 count, ptr attrs, ptr attrs_idxs, "
       "u64 num_attrs, ptr fail_idx, stream stream", L, custom=True,
       how="each copy sent as the single copy of its direction"),
    _c("cuMemcpyBatchAsync", 13000, "ptr dsts, ptr srcs, ptr sizes, u64 count, ptr attrs, ptr attrs_idxs, "
       "u64 num_attrs, stream stream", L, symbol="cuMemcpyBatchAsync_v2", custom=True,
       how="each copy sent as the single copy of its direction"),
    _c("cuMemcpy3DBatchAsync", 12080, "u64 num_ops, ptr ops, ptr fail_idx, u64 flags, stream stream", L,
       custom=True, how="each copy sent as the single copy of its direction"),
    _c("cuMemcpy3DBatchAsync", 13000, "u64 num_ops, ptr ops, u64 flags, stream stream", L,
       symbol="cuMemcpy3DBatchAsync_v2", custom=True,
       how="each copy sent as the single copy of its direction"),
    _c("cuMemcpyPeer", 4000, "dptr dst, ctx dst_ctx, dptr src, ctx src_ctx, u64 count", A),
    _c("cuMemcpyPeerAsync", 4000, "dptr dst, ctx dst_ctx, dptr src, ctx src_ctx, u64 count, stream stream", A),
    # -- CUDA arrays, textures and surfaces: objects of the worker's driver, handles of the lease ---------
    # An array's descriptor travels as its C struct; the worker counts its bytes against the partition.
    _c("cuArrayCreate", 3020, "o_array handle, ptr desc", symbol="cuArrayCreate_v2", custom=True,
       wire="o_array handle, bytes desc"),
    _c("cuArray3DCreate", 3020, "o_array handle, ptr desc", symbol="cuArray3DCreate_v2", custom=True,
       wire="o_array handle, bytes desc"),
    _c("cuArrayDestroy", 2000, "array handle"),
    _c("cuArrayGetDescriptor", 3020, "ptr desc, array handle", symbol="cuArrayGetDescriptor_v2", custom=True,
       wire="array handle"),  # the descriptor comes back in the reply's bulk
    _c("cuArray3DGetDescriptor", 3020, "ptr desc, array handle", symbol="cuArray3DGetDescriptor_v2", custom=True,
       wire="array handle"),
    _c("cuMipmappedArrayCreate", 5000, "o_mipmap handle, ptr desc, u32 levels", custom=True,
       wire="o_mipmap handle, u32 levels, bytes desc"),
    _c("cuMipmappedArrayGetLevel", 5000, "o_array array, mipmap handle, u32 level"),
    _c("cuMipmappedArrayDestroy", 5000, "mipmap handle"),
    # The rest of arrays: an NV12 array's planes (arrays of the lease, gone with their array), sparse
    # arrays' properties and arrays' memory requirements (their C structures in the reply's bulk), and
    # tiles of sparse or deferred-mapping arrays mapped to memory the lease created (cuMemMapArrayAsync:
    # its CUarrayMapInfo list in the bulk, each array, memory handle and device checked).
    _c("cuArrayGetPlane", 11020, "o_array plane, array array, u32 index"),
    _c("cuArrayGetSparseProperties", 11010, "ptr props, array array", custom=True, wire="array array"),
    _c("cuMipmappedArrayGetSparseProperties", 11010, "ptr props, mipmap mipmap", custom=True, wire="mipmap mipmap"),
    _c("cuArrayGetMemoryRequirements", 11060, "ptr reqs, array array, i32 dev", custom=True,
       wire="array array, i32 dev"),
    _c("cuMipmappedArrayGetMemoryRequirements", 11060, "ptr reqs, mipmap mipmap, i32 dev", custom=True,
       wire="mipmap mipmap, i32 dev"),
    _c("cuMemMapArrayAsync", 11010, "ptr infos, u32 count, stream stream", custom=True,
       wire="u32 count, stream stream, bytes infos"),
    # Copies between any two of host memory, device memory and arrays, in rows and slices: the host side
    # travels packed (its rows one after another) in the request or the reply; `kinds` is the source's
    # CUmemorytype (1 host, 2 device, 3 array) plus the destination's times 256; flags 1: on `stream`.
    _c("gpMemcpy3D", 0, "u32 kinds, u64 src, u64 src_x, u64 src_y, u64 src_z, u64 src_pitch, u64 src_height, "
       "u64 dst, u64 dst_x, u64 dst_y, u64 dst_z, u64 dst_pitch, u64 dst_height, u64 width, u64 height, u64 depth, "
       "stream stream, u32 flags", symbol="-", sync=True),
    *(_c(name, 3020, params, L, symbol=f"{name}_v2", custom=True, how="sent as gpMemcpy3D, the host side packed")
      for name, params in (
          ("cuMemcpy2D", "ptr copy"),
          ("cuMemcpy2DUnaligned", "ptr copy"),
          ("cuMemcpy2DAsync", "ptr copy, stream stream"),
          ("cuMemcpy3D", "ptr copy"),
          ("cuMemcpy3DAsync", "ptr copy, stream stream"),
          ("cuMemcpyHtoA", "array dst, u64 offset, ptr src, u64 count"),
          ("cuMemcpyAtoH", "ptr dst, array src, u64 offset, u64 count"),
          ("cuMemcpyDtoA", "array dst, u64 offset, dptr src, u64 count"),
          ("cuMemcpyAtoD", "dptr dst, array src, u64 offset, u64 count"),
          ("cuMemcpyAtoA", "array dst, u64 dst_offset, array src, u64 src_offset, u64 count"),
          ("cuMemcpyHtoAAsync", "array dst, u64 offset, ptr src, u64 count, stream stream"),
          ("cuMemcpyAtoHAsync", "ptr dst, array src, u64 offset, u64 count, stream stream"),
      )),
    # Texture and surface objects: made by the worker's driver from the descriptors' C structs, whose
    # array or memory the worker checks is the lease's; the object is a value kernels take.
    _c("cuTexObjectCreate", 5000, "o_texobj tex, ptr res, ptr tex_desc, ptr view", custom=True,
       wire="o_texobj tex, bytes descs"),
    _c("cuTexObjectDestroy", 5000, "texobj tex"),
    _c("cuSurfObjectCreate", 5000, "o_surfobj surf, ptr res", custom=True, wire="o_surfobj surf, bytes desc"),
    _c("cuSurfObjectDestroy", 5000, "surfobj surf"),
    # Their descriptors read back (each in the reply's bulk, as the worker's driver gives it).
    _c("cuTexObjectGetResourceDesc", 5000, "ptr desc, texobj tex", custom=True, wire="texobj tex"),
    _c("cuTexObjectGetTextureDesc", 5000, "ptr desc, texobj tex", custom=True, wire="texobj tex"),
    _c("cuTexObjectGetResourceViewDesc", 5000, "ptr desc, texobj tex", custom=True, wire="texobj tex"),
    _c("cuSurfObjectGetResourceDesc", 5000, "ptr desc, surfobj surf", custom=True, wire="surfobj surf"),
    # Legacy texture and surface references (deprecated since CUDA 11; a module's, or cuTexRefCreate's): the
    # worker's driver's objects, handles of the lease (a module's go with it). What one binds is checked as
    # a texture object's resource is: an array or mipmapped array of the lease, or a range of its memory
    # (cuTexRefSetAddress's bytes, cuTexRefSetAddress2D's rows: the descriptor's fields travel).
    _c("cuModuleGetTexRef", 2000, "o_texref tex, module module, cstr name"),
    _c("cuModuleGetSurfRef", 3000, "o_surfref surf, module module, cstr name"),
    _c("cuTexRefCreate", 2000, "o_texref tex"),
    _c("cuTexRefDestroy", 2000, "texref tex"),
    _c("cuTexRefSetArray", 2000, "texref tex, array array, u32 flags"),
    _c("cuTexRefSetMipmappedArray", 5000, "texref tex, mipmap mipmap, u32 flags"),
    _c("cuTexRefSetAddress", 3020, "o_u64 offset, texref tex, dptr ptr, u64 bytes", symbol="cuTexRefSetAddress_v2"),
    _c("cuTexRefSetAddress2D", 4010, "texref tex, ptr desc, dptr ptr, u64 pitch", symbol="cuTexRefSetAddress2D_v3",
       custom=True, wire="texref tex, dptr ptr, u64 pitch, u64 width, u64 height, i32 format, u32 channels"),
    _c("cuTexRefSetFormat", 2000, "texref tex, i32 format, i32 components"),
    _c("cuTexRefSetAddressMode", 2000, "texref tex, i32 dim, i32 mode"),
    _c("cuTexRefSetFilterMode", 2000, "texref tex, i32 mode"),
    _c("cuTexRefSetMipmapFilterMode", 5000, "texref tex, i32 mode"),
    _c("cuTexRefSetMipmapLevelBias", 5000, "texref tex, f32 bias"),
    _c("cuTexRefSetMipmapLevelClamp", 5000, "texref tex, f32 min_clamp, f32 max_clamp"),
    _c("cuTexRefSetMaxAnisotropy", 5000, "texref tex, u32 max_aniso"),
    _c("cuTexRefSetBorderColor", 8000, "texref tex, ptr color", custom=True,
       wire="texref tex, f32 red, f32 green, f32 blue, f32 alpha"),
    _c("cuTexRefSetFlags", 2000, "texref tex, u32 flags"),
    _c("cuTexRefGetAddress", 3020, "o_u64 ptr, texref tex", symbol="cuTexRefGetAddress_v2"),
    _c("cuTexRefGetArray", 2000, "o_array array, texref tex"),
    _c("cuTexRefGetMipmappedArray", 5000, "o_mipmap mipmap, texref tex"),
    _c("cuTexRefGetAddressMode", 2000, "o_i32 mode, texref tex, i32 dim"),
    _c("cuTexRefGetFilterMode", 2000, "o_i32 mode, texref tex"),
    _c("cuTexRefGetFormat", 2000, "o_i32 format, o_i32 channels, texref tex"),
    _c("cuTexRefGetMipmapFilterMode", 5000, "o_i32 mode, texref tex"),
    _c("cuTexRefGetMipmapLevelBias", 5000, "o_f32 bias, texref tex"),
    _c("cuTexRefGetMipmapLevelClamp", 5000, "o_f32 min_clamp, o_f32 max_clamp, texref tex"),
    _c("cuTexRefGetMaxAnisotropy", 5000, "o_i32 max_aniso, texref tex"),
    _c("cuTexRefGetBorderColor", 8000, "ptr color, texref tex", custom=True,
       wire="o_f32 red, o_f32 green, o_f32 blue, o_f32 alpha, texref tex"),
    _c("cuTexRefGetFlags", 2000, "o_u32 flags, texref tex"),
    _c("cuSurfRefSetArray", 3000, "surfref surf, array array, u32 flags"),
    _c("cuSurfRefGetArray", 3000, "o_array array, surfref surf"),
    # Binds a texture reference to a function's legacy launches (CU_PARAM_TR_DEFAULT): the driver's answer.
    _c("cuParamSetTexRef", 2000, "func func, i32 texunit, texref tex"),
    # -- memsets -------------------------------------------------------------------------------------
    _c("cuMemsetD8", 3020, "dptr dst, u8 value, u64 count", A, symbol="cuMemsetD8_v2"),
    _c("cuMemsetD16", 3020, "dptr dst, u16 value, u64 count", A, symbol="cuMemsetD16_v2"),
    _c("cuMemsetD32", 3020, "dptr dst, u32 value, u64 count", A, symbol="cuMemsetD32_v2"),
    _c("cuMemsetD8Async", 3020, "dptr dst, u8 value, u64 count, stream stream", A),
    _c("cuMemsetD16Async", 3020, "dptr dst, u16 value, u64 count, stream stream", A),
    _c("cuMemsetD32Async", 3020, "dptr dst, u32 value, u64 count, stream stream", A),
    *(_c(name + suffix, 3020, f"dptr dst, u64 pitch, {value} value, u64 width, u64 height{stream}", L,
         symbol=name + symbol, custom=True,
         how="sent as one cuMemsetD8/16/32 per row (one for the whole when the rows touch)")
      for name, value in (("cuMemsetD2D8", "u8"), ("cuMemsetD2D16", "u16"), ("cuMemsetD2D32", "u32"))
      for suffix, symbol, stream in (("", "_v2", ""), ("Async", "Async", ", stream stream"))),
    # -- pointer attributes: host pointers answered locally, device pointers by the worker ------------
    _c("cuPointerGetAttribute", 4000, "ptr data, i32 attr, u64 ptr", custom=True,
       wire="i32 attr, dptr ptr, o_u64 value"),
    _c("cuPointerGetAttributes", 7000, "u32 count, ptr attrs, ptr data, u64 ptr", L, custom=True,
       how="sent as cuPointerGetAttribute, one attribute at a time"),
    # -- issue 25's memory calls (one block: device and memory settings, managed-memory hints, copies) --
    # The only settable attribute (SYNC_MEMOPS) of a device pointer the worker checks is the lease's.
    _c("cuPointerSetAttribute", 6000, "ptr value, i32 attr, u64 ptr", custom=True,
       wire="i32 attr, dptr ptr, u32 value"),
    # A device's current pool is a pool of the lease (one worker process per lease: no other lease's).
    _c("cuDeviceSetMemPool", 11020, "i32 dev, pool pool"),
    _c("cuDeviceGetHostAtomicCapabilities", 13000, "ptr capabilities, ptr operations, u32 count, i32 dev", L,
       custom=True, how="no operation is native: the program's host memory reaches the GPU through a mirror"),
    _c("cuFlushGPUDirectRDMAWrites", 11030, "i32 target, i32 scope"),
    # CUDA_MEMCPY3D_PEER is CUDA_MEMCPY3D with the contexts where its reserved words are: with unified
    # addressing the addresses name their devices, so the copy is sent as cuMemcpy3D's.
    _c("cuMemcpy3DPeer", 4000, "ptr copy", L, custom=True, how="sent as gpMemcpy3D, the host side packed"),
    _c("cuMemcpy3DPeerAsync", 4000, "ptr copy, stream stream", L, custom=True,
       how="sent as gpMemcpy3D, the host side packed"),
    _c("cuStreamAttachMemAsync", 6000, "stream stream, dptr dptr, u64 length, u32 flags", L, custom=True,
       how="a hint: checked (managed memory of the lease, a valid flag) and accepted, as cuMemAdvise"),
    *(_c("cuStreamBatchMemOp", since, "stream stream, u32 count, ptr ops, u32 flags", L, symbol=symbol,
         custom=True, how="each wait or write sent as its cuStreamWaitValue/cuStreamWriteValue, in order")
      for since, symbol in ((8000, "cuStreamBatchMemOp"), (11070, "cuStreamBatchMemOp_v2"))),
    # What the program advised about managed memory and where it prefetched it, kept in the client per page.
    _c("cuMemRangeGetAttribute", 8000, "ptr data, u64 size, i32 attribute, dptr ptr, u64 count", L, custom=True,
       how="the advice and prefetches the client kept, per page"),
    _c("cuMemRangeGetAttributes", 8000, "ptr data, ptr sizes, ptr attributes, u64 n, dptr ptr, u64 count", L,
       custom=True, how="the advice and prefetches the client kept, per page"),
    _c("cuMemcpyWithAttributesAsync", 13000, "dptr dst, dptr src, u64 size, ptr attr, stream stream", L,
       custom=True, how="the attributes checked as a batch's; sent as cuMemcpyAsync"),
    _c("cuMemcpy3DWithAttributesAsync", 13000, "ptr op, u64 flags, stream stream", L, custom=True,
       how="sent as cuMemcpy3DBatchAsync's one copy"),
    _c("cuMemPrefetchBatchAsync", 13000, "ptr dptrs, ptr sizes, u64 count, ptr locations, ptr location_idxs, "
       "u64 num_locations, u64 flags, stream stream", L, custom=True,
       how="each range sent as cuMemPrefetchAsync to its location"),
    _c("cuMemDiscardBatchAsync", 13000, "ptr dptrs, ptr sizes, u64 count, u64 flags, stream stream", L,
       custom=True, how="a hint: each range checked (managed memory) and its contents kept"),
    _c("cuMemDiscardAndPrefetchBatchAsync", 13000, "ptr dptrs, ptr sizes, u64 count, ptr locations, "
       "ptr location_idxs, u64 num_locations, u64 flags, stream stream", L, custom=True,
       how="each range sent as cuMemPrefetchAsync to its location (its contents kept)"),
    # -- modules and libraries: the image travels once, functions and globals are handles ------------
    _c("cuModuleLoadData", 2000, "o_module module, ptr image", custom=True, wire="o_module module, bytes image"),
    _c("cuModuleLoadDataEx", 2010, "o_module module, ptr image, u32 n, ptr options, ptr values", custom=True,
       wire="o_module module, bytes image"),
    _c("cuModuleLoadFatBinary", 2000, "o_module module, ptr image", custom=True,
       wire="o_module module, bytes image"),
    _c("cuModuleUnload", 2000, "module module", custom=True, forgets="functions"),
    _c("cuModuleGetLoadingMode", 11070, "o_i32 mode", memo="constant"),
    _c("cuModuleLoad", 2000, "o_module module, cstr fname", L, custom=True,
       how="the file is read in the client and sent as cuModuleLoadData"),
    _c("cuModuleGetFunction", 2000, "o_func func, module module, cstr name", links=True),
    _c("cuModuleGetGlobal", 3020, "o_dptr? dptr, o_u64? bytes, module module, cstr name",
       symbol="cuModuleGetGlobal_v2", custom=True),
    # -- the driver's linker: it runs on the worker; the linked image comes back to the client -------
    # (JIT options, such as log buffers, are not forwarded, as for cuModuleLoadDataEx)
    _c("cuLinkCreate", 6050, "u32 n, ptr options, ptr values, o_link state", custom=True, symbol="cuLinkCreate_v2",
       wire="o_link state"),
    _c("cuLinkAddData", 6050, "link state, i32 type, ptr data, u64 size, cstr name, u32 n, ptr options, ptr values",
       custom=True, symbol="cuLinkAddData_v2", wire="link state, i32 type, bytes data"),
    _c("cuLinkAddFile", 6050, "link state, i32 type, cstr path, u32 n, ptr options, ptr values", L, custom=True,
       symbol="cuLinkAddFile_v2", how="the file is read in the client and sent as cuLinkAddData"),
    _c("cuLinkComplete", 5050, "link state, ptr cubin_out, ptr size_out", custom=True, wire="link state, o_u64 size"),
    # A window of device addresses for this client process's allocations (virtualize/server/_address_window.py):
    # offered by the worker, reserved by the client in its own address space, then accepted.
    _c("gpWindowOffer", 0, "o_u64 base, o_u64 size", symbol="-"),
    _c("gpWindowAccept", 0, "u64 base", symbol="-"),
    # Host functions (cuLaunchHostFunc, cuStreamAddCallback) run in the client: a second connection
    # of the process, attached to the first by a token, on which the worker calls back.
    _c("gpCallbackToken", 0, "o_u64 token", symbol="-"),
    _c("gpCallbackAttach", 0, "u64 token", symbol="-"),
    # More connections of the process, attached to its callback connection's owner by the same token after
    # that one: the worker sends pieces of large copies into page-locked memory on them and the callback
    # connection at once (_wire.COPY_PIECE), over TLS a connection's cipher being one CPU's
    # (virtualize/server/_deliveries.py).
    _c("gpDeliveryAttach", 0, "u64 token", symbol="-"),
    _c("gpLinkImage", 0, "link state, u64 size, o_buf:size image", symbol="-"),  # the image cuLinkComplete made
    _c("cuLinkDestroy", 5050, "link state", custom=True),
    _c("cuLibraryLoadData", 12000,
       "o_library library, ptr code, ptr jit_opts, ptr jit_vals, u32 n_jit, ptr lib_opts, ptr lib_vals, u32 n_lib",
       custom=True, wire="o_library library, bytes image"),
    _c("cuLibraryLoadFromFile", 12000,
       "o_library library, cstr fname, ptr jit_opts, ptr jit_vals, u32 n_jit, ptr lib_opts, ptr lib_vals, u32 n_lib", L,
       custom=True, how="the file is read in the client and sent as cuLibraryLoadData"),
    _c("cuLibraryUnload", 12000, "library library", custom=True, forgets="functions"),
    _c("cuLibraryGetKernel", 12000, "o_kernel kernel, library library, cstr name", links=True),
    _c("cuLibraryGetModule", 12000, "o_module module, library library", links=True),
    _c("cuLibraryGetGlobal", 12000, "o_dptr? dptr, o_u64? bytes, library library, cstr name", custom=True),
    # A library's managed variable: the library's memory on the worker, mirrored in the program as managed
    # memory is (its first contents the device's, fetched at the host's first touch).
    _c("cuLibraryGetManaged", 12000, "o_dptr? dptr, o_u64? bytes, library library, cstr name", custom=True),
    _c("cuKernelGetFunction", 12000, "o_func func, kernel kernel", memo="functions", memo_ctx=True, links=True),
    _c("cuKernelGetAttribute", 12000, "o_i32 value, i32 attrib, kernel kernel, i32 dev", memo="functions"),
    _c("cuKernelSetAttribute", 12000, "i32 attrib, i32 value, kernel kernel, i32 dev", memo="functions",
       forgets="functions"),
    # What a module or library holds: the handles come back in the reply's bulk (now the lease's); a
    # name is kept in the client for the handle's life, as the driver keeps it.
    _c("cuModuleGetFunctionCount", 12040, "o_u32 count, module mod"),
    _c("cuModuleEnumerateFunctions", 12040, "ptr functions, u32 num, module mod", custom=True,
       wire="u32 num, module mod"),
    _c("cuLibraryGetKernelCount", 12040, "o_u32 count, library lib"),
    _c("cuLibraryEnumerateKernels", 12040, "ptr kernels, u32 num, library lib", custom=True,
       wire="u32 num, library lib"),
    _c("cuKernelGetLibrary", 12050, "o_library library, kernel kernel"),
    _c("cuKernelGetName", 12030, "ptr name, kernel kernel", custom=True,
       wire="kernel kernel, u32 length, o_buf:length name"),
    _c("cuFuncGetName", 12030, "ptr name, func func", custom=True, wire="func func, u32 length, o_buf:length name"),
    _c("cuFuncIsLoaded", 12040, "o_i32 state, func func"),
    _c("cuFuncLoad", 12040, "func func"),
    _c("cuKernelGetParamCount", 13000, "kernel kernel, o_u64 count", L, custom=True,
       how="the length of the kernel's parameter layout (asked of the worker once per function)"),
    _c("cuFuncGetParamCount", 13000, "func func, o_u64 count", L, custom=True,
       how="the length of the function's parameter layout (asked of the worker once per function)"),
    _c("cuKernelGetParamInfo", 12040, "kernel kernel, u64 index, o_u64? offset, o_u64? size"),
    _c("cuFuncGetParamInfo", 12040, "func func, u64 index, o_u64? offset, o_u64? size"),
    _c("cuFuncGetAttribute", 2020, "o_i32 value, i32 attrib, func func", memo="functions"),
    _c("cuFuncSetAttribute", 9000, "func func, i32 attrib, i32 value", memo="functions", forgets="functions"),
    _c("cuFuncSetCacheConfig", 3000, "func func, i32 config", forgets="functions"),
    _c("cuFuncSetSharedMemConfig", 4020, "func func, i32 config", forgets="functions"),
    _c("cuKernelSetCacheConfig", 12000, "kernel kernel, i32 config, i32 dev", forgets="functions"),
    _c("cuFuncGetModule", 11000, "o_module module, func func"),
    _c("cuOccupancyMaxActiveBlocksPerMultiprocessor", 6050,
       "o_i32 num_blocks, func func, i32 block_size, u64 dynamic_smem", memo="functions"),
    _c("cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", 7000,
       "o_i32 num_blocks, func func, i32 block_size, u64 dynamic_smem, u32 flags", memo="functions"),
    _c("cuOccupancyMaxPotentialBlockSize", 6050,
       "o_i32 min_grid_size, o_i32 block_size, func func, u64 smem_callback, u64 dynamic_smem, i32 block_size_limit"),
    _c("cuOccupancyMaxPotentialBlockSizeWithFlags", 7000,
       "o_i32 min_grid_size, o_i32 block_size, func func, u64 smem_callback, u64 dynamic_smem, i32 block_size_limit, "
       "u32 flags"),
    _c("cuOccupancyMaxActiveClusters", 11070, "o_i32 count, func func, ptr config", custom=True,
       wire="func f, u32 gx, u32 gy, u32 gz, u32 bx, u32 by, u32 bz, u32 smem, stream stream, u32 n_attrs, "
            "o_i32 count, bytes attrs"),
    _c("cuOccupancyMaxPotentialClusterSize", 11070, "o_i32 size, func func, ptr config", custom=True,
       wire="func f, u32 gx, u32 gy, u32 gz, u32 bx, u32 by, u32 bz, u32 smem, stream stream, u32 n_attrs, "
            "o_i32 size, bytes attrs"),
    _c("cuOccupancyAvailableDynamicSMemPerBlock", 10020,
       "o_u64 dynamic_smem, func func, i32 num_blocks, i32 block_size", memo="functions"),
    # -- launches: parameters packed at the offsets the worker reported once per function -------------
    _c("cuLaunchKernel", 4000,
       "func f, u32 gx, u32 gy, u32 gz, u32 bx, u32 by, u32 bz, u32 smem, stream stream, ptr params, ptr extra",
       L, custom=True, how="sent as cuLaunchKernelEx"),
    _c("cuLaunchKernelEx", 11060, "ptr config, func f, ptr params, ptr extra", A, custom=True,
       wire="func f, u32 gx, u32 gy, u32 gz, u32 bx, u32 by, u32 bz, u32 smem, stream stream, u32 n_attrs, "
            "bytes params"),
    _c("cuLaunchCooperativeKernel", 9000,
       "func f, u32 gx, u32 gy, u32 gz, u32 bx, u32 by, u32 bz, u32 smem, stream stream, ptr params", L,
       custom=True, how="sent as cuLaunchKernelEx with the cooperative launch attribute"),
    # A multi-device cooperative launch (deprecated): each device's launch checked and packed in the client as
    # cuLaunchCooperativeKernel's (MULTI_LAUNCH: function, shape, shared memory, parameter bytes, stream; then
    # the parameters), all sent as one call, since its kernels may synchronise across the lease's devices.
    _c("cuLaunchCooperativeKernelMultiDevice", 9000, "ptr launches, u32 count, u32 flags", custom=True,
       wire="u32 count, u32 flags, bytes launches"),
    # -- legacy launches and context attach (deprecated since CUDA 4.0), served in the client (shim_legacy.c):
    # block shape, shared size and parameter bytes kept per function, launched as cuLaunchKernel's `extra`.
    *(_c(name, 2000, params, L, custom=True, how="kept per function in the client for cuLaunch and cuLaunchGrid")
      for name, params in (("cuFuncSetBlockShape", "func f, i32 x, i32 y, i32 z"),
                           ("cuFuncSetSharedSize", "func f, u32 bytes"),
                           ("cuParamSetSize", "func f, u32 numbytes"),
                           ("cuParamSeti", "func f, i32 offset, u32 value"),
                           ("cuParamSetf", "func f, i32 offset, f32 value"),
                           ("cuParamSetv", "func f, i32 offset, ptr p, u32 numbytes"))),
    *(_c(name, 2000, params, L, custom=True,
         how="sent as cuLaunchKernel: the call's grid, the block shape, shared size and parameter bytes kept "
             "for the function, the parameters as its `extra` buffer")
      for name, params in (("cuLaunch", "func f"),
                           ("cuLaunchGrid", "func f, i32 grid_width, i32 grid_height"),
                           ("cuLaunchGridAsync", "func f, i32 grid_width, i32 grid_height, stream stream"))),
    _c("cuCtxAttach", 2000, "o_ctx ctx, u32 flags", L, custom=True,
       how="a usage count on the current context, kept in the client"),
    _c("cuCtxDetach", 2000, "ctx ctx", L, custom=True,
       how="takes back an attach; the context's last use sends cuCtxDestroy"),
    # -- streams and events ---------------------------------------------------------------------------
    _c("cuStreamCreate", 2000, "o_stream stream, u32 flags"),
    _c("cuStreamCreateWithPriority", 5050, "o_stream stream, u32 flags, i32 priority"),
    _c("cuStreamDestroy", 4000, "stream stream", A, symbol="cuStreamDestroy_v2", invalidates=("capture",)),
    _c("cuStreamQuery", 2000, "stream stream", sync=True),
    _c("cuStreamSynchronize", 2000, "stream stream", sync=True),
    _c("cuStreamWaitEvent", 3020, "stream stream, event event, u32 flags", A),
    _c("cuLaunchHostFunc", 10000, "stream stream, ptr fn, ptr data", A, custom=True, wire="stream stream, u64 id"),
    # CUDA 13.2's: the synchronisation mode says how the driver waits for the stream (blocking or spinning),
    # which is the worker's business; the function runs in the program as cuLaunchHostFunc's does.
    _c("cuLaunchHostFunc", 13020, "stream stream, ptr fn, ptr data, u32 sync_mode", L, symbol="cuLaunchHostFunc_v2",
       custom=True, how="sent as cuLaunchHostFunc (a blocking or spinning wait is the worker's driver's)"),
    _c("cuStreamAddCallback", 5000, "stream stream, ptr callback, ptr data, u32 flags", A, custom=True,
       wire="stream stream, u64 id"),
    # Tensor maps (Hopper's TMA descriptors): encoded by the worker's driver; 128 opaque bytes come back.
    # The worker checks that the whole tensor (its dimensions and strides from its address) is lease memory.
    _c("cuTensorMapEncodeTiled", 12000, "ptr map, i32 dtype, u32 rank, ptr address, ptr dims, ptr strides, "
       "ptr box, ptr element_strides, i32 interleave, i32 swizzle, i32 l2, i32 oob", custom=True,
       wire="i32 dtype, u32 rank, dptr address, i32 interleave, i32 swizzle, i32 l2, i32 oob, bytes shape"),
    _c("cuTensorMapEncodeIm2col", 12000, "ptr map, i32 dtype, u32 rank, ptr address, ptr dims, ptr strides, "
       "ptr lower, ptr upper, u32 channels, u32 pixels, ptr element_strides, i32 interleave, i32 swizzle, "
       "i32 l2, i32 oob", custom=True,
       wire="i32 dtype, u32 rank, dptr address, u32 channels, u32 pixels, i32 interleave, i32 swizzle, i32 l2, "
            "i32 oob, bytes shape"),
    _c("cuTensorMapEncodeIm2colWide", 12080, "ptr map, i32 dtype, u32 rank, ptr address, ptr dims, ptr strides, "
       "i32 lower, i32 upper, u32 channels, u32 pixels, ptr element_strides, i32 interleave, i32 mode, i32 swizzle, "
       "i32 l2, i32 oob", custom=True,
       wire="i32 dtype, u32 rank, dptr address, i32 lower, i32 upper, u32 channels, u32 pixels, i32 interleave, "
            "i32 mode, i32 swizzle, i32 l2, i32 oob, bytes shape"),
    _c("cuTensorMapReplaceAddress", 12000, "ptr map, ptr address", custom=True, wire="dptr address, bytes map"),
    # A map's TMA allocation class (CUDA 13.5), set on a map this lease encoded: the map back in the reply's
    # bulk, the class in effect as the out (virtualize.server._guard_tensor_maps says what is refused).
    _c("cuTensorMapSetAllocationClass", 13050, "ptr map, i32 alloc_class, ptr effective", custom=True,
       wire="i32 alloc_class, o_i32 effective, bytes map"),
    # Stream memory operations: a 32- or 64-bit word of the lease's memory waited on or written in order
    # (not of mirrored host memory, which the program would see only at a synchronisation: shim_streams.c).
    *(_c(name, since, f"stream stream, dptr addr, {bits} value, u32 flags", A, symbol=name + suffix, custom=True)
      for name, bits, first in (("cuStreamWaitValue32", "u32", 8000), ("cuStreamWaitValue64", "u64", 9000),
                                ("cuStreamWriteValue32", "u32", 8000), ("cuStreamWriteValue64", "u64", 9000))
      for since, suffix in ((first, ""), (11070, "_v2"))),
    # A stream's attributes: the 64-byte value as the client wrote it; an access-policy window must be
    # memory of the lease; attributes that carry other handles or addresses are refused.
    _c("cuStreamGetAttribute", 11000, "stream stream, i32 attr, ptr value", custom=True, wire="stream stream, i32 attr"),
    _c("cuStreamSetAttribute", 11000, "stream stream, i32 attr, ptr value", custom=True,
       wire="stream stream, i32 attr, bytes value"),
    _c("cuStreamCopyAttributes", 11000, "stream dst, stream src"),
    _c("cuStreamIsCapturing", 10000, "stream stream, o_i32 status", memo="capture"),
    _c("cuStreamGetPriority", 5050, "stream stream, o_i32 priority"),
    _c("cuStreamGetFlags", 5050, "stream stream, o_u32 flags"),
    _c("cuStreamGetCtx", 9020, "stream stream, o_ctx ctx"),
    _c("cuStreamGetCtx", 12050, "stream stream, o_ctx? ctx, o_u64? green_ctx", symbol="cuStreamGetCtx_v2"),
    _c("cuStreamGetId", 12000, "stream stream, o_u64 id"),
    _c("cuStreamGetDevice", 12080, "stream stream, o_i32 device"),
    # -- stream capture and graphs: capture happens on the worker, a graph travels as a handle --------
    _c("cuStreamBeginCapture", 10010, "stream stream, i32 mode", symbol="cuStreamBeginCapture_v2",
       invalidates=("capture",), pauses="capture"),
    _c("cuStreamEndCapture", 10000, "stream stream, o_graph graph", invalidates=("capture",), resumes="capture"),
    _c("cuStreamGetCaptureInfo", 11030,
       "stream stream, ptr status, ptr id, ptr graph, ptr deps, ptr num_deps",
       symbol="cuStreamGetCaptureInfo_v2", custom=True,
       wire="stream stream, o_i32 status, o_u64 id, o_graph graph, o_u64 num_deps"),
    _c("cuStreamGetCaptureInfo", 12030,
       "stream stream, ptr status, ptr id, ptr graph, ptr deps, ptr edges, ptr num_deps",
       symbol="cuStreamGetCaptureInfo_v3", custom=True,
       wire="stream stream, o_i32 status, o_u64 id, o_graph graph, o_u64 num_deps"),
    # Capture into a graph the program made (a conditional node's body), and the capture's dependencies
    # replaced by nodes the program added to the capturing graph itself (cuda.core's conditionals).
    _c("cuStreamBeginCaptureToGraph", 12030, "stream stream, graph graph, ptr deps, ptr edges, u64 num_deps, i32 mode",
       custom=True, wire="stream stream, graph graph, u64 num_deps, i32 mode, bytes deps",
       invalidates=("capture",), pauses="capture"),
    # Capture again into a graph of the lease (CUDA 13.3): the same nodes in the same order, each node whose
    # parameters differ asked about by the program's callback, which runs in the program over the callback
    # connection (`id`: the shim's number for the callback and its data, 0 for none) while the call waits.
    _c("cuStreamBeginRecaptureToGraph", 13030, "stream stream, i32 mode, graph graph, ptr callback, ptr data",
       custom=True, wire="stream stream, i32 mode, graph graph, u64 id", invalidates=("capture",), pauses="capture"),
    _c("cuStreamUpdateCaptureDependencies", 11030, "stream stream, ptr deps, u64 num_deps, u32 flags", custom=True,
       wire="stream stream, u64 num_deps, u32 flags, bytes deps"),
    _c("cuStreamUpdateCaptureDependencies", 12030, "stream stream, ptr deps, ptr edges, u64 num_deps, u32 flags",
       custom=True, symbol="cuStreamUpdateCaptureDependencies_v2",
       wire="stream stream, u64 num_deps, u32 flags, bytes deps"),
    _c("cuThreadExchangeStreamCaptureMode", 10010, "ptr mode", custom=True, wire="i32 mode, o_i32 previous"),
    # A graph's nodes and edges: their handles follow the count in the reply's bulk (now the lease's).
    _c("cuGraphGetNodes", 10000, "graph graph, ptr nodes, ptr count", custom=True, wire="graph graph, o_u64 count"),
    _c("cuGraphGetEdges", 10000, "graph graph, ptr from, ptr to, ptr count", custom=True,
       wire="graph graph, o_u64 count"),
    _c("cuGraphGetEdges", 12030, "graph graph, ptr from, ptr to, ptr edge_data, ptr count", custom=True,
       symbol="cuGraphGetEdges_v2", wire="graph graph, o_u64 count"),
    # Graphs built node by node: the nodes live on the worker; a kernel node's parameters are packed by
    # the shim as a launch's are; the dependency arrays travel after them in the bulk.
    _c("cuGraphCreate", 10000, "o_graph graph, u32 flags"),
    _c("cuGraphAddKernelNode", 12000, "o_node node, graph graph, ptr deps, u64 num_deps, ptr params", custom=True,
       symbol="cuGraphAddKernelNode_v2",
       wire="o_node node, graph graph, func func, u32 gx, u32 gy, u32 gz, u32 bx, u32 by, u32 bz, u32 smem, "
            "u64 num_deps, bytes data"),
    _c("cuGraphAddMemsetNode", 10000, "o_node node, graph graph, ptr deps, u64 num_deps, ptr params, ctx ctx",
       custom=True, wire="o_node node, graph graph, dptr dst, u64 pitch, u32 value, u32 element_size, u64 width, "
                         "u64 height, u64 num_deps, bytes deps"),
    _c("cuGraphAddEmptyNode", 10000, "o_node node, graph graph, ptr deps, u64 num_deps", custom=True,
       wire="o_node node, graph graph, u64 num_deps, bytes deps"),
    _c("cuGraphAddDependencies", 10000, "graph graph, ptr from, ptr to, u64 count", custom=True,
       wire="graph graph, u64 count, bytes edges"),
    _c("cuGraphAddDependencies", 12030, "graph graph, ptr from, ptr to, ptr edge_data, u64 count", custom=True,
       symbol="cuGraphAddDependencies_v2", wire="graph graph, u64 count, bytes edges"),
    _c("cuGraphExecKernelNodeSetParams", 12000, "graphexec exec, node node, ptr params", custom=True,
       symbol="cuGraphExecKernelNodeSetParams_v2",
       wire="graphexec exec, node node, func func, u32 gx, u32 gy, u32 gz, u32 bx, u32 by, u32 bz, u32 smem, "
            "bytes data"),
    _c("cuGraphDestroyNode", 10000, "node node"),
    # An instantiated graph's copy, memset and child-graph nodes set anew, and nodes switched off and on
    # (XLA's command buffers update their graphs so): checked as adding such a node is.
    _c("cuGraphExecMemsetNodeSetParams", 10020, "graphexec exec, node node, ptr params, ctx ctx", custom=True,
       wire="graphexec exec, node node, dptr dst, u64 pitch, u32 value, u32 element_size, u64 width, "
            "u64 height"),
    _c("cuGraphExecMemcpyNodeSetParams", 10020, "graphexec exec, node node, ptr params, ctx ctx", custom=True,
       wire="graphexec exec, node node, u64 src, u64 src_pitch, u64 src_height, u64 dst, u64 dst_pitch, "
            "u64 dst_height, u64 width, u64 height, u64 depth"),
    _c("cuGraphExecChildGraphNodeSetParams", 11010, "graphexec exec, node node, graph child"),
    _c("cuGraphNodeSetEnabled", 11060, "graphexec exec, node node, u32 enabled"),
    _c("cuGraphNodeGetEnabled", 11060, "graphexec exec, node node, o_u32 enabled"),
    _c("cuGraphExecEventRecordNodeSetEvent", 11010, "graphexec exec, node node, event event"),
    _c("cuGraphExecEventWaitNodeSetEvent", 11010, "graphexec exec, node node, event event"),
    _c("cuGraphEventRecordNodeGetEvent", 11010, "node node, o_event event"),
    _c("cuGraphEventRecordNodeSetEvent", 11010, "node node, event event"),
    _c("cuGraphEventWaitNodeGetEvent", 11010, "node node, o_event event"),
    _c("cuGraphEventWaitNodeSetEvent", 11010, "node node, event event"),
    _c("cuGraphExecGetFlags", 12000, "graphexec exec, o_u64 flags"),
    # A graph's root nodes and a node's neighbours: handles in the reply's bulk as cuGraphGetNodes', then
    # (the _v2 calls) each edge's 8 bytes of data.
    _c("cuGraphGetRootNodes", 10000, "graph graph, ptr nodes, ptr count", custom=True,
       wire="graph graph, o_u64 count"),
    _c("cuGraphNodeGetDependencies", 10000, "node node, ptr nodes, ptr count", custom=True,
       wire="node node, o_u64 count"),
    _c("cuGraphNodeGetDependencies", 12030, "node node, ptr nodes, ptr edge_data, ptr count", custom=True,
       symbol="cuGraphNodeGetDependencies_v2", wire="node node, o_u64 count"),
    _c("cuGraphNodeGetDependentNodes", 10000, "node node, ptr nodes, ptr count", custom=True,
       wire="node node, o_u64 count"),
    _c("cuGraphNodeGetDependentNodes", 12030, "node node, ptr nodes, ptr edge_data, ptr count", custom=True,
       symbol="cuGraphNodeGetDependentNodes_v2", wire="node node, o_u64 count"),
    # Conditional nodes: the condition's handle lives on the worker; the body graphs come back as
    # graph handles the program fills (node by node, or by capturing into them).
    _c("cuGraphConditionalHandleCreate", 12030, "o_u64 handle, graph graph, ctx ctx, u32 default_value, u32 flags"),
    _c("gpGraphAddConditionalNode", 0, "o_node node, graph graph, u64 handle, u32 kind, u32 size, ctx ctx, "
       "u64 num_deps, bytes deps", symbol="-"),  # the body graphs follow in the reply's bulk
    _c("cuGraphAddChildGraphNode", 10000, "o_node node, graph graph, ptr deps, u64 num_deps, graph child",
       custom=True, wire="o_node node, graph graph, graph child, u64 num_deps, bytes deps"),
    _c("cuGraphChildGraphNodeGetGraph", 10000, "node node, o_graph graph"),  # the node's own copy
    _c("cuGraphAddEventRecordNode", 11010, "o_node node, graph graph, ptr deps, u64 num_deps, event event",
       custom=True, wire="o_node node, graph graph, event event, u64 num_deps, bytes deps"),
    _c("cuGraphAddEventWaitNode", 11010, "o_node node, graph graph, ptr deps, u64 num_deps, event event",
       custom=True, wire="o_node node, graph graph, event event, u64 num_deps, bytes deps"),
    # A host node's function runs in the program at every launch, as a captured host function does.
    _c("cuGraphAddHostNode", 10000, "o_node node, graph graph, ptr deps, u64 num_deps, ptr params",
       custom=True, wire="o_node node, graph graph, u64 id, u64 num_deps, bytes deps"),
    # A copy node between memory of the lease (a mirror's host pointer is its device memory); the shim
    # sends each side's first byte and pitches, from CUDA_MEMCPY3D.
    _c("cuGraphAddMemcpyNode", 10000, "o_node node, graph graph, ptr deps, u64 num_deps, ptr params, ctx ctx",
       custom=True, wire="o_node node, graph graph, u64 src, u64 src_pitch, u64 src_height, u64 dst, "
                         "u64 dst_pitch, u64 dst_height, u64 width, u64 height, u64 depth, u64 num_deps, bytes deps"),
    _c("cuGraphClone", 10000, "o_graph clone, graph graph"),
    _c("cuGraphNodeFindInClone", 10000, "o_node node, node original, graph clone"),
    _c("cuGraphNodeGetType", 10000, "node node, o_i32 type"),
    # Memory nodes: the driver picks an allocation node's address when the node is added (outside the
    # process's window, as a captured stream-ordered allocation's); the shim reserves it in the program,
    # the lease counts its bytes against the device's partition until a free node or cuMemFree frees it.
    # The pool properties travel as their fields, the access descriptors (location type, id, flags) and the
    # dependencies in the bulk; a node's parameters come back the same way.
    _c("cuGraphAddMemAllocNode", 11040, "o_node node, graph graph, ptr deps, u64 num_deps, ptr params", custom=True,
       wire="o_node node, o_dptr dptr, graph graph, i32 alloc_type, i32 handle_types, i32 location_type, "
            "i32 device, u64 bytesize, u32 num_access, u64 num_deps, bytes data"),
    _c("cuGraphMemAllocNodeGetParams", 11040, "node node, ptr params", custom=True,
       wire="node node, o_i32 device, o_u64 bytesize, o_dptr dptr, o_u32 num_access"),
    _c("cuGraphAddMemFreeNode", 11040, "o_node node, graph graph, ptr deps, u64 num_deps, dptr dptr", custom=True,
       wire="o_node node, graph graph, dptr dptr, u64 num_deps, bytes deps"),
    _c("cuGraphMemFreeNodeGetParams", 11040, "node node, o_u64 dptr"),
    # Batch memory-operation nodes: each wait or write checked as a stream memory operation's (its whole word
    # the lease's memory); the operations (CUstreamBatchMemOpParams, 48 bytes each) travel in the bulk, after
    # a new node's dependencies; a node's context is the current one (the shim refuses another).
    _c("cuGraphAddBatchMemOpNode", 11070, "o_node node, graph graph, ptr deps, u64 num_deps, ptr params",
       custom=True, wire="o_node node, graph graph, u32 count, u32 flags, u64 num_deps, bytes data"),
    _c("cuGraphBatchMemOpNodeSetParams", 11070, "node node, ptr params", custom=True,
       wire="node node, u32 count, u32 flags, bytes ops"),
    _c("cuGraphExecBatchMemOpNodeSetParams", 11070, "graphexec exec, node node, ptr params", custom=True,
       wire="graphexec exec, node node, u32 count, u32 flags, bytes ops"),
    _c("cuGraphBatchMemOpNodeGetParams", 11070, "node node, ptr params", custom=True,
       wire="node node, o_u32 count, o_u32 flags"),  # the operations in the reply's bulk
    # The worker's graph memory is its lease's alone (a worker serves one lease).
    _c("cuDeviceGraphMemTrim", 11040, "i32 dev"),
    _c("cuDeviceGetGraphMemAttribute", 11040, "i32 dev, i32 attr, o_u64 value"),
    _c("cuDeviceSetGraphMemAttribute", 11040, "i32 dev, i32 attr, ptr value", custom=True,
       wire="i32 dev, i32 attr, u64 value"),
    # -- graph nodes read back, changed or queried (issue 25) ---------------------------------------------
    # A node's parameters set anew, checked as adding such a node is; a memset node's read back (its
    # address is the lease's, as the program gave it); edges removed as they are added; ids and the
    # containing graph (a graph of the lease: the node's).
    _c("cuGraphKernelNodeSetParams", 12000, "node node, ptr params", custom=True,
       symbol="cuGraphKernelNodeSetParams_v2",
       wire="node node, func func, u32 gx, u32 gy, u32 gz, u32 bx, u32 by, u32 bz, u32 smem, bytes data"),
    _c("cuGraphMemsetNodeSetParams", 10000, "node node, ptr params", custom=True,
       wire="node node, dptr dst, u64 pitch, u32 value, u32 element_size, u64 width, u64 height"),
    _c("cuGraphMemsetNodeGetParams", 10000, "node node, ptr params", custom=True,
       wire="node node, o_u64 dst, o_u64 pitch, o_u32 value, o_u32 element_size, o_u64 width, o_u64 height"),
    _c("cuGraphMemcpyNodeSetParams", 10000, "node node, ptr params", custom=True,
       wire="node node, u64 src, u64 src_pitch, u64 src_height, u64 dst, u64 dst_pitch, u64 dst_height, "
            "u64 width, u64 height, u64 depth"),
    # A kernel node read back: its function (the handle the program gave it), shape and parameters packed
    # at the function's layout in the reply's bulk; the shim keeps them for the node as the driver does.
    _c("cuGraphKernelNodeGetParams", 12000, "node node, ptr params", custom=True,
       symbol="cuGraphKernelNodeGetParams_v2",
       wire="node node, o_u64 func, o_u32 gx, o_u32 gy, o_u32 gz, o_u32 bx, o_u32 by, o_u32 bz, o_u32 smem"),
    # A copy node read back: the device side as the worker runs it; the shim answers the program's own
    # descriptor (its host pointers) where it set one that the worker's answer still matches.
    _c("cuGraphMemcpyNodeGetParams", 10000, "node node, ptr params", custom=True,
       wire="node node, o_u64 src, o_u64 src_pitch, o_u64 src_height, o_u64 dst, o_u64 dst_pitch, "
            "o_u64 dst_height, o_u64 width, o_u64 height, o_u64 depth"),
    _c("cuGraphRemoveDependencies", 10000, "graph graph, ptr from, ptr to, u64 count", custom=True,
       wire="graph graph, u64 count, bytes edges"),
    _c("cuGraphRemoveDependencies", 12030, "graph graph, ptr from, ptr to, ptr edge_data, u64 count", custom=True,
       symbol="cuGraphRemoveDependencies_v2", wire="graph graph, u64 count, bytes edges"),
    # A host node's function and argument stay in the program (kept under an id, as cuGraphAddHostNode's):
    # a new function travels as its id, and a node's is read back as the id its shim maps back.
    _c("cuGraphHostNodeSetParams", 10000, "node node, ptr params", custom=True, wire="node node, u64 id"),
    _c("cuGraphExecHostNodeSetParams", 10020, "graphexec exec, node node, ptr params", custom=True,
       wire="graphexec exec, node node, u64 id"),
    _c("cuGraphHostNodeGetParams", 10000, "node node, ptr params", custom=True, wire="node node, o_u64 id"),
    # The generic setters: by the type their parameters name, one of the typed calls (kernel, memset, copy,
    # host, event, and an instantiated graph's child graph); other types are refused with a message.
    _c("cuGraphNodeSetParams", 12020, "node node, ptr params", L, custom=True,
       how="sent as the setter of its type (kernel, memset, copy, host, event)"),
    # CUDA 13.4's CUgraphNodeParams: read as the older one where the node type's layout is the same or
    # what it added says what the older one meant (shim_graphs.c); a worker's driver without the new ABI is
    # never asked for it.
    _c("cuGraphNodeSetParams", 13041, "node node, ptr params", L, custom=True, symbol="cuGraphNodeSetParams_v2",
       how="CUDA 13.4's node parameters checked against the older ones for the node's type, then sent as the "
       "setter of its type; a host node's sync mode and an event node's context as the older ABI means them, "
       "the new node types refused"),
    _c("cuGraphExecNodeSetParams", 12020, "graphexec exec, node node, ptr params", L, custom=True,
       how="sent as the instantiated graph's setter of its type (kernel, memset, copy, host, event, child graph)"),
    # A kernel node's launch attributes: the 64-byte value as the client wrote it, as a stream's; an
    # access-policy window must be memory of the lease; attributes naming events or handing out a
    # device-side node are refused.
    _c("cuGraphKernelNodeGetAttribute", 11000, "node node, i32 attr, ptr value", custom=True,
       wire="node node, i32 attr"),
    _c("cuGraphKernelNodeSetAttribute", 11000, "node node, i32 attr, ptr value", custom=True,
       wire="node node, i32 attr, bytes value"),
    _c("cuGraphNodeGetParams", 13010, "node node, ptr params", L, custom=True,
       how="answered by the typed getter of the node's type (kernel, memset, copy, host, child graph, event)"),
    _c("cuGraphKernelNodeCopyAttributes", 11000, "node dst, node src"),
    # A graph's DOT description: written by the worker's driver, sent back, and written to the program's
    # path by the shim (the size first; the text in the reply's bulk).
    _c("cuGraphDebugDotPrint", 11030, "graph graph, cstr path, u32 flags", custom=True,
       wire="graph graph, u32 flags, o_u64 size"),
    _c("cuGraphNodeGetContainingGraph", 13010, "node node, o_graph graph"),
    _c("cuGraphNodeGetLocalId", 13010, "node node, o_u32 node_id"),
    _c("cuGraphNodeGetToolsId", 13010, "node node, o_u64 tools_id"),
    _c("cuGraphGetId", 13010, "graph graph, o_u32 graph_id"),
    _c("cuGraphExecGetId", 13010, "graphexec exec, o_u32 graph_id"),
    # User objects (what keeps a host node's function alive) live in the client: a graph's references
    # are kept for the life of the process (shim_graphs.c says why).
    _c("cuUserObjectCreate", 11030, "o_u64 obj, ptr ptr, ptr destroy, u32 refs, u32 flags", L, custom=True,
       how="user objects live in the client (a graph's references last the process)"),
    _c("cuUserObjectRetain", 11030, "u64 obj, u32 count", L, custom=True,
       how="user objects live in the client"),
    _c("cuUserObjectRelease", 11030, "u64 obj, u32 count", L, custom=True,
       how="user objects live in the client"),
    _c("cuGraphRetainUserObject", 11030, "graph graph, u64 obj, u32 count, u32 flags", L, custom=True,
       how="user objects live in the client"),
    _c("cuGraphReleaseUserObject", 11030, "graph graph, u64 obj, u32 count", L, custom=True,
       how="user objects live in the client"),
    # The generic node call: by its type, one of the node calls above (kernel, memset, empty, child
    # graph, conditional); other types are refused with a message.
    _c("cuGraphAddNode", 12020, "o_node node, graph graph, ptr deps, u64 num_deps, ptr params", L, custom=True,
       how="sent as the node call of its type (kernel, memset, empty, child graph, conditional)"),
    _c("cuGraphAddNode", 12030, "o_node node, graph graph, ptr deps, ptr edges, u64 num_deps, ptr params", L,
       symbol="cuGraphAddNode_v2", custom=True,
       how="sent as the node call of its type (kernel, memset, empty, child graph, conditional)"),
    _c("cuGraphAddNode", 13041, "o_node node, graph graph, ptr deps, ptr edges, u64 num_deps, ptr params", L,
       symbol="cuGraphAddNode_v3", custom=True,
       how="CUDA 13.4's node parameters checked against the older ones for the node's type, then sent as the "
       "node call of its type; a host node's sync mode and an event node's context as the older ABI means "
       "them, the new node types (copy batches, fabric copies, external engines) refused"),
    _c("cuGraphExecUpdate", 12000, "graphexec exec, graph graph, ptr info", custom=True,
       symbol="cuGraphExecUpdate_v2", wire="graphexec exec, graph graph, o_u32 result, o_i32 status"),
    _c("cuGraphInstantiateWithFlags", 11040, "o_graphexec graph_exec, graph graph, u64 flags"),
    # CUDA_GRAPH_INSTANTIATE_PARAMS: the flags and the upload stream go as WithFlags and cuGraphUpload.
    _c("cuGraphInstantiateWithParams", 12000, "o_graphexec graph_exec, graph graph, ptr params", L, custom=True,
       how="sent as cuGraphInstantiateWithFlags and cuGraphUpload"),
    _c("cuGraphLaunch", 10000, "graphexec graph_exec, stream stream", A, invalidates=RECORDS),
    _c("cuGraphUpload", 11010, "graphexec graph_exec, stream stream", A),
    _c("cuGraphExecDestroy", 10000, "graphexec graph_exec", A),
    _c("cuGraphDestroy", 10000, "graph graph", A),
    # The program's events are named by the shim (gpEventCreateNamed: `flags` and the value the program
    # got, `name`, which the worker makes an event for in the thread's context and maps to it; unanswered):
    # a framework that makes events as it goes (PyTorch: several a step) never waits for the worker, as
    # natively cuEventCreate waits for nothing. Interprocess events, and a thread with no context, ask.
    _c("cuEventCreate", 2000, "o_event event, u32 flags", custom=True, invalidates=RECORDS),
    # (A name is never given twice, so no kept elapsed time can be about an older event of that value.)
    _c("gpEventCreateNamed", 0, "u32 flags, u64 name", A, symbol="-"),
    _c("cuEventRecord", 2000, "event event, stream stream", A, invalidates=RECORDS),
    _c("cuEventRecordWithFlags", 11010, "event event, stream stream, u32 flags", A, invalidates=RECORDS),
    _c("cuEventQuery", 2000, "event event", sync=True),
    _c("cuEventSynchronize", 2000, "event event", sync=True),
    _c("cuEventDestroy", 4000, "event event", A, symbol="cuEventDestroy_v2", custom=True,
       invalidates=RECORDS),  # IPC-opened: local
    # Kept once both events completed; a miss asks gpEventElapsedMany for the pairs of consecutive
    # records on each stream at once (virtualize/client/shim/shim_streams.c).
    _c("cuEventElapsedTime", 2000, "o_f32 ms, event start, event end", custom=True, memo="elapsed"),
    _c("cuEventElapsedTime", 12080, "o_f32 ms, event start, event end", symbol="cuEventElapsedTime_v2",
       custom=True, memo="elapsed"),
    # Elapsed times of many pairs of events in one round trip (a benchmark harness asks one per pair of
    # records, hundreds after one synchronise): `pairs` holds `count` (start, end) u64 pairs; the reply's
    # bulk one (i32 CUresult, f32 ms) per pair, in order. The shim asks it for the pairs of consecutive
    # records on each stream when a cuEventElapsedTime it has no answer for comes (shim_streams.c).
    _c("gpEventElapsedMany", 0, "u32 count, bytes pairs", symbol="-"),
    # -- driver log callbacks: the driver's messages stay on the worker; a callback is kept, never called
    _c("cuLogsRegisterCallback", 12090, "ptr callback, ptr user_data, o_u64 handle", L, custom=True,
       how="accepted, never called: the driver's messages stay on the worker"),
    _c("cuLogsUnregisterCallback", 12090, "u64 handle", L, custom=True,
       how="accepted: the callback was never called"),
    # Asynchronous notifications: the one kind (CU_ASYNC_NOTIFICATION_TYPE_OVER_BUDGET) is about the worker's
    # process and its device memory budget; the lease's partition is the worker's to enforce.
    _c("cuDeviceRegisterAsyncNotification", 12040, "i32 dev, ptr callback, ptr user_data, o_u64 handle", L,
       custom=True, how="accepted for a device of the lease, never called: an over-budget notification "
       "concerns the worker's process, and allocations past the lease's partition fail instead"),
    _c("cuDeviceUnregisterAsyncNotification", 12040, "i32 dev, u64 handle", L, custom=True,
       how="accepted for a handle registration gave: the callback was never called"),
    # The worker's driver log (the worker process is the lease's alone): read back, an iterator at a time.
    _c("cuLogsCurrent", 12090, "o_u32 iterator, u32 flags"),
    _c("cuLogsDumpToMemory", 12090, "ptr iterator, ptr buffer, ptr size, u32 flags", custom=True,
       wire="u32 from_start, u32 iterator, u64 size, u32 flags, o_u32 next, o_u64 written"),
    _c("cuLogsDumpToFile", 12090, "ptr iterator, cstr path, u32 flags", L, custom=True,
       how="the worker's log read as cuLogsDumpToMemory, written to the file by the client"),
    # -- NCCL, forwarded at its API (virtualize/client/nccl/nccl_forward.c -> virtualize.server._guard_nccl):
    # NCCL itself runs in the worker, on the lease's GPU and streams; its bootstrap and its transports
    # connect worker to worker. Each call's NCCL result comes back as the out `nccl` (the frame's result
    # stays a CUresult: the connection's and the guard's own). A collective is enqueued like a launch:
    # no reply; its error comes back with the next ncclCommGetAsyncError of that communicator.
    _c("gpNcclVersion", 0, "o_i32 nccl, o_i32 version", symbol="-"),
    _c("gpNcclGetUniqueId", 0, "o_i32 nccl, o_u32 size", symbol="-"),  # the id's bytes in the reply's bulk
    # The unique id (128 bytes), then the config (NcclConfig in virtualize.server._guard_nccl) if any.
    _c("gpNcclCommInitRank", 0, "o_i32 nccl, o_comm comm, i32 nranks, i32 rank, u32 has_config, bytes id_config",
       symbol="-"),
    _c("gpNcclCommSplit", 0, "o_i32 nccl, o_comm comm, comm parent, i32 color, i32 key, u32 has_config, bytes config",
       symbol="-"),
    _c("gpNcclCommEnd", 0, "o_i32 nccl, comm comm, u32 how", symbol="-"),  # how: finalize, destroy, abort
    _c("gpNcclCommQuery", 0, "o_i32 nccl, o_i32 async_error, o_i32 count, o_i32 device, o_i32 rank, comm comm",
       symbol="-"),
    _c("gpNcclCollective", 0, "comm comm, stream stream, u64 send, u64 recv, u64 count, i32 datatype, i32 op, "
       "i32 peer, u32 kind", A, symbol="-"),  # peer: the root, or the peer of a send or receive
    _c("gpNcclGroup", 0, "u32 start", A, symbol="-"),
    _c("gpNcclRedOpCreatePreMulSum", 0, "o_i32 nccl, o_i32 op, u64 scalar, i32 datatype, i32 residence, comm comm",
       symbol="-"),  # scalar: its bytes (host-immediate) or its device address
    _c("gpNcclRedOpDestroy", 0, "i32 op, comm comm", A, symbol="-"),
    _c("gpNcclRegister", 0, "o_i32 nccl, o_u64 handle, comm comm, u64 buffer, u64 size", symbol="-"),
    _c("gpNcclDeregister", 0, "o_i32 nccl, comm comm, u64 handle", symbol="-"),
    # -- error strings, answered in the client --------------------------------------------------------
    # -- the profiler: a profiler attached to the worker (nsys, ncu) sees the program's range -----------
    _c("cuProfilerStart", 4000, ""),
    _c("cuProfilerStop", 4000, ""),
    _c("cuGetErrorName", 6000, "i32 error, ptr str", L, custom=True,
       how="the table of results (virtualize/common/_results.py)"),
    _c("cuGetErrorString", 6000, "i32 error, ptr str", L, custom=True,
       how="the table of results (virtualize/common/_results.py)"),
    # The driver's private tables, asked for by the CUDA runtime: answered from virtualize/client/_exports.py.
    _c("cuGetExportTable", 3000, "ptr table, ptr uuid", L, custom=True,
       how="the driver's private tables, from virtualize/client/_exports.py"),
)
# fmt: on

# Names cuGetProcAddress resolves to another call from an ABI version on: (name, since, symbol).
ALIASES: tuple[tuple[str, int, str], ...] = (
    ("cuGraphInstantiate", 12000, "cuGraphInstantiateWithFlags"),  # CUDA 12 gave it WithFlags' signature
)
# The oldest ABIs of forwarded calls, from before the table's oldest version of each, that cuda.h still
# declares (under __CUDA_API_VERSION_INTERNAL) with the very parameters of a forwarded ABI of the name: (the
# old symbol, the oldest such forwarded one). The old symbol, called directly (ctypes, a binary built before CUDA 4.0) or
# asked of cuGetProcAddress at an older version, runs the forwarded ABI: same arguments, the newer ABI's
# meaning. Taken from the header by virtualize.common._census.legacy_same_abis; tests/test_driver_census.py
# keeps the two in step. Old ABIs with other parameters (32-bit device pointers and sizes), and those of
# the 3.1 API's paragraph (cuCtxCreate: a 3.1-API context, which driver 580 no longer creates), stay refused.
LEGACY_ABIS: tuple[tuple[str, str], ...] = (
    ("cuCtxDestroy", "cuCtxDestroy_v2"),
    ("cuCtxPopCurrent", "cuCtxPopCurrent_v2"),
    ("cuCtxPushCurrent", "cuCtxPushCurrent_v2"),
    ("cuEventDestroy", "cuEventDestroy_v2"),
    ("cuLinkAddData", "cuLinkAddData_v2"),
    ("cuLinkAddFile", "cuLinkAddFile_v2"),
    ("cuLinkCreate", "cuLinkCreate_v2"),
    ("cuMemHostRegister", "cuMemHostRegister_v2"),
    ("cuStreamDestroy", "cuStreamDestroy_v2"),
)
# Old ABIs of LEGACY_ABIS whose driver answers differ from the newer ABI's in one state, measured on driver
# 580 (tests/gpu/remote/prog_legacy.py): the shim's own function of that name (shim_calls.c) answers it. Old symbol -> why.
LEGACY_OWN_ANSWERS: dict[str, str] = {
    "cuCtxPushCurrent": "the pre-4.0 context model: pushing the context already current to the calling thread "
    "is CUDA_ERROR_INVALID_CONTEXT",
}
# Newer ABIs of forwarded calls that are not forwarded themselves: (name, since, cuda.h's versioned
# symbol). cuGetProcAddress asked for the name at that version or later hands out a refusal (the symbol's,
# with its census reason), never the older ABI, whose parameters differ (cuda.bindings asks for these
# versions to call the newer ABIs). The versions are the ones cuda.bindings asks for.
UNFORWARDED_ABIS: tuple[tuple[str, int, str], ...] = ()

CALL_IDS: dict[Call, int] = {call: index for index, call in enumerate(CALLS)}
# What the shim and the worker say in their hello: the protocol's generation and a digest of this
# table (call ids are positions in it), so a shim and a worker built from different tables refuse
# each other instead of running one call as another.
# 3: gpLaneCopy's flag 4 (answered before its pieces go), which a worker of generation 2 would not answer.
PROTOCOL_GENERATION = 3
WIRE_VERSION = (PROTOCOL_GENERATION << 24) | (
    zlib.crc32(repr([(c.name, c.mode.value, c.wire_params) for c in CALLS]).encode()) & 0xFFFFFF
)
BY_SYMBOL: dict[str, Call] = {call.symbol: call for call in CALLS if call.symbol != "-"}
INTERNAL: dict[str, Call] = {call.name: call for call in CALLS if call.symbol == "-"}

# The NCCL calls gpNcclCollective carries, by `kind` (its position here; the client's C reads
# GP_NCCL_<name> from the generated header): each NCCL function's name without its "nccl".
NCCL_COLLECTIVES = (
    "AllReduce", "Broadcast", "Reduce", "AllGather", "ReduceScatter", "Send", "Recv", "AlltoAll", "Gather",
    "Scatter",
)  # fmt: skip
# The int fields of NCCL's ncclConfig_t after its header, in the order gpNcclCommInitRank and
# gpNcclCommSplit carry them (a field the client's NCCL lacks crosses as NCCL_CONFIG_UNDEF_INT), then its
# two names, NUL-terminated (virtualize.server._nccl.NcclConfig is the struct they fill).
NCCL_CONFIG_INTS = (
    "blocking", "cgaClusterSize", "minCTAs", "maxCTAs", "splitShare", "trafficClass", "collnetEnable",
    "CTAPolicy", "shrinkShare", "nvlsCTAs", "nChannelsPerNetPeer", "nvlinkCentricSched", "graphUsageMode",
    "numRmaCtx", "maxP2pPeers", "graphStreamOrdering",
)  # fmt: skip
NCCL_CONFIG_STRINGS = ("netName", "commName")

# Bytes behind each CUpointer_attribute (cuda.h), for cuPointerGetAttribute(s).
POINTER_ATTRIBUTE_SIZES: dict[int, int] = {
    1: 8,  # CONTEXT
    2: 4,  # MEMORY_TYPE
    3: 8,  # DEVICE_POINTER
    4: 8,  # HOST_POINTER
    6: 4,  # SYNC_MEMOPS
    7: 8,  # BUFFER_ID
    8: 4,  # IS_MANAGED
    9: 4,  # DEVICE_ORDINAL
    10: 4,  # IS_LEGACY_CUDA_IPC_CAPABLE
    11: 8,  # RANGE_START_ADDR
    12: 8,  # RANGE_SIZE
    13: 4,  # MAPPED
    14: 8,  # ALLOWED_HANDLE_TYPES
    15: 4,  # IS_GPU_DIRECT_RDMA_CAPABLE
    16: 4,  # ACCESS_FLAGS
    17: 8,  # MEMPOOL_HANDLE
    18: 8,  # MAPPING_SIZE
    19: 8,  # MAPPING_BASE_ADDR
    20: 8,  # MEMORY_BLOCK_ID
    21: 4,  # IS_HW_DECOMPRESS_CAPABLE
}
# Which CUmemPool_attribute values are ints (the rest are cuuint64_t).
POOL_INT_ATTRIBUTES = (1, 2, 3)
# The CUlaunchAttributeIDs a launch may carry: their values are plain data (0 is an entry to ignore;
# cuDNN and cuBLAS on Hopper use programmatic stream serialization, cluster shapes, carve-outs). The shim refuses any other at the
# call (CUDA_ERROR_NOT_SUPPORTED, said once): none crosses the wire half translated. Not 13
# (device-updatable kernel node): it writes a device-side handle back, and graphs' device updates are
# not forwarded.
FORWARDED_LAUNCH_ATTRIBUTES = frozenset({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 14, 16, 17, 18})
# CUlaunchAttributeID values whose value starts with a CUevent: PROGRAMMATIC_EVENT, LAUNCH_COMPLETION_EVENT.
# The client's event values are not the executor's (events the client names, a lease moved), so such a
# launch goes through the worker's Python path, which maps them.
EVENT_LAUNCH_ATTRIBUTES = frozenset({7, 12})

# The calls that end an object of the lease: call name -> the kind of handle its first parameter is.
DESTROYS = {
    "cuTexRefDestroy": "texref",
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
    "cuGreenCtxDestroy": "greenctx",
    "cuGraphDestroyNode": "node",
}
