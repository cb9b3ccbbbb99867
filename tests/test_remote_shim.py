"""Remote execution end to end without a GPU: gpupool's libcuda.so.1 built from source, loaded by a
real program (tests/remote_client.py, which resolves every call through cuGetProcAddress_v2 as
cuda.bindings does), talking over TCP to a real worker process whose executor is the host-memory one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest
from remote_helpers import (
    CLIENT,
    MiB,
    client_env,
    expected_queries,
    ipc_pair,
    needs_cc,
    parse,
    profile_rows,
    run_client,
    shim_dir,
    worker,
)

from server.workers import WorkerDevice, start_worker
from virtualize.common import _wire
from virtualize.common._results import CUresult
from virtualize.server._executor_host import HOST_KERNELS

pytestmark = needs_cc
__all__ = ["shim_dir", "worker"]  # fixtures


def test_devices_show_the_partition_not_the_gpu(shim_dir, worker):
    """A lease's device shows its partition; before cuInit a device query is refused with
    CUDA_ERROR_NOT_INITIALIZED, as the driver does (PyTorch's lazy-init check relies on it)."""
    out, _ = run_client("devices", client_env(shim_dir, worker))
    assert out["count_before_init"] == "3 -1"  # CUDA_ERROR_NOT_INITIALIZED, the count untouched
    assert out["count"] == "1"
    assert out["name"].startswith("gpupool host executor 0")
    assert out["total"] == str(64 * MiB)  # the partition, while the emulated GPU has 80 GiB
    assert out["info_total"] == str(64 * MiB)
    assert out["info_free"] == str(64 * MiB)
    assert out["info_free_after"] == str(56 * MiB)
    assert out["cc_major"] == "9"
    assert out["uuid"] == "60" * 16
    assert out["ctx_device"] == "0"
    assert out["error_name"] == "CUDA_ERROR_OUT_OF_MEMORY"


def test_copies_memsets_and_host_memory(shim_dir, worker):
    out, _ = run_client("copies", client_env(shim_dir, worker))
    assert out["htod_dtoh"] == "True"  # 10 MiB: several chunks each way
    assert out["dtod"] == "True"
    assert out["generic"] == "True"
    # D32 x4, D16 x2, D8 x3 (then one byte of the earlier copy)
    assert out["memsets"][:46] == "efbeadde" * 4 + "34123412" + "7f7f7f"
    assert out["htod_async_took_bytes"] == "True"
    assert out["device_memory_type"] == "2"
    assert out["host_memory_type"] == "1"
    assert out["pinned_copy"] == "True"
    assert out["htod_from_device_address"] == "1"  # a device pointer where host memory belongs ...
    assert out["dtoh_into_device_address"] == "1"
    assert out["still_connected"] == "0"  # ... is refused without harm
    assert out["double_free"] == "1"  # CUDA_ERROR_INVALID_VALUE


def test_streams_and_events(shim_dir, worker):
    out, _ = run_client("events", client_env(shim_dir, worker))
    assert out == {
        "query": "0",
        "elapsed_ok": "True",
        "capturing": "0",
        "destroyed_stream_sync": "400",  # CUDA_ERROR_INVALID_HANDLE: the worker forgot it
    }


def test_allocations_beyond_the_partition_run_out_of_memory(shim_dir, worker):
    out, _ = run_client("quota", client_env(shim_dir, worker))
    assert out == {
        "first": "0",
        "second": "2",  # 40 + 30 MiB > 64 MiB: CUDA_ERROR_OUT_OF_MEMORY
        "pool_over": "2",
        "after_free": "0",
        "pool_fits": "0",
        "sync": "0",
    }


@pytest.mark.parametrize("sync", ["stream", "ctx", "event"])
@pytest.mark.parametrize("native", ["1", "0"], ids=["native-loop", "python-only"])
def test_memory_freed_to_a_pool_is_kept_until_a_synchronisation_or_a_trim(shim_dir, sync, native):
    """As natively: the pool keeps freed memory (reused by its own allocations, in the way of any other)
    until the process synchronises, whichever of its loops serves the synchronisation; a release
    threshold keeps it until a trim; what a process's pools keep is the lease's again when it ends."""
    worker = start_worker("test-lease", [WorkerDevice(0, "", 64 * MiB)], bind_host="127.0.0.1",
                          env={"GPUPOOL_WORKER_NATIVE": native}, executor="host")  # fmt: skip
    try:
        env = client_env(shim_dir, worker, SYNC=sync)
        out, err = run_client("pool_keeps_freed", env)
        assert out == {
            "alloc_while_kept": "2",  # CUDA_ERROR_OUT_OF_MEMORY
            "free_while_kept_fits": "False",
            "pool_reuses_it": "0",
            "sync": "0",
            "alloc_after_sync": "0",
            "alloc_kept_by_threshold": "2",
            "alloc_after_trim": "0",
        }, err
        after, _ = run_client("quota", env)  # a new process has the whole partition
        assert after["first"] == "0" and after["after_free"] == "0"
    finally:
        worker.stop()


def test_a_partition_is_at_most_the_memory_cuda_says_the_gpu_has():
    """A whole-GPU lease's limit is NVML's total, above CUDA's (the driver's reserve): the worker checks
    allocations against CUDA's, or they pass where the GPU cannot hold them (on an H200 a pool's kept
    memory was not in the way of a cuMemAlloc that natively fails). A device whose total CUDA cannot
    say keeps its partition."""
    from virtualize.server._executor import CudaError
    from virtualize.server.worker import partition_limits

    class Executor:  # the seam: the GPUs' totals as the driver answers them
        def cuDeviceTotalMem(self, index: int) -> int:
            if index == 2:
                raise CudaError(CUresult.INVALID_DEVICE, "gone")
            return 80 << 30

    devices = [WorkerDevice(0, "", 81 << 30), WorkerDevice(1, "", 40 << 30), WorkerDevice(2, "", 81 << 30)]
    assert partition_limits(devices, Executor()) == [80 << 30, 40 << 30, 81 << 30]


@pytest.mark.parametrize("level", ["debug", "verbose"])
def test_the_worker_starts_whatever_log_level_it_is_given(shim_dir, level):
    """GPUPOOL_WORKER_LOG in lower case is that level; a word that is no level is INFO with a warning
    (a worker that did not start would fail the lease)."""
    handle = start_worker("test-lease", [WorkerDevice(0, "", 64 * MiB)], bind_host="127.0.0.1",
                          env={"GPUPOOL_WORKER_LOG": level}, executor="host")  # fmt: skip
    try:
        out, _ = run_client("quota", client_env(shim_dir, handle))
        assert out["first"] == "0"
    finally:
        handle.stop()


def test_a_lease_cannot_touch_another_leases_memory(shim_dir, worker):
    other = start_worker("other-lease", [WorkerDevice(0, "", 64 * MiB)], bind_host="127.0.0.1", env={},
                         executor="host")  # fmt: skip
    try:
        proc = subprocess.Popen(
            [sys.executable, str(CLIENT), "alloc_for_other"],
            env=client_env(shim_dir, other),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        foreign = proc.stdout.readline().split()[1]  # a live allocation of the other lease
        out, _ = run_client("isolation", client_env(shim_dir, worker, GUESSED_ADDRESS=foreign))
        proc.communicate("\n", timeout=30)
    finally:
        other.stop()
    assert out["sync_after_foreign_memset"] == "1"  # refused by the worker, reported at the sync
    assert out["sync_again"] == "0"  # reported once
    assert out["attribute_of_foreign"] == "1"
    assert out["overrun"] == "0"  # asynchronous: the next sync says
    assert out["sync_after_overrun"] == "1"
    assert out["bad_stream"] == "400"


def test_kernels_launch_with_parameters_and_faults_surface_at_the_next_sync(shim_dir, worker):
    """Kernels run with their parameters; a fault is reported by the next sync; a launch attribute the
    worker does not pass on is refused by the launch call itself, said once, the context unspoiled."""
    out, err = run_client("kernels", client_env(shim_dir, worker))
    assert out["missing_function"] == "500"
    # filled with 7 by cuLaunchKernel, then +5 by each cuLaunchKernelEx (priority, PDL)
    assert out["first"] == "17"
    assert out["last_added"] == "17"
    assert out["not_added"] == "7"  # past the 64 threads of the second launch
    assert out["beyond"] == "7"
    assert out["param1"] == "8+4"
    assert out["launch_unknown_attribute"] == "801 801"  # CUDA_ERROR_NOT_SUPPORTED at the call, twice ...
    assert out["sync_after_unknown_attribute"] == "0"  # ... nothing of it was sent
    assert err.count("launch attribute 13 (a CUlaunchAttributeID) is not forwarded") == 1
    assert out["fault_launch"] == "0"  # launches do not wait ...
    assert out["sync_after_fault"] == "700"  # ... the fault is reported by the next sync


@pytest.mark.parametrize("ring", ["0", "1"])
def test_with_isolate_a_child_process_that_asserts_leaves_its_parent_working(shim_dir, worker, ring):
    """GPUPOOL_ISOLATE=1 (gpuattach run --isolate): a child process of the lease runs in a worker of its own,
    so its kernel's device-side assert (sticky for the context that ran it) ends only its own context, as
    natively; the two workers still share the lease's partition, and the child's memory is the lease's
    again once it has exited. Without it, the child and its parent share one context, and the assert is
    the parent's too."""
    isolated, isolated_err = run_client(
        "trap_in_a_child_process", client_env(shim_dir, worker, GPUPOOL_ISOLATE="1", GPUPOOL_SHIM_RING=ring)
    )
    assert (
        "--isolate` gives each process" not in isolated_err
    )  # isolated: the fault is the child's, as natively
    assert (
        isolated["child_alloc_past_the_rest"] == "2"
    )  # the parent's 5/8 count: the partition is the lease's
    assert isolated["child_alloc_a_quarter"] == "0"
    assert isolated["child_sync_after_trap"] == "710"
    assert isolated["parent_sync"] == "0"
    assert isolated["parent_value"] == "0 34120000"
    assert isolated["parent_launch"] == isolated["parent_sync_after_launch"] == "0"
    assert isolated["parent_alloc_most"] == "0"  # the child's quarter went with its worker

    shared, err = run_client("trap_in_a_child_process", client_env(shim_dir, worker, GPUPOOL_SHIM_RING=ring))
    assert shared["child_sync_after_trap"] == "710"
    assert shared["parent_sync"] == "710"
    # each process that meets the shared context's fault is told why, and the way out (once each)
    assert err.count("gpuattach run --isolate` gives each process a context of its own") == 2


@pytest.mark.parametrize("size", [4096, 3 * MiB])
def test_with_isolate_ipc_handles_open_across_workers(shim_dir, size):
    """Under GPUPOOL_ISOLATE the exporter and the importer have workers of their own. A memory handle opens all
    the same: the importer's worker maps the exporter's pages at their address (free there: the lease's
    workers keep their windows apart, though here every worker draws the same random spots), the importer
    reads the exporter's bytes there and its write is what the exporter reads next, as natively; closing
    twice is refused the second time. An event handle opens as an event of the importer's worker, which a
    stream waits on and the importer destroys, the exporter's staying. Another lease's worker still gets
    nothing from the handle."""
    worker = start_worker("isolated-lease", [WorkerDevice(0, "", 64 * MiB)], bind_host="127.0.0.1",
                          env={"GPUPOOL_WINDOW_SEED": "7"}, executor="host")  # fmt: skip
    try:
        _ipc_across_workers(shim_dir, worker, size)
    finally:
        worker.stop()


@contextlib.contextmanager
def _holding_isolated(shim_dir, **exporter_env):
    """An isolated lease (host executor) whose exporting process has handed 3 MiB to an importing process
    that holds it open: (the lease's worker, the exporter, the importer, the sockets of the workers that
    answered before the importer came: the exporter's). Every process is stopped at the end."""
    worker = start_worker("isolated-lease", [WorkerDevice(0, "", 64 * MiB)], bind_host="127.0.0.1", env={},
                          executor="host")  # fmt: skip
    env = client_env(shim_dir, worker, GPUPOOL_ISOLATE="1", IPC_BYTES=str(3 * MiB))
    exporter = subprocess.Popen([sys.executable, str(CLIENT), "ipc_export"], env={**env, **exporter_env},
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    importer = None
    try:
        handle = exporter.stdout.readline().split()[1]
        answering = set(worker.state_dir.glob("ipc-*.sock"))
        importer = subprocess.Popen([sys.executable, str(CLIENT), "ipc_import"],
                                    env={**env, "IPC_HANDLE": handle, "IPC_HOLD": "1"}, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True)  # fmt: skip
        got = {}
        while "holding" not in got and (line := importer.stdout.readline()):
            got.update([line.split(" ", 1)])
        assert got == {"open": "0\n", "sees_export": "True\n", "holding": "1\n"}
        yield worker, exporter, importer, answering
    finally:
        for proc in (exporter, importer):
            if proc is not None:
                proc.kill()
                proc.wait(10)
        worker.stop()


def _exporter_frees(exporter) -> None:
    exporter.stdin.write("\n")
    exporter.stdin.flush()
    while (line := exporter.stdout.readline()) and not line.startswith("freed"):
        pass
    assert line == "freed 0\n"  # the exporter freed it and still runs


def _exporter_sees(exporter) -> str:
    """What the lease uses, in MiB, as the exporter (IPC_FREE, after its free) sees it."""
    exporter.stdin.write("used\n")
    exporter.stdin.flush()
    return exporter.stdout.readline().split()[1]


def test_with_isolate_memory_opened_from_a_process_that_has_exited_counts_until_it_is_closed(shim_dir):
    """Natively memory a process opened by IPC handle stays allocated, and counted, after its exporter has
    exited, until the opener closes it. Under GPUPOOL_ISOLATE the exporter's worker counted it and lets go
    when its process ends; the opener's worker counts it from then on, and no longer once it is closed."""
    with _holding_isolated(shim_dir) as (_, exporter, importer, _):
        exporter.communicate("\n", timeout=60)  # it frees nothing itself: its exit does
        assert exporter.returncode == 0
        out, _ = importer.communicate("\n", timeout=60)
        assert importer.returncode == 0, out
        assert parse(out)["used_mib_after_exporter_left"] == "3"  # the 3 MiB the opener still maps
        assert parse(out)["used_mib_after_close"] == "0"


def test_with_isolate_memory_freed_by_its_exporter_counts_until_its_opener_closes_it(shim_dir):
    """Natively memory another process has open by IPC handle stays allocated, and counted, when its
    exporter frees it, until the opener closes it. Under GPUPOOL_ISOLATE the exporter's worker keeps
    counting it after the free, as long as the opener's worker holds it, and stops at the close."""
    with _holding_isolated(shim_dir, IPC_FREE="1") as (_, exporter, importer, _):
        _exporter_frees(exporter)
        out, _ = importer.communicate("\n", timeout=60)
        assert importer.returncode == 0, out
        assert parse(out)["used_mib_after_exporter_left"] == "3"  # freed, still open in the opener
        assert parse(out)["used_mib_after_close"] == "0"
        assert _exporter_sees(exporter) == "0"  # the exporter sees the same
        exporter.communicate("\n", timeout=60)
        assert exporter.returncode == 0


def test_with_isolate_memory_freed_by_its_exporter_stops_counting_when_its_openers_worker_dies(shim_dir):
    """An opener whose worker is killed while it holds memory its exporter has freed (the opener could not
    close it: its worker crashed) holds it no longer: the exporter's worker stops counting it once that
    worker has gone (natively the memory goes with the last process that held it)."""
    with _holding_isolated(shim_dir, IPC_FREE="1") as (worker, exporter, _, answering):
        (opener,) = set(worker.state_dir.glob("ipc-*.sock")) - answering
        _exporter_frees(exporter)
        assert _exporter_sees(exporter) == "3"  # freed by the exporter, open in the opener
        os.kill(int(opener.name[len("ipc-") : -len(".sock")]), signal.SIGKILL)  # the opener's worker
        deadline = time.monotonic() + 20
        while _exporter_sees(exporter) != "0":
            assert time.monotonic() < deadline, "still counted after the opener's worker died"
            time.sleep(0.2)


def test_with_isolate_a_state_folder_too_deep_for_a_socket_leaves_the_processes_running(
    shim_dir, tmp_path, monkeypatch
):
    """Where the lease's state folder is too deep for a Unix socket's path, its workers cannot answer each
    other: a handle of another process then fails to open (CUDA_ERROR_INVALID_VALUE, as one of another
    lease), and the processes, the exporter's included, run on."""
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))  # where start_worker makes the state folder
    worker = start_worker("deep-lease", [WorkerDevice(0, "", 64 * MiB)], bind_host="127.0.0.1", env={},
                          executor="host")  # fmt: skip
    try:
        env = client_env(shim_dir, worker, GPUPOOL_ISOLATE="1")
        exporter = subprocess.Popen([sys.executable, str(CLIENT), "ipc_export"], env=env, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True)  # fmt: skip
        try:
            handle = exporter.stdout.readline().split()[1]
            out, _ = run_client("ipc_import", {**env, "IPC_HANDLE": handle})
            assert out == {"open": "1"}
            exporter.stdin.write("\n")
            exporter.stdin.flush()
            assert exporter.stdout.readline().split()[0] == "event_handle"
            assert exporter.stdout.readline().split() == ["after_import", "not", "all", "the", "importer's"]
        finally:
            exporter.kill()
            exporter.wait(10)
    finally:
        worker.stop()


def _ipc_across_workers(shim_dir, worker, size):
    # What a process worker that crashed leaves in the state folder: its socket and its windows' note. The
    # next worker that looks removes them: nobody asks it again, or keeps clear of its windows.
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = [worker.state_dir / f"ipc-{gone.pid}.sock", worker.state_dir / f"windows-{gone.pid}"]
    stale[0].write_text("")
    stale[1].write_text("0 10000000000\n")
    env = client_env(shim_dir, worker, GPUPOOL_ISOLATE="1", IPC_BYTES=str(size))  # a slab's; pages of its own
    exporter = subprocess.Popen([sys.executable, str(CLIENT), "ipc_export"], env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        handle = exporter.stdout.readline().split()[1]
        event_handle = exporter.stdout.readline().split()[1]
        out, err = run_client("ipc_import", {**env, "IPC_HANDLE": handle, "IPC_EVENT_HANDLE": event_handle})
        assert out == {
            "open": "0", "sees_export": "True", "close": "0", "closed_twice": "1",
            "event_open": "0", "event_wait": "0", "event_destroy": "0",
        }  # fmt: skip
        assert "open across them" not in err
        assert not any(path.exists() for path in stale)
        other = start_worker("other-lease", [WorkerDevice(0, "", 64 * MiB)], bind_host="127.0.0.1", env={},
                             executor="host")  # fmt: skip
        try:
            out, _ = run_client("ipc_import", {**client_env(shim_dir, other, GPUPOOL_ISOLATE="1"),
                                               "IPC_HANDLE": handle, "IPC_EVENT_HANDLE": event_handle})  # fmt: skip
            assert out == {
                "open": "1",
                "event_open": "400",
            }  # INVALID_VALUE, INVALID_HANDLE: not that lease's
        finally:
            other.stop()
        exporter.stdin.write("\n")
        exporter.stdin.flush()
        assert exporter.stdout.readline().split() == ["after_import", "abababab"]  # the importer's write
        assert exporter.stdout.readline().split() == ["event_after_import", "0"]  # still the exporter's
    finally:
        exporter.kill()
        exporter.wait(10)


def test_batched_decompression_reads_and_writes_only_the_leases_memory(shim_dir, worker):
    """DEFLATE data in an allocation decompresses into another, its size written, no operation's error
    index; an operation past its destination, on a source or size word not the lease's, or of an unknown
    algorithm is refused."""
    out, err = run_client("decompress", client_env(shim_dir, worker))
    assert out["finished"] == "1", err
    assert out["decompressed"] == out["actual_size"] == out["no_error_index"] == "True"
    refused = (
        "past_the_destination",
        "source_not_the_leases",
        "size_word_not_the_leases",
        "unknown_algorithm",
    )
    assert [out[name] for name in refused] == ["1"] * len(refused)  # CUDA_ERROR_INVALID_VALUE


def test_async_notifications_are_accepted_for_lease_devices_and_unified_functions_are_refused(
    shim_dir, worker
):
    """A notification callback registers for the lease's device (not for another) and unregisters; the
    device says it has no unified function pointers, and asking a library for one is refused with the
    census's reason on stderr."""
    out, err = run_client("notifications_and_unified_functions", client_env(shim_dir, worker))
    assert out["finished"] == "1", err
    assert (out["register"], out["handle_given"], out["unregister"]) == ("0", "True", "0")
    assert out["register_other_device"] == "101"  # CUDA_ERROR_INVALID_DEVICE
    assert out["unified_attribute"] == "0"
    assert out["unified_function"] == "801"  # CUDA_ERROR_NOT_SUPPORTED
    assert "cuLibraryGetUnifiedFunction" in err and "refused" in err


def test_newer_abis_run_where_the_older_one_says_the_same_and_refuse_what_it_cannot(shim_dir, worker):
    """cuGetProcAddress at the version of a newer ABI: cuLaunchHostFunc's with a synchronisation mode runs
    the function (a bad mode refused); CUDA 13.4's cuGraphAddNode and cuGraphNodeSetParams add an empty node
    and a host node (its sync mode and context in the grown structure) whose function runs with the argument
    it was given, then set anew; a bad sync mode is invalid, and a node bound to a green context or of a type
    the older ABI lacks (a copy batch) is refused with the reason, never run with its new fields dropped."""
    out, err = run_client("newer_abis", client_env(shim_dir, worker))
    assert out["finished"] == "1", err
    assert (out["host_function_spinning"], out["host_function_bad_mode"]) == ("0", "1")
    assert out["host_function_ran"] == "[7]"
    assert (out["add_node_v3"], out["add_node_v2"]) == ("0", "0")
    assert out["graph_host_ran"] == "[21, 22]"
    assert out["v3_bad_sync_mode"] == "1"  # CUDA_ERROR_INVALID_VALUE, as the driver
    assert (out["v3_green"], out["v3_copy_batch"], out["v2_set_green"]) == ("801", "801", "801")
    assert "green context" in err and "type 14" in err


def test_a_call_that_is_not_forwarded_fails_and_says_why_once(shim_dir, worker):
    out, err = run_client("unknown", client_env(shim_dir, worker))
    assert out == {"first_call": "801", "second_call": "801"}
    assert err.count("cuGraphicsMapResources is not forwarded") == 1
    assert "(graphics interop: refused)" in err  # the census's reason, said where it is met
    assert "docs/driver-census.md says why" in err


def test_without_a_lease_the_shim_refuses_at_once(shim_dir):
    started = time.monotonic()
    out, err = run_client("no_lease", client_env(shim_dir), timeout=20)
    assert out == {"init": "100", "count": "100"}  # CUDA_ERROR_NO_DEVICE
    assert "no GPU lease for this process" in err and "gpuattach run" in err
    assert err.count("gpupool:") == 1
    assert time.monotonic() - started < 15


def test_a_wrong_secret_is_refused(shim_dir, worker):
    env = client_env(shim_dir, worker, GPUPOOL_SECRET="guessed")
    out, err = run_client("no_lease", env)
    assert out == {"init": "800", "count": "800"}  # CUDA_ERROR_NOT_PERMITTED
    assert "refused this process" in err


def test_when_the_worker_dies_the_next_call_fails_and_says_why(shim_dir, worker):
    proc = subprocess.Popen(
        [sys.executable, str(CLIENT), "worker_dies"],
        env=client_env(shim_dir, worker),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "ready 1"
    os.kill(worker.pid, signal.SIGKILL)
    worker.proc.wait(10)
    stdout, stderr = proc.communicate("\n", timeout=30)
    out = parse(stdout)
    assert out["sync"] == "46"  # CUDA_ERROR_DEVICE_UNAVAILABLE
    assert out["again"] == "46"
    assert out["memset"] in ("0", "46")  # may still fit in the socket buffer
    assert stderr.count("lost the connection to the lease's worker") == 1


def test_with_isolate_a_process_worker_that_dies_ends_only_its_process(shim_dir, worker):
    """Under GPUPOOL_ISOLATE a killed process worker is what a killed worker is to its one process (the next
    call fails and says why, once); the lease's other process goes on, and a new process still gets a
    worker of its own."""
    import psutil

    env = client_env(shim_dir, worker, GPUPOOL_ISOLATE="1")

    def start():
        proc = subprocess.Popen([sys.executable, str(CLIENT), "worker_dies"], env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        assert proc.stdout.readline().strip() == "ready 1"
        return proc

    first, second = start(), start()  # the lease's worker serves the first; the second has its own

    def process_workers() -> list:
        return [p for p in psutil.Process(worker.pid).children() if "--process-of" in p.cmdline()]

    deadline = time.monotonic() + 20
    while len(process_workers()) < 2 and time.monotonic() < deadline:  # the second's, and the spare
        time.sleep(0.05)
    process_workers = process_workers()
    assert len(process_workers) == 2
    time.sleep(2)  # the spare has started and is waiting: a dead spare must not be handed out
    for p in process_workers:
        p.kill()
    psutil.wait_procs(process_workers, timeout=10)
    out, err = second.communicate("\n", timeout=30)
    assert parse(out)["sync"] == parse(out)["again"] == "46"  # CUDA_ERROR_DEVICE_UNAVAILABLE
    assert err.count("lost the connection to the lease's worker") == 1
    out, err = first.communicate("\n", timeout=30)
    assert parse(out)["memset"] == parse(out)["sync"] == "0"
    third = start()
    out, _ = third.communicate("\n", timeout=30)
    assert parse(out)["memset"] == parse(out)["sync"] == "0"


BURST_CLIENT = """
import ctypes, sys
cu = ctypes.CDLL("libcuda.so.1")
ctx, ptr = ctypes.c_uint64(), ctypes.c_uint64()
rcs = [cu.cuInit(0), cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), cu.cuCtxSetCurrent(ctx),
       cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(1 << 20)), cu.cuMemsetD8_v2(ptr, 7, ctypes.c_size_t(1 << 20)),
       cu.cuCtxSynchronize()]
sys.exit(1 if any(rcs) else 0)
"""


def test_with_isolate_a_burst_of_processes_starts_a_worker_each_and_one_spare(shim_dir, worker):
    """A test suite or a data loader starts many processes at once: each gets a worker of its own, and the
    lease's worker keeps one spare started behind them, not one more per process (each start is a CUDA
    initialisation on a GPU server). No worker is left but the spare once they have exited."""
    import psutil

    env = client_env(shim_dir, worker, GPUPOOL_ISOLATE="1")
    holder = subprocess.Popen([sys.executable, str(CLIENT), "worker_dies"], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert holder.stdout.readline().strip() == "ready 1"  # served by the lease's worker itself
    seen: set[int] = set()

    def look() -> list:
        found = []
        with contextlib.suppress(psutil.Error):
            for p in psutil.Process(worker.pid).children():
                with contextlib.suppress(psutil.Error):
                    if "--process-of" in p.cmdline():
                        found.append(p)
        seen.update(p.pid for p in found)
        return found

    burst = 6
    clients = [subprocess.Popen([sys.executable, "-c", BURST_CLIENT], env=env) for _ in range(burst)]
    while any(c.poll() is None for c in clients):
        look()
        time.sleep(0.01)
    assert [c.returncode for c in clients] == [0] * burst
    deadline = time.monotonic() + 20
    while len(look()) > 1 and time.monotonic() < deadline:  # their workers exit with them
        time.sleep(0.05)
    assert len(look()) == 1  # the spare, waiting for the next process
    assert burst <= len(seen) <= burst + 1, seen  # a worker each, one spare behind them
    holder.communicate("\n", timeout=30)


def test_a_c_program_links_against_the_shim(shim_dir, worker, tmp_path):
    source = tmp_path / "prog.c"
    source.write_text(
        r"""
        #include <stdio.h>
        #include <string.h>
        int cuInit(unsigned); int cuDeviceGetCount(int *); int cuDevicePrimaryCtxRetain(unsigned long long *, int);
        int cuCtxSetCurrent(unsigned long long); int cuMemAlloc_v2(unsigned long long *, size_t);
        int cuMemsetD8_v2(unsigned long long, unsigned char, size_t);
        int cuMemcpyDtoH_v2(void *, unsigned long long, size_t);
        int main(void) {
            int n = 0; unsigned long long ctx, p; unsigned char b[8];
            if (cuInit(0) || cuDeviceGetCount(&n) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx)) return 1;
            if (cuMemAlloc_v2(&p, 8) || cuMemsetD8_v2(p, 0xab, 8) || cuMemcpyDtoH_v2(b, p, 8)) return 2;
            printf("devices %d byte %02x\n", n, b[7]);
            return 0;
        }
        """
    )
    exe = tmp_path / "prog"
    subprocess.run(["cc", "-o", str(exe), str(source), f"-L{shim_dir}", "-lcuda"], check=True, timeout=60)
    proc = subprocess.run(
        [str(exe)], env=client_env(shim_dir, worker), capture_output=True, text=True, timeout=30
    )
    assert proc.stdout.strip() == "devices 1 byte ab", proc.stderr


def test_a_two_gpu_lease_shows_two_devices_each_with_its_partition(shim_dir):
    devices = [WorkerDevice(0, "", 32 * MiB), WorkerDevice(1, "", 16 * MiB)]
    handle = start_worker("two", devices, bind_host="127.0.0.1", env={}, executor="host")
    try:
        out, _ = run_client("two_devices", client_env(shim_dir, handle))
    finally:
        handle.stop()
    assert out == {
        "count": "2",
        "total0": str(32 * MiB),
        "ctx_device0": "0",
        "total1": str(16 * MiB),
        "ctx_device1": "1",
        "peer_copy": "11" * 16 + "10" * 16,
        "bad_device": "101",  # CUDA_ERROR_INVALID_DEVICE
        "p2p_access_supported": "0 1",
        "p2p_with_itself": "101",
        "p2p_atomics": "0 27 27 27",  # the host executor's masks, one per operation
        "p2p_atomics_with_itself": "101",  # CUDA_ERROR_INVALID_DEVICE, as the driver answers
        "p2p_atomics_none": "1",  # CUDA_ERROR_INVALID_VALUE
        "enable_peer": "0",
        "enable_again": "704",  # CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
        "disable_peer": "0",
        "disable_again": "705",  # CUDA_ERROR_PEER_ACCESS_NOT_ENABLED
        "by_bus_id": "0 1",
        "by_short_bus_id": "0 1",  # the domain may be left out
        "by_other_bus_id": "101 -1",  # a bus of the host that is not the lease's
        "by_garbage": "1 -1",
    }


def test_memory_a_program_leaves_allocated_is_freed_when_it_exits(shim_dir, worker):
    for _ in range(3):  # 40 MiB of a 64 MiB partition, never freed by the program
        out, _ = run_client("leak", client_env(shim_dir, worker))
        assert out == {"alloc": "0"}


def test_a_device_address_that_is_host_memory_here_is_never_handed_to_the_program(shim_dir):
    taken = "0x5f0000000000"
    env = {"GPUPOOL_HOST_EXECUTOR_BASE": taken}
    handle = start_worker(
        "collide", [WorkerDevice(0, "", 64 * MiB)], bind_host="127.0.0.1", env=env, executor="host"
    )
    try:
        out, err = run_client("collision", client_env(shim_dir, handle, TAKEN_ADDRESS=taken))
    finally:
        handle.stop()
    assert "no window of device addresses could be reserved (8 offered ranges were host memory here)" in err
    assert out == {
        "window_region_taken": "True",
        "host_mapping_at_base": "True",
        "alloc": "0",
        "moved_off_host_memory": "True",
        "used_mib": "1",
        "host_memory_ok": "True",
    }


def test_allocations_land_in_a_window_the_program_reserved_before_its_first_allocation(shim_dir, worker):
    out, err = run_client("window", client_env(shim_dir, worker))
    assert out == {
        "one_reservation": "True",
        "reserved_here": "True",
        "aligned": "True",
        "small_share_a_page": "True",
        "contents": "True",
        "address_range": "True",
        "pointer_range": "True",
        "many_inside": "True",
        "async_inside": "True",
        "used_kib": str(3000 * 1000 // 1024),
    }
    assert "gpupool:" not in err


def test_capture_info_outside_captures_is_answered_in_the_client_inside_one_by_the_worker(shim_dir, worker):
    """Libraries ask whether their stream captures before each call (cuBLAS and cuSPARSE through
    cudaStreamGetCaptureInfo; cupyx's Lanczos ran at 4-6x native time on 140,000 such round trips). With
    no capture of the process open the client answers NONE itself; during one the worker answers, and an
    end on a stream that was not capturing leaves the capture open, as natively."""
    # page-locked memory not shared with the worker, as for a client on another host: the capture's copy
    # node then depends on the client knowing its capture is open
    env = client_env(shim_dir, worker, GPUPOOL_SHIM_PROFILE="1", GPUPOOL_SHIM_SHARED_PINNED="0")
    out, err = run_client("capture_info", env)
    assert out["unknown"].startswith("rc")  # a stream the lease never made is refused, not answered NONE
    assert {k: v for k, v in out.items() if k != "unknown"} == {
        "before": "0",
        "during": "1:True 0",
        "end_other": "903",  # CUDA_ERROR_STREAM_CAPTURE_UNMATCHED
        "after_end_other": "1:True",
        "end": "0",
        "after": "0",
        "replayed": "7",  # the captured copy read the page-locked word at the launch
    }
    # 600 questions outside captures, 4 during one or about an unknown stream: only those 4 travel
    assert profile_rows(err)["cuStreamGetCaptureInfo_v3"]["calls"] <= 4


def test_a_copy_from_the_programs_memory_inside_a_capture_fails_the_capture_not_the_replays(shim_dir, worker):
    out, _ = run_client("capture_copy", client_env(shim_dir, worker))
    assert out == {
        "htod_in_capture": "0",  # sent without waiting, as every asynchronous call
        "dtoh_in_capture": "900",  # CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
        "end_capture": "901",  # CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        "htod_after": "0",
        "sync": "0",
        "readback": "True",
    }


def test_copies_with_page_locked_and_registered_memory_are_captured_and_replayed(shim_dir, worker):
    """A graph captured with a copy from page-locked memory and a copy into registered memory (PyTorch's
    pinned copies inside torch.cuda.graph) captures, and each launch reads and writes the pages as they
    are then, as natively; before, the capture failed at its end."""
    out, _ = run_client("capture_page_locked", client_env(shim_dir, worker))
    n = 5000
    assert out == {
        "htod_in_capture": "0",
        "launch_in_capture": "0",
        "dtoh_in_capture": "0",
        "end_capture": "0",
        "replays": f"[[1, {n}], [101, {n + 100}]]",  # the input as the host left it before each launch, + 1
        "free": "0",
    }


def test_events_made_a_step_are_fresh_and_never_wait_for_the_worker(shim_dir, worker):
    """A framework making events as it goes (PyTorch's graphed callables, its pinned-memory allocator, a
    benchmark harness): each cuEventCreate hands out a fresh event of the program's own — distinct, done
    before any record, timing or not as its flags asked — without waiting for the worker (natively it waits
    for nothing; a wait in a GPU-bound loop drains the pipeline); a bad flag is refused as the driver
    refuses it, and an event made in a context made after another was destroyed works there."""
    out, err = run_client("event_batches", client_env(shim_dir, worker, GPUPOOL_SHIM_PROFILE="1"))
    assert out["distinct"] == "True" and out["fresh"] == "100" and out["timing_as_asked"] == "100", out
    assert out["bad_flags"] == "1"  # CUDA_ERROR_INVALID_VALUE
    assert out["new_context_event"] == "0,0", out
    rows = profile_rows(err)
    assert rows["gpEventCreateNamed"]["calls"] == 202 and rows["gpEventCreateNamed"]["waited"] == 0  # 200 + 2
    assert rows["cuEventCreate"]["calls"] == 1  # the bad flags alone: asked, and refused by the worker


def test_a_client_names_its_events_and_the_worker_refuses_a_name_not_to_be_had(shim_dir, worker):
    """The shim names the program's events itself (its making unanswered: no wait for the worker); the
    worker maps the name to the event it made. A value that is not a name (a driver handle of another
    lease could be guessed so) or a name the lease's events already hold is refused, reported by the next
    synchronise, and the event holding it is untouched."""
    out, err = run_client("event_names", client_env(shim_dir, worker))
    assert out == {
        "named": "0xee",
        "recorded_and_waited": "0",
        "not_a_name": str(int(CUresult.INVALID_VALUE)),
        "a_name_held": str(int(CUresult.INVALID_VALUE)),
        "holder_untouched": "0,0",
        "destroyed": str(int(CUresult.INVALID_HANDLE)),
    }, err


def test_async_copies_with_page_locked_memory_outside_a_capture_ask_the_worker_nothing(shim_dir, worker):
    """Outside a capture an asynchronous copy with page-locked memory the worker does not share (a client
    across hosts) stays one unanswered frame: the check a capture needs (is its stream capturing?) is made
    only while one is open, so a data loader's pinned copies keep pipelining."""
    env = client_env(shim_dir, worker, GPUPOOL_SHIM_SHARED_PINNED="0", GPUPOOL_SHIM_PROFILE="1")
    out, err = run_client("pinned_async_copies", env)
    assert out == {"landed": "True", "free": "0"}
    assert "cuStreamIsCapturing" not in profile_rows(err)


def test_the_virtual_memory_api_maps_memory_in_ranges_the_program_reserved(shim_dir, worker):
    """Reserve, create, map, grant access, use, undo, with the partition counting created memory; pinned
    host memory is not created remotely, but its granularity is answered (NCCL asks it first and falls
    back to /dev/shm when the creation fails, and stops when the question fails)."""
    out, err = run_client("vmm", client_env(shim_dir, worker))
    assert out == {
        "granularity": str(2 * MiB),
        "host_granularity_rc": "0",
        "host_granularity_positive": "True",
        "host_create": "801",  # CUDA_ERROR_NOT_SUPPORTED
        "past_partition": "2",  # CUDA_ERROR_OUT_OF_MEMORY: the 64 MiB partition holds 4 MiB already
        "map_outside": "1",  # CUDA_ERROR_INVALID_VALUE: not a range this process reserved
        "contents": "True",
        "used_mib": "4",
        "free_while_mapped": "1",
        "used_mib_after": "0",
    }
    assert "gpupool:" not in err


def test_the_fabric_of_the_leases_devices_is_asked_of_the_worker(shim_dir, worker):
    """cuDeviceGetFabricClusterUuid / cuDeviceGetCliqueCount / cuDeviceGetCliqueInfo reach the worker's
    driver for a device of the lease (the host executor's GPU is in no NVLink fabric: not supported, no
    clique) and are CUDA_ERROR_INVALID_DEVICE for any other; an array-less clique query is invalid."""
    out, err = run_client("fabric_queries", client_env(shim_dir, worker))
    assert out["finished"] == "1", err
    assert out["cluster_uuid"] == "801"  # CUDA_ERROR_NOT_SUPPORTED, as the modelled driver says
    assert out["clique_count"] == "(0, 0)"
    assert out["clique_info"] == "(0, 0)"
    assert out["clique_info_no_array"] == "1"
    assert out["other_device"] == "[101, 101, 101]"


def test_logical_endpoints_are_the_processs_own_and_bind_only_the_leases_memory(shim_dir, worker):
    """Logical endpoints: a process reserves ids, creates an endpoint on one, binds the lease's memory to it
    and unbinds it, asks its limits and readiness, destroys it and releases the ids. Ids it did not reserve,
    an id used twice, handle types that share the endpoint, a device or memory not the lease's, a binding
    past the endpoint, releasing ids that still have an endpoint and destroying one twice are refused before
    the driver; export and import are refused with the census's reason. Fabric copies between the lease's
    memory and the endpoint land in the memory bound to it; an operand outside the lease, past the endpoint,
    of an endpoint the process did not create, or of an unknown type refuses the whole batch."""
    out, err = run_client("logical_endpoints", client_env(shim_dir, worker))
    assert out["finished"] == "1", err
    assert (out["create"], out["bind"], out["unbind"], out["destroy"], out["release"]) == ("0",) * 5
    assert out["query"] == "(0, 1)"
    # fabric copies (CUDA 13.5) into the endpoint and out of it land in the memory bound to it
    assert (out["fabric_copies"], out["fabric_bytes"]) == ("(0, 0)", "True")
    fabric_refused = ("fabric_foreign", "fabric_past_end", "fabric_other_endpoint", "fabric_bad_type")
    assert [out[name] for name in fabric_refused] == ["1"] * 4
    assert out["limits"] == f"(0, {2 << 20})"
    invalid = ("create_again", "create_unreserved", "query_unreserved", "bind_foreign", "bind_past_end",
               "release_in_use", "destroy_again")  # fmt: skip
    assert [out[name] for name in invalid] == ["1"] * len(invalid)  # CUDA_ERROR_INVALID_VALUE
    assert out["create_shared"] == "801"  # CUDA_ERROR_NOT_SUPPORTED: shared with other processes
    assert out["create_other_device"] == "101"  # CUDA_ERROR_INVALID_DEVICE
    assert (out["export"], out["import"]) == ("801", "801")
    assert "logical endpoints shared with other processes or nodes: refused" in err


def test_multicast_objects_span_the_leases_devices_and_bind_only_its_memory(shim_dir, worker):
    """A multicast object over the lease's device is created, its device added, memory the program created
    bound (also by CUDA 13.1's bind naming its device), mapped in a range it reserved, written and read
    through, unbound and released; an allocation's address binds too. More devices than the lease has, sharing with other processes, another device,
    memory or addresses not the lease's, a binding past the object, a memory handle used as a multicast
    object and a released object are refused."""
    out, err = run_client("multicast", client_env(shim_dir, worker))
    assert out["finished"] == "1", err
    assert out["granularity"] == str(2 * MiB)
    assert out["read_through"] == "5a5a5a5a5a5a5a5a"
    assert out["bind_allocation"] == "0"
    assert out["bind_on_its_device"] == "0"  # CUDA 13.1's bind, naming the memory's own device
    assert out["bind_on_other_device"] == "101"  # CUDA_ERROR_INVALID_DEVICE
    assert out["more_devices_than_the_lease"] == "1"  # CUDA_ERROR_INVALID_VALUE
    assert out["shared_with_processes"] == "801"  # CUDA_ERROR_NOT_SUPPORTED
    assert out["add_other_device"] == "101"  # CUDA_ERROR_INVALID_DEVICE
    refused = ("add_to_memory", "bind_foreign_memory", "bind_past_the_object", "bind_to_itself")
    assert [out[name] for name in refused] == ["1"] * len(refused)
    assert out["bind_foreign_address"] == out["bind_after_release"] == "1"
    assert "gpupool:" not in err


def test_a_retained_handle_is_one_more_reference_to_memory_this_process_mapped(shim_dir, worker):
    """cuMemRetainAllocationHandle gives this process's mapping's handle as one more reference to release."""
    out, err = run_client("vmm_retain", client_env(shim_dir, worker))
    assert out == {
        "retain": "0 True",  # an address inside the mapping gives the handle it was mapped from
        "properties": "0 1 1 0",  # pinned, on device 0, as created
        "properties_of_another_handle": "1",
        "access": "0 3",  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE, as granted
        "access_of_another_device": "101",
        "access_unmapped": "1",
        "release_retained": "0",
        "memset_still_mapped": "0",  # the creator's reference still holds the memory
        "release_created": "0",
        "release_again": "1",  # CUDA_ERROR_INVALID_VALUE: no reference left
        "retain_plain_memory": "1",  # cuMemAlloc's memory: the worker's own mapping, no handle to give
        "retain_unmapped": "1",
        "retain_after_release": "0",
        "release_last": "0",
        "used_mib_after": "0",  # every reference released: the partition is whole again
    }
    assert "not forwarded" not in err


def test_cache_and_shared_memory_configuration_round_trip_with_the_drivers_refusals(shim_dir, worker):
    """Cache and shared-memory settings read back; values the driver refuses are refused and change nothing."""
    out, err = run_client("cache_config", client_env(shim_dir, worker))
    assert out == {
        "ctx_cache_default": "0 0",  # CU_FUNC_CACHE_PREFER_NONE
        "ctx_cache_set": "0",
        "ctx_cache_unknown": "1",  # CUDA_ERROR_INVALID_VALUE
        "ctx_cache_now": "0 2",  # the refused value changed nothing
        "ctx_shared_default": "0 1",  # CU_SHARED_MEM_CONFIG_FOUR_BYTE_BANK_SIZE
        "ctx_shared_set": "0",
        "ctx_shared_unknown": "1",
        "ctx_shared_now": "0 2",
        "func_cache": "0",
        "func_cache_unknown": "1",
        "func_cache_foreign": "400",  # CUDA_ERROR_INVALID_HANDLE: not a function of this lease
        "func_shared": "0",
        "func_shared_unknown": "1",
        "kernel_cache": "0",
        "kernel_cache_unknown": "1",
        "kernel_cache_other_device": "101",  # CUDA_ERROR_INVALID_DEVICE
        "carveout_set": "0",
        "carveout_past_100": "1",
        "carveout_now": "0 50",
        "dynamic_shared_past_the_device": "1",
        "read_only_attribute": "1",
    }
    assert "not forwarded" not in err


def test_a_modules_functions_and_a_librarys_kernels_are_enumerated_as_handles_of_the_lease(shim_dir, worker):
    """Enumerated functions and kernels are usable handles of the lease, with names and parameter counts."""
    out, err = run_client("enumerate", client_env(shim_dir, worker))
    assert (
        out
        == {
            "functions": f"{len(HOST_KERNELS) + 1} True True",  # the PTX's own kernel and the host executor's built-in ones
            "same_handle_as_by_name": "True",
            "name_kept": "True",
            "param_count": "0 2",
            "loaded": "0 1",  # CU_FUNCTION_LOADING_STATE_LOADED
            "load": "0",
            "enumerate_two_kernels": "0",
            "kernels": "True 2 True",
            "kernel_param_count": "0",
            "enumerated_launch": "9",  # an enumerated handle launches like one looked up by name
            "foreign_module": "400",
            "foreign_name": "400",
        }
    )
    assert "not forwarded" not in err


def test_cuda_arrays_copies_in_rows_and_slices_textures_and_surfaces_are_forwarded(shim_dir, worker):
    """Arrays, their 2D/3D/1D copies, textures and surfaces work, touching only the lease's memory and arrays."""
    out, err = run_client("arrays", client_env(shim_dir, worker))
    assert out == {
        "described": "0 64x32x0 0x20",
        "host_to_array": "0",
        "array_to_device": "0",
        "device_rows": "0.0 63.0 128.0 4031.0",  # each row the first 64 floats of a 128-float host row
        "sub_rectangle": "0 516.0 779.0",  # 3 rows of 8 floats from column 4 of row 4
        "async_2d": "0",
        "async_sync": "0",
        "past_the_array": "1",  # CUDA_ERROR_INVALID_VALUE: a 33rd row
        "past_the_allocation": "1",  # rows 512 bytes apart would run past the 8 KiB allocation
        "foreign_array": "400",  # CUDA_ERROR_INVALID_HANDLE: not an array of this lease
        "host_to_1d": "0",
        "1d_to_host": "0 [0.0, 0.0, 1.5, 2.5, 3.5, 4.5]",
        "1d_to_device": "0",
        "device_to_1d": "0",
        "array_to_array": "0",
        "first_row_now": "[1.5, 2.5, 3.5, 4.5, 4.0, 5.0]",
        "host_to_3d": "0",
        "3d_to_device": "0",
        "3d_slices": "0 127 128 255",  # the second slice lands 8 rows (256 bytes) on
        "level_2": "16x16",
        "destroy_a_level": "1",
        "texture_over_array": "0",
        "texture_over_memory": "0",
        "texture_past_memory": "1",
        "texture_foreign_array": "400",
        "texture_resource": "0 0 True",  # its descriptor read back: an array, this one
        "texture_view_when_none": "1",
        "surface_over_array": "0",
        "surface_resource": "0 True",
        "surface_over_memory": "1",  # a surface is made over an array only
        "destroyed": "0 0 0",
        "destroyed_again": "400",
        "past_partition": "2",  # CUDA_ERROR_OUT_OF_MEMORY: 4 GiB of array in a 64 MiB partition
        "destroy": "0 0 0 0",
        "destroy_again": "400",
    }
    assert "not forwarded" not in err


def test_planes_sparse_and_deferred_arrays_and_their_tile_mappings_are_forwarded(shim_dir, worker):
    """An NV12 array's two planes are arrays of the lease (luma, and chroma at half size in two channels);
    sparse arrays and sparse mipmapped arrays report their tiles, a deferred-mapping array its memory
    requirements; a sparse array's tiles are mapped to memory the program created for tiles and unmapped; memory,
    arrays and devices that are not the lease's, or arrays that are not sparse, are refused."""
    out, err = run_client("arrays_rest", client_env(shim_dir, worker))
    assert out["finished"] == "1", err
    assert out["planes"] == "[(64, 32, 1, 1), (32, 16, 1, 2)]"
    assert out["plane_beyond"] == out["plane_of_plain"] == "1"  # CUDA_ERROR_INVALID_VALUE
    assert out["plane_of_foreign"] == "400"  # CUDA_ERROR_INVALID_HANDLE
    assert out["sparse_tile"] == out["mipmap_tile"] == "(128, 128, 1)"  # 64 KiB of 4-byte texels
    assert out["sparse_of_plain"] == "1"
    assert out["requirements_cover_it"] == "True"
    assert out["requirements_other_device"] == "101"  # CUDA_ERROR_INVALID_DEVICE
    assert out["map_foreign_memory"] == out["map_foreign_array"] == "400"
    assert out["map_other_device"] == "101"
    assert out["map_plain_array"] == "1"
    assert out["other_usage"] == "801"  # memory for GPUDirect RDMA is not created remotely
    assert "gpupool:" not in err


def test_legacy_texture_and_surface_references_bind_only_the_leases_arrays_and_memory(shim_dir, worker):
    """A module's texture and surface references are found by name (one handle per name), bound to an
    array, to memory and to rows of it, their settings read back as set, a surface reference bound to an
    array made for surfaces; memory past an allocation or not the lease's, arrays and references not the
    lease's, a reference destroyed twice or after its module's unload are refused."""
    out, err = run_client("texture_references", client_env(shim_dir, worker))
    assert out["finished"] == "1", err
    assert out["same_again"] == out["array_back"] == out["surface_array_back"] == "True"
    assert out["unknown_name"] == out["surface_as_texture"] == "500"  # CUDA_ERROR_NOT_FOUND
    assert out["address_back"] == "(0, True)"
    assert out["address_past_memory"] == out["address_not_the_leases"] == out["rows_past_memory"] == "1"
    assert out["settings"] == "(1, 2, 2, 1, 1, 0.5, 0.25, 3.0, 4, (0.125, 0.25, 0.5, 1.0), 2)"
    assert out["surface_over_foreign_array"] == out["foreign_reference"] == "400"  # CUDA_ERROR_INVALID_HANDLE
    assert out["destroyed_twice"] == out["after_unload"] == "400"
    assert "gpupool:" not in err


@pytest.mark.parametrize("native", ["1", "0"])
def test_copies_and_memsets_of_zero_bytes_succeed_at_any_address_as_the_driver_answers(shim_dir, native):
    """XLA copies nothing from and to address 0 (JAX's control-flow suite): the driver answers such a copy,
    and a memset of nothing, with success at any address, and nothing surfaces at the next synchronise. The
    worker's check of the bytes a call names passes a range of none, wherever it points (the driver touches
    nothing; on an H100, tests/gpu/remote/prog_zero_sized.py prints the same natively and remotely)."""
    handle = start_worker(  # the worker's native loop and its Python guard each pass them
        "zero", [WorkerDevice(0, "", 64 << 20)], bind_host="127.0.0.1", env={"GPUPOOL_WORKER_NATIVE": native},
        executor="host",
    )  # fmt: skip
    try:
        out, _ = run_client("zero_sized", client_env(shim_dir, handle))
    finally:
        handle.stop()
    answers = {name: value for name, value in out.items() if name != "after"}
    assert len(answers) == 36
    assert set(answers.values()) == {"0 0"}, {k: v for k, v in answers.items() if v != "0 0"}
    assert out["after"] == "0 0"  # nothing left behind: the context and its memory as they were


def test_pitched_memory_2d_memsets_a_library_file_and_context_settings_are_forwarded(shim_dir, worker):
    """Pitched memory and 2D memsets, a library from a file, a context's flags and events behave as natively."""
    out, err = run_client("pitched_and_context", client_env(shim_dir, worker))
    assert out == {
        "alloc_pitch": "0 512",  # 100-byte rows padded to the texture pitch alignment
        "odd_element_size": "1",
        "memset_rows": "0",
        "rows": "7 7 0",
        "memset_touching_rows": "0",
        "touching_rows": "True",
        "pitch_shorter_than_row": "1",
        "library_from_file": "0 0",
        "library_missing_file": "301",  # CUDA_ERROR_FILE_NOT_FOUND
        "set_flags": "0",
        "flags": "0 1",
        "record_event": "0",
        "wait_event": "0",
        "event_done": "0",
        "reset_persisting_l2": "0",
        "record_foreign_context": "0",  # asynchronous, as cuEventRecord ...
        "sync_after": "201",  # ... CUDA_ERROR_INVALID_CONTEXT at the next synchronise
    }
    assert "not forwarded" not in err


def test_stream_attributes_and_memory_operations_touch_only_the_leases_memory(shim_dir, worker):
    """Stream attributes and memory operations round trip, and name only the lease's memory."""
    out, err = run_client("stream_attributes", client_env(shim_dir, worker))
    assert out == {
        "set_priority": "0",
        "get_priority": "0 -1",
        "window_over_lease_memory": "0",
        "window_elsewhere": "1",  # CUDA_ERROR_INVALID_VALUE
        "window_past_the_allocation": "1",
        "handle_carrying_attribute": "801",  # CUDA_ERROR_NOT_SUPPORTED
        "copy_attributes": "0",
        "copied_priority": "0 -1",
        "texture_1d_max_width": "0 True",
        "written": "(5, 0, 1099511627776)",
        "write_past_the_end": "0",  # asynchronous ...
        "sync_after": "1",  # ... CUDA_ERROR_INVALID_VALUE: its last 4 bytes are not the lease's
        "write_to_mapped_memory": "801",  # the program would see it only at a synchronisation: refused
        "device_properties": "0 1024 32",
    }
    assert "is not forwarded to the remote GPU" not in err


def test_memory_settings_batches_and_hints_of_issue_25_act_on_the_leases_memory_only(shim_dir, worker):
    """cuPointerSetAttribute, cuDeviceSetMemPool, cuFlushGPUDirectRDMAWrites, cuMemcpy3DPeer(Async),
    cuStreamBatchMemOp, cuStreamAttachMemAsync, cuMemcpy(3D)WithAttributesAsync, batched prefetch and
    discard, and cuMemRangeGetAttribute(s) over what was advised and prefetched answer as the driver does,
    and refuse memory, pools or operations that are not the lease's."""
    out, err = run_client("memory_calls", client_env(shim_dir, worker))
    assert out == {
        "set_sync_memops": "0",
        "sync_memops": "1",  # read back anywhere in the allocation
        "set_sync_memops_elsewhere": "1",  # CUDA_ERROR_INVALID_VALUE: not the lease's memory
        "set_unsettable_attribute": "1",
        "set_pool": "0",
        "current_is_set": "True",
        "set_foreign_pool": "400",  # CUDA_ERROR_INVALID_HANDLE: not a pool of the lease
        "set_default_back": "0",
        "current_is_default": "True",
        "host_atomics": "0 0 0 0",  # HOST_NATIVE_ATOMIC_SUPPORTED 0; no operation native to the host
        "host_atomics_bad": "[1, 101]",  # an unknown operation; a device outside the lease
        "log_current": "0 0",
        "log_dump": "0 0 00",
        "log_dump_bad": "[1, 0]",
        "log_file": "0 b''",
        "log_file_unwritable": "1",
        "flush_rdma_writes": "0",
        "flush_bad_scope": "1",
        "peer_3d": "0",
        "peer_3d_async": "0",
        "peer_copied": "True",
        "peer_3d_elsewhere": "1",
        "batch_mem_op": "0",
        "batch_written": "(7, 0, 1099511627776)",
        "batch_bad_op": "1",  # an unknown operation: refused before any operation of the batch is sent
        "bad_batch_wrote_nothing": "00000000",
        "batch_past_the_end": "0",  # asynchronous ...
        "sync_after_batch": "1",  # ... its last 4 bytes are not the lease's: CUDA_ERROR_INVALID_VALUE
        "attach_managed": "0",
        "attach_plain": "1",  # only managed memory attaches to a stream
        "attach_bad_flags": "1",
        "batch_on_managed_memory": "801 00000000",  # CUDA_ERROR_NOT_SUPPORTED, as a single write there
        "copy_with_attributes": "0",
        "copy_3d_with_attributes": "0",
        "attributed_copies_landed": "True",
        "copy_invalid_order": "1",
        "prefetch_batch": "0",
        "prefetch_batch_plain": "1",
        "prefetch_batch_bad_starts": "1",
        "discard_batch": "0",
        "discard_batch_plain": "1",
        "discard_and_prefetch_batch": "0",
        "sync": "0",
        # cuMemRangeGetAttribute: rc, then the value(s); CU_DEVICE_CPU -1, CU_DEVICE_INVALID -2
        "last_prefetch_per_range": "['0 0', '0 -1', '0 -2']",  # device 0, the host, the two disagree
        "last_prefetch_type_id": "['0 1', '0 0', '0 2']",  # DEVICE 0; HOST
        "no_advice_yet": "['0 0', '0 -2', '0 -2 -2 -2']",
        "read_mostly": "0 1",
        "preferred": "['0 0', '0 -2', '0 1', '0 0']",  # the advised page; with one that was not; type, id
        "accessed_by": "['0 0 -2 -2', '0 0 -1 -2']",  # devices advised for every page of the range
        "attributes": "0 0 0",  # read mostly unset again; preferred device 0
        "attribute_of_plain_memory": "1 0",
        "attribute_wrong_size": "1",
        "unknown_advice": "1",
        "new_memory_has_no_advice": "['0 -2', '0 -2']",
    }
    assert "not forwarded yet" not in err  # every call of the scenario is served


@pytest.mark.parametrize("isolate", ["0", "1"])
def test_a_pool_and_its_pointers_are_shared_with_another_process_of_the_lease(shim_dir, worker, isolate):
    """A pool exported as a file descriptor and a pointer of it open in a child process, which reads the
    parent's bytes and writes its own; freeing the imported pointer ends only the child's use. The same with
    a worker per process (GPUPOOL_ISOLATE): the pool is held by the child's shim, the pointer mapped from the
    parent's worker."""
    out, _ = run_client("pool_export", client_env(shim_dir, worker, GPUPOOL_ISOLATE=isolate))
    assert out == {
        "import_pool": "0",
        "import_pointer": "0",
        "sees_export": "True",
        "free_import": "0",  # ends the child's use; the exporter's allocation stays
        "import_other_fd": "1",  # CUDA_ERROR_INVALID_VALUE
        "after_import": "cdcdcdcd",
        "free": "0",
        "destroy": "0",
    }


def test_host_functions_run_in_the_program_in_stream_order_and_the_stream_waits_for_them(shim_dir, worker):
    out, err = run_client("callbacks", client_env(shim_dir, worker))
    assert out == {
        "flags_refused": "1",
        "order": "host1,callback2:0:True,host3",
        "own_thread": "True",
        "many": "True",
    }
    assert "gpupool:" not in err


def test_a_device_pool_says_what_its_stream_ordered_allocations_hold(shim_dir, worker):
    """The worker serves cuMemAllocAsync from the process's window, not from the driver's pool; the pool's
    attributes still say what the process holds of it (CuPy's MemoryAsyncPool used/total/free bytes):
    used bytes exactly, reserved in whole 2 MiB granules kept after a free until a trim, high marks
    that a reset sets back to the current figure. Lists are reserved, reserved high, used, used high."""
    out, err = run_client("pool_usage", client_env(shim_dir, worker))
    mib = 1 << 20
    used = 1000 + 3 * mib
    assert out["current_after_allocs"] == str([4 * mib, 4 * mib, used, used]), err
    assert out["created_after_alloc"] == str([2 * mib, 2 * mib, 4096, 4096])
    assert out["current_after_free"] == str([4 * mib, 4 * mib, 1000, used])  # freed: still reserved
    assert out["current_after_reset"] == str([4 * mib, 4 * mib, 1000, 1000])
    assert out["current_after_trim"] == str([2 * mib, 4 * mib, 1000, 1000])  # what is used stays covered
    assert out["created_after_free_and_trim"] == str([0, 2 * mib, 0, 4096])


def test_managed_memory_is_the_same_bytes_for_the_program_and_its_kernels(shim_dir, worker):
    out, err = run_client("managed", client_env(shim_dir, worker))
    assert out == {
        "zeroed": "True",
        "kernel_saw_host_writes": "True",
        "copy_out_sees_host_write": "0900000006050505",
        "host_sees_copy_in": "01020304",
        "is_managed": "1 0",
        "concurrent_managed_access": "0",
        "prefetch": "0",
        "advise": "0",
        "prefetch_plain": "1",
        "prefetch_absent_device": "101",  # CUDA_ERROR_INVALID_DEVICE, as CuPy's own test expects
        "prefetch_bad_location": "1",
        "device_has_prefetched": "4d000000",
        "free": "0",
        "bad_flags": "1",
    }
    assert "gpupool:" not in err


def test_where_managed_memory_is_follows_who_touched_it_last(shim_dir, worker):
    """cuMemGetLocationInfo answers, region by region, where managed memory's data is: the device after
    device work, the host for a region the program wrote since (a majority of its samples); a summary
    past the size, a sampling past the summary, memory that is not managed or a range past the allocation
    are CUDA_ERROR_INVALID_VALUE."""
    out, err = run_client("location_info", client_env(shim_dir, worker))
    assert out["finished"] == "1", err
    device, host = (1, 0), (2, 0)  # CU_MEM_LOCATION_TYPE_DEVICE of device 0, CU_MEM_LOCATION_TYPE_HOST
    assert out["after_device_work"] == f"(0, {[device] * 4})"
    assert out["after_host_write"] == f"(0, {[device, host, device, device]})"
    assert out["one_region"] == f"(0, {[device]})"  # one of four samples is the host's
    for case in ("summary_past_size", "sampling_past_summary", "not_managed", "past_the_allocation"):
        assert out[case] == "1", case


def test_a_librarys_managed_variable_is_the_same_bytes_for_the_program_and_its_kernels(shim_dir, worker):
    """cuLibraryGetManaged gives the variable's address (the same when asked again); the host's first touch
    reads the device's bytes, its writes before a launch are what the kernel adds to, and the kernel's
    result is what it reads after the synchronisation; a plain variable is not a managed one."""
    out, err = run_client("library_managed", client_env(shim_dir, worker))
    assert out["finished"] == "1", err
    assert (out["size"], out["same_again"]) == ("16", "True")
    assert out["first_touch"] == "[0, 0, 0, 0]"
    assert out["after_kernel"] == "[15, 16, 17, 18]"
    assert out["not_managed"] == "500"  # CUDA_ERROR_NOT_FOUND
    assert "gpupool:" not in err


def test_mapped_host_memory_is_the_same_bytes_for_the_program_and_its_kernels(shim_dir, worker):
    out, err = run_client("mapped", client_env(shim_dir, worker))
    assert out == {
        "mapped_same_address": "True",
        "flags": "2",
        # each step: the host's write, then +1 by a kernel; word 0 got 1000 at step 0 before three adds
        "mapped_words": "[1003, 1004, 1005, 6, 50002]",
        # 7 + 3 x 2; the host's 100 at step 2 (one add after it) and at step 0 (three)
        "registered_words": "[13, 102, 106]",
        "pinned_word": "9",
        "attributes": "1 1",  # host memory, mapped
        "copy_of_registered": "0d0000000d000000",
        "host_sees_copy_in": "aabbccdd",
        "after_unregister": "14",
        "free_mapped": "0",
        "free_pinned": "0",
        "free_device_ptr": "1",
    }
    assert "gpupool:" not in err


def test_memory_both_sides_touch_is_read_and_written_by_host_threads_without_a_context(shim_dir, worker):
    """A host thread that never made a CUDA call reads page-locked memory a kernel wrote (through
    cuMemHostGetDevicePointer) and managed memory, and writes them for the next kernel: natively it needs no
    context. (PyTorch's test_copy_non_blocking read 94 % stale bytes so: its parallel loop's threads fetched
    without one.)"""
    n = 1 << 20
    out, err = run_client("mirrored_read_from_a_host_thread", client_env(shim_dir, worker))
    assert out == {
        "pinned_read_in_a_thread": str(n), "pinned_after_thread_write": str(n),
        "managed_read_in_a_thread": str(n), "managed_after_thread_write": str(n),
    }  # fmt: skip
    assert "could not fetch" not in err


def test_a_synchronise_with_nothing_sent_since_the_last_completion_costs_no_round_trip(shim_dir, worker):
    """A read-back is a copy to pageable memory, then a synchronise of its stream; the copy
    came back with its bytes, so the synchronise has nothing to wait for, and natively returns at once.
    The client answers it (and a context synchronise repeated) itself; a synchronise after a memset, a
    host function or a faulting kernel still asks the worker, and reports the fault."""
    env = client_env(shim_dir, worker, GPUPOOL_SHIM_PROFILE="1", GPUPOOL_SHIM_IDLE_FRESH_MS="600000")
    out, err = run_client("idle_synchronise", env)  # (a minute's trust: the counts hold on a loaded machine)
    assert out["items"] == "True"  # each read-back saw the work before it
    assert out["query_idle"] == "0"
    assert out["after_memset"] == "09090909"
    assert out["host_function_ran"] == "1"
    assert out["fault_reported"] == str(int(CUresult.ILLEGAL_ADDRESS))
    rows = profile_rows(err)
    assert rows["cuCtxSynchronize"] == {"calls": 6, "waited": 1}
    assert out["blocks"] == "True"
    assert out["copied_in"] == "32323232"
    # the 10 after small copies back, the last 2 after 64 KiB ones and the 3 after 64 KiB copies in (through
    # shared memory, answered once done): answered here; after the first 64 KiB copy (it attached the
    # shared memory first), the memset, the host function, the module's load and the faulting launch: asked
    assert rows["cuStreamSynchronize"] == {"calls": 20, "waited": 5}
    assert rows["cuStreamQuery"]["waited"] == 0


def test_a_synchronise_after_a_pause_asks_the_worker_again(shim_dir, worker):
    """An idle program's synchronise is answered in the client only shortly after the worker's answer: after
    a pause it asks again, and so learns that its lease moved or its worker is gone."""
    env = client_env(shim_dir, worker, GPUPOOL_SHIM_PROFILE="1", GPUPOOL_SHIM_IDLE_FRESH_MS="50")
    out, err = run_client("synchronise_after_pauses", env)
    assert out["synchronised"] == "4"
    assert profile_rows(err)["cuCtxSynchronize"] == {"calls": 4, "waited": 4}


@pytest.mark.parametrize(
    "sync_call", ["event_query", "event_sync", "stream_query", "stream_sync", "ctx_sync"]
)
def test_a_host_store_to_mapped_memory_reaches_the_device_before_a_synchronising_call(
    shim_dir, worker, sync_call
):
    """Natively a host store to mapped memory is in the memory the device sees at once: XLA's GPU timer
    releases the kernel spinning on its flag by a store, then synchronises on an event behind it. Sent
    only at the next launch, the kernel waited out its 100 ms time-out at each of the autotuner's
    measurements. Another process of the lease reads the device side once the synchronising call returned."""
    with ipc_pair("mapped_store_producer", client_env(shim_dir, worker, SYNC_CALL=sync_call)) as tell:
        assert tell(tell.consumer, "before") == ["before", "11111111"]  # the kernel's fill
        assert tell(tell.producer, "go") == ["synchronised", "2a2a2a2a"]
        assert tell(tell.consumer, "after_the_store") == ["after_the_store", "2a2a2a2a"]


def test_kernels_given_page_locked_host_addresses_read_and_write_that_memory(shim_dir, worker):
    """A kernel given the host address of cuMemAllocHost / cuMemHostAlloc memory (cuda.core's graph_update
    and thread_block_cluster examples) works on it as under unified addressing — launched directly,
    with a cluster shape, as an updated kernel node and in an updated captured graph — instead of
    faulting on the worker; so does the address of registered memory (its mirror's device pointer is
    given to the kernel in its place)."""
    out, err = run_client("pinned_kernels", client_env(shim_dir, worker))
    n = 40_000
    assert out == {
        "sync_after_launch": "0",  # it was CUDA_ERROR_ILLEGAL_ADDRESS (700)
        "launched": f"[5, {n - 1 + 5}]",
        "sync_after_cluster": "0",
        "clustered": f"[6, 1001, {n - 1 + 6}]",  # the host's 1000, written after the first kernel, + 1
        "sync_after_node_update": "0",
        "node_updated": "[16, 20, 20]",  # the node added 10 to a once, then 20 to b
        "other_context_node": "801",  # a kernel node for another context than the current one: refused
        "exec_update": "0",
        "sync_after_exec_update": "0",
        "exec_updated": "[16, 320]",  # the updated graph added 300 to b, nothing to a
        "copies": "[0, 16, 1011, " + str(n - 1 + 16) + "]",
        "copy_then_kernel": "42 42",  # the copy's 40 landed before the kernel's + 2, in stream order
        "filled": "True",  # a memset of pinned memory no kernel was given yet
        "device_pointer_attribute": "True",
        "registered_launch": "0 0",  # it was CUDA_ERROR_NOT_SUPPORTED at the call
        "sync_after_registered": "0",
        "registered_words": f"[2, {n + 1}]",  # registered memory's own address works in a kernel too
        "free": "0 0",
    }
    assert err.count("a node for a context other than the current one") == 1


def test_batched_copies_run_each_copy_of_every_direction_and_refuse_as_the_driver_does(shim_dir, worker):
    """cuMemcpyBatchAsync and cuMemcpy3DBatchAsync (both ABIs each) copy host to device, device to
    device-or-host (pageable and page-locked) in one batch, and 2D/3D sub-rectangles between pointers;
    a bad batch is CUDA_ERROR_INVALID_VALUE, a failing copy is named by its index, a CUDA array operand
    is CUDA_ERROR_NOT_SUPPORTED (said once)."""
    out, err = run_client("batched_copies", client_env(shim_dir, worker))
    rows = [tuple(range(16 * r + 4, 16 * r + 12)) for r in (1, 2, 3)]  # columns 4..11 of rows 1..3
    assert out == {
        "batched": "True True",  # pageable source read by the call; page-locked source in stream order
        "invalid_order": "1",
        "first_index_not_0": "1 True",  # no copy to blame: SIZE_MAX
        "failing_copy": "1 1",  # the second copy runs past its allocation: copy 1 is named
        "rows_3d": str(rows),
        "gaps_3d": "True",  # the destination's row pitch of 32 left bytes 8..31 alone
        "array_operand": "801 0",
    }
    assert err.count("copies to or from CUDA arrays are not forwarded") == 1


def test_pools_of_host_and_managed_memory_allocate_memory_the_host_and_kernels_share(shim_dir, worker):
    """cuMemGetMemPool / cuMemPoolCreate for page-locked host memory and for managed memory (cuda.core's
    PinnedMemoryResource, ManagedMemoryResource) give pools whose allocations the host writes and kernels
    add to, counted in the pool's attributes until cuMemFreeAsync; the device's pool stays the worker's."""
    out, err = run_client("host_pools", client_env(shim_dir, worker))
    n = 20_000
    used = 4 * n
    assert out == {
        "current_is_default": "True",
        "device_pool_is_the_workers": "True",
        "shareable_host_pool": "801",  # handle types other than none: not built
        "set_access": "0",
        # word 0 and word n - 1000 (the host wrote i, a kernel added 7); used while allocated, then 0
        "current": f"7 {n - 1000 + 7} {used} 0",
        "pinned": f"7 {n - 1000 + 7} {used} 0",
        "managed": f"7 {n - 1000 + 7} {used} 0",
        "managed_current": f"7 {n - 1000 + 7} {used} 0",  # ManagedMemoryResource(): no location
        "threshold": str(1 << 30),
        "trim": "0",
        "destroy": "0 0",
        "destroy_default": "1",  # the default pool is not the program's to destroy
        "alloc_from_destroyed": "400",  # CUDA_ERROR_INVALID_HANDLE: no pool of the lease
    }
    assert err.count("shared with other processes") == 1


def test_conditional_nodes_captured_bodies_child_graphs_and_updates_run_as_cuda_core_builds_them(
    shim_dir, worker
):
    out, err = run_client("graph_conditionals", client_env(shim_dir, worker))
    assert out == {
        "capture_deps": "1 1 True",  # capturing, one dependency node handed to the program
        "body_is_the_nodes_graph": "True",
        "after_while": "[100, 3, 0]",  # the loop body ran while the counter counted down from 3
        "if_else_with_0": "[0, 7]",  # the kernel set the condition to 0: the else body ran
        "update": "0",
        "after_update": "[110, 9, 0]",  # the updated graph adds 5, its loop ran again; launched twice
        "host_nodes_ran": "[100, 5, 5]",  # a captured host function runs at every launch
        "other_shape": "910 2",  # CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, TOPOLOGY_CHANGED
        "foreign_node": "1",  # a node handle that is not the lease's
    }
    assert "gpupool:" not in err


def test_old_symbols_with_a_forwarded_abis_parameters_do_what_it_does(shim_dir, worker):
    """Code that calls the driver's old symbols by name (ctypes, binaries built before CUDA 4.0) gets
    cuCtxDestroy, cuStreamDestroy, cuEventDestroy, cuCtxPushCurrent and cuCtxPopCurrent served as their _v2
    ABIs (cuda.h declares both with the same parameters): the handles are gone afterwards, the context stack
    moves. As driver 580 answers (tests/gpu/remote/prog_legacy.py): the old cuCtxPushCurrent refuses the context already
    current to the thread, and pushes it once popped; the 3.1 API's cuCtxCreate and cuMemAlloc (32-bit
    pointers) fail, and the shim says which call to use instead."""
    out, err = run_client("old_abis", client_env(shim_dir, worker))
    assert out == {
        "stream_destroy": "0",
        "stream_after": str(int(CUresult.INVALID_HANDLE)),
        "event_destroy": "0",
        "event_after": str(int(CUresult.INVALID_HANDLE)),
        "push_current": str(int(CUresult.INVALID_CONTEXT)),
        "pop": "0",
        "popped_is_it": "True",
        "push_floating": "0",
        "pushed_is_current": "True",
        "create": str(int(CUresult.NOT_SUPPORTED)),
        "destroy": "0",
        "old_alloc": str(int(CUresult.NOT_SUPPORTED)),
    }
    assert "cuMemAlloc is not forwarded" in err and "call cuMemAlloc_v2" in err  # what to call instead
    assert "cuCtxCreate is not forwarded" in err and "call cuCtxCreate_v" in err
    assert "cuEventDestroy is not forwarded" not in err


@pytest.mark.parametrize("transport", ["local socket", "tcp"])
def test_a_benchmark_harness_gets_its_elapsed_times_in_a_few_round_trips(shim_dir, worker, transport):
    """do_bench's loop: 100 pairs of events recorded on two streams, one synchronise, then each pair's
    elapsed time: every pair answered (as the worker's driver answers it) in a handful of round trips,
    not one each, and the same on asking again; an event recorded again is answered anew (its kept
    answer gone), one never recorded and one destroyed fail as the driver fails them, the others stay."""
    env = client_env(shim_dir, worker, GPUPOOL_SHIM_PROFILE="1")
    if transport == "tcp":
        env.pop(_wire.ENV_LOCAL, None)
    out, err = run_client("elapsed_many", env)
    assert out["all_answered"] == out["asked_again_same"] == out["others_still"] == "True", err
    assert out["recorded_again"] == "0,True"
    assert out["never_recorded"] == str(int(CUresult.NOT_READY))  # the host executor's answer for it
    assert out["destroyed"] == str(int(CUresult.INVALID_HANDLE))
    # 204 elapsed times asked: one round trip each without the shim's batching, 5 with it; a few more when
    # a kept answer was missed (the profile's "why not" rows say which), never near one each.
    why_not = [line for line in err.splitlines() if "keep answers" in line or "cuEventElapsedTime" in line]
    assert profile_rows(err)["gpEventElapsedMany"]["waited"] <= 25, why_not


def test_explicit_graphs_copy_event_and_host_nodes_read_back_and_clone(shim_dir, worker):
    out, err = run_client("graph_explicit_nodes", client_env(shim_dir, worker))
    assert out == {
        "copy_from_program_memory": "801",  # CUDA_ERROR_NOT_SUPPORTED, said on stderr
        "nodes": "5 5 True 0",  # the count, the five handles, the rest of the array NULL
        "edges": "True",
        "twin_type": "3",
        "copied": "09" * 16,  # through two copy nodes, in the clone
        "host_node_ran": "[7, 7]",  # at each launch, in the program
    }
    assert "copy node from or to pageable host memory" in err


def test_graph_copy_nodes_move_page_locked_host_memory_at_every_launch(shim_dir, worker):
    """Copy nodes to and from page-locked memory (cuMemAllocHost, cuMemHostAlloc) and registered memory,
    as the runtime's cudaGraphAddMemcpyNode samples build them: each launch copies what the host wrote
    last, and the host reads what the graph copied back."""
    out, err = run_client("graph_pinned_copies", client_env(shim_dir, worker))
    assert out == {
        "launch_0": "[1, 2, 3] 16 [1, 2, 3]",
        "launch_100": "[101, 102, 103] 116 [101, 102, 103]",
        "after_unregister": "116",
        "free": "0 0",
    }
    assert "gpupool:" not in err


def test_tensor_maps_are_encoded_by_the_worker_for_tensors_wholly_in_the_leases_memory(shim_dir, worker):
    """A tensor map is encoded only for a tensor wholly in one allocation of the lease, and moved only where it fits."""
    out, _ = run_client("tensor_maps", client_env(shim_dir, worker))
    assert out == {
        "tiled": "0 7 2 True (256, 128)",
        "foreign_address": "1",  # CUDA_ERROR_INVALID_VALUE: not memory of this lease
        "past_the_allocation": "1",  # the tensor's last rows would lie past its allocation
        "misaligned_address": "1",  # the driver's own refusal, through the worker
        "replaced": "0 True",
        "replaced_where_it_does_not_fit": "1",
        "replaced_in_a_made_up_map": "1",  # not a map this lease encoded: its extent is unknown
        "im2col": "0 (8, 16, 16)",
        "im2col_wide": "0 (8, 16, 16)",
    }


def test_a_tensor_maps_allocation_class_is_set_only_where_its_window_stays_in_the_lease(shim_dir, worker):
    """cuTensorMapSetAllocationClass: small and automatic take effect as small; large only on a map whose
    tensor spans the 128 KiB window the TMA may reach (a smaller tensor's is refused, as memory past it need
    not be the lease's); the changed map stays the lease's; an unknown class and a map the lease did not
    encode are invalid, the class reported small."""
    out, err = run_client("tensor_map_classes", client_env(shim_dir, worker))
    assert out["finished"] == "1", err
    assert (out["small_class"], out["auto_class"]) == ("0 1", "0 1")
    assert out["large_on_a_small_tensor"] == "801 1"  # CUDA_ERROR_NOT_SUPPORTED, the class still small
    assert out["large_on_a_large_tensor"] == "0 2"
    assert out["replaced_after"] == "0"
    assert (out["unknown_class"], out["made_up_map"]) == ("1 1", "1 1")


def test_a_graph_built_node_by_node_runs_its_nodes_in_dependency_order(shim_dir, worker):
    out, err = run_client("graph_nodes", client_env(shim_dir, worker))
    assert out == {
        "foreign_dependency": "1",  # CUDA_ERROR_INVALID_VALUE: not a node of this lease
        "first": "11",  # fill 10, then add 1: the dependency, not the order of creation
        "memset": "01010101",
        "second": "15",  # the instantiated graph's add node now adds 5
    }
    assert "gpupool:" not in err


def test_batch_memory_operation_nodes_write_only_the_leases_memory(shim_dir, worker):
    """A batch memory-operation node's writes land at each launch; its operations read back as given, set
    anew in the graph and in the instantiated graph (the instance's run), and it is added by type; an
    operation on memory not the lease's or past an allocation, of an unknown kind, or a node of another
    context is refused before anything runs."""
    out, err = run_client("graph_batch_mem_ops", client_env(shim_dir, worker))
    assert out["finished"] == "1", err
    assert out["written"] == str((0x11, 0x2222_3333_4444_5555))
    assert out["read_back"] == "(3, True)"
    assert out["instance_wrote"] == "0x44"
    assert out["not_the_leases"] == out["past_the_allocation"] == out["unknown_operation"] == "1"
    assert out["other_context"] == "801"  # CUDA_ERROR_NOT_SUPPORTED, said once
    assert "not forwarded yet" not in err


def test_graph_memory_nodes_allocate_within_the_partition_and_free_at_their_free_node(shim_dir, worker):
    """An allocation node gets an address the program can use in the graph's kernel and copy nodes (also
    when added as cuGraphAddNode's type), the graph runs twice; its bytes count against the partition until
    its free node; both nodes read back; a free node of memory that is not graph memory, or not the
    lease's, an allocation past the partition, on another device or in host memory are refused; graph
    memory attributes are read, the high-water mark reset, and trimming reaches only the lease's device."""
    out, err = run_client("graph_memory", client_env(shim_dir, worker))
    assert out["finished"] == "1", err
    assert out["address_given"] == out["by_type_address_given"] == "True"
    assert out["partition_counts_it"] == out["partition_free_again"] == "True"
    assert out["copied"] == "(7, 7, 7, 7)"  # the kernel node filled graph memory, the copy node moved it out
    assert out["read_back"] == "(1, 1, 0, 4096, True, 1, 0, 3)"  # pinned, on device 0, read-write for it
    assert out["free_reads_back"] == out["generic_read_back"] == "True"
    assert out["free_not_graph_memory"] == out["free_not_the_leases"] == "1"  # CUDA_ERROR_INVALID_VALUE
    assert out["past_partition"] == "2"  # CUDA_ERROR_OUT_OF_MEMORY
    assert out["other_device"] == out["trim_other_device"] == "101"  # CUDA_ERROR_INVALID_DEVICE
    assert out["host_location"] == "801"  # CUDA_ERROR_NOT_SUPPORTED
    assert out["set_current_refused"] == "1"
    assert "gpupool:" not in err


def test_a_graphs_own_nodes_are_read_back_set_anew_and_queried_as_pytorch_and_xla_do(shim_dir, worker):
    """Kernel, memset, copy and host nodes read back what was set; kernel, memset, copy and host nodes set anew run in
    graphs instantiated after (not in one instantiated before), as natively; an edge removed is gone; ids
    and the containing graph answer; kernel node attributes are set, read back and copied; nodes, memory
    and attributes that are not the lease's are refused."""
    out, err = run_client("graph_node_params", client_env(shim_dir, worker))
    # Every call given a node that is not the lease's: CUDA_ERROR_INVALID_HANDLE.
    assert set(out.pop("foreign_node").split()) == {"400"}
    assert out == {
        "memset_read_back": "0 True",
        "host_read_back": "0 True 7",  # the program's own function and argument
        "kernel_read_back": "0 True [1, 1, 1, 64, 1, 1] 0 True 10 64",  # function, shape, arguments
        "copy_read_back": "0 True",  # the program's own descriptor
        "first": "10 1010101 0",  # fill 10, memset 1 copied to out[0:16]
        "memset_read_back_anew": "0 True",
        "host_read_back_anew": "0 True 8",
        "kernel_read_back_anew": "0 True [1, 1, 1, 64, 1, 1] 0 True 20 64",
        "copy_read_back_anew": "True",
        "instantiated_before": "10 1010101 0",  # the old instance keeps its parameters
        "instantiated_after": "20 0 2020202",  # fill 20, memset 2 copied to out[16:32]
        "host_ran": "[7, 7, 8, 9]",  # the first launch, the old instance, the new one, the old one set anew
        "removed": "0 1 0 1",  # removed once; a second time: CUDA_ERROR_INVALID_VALUE (no such edge)
        "attribute_set": "0 (0, -1)",  # a kernel node's priority set and read back
        "attribute_window_outside_the_lease": "1",  # CUDA_ERROR_INVALID_VALUE: not memory of this lease
        "attribute_event": "801",  # CUDA_ERROR_NOT_SUPPORTED: an event in an attribute is not forwarded
        "attribute_copied": "0 (0, -1)",  # onto a kernel node of another graph
        "kernel_round_trip": "True [1, 1, 1, 64, 1, 1] 0 True 20 64",  # read back, set on another node
        "copy_read_back_pinned": "True",  # page-locked host memory: the program's pointer, not the mirror's
        "copy_read_back_twin": "0 2",  # a clone's twin: the device side (CU_MEMORYTYPE_DEVICE)
        "ids": "True True True",
        "foreign_edge": "1",  # CUDA_ERROR_INVALID_VALUE: as an edge added between nodes not the lease's
        "memset_outside_the_lease": "1",
        "memset_past_the_allocation": "1",
        "copy_past_the_allocation": "1",
        "memset_params_on_a_kernel_node": "1",
        "host_params_of_a_kernel_node": "1 1",
        "kernel_params_of_a_memset_node": "1",
        "memset_kept": "0 True",  # what was refused changed nothing
        "generic_memset": "0 True",  # cuGraphNodeSetParams, as the memset setter
        "generic_kernel_instance": "30 0 2020202",  # cuGraphExecNodeSetParams, as the kernel setter
        "generic_type_mismatch": "1",  # a kernel node given memset parameters
        # cuGraphNodeGetParams: each node's type and its typed getter's answer
        "generic_read_back": "(0, 0) True (0, 2) True (0, 1) True (0, 3) 8",
        "generic_read_back_foreign": "400",
        "dot": "0 True True",  # the worker's description, written to the program's path
        "dot_unwritable": "304",  # CUDA_ERROR_OPERATING_SYSTEM, as the driver's
        "dot_foreign_graph": "400",
    }
    assert "gpupool:" not in err


def test_an_instantiated_graph_takes_new_node_parameters_as_command_buffers_set_them(shim_dir, worker):
    """XLA's command buffers update an instantiated graph in place (memset, copy and child-graph nodes set
    anew, nodes switched off and on) and read a node's neighbours back: each takes effect at the next
    launch, and a new memset outside the lease is refused without running."""
    out, err = run_client("graph_updates", client_env(shim_dir, worker))
    assert out == {
        "roots": "True",
        "dependencies": "True",  # with each edge's data (the default edge: zeros)
        "dependents": "True",
        "dependencies_v1": "True",
        "dependents_v1": "True",
        "first": "01 01 03",  # memset 1, copied on, the child graph's memset 3
        "updated": "02 07 05",  # memset 2, the copy from the second source, the other child's 5
        "switched_off": "0 00 07 05",  # the memset node skipped: the zeroed bytes stay zero
        "switched_on": "02 07 05",
        "flags": "0",
        "memset_outside_the_lease": "1",  # CUDA_ERROR_INVALID_VALUE: not memory of this lease
        "memset_past_the_allocation": "1",  # its last bytes would lie past the allocation
        "copy_past_the_allocation": "1",
        "node_of_no_graph_here": "400",  # CUDA_ERROR_INVALID_HANDLE: not a node of this lease
    }
    assert "gpupool:" not in err


def test_queries_libraries_make_are_answered(shim_dir, worker):
    out, _ = run_client("queries", client_env(shim_dir, worker))
    assert out == expected_queries()


def test_a_long_running_call_keeps_the_lease_active(shim_dir, worker):
    proc = subprocess.Popen([sys.executable, str(CLIENT), "long_call"], env=client_env(shim_dir, worker),
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    launched = float(proc.stdout.readline().split()[1])
    time.sleep(2.5)  # the worker is inside a 3 s call: no new calls arrive, yet the lease is in use
    assert worker.last_activity() >= launched + 1.0
    assert proc.communicate(timeout=30)[0].strip() == "sync 0"


def forwarded_counts(stderr: str) -> dict[str, int]:
    """Forwarded calls per name, from the table GPUPOOL_SHIM_PROFILE=1 prints at exit."""
    rows = (line.split() for line in stderr.splitlines() if line.startswith("gpupool: cu"))
    return {row[1]: int(row[2]) for row in rows}


def test_answers_the_runtime_asks_again_are_kept_until_something_changes_them(shim_dir, worker):
    out, err = run_client("memo", client_env(shim_dir, worker, GPUPOOL_SHIM_PROFILE="1"))
    assert out["sm_count"] == "4"
    assert out["state_before_retain"] == "0/0"
    assert out["state_retained"] == "0/1"
    assert out["state_after_set_flags"] == "4/1"
    assert out["state_released"] == "4/0"
    assert out["dynamic_shared"] == "49152 1000 1000 1000 2000 1000"
    assert out["capturing"] == "0 0 1 1 0 0"  # NONE, ACTIVE during the capture, NONE after it
    calls = forwarded_counts(err)
    assert calls["cuDeviceGetAttribute"] == 1  # asked 50 times, a fact of the device
    assert calls["cuDevicePrimaryCtxGetState"] == 4  # once per change, not 54 times
    assert calls["cuFuncSetAttribute"] == 3  # 1000, 2000, 1000: the repeats of 1000 are not sent
    assert calls["cuFuncGetAttribute"] == 4  # after each setting that changed something
    assert calls["cuStreamIsCapturing"] == 4  # during a capture every question goes to the worker


def test_a_setter_or_an_unload_forgets_only_the_answers_about_its_own_kernel(shim_dir, worker):
    out, err = run_client("memo_kernels", client_env(shim_dir, worker, GPUPOOL_SHIM_PROFILE="1"))
    # function a, function b, kernel a passed as a function, a module's function
    assert out["at_first"] == "49152 49152 49152 49152"
    assert out["after_setting_b"] == "49152 3000 49152 49152"  # b's function follows its kernel
    assert out["after_setting_a"] == "2000 3000 49152 49152"
    assert out["module_function_after_unload"] == "49152"
    assert out["not_a_handle"] == " ".join(["400"] * 20)  # CUDA_ERROR_INVALID_HANDLE, every time
    calls = forwarded_counts(err)
    assert calls["cuKernelSetAttribute"] == 2  # two attributes; their identical repeats are not sent
    # 4 at first; b's function after b's setters; a's function and kernel a after a's function's
    # setter; the host pointer once. Asked 260 times; a change anywhere re-asking everything: 13.
    assert calls["cuFuncGetAttribute"] == 8


def test_the_drivers_linker_runs_on_the_worker_and_its_image_comes_back(shim_dir, worker, tmp_path):
    part = tmp_path / "b.ptx"
    part.write_text("// part b\n.visible .entry from_file(\n.param .u64 p\n)\n")
    out, _ = run_client("link", client_env(shim_dir, worker, LINK_FILE=str(part)))
    assert out == {
        "image_holds_both": "True",
        "function_from_file": "0",  # the file's kernel is in the module loaded from the linked image
        "destroy": "0",
        "after_destroy": "400",  # CUDA_ERROR_INVALID_HANDLE: the state is gone
        "missing_file": "301",  # CUDA_ERROR_FILE_NOT_FOUND
        "nothing_to_link": "1",  # CUDA_ERROR_INVALID_VALUE
    }


def test_a_context_the_program_creates_lives_on_the_worker_and_takes_its_memory_with_it(shim_dir, worker):
    for _ in range(3):  # each run leaves a context with 20 MiB of a 64 MiB partition: gone at its exit
        out, _ = run_client("contexts", client_env(shim_dir, worker))
        assert out == {
            "created_is_current": "True",
            "alloc_in_created": "0",
            "free_drops_by": "20",
            "destroy": "0",
            "current_after_destroy": "primary",  # the primary was under it on the stack
            "free_back": "True",
            "destroy_again": "201",  # CUDA_ERROR_INVALID_CONTEXT
            "destroy_primary": "201",  # not a context the program created
            "primary_still_works": "0",
            "left_alloc": "0",
        }


def test_with_kept_answers_off_every_question_goes_to_the_worker(shim_dir, worker):
    env = client_env(shim_dir, worker, GPUPOOL_SHIM_PROFILE="1", GPUPOOL_SHIM_MEMO="0")
    out, err = run_client("memo", env)
    assert out["dynamic_shared"] == "49152 1000 1000 1000 2000 1000"
    assert forwarded_counts(err)["cuDeviceGetAttribute"] == 50


def test_what_kernels_print_reaches_the_program_in_order_at_the_synchronise(shim_dir, worker):
    proc = subprocess.run([sys.executable, str(CLIENT), "printf"], env=client_env(shim_dir, worker),
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "before launch", "before sync", "kernel says 7", "kernel says 8", "after sync"
    ]  # fmt: skip


def test_a_launch_the_driver_refuses_fails_from_the_launch_call_itself(shim_dir, worker):
    out, _ = run_client("launch_errors", client_env(shim_dir, worker))
    assert out == {
        "too_many_threads": "1",  # CUDA_ERROR_INVALID_VALUE, as the driver answers the launch
        "block_z_too_deep": "1",
        "empty_block": "1",
        "grid_y_too_tall": "1",
        "registers_allow_fewer": "701",  # CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
        "saxpy_256": "0",
        "past_launch_bounds": "1",  # CUDA_ERROR_INVALID_VALUE, as the driver answers (measured on an H100)
        "shared_over_default": "1",
        "shared_after_raising": "0",
        "sync": "0",  # nothing refused was sent: no error waits at the synchronise
    }


def test_the_legacy_launch_api_runs_kernels_as_cuLaunchKernel_does(shim_dir, worker):
    """cuFuncSetBlockShape / cuFuncSetSharedSize / cuParamSet* then cuLaunch, cuLaunchGrid and
    cuLaunchGridAsync give the same memory as the same launches through cuLaunchKernel (the grid from the
    call, the block shape from the setter, each parameter at the offset set); the bad uses answer as the
    580 driver answers them on an H100 (tests/gpu/remote/prog_legacy.py): a parameter past the size set
    and a launch without a block shape succeed (the latter runs nothing), a size over the parameter
    limit, a negative offset, a grid or block of zero and an unknown function are refused from the call; cuCtxAttach/cuCtxDetach count uses of a context, the last detach destroys it."""
    out, _ = run_client("legacy_launch", client_env(shim_dir, worker))
    assert out == {
        # fill 7 over 2 x 32 threads, then +5 over one block of 16; untouched past the grid
        "legacy_words": "12 12 7 7 0",
        "fill_add_same": "True",
        "saxpy_y3": "10.5",  # 2.5 * 3 + 3
        "saxpy_same": "True",
        "seti_past_size": "0",  # accepted; a launch passes only the size set
        "setv_across_size": "0",
        "setf_negative_offset": "1",
        "size_over_limit": "1",
        "launch_without_block_shape": "0",
        "grid_of_zero": "1",
        "block_shape_of_zero": "1",
        "unknown_function": "400",  # CUDA_ERROR_INVALID_HANDLE
        "sync_after_bad_uses": "0",
        "attach": "0",
        "attached_current": "True",
        "attach_flags": "1",
        "detach": "0",
        "memset_after_detach": "0",  # the primary context's attach taken back; the context lives on
        "attach_own": "0",
        "detach_own_attach": "0",
        "detach_own_last": "0",  # its creation's use: the context is destroyed
        "own_destroyed": "True",
        "detach_not_current": "201",  # CUDA_ERROR_INVALID_CONTEXT
    }


def test_a_multi_device_cooperative_launch_runs_as_one_call_within_the_leases_devices(shim_dir, worker):
    """cuLaunchCooperativeKernelMultiDevice runs its launch; one too large is refused by the call (as a
    cooperative launch is), as are more launches than the lease has devices, a stream not the lease's and
    unknown flags; nothing refused leaves an error for the next synchronise."""
    out, err = run_client("cooperative_multi_device", client_env(shim_dir, worker))
    assert (out["launched"], out["sync"], out["filled"]) == ("0", "0", "5 5")
    assert out["too_large"] == "720"  # CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE
    assert out["more_than_devices"] == out["unknown_flags"] == "1"  # CUDA_ERROR_INVALID_VALUE
    assert out["foreign_stream"] == "400"  # CUDA_ERROR_INVALID_HANDLE
    assert out["sync_at_end"] == "0"
    assert "not forwarded" not in err


def test_cooperative_launches_run_and_one_too_large_is_refused_by_the_launch_call(shim_dir, worker):
    """Cooperative launches run; one with more blocks than fit at once fails from the launch call, as natively."""
    out, err = run_client("cooperative", client_env(shim_dir, worker))
    assert out == {
        "cooperative": "0",
        "sync": "0",
        "filled": "3 3",  # 32 blocks of 256 threads filled all 8192 words
        "too_large": "720",  # CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, from the launch call
        "sync_after_too_large": "0",  # nothing refused was sent
        "ex_cooperative": "0",
        "ex_too_large": "720",
        "ex_not_cooperative": "0",
        "sync_at_end": "0",
    }
    assert "not forwarded" not in err


def test_processes_of_one_lease_share_memory_and_events_through_ipc_handles_and_other_leases_cannot(
    shim_dir, worker
):
    exporter = subprocess.Popen([sys.executable, str(CLIENT), "ipc_export"], env=client_env(shim_dir, worker),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        handle = exporter.stdout.readline().split()[1]
        event_handle = exporter.stdout.readline().split()[1]
        env = client_env(shim_dir, worker, IPC_HANDLE=handle, IPC_EVENT_HANDLE=event_handle)
        out, _ = run_client("ipc_import", env)
        assert out == {
            "open": "0", "sees_export": "True", "close": "0", "closed_twice": "1",
            "event_open": "0", "event_wait": "0", "event_destroy": "0",
        }  # fmt: skip
        # Another lease (its own worker) gets nothing from this lease's handle.
        other = start_worker("other-lease", [WorkerDevice(0, "", 64 * MiB)], bind_host="127.0.0.1", env={},
                             executor="host")  # fmt: skip
        try:
            env = client_env(shim_dir, other, IPC_HANDLE=handle, IPC_EVENT_HANDLE=event_handle)
            out, _ = run_client("ipc_import", env)
            assert out == {"open": "1", "event_open": "400"}  # CUDA_ERROR_INVALID_VALUE, _INVALID_HANDLE
        finally:
            other.stop()
        garbage = client_env(shim_dir, worker, IPC_HANDLE="00" * 64, IPC_EVENT_HANDLE="00" * 64)
        assert run_client("ipc_import", garbage)[0] == {"open": "1", "event_open": "1"}
        exporter.stdin.write("\n")
        exporter.stdin.flush()
        assert exporter.stdout.readline().split() == ["after_import", "abababab"]  # the importer's write
        assert exporter.stdout.readline().split() == ["event_after_import", "0"]  # still the exporter's
    finally:
        exporter.kill()
        exporter.wait(10)


@pytest.mark.parametrize("transport", ["local socket", "tcp"])
def test_async_copies_chained_by_events_land_exactly_when_their_events_complete(shim_dir, worker, transport):
    """Copies into page-locked memory in flight on four streams, each waiting for the previous one's
    event, all held at a host-function gate: none has landed while the gate is shut; once an event
    shows complete (synchronise, a query that says done, a stream that waited for it) its copy and
    every copy ordered before it are in place; a host function between two copies of the chain sees
    exactly the copies before it; a chain of copies sends each landed buffer back to the device and
    then overwrites its source, in stream order; memsets and large copies of pageable memory on a
    stream (through the memory shared with the worker on its host) act in that order too."""
    env = client_env(shim_dir, worker)
    if transport == "tcp":  # bytes through the callback connection, no shared memory
        env.pop(_wire.ENV_LOCAL, None)
    out, err = run_client("async_copy_ordering", env)
    assert out["held_none_landed"] == out["held_still_none"] == "True"  # never before its event
    assert out["each_event_shows_its_copies"] == out["waiter_saw_all"] == "True"  # never later
    assert out["host_functions_see_exactly_the_earlier_copies"] == "True"
    assert out["chain_landed"] == out["chain_sent_back"] == out["chain_overwritten_after"] == "True"
    assert out["memsets_and_pageable_copies_in_stream_order"] == "True"
    assert "gpupool:" not in err


def test_page_locked_memory_on_the_workers_host_is_copied_when_the_stream_gets_there(shim_dir, worker):
    """On the worker's host page-locked memory is the worker's too: a cuMemcpyHtoDAsync from it reads
    it when its stream reaches the copy (what the host wrote after the call returned), as a GPU's DMA
    does, and a cuMemcpyDtoHAsync into it lands once the stream is past it. Across hosts (TCP) the bytes
    are taken when the call is made."""
    out, err = run_client("pinned_stream_order", client_env(shim_dir, worker))
    assert out["target_untouched"] == out["read_at_stream_time"] == "True"
    assert out["free"] == "0,0"
    assert "gpupool:" not in err
    env = client_env(shim_dir, worker)
    env.pop(_wire.ENV_LOCAL)
    tcp, _ = run_client("pinned_stream_order", env)
    assert tcp["target_untouched"] == tcp["read_at_call_time"] == "True"


def test_copies_to_page_locked_memory_return_at_once_and_land_before_anything_shows_them_done(
    shim_dir, worker
):
    """The stream held at a host function: the copy's call returns before its bytes are there; each
    way a program learns the stream got past it shows the bytes in place."""
    out, err = run_client("async_copies", client_env(shim_dir, worker))
    shown_done = ("stream_sync", "event_sync", "event_query", "ctx_sync", "stream_wait_event")
    assert {k: out[k] for k in shown_done} == dict.fromkeys(shown_done, "True,True")
    assert out["host_function"] == out["synchronous_copy"] == "True,True"
    assert out["host_function_saw"] == "True"  # a host function after the copy sees its bytes
    assert out["generic_async"] == "True,True"  # cuMemcpyAsync, as cuda.core copies
    assert out["many_landed"] == out["many_overwritten_after"] == out["many_sent_back"] == "True"
    assert out["later_copy_wins"] == out["host_to_host_after"] == "True"
    assert out["free_host"] == "0"
    assert out["pageable_waits"] == "True"
    assert out["bad_source"] == out["past_the_end"] == "1"  # CUDA_ERROR_INVALID_VALUE, from the call
    assert out["bad_stream"] == "0" and out["bad_stream_sync"] == "400" and out["after"] == "0"
    assert "gpupool:" not in err


@pytest.mark.parametrize("isolate", ["", "1"], ids=["shared", "isolate"])
def test_processes_of_one_lease_share_virtual_memory_through_descriptors_as_nccl_does_and_other_leases_cannot(
    shim_dir, worker, isolate
):
    """NCCL's cuMem transport between two ranks of one lease: memory exported as a POSIX descriptor and
    passed over a Unix socket is imported, mapped and written by the other process; the exporter sees the
    write and the partition counts the memory once; the importer keeps using and then releases its
    reference after the exporter has released its own. A process of another lease given the same
    descriptor is refused, as are a descriptor that names nothing and memory not created to be shared.
    The device offers POSIX descriptors and no fabric handles or multicast, which are not forwarded.
    With GPUPOOL_ISOLATE each rank has a worker of its own, and the memory is carried between them; the
    partition counts it in its exporter's worker, and in the importer's once the exporter has gone."""
    socket_name = f"gpupool-test-vmm-{os.getpid()}-{isolate}"
    env = client_env(shim_dir, worker, VMM_SOCKET=socket_name, GPUPOOL_ISOLATE=isolate)
    exporter = subprocess.Popen([sys.executable, str(CLIENT), "vmm_share_export"], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    importer = None
    try:
        first = [exporter.stdout.readline().split() for _ in range(4)]
        assert first == [
            ["export_unshareable", "1"],
            ["export_fabric", "801"],
            ["sharing_attributes", "1,0,0,1"],  # the GPU's fabric handles and multicast are not offered
            ["ready", "1"],
        ]
        importer = subprocess.Popen([sys.executable, str(CLIENT), "vmm_share_import"], env={**env, "VMM_WAIT": "1"},
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
        got = {}
        while "waiting" not in got and (line := importer.stdout.readline()):
            got.update([line.split(" ", 1)])
        assert got == {"import": "0\n", "properties": "0 1 0\n", "sees_export": "True\n", "waiting": "1\n"}
        exporter.stdin.write("\n")  # the exporter reads the importer's write, unmaps and releases
        exporter.stdin.flush()
        rest = dict(exporter.stdout.readline().split() for _ in range(3))
        assert rest == {"after_import": "cdcdcdcd", "used_mib": "4", "release": "0"}
        assert exporter.wait(30) == 0
        out, _ = importer.communicate("\n", timeout=60)
        assert importer.returncode == 0, out
        assert parse(out) == {
            "sees_after_exporter_left": "True",  # the importer's mapping keeps the memory
            "import_again": "0 0",  # and its reference keeps the descriptor good: imported and released again
            "used_mib_after_exporter_left": "4",  # counted once while any process of the lease holds it ...
            "used_mib_at_end": "0",  # ... and no longer once none does
            "release_while_mapped": "0",  # its own reference, still the lease's after the exporter's went
            "used_mib_released_still_mapped": "4",  # the mapping keeps the memory, and its count
            "after_release": "cdcdcdcd",
            "import_other_fd": "1",  # CUDA_ERROR_INVALID_VALUE
        }
        other = start_worker("other-lease", [WorkerDevice(0, "", 64 * MiB)], bind_host="127.0.0.1", env={},
                             executor="host")  # fmt: skip
        try:
            # Its worker holds memory under the very handle value the descriptor names: the refusal is the
            # lease's rule (only what a process of the lease exported), not an unknown handle.
            exporter2 = subprocess.Popen([sys.executable, str(CLIENT), "vmm_share_export"],
                                         env=client_env(shim_dir, worker, VMM_SOCKET=socket_name + "-2"),
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
            try:
                assert [exporter2.stdout.readline().split()[0] for _ in range(4)][-1] == "ready"
                other_env = client_env(shim_dir, other, VMM_SOCKET=socket_name + "-2", VMM_OWN_FIRST="1")
                out2, _ = run_client("vmm_share_import", other_env)
                assert out2 == {
                    "own_handle_is_the_exported_value": "True",
                    "import": "1",
                }  # CUDA_ERROR_INVALID_VALUE
            finally:
                exporter2.kill()
                exporter2.wait(10)
        finally:
            other.stop()
    finally:
        for proc in (exporter, importer):
            if proc is not None:
                proc.kill()
                proc.wait(10)


def test_memory_whose_handle_is_released_while_mapped_counts_until_it_is_unmapped(shim_dir, worker):
    """NCCL maps its buffers and releases their handles at once; natively the mapping keeps the memory
    allocated until it is unmapped, so it counts against the partition until then (before, the release
    alone uncounted it: every NCCL buffer was free memory to the lease)."""
    out, _ = run_client("vmm_release_while_mapped", client_env(shim_dir, worker))
    assert out == {"used_mib_after_release": "4", "contents": "07070707", "used_mib_after_unmap": "0"}


def test_with_isolate_virtual_memory_its_exporter_released_counts_until_its_importer_releases_it(
    shim_dir, worker
):
    """Natively memory of the virtual memory API stays allocated, and counted, while any process holds a
    reference: the exporter's release leaves it to the importer's. Under GPUPOOL_ISOLATE the exporter's
    worker keeps counting it after its process released it, while the exporting process still runs, until
    the importer's worker has released it too (before, it counted nowhere between the two)."""
    socket_name = f"gpupool-test-vmm-stay-{os.getpid()}"
    env = client_env(shim_dir, worker, VMM_SOCKET=socket_name, GPUPOOL_ISOLATE="1", VMM_STAY="1")
    exporter = subprocess.Popen([sys.executable, str(CLIENT), "vmm_share_export"], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    importer = None
    try:
        assert [exporter.stdout.readline().split()[0] for _ in range(4)][-1] == "ready"
        importer = subprocess.Popen([sys.executable, str(CLIENT), "vmm_share_import"], env={**env, "VMM_WAIT": "1"},
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
        while (line := importer.stdout.readline()) and not line.startswith("waiting"):
            pass
        exporter.stdin.write("\n")  # the exporter unmaps and releases its reference, and stays
        exporter.stdin.flush()
        rest = dict(exporter.stdout.readline().split() for _ in range(4))
        assert rest["release"] == "0"
        assert rest["used_mib_after_release"] == "4"  # the importer holds it: still the lease's
        out, _ = importer.communicate("\n", timeout=60)
        assert importer.returncode == 0, out
        assert parse(out)["used_mib_after_exporter_left"] == "4"
        assert parse(out)["used_mib_released_still_mapped"] == "4"  # its mapping keeps it, as natively
        assert parse(out)["used_mib_at_end"] == "0"  # released and unmapped by its last holder
        out, _ = exporter.communicate("\n", timeout=60)
        assert parse(out)["used_mib_after_importer_released"] == "0"
        assert exporter.returncode == 0
    finally:
        for proc in (exporter, importer):
            if proc is not None:
                proc.kill()
                proc.wait(10)


def _green(shim_dir, handle):
    out, _ = run_client("green", client_env(shim_dir, handle))
    assert out["finished"] == "1"
    return out


def test_green_contexts_partition_the_gpu_and_run_work(shim_dir, worker):
    """A whole-GPU lease sees the modelled GPU's SMs (4) as its device's and context's resource, splits
    them (the primary context's execution affinity is those SMs), makes a green context of a group with a
    stream in it (whose resource is the group's, a plain stream's the context's: cuStreamGetDevResource), records and waits an event in it, runs a
    kernel there; forged resources, a split or descriptor beyond the SMs it has, and green contexts of no
    process of the lease are refused; destroying one twice is refused the second time."""
    out = _green(shim_dir, worker)
    assert (out["device_sms"], out["context_sms"], out["affinity_sms"]) == ("4", "4", "4")
    assert out["affinity_wrong_type"] == "1"
    assert out["wrong_type"] == "914"  # CUDA_ERROR_INVALID_RESOURCE_TYPE
    assert out["groups_possible"] == "4"  # one SM each
    assert (out["groups"], out["group_sms"], out["rest_sms"]) == ("2", "1", "2")
    assert out["split_beyond_share"] == "915"  # CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION
    # CUDA 13.1's structured split: a group of 2, the rest discovered and split off; discovery alone
    assert out["structured_split"] == "(0, [2, 2], [2, 2], 0)"
    assert out["structured_discovery"] == "(0, [4], None, 0)"
    assert (out["structured_beyond_share"], out["structured_odd"]) == ("915", "915")
    assert out["forged_split"] == "400"  # CUDA_ERROR_INVALID_HANDLE
    assert out["forged_desc"] == "400"
    assert out["desc_beyond_share"] == "915"
    assert (out["green_sms"], out["green_ctx_sms"], out["green_affinity_sms"]) == ("1", "1", "1")
    assert out["green_id"] == "0"
    assert out["stream_green_same"] == "True"
    assert out["stream_sms"] == "(1, 4, 4)"  # a green context's stream its SMs; the others the context's
    assert (out["stream_wrong_type"], out["foreign_stream"]) == ("914", "400")
    assert out["green_ctx_device"] == "0"
    assert out["launched"] == "9"
    assert out["foreign_green_stream"] == out["foreign_green_record"] == out["foreign_green_destroy"] == "400"
    assert out["affinity_supported"] == "0"
    assert out["destroyed_twice"] == "400"


def test_a_lease_with_an_sm_share_sees_and_splits_only_its_share(shim_dir):
    """A lease given half the GPU's SMs (its MPS partition, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50) sees 2 of
    the 4 SMs as its device's and primary context's resource and affinity; its splits and green contexts stay within
    them, and a split or descriptor asking for more than the 2 is refused before the driver."""
    shared = start_worker("share-lease", [WorkerDevice(0, "", 64 * MiB)], bind_host="127.0.0.1",
                          env={"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}, executor="host")  # fmt: skip
    try:
        out = _green(shim_dir, shared)
    finally:
        shared.stop()
    assert (out["device_sms"], out["context_sms"], out["affinity_sms"]) == ("2", "2", "2")
    assert out["groups_possible"] == "2"
    assert (out["groups"], out["group_sms"], out["rest_sms"]) == ("2", "1", "0")
    assert out["split_beyond_share"] == "915"
    assert out["structured_split"].startswith("(915,")  # the discovered group would have no SM left: invalid
    assert out["structured_discovery"] == "(0, [2], None, 0)"
    assert out["structured_beyond_share"] == "915"  # 4 SMs asked of the share's 2: refused before the driver
    assert out["desc_beyond_share"] == "915"
    assert out["green_sms"] == "1"
    assert out["launched"] == "9"


PROC_ADDRESS_PROBE = """
import ctypes, sys
lib = ctypes.CDLL("libcuda.so.1")
find = lib.cuGetProcAddress_v2
find.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64,
                 ctypes.POINTER(ctypes.c_int)]
for asked in sys.argv[1:]:
    name, _, version = asked.partition("@")
    pfn, status = ctypes.c_void_p(), ctypes.c_int(-1)
    rc = find(name.encode(), ctypes.byref(pfn), int(version or 13000), 0, ctypes.byref(status))
    print(asked, rc, pfn.value or 0, status.value)
"""


def probe_proc_addresses(
    shim_dir, lacks: str, asked: list[str], driver: int = 0
) -> dict[str, tuple[int, int, int]]:
    """cuGetProcAddress_v2(name, version) for each `name@version` asked, in a program leased a host-executor
    worker whose pretend driver (of version `driver`, else the call table's newest) lacks `lacks`: (result,
    function, status) for each."""
    env = {"GPUPOOL_HOST_EXECUTOR_LACKS": lacks, "GPUPOOL_HOST_EXECUTOR_DRIVER": str(driver)}
    handle = start_worker("test-lease", [WorkerDevice(0, "", 64 * MiB)], bind_host="127.0.0.1", env=env,
                          executor="host")  # fmt: skip
    try:
        proc = subprocess.run([sys.executable, "-c", PROC_ADDRESS_PROBE, *asked], env=client_env(shim_dir, handle),
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
    finally:
        handle.stop()
    return {line.split()[0]: tuple(map(int, line.split()[1:])) for line in proc.stdout.splitlines()}


@pytest.mark.parametrize("lacks", ["", "cuLogsCurrent,cuMemcpyWithAttributesAsync"])
def test_an_entry_point_the_servers_driver_lacks_is_not_found_as_that_driver_answers(shim_dir, lacks):
    """A call of a newer CUDA than the GPU server's driver (cuda-bindings declares CUDA 13.3's, the
    580 driver is 13.0) is not found by cuGetProcAddress in the client, as on the server itself: the
    worker tells the names its driver lacks (here the host executor's test seam pretends), the lease
    answer carries them to the shim; every other name is found, and without such names all are."""
    names = ["cuLogsCurrent", "cuMemcpyWithAttributesAsync", "cuMemAlloc", "cuLaunchKernel"]
    found = probe_proc_addresses(shim_dir, lacks, names)
    missing = set(filter(None, lacks.split(",")))
    for name in names:  # success with no function and CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, as the 580 driver
        result, function, status = found[name]
        assert (result, bool(function), status) == ((0, False, 1) if name in missing else (0, True, 0)), name


def test_a_version_newer_than_the_servers_driver_is_an_invalid_value_as_that_driver_answers(shim_dir):
    """Asked at a CUDA version newer than the GPU server's driver (cuda-bindings 13.3 on the 580 driver, 13.0),
    cuGetProcAddress fails with CUDA_ERROR_INVALID_VALUE and fills in nothing, as that driver does (measured:
    tests/gpu/remote/prog_proc_addresses.py); at the driver's own version the same name is found."""
    asked = ["cuMemAlloc@13010", "cuMemAlloc@13000", "cuLaunchKernel@13030"]
    found = probe_proc_addresses(shim_dir, "", asked, driver=13000)
    assert found["cuMemAlloc@13010"] == found["cuLaunchKernel@13030"] == (1, 0, -1)
    assert found["cuMemAlloc@13000"][0::2] == (0, 0) and found["cuMemAlloc@13000"][1]


def test_each_name_and_version_is_found_or_not_as_the_servers_driver_answers_it(shim_dir):
    """cuGetProcAddress(name, version) per ABI, as a driver answers: a driver without a newer ABI of a name
    hands out its older one at the newer version (cuMulticastBindMem asked at 13.1 on a driver without
    its _v2); a name asked at a version older than the name is not found (VERSION_NOT_SUFFICIENT); a
    newer ABI the shim serves itself is found though the driver lacks it (CUDA 13.4's cuGraphAddNode_v3
    on a 13.0 driver, sent as calls that driver has); a name wholly lacked is not found at any version
    (SYMBOL_NOT_FOUND), one lacked only at its older ABI is VERSION_NOT_SUFFICIENT there."""
    lacks = "cuMulticastBindMem@13010,cuGraphAddNode@13041,cuLogsCurrent,cuMulticastBindAddr@12010"
    asked = ["cuMulticastBindMem@12010", "cuMulticastBindMem@13010", "cuMulticastBindAddr@13010",
             "cuMulticastBindAddr@12010", "cuMemGetLocationInfo@13000", "cuMemGetLocationInfo@13041",
             "cuGraphAddNode@12030", "cuGraphAddNode@13041", "cuLogsCurrent@12080", "cuLogsCurrent@13000",
             "cuGraphAddKernelNode@11000", "cuLogsCurrent@11000"]  # fmt: skip
    found = probe_proc_addresses(shim_dir, lacks, asked)
    assert found["cuMulticastBindMem@13010"] == found["cuMulticastBindMem@12010"]  # the older ABI's function
    assert found["cuMulticastBindMem@13010"][:2] != (500, 0)
    assert (
        found["cuMulticastBindAddr@13010"][1] != found["cuMulticastBindAddr@12010"][1]
    )  # the driver has both
    assert found["cuMemGetLocationInfo@13000"] == (0, 0, 2)  # no function, VERSION_NOT_SUFFICIENT
    assert found["cuMemGetLocationInfo@13041"][0::2] == (0, 0)
    assert found["cuGraphAddNode@13041"][0::2] == (0, 0)
    assert found["cuGraphAddNode@13041"][1] != found["cuGraphAddNode@12030"][1]  # the shim's own _v3
    # a name the driver has no ABI of: SYMBOL_NOT_FOUND at any version, below its first one too (as the 580
    # driver answers cuFuncGetParamCount at 12.9); one it has only newer ABIs of: VERSION_NOT_SUFFICIENT
    assert (
        found["cuLogsCurrent@12080"]
        == found["cuLogsCurrent@13000"]
        == found["cuLogsCurrent@11000"]
        == (0, 0, 1)
    )
    assert found["cuMulticastBindAddr@12010"] == (0, 0, 2)
    # an older ABI the table does not forward is found, and refuses when called, as before
    assert found["cuGraphAddKernelNode@11000"][0::2] == (0, 0)


def test_a_global_placed_over_an_unloaded_modules_global_is_the_programs_whole(shim_dir, worker):
    """The driver reuses an unloaded module's memory for the next module's globals: a 24-byte global at
    the address where a 16-byte one was is copied to and from whole (JAX's FFT tests were refused such a
    copy, "not memory of this lease", and aborted)."""
    out, _ = run_client("globals_reused", client_env(shim_dir, worker))
    assert out == {
        "same_address": "True",
        "size": "24",
        "copy_to": "0",
        "copy_back": "0",
        "bytes_equal": "True",
    }


def test_a_recapture_asks_the_programs_callback_about_each_changed_node_and_runs_its_values(shim_dir, worker):
    """cuStreamBeginRecaptureToGraph (CUDA 13.3) is forwarded: recapturing a kernel and a memset with new
    values into the same graph calls the program's callback, in the program, once per changed node with
    both nodes' parameters (a kernel node's arguments readable through kernelParams), and the graph runs
    the new values; with no callback the new values are taken; a callback answering an error, or captured
    work that is not the graph's next node, fails the recapture (CUDA_ERROR_GRAPH_RECAPTURE_FAILURE)."""
    out, err = run_client("recapture", client_env(shim_dir, worker))
    assert out["finished"] == "1", err
    assert out["captured"] == "(7, 5)"
    assert out["begin"] == out["end"] == out["no_callback"] == "0"
    assert out["same_graph"] == "True"
    assert out["asked"] == "kernel:7>kernel:9:0,memset:5>memset:6:0"
    assert out["recaptured"] == "(9, 6)"
    assert out["taken"] == "(11, 8)"
    assert out["refused"] == out["other_topology"] == "918"


def test_a_recapture_is_not_found_where_the_servers_driver_lacks_it(shim_dir):
    """On a GPU server whose driver is older than CUDA 13.3 (the 580 drivers are 13.0),
    cuGetProcAddress("cuStreamBeginRecaptureToGraph") is not found in the client, as on the server: at
    13.3 the version is newer than the driver (CUDA_ERROR_INVALID_VALUE), at 13.0 the symbol is not found;
    on a driver that has it, it is."""
    asked = ["cuStreamBeginRecaptureToGraph@13030", "cuStreamBeginRecaptureToGraph@13000"]
    lacking = probe_proc_addresses(shim_dir, "cuStreamBeginRecaptureToGraph", asked, driver=13000)
    having = probe_proc_addresses(shim_dir, "", asked[:1])
    assert lacking[asked[0]] == (1, 0, -1)  # CUDA_ERROR_INVALID_VALUE, nothing filled in
    assert lacking[asked[1]] == (0, 0, 1)  # no function, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
    assert having[asked[0]][0] == 0 and having[asked[0]][1] != 0


def test_graph_memory_no_free_node_frees_stays_within_the_partition_as_graphs_come_and_go(shim_dir, worker):
    """A lease that makes and destroys graphs whose allocation no free node frees (allocation nodes and
    captured cuMemAllocAsync), 16 of 6 MiB each in a 64 MiB partition: a never-launched one stops counting
    when its graph and executable graph are gone; a launched one stays usable and counted after its graph
    (as the driver keeps it) until the program frees it and a trim returns the driver's reserve; the free
    memory never drops by more than one allocation, and the whole partition can be allocated after."""
    out, err = run_client("graph_memory_loop", client_env(shim_dir, worker))
    assert out["finished"] == "1", err
    assert out["never_launched_back"] == out["captured_back"] == "True"
    assert out["live_still_counted"] == out["live_usable"] == "True"
    assert out["bounded"] == out["trimmed_back"] == "True"
    assert out["can_allocate"] == "0"
