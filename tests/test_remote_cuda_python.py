"""Real cuda-python programs through the shim, and the CUDA executor itself, on a machine with no GPU.

The chain test runs the worker's CUDA executor (server/_cuda.py, cuda.bindings) for real: its
cuda.bindings loads gpupool's libcuda.so.1 too, which forwards to a second worker with the host
executor. So every call the executor makes goes through the real cuda.bindings API.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from remote_helpers import MiB, client_env, needs_cc, parse, run_client, shim_dir, worker

from server.worker import WorkerDevice, start_worker
from virtualize.remote import remote_env

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
def cuda_executor_worker(shim_dir, worker):
    """A worker with the real CUDA executor whose driver is the shim, pointed at the host worker."""
    answer = {"id": "inner", "worker": {"host": worker.host, "port": worker.port, "secret": worker.secret}}
    env = {**remote_env(answer, cache_root=shim_dir.parent / "cache"), "LD_LIBRARY_PATH": str(shim_dir)}
    uuid = "GPU-60606060-6060-6060-6060-606060606060"  # the host executor's device 0, found by its UUID
    device = WorkerDevice(7, uuid, 48 * MiB)
    handle = start_worker("outer", [device], bind_host="127.0.0.1", env=env, executor="cuda")
    yield handle
    handle.stop()


@pytest.mark.parametrize("scenario", ["devices", "copies", "events", "kernels", "quota"])
def test_the_cuda_executor_serves_every_scenario(shim_dir, cuda_executor_worker, scenario):
    out, _ = run_client(scenario, client_env(shim_dir, cuda_executor_worker))
    expected = {
        "devices": {"total": str(48 * MiB), "info_free_after": str(40 * MiB), "cc_major": "9"},
        "copies": {"htod_dtoh": "True", "dtod": "True", "generic": "True", "pinned_copy": "True"},
        "events": {"query": "0", "elapsed_ok": "True", "destroyed_stream_sync": "400"},
        "kernels": {"first": "12", "not_added": "7", "param1": "8+4", "sync_after_fault": "700"},
        "quota": {"first": "0", "second": "2", "pool_over": "2", "after_free": "0"},  # 48 MiB partition
    }[scenario]
    assert {k: out.get(k) for k in expected} == expected


def test_the_cuda_executor_serves_cuda_core(shim_dir, cuda_executor_worker, tmp_path):
    out = run_program("core", client_env(shim_dir, cuda_executor_worker), tmp_path)
    assert out["added"] == "True"
