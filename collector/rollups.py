"""Rollups: ``gpu_samples`` pre-aggregated per GPU per minute, per hour and per day; built and expired
here, by the collector, which writes all telemetry (``analytics._rollup`` reads them).

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
on (``analytics._rollup.plan``), so a rollup and the samples it summarises are never both counted.
Files are written day by day in date order, each to a hidden temporary name, fsynced and renamed over the previous
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

import collector.sample_columns as _rows
import collector.weights as _weights
from collector.reader import TelemetryError, _intact, open_telemetry, utc
from collector.schema import DAMAGED_DIR, METADATA_ROLLUP_KEY, ROLLUP_TABLES, SCHEMA_VERSION
from collector.weights import weighted_rows_sql
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
SUMS = [
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
        sums=", ".join(f"sum({c}) AS {c}" for c in (*SUMS, *_TIMELINE_SUMS)),
        bsums=", ".join(f"b.{c}" for c in (*SUMS, *_TIMELINE_SUMS)),
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


def day_of(us: int) -> dt.date:
    return dt.datetime.fromtimestamp(us / 1e6, dt.UTC).date()


def _iso(us: int) -> str:
    return dt.datetime.fromtimestamp(us / 1e6, dt.UTC).isoformat()


def ts_of(us: int) -> dt.datetime:
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
        first = file_start(HOUR_FILE_TABLE, day_of(start)).isoformat()
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
                pc.less(old.column("ts"), pa.scalar(ts_of(keep_before), kind)),
                pc.greater_equal(old.column("ts"), pa.scalar(ts_of(covered_to), kind)),
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
    last_day = file_start(name, day_of(covered_to - 1))
    todo = sorted({*pc.unique(days).to_pylist(), last_day})
    for day in todo:
        part = data.filter(pc.equal(days, pa.scalar(day, pa.date32())))
        _write_day(root, name, host, day, part, start, covered_to, period_us)
    return len(todo)


HOUR_FILE_TABLE = "gpu_rollup_1h"
MONTH_FILE_TABLES = (HOUR_FILE_TABLE, DAY_TABLE)


def file_start(name: str, day: dt.date) -> dt.date:
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
            ts_of(a),
            ts_of(a),
            ts_of(b),
            ts_of(b),
            host,
            day_of(lo) - dt.timedelta(days=1),
            day_of(hi),
            ts_of(lo),
            ts_of(hi),
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
                [host, uuid, ts_of(a)],
            ).fetchone()
            if t is not None and read_lo is not None:
                read_lo = min(read_lo, t)
        if after < _weights.NEIGHBOURS + 1 and read_hi is not None:
            t, n = con.execute(
                "SELECT max(t), count(*) FROM (SELECT epoch_us(ts) AS t FROM gpu_samples "
                f"WHERE host = ? AND gpu_uuid = ? AND ts >= ? ORDER BY ts LIMIT {_weights.NEIGHBOURS + 1})",
                [host, uuid, ts_of(b)],
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
        bound_params += [day_of(read[0]) - dt.timedelta(days=1), ts_of(read[0])]
    if read[1] is not None:
        bounds += " AND date <= ? AND ts < ?"
        bound_params += [day_of(read[1]), ts_of(read[1])]
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
            sums=", ".join(f"b.{c}" for c in (*SUMS, *_TIMELINE_SUMS)),
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
            [host, day_of(lo), day_of(watermark)],
        ).fetchall()
    )
    steps, a, acc = [], lo, 0
    day = day_of(lo)
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
