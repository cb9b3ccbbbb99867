"""analytics.live: the console's telemetry queries over real Parquet segments and DuckDB."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import pyarrow.parquet as pq
import pytest
from test_live_fixtures import GIB, T0, gpu_row, proc_row, write_fleet, write_segment

from analytics import open_telemetry
from analytics.live import LiveWindow, gpu_processes, gpu_series, latest_gpu_samples, newest_sample_time
from collector.schema import GPU_SAMPLES, PROCESS_SAMPLES


@pytest.fixture
def fleet(tmp_path):
    return open_telemetry(write_fleet(tmp_path / "tele"))


def test_newest_sample_time_is_the_last_tick_not_the_clock(fleet):
    assert newest_sample_time(fleet) == T0


def test_latest_sample_per_gpu_sorted_by_host_and_index(fleet):
    gpus = latest_gpu_samples(fleet)
    assert [(g.host, g.gpu_index) for g in gpus] == [("gpu-a", 0), ("gpu-a", 1), ("gpu-b", 0)]
    a0 = gpus[0]
    assert a0.ts == T0
    assert a0.util_gpu == pytest.approx(0.95)  # the end of the ramp, not its mean
    assert a0.sm_activity == pytest.approx(0.57)
    assert a0.mem_total_bytes == 80 * GIB
    assert gpus[1].mem_used_bytes == 30 * GIB and gpus[1].util_gpu == 0.0
    assert all(g.simulated for g in gpus)


def test_a_gpu_silent_longer_than_the_lookback_drops_out(tmp_path):
    root = write_fleet(tmp_path / "tele")
    write_segment(root, GPU_SAMPLES, [gpu_row("old-host", 0, T0 - timedelta(days=3), 0.5)], name="old")
    con = open_telemetry(root)
    assert "old-host" not in {g.host for g in latest_gpu_samples(con)}
    assert "old-host" in {g.host for g in latest_gpu_samples(con, lookback=timedelta(days=4))}


def test_new_segments_show_up_on_the_next_query(tmp_path):
    root = write_fleet(tmp_path / "tele")
    con = open_telemetry(root)
    later = T0 + timedelta(seconds=10)
    write_segment(root, GPU_SAMPLES, [gpu_row("gpu-a", 0, later, 0.25)], name="seg-0002")
    assert newest_sample_time(con) == later
    a0 = next(g for g in latest_gpu_samples(con) if g.host == "gpu-a" and g.gpu_index == 0)
    assert a0.util_gpu == pytest.approx(0.25)


def test_series_buckets_the_last_minutes_and_keeps_gaps(fleet):
    series = gpu_series(fleet, "util_gpu_mean", minutes=10, buckets=10)
    ramp = series[("gpu-a", "GPU-gpu-a-0")]
    assert len(ramp) == 10
    assert ramp == sorted(ramp) and ramp[0] < 0.25 and ramp[-1] > 0.85  # rising, as written
    assert series[("gpu-a", "GPU-gpu-a-1")] == [0.0] * 10
    # A window longer than the data: the older slices are gaps (None), not zeros.
    long = gpu_series(fleet, "util_gpu_mean", minutes=20, buckets=4)[("gpu-a", "GPU-gpu-a-0")]
    assert long[0] is None and long[-1] is not None


def test_series_refuses_columns_outside_the_list(fleet):
    with pytest.raises(ValueError, match="unknown series column"):
        gpu_series(fleet, "util_gpu_mean; DROP VIEW gpu_samples")


def test_processes_of_one_gpu_at_its_newest_tick_largest_first(fleet):
    procs = gpu_processes(fleet, "gpu-a", "GPU-gpu-a-0")
    assert [(p.pid, p.user) for p in procs] == [(4242, "alice"), (4243, "alice")]
    assert procs[0].container_id == "c0ffee123456" and procs[0].mem_used_bytes == 60 * GIB
    assert all(p.ts == T0 for p in procs)
    assert [p.user for p in gpu_processes(fleet, "gpu-b", "GPU-gpu-b-0")] == ["carol"]


def test_processes_that_ended_are_not_shown(tmp_path):
    root = write_fleet(tmp_path / "tele")
    # The GPU keeps reporting for another minute, its process does not: it ended.
    later = [gpu_row("gpu-b", 0, T0 + timedelta(seconds=s), 0.0) for s in range(10, 70, 10)]
    write_segment(root, GPU_SAMPLES, later, name="seg-0002")
    con = open_telemetry(root)
    assert gpu_processes(con, "gpu-b", "GPU-gpu-b-0") == []
    assert [p.pid for p in gpu_processes(con, "gpu-a", "GPU-gpu-a-1")] == [5151]


def test_empty_telemetry_gives_empty_answers(tmp_path):
    (tmp_path / "empty").mkdir()
    con = open_telemetry(tmp_path / "empty", require_data=False)
    assert newest_sample_time(con) is None
    assert latest_gpu_samples(con) == []
    assert gpu_series(con) == {}
    assert gpu_processes(con, "h", "u") == []


def test_processes_only_table_without_gpu_rows_still_answers(tmp_path):
    root = tmp_path / "tele"
    write_segment(root, PROCESS_SAMPLES, [proc_row("h", 0, T0, 1, "dave", 1)])
    con = open_telemetry(root)
    assert gpu_processes(con, "h", "GPU-h-0", at=T0) != []


# LiveWindow: the console's incremental tail of the newest segments ----------------------------------


def _count(con, table: str) -> int:
    return con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def test_live_window_answers_like_the_full_views(tmp_path):
    root = write_fleet(tmp_path / "tele")
    tail = LiveWindow(root, timedelta(minutes=15))
    assert tail.poll() == 4  # 2 hosts x (gpu_samples, process_samples)
    assert latest_gpu_samples(tail.con) == latest_gpu_samples(open_telemetry(root))
    assert gpu_processes(tail.con, "gpu-a", "GPU-gpu-a-0") == gpu_processes(
        open_telemetry(root), "gpu-a", "GPU-gpu-a-0"
    )
    assert gpu_series(tail.con, minutes=10, buckets=5) == gpu_series(
        open_telemetry(root), minutes=10, buckets=5
    )


def test_live_window_reads_only_new_segments_and_keeps_its_window(tmp_path):
    root = write_fleet(tmp_path / "tele", minutes=30)
    tail = LiveWindow(root, timedelta(minutes=5))
    tail.poll()
    assert _count(tail.con, "gpu_samples") == 3 * 31  # 5 minutes of 10 s ticks (and the edge), 3 GPUs
    assert tail.poll() == 0  # nothing new: nothing read
    later = T0 + timedelta(seconds=10)
    write_segment(root, GPU_SAMPLES, [gpu_row("gpu-a", 0, later, 0.25)], name="seg-0002")
    assert tail.poll() == 1
    assert newest_sample_time(tail.con) == later
    assert next(g for g in latest_gpu_samples(tail.con) if g.gpu_uuid == "GPU-gpu-a-0").util_gpu == 0.25


def test_live_window_skips_old_segments_on_open_and_later(tmp_path):
    root = write_fleet(tmp_path / "tele")
    old = T0 - timedelta(hours=3)
    write_segment(root, GPU_SAMPLES, [gpu_row("gpu-a", 0, old, 0.9)], name="seg-old")
    old_file = next(root.glob("gpu_samples/**/host=gpu-a/seg-old.parquet"))
    os.utime(old_file, (time.time() - 3 * 3600, time.time() - 3 * 3600))  # written 3 hours ago
    tail = LiveWindow(root, timedelta(minutes=15))
    tail.poll()
    assert tail.con.execute("SELECT count(*) FROM gpu_samples WHERE ts = ?", [old]).fetchone()[0] == 0
    tail.poll()  # still not read on later polls
    assert tail.con.execute("SELECT count(*) FROM gpu_samples WHERE ts = ?", [old]).fetchone()[0] == 0


def test_live_window_rebuilds_when_segments_are_compacted(tmp_path):
    root = write_fleet(tmp_path / "tele")
    tail = LiveWindow(root, timedelta(minutes=15))
    tail.poll()
    before = _count(tail.con, "gpu_samples")
    # Compaction: the host's segments become one new file with the same rows.
    folder = next(root.glob("gpu_samples/*/host=gpu-a"))
    rows = pq.read_table(folder / "seg-0001.parquet")
    (folder / "seg-0001.parquet").unlink()
    pq.write_table(rows, folder / "compacted-0001.parquet")
    tail.poll()
    assert _count(tail.con, "gpu_samples") == before  # not read twice


def test_live_window_skips_an_unreadable_file_and_reads_the_rest(tmp_path):
    root = write_fleet(tmp_path / "tele")
    folder = next(root.glob("gpu_samples/*/host=gpu-b"))
    (folder / "broken.parquet").write_bytes(b"not parquet at all")
    tail = LiveWindow(root, timedelta(minutes=15))
    tail.poll()
    assert {g.host for g in latest_gpu_samples(tail.con)} == {"gpu-a", "gpu-b"}
    tail.poll()  # and it does not start over on every poll because of it
    assert {g.host for g in latest_gpu_samples(tail.con)} == {"gpu-a", "gpu-b"}


def test_live_window_keeps_a_silent_hosts_last_minutes(tmp_path):
    root = write_fleet(tmp_path / "tele")
    later = [gpu_row("gpu-b", 0, T0 + timedelta(minutes=m), 0.5) for m in range(1, 31)]
    write_segment(root, GPU_SAMPLES, later, name="seg-0002")  # gpu-b goes on for 30 minutes, gpu-a stopped
    tail = LiveWindow(root, timedelta(minutes=5))
    tail.poll()
    last = {(g.host, g.gpu_index): g.ts for g in latest_gpu_samples(tail.con)}
    assert last[("gpu-a", 0)] == T0 and last[("gpu-b", 0)] == T0 + timedelta(minutes=30)
