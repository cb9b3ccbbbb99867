"""Multicast objects (issue 25, NVLink SHARP): the granularity, an object over device 0, memory bound to it,
the object mapped and written through, the bound memory read back through a mapping of its own, unbound and
released. A GPU without multicast (no NVSwitch) answers CUDA_ERROR_NOT_SUPPORTED at the creation: printed,
the same natively and remotely.

Runs unchanged on a local GPU or, under gpupool's libcuda.so.1, on a leased one; prints the same.
"""

from __future__ import annotations

import sys

import numpy as np
from _common import loaded_libcuda, ok
from cuda.bindings import driver as cu

SUCCESS = cu.CUresult.CUDA_SUCCESS


def access_desc():
    desc = cu.CUmemAccessDesc()
    desc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    desc.location.id = 0
    desc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    return desc


def mapped(handle, size):
    """`handle` mapped read-write for device 0 in a range reserved for it."""
    base = ok(cu.cuMemAddressReserve(size, 0, 0, 0))
    ok(cu.cuMemMap(base, size, 0, handle, 0))
    ok(cu.cuMemSetAccess(base, size, [access_desc()], 1))
    return base


def main() -> int:
    ok(cu.cuInit(0))
    print("libcuda", loaded_libcuda(), file=sys.stderr)  # once cuInit has loaded it
    ctx = ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0))))
    ok(cu.cuCtxSetCurrent(ctx))
    supported = cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, 0)
    print("multicast supported (attribute)", supported, file=sys.stderr)  # 0 remotely: NCCL keeps off NVLS
    prop = cu.CUmulticastObjectProp()
    prop.numDevices, prop.handleTypes = 1, 0
    result = cu.cuMulticastGetGranularity(
        prop, cu.CUmulticastGranularity_flags.CU_MULTICAST_GRANULARITY_MINIMUM
    )
    print("granularity", result[0].name)
    if result[0] != SUCCESS:
        return 0
    size = int(result[1])
    prop.size = size
    result = cu.cuMulticastCreate(prop)
    print("create", result[0].name)
    if result[0] != SUCCESS:
        return 0
    mc = result[1]
    ok(cu.cuMulticastAddDevice(mc, 0))
    alloc = cu.CUmemAllocationProp()
    alloc.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    alloc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    alloc.location.id = 0
    granularity = ok(cu.cuMemGetAllocationGranularity(alloc, cu.CUmemAllocationGranularity_flags(0)))
    memory = ok(cu.cuMemCreate(max(size, int(granularity)), alloc, 0))
    ok(cu.cuMulticastBindMem(mc, 0, memory, 0, size, 0))
    through = mapped(mc, size)
    own = mapped(memory, size)
    ok(cu.cuMemsetD32(through, 0x5A5A5A5A, size // 4))
    ok(cu.cuCtxSynchronize())
    back = np.empty(4, dtype=np.uint32)
    ok(cu.cuMemcpyDtoH(back.ctypes.data, own, 16))
    print("written through the multicast object, read from the bound memory", [hex(int(v)) for v in back])
    print("a binding past the object", cu.cuMulticastBindMem(mc, size, memory, 0, size, 0)[0].name)
    ok(cu.cuMulticastUnbind(mc, 0, 0, size))
    if ok(cu.cuDriverGetVersion()) >= 13010:  # CUDA 13.1's bind, naming the device whose memory it is
        print("bind naming its device", cu.cuMulticastBindMem_v2(mc, 0, 0, memory, 0, size, 0)[0].name)
        ok(cu.cuMulticastUnbind(mc, 0, 0, size))
    else:
        print("binds naming a device: not in this driver")
    for base in (through, own):
        ok(cu.cuMemUnmap(base, size))
        ok(cu.cuMemAddressFree(base, size))
    ok(cu.cuMemRelease(mc))
    ok(cu.cuMemRelease(memory))
    print("released")
    return 0


if __name__ == "__main__":
    sys.exit(main())
