"""CUDA arrays, textures and surfaces on a real GPU (issue 25's image and signal-processing users): an
image copied into a 2D array from host rows with their own pitch, sampled by a kernel through a texture
object; a kernel writing another array through a surface object, read back row by row; a 3D array
round trip; a mipmapped array's levels; one-dimensional copies at an offset. Each line is the same
natively and remotely.

Runs unchanged on a local GPU or, under gpupool's libcuda.so.1, on a leased one.
"""

from __future__ import annotations

import ctypes
import sys

import numpy as np
from _common import loaded_libcuda, ok
from cuda.bindings import driver as cu
from cuda.core import Device, Program, ProgramOptions

SOURCE = r"""
extern "C" __global__ void sample(cudaTextureObject_t tex, float *out, int w, int h) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
    if (x < w && y < h) out[y * w + x] = 2.0f * tex2D<float>(tex, x + 0.5f, y + 0.5f);
}
extern "C" __global__ void paint(cudaSurfaceObject_t surf, int w, int h) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
    if (x < w && y < h) surf2Dwrite((float)(x + 1000 * y), surf, x * (int)sizeof(float), y);
}
"""
W, H = 64, 32
HOST, DEVICE, ARRAY = (cu.CUmemorytype(k) for k in (1, 2, 3))


def array_2d(flags: int = 0):
    desc = cu.CUDA_ARRAY3D_DESCRIPTOR()
    desc.Width, desc.Height, desc.Depth = W, H, 0
    desc.Format, desc.NumChannels, desc.Flags = cu.CUarray_format.CU_AD_FORMAT_FLOAT, 1, flags
    return ok(cu.cuArray3DCreate(desc))


def copy_2d(src_kind, src, src_pitch, dst_kind, dst, dst_pitch, width, height):
    copy = cu.CUDA_MEMCPY2D()
    for prefix, kind, at, pitch in (("src", src_kind, src, src_pitch), ("dst", dst_kind, dst, dst_pitch)):
        setattr(copy, f"{prefix}MemoryType", kind)
        field = {HOST: "Host", DEVICE: "Device", ARRAY: "Array"}[kind]
        setattr(copy, f"{prefix}{field}", at)
        setattr(copy, f"{prefix}Pitch", pitch)
    copy.WidthInBytes, copy.Height = width, height
    return cu.cuMemcpy2D(copy)[0].name


def resource(array):
    res = cu.CUDA_RESOURCE_DESC()
    res.resType = cu.CUresourcetype.CU_RESOURCE_TYPE_ARRAY
    res.res.array.hArray = array
    return res


def launch(function, args, types):
    ok(cu.cuLaunchKernel(function, (W + 31) // 32, H, 1, 32, 1, 1, 0, 0, (args, types), 0))
    return cu.cuCtxSynchronize()[0].name


def made(desc, what: str):
    """The array, or None after printing the driver's answer (a GPU without sparse or deferred arrays)."""
    result = cu.cuArray3DCreate(desc)
    if result[0] != cu.CUresult.CUDA_SUCCESS:
        print(what, result[0].name)
        return None
    return result[1]


def rest_of_arrays() -> None:
    """Issue 25's rest of arrays: an NV12 array's planes, sparse properties (of an array and a mipmapped
    array), a deferred-mapping array's memory requirements, a sparse array's first tiles mapped to memory
    of cuMemCreate and unmapped; the driver's answers where an array is not of the kind asked."""
    desc = cu.CUDA_ARRAY3D_DESCRIPTOR()
    desc.Width, desc.Height, desc.Depth = 64, 32, 0
    desc.Format, desc.NumChannels = cu.CUarray_format.CU_AD_FORMAT_NV12, 3
    nv12 = made(desc, "NV12 array")
    if nv12 is not None:
        planes = [ok(cu.cuArray3DGetDescriptor(ok(cu.cuArrayGetPlane(nv12, n)))) for n in (0, 1)]
        print(
            "NV12 planes", [(int(d.Width), int(d.Height), int(d.Format), int(d.NumChannels)) for d in planes]
        )
        print("plane 2", cu.cuArrayGetPlane(nv12, 2)[0].name)
        ok(cu.cuArrayDestroy(nv12))
    desc.Width, desc.Height = 512, 512
    desc.Format, desc.NumChannels = cu.CUarray_format.CU_AD_FORMAT_FLOAT, 1
    plain = ok(cu.cuArray3DCreate(desc))
    print("plane of a float array", cu.cuArrayGetPlane(plain, 0)[0].name)
    print("sparse properties of a plain array", cu.cuArrayGetSparseProperties(plain)[0].name)
    desc.Flags = cu.CUDA_ARRAY3D_SPARSE
    sparse = made(desc, "sparse array")
    if sparse is not None:
        props = ok(cu.cuArrayGetSparseProperties(sparse))
        tile = props.tileExtent
        print("sparse tile", int(tile.width), int(tile.height), int(tile.depth), int(props.miptailFirstLevel))
        sparse_mipmap = ok(cu.cuMipmappedArrayCreate(desc, 4))
        props = ok(cu.cuMipmappedArrayGetSparseProperties(sparse_mipmap))
        print(
            "sparse mipmap tile",
            int(props.tileExtent.width),
            int(props.miptailFirstLevel),
            int(props.miptailSize),
        )
        ok(cu.cuMipmappedArrayDestroy(sparse_mipmap))
        prop = cu.CUmemAllocationProp()
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = 0
        prop.allocFlags.usage = cu.CU_MEM_CREATE_USAGE_TILE_POOL  # memory for sparse arrays' tiles
        memory = ok(cu.cuMemCreate(2 << 20, prop, 0))
        for operation in (
            cu.CUmemOperationType.CU_MEM_OPERATION_TYPE_MAP,
            cu.CUmemOperationType.CU_MEM_OPERATION_TYPE_UNMAP,
        ):
            info = cu.CUarrayMapInfo()
            info.resourceType = cu.CUresourcetype.CU_RESOURCE_TYPE_ARRAY
            info.resource.array = sparse
            info.subresourceType = (
                cu.CUarraySparseSubresourceType.CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_SPARSE_LEVEL
            )
            level = info.subresource.sparseLevel
            level.extentWidth, level.extentHeight, level.extentDepth = int(tile.width), int(tile.height), 1
            info.memOperationType = operation
            info.memHandleType = cu.CUmemHandleType.CU_MEM_HANDLE_TYPE_GENERIC
            info.memHandle.memHandle = memory
            info.deviceBitMask = 1
            print("tiles", operation.name, cu.cuMemMapArrayAsync([info], 1, 0)[0].name)
        ok(cu.cuStreamSynchronize(0))
        ok(cu.cuArrayDestroy(sparse))
        ok(cu.cuMemRelease(memory))
    desc.Flags = cu.CUDA_ARRAY3D_DEFERRED_MAPPING
    deferred = made(desc, "deferred-mapping array")
    if deferred is not None:
        reqs = ok(cu.cuArrayGetMemoryRequirements(deferred, 0))
        print("deferred requirements cover it", int(reqs.size) >= 512 * 512 * 4, int(reqs.alignment) > 0)
        ok(cu.cuArrayDestroy(deferred))
    ok(cu.cuArrayDestroy(plain))


def main() -> int:
    dev = Device(0)
    dev.set_current()
    cubin = (
        Program(SOURCE, code_type="c++", options=ProgramOptions(arch=f"sm_{dev.arch}")).compile("cubin").code
    )
    ok(cu.cuInit(0))
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    ok(cu.cuCtxSetCurrent(ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0))))))
    module = ok(cu.cuModuleLoadData(cubin))
    sample, paint = (ok(cu.cuModuleGetFunction(module, name)) for name in (b"sample", b"paint"))
    image = np.arange(H * 2 * W, dtype=np.float32).reshape(H, 2 * W)  # rows of 128 floats; the array takes 64

    array = array_2d()
    print(
        "host rows into the array",
        copy_2d(HOST, image.ctypes.data, image.strides[0], ARRAY, array, 0, 4 * W, H),
    )
    texture_desc = cu.CUDA_TEXTURE_DESC()
    texture_desc.filterMode = cu.CUfilter_mode.CU_TR_FILTER_MODE_POINT
    texture = ok(cu.cuTexObjectCreate(resource(array), texture_desc, None))
    out = ok(cu.cuMemAlloc(4 * W * H))
    synced = launch(sample, (int(texture), out, W, H), (ctypes.c_ulonglong, None, ctypes.c_int, ctypes.c_int))
    sampled = np.empty((H, W), dtype=np.float32)
    ok(cu.cuMemcpyDtoH(sampled.ctypes.data, out, sampled.nbytes))
    print("texture sampled", synced, bool((sampled == 2 * image[:, :W]).all()))

    surface_array = array_2d(flags=0x02)  # CUDA_ARRAY3D_SURFACE_LDST
    surface = ok(cu.cuSurfObjectCreate(resource(surface_array)))
    synced = launch(paint, (int(surface), W, H), (ctypes.c_ulonglong, ctypes.c_int, ctypes.c_int))
    painted = np.zeros((H, W), dtype=np.float32)
    read = copy_2d(ARRAY, surface_array, 0, HOST, painted.ctypes.data, painted.strides[0], 4 * W, H)
    expected = np.arange(W)[None, :] + 1000 * np.arange(H)[:, None]
    print("surface painted", synced, read, bool((painted == expected).all()))
    corner = np.zeros((3, 8), dtype=np.float32)
    copy = cu.CUDA_MEMCPY2D()
    copy.srcXInBytes, copy.srcY, copy.srcMemoryType, copy.srcArray = 16, 4, ARRAY, surface_array
    copy.dstMemoryType, copy.dstHost, copy.dstPitch = HOST, corner.ctypes.data, corner.strides[0]
    copy.WidthInBytes, copy.Height = 32, 3
    print("a corner of it", cu.cuMemcpy2D(copy)[0].name, corner[0, 0], corner[2, 7])

    line = np.arange(16, dtype=np.float32)
    back = np.zeros(16, dtype=np.float32)
    ok(cu.cuMemcpyHtoA(array, 8, line.ctypes.data, line.nbytes))
    ok(cu.cuMemcpyAtoH(back.ctypes.data, array, 8, back.nbytes))
    print("one dimension at an offset", bool((back == line).all()))

    desc = cu.CUDA_ARRAY3D_DESCRIPTOR()
    desc.Width, desc.Height, desc.Depth = 8, 4, 3
    desc.Format, desc.NumChannels = cu.CUarray_format.CU_AD_FORMAT_UNSIGNED_INT8, 4
    volume = ok(cu.cuArray3DCreate(desc))
    cube = np.arange(3 * 4 * 32, dtype=np.uint8).reshape(3, 4, 32)
    again = np.zeros_like(cube)
    for src_kind, src, dst_kind, dst in ((HOST, cube, ARRAY, volume), (ARRAY, volume, HOST, again)):
        copy = cu.CUDA_MEMCPY3D()
        copy.srcMemoryType, copy.dstMemoryType = src_kind, dst_kind
        if src_kind == HOST:
            copy.srcHost, copy.srcPitch, copy.srcHeight, copy.dstArray = src.ctypes.data, 32, 4, dst
        else:
            copy.srcArray, copy.dstHost, copy.dstPitch, copy.dstHeight = src, dst.ctypes.data, 32, 4
        copy.WidthInBytes, copy.Height, copy.Depth = 32, 4, 3
        ok(cu.cuMemcpy3D(copy))
    print("3D round trip", bool((again == cube).all()), ok(cu.cuArray3DGetDescriptor(volume)).Depth)

    desc.Width, desc.Height, desc.Depth = 64, 64, 0
    desc.Format, desc.NumChannels = cu.CUarray_format.CU_AD_FORMAT_FLOAT, 1
    mipmapped = ok(cu.cuMipmappedArrayCreate(desc, 4))
    levels = [ok(cu.cuArray3DGetDescriptor(ok(cu.cuMipmappedArrayGetLevel(mipmapped, n)))) for n in range(4)]
    print("mipmap levels", [(int(d.Width), int(d.Height)) for d in levels])

    rest_of_arrays()

    ok(cu.cuTexObjectDestroy(texture))
    ok(cu.cuSurfObjectDestroy(surface))
    for handle in (array, surface_array, volume):
        ok(cu.cuArrayDestroy(handle))
    ok(cu.cuMipmappedArrayDestroy(mipmapped))
    ok(cu.cuMemFree(out))
    print("all destroyed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
