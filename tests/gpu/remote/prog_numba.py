"""numba-cuda: an @cuda.jit kernel on device arrays, launched a few times, results copied back.

Runs unchanged on a local GPU or, under gpupool's libcuda.so.1, on a leased one; prints the same.
(numba-cuda 0.30 needs `numpy.row_stack` on numpy >= 2.5: the runner puts a sitecustomize on PYTHONPATH.)
"""

from __future__ import annotations

import sys

import numpy as np
from _common import loaded_libcuda
from numba import cuda


@cuda.jit
def axpy(out, x, a):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + out[i]


def main() -> int:
    print("gpus", len(cuda.gpus))
    n = 1 << 18
    x = np.arange(n, dtype=np.float32)
    d_x = cuda.to_device(x)
    d_out = cuda.device_array(n, dtype=np.float32)
    d_out[:] = 1.0
    for _ in range(3):
        axpy[(n + 127) // 128, 128](d_out, d_x, np.float32(2.0))
    cuda.synchronize()
    out = d_out.copy_to_host()
    print("axpy x3 matches numpy", bool(np.allclose(out, 1 + 3 * 2.0 * x)))
    print("checksum", f"{float(out.astype(np.float64).sum()):.1f}")
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
