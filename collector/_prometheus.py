"""Serve the latest samples at /metrics in Prometheus conventions, built at scrape time.

Metrics are declared once, as data (``GPU_METRICS``): name (ending in its base unit), the telemetry
column it shows, and help text. A scrape reads the collector's latest tick from ``LiveState``; nothing
is sampled on the scrape path, so scraping costs no NVML calls.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry


@dataclass(frozen=True)
class Metric:
    name: str
    column: str
    help: str


GPU_METRICS = (
    Metric(
        "gpupool_gpu_utilization_ratio",
        "util_gpu_mean",
        "Duty cycle (utilization.gpu), mean over the last tick.",
    ),
    Metric(
        "gpupool_gpu_utilization_max_ratio",
        "util_gpu_max",
        "Duty cycle, max driver sample over the last tick.",
    ),
    Metric("gpupool_gpu_memory_utilization_ratio", "util_mem_mean", "Memory-controller utilization, mean."),
    Metric("gpupool_gpu_memory_used_bytes", "mem_used_bytes", "Device memory in use (memory.used)."),
    Metric("gpupool_gpu_memory_total_bytes", "mem_total_bytes", "Device memory in total (memory.total)."),
    Metric("gpupool_gpu_power_watts", "power_w", "Power draw (power.draw)."),
    Metric("gpupool_gpu_temperature_celsius", "temperature_c", "GPU core temperature (temperature.gpu)."),
    Metric("gpupool_gpu_sm_clock_hertz", "sm_clock_hz", "SM clock (clocks.sm)."),
    Metric(
        "gpupool_gpu_sm_activity_ratio",
        "sm_activity",
        "GPM SM activity: SM cycles with a warp resident (Hopper+).",
    ),
    Metric(
        "gpupool_gpu_sm_occupancy_ratio", "sm_occupancy", "GPM SM occupancy: resident warps / max (Hopper+)."
    ),
    Metric("gpupool_gpu_tensor_activity_ratio", "tensor_activity", "GPM tensor pipe active ratio (Hopper+)."),
    Metric("gpupool_gpu_dram_bandwidth_ratio", "dram_bw_util", "GPM DRAM bandwidth used / peak (Hopper+)."),
)
LABELS = ("host", "gpu", "uuid", "name")
COLLECTOR_UP = "gpupool_collector_up"  # labels host, source, simulated
GPU_LOST = "gpupool_gpu_lost"


class LiveState:
    """The newest tick and the collector's counters, shared by the loop and the scrape thread."""

    def __init__(self, host: str, source: str, simulated: bool, interval_s: float):
        self.host, self.source, self.simulated, self.interval_s = host, source, simulated, interval_s
        self._lock = threading.Lock()
        self._gpu_rows: list[dict] = []
        self._process_counts: dict[int, int] = {}
        self.last_tick: float | None = None  # time.time() of the last successful tick
        self.samples_written = 0
        self.last_flush: float | None = None

    def update(self, gpu_rows: list[dict], process_rows: list[dict]) -> None:
        """Take one tick's rows. The NVML source hands out rows in batches (several ticks of a GPU at
        once, nothing in between), so the newest row of each GPU is kept until a newer one comes."""
        newest = {r["gpu_index"]: r for r in gpu_rows}  # rows come in time order: the last one wins
        counts: dict[int, int] = dict.fromkeys(newest, 0)
        for p in process_rows:
            row = newest.get(p["gpu_index"])
            if row is not None and p.get("ts") == row.get("ts"):
                counts[p["gpu_index"]] += 1
        with self._lock:
            if newest:
                merged = {r["gpu_index"]: r for r in self._gpu_rows} | newest
                self._gpu_rows = [merged[i] for i in sorted(merged)]
                self._process_counts = self._process_counts | counts
            self.last_tick = time.time()

    def snapshot(self) -> tuple[list[dict], dict[int, int], float | None]:
        with self._lock:
            return list(self._gpu_rows), dict(self._process_counts), self.last_tick


class TelemetryCollector(Collector):
    """A prometheus_client collector that turns the latest tick into metric families on each scrape."""

    def __init__(self, state: LiveState):
        self._state = state

    def collect(self):
        state = self._state
        rows, proc_counts, last_tick = state.snapshot()
        fresh = last_tick is not None and time.time() - last_tick < max(3 * state.interval_s, 5.0)
        up = GaugeMetricFamily(
            COLLECTOR_UP,
            "1 while the collector produced a tick within the last 3 intervals.",
            labels=["host", "source", "simulated"],
        )
        up.add_metric([state.host, state.source, str(state.simulated).lower()], 1.0 if fresh else 0.0)
        yield up
        written = CounterMetricFamily(
            "gpupool_collector_samples_written", "GPU and process rows written to telemetry.", labels=["host"]
        )
        written.add_metric([state.host], float(state.samples_written))
        yield written
        if state.last_flush is not None:
            flush = GaugeMetricFamily(
                "gpupool_collector_last_flush_timestamp_seconds",
                "When telemetry was last flushed.",
                labels=["host"],
            )
            flush.add_metric([state.host], state.last_flush)
            yield flush

        def labels(row: dict) -> list[str]:
            return [state.host, str(row["gpu_index"]), row.get("gpu_uuid") or "", row.get("gpu_name") or ""]

        lost = GaugeMetricFamily(
            GPU_LOST, "1 when the GPU stopped answering (fell off the bus).", labels=LABELS
        )
        procs = GaugeMetricFamily(
            "gpupool_gpu_processes", "Processes holding memory on the GPU.", labels=LABELS
        )
        for row in rows:
            lost.add_metric(labels(row), 1.0 if row.get("state") == "lost" else 0.0)
            procs.add_metric(labels(row), float(proc_counts.get(row["gpu_index"], 0)))
        yield lost
        yield procs
        for metric in GPU_METRICS:
            family = GaugeMetricFamily(metric.name, metric.help, labels=LABELS)
            for row in rows:
                value = row.get(metric.column)
                if value is not None:  # unsupported on this GPU: no sample rather than a fake 0
                    family.add_metric(labels(row), float(value))
            yield family


def serve(state: LiveState, port: int, addr: str = "0.0.0.0"):
    """Start the /metrics HTTP server in a daemon thread; returns the server (``.server_address``)."""
    from prometheus_client import start_http_server

    from collector._errors import CollectorError
    from collector.argtypes import listen_hint

    registry = CollectorRegistry()
    registry.register(TelemetryCollector(state))
    try:
        result = start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        raise CollectorError(
            f"cannot serve /metrics on {addr}:{port} ({exc.strerror or exc})",
            listen_hint(exc, "--prometheus-addr", "--prometheus PORT (0 picks a free one)"),
        ) from None
    return result[0] if isinstance(result, tuple) else result
