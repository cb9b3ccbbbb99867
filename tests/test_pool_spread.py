"""`gpuattach run --spread`: a run whose GPUs come from different servers, end to end without a GPU.

Two real gpupool-servers (simulated GPUs, lease workers on the host executor); the command is a small
launcher that starts ranks as torchrun does (LOCAL_RANK=r), and each rank's CUDA calls must reach the
worker of the r-th lease, on its own server.
"""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
from pool_harness import ServerProc, api, env_for, gpuattach

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        importlib.util.find_spec("virtualize.client._libcuda_shim") is None, reason="the shim is not built"
    ),
]
MiB = 1 << 20
# Ranks started as torchrun starts them; rank 2 is one more than the run has leases.
LAUNCHER = """
import json, os, subprocess, sys
for rank in (0, 1, 2):
    p = subprocess.run([sys.executable, "tests/remote_client.py", "devices"], capture_output=True, text=True,
                       env={**os.environ, "LOCAL_RANK": str(rank)}, timeout=60)
    out = dict(line.split(" ", 1) for line in p.stdout.splitlines() if " " in line)
    print(json.dumps({"rank": rank, "rc": p.returncode, "lease": os.environ.get(f"GPUPOOL_LEASE_{rank}"),
                      "out": out, "err": p.stderr[-400:]}), flush=True)
"""


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    base = tmp_path_factory.mktemp("spread")
    procs = [
        ServerProc(base / f"s{i}", fleet, env={"GPUPOOL_WORKER_EXECUTOR": "host"}).start()
        for i, fleet in enumerate(("1xH100-80GB", "1xA100-40GB"))  # two kinds: GPUs told apart
    ]
    yield procs
    for s in procs:
        s.stop()


def test_spread_runs_each_rank_on_its_own_servers_gpu_and_refuses_a_rank_beyond_the_leases(servers, tmp_path):
    """-n 2 --spread takes one GPU on each server; the process with LOCAL_RANK r talks to the worker of
    lease r (its server logs that process's connection), sees that lease's one GPU and partition; a
    process with a local rank past the leases gets no device and a message saying why."""
    env, token = env_for(tmp_path, servers, "spreader")
    logs_before = [s.log.stat().st_size for s in servers]
    out = gpuattach("run", "-n", "2", "-m", "2048", "--spread", "--", sys.executable, "-c", LAUNCHER, env=env,
                    timeout=90)  # fmt: skip
    assert out.returncode == 0, out.stderr
    ranks = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [r["rc"] for r in ranks] == [0, 0, 1], ranks
    for rank in ranks[:2]:
        assert rank["out"]["count"] == "1" and rank["out"]["total"] == str(2048 * MiB), rank
    assert ranks[2]["out"]["FAILED"].startswith("cuInit rc=100")  # CUDA_ERROR_NO_DEVICE
    assert "local rank is 2 but the run holds 2 leases" in ranks[2]["err"]
    # Each lease is on its own server, and that server's worker served the rank's process.
    held_by = [_server_of(servers, r["lease"], token) for r in ranks[:2]]
    assert sorted(held_by) == [0, 1]
    for rank, index in zip(ranks[:2], held_by, strict=True):
        log = servers[index].log.read_text()[logs_before[index] :]
        assert f"[{rank['lease']}]" in log and "connected" in log.split(f"[{rank['lease']}]", 1)[1], log[
            -2000:
        ]
    for s in servers:  # both released with the run
        assert api(s.url, "GET", "/v1/leases", token)[1]["leases"] == []


def _server_of(servers, lease_id: str, token: str) -> int:
    """Which server holds (or held) the lease."""
    for i, s in enumerate(servers):
        status, _ = api(s.url, "GET", f"/v1/leases/{lease_id}", token)
        if status == 200:
            return i
    raise AssertionError(f"no server knows lease {lease_id}")


def test_spread_over_more_servers_than_the_pool_has_fails_in_one_line_and_keeps_nothing(servers, tmp_path):
    env, token = env_for(tmp_path, servers, "too-wide")
    out = gpuattach("run", "-n", "3", "-p", "0.25", "--spread", "--timeout", "2s", "--", sys.executable, "-c", "pass",
                    env=env, timeout=60)  # fmt: skip
    assert out.returncode == 125
    errors = [line for line in out.stderr.splitlines() if line.startswith("gpuattach: error:")]
    assert len(errors) == 1 and "--spread" in errors[0], out.stderr
    assert "Traceback" not in out.stderr
    for s in servers:
        assert api(s.url, "GET", "/v1/leases", token)[1]["leases"] == []


def test_spread_with_local_or_an_existing_lease_is_refused_as_bad_usage(servers, tmp_path):
    env, _ = env_for(tmp_path, servers, "misuser")
    for extra in (["--local", "-n", "2"], ["--lease", "some-lease"]):
        out = gpuattach("run", *extra, "--spread", "--", sys.executable, "-c", "pass", env=env)
        assert out.returncode == 125 and "--spread takes new remote leases" in out.stderr, out.stderr


NVML_LAUNCHER = """
import json, os, subprocess, sys
probe = "import pynvml as N; N.nvmlInit(); h = N.nvmlDeviceGetHandleByIndex(0); print(N.nvmlDeviceGetCount(), N.nvmlDeviceGetUUID(h), N.nvmlDeviceGetName(h).replace(' ', '_'))"
for rank in (0, 1):
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                       env={**os.environ, "LOCAL_RANK": str(rank)}, timeout=60)
    print(json.dumps({"rank": rank, "rc": p.returncode, "lease": os.environ.get(f"GPUPOOL_LEASE_{rank}"),
                      "nvml": p.stdout.split(), "err": p.stderr[-400:]}), flush=True)
"""


def test_under_spread_each_ranks_nvml_shows_its_own_leases_gpu(servers, tmp_path):
    """NVML, like CUDA, follows the rank under --spread: the process of local rank r sees one GPU, lease
    r's (NCCL looks its CUDA device up in NVML and stops when the GPU is not there)."""
    env, token = env_for(tmp_path, servers, "spread-nvml")
    out = gpuattach("run", "-n", "2", "-m", "2048", "--spread", "--", sys.executable, "-c", NVML_LAUNCHER, env=env,
                    timeout=90)  # fmt: skip
    assert out.returncode == 0, out.stderr
    ranks = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [r["rc"] for r in ranks] == [0, 0], ranks
    for rank in ranks:
        index = _server_of(servers, rank["lease"], token)
        gpu = api(servers[index].url, "GET", "/v1/gpus", token)[1]["gpus"][0]
        assert rank["nvml"] == ["1", gpu["uuid"], gpu["name"].replace(" ", "_")], (rank, gpu)
    assert ranks[0]["nvml"] != ranks[1]["nvml"]  # the two servers' GPUs are of two kinds
