"""The driver's linker (cuLink*): two CUDA sources compiled separately to relocatable PTX with NVRTC,
one calling a device function the other defines, linked (one from memory, one from a file), loaded and
launched. Prints the same natively and, under gpupool's libcuda.so.1, remotely.
"""

from __future__ import annotations

import ctypes
import sys
import tempfile
from pathlib import Path

import numpy as np
from _common import loaded_libcuda, ok
from cuda.bindings import driver as cu
from cuda.bindings import nvrtc

LIBRARY = 'extern "C" __device__ float scale(float x) { return 3.0f * x + 1.0f; }'
KERNEL = """
extern "C" __device__ float scale(float x);
extern "C" __global__ void apply(float *v, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) v[i] = scale(v[i]);
}
"""


def ptx(source: str, name: bytes, arch: str) -> bytes:
    program = ok(nvrtc.nvrtcCreateProgram(source.encode(), name, 0, [], []))
    options = [b"--relocatable-device-code=true", f"--gpu-architecture={arch}".encode()]
    ok(nvrtc.nvrtcCompileProgram(program, len(options), options))
    size = ok(nvrtc.nvrtcGetPTXSize(program))
    text = b" " * size
    ok(nvrtc.nvrtcGetPTX(program, text))
    return text


def main() -> int:
    ok(cu.cuInit(0))
    dev = ok(cu.cuDeviceGet(0))
    attr = cu.CUdevice_attribute
    major = ok(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
    minor = ok(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
    ctx = ok(cu.cuDevicePrimaryCtxRetain(dev))
    ok(cu.cuCtxSetCurrent(ctx))
    arch = f"compute_{major}{minor}"
    library, kernel = ptx(LIBRARY, b"library.cu", arch), ptx(KERNEL, b"kernel.cu", arch)
    ptx_input = cu.CUjitInputType.CU_JIT_INPUT_PTX
    state = ok(cu.cuLinkCreate(0, [], []))
    ok(cu.cuLinkAddData(state, ptx_input, kernel, len(kernel), b"kernel.ptx", 0, [], []))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "library.ptx"
        path.write_bytes(library)
        ok(cu.cuLinkAddFile(state, ptx_input, str(path).encode(), 0, [], []))
    cubin, size = ok(cu.cuLinkComplete(state))
    image = ctypes.string_at(int(cubin), size)
    print("linked image is ELF", image[:4] == b"\x7fELF")
    module = ok(cu.cuModuleLoadData(image))
    ok(cu.cuLinkDestroy(state))
    apply = ok(cu.cuModuleGetFunction(module, b"apply"))
    n = 1000
    values = np.arange(n, dtype=np.float32)
    dv = ok(cu.cuMemAlloc(values.nbytes))
    ok(cu.cuMemcpyHtoD(dv, values.ctypes.data, values.nbytes))
    args = ((dv, n), (None, ctypes.c_uint32))
    ok(cu.cuLaunchKernel(apply, (n + 127) // 128, 1, 1, 128, 1, 1, 0, 0, args, 0))
    out = np.empty_like(values)
    ok(cu.cuMemcpyDtoH(out.ctypes.data, dv, out.nbytes))
    print("linked kernel computed 3x+1", bool(np.array_equal(out, 3 * values + 1)))
    print("sample", out[:4].tolist())
    print(f"libcuda {loaded_libcuda()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
