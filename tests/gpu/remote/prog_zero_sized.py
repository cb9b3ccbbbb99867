"""Copies and memsets of zero bytes, as XLA issues them (`cuMemcpyDtoDAsync` of nothing from and to address 0,
in JAX's own control-flow suite): each with a null address, an address no allocation holds and a real one,
and the synchronise after it (an asynchronous error would surface there). Prints the driver's answer to each.

Runs unchanged on a local GPU or, under gpupool's libcuda.so.1, on a leased one; prints the same.
"""

from __future__ import annotations

import ctypes
import sys

from _common import loaded_libcuda, ok
from cuda.bindings import driver


def name(result) -> str:
    err = result[0] if isinstance(result, tuple) else result
    return err.name.removeprefix("CUDA_ERROR_").removeprefix("CUDA_")


def main() -> None:
    ok(driver.cuInit(0))
    print("libcuda", loaded_libcuda(), file=sys.stderr)  # loaded at the first call
    dev = ok(driver.cuDeviceGet(0))
    ctx = ok(driver.cuDevicePrimaryCtxRetain(dev))
    ok(driver.cuCtxSetCurrent(ctx))
    stream = ok(driver.cuStreamCreate(0))
    real = ok(driver.cuMemAlloc(4096))
    host = ctypes.create_string_buffer(16)
    for label, ptr in (("null", 0), ("nowhere", 0x1234000), ("allocated", int(real))):
        calls = {
            "HtoD": lambda p: driver.cuMemcpyHtoD(p, host, 0),
            "DtoH": lambda p: driver.cuMemcpyDtoH(host, p, 0),
            "DtoD": lambda p: driver.cuMemcpyDtoD(p, p, 0),
            "HtoDAsync": lambda p: driver.cuMemcpyHtoDAsync(p, host, 0, stream),
            "DtoHAsync": lambda p: driver.cuMemcpyDtoHAsync(host, p, 0, stream),
            "DtoDAsync": lambda p: driver.cuMemcpyDtoDAsync(p, p, 0, stream),
            "Memcpy": lambda p: driver.cuMemcpy(p, p, 0),
            "MemcpyAsync": lambda p: driver.cuMemcpyAsync(p, p, 0, stream),
            "MemsetD8": lambda p: driver.cuMemsetD8(p, 7, 0),
            "MemsetD32": lambda p: driver.cuMemsetD32(p, 7, 0),
            "MemsetD8Async": lambda p: driver.cuMemsetD8Async(p, 7, 0, stream),
            "MemsetD16Async": lambda p: driver.cuMemsetD16Async(p, 7, 0, stream),
        }
        for what, call in calls.items():
            answer = name(call(ptr))
            synced = name(driver.cuStreamSynchronize(stream))
            print(f"zero {what} {label}: {answer}, then sync {synced}")
    print("after", name(driver.cuCtxSynchronize()), name(driver.cuMemsetD8(real, 1, 16)))
    ok(driver.cuMemFree(real))


if __name__ == "__main__":
    main()
