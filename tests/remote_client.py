"""A CUDA driver-API program for the remote-execution tests: it loads `libcuda.so.1` from the library
path the way cuda.bindings does (dlopen, then every entry point through cuGetProcAddress_v2) and runs
one scenario, printing `name value` lines. With gpupool's shim first on LD_LIBRARY_PATH its calls go
to a lease's worker. Run: python tests/remote_client.py SCENARIO
"""

from __future__ import annotations

import ctypes
import os
import struct
import subprocess
import sys
import threading
import time

c_u64 = ctypes.c_uint64
VERSION = 12080  # below 13000: cuCtxSynchronize and cuCtxGetDevice without a context argument
MiB = 1 << 20

lib = ctypes.CDLL("libcuda.so.1")


class Driver:
    def __init__(self, version: int = VERSION) -> None:
        self.version = version

    def __getattr__(self, name):
        pfn = ctypes.c_void_p()
        status = ctypes.c_int()
        rc = lib.cuGetProcAddress_v2(
            name.encode(), ctypes.byref(pfn), self.version, c_u64(0), ctypes.byref(status)
        )
        assert rc == 0 and pfn.value, (name, rc)
        fn = ctypes.CFUNCTYPE(ctypes.c_int)(pfn.value)
        setattr(self, name, fn)
        return fn


cu = Driver()
cu13 = Driver(13000)  # calls CUDA 13 added


def device_copy_3d(src, dst, width):
    """CUDA_MEMCPY3D of `width` bytes between device memory (memory type 2), as a graph's copy node takes it."""
    params = (ctypes.c_uint8 * 200)()
    struct.pack_into("<IxxxxQQ", params, 32, 2, 0, src)
    struct.pack_into("<IxxxxQQ", params, 120, 2, 0, dst)
    struct.pack_into("<QQQ", params, 176, width, 1, 1)
    return params


def say(name, value):
    print(name, value, flush=True)


def check(rc, what):
    if rc != 0:
        say("FAILED", f"{what} rc={rc}")
        sys.exit(1)


def setup():
    check(cu.cuInit(0), "cuInit")
    ctx = c_u64()
    check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "retain")
    check(cu.cuCtxSetCurrent(ctx), "set current")
    return ctx


def module_function(name):
    """A function of the host executor's test module, loaded now (the current context's)."""
    module, function = c_u64(), c_u64()
    check(cu.cuModuleLoadData(ctypes.byref(module), b"// module\n"), "load")
    check(cu.cuModuleGetFunction(ctypes.byref(function), module, name), name.decode())
    return function


def alloc(n):
    p = c_u64()
    rc = cu.cuMemAlloc(ctypes.byref(p), c_u64(n))
    return rc, p.value


def dtoh(ptr, n):
    buf = ctypes.create_string_buffer(n)
    rc = cu.cuMemcpyDtoH(buf, c_u64(ptr), c_u64(n))
    return rc, buf.raw


class Config(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [
        ("dims", ctypes.c_uint * 7),
        ("stream", c_u64),
        ("attrs", ctypes.c_void_p),
        ("n", ctypes.c_uint),
    ]


class Attribute(ctypes.Structure):  # CUlaunchAttribute: id, padding, a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


def scenario_devices():
    n = ctypes.c_int(-1)  # before cuInit the driver answers NOT_INITIALIZED and leaves the count alone
    say("count_before_init", f"{cu.cuDeviceGetCount(ctypes.byref(n))} {n.value}")
    check(cu.cuInit(0), "cuInit")
    check(cu.cuDeviceGetCount(ctypes.byref(n)), "count")
    say("count", n.value)
    name = ctypes.create_string_buffer(256)
    check(cu.cuDeviceGetName(name, 256, 0), "name")
    say("name", name.value.decode())
    total = c_u64()
    check(cu.cuDeviceTotalMem(ctypes.byref(total), 0), "total")
    say("total", total.value)
    major = ctypes.c_int()
    check(cu.cuDeviceGetAttribute(ctypes.byref(major), 75, 0), "attribute")
    say("cc_major", major.value)
    uuid = ctypes.create_string_buffer(16)
    check(cu.cuDeviceGetUuid(uuid, 0), "uuid")
    say("uuid", uuid.raw.hex())
    setup()
    free, total2 = c_u64(), c_u64()
    check(cu.cuMemGetInfo(ctypes.byref(free), ctypes.byref(total2)), "info")
    say("info_total", total2.value)
    say("info_free", free.value)
    check(alloc(8 * MiB)[0], "alloc")
    check(cu.cuMemGetInfo(ctypes.byref(free), ctypes.byref(total2)), "info")
    say("info_free_after", free.value)
    dev = ctypes.c_int(-1)
    check(cu.cuCtxGetDevice(ctypes.byref(dev)), "ctx device")
    say("ctx_device", dev.value)
    err = ctypes.c_char_p()
    check(cu.cuGetErrorName(2, ctypes.byref(err)), "error name")
    say("error_name", err.value.decode())


def scenario_copies():
    setup()
    n = 10 * MiB + 123  # several chunks, not a multiple of anything
    data = os.urandom(n)
    rc, a = alloc(n)
    check(rc, "alloc a")
    rc, b = alloc(n)
    check(rc, "alloc b")
    check(cu.cuMemcpyHtoD(c_u64(a), data, c_u64(n)), "htod")
    rc, back = dtoh(a, n)
    say("htod_dtoh", rc == 0 and back == data)
    check(cu.cuMemcpyDtoD(c_u64(b), c_u64(a), c_u64(n)), "dtod")
    rc, back = dtoh(b, n)
    say("dtod", back == data)
    # The generic cuMemcpy tells host from device pointers by address.
    small = bytes(range(256)) * 4
    src = ctypes.create_string_buffer(small, len(small))
    check(cu.cuMemcpy(c_u64(a + 100), c_u64(ctypes.addressof(src)), c_u64(len(small))), "memcpy htod")
    out = ctypes.create_string_buffer(len(small))
    check(cu.cuMemcpy(c_u64(ctypes.addressof(out)), c_u64(a + 100), c_u64(len(small))), "memcpy dtoh")
    say("generic", out.raw == small)
    stream = c_u64()
    check(cu.cuStreamCreateWithPriority(ctypes.byref(stream), 1, -1), "stream")
    check(cu.cuMemsetD32Async(c_u64(b), ctypes.c_uint32(0xDEADBEEF), c_u64(4), stream), "memset32")
    check(cu.cuMemsetD16Async(c_u64(b + 16), 0x1234, c_u64(2), stream), "memset16")
    check(cu.cuMemsetD8(c_u64(b + 20), 0x7F, c_u64(3)), "memset8")
    host = ctypes.create_string_buffer(24)
    check(cu.cuMemcpyAsync(c_u64(ctypes.addressof(host)), c_u64(b), c_u64(24), stream), "memcpy async")
    check(cu.cuStreamSynchronize(stream), "stream sync")
    say("memsets", host.raw.hex())
    # Host to device from a buffer the caller overwrites right after the call returns.
    scratch = ctypes.create_string_buffer(b"A" * 64, 64)
    check(cu.cuMemcpyHtoDAsync(c_u64(a), scratch, c_u64(64), stream), "htod async")
    ctypes.memset(scratch, ord("B"), 64)
    check(cu.cuStreamSynchronize(stream), "sync")
    rc, back = dtoh(a, 64)
    say("htod_async_took_bytes", back == b"A" * 64)
    ptr_type = ctypes.c_uint(0)
    check(cu.cuPointerGetAttribute(ctypes.byref(ptr_type), 2, c_u64(a)), "attribute")
    say("device_memory_type", ptr_type.value)
    pinned = c_u64()
    check(cu.cuMemAllocHost(ctypes.byref(pinned), c_u64(4096)), "alloc host")
    ctypes.memset(pinned.value, 0x5A, 4096)  # host memory stays in this process
    check(cu.cuMemcpyHtoD(c_u64(a), c_u64(pinned.value), c_u64(4096)), "htod pinned")
    check(cu.cuPointerGetAttribute(ctypes.byref(ptr_type), 2, pinned), "attribute host")
    say("host_memory_type", ptr_type.value)
    rc, back = dtoh(a, 4096)
    say("pinned_copy", back == b"\x5a" * 4096)
    check(cu.cuMemFreeHost(c_u64(pinned.value)), "free host")
    say("htod_from_device_address", cu.cuMemcpyHtoD(c_u64(a), c_u64(b), c_u64(64)))
    say("dtoh_into_device_address", cu.cuMemcpyDtoH(c_u64(b), c_u64(a), c_u64(64)))
    say("still_connected", cu.cuCtxSynchronize())
    check(cu.cuMemFree(c_u64(a)), "free")
    say("double_free", cu.cuMemFree(c_u64(a)))


def scenario_zero_sized():
    """Copies and memsets of zero bytes, as XLA issues them (a copy of nothing from and to address 0): each with
    a null address, one no allocation holds and an allocated one; says each answer and the stream's synchronise
    after it (an asynchronous error would surface there)."""
    setup()
    rc, real = alloc(4096)
    check(rc, "alloc")
    stream = c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 0), "stream")
    host = ctypes.create_string_buffer(16)
    nothing = c_u64(0)
    for label, ptr in (("null", 0), ("nowhere", 0x1234000), ("allocated", real)):
        p = c_u64(ptr)
        calls = {
            "htod": lambda p: cu.cuMemcpyHtoD(p, host, nothing),
            "dtoh": lambda p: cu.cuMemcpyDtoH(host, p, nothing),
            "dtod": lambda p: cu.cuMemcpyDtoD(p, p, nothing),
            "htod_async": lambda p: cu.cuMemcpyHtoDAsync(p, host, nothing, stream),
            "dtoh_async": lambda p: cu.cuMemcpyDtoHAsync(host, p, nothing, stream),
            "dtod_async": lambda p: cu.cuMemcpyDtoDAsync(p, p, nothing, stream),
            "memcpy": lambda p: cu.cuMemcpy(p, p, nothing),
            "memcpy_async": lambda p: cu.cuMemcpyAsync(p, p, nothing, stream),
            "memset8": lambda p: cu.cuMemsetD8(p, 7, nothing),
            "memset32": lambda p: cu.cuMemsetD32(p, 7, nothing),
            "memset8_async": lambda p: cu.cuMemsetD8Async(p, 7, nothing, stream),
            "memset16_async": lambda p: cu.cuMemsetD16Async(p, 7, nothing, stream),
        }
        for what, call in calls.items():
            say(f"{what}_{label}", f"{call(p)} {cu.cuStreamSynchronize(stream)}")
    say("after", f"{cu.cuCtxSynchronize()} {cu.cuMemsetD8(c_u64(real), 1, c_u64(16))}")


def scenario_events():
    setup()
    start, end = c_u64(), c_u64()
    check(cu.cuEventCreate(ctypes.byref(start), 0), "event")
    check(cu.cuEventCreate(ctypes.byref(end), 0), "event")
    stream = c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 0), "stream")
    check(cu.cuEventRecord(start, stream), "record")
    check(cu.cuEventRecord(end, stream), "record")
    check(cu.cuStreamWaitEvent(stream, end, 0), "wait")
    check(cu.cuEventSynchronize(end), "event sync")
    say("query", cu.cuEventQuery(end))
    ms = ctypes.c_float(-1)
    check(cu.cuEventElapsedTime(ctypes.byref(ms), start, end), "elapsed")
    say("elapsed_ok", ms.value >= 0)
    capturing = ctypes.c_int(-1)
    check(cu.cuStreamIsCapturing(stream, ctypes.byref(capturing)), "capturing")
    say("capturing", capturing.value)
    check(cu.cuStreamDestroy(stream), "destroy")
    say("destroyed_stream_sync", cu.cuStreamSynchronize(stream))


def scenario_old_abis():
    """The driver's old symbols called by name (`lib`, not cuGetProcAddress), as ctypes code and binaries
    built before CUDA 4.0 call them, and asked of cuGetProcAddress at CUDA 3.0: those cuda.h gives a
    forwarded ABI's parameters do what that ABI does, the old cuCtxPushCurrent refusing the context current
    to the thread as the driver does; cuMemAlloc (32-bit device pointers) and cuCtxCreate (a 3.1-API
    context) are refused."""
    ctx = setup()
    stream, event = c_u64(), c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 0), "stream")
    say("stream_destroy", lib.cuStreamDestroy(stream))
    say("stream_after", cu.cuStreamSynchronize(stream))
    check(cu.cuEventCreate(ctypes.byref(event), 0), "event")
    say("event_destroy", Driver(3000).cuEventDestroy(event))  # the pre-4.0 ABI, looked up
    say("event_after", cu.cuEventSynchronize(event))
    popped = c_u64()
    say("push_current", lib.cuCtxPushCurrent(ctx))  # pre-4.0: the context current here is not pushed again
    say("pop", lib.cuCtxPopCurrent(ctypes.byref(popped)))
    say("popped_is_it", popped.value == ctx.value)
    say("push_floating", lib.cuCtxPushCurrent(ctx))
    current = c_u64()
    check(cu.cuCtxGetCurrent(ctypes.byref(current)), "current")
    say("pushed_is_current", current.value == ctx.value)
    created = c_u64()
    say("create", lib.cuCtxCreate(ctypes.byref(created), 0, 0))  # a 3.1-API context
    check(lib.cuCtxCreate_v2(ctypes.byref(created), 0, 0), "create")
    say("destroy", lib.cuCtxDestroy(created))
    check(cu.cuCtxSetCurrent(ctx), "set current")
    old_pointer = ctypes.c_uint32()
    say("old_alloc", lib.cuMemAlloc(ctypes.byref(old_pointer), ctypes.c_uint32(4096)))


def scenario_elapsed_many():
    """A benchmark harness's loop (triton's do_bench): 100 pairs of records on two streams, one
    synchronise, the elapsed time of every pair; then one pair recorded again, a pair never recorded, a
    pair with a destroyed event, and the same pairs asked again."""
    setup()
    pairs = 100
    streams = []
    for _ in range(2):
        s = c_u64()
        check(cu.cuStreamCreate(ctypes.byref(s), 1), "stream")
        streams.append(s)
    starts, ends = [c_u64() for _ in range(pairs)], [c_u64() for _ in range(pairs)]
    for e in starts + ends:
        check(cu.cuEventCreate(ctypes.byref(e), 0), "event")
    for i in range(pairs):
        check(cu.cuEventRecord(starts[i], streams[i % 2]), "record start")
        time.sleep(0.0002 * (i % 3))  # times that differ from pair to pair (the host executor's clock)
        check(cu.cuEventRecord(ends[i], streams[i % 2]), "record end")
    for s in streams:
        check(cu.cuStreamSynchronize(s), "sync")

    def elapsed(a, b):
        ms = ctypes.c_float(-1)
        rc = cu.cuEventElapsedTime(ctypes.byref(ms), a, b)
        return rc, ms.value

    first = [elapsed(starts[i], ends[i]) for i in range(pairs)]
    say("all_answered", all(rc == 0 and ms >= 0 for rc, ms in first))
    say("asked_again_same", [elapsed(starts[i], ends[i]) for i in range(pairs)] == first)
    # Recorded again, after its end: the kept answer goes, the new one is negative (end before start).
    check(cu.cuEventRecord(starts[0], streams[0]), "record again")
    check(cu.cuStreamSynchronize(streams[0]), "sync")
    rc, again = elapsed(starts[0], ends[0])
    say("recorded_again", f"{rc},{again < 0 < first[0][1] or again < first[0][1]}")
    never = c_u64()
    check(cu.cuEventCreate(ctypes.byref(never), 0), "event")
    say("never_recorded", elapsed(never, ends[1])[0])
    check(cu.cuEventDestroy(ends[2]), "destroy")
    say("destroyed", elapsed(starts[2], ends[2])[0])
    say("others_still", elapsed(starts[3], ends[3]) == first[3])


def scenario_quota():
    setup()
    rc, a = alloc(40 * MiB)
    say("first", rc)
    rc, _ = alloc(30 * MiB)
    say("second", rc)
    pool = c_u64()
    check(cu.cuDeviceGetMemPool(ctypes.byref(pool), 0), "pool")
    p = c_u64()
    say("pool_over", cu.cuMemAllocFromPoolAsync(ctypes.byref(p), c_u64(30 * MiB), pool, c_u64(0)))
    check(cu.cuMemFree(c_u64(a)), "free")
    rc, _ = alloc(30 * MiB)
    say("after_free", rc)
    say("pool_fits", cu.cuMemAllocFromPoolAsync(ctypes.byref(p), c_u64(1 * MiB), pool, c_u64(0)))
    check(cu.cuMemFreeAsync(p, c_u64(0)), "free async")
    say("sync", cu.cuCtxSynchronize())


def scenario_pool_keeps_freed():
    """Memory freed to a device pool stays the pool's until the process synchronises (then down to the
    release threshold) or trims: meanwhile an allocation from the same pool reuses it and one from
    elsewhere that needs it runs out of memory, as natively (CuPy's test_free_all_blocks_large_chunk).
    SYNC names the synchronisation: ctx, stream or event."""
    setup()
    free, total = c_u64(), c_u64()
    stream, pool, event, p = c_u64(), c_u64(), c_u64(), c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 1), "stream")
    check(cu.cuDeviceGetMemPool(ctypes.byref(pool), 0), "pool")
    check(cu.cuEventCreate(ctypes.byref(event), 0), "event")
    check(cu.cuMemGetInfo(ctypes.byref(free), ctypes.byref(total)), "info")
    most, rest = int(0.7 * total.value), int(0.4 * total.value)

    def kept_then_freed() -> None:
        check(cu.cuMemAllocAsync(ctypes.byref(p), c_u64(most), stream), "pool alloc")
        check(cu.cuMemFreeAsync(p, stream), "pool free")

    def alloc_rest() -> int:
        rc, ptr = alloc(rest)
        if rc == 0:
            check(cu.cuMemFree(c_u64(ptr)), "free")
        return rc

    def synchronise() -> int:
        how = os.environ.get("SYNC", "stream")
        if how == "event":
            check(cu.cuEventRecord(event, stream), "record")
            return cu.cuEventSynchronize(event)
        return cu.cuCtxSynchronize() if how == "ctx" else cu.cuStreamSynchronize(stream)

    kept_then_freed()
    say("alloc_while_kept", alloc_rest())
    check(cu.cuMemGetInfo(ctypes.byref(free), ctypes.byref(total)), "info")
    say("free_while_kept_fits", free.value >= rest)
    say("pool_reuses_it", cu.cuMemAllocAsync(ctypes.byref(p), c_u64(most), stream))
    check(cu.cuMemFreeAsync(p, stream), "pool free")
    say("sync", synchronise())
    say("alloc_after_sync", alloc_rest())
    keep = c_u64((1 << 64) - 1)  # a release threshold keeps it past a synchronisation, until a trim
    check(cu.cuMemPoolSetAttribute(pool, 4, ctypes.byref(keep)), "threshold")
    kept_then_freed()
    check(synchronise(), "sync")
    say("alloc_kept_by_threshold", alloc_rest())
    check(cu.cuMemPoolTrimTo(pool, c_u64(0)), "trim")
    say("alloc_after_trim", alloc_rest())
    kept_then_freed()  # and kept as the process ends: the lease has it back then


def scenario_isolation():
    setup()
    guessed = int(os.environ["GUESSED_ADDRESS"], 0)
    rc, mine = alloc(1 * MiB)
    check(rc, "alloc")
    say("mine", hex(mine))
    # Memsets are asynchronous: the worker refuses the foreign address, the next sync reports it.
    check(cu.cuMemsetD8(c_u64(guessed), 0, c_u64(16)), "memset")
    say("sync_after_foreign_memset", cu.cuCtxSynchronize())
    say("sync_again", cu.cuCtxSynchronize())
    say("attribute_of_foreign", cu.cuMemGetAddressRange(None, None, c_u64(guessed)))
    say("overrun", cu.cuMemsetD32(c_u64(mine), 0, c_u64(1 * MiB)))
    say("sync_after_overrun", cu.cuCtxSynchronize())
    say("bad_stream", cu.cuStreamSynchronize(c_u64(0xDEAD0000)))


def scenario_alloc_for_other():
    setup()
    check(alloc(1 * MiB)[0], "alloc")
    rc, b = alloc(1 * MiB)
    check(rc, "alloc")
    say("address", hex(b))
    sys.stdin.readline()


def scenario_kernels():
    setup()
    module = c_u64()
    check(
        cu.cuModuleLoadData(ctypes.byref(module), b"// host-executor module\n.visible .entry fill_u32()\n"),
        "load",
    )
    big = c_u64()  # a 3 MiB image: more than the worker's receive buffer
    check(cu.cuModuleLoadData(ctypes.byref(big), b"// " + b"x" * (3 * MiB) + b"\n"), "load big")
    fill = c_u64()
    check(cu.cuModuleGetFunction(ctypes.byref(fill), module, b"fill_u32"), "get function")
    say("missing_function", cu.cuModuleGetFunction(ctypes.byref(c_u64()), module, b"nope"))
    rc, buf = alloc(4096)
    check(rc, "alloc")
    ptr, value, n = c_u64(buf), ctypes.c_uint32(7), ctypes.c_uint32(100)
    params = (ctypes.c_void_p * 3)(ctypes.addressof(ptr), ctypes.addressof(value), ctypes.addressof(n))
    check(cu.cuLaunchKernel(fill, 1, 1, 1, 128, 1, 1, 0, c_u64(0), params, None), "launch")
    library = c_u64()
    check(cu.cuLibraryLoadData(ctypes.byref(library), b"// lib\n", None, None, 0, None, None, 0), "library")
    add = c_u64()
    check(cu.cuLibraryGetKernel(ctypes.byref(add), library, b"add_u32"), "kernel")
    value.value = 5

    priority = Attribute(8, b"", (ctypes.c_int * 16)(1))  # CU_LAUNCH_ATTRIBUTE_PRIORITY
    cfg = Config((ctypes.c_uint * 7)(1, 1, 1, 64, 1, 1, 0), 0, ctypes.addressof(priority), 1)
    check(cu.cuLaunchKernelEx(ctypes.byref(cfg), add, params, None), "launch ex")
    pdl = Attribute(6, b"", (ctypes.c_int * 16)(1))  # PROGRAMMATIC_STREAM_SERIALIZATION (cuDNN on Hopper)
    cfg_pdl = Config((ctypes.c_uint * 7)(1, 1, 1, 64, 1, 1, 0), 0, ctypes.addressof(pdl), 1)
    check(cu.cuLaunchKernelEx(ctypes.byref(cfg_pdl), add, params, None), "launch ex with PDL")
    unknown = Attribute(13, b"", (ctypes.c_int * 16)())  # DEVICE_UPDATABLE_KERNEL_NODE: not forwarded
    cfg_unknown = Config((ctypes.c_uint * 7)(1, 1, 1, 1, 1, 1, 0), 0, ctypes.addressof(unknown), 1)
    refused = [cu.cuLaunchKernelEx(ctypes.byref(cfg_unknown), add, params, None) for _ in range(2)]
    say("launch_unknown_attribute", " ".join(map(str, refused)))
    say("sync_after_unknown_attribute", cu.cuCtxSynchronize())
    check(cu.cuCtxSynchronize(), "sync")
    rc, back = dtoh(buf, 400)
    words = list(memoryview(back).cast("I"))
    say("first", words[0])
    say("last_added", words[63])
    say("not_added", words[64])
    say("beyond", words[99])
    offset, size = c_u64(), c_u64()
    check(cu.cuKernelGetParamInfo(add, c_u64(1), ctypes.byref(offset), ctypes.byref(size)), "param info")
    say("param1", f"{offset.value}+{size.value}")
    fault = c_u64()
    check(cu.cuModuleGetFunction(ctypes.byref(fault), module, b"fault"), "fault fn")
    say("fault_launch", cu.cuLaunchKernel(fault, 1, 1, 1, 1, 1, 1, 0, c_u64(0), None, None))
    say("sync_after_fault", cu.cuCtxSynchronize())


def scenario_queries():
    """Queries programs and libraries make; each prints what it returned."""
    ctx = setup()
    module = c_u64()
    check(cu.cuModuleLoadData(ctypes.byref(module), b"// module\n"), "load")
    fn = c_u64()
    check(cu.cuModuleGetFunction(ctypes.byref(fn), module, b"fill_u32"), "function")
    i, j, u, q = ctypes.c_int(), ctypes.c_int(), ctypes.c_uint(), c_u64()
    say("func_attribute", cu.cuFuncGetAttribute(ctypes.byref(i), 0, fn))
    say("func_set_attribute", cu.cuFuncSetAttribute(fn, 8, 0))
    say("occupancy", cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(i), fn, 128, c_u64(0)))
    say(
        "occupancy_flags",
        cu.cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(ctypes.byref(i), fn, 128, c_u64(0), 0),
    )
    say(
        "potential_block",
        cu.cuOccupancyMaxPotentialBlockSize(ctypes.byref(i), ctypes.byref(j), fn, None, c_u64(0), 0),
    )
    say(
        "potential_block_callback",
        cu.cuOccupancyMaxPotentialBlockSize(ctypes.byref(i), ctypes.byref(j), fn, c_u64(0x1234), c_u64(0), 0),
    )
    say("dynamic_smem", cu.cuOccupancyAvailableDynamicSMemPerBlock(ctypes.byref(q), fn, 1, 128))
    library, kernel = c_u64(), c_u64()
    check(cu.cuLibraryLoadData(ctypes.byref(library), b"// lib\n", None, None, 0, None, None, 0), "library")
    check(cu.cuLibraryGetKernel(ctypes.byref(kernel), library, b"add_u32"), "kernel")
    say("kernel_attribute", cu.cuKernelGetAttribute(ctypes.byref(i), 0, kernel, 0))
    say("kernel_set_attribute", cu.cuKernelSetAttribute(8, 0, kernel, 0))
    kf = c_u64()
    say("kernel_function", cu.cuKernelGetFunction(ctypes.byref(kf), kernel))
    stream = c_u64()
    check(cu.cuStreamCreateWithPriority(ctypes.byref(stream), 1, 0), "stream")
    say("stream_priority", cu.cuStreamGetPriority(stream, ctypes.byref(i)))
    say("stream_flags", cu.cuStreamGetFlags(stream, ctypes.byref(u)))
    sctx = c_u64()
    say("stream_ctx", cu.cuStreamGetCtx(stream, ctypes.byref(sctx)))
    say("stream_ctx_is_current", sctx.value == ctx.value)
    say("stream_id", cu.cuStreamGetId(stream, ctypes.byref(q)))
    say(
        "stream_device",
        cu.cuStreamGetDevice(stream, ctypes.byref(i)),
    )
    say("stream_device_value", i.value)
    say("priority_range", cu.cuCtxGetStreamPriorityRange(ctypes.byref(i), ctypes.byref(j)))
    say("ctx_limit", cu.cuCtxGetLimit(ctypes.byref(q), 0))
    say("ctx_set_limit", cu.cuCtxSetLimit(0, c_u64(1024)))
    say("ctx_flags", cu.cuCtxGetFlags(ctypes.byref(u)))
    say("ctx_api_version", cu.cuCtxGetApiVersion(ctx, ctypes.byref(u)))
    say("ctx_id", cu.cuCtxGetId(ctx, ctypes.byref(q)))
    say("profiler_start", cu.cuProfilerStart())
    say("profiler_stop", cu.cuProfilerStop())
    say("primary_state", cu.cuDevicePrimaryCtxGetState(0, ctypes.byref(u), ctypes.byref(i)))
    bus = ctypes.create_string_buffer(32)
    say("pci_bus_id", cu.cuDeviceGetPCIBusId(bus, 32, 0))
    v = ctypes.c_int()
    say("driver_version", cu.cuDriverGetVersion(ctypes.byref(v)))
    say("can_access_peer", cu.cuDeviceCanAccessPeer(ctypes.byref(i), 0, 0))
    rc, p = alloc(MiB)
    check(rc, "alloc")
    base, size = c_u64(), c_u64()
    say("address_range", cu.cuMemGetAddressRange(ctypes.byref(base), ctypes.byref(size), c_u64(p + 100)))
    say("address_range_value", base.value == p and size.value == MiB)
    attrs = (ctypes.c_int * 3)(2, 9, 12)  # memory type, device ordinal, range size
    mtype, ordinal, rsize = ctypes.c_uint(), ctypes.c_int(-1), c_u64()
    data = (ctypes.c_void_p * 3)(ctypes.addressof(mtype), ctypes.addressof(ordinal), ctypes.addressof(rsize))
    say("pointer_attributes", cu.cuPointerGetAttributes(3, attrs, data, c_u64(p)))
    say("pointer_attributes_values", f"{mtype.value},{ordinal.value},{rsize.value == MiB}")
    pool = c_u64()
    check(cu.cuDeviceGetDefaultMemPool(ctypes.byref(pool), 0), "pool")
    threshold = c_u64(1 << 30)
    say("pool_set_threshold", cu.cuMemPoolSetAttribute(pool, 4, ctypes.byref(threshold)))
    reuse = ctypes.c_int(-1)
    say("pool_get_reuse", cu.cuMemPoolGetAttribute(pool, 1, ctypes.byref(reuse)))
    say("pool_trim", cu.cuMemPoolTrimTo(pool, c_u64(0)))
    event = c_u64()
    check(cu.cuEventCreate(ctypes.byref(event), 0), "event")
    say("event_record_flags", cu.cuEventRecordWithFlags(event, stream, 0))
    say("sync", cu.cuCtxSynchronize())
    say("module_unload", cu.cuModuleUnload(module))
    say("function_after_unload", cu.cuFuncGetAttribute(ctypes.byref(i), 0, fn))


def scenario_memo():
    """Questions the runtime repeats: the answers stay right when something changes them."""
    check(cu.cuInit(0), "cuInit")
    value = ctypes.c_int()
    for _ in range(50):
        check(cu.cuDeviceGetAttribute(ctypes.byref(value), 16, 0), "device attribute")  # SM count
    say("sm_count", value.value)

    def state():
        flags, active = ctypes.c_uint(), ctypes.c_int()
        check(cu.cuDevicePrimaryCtxGetState(0, ctypes.byref(flags), ctypes.byref(active)), "state")
        return f"{flags.value}/{active.value}"

    say("state_before_retain", state())
    ctx = c_u64()
    check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "retain")
    for _ in range(50):
        retained = state()
    say("state_retained", retained)
    check(cu.cuDevicePrimaryCtxSetFlags(0, 4), "set flags")  # CU_CTX_SCHED_BLOCKING_SYNC
    say("state_after_set_flags", state())
    check(cu.cuDevicePrimaryCtxRelease(0), "release")
    say("state_released", state())
    check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "retain again")
    check(cu.cuCtxSetCurrent(ctx), "set current")

    module, func = c_u64(), c_u64()
    check(
        cu.cuModuleLoadData(ctypes.byref(module), b"// host-executor module\n.visible .entry fill_u32()\n"),
        "load",
    )
    check(cu.cuModuleGetFunction(ctypes.byref(func), module, b"fill_u32"), "get function")

    def shared():  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        check(cu.cuFuncGetAttribute(ctypes.byref(value), 8, func), "get attribute")
        return value.value

    seen = [shared()]
    for size in (1000, 1000, 1000, 2000, 1000):
        check(cu.cuFuncSetAttribute(func, 8, size), "set attribute")
        seen.append(shared())
    say("dynamic_shared", " ".join(map(str, seen)))

    stream, graph, status = c_u64(), c_u64(), ctypes.c_int()

    def capturing():
        check(cu.cuStreamIsCapturing(stream, ctypes.byref(status)), "is capturing")
        return status.value

    check(cu.cuStreamCreate(ctypes.byref(stream), 1), "stream")
    seen = [capturing(), capturing()]
    check(cu.cuStreamBeginCapture(stream, 0), "begin capture")
    seen += [capturing(), capturing()]
    check(cu.cuStreamEndCapture(stream, ctypes.byref(graph)), "end capture")
    seen += [capturing(), capturing()]
    say("capturing", " ".join(map(str, seen)))


def scenario_capture_info():
    """cuStreamGetCaptureInfo as libraries ask it before each call: NONE outside any capture (many times),
    ACTIVE with the capture's id and graph during one, through an end on the wrong stream, and NONE
    again after the real end; an unknown stream is refused."""
    setup()
    one, two, graph = c_u64(), c_u64(), c_u64()
    check(cu.cuStreamCreate(ctypes.byref(one), 1), "stream")
    check(cu.cuStreamCreate(ctypes.byref(two), 1), "stream")

    def info(stream):
        status, capture_id, of, deps, count = ctypes.c_int(-1), c_u64(), c_u64(), ctypes.c_void_p(), c_u64()
        rc = cu.cuStreamGetCaptureInfo(stream, ctypes.byref(status), ctypes.byref(capture_id), ctypes.byref(of),
                                       ctypes.byref(deps), None, ctypes.byref(count))  # fmt: skip
        if rc:
            return f"rc{rc}"
        return f"1:{bool(capture_id.value and of.value)}" if status.value == 1 else str(status.value)

    before = {info(s) for _ in range(200) for s in (one, two, c_u64(0))}
    say("before", " ".join(sorted(before)))
    say("unknown", info(c_u64(0xDEAD0000)))
    check(cu.cuStreamBeginCapture(one, 2), "begin capture")  # relaxed
    say("during", f"{info(one)} {info(two)}")
    say("end_other", cu.cuStreamEndCapture(two, ctypes.byref(graph)))
    say("after_end_other", info(one))
    # the capture still open takes a copy from page-locked memory as a node that reads it at each launch
    rc, dev = alloc(4)
    check(rc, "alloc")
    source, exe, word = c_u64(), c_u64(), (ctypes.c_uint32 * 1)()
    check(cu.cuMemHostAlloc(ctypes.byref(source), c_u64(4), 0), "host alloc")
    check(cu.cuMemcpyHtoDAsync(c_u64(dev), source, c_u64(4), one), "captured copy")
    say("end", cu.cuStreamEndCapture(one, ctypes.byref(graph)))
    say("after", " ".join(sorted({info(s) for _ in range(200) for s in (one, two)})))
    check(cu.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, c_u64(0)), "instantiate")
    ctypes.c_uint32.from_address(source.value).value = 7
    check(cu.cuGraphLaunch(exe, one), "launch graph")
    check(cu.cuStreamSynchronize(one), "sync")
    check(cu.cuMemcpyDtoH(word, c_u64(dev), c_u64(4)), "read")
    say("replayed", word[0])


def scenario_capture_copy():
    """Copies between this process's memory and the GPU cannot be captured into a graph: the capture
    fails at its end, as the driver does for an operation a capture does not allow; work goes on."""
    setup()
    rc, dev = alloc(64)
    check(rc, "alloc")
    stream, graph = c_u64(), c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 1), "stream")
    data = ctypes.create_string_buffer(b"x" * 64)
    check(cu.cuStreamBeginCapture(stream, 2), "begin capture")  # relaxed
    say("htod_in_capture", cu.cuMemcpyHtoDAsync(c_u64(dev), data, c_u64(64), stream))
    say("dtoh_in_capture", cu.cuMemcpyDtoHAsync(data, c_u64(dev), c_u64(64), stream))
    say("end_capture", cu.cuStreamEndCapture(stream, ctypes.byref(graph)))
    say("htod_after", cu.cuMemcpyHtoDAsync(c_u64(dev), data, c_u64(64), stream))
    say("sync", cu.cuStreamSynchronize(stream))
    say("readback", dtoh(dev, 4)[1] == b"xxxx")


def scenario_capture_page_locked():
    """A captured graph that copies page-locked memory (cuMemHostAlloc) to the GPU, adds 1 in a kernel and
    copies the result into registered memory (cuMemHostRegister), as PyTorch's pinned copies inside
    torch.cuda.graph do: natively each launch reads and writes the pages as they are then. Replayed twice,
    the host changing the input in between."""
    setup()
    add = module_function(b"add_u32")
    n = 5000
    rc, dev = alloc(4 * n)
    check(rc, "alloc")
    source = c_u64()
    check(cu.cuMemHostAlloc(ctypes.byref(source), c_u64(4 * n), 0), "host alloc")
    words_in = (ctypes.c_uint32 * n).from_address(source.value)
    words_out = (ctypes.c_uint32 * n)()
    check(cu.cuMemHostRegister(ctypes.byref(words_out), c_u64(4 * n), 0), "register")
    stream, graph, exe = c_u64(), c_u64(), c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 1), "stream")
    args = [c_u64(dev), ctypes.c_uint32(1), ctypes.c_uint32(n)]
    params = (ctypes.c_void_p * 3)(*[ctypes.addressof(x) for x in args])
    check(cu.cuStreamBeginCapture(stream, 2), "begin capture")  # relaxed
    say("htod_in_capture", cu.cuMemcpyHtoDAsync(c_u64(dev), c_u64(source.value), c_u64(4 * n), stream))
    say(
        "launch_in_capture",
        cu.cuLaunchKernel(add, (n + 255) // 256, 1, 1, 256, 1, 1, 0, stream, params, None),
    )
    say("dtoh_in_capture", cu.cuMemcpyDtoHAsync(ctypes.byref(words_out), c_u64(dev), c_u64(4 * n), stream))
    say("end_capture", cu.cuStreamEndCapture(stream, ctypes.byref(graph)))
    check(cu.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, c_u64(0)), "instantiate")
    replays = []
    for base in (0, 100):
        for i in range(n):
            words_in[i] = base + i
        check(cu.cuGraphLaunch(exe, stream), "launch graph")
        check(cu.cuStreamSynchronize(stream), "sync")
        replays.append([words_out[0], words_out[n - 1]])
    say("replays", replays)
    check(cu.cuMemHostUnregister(ctypes.byref(words_out)), "unregister")
    say("free", cu.cuMemFreeHost(c_u64(source.value)))


def scenario_pinned_async_copies():
    """Twenty asynchronous copies into page-locked memory and back, then one synchronise: the bytes as
    sent (run with the memory not shared with the worker, as across hosts, to see what each costs)."""
    setup()
    n = 64 << 10
    rc, dev = alloc(n)
    check(rc, "alloc")
    check(cu.cuMemsetD8(c_u64(dev), 0x5A, c_u64(n)), "memset")
    pinned, stream = c_u64(), c_u64()
    check(cu.cuMemHostAlloc(ctypes.byref(pinned), c_u64(n), 0), "host alloc")
    check(cu.cuStreamCreate(ctypes.byref(stream), 1), "stream")
    for _ in range(10):
        check(cu.cuMemcpyDtoHAsync(c_u64(pinned.value), c_u64(dev), c_u64(n), stream), "dtoh async")
        check(cu.cuMemcpyHtoDAsync(c_u64(dev), c_u64(pinned.value), c_u64(n), stream), "htod async")
    check(cu.cuStreamSynchronize(stream), "sync")
    say("landed", ctypes.string_at(pinned.value, n) == b"\x5a" * n)
    say("free", cu.cuMemFreeHost(c_u64(pinned.value)))


def scenario_memo_kernels():
    """A setter or an unload drops the kept answers about its own kernel, function or library only."""
    setup()
    library, ka, kb, fa, fb = c_u64(), c_u64(), c_u64(), c_u64(), c_u64()
    check(cu.cuLibraryLoadData(ctypes.byref(library), b"// lib\n", None, None, 0, None, None, 0), "library")
    check(cu.cuLibraryGetKernel(ctypes.byref(ka), library, b"add_u32"), "kernel a")
    check(cu.cuLibraryGetKernel(ctypes.byref(kb), library, b"fill_u32"), "kernel b")
    check(cu.cuKernelGetFunction(ctypes.byref(fa), ka), "function a")
    check(cu.cuKernelGetFunction(ctypes.byref(fb), kb), "function b")
    module, mf = c_u64(), c_u64()
    check(cu.cuModuleLoadData(ctypes.byref(module), b"// host-executor module\n"), "module")
    check(cu.cuModuleGetFunction(ctypes.byref(mf), module, b"fill_u32"), "module function")
    value = ctypes.c_int()

    def shared():  # MAX_DYNAMIC_SHARED_SIZE_BYTES of: a's function, b's function, kernel a as a function, the module's
        seen = []
        for handle in (fa, fb, ka, mf):
            for _ in range(20):  # the runtime asks before every launch
                check(cu.cuFuncGetAttribute(ctypes.byref(value), 8, handle), "get attribute")
            seen.append(str(value.value))
        return " ".join(seen)

    say("at_first", shared())
    check(cu.cuKernelSetAttribute(8, 3000, kb, 0), "set b")
    check(cu.cuKernelSetAttribute(8, 3000, kb, 0), "set b again")
    for _ in range(3):  # as cuDNN does before each launch: two attributes, each set to what it already is
        check(cu.cuKernelSetAttribute(9, 50, kb, 0), "set b's shared memory carveout")
        check(cu.cuKernelSetAttribute(8, 3000, kb, 0), "set b's dynamic shared memory")
    say("after_setting_b", shared())
    check(cu.cuFuncSetAttribute(fa, 8, 2000), "set a's function")
    say("after_setting_a", shared())
    check(cu.cuLibraryUnload(library), "unload")
    for _ in range(20):
        check(cu.cuFuncGetAttribute(ctypes.byref(value), 8, mf), "module function after the unload")
    say("module_function_after_unload", value.value)
    host_function = ctypes.cast(cu.cuInit, ctypes.c_void_p).value  # a host pointer is no handle
    say(
        "not_a_handle",
        " ".join(str(cu.cuFuncGetAttribute(ctypes.byref(value), 0, c_u64(host_function))) for _ in range(20)),
    )


def scenario_link():
    """The driver's linker: inputs from memory and from a file, the linked image loaded as a module."""
    setup()
    state, cubin, size = c_u64(), ctypes.c_void_p(), ctypes.c_size_t()
    check(cu.cuLinkCreate(0, None, None, ctypes.byref(state)), "link create")
    ptx = b"// part a\n.visible .entry from_memory(\n.param .u64 p\n)\n"
    check(
        cu.cuLinkAddData(state, 1, ptx, c_u64(len(ptx)), b"a.ptx", 0, None, None), "add data"
    )  # CU_JIT_INPUT_PTX
    check(cu.cuLinkAddFile(state, 1, os.environ["LINK_FILE"].encode(), 0, None, None), "add file")
    check(cu.cuLinkComplete(state, ctypes.byref(cubin), ctypes.byref(size)), "complete")
    image = ctypes.string_at(cubin.value, size.value)
    say("image_holds_both", b"from_memory" in image and b"from_file" in image)
    module, fn = c_u64(), c_u64()
    check(cu.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(image)), "load the linked image")
    say("function_from_file", cu.cuModuleGetFunction(ctypes.byref(fn), module, b"from_file"))
    say("destroy", cu.cuLinkDestroy(state))
    say("after_destroy", cu.cuLinkAddData(state, 1, ptx, c_u64(len(ptx)), b"a.ptx", 0, None, None))
    check(cu.cuLinkCreate(0, None, None, ctypes.byref(state)), "link create again")
    say("missing_file", cu.cuLinkAddFile(state, 1, b"/nonexistent/x.ptx", 0, None, None))
    say("nothing_to_link", cu.cuLinkComplete(state, ctypes.byref(cubin), ctypes.byref(size)))


def scenario_contexts():
    """A context the program creates: current at once, its memory counted, gone with it on destroy."""
    primary = setup()
    created, current, free, total = c_u64(), c_u64(), c_u64(), c_u64()

    def free_mib():
        check(cu.cuMemGetInfo(ctypes.byref(free), ctypes.byref(total)), "mem info")
        return free.value // MiB

    before = free_mib()
    check(cu.cuCtxCreate(ctypes.byref(created), None, 0, 0), "create")  # v4: params, flags, device
    check(cu.cuCtxGetCurrent(ctypes.byref(current)), "current")
    say("created_is_current", current.value == created.value != primary.value)
    rc, _ = alloc(20 * MiB)
    say("alloc_in_created", rc)
    say("free_drops_by", before - free_mib())
    say("destroy", cu.cuCtxDestroy(created))
    check(cu.cuCtxGetCurrent(ctypes.byref(current)), "current after")
    say("current_after_destroy", "primary" if current.value == primary.value else hex(current.value))
    say("free_back", free_mib() == before)
    say("destroy_again", cu.cuCtxDestroy(created))
    say("destroy_primary", cu.cuCtxDestroy(primary))
    say("primary_still_works", alloc(MiB)[0])
    check(cu.cuCtxCreate(ctypes.byref(created), None, 0, 0), "create, left for the exit")
    say("left_alloc", alloc(20 * MiB)[0])


def scenario_printf():
    """Kernel output reaches this process's stdout at the synchronise, in order with its own prints."""
    setup()
    module, func = c_u64(), c_u64()
    check(cu.cuModuleLoadData(ctypes.byref(module), b"// host-executor module\n"), "load")
    check(cu.cuModuleGetFunction(ctypes.byref(func), module, b"printf_u32"), "get function")
    print("before launch", flush=True)
    for n in (7, 8):
        value = ctypes.c_uint32(n)
        params = (ctypes.c_void_p * 1)(ctypes.addressof(value))
        check(cu.cuLaunchKernel(func, 1, 1, 1, 1, 1, 1, 0, c_u64(0), params, None), "launch")
    print("before sync", flush=True)
    check(cu.cuCtxSynchronize(), "sync")
    print("after sync", flush=True)


def scenario_launch_errors():
    """A launch the driver refuses on the spot fails from the launch call itself."""
    setup()
    module, fill, saxpy = c_u64(), c_u64(), c_u64()
    check(cu.cuModuleLoadData(ctypes.byref(module), b"// host-executor module\n"), "load")
    check(cu.cuModuleGetFunction(ctypes.byref(fill), module, b"fill_u32"), "fill")
    check(cu.cuModuleGetFunction(ctypes.byref(saxpy), module, b"saxpy"), "saxpy")
    bounded = c_u64()
    check(cu.cuModuleGetFunction(ctypes.byref(bounded), module, b"bounded_add_u32"), "bounded")
    rc, buf = alloc(1 << 16)
    check(rc, "alloc")
    ptr, value, n = c_u64(buf), ctypes.c_uint32(7), ctypes.c_uint32(16)
    fill_params = (ctypes.c_void_p * 3)(*map(ctypes.addressof, (ptr, value, n)))
    a, count = ctypes.c_float(2.0), ctypes.c_uint32(0)
    saxpy_params = (ctypes.c_void_p * 4)(*map(ctypes.addressof, (ptr, ptr, a, count)))

    def launch(func, params, grid, block, smem=0):
        return cu.cuLaunchKernel(func, *grid, *block, smem, c_u64(0), params, None)

    say("too_many_threads", launch(fill, fill_params, (1, 1, 1), (2048, 1, 1)))
    say("block_z_too_deep", launch(fill, fill_params, (1, 1, 1), (1, 1, 128)))
    say("empty_block", launch(fill, fill_params, (1, 1, 1), (0, 1, 1)))
    say("grid_y_too_tall", launch(fill, fill_params, (1, 70000, 1), (32, 1, 1)))
    say("registers_allow_fewer", launch(saxpy, saxpy_params, (1, 1, 1), (512, 1, 1)))
    say("saxpy_256", launch(saxpy, saxpy_params, (1, 1, 1), (256, 1, 1)))
    say("past_launch_bounds", launch(bounded, fill_params, (1, 1, 1), (256, 1, 1)))
    say("shared_over_default", launch(fill, fill_params, (1, 1, 1), (32, 1, 1), 60000))
    check(cu.cuFuncSetAttribute(fill, 8, 65536), "raise dynamic shared memory")
    say("shared_after_raising", launch(fill, fill_params, (1, 1, 1), (32, 1, 1), 60000))
    say("sync", cu.cuCtxSynchronize())


def scenario_globals_reused():
    """A module's global, then the module unloaded and another loaded whose larger global the driver
    places at the same address: the new global's whole range is the program's to copy to and from."""
    setup()
    first, second = c_u64(), c_u64()
    check(cu.cuModuleLoadData(ctypes.byref(first), b".global .align 4 .b8 small[16];\n\0"), "load first")
    address, size = c_u64(), c_u64()
    check(cu.cuModuleGetGlobal(ctypes.byref(address), ctypes.byref(size), first, b"small"), "small")
    old = address.value
    check(cu.cuModuleUnload(first), "unload first")
    check(cu.cuModuleLoadData(ctypes.byref(second), b".global .align 8 .b8 table[24];\n\0"), "load second")
    check(cu.cuModuleGetGlobal(ctypes.byref(address), ctypes.byref(size), second, b"table"), "table")
    say("same_address", address.value == old)
    say("size", size.value)
    data = bytes(range(24))
    say("copy_to", cu.cuMemcpyHtoD(address, data, c_u64(24)))
    rc, back = dtoh(address.value, 24)
    say("copy_back", rc)
    say("bytes_equal", back == data)


def scenario_legacy_launch():
    """The legacy launch API (block shape, shared size and parameters set per function, then cuLaunch,
    cuLaunchGrid, cuLaunchGridAsync) against the same kernels through cuLaunchKernel; its bad uses; and
    cuCtxAttach/cuCtxDetach's usage count."""
    ctx = setup()
    module, fill, add, saxpy, empty = c_u64(), c_u64(), c_u64(), c_u64(), c_u64()
    check(cu.cuModuleLoadData(ctypes.byref(module), b"// host-executor module\n"), "load")
    for func, name in ((fill, b"fill_u32"), (add, b"add_u32"), (saxpy, b"saxpy"), (empty, b"empty")):
        check(cu.cuModuleGetFunction(ctypes.byref(func), module, name), name.decode())
    (_, legacy), (_, modern) = alloc(4096), alloc(4096)
    # fill_u32(u32 *p, u32 value, u32 n) over grid x block threads: 2 blocks of 32 from cuLaunchGrid
    check(cu.cuFuncSetBlockShape(fill, 32, 1, 1), "block shape")
    check(cu.cuFuncSetSharedSize(fill, 1024), "shared size")
    check(cu.cuParamSetSize(fill, 16), "param size")
    check(cu.cuParamSetv(fill, 0, ctypes.byref(c_u64(legacy)), 8), "param pointer")
    check(cu.cuParamSeti(fill, 8, 7), "param value")
    check(cu.cuParamSeti(fill, 12, 100), "param count")
    check(cu.cuLaunchGrid(fill, 2, 1), "launch grid")
    # add_u32 (same parameters) by cuLaunch: one block of the shape set
    check(cu.cuFuncSetBlockShape(add, 16, 1, 1), "add block shape")
    check(cu.cuParamSetSize(add, 16), "add param size")
    check(cu.cuParamSetv(add, 0, ctypes.byref(c_u64(legacy)), 8), "add pointer")
    check(cu.cuParamSeti(add, 8, 5), "add value")
    check(cu.cuParamSeti(add, 12, 100), "add count")
    check(cu.cuLaunch(add), "launch")
    ptr, n = c_u64(modern), ctypes.c_uint32(100)
    for func, value, grid, block in ((fill, 7, 2, 32), (add, 5, 1, 16)):
        v = ctypes.c_uint32(value)
        params = (ctypes.c_void_p * 3)(*map(ctypes.addressof, (ptr, v, n)))
        check(cu.cuLaunchKernel(func, grid, 1, 1, block, 1, 1, 1024, c_u64(0), params, None), "launch kernel")
    check(cu.cuCtxSynchronize(), "sync")
    words = list(memoryview(dtoh(legacy, 400)[1]).cast("I"))
    say("legacy_words", f"{words[0]} {words[15]} {words[16]} {words[63]} {words[64]}")
    say("fill_add_same", dtoh(legacy, 400)[1] == dtoh(modern, 400)[1])
    # saxpy(float *x, float *y, float a, u32 n) by cuLaunchGridAsync on a stream, a float by cuParamSetf
    (_, x), (_, y_legacy), (_, y_modern) = alloc(64), alloc(64), alloc(64)
    floats = struct.pack("<16f", *range(16))
    for p in (x, y_legacy, y_modern):
        check(cu.cuMemcpyHtoD(c_u64(p), floats, c_u64(64)), "floats")
    stream = c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 0), "stream")
    check(cu.cuFuncSetBlockShape(saxpy, 16, 1, 1), "saxpy block shape")
    check(cu.cuParamSetSize(saxpy, 24), "saxpy param size")
    check(cu.cuParamSetv(saxpy, 0, ctypes.byref(c_u64(x)), 8), "x")
    check(cu.cuParamSetv(saxpy, 8, ctypes.byref(c_u64(y_legacy)), 8), "y")
    check(cu.cuParamSetf(saxpy, 16, ctypes.c_float(2.5)), "a")
    check(cu.cuParamSeti(saxpy, 20, 16), "n")
    check(cu.cuLaunchGridAsync(saxpy, 1, 1, stream), "launch grid async")
    xp, yp, a, count = c_u64(x), c_u64(y_modern), ctypes.c_float(2.5), ctypes.c_uint32(16)
    params = (ctypes.c_void_p * 4)(*map(ctypes.addressof, (xp, yp, a, count)))
    check(cu.cuLaunchKernel(saxpy, 1, 1, 1, 16, 1, 1, 0, stream, params, None), "saxpy kernel")
    check(cu.cuStreamSynchronize(stream), "stream sync")
    say("saxpy_y3", struct.unpack_from("<f", dtoh(y_legacy, 64)[1], 12)[0])
    say("saxpy_same", dtoh(y_legacy, 64)[1] == dtoh(y_modern, 64)[1])
    # bad uses: what the driver answers, from the call, nothing sent
    say("seti_past_size", cu.cuParamSeti(saxpy, 24, 1))
    say("setv_across_size", cu.cuParamSetv(saxpy, 20, ctypes.byref(c_u64(0)), 8))
    say("setf_negative_offset", cu.cuParamSetf(saxpy, -4, ctypes.c_float(1.0)))
    say("size_over_limit", cu.cuParamSetSize(saxpy, 1 << 20))
    say("launch_without_block_shape", cu.cuLaunch(empty))
    say("grid_of_zero", cu.cuLaunchGrid(fill, 0, 1))
    say("block_shape_of_zero", cu.cuFuncSetBlockShape(fill, 0, 1, 1))
    say("unknown_function", cu.cuFuncSetBlockShape(c_u64(0x1234), 1, 1, 1))
    say("sync_after_bad_uses", cu.cuCtxSynchronize())
    # cuCtxAttach counts a use of the current context; cuCtxDetach takes it back, the last use destroys
    attached = c_u64()
    say("attach", cu.cuCtxAttach(ctypes.byref(attached), 0))
    say("attached_current", attached.value == ctx.value)
    say("attach_flags", cu.cuCtxAttach(ctypes.byref(attached), 1))
    say("detach", cu.cuCtxDetach(attached))
    say("memset_after_detach", cu.cuMemsetD8(c_u64(legacy), 1, c_u64(4)))
    own = c_u64()
    check(cu.cuCtxCreate(ctypes.byref(own), None, 0, 0), "create")  # v4: params, flags, device
    say("attach_own", cu.cuCtxAttach(ctypes.byref(attached), 0))
    say("detach_own_attach", cu.cuCtxDetach(own))
    say("detach_own_last", cu.cuCtxDetach(own))
    say("own_destroyed", cu.cuCtxSetCurrent(own) != 0 or cu.cuMemsetD8(c_u64(legacy), 1, c_u64(4)) != 0)
    check(cu.cuCtxSetCurrent(ctx), "primary again")
    say("detach_not_current", cu.cuCtxDetach(c_u64(0x5678)))


def fill_8192_words(value):
    """The host executor's fill_u32 over 8192 words of a new allocation: the function, the allocation, the
    launch parameters and what they point to (kept alive by the caller)."""
    setup()
    module, fill = c_u64(), c_u64()
    check(cu.cuModuleLoadData(ctypes.byref(module), b"// host-executor module\n"), "load")
    check(cu.cuModuleGetFunction(ctypes.byref(fill), module, b"fill_u32"), "fill")
    rc, buf = alloc(1 << 16)
    check(rc, "alloc")
    kept = (c_u64(buf), ctypes.c_uint32(value), ctypes.c_uint32(8192))
    return fill, buf, (ctypes.c_void_p * 3)(*map(ctypes.addressof, kept)), kept


def scenario_cooperative():
    """Cooperative launches (cuLaunchCooperativeKernel, and cuLaunchKernelEx with the cooperative
    attribute) run; one with more blocks than fit on the device at once (the host executor's device: 4
    multiprocessors, 2048 threads each) is refused by the launch call itself, as the driver does, and
    leaves nothing to report at the next synchronise."""
    fill, buf, params, _kept = fill_8192_words(3)
    say("cooperative", cu.cuLaunchCooperativeKernel(fill, 32, 1, 1, 256, 1, 1, 0, c_u64(0), params))
    say("sync", cu.cuCtxSynchronize())
    words = memoryview(dtoh(buf, 4 * 8192)[1]).cast("I")
    say("filled", f"{words[0]} {words[8191]}")
    say("too_large", cu.cuLaunchCooperativeKernel(fill, 33, 1, 1, 256, 1, 1, 0, c_u64(0), params))
    say("sync_after_too_large", cu.cuCtxSynchronize())

    def launch_ex(blocks, cooperative):
        attribute = Attribute(2, b"", (ctypes.c_int * 16)(cooperative))  # CU_LAUNCH_ATTRIBUTE_COOPERATIVE
        config = Config((ctypes.c_uint * 7)(blocks, 1, 1, 256, 1, 1, 0), 0, ctypes.addressof(attribute), 1)
        return cu.cuLaunchKernelEx(ctypes.byref(config), fill, params, None)

    say("ex_cooperative", launch_ex(32, 1))
    say("ex_too_large", launch_ex(33, 1))
    say("ex_not_cooperative", launch_ex(33, 0))  # an ordinary launch may have any number of blocks
    say("sync_at_end", cu.cuCtxSynchronize())


class LaunchParams(ctypes.Structure):  # CUDA_LAUNCH_PARAMS
    _fields_ = [
        ("function", c_u64),
        ("dims", ctypes.c_uint * 7),
        ("stream", c_u64),
        ("params", ctypes.c_void_p),
    ]


def scenario_cooperative_multi_device():
    """cuLaunchCooperativeKernelMultiDevice with the lease's one device: the launch runs; one with more blocks
    than fit at once, more launches than the lease has devices, a stream not the lease's, or unknown flags
    are refused by the call."""
    fill, buf, params, _kept = fill_8192_words(5)

    def launches(*entries):
        return (LaunchParams * len(entries))(
            *[LaunchParams(fill.value, (ctypes.c_uint * 7)(blocks, 1, 1, 256, 1, 1, 0), stream,
                           ctypes.cast(params, ctypes.c_void_p)) for blocks, stream in entries]
        )  # fmt: skip

    say("launched", cu.cuLaunchCooperativeKernelMultiDevice(launches((32, 0)), 1, 0))
    say("sync", cu.cuCtxSynchronize())
    words = memoryview(dtoh(buf, 4 * 8192)[1]).cast("I")
    say("filled", f"{words[0]} {words[8191]}")
    say("too_large", cu.cuLaunchCooperativeKernelMultiDevice(launches((33, 0)), 1, 0))
    say("more_than_devices", cu.cuLaunchCooperativeKernelMultiDevice(launches((32, 0), (32, 0)), 2, 0))
    say("foreign_stream", cu.cuLaunchCooperativeKernelMultiDevice(launches((32, 0x4242)), 1, 0))
    say("unknown_flags", cu.cuLaunchCooperativeKernelMultiDevice(launches((32, 0)), 1, 4))
    say("sync_at_end", cu.cuCtxSynchronize())


def scenario_cache_config():
    """Cache and shared-memory configuration round trips: what a context, function or kernel is set to
    reads back, and a value the driver refuses (an unknown configuration, a carve-out past 100 %, more
    dynamic shared memory than the device allows) is refused with the driver's error and changes
    nothing."""
    setup()
    module, fill, library, kernel = c_u64(), c_u64(), c_u64(), c_u64()
    check(cu.cuModuleLoadData(ctypes.byref(module), b"// host-executor module\n"), "load")
    check(cu.cuModuleGetFunction(ctypes.byref(fill), module, b"fill_u32"), "fill")
    check(cu.cuLibraryLoadData(ctypes.byref(library), b"// lib\n", None, None, 0, None, None, 0), "library")
    check(cu.cuLibraryGetKernel(ctypes.byref(kernel), library, b"add_u32"), "kernel")
    config = ctypes.c_int()

    def ctx_config(getter):
        rc = getter(ctypes.byref(config))
        return f"{rc} {config.value}"

    say("ctx_cache_default", ctx_config(cu.cuCtxGetCacheConfig))
    say("ctx_cache_set", cu.cuCtxSetCacheConfig(2))  # CU_FUNC_CACHE_PREFER_L1
    say("ctx_cache_unknown", cu.cuCtxSetCacheConfig(7))
    say("ctx_cache_now", ctx_config(cu.cuCtxGetCacheConfig))
    say("ctx_shared_default", ctx_config(cu.cuCtxGetSharedMemConfig))
    say("ctx_shared_set", cu.cuCtxSetSharedMemConfig(2))  # EIGHT_BYTE_BANK_SIZE
    say("ctx_shared_unknown", cu.cuCtxSetSharedMemConfig(5))
    say("ctx_shared_now", ctx_config(cu.cuCtxGetSharedMemConfig))
    say("func_cache", cu.cuFuncSetCacheConfig(fill, 1))
    say("func_cache_unknown", cu.cuFuncSetCacheConfig(fill, 9))
    say("func_cache_foreign", cu.cuFuncSetCacheConfig(c_u64(0x1234), 1))
    say("func_shared", cu.cuFuncSetSharedMemConfig(fill, 1))
    say("func_shared_unknown", cu.cuFuncSetSharedMemConfig(fill, 7))
    say("kernel_cache", cu.cuKernelSetCacheConfig(kernel, 3, 0))
    say("kernel_cache_unknown", cu.cuKernelSetCacheConfig(kernel, 4, 0))
    say("kernel_cache_other_device", cu.cuKernelSetCacheConfig(kernel, 3, 5))
    value = ctypes.c_int()

    def carveout():  # CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
        rc = cu.cuFuncGetAttribute(ctypes.byref(value), 9, fill)
        return f"{rc} {value.value}"

    say("carveout_set", cu.cuFuncSetAttribute(fill, 9, 50))
    say("carveout_past_100", cu.cuFuncSetAttribute(fill, 9, 101))
    say("carveout_now", carveout())
    say("dynamic_shared_past_the_device", cu.cuFuncSetAttribute(fill, 8, 1 << 20))
    say("read_only_attribute", cu.cuFuncSetAttribute(fill, 0, 64))


def scenario_enumerate():
    """What a module or library holds: counts, the handles themselves (usable, and the same a lookup
    by name gives), their names (one pointer per handle, kept), their library, parameter counts; a
    handle that is not the lease's is refused."""
    setup()
    ptx = b"// host-executor module\n.visible .entry mine(.param .u64 a, .param .u32 b)\n"
    module, library = c_u64(), c_u64()
    check(cu.cuModuleLoadData(ctypes.byref(module), ptx), "load")
    check(cu.cuLibraryLoadData(ctypes.byref(library), ptx, None, None, 0, None, None, 0), "library")
    count = ctypes.c_uint()
    check(cu.cuModuleGetFunctionCount(ctypes.byref(count), module), "function count")
    functions = (c_u64 * count.value)()
    check(cu.cuModuleEnumerateFunctions(functions, count.value, module), "enumerate functions")
    name = ctypes.c_char_p()
    names = []
    for f in functions:
        check(cu.cuFuncGetName(ctypes.byref(name), c_u64(f)), "function name")
        names.append(name.value.decode())
    say("functions", f"{count.value} {'mine' in names} {'fill_u32' in names}")
    mine = functions[names.index("mine")]
    by_name = c_u64()
    check(cu.cuModuleGetFunction(ctypes.byref(by_name), module, b"mine"), "by name")
    say("same_handle_as_by_name", mine == by_name.value)
    first, again = ctypes.c_char_p(), ctypes.c_char_p()
    check(cu.cuFuncGetName(ctypes.byref(first), c_u64(mine)), "name")
    check(cu.cuFuncGetName(ctypes.byref(again), c_u64(mine)), "name again")
    say("name_kept", ctypes.cast(first, ctypes.c_void_p).value == ctypes.cast(again, ctypes.c_void_p).value)
    params = c_u64()
    say("param_count", f"{cu13.cuFuncGetParamCount(c_u64(mine), ctypes.byref(params))} {params.value}")
    state = ctypes.c_int()
    say("loaded", f"{cu.cuFuncIsLoaded(ctypes.byref(state), c_u64(mine))} {state.value}")
    say("load", cu.cuFuncLoad(c_u64(mine)))
    check(cu.cuLibraryGetKernelCount(ctypes.byref(count), library), "kernel count")
    kernels = (c_u64 * 2)()
    say("enumerate_two_kernels", cu.cuLibraryEnumerateKernels(kernels, 2, library))
    kernel_names = []
    for k in kernels:
        check(cu.cuKernelGetName(ctypes.byref(name), c_u64(k)), "kernel name")
        kernel_names.append(name.value.decode())
    owner = c_u64()
    check(cu.cuKernelGetLibrary(ctypes.byref(owner), c_u64(kernels[0])), "kernel library")
    say("kernels", f"{count.value == len(functions)} {len(set(kernel_names))} {owner.value == library.value}")
    say("kernel_param_count", f"{cu13.cuKernelGetParamCount(c_u64(kernels[0]), ctypes.byref(params))}")
    rc, buf = alloc(4096)
    check(rc, "alloc")
    fill = functions[names.index("fill_u32")]
    ptr, value, n = c_u64(buf), ctypes.c_uint32(9), ctypes.c_uint32(16)
    args = (ctypes.c_void_p * 3)(*map(ctypes.addressof, (ptr, value, n)))
    check(cu.cuLaunchKernel(c_u64(fill), 1, 1, 1, 16, 1, 1, 0, c_u64(0), args, None), "launch enumerated")
    check(cu.cuCtxSynchronize(), "sync")
    say("enumerated_launch", memoryview(dtoh(buf, 64)[1]).cast("I")[15])
    say("foreign_module", cu.cuModuleGetFunctionCount(ctypes.byref(count), c_u64(0x1234)))
    say("foreign_name", cu.cuKernelGetName(ctypes.byref(name), c_u64(0x1234)))


def scenario_native_dispatch():
    """The calls a training loop repeats — launches of a kernel launched before, event records and
    waits, stream and event synchronises and queries — answered as always (the worker serves them in
    its native loop once a kernel has been launched), errors and kernel output included."""
    setup()
    module, fill, printf = c_u64(), c_u64(), c_u64()
    check(cu.cuModuleLoadData(ctypes.byref(module), b"// host-executor module\n"), "load")
    check(cu.cuModuleGetFunction(ctypes.byref(fill), module, b"fill_u32"), "fill")
    check(cu.cuModuleGetFunction(ctypes.byref(printf), module, b"printf_u32"), "printf")
    rc, buf = alloc(4096)
    check(rc, "alloc")
    stream, event = c_u64(), c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 0), "stream")
    check(cu.cuEventCreate(ctypes.byref(event), 0), "event")
    ptr, value, n = c_u64(buf), ctypes.c_uint32(0), ctypes.c_uint32(64)
    params = (ctypes.c_void_p * 3)(*map(ctypes.addressof, (ptr, value, n)))

    def launch(func, params, on, block=64):
        return cu.cuLaunchKernel(func, 1, 1, 1, block, 1, 1, 0, on, params, None)

    for i in range(1, 501):
        value.value = i
        check(launch(fill, params, stream), "launch")
        if i % 250 == 0:
            check(cu.cuEventRecord(event, stream), "record")
            check(cu.cuStreamWaitEvent(c_u64(0), event, 0), "wait")
            # synchronised first: a query right after the record may say NOT_READY (natively, with work
            # queued before it; remotely, also while the shim still holds the record), which is no answer to compare
            say(f"event_sync_{i}", cu.cuEventSynchronize(event))
            say(f"event_query_{i}", cu.cuEventQuery(event))
    say("stream_sync", cu.cuStreamSynchronize(stream))
    say("stream_query", cu.cuStreamQuery(stream))
    rc, back = dtoh(buf, 256)
    words = list(memoryview(back).cast("I"))
    say("last_launch_wrote", f"{words[0]} {words[63]}")
    wild = c_u64(0x7E0000000000)  # not memory of this lease: the kernel faults
    wild_params = (ctypes.c_void_p * 3)(*map(ctypes.addressof, (wild, value, n)))
    say("wild_launch", launch(fill, wild_params, stream))  # asynchronous: the error comes later
    say("sync_after_wild", cu.cuStreamSynchronize(stream))
    say("sync_again", cu.cuCtxSynchronize())
    check(cu.cuStreamDestroy(stream), "destroy stream")
    say("launch_on_destroyed_stream", launch(fill, params, stream))
    say("sync_after_destroyed_stream", cu.cuCtxSynchronize())
    say("query_destroyed_stream", cu.cuStreamQuery(stream))
    check(cu.cuEventDestroy(event), "destroy event")
    say("query_destroyed_event", cu.cuEventQuery(event))
    say("record_destroyed_event", cu.cuEventRecord(event, c_u64(0)))
    say("sync_after_destroyed_event", cu.cuCtxSynchronize())
    for k in (1, 2):
        value.value = k
        check(launch(printf, (ctypes.c_void_p * 1)(ctypes.addressof(value)), c_u64(0), 1), "printf")
    print("printed before sync", flush=True)
    check(cu.cuCtxSynchronize(), "sync")
    print("printed after sync", flush=True)


def scenario_shared_copy_once():
    """One synchronous copy of SHM_COPY_MIB MiB (0: none) from pageable memory, through the memory shared
    with a worker on this host, in pieces; whether its bytes landed."""
    setup()
    size = int(os.environ["SHM_COPY_MIB"]) << 20
    rc, dev = alloc(max(size, 4096))
    check(rc, "alloc")
    data = os.urandom(size)
    if size:
        check(cu.cuMemcpyHtoD(c_u64(dev), ctypes.create_string_buffer(data, size), c_u64(size)), "htod")
    check(cu.cuCtxSynchronize(), "sync")
    say("landed", dtoh(dev, 4096)[1] == data[:4096] if size else True)


def scenario_shared_copies():
    """Large copies (through memory the worker shares with this process when it runs on this host):
    every byte lands, synchronous and on a stream, at odd offsets and sizes, and a copy larger than
    that memory in parts."""
    setup()
    sizes = [256 << 10, (1 << 20) + 1, 67 << 20]
    rc, dev = alloc(sizes[-1] + (1 << 20))
    check(rc, "alloc")
    equal = []
    for size in sizes:
        data = os.urandom(size)
        check(cu.cuMemcpyHtoD(c_u64(dev), ctypes.create_string_buffer(data, size), c_u64(size)), "htod")
        rc, back = dtoh(dev, size)
        check(rc, "dtoh")
        equal.append(back == data)
    say("sizes", " ".join(map(str, sizes)))
    say("htod_dtoh_equal", " ".join(map(str, equal)))
    stream = c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 0), "stream")
    data = os.urandom(3 << 20)
    back = ctypes.create_string_buffer(len(data))
    check(cu.cuMemcpyHtoDAsync(c_u64(dev), ctypes.create_string_buffer(data, len(data)), c_u64(len(data)), stream),
          "htod async")  # fmt: skip
    check(cu.cuMemcpyDtoHAsync(back, c_u64(dev), c_u64(len(data)), stream), "dtoh async")
    check(cu.cuStreamSynchronize(stream), "sync")
    say("async_equal", back.raw == data)
    rc, part = dtoh(dev + 12345, 1 << 20)
    say("offset_equal", rc == 0 and part == data[12345 : 12345 + (1 << 20)])
    past = ctypes.create_string_buffer(1 << 20)
    say("past_allocation", cu.cuMemcpyHtoD(c_u64(dev + sizes[-1] + (1 << 20) - 4096), past, c_u64(1 << 20)))


def scenario_lanes():
    """Copies large enough to be striped across connections when the data connection is encrypted:
    every byte lands, both ways, synchronous and on a stream, at an odd size and offset; a refused
    copy says so and the connection goes on."""
    setup()
    big = (40 << 20) + 3
    rc, dev = alloc(big + (1 << 20))
    check(rc, "alloc")
    data = os.urandom(big)
    say("htod", cu.cuMemcpyHtoD(c_u64(dev), ctypes.create_string_buffer(data, big), c_u64(big)))
    rc, back = dtoh(dev, big)
    say("dtoh", rc)
    say("both_ways_equal", back == data)
    rc, part = dtoh(dev + 12345, 17 << 20)
    say("offset_equal", rc == 0 and part == data[12345 : 12345 + (17 << 20)])
    reads = [dtoh(dev + at, 16 << 20) for at in range(0, 8 << 20, 1 << 20)]  # the lanes' requests at once
    say("reads_equal", all(rc == 0 and got == data[at : at + (16 << 20)]
                           for at, (rc, got) in zip(range(0, 8 << 20, 1 << 20), reads, strict=True)))  # fmt: skip
    stream = c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 0), "stream")
    more = os.urandom(20 << 20)
    back = ctypes.create_string_buffer(len(more))
    say("htod_async", cu.cuMemcpyHtoDAsync(c_u64(dev + 4096), ctypes.create_string_buffer(more, len(more)),
                                            c_u64(len(more)), stream))  # fmt: skip
    say("dtoh_async", cu.cuMemcpyDtoHAsync(back, c_u64(dev + 4096), c_u64(len(more)), stream))
    say("stream_sync", cu.cuStreamSynchronize(stream))
    say("async_equal", back.raw == more)
    past = ctypes.create_string_buffer(17 << 20)
    say("dtoh_past_allocation", cu.cuMemcpyDtoH(past, c_u64(dev + big), c_u64(17 << 20)))
    say("htod_past_allocation", cu.cuMemcpyHtoD(c_u64(dev + big), past, c_u64(17 << 20)))
    say("sync_after", cu.cuCtxSynchronize())
    rc, again = dtoh(dev, 1 << 20)
    say("still_works", rc == 0 and again == data[:4096] + more[: (1 << 20) - 4096])


def scenario_lanes_pinned():
    """Copies to the device from page-locked memory large enough for the lanes, which return before their pieces
    have gone (the worker queues them; the stream orders them): four in flight on one stream then a memset over
    the first's start, a copy whose page-locked source is freed right after the call, and a buffer refilled
    after a synchronise and copied again. Says whether the device holds what stream order gives."""
    setup()
    size, n = 12 << 20, 4
    rc, dev = alloc(size * (n + 1))
    check(rc, "alloc")
    stream = c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 0), "stream")
    sources, data = [], []
    for _ in range(n):
        pinned = c_u64()
        check(cu.cuMemAllocHost(ctypes.byref(pinned), c_u64(size)), "alloc host")
        data.append(os.urandom(size))
        ctypes.memmove(pinned.value, data[-1], size)
        sources.append(pinned.value)
    for k in range(n):
        check(cu.cuMemcpyHtoDAsync(c_u64(dev + k * size), c_u64(sources[k]), c_u64(size), stream), "copy")
    check(cu.cuMemsetD8Async(c_u64(dev), 0x5A, c_u64(4096), stream), "memset after the first copy")
    say("in_flight_sync", cu.cuStreamSynchronize(stream))
    expected = [b"\x5a" * 4096 + data[0][4096:], *data[1:]]
    say("in_flight_equal", all(dtoh(dev + k * size, size)[1] == expected[k] for k in range(n)))
    gone = os.urandom(size)
    ctypes.memmove(sources[0], gone, size)
    check(
        cu.cuMemcpyHtoDAsync(c_u64(dev + n * size), c_u64(sources[0]), c_u64(size), stream), "copy, then free"
    )
    say("freed_at_once", cu.cuMemFreeHost(c_u64(sources[0])))
    say("freed_sync", cu.cuStreamSynchronize(stream))
    say("freed_equal", dtoh(dev + n * size, size)[1] == gone)
    again = os.urandom(size)
    ctypes.memmove(sources[1], again, size)  # after the synchronise: the earlier copy has read it
    check(cu.cuMemcpyHtoDAsync(c_u64(dev + size), c_u64(sources[1]), c_u64(size), stream), "copy again")
    say("again_sync", cu.cuStreamSynchronize(stream))
    say("again_equal", dtoh(dev + size, size)[1] == again)
    for pinned in sources[1:]:
        check(cu.cuMemFreeHost(c_u64(pinned)), "free host")


def scenario_held_frames():
    """Work that wants no answer, then a wait on the host alone: a memset and a host function queued on a
    stream, and no CUDA call until the host function has run (as a program waiting on a worker thread, or on
    another process). Frames held to go together must reach the worker without a later call. Says whether
    the host function ran, within how long, and what the memset wrote."""
    setup()
    rc, dev = alloc(64)
    check(rc, "alloc")
    stream = c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 0), "stream")
    ran = threading.Event()
    keep = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda data: ran.set())
    started = time.monotonic()
    check(cu.cuMemsetD8Async(c_u64(dev), 0x3C, c_u64(64), stream), "memset")
    check(cu.cuLaunchHostFunc(stream, keep, None), "host function")
    say("ran_without_a_call", ran.wait(20))
    say("within_s", f"{time.monotonic() - started:.1f}")
    check(cu.cuStreamSynchronize(stream), "sync")
    say("memset", dtoh(dev, 4)[1].hex())


def scenario_held_sends():
    """1000 memsets that want no answer, then a synchronise, and what the last memset wrote (the shim's
    profile, at exit, says in how many sends the connection's frames went)."""
    setup()
    rc, dev = alloc(64)
    check(rc, "alloc")
    for i in range(1000):
        check(cu.cuMemsetD8Async(c_u64(dev), i % 256, c_u64(64), None), "memset")
    check(cu.cuCtxSynchronize(), "sync")
    say("memset", dtoh(dev, 4)[1].hex())


def scenario_answered_beside_copies():
    """300 rounds of a memset, a record and its event's synchronise on a stream, with a copy into page-locked
    memory every 50 (which opens the process's callback connection across hosts, and whose bytes must be in
    place when the stream's synchronise returns): how many copies lacked the memset's bytes, and how many
    synchronises failed."""
    setup()
    n = MiB  # long enough to land that a reply ahead of its bytes is seen
    rc, dev = alloc(n)
    check(rc, "alloc")
    pinned, stream, event = c_u64(), c_u64(), c_u64()
    check(cu.cuMemAllocHost(ctypes.byref(pinned), c_u64(n)), "pinned")
    check(cu.cuStreamCreate(ctypes.byref(stream), 1), "stream")
    check(cu.cuEventCreate(ctypes.byref(event), 2), "event")
    wrong = failed = 0
    for i in range(300):
        check(cu.cuMemsetD8Async(c_u64(dev), i % 251, c_u64(n), stream), "memset")
        if i % 50 == 0:
            ctypes.memset(pinned.value, 0xEE, n)
            check(cu.cuMemcpyDtoHAsync(pinned, c_u64(dev), c_u64(n), stream), "dtoh async")
            failed += cu.cuStreamSynchronize(stream) != 0
            wrong += ctypes.string_at(pinned.value, n) != bytes([i % 251]) * n
        check(cu.cuEventRecord(event, stream), "record")
        failed += cu.cuEventSynchronize(event) != 0
    say("wrong", wrong)
    say("failed", failed)


def scenario_query_after_record():
    """200 rounds of a memset, a record behind it and queries of the event until it is done (CuPy's pinned
    pool queries each event right after recording it): how many first queries said NOT_READY, how many
    rounds never saw the event done within 5 s, and how many copies back after it was done lacked the
    memset's bytes (the shim's profile, at exit, says how many queries went to the worker)."""
    setup()
    rc, dev = alloc(64)
    check(rc, "alloc")
    stream, event = c_u64(), c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 1), "stream")
    check(cu.cuEventCreate(ctypes.byref(event), 2), "event")  # CU_EVENT_DISABLE_TIMING, as CuPy's pool
    not_ready_first = stuck = wrong = 0
    for i in range(200):
        check(cu.cuMemsetD8Async(c_u64(dev), i % 256, c_u64(64), stream), "memset")
        check(cu.cuEventRecord(event, stream), "record")
        rc = cu.cuEventQuery(event)
        not_ready_first += rc == 600  # CUDA_ERROR_NOT_READY
        deadline = time.monotonic() + 5
        while rc == 600 and time.monotonic() < deadline:
            rc = cu.cuEventQuery(event)
        if rc != 0:
            stuck += 1
            continue
        wrong += dtoh(dev, 4)[1] != bytes([i % 256]) * 4
    say("not_ready_first", not_ready_first)
    say("stuck", stuck)
    say("wrong", wrong)
    gone = (
        c_u64()
    )  # recorded behind a memset, then destroyed while both may still be held: the worker refuses it
    check(cu.cuEventCreate(ctypes.byref(gone), 2), "event")
    check(cu.cuMemsetD8Async(c_u64(dev), 1, c_u64(64), stream), "memset")
    check(cu.cuEventRecord(gone, stream), "record")
    check(cu.cuEventDestroy(gone), "destroy")
    say("destroyed_query", cu.cuEventQuery(gone))


def scenario_held_threads():
    """Four threads, each 2000 memsets of its own memory that want no answer, a copy back every 50th call (sent
    at once, with what is held), short pauses between (so the shim's flusher sends some of the held frames
    while the threads go on): how many calls failed or copied back other bytes than the memset just before
    them wrote, and each thread's last bytes after a synchronise."""
    ctx = setup()
    buffers = []
    for _ in range(4):
        rc, dev = alloc(64)
        check(rc, "alloc")
        buffers.append(dev)
    results = {}

    def run(k: int) -> None:
        check(cu.cuCtxSetCurrent(ctx), "current")
        bad = 0
        for i in range(2000):
            bad += cu.cuMemsetD8Async(c_u64(buffers[k]), i % 256, c_u64(64), None) != 0
            if i % 50 == 49:  # a copy back, sent at once: it must find the memset held just before it done
                rc, data = dtoh(buffers[k], 4)
                bad += rc != 0 or data != bytes([i % 256]) * 4
            until = time.perf_counter() + (i % 7) * 5e-6
            while time.perf_counter() < until:
                pass
        results[k] = bad

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(cu.cuCtxSynchronize(), "sync")
    say("failed_calls", sum(results.values()))
    say("last", " ".join(dtoh(dev, 4)[1].hex() for dev in buffers))


def scenario_ipc_event_producer():
    """Memory and an interprocess event shared with another process of the lease: a memset on a stream, then
    the event recorded behind it. Once the record call returns, the other process that waits on the event
    must find the memset's bytes (PyTorch's CUDA tensors shared between processes: the producer records,
    the consumer waits). Prints the two handles, then "recorded" at the first line on stdin."""
    setup()
    rc, dev = alloc(64)
    check(rc, "alloc")
    check(cu.cuMemsetD8(c_u64(dev), 0, c_u64(64)), "zero")
    stream, event = c_u64(), c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 1), "stream")
    check(cu.cuEventCreate(ctypes.byref(event), 6), "event")  # DISABLE_TIMING | INTERPROCESS
    memory, handle = ctypes.create_string_buffer(64), ctypes.create_string_buffer(64)
    check(cu.cuIpcGetMemHandle(memory, c_u64(dev)), "get memory handle")
    check(cu.cuIpcGetEventHandle(handle, event), "get event handle")
    say("handles", f"{memory.raw.hex()} {handle.raw.hex()}")
    sys.stdin.readline()
    if os.environ.get("IPC_SLOW_PRODUCER"):  # a long kernel first: the record is done only after it
        module, sleep = c_u64(), c_u64()
        check(cu.cuModuleLoadData(ctypes.byref(module), b"// module\n"), "load")
        check(cu.cuModuleGetFunction(ctypes.byref(sleep), module, b"sleep_ms"), "sleep_ms")
        ms = ctypes.c_uint32(200)
        params = (ctypes.c_void_p * 1)(ctypes.addressof(ms))
        check(cu.cuLaunchKernel(sleep, 1, 1, 1, 1, 1, 1, 0, stream, params, None), "launch")
    check(cu.cuMemsetD8Async(c_u64(dev), 0x3C, c_u64(64), stream), "memset")
    check(cu.cuEventRecord(event, stream), "record")
    say("recorded", 1)
    sys.stdin.readline()  # the other process has looked


def scenario_idle_synchronise():
    """Synchronisations with nothing to wait for, as a read-back into pageable memory and a benchmark's loop make
    them (a copy back to pageable memory, then a synchronise of its stream; a synchronise, then another),
    and ones that must still ask: after a memset sent and not waited for, after a host function, and
    after a kernel that faults (its error must be reported by the synchronise)."""
    setup()
    rc, dev = alloc(4096)
    check(rc, "alloc")
    check(cu.cuMemsetD8(c_u64(dev), 7, c_u64(4096)), "memset")
    stream = c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 1), "stream")  # non-blocking
    for _ in range(6):
        check(cu.cuCtxSynchronize(), "context sync")
    word = ctypes.create_string_buffer(4)
    block = ctypes.create_string_buffer(64 << 10)
    rc, big = alloc(64 << 10)
    check(rc, "alloc 64 KiB")
    items, blocks = [], []
    for i in range(
        10
    ):  # a read-back: work on the stream, a copy to pageable memory, the stream's synchronise
        check(cu.cuMemsetD8Async(c_u64(dev), 0x10 + i, c_u64(4096), stream), "memset")
        check(cu.cuMemcpyDtoHAsync(word, c_u64(dev), c_u64(4), stream), "copy back")
        check(cu.cuStreamSynchronize(stream), "stream sync")
        items.append(word.raw[0])
    say("items", items == [0x10 + i for i in range(10)])
    say("query_idle", cu.cuStreamQuery(stream))
    for i in range(3):  # 64 KiB: through the memory shared with a worker on this host, where there is one
        check(cu.cuMemsetD8Async(c_u64(big), 0x20 + i, c_u64(64 << 10), stream), "memset 64 KiB")
        check(cu.cuMemcpyDtoHAsync(block, c_u64(big), c_u64(64 << 10), stream), "copy 64 KiB back")
        check(cu.cuStreamSynchronize(stream), "stream sync after 64 KiB")
        blocks.append(block.raw[-1])
    say("blocks", blocks == [0x20, 0x21, 0x22])
    for i in range(3):  # 64 KiB to the device, from pageable memory, then the stream's synchronise
        ctypes.memset(block, 0x30 + i, 64 << 10)
        check(cu.cuMemcpyHtoDAsync(c_u64(big), block, c_u64(64 << 10), stream), "copy 64 KiB in")
        check(cu.cuStreamSynchronize(stream), "stream sync after 64 KiB in")
    check(cu.cuMemcpyDtoH(word, c_u64(big + (64 << 10) - 4), c_u64(4)), "read it back")
    say("copied_in", word.raw.hex())
    check(cu.cuMemsetD8Async(c_u64(dev), 9, c_u64(4096), stream), "memset on the stream")
    check(cu.cuStreamSynchronize(stream), "sync after work")
    check(cu.cuMemcpyDtoH(word, c_u64(dev), c_u64(4)), "read")
    say("after_memset", word.raw.hex())
    ran = []
    callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda data: ran.append(1))
    check(cu.cuLaunchHostFunc(stream, callback, None), "host function")
    check(cu.cuStreamSynchronize(stream), "sync after host function")
    say("host_function_ran", len(ran))
    module, fn = c_u64(), c_u64()
    check(cu.cuModuleLoadData(ctypes.byref(module), b"// module\n"), "load")
    check(cu.cuModuleGetFunction(ctypes.byref(fn), module, b"fault"), "function")
    check(cu.cuStreamSynchronize(stream), "idle again")
    check(cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, None, None), "launch")
    say("fault_reported", cu.cuStreamSynchronize(stream))


def scenario_trap_in_a_child_process():
    """The parent holds 5/8 of the partition (PARTITION_MIB, default 64) with a value in it; a child process of
    the same lease asks for 5/8 too, then 1/4, then runs a kernel that asserts (CUDA_ERROR_ASSERT, sticky)
    and exits. Then the parent synchronises, reads its value, launches, and asks for 15/16 of the partition
    once the child is gone."""
    setup()
    partition = int(os.environ.get("PARTITION_MIB", "64")) * MiB
    rc, mine = alloc(partition * 5 // 8)
    check(rc, "parent's 5/8")
    check(cu.cuMemsetD32(c_u64(mine), 0x1234, c_u64(1)), "parent's value")
    child = subprocess.run(
        [sys.executable, __file__, "trap_child"], capture_output=True, text=True, timeout=60
    )
    sys.stderr.write(child.stderr)
    for line in child.stdout.splitlines():
        name, value = line.split(" ", 1)
        say("child_" + name, value)
    say("parent_sync", cu.cuCtxSynchronize())
    rc, back = dtoh(mine, 4)
    say("parent_value", f"{rc} {back.hex()}")
    fill = module_function(b"fill_u32")
    values = (c_u64(mine), ctypes.c_uint32(7), ctypes.c_uint32(1))  # kept alive until the launch is sent
    params = (ctypes.c_void_p * 3)(*(ctypes.addressof(v) for v in values))
    say("parent_launch", cu.cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, c_u64(0), params, None))
    say("parent_sync_after_launch", cu.cuCtxSynchronize())
    check(cu.cuMemFree(c_u64(mine)), "free")
    say("parent_alloc_most", alloc(partition * 15 // 16)[0])


def scenario_trap_child():
    """trap_in_a_child_process's child: more than the partition's rest, the rest, then a kernel that asserts."""
    setup()
    partition = int(os.environ.get("PARTITION_MIB", "64")) * MiB
    say("alloc_past_the_rest", alloc(partition * 5 // 8)[0])
    say("alloc_a_quarter", alloc(partition // 4)[0])
    trap = module_function(b"trap")
    say("trap_launch", cu.cuLaunchKernel(trap, 1, 1, 1, 1, 1, 1, 0, c_u64(0), None, None))
    say("sync_after_trap", cu.cuCtxSynchronize())


def scenario_mirrored_read_from_a_host_thread():
    """Page-locked memory a kernel wrote through its device pointer, and managed memory, read by host threads
    that never made a CUDA call (no current context, as PyTorch's parallel loops read a tensor): natively they
    need none. Also written by such a thread and read by a kernel. Prints how many words each saw right."""
    setup()
    n = 1 << 20
    fill = module_function(b"fill_u32")
    pinned, managed = ctypes.c_uint64(), c_u64()
    check(cu.cuMemHostAlloc(ctypes.byref(pinned), c_u64(4 * n), 0), "page-locked")
    dev = c_u64()
    check(cu.cuMemHostGetDevicePointer(ctypes.byref(dev), c_u64(pinned.value), 0), "its device pointer")
    check(cu.cuMemAllocManaged(ctypes.byref(managed), c_u64(4 * n), 1), "managed")
    for name, ptr, host, value in (
        ("pinned", dev.value, pinned.value, 7),
        ("managed", managed.value, managed.value, 9),
    ):
        values = (c_u64(ptr), ctypes.c_uint32(value), ctypes.c_uint32(n))
        params = (ctypes.c_void_p * 3)(*(ctypes.addressof(v) for v in values))
        check(cu.cuLaunchKernel(fill, n // 256, 1, 1, 256, 1, 1, 0, c_u64(0), params, None), "fill")
        check(cu.cuCtxSynchronize(), "sync")
        seen = {}

        def read(host=host, value=value, seen=seen):  # no CUDA call in this thread: no current context
            words = (ctypes.c_uint32 * n).from_address(host)
            seen["right"] = sum(1 for w in words if w == value)
            ctypes.memset(host, 0, 4 * n)  # and a write the next kernel reads

        thread = threading.Thread(target=read)
        thread.start()
        thread.join()
        say(f"{name}_read_in_a_thread", seen["right"])
        add = module_function(b"add_u32")
        values = (c_u64(ptr), ctypes.c_uint32(1), ctypes.c_uint32(n))
        params = (ctypes.c_void_p * 3)(*(ctypes.addressof(v) for v in values))
        check(cu.cuLaunchKernel(add, n // 256, 1, 1, 256, 1, 1, 0, c_u64(0), params, None), "add")
        check(cu.cuCtxSynchronize(), "sync")
        say(f"{name}_after_thread_write", sum(1 for w in (ctypes.c_uint32 * n).from_address(host) if w == 1))


def scenario_synchronise_after_pauses():
    """Four context synchronises with nothing sent between them, each after a pause of 200 ms."""
    setup()
    for _ in range(4):
        time.sleep(0.2)
        check(cu.cuCtxSynchronize(), "context sync")
    say("synchronised", 4)


def scenario_mapped_store_producer():
    """A host store into mapped memory while the device may be running, then a synchronising call
    (SYNC_CALL: event_query, event_sync, stream_query, stream_sync or ctx_sync) and no device work: natively
    the store is in the memory the device sees (a kernel spinning on it is released: XLA's GPU timer).
    The memory's device side is handed to another process of the lease (IPC) to look. Prints the
    handles, then "synchronised" at the first line on stdin."""
    setup()
    module, fn = c_u64(), c_u64()
    check(cu.cuModuleLoadData(ctypes.byref(module), b"// module\n"), "load")
    check(cu.cuModuleGetFunction(ctypes.byref(fn), module, b"fill_u32"), "function")
    mapped, dev = c_u64(), c_u64()
    check(cu.cuMemHostAlloc(ctypes.byref(mapped), c_u64(4096), 0x02), "host alloc mapped")  # DEVICEMAP
    check(cu.cuMemHostGetDevicePointer(ctypes.byref(dev), mapped, 0), "device pointer")
    ptr, value, count = c_u64(dev.value), ctypes.c_uint32(0x11111111), ctypes.c_uint32(1024)
    params = (ctypes.c_void_p * 3)(ctypes.addressof(ptr), ctypes.addressof(value), ctypes.addressof(count))
    stream, event = c_u64(), c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 1), "stream")  # non-blocking, as XLA's
    check(cu.cuLaunchKernel(fn, 4, 1, 1, 256, 1, 1, 0, stream, params, None), "fill")
    check(cu.cuEventCreate(ctypes.byref(event), 6), "event")  # DISABLE_TIMING | INTERPROCESS
    check(cu.cuEventRecord(event, stream), "record")
    memory, handle = ctypes.create_string_buffer(64), ctypes.create_string_buffer(64)
    check(cu.cuIpcGetMemHandle(memory, dev), "get memory handle")
    check(cu.cuIpcGetEventHandle(handle, event), "get event handle")
    say("handles", f"{memory.raw.hex()} {handle.raw.hex()}")
    sys.stdin.readline()
    words = (ctypes.c_uint32 * 1024).from_address(mapped.value)
    words[0] = 0x2A2A2A2A  # the store a kernel on the device would be waiting for
    calls = {
        "event_query": lambda: cu.cuEventQuery(event),
        "event_sync": lambda: cu.cuEventSynchronize(event),
        "stream_query": lambda: cu.cuStreamQuery(stream),
        "stream_sync": lambda: cu.cuStreamSynchronize(stream),
        "ctx_sync": lambda: cu.cuCtxSynchronize(),
    }
    check(calls[os.environ["SYNC_CALL"]](), "synchronise")
    say("synchronised", f"{words[0]:08x}")
    sys.stdin.readline()  # the other process has looked


def scenario_ipc_event_consumer():
    """The other side: opens IPC_HANDLES (memory, event); at each line on stdin waits on the event on its
    own stream and says the memory's first bytes."""
    setup()

    class Handle(ctypes.Structure):  # CUipcMemHandle / CUipcEventHandle: 64 bytes, passed by value
        _fields_ = [("reserved", ctypes.c_ubyte * 64)]

    memory, event = (Handle.from_buffer_copy(bytes.fromhex(h)) for h in os.environ["IPC_HANDLES"].split())
    ptr, opened = c_u64(), c_u64()
    open_memory, open_event = cu.cuIpcOpenMemHandle, cu.cuIpcOpenEventHandle
    open_memory.argtypes = [ctypes.POINTER(c_u64), Handle, ctypes.c_uint]
    open_event.argtypes = [ctypes.POINTER(c_u64), Handle]
    check(open_memory(ctypes.byref(ptr), memory, 1), "open memory")
    check(open_event(ctypes.byref(opened), event), "open event")
    say("opened", 1)
    for line in sys.stdin:
        check(cu.cuStreamWaitEvent(c_u64(0), opened, 0), "wait")
        say(line.strip(), dtoh(ptr.value, 4)[1].hex())


def scenario_ipc_export():
    """Allocate, fill, hand out an IPC handle (one line), wait for stdin, then show what is there now
    (IPC_FREE: free it instead, then say what the lease uses at each line `used`; exit at another)."""
    setup()
    size = int(
        os.environ.get("IPC_BYTES", "4096")
    )  # a small allocation shares its pages; a large one has its own
    rc, ptr = alloc(size)
    check(rc, "alloc")
    check(cu.cuMemcpyHtoD(c_u64(ptr), bytes(range(256)) * (size // 256), c_u64(size)), "fill")
    handle = ctypes.create_string_buffer(64)
    check(cu.cuIpcGetMemHandle(handle, c_u64(ptr)), "get handle")
    event, event_handle = c_u64(), ctypes.create_string_buffer(64)
    check(cu.cuEventCreate(ctypes.byref(event), 6), "event")  # DISABLE_TIMING | INTERPROCESS
    check(cu.cuEventRecord(event, c_u64(0)), "record")
    check(cu.cuIpcGetEventHandle(event_handle, event), "get event handle")
    say("handle", handle.raw.hex())
    say("event_handle", event_handle.raw.hex())
    sys.stdin.readline()
    if "IPC_FREE" in os.environ:  # freed while another process may hold it open; then, at each line
        say("freed", cu.cuMemFree(c_u64(ptr)))  # "used", what the lease uses, until another line ends it
        while sys.stdin.readline().strip() == "used":
            say("used_mib", _used_mib())
        return
    rc, data = dtoh(ptr, size)
    say("after_import", data[:4].hex() if data == b"\xab" * size else "not all the importer's")
    say("event_after_import", cu.cuEventQuery(event))  # the importer's destroy closed only its own


def scenario_ipc_import():
    """With memory of its own first (its worker's window is made), open the handle in IPC_HANDLE, check what
    the exporter wrote, overwrite it, close. IPC_HOLD: hold it open until stdin says the exporter has exited,
    and say how much memory the lease uses then and after the close."""
    setup()
    check(alloc(4096)[0], "alloc its own")
    handle = bytes.fromhex(os.environ["IPC_HANDLE"])
    ptr = c_u64()

    class Handle(ctypes.Structure):  # CUipcMemHandle: 64 bytes, passed by value
        _fields_ = [("reserved", ctypes.c_ubyte * 64)]

    opened = cu.cuIpcOpenMemHandle
    opened.argtypes = [ctypes.POINTER(c_u64), Handle, ctypes.c_uint]
    rc = opened(ctypes.byref(ptr), Handle.from_buffer_copy(handle), 1)  # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
    say("open", rc)
    if rc == 0:
        size = int(os.environ.get("IPC_BYTES", "4096"))
        rc, data = dtoh(ptr.value, size)
        say("sees_export", data == bytes(range(256)) * (size // 256))
        check(cu.cuMemcpyHtoD(ptr, b"\xab" * size, c_u64(size)), "overwrite")
        if "IPC_HOLD" in os.environ:  # held open while the exporter frees its memory and exits
            say("holding", 1)
            sys.stdin.readline()
            time.sleep(0.5)  # the exporter's worker has let go of what its process left by then
            say("used_mib_after_exporter_left", _used_mib())
        say("close", cu.cuIpcCloseMemHandle(ptr))
        say("closed_twice", cu.cuIpcCloseMemHandle(ptr))
        if "IPC_HOLD" in os.environ:
            say("used_mib_after_close", _used_mib())
    if "IPC_EVENT_HANDLE" in os.environ:
        event = c_u64()
        open_event = cu.cuIpcOpenEventHandle
        open_event.argtypes = [ctypes.POINTER(c_u64), Handle]
        rc = open_event(
            ctypes.byref(event), Handle.from_buffer_copy(bytes.fromhex(os.environ["IPC_EVENT_HANDLE"]))
        )
        say("event_open", rc)
        if rc == 0:
            say("event_wait", cu.cuStreamWaitEvent(c_u64(0), event, 0))
            say("event_destroy", cu.cuEventDestroy(event))


class PoolProps(ctypes.Structure):  # CUmemPoolProps
    _fields_ = [
        ("alloc_type", ctypes.c_int),
        ("handle_types", ctypes.c_int),
        ("location_type", ctypes.c_int),
        ("location_id", ctypes.c_int),
        ("win32", ctypes.c_void_p),
        ("max_size", ctypes.c_size_t),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 54),
    ]


def scenario_pool_export():
    """A pool made for sharing: allocate from it, export the pool (a file descriptor) and the pointer,
    let a child process of the lease import both, read and overwrite; then see its write."""
    setup()
    pool, ptr, fd = c_u64(), c_u64(), ctypes.c_int(-1)
    props = PoolProps(1, 1, 1, 0)  # pinned, POSIX file descriptor, device 0
    check(cu.cuMemPoolCreate(ctypes.byref(pool), ctypes.byref(props)), "pool create")
    check(cu.cuMemAllocFromPoolAsync(ctypes.byref(ptr), c_u64(4096), pool, c_u64(0)), "alloc from pool")
    check(cu.cuMemcpyHtoD(ptr, b"\x5a" * 4096, c_u64(4096)), "fill")
    check(cu.cuMemPoolExportToShareableHandle(ctypes.byref(fd), pool, 1, c_u64(0)), "export pool")
    data = ctypes.create_string_buffer(64)
    check(cu.cuMemPoolExportPointer(data, ptr), "export pointer")
    env = {**os.environ, "POOL_FD": str(fd.value), "POOL_DATA": data.raw.hex()}
    child = subprocess.run([sys.executable, __file__, "pool_import"], env=env, pass_fds=(fd.value,),
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    sys.stdout.write(child.stdout)
    say("after_import", dtoh(ptr.value, 4)[1].hex())
    say("free", cu.cuMemFreeAsync(ptr, c_u64(0)))
    say("destroy", cu.cuMemPoolDestroy(pool))


def scenario_pool_import():
    setup()
    pool, ptr = c_u64(), c_u64()
    fd = int(os.environ["POOL_FD"])
    say(
        "import_pool",
        cu.cuMemPoolImportFromShareableHandle(ctypes.byref(pool), ctypes.c_void_p(fd), 1, c_u64(0)),
    )
    data = ctypes.create_string_buffer(bytes.fromhex(os.environ["POOL_DATA"]), 64)
    say("import_pointer", cu.cuMemPoolImportPointer(ctypes.byref(ptr), pool, data))
    say("sees_export", dtoh(ptr.value, 4096)[1] == b"\x5a" * 4096)
    check(cu.cuMemcpyHtoD(ptr, b"\xcd" * 4096, c_u64(4096)), "overwrite")
    say("free_import", cu.cuMemFree(ptr))
    with open(os.devnull) as other:  # a file that is not an exported pool
        say(
            "import_other_fd",
            cu.cuMemPoolImportFromShareableHandle(
                ctypes.byref(pool), ctypes.c_void_p(other.fileno()), 1, c_u64(0)
            ),
        )


def scenario_callbacks():
    """Host functions and stream callbacks run in this process, in stream order, on a thread of their
    own, and later work on the stream waits for them."""
    import threading

    setup()
    stream = c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 1), "stream")
    rc, dev = alloc(16)
    check(rc, "alloc")
    seen, threads = [], set()
    host_fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
    stream_fn = ctypes.CFUNCTYPE(None, c_u64, ctypes.c_int, ctypes.c_void_p)

    def host(data):
        time.sleep(0.05 if data == 1 else 0)  # a slow one: the next must still come after it
        seen.append(f"host{data}")
        threads.add(threading.get_ident())

    def callback(s, status, data):
        seen.append(f"callback{data}:{status}:{s == stream.value}")
        threads.add(threading.get_ident())

    keep = [host_fn(host), stream_fn(callback)]
    check(cu.cuMemsetD8Async(c_u64(dev), 1, c_u64(16), stream), "memset")
    check(cu.cuLaunchHostFunc(stream, keep[0], ctypes.c_void_p(1)), "host func 1")
    check(cu.cuStreamAddCallback(stream, keep[1], ctypes.c_void_p(2), 0), "callback 2")
    check(cu.cuLaunchHostFunc(stream, keep[0], ctypes.c_void_p(3)), "host func 3")
    say("flags_refused", cu.cuStreamAddCallback(stream, keep[1], None, 1))
    check(cu.cuStreamSynchronize(stream), "sync")
    say("order", ",".join(seen))
    say("own_thread", threading.get_ident() not in threads and len(threads) == 1)
    for i in range(200):  # many, quickly
        check(cu.cuLaunchHostFunc(stream, keep[0], ctypes.c_void_p(10 + i)), "many")
    check(cu.cuStreamSynchronize(stream), "sync")
    say("many", len(seen) == 203 and seen[-1] == "host209")


def scenario_async_copies():
    """Copies to page-locked memory return at once and land before anything shows they are done;
    copies to pageable memory wait, as natively."""
    import threading

    setup()
    n = 3 * MiB + 5  # past the worker's small copies, not a multiple of anything
    streams = []
    for _ in range(4):
        s = c_u64()
        check(cu.cuStreamCreate(ctypes.byref(s), 1), "stream")
        streams.append(s)
    stream, other = streams[0], streams[1]
    rc, dev = alloc(n)
    check(rc, "alloc")
    pinned = c_u64()
    check(cu.cuMemAllocHost(ctypes.byref(pinned), c_u64(n)), "pinned")
    view = (ctypes.c_char * n).from_address(pinned.value)
    host_fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
    gate = threading.Event()
    keep = [host_fn(lambda _: gate.wait(60))]  # holds the stream until the program opens the gate
    seen_by_host_function = []
    keep.append(host_fn(lambda _: seen_by_host_function.append(view[:n])))  # all of it: the pieces too

    def put(pattern):
        check(cu.cuMemcpyHtoD(c_u64(dev), pattern, c_u64(n)), "htod")

    def copy_then(observe, name, pattern_byte):
        """The stream held at a gate, a copy behind it: not there when the call returns; there once
        `observe` says the stream got past it."""
        pattern = bytes([pattern_byte]) * 7 + os.urandom(n - 7)
        put(pattern)
        ctypes.memset(pinned.value, 0xEE, n)
        gate.clear()
        check(cu.cuLaunchHostFunc(stream, keep[0], None), "gate")
        check(cu.cuMemcpyDtoHAsync(c_u64(pinned.value), c_u64(dev), c_u64(n), stream), "dtoh async")
        before = view[:n] == b"\xee" * n
        gate.set()
        observe()
        say(name, f"{before},{view[:n] == pattern}")
        return pattern

    def event_query():
        event = c_u64()
        check(cu.cuEventCreate(ctypes.byref(event), 0), "event")
        check(cu.cuEventRecord(event, stream), "record")
        while (rc := cu.cuEventQuery(event)) == 600:  # CUDA_ERROR_NOT_READY: nothing is claimed yet
            time.sleep(0.001)
        check(rc, "query")

    def event_sync():
        event = c_u64()
        check(cu.cuEventCreate(ctypes.byref(event), 0), "event")
        check(cu.cuEventRecord(event, stream), "record")
        check(cu.cuEventSynchronize(event), "event sync")

    def waited_by_other_stream():
        event = c_u64()
        check(cu.cuEventCreate(ctypes.byref(event), 0), "event")
        check(cu.cuEventRecord(event, stream), "record")
        check(cu.cuStreamWaitEvent(other, event, 0), "wait event")
        check(cu.cuStreamSynchronize(other), "other sync")

    def host_function_after():
        check(cu.cuLaunchHostFunc(stream, keep[1], None), "host fn")
        check(cu.cuStreamSynchronize(stream), "sync")

    def synchronous_copy():
        check(dtoh(dev, 16)[0], "sync dtoh")  # on the default stream, which waits for blocking streams

    check(cu.cuStreamDestroy(stream), "destroy")  # the legacy default stream for the synchronous copy
    stream = c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 0), "blocking stream")
    streams[0] = stream
    copy_then(lambda: check(cu.cuStreamSynchronize(stream), "sync"), "stream_sync", 1)
    copy_then(event_sync, "event_sync", 2)
    copy_then(event_query, "event_query", 3)
    copy_then(lambda: check(cu.cuCtxSynchronize(), "ctx sync"), "ctx_sync", 4)
    copy_then(waited_by_other_stream, "stream_wait_event", 5)
    pattern = copy_then(host_function_after, "host_function", 6)
    say("host_function_saw", seen_by_host_function == [pattern])
    pattern = copy_then(synchronous_copy, "synchronous_copy", 7)
    ctypes.memset(pinned.value, 0xEE, 16)  # a generic cuMemcpyAsync into page-locked memory: the same
    gate.clear()
    check(cu.cuLaunchHostFunc(stream, keep[0], None), "gate")
    check(cu.cuMemcpyAsync(c_u64(pinned.value), c_u64(dev), c_u64(16), stream), "memcpy async")
    before = view[:16] == b"\xee" * 16
    gate.set()
    check(cu.cuStreamSynchronize(stream), "sync")
    say("generic_async", f"{before},{view[:16] == pattern[:16]}")

    # Many copies in flight on several streams, each followed on its stream by a copy that overwrites
    # its source and one that sends its destination back to the device: stream order holds.
    chunk, count = 64 << 10, 40
    big, back = alloc(chunk * count)[1], alloc(chunk * count)[1]
    old, new = os.urandom(chunk * count), os.urandom(chunk * count)
    check(cu.cuMemcpyHtoD(c_u64(big), old, c_u64(chunk * count)), "htod old")
    target = c_u64()
    check(cu.cuMemHostAlloc(ctypes.byref(target), c_u64(chunk * count), 0), "host alloc")
    ctypes.memset(target.value, 0, chunk * count)
    for i in range(count):
        s, at = streams[i % 4], i * chunk
        check(cu.cuMemcpyDtoHAsync(c_u64(target.value + at), c_u64(big + at), c_u64(chunk), s), "dtoh")
        check(cu.cuMemcpyHtoDAsync(c_u64(big + at), new[at : at + chunk], c_u64(chunk), s), "htod new")
        check(cu.cuMemcpyHtoDAsync(c_u64(back + at), c_u64(target.value + at), c_u64(chunk), s), "back")
    for s in streams[1:]:
        check(cu.cuStreamSynchronize(s), "sync")
    check(cu.cuCtxSynchronize(), "ctx sync")
    landed = ctypes.string_at(target.value, chunk * count)
    say("many_landed", landed == old)
    say("many_overwritten_after", dtoh(big, chunk * count)[1] == new)
    say("many_sent_back", dtoh(back, chunk * count)[1] == old)
    # Two copies into one buffer on one stream: the later one's bytes stay.
    check(cu.cuMemcpyDtoHAsync(c_u64(target.value), c_u64(big), c_u64(chunk), streams[1]), "first")
    check(cu.cuMemcpyDtoHAsync(c_u64(target.value), c_u64(back), c_u64(chunk), streams[1]), "second")
    check(cu.cuStreamSynchronize(streams[1]), "sync")
    say("later_copy_wins", ctypes.string_at(target.value, chunk) == old[:chunk])
    # A synchronous host-to-host cuMemcpy after it on a blocking stream reads the landed bytes.
    check(cu.cuMemcpyDtoHAsync(c_u64(target.value), c_u64(big), c_u64(chunk), stream), "dtoh")
    copied = ctypes.create_string_buffer(chunk)
    check(cu.cuMemcpy(c_u64(ctypes.addressof(copied)), c_u64(target.value), c_u64(chunk)), "host to host")
    say("host_to_host_after", copied.raw == new[:chunk])
    # Freed while copies land in it: they land first (no write into freed memory).
    for _ in range(8):
        check(cu.cuMemcpyDtoHAsync(c_u64(target.value), c_u64(big), c_u64(chunk), streams[2]), "dtoh")
    say("free_host", cu.cuMemFreeHost(c_u64(target.value)))

    # Pageable memory: the call waits for the bytes, as the driver's copy does.
    pageable = ctypes.create_string_buffer(n)
    put(old[:n] if len(old) >= n else (old * 2)[:n])
    check(cu.cuMemcpyDtoHAsync(pageable, c_u64(dev), c_u64(n), stream), "pageable")
    say("pageable_waits", pageable.raw == (old * 2)[:n])
    # Bad sources: refused by the call itself, as before.
    say("bad_source", cu.cuMemcpyDtoHAsync(c_u64(pinned.value), c_u64(0xDEAD0000), c_u64(16), stream))
    say("past_the_end", cu.cuMemcpyDtoHAsync(c_u64(pinned.value), c_u64(dev + n - 8), c_u64(16), stream))
    # A stream that is not the lease's: the worker refuses it; the next synchronise says so.
    say("bad_stream", cu.cuMemcpyDtoHAsync(c_u64(pinned.value), c_u64(dev), c_u64(16), c_u64(0x1234)))
    say("bad_stream_sync", cu.cuCtxSynchronize())
    say("after", cu.cuCtxSynchronize())


def scenario_async_copy_ordering():
    """Many copies into page-locked memory in flight on four streams, chained by events and stream
    waits, all held at a gate (a host function): a copy's bytes are never there before the event
    behind it completes, and always there once anything shows that event complete."""
    import threading

    setup()
    count, chunk = 24, 96 * 1024 + 3  # odd sizes: no copy lines up with another
    streams = []
    for _ in range(5):
        s = c_u64()
        check(cu.cuStreamCreate(ctypes.byref(s), 1), "stream")
        streams.append(s)
    waiter = streams.pop()  # a stream of no copy's: it waits for the last event only
    events = []
    for _ in range(count):
        e = c_u64()
        check(cu.cuEventCreate(ctypes.byref(e), 0), "event")
        events.append(e)
    src = alloc(chunk * count)[1]
    old = os.urandom(chunk * count)
    check(cu.cuMemcpyHtoD(c_u64(src), old, c_u64(chunk * count)), "htod")
    pinned = c_u64()
    check(cu.cuMemAllocHost(ctypes.byref(pinned), c_u64(chunk * count)), "pinned")
    ctypes.memset(pinned.value, 0xEE, chunk * count)

    def state():  # per copy: L its bytes landed, U its destination untouched, ? torn
        def one(i):
            got = ctypes.string_at(pinned.value + i * chunk, chunk)
            return "L" if got == old[i * chunk : (i + 1) * chunk] else "U" if got == b"\xee" * chunk else "?"

        return "".join(one(i) for i in range(count))

    def stream_of(i):
        return streams[i % len(streams)]

    gate = threading.Event()
    snapshots = {}
    host_fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
    keep = [
        host_fn(lambda _: gate.wait(60)),
        host_fn(lambda data: snapshots.setdefault(data or 0, state())),
    ]
    capturing = ctypes.c_int()
    for s in (*streams, waiter):  # asked once (and kept) before the gate holds the host executor's thread
        check(cu.cuStreamIsCapturing(s, ctypes.byref(capturing)), "is capturing")
    check(cu.cuLaunchHostFunc(stream_of(0), keep[0], None), "gate")
    for i in range(count):  # copy i waits for copy i-1's event, on another stream
        s = stream_of(i)
        if i:
            check(cu.cuStreamWaitEvent(s, events[i - 1], 0), "wait event")
        check(cu.cuLaunchHostFunc(s, keep[1], ctypes.c_void_p(i)), "snapshot")  # before copy i
        at = i * chunk
        check(cu.cuMemcpyDtoHAsync(c_u64(pinned.value + at), c_u64(src + at), c_u64(chunk), s), "dtoh")
        check(cu.cuEventRecord(events[i], s), "record")
    check(cu.cuStreamWaitEvent(waiter, events[-1], 0), "wait")
    check(cu.cuLaunchHostFunc(waiter, keep[1], ctypes.c_void_p(count)), "snapshot")  # after them all

    # The gate shut: nothing has landed, even given time to.
    say("held_none_landed", state() == "U" * count)
    time.sleep(0.1)
    say("held_still_none", state() == "U" * count)
    gate.set()
    # Each event, as it shows complete (synchronise, or a query that says done), shows its copy and
    # every copy ordered before it.
    seen = []
    for k in range(count):
        if k % 2:
            while (rc := cu.cuEventQuery(events[k])) == 600:  # CUDA_ERROR_NOT_READY
                time.sleep(0.0005)
            check(rc, "query")
        else:
            check(cu.cuEventSynchronize(events[k]), "event sync")
        seen.append(state()[: k + 1] == "L" * (k + 1))
    say("each_event_shows_its_copies", all(seen))
    check(cu.cuStreamSynchronize(waiter), "waiter sync")
    say("waiter_saw_all", state() == "L" * count)
    # A host function between two copies of the chain sees exactly the copies before it.
    exact = [snapshots.get(i) == "L" * i + "U" * (count - i) for i in range(count + 1)]
    say("host_functions_see_exactly_the_earlier_copies", all(exact))

    # No gates, a long chain: each step's copy lands; the next step on the next stream, after the
    # event, sends those bytes back to the device and then overwrites the copy's source.
    steps, size = 64, 16 * 1024 + 1
    new = os.urandom(size * steps)
    back = alloc(size * steps)[1]
    ctypes.memset(pinned.value, 0, size * steps)
    for i in range(steps):
        s, at = stream_of(i), i * size
        if i:
            check(cu.cuStreamWaitEvent(s, events[(i - 1) % count], 0), "wait event")
            prev = at - size
            check(
                cu.cuMemcpyHtoDAsync(c_u64(back + prev), c_u64(pinned.value + prev), c_u64(size), s), "back"
            )
            check(cu.cuMemcpyHtoDAsync(c_u64(src + prev), new[prev:at], c_u64(size), s), "overwrite")
        check(cu.cuMemcpyDtoHAsync(c_u64(pinned.value + at), c_u64(src + at), c_u64(size), s), "dtoh")
        check(cu.cuEventRecord(events[i % count], s), "record")
    check(cu.cuEventSynchronize(events[(steps - 1) % count]), "last event")
    total = size * steps
    say("chain_landed", ctypes.string_at(pinned.value, total) == old[:total])
    say("chain_sent_back", dtoh(back, total - size)[1] == old[: total - size])
    say("chain_overwritten_after", dtoh(src, total - size)[1] == new[: total - size])

    # Memsets, and copies between pageable memory and the device on a stream (large enough to go through
    # the memory shared with a worker on this host: each piece in order behind the stream's work), take
    # their place in the chain too: on a stream that waits for the last event, a memset, a copy from
    # pageable memory over part of it, a memset of two-byte values and a copy back into pageable memory,
    # whose call returns with exactly what those four did after the whole chain.
    span, pattern = 1 * MiB + 4096, 0x04030201
    region = alloc(span)[1]
    check(cu.cuMemcpyHtoD(c_u64(region), bytes(span), c_u64(span)), "zero")
    patch = os.urandom(span // 2)
    s = stream_of(steps)
    check(cu.cuStreamWaitEvent(s, events[(steps - 1) % count], 0), "wait event")
    check(cu.cuMemsetD32Async(c_u64(region), ctypes.c_uint32(pattern), c_u64(span // 4), s), "memset32")
    check(cu.cuMemcpyHtoDAsync(c_u64(region + 4096), patch, c_u64(len(patch)), s), "htod over it")
    check(cu.cuMemsetD16Async(c_u64(region + span - 64), ctypes.c_uint16(0xBEEF), c_u64(8), s), "memset16")
    landed = ctypes.create_string_buffer(span)
    check(cu.cuMemcpyDtoHAsync(landed, c_u64(region), c_u64(span), s), "dtoh pageable")
    expected = bytearray(pattern.to_bytes(4, "little") * (span // 4))
    expected[4096 : 4096 + len(patch)] = patch
    expected[span - 64 : span - 48] = (0xBEEF).to_bytes(2, "little") * 8
    say("memsets_and_pageable_copies_in_stream_order", landed.raw == bytes(expected))


def scenario_pinned_stream_order():
    """Copies between the device and page-locked memory act when their stream gets there, as natively:
    the stream held at a gate, a copy from page-locked memory reads what the host wrote after the call
    returned; a copy into it then lands once the stream is past it."""
    import threading

    setup()
    n = 1 * MiB + 3
    stream = c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 1), "stream")
    capturing = ctypes.c_int()
    check(cu.cuStreamIsCapturing(stream, ctypes.byref(capturing)), "is capturing")  # asked before the gate
    dev = alloc(n)[1]
    source, target = c_u64(), c_u64()
    check(cu.cuMemAllocHost(ctypes.byref(source), c_u64(n)), "pinned")
    check(cu.cuMemHostAlloc(ctypes.byref(target), c_u64(n), 0), "pinned")
    first, later = os.urandom(n), os.urandom(n)
    ctypes.memmove(source.value, first, n)
    ctypes.memset(target.value, 0, n)
    gate = threading.Event()
    keep = [ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda _: gate.wait(60))]
    check(cu.cuLaunchHostFunc(stream, keep[0], None), "gate")
    check(cu.cuMemcpyHtoDAsync(c_u64(dev), c_u64(source.value), c_u64(n), stream), "htod")
    check(cu.cuMemcpyDtoHAsync(c_u64(target.value), c_u64(dev), c_u64(n), stream), "dtoh")
    ctypes.memmove(source.value, later, n)  # before the stream gets to the copy
    say("target_untouched", ctypes.string_at(target.value, n) == bytes(n))
    gate.set()
    check(cu.cuStreamSynchronize(stream), "sync")
    landed = ctypes.string_at(target.value, n)
    say("read_at_stream_time", landed == later)
    say("read_at_call_time", landed == first)
    say("free", f"{cu.cuMemFreeHost(c_u64(source.value))},{cu.cuMemFreeHost(c_u64(target.value))}")


def scenario_managed():
    """Managed memory: what the host writes before a launch is what the kernel reads; what the kernel
    writes is what the host reads after the synchronisation; copies in and out of it see the same."""
    setup()
    n = 100_000  # u32 elements: several 64 KiB chunks
    ptr, plain = c_u64(), c_u64()
    check(cu.cuMemAllocManaged(ctypes.byref(ptr), c_u64(4 * n), 1), "alloc managed")
    p = ptr.value
    say("zeroed", ctypes.string_at(p, 8) == bytes(8))
    ctypes.memset(p, 5, 4 * n)  # the host writes every byte
    module, fn = c_u64(), c_u64()
    check(cu.cuModuleLoadData(ctypes.byref(module), b"// module\n"), "load")
    check(cu.cuModuleGetFunction(ctypes.byref(fn), module, b"add_u32"), "function")
    value, count = ctypes.c_uint32(1), ctypes.c_uint32(n)
    params = (ctypes.c_void_p * 3)(ctypes.addressof(ptr), ctypes.addressof(value), ctypes.addressof(count))
    check(cu.cuLaunchKernel(fn, (n + 255) // 256, 1, 1, 256, 1, 1, 0, c_u64(0), params, None), "launch")
    check(cu.cuCtxSynchronize(), "sync")
    words = (ctypes.c_uint32 * n).from_address(p)
    say("kernel_saw_host_writes", all(w == 0x05050506 for w in words))
    words[0] = 9  # one host write, then the device's view of it through a copy
    _, data = dtoh(p, 8)
    say("copy_out_sees_host_write", data.hex())
    check(cu.cuMemcpyHtoD(c_u64(p + 4), b"\x01\x02\x03\x04", c_u64(4)), "copy in")
    say("host_sees_copy_in", ctypes.string_at(p + 4, 4).hex())
    attribute = ctypes.c_uint32()
    check(cu.cuPointerGetAttribute(ctypes.byref(attribute), 8, c_u64(p + 100)), "is managed")
    managed_flag = attribute.value
    _, other = alloc(64)
    check(cu.cuPointerGetAttribute(ctypes.byref(attribute), 8, c_u64(other)), "is managed")
    say("is_managed", f"{managed_flag} {attribute.value}")
    concurrent = ctypes.c_int(-1)
    check(cu.cuDeviceGetAttribute(ctypes.byref(concurrent), 89, 0), "attribute")
    say("concurrent_managed_access", concurrent.value)
    words[5] = 77  # a prefetch to the device sends it; advice is accepted; plain memory is refused
    device0 = c_u64(1)  # CUmemLocation {CU_MEM_LOCATION_TYPE_DEVICE, 0}, by value (the 12.2 ABI asked for)
    say("prefetch", cu.cuMemPrefetchAsync(ptr, c_u64(4 * n), device0, 0, c_u64(0)))
    say("advise", cu.cuMemAdvise(ptr, c_u64(4 * n), 1, device0))
    say("prefetch_plain", cu.cuMemPrefetchAsync(c_u64(other), c_u64(64), device0, 0, c_u64(0)))
    absent = c_u64(1 | 10**8 << 32)  # a device ordinal the lease does not have
    say("prefetch_absent_device", cu.cuMemPrefetchAsync(ptr, c_u64(4 * n), absent, 0, c_u64(0)))
    say("prefetch_bad_location", cu.cuMemPrefetchAsync(ptr, c_u64(4 * n), c_u64(9), 0, c_u64(0)))
    check(cu.cuMemsetD8(c_u64(other), 0, c_u64(64)), "unrelated device work")
    say("device_has_prefetched", dtoh(p + 20, 4)[1].hex())
    say("free", cu.cuMemFree(ptr))
    say("bad_flags", cu.cuMemAllocManaged(ctypes.byref(plain), c_u64(64), 4))


def scenario_mapped():
    """Mapped page-locked memory: a DEVICEMAP allocation is the same address for the program and its
    kernels; registered memory and a plain page-locked allocation get a device pointer once asked for
    it; host writes before a launch reach the kernel, kernel writes reach the host after the sync,
    over several allocations and streams; unregistering leaves the kernel's bytes in the memory."""
    setup()
    module, fn = c_u64(), c_u64()
    check(cu.cuModuleLoadData(ctypes.byref(module), b"// module\n"), "load")
    check(cu.cuModuleGetFunction(ctypes.byref(fn), module, b"add_u32"), "function")
    streams = [c_u64(), c_u64()]
    for s in streams:
        check(cu.cuStreamCreate(ctypes.byref(s), 0), "stream")

    def add(device_ptr, n, value, stream):
        ptr, v, count = c_u64(device_ptr), ctypes.c_uint32(value), ctypes.c_uint32(n)
        params = (ctypes.c_void_p * 3)(ctypes.addressof(ptr), ctypes.addressof(v), ctypes.addressof(count))
        check(cu.cuLaunchKernel(fn, (n + 255) // 256, 1, 1, 256, 1, 1, 0, stream, params, None), "launch")

    n = 50_000  # u32 elements: several 64 KiB chunks
    mapped, dev = c_u64(), c_u64()
    check(cu.cuMemHostAlloc(ctypes.byref(mapped), c_u64(4 * n), 0x02), "host alloc mapped")
    check(cu.cuMemHostGetDevicePointer(ctypes.byref(dev), c_u64(mapped.value + 8), 0), "device pointer")
    say("mapped_same_address", dev.value == mapped.value + 8)
    words = (ctypes.c_uint32 * n).from_address(mapped.value)
    for i in range(n):
        words[i] = i
    registered_buf = (ctypes.c_uint32 * n)(*([7] * n))
    check(cu.cuMemHostRegister(ctypes.byref(registered_buf), c_u64(4 * n), 0x02), "register")
    registered_dev = c_u64()
    check(
        cu.cuMemHostGetDevicePointer(ctypes.byref(registered_dev), ctypes.byref(registered_buf), 0), "dev ptr"
    )
    pinned = c_u64()  # a plain page-locked allocation, mapped later, as the runtime's cudaHostAlloc(0)
    check(cu.cuMemAllocHost(ctypes.byref(pinned), c_u64(4 * 1000)), "alloc host")
    ctypes.memset(pinned.value, 0, 4000)
    pinned_dev = c_u64()
    check(cu.cuMemHostGetDevicePointer(ctypes.byref(pinned_dev), c_u64(pinned.value), 0), "dev ptr")
    flags = ctypes.c_uint32()
    check(cu.cuMemHostGetFlags(ctypes.byref(flags), c_u64(mapped.value)), "flags")
    say("flags", flags.value)
    for step in range(3):  # the host touches a little each step; kernels on two streams
        words[step] += 1000
        registered_buf[n - 1 - step] = 100
        add(mapped.value, n, 1, streams[0])
        add(registered_dev.value, n, 2, streams[1])
        add(pinned_dev.value, 1000, 3, streams[step % 2])
        check(cu.cuCtxSynchronize(), "sync")
    say("mapped_words", [words[0], words[1], words[2], words[3], words[n - 1]])
    say("registered_words", [registered_buf[0], registered_buf[n - 3], registered_buf[n - 1]])
    say("pinned_word", (ctypes.c_uint32 * 1000).from_address(pinned.value)[999])
    memory_type, is_mapped = ctypes.c_uint32(), ctypes.c_uint32()
    check(cu.cuPointerGetAttribute(ctypes.byref(memory_type), 2, c_u64(mapped.value)), "memory type")
    check(cu.cuPointerGetAttribute(ctypes.byref(is_mapped), 13, c_u64(pinned.value)), "mapped")
    say("attributes", f"{memory_type.value} {is_mapped.value}")
    _, data = dtoh(registered_dev.value, 8)  # a copy out of the device pointer sees the kernels' writes
    say("copy_of_registered", data.hex())
    check(cu.cuMemcpyHtoD(c_u64(mapped.value), b"\xaa\xbb\xcc\xdd", c_u64(4)), "copy into mapped memory")
    say("host_sees_copy_in", ctypes.string_at(mapped.value, 4).hex())
    add(registered_dev.value, n, 1, streams[0])
    check(cu.cuStreamSynchronize(streams[0]), "sync")
    check(cu.cuMemHostUnregister(ctypes.byref(registered_buf)), "unregister")
    say("after_unregister", registered_buf[0])  # the kernel's bytes stay in the program's memory
    say("free_mapped", cu.cuMemFreeHost(c_u64(mapped.value)))
    say("free_pinned", cu.cuMemFreeHost(c_u64(pinned.value)))
    say("free_device_ptr", cu.cuMemFree(c_u64(pinned_dev.value)))  # refused: host memory's, gone with it


def scenario_tensor_maps():
    """cuTensorMapEncodeTiled / Im2col / Im2colWide / ReplaceAddress: encoded by the worker (the host
    executor's stand-in descriptor holds the type, rank, address and dimensions) for a tensor that lies
    wholly in the lease's memory; one at an address that is not the lease's, or running past the end of
    its allocation, or moved where it does not fit, is refused, as is a map the lease did not encode."""
    import struct

    setup()
    rc, ptr = alloc(1 << 20)
    check(rc, "alloc")
    tensor_map = ctypes.create_string_buffer(128)
    dims, strides = (c_u64 * 2)(256, 128), (c_u64 * 1)(512)  # 128 rows of 256 floats: 64 KiB
    box, element = (ctypes.c_uint32 * 2)(64, 32), (ctypes.c_uint32 * 2)(1, 1)
    encode = cu.cuTensorMapEncodeTiled
    rc = encode(tensor_map, 7, 2, c_u64(ptr), dims, strides, box, element, 0, 0, 0, 0)
    dtype, rank, address = struct.unpack_from("<iIQ", tensor_map.raw)
    say("tiled", f"{rc} {dtype} {rank} {address == ptr} {struct.unpack_from('<2Q', tensor_map.raw, 32)}")
    say("foreign_address", encode(tensor_map, 7, 2, c_u64(0x1000), dims, strides, box, element, 0, 0, 0, 0))
    near_end = c_u64(ptr + (1 << 20) - 4096)
    say("past_the_allocation", encode(tensor_map, 7, 2, near_end, dims, strides, box, element, 0, 0, 0, 0))
    say(
        "misaligned_address",
        encode(tensor_map, 7, 2, c_u64(ptr + 4), dims, strides, box, element, 0, 0, 0, 0),
    )
    rc = encode(tensor_map, 7, 2, c_u64(ptr), dims, strides, box, element, 0, 0, 0, 0)
    rc = cu.cuTensorMapReplaceAddress(tensor_map, c_u64(ptr + 4096))
    say("replaced", f"{rc} {struct.unpack_from('<Q', tensor_map.raw, 8)[0] == ptr + 4096}")
    say("replaced_where_it_does_not_fit", cu.cuTensorMapReplaceAddress(tensor_map, near_end))
    made_up = ctypes.create_string_buffer(bytes(range(128)), 128)
    say("replaced_in_a_made_up_map", cu.cuTensorMapReplaceAddress(made_up, c_u64(ptr)))
    dims3, strides3 = (c_u64 * 3)(8, 16, 16), (c_u64 * 2)(64, 1024)
    lower, upper = (ctypes.c_int * 1)(-1), (ctypes.c_int * 1)(1)
    element3 = (ctypes.c_uint32 * 3)(1, 1, 1)
    rc = cu.cuTensorMapEncodeIm2col(tensor_map, 7, 3, c_u64(ptr), dims3, strides3, lower, upper, 8, 16, element3,
                                    0, 0, 0, 0)  # fmt: skip
    say("im2col", f"{rc} {struct.unpack_from('<3Q', tensor_map.raw, 32)}")
    rc = cu.cuTensorMapEncodeIm2colWide(tensor_map, 7, 3, c_u64(ptr), dims3, strides3, -1, 1, 8, 16, element3,
                                        0, 0, 0, 0, 0)  # fmt: skip
    say("im2col_wide", f"{rc} {struct.unpack_from('<3Q', tensor_map.raw, 32)}")


def scenario_tensor_map_classes():
    """cuTensorMapSetAllocationClass (at the version cuda.bindings asks for it) on maps the worker encoded:
    the small and automatic classes take effect as small, the large one only for a tensor that spans its
    128 KiB window; a map changed so is still the lease's (it can be re-pointed); an unknown class, a made-up
    map, and the large class on a smaller tensor are refused, the class reported small."""
    setup()
    rc, ptr = alloc(1 << 20)
    check(rc, "alloc")
    set_class = Driver(13050).cuTensorMapSetAllocationClass
    box, element = (ctypes.c_uint32 * 2)(64, 32), (ctypes.c_uint32 * 2)(1, 1)

    def encoded(rows, row_bytes):
        tensor_map = ctypes.create_string_buffer(128)
        dims, strides = (c_u64 * 2)(row_bytes // 4, rows), (c_u64 * 1)(row_bytes)
        check(
            cu.cuTensorMapEncodeTiled(tensor_map, 7, 2, c_u64(ptr), dims, strides, box, element, 0, 0, 0, 0),
            "map",
        )
        return tensor_map

    def classed(tensor_map, alloc_class):
        effective = ctypes.c_int32(-1)
        rc = set_class(tensor_map, alloc_class, ctypes.byref(effective))
        return f"{rc} {effective.value}"

    small, large = encoded(128, 512), encoded(256, 1024)  # 64 KiB and 256 KiB of floats
    say("small_class", classed(small, 1))
    say("auto_class", classed(small, 0))
    say("large_on_a_small_tensor", classed(small, 2))
    say("large_on_a_large_tensor", classed(large, 2))
    say("replaced_after", cu.cuTensorMapReplaceAddress(large, c_u64(ptr + 4096)))
    say("unknown_class", classed(small, 5))
    say("made_up_map", classed(ctypes.create_string_buffer(bytes(range(128)), 128), 1))
    say("finished", 1)


def scenario_pinned_kernels():
    """cuda.core's graph_update and thread_block_cluster examples: kernels given the host address of
    plain page-locked memory (cuMemAllocHost, cuMemHostAlloc without DEVICEMAP), as unified addressing
    allows — launched directly, with a cluster shape, as a graph's kernel node whose parameters change
    in the instantiated graph, and in a captured graph updated from another capture. The host reads what
    the kernels wrote, kernels what the host wrote. The address of registered memory (PyTorch's pinned
    memory under `pinned_use_cuda_host_register`) works too: the kernel is given its device pointer."""
    setup()
    add = module_function(b"add_u32")
    n = 40_000  # u32 elements: several 64 KiB chunks
    a, b = c_u64(), c_u64()
    check(cu.cuMemAllocHost(ctypes.byref(a), c_u64(4 * n)), "alloc host")
    check(cu.cuMemHostAlloc(ctypes.byref(b), c_u64(4 * n), 0x01), "host alloc portable")
    words_a = (ctypes.c_uint32 * n).from_address(a.value)
    words_b = (ctypes.c_uint32 * n).from_address(b.value)
    for i in range(n):
        words_a[i] = i
    keep = []

    def params(ptr, value):
        args = [c_u64(ptr), ctypes.c_uint32(value), ctypes.c_uint32(n)]
        pointers = (ctypes.c_void_p * 3)(*[ctypes.addressof(x) for x in args])
        keep.append((args, pointers))
        return pointers

    grid = (n + 255) // 256
    check(cu.cuLaunchKernel(add, grid, 1, 1, 256, 1, 1, 0, c_u64(0), params(a.value, 5), None), "launch")
    say("sync_after_launch", cu.cuCtxSynchronize())
    say("launched", [words_a[0], words_a[n - 1]])
    words_a[1] = 1000  # the host writes between launches: the next kernel reads it
    cluster = Attribute(4, b"", (ctypes.c_int * 16)(2, 1, 1))  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    grid_even = grid + grid % 2  # a whole number of clusters
    cfg = Config((ctypes.c_uint * 7)(grid_even, 1, 1, 256, 1, 1, 0), 0, ctypes.addressof(cluster), 1)
    check(cu.cuLaunchKernelEx(ctypes.byref(cfg), add, params(a.value, 1), None), "cluster launch")
    say("sync_after_cluster", cu.cuCtxSynchronize())
    say("clustered", [words_a[0], words_a[1], words_a[n - 1]])

    graph, node, exe = c_u64(), c_u64(), c_u64()
    check(cu.cuGraphCreate(ctypes.byref(graph), 0), "graph")
    node_params = KernelNodeParams(add.value, (ctypes.c_uint32 * 6)(grid, 1, 1, 256, 1, 1), 0, 0,
                                   ctypes.cast(params(a.value, 10), ctypes.c_void_p))  # fmt: skip
    check(
        cu.cuGraphAddKernelNode(ctypes.byref(node), graph, None, c_u64(0), ctypes.byref(node_params)), "node"
    )
    check(cu.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, c_u64(0)), "instantiate")
    check(cu.cuGraphLaunch(exe, c_u64(0)), "graph launch")
    node_params.params = ctypes.cast(params(b.value, 20), ctypes.c_void_p)  # the node now adds to b
    check(cu.cuGraphExecKernelNodeSetParams(exe, node, ctypes.byref(node_params)), "set params")
    check(cu.cuGraphLaunch(exe, c_u64(0)), "graph launch again")
    say("sync_after_node_update", cu.cuCtxSynchronize())
    other, popped, refused_node = c_u64(), c_u64(), c_u64()
    check(cu.cuCtxCreate(ctypes.byref(other), None, 0, 0), "another context")  # made current ...
    check(cu.cuCtxPopCurrent(ctypes.byref(popped)), "pop")  # ... and the primary one current again
    node_params.ctx = other.value  # a node for that other context: not translated, so refused
    say("other_context_node", cu.cuGraphAddKernelNode(ctypes.byref(refused_node), graph, None, c_u64(0),
                                                      ctypes.byref(node_params)))  # fmt: skip
    node_params.ctx = 0
    check(cu.cuCtxDestroy(other), "destroy the other context")
    say("node_updated", [words_a[0], words_b[0], words_b[n - 1]])

    stream = c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 1), "stream")

    def captured(ptr, value):
        g = c_u64()
        check(cu.cuStreamBeginCapture(stream, 0), "begin capture")
        check(cu.cuLaunchKernel(add, grid, 1, 1, 256, 1, 1, 0, stream, params(ptr, value), None), "capture")
        check(cu.cuStreamEndCapture(stream, ctypes.byref(g)), "end capture")
        return g

    captured_exe, info = c_u64(), (ctypes.c_uint8 * 32)()
    check(
        cu.cuGraphInstantiateWithFlags(ctypes.byref(captured_exe), captured(a.value, 100), c_u64(0)), "inst"
    )
    say("exec_update", cu.cuGraphExecUpdate(captured_exe, captured(b.value, 300), info))
    check(cu.cuGraphLaunch(captured_exe, stream), "launch updated")
    say("sync_after_exec_update", cu.cuStreamSynchronize(stream))
    say("exec_updated", [words_a[0], words_b[0]])

    rc, dev = alloc(4 * n)
    check(rc, "alloc")
    check(cu.cuMemcpyHtoD(c_u64(dev), c_u64(a.value), c_u64(4 * n)), "copy from pinned")
    check(cu.cuMemsetD32(c_u64(a.value), 0, c_u64(n)), "memset pinned")  # the device's memory at that address
    check(cu.cuMemcpyDtoH(c_u64(b.value), c_u64(dev), c_u64(4 * n)), "copy into pinned")
    say("copies", [words_a[0], words_b[0], words_b[1], words_b[n - 1]])

    landing = c_u64()  # a copy to the host still landing in pinned memory when a kernel is given it
    check(cu.cuMemAllocHost(ctypes.byref(landing), c_u64(4 * n)), "alloc host")
    check(cu.cuMemsetD32(c_u64(dev), 40, c_u64(n)), "memset")
    check(cu.cuMemcpyDtoHAsync(c_u64(landing.value), c_u64(dev), c_u64(4 * n), stream), "copy to pinned")
    check(cu.cuLaunchKernel(add, grid, 1, 1, 256, 1, 1, 0, stream, params(landing.value, 2), None), "launch")
    check(cu.cuStreamSynchronize(stream), "sync")
    words_landing = (ctypes.c_uint32 * n).from_address(landing.value)
    say("copy_then_kernel", f"{words_landing[0]} {words_landing[n - 1]}")
    check(cu.cuMemFreeHost(c_u64(landing.value)), "free")

    filled = c_u64()  # cuda.core's Buffer.fill on pinned memory: a memset of the host address
    check(cu.cuMemAllocHost(ctypes.byref(filled), c_u64(4096)), "alloc host")
    check(cu.cuMemsetD8Async(c_u64(filled.value), 0x5A, c_u64(4096), stream), "memset pinned")
    check(cu.cuStreamSynchronize(stream), "sync")
    say("filled", ctypes.string_at(filled.value, 4096) == b"\x5a" * 4096)
    fresh, device_pointer = c_u64(), c_u64()
    check(cu.cuMemAllocHost(ctypes.byref(fresh), c_u64(64)), "alloc host")
    check(
        cu.cuPointerGetAttribute(ctypes.byref(device_pointer), 3, fresh), "device pointer"
    )  # DEVICE_POINTER
    say("device_pointer_attribute", device_pointer.value == fresh.value)  # its own address, as under UVA
    check(cu.cuMemFreeHost(fresh), "free")
    check(cu.cuMemFreeHost(c_u64(filled.value)), "free")

    registered = (ctypes.c_uint32 * n)(*range(n))
    check(cu.cuMemHostRegister(ctypes.byref(registered), c_u64(4 * n), 0), "register")
    launched = [
        cu.cuLaunchKernel(
            add, grid, 1, 1, 256, 1, 1, 0, c_u64(0), params(ctypes.addressof(registered), 1), None
        )
        for _ in range(2)
    ]
    say("registered_launch", " ".join(map(str, launched)))
    say("sync_after_registered", cu.cuCtxSynchronize())
    say("registered_words", [registered[0], registered[n - 1]])  # the kernels' + 1 twice, seen here
    check(cu.cuMemHostUnregister(ctypes.byref(registered)), "unregister")
    say("free", f"{cu.cuMemFreeHost(c_u64(a.value))} {cu.cuMemFreeHost(c_u64(b.value))}")


class MemcpyAttributes(ctypes.Structure):  # CUmemcpyAttributes
    _fields_ = [("order", ctypes.c_int), ("src_hint", ctypes.c_int * 2), ("dst_hint", ctypes.c_int * 2),
                ("flags", ctypes.c_uint)]  # fmt: skip


class Operand3D(ctypes.Structure):  # CUmemcpy3DOperand for a pointer
    _fields_ = [("type", ctypes.c_int), ("pad", ctypes.c_int), ("ptr", c_u64), ("row", c_u64), ("layer", c_u64),
                ("hint", ctypes.c_int * 2)]  # fmt: skip


class BatchOp3D(ctypes.Structure):  # CUDA_MEMCPY3D_BATCH_OP
    _fields_ = [("src", Operand3D), ("dst", Operand3D), ("extent", c_u64 * 3), ("order", ctypes.c_int),
                ("flags", ctypes.c_uint)]  # fmt: skip


def scenario_batched_copies():
    """cuMemcpyBatchAsync (both ABIs) with copies of every direction in one batch, two attribute entries,
    host sources read before the call returns; its refusals (an invalid access order, attribute indices
    not starting at 0) with the failing copy's index; cuMemcpy3DBatchAsync of a sub-rectangle between
    pointers, both ways."""
    import struct

    setup()
    stream = c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 1), "stream")
    rc, dev = alloc(1 << 20)
    check(rc, "alloc")
    pinned = c_u64()
    check(cu.cuMemAllocHost(ctypes.byref(pinned), c_u64(4096)), "alloc host")
    source = ctypes.create_string_buffer(bytes(range(256)) * 16)  # 4 KiB of pageable memory
    ctypes.memmove(pinned.value, b"\xab" * 4096, 4096)
    back, back_pinned = ctypes.create_string_buffer(4096), ctypes.create_string_buffer(4096)
    dsts = (c_u64 * 4)(dev, dev + 8192, ctypes.addressof(back), ctypes.addressof(back_pinned))
    srcs = (c_u64 * 4)(ctypes.addressof(source), pinned.value, dev, dev + 8192)
    sizes = (c_u64 * 4)(4096, 4096, 4096, 4096)
    attrs = (MemcpyAttributes * 2)(MemcpyAttributes(2), MemcpyAttributes(1))  # DURING_API_CALL, STREAM
    fail = c_u64(7)
    rc = cu.cuMemcpyBatchAsync(dsts, srcs, sizes, c_u64(2), attrs, (c_u64 * 2)(0, 1), c_u64(2), ctypes.byref(fail),
                               stream)  # fmt: skip
    ctypes.memmove(source, b"\0" * 4096, 4096)  # the source was read by the call
    check(rc, "batch to the device")
    ends = (c_u64 * 1)(0)
    rc = lib.cuMemcpyBatchAsync_v2(ctypes.byref(dsts, 16), ctypes.byref(srcs, 16), ctypes.byref(sizes, 16), c_u64(2),
                                   attrs, ends, c_u64(1), stream)  # fmt: skip  # the CUDA 13 ABI: no failIdx
    check(rc, "batch to the host")
    check(cu.cuStreamSynchronize(stream), "sync")
    pattern = b"\xab" * 4096
    say("batched", f"{back.raw == bytes(range(256)) * 16} {back_pinned.raw == pattern}")
    bad = (MemcpyAttributes * 1)(MemcpyAttributes(0))
    say("invalid_order", cu.cuMemcpyBatchAsync(dsts, srcs, sizes, c_u64(1), bad, ends, c_u64(1), ctypes.byref(fail),
                                               stream))  # fmt: skip
    rc = cu.cuMemcpyBatchAsync(dsts, srcs, sizes, c_u64(2), attrs, (c_u64 * 2)(1, 1), c_u64(2), ctypes.byref(fail),
                               stream)  # fmt: skip
    say("first_index_not_0", f"{rc} {fail.value == 2**64 - 1}")
    past_end = (c_u64 * 2)(dev, dev + (1 << 20) - 16)  # the second copy runs past the allocation's end
    rc = cu.cuMemcpyBatchAsync(past_end, (c_u64 * 2)(ctypes.addressof(source), ctypes.addressof(source)), sizes,
                               c_u64(2), attrs, (c_u64 * 2)(0, 1), c_u64(2), ctypes.byref(fail), stream)  # fmt: skip
    say("failing_copy", f"{rc} {fail.value}")

    # 3D: rows 1..3 of columns 4..11 of a 16 x 8 byte host image, into a device image of rows of 32.
    image = ctypes.create_string_buffer(bytes(range(128)))
    up = BatchOp3D(Operand3D(1, 0, ctypes.addressof(image) + 16 + 4, 16, 8), Operand3D(1, 0, dev, 32, 8),
                   (c_u64 * 3)(8, 3, 1), 1)  # fmt: skip
    check(cu.cuMemsetD8(c_u64(dev), 0, c_u64(256)), "zero")
    check(lib.cuMemcpy3DBatchAsync_v2(c_u64(1), ctypes.byref(up), c_u64(0), stream), "3D batch up")
    down = ctypes.create_string_buffer(96)
    whole = BatchOp3D(Operand3D(1, 0, dev, 0, 0), Operand3D(1, 0, ctypes.addressof(down), 0, 0),
                      (c_u64 * 3)(96, 1, 1), 1)  # fmt: skip
    check(
        cu.cuMemcpy3DBatchAsync(c_u64(1), ctypes.byref(whole), ctypes.byref(fail), c_u64(0), stream),
        "3D down",
    )
    check(cu.cuStreamSynchronize(stream), "sync")
    say("rows_3d", [struct.unpack_from("8B", down.raw, 32 * r) for r in range(3)])
    say("gaps_3d", down.raw[8:32] == bytes(24))
    array_op = BatchOp3D(Operand3D(2, 0, 0, 0, 0), Operand3D(1, 0, dev, 0, 0), (c_u64 * 3)(8, 1, 1), 1)
    rc = cu.cuMemcpy3DBatchAsync(c_u64(1), ctypes.byref(array_op), ctypes.byref(fail), c_u64(0), stream)
    say("array_operand", f"{rc} {fail.value}")


def scenario_pool_usage():
    """What a device pool says it holds (CuPy's MemoryAsyncPool reads these): used and reserved bytes of
    the current pool and of a created one as stream-ordered allocations come and go, the high marks and
    their reset, and a trim."""
    import struct

    setup()
    stream = c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 1), "stream")
    current, created = c_u64(), c_u64()
    check(cu.cuDeviceGetMemPool(ctypes.byref(current), 0), "current pool")
    props = ctypes.create_string_buffer(struct.pack("<iiii", 1, 0, 1, 0).ljust(88, b"\0"))  # pinned, device 0
    check(cu.cuMemPoolCreate(ctypes.byref(created), props), "created pool")

    def figures(pool):  # RESERVED_MEM_CURRENT, RESERVED_MEM_HIGH, USED_MEM_CURRENT, USED_MEM_HIGH
        values = []
        for attr in (5, 6, 7, 8):
            value = c_u64()
            check(cu.cuMemPoolGetAttribute(pool, attr, ctypes.byref(value)), f"attribute {attr}")
            values.append(value.value)
        return values

    a, b, c = c_u64(), c_u64(), c_u64()
    check(cu.cuMemAllocAsync(ctypes.byref(a), c_u64(1000), stream), "alloc a")
    check(cu.cuMemAllocAsync(ctypes.byref(b), c_u64(3 << 20), stream), "alloc b")
    check(cu.cuMemAllocFromPoolAsync(ctypes.byref(c), c_u64(4096), created, stream), "alloc c")
    say("current_after_allocs", figures(current.value))
    say("created_after_alloc", figures(created.value))
    check(cu.cuMemFreeAsync(b, stream), "free b")
    say("current_after_free", figures(current.value))
    zero = c_u64(0)
    check(cu.cuMemPoolSetAttribute(current, 8, ctypes.byref(zero)), "reset used high")
    say("current_after_reset", figures(current.value))
    check(cu.cuStreamSynchronize(stream), "sync")
    check(cu.cuMemPoolTrimTo(current, c_u64(0)), "trim")
    say("current_after_trim", figures(current.value))
    check(cu.cuMemFreeAsync(a, stream), "free a")
    check(cu.cuMemFreeAsync(c, stream), "free c")
    check(cu.cuMemPoolTrimTo(created, c_u64(0)), "trim created")
    say("created_after_free_and_trim", figures(created.value))


def scenario_host_pools():
    """Stream-ordered pools of page-locked host memory and of managed memory (cuda.core's
    PinnedMemoryResource and ManagedMemoryResource): the current and default pools of those kinds, a
    created one of each, allocations that the host and kernels both use, their attributes, frees and
    the pools' end; a host pool to share with other processes is refused."""
    import struct

    setup()
    module, add = c_u64(), c_u64()
    check(cu.cuModuleLoadData(ctypes.byref(module), b"// module\n"), "load")
    check(cu.cuModuleGetFunction(ctypes.byref(add), module, b"add_u32"), "add")
    stream = c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 1), "stream")
    host, device0 = (ctypes.c_int * 2)(2, -1), (ctypes.c_int * 2)(1, 0)  # CUmemLocation: HOST; DEVICE 0
    current, default, device_pool, device_current = c_u64(), c_u64(), c_u64(), c_u64()
    check(lib.cuMemGetMemPool(ctypes.byref(current), host, 1), "current host pool")  # CUDA 13 entry points
    check(lib.cuMemGetDefaultMemPool(ctypes.byref(default), host, 1), "default host pool")
    check(cu.cuDeviceGetMemPool(ctypes.byref(device_pool), 0), "device pool")
    check(lib.cuMemGetMemPool(ctypes.byref(device_current), device0, 1), "current device pool")
    managed_current, nowhere = c_u64(), (ctypes.c_int * 2)(0, -1)  # CU_MEM_LOCATION_TYPE_NONE
    check(
        lib.cuMemGetMemPool(ctypes.byref(managed_current), nowhere, 2), "current managed pool"
    )  # as cuda.core
    say("current_is_default", current.value == default.value)
    say("device_pool_is_the_workers", device_current.value == device_pool.value)

    def props(kind, location, handle_types=0):  # CUmemPoolProps, 88 bytes
        return ctypes.create_string_buffer(
            struct.pack("<iiii", kind, handle_types, *location).ljust(88, b"\0")
        )

    pinned_pool, managed_pool, shared = c_u64(), c_u64(), c_u64()
    check(cu.cuMemPoolCreate(ctypes.byref(pinned_pool), props(1, (3, 0))), "pinned pool")  # HOST_NUMA 0
    check(cu.cuMemPoolCreate(ctypes.byref(managed_pool), props(2, (1, 0))), "managed pool")
    say("shareable_host_pool", cu.cuMemPoolCreate(ctypes.byref(shared), props(1, (3, 0), handle_types=1)))
    access = (ctypes.c_int * 3)(1, 0, 3)
    say("set_access", cu.cuMemPoolSetAccess(pinned_pool, access, c_u64(1)))
    n = 20_000
    results = {}
    pools = {
        "current": current,
        "pinned": pinned_pool,
        "managed": managed_pool,
        "managed_current": managed_current,
    }
    for name, pool in pools.items():
        ptr = c_u64()
        check(cu.cuMemAllocFromPoolAsync(ctypes.byref(ptr), c_u64(4 * n), pool, stream), f"alloc {name}")
        words = (ctypes.c_uint32 * n).from_address(ptr.value)
        for i in range(0, n, 1000):
            words[i] = i
        args = [c_u64(ptr.value), ctypes.c_uint32(7), ctypes.c_uint32(n)]
        params = (ctypes.c_void_p * 3)(*[ctypes.addressof(x) for x in args])
        check(cu.cuLaunchKernel(add, (n + 255) // 256, 1, 1, 256, 1, 1, 0, stream, params, None), "launch")
        check(cu.cuStreamSynchronize(stream), "sync")
        used = c_u64()
        check(cu.cuMemPoolGetAttribute(pool, 7, ctypes.byref(used)), "used")  # USED_MEM_CURRENT
        results[name] = f"{words[0]} {words[n - 1000]} {used.value}"
        check(cu.cuMemFreeAsync(c_u64(ptr.value), stream), f"free {name}")
        check(cu.cuMemPoolGetAttribute(pool, 7, ctypes.byref(used)), "used")
        results[name] += f" {used.value}"
    for name, value in results.items():
        say(name, value)
    threshold = c_u64(1 << 30)
    check(cu.cuMemPoolSetAttribute(pinned_pool, 4, ctypes.byref(threshold)), "threshold")
    threshold.value = 0
    check(cu.cuMemPoolGetAttribute(pinned_pool, 4, ctypes.byref(threshold)), "threshold")
    say("threshold", threshold.value)
    say("trim", cu.cuMemPoolTrimTo(pinned_pool, c_u64(0)))
    say("destroy", f"{cu.cuMemPoolDestroy(pinned_pool)} {cu.cuMemPoolDestroy(managed_pool)}")
    say("destroy_default", cu.cuMemPoolDestroy(default))
    ptr = c_u64()
    say("alloc_from_destroyed", cu.cuMemAllocFromPoolAsync(ctypes.byref(ptr), c_u64(64), pinned_pool, stream))


def scenario_graph_pinned_copies():
    """The runtime's cudaGraphAddMemcpyNode samples: a graph that copies page-locked host memory
    (cuMemAllocHost) to the device, adds 1 there, and copies the result back into page-locked memory
    (cuMemHostAlloc) and into registered memory; launched twice, the host changing its input in between."""
    import struct

    setup()
    add = module_function(b"add_u32")
    n = 16
    rc, dev = alloc(4 * n)
    check(rc, "alloc")
    source, target = c_u64(), c_u64()
    check(cu.cuMemAllocHost(ctypes.byref(source), c_u64(4 * n)), "alloc host")
    check(cu.cuMemHostAlloc(ctypes.byref(target), c_u64(4 * n), 0), "host alloc")
    registered = (ctypes.c_uint32 * n)()
    check(cu.cuMemHostRegister(ctypes.byref(registered), c_u64(4 * n), 0), "register")
    words_in = (ctypes.c_uint32 * n).from_address(source.value)
    words_out = (ctypes.c_uint32 * n).from_address(target.value)

    def memcpy3d(src, src_host, dst, dst_host):  # CUDA_MEMCPY3D of 4n bytes; memory type 1 host, 2 device
        params = (ctypes.c_uint8 * 200)()
        for at, ptr, host in ((32, src, src_host), (120, dst, dst_host)):
            struct.pack_into("<IxxxxQQ", params, at, 1 if host else 2, ptr if host else 0, 0 if host else ptr)
        struct.pack_into("<QQQ", params, 176, 4 * n, 1, 1)
        return params

    graph, up, kernel, down, down_registered, exe = (c_u64() for _ in range(6))
    check(cu.cuGraphCreate(ctypes.byref(graph), 0), "graph")
    check(cu.cuGraphAddMemcpyNode(ctypes.byref(up), graph, None, c_u64(0), memcpy3d(source.value, True, dev, False),
                                  c_u64(0)), "copy up")  # fmt: skip
    args = [c_u64(dev), ctypes.c_uint32(1), ctypes.c_uint32(n)]
    pointers = (ctypes.c_void_p * 3)(*[ctypes.addressof(x) for x in args])
    node_params = KernelNodeParams(add.value, (ctypes.c_uint32 * 6)(1, 1, 1, n, 1, 1), 0, 0,
                                   ctypes.cast(pointers, ctypes.c_void_p))  # fmt: skip
    check(cu.cuGraphAddKernelNode(ctypes.byref(kernel), graph, ctypes.byref(up), c_u64(1), ctypes.byref(node_params)),
          "kernel")  # fmt: skip
    check(cu.cuGraphAddMemcpyNode(ctypes.byref(down), graph, ctypes.byref(kernel), c_u64(1),
                                  memcpy3d(dev, False, target.value, True), c_u64(0)), "copy down")  # fmt: skip
    rc = cu.cuGraphAddMemcpyNode(ctypes.byref(down_registered), graph, ctypes.byref(kernel), c_u64(1),
                                 memcpy3d(dev, False, ctypes.addressof(registered), True), c_u64(0))  # fmt: skip
    check(rc, "copy down into registered memory")
    check(cu.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, c_u64(0)), "instantiate")
    for first in (0, 100):
        for i in range(n):
            words_in[i] = first + i
        check(cu.cuGraphLaunch(exe, c_u64(0)), "launch")
        check(cu.cuCtxSynchronize(), "sync")
        say(f"launch_{first}", f"{list(words_out)[:3]} {words_out[n - 1]} {list(registered)[:3]}")
    check(cu.cuMemHostUnregister(ctypes.byref(registered)), "unregister")
    say("after_unregister", registered[n - 1])  # the device's bytes stay in the program's memory
    say("free", f"{cu.cuMemFreeHost(c_u64(source.value))} {cu.cuMemFreeHost(c_u64(target.value))}")


class KernelNodeParams(ctypes.Structure):  # CUDA_KERNEL_NODE_PARAMS_v2
    _fields_ = [("func", c_u64), ("dims", ctypes.c_uint32 * 6), ("smem", ctypes.c_uint32), ("pad", ctypes.c_uint32),
                ("params", ctypes.c_void_p), ("extra", ctypes.c_void_p), ("kern", c_u64), ("ctx", c_u64)]  # fmt: skip


def scenario_graph_nodes():
    """A graph built node by node: two kernel nodes created in one order, a dependency that runs them in
    the other, a memset node and an empty node; instantiated, launched, a kernel node's parameters
    changed in the instantiated graph, launched again."""
    setup()
    rc, ptr = alloc(256)
    check(rc, "alloc")
    module, add, fill = c_u64(), c_u64(), c_u64()
    check(cu.cuModuleLoadData(ctypes.byref(module), b"// module\n"), "load")
    check(cu.cuModuleGetFunction(ctypes.byref(add), module, b"add_u32"), "add")
    check(cu.cuModuleGetFunction(ctypes.byref(fill), module, b"fill_u32"), "fill")
    graph, a, b, m, e, exe = c_u64(), c_u64(), c_u64(), c_u64(), c_u64(), c_u64()
    check(cu.cuGraphCreate(ctypes.byref(graph), 0), "graph")
    keep = []

    def kernel(func, value):
        args = [c_u64(ptr), ctypes.c_uint32(value), ctypes.c_uint32(64)]
        pointers = (ctypes.c_void_p * 3)(*[ctypes.addressof(x) for x in args])
        keep.append((args, pointers))
        return KernelNodeParams(func.value, (ctypes.c_uint32 * 6)(1, 1, 1, 64, 1, 1), 0, 0,
                                ctypes.cast(pointers, ctypes.c_void_p))  # fmt: skip

    check(
        cu.cuGraphAddKernelNode(ctypes.byref(a), graph, None, c_u64(0), ctypes.byref(kernel(add, 1))),
        "node a",
    )
    check(
        cu.cuGraphAddKernelNode(ctypes.byref(b), graph, None, c_u64(0), ctypes.byref(kernel(fill, 10))),
        "node b",
    )
    edge_from, edge_to = (c_u64 * 1)(b.value), (c_u64 * 1)(a.value)
    check(cu.cuGraphAddDependencies(graph, edge_from, edge_to, None, c_u64(1)), "b before a")
    memset = (ctypes.c_uint64 * 5)(
        ptr + 256 - 16, 0, 0x01010101 | (4 << 32), 4, 1
    )  # dst, pitch, value|size, width, height
    after_a = (c_u64 * 1)(a.value)
    check(cu.cuGraphAddMemsetNode(ctypes.byref(m), graph, after_a, c_u64(1), memset, c_u64(0)), "memset node")
    check(cu.cuGraphAddEmptyNode(ctypes.byref(e), graph, after_a, c_u64(1)), "empty node")
    say("foreign_dependency", cu.cuGraphAddEmptyNode(ctypes.byref(e), graph, (c_u64 * 1)(12345), c_u64(1)))
    check(cu.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, c_u64(0)), "instantiate")
    check(cu.cuGraphLaunch(exe, c_u64(0)), "launch")
    check(cu.cuCtxSynchronize(), "sync")
    say("first", struct.unpack("<I", dtoh(ptr, 4)[1])[0])
    say("memset", dtoh(ptr + 256 - 16, 4)[1].hex())
    check(cu.cuGraphExecKernelNodeSetParams(exe, a, ctypes.byref(kernel(add, 5))), "set params")
    check(cu.cuGraphLaunch(exe, c_u64(0)), "launch again")
    check(cu.cuCtxSynchronize(), "sync")
    say("second", struct.unpack("<I", dtoh(ptr, 4)[1])[0])


def scenario_graph_node_params():
    """What PyTorch's and XLA's graphs do with a graph's own nodes: read a memset and a host node's
    parameters back, set a kernel, memset, copy and host node anew (a graph instantiated before keeps the old ones, one
    instantiated after runs the new), remove an edge, ask the ids and the containing graph; node handles
    and memory that are not the lease's are refused."""
    setup()
    cu131 = Driver(13010)  # the ids and the containing graph: CUDA 13.1
    n = 64
    rc, ptr = alloc(4 * n)
    check(rc, "alloc")
    rc, out = alloc(64)
    check(rc, "alloc out")
    module, fill = c_u64(), c_u64()
    check(cu.cuModuleLoadData(ctypes.byref(module), b"// module\n"), "load")
    check(cu.cuModuleGetFunction(ctypes.byref(fill), module, b"fill_u32"), "fill")
    keep, ran = [], []
    recorder = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(ran.append)  # a host node: the value it was given

    def host(value):  # CUDA_HOST_NODE_PARAMS
        return (ctypes.c_void_p * 2)(ctypes.cast(recorder, ctypes.c_void_p), value)

    def read_host(node):
        got = (ctypes.c_void_p * 2)()
        rc = cu.cuGraphHostNodeGetParams(node, got)
        return rc, got[0] == ctypes.cast(recorder, ctypes.c_void_p).value, got[1]

    def kernel(value):
        args = [c_u64(ptr), ctypes.c_uint32(value), ctypes.c_uint32(n)]
        pointers = (ctypes.c_void_p * 3)(*[ctypes.addressof(x) for x in args])
        keep.append((args, pointers))
        return KernelNodeParams(fill.value, (ctypes.c_uint32 * 6)(1, 1, 1, n, 1, 1), 0, 0,
                                ctypes.cast(pointers, ctypes.c_void_p))  # fmt: skip

    def memset(dst, value, width):  # CUDA_MEMSET_NODE_PARAMS: 4-byte elements, one row
        return ctypes.create_string_buffer(struct.pack("<QQIIQQ", dst, 0, value, 4, width, 1), 40)

    def read_copy(node):
        got = (ctypes.c_uint8 * 200)()
        rc = cu.cuGraphMemcpyNodeGetParams(node, got)
        return rc, bytes(got)

    def read_kernel(node):  # rc, and the function, shape and arguments (through kernelParams) read back
        got = KernelNodeParams()
        rc = cu.cuGraphKernelNodeGetParams(node, ctypes.byref(got))
        if rc:
            return rc, got
        at = ctypes.cast(got.params, ctypes.POINTER(ctypes.c_void_p))
        args = c_u64.from_address(at[0]).value == ptr, ctypes.c_uint32.from_address(at[1]).value
        shown = f"{got.func == fill.value} {list(got.dims)} {got.smem} {args[0]} {args[1]}"
        return rc, f"{shown} {ctypes.c_uint32.from_address(at[2]).value}", got

    def read_memset(node):
        got = ctypes.create_string_buffer(40)
        rc = cu.cuGraphMemsetNodeGetParams(node, got)
        return rc, struct.unpack("<QQIIQQ", got.raw)

    def run(exe):
        check(cu.cuMemsetD8(c_u64(ptr), 0, c_u64(4 * n)), "zero")
        check(cu.cuMemsetD8(c_u64(out), 0, c_u64(64)), "zero out")
        check(cu.cuGraphLaunch(exe, c_u64(0)), "launch")
        check(cu.cuCtxSynchronize(), "sync")
        words = struct.unpack("<16I", dtoh(out, 64)[1])
        return f"{struct.unpack('<I', dtoh(ptr, 4)[1])[0]} {words[0]:x} {words[4]:x}"

    graph, k, m, c, h, old, new = (c_u64() for _ in range(7))
    check(cu.cuGraphCreate(ctypes.byref(graph), 0), "graph")
    check(cu.cuGraphAddKernelNode(ctypes.byref(k), graph, None, c_u64(0), ctypes.byref(kernel(10))), "kernel")
    check(cu.cuGraphAddMemsetNode(ctypes.byref(m), graph, ctypes.byref(k), c_u64(1),
                                  memset(ptr + 128, 0x01010101, 4), c_u64(0)), "memset")  # fmt: skip
    check(cu.cuGraphAddMemcpyNode(ctypes.byref(c), graph, ctypes.byref(m), c_u64(1), device_copy_3d(ptr + 128, out, 16),
                                  c_u64(0)), "copy")  # fmt: skip
    check(cu.cuGraphAddHostNode(ctypes.byref(h), graph, None, c_u64(0), host(7)), "host node")
    rc, params = read_memset(m)
    say("memset_read_back", f"{rc} {params == (ptr + 128, 0, 0x01010101, 4, 4, 1)}")
    say("host_read_back", " ".join(map(str, read_host(h))))
    say("kernel_read_back", " ".join(map(str, read_kernel(k)[:2])))
    say("copy_read_back", f"{read_copy(c)[0]} {read_copy(c)[1] == bytes(device_copy_3d(ptr + 128, out, 16))}")
    check(cu.cuGraphInstantiateWithFlags(ctypes.byref(old), graph, c_u64(0)), "instantiate")
    say("first", run(old))
    check(cu.cuGraphKernelNodeSetParams(k, ctypes.byref(kernel(20))), "kernel anew")
    check(cu.cuGraphMemsetNodeSetParams(m, memset(ptr + 128, 0x02020202, 4)), "memset anew")
    check(cu.cuGraphMemcpyNodeSetParams(c, device_copy_3d(ptr + 128, out + 16, 16)), "copy anew")
    check(cu.cuGraphHostNodeSetParams(h, host(8)), "host anew")
    say("host_read_back_anew", " ".join(map(str, read_host(h))))
    say("kernel_read_back_anew", " ".join(map(str, read_kernel(k)[:2])))
    say("copy_read_back_anew", read_copy(c)[1] == bytes(device_copy_3d(ptr + 128, out + 16, 16)))
    rc, params = read_memset(m)
    say("memset_read_back_anew", f"{rc} {params == (ptr + 128, 0, 0x02020202, 4, 4, 1)}")
    say("instantiated_before", run(old))
    check(cu.cuGraphInstantiateWithFlags(ctypes.byref(new), graph, c_u64(0)), "instantiate anew")
    say("instantiated_after", run(new))
    check(cu.cuGraphExecHostNodeSetParams(old, h, host(9)), "instantiated host node anew")
    run(old)
    say("host_ran", ran)  # the first launch, the old instance twice (then set anew), the new one
    count = c_u64(0)
    check(cu.cuGraphNodeGetDependencies(m, None, None, ctypes.byref(count)), "dependencies")
    removed = cu.cuGraphRemoveDependencies(graph, ctypes.byref(k), ctypes.byref(m), None, c_u64(1))
    after = c_u64(0)
    check(cu.cuGraphNodeGetDependencies(m, None, None, ctypes.byref(after)), "dependencies after")
    again = cu.cuGraphRemoveDependencies(graph, ctypes.byref(k), ctypes.byref(m), None, c_u64(1))
    say("removed", f"{removed} {count.value} {after.value} {again}")

    def attribute(node, attr, value=None):  # CUkernelNodeAttrValue: 64 bytes; a priority is an int first
        raw = ctypes.create_string_buffer(64)
        if value is not None:
            ctypes.memmove(raw, value, len(value))
            return cu.cuGraphKernelNodeSetAttribute(node, attr, raw)
        rc = cu.cuGraphKernelNodeGetAttribute(node, attr, raw)
        return rc, struct.unpack_from("<i", raw.raw)[0]

    priority = struct.pack("<i", -1)
    say("attribute_set", f"{attribute(k, 8, priority)} {attribute(k, 8)}")  # CU_LAUNCH_ATTRIBUTE_PRIORITY
    window = struct.pack("<QQfii", 0x1000, 4096, 1.0, 2, 0)  # an access-policy window outside the lease
    say("attribute_window_outside_the_lease", attribute(k, 1, window))
    say("attribute_event", attribute(k, 7, struct.pack("<Q", 1)))  # PROGRAMMATIC_EVENT: an event handle
    other_graph, other = c_u64(), c_u64()
    check(cu.cuGraphCreate(ctypes.byref(other_graph), 0), "other graph")
    check(cu.cuGraphAddKernelNode(ctypes.byref(other), other_graph, None, c_u64(0), ctypes.byref(kernel(1))),
          "other kernel")  # fmt: skip
    say("attribute_copied", f"{cu.cuGraphKernelNodeCopyAttributes(other, k)} {attribute(other, 8)}")
    _rc, _shown, read_back = read_kernel(k)
    check(
        cu.cuGraphKernelNodeSetParams(other, ctypes.byref(read_back)), "read-back parameters set on another"
    )
    say("kernel_round_trip", read_kernel(other)[1])
    pinned, pinned_graph, pinned_copy, clone, twin = (c_u64() for _ in range(5))
    check(cu.cuMemAllocHost(ctypes.byref(pinned), c_u64(64)), "pinned")
    from_pinned = device_copy_3d(0, out, 16)  # from page-locked host memory (memory type 1, its host pointer)
    struct.pack_into("<IxxxxQQ", from_pinned, 32, 1, pinned.value, 0)
    check(cu.cuGraphCreate(ctypes.byref(pinned_graph), 0), "pinned graph")
    check(cu.cuGraphAddMemcpyNode(ctypes.byref(pinned_copy), pinned_graph, None, c_u64(0), from_pinned, c_u64(0)),
          "copy from pinned memory")  # fmt: skip
    say(
        "copy_read_back_pinned", read_copy(pinned_copy)[1] == bytes(from_pinned)
    )  # the program's host pointer
    check(cu.cuGraphClone(ctypes.byref(clone), pinned_graph), "clone")
    check(cu.cuGraphNodeFindInClone(ctypes.byref(twin), pinned_copy, clone), "twin")
    rc, twin_params = read_copy(twin)  # a twin the program did not describe: the device side
    say("copy_read_back_twin", f"{rc} {struct.unpack_from('<I', twin_params, 32)[0]}")
    containing, tools = c_u64(), c_u64()
    check(cu131.cuGraphNodeGetContainingGraph(k, ctypes.byref(containing)), "containing graph")
    ids = [ctypes.c_uint32() for _ in range(5)]
    check(cu131.cuGraphNodeGetLocalId(k, ctypes.byref(ids[0])), "local id")
    check(cu131.cuGraphNodeGetLocalId(m, ctypes.byref(ids[1])), "local id")
    check(cu131.cuGraphGetId(graph, ctypes.byref(ids[2])), "graph id")
    check(cu131.cuGraphExecGetId(old, ctypes.byref(ids[3])), "exec id")
    check(cu131.cuGraphExecGetId(new, ctypes.byref(ids[4])), "exec id")
    check(cu131.cuGraphNodeGetToolsId(k, ctypes.byref(tools)), "tools id")
    say(
        "ids",
        f"{containing.value == graph.value} {ids[0].value != ids[1].value} {ids[3].value != ids[4].value}",
    )
    foreign = c_u64(12345)
    say("foreign_node", " ".join(str(rc) for rc in (
        read_memset(foreign)[0],
        cu.cuGraphKernelNodeSetParams(foreign, ctypes.byref(kernel(1))),
        cu.cuGraphMemsetNodeSetParams(foreign, memset(ptr, 1, 4)),
        cu131.cuGraphNodeGetLocalId(foreign, ctypes.byref(ids[0])),
        read_host(foreign)[0],
        cu.cuGraphHostNodeSetParams(foreign, host(1)),
        cu.cuGraphKernelNodeCopyAttributes(k, foreign),
        attribute(foreign, 8)[0],
        read_copy(foreign)[0],
        read_kernel(foreign)[0],
    )))  # fmt: skip
    say(
        "foreign_edge",
        cu.cuGraphRemoveDependencies(graph, ctypes.byref(foreign), ctypes.byref(m), None, c_u64(1)),
    )
    say("memset_outside_the_lease", cu.cuGraphMemsetNodeSetParams(m, memset(0x1000, 1, 4)))
    say("memset_past_the_allocation", cu.cuGraphMemsetNodeSetParams(m, memset(ptr + 4 * n - 8, 1, 4)))
    say("copy_past_the_allocation", cu.cuGraphMemcpyNodeSetParams(c, device_copy_3d(ptr, out + 32, 64)))
    say("memset_params_on_a_kernel_node", cu.cuGraphMemsetNodeSetParams(k, memset(ptr, 1, 4)))
    say("host_params_of_a_kernel_node", f"{read_host(k)[0]} {cu.cuGraphHostNodeSetParams(k, host(1))}")
    say("kernel_params_of_a_memset_node", read_kernel(m)[0])
    rc, params = read_memset(m)
    say("memset_kept", f"{rc} {params[2] == 0x02020202}")

    def generic(node_type, typed):  # CUgraphNodeParams: the type, then the typed parameters at 16
        params = (ctypes.c_uint8 * 256)()
        struct.pack_into("<I", params, 0, node_type)
        ctypes.memmove(ctypes.addressof(params) + 16, ctypes.addressof(typed), ctypes.sizeof(typed))
        return params

    set_memset = cu.cuGraphNodeSetParams(m, generic(2, memset(ptr + 128, 0x03030303, 4)))
    say("generic_memset", f"{set_memset} {read_memset(m)[1][2] == 0x03030303}")
    check(cu.cuGraphExecNodeSetParams(new, k, generic(0, kernel(30))), "generic kernel on the instance")
    say("generic_kernel_instance", run(new))
    say("generic_type_mismatch", cu.cuGraphNodeSetParams(k, generic(2, memset(ptr, 1, 4))))

    def read_generic(node):  # rc, the type, and the typed parameters' first bytes
        got = (ctypes.c_uint8 * 256)()
        rc = cu131.cuGraphNodeGetParams(node, got)
        return rc, struct.unpack_from("<I", got)[0], bytes(got)[16:]

    kernel_params, memset_params, copy_params, host_params = (read_generic(n) for n in (k, m, c, h))
    say("generic_read_back", " ".join(str(x) for x in (
        kernel_params[:2], struct.unpack_from("<Q", kernel_params[2])[0] == fill.value,
        memset_params[:2], struct.unpack_from("<I", memset_params[2], 16)[0] == 0x03030303,
        copy_params[:2], copy_params[2][16:216] == bytes(device_copy_3d(ptr + 128, out + 16, 16)),
        host_params[:2], struct.unpack_from("<Q", host_params[2], 8)[0],
    )))  # fmt: skip
    say("generic_read_back_foreign", read_generic(foreign)[0])
    dot = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"gpupool-graph-{os.getpid()}.dot")
    rc = cu.cuGraphDebugDotPrint(graph, dot.encode(), 0)
    with open(dot) as f:
        text = f.read()
    os.unlink(dot)
    say("dot", f"{rc} {text.startswith('digraph')} {str(k.value) in text or 'kernel' in text.lower()}")
    say("dot_unwritable", cu.cuGraphDebugDotPrint(graph, b"/nonexistent-dir/graph.dot", 0))
    say("dot_foreign_graph", cu.cuGraphDebugDotPrint(c_u64(12345), dot.encode(), 0))


def scenario_graph_conditionals():
    """What cuda.core's graph builder does: a conditional node added to a capturing stream's graph after
    the capture's dependency nodes, its body captured into from another stream (a while loop counting
    down), then an if/else node whose condition a kernel sets, a child graph node, and the instantiated
    graph updated from a graph of the same shape (and refused one of another)."""
    ctx = setup()
    rc, ptr = alloc(256)
    check(rc, "alloc")
    check(cu.cuMemsetD8(c_u64(ptr), 0, c_u64(256)), "zero")
    module, add, count_down, set_condition = c_u64(), c_u64(), c_u64(), c_u64()
    check(cu.cuModuleLoadData(ctypes.byref(module), b"// module\n"), "load")
    for fn, name in ((add, b"add_u32"), (count_down, b"count_down"), (set_condition, b"set_condition")):
        check(cu.cuModuleGetFunction(ctypes.byref(fn), module, name), name.decode())
    stream, body_stream = c_u64(), c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 1), "stream")
    check(cu.cuStreamCreate(ctypes.byref(body_stream), 1), "body stream")
    keep, ran = [], []
    recorder = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(ran.append)  # a host node: the value it was given

    def launch(fn, s, *args):
        pointers = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
        keep.append((args, pointers))
        check(cu.cuLaunchKernel(fn, 1, 1, 1, 4, 1, 1, 0, s, pointers, None), "launch")

    def captured_graph(value):
        """add `value` to word 0, then a while loop: add 1 to word 1 and count word 2 down from 3."""
        check(cu.cuStreamBeginCapture(stream, 0), "begin capture")
        launch(add, stream, c_u64(ptr), ctypes.c_uint32(value), ctypes.c_uint32(1))
        status, capture_id, graph, deps, count = ctypes.c_int(), c_u64(), c_u64(), ctypes.c_void_p(), c_u64()
        check(cu.cuStreamGetCaptureInfo(stream, ctypes.byref(status), ctypes.byref(capture_id),
                                           ctypes.byref(graph), ctypes.byref(deps), None, ctypes.byref(count)),
              "capture info")  # fmt: skip
        say("capture_deps", f"{status.value} {count.value} {bool(deps.value)}")
        handle = c_u64()
        check(cu.cuGraphConditionalHandleCreate(ctypes.byref(handle), graph, ctx, 1, 1), "handle")
        params = (ctypes.c_uint8 * 256)()
        struct.pack_into("<I", params, 0, 13)  # CU_GRAPH_NODE_TYPE_CONDITIONAL
        struct.pack_into("<QII", params, 16, handle.value, 1, 1)  # handle, CU_GRAPH_COND_TYPE_WHILE, size
        struct.pack_into("<Q", params, 40, ctx.value)
        node = c_u64()
        check(cu.cuGraphAddNode(ctypes.byref(node), graph, deps, None, count, params), "while node")
        bodies = ctypes.cast(struct.unpack_from("<Q", params, 32)[0], ctypes.POINTER(c_u64))
        check(cu.cuStreamUpdateCaptureDependencies(stream, ctypes.byref(node), None, c_u64(1), 1), "deps")
        check(cu.cuStreamBeginCaptureToGraph(body_stream, bodies[0], None, None, c_u64(0), 0), "capture body")
        launch(add, body_stream, c_u64(ptr + 4), ctypes.c_uint32(1), ctypes.c_uint32(1))
        launch(count_down, body_stream, handle, c_u64(ptr + 8))
        body = c_u64()
        check(cu.cuStreamEndCapture(body_stream, ctypes.byref(body)), "end body")
        say("body_is_the_nodes_graph", body.value == bodies[0])
        check(cu.cuLaunchHostFunc(stream, recorder, ctypes.c_void_p(value)), "host node")
        finished = c_u64()
        check(cu.cuStreamEndCapture(stream, ctypes.byref(finished)), "end capture")
        return finished

    graph = captured_graph(100)
    exe = c_u64()
    check(cu.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, c_u64(0)), "instantiate")
    check(cu.cuMemsetD32(c_u64(ptr + 8), 3, c_u64(1)), "counter")
    check(cu.cuGraphLaunch(exe, stream), "launch graph")
    check(cu.cuStreamSynchronize(stream), "sync")
    say("after_while", list(struct.unpack("<III", dtoh(ptr, 12)[1])))

    # if/else on a condition a kernel sets; a child graph; node by node
    g, child, handle = c_u64(), c_u64(), c_u64()
    check(cu.cuGraphCreate(ctypes.byref(g), 0), "graph")
    check(cu.cuGraphCreate(ctypes.byref(child), 0), "child")
    empty = c_u64()
    check(cu.cuGraphAddEmptyNode(ctypes.byref(empty), child, None, c_u64(0)), "child's node")
    check(cu.cuGraphConditionalHandleCreate(ctypes.byref(handle), g, ctx, 0, 0), "handle")
    setter, cond, child_node = c_u64(), c_u64(), c_u64()
    value = ctypes.c_uint32(0)
    args = (handle, value)
    pointers = (ctypes.c_void_p * 2)(*[ctypes.addressof(a) for a in args])
    kernel = KernelNodeParams(set_condition.value, (ctypes.c_uint32 * 6)(1, 1, 1, 1, 1, 1), 0, 0,
                              ctypes.cast(pointers, ctypes.c_void_p))  # fmt: skip
    check(cu.cuGraphAddKernelNode(ctypes.byref(setter), g, None, c_u64(0), ctypes.byref(kernel)), "setter")
    params = (ctypes.c_uint8 * 256)()
    struct.pack_into("<I", params, 0, 13)
    struct.pack_into("<QII", params, 16, handle.value, 0, 2)  # CU_GRAPH_COND_TYPE_IF with an else
    check(
        cu.cuGraphAddNode(ctypes.byref(cond), g, ctypes.byref(setter), None, c_u64(1), params), "if/else node"
    )
    bodies = ctypes.cast(struct.unpack_from("<Q", params, 32)[0], ctypes.POINTER(c_u64))
    for i, word in ((0, 12), (1, 16)):  # the if body adds to word 3, the else body to word 4
        memset = (ctypes.c_uint64 * 5)(ptr + word, 0, 7 | (4 << 32), 1, 1)
        n = c_u64()
        check(cu.cuGraphAddMemsetNode(ctypes.byref(n), bodies[i], None, c_u64(0), memset, c_u64(0)), "body")
    check(
        cu.cuGraphAddChildGraphNode(ctypes.byref(child_node), g, ctypes.byref(cond), c_u64(1), child), "child"
    )
    ge = c_u64()
    check(cu.cuGraphInstantiateWithFlags(ctypes.byref(ge), g, c_u64(0)), "instantiate")
    check(cu.cuGraphLaunch(ge, c_u64(0)), "launch")
    check(cu.cuCtxSynchronize(), "sync")
    say("if_else_with_0", list(struct.unpack("<II", dtoh(ptr + 12, 8)[1])))

    # the while graph updated from one of the same shape adding 5; one of another shape refused
    info = (ctypes.c_uint8 * 24)()
    say("update", cu.cuGraphExecUpdate(exe, captured_graph(5), info))
    for _ in range(2):
        check(cu.cuMemsetD32(c_u64(ptr + 8), 3, c_u64(1)), "counter")
        check(cu.cuGraphLaunch(exe, stream), "launch updated")
    check(cu.cuStreamSynchronize(stream), "sync")
    say("after_update", list(struct.unpack("<III", dtoh(ptr, 12)[1])))
    say("host_nodes_ran", ran)
    say("other_shape", f"{cu.cuGraphExecUpdate(exe, child, info)} {struct.unpack_from('<I', info)[0]}")
    say("foreign_node", cu.cuStreamUpdateCaptureDependencies(stream, ctypes.byref(c_u64(4242)), None,
                                                                c_u64(1), 1))  # fmt: skip


def memcpy3d(src, dst, width, host=False):
    """CUDA_MEMCPY3D of `width` bytes from device memory (or host memory of this process) to device memory."""
    params = (ctypes.c_uint8 * 200)()
    struct.pack_into("<IxxxxQQ", params, 32, 1 if host else 2, src if host else 0, 0 if host else src)
    struct.pack_into("<IxxxxQQ", params, 120, 2, 0, dst)
    struct.pack_into("<QQQ", params, 176, width, 1, 1)
    return params


def memset_node(dst, value, width):
    """CUDA_MEMSET_NODE_PARAMS of `width` bytes of `value`: dst, pitch, value | elementSize 1, width, height."""
    return (ctypes.c_uint64 * 5)(dst, 0, value | (1 << 32), width, 1)


def scenario_graph_updates():
    """An instantiated graph's nodes set anew as XLA's command buffers do: a memset node's value, a copy
    node's source, a child graph swapped, a node switched off and on; root nodes and a node's neighbours
    read back; a memset node set to memory outside the lease refused."""
    setup()
    rc, ptr = alloc(256)
    check(rc, "alloc")
    check(cu.cuMemsetD8(c_u64(ptr), 0, c_u64(256)), "zero")
    check(cu.cuMemsetD8(c_u64(ptr + 192), 7, c_u64(16)), "a second source")
    graph, child, other_child = c_u64(), c_u64(), c_u64()
    for g in (graph, child, other_child):
        check(cu.cuGraphCreate(ctypes.byref(g), 0), "graph")
    inner = c_u64()
    check(cu.cuGraphAddMemsetNode(ctypes.byref(inner), child, None, c_u64(0), memset_node(ptr + 128, 3, 16), c_u64(0)),
          "child's memset")  # fmt: skip
    check(cu.cuGraphAddMemsetNode(ctypes.byref(inner), other_child, None, c_u64(0),
                                  memset_node(ptr + 128, 5, 16), c_u64(0)), "other child's memset")  # fmt: skip
    ms, cp, ch = c_u64(), c_u64(), c_u64()
    check(
        cu.cuGraphAddMemsetNode(ctypes.byref(ms), graph, None, c_u64(0), memset_node(ptr, 1, 16), c_u64(0)),
        "memset",
    )
    check(cu.cuGraphAddMemcpyNode(ctypes.byref(cp), graph, ctypes.byref(ms), c_u64(1), memcpy3d(ptr, ptr + 64, 16),
                                  c_u64(0)), "copy")  # fmt: skip
    check(cu.cuGraphAddChildGraphNode(ctypes.byref(ch), graph, ctypes.byref(cp), c_u64(1), child), "child")

    def listed(fn, subject, v2=False):
        count = c_u64(0)
        check(
            fn(subject, None, None, ctypes.byref(count)) if v2 else fn(subject, None, ctypes.byref(count)),
            "count",
        )
        nodes, data, room = (c_u64 * 4)(), (ctypes.c_uint8 * 32)(), c_u64(4)
        check(
            fn(subject, nodes, data, ctypes.byref(room)) if v2 else fn(subject, nodes, ctypes.byref(room)),
            "list",
        )
        return count.value, list(nodes[: room.value]), bytes(data[: 8 * room.value]) if v2 else b""

    cuda12 = Driver(12000)  # the calls' first ABI: no edge data
    say("roots", listed(cu.cuGraphGetRootNodes, graph) == (1, [ms.value], b""))
    say("dependencies", listed(cu.cuGraphNodeGetDependencies, cp, v2=True) == (1, [ms.value], bytes(8)))
    say("dependents", listed(cu.cuGraphNodeGetDependentNodes, cp, v2=True) == (1, [ch.value], bytes(8)))
    say("dependencies_v1", listed(cuda12.cuGraphNodeGetDependencies, ch) == (1, [cp.value], b""))
    say("dependents_v1", listed(cuda12.cuGraphNodeGetDependentNodes, ms) == (1, [cp.value], b""))
    exe = c_u64()
    check(cu.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, c_u64(0)), "instantiate")

    def launch():
        check(cu.cuGraphLaunch(exe, c_u64(0)), "launch")
        check(cu.cuCtxSynchronize(), "sync")
        return " ".join(dtoh(ptr + at, 1)[1].hex() for at in (0, 64, 128))

    say("first", launch())
    check(cu.cuGraphExecMemsetNodeSetParams(exe, ms, memset_node(ptr, 2, 16), c_u64(0)), "memset anew")
    check(
        cu.cuGraphExecMemcpyNodeSetParams(exe, cp, memcpy3d(ptr + 192, ptr + 64, 16), c_u64(0)), "copy anew"
    )
    check(cu.cuGraphExecChildGraphNodeSetParams(exe, ch, other_child), "child anew")
    say("updated", launch())
    check(cu.cuGraphNodeSetEnabled(exe, ms, 0), "off")
    enabled = ctypes.c_uint32(9)
    check(cu.cuGraphNodeGetEnabled(exe, ms, ctypes.byref(enabled)), "enabled?")
    check(cu.cuMemsetD8(c_u64(ptr), 0, c_u64(16)), "zero the first bytes")
    say("switched_off", f"{enabled.value} {launch()}")
    check(cu.cuGraphNodeSetEnabled(exe, ms, 1), "on")
    say("switched_on", launch())
    flags = c_u64(9)
    check(cu.cuGraphExecGetFlags(exe, ctypes.byref(flags)), "flags")
    say("flags", flags.value)
    say("memset_outside_the_lease",
        cu.cuGraphExecMemsetNodeSetParams(exe, ms, memset_node(0x1000, 2, 16), c_u64(0)))  # fmt: skip
    say("memset_past_the_allocation",
        cu.cuGraphExecMemsetNodeSetParams(exe, ms, memset_node(ptr + 240, 2, 32), c_u64(0)))  # fmt: skip
    say("copy_past_the_allocation",
        cu.cuGraphExecMemcpyNodeSetParams(exe, cp, memcpy3d(ptr + 192, ptr + 240, 32), c_u64(0)))  # fmt: skip
    say("node_of_no_graph_here", cu.cuGraphNodeSetEnabled(exe, c_u64(0x12345), 0))


def scenario_graph_explicit_nodes():
    """An explicit graph with copy, event record and wait, and host nodes; its nodes and edges read back
    as handles, a clone and a node found in it; a copy node from the program's own memory refused."""
    setup()
    rc, ptr = alloc(256)
    check(rc, "alloc")
    check(cu.cuMemsetD8(c_u64(ptr), 0, c_u64(256)), "zero")
    check(cu.cuMemsetD8(c_u64(ptr), 9, c_u64(16)), "source")
    graph, event = c_u64(), c_u64()
    check(cu.cuGraphCreate(ctypes.byref(graph), 0), "graph")
    check(cu.cuEventCreate(ctypes.byref(event), 0), "event")

    copy, record, wait, host = c_u64(), c_u64(), c_u64(), c_u64()
    check(cu.cuGraphAddMemcpyNode(ctypes.byref(copy), graph, None, c_u64(0), memcpy3d(ptr, ptr + 64, 16), c_u64(0)),
          "copy node")  # fmt: skip
    check(
        cu.cuGraphAddEventRecordNode(ctypes.byref(record), graph, ctypes.byref(copy), c_u64(1), event),
        "record",
    )
    check(
        cu.cuGraphAddEventWaitNode(ctypes.byref(wait), graph, ctypes.byref(record), c_u64(1), event), "wait"
    )
    ran = []
    recorder = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda data: ran.append(data))
    host_params = (ctypes.c_void_p * 2)(ctypes.cast(recorder, ctypes.c_void_p), 7)
    check(
        cu.cuGraphAddHostNode(ctypes.byref(host), graph, ctypes.byref(wait), c_u64(1), host_params),
        "host node",
    )
    by_type = (ctypes.c_uint8 * 256)()  # cuGraphAddNode of the memcpy type: CUDA_MEMCPY_NODE_PARAMS
    struct.pack_into("<I", by_type, 0, 1)
    by_type[32:232] = bytes(memcpy3d(ptr + 64, ptr + 128, 16))
    second = c_u64()
    check(
        cu.cuGraphAddNode(ctypes.byref(second), graph, ctypes.byref(host), None, c_u64(1), by_type),
        "copy by type",
    )
    own = (ctypes.c_uint8 * 16)()
    refused = c_u64()
    say("copy_from_program_memory",
        cu.cuGraphAddMemcpyNode(ctypes.byref(refused), graph, None, c_u64(0),
                                memcpy3d(ctypes.addressof(own), ptr, 16, host=True), c_u64(0)))  # fmt: skip
    count = c_u64(0)
    check(cu.cuGraphGetNodes(graph, None, ctypes.byref(count)), "count")
    nodes = (c_u64 * 8)()
    room = c_u64(8)
    check(cu.cuGraphGetNodes(graph, nodes, ctypes.byref(room)), "nodes")
    say(
        "nodes",
        f"{count.value} {room.value} {sorted(nodes[:5]) == sorted([copy.value, record.value, wait.value, host.value, second.value])} {nodes[5]}",
    )
    sources, targets, edges = (c_u64 * 8)(), (c_u64 * 8)(), c_u64(8)
    check(cu.cuGraphGetEdges(graph, sources, targets, None, ctypes.byref(edges)), "edges")
    say(
        "edges",
        sorted(zip(sources[: edges.value], targets[: edges.value], strict=True))
        == sorted(
            [
                (copy.value, record.value),
                (record.value, wait.value),
                (wait.value, host.value),
                (host.value, second.value),
            ]
        ),
    )
    clone, twin = c_u64(), c_u64()
    check(cu.cuGraphClone(ctypes.byref(clone), graph), "clone")
    check(cu.cuGraphNodeFindInClone(ctypes.byref(twin), host, clone), "find in clone")
    kind = ctypes.c_int()
    check(cu.cuGraphNodeGetType(twin, ctypes.byref(kind)), "type")
    say("twin_type", kind.value)  # CU_GRAPH_NODE_TYPE_HOST
    exe = c_u64()
    check(cu.cuGraphInstantiateWithFlags(ctypes.byref(exe), clone, c_u64(0)), "instantiate")
    for _ in range(2):
        check(cu.cuGraphLaunch(exe, c_u64(0)), "launch")
    check(cu.cuCtxSynchronize(), "sync")
    say("copied", dtoh(ptr + 128, 16)[1].hex())
    say("host_node_ran", ran)


def mem_ops(*ops):
    """CUstreamBatchMemOpParams for (operation, address, value) each: 48 bytes, flags 0."""
    raw = (ctypes.c_uint8 * (48 * len(ops)))()
    for i, (op, address, value) in enumerate(ops):
        struct.pack_into("<I4xQQ", raw, 48 * i, op, address, value)
    return raw


def batch_params(ops, count, ctx=0):
    """CUDA_BATCH_MEM_OP_NODE_PARAMS: context, count, the operations, flags."""
    raw = (ctypes.c_uint8 * 32)()
    struct.pack_into("<QI4xQI", raw, 0, ctx, count, ctypes.addressof(ops), 0)
    return raw


def scenario_graph_batch_mem_ops():
    """A batch memory-operation node: two writes and a barrier run at each launch; read back; set anew in
    the graph and in the instantiated graph; added through cuGraphAddNode; operations on memory not the
    lease's, past an allocation, of an unknown kind, or in another context refused."""
    setup()
    rc, ptr = alloc(256)
    check(rc, "alloc")
    check(cu.cuMemsetD8(c_u64(ptr), 0, c_u64(256)), "zero")
    graph, node, exe, other = c_u64(), c_u64(), c_u64(), c_u64()
    check(cu.cuGraphCreate(ctypes.byref(graph), 0), "graph")
    ops = mem_ops(
        (2, ptr, 0x11), (5, ptr + 8, 0x2222_3333_4444_5555), (6, 0, 0)
    )  # WRITE_32, WRITE_64, BARRIER
    check(
        cu.cuGraphAddBatchMemOpNode(ctypes.byref(node), graph, None, c_u64(0), batch_params(ops, 3)), "node"
    )
    check(cu.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, c_u64(0)), "instantiate")
    check(cu.cuGraphLaunch(exe, c_u64(0)), "launch")
    check(cu.cuCtxSynchronize(), "sync")
    say("written", struct.unpack("<IxxxxQ", dtoh(ptr, 16)[1]))
    back = (ctypes.c_uint8 * 32)()
    check(cu.cuGraphBatchMemOpNodeGetParams(node, back), "read back")
    count, address = struct.unpack_from("<8xI4xQ", back)
    say("read_back", (count, ctypes.string_at(address, 48 * count) == bytes(ops)))
    again = mem_ops((2, ptr, 0x33))
    check(cu.cuGraphBatchMemOpNodeSetParams(node, batch_params(again, 1)), "set in the graph")
    in_exec = mem_ops((2, ptr, 0x44))
    check(cu.cuGraphExecBatchMemOpNodeSetParams(exe, node, batch_params(in_exec, 1)), "set in the instance")
    check(cu.cuGraphLaunch(exe, c_u64(0)), "launch again")
    check(cu.cuCtxSynchronize(), "sync")
    say("instance_wrote", hex(struct.unpack("<I", dtoh(ptr, 4)[1])[0]))
    by_type = (ctypes.c_uint8 * 256)()
    struct.pack_into("<I", by_type, 0, 12)  # CU_GRAPH_NODE_TYPE_BATCH_MEM_OP
    by_type[16:48] = bytes(batch_params(again, 1))
    check(
        cu.cuGraphAddNode(ctypes.byref(other), graph, ctypes.byref(node), None, c_u64(1), by_type), "by type"
    )
    refusals = {
        "not_the_leases": (mem_ops((2, 0x7123_4560_0000, 1)), 1, 0),
        "past_the_allocation": (mem_ops((5, ptr + 252, 1)), 1, 0),
        "unknown_operation": (mem_ops((9, ptr, 1)), 1, 0),
        "other_context": (mem_ops((2, ptr, 1)), 1, 0x4242),
    }
    for name, (bad, count, ctx) in refusals.items():
        say(
            name,
            cu.cuGraphAddBatchMemOpNode(
                ctypes.byref(other), graph, None, c_u64(0), batch_params(bad, count, ctx)
            ),
        )
    check(cu.cuGraphExecDestroy(exe), "destroy exec")
    check(cu.cuGraphDestroy(graph), "destroy graph")
    say("finished", 1)


class AllocNodeParams(ctypes.Structure):  # CUDA_MEM_ALLOC_NODE_PARAMS
    _fields_ = [("pool", PoolProps), ("access", ctypes.c_void_p), ("access_count", ctypes.c_size_t),
                ("bytesize", ctypes.c_size_t), ("dptr", c_u64)]  # fmt: skip


def scenario_graph_memory():
    """Graph memory nodes as cuda.core's GraphDefinition builds them: an allocation node, a kernel node
    filling its memory, a copy node out of it and a free node, launched twice; the nodes read back; the
    partition counting the node's bytes until the free node; the refusals; graph memory attributes."""
    setup()
    rc, out_ptr = alloc(256)
    check(rc, "alloc")
    check(cu.cuMemsetD8(c_u64(out_ptr), 0, c_u64(256)), "zero")
    module, fill = c_u64(), c_u64()
    check(cu.cuModuleLoadData(ctypes.byref(module), b"// module\n"), "load")
    check(cu.cuModuleGetFunction(ctypes.byref(fill), module, b"fill_u32"), "fill")
    graph = c_u64()
    check(cu.cuGraphCreate(ctypes.byref(graph), 0), "graph")
    access = AccessDesc(1, 0, 3)  # device 0, read-write

    def alloc_params(size, location_type=1, device=0):
        return AllocNodeParams(PoolProps(1, 0, location_type, device), ctypes.addressof(access), 1, size, 0)

    def free_bytes():
        free, total = c_u64(), c_u64()
        check(cu.cuMemGetInfo(ctypes.byref(free), ctypes.byref(total)), "info")
        return free.value

    before = free_bytes()
    params = alloc_params(4096)
    allocation = c_u64()
    check(cu.cuGraphAddMemAllocNode(ctypes.byref(allocation), graph, None, c_u64(0), ctypes.byref(params)),
          "allocation node")  # fmt: skip
    say("address_given", params.dptr != 0)
    say("partition_counts_it", before - free_bytes() >= 4096)
    args = [c_u64(params.dptr), ctypes.c_uint32(7), ctypes.c_uint32(64)]
    pointers = (ctypes.c_void_p * 3)(*[ctypes.addressof(x) for x in args])
    kernel = KernelNodeParams(fill.value, (ctypes.c_uint32 * 6)(1, 1, 1, 64, 1, 1), 0, 0,
                              ctypes.cast(pointers, ctypes.c_void_p))  # fmt: skip
    filled, copied, freed = c_u64(), c_u64(), c_u64()
    check(cu.cuGraphAddKernelNode(ctypes.byref(filled), graph, ctypes.byref(allocation), c_u64(1),
                                  ctypes.byref(kernel)), "kernel node")  # fmt: skip
    check(cu.cuGraphAddMemcpyNode(ctypes.byref(copied), graph, ctypes.byref(filled), c_u64(1),
                                  memcpy3d(params.dptr, out_ptr, 256), c_u64(0)), "copy node")  # fmt: skip
    check(cu.cuGraphAddMemFreeNode(ctypes.byref(freed), graph, ctypes.byref(copied), c_u64(1), c_u64(params.dptr)),
          "free node")  # fmt: skip
    say("partition_free_again", free_bytes() == before)
    by_type = (ctypes.c_uint8 * 256)()  # cuGraphAddNode of the allocation type: the address written back
    struct.pack_into("<I", by_type, 0, 10)
    by_type[16:136] = bytes(alloc_params(512))
    second, second_free = c_u64(), c_u64()
    check(
        cu.cuGraphAddNode(ctypes.byref(second), graph, ctypes.byref(freed), None, c_u64(1), by_type),
        "by type",
    )
    (second_ptr,) = struct.unpack_from("<Q", by_type, 16 + 112)
    say("by_type_address_given", second_ptr not in (0, params.dptr))
    check(cu.cuGraphAddMemFreeNode(ctypes.byref(second_free), graph, ctypes.byref(second), c_u64(1),
                                   c_u64(second_ptr)), "second free node")  # fmt: skip
    exe = c_u64()
    check(cu.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, c_u64(0)), "instantiate")
    for _ in range(2):
        check(cu.cuGraphLaunch(exe, c_u64(0)), "launch")
    check(cu.cuCtxSynchronize(), "sync")
    say("copied", struct.unpack("<4I", dtoh(out_ptr, 16)[1]))
    back = AllocNodeParams()
    check(cu.cuGraphMemAllocNodeGetParams(allocation, ctypes.byref(back)), "read back")
    descs = ctypes.cast(back.access, ctypes.POINTER(AccessDesc))
    say("read_back", (back.pool.alloc_type, back.pool.location_type, back.pool.location_id, back.bytesize,
                      back.dptr == params.dptr, back.access_count, descs[0].location_id, descs[0].flags))  # fmt: skip
    address = c_u64()
    check(cu.cuGraphMemFreeNodeGetParams(freed, ctypes.byref(address)), "free read back")
    say("free_reads_back", address.value == params.dptr)
    generic = (ctypes.c_uint8 * 256)()
    check(Driver(13010).cuGraphNodeGetParams(allocation, generic), "generic read back")
    say("generic_read_back", struct.unpack_from("<I", generic, 0)[0] == 10
        and struct.unpack_from("<QQ", generic, 16 + 104) == (4096, params.dptr))  # fmt: skip
    other = c_u64()
    say(
        "free_not_graph_memory",
        cu.cuGraphAddMemFreeNode(ctypes.byref(other), graph, None, c_u64(0), c_u64(out_ptr)),
    )
    say("free_not_the_leases", cu.cuGraphAddMemFreeNode(ctypes.byref(other), graph, None, c_u64(0),
                                                        c_u64(0x7123_4560_0000)))  # fmt: skip
    for name, bad in (("past_partition", alloc_params(256 * MiB)), ("other_device", alloc_params(4096, device=3)),
                      ("host_location", alloc_params(4096, location_type=2))):  # fmt: skip
        say(name, cu.cuGraphAddMemAllocNode(ctypes.byref(other), graph, None, c_u64(0), ctypes.byref(bad)))
    value = c_u64(1)
    for attr in range(4):
        check(cu.cuDeviceGetGraphMemAttribute(0, attr, ctypes.byref(value)), f"attribute {attr}")
    zero = c_u64(0)
    check(cu.cuDeviceSetGraphMemAttribute(0, 1, ctypes.byref(zero)), "reset the high-water mark")
    say("set_current_refused", cu.cuDeviceSetGraphMemAttribute(0, 0, ctypes.byref(zero)))
    check(cu.cuDeviceGraphMemTrim(0), "trim")
    say("trim_other_device", cu.cuDeviceGraphMemTrim(3))
    check(cu.cuGraphExecDestroy(exe), "destroy exec")
    check(cu.cuGraphDestroy(graph), "destroy graph")
    say("finished", 1)


def scenario_graph_memory_loop():
    """Graphs whose allocation (an allocation node, or cuMemAllocAsync during a capture) no free node frees,
    made and destroyed in a loop: never launched, the allocation never lived and its graph's end gives
    its bytes back; launched, it lives on after the graph (the driver frees only at a free) and counts
    until the program frees it and the driver's reserve is trimmed. The partition's free memory stays
    within one allocation of where it started, and all of it can be allocated after."""
    setup()
    fill = module_function(b"fill_u32")
    access = AccessDesc(1, 0, 3)
    size = 6 * MiB
    stream = c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 1), "stream")

    def free_bytes():
        free, total = c_u64(), c_u64()
        check(cu.cuMemGetInfo(ctypes.byref(free), ctypes.byref(total)), "info")
        return free.value

    def filled_graph(i):
        """A graph of an allocation node and a kernel node filling it: the graph and the address."""
        graph, allocation, filled = c_u64(), c_u64(), c_u64()
        check(cu.cuGraphCreate(ctypes.byref(graph), 0), "graph")
        params = AllocNodeParams(PoolProps(1, 0, 1, 0), ctypes.addressof(access), 1, size, 0)
        check(cu.cuGraphAddMemAllocNode(ctypes.byref(allocation), graph, None, c_u64(0), ctypes.byref(params)),
              f"allocation node {i}")  # fmt: skip
        args = [c_u64(params.dptr), ctypes.c_uint32(i), ctypes.c_uint32(64)]
        pointers = (ctypes.c_void_p * 3)(*[ctypes.addressof(x) for x in args])
        kernel = KernelNodeParams(fill.value, (ctypes.c_uint32 * 6)(1, 1, 1, 64, 1, 1), 0, 0,
                                  ctypes.cast(pointers, ctypes.c_void_p))  # fmt: skip
        check(cu.cuGraphAddKernelNode(ctypes.byref(filled), graph, ctypes.byref(allocation), c_u64(1),
                                      ctypes.byref(kernel)), "kernel node")  # fmt: skip
        return graph, params.dptr

    def instantiated(graph, launch):
        exe = c_u64()
        check(cu.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, c_u64(0)), "instantiate")
        if launch:
            check(cu.cuGraphLaunch(exe, stream), "launch")
            check(cu.cuStreamSynchronize(stream), "sync")
        return exe

    start = lowest = free_bytes()
    for i in range(16):  # never launched: instantiated or not, the graph or its executable graph last
        graph, _ = filled_graph(i)
        exe = instantiated(graph, launch=False) if i % 2 else None
        check(cu.cuGraphDestroy(graph), "destroy graph")
        if exe is not None:
            check(cu.cuGraphExecDestroy(exe), "destroy exec")
        lowest = min(lowest, free_bytes())
    say("never_launched_back", free_bytes() == start)
    for i in range(16):  # captured: cuMemAllocAsync in a capture, the graph destroyed without a launch
        graph, dptr = c_u64(), c_u64()
        check(cu.cuStreamBeginCapture(stream, 2), "begin capture")
        check(cu.cuMemAllocAsync(ctypes.byref(dptr), c_u64(size), stream), f"captured allocation {i}")
        check(cu.cuMemsetD8Async(dptr, 1, c_u64(size), stream), "captured memset")
        check(cu.cuStreamEndCapture(stream, ctypes.byref(graph)), "end capture")
        check(cu.cuGraphDestroy(graph), "destroy captured graph")
        lowest = min(lowest, free_bytes())
    say("captured_back", free_bytes() == start)
    live = []
    for i in range(16):  # launched: live after its graph is gone, until the program frees it
        graph, dptr = filled_graph(i)
        exe = instantiated(graph, launch=True)
        check(cu.cuGraphExecDestroy(exe), "destroy exec")
        check(cu.cuGraphDestroy(graph), "destroy graph")
        live.append(struct.unpack("<I", dtoh(dptr, 4)[1])[0] == i)
        if i == 0:
            say("live_still_counted", start - free_bytes() >= size)
        check(cu.cuMemFree(c_u64(dptr)), "free the live allocation")
        lowest = min(lowest, free_bytes())
    say("live_usable", all(live))
    say("bounded", start - lowest <= size)
    check(cu.cuDeviceGraphMemTrim(0), "trim")
    say("trimmed_back", free_bytes() == start)
    rc, _ = alloc(start - MiB)
    say("can_allocate", rc)
    say("finished", 1)


def scenario_notifications_and_unified_functions():
    """Asynchronous notifications registered for a device of the lease (and refused for another), then
    unregistered; the unified-function-pointer attribute and cuLibraryGetUnifiedFunction, refused."""
    setup()
    handle = c_u64()
    callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, c_u64)(lambda *_: None)
    say("register", cu.cuDeviceRegisterAsyncNotification(0, callback, None, ctypes.byref(handle)))
    say("handle_given", handle.value != 0)
    say(
        "register_other_device",
        cu.cuDeviceRegisterAsyncNotification(3, callback, None, ctypes.byref(c_u64())),
    )
    say("unregister", cu.cuDeviceUnregisterAsyncNotification(0, handle))
    unified = ctypes.c_int(-1)
    check(cu.cuDeviceGetAttribute(ctypes.byref(unified), 129, 0), "attribute")  # UNIFIED_FUNCTION_POINTERS
    say("unified_attribute", unified.value)
    library, fptr = c_u64(), ctypes.c_void_p()
    check(
        cu.cuLibraryLoadData(ctypes.byref(library), b"// library\n", None, None, 0, None, None, 0), "library"
    )
    say("unified_function", cu.cuLibraryGetUnifiedFunction(ctypes.byref(fptr), library, b"fill_u32"))
    say("finished", 1)


def scenario_decompress():
    """Batched decompression of DEFLATE data between allocations of the lease, with the size written and
    no operation's error; operations on memory not the lease's or past an allocation, or of an unknown
    algorithm, refused before any runs."""
    import zlib

    setup()
    data = bytes(range(256)) * 8
    packer = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    packed = packer.compress(data) + packer.flush()
    (rc1, src), (rc2, dst), (rc3, actual) = alloc(len(packed)), alloc(4096), alloc(16)
    check(rc1 or rc2 or rc3, "alloc")
    check(cu.cuMemcpyHtoD(c_u64(src), packed, c_u64(len(packed))), "compressed bytes")

    packed_size = len(packed)

    def params(src_bytes=packed_size, dst_bytes=4096, where=(src, dst, actual), algorithm=1):
        raw = ctypes.create_string_buffer(64)
        struct.pack_into("<QQQQQi", raw, 0, src_bytes, dst_bytes, where[2], where[0], where[1], algorithm)
        return raw

    index = c_u64(0)
    check(cu.cuMemBatchDecompressAsync(params(), c_u64(1), 0, ctypes.byref(index), c_u64(0)), "decompress")
    check(cu.cuCtxSynchronize(), "sync")
    say("decompressed", dtoh(dst, len(data))[1] == data)
    say("actual_size", struct.unpack("<I", dtoh(actual, 4)[1])[0] == len(data))
    say("no_error_index", index.value == (1 << 64) - 1)
    foreign = 0x7123_4560_0000
    refusals = {
        "past_the_destination": params(dst_bytes=8192),
        "source_not_the_leases": params(where=(foreign, dst, actual)),
        "size_word_not_the_leases": params(where=(src, dst, foreign)),
        "unknown_algorithm": params(algorithm=3),
    }
    for name, bad in refusals.items():
        say(name, cu.cuMemBatchDecompressAsync(bad, c_u64(1), 0, ctypes.byref(index), c_u64(0)))
    say("finished", 1)


def scenario_newer_abis():
    """Names resolved at the versions cuda.bindings asks for their newer ABIs: cuLaunchHostFunc's (a
    synchronisation mode) runs the function; CUDA 13.4's graph node calls add and set nodes whose layout is
    the older one's (a host node with its sync mode and the current context runs its function, set anew
    runs the new argument), and refuse what the older ABI cannot say (a new node type, a green context)."""
    setup()
    ran = []
    hook = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda data: ran.append(data))
    with_mode = Driver(13020).cuLaunchHostFunc
    say("host_function_spinning", with_mode(c_u64(0), hook, ctypes.c_void_p(7), 1))  # CU_HOST_TASK_SPINWAIT
    say("host_function_bad_mode", with_mode(c_u64(0), hook, ctypes.c_void_p(8), 5))
    check(cu.cuCtxSynchronize(), "sync")
    say("host_function_ran", ran)
    node, graph = c_u64(), c_u64()
    check(cu.cuGraphCreate(ctypes.byref(graph), 0), "graph")
    params = (ctypes.c_uint8 * 256)()
    struct.pack_into("<I", params, 0, 5)  # an empty node
    say("add_node_v3", Driver(13041).cuGraphAddNode(ctypes.byref(node), graph, None, None, c_u64(0), params))
    say("add_node_v2", Driver(13040).cuGraphAddNode(ctypes.byref(node), graph, None, None, c_u64(0), params))
    add_v3, set_v2 = Driver(13041).cuGraphAddNode, Driver(13041).cuGraphNodeSetParams

    def host_params(data, sync_mode=1, green=0, node_type=3):  # CUDA_HOST_NODE_PARAMS_v2 of CUDA 13.4
        raw = (ctypes.c_uint8 * 256)()
        fn = ctypes.cast(hook, ctypes.c_void_p).value
        struct.pack_into("<I12xQQIxxxxQQ", raw, 0, node_type, fn, data, sync_mode, ctx.value, green)
        return raw

    ctx = c_u64()
    check(cu.cuCtxGetCurrent(ctypes.byref(ctx)), "context")
    host_graph, host_node, exe = c_u64(), c_u64(), c_u64()
    check(cu.cuGraphCreate(ctypes.byref(host_graph), 0), "graph")
    check(add_v3(ctypes.byref(host_node), host_graph, None, None, c_u64(0), host_params(21)), "host node")
    check(cu.cuGraphInstantiateWithFlags(ctypes.byref(exe), host_graph, c_u64(0)), "instantiate")
    check(cu.cuGraphLaunch(exe, c_u64(0)), "launch")
    check(cu.cuCtxSynchronize(), "sync")
    check(set_v2(host_node, host_params(22, sync_mode=0)), "host node set")
    check(cu.cuGraphInstantiateWithFlags(ctypes.byref(exe), host_graph, c_u64(0)), "instantiate again")
    check(cu.cuGraphLaunch(exe, c_u64(0)), "launch again")
    check(cu.cuCtxSynchronize(), "sync")
    say("graph_host_ran", ran[1:])
    refused = c_u64()
    say("v3_bad_sync_mode", add_v3(ctypes.byref(refused), graph, None, None, c_u64(0), host_params(0, 7)))
    say("v3_green", add_v3(ctypes.byref(refused), graph, None, None, c_u64(0), host_params(0, green=0x77)))
    batch = (ctypes.c_uint8 * 256)()
    struct.pack_into("<I", batch, 0, 14)  # CU_GRAPH_NODE_TYPE_MEMCPY_BATCH
    say("v3_copy_batch", add_v3(ctypes.byref(refused), graph, None, None, c_u64(0), batch))
    say("v2_set_green", set_v2(host_node, host_params(0, green=0x77)))
    say("finished", 1)


def scenario_location_info():
    """cuMemGetLocationInfo (at the version cuda.bindings asks for it) on managed memory: after device work
    every region is the device's; a region the host wrote since is the host's; a bad granularity, and
    memory that is not managed, are invalid."""
    setup()
    chunk, managed = 64 << 10, c_u64()
    check(cu.cuMemAllocManaged(ctypes.byref(managed), c_u64(4 * chunk), 1), "alloc managed")
    check(cu.cuMemsetD8(managed, 3, c_u64(4 * chunk)), "memset")
    check(cu.cuCtxSynchronize(), "sync")
    locate = Driver(13041).cuMemGetLocationInfo
    out = (ctypes.c_int32 * 8)()

    def regions(ptr=managed.value, size=4 * chunk, summary=chunk, sampling=0):
        rc = locate(c_u64(ptr), c_u64(size), c_u64(summary), c_u64(sampling), out)
        return rc, [(out[2 * i], out[2 * i + 1]) for i in range(size // summary)] if rc == 0 else []

    say("after_device_work", regions())
    ctypes.memset(managed.value + chunk, 9, 16)  # the host writes into the second region
    say("after_host_write", regions())
    say("one_region", regions(summary=4 * chunk, sampling=chunk))
    say("summary_past_size", regions(size=chunk, summary=2 * chunk)[0])
    say("sampling_past_summary", regions(sampling=2 * chunk)[0])
    plain_rc, plain_ptr = alloc(chunk)
    check(plain_rc, "alloc")
    say("not_managed", regions(ptr=plain_ptr, size=chunk)[0])
    say("past_the_allocation", regions(size=8 * chunk)[0])
    say("finished", 1)


def scenario_library_managed():
    """A library's managed variable: its address, the same when asked again, host and kernels sharing its
    bytes as managed memory's (the host's write before a launch is what the kernel reads, the kernel's write
    what the host reads after the synchronisation); a variable that is not managed is not found."""
    setup()
    image = (
        b"// library\n.global .attribute(.managed) .align 4 .b8 counter[16];\n.global .align 4 .u32 plain;\n"
    )
    library, ptr, size, again = c_u64(), c_u64(), c_u64(), c_u64()
    check(cu.cuLibraryLoadData(ctypes.byref(library), image, None, None, 0, None, None, 0), "library")
    check(
        cu.cuLibraryGetManaged(ctypes.byref(ptr), ctypes.byref(size), library, b"counter"), "managed variable"
    )
    check(cu.cuLibraryGetManaged(ctypes.byref(again), None, library, b"counter"), "asked again")
    say("size", size.value)
    say("same_again", again.value == ptr.value)
    say("first_touch", list((ctypes.c_uint32 * 4).from_address(ptr.value)))
    module, add = c_u64(), c_u64()
    check(cu.cuModuleLoadData(ctypes.byref(module), b"// module\n"), "load")
    check(cu.cuModuleGetFunction(ctypes.byref(add), module, b"add_u32"), "function")
    (ctypes.c_uint32 * 4).from_address(ptr.value)[:] = [5, 6, 7, 8]  # the host writes before the launch
    value, count = ctypes.c_uint32(10), ctypes.c_uint32(4)
    params = (ctypes.c_void_p * 3)(ctypes.addressof(ptr), ctypes.addressof(value), ctypes.addressof(count))
    check(cu.cuLaunchKernel(add, 1, 1, 1, 4, 1, 1, 0, c_u64(0), params, None), "launch")
    check(cu.cuCtxSynchronize(), "sync")
    say("after_kernel", list((ctypes.c_uint32 * 4).from_address(ptr.value)))
    say("not_managed", cu.cuLibraryGetManaged(ctypes.byref(again), None, library, b"plain"))
    say("finished", 1)


def scenario_unknown():
    check(cu.cuInit(0), "init")
    # Graphics interop is refused: an OpenGL or Vulkan resource of this machine means nothing on the GPU's
    # (docs/driver-census.md).
    say("first_call", cu.cuGraphicsMapResources(1, None, c_u64(0)))
    say("second_call", cu.cuGraphicsMapResources(1, None, c_u64(0)))


def scenario_no_lease():
    say("init", cu.cuInit(0))
    say("count", cu.cuDeviceGetCount(ctypes.byref(ctypes.c_int())))


def scenario_two_devices():
    check(cu.cuInit(0), "init")
    n = ctypes.c_int()
    check(cu.cuDeviceGetCount(ctypes.byref(n)), "count")
    say("count", n.value)
    ptrs, ctxs = [], []
    for dev in range(n.value):
        ctx = c_u64()
        check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
        check(cu.cuCtxSetCurrent(ctx), "set")
        total = c_u64()
        check(cu.cuDeviceTotalMem(ctypes.byref(total), dev), "total")
        say(f"total{dev}", total.value)
        rc, p = alloc(1 * MiB)
        check(rc, "alloc")
        check(cu.cuMemsetD8(c_u64(p), 0x10 + dev, c_u64(MiB)), "memset")
        ptrs.append(p)
        ctxs.append(ctx)
        dev_of = ctypes.c_int(-1)
        check(cu.cuCtxGetDevice(ctypes.byref(dev_of)), "ctx device")
        say(f"ctx_device{dev}", dev_of.value)
    check(cu.cuMemcpyPeer(c_u64(ptrs[0]), ctxs[0], c_u64(ptrs[1]), ctxs[1], c_u64(16)), "peer")
    rc, back = dtoh(ptrs[0], 32)
    say("peer_copy", back.hex())
    say("bad_device", cu.cuDevicePrimaryCtxRetain(ctypes.byref(c_u64()), n.value))
    # Peer access between the lease's two devices, and which device a PCI bus id names.
    value, found = ctypes.c_int(), ctypes.c_int(-1)
    say("p2p_access_supported", f"{cu.cuDeviceGetP2PAttribute(ctypes.byref(value), 2, 0, 1)} {value.value}")
    say("p2p_with_itself", cu.cuDeviceGetP2PAttribute(ctypes.byref(value), 2, 0, 0))
    # Which atomics device 0 can make on device 1's memory (CUDA 13): a mask per operation asked about.
    ops, caps = (ctypes.c_int * 3)(0, 1, 5), (ctypes.c_uint * 3)(99, 99, 99)
    rc = cu13.cuDeviceGetP2PAtomicCapabilities(caps, ops, 3, 0, 1)
    say("p2p_atomics", f"{rc} {' '.join(map(str, caps))}")
    say("p2p_atomics_with_itself", cu13.cuDeviceGetP2PAtomicCapabilities(caps, ops, 3, 1, 1))
    say("p2p_atomics_none", cu13.cuDeviceGetP2PAtomicCapabilities(caps, ops, 0, 0, 1))
    check(cu.cuCtxSetCurrent(ctxs[0]), "back to device 0")
    say("enable_peer", cu.cuCtxEnablePeerAccess(ctxs[1], 0))
    say("enable_again", cu.cuCtxEnablePeerAccess(ctxs[1], 0))
    say("disable_peer", cu.cuCtxDisablePeerAccess(ctxs[1]))
    say("disable_again", cu.cuCtxDisablePeerAccess(ctxs[1]))
    bus_id = ctypes.create_string_buffer(64)
    check(cu.cuDeviceGetPCIBusId(bus_id, 64, 1), "bus id")
    short = bus_id.value.split(b":", 1)[1]  # without the domain
    for label, name in (("by_bus_id", bus_id.value), ("by_short_bus_id", short), ("by_other_bus_id", b"0000:7f:00.0"),
                        ("by_garbage", b"gpu one")):  # fmt: skip
        found.value = -1
        say(label, f"{cu.cuDeviceGetByPCIBusId(ctypes.byref(found), name)} {found.value}")


def _mmap(base, size, prot, flags):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    return libc.mmap(base, size, prot, flags, -1, 0)


PRIVATE_ANONYMOUS, FIXED_NOREPLACE, NORESERVE = 0x22, 0x100000, 0x4000
WINDOW_REGION = (0x1000_0000_0000, 0x5000_0000_0000)  # where workers place windows (_address_window)


def _mapping(addr):
    """The line of /proc/self/maps that holds `addr`: (start, end, permissions)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, perms = line.split()[:2]
            start, end = (int(x, 16) for x in span.split("-"))
            if start <= addr < end:
                return start, end, perms
    return None


def scenario_window():
    setup()
    sizes = [1, 100, 4096, 1 * MiB, 1 * MiB + 1, 3 * MiB, 9 * MiB]
    ptrs = []
    for i, n in enumerate(sizes):
        rc, p = alloc(n)
        check(rc, f"alloc {n}")
        check(cu.cuMemsetD8(c_u64(p), i + 1, c_u64(n)), "memset")
        ptrs.append(p)
    maps = {_mapping(p) for p in ptrs}
    say("one_reservation", len(maps) == 1)
    start, end, perms = maps.pop()
    say("reserved_here", perms.startswith("---p") and end - start >= 64 << 30)
    say("aligned", all(p % (2 * MiB if n > MiB else 512) == 0 for p, n in zip(ptrs, sizes, strict=True)))
    say("small_share_a_page", ptrs[1] // (2 * MiB) == ptrs[0] // (2 * MiB))
    say(
        "contents",
        all(dtoh(p, n)[1] == bytes([i + 1]) * n for i, (p, n) in enumerate(zip(ptrs, sizes, strict=True))),
    )
    base, size = c_u64(), c_u64()
    check(cu.cuMemGetAddressRange(ctypes.byref(base), ctypes.byref(size), c_u64(ptrs[2] + 10)), "range")
    say("address_range", (base.value, size.value) == (ptrs[2], 4096))
    attrs = []
    for attr in (11, 12):  # RANGE_START_ADDR, RANGE_SIZE
        value = c_u64()
        check(cu.cuPointerGetAttribute(ctypes.byref(value), attr, c_u64(ptrs[5] + 1)), "attribute")
        attrs.append(value.value)
    say("pointer_range", attrs == [ptrs[5], 3 * MiB])
    for p in ptrs:
        check(cu.cuMemFree(c_u64(p)), "free")
    many = []  # many small buffers fill pages, not the partition
    for _ in range(3000):
        rc, p = alloc(1000)
        check(rc, "many")
        many.append(p)
    say("many_inside", all(start <= p < end for p in many) and len(set(many)) == len(many))
    stream, pool_ptr = c_u64(), c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 0), "stream")
    check(cu.cuMemAllocAsync(ctypes.byref(pool_ptr), c_u64(5 * MiB), stream), "alloc async")
    say("async_inside", start <= pool_ptr.value < end)
    check(cu.cuMemFreeAsync(c_u64(pool_ptr.value), stream), "free async")
    check(cu.cuStreamSynchronize(stream), "stream sync")
    free, total = c_u64(), c_u64()
    check(cu.cuMemGetInfo(ctypes.byref(free), ctypes.byref(total)), "info")
    say("used_kib", (total.value - free.value) // 1024)  # the 3000 buffers of 1000 bytes


class AllocationProp(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [
        ("type", ctypes.c_int),
        ("handle_types", ctypes.c_int),
        ("location_type", ctypes.c_int),
        ("location_id", ctypes.c_int),
        ("win32", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
    ]


class AccessDesc(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location_type", ctypes.c_int), ("location_id", ctypes.c_int), ("flags", ctypes.c_int)]


def scenario_vmm():
    """The virtual memory API, as PyTorch's expandable segments use it: reserve, create, map, grant
    access, use, then undo it all; the partition counts created memory."""
    setup()
    prop = AllocationProp(1, 0, 1, 0)  # pinned, on device 0
    granularity = c_u64()
    check(cu.cuMemGetAllocationGranularity(ctypes.byref(granularity), ctypes.byref(prop), 0), "granularity")
    say("granularity", granularity.value)
    base, handle, second = c_u64(), c_u64(), c_u64()
    # Pinned host memory on a NUMA node (NCCL's probe): the granularity is answered, the creation refused.
    host = AllocationProp(1, 1, 3, 0)  # pinned, POSIX descriptor, CU_MEM_LOCATION_TYPE_HOST_NUMA, node 0
    host_granularity = c_u64()
    say(
        "host_granularity_rc",
        cu.cuMemGetAllocationGranularity(ctypes.byref(host_granularity), ctypes.byref(host), 0),
    )
    say("host_granularity_positive", host_granularity.value > 0)
    say(
        "host_create",
        cu.cuMemCreate(
            ctypes.byref(second), c_u64(host_granularity.value or MiB), ctypes.byref(host), c_u64(0)
        ),
    )
    check(
        cu.cuMemAddressReserve(ctypes.byref(base), c_u64(16 * MiB), c_u64(0), c_u64(0), c_u64(0)), "reserve"
    )
    check(cu.cuMemCreate(ctypes.byref(handle), c_u64(4 * MiB), ctypes.byref(prop), c_u64(0)), "create")
    say("past_partition", cu.cuMemCreate(ctypes.byref(second), c_u64(64 * MiB), ctypes.byref(prop), c_u64(0)))
    say("map_outside", cu.cuMemMap(c_u64(0x1000), c_u64(4 * MiB), c_u64(0), handle, c_u64(0)))
    check(cu.cuMemMap(base, c_u64(4 * MiB), c_u64(0), handle, c_u64(0)), "map")
    access = AccessDesc(1, 0, 3)  # device 0, read-write
    check(cu.cuMemSetAccess(base, c_u64(4 * MiB), ctypes.byref(access), c_u64(1)), "access")
    check(cu.cuMemsetD8(base, 9, c_u64(4 * MiB)), "memset")
    say("contents", dtoh(base.value + 4 * MiB - 8, 8)[1] == b"\x09" * 8)
    free, total = c_u64(), c_u64()
    check(cu.cuMemGetInfo(ctypes.byref(free), ctypes.byref(total)), "info")
    say("used_mib", (total.value - free.value) // MiB)
    say("free_while_mapped", cu.cuMemAddressFree(base, c_u64(16 * MiB)))
    check(cu.cuMemUnmap(base, c_u64(4 * MiB)), "unmap")
    check(cu.cuMemRelease(handle), "release")
    check(cu.cuMemAddressFree(base, c_u64(16 * MiB)), "address free")
    check(cu.cuMemGetInfo(ctypes.byref(free), ctypes.byref(total)), "info")
    say("used_mib_after", (total.value - free.value) // MiB)


def multicast_prop(devices=1, size=2 * MiB, handle_types=0):
    """A CUmulticastObjectProp: device count, size, handle types, flags."""
    return (c_u64 * 4)(devices, size, handle_types, 0)


def scenario_fabric_queries():
    """The NVLink fabric of the lease's device, asked at the version cuda.bindings asks (CUDA 13.4): the host
    executor's modelled GPU is in no fabric (no cluster UUID, no clique); a device not the lease's is
    refused; a clique array without room for what it asks is invalid."""
    setup()
    fabric = Driver(13041)
    uuid, count = (ctypes.c_uint8 * 16)(), c_u64(99)
    say("cluster_uuid", fabric.cuDeviceGetFabricClusterUuid(uuid, 0))
    say("clique_count", (fabric.cuDeviceGetCliqueCount(ctypes.byref(count), 0), count.value))
    cliques, room = (ctypes.c_uint32 * 8)(), c_u64(4)
    say("clique_info", (fabric.cuDeviceGetCliqueInfo(cliques, ctypes.byref(room), 0), room.value))
    say("clique_info_no_array", fabric.cuDeviceGetCliqueInfo(None, ctypes.byref(c_u64(4)), 0))
    say("other_device", [fabric.cuDeviceGetFabricClusterUuid(uuid, 7),
                         fabric.cuDeviceGetCliqueCount(ctypes.byref(count), 7),
                         fabric.cuDeviceGetCliqueInfo(cliques, ctypes.byref(c_u64(4)), 7)])  # fmt: skip
    say("finished", 1)


def scenario_logical_endpoints():
    """Logical endpoints (CUDA 13.3, at the version cuda.bindings asks): ids reserved, an endpoint created on
    one, bound to and unbound from the lease's memory, its limits and readiness asked, destroyed, the ids
    released; what would leave the lease refused (ids not reserved, another process's handle types, a
    device or memory not the lease's, a binding past the endpoint, export and import)."""
    setup()
    le = Driver(13030)
    two_mib = 2 << 20
    base, status, alignment, max_size = ctypes.c_uint32(), ctypes.c_int(-1), c_u64(), c_u64()

    def prop(kind=1, device=0, size=two_mib, handle_types=0):  # CUlogicalEndpointProp
        return ctypes.create_string_buffer(struct.pack("<IiQII", kind, device, size, handle_types, 0), 24)

    check(le.cuLogicalEndpointIdReserve(ctypes.byref(base), 4), "reserve")
    first = base.value
    say("create", le.cuLogicalEndpointCreate(first, prop()))
    say("create_again", le.cuLogicalEndpointCreate(first, prop()))
    say("create_unreserved", le.cuLogicalEndpointCreate(first + 100, prop()))
    say("create_shared", le.cuLogicalEndpointCreate(first + 1, prop(handle_types=1)))
    say("create_other_device", le.cuLogicalEndpointCreate(first + 1, prop(device=5)))
    say("query", (le.cuLogicalEndpointQuery(first, 1, ctypes.byref(status)), status.value))
    say("query_unreserved", le.cuLogicalEndpointQuery(first + 100, 1, ctypes.byref(status)))
    rc, ptr = alloc(2 * two_mib)
    check(rc, "alloc")
    say("bind", le.cuLogicalEndpointBindAddr(first, 0, c_u64(0), c_u64(ptr), c_u64(two_mib), c_u64(0)))
    foreign = c_u64(0x7123_4560_0000)
    say("bind_foreign", le.cuLogicalEndpointBindAddr(first, 0, c_u64(0), foreign, c_u64(two_mib), c_u64(0)))
    say(
        "bind_past_end",
        le.cuLogicalEndpointBindAddr(first, 0, c_u64(two_mib), c_u64(ptr), c_u64(two_mib), c_u64(0)),
    )
    (rc1, src), (rc2, dst) = alloc(4096), alloc(4096)
    check(rc1 or rc2, "alloc")
    check(cu.cuMemcpyHtoD(c_u64(src), bytes(range(64)), c_u64(64)), "source bytes")
    stream = c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 1), "stream")
    copy_batch = Driver(13050).cuFabricCpyBatchAsync

    def copies(
        *ops,
    ):  # (src operand, dst operand, size); an operand (type, pointer or id, location or offset)
        raw = b"".join(struct.pack("<I4xQQI4xQQQI4x", *s, *d, n, 0) for s, d, n in ops)
        return copy_batch(c_u64(len(ops)), ctypes.create_string_buffer(raw, len(raw)), c_u64(0), stream)

    to_endpoint = ((0, src, 0), (1, first, 256), 64)  # into the endpoint, 256 bytes in
    from_endpoint = ((1, first, 256), (0, dst, 0), 64)  # and back out to other memory
    say("fabric_copies", (copies(to_endpoint), copies(from_endpoint)))
    check(cu.cuStreamSynchronize(stream), "sync")
    say("fabric_bytes", dtoh(dst, 64)[1] == bytes(range(64)) and dtoh(ptr + 256, 64)[1] == bytes(range(64)))
    say("fabric_foreign", copies(((0, 0x7123_4560_0000, 0), (1, first, 0), 64)))
    say("fabric_past_end", copies(((0, src, 0), (1, first, two_mib - 32), 64)))
    say("fabric_other_endpoint", copies(((0, src, 0), (1, first + 1, 0), 64)))
    say("fabric_bad_type", copies(((2, src, 0), (1, first, 0), 64)))
    say("unbind", le.cuLogicalEndpointUnbind(first, 0, c_u64(0), c_u64(two_mib)))
    say("limits", (le.cuLogicalEndpointGetLimits(ctypes.byref(alignment), ctypes.byref(max_size), prop()),
                   alignment.value))  # fmt: skip
    say("release_in_use", le.cuLogicalEndpointIdRelease(first, 4))
    handle = ctypes.create_string_buffer(64)
    say("export", le.cuLogicalEndpointExport(handle, first, 1))
    say("import", le.cuLogicalEndpointImport(first + 2, handle, 1))
    say("destroy", le.cuLogicalEndpointDestroy(first))
    say("destroy_again", le.cuLogicalEndpointDestroy(first))
    say("release", le.cuLogicalEndpointIdRelease(first, 4))
    say("finished", 1)


def scenario_multicast():
    """A multicast object over the lease's device: its granularity, the device added, memory the program
    created bound to it (and an allocation's address), the object mapped in a reserved range with access,
    written and read through, unbound, released; what is not the lease's, or past the object, refused."""
    setup()
    granularity = c_u64()
    check(cu.cuMulticastGetGranularity(ctypes.byref(granularity), multicast_prop(), 0), "granularity")
    say("granularity", granularity.value)
    mc, memory, base = c_u64(), c_u64(), c_u64()
    check(cu.cuMulticastCreate(ctypes.byref(mc), multicast_prop()), "create")
    check(cu.cuMulticastAddDevice(mc, 0), "add device")
    prop = AllocationProp(1, 0, 1, 0)
    check(cu.cuMemCreate(ctypes.byref(memory), c_u64(2 * MiB), ctypes.byref(prop), c_u64(0)), "memory")
    check(cu.cuMulticastBindMem(mc, c_u64(0), memory, c_u64(0), c_u64(2 * MiB), c_u64(0)), "bind memory")
    check(cu.cuMemAddressReserve(ctypes.byref(base), c_u64(2 * MiB), c_u64(0), c_u64(0), c_u64(0)), "reserve")
    check(cu.cuMemMap(base, c_u64(2 * MiB), c_u64(0), mc, c_u64(0)), "map the multicast object")
    access = AccessDesc(1, 0, 3)
    check(cu.cuMemSetAccess(base, c_u64(2 * MiB), ctypes.byref(access), c_u64(1)), "access")
    check(cu.cuMemsetD32(base, 0x5A5A5A5A, c_u64(16)), "write through it")
    say("read_through", dtoh(base.value, 8)[1].hex())
    check(cu.cuMulticastUnbind(mc, 0, c_u64(0), c_u64(2 * MiB)), "unbind")
    bind_on = Driver(13010).cuMulticastBindMem  # CUDA 13.1's: the device whose memory is bound
    say("bind_on_its_device", bind_on(mc, 0, c_u64(0), memory, c_u64(0), c_u64(2 * MiB), c_u64(0)))
    check(cu.cuMulticastUnbind(mc, 0, c_u64(0), c_u64(2 * MiB)), "unbind again")
    say("bind_on_other_device", bind_on(mc, 3, c_u64(0), memory, c_u64(0), c_u64(2 * MiB), c_u64(0)))
    rc, ptr = alloc(2 * MiB)
    check(rc, "alloc")
    say("bind_allocation", cu.cuMulticastBindAddr(mc, c_u64(0), c_u64(ptr), c_u64(2 * MiB), c_u64(0)))
    other = c_u64()
    say("more_devices_than_the_lease", cu.cuMulticastCreate(ctypes.byref(other), multicast_prop(devices=2)))
    say("shared_with_processes", cu.cuMulticastCreate(ctypes.byref(other), multicast_prop(handle_types=1)))
    say("add_other_device", cu.cuMulticastAddDevice(mc, 3))
    say("add_to_memory", cu.cuMulticastAddDevice(memory, 0))
    say(
        "bind_foreign_memory",
        cu.cuMulticastBindMem(mc, c_u64(0), c_u64(0x4242), c_u64(0), c_u64(2 * MiB), c_u64(0)),
    )
    say("bind_past_the_object",
        cu.cuMulticastBindMem(mc, c_u64(2 * MiB), memory, c_u64(0), c_u64(2 * MiB), c_u64(0)))  # fmt: skip
    say("bind_to_itself", cu.cuMulticastBindMem(mc, c_u64(0), mc, c_u64(0), c_u64(2 * MiB), c_u64(0)))
    say("bind_foreign_address",
        cu.cuMulticastBindAddr(mc, c_u64(0), c_u64(0x7123_4560_0000), c_u64(2 * MiB), c_u64(0)))  # fmt: skip
    check(cu.cuMemUnmap(base, c_u64(2 * MiB)), "unmap")
    check(cu.cuMemRelease(mc), "release the multicast object")
    say("bind_after_release", cu.cuMulticastBindMem(mc, c_u64(0), memory, c_u64(0), c_u64(2 * MiB), c_u64(0)))
    check(cu.cuMemRelease(memory), "release memory")
    check(cu.cuMemAddressFree(base, c_u64(2 * MiB)), "address free")
    say("finished", 1)


def scenario_vmm_release_while_mapped():
    """As NCCL uses its buffers: memory created, mapped, its handle released at once, the mapping used on.
    What the lease uses after the release (the mapping keeps the memory) and after the unmap."""
    setup()
    prop = AllocationProp(1, 0, 1, 0)
    base, handle = c_u64(), c_u64()
    check(cu.cuMemAddressReserve(ctypes.byref(base), c_u64(4 * MiB), c_u64(0), c_u64(0), c_u64(0)), "reserve")
    check(cu.cuMemCreate(ctypes.byref(handle), c_u64(4 * MiB), ctypes.byref(prop), c_u64(0)), "create")
    check(cu.cuMemMap(base, c_u64(4 * MiB), c_u64(0), handle, c_u64(0)), "map")
    check(cu.cuMemSetAccess(base, c_u64(4 * MiB), ctypes.byref(AccessDesc(1, 0, 3)), c_u64(1)), "access")
    check(cu.cuMemRelease(handle), "release")
    say("used_mib_after_release", _used_mib())
    check(cu.cuMemsetD8(base, 7, c_u64(4 * MiB)), "memset")
    say("contents", dtoh(base.value + 4 * MiB - 4, 4)[1].hex())
    check(cu.cuMemUnmap(base, c_u64(4 * MiB)), "unmap")
    say("used_mib_after_unmap", _used_mib())
    check(cu.cuMemAddressFree(base, c_u64(4 * MiB)), "address free")


def scenario_vmm_retain():
    """cuMemRetainAllocationHandle, as NCCL frees its memory: the handle of what this process mapped,
    one more reference to release; the memory lives until the last one goes, whoever made it. Memory
    this process did not map (cuMemAlloc's, which the worker maps itself) has no handle to give."""
    setup()
    prop = AllocationProp(1, 0, 1, 0)
    base, handle, retained, size = c_u64(), c_u64(), c_u64(), c_u64(4 * MiB)
    check(cu.cuMemAddressReserve(ctypes.byref(base), c_u64(8 * MiB), c_u64(0), c_u64(0), c_u64(0)), "reserve")
    check(cu.cuMemCreate(ctypes.byref(handle), size, ctypes.byref(prop), c_u64(0)), "create")
    check(cu.cuMemMap(base, size, c_u64(0), handle, c_u64(0)), "map")
    check(cu.cuMemSetAccess(base, size, ctypes.byref(AccessDesc(1, 0, 3)), c_u64(1)), "access")
    rc = cu.cuMemRetainAllocationHandle(ctypes.byref(retained), c_u64(base.value + 4096))
    say("retain", f"{rc} {retained.value == handle.value}")
    made = AllocationProp()
    rc = cu.cuMemGetAllocationPropertiesFromHandle(ctypes.byref(made), handle)
    say("properties", f"{rc} {made.type} {made.location_type} {made.location_id}")
    say(
        "properties_of_another_handle",
        cu.cuMemGetAllocationPropertiesFromHandle(ctypes.byref(made), c_u64(0x1234)),
    )
    flags, device0, device5 = c_u64(), (ctypes.c_int * 2)(1, 0), (ctypes.c_int * 2)(1, 5)
    say("access", f"{cu.cuMemGetAccess(ctypes.byref(flags), device0, c_u64(base.value + 64))} {flags.value}")
    say("access_of_another_device", cu.cuMemGetAccess(ctypes.byref(flags), device5, base))
    say("access_unmapped", cu.cuMemGetAccess(ctypes.byref(flags), device0, c_u64(base.value + size.value)))
    say("release_retained", cu.cuMemRelease(retained))
    say("memset_still_mapped", cu.cuMemsetD8(base, 5, size))
    check(cu.cuMemUnmap(base, size), "unmap")
    say("release_created", cu.cuMemRelease(handle))
    say("release_again", cu.cuMemRelease(handle))
    rc, plain = alloc(MiB)
    check(rc, "alloc")
    say("retain_plain_memory", cu.cuMemRetainAllocationHandle(ctypes.byref(retained), c_u64(plain)))
    check(cu.cuMemFree(c_u64(plain)), "free")
    say("retain_unmapped", cu.cuMemRetainAllocationHandle(ctypes.byref(retained), base))
    # The creator's reference released while mapped: the retained one keeps the memory.
    check(cu.cuMemCreate(ctypes.byref(handle), size, ctypes.byref(prop), c_u64(0)), "create again")
    check(cu.cuMemMap(base, size, c_u64(0), handle, c_u64(0)), "map again")
    check(cu.cuMemRelease(handle), "release while mapped")
    say("retain_after_release", cu.cuMemRetainAllocationHandle(ctypes.byref(retained), base))
    check(cu.cuMemUnmap(base, size), "unmap again")
    say("release_last", cu.cuMemRelease(retained))
    check(cu.cuMemAddressFree(base, c_u64(8 * MiB)), "address free")
    free, total = c_u64(), c_u64()
    check(cu.cuMemGetInfo(ctypes.byref(free), ctypes.byref(total)), "info")
    say("used_mib_after", (total.value - free.value) // MiB)


POSIX_FD, FABRIC = 1, 8  # CUmemAllocationHandleType


def _fd_socket_name():
    return "\0" + os.environ["VMM_SOCKET"]  # an abstract Unix socket, as NCCL's IPC socket is


def _used_mib() -> int:
    free, total = c_u64(), c_u64()
    check(cu.cuMemGetInfo(ctypes.byref(free), ctypes.byref(total)), "info")
    return (total.value - free.value) // MiB


def scenario_vmm_share_export():
    """NCCL's cuMem transport, the exporting rank: memory created to be shared as a POSIX descriptor,
    mapped and filled, exported, and the descriptor handed to whoever connects over a Unix socket
    (SCM_RIGHTS). After the importers: what they wrote, and the partition counting the memory once."""
    import socket
    import threading

    setup()
    size = 4 * MiB
    base, handle, plain = c_u64(), c_u64(), c_u64()
    check(cu.cuMemAddressReserve(ctypes.byref(base), c_u64(size), c_u64(0), c_u64(0), c_u64(0)), "reserve")
    check(cu.cuMemCreate(ctypes.byref(handle), c_u64(size), ctypes.byref(AllocationProp(1, POSIX_FD, 1, 0)),
                         c_u64(0)), "create")  # fmt: skip
    check(cu.cuMemMap(base, c_u64(size), c_u64(0), handle, c_u64(0)), "map")
    check(cu.cuMemSetAccess(base, c_u64(size), ctypes.byref(AccessDesc(1, 0, 3)), c_u64(1)), "access")
    check(cu.cuMemsetD8(base, 0x5A, c_u64(size)), "fill")
    fd = ctypes.c_int(-1)
    check(cu.cuMemExportToShareableHandle(ctypes.byref(fd), handle, POSIX_FD, c_u64(0)), "export")
    check(cu.cuMemCreate(ctypes.byref(plain), c_u64(2 * MiB), ctypes.byref(AllocationProp(1, 0, 1, 0)),
                         c_u64(0)), "create unshareable")  # fmt: skip
    unshareable = ctypes.c_int(-1)
    say(
        "export_unshareable",
        cu.cuMemExportToShareableHandle(ctypes.byref(unshareable), plain, POSIX_FD, c_u64(0)),
    )
    say("export_fabric", cu.cuMemExportToShareableHandle(ctypes.byref(unshareable), handle, FABRIC, c_u64(0)))
    check(cu.cuMemRelease(plain), "release unshareable")
    # What the device offers for sharing, as NCCL asks before it picks a way: POSIX descriptors only.
    values = []
    for attribute in (103, 128, 132, 119):  # POSIX descriptors, fabric handles, multicast, pool handle types
        value = ctypes.c_int(-1)
        check(cu.cuDeviceGetAttribute(ctypes.byref(value), attribute, 0), f"attribute {attribute}")
        values.append(str(value.value))
    say("sharing_attributes", ",".join(values))
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(_fd_socket_name())
    server.listen()

    def hand_out():
        while True:
            conn, _ = server.accept()
            with conn:
                socket.send_fds(conn, [b"fd"], [fd.value])

    threading.Thread(target=hand_out, daemon=True).start()
    say("ready", 1)
    sys.stdin.readline()  # the importers are done
    say("after_import", dtoh(base.value + size - 4, 4)[1].hex())
    free, total = c_u64(), c_u64()
    check(cu.cuMemGetInfo(ctypes.byref(free), ctypes.byref(total)), "info")
    say("used_mib", (total.value - free.value) // MiB)
    check(cu.cuMemUnmap(base, c_u64(size)), "unmap")
    say("release", cu.cuMemRelease(handle))
    check(cu.cuMemAddressFree(base, c_u64(size)), "address free")
    if "VMM_STAY" in os.environ:  # released here, held by the importer: what the lease uses, then after it
        say("used_mib_after_release", _used_mib())
        sys.stdin.readline()  # the importer has released it too
        say("used_mib_after_importer_released", _used_mib())


def scenario_vmm_share_import():
    """NCCL's cuMem transport, the importing rank: the descriptor arrives over the Unix socket, is
    imported, mapped in this process's own range, read and written; then unmapped and released."""
    import socket

    setup()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(_fd_socket_name())
        _, fds, _, _ = socket.recv_fds(conn, 16, 1)
    handle = c_u64()
    if (
        "VMM_OWN_FIRST" in os.environ
    ):  # memory of this process's lease under the handle value the export names
        (wanted,) = struct.unpack("<Q", os.pread(fds[0], 8, 16))
        for _ in range(100_000):  # handle values only grow: create (and drop) until this lease holds that one
            prop = AllocationProp(1, POSIX_FD, 1, 0)
            check(
                cu.cuMemCreate(ctypes.byref(handle), c_u64(2 * MiB), ctypes.byref(prop), c_u64(0)),
                "create own",
            )
            if handle.value >= wanted:
                break
            check(cu.cuMemRelease(handle), "release own")
        say("own_handle_is_the_exported_value", handle.value == wanted)
    rc = cu.cuMemImportFromShareableHandle(ctypes.byref(handle), ctypes.c_void_p(fds[0]), POSIX_FD)
    say("import", rc)
    if rc != 0:
        return
    size, base = 4 * MiB, c_u64()
    made = AllocationProp()
    rc = cu.cuMemGetAllocationPropertiesFromHandle(ctypes.byref(made), handle)
    say("properties", f"{rc} {made.handle_types} {made.location_id}")
    check(cu.cuMemAddressReserve(ctypes.byref(base), c_u64(size), c_u64(0), c_u64(0), c_u64(0)), "reserve")
    check(cu.cuMemMap(base, c_u64(size), c_u64(0), handle, c_u64(0)), "map")
    check(cu.cuMemSetAccess(base, c_u64(size), ctypes.byref(AccessDesc(1, 0, 3)), c_u64(1)), "access")
    say("sees_export", dtoh(base.value, size)[1] == b"\x5a" * size)
    check(cu.cuMemsetD8(base, 0xCD, c_u64(size)), "overwrite")
    check(cu.cuCtxSynchronize(), "sync")
    if "VMM_WAIT" in os.environ:  # the exporter unmaps and releases its own reference meanwhile
        say("waiting", 1)
        sys.stdin.readline()
        say("sees_after_exporter_left", dtoh(base.value, size)[1] == b"\xcd" * size)
        say("used_mib_after_exporter_left", _used_mib())  # still counted: this process holds it
        again = c_u64()  # the descriptor still names the memory, as the driver's does while it lives
        rc = cu.cuMemImportFromShareableHandle(ctypes.byref(again), ctypes.c_void_p(fds[0]), POSIX_FD)
        say("import_again", f"{rc} {cu.cuMemRelease(again) if rc == 0 else '-'}")
    say("release_while_mapped", cu.cuMemRelease(handle))  # as NCCL does: the mapping keeps the memory
    say("used_mib_released_still_mapped", _used_mib())
    say("after_release", dtoh(base.value + size - 4, 4)[1].hex())
    check(cu.cuMemUnmap(base, c_u64(size)), "unmap")
    check(cu.cuMemAddressFree(base, c_u64(size)), "address free")
    say("used_mib_at_end", _used_mib())
    os.close(fds[0])
    with open(os.devnull) as other:  # a descriptor that is not exported memory
        say(
            "import_other_fd",
            cu.cuMemImportFromShareableHandle(
                ctypes.byref(handle), ctypes.c_void_p(other.fileno()), POSIX_FD
            ),
        )


class Memcpy2D(ctypes.Structure):  # CUDA_MEMCPY2D
    _fields_ = [(f"{side}{name}", kind) for side in ("src", "dst") for name, kind in (
        ("XInBytes", c_u64), ("Y", c_u64), ("MemoryType", ctypes.c_int), ("Host", ctypes.c_void_p),
        ("Device", c_u64), ("Array", c_u64), ("Pitch", c_u64))] + [("WidthInBytes", c_u64), ("Height", c_u64)]  # fmt: skip


class Memcpy3D(ctypes.Structure):  # CUDA_MEMCPY3D
    _fields_ = [(f"{side}{name}", kind) for side in ("src", "dst") for name, kind in (
        ("XInBytes", c_u64), ("Y", c_u64), ("Z", c_u64), ("LOD", c_u64), ("MemoryType", ctypes.c_int),
        ("Host", ctypes.c_void_p), ("Device", c_u64), ("Array", c_u64), ("Reserved", ctypes.c_void_p),
        ("Pitch", c_u64), ("Height", c_u64))] + [("WidthInBytes", c_u64), ("Height", c_u64), ("Depth", c_u64)]  # fmt: skip


class ArrayDesc(ctypes.Structure):  # CUDA_ARRAY_DESCRIPTOR
    _fields_ = [("Width", c_u64), ("Height", c_u64), ("Format", ctypes.c_int), ("NumChannels", ctypes.c_uint)]


class Array3DDesc(ctypes.Structure):  # CUDA_ARRAY3D_DESCRIPTOR
    _fields_ = [("Width", c_u64), ("Height", c_u64), ("Depth", c_u64), ("Format", ctypes.c_int),
                ("NumChannels", ctypes.c_uint), ("Flags", ctypes.c_uint)]  # fmt: skip


HOST, DEVICE, ARRAY = 1, 2, 3  # CUmemorytype
FLOAT, U8 = 0x20, 0x01  # CUarray_format


def array_filled(array, host, row_bytes, rows):
    """cuMemcpy2D of `rows` rows of `row_bytes` from the host buffer `host` (rows that long) into `array`."""
    copy = Memcpy2D(srcMemoryType=HOST, srcHost=ctypes.addressof(host), srcPitch=row_bytes, dstMemoryType=ARRAY,
                    dstArray=array, WidthInBytes=row_bytes, Height=rows)  # fmt: skip
    return cu.cuMemcpy2D(ctypes.byref(copy))


def array_bytes(array, row_bytes, rows):
    """The first `rows` rows of `row_bytes` of `array`, copied out."""
    back = ctypes.create_string_buffer(row_bytes * rows)
    copy = Memcpy2D(srcMemoryType=ARRAY, srcArray=array, dstMemoryType=HOST, dstHost=ctypes.addressof(back),
                    dstPitch=row_bytes, WidthInBytes=row_bytes, Height=rows)  # fmt: skip
    check(cu.cuMemcpy2D(ctypes.byref(copy)), "read the array")
    return back.raw


def resource_array(getter, handle):
    """The array the resource descriptor of a texture or surface object names (`getter`: cuTexObjectGetResourceDesc
    or cuSurfObjectGetResourceDesc)."""
    described = ctypes.create_string_buffer(144)
    check(getter(described, handle), "the object's resource")
    return struct.unpack_from("<Q", described.raw, 8)[0]


def resource_desc(kind, handle, size=0):
    """A CUDA_RESOURCE_DESC: an array (0) or `size` bytes of linear memory (2) at `handle`."""
    raw = ctypes.create_string_buffer(144)
    struct.pack_into("<iiQ", raw, 0, kind, 0, handle)
    if kind == 2:
        struct.pack_into("<iIQ", raw, 16, FLOAT, 1, size)
    return raw


def scenario_arrays():
    """CUDA arrays as forwarded objects: created and described, filled and read through 2D, 3D and
    one-dimensional copies between host memory (with its own pitch), device memory and arrays, a
    sub-rectangle, a mipmapped array's levels, texture and surface objects over them; a copy outside an
    array or an allocation, an array not of the lease, or past the partition is refused."""
    setup()
    array, other = c_u64(), c_u64()
    check(cu.cuArrayCreate(ctypes.byref(array), ctypes.byref(ArrayDesc(64, 32, FLOAT, 1))), "array")
    described = Array3DDesc()
    rc = cu.cuArray3DGetDescriptor(ctypes.byref(described), array)
    say("described", f"{rc} {described.Width}x{described.Height}x{described.Depth} {described.Format:#x}")
    # 32 rows of 64 floats, in host rows 512 bytes apart; into the array, then out to pitched device memory.
    image = (ctypes.c_float * (128 * 32))(*(float(i) for i in range(128 * 32)))
    to_array = Memcpy2D(srcMemoryType=HOST, srcHost=ctypes.addressof(image), srcPitch=512, dstMemoryType=ARRAY,
                        dstArray=array.value, WidthInBytes=256, Height=32)  # fmt: skip
    say("host_to_array", cu.cuMemcpy2D(ctypes.byref(to_array)))
    rc, dev = alloc(256 * 32)
    check(rc, "alloc")
    to_device = Memcpy2D(srcMemoryType=ARRAY, srcArray=array.value, dstMemoryType=DEVICE, dstDevice=dev,
                         dstPitch=256, WidthInBytes=256, Height=32)  # fmt: skip
    say("array_to_device", cu.cuMemcpy2D(ctypes.byref(to_device)))
    rows = memoryview(dtoh(dev, 256 * 32)[1]).cast("f")
    say("device_rows", f"{rows[0]} {rows[63]} {rows[64]} {rows[64 * 31 + 63]}")  # each row's first 64 floats
    corner = (ctypes.c_float * 8 * 3)()
    piece = Memcpy2D(srcXInBytes=16, srcY=4, srcMemoryType=ARRAY, srcArray=array.value, dstMemoryType=HOST,
                     dstHost=ctypes.addressof(corner), dstPitch=32, WidthInBytes=32, Height=3)  # fmt: skip
    say("sub_rectangle", f"{cu.cuMemcpy2D(ctypes.byref(piece))} {corner[0][0]} {corner[2][7]}")
    stream = c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 0), "stream")
    say("async_2d", cu.cuMemcpy2DAsync(ctypes.byref(piece), stream))
    say("async_sync", cu.cuStreamSynchronize(stream))
    too_tall = Memcpy2D(srcMemoryType=HOST, srcHost=ctypes.addressof(image), srcPitch=512, dstMemoryType=ARRAY,
                        dstArray=array.value, WidthInBytes=256, Height=33)  # fmt: skip
    say("past_the_array", cu.cuMemcpy2D(ctypes.byref(too_tall)))
    past_allocation = Memcpy2D(srcMemoryType=ARRAY, srcArray=array.value, dstMemoryType=DEVICE, dstDevice=dev,
                               dstPitch=512, WidthInBytes=256, Height=32)  # fmt: skip
    say("past_the_allocation", cu.cuMemcpy2D(ctypes.byref(past_allocation)))
    foreign = Memcpy2D(srcMemoryType=ARRAY, srcArray=0x1234, dstMemoryType=DEVICE, dstDevice=dev, dstPitch=256,
                       WidthInBytes=256, Height=1)  # fmt: skip
    say("foreign_array", cu.cuMemcpy2D(ctypes.byref(foreign)))
    # One dimension: bytes at an offset of an array, to and from host and device memory and another array.
    check(cu.cuArrayCreate(ctypes.byref(other), ctypes.byref(ArrayDesc(64, 0, FLOAT, 1))), "1-D array")
    words = (ctypes.c_float * 4)(1.5, 2.5, 3.5, 4.5)
    say("host_to_1d", cu.cuMemcpyHtoA(other, c_u64(8), words, c_u64(16)))
    back = (ctypes.c_float * 6)()
    say("1d_to_host", f"{cu.cuMemcpyAtoH(back, other, c_u64(0), c_u64(24))} {list(back)}")
    say("1d_to_device", cu.cuMemcpyAtoD(c_u64(dev), other, c_u64(8), c_u64(16)))
    say("device_to_1d", cu.cuMemcpyDtoA(other, c_u64(128), c_u64(dev), c_u64(16)))
    say("array_to_array", cu.cuMemcpyAtoA(array, c_u64(0), other, c_u64(128), c_u64(16)))
    check(cu.cuMemcpyAtoH(back, array, c_u64(0), c_u64(24)), "first row")
    say("first_row_now", list(back))
    # Three dimensions: 2 slices of 4 rows of 8 RGBA bytes, host -> 3-D array -> device (slices 8 rows apart).
    volume, cube = c_u64(), (ctypes.c_ubyte * 128 * 2)()
    for i in range(256):
        cube[i // 128][i % 128] = i
    check(cu.cuArray3DCreate(ctypes.byref(volume), ctypes.byref(Array3DDesc(8, 4, 2, U8, 4, 0))), "3-D array")
    into = Memcpy3D(srcMemoryType=HOST, srcHost=ctypes.addressof(cube), srcPitch=32, srcHeight=4,
                    dstMemoryType=ARRAY, dstArray=volume.value, WidthInBytes=32, Height=4, Depth=2)  # fmt: skip
    say("host_to_3d", cu.cuMemcpy3D(ctypes.byref(into)))
    out = Memcpy3D(srcMemoryType=ARRAY, srcArray=volume.value, dstMemoryType=DEVICE, dstDevice=dev, dstPitch=32,
                   dstHeight=8, WidthInBytes=32, Height=4, Depth=2)  # fmt: skip
    say("3d_to_device", cu.cuMemcpy3D(ctypes.byref(out)))
    slab = dtoh(dev, 512)[1]
    say("3d_slices", f"{slab[0]} {slab[127]} {slab[256]} {slab[256 + 127]}")  # the second slice 8 rows on
    mipmapped, level = c_u64(), c_u64()
    rc = cu.cuMipmappedArrayCreate(
        ctypes.byref(mipmapped), ctypes.byref(Array3DDesc(64, 64, 0, FLOAT, 1, 0)), 4
    )
    check(rc, "mipmapped")
    check(cu.cuMipmappedArrayGetLevel(ctypes.byref(level), mipmapped, 2), "level")
    check(cu.cuArray3DGetDescriptor(ctypes.byref(described), level), "level descriptor")
    say("level_2", f"{described.Width}x{described.Height}")
    say("destroy_a_level", cu.cuArrayDestroy(level))  # the mipmapped array's, not the program's to destroy
    texture, surface, linear = c_u64(), c_u64(), c_u64()
    tex_desc = ctypes.create_string_buffer(104)
    say(
        "texture_over_array",
        cu.cuTexObjectCreate(ctypes.byref(texture), resource_desc(0, array.value), tex_desc, None),
    )
    say(
        "texture_over_memory",
        cu.cuTexObjectCreate(ctypes.byref(linear), resource_desc(2, dev, 4096), tex_desc, None),
    )
    say("texture_past_memory", cu.cuTexObjectCreate(ctypes.byref(c_u64()), resource_desc(2, dev, 1 << 20), tex_desc,
                                                    None))  # fmt: skip
    say("texture_foreign_array", cu.cuTexObjectCreate(ctypes.byref(c_u64()), resource_desc(0, 0x1234), tex_desc,
                                                      None))  # fmt: skip
    described_res = ctypes.create_string_buffer(144)
    rc = cu.cuTexObjectGetResourceDesc(described_res, texture)
    kind, _, named = struct.unpack_from("<iiQ", described_res.raw)
    say("texture_resource", f"{rc} {kind} {named == array.value}")
    say(
        "texture_view_when_none", cu.cuTexObjectGetResourceViewDesc(ctypes.create_string_buffer(112), texture)
    )
    say("surface_over_array", cu.cuSurfObjectCreate(ctypes.byref(surface), resource_desc(0, array.value)))
    rc = cu.cuSurfObjectGetResourceDesc(described_res, surface)
    say("surface_resource", f"{rc} {struct.unpack_from('<Q', described_res.raw, 8)[0] == array.value}")
    say("surface_over_memory", cu.cuSurfObjectCreate(ctypes.byref(c_u64()), resource_desc(2, dev, 4096)))
    say(
        "destroyed",
        f"{cu.cuTexObjectDestroy(texture)} {cu.cuTexObjectDestroy(linear)} {cu.cuSurfObjectDestroy(surface)}",
    )
    say("destroyed_again", cu.cuTexObjectDestroy(texture))
    huge = c_u64()
    say(
        "past_partition",
        cu.cuArrayCreate(ctypes.byref(huge), ctypes.byref(ArrayDesc(1 << 16, 1 << 12, FLOAT, 4))),
    )
    say("destroy", f"{cu.cuArrayDestroy(array)} {cu.cuArrayDestroy(other)} {cu.cuArrayDestroy(volume)} "
                   f"{cu.cuMipmappedArrayDestroy(mipmapped)}")  # fmt: skip
    say("destroy_again", cu.cuArrayDestroy(array))


SPARSE, DEFERRED_MAPPING, NV12 = 0x40, 0x80, 0xB0  # CUDA_ARRAY3D_* flags, CU_AD_FORMAT_NV12


def array_map_info(kind, array, memory, operation=1, devices=1):
    """A CUarrayMapInfo: the first 128x128 tile range of level 0 of `array`, mapped to (operation 1) or
    unmapped from (2) memory handle `memory` at its start, on the devices of the mask."""
    raw = ctypes.create_string_buffer(96)
    struct.pack_into("<iiQi", raw, 0, kind, 0, array, 0)
    struct.pack_into("<8I", raw, 24, 0, 0, 0, 0, 0, 128, 128, 1)
    struct.pack_into("<iiQQI", raw, 56, operation, 0, memory, 0, devices)
    return raw


def scenario_arrays_rest():
    """An NV12 array's planes; a sparse array's (and a sparse mipmapped array's) properties; a deferred
    array's memory requirements; tiles of a sparse array mapped to memory the program created and
    unmapped; what is not the lease's, or not such an array, refused."""
    setup()

    def array(width, height, fmt, channels, flags=0):
        handle = c_u64()
        desc = Array3DDesc(width, height, 0, fmt, channels, flags)
        check(cu.cuArray3DCreate(ctypes.byref(handle), ctypes.byref(desc)), f"array {fmt:#x} {flags:#x}")
        return handle

    nv12 = array(64, 32, NV12, 3)
    plain = array(64, 32, FLOAT, 1)
    planes = []
    for index in (0, 1):
        plane, desc = c_u64(), Array3DDesc()
        check(cu.cuArrayGetPlane(ctypes.byref(plane), nv12, index), f"plane {index}")
        check(cu.cuArray3DGetDescriptor(ctypes.byref(desc), plane), "plane descriptor")
        planes.append((desc.Width, desc.Height, desc.Format, desc.NumChannels))
    say("planes", planes)
    other = c_u64()
    say("plane_beyond", cu.cuArrayGetPlane(ctypes.byref(other), nv12, 2))
    say("plane_of_plain", cu.cuArrayGetPlane(ctypes.byref(other), plain, 0))
    say("plane_of_foreign", cu.cuArrayGetPlane(ctypes.byref(other), c_u64(0x4242), 0))
    sparse = array(512, 512, FLOAT, 1, SPARSE)
    props = (ctypes.c_uint32 * 12)()
    check(cu.cuArrayGetSparseProperties(props, sparse), "sparse properties")
    say("sparse_tile", tuple(props[:3]))
    say("sparse_of_plain", cu.cuArrayGetSparseProperties(props, plain))
    mipmap, desc = c_u64(), Array3DDesc(512, 512, 0, FLOAT, 1, SPARSE)
    check(cu.cuMipmappedArrayCreate(ctypes.byref(mipmap), ctypes.byref(desc), 4), "sparse mipmap")
    check(cu.cuMipmappedArrayGetSparseProperties(props, mipmap), "mipmap sparse properties")
    say("mipmap_tile", tuple(props[:3]))
    deferred = array(512, 512, FLOAT, 1, DEFERRED_MAPPING)
    reqs = (c_u64 * 4)()
    check(cu.cuArrayGetMemoryRequirements(reqs, deferred, 0), "requirements")
    say("requirements_cover_it", reqs[0] >= 512 * 512 * 4 and reqs[1] > 0)
    say("requirements_other_device", cu.cuArrayGetMemoryRequirements(reqs, deferred, 3))
    memory = c_u64()
    tile_pool = AllocationProp(1, 0, 1, 0, None, 1 << 16)  # allocFlags.usage CU_MEM_CREATE_USAGE_TILE_POOL
    check(cu.cuMemCreate(ctypes.byref(memory), c_u64(2 * MiB), ctypes.byref(tile_pool), c_u64(0)), "memory")
    other_usage = AllocationProp(1, 0, 1, 0, None, 4 << 16)  # CU_MEM_CREATE_USAGE_GPU_DIRECT_RDMA_OVER_PCIE
    say(
        "other_usage",
        cu.cuMemCreate(ctypes.byref(c_u64()), c_u64(2 * MiB), ctypes.byref(other_usage), c_u64(0)),
    )
    check(cu.cuMemMapArrayAsync(array_map_info(0, sparse.value, memory.value), 1, c_u64(0)), "map tiles")
    check(
        cu.cuMemMapArrayAsync(array_map_info(0, sparse.value, memory.value, operation=2), 1, c_u64(0)),
        "unmap",
    )
    check(cu.cuStreamSynchronize(c_u64(0)), "sync")
    refusals = {
        "map_foreign_memory": array_map_info(0, sparse.value, 0x4242),
        "map_foreign_array": array_map_info(0, 0x4242, memory.value),
        "map_other_device": array_map_info(0, sparse.value, memory.value, devices=2),
        "map_plain_array": array_map_info(0, plain.value, memory.value),
    }
    for name, info in refusals.items():
        say(name, cu.cuMemMapArrayAsync(info, 1, c_u64(0)))
    check(cu.cuMipmappedArrayDestroy(mipmap), "destroy mipmap")
    for handle in (nv12, plain, sparse, deferred):
        check(cu.cuArrayDestroy(handle), "destroy")
    check(cu.cuMemRelease(memory), "release")
    say("finished", 1)


def scenario_texture_references():
    """Legacy texture and surface references of a module: found by name, bound to an array, to memory and
    to 2D rows of it, their settings set and read back, a surface reference bound to an array made for
    surfaces, one created and destroyed, one given to a function's legacy launches; what is not the
    lease's, or past its memory, refused; a module's references gone with it."""
    setup()
    module, tex, surf, other, fill = c_u64(), c_u64(), c_u64(), c_u64(), c_u64()
    image = b"// module\n.global .texref tex_in;\n.global .surfref surf_out;\n"
    check(cu.cuModuleLoadData(ctypes.byref(module), image), "load")
    check(cu.cuModuleGetTexRef(ctypes.byref(tex), module, b"tex_in"), "texture reference")
    check(cu.cuModuleGetSurfRef(ctypes.byref(surf), module, b"surf_out"), "surface reference")
    say(
        "same_again",
        cu.cuModuleGetTexRef(ctypes.byref(other), module, b"tex_in") == 0 and other.value == tex.value,
    )
    say("unknown_name", cu.cuModuleGetTexRef(ctypes.byref(other), module, b"nothing"))
    say("surface_as_texture", cu.cuModuleGetTexRef(ctypes.byref(other), module, b"surf_out"))
    array, surface_array, back = c_u64(), c_u64(), c_u64()
    check(cu.cuArray3DCreate(ctypes.byref(array), ctypes.byref(Array3DDesc(64, 32, 0, FLOAT, 1, 0))), "array")
    check(cu.cuTexRefSetArray(tex, array, 1), "bind the array")  # CU_TRSA_OVERRIDE_FORMAT
    check(cu.cuTexRefGetArray(ctypes.byref(back), tex), "its array")
    say("array_back", back.value == array.value)
    rc, ptr = alloc(4096)
    check(rc, "alloc")
    offset, address = c_u64(1), c_u64()
    check(cu.cuTexRefSetAddress(ctypes.byref(offset), tex, c_u64(ptr), c_u64(4096)), "bind memory")
    check(cu.cuTexRefGetAddress(ctypes.byref(address), tex), "its address")
    say("address_back", (offset.value, address.value == ptr))
    say("address_past_memory", cu.cuTexRefSetAddress(ctypes.byref(offset), tex, c_u64(ptr), c_u64(8192)))
    say("address_not_the_leases",
        cu.cuTexRefSetAddress(ctypes.byref(offset), tex, c_u64(0x7123_4560_0000), c_u64(16)))  # fmt: skip
    check(
        cu.cuTexRefSetAddress2D(tex, ctypes.byref(ArrayDesc(16, 16, FLOAT, 1)), c_u64(ptr), c_u64(256)),
        "2D rows",
    )
    say("rows_past_memory", cu.cuTexRefSetAddress2D(tex, ctypes.byref(ArrayDesc(16, 32, FLOAT, 1)), c_u64(ptr),
                                                    c_u64(256)))  # fmt: skip
    check(cu.cuTexRefSetFormat(tex, U8, 2), "format")
    check(cu.cuTexRefSetAddressMode(tex, 1, 2), "address mode")  # dimension 1: CU_TR_ADDRESS_MODE_MIRROR
    check(cu.cuTexRefSetFilterMode(tex, 1), "filter")
    check(cu.cuTexRefSetMipmapFilterMode(tex, 1), "mipmap filter")
    check(cu.cuTexRefSetMipmapLevelBias(tex, ctypes.c_float(0.5)), "bias")
    check(cu.cuTexRefSetMipmapLevelClamp(tex, ctypes.c_float(0.25), ctypes.c_float(3.0)), "clamp")
    check(cu.cuTexRefSetMaxAnisotropy(tex, 4), "anisotropy")
    check(cu.cuTexRefSetBorderColor(tex, (ctypes.c_float * 4)(0.125, 0.25, 0.5, 1.0)), "border")
    check(cu.cuTexRefSetFlags(tex, 2), "flags")  # CU_TRSF_NORMALIZED_COORDINATES
    fmt, channels, mode, filt, mip, aniso, flags = (ctypes.c_int() for _ in range(7))
    bias, low, high, border = ctypes.c_float(), ctypes.c_float(), ctypes.c_float(), (ctypes.c_float * 4)()
    check(cu.cuTexRefGetFormat(ctypes.byref(fmt), ctypes.byref(channels), tex), "get format")
    check(cu.cuTexRefGetAddressMode(ctypes.byref(mode), tex, 1), "get mode")
    check(cu.cuTexRefGetFilterMode(ctypes.byref(filt), tex), "get filter")
    check(cu.cuTexRefGetMipmapFilterMode(ctypes.byref(mip), tex), "get mipmap filter")
    check(cu.cuTexRefGetMipmapLevelBias(ctypes.byref(bias), tex), "get bias")
    check(cu.cuTexRefGetMipmapLevelClamp(ctypes.byref(low), ctypes.byref(high), tex), "get clamp")
    check(cu.cuTexRefGetMaxAnisotropy(ctypes.byref(aniso), tex), "get anisotropy")
    check(cu.cuTexRefGetBorderColor(border, tex), "get border")
    check(cu.cuTexRefGetFlags(ctypes.byref(flags), tex), "get flags")
    say("settings", (fmt.value, channels.value, mode.value, filt.value, mip.value, bias.value, low.value,
                     high.value, aniso.value, tuple(border), flags.value))  # fmt: skip
    check(cu.cuArray3DCreate(ctypes.byref(surface_array), ctypes.byref(Array3DDesc(64, 32, 0, FLOAT, 1, 2))),
          "surface array")  # fmt: skip
    check(cu.cuSurfRefSetArray(surf, surface_array, 0), "bind the surface")
    check(cu.cuSurfRefGetArray(ctypes.byref(back), surf), "its array")
    say("surface_array_back", back.value == surface_array.value)
    say("surface_over_foreign_array", cu.cuSurfRefSetArray(surf, c_u64(0x4242), 0))
    say("foreign_reference", cu.cuTexRefSetFlags(c_u64(0x4242), 0))
    made = c_u64()
    check(cu.cuTexRefCreate(ctypes.byref(made)), "create")
    check(cu.cuTexRefDestroy(made), "destroy")
    say("destroyed_twice", cu.cuTexRefDestroy(made))
    check(cu.cuModuleGetFunction(ctypes.byref(fill), module, b"fill_u32"), "function")
    check(cu.cuParamSetTexRef(fill, -1, tex), "legacy launch's texture")  # CU_PARAM_TR_DEFAULT
    check(cu.cuModuleUnload(module), "unload")
    say("after_unload", cu.cuTexRefSetFlags(tex, 0))
    for handle in (array, surface_array):
        check(cu.cuArrayDestroy(handle), "destroy array")
    say("finished", 1)


def scenario_pitched_and_context():
    """Pitched allocations and 2D memsets (rows apart by the pitch, one memset when they touch), a
    library read from a file, a context's flags and events."""
    import tempfile

    ctx = setup()
    ptr, pitch = c_u64(), c_u64()
    rc = cu.cuMemAllocPitch(ctypes.byref(ptr), ctypes.byref(pitch), c_u64(100), c_u64(8), 4)
    say("alloc_pitch", f"{rc} {pitch.value}")
    say(
        "odd_element_size",
        cu.cuMemAllocPitch(ctypes.byref(c_u64()), ctypes.byref(c_u64()), c_u64(100), c_u64(8), 3),
    )
    say("memset_rows", cu.cuMemsetD2D32(ptr, pitch, 7, c_u64(25), c_u64(8)))
    rows = (ctypes.c_uint32 * 26 * 8)()
    copy = Memcpy2D(srcMemoryType=DEVICE, srcDevice=ptr.value, srcPitch=pitch.value, dstMemoryType=HOST,
                    dstHost=ctypes.addressof(rows), dstPitch=104, WidthInBytes=104, Height=8)  # fmt: skip
    check(cu.cuMemcpy2D(ctypes.byref(copy)), "rows back")
    say("rows", f"{rows[0][0]} {rows[7][24]} {rows[0][25]}")  # 25 words set per row, the 26th left alone
    stream = c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 0), "stream")
    say("memset_touching_rows", cu.cuMemsetD2D8Async(ptr, c_u64(16), 3, c_u64(16), c_u64(4), stream))
    check(cu.cuStreamSynchronize(stream), "sync")
    say("touching_rows", dtoh(ptr.value, 64)[1] == b"\x03" * 64)
    say("pitch_shorter_than_row", cu.cuMemsetD2D16(ptr, c_u64(8), 1, c_u64(8), c_u64(2)))
    with tempfile.NamedTemporaryFile(suffix=".ptx") as image:
        image.write(b"// lib\n.visible .entry filekernel(.param .u32 a)\n")
        image.flush()
        library, kernel = c_u64(), c_u64()
        rc = cu.cuLibraryLoadFromFile(
            ctypes.byref(library), image.name.encode(), None, None, 0, None, None, 0
        )
        say(
            "library_from_file", f"{rc} {cu.cuLibraryGetKernel(ctypes.byref(kernel), library, b'filekernel')}"
        )
    say("library_missing_file", cu.cuLibraryLoadFromFile(ctypes.byref(c_u64()), b"/nonexistent.ptx", None, None, 0,
                                                         None, None, 0))  # fmt: skip
    flags = ctypes.c_uint()
    say("set_flags", cu.cuCtxSetFlags(1))  # CU_CTX_SCHED_SPIN
    say("flags", f"{cu.cuCtxGetFlags(ctypes.byref(flags))} {flags.value}")
    event = c_u64()
    check(cu.cuEventCreate(ctypes.byref(event), 0), "event")
    say("record_event", cu.cuCtxRecordEvent(ctx, event))
    say("wait_event", cu.cuCtxWaitEvent(ctx, event))
    say("event_done", cu.cuEventSynchronize(event))
    say("reset_persisting_l2", cu.cuCtxResetPersistingL2Cache())
    say("record_foreign_context", cu.cuCtxRecordEvent(c_u64(0x1234), event))  # refused at the next sync
    say("sync_after", cu.cuCtxSynchronize())


def scenario_stream_attributes():
    """A stream's attributes round trip (plain values, an access-policy window over the lease's memory)
    and copy to another stream; a window over memory that is not the lease's, or an attribute that
    carries other handles, is refused."""
    setup()
    rc, buf = alloc(1 << 20)
    check(rc, "alloc")
    stream, other = c_u64(), c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 0), "stream")
    check(cu.cuStreamCreate(ctypes.byref(other), 0), "other stream")
    value = (ctypes.c_int * 16)()

    def get(on, attr):
        rc = cu.cuStreamGetAttribute(on, attr, value)
        return f"{rc} {value[0]}"

    priority = (ctypes.c_int * 16)(-1)
    say("set_priority", cu.cuStreamSetAttribute(stream, 8, priority))  # CU_LAUNCH_ATTRIBUTE_PRIORITY
    say("get_priority", get(stream, 8))
    window = (c_u64 * 8)(buf, 4096)  # base, bytes; hit ratio and properties zero
    say("window_over_lease_memory", cu.cuStreamSetAttribute(stream, 1, window))
    say("window_elsewhere", cu.cuStreamSetAttribute(stream, 1, (c_u64 * 8)(0x1000, 4096)))
    say("window_past_the_allocation", cu.cuStreamSetAttribute(stream, 1, (c_u64 * 8)(buf, 1 << 30)))
    say(
        "handle_carrying_attribute", cu.cuStreamSetAttribute(stream, 13, priority)
    )  # DEVICE_UPDATABLE_KERNEL_NODE
    say("copy_attributes", cu.cuStreamCopyAttributes(other, stream))
    say("copied_priority", get(other, 8))
    width = c_u64()
    rc = cu.cuDeviceGetTexture1DLinearMaxWidth(ctypes.byref(width), 0x20, 1, 0)
    say("texture_1d_max_width", f"{rc} {width.value > 0}")
    # Stream memory operations on words of the lease's memory; one past its end fails at the next sync.
    check(cu.cuStreamWriteValue32(stream, c_u64(buf), 5, 0), "write 32")
    check(cu.cuStreamWriteValue64(stream, c_u64(buf + 8), c_u64(1 << 40), 0), "write 64")
    check(cu.cuStreamWaitValue32(stream, c_u64(buf), 5, 0), "wait 32")  # CU_STREAM_WAIT_VALUE_GEQ
    check(cu.cuStreamSynchronize(stream), "sync")
    say("written", struct.unpack("<IIQ", dtoh(buf, 16)[1]))
    say("write_past_the_end", cu.cuStreamWriteValue64(stream, c_u64(buf + (1 << 20) - 4), c_u64(1), 0))
    say("sync_after", cu.cuStreamSynchronize(stream))
    host, mapped = ctypes.c_void_p(), c_u64()  # mapped page-locked memory: its device pointer is mirrored
    check(cu.cuMemHostAlloc(ctypes.byref(host), c_u64(4096), 2), "host alloc")  # CU_MEMHOSTALLOC_DEVICEMAP
    check(cu.cuMemHostGetDevicePointer(ctypes.byref(mapped), host, 0), "device pointer")
    say("write_to_mapped_memory", cu.cuStreamWriteValue32(stream, mapped, 1, 0))
    props = (ctypes.c_int * 14)()  # CUdevprop
    rc = cu.cuDeviceGetProperties(props, 0)
    say("device_properties", f"{rc} {props[0]} {props[9]}")  # max threads per block, warp size


def mem_op(op, addr=0, value=0, flags=0):
    """One CUstreamBatchMemOpParams (48 bytes): operation, then a wait's or write's address, value, flags."""
    params = (ctypes.c_uint8 * 48)()
    struct.pack_into("<IxxxxQQI", params, 0, op, addr, value, flags)
    return bytes(params)


def scenario_memory_calls():
    """Issue 25's memory calls on the lease's memory: a pointer's SYNC_MEMOPS set and read back, a device's
    current pool set to a pool of the lease and back, a flush of GPUDirect RDMA writes, 3D copies between
    contexts, stream memory operations in a batch, managed memory attached to a stream, a copy with
    attributes, batched prefetch and discard; each refused where the driver refuses or the memory is not
    the lease's."""
    ctx = setup()
    rc, buf = alloc(1 << 20)
    check(rc, "alloc")
    stream = c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 1), "stream")
    on, flag = ctypes.c_uint32(1), ctypes.c_uint32(7)
    say("set_sync_memops", cu.cuPointerSetAttribute(ctypes.byref(on), 6, c_u64(buf + 64)))
    check(cu.cuPointerGetAttribute(ctypes.byref(flag), 6, c_u64(buf)), "sync memops")
    say("sync_memops", flag.value)
    say("set_sync_memops_elsewhere", cu.cuPointerSetAttribute(ctypes.byref(on), 6, c_u64(0x1000)))
    say("set_unsettable_attribute", cu.cuPointerSetAttribute(ctypes.byref(on), 1, c_u64(buf)))

    pool, default, current, ptr = c_u64(), c_u64(), c_u64(), c_u64()
    check(cu.cuMemPoolCreate(ctypes.byref(pool), ctypes.byref(PoolProps(1, 0, 1, 0))), "pool create")
    check(cu.cuDeviceGetDefaultMemPool(ctypes.byref(default), 0), "default pool")
    say("set_pool", cu.cuDeviceSetMemPool(0, pool))
    check(cu.cuDeviceGetMemPool(ctypes.byref(current), 0), "current pool")
    say("current_is_set", current.value == pool.value)
    check(cu.cuMemAllocAsync(ctypes.byref(ptr), c_u64(4096), stream), "alloc from the current pool")
    check(cu.cuMemFreeAsync(ptr, stream), "free")
    check(cu.cuStreamSynchronize(stream), "sync")
    say("set_foreign_pool", cu.cuDeviceSetMemPool(0, c_u64(0xDEAD0000)))
    say("set_default_back", cu.cuDeviceSetMemPool(0, default))
    check(cu.cuDeviceGetMemPool(ctypes.byref(current), 0), "current pool")
    say("current_is_default", current.value == default.value)
    check(cu.cuMemPoolDestroy(pool), "pool destroy")

    native = ctypes.c_int(-1)
    check(cu.cuDeviceGetAttribute(ctypes.byref(native), 86, 0), "host native atomics")
    capabilities = (ctypes.c_uint * 2)(7, 7)
    rc = cu13.cuDeviceGetHostAtomicCapabilities(
        capabilities, (ctypes.c_int * 2)(0, 10), 2, 0
    )  # INTEGER_ADD, FLOAT_ADD
    say("host_atomics", f"{native.value} {rc} {capabilities[0]} {capabilities[1]}")
    say("host_atomics_bad", [cu13.cuDeviceGetHostAtomicCapabilities(capabilities, (ctypes.c_int * 1)(13), 1, 0),
                             cu13.cuDeviceGetHostAtomicCapabilities(capabilities, (ctypes.c_int * 1)(0), 1, 5)])  # fmt: skip
    # The worker's driver log (the host executor's says nothing): an iterator, a dump into memory and a file.
    iterator, size = ctypes.c_uint(77), c_u64(64)
    text = ctypes.create_string_buffer(b"x" * 64)
    say("log_current", f"{cu13.cuLogsCurrent(ctypes.byref(iterator), 0)} {iterator.value}")
    rc = cu13.cuLogsDumpToMemory(ctypes.byref(iterator), text, ctypes.byref(size), 0)
    say("log_dump", f"{rc} {size.value} {text.raw[:1].hex()}")  # nothing since the iterator, NUL-terminated
    say(
        "log_dump_bad", [cu13.cuLogsDumpToMemory(None, text, ctypes.byref(size), 1), size.value]
    )  # reserved flags
    path = f"/tmp/gpupool-log-{os.getpid()}"
    rc = cu13.cuLogsDumpToFile(None, path.encode(), 0)
    with open(path, "rb") as file:
        say("log_file", f"{rc} {file.read()!r}")
    os.unlink(path)
    say("log_file_unwritable", cu13.cuLogsDumpToFile(None, b"/nonexistent-dir/log", 0))
    say("flush_rdma_writes", cu.cuFlushGPUDirectRDMAWrites(0, 100))  # CURRENT_CTX, TO_OWNER
    say("flush_bad_scope", cu.cuFlushGPUDirectRDMAWrites(0, 7))

    check(cu.cuMemcpyHtoD(c_u64(buf), bytes(range(256)), c_u64(256)), "fill")
    peer = Memcpy3D(srcMemoryType=DEVICE, srcDevice=buf, srcReserved=ctx.value, dstMemoryType=DEVICE,
                    dstDevice=buf + 4096, dstReserved=ctx.value, WidthInBytes=256, Height=1, Depth=1)  # fmt: skip
    say("peer_3d", cu.cuMemcpy3DPeer(ctypes.byref(peer)))
    peer.dstDevice = buf + 8192
    say("peer_3d_async", cu.cuMemcpy3DPeerAsync(ctypes.byref(peer), stream))
    check(cu.cuStreamSynchronize(stream), "sync")
    say("peer_copied", dtoh(buf + 4096, 256)[1] == bytes(range(256)) == dtoh(buf + 8192, 256)[1])
    peer.dstDevice = 0x1000
    say("peer_3d_elsewhere", cu.cuMemcpy3DPeer(ctypes.byref(peer)))

    # Stream memory operations in a batch: WRITE_VALUE_32, WRITE_VALUE_64, a BARRIER, WAIT_VALUE_32.
    at = buf + 16384
    ops = mem_op(2, at, 7) + mem_op(5, at + 8, 1 << 40) + mem_op(6) + mem_op(1, at, 7)
    say("batch_mem_op", cu.cuStreamBatchMemOp(stream, 4, ops, 0))
    check(cu.cuStreamSynchronize(stream), "sync")
    say("batch_written", struct.unpack("<IIQ", dtoh(at, 16)[1]))
    say("batch_bad_op", cu.cuStreamBatchMemOp(stream, 2, mem_op(2, at + 16, 9) + mem_op(9), 0))
    check(cu.cuStreamSynchronize(stream), "sync")
    say("bad_batch_wrote_nothing", dtoh(at + 16, 4)[1].hex())
    say("batch_past_the_end", cu.cuStreamBatchMemOp(stream, 1, mem_op(5, buf + (1 << 20) - 4, 1), 0))
    say("sync_after_batch", cu.cuStreamSynchronize(stream))

    managed = c_u64()
    check(cu.cuMemAllocManaged(ctypes.byref(managed), c_u64(8192), 1), "alloc managed")
    say("attach_managed", cu.cuStreamAttachMemAsync(stream, managed, c_u64(0), 4))  # CU_MEM_ATTACH_SINGLE
    say("attach_plain", cu.cuStreamAttachMemAsync(stream, c_u64(buf), c_u64(0), 4))
    say("attach_bad_flags", cu.cuStreamAttachMemAsync(stream, managed, c_u64(0), 3))
    rc = cu.cuStreamBatchMemOp(stream, 2, mem_op(2, at + 20, 5) + mem_op(2, managed.value, 5), 0)
    check(cu.cuStreamSynchronize(stream), "sync")
    say("batch_on_managed_memory", f"{rc} {dtoh(at + 20, 4)[1].hex()}")  # refused whole: nothing written

    source = ctypes.create_string_buffer(b"\x42" * 512)
    attribute = MemcpyAttributes(1)  # CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
    rc = cu13.cuMemcpyWithAttributesAsync(c_u64(buf + 32768), c_u64(ctypes.addressof(source)), c_u64(512),
                                          ctypes.byref(attribute), stream)  # fmt: skip
    say("copy_with_attributes", rc)
    whole = BatchOp3D(
        Operand3D(1, 0, buf + 32768, 0, 0), Operand3D(1, 0, buf + 40960, 0, 0), (c_u64 * 3)(512, 1, 1), 1
    )
    say("copy_3d_with_attributes", cu13.cuMemcpy3DWithAttributesAsync(ctypes.byref(whole), c_u64(0), stream))
    check(cu.cuStreamSynchronize(stream), "sync")
    say("attributed_copies_landed", dtoh(buf + 40960, 512)[1] == b"\x42" * 512)
    say("copy_invalid_order", cu13.cuMemcpyWithAttributesAsync(c_u64(buf), c_u64(buf + 512), c_u64(64),
                                                                ctypes.byref(MemcpyAttributes(0)), stream))  # fmt: skip

    # Batched prefetch and discard: hints over managed memory (which the next device work brings up to
    # date whatever the hints say): checked, and accepted.
    ranges, sizes = (c_u64 * 2)(managed.value, managed.value + 4096), (c_u64 * 2)(4096, 4096)
    locations, starts = (c_u64 * 2)(1, 2), (c_u64 * 2)(0, 1)  # device 0 for the first range, the host after
    rc = cu13.cuMemPrefetchBatchAsync(ranges, sizes, c_u64(2), locations, starts, c_u64(2), c_u64(0), stream)
    say("prefetch_batch", rc)
    plain = (c_u64 * 2)(managed.value, buf)
    say("prefetch_batch_plain", cu13.cuMemPrefetchBatchAsync(plain, sizes, c_u64(2), locations, starts, c_u64(2),
                                                             c_u64(0), stream))  # fmt: skip
    say("prefetch_batch_bad_starts", cu13.cuMemPrefetchBatchAsync(ranges, sizes, c_u64(2), locations,
                                                                  (c_u64 * 2)(1, 0), c_u64(2), c_u64(0), stream))  # fmt: skip
    say("discard_batch", cu13.cuMemDiscardBatchAsync(ranges, sizes, c_u64(2), c_u64(0), stream))
    say("discard_batch_plain", cu13.cuMemDiscardBatchAsync(plain, sizes, c_u64(2), c_u64(0), stream))
    rc = cu13.cuMemDiscardAndPrefetchBatchAsync(
        ranges, sizes, c_u64(2), locations, starts, c_u64(2), c_u64(0), stream
    )
    say("discard_and_prefetch_batch", rc)
    say("sync", cu.cuStreamSynchronize(stream))

    # What was advised and prefetched, read back per range (pages of 4 KiB here).
    def attribute(number, start, length, slots=1):
        out = (ctypes.c_int * slots)()
        rc = cu.cuMemRangeGetAttribute(out, c_u64(4 * slots), number, c_u64(start), c_u64(length))
        return f"{rc} {' '.join(map(str, out))}"

    m = managed.value
    say(
        "last_prefetch_per_range",
        [attribute(4, m, 4096), attribute(4, m + 4096, 4096), attribute(4, m, 8192)],
    )
    say("last_prefetch_type_id", [attribute(7, m, 4096), attribute(8, m, 4096), attribute(7, m + 4096, 4096)])
    say("no_advice_yet", [attribute(1, m, 8192), attribute(2, m, 8192), attribute(3, m, 8192, 3)])
    device0, host = c_u64(1), c_u64(2)  # CUmemLocation by value (cuMemAdvise_v2): DEVICE 0, HOST
    check(cu.cuMemAdvise(managed, c_u64(8192), 1, device0), "read mostly")  # SET_READ_MOSTLY
    check(cu.cuMemAdvise(managed, c_u64(100), 3, device0), "preferred")  # SET_PREFERRED_LOCATION: 1 page
    check(cu.cuMemAdvise(managed, c_u64(8192), 5, device0), "accessed by device 0")  # SET_ACCESSED_BY
    check(cu.cuMemAdvise(c_u64(m + 4096), c_u64(4096), 5, host), "accessed by the host")
    say("read_mostly", attribute(1, m, 8192))
    say("preferred", [attribute(2, m, 4096), attribute(2, m, 8192), attribute(5, m, 10), attribute(6, m, 10)])
    say("accessed_by", [attribute(3, m, 8192, 3), attribute(3, m + 4096, 4096, 3)])
    check(cu.cuMemAdvise(managed, c_u64(8192), 2, device0), "not read mostly")  # UNSET_READ_MOSTLY
    values = (ctypes.c_int * 2)(9, 9)
    pointers = (ctypes.c_void_p * 2)(ctypes.addressof(values), ctypes.addressof(values) + 4)
    rc = cu.cuMemRangeGetAttributes(pointers, (c_u64 * 2)(4, 4), (ctypes.c_int * 2)(1, 2), c_u64(2), managed,
                                    c_u64(4096))  # fmt: skip
    say("attributes", f"{rc} {values[0]} {values[1]}")
    say("attribute_of_plain_memory", attribute(1, buf, 64))
    say("attribute_wrong_size", cu.cuMemRangeGetAttribute(values, c_u64(8), 1, managed, c_u64(64)))
    say("unknown_advice", cu.cuMemAdvise(managed, c_u64(64), 9, device0))
    check(cu.cuMemFree(managed), "free managed")
    check(cu.cuMemAllocManaged(ctypes.byref(managed), c_u64(8192), 1), "alloc managed again")
    say("new_memory_has_no_advice", [attribute(2, managed.value, 8192), attribute(4, managed.value, 8192)])


def scenario_collision():
    # Host memory of this process where a worker without a window would put its first allocation, and
    # every range where workers place windows taken as well: the shim must fall back.
    base = int(os.environ["TAKEN_ADDRESS"], 0)
    low, high = WINDOW_REGION
    say(
        "window_region_taken",
        _mmap(low, high - low, 0, PRIVATE_ANONYMOUS | FIXED_NOREPLACE | NORESERVE) == low,
    )
    got = _mmap(base, 2 * MiB, 3, PRIVATE_ANONYMOUS | FIXED_NOREPLACE)  # read-write
    say("host_mapping_at_base", got == base)
    setup()
    rc, ptr = alloc(1 * MiB)
    say("alloc", rc)
    say("moved_off_host_memory", ptr != base)
    free, total = c_u64(), c_u64()
    check(cu.cuMemGetInfo(ctypes.byref(free), ctypes.byref(total)), "info")
    say("used_mib", (total.value - free.value) // MiB)  # the colliding allocation was given back
    ctypes.memset(base, 7, 16)  # the host mapping is untouched and usable
    say("host_memory_ok", ctypes.string_at(base, 2) == b"\x07\x07")


def scenario_long_call():
    setup()
    module, fn = c_u64(), c_u64()
    check(cu.cuModuleLoadData(ctypes.byref(module), b"// module\n"), "load")
    check(cu.cuModuleGetFunction(ctypes.byref(fn), module, b"sleep_ms"), "function")
    ms = ctypes.c_uint32(3000)
    params = (ctypes.c_void_p * 1)(ctypes.addressof(ms))
    say("launched", time.time())
    check(cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, c_u64(0), params, None), "launch")
    say("sync", cu.cuCtxSynchronize())


def scenario_leak():
    setup()
    say("alloc", alloc(40 * MiB)[0])


def scenario_worker_dies():
    setup()
    rc, a = alloc(1 * MiB)
    check(rc, "alloc")
    say("ready", 1)
    sys.stdin.readline()  # the test kills the worker now
    say("memset", cu.cuMemsetD8(c_u64(a), 1, c_u64(16)))
    say("sync", cu.cuCtxSynchronize())
    say("again", cu.cuCtxSynchronize())


def scenario_worker_dies_while_waiting():
    """Says `ready` while waiting in a cuStreamSynchronize the worker cannot finish (the stream held at a
    host function of this process); the test kills the worker then: the wait ends with the error."""
    import threading

    setup()
    stream = c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 1), "stream")
    gate = threading.Event()
    held = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda _: (say("ready", 1), gate.wait(60)))
    check(cu.cuLaunchHostFunc(stream, held, None), "host function")
    say("sync", cu.cuStreamSynchronize(stream))
    say("again", cu.cuCtxSynchronize())
    gate.set()
    sys.stdout.flush()
    os._exit(0)  # the callback thread's connection went with the worker


def scenario_copy_flood():
    """Copies of 4 MiB to the device and small calls between, as fast as they go, until a line on stdin
    (or the test kills this process mid-copy); then the last copy's bytes are read back."""
    import select

    setup()
    n = 4 * MiB
    rc, dev = alloc(24 * MiB)
    check(rc, "alloc")
    event = c_u64()
    check(cu.cuEventCreate(ctypes.byref(event), 0), "event")
    data, rounds = b"", 0
    while not select.select([sys.stdin], [], [], 0)[0]:
        data = os.urandom(16) * (n // 16)
        check(cu.cuMemcpyHtoD(c_u64(dev + (rounds % 5) * n), data, c_u64(n)), "htod")
        check(cu.cuMemsetD8(c_u64(dev + 20 * MiB), rounds & 0xFF, c_u64(4096)), "memset")
        check(cu.cuEventRecord(event, c_u64(0)), "record")
        check(cu.cuEventQuery(event), "query")
        if rounds == 0:
            say("ready", 1)
        rounds += 1
    rc, back = dtoh(dev + ((rounds - 1) % 5) * n, n)
    say("last_copy", rc == 0 and back == data)
    say("sync", cu.cuCtxSynchronize())


def scenario_migrate():
    """Holds every kind of object a lease can hold (contexts, a module and a library with a function and
    a kernel, a stream, events, a graph and its executable, a pool, allocations from cuMemAlloc, a pool
    and the virtual memory API, a CUDA array), says `ready` and waits for the test to migrate the lease (one line on
    stdin per step: `capture` begins a stream capture and ends it at the next line, `long` launches a
    1.5 s kernel, `memop graph` captures a graph holding a stream write and `memop graph ends` destroys
    it); then checks that
    every address still holds its bytes and every handle still works."""
    ctx = setup()
    own = c_u64()
    check(cu.cuCtxCreate(ctypes.byref(own), None, 0, 0), "context")  # v4: params, flags, device
    check(cu.cuCtxSetCurrent(ctx), "back to the primary context")
    module, library, add, kernel = c_u64(), c_u64(), c_u64(), c_u64()
    check(cu.cuModuleLoadData(ctypes.byref(module), b"// module\n"), "load")
    check(cu.cuModuleGetFunction(ctypes.byref(add), module, b"add_u32"), "function")
    check(cu.cuLibraryLoadData(ctypes.byref(library), b"// lib\n", None, None, 0, None, None, 0), "library")
    check(cu.cuLibraryGetKernel(ctypes.byref(kernel), library, b"fill_u32"), "kernel")
    stream, start, end = c_u64(), c_u64(), c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 0), "stream")
    check(cu.cuEventCreate(ctypes.byref(start), 0), "event")
    check(cu.cuEventCreate(ctypes.byref(end), 0), "event")
    pool, pooled = c_u64(), c_u64()
    check(cu.cuMemPoolCreate(ctypes.byref(pool), ctypes.byref(PoolProps(1, 0, 1, 0))), "pool")
    check(cu.cuMemAllocFromPoolAsync(ctypes.byref(pooled), c_u64(MiB), pool, stream), "pool alloc")
    rc, plain = alloc(3 * MiB)
    check(rc, "alloc")
    prop, vbase, vhandle = AllocationProp(1, 0, 1, 0), c_u64(), c_u64()
    check(
        cu.cuMemAddressReserve(ctypes.byref(vbase), c_u64(4 * MiB), c_u64(0), c_u64(0), c_u64(0)), "reserve"
    )
    check(cu.cuMemCreate(ctypes.byref(vhandle), c_u64(2 * MiB), ctypes.byref(prop), c_u64(0)), "create")
    check(cu.cuMemMap(vbase, c_u64(2 * MiB), c_u64(0), vhandle, c_u64(0)), "map")
    check(cu.cuMemSetAccess(vbase, c_u64(2 * MiB), ctypes.byref(AccessDesc(1, 0, 3)), c_u64(1)), "access")
    regions = {"plain": (plain, 3 * MiB), "pooled": (pooled.value, MiB), "vmm": (vbase.value, 2 * MiB)}
    for i, (ptr, size) in enumerate(regions.values()):  # a different pattern in each
        pattern = bytes((i * 37 + j * 11) % 256 for j in range(251))
        data = (pattern * (size // len(pattern) + 1))[:size]
        check(cu.cuMemcpyHtoD(c_u64(ptr), data, c_u64(size)), "fill")
    before = {name: dtoh(ptr, size)[1] for name, (ptr, size) in regions.items()}
    array = c_u64()  # a CUDA array of 32 rows of 64 floats, filled from the host
    check(cu.cuArrayCreate(ctypes.byref(array), ctypes.byref(ArrayDesc(64, 32, FLOAT, 1))), "array")
    image = (ctypes.c_float * (64 * 32))(*(float(i * 3 % 101) for i in range(64 * 32)))
    to_array = Memcpy2D(srcMemoryType=HOST, srcHost=ctypes.addressof(image), srcPitch=256, dstMemoryType=ARRAY,
                        dstArray=array.value, WidthInBytes=256, Height=32)  # fmt: skip
    check(cu.cuMemcpy2D(ctypes.byref(to_array)), "fill the array")
    # A texture object over the array (kernels hold its value), and a mipmapped array whose level 1 is filled.
    texture, mipmapped, level = c_u64(), c_u64(), c_u64()
    tex_desc = ctypes.create_string_buffer(104)
    check(
        cu.cuTexObjectCreate(ctypes.byref(texture), resource_desc(0, array.value), tex_desc, None), "texture"
    )
    check(cu.cuMipmappedArrayCreate(ctypes.byref(mipmapped), ctypes.byref(Array3DDesc(64, 64, 0, FLOAT, 1, 0)), 3),
          "mipmapped")  # fmt: skip
    check(cu.cuMipmappedArrayGetLevel(ctypes.byref(level), mipmapped, 1), "level")
    to_level = Memcpy2D(srcMemoryType=HOST, srcHost=ctypes.addressof(image), srcPitch=128, dstMemoryType=ARRAY,
                        dstArray=level.value, WidthInBytes=128, Height=32)  # fmt: skip
    check(cu.cuMemcpy2D(ctypes.byref(to_level)), "fill the level")
    counter = c_u64(plain)  # the graph adds 1 to the first 64 words of `plain`, the kernels too
    value, n = ctypes.c_uint32(1), ctypes.c_uint32(64)
    params = (ctypes.c_void_p * 3)(*[ctypes.addressof(x) for x in (counter, value, n)])
    graph, node, exe = c_u64(), c_u64(), c_u64()
    check(cu.cuGraphCreate(ctypes.byref(graph), 0), "graph")
    node_params = KernelNodeParams(add.value, (ctypes.c_uint32 * 6)(1, 1, 1, 64, 1, 1), 0, 0,
                                   ctypes.cast(params, ctypes.c_void_p))  # fmt: skip
    check(
        cu.cuGraphAddKernelNode(ctypes.byref(node), graph, None, c_u64(0), ctypes.byref(node_params)), "node"
    )
    check(cu.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, c_u64(0)), "instantiate")
    check(cu.cuCtxSynchronize(), "sync")
    say("addresses", " ".join(f"{name}={ptr:x}" for name, (ptr, _) in regions.items()))
    say("ready", 1)
    while (line := sys.stdin.readline().strip()) not in ("", "done"):  # the test migrates meanwhile
        if line == "capture":
            check(cu.cuStreamBeginCapture(stream, 2), "begin capture")  # relaxed
            say("capturing", 1)
            sys.stdin.readline()
            captured = c_u64()
            check(cu.cuStreamEndCapture(stream, ctypes.byref(captured)), "end capture")
            check(cu.cuGraphDestroy(captured), "destroy the captured graph")
        if line == "memop graph":  # a graph holding a captured stream write: a node a move does not build
            memop_graph = c_u64()
            check(cu.cuStreamBeginCapture(stream, 2), "begin capture")
            check(
                cu.cuStreamWriteValue32(stream, c_u64(plain + 4096), ctypes.c_uint32(1), 0), "captured write"
            )
            check(cu.cuStreamEndCapture(stream, ctypes.byref(memop_graph)), "end capture")
        if line == "memop graph ends":
            check(cu.cuGraphDestroy(memop_graph), "destroy the graph")
            # the destroy wants no answer: a synchronise makes sure the worker has it before `step` is said
            # (the test's move request comes on another channel)
            check(cu.cuCtxSynchronize(), "sync after the destroy")
        if line == "green":  # a green context of the device's SMs: a partition of this GPU, which stays
            resource, desc, green = DevResource(), c_u64(), c_u64()
            check(cu.cuDeviceGetDevResource(0, ctypes.byref(resource), 1), "device resource")
            check(cu.cuDevResourceGenerateDesc(ctypes.byref(desc), ctypes.byref(resource), 1), "descriptor")
            check(cu.cuGreenCtxCreate(ctypes.byref(green), desc, 0, 1), "green context")
        if line == "long":  # a 1.5 s kernel the worker is inside of when the test asks for the move
            sleep, ms = c_u64(), ctypes.c_uint32(1500)
            check(cu.cuModuleGetFunction(ctypes.byref(sleep), module, b"sleep_ms"), "sleep_ms")
            sleep_params = (ctypes.c_void_p * 1)(ctypes.addressof(ms))
            check(cu.cuLaunchKernel(sleep, 1, 1, 1, 1, 1, 1, 0, stream, sleep_params, None), "long launch")
            time.sleep(0.3)
        say("step", line)
    range_base, range_size = c_u64(), c_u64()
    for name, (ptr, size) in regions.items():
        check(
            cu.cuMemGetAddressRange(ctypes.byref(range_base), ctypes.byref(range_size), c_u64(ptr + 8)), name
        )
        say(f"range_{name}", f"{range_base.value:x}+{range_size.value}")
        say(f"same_{name}", dtoh(ptr, size)[1] == before[name])
    # The memory the program made itself, mapped again from the handle it holds: the same bytes.
    check(cu.cuMemUnmap(vbase, c_u64(2 * MiB)), "unmap to map again")
    check(cu.cuMemMap(vbase, c_u64(2 * MiB), c_u64(0), vhandle, c_u64(0)), "map again")
    check(
        cu.cuMemSetAccess(vbase, c_u64(2 * MiB), ctypes.byref(AccessDesc(1, 0, 3)), c_u64(1)), "access again"
    )
    say("remapped_vmm", dtoh(vbase.value, 2 * MiB)[1] == before["vmm"])
    back = (ctypes.c_float * (64 * 32))()
    from_array = Memcpy2D(srcMemoryType=ARRAY, srcArray=array.value, dstMemoryType=HOST,
                          dstHost=ctypes.addressof(back), dstPitch=256, WidthInBytes=256, Height=32)  # fmt: skip
    check(cu.cuMemcpy2D(ctypes.byref(from_array)), "read the array")
    say("same_array", bytes(back) == bytes(image))
    described = ctypes.create_string_buffer(144)
    check(cu.cuTexObjectGetResourceDesc(described, texture), "texture's resource")
    say("texture_names_array", struct.unpack_from("<Q", described.raw, 8)[0] == array.value)
    texture_after = c_u64()  # made after the move over the array the program holds
    check(cu.cuTexObjectCreate(ctypes.byref(texture_after), resource_desc(0, array.value), tex_desc, None),
          "texture")  # fmt: skip
    check(cu.cuTexObjectGetResourceDesc(described, texture_after), "the later texture's resource")
    say("later_texture_names_array", struct.unpack_from("<Q", described.raw, 8)[0] == array.value)
    level_again, level_back = c_u64(), (ctypes.c_float * (32 * 32))()
    check(cu.cuMipmappedArrayGetLevel(ctypes.byref(level_again), mipmapped, 1), "level again")
    from_level = Memcpy2D(srcMemoryType=ARRAY, srcArray=level.value, dstMemoryType=HOST,
                          dstHost=ctypes.addressof(level_back), dstPitch=128, WidthInBytes=128, Height=32)  # fmt: skip
    check(cu.cuMemcpy2D(ctypes.byref(from_level)), "read the level")
    say("same_level", level_again.value == level.value and bytes(level_back) == bytes(image)[: 128 * 32])
    check(cu.cuEventRecord(start, stream), "record")
    check(cu.cuLaunchKernel(add, 1, 1, 1, 64, 1, 1, 0, stream, params, None), "launch")
    check(cu.cuLaunchKernel(kernel, 1, 1, 1, 64, 1, 1, 0, stream, params, None), "launch a kernel")  # fill 1
    check(cu.cuGraphLaunch(exe, stream), "graph launch")  # 1 + 1
    check(cu.cuEventRecord(end, stream), "record")
    check(cu.cuStreamSynchronize(stream), "stream sync")
    say("counter", struct.unpack("<I", dtoh(plain, 4)[1])[0])
    say("event_query", cu.cuEventQuery(end))
    check(cu.cuCtxSetCurrent(own), "own context")
    rc, later = alloc(MiB)
    say("alloc_after", rc)
    check(cu.cuMemsetD8(c_u64(later), 7, c_u64(MiB)), "memset after")
    say("memset_after", dtoh(later, 4)[1].hex())
    check(cu.cuCtxSetCurrent(ctx), "primary")
    check(cu.cuMemFreeAsync(pooled, stream), "pool free")
    check(cu.cuStreamSynchronize(stream), "stream sync")
    check(cu.cuMemPoolDestroy(pool), "pool destroy")
    check(cu.cuMemUnmap(vbase, c_u64(2 * MiB)), "unmap")
    check(cu.cuMemRelease(vhandle), "release")
    check(cu.cuGraphExecDestroy(exe), "graph exec destroy")
    check(cu.cuTexObjectDestroy(texture_after), "later texture destroy")
    check(cu.cuTexObjectDestroy(texture), "texture destroy")
    check(cu.cuMipmappedArrayDestroy(mipmapped), "mipmapped destroy")
    check(cu.cuArrayDestroy(array), "array destroy")
    check(cu.cuCtxDestroy(own), "context destroy")
    say("finished", 1)


def global_another_worker_places_elsewhere():
    """A module global of 64 bytes, `table`, placed after another module's that is then unloaded: a worker that
    loads the module anew (another GPU's or server's, after a move) places it at another address. (module,
    address, size)."""
    gone, kept, table, size = c_u64(), c_u64(), c_u64(), c_u64()
    check(cu.cuModuleLoadData(ctypes.byref(gone), b".global .align 8 .b8 gone[256];\n\0"), "load gone")
    check(cu.cuModuleGetGlobal(ctypes.byref(table), ctypes.byref(size), gone, b"gone"), "global gone")
    check(cu.cuModuleLoadData(ctypes.byref(kept), b".global .align 8 .b8 table[64];\n\0"), "load kept")
    check(cu.cuModuleGetGlobal(ctypes.byref(table), ctypes.byref(size), kept, b"table"), "global table")
    check(cu.cuModuleUnload(gone), "unload gone")
    return kept, table, size


def scenario_migrate_server():
    """What a move to another server carries (docs/remote.md, Between servers): a context of its own beside the
    primary one, a module and its function, a library and its kernel, a module global whose address it holds,
    a stream, events, allocations big and small with patterns; says
    `ready` and waits for the test (it may move the lease meanwhile). The line `queue` queues asynchronous work
    without waiting for it (a memset, a kernel, an event record) and says `queued` — what the old worker carries
    to the new one if the move comes right after; then every address holds its bytes, the queued work is done,
    and every handle works: a kernel on the stream, events, memory allocated and freed after."""
    ctx = setup()
    own = c_u64()
    check(cu.cuCtxCreate(ctypes.byref(own), None, 0, 0), "context")
    check(cu.cuCtxSetCurrent(ctx), "back to the primary context")
    add = module_function(b"add_u32")
    library, fill = c_u64(), c_u64()  # a library and its kernel, as the CUDA runtime loads a program's code
    check(cu.cuLibraryLoadData(ctypes.byref(library), b"// lib\n", None, None, 0, None, None, 0), "library")
    check(cu.cuLibraryGetKernel(ctypes.byref(fill), library, b"fill_u32"), "kernel")
    stream, start, end = c_u64(), c_u64(), c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 0), "stream")
    check(cu.cuEventCreate(ctypes.byref(start), 0), "event")
    check(cu.cuEventCreate(ctypes.byref(end), 0), "event")
    regions = {}
    for name, size in (("big", 3 * MiB), ("small", 4096), ("tiny", 256)):
        rc, ptr = alloc(size)
        check(rc, f"alloc {name}")
        regions[name] = (ptr, size)
    rc, queued = alloc(4096)
    check(rc, "alloc queued")
    # A module global whose address the program holds, placed after another module's that is then unloaded: the
    # new worker finds it again in the re-created module at another address, with its bytes.
    kept, table, table_size = global_another_worker_places_elsewhere()
    regions["global"] = (table.value, table_size.value)
    for i, (ptr, size) in enumerate(regions.values()):
        pattern = bytes((i * 37 + j * 11) % 256 for j in range(251))
        data = (pattern * (size // len(pattern) + 1))[:size]
        check(cu.cuMemcpyHtoD(c_u64(ptr), data, c_u64(size)), "fill")
    before = {name: dtoh(ptr, size)[1] for name, (ptr, size) in regions.items()}
    # Page-locked (registered) memory copied into asynchronously and a host function: the process's callback
    # connection, which follows it to the new worker.
    landing, ran = ctypes.create_string_buffer(4096), []
    pinned = c_u64(ctypes.addressof(landing))
    check(cu.cuMemHostRegister(pinned, c_u64(4096), 0), "host register")
    host_fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda data: ran.append(data or 0))

    def copy_back_and_call(n: int) -> bool:
        """The big region's first 4 KiB copied into page-locked memory behind the stream, then host function
        `n`: both done at the synchronise, in order."""
        ctypes.memset(pinned.value, 0, 4096)
        check(cu.cuMemcpyDtoHAsync(pinned, c_u64(regions["big"][0]), c_u64(4096), stream), "dtoh async")
        check(cu.cuLaunchHostFunc(stream, host_fn, ctypes.c_void_p(n)), "host function")
        check(cu.cuStreamSynchronize(stream), "sync the copy and the function")
        return ctypes.string_at(pinned.value, 4096) == before["big"][:4096] and ran[-1:] == [n]

    callbacks_before = copy_back_and_call(1)  # said at the end (what comes before `ready` is not read)
    check(cu.cuCtxSynchronize(), "sync")
    say("ready", 1)
    counter = c_u64(queued)
    value, n = ctypes.c_uint32(5), ctypes.c_uint32(16)
    params = (ctypes.c_void_p * 3)(*[ctypes.addressof(x) for x in (counter, value, n)])
    while (line := sys.stdin.readline().strip()) not in ("", "done"):
        if line in ("child", "child_first_env"):
            # A process of the lease that starts now (after a move: on the lease's new worker). `child` inherits
            # this process's environment as it is now (the shim changed it when it moved); `child_first_env` gets
            # the one the program started with, naming the first worker, as a process started by the program's
            # launcher has it.
            first_env = (
                dict(os.environ) if line == "child_first_env" else None
            )  # Python's copy: as it started
            child = subprocess.run([sys.executable, __file__, "migrate_server_child"], capture_output=True, text=True,
                                   timeout=60, env=first_env)  # fmt: skip
            say("child", child.stdout.strip().replace("\n", " ") or child.stderr.strip()[-300:])
        elif line == "sync":  # a call that waits for its answer: after a move, this process reconnects there
            check(cu.cuCtxSynchronize(), "sync")
            say("synced", 1)
        elif line == "queue":  # no call here waits for an answer
            check(cu.cuMemsetD32Async(c_u64(queued), ctypes.c_uint32(7), c_u64(16), stream), "queued memset")
            check(cu.cuLaunchKernel(add, 1, 1, 1, 16, 1, 1, 0, stream, params, None), "queued launch")
            check(cu.cuEventRecord(start, stream), "queued record")
            say("queued", 1)
        else:
            say("step", line)
    for name, (ptr, size) in regions.items():
        say(f"same_{name}", dtoh(ptr, size)[1] == before[name])
    check(cu.cuStreamSynchronize(stream), "stream sync")
    say("queued_words", struct.unpack("<16I", dtoh(queued, 64)[1])[0])
    check(cu.cuLaunchKernel(add, 1, 1, 1, 16, 1, 1, 0, stream, params, None), "launch after")
    check(cu.cuEventRecord(end, stream), "record after")
    check(cu.cuStreamSynchronize(stream), "stream sync after")
    say("counter", struct.unpack("<I", dtoh(queued, 4)[1])[0])
    say("event_query", cu.cuEventQuery(end))
    rc, filled = alloc(64)
    check(rc, "alloc for the library's kernel")
    target, three = c_u64(filled), ctypes.c_uint32(3)
    fill_params = (ctypes.c_void_p * 3)(*[ctypes.addressof(x) for x in (target, three, n)])
    check(cu.cuLaunchKernel(fill, 1, 1, 1, 16, 1, 1, 0, stream, fill_params, None), "the library's kernel")
    check(cu.cuStreamSynchronize(stream), "stream sync")
    say("library_kernel", struct.unpack("<I", dtoh(filled, 4)[1])[0])
    say("callbacks_before", callbacks_before)
    say("callbacks_after", copy_back_and_call(2))
    check(cu.cuLibraryUnload(library), "library unload")
    check(cu.cuCtxSetCurrent(own), "own context")
    rc, later = alloc(MiB)
    say("alloc_after", rc)
    check(cu.cuMemsetD8(c_u64(later), 9, c_u64(MiB)), "memset after")
    say("memset_after", dtoh(later, 4)[1].hex())
    check(cu.cuMemFree(c_u64(later)), "free after")
    check(cu.cuCtxSetCurrent(ctx), "primary")
    global_at = regions.pop("global")[0]  # still the program's to write and read where it is now
    check(cu.cuMemsetD8(c_u64(global_at), 0x5A, c_u64(8)), "memset the global")
    say("global_after", dtoh(global_at, 8)[1].hex())
    check(cu.cuModuleUnload(kept), "unload kept")
    for ptr, _ in regions.values():
        check(cu.cuMemFree(c_u64(ptr)), "free")
    check(cu.cuCtxDestroy(own), "context destroy")
    say("finished", 1)


def scenario_migrate_pool_kept():
    """Memory freed to the device's pool, kept there (until a synchronisation) when the lease moves: says
    `ready`; at each line `alloc`, synchronises and answers `alloc RC` for a cuMemAlloc of 90 % of the partition
    (the pool's kept memory gone at the synchronisation, wherever the lease is now)."""
    setup()
    stream, p, free, total = c_u64(), c_u64(), c_u64(), c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 1), "stream")
    check(cu.cuMemGetInfo(ctypes.byref(free), ctypes.byref(total)), "info")
    check(cu.cuMemAllocAsync(ctypes.byref(p), c_u64(int(0.7 * total.value)), stream), "pool alloc")
    check(cu.cuMemFreeAsync(p, stream), "pool free")
    say("ready", 0)
    while (line := sys.stdin.readline().strip()) not in ("", "done"):
        if line == "alloc":
            check(cu.cuStreamSynchronize(stream), "sync")
            rc, ptr = alloc(int(0.9 * total.value))
            if rc == 0:
                check(cu.cuMemFree(c_u64(ptr)), "free")
            say("alloc", rc)


def scenario_migrate_server_reads():
    """Values just written on a stream, read back through page-locked memory as `.item()` reads a loss (a memset
    of 1 MiB, a copy of it into page-locked memory behind it, a stream synchronise, then its last word read: the
    last to land), 200 times before `ready` and 200 at each line `reads` (the test may move the lease between):
    `stale` counts the reads that found the old value. At the line `big`, 24 MiB of random bytes to the device
    and back: `big True` when they came back the same."""
    setup()
    stream = c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 0), "stream")
    rc, words = alloc(MiB)
    check(rc, "alloc")
    landing = ctypes.create_string_buffer(MiB)
    pinned = c_u64(ctypes.addressof(landing))
    check(cu.cuMemHostRegister(pinned, c_u64(MiB), 0), "host register")
    last = ctypes.c_uint32.from_address(pinned.value + MiB - 4)
    values = iter(range(1, 1 << 31))

    def stale() -> int:
        found = 0
        for _ in range(200):
            i = next(values)
            check(cu.cuMemsetD32Async(c_u64(words), ctypes.c_uint32(i), c_u64(MiB // 4), stream), "memset")
            check(cu.cuMemcpyDtoHAsync(pinned, c_u64(words), c_u64(MiB), stream), "dtoh async")
            check(cu.cuStreamSynchronize(stream), "sync")
            found += last.value != i
        return found

    big = 24 * MiB  # a copy big enough to go in pieces across the copy lanes of an encrypted connection
    rc, far = alloc(big)
    check(rc, "alloc big")

    def round_trip() -> bool:
        data = os.urandom(big)
        check(cu.cuMemcpyHtoD(c_u64(far), data, c_u64(big)), "big copy to the device")
        back = ctypes.create_string_buffer(big)
        check(cu.cuMemcpyDtoH(back, c_u64(far), c_u64(big)), "big copy to the host")
        return back.raw == data

    say("ready", stale() + (not round_trip()))
    while (line := sys.stdin.readline().strip()) not in ("", "done"):
        if line == "big":
            say("big", round_trip())
        else:
            say("stale", stale())


def scenario_migrate_server_graph_global():
    """A module global (placed so that another worker finds it again at another address) that a CUDA graph's memset
    node writes, its copy node reads into an allocation and its kernel node (`add_u32`, given the global's address
    as a parameter) adds 1 to; the graph instantiated. Says `ready` and waits for the test (it may move the lease
    meanwhile); then: the instantiated graph run again (`graph_global`, `graph_out`: the global's and the
    allocation's first words), a graph built now (`new_graph_global`), the kernel launched with the global's
    address (`kernel_global`), a 3D copy from the global (`copy3d_global`), and the copy node's parameters read back naming the global's address the program
    holds (`copy_params_same`)."""
    ctx = setup()
    _, table, _ = global_another_worker_places_elsewhere()
    rc, out = alloc(64)
    check(rc, "alloc")
    add = module_function(b"add_u32")
    keep = []

    def add_params(value):  # add_u32(the global, value, 16 words)
        args = [c_u64(table.value), ctypes.c_uint32(value), ctypes.c_uint32(16)]
        pointers = (ctypes.c_void_p * 3)(*[ctypes.addressof(x) for x in args])
        keep.append((args, pointers))
        return pointers

    def memset(dst, value):  # CUDA_MEMSET_NODE_PARAMS: 4-byte elements, one row of 16
        return ctypes.create_string_buffer(struct.pack("<QQIIQQ", dst, 0, value, 4, 16, 1), 40)

    def graph_of(value):
        graph, m, c, k, exe = c_u64(), c_u64(), c_u64(), c_u64(), c_u64()
        check(cu.cuGraphCreate(ctypes.byref(graph), 0), "graph")
        check(cu.cuGraphAddMemsetNode(ctypes.byref(m), graph, None, c_u64(0), memset(table.value, value), ctx),
              "memset node")  # fmt: skip
        check(cu.cuGraphAddMemcpyNode(ctypes.byref(c), graph, ctypes.byref(m), c_u64(1),
                                      device_copy_3d(table.value, out, 64), ctx), "copy node")  # fmt: skip
        node = KernelNodeParams(add.value, (ctypes.c_uint32 * 6)(1, 1, 1, 16, 1, 1), 0, 0,
                                ctypes.cast(add_params(1), ctypes.c_void_p))  # fmt: skip
        check(cu.cuGraphAddKernelNode(ctypes.byref(k), graph, ctypes.byref(c), c_u64(1), ctypes.byref(node)),
              "kernel node")  # fmt: skip
        check(cu.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, c_u64(0)), "instantiate")
        return graph, c, exe

    def word(address):
        return f"{struct.unpack('<I', dtoh(address, 4)[1])[0]:x}"

    def run(exe):
        check(cu.cuMemsetD8(table, 0, c_u64(64)), "zero the global")
        check(cu.cuMemsetD8(c_u64(out), 0, c_u64(64)), "zero out")
        check(cu.cuGraphLaunch(exe, c_u64(0)), "launch")
        check(cu.cuCtxSynchronize(), "sync")
        return word(table.value), word(out)

    _, c, exe = graph_of(0x5A5A5A5A)
    say("ready", run(exe) == ("5a5a5a5b", "5a5a5a5a"))
    while (line := sys.stdin.readline().strip()) not in ("", "done"):
        say("step", line)
    graph_global, graph_out = run(exe)
    say("graph_global", graph_global)
    say("graph_out", graph_out)
    _, _, fresh = graph_of(0x3C3C3C3C)
    say("new_graph_global", run(fresh)[0])
    check(cu.cuMemsetD8(table, 0, c_u64(64)), "zero the global")
    check(cu.cuLaunchKernel(add, 1, 1, 1, 16, 1, 1, 0, None, add_params(2), None), "launch with the global")
    check(cu.cuLaunchKernel(add, 1, 1, 1, 16, 1, 1, 0, None, add_params(3), None), "again (served in C)")
    check(cu.cuCtxSynchronize(), "sync")
    say("kernel_global", word(table.value))
    check(cu.cuMemsetD8(c_u64(out), 0, c_u64(64)), "zero out")
    check(cu.cuMemcpy3D(device_copy_3d(table.value, out, 64)), "a 3D copy from the global")
    say("copy3d_global", word(out))
    got = (ctypes.c_uint8 * 200)()
    check(cu.cuGraphMemcpyNodeGetParams(c, got), "copy node params")
    say("copy_params_same", bytes(got)[32:56] == bytes(device_copy_3d(table.value, out, 64))[32:56])


def scenario_migrate_server_arrays():
    """What a move to another server carries beside the memory of the windows: a CUDA array with contents, a
    mipmapped array (in a context of the program's own) whose level 1 is filled, a texture object over the array and
    a surface object over another, the program's own virtual memory with patterns (an allocation it holds, mapped in
    two halves of which it unmaps one, one it released whose mapping keeps it, one mapped whole) and a tensor map over
    it. Says
    `ready` and waits for the test (it may move the lease meanwhile; `retain` takes another reference to the held
    memory, `let go` releases it); then every byte is the same and every handle
    works: the array and the level copied out, the texture and the surface each answering with its own array, a
    texture made after; the mapping written and read, the unmapped half mapped again from the handle, the tensor map
    re-pointed, and all of it unmapped and released."""
    ctx = setup()
    own = c_u64()
    check(cu.cuCtxCreate(ctypes.byref(own), None, 0, 0), "context")
    check(cu.cuCtxSetCurrent(ctx), "back to the primary context")
    array, canvas, texture, surface = c_u64(), c_u64(), c_u64(), c_u64()
    check(cu.cuArrayCreate(ctypes.byref(array), ctypes.byref(ArrayDesc(64, 32, FLOAT, 1))), "array")
    check(
        cu.cuArrayCreate(ctypes.byref(canvas), ctypes.byref(ArrayDesc(16, 16, FLOAT, 1))),
        "the surface's array",
    )
    image = (ctypes.c_float * (64 * 32))(*(float(i * 3 % 101) for i in range(64 * 32)))
    check(array_filled(array.value, image, 256, 32), "fill the array")
    tex_desc = ctypes.create_string_buffer(104)
    check(
        cu.cuTexObjectCreate(ctypes.byref(texture), resource_desc(0, array.value), tex_desc, None), "texture"
    )
    check(cu.cuSurfObjectCreate(ctypes.byref(surface), resource_desc(0, canvas.value)), "surface")
    check(cu.cuCtxSetCurrent(own), "own context")
    mipmapped, level = c_u64(), c_u64()
    check(cu.cuMipmappedArrayCreate(ctypes.byref(mipmapped), ctypes.byref(Array3DDesc(64, 64, 0, FLOAT, 1, 0)), 3),
          "mipmapped")  # fmt: skip
    check(cu.cuMipmappedArrayGetLevel(ctypes.byref(level), mipmapped, 1), "level")
    check(array_filled(level.value, image, 128, 32), "fill the level")
    check(cu.cuCtxSetCurrent(ctx), "primary")
    prop, vbase, held, released, whole = AllocationProp(1, 0, 1, 0), c_u64(), c_u64(), c_u64(), c_u64()
    check(
        cu.cuMemAddressReserve(ctypes.byref(vbase), c_u64(8 * MiB), c_u64(0), c_u64(0), c_u64(0)), "reserve"
    )
    for handle, size in ((held, 4 * MiB), (released, 4 * MiB), (whole, 2 * MiB)):
        check(cu.cuMemCreate(ctypes.byref(handle), c_u64(size), ctypes.byref(prop), c_u64(0)), "create")
    halves = {"low": (vbase.value, 0, held), "high": (vbase.value + 2 * MiB, 2 * MiB, held),
              "kept": (vbase.value + 4 * MiB, 2 * MiB, released), "whole": (vbase.value + 6 * MiB, 0, whole)}  # fmt: skip
    patterns = {}
    for i, (name, (at, offset, handle)) in enumerate(halves.items()):
        check(cu.cuMemMap(c_u64(at), c_u64(2 * MiB), c_u64(offset), handle, c_u64(0)), f"map {name}")
        check(
            cu.cuMemSetAccess(c_u64(at), c_u64(2 * MiB), ctypes.byref(AccessDesc(1, 0, 3)), c_u64(1)),
            "access",
        )
        pattern = bytes((i * 53 + j * 7) % 256 for j in range(241))
        patterns[name] = (pattern * (2 * MiB // len(pattern) + 1))[: 2 * MiB]
        check(cu.cuMemcpyHtoD(c_u64(at), patterns[name], c_u64(2 * MiB)), f"fill {name}")
    check(cu.cuMemUnmap(c_u64(halves["high"][0]), c_u64(2 * MiB)), "unmap the high half")
    check(cu.cuMemRelease(released), "release: its mapping keeps it")
    # A tensor map over the low half (128 rows of 256 floats), pointed 4 KiB further in after it was encoded.
    tensor_map = ctypes.create_string_buffer(128)
    dims, strides = (c_u64 * 2)(256, 128), (c_u64 * 1)(1024)
    box, element = (ctypes.c_uint32 * 2)(64, 32), (ctypes.c_uint32 * 2)(1, 1)
    check(
        cu.cuTensorMapEncodeTiled(tensor_map, 7, 2, vbase, dims, strides, box, element, 0, 0, 0, 0),
        "tensor map",
    )
    check(cu.cuTensorMapReplaceAddress(tensor_map, c_u64(vbase.value + 4096)), "tensor map re-pointed")
    check(cu.cuCtxSynchronize(), "sync")
    say("handles", f"texture={texture.value} surface={surface.value}")
    say("ready", 1)
    again = c_u64()
    while (line := sys.stdin.readline().strip()) not in ("", "done"):
        if line == "retain":  # another reference to the held memory (what a move to another server refuses)
            check(cu.cuMemRetainAllocationHandle(ctypes.byref(again), vbase), "retain")
        elif line == "let go":
            check(cu.cuMemRelease(again), "release the retained reference")
        say("step", line)
    say("same_low", dtoh(halves["low"][0], 2 * MiB)[1] == patterns["low"])
    say("same_kept", dtoh(halves["kept"][0], 2 * MiB)[1] == patterns["kept"])
    say("same_whole", dtoh(halves["whole"][0], 2 * MiB)[1] == patterns["whole"])
    high = halves["high"][0]  # mapped again from the handle the program holds: the bytes it had
    check(cu.cuMemMap(c_u64(high), c_u64(2 * MiB), c_u64(2 * MiB), held, c_u64(0)), "map the high half again")
    check(
        cu.cuMemSetAccess(c_u64(high), c_u64(2 * MiB), ctypes.byref(AccessDesc(1, 0, 3)), c_u64(1)), "access"
    )
    say("same_high", dtoh(high, 2 * MiB)[1] == patterns["high"])
    # The map the program holds is one the lease's new worker knows: it re-points it again.
    say("tensor_map_again", cu.cuTensorMapReplaceAddress(tensor_map, c_u64(vbase.value + 8192)))
    check(cu.cuMemsetD8(c_u64(vbase.value + 4096), 0x3C, c_u64(16)), "write the mapping")
    say("vm_written", dtoh(vbase.value + 4096, 4)[1].hex())
    say("same_array", array_bytes(array.value, 256, 32) == bytes(image))
    say("same_texture_array", resource_array(cu.cuTexObjectGetResourceDesc, texture) == array.value)
    say("same_surface_array", resource_array(cu.cuSurfObjectGetResourceDesc, surface) == canvas.value)
    texture_after = c_u64()
    check(cu.cuTexObjectCreate(ctypes.byref(texture_after), resource_desc(0, array.value), tex_desc, None),
          "a texture after")  # fmt: skip
    say("texture_after_distinct", texture_after.value not in (texture.value, surface.value))
    check(cu.cuCtxSetCurrent(own), "own context")
    say("same_level", array_bytes(level.value, 128, 32) == bytes(image)[: 128 * 32])
    check(cu.cuMipmappedArrayDestroy(mipmapped), "mipmapped destroy")
    check(cu.cuCtxSetCurrent(ctx), "primary")
    for done in (texture_after, texture):
        check(cu.cuTexObjectDestroy(done), "texture destroy")
    check(cu.cuSurfObjectDestroy(surface), "surface destroy")
    check(cu.cuArrayDestroy(array), "array destroy")
    check(cu.cuArrayDestroy(canvas), "the surface's array destroy")
    check(cu.cuMemUnmap(vbase, c_u64(4 * MiB)), "unmap the held allocation")
    check(cu.cuMemUnmap(c_u64(halves["kept"][0]), c_u64(4 * MiB)), "unmap the released one and the whole one")
    check(cu.cuMemRelease(held), "release")
    check(cu.cuMemRelease(whole), "release the whole one")
    check(cu.cuMemAddressFree(vbase, c_u64(8 * MiB)), "address free")
    check(cu.cuCtxDestroy(own), "context destroy")
    say("finished", 1)


def scenario_migrate_server_child():
    """A child process of scenario_migrate_server: memory of its own, written and read back."""
    setup()
    rc, ptr = alloc(MiB)
    check(rc, "child alloc")
    check(cu.cuMemsetD8(c_u64(ptr), 0x2A, c_u64(MiB)), "child memset")
    say("child_bytes", dtoh(ptr, 4)[1].hex())


def scenario_migrate_primary():
    """Holds two references to device 0's primary context (with flags set, a stream and memory in it), says
    `ready` and waits for the test (it may move the lease meanwhile); then lets go of them one by one, saying
    what cuDevicePrimaryCtxGetState answers each time and whether the context still works before the last."""
    setup()
    again = c_u64()
    check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(again), 0), "retain again")
    check(cu.cuDevicePrimaryCtxSetFlags(0, 4), "flags")  # CU_CTX_SCHED_BLOCKING_SYNC
    stream = c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 0), "stream")
    rc, buf = alloc(MiB)
    check(rc, "alloc")
    flags, active = ctypes.c_uint(), ctypes.c_int()

    def state() -> str:
        check(cu.cuDevicePrimaryCtxGetState(0, ctypes.byref(flags), ctypes.byref(active)), "state")
        return f"{flags.value}/{active.value}"

    say("state_before", state())
    say("ready", 1)
    while sys.stdin.readline().strip() not in ("", "done"):  # the test migrates meanwhile
        say("step", 1)
    say("state_after", state())
    check(cu.cuDevicePrimaryCtxRelease(0), "release")
    say("state_one_released", state())
    check(cu.cuMemsetD8Async(c_u64(buf), 5, c_u64(MiB), stream), "memset in the context still held")
    check(cu.cuStreamSynchronize(stream), "stream sync")
    say("works_one_released", dtoh(buf, 4)[1].hex())
    check(cu.cuDevicePrimaryCtxRelease(0), "release")
    say("state_all_released", state())
    say("finished", 1)


def scenario_migrate_events():
    """Says `ready`, makes two events and as many more as the test's line `events N` asks (the last calls
    before it waits: the worker's native loop makes them), says `made` and waits for the test (it may move
    the lease meanwhile); then records, waits for and times two, and makes and destroys one more."""
    setup()
    stream, start, end = c_u64(), c_u64(), c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 1), "stream")
    say("ready", 1)
    extra = [c_u64() for _ in range(int(sys.stdin.readline().split()[-1]))]  # "events N": N more events
    for event in (start, end, *extra):
        check(cu.cuEventCreate(ctypes.byref(event), 0), "create")
    say("made", len(extra) + 2)
    while sys.stdin.readline().strip() not in ("", "done"):  # the test migrates meanwhile
        say("step", 1)
    ms = ctypes.c_float(-1)
    recorded = [cu.cuEventRecord(start, stream), cu.cuEventRecord(end, stream), cu.cuEventSynchronize(end)]
    recorded.append(cu.cuEventElapsedTime(ctypes.byref(ms), start, end))
    say("recorded", ",".join(map(str, recorded)))
    say("destroyed", f"{cu.cuEventDestroy(start)},{cu.cuEventDestroy(end)}")
    check(cu.cuEventCreate(ctypes.byref(start), 0), "create after")
    after = (cu.cuEventRecord(start, stream), cu.cuEventSynchronize(start), cu.cuEventDestroy(start))
    say("after", ",".join(map(str, after)))
    say("finished", 1)


def scenario_migrate_graphs(host: bool = True):
    """Holds graphs a move must build again on the target: one built node by node (memset, kernel, copy,
    child graph, event record, host and empty nodes), instantiated twice (the first instantiated graph's
    kernel node set anew, then the graph's own; a copy node switched off in the second), and one captured
    from a stream (a memset, a CUkernel's and a function's launches, a copy, a host function) and destroyed once
    instantiated, as PyTorch does (without `host`: no host node, no host function). Runs every instantiated
    graph, and the graph instantiated once more; says `ready` and waits for the test to migrate the lease (one
    line on stdin per move, `done` at the end); then runs them again, and the graph instantiated anew, and
    says whether each left the same bytes at the same addresses, and whether the graph calls still answer
    for the handles it holds (a kernel node's function and launch attribute, an event node's event)."""
    setup()
    by = ctypes.byref
    module, library, add, fill = c_u64(), c_u64(), c_u64(), c_u64()
    check(cu.cuModuleLoadData(by(module), b"// module\n"), "load")
    check(cu.cuModuleGetFunction(by(add), module, b"add_u32"), "function")
    check(cu.cuLibraryLoadData(by(library), b"// lib\n", None, None, 0, None, None, 0), "library")
    check(cu.cuLibraryGetKernel(by(fill), library, b"fill_u32"), "kernel")
    stream, event = c_u64(), c_u64()
    check(cu.cuStreamCreate(by(stream), 0), "stream")
    check(cu.cuEventCreate(by(event), 0), "event")
    rc, buf = alloc(4096)
    check(rc, "alloc")
    keep = []

    def args(at, value):
        values = [c_u64(buf + at), ctypes.c_uint32(value), ctypes.c_uint32(16)]
        pointers = (ctypes.c_void_p * 3)(*[ctypes.addressof(x) for x in values])
        keep.append((values, pointers))
        return pointers

    def kernel(func, at, value):
        return KernelNodeParams(func.value, (ctypes.c_uint32 * 6)(1, 1, 1, 16, 1, 1), 0, 0,
                                ctypes.cast(args(at, value), ctypes.c_void_p))  # fmt: skip

    graph, child, ms, k, cp, ch, ev, empty, inner = (c_u64() for _ in range(9))
    check(cu.cuGraphCreate(by(graph), 0), "graph")
    check(cu.cuGraphCreate(by(child), 0), "child graph")
    check(
        cu.cuGraphAddKernelNode(by(inner), child, None, c_u64(0), by(kernel(add, 64, 10))), "child's kernel"
    )
    check(cu.cuGraphAddMemsetNode(by(ms), graph, None, c_u64(0), memset_node(buf, 2, 64), c_u64(0)), "memset")
    check(cu.cuGraphAddKernelNode(by(k), graph, by(ms), c_u64(1), by(kernel(add, 0, 1))), "kernel node")
    check(
        cu.cuGraphAddMemcpyNode(by(cp), graph, by(k), c_u64(1), memcpy3d(buf, buf + 64, 64), c_u64(0)), "copy"
    )
    check(cu.cuGraphAddChildGraphNode(by(ch), graph, by(cp), c_u64(1), child), "child node")
    check(cu.cuGraphAddEventRecordNode(by(ev), graph, by(ch), c_u64(1), event), "event record node")
    check(cu.cuGraphAddEmptyNode(by(empty), graph, None, c_u64(0)), "empty node")
    ran = []  # what the host node and the captured host function were given, as they ran
    recorder = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(ran.append)
    host_node = c_u64()
    host_params = (ctypes.c_void_p * 2)(ctypes.cast(recorder, ctypes.c_void_p), 5)
    if host:
        check(cu.cuGraphAddHostNode(by(host_node), graph, by(ev), c_u64(1), host_params), "host node")
    priority = (ctypes.c_uint8 * 64)(3)  # CU_LAUNCH_ATTRIBUTE_PRIORITY 3
    check(cu.cuGraphKernelNodeSetAttribute(k, 8, priority), "a kernel node's attribute")
    first, second, captured_exec = c_u64(), c_u64(), c_u64()
    check(cu.cuGraphInstantiateWithFlags(by(first), graph, c_u64(0)), "instantiate")
    check(cu.cuGraphExecKernelNodeSetParams(first, k, by(kernel(add, 0, 3))), "the instantiated graph's node")
    check(cu.cuGraphKernelNodeSetParams(k, by(kernel(add, 0, 100))), "the graph's node")
    check(cu.cuGraphInstantiateWithFlags(by(second), graph, c_u64(0)), "instantiate again")
    check(cu.cuGraphNodeSetEnabled(second, cp, 0), "the copy off")
    captured = c_u64()
    check(cu.cuStreamBeginCapture(stream, 2), "begin capture")  # relaxed
    check(cu.cuMemsetD32Async(c_u64(buf + 256), ctypes.c_uint32(5), c_u64(16), stream), "captured memset")
    check(cu.cuLaunchKernel(fill, 1, 1, 1, 16, 1, 1, 0, stream, args(320, 9), None), "captured kernel")
    check(cu.cuLaunchKernel(add, 1, 1, 1, 16, 1, 1, 0, stream, args(256, 4), None), "captured function")
    check(cu.cuMemcpyDtoDAsync(c_u64(buf + 384), c_u64(buf + 256), c_u64(64), stream), "captured copy")
    if host:
        check(cu.cuLaunchHostFunc(stream, recorder, ctypes.c_void_p(6)), "captured host function")
    check(cu.cuStreamEndCapture(stream, by(captured)), "end capture")
    check(cu.cuGraphInstantiateWithFlags(by(captured_exec), captured, c_u64(0)), "instantiate the capture")
    check(cu.cuGraphDestroy(captured), "the captured graph destroyed")

    def run_all(*execs):
        """What each instantiated graph leaves in the buffer, run from zeros."""
        found = []
        for exe in execs:
            check(cu.cuMemsetD8(c_u64(buf), 0, c_u64(512)), "zeros")
            check(cu.cuGraphLaunch(exe, stream), "graph launch")
            check(cu.cuStreamSynchronize(stream), "sync")
            found.append(dtoh(buf, 512)[1])
        return found

    def instantiated_anew():
        """What the graph, instantiated now, leaves in the buffer."""
        fresh = c_u64()
        check(cu.cuGraphInstantiateWithFlags(by(fresh), graph, c_u64(0)), "instantiate anew")
        (found,) = run_all(fresh)
        check(cu.cuGraphExecDestroy(fresh), "graph exec destroy")
        return found

    before = run_all(first, second, captured_exec)
    say("distinct", len(set(before)) == 3)  # each instantiated graph does something of its own
    anew = instantiated_anew()
    host_calls = list(ran)
    say("ready", 1)
    while sys.stdin.readline().strip() not in ("", "done"):  # the test migrates meanwhile
        check(cu.cuStreamSynchronize(stream), "a call (after a move to another server: made there)")
        say("step", 1)
    del ran[:]
    after = run_all(first, second, captured_exec)
    say("same_instantiated_anew", instantiated_anew() == anew)
    if host:
        say("same_host_calls", ran == host_calls == [5, 5, 6, 5])
    for name, was, now in zip(("first", "second", "captured"), before, after, strict=True):
        say(f"same_{name}", was == now)
    count, nodes = c_u64(8), (c_u64 * 8)()
    check(cu.cuGraphGetNodes(graph, nodes, by(count)), "the graph's nodes")
    held = (ms, k, cp, ch, ev, empty, *([host_node] if host else []))
    say("same_nodes", sorted(nodes[: count.value]) == sorted(n.value for n in held))
    got = KernelNodeParams()
    check(cu.cuGraphKernelNodeGetParams(k, by(got)), "the kernel node's parameters")
    say("node_function", got.func == add.value)
    attribute = (ctypes.c_uint8 * 64)()
    check(cu.cuGraphKernelNodeGetAttribute(k, 8, attribute), "the kernel node's attribute")
    say("node_attribute", bytes(attribute) == bytes(priority))
    kind, recorded = ctypes.c_int(-1), c_u64()
    check(cu.cuGraphNodeGetType(ev, by(kind)), "a node's type")
    check(cu.cuGraphEventRecordNodeGetEvent(ev, by(recorded)), "the event node's event")
    say("event_node", kind.value == 7 and recorded.value == event.value)
    check(cu.cuGraphExecKernelNodeSetParams(first, k, by(kernel(add, 0, 7))), "set anew after the move")
    check(cu.cuMemsetD8(c_u64(buf), 0, c_u64(512)), "zeros")
    check(cu.cuGraphLaunch(first, stream), "graph launch")
    check(cu.cuStreamSynchronize(stream), "sync")
    say("set_after", dtoh(buf, 4)[1].hex())
    for exe in (first, second, captured_exec):
        check(cu.cuGraphExecDestroy(exe), "graph exec destroy")
    check(cu.cuGraphDestroy(graph), "graph destroy")
    check(cu.cuGraphDestroy(child), "child graph destroy")
    say("finished", 1)


def scenario_migrate_graphs_server():
    """scenario_migrate_graphs without host nodes and host functions (the program's functions, called back
    through the worker's connection to it: a move to another server does not carry them)."""
    scenario_migrate_graphs(host=False)


class DevResource(ctypes.Structure):  # CUdevResource (RESOURCE_ABI_VERSION 1): type, padding, SM fields
    _fields_ = [
        ("type", ctypes.c_int),
        ("padding", ctypes.c_ubyte * 92),
        ("sm_count", ctypes.c_uint),
        ("min_partition", ctypes.c_uint),
        ("alignment", ctypes.c_uint),
        ("rest", ctypes.c_ubyte * 36),
    ]


def scenario_green():
    """Green contexts: the device's SMs (the lease's share), a split, a green context, a stream, an event and
    a launch in it; forged resources and foreign green contexts refused; the share never exceeded."""
    ctx = setup()
    sm, by = 1, ctypes.byref  # CU_DEV_RESOURCE_TYPE_SM
    device, of_ctx = DevResource(), DevResource()
    check(cu.cuDeviceGetDevResource(0, by(device), sm), "device resource")
    check(cu.cuCtxGetDevResource(ctx, by(of_ctx), sm), "context resource")
    say("device_sms", device.sm_count)
    say("context_sms", of_ctx.sm_count)
    say("wrong_type", cu.cuDeviceGetDevResource(0, by(DevResource()), 2))
    affinity = (ctypes.c_int * 2)()  # CUexecAffinityParam: type, SM count
    check(cu.cuCtxGetExecAffinity(affinity, 0), "affinity")  # CU_EXEC_AFFINITY_TYPE_SM_COUNT
    say("affinity_sms", affinity[1])
    say("affinity_wrong_type", cu.cuCtxGetExecAffinity(affinity, 1))
    possible = ctypes.c_uint(0)
    check(cu.cuDevSmResourceSplitByCount(None, by(possible), by(device), None, 0, 1), "count groups")
    say("groups_possible", possible.value)
    groups, n, rest = (DevResource * 2)(), ctypes.c_uint(2), DevResource()
    check(cu.cuDevSmResourceSplitByCount(groups, by(n), by(device), by(rest), 0, 1), "split")
    say("groups", n.value)
    say("group_sms", groups[0].sm_count)
    say("rest_sms", rest.sm_count)
    one = ctypes.c_uint(1)
    beyond = cu.cuDevSmResourceSplitByCount(groups, by(one), by(device), None, 0, device.sm_count + 1)
    say("split_beyond_share", beyond)
    structured = Driver(13010).cuDevSmResourceSplit  # CUDA 13.1, as cuda.bindings asks for it

    def split_by(counts, result=True):  # CU_DEV_SM_RESOURCE_GROUP_PARAMS: smCount first, the rest 0
        params = ((ctypes.c_uint * 16) * len(counts))()
        for i, count in enumerate(counts):
            params[i][0] = count
        made, left = (DevResource * len(counts))(), DevResource()
        rc = structured(made if result else None, len(counts), by(device), by(left), 0, params)
        return rc, [p[0] for p in params], [g.sm_count for g in made] if result else None, left.sm_count

    say("structured_split", split_by([2, 0]))  # two SMs, then whatever is left (discovered)
    say("structured_discovery", split_by([0], result=False))
    say("structured_beyond_share", split_by([device.sm_count + 2])[0])
    say("structured_odd", split_by([1])[0])
    forged = DevResource.from_buffer_copy(bytes(device))
    forged.padding[0] ^= 0x5A  # another id than the worker gave: no resource of this lease
    forged.sm_count = 1000
    say("forged_split", cu.cuDevSmResourceSplitByCount(groups, by(one), by(forged), None, 0, 1))
    desc = c_u64()
    say("forged_desc", cu.cuDevResourceGenerateDesc(by(desc), by(forged), 1))
    both = (DevResource * 2)(device, groups[0])  # the whole share and a part of it again: more SMs than it
    say("desc_beyond_share", cu.cuDevResourceGenerateDesc(by(desc), both, 2))
    check(cu.cuDevResourceGenerateDesc(by(desc), groups, 1), "descriptor")
    green = c_u64()
    check(cu.cuGreenCtxCreate(by(green), desc, 0, 1), "green context")  # CU_GREEN_CTX_DEFAULT_STREAM
    of_green, green_ctx_res = DevResource(), DevResource()
    check(cu.cuGreenCtxGetDevResource(green, by(of_green), sm), "green context's resource")
    say("green_sms", of_green.sm_count)
    green_ctx = c_u64()
    check(cu.cuCtxFromGreenCtx(by(green_ctx), green), "its context")
    check(cu.cuCtxGetDevResource(green_ctx, by(green_ctx_res), sm), "its context's resource")
    say("green_ctx_sms", green_ctx_res.sm_count)
    green_id = c_u64()
    say("green_id", cu13.cuGreenCtxGetId(green, by(green_id)))
    stream, back = c_u64(), c_u64()
    check(cu.cuGreenCtxStreamCreate(by(stream), green, 1, 0), "stream in it")  # CU_STREAM_NON_BLOCKING
    check(cu.cuStreamGetGreenCtx(stream, by(back)), "stream's green context")
    say("stream_green_same", back.value == green.value)
    of_stream, of_plain_stream, of_null_stream, plain = DevResource(), DevResource(), DevResource(), c_u64()
    stream_resource = Driver(13010).cuStreamGetDevResource  # CUDA 13.1, as cuda.bindings asks for it
    check(stream_resource(stream, by(of_stream), sm), "the green stream's resource")
    check(cu.cuStreamCreate(by(plain), 1), "a stream of the primary context")
    check(stream_resource(plain, by(of_plain_stream), sm), "the plain stream's resource")
    check(stream_resource(c_u64(0), by(of_null_stream), sm), "the NULL stream's resource")
    say("stream_sms", (of_stream.sm_count, of_plain_stream.sm_count, of_null_stream.sm_count))
    say(
        "stream_wrong_type", stream_resource(stream, by(DevResource()), 1000)
    )  # CU_DEV_RESOURCE_TYPE_WORKQUEUE
    say("foreign_stream", stream_resource(c_u64(plain.value ^ 0x5A00), by(DevResource()), sm))
    check(cu.cuCtxSetCurrent(green_ctx), "green context current")
    dev = ctypes.c_int(-1)
    check(cu.cuCtxGetDevice(by(dev)), "its device")
    say("green_ctx_device", dev.value)
    check(cu.cuCtxGetExecAffinity(affinity, 0), "the green context's affinity")
    say("green_affinity_sms", affinity[1])
    module, fill = c_u64(), c_u64()
    check(cu.cuModuleLoadData(by(module), b"// host-executor module\n.visible .entry fill_u32()\n"), "load")
    check(cu.cuModuleGetFunction(by(fill), module, b"fill_u32"), "function")
    rc, buf = alloc(4096)
    check(rc, "alloc in the green context")
    ptr, value, count = c_u64(buf), ctypes.c_uint32(9), ctypes.c_uint32(64)
    params = (ctypes.c_void_p * 3)(ctypes.addressof(ptr), ctypes.addressof(value), ctypes.addressof(count))
    check(cu.cuLaunchKernel(fill, 1, 1, 1, 64, 1, 1, 0, stream, params, None), "launch in it")
    event = c_u64()
    check(cu.cuEventCreate(by(event), 0), "event")
    check(cu.cuGreenCtxRecordEvent(green, event), "record")
    check(cu.cuGreenCtxWaitEvent(green, event), "wait")
    check(cu.cuEventSynchronize(event), "event sync")
    check(cu.cuStreamSynchronize(stream), "stream sync")
    say("launched", struct.unpack("<I", dtoh(buf, 4)[1])[0])
    foreign, other = c_u64(green.value ^ 0x5A00), c_u64()
    say("foreign_green_stream", cu.cuGreenCtxStreamCreate(by(other), foreign, 1, 0))
    say("foreign_green_record", cu.cuGreenCtxRecordEvent(foreign, event))
    say("foreign_green_destroy", cu.cuGreenCtxDestroy(foreign))
    supported = ctypes.c_int(-1)
    check(cu.cuDeviceGetExecAffinitySupport(by(supported), 0, 0), "affinity support")
    say("affinity_supported", supported.value)
    check(cu.cuCtxSetCurrent(ctx), "primary again")
    check(cu.cuStreamDestroy(stream), "stream destroy")
    check(cu.cuGreenCtxDestroy(green), "green destroy")
    say("destroyed_twice", cu.cuGreenCtxDestroy(green))
    say("finished", 1)


def scenario_recapture():
    """A stream captured into a graph (a fill kernel, a 32-bit memset), then recaptured into the same graph
    with other values (cuStreamBeginRecaptureToGraph, CUDA 13.3): the program's callback is asked about
    each changed node with both nodes' parameters as the driver gives them, and the graph runs the new
    values; a recapture with no callback takes them; a callback that refuses, or work that is not the
    graph's next node, fails the recapture."""
    setup()
    cu133 = Driver(13030)
    fill = module_function(b"fill_u32")
    rc, dev = alloc(256)
    check(rc, "alloc")
    stream, graph, exe, captured = c_u64(), c_u64(), c_u64(), c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 1), "stream")

    def record(value, word):
        args = [c_u64(dev), ctypes.c_uint32(value), ctypes.c_uint32(32)]
        pointers = (ctypes.c_void_p * 3)(*[ctypes.addressof(x) for x in args])
        launched = cu.cuLaunchKernel(fill, 1, 1, 1, 32, 1, 1, 0, stream, pointers, None)
        return launched or cu.cuMemsetD32Async(c_u64(dev + 128), word, c_u64(32), stream)

    def run():
        check(cu.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, c_u64(0)), "instantiate")
        check(cu.cuGraphLaunch(exe, stream), "launch graph")
        check(cu.cuStreamSynchronize(stream), "sync")
        check(cu.cuGraphExecDestroy(exe), "exec destroy")
        raw = dtoh(dev, 256)[1]
        return struct.unpack_from("<I", raw, 0)[0], struct.unpack_from("<I", raw, 128)[0]

    asked = []
    callback_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, c_u64, ctypes.c_void_p, ctypes.c_void_p,
                                     ctypes.c_int)  # fmt: skip

    def side(params):
        kind = struct.unpack("<i", ctypes.string_at(params, 4))[0]
        if kind == 0:  # a kernel node: its value argument through kernelParams
            pointers = ctypes.c_void_p.from_address(params + 16 + 40).value
            value_at = ctypes.c_void_p.from_address(pointers + 8).value
            return f"kernel:{ctypes.c_uint32.from_address(value_at).value}"
        value_at = params + 16 + 16  # CUDA_MEMSET_NODE_PARAMS' value
        return f"memset:{ctypes.c_uint32.from_address(value_at).value}"

    def on_change(data, node, original, recaptured, status):
        asked.append(f"{side(original)}>{side(recaptured)}:{status}")
        return data or 0  # the answer is the user data: 0 takes the change, anything else refuses it

    keep = callback_type(on_change)
    check(cu.cuStreamBeginCapture(stream, 2), "begin capture")  # relaxed
    check(record(7, 5), "captured")
    check(cu.cuStreamEndCapture(stream, ctypes.byref(graph)), "end capture")
    say("captured", run())
    say("begin", cu133.cuStreamBeginRecaptureToGraph(stream, 2, graph, keep, None))
    check(record(9, 6), "recaptured")
    say("end", cu.cuStreamEndCapture(stream, ctypes.byref(captured)))
    say("same_graph", captured.value == graph.value)
    say("asked", ",".join(asked))
    say("recaptured", run())
    say("no_callback", cu133.cuStreamBeginRecaptureToGraph(stream, 2, graph, None, None))
    check(record(11, 8), "recaptured without a callback")
    check(cu.cuStreamEndCapture(stream, ctypes.byref(captured)), "end")
    say("taken", run())
    check(cu133.cuStreamBeginRecaptureToGraph(stream, 2, graph, keep, ctypes.c_void_p(1)), "begin refusing")
    record(12, 9)
    say("refused", cu.cuStreamEndCapture(stream, ctypes.byref(captured)))
    cu.cuStreamSynchronize(stream)  # the launch that failed was sent without waiting: its error, once
    check(cu133.cuStreamBeginRecaptureToGraph(stream, 2, graph, keep, None), "begin other topology")
    cu.cuMemsetD32Async(c_u64(dev + 128), 1, c_u64(32), stream)  # not the graph's first node, a kernel
    say("other_topology", cu.cuStreamEndCapture(stream, ctypes.byref(captured)))
    cu.cuStreamSynchronize(stream)
    say("finished", 1)


def scenario_overlapping_async_copies():
    """Copies of different sizes into one page-locked buffer, one after the other on one stream, with no
    synchronise between: the later one's bytes stay where both wrote, as natively — also where large
    copies come back in pieces on several connections at once, cut at different places."""
    setup()
    stream = c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 1), "stream")
    sizes = (8 * MiB + 7, 3 * MiB + 1, 5 * MiB + 3)  # pieces cut at different offsets in each
    sources = []
    for size in sizes:
        rc, dev = alloc(size)
        check(rc, "alloc")
        data = os.urandom(size)
        check(cu.cuMemcpyHtoD(c_u64(dev), data, c_u64(size)), "htod")
        sources.append((dev, size, data))
    target = c_u64()
    check(cu.cuMemAllocHost(ctypes.byref(target), c_u64(max(sizes))), "pinned")
    wrong = 0
    for _ in range(48):
        expected = bytearray(max(sizes))
        for dev, size, data in sources:
            check(cu.cuMemcpyDtoHAsync(c_u64(target.value), c_u64(dev), c_u64(size), stream), "dtoh async")
            expected[:size] = data
        check(cu.cuStreamSynchronize(stream), "sync")
        wrong += ctypes.string_at(target.value, max(sizes)) != bytes(expected)
    say("rounds_wrong", wrong)


def scenario_event_batches():
    """An event made a step, as PyTorch's pinned-memory allocator makes them: each one fresh and the
    program's own, events of each kind of flags kept apart, and a context's events gone with it."""
    primary = setup()
    stream = c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 1), "stream")
    seen, fresh, recorded = set(), 0, 0
    for step in range(100):
        start, end = c_u64(), c_u64()
        check(cu.cuEventCreate(ctypes.byref(start), 0), "create")
        check(cu.cuEventCreate(ctypes.byref(end), 2 if step % 2 else 0), "create")  # DISABLE_TIMING: 2
        seen.update((start.value, end.value))
        fresh += cu.cuEventQuery(start) == 0 and cu.cuEventSynchronize(end) == 0  # never recorded: done
        check(cu.cuEventRecord(start, stream), "record")
        check(cu.cuEventRecord(end, stream), "record")
        check(cu.cuEventSynchronize(end), "sync")
        ms = ctypes.c_float()
        recorded += cu.cuEventElapsedTime(ctypes.byref(ms), start, end) == (400 if step % 2 else 0)
        check(cu.cuEventDestroy(start), "destroy")
        check(cu.cuEventDestroy(end), "destroy")
    say("distinct", len(seen) == 200)
    say("fresh", fresh)
    say("timing_as_asked", recorded)
    bad = c_u64()
    say("bad_flags", cu.cuEventCreate(ctypes.byref(bad), 0x80))
    created, other = c_u64(), c_u64()
    check(cu.cuCtxCreate(ctypes.byref(created), None, 0, 0), "create context")
    check(cu.cuEventCreate(ctypes.byref(other), 0), "event in it")
    check(cu.cuCtxDestroy(created), "destroy context")  # its unused fresh events went with it
    check(cu.cuCtxCreate(ctypes.byref(created), None, 0, 0), "another context")
    own = c_u64()
    check(cu.cuStreamCreate(ctypes.byref(own), 1), "its stream")
    check(cu.cuEventCreate(ctypes.byref(other), 0), "an event of the new context")
    say("new_context_event", f"{cu.cuEventRecord(other, own)},{cu.cuStreamSynchronize(own)}")
    check(cu.cuCtxSetCurrent(primary), "back")


def scenario_events_made_in_c():
    """Named events made and destroyed where the worker's native loop serves them, then named by calls its
    Python path serves (a graph's event-record node): the node holds the event the program made; after the
    event's destroy no call can name it, neither a served one nor a graph node."""
    setup()
    stream, event, graph, node, got = c_u64(), c_u64(), c_u64(), c_u64(), c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 1), "stream")
    made = []
    for _ in range(50):  # made and gone in C, never heard of by Python
        check(cu.cuEventCreate(ctypes.byref(event), 0), "create")
        check(cu.cuEventRecord(event, stream), "record")
        made.append(cu.cuEventSynchronize(event))
        check(cu.cuEventDestroy(event), "destroy")
    say("short_lived", set(made) == {0})
    check(cu.cuEventCreate(ctypes.byref(event), 2), "create")  # DISABLE_TIMING
    check(cu.cuGraphCreate(ctypes.byref(graph), 0), "graph")
    say("node", cu.cuGraphAddEventRecordNode(ctypes.byref(node), graph, None, c_u64(0), event))
    check(cu.cuGraphEventRecordNodeGetEvent(node, ctypes.byref(got)), "the node's event")
    say("node_event", got.value == event.value)
    check(cu.cuEventRecord(event, stream), "record")
    say("synchronised", cu.cuEventSynchronize(event))
    check(cu.cuEventDestroy(event), "destroy")
    say("query_after", cu.cuEventQuery(event))
    other = c_u64()
    say("node_after", cu.cuGraphAddEventRecordNode(ctypes.byref(other), graph, None, c_u64(0), event))


def scenario_event_names():
    """Events the program's side names (gpEventCreateNamed): one made, recorded and waited for; then the
    worker asked, as a forged client would, to name an event by a value that is not a name, and by the
    name of an event the lease already has: each refusal reported by the next synchronise, the event
    that holds the name untouched."""
    from virtualize.common._calls import CALL_IDS, CALLS

    setup()
    stream, event = c_u64(), c_u64()
    check(cu.cuStreamCreate(ctypes.byref(stream), 1), "stream")
    check(cu.cuEventCreate(ctypes.byref(event), 0), "create")
    say("named", hex(event.value >> 56))
    check(cu.cuEventRecord(event, stream), "record")
    say("recorded_and_waited", cu.cuEventSynchronize(event))
    forward = ctypes.CDLL("libcuda.so.1").gpupool_forward
    forward.argtypes = [ctypes.c_uint32, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p,
                        ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_uint64]  # fmt: skip

    def name(value: int) -> int:  # unanswered, as the shim sends it; then the synchronise that reports
        args = struct.pack("<IQ", 0, value)
        call = next(c for c in CALLS if c.name == "gpEventCreateNamed")
        forward(CALL_IDS[call], 0, args, len(args), None, 0, None, 0, None, 0)
        return cu.cuCtxSynchronize()

    say("not_a_name", name(0x7F00_0000_1000))
    say("a_name_held", name(event.value))
    say("holder_untouched", f"{cu.cuEventRecord(event, stream)},{cu.cuEventSynchronize(event)}")
    check(cu.cuEventDestroy(event), "destroy")
    say("destroyed", cu.cuEventQuery(event))  # no longer the lease's


if __name__ == "__main__":
    globals()[f"scenario_{sys.argv[1]}"]()
