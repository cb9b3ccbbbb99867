"""Pools other than the device's default kind (issue 25): cuda.core's PinnedMemoryResource (the current
host pool, and one it creates) and ManagedMemoryResource — buffers the host fills through numpy, a
kernel adds to, the host reads back; pool attributes; buffers copied to and from device memory.

Runs unchanged on a local GPU or, under gpupool's libcuda.so.1, on a leased one; prints the same.
"""

from __future__ import annotations

import sys

import numpy as np
from _common import loaded_libcuda
from cuda.core import (
    Device,
    LaunchConfig,
    ManagedMemoryResource,
    PinnedMemoryResource,
    PinnedMemoryResourceOptions,
    Program,
    ProgramOptions,
    launch,
)

SOURCE = r"""
extern "C" __global__ void add(int *a, int v, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] += v;
}
"""


def main() -> int:
    dev = Device(0)
    dev.set_current()
    stream = dev.create_stream()
    options = ProgramOptions(std="c++17", arch=f"sm_{dev.arch}")
    add = Program(SOURCE, code_type="c++", options=options).compile("cubin").get_kernel("add")
    n = 50_000
    config = LaunchConfig(grid=(n + 255) // 256, block=256)
    resources = {
        "pinned (current pool)": PinnedMemoryResource(),
        "pinned (own pool)": PinnedMemoryResource(PinnedMemoryResourceOptions(max_size=64 << 20)),
        "managed": ManagedMemoryResource(),
    }
    for name, mr in resources.items():
        buf = mr.allocate(4 * n, stream=stream)
        words = np.from_dlpack(buf).view(np.int32)
        stream.sync()
        words[:] = np.arange(n, dtype=np.int32)
        # A kernel on a pinned pool's memory needs the device granted access to the pool first
        # (natively the current host pool faults without it): kernels touch managed memory only, pinned
        # pools go through copies.
        if name == "managed":
            launch(stream, config, add, buf, np.int32(3), np.uint32(n))
        else:
            words += 3
        stream.sync()
        after_kernel = (int(words[0]), int(words[n - 1]), int(words.sum(dtype=np.int64)))
        on_device = dev.memory_resource.allocate(4 * n, stream=stream)
        on_device.copy_from(buf, stream=stream)
        launch(stream, config, add, on_device, np.int32(10), np.uint32(n))
        buf.copy_from(on_device, stream=stream)
        stream.sync()
        print(name, "host", mr.is_host_accessible, "device", mr.is_device_accessible)
        print(name, "after a kernel", after_kernel, "after a round trip", int(words[0]), int(words[n - 1]))
        print(name, "in use while allocated", mr.attributes.used_mem_current >= 4 * n)
        on_device.close(stream)
        buf.close(stream)
        stream.sync()
        print(name, "in use after the free", mr.attributes.used_mem_current)
    resources["pinned (own pool)"].close()
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
