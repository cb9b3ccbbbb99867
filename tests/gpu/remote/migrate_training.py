"""Live migration on a host with two GPUs, in one command: python tests/gpu/remote/migrate_training.py

Each lease here runs on a worker of GPU 0 with the real CUDA executor; it is moved to GPU 1 from outside
(``WorkerHandle.migrate``: the request gpupool-server's ``POST /v1/admin/leases/{id}/migrate`` sends its
worker) while its program runs.

1. driver: a program of the driver API alone (ctypes on the shim) holds 256 MiB filled on a stream of
   its own, with an event, and an instantiated graph captured from that stream (a memset and a copy;
   the captured graph destroyed); moved; the same address, stream, event and graph work after the move.
2. cupy: a CuPy program (its own kernel, no library) holds 1 GiB filled with a pattern; moved; it
   checks the bytes and runs its kernel on them again.
2b. cupy_graph: a CuPy program captures its own kernel and a copy into a CUDA graph and replays it; moved;
   the graph replayed from the same start leaves the same bytes.
2c. graphed: a PyTorch training whose whole step (forward, backward, SGD with momentum) is one captured
   CUDA graph (torch.cuda.graph), replayed step by step: unmigrated, then moved to GPU 1 after step
   --at; the losses must be equal step for step.
3. pause: a PyTorch program holds N GiB (random int32, checksummed) for each N of --sizes; moved; the
   table prints bytes, objects re-created, pause, wait, the copy rate, the GPUs' used memory before and
   after (nvidia-smi), and whether the checksum and a kernel on the moved tensor hold.
1a. arrays: a driver API program holding a 2D CUDA array (a texture object over it, read by a kernel of
   hand-written PTX through tex.2d), a mipmapped array with a level filled, a surface object, and memory
   of its own virtual memory API (cuMemCreate: one allocation held, one let go of once mapped); moved;
   the arrays' and the memory's bytes, the texture object (the same value, read by the kernel on the
   target), the resources naming the arrays the program holds, the held handle mapped again.
1b. primary: a driver API program holding two references to its primary context (flags set, a stream, memory),
   run unmoved and moved: cuDevicePrimaryCtxGetState and what each release does are the same in both runs,
   and after the move the worker has no context left on GPU 0 (nvidia-smi's compute apps: the source's
   primary context and the lease's objects there were let go, not kept until the lease ends).
4. training: a GPT-2-style training (bench/train_models.py gpt2, seeded, deterministic) on GPU 0
   unmigrated (the reference losses), then again with the lease moved to GPU 1 after step --at; the
   losses must be equal step for step.
5. xserver: a driver API program (a PTX kernel, a stream, an event, 256 MiB) on GPU 0's worker moved to a
   receiving worker of GPU 1 (another process, as another gpupool-server starts one: ``--receive``, the
   one-time secret, TLS; docs/remote.md, Between servers); the shim reconnects there at its next call; the
   bytes, stream, event and kernel work after, and the old worker is gone.
5a. xserver_arrays: the arrays part's program (1a) moved to a receiving worker of GPU 1 the same way: the arrays made
   anew with their bytes, the texture and surface objects with the same values (the kernel reads the texture by
   the value it holds), the program's own virtual memory at the same addresses.
5e. xserver_pause: the holder of 5 with each of --sizes GiB moved there: the pause against the memory, which
   crosses the link, not NVLink ($OUT/migrate_xserver_pause.md); with --stripes 1,4 a row for each number of
   connections the memory goes over (GPUPOOL_MIGRATE_STRIPES).
5b. xserver_training: the GPT-2 training moved there after step --at (its libraries, kernels, streams, events,
   memory, module globals and callback connection carried; the shim reconnects): losses equal an unmoved run's
   step for step. What the move does not carry yet is REFUSED up front, with the reason.
5f. xserver_expandable: the same with PyTorch's allocator in expandable segments
   (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: its memory is the program's own virtual memory).
5c. xserver_cupy_graph: the CuPy graph of 2b moved there (the graph read node by node on GPU 0's worker, built
   and instantiated anew by the receiving worker): replayed from the same start, it leaves the same bytes.
5d. xserver_graphed: the training of 2c (one captured CUDA graph a step) moved there after step --at: losses
   equal an unmoved run's step for step.
5g. xserver_item: a PyTorch program reads back 400 values a kernel has just written, twice each (`.item()`, and a
   non_blocking copy into fresh page-locked memory then a synchronise), before and after a move to another GPU
   of its worker, and to another server's worker as a client on another host and on that worker's host: no
   read may find the old value. Alone: ``--only xserver xserver_arrays xserver_training xserver_expandable
   xserver_cupy_graph xserver_graphed xserver_item``. (--client-env NAME=VALUE adds to the training client's
   environment in 5b and 5f.)

`--executor host --only driver` rehearses the steps on a machine without a GPU. A refused migration
prints its reason (REFUSED): the lease must keep running unharmed. Each step is
bounded by a timeout; the worker's log goes to stderr. The summary lists PASS / REFUSED / FAIL / SKIP;
the exit status is 1 unless every check passed. Results go to $OUT/migrate_results.json and the pause
table to $OUT/migrate_pause.md when $OUT is set:

    python3 tests/gpu/remote/migrate_training.py 2>&1 | tee $OUT/migrate.log
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))

from _pool import nvml_view_env  # noqa: E402

from server.workers import WorkerDevice, start_worker  # noqa: E402
from virtualize.client.remote import fresh_shim, remote_env  # noqa: E402
from virtualize.common import _wire  # noqa: E402

TRAIN_TIMEOUT_S = 150  # one training run
HOLD_TIMEOUT_S = 120  # a holder program from start to its last line
MIGRATE_TIMEOUT_S = 120
# Holds N GiB of random int32 (seeded) on the GPU; after the move: the checksum again, and a kernel on the
# moved tensor (x + 1 sums to the checksum plus its length).
HOLDER = """
import sys, torch
n = (int(sys.argv[1]) << 30) // 4
g = torch.Generator(device="cuda").manual_seed(1)
x = torch.randint(0, 1 << 20, (n,), dtype=torch.int32, device="cuda", generator=g)
# summed in 256 MiB pieces: a whole-tensor int64 sum would need twice the held memory again
def total(t):
    return sum(int(c.sum(dtype=torch.int64)) for c in t.split(1 << 26))
before = total(x)
torch.cuda.synchronize()
print("ready", before, flush=True)
sys.stdin.readline()
same = total(x) == before
x.add_(1)
ran = total(x) == before + n
print("after", same, ran, torch.cuda.mem_get_info()[1], flush=True)
"""
# CuPy without any NVIDIA library: its own kernel fills 1 GiB and checks it after the move.
CUPY_HOLDER = r"""
import sys, cupy
fill = cupy.RawKernel(r'''
extern "C" __global__ void fill(unsigned int *x, unsigned long long n, unsigned int salt) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        x[i] = (unsigned int)(i * 2654435761u) ^ salt;
}''', "fill")
n = (1 << 30) // 4
x = cupy.empty(n, dtype=cupy.uint32)
fill((1024,), (256,), (x, cupy.uint64(n), cupy.uint32(7)))
expect = cupy.empty_like(x)
fill((1024,), (256,), (expect, cupy.uint64(n), cupy.uint32(7)))
cupy.cuda.runtime.deviceSynchronize()
print("ready", bool((x == expect).all()), flush=True)
sys.stdin.readline()
same = bool((x == expect).all())
fill((1024,), (256,), (x, cupy.uint64(n), cupy.uint32(9)))
fill((1024,), (256,), (expect, cupy.uint64(n), cupy.uint32(9)))
print("after", same, bool((x == expect).all()), flush=True)
"""
# The start of a holder program that uses the driver API through ctypes (the shim's libcuda.so.1): `cu`, `ok`
# (a failed call prints `failed WHAT rc` and exits), `u64`.
DRIVER_PROLOGUE = r"""
import ctypes, sys
cu = ctypes.CDLL("libcuda.so.1")
def ok(rc, what):
    if rc:
        print("failed", what, rc, flush=True)
        sys.exit(1)
u64 = ctypes.c_uint64
"""
# The driver API alone (the shim's libcuda.so.1, no library): 256 MiB filled on a stream of its own with
# an event behind; after the move the same stream, event and address: the bytes, then a new fill.
DRIVER_HOLDER = (
    DRIVER_PROLOGUE
    + r"""
dev, ctx, ptr, stream, event = ctypes.c_int(), u64(), u64(), u64(), u64()
ok(cu.cuInit(0), "init"); ok(cu.cuDeviceGet(ctypes.byref(dev), 0), "device")
ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain"); ok(cu.cuCtxSetCurrent(ctx), "current")
n = 256 << 20
ok(cu.cuMemAlloc_v2(ctypes.byref(ptr), u64(n)), "alloc")
ok(cu.cuStreamCreate(ctypes.byref(stream), 1), "stream"); ok(cu.cuEventCreate(ctypes.byref(event), 0), "event")
# a graph captured from the stream: the first MiB set to a word, then copied to the second MiB
graph, exe, mib = u64(), u64(), 1 << 20
ok(cu.cuStreamBeginCapture_v2(stream, 2), "begin capture")
ok(cu.cuMemsetD32Async(ptr, ctypes.c_uint(0x0BADCAFE), u64(mib // 4), stream), "captured memset")
ok(cu.cuMemcpyDtoDAsync_v2(u64(ptr.value + mib), ptr, u64(mib), stream), "captured copy")
ok(cu.cuStreamEndCapture(stream, ctypes.byref(graph)), "end capture")
ok(cu.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, u64(0)), "instantiate")
ok(cu.cuGraphDestroy(graph), "graph destroyed")
def replayed():
    ok(cu.cuMemsetD8_v2(ptr, 0, u64(2 * mib)), "zeros")
    ok(cu.cuGraphLaunch(exe, stream), "graph launch"); ok(cu.cuStreamSynchronize(stream), "graph sync")
    back = ctypes.create_string_buffer(2 * mib)
    ok(cu.cuMemcpyDtoH_v2(back, ptr, u64(2 * mib)), "read the graph's")
    return back.raw == (0x0BADCAFE).to_bytes(4, "little") * (2 * mib // 4)
graph_ran = replayed()
def fill(word):
    ok(cu.cuMemsetD32Async(ptr, ctypes.c_uint(word), u64(n // 4), stream), "fill")
    ok(cu.cuEventRecord(event, stream), "record"); ok(cu.cuEventSynchronize(event), "event sync")
def same(word):
    back = ctypes.create_string_buffer(n)
    ok(cu.cuMemcpyDtoH_v2(back, ptr, u64(n)), "read")
    return back.raw == word.to_bytes(4, "little") * (n // 4)
fill(0x5A5AA5A5)
print("ready", same(0x5A5AA5A5) and graph_ran, flush=True)
sys.stdin.readline()
kept = same(0x5A5AA5A5)
fill(0x01020304)
ok(cu.cuStreamSynchronize(stream), "stream sync")
print("after", kept, same(0x01020304) and cu.cuEventQuery(event) == 0 and replayed(), flush=True)
"""
)
# What a move between servers carries (docs/remote.md, Between servers): the driver API alone, a PTX kernel, 256 MiB
# filled on a stream of its own with an event behind; after the move the same addresses, stream, event and kernel
# (the first MiB of words incremented once by the kernel before the move, once after).
SERVER_HOLDER = (
    DRIVER_PROLOGUE
    + r"""
PTX = b'''
.version 6.0
.target sm_52
.address_size 64
.visible .entry add_one(.param .u64 p, .param .u32 n)
{
    .reg .pred %p1;
    .reg .b32 %r<7>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [p];
    ld.param.u32 %r1, [n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r5, 4;
    add.s64 %rd2, %rd2, %rd3;
    ld.global.u32 %r6, [%rd2];
    add.s32 %r6, %r6, 1;
    st.global.u32 [%rd2], %r6;
DONE:
    ret;
}
'''
ctx, ptr, stream, event, module, fn = (u64() for _ in range(6))
ok(cu.cuInit(0), "init")
ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "retain"); ok(cu.cuCtxSetCurrent(ctx), "current")
n, words = (int(sys.argv[1]) if len(sys.argv) > 1 else 256) << 20, 1 << 20  # MiB held (default 256)
ok(cu.cuMemAlloc_v2(ctypes.byref(ptr), u64(n)), "alloc")
ok(cu.cuStreamCreate(ctypes.byref(stream), 1), "stream"); ok(cu.cuEventCreate(ctypes.byref(event), 0), "event")
ok(cu.cuModuleLoadData(ctypes.byref(module), PTX), "module")
ok(cu.cuModuleGetFunction(ctypes.byref(fn), module, b"add_one"), "add_one")
def fill(word):
    ok(cu.cuMemsetD32Async(ptr, ctypes.c_uint(word), u64(n // 4), stream), "fill")
    ok(cu.cuEventRecord(event, stream), "record"); ok(cu.cuEventSynchronize(event), "event sync")
def holds(head, rest):
    back = ctypes.create_string_buffer(n)
    ok(cu.cuMemcpyDtoH_v2(back, ptr, u64(n)), "read")
    return back.raw[: 4 * words] == head.to_bytes(4, "little") * words and \
        back.raw[4 * words :] == rest.to_bytes(4, "little") * (n // 4 - words)
def add_one():
    p, m = u64(ptr.value), ctypes.c_uint(words)
    params = (ctypes.c_void_p * 2)(ctypes.addressof(p), ctypes.addressof(m))
    ok(cu.cuLaunchKernel(fn, words // 256, 1, 1, 256, 1, 1, 0, stream, params, None), "launch")
    ok(cu.cuStreamSynchronize(stream), "stream sync")
fill(0x5A5AA5A5)
add_one()
print("ready", holds(0x5A5AA5A6, 0x5A5AA5A5), flush=True)
sys.stdin.readline()
kept = holds(0x5A5AA5A6, 0x5A5AA5A5)
fill(0x01020304)
add_one()
print("after", kept, holds(0x01020305, 0x01020304) and cu.cuEventQuery(event) == 0, flush=True)
"""
)
# CUDA arrays, a mipmapped array, a texture object read by a kernel (tex.2d), a surface object; after the move the
# same bytes under the same handles, and the kernel reads the texture (its value unchanged) on the target.
ARRAY_HOLDER = r"""
import ctypes, struct, sys
cu = ctypes.CDLL("libcuda.so.1")
def ok(rc, what):
    if rc:
        print("failed", what, rc, flush=True)
        sys.exit(1)
u64 = ctypes.c_uint64
PTX = b'''
.version 6.0
.target sm_52
.address_size 64
.visible .entry fetch_row(.param .u64 tex, .param .u64 out, .param .u32 row)
{
    .reg .f32 %f<7>;
    .reg .b32 %r<3>;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd1, [tex];
    ld.param.u64 %rd2, [out];
    ld.param.u32 %r1, [row];
    mov.u32 %r2, %tid.x;
    cvt.rn.f32.u32 %f1, %r2;
    cvt.rn.f32.u32 %f2, %r1;
    tex.2d.v4.f32.f32 {%f3, %f4, %f5, %f6}, [%rd1, {%f1, %f2}];
    cvta.to.global.u64 %rd3, %rd2;
    mul.wide.u32 %rd4, %r2, 4;
    add.s64 %rd3, %rd3, %rd4;
    st.global.f32 [%rd3], %f3;
    ret;
}
'''
class Desc(ctypes.Structure):  # CUDA_ARRAY3D_DESCRIPTOR
    _fields_ = [("Width", u64), ("Height", u64), ("Depth", u64), ("Format", ctypes.c_int),
                ("NumChannels", ctypes.c_uint), ("Flags", ctypes.c_uint)]
class Copy2D(ctypes.Structure):  # CUDA_MEMCPY2D
    _fields_ = [("srcXInBytes", ctypes.c_size_t), ("srcY", ctypes.c_size_t), ("srcMemoryType", ctypes.c_int),
                ("srcHost", ctypes.c_void_p), ("srcDevice", u64), ("srcArray", u64), ("srcPitch", ctypes.c_size_t),
                ("dstXInBytes", ctypes.c_size_t), ("dstY", ctypes.c_size_t), ("dstMemoryType", ctypes.c_int),
                ("dstHost", ctypes.c_void_p), ("dstDevice", u64), ("dstArray", u64), ("dstPitch", ctypes.c_size_t),
                ("WidthInBytes", ctypes.c_size_t), ("Height", ctypes.c_size_t)]
FLOAT, HOST, ARRAY, W, H = 0x20, 1, 3, 256, 64
ctx, array, mip, level, tex, surf_array, surf, module, fn, out = (u64() for _ in range(10))
ok(cu.cuInit(0), "init")
ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "retain"); ok(cu.cuCtxSetCurrent(ctx), "current")
ok(cu.cuArray3DCreate_v2(ctypes.byref(array), ctypes.byref(Desc(W, H, 0, FLOAT, 1, 0))), "array")
image = (ctypes.c_float * (W * H))(*(float(y * 1000 + x) for y in range(H) for x in range(W)))
def to_array(dst, host, width, rows):
    ok(cu.cuMemcpy2D_v2(ctypes.byref(Copy2D(srcMemoryType=HOST, srcHost=ctypes.addressof(host), srcPitch=4 * W,
                                            dstMemoryType=ARRAY, dstArray=dst, WidthInBytes=4 * width, Height=rows))), "fill")
def from_array(src, width, rows):
    back = (ctypes.c_float * (width * rows))()
    ok(cu.cuMemcpy2D_v2(ctypes.byref(Copy2D(srcMemoryType=ARRAY, srcArray=src, dstMemoryType=HOST,
                                            dstHost=ctypes.addressof(back), dstPitch=4 * width, WidthInBytes=4 * width,
                                            Height=rows))), "read")
    return bytes(back)
to_array(array.value, image, W, H)
ok(cu.cuMipmappedArrayCreate(ctypes.byref(mip), ctypes.byref(Desc(W, W, 0, FLOAT, 1, 0)), 3), "mipmapped")
ok(cu.cuMipmappedArrayGetLevel(ctypes.byref(level), mip, 1), "level")
to_array(level.value, image, W // 2, H)
level_bytes = from_array(level.value, W // 2, H)
res = ctypes.create_string_buffer(144); struct.pack_into("<iiQ", res, 0, 0, 0, array.value)
desc = ctypes.create_string_buffer(104); struct.pack_into("<3i", desc, 0, 1, 1, 1)  # clamp, point, unnormalized
ok(cu.cuTexObjectCreate(ctypes.byref(tex), res, desc, None), "texture")
ok(cu.cuArray3DCreate_v2(ctypes.byref(surf_array), ctypes.byref(Desc(W, H, 0, FLOAT, 1, 2))), "surface array")  # SURFACE_LDST
sres = ctypes.create_string_buffer(144); struct.pack_into("<iiQ", sres, 0, 0, 0, surf_array.value)
ok(cu.cuSurfObjectCreate(ctypes.byref(surf), sres), "surface")
ok(cu.cuModuleLoadData(ctypes.byref(module), PTX), "module"); ok(cu.cuModuleGetFunction(ctypes.byref(fn), module, b"fetch_row"), "fetch_row")
ok(cu.cuMemAlloc_v2(ctypes.byref(out), u64(4 * W)), "out")
def fetched(row):
    t, o, r = u64(tex.value), u64(out.value), ctypes.c_uint(row)
    params = (ctypes.c_void_p * 3)(*(ctypes.addressof(v) for v in (t, o, r)))
    ok(cu.cuLaunchKernel(fn, 1, 1, 1, W, 1, 1, 0, None, params, None), "launch"); ok(cu.cuCtxSynchronize(), "sync")
    back = (ctypes.c_float * W)()
    ok(cu.cuMemcpyDtoH_v2(back, out, u64(4 * W)), "read out")
    return list(back) == [float(row * 1000 + x) for x in range(W)]
def names(getter, handle, want):
    got = ctypes.create_string_buffer(144)
    ok(getter(got, handle), "resource")
    return struct.unpack_from("<Q", got.raw, 8)[0] == want
# The program's own virtual memory: one allocation it holds, one it let go of once mapped (its mapping keeps it).
class Prop(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("handle_types", ctypes.c_int), ("location_type", ctypes.c_int),
                ("location_id", ctypes.c_int), ("win32", ctypes.c_void_p), ("flags", u64)]
class Access(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location_type", ctypes.c_int), ("location_id", ctypes.c_int), ("flags", ctypes.c_int)]
VM = 2 << 20
va, held, gone = u64(), u64(), u64()
ok(cu.cuMemAddressReserve(ctypes.byref(va), u64(2 * VM), u64(0), u64(0), u64(0)), "reserve")
for i, handle in enumerate((held, gone)):
    ok(cu.cuMemCreate(ctypes.byref(handle), u64(VM), ctypes.byref(Prop(1, 0, 1, 0)), u64(0)), "create")
    ok(cu.cuMemMap(u64(va.value + i * VM), u64(VM), u64(0), handle, u64(0)), "map")
    ok(cu.cuMemSetAccess(u64(va.value + i * VM), u64(VM), ctypes.byref(Access(1, 0, 3)), u64(1)), "access")
    ok(cu.cuMemsetD32_v2(u64(va.value + i * VM), ctypes.c_uint(0x1000 + i), u64(VM // 4)), "fill")
ok(cu.cuMemRelease(gone), "let go")
def vm_same():
    back = ctypes.create_string_buffer(2 * VM)
    ok(cu.cuMemcpyDtoH_v2(back, va, u64(2 * VM)), "read vm")
    return back.raw == struct.pack("<I", 0x1000) * (VM // 4) + struct.pack("<I", 0x1001) * (VM // 4)
before = (tex.value, surf.value)
print("ready", fetched(10) and from_array(array.value, W, H) == bytes(image) and vm_same(), flush=True)
sys.stdin.readline()
kept = from_array(array.value, W, H) == bytes(image) and from_array(level.value, W // 2, H) == level_bytes
kept = kept and vm_same()
ok(cu.cuMemUnmap(va, u64(VM)), "unmap"); ok(cu.cuMemMap(va, u64(VM), u64(0), held, u64(0)), "map again")
ok(cu.cuMemSetAccess(va, u64(VM), ctypes.byref(Access(1, 0, 3)), u64(1)), "access again")
kept = kept and vm_same()
again = u64(); ok(cu.cuMipmappedArrayGetLevel(ctypes.byref(again), mip, 1), "level again")
same = (tex.value, surf.value) == before and again.value == level.value
named = names(cu.cuTexObjectGetResourceDesc, tex, array.value) and names(cu.cuSurfObjectGetResourceDesc, surf, surf_array.value)
print("after", kept and same and named, fetched(33), flush=True)
"""

# Two references to the primary context; after the move (or none) each release's effect on its state.
PRIMARY_HOLDER = (
    DRIVER_PROLOGUE
    + r"""
ctx, again, ptr, stream = u64(), u64(), u64(), u64()
ok(cu.cuInit(0), "init")
ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "retain"); ok(cu.cuCtxSetCurrent(ctx), "current")
ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(again), 0), "retain again")
ok(cu.cuDevicePrimaryCtxSetFlags(0, 4), "flags")
ok(cu.cuStreamCreate(ctypes.byref(stream), 1), "stream"); ok(cu.cuMemAlloc_v2(ctypes.byref(ptr), u64(64 << 20)), "alloc")
flags, active = ctypes.c_uint(), ctypes.c_int()
def state():
    ok(cu.cuDevicePrimaryCtxGetState(0, ctypes.byref(flags), ctypes.byref(active)), "state")
    return f"{flags.value}/{active.value}"
print("ready", state(), flush=True)
sys.stdin.readline()
states = [state()]
ok(cu.cuDevicePrimaryCtxRelease(0), "release")
states.append(state())
ok(cu.cuMemsetD8Async(ptr, 5, u64(64 << 20), stream), "memset"); ok(cu.cuStreamSynchronize(stream), "sync")
back = ctypes.create_string_buffer(4)
ok(cu.cuMemcpyDtoH_v2(back, ptr, u64(4)), "read")
states.append(back.raw.hex())
ok(cu.cuDevicePrimaryCtxRelease(0), "release")
states.append(state())
print("after", *states, flush=True)
"""
)
# CuPy's own kernel and a copy captured into a CUDA graph, replayed from zeros before and after the move.
CUPY_GRAPH_HOLDER = r"""
import hashlib, sys, cupy
step = cupy.RawKernel(r'''
extern "C" __global__ void step(const float *x, float *y, unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        y[i] = y[i] * 0.5f + x[i];
}''', "step")
n = 1 << 24
x = cupy.arange(n, dtype=cupy.float32) % 1000
y, z = cupy.zeros(n, dtype=cupy.float32), cupy.zeros(n, dtype=cupy.float32)
s = cupy.cuda.Stream(non_blocking=True)
with s:
    s.begin_capture()
    step((1024,), (256,), (x, y, cupy.uint64(n)))
    cupy.copyto(z, y)
    graph = s.end_capture()
def replayed():
    y.fill(0)
    z.fill(0)
    cupy.cuda.runtime.deviceSynchronize()
    for _ in range(3):
        graph.launch(s)
    s.synchronize()
    return hashlib.sha256(y.get().tobytes()).hexdigest(), bool((y == z).all())
before, copied = replayed()
print("ready", copied, flush=True)
sys.stdin.readline()
after, copied = replayed()
print("after", after == before, copied, flush=True)
"""
# A training whose whole step is one captured CUDA graph (torch.cuda.graph), replayed step by step; the
# lease may move after step `at` (the losses so far on the ready line, the rest on the after line).
GRAPHED_TRAINER = r"""
import sys, torch
steps, at = int(sys.argv[1]), int(sys.argv[2])
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1024),
                            torch.nn.GELU(), torch.nn.Linear(1024, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
loss_fn = torch.nn.CrossEntropyLoss()
g = torch.Generator(device="cuda").manual_seed(1)
data = torch.randn(steps, 512, 256, device="cuda", generator=g)
labels = torch.randint(0, 10, (steps, 512), device="cuda", generator=g)
static_x, static_y = data[0].clone(), labels[0].clone()
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):  # warm-up before capture, as PyTorch asks
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        loss_fn(model(static_x), static_y).backward()
        opt.step()
torch.cuda.current_stream().wait_stream(side)
graph = torch.cuda.CUDAGraph()
opt.zero_grad(set_to_none=True)
with torch.cuda.graph(graph):
    static_loss = loss_fn(model(static_x), static_y)
    static_loss.backward()
    opt.step()
losses = []
def run(steps_):
    for i in steps_:
        static_x.copy_(data[i])
        static_y.copy_(labels[i])
        graph.replay()
        losses.append(static_loss.item())
run(range(at))
print("ready", *map(repr, losses), flush=True)
sys.stdin.readline()
run(range(at, steps))
print("after", *map(repr, losses[at:]), flush=True)
"""
results: list[dict] = []
OUT_DIR = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
STARTED = time.monotonic()
BUDGET_S = [420.0]  # the whole run's (--budget): a part or size that would start later is skipped


def record(name: str, status: str, detail: str = "") -> None:
    results.append({"check": name, "status": status, "detail": detail})
    print(f"--> {status}: {name}" + (f" ({detail})" if detail else ""), flush=True)
    if OUT_DIR is not None:  # as it goes: a run cut short keeps what it found
        (OUT_DIR / "migrate_results.json").write_text(json.dumps(results, indent=1))


def out_of_time(name: str, needs: float) -> bool:
    left = BUDGET_S[0] - (time.monotonic() - STARTED)
    if left >= needs:
        return False
    record(name, "SKIP", f"{left:.0f} s of the run's budget left, it needs about {needs:.0f} s")
    return True


def gpus() -> list[tuple[int, str, int]]:
    out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,memory.total", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=60, check=True).stdout  # fmt: skip
    return [
        (int(i), u.strip(), int(m)) for i, u, m in (line.split(", ") for line in out.strip().splitlines())
    ]


def used_mib() -> str:
    """Each GPU's used memory (nvidia-smi), for the table: where the lease's memory is."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        return f"? ({exc})"
    return " ".join(f"{i}:{m.strip()}" for i, m in (line.split(",") for line in out.strip().splitlines()))


def lease_env(handle, shim: Path, work: Path) -> dict[str, str]:
    """What gpuattach gives a program of the lease: the shim, and NVML showing the lease's one GPU
    (PyTorch counts GPUs through NVML: on a host of two, a lease of one must not look like two)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env["PYTHONUNBUFFERED"] = "1"
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # cuBLAS deterministic across runs
    shim_env = remote_env(
        {"id": "migrate-test", "worker": handle.answer()}, cache_root=work / "cache", library=shim
    )
    view = (
        nvml_view_env(f"lease-{handle.pid}", handle.devices, shim_env, work) if EXECUTOR[0] == "cuda" else {}
    )
    return {**env, **shim_env, **view}


EXECUTOR = ["cuda"]  # --executor host: a rehearsal of this script's steps without a GPU (driver part only)


def worker_on(gpu: tuple[int, str, int], mem_gib: int, env: dict[str, str] | None = None):
    """A lease worker of `gpu` (`env`: added to its environment, e.g. GPUPOOL_MIGRATE_STRIPES)."""
    devices = [WorkerDevice(gpu[0], gpu[1], mem_gib << 30)]
    handle = start_worker("migrate-test", devices, bind_host="127.0.0.1", env=env or {}, executor=EXECUTOR[0])
    handle.devices = devices  # for the lease's NVML view
    return handle


def move(handle, to: tuple[int, str, int]) -> dict:
    started = time.monotonic()
    answer = handle.migrate(0, to[0], timeout=MIGRATE_TIMEOUT_S, uuid=to[1])
    print(f"    migrate -> GPU {to[0]}: {answer} ({time.monotonic() - started:.2f} s)", flush=True)
    return answer


def hold(
    code: str, args: list[str], handle, shim: Path, work: Path, to, probe=used_mib, mover=None, extra_env=None
) -> tuple[str, dict, str, list[str]]:
    """Start a holder, move its lease once it is ready (to None: no move; `mover()`: another move than to a
    GPU of its worker), let it check; (ready line, answer, after line, `probe()` before/after the move:
    nvidia-smi's used memory unless given). `extra_env`: added to the lease's environment (None: removed)."""
    env = {k: v for k, v in {**lease_env(handle, shim, work), **(extra_env or {})}.items() if v is not None}
    proc = subprocess.Popen([sys.executable, "-c", code, *args], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    killer = threading.Timer(HOLD_TIMEOUT_S, proc.kill)
    killer.start()
    try:
        first = proc.stdout.readline().strip()
        print(f"    holder: {first or '(nothing)'}", flush=True)
        if not first.startswith("ready"):
            proc.kill()
            return first, {"ok": False, "error": "the holder failed: " + proc.stderr.read()[-1500:]}, "", []
        smi = [probe()]
        answer = mover() if mover else move(handle, to) if to is not None else {"ok": True, "unmoved": True}
        smi.append(probe())
        out, err = proc.communicate("go\n", timeout=HOLD_TIMEOUT_S)
        after = next((line for line in out.splitlines() if line.startswith("after")), "")
        print(f"    holder: {after or '(nothing)'}", flush=True)
        if not after:
            print(out[-1000:], err[-3000:], flush=True)
        return first, answer, after, smi
    except subprocess.TimeoutExpired:
        proc.kill()
        return "", {"ok": False, "error": "the holder timed out"}, "", []
    finally:
        killer.cancel()
        if proc.poll() is None:
            proc.kill()


def outcome(name: str, answer: dict, intact: bool, detail: str) -> None:
    if not intact:
        record(name, "FAIL", f"the program's memory or kernels broke: {answer}")
    elif answer.get("ok"):
        record(name, "PASS", detail)
    else:
        record(name, "REFUSED", f"{answer.get('error')}; the program ran on unharmed")


def moved_holder(
    title: str, holder: str, mem_gib: int, check: str, shim: Path, work: Path, two: list
) -> None:
    """A program holding `holder`'s objects on GPU two[0], moved to two[1] while it waits; intact after?"""
    print(f"\n=== {title}, moved GPU {two[0][0]} -> {two[1][0]}", flush=True)
    handle = worker_on(two[0], mem_gib)
    try:
        first, answer, after, smi = hold(holder, [], handle, shim, work, two[1])
    finally:
        handle.stop()
    intact = first == "ready True" and after == "after True True"
    outcome(check, answer, intact,
            f"{answer.get('bytes', 0) >> 20} MiB, {answer.get('objects')} objects, paused {answer.get('pause_s', 0):.3f} s, "
            f"used MiB {smi}")  # fmt: skip


def arrays_check(shim: Path, work: Path, two: list) -> None:
    moved_holder("arrays: a CUDA array read by a kernel through a texture object, a mipmapped array, a surface",
                 ARRAY_HOLDER, 2, "CUDA arrays, a mipmapped array, texture and surface objects moved", shim, work, two)  # fmt: skip


def driver_check(shim: Path, work: Path, two: list) -> None:
    moved_holder("driver: 256 MiB, a stream, an event and a captured graph of the driver API", DRIVER_HOLDER, 2,
                 "driver API: memory, stream, event and a captured graph moved", shim, work, two)  # fmt: skip


def contexts_of(pid: int, uuid: str) -> str:
    """MiB process `pid` holds on GPU `uuid` (nvidia-smi's compute apps; "none": no context there)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        return f"? ({exc})"
    rows = [[field.strip() for field in line.split(",")] for line in out.strip().splitlines() if line.strip()]
    return next((row[2] for row in rows if row[:2] == [str(pid), uuid]), "none")


def primary_check(shim: Path, work: Path, two: list) -> None:
    print(f"\n=== primary: two references to the primary context, unmoved and moved GPU {two[0][0]} -> {two[1][0]}",
          flush=True)  # fmt: skip
    runs = {}
    for label, to in (("unmoved", None), ("moved", two[1])):
        handle = worker_on(two[0], 2)
        try:
            probe = lambda handle=handle: contexts_of(handle.pid, two[0][1])  # noqa: E731
            runs[label] = hold(PRIMARY_HOLDER, [], handle, shim, work, to, probe)
        finally:
            handle.stop()
        print(
            f"    [{label}] {runs[label][0]} | {runs[label][2]} | worker on GPU {two[0][0]}: {runs[label][3]} MiB"
        )
    (first, _, after, _), (moved_first, answer, moved_after, on_source) = runs["unmoved"], runs["moved"]
    same = bool(after) and first == moved_first and after == moved_after
    outcome("primary context: references and state after a move as in an unmoved run", answer, same,
            f"unmoved {after!r}, moved {moved_after!r}")  # fmt: skip
    if answer.get("ok") and EXECUTOR[0] == "cuda":  # the host executor has no GPU for nvidia-smi to see
        let_go = len(on_source) == 2 and on_source[1] == "none"
        record("the source GPU let go after the move (no context of the worker left there)",
               "PASS" if let_go else "FAIL", f"the worker's MiB on GPU {two[0][0]} before/after: {on_source}")  # fmt: skip


def cupy_check(shim: Path, work: Path, two: list) -> None:
    moved_holder(
        "cupy: 1 GiB held by a CuPy kernel", CUPY_HOLDER, 4, "cupy: 1 GiB and a kernel moved", shim, work, two
    )


def cupy_graph_check(shim: Path, work: Path, two: list) -> None:
    moved_holder("cupy_graph: a CUDA graph of CuPy's kernel and a copy, replayed", CUPY_GRAPH_HOLDER, 2,
                 "cupy: a captured CUDA graph moved, replayed the same", shim, work, two)  # fmt: skip


def graphed_training(shim: Path, work: Path, two: list, steps: int, at: int) -> None:
    print(f"\n=== graphed: a training step captured as one CUDA graph, {steps} steps, moved after step {at}",
          flush=True)  # fmt: skip
    runs = {}
    for label, to in (("reference", None), ("migrated", two[1])):
        handle = worker_on(two[0], 8)
        try:
            first, answer, after, _ = hold(GRAPHED_TRAINER, [str(steps), str(at)], handle, shim, work, to)
        finally:
            handle.stop()
        runs[label] = (graphed_losses(first, after), answer)
        print(f"[{label}] {len(runs[label][0])} steps", flush=True)
    (ref, _), (moved, answer) = runs["reference"], runs["migrated"]
    outcome("graphed training (one captured CUDA graph a step) migrated mid-run, losses equal", answer,
            losses_equal(ref, moved, steps), f"{answer.get('objects')} objects, paused {answer.get('pause_s', 0):.3f} s")  # fmt: skip


def graphed_losses(first: str, after: str) -> list[float]:
    """GRAPHED_TRAINER's losses, from its ready and after lines (none when it did not finish)."""
    return [float(v) for v in first.split()[1:] + after.split()[1:]] if after else []


def losses_equal(ref: list[float], moved: list[float], steps: int) -> bool:
    """Printed side by side; whether both runs have all `steps` losses and they are equal."""
    for i, (a, b) in enumerate(zip(ref, moved, strict=False)):
        print(f"{i:5d} {a:12.6f} {b:12.6f}{'' if a == b else '  DIFFERENT'}")
    return len(ref) == len(moved) == steps and ref == moved


def pause_row(gib: int, a: dict, intact: bool, extra: list[str] = ()) -> str:
    """A pause table's row: GiB held, MiB moved, objects, pause, wait, GB/s, `extra` columns, intact (or why not)."""
    more = "".join(f" {x} |" for x in extra)
    if not a.get("ok"):
        return f"| {gib} | - | - | - | - | - |{more} {intact}: {a.get('error')} |"
    rate = a["bytes"] / a["pause_s"] / 1e9 if a["pause_s"] else 0
    return (f"| {gib} | {a['bytes'] >> 20} | {a.get('objects', '?')} | {a['pause_s']:.3f} | {a['wait_s']:.3f} | "
            f"{rate:.2f} |{more} {intact} |")  # fmt: skip


def table_out(lines: list[str], out_dir: Path | None, name: str) -> None:
    print("\n".join(lines), flush=True)
    if out_dir is not None:
        (out_dir / name).write_text("\n".join(lines) + "\n")


def pause_table(shim: Path, work: Path, two: list, sizes: list[int], out_dir: Path | None) -> None:
    print("\n=== pause against device memory (PyTorch holders)", flush=True)
    rows = []
    for gib in sizes:
        if out_of_time(f"pause table {gib} GiB", 40):
            continue
        handle = worker_on(two[0], gib + 4)
        try:
            _, answer, after, smi = hold(HOLDER, [str(gib)], handle, shim, work, two[1])
        finally:
            handle.stop()
        rows.append((gib, answer, after.startswith("after True True"), smi))
    lines = ["| held GiB | moved MiB | objects | pause s | wait s | GB/s | used MiB before | after | intact |",
             "|---:|---:|---:|---:|---:|---:|---|---|---|"]  # fmt: skip
    for gib, a, intact, smi in rows:
        before, after = [*smi, "?", "?"][:2]
        lines.append(pause_row(gib, a, intact, [before, after]))
    table_out(lines, out_dir, "migrate_pause.md")
    for gib, a, intact, _ in rows:
        outcome(f"pause table {gib} GiB", a, intact, f"paused {a.get('pause_s', 0):.3f} s")


def train(env: dict[str, str], steps: int, at: int | None, mover) -> tuple[int, list[float], dict]:
    """Run the training; after step `at` ask for the move (`mover()`: its answer; on a thread: the training runs
    on meanwhile)."""
    cmd = [sys.executable, str(ROOT / "bench" / "train_models.py"), "gpt2", "--steps", str(steps)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killer = threading.Timer(TRAIN_TIMEOUT_S, proc.kill)
    killer.start()
    losses, answer, asked = [], {}, None
    try:
        for line in proc.stdout:
            if line.startswith("step "):
                losses.append(float(line.split()[3]))
                print(f"    {line.strip()}", flush=True)
                if at is not None and len(losses) == at and asked is None:
                    asked = threading.Thread(target=lambda: answer.update(mover()))
                    asked.start()
        proc.wait()
        if asked is not None:
            asked.join(MIGRATE_TIMEOUT_S + 10)
    finally:
        killer.cancel()
    if proc.returncode:
        print(proc.stderr.read()[-3000:], flush=True)
    return proc.returncode, losses, answer


def training(shim: Path, work: Path, two: list, steps: int, at: int) -> None:
    print(f"\n=== training: gpt2 {steps} steps on GPU {two[0][0]}, then moved to GPU {two[1][0]} after step {at}",
          flush=True)  # fmt: skip
    runs = {}
    for label, move_at in (("reference", None), ("migrated", at)):
        handle = worker_on(two[0], 40)
        try:
            started = time.monotonic()
            runs[label] = train(
                lease_env(handle, shim, work), steps, move_at, lambda h=handle: move(h, two[1])
            )
            print(f"[{label}] exit {runs[label][0]} in {time.monotonic() - started:.0f} s, {len(runs[label][1])} steps",
                  flush=True)  # fmt: skip
        finally:
            handle.stop()
    (ref_rc, ref, _), (rc, moved, answer) = runs["reference"], runs["migrated"]
    print(f"{'step':>5} {'reference':>12} {'migrated':>12}")
    for i, (a, b) in enumerate(zip(ref, moved, strict=False)):
        print(f"{i:5d} {a:12.5f} {b:12.5f}{'' if a == b else '  DIFFERENT'}")
    equal = ref_rc == 0 and rc == 0 and len(ref) == len(moved) == steps and ref == moved
    detail = (f"GPU {answer.get('from')} -> {answer.get('to')}, {answer.get('bytes', 0) >> 20} MiB, "
              f"{answer.get('objects')} objects, paused {answer.get('pause_s', 0):.3f} s")  # fmt: skip
    outcome("training migrated mid-run, losses equal step for step", answer, equal,
            detail if equal else f"exit {ref_rc}/{rc}, {len(ref)}/{len(moved)} steps")  # fmt: skip


def receiving_worker(source, gpu: tuple[int, str, int], mem_gib: int):
    """A worker of `gpu` that waits for `source`'s lease, as another gpupool-server starts one (--receive, the
    lease's secret, a one-time secret of its own); and where `source` is asked to move its lease."""
    devices = [WorkerDevice(gpu[0], gpu[1], mem_gib << 30)]
    target = start_worker("migrate-test", devices, bind_host="127.0.0.1", env={}, executor=EXECUTOR[0],
                          secret=source.secret, receive_s=MIGRATE_TIMEOUT_S)  # fmt: skip
    where = {"host": "127.0.0.1", "port": target.port, "migrate_port": target.migrate_port, "local": target.local,
             "tls_sha256": target.tls_sha256, "secret": target.migration_secret}  # fmt: skip
    return target, where


def send_to(source, where: dict, gpu: tuple[int, str, int]) -> dict:
    started = time.monotonic()
    answer = source.migrate_to_server(where, timeout=MIGRATE_TIMEOUT_S)
    print(f"    moved to the receiving worker of GPU {gpu[0]}: {answer} ({time.monotonic() - started:.2f} s)",
          flush=True)  # fmt: skip
    return answer


def xserver_check(shim: Path, work: Path, two: list) -> None:
    """Between two workers as two gpupool-servers start them (docs/remote.md, Between servers): a driver API
    program (a PTX kernel, a stream, an event, 256 MiB filled) on a worker of GPU 0 moves to a receiving
    worker of GPU 1 (another process: the link, TLS, the one-time secret; its memory, objects and state made
    there anew); at its next call the shim is told MOVED and reconnects there. PASS: the bytes, the stream, the
    event and the kernel work after the move, the old worker is gone and the new one serves the program."""
    moved_to_server("xserver: a driver API program", SERVER_HOLDER,
                    "xserver: a driver API program moved to another server's worker, intact", shim, work, two)  # fmt: skip


def xserver_arrays(shim: Path, work: Path, two: list) -> None:
    """The arrays part's program (a CUDA array read by a kernel through a texture object, a mipmapped array, a
    surface object, memory of its own virtual memory API) moved to a receiving worker of GPU 1 (docs/remote.md,
    Between servers: arrays made anew with their bytes, the texture and surface objects with the same values, the
    allocations mapped at the same addresses). PASS: the bytes, the handles and the kernel reading the texture
    by the value it holds work on the target."""
    moved_to_server("xserver_arrays: CUDA arrays, a texture read by a kernel, a surface, virtual memory",
                    ARRAY_HOLDER, "xserver_arrays: arrays, textures, surfaces and virtual memory moved to another "
                    "server's worker, intact", shim, work, two)  # fmt: skip


def moved_to_server(title: str, holder: str, check: str, shim: Path, work: Path, two: list) -> None:
    """A program holding `holder`'s objects on a worker of GPU two[0], moved to a receiving worker of two[1] while
    it waits; intact after, the old worker gone and the new one serving?"""
    print(
        f"\n=== {title}, moved from GPU {two[0][0]}'s worker to a receiving worker of GPU {two[1][0]}",
        flush=True,
    )
    source = worker_on(two[0], 4)
    target, where = receiving_worker(source, two[1], 4)
    try:
        first, answer, after, smi = hold(holder, [], source, shim, work, two[1],
                                         mover=lambda: send_to(source, where, two[1]),
                                         extra_env={"GPUPOOL_SHIM_SHARED_COPIES": "0"})  # fmt: skip
        time.sleep(1.0)  # the old worker exits once its process reconnected
        old_gone, new_serving = not source.alive(), target.alive()
    finally:
        source.stop()
        target.stop()
    intact = first == "ready True" and after == "after True True"
    outcome(check, answer, intact and old_gone and new_serving,
            f"{answer.get('bytes', 0) >> 20} MiB, {answer.get('objects')} objects, paused {answer.get('pause_s', 0):.3f} s, "
            f"old worker gone {old_gone}, used MiB {smi}")  # fmt: skip


def xserver_pause_table(shim: Path, work: Path, two: list, sizes: list[int], out_dir: Path | None,
                        stripes: list[int | None] | None = None, holder: str = SERVER_HOLDER) -> list[str]:  # fmt: skip
    """The pause of a move to another server's worker against the device memory held (`holder`, by default the
    driver API holder of `xserver`, GiB each), with the lease's memory over each of `stripes` connections of
    the link (GPUPOOL_MIGRATE_STRIPES of the sending worker; None: its default): the memory crosses the link
    (TLS over loopback here), not NVLink. The table's lines."""
    print("\n=== pause of a move to another server's worker against device memory", flush=True)
    lines = [
        "| held GiB | moved MiB | objects | pause s | wait s | GB/s | stripes | intact |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for gib in sizes:
        for count in stripes or [None]:
            if out_of_time(f"xserver pause {gib} GiB", 60):
                continue
            env = {} if count is None else {"GPUPOOL_MIGRATE_STRIPES": str(count)}
            source = worker_on(two[0], gib + 2, env)
            target, where = receiving_worker(source, two[1], gib + 2)
            try:
                first, a, after, _ = hold(holder, [str(gib << 10)], source, shim, work, two[1],
                                          probe=used_mib if EXECUTOR[0] == "cuda" else lambda: "",
                                          mover=lambda s=source, w=where: send_to(s, w, two[1]),
                                          extra_env={"GPUPOOL_SHIM_SHARED_COPIES": "0"})  # fmt: skip
            finally:
                source.stop()
                target.stop()
            intact = first == "ready True" and after == "after True True"
            lines.append(pause_row(gib, a, intact, [str(a.get("stripes", count or "-"))]))
            outcome(f"xserver pause {gib} GiB, {a.get('stripes', count)} stripe(s)", a, intact,
                    f"paused {a.get('pause_s', 0):.3f} s")  # fmt: skip
    table_out(lines, out_dir, "migrate_xserver_pause.md")
    return lines


def xserver_training(
    shim: Path, work: Path, two: list, steps: int, at: int, expandable: bool = False
) -> None:
    """The GPT-2 training's lease moved after step `at` from GPU 0's worker to a receiving worker of GPU 1, as
    another gpupool-server starts one (`expandable`: PyTorch's allocator in expandable segments, its memory the
    program's own virtual memory: cuMemCreate, cuMemMap). PASS: it moved and the losses equal an unmoved run's
    step for step; REFUSED: the move refused what it does not carry yet (the reason printed), the training
    unharmed."""
    name = "xserver_expandable" if expandable else "xserver_training"
    print(f"\n=== {name}: gpt2 {steps} steps on GPU {two[0][0]}, moved to a receiving worker of "
          f"GPU {two[1][0]} after step {at}", flush=True)  # fmt: skip
    runs = {}
    for label, move_at in (("reference", None), ("asked", at)):
        handle = worker_on(two[0], 40)
        target, where = receiving_worker(handle, two[1], 40) if move_at is not None else (None, {})
        try:
            # As a client on another host has it (a move between servers is for such clients): TCP with TLS,
            # no local socket, so nothing is shared with the worker's host (shared page-locked memory and
            # copies through shared memory cannot follow the lease to another server and are refused).
            env = {k: v for k, v in lease_env(handle, shim, work).items() if k != _wire.ENV_LOCAL}
            env["GPUPOOL_DATA_ENCRYPTION"] = "always"  # TLS over loopback too, as across hosts
            if expandable:
                env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
            env.update(CLIENT_ENV)
            runs[label] = train(env, steps, move_at, lambda h=handle, w=where: send_to(h, w, two[1]))
        finally:
            handle.stop()
            if target is not None:
                target.stop()
    (ref_rc, ref, _), (rc, moved, answer) = runs["reference"], runs["asked"]
    for i, (a, b) in enumerate(zip(ref, moved, strict=False)):
        print(f"{i:5d} {a:12.5f} {b:12.5f}{'' if a == b else '  DIFFERENT'}")
    equal = ref_rc == 0 and rc == 0 and len(ref) == len(moved) == steps and ref == moved
    outcome(f"{name}: a training moved to another server's worker mid-run, losses equal", answer, equal,
            f"{answer.get('bytes', 0) >> 20} MiB over {answer.get('stripes')} stripe(s), paused "
            f"{answer.get('pause_s', 0):.3f} s")  # fmt: skip


# As a client on another host has it (a move between servers is for such clients): TCP with TLS (loopback would
# be plaintext without GPUPOOL_DATA_ENCRYPTION=always; with TLS, copies of 4 MiB and more go across copy lanes),
# no local socket, no copies through shared memory (what only the worker's host has is refused by such a move).
REMOTE_HOST_ENV = {
    _wire.ENV_LOCAL: None,
    "GPUPOOL_SHIM_SHARED_COPIES": "0",
    "GPUPOOL_DATA_ENCRYPTION": "always",
}
CLIENT_ENV: dict[str, str] = {}  # --client-env: more of the training client's environment (xserver_training)


# Reads of a value a slow kernel has just written, as `.item()` and `non_blocking` copies read a loss: each read
# must see the new value (a copy that overtakes the kernel, or bytes that land after the synchronise, read the
# old one). Counted over many steps before the move and after it; page-locked blocks are made after it too.
ITEM_HOLDER = r"""
import sys, torch
n = int(sys.argv[1])
big = torch.randn(2048, 2048, device="cuda")
x = torch.zeros((), device="cuda")
def stale_reads(start):
    stale = []
    for i in range(n):
        x.add_(big.mm(big)[0, 0] * 0 + 1)  # written after a matmul: a copy run early reads the old value
        if x.item() != start + i + 1:
            stale.append(f"item@{i}")
        out = torch.empty((), pin_memory=True) if i % 7 == 0 else out
        out.copy_(x, non_blocking=True)
        torch.cuda.current_stream().synchronize()
        if out.item() != start + i + 1:
            stale.append(f"copy@{i}")
    return stale
def big_round_trip():  # 24 MiB to the device and back: across the copy lanes of an encrypted connection
    host = torch.randn(6 << 20)
    return [] if torch.equal(host.cuda().cpu(), host) else ["big"]
def counted(stale):
    return f"{len(stale)} {' '.join(stale[:12])}".strip()
print("ready", counted(stale_reads(0) + big_round_trip()), flush=True)
sys.stdin.readline()
print("after", counted(stale_reads(n) + big_round_trip()), flush=True)
"""


def xserver_moved(code: str, args: list[str], mem_gib: int, shim: Path, work: Path, two: list):
    """`code` on GPU two[0]'s worker, its lease moved once it is ready to a receiving worker of GPU two[1] (as
    another gpupool-server starts one); (ready line, answer, after line)."""
    source = worker_on(two[0], mem_gib)
    target, where = receiving_worker(source, two[1], mem_gib)
    try:
        first, answer, after, _ = hold(code, args, source, shim, work, two[1], extra_env=REMOTE_HOST_ENV,
                                       mover=lambda: send_to(source, where, two[1]))  # fmt: skip
    finally:
        source.stop()
        target.stop()
    return first, answer, after


def xserver_cupy_graph(shim: Path, work: Path, two: list) -> None:
    """A CuPy program's captured CUDA graph (its own kernel and a copy) moved to another server's worker: the
    graph read node by node here, built and instantiated anew there. PASS: replayed from the same start it
    leaves the same bytes; REFUSED: the reason printed, the program unharmed."""
    print(f"\n=== xserver_cupy_graph: a CuPy graph moved from GPU {two[0][0]}'s worker to a receiving worker of "
          f"GPU {two[1][0]}", flush=True)  # fmt: skip
    first, answer, after = xserver_moved(CUPY_GRAPH_HOLDER, [], 2, shim, work, two)
    outcome("xserver_cupy_graph: a captured CUDA graph moved to another server's worker, replayed the same",
            answer, first == "ready True" and after == "after True True",
            f"{answer.get('objects')} objects, paused {answer.get('pause_s', 0):.3f} s")  # fmt: skip


def xserver_graphed(shim: Path, work: Path, two: list, steps: int, at: int) -> None:
    """The training whose whole step is one captured CUDA graph (torch.cuda.graph), moved after step `at` to
    another server's worker. PASS: its losses equal an unmoved run's step for step; REFUSED: the reason
    printed (what the move does not carry), the training unharmed."""
    print(f"\n=== xserver_graphed: a training step captured as one CUDA graph, {steps} steps, moved to a "
          f"receiving worker of GPU {two[1][0]} after step {at}", flush=True)  # fmt: skip
    handle = worker_on(two[0], 8)
    try:
        first, _, after, _ = hold(GRAPHED_TRAINER, [str(steps), str(at)], handle, shim, work, None,
                                  extra_env=REMOTE_HOST_ENV)  # fmt: skip
    finally:
        handle.stop()
    ref = graphed_losses(first, after)
    first, answer, after = xserver_moved(GRAPHED_TRAINER, [str(steps), str(at)], 8, shim, work, two)
    outcome("xserver_graphed: a graphed training moved to another server's worker mid-run, losses equal",
            answer, losses_equal(ref, graphed_losses(first, after), steps),
            f"{answer.get('objects')} objects, paused {answer.get('pause_s', 0):.3f} s")  # fmt: skip


def xserver_item(shim: Path, work: Path, two: list, reads: int = 400) -> None:
    """Values a kernel has just written, read by the host (`.item()`, a non_blocking copy then a synchronise)
    `reads` times before and after a move: to another GPU of its worker, and to another server's worker as a
    client on another host has it and as a client on the receiving worker's host has it (the local socket,
    shared page-locked memory after the move). PASS: no read ever sees the old value."""
    for label, env, xserver in (
        ("another GPU of its worker", REMOTE_HOST_ENV, False),
        ("another server, a client on another host", REMOTE_HOST_ENV, True),
        ("another server, a client on its host", {_wire.ENV_LOCAL: None}, True),
    ):
        print(f"\n=== xserver_item ({label}): {reads} reads before and after a move from GPU {two[0][0]} to "
              f"GPU {two[1][0]}", flush=True)  # fmt: skip
        source = worker_on(two[0], 4)
        target, where = receiving_worker(source, two[1], 4) if xserver else (None, {})
        mover = (lambda s=source, w=where: send_to(s, w, two[1])) if xserver else None
        try:
            first, answer, after, _ = hold(ITEM_HOLDER, [str(reads)], source, shim, work, two[1], extra_env=env,
                                           mover=mover)  # fmt: skip
        finally:
            source.stop()
            if target is not None:
                target.stop()
        outcome(f"xserver_item ({label}): every read after the move sees the value just written", answer,
                first == "ready 0" and after == "after 0", f"{first}; {after} (stale reads counted)")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    parser.add_argument("--at", type=int, default=8, help="the step after which the lease moves (default 8)")
    parser.add_argument("--sizes", default="1,4,16", help="GiB held for the pause table (default 1,4,16)")
    parser.add_argument("--client-env", action="append", default=[], metavar="NAME=VALUE",
                        help="xserver_training/xserver_expandable: set this in the training client's "
                             "environment (repeatable; e.g. GPUPOOL_SHIM_SHARED_COPIES=0)")  # fmt: skip
    parser.add_argument("--stripes", default="",
                        help="xserver_pause: the connections the memory goes over, each a row (e.g. 1,4; default: "
                             "the worker's, GPUPOOL_MIGRATE_STRIPES or 4)")  # fmt: skip
    part_names = [
        "driver",
        "arrays",
        "primary",
        "cupy",
        "cupy_graph",
        "graphed",
        "pause",
        "training",
        "xserver",
        "xserver_pause",
        "xserver_arrays",
        "xserver_training",
        "xserver_expandable",
        "xserver_cupy_graph",
        "xserver_graphed",
        "xserver_item",
    ]
    parser.add_argument(
        "--only", nargs="*", default=part_names, choices=part_names, help="parts to run (default: all)"
    )
    parser.add_argument("--executor", default="cuda", choices=["cuda", "host"],
                        help="host: rehearse the driver part without a GPU (two host 'GPUs')")  # fmt: skip
    parser.add_argument("--budget", type=float, default=420, help="seconds for the whole run (default 420)")
    args = parser.parse_args()
    CLIENT_ENV.update(item.split("=", 1) for item in args.client_env if "=" in item)
    BUDGET_S[0] = args.budget
    EXECUTOR[0] = args.executor
    out_dir = OUT_DIR
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpupool-migrate-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    try:
        found = gpus() if args.executor == "cuda" else [(0, "", 0), (1, "", 0)]
    except (OSError, subprocess.SubprocessError) as exc:
        found = []
        print(f"nvidia-smi failed: {exc}")
    if len(found) < 2:
        record("migration GPU 0 -> GPU 1", "SKIP", f"needs two GPUs, this host has {len(found)}")
    else:
        shim = fresh_shim(work / "shim")
        print(f"shim: {shim}; GPUs: {found[:2]}; used MiB {used_mib()}", flush=True)
        parts = {
            "driver": lambda: driver_check(shim, work, found[:2]),
            "arrays": lambda: arrays_check(shim, work, found[:2]),
            "primary": lambda: primary_check(shim, work, found[:2]),
            "cupy": lambda: cupy_check(shim, work, found[:2]),
            "cupy_graph": lambda: cupy_graph_check(shim, work, found[:2]),
            "graphed": lambda: graphed_training(shim, work, found[:2], args.steps, args.at),
            "pause": lambda: pause_table(
                shim, work, found[:2], [int(s) for s in args.sizes.split(",")], out_dir
            ),
            "training": lambda: training(shim, work, found[:2], args.steps, args.at),
            "xserver": lambda: xserver_check(shim, work, found[:2]),
            "xserver_pause": lambda: xserver_pause_table(
                shim,
                work,
                found[:2],
                [int(s) for s in args.sizes.split(",")],
                out_dir,
                [int(s) for s in args.stripes.split(",")] if args.stripes else [None],
            ),
            "xserver_arrays": lambda: xserver_arrays(shim, work, found[:2]),
            "xserver_training": lambda: xserver_training(shim, work, found[:2], args.steps, args.at),
            "xserver_expandable": lambda: xserver_training(shim, work, found[:2], args.steps, args.at, True),
            "xserver_cupy_graph": lambda: xserver_cupy_graph(shim, work, found[:2]),
            "xserver_graphed": lambda: xserver_graphed(shim, work, found[:2], args.steps, args.at),
            "xserver_item": lambda: xserver_item(shim, work, found[:2]),
        }
        needs = {
            "driver": 20,
            "arrays": 20,
            "primary": 30,
            "cupy": 30,
            "cupy_graph": 30,
            "graphed": 60,
            "pause": 40,
            "training": 120,
            "xserver": 40,
            "xserver_arrays": 40,
            "xserver_training": 120,
            "xserver_cupy_graph": 30,
            "xserver_graphed": 60,
            "xserver_item": 60,
            "xserver_expandable": 120,
        }
        for name in args.only:
            if out_of_time(name, needs.get(name, 30)):
                continue
            started = time.monotonic()
            try:
                parts[name]()
            except Exception as exc:  # one part's failure must not cost the others their run
                record(name, "FAIL", f"{type(exc).__name__}: {exc}")
            print(f"[{name}: {time.monotonic() - started:.0f} s]", flush=True)
    print("\n=== summary")
    for r in results:
        print(f"{r['status']:8} {r['check']}" + (f" ({r['detail']})" if r["detail"] else ""))
    if out_dir is not None:
        (out_dir / "migrate_results.json").write_text(json.dumps(results, indent=1))
    return 0 if results and all(r["status"] in ("PASS", "SKIP") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
