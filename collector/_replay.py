"""Replay recorded telemetry as a live source: the rows come back stamped now, with source='replay'.

The recording is any telemetry directory (from gpustat-collect, an import, another host). Rows are
re-emitted at the pace they were recorded (``speed`` times faster if asked), shifted so the first
recorded sample lands on the first tick. The ``simulated`` flag of the original rows is kept: a
replayed simulation is still a simulation.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from collector._errors import InputError
from collector._source import Tick
from collector._types import GpuInfo
from collector.schema import GPU_SAMPLES, PROCESS_SAMPLES, Table

KIND = "replay"


def _load(root: Path, table: Table, host: str | None) -> pa.Table | None:
    folder = root / table.name
    if not folder.is_dir() or not any(folder.rglob("*.parquet")):
        return None
    # Partition values stay strings: a host named "007" must not become the integer 7.
    partitioning = ds.partitioning(pa.schema([("date", pa.string()), ("host", pa.string())]), flavor="hive")
    dataset = ds.dataset(folder, format="parquet", partitioning=partitioning, exclude_invalid_files=True)
    data = dataset.to_table()
    if host is not None and "host" in data.column_names:
        data = data.filter(pc.equal(pc.cast(data.column("host"), pa.string()), host))
    return data.sort_by("ts")


class ReplaySource:
    kind = KIND

    def __init__(self, root: str | Path, *, speed: float = 1.0, host: str | None = None):
        root = Path(root)
        if not root.is_dir():
            raise InputError(f"replay directory not found: {root}", "pass a telemetry directory to --replay")
        if speed <= 0:
            raise InputError(
                f"replay speed must be positive, not {speed}", "use --replay-speed 1 for real time"
            )
        gpus = _load(root, GPU_SAMPLES, host)
        if gpus is None or gpus.num_rows == 0:
            raise InputError(
                f"no gpu_samples to replay under {root}" + (f" for host {host}" if host else ""),
                "record some first: gpustat-collect --out DIR",
            )
        hosts = (
            sorted(set(pc.cast(gpus.column("host"), pa.string()).to_pylist()))
            if "host" in gpus.column_names
            else []
        )
        if host is None and len(hosts) > 1:
            raise InputError(
                f"the recording under {root} holds several hosts ({', '.join(hosts)})",
                "pick one with --replay-host NAME",
            )
        self._speed = speed
        self._tables = {"gpu": gpus, "process": _load(root, PROCESS_SAMPLES, host)}
        self._ts = {k: _micros(t) for k, t in self._tables.items() if t is not None}
        self._cursor = dict.fromkeys(self._ts, 0)
        self._t0 = int(self._ts["gpu"][0])
        self._start_us: int | None = None
        self.simulated = (
            bool(pc.any(gpus.column("simulated")).as_py()) if "simulated" in gpus.column_names else False
        )
        self._inventory = _inventory_of(gpus)

    def inventory(self) -> list[GpuInfo]:
        return list(self._inventory)

    @property
    def exhausted(self) -> bool:
        return all(self._cursor[k] >= len(ts) for k, ts in self._ts.items())

    def sample(self, now: dt.datetime) -> Tick:
        now_us = int(now.timestamp() * 1e6)
        if self._start_us is None:
            self._start_us = now_us
        cutoff = self._t0 + int((now_us - self._start_us) * self._speed)
        tick = Tick()
        for key, out, table in (
            ("gpu", tick.gpu_rows, GPU_SAMPLES),
            ("process", tick.process_rows, PROCESS_SAMPLES),
        ):
            if key not in self._ts:
                continue
            start = self._cursor[key]
            stop = int(np.searchsorted(self._ts[key], cutoff, side="right"))
            if stop <= start:
                continue
            self._cursor[key] = stop
            rows = self._tables[key].slice(start, stop - start).to_pylist()
            for row, orig in zip(rows, self._ts[key][start:stop], strict=True):
                shifted = self._start_us + int((int(orig) - self._t0) / self._speed)
                out.append(
                    {c: row.get(c) for c in table.column_names}
                    | {"ts": dt.datetime.fromtimestamp(shifted / 1e6, dt.UTC), "source": KIND}
                )
        return tick

    def drain(self) -> Tick:
        return Tick()  # every tick's rows leave with the tick

    def close(self) -> None:
        pass


def _micros(table: pa.Table) -> np.ndarray:
    ts = table.column("ts").cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
    return ts.to_numpy()


def _inventory_of(gpus: pa.Table) -> list[GpuInfo]:
    latest: dict[int, dict] = {}
    cols = [c for c in ("gpu_index", "gpu_uuid", "gpu_name", "mem_total_bytes") if c in gpus.column_names]
    for row in gpus.select(cols).to_pylist():
        latest[row["gpu_index"]] = row
    return [
        GpuInfo(
            index=int(idx),
            uuid=row.get("gpu_uuid") or f"GPU-index-{idx}",
            name=row.get("gpu_name") or "unknown",
            mem_total_bytes=int(row.get("mem_total_bytes") or 0),
            compute_capability=(0, 0),
            driver_version="replay",
            cuda_version="replay",
        )
        for idx, row in sorted(latest.items())
    ]
