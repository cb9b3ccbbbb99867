"""GPU machine: native and remote runs of the same programs agree (tests/gpu/remote/run.py does the work)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


def test_remote_runs_match_native_runs_and_leases_hold():
    runner = Path(__file__).with_name("run.py")
    proc = subprocess.run([sys.executable, str(runner)], capture_output=True, text=True, timeout=1800)
    print(proc.stdout[-20000:])
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
