"""Small constructed telemetry for the analytics, report and notebook tests.

Rows are written exactly as the collector lays them out (``collector.schema``): one Parquet segment
per table, date and host under ``<dir>/<table>/date=.../host=.../``, with the schema version in the
footer. Columns a test does not give are null; ``source``/``simulated``/``schema_version`` default to
a real-looking replay row.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from collector.schema import METADATA_VERSION_KEY, SCHEMA_VERSION, TABLES

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)  # a Monday, 09:00 UTC
GIB = 1 << 30
_seq = itertools.count()


def write_rows(root: Path, table: str, rows: list[dict], version: int = SCHEMA_VERSION) -> None:
    """Write ``rows`` (dicts with ``host`` and ``ts``) as segments of ``table`` under ``root``."""
    spec = TABLES[table]
    schema = spec.arrow_schema
    if version != SCHEMA_VERSION:
        schema = schema.with_metadata({**schema.metadata, METADATA_VERSION_KEY: str(version).encode()})
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for row in rows:
        date = row.get("_date") or row["ts"].astimezone(UTC).date()  # "_date": a segment of another day
        groups[(date.isoformat(), row["host"])].append(row)
    defaults = {"source": "replay", "simulated": False, "schema_version": version, "state": "ok"}
    for (date, host), group in groups.items():
        columns = {
            c.name: [r.get(c.name, defaults.get(c.name) if c.name in defaults else None) for r in group]
            for c in spec.columns
        }
        if table != "gpu_samples":
            columns.pop("state", None)
        folder = root / table / f"date={date}" / f"host={host}"
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table(columns, schema=schema), folder / f"seg-{next(_seq):05d}.parquet")


def gpu_rows(
    host: str,
    gpu_index: int,
    utils: list[float | None],
    *,
    tick_s: float = 1.0,
    start: datetime = T0,
    mem_used: list[int] | int = 0,
    mem_total: int = 80 * GIB,
    sm: list[float | None] | None = None,
    simulated: bool = False,
    **extra,
) -> list[dict]:
    """One GPU's samples, one per tick starting at ``start``."""
    mems = mem_used if isinstance(mem_used, list) else [mem_used] * len(utils)
    sms = sm if sm is not None else [None] * len(utils)
    return [
        {
            "host": host,
            "ts": start + timedelta(seconds=i * tick_s),
            "gpu_index": gpu_index,
            "gpu_uuid": f"GPU-{host}-{gpu_index}",
            "gpu_name": "NVIDIA H100 80GB HBM3",
            "util_gpu_mean": u,
            "util_gpu_max": u,
            "mem_used_bytes": m,
            "mem_total_bytes": mem_total,
            "sm_activity": a,
            "simulated": simulated,
            "source": "simulated" if simulated else "replay",
            **extra,
        }
        for i, (u, m, a) in enumerate(zip(utils, mems, sms, strict=True))
    ]


def process_rows(
    host: str,
    gpu_index: int,
    pid: int,
    ticks: range,
    *,
    mem: int,
    sm_util: float | None,
    user: str = "alice",
    name: str = "python",
    container: str | None = None,
    tick_s: float = 1.0,
    start: datetime = T0,
) -> list[dict]:
    """One process present on one GPU at the given tick numbers."""
    return [
        {
            "host": host,
            "ts": start + timedelta(seconds=i * tick_s),
            "gpu_index": gpu_index,
            "gpu_uuid": f"GPU-{host}-{gpu_index}",
            "pid": pid,
            "process_name": name,
            "user": user,
            "container_id": container,
            "mem_used_bytes": mem,
            "sm_util": sm_util,
        }
        for i in ticks
    ]


def generated_fleet(root: Path, *, days: int = 2, hosts: int = 2, gpus_per_host: int = 4) -> Path:
    """A small simulated fleet from bench/gen_telemetry.py (1-minute ticks, with process rows)."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "bench" / "gen_telemetry.py"
    spec = importlib.util.spec_from_file_location("gen_telemetry", path)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    gen.generate(
        root,
        days=days,
        hosts=hosts,
        gpus_per_host=gpus_per_host,
        interval_s=60.0,
        start=datetime(2026, 1, 5, tzinfo=UTC).date(),
        processes=True,
        progress=lambda msg: None,
    )
    return root
