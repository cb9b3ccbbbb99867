"""Lease events (grant, deny, release, expire, reclaim) as ``pool_events`` telemetry rows and log lines.

Rows follow ``collector.schema.POOL_EVENTS``: one row per partition of the lease (so GPU-hours per GPU
add up), one row without a GPU for a denial. They go through the collector's ``TelemetryWriter`` into
the same directory layout the collector writes, so the report and the console read them like any
other telemetry. Without ``--telemetry`` events only go to the log.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading

log = logging.getLogger("gpupool.server")


class EventLog:
    def __init__(self, telemetry_dir, host: str, *, simulated: bool, flush_interval_s: float = 10.0):
        self.simulated = simulated
        self.host = host
        self.writer = None
        if telemetry_dir is not None:
            from collector import TelemetryWriter

            self.writer = TelemetryWriter(telemetry_dir, host, flush_interval_s=flush_interval_s)
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def _base(self, event: str, ts: float) -> dict:
        return {
            "ts": dt.datetime.fromtimestamp(ts, dt.UTC),
            "event": event,
            "source": "server",
            "simulated": self.simulated,
        }

    def _append(self, event: str, rows: list[dict]) -> None:
        with self._lock:
            self.counts[event] = self.counts.get(event, 0) + 1
        if self.writer is not None:
            self.writer.append("pool_events", rows)

    def deny(self, client: str, reason: str, ts: float, job: dict | None = None) -> None:
        log.info("deny client=%s%s: %s", client, _job_words(job), reason)
        self._append(
            "deny", [{**self._base("deny", ts), **_job_columns(job), "client": client, "reason": reason}]
        )

    def record(self, event: str, lease: dict, ts: float) -> None:
        created = dt.datetime.fromisoformat(lease["created_at"].replace("Z", "+00:00")).timestamp()
        duration = None if event == "grant" else max(0.0, ts - created)
        parts = ", ".join(f"GPU{p['gpu_index']}:{p['fraction']:.2f}" for p in lease["partitions"])
        log.info(
            "%s %s client=%s%s [%s]%s", event, lease["id"], lease["client"], _job_words(lease.get("job")), parts,
            f": {lease['reason']}" if event != "grant" and lease.get("reason") else "",
        )  # fmt: skip
        job = _job_columns(lease.get("job"))
        rows = [
            {
                **self._base(event, ts),
                **job,
                "lease_id": lease["id"],
                "client": lease["client"],
                "gpu_index": p["gpu_index"],
                "gpu_uuid": p["gpu_uuid"],
                "fraction": p["fraction"],
                "mem_bytes": p["mem_bytes"],
                "duration_s": duration,
                "reason": lease.get("reason") if event != "grant" else None,
            }
            for p in lease["partitions"]
        ]
        self._append(event, rows)

    def append_samples(self, gpu_rows: list[dict], process_rows: list[dict]) -> None:
        if self.writer is not None:
            self.writer.append("gpu_samples", gpu_rows)
            self.writer.append("process_samples", process_rows)

    def close(self) -> None:
        if self.writer is not None:
            try:
                self.writer.close()
            except Exception as exc:  # the telemetry disk failing must not hide the shutdown
                log.error("telemetry: could not flush pool events at shutdown: %s", exc)


def _job_columns(job: dict | None) -> dict:
    """The batch job a lease serves (server.api.Job) as pool_events columns; none: all null."""
    job = job or {}
    return {f"job_{key}": job.get(key) for key in ("scheduler", "id", "account", "user")}


def _job_words(job: dict | None) -> str:
    if not job:
        return ""
    account = f" account={job['account']}" if job.get("account") else ""
    return f" job={job['scheduler']}:{job['id']}{account}"
