"""Launch errors where the driver gives them (issue 11): launches the GPU would refuse — too many
threads per block, an empty grid, more dynamic shared memory than the function allows, more threads
than a kernel's launch bounds — each answered by the launch call itself, and a good launch after each
still runs (the context is not spoiled). Then more dynamic shared memory once the function is allowed it.

Runs unchanged on a local GPU or, under gpupool's libcuda.so.1, on a leased one; prints the same.
"""

from __future__ import annotations

import ctypes
import sys

import numpy as np
from _common import loaded_libcuda, ok
from cuda.bindings import driver as cu
from cuda.core import Device, Program, ProgramOptions

SOURCE = r"""
extern "C" __global__ void scale(float *x, int n) {
    extern __shared__ float scratch[];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { scratch[threadIdx.x] = x[i]; x[i] = 2.0f * scratch[threadIdx.x]; }
}
extern "C" __global__ void __launch_bounds__(128) bounded(float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}
"""


def main() -> int:
    dev = Device(0)
    dev.set_current()
    ptx = Program(SOURCE, code_type="c++", options=ProgramOptions(arch=f"sm_{dev.arch}")).compile("ptx").code
    ok(cu.cuInit(0))
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    ctx = ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0))))
    ok(cu.cuCtxSetCurrent(ctx))
    module = ok(cu.cuModuleLoadData(ptx))
    scale, bounded = (
        ok(cu.cuModuleGetFunction(module, b"scale")),
        ok(cu.cuModuleGetFunction(module, b"bounded")),
    )
    n = 4096
    x = ok(cu.cuMemAlloc(4 * n))
    ones = np.ones(n, dtype=np.float32)  # held: a temporary's memory is free before the copy reads it
    ok(cu.cuMemcpyHtoD(x, ones.ctypes.data, 4 * n))
    args = ((x, n), (None, ctypes.c_int))

    def launch(fn, grid, block, smem=0):
        err = cu.cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, smem, 0, args, 0)[0]
        return err.name

    def good() -> str:
        launched = launch(scale, n // 256, 256, 1024)
        return f"{launched}, sync {cu.cuCtxSynchronize()[0].name}"

    print("1024 threads", launch(scale, 4, 1024, 4096), "| after:", good())
    print("2048 threads", launch(scale, 2, 2048, 8192), "| after:", good())
    print("empty grid", launch(scale, 0, 256, 1024), "| after:", good())
    print("200 KiB dynamic shared memory", launch(scale, 16, 256, 200 << 10), "| after:", good())
    ok(
        cu.cuFuncSetAttribute(
            scale, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 200 << 10
        )
    )
    print("200 KiB once allowed", launch(scale, 16, 256, 200 << 10))
    limit = ok(
        cu.cuFuncGetAttribute(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, bounded)
    )
    print("launch bounds", limit)
    print("bounded at 128 threads", launch(bounded, n // 128, 128))
    print("bounded at 256 threads", launch(bounded, n // 256, 256), "| after:", good())
    ok(cu.cuCtxSynchronize())
    ok(cu.cuMemFree(x))
    return 0


if __name__ == "__main__":
    sys.exit(main())
