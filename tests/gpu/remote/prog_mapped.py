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
    print("delay kernel released by a host store:", released_by_host(cp))
    return 0


def released_by_host(cp) -> str:
    """XLA's GPU timer: a kernel on a non-blocking stream spins on a flag in page-locked memory (its own
    allocation) until the host stores to it, then the host synchronises on an event behind the kernel.
    Natively the store reaches the spinning kernel at once; a kernel that saw nothing gives up after ~2 s."""
    delay = cp.RawKernel(
        r'extern "C" __global__ void delay(volatile int *flag, long long cycles, int *out) {'
        r" long long start = clock64();"
        r" while (*flag == 0) { if (clock64() - start > cycles) { *out = 2; return; } }"
        r" *out = 1; }",
        "delay",
    )
    flag_ptr = cp.cuda.runtime.hostAlloc(4, 0)
    flag = (ctypes.c_int * 1).from_address(flag_ptr)
    flag[0] = 0
    out = cp.zeros(1, dtype=cp.int32)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        delay((1,), (1,), (cp.uint64(flag_ptr), cp.int64(4_000_000_000), out))
        done = stream.record()
    flag[0] = 1
    done.synchronize()
    answer = {1: "released", 2: "timed out (the kernel never saw the store)"}.get(int(out.get()[0]), "?")
    cp.cuda.runtime.freeHost(flag_ptr)
    return answer


if __name__ == "__main__":
    sys.exit(main())
