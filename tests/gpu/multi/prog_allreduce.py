"""All-reduce bus bandwidth between the ranks' GPUs, as nccl-tests computes it: for each size from
1 MiB to 1 GiB, time `iters` all_reduce calls of a float32 tensor (after warm-up), algbw = bytes / time,
busbw = algbw * 2 (n - 1) / n. Rank 0 prints `busbw BYTES GB/s` per size.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from _ranks import join

SIZES = [1 << s for s in range(20, 31, 2)]  # 1, 4, 16, 64, 256 MiB, 1 GiB


def main() -> None:
    rank, world = join()
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
