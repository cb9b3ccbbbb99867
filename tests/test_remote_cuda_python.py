"""Real cuda-python programs through the shim, and the CUDA executor itself, on a machine with no GPU.

The chain test runs the worker's CUDA executor (virtualize/server/_cuda.py, cuda.bindings) for real: its
cuda.bindings loads gpupool's libcuda.so.1 too, which forwards to a second worker with the host
executor. So every call the executor makes goes through the real cuda.bindings API.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from remote_helpers import MiB, client_env, expected_queries, needs_cc, parse, run_client, shim_dir, worker

from server.workers import WorkerDevice, start_worker
from virtualize.client.remote import remote_env

pytest.importorskip("cuda.bindings.driver")
pytest.importorskip("cuda.core")
pytestmark = needs_cc
__all__ = ["shim_dir", "worker"]  # fixtures

PROGRAMS = Path(__file__).with_name("remote_cuda_programs.py")


def run_program(name: str, env: dict[str, str], cwd: Path) -> dict[str, str]:
    proc = subprocess.run(
        [sys.executable, str(PROGRAMS), name], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return parse(proc.stdout)


def test_a_cuda_bindings_program_runs_unmodified(shim_dir, worker, tmp_path):
    out = run_program("bindings", client_env(shim_dir, worker), tmp_path)
    assert out == {
        "name": "gpupool host executor 0 (tests only)",
        "total": str(64 * MiB),
        "added": "True",
        "elapsed_ms_nonnegative": "True",
        "huge_alloc": "CUDA_ERROR_OUT_OF_MEMORY",
        "error_string": "out of memory",
    }


def test_a_cuda_core_program_runs_unmodified(shim_dir, worker, tmp_path):
    out = run_program("core", client_env(shim_dir, worker), tmp_path)
    assert out == {"device": "gpupool host executor 0 (tests only) 9", "added": "True"}


@pytest.fixture
def cuda_executor_worker(shim_dir):
    """A worker with the real CUDA executor whose driver is the shim, pointed at a host worker."""
    inner = start_worker("inner", [WorkerDevice(i, "", 64 * MiB) for i in range(2)], bind_host="127.0.0.1",
                         env={}, executor="host")  # fmt: skip
    answer = {"id": "inner", "worker": inner.answer()}
    env = {**remote_env(answer, cache_root=shim_dir.parent / "cache"), "LD_LIBRARY_PATH": str(shim_dir)}
    # The host executor's devices 1 and 0 (UUIDs 61.. and 60..), in that order, found by UUID.
    devices = [
        WorkerDevice(7, f"GPU-{b * 4}-{b * 2}-{b * 2}-{b * 2}-{b * 6}", 48 * MiB) for b in ("61", "60")
    ]
    handle = start_worker("outer", devices, bind_host="127.0.0.1", env=env, executor="cuda")
    yield handle
    handle.stop()
    inner.stop()


@pytest.mark.parametrize(
    "scenario",
    [
        "devices",
        "copies",
        "events",
        "kernels",
        "quota",
        "two_devices",
        "queries",
        "async_copies",
        "async_copy_ordering",
        "pinned_stream_order",
        "pinned_kernels",
        "memory_calls",
        "graph_memory",
        "graph_batch_mem_ops",
        "arrays_rest",
        "multicast",
        "texture_references",
        "decompress",
        "library_managed",
        "cooperative_multi_device",
    ],
)
def test_the_cuda_executor_serves_every_scenario(shim_dir, cuda_executor_worker, scenario):
    """virtualize/server/_cuda.py through real cuda.bindings: the lease's device 0 is the host worker's device 1."""
    out, _ = run_client(scenario, client_env(shim_dir, cuda_executor_worker))
    expected = {
        "devices": {
            "total": str(48 * MiB),
            "info_free_after": str(40 * MiB),
            "cc_major": "9",
            "uuid": "61" * 16,
        },
        "copies": {"htod_dtoh": "True", "dtod": "True", "generic": "True", "pinned_copy": "True"},
        "events": {"query": "0", "elapsed_ok": "True", "destroyed_stream_sync": "400"},
        "kernels": {
            "first": "17",
            "not_added": "7",
            "param1": "8+4",
            "launch_unknown_attribute": "801 801",  # refused by the shim, at the call
            "sync_after_unknown_attribute": "0",
            "sync_after_fault": "700",
        },
        "queries": expected_queries(),
        "two_devices": {
            "count": "2",
            "ctx_device1": "1",
            "peer_copy": "11" * 16 + "10" * 16,
            "bad_device": "101",
        },
        "quota": {"first": "0", "second": "2", "pool_over": "2", "after_free": "0"},  # 48 MiB partition
        "async_copies": {  # queued on the stream behind an event and a mark, sent once both are passed
            **{
                k: "True,True"
                for k in ("stream_sync", "event_sync", "event_query", "ctx_sync", "host_function")
            },
            "host_function_saw": "True",
            "many_landed": "True",
            "many_sent_back": "True",
            "later_copy_wins": "True",
            "pageable_waits": "True",
            "bad_stream_sync": "400",
        },
        "async_copy_ordering": {  # a copy's bytes appear exactly when its event completes
            k: "True"
            for k in (
                "held_none_landed",
                "held_still_none",
                "each_event_shows_its_copies",
                "waiter_saw_all",
                "host_functions_see_exactly_the_earlier_copies",
                "chain_landed",
                "chain_sent_back",
                "chain_overwritten_after",
            )
        },
        "pinned_stream_order": {  # the DMA on the stream reads and writes the client's pages
            "target_untouched": "True",
            "read_at_stream_time": "True",
            "free": "0,0",
        },
        "pinned_kernels": {  # page-locked memory mapped for kernels through cuMemCreate / cuMemMap
            "sync_after_launch": "0",
            "launched": "[5, 40004]",
            "sync_after_node_update": "0",
            "node_updated": "[16, 20, 20]",
            "exec_updated": "[16, 320]",
            "registered_launch": "0 0",
            "registered_words": "[2, 40001]",
        },
        "memory_calls": {  # the executor's cuPointerSetAttribute, cuDeviceSetMemPool, cuFlushGPUDirectRDMAWrites
            "set_sync_memops": "0",
            "sync_memops": "1",
            "set_sync_memops_elsewhere": "1",
            "set_pool": "0",
            "current_is_set": "True",
            "set_default_back": "0",
            "current_is_default": "True",
            "flush_rdma_writes": "0",
            "flush_bad_scope": "1",
            "log_current": "0 0",
            "log_dump": "0 0 00",
            "log_dump_bad": "[1, 0]",
            "peer_copied": "True",
            "batch_written": "(7, 0, 1099511627776)",
            "sync_after_batch": "1",
            "new_memory_has_no_advice": "['0 -2', '0 -2']",
        },
        "graph_memory": {  # issue 25's graph memory nodes through cuda.bindings' own structures
            "finished": "1",
            "copied": "(7, 7, 7, 7)",
            "read_back": "(1, 1, 0, 4096, True, 1, 0, 3)",
            "free_reads_back": "True",
            "past_partition": "2",
        },
        "graph_batch_mem_ops": {
            "finished": "1",
            "written": str((0x11, 0x2222_3333_4444_5555)),
            "read_back": "(3, True)",
            "instance_wrote": "0x44",
        },
        "arrays_rest": {
            "finished": "1",
            "planes": "[(64, 32, 1, 1), (32, 16, 1, 2)]",
            "sparse_tile": "(128, 128, 1)",
            "requirements_cover_it": "True",
            "map_foreign_memory": "400",
        },
        "multicast": {"finished": "1", "granularity": str(2 * MiB), "read_through": "5a5a5a5a5a5a5a5a"},
        "texture_references": {
            "finished": "1",
            "address_back": "(0, True)",
            "settings": "(1, 2, 2, 1, 1, 0.5, 0.25, 3.0, 4, (0.125, 0.25, 0.5, 1.0), 2)",
            "after_unload": "400",
        },
        "decompress": {
            "finished": "1",
            "decompressed": "True",
            "actual_size": "True",
            "no_error_index": "True",
        },
        "library_managed": {"finished": "1", "same_again": "True", "after_kernel": "[15, 16, 17, 18]"},
        "cooperative_multi_device": {
            "launched": "0",
            "filled": "5 5",
            "too_large": "720",
            "foreign_stream": "400",
        },
    }[scenario]
    assert {k: out.get(k) for k in expected} == expected


def test_the_cuda_executor_serves_cuda_core(shim_dir, cuda_executor_worker, tmp_path):
    out = run_program("core", client_env(shim_dir, cuda_executor_worker), tmp_path)
    assert out["added"] == "True"


def test_the_gpu_machines_raw_bindings_program_runs_here_on_the_host_executor(shim_dir, worker, tmp_path):
    """tests/gpu/remote/prog_bindings.py itself (PTX module, launches, copies, events): its saxpy is
    one of the host executor's built-in kernels, so even its numbers are checked."""
    program = Path(__file__).parent / "gpu" / "remote" / "prog_bindings.py"
    proc = subprocess.run([sys.executable, str(program)], env=client_env(shim_dir, worker), cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for line in (
        "saxpy x10 matches numpy True",
        "memset + dtod True",
        "elapsed > 0 True",
        "event query True",
    ):
        assert line in lines, proc.stdout
    assert "libcuda" in proc.stderr and str(shim_dir) in proc.stderr  # it loaded the shim


def test_the_gpu_machines_memory_calls_program_runs_here_on_the_host_executor(shim_dir, worker, tmp_path):
    """tests/gpu/remote/prog_memory_calls.py itself (issue 25's memory calls through cuda.bindings' own
    structures): every step answers CUDA_SUCCESS and reads back what it set."""
    program = Path(__file__).parent / "gpu" / "remote" / "prog_memory_calls.py"
    proc = subprocess.run([sys.executable, str(program)], env=client_env(shim_dir, worker), cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    for line in (
        "first half ('CUDA_SUCCESS', 1) ('CUDA_SUCCESS', 0) ('CUDA_SUCCESS', [0, -2, -2]) ('CUDA_SUCCESS', 0)",
        "second half ('CUDA_SUCCESS', 1) ('CUDA_SUCCESS', -2) ('CUDA_SUCCESS', [0, -1, -2]) ('CUDA_SUCCESS', -1)",
        "whole ('CUDA_SUCCESS', 1) ('CUDA_SUCCESS', -2) ('CUDA_SUCCESS', [0, -2, -2]) ('CUDA_SUCCESS', -2)",
        "attributes of the first half CUDA_SUCCESS [1, 0]",
        "after the batch ('CUDA_SUCCESS', -1) ('CUDA_SUCCESS', 0)",
        "SYNC_MEMOPS True",
        "current is the new pool True",
        "current is the default True",
        "flush GPUDirect RDMA writes CUDA_SUCCESS",
        "copied True",
        "written 7 1099511627776",
        "copied with attributes True",
    ):
        assert line in lines, proc.stdout
    assert not [line for line in lines if "CUDA_ERROR" in line], proc.stdout
    assert str(shim_dir) in proc.stderr  # it loaded the shim


def test_the_gpu_machines_recapture_program_runs_here_on_the_host_executor(shim_dir, worker, tmp_path):
    """tests/gpu/remote/prog_graph_recapture.py itself, through cuda.bindings: a recapture found (this
    pretend driver has CUDA 13.3's call) asks the callback about the saxpy and memset values it changes
    and the graph runs them, a refusal fails the recapture; graph allocations of a quarter of the 64 MiB
    partition made and destroyed eight times, then launched, read and freed eight times, fit, and three
    quarters of the partition can be allocated after."""
    program = Path(__file__).parent / "gpu" / "remote" / "prog_graph_recapture.py"
    proc = subprocess.run([sys.executable, str(program)], env=client_env(shim_dir, worker), cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    for line in (
        "cuGetProcAddress(cuStreamBeginRecaptureToGraph, the driver's version): CUDA_SUCCESS CU_GET_PROC_ADDRESS_SUCCESS",
        "the same graph True callback asked ['kernel a=2.0 -> kernel a=3.0 (status 0)', "
        "'memset value=5 -> memset value=6 (status 0)']",
        "recaptured graph runs (3.0, 6)",
        "taken (4.0, 7)",
        "end of the refused recapture CUDA_ERROR_GRAPH_RECAPTURE_FAILURE",
        "never-launched allocation nodes of a quarter of the memory made and destroyed 8",
        "launched allocations read after their graphs [7, 7, 7, 7, 7, 7, 7, 7]",
        "three quarters of the memory allocated after CUDA_SUCCESS",
    ):
        assert line in lines, proc.stdout
    assert str(shim_dir) in proc.stderr  # it loaded the shim


NATIVE_CALLS_LINES = [
    "chained copies to the host in place True",
    "copies from the host, kernels, back True",
    "synchronous page-locked and device copies True",
    "1 MiB pageable round trip True",
    "4 MiB pageable copy on a stream after a kernel and a memset True",
    "graph x10 of 3 kernels True",
    "elapsed time of the replays >= 0 and < 10 s True",
    "40 pairs' elapsed times >= 0 True",
    "reversed pairs <= 0 True",
    "a start recorded again gives a new answer True",
]


@pytest.mark.parametrize("transport", ["local socket", "tcp"])
def test_the_gpu_machines_native_calls_program_gets_its_results_through_the_native_loop(
    shim_dir, worker, tmp_path, transport
):
    """tests/gpu/remote/prog_native_calls.py itself, the calls the worker serves in C (issue 31):
    sixteen copies into page-locked memory in flight on four streams chained by events are all in place
    at the last event, copies back, kernels on them and copies out again in stream order, synchronous
    page-locked and device-to-device copies, 1 MiB copies, a captured graph replayed ten times and an
    elapsed time — over the local socket (page-locked memory shared with the worker) and over TCP."""
    from virtualize.common import _wire

    env = client_env(shim_dir, worker)
    if transport == "tcp":
        env.pop(_wire.ENV_LOCAL, None)
    program = Path(__file__).parent / "gpu" / "remote" / "prog_native_calls.py"
    proc = subprocess.run([sys.executable, str(program)], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == NATIVE_CALLS_LINES, proc.stdout + proc.stderr
    assert str(shim_dir) in proc.stderr  # it loaded the shim


def test_ptx_kernels_are_known_to_the_host_executor_with_their_parameter_layout():
    from virtualize.server._executor_host import ptx_layouts

    ptx = b""".visible .entry k(
        .param .u64 k_param_0, .param .u32 k_param_1, .param .align 8 .b8 k_param_2[24], .param .u8 k_param_3)
    { ret; }
    .entry empty() { ret; }"""
    assert ptx_layouts(ptx) == {"k": [(0, 8), (8, 4), (16, 24), (40, 1)], "empty": []}


VMM_SHARE_LINES = [
    "  child on device 1 sees the parent's bytes True",
    "after-map child exit 0",
    "after-map parent sees the child's write True",
    "import-first child exit 0",
    "import-first parent sees the child's write True",
]


@pytest.mark.parametrize("isolate", ["", "1"], ids=["shared", "isolate"])
def test_the_gpu_machines_vmm_sharing_program_runs_here_on_a_two_device_lease(shim_dir, tmp_path, isolate):
    """tests/gpu/multi/prog_vmm_share.py itself (NCCL's cuMem transport by hand, cuda.bindings): memory
    exported as a descriptor by a process on device 0 is imported, mapped and written by one on device
    1, exported after mapping and imported before the exporter maps it; with GPUPOOL_ISOLATE, between
    the two processes' own workers."""
    handle = start_worker("two", [WorkerDevice(i, "", 64 * MiB) for i in range(2)], bind_host="127.0.0.1", env={},
                          executor="host")  # fmt: skip
    try:
        proc = _vmm_share(client_env(shim_dir, handle, GPUPOOL_ISOLATE=isolate), tmp_path)
    finally:
        handle.stop()
    assert proc.stdout.splitlines() == VMM_SHARE_LINES, proc.stdout + proc.stderr


def test_the_cuda_executor_shares_virtual_memory_between_processes(shim_dir, cuda_executor_worker, tmp_path):
    """The same program against the CUDA executor (virtualize/server/_cuda.py through real cuda.bindings): the
    worker gives the importer its reference by retaining a mapping, or, before any mapping, by
    exporting and importing a descriptor inside the worker."""
    proc = _vmm_share(client_env(shim_dir, cuda_executor_worker), tmp_path)
    assert proc.stdout.splitlines() == VMM_SHARE_LINES, proc.stdout + proc.stderr


def _vmm_share(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    program = Path(__file__).parent / "gpu" / "multi" / "prog_vmm_share.py"
    proc = subprocess.run([sys.executable, str(program)], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.mark.parametrize("encryption", ["never", "always"])
def test_the_cuda_executors_copies_into_page_locked_memory_reach_a_client_on_another_host(
    shim_dir, cuda_executor_worker, encryption
):
    """Across hosts (TCP, not the local socket whose client pages the worker's copies write directly), each
    copy is queued into a staging buffer with an event and a mark behind it (_cuda._InFlight: one C call, an
    event a finished copy gave back) and sent by the delivery thread: 1 MiB copies between 300 rounds of
    memset, record and synchronise are in place, with the memset's bytes, when their stream's synchronise
    returns. (Not the scenarios with host functions holding streams: nested over the shim, the inner host
    executor runs them while the outer worker's delivery thread waits on it, a cycle no GPU has.)"""
    env = client_env(shim_dir, cuda_executor_worker, GPUPOOL_DATA_ENCRYPTION=encryption)
    env.pop("GPUPOOL_WORKER_LOCAL", None)
    out, _ = run_client("answered_beside_copies", env)
    assert out == {"wrong": "0", "failed": "0"}
