"""`gpupool-server drain [SERVER]` and POST/DELETE /v1/admin/drain against real gpupool-server processes on
loopback (simulated GPUs; the remote lease's worker runs the host executor): a drained server grants nothing
new, says so, lists the leases still running on it with why each stays, and grants again after --undo."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from pool_harness import ROOT, ServerProc, api, env_for, gpuattach, server_cmd

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    base = tmp_path_factory.mktemp("drainpool")
    a = ServerProc(base / "a", "2xH100-80GB", env={"GPUPOOL_WORKER_EXECUTOR": "host"}).start()
    b = ServerProc(base / "b", "2xH100-80GB").start()
    yield a, b
    a.stop()
    b.stop()


def drain(*args: str, token: str | None, command: str = "drain") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    if token:
        env["GPUPOOL_TOKEN"] = token
    return subprocess.run([*server_cmd(), command, *args], env=env, capture_output=True, text=True, timeout=60,
                          cwd=ROOT)  # fmt: skip


def one_error_line(out: subprocess.CompletedProcess) -> None:
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    assert len([line for line in out.stderr.splitlines() if "error" in line]) == 1, out.stderr


def test_a_drained_server_grants_nothing_new_and_clients_take_another_server(pool, tmp_path):
    """Draining server A (named host:port) lists its running local and remote leases as staying (exit 1),
    leaves them running, answers new requests busy naming the drain, shows itself and its GPUs draining,
    and gpuattach takes server B although A is the tighter fit; `undrain` makes A grant again."""
    a, b = pool
    admin = a.token("ops", admin=True)
    status, local = api(a.url, "POST", "/v1/leases", a.token("holder"), {"n": 2, "fraction": 0.5})
    assert status == 201, local
    status, remote = api(
        a.url, "POST", "/v1/leases", a.token("remote"), {"n": 1, "mem_mib": 256, "remote": True}
    )
    assert status == 201, remote
    address = a.url.removeprefix("http://")
    try:
        drained = drain(address, token=admin)
        assert drained.returncode == 1, drained.stdout + drained.stderr
        assert local["id"] in drained.stdout and remote["id"] in drained.stdout
        assert "Traceback" not in drained.stderr
        status, health = api(a.url, "GET", "/v1/health")
        assert status == 200 and health["server"]["draining"] is True
        _, view = api(a.url, "GET", "/v1/gpus", admin)
        assert all(g["draining"] for g in view["gpus"])
        for lease in (local, remote):
            assert api(a.url, "GET", f"/v1/leases/{lease['id']}", admin)[1]["state"] == "active"
        status, refused = api(a.url, "POST", "/v1/leases", a.token("late"), {"n": 1, "fraction": 0.25})
        assert status == 409 and refused["code"] == "busy" and "draining" in refused["error"], refused

        env, token = env_for(tmp_path, [a, b], "elsewhere")
        listed = gpuattach("servers", env=env)  # what a user sees: which server grants nothing now, and why
        assert listed.returncode == 0, listed.stderr
        rows = {line.split()[0]: line for line in listed.stdout.splitlines()[1:]}
        assert "draining" in rows[address] and "draining" not in rows[b.url.removeprefix("http://")], (
            listed.stdout
        )
        code = "import os; print(os.environ['GPUPOOL_LEASE_ID'])"
        ran = gpuattach("run", "-n", "1", "-p", "0.25", "--local", "--", sys.executable, "-c", code, env=env)
        assert ran.returncode == 0, ran.stderr
        lease_id = ran.stdout.split()[-1]
        assert api(b.url, "GET", f"/v1/leases/{lease_id}", token)[0] == 200
        assert api(a.url, "GET", f"/v1/leases/{lease_id}", token)[0] == 404

        undone = drain(a.url, token=admin, command="undrain")
        assert undone.returncode == 0, undone.stdout + undone.stderr
        assert api(a.url, "GET", "/v1/health")[1]["server"]["draining"] is False
        status, again = api(a.url, "POST", "/v1/leases", a.token("late2"), {"n": 1, "fraction": 0.25})
        assert status == 201, again
        api(a.url, "DELETE", f"/v1/leases/{again['id']}", a.token("late2"))
    finally:
        drain(a.url, "--undo", token=admin)
        for lease, client in ((local, "holder"), (remote, "remote")):
            api(a.url, "DELETE", f"/v1/leases/{lease['id']}", a.token(client))


def test_drain_wait_returns_once_the_last_lease_ends_or_fails_when_the_time_is_up(pool):
    """`drain SERVER --wait D` names each lease as it ends and exits 0 once none runs on the server; with a
    lease that outlives the wait it exits 1 naming it; the drained server's leases run on meanwhile."""
    a, _ = pool
    admin = a.token("ops", admin=True)
    holder = a.token("waited")
    leases = [api(a.url, "POST", "/v1/leases", holder, {"n": 1, "fraction": 0.25})[1]["id"] for _ in range(2)]
    try:
        short = drain(a.url, "--wait", "1s", token=admin)
        assert short.returncode == 1, short.stdout + short.stderr
        assert all(lease in short.stderr.splitlines()[-1] for lease in leases)
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")} | {"GPUPOOL_TOKEN": admin}
        waiting = subprocess.Popen([*server_cmd(), "drain", a.url, "--wait", "60s"], env=env, cwd=ROOT,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        try:
            first = waiting.stderr.readline()  # the progress line: the drain listed both leases
            while first and not first.startswith("waiting"):
                first = waiting.stderr.readline()
            assert first.startswith("waiting"), waiting.stdout.read()
            for lease in leases:
                assert api(a.url, "GET", f"/v1/leases/{lease}", holder)[1]["state"] == "active"
                assert waiting.poll() is None  # still waiting while a lease runs
                assert api(a.url, "DELETE", f"/v1/leases/{lease}", holder)[0] == 200
            out, err = waiting.communicate(timeout=30)
        finally:
            if waiting.poll() is None:
                waiting.kill()
        assert waiting.returncode == 0, out + err
        assert all(f"{lease} ended" in err for lease in leases)
    finally:
        drain(a.url, "--undo", token=admin)
        for lease in leases:
            api(a.url, "DELETE", f"/v1/leases/{lease}", holder)


def test_draining_through_the_api_needs_an_admin_token(pool):
    """POST /v1/admin/drain with a client token is refused (403) and the server keeps granting."""
    a, _ = pool
    client = a.token("notadmin")
    status, body = api(a.url, "POST", "/v1/admin/drain", client)
    assert status == 403, body
    assert api(a.url, "GET", "/v1/health")[1]["server"]["draining"] is False


def test_bad_drain_requests_are_one_line_errors(pool):
    """The server given twice, an unparsable SERVER, an unreachable one, no admin token, or --cluster without
    SERVER: each is one error line and exit 2, and nothing drains."""
    a, _ = pool
    admin = a.token("ops", admin=True)
    one_error_line(drain(a.url, "--server", a.url, token=admin))
    one_error_line(drain("ftp://gpu1:1", token=admin))
    one_error_line(drain("127.0.0.1:1", token=admin))
    one_error_line(drain(a.url, token=None))
    one_error_line(drain("--cluster", "etcd://127.0.0.1:1", token=admin))
    one_error_line(drain(a.url, "--gpu", "0", "--wait", "1m", token=admin))
    one_error_line(drain(a.url, "--wait", "soon", token=admin))
    assert api(a.url, "GET", "/v1/health")[1]["server"]["draining"] is False
