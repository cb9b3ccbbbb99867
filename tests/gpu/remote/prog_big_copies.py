"""Large copies both ways through PyTorch (the runtime's cudaMemcpyAsync from pageable memory), of
64 MiB and of an odd size, checked by a kernel on the device and by the host after the way back; and one
into page-locked memory. Over an encrypted connection (run.py --encrypt) the pageable ones go in pieces
across the process's extra connections (docs/remote.md, "lanes"); the output must not change.

Runs unchanged on a local GPU or, under gpupool's libcuda.so.1, on a leased one; prints the same.
"""

from __future__ import annotations

import hashlib
import sys

import torch
from _common import loaded_libcuda


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()[:16]


def main() -> int:
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    g = torch.Generator().manual_seed(7)
    for n in (64 << 20, (40 << 20) + 3):
        host = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)
        dev = host.cuda()  # to the device
        print(
            n,
            "sum on the device",
            int(dev.sum(dtype=torch.int64)),
            "on the host",
            int(host.sum(dtype=torch.int64)),
        )
        back = (dev ^ 0x5A).cpu()  # changed by a kernel, then to the host
        print(n, "back", digest(back), "expected", digest(host ^ 0x5A))
        print(
            n,
            "slice back",
            digest(dev[12345 : 12345 + (17 << 20)].cpu()),
            digest(host[12345 : 12345 + (17 << 20)]),
        )
    pinned = torch.empty(32 << 20, dtype=torch.uint8).pin_memory()
    dev = torch.arange(32 << 20, device="cuda", dtype=torch.int64).to(torch.uint8)
    pinned.copy_(dev, non_blocking=True)
    torch.cuda.synchronize()
    print("into page-locked memory", digest(pinned))
    return 0


if __name__ == "__main__":
    sys.exit(main())
