"""Import -> summary -> report on a realistic irregular nvidia-smi log, checked against pandas.

The log is generated here: 320 GPUs on 10 hosts, sampled every 30-60 s with jitter, GPUs coming and
going (sessions with gaps of minutes to hours), one host's collector restarted with another interval,
one host's log imported twice over an overlapping stretch (its samples stored once). The figures of ``fleet_summary`` are
recomputed independently with pandas from the generated samples, and checked against what the log
was made of (each sample stands for its collector's interval).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest

import analytics as A
from collector._import_smi import import_files
from reports._html import BuildOptions, build_html

T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
HOSTS, GPUS_PER_HOST, SPAN_S = 10, 32, 4 * 3600
HEADER = (
    "timestamp, index, uuid, name, utilization.gpu [%], memory.used [MiB], memory.total [MiB], power.draw [W]"
)
MIB = 1 << 20


def _generate(rng: np.random.Generator) -> tuple[dict[str, pd.DataFrame], float]:
    """Per host a frame of samples (ts in ms, gpu, util %, mem MiB); and the ground-truth observed seconds."""
    frames, truth = {}, 0.0
    for h in range(HOSTS):
        interval = [30.0, 45.0, 57.0][h % 3]
        rows = []
        for g in range(GPUS_PER_HOST):
            # Sessions: present for 10-90 min, then gone for 2 min to 2 h; some GPUs only show up late.
            t = float(rng.uniform(0, SPAN_S / 2)) if g % 5 == 0 else 0.0
            kind = g % 4  # 0 idle-held, 1 busy, 2 idle-empty, 3 bursty
            while t < SPAN_S:
                length = float(rng.uniform(600, 5400))
                tick = interval if not (h == 3 and t > SPAN_S / 2) else 15.0  # host 3 restarted at 15 s
                n = max(1, int(min(length, SPAN_S - t) // tick))
                times = t + tick * np.arange(n) + rng.uniform(-0.3, 0.3, n)  # jitter of the collector loop
                truth += n * tick
                util = {
                    0: np.zeros(n),
                    1: rng.integers(70, 100, n),
                    2: np.zeros(n),
                    3: rng.integers(0, 2, n) * 90,
                }[kind]
                mem = {0: 20_000, 1: 60_000, 2: 0, 3: 8_000}[kind] + rng.integers(0, 500, n) * (kind != 2)
                rows.append(pd.DataFrame({"t": times, "gpu": g, "util": util, "mem": mem}))
                t = times[-1] + tick + float(rng.uniform(120, 7200))
        df = pd.concat(rows)
        df["t"] = (df["t"] * 1000).round() / 1000  # nvidia-smi prints milliseconds
        frames[f"node-{h:02d}"] = df.sort_values(["t", "gpu"]).reset_index(drop=True)
    return frames, truth


def _write_log(path, df: pd.DataFrame, host: str) -> None:
    lines = [HEADER]
    for i, (t, g, u, m) in enumerate(df[["t", "gpu", "util", "mem"]].itertuples(index=False)):
        if i % 5000 == 0 and i:
            lines.append(HEADER)  # `nvidia-smi -l` repeats its header
        ts = T0 + timedelta(milliseconds=round(float(t) * 1000))
        lines.append(
            f"{ts:%Y/%m/%d %H:%M:%S}.{ts.microsecond // 1000:03d}, {g}, GPU-{host}-{g:02d}, NVIDIA H100 80GB HBM3, "
            f"{int(u)} %, {int(m)} MiB, 81559 MiB, 120.5 W"
        )
    path.write_text("\n".join(lines) + "\n")


def _fleet_tick(frames) -> float:
    """The fleet's median interval (lower median, intervals floored to 10 ms), seconds."""
    d = pd.concat([df.sort_values(["gpu", "t"]).groupby("gpu")["t"].diff() for df in frames])
    d = np.floor(d[d > 0].round(6) * 100) / 100
    return float(np.sort(d.to_numpy())[(len(d) - 1) // 2])


def _pandas_weights(df: pd.DataFrame, fleet_tick: float) -> pd.DataFrame:
    """The weight definition, vectorised with pandas, per GPU: independent of the SQL."""
    out = []
    for _, g in df.sort_values(["gpu", "t", "util", "mem"]).groupby("gpu", sort=False):
        t = g["t"].to_numpy()
        n = len(t)
        nxt = np.append(t[1:], np.nan)
        d = nxt - t
        d[d == 0] = np.nan
        final = np.arange(n) == n - 1

        def diff(i_off, j_off, t=t):
            a, b = pd.Series(t).shift(-i_off).to_numpy(), pd.Series(t).shift(-j_off).to_numpy()
            x = b - a
            x[x == 0] = np.nan
            return x

        # Its own interval and the four before and after it; the median (of an even number, the lower).
        before = [diff(-k - 1, -k) for k in range(4)]
        after = [diff(k, k + 1) for k in range(1, 5)]
        around = np.vstack([d, *before, *after])
        count = np.sum(~np.isnan(around), axis=0)
        ordered = np.sort(np.where(np.isnan(around), np.inf, around), axis=0)
        tick = np.take_along_axis(ordered, np.maximum((count + 1) // 2 - 1, 0)[None, :], axis=0)[0]
        w = np.where(final | (d > 1.5 * tick), tick, d)
        count = count - ~np.isnan(d)  # the intervals around it, its own left out
        # No local spacing (the last row of a duplicated instant: only one interval around it).
        fallback = count < np.where(final, 2, 1)
        w = np.where(fallback, np.where(np.isnan(d), fleet_tick, np.fmin(d, fleet_tick)), w)
        w = np.where(np.isnan(d) & ~final, 0.0, w)
        out.append(g.assign(w=w))
    return pd.concat(out)


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    root = tmp_path_factory.mktemp("irregular")
    frames, truth = _generate(np.random.default_rng(15))
    out = root / "telemetry"
    imported_rows = {}
    for host, df in frames.items():
        log = root / f"{host}.csv"
        _write_log(log, df, host)
        logs, rows = [log], df
        if host == "node-05":  # an hour and a half of the same log also in a second, overlapping file
            dup = root / f"{host}-copy.csv"
            part = df[(df["t"] > 3600) & (df["t"] < 9000)]
            _write_log(dup, part, host)
            logs, rows = [log, dup], pd.concat([df, part])
        report = import_files(logs, out, host=host, tz="UTC")
        # the overlapping copy's samples are already in the first file: each is stored once
        assert report.malformed == 0 and (report.rows, report.duplicates) == (len(df), len(rows) - len(df))
        imported_rows[host] = df
    tick = _fleet_tick(imported_rows.values())
    weighted = pd.concat([_pandas_weights(df, tick).assign(host=host) for host, df in imported_rows.items()])
    return out, frames, weighted, truth


def test_summary_matches_pandas_and_the_log(imported):
    out, frames, w, truth = imported
    s = A.fleet_summary(A.open_telemetry(out))
    assert s.gpus == HOSTS * GPUS_PER_HOST
    assert s.samples == len(w)
    # Observed GPU-hours: exactly the pandas computation of the definition, and within 0.1 % of what the
    # log was made of (each sample one collector interval; the jitter moves it a little). The per-hour
    # tick this replaced read 2.2 % over on this log.
    assert s.gpu_hours * 3600 == pytest.approx(w["w"].sum(), rel=1e-9)
    assert s.gpu_hours * 3600 == pytest.approx(truth, rel=0.001)
    assert s.gpu_hours == pytest.approx(sum(g.gpu_hours for g in s.per_gpu))
    per_gpu = w.groupby(["host", "gpu"])["w"].sum()
    for g in s.per_gpu:
        assert g.gpu_hours * 3600 == pytest.approx(per_gpu[(g.host, g.gpu_index)], rel=1e-9)
        span = w[(w["host"] == g.host) & (w["gpu"] == g.gpu_index)]["t"]
        assert g.gpu_hours * 3600 <= span.max() - span.min() + 60 * 1.01
    idle = w["util"] < 5
    held = idle & (w["mem"] * MIB >= 1 << 30)
    assert s.idle_gpu_hours * 3600 == pytest.approx(w.loc[idle, "w"].sum(), rel=1e-9)
    assert s.held_idle_gpu_hours * 3600 == pytest.approx(w.loc[held, "w"].sum(), rel=1e-9)
    assert s.util_gpu_mean == pytest.approx((w["w"] * w["util"] / 100).sum() / w["w"].sum(), rel=1e-6)
    # Sampling as the report states it: per host the median interval, gaps not counted.
    intervals = {s_.host: s_.median_interval_s for s_ in s.sampling}
    assert intervals["node-00"] == pytest.approx(30, abs=0.5)
    assert intervals["node-01"] == pytest.approx(45, abs=0.5)
    assert intervals["node-02"] == pytest.approx(57, abs=0.5)
    assert 0.2 < s.gap_share < 0.9
    assert {h.host for h in s.coarse_hosts} == set(frames)


def test_report_answers_the_pooling_question_from_gpu_demand(imported):
    out, *_ = imported
    page = build_html([str(out)], BuildOptions())
    assert "Sampling" in page and "Coarse sampling on 10 of 10 hosts" in page
    assert "per-GPU utilization and memory held (no process rows)" in page
    assert "pooled GPUs would have served the demand" in page
    assert "needs per-process telemetry" not in page
    w = A.what_if(A.open_telemetry(out))
    assert w.demand == "gpu" and w.step_s >= 2 * 30
    assert 0 < w.gpus_needed_p95 < HOSTS * GPUS_PER_HOST
