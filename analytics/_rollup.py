"""Rollups: ``gpu_samples`` pre-aggregated per GPU per minute, per hour and per day.

A month of 64 GPUs at 1 Hz is 166 M raw rows; its minute rollup is 2.8 M rows, its hourly one 46 k and
its daily one 1,920. ``build_rollups`` (``gpustat-report rollup DIR``) writes them beside the raw
tables, in the same layout (``collector.schema``: ``gpu_rollup_1m``, ``gpu_rollup_1h``,
``gpu_rollup_1d``), one file per date and host::

    <dir>/gpu_rollup_1m/date=YYYY-MM-DD/host=<host>/rollup.parquet
    <dir>/gpu_rollup_1h/date=YYYY-MM-01/host=<host>/rollup.parquet   (hours: a file per month)
    <dir>/gpu_rollup_1d/date=YYYY-MM-01/host=<host>/rollup.parquet   (UTC days: a file per month)

(A file per day and host for hours too would be 5 760 files of ~200 rows for 512 GPUs over 90 days:
reading them costs more than their rows.)

**Days** are made from the hour rows after each build (``_build_days``: sums add, histograms merge),
up to the hour mark floored to the day, and answer the whole days of a range on the hour; the hours
around them come from hourly rows (``rollup_relation``). Over 90 days of 512 GPUs a summary reads 46 k
day rows instead of 1.1 M hour rows. A directory whose rollups have no days yet answers from hours;
its next build makes them (``nothing new to roll up`` included). Retention looks at the minute and
hour marks only: days are never made from raw samples.

**What a row holds.** Per GPU and period (and ``fb``, see below): the sample count, the observed
seconds — the sum of the samples' weights exactly as ``_weights`` defines them, computed over the
host's whole raw history at build time — weighted sums for the means (utilization.gpu and SM activity
at the summary's 0.001 steps, memory used), idle and held-but-idle seconds under the thresholds the
build fixed (``ROLLUP_OPTIONS``: idle below 5 %, held with 1 GiB in use — the report's defaults; a
question with other thresholds is answered from raw samples), lost and simulated seconds, gap time,
first/last sample, the intervals (binned to 10 ms, for the ticks the summary states) and weighted
histograms of utilization.gpu and SM activity in 1 % bins. Percentiles from rollups are nearest-rank
over those bins and report a bin's lower edge: at most 0.01 below the raw answer (exact where values
are whole percents, as NVML reports them); the report's 5 % distribution bins are exact. Samples that
had no local spacing (``fb``; an entity of one or two instants) keep their unit weights and are scaled
by the asking query's fleet tick, as ``_weights`` does for raw rows.

**Exactness.** Over a range that starts and ends on period boundaries, counts, observed time, idle
time and means equal the raw computation over the whole history (float rounding aside). Where a
range cuts the data, the raw computation treats the last sample before the cut as a GPU's last (one
nominal interval) while the rollup keeps its weight from the whole history (the time to its next sample):
the two agree wherever sampling is regular at the cut.

**Never counted twice: the watermark.** A build covers, per host, the closed minutes before its
*watermark* ``W`` = the host's newest sample minus ``LAG_S``, floored to the minute (hours: floored to
the hour); samples at or after it stay raw-only. Every file records in its footer (``gpupool.rollup``,
JSON) the span it covers — its day, cut at the watermark — and the thresholds it fixed. Readers take
a host's watermark from its newest day's file and read rollup rows before it and raw samples from it
on (``plan``), so a rollup and the samples it summarises are never both counted. Files are written
day by day in date order, each to a hidden temporary name, fsynced and renamed over the previous
build's file (``collector.writer.write_segment``): a kill -9 leaves whole files of the new build for
earlier days and of the old build for later ones, both covering every minute before the newest file's
mark. One build at a time per directory (a lock file).

**Incremental.** A build starts, per host, at its previous hour mark (the hours after it are made
again from minutes) and leaves the files of earlier days as they are; the first day it writes keeps
the previous file's rows before its start. It runs in steps of whole days (about ``STEP_ROWS`` raw
rows each, a larger day split by GPU), so memory stays flat whatever the history. A sample's weight
looks at the four rows before it and the five after it: each step reads, per GPU, from its fourth
sample before the step to its fifth after it (``MARGIN_US`` either side, further for a GPU with a
gap there), so the result equals a build from scratch over the same raw samples (tested).
Raw samples that arrive later for times before a mark (an import of old logs) are rolled up by a
build with ``since`` (the import's first sample) or ``rebuild`` (from the oldest raw sample kept).

**Retention** (``expire_raw``, ``--keep-raw``): a raw ``gpu_samples`` day partition older than the
setting is deleted only when both levels' marks of its host are at least ``MARGIN_US`` past the
day's end; a day no rollup covers is kept whatever its age. Readers then answer from the rollups
before the mark as before. ``process_samples`` and ``pool_events`` are kept: attribution and the
what-if read them and no rollup summarises them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import glob
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from analytics import _rows, _weights
from analytics._scope import Scope, utc
from analytics._telemetry import _intact, open_telemetry
from analytics._weights import weighted_rows_sql
from collector.schema import DAMAGED_DIR, METADATA_ROLLUP_KEY, ROLLUP_TABLES, SCHEMA_VERSION
from collector.writer import conform, write_segment

MINUTE_US = 60_000_000
HOUR_US = 3_600_000_000
DAY_US = 86_400_000_000
LAG_S = 600  # a build leaves the last 10 minutes of each host raw-only: their weights need later samples
MARGIN_US = LAG_S * 1_000_000  # raw read from this long before a watermark, for the first rows' neighbours
HIST_PER_UNIT = 100  # histogram bins per unit ratio: 1 %
FILE_NAME = "rollup.parquet"
STEP_ROWS = 4_000_000  # raw rows per windowed step of a build (whole days; keeps its memory flat)
# The levels built from raw samples (their marks decide what is raw and what may expire) and the
# daily level, made from the hour rows (its mark: the hour mark floored to the UTC day).
LEVELS = {"1m": ("gpu_rollup_1m", MINUTE_US), "1h": ("gpu_rollup_1h", HOUR_US)}
DAY_TABLE = "gpu_rollup_1d"


# -- building ----------------------------------------------------------------------------------------


@dataclass
class RollupResult:
    hosts: int = 0
    samples: int = 0
    minute_rows: int = 0
    hour_rows: int = 0
    day_rows: int = 0
    files: int = 0


_AGGREGATES = """
    count(*) AS samples, min(t) AS first_us, max(t) AS last_us,
    arg_max(gpu_index, t) AS gpu_index, arg_max(gpu_name, t) AS gpu_name,
    sum(w) AS observed_s, sum(gap) AS gap_s,
    sum(w) FILTER (WHERE ub IS NOT NULL) AS util_s, sum(w * ub) FILTER (WHERE ub IS NOT NULL) / 1000 AS util_sum,
    sum(w) FILTER (WHERE ub IS NOT NULL AND flags & 2 = 2) AS util_gpm_s,
    sum(w * ub) FILTER (WHERE ub IS NOT NULL AND flags & 2 = 2) / 1000 AS util_gpm_sum,
    sum(w) FILTER (WHERE ab IS NOT NULL) AS sm_s, sum(w * ab) FILTER (WHERE ab IS NOT NULL) / 1000 AS sm_sum,
    sum(w * util_gpu_mean) AS util_raw_sum, sum(w * sm_activity) AS sm_raw_sum,
    count(util_gpu_mean) AS util_n, sum(util_gpu_mean) AS util_plain_sum,
    sum(w) FILTER (WHERE mem_total_bytes > 0) AS mem_ratio_s,
    sum(w * mem_used_bytes / nullif(mem_total_bytes, 0)) AS mem_ratio_sum,
    sum(w) FILTER (WHERE mem_used_bytes IS NOT NULL) AS mem_s, sum(w * mem_used_bytes) AS mem_used_sum,
    max(mem_used_bytes) AS mem_used_peak, max(mem_total_bytes) AS mem_total,
    coalesce(sum(w) FILTER (WHERE ub < ?), 0) AS idle_s, coalesce(sum(w) FILTER (WHERE flags & 1 = 1), 0) AS held_idle_s,
    coalesce(sum(w) FILTER (WHERE flags & 4 = 4), 0) AS lost_s, coalesce(sum(w) FILTER (WHERE flags & 8 = 8), 0) AS simulated_s
"""
_SUMS = [
    "samples",
    "observed_s",
    "gap_s",
    "util_s",
    "util_sum",
    "util_gpm_s",
    "util_gpm_sum",
    "sm_s",
    "sm_sum",
    "mem_s",
    "mem_used_sum",
    "idle_s",
    "held_idle_s",
    "lost_s",
    "simulated_s",
]
# The timeline's means, and the what-if's plain (unweighted) per-step means of utilization.gpu.
_TIMELINE_SUMS = ("util_raw_sum", "sm_raw_sum", "mem_ratio_s", "mem_ratio_sum", "util_n", "util_plain_sum")

# GROUPING(ubin, abin, dq) of each grouping set: the period's totals, its two histograms, its intervals.
_G_TOTAL, _G_UTIL, _G_SM, _G_INTERVAL = 7, 3, 5, 6

_ASSEMBLE = """
    WITH b AS (SELECT * FROM rollup_gs WHERE gid = {total}),
    u AS (SELECT uuid, m, fbk, list(ubin ORDER BY ubin) AS util_hist_bin, list(observed_s ORDER BY ubin) AS util_hist_s
          FROM rollup_gs WHERE gid = {util} AND ubin IS NOT NULL GROUP BY uuid, m, fbk),
    a AS (SELECT uuid, m, fbk, list(abin ORDER BY abin) AS sm_hist_bin, list(observed_s ORDER BY abin) AS sm_hist_s
          FROM rollup_gs WHERE gid = {sm} AND abin IS NOT NULL GROUP BY uuid, m, fbk),
    i AS (SELECT uuid, m, fbk, list(dq ORDER BY dq) AS interval_us, list(samples ORDER BY dq) AS interval_n
          FROM rollup_gs WHERE gid = {interval} AND dq IS NOT NULL GROUP BY uuid, m, fbk)
    SELECT b.m AS ts_us, b.gpu_index, b.uuid AS gpu_uuid, b.gpu_name, b.fbk, {sums},
           b.first_us, b.last_us, b.mem_used_peak, b.mem_total,
           u.util_hist_bin, u.util_hist_s, a.sm_hist_bin, a.sm_hist_s, i.interval_us, i.interval_n
    FROM b LEFT JOIN u USING (uuid, m, fbk) LEFT JOIN a USING (uuid, m, fbk) LEFT JOIN i USING (uuid, m, fbk)
    WHERE b.m < ?
"""

# Hours from minutes (days from hours): sums add, histograms and interval counts merge bin by bin.
_HOURS = """
    WITH mins AS (SELECT *, ts_us // {hour} * {hour} AS h FROM {source} WHERE ts_us < ?),
    b AS (SELECT gpu_uuid, h, fbk, arg_max(gpu_index, last_us) AS gpu_index, arg_max(gpu_name, last_us) AS gpu_name,
                 {sums}, min(first_us) AS first_us, max(last_us) AS last_us,
                 max(mem_used_peak) AS mem_used_peak, max(mem_total) AS mem_total
          FROM mins GROUP BY gpu_uuid, h, fbk),
    {lists}
    SELECT b.h AS ts_us, b.gpu_index, b.gpu_uuid, b.gpu_name, b.fbk, {bsums}, b.first_us, b.last_us,
           b.mem_used_peak, b.mem_total, {list_cols}
    FROM b {joins}
"""
_LISTS = (("util_hist_bin", "util_hist_s"), ("sm_hist_bin", "sm_hist_s"), ("interval_us", "interval_n"))


def _hours_sql(period_us: int = HOUR_US, source: str = "minute_rows") -> str:
    """SQL merging the rows of ``source`` (the build's working form) into periods of ``period_us``
    before its one parameter."""
    lists, joins, cols = [], [], []
    for i, (key, val) in enumerate(_LISTS):
        lists.append(
            f"""l{i} AS (SELECT gpu_uuid, h, fbk, list(k ORDER BY k) AS {key}, list(v ORDER BY k) AS {val}
                FROM (SELECT gpu_uuid, h, fbk, k, sum(v) AS v
                      FROM (SELECT gpu_uuid, h, fbk, unnest({key}) AS k, unnest({val}) AS v FROM mins)
                      GROUP BY gpu_uuid, h, fbk, k)
                GROUP BY gpu_uuid, h, fbk)"""
        )
        joins.append(f"LEFT JOIN l{i} USING (gpu_uuid, h, fbk)")
        cols += [f"l{i}.{key}", f"l{i}.{val}"]
    return _HOURS.format(
        hour=period_us,
        source=source,
        sums=", ".join(f"sum({c}) AS {c}" for c in (*_SUMS, *_TIMELINE_SUMS)),
        bsums=", ".join(f"b.{c}" for c in (*_SUMS, *_TIMELINE_SUMS)),
        lists=",\n".join(lists),
        list_cols=", ".join(cols),
        joins=" ".join(joins),
    )


def _to_schema(name: str, data: pa.Table) -> pa.Table:
    """Rows of the build's working form (epoch µs, fbk) as the rollup table's schema."""
    table = ROLLUP_TABLES[name]
    fb = pc.if_else(pc.equal(data.column("fbk"), -2), pa.scalar(None, pa.int64()), data.column("fbk"))
    arrays = []
    for field in table.arrow_schema:
        if field.name == "schema_version":
            arrays.append(pa.array([SCHEMA_VERSION] * data.num_rows, field.type))
        elif field.name == "fb":
            arrays.append(fb.cast(pa.int64()))
        elif field.name in ("ts", "first_ts", "last_ts"):
            src = {"ts": "ts_us", "first_ts": "first_us", "last_ts": "last_us"}[field.name]
            arrays.append(data.column(src).cast(pa.int64()).cast(field.type))
        else:
            arrays.append(data.column(field.name).cast(field.type))
    return pa.Table.from_arrays(arrays, schema=table.arrow_schema)


def _day_us(day: dt.date) -> int:
    return int(dt.datetime.combine(day, dt.time(), dt.UTC).timestamp()) * 1_000_000


def _day_of(us: int) -> dt.date:
    return dt.datetime.fromtimestamp(us / 1e6, dt.UTC).date()


def _iso(us: int) -> str:
    return dt.datetime.fromtimestamp(us / 1e6, dt.UTC).isoformat()


def _ts(us: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(us // 1_000_000, dt.UTC) + dt.timedelta(microseconds=us % 1_000_000)


def _rollup_path(root: Path, name: str, day: dt.date, host: str) -> Path:
    return root / name / f"date={day.isoformat()}" / f"host={host}" / FILE_NAME


def host_marks(root: Path, host: str) -> dict[str, int | None]:
    """{level: covered up to (epoch µs) or None} of one host's rollups in ``root``: the newest day's
    file of each level says (its footer)."""
    return {level: _mark(root, name, host) for level, (name, _) in LEVELS.items()}


def _files(root: Path, name: str, host: str) -> list[Path]:
    return sorted((root / name).glob(f"date=*/host={glob.escape(host)}/{FILE_NAME}"))


def _mark(root: Path, name: str, host: str) -> int | None:
    files = _files(root, name, host)
    meta = _footer(files[-1]) if files else {}
    return int(meta["covers_to_us"]) if "covers_to_us" in meta else None


def _build_days(con, root: Path, host: str, redo_from: int | None) -> tuple[int, int]:
    """Bring the host's daily rows up to date with its hour rows: the UTC days before its hour mark
    floored to the day, from its previous day mark on (from ``redo_from``'s day where the build made
    hours again before it). Day rows merge the day's hour rows as hour rows merge minutes. Returns
    (rows, files) written."""
    hour_mark = _mark(root, HOUR_FILE_TABLE, host)
    if hour_mark is None:
        return 0, 0
    day_mark = hour_mark // DAY_US * DAY_US
    start = _mark(root, DAY_TABLE, host)
    if redo_from is not None:
        start = min(start if start is not None else redo_from, redo_from) // DAY_US * DAY_US
    if start is not None and start >= day_mark:
        return 0, 0
    files = _files(root, HOUR_FILE_TABLE, host)
    if start is not None:  # hour files are monthly: from the month of the first day made again
        first = _file_start(HOUR_FILE_TABLE, _day_of(start)).isoformat()
        files = [f for f in files if f.parent.parent.name.removeprefix("date=") >= first]
    if not files:
        return 0, 0
    hours = pa.concat_tables(
        [pq.read_table(f, partitioning=None).replace_schema_metadata(None) for f in files]
    )
    con.register("hour_src", hours)
    lo = start if start is not None else -(1 << 62)
    con.register(
        "hour_rows",
        con.sql(
            "SELECT * EXCLUDE (ts, fb, first_ts, last_ts, schema_version), epoch_us(ts) AS ts_us, "
            "coalesce(fb, -2) AS fbk, epoch_us(first_ts) AS first_us, epoch_us(last_ts) AS last_us "
            "FROM hour_src WHERE epoch_us(ts) >= ?",
            params=[lo],
        ).to_arrow_table(),
    )
    days = con.sql(_hours_sql(DAY_US, "hour_rows"), params=[day_mark]).to_arrow_table()
    con.unregister("hour_rows")
    con.unregister("hour_src")
    if start is None:
        if not days.num_rows:
            return 0, 0
        start = pc.min(days.column("ts_us")).as_py()
    return days.num_rows, _write_days(root, DAY_TABLE, host, days, start, day_mark, DAY_US)


def _write_day(
    root: Path,
    name: str,
    host: str,
    day: dt.date,
    rows: pa.Table,
    keep_before: int,
    covered_to: int,
    period_us: int,
) -> None:
    """Write the file of ``name`` that starts on ``day`` (a day; for hours a month): the previous
    file's rows before ``keep_before`` (a build that starts inside it leaves them as they are), then
    ``rows``; the footer records the span covered."""
    path = _rollup_path(root, name, day, host)
    start, end = _day_us(day), _day_us(_file_end(name, day))
    if (keep_before > start or covered_to < end) and path.exists():
        # Only [keep_before, covered_to) is replaced: a step that ends inside the file (an hour file
        # holds a month) leaves the previous build's later rows, so a crash before the next step
        # still leaves every period before the newest file's mark in some file.
        old = pq.read_table(path, partitioning=None)
        kind = old.schema.field("ts").type
        old = old.filter(
            pc.or_(
                pc.less(old.column("ts"), pa.scalar(_ts(keep_before), kind)),
                pc.greater_equal(old.column("ts"), pa.scalar(_ts(covered_to), kind)),
            )
        )
        old = conform(ROLLUP_TABLES[name], old)  # rows of an earlier layout get its new columns (null)
        rows = pa.concat_tables([old.replace_schema_metadata(None), rows.replace_schema_metadata(None)])
    rows = rows.sort_by([("gpu_uuid", "ascending"), ("ts", "ascending")])
    options = _rows.DEFAULT_OPTIONS
    meta = {
        "period_s": period_us // 1_000_000,
        "covers_from": _iso(start),
        "covers_to": _iso(min(end, covered_to)),
        "covers_to_us": min(end, covered_to),
        "idle_below": options.idle_below,
        "held_mem_bytes": options.held_mem_bytes,
        "hist_bins_per_unit": HIST_PER_UNIT,
        "weights": _weights.RULE,
        "built": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    schema = ROLLUP_TABLES[name].arrow_schema
    rows = rows.cast(schema).replace_schema_metadata(
        {**(schema.metadata or {}), METADATA_ROLLUP_KEY: json.dumps(meta).encode()}
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_segment(path, rows)


def _write_days(
    root: Path, name: str, host: str, data: pa.Table, start: int, covered_to: int, period_us: int
) -> int:
    """One file per day of ``[start, covered_to)`` that has rows (in date order), and always one for
    the day of the last covered instant, so the host's mark is on record."""
    if covered_to <= start:
        return 0
    data = _to_schema(name, data)
    days = pc.cast(data.column("ts"), pa.date32())
    # Hours, days: a file per month (its first day), not thousands of small ones.
    if name in MONTH_FILE_TABLES:
        days = pc.cast(
            pc.strptime(pc.strftime(days, format="%Y-%m-01"), format="%Y-%m-%d", unit="s"), pa.date32()
        )
    last_day = _file_start(name, _day_of(covered_to - 1))
    todo = sorted({*pc.unique(days).to_pylist(), last_day})
    for day in todo:
        part = data.filter(pc.equal(days, pa.scalar(day, pa.date32())))
        _write_day(root, name, host, day, part, start, covered_to, period_us)
    return len(todo)


HOUR_FILE_TABLE = "gpu_rollup_1h"
MONTH_FILE_TABLES = (HOUR_FILE_TABLE, DAY_TABLE)


def _file_start(name: str, day: dt.date) -> dt.date:
    """The first day of the file of ``name`` that holds ``day``'s rows: the day, or for hours and
    days its month."""
    return day.replace(day=1) if name in MONTH_FILE_TABLES else day


def _file_end(name: str, start: dt.date) -> dt.date:
    if name not in MONTH_FILE_TABLES:
        return start + dt.timedelta(days=1)
    return (start.replace(day=28) + dt.timedelta(days=4)).replace(day=1)


@contextlib.contextmanager
def _build_lock(root: Path):
    with open(root / ".rollup.lock", "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            from analytics._telemetry import TelemetryError

            raise TelemetryError(
                f"another rollup build is running on {root}", "wait for it to finish, then run again"
            ) from None
        yield


def _remove_stale_tmp(root: Path) -> None:
    # A build killed mid-write leaves its hidden temporary file; readers never glob it.
    for name in ROLLUP_TABLES:
        for tmp in (root / name).glob(f"date=*/host=*/.{FILE_NAME}.tmp"):
            tmp.unlink(missing_ok=True)


def _raw_days(root: Path, host: str) -> list[dt.date]:
    return sorted(
        dt.date.fromisoformat(p.parent.name.removeprefix("date="))
        for p in (root / "gpu_samples").glob(f"date=*/host={glob.escape(host)}")
        if p.is_dir()
    )


def _read_bounds(con, host: str, a: int, b: int, final: bool) -> tuple[int | None, int | None]:
    """Which raw rows a step that rolls up ``[a, b)`` reads: each kept sample's weight looks at the
    ``NEIGHBOURS`` rows before it and the ``NEIGHBOURS`` + 1 after it (``_weights``), so per GPU with
    samples in the step, from its 4th sample before ``a`` to its 5th at or after ``b`` (None: no
    bound). Usually ``MARGIN_US`` either side holds them; a GPU with a gap there is looked up further."""
    lo, hi = a - MARGIN_US, b + MARGIN_US
    host_days = "host = ? AND date >= ? AND date <= ?"
    rows = con.execute(
        f"""SELECT gpu_uuid, count(*) FILTER (WHERE ts < ?), count(*) FILTER (WHERE ts >= ? AND ts < ?),
                   count(*) FILTER (WHERE ts >= ?)
            FROM gpu_samples WHERE {host_days} AND ts >= ? AND ts < ? GROUP BY gpu_uuid""",
        [
            _ts(a),
            _ts(a),
            _ts(b),
            _ts(b),
            host,
            _day_of(lo) - dt.timedelta(days=1),
            _day_of(hi),
            _ts(lo),
            _ts(hi),
        ],
    ).fetchall()
    read_lo: int | None = lo
    read_hi: int | None = None if final else hi
    for uuid, before, inside, after in rows:
        if not inside:
            continue
        if before < _weights.NEIGHBOURS:
            (t,) = con.execute(
                "SELECT min(t) FROM (SELECT epoch_us(ts) AS t FROM gpu_samples "
                f"WHERE host = ? AND gpu_uuid = ? AND ts < ? ORDER BY ts DESC LIMIT {_weights.NEIGHBOURS})",
                [host, uuid, _ts(a)],
            ).fetchone()
            if t is not None and read_lo is not None:
                read_lo = min(read_lo, t)
        if after < _weights.NEIGHBOURS + 1 and read_hi is not None:
            t, n = con.execute(
                "SELECT max(t), count(*) FROM (SELECT epoch_us(ts) AS t FROM gpu_samples "
                f"WHERE host = ? AND gpu_uuid = ? AND ts >= ? ORDER BY ts LIMIT {_weights.NEIGHBOURS + 1})",
                [host, uuid, _ts(b)],
            ).fetchone()
            read_hi = None if n < _weights.NEIGHBOURS + 1 else max(read_hi, t + 1)
    return read_lo, read_hi


def _step_minutes(
    con, host: str, a: int, b: int, read: tuple[int | None, int | None], parts: int
) -> pa.Table:
    """The minute rows of ``[a, b)`` of one host, from the raw rows in ``read`` (whole GPUs at a time:
    ``parts`` windowed queries)."""
    options = _rows.DEFAULT_OPTIONS
    bounds, bound_params = "", []
    if read[0] is not None:
        bounds += " AND date >= ? AND ts >= ?"
        bound_params += [_day_of(read[0]) - dt.timedelta(days=1), _ts(read[0])]
    if read[1] is not None:
        bounds += " AND date <= ? AND ts < ?"
        bound_params += [_day_of(read[1]), _ts(read[1])]
    minutes = []
    for i in range(parts):
        source = (
            f"(SELECT {_rows.SAMPLE_COLUMNS}, gpu_uuid AS uuid, gpu_index, gpu_name, util_gpu_mean, sm_activity "
            f"FROM gpu_samples WHERE host = ?{bounds} AND hash(gpu_uuid) % ? = ?)"
        )
        con.execute(
            f"""
            CREATE OR REPLACE TEMP TABLE rollup_gs AS
            WITH {weighted_rows_sql(source)}
            SELECT GROUPING(ubin, abin, dq) AS gid, uuid, m, fbk, ubin, abin, dq, {_AGGREGATES}
            FROM (SELECT *, t // {MINUTE_US} * {MINUTE_US} AS m, coalesce(fb, -2) AS fbk,
                         ub // {1000 // HIST_PER_UNIT} AS ubin, ab // {1000 // HIST_PER_UNIT} AS abin
                  FROM wr WHERE t >= ? AND t < ?)
            GROUP BY GROUPING SETS ((uuid, m, fbk), (uuid, m, fbk, ubin), (uuid, m, fbk, abin), (uuid, m, fbk, dq))
            """,
            [
                _rows.idle_bin(options.idle_below),
                options.held_mem_bytes,
                host,
                *bound_params,
                parts,
                i,
                _rows.idle_bin(options.idle_below),
                a,
                b,
            ],
        )
        sql = _ASSEMBLE.format(
            total=_G_TOTAL,
            util=_G_UTIL,
            sm=_G_SM,
            interval=_G_INTERVAL,
            sums=", ".join(f"b.{c}" for c in (*_SUMS, *_TIMELINE_SUMS)),
        )
        minutes.append(con.sql(sql, params=[b]).to_arrow_table())
    con.execute("DROP TABLE IF EXISTS rollup_gs")
    return pa.concat_tables(minutes)


def _steps(con, host: str, lo: int, watermark: int) -> list[tuple[int, int, int, int]]:
    """[(a, b, raw rows, windowed queries)]: ``[lo, watermark)`` cut at day boundaries into steps of
    about ``STEP_ROWS`` raw rows (a day larger than that is one step, split by GPU)."""
    counts = dict(
        con.execute(
            "SELECT date, count(*) FROM gpu_samples WHERE host = ? AND date >= ? AND date <= ? GROUP BY date",
            [host, _day_of(lo), _day_of(watermark)],
        ).fetchall()
    )
    steps, a, acc = [], lo, 0
    day = _day_of(lo)
    while True:
        n = counts.get(day, 0)
        if acc and acc + n > STEP_ROWS:  # the step so far ends before this day
            steps.append((a, _day_us(day), acc, max(1, -(-acc // STEP_ROWS))))
            a, acc = _day_us(day), 0
        acc += n
        day += dt.timedelta(days=1)
        b = min(_day_us(day), watermark)
        if b >= watermark:
            steps.append((a, b, acc, max(1, -(-acc // STEP_ROWS))))
            return steps


def _stale_weights(root: Path, host: str) -> bool:
    """Whether ``host``'s rollups hold weights of an earlier rule (``_weights.RULE``, in each file's
    footer): the build redoes them from the raw samples; readers answer from raw samples meanwhile."""
    minutes = _files(root, "gpu_rollup_1m", host)
    return bool(minutes) and _footer(minutes[-1]).get("weights") != _weights.RULE


def _footer(path: Path) -> dict:
    return json.loads((pq.read_schema(path).metadata or {}).get(METADATA_ROLLUP_KEY, b"{}"))


def _drop_legacy(root: Path, host: str) -> bool:
    """Whether ``host`` has rollups of the first layout (hour files per day, rows without the
    what-if's columns), which the build must redo from the raw samples. Its hour files are removed
    first: per-day ones kept beside monthly ones would count twice. Until the rebuild writes them
    again, readers take the host's minute rows, which cover the same time."""
    hours = list((root / HOUR_FILE_TABLE).glob(f"date=*/host={glob.escape(host)}/{FILE_NAME}"))
    per_day = any(not p.parent.parent.name.endswith("-01") for p in hours)
    minutes = sorted((root / "gpu_rollup_1m").glob(f"date=*/host={glob.escape(host)}/{FILE_NAME}"))
    old_rows = any("util_n" not in pq.read_schema(p).names for p in {*minutes[:1], *minutes[-1:]})
    if per_day or old_rows:
        for p in hours:
            p.unlink()
    return per_day or old_rows


def _move_damaged(root: Path, host: str) -> int:
    """Move the host's rollup files cut short (a full disk, a partial copy) to ``<root>/damaged/``,
    same relative path; returns how many. They are derived data: the build then makes them again."""
    moved = 0
    for name in ROLLUP_TABLES:
        for path in _files(root, name, host):
            if not _intact(str(path)):
                target = root / DAMAGED_DIR / path.relative_to(root)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(path, target)
                moved += 1
    return moved


def _build_host(
    con, root: Path, host: str, lag_s: float, rebuild: bool, since_us: int | None, say, result
) -> None:
    days = _raw_days(root, host)
    if not days:
        return
    newest, first = con.execute(
        "SELECT max(epoch_us(ts)), min(epoch_us(ts)) FILTER (WHERE date <= ?) FROM gpu_samples "
        "WHERE host = ? AND (date >= ? OR date <= ?)",
        [days[0], host, days[-1] - dt.timedelta(days=1), days[0]],
    ).fetchall()[0]
    if newest is None:
        return
    watermark = (newest - int(lag_s * 1_000_000)) // MINUTE_US * MINUTE_US
    moved = _move_damaged(root, host)
    if moved:
        say(f"{host}: {moved} damaged rollup file(s) moved aside to {root / DAMAGED_DIR}: rebuilding them")
        rebuild = True
    if _drop_legacy(root, host):
        say(f"{host}: rollups of an earlier layout found: rebuilding them")
        rebuild = True
    if _stale_weights(root, host):
        say(f"{host}: rollups of an earlier weight rule found: rebuilding them")
        rebuild = True
    marks = host_marks(root, host)
    start = first // HOUR_US * HOUR_US
    resume = None  # on from the previous build's hour mark: the hours after it are made from minutes again
    if not rebuild and None not in marks.values():
        resume = min(marks.values()) // HOUR_US * HOUR_US
    lo = start if resume is None else resume  # start: the whole raw history (rollups of expired days stay)
    if resume is not None and since_us is not None:
        lo = max(start, min(lo, since_us // HOUR_US * HOUR_US))
    if lo >= watermark or (lo == resume and marks["1m"] >= watermark):
        say(f"{host}: nothing new to roll up (raw after {_iso(max(lo, watermark))})")
        day_n, files = _build_days(con, root, host, None)  # hours of an earlier build not in days yet
        result.day_rows += day_n
        result.files += files
        if day_n:
            say(f"{host}: {day_n:,} day rows made from the hour rows")
        return
    t0 = time.monotonic()
    samples = minute_n = hour_n = 0
    for a, b, n, parts in _steps(con, host, lo, watermark):
        minute_rows = _step_minutes(con, host, a, b, _read_bounds(con, host, a, b, b == watermark), parts)
        hour_mark = b // HOUR_US * HOUR_US
        con.register("minute_rows", minute_rows)
        hour_rows = con.sql(_hours_sql(), params=[hour_mark]).to_arrow_table()
        con.unregister("minute_rows")
        # Minutes first: a reader that finds the hour level's mark also finds the minutes before it.
        result.files += _write_days(root, "gpu_rollup_1m", host, minute_rows, a, b, MINUTE_US)
        result.files += _write_days(root, "gpu_rollup_1h", host, hour_rows, a, hour_mark, HOUR_US)
        samples += n
        minute_n += minute_rows.num_rows
        hour_n += hour_rows.num_rows
    # Days last: a reader that finds the day level's mark also finds the hours before it.
    day_n, files = _build_days(con, root, host, lo)
    result.files += files
    result.hosts += 1
    result.samples += samples
    result.minute_rows += minute_n
    result.hour_rows += hour_n
    result.day_rows += day_n
    say(
        f"{host}: {samples:,} samples from {_iso(lo)} -> {minute_n:,} minute rows, "
        f"{hour_n:,} hour rows, {day_n:,} day rows, raw after {_iso(watermark)} ({time.monotonic() - t0:.1f} s)"
    )


def build_rollups(
    root: str | os.PathLike,
    *,
    progress: Callable[[str], None] | None = None,
    hosts: tuple[str, ...] = (),
    lag_s: float = LAG_S,
    rebuild: bool = False,
    since: dt.datetime | None = None,
) -> RollupResult:
    """Bring the minute and hour rollups of every host (or of ``hosts``) up to date with the raw
    samples, up to ``lag_s`` before each host's newest sample (the weights of the last samples
    covered need the few samples after them: keep it at least 5 ticks).

    Incremental: a host's build starts at its previous hour mark (days before it stay as they are);
    ``since`` starts it no later than that (raw samples that arrived for older times, e.g. an import);
    ``rebuild`` recomputes from the host's oldest raw sample. Either way the result equals a build
    from scratch over the same raw samples. Memory stays flat: steps of whole days, about
    ``STEP_ROWS`` raw rows each."""
    root = Path(root)
    say = progress or (lambda _msg: None)
    result = RollupResult()
    con = open_telemetry(
        root, rollups=False
    )  # a missing or empty directory: TelemetryError, before anything is written
    with contextlib.suppress(duckdb.Error):
        con.execute("SET preserve_insertion_order = false")
    since_us = None if since is None else int(utc(since).timestamp() * 1_000_000)
    with _build_lock(root):
        _remove_stale_tmp(root)
        all_hosts = sorted(
            {p.name.removeprefix("host=") for p in (root / "gpu_samples").glob("date=*/host=*") if p.is_dir()}
        )
        todo = [h for h in all_hosts if not hosts or h in hosts]
        for number, host in enumerate(todo, 1):
            _build_host(
                con,
                root,
                host,
                lag_s,
                rebuild,
                since_us,
                lambda msg, n=number: say(f"[{n}/{len(todo)}] {msg}"),
                result,
            )
    return result


# -- reading -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """Which data answers a summary: rollup rows before each host's marks, raw samples after."""

    levels: tuple[str, ...]  # "1d", "1h", "1m" and/or "raw", coarsest first
    marks: dict[str, dict[str, int | None]]  # host -> {level: covered up to (epoch µs) or None}
    raw_from_us: dict[str, int]  # host -> raw samples from here on (hosts not listed: all raw)
    # With "1d": the whole UTC days of the range, [days_from_us, days_to_us) (None: unbounded); hours
    # answer its parts before and after them (the range is on the hour).
    days_from_us: int | None = None
    days_to_us: int | None = None

    def describe(self) -> str:
        names = {"1d": "daily rollups", "1h": "hourly rollups", "1m": "minute rollups", "raw": "raw samples"}
        text = " + ".join(names[lv] for lv in self.levels)
        if "raw" in self.levels and self.raw_from_us:
            text += f" (raw from {dt.datetime.fromtimestamp(min(self.raw_from_us.values()) / 1e6, dt.UTC):%Y-%m-%d %H:%M} UTC)"
        return text


def _epoch_us(ts: dt.datetime) -> int:
    return (utc(ts) - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)


def _aligned(ts: dt.datetime | None, period_us: int) -> bool:
    return ts is None or _epoch_us(ts) % period_us == 0


def rollups_built(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether some host's minute rollups exist (``gpustat-report rollup`` has run on this telemetry)."""
    try:
        return bool(
            con.execute("SELECT count(*) FROM rollup_marks WHERE covers_to_us IS NOT NULL").fetchone()[0]
        )
    except duckdb.CatalogException:
        return False


def plan(
    con: duckdb.DuckDBPyConnection, scope: Scope, options=None, bucket_s: int | None = None
) -> tuple[Plan | None, str]:
    """The rollups that can answer ``scope`` under ``options`` (None: no thresholds involved) in
    buckets of ``bucket_s`` (None: one answer for the range) exactly, or (None, why not)."""
    try:
        rows = con.execute(
            "SELECT host, level, covers_to_us, idle_below, held_mem_bytes FROM rollup_marks"
        ).fetchall()
    except duckdb.CatalogException:
        return None, "no rollups"
    marks: dict[str, dict[str, int | None]] = {}
    for host, level, covers_to, idle_below, held in rows:
        if scope.hosts and host not in scope.hosts:
            continue
        if (
            covers_to is not None
            and options is not None
            and (idle_below != options.idle_below or held != options.held_mem_bytes)
        ):
            return None, "thresholds differ from the rollups'"
        marks.setdefault(host, {})[level] = covers_to
    if not any(m.get("1m") is not None for m in marks.values()):  # hours are read only before minutes
        return None, "no rollups"
    levels = [
        lv
        for lv in ("1h", "1m")
        if _aligned(scope.start, LEVELS[lv][1])
        and _aligned(scope.end, LEVELS[lv][1])
        and (bucket_s is None or bucket_s * 1_000_000 % LEVELS[lv][1] == 0)
    ]
    if not levels:
        if bucket_s is not None and bucket_s % 60:
            return None, "the buckets are not whole minutes"
        return None, "the range is not on minute boundaries"
    levels = levels[:1] + (["1m"] if levels[0] == "1h" else [])  # hours, then the minutes after the last hour
    days_from = days_to = None
    if (
        levels[0] == "1h"
        and (bucket_s is None or bucket_s * 1_000_000 % DAY_US == 0)
        and any(m.get("1d") is not None for m in marks.values())
    ):
        # Whole days inside the range from daily rows, the hours around them from hourly ones.
        levels = ["1d", *levels]
        if scope.start is not None:
            days_from = -(-_epoch_us(scope.start) // DAY_US) * DAY_US
        if scope.end is not None:
            days_to = _epoch_us(scope.end) // DAY_US * DAY_US
    raw_from = {h: m["1m"] for h, m in marks.items() if m.get("1m") is not None}
    return Plan((*levels, "raw"), marks, raw_from, days_from, days_to), ""


def _values(mapping: dict) -> tuple[str, list]:
    """``(VALUES (?, ?[, ?]), ...)`` of host -> mark (or a tuple of marks), and its parameters."""
    rows, params = [], []
    for host, v in mapping.items():
        v = v if isinstance(v, tuple) else (v,)
        rows.append(f"(?, {', '.join('?::BIGINT' for _ in v)})")
        params += [host, *v]
    return f"(VALUES {', '.join(rows)})", params


def _case(mapping: dict[str, int], default: str) -> tuple[str, list]:
    if not mapping:
        return default, []
    parts, params = [], []
    for host, us in mapping.items():
        parts.append("WHEN ? THEN ?")
        params += [host, us]
    return f"CASE host {' '.join(parts)} ELSE {default} END", params


def raw_tail(p: Plan | None) -> tuple[str, list, str, list, str]:
    """(extra WHERE over gpu_samples, its params, extra column, its params, keep predicate over wr):
    raw samples from each host's mark on, read from MARGIN_US earlier so the first ones find their
    neighbours (``_weights``) but only kept from the mark. Without a plan: every raw sample."""
    if p is None:
        return "", [], "", [], ""
    case, case_params = _case(p.raw_from_us, "NULL")
    where = f" AND coalesce(epoch_us(ts) >= {case} - {MARGIN_US}, true)"
    params = list(case_params)
    if p.raw_from_us and all(h in p.raw_from_us for h in p.marks):
        # Prune by partition and by time: a date=D partition holds samples from D 00:00 up to and
        # including D+1 00:00, so a bound at midnight also reads the day before. The plain ``ts``
        # bound lets the Parquet reader skip row groups (compacted segments are in time order).
        first = min(p.raw_from_us.values()) - MARGIN_US
        where += " AND date >= ? AND ts >= ?"
        params += [_day_of(first - 1), _ts(first)]
    return where, params, f", {case} AS raw_from_us", case_params, "coalesce(t >= raw_from_us, true)"


TAIL_CACHE_ROWS = 4_000_000  # the most raw rows after the marks kept windowed per connection


def _tail_listing(roots: list[str], first_day: dt.date) -> str:
    """A signature of the raw segments from ``first_day`` on (names, sizes, mtimes): it changes when
    a segment lands, grows or goes."""
    import hashlib

    entries = []
    for root in roots:
        folder = os.path.join(root, "gpu_samples")
        try:
            days = [d for d in os.scandir(folder) if d.name >= f"date={first_day.isoformat()}"]
        except FileNotFoundError:
            continue
        for day in days:
            for dirpath, _dirs, files in os.walk(day.path):
                for name in files:
                    if name.endswith(".parquet") and not name.startswith("."):
                        with contextlib.suppress(FileNotFoundError):
                            st = os.stat(os.path.join(dirpath, name))
                            entries.append(f"{dirpath}/{name}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha1("\n".join(sorted(entries)).encode()).hexdigest()


def windowed_tail(con: duckdb.DuckDBPyConnection, p: Plan | None, scope: Scope) -> str | None:
    """The name of a relation of the raw samples after every host's minute mark with their weights
    (``_weights``: ``wr``'s columns beside the samples' own; a view over a temp table), or None
    where ``scope`` must window them itself. Every summary, timeline and heatmap of a connection reads the same raw tail (after
    the marks), so it is windowed once and kept while the segments it came from stay the same (a
    listing of the last days' folders, checked at each call). Valid for a scope whose time bounds cut
    none of the rows read (per GPU, a window is the same over all of them or the scope's); host and
    GPU filters pick whole GPUs, so they apply after the window as before it."""
    if p is None or not p.raw_from_us or not all(h in p.raw_from_us for h in p.marks):
        return None
    try:
        (roots,) = con.execute("SELECT roots FROM telemetry_roots").fetchall()[0]
        marks = con.execute(
            "SELECT host, covers_to_us FROM rollup_marks WHERE level = '1m' AND covers_to_us IS NOT NULL"
        ).fetchall()
        all_hosts = con.execute("SELECT count(DISTINCT host) FROM rollup_marks").fetchall()[0][0]
    except duckdb.CatalogException:
        return None
    if roots is None or not marks or len(marks) < all_hosts:  # a bucket, or a host all raw
        return None
    full = Plan(("1m", "raw"), {h: {"1m": m} for h, m in marks}, dict(marks))
    first = min(full.raw_from_us.values()) - MARGIN_US
    start, end = utc(scope.start), utc(scope.end)
    if (start is not None and _epoch_us(start) > first) or (
        end is not None and _epoch_us(end) <= max(full.raw_from_us.values())
    ):
        return None  # the range cuts the tail or ends before it: nothing to window for it
    signature = _tail_listing(roots, _day_of(first - 1))
    meta = None
    with contextlib.suppress(duckdb.CatalogException):
        meta = con.execute("SELECT * FROM raw_tail_meta").fetchall()[0]
    if meta is None or meta[0] != signature:
        meta = _window_tail(con, full, signature)
    _, rows, t_lo, t_hi, d_lo, d_hi = meta
    if rows is None:
        return None  # too many raw rows after the marks to keep: each query windows its own
    if start is not None and (
        t_lo is None or _epoch_us(start) > t_lo or start.date() - dt.timedelta(days=1) > d_lo
    ):
        return None
    if end is not None and (t_hi is None or _epoch_us(end) <= t_hi or end.date() < d_hi):
        return None
    return "raw_tail_windowed"


def raw_source(
    con: duckdb.DuckDBPyConnection, p: Plan | None, scope: Scope
) -> tuple[str | None, tuple[str, list, str, list, str]]:
    """(``windowed_tail``'s table or None, ``raw_tail``'s fragments): none are needed over that table,
    which holds exactly the rows they keep, with their weights."""
    windowed = windowed_tail(con, p, scope)
    return windowed, (("", [], "", [], "") if windowed else raw_tail(p))


# What readers of the windowed tail take of the raw samples (the summary, patterns, the extent).
TAIL_COLUMNS = (
    "host, gpu_uuid, ts, date, gpu_index, gpu_name, util_gpu_mean, sm_activity, mem_used_bytes, "
    "mem_total_bytes, state, simulated"
)


@contextlib.contextmanager
def _any_order(con: duckdb.DuckDBPyConnection):
    """The statements inside may produce their rows in any order: the LIMIT over a parallel scan
    then keeps no order across the files (a quarter of the raw tail's window at 512 GPUs)."""
    (was,) = con.execute("SELECT current_setting('preserve_insertion_order')").fetchone()
    con.execute("SET preserve_insertion_order = false")
    try:
        yield
    finally:
        con.execute(f"SET preserve_insertion_order = {'true' if was else 'false'}")


def _window_tail(con: duckdb.DuckDBPyConnection, full: Plan, signature: str) -> tuple:
    where, params, cols, col_params, keep = raw_tail(full)
    # One read: at most TAIL_CACHE_ROWS + 1 rows (more: a host whose rollups lag far behind; then
    # each query windows its own, in chunks), the rows read only as neighbours flagged.
    source = (
        f"(SELECT {TAIL_COLUMNS}, host AS host_, gpu_uuid AS uuid_, ts AS ts_{cols} "
        f"FROM gpu_samples WHERE true{where} LIMIT {TAIL_CACHE_ROWS + 1})"
    )
    with _any_order(con):
        con.execute(
            f"""CREATE OR REPLACE TEMP TABLE raw_tail_read AS
                WITH {weighted_rows_sql(source)}
                SELECT * EXCLUDE (host_, uuid_, ts_, final, tick), host_ AS host, uuid_ AS gpu_uuid, ts_ AS ts,
                       {keep} AS kept
                FROM wr""",
            [*col_params, *params],
        )
    (n, t_lo, t_hi, d_lo, d_hi) = con.execute(
        "SELECT count(*), min(t), max(t), min(date), max(date) FROM raw_tail_read"
    ).fetchall()[0]
    if n > TAIL_CACHE_ROWS:
        n = None
        con.execute("DROP TABLE raw_tail_read")
        con.execute("DROP VIEW IF EXISTS raw_tail_windowed")
    else:
        con.execute(
            "CREATE OR REPLACE TEMP VIEW raw_tail_windowed AS SELECT * EXCLUDE (kept) FROM raw_tail_read WHERE kept"
        )
    meta = (signature, n, t_lo, t_hi, d_lo, d_hi)
    con.execute(
        "CREATE OR REPLACE TEMP TABLE raw_tail_meta AS SELECT ? AS signature, ?::BIGINT AS rows, "
        "?::BIGINT AS t_lo, ?::BIGINT AS t_hi, ?::DATE AS d_lo, ?::DATE AS d_hi",
        list(meta),
    )
    return meta


def raw_after(p: Plan) -> tuple[str, list]:
    """(extra WHERE over gpu_samples, its params): exactly the raw samples from each host's mark on
    (for figures that need no neighbours: plain per-step aggregates)."""
    case, params = _case(p.raw_from_us, "NULL")
    where = f" AND coalesce(epoch_us(ts) >= {case}, true)"
    if p.raw_from_us and all(h in p.raw_from_us for h in p.marks):
        first = min(p.raw_from_us.values())
        where += " AND date >= ? AND ts >= ?"
        params += [_day_of(first - 1), _ts(first)]
    return where, list(params)


def rollup_relation(p: Plan, where: str, params: list) -> tuple[str, list]:
    """SQL of the rollup rows that answer (days inside the range before each host's day mark, hours
    around them up to its hour mark, minutes from there to its minute mark), with ``e`` the entity
    hash the raw rows use, and its parameters."""
    parts, all_params = [], []
    minute_marks = {h: m["1m"] for h, m in p.marks.items() if m.get("1m") is not None}
    # Hours only where minutes carry on from them: raw samples start at the minute mark.
    hour_marks = {
        h: min(m["1h"], minute_marks[h])
        for h, m in p.marks.items()
        if m.get("1h") is not None and h in minute_marks
    }
    # Days only where hours carry on from them, and only inside the range: per host [lo, hi).
    never, always = -(1 << 62), 1 << 62
    day_lo = p.days_from_us if p.days_from_us is not None else never
    days = {
        h: (day_lo, max(day_lo, min(m["1d"], hour_marks[h], p.days_to_us or always)))
        for h, m in p.marks.items()
        if "1d" in p.levels and m.get("1d") is not None and h in hour_marks
    }
    days = {h: w for h, w in days.items() if w[1] > w[0]}
    # Hour and day files hold a month each (date = its first day): the scope's day bounds apply to
    # each row's own day.
    by_row_day = "(SELECT * REPLACE (CAST(timezone('UTC', ts) AS DATE) AS date) FROM {table}{prune})"
    # Each host's marks joined in (a hash join: a CASE over the hosts per row costs seconds at 64 hosts).
    if days:
        values, vp = _values(days)
        parts.append(
            f"SELECT r.* FROM {by_row_day.format(table=DAY_TABLE, prune='')} r "
            f"JOIN {values} AS m(mh, lo, hi) ON r.host = m.mh "
            f"WHERE {where} AND epoch_us(ts) >= m.lo AND epoch_us(ts) < m.hi"
        )
        all_params += [*vp, *params]
    if "1h" in p.levels and hour_marks:
        values, vp = _values({h: (hi, *days.get(h, (None, None))) for h, hi in hour_marks.items()})
        prune, prune_params = "", []
        if days and set(days) == set(hour_marks):
            # Only the months of the hours around the days: before the first day (the range's
            # start is within a day of it) and from the day marks on.
            prune = " WHERE date >= ?" + (" OR date <= ?" if p.days_from_us is not None else "")
            prune_params = [_file_start(HOUR_FILE_TABLE, _day_of(min(w[1] for w in days.values())))]
            if p.days_from_us is not None:
                prune_params.append(_file_start(HOUR_FILE_TABLE, _day_of(p.days_from_us - 1)))
        parts.append(
            f"SELECT r.* FROM {by_row_day.format(table=HOUR_FILE_TABLE, prune=prune)} r "
            f"JOIN {values} AS m(mh, hi, dlo, dhi) ON r.host = m.mh "
            f"WHERE {where} AND ts < ? AND epoch_us(ts) < m.hi "
            "AND NOT coalesce(epoch_us(ts) >= m.dlo AND epoch_us(ts) < m.dhi, false)"
        )
        all_params += [*prune_params, *vp, *params, _ts(max(hour_marks.values()))]
    if minute_marks:
        from_hours = "1h" in p.levels and bool(hour_marks)
        values, vp = _values(
            {h: (hour_marks.get(h) if from_hours else None, m) for h, m in minute_marks.items()}
        )
        prune, prune_params, minutes = "", [], "gpu_rollup_1m"
        if from_hours and set(hour_marks) == set(minute_marks):
            # Only the minutes after the hour marks: the files from the day of the lowest hour mark
            # on (named at open: ``_telemetry``), their days from that day on (a rollup file's date
            # is its rows' day) and the row groups after it.
            first = min(hour_marks.values())
            prune, prune_params = " AND date >= ? AND ts >= ?", [_day_of(first), _ts(first)]
            minutes = "gpu_rollup_1m_recent"
        parts.append(
            f"SELECT r.* FROM {minutes} r JOIN {values} AS m(mh, lo, hi) ON r.host = m.mh "
            f"WHERE {where}{prune} AND coalesce(epoch_us(ts) >= m.lo, true) AND epoch_us(ts) < m.hi"
        )
        all_params += [*vp, *params, *prune_params]
    body = " UNION ALL BY NAME ".join(parts)
    return f"(SELECT *, hash(host, gpu_uuid) AS e FROM ({body}))", all_params


def span(
    con: duckdb.DuckDBPyConnection,
    p: Plan,
    where: str,
    params: list,
    windowed: str | None = None,
    *,
    rollups: bool = True,
) -> tuple[float | None, float | None]:
    """First and last sample (epoch seconds) in ``where``: the rollups' first/last before the marks,
    the raw samples after them (no scan of the raw history; ``windowed``: they are kept there).
    ``rollups=False``: of the raw samples after the marks only."""
    raw_where, raw_params, *_ = raw_tail(p) if windowed is None else ("", [])
    raw = f"SELECT epoch(min(ts)) AS lo, epoch(max(ts)) AS hi FROM {windowed or 'gpu_samples'} WHERE {where}{raw_where}"
    if not rollups:
        return con.execute(raw, [*params, *raw_params]).fetchone()
    rel, rp = rollup_relation(p, where, params)
    return con.execute(
        f"""SELECT min(lo), max(hi) FROM (
                SELECT epoch(min(first_ts)) AS lo, epoch(max(last_ts)) AS hi FROM {rel} UNION ALL {raw})""",
        [*rp, *params, *raw_params],
    ).fetchone()


@dataclass
class Rolled:
    gpus: list[tuple]  # (e, fb, host, uuid, index, name, first_us, last_us, mem_used_peak, mem_total, *sums)
    util_hist: list[tuple]  # (fb, bin 0.001 steps at the bin's lower edge, seconds)
    sm_hist: list[tuple]
    intervals: dict[tuple[int, int], int]


def read(con: duckdb.DuckDBPyConnection, p: Plan, where: str, params: list) -> Rolled:
    rel, rp = rollup_relation(p, where, params)
    step = 1000 // HIST_PER_UNIT
    # One read of the rollup rows (binding and filtering the files costs more than adding up 83 k
    # rows: 0.15-0.2 s of 1.7 at 512 GPUs over 90 days), kept for four aggregates in one statement:
    # per GPU the sums (a row value ``gv``, g = -1), then each list pair unnested on its own and
    # added up (g = 0, 1, 2; 12 % faster than the three unnested side by side in grouping sets).
    gpus, util_hist, sm_hist, intervals = [], [], [], {}
    for g, fb, k, e, v, n, gv in con.execute(
        f"""WITH r AS MATERIALIZED (
                SELECT e, fb, host, gpu_uuid, gpu_index, gpu_name, first_ts, last_ts, mem_used_peak, mem_total,
                       {", ".join(_SUMS)}, util_hist_bin, util_hist_s, sm_hist_bin, sm_hist_s, interval_us, interval_n
                FROM {rel})
            SELECT -1 AS g, fb, NULL::BIGINT AS k, e, NULL::DOUBLE AS v, NULL::HUGEINT AS n,
                   row(any_value(host), any_value(gpu_uuid), arg_max(gpu_index, last_ts), arg_max(gpu_name, last_ts),
                       min(epoch_us(first_ts)), max(epoch_us(last_ts)), max(mem_used_peak), max(mem_total),
                       {", ".join(f"sum({c})" for c in _SUMS)}) AS gv
            FROM r GROUP BY e, fb
            UNION ALL
            SELECT 0, fb, k, NULL, sum(v), NULL, NULL
            FROM (SELECT fb, unnest(util_hist_bin) AS k, unnest(util_hist_s) AS v FROM r) GROUP BY fb, k
            UNION ALL
            SELECT 1, fb, k, NULL, sum(v), NULL, NULL
            FROM (SELECT fb, unnest(sm_hist_bin) AS k, unnest(sm_hist_s) AS v FROM r) GROUP BY fb, k
            UNION ALL
            SELECT 2, NULL, k, e, NULL, sum(n), NULL
            FROM (SELECT e, unnest(interval_us) AS k, unnest(interval_n) AS n FROM r) GROUP BY e, k""",
        rp,
    ).fetchall():
        if g == -1:
            gpus.append((e, fb, *gv))
        elif k is None:  # a NULL inside a list
            continue
        elif g == 0:
            util_hist.append((fb, k * step, v))
        elif g == 1:
            sm_hist.append((fb, k * step, v))
        else:
            intervals[(e, k)] = int(n)
    return Rolled(gpus, util_hist, sm_hist, intervals)


SUM_NAMES = tuple(_SUMS)


def read_buckets(
    con: duckdb.DuckDBPyConnection,
    p: Plan,
    where: str,
    params: list,
    bucket_us: int,
    per: str = "gpu",
    *,
    span: bool = False,
) -> list[tuple]:
    """Per GPU, bucket and ``fb``: (e, k, fb, host, gpu_index, observed_s, util_s, util_raw_sum, sm_s,
    sm_raw_sum, mem_ratio_s, mem_ratio_sum, simulated) from the rollup rows (the timeline's sums);
    with ``span``, then the first and last sample of the rows (epoch seconds, as ``span`` gives them).
    ``per="host"`` or ``"fleet"`` adds the GPUs of a host (of the fleet) together first (``e`` then
    stands for the host, ``gpu_index`` is 0): far fewer rows where GPU counts are not asked for;
    ``"fleet-gpus"`` too, with ``e`` the list of the GPUs' entity hashes."""
    rel, rp = rollup_relation(p, where, params)
    key, ident, who = {
        "gpu": ("e", "e", "any_value(host), arg_max(gpu_index, last_ts)"),
        "host": ("host", "hash(host)", "host, 0"),
        "fleet": ("NULL", "0", "'fleet', 0"),
        # The fleet per bucket, with the GPUs present as a list (repeats kept: the timeline counts distinct ones).
        "fleet-gpus": ("NULL", "list(e)", "'fleet', 0"),
    }[per]
    return con.execute(
        f"""SELECT {ident}, k, fb, {who}, sum(observed_s),
                   sum(util_s), sum(util_raw_sum), sum(sm_s), sum(sm_raw_sum), sum(mem_ratio_s), sum(mem_ratio_sum),
                   sum(simulated_s) > 0{", epoch(min(first_ts)), epoch(max(last_ts))" if span else ""}
            FROM (SELECT *, epoch_us(ts) // ? AS k FROM {rel}) GROUP BY {key}, k, fb""",
        [bucket_us, *rp],
    ).fetchall()


def read_intervals(
    con: duckdb.DuckDBPyConnection, p: Plan, where: str, params: list
) -> dict[tuple[int, int], int]:
    """The interval histogram {(entity hash, interval binned, µs): count} of the rollup rows."""
    rel, rp = rollup_relation(p, where, params)
    return {
        (e, dq): int(n)
        for e, dq, n in con.execute(
            f"""SELECT e, k, sum(v) FROM (SELECT e, unnest(interval_us) AS k, unnest(interval_n) AS v FROM {rel})
                GROUP BY e, k""",
            rp,
        ).fetchall()
    }


# -- retention ---------------------------------------------------------------------------------------


@dataclass
class ExpireResult:
    partitions: int = 0  # raw gpu_samples (date, host) folders removed
    files: int = 0
    bytes: int = 0
    # "host date": old enough, but no rollup covers it yet
    kept_no_rollup: list[str] = dc_field(default_factory=list)


def expire_raw(
    root: str | os.PathLike,
    keep_s: float,
    *,
    now: dt.datetime | None = None,
    hosts: tuple[str, ...] = (),
    progress: Callable[[str], None] | None = None,
) -> ExpireResult:
    """Delete raw ``gpu_samples`` day partitions older than ``keep_s`` whose whole day the host's
    rollups cover: both levels' marks at least ``MARGIN_US`` past the day's end (an incremental build
    reads the samples just before its start). A day no rollup covers yet is kept, whatever its age.
    ``process_samples`` and ``pool_events`` are kept (attribution and the what-if read them; no
    rollup summarises them)."""
    root = Path(root)
    say = progress or (lambda _msg: None)
    result = ExpireResult()
    cutoff = int(utc(now or dt.datetime.now(dt.UTC)).timestamp() * 1_000_000) - int(keep_s * 1_000_000)
    with _build_lock(root):  # not while a build reads them
        by_host: dict[str, list[Path]] = {}
        for folder in sorted((root / "gpu_samples").glob("date=*/host=*")):
            if folder.is_dir():
                by_host.setdefault(folder.name.removeprefix("host="), []).append(folder)
        for host, folders in by_host.items():
            if hosts and host not in hosts:
                continue
            marks = host_marks(root, host)
            covered = None if None in marks.values() else min(marks.values())
            for folder in folders:
                day = dt.date.fromisoformat(folder.parent.name.removeprefix("date="))
                end = _day_us(day + dt.timedelta(days=1))
                if end > cutoff:
                    continue
                if covered is None or end + MARGIN_US > covered:
                    result.kept_no_rollup.append(f"{host} {day.isoformat()}")
                    continue
                for f in sorted(folder.iterdir()):
                    result.files += 1
                    result.bytes += f.stat().st_size
                    f.unlink()
                folder.rmdir()
                with contextlib.suppress(OSError):
                    folder.parent.rmdir()  # the date folder, once no host is left in it
                result.partitions += 1
                say(f"{host}: removed the raw samples of {day.isoformat()}")
    return result
