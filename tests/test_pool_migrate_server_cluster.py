"""A move to another server in cluster mode (a real etcd, two gpupool-server members on loopback, simulated
GPUs, host-executor workers): `lease migrate --to MEMBER --cluster`, and the client's cluster-wide usage
through it. The target's admission is not a lease of the cluster until a move commits, so a move that ends
early (today: every move, docs/remote.md "Between servers") leaves the lease's record as its server's."""

from __future__ import annotations

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


def test_a_move_that_ends_early_keeps_the_lease_counted_once_in_the_cluster(tmp_path):
    """A remote lease on member A moved --to member B (named as the cluster names it): the move ends with its
    reason (exit 2), B's admission ends, and the client's cluster-wide usage is the lease's share before,
    during and after, as both members see it — B's giving the admission back does not delete A's record."""
    (tmp_path / "etcd").mkdir()
    etcd = EtcdCluster(tmp_path / "etcd", size=1)
    etcd.start()
    servers = []
    try:
        for name in ("a", "b"):
            extra = ("--cluster", etcd.url, "--cluster-ttl", "3s")
            servers.append(ServerProc(tmp_path / name, "2xH100-80GB", extra=extra, env=HOST).start())
        a, b = servers
        wait_for(lambda: all(api(s.url, "GET", "/v1/health")[1]["cluster"]["registered"] for s in servers), 15,
                 what="both servers registered")  # fmt: skip
        made = cli("token", "create", "root", "--admin", "--cluster", etcd.url)
        assert made.returncode == 0, made.stderr
        admin = made.stdout.strip()
        made = cli("token", "create", "roamer", "--cluster", etcd.url)
        status, lease = api(a.url, "POST", "/v1/leases", made.stdout.strip(),
                            {"n": 1, "fraction": 0.5, "remote": True})  # fmt: skip
        assert status == 201, lease
        wait_for(lambda: usage(b, admin, "roamer") == pytest.approx(0.5), 10, what="the grant counted")
        members = cli("cluster", "members", "--cluster", etcd.url)
        member_b = next(line.split()[0] for line in members.stdout.splitlines() if str(b.port) in line)
        moved = cli("lease", "migrate", lease["id"], "--to", member_b, "--cluster", etcd.url, "--server", a.url,
                    token=admin)  # fmt: skip
        assert moved.returncode == 2 and "Traceback" not in moved.stderr, moved.stdout + moved.stderr
        assert "not built yet" in moved.stderr
        wait_for(lambda: api(b.url, "GET", f"/v1/leases/{lease['id']}", admin)[1]["state"] != "active", 10,
                 what="B's admission to end")  # fmt: skip
        for server in (a, b):
            assert usage(server, admin, "roamer") == pytest.approx(0.5)
        assert api(a.url, "GET", f"/v1/leases/{lease['id']}", admin)[1]["state"] == "active"
    finally:
        for s in servers:
            s.stop()
        etcd.stop()
