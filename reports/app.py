"""The Streamlit report: ``gpustat-report serve DIR...`` runs this script.

It only lays out what ``analytics`` computes. The telemetry directories come from the environment
variable ``GPUPOOL_REPORT_DIRS`` (``os.pathsep``-separated), which ``gpustat-report serve`` sets.
"""

from __future__ import annotations

import math
import os
import re
from datetime import UTC, datetime, timedelta

import streamlit as st

import analytics as A
from reports import DIRS_ENV
from reports import _present as P

__all__ = ["DIRS_ENV", "main"]
CACHE_TTL_S = 60  # telemetry grows while the collector runs: recompute at most once a minute
DEFAULT_WINDOW = timedelta(days=7)
# Above this many GPU-minutes in the range the what-if waits for a button (a month of 64 GPUs is
# 2.8 M: about a second; 512 GPUs over 90 days are 66 M: half a minute on two cores), so the page
# still opens on the whole history; the environment variable moves the limit.
WHATIF_AUTO_ENV = "GPUPOOL_REPORT_WHATIF_AUTO_GPU_MINUTES"
WHATIF_AUTO_GPU_MINUTES = 10_000_000


def _dirs() -> tuple[str, ...]:
    # os.pathsep-separated; the ':' of an s3:// location is not a separator
    return tuple(d for d in re.split(re.escape(os.pathsep) + "(?!//)", os.environ.get(DIRS_ENV, "")) if d)


class Telemetry:
    """One connection for one run of the script, opened at its first use: a cached answer needs
    none, and opening is a listing of every file (seconds over months of a large fleet). A run's
    calls are all in its thread; a DuckDB connection is never shared across the threads Streamlit
    runs sessions in."""

    def __init__(self, dirs: tuple[str, ...]):
        self.dirs, self._con = dirs, None

    def __call__(self):
        if self._con is None:
            self._con = A.open_telemetry(self.dirs)
        return self._con


# Cached on ``dirs`` and the question; ``_t`` (not hashed) gives the run's connection.
@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False)
def extent(dirs, _t):
    return A.data_extent(_t())


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False)
def has_rollups(dirs, _t) -> bool:
    return A.rollups_built(_t())


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False)
def notes(dirs, _t) -> list[str]:
    return A.telemetry_notes(_t())


@st.cache_data(ttl=CACHE_TTL_S, show_spinner="summarising...")
def summary(dirs, scope, options, _t):
    return A.fleet_summary(_t(), scope, options)


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False)
def timeline(dirs, scope, _t):
    return A.utilization_timeline(_t(), scope)


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False)
def heatmaps(dirs, scope, level, tz, _t):
    return A.hour_of_week(_t(), scope, level=level, tz=tz)


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False)
def periods(dirs, scope, _t):
    return A.busiest_idlest(_t(), scope)


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False)
def patterns(dirs, scope, tz, _t):
    """The timeline, busiest hours and fleet heatmap from one read (``A.fleet_patterns``)."""
    return A.fleet_patterns(_t(), scope, tz=tz)


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False)
def attribution(dirs, scope, by, options, _t):
    return A.attribution(_t(), scope, by=by, options=options)


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False)
def pool_activity(dirs, scope, _t):
    return A.pool_activity(_t(), scope)


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False)
def pool_jobs(dirs, scope, by, _t):
    return A.pool_usage_by_job(_t(), scope, by=by)


@st.cache_data(ttl=CACHE_TTL_S, show_spinner="replaying demand onto the pool...")
def whatif(dirs, scope, options, _t, _s):
    # ``_s``: the summary of the same scope (its GPU-hours are the cost baseline), not part of the key.
    return A.what_if(_t(), scope, options, _s)


def section(title: str, simulated: bool) -> None:
    st.header(title + (f"  ·  :red[{P.SIMULATED_LABEL}]" if simulated else ""))


def download(df, name: str, key: str) -> None:
    st.download_button(f"Download {name} (CSV)", df.to_csv(index=False), f"{name}.csv", "text/csv", key=key)


def table(df, name: str, key: str, csv=None) -> None:
    """A table as the HTML shows it: formatted the same way, capped at ``P.TABLE_ROWS`` rows with the
    rest one click away, and all of it (numbers unformatted, ids in full) as a CSV download."""
    if len(df) <= P.TABLE_ROWS:
        st.dataframe(P.display(df), hide_index=True, width="stretch")
    else:
        st.dataframe(P.display(df.head(P.TABLE_ROWS)), hide_index=True, width="stretch")
        with st.expander(f"show all {len(df):,} rows"):
            st.dataframe(P.display(df), hide_index=True, width="stretch")
    download(df if csv is None else csv, name, key)


def cards(items, columns: int = 4, *, show_help: bool = False) -> None:
    """Metric cards; ``show_help`` prints each card's help under it (the answer's catch and price must
    be read, not found in a tooltip)."""
    cols = st.columns(columns)
    for i, (label, value, help_text) in enumerate(items):
        col = cols[i % columns]
        if show_help:
            col.metric(label, value)
            col.caption(help_text)
        else:
            col.metric(label, value, help=help_text)


def _round(t: datetime, step: timedelta, how) -> datetime:
    """Naive UTC ``t`` rounded (``math.floor`` or ``math.ceil``) to a whole ``step`` since the epoch."""
    s = step.total_seconds()
    return datetime.fromtimestamp(how(t.replace(tzinfo=UTC).timestamp() / s) * s, UTC).replace(tzinfo=None)


def filters(ext: A.Extent, rollups: bool) -> tuple[A.Scope, A.SummaryOptions, str]:
    sb = st.sidebar
    sb.title("Filters")
    start, end = ext.start.replace(tzinfo=None), ext.end.replace(tzinfo=None) + timedelta(seconds=1)
    span = end - start
    step = timedelta(minutes=1) if span <= timedelta(days=2) else timedelta(hours=1)
    if rollups:
        # Whole minutes (hours, for the coarse slider), so the range is one the rollups answer: on
        # the hour at both ends, or a summary of months would read minute rows instead of hourly ones.
        start, end = _round(start, step, math.floor), _round(end, step, math.ceil)
    # The whole history when rollups answer it in seconds; without them long histories open on their
    # last week (raw samples of months take minutes), and the slider widens it.
    first = max(start, end - DEFAULT_WINDOW) if span > 2 * DEFAULT_WINDOW and not rollups else start
    lo, hi = sb.slider(
        "Time range (UTC)",
        min_value=start,
        max_value=end,
        value=(first, end),
        step=step,
        format="YYYY-MM-DD HH:mm",
    )
    hosts = sb.multiselect("Hosts", ext.hosts, placeholder="all hosts")
    choices = [g for g in ext.gpus if not hosts or g.host in hosts]
    gpus = sb.multiselect("GPUs", choices, format_func=lambda g: g.label, placeholder="all GPUs")
    sb.divider()
    idle = sb.slider("Idle below utilization.gpu (%)", 0, 50, 5) / 100
    held = sb.number_input("Held: memory in use at least (GiB)", 0.0, 1024.0, 1.0, 0.5)
    tz = sb.text_input("Heatmap time zone", "UTC", help="IANA name, e.g. Europe/Berlin")
    scope = A.Scope(
        lo.replace(tzinfo=UTC), hi.replace(tzinfo=UTC), tuple(hosts), tuple(g.gpu_uuid for g in gpus)
    )
    return scope, A.SummaryOptions(idle_below=idle, held_mem_bytes=int(held * P.GIB)), tz


def pool_controls(options: A.SummaryOptions) -> A.PoolOptions:
    """The what-if's inputs, in the sidebar: the summary at the top answers with the same pool."""
    sb = st.sidebar
    sb.divider()
    sb.subheader("What-if pool")
    gran = sb.selectbox("Partitions per GPU", A.GRANULARITIES, index=len(A.GRANULARITIES) - 1)
    policy = sb.selectbox("Packing policy", A.POLICIES, index=A.POLICIES.index("best-fit"))
    demand = sb.selectbox(
        "Demand from",
        ["auto", "process", "gpu"],
        help="per-process rows, or each GPU's utilization and memory held; auto: processes where the "
        "telemetry has them, else GPUs",
    )
    price = sb.number_input(
        "Price per GPU-hour",
        0.0,
        1000.0,
        None,
        0.25,
        placeholder=f"{A.DEFAULT_PRICE:.2f} (default)",
        help="your price; empty: the default, and the page says so",
        key="price",
    )
    pool = sb.number_input("Pool size (0: the p95 need)", 0, 10_000, 0)
    memory = sb.number_input(
        "GPU memory (GiB)",
        1,
        4096,
        None,
        placeholder="from the telemetry",
        help="one pool GPU's memory; empty: memory.total in the telemetry, else inferred from the GPU model",
        key="gpu-memory",
    )
    return A.PoolOptions(
        granularity=gran,
        policy=policy,
        demand=demand,
        price_per_gpu_hour=price,
        pool_gpus=pool or None,
        gpu_mem_bytes=None if memory is None else int(memory * P.GIB),
        held_mem_bytes=options.held_mem_bytes,
        idle_below=options.idle_below,
    )


def _or_error(fn, *args):
    try:
        return fn(*args)
    except A.TelemetryError as exc:
        return exc


def main() -> None:
    st.set_page_config(page_title="gpupool audit", layout="wide")
    # A card's value wraps rather than ending in "…": the pool's catch is part of its value.
    st.markdown(
        "<style>[data-testid='stMetricValue'], [data-testid='stMetricValue'] * {white-space: normal "
        "!important; overflow: visible !important; text-overflow: clip !important;}</style>",
        unsafe_allow_html=True,
    )
    dirs = _dirs()
    if not dirs:
        st.error(f"No telemetry directory given. Start with: gpustat-report serve DIR (or set {DIRS_ENV}).")
        st.stop()
    try:
        t = Telemetry(dirs)
        ext = extent(dirs, t)
        if ext.start is None:
            raise A.TelemetryError("no GPU samples in " + ", ".join(dirs), "is the collector writing there?")
        scope, options, tz = filters(ext, has_rollups(dirs, t))
        opts = pool_controls(options)
        s = summary(dirs, scope, options, t)
    except A.TelemetryError as exc:
        st.error(f"{exc.title}. {exc.hint}")
        st.stop()

    st.title("GPU audit: how busy are the GPUs really?")
    st.caption(f"{', '.join(dirs)} · {scope.describe()} · generated {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    for note in notes(dirs, t):  # damaged segments left out, hosts without rollups, clocks stepped back
        st.warning(note)
    if s.simulated:
        st.error(
            f"**{P.SIMULATED_LABEL}** — {P.pct(s.simulated_share)} of these GPU-hours come from gpupool's "
            "simulated fleet, not real GPUs. Do not draw conclusions about your hardware from them.",
            icon="⚠️",
        )

    # The answer first: how busy, who holds them idle, what a pool would need and save.
    gpu_minutes = s.gpus * (s.last_sample - s.first_sample).total_seconds() / 60
    auto = float(os.environ.get(WHATIF_AUTO_ENV, WHATIF_AUTO_GPU_MINUTES))
    replay = gpu_minutes <= auto or st.session_state.get("replay", False)
    if replay:
        w = _or_error(whatif, dirs, scope, opts, t, s)
    else:
        w = A.TelemetryError(
            "not replayed yet",
            f"{gpu_minutes / 1e6:,.0f} M GPU-minutes: press 'Replay the demand' in the what-if section",
        )
    by_user = _or_error(attribution, dirs, scope, "user", options, t)
    with st.container(border=True):
        section("Summary", s.simulated)
        cards(P.answer(s, by_user, w, P.APP_HINTS), show_help=True)
        for line in P.findings(s):
            st.markdown(f"- {line}")
    st.subheader("The fleet in numbers")
    cards(P.headline(s))
    st.subheader("Sampling")
    st.markdown(P.sampling_note(s))
    if (warning := P.coarse_warning(s)) is not None:
        st.warning(warning)
    st.dataframe(P.sampling_table(s), hide_index=True)

    section("What-if: a pool of fractional GPUs", s.simulated)
    if not replay:
        st.info(
            f"The range holds {gpu_minutes / 1e6:,.0f} M GPU-minutes: the replay at minute resolution "
            "reads each of them (about half a minute for 512 GPUs over 90 days on two cores), so it runs "
            "when asked. It then stays for the session, and follows the filters."
        )
        st.button(
            "Replay the demand", key="replay-button", on_click=lambda: st.session_state.update(replay=True)
        )
    elif isinstance(w, A.TelemetryError):
        st.info(f"{w.title}. {w.hint}")
    else:
        st.markdown(P.whatif_headline(w))
        m = st.columns(4)
        m[0].metric("GPUs needed (p95 / p99)", f"{w.gpus_needed_p95} / {w.gpus_needed_p99}")
        m[1].metric(
            "GPUs observed",
            w.observed_gpus,
            delta=f"{-w.gpus_saved:+d} with a pool of {w.pool_gpus}",
            delta_color="inverse",
        )
        m[2].metric(
            "pooled GPUs busy",
            P.pct(w.pooled_util_mean),
            help="compute shared among tenants, capped at 100 %",
        )
        m[3].metric("requests that waited", P.pct(w.waited_share))
        st.plotly_chart(P.fig_need(w))
        rows = P.whatif_rows(w, P.APP_HINTS)
        st.table({"": [k for k, _ in rows], "value": [v for _, v in rows]})
        st.markdown("**Assumptions**\n" + "\n".join(f"- {a}" for a in w.assumptions))

    section("Who holds the GPUs", s.simulated)
    # One breakdown at a time: each is a pass over the process rows, so only the chosen one is computed.
    by = st.radio("Per", ["user", "process", "container"], horizontal=True, format_func=lambda b: f"per {b}")
    try:
        a = attribution(dirs, scope, by, options, t)
    except A.TelemetryError as exc:
        st.info(f"{exc.title}. {exc.hint}")
    else:
        st.plotly_chart(P.fig_attribution(a), key=f"attr-{by}")
        st.caption(P.attribution_note(a, s))
        table(
            P.attribution_table(a),
            f"attribution-{by}",
            f"dl-attr-{by}",
            P.attribution_table(a, full_keys=True),
        )

    section("Utilization over time", s.simulated)
    try:
        pat = patterns(dirs, scope, tz, t)
    except A.TelemetryError:  # an unknown time zone: the heatmap below says so
        pat = None
    st.plotly_chart(P.fig_timeline(pat.timeline if pat else timeline(dirs, scope, t)))

    section("When: hour of week", s.simulated)
    c1, c2 = st.columns([1, 1])
    level = c1.radio("Heatmap per", ["fleet", "host", "gpu"], horizontal=True)
    metric = c2.radio("Metric", ["utilization.gpu", "SM activity"], horizontal=True)
    try:
        grids = pat.heatmap if pat and level == "fleet" else heatmaps(dirs, scope, level, tz, t)
    except A.TelemetryError as exc:
        st.error(f"{exc.title}. {exc.hint}")
        grids = []
    if len(grids) > 1:
        pick = st.selectbox("Show", [g.key for g in grids])
        grids = [g for g in grids if g.key == pick]
    for g in grids:
        st.plotly_chart(P.fig_heatmap(g, "util" if metric == "utilization.gpu" else "sm"))
    st.subheader("Busiest and idlest hours")
    ranked = pat.periods if pat else periods(dirs, scope, t)
    st.caption(P.periods_note(ranked))
    table(P.periods_table(ranked), "periods", "dl-periods")

    section("Distribution", s.simulated)
    st.plotly_chart(P.fig_distribution(s))

    activity = pool_activity(dirs, scope, t)
    if not activity.empty:  # only once gpupool-server runs and writes its lease events
        section("Pool activity", activity.simulated)
        st.markdown(P.pool_summary(activity))
        table(P.pool_table(activity), "pool-clients", "dl-pool")
        jobs = pool_jobs(dirs, scope, "job", t)
        if any(u.job_id for u in jobs):  # leases taken by a scheduler integration (deploy/slurm)
            st.subheader("Batch jobs: GPU-hours per account and per job")
            table(
                P.jobs_table(pool_jobs(dirs, scope, "account", t), "account"), "pool-accounts", "dl-accounts"
            )
            table(P.jobs_table(jobs, "job"), "pool-jobs", "dl-jobs")

    section("Per GPU", s.simulated)
    table(P.per_gpu_table(s), "per-gpu", "dl-gpus", P.per_gpu_table(s, full=True))


if __name__ == "__main__":  # streamlit runs the script as __main__; importing it draws nothing
    main()
