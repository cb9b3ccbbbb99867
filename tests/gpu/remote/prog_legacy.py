"""The legacy launch API (deprecated since CUDA 4.0; issue 25): a function's block shape, shared size and
parameters set one by one (cuFuncSetBlockShape, cuFuncSetSharedSize, cuParamSetSize/i/f/v), launched by
cuLaunchGrid, cuLaunchGridAsync and cuLaunch; its bad uses (a parameter past the size set, a launch
before a block shape); cuCtxAttach / cuCtxDetach. What each call answers is printed, so the native run
says what the driver answers and the remote run must say the same.

Runs unchanged on a local GPU or, under gpupool's libcuda.so.1, on a leased one; prints the same.
"""

from __future__ import annotations

import ctypes
import sys

import numpy as np
from _common import PTX, loaded_libcuda, ok
from cuda.bindings import driver as cu

U64, I32, U32 = ctypes.c_uint64, ctypes.c_int, ctypes.c_uint
# The deprecated entry points, straight from the libcuda.so.1 this process loaded (cuda.bindings' too).
lib = ctypes.CDLL("libcuda.so.1")
for name, args in {
    "cuFuncSetBlockShape": (U64, I32, I32, I32),
    "cuFuncSetSharedSize": (U64, U32),
    "cuParamSetSize": (U64, U32),
    "cuParamSeti": (U64, I32, U32),
    "cuParamSetf": (U64, I32, ctypes.c_float),
    "cuParamSetv": (U64, I32, ctypes.c_void_p, U32),
    "cuLaunch": (U64,),
    "cuLaunchGrid": (U64, I32, I32),
    "cuLaunchGridAsync": (U64, I32, I32, U64),
    "cuCtxAttach": (ctypes.POINTER(U64), U32),
    "cuCtxDetach": (U64,),
}.items():
    getattr(lib, name).argtypes = args
    getattr(lib, name).restype = ctypes.c_int


def set_saxpy(f: int, x: int, y: int, a: float, n: int) -> list[int]:
    """saxpy(float *x, float *y, float a, unsigned n): 24 bytes of parameters, each at its offset."""
    return [
        lib.cuParamSetSize(f, 24),
        lib.cuParamSetv(f, 0, ctypes.byref(U64(x)), 8),
        lib.cuParamSetv(f, 8, ctypes.byref(U64(y)), 8),
        lib.cuParamSetf(f, 16, a),
        lib.cuParamSeti(f, 20, n),
    ]


def main() -> int:
    ok(cu.cuInit(0))
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    ctx = ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0))))
    ok(cu.cuCtxSetCurrent(ctx))
    module = ok(cu.cuModuleLoadData(PTX.encode()))
    saxpy = int(ok(cu.cuModuleGetFunction(module, b"saxpy")))
    empty = int(ok(cu.cuModuleGetFunction(module, b"empty")))
    n = 1000
    x, y = int(ok(cu.cuMemAlloc(4 * n))), int(ok(cu.cuMemAlloc(4 * n)))
    xs, ys = np.arange(n, dtype=np.float32), np.ones(n, dtype=np.float32)  # held until copied
    ok(cu.cuMemcpyHtoD(x, xs.ctypes.data, 4 * n))
    ok(cu.cuMemcpyHtoD(y, ys.ctypes.data, 4 * n))

    def read_y() -> np.ndarray:
        out = np.empty(n, dtype=np.float32)
        ok(cu.cuMemcpyDtoH(out.ctypes.data, y, 4 * n))
        return out

    print("block shape", lib.cuFuncSetBlockShape(saxpy, 128, 1, 1))
    print("shared size", lib.cuFuncSetSharedSize(saxpy, 256))
    print("parameters", set_saxpy(saxpy, x, y, 2.0, n))
    print("cuLaunchGrid 8x1", lib.cuLaunchGrid(saxpy, 8, 1), "sync", cu.cuCtxSynchronize()[0].name)
    got = read_y()
    print("y = 2x + 1:", bool(np.array_equal(got, 2 * np.arange(n, dtype=np.float32) + 1)), got[:4], got[-2:])
    stream = ok(cu.cuStreamCreate(0))
    print("parameters", set_saxpy(saxpy, x, y, 0.5, n))
    print("cuLaunchGridAsync 8x1", lib.cuLaunchGridAsync(saxpy, 8, 1, int(stream)))
    print("stream sync", cu.cuStreamSynchronize(stream)[0].name, read_y()[[0, 1, 511, 512, 999]])
    print("cuLaunch (one block)", lib.cuLaunch(saxpy), "sync", cu.cuCtxSynchronize()[0].name)
    print("y after one block", read_y()[[0, 1, 127, 128, 999]])
    # bad uses, each followed by a synchronise that shows the context unspoiled
    print("cuParamSeti past the size", lib.cuParamSeti(saxpy, 24, 1))
    print("cuParamSetv across the size", lib.cuParamSetv(saxpy, 20, ctypes.byref(U64(0)), 8))
    print("cuParamSetSize 5000", lib.cuParamSetSize(saxpy, 5000))
    print("cuParamSetSize 4096", lib.cuParamSetSize(saxpy, 4096))
    print("cuLaunch before a block shape", lib.cuLaunch(empty), "sync", cu.cuCtxSynchronize()[0].name)
    print("cuLaunchGrid 0x1", lib.cuLaunchGrid(saxpy, 0, 1), "sync", cu.cuCtxSynchronize()[0].name)
    # cuCtxAttach counts a use of the current context; cuCtxDetach takes it back
    attached = U64()
    print("cuCtxAttach", lib.cuCtxAttach(ctypes.byref(attached), 0), attached.value == int(ctx))
    print("cuCtxAttach flags 1", lib.cuCtxAttach(ctypes.byref(attached), 1))
    print("cuCtxDetach", lib.cuCtxDetach(attached.value), "then a copy", cu.cuMemsetD8(x, 0, 4)[0].name)
    ok(cu.cuCtxSynchronize())
    ok(cu.cuMemFree(x))
    ok(cu.cuMemFree(y))
    return 0


if __name__ == "__main__":
    sys.exit(main())
