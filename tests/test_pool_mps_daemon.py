"""MPS daemon handling, with nvidia-cuda-mps-control replaced by a recording script on PATH.

The real daemon runs in tests/gpu/test_pool_mps.py; this checks what the server asks of it: start with
its pipe and log directories and the server's GPUs, join a running one, quit only what it started.
"""

from __future__ import annotations

import os
import stat

import pytest

from server._mps import MpsDaemon, MpsError

FAKE = """#!/bin/sh
# records how it was called; "-d" starts a "daemon" by creating its control pipe
if [ "$1" = "-d" ]; then
  echo "start pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY devices=$CUDA_VISIBLE_DEVICES" >> "$RECORD"
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" && touch "$CUDA_MPS_PIPE_DIRECTORY/control"
  exit 0
fi
read cmd
echo "control $cmd pipe=$CUDA_MPS_PIPE_DIRECTORY" >> "$RECORD"
[ -e "$CUDA_MPS_PIPE_DIRECTORY/control" ] || exit 1
"""


@pytest.fixture
def fake_mps(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "nvidia-cuda-mps-control"
    exe.write_text(FAKE)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    record = tmp_path / "record.txt"
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("RECORD", str(record))
    return record


def test_starts_one_daemon_for_all_gpus_under_the_state_dir_and_quits_it(fake_mps, tmp_path):
    mps = MpsDaemon(tmp_path / "state", ["GPU-a", "GPU-b"])
    mps.start()
    pipe = tmp_path / "state" / "mps" / "pipe"
    assert (pipe / "control").exists() and mps.client_env() == {"CUDA_MPS_PIPE_DIRECTORY": str(pipe)}
    lines = fake_mps.read_text().splitlines()
    assert lines[-1] == f"start pipe={pipe} log={tmp_path / 'state' / 'mps' / 'log'} devices=GPU-a,GPU-b"
    mps.stop()
    assert fake_mps.read_text().splitlines()[-1] == f"control quit pipe={pipe}"


def test_joins_a_running_daemon_and_leaves_it_running(fake_mps, tmp_path):
    pipe = tmp_path / "existing"
    pipe.mkdir()
    (pipe / "control").touch()
    mps = MpsDaemon(tmp_path / "state", ["GPU-a"], join_pipe_dir=pipe)
    mps.start()
    mps.stop()
    lines = fake_mps.read_text().splitlines()
    assert lines == [f"control get_server_list pipe={pipe}"]  # asked, never started, never quit
    assert mps.client_env()["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)


def test_missing_mps_tools_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(MpsError, match="nvidia-cuda-mps-control not found"):
        MpsDaemon(tmp_path / "state", ["GPU-a"]).start()


def test_lease_env_carries_the_partition_limits(tmp_path, fake_mps):
    from server._config import ServerConfig
    from server._events import EventLog
    from server._inventory import Gpu, Inventory
    from server._pool import Caller, Pool
    from server._store import Store
    from server.api import LeaseRequest

    gpus = tuple(Gpu(i, f"GPU-{i}", "H100", 80 << 30, "9.0", "550", "12.4") for i in range(2))
    mps = MpsDaemon(tmp_path / "state", [g.uuid for g in gpus])
    pool = Pool(
        Store(tmp_path / "db.sqlite"),
        Inventory("h", "127.0.0.1", gpus, False),
        ServerConfig(),
        EventLog(None, "h", simulated=False),
        mps,
    )
    lease = pool.grant(Caller("c", False), LeaseRequest(n=2, fraction=0.25, sm_share=0.5), now=1000.0)
    env = lease["env"]
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-0,GPU-1"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M,1=20480M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert lease["mps"] is True
    from server.workers import worker_env

    assert worker_env(lease, mps)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M,1=20480M"
