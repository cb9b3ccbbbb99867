"""The control plane's remote-execution hook, end to end without a GPU.

The server runs on simulated GPUs with ``GPUPOOL_WORKER_EXECUTOR=host``: its lease workers (the
remote-execution component's ``virtualize/server/worker.py``) serve CUDA calls from host memory, so
``gpuattach run`` without ``--local`` drives the real path: lease with a worker, the shim in the
command's environment, heartbeats, release stopping the worker, idle reclaim from the worker's
activity, a dying worker ending its lease.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from pool_harness import ServerProc, api, client_env, gpuattach, wait_for
from raw_wire_client import connect_local, handshake

from virtualize.common._results import CUresult

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.needs("native"),
]
CLIENT = "tests/remote_client.py"
ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    config = '[policy]\nreap_interval = 0.2\n[clients.idle-remote]\nidle_timeout = "1.5s"\n'
    srv = ServerProc(
        tmp_path_factory.mktemp("remote"),
        "2xH100-80GB",
        config=config,
        env={"GPUPOOL_WORKER_EXECUTOR": "host"},
    ).start()
    yield srv
    srv.stop()


def workers_of(server) -> list[psutil.Process]:
    """The server's live worker processes. A worker that has exited is a zombie for the moment between
    its exit and the server's wait() that reaps it: that one is gone, not live."""
    live = []
    for p in psutil.Process(server.proc.pid).children():
        try:
            if p.status() != psutil.STATUS_ZOMBIE and "virtualize.server.worker" in " ".join(p.cmdline()):
                live.append(p)
        except (psutil.ZombieProcess, psutil.NoSuchProcess):
            pass
    return live


def test_gpuattach_run_executes_remotely_and_the_worker_goes_with_the_lease(server, tmp_path):
    env = client_env(tmp_path, [server.url], server.token("remote-run"))
    out = gpuattach(
        "run", "-n", "2", "-m", "2048", "--", sys.executable, CLIENT, "devices", env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr
    got = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    assert got["count"] == "2" and got["total"] == str(2048 * MiB)  # the partition, not the 80 GB GPU
    assert "advisory" not in out.stderr
    wait_for(lambda: not workers_of(server), 10, what="the worker to stop with the lease")


def test_gpuattach_run_isolate_gives_each_process_a_worker_that_goes_with_the_lease(server, tmp_path):
    """`gpuattach run --isolate` through the pool server: a child process's device-side assert leaves its
    parent working, the two share the lease's partition, and no worker process of the lease outlives it."""
    env = client_env(tmp_path, [server.url], server.token("isolate-run"))
    out = gpuattach("run", "--isolate", "-n", "1", "-m", "1280", "--", sys.executable, CLIENT,
                    "trap_in_a_child_process", env={**env, "PARTITION_MIB": "1280"}, timeout=90)  # fmt: skip
    assert out.returncode == 0, out.stderr
    got = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    assert got["child_alloc_past_the_rest"] == "2" and got["child_sync_after_trap"] == "710", (
        out.stdout + out.stderr
    )
    assert got["parent_sync"] == got["parent_sync_after_launch"] == "0" and got["parent_alloc_most"] == "0"

    def lease_processes() -> list:
        found = []
        for p in psutil.Process(server.proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if p.status() != psutil.STATUS_ZOMBIE and "virtualize.server.worker" in " ".join(p.cmdline()):
                    found.append(p)
        return found

    wait_for(lambda: not lease_processes(), 15, what="the lease's worker and its process workers to stop")


def test_a_client_on_the_gpu_server_uses_the_local_socket_and_encrypts_when_told_to(server, tmp_path):
    """The lease answer carries what the shim needs for both: the worker's local socket and the
    fingerprint of its certificate (as a client on another host would use it)."""
    env = client_env(tmp_path, [server.url], server.token("local-or-tls"))
    start = server.log.stat().st_size

    def worker_log() -> str:
        return server.log.read_bytes()[start:].decode(errors="replace")

    for extra, how in (
        ({}, "connected (local socket)"),
        ({"GPUPOOL_DATA_ENCRYPTION": "always"}, "connected (TLSv1.3)"),
    ):
        out = gpuattach("run", "-n", "1", "-m", "64", "--", sys.executable, CLIENT, "copies",
                        env={**env, **extra}, timeout=60)  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert "htod_dtoh True" in out.stdout
        wait_for(lambda how=how: how in worker_log(), 10, what=how)
    assert "unencrypted, this host" not in worker_log()


def test_lease_answer_carries_the_worker_and_release_stops_it(server):
    tok = server.token("remote-api")
    status, lease = api(server.url, "POST", "/v1/leases", tok, {"n": 1, "mem_mib": 64, "remote": True})
    assert status == 201 and lease["remote"] and lease["simulated"]
    w = lease["worker"]
    assert w["host"] == "127.0.0.1" and w["port"] > 0 and len(w["secret"]) > 20
    assert len(workers_of(server)) == 1
    api(server.url, "DELETE", f"/v1/leases/{lease['id']}", tok)
    wait_for(lambda: not workers_of(server), 10, what="the worker to stop")


def test_a_client_with_a_valid_token_cannot_join_another_clients_lease(server, tmp_path):
    from virtualize.client.remote import remote_env

    mine, theirs = server.token("lease-owner"), server.token("other-client")
    _, lease = api(server.url, "POST", "/v1/leases", mine, {"n": 1, "mem_mib": 64, "remote": True})
    _, other = api(server.url, "POST", "/v1/leases", theirs, {"n": 1, "mem_mib": 64, "remote": True})
    status, seen = api(server.url, "GET", f"/v1/leases/{lease['id']}", theirs)
    assert status in (403, 404) and "secret" not in str(seen)  # the API does not hand it out
    # The other client points its own lease's answer at this lease's worker, by its TCP port or by its
    # local socket (whose name any process on the host can read in /proc/net/unix): refused at the handshake.
    for way in ({"port": lease["worker"]["port"], "local": ""}, {"local": lease["worker"]["local"]}):
        forged = {"id": other["id"], "worker": {**other["worker"], **way}}
        env = {
            **client_env(tmp_path, [server.url], theirs),
            **remote_env(forged, cache_root=tmp_path / "cache"),
        }
        out = subprocess.run([sys.executable, CLIENT, "no_lease"], env=env, capture_output=True, text=True,
                             timeout=60, cwd=ROOT)  # fmt: skip
        assert out.stdout.split() == ["init", "800", "count", "800"], out.stdout + out.stderr
        assert "do not share the lease's secret" in out.stderr
    # The shim above gives up as soon as the worker cannot prove the secret. A client that does not check
    # the worker (written by hand) goes on to prove its own lease's secret: the worker itself refuses it,
    # on either way in, and closes the connection before any call.
    target = lease["worker"]
    for sock in (socket.create_connection((target["host"], target["port"]), timeout=10),
                 connect_local(target["local"])):  # fmt: skip
        with sock:
            assert handshake(sock, other["worker"]["secret"].encode()) == CUresult.NOT_PERMITTED
            assert sock.recv(64) == b""
    with socket.create_connection(
        (target["host"], target["port"]), timeout=10
    ) as sock:  # the owner is served
        assert handshake(sock, lease["worker"]["secret"].encode()) == CUresult.SUCCESS
    for tok, held in ((mine, lease), (theirs, other)):
        api(server.url, "DELETE", f"/v1/leases/{held['id']}", tok)
    wait_for(lambda: not workers_of(server), 10, what="the workers to stop")


def test_a_dying_worker_ends_its_lease(server):
    tok = server.token("remote-dies")
    _, lease = api(server.url, "POST", "/v1/leases", tok, {"n": 1, "mem_mib": 64, "remote": True})
    (worker,) = workers_of(server)
    worker.kill()
    got = wait_for(
        lambda: (g := api(server.url, "GET", f"/v1/leases/{lease['id']}", tok)[1])["state"] != "active" and g,
        10,
        what="lease end",
    )
    assert got["state"] == "expired" and got["reason"] == "its remote worker exited"


def test_a_worker_that_exits_is_reaped_at_once_and_its_lease_ends(tmp_path):
    """With a sweep only every minute, a killed worker still ends its lease within seconds, leaving no zombie."""
    srv = ServerProc(tmp_path, "1xH100-80GB", config="[policy]\nreap_interval = 60\n",
                     env={"GPUPOOL_WORKER_EXECUTOR": "host"}).start()  # fmt: skip
    try:
        tok = srv.token("remote-exits")
        _, lease = api(srv.url, "POST", "/v1/leases", tok, {"n": 1, "mem_mib": 64, "remote": True})
        (worker,) = workers_of(srv)
        started = time.monotonic()
        worker.kill()
        got = wait_for(
            lambda: (
                (g := api(srv.url, "GET", f"/v1/leases/{lease['id']}", tok)[1])["state"] != "active" and g
            ),
            10,
            what="lease end",
        )
        assert got["reason"] == "its remote worker exited"
        assert time.monotonic() - started < 10  # not the minute of the sweep
        children = psutil.Process(srv.proc.pid).children()
        assert not [p for p in children if p.pid == worker.pid]  # reaped: not even a zombie
    finally:
        srv.stop()


def test_idle_remote_lease_is_reclaimed_from_the_worker_activity(server):
    tok = server.token("idle-remote")
    _, lease = api(server.url, "POST", "/v1/leases", tok, {"n": 1, "mem_mib": 64, "remote": True})
    start = time.monotonic()
    got = wait_for(
        lambda: (g := api(server.url, "GET", f"/v1/leases/{lease['id']}", tok)[1])["state"] != "active" and g,
        10,
        what="reclaim",
    )
    assert got["state"] == "reclaimed" and "idle for" in got["reason"] and time.monotonic() - start >= 1.0
    wait_for(lambda: not workers_of(server), 10, what="the worker to stop")
