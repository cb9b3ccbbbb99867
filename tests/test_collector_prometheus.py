"""/metrics over real HTTP from a running gpustat-collect, parsed with prometheus_client's parser."""

from __future__ import annotations

import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from collector._prometheus import GPU_METRICS, LiveState, TelemetryCollector

CLI = [sys.executable, "-m", "collector.cli"]


def scrape(url: str) -> dict[str, list]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


@pytest.fixture
def collector(tmp_path):
    proc = subprocess.Popen(
        [*CLI, "--simulate", "4", "--interval", "0.2s", "--prometheus", "0", "--prometheus-addr", "127.0.0.1",
         "--host", "sim-1", "--out", str(tmp_path / "tele")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True).start()
    url = None
    deadline = time.monotonic() + 30
    while url is None and time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            continue
        match = re.search(r"serving /metrics on (http://127\.0\.0\.1:\d+/metrics)", line)
        url = match.group(1) if match else None
    assert url, "the collector did not announce its /metrics address"
    while time.monotonic() < deadline:  # until the first ticks are in (a loaded machine may take a while)
        if scrape(url)["gpupool_collector_up"][0].value == 1.0:
            break
        time.sleep(0.2)
    yield url
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0


def test_metrics_follow_prometheus_conventions(collector):
    families = scrape(collector)
    (up,) = families["gpupool_collector_up"]
    assert up.value == 1.0 and up.labels == {"host": "sim-1", "source": "simulated", "simulated": "true"}
    mem = families["gpupool_gpu_memory_used_bytes"]
    assert sorted(s.labels["gpu"] for s in mem) == ["0", "1", "2", "3"]
    assert set(mem[0].labels) == {"host", "gpu", "uuid", "name"}
    assert all(s.labels["uuid"].startswith("GPU-") and s.labels["host"] == "sim-1" for s in mem)
    totals = {s.labels["gpu"]: s.value for s in families["gpupool_gpu_memory_total_bytes"]}
    assert all(v > 70 * 2**30 for v in totals.values())  # bytes, not MiB
    assert all(0.0 <= s.value <= 1.0 for s in families["gpupool_gpu_utilization_ratio"])  # ratio, not percent
    assert all(50 < s.value < 800 for s in families["gpupool_gpu_power_watts"])
    # GPU 3 is an A100 in the simulated fleet: no GPM, so no sample at all rather than a made-up 0
    assert sorted(s.labels["gpu"] for s in families["gpupool_gpu_sm_activity_ratio"]) == ["0", "1", "2"]
    for metric in GPU_METRICS:
        assert metric.name in families
        assert re.search(r"_(bytes|ratio|watts|celsius|hertz)$", metric.name), metric.name
    written = families["gpupool_collector_samples_written"]
    assert written[0].name == "gpupool_collector_samples_written_total"


def test_values_are_built_at_scrape_time(collector):
    first = {s.labels["gpu"]: s.value for s in scrape(collector)["gpupool_gpu_power_watts"]}
    time.sleep(1.2)
    second = {s.labels["gpu"]: s.value for s in scrape(collector)["gpupool_gpu_power_watts"]}
    assert first != second  # the simulated power jitters every second; a frozen page would not


def test_gpus_keep_their_newest_row_between_batches():
    # NVML rows arrive in batches of several ticks, with ticks of no rows in between
    state = LiveState("h", "nvml", False, interval_s=1.0)
    batch = [
        {
            "gpu_index": g,
            "gpu_uuid": f"GPU-{g}",
            "gpu_name": "X",
            "state": "ok",
            "ts": t,
            "power_w": 100.0 + t,
        }
        for t in (1, 2)
        for g in (0, 1)
    ]
    state.update(batch, [{"gpu_index": 0, "ts": 1}, {"gpu_index": 0, "ts": 2}, {"gpu_index": 0, "ts": 2}])
    state.update([], [])  # a tick whose rows wait for the next ring read
    rows, procs, _ = state.snapshot()
    assert [(r["gpu_index"], r["power_w"]) for r in rows] == [(0, 102.0), (1, 102.0)]
    assert procs == {0: 2, 1: 0}  # the processes of the newest tick, not of the whole batch


def test_up_is_0_when_the_collector_stopped_ticking():
    state = LiveState("h", "nvml", False, interval_s=1.0)
    families = {f.name: f for f in TelemetryCollector(state).collect()}
    assert families["gpupool_collector_up"].samples[0].value == 0.0  # never ticked
    state.update([{"gpu_index": 0, "gpu_uuid": "GPU-x", "gpu_name": "X", "state": "lost"}], [])
    families = {f.name: f for f in TelemetryCollector(state).collect()}
    assert families["gpupool_collector_up"].samples[0].value == 1.0
    assert families["gpupool_gpu_lost"].samples[0].value == 1.0
    state.last_tick -= 60
    families = {f.name: f for f in TelemetryCollector(state).collect()}
    assert families["gpupool_collector_up"].samples[0].value == 0.0


def test_a_port_in_use_is_one_clear_error(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [*CLI, "--simulate", "1", "--duration", "2", "--prometheus", str(port), "--prometheus-addr", "127.0.0.1",
             "--out", str(tmp_path)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"gpustat-collect: error: cannot serve /metrics on 127.0.0.1:{port} (Address already in use)"
        )
    )


def test_an_address_that_does_not_resolve_blames_the_address(tmp_path):
    """--prometheus-addr with a name that does not resolve: one line whose hint names the address
    option, not another port."""
    proc = subprocess.run(
        [*CLI, "--simulate", "1", "--duration", "2", "--prometheus", "0", "--prometheus-addr", "no-such-host.invalid",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("gpustat-collect: error: cannot serve /metrics on no-such-host.invalid:0"), last
    assert "--prometheus-addr must be" in last and "another" not in last
