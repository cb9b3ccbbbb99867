"""Contexts a program creates (cuCtxCreate / cuCtxDestroy): current at once, a module, memory and a
launch in it, the primary context under it current again after the destroy, the memory back.

Runs unchanged on a local GPU or, under gpupool's libcuda.so.1, on a leased one; prints the same.
"""

from __future__ import annotations

import ctypes
import sys

import numpy as np
from _common import PTX, loaded_libcuda, ok
from cuda.bindings import driver as cu


def create(dev):
    try:  # cuda-bindings 13: (params, flags, device); 12: (flags, device)
        return ok(cu.cuCtxCreate(None, 0, dev))
    except TypeError:
        return ok(cu.cuCtxCreate(0, dev))


def main() -> int:
    ok(cu.cuInit(0))
    dev = ok(cu.cuDeviceGet(0))
    primary = ok(cu.cuDevicePrimaryCtxRetain(dev))
    ok(cu.cuCtxSetCurrent(primary))
    free_before, _ = ok(cu.cuMemGetInfo())
    ctx = create(dev)
    print("created context is current", int(ok(cu.cuCtxGetCurrent())) == int(ctx) != int(primary))
    module = ok(cu.cuModuleLoadData(PTX.encode()))
    saxpy = ok(cu.cuModuleGetFunction(module, b"saxpy"))
    n = 1 << 16
    x, y = np.arange(n, dtype=np.float32), np.ones(n, dtype=np.float32)
    dx, dy = ok(cu.cuMemAlloc(x.nbytes)), ok(cu.cuMemAlloc(y.nbytes))
    ok(cu.cuMemAlloc(256 << 20))  # held until the destroy frees it with the context
    ok(cu.cuMemcpyHtoD(dx, x.ctypes.data, x.nbytes))
    ok(cu.cuMemcpyHtoD(dy, y.ctypes.data, y.nbytes))
    args = ((dx, dy, 2.0, n), (None, None, ctypes.c_float, ctypes.c_uint32))
    ok(cu.cuLaunchKernel(saxpy, n // 256, 1, 1, 256, 1, 1, 0, 0, args, 0))
    out = np.empty_like(y)
    ok(cu.cuMemcpyDtoH(out.ctypes.data, dy, out.nbytes))
    print("saxpy in the created context", bool(np.array_equal(out, 2 * x + 1)))
    free_inside, _ = ok(cu.cuMemGetInfo())
    print("its memory counts", free_before - free_inside >= 256 << 20)
    ok(cu.cuCtxDestroy(ctx))
    print("primary current after the destroy", int(ok(cu.cuCtxGetCurrent())) == int(primary))
    free_after, _ = ok(cu.cuMemGetInfo())
    print("memory back after the destroy", free_after >= free_before - (16 << 20))
    again = ok(cu.cuMemAlloc(1 << 20))
    ok(cu.cuMemsetD8(again, 7, 1 << 20))
    ok(cu.cuCtxSynchronize())
    print("primary context still works", True)
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
