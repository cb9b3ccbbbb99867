"""Either keep the GPU busy for --seconds (small kernels in a loop) or hold memory and sleep."""

import argparse
import time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("mode", choices=["busy", "idle"])
ap.add_argument("--seconds", type=float, default=10.0)
args = ap.parse_args()
x = torch.randn(4096, 4096, device="cuda")
t0 = time.time()
while time.time() - t0 < args.seconds:
    if args.mode == "busy":
        for _ in range(20):
            x = torch.tanh(x @ x * 1e-3)
        torch.cuda.synchronize()
    else:
        time.sleep(0.5)
print("finished", flush=True)
