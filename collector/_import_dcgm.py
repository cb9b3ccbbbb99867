"""Import text dumps of a dcgm-exporter ``/metrics`` page into gpu_samples.

Each sample line is parsed with prometheus_client's text parser, one line at a time, so that a
malformed line is counted and reported and the rest of the dump still imports. GPUs are told apart
by their ``gpu``/``UUID`` labels; the host comes from the ``Hostname`` label (or ``--host``).
Units: DCGM reports percent for GPU_UTIL/MEM_COPY_UTIL, MiB for FB_*, watts, millijoules, MHz; the
PROF_* metrics are already ratios. A row (one GPU in one scrape) holding a value outside its column's
physical range (``collector.schema``: NaN, +Inf, 10^23 MiB, a 20-digit ``gpu`` label) is counted and
reported, never stored; the files' rows are stored all or none.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from collector._import_common import ImportReport, check_files, place_in_log_order, read_text, store
from collector.schema import GPU_SAMPLES, row_problem
from collector.writer import default_host

KIND = "dcgm"
MIB = 2**20

# DCGM field -> (column, factor to the base unit)
FIELDS: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("util_gpu_mean", 0.01),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("util_mem_mean", 0.01),
    "DCGM_FI_DEV_FB_USED": ("mem_used_bytes", MIB),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("energy_j", 0.001),
    "DCGM_FI_DEV_GPU_TEMP": ("temperature_c", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_hz", 1e6),
    "DCGM_FI_PROF_SM_ACTIVE": ("sm_activity", 1.0),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("sm_occupancy", 1.0),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("tensor_activity", 1.0),
    "DCGM_FI_DEV_DRAM_ACTIVE": ("dram_bw_util", 1.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("dram_bw_util", 1.0),
}
# Memory total is FB_USED + FB_FREE (+ FB_RESERVED where exported).
_FB_PARTS = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED")
_INT_COLUMNS = {"mem_used_bytes", "mem_total_bytes"}


def _gpu_key(labels: dict[str, str]) -> tuple[str, str] | None:
    gpu = labels.get("gpu")
    uuid = labels.get("UUID") or labels.get("uuid")
    if gpu is None and uuid is None:
        return None
    return (gpu or "", uuid or "")


class _Scrape:
    """Values of one scrape, keyed by (host, gpu key)."""

    def __init__(self):
        self.values: dict[tuple[str | None, tuple[str, str]], dict] = {}
        self.seen: set[tuple] = set()


def parse(text: str, name: str, report: ImportReport) -> list[tuple[_Scrape, float | None]]:
    """Scrapes of one dump (a metric seen again for the same GPU starts the next scrape)."""
    scrapes: list[tuple[_Scrape, float | None]] = [(_Scrape(), None)]
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            families = list(text_string_to_metric_families(stripped + "\n"))
            sample = families[0].samples[0]
        except (ValueError, IndexError, TypeError) as exc:
            report.bad(f"{name}:line {lineno}", f"not a Prometheus sample line ({exc})")
            continue
        if sample.name not in FIELDS and sample.name not in _FB_PARTS:
            continue
        key = _gpu_key(sample.labels)
        if key is None:
            report.bad(f"{name}:line {lineno}", f"{sample.name} has no gpu or UUID label")
            continue
        host = sample.labels.get("Hostname") or None
        scrape, ts = scrapes[-1]
        if (host, key, sample.name) in scrape.seen:
            scrape, ts = _Scrape(), None
            scrapes.append((scrape, ts))
        scrape.seen.add((host, key, sample.name))
        row = scrape.values.setdefault(
            (host, key),
            {
                "gpu_index": int(key[0]) if key[0].isascii() and key[0].isdigit() else None,
                "gpu_uuid": key[1] or None,
                "gpu_name": sample.labels.get("modelName"),
                "state": "ok",
                "source": KIND,
                "simulated": False,
                "_fb": {},
            },
        )
        if sample.timestamp is not None:
            scrapes[-1] = (scrape, float(sample.timestamp))
        if sample.name in _FB_PARTS:
            row["_fb"][sample.name] = sample.value
        if sample.name in FIELDS:
            column, factor = FIELDS[sample.name]
            value = sample.value * factor
            row[column] = _stored(column, value)
    return [(s, ts) for s, ts in scrapes if s.values]


def _stored(column: str, value: float) -> float | int:
    # Byte columns are whole numbers; NaN and infinities stay floats for the range check to refuse.
    return round(value) if column in _INT_COLUMNS and math.isfinite(value) else value


def _stamp(when: float) -> dt.datetime | str:
    """The scrape's time, or why it is not one (the row is then rejected for its ``ts``)."""
    try:
        return dt.datetime.fromtimestamp(when, dt.UTC)
    except (OverflowError, OSError, ValueError):
        return f"ts {when:g} (seconds since 1970) is not a time"


def import_files(files: list[Path], out: Path, *, host: str | None, interval_s: float | None) -> ImportReport:
    check_files(files)
    report = ImportReport()
    by_host: dict[str, list[dict]] = {}
    step = interval_s if interval_s is not None else 15.0  # dcgm-exporter's default collect interval
    for path in files:
        text = read_text(path)
        report.files += 1
        scrapes = parse(text, path.name, report)
        mtime = path.stat().st_mtime
        rows, positions, hosts = [], [], []  # the file's rows in log order
        for k, (scrape, ts) in enumerate(scrapes):
            # Without timestamps the scrapes of one file end at its mtime, `step` apart.
            when = ts if ts is not None else mtime - (len(scrapes) - 1 - k) * step
            stamp = _stamp(when)
            for (label_host, key), row in scrape.values.items():
                report.read += 1
                fb = row.pop("_fb")
                if "DCGM_FI_DEV_FB_USED" in fb and "DCGM_FI_DEV_FB_FREE" in fb:
                    row["mem_total_bytes"] = _stored("mem_total_bytes", sum(fb.values()) * MIB)
                where = f"{path.name}: scrape {k + 1}, gpu={key[0][:40]!r} UUID={key[1][:60]!r}"
                if isinstance(stamp, str):
                    report.reject(where, stamp)
                    continue
                row["ts"] = stamp
                why = row_problem(GPU_SAMPLES, row)
                if why:
                    report.reject(where, why)
                    continue
                rows.append(row)
                positions.append(f"scrape {k + 1}")
                hosts.append(_safe_host(host or label_host or default_host()))
        for row_host, row in place_in_log_order(rows, positions, hosts, path.name, report, step):
            by_host.setdefault(row_host, []).append(row)
    for rows in by_host.values():
        order: dict[str, int] = {}
        for row in rows:
            if row["gpu_index"] is None:
                row["gpu_index"] = order.setdefault(row["gpu_uuid"], len(order))
    store(out, by_host, report, KIND)
    return report


def _safe_host(name: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]", "-", name)[:200]
    return safe if safe.strip(".") else "unknown"  # never "", "." or ".." as a path component
