"""What each NVML query of the collector costs, in CPU and wall time, on this host's GPU 0.

    python bench/nvml_call_costs.py [--calls 200]

Explains the collector's per-sample CPU cost (bench/bench_collector.py --nvml): each NvmlBackend
method is called --calls times and timed with process_time (CPU, user + system: NVML's ioctls count)
and perf_counter (wall); then 20 ticks of the NVML source at 1 Hz are profiled with cProfile.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from collector._nvml import NvmlBackend


def timed(calls: int, func) -> tuple[float, float]:
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(calls):
        func()
    return (time.process_time() - cpu0) / calls * 1e6, (time.perf_counter() - wall0) / calls * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=200)
    args = p.parse_args()
    b = NvmlBackend()
    b.start()
    since = 0
    sample = b.gpm_sample(0)
    queries = {
        "memory": lambda: b.memory(0),
        "power_w": lambda: b.power_w(0),
        "temperature_c": lambda: b.temperature_c(0),
        "sm_clock_hz": lambda: b.sm_clock_hz(0),
        "utilization_samples(gpu, all)": lambda: b.utilization_samples(0, "gpu", since),
        "utilization_samples(memory, all)": lambda: b.utilization_samples(0, "memory", since),
        "utilization_rates": lambda: b.utilization_rates(0),
        "processes": lambda: b.processes(0),
        "process_utilization(all)": lambda: b.process_utilization(0, since),
        "gpm_sample+free": lambda: b.gpm_free(b.gpm_sample(0)),
        "gpm_metrics": lambda: b.gpm_metrics(sample, b.gpm_sample(0)),
        "energy_j": lambda: b.energy_j(0),
    }
    print("| query | CPU µs/call | wall µs/call |\n| --- | --- | --- |")
    for name, func in queries.items():
        calls = 10 if name == "energy_j" else args.calls
        cpu, wall = timed(calls, func)
        print(f"| {name} | {cpu:.1f} | {wall:.1f} |")

    # How much history each ring holds decides how rarely it may be read without losing samples.
    for kind in ("gpu", "memory"):
        ring = b.utilization_samples(0, kind, 0) or []
        if ring:
            span = (ring[-1][0] - ring[0][0]) / 1e6
            print(
                f"ring {kind}: {len(ring)} samples over {span:.1f} s (one per {span / max(len(ring) - 1, 1) * 1e3:.0f} ms)"
            )

    from collector._nvml_source import NvmlSource

    source = NvmlSource(interval_s=1.0)
    source.sample(dt.datetime.now(dt.UTC))
    prof = cProfile.Profile()
    cpu0 = time.process_time()
    for _ in range(20):
        time.sleep(1.0)
        prof.enable()
        source.sample(dt.datetime.now(dt.UTC))
        prof.disable()
    print(
        f"\nsource.sample: {(time.process_time() - cpu0) / 20 * 1e3:.2f} ms CPU per tick (incl. sleep overhead)"
    )
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(15)
    print(out.getvalue())
    source.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
