"""bench/bench_remote.py with the host executor, as CI runs it: the protocol benchmark on a machine with
no GPU still runs end to end (shim, local socket, the worker's native loop and shared-memory copies)
and writes its numbers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from remote_helpers import needs_cc

ROOT = Path(__file__).resolve().parents[1]


@needs_cc
def test_the_host_executor_benchmark_runs_and_reports_every_row(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_remote.py"), "--executor", "host", "--copies-only",
         "--max-copy-mib", "1", "--partition-mib", "64"],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    remote = json.loads((tmp_path / "bench_remote.json").read_text())["remote"]
    assert remote["round_trip_us"] > 0 and remote["launches_per_s"] > 0
    rates = remote["bandwidth_gb_s"]
    assert {int(size) for size in rates} >= {4096, 1 << 20}  # a socket copy and one through shared memory
    assert all(row["htod"] > 0 and row["dtoh"] > 0 for row in rates.values())
    for pattern in ("dtoh_async_pinned", "htod_async_pinned"):  # copies with page-locked memory in flight
        assert {int(size) for size in remote[pattern]} == {64 << 10, 1 << 20}
        assert all(row["call_us"] > 0 and row["gb_s"] > 0 for row in remote[pattern].values())
    assert "cuEventRecord + cuCtxSynchronize round trip" in proc.stdout


@needs_cc
def test_with_repeat_each_row_is_the_median_of_the_runs(tmp_path):
    """--repeat 3: the remote program runs three times and each reported number is the median of the three
    (a change is compared on medians, not on one run of a noisy machine); every run is kept."""
    env = {**os.environ, "OUT": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_remote.py"), "--executor", "host", "--patterns",
         "dtoh_async", "--max-copy-mib", "1", "--partition-mib", "64", "--repeat", "3"],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    results = json.loads((tmp_path / "bench_remote.json").read_text())
    runs = results["remote_runs"]
    assert len(runs) == 3
    for size, row in results["remote"]["dtoh_async_pinned"].items():
        for key in ("call_us", "gb_s"):
            assert row[key] == sorted(run["dtoh_async_pinned"][size][key] for run in runs)[1]


@needs_cc
@pytest.mark.slow
def test_the_host_executor_benchmark_measures_graph_replays_and_event_loops(tmp_path):
    """The whole benchmark, past the copies: graph replays (capture, instantiate, cuGraphLaunch) and a
    benchmark harness's event loop (record, launch, record; synchronise, elapsed times) run remotely
    and report a rate and a time per iteration."""
    env = {**os.environ, "OUT": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_remote.py"), "--executor", "host",
         "--max-copy-mib", "1", "--partition-mib", "64"],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    remote = json.loads((tmp_path / "bench_remote.json").read_text())["remote"]
    assert remote["graph_replays_per_s"] > 0 and remote["event_loop_us"] > 0
    assert "graph replays" in proc.stdout and "event loop" in proc.stdout


@needs_cc
def test_the_host_executor_benchmark_measures_launches_after_a_live_migration(tmp_path):
    """With --move-to, the remote program's lease moves to the other host "GPU" between two launch
    measurements (the program asks its worker, as the pool server does): both rates are reported, and the
    move's answer with them."""
    env = {**os.environ, "OUT": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_remote.py"), "--executor", "host", "--patterns",
         "launches", "--move-to", "1", "--partition-mib", "64"],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    remote = json.loads((tmp_path / "bench_remote.json").read_text())["remote"]
    assert remote["move"]["ok"] and (remote["move"]["from"], remote["move"]["to"]) == (0, 1)
    assert remote["launches_per_s"] > 0 and remote["launches_after_move_per_s"] > 0
    assert "after the lease moved" in proc.stdout


@needs_cc
def test_with_ring_the_benchmark_runs_the_remote_program_on_the_socket_and_over_the_ring(tmp_path):
    """--ring: the remote program twice against one worker, on the socket and over the command ring, each
    reported (the round trip and the small copies, the rows issue 31 is about)."""
    env = {**os.environ, "OUT": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_remote.py"), "--executor", "host", "--ring",
         "--patterns", "round_trip,copies", "--max-copy-mib", "1", "--partition-mib", "64"],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    results = json.loads((tmp_path / "bench_remote.json").read_text())
    for run in ("remote", "remote_ring"):
        assert results[run]["round_trip_us"] > 0
        assert all(row["htod"] > 0 and row["dtoh"] > 0 for row in results[run]["bandwidth_gb_s"].values())
    assert "over the command ring" in proc.stdout


@needs_cc
def test_the_ring_transport_benchmark_reports_every_exchange_both_ways(tmp_path):
    """bench/bench_ring.py: each exchange over the socket and the ring, with and without polling."""
    env = {**os.environ, "OUT": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_ring.py"), "--rounds", "200", "--repeats", "1"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = json.loads((tmp_path / "bench_ring.json").read_text())["rows"]
    assert len(rows) == 6 and {row["spin_us"] for row in rows} == {0, 40}
    assert all(row["socket_us"][0] > 0 and row["ring_us"][0] > 0 for row in rows)
