"""GPU machine: NVML tools, PyTorch and JAX inside a lease see the slice (tests/gpu/remote/nvml_slice.py does the work)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


def test_tools_and_frameworks_see_the_partition_remote_and_local():
    runner = Path(__file__).with_name("nvml_slice.py")
    proc = subprocess.run([sys.executable, str(runner)], capture_output=True, text=True, timeout=1500)
    print(proc.stdout[-20000:])
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
