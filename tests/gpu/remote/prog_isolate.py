"""A parent process keeps a tensor on the GPU while a child process of the same run triggers a device-side
assert (torch._assert_async): natively, and remotely under `gpuattach run --isolate` (GPUPOOL_ISOLATE=1), the
child's context dies and the parent's tensors and kernels go on. Prints `name value` lines."""

import subprocess
import sys

import torch

if len(sys.argv) > 1 and sys.argv[1] == "child":
    x = torch.ones(1 << 20, device="cuda")
    try:
        torch._assert_async(torch.tensor(False, device="cuda"))
        torch.cuda.synchronize()
        print("child_error none")
    except Exception as exc:  # torch.AcceleratorError: CUDA error: device-side assert triggered
        print("child_error", "device-side assert" if "device-side assert" in str(exc) else type(exc).__name__)
    sys.exit(0)

a = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
child = subprocess.run([sys.executable, __file__, "child"], capture_output=True, text=True, timeout=120)
print(child.stdout.strip())
try:
    total = (a * 2).sum().item()
    print("parent_after_child", total == float((1 << 20) * ((1 << 20) - 1)))
except Exception as exc:
    print("parent_after_child", type(exc).__name__)
b = torch.randn(1024, 1024, device="cuda")
print("parent_matmul", bool(torch.isfinite(b @ b).all().item()))
