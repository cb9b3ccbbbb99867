"""Managed memory (issue 11's first row): numba-cuda's `cuda.managed_array` written by the host, scaled
by a kernel, read back by the host after the synchronise; then an iterative loop where the host
touches a few elements each step between launches; and CuPy's `malloc_managed` allocator.

Runs unchanged on a local GPU or, under gpupool's libcuda.so.1, on a leased one; prints the same.
(numba-cuda 0.30 needs `numpy.row_stack` on numpy >= 2.5: the runner puts a sitecustomize on PYTHONPATH.)
"""

from __future__ import annotations

import sys
import warnings

import numpy as np
from _common import loaded_libcuda
from numba import cuda

N = 1 << 20


@cuda.jit
def scale_add(x, factor, offset):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = x[i] * factor + offset


def host_and_kernels(a, steps: int) -> None:
    """Memory both sides touch (prog_mapped.py too): the host writes it all, a kernel scales it, the host
    reads; then `steps` rounds of a host write, a kernel, a synchronise and a host read."""
    a[:] = np.arange(a.size, dtype=np.float64)
    blocks = (a.size + 255) // 256
    scale_add[blocks, 256](a, 2.0, 1.0)
    cuda.synchronize()
    print("after one kernel", a[:3].tolist(), float(a.sum()))
    for step in range(steps):
        a[step * 1000] = -1.0
        scale_add[blocks, 256](a, 1.0, 0.5)
        cuda.synchronize()
        _ = a[step * 1000 + 1]
    print(f"after {steps} steps", a[:2].tolist(), a[1000:1002].tolist(), float(a.sum()))


def main() -> int:
    warnings.simplefilter("ignore")  # numba's performance hints on small grids
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    host_and_kernels(cuda.managed_array(N, dtype=np.float64), 50)
    try:
        import cupy as cp

        cp.cuda.set_allocator(cp.cuda.MemoryPool(cp.cuda.malloc_managed).malloc)
        b = cp.arange(1000, dtype=cp.float32)
        print("cupy managed sum", float((b * 3).sum()))
    except ImportError:
        print("cupy managed sum", "cupy not installed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
