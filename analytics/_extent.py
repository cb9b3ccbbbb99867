"""What the telemetry holds: its span, hosts and GPUs (the report's filters, error hints)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import duckdb

from analytics import _rollup
from analytics._scope import ALL, Extent, GpuInfo
from collector.reader import segment_rows


def data_extent(con: duckdb.DuckDBPyConnection) -> Extent:
    """The span, hosts and GPUs present in the telemetry (for filters and for error hints).

    One streaming pass for the span and the list of GPUs; names, indexes and sizes are read from
    the days where each GPU last reported only (string aggregates over every sample are the slow part).
    With rollups (``_rollup``), a host's history before its mark comes from its hourly and minute
    rows, and only the raw samples after the mark are read: the span still reaches back to the first
    sample once old raw days have expired.
    """
    plan = _rollup.plan(con, ALL)[0]
    windowed, (raw_where, raw_params, *_) = _rollup.raw_source(con, plan, ALL)
    raw_table = windowed or "gpu_samples"  # the raw tail, windowed once per connection
    parts = [
        f"SELECT host, gpu_uuid, epoch_us(min(ts)) AS lo, epoch_us(max(ts)) AS hi, sum(simulated::INTEGER) AS sim, "
        f"true AS raw, NULL::SMALLINT AS i, NULL::VARCHAR AS n, NULL::BIGINT AS m "
        f"FROM {raw_table} WHERE true{raw_where} GROUP BY host, gpu_uuid"
    ]
    params = list(raw_params)
    if plan is not None:
        rel, rel_params = _rollup.rollup_relation(plan, "true", [])
        # The GPUs' names, indexes and sizes from the same read of the rollup rows (a second read
        # binds and filters the rollup files again: 0.3-0.4 s at 512 GPUs over 90 days).
        parts.append(
            "SELECT host, gpu_uuid, epoch_us(min(first_ts)), epoch_us(max(last_ts)), "
            "sum((simulated_s > 0)::INTEGER), false, arg_max(gpu_index, last_ts), arg_max(gpu_name, last_ts), "
            f"max(mem_total) FROM {rel} GROUP BY host, gpu_uuid"
        )
        params += rel_params
    rows = con.execute(" UNION ALL ".join(parts), params).fetchall()
    merged: dict[tuple[str, str], list] = {}
    details: dict[tuple[str, str], tuple] = {}
    for host, uuid, lo, hi, sim, raw, index, name, mem in rows:
        if not raw:
            details[(host, uuid)] = (index, name, mem)
        m = merged.setdefault((host, uuid), [host, uuid, lo, hi, 0, None])
        m[2], m[3], m[4] = min(m[2], lo), max(m[3], hi), m[4] + (sim or 0)
        if raw:
            m[5] = hi if m[5] is None else max(m[5], hi)
    per_gpu = list(merged.values())
    process_rows = _rows_in(con, "process_samples")
    if not per_gpu:
        return Extent(None, None, (), (), False, 0, int(process_rows))
    rows_n = _rows_in(con, "gpu_samples")
    raw_last = [m[5] for m in per_gpu if m[5] is not None]
    if raw_last:
        # A day back: a sample at midnight may sit in the segment of the day before.
        since = min(datetime.fromtimestamp(last / 1e6, UTC).date() for last in raw_last) - timedelta(days=1)
        details.update(
            {
                (h, u): (i, n, m)
                for h, u, i, n, m in con.execute(
                    "SELECT host, gpu_uuid, arg_max(gpu_index, ts), arg_max(gpu_name, ts), max(mem_total_bytes) "
                    f"FROM {raw_table} WHERE date >= ?{raw_where} GROUP BY host, gpu_uuid",
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


def _rows_in(con: duckdb.DuckDBPyConnection, table: str) -> int:
    """Rows of a raw table: from its segments' footers (read once per process), else counted."""
    rows = segment_rows(con, table)
    return rows if rows is not None else con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]
