"""A tensor-parallel forward of a transformer MLP block (Megatron style): the first linear layer split
by columns, the second by rows across the ranks, the partial outputs summed with all_reduce. Rank 0
also computes the unsplit block on its GPU and prints `tp_vs_full MAXDIFF`, and `out` lines (a
checksum and the first values) that native and remote runs must print alike.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from _ranks import join

TOKENS, HIDDEN = 256, 2048


def main() -> None:
    torch.use_deterministic_algorithms(True, warn_only=True)
    rank, world = join()
    gen = torch.Generator().manual_seed(7)  # the same full weights on every rank, made on the host
    w1 = torch.randn(HIDDEN, 4 * HIDDEN, generator=gen) / HIDDEN**0.5
    w2 = torch.randn(4 * HIDDEN, HIDDEN, generator=gen) / (4 * HIDDEN) ** 0.5
    x = torch.randn(TOKENS, HIDDEN, generator=gen)
    shard = 4 * HIDDEN // world
    cols = slice(rank * shard, (rank + 1) * shard)
    xs = x.cuda()
    partial = torch.nn.functional.gelu(xs @ w1[:, cols].cuda()) @ w2[cols, :].cuda()
    dist.all_reduce(partial)
    if rank == 0:
        full = torch.nn.functional.gelu(xs @ w1.cuda()) @ w2.cuda()
        print(f"tp_vs_full {(partial - full).abs().max().item():.3e}", flush=True)
        out = partial.cpu().double()
        print(f"out sum {out.sum().item():.9e}", flush=True)
        print("out first " + " ".join(f"{v:.7e}" for v in out.flatten()[:6].tolist()), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
