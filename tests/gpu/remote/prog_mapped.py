"""Mapped (zero-copy) page-locked host memory (issue 11's second row): numba-cuda's `cuda.mapped_array`
(cuMemHostAlloc with DEVICEMAP) written by the host, changed by kernels and read by the host after each
synchronise; `cuda.mapped(array)` (cuMemHostRegister + cuMemHostGetDevicePointer) on a NumPy array
the program already holds; and CuPy's `hostAlloc(..., cudaHostAllocMapped)` given to a raw kernel
by its host address, as unified addressing allows.

Runs unchanged on a local GPU or, under gpupool's libcuda.so.1, on a leased one; prints the same.
(numba-cuda 0.30 needs `numpy.row_stack` on numpy >= 2.5: the runner puts a sitecustomize on PYTHONPATH.)
"""

from __future__ import annotations

import ctypes
import sys
import warnings

import numpy as np
from _common import loaded_libcuda
from numba import cuda
from prog_managed import host_and_kernels, scale_add

N = 1 << 18


def main() -> int:
    warnings.simplefilter("ignore")  # numba's performance hints on small grids
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    host_and_kernels(cuda.mapped_array(N, dtype=np.float64), 20)

    held = np.full(100_003, 3.0, dtype=np.float32)  # an odd size: its first and last pages are shared
    with cuda.mapped(held) as d:
        scale_add[(held.size + 255) // 256, 256](d, 3.0, 1.0)
        cuda.synchronize()
        print("mapped() during", held[:2].tolist(), held[-2:].tolist())
        held[-1] = 0.0
        scale_add[(held.size + 255) // 256, 256](d, 1.0, 1.0)
        cuda.synchronize()
    print("mapped() after", held[:2].tolist(), held[-2:].tolist(), float(held.sum()))

    try:
        import cupy as cp
    except ImportError:
        print("cupy mapped", "cupy not installed")
        return 0
    n = 4096
    ptr = cp.cuda.runtime.hostAlloc(n * 4, cp.cuda.runtime.hostAllocMapped)
    host = np.ctypeslib.as_array((ctypes.c_float * n).from_address(ptr))
    host[:] = np.arange(n, dtype=np.float32)
    kernel = cp.RawKernel(
        r'extern "C" __global__ void twice(float *x, int n) {'
        r" int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] = 2.0f * x[i]; }",
        "twice",
    )
    kernel((n // 256,), (256,), (cp.uint64(ptr), cp.int32(n)))  # the host address itself
    cp.cuda.Device().synchronize()
    print("cupy mapped", host[:3].tolist(), float(host.sum()))
    cp.cuda.runtime.freeHost(ptr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
