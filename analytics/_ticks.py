"""How long one sample stands for: each GPU's tick interval, derived from the spacing of its samples.

A collector may tick every second on one host and every ten seconds on another, and may stop for an
hour and start again. So a sample is never assumed to be one second: per GPU, the samples are put in
hour buckets, each bucket with two or more samples gives a spacing ``(last - first) / (n - 1)``, and
the GPU's tick is the median of those (a gap inside a few buckets does not move a median). Observed
time is then ``samples x tick`` — a gap in collection adds no samples, so it is never counted as
observed. A GPU with a single sample in scope takes the fleet's median tick.

These are SQL fragments shared by the summary, the patterns and the attribution queries.
"""

from __future__ import annotations

BUCKET_US = 3_600_000_000  # one hour, in microseconds


def tick_cte(source: str, key: str = "host, gpu_uuid", bucket_key: str = "") -> str:
    """CTE body giving ``{key}, tick_s`` for the rows of the relation ``source``.

    ``bucket_key`` adds columns that split buckets further: for process rows, the pid, because a
    GPU's process rows have holes where no process ran while one process's rows are continuous.
    """
    return f"""
        SELECT {key},
               coalesce(
                   median((hi - lo) / (n - 1)) FILTER (WHERE n > 1),
                   (max(hi) - min(lo)) / nullif(sum(n) - 1, 0)
               ) / 1e6 AS tick_s
        FROM (
            SELECT {key}{bucket_key}, epoch_us(ts) // {BUCKET_US} AS bucket, count(*) AS n,
                   min(epoch_us(ts)) AS lo, max(epoch_us(ts)) AS hi
            FROM {source}
            GROUP BY ALL
        )
        GROUP BY {key}
    """


def filled_tick_cte(ticks: str) -> str:
    """CTE body: ``ticks`` with a missing tick (single-sample GPUs) replaced by the fleet median."""
    return f"""
        SELECT * REPLACE (coalesce(tick_s, (SELECT median(tick_s) FROM {ticks}), 0.0) AS tick_s)
        FROM {ticks}
    """


GPU_HASH = "hash(host, gpu_uuid)"  # one integer per GPU: cheaper to group by than two strings


def unhash(con, keys) -> dict[int, tuple[str, str]]:
    """{GPU_HASH value: (host, gpu_uuid)} for the given GPUs, to read results grouped by GPU_HASH."""
    keys = list(keys)
    return {
        hashed: (h, u)
        for h, u, hashed in con.execute(
            "SELECT h, u, hash(h, u) FROM (SELECT unnest(?::VARCHAR[]) AS h, unnest(?::VARCHAR[]) AS u)",
            [[k[0] for k in keys], [k[1] for k in keys]],
        ).fetchall()
    }


def gpu_ticks(con, where: str, params: list) -> dict[tuple[str, str], float]:
    """{(host, gpu_uuid): tick in seconds} for the GPU samples matching ``where``.

    One streaming group-by (count, first, last per GPU and hour); queries that need per-GPU weights
    aggregate per GPU first and apply these afterwards, instead of joining a tick onto every sample.
    """
    rows = con.execute(
        f"WITH ticks AS ({tick_cte(f'(SELECT host, gpu_uuid, ts FROM gpu_samples WHERE {where})')}), "
        f"filled AS ({filled_tick_cte('ticks')}) SELECT host, gpu_uuid, tick_s FROM filled",
        params,
    ).fetchall()
    return {(h, u): t for h, u, t in rows}
