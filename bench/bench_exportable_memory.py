"""What lease memory made exportable would cost, and whether another process can map it at the same
address: the groundwork for IPC between process workers (`gpuattach run --isolate`, issue 25).

Run on a GPU machine: python bench/bench_exportable_memory.py [--rounds 50]

1. The worker's allocation path (`CudaExecutor.map_memory`: cuMemCreate, cuMemMap, cuMemSetAccess, then
   cuMemUnmap and cuMemRelease) timed per size, with no handle type (today) and with
   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR requested, rounds alternating; the median of each.
2. One process maps an exportable allocation in a reserved range, writes a pattern and exports a file
   descriptor; a second process (its own CUDA context, as a process worker is) imports it, reserves the
   same address, maps it there, reads the pattern and writes another, which the first then reads.
Prints one table and one line per check; exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np
from cuda.bindings import driver

POSIX_FD = driver.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
SIZES = (2 << 20, 64 << 20, 1 << 30)


def ok(result):
    err, *values = result
    if err != driver.CUresult.CUDA_SUCCESS:
        raise SystemExit(f"CUDA error {err.name}")
    return values[0] if len(values) == 1 else values


def context():
    ok(driver.cuInit(0))
    dev = ok(driver.cuDeviceGet(0))
    ctx = ok(driver.cuDevicePrimaryCtxRetain(dev))
    ok(driver.cuCtxSetCurrent(ctx))


def prop(exportable: bool):
    p = driver.CUmemAllocationProp()
    p.type = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    p.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    p.location.id = 0
    if exportable:
        p.requestedHandleTypes = POSIX_FD
    return p


def access():
    desc = driver.CUmemAccessDesc()
    desc.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    desc.location.id = 0
    desc.flags = driver.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    return [desc]


def map_at(base: int, size: int, handle) -> None:
    ok(driver.cuMemMap(base, size, 0, handle, 0))
    ok(driver.cuMemSetAccess(base, size, access(), 1))


def one_allocation(base: int, size: int, exportable: bool) -> tuple[float, float]:
    """The worker's map_memory and its undoing, timed: (allocate µs, free µs)."""
    t = time.perf_counter()
    handle = ok(driver.cuMemCreate(size, prop(exportable), 0))
    map_at(base, size, handle)
    mid = time.perf_counter()
    ok(driver.cuMemUnmap(base, size))
    ok(driver.cuMemRelease(handle))
    return (mid - t) * 1e6, (time.perf_counter() - mid) * 1e6


def cost(rounds: int) -> None:
    print("| size | allocate µs, today | allocate µs, exportable | free µs, today | free µs, exportable |")
    print("| --- | --- | --- | --- | --- |")
    for size in SIZES:
        base = ok(driver.cuMemAddressReserve(size, 0, 0, 0))
        times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for _ in range(rounds):
            for exportable in (False, True):
                times[exportable].append(one_allocation(int(base), size, exportable))
        ok(driver.cuMemAddressFree(base, size))
        med = {e: [statistics.median(t[i] for t in times[e]) for i in (0, 1)] for e in times}
        print(
            f"| {size >> 20} MiB | {med[False][0]:.1f} | {med[True][0]:.1f} | {med[False][1]:.1f} | {med[True][1]:.1f} |"
        )


def share() -> bool:
    size = 64 << 20
    base = int(ok(driver.cuMemAddressReserve(size, 0, 0, 0)))
    handle = ok(driver.cuMemCreate(size, prop(True), 0))
    map_at(base, size, handle)
    ok(driver.cuMemsetD32(base, 0x5A5A5A5A, size // 4))
    ok(driver.cuCtxSynchronize())
    fd = int(ok(driver.cuMemExportToShareableHandle(handle, POSIX_FD, 0)))
    child = subprocess.run(
        [sys.executable, __file__, "--import", str(fd), str(base), str(size)],
        pass_fds=[fd],
        capture_output=True,
        text=True,
        timeout=120,
    )
    os.close(fd)
    print(child.stdout.strip())
    if child.returncode:
        print(f"the importing process failed: {child.stderr.strip()[-400:]}")
    word = np.zeros(1, np.uint32)
    ok(driver.cuMemcpyDtoH(word.ctypes.data, base + size - 4, 4))
    seen = int(word[0]) == 0x0BADF00D
    print(f"the exporter reads the importer's write at its own address: {seen}")
    ok(driver.cuMemUnmap(base, size))
    ok(driver.cuMemRelease(handle))
    ok(driver.cuMemAddressFree(base, size))
    return child.returncode == 0 and seen


def import_side(fd: int, base: int, size: int) -> int:
    """The second process: the allocation mapped at the exporter's address, read, then written."""
    context()
    handle = ok(driver.cuMemImportFromShareableHandle(fd, POSIX_FD))
    err, got = driver.cuMemAddressReserve(size, 0, base, 0)
    same = err == driver.CUresult.CUDA_SUCCESS and int(got) == base
    print(f"the importer reserves the exporter's address: {same} ({err.name}, {int(got):#x} for {base:#x})")
    if not same:
        return 1
    map_at(base, size, handle)
    words = np.zeros(2, np.uint32)
    ok(driver.cuMemcpyDtoH(words.ctypes.data, base, 8))
    print(f"the importer reads the exporter's pattern: {bool((words == 0x5A5A5A5A).all())}")
    ok(driver.cuMemsetD32(base + size - 4, 0x0BADF00D, 1))
    ok(driver.cuCtxSynchronize())
    ok(driver.cuMemUnmap(base, size))
    ok(driver.cuMemRelease(handle))
    ok(driver.cuMemAddressFree(base, size))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=50, help="allocations timed per size and kind")
    parser.add_argument("--import", dest="imported", nargs=3, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.imported:
        return import_side(*args.imported)
    context()
    cost(args.rounds)
    return 0 if share() else 1


if __name__ == "__main__":
    sys.exit(main())
