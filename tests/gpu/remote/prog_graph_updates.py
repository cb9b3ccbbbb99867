"""An instantiated graph updated in place as XLA's command buffers update theirs (issue 25): a memset
node's value, a copy node's source and a child graph set anew, a node switched off and on, event nodes'
events read and set; the graph's root nodes and a node's neighbours (with edge data) read back.

Runs unchanged on a local GPU or, under gpupool's libcuda.so.1, on a leased one; prints the same.
"""

from __future__ import annotations

import sys

import numpy as np
from _common import loaded_libcuda, ok
from cuda.bindings import driver as cu

N = 1 << 20  # bytes per buffer


def memset(dst, value):
    params = cu.CUDA_MEMSET_NODE_PARAMS()
    params.dst, params.pitch, params.value, params.elementSize, params.width, params.height = (
        dst,
        0,
        value,
        1,
        N,
        1,
    )
    return params


def copy(src, dst):
    params = cu.CUDA_MEMCPY3D()
    params.srcMemoryType = params.dstMemoryType = cu.CUmemorytype.CU_MEMORYTYPE_DEVICE
    params.srcDevice, params.dstDevice = src, dst
    params.WidthInBytes, params.Height, params.Depth = N, 1, 1
    return params


def main() -> int:
    ok(cu.cuInit(0))
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    ctx = ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0))))
    ok(cu.cuCtxSetCurrent(ctx))
    a, b, c, d = (ok(cu.cuMemAlloc(N)) for _ in range(4))
    ok(cu.cuMemsetD8(d, 7, N))
    child, other_child = ok(cu.cuGraphCreate(0)), ok(cu.cuGraphCreate(0))
    ok(cu.cuGraphAddMemsetNode(child, None, 0, memset(c, 3), ctx))
    ok(cu.cuGraphAddMemsetNode(other_child, None, 0, memset(c, 5), ctx))
    graph = ok(cu.cuGraphCreate(0))
    ms = ok(cu.cuGraphAddMemsetNode(graph, None, 0, memset(a, 1), ctx))
    cp = ok(cu.cuGraphAddMemcpyNode(graph, [ms], 1, copy(a, b), ctx))
    ch = ok(cu.cuGraphAddChildGraphNode(graph, [cp], 1, child))
    event, other_event = ok(cu.cuEventCreate(0)), ok(cu.cuEventCreate(0))
    rec = ok(cu.cuGraphAddEventRecordNode(graph, [ch], 1, event))
    roots, count = ok(cu.cuGraphGetRootNodes(graph, 4))
    print("roots", [int(n) == int(ms) for n in roots[:count]])
    deps, data, count = ok(cu.cuGraphNodeGetDependencies(ch, 4))
    print("dependencies of the child node", [int(n) == int(cp) for n in deps[:count]],
          [(e.from_port, e.to_port, e.type) for e in data[:count]])  # fmt: skip
    after, _data, count = ok(cu.cuGraphNodeGetDependentNodes(cp, 4))
    print("dependents of the copy", [int(n) == int(ch) for n in after[:count]])
    print("record node's event is ours", int(ok(cu.cuGraphEventRecordNodeGetEvent(rec))) == int(event))
    exe = ok(cu.cuGraphInstantiate(graph, 0))
    print("flags", int(ok(cu.cuGraphExecGetFlags(exe))))
    host = np.empty(N, dtype=np.uint8)

    def launch(label):
        ok(cu.cuGraphLaunch(exe, 0))
        ok(cu.cuCtxSynchronize())
        got = []
        for buf in (a, b, c):
            ok(cu.cuMemcpyDtoH(host.ctypes.data, buf, N))
            got.append(f"{host[0]}x{int(np.count_nonzero(host == host[0]))}")
        print(label, " ".join(got))

    launch("first launch")
    ok(cu.cuGraphExecMemsetNodeSetParams(exe, ms, memset(a, 2), ctx))
    ok(cu.cuGraphExecMemcpyNodeSetParams(exe, cp, copy(d, b), ctx))
    ok(cu.cuGraphExecChildGraphNodeSetParams(exe, ch, other_child))
    ok(cu.cuGraphExecEventRecordNodeSetEvent(exe, rec, other_event))
    launch("after new parameters")
    ok(cu.cuGraphNodeSetEnabled(exe, ms, 0))
    print("enabled", int(ok(cu.cuGraphNodeGetEnabled(exe, ms))))
    ok(cu.cuMemsetD8(a, 0, N))
    launch("memset node off")
    ok(cu.cuGraphNodeSetEnabled(exe, ms, 1))
    launch("memset node on")
    print("other event done", ok(cu.cuEventQuery(other_event)) is None)
    ok(cu.cuGraphExecDestroy(exe))
    ok(cu.cuGraphDestroy(graph))
    return 0


if __name__ == "__main__":
    sys.exit(main())
