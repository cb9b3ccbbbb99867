"""A bf16 GEMM loop for a fixed time window; prints achieved TFLOP/s as one JSON line.

    python pool_mps_gemm.py --start-at UNIX_TIME --seconds 15 [--size 8192]

All copies started together wait for the same --start-at, so their windows overlap exactly.
"""

import argparse
import json
import os
import time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("--start-at", type=float, default=0.0)
ap.add_argument("--seconds", type=float, default=15.0)
ap.add_argument("--size", type=int, default=8192)
args = ap.parse_args()

n = args.size
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
for _ in range(5):  # warm-up (cuBLAS heuristics, clocks)
    torch.matmul(a, b, out=c)
torch.cuda.synchronize()
while time.time() < args.start_at:
    time.sleep(0.01)
iters, t0 = 0, time.perf_counter()
while time.perf_counter() - t0 < args.seconds:
    for _ in range(10):
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    iters += 10
elapsed = time.perf_counter() - t0
tflops = 2 * n**3 * iters / elapsed / 1e12
print(
    json.dumps(
        {
            "tflops": tflops,
            "iters": iters,
            "seconds": elapsed,
            "lease": os.environ.get("GPUPOOL_LEASE_ID"),
            "sm_pct": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
        }
    ),
    flush=True,
)
