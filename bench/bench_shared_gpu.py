"""One GPU shared by four remote quarter-leases: python bench/bench_shared_gpu.py  (GPU machine, ~3 min)

Runs the ResNet-50 training of `bench/train_models.py` (bf16, batch 64) natively on the whole GPU,
then four copies at once, each through `gpuattach run -n 1 -p 0.25` against a real gpupool-server on
this host (remote execution: the program's CUDA calls go to the lease's worker), and reports each
run's images/s, their sum, and the sum as % of the whole-GPU run (issue 12's target: >= 95 %).
`--mps` starts the server with CUDA MPS (partitions' memory enforced, SMs shared by the driver's MPS
scheduler); without it the four workers time-share the GPU. Results: a table on stdout, JSON in $OUT.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "gpu" / "remote"))

from _pool import pool_server  # noqa: E402

TRAIN = str(ROOT / "bench" / "train_models.py")


def throughput(out: str) -> float:
    summary = next((json.loads(line) for line in out.splitlines() if line.startswith("{")), {})
    return float(summary.get("throughput", 0.0))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--leases", type=int, default=4, help="concurrent leases (default 4)")
    parser.add_argument("--steps", type=int, default=120, help="training steps per run (default 120)")
    parser.add_argument("--mps", action="store_true", help="the pool server enforces partitions with MPS")
    args = parser.parse_args()
    fraction = f"{1 / args.leases:.2f}"
    train = [sys.executable, TRAIN, "resnet50", "--steps", str(args.steps)]
    env = dict(os.environ)

    started = time.monotonic()
    native = subprocess.run(train, env=env, capture_output=True, text=True, timeout=900)
    whole = throughput(native.stdout)
    print(f"whole GPU, native: {whole:.1f} images/s (exit {native.returncode})", flush=True)

    work = Path(tempfile.mkdtemp(prefix="gpupool-shared-"))
    with pool_server(work, env, ["--mps"] if args.mps else []) as attach:
        procs = [
            subprocess.Popen(
                [*attach(fraction), *train],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(args.leases)
        ]
        outs = [p.communicate(timeout=1800) for p in procs]
    each = [throughput(out) for out, _ in outs]
    for i, ((_, err), p) in enumerate(zip(outs, procs, strict=True)):
        if p.returncode != 0:
            print(f"lease {i}: exit {p.returncode}\n" + "\n".join(err.splitlines()[-15:]), flush=True)
    total = sum(each)
    ratio = total / whole if whole else 0.0
    print(
        f"\n| {args.leases} x {fraction} remote leases at once (each) | sum | whole GPU native | sum / whole |"
    )
    print("| --- | --- | --- | --- |")
    print(
        f"| {', '.join(f'{x:.1f}' for x in each)} images/s | {total:.1f} | {whole:.1f} | {100 * ratio:.1f} % |"
    )
    result = {"each": each, "sum": total, "whole": whole, "ratio": ratio, "mps": args.mps,
              "seconds": time.monotonic() - started}  # fmt: skip
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "shared_gpu.json").write_text(json.dumps(result, indent=2))
    return 0 if all(p.returncode == 0 for p in procs) and native.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
