"""Green contexts (CUDA 12.4+): the device's SM resource, split into groups, a green context of one group,
its CUcontext, a stream in it, an event recorded and waited in it, a kernel launched there, then destroyed.
Forged resources and a split asking for more SMs than there are are refused.

Runs unchanged on a local GPU or, under gpupool's libcuda.so.1, on a leased one (a whole-GPU lease: the
same SMs); prints the same.
"""

from __future__ import annotations

import ctypes
import sys

import numpy as np
from _common import PTX, loaded_libcuda, ok
from cuda.bindings import driver as cu

SM = cu.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM


def main() -> int:
    ok(cu.cuInit(0))
    dev = ok(cu.cuDeviceGet(0))
    primary = ok(cu.cuDevicePrimaryCtxRetain(dev))
    ok(cu.cuCtxSetCurrent(primary))
    sms = ok(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev))
    device = ok(cu.cuDeviceGetDevResource(dev, SM))
    print("device resource has the GPU's SMs", int(device.sm.smCount) == sms)
    of_ctx = ok(cu.cuCtxGetDevResource(primary, SM))
    print("primary context's resource the same", int(of_ctx.sm.smCount) == sms)
    affinity = cu.cuCtxGetExecAffinity(cu.CUexecAffinityType.CU_EXEC_AFFINITY_TYPE_SM_COUNT)
    shown = (
        int(affinity[1].param.smCount.val) if affinity[0] == cu.CUresult.CUDA_SUCCESS else affinity[0].name
    )
    print("primary context's execution affinity (SMs):", shown, "of", sms, file=sys.stderr)  # not diffed
    min_size = int(device.sm.minSmPartitionSize)
    print("partition size sensible", 0 < min_size <= sms)
    # Two groups of the smallest partition, the rest in the remainder.
    groups, count, rest = ok(cu.cuDevSmResourceSplitByCount(2, device, 0, min_size))
    count = int(count)
    print("groups made", count)
    print("group SMs at least the minimum", all(int(g.sm.smCount) >= min_size for g in list(groups)[:count]))
    print(
        "groups and remainder add up",
        sum(int(g.sm.smCount) for g in list(groups)[:count]) + int(rest.sm.smCount) == sms,
    )
    asked = cu.cuDevSmResourceSplitByCount(0, device, 0, min_size)  # no result array: how many groups
    print("groups possible", int(asked[2]) if asked[0] == cu.CUresult.CUDA_SUCCESS else asked[0].name)
    beyond = cu.cuDevSmResourceSplitByCount(1, device, 0, sms + 1)
    print("split beyond the SMs makes no group", beyond[0] != cu.CUresult.CUDA_SUCCESS or int(beyond[2]) == 0)
    desc = ok(cu.cuDevResourceGenerateDesc([groups[0]], 1))
    green = ok(cu.cuGreenCtxCreate(desc, dev, cu.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM))
    of_green = ok(cu.cuGreenCtxGetDevResource(green, SM))
    print("green context has its group's SMs", int(of_green.sm.smCount) == int(groups[0].sm.smCount))
    ctx = ok(cu.cuCtxFromGreenCtx(green))
    print(
        "its context's resource the same",
        int(ok(cu.cuCtxGetDevResource(ctx, SM)).sm.smCount) == int(of_green.sm.smCount),
    )
    stream = ok(cu.cuGreenCtxStreamCreate(green, cu.CUstream_flags.CU_STREAM_NON_BLOCKING, 0))
    print("stream's green context", int(ok(cu.cuStreamGetGreenCtx(stream))) == int(green))
    ok(cu.cuCtxSetCurrent(ctx))
    print("its device", int(ok(cu.cuCtxGetDevice())) == int(dev))
    module = ok(cu.cuModuleLoadData(PTX.encode()))
    saxpy = ok(cu.cuModuleGetFunction(module, b"saxpy"))
    n = 1 << 20
    x, y = np.arange(n, dtype=np.float32), np.ones(n, dtype=np.float32)
    dx, dy = ok(cu.cuMemAlloc(x.nbytes)), ok(cu.cuMemAlloc(y.nbytes))
    ok(cu.cuMemcpyHtoD(dx, x.ctypes.data, x.nbytes))
    ok(cu.cuMemcpyHtoD(dy, y.ctypes.data, y.nbytes))
    args = ((dx, dy, 2.0, n), (None, None, ctypes.c_float, ctypes.c_uint32))
    ok(cu.cuLaunchKernel(saxpy, n // 256, 1, 1, 256, 1, 1, 0, stream, args, 0))
    event = ok(cu.cuEventCreate(0))
    ok(cu.cuGreenCtxRecordEvent(green, event))
    ok(cu.cuGreenCtxWaitEvent(green, event))
    ok(cu.cuEventSynchronize(event))
    out = np.empty_like(y)
    ok(cu.cuMemcpyDtoH(out.ctypes.data, dy, out.nbytes))
    print("saxpy in the green context", bool(np.array_equal(out, 2 * x + 1)))
    ok(cu.cuStreamDestroy(stream))
    ok(cu.cuEventDestroy(event))
    ok(cu.cuMemFree(dx))
    ok(cu.cuMemFree(dy))
    ok(cu.cuCtxSetCurrent(primary))
    ok(cu.cuGreenCtxDestroy(green))
    ok(cu.cuMemsetD8(ok(cu.cuMemAlloc(1 << 20)), 7, 1 << 20))
    ok(cu.cuCtxSynchronize())
    print("primary context still works", True)
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
