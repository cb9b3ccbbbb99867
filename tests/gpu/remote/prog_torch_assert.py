"""A device-side assert in a subprocess, as PyTorch's test_cuda.py `test_fixed_cuda_assert_async` makes
one: natively only that subprocess's CUDA context dies. The parent holds tensors and runs kernels before
and after; a process started after the assert works too. Under gpupool each process of the lease has
contexts of its own in the worker, so the parent is untouched here as well.

Runs unchanged on a local GPU or, under gpupool's libcuda.so.1, on a leased one; prints the same.
"""

from __future__ import annotations

import subprocess
import sys

import torch
from _common import loaded_libcuda

ASSERTING = r"""
import torch
torch._assert_async(torch.tensor(0, device="cuda"))  # false: the kernel asserts on the GPU
try:
    torch.cuda.synchronize()
    print("synchronize: no error")
except RuntimeError as exc:
    print("synchronize: device-side assert", "device-side assert" in str(exc))
try:
    print("a later kernel:", float(torch.ones(4, device="cuda").sum()))
except RuntimeError as exc:
    print("a later kernel: fails, device-side assert", "device-side assert" in str(exc))
"""

LATER = r"""
import torch
x = torch.arange(1024, device="cuda", dtype=torch.float32)
print("a process started after:", float((x * 2).sum()))
"""


def child(code: str) -> None:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    for line in proc.stdout.splitlines():
        print("  child:", line)
    print("  child exit", "0" if proc.returncode == 0 else "non-zero")


def main() -> int:
    torch.manual_seed(0)
    a = torch.randn(512, 512, device="cuda")
    b = torch.randn(512, 512, device="cuda")
    before = (a @ b).sum().item()
    kept = a.clone()
    print("parent before:", round(before, 3))
    print("subprocess with a device-side assert:")
    child(ASSERTING)
    torch.cuda.synchronize()  # the parent's context is not the child's: no error here
    print("parent tensors intact:", torch.equal(a, kept))
    after = (a @ b).sum().item()
    print("parent kernels after:", round(after, 3), "same as before:", after == before)
    print("parent new allocation:", float(torch.full((1000,), 3.0, device="cuda").sum()))
    child(LATER)
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
