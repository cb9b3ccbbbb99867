"""The collector on a real GPU (marked gpu: skipped where NVML does not start).

    python -m pytest tests/gpu/test_nvml_collector.py -v

Needs only what a GPU host has: nvidia-ml-py, pyarrow (torch for the process test; no duckdb).
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time

import pyarrow.dataset as ds
import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def inventory():
    from collector import read_inventory

    return read_inventory()


def test_inventory_describes_every_gpu(inventory):
    assert inventory
    for gpu in inventory:
        assert gpu.uuid.startswith(("GPU-", "MIG-")) and gpu.name and gpu.mem_total_bytes > 2**30
        assert gpu.compute_capability >= (6, 0)
        assert gpu.driver_version[0].isdigit() and gpu.cuda_version[0].isdigit()
    assert [g.index for g in inventory] == list(range(len(inventory)))


def test_one_tick_reports_utilization_memory_and_power(inventory):
    from collector._nvml_source import NvmlSource

    source = NvmlSource(interval_s=1.0, ring_every_s=0.0)  # rings read every tick: rows leave at once
    try:
        time.sleep(1.2)  # let the driver's sample ring fill
        first = source.sample(dt.datetime.now(dt.UTC))
        time.sleep(1.0)
        second = source.sample(dt.datetime.now(dt.UTC))
    finally:
        source.close()
    for row in second.gpu_rows:
        assert row["state"] == "ok"
        for column in (
            "util_gpu_mean",
            "util_gpu_max",
            "util_mem_mean",
            "mem_used_bytes",
            "mem_total_bytes",
            "power_w",
        ):
            assert row.get(column) is not None, f"GPU {row['gpu_index']}: {column} is null"
        assert 0.0 <= row["util_gpu_mean"] <= row["util_gpu_max"] <= 1.0
        assert 10.0 < row["power_w"] < 2000.0 and row["mem_used_bytes"] <= row["mem_total_bytes"]
        assert row["temperature_c"] is None or 5.0 < row["temperature_c"] < 110.0
    assert all(
        r.get("energy_j") is not None and r["energy_j"] > 0 for r in first.gpu_rows
    )  # read on the first tick
    hopper = [g.index for g in inventory if g.compute_capability >= (9, 0)]
    for row in second.gpu_rows:
        if row["gpu_index"] in hopper:
            assert row.get("sm_activity") is not None, "GPM SM activity missing on a Hopper+ GPU"
            assert 0.0 <= row["sm_activity"] <= 1.0


def test_batched_ring_reads_give_every_tick_its_own_utilization(inventory):
    from collector._nvml_source import NvmlSource

    source = NvmlSource(interval_s=1.0)  # the default: rings read every 5 s
    rows = []
    try:
        for _ in range(7):
            time.sleep(1.0)
            rows += source.sample(dt.datetime.now(dt.UTC)).gpu_rows
        rows += source.drain().gpu_rows
    finally:
        source.close()
    for gpu in inventory:
        mine = [r for r in rows if r["gpu_index"] == gpu.index]
        assert len(mine) == 7, f"GPU {gpu.index}: {len(mine)} rows for 7 ticks"
        assert all(r["util_gpu_mean"] is not None and r["util_mem_mean"] is not None for r in mine)


def test_process_activity_sees_a_process_holding_memory():
    torch = pytest.importorskip("torch")
    from collector import process_activity, read_inventory

    block = torch.empty(512 * 2**20, dtype=torch.uint8, device="cuda:0")
    a = torch.randn(4096, 4096, device="cuda:0")
    for _ in range(50):
        a @ a
    torch.cuda.synchronize()
    props = torch.cuda.get_device_properties(0)
    cuda_uuid = str(getattr(props, "uuid", "") or "").lower().removeprefix("gpu-")
    index = next((g.index for g in read_inventory() if g.uuid.lower().removeprefix("gpu-") == cuda_uuid), 0)
    found = {p.pid: p for p in process_activity(index)}
    assert found, "no process listed on the GPU this test allocated on"
    # NVML reports host PIDs: inside a container with its own PID namespace ours differs
    me = found.get(os.getpid()) or max(found.values(), key=lambda p: p.mem_used_bytes or 0)
    assert me.mem_used_bytes is None or me.mem_used_bytes >= 512 * 2**20
    assert me.sm_util is None or 0.0 <= me.sm_util <= 1.0
    del block, a


def test_the_cli_writes_nvml_telemetry(tmp_path):
    out = tmp_path / "tele"
    proc = subprocess.run(
        [sys.executable, "-m", "collector.cli", "--out", str(out), "--duration", "4", "--flush", "1s"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "SIMULATED" not in proc.stderr
    table = ds.dataset(out / "gpu_samples", format="parquet", partitioning="hive").to_table()
    assert table.num_rows >= 4
    assert set(table.column("source").to_pylist()) == {"nvml"}
    assert not any(table.column("simulated").to_pylist())
    assert table.column("util_gpu_mean").null_count < table.num_rows
