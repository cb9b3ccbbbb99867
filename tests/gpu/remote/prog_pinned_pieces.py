"""Large copies into page-locked memory in flight, as a training loop's metrics and an inference server's
outputs come back (`tensor.to("cpu", non_blocking=True)` into pinned tensors): 3, 17 and 64 MiB plus odd
bytes, on two streams, each stream's copy behind a kernel that writes its source, then one event per
stream; each buffer is read only once its event says done. Over TLS the copies of 2 MiB or more come back
in pieces on several connections at once: every byte must be where it belongs, and none before the event.

Runs unchanged on a local GPU or, under gpupool's libcuda.so.1, on a leased one; prints the same.
"""

from __future__ import annotations

import hashlib
import sys

import torch
from _common import loaded_libcuda


def main() -> None:
    torch.cuda.init()
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    torch.manual_seed(7)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    sizes = [3 * 2**20 + 5, 17 * 2**20 + 3, 64 * 2**20 + 1]
    for round_ in range(3):
        outs = []
        for i, n in enumerate(sizes):
            stream = streams[i % 2]
            with torch.cuda.stream(stream):
                source = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda")
                source.add_(round_ + i)  # a kernel ahead of the copy on the same stream
                target = torch.empty(n, dtype=torch.uint8, pin_memory=True)
                target.copy_(source, non_blocking=True)
                done = torch.cuda.Event()
                done.record(stream)
            outs.append((n, source, target, done))
        for n, source, target, done in outs:
            done.synchronize()
            digest = hashlib.sha256(target.numpy().tobytes()).hexdigest()[:16]
            same = torch.equal(target, source.cpu())
            print(f"round {round_} bytes {n} sha256 {digest} equal_to_device {same}")


if __name__ == "__main__":
    main()
