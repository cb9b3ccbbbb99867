"""What a question is asked about: a time range, a set of hosts, a set of GPUs.

Every analytics function takes a ``Scope`` and turns it into a WHERE clause with ``?`` placeholders;
values are always parameters, never spliced into SQL. The clause also bounds the ``date`` hive
partition so DuckDB skips whole days of segments outside the range.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import duckdb

from collector.reader import TelemetryError, utc


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


def one_row(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...]:
    """The row of an aggregate query without GROUP BY (SQL always gives it exactly one)."""
    row = con.execute(sql, params).fetchone()
    if row is None:
        raise RuntimeError(f"an aggregate query returned no row: {sql}")
    return row


def no_data_error(con: duckdb.DuckDBPyConnection, scope: Scope, table: str = "gpu_samples") -> TelemetryError:
    """The error for a scope that matches no rows, with the span that does hold data as the hint."""
    row = one_row(
        con,
        f"SELECT min(ts) AT TIME ZONE 'UTC', max(ts) AT TIME ZONE 'UTC', string_agg(DISTINCT host, ', ') FROM {table}",
    )
    if row[0] is None:
        return TelemetryError(f"no {table} rows in this telemetry", "is the collector writing there?")
    hint = f"the telemetry holds {row[0]:%Y-%m-%d %H:%M} to {row[1]:%Y-%m-%d %H:%M} UTC on hosts {row[2]}"
    return TelemetryError(f"no {table} rows in the selection ({scope.describe()})", hint)
