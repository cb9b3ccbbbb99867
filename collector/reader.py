"""Open one or more telemetry directories as DuckDB views: the one reader of telemetry.

The collector's rollup build (``collector.rollups``) reads the raw samples through it, and
``analytics`` re-exports ``open_telemetry`` for every question it answers; it lives here, below both,
so that the collector, which writes all telemetry, imports nothing of analytics.

Readers never load telemetry into memory: each table becomes a view over the Parquet segments of
every directory given, and DuckDB streams them at query time. New segments that land while a
connection is open are picked up by the next query (the glob is expanded at bind time).

A location may also be an S3-compatible bucket, ``s3://bucket/prefix``, that collectors write with
``gpustat-collect --out s3://…`` (``collector.location``: credentials and endpoint from the AWS
environment variables). DuckDB reads it through an fsspec wrapper of pyarrow's S3 client registered
on the connection (``_S3Files``): the duckdb wheel has no httpfs extension built in, and its
extension repository need not be reachable from where the report runs.

A damaged segment (truncated by a full disk or a partial copy: no Parquet footer) is left out of the
views with a warning naming it (logged once per process, and listed in the temp table
``damaged_segments`` for pages to show): one bad file never stops a report.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import overload

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from collector._errors import CollectorError
from collector.location import Location, S3Location, filesystem, is_s3, parse_location
from collector.schema import (
    METADATA_ROLLUP_KEY,
    METADATA_VERSION_KEY,
    PARTITION_TYPES,
    ROLLUP_TABLES,
    SCHEMA_VERSION,
    TABLES,
    Table,
)
from collector.weights import RULE as WEIGHTS_RULE

log = logging.getLogger("gpupool.telemetry")


@overload
def utc(ts: datetime) -> datetime: ...
@overload
def utc(ts: None) -> None: ...
def utc(ts: datetime | None) -> datetime | None:
    """An aware UTC datetime (naive input is taken to be UTC already): how telemetry holds time."""
    if ts is None:
        return None
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)


class TelemetryError(CollectorError):
    """A telemetry directory that cannot be read as asked: missing, empty, or of a mixed schema."""

    exit_code = 2


def _sql_literal(text: str) -> str:
    # CREATE VIEW takes no prepared parameters, so paths are quoted here, the one place it happens.
    return "'" + text.replace("'", "''") + "'"


def _segments(root: Location, table: str) -> list[str]:
    if isinstance(root, S3Location):
        return _s3_segments(root, table)
    return _walk(os.path.join(str(root), table))


def _walk(folder: str) -> list[str]:
    """The ``*.parquet`` files under ``folder`` at any depth, hidden names left out: what the glob
    ``folder/**/*.parquet`` finds, in a fifth of its time (thousands of rollup files per table)."""
    found: list[str] = []
    try:
        entries = list(os.scandir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return found
    for entry in entries:
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            found += _walk(entry.path)
        elif entry.name.endswith(".parquet"):
            found.append(entry.path)
    return found


# -- S3-compatible buckets ----------------------------------------------------------------------------
_S3_READERS = 16  # footers read at once from a bucket (each is a request of its own)


def _s3_error(exc: OSError, loc: S3Location) -> TelemetryError:
    from collector.location import describe_s3_error

    problem = describe_s3_error(exc, loc, reading=True)
    return TelemetryError(problem.title, problem.hint)


def _s3_segments(loc: S3Location, table: str) -> list[str]:
    """``s3://`` URLs of the table's segments under ``loc`` (a listing of the bucket)."""
    from pyarrow.fs import FileSelector, FileType

    fs, base = filesystem(loc)
    try:
        found = fs.get_file_info(FileSelector(f"{base}/{table}", recursive=True, allow_not_found=True))
    except OSError as exc:
        raise _s3_error(exc, loc) from None
    return sorted(
        "s3://" + f.path
        for f in found
        if f.type == FileType.File and f.base_name.endswith(".parquet") and not f.base_name.startswith(".")
    )


def _s3_files(loc: S3Location):
    """An fsspec filesystem over pyarrow's S3 client, for ``DuckDBPyConnection.register_filesystem``."""
    try:
        from fsspec.implementations.arrow import ArrowFSWrapper
    except ImportError:
        raise TelemetryError(f"reading {loc} needs fsspec", "install it: pip install 'gpupool[s3]'") from None

    class _S3Files(ArrowFSWrapper):
        protocol = ("s3",)  # the paths DuckDB hands it: s3://bucket/key

    return _S3Files(filesystem(loc)[0])


def _read_schema(path: str):
    if path.startswith("s3://"):
        loc = parse_location(path)
        try:
            return pq.read_schema(path.removeprefix("s3://"), filesystem=filesystem(loc)[0])
        except OSError as exc:
            raise _s3_error(exc, loc) from None
    return pq.read_schema(path)


def _check_location(root: Location) -> None:
    if isinstance(root, S3Location):
        from pyarrow.fs import FileSelector, FileType

        from collector.location import where

        fs, base = filesystem(root)
        try:  # one listing: the bucket answers, takes the credentials, and holds something there
            found = fs.get_file_info(FileSelector(base, allow_not_found=True))
        except OSError as exc:
            raise _s3_error(exc, root) from None
        if not found and fs.get_file_info(root.bucket).type == FileType.NotFound:
            raise TelemetryError(
                f"bucket {root.bucket!r} does not exist ({where(root)})",
                "check the name in s3://BUCKET/PREFIX and AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL",
            )
        if not found:
            raise TelemetryError(
                f"telemetry location not found: {root} (nothing under it)",
                "run gpustat-collect --out s3://BUCKET/PREFIX first, or check the prefix",
            )
    elif not root.is_dir():
        raise TelemetryError(
            f"telemetry directory not found: {root}",
            "run gpustat-collect --out DIR first, or check the path",
        )


def _location(text: str | os.PathLike) -> Location:
    from collector._errors import TelemetryWriteError

    try:
        return parse_location(text)
    except TelemetryWriteError as exc:
        raise TelemetryError(exc.title, exc.hint) from None


def _empty_select(table: Table) -> str:
    # A typed, empty relation so queries over a table with no data yet still bind.
    cols = ", ".join(f"CAST(NULL AS {_duck_type(c.type)}) AS {c.name}" for c in table.columns)
    parts = ", ".join(f"CAST(NULL AS {t}) AS {n}" for n, t in PARTITION_TYPES.items())
    return f"SELECT {cols}, {parts} WHERE false"


def _duck_type(arrow_type: pa.DataType) -> str:
    if pa.types.is_list(arrow_type):
        return _duck_type(arrow_type.value_type) + "[]"
    if pa.types.is_timestamp(arrow_type):
        return "TIMESTAMPTZ" if arrow_type.tz else "TIMESTAMP"
    return {
        pa.string(): "VARCHAR",
        pa.bool_(): "BOOLEAN",
        pa.int16(): "SMALLINT",
        pa.int32(): "INTEGER",
        pa.int64(): "BIGINT",
        pa.float32(): "FLOAT",
        pa.float64(): "DOUBLE",
    }[arrow_type]


# path -> ((mtime ns, size), why): segments found damaged, each warned about once per process.
_DAMAGED: dict[str, tuple[tuple[int, int], str]] = {}
_INTACT: dict[str, tuple[int, int]] = {}  # path -> (mtime ns, size) of a segment found whole
_PARQUET_MAGIC = b"PAR1"


def _damaged(path: str, key: tuple[int, int], why: str) -> None:
    if path not in _DAMAGED:
        log.warning(
            "skipping damaged telemetry segment %s (%s); gpustat-collect compact DIR moves it aside",
            path,
            why,
        )
    _DAMAGED[path] = (key, why)


def _intact(path: str) -> bool:
    """Whether a local segment ends with Parquet's footer magic: a file cut short (a full disk, a
    partial copy) does not. Cheap (its last bytes), remembered while the file stays the same."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return True  # gone since the listing: nothing to skip
    key = (st.st_mtime_ns, st.st_size)
    if _INTACT.get(path) == key:
        return True
    known = _DAMAGED.get(path)
    if known is not None and known[0] == key:
        return False
    try:
        with open(path, "rb") as fh:
            if st.st_size >= 12:
                fh.seek(-4, os.SEEK_END)
            tail = fh.read(4)
    except OSError as exc:
        _damaged(path, key, exc.strerror or str(exc))
        return False
    if st.st_size < 12 or tail != _PARQUET_MAGIC:
        _damaged(path, key, f"not a whole Parquet file: {st.st_size} bytes, no footer")
        return False
    _DAMAGED.pop(path, None)
    _INTACT[path] = key
    return True


def damaged_segments(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str]]:
    """(path, why) of the segments the last ``open_telemetry`` on ``con`` left out as damaged."""
    try:
        return con.execute("SELECT path, why FROM damaged_segments ORDER BY path").fetchall()
    except duckdb.CatalogException:
        return []


# path -> ((mtime ns, size), version, columns, rows): a segment's footer is read once per process, not
# at every open (the report opens the telemetry for each figure; a directory holds thousands of segments).
_VERSIONS: dict[str, tuple[tuple[int, int], int, tuple, int]] = {}


def _facts(schema: pa.Schema) -> tuple[int, tuple]:
    raw = (schema.metadata or {}).get(METADATA_VERSION_KEY)
    return (int(raw) if raw is not None else 0), tuple((f.name, str(f.type)) for f in schema)


def schema_versions(paths: Iterable[str]) -> set[int]:
    """Schema versions found in the footers of the given segments (cheap: footers only; a local one
    read once per process while the file stays the same, those of ``s3://`` segments several at a time)."""
    return _segment_facts(paths)[0]


def _local_footer(path: str) -> tuple[tuple[int, int], int, tuple, int] | None:
    """(file key, schema version, column layout, rows) of a local segment, from its footer read once
    per process while the file stays the same; None for a file gone since it was listed or damaged."""
    try:
        st = os.stat(path)
    except FileNotFoundError:  # removed since the listing (compaction, retention): not read either
        return None
    key = (st.st_mtime_ns, st.st_size)
    known = _VERSIONS.get(path)
    if known is None or known[0] != key:
        damaged = _DAMAGED.get(path)
        if damaged is not None and damaged[0] == key:
            return None
        try:
            meta = pq.read_metadata(path)
        except (pa.ArrowInvalid, OSError) as exc:  # a footer that does not parse: left out
            _damaged(path, key, str(exc).split(". ")[0])
            return None
        known = (key, *_facts(meta.schema.to_arrow_schema()), meta.num_rows)
        _VERSIONS[path] = known
    return known


def segment_rows(con: duckdb.DuckDBPyConnection, table: str) -> int | None:
    """Rows in ``table``'s segments now (their footers: no scan), or None where a location is a
    bucket. Lists the table again, so segments written since the open count."""
    try:
        (roots,) = con.execute("SELECT roots FROM telemetry_roots").fetchall()[0]
    except duckdb.CatalogException:
        return None
    if roots is None:
        return None
    footers = (_local_footer(p) for root in roots for p in _walk(os.path.join(root, table)))
    return sum(f[3] for f in footers if f is not None)


def _segment_facts(paths: Iterable[str]) -> tuple[set[int], set[tuple]]:
    """(schema versions, column layouts (name, type)) found in the footers of the given segments."""
    paths = list(paths)
    versions: set[int] = set()
    layouts: set[tuple] = set()
    remote = [p for p in paths if p.startswith("s3://")]
    if remote:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(_S3_READERS) as pool:
            for schema in pool.map(_read_schema, remote):
                version, layout = _facts(schema)
                versions.add(version)
                layouts.add(layout)
    for path in paths:
        if path.startswith("s3://"):
            continue
        known = _local_footer(path)
        if known is None:
            continue
        versions.add(known[1])
        layouts.add(known[2])
    return versions, layouts


def open_telemetry(
    dirs: str | os.PathLike | Iterable[str | os.PathLike],
    con: duckdb.DuckDBPyConnection | None = None,
    *,
    require_data: bool = True,
    check_versions: bool = True,
    rollups: bool = True,
) -> duckdb.DuckDBPyConnection:
    """Return a DuckDB connection with one view per telemetry table over all of ``dirs``.

    ``dirs`` are directories or ``s3://bucket/prefix`` locations, mixed as wished.

    Views: ``gpu_samples``, ``process_samples``, ``pool_events`` (see ``collector.schema``), each with
    the hive columns ``date`` and ``host``; ``gpu_samples`` holds the physical GPUs' rows and
    ``lease_samples`` the rows a collector recorded inside a gpupool lease (source 'lease': a lease's
    slice of a pool GPU, not a GPU of its own). Raises ``TelemetryError`` for a missing directory, for no
    data at all (unless ``require_data=False``) and for segments of a schema version this code does
    not read. With ``rollups`` (the default) it also opens the rollup tables and their marks
    (``analytics._rollup``); ``rollups=False`` answers everything from raw samples.
    """
    given = [dirs] if isinstance(dirs, (str, os.PathLike, S3Location)) else list(dirs)
    roots = [_location(d) for d in given]
    if not roots:
        raise TelemetryError(
            "no telemetry directory given", "pass one or more directories written by gpustat-collect"
        )
    for root in roots:
        _check_location(root)
    con = con if con is not None else duckdb.connect()
    s3 = next((r for r in roots if isinstance(r, S3Location)), None)
    if s3 is not None and "s3" not in con.list_filesystems():
        con.register_filesystem(_s3_files(s3))
    # Long scans would otherwise draw a progress bar on the terminal of whoever runs a report.
    # (Inside Jupyter DuckDB refuses the setting unless ipywidgets is installed; it draws none there.)
    with contextlib.suppress(duckdb.Error):
        con.execute("SET enable_progress_bar = false")
    with contextlib.suppress(duckdb.Error):
        # Each query binds its views again: keep the files' footers instead of reading them each time.
        con.execute("SET parquet_metadata_cache = true")
    found_any = False
    listed: dict[tuple[Location, str], list[str]] = {}  # each table of each root listed once
    damaged: list[str] = []
    for table in (*TABLES.values(), *(ROLLUP_TABLES.values() if rollups else ())):
        per_root = {root: _segments(root, table.name) for root in roots}
        bad = {f for segs in per_root.values() for f in segs if not f.startswith("s3://") and not _intact(f)}
        if bad:
            per_root = {r: [f for f in segs if f not in bad] for r, segs in per_root.items()}
        listed.update(((root, table.name), segs) for root, segs in per_root.items())
        files = [f for segs in per_root.values() for f in segs]
        view = _VIEW_OF.get(table.name, table.name)
        if not files:
            damaged += sorted(bad)
            con.execute(f"CREATE OR REPLACE TEMP VIEW {view} AS {_empty_select(table)}")
            continue
        found_any = found_any or table.name in TABLES
        derived = table.name in ROLLUP_TABLES
        # Segments of one column layout are read by position: binding a view by name opens every
        # footer at every query (0.25 s for 900 segments); several layouts (segments written by
        # different versions of the collector) are read by name.
        by_name = not derived
        if check_versions and not derived:
            versions, layouts = _segment_facts(files)
            unread = {f for f in files if f in _DAMAGED}  # a footer that does not parse
            if unread:
                bad |= unread
                files = [f for f in files if f not in unread]
                per_root = {r: [f for f in segs if f not in unread] for r, segs in per_root.items()}
                listed.update(((root, table.name), segs) for root, segs in per_root.items())
            by_name = len(layouts) > 1
            unknown = versions - {SCHEMA_VERSION}
            if unknown:
                raise TelemetryError(
                    f"{table.name}: segments of schema version {sorted(versions)} found, this gpupool reads "
                    f"version {SCHEMA_VERSION}",
                    "upgrade gpupool, or point it at directories written by one version",
                )
        damaged += sorted(bad)
        if not files:  # every segment of the table damaged
            con.execute(f"CREATE OR REPLACE TEMP VIEW {view} AS {_empty_select(table)}")
            continue
        globs = ", ".join(
            _sql_literal(
                f"{root}/{table.name}/**/*.parquet"
                if is_s3(root)
                else os.path.join(str(root), table.name, "**", "*.parquet")
            )
            for root, segs in per_root.items()
            if segs
        )
        if (derived or bad) and not any(is_s3(r) for r in roots):
            # Rollup views name their files, listed here as their marks are read here (what a query
            # reads of them is cut at those marks anyway): a glob lists them again at every query,
            # 0.3 s for the 5,760 minute files of 512 GPUs over 90 days. A table with a damaged
            # segment is named file by file too, that one left out (a glob would take it back in).
            globs = ", ".join(_sql_literal(f) for f in sorted(files))
        # Rollup files all have the one schema the build writes (one file per host and day: thousands
        # over months), so they are read by position without opening every footer at each bind; a
        # file of another layout is an error, never a silent null (gpustat-report rollup --rebuild).
        # Their version is checked where their marks are read (``_register_rollup_marks``).
        _parquet_view(con, view, globs, union_by_name=by_name)
    _split_lease_rows(con)
    if rollups:
        _register_rollup_marks(con, roots, listed)
    else:
        con.execute("DROP TABLE IF EXISTS rollup_marks")
    # The directories read (NULL: some location is a bucket), for listings after the open
    # (``analytics._rollup.windowed_tail``); and no cached raw tail of an earlier open.
    con.execute("CREATE OR REPLACE TEMP TABLE damaged_segments (path VARCHAR, why VARCHAR)")
    if damaged:
        con.executemany(
            "INSERT INTO damaged_segments VALUES (?, ?)",
            [(p, _DAMAGED.get(p, ((0, 0), "?"))[1]) for p in damaged],
        )
    local = None if any(is_s3(r) for r in roots) else [str(r) for r in roots]
    con.execute("CREATE OR REPLACE TEMP TABLE telemetry_roots AS SELECT ?::VARCHAR[] AS roots", [local])
    con.execute("DROP VIEW IF EXISTS raw_tail_windowed")
    con.execute("DROP TABLE IF EXISTS raw_tail_read")
    con.execute("DROP TABLE IF EXISTS raw_tail_meta")
    if require_data and not found_any:
        raise TelemetryError(
            "no telemetry found in " + ", ".join(str(r) for r in roots),
            "is the collector writing there? gpustat-collect --out DIR",
        )
    return con


# A collector run inside a gpupool lease (gpuattach run) records the lease's slice of a pool GPU:
# source 'lease', the physical GPU's UUID, memory total = the partition. It is a view of a GPU the
# pool's own collectors already record, never another physical GPU: every reader of ``gpu_samples``
# (the fleet summary, idle, what-if, rollups) sees the physical GPUs' rows only, and the lease's rows
# are in ``lease_samples``.
_VIEW_OF = {"gpu_samples": "gpu_samples_all", "process_samples": "process_samples_all"}
LEASE_SOURCE = "lease"


def _split_lease_rows(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(
        f"CREATE OR REPLACE TEMP VIEW lease_samples AS SELECT * FROM gpu_samples_all WHERE source = '{LEASE_SOURCE}'"
    )
    # Which (host, GPU)s a lease recorded, found once here: the usual telemetry has none (the segments'
    # statistics of `source` let the scan skip nearly everything), and then gpu_samples and
    # process_samples stay plain views, no filter on every row of every query.
    lease_gpus = con.execute("SELECT DISTINCT host, gpu_uuid FROM lease_samples").fetchall()
    con.execute("CREATE OR REPLACE TEMP TABLE lease_gpus (host VARCHAR, gpu_uuid VARCHAR)")
    if not lease_gpus:
        con.execute("CREATE OR REPLACE TEMP VIEW gpu_samples AS SELECT * FROM gpu_samples_all")
        con.execute("CREATE OR REPLACE TEMP VIEW process_samples AS SELECT * FROM process_samples_all")
        return
    con.execute(
        "CREATE OR REPLACE TEMP VIEW gpu_samples AS SELECT * FROM gpu_samples_all "
        f"WHERE source IS DISTINCT FROM '{LEASE_SOURCE}'"
    )
    # Process rows carry no source: those a collector wrote inside a lease are the ones of a (host,
    # GPU) that only a lease recorded (a --local lease's collector shares the GPU host's own).
    hosts = sorted({h for h, _ in lease_gpus})
    physical = set(
        con.execute(
            f"SELECT DISTINCT host, gpu_uuid FROM gpu_samples WHERE host IN ({', '.join('?' for _ in hosts)})",
            hosts,
        ).fetchall()
    )
    only_lease = [g for g in lease_gpus if g not in physical]
    if only_lease:
        con.executemany("INSERT INTO lease_gpus VALUES (?, ?)", only_lease)
    con.execute(
        "CREATE OR REPLACE TEMP VIEW process_samples AS SELECT * FROM process_samples_all p WHERE NOT EXISTS "
        "(SELECT 1 FROM lease_gpus l WHERE l.host = p.host AND l.gpu_uuid = p.gpu_uuid)"
    )


def _parquet_view(con: duckdb.DuckDBPyConnection, name: str, sources: str, *, union_by_name: bool) -> None:
    """``name``: a view over the Parquet files or globs ``sources`` (SQL string literals, comma-separated)."""
    hive_types = ", ".join(f"'{k}': {v}" for k, v in PARTITION_TYPES.items())
    con.execute(
        f"CREATE OR REPLACE TEMP VIEW {name} AS SELECT * FROM read_parquet([{sources}], "
        f"hive_partitioning = true, union_by_name = {str(union_by_name).lower()}, hive_types = {{{hive_types}}})"
    )


def _host_of(path: str) -> str:
    return next(p.removeprefix("host=") for p in reversed(Path(path).parts) if p.startswith("host="))


def _raw_hosts(root: Location, segments: list[str]) -> set[str]:
    if isinstance(root, S3Location):
        return {_host_of(p) for p in segments}
    return {p.name.removeprefix("host=") for p in root.glob("gpu_samples/date=*/host=*")}


def _register_recent_minutes(
    con: duckdb.DuckDBPyConnection,
    roots: list[Location],
    listed: dict[tuple[Location, str], list[str]],
    marks: dict[tuple[str, str], tuple],
) -> None:
    """The view ``gpu_rollup_1m_recent``: the minute rollup files from the day of the lowest hour mark
    on, all that a range answered from hours reads of minutes (``analytics._rollup.rollup_relation``).
    Binding 5,760 minute files (512 GPUs over 90 days) costs more than reading the few it keeps."""
    firsts = [
        min(m[0], marks[(h, "1m")][0])
        for (h, level), m in marks.items()
        if level == "1h" and m[0] is not None and marks.get((h, "1m"), (None,))[0] is not None
    ]
    files = [f for r in roots for f in listed.get((r, "gpu_rollup_1m"), [])]
    if firsts and files and not any(is_s3(r) for r in roots):
        first = "date=" + datetime.fromtimestamp(min(firsts) / 1e6, UTC).date().isoformat()
        recent = sorted(f for f in files if os.path.basename(os.path.dirname(os.path.dirname(f))) >= first)
        if recent:
            _parquet_view(
                con, "gpu_rollup_1m_recent", ", ".join(map(_sql_literal, recent)), union_by_name=False
            )
            return
    con.execute("CREATE OR REPLACE TEMP VIEW gpu_rollup_1m_recent AS SELECT * FROM gpu_rollup_1m")


# path -> ((mtime ns, size), key-value metadata): a local rollup file's footer read once per process
# while the file stays the same (every open reads the newest file of each host and level: 192 at 64 hosts).
_ROLLUP_FOOTERS: dict[str, tuple[tuple[int, int], dict]] = {}


def _rollup_footer(path: str) -> dict:
    if path.startswith("s3://"):
        return _read_schema(path).metadata or {}
    st = os.stat(path)
    key = (st.st_mtime_ns, st.st_size)
    known = _ROLLUP_FOOTERS.get(path)
    if known is None or known[0] != key:
        known = (key, _read_schema(path).metadata or {})
        _ROLLUP_FOOTERS[path] = known
    return known[1]


def _register_rollup_marks(
    con: duckdb.DuckDBPyConnection, roots: list[Location], listed: dict[tuple[Location, str], list[str]]
) -> None:
    """The temp table ``rollup_marks(host, level, covers_to_us, idle_below, held_mem_bytes)``: per host
    with raw samples and rollup level, how far its rollups reach (analytics._rollup: the newest day's
    file says). NULL where a directory holds the host's raw samples but no rollups of it: all raw."""
    marks: dict[tuple[str, str], tuple[int | None, float | None, int | None]] = {}
    for root in roots:
        raw_hosts = _raw_hosts(root, listed[(root, "gpu_samples")])
        for level, name in (("1m", "gpu_rollup_1m"), ("1h", "gpu_rollup_1h"), ("1d", "gpu_rollup_1d")):
            newest: dict[str, tuple[str, str]] = {}  # host -> (date=YYYY-MM-DD, path): dates sort as text
            for path in listed[(root, name)]:
                host_dir, _ = os.path.split(path)
                date_dir, host = os.path.split(host_dir)
                host, date = host.removeprefix("host="), os.path.basename(date_dir)
                if host not in newest or date > newest[host][0]:
                    newest[host] = (date, path)
            for host in raw_hosts | set(newest):
                mark: tuple[int | None, float | None, int | None] = (None, None, None)
                if host in newest:
                    footer = _rollup_footer(newest[host][1])
                    meta = json.loads(footer.get(METADATA_ROLLUP_KEY, b"{}"))
                    if footer.get(METADATA_VERSION_KEY) != str(SCHEMA_VERSION).encode():
                        meta = {}  # rollups of another schema version: this host reads raw samples
                    if meta.get("weights") != WEIGHTS_RULE:
                        meta = {}  # weights of an earlier rule: raw samples until a build redoes them
                    if "covers_to_us" in meta:
                        mark = (int(meta["covers_to_us"]), meta.get("idle_below"), meta.get("held_mem_bytes"))
                old = marks.get((host, level))
                if old is not None and (old[0] is None or mark[0] is None):
                    mark = (None, None, None)  # one directory has this host's samples without rollups
                elif old is not None and old[0] < mark[0]:
                    mark = old  # several directories: the lowest mark (raw after it is in every one)
                marks[(host, level)] = mark
    _register_recent_minutes(con, roots, listed, marks)
    con.execute(
        "CREATE OR REPLACE TEMP TABLE rollup_marks (host VARCHAR, level VARCHAR, covers_to_us BIGINT, "
        "idle_below DOUBLE, held_mem_bytes BIGINT)"
    )
    if marks:  # one statement (executemany: a statement per row, 0.2 s for 64 hosts)
        rows = ", ".join("(?, ?, ?::BIGINT, ?::DOUBLE, ?::BIGINT)" for _ in marks)
        con.execute(
            f"INSERT INTO rollup_marks VALUES {rows}",
            [v for (h, lv), m in marks.items() for v in (h, lv, *m)],
        )


# Raw samples of one host without rollups above which every summary gets slow (about a second; a week
# of 64 GPUs at 10 s is 20 s a report, 0.35 s once rollups exist).
UNROLLED_ROWS = 200_000


def unrolled_hosts(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Hosts whose raw gpu_samples have no rollups, with their raw rows, where those are enough to make
    every summary slow: telemetry written by an older version, copied raw, backfilled or replayed.
    Empty where a location is a bucket (rollups are built in a directory) or rollups were not opened."""
    try:
        (roots,) = con.execute("SELECT roots FROM telemetry_roots").fetchall()[0]
        hosts = [
            h
            for (h,) in con.execute(
                "SELECT DISTINCT host FROM rollup_marks WHERE level = '1m' AND covers_to_us IS NULL"
            ).fetchall()
        ]
    except duckdb.CatalogException:
        return {}
    if roots is None:
        return {}
    slow = {}
    for host in hosts:
        footers = (
            _local_footer(p)
            for root in roots
            for day in Path(root, "gpu_samples").glob("date=*")
            for p in _walk(str(day / f"host={host}"))
        )
        rows = sum(f[3] for f in footers if f is not None)
        if rows >= UNROLLED_ROWS:
            slow[host] = rows
    return slow


def clock_steps_note(con: duckdb.DuckDBPyConnection) -> str | None:
    """The clocks that stepped back in imported logs (the ``clock_steps`` the importers record), in a
    line: where and by how much, and that the samples after each step were placed after their
    predecessors (so each counts once); None where none did."""
    from collector.words import clock_steps

    steps = con.execute(
        "SELECT coalesce(gpu_index::VARCHAR, gpu_uuid), host, step_s, stamped_ts, file, position, samples "
        "FROM clock_steps ORDER BY ts, host, gpu_index"
    ).fetchall()
    if not steps:
        return None
    line = clock_steps(steps)
    return line[0].upper() + line[1:]


def telemetry_notes(con: duckdb.DuckDBPyConnection) -> list[str]:
    """One line for each thing about the telemetry a page should say before its figures: segments left
    out as damaged, hosts slow for want of rollups (and the command that fixes each), clocks that
    stepped back in imported logs."""
    from collector.words import plural

    notes = []
    damaged = damaged_segments(con)
    if damaged:
        path, why = damaged[0]
        notes.append(
            f"{plural(len(damaged), 'damaged telemetry segment')} left out (first: {path}: {why}); "
            "gpustat-collect compact DIR moves them aside"
        )
    slow = unrolled_hosts(con)
    if slow:
        named = ", ".join(sorted(slow)[:3]) + (", …" if len(slow) > 3 else "")
        notes.append(
            f"{plural(len(slow), 'host')} ({named}) without rollups: every figure reads "
            f"{sum(slow.values()):,} raw samples and is slow; gpustat-report rollup DIR builds them"
        )
    stepped = clock_steps_note(con)
    if stepped:
        notes.append(stepped)
    return notes
