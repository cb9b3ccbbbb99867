"""What the summary reads from each sample: the per-row columns and thresholds that the fleet
summary and the rollup build (``_rollup``) share, so that both compute a figure one way."""

from __future__ import annotations

from dataclasses import dataclass

HIST_RESOLUTION = 1000  # bins per unit ratio: 0.001 steps
GIB = 1 << 30


@dataclass(frozen=True)
class SummaryOptions:
    """Thresholds that decide what counts as idle. Ratios 0-1, bytes."""

    idle_below: float = 0.05  # utilization.gpu under this is idle
    held_mem_bytes: int = 1 * GIB  # an idle GPU with at least this much memory in use is "held but idle"


DEFAULT_OPTIONS = SummaryOptions()


def idle_bin(idle_below: float) -> float:
    """The bound on a sample's utilization bin (``ub``, 0.001 steps) under which it is idle: idle and
    held-but-idle both test the binned value against it, so held-but-idle is always part of idle."""
    return idle_below * HIST_RESOLUTION - 1e-9


# Computed per row before the window (they take parameters: ``idle_bin``, the held bytes): histogram
# bins and the held-but-idle flag.
SAMPLE_COLUMNS = f"""
    host, gpu_uuid, ts, mem_used_bytes, mem_total_bytes,
    round(util_gpu_mean * {HIST_RESOLUTION})::INTEGER AS ub, round(sm_activity * {HIST_RESOLUTION})::INTEGER AS ab,
    (coalesce(round(util_gpu_mean * {HIST_RESOLUTION}) < ? AND mem_used_bytes >= ?, false)::INTEGER
     + 2 * (sm_activity IS NOT NULL)::INTEGER + 4 * coalesce(state = 'lost', false)::INTEGER
     + 8 * coalesce(simulated, false)::INTEGER)::UTINYINT AS flags
"""
HELD, HAS_GPM, LOST, SIMULATED = 1, 2, 4, 8  # bits of ``flags``
