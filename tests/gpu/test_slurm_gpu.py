"""A Slurm job's PyTorch program on its gpupool lease, on a real GPU. One command, from the repository root:

    python -m pytest tests/gpu/test_slurm_gpu.py -v -s

It starts `gpupool-server` on this host's real GPUs (127.0.0.1, telemetry on) and runs
tests/gpu/slurm_torch_job.py (a bf16 matmul checked against the CPU, an MLP trained 200 steps) as a
job with `--gpupool=1x0.5` (remote: through the shim) and `--gpupool=1x0.5:local` (the partition on
this host). Where Slurm is installed (slurmctld, slurmd, munged, spank.h) it runs a real one-node
Slurm (tests/slurm_cluster.py) and `srun`s the job; where it is not (the usual GPU host: no network to
install it), it drives deploy/slurm/gpupool-slurm-hook by hand exactly as slurmd does: Prolog, the
TaskProlog's environment, the program, Epilog. Each test prints the program's lines and the lease;
it checks the lease is released and the pool's events carry the job id and account. About 1-2 minutes.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from pool_harness import ROOT, ServerProc, api, wait_for
from slurm_cluster import SlurmCluster, job_by_hand, missing_tools

HOOK = ROOT / "deploy" / "slurm" / "gpupool-slurm-hook"
PROGRAM = ROOT / "tests" / "gpu" / "slurm_torch_job.py"
pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]
HAVE_SLURM = not missing_tools() and Path("/usr/include/slurm/spank.h").exists() and shutil.which("cc")


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    base = tmp_path_factory.mktemp("slurm-gpu")
    config = "[policy]\nreap_interval = 0.5\ntelemetry_flush = 1\n"
    srv = ServerProc(base / "state", gpus=None, config=config, extra=("--telemetry", str(base / "telemetry")))
    srv.start(timeout=120)
    srv.base, srv.telemetry, srv.admin = base, base / "telemetry", srv.token("admin", admin=True)
    print(f"\n[pool] {srv.banner}", flush=True)
    yield srv
    srv.stop()
    print("[gpupool-server log tail]\n" + "\n".join(srv.log.read_text().splitlines()[-15:]), flush=True)


@pytest.fixture(scope="module")
def settings(pool) -> Path:
    """/etc/gpupool/slurm.env of this run: the helper, the client config, a shim built from this tree."""
    from virtualize.client.remote import fresh_shim

    shim = fresh_shim(pool.base / "shim")
    cfg = pool.base / "client.toml"
    cfg.write_text(f'token = "{pool.token("slurm")}"\nservers = ["{pool.url}"]\ntimeout = "60s"\n')
    path = pool.base / "slurm.env"
    path.write_text(
        f"GPUPOOL_SLURM='{sys.executable} -m virtualize.client.slurm'\nGPUPOOL_CONFIG={cfg}\n"
        f"GPUPOOL_SLURM_DIR={pool.base / 'run'}\nGPUPOOL_SHIM_LIBRARY={shim}\n"
        f"PYTHONPATH={ROOT}\nexport PYTHONPATH\n"
    )
    return path


def lease_of(pool, job_id: str) -> dict | None:
    status, body = api(pool.url, "GET", "/v1/leases?state=any&all=true", pool.admin)
    assert status == 200, body
    mine = [x for x in body["leases"] if (x.get("job") or {}).get("id") == job_id]
    return max(mine, key=lambda x: x["created_at"]) if mine else None  # a new cluster counts from 1 again


def lines(stdout: str) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in stdout.splitlines() if " " in line)


def check_run(pool, job_id: str, stdout: str, spec: str) -> None:
    got = lines(stdout)
    assert got.get("ok") == "1" and got.get("device_count") == "1", stdout
    lease = wait_for(lambda: (x := lease_of(pool, job_id)) and x["state"] != "active" and x, 30,
                     what="the job's lease to end")  # fmt: skip
    print(
        f"[job {job_id} --gpupool={spec}] lease {lease['id']} {lease['state']}: {lease['reason']}", flush=True
    )
    assert lease["state"] == "released" and lease["job"]["account"] == "gpu-check"
    if not spec.endswith(":local"):  # remote: the program sees the partition's memory, not the GPU's
        gpu_gib = lease["partitions"][0]["mem_bytes"] / (1 << 30)
        assert abs(float(got["mem_total_gib"]) - gpu_gib) < 0.2, (got, lease["partitions"])


@pytest.mark.parametrize("spec", ["1x0.5", "1x0.5:local"])
def test_a_jobs_pytorch_program_runs_on_its_lease(pool, settings, spec, tmp_path):
    """The job's PyTorch program trains on the lease (remote through the shim, or local in the partition);
    the lease ends with the job and the pool's events carry the job id."""
    job_id = str(700000 + (1 if spec.endswith(":local") else 0))
    cmd = [sys.executable, str(PROGRAM)]
    if HAVE_SLURM:
        print("[real Slurm] srun", spec, flush=True)
        out = _srun(
            settings, tmp_path, spec, ["sh", "-c", 'echo slurm_job_id "$SLURM_JOB_ID"; exec "$@"', "sh", *cmd]
        )
        stdout, printed = out.stdout, ""
        assert out.returncode == 0, f"{out.stdout}\n{out.stderr[-3000:]}"
        job_id = lines(stdout)["slurm_job_id"]
    else:
        print("[by hand] Slurm is not installed here: the hook is driven as slurmd drives it", flush=True)
        result, printed = job_by_hand(HOOK, job_id, spec, cmd, account="gpu-check",
                                      env={"GPUPOOL_SLURM_ENV": str(settings)}, timeout=300)  # fmt: skip
        stdout = result.stdout
        assert result.returncode == 0, f"{printed}\n{result.stdout}\n{result.stderr[-3000:]}"
    print(printed + "\n" + stdout, flush=True)
    check_run(pool, job_id, stdout, spec)


def test_the_pool_events_book_gpu_hours_to_the_job(pool, settings):
    """After the jobs above: GPU-hours per job and per account from the pool's telemetry."""
    import analytics as A

    pool.stop()  # flushes the events
    usage = A.pool_usage_by_job(A.open_telemetry(pool.telemetry))
    for u in usage:
        print(
            f"[usage] job {u.scheduler}:{u.job_id} account {u.account}: {u.leases} leases, {u.gpu_hours * 3600:.1f} GPU-s"
        )
    jobs = [u for u in usage if u.account == "gpu-check"]
    assert jobs and all(u.gpu_hours > 0 for u in jobs)


def _srun(settings: Path, tmp_path: Path, spec: str, cmd: list[str]) -> subprocess.CompletedProcess:
    root = tmp_path / "slurm"
    root.mkdir()
    plugin = root / "gpupool_spank.so"
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-o", str(plugin), str(ROOT / "deploy/slurm/gpupool_spank.c")], check=True
    )
    hook = root / "hook"
    hook.write_text(f"#!/bin/sh\nGPUPOOL_SLURM_ENV={settings} exec {HOOK}\n")
    hook.chmod(0o755)
    cluster = SlurmCluster(root / "cluster", conf_extra=[f"Prolog={hook}", f"Epilog={hook}", f"TaskProlog={hook}"],
                           plugstack=[f"required {plugin}"])  # fmt: skip
    try:
        cluster.start()
        return cluster.run("srun", f"--gpupool={spec}", "--account=gpu-check", *cmd, check=False, timeout=300)
    finally:
        cluster.stop()
