"""Each process of a lease has CUDA contexts of its own in the worker, as natively: a sticky error (an
illegal address, a device-side assert) in one process's context never reaches another process of the
lease, and the driver's primary-context calls answer per process. Real worker process, real shim, real
client processes (tests/remote_client.py); each test runs on the host executor, and again on the CUDA
executor (virtualize/server/_cuda.py through real cuda.bindings, whose driver is the shim pointed at a
host-executor worker: the contexts it creates per process are that worker's, so a sticky error there
is confined to one of them or not).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from remote_helpers import (
    CLIENT,
    MiB,
    client_env,
    cuda_executor_worker,
    needs_cc,
    parse,
    run_client,
    shim_dir,
    worker,
)

from server.workers import WorkerDevice, start_worker
from virtualize.common._results import CUresult

pytestmark = needs_cc
__all__ = ["cuda_executor_worker", "shim_dir", "worker"]  # fixtures

ASSERT = str(CUresult.ASSERT.value)


@pytest.fixture(params=["host executor", "cuda executor"])
def lease_worker(request):
    if request.param == "cuda executor":
        pytest.importorskip("cuda.bindings.driver")
        return request.getfixturevalue("cuda_executor_worker")
    return request.getfixturevalue("worker")


def _started(scenario: str, env: dict[str, str]) -> tuple[subprocess.Popen, dict[str, str]]:
    """A client process that runs until it says `ready`, then waits for a line on stdin."""
    proc = subprocess.Popen([sys.executable, str(CLIENT), scenario], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    said = []
    for line in proc.stdout:
        said.append(line)
        if line.startswith(("ready", "FAILED")):
            break
    return proc, parse("".join(said))


def _finished(proc: subprocess.Popen) -> dict[str, str]:
    out, err = proc.communicate("\n", timeout=60)
    assert proc.returncode == 0, out + err
    return parse(out)


def test_a_device_side_assert_in_one_process_leaves_the_leases_other_processes_working(
    shim_dir, lease_worker
):
    """Process A's kernel asserts: A's context fails with CUDA_ERROR_ASSERT at every later call, until A
    resets its primary context; process B of the same lease, started before and holding memory, keeps
    its memory intact and runs kernels; a process started after A works too."""
    env = client_env(shim_dir, lease_worker)
    holder, before = _started("context_holder", {**env, "STICKY_WAIT": "1"})
    try:
        assert before["ready"] == "1"
        out, _ = run_client("device_assert", env)
        assert out["ctx"] != before["ctx"]  # A's primary context is not B's
        assert out["assert_launch"] == "0"  # launches do not wait: the error comes at the next sync
        assert out["sync"] == out["sync_again"] == ASSERT  # sticky: every later call says it
        assert out["copy_after"] == ASSERT
        assert out["device_count"].startswith("0 ")  # device queries still answer
        assert out["reset"] == "0"  # cudaDeviceReset's way out: a new context works
        assert out["alloc_after_reset"] == "0"
        assert out["add_one_after_reset"] == "0 0"
        assert out["kernel_after_reset"] == "True"
        after = _finished(holder)
    finally:
        holder.kill()
        holder.wait(10)
    assert after["memory_intact"] == "True"
    assert after["add_one"] == "0 0"
    assert after["kernel_ran"] == "True"
    later, _ = run_client("context_holder", env)  # a process started after A's assert
    assert later["memory_intact"] == later["kernel_ran"] == "True"


def test_primary_context_calls_answer_per_process_as_the_driver_does(shim_dir, lease_worker):
    """Retain, release, get-state, set-flags and reset act on the calling process's own primary context:
    another process's flags and retains are not seen, a second retain gives the same context, the last
    release and a reset destroy it with its memory, a release too many is CUDA_ERROR_INVALID_CONTEXT,
    and the first process's context and memory are untouched throughout."""
    env = client_env(shim_dir, lease_worker)
    holder, first = _started("primary_holder", env)
    try:
        assert first["state"] == "4/1"  # CU_CTX_SCHED_BLOCKING_SYNC, retained
        out, _ = run_client("primary_other", env)
        assert out["state_before_retain"] == "0/0"  # not the first process's 4/1
        assert out["ctx"] != first["ctx"]
        assert out["same_twice"] == "True"
        assert out["state_retained"] == "0/1"
        assert out["set_flags"] == "0"
        assert out["bad_flags"] == str(CUresult.INVALID_VALUE.value)
        assert out["state_flags"] == "1/1"
        assert out["release_one"] == "0"
        assert out["state_still_retained"] == "1/1"
        assert out["copy_still"] == "0"
        assert out["release_last"] == "0"
        assert out["state_released"] == "1/0"  # the flags stay, the context is gone
        assert out["release_unretained"] == str(CUresult.INVALID_CONTEXT.value)
        assert out["memory_of_released_context"] != "0"  # went with its context
        assert out["reset"] == "0"
        assert out["state_reset"].endswith("/0")
        assert out["memory_of_reset_context"] != "0"
        assert out["alloc_after_reset"] == "0"
        after = _finished(holder)
    finally:
        holder.kill()
        holder.wait(10)
    assert after["state_after_other"] == "4/1"
    assert after["copy_after_other"] == "0"


@pytest.fixture
def logged_worker(tmp_path):
    """A host-executor worker whose log (its stderr) goes to a file the test reads."""
    log = tmp_path / "worker.log"
    saved = os.dup(2)
    with log.open("wb") as out:
        os.dup2(out.fileno(), 2)  # the worker inherits it
        try:
            handle = start_worker("test-lease", [WorkerDevice(0, "", 64 * MiB)], bind_host="127.0.0.1", env={},
                                  executor="host")  # fmt: skip
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    handle.log = log
    yield handle
    handle.stop()


def _log_until(log, text: str, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while text not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    return log.read_text()


def test_a_process_that_leaves_with_a_spoiled_context_gives_its_memory_back(shim_dir, logged_worker):
    """A process whose context a device-side assert spoiled exits holding memory: the worker gives that
    memory back all the same (with no context current: the spoiled one refuses the calls), without a
    warning, and the partition is whole again for the next process."""
    env = client_env(shim_dir, logged_worker)
    out, _ = run_client("spoiled_exit", env)
    assert out["sync"] == ASSERT
    said = _log_until(logged_worker.log, "the client left behind")
    assert "the client left behind" in said  # its allocations were given back ...
    assert "could not" not in said  # ... every one of them
    out, _ = run_client("spoiled_exit_after", env)
    assert out["free_is_total"] == "True"


def test_processes_with_contexts_of_their_own_still_share_memory_through_ipc_handles(shim_dir, lease_worker):
    """An IPC memory handle and an IPC event handle of one process open in another process of the lease,
    whose contexts are not the first one's: the importer sees the exporter's bytes and waits for its
    event, and the exporter sees what the importer wrote."""
    env = client_env(shim_dir, lease_worker)
    exporter = subprocess.Popen([sys.executable, str(CLIENT), "ipc_export"], env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        handle = exporter.stdout.readline().split()[1]
        event_handle = exporter.stdout.readline().split()[1]
        out, _ = run_client("ipc_import", {**env, "IPC_HANDLE": handle, "IPC_EVENT_HANDLE": event_handle})
        assert out["open"] == out["event_open"] == out["event_wait"] == "0"
        assert out["sees_export"] == "True"
        exporter.stdin.write("\n")
        exporter.stdin.flush()
        assert exporter.stdout.readline().split() == ["after_import", "abababab"]  # the importer's write
    finally:
        exporter.kill()
        exporter.wait(10)
