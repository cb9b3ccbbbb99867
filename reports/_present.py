"""Turn analytics results into what a page shows: formatted numbers, tables, plotly figures.

Shared by the Streamlit app and the HTML export so both say the same thing the same way. No numbers
are computed here beyond unit conversion; the findings come from ``analytics``.
"""

from __future__ import annotations

import math
from datetime import timedelta

import numpy as np
import pandas as pd
import plotly.graph_objects as go

import analytics as A
from collector.durations import format_duration
from collector.words import plural

SIMULATED_LABEL = "SIMULATED DATA"
UTIL_COLOR = "#1f77b4"
SM_COLOR = "#d62728"
GIB = 1 << 30
NA = "n/a"
TABLE_ROWS = 10  # rows a long table shows at first; the rest is one click (or one CSV download) away
SHORT_ID = 12  # container ids as `docker ps` shows them
TOP_HOLDERS = 3


def pct(x: float | None) -> str:
    return NA if x is None else f"{x * 100:.1f} %"


def wait(seconds: float) -> str:
    """A wait as a reader says it: 45 s, 12 min, 1.5 h."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def money(x: float, currency: str) -> str:
    return f"{x:,.2f} {currency}"


def short_key(by: str, key: str) -> str:
    """A readable attribution key: a container's 64-hex id shortened as ``docker ps`` does."""
    if by == "container" and len(key) > SHORT_ID and all(c in "0123456789abcdef" for c in key):
        return key[:SHORT_ID]
    return key


def cell(x) -> str:
    """One table cell, the same way in the app and the HTML: n/a for missing, 1 decimal (2 significant
    digits under 0.1), thousands separated."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return NA
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        return f"{x:.2g}" if 0 < abs(x) < 0.1 else f"{x:,.1f}"  # as ``hours``: small values keep 2 digits
    return str(x)


def display(df: pd.DataFrame) -> pd.DataFrame:
    """A table as shown (strings formatted by ``cell``); downloads keep ``df``'s numbers."""
    return df.astype(object).apply(lambda col: col.map(cell)) if not df.empty else df


def hours(x: float) -> str:
    if 0 < x < 0.1:
        return f"{x:.2g} h"  # short spans keep two significant digits instead of reading "0.0 h"
    return f"{x:,.1f} h" if x < 10_000 else f"{x:,.0f} h"


def duration(seconds: float) -> str:
    """A bucket or wait length as a reader says it: 45 s, 10 min, 3 h, 1 day."""
    return format_duration(seconds, "words")


def duration_s(seconds: float | None) -> str:
    """An interval as measured: 57 s, 1.5 s, 250 ms, 2.5 min."""
    return "n/a" if seconds is None else format_duration(seconds, "measured")


def gib(x: float | None) -> str:
    return NA if x is None else f"{x / GIB:,.1f} GiB"


CLI_HINTS = {"price": "set --price", "memory": "--gpu-memory"}  # how the HTML's reader sets them
APP_HINTS = {"price": "set it in the sidebar", "memory": "the sidebar's GPU memory field"}


def price_text(w: A.WhatIf, hints: dict[str, str] = CLI_HINTS) -> str:
    """The price a cost rests on, and whose it is: "2.50 USD per GPU-hour (your price)"."""
    whose = f"default; {hints['price']}" if w.options.price_is_default else "your price"
    return f"{w.price:,.2f} {w.options.currency} per GPU-hour ({whose})"


def gpm_words(s: A.FleetSummary) -> str:
    """Why utilization.gpu beside SM activity may read other than the headline's mean, in words."""
    if s.util_gpu_mean_where_gpm is None or pct(s.util_gpu_mean_where_gpm) == pct(s.util_gpu_mean):
        return ""
    return (
        f" (the {pct(s.util_gpu_mean)} of the headline is over all samples; {pct(1 - s.gpm_share)} of the "
        "GPU-hours have no SM activity)"
    )


def wait_catch(w: A.WhatIf) -> str:
    """The catch that goes with a pool size: who would have waited, and how long at most."""
    if not w.waited_requests:
        return "no request would have waited"
    return f"{pct(w.waited_share)} of requests would have waited, up to {wait(w.wait_max_s)}"


def answer(
    s: A.FleetSummary,
    holders: A.Attribution | Exception,
    w: A.WhatIf | Exception,
    hints: dict[str, str] = CLI_HINTS,
) -> list[tuple[str, str, str]]:
    """The answer the audit is for, first on the page: (label, value, help) for how busy the GPUs really
    are, who holds them idle, and what a pool would need (with its catch) and save (against what was
    used, at whose price). ``hints`` say how the page's reader sets the price and the GPU memory."""
    busy = s.sm_activity_mean if s.sm_activity_mean is not None else s.util_gpu_mean
    if s.sm_activity_mean is not None:
        busy_help = (
            f"SM activity (GPM): share of the SMs doing work. utilization.gpu (any kernel running) "
            f"reads {pct(s.util_gpu_mean_where_gpm)} on the same samples{gpm_words(s)}"
        )
    else:
        busy_help = "utilization.gpu: share of time any kernel ran (no GPM data, so it overstates)"
    cards = [("How busy the GPUs really are", pct(busy), busy_help)]
    top = _idle_holders(holders)
    held_help = "idle with memory held, so no one else could use them"
    if top:
        held_help += (
            f"; most by {top} (per user: the time their processes held memory while idle; a GPU shared "
            "by two users counts for each, so per-user hours do not add up to this total)"
        )
    cards.append(("Held but idle", f"{hours(s.held_idle_gpu_hours)} · {pct(s.held_idle_share)}", held_help))
    if isinstance(w, Exception):
        title, hint = getattr(w, "title", str(w)), getattr(w, "hint", "")
        hint = hint.replace(A.MEMORY_HINT, f"give one pool GPU's memory: {hints['memory']}")
        cards.append(
            ("A pool would need", "not computed", f"no what-if: {title}" + (f"; {hint}" if hint else ""))
        )
        cards.append(("and save", "not computed", "needs the what-if above"))
    else:
        cards.append(
            (
                "A pool would need",
                f"{w.gpus_needed_p95} of {plural(w.observed_gpus, 'GPU')} — {wait_catch(w)}",
                f"p95 of the observed demand replayed on 1/{w.options.granularity} partitions "
                f"({w.options.policy}); at most {plural(w.observed_peak_gpus, 'GPU')} ran at once",
            )
        )
        cards.append(("and save", saving_value(w), f"at {price_text(w, hints)}; {saving_words(w)}"))
    return cards


def saving_value(w: A.WhatIf) -> str:
    return "nothing" if w.saves_nothing else money(w.cost_saving, w.options.currency)


def saving_words(w: A.WhatIf) -> str:
    """How the saving is reckoned: what was used against what the pool would cost all along."""
    cur = w.options.currency
    used = f"{hours(w.observed_gpu_hours)} of GPU use cost {money(w.cost_observed, cur)}"
    pooled = (
        f"a pool of {plural(w.pool_gpus, 'GPU')} over {hours(w.span_hours)} costs {money(w.cost_pooled, cur)}"
    )
    if w.pool_gpus >= w.observed_peak_gpus:
        return (
            f"the pool needs {plural(w.pool_gpus, 'GPU')}, as many as ran at once at the peak "
            f"({w.observed_peak_gpus}): it saves nothing ({used}; {pooled})"
        )
    if w.saves_nothing:
        return f"{used}; {pooled}: it saves nothing"
    return f"{used}; {pooled}"


def _idle_holders(holders: A.Attribution | Exception) -> str:
    if isinstance(holders, Exception):
        return ""
    rows = sorted(holders.rows, key=lambda r: r.idle_holding_hours, reverse=True)
    rows = [r for r in rows[:TOP_HOLDERS] if r.idle_holding_hours > 0]
    return ", ".join(f"{short_key(holders.by, r.key)} ({hours(r.idle_holding_hours)})" for r in rows)


def headline(s: A.FleetSummary) -> list[tuple[str, str, str]]:
    """(label, value, help) for the headline figures."""
    gap = ""
    if s.sm_activity_mean is not None and s.util_gpu_mean_where_gpm is not None:
        gap = f"; on the same samples utilization.gpu reads {pct(s.util_gpu_mean_where_gpm)}"
    return [
        (
            "GPUs",
            f"{s.gpus} on {plural(s.hosts, 'host')}",
            "GPUs with samples in the selection",
        ),
        (
            "GPU-hours observed",
            hours(s.gpu_hours),
            f"each sample counts for its GPU's sampling interval (median interval {duration_s(s.tick_s_median)}); "
            f"missed samples and gaps in collection ({pct(s.gap_share)} of the sampled span) are not counted",
        ),
        (
            "utilization.gpu mean",
            pct(s.util_gpu_mean),
            f"duty cycle: share of time any kernel ran. p50 {pct(s.util_gpu_p50)}, p95 {pct(s.util_gpu_p95)}",
        ),
        (
            "SM activity mean",
            pct(s.sm_activity_mean),
            f"GPM (Hopper+), over {pct(s.gpm_share)} of the GPU-hours: share of SMs doing work. "
            f"p50 {pct(s.sm_activity_p50)}, p95 {pct(s.sm_activity_p95)}{gap}{gpm_words(s)}"
            if s.sm_activity_mean is not None
            else "no GPM data here: SM activity needs Hopper or later GPUs sampled by gpustat-collect "
            "(nvidia-smi and DCGM logs have none)",
        ),
        (
            f"idle GPU-hours · {pct(s.idle_share)}",
            hours(s.idle_gpu_hours),
            f"utilization.gpu below {pct(s.options.idle_below)}",
        ),
        (
            f"held but idle · {pct(s.held_idle_share)}",
            hours(s.held_idle_gpu_hours),
            f"idle while at least {gib(s.options.held_mem_bytes)} of memory is in use: nobody else can have it",
        ),
        (
            "memory headroom",
            gib(s.mem_headroom_bytes_mean),
            f"free memory per GPU on average; memory used mean {pct(s.mem_used_ratio_mean)}, "
            f"the fullest a GPU got {pct(s.mem_used_ratio_peak)}"
            if s.mem_headroom_bytes_mean is not None
            else "needs each GPU's memory size: the telemetry has no memory.total (add memory.total to "
            "nvidia-smi's --query-gpu list)",
        ),
    ]


def findings(s: A.FleetSummary) -> list[str]:
    """A few sentences a reader takes away."""
    out = [
        f"{plural(s.gpus, 'GPU')} {'was' if s.gpus == 1 else 'were'} observed for {hours(s.gpu_hours)} between {s.first_sample:%Y-%m-%d %H:%M} and "
        f"{s.last_sample:%Y-%m-%d %H:%M} UTC.",
        f"They were idle (utilization.gpu under {pct(s.options.idle_below)}) {pct(s.idle_share)} of the time; "
        f"{hours(s.held_idle_gpu_hours)} of that with memory held, so no one else could use them.",
    ]
    if s.sm_activity_mean is not None and s.util_gpu_mean_where_gpm is not None:
        out.append(
            f"Where GPM data exists, utilization.gpu says {pct(s.util_gpu_mean_where_gpm)} busy but only "
            f"{pct(s.sm_activity_mean)} of the SMs were doing work: the duty cycle overstates how busy they are."
        )
    return out


def sampling_note(s: A.FleetSummary) -> str:
    """What sampling the figures rest on."""
    return (
        f"{s.samples:,} samples; a GPU's consecutive samples were {duration_s(s.tick_s_median)} apart (median). "
        f"Each sample counts for its GPU's sampling interval (the median of the intervals around it): "
        f"an interval longer than {A.GAP_FACTOR:g} of those holds at least one missed sample, and only one "
        f"interval of it counts: {hours(s.gap_hours)} ({pct(s.gap_share)} of the sampled span) had no sample "
        f"and is not counted as observed. Summary computed from {s.data_source}."
    )


def coarse_warning(s: A.FleetSummary) -> str | None:
    """Where sampling is coarse enough (tens of seconds) to limit what a figure can mean."""
    coarse = s.coarse_hosts
    if coarse:
        names = ", ".join(f"{h.host} ({duration_s(h.median_interval_s)})" for h in coarse[:8])
        more = f" and {len(coarse) - 8} more" if len(coarse) > 8 else ""
        return (
            f"Coarse sampling on {len(coarse)} of {len(s.sampling)} hosts: {names}{more}. A sample there stands for "
            "tens of seconds of use it did not see whole: utilization.gpu is a duty cycle over the driver's last "
            "sample period, so bursts and idle moments shorter than the interval are missed or stretched over it. "
            "Means and GPU-hours stay sound over many samples; percentiles, idle spells and the what-if's "
            "per-step demand are only as fine as the interval."
        )
    return None


def sampling_table(s: A.FleetSummary) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "host": h.host,
                "GPUs": h.gpus,
                "samples": h.samples,
                "median interval (s)": None if h.median_interval_s is None else round(h.median_interval_s, 3),
                "observed GPU-hours": round(h.observed_hours, 2),
                "GPU-hours in gaps": round(h.gap_hours, 2),
                "in gaps %": _p(h.gap_share),
            }
            for h in s.sampling
        ]
    )


def per_gpu_table(s: A.FleetSummary, *, full: bool = False) -> pd.DataFrame:
    """One row per GPU, narrow enough for a laptop screen (means over the GPU's samples: util % is
    utilization.gpu, SM % GPM SM activity); ``full`` adds the UUID and the simulated flag (the CSV
    download), which no screen has room for (the page's banner says when data is simulated)."""
    return pd.DataFrame(
        [
            {
                "host": g.host,
                "gpu": g.gpu_index,
                "name": g.gpu_name,
                **({"uuid": g.gpu_uuid} if full else {}),
                "interval s": round(g.tick_s, 3),
                "GPU-hours": round(g.gpu_hours, 3),
                "util %": _p(g.util_gpu_mean),
                "SM %": _p(g.sm_activity_mean),
                "idle h": round(g.idle_gpu_hours, 3),
                "held-idle h": round(g.held_idle_gpu_hours, 3),
                "mem used %": _p(g.mem_used_ratio_mean),
                "mem GiB": round(g.mem_total_bytes / GIB, 3),
                **({"simulated": g.simulated} if full else {}),
            }
            for g in s.per_gpu
        ]
    )


def attribution_note(a: A.Attribution, s: A.FleetSummary) -> str:
    """Why the rows' idle holding need not add up to the summary's held-but-idle GPU-hours."""
    total = sum(r.idle_holding_hours for r in a.rows)
    return (
        f"Idle holding per {a.by} adds up to {hours(total)}, the summary's held but idle to "
        f"{hours(s.held_idle_gpu_hours)}: here each process counts (a GPU two processes hold counts for "
        "each) and idle is the process's own busy share, where the summary counts each GPU once by its "
        "utilization.gpu."
    )


def attribution_table(a: A.Attribution, *, full_keys: bool = False) -> pd.DataFrame:
    """Most GPU-hours first; container ids shortened (``full_keys`` for the CSV download). Short headers
    so the table fits a laptop screen: GPU-h are GPU-hours held and busy, idle holding is time held
    (at least the held-memory threshold) while busy under the idle threshold."""
    return pd.DataFrame(
        [
            {
                a.by: r.key if full_keys else short_key(a.by, r.key),
                "processes": r.processes,
                "GPUs": r.gpus,
                "held GPU-h": round(r.gpu_hours, 3),
                "busy GPU-h": round(r.busy_gpu_hours, 3),
                "mem GiB-h": round(r.memory_gib_hours, 3),
                "peak GiB": round(r.mem_peak_bytes / GIB, 3),
                "idle holding h": round(r.idle_holding_hours, 3),
                "idle holding %": _p(r.idle_holding_share),
            }
            for r in a.rows
        ]
    )


def periods_note(p: A.Periods) -> str:
    """Which periods were ranked."""
    if p.partial:
        return (
            "No period had its GPUs observed for most of it (gaps, GPUs coming and going): all are ranked, "
            "with how much of each was observed."
        )
    return f"Ranked among the periods whose GPUs were observed for at least {pct(A.FULL_COVERAGE)} of them."


def periods_table(p: A.Periods) -> pd.DataFrame:
    rows = [("busiest", x) for x in p.busiest] + [("idlest", x) for x in p.idlest]
    return pd.DataFrame(
        [
            {
                "kind": kind,
                "from (UTC)": f"{x.start:%Y-%m-%d %H:%M}",
                "to (UTC)": f"{x.end:%Y-%m-%d %H:%M}",
                "util.gpu mean %": _p(x.util_gpu_mean),
                "SM activity mean %": _p(x.sm_activity_mean),
                "GPUs": x.gpus,
                "observed %": _p(x.coverage),
            }
            for kind, x in rows
        ]
    )


def whatif_rows(w: A.WhatIf, hints: dict[str, str] = CLI_HINTS) -> list[tuple[str, str]]:
    basis = (
        "per-process rows"
        if w.demand == "process"
        else "per-GPU utilization and memory held (no process rows)"
    )
    if w.demand == "gpu" and w.options.demand == "gpu":
        basis = "per-GPU utilization and memory held (as asked)"
    return [
        ("demand replayed", basis),
        ("requests replayed", f"{w.requests:,} ({w.demand} demand, {duration(w.step_s)} steps)"),
        (
            "GPUs observed",
            f"{w.observed_gpus}, at most {w.observed_peak_gpus} at once; {hours(w.observed_gpu_hours)} observed "
            f"(utilization.gpu mean {pct(w.observed_util_mean)})",
        ),
        ("pool GPU memory", f"{gib(w.gpu_mem_bytes)} ({A.memory_source(w.gpu_mem_from)})"),
        (
            "GPUs needed, p95 / p99 / peak",
            f"{w.gpus_needed_p95} / {w.gpus_needed_p99} / {w.gpus_needed_peak}",
        ),
        ("if partitions could be repacked (p95)", f"{w.gpus_needed_ideal_p95}"),
        (
            "pool replayed",
            f"{plural(w.pool_gpus, 'GPU')}, 1/{w.options.granularity} partitions, {w.options.policy}",
        ),
        ("pooled GPUs' busy share", pct(w.pooled_util_mean)),
        ("pool memory allocated", pct(w.pooled_mem_allocated_mean)),
        ("requests that would have waited", f"{w.waited_requests:,} ({pct(w.waited_share)})"),
        (
            "how long those waited, p95 / longest",
            f"{wait(w.wait_p95_s)} / {wait(w.wait_max_s)}" if w.waited_requests else "no request waited",
        ),
        ("compute oversubscribed", f"{pct(w.oversubscribed_share)} of pool GPU-steps"),
        (f"cost at {price_text(w, hints)}", f"saves {saving_value(w)}: {saving_words(w)}"),
    ]


def pool_summary(p: A.PoolActivity) -> str:
    e = p.events
    return (
        f"{plural(e['grant'], 'lease')} granted, {plural(e['deny'], 'request')} denied; {e['release']:,} released, "
        f"{e['expire']:,} expired, {e['reclaim']:,} reclaimed for idleness. Leases held {hours(p.gpu_hours)} "
        f"of GPU (fraction x time), {hours(p.reclaimed_gpu_hours)} of it in leases that idle reclaim ended."
    )


def pool_table(p: A.PoolActivity) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "client": c.client,
                "leases": c.leases,
                "denied requests": c.denials,
                "reclaimed leases": c.reclaimed,
                "GPU-hours leased": round(c.gpu_hours, 3),
                "GPU-hours in reclaimed leases": round(c.reclaimed_gpu_hours, 3),
            }
            for c in p.clients
        ]
    )


def jobs_table(usage: tuple[A.JobUsage, ...], by: str) -> pd.DataFrame:
    """GPU-hours of batch jobs' leases (docs/schedulers.md) per account (``by="account"``) or per job;
    leases taken outside a scheduler are one row, "(no batch job)"."""
    rows = []
    for u in usage:
        if by == "account":
            row = {"account": u.account or "(none)"}
        else:
            row = {"job": f"{u.scheduler}:{u.job_id}" if u.job_id else "(no batch job)", "account": u.account or "",
                   "user": u.user or ""}  # fmt: skip
        rows.append(
            {
                **row,
                "leases": u.leases,
                "denied requests": u.denials,
                "GPU-hours leased": round(u.gpu_hours, 3),
            }
        )
    return pd.DataFrame(rows)


def _p(x: float | None) -> float | None:
    return None if x is None else round(x * 100, 1)


def _layout(fig: go.Figure, title: str, simulated: bool, height: int = 360) -> go.Figure:
    fig.update_layout(
        title=title + (f"  [{SIMULATED_LABEL}]" if simulated else ""),
        height=height,
        margin={"l": 60, "r": 20, "t": 80, "b": 40},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "xanchor": "right", "x": 1.0},
        template="plotly_white",
    )
    return fig


def fig_timeline(t: A.Timeline) -> go.Figure:
    xs = [p.start for p in t.points]
    fig = go.Figure()
    fig.add_scatter(
        x=xs,
        y=[_p(p.util_gpu_mean) for p in t.points],
        name="utilization.gpu (duty cycle)",
        line_color=UTIL_COLOR,
    )
    if any(p.sm_activity_mean is not None for p in t.points):
        fig.add_scatter(
            x=xs, y=[_p(p.sm_activity_mean) for p in t.points], name="SM activity (GPM)", line_color=SM_COLOR
        )
    fig.update_yaxes(title="% (fleet mean)", range=[0, 100])
    return _layout(fig, f"Utilization over time ({duration(t.bucket_s)} buckets)", t.simulated)


def fig_heatmap(h: A.HourOfWeek, metric: str = "util") -> go.Figure:
    grid = h.util if metric == "util" else h.sm
    name = "utilization.gpu" if metric == "util" else "SM activity"
    fig = go.Figure(
        go.Heatmap(
            z=[[_p(v) for v in row] for row in grid],
            x=[f"{hh:02d}" for hh in range(24)],
            y=list(A.DAYS),
            zmin=0,
            zmax=100,
            colorscale="Viridis",
            colorbar={"title": "%"},
            hovertemplate="%{y} %{x}:00 — %{z:.1f} %<extra></extra>",
        )
    )
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title=f"hour ({h.tz})")
    return _layout(fig, f"{name} by hour of week — {h.key}", h.simulated, height=320)


def fig_distribution(s: A.FleetSummary) -> go.Figure:
    fig = go.Figure()
    for d, color, name in (
        (s.util_distribution, UTIL_COLOR, "utilization.gpu"),
        (s.sm_distribution, SM_COLOR, "SM activity"),
    ):
        if sum(h for _, h in d.bins) > 0:
            fig.add_bar(
                x=[f"{lo * 100:.0f}–{(lo + d.width) * 100:.0f}" for lo, _ in d.bins],
                y=[h for _, h in d.bins],
                name=name,
                marker_color=color,
            )
    fig.update_layout(barmode="group")
    fig.update_xaxes(title="% busy")
    fig.update_yaxes(title="GPU-hours")
    return _layout(fig, "How busy, how often (GPU-hours per 5 % bin)", s.simulated)


def fig_attribution(a: A.Attribution, top: int = 15) -> go.Figure:
    rows = a.rows[:top]
    keys = [short_key(a.by, r.key) for r in rows]
    fig = go.Figure()
    fig.add_bar(
        y=keys, x=[r.busy_gpu_hours for r in rows], name="busy", orientation="h", marker_color=UTIL_COLOR
    )
    fig.add_bar(
        y=keys,
        x=[r.idle_holding_hours for r in rows],
        name="idle while holding memory",
        orientation="h",
        marker_color="#ff7f0e",
    )
    fig.add_bar(
        y=keys,
        x=[max(r.gpu_hours - r.busy_gpu_hours - r.idle_holding_hours, 0) for r in rows],
        name="held, partly busy",
        orientation="h",
        marker_color="#c7c7c7",
    )
    fig.update_layout(barmode="stack")
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title="GPU-hours held")
    return _layout(fig, f"GPU-hours per {a.by}", a.simulated, height=max(260, 40 + 28 * len(rows)))


NEED_POINTS = 2000  # the need chart's most points: minutes over 90 days are 129,600


def need_series(w: A.WhatIf, points: int = NEED_POINTS) -> tuple[list, list[int], int]:
    """(times, GPUs, steps per point) of the need chart: each step, or where there are more than
    ``points`` steps, the most GPUs in use in each run of steps (the peaks stay visible)."""
    per = max(1, math.ceil(len(w.need) / points))
    need = np.asarray(w.need, np.int64)
    if per > 1:
        need = np.maximum.reduceat(need, np.arange(0, len(need), per))
    step = timedelta(seconds=w.step_s * per)
    return [w.need_start + i * step for i in range(len(need))], need.tolist(), per


def fig_need(w: A.WhatIf) -> go.Figure:
    fig = go.Figure()
    times, need, per = need_series(w)
    fig.add_scatter(
        x=times,
        y=need,
        name="pool GPUs in use" if per == 1 else f"pool GPUs in use (most per {duration(w.step_s * per)})",
        line_shape="hv",
        line_color=UTIL_COLOR,
    )
    fig.add_hline(
        y=w.observed_gpus, line_dash="dot", annotation_text=f"observed: {plural(w.observed_gpus, 'GPU')}"
    )
    fig.add_hline(y=w.gpus_needed_p95, line_dash="dash", line_color=SM_COLOR, annotation_text="p95 need")
    fig.update_yaxes(title="GPUs", rangemode="tozero")
    return _layout(fig, "What-if: GPUs a pool would need over time", w.simulated)


def whatif_headline(w: A.WhatIf) -> str:
    """The pooling answer in one sentence, saying which demand it replayed."""
    basis = (
        "each process's observed runs"
        if w.demand == "process"
        else "each GPU's observed utilization and memory held (the telemetry has no per-process rows)"
    )
    return (
        f"Replaying {basis} onto 1/{w.options.granularity} partitions: {w.gpus_needed_p95} pooled GPUs would "
        f"have served the demand 95 % of the time ({w.gpus_needed_p99} for 99 %), against {w.observed_gpus} "
        f"observed; a pool of {w.pool_gpus} would have made {pct(w.waited_share)} of requests wait."
    )
