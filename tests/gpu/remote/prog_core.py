"""cuda.core: Program compile (NVRTC), Device, streams, stream-ordered pool allocations, launch, copies.

Runs unchanged on a local GPU or, under gpupool's libcuda.so.1, on a leased one; prints the same.
"""

from __future__ import annotations

import sys

import numpy as np
from _common import loaded_libcuda

try:
    from cuda.core import Buffer, Device, LaunchConfig, Program, ProgramOptions, launch
except ImportError:  # cuda.core before 0.5 kept its API under .experimental
    from cuda.core.experimental import Buffer, Device, LaunchConfig, Program, ProgramOptions, launch

SOURCE = r"""
extern "C" __global__ void scale_add(float *out, const float *in, float a, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * in[i] + out[i];
}
"""


def main() -> int:
    dev = Device(0)
    dev.set_current()
    print("compute capability major >= 7", dev.compute_capability.major >= 7)
    stream = dev.create_stream()
    program = Program(SOURCE, code_type="c++", options=ProgramOptions(arch=f"sm_{dev.arch}"))
    kernel = program.compile("cubin").get_kernel("scale_add")
    n = 1 << 20
    host_in = np.arange(n, dtype=np.float32)
    host_out = np.ones(n, dtype=np.float32)
    mr = dev.memory_resource  # stream-ordered pool allocations where the device supports them
    d_in = mr.allocate(host_in.nbytes, stream=stream)
    d_out = mr.allocate(host_out.nbytes, stream=stream)
    d_in.copy_from(Buffer.from_handle(host_in.ctypes.data, host_in.nbytes), stream=stream)
    d_out.copy_from(Buffer.from_handle(host_out.ctypes.data, host_out.nbytes), stream=stream)
    config = LaunchConfig(grid=(n + 255) // 256, block=256)
    for _ in range(4):
        launch(stream, config, kernel, d_out, d_in, np.float32(0.5), np.uint32(n))
    result = np.empty_like(host_out)
    d_out.copy_to(Buffer.from_handle(result.ctypes.data, result.nbytes), stream=stream)
    stream.sync()
    print("scale_add x4 matches numpy", bool(np.allclose(result, 1 + 4 * 0.5 * host_in)))
    print("checksum", f"{float(result.astype(np.float64).sum()):.1f}")
    other = dev.create_stream()
    event = stream.record()
    other.wait(event)
    other.sync()
    print("two streams synchronised", True)
    d_in.close(stream)
    d_out.close(stream)
    stream.sync()
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
