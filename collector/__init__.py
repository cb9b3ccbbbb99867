"""GPU telemetry: sample GPUs (NVML, a simulated fleet, replayed data) into Parquet segments.

The public face, loaded lazily so ``gpustat-collect --help`` does not import pyarrow or pynvml:

- ``TelemetryWriter(root, host, *, flush_interval_s=10.0)``: buffered, atomic Parquet segments, in a
  directory or an S3-compatible bucket (``root="s3://bucket/prefix"``, ``collector.location``).
- ``read_inventory() -> list[GpuInfo]`` and ``process_activity(gpu_index) -> list[ProcessActivity]``
  through NVML, raising ``NvmlUnavailable`` where NVML does not start; a ``GpuInfo``'s ``nvlinks``
  (``NvLink``: link, remote PCI bus id, version) are its active NVLinks.
- ``simulated_inventory(n)``: the GPUs of the simulated fleet, for machines without GPUs.
- ``NvmlSource``: one tick of this host's GPUs at a time (``.sample(now) -> Tick`` of schema rows), for
  a process that writes its own telemetry (the pool server); ``SimulatedFleet`` the simulated model.
- ``run(source, writer, RunOptions(interval_s), stop=…, on_tick=…, on_error=…)``: the one sampling
  loop (``gpustat-collect`` and the pool server's sampler).
- The write side of telemetry beyond raw segments: ``build_rollups(root) -> RollupResult`` and
  ``expire_raw(root, keep_s) -> ExpireResult`` (``collector.rollups``), and ``RollupKeeper(root, host,
  RollupOptions(every_s, keep_raw_s))``, a thread that keeps them up to date. ``collector.reader``
  opens telemetry as DuckDB views: the build and ``analytics`` both read through it.
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
    "NvLink": "collector._types",
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
    "run": "collector._run",
    "RunOptions": "collector._run",
    "RollupKeeper": "collector._rollup_keeper",
    "RollupOptions": "collector._rollup_keeper",
    "build_rollups": "collector.rollups",
    "expire_raw": "collector.rollups",
    "RollupResult": "collector.rollups",
    "ExpireResult": "collector.rollups",
}

__all__ = [
    "COLLECTOR_UP",
    "GPU_LOST",
    "GPU_METRICS",
    "CollectorError",
    "ExpireResult",
    "GpuInfo",
    "GpuLost",
    "InputError",
    "NvLink",
    "NvmlSource",
    "NvmlUnavailable",
    "ProcessActivity",
    "RollupKeeper",
    "RollupOptions",
    "RollupResult",
    "RunOptions",
    "SimulatedFleet",
    "TelemetryWriteError",
    "TelemetryWriter",
    "build_rollups",
    "expire_raw",
    "parse_duration",
    "process_activity",
    "read_inventory",
    "run",
    "simulated_inventory",
]

if TYPE_CHECKING:
    from collector._errors import CollectorError, GpuLost, InputError, NvmlUnavailable, TelemetryWriteError
    from collector._inventory import process_activity, read_inventory
    from collector._nvml_source import NvmlSource
    from collector._prometheus import COLLECTOR_UP, GPU_LOST, GPU_METRICS
    from collector._rollup_keeper import RollupKeeper, RollupOptions
    from collector._run import RunOptions, run
    from collector._simulated import SimulatedFleet, simulated_inventory
    from collector._types import GpuInfo, NvLink, ProcessActivity
    from collector.durations import parse_duration
    from collector.rollups import ExpireResult, RollupResult, build_rollups, expire_raw
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
