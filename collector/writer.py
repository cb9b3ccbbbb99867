"""Append telemetry rows as Parquet segments that readers can open at any moment.

Layout (see ``collector.schema``)::

    <root>/<table>/date=YYYY-MM-DD/host=<host>/<table>-<first ts>-<pid>-<seq>-<token>.parquet

``<root>`` is a directory or an S3-compatible bucket, ``s3://bucket/prefix`` (``collector.location``).

Rows are buffered in memory and written every ``flush_interval_s`` (and on ``flush()``/``close()``).
Each segment is written under a hidden temporary name (``.<name>.tmp``, which no ``*.parquet`` glob
matches), fsynced, then renamed into place with ``os.replace``: a reader sees a whole segment or none,
and a ``kill -9`` loses at most the rows of the current interval. ``date`` and ``host`` live only in
the path; every segment carries ``schema_version`` as a column and in its footer metadata.

In a bucket each segment is one object, serialized in memory first and uploaded whole: S3 makes an
object visible only once its upload completes, so readers never see part of one either.

A failed write keeps the rows buffered. Where the failure is expected to pass (``error.passes``: a
full disk, any failure of an object store) a collector goes on sampling and writes them at a later
flush. ``spill`` puts what a bucket did not take by exit into a local directory
(``keeps_rows_on_error``), and ``upload_spool`` sends such a directory up at the next start.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import itertools
import logging
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from collector._errors import TelemetryWriteError
from collector.location import Location, S3Location, describe_s3_error, parse_location
from collector.schema import SCHEMA_VERSION, TABLES, Table, row_problem, valid_mask

log = logging.getLogger("gpupool.telemetry")
_HOST_OK = re.compile(r"^[A-Za-z0-9._-]+$")
_seq = itertools.count()


def default_host() -> str:
    """This machine's short name as a telemetry host (what ``host=<host>`` holds without --host)."""
    name = socket.gethostname().split(".")[0] or "localhost"
    return re.sub(r"[^A-Za-z0-9._-]", "-", name)


def check_host(host: str) -> str:
    """A host name that is safe as a path component (it becomes ``host=<host>``)."""
    if not _HOST_OK.match(host or "") or host in (".", ".."):
        raise TelemetryWriteError(
            f"invalid host name {host!r} for telemetry", "use letters, digits, '.', '_' or '-' (--host NAME)"
        )
    return host


def _describe_os_error(exc: OSError, root: Path) -> TelemetryWriteError:
    if exc.errno == errno.ENOSPC or exc.errno == errno.EDQUOT:
        return TelemetryWriteError(
            f"disk full writing telemetry under {root}",
            "free some space or point --out at another disk",
            passes=True,
        )
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST):
        return TelemetryWriteError(
            f"telemetry directory not writable: {root} ({exc.strerror})",
            "choose another directory with --out DIR or fix its permissions",
        )
    return TelemetryWriteError(f"cannot write telemetry under {root}: {exc}", "check the disk and the path")


def write_segment(path: Path, table: pa.Table) -> None:
    """Write one Parquet file atomically: temporary name, fsync, rename, fsync the folder."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as fh:
            pq.write_table(table, fh, compression="zstd")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class _DirSink:
    """Segments as files of a directory: temporary name, fsync, rename."""

    def __init__(self, root: Path):
        self.root = root

    def check(self, host: str) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / f".write-probe-{os.getpid()}-{secrets.token_hex(4)}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise self.describe(exc) from None

    def write(self, parts: tuple[str, ...], name: str, table: pa.Table) -> None:
        folder = self.root.joinpath(*parts)
        folder.mkdir(parents=True, exist_ok=True)
        write_segment(folder / name, table)

    def remove(self, parts: tuple[str, ...], name: str) -> None:
        self.root.joinpath(*parts, name).unlink(missing_ok=True)

    def describe(self, exc: OSError) -> TelemetryWriteError:
        return _describe_os_error(exc, self.root)


class _S3Sink:
    """Segments as objects of a bucket, each serialized in memory and uploaded whole."""

    def __init__(self, loc: S3Location):
        from collector.location import s3_filesystem

        self.loc = loc
        self.fs = s3_filesystem()

    def check(self, host: str) -> None:
        # One small object per host outside every table's folder (no reader globs it), rewritten at
        # each start: the write that proves the bucket takes ours, and a list of who writes here.
        # It is not deleted: a host's key needs s3:PutObject only.
        note = (
            f"host={host} pid={os.getpid()} started={dt.datetime.now(dt.UTC).isoformat(timespec='seconds')}\n"
        )
        try:
            self.put((".gpupool-writers",), host, note.encode())
        except OSError as exc:
            raise self.describe(exc) from None

    def write(self, parts: tuple[str, ...], name: str, table: pa.Table) -> None:
        buf = pa.BufferOutputStream()
        pq.write_table(table, buf, compression="zstd")
        self.put(parts, name, buf.getvalue())  # serialized first: a failure there sends nothing

    def put(self, parts: tuple[str, ...], name: str, data) -> None:
        with self.fs.open_output_stream(self.loc.key(*parts, name)) as out:
            out.write(data)

    def remove(self, parts: tuple[str, ...], name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(self.loc.key(*parts, name))

    def describe(self, exc: OSError) -> TelemetryWriteError:
        error = describe_s3_error(exc, self.loc)
        error.passes = True  # mid-run, an object store's failure is waited out (docs/collector.md)
        return error


def _sink(location: Location) -> _DirSink | _S3Sink:
    return _S3Sink(location) if isinstance(location, S3Location) else _DirSink(location)


def _segment_name(table: Table, data: pa.Table) -> str:
    first = pc.min(data.column("ts")).as_py()
    stamp = _as_utc(first).strftime("%Y%m%dT%H%M%S") if first else "unknown"
    return f"{table.name}-{stamp}-{os.getpid()}-{next(_seq):06d}-{secrets.token_hex(3)}.parquet"


def _as_utc(ts: dt.datetime) -> dt.datetime:
    return ts.replace(tzinfo=dt.UTC) if ts.tzinfo is None else ts.astimezone(dt.UTC)


def rows_to_table(table: Table, rows: list[dict]) -> pa.Table:
    """Build an Arrow table of the schema from row dicts; missing columns are null."""
    columns = {}
    for name in table.column_names:
        if name == "schema_version":
            columns[name] = [SCHEMA_VERSION] * len(rows)
        else:
            columns[name] = [row.get(name) for row in rows]
    return pa.Table.from_pydict(columns, schema=table.arrow_schema)


def conform(table: Table, data: pa.Table) -> pa.Table:
    """Cast an Arrow table to the schema's columns and order; absent columns become null."""
    arrays = []
    for field in table.arrow_schema:
        if field.name == "schema_version":
            arrays.append(pa.array([SCHEMA_VERSION] * data.num_rows, field.type))
        elif field.name in data.column_names:
            arrays.append(data.column(field.name).cast(field.type))
        else:
            arrays.append(pa.nulls(data.num_rows, field.type))
    return pa.Table.from_arrays(arrays, schema=table.arrow_schema)


class TelemetryWriter:
    """Buffered, thread-safe writer of telemetry segments for one host.

    ``append(table_name, rows)`` takes row dicts keyed by the schema's column names (``ts`` a
    timezone-aware datetime; ``schema_version`` and missing columns are filled in). A background
    thread flushes every ``flush_interval_s``; ``flush()`` writes now and raises
    ``TelemetryWriteError`` if the disk refuses (the rows stay buffered and are retried). A failure of
    the background flush is kept in ``error`` for the owner to report.

    ``root`` is a directory or ``s3://bucket/prefix``; either is checked writable before anything is
    buffered (``TelemetryWriteError`` otherwise).
    """

    def __init__(
        self,
        root: str | os.PathLike | S3Location,
        host: str,
        *,
        flush_interval_s: float = 10.0,
        on_flush: Callable[[int], None] | None = None,
        undoable: bool = False,
    ):
        self.location = parse_location(root)
        self.root = self.location  # a Path for a directory; kept under its old name for callers
        self.host = check_host(host)
        self._sink = _sink(self.location)
        self.flush_interval_s = flush_interval_s
        self._on_flush = on_flush
        self._buffers: dict[str, list[pa.Table]] = {name: [] for name in TABLES}
        self._retry_names: dict[tuple[str, dt.date], str] = {}  # (table, day) -> a failed segment's name
        self._buffer_lock = threading.Lock()
        self._write_lock = threading.Lock()  # one segment writer at a time
        self.rows_written = 0
        self.segments_written = 0
        # (folder parts, name) of each segment written, for ``undo`` (one import's few; a collector's
        # months of segments are not kept)
        self.written: list[tuple[tuple[str, ...], str]] | None = [] if undoable else None
        self.rows_rejected = 0  # rows refused for a value outside its column's range (schema.valid)
        self.first_rejected: str | None = None
        self.last_flush: float | None = None  # time.time() of the last successful flush
        self.error: TelemetryWriteError | None = None
        self._closed = False
        self._ensure_writable()
        self._stop = threading.Event()
        self._thread = None
        if flush_interval_s and flush_interval_s > 0:
            self._thread = threading.Thread(target=self._flush_loop, name="telemetry-flush", daemon=True)
            self._thread.start()

    def _ensure_writable(self) -> None:
        self._sink.check(self.host)

    @property
    def keeps_rows_on_error(self) -> bool:
        """True for a bucket: what it did not take by exit is spilled to a local spool, not dropped.
        (While running, any writer whose ``error.passes`` keeps its rows in memory and retries.)"""
        return isinstance(self.location, S3Location)

    # -- buffering -------------------------------------------------------------------------------
    def append(self, table_name: str, rows: Iterable[dict]) -> None:
        """Buffer rows for the next flush. Rows are typed now, so a bad row fails here, in the caller.
        A row with a value outside its column's physical range (``schema.row_problem``: a driver's
        sentinel, NaN) is dropped and counted in ``rows_rejected``, never stored."""
        if table_name not in TABLES:
            raise ValueError(f"unknown telemetry table {table_name!r}; known: {', '.join(TABLES)}")
        rows = list(rows)
        if not rows:
            return
        if any(not isinstance(row.get("ts"), dt.datetime) for row in rows):
            raise ValueError(f"{table_name}: every row needs 'ts' as a timezone-aware datetime")
        table = TABLES[table_name]
        data = self._sane(table, rows_to_table(table, rows))  # raises on a value of the wrong type
        with self._buffer_lock:
            if self._closed:
                raise RuntimeError("TelemetryWriter is closed")
            self._buffers[table_name].append(data)

    def _sane(self, table: Table, data: pa.Table) -> pa.Table:
        """``data`` less its rows with a value outside its column's range, counted (the first logged)."""
        ok = valid_mask(table, data)
        if ok is None:
            return data
        kept = data.filter(ok)
        self.rows_rejected += data.num_rows - kept.num_rows
        if self.first_rejected is None:
            bad = data.filter(pc.invert(ok)).slice(0, 1).to_pylist()
            self.first_rejected = row_problem(table, bad[0])
            log.warning(
                "telemetry: a %s row with an impossible value was not stored (%s); later ones are "
                "counted, not logged",
                table.name,
                self.first_rejected,
            )
        return kept

    @property
    def buffered_rows(self) -> int:
        with self._buffer_lock:
            return sum(t.num_rows for parts in self._buffers.values() for t in parts)

    # -- writing ---------------------------------------------------------------------------------
    def flush(self) -> int:
        """Write every buffered row now; returns how many rows were written."""
        with self._write_lock:
            try:
                written = self._drain(self._sink)
            except OSError as exc:
                self.error = self._sink.describe(exc)
                raise self.error from None
            self.error = None
            self.last_flush = time.time()
        if written and self._on_flush:
            self._on_flush(written)
        return written

    def _drain(self, sink) -> int:
        """Write every buffered row to `sink` (the caller holds the write lock); rows it refuses go back
        to the buffer and the OSError is raised."""
        with self._buffer_lock:
            pending = {name: parts for name, parts in self._buffers.items() if parts}
            self._buffers = {name: [] for name in TABLES}
        rows = 0
        try:
            for name, parts in list(pending.items()):
                rows += self._write_days(TABLES[name], pa.concat_tables(parts), sink)
                del pending[name]
        except OSError:
            self._requeue(pending)
            raise
        return rows

    def _requeue(self, pending: dict[str, list[pa.Table]]) -> None:
        # Rows that could not be written go back to the front of the buffer, in order, as one table:
        # through a long outage of an object store thousands of one-tick tables would cost ten times
        # their data in memory (~190 MB an hour of 8 GPUs at 1 Hz, instead of ~15 MB).
        merged = {name: pa.concat_tables(parts).combine_chunks() for name, parts in pending.items()}
        with self._buffer_lock:
            for name, data in merged.items():
                self._buffers[name] = [data, *self._buffers[name]]

    def _write_days(self, table: Table, data: pa.Table, sink, *, retry: bool = True) -> int:
        """Write one segment per UTC day present in ``data`` (a partition is one day).

        With ``retry`` (buffered rows, which go back to the buffer when a write fails) a segment
        keeps its name until every day of ``data`` is written: the next attempt, holding those rows
        and the ones that came since after them, writes under the same names and replaces what the
        failed attempt may have stored (a day written before another failed; an object store that
        took the object but whose answer was lost). So no row is stored twice. The spool keeps the
        names too, so its later upload replaces such an object as well."""
        if data.num_rows == 0:
            return 0
        days = pc.cast(data.column("ts"), pa.date32())
        unique = pc.unique(days)
        for day in sorted(unique.to_pylist()):
            part = data if len(unique) == 1 else data.filter(pc.equal(days, pa.scalar(day, pa.date32())))
            name = self._retry_names.get((table.name, day)) if retry else None
            if name is None:
                name = _segment_name(table, part)
                if retry:
                    self._retry_names[(table.name, day)] = name
            sink.write(self._parts(table.name, day), name, part)
            if sink is self._sink:
                self.rows_written += part.num_rows
                self.segments_written += 1
                if self.written is not None:
                    self.written.append((self._parts(table.name, day), name))
        if retry:
            for day in unique.to_pylist():
                del self._retry_names[(table.name, day)]
        return data.num_rows

    def write_table(self, table_name: str, data: pa.Table) -> int:
        """Write an Arrow table (already in memory, e.g. a backfill or an import) as segments now."""
        table = TABLES[table_name]
        data = self._sane(table, conform(table, data))
        with self._write_lock:
            try:
                written = self._write_days(table, data, self._sink, retry=False)
            except OSError as exc:
                raise self._sink.describe(exc) from None
            self.last_flush = time.time()
        if written and self._on_flush:
            self._on_flush(written)
        return written

    def undo(self) -> None:
        """Remove every segment this writer (made ``undoable``) wrote and drop what it buffers: an import
        that failed part-way leaves nothing behind (best effort: a store refusing the removal keeps them)."""
        if self.written is None:
            raise TypeError("undo needs a TelemetryWriter(..., undoable=True)")
        with self._buffer_lock:
            self._buffers = {name: [] for name in TABLES}
        with self._write_lock:
            for parts, name in reversed(self.written):
                with contextlib.suppress(OSError):
                    self._sink.remove(parts, name)
            self.written.clear()

    def _parts(self, table_name: str, day: dt.date) -> tuple[str, str, str]:
        return (table_name, f"date={day.isoformat()}", f"host={self.host}")

    def partition_dir(self, table_name: str, day: dt.date) -> Path:
        if isinstance(self.location, S3Location):
            raise TypeError(f"{self.location} is a bucket, not a directory")
        return self.location.joinpath(*self._parts(table_name, day))

    # -- a local spool for an object store that is down at exit ------------------------------------
    def spill(self, folder: str | os.PathLike) -> int:
        """Write every buffered row as segments under the directory ``folder`` (same layout), for
        ``upload_spool`` to send at the next start; returns the rows spilled (raises
        ``TelemetryWriteError`` if the directory refuses too; the rows then stay buffered)."""
        spool = _DirSink(Path(folder))
        with self._write_lock:
            try:
                return self._drain(spool)
            except OSError as exc:
                raise spool.describe(exc) from None

    def upload_spool(self, folder: str | os.PathLike) -> int:
        """Upload the segments a previous run spilled under ``folder`` (any host's), deleting each
        local file once its object is written; returns how many were sent."""
        if not isinstance(self._sink, _S3Sink):
            raise TypeError("upload_spool is for a writer into a bucket")
        folder = Path(folder)
        sent = 0
        for path in sorted(folder.glob("*/date=*/host=*/*.parquet")):
            parts = path.relative_to(folder).parts
            try:
                with self._write_lock:
                    self._sink.put(parts[:3], parts[3], path.read_bytes())
            except OSError as exc:
                raise self._sink.describe(exc) from None
            path.unlink()
            sent += 1
        return sent

    # -- background flushing and shutdown --------------------------------------------------------
    def _flush_loop(self) -> None:
        while not self._stop.wait(self.flush_interval_s):
            # A failure is kept in self.error for the owner to report; the rows stay buffered.
            with contextlib.suppress(TelemetryWriteError):
                self.flush()

    def close(self) -> None:
        """Stop the background flusher and write what is buffered (raises TelemetryWriteError)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.flush()
        with self._buffer_lock:
            self._closed = True

    def __enter__(self) -> TelemetryWriter:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
