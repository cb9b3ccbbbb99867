"""The legacy launch API (deprecated since CUDA 4.0; issue 25): a function's block shape, shared size and
parameters set one by one (cuFuncSetBlockShape, cuFuncSetSharedSize, cuParamSetSize/i/f/v), launched by
cuLaunchGrid, cuLaunchGridAsync and cuLaunch; its bad uses (a parameter past the size set, a launch
before a block shape); cuCtxAttach / cuCtxDetach; texture references of a PTX module (`.texref`) bound to
memory and to an array and read by a kernel, their settings read back, a surface reference bound.
What each call answers is printed, so the native run says what the driver answers and the remote run
must say the same.

Runs unchanged on a local GPU or, under gpupool's libcuda.so.1, on a leased one; prints the same.
"""

from __future__ import annotations

import ctypes
import sys

import numpy as np
from _common import PTX, loaded_libcuda, ok
from cuda.bindings import driver as cu

U64, I32, U32 = ctypes.c_uint64, ctypes.c_int, ctypes.c_uint
# The deprecated entry points, straight from the libcuda.so.1 this process loaded (cuda.bindings' too).
lib = ctypes.CDLL("libcuda.so.1")
for name, args in {
    "cuFuncSetBlockShape": (U64, I32, I32, I32),
    "cuFuncSetSharedSize": (U64, U32),
    "cuParamSetSize": (U64, U32),
    "cuParamSeti": (U64, I32, U32),
    "cuParamSetf": (U64, I32, ctypes.c_float),
    "cuParamSetv": (U64, I32, ctypes.c_void_p, U32),
    "cuLaunch": (U64,),
    "cuLaunchGrid": (U64, I32, I32),
    "cuLaunchGridAsync": (U64, I32, I32, U64),
    "cuCtxAttach": (ctypes.POINTER(U64), U32),
    "cuCtxDetach": (U64,),
}.items():
    getattr(lib, name).argtypes = args
    getattr(lib, name).restype = ctypes.c_int


# A kernel reading a texture reference bound to linear memory (tex1Dfetch): out[i] = tex_in[i] * 3.
TEXREF_PTX = r"""
.version 7.8
.target sm_75
.address_size 64

.global .texref tex_in;
.global .surfref surf_out;

.visible .entry fetch3(.param .u64 out, .param .u32 n)
{
    .reg .pred p;
    .reg .b32 r<5>;
    .reg .f32 f<6>;
    .reg .b64 rd<4>;
    ld.param.u64 rd1, [out];
    ld.param.u32 r1, [n];
    mov.u32 r2, %ctaid.x;
    mov.u32 r3, %ntid.x;
    mov.u32 r4, %tid.x;
    mad.lo.s32 r2, r2, r3, r4;
    setp.ge.u32 p, r2, r1;
    @p bra DONE;
    tex.1d.v4.f32.s32 {f1, f2, f3, f4}, [tex_in, {r2}];
    mul.f32 f5, f1, 0f40400000;
    cvta.to.global.u64 rd2, rd1;
    mul.wide.u32 rd3, r2, 4;
    add.s64 rd2, rd2, rd3;
    st.global.f32 [rd2], f5;
DONE:
    ret;
}
"""


def texture_references(n: int) -> None:
    """Issue 25's legacy texture and surface references, each call's answer printed."""
    result = cu.cuModuleLoadData(TEXREF_PTX.encode())
    print("module with texture references", result[0].name)
    if result[0] != cu.CUresult.CUDA_SUCCESS:
        return
    module = result[1]
    tex = ok(cu.cuModuleGetTexRef(module, b"tex_in"))
    print("unknown reference", cu.cuModuleGetTexRef(module, b"nothing")[0].name)
    values, out = int(ok(cu.cuMemAlloc(4 * n))), int(ok(cu.cuMemAlloc(4 * n)))
    counting = np.arange(n, dtype=np.float32)  # held until copied
    ok(cu.cuMemcpyHtoD(values, counting.ctypes.data, 4 * n))
    print("format", cu.cuTexRefSetFormat(tex, cu.CUarray_format.CU_AD_FORMAT_FLOAT, 1)[0].name)
    print("bound to memory, offset", cu.cuTexRefSetAddress(tex, values, 4 * n))
    print("address read back", int(ok(cu.cuTexRefGetAddress(tex))) == values)
    fetch3 = ok(cu.cuModuleGetFunction(module, b"fetch3"))
    args = (U64(out), U32(n))
    pointers = (ctypes.c_void_p * 2)(*[ctypes.addressof(v) for v in args])
    launched = cu.cuLaunchKernel(
        fetch3, (n + 127) // 128, 1, 1, 128, 1, 1, 0, 0, ctypes.addressof(pointers), 0
    )
    print("kernel through the reference", launched[0].name, cu.cuCtxSynchronize()[0].name)
    got = np.empty(n, dtype=np.float32)
    ok(cu.cuMemcpyDtoH(got.ctypes.data, out, 4 * n))
    print("out = 3 x:", bool(np.array_equal(got, 3 * np.arange(n, dtype=np.float32))), got[:3])
    print("address mode", cu.cuTexRefSetAddressMode(tex, 0, cu.CUaddress_mode.CU_TR_ADDRESS_MODE_CLAMP)[0].name,
          cu.cuTexRefGetAddressMode(tex, 0))  # fmt: skip
    print("filter", cu.cuTexRefSetFilterMode(tex, cu.CUfilter_mode.CU_TR_FILTER_MODE_POINT)[0].name,
          cu.cuTexRefGetFilterMode(tex))  # fmt: skip
    print("flags", cu.cuTexRefSetFlags(tex, 1)[0].name, cu.cuTexRefGetFlags(tex))  # CU_TRSA_READ_AS_INTEGER
    print("format read back", cu.cuTexRefGetFormat(tex))
    print("max anisotropy", cu.cuTexRefSetMaxAnisotropy(tex, 4)[0].name, cu.cuTexRefGetMaxAnisotropy(tex))
    desc = cu.CUDA_ARRAY3D_DESCRIPTOR()
    desc.Width, desc.Height, desc.Format, desc.NumChannels = 64, 16, cu.CUarray_format.CU_AD_FORMAT_FLOAT, 1
    desc.Flags = cu.CUDA_ARRAY3D_SURFACE_LDST
    array = ok(cu.cuArray3DCreate(desc))
    print("bound to an array", cu.cuTexRefSetArray(tex, array, 1)[0].name,
          int(ok(cu.cuTexRefGetArray(tex))) == int(array))  # fmt: skip
    surf = cu.cuModuleGetSurfRef(module, b"surf_out")
    print("surface reference", surf[0].name)
    if surf[0] == cu.CUresult.CUDA_SUCCESS:
        print("surface bound", cu.cuSurfRefSetArray(surf[1], array, 0)[0].name,
              int(ok(cu.cuSurfRefGetArray(surf[1]))) == int(array))  # fmt: skip
    ok(cu.cuModuleUnload(module))
    ok(cu.cuArrayDestroy(array))
    for ptr in (values, out):
        ok(cu.cuMemFree(ptr))


def set_saxpy(f: int, x: int, y: int, a: float, n: int) -> list[int]:
    """saxpy(float *x, float *y, float a, unsigned n): 24 bytes of parameters, each at its offset."""
    return [
        lib.cuParamSetSize(f, 24),
        lib.cuParamSetv(f, 0, ctypes.byref(U64(x)), 8),
        lib.cuParamSetv(f, 8, ctypes.byref(U64(y)), 8),
        lib.cuParamSetf(f, 16, a),
        lib.cuParamSeti(f, 20, n),
    ]


def main() -> int:
    ok(cu.cuInit(0))
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    ctx = ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0))))
    ok(cu.cuCtxSetCurrent(ctx))
    module = ok(cu.cuModuleLoadData(PTX.encode()))
    saxpy = int(ok(cu.cuModuleGetFunction(module, b"saxpy")))
    empty = int(ok(cu.cuModuleGetFunction(module, b"empty")))
    n = 1000
    x, y = int(ok(cu.cuMemAlloc(4 * n))), int(ok(cu.cuMemAlloc(4 * n)))
    xs, ys = np.arange(n, dtype=np.float32), np.ones(n, dtype=np.float32)  # held until copied
    ok(cu.cuMemcpyHtoD(x, xs.ctypes.data, 4 * n))
    ok(cu.cuMemcpyHtoD(y, ys.ctypes.data, 4 * n))

    def read_y() -> np.ndarray:
        out = np.empty(n, dtype=np.float32)
        ok(cu.cuMemcpyDtoH(out.ctypes.data, y, 4 * n))
        return out

    print("block shape", lib.cuFuncSetBlockShape(saxpy, 128, 1, 1))
    print("shared size", lib.cuFuncSetSharedSize(saxpy, 256))
    print("parameters", set_saxpy(saxpy, x, y, 2.0, n))
    print("cuLaunchGrid 8x1", lib.cuLaunchGrid(saxpy, 8, 1), "sync", cu.cuCtxSynchronize()[0].name)
    got = read_y()
    print("y = 2x + 1:", bool(np.array_equal(got, 2 * np.arange(n, dtype=np.float32) + 1)), got[:4], got[-2:])
    stream = ok(cu.cuStreamCreate(0))
    print("parameters", set_saxpy(saxpy, x, y, 0.5, n))
    print("cuLaunchGridAsync 8x1", lib.cuLaunchGridAsync(saxpy, 8, 1, int(stream)))
    print("stream sync", cu.cuStreamSynchronize(stream)[0].name, read_y()[[0, 1, 511, 512, 999]])
    print("cuLaunch (one block)", lib.cuLaunch(saxpy), "sync", cu.cuCtxSynchronize()[0].name)
    print("y after one block", read_y()[[0, 1, 127, 128, 999]])
    # bad uses, each followed by a synchronise that shows the context unspoiled
    print("cuParamSeti past the size", lib.cuParamSeti(saxpy, 24, 1))
    print("cuParamSetv across the size", lib.cuParamSetv(saxpy, 20, ctypes.byref(U64(0)), 8))
    print("cuParamSetSize 5000", lib.cuParamSetSize(saxpy, 5000))
    print("cuParamSetSize 4096", lib.cuParamSetSize(saxpy, 4096))
    print("cuLaunch before a block shape", lib.cuLaunch(empty), "sync", cu.cuCtxSynchronize()[0].name)
    print("cuLaunchGrid 0x1", lib.cuLaunchGrid(saxpy, 0, 1), "sync", cu.cuCtxSynchronize()[0].name)
    # cuCtxAttach counts a use of the current context; cuCtxDetach takes it back
    attached = U64()
    print("cuCtxAttach", lib.cuCtxAttach(ctypes.byref(attached), 0), attached.value == int(ctx))
    print("cuCtxAttach flags 1", lib.cuCtxAttach(ctypes.byref(attached), 1))
    print("cuCtxDetach", lib.cuCtxDetach(attached.value), "then a copy", cu.cuMemsetD8(x, 0, 4)[0].name)
    ok(cu.cuCtxSynchronize())
    ok(cu.cuMemFree(x))
    ok(cu.cuMemFree(y))
    texture_references(n)
    old_abis(ctx)
    return 0


def old_abis(ctx) -> None:
    """The driver's pre-4.0 symbols called by name, as ctypes tools and old binaries call them: those cuda.h
    gives a current ABI's parameters (issue 25's LEGACY_ABIS) do what that ABI does."""
    vp, u64p = ctypes.c_void_p, ctypes.POINTER(U64)
    for name, args in {
        "cuStreamDestroy": (U64,),
        "cuEventDestroy": (U64,),
        "cuCtxPushCurrent": (U64,),
        "cuCtxPopCurrent": (u64p,),
        "cuCtxCreate": (u64p, U32, I32),
        "cuCtxDestroy": (U64,),
        "cuMemHostRegister": (vp, ctypes.c_size_t, U32),
    }.items():
        getattr(lib, name).argtypes = args
        getattr(lib, name).restype = ctypes.c_int
    stream, event = ok(cu.cuStreamCreate(0)), ok(cu.cuEventCreate(0))
    print("old cuStreamDestroy", lib.cuStreamDestroy(int(stream)))
    print("old cuEventDestroy", lib.cuEventDestroy(int(event)))
    popped = U64()
    print(
        "old cuCtxPushCurrent",
        lib.cuCtxPushCurrent(int(ctx)),
        "pop",
        lib.cuCtxPopCurrent(ctypes.byref(popped)),
        popped.value == int(ctx),
    )
    # The old cuCtxCreate makes a context of the 3.1 API (32-bit device pointers): driver 580 answers
    # CUDA_ERROR_OUT_OF_MEMORY, gpupool refuses it (NOT_SUPPORTED, naming cuCtxCreate_v4); both fail.
    created = U64()
    print("old cuCtxCreate fails", lib.cuCtxCreate(ctypes.byref(created), 0, 0) != 0)
    lib.cuCtxCreate_v2.argtypes, lib.cuCtxCreate_v2.restype = (u64p, U32, I32), ctypes.c_int
    print("cuCtxCreate_v2", lib.cuCtxCreate_v2(ctypes.byref(created), 0, 0))
    print("old cuCtxDestroy of it", lib.cuCtxDestroy(created.value))
    ok(cu.cuCtxSetCurrent(ctx))
    popped = U64()
    print("old cuCtxPopCurrent", lib.cuCtxPopCurrent(ctypes.byref(popped)), popped.value == int(ctx))
    print(
        "old cuCtxPushCurrent of a floating context",
        lib.cuCtxPushCurrent(int(ctx)),
        int(ok(cu.cuCtxGetCurrent())) == int(ctx),
    )
    ok(cu.cuCtxSetCurrent(ctx))
    page = ctypes.create_string_buffer(1 << 16)
    print(
        "old cuMemHostRegister",
        lib.cuMemHostRegister(ctypes.addressof(page), 1 << 16, 0),
        "registered:",
        cu.cuMemHostGetFlags(ctypes.addressof(page))[0].name,
    )
    ok(cu.cuMemHostUnregister(ctypes.addressof(page)))


if __name__ == "__main__":
    sys.exit(main())
