"""Programs that go through the CUDA runtime (libcudart, shared or static) start through the shim.

Real CuPy, PyTorch (CUDA build) and cuda.bindings.runtime programs run in a child process with
gpupool's libcuda.so.1 first on the library path, against a worker with the host-memory executor:
the runtime's start-up (the driver's private export tables, its integrity check), device discovery
and properties, allocations and copies both ways. Kernels do not run on the host executor; on a GPU
host tests/gpu/remote runs the same programs to the end.
"""

from __future__ import annotations

import ctypes
import importlib.util
import subprocess
import sys
import textwrap

import pytest
import remote_helpers
from remote_helpers import MiB, client_env, needs_cc, parse

from virtualize.client._exports import BY_KEY, TABLES

pytestmark = needs_cc
shim_dir = remote_helpers.shim_dir  # fixtures
worker = remote_helpers.worker

PARTITION = 64 * MiB  # the `worker` fixture's partition


def run_program(source: str, env: dict[str, str]) -> tuple[dict[str, str], str]:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(source)], env=env, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return parse(proc.stdout), proc.stderr


def needs(module: str):
    return pytest.mark.skipif(importlib.util.find_spec(module) is None, reason=f"{module} is not installed")


@needs("cupy")
def test_cupy_starts_allocates_and_copies_through_the_shim(shim_dir, worker):
    out, err = run_program(
        """
        import numpy as np, cupy as cp
        print("count", cp.cuda.runtime.getDeviceCount())
        props = cp.cuda.runtime.getDeviceProperties(0)
        print("name", props["name"].decode())
        print("total", props["totalGlobalMem"])
        host = np.arange(1 << 18, dtype=np.float32)
        dev = cp.asarray(host)
        other = cp.empty_like(dev)
        other.set(host[::-1].copy())
        print("roundtrip", np.array_equal(cp.asnumpy(dev), host), np.array_equal(other.get(), host[::-1]))
        free, total = cp.cuda.runtime.memGetInfo()
        print("mem_info", total, free < total)
        """,
        client_env(shim_dir, worker),
    )
    assert out["count"] == "1"
    assert out["name"] == "gpupool host executor 0 (tests only)"
    assert out["total"] == str(PARTITION)
    assert out["roundtrip"] == "True True"
    assert out["mem_info"] == f"{PARTITION} True"
    assert "not forwarded" not in err and "does not emulate" not in err, err


@needs("torch")
def test_pytorch_starts_allocates_and_copies_through_the_shim(shim_dir, worker):
    torch = pytest.importorskip("torch")
    if torch.version.cuda is None:
        pytest.skip("this torch is a CPU build")
    out, err = run_program(
        """
        import torch
        print("available", torch.cuda.is_available(), torch.cuda.device_count())
        p = torch.cuda.get_device_properties(0)
        print("name", p.name)
        print("total", p.total_memory)
        x = torch.arange(1 << 18, dtype=torch.float32)
        y = x.to("cuda")
        pinned = torch.empty_like(x).pin_memory()
        pinned.copy_(y, non_blocking=True)
        torch.cuda.synchronize()
        print("roundtrip", torch.equal(y.cpu(), x), torch.equal(pinned, x))
        print("allocated", torch.cuda.memory_allocated() >= x.nbytes)
        free, total = torch.cuda.mem_get_info()
        print("mem_info", total, free < total)
        """,
        client_env(shim_dir, worker),
    )
    assert out["available"] == "True 1"
    assert out["name"] == "gpupool host executor 0 (tests only)"
    assert out["total"] == str(PARTITION)
    assert out["roundtrip"] == "True True"
    assert out["allocated"] == "True"
    assert out["mem_info"] == f"{PARTITION} True"
    assert "not forwarded" not in err and "does not emulate" not in err, err


def test_cuda_bindings_runtime_api_runs_through_the_shim(shim_dir, worker):
    out, _ = run_program(
        """
        import numpy as np
        from cuda.bindings import runtime as rt
        def ok(result):
            assert result[0] == rt.cudaError_t.cudaSuccess, result[0]
            return result[1] if len(result) == 2 else result[1:]
        print("count", ok(rt.cudaGetDeviceCount()))
        print("name", ok(rt.cudaGetDeviceProperties(0)).name.split(b"\\0")[0].decode())
        host = np.arange(4096, dtype=np.float32)
        back = np.zeros_like(host)
        ptr = ok(rt.cudaMalloc(host.nbytes))
        ok(rt.cudaMemcpy(ptr, host.ctypes.data, host.nbytes, rt.cudaMemcpyKind.cudaMemcpyHostToDevice))
        ok(rt.cudaMemcpy(back.ctypes.data, ptr, host.nbytes, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost))
        ok(rt.cudaDeviceSynchronize())
        print("roundtrip", bool(np.array_equal(back, host)))
        """,
        client_env(shim_dir, worker),
    )
    assert out == {"count": "1", "name": "gpupool host executor 0 (tests only)", "roundtrip": "True"}


def test_cuda_bindings_calls_the_newer_abis_it_asks_for_through_the_shim(shim_dir, worker):
    """cuda.bindings (13.4+) resolves cuGraphAddNode and cuGraphNodeSetParams at CUDA 13.4 and calls their
    _v3 / _v2 ABIs, cuMemGetLocationInfo and cuTensorMapSetAllocationClass at theirs: through the shim a
    graph gets an empty node and a host node whose function runs with the argument set last, managed
    memory reports where it is, and a map's allocation class is set, as cuda.bindings' own calls."""
    out, err = run_program(
        """
        import ctypes
        from cuda.bindings import driver as cu
        def ok(result):
            assert result[0] == cu.CUresult.CUDA_SUCCESS, result[0]
            return result[1] if len(result) == 2 else result[1:]
        ok(cu.cuInit(0))
        ok(cu.cuCtxSetCurrent(ok(cu.cuDevicePrimaryCtxRetain(cu.CUdevice(0)))))
        graph = ok(cu.cuGraphCreate(0))
        empty = cu.CUgraphNodeParams()
        empty.type = cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_EMPTY
        ok(cu.cuGraphAddNode(graph, None, None, 0, empty))
        seen = []
        hook = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda data: seen.append(data))
        host = cu.CUgraphNodeParams()
        host.type = cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_HOST
        host.host.fn = cu.CUhostFn(ctypes.cast(hook, ctypes.c_void_p).value)
        host.host.userData = 5
        node = ok(cu.cuGraphAddNode(graph, None, None, 0, host))
        host.host.userData = 6
        ok(cu.cuGraphNodeSetParams(node, host))
        ok(cu.cuGraphLaunch(ok(cu.cuGraphInstantiate(graph, 0)), 0))
        ok(cu.cuCtxSynchronize())
        print("host_node_ran", seen)
        managed = ok(cu.cuMemAllocManaged(1 << 16, 1))
        ok(cu.cuMemsetD8(managed, 1, 1 << 16))
        ok(cu.cuCtxSynchronize())
        where = cu.CUmemLocation()
        ok(cu.cuMemGetLocationInfo(managed, 1 << 16, 1 << 16, 0, where))
        print("location", int(where.type), where.id)
        data = ok(cu.cuMemAlloc(1 << 20))
        u64s, u32s = (lambda *v: [cu.cuuint64_t(x) for x in v]), (lambda *v: [cu.cuuint32_t(x) for x in v])
        tensor_map = ok(cu.cuTensorMapEncodeTiled(
            cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT32, cu.cuuint32_t(2), data, u64s(256, 1024),
            u64s(1024), u32s(64, 32), u32s(1, 1),
            cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE,
            cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_NONE,
            cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE))
        effective = ok(cu.cuTensorMapSetAllocationClass(tensor_map, cu.CUtensorMapAllocClass.CU_TENSOR_MAP_ALLOC_CLASS_LARGE))
        print("alloc_class", int(effective))
        """,
        client_env(shim_dir, worker),
    )
    assert out == {"host_node_ran": "[6]", "location": "1 0", "alloc_class": "2"}, err


def test_an_export_table_slot_gpupool_does_not_emulate_fails_with_one_line(shim_dir, worker):
    """A slot of a known table that the table in virtualize/client/_exports.py does not list answers
    CUDA_ERROR_NOT_SUPPORTED and names the table and slot once; an unknown table is refused."""
    table = next(t for t in TABLES if t.name == "cudart_interface")
    slot = next(i for i in range(1, table.words) if i not in {s.index for s in table.slots})
    out, err = run_program(
        f"""
        import ctypes
        lib = ctypes.CDLL("libcuda.so.1")
        pointer = ctypes.c_void_p()
        print("known", lib.cuGetExportTable(ctypes.byref(pointer), {table.key!r}))
        words = ctypes.cast(pointer, ctypes.POINTER(ctypes.c_void_p))
        print("size", words[0])
        refused = ctypes.CFUNCTYPE(ctypes.c_int)(words[{slot}])
        print("slot", refused(), refused())
        other = ctypes.c_void_p(1)
        print("unknown", lib.cuGetExportTable(ctypes.byref(other), bytes(range(16))), other.value)
        """,
        client_env(shim_dir, worker),
    )
    assert out == {"known": "0", "size": str(table.words * 8), "slot": "801 801", "unknown": "1 None"}
    lines = [line for line in err.splitlines() if "export table" in line]
    assert lines == [
        f"gpupool: the CUDA runtime called slot {slot} of the driver's private export table cudart_interface "
        f"{{{table.uuid.lower()}}}, which gpupool does not emulate; it returns CUDA_ERROR_NOT_SUPPORTED "
        "(docs/remote.md)"
    ]


def test_every_export_table_has_a_distinct_uuid_and_fits_its_slots():
    assert len(BY_KEY) == len(TABLES)
    for table in TABLES:
        assert all(0 <= s.index < table.words for s in table.slots), table.name
        assert all(s.index > 0 for s in table.slots) or not table.sized, table.name


def test_the_shim_exports_every_name_the_real_driver_exports(shim_dir):
    """Libraries that resolve the driver with dlsym (cuBLASLt) find every name; unforwarded ones refuse."""
    from virtualize.common._shimgen import DRIVER_SYMBOLS

    names = [
        n.strip() for n in DRIVER_SYMBOLS.read_text().splitlines() if n.strip() and not n.startswith("#")
    ]
    library = ctypes.CDLL(str(shim_dir / "libcuda.so.1"))
    missing = [n for n in names if not hasattr(library, n)]
    assert missing == []
    assert len(names) > 600


def test_slots_cublas_and_the_runtime_use_answer_as_the_real_driver_does(shim_dir, worker):
    """What cuBLAS(Lt) and the runtime were measured asking natively (docs/remote.md), answered the same
    way and silently: the thread's tool-state object and a value of it, a declined object request, a
    dropped runtime warning."""

    def where(function: str) -> tuple[bytes, int]:
        table, slot = next((t, s) for t in TABLES for s in t.slots if s.function == function)
        return table.key, slot.index

    out, err = run_program(
        f"""
        import ctypes
        lib = ctypes.CDLL("libcuda.so.1")

        def slot(key, index, *argtypes):
            pointer = ctypes.c_void_p()
            assert lib.cuGetExportTable(ctypes.byref(pointer), key) == 0
            word = ctypes.cast(pointer, ctypes.POINTER(ctypes.c_void_p))[index]
            return ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)(word)

        P = ctypes.c_void_p
        obj, value = P(), ctypes.c_uint64()
        rc = slot(*{where("gp_x_tools_state_object")!r}, P, ctypes.c_uint64, P)(None, 0, ctypes.byref(obj))
        print("object", rc, obj.value is not None)
        rc = slot(*{where("gp_x_tools_object_value")!r}, P, P, P)(None, obj, ctypes.byref(value))
        print("value", rc, value.value)
        a, b = P(), P()
        print("declined", slot(*{where("gp_x_declined")!r}, P, P)(ctypes.byref(a), ctypes.byref(b)))
        message = slot(*{where("gp_x_runtime_message")!r}, ctypes.c_int, ctypes.c_int, ctypes.c_char_p, P)
        print("message", message(1, 2, b"Duplicate entry kernels named %s", None))
        """,
        client_env(shim_dir, worker),
    )
    assert out == {"object": "0 True", "value": "0 7", "declined": "801", "message": "0"}
    assert "gpupool" not in err  # nothing the user must read


def test_cufft_asks_a_loaded_module_for_its_functions_as_the_driver_answers(shim_dir, worker):
    """cuFFT, after cuModuleLoadData, asks slot 7 of export table 6e163fbe for the module's functions: each
    is handed to its callback (the functions a lookup by name gives, usable as any) and the answer is how
    many there were, as the driver answers (traced natively; without it every cuFFT plan fails)."""
    table, slot = next((t, s) for t in TABLES for s in t.slots if s.function == "gp_x_module_functions")
    out, err = run_program(
        f"""
        import ctypes
        cu = ctypes.CDLL("libcuda.so.1")
        U64 = ctypes.c_uint64
        assert cu.cuInit(0) == 0
        ctx = U64()
        assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0 and cu.cuCtxSetCurrent(ctx) == 0
        module = U64()
        image = b"// host-executor module\\n.visible .entry fill_u32()\\n.visible .entry mine(.param .u64 a)\\n"
        assert cu.cuModuleLoadData(ctypes.byref(module), image) == 0
        pointer = ctypes.c_void_p()
        assert cu.cuGetExportTable(ctypes.byref(pointer), {table.key!r}) == 0
        word = ctypes.cast(pointer, ctypes.POINTER(ctypes.c_void_p))[{slot.index}]
        EACH = ctypes.CFUNCTYPE(None, ctypes.c_void_p, U64)
        seen = []
        each = EACH(lambda arg, function: seen.append(function))
        functions = ctypes.CFUNCTYPE(U64, U64, U64, EACH, ctypes.c_void_p)(word)
        print("count", functions(ctx, module, each, None))
        n = ctypes.c_uint32()
        assert cu.cuModuleGetFunctionCount(ctypes.byref(n), module) == 0
        print("module_count", n.value, len(seen))
        names = []
        for f in seen:
            name = ctypes.c_char_p()
            assert cu.cuFuncGetName(ctypes.byref(name), U64(f)) == 0
            names.append(name.value.decode())
        print("names", {{"fill_u32", "mine"}} <= set(names) and len(set(names)) == len(names))
        by_name = U64()
        assert cu.cuModuleGetFunction(ctypes.byref(by_name), module, b"mine") == 0
        print("same_handle", by_name.value in seen)
        """,
        client_env(shim_dir, worker),
    )
    count = out.pop("count")
    assert out == {"module_count": f"{count} {count}", "names": "True", "same_handle": "True"}, err
    assert "gpupool" not in err


def test_page_locked_memory_as_the_device_side_of_a_copy_works_as_under_unified_addressing(shim_dir, worker):
    """XLA zeroes a freshly page-locked word with a device memset and reads it back with cuMemcpyDtoHAsync
    into the stack (its autotuner does this for every candidate); natively the host address is the device's.
    Both that and copies naming page-locked memory the device never used (host to host) work, in both
    directions, with the bytes a local GPU gives."""
    out, err = run_program(
        """
        import ctypes
        cu = ctypes.CDLL("libcuda.so.1")
        U64 = ctypes.c_uint64
        assert cu.cuInit(0) == 0
        ctx = U64()
        assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0 and cu.cuCtxSetCurrent(ctx) == 0
        stream = U64()
        assert cu.cuStreamCreate(ctypes.byref(stream), 0) == 0

        def pinned(n, fill):
            p = U64()
            assert cu.cuMemHostAlloc(ctypes.byref(p), U64(n), 1) == 0  # PORTABLE, as XLA asks
            ctypes.memset(p.value, fill, n)
            return p

        # the device zeroes it, then it is read back as a device address into pageable memory
        word, back = pinned(8, 0x5A), (ctypes.c_uint8 * 8)()
        print("memset", cu.cuMemsetD32Async(word, 0, U64(2), stream))
        print("read", cu.cuMemcpyDtoHAsync_v2(back, word, U64(8), stream), cu.cuStreamSynchronize(stream))
        print("zeroed", list(back) == [0] * 8, ctypes.string_at(word.value, 8) == bytes(8))

        # page-locked memory the device never used, as either side
        src, out = pinned(16, 0x33), (ctypes.c_uint8 * 16)()
        print("from_pinned", cu.cuMemcpyDtoH_v2(out, src, U64(16)), bytes(out) == b"\\x33" * 16)
        dst, data = pinned(16, 0), (ctypes.c_uint8 * 16)(*range(16))
        print("to_pinned", cu.cuMemcpyHtoD_v2(dst, data, U64(16)), ctypes.string_at(dst.value, 16) == bytes(range(16)))

        # and a device allocation still refuses a host address it does not own
        device = U64()
        assert cu.cuMemAlloc_v2(ctypes.byref(device), U64(16)) == 0
        print("stray", cu.cuMemcpyDtoH_v2(out, U64(0x1000), U64(16)))
        """,
        client_env(shim_dir, worker),
    )
    assert out == {
        "memset": "0",
        "read": "0 0",
        "zeroed": "True True",
        "from_pinned": "0 True",
        "to_pinned": "0 True",
        "stray": "1",
    }, err


def test_graph_edges_with_data_reach_the_worker_as_xla_adds_them(shim_dir, worker):
    """XLA's command buffers add kernel nodes with programmatic edges (cuGraphAddNode_v2 with edge data):
    the node and its edge, with the edge's data, are added, and the graph instantiates and runs."""
    out, err = run_program(
        """
        import ctypes
        cu = ctypes.CDLL("libcuda.so.1")
        U64 = ctypes.c_uint64
        assert cu.cuInit(0) == 0
        ctx = U64()
        assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0 and cu.cuCtxSetCurrent(ctx) == 0
        graph, a, b, c = U64(), U64(), U64(), U64()
        assert cu.cuGraphCreate(ctypes.byref(graph), 0) == 0
        assert cu.cuGraphAddEmptyNode(ctypes.byref(a), graph, None, U64(0)) == 0
        assert cu.cuGraphAddEmptyNode(ctypes.byref(b), graph, None, U64(0)) == 0
        programmatic = (ctypes.c_uint8 * 8)(1, 0, 1)  # from the programmatic port, type programmatic
        default = (ctypes.c_uint8 * 8)()
        add = cu.cuGraphAddDependencies_v2
        print("programmatic", add(graph, ctypes.byref(a), ctypes.byref(b), programmatic, U64(1)))
        params = (ctypes.c_uint8 * 256)()  # CUgraphNodeParams of type CU_GRAPH_NODE_TYPE_EMPTY (5)
        params[0] = 5
        print("add_node", cu.cuGraphAddNode_v2(ctypes.byref(c), graph, ctypes.byref(b), programmatic, U64(1), params),
              cu.cuGraphAddNode_v2(ctypes.byref(U64()), graph, ctypes.byref(a), default, U64(1), params))
        count = ctypes.c_size_t(0)
        assert cu.cuGraphGetEdges(graph, None, None, ctypes.byref(count)) == 0
        print("edges", count.value)
        exec_ = U64()
        print("launch", cu.cuGraphInstantiateWithFlags(ctypes.byref(exec_), graph, U64(0)),
              cu.cuGraphLaunch(exec_, U64(0)), cu.cuCtxSynchronize())
        """,
        client_env(shim_dir, worker),
    )
    assert out == {"programmatic": "0", "add_node": "0 0", "edges": "3", "launch": "0 0 0"}, err
    assert "gpupool" not in err
