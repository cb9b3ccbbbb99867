"""PyTorch sharing CUDA tensors between processes (torch.multiprocessing, as a DataLoader's workers or
Hogwild training do): a child makes a tensor and puts it on a queue, the parent reads and uses it in
place. Under the hood: CUDA IPC memory and event handles between two processes of one lease.

Runs unchanged on a local GPU or, under gpupool's libcuda.so.1, on a leased one; prints the same.
"""

from __future__ import annotations

import sys

import torch
import torch.multiprocessing as mp
from _common import loaded_libcuda


def producer(queue, done) -> None:
    shared = torch.arange(1000, device="cuda", dtype=torch.float32) * 2
    queue.put(shared)
    done.wait()  # the tensor must outlive the parent's use of it


def main() -> int:
    mp.set_start_method("spawn")
    queue, done = mp.Queue(), mp.Event()
    child = mp.Process(target=producer, args=(queue, done))
    child.start()
    shared = queue.get(timeout=120)
    print("received on", shared.device.type, "sum", float(shared.sum()))
    shared.add_(1)  # written in place: the child's memory
    print("after an in-place add", float(shared[:3].sum()))
    del shared
    done.set()
    child.join(120)
    print("producer exit", child.exitcode)
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
