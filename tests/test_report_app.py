"""The Streamlit report, driven headless through streamlit.testing.v1.AppTest."""

from __future__ import annotations

import html
from datetime import timedelta
from pathlib import Path

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest
from test_analytics_data import GIB, gpu_rows, process_rows, write_rows

from collector import build_rollups
from reports.app import DIRS_ENV, WHATIF_AUTO_ENV

APP = str(Path(__file__).resolve().parent.parent / "reports" / "app.py")


@pytest.fixture(scope="module")
def sim_dir(tmp_path_factory):
    from test_analytics_data import generated_fleet

    return generated_fleet(tmp_path_factory.mktemp("sim"))


@pytest.fixture
def real_dir(tmp_path):
    # Two real (not simulated) GPUs on one host, 10 minutes at 10 s, one process each.
    rows = gpu_rows("node-1", 0, [0.5] * 60, tick_s=10, mem_used=20 * GIB, sm=[0.2] * 60)
    rows += gpu_rows("node-1", 1, [0.0] * 60, tick_s=10, mem_used=10 * GIB)
    procs = process_rows("node-1", 0, 1, range(60), mem=20 * GIB, sm_util=0.5, user="alice", tick_s=10)
    procs += process_rows("node-1", 1, 2, range(60), mem=10 * GIB, sm_util=0.0, user="bob", tick_s=10)
    write_rows(tmp_path, "gpu_samples", rows)
    write_rows(tmp_path, "process_samples", procs)
    return tmp_path


def _run(monkeypatch, *dirs) -> AppTest:
    monkeypatch.setenv(DIRS_ENV, ":".join(str(d) for d in dirs))
    at = AppTest.from_file(APP, default_timeout=60)
    return at.run()


def _metrics(at) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def test_real_data_page_lays_out_every_section(monkeypatch, real_dir):
    at = _run(monkeypatch, real_dir)
    assert not at.exception
    headers = [h.value for h in at.header]
    assert headers == [
        "Summary",  # the answer first, then its details, then when and how
        "What-if: a pool of fractional GPUs",
        "Who holds the GPUs",
        "Utilization over time",
        "When: hour of week",
        "Distribution",
        "Per GPU",
    ]
    m = _metrics(at)
    assert m["GPUs"] == "2 on 1 host"
    assert m["utilization.gpu mean"] == "25.0 %"  # 50 % and 0 %, equal time
    assert m["SM activity mean"] == "20.0 %"
    assert m["held but idle · 50.0 %"] == "0.2 h"  # GPU 1: 10 min idle holding 10 GiB
    assert m["GPUs needed (p95 / p99)"] == "1 / 1"  # 20 + 10 GiB fit one 80 GiB GPU
    assert not any("SIMULATED" in e.value for e in at.error)
    assert len(at.get("plotly_chart")) >= 5
    assert "Download periods (CSV)" in [d.label for d in at.get("download_button")]


def test_a_large_range_replays_the_what_if_when_asked(monkeypatch, real_dir):
    # Above the GPU-minutes the what-if replays on its own (set low here), the page opens with
    # everything else and a button; pressed, the replay answers and stays for the session.
    monkeypatch.setenv(WHATIF_AUTO_ENV, "1")
    at = _run(monkeypatch, real_dir)
    assert not at.exception
    m = _metrics(at)
    assert m["A pool would need"] == "not computed" and "GPUs needed (p95 / p99)" not in m
    assert any("GPU-minutes" in i.value for i in at.info)
    at.button(key="replay-button").click().run()
    assert not at.exception
    assert _metrics(at)["GPUs needed (p95 / p99)"] == "1 / 1"
    at.sidebar.slider[1].set_value(10).run()  # another idle threshold: the replay follows
    assert _metrics(at)["GPUs needed (p95 / p99)"] == "1 / 1"


def test_simulated_data_is_labelled_on_every_section(monkeypatch, sim_dir):
    at = _run(monkeypatch, sim_dir)
    assert not at.exception
    assert any("SIMULATED DATA" in e.value for e in at.error)
    assert at.header and all("SIMULATED DATA" in h.value for h in at.header)
    assert _metrics(at)["GPUs"] == "8 on 2 hosts"


def test_filters_and_whatif_controls_recompute(monkeypatch, sim_dir):
    at = _run(monkeypatch, sim_dir)
    at.sidebar.multiselect[0].set_value(["gpu-node-01"]).run()
    assert not at.exception
    assert _metrics(at)["GPUs"] == "4 on 1 host"
    needed_fine = _metrics(at)["GPUs needed (p95 / p99)"]
    [gran] = [s for s in at.selectbox if s.label == "Partitions per GPU"]
    gran.set_value(1).run()
    assert not at.exception
    needed_whole = _metrics(at)["GPUs needed (p95 / p99)"]
    # Whole GPUs per request can only need as many GPUs or more than 1/20 partitions.
    assert int(needed_whole.split(" / ")[0]) >= int(needed_fine.split(" / ")[0])
    assert "1/1 partitions" in " ".join(str(t.value) for t in at.table)


def test_empty_directory_shows_one_clear_error(monkeypatch, tmp_path):
    at = _run(monkeypatch, tmp_path)
    assert not at.exception
    assert [e.value for e in at.error] == [
        f"no telemetry found in {tmp_path}. is the collector writing there? gpustat-collect --out DIR"
    ]


def test_no_directory_configured(monkeypatch):
    monkeypatch.delenv(DIRS_ENV, raising=False)
    at = AppTest.from_file(APP, default_timeout=30).run()
    assert not at.exception
    assert "No telemetry directory given" in at.error[0].value


def test_attribution_breakdown_switches(monkeypatch, real_dir):
    at = _run(monkeypatch, real_dir)
    [per] = [r for r in at.radio if r.label == "Per"]
    assert per.value == "user"
    users = next(d for d in at.dataframe if "user" in d.value.columns).value
    assert list(users["user"]) == ["alice", "bob"]
    assert list(users["idle holding h"]) == ["0.0", "0.2"]  # bob idles 10 min, shown as the HTML does
    per.set_value("container").run()
    assert not at.exception
    containers = next(d for d in at.dataframe if "container" in d.value.columns).value
    assert list(containers["container"]) == ["(no container)"]


def test_long_history_opens_on_its_last_week(monkeypatch, tmp_path):
    from datetime import timedelta

    from test_analytics_data import T0

    rows = gpu_rows("n", 0, [0.9] * 10, tick_s=60) + gpu_rows(
        "n", 0, [0.1] * 10, tick_s=60, start=T0 + timedelta(days=30)
    )
    write_rows(tmp_path, "gpu_samples", rows)
    at = _run(monkeypatch, tmp_path)
    assert not at.exception
    lo, hi = at.sidebar.slider[0].value
    assert hi - lo == timedelta(days=7)
    assert _metrics(at)["utilization.gpu mean"] == "10.0 %"  # only the last week's samples
    at.sidebar.slider[0].set_range(T0.replace(tzinfo=None), hi).run()
    assert _metrics(at)["utilization.gpu mean"] == "50.0 %"  # widened to all of it


def test_long_history_with_rollups_opens_on_all_of_it_from_the_rollups(monkeypatch, tmp_path):
    from datetime import timedelta

    from test_analytics_data import T0

    rows = gpu_rows("n", 0, [0.9] * 30, tick_s=60) + gpu_rows(
        "n", 0, [0.1] * 30, tick_s=60, start=T0 + timedelta(days=30)
    )
    write_rows(tmp_path, "gpu_samples", rows)
    build_rollups(tmp_path, lag_s=0)
    st.cache_data.clear()
    at = _run(monkeypatch, tmp_path)
    assert not at.exception
    lo, hi = at.sidebar.slider[0].value
    assert lo <= T0.replace(tzinfo=None) and hi - lo > timedelta(days=30)  # the whole history
    assert _metrics(at)["utilization.gpu mean"] == "50.0 %"
    assert any("rollups" in m.value for m in at.markdown)  # the sampling note says what it read


def test_pool_activity_appears_once_the_pool_writes_events(monkeypatch, real_dir):
    from datetime import timedelta

    from test_analytics_data import T0

    at = _run(monkeypatch, real_dir)
    assert "Pool activity" not in [h.value for h in at.header]  # before adoption: no such section
    rows = [
        {
            "host": "node-1",
            "ts": T0,
            "event": "grant",
            "lease_id": "L1",
            "client": "ci-runner",
            "fraction": 0.5,
        },
        {
            "host": "node-1",
            "ts": T0 + timedelta(minutes=6),  # inside the 10 minutes of samples the page shows
            "event": "reclaim",
            "lease_id": "L1",
            "client": "ci-runner",
            "fraction": 0.5,
            "duration_s": 360.0,
        },
    ]
    write_rows(real_dir, "pool_events", rows)
    st.cache_data.clear()  # the app caches for a minute; a test does not wait that long
    at = _run(monkeypatch, real_dir)
    assert not at.exception
    assert "Pool activity" in [h.value for h in at.header]
    assert any("1 reclaimed for idleness" in m.value for m in at.markdown), [m.value for m in at.markdown]
    table = next(d for d in at.dataframe if "client" in d.value.columns).value
    assert table.iloc[0]["GPU-hours leased"] == "0.05"  # half a GPU for 6 minutes
    assert not any("account" in d.value.columns for d in at.dataframe)  # no batch job's lease yet


def test_batch_jobs_gpu_hours_per_account_and_job_in_the_app_and_the_html(monkeypatch, real_dir):
    """Leases a scheduler took for its jobs (pool_events with job fields, as deploy/slurm writes them):
    the app and the HTML page show GPU-hours per account and per job beside the pool's clients."""
    from datetime import timedelta

    from test_analytics_data import T0

    from reports._html import BuildOptions, build_html

    job = {"job_scheduler": "slurm/hpc", "job_id": "4242", "job_account": "physics", "job_user": "ana"}
    base = {"host": "node-1", "lease_id": "L7", "client": "slurm", "fraction": 0.5, **job}
    rows = [
        {**base, "ts": T0, "event": "grant"},
        {**base, "ts": T0 + timedelta(minutes=6), "event": "release", "duration_s": 360.0},
    ]
    write_rows(real_dir, "pool_events", rows)
    st.cache_data.clear()
    at = _run(monkeypatch, real_dir)
    assert not at.exception
    accounts = next(d for d in at.dataframe if d.value.columns[0] == "account").value
    assert accounts.iloc[0]["account"] == "physics" and accounts.iloc[0]["GPU-hours leased"] == "0.05"
    jobs = next(d for d in at.dataframe if "job" in d.value.columns).value
    assert jobs.iloc[0]["job"] == "slurm/hpc:4242" and jobs.iloc[0]["user"] == "ana"
    page = build_html([str(real_dir)], BuildOptions(scope=_app_scope(real_dir)))
    assert "pool-accounts.csv" in page and "slurm/hpc:4242" in page and "physics" in page


def test_app_and_html_agree_on_sampling_and_the_pooling_answer_without_process_rows(monkeypatch, tmp_path):
    # An nvidia-smi-like log: 57 s sampling with a gap, no process rows.
    from test_analytics_data import T0

    from reports import _present as P
    from reports._html import BuildOptions, build_html

    rows = gpu_rows("node-1", 0, [0.9] * 30, tick_s=57, mem_used=30 * GIB)
    rows += gpu_rows("node-1", 0, [0.9] * 30, tick_s=57, mem_used=30 * GIB, start=T0 + timedelta(hours=3))
    rows += gpu_rows("node-1", 1, [0.0] * 60, tick_s=57, mem_used=10 * GIB)
    write_rows(tmp_path, "gpu_samples", rows)
    at = _run(monkeypatch, tmp_path)
    assert not at.exception
    page = build_html([str(tmp_path)], BuildOptions(scope=_app_scope(tmp_path)))
    markdown = " ".join(m.value for m in at.markdown)
    warnings = " ".join(w.value for w in at.warning)
    assert "Coarse sampling on 1 of 1 hosts" in warnings and "Coarse sampling on 1 of 1 hosts" in page
    import analytics as A

    con = A.open_telemetry(tmp_path)
    s = A.fleet_summary(con, _app_scope(tmp_path))
    w = A.what_if(con, _app_scope(tmp_path))
    assert w.demand == "gpu"
    for text in (P.sampling_note(s), P.whatif_headline(w)):
        assert text in markdown
        assert html.escape(text) in page
    assert s.gpu_hours * 3600 == pytest.approx(120 * 57)  # gaps not counted


def _app_scope(root):
    # The app opens on the whole span (short histories): the same scope as the HTML export's.
    import analytics as A

    ext = A.data_extent(A.open_telemetry(root))
    return A.Scope(ext.start.replace(second=0, microsecond=0), ext.end + timedelta(seconds=1))


def test_the_price_and_the_gpu_memory_are_the_users(monkeypatch, real_dir):
    """The saving is priced at the default until the user sets a price, and the card says which; the
    GPU memory field sets the pool GPU's size the what-if cuts into partitions."""
    at = _run(monkeypatch, real_dir)
    assert not at.exception
    captions = " ".join(c.value for c in at.caption)
    assert "2.50 USD per GPU-hour (default; set it in the sidebar)" in captions
    assert "of GPU use cost" in captions  # the baseline is what was used
    at.number_input(key="price").set_value(3.0).run()
    captions = " ".join(c.value for c in at.caption)
    assert "3.00 USD per GPU-hour (your price)" in captions
    at.number_input(key="gpu-memory").set_value(16).run()
    assert not at.exception
    rows = at.table[0].value
    assert "16.0 GiB (as given)" in rows.to_string()
    assert _metrics(at)["GPUs needed (p95 / p99)"] == "2 / 2"  # 20 + 10 GiB no longer fit one GPU
