"""Generate a large, labelled-simulated telemetry directory fast, for the analytics benchmark and demos.

    python bench/gen_telemetry.py --out /tmp/gpupool-month --days 30 --hosts 8 --gpus-per-host 8

writes one month of 64 GPUs at 1 Hz (~166 M gpu_samples rows, plus process rows with --processes) in
the collector's layout (``<out>/<table>/date=.../host=.../*.parquet``, ``collector.schema``). Every row
says ``simulated = true`` and ``source = 'simulated'``. Keep the output out of git (write under /tmp).

The fleet of issue 14 (512 GPUs x 90 days, rollups plus the last 14 days raw), in a time one can wait for:

    python bench/gen_telemetry.py --out /tmp/gpupool-512 --days 90 --hosts 1 --keep-raw 14 --replicate-hosts 64

generates one host of 8 GPUs day by day, brings its rollups up to date after each day and expires
its raw days older than 14 (the real ``build_rollups`` and ``expire_raw``, as a collector with
``--keep-raw 14d`` would), then hard-links that host's files under 63 more host names: 64 hosts
whose samples are copies of one another's. Queries cost the same as over 64 different hosts (DuckDB
reads every file); the build is timed for the one host.

Vectorised: each GPU's month is planned at minute resolution first (jobs, sessions, a daily and
weekly rhythm), then each (day, host) segment is expanded to ticks with numpy and written as one
Parquet file. Four kinds of GPU make the report worth reading:

- train:    long jobs (2-10 h) near 100 % utilization.gpu but 35-60 % SM activity, 50-75 GiB;
- infer:    a server holding 20 GiB all the time, busy with office hours on weekdays;
- notebook: interactive sessions on weekdays holding 8-30 GiB, idle most minutes (held but idle);
- idle:     nothing, but for a rare short job.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from collector.schema import GPU_SAMPLES, PROCESS_SAMPLES, SCHEMA_VERSION

GIB = 1 << 30
MEM_TOTAL = 80 * GIB
KINDS = ("train", "infer", "notebook", "idle")
USERS = {
    "train": ("alice", "bob", "chen"),
    "infer": ("svc-inference",),
    "notebook": ("dana", "eli", "farah", "gus"),
    "idle": ("bob", "dana"),
}
NAMES = {"train": "torchrun", "infer": "tritonserver", "notebook": "python3", "idle": "python3"}


def plan_gpu(rng: np.random.Generator, kind: str, minutes: int, start: datetime) -> dict[str, np.ndarray]:
    """Per-minute plan of one GPU: job id (-1: none), memory, utilization and SM activity levels."""
    job = np.full(minutes, -1, np.int32)
    mem = np.zeros(minutes, np.int64)
    util = np.zeros(minutes, np.float32)
    sm = np.zeros(minutes, np.float32)
    mins = np.arange(minutes)
    when = start + timedelta(minutes=0)
    hour = (mins // 60 + when.hour) % 24
    weekday = ((mins // 1440) + when.weekday()) % 7 < 5
    office = weekday & (hour >= 8) & (hour < 19)
    t, jid = 0, 0
    if kind == "train":
        while t < minutes:
            t += int(rng.integers(30, 360))
            length = int(rng.integers(120, 600))
            job[t : t + length] = jid
            mem[t : t + length] = int(rng.integers(50, 76)) * GIB
            util[t : t + length] = rng.uniform(0.85, 1.0)
            sm[t : t + length] = rng.uniform(0.35, 0.6)
            t, jid = t + length, jid + 1
    elif kind == "infer":
        job[:] = 0
        mem[:] = 20 * GIB
        level = np.where(office, 0.55, 0.08)
        util[:] = level * rng.uniform(0.7, 1.3, minutes)
        sm[:] = util * 0.3
    elif kind == "notebook":
        day_starts = np.flatnonzero(office & (mins % 60 == 0) & (hour % 3 == 0))
        for s in day_starts:
            if rng.random() < 0.6:
                length = int(rng.integers(60, 300))
                job[s : s + length] = jid
                mem[s : s + length] = int(rng.integers(8, 31)) * GIB
                bursts = rng.random(min(length, minutes - s)) < 0.06
                util[s : s + length] = np.where(bursts, rng.uniform(0.5, 0.9), 0.0)
                sm[s : s + length] = util[s : s + length] * 0.2
                jid += 1
    else:  # idle
        for s in np.flatnonzero(rng.random(minutes) < 0.0005):
            job[s : s + 45] = jid
            mem[s : s + 45] = 6 * GIB
            util[s : s + 45] = 0.7
            sm[s : s + 45] = 0.25
            jid += 1
    return {"job": job, "mem": mem, "util": util, "sm": sm}


def _strings(values: list[str], idx: np.ndarray) -> pa.Array:
    return pa.DictionaryArray.from_arrays(pa.array(idx, pa.int32()), pa.array(values)).cast(pa.string())


def _quantize(x: np.ndarray) -> np.ndarray:
    # NVML reports whole percents; a tick's mean over five 200 ms samples moves in 0.2 % steps.
    return (np.clip(np.round(x * 500), 0, 500) / 500).astype(np.float32)


def segment(
    rng,
    host: str,
    gpus: list[dict],
    plans: list[dict],
    day_index: int,
    day: date,
    interval_s: float,
    processes: bool,
) -> tuple[pa.Table, pa.Table | None]:
    """The gpu_samples (and process_samples) of one host for one day."""
    ticks = round(86400 / interval_s)
    per_min = 60 / interval_s
    day_us = int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp() * 1e6)
    ts_one = day_us + (np.arange(1, ticks + 1) * interval_s * 1e6).astype(np.int64)
    minute = day_index * 1440 + (np.arange(ticks) / per_min).astype(np.int64)
    g_cols: dict[str, list] = {k: [] for k in GPU_SAMPLES.column_names}
    p_cols: dict[str, list] = {k: [] for k in PROCESS_SAMPLES.column_names}
    for gpu, plan in zip(gpus, plans, strict=True):
        job = plan["job"][minute]
        util = _quantize(plan["util"][minute] * rng.uniform(0.9, 1.1, ticks))
        busy = util > 0
        sm = np.where(busy, plan["sm"][minute] * rng.uniform(0.85, 1.15, ticks), 0).astype(np.float32)
        mem = plan["mem"][minute] + np.where(job >= 0, 512 << 20, 0)  # CUDA context on top
        g_cols["ts"].append(ts_one)
        g_cols["gpu_index"].append(np.full(ticks, gpu["index"], np.int16))
        g_cols["util_gpu_mean"].append(util)
        g_cols["util_gpu_max"].append(np.where(busy, np.minimum(util + 0.05, 1), 0).astype(np.float32))
        g_cols["util_mem_mean"].append((util * 0.4).astype(np.float32))
        g_cols["util_mem_max"].append((util * 0.5).astype(np.float32))
        g_cols["mem_used_bytes"].append(mem)
        g_cols["power_w"].append(
            np.round(70 + 600 * util * rng.uniform(0.95, 1.05, ticks)).astype(np.float32)
        )
        g_cols["temperature_c"].append(np.round(32 + 40 * util).astype(np.float32))
        g_cols["sm_clock_hz"].append(np.where(busy, 1.98e9, 3.45e8).astype(np.float32))
        g_cols["sm_activity"].append(sm)
        g_cols["sm_occupancy"].append((sm * 0.5).astype(np.float32))
        g_cols["tensor_activity"].append((sm * 0.6).astype(np.float32))
        g_cols["dram_bw_util"].append((sm * 0.4).astype(np.float32))
        if processes:
            alive = job >= 0
            n = int(alive.sum())
            kind = gpu["kind"]
            users = USERS[kind]
            p_cols["ts"].append(ts_one[alive])
            p_cols["gpu_index"].append(np.full(n, gpu["index"], np.int16))
            p_cols["pid"].append((10_000 + gpu["index"] * 100_000 + job[alive]).astype(np.int64))
            p_cols["user"].append(
                np.array([users[j % len(users)] for j in range(len(users))])[job[alive] % len(users)]
            )
            p_cols["process_name"].append(np.full(n, NAMES[kind]))
            p_cols["container_id"].append(np.full(n, f"ctr-{host}-{gpu['index']}" if kind == "infer" else ""))
            p_cols["mem_used_bytes"].append(mem[alive])
            p_cols["sm_util"].append(util[alive])
            p_cols["gpu_uuid"].append(np.full(n, gpu["uuid"]))
    n = ticks * len(gpus)
    uuids = [g["uuid"] for g in gpus]
    g_table = pa.table(
        {
            "ts": pa.array(np.concatenate(g_cols["ts"]), pa.timestamp("us", tz="UTC")),
            "gpu_index": np.concatenate(g_cols["gpu_index"]),
            "gpu_uuid": _strings(uuids, np.repeat(np.arange(len(gpus)), ticks)),
            "gpu_name": _strings(["NVIDIA H100 80GB HBM3"], np.zeros(n, np.int32)),
            "state": _strings(["ok"], np.zeros(n, np.int32)),
            **{
                k: np.concatenate(g_cols[k])
                for k in (
                    "util_gpu_mean",
                    "util_gpu_max",
                    "util_mem_mean",
                    "util_mem_max",
                    "mem_used_bytes",
                    "power_w",
                    "temperature_c",
                    "sm_clock_hz",
                    "sm_activity",
                    "sm_occupancy",
                    "tensor_activity",
                    "dram_bw_util",
                )
            },
            "mem_total_bytes": np.full(n, MEM_TOTAL, np.int64),
            "energy_j": pa.nulls(n, pa.float64()),
            "source": _strings(["simulated"], np.zeros(n, np.int32)),
            "simulated": np.ones(n, bool),
            "schema_version": np.full(n, SCHEMA_VERSION, np.int16),
        }
    ).select(GPU_SAMPLES.column_names)
    # In time order, as `gpustat-collect compact` leaves a day (and as the collector's segments are):
    # readers then skip row groups by time, not only whole days.
    g_table = g_table.cast(GPU_SAMPLES.arrow_schema).sort_by("ts")
    p_table = None
    if processes:
        m = sum(len(a) for a in p_cols["ts"])
        containers = np.concatenate(p_cols["container_id"])
        p_table = pa.table(
            {
                "ts": pa.array(np.concatenate(p_cols["ts"]), pa.timestamp("us", tz="UTC")),
                "gpu_index": np.concatenate(p_cols["gpu_index"]),
                "gpu_uuid": np.concatenate(p_cols["gpu_uuid"]),
                "pid": np.concatenate(p_cols["pid"]),
                "process_name": np.concatenate(p_cols["process_name"]),
                "user": np.concatenate(p_cols["user"]),
                "container_id": pa.array(containers, mask=containers == ""),
                "mem_used_bytes": np.concatenate(p_cols["mem_used_bytes"]),
                "sm_util": np.concatenate(p_cols["sm_util"]),
                "source": _strings(["simulated"], np.zeros(m, np.int32)),
                "simulated": np.ones(m, bool),
                "schema_version": np.full(m, SCHEMA_VERSION, np.int16),
            }
        ).cast(PROCESS_SAMPLES.arrow_schema)
    return g_table, p_table


def generate(
    out: Path,
    *,
    days: int,
    hosts: int,
    gpus_per_host: int,
    interval_s: float,
    start: date,
    processes: bool,
    seed: int = 7,
    progress=print,
    after_day=None,
) -> int:
    """Write the telemetry; returns the number of gpu_samples rows. ``after_day(day)`` runs once each
    day's segments are written (the rollup build and retention of ``--keep-raw``)."""
    rng = np.random.default_rng(seed)
    start_dt = datetime(start.year, start.month, start.day, tzinfo=UTC)
    fleet = []
    for h in range(hosts):
        host = f"gpu-node-{h + 1:02d}"
        gpus = []
        for i in range(gpus_per_host):
            kind = KINDS[(h * gpus_per_host + i) % len(KINDS)]
            gpus.append({"index": i, "uuid": f"GPU-sim-{h:02d}{i:02d}-0000-0000-000000000000", "kind": kind})
        plans = [plan_gpu(rng, g["kind"], days * 1440, start_dt) for g in gpus]
        fleet.append((host, gpus, plans))
    rows = 0
    t0 = time.monotonic()
    for d in range(days):
        day = start + timedelta(days=d)
        for host, gpus, plans in fleet:
            g_table, p_table = segment(rng, host, gpus, plans, d, day, interval_s, processes)
            for table, t in (("gpu_samples", g_table), ("process_samples", p_table)):
                if t is None or t.num_rows == 0:
                    continue
                folder = out / table / f"date={day.isoformat()}" / f"host={host}"
                folder.mkdir(parents=True, exist_ok=True)
                tmp = folder / "sim-000000.parquet.tmp"
                pq.write_table(t, tmp, compression="zstd", row_group_size=256 * 1024)
                tmp.rename(folder / "sim-000000.parquet")
            rows += g_table.num_rows
        if after_day is not None:
            after_day(day)
        progress(f"day {d + 1}/{days}: {rows:,} gpu rows, {time.monotonic() - t0:.0f} s")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--out", required=True, type=Path, help="telemetry directory to write (keep it out of git)"
    )
    ap.add_argument("--days", type=int, default=30, help="days of history (default 30)")
    ap.add_argument("--hosts", type=int, default=8, help="hosts (default 8)")
    ap.add_argument("--gpus-per-host", type=int, default=8, help="GPUs per host (default 8)")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between ticks (default 1)")
    ap.add_argument("--start", type=date.fromisoformat, default=date(2026, 1, 5), help="first day (a Monday)")
    ap.add_argument("--processes", action="store_true", help="also write process_samples")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--keep-raw",
        type=float,
        metavar="DAYS",
        help="as a collector with --keep-raw would: after each day, bring the rollups up to date "
        "(collector.build_rollups, incremental) and expire raw gpu_samples days older than DAYS "
        "(collector.expire_raw, 'now' being the end of the generated history)",
    )
    ap.add_argument(
        "--replicate-hosts",
        type=int,
        default=1,
        metavar="N",
        help="then copy every host's folders (hard links) as N times as many hosts: the same samples "
        "under other host names, a large fleet in seconds (the data is N copies: say so when you report it)",
    )
    args = ap.parse_args(argv)
    if args.out.exists() and any(args.out.iterdir()):
        print(f"error: {args.out} is not empty; give a new directory", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    after_day = None
    timings: list[float] = []
    if args.keep_raw is not None:
        from collector import build_rollups, expire_raw

        def after_day(day: date) -> None:
            t = time.monotonic()
            build_rollups(args.out)
            now = datetime(day.year, day.month, day.day, tzinfo=UTC) + timedelta(days=1)
            expire_raw(args.out, args.keep_raw * 86400, now=now)
            timings.append(time.monotonic() - t)

    rows = generate(
        args.out,
        days=args.days,
        hosts=args.hosts,
        gpus_per_host=args.gpus_per_host,
        interval_s=args.interval,
        start=args.start,
        processes=args.processes,
        seed=args.seed,
        progress=lambda m: print(m, file=sys.stderr),
        after_day=after_day,
    )
    print(f"wrote {rows:,} gpu_samples rows to {args.out} in {time.monotonic() - t0:.0f} s")
    if timings:
        print(
            f"rollups built and raw expired after each day: {sum(timings):.0f} s in all, "
            f"{max(timings):.1f} s for the slowest day"
        )
    if args.replicate_hosts > 1:
        copies = replicate_hosts(args.out, args.replicate_hosts)
        print(f"replicated every host {args.replicate_hosts} times: {copies:,} files hard-linked")
    return 0


def replicate_hosts(out: Path, factor: int) -> int:
    """Hard-link each ``host=H`` folder of every table as ``host=H-rK`` (K = 2..factor)."""
    import os

    copies = 0
    for folder in sorted(out.glob("*/date=*/host=*")):
        for k in range(2, factor + 1):
            twin = folder.with_name(f"{folder.name}-r{k:03d}")
            twin.mkdir(exist_ok=True)
            for f in folder.iterdir():
                if f.is_file() and not f.name.startswith("."):
                    os.link(f, twin / f.name)
                    copies += 1
    return copies


if __name__ == "__main__":
    sys.exit(main())
