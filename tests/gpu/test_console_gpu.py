"""The console over a real GPU's telemetry (marked gpu: skipped where NVML does not start).

    python -m pytest tests/gpu/test_console_gpu.py -v

A real `gpustat-collect` samples the GPUs for a few seconds while a PyTorch loop keeps GPU 0 busy;
then the console's Fleet source and the app itself (Textual Pilot) must show every GPU with real
(not simulated) numbers, GPM SM activity on Hopper and later, and the busy process on GPU 0.
Needs torch, duckdb and textual (the lead's wheels) besides what the collector needs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.anyio]
pytest.importorskip("duckdb")
pytest.importorskip("textual")
pytest.importorskip("torch")

BUSY = """
import time, torch
x = torch.randn(8192, 8192, device="cuda:0")
t0 = time.time()
while time.time() - t0 < {seconds}:
    for _ in range(10):
        x = torch.tanh(x @ x * 1e-4)
    torch.cuda.synchronize()
"""


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Telemetry of 8 s of every GPU, GPU 0 busy with a GEMM loop; (dir, busy pid, inventory)."""
    from collector import read_inventory

    out = tmp_path_factory.mktemp("tele")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0"}
    busy = subprocess.Popen([sys.executable, "-c", BUSY.format(seconds=12)], env=env)
    time.sleep(3)  # CUDA context up, kernels running
    collect = [sys.executable, "-c", "import sys; from collector.cli import main; sys.exit(main())"]
    subprocess.run(
        [*collect, "--out", str(out), "--interval", "500ms", "--flush", "1s", "--duration", "8", "-q"],
        timeout=120,
        check=True,
    )
    pid = busy.pid
    busy.wait(timeout=60)
    return out, pid, read_inventory()


def test_fleet_source_shows_every_gpu_with_real_numbers(recorded):
    from tui._sources import TelemetryFleet

    out, pid, inventory = recorded
    snap = TelemetryFleet([out]).snapshot()
    assert snap.error is None
    assert sorted(g.gpu_uuid for g in snap.gpus) == sorted(g.uuid for g in inventory)
    by_index = {g.gpu_index: g for g in snap.gpus}
    busy = by_index[0]
    assert not busy.simulated and busy.state == "ok"
    assert busy.util_gpu is not None and busy.util_gpu > 0.2, busy
    assert busy.mem_used_bytes and busy.mem_total_bytes and busy.power_w and busy.temperature_c
    if "H100" in busy.gpu_name or "H200" in busy.gpu_name or "B200" in busy.gpu_name:
        assert busy.sm_activity is not None and busy.sm_activity > 0.05, busy  # GPM on Hopper+
    procs = TelemetryFleet([out]).processes((busy.host, busy.gpu_uuid))
    assert pid in [p.pid for p in procs], procs
    mine = next(p for p in procs if p.pid == pid)
    assert mine.user and mine.mem_used_bytes > 2**28


async def test_console_lists_the_gpus_and_the_busy_process(recorded):
    from tui._sources import TelemetryFleet
    from tui.app import ConsoleApp

    out, pid, inventory = recorded
    app = ConsoleApp(fleet=TelemetryFleet([out]), refresh_s=None)
    async with app.run_test(size=(160, 45)) as pilot:
        for _ in range(4):
            await app.workers.wait_for_complete()
            await pilot.pause()
        gpus = app.query_one("#fleet-gpus")
        assert len(gpus.shown_keys) == len(inventory)
        assert "SIMULATED" not in str(app.query_one("#fleet-status").render())
        assert str(pid) in app.query_one("#fleet-procs").shown_keys  # GPU 0 is selected first
        app.save_screenshot(str(Path(out) / "console-gpu.svg"))
