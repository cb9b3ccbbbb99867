"""PyTorch past the partition: the caching allocator's OOM is torch.OutOfMemoryError, as on a full GPU,
and the program goes on allocating within what is left. Prints what happened (remote runs only)."""

from __future__ import annotations

import sys

import torch

free, total = torch.cuda.mem_get_info()
print("total_bytes", total)
try:
    too_much = torch.empty(total + (1 << 30), dtype=torch.uint8, device="cuda")
    print("oom_raised none")
except torch.OutOfMemoryError as exc:
    print("oom_raised", type(exc).__name__, "partition" if "GiB total capacity" in str(exc) else "")
blocks = []
try:
    while True:  # fill the partition in 256 MiB blocks, as a growing model would
        blocks.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
except torch.OutOfMemoryError:
    print("filled_blocks_within_total", len(blocks) * (256 << 20) <= total, len(blocks) > 0)
blocks.clear()
torch.cuda.empty_cache()
x = torch.ones(1 << 20, device="cuda")
print("after_oom_works", float(x.sum()))
sys.exit(0)
