"""CuPy through the CUDA runtime: arrays, ufuncs, reductions, cuBLAS, RawKernel, ElementwiseKernel, streams.

Prints hashes of the exact result bytes, so a native and a remote run print the same lines.
"""

from __future__ import annotations

import hashlib
import sys

import cupy as cp
import numpy as np
from _common import loaded_libcuda


def digest(a) -> str:
    return hashlib.sha256(np.ascontiguousarray(cp.asnumpy(a)).tobytes()).hexdigest()[:16]


def main() -> int:
    print("device_count", cp.cuda.runtime.getDeviceCount())
    props = cp.cuda.runtime.getDeviceProperties(0)
    print("device", props["name"].decode(), props["major"], props["minor"])
    rng = np.random.default_rng(0)
    host = rng.standard_normal(1 << 18).astype(np.float32)
    x = cp.asarray(host)
    print("roundtrip", bool(np.array_equal(cp.asnumpy(x), host)))
    print("ufuncs", digest(cp.sin(x) * cp.exp(-cp.abs(x)) + 1))
    print("reductions", digest(cp.stack([x.sum(), x.mean(), x.max(), x.min()])))
    a = cp.asarray(rng.standard_normal((256, 384)).astype(np.float32))
    b = cp.asarray(rng.standard_normal((384, 128)).astype(np.float32))
    print("matmul_f32", digest(cp.matmul(a, b)))
    print("matmul_f16", digest(cp.matmul(a.astype(cp.float16), b.astype(cp.float16))))
    raw = cp.RawKernel(
        r"""extern "C" __global__ void twice(const float *x, float *y, int n) {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) y[i] = 2.0f * x[i];
        }""",
        "twice",
    )
    y = cp.empty_like(x)
    raw(((x.size + 255) // 256,), (256,), (x, y, cp.int32(x.size)))
    print("raw_kernel", bool(cp.array_equal(y, 2 * x)), digest(y))
    squared_diff = cp.ElementwiseKernel(
        "float32 a, float32 b", "float32 z", "z = (a - b) * (a - b)", "sqdiff"
    )
    print("elementwise_kernel", digest(squared_diff(x, y)))
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        z = cp.cumsum(x)
        done = stream.record()
    done.synchronize()
    # A float scan's summation order depends on timing (CUB's decoupled look-back): compare it to a
    # float64 reference instead of bit for bit.
    close = np.allclose(cp.asnumpy(z), np.cumsum(host.astype(np.float64)), rtol=1e-4, atol=1e-2)
    print("stream", close, stream.done)
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
