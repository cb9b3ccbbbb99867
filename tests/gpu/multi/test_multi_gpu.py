"""GPU machine with two GPUs: many GPUs in one run, native and remote, agree (tests/gpu/multi/run.py
does the work; the steps across servers over NCCL's socket transport are expected to fail remotely,
see docs/remote.md, so only the one-server steps decide this test)."""

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
    proc = subprocess.run([sys.executable, str(runner), "--only", "vmm", "ddp", "allreduce", "tp", "halves"],
                          env={**os.environ, "OUT": str(out)}, capture_output=True, text=True, timeout=1800)  # fmt: skip
    print(proc.stdout[-20000:])
    written = out / "multi_results.json"
    assert written.exists(), proc.stdout[-5000:] + proc.stderr[-5000:]
    results = json.loads(written.read_text())
    assert results and all(r["status"] == "PASS" for r in results), proc.stdout[-5000:] + proc.stderr[-5000:]
