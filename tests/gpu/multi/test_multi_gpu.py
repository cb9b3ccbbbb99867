"""GPU machine with two GPUs: many GPUs in one run, native and remote, agree (tests/gpu/multi/run.py
does the work; `servers` runs NCCL inside the ranks' processes over its socket transport, which is expected
to stall remotely (see docs/remote.md), so it decides no test; `spread` forwards NCCL to the workers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


def test_one_lease_of_two_gpus_trains_reduces_and_shards_as_natively():
    runner = Path(__file__).with_name("run.py")
    out = Path(tempfile.mkdtemp(prefix="gpupool-multi-"))
    proc = subprocess.run([sys.executable, str(runner), "--only", "vmm", "ddp", "allreduce", "tp", "isolate", "halves"],
                          env={**os.environ, "OUT": str(out)}, capture_output=True, text=True, timeout=1800)  # fmt: skip
    print(proc.stdout[-20000:])
    written = out / "multi_results.json"
    assert written.exists(), proc.stdout[-5000:] + proc.stderr[-5000:]
    results = json.loads(written.read_text())
    assert results and all(r["status"] == "PASS" for r in results), proc.stdout[-5000:] + proc.stderr[-5000:]


def test_spread_runs_nccl_in_the_workers_connected_server_to_server():
    """Two servers each owning one GPU, `gpuattach run -n 2 --spread`: DDP over gloo and over forwarded NCCL
    trains with the native losses, NCCL ran in the workers (not the ranks' processes), and all_reduce of
    1 MiB to 1 GiB completes across the two servers."""
    runner = Path(__file__).with_name("run.py")
    out = Path(tempfile.mkdtemp(prefix="gpupool-spread-"))
    proc = subprocess.run([sys.executable, str(runner), "--only", "spread"], env={**os.environ, "OUT": str(out)},
                          capture_output=True, text=True, timeout=1800)  # fmt: skip
    print(proc.stdout[-20000:])
    written = out / "multi_results.json"
    assert written.exists(), proc.stdout[-5000:] + proc.stderr[-5000:]
    results = json.loads(written.read_text())
    assert results and all(r["status"] == "PASS" for r in results), proc.stdout[-5000:] + proc.stderr[-5000:]
