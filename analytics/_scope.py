"""What a question is asked about: a time range, a set of hosts, a set of GPUs.

Every analytics function takes a ``Scope`` and turns it into a WHERE clause with ``?`` placeholders;
values are always parameters, never spliced into SQL. The clause also bounds the ``date`` hive
partition so DuckDB skips whole days of segments outside the range.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import duckdb

from analytics._telemetry import TelemetryError


def utc(ts: datetime | None) -> datetime | None:
    """An aware UTC datetime (naive input is taken to be UTC already)."""
    if ts is None:
        return None
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)


@dataclass(frozen=True)
class Scope:
    """Rows with ``start <= ts < end`` on the given hosts and GPUs (empty tuple: all of them)."""

    start: datetime | None = None
    end: datetime | None = None
    hosts: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()  # GPU UUIDs

    def where(self) -> tuple[str, list]:
        """SQL predicate over a telemetry view and its parameters."""
        clauses: list[str] = ["true"]
        params: list = []
        start, end = utc(self.start), utc(self.end)
        if start is not None:
            # A day back: a segment's date is the day it covers, and the sample that closes a day
            # (stamped at midnight) sits in that day's segment.
            clauses += ["date >= ?", "ts >= ?"]
            params += [start.date() - timedelta(days=1), start]
        if end is not None:
            clauses += ["date <= ?", "ts < ?"]
            params += [end.date(), end]
        if self.hosts:
            clauses.append(f"host IN ({', '.join('?' for _ in self.hosts)})")
            params += list(self.hosts)
        if self.gpus:
            clauses.append(f"gpu_uuid IN ({', '.join('?' for _ in self.gpus)})")
            params += list(self.gpus)
        return " AND ".join(clauses), params

    def describe(self) -> str:
        start, end = utc(self.start), utc(self.end)
        if start and end:
            span = f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC"
        elif start or end:
            span = f"from {start:%Y-%m-%d %H:%M} UTC" if start else f"before {end:%Y-%m-%d %H:%M} UTC"
        else:
            span = "all time"
        hosts = ", ".join(self.hosts) if self.hosts else "all hosts"
        gpus = f", {len(self.gpus)} selected GPUs" if self.gpus else ""
        return f"{span}, {hosts}{gpus}"


ALL = Scope()  # everything in the telemetry (a shared default: Scope is frozen)


@dataclass(frozen=True)
class GpuInfo:
    host: str
    gpu_index: int
    gpu_uuid: str
    gpu_name: str
    mem_total_bytes: int

    @property
    def label(self) -> str:
        return f"{self.host} / GPU {self.gpu_index} ({self.gpu_name})"


@dataclass(frozen=True)
class Extent:
    """What the telemetry holds: its time span, hosts and GPUs, and whether any row is simulated."""

    start: datetime | None
    end: datetime | None
    hosts: tuple[str, ...]
    gpus: tuple[GpuInfo, ...]
    simulated: bool
    gpu_rows: int
    process_rows: int


def data_extent(con: duckdb.DuckDBPyConnection) -> Extent:
    """The span, hosts and GPUs present in the telemetry (for filters and for error hints).

    One streaming pass for the span and the list of GPUs; names, indexes and sizes are read from
    the days where each GPU last reported only (string aggregates over every sample are the slow part).
    With rollups (``_rollup``), a host's history before its mark comes from its hourly and minute
    rows, and only the raw samples after the mark are read: the span still reaches back to the first
    sample once old raw days have expired.
    """
    from analytics import _rollup  # _rollup reads Scope: imported here, not at the top

    plan = _rollup.plan(con, ALL)[0]
    raw_where, raw_params, *_ = _rollup.raw_tail(plan)
    parts = [
        f"SELECT host, gpu_uuid, epoch_us(min(ts)) AS lo, epoch_us(max(ts)) AS hi, sum(simulated::INTEGER) AS sim, "
        f"true AS raw FROM gpu_samples WHERE true{raw_where} GROUP BY host, gpu_uuid"
    ]
    params = list(raw_params)
    if plan is not None:
        rel, rel_params = _rollup.rollup_relation(plan, "true", [])
        parts.append(
            "SELECT host, gpu_uuid, epoch_us(min(first_ts)), epoch_us(max(last_ts)), "
            f"sum((simulated_s > 0)::INTEGER), false FROM {rel} GROUP BY host, gpu_uuid"
        )
        params += rel_params
    rows = con.execute(" UNION ALL ".join(parts), params).fetchall()
    merged: dict[tuple[str, str], list] = {}
    for host, uuid, lo, hi, sim, raw in rows:
        m = merged.setdefault((host, uuid), [host, uuid, lo, hi, 0, None])
        m[2], m[3], m[4] = min(m[2], lo), max(m[3], hi), m[4] + (sim or 0)
        if raw:
            m[5] = hi if m[5] is None else max(m[5], hi)
    per_gpu = list(merged.values())
    (process_rows,) = con.execute("SELECT count(*) FROM process_samples").fetchone()
    if not per_gpu:
        return Extent(None, None, (), (), False, 0, int(process_rows))
    (rows_n,) = con.execute("SELECT count(*) FROM gpu_samples").fetchone()
    details: dict[tuple[str, str], tuple] = {}
    if plan is not None:
        rel, rel_params = _rollup.rollup_relation(plan, "true", [])
        details = {
            (h, u): (i, n, m)
            for h, u, i, n, m in con.execute(
                f"SELECT host, gpu_uuid, arg_max(gpu_index, last_ts), arg_max(gpu_name, last_ts), max(mem_total) "
                f"FROM {rel} GROUP BY host, gpu_uuid",
                rel_params,
            ).fetchall()
        }
    raw_last = [m[5] for m in per_gpu if m[5] is not None]
    if raw_last:
        # A day back: a sample at midnight may sit in the segment of the day before.
        since = min(datetime.fromtimestamp(last / 1e6, UTC).date() for last in raw_last) - timedelta(days=1)
        details.update(
            {
                (h, u): (i, n, m)
                for h, u, i, n, m in con.execute(
                    "SELECT host, gpu_uuid, arg_max(gpu_index, ts), arg_max(gpu_name, ts), max(mem_total_bytes) "
                    f"FROM gpu_samples WHERE date >= ?{raw_where} GROUP BY host, gpu_uuid",
                    [since, *raw_params],
                ).fetchall()
            }
        )
    gpus = []
    for host, uuid, *_ in per_gpu:
        index, name, mem = details.get((host, uuid), (0, "", 0))
        gpus.append(GpuInfo(host, int(index or 0), uuid, name or "", int(mem or 0)))
    gpus.sort(key=lambda g: (g.host, g.gpu_index, g.gpu_uuid))
    return Extent(
        start=datetime.fromtimestamp(min(r[2] for r in per_gpu) / 1e6, UTC),
        end=datetime.fromtimestamp(max(r[3] for r in per_gpu) / 1e6, UTC),
        hosts=tuple(sorted({g.host for g in gpus})),
        gpus=tuple(gpus),
        simulated=any(r[4] for r in per_gpu),
        gpu_rows=int(rows_n),
        process_rows=int(process_rows),
    )


def no_data_error(con: duckdb.DuckDBPyConnection, scope: Scope, table: str = "gpu_samples") -> TelemetryError:
    """The error for a scope that matches no rows, with the span that does hold data as the hint."""
    row = con.execute(
        f"SELECT min(ts) AT TIME ZONE 'UTC', max(ts) AT TIME ZONE 'UTC', string_agg(DISTINCT host, ', ') FROM {table}"
    ).fetchone()
    if row[0] is None:
        return TelemetryError(f"no {table} rows in this telemetry", "is the collector writing there?")
    hint = f"the telemetry holds {row[0]:%Y-%m-%d %H:%M} to {row[1]:%Y-%m-%d %H:%M} UTC on hosts {row[2]}"
    return TelemetryError(f"no {table} rows in the selection ({scope.describe()})", hint)
