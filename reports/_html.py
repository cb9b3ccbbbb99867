"""``gpustat-report build``: the report as ONE self-contained HTML file.

plotly.js is inlined once in the page head (no CDN), every chart is a div drawing from it, tables
are plain HTML: the file opens with no network, from a mail attachment or a USB stick.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import plotly.io as pio
from plotly.offline import get_plotlyjs

import analytics as A
from reports import _present as P


@dataclass(frozen=True)
class BuildOptions:
    scope: A.Scope = field(default_factory=A.Scope)
    summary: A.SummaryOptions = field(default_factory=A.SummaryOptions)
    pool: A.PoolOptions = field(default_factory=A.PoolOptions)
    tz: str = "UTC"
    heatmap_level: str = "fleet"


_CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 0 auto; max-width: 1200px;
       padding: 0 24px 48px; color: #222; }
h1 { margin-top: 24px; }
h2 { border-bottom: 1px solid #ddd; padding-bottom: 4px; margin-top: 40px; }
.sim { color: #fff; background: #c62828; padding: 2px 8px; border-radius: 4px; font-size: 0.7em;
       vertical-align: middle; letter-spacing: 0.05em; }
.banner { background: #ffebee; border: 2px solid #c62828; padding: 12px 16px; border-radius: 6px; }
.cards { display: grid; grid-template-columns: repeat(4, 1fr); gap: 12px; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: 10px 12px; }
.card .label { color: #666; font-size: 0.85em; }
.card .value { font-size: 1.5em; font-weight: 600; margin: 4px 0; }
.card .help { color: #777; font-size: 0.75em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 8px 0; }
th, td { border: 1px solid #ddd; padding: 4px 8px; text-align: right; }
th { background: #f5f5f5; }
td:first-child, th:first-child { text-align: left; }
.muted { color: #666; font-size: 0.85em; }
.answer { background: #f3f8fd; border: 1px solid #b6d4f0; border-radius: 8px; padding: 12px 16px; margin-top: 16px; }
.answer h2 { margin-top: 4px; border: none; }
.answer .value { font-size: 1.8em; }
details { margin: 4px 0 12px; }
summary { cursor: pointer; color: #1f5fa8; }
"""


def _section(title: str, simulated: bool) -> str:
    badge = f' <span class="sim">{P.SIMULATED_LABEL}</span>' if simulated else ""
    return f'<h2 id="{html.escape(title.lower().split(":")[0].replace(" ", "-"))}">{html.escape(title)}{badge}</h2>'


def _fig(fig) -> str:
    return pio.to_html(fig, full_html=False, include_plotlyjs=False, config={"displaylogo": False})


def _cards(cards: list[tuple[str, str, str]]) -> str:
    return (
        "<div class='cards'>"
        + "".join(
            f"<div class='card'><div class='label'>{html.escape(label)}</div><div class='value'>{html.escape(value)}"
            f"</div><div class='help'>{html.escape(help_text)}</div></div>"
            for label, value, help_text in cards
        )
        + "</div>"
    )


def _table(df, name: str, csv=None) -> str:
    """A table capped at ``P.TABLE_ROWS`` rows; the rest one click away, and all of it as a CSV download
    (``csv``: the frame to download, default ``df``; numbers unformatted, ids in full)."""
    shown = P.display(df).to_html(index=False, escape=True)
    if len(df) <= P.TABLE_ROWS:
        out = shown
    else:
        out = P.display(df.head(P.TABLE_ROWS)).to_html(index=False, escape=True) + (
            f"<details><summary>show all {len(df):,} rows</summary>{shown}</details>"
        )
    data = base64.b64encode((df if csv is None else csv).to_csv(index=False).encode()).decode()
    return out + (
        f"<p class='muted'><a download='{html.escape(name)}.csv' href='data:text/csv;base64,{data}'>"
        f"download {html.escape(name)}.csv</a></p>"
    )


def _kv_table(rows: list[tuple[str, str]]) -> str:
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def build_html(dirs: list[str], opts: BuildOptions | None = None, progress=lambda msg: None) -> str:
    """Compute every finding for ``opts.scope`` and return the page. Raises ``TelemetryError``."""
    opts = opts or BuildOptions()
    con = A.open_telemetry(dirs)
    progress("fleet summary")
    s = A.fleet_summary(con, opts.scope, opts.summary)
    sim = s.simulated
    progress("time patterns")
    if opts.heatmap_level == "fleet":  # the three from one read of hourly buckets where they allow it
        pat = A.fleet_patterns(con, opts.scope, tz=opts.tz)
        timeline, grids, per = pat.timeline, pat.heatmap, pat.periods
    else:
        timeline = A.utilization_timeline(con, opts.scope)
        grids = A.hour_of_week(con, opts.scope, level=opts.heatmap_level, tz=opts.tz)
        per = A.busiest_idlest(con, opts.scope)
    progress("attribution")
    attributions = []
    for by in A.ATTRIBUTION_KEYS:
        try:
            attributions.append(A.attribution(con, opts.scope, by=by, options=opts.summary))
        except A.TelemetryError as exc:
            attributions.append(exc)
    progress("what-if pool")
    try:
        whatif: A.WhatIf | A.TelemetryError = A.what_if(con, opts.scope, opts.pool, s)
    except A.TelemetryError as exc:
        whatif = exc
    by_user = next((a for a in attributions if not isinstance(a, Exception) and a.by == "user"), None)

    parts: list[str] = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>gpupool audit{' (SIMULATED DATA)' if sim else ''}</title>",
        f"<style>{_CSS}</style>",
        f"<script type='text/javascript'>{get_plotlyjs()}</script>",
        "</head><body>",
        f"<h1>GPU audit: how busy are the GPUs really?{' <span class=sim>' + P.SIMULATED_LABEL + '</span>' if sim else ''}</h1>",
        f"<p class='muted'>{html.escape(', '.join(dirs))} · {html.escape(opts.scope.describe())} · "
        f"generated {datetime.now(UTC):%Y-%m-%d %H:%M} UTC by gpustat-report</p>",
        *[f"<div class='banner'>{html.escape(note)}</div>" for note in A.telemetry_notes(con)],
    ]
    if sim:
        parts.append(
            f"<div class='banner'><b>{P.SIMULATED_LABEL}</b> — {P.pct(s.simulated_share)} of these GPU-hours "
            "come from gpupool's simulated fleet, not real GPUs. Do not draw conclusions about your hardware "
            "from them.</div>"
        )
    holders = by_user if by_user is not None else A.TelemetryError("no process rows", "")
    parts += [
        "<div class='answer'>",
        _section("Summary", sim),
        _cards(P.answer(s, holders, whatif)),
        "<ul>",
        *[f"<li>{html.escape(line)}</li>" for line in P.findings(s)],
        "</ul><p class='muted'>Sections below: "
        "<a href='#what-if'>what-if pool</a> · <a href='#who-holds-the-gpus'>who holds the GPUs</a> · "
        "<a href='#utilization-over-time'>over time</a> · <a href='#per-gpu'>per GPU</a></p></div>",
        "<h3>The fleet in numbers</h3>",
        _cards(P.headline(s)),
        f"<h3>Sampling</h3><p>{html.escape(P.sampling_note(s))}</p>",
    ]
    if (warning := P.coarse_warning(s)) is not None:
        parts.append(f"<div class='banner'>{html.escape(warning)}</div>")
    parts.append(_table(P.sampling_table(s), "sampling"))

    # The answer's details first (what a pool would need, who holds the GPUs), then the when and how.
    parts.append(_section("What-if: a pool of fractional GPUs", sim))
    if isinstance(whatif, A.TelemetryError):
        parts.append(f"<p class='muted'>{html.escape(whatif.title)}. {html.escape(whatif.hint)}</p>")
    else:
        parts += [
            f"<p>{html.escape(P.whatif_headline(whatif))}</p>",
            _fig(P.fig_need(whatif)),
            _kv_table(P.whatif_rows(whatif)),
            "<h3>Assumptions</h3><ul>",
            *[f"<li>{html.escape(x)}</li>" for x in whatif.assumptions],
            "</ul>",
        ]

    parts.append(_section("Who holds the GPUs", sim))
    for a in attributions:
        if isinstance(a, A.TelemetryError):
            parts.append(f"<p class='muted'>{html.escape(a.title)}. {html.escape(a.hint)}</p>")
            break
        parts += [
            _fig(P.fig_attribution(a)),
            f"<p class='muted'>{html.escape(P.attribution_note(a, s))}</p>",
            _table(P.attribution_table(a), f"attribution-{a.by}", P.attribution_table(a, full_keys=True)),
        ]

    parts += [_section("Utilization over time", sim), _fig(P.fig_timeline(timeline))]
    parts.append(_section("When: hour of week", sim))
    for g in grids[:16]:
        parts.append(_fig(P.fig_heatmap(g, "util")))
        if any(v is not None for row in g.sm for v in row):
            parts.append(_fig(P.fig_heatmap(g, "sm")))
    parts += [
        "<h3>Busiest and idlest hours</h3>",
        f"<p class='muted'>{html.escape(P.periods_note(per))}</p>",
        _table(P.periods_table(per), "periods"),
    ]
    parts += [_section("Distribution", sim), _fig(P.fig_distribution(s))]

    activity = A.pool_activity(con, opts.scope)
    if not activity.empty:  # only once gpupool-server runs and writes its lease events
        parts += [
            _section("Pool activity", activity.simulated),
            f"<p>{html.escape(P.pool_summary(activity))}</p>",
            _table(P.pool_table(activity), "pool-clients"),
        ]
        jobs = A.pool_usage_by_job(con, opts.scope, by="job")
        if any(u.job_id for u in jobs):  # leases taken by a scheduler integration (deploy/slurm)
            parts += [
                "<h3>Batch jobs: GPU-hours per account and per job</h3>",
                _table(
                    P.jobs_table(A.pool_usage_by_job(con, opts.scope, by="account"), "account"),
                    "pool-accounts",
                ),
                _table(P.jobs_table(jobs, "job"), "pool-jobs"),
            ]
    parts += [_section("Per GPU", sim), _table(P.per_gpu_table(s), "per-gpu", P.per_gpu_table(s, full=True))]
    parts.append("</body></html>")
    return "\n".join(parts)


def write_html(
    dirs: list[str], out: Path, opts: BuildOptions | None = None, progress=lambda msg: None
) -> Path:
    page = build_html(dirs, opts, progress)
    tmp = out.with_name(out.name + ".tmp")
    try:
        tmp.write_text(page, encoding="utf-8")
        tmp.replace(out)
    except BaseException:  # a full disk, a directory in the way: no half page left behind
        tmp.unlink(missing_ok=True)
        raise
    return out
