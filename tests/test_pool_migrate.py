"""`gpupool-server lease migrate` and POST /v1/admin/leases/{id}/migrate, end to end without a GPU: a
server on two simulated GPUs whose lease workers run the host executor, a program running under
`gpuattach run` through the shim, moved GPU 0 -> GPU 1 while it runs."""

from __future__ import annotations

import os
import subprocess

import pytest
from pool_harness import (
    ROOT,
    ServerProc,
    api,
    server_cmd,
    start_remote_program,
    wait_for,
)

pytestmark = [pytest.mark.timeout(120), pytest.mark.needs("native")]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProc(tmp_path_factory.mktemp("migrate"), "2xH100-80GB",
                     env={"GPUPOOL_WORKER_EXECUTOR": "host"}).start()  # fmt: skip
    yield srv
    srv.stop()


def migrate(server, *args: str, token: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    if token:
        env["GPUPOOL_TOKEN"] = token
    return subprocess.run([*server_cmd(), "lease", "migrate", *args, "--server", server.url], env=env,
                          capture_output=True, text=True, timeout=60, cwd=ROOT)  # fmt: skip


def partitions(server, admin: str, lease_id: str) -> list[int]:
    status, lease = api(server.url, "GET", f"/v1/leases/{lease_id}", admin)
    assert status == 200, lease
    return [p["gpu_index"] for p in lease["partitions"]]


def start_program(server, tmp_path, client: str, admin: str) -> tuple[subprocess.Popen, dict]:
    """tests/remote_client.py's `migrate` scenario under `gpuattach run`, once it holds its objects; its lease."""
    return start_remote_program(server, tmp_path, client, admin, "migrate")


def test_a_running_program_moves_to_another_gpu_and_finishes_there(server, tmp_path):
    """The admin command moves a running `gpuattach run` program's lease GPU 0 -> GPU 1: it prints the
    pause, the lease's partition is on GPU 1 from then on, and the program finishes with its memory and
    handles intact; a second move that cannot happen (the GPU it is on) is one error line, exit 2."""
    admin = server.token("ops", admin=True)
    run, lease = start_program(server, tmp_path, "mover", admin)
    try:
        source = partitions(server, admin, lease["id"])[0]
        target = 1 - source
        moved = migrate(server, lease["id"], "--to", str(target), token=admin)
        assert moved.returncode == 0, moved.stderr
        assert "paused" in moved.stdout
        assert partitions(server, admin, lease["id"]) == [target]
        again = migrate(server, lease["id"], "--to", str(target), token=admin)
        assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 2  # progress + the error
        assert "Traceback" not in again.stderr
        assert partitions(server, admin, lease["id"]) == [target]
        run.stdin.write("done\n")
        run.stdin.flush()
        out, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, out + err
    result = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    assert all(result[f"same_{name}"] == "True" for name in ("plain", "pooled", "vmm"))
    assert result["counter"] == "2" and result["finished"] == "1"
    wait_for(lambda: api(server.url, "GET", f"/v1/leases/{lease['id']}", admin)[1]["state"] != "active", 10,
             what="the lease to end with its program")  # fmt: skip


def test_bad_migrations_are_one_line_errors(server):
    """No token, a client token, an unknown lease and a local lease each give a clear error and exit 2;
    the API refuses a body out of range with 400."""
    admin, user = server.token("ops2", admin=True), server.token("someone")
    assert migrate(server, "lease-nope", "--to", "1", token=None).returncode == 2
    for token in (user, admin):
        refused = migrate(server, "lease-nope", "--to", "1", token=token)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr
        assert refused.stderr.strip().splitlines()[-1].startswith("gpupool-server: error:")
    status, local = api(server.url, "POST", "/v1/leases", server.token("local-one"), {"n": 1, "mem_mib": 256})
    assert status == 201, local
    refused = migrate(server, local["id"], "--to", "1", token=admin)  # its process holds the GPU state
    assert refused.returncode == 2 and "remote" in refused.stderr
    status, body = api(server.url, "POST", "/v1/admin/leases/x/migrate", admin, {"to": -1})
    assert status == 400, body
    for target in ("2000", "-1"):  # GPU indexes out of range
        refused = migrate(server, local["id"], "--to", target, token=admin)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1, (
            refused.stderr
        )  # refused before asking the server


def test_a_target_failing_mid_copy_leaves_the_lease_and_its_record_on_the_source(tmp_path):
    """When the target GPU fails during the copy, the command fails (exit 2, one error line), the
    lease's partition is still recorded on its source GPU, and the program finishes there intact."""
    srv = ServerProc(tmp_path / "state", "2xH100-80GB",
                     env={"GPUPOOL_WORKER_EXECUTOR": "host", "GPUPOOL_HOST_EXECUTOR_FAILING_GPUS": "0,1"}).start()  # fmt: skip
    try:
        admin = srv.token("ops", admin=True)
        run, lease = start_program(srv, tmp_path, "unlucky", admin)
        try:
            source = partitions(srv, admin, lease["id"])[0]
            failed = migrate(srv, lease["id"], "--to", str(1 - source), token=admin)
            assert failed.returncode == 2 and "Traceback" not in failed.stderr
            assert partitions(srv, admin, lease["id"]) == [source]
            out, err = run.communicate("done\n", timeout=60)
        finally:
            if run.poll() is None:
                run.kill()
        assert run.returncode == 0, out + err
        assert "same_plain True" in out and "finished 1" in out
    finally:
        srv.stop()


def test_drain_moves_remote_leases_off_a_gpu_and_stops_granting_there(tmp_path):
    """`gpupool-server drain --gpu G`: the running program's remote lease moves to the other GPU and
    finishes intact, a local lease on G stays (named, exit 1), no new lease goes to G (a two-GPU
    request is busy); `--undo` makes G take leases again."""
    srv = ServerProc(tmp_path / "state", "2xH100-80GB", env={"GPUPOOL_WORKER_EXECUTOR": "host"}).start()
    try:
        admin = srv.token("ops", admin=True)
        run, lease = start_program(srv, tmp_path, "drained", admin)
        try:
            gpu = partitions(srv, admin, lease["id"])[0]
            status, local = api(srv.url, "POST", "/v1/leases", srv.token("local"), {"n": 2, "mem_mib": 256})
            assert status == 201, local
            drained = drain(srv, "--gpu", str(gpu), token=admin)
            assert drained.returncode == 1, drained.stderr  # the local lease stayed
            assert local["id"] in drained.stdout and lease["id"] in drained.stdout
            assert partitions(srv, admin, lease["id"]) == [1 - gpu]
            _, view = api(srv.url, "GET", "/v1/gpus", admin)
            assert [g["draining"] for g in view["gpus"]] == [g["index"] == gpu for g in view["gpus"]]
            status, busy = api(srv.url, "POST", "/v1/leases", srv.token("late"), {"n": 2, "mem_mib": 256})
            assert status == 409, busy
            status, single = api(srv.url, "POST", "/v1/leases", srv.token("late1"), {"n": 1, "mem_mib": 256})
            assert status == 201 and [p["gpu_index"] for p in single["partitions"]] == [1 - gpu]
            undone = drain(srv, "--gpu", str(gpu), "--undo", token=admin)
            assert undone.returncode == 0, undone.stderr
            status, again = api(srv.url, "POST", "/v1/leases", srv.token("late2"), {"n": 2, "mem_mib": 256})
            assert status == 201, again
            out, err = run.communicate("done\n", timeout=60)
        finally:
            if run.poll() is None:
                run.kill()
        assert run.returncode == 0, out + err
        assert "same_plain True" in out and "finished 1" in out
        assert drain(srv, "--gpu", "7", token=admin).returncode == 2  # no such GPU: one error line
    finally:
        srv.stop()


def drain(server, *args: str, token: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env["GPUPOOL_TOKEN"] = token
    return subprocess.run([*server_cmd(), "drain", *args, "--server", server.url], env=env,
                          capture_output=True, text=True, timeout=60, cwd=ROOT)  # fmt: skip
