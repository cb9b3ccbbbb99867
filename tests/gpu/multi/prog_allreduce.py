"""All-reduce bus bandwidth between the ranks' GPUs, as nccl-tests computes it: for each size from
1 MiB to 1 GiB, time `iters` all_reduce calls of a float32 tensor (after warm-up), algbw = bytes / time,
busbw = algbw * 2 (n - 1) / n. Rank 0 prints `busbw BYTES GB/s` per size.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

SIZES = [1 << s for s in range(20, 31, 2)]  # 1, 4, 16, 64, 256 MiB, 1 GiB


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = (
        int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
    )  # one device per rank when spread
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    for size in SIZES:
        x = torch.ones(size // 4, device="cuda")
        iters = max(5, min(100, (4 << 30) // size))
        for _ in range(3):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / iters
        busbw = size / seconds * 2 * (world - 1) / world / 1e9
        if rank == 0:
            print(f"busbw {size} {busbw:.2f}", flush=True)
        del x
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
