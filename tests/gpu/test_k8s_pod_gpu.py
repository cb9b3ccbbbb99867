"""A Kubernetes pod's command, as the admission webhook rewrites it, running PyTorch on a real GPU.

Run on a GPU host (torch, aiohttp, msgspec, psutil, cuda-bindings), from the repository root:

    python -m pytest tests/gpu/test_k8s_pod_gpu.py -v -s

No cluster: the pod of tests/fixtures/k8s/pod-create-fraction.json goes through the webhook's patch
(server._admission, what `gpupool-server webhook` answers), and the container's new command — only
/opt/gpupool/bin/gpuattach replaced by this checkout's gpuattach, the pool by a gpupool-server on this
host's real GPUs — runs a PyTorch matmul remotely through its lease. It prints the lease, the device
and the result; the lease must be released when the command ends. About 30 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from pool_harness import ROOT, ServerProc, api, gpuattach_cmd

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(240)]

FIXTURE = ROOT / "tests" / "fixtures" / "k8s" / "pod-create-fraction.json"
PROGRAM = r"""
import os, torch
a = torch.arange(64 * 64, dtype=torch.float32).reshape(64, 64) / 4096
want = (a @ a).sum().item()
got = (a.cuda() @ a.cuda()).sum().item()
print("lease", os.environ.get("GPUPOOL_LEASE"))
print("device", torch.cuda.get_device_name(0))
print("matmul", "ok" if abs(got - want) < 1e-3 * abs(want) else f"WRONG {got} != {want}")
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProc(tmp_path_factory.mktemp("k8s") / "state", gpus=None).start(timeout=90)
    yield srv
    srv.stop()


def test_the_wrapped_pod_command_runs_pytorch_through_its_lease_and_releases_it(server, tmp_path):
    """The pod's container command after the webhook's patch takes a lease of half a GPU, runs a
    PyTorch matmul on it with the right result, and the lease is released when the command ends."""
    from server._admission import WebhookOptions, mutate

    pod = json.loads(FIXTURE.read_text())["request"]["object"]
    pod["spec"]["containers"][0]["command"] = [sys.executable, "-c", PROGRAM]
    pod["spec"]["containers"][0].pop("args")
    host = server.url.removeprefix("http://")
    patch = mutate(pod, WebhookOptions(image="registry.example.org/gpupool:0.1.0", servers=[host]))
    (command,) = [op["value"] for op in patch if op["path"] == "/spec/containers/0/command"]
    assert command[0] == "/opt/gpupool/bin/gpuattach"
    command = [*gpuattach_cmd(), *command[1:]]
    print("container command:", " ".join(command[:-1]), "<program>", flush=True)
    token = server.token("ml-team")
    env = {**os.environ, "GPUPOOL_TOKEN": token, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180, cwd=ROOT)
    print(run.stdout, run.stderr[-3000:], sep="\n", flush=True)
    assert run.returncode == 0
    lines = dict(line.split(" ", 1) for line in run.stdout.splitlines() if " " in line)
    assert lines["matmul"] == "ok"
    status, lease = api(server.url, "GET", f"/v1/leases/{lines['lease']}", token=token)
    assert status == 200 and lease["state"] == "released"
