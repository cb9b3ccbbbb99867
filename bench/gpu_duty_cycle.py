"""Does the collector's utilization agree with nvidia-smi dmon, and does GPM tell real work from spinning?

    python bench/gpu_duty_cycle.py [--device 0] [--out DIR]

On one GPU, with `gpustat-collect` sampling at 1 Hz and `nvidia-smi dmon -s u` capturing the same
window, runs four phases (about 2.5 minutes in all):

    idle      nothing                                             (10 s)
    duty50    bf16 GEMM bursts ~50 % of each 200 ms period        (60 s)
    duty50slow bf16 GEMM 2 s on / 2 s off                          (60 s)
    gemm      back-to-back bf16 8192^3 GEMMs                      (40 s)
    spin      one GPU thread spinning (torch.cuda._sleep, <<<1,1>>>) (40 s)

and prints, per phase, the collector's utilization.gpu mean (and the mean of its per-tick max), dmon's
sm% mean, their difference in points (the claim: within 5 where the load changes slower than dmon's
1 s readings: duty50slow, gemm; for the 200 ms duty cycle, the collector's mean must match the busy
fraction the load measured itself, within 5 points — a single reading per second cannot), and the GPM SM activity mean (the claim: the spin phase reads ~100 %
utilization.gpu but a tiny SM activity, far below the GEMM phase). Needs torch, nvidia-ml-py and
pyarrow only (no duckdb). Writes the raw data and a markdown table under --out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

EDGE_S = 2.0  # samples this close to a phase change are left out of its mean


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def start_collector(out: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [
        sys.executable,
        "-m",
        "collector.cli",
        "--out",
        str(out),
        "--interval",
        "1s",
        "--flush",
        "2s",
        "-q",
        "--host",
        "bench",
    ]
    return subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)


def start_dmon(nvml_index: int, log: Path) -> subprocess.Popen | None:
    if not shutil.which("nvidia-smi"):
        print("nvidia-smi not found: the dmon column will be empty", file=sys.stderr)
        return None
    fh = open(log, "w")  # noqa: SIM115 - closed when the process ends
    return subprocess.Popen(
        ["nvidia-smi", "dmon", "-s", "u", "-d", "1", "-o", "DT", "-i", str(nvml_index)],
        stdout=fh,
        stderr=subprocess.STDOUT,
    )


def parse_dmon(log: Path) -> list[tuple[float, float]]:
    """(epoch seconds, sm %) per dmon line; dmon prints local time."""
    out, columns = [], None
    for line in log.read_text().splitlines():
        if line.startswith("#"):
            if columns is None:
                columns = [c.lower() for c in line.lstrip("#").split()]
            continue
        fields = line.split()
        if not columns or len(fields) != len(columns):
            continue
        row = dict(zip(columns, fields, strict=True))
        try:
            when = dt.datetime.strptime(row["date"] + row["time"], "%Y%m%d%H:%M:%S").astimezone(dt.UTC)
            out.append((when.timestamp(), float(row["sm"])))
        except (KeyError, ValueError):
            continue  # "-" for unsupported, or a partial line
    return out


def phases(torch, device, seconds: dict[str, float]) -> tuple[list[dict], dict]:
    """Run the load phases; returns their windows and what the load itself measured."""
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    for _ in range(5):
        a @ b  # cuBLAS initialisation outside the measured phases
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        a @ b
    end.record()
    end.synchronize()
    gemm_ms = start.elapsed_time(end) / 20
    windows, measured = [], {"gemm_ms": round(gemm_ms, 3)}

    def window(name: str, body):
        torch.cuda.synchronize(device)
        time.sleep(3.0)  # a quiet gap so 1 s samples do not straddle two phases
        t0 = utc_now()
        extra = body(seconds[name]) or {}
        torch.cuda.synchronize(device)
        windows.append({"phase": name, "start": t0.timestamp(), "end": utc_now().timestamp(), **extra})
        print(f"  {name}: done {extra}", file=sys.stderr, flush=True)

    def idle(s):
        time.sleep(s)

    def duty50(s, period=0.2):
        # Half of each period busy with back-to-back GEMMs, half idle; busy time measured with events.
        per_burst = max(1, round(period / 2 * 1000 / gemm_ms))
        busy_ms, t_end = 0.0, time.monotonic() + s
        t_first = time.monotonic()
        while time.monotonic() < t_end:
            t_period = time.monotonic()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(per_burst):
                a @ b
            e1.record()
            e1.synchronize()
            busy_ms += e0.elapsed_time(e1)
            time.sleep(max(0.0, period - (time.monotonic() - t_period)))
        return {"busy_fraction": round(busy_ms / 1000 / (time.monotonic() - t_first), 3)}

    def gemm(s):
        n, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < s:
            for _ in range(50):
                a @ b
            n += 50
            torch.cuda.synchronize(device)
        return {"tflops": round(n * 2 * 8192**3 / (time.monotonic() - t0) / 1e12, 1)}

    def spin(s):
        cycles = int(20e6)  # ~10 ms per launch at ~2 GHz; one thread in one block
        t0 = time.monotonic()
        while time.monotonic() - t0 < s:
            for _ in range(10):
                torch.cuda._sleep(cycles)
            torch.cuda.synchronize(device)

    def duty50slow(s):
        return duty50(s, period=4.0)

    for name, body in (
        ("idle", idle),
        ("duty50", duty50),
        ("duty50slow", duty50slow),
        ("gemm", gemm),
        ("spin", spin),
    ):
        window(name, body)
    return windows, measured


def mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def collector_rows(tele: Path, uuid: str) -> list[dict]:
    import pyarrow.dataset as ds

    table = ds.dataset(tele / "gpu_samples", format="parquet", partitioning="hive").to_table()
    cols = ["ts", "gpu_uuid", "util_gpu_mean", "util_gpu_max", "sm_activity", "tensor_activity", "power_w"]
    rows = table.select(cols).to_pylist()
    return [dict(r, t=r["ts"].timestamp()) for r in rows if r["gpu_uuid"] == uuid]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", type=int, default=0, help="CUDA device ordinal (default 0)")
    p.add_argument("--out", type=Path, default=None, help="where to keep telemetry, dmon log and results")
    p.add_argument("--duty-seconds", type=float, default=60.0)
    p.add_argument("--phase-seconds", type=float, default=40.0, help="length of the gemm and spin phases")
    args = p.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="gpupool-duty-"))
    out.mkdir(parents=True, exist_ok=True)

    import torch

    from collector import read_inventory

    device = torch.device("cuda", args.device)
    props = torch.cuda.get_device_properties(device)
    cuda_uuid = _norm_uuid(getattr(props, "uuid", ""))
    inventory = read_inventory()
    gpu = next((g for g in inventory if cuda_uuid and _norm_uuid(g.uuid) == cuda_uuid), None)
    if gpu is None:
        gpu = inventory[min(args.device, len(inventory) - 1)]
        print(
            f"could not match CUDA device {args.device} by UUID; assuming NVML index {gpu.index}",
            file=sys.stderr,
        )
    uuid = gpu.uuid
    print(f"GPU: NVML index {gpu.index}, {gpu.name}, {uuid}, driver {gpu.driver_version}", file=sys.stderr)

    tele = out / "telemetry"
    collector = start_collector(tele)
    dmon = start_dmon(gpu.index, out / "dmon.log")
    time.sleep(3.0)
    try:
        seconds = {
            "idle": 10.0,
            "duty50": args.duty_seconds,
            "duty50slow": args.duty_seconds,
            "gemm": args.phase_seconds,
            "spin": args.phase_seconds,
        }
        windows, measured = phases(torch, device, seconds)
        time.sleep(2.0)
    finally:
        collector.send_signal(signal.SIGINT)
        if dmon is not None:
            dmon.terminate()
        try:
            collector.wait(timeout=30)
        except subprocess.TimeoutExpired:
            collector.kill()
        if dmon is not None:
            dmon.wait(timeout=10)
    if collector.returncode != 0:
        print(f"gpustat-collect exited {collector.returncode}: {collector.stderr.read()}", file=sys.stderr)
        return 1

    rows = collector_rows(tele, uuid)
    dmon_rows = parse_dmon(out / "dmon.log") if dmon is not None else []
    results = []
    for w in windows:
        lo, hi = w["start"] + EDGE_S, w["end"]
        mine = [r for r in rows if lo <= r["t"] <= hi]
        theirs = [sm for t, sm in dmon_rows if lo <= t <= hi]
        util = mean([r["util_gpu_mean"] for r in mine])
        util_max = mean([r["util_gpu_max"] for r in mine])
        sm = mean(theirs)
        results.append(
            {
                **w,
                "collector_samples": len(mine),
                "collector_util_pct": None if util is None else round(util * 100, 1),
                "collector_util_max_pct": None if util_max is None else round(util_max * 100, 1),
                "dmon_samples": len(theirs),
                "dmon_sm_pct": None if sm is None else round(sm, 1),
                "diff_points": None if util is None or sm is None else round(util * 100 - sm, 1),
                "gpm_sm_activity_pct": _pct(mean([r["sm_activity"] for r in mine])),
                "gpm_tensor_activity_pct": _pct(mean([r["tensor_activity"] for r in mine])),
                "power_w": _round(mean([r["power_w"] for r in mine])),
            }
        )

    header = (
        "| phase | s | load measured | collector util.gpu mean % | collector per-tick max % | dmon sm % mean "
        "| diff (points) | GPM SM activity % | GPM tensor % | power W |"
    )
    lines = [header, "|" + " --- |" * 10]
    for r in results:
        load = ", ".join(f"{k}={r[k]}" for k in ("busy_fraction", "tflops") if k in r) or "-"
        lines.append(
            f"| {r['phase']} | {r['end'] - r['start']:.0f} | {load} | {r['collector_util_pct']} ({r['collector_samples']}) | "
            f"{r['collector_util_max_pct']} | "
            f"{r['dmon_sm_pct']} ({r['dmon_samples']}) | {r['diff_points']} | {r['gpm_sm_activity_pct']} | "
            f"{r['gpm_tensor_activity_pct']} | {r['power_w']} |"
        )
    by = {r["phase"]: r for r in results}
    checks = {
        "util agrees with dmon within 5 points (duty50slow, gemm)": all(
            by[p]["diff_points"] is not None and abs(by[p]["diff_points"]) <= 5
            for p in ("duty50slow", "gemm")
        ),
        "util matches the load's own busy fraction within 5 points (duty50, duty50slow)": all(
            by[p]["collector_util_pct"] is not None
            and abs(by[p]["collector_util_pct"] - 100 * by[p]["busy_fraction"]) <= 5
            for p in ("duty50", "duty50slow")
        ),
        "GPM separates spin from GEMM": (
            by["spin"]["gpm_sm_activity_pct"] is not None
            and by["gemm"]["gpm_sm_activity_pct"] is not None
            and by["spin"]["gpm_sm_activity_pct"] * 5 < by["gemm"]["gpm_sm_activity_pct"]
        ),
    }
    table = "\n".join(lines)
    verdict = "\n".join(f"- {k}: {'yes' if ok else 'NO'}" for k, ok in checks.items())
    text = f"GPU: {gpu.name} (driver {gpu.driver_version}), bf16 GEMM {measured['gemm_ms']} ms per 8192^3\n\n{table}\n\n{verdict}\n"
    print(text)
    (out / "duty_cycle.md").write_text(text)
    (out / "results.json").write_text(
        json.dumps({"gpu": gpu.name, "measured": measured, "phases": results, "checks": checks}, indent=2)
    )
    print(f"raw data: {out}", file=sys.stderr)
    return 0 if all(checks.values()) else 1


def _norm_uuid(value) -> str:
    """torch prints a UUID with or without the "GPU-" prefix NVML uses."""
    return str(value or "").strip().lower().removeprefix("gpu-")


def _pct(value: float | None) -> float | None:
    return None if value is None else round(value * 100, 2)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


if __name__ == "__main__":
    sys.exit(main())
