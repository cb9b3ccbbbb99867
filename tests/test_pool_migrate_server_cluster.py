"""A move to another server in cluster mode (a real etcd, two gpupool-server members on loopback, simulated
GPUs, host-executor workers): `lease migrate --to MEMBER --cluster`, and the client's cluster-wide usage
through it. The target's admission is not a lease of the cluster until the move commits; then the lease's
record is the target's: the lease is counted once throughout, and its release (asked where it was granted)
gives its share back."""

from __future__ import annotations

import contextlib
import os
import subprocess

import pytest
from pool_harness import ROOT, ServerProc, api, server_cmd, wait_for

from tests.etcd_cluster import EtcdCluster

pytestmark = [pytest.mark.needs("etcd"), pytest.mark.needs("native"), pytest.mark.timeout(120)]
HOST = {"GPUPOOL_WORKER_EXECUTOR": "host"}


def cli(*args: str, token: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    if token:
        env["GPUPOOL_TOKEN"] = token
    return subprocess.run(
        [*server_cmd(), *args], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT
    )


def usage(server: ServerProc, admin: str, client: str) -> float:
    status, body = api(server.url, "GET", "/v1/admin/clients", admin)
    assert status == 200, body
    return next((c["usage"] for c in body["clients"] if c["client"] == client), 0.0)


@contextlib.contextmanager
def two_members(tmp_path):
    """A real etcd and two gpupool-server members of its cluster (two simulated GPUs each, host-executor
    workers), both registered: (etcd, a, b, an admin token both take)."""
    (tmp_path / "etcd").mkdir()
    etcd = EtcdCluster(tmp_path / "etcd", size=1)
    etcd.start()
    servers = []
    try:
        for name in ("a", "b"):
            extra = ("--cluster", etcd.url, "--cluster-ttl", "3s")
            servers.append(ServerProc(tmp_path / name, "2xH100-80GB", extra=extra, env=HOST).start())
        wait_for(lambda: all(api(s.url, "GET", "/v1/health")[1]["cluster"]["registered"] for s in servers), 15,
                 what="both servers registered")  # fmt: skip
        made = cli("token", "create", "root", "--admin", "--cluster", etcd.url)
        assert made.returncode == 0, made.stderr
        yield etcd, servers[0], servers[1], made.stdout.strip()
    finally:
        for s in servers:
            s.stop()
        etcd.stop()


def member_name(etcd, server: ServerProc) -> str:
    members = cli("cluster", "members", "--cluster", etcd.url)
    return next(line.split()[0] for line in members.stdout.splitlines() if str(server.port) in line)


def test_a_moved_lease_is_counted_once_in_the_cluster_and_released_where_it_runs(tmp_path):
    """A remote lease on member A moved --to member B (named as the cluster names it): the move succeeds, the
    client's cluster-wide usage is the lease's share before and after, as both members see it (B's admission
    was not counted twice, A's ended record did not take the share away), and releasing it at A (where the
    client got it) ends it on B and gives the share back."""
    with two_members(tmp_path) as (etcd, a, b, admin):
        roamer = cli("token", "create", "roamer", "--cluster", etcd.url).stdout.strip()
        status, lease = api(a.url, "POST", "/v1/leases", roamer, {"n": 1, "fraction": 0.5, "remote": True})
        assert status == 201, lease
        wait_for(lambda: usage(b, admin, "roamer") == pytest.approx(0.5), 10, what="the grant counted")
        moved = cli("lease", "migrate", lease["id"], "--to", member_name(etcd, b), "--cluster", etcd.url,
                    "--server", a.url, token=admin)  # fmt: skip
        assert moved.returncode == 0, moved.stdout + moved.stderr
        assert api(b.url, "GET", f"/v1/leases/{lease['id']}", admin)[1]["state"] == "active"
        assert api(a.url, "GET", f"/v1/leases/{lease['id']}", admin)[1]["state"] != "active"
        for server in (a, b):
            assert usage(server, admin, "roamer") == pytest.approx(0.5)
        assert api(a.url, "DELETE", f"/v1/leases/{lease['id']}", roamer)[0] == 200
        assert api(b.url, "GET", f"/v1/leases/{lease['id']}", admin)[1]["state"] != "active"
        wait_for(lambda: usage(a, admin, "roamer") == 0.0, 10, what="the share given back")


def test_draining_a_member_moves_its_remote_leases_to_where_the_cluster_has_room(tmp_path):
    """`gpupool-server drain MEMBER --cluster URL`: the member grants nothing new and its running remote lease
    moves, live, to the other member (active there; nothing stays; exit 0), as the FAQ promises of a drain;
    with --stay the drain only stops granting (the lease stays, named, exit 1)."""
    with two_members(tmp_path) as (etcd, a, b, admin):
        user = cli("token", "create", "drained-user", "--cluster", etcd.url).stdout.strip()
        status, lease = api(a.url, "POST", "/v1/leases", user, {"n": 1, "fraction": 0.5, "remote": True})
        assert status == 201, lease
        name = member_name(etcd, a)
        stayed = cli("drain", name, "--stay", "--cluster", etcd.url, token=admin)
        assert stayed.returncode == 1 and f"{lease['id']}: stays" in stayed.stdout, (
            stayed.stdout + stayed.stderr
        )
        assert api(a.url, "GET", f"/v1/leases/{lease['id']}", admin)[1]["state"] == "active"
        assert cli("undrain", name, "--cluster", etcd.url, token=admin).returncode == 0
        drained = cli("drain", name, "--cluster", etcd.url, token=admin)
        assert drained.returncode == 0, drained.stdout + drained.stderr
        assert api(a.url, "GET", "/v1/health")[1]["server"]["draining"]
        assert api(b.url, "GET", f"/v1/leases/{lease['id']}", admin)[1]["state"] == "active"
        assert api(a.url, "GET", f"/v1/leases/{lease['id']}", admin)[1]["state"] != "active"
