"""The Fleet view fed from a real `gpustat-collect --simulate N --prometheus 0` endpoint."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from test_console import settle, shown

from tui._prometheus import PrometheusFleet, parse_metrics
from tui._sources import SeriesOptions
from tui.app import ConsoleApp

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _collect_cmd(*args: str) -> list[str]:
    script = Path(sys.executable).parent / "gpustat-collect"
    if script.exists():
        return [str(script), *args]
    return [sys.executable, "-c", "import sys; from collector.cli import main; sys.exit(main())", *args]


@pytest.fixture
def collector(tmp_path):
    """A simulated 2-GPU collector serving /metrics on a free loopback port; yields that URL."""
    proc = subprocess.Popen(
        _collect_cmd(
            "--simulate",
            "2",
            "--out",
            str(tmp_path / "tele"),
            "--interval",
            "200ms",
            "--host",
            "simhost",
            "--prometheus",
            "0",
            "--prometheus-addr",
            "127.0.0.1",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    found: list[str] = []
    seen: list[str] = []

    def read():
        for line in proc.stdout:
            seen.append(line)
            match = re.search(r"serving /metrics on (http://\S+)", line)
            if match:
                found.append(match.group(1))

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 20
    while not found and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    if not found:
        proc.kill()
        pytest.fail("gpustat-collect did not serve /metrics:\n" + "".join(seen))
    _wait_for_first_tick(found[0], proc)
    yield found[0]
    proc.terminate()
    proc.wait(timeout=10)


def _wait_for_first_tick(url: str, proc: subprocess.Popen) -> None:
    """The page is served before the first sample lands; a loaded CI machine may take seconds."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        with urllib.request.urlopen(url, timeout=5) as resp:
            page = resp.read().decode()
        if page.count("gpupool_gpu_power_watts{") >= 2:
            time.sleep(0.4)  # one more tick, so the console's own history has two points
            return
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"gpustat-collect served {url} but no GPU sample reached it within 30 s")


def test_a_real_collector_page_parses_into_gpus(collector):
    fleet = PrometheusFleet([collector], SeriesOptions(minutes=1, buckets=10))
    first = fleet.snapshot()
    assert first.error is None
    assert [(g.host, g.gpu_index) for g in first.gpus] == [("simhost", 0), ("simhost", 1)]
    for g in first.gpus:
        assert g.simulated and g.state == "ok"
        assert 0 <= g.util_gpu <= 1 and g.mem_total_bytes > 0 and g.power_w > 0
    time.sleep(0.3)
    second = fleet.snapshot()
    key = ("simhost", second.gpus[0].gpu_uuid)
    assert sum(v is not None for v in second.util_series[key]) >= 1  # the console keeps its own history
    assert fleet.processes(key) == []


def test_parse_ignores_other_metrics_and_keeps_missing_values_missing():
    page = """
# TYPE gpupool_gpu_utilization_ratio gauge
gpupool_gpu_utilization_ratio{host="h",gpu="1",uuid="U1",name="A100"} 0.5
# TYPE gpupool_gpu_memory_total_bytes gauge
gpupool_gpu_memory_total_bytes{host="h",gpu="1",uuid="U1",name="A100"} 4.294967296e+10
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 12.0
"""
    from datetime import UTC, datetime

    (gpu,) = parse_metrics(page, datetime(2026, 1, 1, tzinfo=UTC))
    assert gpu.util_gpu == 0.5 and gpu.mem_total_bytes == 40 * 2**30 and gpu.gpu_index == 1
    assert gpu.sm_activity is None and gpu.power_w is None  # A100: no GPM, no power here: not zero
    assert not gpu.simulated


async def test_console_fleet_from_prometheus_and_an_unreachable_endpoint(collector):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    fleet = PrometheusFleet([collector, dead], timeout_s=1)
    app = ConsoleApp(fleet=fleet, refresh_s=None)
    async with app.run_test(size=(150, 44)) as pilot:
        await settle(pilot)
        assert [g[0] for g in shown(app, "fleet-gpus")] == ["simhost", "simhost"]
        status = str(app.query_one("#fleet-status").render())
        assert "unreachable" in status and "SIMULATED" in status
        assert "use --telemetry" in app.query_one("#fleet-procs").border_subtitle
