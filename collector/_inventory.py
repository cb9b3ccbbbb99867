"""This host's GPUs and the processes on them, for callers other than the collector loop.

The pool server uses these to build its inventory and to reclaim idle leases. They share the
collector's NVML session (see ``collector._nvml``).
"""

from __future__ import annotations

import threading

from collector._errors import GpuLost, NvmlUnavailable
from collector._types import GpuInfo, ProcessActivity

_backend_lock = threading.Lock()
_backend = None


def _nvml():
    """The process-wide NVML backend, started on first use (raises NvmlUnavailable)."""
    global _backend
    with _backend_lock:
        if _backend is None:
            from collector._nvml import NvmlBackend

            backend = NvmlBackend()
            backend.start()
            _backend = backend
        return _backend


def inventory_from(backend) -> list[GpuInfo]:
    """GpuInfo for every GPU a started backend sees (a GPU that is lost is left out)."""
    driver, cuda = backend.driver_version(), backend.cuda_version()
    gpus = []
    for index in range(backend.device_count()):
        try:
            memory = backend.memory(index)
            gpus.append(
                GpuInfo(
                    index=index,
                    uuid=backend.uuid(index) or f"GPU-index-{index}",
                    name=backend.name(index) or "unknown",
                    mem_total_bytes=memory[1] if memory else 0,
                    compute_capability=backend.compute_capability(index) or (0, 0),
                    driver_version=driver,
                    cuda_version=cuda,
                    pci_bus_id=getattr(backend, "pci_bus_id", lambda _: None)(index),
                    nvlinks=tuple(getattr(backend, "nvlinks", lambda _: ())(index)),
                )
            )
        except GpuLost:
            continue
    return gpus


def read_inventory() -> list[GpuInfo]:
    """The GPUs of this host through NVML; raises NvmlUnavailable (one-line message) without NVML."""
    gpus = inventory_from(_nvml())
    if not gpus:
        raise NvmlUnavailable("NVML started but sees no GPU")
    return gpus


def clock_offset_us(backend, indexes, wall_us) -> int:
    """How far NVML's sample clock is behind the wall clock, in microseconds (~0 where it is epoch-based).

    NVML stamps samples with "CPU timestamps"; rather than rely on which clock that is, read the newest
    sample of the driver's utilization ring (refreshed every ~200 ms even when idle) and compare.
    """
    for index in indexes:
        try:
            samples = backend.utilization_samples(index, "gpu", 0)
        except GpuLost:
            continue
        if samples:
            return wall_us() - max(ts for ts, _ in samples)
    return 0


def ring_span_s(backend, indexes) -> float | None:
    """How many seconds of history the driver's utilization ring holds (14 s on an H200), or None."""
    for index in indexes:
        try:
            samples = backend.utilization_samples(index, "gpu", 0)
        except GpuLost:
            continue
        if samples and len(samples) > 1:
            return (max(ts for ts, _ in samples) - min(ts for ts, _ in samples)) / 1e6
    return None


def activity_from(backend, gpu_index: int, window_s: float) -> list[ProcessActivity]:
    from collector._source import now_us

    procs = backend.processes(gpu_index) or []
    nvml_now = now_us() - clock_offset_us(backend, [gpu_index], now_us)
    util = backend.process_utilization(gpu_index, nvml_now - int(window_s * 1e6))
    per_pid: dict[int, list[float]] = {}
    for pid, _ts, sm_percent in util or []:
        per_pid.setdefault(pid, []).append(sm_percent / 100.0)
    out = []
    for pid, mem in procs:
        if util is None:
            sm = None  # the driver does not report per-process utilization here (MIG, old GPUs)
        else:
            shares = per_pid.get(pid)
            sm = sum(shares) / len(shares) if shares else 0.0
        out.append(ProcessActivity(pid=pid, mem_used_bytes=mem, sm_util=sm))
    return out


def process_activity(gpu_index: int, *, window_s: float = 5.0) -> list[ProcessActivity]:
    """Processes holding memory on GPU ``gpu_index`` and their busy share over the last ``window_s``.

    Raises NvmlUnavailable without NVML; a GPU that is lost raises ``collector.GpuLost``.
    """
    return activity_from(_nvml(), gpu_index, window_s)
