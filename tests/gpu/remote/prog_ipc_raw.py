"""CUDA IPC through the driver API, as a producer and its consumer use it: the parent fills a 3 MiB and a
4 KiB allocation, records an interprocess event behind the fill, and hands a child the three IPC handles; the
child opens them, waits on the event on its own stream, reads both buffers, writes a pattern into each,
closes them; the parent then reads the child's writes. Under `gpuattach run --isolate` the two processes
have workers of their own (virtualize/server/_ipc_workers.py).

Runs unchanged on a local GPU or, under gpupool's libcuda.so.1, on a leased one; prints the same.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import numpy as np
from _common import loaded_libcuda, ok
from cuda.bindings import driver as cu

SIZES = (3 << 20, 4096)
# The IPC calls straight from the libcuda.so.1 this process loaded: their handles are 64-byte structs by value.
lib = ctypes.CDLL("libcuda.so.1")


class Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_ubyte * 64)]


def called(result: int, name: str) -> None:
    if result:
        raise SystemExit(f"{name} failed: CUDA error {result}")


def handle_of(getter: str, value: int) -> str:
    handle = Handle()
    called(getattr(lib, getter)(ctypes.byref(handle), ctypes.c_uint64(value)), getter)
    return bytes(handle.reserved).hex()


def opened(opener: str, hex_handle: str, *flags: int) -> int:
    value = ctypes.c_uint64()
    handle = Handle.from_buffer_copy(bytes.fromhex(hex_handle))
    called(getattr(lib, opener)(ctypes.byref(value), handle, *(ctypes.c_uint(f) for f in flags)), opener)
    return value.value


def context():
    ok(cu.cuInit(0))
    ctx = ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0))))
    ok(cu.cuCtxSetCurrent(ctx))


def read(ptr, size) -> np.ndarray:
    host = np.empty(size, np.uint8)
    ok(cu.cuMemcpyDtoH(host.ctypes.data, ptr, size))
    return host


def child() -> int:
    context()
    *memory, event = os.environ["IPC_HANDLES"].split()
    opened_event = opened("cuIpcOpenEventHandle", event)
    stream = ok(cu.cuStreamCreate(1))
    ok(cu.cuStreamWaitEvent(stream, opened_event, 0))
    ok(cu.cuStreamSynchronize(stream))
    for size, handle in zip(SIZES, memory, strict=True):
        ptr = opened("cuIpcOpenMemHandle_v2", handle, 1)  # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
        data = read(ptr, size)
        print(f"child sees {size} bytes: {bool((data == size % 251).all())}")
        ok(cu.cuMemsetD8(ptr, 0xAB, size))
        ok(cu.cuCtxSynchronize())
        ok(cu.cuIpcCloseMemHandle(ptr))
    ok(cu.cuEventDestroy(opened_event))
    return 0


def main() -> int:
    if "IPC_HANDLES" in os.environ:
        return child()
    context()
    stream = ok(cu.cuStreamCreate(1))
    buffers = [ok(cu.cuMemAlloc(size)) for size in SIZES]
    for ptr, size in zip(buffers, SIZES, strict=True):
        ok(cu.cuMemsetD8Async(ptr, size % 251, size, stream))
    event = ok(cu.cuEventCreate(6))  # CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS
    ok(cu.cuEventRecord(event, stream))
    handles = [handle_of("cuIpcGetMemHandle", int(ptr)) for ptr in buffers]
    handles.append(handle_of("cuIpcGetEventHandle", int(event)))
    result = subprocess.run([sys.executable, __file__], env={**os.environ, "IPC_HANDLES": " ".join(handles)},
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    print(result.stdout.strip() or f"child failed: {result.stderr.strip()[-300:]}")
    for ptr, size in zip(buffers, SIZES, strict=True):
        print(f"parent reads the child's write into {size} bytes: {bool((read(ptr, size) == 0xAB).all())}")
        ok(cu.cuMemFree(ptr))
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
