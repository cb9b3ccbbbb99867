"""How long a new process of a lease takes to its first allocation: one shared worker, and with
`gpuattach run --isolate` (GPUPOOL_ISOLATE=1: a worker process of its own, docs/remote.md "Isolation").

Each run starts a small Python program that loads the driver API through gpupool's libcuda.so.1,
retains the primary context and allocates 1 MiB. The first process of a lease is served by the lease's
worker either way and is not counted; later ones, under --isolate, get a worker started for them (or the
spare the lease's worker keeps waiting). Natively: the same program against the GPU's own driver.

    python bench/bench_process_start.py --executor host      # no GPU: the protocol and Python's costs
    python bench/bench_process_start.py --executor cuda      # on a GPU host: with CUDA's own start-up
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = (
    "import ctypes\n"
    "cu = ctypes.CDLL('libcuda.so.1')\n"
    "ctx, ptr = ctypes.c_uint64(), ctypes.c_uint64()\n"
    "assert cu.cuInit(0) == 0\n"
    "assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0\n"
    "assert cu.cuCtxSetCurrent(ctx) == 0\n"
    "assert cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_uint64(1 << 20)) == 0\n"
)


def timed(env: dict[str, str], runs: int, pause: float) -> list[float]:
    """Seconds from a process's start to its exit after the allocation, `runs` times, `pause` s apart."""
    seconds = []
    for _ in range(runs):
        time.sleep(pause)
        started = time.monotonic()
        subprocess.run([sys.executable, "-c", PROGRAM], env=env, check=True, timeout=120)
        seconds.append(time.monotonic() - started)
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--executor", default="host", choices=["host", "cuda"],
                        help="the worker's executor (cuda: on a GPU host, with a native run too)")  # fmt: skip
    parser.add_argument("--runs", type=int, default=10, help="processes timed in each mode (default 10)")
    parser.add_argument("--pause", type=float, default=1.0,
                        help="seconds between processes, as a program's own work would leave (default 1)")  # fmt: skip
    args = parser.parse_args()

    from server.workers import WorkerDevice, start_worker
    from virtualize.client.remote import fresh_shim, remote_env

    work = Path(tempfile.mkdtemp(prefix="gpupool-bench-start-"))
    shim = fresh_shim(work / "shim")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    rows = []
    if args.executor == "cuda":
        rows.append(("native", timed(env, args.runs, args.pause)))
    device = WorkerDevice(0, "", 1 << 30)
    for name, extra in (("one shared worker", {}), ("--isolate", {"GPUPOOL_ISOLATE": "1"})):
        worker = start_worker("bench-start", [device], bind_host="127.0.0.1", env={}, executor=args.executor)
        try:
            answer = {"id": "bench-start", "worker": worker.answer()}
            remote = {**env, **remote_env(answer, cache_root=work / "cache", library=shim), **extra}
            timed(remote, 1, 0)  # the lease's first process: served by its worker either way
            rows.append((name, timed(remote, args.runs, args.pause)))
        finally:
            worker.stop()
    print(f"| mode ({args.executor} executor) | median s | min s | max s |")
    print("| --- | --- | --- | --- |")
    for name, seconds in rows:
        print(f"| {name} | {statistics.median(seconds):.3f} | {min(seconds):.3f} | {max(seconds):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
