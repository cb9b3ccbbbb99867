"""Raw cuda.bindings.driver: a module from PTX, launches, copies both ways, streams and events.

Runs unchanged on a local GPU or, under gpupool's libcuda.so.1, on a leased one; prints the same.
"""

from __future__ import annotations

import ctypes
import sys

import numpy as np
from _common import PTX, loaded_libcuda, ok
from cuda.bindings import driver as cu


def main() -> int:
    ok(cu.cuInit(0))
    print("devices", ok(cu.cuDeviceGetCount()))
    dev = ok(cu.cuDeviceGet(0))
    major = ok(
        cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
    )
    print("compute capability major >= 7", major >= 7)
    ctx = ok(cu.cuDevicePrimaryCtxRetain(dev))
    ok(cu.cuCtxSetCurrent(ctx))
    module = ok(cu.cuModuleLoadData(PTX.encode()))
    saxpy = ok(cu.cuModuleGetFunction(module, b"saxpy"))
    n = 1 << 20
    x = np.linspace(0, 1, n, dtype=np.float32)
    y = np.full(n, 2.0, dtype=np.float32)
    dx, dy = ok(cu.cuMemAlloc(x.nbytes)), ok(cu.cuMemAlloc(y.nbytes))
    stream = ok(cu.cuStreamCreate(0))
    start, end = ok(cu.cuEventCreate(0)), ok(cu.cuEventCreate(0))
    ok(cu.cuMemcpyHtoDAsync(dx, x.ctypes.data, x.nbytes, stream))
    ok(cu.cuMemcpyHtoD(dy, y.ctypes.data, y.nbytes))
    ok(cu.cuEventRecord(start, stream))
    args = ((dx, dy, 3.0, n), (None, None, ctypes.c_float, ctypes.c_uint32))
    for _ in range(10):
        ok(cu.cuLaunchKernel(saxpy, (n + 255) // 256, 1, 1, 256, 1, 1, 0, stream, args, 0))
    ok(cu.cuEventRecord(end, stream))
    out = np.empty_like(y)
    ok(cu.cuMemcpyDtoHAsync(out.ctypes.data, dy, out.nbytes, stream))
    ok(cu.cuStreamSynchronize(stream))
    expected = y + 10 * 3.0 * x
    print("saxpy x10 matches numpy", bool(np.allclose(out, expected, rtol=1e-5)))
    print("checksum", f"{float(out.astype(np.float64).sum()):.3f}")
    print("elapsed > 0", ok(cu.cuEventElapsedTime(start, end)) > 0)
    ok(cu.cuMemsetD32(dy, 0x3F800000, n))  # 1.0f
    ok(cu.cuMemcpyDtoD(dx, dy, y.nbytes))
    ok(cu.cuMemcpyDtoH(out.ctypes.data, dx, out.nbytes))
    print("memset + dtod", bool((out == 1.0).all()))
    print("event query", ok(cu.cuEventQuery(end)) is None)
    for handle in (dx, dy):
        ok(cu.cuMemFree(handle))
    ok(cu.cuStreamDestroy(stream))
    ok(cu.cuModuleUnload(module))
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
