"""PyTorch allocations of many sizes, freed and made again, under its caching allocator, under
`cudaMallocAsync` and with expandable segments (the driver's virtual memory API): every byte keeps what was written, and every device address this process sees is
address space it holds reserved (a `---p` range of /proc/self/maps), natively (CUDA's unified
addressing) and remotely (the lease's window, issue 10). A device address that is host memory of the
program would break the shim's host/device test; this checks it never happens.

Runs unchanged on a local GPU or under gpupool's libcuda.so.1, on a leased one; prints the same.
"""

from __future__ import annotations

import os
import subprocess
import sys

import torch
from _common import loaded_libcuda


def reserved_ranges() -> list[tuple[int, int]]:
    out = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, perms = line.split()[:2]
            if perms.startswith("---p"):
                start, end = (int(x, 16) for x in span.split("-"))
                out.append((start, end))
    return out


def all_reserved(ptrs: list[int]) -> bool:
    ranges = reserved_ranges()
    return all(any(s <= p < e for s, e in ranges) for p in ptrs)


def churn(label: str) -> None:
    sizes = [1 + (i * 7919) % (1 << (i % 27)) for i in range(600)]  # 1 B .. 64 MiB, mixed
    tensors = [torch.full((n,), i % 251, dtype=torch.uint8, device="cuda") for i, n in enumerate(sizes)]
    print(
        f"{label}: {len(tensors)} tensors, {sum(sizes)} bytes, reserved {all_reserved([t.data_ptr() for t in tensors])}"
    )
    del tensors[::2]
    torch.cuda.empty_cache()  # hands memory back: frees, then new allocations
    more = [torch.full((n,), 7, dtype=torch.uint8, device="cuda") for n in sizes[::3]]
    kept = [t for t in tensors]
    ok = all(int(t.sum()) == t.numel() * int(t[0]) for t in kept) and all(
        int(t.sum()) == 7 * t.numel() for t in more
    )
    print(f"{label}: contents after churn {ok}, reserved {all_reserved([t.data_ptr() for t in kept + more])}")
    a = torch.arange(1 << 20, device="cuda", dtype=torch.float32).reshape(1024, 1024)
    print(f"{label}: matmul trace {int((a @ torch.eye(1024, device='cuda')).trace())}")
    del kept, more, a
    torch.cuda.synchronize()


def main() -> None:
    if "--child" in sys.argv:
        churn(os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "caching"))
        return
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    churn("caching")
    # Stream-ordered allocation (cuMemAllocAsync), and the virtual memory API (cuMemCreate, cuMemMap).
    for conf in ("backend:cudaMallocAsync", "expandable_segments:True"):
        env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": conf}
        child = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True, text=True)
        sys.stdout.write(child.stdout)
        sys.stderr.write(child.stderr)
        print("child exit", child.returncode)


if __name__ == "__main__":
    main()
