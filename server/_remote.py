"""The one place the control plane meets remote execution (``server/worker.py``, its own component).

The contract the worker module provides:

    start_worker(lease_id: str, devices: list[WorkerDevice], *, bind_host: str, env: dict[str, str])
        -> WorkerHandle
    WorkerDevice(index: int, uuid: str, mem_limit_bytes: int)   # index: the physical NVML index
    WorkerHandle: .host .port .secret .pid, .last_activity() -> time.time() of its last call,
                  .alive() -> bool, .stop()

``env`` carries the MPS client settings of the lease when the server runs MPS (pipe directory,
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` keyed 0..n-1, since the worker makes the lease's GPUs its
``CUDA_VISIBLE_DEVICES`` in partition order; ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``). The import is
lazy and guarded: a server without the worker module, or whose worker fails to start, answers 503
with the reason and keeps serving leases for local runs.

Simulated GPUs refuse remote leases, except when ``GPUPOOL_WORKER_EXECUTOR=host`` is set for the
server: the worker then serves CUDA calls from host memory (the remote-execution component's test
executor), so the whole ``gpuattach run`` path can be tested without a GPU. Such leases still say
``"simulated": true``.
"""

from __future__ import annotations

import logging
import os

from server._errors import RemoteUnavailable
from server._inventory import MIB

log = logging.getLogger("gpupool.server")


def worker_env(lease: dict, mps) -> dict[str, str]:
    if mps is None:
        return {}
    env = dict(mps.client_env())
    env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(
        f"{i}={p['mem_bytes'] // MIB}M" for i, p in enumerate(lease["partitions"])
    )
    shares = {p["sm_share"] for p in lease["partitions"]} - {None}
    if shares:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, round(shares.pop() * 100)))
    return env


def remote_refusal(simulated: bool) -> RemoteUnavailable | None:
    """Why this server cannot run remote leases at all, or None."""
    if simulated and os.environ.get("GPUPOOL_WORKER_EXECUTOR") != "host":
        return RemoteUnavailable(
            "remote execution unavailable: this server's GPUs are simulated (control plane only)",
            "use a server with real GPUs, or gpuattach run --local for control-plane tests",
        )
    return None


def start_remote_worker(lease: dict, *, simulated: bool, bind_host: str, mps=None):
    """Start the lease's worker; raises RemoteUnavailable with a one-line reason."""
    refusal = remote_refusal(simulated)
    if refusal is not None:
        raise refusal
    try:
        from server import worker
    except ImportError as exc:
        raise RemoteUnavailable(
            f"remote execution unavailable: the worker module cannot be loaded ({exc})",
            "install gpupool with the server extra on this host",
        ) from None
    devices = [
        worker.WorkerDevice(p["gpu_index"], p["gpu_uuid"], p["mem_bytes"]) for p in lease["partitions"]
    ]
    try:
        return worker.start_worker(lease["id"], devices, bind_host=bind_host, env=worker_env(lease, mps))
    except Exception as exc:  # the worker's own failure, whatever it is, is the lease's 503
        log.exception("worker for %s failed to start", lease["id"])
        raise RemoteUnavailable(
            f"remote execution unavailable: the worker did not start ({exc})", "see the server log"
        ) from None
