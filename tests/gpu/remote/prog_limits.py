"""What a lease enforces, seen from a program (cuda.bindings): run remotely by run.py.

quota      the partition is what the program sees; allocating beyond it is CUDA_ERROR_OUT_OF_MEMORY
isolation  addresses that are not this lease's memory are refused (GUESSED_ADDRESS: another lease's)
kill       launches and syncs in a loop until the worker dies under it; prints what CUDA said
two_gpus   two devices, memory on each, a peer copy (run natively and remotely, same output)
"""

from __future__ import annotations

import ctypes
import os
import sys
import time

import numpy as np
from _common import PTX, loaded_libcuda, ok
from cuda.bindings import driver as cu


def start(device: int = 0):
    ok(cu.cuInit(0))
    ctx = ok(cu.cuDevicePrimaryCtxRetain(device))
    ok(cu.cuCtxSetCurrent(ctx))
    return ctx


def quota() -> None:
    start()
    total = ok(cu.cuDeviceTotalMem(0))
    free, info_total = ok(cu.cuMemGetInfo())
    print("total_mem_bytes", total)
    print("mem_info_total_bytes", info_total)
    print("mem_info_free_within_partition", free <= total)
    err, _ = cu.cuMemAlloc(total + (1 << 20))
    print("alloc_beyond_partition", err.name)
    half = ok(cu.cuMemAlloc(total // 2))
    err, _ = cu.cuMemAlloc(total // 2 + (64 << 20))
    print("second_alloc_past_partition", err.name)
    ok(cu.cuMemFree(half))
    p = ok(cu.cuMemAlloc(total // 2))
    print("alloc_after_free", "CUDA_SUCCESS")
    ok(cu.cuMemFree(p))


def isolation() -> None:
    start()
    mine = ok(cu.cuMemAlloc(1 << 20))
    guessed = int(os.environ.get("GUESSED_ADDRESS") or "0", 0) or int(mine) + (64 << 30)
    print("guessed_address", hex(guessed))
    if int(mine) <= guessed < int(mine) + (1 << 20):
        print("guessed address is this lease's own buffer: the check below is void", file=sys.stderr)
    err = cu.cuMemsetD8(guessed, 0, 16)[0]
    print("memset_foreign_returns", err.name, "(asynchronous)")
    print("next_sync", cu.cuCtxSynchronize()[0].name)
    out = np.zeros(16, dtype=np.uint8)
    print("copy_from_foreign", cu.cuMemcpyDtoH(out.ctypes.data, guessed, 16)[0].name)
    print("copy_past_own_end", cu.cuMemcpyDtoH(out.ctypes.data, int(mine) + (1 << 20) - 8, 16)[0].name)
    print("own_memory_still_fine", cu.cuMemsetD8(mine, 1, 16)[0].name, cu.cuCtxSynchronize()[0].name)


def kill() -> None:
    start()
    module = ok(cu.cuModuleLoadData(PTX.encode()))
    spin = ok(cu.cuModuleGetFunction(module, b"spin"))
    out = ok(cu.cuMemAlloc(4 * 256 * 1024))
    args = ((out, 20000), (None, ctypes.c_uint32))
    deadline = time.monotonic() + 120
    i = 0
    while time.monotonic() < deadline:
        err = cu.cuLaunchKernel(spin, 1024, 1, 1, 256, 1, 1, 0, 0, args, 0)[0]
        if err == cu.CUresult.CUDA_SUCCESS:
            err = cu.cuCtxSynchronize()[0]
        if err != cu.CUresult.CUDA_SUCCESS:
            print("iteration", i, "error", err.name, flush=True)
            sys.exit(1)
        i += 1
        if i == 5:
            print("running", flush=True)
    print("never interrupted", flush=True)


def two_gpus() -> None:
    ok(cu.cuInit(0))
    print("devices", ok(cu.cuDeviceGetCount()))
    ctxs, ptrs = [], []
    for dev in range(2):
        ctx = start(dev)
        p = ok(cu.cuMemAlloc(1 << 20))
        ok(cu.cuMemsetD8(p, 0x20 + dev, 1 << 20))
        ok(cu.cuCtxSynchronize())
        ctxs.append(ctx)
        ptrs.append(p)
    ok(cu.cuMemcpyPeer(ptrs[0], ctxs[0], ptrs[1], ctxs[1], 1 << 19))
    ok(cu.cuCtxSetCurrent(ctxs[0]))
    out = np.zeros(1 << 20, dtype=np.uint8)
    ok(cu.cuMemcpyDtoH(out.ctypes.data, ptrs[0], out.nbytes))
    print("peer copied half", bool((out[: 1 << 19] == 0x21).all() and (out[1 << 19 :] == 0x20).all()))


if __name__ == "__main__":
    {"quota": quota, "isolation": isolation, "kill": kill, "two_gpus": two_gpus}[sys.argv[1]]()
    print("libcuda", loaded_libcuda(), file=sys.stderr)
