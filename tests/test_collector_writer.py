"""The telemetry writer and compaction, on real files: atomic segments, kill -9, disk full, crashes."""

from __future__ import annotations

import datetime as dt
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from small_disk import small_disk

import analytics
from collector._compact import compact, recover
from collector._errors import TelemetryWriteError
from collector._simulated import SimulatedFleet
from collector._simulated_source import SimulatedSource, backfill
from collector.schema import METADATA_VERSION_KEY, SCHEMA_VERSION
from collector.writer import TelemetryWriter

CLI = [sys.executable, "-m", "collector.cli"]
T0 = dt.datetime(2026, 3, 4, 23, 59, 58, tzinfo=dt.UTC)


def rows(n: int, start: dt.datetime = T0, gpu: int = 0) -> list[dict]:
    return [
        {"ts": start + dt.timedelta(seconds=k), "gpu_index": gpu, "gpu_uuid": f"GPU-{gpu}", "state": "ok",
         "util_gpu_mean": 0.5, "source": "nvml", "simulated": False}
        for k in range(n)
    ]  # fmt: skip


def count(root: Path, table: str = "gpu_samples") -> int:
    return analytics.open_telemetry(root).execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def hidden_files(root: Path) -> list[Path]:
    return [p for p in root.rglob(".*") if p.is_file()]


def test_segments_land_in_hive_partitions_with_the_schema_version(tmp_path):
    with TelemetryWriter(tmp_path, "node-1", flush_interval_s=0) as w:
        w.append("gpu_samples", rows(4))  # crosses midnight: two date partitions
    dates = sorted(p.name for p in (tmp_path / "gpu_samples").iterdir())
    assert dates == ["date=2026-03-04", "date=2026-03-05"]
    seg = next((tmp_path / "gpu_samples" / "date=2026-03-04" / "host=node-1").glob("*.parquet"))
    assert pq.read_schema(seg).metadata[METADATA_VERSION_KEY] == str(SCHEMA_VERSION).encode()
    assert "host" not in pq.read_schema(seg).names and "date" not in pq.read_schema(seg).names
    con = analytics.open_telemetry(tmp_path)
    assert con.execute("SELECT count(*), min(host), min(schema_version) FROM gpu_samples").fetchone() == (
        4,
        "node-1",
        SCHEMA_VERSION,
    )
    assert con.execute("SELECT count(*) FROM gpu_samples WHERE date = DATE '2026-03-05'").fetchone()[0] == 2
    assert hidden_files(tmp_path) == []


def test_background_flush_and_many_threads_appending(tmp_path):
    w = TelemetryWriter(tmp_path, "h", flush_interval_s=0.1)
    threads = [
        threading.Thread(target=lambda g=g: [w.append("gpu_samples", rows(10, gpu=g)) for _ in range(20)])
        for g in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    deadline = time.monotonic() + 10
    while w.rows_written < 800 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert w.rows_written == 800, "the background flush did not write everything"
    w.close()
    assert count(tmp_path) == 800


def test_a_failed_flush_keeps_the_rows_and_the_next_one_writes_them(tmp_path):
    root = tmp_path / "t"
    w = TelemetryWriter(root, "h", flush_interval_s=0)
    w.append("gpu_samples", rows(3))
    shutil.rmtree(root)
    root.write_text("now a file")  # the directory is gone and a file is in its place
    with pytest.raises(TelemetryWriteError, match="not writable"):
        w.flush()
    assert w.buffered_rows == 3 and w.error is not None
    root.unlink()
    w.append("gpu_samples", rows(2, start=T0 + dt.timedelta(hours=1)))
    assert w.flush() == 5 and w.error is None
    assert count(root) == 5


def test_unwritable_directory_is_one_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(TelemetryWriteError, match=r"telemetry directory not writable: .*file/telemetry"):
        TelemetryWriter(blocker / "telemetry", "h")
    proc = subprocess.run(
        [*CLI, "--simulate", "2", "--duration", "1", "--out", str(blocker / "telemetry")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode != 0
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith("gpustat-collect: error: telemetry directory not writable")
    )
    assert "Traceback" not in proc.stderr


def test_disk_full_is_reported_and_leaves_readable_segments(tmp_path):
    """A flush on a full disk raises one clear error, keeps its rows, leaves no temporary file and only
    whole segments; the CLI stopped on a still-full disk says in one line how many rows were dropped."""
    with small_disk(tmp_path / "small", size="160k") as disk:
        w = TelemetryWriter(disk.path, "h", flush_interval_s=0)
        with pytest.raises(TelemetryWriteError, match="disk full"):
            for k in range(200):
                w.append("gpu_samples", rows(2000, start=T0 + dt.timedelta(hours=k)))
                w.flush()
        assert w.buffered_rows >= 2000  # kept for a retry, not dropped
        assert hidden_files(disk.path) == []  # no half-written temporary segment left behind
        for seg in disk.path.rglob("*.parquet"):
            pq.read_table(seg)  # every visible segment is whole
        # the CLI samples on, and when it stops with the disk still full says what it could not write:
        # one line, non-zero exit
        proc = subprocess.run(
            [*CLI, "--simulate", "64", "--interval", "0.05s", "--flush", "0.2s", "--duration", "2", "--out", str(disk.path)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert proc.returncode != 0
        last = proc.stderr.strip().splitlines()[-1]
        assert (
            last.startswith("gpustat-collect: error: disk full writing telemetry")
            and "dropped at exit" in last
        )
        assert "Traceback" not in proc.stderr


def test_live_sampling_through_a_full_disk_keeps_its_rows_and_writes_them_when_space_returns(tmp_path):
    """The collector does what its message says: on a full disk it samples on, keeps the rows in memory
    and writes them once there is room; no tick of the full period is missing afterwards."""
    with small_disk(tmp_path / "small") as disk:
        out = disk.path / "tele"
        proc = subprocess.Popen(
            [*CLI, "--simulate", "4", "--interval", "0.1s", "--flush", "0.3s", "--rollup-every", "0", "--out", str(out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while not list(out.rglob("gpu_samples-*.parquet")) and time.monotonic() < deadline:
                time.sleep(0.05)
            disk.fill(keep=True)
            full_from = dt.datetime.now(dt.UTC)
            time.sleep(2.5)  # about 25 ticks that cannot be written
            assert proc.poll() is None, "the collector stopped on a full disk"
            full_until = dt.datetime.now(dt.UTC)
            disk.free()
            time.sleep(1.5)  # several flushes with room again
            proc.send_signal(signal.SIGTERM)
            _, stderr = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0, stderr
        assert "kept in memory" in stderr and "telemetry written again" in stderr
        con = analytics.open_telemetry(out)
        n, ticks = con.execute("SELECT count(*), count(DISTINCT ts) FROM gpu_samples").fetchone()
        assert n == 4 * ticks  # whole ticks, none written twice
        during = con.execute(
            "SELECT count(DISTINCT ts) FROM gpu_samples WHERE ts BETWEEN ? AND ?", [full_from, full_until]
        ).fetchone()[0]
        assert during >= 10  # the full period's ticks are there (25 at 10 Hz; fewer on a busy machine)
        widest = con.execute(
            "SELECT max(gap) FROM (SELECT epoch(ts) - lag(epoch(ts)) OVER (ORDER BY ts) AS gap"
            " FROM (SELECT DISTINCT ts FROM gpu_samples))"
        ).fetchone()[0]
        assert widest < 1.0  # no hole where the disk was full


def test_kill_9_mid_run_loses_at_most_the_unflushed_interval(tmp_path):
    out = tmp_path / "tele"
    flush = 0.5
    proc = subprocess.Popen(
        [*CLI, "--simulate", "4", "--interval", "0.1s", "--flush", f"{flush}s", "--out", str(out), "-q"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    reader_errors: list[str] = []
    reads = 0
    stop = threading.Event()

    def reader():
        # A reader working while the collector writes must never see a half file.
        nonlocal reads
        while not stop.is_set():
            for seg in out.rglob("*.parquet"):
                try:
                    pq.read_table(seg)
                    reads += 1
                except FileNotFoundError:
                    pass
                except Exception as exc:
                    reader_errors.append(f"{seg.name}: {exc}")

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while len(list(out.rglob("gpu_samples-*.parquet"))) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode()
        time.sleep(0.23)  # somewhere between two flushes
        killed_at = dt.datetime.now(dt.UTC)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        stop.set()
        thread.join(timeout=10)
        if proc.poll() is None:
            proc.kill()
    assert reader_errors == [] and reads > 0
    con = analytics.open_telemetry(out)
    n, newest_us, ticks = con.execute(
        "SELECT count(*), epoch_us(max(ts)), count(DISTINCT ts) FROM gpu_samples"
    ).fetchone()
    newest = dt.datetime.fromtimestamp(newest_us / 1e6, dt.UTC)
    assert n == 4 * ticks  # whole ticks only
    # what was lost is at most the unflushed interval (plus scheduling slack on a busy machine)
    assert killed_at - newest < dt.timedelta(seconds=flush + 2.0)


def test_sigterm_flushes_and_exits_0(tmp_path):
    out = tmp_path / "tele"
    proc = subprocess.Popen(
        [*CLI, "--simulate", "2", "--interval", "0.1s", "--flush", "60s", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    # Sample for a second from when the collector says it started (its start-up time varies with load).
    banner = ""
    deadline = time.monotonic() + 60
    while "SIMULATED FLEET" not in banner and time.monotonic() < deadline:
        if select.select([proc.stderr], [], [], 1.0)[0]:
            banner += proc.stderr.readline()
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=20)
    err = banner + err
    assert proc.returncode == 0, err
    assert "SIMULATED FLEET" in err
    # nothing was flushed before the signal (60 s interval): everything came from the final flush
    assert count(out) >= 2 * 5


# -- compaction ---------------------------------------------------------------------------------------
def _small_segments(root: Path, days: int = 2, flushes: int = 6) -> int:
    fleet = SimulatedFleet(3, "h")
    src = SimulatedSource(fleet)
    w = TelemetryWriter(root, "h", flush_interval_s=0)
    total = 0
    for d in range(days):
        for f in range(flushes):
            for k in range(5):
                tick = src.sample(T0 - dt.timedelta(days=d + 1, minutes=f, seconds=k))
                w.append("gpu_samples", tick.gpu_rows)
                w.append("process_samples", tick.process_rows)
                total += len(tick.gpu_rows)
            w.flush()
    w.close()
    return total


def test_compaction_merges_each_day_and_keeps_every_row(tmp_path):
    total = _small_segments(tmp_path)
    before = count(tmp_path, "process_samples")
    segs_before = len(list(tmp_path.rglob("*.parquet")))
    result = compact(tmp_path, before=T0.date())
    assert result.segments_in == segs_before
    assert len(list(tmp_path.rglob("*.parquet"))) == result.segments_out == 4  # 2 tables x 2 days
    assert count(tmp_path) == total and count(tmp_path, "process_samples") == before
    con = analytics.open_telemetry(tmp_path)
    assert (
        con.execute("SELECT count(*) FROM (SELECT DISTINCT ts, gpu_index FROM gpu_samples)").fetchone()[0]
        == total
    )
    assert compact(tmp_path, before=T0.date()).segments_in == 0  # idempotent


@pytest.mark.parametrize(
    "crash_at", ["merged-written", "journal-committed", "merged-visible", "originals-removing"]
)
def test_a_crash_mid_compaction_neither_loses_nor_doubles_rows(tmp_path, crash_at):
    total = _small_segments(tmp_path, days=1)

    class Crash(Exception):
        pass

    def hook(step):
        if step == crash_at:
            raise Crash(step)

    with pytest.raises(Crash):
        compact(tmp_path, hook=hook)
    recovered = recover(tmp_path)
    assert recovered == (0 if crash_at == "merged-written" else 1)
    assert hidden_files(tmp_path) == []
    assert count(tmp_path) == total
    con = analytics.open_telemetry(tmp_path)
    assert (
        con.execute("SELECT count(*) FROM (SELECT DISTINCT ts, gpu_index FROM gpu_samples)").fetchone()[0]
        == total
    )
    # and a later compaction completes normally
    compact(tmp_path)
    assert count(tmp_path) == total and len(list(tmp_path.rglob("*.parquet"))) == 2


def test_compact_cli(tmp_path):
    total = _small_segments(tmp_path, days=1)
    proc = subprocess.run([*CLI, "compact", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "compacted 2 partitions" in proc.stdout
    assert count(tmp_path) == total
    missing = subprocess.run(
        [*CLI, "compact", str(tmp_path / "nope")], capture_output=True, text=True, timeout=60
    )
    assert missing.returncode != 0 and missing.stderr.count("\n") == 1 and "not found" in missing.stderr


def test_backfill_writes_one_segment_per_day(tmp_path):
    w = TelemetryWriter(tmp_path, "h", flush_interval_s=0)
    backfill(SimulatedFleet(2, "h"), w.write_table, T0 - dt.timedelta(days=2), T0, step_s=60.0)
    segs = list((tmp_path / "gpu_samples").rglob("*.parquet"))
    assert len(segs) == 3  # two partial days and one full day
    assert count(tmp_path) == 2 * 2 * 24 * 60


def test_a_bad_row_fails_in_the_caller_and_the_writer_keeps_working(tmp_path):
    w = TelemetryWriter(tmp_path, "h", flush_interval_s=0)
    with pytest.raises(ValueError, match="ts"):
        w.append("gpu_samples", [{"gpu_index": 0}])
    with pytest.raises((TypeError, ValueError)):  # pyarrow's ArrowInvalid/ArrowTypeError are these
        w.append("gpu_samples", [{**rows(1)[0], "gpu_index": "zero"}])
    with pytest.raises(ValueError, match="unknown telemetry table"):
        w.append("gpu_sample", rows(1))
    w.append("gpu_samples", rows(2))
    w.close()
    assert count(tmp_path) == 2


def test_compaction_leaves_segments_of_another_schema_version_alone(tmp_path):
    total = _small_segments(tmp_path, days=1)
    folder = next((tmp_path / "gpu_samples").glob("date=*/host=h"))
    seg = next(folder.glob("*.parquet"))
    table = pq.read_table(seg, partitioning=None)
    meta = {**table.schema.metadata, METADATA_VERSION_KEY: b"2"}
    pq.write_table(table.replace_schema_metadata(meta), seg)
    before = sorted(p.name for p in folder.glob("*.parquet"))
    result = compact(tmp_path)
    assert len(result.skipped) == 1 and "schema versions ['1', '2']" in result.skipped[0]
    assert sorted(p.name for p in folder.glob("*.parquet")) == before  # untouched
    assert result.folders == 1  # process_samples was compacted
    assert sum(pq.read_table(p, partitioning=None).num_rows for p in folder.glob("*.parquet")) == total


def test_recover_removes_segments_a_killed_writer_left_half_written(tmp_path):
    _small_segments(tmp_path, days=1)
    folder = next((tmp_path / "gpu_samples").glob("date=*/host=h"))
    old, fresh = (
        folder / ".gpu_samples-x-1-000001-aa.parquet.tmp",
        folder / ".gpu_samples-x-2-000002-bb.parquet.tmp",
    )
    old.write_bytes(b"PAR1 half")
    fresh.write_bytes(b"PAR1 half")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    recover(tmp_path)
    assert not old.exists() and fresh.exists()  # a fresh one may belong to a writer still at work


def test_a_write_whose_answer_was_lost_is_replaced_not_doubled(tmp_path):
    # The store took the segment but the writer heard a failure (an object store's lost answer): the
    # retry, holding those rows and the next ones, goes under the same name and replaces it.
    w = TelemetryWriter(tmp_path, "h", flush_interval_s=0)
    real, lost = w._sink.write, []

    def write_then_fail(parts, name, table):
        real(parts, name, table)
        if not lost:
            lost.append(name)
            raise OSError("connection reset by peer")

    w._sink.write = write_then_fail
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    w.append("gpu_samples", [{"ts": t0, "gpu_index": 0, "gpu_uuid": "GPU-0"}])
    with pytest.raises(TelemetryWriteError):
        w.flush()
    w.append("gpu_samples", [{"ts": t0 + dt.timedelta(seconds=1), "gpu_index": 0, "gpu_uuid": "GPU-0"}])
    w.close()
    segments = list(tmp_path.rglob("*.parquet"))
    assert [p.name for p in segments] == lost
    assert analytics.open_telemetry(tmp_path).execute("SELECT count(*) FROM gpu_samples").fetchone()[0] == 2


def test_a_flush_across_midnight_that_fails_on_the_second_day_stores_the_first_once(tmp_path):
    w = TelemetryWriter(tmp_path, "h", flush_interval_s=0)
    real, failed = w._sink.write, []

    def second_day_fails_once(parts, name, table):
        if parts[1] == "date=2026-01-02" and not failed:
            failed.append(name)
            raise OSError("connection reset by peer")
        real(parts, name, table)

    w._sink.write = second_day_fails_once
    midnight = dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
    for s in (-2, -1, 1, 2):
        w.append("gpu_samples", [{"ts": midnight + dt.timedelta(seconds=s), "gpu_index": 0, "gpu_uuid": "G"}])
    with pytest.raises(TelemetryWriteError):
        w.flush()  # 2026-01-01 written, 2026-01-02 not: every row goes back to the buffer
    w.close()
    con = analytics.open_telemetry(tmp_path)
    assert con.execute("SELECT count(*), count(DISTINCT ts) FROM gpu_samples").fetchone() == (4, 4)
    assert len(list(tmp_path.rglob("*.parquet"))) == 2


def test_writer_never_stores_a_value_outside_its_physical_range(tmp_path):
    """A row with an impossible value (a driver's sentinel temperature, NaN utilization, 150 %) is
    dropped and counted by the writer itself; the sane rows of the same batch are stored."""
    batch = rows(5)
    batch[1]["temperature_c"] = 65535.0
    batch[2]["util_gpu_mean"] = float("nan")
    batch[3]["util_gpu_mean"] = 1.5
    with TelemetryWriter(tmp_path, "h", flush_interval_s=0) as writer:
        writer.append("gpu_samples", batch)
    assert writer.rows_rejected == 3 and writer.first_rejected.startswith("temperature_c")
    stored = pq.read_table(tmp_path / "gpu_samples", partitioning=None)
    assert sorted(stored.column("ts").to_pylist()) == sorted(batch[i]["ts"] for i in (0, 4))

    # the same rule for a table written whole (a backfill)
    later = rows(2, start=T0 + dt.timedelta(days=2))
    later[0]["mem_used_bytes"] = -1
    direct = TelemetryWriter(tmp_path / "direct", "h", flush_interval_s=0)
    assert direct.write_table("gpu_samples", pa.Table.from_pylist(later)) == 1
    assert direct.rows_rejected == 1 and direct.first_rejected.startswith("mem_used_bytes")
