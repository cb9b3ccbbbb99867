"""A memory pool shared between two processes (issue 11's IPC row, as cuda.core's IPC-enabled memory
resources do): the parent makes a pool that can be exported as a file descriptor, allocates from it
and fills the buffer, exports the pool and the pointer; a child process inherits the descriptor,
imports both, checks the bytes and overwrites them; the parent then sees the child's write.

Runs unchanged on a local GPU or, under gpupool's libcuda.so.1, on a leased one; prints the same.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
from _common import loaded_libcuda, ok
from cuda.bindings import driver as cu

N = 1 << 20


def parent() -> None:
    dev = ok(cu.cuDeviceGet(0))
    ok(cu.cuCtxSetCurrent(ok(cu.cuDevicePrimaryCtxRetain(dev))))
    props = cu.CUmemPoolProps()
    props.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    props.handleTypes = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    props.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    props.location.id = 0
    pool = ok(cu.cuMemPoolCreate(props))
    stream = ok(cu.cuStreamCreate(0))
    ptr = ok(cu.cuMemAllocFromPoolAsync(N, pool, stream))
    data = np.arange(N, dtype=np.uint8)
    ok(cu.cuMemcpyHtoDAsync(ptr, data.ctypes.data, N, stream))
    ok(cu.cuStreamSynchronize(stream))
    fd = int(ok(cu.cuMemPoolExportToShareableHandle(pool, props.handleTypes, 0)))
    share = ok(cu.cuMemPoolExportPointer(ptr))
    env = {**os.environ, "POOL_FD": str(fd), "POOL_SHARE": bytes(share.reserved).hex()}
    child = subprocess.run([sys.executable, __file__, "--child"], env=env, pass_fds=(fd,), capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    sys.stdout.write(child.stdout)
    sys.stderr.write(child.stderr)
    print("child exit", child.returncode)
    back = np.empty(N, dtype=np.uint8)
    ok(cu.cuMemcpyDtoH(back.ctypes.data, ptr, N))
    print("parent sees the child's write", bool((back == 7).all()))
    ok(cu.cuMemFreeAsync(ptr, stream))
    ok(cu.cuStreamSynchronize(stream))
    ok(cu.cuMemPoolDestroy(pool))
    print("pool destroyed")


def child() -> None:
    dev = ok(cu.cuDeviceGet(0))
    ok(cu.cuCtxSetCurrent(ok(cu.cuDevicePrimaryCtxRetain(dev))))
    kind = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    pool = ok(cu.cuMemPoolImportFromShareableHandle(int(os.environ["POOL_FD"]), kind, 0))
    share = cu.CUmemPoolPtrExportData()
    share.reserved = list(bytes.fromhex(os.environ["POOL_SHARE"]))
    ptr = ok(cu.cuMemPoolImportPointer(pool, share))
    seen = np.empty(N, dtype=np.uint8)
    ok(cu.cuMemcpyDtoH(seen.ctypes.data, ptr, N))
    print("child sees the parent's bytes", bool((seen == np.arange(N, dtype=np.uint8)).all()))
    ok(cu.cuMemsetD8(ptr, 7, N))
    ok(cu.cuCtxSynchronize())
    ok(cu.cuMemFree(ptr))
    print("child released its import")


def main() -> int:
    ok(cu.cuInit(0))
    if "--child" in sys.argv:
        child()
    else:
        print("libcuda", loaded_libcuda(), file=sys.stderr)
        parent()
    return 0


if __name__ == "__main__":
    sys.exit(main())
