"""Graph memory nodes (issue 25), as cuda.core's GraphDefinition builds them: an allocation node, a memset
and a saxpy kernel node writing its memory, a copy node out of it, a free node; launched twice; both nodes
read back (directly and through cuGraphNodeGetParams); the device's graph memory attributes, a reset
high-water mark and a trim; the driver's answers to a free node of memory that is not graph memory and to
setting a current-use attribute.

Runs unchanged on a local GPU or, under gpupool's libcuda.so.1, on a leased one; prints the same.
"""

from __future__ import annotations

import ctypes
import struct
import sys

import numpy as np
from _common import PTX, loaded_libcuda, ok, saxpy_node
from cuda.bindings import driver as cu

N = 4096


def copy_params(src, dst, count):
    params = cu.CUDA_MEMCPY3D()
    params.srcMemoryType = params.dstMemoryType = cu.CUmemorytype.CU_MEMORYTYPE_DEVICE
    params.srcDevice, params.dstDevice = src, dst
    params.WidthInBytes, params.Height, params.Depth = count, 1, 1
    return params


def alloc_params(size):
    params = cu.CUDA_MEM_ALLOC_NODE_PARAMS()
    params.poolProps.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    params.poolProps.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    params.poolProps.location.id = 0
    access = cu.CUmemAccessDesc()
    access.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    access.location.id = 0
    access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    params.accessDescs = [access]
    params.accessDescCount = 1
    params.bytesize = size
    return params


def main() -> int:
    ok(cu.cuInit(0))
    print("libcuda", loaded_libcuda(), file=sys.stderr)  # once cuInit has loaded it
    ctx = ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0))))
    ok(cu.cuCtxSetCurrent(ctx))
    saxpy = ok(cu.cuModuleGetFunction(ok(cu.cuModuleLoadData(PTX.encode())), b"saxpy"))
    x, y = ok(cu.cuMemAlloc(4 * N)), ok(cu.cuMemAlloc(4 * N))
    ones = np.ones(N, dtype=np.float32)  # held: a temporary's memory is free before the copy reads it
    ok(cu.cuMemcpyHtoD(x, ones.ctypes.data, 4 * N))
    ok(cu.cuMemsetD8(y, 0, 4 * N))
    keep = []
    graph = ok(cu.cuGraphCreate(0))
    params = alloc_params(4 * N)
    allocation = ok(cu.cuGraphAddMemAllocNode(graph, None, 0, params))
    tmp = int(params.dptr)
    print("allocation node placed its memory", tmp != 0)
    memset = cu.CUDA_MEMSET_NODE_PARAMS()
    memset.dst, memset.pitch, memset.value, memset.elementSize, memset.width, memset.height = (
        tmp,
        0,
        0,
        4,
        N,
        1,
    )
    zero = ok(cu.cuGraphAddMemsetNode(graph, [allocation], 1, memset, ctx))
    fill = ok(cu.cuGraphAddKernelNode(graph, [zero], 1, saxpy_node(saxpy, x, tmp, 3.0, N, keep)))  # tmp = 3 x
    out = ok(cu.cuGraphAddMemcpyNode(graph, [fill], 1, copy_params(tmp, y, 4 * N), ctx))
    freed = ok(cu.cuGraphAddMemFreeNode(graph, [out], 1, tmp))
    graph_exec = ok(cu.cuGraphInstantiate(graph, 0))
    for _ in range(2):
        ok(cu.cuGraphLaunch(graph_exec, 0))
    ok(cu.cuCtxSynchronize())
    host = np.empty(N, dtype=np.float32)
    ok(cu.cuMemcpyDtoH(host.ctypes.data, y, 4 * N))
    print("copied out of graph memory", host[:2].tolist(), float(host.sum()))  # 3 each
    back = ok(cu.cuGraphMemAllocNodeGetParams(allocation))
    # The access descriptors from the C structure the driver filled (cuda.bindings lists only its own).
    descs_at, count = struct.unpack_from("<QQ", ctypes.string_at(back.getPtr(), 120), 88)
    described = ctypes.string_at(descs_at, 12 * count) if count else b""
    print("allocation node reads back", int(back.bytesize), int(back.dptr) == tmp, int(back.poolProps.location.id),
          [(peer, flags) for _, peer, flags in struct.iter_unpack("<iiI", described)])  # fmt: skip
    print("free node reads back its address", int(ok(cu.cuGraphMemFreeNodeGetParams(freed))) == tmp)
    if ok(cu.cuDriverGetVersion()) >= 13010:  # the generic getter came with CUDA 13.1
        node = ok(cu.cuGraphNodeGetParams(allocation))
        print("generic read back", int(node.type), int(node.alloc.bytesize), int(node.alloc.dptr) == tmp)
    else:
        print("cuGraphNodeGetParams: not in this driver")
    attrs = cu.CUgraphMem_attribute
    high = int(ok(cu.cuDeviceGetGraphMemAttribute(0, attrs.CU_GRAPH_MEM_ATTR_USED_MEM_HIGH)))
    reserved = int(ok(cu.cuDeviceGetGraphMemAttribute(0, attrs.CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH)))
    print("graph memory high-water marks cover the node", high >= 4 * N, reserved >= 4 * N)
    print("reset high-water mark", cu.cuDeviceSetGraphMemAttribute(0, attrs.CU_GRAPH_MEM_ATTR_USED_MEM_HIGH,
                                                                   cu.cuuint64_t(0))[0].name)  # fmt: skip
    print("set current use", cu.cuDeviceSetGraphMemAttribute(0, attrs.CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT,
                                                             cu.cuuint64_t(0))[0].name)  # fmt: skip
    print("trim", cu.cuDeviceGraphMemTrim(0)[0].name)
    print("free node of memory not the graph's", cu.cuGraphAddMemFreeNode(graph, None, 0, y)[0].name)
    ok(cu.cuGraphExecDestroy(graph_exec))
    ok(cu.cuGraphDestroy(graph))
    return 0


if __name__ == "__main__":
    sys.exit(main())
