"""Driver calls issue 25 forwards, on a real GPU (each printed line must be the same natively and remotely):

- cooperative launches: a grid-wide barrier (every block waits until all have arrived, which only ends
  when they all run at once), by cuLaunchCooperativeKernel and by cuLaunchKernelEx's cooperative
  attribute; one block more than fit at once is refused by the launch call;
- cache and shared-memory configuration of the context, a function and a kernel, with the driver's
  answers to values it refuses (an unknown configuration, a carve-out past 100 %, too much dynamic
  shared memory);
- a library's kernels and a module's functions enumerated, with their names and their library;
- an allocation handle retained at its mapped address and released, as NCCL frees its memory;
- a pitched allocation set row by row and read back, the device found by its PCI bus id, a stream's
  priority attribute, a context-wide event;
- a library's managed variable read by the host, scaled by a kernel, read again;
- tensor maps (Hopper's TMA descriptors) encoded 32 times and re-pointed 32 times for memory of the
  lease: every one must succeed (the worker once encoded them in cuda.bindings' CUtensorMap, which is
  only 16-byte aligned, and the driver refused three in four).

The calls whose refusals are printed, and the tensor maps, go through ctypes on the loaded libcuda.so.1
(gpupool's shim when run remotely): cuda.bindings checks enum values itself, and its own CUtensorMap
would be refused natively as well.
"""

from __future__ import annotations

import ctypes
import struct
import sys
from collections import Counter

import numpy as np
from _common import loaded_libcuda, ok
from cuda.bindings import driver as cu
from cuda.core import Device, Program, ProgramOptions

SOURCE = r"""
extern "C" __global__ void barrier(unsigned *arrived, unsigned *seen) {
    __shared__ unsigned all;
    if (threadIdx.x == 0) {
        atomicAdd(arrived, 1u);
        while (atomicAdd(arrived, 0u) < gridDim.x) { }
        all = atomicAdd(arrived, 0u);
    }
    __syncthreads();
    seen[blockIdx.x * blockDim.x + threadIdx.x] = all;
}
__managed__ float managed_scale[4] = {1.0f, 2.0f, 3.0f, 4.0f};
extern "C" __global__ void scale(float *x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}
"""
KEPT: list = []  # callbacks handed to the driver
BLOCKS, THREADS = 8, 128  # few enough blocks to fit at once on any share of a GPU
libcuda = ctypes.CDLL("libcuda.so.1")
c_u64 = ctypes.c_uint64


def name(code: int) -> str:
    return cu.CUresult(code).name


def cooperative(module) -> None:
    barrier = ok(cu.cuModuleGetFunction(module, b"barrier"))
    arrived, seen = ok(cu.cuMemAlloc(4)), ok(cu.cuMemAlloc(4 * BLOCKS * THREADS))
    args = ((arrived, seen), (None, None))

    def result() -> str:
        out = np.zeros(BLOCKS * THREADS, dtype=np.uint32)
        ok(cu.cuMemcpyDtoH(out.ctypes.data, seen, out.nbytes))
        return f"every block saw all {BLOCKS}: {bool((out == BLOCKS).all())}"

    ok(cu.cuMemsetD32(arrived, 0, 1))
    err = cu.cuLaunchCooperativeKernel(barrier, BLOCKS, 1, 1, THREADS, 1, 1, 0, 0, args)[0]
    print("cuLaunchCooperativeKernel", err.name, "sync", cu.cuCtxSynchronize()[0].name, result())
    ok(cu.cuMemsetD32(arrived, 0, 1))
    attribute = cu.CUlaunchAttribute()
    attribute.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
    attribute.value.cooperative = 1
    config = cu.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = BLOCKS, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = THREADS, 1, 1
    config.attrs, config.numAttrs = [attribute], 1
    err = cu.cuLaunchKernelEx(config, barrier, args, 0)[0]
    print("cuLaunchKernelEx cooperative", err.name, "sync", cu.cuCtxSynchronize()[0].name, result())
    per_sm = ok(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(barrier, THREADS, 0))
    sms = ok(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0))
    too_many = per_sm * sms + 1
    err = cu.cuLaunchCooperativeKernel(barrier, too_many, 1, 1, THREADS, 1, 1, 0, 0, args)[0]
    print("one block more than fit at once", err.name, "| sync after:", cu.cuCtxSynchronize()[0].name)
    # The deprecated multi-device launch, on this one device: CUDA_LAUNCH_PARAMS through ctypes (the
    # function, dimensions, shared memory, stream, kernel parameters).
    ok(cu.cuMemsetD32(arrived, 0, 1))
    values = (c_u64(int(arrived)), c_u64(int(seen)))
    pointers = (ctypes.c_void_p * 2)(*[ctypes.addressof(v) for v in values])
    launch = struct.pack(
        "<Q7I4xQQ", int(barrier), BLOCKS, 1, 1, THREADS, 1, 1, 0, 0, ctypes.addressof(pointers)
    )
    multi = libcuda.cuLaunchCooperativeKernelMultiDevice
    multi.argtypes, multi.restype = (ctypes.c_char_p, ctypes.c_uint, ctypes.c_uint), ctypes.c_int
    err = multi(launch, 1, 0)
    print("cuLaunchCooperativeKernelMultiDevice", name(err), "sync", cu.cuCtxSynchronize()[0].name,
          result() if err == 0 else "")  # fmt: skip
    ok(cu.cuMemFree(arrived))
    ok(cu.cuMemFree(seen))


def configuration(module, library) -> None:
    scale = ok(cu.cuModuleGetFunction(module, b"scale"))
    kernel = ok(cu.cuLibraryGetKernel(library, b"scale"))
    f, k = c_u64(int(scale)), c_u64(int(kernel))
    value = ctypes.c_int()
    print("ctx cache config", name(libcuda.cuCtxGetCacheConfig(ctypes.byref(value))), value.value)
    print(
        "set PREFER_L1",
        name(libcuda.cuCtxSetCacheConfig(2)),
        "| unknown 7:",
        name(libcuda.cuCtxSetCacheConfig(7)),
    )
    print("ctx cache config now", name(libcuda.cuCtxGetCacheConfig(ctypes.byref(value))), value.value)
    print("ctx bank size", name(libcuda.cuCtxGetSharedMemConfig(ctypes.byref(value))), value.value)
    print("function PREFER_SHARED", name(libcuda.cuFuncSetCacheConfig(f, 1)), "| unknown 9:",
          name(libcuda.cuFuncSetCacheConfig(f, 9)))  # fmt: skip
    print("function bank size", name(libcuda.cuFuncSetSharedMemConfig(f, 1)), "| unknown 7:",
          name(libcuda.cuFuncSetSharedMemConfig(f, 7)))  # fmt: skip
    print("kernel PREFER_EQUAL", name(libcuda.cuKernelSetCacheConfig(k, 3, 0)), "| unknown 4:",
          name(libcuda.cuKernelSetCacheConfig(k, 4, 0)))  # fmt: skip
    carveout = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
    print("carve-out 50", name(libcuda.cuFuncSetAttribute(f, int(carveout), 50)), "| 101:",
          name(libcuda.cuFuncSetAttribute(f, int(carveout), 101)), "| now", ok(cu.cuFuncGetAttribute(carveout, scale)))  # fmt: skip
    dynamic = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    print("dynamic shared memory 1 MiB", name(libcuda.cuFuncSetAttribute(f, int(dynamic), 1 << 20)))


def enumeration(module, library) -> None:
    count = ok(cu.cuLibraryGetKernelCount(library))
    kernels = ok(cu.cuLibraryEnumerateKernels(count, library))
    names = sorted(ok(cu.cuKernelGetName(k)).decode() for k in kernels)
    owners = {int(ok(cu.cuKernelGetLibrary(k))) == int(library) for k in kernels}
    print("library kernels", count, names, "their library:", owners)
    count = ok(cu.cuModuleGetFunctionCount(module))
    functions = ok(cu.cuModuleEnumerateFunctions(count, module))
    names = sorted(ok(cu.cuFuncGetName(f)).decode() for f in functions)
    print("module functions", count, names)
    by_name = ok(cu.cuModuleGetFunction(module, b"scale"))
    print("an enumerated handle is the one by name", int(by_name) in {int(f) for f in functions})
    print("loaded", ok(cu.cuFuncIsLoaded(by_name)).name, "| load:", cu.cuFuncLoad(by_name)[0].name)


def retained_handle() -> None:
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = 0
    size = ok(
        cu.cuMemGetAllocationGranularity(
            prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
        )
    )
    base = ok(cu.cuMemAddressReserve(size, 0, 0, 0))
    handle = ok(cu.cuMemCreate(size, prop, 0))
    ok(cu.cuMemMap(base, size, 0, handle, 0))
    access = cu.CUmemAccessDesc()
    access.location = prop.location
    access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    ok(cu.cuMemSetAccess(base, size, [access], 1))
    retained = ok(cu.cuMemRetainAllocationHandle(int(base)))
    print(
        "retained: the same handle",
        int(retained) == int(handle),
        "| release:",
        cu.cuMemRelease(retained)[0].name,
    )
    print("still mapped: memset", cu.cuMemsetD8(base, 7, size)[0].name, "sync", cu.cuCtxSynchronize()[0].name)
    ok(cu.cuMemUnmap(base, size))
    print("last release", cu.cuMemRelease(handle)[0].name)
    ok(cu.cuMemAddressFree(base, size))


def pitched_and_settings(ctx) -> None:
    ptr, pitch = ok(cu.cuMemAllocPitch(100, 8, 4))
    print("pitched rows fit", pitch >= 100, "| memset rows:", cu.cuMemsetD2D32(ptr, pitch, 7, 25, 8)[0].name)
    rows = np.zeros((8, 25), dtype=np.uint32)
    copy = cu.CUDA_MEMCPY2D()
    copy.srcMemoryType, copy.srcDevice, copy.srcPitch = cu.CUmemorytype.CU_MEMORYTYPE_DEVICE, ptr, pitch
    copy.dstMemoryType, copy.dstHost, copy.dstPitch = (
        cu.CUmemorytype.CU_MEMORYTYPE_HOST,
        rows.ctypes.data,
        100,
    )
    copy.WidthInBytes, copy.Height = 100, 8
    print("rows back", cu.cuMemcpy2D(copy)[0].name, bool((rows == 7).all()))
    ok(cu.cuMemFree(ptr))
    bus_id = ok(cu.cuDeviceGetPCIBusId(64, 0)).split(b"\0", 1)[0]
    print("device by its bus id", int(ok(cu.cuDeviceGetByPCIBusId(bus_id))))
    stream = ok(cu.cuStreamCreate(0))
    value = cu.CUstreamAttrValue()
    value.priority = -1
    kind = cu.CUstreamAttrID.CU_LAUNCH_ATTRIBUTE_PRIORITY
    print("stream priority attribute", cu.cuStreamSetAttribute(stream, kind, value)[0].name,
          ok(cu.cuStreamGetAttribute(stream, kind)).priority)  # fmt: skip
    event = ok(cu.cuEventCreate(0))
    print("context event", cu.cuCtxRecordEvent(ctx, event)[0].name, cu.cuCtxWaitEvent(ctx, event)[0].name,
          cu.cuEventSynchronize(event)[0].name)  # fmt: skip
    ok(cu.cuEventDestroy(event))
    ok(cu.cuStreamDestroy(stream))


def aligned_map():
    storage = ctypes.create_string_buffer(128 + 64)
    return storage, -(-ctypes.addressof(storage) // 64) * 64


def tensor_maps() -> None:
    x = ok(cu.cuMemAlloc(1 << 20))
    storage, tensor_map = aligned_map()
    dims, strides = (c_u64 * 2)(256, 128), (c_u64 * 1)(1024)  # 128 rows of 256 floats, rows 1 KiB apart
    box, element = (ctypes.c_uint32 * 2)(64, 32), (ctypes.c_uint32 * 2)(1, 1)
    encoded = Counter(
        name(
            libcuda.cuTensorMapEncodeTiled(
                ctypes.c_void_p(tensor_map), 7, 2, c_u64(int(x)), dims, strides, box, element, 0, 0, 0, 0
            )
        )
        for _ in range(32)
    )
    print("tiled encodes", dict(encoded))
    moved = Counter(
        name(libcuda.cuTensorMapReplaceAddress(ctypes.c_void_p(tensor_map), c_u64(int(x) + 4096 * i)))
        for i in range(32)
    )
    print("re-pointed", dict(moved))
    dims3, strides3 = (c_u64 * 3)(16, 16, 16), (c_u64 * 2)(64, 1024)
    lower, upper, element3 = (ctypes.c_int * 1)(-1), (ctypes.c_int * 1)(1), (ctypes.c_uint32 * 3)(1, 1, 1)
    im2col = libcuda.cuTensorMapEncodeIm2col(ctypes.c_void_p(tensor_map), 7, 3, c_u64(int(x)), dims3, strides3,
                                             lower, upper, 16, 8, element3, 0, 0, 0, 0)  # fmt: skip
    print("im2col", name(im2col))
    del storage
    ok(cu.cuMemFree(x))


def library_managed(library, module) -> None:
    """A library's managed variable (cuLibraryGetManaged): the host reads what the image put there, a kernel
    scales it, the host reads the result after the synchronisation."""
    result = cu.cuLibraryGetManaged(library, b"managed_scale")
    print(
        "managed variable", result[0].name, int(result[2]) if result[0] == cu.CUresult.CUDA_SUCCESS else None
    )
    if result[0] != cu.CUresult.CUDA_SUCCESS:
        return
    ptr = int(result[1])
    values = (ctypes.c_float * 4).from_address(ptr)
    print("host reads its first contents", list(values))
    args = (c_u64(ptr), ctypes.c_float(10.0), ctypes.c_int(4))
    pointers = (ctypes.c_void_p * 3)(*[ctypes.addressof(a) for a in args])
    scale = ok(cu.cuModuleGetFunction(module, b"scale"))
    ok(cu.cuLaunchKernel(scale, 1, 1, 1, 4, 1, 1, 0, 0, ctypes.addressof(pointers), 0))
    ok(cu.cuCtxSynchronize())
    print("host reads the kernel's result", list(values))


def notifications_and_unified(library) -> None:
    """An asynchronous-notification callback registered and unregistered (never called remotely: whether
    the calls succeed goes to stderr); unified function pointers, which an x86 host's GPU does not offer
    (the lease's devices answer 0: on a system with them the attribute differs, so it goes to stderr)."""
    function = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(lambda *_: None)
    KEPT.append(function)  # the driver may call it after this returns (natively), until the process ends
    address = ctypes.cast(function, ctypes.c_void_p).value
    callback = cu.CUasyncCallback(address) if hasattr(cu, "CUasyncCallback") else None
    result = cu.cuDeviceRegisterAsyncNotification(0, callback, 0) if callback is not None else None
    # On stderr (not compared): a driver may not offer notifications on every platform, the shim accepts them.
    if result is None:
        print("async notifications: not in these bindings", file=sys.stderr)
    else:
        print("async notification registered", result[0].name, file=sys.stderr)
        if result[0] == cu.CUresult.CUDA_SUCCESS:
            print(
                "unregistered", cu.cuDeviceUnregisterAsyncNotification(0, result[1])[0].name, file=sys.stderr
            )
    unified = cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_UNIFIED_FUNCTION_POINTERS, 0)
    print("unified function pointers", unified, file=sys.stderr)
    print("unified function", cu.cuLibraryGetUnifiedFunction(library, b"nothing")[0].name, file=sys.stderr)


def main() -> int:
    dev = Device(0)
    dev.set_current()
    cubin = (
        Program(SOURCE, code_type="c++", options=ProgramOptions(arch=f"sm_{dev.arch}")).compile("cubin").code
    )
    ok(cu.cuInit(0))
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    ctx = ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0))))
    ok(cu.cuCtxSetCurrent(ctx))
    module = ok(cu.cuModuleLoadData(cubin))
    library = ok(cu.cuLibraryLoadData(cubin, None, None, 0, None, None, 0))
    cooperative(module)
    configuration(module, library)
    enumeration(module, library)
    retained_handle()
    pitched_and_settings(ctx)
    tensor_maps()
    notifications_and_unified(library)
    library_managed(library, module)
    ok(cu.cuCtxSynchronize())
    return 0


if __name__ == "__main__":
    sys.exit(main())
