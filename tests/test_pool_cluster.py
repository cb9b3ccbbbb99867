"""Cluster mode: a real 3-member etcd cluster and 3 gpupool-server processes on loopback (simulated GPUs).

The tests share one cluster and run in file order: the later ones kill things (a gpupool server, then
etcd members). A network partition of one server from etcd is made with TCP proxies the test cuts
(no network namespaces needed, so it runs unprivileged).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from pool_harness import ROOT, ServerProc, api, gpuattach, server_cmd, wait_for
from pool_harness import client_env as static_env
from tcp_proxy import TcpProxy

from tests.etcd_cluster import EtcdCluster

pytestmark = [
    pytest.mark.needs("etcd"),
    pytest.mark.timeout(120),
]

TTL = "3s"  # membership TTL: a killed server's leases leave the cluster within ~3 s


def server_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*server_cmd(), *args], capture_output=True, text=True, timeout=30, cwd=ROOT, input=stdin
    )


def token(cluster_url: str, client: str, *extra: str) -> str:
    out = server_cli("token", "create", client, "--cluster", cluster_url, *extra)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def cluster_server(path, etcd: EtcdCluster, gpus: str = "4xH100-80GB", *extra: str) -> ServerProc:
    return ServerProc(path, gpus, extra=("--cluster", etcd.url, "--cluster-ttl", TTL, *extra))


def registered(server: ServerProc) -> bool:
    try:
        status, body = api(server.url, "GET", "/v1/health", timeout=2)
    except OSError:
        return False
    return status == 200 and body["cluster"]["registered"]


def client_env(tmp_path, cluster_url: str, tok: str) -> dict[str, str]:
    cfg = tmp_path / f"client-{tok[-6:]}.toml"
    cfg.write_text(f'token = "{tok}"\ncluster = "{cluster_url}"\ntimeout = "3s"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env.update(GPUPOOL_CONFIG=str(cfg), XDG_CACHE_HOME=str(tmp_path / "cache"), PYTHONUNBUFFERED="1")
    return env


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    base = tmp_path_factory.mktemp("cluster")
    (base / "etcd").mkdir()
    etcd = EtcdCluster(base / "etcd")
    etcd.start()
    servers = []
    try:
        servers = [cluster_server(base / f"s{i}", etcd).start() for i in range(3)]
        wait_for(lambda: all(registered(s) for s in servers), 15, what="3 servers registered")
        admin = token(etcd.url, "root", "--admin")
        yield {"etcd": etcd, "servers": servers, "admin": admin, "base": base}
    finally:
        for s in servers:
            s.stop()
        etcd.stop()


def usage(world, client: str, server: ServerProc | None = None) -> float:
    server = server or world["servers"][-1]
    status, body = api(server.url, "GET", "/v1/admin/clients", world["admin"])
    assert status == 200, body
    return next((c["usage"] for c in body["clients"] if c["client"] == client), 0.0)


def test_servers_register_and_clients_discover_them_from_etcd(world, tmp_path):
    etcd, servers = world["etcd"], world["servers"]
    out = server_cli("cluster", "members", "--cluster", etcd.url)
    assert out.returncode == 0, out.stderr
    for s in servers:
        assert s.url in out.stdout
    assert "4x NVIDIA H100 80GB" in out.stdout

    env = client_env(tmp_path, etcd.url, token(etcd.url, "dora"))
    out = gpuattach("servers", "--json", env=env)
    assert out.returncode == 0, out.stderr
    assert sorted(a["server"]["port"] for a in json.loads(out.stdout)) == sorted(s.port for s in servers)
    out = gpuattach("request", "-n", "1", "-p", "0.5", "--local", "--no-keeper", env=env)
    assert out.returncode == 0, out.stderr


def test_drain_names_a_member_as_the_cluster_does_and_its_clients_go_elsewhere(world, tmp_path):
    """`gpupool-server drain NAME --cluster URL` drains the member of that name (and only it): a cluster client
    gets its lease from another member; an unknown name is one error line (exit 2); --undo by name ends it."""
    etcd, servers = world["etcd"], world["servers"]
    target = servers[0]
    name = api(target.url, "GET", "/v1/health")[1]["cluster"]["member"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env["GPUPOOL_TOKEN"] = world["admin"]

    def drain(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*server_cmd(), "drain", *args, "--cluster", etcd.url], env=env, capture_output=True,
                              text=True, timeout=30, cwd=ROOT)  # fmt: skip

    def draining() -> list[bool]:
        return [api(s.url, "GET", "/v1/health")[1]["server"]["draining"] for s in servers]

    try:
        done = drain(name)
        assert done.returncode in (0, 1) and "Traceback" not in done.stderr, done.stderr  # 1: a lease stayed
        assert draining() == [True, False, False]
        members = server_cli("cluster", "members", "--cluster", etcd.url).stdout.splitlines()
        assert [line.startswith(name + " ") for line in members if "draining" in line] == [True], members
        tok = token(etcd.url, "drainee")
        client = client_env(tmp_path, etcd.url, tok)
        got = gpuattach("request", "-n", "1", "-p", "0.25", "--local", "--no-keeper", env=client)
        assert got.returncode == 0, got.stderr
        lease_id = got.stdout.split()[-1]
        holders = [s for s in servers if api(s.url, "GET", f"/v1/leases/{lease_id}", tok)[0] == 200]
        assert len(holders) == 1 and holders[0] is not target
        api(holders[0].url, "DELETE", f"/v1/leases/{lease_id}", tok)
        unknown = drain("no-such-member:1")
        assert unknown.returncode == 2 and "Traceback" not in unknown.stderr, unknown.stderr
        assert drain(name, "--undo").returncode == 0
        assert draining() == [False, False, False]
        assert "draining" not in server_cli("cluster", "members", "--cluster", etcd.url).stdout
    finally:
        subprocess.run(
            [*server_cmd(), "drain", target.url, "--undo"], env=env, capture_output=True, timeout=30
        )


def test_token_policy_and_limits_are_issued_once_and_valid_on_every_server(world):
    servers, admin = world["servers"], world["admin"]
    tok = token(world["etcd"].url, "erin")
    for s in servers:  # one token, every server
        assert api(s.url, "GET", "/v1/gpus", tok)[0] == 200
    status, _ = api(servers[0].url, "PUT", "/v1/admin/clients/erin", admin, {"limit": 0.5})
    assert status == 200
    status, _ = api(servers[1].url, "PUT", "/v1/admin/policy", admin, {"default_idle_timeout_s": 600})
    assert status == 200

    def settings():
        _, body = api(servers[2].url, "GET", "/v1/admin/clients", admin)
        erin = next((c for c in body["clients"] if c["client"] == "erin"), {})
        return erin.get("limit") == 0.5 and erin.get("idle_timeout_s") == 600

    wait_for(settings, 5, what="limit and policy set on other servers to reach server 3")
    status, body = api(servers[2].url, "POST", "/v1/leases", tok, {"n": 1, "fraction": 0.75})
    assert status == 403 and body["code"] == "limit_exceeded"

    # Revoked on one server: refused on all (within the refresh interval).
    listed = server_cli("token", "list", "--cluster", world["etcd"].url)
    tok_id = next(line.split()[0] for line in listed.stdout.splitlines() if " erin " in line)
    assert server_cli("token", "revoke", tok_id, "--cluster", world["etcd"].url).returncode == 0
    wait_for(lambda: all(api(s.url, "GET", "/v1/gpus", tok)[0] == 401 for s in servers), 5, what="revocation")


def test_concurrent_requests_to_different_servers_never_pass_the_limit(world):
    servers, admin = world["servers"], world["admin"]
    tok = token(world["etcd"].url, "carol")
    assert api(servers[0].url, "PUT", "/v1/admin/clients/carol", admin, {"limit": 2.0})[0] == 200
    wait_for(lambda: usage(world, "carol") == 0.0, 5)

    def claim(i):
        return api(servers[i % 3].url, "POST", "/v1/leases", tok, {"n": 1, "fraction": 0.25}, timeout=30)

    with ThreadPoolExecutor(24) as ex:
        answers = list(ex.map(claim, range(24)))
    granted = [b for status, b in answers if status == 201]
    refused = [b for status, b in answers if status != 201]
    assert len(granted) == 8, [b.get("error") for b in refused]
    assert {b["code"] for b in refused} == {"limit_exceeded"}
    assert len({b["server"]["port"] for b in granted}) > 1  # the grants really came from several servers
    assert usage(world, "carol") == pytest.approx(2.0)
    for lease in granted:
        url = next(s.url for s in servers if s.port == lease["server"]["port"])
        assert api(url, "DELETE", f"/v1/leases/{lease['id']}", tok)[0] == 200
    assert usage(world, "carol") == 0.0


def test_killed_server_leaves_the_cluster_sum_and_returns_clean(world):
    servers, admin = world["servers"], world["admin"]
    tok = token(world["etcd"].url, "bob")
    assert api(servers[0].url, "PUT", "/v1/admin/clients/bob", admin, {"limit": 1.0})[0] == 200
    wait_for(lambda: usage(world, "bob") == 0.0, 5)
    status, dead_lease = api(servers[0].url, "POST", "/v1/leases", tok, {"n": 1, "fraction": 0.75})
    assert status == 201
    status, body = api(servers[1].url, "POST", "/v1/leases", tok, {"n": 1, "fraction": 0.5})
    assert status == 403 and "holds 0.75" in body["error"]

    servers[0].kill9()
    # Its membership lease runs out: its lease leaves bob's sum, and it leaves the members list.
    wait_for(lambda: usage(world, "bob", servers[1]) == 0.0, 8, what="the dead server's lease to leave")
    status, lease = api(servers[1].url, "POST", "/v1/leases", tok, {"n": 1, "fraction": 0.5})
    assert status == 201, lease
    members = server_cli("cluster", "members", "--cluster", world["etcd"].url).stdout
    assert servers[0].url not in members and servers[1].url in members

    servers[0].start()  # same state dir, same port, same member name
    wait_for(lambda: registered(servers[0]), 10, what="the server to come back")
    status, old = api(servers[0].url, "GET", f"/v1/leases/{dead_lease['id']}", tok)
    assert old["state"] == "expired" and "membership TTL" in old["reason"]
    status, gpus = api(servers[0].url, "GET", "/v1/gpus", tok)
    assert all(g["free_fraction"] == 1.0 for g in gpus["gpus"])  # its partitions returned
    assert usage(world, "bob") == pytest.approx(0.5)
    assert api(servers[1].url, "DELETE", f"/v1/leases/{lease['id']}", tok)[0] == 200


def test_restart_within_the_membership_ttl_keeps_live_leases(world, tmp_path):
    # systemctl restart: the server stops cleanly and is back before its membership lease runs out.
    server = cluster_server(tmp_path / "r", world["etcd"], "2xA100-40GB", "--cluster-ttl", "20s").start()
    try:
        wait_for(lambda: registered(server), 10, what="registration")
        tok = token(world["etcd"].url, "ivan")
        status, lease = api(server.url, "POST", "/v1/leases", tok, {"n": 1, "fraction": 0.5, "ttl_s": 60})
        assert status == 201
        server.stop()
        assert usage(world, "ivan") == pytest.approx(0.5)  # still counted while it restarts
        server.start()
        wait_for(lambda: registered(server), 10, what="re-registration")
        status, body = api(server.url, "GET", f"/v1/leases/{lease['id']}", tok)
        assert body["state"] == "active"
        assert usage(world, "ivan") == pytest.approx(0.5)
    finally:
        server.stop()


def test_etcd_minority_loss_changes_nothing_majority_loss_fails_clearly_then_recovers(world, tmp_path):
    etcd, servers = world["etcd"], world["servers"]
    tok = token(etcd.url, "frank")
    env = client_env(tmp_path, etcd.url, tok)
    status, running = api(servers[2].url, "POST", "/v1/leases", tok, {"n": 1, "fraction": 0.5, "ttl_s": 30})
    assert status == 201
    status, doomed = api(servers[0].url, "POST", "/v1/leases", tok, {"n": 1, "fraction": 0.125, "ttl_s": 30})
    assert status == 201

    etcd.kill(etcd.members[0])
    out = gpuattach("request", "-n", "1", "-p", "0.25", "--local", "--no-keeper", env=env)
    assert out.returncode == 0, out.stderr

    etcd.kill(etcd.members[1])
    # Asked directly (a static server list), the server answers 503; discovering through etcd fails the
    # same way. Either is one line on stderr, and fast.
    static = static_env(tmp_path, [servers[1].url], tok)
    for how in (static, env):
        t0 = time.monotonic()
        out = gpuattach("request", "-n", "1", "-p", "0.25", "--local", "--no-keeper", env=how)
        assert out.returncode != 0
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and "pool state unavailable: no etcd quorum" in lines[0], out.stderr
        assert time.monotonic() - t0 < 20
    # The running lease keeps running: heartbeats go to its server, which needs no quorum for them.
    for _ in range(3):
        status, body = api(servers[2].url, "POST", f"/v1/leases/{running['id']}/heartbeat", tok, {})
        assert status == 200 and body["state"] == "active", body
        time.sleep(0.5)
    # A release needs no quorum either; its share leaves the cluster sum once quorum is back.
    t0 = time.monotonic()
    status, body = api(servers[0].url, "DELETE", f"/v1/leases/{doomed['id']}", tok)
    assert status == 200 and body["state"] == "released" and time.monotonic() - t0 < 5

    etcd.restart(etcd.members[0])
    etcd.restart(etcd.members[1])
    etcd.wait_healthy(etcd.members)
    wait_for(lambda: all(registered(s) for s in servers), 20, what="servers to re-register")
    # Reconciled: the lease that ran through the outage counts again, and new requests work.
    assert usage(world, "frank") == pytest.approx(0.75)
    out = gpuattach("request", "-n", "1", "-p", "0.25", "--local", "--no-keeper", env=env)
    assert out.returncode == 0, out.stderr
    assert usage(world, "frank") == pytest.approx(1.0)


def test_partitioned_server_leaves_the_cluster_keeps_its_leases_and_rejoins(world, tmp_path):
    etcd, others = world["etcd"], world["servers"]
    proxies = [_etcd_proxy(e) for e in etcd.endpoints]
    url = "etcd://" + ",".join(p.endpoint for p in proxies)
    island = ServerProc(tmp_path / "island", "2xA100-40GB", extra=("--cluster", url, "--cluster-ttl", TTL))
    island.start()
    try:
        wait_for(lambda: registered(island), 10, what="the server behind the proxies to register")
        tok = token(etcd.url, "hank")
        status, lease = api(island.url, "POST", "/v1/leases", tok, {"n": 1, "fraction": 0.5, "ttl_s": 30})
        assert status == 201
        assert usage(world, "hank") == pytest.approx(0.5)

        for p in proxies:
            p.partition()
        # For the rest of the cluster the server is gone: its lease leaves the sum, it leaves the members.
        wait_for(lambda: usage(world, "hank") == 0.0, 10, what="the partitioned server's lease to leave")
        assert island.url not in server_cli("cluster", "members", "--cluster", etcd.url).stdout
        # On the island: its lease keeps running, new requests there fail clearly.
        status, body = api(island.url, "POST", f"/v1/leases/{lease['id']}/heartbeat", tok, {})
        assert status == 200 and body["state"] == "active"
        status, body = api(island.url, "POST", "/v1/leases", tok, {"n": 1, "fraction": 0.25}, timeout=20)
        assert status == 503 and body["error"] == "pool state unavailable: no etcd quorum"
        assert api(others[0].url, "POST", "/v1/leases", tok, {"n": 1, "fraction": 0.25})[0] == 201

        for p in proxies:
            p.heal()
        wait_for(lambda: registered(island), 15, what="the server to rejoin")
        assert usage(world, "hank") == pytest.approx(0.75)  # its live lease counts again
        assert island.url in server_cli("cluster", "members", "--cluster", etcd.url).stdout
    finally:
        island.stop()
        for p in proxies:
            p.close()


def test_migrate_moves_tokens_policy_and_live_leases_into_etcd(world, tmp_path):
    etcd = world["etcd"]
    embedded = ServerProc(tmp_path / "embedded", "2xA100-40GB").start()
    try:
        tok = embedded.token("gina")
        admin = embedded.token("ops", admin=True)
        assert api(embedded.url, "PUT", "/v1/admin/clients/gina", admin, {"limit": 1.0})[0] == 200
        assert api(embedded.url, "PUT", "/v1/admin/policy", admin, {"max_lease_s": 86400})[0] == 200
        status, lease = api(embedded.url, "POST", "/v1/leases", tok, {"n": 1, "fraction": 0.75, "ttl_s": 60})
        assert status == 201
    finally:
        embedded.stop()
    name = f"migrated:{embedded.port}"
    out = server_cli(
        "cluster", "migrate", "--state-dir", str(embedded.state_dir), "--cluster", etcd.url, "--name", name
    )
    assert out.returncode == 0, out.stderr
    assert "2 tokens, 1 client setting, 1 policy value and 1 live lease" in out.stderr
    assert lease["id"] in out.stdout

    moved = cluster_server(embedded.state_dir, etcd, "2xA100-40GB", "--cluster-name", name)
    moved.port = embedded.port
    moved.start()
    try:
        wait_for(lambda: registered(moved), 10, what="the migrated server to register")
        status, body = api(moved.url, "GET", f"/v1/leases/{lease['id']}", tok)  # same token, same lease
        assert status == 200 and body["state"] == "active"
        assert usage(world, "gina") == pytest.approx(0.75)  # counted cluster-wide
        # gina's limit of 1.0 now holds on every server of the cluster.
        status, body = api(world["servers"][1].url, "POST", "/v1/leases", tok, {"n": 1, "fraction": 0.5})
        assert status == 403 and body["code"] == "limit_exceeded"
        # Policy reaches the other servers at their next refresh (a quarter of the membership TTL).
        wait_for(
            lambda: (
                api(world["servers"][1].url, "GET", "/v1/admin/policy", world["admin"])[1]["max_lease_s"]
                == 86400
            ),
            5,
            what="the migrated policy on another server",
        )
    finally:
        moved.stop()


def _etcd_proxy(target: str) -> TcpProxy:
    """A proxy to one etcd member that the test can cut: a partition between one gpupool server and etcd."""
    host, port = target.rsplit(":", 1)
    return TcpProxy(host, int(port))
