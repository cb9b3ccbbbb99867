"""How much time one sample stands for: the one definition every time-weighted figure uses.

A collector may tick every second on one host and every minute on another, be restarted with another
interval, stop for an hour, log in bursts, write the same instant twice (two files of one GPU that
overlap) or have its clock stepped back. So a sample is never assumed to be one second, nor one
"tick" of its GPU. Per *entity* (a GPU; for process rows, one process on one GPU), rows are put in
time order and each row gets a weight in seconds:

- ``d``, its *interval*: the time to the entity's next later timestamp. Rows with the same timestamp
  are one instant: the instant's interval goes to one of its rows, the others weigh 0 (identical
  rows from overlapping files count once; where such rows differ, which one carries the time is not
  defined — ordering every sample by its values too would cost a fifth more; a clock stepped back interleaves its samples with the
  earlier ones and the interval between neighbours is still the time between them; importers undo
  such steps in the logs they read, ``collector._import_common.place_in_log_order``).
- ``tick``, its *nominal interval*: what one sample of this entity stands for, read from its
  neighbourhood — the median of its own interval and the ``NEIGHBOURS`` (4) intervals before it
  and the 4 after it (of an even number, the lower one), zero intervals (duplicates) left out. On a
  regular log that is the collector's declared interval, or an import's modal one; a median of
  nine, so that missed scrapes, gaps, short intervals (two files of one GPU interleaving, a sample
  written late, a clock stepped back) or a restart with another interval do not move it unless
  they make up more than half of the neighbourhood. Where there is none (an entity
  with a single instant in scope), or for the last row only the interval that ends at it (an
  entity with two instants), there is no local spacing to go by, and the fleet's typical tick
  stands in: the median of all intervals in scope.
- A row's interval is a *gap* when it is longer than ``GAP_FACTOR`` (1.5) nominal intervals: at
  least one scrape was missed. Then the row counts for one nominal interval and the rest of the
  interval is unobserved (``gap``); otherwise (a sample up to half an interval late) it counts for
  its whole interval. The entity's last row counts for one nominal interval. Stand-in weights never
  exceed the row's interval either.

So a log sampled every T seconds with missed scrapes and outages is credited exactly samples x T,
and per entity observed time + gap time = its span from first to last sample plus one nominal
interval: no GPU is credited more than its span. Tick changes (each side keeps its own interval),
bursts, duplicates and interleaved files are handled as above (where every instant is written three
times or more, rows can find no spacing around them and take the fleet tick, capped at their
interval); a fleet's observed time is the sum of its entities'.

The weights need each entity's rows in order: a window over the samples. To keep memory flat the
window runs in chunks of whole entities (one host at a time, a large host split by GPU), each a
few tens of millions of rows at most.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# The version of this rule. Rollups hold weights computed under it (their footers say which): a
# reader takes rollups of another version for none (raw samples answer) and a build redoes them.
RULE = 2
GAP_FACTOR = 1.5  # an interval longer than this many nominal intervals holds a missed sample: a gap
_GAP_NUM, _GAP_DEN = 3, 2  # GAP_FACTOR as a fraction: intervals compared in whole microseconds
_NONE = 1 << 60  # a missing neighbouring interval: longer than any real one (36,000 years)
NEIGHBOURS = 4  # intervals looked at on each side of a row for its nominal interval
CHUNK_ROWS = 25_000_000  # rows per windowed query (a host larger than this is split by GPU)
INTERVAL_RESOLUTION_US = 10_000  # intervals are binned to 10 ms for their medians

GPU_ENTITY = ("host", "gpu_uuid")
PROCESS_ENTITY = ("host", "gpu_uuid", "pid")


def weighted_rows_sql(source: str, entity: Sequence[str] = GPU_ENTITY, order_extra: str = "") -> str:
    """SQL (a sequence of CTEs, no leading WITH) ending in the relation ``wr``: the rows of
    ``source`` with ``e`` (entity hash), ``t`` (epoch µs), ``d`` (interval, µs; NULL for a
    duplicate and for the last row), ``w`` (weight, seconds; 1.0 for a row that takes the fleet
    tick), ``fb`` (NULL, or for a row that takes the fleet tick its interval in µs, -1 if it has
    none), ``gap`` (the unobserved rest of a gap interval, seconds) and ``dq`` (the interval binned
    to ``INTERVAL_RESOLUTION_US``, only on rows that carry one).

    Rows taking the fleet tick get the unit weight 1.0 and are told apart by ``fb``: callers group
    by ``fb`` and scale those groups once the fleet tick is known (``Weighted.scale``), which is
    what makes one pass enough.
    """
    ent = ", ".join(entity)
    order = "t" + (f", {order_extra}" if order_extra else "")
    k = NEIGHBOURS
    # Times of the rows around (lag 1..k before, lead 1..k+1 after) and the 2k intervals between
    # them besides its own; a missing or zero one (a duplicate) is _NONE.
    around = ", ".join(
        [
            *(f"lag(t, {i}) OVER o AS b{i}" for i in range(1, k + 1)),
            *(f"lead(t, {i}) OVER o AS a{i}" for i in range(1, k + 2)),
        ]
    )
    spans = [
        "t - b1",
        *(f"b{i} - b{i + 1}" for i in range(1, k)),
        *(f"a{i + 1} - a{i}" for i in range(1, k + 1)),
    ]
    times = ", ".join([*(f"b{i}" for i in range(1, k + 1)), *(f"a{i}" for i in range(2, k + 2))])
    known = ", ".join(f"coalesce(nullif({x}, 0), {_NONE}) AS s{i}" for i, x in enumerate(spans))
    names = [f"s{i}" for i in range(len(spans))]
    count = " + ".join(["(d IS NOT NULL)::INT", *(f"({n} < {_NONE})::INT" for n in names)])
    # A row's interval is a gap when it is longer than GAP_FACTOR x the median of the m known
    # intervals (its own and those around it; of an even number the lower: the ((m + 1) // 2)-th
    # shortest): when at least (m + 1) // 2 of them are that much shorter (its own never is).
    # Counting is cheap; the median itself is sorted out only for the rows that need its value
    # (gaps and last rows: a list sort on every row costs as much as the window).
    shorter = " + ".join(f"({_GAP_NUM} * {n} < {_GAP_DEN} * d)::INT" for n in names)
    median = f"list_sort(list_filter([d, {', '.join(names)}], lambda x: x < {_NONE}))[(m + 1) // 2]"
    return f"""
        wr0 AS (SELECT * EXCLUDE ({ent}, ts), hash({ent}) AS e, epoch_us(ts) AS t FROM {source}),
        wr1 AS (
            SELECT *, {around} FROM wr0 WINDOW o AS (PARTITION BY e ORDER BY {order})
        ),
        wr2 AS (
            SELECT * EXCLUDE ({times}), nullif(a1 - t, 0) AS d, a1 IS NULL AS final, {known}
            FROM wr1
        ),
        wr3 AS (SELECT *, {count} AS m, {shorter} AS shorter FROM wr2),
        wr4 AS (
            -- The nominal interval (``tick``) where the weight needs its value; none where the row
            -- has no spacing around it (the last row needs two: one is only the interval that ends at it).
            SELECT * EXCLUDE (a1, m, shorter, {", ".join(names)}),
                   m - (d IS NOT NULL)::INT < CASE WHEN final THEN 2 ELSE 1 END AS alone,
                   NOT alone AND NOT final AND shorter >= (m + 1) // 2 AS is_gap,
                   CASE WHEN NOT alone AND (final OR is_gap) THEN {median} END AS tick
            FROM wr3
        ),
        wr AS (
            SELECT * EXCLUDE (alone, is_gap),
                   CASE WHEN d IS NULL AND NOT final THEN 0.0
                        WHEN alone THEN 1.0
                        WHEN final OR is_gap THEN tick / 1e6
                        ELSE d / 1e6 END AS w,
                   CASE WHEN alone AND (d IS NOT NULL OR final) THEN coalesce(d, -1) END AS fb,
                   CASE WHEN is_gap THEN (d - tick) / 1e6 ELSE 0.0 END AS gap,
                   d // {INTERVAL_RESOLUTION_US} * {INTERVAL_RESOLUTION_US} AS dq
            FROM wr4
        )
    """


@dataclass(frozen=True)
class Weighted:
    """Rows of one chunked query: ``sets[i]`` holds the rows of the i-th key set (its keys, then
    ``fb``, ``n_rows`` and the aggregates), ``intervals`` the interval histogram
    {(entity hash, interval binned, µs): count}."""

    sets: tuple[list[tuple], ...]
    intervals: dict[tuple[int, int], int]
    host_of: dict[int, str]  # entity hash -> its host

    def fleet_tick_s(self) -> float | None:
        """The fleet's typical tick: the median interval in scope, seconds."""
        tick = median_of(self.intervals.values(), [dq for _, dq in self.intervals])
        return None if tick is None else tick / 1e6

    def scale(self, fb: int | None, fleet_tick_s: float | None) -> float:
        """Multiplier for a group's weighted sums: 1, or for rows taking the fleet tick the tick
        itself, capped at their interval."""
        if fb is None:
            return 1.0
        tick = fleet_tick_s or 0.0
        return tick if fb < 0 else min(fb / 1e6, tick)


def median_of(counts, values) -> float | None:
    """Median (lower) of ``values`` repeated ``counts`` times."""
    pairs = sorted(zip(values, counts, strict=True))
    total = sum(c for _, c in pairs)
    if not total:
        return None
    acc = 0
    for v, c in pairs:
        acc += c
        if 2 * acc >= total:
            return float(v)
    return float(pairs[-1][0])


def _chunks(
    con, source_where: str, params: list, table: str, entity: Sequence[str], host_of: dict[int, str]
) -> list[tuple[str, list]]:
    """(extra predicate, params) per chunk: whole entities, at most about CHUNK_ROWS rows each (hosts
    together while they fit: a scope of a few rows per host is one query, not one per host). Fills
    ``host_of`` (entity hash -> host)."""
    per_entity = con.execute(
        f"SELECT host, hash({', '.join(entity)}), count(*) FROM {table} WHERE {source_where} GROUP BY ALL",
        params,
    ).fetchall()
    by_host: dict[str, int] = {}
    for host, e, n in per_entity:
        host_of[e] = host
        by_host[host] = by_host.get(host, 0) + n
    counts = sorted(by_host.items())
    chunks: list[tuple[str, list]] = []
    group: list[str] = []
    rows = 0
    for host, n in counts:
        parts = max(1, -(-n // CHUNK_ROWS))
        if parts == 1:
            if group and rows + n > CHUNK_ROWS:
                chunks.append((f"host IN ({', '.join('?' for _ in group)})", group))
                group, rows = [], 0
            group.append(host)
            rows += n
        else:
            for i in range(parts):
                chunks.append(("host = ? AND hash(gpu_uuid) % ? = ?", [host, parts, i]))
    if group:
        chunks.append((f"host IN ({', '.join('?' for _ in group)})", group))
    return chunks


def weighted_query(
    con,
    table: str,
    where: str,
    params: list,
    key_sets: Sequence[Sequence[str]],
    aggregates: str,
    *,
    columns: str = "*",
    columns_params: Sequence = (),
    entity: Sequence[str] = GPU_ENTITY,
    order_extra: str = "",
    join: str = "",
    intervals: bool = True,
    keep: str = "",
    windowed: str | None = None,
) -> Weighted:
    """Run ``SELECT keys, fb, aggregates FROM wr GROUP BY GROUPING SETS (...)`` chunk by chunk.

    ``key_sets``: expressions over ``wr`` (and ``e``, the entity hash) to group by, one tuple per
    grouping set; every set is also grouped by ``fb``. ``aggregates`` are over ``wr``'s columns
    (weight ``w``), without parameters. ``columns`` is what is read from ``table`` (the entity
    columns, ``ts`` and what the keys and aggregates use; computed columns may take
    ``columns_params``). ``join`` is joined onto ``wr`` (no parameters). ``intervals=False`` leaves
    out the interval histogram (a fifth of the cost) unless some rows need the fleet tick, which
    then takes a second pass. ``keep`` (a predicate over ``wr``, no parameters) leaves rows out of
    the groups after their weights are known: rows read only as neighbours of the kept ones.
    ``windowed`` names a relation of rows whose weights are already known (``wr``'s columns beside
    the table's own: ``analytics._rollup.windowed_tail``): ``where``, ``columns`` and ``keep`` apply to it as
    they would to ``table``, without the window.
    """
    sets: list[list[tuple]] = [[] for _ in key_sets]
    histogram: dict[tuple[int, int], int] = {}
    host_of: dict[int, str] = {}
    cols = list(dict.fromkeys([*(k for ks in key_sets for k in ks), *(("e", "dq") if intervals else ())]))
    grouping = ", ".join(
        [*(f"({', '.join([*ks, 'fb'])})" for ks in key_sets), *(["(e, dq)"] if intervals else [])]
    )

    def mask(grouped) -> int:  # GROUPING(cols): a 1 bit per column not grouped, the first one highest
        return sum(1 << (len(cols) - 1 - j) for j, c in enumerate(cols) if c not in grouped)

    which = {mask(ks): i for i, ks in enumerate(key_sets)}
    interval_mask = mask({"e", "dq"})
    if windowed is not None:
        host_of.update(
            con.execute(f"SELECT DISTINCT e, host FROM {windowed} WHERE {where}", params).fetchall()
        )
        chunks: list[tuple[str, list]] = [("true", [])]
    else:
        chunks = _chunks(con, where, params, table, entity, host_of)
    for chunk, chunk_params in chunks:
        source = f"(SELECT {columns} FROM {table} WHERE {where} AND {chunk})"
        ctes = weighted_rows_sql(source, entity, order_extra)
        if windowed is not None:
            ctes = f"wr AS (SELECT {columns}, e, t, d, w, fb, gap, dq FROM {windowed} WHERE {where})"
        rows = con.execute(
            f"""
            WITH {ctes}
            SELECT GROUPING({", ".join(cols)}) AS gid, {", ".join(cols)}, {"fb" if key_sets else "NULL AS fb"}, count(*) AS n_rows{", " + aggregates if aggregates else ""}
            FROM wr {join} {f"WHERE {keep}" if keep else ""} GROUP BY GROUPING SETS ({grouping})
            """,
            [*columns_params, *params, *chunk_params],
        ).fetchall()
        for gid, *rest in rows:
            values = dict(zip(cols, rest, strict=False))
            if intervals and gid == interval_mask:
                if values["dq"] is not None:
                    key = (values["e"], values["dq"])
                    histogram[key] = histogram.get(key, 0) + rest[len(cols) + 1]
            else:
                i = which[gid]
                sets[i].append((*(values[k] for k in key_sets[i]), *rest[len(cols) :]))
    if not intervals and any(
        row[len(ks)] is not None for ks, rows in zip(key_sets, sets, strict=True) for row in rows
    ):
        histogram = weighted_query(
            con,
            table,
            where,
            params,
            (),
            "",
            columns=columns,
            columns_params=columns_params,
            entity=entity,
            keep=keep,
            windowed=windowed,
        ).intervals
    return Weighted(tuple(sets), histogram, host_of)
