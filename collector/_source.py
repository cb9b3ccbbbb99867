"""The seam between the collector loop and where samples come from.

A source is anything with this shape: NVML (``_nvml_source.NvmlSource``), the simulated fleet
(``_simulated_source.SimulatedSource``) and a replayed recording (``_replay.ReplaySource``). The loop
asks it for one tick at a time and hands the rows to the writer; rows use the column names of
``collector.schema`` (``date``/``host``/``schema_version`` are the writer's business).
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field
from typing import Protocol

from collector._types import GpuInfo


@dataclass
class Tick:
    """What one sampling round produced: rows for gpu_samples and process_samples."""

    gpu_rows: list[dict] = field(default_factory=list)
    process_rows: list[dict] = field(default_factory=list)


class Source(Protocol):
    kind: str  # the value of the rows' ``source`` column
    simulated: bool  # True only for the simulated fleet (or a replay of one)

    def inventory(self) -> list[GpuInfo]:
        """The GPUs this source reports on."""
        ...

    def sample(self, now: dt.datetime) -> Tick:
        """One round of samples, stamped ``now`` (UTC): the end of the interval they summarise."""
        ...

    def drain(self) -> Tick:
        """Rows the source still holds back (NVML batches ring reads), handed out when the loop stops."""
        ...

    @property
    def exhausted(self) -> bool:
        """True once a finite source (a replay) has nothing more to give."""
        ...

    def close(self) -> None: ...


def now_us() -> int:
    """Wall-clock time in microseconds: the clock NVML stamps its samples with."""
    return time.time_ns() // 1000
