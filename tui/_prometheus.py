"""The Fleet view from collectors' Prometheus /metrics endpoints (``--prometheus URL``).

For hosts whose telemetry directory the operator cannot read: each refresh scrapes every endpoint,
and the console keeps the last minutes of samples itself for the sparklines. Prometheus carries no
per-process details (only a count per GPU), so the processes table says to use telemetry for them.
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Sequence
from datetime import datetime, timedelta

from prometheus_client.parser import text_string_to_metric_families

from analytics.live import GpuNow, ProcessNow
from collector import COLLECTOR_UP, GPU_LOST, GPU_METRICS
from tui._sources import Clock, FleetSnapshot, GpuKey, SeriesOptions, utc_now

# The telemetry column behind each exported metric (collector.GPU_METRICS, named there once) -> GpuNow field.
FIELD_OF_COLUMN = {
    "util_gpu_mean": "util_gpu",
    "sm_activity": "sm_activity",
    "mem_used_bytes": "mem_used_bytes",
    "mem_total_bytes": "mem_total_bytes",
    "power_w": "power_w",
    "temperature_c": "temperature_c",
}
METRICS = {m.name: FIELD_OF_COLUMN[m.column] for m in GPU_METRICS if m.column in FIELD_OF_COLUMN}
METRICS[GPU_LOST] = "lost"
INT_FIELDS = {"mem_used_bytes", "mem_total_bytes"}


def metrics_url(url: str) -> str:
    """A collector address or its /metrics URL -> the /metrics URL."""
    return url if url.rstrip("/").endswith("/metrics") else url.rstrip("/") + "/metrics"


def parse_metrics(text: str, at: datetime) -> list[GpuNow]:
    """GPUs in a /metrics page of gpustat-collect, sorted by host and index."""
    gpus: dict[GpuKey, dict] = {}
    simulated_hosts: set[str] = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == COLLECTOR_UP and labels.get("simulated") == "true":
                simulated_hosts.add(labels.get("host", ""))
            field = METRICS.get(sample.name)
            if field is None or "uuid" not in labels:
                continue
            key = (labels.get("host", ""), labels["uuid"])
            gpu = gpus.setdefault(
                key, {"index": int(labels.get("gpu", "0") or 0), "name": labels.get("name", "")}
            )
            gpu[field] = int(sample.value) if field in INT_FIELDS else float(sample.value)
    return [
        GpuNow(
            host=host,
            gpu_index=g["index"],
            gpu_uuid=uuid,
            gpu_name=g["name"],
            state="lost" if g.get("lost") else "ok",
            ts=at,
            util_gpu=g.get("util_gpu"),
            sm_activity=g.get("sm_activity"),
            mem_used_bytes=g.get("mem_used_bytes"),
            mem_total_bytes=g.get("mem_total_bytes"),
            power_w=g.get("power_w"),
            temperature_c=g.get("temperature_c"),
            simulated=host in simulated_hosts,
        )
        for (host, uuid), g in sorted(gpus.items(), key=lambda kv: (kv[0][0], kv[1]["index"]))
    ]


class PrometheusFleet:
    """The fleet scraped from collectors; sparklines from the samples this console has seen."""

    def __init__(
        self,
        urls: Sequence[str],
        series: SeriesOptions | None = None,
        *,
        timeout_s: float = 3.0,
        clock: Clock = utc_now,
    ):
        self.urls = [metrics_url(u) for u in urls]
        self.series = series or SeriesOptions()
        self.timeout_s = timeout_s
        self.clock = clock
        self.label = "prometheus: " + ", ".join(self.urls)
        self.process_details = False
        self._history: dict[GpuKey, deque[tuple[datetime, float | None, float | None]]] = {}
        self._lock = threading.Lock()

    def _scrape(self, url: str) -> str:
        request = urllib.request.Request(url, headers={"User-Agent": "gpupool-console"})
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
            return response.read().decode("utf-8", "replace")

    def snapshot(self) -> FleetSnapshot:
        now = self.clock()
        gpus: list[GpuNow] = []
        errors = []
        for url in self.urls:
            try:
                gpus += parse_metrics(self._scrape(url), now)
            except (urllib.error.URLError, OSError) as exc:
                errors.append(f"{url} unreachable: {getattr(exc, 'reason', exc)}")
            except Exception as exc:  # not a Prometheus page (or not gpustat-collect's)
                errors.append(f"{url}: not a gpustat-collect /metrics page ({exc})")
        with self._lock:
            util, sm = self._remember(gpus, now)
        error = "; ".join(errors) + " (retrying)" if errors else None
        return FleetSnapshot(self.label, gpus, util, sm, now if gpus else None, error)

    def _remember(self, gpus: list[GpuNow], now: datetime):
        window = timedelta(minutes=self.series.minutes)
        for g in gpus:
            self._history.setdefault((g.host, g.gpu_uuid), deque()).append((now, g.util_gpu, g.sm_activity))
        util, sm = {}, {}
        n = self.series.buckets
        start = now - window
        for key, samples in self._history.items():
            while samples and samples[0][0] <= start:
                samples.popleft()
            sums = [[0.0, 0, 0.0, 0] for _ in range(n)]
            for ts, u, s in samples:
                i = min(n - 1, int((ts - start) / window * n))
                if u is not None:
                    sums[i][0] += u
                    sums[i][1] += 1
                if s is not None:
                    sums[i][2] += s
                    sums[i][3] += 1
            util[key] = [b[0] / b[1] if b[1] else None for b in sums]
            sm[key] = [b[2] / b[3] if b[3] else None for b in sums]
        return util, sm

    def processes(self, key: GpuKey) -> list[ProcessNow]:
        return []  # /metrics has per-GPU process counts only; telemetry directories have the details
