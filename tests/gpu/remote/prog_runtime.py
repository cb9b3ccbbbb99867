"""The CUDA runtime API straight from Python: cuda.bindings.runtime, and cuda.core's runtime-backed
`Device.sync()`. Prints the same natively and remotely."""

from __future__ import annotations

import sys

import numpy as np
from _common import loaded_libcuda
from cuda.bindings import runtime as rt

try:
    from cuda.core import Device
except ImportError:
    from cuda.core.experimental import Device


def ok(result):
    err, *rest = result
    if err != rt.cudaError_t.cudaSuccess:
        raise RuntimeError(f"{err.name}")
    return rest[0] if len(rest) == 1 else rest


def main() -> int:
    print("device_count", ok(rt.cudaGetDeviceCount()))
    props = ok(rt.cudaGetDeviceProperties(0))
    print("device", props.name.split(b"\0")[0].decode(), props.major, props.minor)
    ok(rt.cudaSetDevice(0))
    host = np.arange(1 << 16, dtype=np.float32)
    back = np.zeros_like(host)
    dptr = ok(rt.cudaMalloc(host.nbytes))
    ok(rt.cudaMemcpy(dptr, host.ctypes.data, host.nbytes, rt.cudaMemcpyKind.cudaMemcpyHostToDevice))
    ok(rt.cudaMemset(dptr, 0, 16))
    stream = ok(rt.cudaStreamCreate())
    ok(
        rt.cudaMemcpyAsync(
            back.ctypes.data, dptr, host.nbytes, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost, stream
        )
    )
    ok(rt.cudaStreamSynchronize(stream))
    expected = host.copy()
    expected[:4] = 0
    print("memcpy_memset_roundtrip", bool(np.array_equal(back, expected)))
    event = ok(rt.cudaEventCreate())
    ok(rt.cudaEventRecord(event, stream))
    ok(rt.cudaEventSynchronize(event))
    free, total = ok(rt.cudaMemGetInfo())
    print("mem_info_consistent", 0 < free <= total)
    ok(rt.cudaFree(dptr))
    ok(rt.cudaDeviceSynchronize())
    dev = Device(0)
    dev.set_current()
    dev.sync()
    print("cuda_core_device_sync", True)
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
