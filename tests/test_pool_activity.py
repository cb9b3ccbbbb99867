"""The idle-reclaim probes, with the collector's process_activity replaced at its seam."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from collector import ProcessActivity
from server._activity import NvmlActivity, SimulatedActivity
from server._procs import pid_identity


@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["sleep", "30"])
    yield proc
    proc.kill()
    proc.wait()


def lease(pids, gpus=(0,), lid="L1"):
    return {"id": lid, "pids": pid_identity(list(pids)), "gpus": list(gpus), "remote": False, "worker": None}


@pytest.mark.parametrize(
    ("sm_util", "busy"), [(0.4, True), (0.0, False), (None, True)], ids=["working", "idle", "unknown"]
)
def test_nvml_probe_reads_the_lease_processes_busy_share(monkeypatch, sleeper, sm_util, busy):
    seen = []

    def fake_activity(index, *, window_s):
        seen.append((index, window_s))
        return [
            ProcessActivity(pid=sleeper.pid, mem_used_bytes=1 << 30, sm_util=sm_util),
            ProcessActivity(pid=1, mem_used_bytes=1, sm_util=0.9),
        ]

    monkeypatch.setattr("collector.process_activity", fake_activity)
    got = NvmlActivity(window_s=3.0).busy_leases([lease([sleeper.pid], gpus=(2,))], now=123.0)
    assert seen == [(2, 3.0)]
    assert got == ({"L1": 123.0} if busy else {})  # another process's work (pid 1) never counts


def test_nvml_probe_counts_children_of_the_lease_process(monkeypatch):
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; p = subprocess.Popen(['sleep', '30']); print(p.pid, flush=True); p.wait()"],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        child = int(parent.stdout.readline())
        monkeypatch.setattr(
            "collector.process_activity", lambda i, *, window_s: [ProcessActivity(child, 1, 0.5)]
        )
        assert NvmlActivity().busy_leases([lease([parent.pid])], now=1.0) == {"L1": 1.0}
    finally:
        subprocess.run(["pkill", "-P", str(parent.pid)], check=False)
        parent.kill()
        parent.wait()


def test_simulated_probe_uses_cpu_time_as_stand_in(sleeper):
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<5: pass"])
    try:
        probe = SimulatedActivity()
        leases = [lease([sleeper.pid], lid="idle"), lease([busy.pid], lid="busy")]
        t0 = time.time()
        probe.busy_leases(leases, now=t0)  # first look: a baseline
        time.sleep(0.5)
        t1 = time.time()
        assert probe.busy_leases(leases, now=t1) == {"busy": t1}
    finally:
        busy.kill()
        busy.wait()
