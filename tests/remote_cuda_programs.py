"""cuda.bindings and cuda.core programs for the remote-execution tests (no GPU: the worker's host executor
runs the built-in kernels `add_u32` / `fill_u32` whatever the image says). Run: python THIS bindings|core
"""

from __future__ import annotations

import sys

import numpy as np


def bindings() -> None:
    from cuda.bindings import driver as d

    def ok(result):
        assert result[0] == d.CUresult.CUDA_SUCCESS, result
        return result[1] if len(result) == 2 else result[1:]

    ok(d.cuInit(0))
    dev = ok(d.cuDeviceGet(0))
    print("name", ok(d.cuDeviceGetName(64, dev)).rstrip(b"\0").decode())
    ctx = ok(d.cuDevicePrimaryCtxRetain(dev))
    ok(d.cuCtxSetCurrent(ctx))
    print("total", ok(d.cuDeviceTotalMem(dev)))
    a = np.arange(1000, dtype=np.uint32)
    p = ok(d.cuMemAlloc(a.nbytes))
    s = ok(d.cuStreamCreate(0))
    ok(d.cuMemcpyHtoDAsync(p, a.ctypes.data, a.nbytes, s))
    module = ok(d.cuModuleLoadData(b"// PTX would go here\n"))
    add = ok(d.cuModuleGetFunction(module, b"add_u32"))
    import ctypes

    args = ((p, 3, 1000), (None, ctypes.c_uint32, ctypes.c_uint32))
    ok(d.cuLaunchKernel(add, 4, 1, 1, 256, 1, 1, 0, s, args, 0))
    start, end = ok(d.cuEventCreate(0)), ok(d.cuEventCreate(0))
    ok(d.cuEventRecord(start, s))
    ok(d.cuEventRecord(end, s))
    b = np.zeros_like(a)
    ok(d.cuMemcpyDtoHAsync(b.ctypes.data, p, b.nbytes, s))
    ok(d.cuStreamSynchronize(s))
    print("added", bool((b == a + 3).all()))
    print("elapsed_ms_nonnegative", ok(d.cuEventElapsedTime(start, end)) >= 0)
    err, _ = d.cuMemAlloc(1 << 40)
    print("huge_alloc", err.name)
    print("error_string", ok(d.cuGetErrorString(d.CUresult.CUDA_ERROR_OUT_OF_MEMORY)).decode())


def core() -> None:
    try:
        from cuda.core import Buffer, Device, LaunchConfig, ObjectCode, launch
    except ImportError:  # cuda.core before 0.5 kept its API under .experimental
        from cuda.core.experimental import Buffer, Device, LaunchConfig, ObjectCode, launch

    dev = Device(0)
    dev.set_current()
    print("device", dev.name, dev.compute_capability.major)
    stream = dev.create_stream()
    kernel = ObjectCode.from_cubin(b"\0" * 64, name="fake").get_kernel("add_u32")
    host = np.arange(1000, dtype=np.uint32)
    buf = dev.memory_resource.allocate(host.nbytes, stream=stream)
    pinned = Buffer.from_handle(host.ctypes.data, host.nbytes)
    buf.copy_from(pinned, stream=stream)
    launch(stream, LaunchConfig(grid=4, block=256), kernel, buf, np.uint32(5), np.uint32(1000))
    buf.copy_to(pinned, stream=stream)
    stream.sync()
    print("added", bool((host == np.arange(1000) + 5).all()))
    buf.close(stream)
    stream.close()


if __name__ == "__main__":
    {"bindings": bindings, "core": core}[sys.argv[1]]()
