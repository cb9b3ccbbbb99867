"""Data-parallel training with PyTorch DDP over NCCL, one rank per process (torchrun, or RANK/WORLD_SIZE/
MASTER_ADDR/MASTER_PORT set by hand). Rank 0 prints `loss STEP VALUE` for each step (the mean over the
ranks) and `devices N` / `nccl VERSION`; deterministic, so native and remote runs print the same losses.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from _ranks import join
from torch.nn.parallel import DistributedDataParallel

STEPS, BATCH, WIDTH = 30, 64, 1024


def main() -> None:
    torch.use_deterministic_algorithms(True, warn_only=True)
    rank, world = join()
    torch.manual_seed(0)  # the same model on every rank (DDP also broadcasts rank 0's)
    model = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.GELU(), torch.nn.Linear(4 * WIDTH, 10)
    ).cuda()
    ddp = DistributedDataParallel(model, device_ids=[torch.cuda.current_device()])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(1234 + rank)  # each rank its own shard of the data
    if rank == 0:
        print("devices", torch.cuda.device_count(), flush=True)
        print("nccl", ".".join(map(str, torch.cuda.nccl.version())), flush=True)
    for step in range(STEPS):
        x = torch.randn(BATCH, WIDTH, generator=gen).cuda()
        y = torch.randint(0, 10, (BATCH,), generator=gen).cuda()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        if rank == 0:
            print(f"loss {step} {mean.item() / world:.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
