"""Each process of a lease has CUDA contexts of its own in the worker, as natively: a sticky error (an
illegal address, a device-side assert) in one process's context never reaches another process of the
lease, and the driver's primary-context calls answer per process. Real worker process, real shim, real
client processes (tests/remote_client.py); each test runs on the host executor, and again on the CUDA
executor (virtualize/server/_cuda.py through real cuda.bindings, whose driver is the shim pointed at a
host-executor worker: the contexts it creates per process are that worker's, so a sticky error there
is confined to one of them or not).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from remote_helpers import (
    CLIENT,
    client_env,
    cuda_executor_worker,
    needs_cc,
    parse,
    run_client,
    shim_dir,
    worker,
)

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
