"""numba-cuda with small host arrays: one-element results of `round` and of an IntEnum, and arrays of
1 to 4097 int16 (numba copies them to the device and back around each launch). Issue 11 saw
`cuMemcpyDtoH` refuse such copy-backs remotely; this keeps them checked.

Runs unchanged on a local GPU or, under gpupool's libcuda.so.1, on a leased one; prints the same.
(numba-cuda 0.30 needs `numpy.row_stack` on numpy >= 2.5: the runner puts a sitecustomize on PYTHONPATH.)
"""

from __future__ import annotations

import enum
import sys
import warnings

import numpy as np
from _common import loaded_libcuda
from numba import cuda


class Color(enum.IntEnum):
    RED = 1
    GREEN = 2


@cuda.jit
def rounding(out, x):
    out[0] = round(x)


@cuda.jit
def pick(out, flag):
    out[0] = Color.GREEN if flag else Color.RED


@cuda.jit
def fill(out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = i * 2


def main() -> int:
    warnings.simplefilter("ignore")  # numba's performance advice about small grids and host arrays
    for dtype in (np.int64, np.int32, np.float64, np.int8):
        out = np.zeros(1, dtype=dtype)
        rounding[1, 1](out, 2.7)
        print("round", dtype.__name__, out.tolist())
    out = np.zeros(1, dtype=np.int64)
    pick[1, 1](out, True)
    print("enum", out.tolist())
    for n in (1, 2, 3, 7, 8, 100, 4097):
        out = np.zeros(n, dtype=np.int16)
        fill[(n + 63) // 64, 64](out)
        print("fill", n, int(out.astype(np.int64).sum()))
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
