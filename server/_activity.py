"""Did a lease's GPUs do work? The idle-reclaim probes, one per GPU source (a seam for tests).

- ``NvmlActivity`` (real GPUs): a local lease is busy when one of its processes (or their children)
  had a kernel running on a GPU within the last ``window_s`` (``collector.process_activity``, the
  driver's per-process utilization). Where the driver cannot say (``sm_util`` None: MIG, old GPUs) a
  process that holds GPU memory counts as busy: better to keep an idle lease than reclaim a busy one.
- ``SimulatedActivity`` (simulated GPUs, labelled as such): no GPU exists, so CPU time used by the
  lease's processes stands in for GPU work. It makes idle reclaim testable end to end without GPUs.

Remote leases are measured from their worker's last call (``server._app``), not here.
"""

from __future__ import annotations

import logging

from server._procs import cpu_seconds, with_descendants

log = logging.getLogger("gpupool.server")


class NvmlActivity:
    def __init__(self, window_s: float = 5.0):
        self.window_s = window_s

    def busy_leases(self, leases: list[dict], now: float) -> dict[str, float]:
        from collector import process_activity

        wanted = {lease["id"]: with_descendants(lease["pids"]) for lease in leases if lease["pids"]}
        gpus = sorted({g for lease in leases if lease["id"] in wanted for g in lease["gpus"]})
        busy: set[int] = set()
        mps_busy: set[int] = set()  # GPUs whose MPS server did work
        for index in gpus:
            try:
                procs = process_activity(index, window_s=self.window_s)
            except Exception as exc:  # a lost GPU or NVML hiccup: no evidence of work this round
                log.warning("activity probe on GPU %d failed: %s", index, exc)
                continue
            working = {p.pid for p in procs if p.sm_util is None or p.sm_util > 0}
            busy |= working
            # Under MPS the driver may book the work of MPS clients to the MPS server process: when it
            # is busy, every lease with live processes on that GPU counts as busy (no wrongful reclaim).
            if any(_is_mps_server(pid) for pid in working):
                mps_busy.add(index)
        gpus_of = {lease["id"]: set(lease["gpus"]) for lease in leases}
        return {lid: now for lid, pids in wanted.items() if pids & busy or (pids and gpus_of[lid] & mps_busy)}


def _is_mps_server(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).name().startswith("nvidia-cuda-mps")
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


class SimulatedActivity:
    """Busy = the lease's processes used at least ``min_cpu_share`` of a core since the last look.

    A share, not an amount, so a probe interval of any length means the same. The lease's processes
    include gpuattach itself, whose upkeep (heartbeats, the NVML view fetched every second) was measured
    at 4-6 % of a core on a 2-core machine, each wake of a cold Python costing 10-40 ms; 20 % stays well
    above that while a busy loop starved by a loaded machine still counts as work.
    """

    def __init__(self, min_cpu_share: float = 0.20):
        self.min_cpu_share = min_cpu_share
        self._last: dict[str, tuple[float, float]] = {}  # lease id -> (wall time, cpu seconds)

    def busy_leases(self, leases: list[dict], now: float) -> dict[str, float]:
        out = {}
        seen = set()
        for lease in leases:
            if not lease["pids"]:
                continue
            lid = lease["id"]
            seen.add(lid)
            used = cpu_seconds(with_descendants(lease["pids"]))
            before = self._last.get(lid)
            self._last[lid] = (now, used)
            if (
                before is not None
                and now > before[0]
                and (used - before[1]) / (now - before[0]) >= self.min_cpu_share
            ):
                out[lid] = now
        for lid in set(self._last) - seen:
            del self._last[lid]
        return out
