"""NCCL's cuMem transport by hand, between two processes on two GPUs: the parent (device 0) creates
memory shareable as a POSIX descriptor, fills it and exports it; the child (device 1) gets the
descriptor over a Unix socket (SCM_RIGHTS, as NCCL passes it), imports it, maps it in a range of its
own, grants device 1 access, reads and overwrites it; the parent sees the write. Twice: once exported
after mapping (NCCL's order), once imported before the parent maps it at all (the child writes first).
Prints the same lines natively and under gpupool's libcuda.so.1 (a lease of two GPUs). VMM_CHILD_DEVICE=0
puts the child on device 0 too (one GPU: the two processes still share the memory through the descriptor).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading

import numpy as np
from cuda.bindings import driver as cu

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "remote"))
from _common import loaded_libcuda, ok

POSIX = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR


def prop(device: int, handle_types=POSIX):
    p = cu.CUmemAllocationProp()
    p.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    p.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    p.location.id = device
    p.requestedHandleTypes = handle_types
    return p


def grant(ptr, size: int, device: int) -> None:
    access = cu.CUmemAccessDesc()
    access.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    access.location.id = device
    access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    ok(cu.cuMemSetAccess(ptr, size, [access], 1))


def context(device: int) -> None:
    ok(cu.cuCtxSetCurrent(ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(device))))))


def parent(order: str) -> None:
    context(0)
    size = int(ok(cu.cuMemGetAllocationGranularity(prop(0), cu.CUmemAllocationGranularity_flags(0)))) * 4
    handle = ok(cu.cuMemCreate(size, prop(0), 0))
    ptr = ok(cu.cuMemAddressReserve(size, 0, 0, 0))

    def map_here():
        ok(cu.cuMemMap(ptr, size, 0, handle, 0))
        grant(ptr, size, 0)

    if order == "after-map":
        map_here()
        data = (np.arange(size, dtype=np.uint32) % 251).astype(np.uint8)
        ok(cu.cuMemcpyHtoD(ptr, data.ctypes.data, size))
    fd = int(ok(cu.cuMemExportToShareableHandle(handle, POSIX, 0)))
    name = f"\0gpupool-vmm-share-{os.getpid()}-{order}"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(name)
    server.listen()

    def hand_out():
        conn, _ = server.accept()
        with conn:
            socket.send_fds(conn, [b"fd"], [fd])

    threading.Thread(target=hand_out, daemon=True).start()
    child = subprocess.run([sys.executable, __file__, "--child", name[1:], str(size), order], capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    sys.stdout.write(child.stdout)
    sys.stderr.write(child.stderr)
    print(order, "child exit", child.returncode)
    if order != "after-map":
        map_here()
    back = np.empty(size, dtype=np.uint8)
    ok(cu.cuMemcpyDtoH(back.ctypes.data, ptr, size))
    print(order, "parent sees the child's write", bool((back == 0xCD).all()))
    ok(cu.cuMemUnmap(ptr, size))
    ok(cu.cuMemRelease(handle))
    ok(cu.cuMemAddressFree(ptr, size))
    os.close(fd)


CHILD_DEVICE = int(os.environ.get("VMM_CHILD_DEVICE", "1"))


def child(name: str, size: int, order: str) -> None:
    context(CHILD_DEVICE)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect("\0" + name)
        _, fds, _, _ = socket.recv_fds(conn, 16, 1)
    handle = ok(cu.cuMemImportFromShareableHandle(fds[0], POSIX))
    os.close(fds[0])
    ptr = ok(cu.cuMemAddressReserve(size, 0, 0, 0))
    ok(cu.cuMemMap(ptr, size, 0, handle, 0))
    ok(cu.cuMemRelease(handle))  # the mapping keeps the memory, as NCCL relies on
    grant(ptr, size, CHILD_DEVICE)
    seen = np.empty(size, dtype=np.uint8)
    ok(cu.cuMemcpyDtoH(seen.ctypes.data, ptr, size))
    if order == "after-map":
        print(
            f"  child on device {CHILD_DEVICE} sees the parent's bytes",
            bool((seen == (np.arange(size) % 251)).all()),
        )
    ok(cu.cuMemsetD8(ptr, 0xCD, size))
    ok(cu.cuCtxSynchronize())
    ok(cu.cuMemUnmap(ptr, size))
    ok(cu.cuMemAddressFree(ptr, size))


def main() -> int:
    ok(cu.cuInit(0))
    if "--child" in sys.argv:
        child(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return 0
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    if int(ok(cu.cuDeviceGetCount())) < CHILD_DEVICE + 1:
        print(f"needs {CHILD_DEVICE + 1} devices")
        return 1
    for order in ("after-map", "import-first"):
        parent(order)
    return 0


if __name__ == "__main__":
    sys.exit(main())
