"""Slurm jobs with pooled GPUs, on a real Slurm: munged + slurmctld + slurmd (tests/slurm_cluster.py).

The cluster runs gpupool's SPANK plugin (``--gpupool=N[xP][:local]``, compiled here from
deploy/slurm/gpupool_spank.c) and ``deploy/slurm/gpupool-slurm-hook`` as Prolog, Epilog and TaskProlog,
against a real ``gpupool-server`` on simulated GPUs whose lease workers serve CUDA calls from host
memory (``GPUPOOL_WORKER_EXECUTOR=host``), so a job's CUDA program runs through the shim end to end.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pool_harness import ServerProc, api, wait_for
from slurm_cluster import SlurmCluster, job_by_hand, missing_tools

ROOT = Path(__file__).resolve().parents[1]
HOOK = ROOT / "deploy" / "slurm" / "gpupool-slurm-hook"
SPANK = ROOT / "deploy" / "slurm" / "gpupool_spank.c"
MiB = 1 << 20

pytestmark = [
    pytest.mark.timeout(240),
    *(pytest.mark.needs(tool) for tool in ("native", "cc", "slurm", "munge", "spank")),
]


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    root = tmp_path_factory.mktemp("pool")
    config = (
        "[policy]\nreap_interval = 0.2\ntelemetry_flush = 0.2\nlease_ttl = 5\n"
        "[clients.slurm]\nlimit = 1.5\n"  # the cluster's one client: 2 whole GPUs are over its limit
    )
    srv = ServerProc(
        root / "state",
        "2xH100-80GB",
        config=config,
        extra=("--telemetry", str(root / "telemetry")),
        env={"GPUPOOL_WORKER_EXECUTOR": "host"},
    ).start()
    srv.telemetry = root / "telemetry"
    srv.admin = srv.token("admin", admin=True)
    yield srv
    srv.stop()


def hook_settings(pool, root: Path) -> Path:
    """What /etc/gpupool/slurm.env holds on a real cluster: the helper, the cluster's client config
    (client "slurm"), the folder for leases and task environments."""
    cfg = root / "client.toml"
    cfg.write_text(f'token = "{pool.token("slurm")}"\nservers = ["{pool.url}"]\ntimeout = "3s"\n')
    settings = root / "slurm.env"
    settings.write_text(
        f"GPUPOOL_SLURM='{sys.executable} -m virtualize.client.slurm'\nGPUPOOL_CONFIG={cfg}\n"
        f"GPUPOOL_SLURM_DIR={root / 'run'}\nPYTHONPATH={ROOT}\nexport PYTHONPATH\n"
    )
    return settings


@pytest.fixture(scope="module")
def slurm(tmp_path_factory, pool):
    if missing_tools():  # root, or a Slurm program the package should have brought
        pytest.fail(f"no Slurm to run here (missing {', '.join(missing_tools())}): as root, apt-get install "
                    "slurm-wlm munge libslurm-dev, as scripts/test.sh does")  # fmt: skip
    root = tmp_path_factory.mktemp("slurm")
    cc = shutil.which("cc") or shutil.which("gcc")
    if not Path("/usr/include/slurm/spank.h").exists() or cc is None:
        pytest.fail("libslurm-dev (slurm/spank.h) and a C compiler are needed: scripts/test.sh installs them")
    plugin = root / "gpupool_spank.so"
    subprocess.run([cc, "-Wall", "-Werror", "-shared", "-fPIC", "-o", str(plugin), str(SPANK)], check=True)
    settings = hook_settings(pool, root)
    hook = root / "hook"  # Slurm passes no environment of ours to its Prolog: say where the settings are
    hook.write_text(f"#!/bin/sh\nGPUPOOL_SLURM_ENV={settings} exec {HOOK}\n")
    hook.chmod(0o755)
    cluster = SlurmCluster(
        root / "cluster",
        conf_extra=[f"Prolog={hook}", f"Epilog={hook}", f"TaskProlog={hook}", "Licenses=gpupool:2"],
        plugstack=[f"required {plugin}"],
    )
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def leases(pool, state: str = "any") -> list[dict]:
    status, body = api(pool.url, "GET", f"/v1/leases?state={state}&all=true", pool.admin)
    assert status == 200, body
    return body["leases"]


def job_lease(pool, job_id: str) -> dict | None:
    found = [lease for lease in leases(pool) if (lease.get("job") or {}).get("id") == job_id]
    return found[0] if found else None


def test_a_job_runs_its_cuda_program_on_its_lease_and_the_lease_ends_with_the_job(pool, slurm):
    """sbatch --gpupool=1x0.5: the lease exists before the job's task starts (the task's CUDA program sees
    one device of half an 80 GB GPU through the shim) and is released when the job ends."""
    script = (
        f"#!/bin/sh\necho lease=$GPUPOOL_LEASE\nexec {sys.executable} {ROOT}/tests/remote_client.py devices\n"
    )
    job = slurm.sbatch(script, "--gpupool=1x0.5", "--account=physics")
    assert slurm.wait_state(job, {"COMPLETED", "FAILED"}, 60) == "COMPLETED", slurm.output(job)
    out = slurm.output(job)
    got = dict(line.split(" ", 1) for line in out.splitlines() if line.startswith(("count ", "total ")))
    assert got == {"count": "1", "total": str(40 * 1024 * MiB)}, out
    lease = wait_for(lambda: (lease := job_lease(pool, job)) and lease["state"] != "active" and lease, 10,
                     what="the job's lease to end")  # fmt: skip
    assert f"lease={lease['id']}" in out
    assert lease["state"] == "released"
    assert lease["job"]["account"] == "physics" and lease["job"]["scheduler"].startswith("slurm")


def test_srun_takes_a_lease_for_its_step(pool, slurm):
    """srun --gpupool=1x0.25 (no batch script): the step's program runs on a lease of its own."""
    out = slurm.run("srun", "--gpupool=1x0.25", sys.executable, f"{ROOT}/tests/remote_client.py", "devices",
                    timeout=60)  # fmt: skip
    assert "count 1" in out.stdout and f"total {20 * 1024 * MiB}" in out.stdout, out.stdout + out.stderr


def test_a_local_job_runs_in_its_partition_and_its_tasks_join_the_lease(pool, slurm):
    """--gpupool=1x0.25:local (the pool's server on the job's node): the task gets the partition's
    CUDA_VISIBLE_DEVICES, not the shim, and its process is registered with the lease while it runs (so
    idle detection and the server's restart clean-up see it); the lease ends with the job."""
    job = slurm.sbatch("#!/bin/sh\necho cvd=$CUDA_VISIBLE_DEVICES worker=$GPUPOOL_WORKER pid=$$\nsleep 4\n",
                       "--gpupool=1x0.25:local")  # fmt: skip
    slurm.wait_state(job, {"RUNNING"}, 30)
    lease = wait_for(
        lambda: (x := job_lease(pool, job)) and x["pids"] and x, 15, what="the task's pid on the lease"
    )
    out = wait_for(lambda: "pid=" in slurm.output(job) and slurm.output(job), 10, what="the job's first line")
    assert f"pid={lease['pids'][0]}" in out
    assert f"cvd={lease['partitions'][0]['gpu_uuid']}" in out and "worker= " in out
    assert slurm.wait_state(job, {"COMPLETED", "FAILED"}, 30) == "COMPLETED"
    wait_for(lambda: job_lease(pool, job)["state"] == "released", 10, what="the local lease to end")


def test_licenses_queue_jobs_in_slurm_while_the_pool_is_full(pool, slurm):
    """With Licenses=gpupool:2, a job asking -L gpupool:1 waits in slurmctld's queue (Reason=Licenses)
    while another holds both, then runs on its own lease: it does not start only to wait in its Prolog."""
    first = slurm.sbatch("#!/bin/sh\nsleep 4\n", "--gpupool=1x0.5", "-L", "gpupool:2")
    slurm.wait_state(first, {"RUNNING"}, 30)
    second = slurm.sbatch("#!/bin/sh\necho lease=$GPUPOOL_LEASE\n", "--gpupool=1x0.5", "-L", "gpupool:1")
    time.sleep(1.5)
    shown = slurm.run("squeue", "-h", "-j", second, "-o", "%T %r").stdout.split()
    assert shown == ["PENDING", "Licenses"] and job_lease(pool, second) is None
    assert slurm.wait_state(second, {"COMPLETED", "FAILED"}, 60) == "COMPLETED", slurm.output(second)
    assert f"lease={job_lease(pool, second)['id']}" in slurm.output(second)


def test_a_cancelled_jobs_lease_is_released_within_seconds(pool, slurm):
    """scancel of a running job: the Epilog releases its lease within seconds (not a TTL later)."""
    job = slurm.sbatch("#!/bin/sh\nsleep 300\n", "--gpupool=1x0.25")
    slurm.wait_state(job, {"RUNNING"}, 30)
    lease = wait_for(lambda: job_lease(pool, job), 10, what="the job's lease")
    assert lease["state"] == "active"
    slurm.run("scancel", job)
    start = time.monotonic()
    wait_for(lambda: job_lease(pool, job)["state"] != "active", 15, what="the cancelled job's lease to end")
    assert job_lease(pool, job)["state"] == "released"
    assert time.monotonic() - start < 15
    assert slurm.wait_state(job, {"CANCELLED"}, 15) == "CANCELLED"


def test_a_job_over_the_clients_limit_fails_with_the_pools_message(pool, slurm):
    """--gpupool=2 (two whole GPUs) for a client with a limit of 1.5: no lease; the job fails and its
    output carries the pool's refusal; the node stays up for the next job."""
    job = slurm.sbatch("#!/bin/sh\necho the task ran\n", "--gpupool=2")
    assert slurm.wait_state(job, {"COMPLETED", "FAILED"}, 30) == "FAILED"
    out = slurm.output(job)
    assert "gpupool: error:" in out and "limit of 1.50" in out, out
    assert "the task ran" not in out
    assert slurm.run("sinfo", "-h", "-N", "-o", "%t").stdout.strip() in ("idle", "mix", "alloc")


def test_a_size_out_of_range_fails_the_job_with_the_range(pool, slurm):
    """--gpupool=1x0.001 is below the smallest partition: the job fails naming the pool's range."""
    job = slurm.sbatch("#!/bin/sh\necho the task ran\n", "--gpupool=1x0.001")
    assert slurm.wait_state(job, {"COMPLETED", "FAILED"}, 30) == "FAILED"
    assert "out of range (0.015625-1)" in slurm.output(job), slurm.output(job)


def test_gpupool_on_a_step_inside_a_job_is_said_to_be_ignored(pool, slurm):
    """srun --gpupool inside a batch job takes no second lease: the step runs on the job's lease, and
    srun says that its option is ignored."""
    script = f"#!/bin/sh\nsrun --gpupool=1x0.25 {sys.executable} {ROOT}/tests/remote_client.py devices\n"
    job = slurm.sbatch(script, "--gpupool=1x0.5")
    assert slurm.wait_state(job, {"COMPLETED", "FAILED"}, 60) == "COMPLETED", slurm.output(job)
    out = slurm.output(job)
    assert "is ignored" in out and f"total {40 * 1024 * MiB}" in out, out  # the job's half GPU
    assert len([x for x in leases(pool) if (x.get("job") or {}).get("id") == job]) == 1


def test_a_malformed_request_is_refused_at_submission(slurm):
    """sbatch --gpupool=half: refused by the plugin before a job exists, with the form to use."""
    out = slurm.run("sbatch", "--gpupool=half", "--wrap", "true", check=False)
    assert out.returncode != 0 and "N[xP][:local]" in out.stderr


def test_a_job_without_gpupool_takes_no_lease(pool, slurm):
    """A job that does not ask for pooled GPUs runs as before: no lease, no shim in its environment."""
    job = slurm.sbatch("#!/bin/sh\necho ld=$LD_LIBRARY_PATH lease=$GPUPOOL_LEASE\n")
    assert slurm.wait_state(job, {"COMPLETED", "FAILED"}, 30) == "COMPLETED"
    assert "lease=\n" in slurm.output(job) and "gpupool" not in slurm.output(job)
    assert job_lease(pool, job) is None


def test_gpu_hours_per_job_and_account_from_the_pool_events(pool, slurm):
    """The pool's events carry the Slurm job id and account: the audit reports GPU-hours per job and per
    account (a 0.5 lease held ~2 s is ~1 GPU-second)."""
    import analytics as A

    job = slurm.sbatch("#!/bin/sh\nsleep 2\n", "--gpupool=1x0.5", "--account=chemistry")
    assert slurm.wait_state(job, {"COMPLETED", "FAILED"}, 60) == "COMPLETED", slurm.output(job)
    wait_for(lambda: job_lease(pool, job)["state"] == "released", 10, what="the lease to end")

    def booked():
        try:
            by_job = {u.job_id: u for u in A.pool_usage_by_job(A.open_telemetry(pool.telemetry))}
        except A.TelemetryError:  # nothing written yet
            return None
        return by_job.get(job) if by_job.get(job) and by_job[job].gpu_hours > 0 else None

    usage = wait_for(booked, 10, what="the job's release event in the telemetry")
    assert usage.account == "chemistry" and usage.scheduler.startswith("slurm") and usage.leases == 1
    assert 0.5 * 2 / 3600 <= usage.gpu_hours < 0.5 * 30 / 3600
    accounts = {u.account: u for u in A.pool_usage_by_job(A.open_telemetry(pool.telemetry), by="account")}
    assert accounts["chemistry"].gpu_hours == pytest.approx(usage.gpu_hours)


def test_the_hook_driven_by_hand_runs_a_job_on_its_lease(pool, tmp_path):
    """Without Slurm (the GPU host): the hook run as Prolog, TaskProlog and Epilog by hand gives the
    command its lease's environment, books the lease to the job, and releases it at the end; a refusal
    comes back as the task's printed error."""
    env = {"GPUPOOL_SLURM_ENV": str(hook_settings(pool, tmp_path))}
    cmd = [sys.executable, f"{ROOT}/tests/remote_client.py", "devices"]
    result, printed = job_by_hand(HOOK, "900001", "1x0.25", cmd, account="by-hand", env=env, timeout=60)
    assert result.returncode == 0 and "count 1" in result.stdout, result.stderr + printed
    lease = job_lease(pool, "900001")
    assert lease["state"] == "released" and lease["job"]["account"] == "by-hand"
    assert lease["id"] in printed
    refused, printed = job_by_hand(HOOK, "900002", "2", cmd, env=env, timeout=60)
    assert refused.returncode != 0 and "limit of 1.50" in printed


@pytest.mark.slow
def test_a_job_past_its_time_limit_has_its_lease_released(pool, slurm):
    """sbatch --time=1 of a job that runs on: Slurm ends it at its limit (a minute, checked every 30 s)
    and the Epilog releases its lease."""
    job = slurm.sbatch("#!/bin/sh\nsleep 600\n", "--gpupool=1x0.25", "--time=1")
    slurm.wait_state(job, {"RUNNING"}, 30)
    assert wait_for(lambda: job_lease(pool, job), 10, what="the job's lease")["state"] == "active"
    assert slurm.wait_state(job, {"TIMEOUT"}, 150) == "TIMEOUT"
    wait_for(lambda: job_lease(pool, job)["state"] == "released", 15, what="the timed-out job's lease to end")


def test_a_pool_that_cannot_be_reached_fails_the_job_with_one_line(tmp_path):
    """The pool's server is down (or its address wrong): the Prolog exits 0 (a failing Prolog would drain
    the node) and the job's task fails with the client's one-line reason, no traceback."""
    from etcd_cluster import free_ports

    cfg = tmp_path / "client.toml"
    cfg.write_text(f'token = "gp_x"\nservers = ["127.0.0.1:{free_ports(1)[0]}"]\ntimeout = "1s"\n')
    settings = tmp_path / "slurm.env"
    settings.write_text(f"GPUPOOL_SLURM='{sys.executable} -m virtualize.client.slurm'\nGPUPOOL_CONFIG={cfg}\n"
                        f"GPUPOOL_SLURM_DIR={tmp_path / 'run'}\nPYTHONPATH={ROOT}\nexport PYTHONPATH\n")  # fmt: skip
    env = {"GPUPOOL_SLURM_ENV": str(settings)}
    cmd = [sys.executable, "-c", "print('the task ran')"]
    result, printed = job_by_hand(HOOK, "900003", "1x0.5", cmd, env=env, timeout=60)
    assert result.returncode != 0 and "the task ran" not in result.stdout
    assert printed.startswith("gpupool: error:") and "unreachable" in printed and "Traceback" not in printed
    assert not list((tmp_path / "run").glob("900003.*"))  # the Epilog left nothing behind


@pytest.mark.parametrize("step", ["prolog", "epilog"])
def test_the_prolog_and_epilog_never_fail_the_node(step, tmp_path):
    """Whatever goes wrong in gpupool-slurm (here its folder cannot be made), it exits 0, since Slurm
    drains a node whose Prolog or Epilog fails, and says what went wrong in one line on stderr."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    env = {**os.environ, "SLURM_JOB_ID": "900004", "SPANK_GPUPOOL": "1x0.5", "PYTHONPATH": str(ROOT),
           "GPUPOOL_SLURM_DIR": str(blocker / "run"), "GPUPOOL_CONFIG": str(tmp_path / "none.toml")}  # fmt: skip
    if step == "epilog":
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "900004.lease").write_text("not json")
        env["GPUPOOL_SLURM_DIR"] = str(tmp_path / "run")
    out = subprocess.run([sys.executable, "-m", "virtualize.client.slurm", step], env=env, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0 and "Traceback" not in out.stderr
    assert out.stderr.startswith("gpupool-slurm:") and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_a_lost_node_loses_its_lease_one_ttl_later(pool, tmp_path):
    """Node failure, simulated: the Prolog took the lease, then the node's keeper dies (kill -9) and no
    Epilog ever runs. The lease expires one TTL (5 s here) after its last heartbeat."""
    import json
    import signal

    settings = hook_settings(pool, tmp_path)
    env = {**os.environ, "GPUPOOL_SLURM_ENV": str(settings), "SLURM_JOB_ID": "900005", "SPANK_GPUPOOL": "1x0.25",
           "SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}  # fmt: skip
    subprocess.run([str(HOOK)], env=env, check=True, timeout=60)
    state = json.loads((tmp_path / "run" / "900005.lease").read_text())
    assert job_lease(pool, "900005")["state"] == "active"
    os.kill(state["keeper_pid"], signal.SIGKILL)
    lost = time.monotonic()
    lease = wait_for(
        lambda: (x := job_lease(pool, "900005"))["state"] != "active" and x, 15, what="the expiry"
    )
    assert lease["state"] == "expired" and time.monotonic() - lost < 12
