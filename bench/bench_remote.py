"""Remote execution vs native, in one run: python bench/bench_remote.py  (GPU machine, < 4 min)

Runs the same cuda.bindings program twice — natively, then with gpupool's libcuda.so.1 talking to a
lease worker on the same host (start_worker, CUDA executor) over its local socket, as a client on the
GPU server does (`--tcp`: loopback TCP, `--encrypt`: TLS 1.3, as across hosts) — and prints both and
remote as % of native:

  - synchronous round trip: cuEventRecord then cuCtxSynchronize on an idle GPU (µs, median)
  - empty-kernel launches per second, pipelined (20 000 launches, then one sync); with `--move-to GPU`
    the remote run's lease then moves to that GPU (a live migration, asked by the program itself) and
    the launches are measured again: the rate the lease runs at after a move
  - HtoD / DtoH bandwidth, synchronous copies from pageable memory, 4 KiB .. 1 GiB (median of
    repeated copies, each followed by cuCtxSynchronize, so small sizes include one round trip)
  - cuMemcpyDtoHAsync into page-locked memory, 64 KiB .. 16 MiB: how long the call takes to return,
    and the rate of 16 copies in flight then one cuStreamSynchronize (issue 12)
  - cuMemcpyHtoDAsync from page-locked memory, 64 KiB .. 16 MiB, 16 in flight over 4 streams (a
    data loader's pinned batches): the call's time and the rate (issue 31)
  - compute-bound: 40 launches of a ~2 ms kernel (wall time)
  - launch-bound: 5 000 launches of a tiny kernel (wall time)
  - graph replays: a captured graph of 20 tiny kernels, cuGraphLaunch 500 times, one sync (issue 31)
  - event-heavy loop, as triton.testing.do_bench times a kernel: per iteration cuEventRecord, a tiny
    kernel, cuEventRecord; then cuEventSynchronize and cuEventElapsedTime of each pair (issue 31)
  - an eager framework's loop (CuPy, PyTorch without graphs): per step ~15 µs of the host's own work
    (Python deciding what to launch), then a launch, a memset and an event record; every 50 steps a
    small copy back to pageable memory (`.item()`): µs a step, and the median µs the launch call
    itself takes. The calls that need no answer are where a remote client pays per call what a
    native one does not (issue 25's CuPy suites, issue 31)

Targets (issue 6): compute-bound >= 95 % of native, round trip <= 40 µs, >= 50 k launches/s,
copies >= 2 GB/s. `--executor host` measures the protocol and the worker alone on a machine with no
GPU (the host-memory test executor; no native run). Results: a table on stdout, JSON in $OUT.
`--repeat N` runs native and remote N times each, in turn, and reports each number's median (every run
is in the JSON): how to compare two builds on a machine whose runs differ by up to 1.5x.

`--netem` (issue 12; root, iproute2) runs the remote side across a real network link instead: the
worker in one network namespace, the program in another, joined by a veth pair shaped by `tc netem`
(`--link-rate`, default 25gbit, and `--link-delay`, default 20us, each way; tests/netem_link.py; on a
kernel without `sch_netem`, `tbf` for the rate and a relay in the worker's namespace for the delay). It
runs the program twice, over the data connection's TLS (as between hosts) and in plaintext (over
loopback addresses routed across the same link), and measures the link's raw capacity the same way
(one Python TCP stream each way, plain and TLS), so copies read as % of the nominal link and % of what
this machine can push through it:

  sudo python bench/bench_remote.py --netem --executor host

Each copy row also reports the CPU seconds the program and the worker spent per GB moved (from
/proc; 16 MiB and up), the fairer measure on a shared machine. `--copies-only` stops after the copies
and `--min-copy-mib` / `--max-copy-mib` pick the sizes, e.g. to profile the copy path.

`--ring` (issue 31) runs the remote program twice against the same worker, its connection on the
socket and then over the command ring (GPUPOOL_SHIM_RING=1: frames and answers through memory the
program and the worker map), and prints a table for each:

  python bench/bench_remote.py --ring --patterns round_trip,copies,graph,events --max-copy-mib 1

Where the time goes, pattern by pattern (issue 31): `--patterns graph --profile` measures only the
graph replays and writes the shim's per-call profile of the remote run (GPUPOOL_SHIM_PROFILE) and the
worker's cProfile of the connection (GPUPOOL_WORKER_PROFILE) under $OUT; with `--ring`, of both remote runs.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "gpu" / "remote"))
sys.path.insert(0, str(ROOT / "tests"))  # netem_link

RAW_REPEATS = 3  # --netem: the link's raw capacity is the median of this many 256 MiB streams each way
SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20, 1 << 30]
SIZES = [s for s in SIZES if s <= int(os.environ.get("GPUPOOL_BENCH_MAX_COPY", 1 << 30))]
SIZES = [s for s in SIZES if s >= int(os.environ.get("GPUPOOL_BENCH_MIN_COPY", 0))] or SIZES[-1:]
# What the child measures, in this order (--patterns picks some: e.g. to profile one of them alone).
PATTERNS = ("round_trip", "launches", "copies", "dtoh_async", "htod_async", "compute", "launch_bound",
            "graph", "events", "eager")  # fmt: skip
COPY_PATTERNS = ("round_trip", "launches", "copies", "dtoh_async", "htod_async")  # --copies-only


# ---- the measured program (runs in a child process, natively or remotely) ------------------------


def child() -> None:
    import numpy as np
    from _common import PTX
    from cuda.bindings import driver as cu

    def ok(result):
        if result[0] != cu.CUresult.CUDA_SUCCESS:
            raise SystemExit(f"CUDA error {result[0].name}")
        return result[1] if len(result) == 2 else (result[1:] if len(result) > 2 else None)

    out: dict[str, object] = {}
    ok(cu.cuInit(0))
    ctx = ok(cu.cuDevicePrimaryCtxRetain(0))
    ok(cu.cuCtxSetCurrent(ctx))
    module = ok(cu.cuModuleLoadData(PTX.encode()))
    empty = ok(cu.cuModuleGetFunction(module, b"empty"))
    spin = ok(cu.cuModuleGetFunction(module, b"spin"))
    saxpy = ok(cu.cuModuleGetFunction(module, b"saxpy"))
    stream = ok(cu.cuStreamCreate(1))  # non-blocking
    chosen = os.environ.get("GPUPOOL_BENCH_PATTERNS", ",".join(PATTERNS)).split(",")

    def want(pattern: str) -> bool:
        return pattern in chosen

    if want("round_trip"):
        out["round_trip_us"] = round_trip(cu, ok)
        out["python_round_trip_us"] = python_round_trip(cu, ok)
    if want("launches"):
        out["launches_per_s"] = launches(cu, ok, empty, stream)
        if os.environ.get("GPUPOOL_BENCH_MOVE_TO"):  # the remote run: its lease moves, the rate again
            out["move"] = moved_here()
            out["launches_after_move_per_s"] = launches(cu, ok, empty, stream)
    if want("copies"):
        out["bandwidth_gb_s"], out["cpu_s_per_gb"] = copies(cu, ok, np)
    if want("dtoh_async"):
        dev = ok(cu.cuMemAlloc(SIZES[-1]))
        out["dtoh_async_pinned"] = dtoh_async_pinned(cu, ok, dev, stream)
        ok(cu.cuMemFree(dev))
        # across hosts those copies opened the process's callback connection: its round trips since
        out["round_trip_after_copies_us"] = round_trip(cu, ok)
    if want("htod_async"):
        out["htod_async_pinned"] = htod_async_pinned(cu, ok)
    if want("compute"):
        out["compute_iters"], out["compute_bound_s"] = compute_bound(cu, ok, spin, stream)
    # Many tiny kernels: launched one by one, replayed as a graph, timed between events.
    x, y = ok(cu.cuMemAlloc(4096)), ok(cu.cuMemAlloc(4096))
    sargs = ((x, y, 1.0, 1024), (None, None, ctypes.c_float, ctypes.c_uint32))
    if want("launch_bound"):
        t = time.perf_counter()
        for _ in range(5000):
            cu.cuLaunchKernel(saxpy, 4, 1, 1, 256, 1, 1, 0, stream, sargs, 0)
        ok(cu.cuStreamSynchronize(stream))
        out["launch_bound_s"] = time.perf_counter() - t
    if want("graph"):
        out["graph_replays_per_s"] = graph_replays(cu, ok, saxpy, sargs, stream)
    if want("events"):
        out["event_loop_us"] = event_loop(cu, ok, saxpy, sargs, stream)
    if want("eager"):
        out["eager_step_us"], out["eager_launch_call_us"] = eager_loop(cu, ok, saxpy, sargs, stream, x)
    print(json.dumps(out))


def moved_here() -> dict:
    """This program's lease moved to GPU $GPUPOOL_BENCH_MOVE_TO by its worker (asked as the pool server asks)."""
    from server.workers import ask_migration

    to, uuid = os.environ["GPUPOOL_BENCH_MOVE_TO"].split(",")
    state = Path(os.environ["GPUPOOL_BENCH_WORKER_STATE"])
    answer = ask_migration(state, int(os.environ["GPUPOOL_BENCH_WORKER_PID"]), 0, int(to), uuid=uuid)
    if not answer.get("ok"):
        raise SystemExit(f"the move to GPU {to} failed: {answer.get('error')}")
    return answer


def round_trip(cu, ok) -> float:
    """An event recorded, then a synchronise (µs, median): the least a synchronise costs that has to ask.
    (With nothing sent since the last synchronise the client answers it itself, as cheaply as natively.)"""
    event = ok(cu.cuEventCreate(2))  # CU_EVENT_DISABLE_TIMING
    samples = []
    for i in range(3200):
        t = time.perf_counter()
        ok(cu.cuEventRecord(event, 0))
        ok(cu.cuCtxSynchronize())
        if i >= 200:
            samples.append(time.perf_counter() - t)
    ok(cu.cuEventDestroy(event))
    return statistics.median(samples) * 1e6


def python_round_trip(cu, ok) -> float:
    """A call the worker answers in Python, not its native loop (cuStreamCreate, then its destroy, which
    wants no answer; events are made many to a round trip, so cuEventCreate no longer asks): the round
    trip of the calls a framework makes now and then (µs, median)."""
    samples = []
    for i in range(1200):
        t = time.perf_counter()
        stream = ok(cu.cuStreamCreate(1))  # CU_STREAM_NON_BLOCKING
        if i >= 200:
            samples.append(time.perf_counter() - t)
        ok(cu.cuStreamDestroy(stream))
    return statistics.median(samples) * 1e6


def launches(cu, ok, empty, stream) -> float:
    """Empty-kernel launches per second, pipelined."""
    n_launch = 20000
    for _ in range(500):
        ok(cu.cuLaunchKernel(empty, 1, 1, 1, 32, 1, 1, 0, stream, 0, 0))
    ok(cu.cuStreamSynchronize(stream))
    t = time.perf_counter()
    for _ in range(n_launch):
        cu.cuLaunchKernel(empty, 1, 1, 1, 32, 1, 1, 0, stream, 0, 0)
    ok(cu.cuStreamSynchronize(stream))
    return n_launch / (time.perf_counter() - t)


def copies(cu, ok, np) -> tuple[dict, dict]:
    """Synchronous copies from and to pageable memory: GB/s, and CPU seconds per GB on each side."""
    dev = ok(cu.cuMemAlloc(SIZES[-1]))
    host = np.ones(SIZES[-1], dtype=np.uint8)
    bandwidth, cpu = {}, {}
    sides = {"client": "self"}
    if os.environ.get("GPUPOOL_BENCH_WORKER_PID"):
        sides["worker"] = os.environ["GPUPOOL_BENCH_WORKER_PID"]
    for size in SIZES:
        reps = max(3, min(200, (256 << 20) // size))
        row, cpu_row = {}, {}
        for direction in ("htod", "dtoh"):
            copy = (
                (lambda s=size: cu.cuMemcpyHtoD(dev, host.ctypes.data, s))
                if direction == "htod"
                else (lambda s=size: cu.cuMemcpyDtoH(host.ctypes.data, dev, s))
            )
            ok(copy())
            times = []
            start = {side: usage(pid) for side, pid in sides.items()}
            for _ in range(reps):
                t = time.perf_counter()
                ok(copy())
                ok(cu.cuCtxSynchronize())  # a copy to the device counts once it is there
                times.append(time.perf_counter() - t)
            row[direction] = size / statistics.median(times) / 1e9
            gb = size * reps / 1e9
            cpu_row[direction] = {}
            for side, pid in sides.items():  # CPU s/GB (user + system), of it system, system calls per MB
                (user, system, calls), (user0, system0, calls0) = usage(pid), start[side]
                cpu_row[direction][side] = (user - user0 + system - system0) / gb
                cpu_row[direction][f"{side}_system"] = (system - system0) / gb
                cpu_row[direction][f"{side}_calls_per_mb"] = (calls - calls0) / gb / 1000
        bandwidth[size] = row
        cpu[size] = cpu_row
    ok(cu.cuMemFree(dev))
    return bandwidth, cpu  # CPU seconds per GB moved, each side (a loaded machine's fairer measure)


def compute_bound(cu, ok, spin, stream) -> tuple[int, float]:
    """40 launches of a ~2 ms kernel back to back (iterations calibrated natively, reused remotely)."""
    buf = ok(cu.cuMemAlloc(4 * 132 * 4 * 256))
    iters = 2000
    args = ((buf, iters), (None, ctypes.c_uint32))
    start, end = ok(cu.cuEventCreate(0)), ok(cu.cuEventCreate(0))
    fixed = int(os.environ.get("GPUPOOL_BENCH_ITERS", "0"))  # the native run's calibration, reused
    for _ in range(0 if fixed else 3):  # calibrate iterations to ~2 ms per kernel
        ok(cu.cuEventRecord(start, stream))
        ok(cu.cuLaunchKernel(spin, 132 * 4, 1, 1, 256, 1, 1, 0, stream, args, 0))
        ok(cu.cuEventRecord(end, stream))
        ok(cu.cuEventSynchronize(end))
        ms = ok(cu.cuEventElapsedTime(start, end))
        iters = max(1, int(iters * 2.0 / max(ms, 1e-3)))
        args = ((buf, iters), (None, ctypes.c_uint32))
    if fixed:
        iters = fixed
        args = ((buf, iters), (None, ctypes.c_uint32))
    t = time.perf_counter()
    for _ in range(40):
        ok(cu.cuLaunchKernel(spin, 132 * 4, 1, 1, 256, 1, 1, 0, stream, args, 0))
    ok(cu.cuStreamSynchronize(stream))
    return iters, time.perf_counter() - t


def dtoh_async_pinned(cu, ok, dev, stream) -> dict:
    """cuMemcpyDtoHAsync into page-locked memory (as tensor.to('cpu', non_blocking=True) does): how long
    the call takes to return (median; natively it queues the copy and returns) and the rate of 16 copies
    in flight on one stream, then one cuStreamSynchronize."""
    rows = {}
    for size in (s for s in (64 << 10, 1 << 20, 16 << 20) if s <= SIZES[-1]):
        pinned = ok(cu.cuMemHostAlloc(16 * size, 0))
        calls, rates = [], []
        for _ in range(max(3, min(50, (256 << 20) // (16 * size)))):
            t = time.perf_counter()
            for k in range(16):
                c = time.perf_counter()
                ok(cu.cuMemcpyDtoHAsync(pinned + k * size, dev, size, stream))
                calls.append(time.perf_counter() - c)
            ok(cu.cuStreamSynchronize(stream))
            rates.append(16 * size / (time.perf_counter() - t) / 1e9)
        ok(cu.cuMemFreeHost(pinned))
        rows[size] = {"call_us": statistics.median(calls) * 1e6, "gb_s": statistics.median(rates)}
    return rows


def htod_async_pinned(cu, ok) -> dict:
    """cuMemcpyHtoDAsync from page-locked memory (a data loader's pinned batches): how long the call
    takes to return (median) and the rate of 16 copies in flight over 4 streams, then a synchronise."""
    streams = [ok(cu.cuStreamCreate(1)) for _ in range(4)]
    rows = {}
    for size in (s for s in (64 << 10, 1 << 20, 16 << 20) if s <= SIZES[-1]):
        pinned, dev = ok(cu.cuMemHostAlloc(16 * size, 0)), ok(cu.cuMemAlloc(16 * size))
        calls, rates = [], []
        for _ in range(max(3, min(50, (256 << 20) // (16 * size)))):
            t = time.perf_counter()
            for k in range(16):
                c = time.perf_counter()
                ok(cu.cuMemcpyHtoDAsync(int(dev) + k * size, pinned + k * size, size, streams[k % 4]))
                calls.append(time.perf_counter() - c)
            ok(cu.cuCtxSynchronize())
            rates.append(16 * size / (time.perf_counter() - t) / 1e9)
        ok(cu.cuMemFreeHost(pinned))
        ok(cu.cuMemFree(dev))
        rows[size] = {"call_us": statistics.median(calls) * 1e6, "gb_s": statistics.median(rates)}
    for s in streams:
        ok(cu.cuStreamDestroy(s))
    return rows


def graph_replays(cu, ok, kernel, args, stream) -> float:
    """Replays per second of a captured graph of 20 tiny kernels (make_graphed_callables' pattern)."""
    ok(cu.cuStreamBeginCapture(stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL))
    for _ in range(20):
        ok(cu.cuLaunchKernel(kernel, 4, 1, 1, 256, 1, 1, 0, stream, args, 0))
    graph = ok(cu.cuStreamEndCapture(stream))
    exe = ok(cu.cuGraphInstantiate(graph, 0))
    for _ in range(20):
        ok(cu.cuGraphLaunch(exe, stream))
    ok(cu.cuStreamSynchronize(stream))
    n = 500
    t = time.perf_counter()
    for _ in range(n):
        ok(cu.cuGraphLaunch(exe, stream))
    ok(cu.cuStreamSynchronize(stream))
    rate = n / (time.perf_counter() - t)
    ok(cu.cuGraphExecDestroy(exe))
    ok(cu.cuGraphDestroy(graph))
    return rate


def event_loop(cu, ok, kernel, args, stream) -> float:
    """µs per iteration of a benchmark harness's loop (triton.testing.do_bench): cuEventRecord, a tiny
    kernel, cuEventRecord, 200 times; then cuEventSynchronize and cuEventElapsedTime of each pair."""
    n = 200
    starts = [ok(cu.cuEventCreate(0)) for _ in range(n)]
    ends = [ok(cu.cuEventCreate(0)) for _ in range(n)]
    times = []
    for _ in range(5):
        t = time.perf_counter()
        for a, b in zip(starts, ends, strict=True):
            ok(cu.cuEventRecord(a, stream))
            ok(cu.cuLaunchKernel(kernel, 4, 1, 1, 256, 1, 1, 0, stream, args, 0))
            ok(cu.cuEventRecord(b, stream))
        ok(cu.cuEventSynchronize(ends[-1]))
        for a, b in zip(starts, ends, strict=True):
            ok(cu.cuEventElapsedTime(a, b))
        times.append((time.perf_counter() - t) / n)
    for e in starts + ends:
        ok(cu.cuEventDestroy(e))
    return statistics.median(times) * 1e6


def eager_loop(cu, ok, kernel, args, stream, buf) -> tuple[float, float]:
    """An eager framework's steps: host work (~15 µs, spun), a launch, a memset, an event record; every
    50th step an 8-byte copy to pageable memory that waits for the stream. µs a step (median of 5 runs of
    500 steps) and µs the launch call takes (median)."""
    event = ok(cu.cuEventCreate(2))  # CU_EVENT_DISABLE_TIMING, as a framework's own
    out = ctypes.c_uint64()
    steps, calls = [], []
    for _ in range(6):  # the first run warms up, not counted
        t = time.perf_counter()
        for i in range(500):
            until = time.perf_counter() + 15e-6
            while time.perf_counter() < until:
                pass
            c = time.perf_counter()
            cu.cuLaunchKernel(kernel, 4, 1, 1, 256, 1, 1, 0, stream, args, 0)
            calls.append(time.perf_counter() - c)
            cu.cuMemsetD8Async(buf, 0, 256, stream)
            cu.cuEventRecord(event, stream)
            if i % 50 == 49:
                ok(cu.cuMemcpyDtoHAsync(ctypes.addressof(out), buf, 8, stream))
                ok(cu.cuStreamSynchronize(stream))
        steps.append((time.perf_counter() - t) / 500)
    ok(cu.cuStreamSynchronize(stream))
    ok(cu.cuEventDestroy(event))
    return statistics.median(steps[1:]) * 1e6, statistics.median(calls[500:]) * 1e6


def usage(pid: str) -> tuple[float, float, int]:
    """A process's CPU seconds in user space and in the kernel, and its system calls that read or
    write (/proc: `self`, or the worker's pid, which the parent passes on)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    io = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(fields[11]) / tick, int(fields[12]) / tick, int(io["syscr"]) + int(io["syscw"])


# ---- the driver: native run, remote run, the comparison ----------------------------------------


def run_child(env: dict[str, str], prefix: list[str] | None = None, profile: Path | None = None) -> dict:
    """The measured program's results; `profile`: the shim's profile of its calls (its stderr) goes there."""
    proc = subprocess.run(
        [*(prefix or []), sys.executable, __file__, "--child"],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    if proc.returncode != 0:
        raise SystemExit(
            f"benchmark child failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    if profile is not None:
        profile.write_text(proc.stderr)
        print(f"the shim's profile of the remote run: {profile}", flush=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def median_of(runs: list[dict]) -> dict:
    """One run's results with each number the median of that number in every run (what is not a number, as
    the first run has it): run-to-run noise of 1.5x on a shared machine hides a change one run shows."""
    first = runs[0]
    out = {}
    for key, value in first.items():
        each = [run[key] for run in runs if key in run]
        if isinstance(value, dict):
            out[key] = median_of(each)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = statistics.median(each)
        else:
            out[key] = value
    return out


def bench_env(args) -> dict[str, str]:
    """The child runs' environment: no lease of the caller's, the copy sizes asked for, this tree first."""
    # (the shim's own knobs, GPUPOOL_SHIM_*, pass: for comparing with a feature off)
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_") or k.startswith("GPUPOOL_SHIM_")
    }
    env["GPUPOOL_BENCH_MAX_COPY"] = str(args.max_copy_mib << 20)
    env["GPUPOOL_BENCH_MIN_COPY"] = str(args.min_copy_mib << 20)
    patterns = COPY_PATTERNS if args.copies_only else PATTERNS
    env["GPUPOOL_BENCH_PATTERNS"] = ",".join(p for p in patterns if p in args.patterns.split(","))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    os.environ["PYTHONPATH"] = env["PYTHONPATH"]  # the worker, started from here, imports this tree
    return env


def finish(results: dict, started: float, name: str) -> int:
    """The run's time, the results as JSON under $OUT (when set) as `name`."""
    results["seconds"] = time.monotonic() - started
    if os.environ.get("OUT"):
        Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)  # a fresh $OUT: made, not a traceback
        Path(os.environ["OUT"], name).write_text(json.dumps(results, indent=2))
    print(f"\n(benchmark took {results['seconds']:.0f} s)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--executor", choices=["cuda", "host"], default="cuda",
                        help="cuda: a real GPU (default); host: protocol and worker only, no GPU")  # fmt: skip
    parser.add_argument("--partition-mib", type=int, default=8192, help="memory of the benchmark lease")
    parser.add_argument("--max-copy-mib", type=int, default=1024, help="largest copy measured (default 1024)")
    parser.add_argument("--min-copy-mib", type=int, default=0, help="smallest copy measured (default: 4 KiB)")
    parser.add_argument("--encrypt", action="store_true",
                        help="encrypt the data connection (TLS 1.3) as across hosts, though on loopback")  # fmt: skip
    parser.add_argument("--tcp", action="store_true",
                        help="loopback TCP, not the worker's local socket that a client on its host uses")  # fmt: skip
    parser.add_argument("--copies-only", action="store_true",
                        help="stop after the copies (round trip, launches, copies): to profile the copy path")  # fmt: skip
    parser.add_argument("--patterns", default=",".join(PATTERNS), type=patterns_arg,
                        help=f"which to measure, comma-separated (default all: {','.join(PATTERNS)})")  # fmt: skip
    parser.add_argument("--ring", action="store_true",
                        help="run the remote program twice, on the socket and over the command ring "
                        "(GPUPOOL_SHIM_RING=1), and report both")  # fmt: skip
    parser.add_argument("--profile", action="store_true",
                        help="where the remote run's time goes: the shim's per-call profile and the worker's "
                        "cProfile, written under $OUT (or the run's temporary folder)")  # fmt: skip
    parser.add_argument("--move-to", type=int, metavar="GPU",
                        help="after the launches, move the remote run's lease to this GPU of the host (a live "
                        "migration) and measure the launches again")  # fmt: skip
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="run native and remote N times each, in turn, and report each row's median (runs "
                        "of one build differ by up to 1.5x on a shared machine)")  # fmt: skip
    parser.add_argument("--netem", action="store_true",
                        help="across a tc-shaped veth link between two network namespaces (root)")  # fmt: skip
    parser.add_argument("--link-rate", default="25gbit", help="--netem: the link's rate each way (tc units)")
    parser.add_argument("--link-delay", default="20us", help="--netem: the link's one-way delay (tc units)")
    parser.add_argument("--mtu", type=int, default=1500, help="--netem: the link's MTU")
    args = parser.parse_args()
    if args.repeat < 1 or (args.netem and args.repeat > 1):
        parser.error("--repeat: at least 1, and 1 with --netem (its link is measured once)")
    if args.child:
        child()
        return 0
    if args.netem:
        return netem_main(args)

    from server.workers import WorkerDevice, start_worker
    from virtualize.client.remote import fresh_shim, remote_env
    from virtualize.common import _wire

    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="gpupool-bench-remote-"))
    shim = fresh_shim(work / "shim")
    print(f"shim: {shim}", flush=True)
    env = bench_env(args)
    results = {}
    if args.executor == "cuda":
        print("native run ...", flush=True)
        results["native"] = run_child(env)
        device = WorkerDevice(0, gpu_uuid(0), args.partition_mib << 20)
    else:
        device = WorkerDevice(0, "", args.partition_mib << 20)
    profile_dir = Path(os.environ.get("OUT") or work)
    if args.profile:
        profile_dir.mkdir(parents=True, exist_ok=True)
    worker_env = {"GPUPOOL_WORKER_PROFILE": str(profile_dir)} if args.profile else {}
    if args.executor == "host":  # copies into page-locked memory through the delivery thread, as on a GPU
        worker_env["GPUPOOL_HOST_EXECUTOR_COPIES"] = "later"
    worker = start_worker("bench", [device], bind_host="127.0.0.1", env=worker_env, executor=args.executor)
    try:
        print(f"remote run (worker pid {worker.pid}, {args.executor} executor) ...", flush=True)
        answer = {
            "id": "bench",
            "worker": worker.answer(),
        }
        if "compute_iters" in results.get("native", {}):  # not measured under --copies-only
            env["GPUPOOL_BENCH_ITERS"] = str(results["native"]["compute_iters"])
        remote = {**env, **remote_env(answer, cache_root=work / "cache", library=shim)}
        if args.encrypt:
            remote["GPUPOOL_DATA_ENCRYPTION"] = "always"
        if args.tcp:
            remote.pop("GPUPOOL_WORKER_LOCAL", None)
        remote["GPUPOOL_BENCH_WORKER_PID"] = str(worker.pid)
        if args.move_to is not None:
            remote["GPUPOOL_BENCH_WORKER_STATE"] = str(worker.state_dir)
            target = gpu_uuid(args.move_to) if args.executor == "cuda" else ""
            remote["GPUPOOL_BENCH_MOVE_TO"] = f"{args.move_to},{target}"
        if args.profile:
            remote[_wire.ENV_PROFILE] = "1"

        def profile(kind: str) -> Path | None:  # each remote run's shim profile (--ring: both)
            name = f"shim-profile-{args.patterns.replace(',', '-')}{kind}.txt"
            return profile_dir / name if args.profile else None

        results["remote"] = run_child(
            {**remote, "GPUPOOL_SHIM_RING": "0"} if args.ring else remote, profile=profile("")
        )
        if args.repeat > 1:  # native and remote again, in turn: each row the median of the runs
            runs = {
                "native": [results["native"]] if "native" in results else [],
                "remote": [results["remote"]],
            }
            for i in range(2, args.repeat + 1):
                print(f"run {i} of {args.repeat} ...", flush=True)
                if runs["native"]:
                    runs["native"].append(run_child(env))
                runs["remote"].append(
                    run_child({**remote, "GPUPOOL_SHIM_RING": "0"} if args.ring else remote)
                )
            for side, each in runs.items():
                if each:
                    results[side], results[f"{side}_runs"] = median_of(each), each
        if args.ring:
            print("remote run over the command ring ...", flush=True)
            results["remote_ring"] = run_child({**remote, "GPUPOOL_SHIM_RING": "1"}, profile=profile("-ring"))
        for _ in range(100 if args.profile else 0):  # the worker writes its profile once the client left
            if any(profile_dir.glob(f"worker-{worker.pid}-*.txt")):
                break
            time.sleep(0.05)
    finally:
        worker.stop()
    report(results)
    if args.repeat > 1:
        print(
            f"\n(each value is the median of {args.repeat} runs, native and remote in turn; every run's values "
            "are in bench_remote.json)"
        )
    if "remote_ring" in results:
        print("\nover the command ring (GPUPOOL_SHIM_RING=1), same worker:")
        report({**results, "remote": results["remote_ring"]})
    return finish(results, started, "bench_remote.json")


def gpu_uuid(index: int) -> str:
    return subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", "-i", str(index)],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip


def patterns_arg(text: str) -> str:
    unknown = [p for p in text.split(",") if p not in PATTERNS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown pattern {unknown[0]!r}; choose from {', '.join(PATTERNS)}")
    return text


def machine() -> dict:
    """What the numbers ran on (a shared machine's load changes them)."""
    import platform

    model = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")),
        platform.processor(),
    )  # fmt: skip
    return {
        "cpus": os.cpu_count(),
        "cpu": model,
        "kernel": platform.release(),
        "load_average": os.getloadavg(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
    }


def netem_main(args) -> int:
    """The remote run across a shaped link between two network namespaces (module docstring)."""
    from netem_link import LinkOptions, NetemLink, raw_transfer, unavailable

    from server.workers import WorkerDevice, start_worker
    from virtualize.client.remote import fresh_shim, remote_env

    why = unavailable()
    if why:
        raise SystemExit(f"--netem: cannot make a link here: {why}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: the link's namespaces go with it
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="gpupool-bench-netem-"))
    shim = fresh_shim(work / "shim")
    env = bench_env(args)
    results: dict = {"machine_before": machine()}
    options = LinkOptions(rate=args.link_rate, delay=args.link_delay, mtu=args.mtu)
    with NetemLink(options) as link:
        results["link"] = link.shaping
        results["link_bits_per_s"] = _bits(args.link_rate)
        print(f"link: {link.shaping}", flush=True)
        raw_bytes = min(args.max_copy_mib << 20, 256 << 20)
        raw = {}
        for mode in ("plain", "tls"):
            for direction in ("htod", "dtoh"):
                rates = [raw_transfer(link, raw_bytes, to_worker=direction == "htod", tls=mode == "tls",
                                      loopback=mode == "plain") for _ in range(RAW_REPEATS)]  # fmt: skip
                raw[f"{mode}_{direction}"] = statistics.median(rates) / 1e9
                print(f"raw {mode} {direction}: {' '.join(f'{r / 1e9:.2f}' for r in rates)} GB/s", flush=True)
        results["raw_gb_s"] = raw
        uuid = ""
        if args.executor == "cuda":
            uuid = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", "-i", "0"],
                                  capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
        device = WorkerDevice(0, uuid, args.partition_mib << 20)
        worker = start_worker("bench", [device], bind_host="0.0.0.0", env={}, executor=args.executor,
                              prefix=link.prefix(link.worker_ns))  # fmt: skip
        try:
            for mode, address in (("tls", link.worker_ip), ("plain", link.worker_loopback_ip)):
                print(f"remote run across the link ({mode}, worker pid {worker.pid}) ...", flush=True)
                # Without netem the link has no delay of its own: a relay in the worker's namespace adds it.
                host, port = link.reach(worker.port, host=address)
                answer = {"id": "bench", "worker": worker.answer(host=host, port=port)}
                remote = {**env, **remote_env(answer, cache_root=work / "cache", library=shim)}
                remote.pop("GPUPOOL_WORKER_LOCAL", None)  # another namespace: TCP across the link
                remote["GPUPOOL_BENCH_WORKER_PID"] = str(worker.pid)
                results[mode] = run_child(remote, prefix=link.prefix(link.client_ns))
        finally:
            worker.stop()
        results["qdisc"] = link.qdisc_stats()
    results["machine_after"] = machine()
    report_netem(results)
    return finish(results, started, "bench_remote_netem.json")


def _bits(rate: str) -> float:
    """tc's rate units (25gbit, 100mbit, 1gbps) in bits per second."""
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12, "bit": 1, "kbps": 8e3, "mbps": 8e6,
             "gbps": 8e9, "bps": 8}  # fmt: skip
    for unit, scale in units.items():
        if rate.lower().endswith(unit):
            return float(rate[: -len(unit)]) * scale
    return float(rate)


def cpu_of(run: dict, size: int, direction: str) -> dict | None:
    """CPU s/GB of one row, where it means something: /proc counts 10 ms ticks, so only copies of
    16 MiB and up (256 MiB or more moved per row) are shown."""
    if size < 16 << 20:
        return None
    return run.get("cpu_s_per_gb", {}).get(str(size), {}).get(direction)


def cpu_sides(c: dict) -> str:
    """client 0.61 (kernel 0.40, 64 calls/MB), worker ...: where each side's CPU per GB went."""
    return ", ".join(
        f"{side} {c[side]:.2f}"
        + (
            f" (kernel {c[side + '_system']:.2f}, {c[side + '_calls_per_mb']:.0f} calls/MB)"
            if side + "_system" in c
            else ""
        )
        for side in ("client", "worker")
        if side in c
    )


def report_netem(results: dict) -> None:
    m = results["machine_before"]
    print(f"\nmachine: {m['cpus']} CPUs ({m['cpu']}), kernel {m['kernel']}, load average "
          f"{m['load_average'][0]:.2f} before, {results['machine_after']['load_average'][0]:.2f} after")  # fmt: skip
    print(f"link: {results['link']}")
    link = results["link_bits_per_s"] / 8e9
    raw = results["raw_gb_s"]
    print(f"raw capacity (one Python TCP stream, median of {RAW_REPEATS}, GB/s): plain HtoD {raw['plain_htod']:.2f}, DtoH "
          f"{raw['plain_dtoh']:.2f}; TLS HtoD {raw['tls_htod']:.2f}, DtoH {raw['tls_dtoh']:.2f}")  # fmt: skip
    print("\n| measure | plaintext | TLS 1.3 |")
    print("| --- | --- | --- |")
    for name, key, fmt in (("cuEventRecord + cuCtxSynchronize round trip (median)", "round_trip_us", "{:.1f} µs"),
                           ("cuStreamCreate round trip, answered in Python", "python_round_trip_us", "{:.1f} µs"),
                           ("empty-kernel launches, pipelined", "launches_per_s", "{:,.0f} /s")):  # fmt: skip
        if key in results["plain"] and key in results["tls"]:  # measured when --patterns asked for it
            print(f"| {name} | {fmt.format(results['plain'][key])} | {fmt.format(results['tls'][key])} |")
    # Copies into and from page-locked memory, 16 in flight: the rate, and as a share of the link.
    pipelined = [(k, name) for k, name in (("dtoh_async_pinned", "DtoH async into page-locked, 16 in flight"),
                                           ("htod_async_pinned", "HtoD async from page-locked, 4 streams, 16 in flight"))
                 if k in results["plain"] and k in results["tls"]]  # fmt: skip
    if pipelined:
        print(
            f"\n| copies in flight | plaintext GB/s | % of {link * 8:.0f} Gbit/s | TLS GB/s | % of {link * 8:.0f} Gbit/s |"
        )
        print("| --- | --- | --- | --- | --- |")
    for key, name in pipelined:
        for size in results["tls"][key]:
            plain, tls = results["plain"][key][size]["gb_s"], results["tls"][key][size]["gb_s"]
            label = f"{int(size) >> 20} MiB" if int(size) >= 1 << 20 else f"{int(size) >> 10} KiB"
            print(
                f"| {name}, {label} | {plain:.2f} | {plain / link * 100:.0f} % | {tls:.2f} | {tls / link * 100:.0f} % |"
            )
    if "bandwidth_gb_s" not in results["plain"]:  # --patterns without copies
        return
    print(f"\n| copy | plaintext GB/s | % of {link * 8:.0f} Gbit/s | % of raw | CPU s/GB client, worker | TLS GB/s "
          f"| % of {link * 8:.0f} Gbit/s | % of raw TLS | CPU s/GB client, worker |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for size in (s for s in SIZES if str(s) in results["plain"]["bandwidth_gb_s"]):
        label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
        for direction in ("htod", "dtoh"):
            cells = []
            for mode in ("plain", "tls"):
                r = results[mode]["bandwidth_gb_s"][str(size)][direction]
                c = cpu_of(results[mode], size, direction)
                cells += [
                    f"{r:.2f}",
                    f"{r / link * 100:.0f} %",
                    f"{r / raw[f'{mode}_{direction}'] * 100:.0f} %",
                    f"{c['client']:.2f}, {c['worker']:.2f}" if c else "-",
                ]
            print(f"| {direction.upper()} {label} | {' | '.join(cells)} |")

    # Small copies: one copy and one cuCtxSynchronize each, against the round trip alone. A copy to the
    # device is sent and not waited for (its bytes in the frame), so copy + sync is one round trip plus
    # the bytes; a copy to the host waits for its reply (bytes inline), and the synchronise after it,
    # with nothing sent since, is answered in the client: one round trip too.
    for mode in ("plain", "tls"):
        r = results[mode]
        small = [s for s in SIZES if s <= 64 << 10 and str(s) in r["bandwidth_gb_s"]]
        cells = [f"{d.upper()} {s >> 10} KiB {s / r['bandwidth_gb_s'][str(s)][d] / 1e3:.0f} µs"
                 for s in small for d in ("htod", "dtoh")]  # fmt: skip
        if cells:
            print(f"\nsmall copies, {mode}, copy + sync (median): {', '.join(cells)}; "
                  f"round trip {r['round_trip_us']:.0f} µs")  # fmt: skip


def report(results: dict) -> None:
    native, remote = results.get("native"), results["remote"]

    def row(name, key, unit, better_high, fmt="{:.1f}"):
        if key not in remote:  # --copies-only
            return
        r = remote[key]
        if native is None:
            print(f"| {name} | - | {fmt.format(r)} {unit} | - |")
            return
        n = native[key]
        pct = (r / n if better_high else n / r) * 100
        print(f"| {name} | {fmt.format(n)} {unit} | {fmt.format(r)} {unit} | {pct:.0f} % |")

    print("\n| measure | native | remote | remote as % of native |")
    print("| --- | --- | --- | --- |")
    row("cuEventRecord + cuCtxSynchronize round trip (median)", "round_trip_us", "µs", False)
    row("cuStreamCreate round trip, answered in Python (median)", "python_round_trip_us", "µs", False)
    row("the same round trip after copies into page-locked memory (median)", "round_trip_after_copies_us", "µs",
        False)  # fmt: skip
    row("empty-kernel launches, pipelined", "launches_per_s", "/s", True, "{:,.0f}")
    if "launches_after_move_per_s" in remote:
        after, move = remote["launches_after_move_per_s"], remote["move"]
        print(f"| empty-kernel launches after the lease moved GPU {move['from']} -> {move['to']} (paused "
              f"{move['pause_s']:.3f} s) | - | {after:,.0f} /s | {after / remote['launches_per_s'] * 100:.0f} % "
              "of the remote rate before the move |")  # fmt: skip
    row("compute-bound: 40 x ~2 ms kernels", "compute_bound_s", "s", False, "{:.3f}")
    row("launch-bound: 5 000 tiny kernels", "launch_bound_s", "s", False, "{:.3f}")
    row("graph replays (20 tiny kernels each), pipelined", "graph_replays_per_s", "/s", True, "{:,.0f}")
    row("event loop as do_bench: record, kernel, record; sync, elapsed", "event_loop_us", "µs", False)
    row("eager loop: ~15 µs host work, launch, memset, record; a copy back every 50 (a step)", "eager_step_us",
        "µs", False)  # fmt: skip
    row("eager loop: the launch call (median)", "eager_launch_call_us", "µs", False, "{:.2f}")
    for size in (s for s in SIZES if str(s) in remote.get("bandwidth_gb_s", {})):
        label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
        for direction in ("htod", "dtoh"):
            r = remote["bandwidth_gb_s"][str(size)][direction]
            n = native["bandwidth_gb_s"][str(size)][direction] if native else None
            pct = f"{r / n * 100:.0f} %" if n else "-"
            c = cpu_of(remote, size, direction)
            cpu = f" (CPU s/GB: {cpu_sides(c)})" if c else ""
            print(
                f"| {direction.upper()} {label} | {f'{n:.2f} GB/s' if n else '-'} | {r:.2f} GB/s{cpu} | {pct} |"
            )
    for key_of, title in (
        ("dtoh_async_pinned", "DtoH async into page-locked"),
        ("htod_async_pinned", "HtoD async from page-locked, 4 streams"),
    ):
        for size, r in remote.get(key_of, {}).items():
            label = f"{int(size) >> 20} MiB" if int(size) >= 1 << 20 else f"{int(size) >> 10} KiB"
            n = native[key_of][size] if native else None
            for what, key, unit in (
                ("call returns in (median)", "call_us", "µs"),
                ("16 in flight", "gb_s", "GB/s"),
            ):
                nat = f"{n[key]:.2f} {unit}" if n else "-"
                pct = f"{(r[key] / n[key] if key == 'gb_s' else n[key] / r[key]) * 100:.0f} %" if n else "-"
                print(f"| {title}, {label}: {what} | {nat} | {r[key]:.2f} {unit} | {pct} |")


if __name__ == "__main__":
    sys.exit(main())
