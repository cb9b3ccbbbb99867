"""Deterministic telemetry written with pyarrow and the schema, for the console and analytics.live tests.

Not a test module of its own: the name only keeps it beside the tests that import it.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from collector.schema import GPU_SAMPLES, POOL_EVENTS, PROCESS_SAMPLES, SCHEMA_VERSION, Table

# Fixed "now" of the constructed fleet: snapshots and assertions never depend on the clock.
T0 = datetime(2026, 3, 2, 12, 0, 0, tzinfo=UTC)
GIB = 1 << 30


def write_segment(root: Path, table: Table, rows: list[dict], name: str = "seg-0001") -> None:
    """Write rows as one segment per (date, host) under the hive layout the collector uses."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["ts"].date().isoformat(), row["host"]), []).append(row)
    for (date, host), part in groups.items():
        full = [
            {
                **{c: None for c in table.column_names},
                "source": "simulated",
                "simulated": True,
                "schema_version": SCHEMA_VERSION,
                **{k: v for k, v in r.items() if k != "host"},
            }
            for r in part
        ]
        data = pa.Table.from_pylist(full, schema=table.arrow_schema)
        folder = root / table.name / f"date={date}" / f"host={host}"
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(data, folder / f"{name}.parquet")


def gpu_row(host: str, index: int, ts: datetime, util: float, **extra) -> dict:
    row = {
        "host": host,
        "ts": ts,
        "gpu_index": index,
        "gpu_uuid": f"GPU-{host}-{index}",
        "gpu_name": "NVIDIA H100 80GB HBM3",
        "state": "ok",
        "util_gpu_mean": util,
        "util_gpu_max": util,
        "util_mem_mean": util / 2,
        "util_mem_max": util / 2,
        "mem_used_bytes": int(util * 80 * GIB),
        "mem_total_bytes": 80 * GIB,
        "power_w": 70.0 + 630.0 * util,
        "temperature_c": 30.0 + 40.0 * util,
        "sm_clock_hz": 1.98e9,
        "sm_activity": util * 0.6,
        "sm_occupancy": util * 0.3,
        "tensor_activity": util * 0.2,
        "dram_bw_util": util * 0.4,
    }
    row.update(extra)
    return row


def proc_row(host: str, index: int, ts: datetime, pid: int, user: str, mem_gib: float, **extra) -> dict:
    row = {
        "host": host,
        "ts": ts,
        "gpu_index": index,
        "gpu_uuid": f"GPU-{host}-{index}",
        "pid": pid,
        "process_name": "python3",
        "user": user,
        "container_id": None,
        "mem_used_bytes": int(mem_gib * GIB),
        "sm_util": 0.5,
    }
    row.update(extra)
    return row


def write_fleet(root: Path, *, now: datetime = T0, minutes: int = 10, step_s: int = 10) -> Path:
    """Two hosts (gpu-a: 2 GPUs, gpu-b: 1 GPU) with `minutes` of samples ending at `now`.

    gpu-a/0 ramps up like a training job, gpu-a/1 sits idle while holding memory, gpu-b/0 is busy.
    Processes: alice trains on gpu-a/0 (in a container), bob holds gpu-a/1 idle, carol on gpu-b/0.
    """
    gpus, procs = [], []
    ticks = minutes * 60 // step_s
    for k in range(ticks + 1):
        ts = now - timedelta(seconds=step_s * (ticks - k))
        ramp = k / ticks
        gpus.append(gpu_row("gpu-a", 0, ts, round(0.1 + 0.85 * ramp, 3)))
        gpus.append(gpu_row("gpu-a", 1, ts, 0.0, mem_used_bytes=30 * GIB))
        gpus.append(gpu_row("gpu-b", 0, ts, round(0.6 + 0.3 * math.sin(k / 3), 3)))
        procs.append(proc_row("gpu-a", 0, ts, 4242, "alice", 60, container_id="c0ffee123456"))
        procs.append(proc_row("gpu-a", 0, ts, 4243, "alice", 2, process_name="nccl-helper"))
        procs.append(proc_row("gpu-a", 1, ts, 5151, "bob", 30, process_name="jupyter", sm_util=0.0))
        procs.append(proc_row("gpu-b", 0, ts, 777, "carol", 40))
    write_segment(root, GPU_SAMPLES, gpus)
    write_segment(root, PROCESS_SAMPLES, procs)
    write_segment(root, POOL_EVENTS, pool_events(now))
    return root


def pool_events(now: datetime) -> list[dict]:
    """gpu-a's server: alice held 2 x 0.25 for 8 minutes and released; bob's 0.5 was reclaimed after
    5 idle minutes; carol was denied (over her limit)."""

    def event(
        kind: str, at_s: int, lease: str | None, client: str, gpu: int | None, frac: float | None, **kw
    ):
        return {
            "host": "gpu-a",
            "ts": now - timedelta(seconds=at_s),
            "event": kind,
            "lease_id": lease,
            "client": client,
            "gpu_index": gpu,
            "gpu_uuid": None if gpu is None else f"GPU-gpu-a-{gpu}",
            "fraction": frac,
            "mem_bytes": None if frac is None else int(frac * 80 * GIB),
            **kw,
        }

    return [
        event("grant", 540, "lease-a", "alice", 0, 0.25),
        event("grant", 540, "lease-a", "alice", 1, 0.25),
        event("grant", 400, "lease-b", "bob", 1, 0.5),
        event("deny", 300, None, "carol", None, None, reason="limit 0.5 reached: carol holds 0.5"),
        event("release", 60, "lease-a", "alice", 0, 0.25, duration_s=480.0, reason="released by alice"),
        event("release", 60, "lease-a", "alice", 1, 0.25, duration_s=480.0, reason="released by alice"),
        event("reclaim", 100, "lease-b", "bob", 1, 0.5, duration_s=300.0, reason="idle for 5m"),
    ]
