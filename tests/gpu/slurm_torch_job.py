"""The PyTorch program a Slurm job runs on its gpupool lease (tests/gpu/test_slurm_gpu.py): it prints
what it sees and computed as `name value` lines and exits 1 if a check fails.

    device_count 1                      the lease's GPUs, as the job sees them
    mem_total_gib 40.0                  remote: the partition; local: the GPU (without MPS)
    matmul_max_err 0.0                  a bf16 matmul against the same product on the CPU (fp32)
    loss_first 2.3 / loss_last 0.01     a small MLP trained for 200 steps on a fixed batch
    ok 1
"""

from __future__ import annotations

import os
import sys

import torch


def main() -> int:
    ok = True
    print("device_count", torch.cuda.device_count())
    print("device_name", torch.cuda.get_device_name(0).replace(" ", "_"))
    total = torch.cuda.get_device_properties(0).total_memory
    print("mem_total_gib", round(total / (1 << 30), 1))
    print("lease", os.environ.get("GPUPOOL_LEASE") or os.environ.get("GPUPOOL_LEASE_ID") or "-")
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(1024, 1024, generator=g), torch.randn(1024, 1024, generator=g)
    got = (a.cuda().bfloat16() @ b.cuda().bfloat16()).float().cpu()
    want = a.bfloat16().float() @ b.bfloat16().float()
    err = ((got - want).abs().max() / want.abs().max()).item()
    print("matmul_max_err", f"{err:.2e}")
    ok &= err < 2e-2
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(512, 256, device="cuda"), torch.randint(0, 10, (512,), device="cuda")
    losses = []
    for _ in range(200):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    print("loss_first", f"{losses[0]:.4f}")
    print("loss_last", f"{losses[-1]:.4f}")
    ok &= losses[-1] < losses[0] / 4
    torch.cuda.synchronize()
    print("ok", int(ok))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
