"""`gpupool-server lease migrate LEASE --to SERVER` between two real gpupool-servers on loopback (simulated
GPUs; the lease workers run the host executor), a program running under `gpuattach run` through the shim.

What is built of the move between servers (docs/remote.md, "Between servers"): the target admits the lease
and starts a receiving worker (one-time secret, bounded wait, then it exits and frees its GPU); the lease's
worker pauses the lease and sends its memory there over the link, where it lands at the same addresses; any
failure leaves the lease running on its source. The commit (objects re-created there, the processes
reconnecting) is not built: each move ends after the memory with that reason, and these tests prove that
nothing of the lease is lost on the way."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from pool_harness import ROOT, ServerProc, api, client_env, gpuattach_cmd, server_cmd, wait_for

pytestmark = [pytest.mark.timeout(120), pytest.mark.needs("native")]
CLIENT = "tests/remote_client.py"
HOST = {"GPUPOOL_WORKER_EXECUTOR": "host"}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    base = tmp_path_factory.mktemp("xmove")
    a = ServerProc(base / "a", "2xH100-80GB", env=HOST).start()
    b = ServerProc(base / "b", "2xH100-80GB", env=HOST).start()
    yield a, b
    a.stop()
    b.stop()


def admin_of(*servers: ServerProc) -> str:
    """One admin token that every server takes (the source asks the target with the operator's token)."""
    token = servers[0].token("ops", admin=True)
    for other in servers[1:]:
        other.token("ops", admin=True, token=token)
    return token


def migrate(source: ServerProc, *args: str, token: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    if token:
        env["GPUPOOL_TOKEN"] = token
    return subprocess.run([*server_cmd(), "lease", "migrate", *args, "--server", source.url], env=env,
                          capture_output=True, text=True, timeout=90, cwd=ROOT)  # fmt: skip


def start_program(server: ServerProc, tmp_path, client: str, admin: str) -> tuple[subprocess.Popen, dict]:
    """tests/remote_client.py's `migrate` scenario (every object kind, patterned memory) under `gpuattach run`
    on `server`, once it holds its objects; its lease."""
    env = client_env(tmp_path, [server.url], server.token(client))
    run = subprocess.Popen([*gpuattach_cmd(), "run", "-n", "1", "-m", "256", "--", sys.executable, CLIENT, "migrate"],
                           env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, cwd=ROOT)  # fmt: skip
    for line in run.stdout:
        assert not line.startswith("FAILED"), line
        if line.startswith("ready"):
            break
    else:
        raise AssertionError(f"the program ended before it was ready: {run.stderr.read()}")
    _, leases = api(server.url, "GET", "/v1/leases?all=true", admin)
    (lease,) = [lease for lease in leases["leases"] if lease["client"] == client]
    return run, lease


def finishes_intact(run: subprocess.Popen) -> None:
    """The program goes on after the attempt and finds every address holding its bytes, every handle working."""
    try:
        out, err = run.communicate("done\n", timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, out + err
    result = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    assert all(result[f"same_{name}"] == "True" for name in ("plain", "pooled", "vmm")), out
    assert result["finished"] == "1", out


def one_error(out: subprocess.CompletedProcess) -> str:
    """Exit 2, no traceback, one error line (after the progress line); that line."""
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("gpupool-server: error:")]
    assert len(errors) == 1, out.stderr
    return errors[0]


def nothing_held(server: ServerProc, admin: str, lease_id: str) -> bool:
    """The server holds nothing for the lease: its record there (if any) ended, no GPU memory counted for it."""
    status, lease = api(server.url, "GET", f"/v1/leases/{lease_id}", admin)
    _, gpus = api(server.url, "GET", "/v1/gpus", admin)
    held = [p for g in gpus["gpus"] for p in g["partitions"] if p["lease_id"] == lease_id]
    return (status == 404 or lease["state"] != "active") and not held


def test_the_memory_reaches_the_target_and_the_lease_runs_on_where_it_was(pair, tmp_path):
    """A running program's lease on A, moved --to B: B admits it and its receiving worker takes the lease's
    memory and re-creates its objects from their records (B's log says so); the move ends with the reason it cannot complete yet (exit 2, one line), B
    holds nothing of the lease afterwards (and admits it again for a second try), A still has it active on
    the same GPU, and the program finishes with every byte and handle intact."""
    a, b = pair
    admin = admin_of(a, b)
    run, lease = start_program(a, tmp_path, "mover", admin)
    try:
        before = [p["gpu_index"] for p in lease["partitions"]]
        seen = b.log.read_text() if b.log.exists() else ""
        moved = migrate(a, lease["id"], "--to", b.url.removeprefix("http://"), token=admin)
        assert "not built yet" in one_error(moved)
        arrived = (b.log.read_text())[len(seen) :]
        assert "holding the lease's memory" in arrived, arrived[-3000:]
        assert "holding the lease's objects" in arrived, arrived[-3000:]  # re-created from the records
        wait_for(lambda: nothing_held(b, admin, lease["id"]), 15, what="B to give the admission back")
        again = migrate(a, lease["id"], "--to", b.url, token=admin)  # B admits it again after the first ended
        assert "not built yet" in one_error(again)
        wait_for(lambda: nothing_held(b, admin, lease["id"]), 15, what="B to give the admission back")
        _, now = api(a.url, "GET", f"/v1/leases/{lease['id']}", admin)
        assert now["state"] == "active" and [p["gpu_index"] for p in now["partitions"]] == before
    except BaseException:
        run.kill()
        raise
    finishes_intact(run)


def test_a_receiving_worker_that_dies_mid_copy_leaves_the_lease_on_its_source(tmp_path):
    """The target's receiving worker dies after the first MiB of the lease's memory (as if killed): the move
    fails naming the broken link (exit 2, one line), the target's admission ends and frees its GPU, and the
    program runs on at its source and finishes intact."""
    a = ServerProc(tmp_path / "a", "2xH100-80GB", env=HOST).start()
    b = ServerProc(tmp_path / "b", "2xH100-80GB",
                   env={**HOST, "GPUPOOL_TEST_RECEIVER_DIES_AFTER_BYTES": str(1 << 20)}).start()  # fmt: skip
    try:
        admin = admin_of(a, b)
        run, lease = start_program(a, tmp_path, "unlucky", admin)
        try:
            failed = migrate(a, lease["id"], "--to", b.url, token=admin)
            assert "link" in one_error(failed)
            wait_for(lambda: nothing_held(b, admin, lease["id"]), 15, what="B to free the dead worker's GPU")
            assert api(a.url, "GET", f"/v1/leases/{lease['id']}", admin)[1]["state"] == "active"
        except BaseException:
            run.kill()
            raise
        finishes_intact(run)
    finally:
        a.stop()
        b.stop()


def test_an_admission_nobody_sends_to_ends_by_itself_and_frees_its_gpu(pair):
    """POST /v1/admin/leases/{id}/receive admits the lease on a GPU of its model (the room counted, the
    receiving worker's port and one-time secret answered); when no sender comes within wait_s the worker
    exits and the record ends, its room free again. A wrong secret on the link is refused."""
    from virtualize.server import _migrate_link

    _, b = pair
    admin = admin_of(b)
    body = {"client": "someone", "source": "elsewhere", "secret": "s" * 32, "ttl_s": 600, "wait_s": 2,
            "partitions": [{"mem_bytes": 1 << 30, "gpu_name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}]}  # fmt: skip
    status, model = api(b.url, "GET", "/v1/gpus", admin)
    body["partitions"][0]["gpu_name"] = model["gpus"][0]["name"]
    body["partitions"][0]["compute_capability"] = model["gpus"][0]["compute_capability"]
    status, receiving = api(b.url, "POST", "/v1/admin/leases/lease-0000feedbeef/receive", admin, body)
    assert status == 200, receiving
    _, lease = api(b.url, "GET", "/v1/leases/lease-0000feedbeef", admin)
    assert lease["state"] == "active" and lease["partitions"][0]["gpu_index"] == receiving["gpus"][0]
    worker = receiving["worker"]
    with pytest.raises(_migrate_link.LinkError):  # a sender without the one-time secret
        _migrate_link.connect(worker["host"], worker["migrate_port"], worker["tls_sha256"], b"wrong", 5)
    assert forged_proof_answer(worker) == {
        "ok": False
    }  # the receiving worker checks the sender's proof itself
    status, again = api(b.url, "POST", "/v1/admin/leases/lease-0000feedbeef/receive", admin, body)
    assert status == 422, again  # one active record per lease id
    wait_for(lambda: nothing_held(b, admin, "lease-0000feedbeef"), 15, what="the unused admission to end")


def forged_proof_answer(worker: dict) -> dict:
    """What the receiving worker answers a sender that ignores its proof and sends a made-up one."""
    import socket
    import ssl

    from virtualize.server import _migrate_link

    sock = socket.create_connection((worker["host"], worker["migrate_port"]), timeout=5)
    if worker["tls_sha256"]:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        sock = context.wrap_socket(sock)
    with _migrate_link.Link(sock) as link:
        link.send({"hello": "00" * 32})
        link.receive()
        link.send({"proof": "00" * 32})
        return link.receive()


def test_moves_that_cannot_start_are_one_line_errors_and_change_nothing(pair, tmp_path):
    """--to the lease's own server, to a server that is not there, a local lease, a target with no GPU of the
    lease's model free (draining), and an API body naming both a GPU and a server: each is refused with a
    clear error, and the lease stays active where it was."""
    a, b = pair
    admin = admin_of(a, b)
    status, local = api(a.url, "POST", "/v1/leases", a.token("local-two"), {"n": 1, "mem_mib": 256})
    assert status == 201, local
    assert "remote" in one_error(migrate(a, local["id"], "--to", b.url, token=admin))
    run, lease = start_program(a, tmp_path, "stays", admin)
    try:
        assert "this server" in one_error(migrate(a, lease["id"], "--to", a.url, token=admin))
        one_error(migrate(a, lease["id"], "--to", "127.0.0.1:9", token=admin))  # nothing listens there
        status, _ = api(b.url, "POST", "/v1/admin/drain", admin)
        assert status == 200
        try:
            assert "draining" in one_error(migrate(a, lease["id"], "--to", b.url, token=admin))
        finally:
            api(b.url, "DELETE", "/v1/admin/drain", admin)
        status, body = api(
            a.url, "POST", f"/v1/admin/leases/{lease['id']}/migrate", admin, {"to": 1, "server": b.url}
        )
        assert status == 400, body
        assert api(a.url, "GET", f"/v1/leases/{lease['id']}", admin)[1]["state"] == "active"
    except BaseException:
        run.kill()
        raise
    finishes_intact(run)


def test_what_cannot_leave_its_host_is_refused_before_the_target_is_asked(pair, tmp_path):
    """A stream capture in flight, then a green context (a partition of this GPU's SMs): each move --to B is
    refused with its reason (exit 2, one line) before B is asked (B has no record of the lease), and the
    program goes on and finishes intact."""
    a, b = pair
    admin = admin_of(a, b)
    run, lease = start_program(a, tmp_path, "rooted", admin)
    try:
        run.stdin.write("capture\n")
        run.stdin.flush()
        assert run.stdout.readline().startswith("capturing")
        assert "capture" in one_error(migrate(a, lease["id"], "--to", b.url, token=admin))
        run.stdin.write("end\n")  # ends the capture
        run.stdin.flush()
        assert run.stdout.readline().startswith("step")
        run.stdin.write("green\n")
        run.stdin.flush()
        assert run.stdout.readline().startswith("step")
        assert "green contexts" in one_error(migrate(a, lease["id"], "--to", b.url, token=admin))
        assert api(b.url, "GET", f"/v1/leases/{lease['id']}", admin)[0] == 404
        assert api(a.url, "GET", f"/v1/leases/{lease['id']}", admin)[1]["state"] == "active"
    except BaseException:
        run.kill()
        raise
    finishes_intact(run)
