"""Rollups: ``gpu_samples`` pre-aggregated per GPU per minute and per hour.

A month of 64 GPUs at 1 Hz is 166 M raw rows; its minute rollup is 2.8 M rows and its hourly one 46 k.
``build_rollups`` (``gpustat-report rollup DIR``) writes them beside the raw tables, in the same layout
(``collector.schema``: ``gpu_rollup_1m`` and ``gpu_rollup_1h``), one file per date and host::

    <dir>/gpu_rollup_1m/date=YYYY-MM-DD/host=<host>/rollup.parquet

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
local tick) while the rollup keeps its weight from the whole history (the time to its next sample):
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
mark. A build reads neighbouring samples past the watermark (the weights need them); raw samples that
arrive later for times before the watermark (an import of old logs) are seen after the next build.
One build at a time per directory (a lock file).

Raw samples are kept; expiring them (``--keep-raw``) is not part of this slice.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from analytics import _rows
from analytics._scope import Scope, utc
from analytics._telemetry import open_telemetry
from analytics._weights import CHUNK_ROWS, weighted_rows_sql
from collector.schema import METADATA_ROLLUP_KEY, ROLLUP_TABLES, SCHEMA_VERSION
from collector.writer import write_segment

MINUTE_US = 60_000_000
HOUR_US = 3_600_000_000
LAG_S = 600  # a build leaves the last 10 minutes of each host raw-only: their weights need later samples
MARGIN_US = LAG_S * 1_000_000  # raw read from this long before a watermark, for the first rows' neighbours
HIST_PER_UNIT = 100  # histogram bins per unit ratio: 1 %
FILE_NAME = "rollup.parquet"
LEVELS = {"1m": ("gpu_rollup_1m", MINUTE_US), "1h": ("gpu_rollup_1h", HOUR_US)}


# -- building ----------------------------------------------------------------------------------------


@dataclass
class RollupResult:
    hosts: int = 0
    samples: int = 0
    minute_rows: int = 0
    hour_rows: int = 0
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
_TIMELINE_SUMS = ("util_raw_sum", "sm_raw_sum", "mem_ratio_s", "mem_ratio_sum")  # the timeline's means

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

# Hours from minutes: sums add, histograms and interval counts merge bin by bin.
_HOURS = """
    WITH mins AS (SELECT *, ts_us // {hour} * {hour} AS h FROM minute_rows WHERE ts_us < ?),
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


def _hours_sql() -> str:
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
        hour=HOUR_US,
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


def _iso(us: int) -> str:
    return dt.datetime.fromtimestamp(us / 1e6, dt.UTC).isoformat()


def _write_days(
    root: Path, name: str, host: str, data: pa.Table, covered_to: int, watermark: int, period_us: int
) -> int:
    """One file per day of ``data`` (in date order), each recording the span it covers; the day of
    the last covered instant always gets a file, so the host's mark is on record."""
    if covered_to <= 0:
        return 0
    data = _to_schema(name, data)
    days = pc.cast(data.column("ts"), pa.date32())
    last_day = dt.datetime.fromtimestamp((covered_to - 1) / 1e6, dt.UTC).date()
    todo = sorted({*pc.unique(days).to_pylist(), last_day})
    options = _rows.DEFAULT_OPTIONS
    for day in todo:
        start, end = _day_us(day), _day_us(day + dt.timedelta(days=1))
        part = data.filter(pc.equal(days, pa.scalar(day, pa.date32())))
        meta = {
            "period_s": period_us // 1_000_000,
            "covers_from": _iso(start),
            "covers_to": _iso(min(end, covered_to)),
            "covers_to_us": min(end, covered_to),
            "watermark": _iso(watermark),
            "idle_below": options.idle_below,
            "held_mem_bytes": options.held_mem_bytes,
            "hist_bins_per_unit": HIST_PER_UNIT,
            "built": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        }
        part = part.replace_schema_metadata(
            {**part.schema.metadata, METADATA_ROLLUP_KEY: json.dumps(meta).encode()}
        )
        folder = root / name / f"date={day.isoformat()}" / f"host={host}"
        folder.mkdir(parents=True, exist_ok=True)
        write_segment(folder / FILE_NAME, part)
    return len(todo)


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


def build_rollups(
    root: str | os.PathLike,
    *,
    progress: Callable[[str], None] | None = None,
    hosts: tuple[str, ...] = (),
    lag_s: float = LAG_S,
) -> RollupResult:
    """(Re)build the minute and hour rollups of every host (or of ``hosts``) from the raw samples,
    up to ``lag_s`` before each host's newest sample (the weights of the last samples covered need
    the few samples after them: keep it at least 3 ticks)."""
    root = Path(root)
    say = progress or (lambda _msg: None)
    result = RollupResult()
    options = _rows.DEFAULT_OPTIONS
    con = open_telemetry(root)  # a missing or empty directory: TelemetryError, before anything is written
    with _build_lock(root):
        _remove_stale_tmp(root)
        all_hosts = sorted(
            {p.name.removeprefix("host=") for p in (root / "gpu_samples").glob("date=*/host=*") if p.is_dir()}
        )
        todo = [h for h in all_hosts if not hosts or h in hosts]
        for number, host in enumerate(todo, 1):
            t0 = time.monotonic()
            newest, rows = con.execute(
                "SELECT max(epoch_us(ts)), count(*) FROM gpu_samples WHERE host = ?", [host]
            ).fetchone()
            if not rows:
                continue
            watermark = (newest - int(lag_s * 1_000_000)) // MINUTE_US * MINUTE_US
            parts = max(1, -(-rows // CHUNK_ROWS))
            minutes = []
            for i in range(parts):
                source = (
                    f"(SELECT {_rows.SAMPLE_COLUMNS}, gpu_uuid AS uuid, gpu_index, gpu_name, util_gpu_mean, sm_activity "
                    "FROM gpu_samples "
                    "WHERE host = ? AND hash(gpu_uuid) % ? = ?)"
                )
                con.execute(
                    f"""
                    CREATE OR REPLACE TEMP TABLE rollup_gs AS
                    WITH {weighted_rows_sql(source)}
                    SELECT GROUPING(ubin, abin, dq) AS gid, uuid, m, fbk, ubin, abin, dq, {_AGGREGATES}
                    FROM (SELECT *, t // {MINUTE_US} * {MINUTE_US} AS m, coalesce(fb, -2) AS fbk,
                                 ub // {1000 // HIST_PER_UNIT} AS ubin, ab // {1000 // HIST_PER_UNIT} AS abin FROM wr)
                    GROUP BY GROUPING SETS ((uuid, m, fbk), (uuid, m, fbk, ubin), (uuid, m, fbk, abin), (uuid, m, fbk, dq))
                    """,
                    [
                        options.idle_below,
                        options.held_mem_bytes,
                        host,
                        parts,
                        i,
                        options.idle_below * _rows.HIST_RESOLUTION - 1e-9,
                    ],
                )
                sql = _ASSEMBLE.format(
                    total=_G_TOTAL,
                    util=_G_UTIL,
                    sm=_G_SM,
                    interval=_G_INTERVAL,
                    sums=", ".join(f"b.{c}" for c in (*_SUMS, *_TIMELINE_SUMS)),
                )
                minutes.append(con.sql(sql, params=[watermark]).to_arrow_table())
            con.execute("DROP TABLE IF EXISTS rollup_gs")
            minute_rows = pa.concat_tables(minutes).sort_by(
                [("gpu_uuid", "ascending"), ("ts_us", "ascending")]
            )
            hour_mark = watermark // HOUR_US * HOUR_US
            con.register("minute_rows", minute_rows)
            hour_rows = con.sql(_hours_sql(), params=[hour_mark]).to_arrow_table()
            con.unregister("minute_rows")
            hour_rows = hour_rows.sort_by([("gpu_uuid", "ascending"), ("ts_us", "ascending")])
            # Minutes first: a reader that finds the hour level's mark also finds the minutes before it.
            result.files += _write_days(
                root, "gpu_rollup_1m", host, minute_rows, watermark, watermark, MINUTE_US
            )
            result.files += _write_days(root, "gpu_rollup_1h", host, hour_rows, hour_mark, watermark, HOUR_US)
            result.hosts += 1
            result.samples += int(rows)
            result.minute_rows += minute_rows.num_rows
            result.hour_rows += hour_rows.num_rows
            say(
                f"[{number}/{len(todo)}] {host}: {rows:,} samples -> {minute_rows.num_rows:,} minute rows, "
                f"{hour_rows.num_rows:,} hour rows, raw after {_iso(watermark)} ({time.monotonic() - t0:.1f} s)"
            )
    return result


# -- reading -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """Which data answers a summary: rollup rows before each host's marks, raw samples after."""

    levels: tuple[str, ...]  # "1h", "1m" and/or "raw", coarsest first
    marks: dict[str, dict[str, int | None]]  # host -> {level: covered up to (epoch µs) or None}
    raw_from_us: dict[str, int]  # host -> raw samples from here on (hosts not listed: all raw)

    def describe(self) -> str:
        names = {"1h": "hourly rollups", "1m": "minute rollups", "raw": "raw samples"}
        text = " + ".join(names[lv] for lv in self.levels)
        if "raw" in self.levels and self.raw_from_us:
            text += f" (raw from {dt.datetime.fromtimestamp(min(self.raw_from_us.values()) / 1e6, dt.UTC):%Y-%m-%d %H:%M} UTC)"
        return text


def _aligned(ts: dt.datetime | None, period_us: int) -> bool:
    if ts is None:
        return True
    us = (utc(ts) - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)
    return us % period_us == 0


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
    raw_from = {h: m["1m"] for h, m in marks.items() if m.get("1m") is not None}
    return Plan((*levels, "raw"), marks, raw_from), ""


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
        first = min(p.raw_from_us.values()) - MARGIN_US
        where += " AND date >= ?"
        params.append(dt.datetime.fromtimestamp(first / 1e6, dt.UTC).date() - dt.timedelta(days=1))
    return where, params, f", {case} AS raw_from_us", case_params, "coalesce(t >= raw_from_us, true)"


def rollup_relation(p: Plan, where: str, params: list) -> tuple[str, list]:
    """SQL of the rollup rows that answer (hours before each host's hour mark, minutes from there to
    its minute mark), with ``e`` the entity hash the raw rows use, and its parameters."""
    parts, all_params = [], []
    minute_marks = {h: m["1m"] for h, m in p.marks.items() if m.get("1m") is not None}
    # Hours only where minutes carry on from them: raw samples start at the minute mark.
    hour_marks = {
        h: min(m["1h"], minute_marks[h])
        for h, m in p.marks.items()
        if m.get("1h") is not None and h in minute_marks
    }
    if "1h" in p.levels and hour_marks:
        case, cp = _case(hour_marks, "NULL")
        parts.append(f"SELECT * FROM gpu_rollup_1h WHERE {where} AND epoch_us(ts) < {case}")
        all_params += [*params, *cp]
    if minute_marks:
        lo = "NULL"
        lo_params: list = []
        if "1h" in p.levels and hour_marks:
            lo, lo_params = _case(hour_marks, "NULL")
            lo = f"coalesce(epoch_us(ts) >= {lo}, true)"
        else:
            lo = "true"
        case, cp = _case(minute_marks, "NULL")
        parts.append(f"SELECT * FROM gpu_rollup_1m WHERE {where} AND {lo} AND epoch_us(ts) < {case}")
        all_params += [*params, *lo_params, *cp]
    body = " UNION ALL BY NAME ".join(parts)
    return f"(SELECT *, hash(host, gpu_uuid) AS e FROM ({body}))", all_params


@dataclass
class Rolled:
    gpus: list[tuple]  # (e, fb, host, uuid, index, name, first_us, last_us, mem_used_peak, mem_total, *sums)
    util_hist: list[tuple]  # (fb, bin 0.001 steps at the bin's lower edge, seconds)
    sm_hist: list[tuple]
    intervals: dict[tuple[int, int], int]


def read(con: duckdb.DuckDBPyConnection, p: Plan, where: str, params: list) -> Rolled:
    rel, rp = rollup_relation(p, where, params)
    step = 1000 // HIST_PER_UNIT
    gpus = con.execute(
        f"""SELECT e, fb, any_value(host), any_value(gpu_uuid), arg_max(gpu_index, last_ts), arg_max(gpu_name, last_ts),
                   min(epoch_us(first_ts)), max(epoch_us(last_ts)), max(mem_used_peak), max(mem_total),
                   {", ".join(f"sum({c})" for c in _SUMS)}
            FROM {rel} GROUP BY e, fb""",
        rp,
    ).fetchall()
    hists = []
    for key, val in (("util_hist_bin", "util_hist_s"), ("sm_hist_bin", "sm_hist_s")):
        hists.append(
            con.execute(
                f"""SELECT fb, k * {step}, sum(v) FROM (SELECT fb, unnest({key}) AS k, unnest({val}) AS v FROM {rel})
                    GROUP BY fb, k""",
                rp,
            ).fetchall()
        )
    return Rolled(gpus, hists[0], hists[1], read_intervals(con, p, where, params))


SUM_NAMES = tuple(_SUMS)


def read_buckets(
    con: duckdb.DuckDBPyConnection, p: Plan, where: str, params: list, bucket_us: int
) -> list[tuple]:
    """Per GPU, bucket and ``fb``: (e, k, fb, host, gpu_index, observed_s, util_s, util_raw_sum, sm_s,
    sm_raw_sum, mem_ratio_s, mem_ratio_sum, simulated) from the rollup rows (the timeline's sums)."""
    rel, rp = rollup_relation(p, where, params)
    return con.execute(
        f"""SELECT e, epoch_us(ts) // ? AS k, fb, any_value(host), arg_max(gpu_index, last_ts), sum(observed_s),
                   sum(util_s), sum(util_raw_sum), sum(sm_s), sum(sm_raw_sum), sum(mem_ratio_s), sum(mem_ratio_sum),
                   sum(simulated_s) > 0
            FROM {rel} GROUP BY e, k, fb""",
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
