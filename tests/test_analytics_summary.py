"""Fleet summary and errors, against hand-computed expectations on small constructed telemetry."""

from __future__ import annotations

from datetime import timedelta

import pyarrow.parquet as pq
import pytest
from test_analytics_data import GIB, T0, gpu_rows, write_rows

import analytics as A

H = 3600.0


@pytest.fixture
def two_gpus(tmp_path):
    # GPU a0: 1 s ticks, 4 samples; GPM on three of them; 2 GiB held on the first two.
    # GPU b0: 10 s ticks, 3 samples at 20 % with no GPM and no memory in use.
    rows = gpu_rows("a", 0, [0.0, 0.5, 1.0, 0.0], mem_used=[2 * GIB, 2 * GIB, 0, 0], sm=[0.0, 0.1, 0.2, None])
    rows += gpu_rows("b", 0, [0.2, 0.2, 0.2], tick_s=10)
    write_rows(tmp_path, "gpu_samples", rows)
    return A.open_telemetry(tmp_path)


def test_gpu_hours_use_each_gpus_own_tick(two_gpus):
    s = A.fleet_summary(two_gpus)
    assert (s.gpus, s.hosts) == (2, 2)
    # 4 samples x 1 s + 3 samples x 10 s = 34 s.
    assert s.gpu_hours == pytest.approx(34 / H)
    assert [(g.host, g.gpu_index, g.gpu_name) for g in s.per_gpu] == [
        ("a", 0, "NVIDIA H100 80GB HBM3"),
        ("b", 0, "NVIDIA H100 80GB HBM3"),
    ]
    ticks = {g.host: g.tick_s for g in s.per_gpu}
    assert ticks == {"a": pytest.approx(1.0), "b": pytest.approx(10.0)}


def test_utilization_is_time_weighted_with_nearest_rank_percentiles(two_gpus):
    s = A.fleet_summary(two_gpus)
    # (0 + 0.5 + 1 + 0) x 1 s + 0.2 x 30 s = 7.5 over 34 s.
    assert s.util_gpu_mean == pytest.approx(7.5 / 34)
    # Weights: 0 -> 2 s, 0.2 -> 30 s, 0.5 -> 1 s, 1.0 -> 1 s. Cumulative 2, 32 (94 %), 33 (97 %), 34.
    assert s.util_gpu_p50 == pytest.approx(0.2)
    assert s.util_gpu_p95 == pytest.approx(0.5)


def test_sm_activity_only_where_gpm_exists_and_compared_on_the_same_samples(two_gpus):
    s = A.fleet_summary(two_gpus)
    assert s.gpm_gpu_hours == pytest.approx(3 / H)
    assert s.sm_activity_mean == pytest.approx(0.1)
    assert s.sm_activity_p50 == pytest.approx(0.1)
    assert s.sm_activity_p95 == pytest.approx(0.2)
    # utilization.gpu on those same three samples: (0 + 0.5 + 1) / 3.
    assert s.util_gpu_mean_where_gpm == pytest.approx(0.5)


def test_idle_and_held_but_idle_hours(two_gpus):
    s = A.fleet_summary(two_gpus)
    # Idle (< 5 %): a0's first and last samples. Held but idle: only the first (2 GiB in use).
    assert s.idle_gpu_hours == pytest.approx(2 / H)
    assert s.held_idle_gpu_hours == pytest.approx(1 / H)
    strict = A.fleet_summary(two_gpus, options=A.SummaryOptions(idle_below=0.25, held_mem_bytes=3 * GIB))
    # Now b0's 20 % counts as idle too; nothing holds 3 GiB.
    assert strict.idle_gpu_hours == pytest.approx(32 / H)
    assert strict.held_idle_gpu_hours == 0


def test_memory_headroom(two_gpus):
    s = A.fleet_summary(two_gpus)
    # Used ratio: 2/80 on 2 s of a0, 0 elsewhere -> (0.025 x 2) / 34; the fullest GPU was 2.5 % full.
    assert s.mem_used_ratio_mean == pytest.approx(0.025 * 2 / 34)
    assert s.mem_used_ratio_peak == pytest.approx(0.025)
    assert s.mem_headroom_bytes_mean == pytest.approx((80 * GIB * 34 - 2 * GIB * 2) / 34)
    assert s.mem_total_bytes == 160 * GIB


def test_a_gap_in_collection_is_not_counted_as_observed(tmp_path):
    rows = gpu_rows("a", 0, [0.5] * 10) + gpu_rows("a", 0, [0.5] * 10, start=T0 + timedelta(hours=2))
    write_rows(tmp_path, "gpu_samples", rows)
    s = A.fleet_summary(A.open_telemetry(tmp_path))
    assert s.gpu_hours == pytest.approx(20 / H)  # not the 2 h between first and last sample
    assert s.per_gpu[0].tick_s == pytest.approx(1.0)


def test_scope_filters_time_hosts_and_gpus(two_gpus):
    first_two_seconds = A.Scope(T0, T0 + timedelta(seconds=2))
    s = A.fleet_summary(two_gpus, first_two_seconds)
    # a0's samples at 0 s and 1 s, b0's at 0 s; the tick comes from the scope, b0's single sample
    # borrows the fleet median.
    assert s.gpus == 2
    assert s.util_gpu_mean == pytest.approx((0.0 + 0.5 + 0.2) / 3)
    only_b = A.fleet_summary(two_gpus, A.Scope(hosts=("b",)))
    assert (only_b.gpus, only_b.util_gpu_mean) == (1, pytest.approx(0.2))
    only_a0 = A.fleet_summary(two_gpus, A.Scope(gpus=("GPU-a-0",)))
    assert only_a0.gpu_hours == pytest.approx(4 / H)


def test_simulated_rows_are_flagged(tmp_path):
    rows = gpu_rows("real", 0, [0.1] * 3) + gpu_rows("sim", 0, [0.1] * 3, simulated=True)
    write_rows(tmp_path, "gpu_samples", rows)
    con = A.open_telemetry(tmp_path)
    s = A.fleet_summary(con)
    assert s.simulated and s.simulated_share == pytest.approx(0.5)
    assert not A.fleet_summary(con, A.Scope(hosts=("real",))).simulated
    assert A.data_extent(con).simulated


def test_extent_lists_hosts_gpus_and_span(two_gpus):
    ext = A.data_extent(two_gpus)
    assert ext.hosts == ("a", "b")
    assert [g.label for g in ext.gpus] == [
        "a / GPU 0 (NVIDIA H100 80GB HBM3)",
        "b / GPU 0 (NVIDIA H100 80GB HBM3)",
    ]
    assert ext.start == T0 and ext.end == T0 + timedelta(seconds=20)
    assert not ext.simulated


def test_range_with_no_data_says_what_the_data_holds(two_gpus):
    later = A.Scope(T0 + timedelta(days=3), T0 + timedelta(days=4))
    with pytest.raises(A.TelemetryError) as err:
        A.fleet_summary(two_gpus, later)
    assert "no gpu_samples rows" in err.value.title
    assert "2026-03-02 09:00" in err.value.hint


def test_missing_and_empty_directories(tmp_path):
    with pytest.raises(A.TelemetryError, match="not found"):
        A.open_telemetry(tmp_path / "nope")
    with pytest.raises(A.TelemetryError, match="no telemetry found"):
        A.open_telemetry(tmp_path)


def test_mixed_schema_versions_are_refused(tmp_path):
    write_rows(tmp_path, "gpu_samples", gpu_rows("a", 0, [0.1]))
    write_rows(tmp_path, "gpu_samples", gpu_rows("b", 0, [0.1]), version=2)
    with pytest.raises(A.TelemetryError, match=r"schema version \[1, 2\]"):
        A.open_telemetry(tmp_path)


def test_a_sample_stamped_at_midnight_in_the_previous_days_segment_is_kept(tmp_path):
    # The tick that closes a day is stamped 00:00 of the next day but written with the day it closes.
    midnight = T0.replace(hour=0) + timedelta(days=1)
    rows = gpu_rows("a", 0, [0.5] * 3, start=midnight - timedelta(seconds=2))
    rows[-1]["_date"] = (midnight - timedelta(days=1)).date()
    rows += gpu_rows("a", 0, [0.5] * 2, start=midnight + timedelta(seconds=1))
    write_rows(tmp_path, "gpu_samples", rows)
    s = A.fleet_summary(A.open_telemetry(tmp_path), A.Scope(start=midnight))
    assert s.first_sample == midnight
    assert s.gpu_hours == pytest.approx(3 / H)


def test_segments_of_another_column_layout_are_read_by_name_and_rows_counted_from_footers(tmp_path):
    # One layout: read by position; a segment without a column (an older collector) among them: by
    # name, its missing column null. The extent's row counts come from the footers, new segments included.
    write_rows(tmp_path, "gpu_samples", gpu_rows("a", 0, [0.5] * 60))
    con = A.open_telemetry(tmp_path)
    assert A.data_extent(con).gpu_rows == 60
    write_rows(tmp_path, "gpu_samples", gpu_rows("a", 0, [0.25] * 30, start=T0 + timedelta(minutes=5)))
    assert A.data_extent(con).gpu_rows == 90  # written after the open
    folder = next((tmp_path / "gpu_samples").glob("date=*/host=a"))
    old = pq.read_table(next(folder.glob("*.parquet")), partitioning=None).drop_columns(["sm_activity"])
    pq.write_table(old.slice(0, 10), folder / "old-layout.parquet")
    con = A.open_telemetry(tmp_path)
    assert con.execute("SELECT count(*), count(sm_activity) FROM gpu_samples").fetchall() == [(100, 0)]
    assert A.data_extent(con).gpu_rows == 100


def test_rows_recorded_inside_a_lease_are_not_counted_as_physical_gpus(tmp_path):
    """A collector run inside a gpupool lease records the lease's slice of a pool GPU (source 'lease',
    the physical GPU's UUID, the partition as memory total) and its processes: the fleet summary, the
    data extent, the what-if and the process rows count the physical GPUs only, and the lease's rows
    stay readable in ``lease_samples``."""
    rows = gpu_rows("gpuhost", 0, [0.5] * 4, mem_used=10 * GIB)
    # the same GPU seen from a client machine's lease: a quarter of it, busier, another host name
    rows += gpu_rows("client", 0, [0.9] * 4, mem_used=5 * GIB, mem_total=20 * GIB, source="lease",
                     gpu_uuid="GPU-gpuhost-0")  # fmt: skip
    write_rows(tmp_path, "gpu_samples", rows)
    procs = [{"host": h, "ts": T0, "gpu_index": 0, "gpu_uuid": "GPU-gpuhost-0", "pid": pid, "mem_used_bytes": GIB}
             for h, pid in (("gpuhost", 11), ("client", 22))]  # fmt: skip
    write_rows(tmp_path, "process_samples", procs)
    con = A.open_telemetry(tmp_path)
    s = A.fleet_summary(con)
    assert (s.gpus, s.hosts) == (1, 1)
    assert con.execute("SELECT list(pid) FROM process_samples").fetchone()[0] == [11]
    assert [g.host for g in s.per_gpu] == ["gpuhost"]
    assert s.gpu_hours == pytest.approx(4 / H)
    assert A.data_extent(con).hosts == ("gpuhost",)
    assert A.what_if(con).observed_gpus == 1
    lease = con.execute("SELECT DISTINCT host, mem_total_bytes FROM lease_samples").fetchall()
    assert lease == [("client", 20 * GIB)]


def test_a_local_lease_on_the_gpu_host_keeps_the_hosts_own_process_rows(tmp_path):
    """A collector inside a --local lease writes under the GPU host's own name and GPU: its rows are
    still not a second GPU, and the host's own process rows of that GPU stay counted."""
    rows = gpu_rows("gpuhost", 0, [0.5] * 4) + gpu_rows(
        "gpuhost", 0, [0.9] * 4, source="lease", mem_total=20 * GIB
    )
    write_rows(tmp_path, "gpu_samples", rows)
    write_rows(tmp_path, "process_samples", [{"host": "gpuhost", "ts": T0, "gpu_index": 0,
                                              "gpu_uuid": "GPU-gpuhost-0", "pid": 11, "mem_used_bytes": GIB}])  # fmt: skip
    con = A.open_telemetry(tmp_path)
    s = A.fleet_summary(con)
    assert s.gpus == 1 and s.gpu_hours == pytest.approx(4 / H)
    assert con.execute("SELECT list(pid) FROM process_samples").fetchone()[0] == [11]
