"""Reading the rollups: which rows answer a question (``plan``), and the SQL that reads them.

The rollups are written by the collector (``collector.rollups``: the file layout, what a row holds,
the watermark, retention). Readers take a host's watermark from its newest day's file and read rollup
rows before it and raw samples from it on, so a rollup and the samples it summarises are never both
counted.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from dataclasses import dataclass

import duckdb

from analytics._scope import Scope, one_row, utc
from collector.rollups import (
    DAY_TABLE,
    DAY_US,
    HIST_PER_UNIT,
    HOUR_FILE_TABLE,
    LEVELS,
    MARGIN_US,
    SUMS,
    day_of,
    file_start,
    ts_of,
)
from collector.weights import weighted_rows_sql

# -- reading -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """Which data answers a summary: rollup rows before each host's marks, raw samples after."""

    levels: tuple[str, ...]  # "1d", "1h", "1m" and/or "raw", coarsest first
    marks: dict[str, dict[str, int]]  # host -> {level: covered up to (epoch µs)}; a host without any: {}
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
        return bool(one_row(con, "SELECT count(*) FROM rollup_marks WHERE covers_to_us IS NOT NULL")[0])
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
    marks: dict[str, dict[str, int]] = {}
    for host, level, covers_to, idle_below, held in rows:
        if scope.hosts and host not in scope.hosts:
            continue
        if (
            covers_to is not None
            and options is not None
            and (idle_below != options.idle_below or held != options.held_mem_bytes)
        ):
            return None, "thresholds differ from the rollups'"
        levels_of = marks.setdefault(host, {})  # a host with marks but none covering yet: all raw
        if covers_to is not None:
            levels_of[level] = covers_to
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
        params += [day_of(first - 1), ts_of(first)]
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
    signature = _tail_listing(roots, day_of(first - 1))
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
    (was,) = one_row(con, "SELECT current_setting('preserve_insertion_order')")
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
        params += [day_of(first - 1), ts_of(first)]
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
            prune_params = [file_start(HOUR_FILE_TABLE, day_of(min(w[1] for w in days.values())))]
            if p.days_from_us is not None:
                prune_params.append(file_start(HOUR_FILE_TABLE, day_of(p.days_from_us - 1)))
        parts.append(
            f"SELECT r.* FROM {by_row_day.format(table=HOUR_FILE_TABLE, prune=prune)} r "
            f"JOIN {values} AS m(mh, hi, dlo, dhi) ON r.host = m.mh "
            f"WHERE {where} AND ts < ? AND epoch_us(ts) < m.hi "
            "AND NOT coalesce(epoch_us(ts) >= m.dlo AND epoch_us(ts) < m.dhi, false)"
        )
        all_params += [*prune_params, *vp, *params, ts_of(max(hour_marks.values()))]
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
            prune, prune_params = " AND date >= ? AND ts >= ?", [day_of(first), ts_of(first)]
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
        lo, hi = one_row(con, raw, [*params, *raw_params])
        return lo, hi
    rel, rp = rollup_relation(p, where, params)
    lo, hi = one_row(
        con,
        f"""SELECT min(lo), max(hi) FROM (
                SELECT epoch(min(first_ts)) AS lo, epoch(max(last_ts)) AS hi FROM {rel} UNION ALL {raw})""",
        [*rp, *params, *raw_params],
    )
    return lo, hi


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
                       {", ".join(SUMS)}, util_hist_bin, util_hist_s, sm_hist_bin, sm_hist_s, interval_us, interval_n
                FROM {rel})
            SELECT -1 AS g, fb, NULL::BIGINT AS k, e, NULL::DOUBLE AS v, NULL::HUGEINT AS n,
                   row(any_value(host), any_value(gpu_uuid), arg_max(gpu_index, last_ts), arg_max(gpu_name, last_ts),
                       min(epoch_us(first_ts)), max(epoch_us(last_ts)), max(mem_used_peak), max(mem_total),
                       {", ".join(f"sum({c})" for c in SUMS)}) AS gv
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


SUM_NAMES = tuple(SUMS)


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
