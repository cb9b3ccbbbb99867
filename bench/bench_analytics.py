"""Time the analytics over a large telemetry directory (make one with bench/gen_telemetry.py).

    python bench/gen_telemetry.py --out /tmp/gpupool-month --days 30 --processes
    python bench/bench_analytics.py /tmp/gpupool-month [--repeat 3] [--all]
    python bench/bench_analytics.py /tmp/gpupool-month --rollups   # build rollups, time the summary on them

Prints wall time per call (the first call reads from the page cache as it is; later calls are
warm), the CPU time it took (all threads: on a shared machine, CPU / cores is the wall time an idle
machine would see), the 1-minute load average, and the process's peak resident memory, which shows
the data is streamed, not loaded: the month is ~166 M rows, several GiB uncompressed.

The raw queries always read raw samples (``open_telemetry(..., rollups=False)``). ``--rollups`` then
(re)builds the rollups (``gpustat-report rollup``, timed), times the summary from them over the whole
range, an hour-aligned first week and one host, and prints how far each differs from the raw answer.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from datetime import UTC, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import analytics as A
from collector import build_rollups


def _rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)  # ru_maxrss is KiB on Linux


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _timed(label: str, fn, repeat: int):
    # Wall time depends on what else the machine runs; CPU time (all threads) does not, and CPU / cores
    # is what the wall time would be on an otherwise idle machine.
    times, cpus = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), _cpu_s()
        result = fn()
        times.append(time.perf_counter() - t0)
        cpus.append(_cpu_s() - c0)
    print(
        f"{label:<30} wall first {times[0]:6.2f} s, best {min(times):6.2f} s   "
        f"CPU {min(cpus):6.2f} s   peak RSS {_rss_gib():4.2f} GiB   load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path, help="telemetry directory")
    ap.add_argument("--repeat", type=int, default=3, help="runs per query (default 3)")
    ap.add_argument("--all", action="store_true", help="also time patterns, attribution and the what-if")
    ap.add_argument("--rollups", action="store_true", help="also build rollups and time the summary on them")
    ap.add_argument(
        "--no-build", action="store_true", help="with --rollups or --skip-raw: use the rollups already there"
    )
    ap.add_argument(
        "--skip-raw",
        action="store_true",
        help="with --rollups: leave out the raw-sample timings (and the comparison)",
    )
    ap.add_argument("--app", action="store_true", help="also time the Streamlit app's first page (AppTest)")
    ap.add_argument(
        "--app-cold",
        action="store_true",
        help="only time the app's first page in a fresh process (AppTest; footers, imports and the "
        "first reads of the files inside it, as after `gpustat-report serve` starts)",
    )
    ap.add_argument(
        "--page-calls",
        action="store_true",
        help="only time the analytics calls of the app's first page, one by one (no Streamlit)",
    )
    ap.add_argument("--report", action="store_true", help="also time `gpustat-report build` (a subprocess)")
    args = ap.parse_args(argv)
    if args.page_calls:
        _page_calls(args.dir)
        return 0
    if args.app_cold:
        _time_app_cold(args.dir)
        return 0
    if args.skip_raw:
        return _rollups_only(args)

    con = A.open_telemetry(args.dir, rollups=False)
    rows, gpus = con.execute("SELECT count(*), count(DISTINCT gpu_uuid) FROM gpu_samples").fetchone()
    (prows,) = con.execute("SELECT count(*) FROM process_samples").fetchone()
    size = sum(f.stat().st_size for f in (args.dir / "gpu_samples").rglob("*.parquet")) / (1 << 30)
    threads = con.execute("SELECT current_setting('threads')").fetchone()[0]
    print(f"{args.dir}: {rows:,} gpu rows, {prows:,} process rows, {gpus} GPUs, {size:.2f} GiB Parquet")
    print(f"cores {os.cpu_count()}, duckdb threads {threads}, duckdb {_duckdb()}")

    s = _timed("fleet_summary (whole range)", lambda: A.fleet_summary(con), args.repeat)
    print(
        f"  -> {s.gpus} GPUs, {s.gpu_hours:,.0f} GPU-h, util mean {s.util_gpu_mean:.3f} p95 {s.util_gpu_p95:.3f}, "
        f"SM mean {s.sm_activity_mean:.3f}, idle {s.idle_gpu_hours:,.0f} h, held-idle {s.held_idle_gpu_hours:,.0f} h"
    )
    week = A.Scope(s.first_sample, s.first_sample + (s.last_sample - s.first_sample) / 4)
    _timed("fleet_summary (first week)", lambda: A.fleet_summary(con, week), args.repeat)
    one_host = A.Scope(hosts=(s.per_gpu[0].host,))
    _timed("fleet_summary (one host)", lambda: A.fleet_summary(con, one_host), args.repeat)
    if args.all:
        _timed("utilization_timeline", lambda: A.utilization_timeline(con), 1)
        _timed("hour_of_week (per host)", lambda: A.hour_of_week(con, level="host"), 1)
        _timed("busiest_idlest", lambda: A.busiest_idlest(con), 1)
        _timed("attribution (user)", lambda: A.attribution(con, by="user"), 1)
        w = _timed("what_if (process demand)", lambda: A.what_if(con, summary=s), 1)
        print(
            f"  -> {w.requests} requests, {w.step_s} s steps, need p95 {w.gpus_needed_p95} p99 {w.gpus_needed_p99} "
            f"of {w.observed_gpus}, waited {w.waited_share:.1%}, pooled busy {w.pooled_util_mean:.1%}"
        )
    if args.rollups:
        _rollups(args, s, week, one_host)
    return 0


def _rollups(args, raw: A.FleetSummary, week: A.Scope, one_host: A.Scope) -> None:
    if not args.no_build:
        r = _timed("build_rollups (all hosts)", lambda: build_rollups(args.dir), 1)
        print(
            f"  -> {r.samples:,} samples -> {r.minute_rows:,} minute rows, {r.hour_rows:,} hour rows, {r.files} files"
        )
    size = sum(f.stat().st_size for f in args.dir.glob("gpu_rollup_*/**/*.parquet")) / (1 << 20)
    print(f"rollups on disk: {size:.0f} MiB")
    con = _timed("open_telemetry (with rollups)", lambda: A.open_telemetry(args.dir), 1)
    s = _timed("fleet_summary rollups (whole)", lambda: A.fleet_summary(con), args.repeat)
    print(f"  -> {s.data_source}")
    print(
        f"  -> samples {s.samples:,} (raw {raw.samples:,}), GPU-h {s.gpu_hours:,.6f} (raw {raw.gpu_hours:,.6f}), "
        f"util mean {s.util_gpu_mean:.9f} (raw {raw.util_gpu_mean:.9f}), p50/p95 {s.util_gpu_p50}/{s.util_gpu_p95} "
        f"(raw {raw.util_gpu_p50}/{raw.util_gpu_p95}), SM mean {s.sm_activity_mean:.9f} (raw {raw.sm_activity_mean:.9f}), "
        f"idle {s.idle_gpu_hours:,.6f} h (raw {raw.idle_gpu_hours:,.6f}), held-idle {s.held_idle_gpu_hours:,.6f} h "
        f"(raw {raw.held_idle_gpu_hours:,.6f})"
    )
    start = week.start.replace(minute=0, second=0, microsecond=0)
    hours = A.Scope(start, week.end.replace(minute=0, second=0, microsecond=0))
    w = _timed("fleet_summary rollups (week, h)", lambda: A.fleet_summary(con, hours), args.repeat)
    print(f"  -> {w.data_source}")
    _timed("fleet_summary rollups (host)", lambda: A.fleet_summary(con, one_host), args.repeat)
    raw_con = A.open_telemetry(args.dir, rollups=False)
    for label, fn in (
        ("utilization_timeline", lambda c: A.utilization_timeline(c).points),
        ("hour_of_week (per host)", lambda c: A.hour_of_week(c, level="host")),
    ):
        a = _timed(f"{label} raw", lambda fn=fn: fn(raw_con), 1)
        b = _timed(f"{label} rollups", lambda fn=fn: fn(con), 1)
        print(f"  -> same as raw: {_close(a, b)}")


def _rollups_only(args) -> int:
    """The rollup path alone: (re)build or not, then each figure the app's first page shows."""
    size = sum(f.stat().st_size for f in (args.dir / "gpu_samples").rglob("*.parquet")) / (1 << 30)
    print(f"{args.dir}: {size:.2f} GiB raw Parquet; cores {os.cpu_count()}, duckdb {_duckdb()}")
    if not args.no_build:
        r = _timed("build_rollups (from scratch)", lambda: build_rollups(args.dir, rebuild=True), 1)
        print(f"  -> {r.samples:,} samples -> {r.minute_rows:,} minute rows, {r.hour_rows:,} hour rows")
        # An incremental build: the last day again (as after an import of that day's logs).
        last = A.data_extent(A.open_telemetry(args.dir)).end
        since = last.replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=1)
        r = _timed("build_rollups (the last day)", lambda: build_rollups(args.dir, since=since), 1)
        print(f"  -> {r.samples:,} samples -> {r.minute_rows:,} minute rows, {r.hour_rows:,} hour rows")
    rsize = sum(f.stat().st_size for f in args.dir.glob("gpu_rollup_*/**/*.parquet")) / (1 << 20)
    print(f"rollups on disk: {rsize:.0f} MiB")
    con = _timed("open_telemetry", lambda: A.open_telemetry(args.dir), 1)
    ext = _timed("data_extent", lambda: A.data_extent(con), args.repeat)
    print(
        f"  -> {ext.start:%Y-%m-%d %H:%M} to {ext.end:%Y-%m-%d %H:%M}, {len(ext.hosts)} hosts, {len(ext.gpus)} GPUs"
    )
    s = _timed("fleet_summary (whole)", lambda: A.fleet_summary(con), args.repeat)
    print(
        f"  -> {s.data_source}; {s.samples:,} samples, {s.gpu_hours:,.1f} GPU-h, util mean {s.util_gpu_mean:.6f}"
    )
    start = s.first_sample.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    week = A.Scope(start, start + timedelta(days=7))
    _timed("fleet_summary (a week, on the hour)", lambda: A.fleet_summary(con, week), args.repeat)
    _timed(
        "fleet_summary (one host)", lambda: A.fleet_summary(con, A.Scope(hosts=(ext.hosts[0],))), args.repeat
    )
    t = _timed("utilization_timeline", lambda: A.utilization_timeline(con), args.repeat)
    print(f"  -> {len(t.points)} points of {t.bucket_s} s")
    _timed("hour_of_week (fleet)", lambda: A.hour_of_week(con), args.repeat)
    _timed("hour_of_week (per host)", lambda: A.hour_of_week(con, level="host"), args.repeat)
    _timed("busiest_idlest", lambda: A.busiest_idlest(con), args.repeat)
    # The app's first page and gpustat-report build: the three above from one hourly read.
    _timed("fleet_patterns (the 3 above)", lambda: A.fleet_patterns(con), args.repeat)
    w = _timed("what_if (GPU demand)", lambda: A.what_if(con, summary=s), args.repeat)
    print(f"  -> {w.data_source}; {w.requests} requests, {w.step_s} s steps, need p95 {w.gpus_needed_p95}")
    if args.app:
        _time_app(args.dir)
    if args.report:
        _time_report(args.dir)
    return 0


def _page_calls(root: Path) -> None:
    """The calls of the app's first page, in its order, on one fresh connection (as ``reports/app.py``
    makes them, the what-if on its button): where the page's time goes."""
    import math

    from reports.app import _round

    t0, c0 = time.perf_counter(), _cpu_s()
    con = _timed("page: open_telemetry", lambda: A.open_telemetry(root), 1)
    ext = _timed("page: data_extent", lambda: A.data_extent(con), 1)
    _timed("page: rollups_built", lambda: A.rollups_built(con), 1)
    start, end = ext.start.replace(tzinfo=None), ext.end.replace(tzinfo=None) + timedelta(seconds=1)
    step = timedelta(hours=1) if end - start > timedelta(days=2) else timedelta(minutes=1)
    start, end = _round(start, step, math.floor), _round(end, step, math.ceil)
    scope = A.Scope(start.replace(tzinfo=UTC), end.replace(tzinfo=UTC))
    s = _timed("page: fleet_summary", lambda: A.fleet_summary(con, scope), 1)
    _timed("page: attribution (user)", lambda: _or_none(lambda: A.attribution(con, scope, by="user")), 1)
    _timed("page: fleet_patterns", lambda: A.fleet_patterns(con, scope), 1)
    _timed("page: pool_activity", lambda: A.pool_activity(con, scope), 1)
    print(
        f"  -> {s.samples:,} samples, {s.gpu_hours:,.1f} GPU-h, util mean {s.util_gpu_mean:.6f}; "
        f"the page's analytics: {time.perf_counter() - t0:.2f} s wall, {_cpu_s() - c0:.2f} s CPU"
    )


def _or_none(fn):
    try:
        return fn()
    except A.TelemetryError:
        return None


def _time_app(root: Path) -> None:
    from streamlit.testing.v1 import AppTest

    from reports import DIRS_ENV

    os.environ[DIRS_ENV] = str(root)
    app = Path(__file__).resolve().parent.parent / "reports" / "app.py"
    at = _timed(
        "app: first page (AppTest)", lambda: AppTest.from_file(str(app), default_timeout=600).run(), 1
    )
    print(f"  -> exceptions: {[e.message[:200] for e in at.exception] or 'none'}")


def _time_app_cold(root: Path) -> None:
    import subprocess

    # The child imports AppTest first (a running server has Streamlit loaded), then times one run.
    child = f"""
import os, resource, sys, time
sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
from streamlit.testing.v1 import AppTest
from reports import DIRS_ENV
os.environ[DIRS_ENV] = {str(root)!r}
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
t0, c0 = time.perf_counter(), cpu()
at = AppTest.from_file({str(Path(__file__).resolve().parent.parent / "reports" / "app.py")!r}, default_timeout=600).run()
print(f"{{time.perf_counter() - t0:.2f}} {{cpu() - c0:.2f}} {{len(at.exception)}}")
"""
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True).stdout
    wall, cpu, errors = out.split()[-3:]
    print(
        f"{'app: first page, fresh process':<30} wall {float(wall):6.2f} s   CPU {float(cpu):6.2f} s   "
        f"exceptions {errors}   load {os.getloadavg()[0]:.1f}",
        flush=True,
    )


def _time_report(root: Path) -> None:
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "reports.cli", "build", str(root), "-o", f"{tmp}/report.html"]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        print(
            f"{'gpustat-report build':<30} wall {time.perf_counter() - t0:6.2f} s   rc {proc.returncode}   "
            f"load {os.getloadavg()[0]:.1f}   {proc.stderr.strip().splitlines()[-1:] if proc.returncode else ''}",
            flush=True,
        )


def _close(a, b) -> bool:
    """Dataclasses, tuples and floats equal to 1e-9 relative."""
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1e-12)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if hasattr(a, "__dataclass_fields__"):
        return all(_close(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__)
    return a == b


def _duckdb() -> str:
    import duckdb

    return duckdb.__version__


if __name__ == "__main__":
    sys.exit(main())
