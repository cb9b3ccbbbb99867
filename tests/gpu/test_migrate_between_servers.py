"""A running PyTorch training moved between two real gpupool-servers on one host, one GPU each.

Run on a host with two GPUs, from the repository root (about 3 minutes):

    python -m pytest tests/gpu/test_migrate_between_servers.py -v -s

Server A owns GPU 0, server B GPU 1 (each started with CUDA_VISIBLE_DEVICES naming its GPU, as a server
of one GPU is). The GPT-2-style training of bench/train_models.py (seeded, deterministic) runs under
`gpuattach run -n 1` on A as a client on another host has it (no memory shared with the worker's host), once
unmoved and once moved to B with `gpupool-server lease migrate LEASE --to B` after step `AT`: its losses must
equal the unmoved run's at every step, the lease must be active on B and ended on A, and A's GPU must hold
nothing of it afterwards. The move's answer (bytes, pause, stripes) is printed for bench/RESULTS.md.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from pool_harness import ROOT, ServerProc, api, client_env, gpuattach_cmd, server_cmd, wait_for

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(420)]
STEPS, AT = 20, 8
# As a client on another host: TLS (over loopback too), nothing shared with the worker's host (a move to another
# server refuses that).
REMOTE_CLIENT = {
    "GPUPOOL_SHIM_SHARED_COPIES": "0",
    "GPUPOOL_SHIM_SHARED_PINNED": "0",
    "GPUPOOL_DATA_ENCRYPTION": "always",
}


def gpu_count() -> int:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    return len([line for line in out.stdout.splitlines() if line.startswith("GPU ")])


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    if gpu_count() < 2:
        pytest.skip("two GPUs are needed")
    base = tmp_path_factory.mktemp("two-servers")
    a = ServerProc(base / "a", gpus=None, env={"CUDA_VISIBLE_DEVICES": "0"}).start(timeout=90)
    b = ServerProc(base / "b", gpus=None, env={"CUDA_VISIBLE_DEVICES": "1"}).start(timeout=90)
    yield a, b
    a.stop()
    b.stop()


def tokens(a: ServerProc, b: ServerProc) -> tuple[str, str]:
    """An admin token and a client token both servers take (the heartbeats follow the lease to B)."""
    admin = a.token("ops", admin=True)
    b.token("ops", admin=True, token=admin)
    client = a.token("trainer")
    b.token("trainer", token=client)
    return admin, client


def train(server: ServerProc, tmp_path: Path, token: str, moved_at=None, move=None) -> tuple[int, list, str]:
    """The training under `gpuattach run -n 1` on `server`; after step `moved_at`, `move()` on a thread (the
    training runs on meanwhile). (exit status, losses, stderr's tail)."""
    env = {**client_env(tmp_path, [server.url], token), **REMOTE_CLIENT}
    cmd = [*gpuattach_cmd(), "run", "-n", "1", "--", sys.executable, str(ROOT / "bench" / "train_models.py"),
           "gpt2", "--steps", str(STEPS)]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    losses, mover = [], None
    for line in proc.stdout:
        print("   ", line.rstrip(), flush=True)
        if line.startswith("step "):
            losses.append(float(line.split()[3]))
            if moved_at is not None and len(losses) == moved_at and mover is None:
                mover = threading.Thread(target=move)
                mover.start()
    proc.wait(timeout=300)
    if mover is not None:
        mover.join(120)
    return proc.returncode, losses, proc.stderr.read()[-3000:]


def gpu_memory_of(index: int) -> int:
    """MiB in use on GPU `index` (nvidia-smi)."""
    out = subprocess.run(["nvidia-smi", "-i", str(index), "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30)  # fmt: skip
    return int(out.stdout.strip() or 0)


def test_a_training_moved_to_another_gpupool_server_mid_run_keeps_its_losses(servers, tmp_path):
    a, b = servers
    admin, client = tokens(a, b)
    rc, reference, err = train(a, tmp_path, client)
    assert rc == 0 and len(reference) == STEPS, err
    moved: dict = {}

    def move() -> None:
        try:
            moved.update(asked())
        except Exception as exc:  # said by the test, not lost on the thread
            moved["error"] = repr(exc)

    def asked() -> dict:
        _, leases = api(a.url, "GET", "/v1/leases?all=true", admin)
        (lease,) = [x for x in leases["leases"] if x["client"] == "trainer" and x["state"] == "active"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
        env["GPUPOOL_TOKEN"] = admin
        out = subprocess.run([*server_cmd(), "lease", "migrate", lease["id"], "--to", b.url, "--server", a.url],
                             env=env, capture_output=True, text=True, timeout=180, cwd=ROOT)  # fmt: skip
        print(
            f"    lease migrate: exit {out.returncode}: {out.stdout.strip()} {out.stderr.strip()}", flush=True
        )
        return {"lease": lease, "out": out}

    rc, losses, err = train(a, tmp_path, client, AT, move)
    assert rc == 0, err
    assert "out" in moved, moved
    out = moved["out"]
    assert out.returncode == 0, out.stdout + out.stderr
    lease = moved["lease"]
    assert api(a.url, "GET", f"/v1/leases/{lease['id']}", admin)[1]["state"] != "active"
    for step, (want, got) in enumerate(zip(reference, losses, strict=False)):
        print(f"    {step:3d} {want:10.5f} {got:10.5f}{'' if want == got else '  DIFFERENT'}")
    assert losses == reference  # step for step, bit for bit
    # the lease ended with its program on B; A's GPU holds nothing of it (its worker exited after the move)
    wait_for(lambda: gpu_memory_of(0) < 1024, 30, what="GPU 0 to be free after the move")
