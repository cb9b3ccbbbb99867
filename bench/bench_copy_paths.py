"""What a small synchronous copy costs the driver by each way a worker could do it: python bench/bench_copy_paths.py

Natively, on the GPU server (needs cuda-bindings and a GPU; < 30 s). A remote synchronous copy is the
worker's own copy plus the transport, so the worker's copy must be faster than the program's would be
natively for a small remote copy to come near native speed (issue 31). For each size (4 KiB .. 1 MiB) and
direction it prints the median time of:

- pageable: the program's own call, cuMemcpyHtoD / cuMemcpyDtoH from / into pageable memory (what the
  worker does today with a frame's bytes);
- pageable, async + sync: cuMemcpy*Async on the legacy stream from / into the same pageable memory, then
  cuStreamSynchronize of the legacy stream;
- registered: the synchronous call from / into pageable memory the driver has page-locked
  (cuMemHostRegister), as the worker's frame buffer could be;
- staged: memcpy into (out of) a page-locked buffer, cuMemcpy*Async on the legacy stream, then
  cuStreamSynchronize.

Every variant is followed by cuCtxSynchronize, as bench_remote.py's copies are, so the rows compare.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time

SIZES = (4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", type=int, default=0, help="the GPU (default 0)")
    parser.add_argument("--reps", type=int, default=400, help="copies per measurement (default 400)")
    args = parser.parse_args()
    try:
        import numpy as np
        from cuda.bindings import driver as cu
    except ImportError as exc:
        raise SystemExit(f"bench_copy_paths: needs numpy and cuda-bindings ({exc})") from None

    def ok(result):
        if result[0] != cu.CUresult.CUDA_SUCCESS:
            raise SystemExit(f"bench_copy_paths: CUDA error {result[0].name}")
        return result[1] if len(result) == 2 else None

    try:
        ok(cu.cuInit(0))
    except Exception as exc:  # cuda-bindings raises when it finds no driver library at all
        raise SystemExit(
            f"bench_copy_paths: no NVIDIA driver here ({exc}); run it on the GPU server"
        ) from None
    ctx = ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(args.gpu))))
    ok(cu.cuCtxSetCurrent(ctx))
    top = SIZES[-1]
    dev = ok(cu.cuMemAlloc(top))
    pageable = np.ones(top, dtype=np.uint8)
    registered = np.ones(top, dtype=np.uint8)
    ok(cu.cuMemHostRegister(registered.ctypes.data, top, 1))  # PORTABLE
    staging = ok(cu.cuMemHostAlloc(top, 1))
    src = pageable.ctypes.data

    def variants(size: int, to_device: bool) -> dict:
        if to_device:
            return {
                "pageable": lambda: cu.cuMemcpyHtoD(dev, src, size),
                "pageable, async + sync": lambda: (
                    cu.cuMemcpyHtoDAsync(dev, src, size, 0),
                    cu.cuStreamSynchronize(0),
                ),
                "registered": lambda: cu.cuMemcpyHtoD(dev, registered.ctypes.data, size),
                "staged": lambda: (
                    ctypes.memmove(staging, src, size),
                    cu.cuMemcpyHtoDAsync(dev, staging, size, 0),
                    cu.cuStreamSynchronize(0),
                ),
            }
        return {
            "pageable": lambda: cu.cuMemcpyDtoH(src, dev, size),
            "pageable, async + sync": lambda: (
                cu.cuMemcpyDtoHAsync(src, dev, size, 0),
                cu.cuStreamSynchronize(0),
            ),
            "registered": lambda: cu.cuMemcpyDtoH(registered.ctypes.data, dev, size),
            "staged": lambda: (
                cu.cuMemcpyDtoHAsync(staging, dev, size, 0),
                cu.cuStreamSynchronize(0),
                ctypes.memmove(src, staging, size),
            ),
        }

    rows = []
    for size in SIZES:
        for to_device in (True, False):
            cells = {}
            for name, copy in variants(size, to_device).items():
                copy()
                times = []
                for _ in range(args.reps):
                    t = time.perf_counter()
                    copy()
                    cu.cuCtxSynchronize()
                    times.append(time.perf_counter() - t)
                cells[name] = statistics.median(times) * 1e6
            rows.append((size, "HtoD" if to_device else "DtoH", cells))
    names = list(rows[0][2])
    print("| copy | " + " | ".join(names) + " |")
    print("| --- |" + " --- |" * len(names))
    for size, direction, cells in rows:
        label = f"{direction} {size >> 10} KiB"
        print(f"| {label} | " + " | ".join(f"{cells[n]:.1f} µs" for n in names) + " |")
    ok(cu.cuMemHostUnregister(registered.ctypes.data))
    ok(cu.cuMemFreeHost(staging))
    ok(cu.cuMemFree(dev))


if __name__ == "__main__":
    main()
