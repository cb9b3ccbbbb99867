"""Shared bits of the GPU remote-execution programs: a PTX module and which libcuda.so.1 this process loaded."""

from __future__ import annotations

# saxpy: y[i] = a * x[i] + y[i]; spin: a loop of `iters` dependent FMAs per thread (compute-bound);
# empty: nothing (launch-bound). PTX, so the driver compiles it for whatever GPU runs it.
PTX = r"""
.version 7.8
.target sm_75
.address_size 64

.visible .entry saxpy(.param .u64 x, .param .u64 y, .param .f32 a, .param .u32 n)
{
    .reg .pred p;
    .reg .b32 r<5>;
    .reg .f32 f<4>;
    .reg .b64 rd<8>;
    ld.param.u64 rd1, [x];
    ld.param.u64 rd2, [y];
    ld.param.f32 f1, [a];
    ld.param.u32 r1, [n];
    mov.u32 r2, %ctaid.x;
    mov.u32 r3, %ntid.x;
    mov.u32 r4, %tid.x;
    mad.lo.s32 r2, r2, r3, r4;
    setp.ge.u32 p, r2, r1;
    @p bra DONE;
    cvta.to.global.u64 rd3, rd1;
    cvta.to.global.u64 rd4, rd2;
    mul.wide.u32 rd5, r2, 4;
    add.s64 rd6, rd3, rd5;
    add.s64 rd7, rd4, rd5;
    ld.global.f32 f2, [rd6];
    ld.global.f32 f3, [rd7];
    fma.rn.f32 f3, f1, f2, f3;
    st.global.f32 [rd7], f3;
DONE:
    ret;
}

.visible .entry spin(.param .u64 out, .param .u32 iters)
{
    .reg .pred p;
    .reg .b32 r<6>;
    .reg .f32 f<3>;
    .reg .b64 rd<4>;
    ld.param.u64 rd1, [out];
    ld.param.u32 r1, [iters];
    mov.u32 r2, %ctaid.x;
    mov.u32 r3, %ntid.x;
    mov.u32 r4, %tid.x;
    mad.lo.s32 r2, r2, r3, r4;
    cvt.rn.f32.u32 f1, r2;
    mov.f32 f2, 0f3F800000;
    mov.u32 r5, 0;
LOOP:
    fma.rn.f32 f1, f1, 0f3F7FFFFE, f2;
    add.u32 r5, r5, 1;
    setp.lt.u32 p, r5, r1;
    @p bra LOOP;
    cvta.to.global.u64 rd2, rd1;
    mul.wide.u32 rd3, r2, 4;
    add.s64 rd2, rd2, rd3;
    st.global.f32 [rd2], f1;
    ret;
}

.visible .entry empty()
{
    ret;
}
"""


def ok(result):
    """The values of a cuda.bindings call's result (driver or NVRTC); exits with the error's name otherwise."""
    err = result[0]
    if int(err) != 0:
        raise SystemExit(f"CUDA error {err.name} in {result}")
    return result[1] if len(result) == 2 else (result[1:] if len(result) > 2 else None)


def loaded_libcuda() -> str:
    """The file this process mapped as libcuda (gpupool's shim when run remotely)."""
    import os

    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            name = os.path.basename(path)
            if name.startswith("libcuda.so") or "_libcuda_shim" in name:
                return os.path.realpath(path)
    return "none"


def saxpy_node(func, x, y, a: float, n: int, keep: list, params=None):
    """A kernel node's parameters (CUDA_KERNEL_NODE_PARAMS, or `params` filled in) for saxpy over n floats,
    256 threads a block; the argument buffers go in `keep`, which must outlive the node's creation."""
    import ctypes

    from cuda.bindings import driver

    args = (ctypes.c_uint64(int(x)), ctypes.c_uint64(int(y)), ctypes.c_float(a), ctypes.c_uint32(n))
    pointers = (ctypes.c_void_p * 4)(*[ctypes.addressof(v) for v in args])
    keep.append((args, pointers))
    params = params or driver.CUDA_KERNEL_NODE_PARAMS()
    params.func = func
    params.gridDimX, params.gridDimY, params.gridDimZ = (n + 255) // 256, 1, 1
    params.blockDimX, params.blockDimY, params.blockDimZ = 256, 1, 1
    params.sharedMemBytes = 0
    params.kernelParams = ctypes.addressof(pointers)
    return params
