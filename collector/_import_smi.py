"""Import ``nvidia-smi --query-gpu=... --format=csv`` logs into gpu_samples.

Handles: units in the header and values (``utilization.gpu [%]``, ``35 %``, ``1234 MiB``) or not
(``--format=csv,nounits``), the header repeated by ``-l`` loops, ``[N/A]`` / ``[Not Supported]`` /
``N/A`` as null. Percent becomes a ratio 0–1, MiB bytes, MHz hertz. A line that does not parse, or
that holds a value outside its column's physical range (``collector.schema``), is counted and
reported, never silently dropped and never stored.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import math
import re
from collections.abc import Callable
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from collector._errors import InputError
from collector._import_common import ImportReport, check_files, place_in_log_order, read_text, store
from collector.schema import GPU_SAMPLES, row_problem

KIND = "nvidia-smi"
_NULLS = {
    "[n/a]",
    "n/a",
    "[not supported]",
    "not supported",
    "[unknown error]",
    "[gpu is lost]",
    "",
    "[insufficient permissions]",
}
_UNIT_FACTORS = {
    "%": 0.01,
    "mib": 2**20,
    "gib": 2**30,
    "kib": 2**10,
    "b": 1,
    "w": 1.0,
    "mhz": 1e6,
    "ghz": 1e9,
    "c": 1.0,
}


def _number(text: str, default_factor: float) -> float | None:
    """'35 %' -> 0.35 (with factor), '[N/A]' -> None; ValueError for anything else."""
    value = text.strip()
    if value.lower() in _NULLS:
        return None
    match = re.fullmatch(r"([-+]?\d+(?:\.\d+)?)\s*([A-Za-z%]*)", value)
    if not match:
        raise ValueError(f"not a number: {value!r}")
    unit = match.group(2).lower()
    factor = _UNIT_FACTORS.get(unit) if unit else default_factor
    if factor is None:
        raise ValueError(f"unknown unit {match.group(2)!r} in {value!r}")
    return float(match.group(1)) * factor


def _text(text: str) -> str | None:
    value = text.strip()
    return None if value.lower() in _NULLS else value


# nvidia-smi field -> (column, parser(value text) -> python value)
def _num(column_factor: float, kind: type = float) -> Callable[[str], object]:
    def parse(text: str):
        value = _number(text, column_factor)
        if value is None or not math.isfinite(value):  # 400 digits: inf, refused by the range check
            return value
        return kind(round(value) if kind is int else value)

    return parse


FIELDS: dict[str, tuple[str, Callable[[str], object]]] = {
    "index": ("gpu_index", _num(1, int)),
    "uuid": ("gpu_uuid", _text),
    "gpu_uuid": ("gpu_uuid", _text),
    "name": ("gpu_name", _text),
    "gpu_name": ("gpu_name", _text),
    "utilization.gpu": ("util_gpu_mean", _num(0.01)),
    "utilization.memory": ("util_mem_mean", _num(0.01)),
    "memory.used": ("mem_used_bytes", _num(2**20, int)),
    "memory.total": ("mem_total_bytes", _num(2**20, int)),
    "power.draw": ("power_w", _num(1.0)),
    "power.draw.instant": ("power_w", _num(1.0)),
    "power.draw.average": ("power_w", _num(1.0)),
    "temperature.gpu": ("temperature_c", _num(1.0)),
    "clocks.sm": ("sm_clock_hz", _num(1e6)),
    "clocks.current.sm": ("sm_clock_hz", _num(1e6)),
}
_TS_FORMATS = ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S", "%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%d %H:%M:%S")


def _field_name(header_cell: str) -> str:
    return re.sub(r"\s*\[.*\]\s*$", "", header_cell.strip()).lower()


def _zone(tz: str | None) -> dt.tzinfo:
    if tz is None:
        return dt.datetime.now().astimezone().tzinfo  # this machine's zone, as nvidia-smi printed it
    if tz.upper() == "UTC":
        return dt.UTC
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise InputError(
            f"unknown time zone {tz!r}", "use an IANA name such as UTC or Europe/Berlin"
        ) from None


def _timestamp(text: str, zone: dt.tzinfo) -> dt.datetime:
    value = text.strip()
    for fmt in _TS_FORMATS:
        try:
            naive = dt.datetime.strptime(value, fmt)
        except ValueError:
            continue
        try:
            return naive.replace(tzinfo=zone).astimezone(dt.UTC)
        except OverflowError:  # year 1 or 9999 shifted out of the calendar: the range check refuses it
            return naive.replace(tzinfo=dt.UTC)
    raise ValueError(f"not a timestamp: {value!r}")


def parse(text: str, name: str, report: ImportReport, zone: dt.tzinfo) -> tuple[list[dict], list[str]]:
    """Rows of one nvidia-smi CSV text and where each is ("line N"); malformed lines are counted in
    ``report``."""
    rows: list[dict] = []
    positions: list[str] = []
    header: list[str] | None = None
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            cells = next(csv.reader(io.StringIO(line), skipinitialspace=True))
        except (csv.Error, StopIteration) as exc:
            report.read += 1
            report.bad(f"{name}:line {lineno}", str(exc))
            continue
        # only a line naming "timestamp" can be a header: data lines skip the parse of field names
        fields = [_field_name(c) for c in cells] if "timestamp" in line.lower() else ()
        if "timestamp" in fields and ("index" in fields or "uuid" in fields or "gpu_uuid" in fields):
            header = fields  # the first header, or one repeated by an `-l` loop
            report.ignored_columns.update(f for f in fields if f not in FIELDS and f != "timestamp")
            continue
        report.read += 1
        if header is None:
            report.bad(
                f"{name}:line {lineno}",
                "data before any header line (needs --format=csv with a timestamp column)",
            )
            continue
        if len(cells) != len(header):
            report.bad(f"{name}:line {lineno}", f"{len(cells)} fields where the header has {len(header)}")
            continue
        try:
            row: dict = {"state": "ok", "source": KIND, "simulated": False}
            for field, cell in zip(header, cells, strict=True):
                if field == "timestamp":
                    row["ts"] = _timestamp(cell, zone)
                elif field in FIELDS:
                    column, parse_cell = FIELDS[field]
                    row[column] = parse_cell(cell)
        except ValueError as exc:
            report.bad(f"{name}:line {lineno}", str(exc))
            continue
        if row.get("gpu_index") is None and row.get("gpu_uuid") is None:
            report.bad(f"{name}:line {lineno}", "no GPU index or uuid")
            continue
        if "ts" not in row:
            report.bad(f"{name}:line {lineno}", "no timestamp")
            continue
        why = row_problem(GPU_SAMPLES, row)
        if why:
            report.reject(f"{name}:line {lineno}", why)
            continue
        rows.append(row)
        positions.append(f"line {lineno}")
    return rows, positions


def _fill_index(rows: list[dict]) -> None:
    # Logs with uuid but no index: number GPUs in order of first appearance.
    order: dict[str, int] = {}
    for row in rows:
        if row.get("gpu_index") is None:
            row["gpu_index"] = order.setdefault(row["gpu_uuid"], len(order))


def import_files(files: list[Path], out: Path, *, host: str, tz: str | None = None) -> ImportReport:
    zone = _zone(tz)
    check_files(files)
    report = ImportReport(hosts={host})
    all_rows: list[dict] = []
    for path in files:
        text = read_text(path)
        report.files += 1
        rows, positions = parse(text, path.name, report, zone)
        # nvidia-smi -l takes whole seconds: 1 s where a file holds no interval to go by
        placed = place_in_log_order(rows, positions, [host] * len(rows), path.name, report, 1.0)
        all_rows += [row for _, row in placed]
    _fill_index(all_rows)
    store(out, {host: all_rows}, report, KIND)
    return report
