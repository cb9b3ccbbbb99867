"""JAX (XLA) through the driver: jit with XLA's autotuning on and default memory settings, grad,
lax.scan, FFT and an optax training loop.

XLA's autotuner may pick a different kernel from run to run, so each result is printed as whether it
matches a float64 NumPy reference (and the training's losses rounded), not as raw bytes.
"""

from __future__ import annotations

import sys

import numpy as np
from _common import loaded_libcuda


def close(got, want, tol=2e-2) -> bool:
    kind = np.complex128 if np.iscomplexobj(got) or np.iscomplexobj(want) else np.float64
    got, want = np.asarray(got, dtype=kind), np.asarray(want, dtype=kind)
    return bool(np.allclose(got, want, rtol=tol, atol=tol * max(1.0, float(np.abs(want).max()))))


def main() -> int:
    import jax
    import jax.numpy as jnp
    import optax

    print("devices", [d.platform for d in jax.devices()])
    rng = np.random.default_rng(0)
    a = rng.standard_normal((512, 256)).astype(np.float32)
    b = rng.standard_normal((256, 384)).astype(np.float32)
    matmul = jax.jit(lambda x, y: x @ y)
    print("jit_matmul", close(matmul(a, b), a.astype(np.float64) @ b))
    print("jit_matmul_bf16", close(matmul(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)).astype(np.float32),
                                   a.astype(np.float64) @ b, tol=6e-2))  # fmt: skip

    def loss(w, x):
        return jnp.sum(jnp.tanh(x @ w) ** 2)

    w = rng.standard_normal((256, 8)).astype(np.float32) * 0.1
    grad = jax.jit(jax.grad(loss))(w, a)
    t = np.tanh(a.astype(np.float64) @ w)
    print("grad", close(grad, a.T.astype(np.float64) @ (2 * t * (1 - t**2))))

    def body(carry, x):
        carry = carry * 0.5 + x
        return carry, carry.sum()

    xs = rng.standard_normal((64, 128)).astype(np.float32)
    final, sums = jax.jit(lambda xs: jax.lax.scan(body, jnp.zeros(128, jnp.float32), xs))(xs)
    ref, ref_sums = np.zeros(128), []
    for x in xs.astype(np.float64):
        ref = ref * 0.5 + x
        ref_sums.append(ref.sum())
    print("scan", close(final, ref) and close(sums, ref_sums))

    sig = rng.standard_normal((128, 256)).astype(np.float32)
    print("fft2", close(jnp.fft.fft2(sig), np.fft.fft2(sig.astype(np.float64)), tol=1e-3))
    print("rfft", close(jnp.fft.rfft(sig), np.fft.rfft(sig.astype(np.float64)), tol=1e-3))
    print("irfft", close(jnp.fft.irfft(jnp.fft.rfft(sig)), sig, tol=1e-3))

    # A small MLP regression trained with optax: the loss falls as natively.
    x = rng.standard_normal((1024, 32)).astype(np.float32)
    y = np.sin(x[:, :1]) + 0.1 * x[:, 1:2]
    params = {
        "w1": jnp.asarray(rng.standard_normal((32, 64)).astype(np.float32) * 0.2), "b1": jnp.zeros(64),
        "w2": jnp.asarray(rng.standard_normal((64, 1)).astype(np.float32) * 0.2), "b2": jnp.zeros(1),
    }  # fmt: skip

    def mse(p, x, y):
        h = jax.nn.relu(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] + p["b2"] - y) ** 2)

    opt = optax.adam(1e-2)
    state = opt.init(params)

    @jax.jit
    def train_step(p, s, x, y):
        value, g = jax.value_and_grad(mse)(p, x, y)
        updates, s = opt.update(g, s, p)
        return optax.apply_updates(p, updates), s, value

    losses = []
    for _ in range(200):
        params, state, value = train_step(params, state, x, y)
        losses.append(float(value))
    print("optax_loss_falls", losses[-1] < 0.25 * losses[0])
    print("optax_loss_first", f"{losses[0]:.3f}")
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
