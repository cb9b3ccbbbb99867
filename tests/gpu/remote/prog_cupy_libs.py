"""CuPy's libraries through the CUDA runtime: cuFFT, cuSOLVER, cuSPARSE, cuRAND, CUB and Thrust, a
RawKernel, and copies through page-locked memory and on streams.

Each result is compared with a float64 NumPy/SciPy-free reference on the host (True/False), and the
bit-exact ones (sorts, integer scans, the generator's numbers) are hashed.
"""

from __future__ import annotations

import hashlib
import sys

import cupy as cp
import cupyx.scipy.sparse as sparse
import numpy as np
from _common import loaded_libcuda


def digest(a) -> str:
    return hashlib.sha256(np.ascontiguousarray(cp.asnumpy(a)).tobytes()).hexdigest()[:16]


def close(got, want, tol=1e-3) -> bool:
    got = cp.asnumpy(got).astype(np.complex128 if np.iscomplexobj(cp.asnumpy(got)) else np.float64)
    return bool(np.allclose(got, want, rtol=tol, atol=tol * max(1.0, float(np.abs(want).max()))))


def main() -> int:
    rng = np.random.default_rng(0)
    sig = rng.standard_normal((128, 256)).astype(np.float32)
    g = cp.asarray(sig)
    print("cufft_fft2", close(cp.fft.fft2(g), np.fft.fft2(sig.astype(np.float64))))
    print("cufft_rfft", close(cp.fft.rfft(g), np.fft.rfft(sig.astype(np.float64))))
    print("cufft_irfft", close(cp.fft.irfft(cp.fft.rfft(g), n=256), sig))
    print("cufft_c2c_f64", close(cp.fft.fft(g.astype(cp.complex128)), np.fft.fft(sig.astype(np.complex128))))

    m = rng.standard_normal((64, 64)) + 64 * np.eye(64)
    rhs = rng.standard_normal(64)
    print("cusolver_solve", close(cp.linalg.solve(cp.asarray(m), cp.asarray(rhs)), np.linalg.solve(m, rhs)))
    sym = m + m.T
    print("cusolver_eigh", close(cp.linalg.eigvalsh(cp.asarray(sym)), np.linalg.eigvalsh(sym)))
    print(
        "cusolver_svd",
        close(cp.linalg.svd(cp.asarray(m), compute_uv=False), np.linalg.svd(m, compute_uv=False)),
    )
    print("cusolver_qr", close(cp.abs(cp.linalg.qr(cp.asarray(m))[1]), np.abs(np.linalg.qr(m)[1])))

    dense = rng.standard_normal((200, 300)) * (rng.random((200, 300)) < 0.05)
    vec = rng.standard_normal(300)
    csr = sparse.csr_matrix(cp.asarray(dense))
    print("cusparse_spmv", close(csr @ cp.asarray(vec), dense @ vec))
    mat = rng.standard_normal((300, 16))
    print("cusparse_spmm", close(csr @ cp.asarray(mat), dense @ mat))
    print("cusparse_csr_to_dense", close(csr.toarray(), dense))
    left = rng.standard_normal(200)
    print("cusparse_transpose", close(csr.T.tocsr() @ cp.asarray(left), dense.T @ left))

    gen = cp.random.default_rng(1234)
    print("curand_normal", digest(gen.standard_normal(4096, dtype=cp.float32)))
    cp.random.seed(99)
    print("curand_legacy_uniform", digest(cp.random.uniform(size=4096, dtype=cp.float32)))

    ints = cp.asarray(rng.integers(0, 1 << 30, 1 << 16, dtype=np.int64))
    print("cub_sum", int(ints.sum()) == int(cp.asnumpy(ints).sum()))
    print("cub_cumsum", digest(cp.cumsum(ints)))
    print("thrust_sort", digest(cp.sort(ints)))
    print("thrust_argsort", bool(cp.all(cp.diff(ints[cp.argsort(ints)]) >= 0)))

    raw = cp.RawKernel(
        r"""extern "C" __global__ void square(const double *x, double *y, int n) {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) y[i] = x[i] * x[i];
        }""",
        "square",
    )
    x = cp.asarray(rng.standard_normal(10000))
    y = cp.empty_like(x)
    raw((40,), (256,), (x, y, cp.int32(x.size)))
    print("raw_kernel", bool(cp.array_equal(y, x * x)))

    pinned = cp.cuda.alloc_pinned_memory(1 << 20)
    host = np.frombuffer(pinned, dtype=np.float32, count=1 << 18)
    host[:] = rng.standard_normal(1 << 18).astype(np.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    dev = cp.empty(1 << 18, dtype=cp.float32)
    dev.set(host, stream=stream)
    back = np.empty_like(host)
    doubled = dev * 2
    doubled.get(stream=stream, out=back)
    stream.synchronize()
    print("pinned_async_copies", bool(np.array_equal(back, host * 2)))
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
