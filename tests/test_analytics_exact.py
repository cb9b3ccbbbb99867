"""The audit's figures are the log's own arithmetic: samples x interval, on the issue's kind of trace.

A 143-GPU nvidia-smi log sampled every 57 s, with one or two scrapes missed here and there, an outage
of about 3 % of the span on every GPU and a stretch of rows written twice, is imported and summarised.
Every figure is checked against what the log was made of: GPU-hours are the distinct samples x 57 s
exactly, the rest of the span is the gap share, no GPU is credited more than its span, the what-if and
the report show the summary's one fleet mean, and rollups give the same answers as the raw samples.
Then the smaller rules, each on a log made for it: held-but-idle is part of idle, the idlest hour is a
whole one, the cost baseline is what was used, and the what-if finds a GPU's memory from its name.
"""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from test_analytics_data import GIB, gpu_rows, write_rows

import analytics as A
from collector import build_rollups
from collector._import_smi import import_files
from reports import _present as P
from reports._html import BuildOptions, build_html

ROOT = Path(__file__).resolve().parent.parent
T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
TICK_S, GPUS, PER_HOST, TICKS = 57, 143, 8, 500  # 500 ticks: 7.9 h
HEADER = (
    "timestamp, index, uuid, name, utilization.gpu [%], memory.used [MiB], memory.total [MiB], power.draw [W]"
)


def _line(t_ms: int, host: str, g: int, util: int, mem: int, total: str = "81559 MiB") -> str:
    ts = T0 + timedelta(milliseconds=t_ms)
    return (
        f"{ts:%Y/%m/%d %H:%M:%S}.{ts.microsecond // 1000:03d}, {g}, GPU-{host}-{g}, NVIDIA H100 80GB HBM3, "
        f"{util} %, {mem} MiB, {total}, 120.5 W"
    )


def _trace(rng: np.random.Generator) -> dict[str, dict[int, list[int]]]:
    """{host: {gpu: tick numbers present}}: every 57 s, each GPU missing one or two scrapes at a time
    (about 2 % of its ticks) and one outage of 12-18 ticks (about 3 % of the span)."""
    hosts: dict[str, dict[int, list[int]]] = {}
    for n in range(GPUS):
        host, g = f"node-{n // PER_HOST:02d}", n % PER_HOST
        present = np.ones(TICKS, bool)
        outage = int(rng.integers(12, 19))
        start = int(rng.integers(20, TICKS - outage - 20))
        present[start : start + outage] = False
        k = 5
        while k < TICKS - 5:
            if rng.random() < 0.012:
                present[k : k + int(rng.integers(1, 3))] = False
                k += 12  # missed scrapes come one or two at a time
            k += 1
        hosts.setdefault(host, {})[g] = np.flatnonzero(present).tolist()
    return hosts


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    root = tmp_path_factory.mktemp("exact")
    rng = np.random.default_rng(27)
    hosts = _trace(rng)
    out = root / "telemetry"
    utils: list[int] = []
    for host, gpus in hosts.items():
        lines = [HEADER]
        samples = sorted((tick, g) for g, ticks in gpus.items() for tick in ticks)
        for tick, g in samples:
            util = int(rng.integers(0, 101)) if g % 3 else 0
            utils.append(util)
            lines.append(_line(tick * TICK_S * 1000, host, g, util, 30_000 if g % 2 else 0))
        if host == "node-03":
            lines += lines[100:400]  # a stretch of the log written twice (a file appended to again)
        log = root / f"{host}.csv"
        log.write_text("\n".join(lines) + "\n")
        report = import_files([log], out, host=host, tz="UTC")
        assert report.malformed == 0
    return out, hosts, utils


def _expected(hosts) -> tuple[int, float]:
    """(distinct samples, the GPUs' spans: first to last sample plus one interval, seconds)."""
    samples = sum(len(t) for gpus in hosts.values() for t in gpus.values())
    spans = sum((t[-1] - t[0]) * TICK_S + TICK_S for gpus in hosts.values() for t in gpus.values())
    return samples, spans


def test_gpu_hours_are_samples_times_the_interval_exactly(trace):
    """A 57 s log with missed scrapes, outages and duplicated rows is credited exactly its distinct
    samples x 57 s, per GPU and in all; the rest of each GPU's span is the gap share; no GPU gets more
    than its span; the median interval stated is the log's."""
    out, hosts, _ = trace
    s = A.fleet_summary(A.open_telemetry(out))
    samples, spans = _expected(hosts)
    assert s.gpus == GPUS
    assert s.gpu_hours * 3600 == pytest.approx(samples * TICK_S, rel=1e-12)
    assert s.gap_hours * 3600 == pytest.approx(spans - samples * TICK_S, rel=1e-9)
    assert s.gap_share == pytest.approx(1 - samples * TICK_S / spans, rel=1e-9)
    assert 0.03 < s.gap_share < 0.08  # the outage (~3 %) and the missed scrapes (~2 %)
    assert s.tick_s_median == pytest.approx(TICK_S)
    for g in s.per_gpu:
        ticks = hosts[g.host][g.gpu_index]
        assert g.gpu_hours * 3600 == pytest.approx(len(ticks) * TICK_S, rel=1e-12), (g.host, g.gpu_index)
        assert g.gpu_hours * 3600 <= (ticks[-1] - ticks[0]) * TICK_S + TICK_S + 1e-6
    sampling = {h.host: h for h in s.sampling}
    for host, gpus in hosts.items():
        span = sum((t[-1] - t[0]) * TICK_S + TICK_S for t in gpus.values())
        present = sum(len(t) for t in gpus.values())
        assert sampling[host].gap_share == pytest.approx(1 - present * TICK_S / span, rel=1e-9)


def test_one_fleet_mean_in_the_summary_the_what_if_and_the_page(trace):
    """The fleet's utilization.gpu mean is one value wherever it is shown, and it is the log's own
    time-weighted mean (every sample stands for 57 s, so the plain mean of the distinct samples)."""
    out, _, utils = trace
    con = A.open_telemetry(out)
    s = A.fleet_summary(con)
    assert s.util_gpu_mean == pytest.approx(np.mean(utils) / 100, rel=1e-9)
    # Without the summary given, the what-if computes the same one (to float rounding: DuckDB's
    # threads add up in any order); the page passes its own.
    w = A.what_if(con)
    assert w.observed_util_mean == pytest.approx(s.util_gpu_mean, rel=1e-12)
    assert w.observed_gpu_hours == pytest.approx(s.gpu_hours, rel=1e-12)
    assert A.what_if(con, summary=s).observed_util_mean == s.util_gpu_mean
    page = build_html([str(out)], BuildOptions())
    means = set(re.findall(r"utilization\.gpu mean (?:</div><div class='value'>)?([\d.]+ %)", page))
    assert means == {P.pct(s.util_gpu_mean)}


@pytest.mark.slow
def test_rollups_give_the_same_exact_figures(trace, tmp_path):
    """Built into rollups (what the app reads at scale), the same log gives the same GPU-hours, gap
    share, per-GPU hours, idle and held-but-idle time and fleet mean as its raw samples."""
    import shutil

    out, hosts, _ = trace
    copy = tmp_path / "telemetry"
    shutil.copytree(out, copy)
    raw = A.fleet_summary(A.open_telemetry(copy))
    build_rollups(copy)
    rolled = A.fleet_summary(A.open_telemetry(copy))
    assert "rollups" in rolled.data_source
    samples, spans = _expected(hosts)
    assert rolled.gpu_hours * 3600 == pytest.approx(samples * TICK_S, rel=1e-12)
    assert rolled.gap_hours * 3600 == pytest.approx(spans - samples * TICK_S, rel=1e-9)
    for f in ("idle_gpu_hours", "held_idle_gpu_hours", "util_gpu_mean"):
        assert getattr(rolled, f) == pytest.approx(getattr(raw, f), rel=1e-9), f
    assert [g.gpu_hours for g in rolled.per_gpu] == pytest.approx(
        [g.gpu_hours for g in raw.per_gpu], rel=1e-12
    )
    w = A.what_if(A.open_telemetry(copy))
    assert w.cost_observed == pytest.approx(samples * TICK_S / 3600 * A.DEFAULT_PRICE, rel=1e-9)


# --- the smaller rules -----------------------------------------------------------------------------


def test_held_but_idle_is_part_of_idle(tmp_path):
    """Idle and held-but-idle test the same 0.1 % bin: with memory held, a sample at 4.97 % (the bin of
    5.0 %) is neither under a 5 % threshold, one at 4.94 % is both; and so through rollups."""
    utils = ([0.0497] * 30 + [0.0494] * 30) * 12  # two hours at 10 s, half of it at each value
    write_rows(tmp_path, "gpu_samples", gpu_rows("a", 0, utils, tick_s=10, mem_used=4 * GIB))
    s = A.fleet_summary(A.open_telemetry(tmp_path))
    assert s.held_idle_gpu_hours <= s.idle_gpu_hours
    assert s.idle_gpu_hours * 3600 == pytest.approx(3600)
    assert s.held_idle_gpu_hours * 3600 == pytest.approx(3600)
    build_rollups(tmp_path)
    rolled = A.fleet_summary(A.open_telemetry(tmp_path))
    assert "rollups" in rolled.data_source
    assert (rolled.idle_gpu_hours, rolled.held_idle_gpu_hours) == pytest.approx((1.0, 1.0))


def test_the_idlest_hour_is_a_whole_hour(tmp_path):
    """A log whose last sample falls 57 s into a new hour, idle there, does not make that sliver
    "the idlest hour": periods rank among the hours their GPUs were observed through."""
    utils = [0.5] * 120 + [0.0]  # two whole hours busy at 50 %, then one idle sample at the next hour
    write_rows(tmp_path, "gpu_samples", gpu_rows("a", 0, utils, tick_s=60))
    p = A.busiest_idlest(A.open_telemetry(tmp_path))
    assert not p.partial
    assert all(x.coverage >= A.FULL_COVERAGE for x in (*p.idlest, *p.busiest))
    assert all(x.util_gpu_mean == pytest.approx(0.5) for x in p.idlest)


def test_the_cost_baseline_is_what_was_used(tmp_path):
    """Four GPUs of which two ran at a time: what was used is 2 GPUs' worth, not 4 x the span; a pool
    of two then saves nothing and says so, while one that fits in fewer saves against the use."""
    rows = []
    for g in range(4):  # GPUs 0 and 1 for ten minutes, then GPUs 2 and 3
        start = T0 + timedelta(seconds=0 if g < 2 else 600)
        rows += gpu_rows("h", g, [0.5] * 60, tick_s=10, start=start, mem_used=60 * GIB)
    write_rows(tmp_path, "gpu_samples", rows)
    con = A.open_telemetry(tmp_path)
    s = A.fleet_summary(con)
    w = A.what_if(con, options=A.PoolOptions(step_s=60, price_per_gpu_hour=3.0))
    assert s.gpu_hours == pytest.approx(4 * 600 / 3600)
    assert w.observed_peak_gpus == 2 and w.pool_gpus == 2
    assert w.cost_observed == pytest.approx(s.gpu_hours * 3.0)
    assert w.saves_nothing and w.cost_saving == 0
    answer = dict((label, (value, help_)) for label, value, help_ in P.answer(s, RuntimeError("-"), w))
    assert answer["and save"][0] == "nothing"
    assert "as many as ran at once at the peak" in answer["and save"][1]
    assert "3.00 USD per GPU-hour (your price)" in answer["and save"][1]
    default = A.what_if(con, options=A.PoolOptions(step_s=60))
    assert (
        "(default; set --price)"
        in dict((lbl, h) for lbl, _, h in P.answer(s, RuntimeError("-"), default))["and save"]
    )


def _log_without_memory_total(path: Path, name: str) -> None:
    header = "timestamp, index, uuid, name, utilization.gpu [%], memory.used [MiB]"
    lines = [header]
    for i in range(40):
        ts = T0 + timedelta(seconds=30 * i)
        for g in range(2):
            lines.append(
                f"{ts:%Y/%m/%d %H:%M:%S}.000, {g}, GPU-x-{g}, {name}, {50 * g} %, {20_000 + 100 * g} MiB"
            )
    path.write_text("\n".join(lines) + "\n")


def test_the_what_if_infers_memory_from_the_model_name(tmp_path):
    """A log without memory.total still gets its what-if: the pool GPU's memory comes from the model
    name, and the page says so; an unknown model asks for --gpu-memory, which then answers."""
    log = tmp_path / "smi.csv"
    _log_without_memory_total(log, "NVIDIA A100-SXM4-40GB")
    import_files([log], tmp_path / "t", host="x", tz="UTC")
    w = A.what_if(A.open_telemetry(tmp_path / "t"))
    assert w.gpu_mem_bytes == 40 * GIB and w.gpu_mem_from == "model NVIDIA A100-SXM4-40GB"
    assert any("inferred from the GPU model name" in a for a in w.assumptions)

    _log_without_memory_total(log, "Mystery Accelerator 9000")
    import_files([log], tmp_path / "u", host="x", tz="UTC")
    with pytest.raises(A.TelemetryError) as exc:
        A.what_if(A.open_telemetry(tmp_path / "u"))
    assert "--gpu-memory" in exc.value.hint
    page = tmp_path / "r.html"
    run = [sys.executable, "-m", "reports.cli", "build", str(tmp_path / "u"), "-o", str(page)]
    proc = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "A pool would need" in page.read_text() and "--gpu-memory" in page.read_text()
    proc = subprocess.run([*run, "--gpu-memory", "48"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "48.0 GiB (as given)" in page.read_text()


def test_rollups_of_an_earlier_weight_rule_are_not_read_and_a_build_redoes_them(tmp_path):
    """Rollups whose footers carry no weight rule (built before this one) are taken for none — the
    summary answers from raw samples — and the next build rebuilds them, after which they answer."""
    import json

    import pyarrow.parquet as pq

    from collector.schema import METADATA_ROLLUP_KEY

    rows = gpu_rows("a", 0, [0.3] * 240, tick_s=57)  # 3.8 h at 57 s
    write_rows(tmp_path, "gpu_samples", rows)
    build_rollups(tmp_path)
    for f in tmp_path.glob("gpu_rollup_*/**/*.parquet"):
        table = pq.read_table(f, partitioning=None)
        meta = dict(table.schema.metadata)
        footer = json.loads(meta[METADATA_ROLLUP_KEY])
        footer.pop("weights")
        meta[METADATA_ROLLUP_KEY] = json.dumps(footer).encode()
        pq.write_table(table.replace_schema_metadata(meta), f)
    s = A.fleet_summary(A.open_telemetry(tmp_path))
    assert s.data_source.startswith("raw samples")
    assert s.gpu_hours * 3600 == pytest.approx(240 * 57)
    said: list[str] = []
    build_rollups(tmp_path, progress=said.append)
    assert any("rebuilding" in line for line in said)
    s = A.fleet_summary(A.open_telemetry(tmp_path))
    assert "rollups" in s.data_source
    assert s.gpu_hours * 3600 == pytest.approx(240 * 57)


def test_per_user_idle_holding_beside_the_headline_says_why_it_differs(tmp_path):
    """Two users' processes holding one idle GPU: per user 10 min each, 20 min in all, while the GPU
    was held idle 10 min. The page shows both and says in words why they differ."""
    from test_analytics_data import process_rows

    write_rows(tmp_path, "gpu_samples", gpu_rows("h", 0, [0.0] * 60, tick_s=10, mem_used=4 * GIB))
    procs = process_rows("h", 0, 1, range(60), mem=2 * GIB, sm_util=0.0, user="ann", tick_s=10)
    procs += process_rows("h", 0, 2, range(60), mem=2 * GIB, sm_util=0.0, user="bo", tick_s=10)
    write_rows(tmp_path, "process_samples", procs)
    con = A.open_telemetry(tmp_path)
    s = A.fleet_summary(con)
    a = A.attribution(con)
    assert s.held_idle_gpu_hours == pytest.approx(600 / 3600)
    assert sum(r.idle_holding_hours for r in a.rows) == pytest.approx(2 * 600 / 3600)
    page = build_html([str(tmp_path)], BuildOptions())
    note = P.attribution_note(a, s)
    assert P.hours(600 / 3600) in note and P.hours(1200 / 3600) in note
    assert note.replace("'", "&#x27;") in page
    held = dict((lbl, h) for lbl, _, h in P.answer(s, a, RuntimeError("-")))["Held but idle"]
    assert "do not add up to this total" in held


def test_a_log_without_memory_total_says_what_to_add_on_the_first_screen(tmp_path):
    """Where the log has no memory.total (nor GPM), no first-screen figure reads a bare n/a: the memory
    headroom says what to log, the what-if, with an unknown model, what to give, SM activity why."""
    log = tmp_path / "smi.csv"
    _log_without_memory_total(log, "Mystery Accelerator 9000")
    import_files([log], tmp_path / "t", host="x", tz="UTC")
    con = A.open_telemetry(tmp_path / "t")
    s = A.fleet_summary(con)
    try:
        w = A.what_if(con, summary=s)
    except A.TelemetryError as exc:
        w = exc
    for label, value, help_ in [*P.answer(s, RuntimeError("-"), w), *P.headline(s)]:
        if value in (P.NA, "not computed"):
            assert any(w in help_ for w in ("memory.total", "--gpu-memory", "what-if", "GPM")), (label, help_)
    cards = {label: help_ for label, _, help_ in [*P.answer(s, RuntimeError("-"), w), *P.headline(s)]}
    assert "--gpu-memory" in cards["A pool would need"]
    assert "memory.total" in cards["memory headroom"]
