"""One rank of a run started by torchrun (or with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT by hand): its
device, and NCCL's process group over the ranks."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def join() -> tuple[int, int]:
    """(rank, world size), with this process's GPU current and the process group up: NCCL, or gloo
    (through host memory) when DDP_BACKEND=gloo. The device is LOCAL_RANK modulo the devices this
    process sees: one per rank under `gpuattach run --spread`."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
    torch.cuda.set_device(local)
    backend = os.environ.get("DDP_BACKEND", "nccl")
    if backend == "nccl":
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    else:
        dist.init_process_group(backend)
    return rank, world
