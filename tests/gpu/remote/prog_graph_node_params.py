"""A graph's own nodes read back, set anew and queried, as PyTorch's and XLA's graphs do (issue 25):
kernel, memset, copy (one from page-locked memory too) and host nodes read back; kernel, memset, copy
and host nodes set anew (a graph instantiated before keeps the old parameters, one instantiated after
runs the new); the generic setters; an edge removed; a kernel node's priority set, read back and
copied; the DOT description; and (drivers of CUDA 13.1 and up) the ids.

Runs unchanged on a local GPU or, under gpupool's libcuda.so.1, on a leased one; prints the same.
"""

from __future__ import annotations

import ctypes
import os
import sys
import tempfile

import numpy as np
from _common import PTX, loaded_libcuda, ok, saxpy_node
from cuda.bindings import driver as cu

N = 4096


def main() -> int:
    ok(cu.cuInit(0))
    print("libcuda", loaded_libcuda(), file=sys.stderr)  # once cuInit has loaded it
    ctx = ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0))))
    ok(cu.cuCtxSetCurrent(ctx))
    saxpy = ok(cu.cuModuleGetFunction(ok(cu.cuModuleLoadData(PTX.encode())), b"saxpy"))
    x, y, z = (ok(cu.cuMemAlloc(4 * N)) for _ in range(3))
    ones = np.ones(N, dtype=np.float32)  # held: a temporary's memory is free before the copy reads it
    ok(cu.cuMemcpyHtoD(x, ones.ctypes.data, 4 * N))
    keep, ran = [], []
    recorder = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(ran.append)  # a host node: the value it was given
    recorder_address = ctypes.cast(recorder, ctypes.c_void_p).value

    def kernel(a, params=None):  # y += a x
        return saxpy_node(saxpy, x, y, a, N, keep, params)

    def memset(value, params=None):  # y = value, as 4-byte words
        params = params or cu.CUDA_MEMSET_NODE_PARAMS()
        params.dst, params.pitch, params.value, params.elementSize, params.width, params.height = (
            y, 0, value, 4, N, 1,
        )  # fmt: skip
        return params

    def copy(dst):  # y copied to dst
        params = cu.CUDA_MEMCPY3D()
        params.srcMemoryType = params.dstMemoryType = cu.CUmemorytype.CU_MEMORYTYPE_DEVICE
        params.srcDevice, params.dstDevice = y, dst
        params.WidthInBytes, params.Height, params.Depth = 4 * N, 1, 1
        return params

    def host(value):
        params = cu.CUDA_HOST_NODE_PARAMS()
        params.fn, params.userData = cu.CUhostFn(recorder_address), value
        return params

    graph = ok(cu.cuGraphCreate(0))
    ms = ok(cu.cuGraphAddMemsetNode(graph, None, 0, memset(0), ctx))
    kn = ok(cu.cuGraphAddKernelNode(graph, [ms], 1, kernel(2.0)))
    cp = ok(cu.cuGraphAddMemcpyNode(graph, [kn], 1, copy(z), ctx))
    hn = ok(cu.cuGraphAddHostNode(graph, [cp], 1, host(7)))
    got = ok(cu.cuGraphMemsetNodeGetParams(ms))
    print("memset read back", int(got.dst) == int(y), got.value, got.elementSize, got.width, got.height)
    got = ok(cu.cuGraphHostNodeGetParams(hn))
    print("host read back", int(got.fn) == recorder_address, int(got.userData))

    def read_kernel(node):  # the function, the shape and the saxpy's `a`, through kernelParams
        got = ok(cu.cuGraphKernelNodeGetParams(node))
        pointers = int(got.kernelParams)
        a = ctypes.c_float.from_address(ctypes.c_void_p.from_address(pointers + 16).value).value
        n = ctypes.c_uint32.from_address(ctypes.c_void_p.from_address(pointers + 24).value).value
        xy = [
            ctypes.c_uint64.from_address(ctypes.c_void_p.from_address(pointers + 8 * i).value).value
            for i in (0, 1)
        ]
        same = xy == [int(x), int(y)]
        return int(got.func) == int(saxpy), got.gridDimX, got.blockDimX, got.sharedMemBytes, a, n, same

    print("kernel read back", *read_kernel(kn))
    got = ok(cu.cuGraphMemcpyNodeGetParams(cp))
    print("copy read back", int(got.srcDevice) == int(y), int(got.dstDevice) == int(z), got.WidthInBytes,
          got.srcMemoryType == cu.CUmemorytype.CU_MEMORYTYPE_DEVICE)  # fmt: skip
    out = np.empty(N, dtype=np.float32)

    def launch(label, graph_exec):
        ok(cu.cuMemsetD8(z, 0, 4 * N))
        ok(cu.cuGraphLaunch(graph_exec, 0))
        ok(cu.cuCtxSynchronize())
        ok(cu.cuMemcpyDtoH(out.ctypes.data, z, 4 * N))
        print(label, out[:2].tolist(), float(out.sum()), ran[-1] if ran else None)

    old = ok(cu.cuGraphInstantiate(graph, 0))
    launch("first launch", old)  # 0 + 2
    ok(cu.cuGraphMemsetNodeSetParams(ms, memset(0x3F800000)))  # 1.0f
    ok(cu.cuGraphKernelNodeSetParams(kn, kernel(10.0)))
    w = ok(cu.cuMemAlloc(4 * N))
    ok(cu.cuGraphMemcpyNodeSetParams(cp, copy(w)))
    ok(cu.cuGraphHostNodeSetParams(hn, host(8)))
    print("kernel read back anew", *read_kernel(kn))
    got = ok(cu.cuGraphMemsetNodeGetParams(ms))
    print("memset read back anew", hex(got.value), int(ok(cu.cuGraphHostNodeGetParams(hn)).userData))
    launch("instantiated before", old)  # still 0 + 2 into z
    new = ok(cu.cuGraphInstantiate(graph, 0))
    launch("instantiated after (z untouched)", new)  # the copy now goes to w
    ok(cu.cuMemcpyDtoH(out.ctypes.data, w, 4 * N))
    print("instantiated after, w", out[:2].tolist(), float(out.sum()))  # 1 + 10
    ok(cu.cuGraphExecHostNodeSetParams(old, hn, host(9)))
    launch("old instance, host node set anew", old)

    generic = cu.CUgraphNodeParams()
    generic.type = cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL
    kernel(100.0, generic.kernel)
    ok(cu.cuGraphExecNodeSetParams(old, kn, generic))
    launch("old instance, kernel set by cuGraphExecNodeSetParams", old)  # 0 + 100
    generic = cu.CUgraphNodeParams()
    generic.type = cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_MEMSET
    memset(0x40000000, generic.memset)  # 2.0f
    ok(cu.cuGraphNodeSetParams(ms, generic))
    print("memset set by cuGraphNodeSetParams", hex(ok(cu.cuGraphMemsetNodeGetParams(ms)).value))

    _deps, _data, count = ok(cu.cuGraphNodeGetDependencies(kn, 4))
    ok(cu.cuGraphRemoveDependencies(graph, [ms], [kn], None, 1))
    _deps, _data, after = ok(cu.cuGraphNodeGetDependencies(kn, 4))
    print("dependencies before and after removing one", count, after)

    priority = cu.CUkernelNodeAttrValue()
    priority.priority = -1
    attr = cu.CUkernelNodeAttrID.CU_LAUNCH_ATTRIBUTE_PRIORITY
    ok(cu.cuGraphKernelNodeSetAttribute(kn, attr, priority))
    other_graph = ok(cu.cuGraphCreate(0))
    other = ok(cu.cuGraphAddKernelNode(other_graph, None, 0, kernel(1.0)))
    ok(cu.cuGraphKernelNodeSetParams(other, ok(cu.cuGraphKernelNodeGetParams(kn))))  # read back, set anew
    print("read-back parameters on another node", *read_kernel(other))
    ok(cu.cuGraphKernelNodeCopyAttributes(other, kn))
    pinned = ok(cu.cuMemAllocHost(4 * N))  # a copy node from page-locked memory reads back its host pointer
    from_pinned = copy(x)
    from_pinned.srcMemoryType, from_pinned.srcHost = cu.CUmemorytype.CU_MEMORYTYPE_HOST, pinned
    pinned_node = ok(cu.cuGraphAddMemcpyNode(other_graph, None, 0, from_pinned, ctx))
    got = ok(cu.cuGraphMemcpyNodeGetParams(pinned_node))
    print("copy from pinned memory read back", got.srcMemoryType == cu.CUmemorytype.CU_MEMORYTYPE_HOST,
          int(got.srcHost) == int(pinned))  # fmt: skip
    print("priority set, copied", ok(cu.cuGraphKernelNodeGetAttribute(kn, attr)).priority,
          ok(cu.cuGraphKernelNodeGetAttribute(other, attr)).priority)  # fmt: skip

    with tempfile.TemporaryDirectory() as folder:  # the graph's DOT description, written to our path
        path = os.path.join(folder, "graph.dot")
        ok(cu.cuGraphDebugDotPrint(graph, path.encode(), 0))
        with open(path) as f:
            print("dot description", f.read().startswith("digraph"))
    if ok(cu.cuDriverGetVersion()) >= 13010:  # the ids came with CUDA 13.1
        print("containing graph", int(ok(cu.cuGraphNodeGetContainingGraph(kn))) == int(graph))
        local = {int(ok(cu.cuGraphNodeGetLocalId(n))) for n in (ms, kn, cp, hn)}
        print("local ids distinct", len(local) == 4)
        print("exec ids distinct", int(ok(cu.cuGraphExecGetId(old))) != int(ok(cu.cuGraphExecGetId(new))))
        generic = ok(cu.cuGraphNodeGetParams(ms))  # the generic getter came with them
        print("generic read back", int(generic.type), hex(generic.memset.value))
        ok(cu.cuGraphGetId(graph))
        ok(cu.cuGraphNodeGetToolsId(kn))
    else:
        print("ids: not in this driver")
    for graph_exec in (old, new):
        ok(cu.cuGraphExecDestroy(graph_exec))
    ok(cu.cuGraphDestroy(other_graph))
    ok(cu.cuGraphDestroy(graph))
    ok(cu.cuMemFreeHost(pinned))
    return 0


if __name__ == "__main__":
    sys.exit(main())
