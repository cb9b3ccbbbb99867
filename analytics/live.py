"""Live views of the fleet for the ops console: the newest sample per GPU, short series, processes.

Plain functions over a connection from ``analytics.open_telemetry``. "Now" is the newest sample in
the telemetry, not the wall clock, so the same directory always gives the same answer (replays and
tests are deterministic) and a fleet whose collectors stopped still shows its last state; callers
compare ``newest_sample_time`` with their clock to say how stale it is.

Every query bounds the ``date`` hive partition first, so DuckDB skips the segments of older days
instead of scanning the whole history on each refresh.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb

from collector.reader import _empty_select, utc
from collector.schema import PARTITION_TYPES, TABLES

# Series the console may ask for: column name -> what it is. A fixed list, because a column name
# cannot be a query parameter and must never come from user text.
SERIES_COLUMNS = {
    "util_gpu_mean": "GPU utilization (duty cycle), ratio 0-1",
    "sm_activity": "GPM SM activity, ratio 0-1",
    "mem_used_bytes": "device memory used, bytes",
    "power_w": "power draw, watts",
    "temperature_c": "temperature, degrees Celsius",
}

# A GPU not heard from for this long is no longer listed as part of the fleet.
DEFAULT_LOOKBACK = timedelta(days=1)


@dataclass(frozen=True)
class GpuNow:
    """The newest sample of one GPU. Metrics a GPU does not report (GPM before Hopper) are None."""

    host: str
    gpu_index: int
    gpu_uuid: str
    gpu_name: str
    state: str
    ts: datetime
    util_gpu: float | None
    sm_activity: float | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    power_w: float | None
    temperature_c: float | None
    simulated: bool


@dataclass(frozen=True)
class ProcessNow:
    """One process holding a GPU at the newest process tick of that GPU."""

    host: str
    gpu_index: int
    gpu_uuid: str
    ts: datetime
    pid: int
    process_name: str | None
    user: str | None
    container_id: str | None
    mem_used_bytes: int | None
    sm_util: float | None


def _naive(ts: datetime) -> datetime:
    return ts.astimezone(UTC).replace(tzinfo=None) if ts.tzinfo else ts


def newest_sample_time(con: duckdb.DuckDBPyConnection) -> datetime | None:
    """Time of the newest GPU sample in the telemetry, or None when there is none."""
    row = con.execute(
        """
        SELECT max(ts AT TIME ZONE 'UTC') FROM gpu_samples
        WHERE date >= (SELECT max(date) FROM gpu_samples) - INTERVAL 1 DAY
        """
    ).fetchone()
    return utc(row[0]) if row else None


def _window(
    con: duckdb.DuckDBPyConnection, at: datetime | None, span: timedelta
) -> tuple[datetime, datetime] | None:
    end = at if at is not None else newest_sample_time(con)
    if end is None:
        return None
    return _naive(end - span), _naive(end)


def latest_gpu_samples(
    con: duckdb.DuckDBPyConnection, *, at: datetime | None = None, lookback: timedelta = DEFAULT_LOOKBACK
) -> list[GpuNow]:
    """The newest sample of every GPU heard from within ``lookback`` before ``at``.

    ``at`` defaults to the newest sample in the telemetry. Sorted by host, then GPU index.
    """
    window = _window(con, at, lookback)
    if window is None:
        return []
    start, end = window
    rows = con.execute(
        """
        SELECT host, gpu_index, gpu_uuid, gpu_name, state, ts AT TIME ZONE 'UTC',
               util_gpu_mean, sm_activity, mem_used_bytes, mem_total_bytes, power_w, temperature_c,
               simulated
        FROM gpu_samples
        WHERE date BETWEEN CAST(? AS DATE) AND CAST(? AS DATE)
          AND ts AT TIME ZONE 'UTC' BETWEEN ? AND ?
        QUALIFY row_number() OVER (PARTITION BY host, gpu_uuid ORDER BY ts DESC) = 1
        ORDER BY host, gpu_index, gpu_uuid
        """,
        [start, end, start, end],
    ).fetchall()
    return [
        GpuNow(
            host=r[0],
            gpu_index=int(r[1]),
            gpu_uuid=r[2],
            gpu_name=r[3],
            state=r[4] or "ok",
            ts=utc(r[5]),
            util_gpu=r[6],
            sm_activity=r[7],
            mem_used_bytes=r[8],
            mem_total_bytes=r[9],
            power_w=r[10],
            temperature_c=r[11],
            simulated=bool(r[12]),
        )
        for r in rows
    ]


def gpu_series(
    con: duckdb.DuckDBPyConnection,
    column: str = "util_gpu_mean",
    *,
    minutes: float = 10,
    buckets: int = 30,
    at: datetime | None = None,
) -> dict[tuple[str, str], list[float | None]]:
    """Per GPU, ``buckets`` equal slices of the last ``minutes`` before ``at``: the mean of ``column``.

    Keyed by ``(host, gpu_uuid)``; a slice with no sample is None (a gap, not a zero). The last slice
    ends at ``at`` (default: the newest sample). ``column`` is one of ``SERIES_COLUMNS``.
    """
    if column not in SERIES_COLUMNS:
        raise ValueError(f"unknown series column {column!r}; one of {', '.join(SERIES_COLUMNS)}")
    if buckets < 1 or minutes <= 0:
        raise ValueError("buckets must be >= 1 and minutes > 0")
    window = _window(con, at, timedelta(minutes=minutes))
    if window is None:
        return {}
    start, end = window
    width_us = (end - start) / timedelta(microseconds=1) / buckets
    rows = con.execute(
        f"""
        SELECT host, gpu_uuid,
               least(CAST(floor((epoch_us(ts AT TIME ZONE 'UTC') - epoch_us(CAST(? AS TIMESTAMP))) / ?)
                          AS BIGINT), ? - 1) AS bucket,
               avg({column})
        FROM gpu_samples
        WHERE date BETWEEN CAST(? AS DATE) AND CAST(? AS DATE)
          AND ts AT TIME ZONE 'UTC' > ? AND ts AT TIME ZONE 'UTC' <= ?
        GROUP BY ALL
        """,
        [start, width_us, buckets, start, end, start, end],
    ).fetchall()
    series: dict[tuple[str, str], list[float | None]] = {}
    for host, uuid, bucket, value in rows:
        slots = series.setdefault((host, uuid), [None] * buckets)
        slots[int(bucket)] = None if value is None else float(value)
    return series


def gpu_processes(
    con: duckdb.DuckDBPyConnection,
    host: str,
    gpu_uuid: str,
    *,
    at: datetime | None = None,
    grace: timedelta = timedelta(seconds=15),
) -> list[ProcessNow]:
    """Processes on one GPU at its newest process tick, largest memory first.

    A tick older than ``grace`` before the GPU's own newest sample means the processes have gone
    (the collector writes no rows for a GPU without processes), so the answer is then empty.
    """
    window = _window(con, at, DEFAULT_LOOKBACK)
    if window is None:
        return []
    start, end = window
    rows = con.execute(
        """
        WITH gpu_last AS (
            SELECT max(ts AT TIME ZONE 'UTC') AS ts FROM gpu_samples
            WHERE date BETWEEN CAST(? AS DATE) AND CAST(? AS DATE)
              AND host = ? AND gpu_uuid = ? AND ts AT TIME ZONE 'UTC' BETWEEN ? AND ?
        ),
        procs AS (
            SELECT *, ts AT TIME ZONE 'UTC' AS uts FROM process_samples
            WHERE date BETWEEN CAST(? AS DATE) AND CAST(? AS DATE)
              AND host = ? AND gpu_uuid = ? AND ts AT TIME ZONE 'UTC' BETWEEN ? AND ?
        ),
        proc_last AS (SELECT max(uts) AS ts FROM procs)
        SELECT p.host, p.gpu_index, p.gpu_uuid, p.uts, p.pid, p.process_name, p.user, p.container_id,
               p.mem_used_bytes, p.sm_util
        FROM procs p, proc_last pl, gpu_last gl
        WHERE p.uts = pl.ts AND pl.ts >= coalesce(gl.ts, pl.ts) - to_microseconds(?)
        ORDER BY p.mem_used_bytes DESC NULLS LAST, p.pid
        """,
        [start, end, host, gpu_uuid, start, end, start, end, host, gpu_uuid, start, end, _us(grace)],
    ).fetchall()
    return [
        ProcessNow(
            host=r[0],
            gpu_index=int(r[1]),
            gpu_uuid=r[2],
            ts=utc(r[3]),
            pid=int(r[4]),
            process_name=r[5],
            user=r[6],
            container_id=r[7],
            mem_used_bytes=r[8],
            sm_util=r[9],
        )
        for r in rows
    ]


def _us(span: timedelta) -> int:
    return int(span / timedelta(microseconds=1))


# Tailing ----------------------------------------------------------------------------------------

_TAILED = ("gpu_samples", "process_samples")


class LiveWindow:
    """The last minutes of ``gpu_samples`` and ``process_samples``, kept in memory and fed incrementally.

    A collector flushes a segment every few seconds, so a live directory holds thousands of small
    files a day; querying them all on every refresh costs seconds. ``poll()`` reads only segments it
    has not read before, from the newest date partitions, and drops rows older than ``window``. Its
    ``con`` has tables of the same names and columns as ``open_telemetry``'s views, so every function
    of this module runs on it unchanged.

    Segments are found by their path (``<dir>/<table>/date=…/host=…/*.parquet``); on the first poll
    only files written (mtime) within ``window`` + ``slack`` of the newest file of their host are read,
    so opening a year of history costs what its last minutes cost. When a segment that was read
    disappears (compaction merged it into a new one), the window is rebuilt from scratch rather than
    read twice.
    """

    def __init__(
        self,
        dirs: str | os.PathLike | Sequence[str | os.PathLike],
        window: timedelta = timedelta(minutes=15),
        *,
        slack: timedelta = timedelta(minutes=5),
    ):
        self.roots = [Path(dirs)] if isinstance(dirs, (str, os.PathLike)) else [Path(d) for d in dirs]
        self.window = window
        self.slack = slack
        self.con = duckdb.connect()
        self._seen: dict[str, set[str]] = {t: set() for t in _TAILED}
        self._rebuild: dict[str, bool] = {t: False for t in _TAILED}
        for name in _TAILED:
            self.con.execute(f"CREATE TABLE {name} AS {_empty_select(TABLES[name])}")

    def poll(self) -> int:
        """Load segments that appeared since the last poll; returns how many were read."""
        loaded = 0
        for name in _TAILED:
            load, skip = self._candidates(name)
            if self._rebuild[name] or self._seen[name] - set(load) - set(skip):
                # A segment we read is gone (compacted, deleted): start over rather than count twice.
                self.con.execute(f"DELETE FROM {name}")
                self._seen[name].clear()
                self._rebuild[name] = False
                load, skip = self._candidates(name)
            new = [f for f in load if f not in self._seen[name]]
            if new:
                self._load(name, new)
                loaded += len(new)
            self._seen[name].update(new)
            self._seen[name].update(skip)
        self._prune()
        return loaded

    def _candidates(self, table: str) -> tuple[list[str], list[str]]:
        """(segments to read, segments too old to matter): the latter only on a first read."""
        first = not self._seen[table]
        load: list[str] = []
        skip: list[str] = []
        for root in self.roots:
            base = root / table
            if not base.is_dir():
                continue
            dates = sorted(d for d in os.listdir(base) if d.startswith("date="))[-2:]  # around midnight
            for date in dates:
                for host in os.listdir(base / date):
                    folder = base / date / host
                    if not host.startswith("host=") or not folder.is_dir():
                        continue
                    with os.scandir(folder) as entries:
                        segs = [(e.path, e.stat().st_mtime) for e in entries if e.name.endswith(".parquet")]
                    if first and segs:
                        horizon = max(m for _, m in segs) - (self.window + self.slack).total_seconds()
                        skip += [p for p, m in segs if m < horizon]
                        segs = [(p, m) for p, m in segs if m >= horizon]
                    load += [p for p, _ in segs]
        return load, skip

    def _load(self, table: str, files: list[str]) -> None:
        try:
            self._insert(table, files)
        except duckdb.Error:
            # One bad file must not hide the others: read them one by one. A file that vanished
            # between listing and reading (compaction) means a rebuild on the next poll; one that
            # is there but unreadable is skipped (and stays skipped).
            for path in files:
                try:
                    self._insert(table, [path])
                except duckdb.Error:
                    if not os.path.exists(path):
                        self._rebuild[table] = True

    def _insert(self, table: str, files: list[str]) -> None:
        hive_types = ", ".join(f"'{k}': {v}" for k, v in PARTITION_TYPES.items())
        columns = ", ".join([*TABLES[table].column_names, *PARTITION_TYPES])
        self.con.execute(
            f"INSERT INTO {table} SELECT {columns} FROM read_parquet(?, hive_partitioning = true, "
            f"union_by_name = true, hive_types = {{{hive_types}}})",
            [files],
        )

    def _prune(self) -> None:
        # Per host, so a host whose collector stopped keeps its last minutes (and shows as stale).
        for name in _TAILED:
            self.con.execute(
                f"DELETE FROM {name} t WHERE ts < (SELECT max(ts) FROM {name} h WHERE h.host = t.host) - ?",
                [self.window],
            )

    def close(self) -> None:
        self.con.close()
