"""A CUDA graph built node by node (issue 11): a memset node, a saxpy kernel node after it, an empty
node, a second kernel node made first and ordered last by cuGraphAddDependencies; instantiated and
launched, then the instantiated graph's kernel node given new parameters and launched again.

Runs unchanged on a local GPU or, under gpupool's libcuda.so.1, on a leased one; prints the same.
"""

from __future__ import annotations

import sys

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
    x, y = ok(cu.cuMemAlloc(4 * N)), ok(cu.cuMemAlloc(4 * N))
    ones = np.ones(N, dtype=np.float32)
    ok(cu.cuMemcpyHtoD(x, ones.ctypes.data, 4 * N))
    keep = []
    graph = ok(cu.cuGraphCreate(0))
    late = ok(cu.cuGraphAddKernelNode(graph, None, 0, saxpy_node(saxpy, x, y, 10.0, N, keep)))  # y += 10 x
    memset = cu.CUDA_MEMSET_NODE_PARAMS()
    memset.dst, memset.pitch, memset.value, memset.elementSize, memset.width, memset.height = y, 0, 0, 4, N, 1
    zero = ok(cu.cuGraphAddMemsetNode(graph, None, 0, memset, ctx))
    first = ok(cu.cuGraphAddKernelNode(graph, [zero], 1, saxpy_node(saxpy, x, y, 2.0, N, keep)))  # y += 2 x
    empty = ok(cu.cuGraphAddEmptyNode(graph, [first], 1))
    ok(cu.cuGraphAddDependencies(graph, [empty], [late], None, 1))
    graph_exec = ok(cu.cuGraphInstantiate(graph, 0))
    out = np.empty(N, dtype=np.float32)
    ok(cu.cuGraphLaunch(graph_exec, 0))
    ok(cu.cuCtxSynchronize())
    ok(cu.cuMemcpyDtoH(out.ctypes.data, y, 4 * N))
    print("after one launch", out[:2].tolist(), float(out.sum()))  # 0, +2, +10
    ok(cu.cuGraphExecKernelNodeSetParams(graph_exec, late, saxpy_node(saxpy, x, y, 100.0, N, keep)))
    ok(cu.cuGraphLaunch(graph_exec, 0))
    ok(cu.cuCtxSynchronize())
    ok(cu.cuMemcpyDtoH(out.ctypes.data, y, 4 * N))
    print("after new parameters", out[:2].tolist(), float(out.sum()))  # 0, +2, +100
    ok(cu.cuGraphExecDestroy(graph_exec))
    ok(cu.cuGraphDestroy(graph))
    return 0


if __name__ == "__main__":
    sys.exit(main())
