"""What one console refresh costs over a week of telemetry: the Fleet snapshot, the processes of a GPU,
and the History view's analytics for 24 h and 7 d.

    python bench/bench_console.py --gpus 8 --days 7 --repeat 10

Writes a simulated fleet with `gpustat-collect --backfill` into a temporary directory (or uses --dir),
then times the console's own data sources (tui._sources.TelemetryFleet, tui._history.HistorySource):
the same calls its workers make, without the UI. The refresh target: a Fleet refresh well under the
default 2 s interval, so the console never falls behind.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def row(name: str, samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    p50 = statistics.median(ms)
    return f"| {name} | {len(ms)} | {p50:.0f} ms | {ms[-1]:.0f} ms |"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--days", type=int, default=7)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--dir", type=Path, help="existing telemetry directory (skips the backfill)")
    args = ap.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tui._history import HistorySource
    from tui._sources import TelemetryFleet

    with tempfile.TemporaryDirectory() as tmp:
        tele = args.dir
        if tele is None:
            tele = Path(tmp) / "tele"
            collect = Path(sys.executable).parent / "gpustat-collect"
            t0 = time.perf_counter()
            subprocess.run(
                [
                    str(collect),
                    "--simulate",
                    str(args.gpus),
                    "--backfill",
                    f"{args.days}d",
                    "--duration",
                    "0.1",
                    "--out",
                    str(tele),
                    "-q",
                ],
                check=True,
                timeout=600,
            )
            print(f"backfilled {args.days} d x {args.gpus} GPUs in {time.perf_counter() - t0:.1f} s")
        segments = len(list(tele.glob("**/*.parquet")))
        fleet = TelemetryFleet([tele])
        first = timed(fleet.snapshot, 1)  # reads the segments of the last minutes once
        snap = fleet.snapshot()
        key = (snap.gpus[0].host, snap.gpus[0].gpu_uuid)
        history = HistorySource([tele])
        print(f"\n{segments} segments, {len(snap.gpus)} GPUs\n")
        print("| call | runs | p50 | max |")
        print("| --- | --- | --- | --- |")
        print(row("Fleet refresh, first (reads the last minutes)", first))
        print(row("Fleet refresh (latest per GPU + 2 sparkline series)", timed(fleet.snapshot, args.repeat)))
        print(row("processes of one GPU", timed(lambda: fleet.processes(key), args.repeat)))
        print(row("History 24h (fleet_summary + attribution)", timed(lambda: history.load("24h"), 3)))
        print(row("History 7d", timed(lambda: history.load("7d"), 3)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
