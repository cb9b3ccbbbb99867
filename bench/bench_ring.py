"""The command ring's round trip against the local socket's: python bench/bench_ring.py  (< 1 min, no GPU)

Two processes exchange what a program and its worker on one host exchange for one call — a synchronising
call's frame and its 24-byte reply, a 4 KiB copy to the device (its bytes in the frame), a 4 KiB copy to
the host (its bytes in the reply) — over a Unix socket pair, then over the command ring
(virtualize/common/include/gp_ring.h, the shim's and the worker's own code), with nothing else done:
the transport alone, which `bench_remote.py --ring` measures with the worker's dispatch and the driver
on top. Each end polls (socket) or spins (ring) for `--spin-us` before it sleeps, as the shim and the
worker do (GPUPOOL_SHIM_SPIN_US, GPUPOOL_WORKER_SPIN_US); the table has a row for no polling too.
Medians of `--repeats` runs of `--rounds` round trips each, µs; the 99th percentile beside it.

Needs a C compiler (cc). On a machine whose CPUs are busy with other work, spinning numbers say little.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = Path(__file__).with_name("ring_pingpong.c")
HEADER, REPLY, COPY_ARGS = 24, 16, 24  # _wire.REQUEST, _wire.REPLY, a copy's (address, count, stream)
EXCHANGES = {  # name: (request bytes, reply bytes)
    "synchronise (frame, reply)": (HEADER + 8, REPLY),
    "4 KiB copy to the device (bytes in the frame)": (HEADER + COPY_ARGS + 4096, REPLY),
    "4 KiB copy to the host (bytes in the reply)": (HEADER + COPY_ARGS, REPLY + 4096),
}


def build(work: Path) -> Path:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise SystemExit("bench_ring: no C compiler (cc) to build bench/ring_pingpong.c")
    out = work / "ring_pingpong"
    subprocess.run([cc, "-O2", "-std=gnu11", "-o", str(out), str(SOURCE)], check=True)
    return out


def measure(binary: Path, transport: str, rounds: int, spin_ns: int, ask: int, answer: int, repeats: int):
    runs = []
    for _ in range(repeats):
        proc = subprocess.run(
            [str(binary), transport, str(rounds), str(spin_ns), str(ask), str(answer)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if proc.returncode != 0:
            raise SystemExit(f"bench_ring: {transport} run failed: {proc.stderr.strip()}")
        runs.append(tuple(map(float, proc.stdout.split())))
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20000, help="round trips per run (default 20000)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per cell, the median taken (default 3)")
    parser.add_argument(
        "--spin-us", type=int, default=40, help="polling / spinning before sleeping (default 40)"
    )
    args = parser.parse_args()
    if args.rounds < 100 or args.repeats < 1 or args.spin_us < 0:
        parser.error("--rounds must be at least 100, --repeats at least 1, --spin-us not negative")
    results = {"cpus": os.cpu_count(), "rows": []}
    with tempfile.TemporaryDirectory(prefix="gpupool-bench-ring-") as work:
        binary = build(Path(work))
        print(f"{os.cpu_count()} CPUs; {args.repeats} x {args.rounds} round trips per cell\n")
        print("| exchange | polling | socket µs (p99) | ring µs (p99) | ring's time as % of the socket's |")
        print("| --- | --- | --- | --- | --- |")
        for name, (ask, answer) in EXCHANGES.items():
            for spin_us in sorted({0, args.spin_us}):
                cells = {t: measure(binary, t, args.rounds, spin_us * 1000, ask, answer, args.repeats)
                         for t in ("socket", "ring")}  # fmt: skip
                (s, s99), (r, r99) = cells["socket"], cells["ring"]
                print(f"| {name} | {spin_us} µs | {s:.2f} ({s99:.1f}) | {r:.2f} ({r99:.1f}) | {r / s * 100:.0f} % |",
                      flush=True)  # fmt: skip
                results["rows"].append({"exchange": name, "spin_us": spin_us, "socket_us": cells["socket"],
                                        "ring_us": cells["ring"]})  # fmt: skip
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "bench_ring.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
