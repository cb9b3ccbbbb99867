"""A CUDA worker that serves many short runs keeps no page-locked memory for the runs that ended.

Run on a GPU host, from the repository root: python -m pytest tests/gpu/test_worker_staging.py -v

Each connection copies through two page-locked staging buffers of its own (8 MiB each); they go when
the connection does (`CudaExecutor.end_thread`). The worker's resident memory after five runs of a
program with 10 MiB copies must not have grown by a staging set per run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import remote_helpers
from remote_helpers import client_env, run_client

from server.workers import WorkerDevice, start_worker
from virtualize.server._cuda import STAGING_CHUNK

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(240)]
shim_dir = remote_helpers.shim_dir  # fixture


def resident_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_worker_frees_each_runs_staging_when_the_run_ends(shim_dir):
    handle = start_worker("staging", [WorkerDevice(0, "", 1 << 30)], bind_host="127.0.0.1", env={},
                          executor="cuda")  # fmt: skip
    try:
        env = client_env(shim_dir, handle, GPUPOOL_DATA_ENCRYPTION="always")  # TCP: copies staged
        after = []
        for _ in range(5):
            out, _ = run_client("copies", env, timeout=120)
            assert out["still_connected"] == "0"
            after.append(resident_bytes(handle.pid))
        grown = after[-1] - after[0]
        print(f"worker resident after each run (MiB): {[round(a / 2**20) for a in after]}")
        assert grown < 2 * STAGING_CHUNK, f"grew {grown >> 20} MiB over four runs"
    finally:
        handle.stop()


def test_large_copies_work_after_the_primary_context_ended_and_came_back():
    """A thread that copied through its staging buffers in the primary context, which then ended (its last
    reference let go, as a receiving worker does once the lease's memory is in), copies again in the new primary
    context — which the driver may give the same handle — instead of failing with CONTEXT_IS_DESTROYED (709) on
    the ended context's buffers (a move of PyTorch's expandable segments between servers failed so)."""
    from virtualize.server._cuda import CudaExecutor

    executor = CudaExecutor([WorkerDevice(0, "", 1 << 30)])
    size = 3 * STAGING_CHUNK  # through the staging buffers, not the small-copy scratch
    for round_ in range(2):
        executor.set_context(executor.cuDevicePrimaryCtxRetain(0))
        base = executor.cuMemAlloc(size)
        pattern = bytes([round_ + 1]) * STAGING_CHUNK
        executor.copy_to_device(
            base, size, None, lambda view, p=pattern: view.__setitem__(slice(None), p[: len(view)])
        )
        back = bytearray()
        executor.copy_from_device(base, size, None, back.extend)
        assert bytes(back) == pattern * 3
        executor.cuMemFree(base)
        executor.cuDevicePrimaryCtxRelease(0)  # the last reference: the context ends
    executor.end_thread()
