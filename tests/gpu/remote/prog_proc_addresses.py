"""cuGetProcAddress per (name, version) (issue 25): for every ABI of gpupool's call table, the name asked at
that ABI's version and just below the name's first one, with what the driver answers (result, found,
status). Natively that is the GPU server's driver; remotely gpupool's shim, answering from what the
worker found its driver lacks, must print the same lines. Then CUDA 13.4's graph node ABIs, which the shim
serves on any driver that has the older ones: cuGraphAddNode asked at 13.4 adds an empty node through
cuda.bindings' own call where the name is found.

Runs unchanged on a local GPU or, under gpupool's libcuda.so.1, on a leased one; prints the same.
"""

from __future__ import annotations

import ctypes
import sys

from _common import loaded_libcuda

from virtualize.server._executor import table_abis

FOUND, NOT_SUFFICIENT = 0, 2  # CU_GET_PROC_ADDRESS_SUCCESS, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT


def main() -> int:
    lib = ctypes.CDLL("libcuda.so.1")
    lookup = lib.cuGetProcAddress_v2
    lookup.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64,
                       ctypes.POINTER(ctypes.c_int)]  # fmt: skip
    if lib.cuInit(0) != 0:
        print("cuInit failed")
        return 1
    print("libcuda", loaded_libcuda(), file=sys.stderr)  # run.py checks the remote run loaded the shim
    lines = 0
    for name, abis in table_abis().items():
        versions = sorted({abis[0].since - 1, *(c.since for c in abis)})
        for version in versions:
            pfn, status = ctypes.c_void_p(), ctypes.c_int(-1)
            rc = lookup(name.encode(), ctypes.byref(pfn), version, 0, ctypes.byref(status))
            print(name, version, rc, bool(pfn.value), status.value)
            lines += 1
    print("asked", lines, "pairs", file=sys.stderr)
    from cuda.bindings import driver as cu  # after the table: cuda.bindings resolves names at import

    ok = cu.cuDevicePrimaryCtxRetain(cu.CUdevice(0))
    cu.cuCtxSetCurrent(ok[1])
    graph = cu.cuGraphCreate(0)[1]
    params = cu.CUgraphNodeParams()
    params.type = cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_EMPTY
    added = cu.cuGraphAddNode(graph, None, None, 0, params)
    print("cuGraphAddNode at cuda.bindings' version:", added[0].name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
