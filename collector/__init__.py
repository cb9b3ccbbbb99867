"""GPU telemetry: sample GPUs (NVML, a simulated fleet, replayed data) into Parquet segments.

The public face, loaded lazily so ``gpustat-collect --help`` does not import pyarrow or pynvml:

- ``TelemetryWriter(root, host, *, flush_interval_s=10.0)``: buffered, atomic Parquet segments, in a
  directory or an S3-compatible bucket (``root="s3://bucket/prefix"``, ``collector.location``).
- ``read_inventory() -> list[GpuInfo]`` and ``process_activity(gpu_index) -> list[ProcessActivity]``
  through NVML, raising ``NvmlUnavailable`` where NVML does not start.
- ``simulated_inventory(n)``: the GPUs of the simulated fleet, for machines without GPUs.
- ``NvmlSource``: one tick of this host's GPUs at a time (``.sample(now) -> Tick`` of schema rows), for
  a process that writes its own telemetry (the pool server); ``SimulatedFleet`` the simulated model.
- ``GPU_METRICS`` (name, telemetry column, help), ``COLLECTOR_UP``, ``GPU_LOST``: the Prometheus metrics
  the collector exports, named once (the console's ``--prometheus`` reads them back).
- ``parse_duration(value) -> seconds``: the one duration parser of every command and config file
  (``collector.durations``, also ``format_duration``, the one formatter).
- errors: ``CollectorError`` > ``NvmlUnavailable``, ``TelemetryWriteError``, ``InputError``, ``GpuLost``;
  ``collector.errors.GpupoolError`` is the base of every package's errors (title, hint, exit_code).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "TelemetryWriter": "collector.writer",
    "read_inventory": "collector._inventory",
    "process_activity": "collector._inventory",
    "simulated_inventory": "collector._simulated",
    "GpuInfo": "collector._types",
    "ProcessActivity": "collector._types",
    "CollectorError": "collector._errors",
    "NvmlUnavailable": "collector._errors",
    "TelemetryWriteError": "collector._errors",
    "InputError": "collector._errors",
    "GpuLost": "collector._errors",
    "parse_duration": "collector.durations",
    "GPU_METRICS": "collector._prometheus",
    "COLLECTOR_UP": "collector._prometheus",
    "GPU_LOST": "collector._prometheus",
    "NvmlSource": "collector._nvml_source",
    "SimulatedFleet": "collector._simulated",
}

__all__ = [
    "COLLECTOR_UP",
    "GPU_LOST",
    "GPU_METRICS",
    "CollectorError",
    "GpuInfo",
    "GpuLost",
    "InputError",
    "NvmlSource",
    "NvmlUnavailable",
    "ProcessActivity",
    "SimulatedFleet",
    "TelemetryWriteError",
    "TelemetryWriter",
    "parse_duration",
    "process_activity",
    "read_inventory",
    "simulated_inventory",
]

if TYPE_CHECKING:
    from collector._errors import CollectorError, GpuLost, InputError, NvmlUnavailable, TelemetryWriteError
    from collector._inventory import process_activity, read_inventory
    from collector._nvml_source import NvmlSource
    from collector._prometheus import COLLECTOR_UP, GPU_LOST, GPU_METRICS
    from collector._simulated import SimulatedFleet, simulated_inventory
    from collector._types import GpuInfo, ProcessActivity
    from collector.durations import parse_duration
    from collector.writer import TelemetryWriter


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'collector' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
