"""Limits that bind and admin input that is checked, against real gpupool-server processes.

The attack of issue 26 first: a client with a limit of half a GPU asking for hundreds of tiny
leases. Then the caps on leases and workers per client, the ranges of every policy and client
setting (API, command line, config file, and values already stored by an older version).
"""

from __future__ import annotations

import http.client
import json
import sqlite3
import subprocess
import time
import urllib.parse

import pytest
from pool_harness import ROOT, ServerProc, api, server_cmd

pytestmark = pytest.mark.timeout(120)
GIB = 1 << 30


def server_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*server_cmd(), *args], capture_output=True, text=True, timeout=30, cwd=ROOT)


def strict_json(url: str, path: str, token: str):
    """GET ``path`` and decode it as strict JSON: ``Infinity`` or ``NaN`` in an answer is an error."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        body = conn.getresponse().read()
    finally:
        conn.close()

    def refuse(name):
        raise ValueError(f"{name} in an API answer is not JSON")

    return json.loads(body, parse_constant=refuse)


@pytest.fixture
def one_gpu(tmp_path):
    srv = ServerProc(tmp_path / "s", "1xH100-80GB").start()
    yield srv
    srv.stop()


def test_300_tiny_leases_cannot_pass_a_half_gpu_limit(one_gpu):
    """Issue 26's attack: with a limit of 0.5 GPU, 300 requests for a 1e-300 fraction get nothing,
    and 300 requests for the smallest partition (1 MiB) get 32 leases of 1/64 of the GPU each: usage
    counts what each really reserves (1.25 GiB of 80), so the limit binds at 0.50, not at "0.00"."""
    srv = one_gpu
    admin, tok = srv.token("root", admin=True), srv.token("alice")
    assert api(srv.url, "PUT", "/v1/admin/clients/alice", admin, {"limit": 0.5})[0] == 200
    # the lease cap would stop this first; lift it so the GPU limit is what is tested
    assert api(srv.url, "PUT", "/v1/admin/policy", admin, {"max_leases_per_client": 1000})[0] == 200
    tiny = [api(srv.url, "POST", "/v1/leases", tok, {"n": 1, "fraction": 1e-300}) for _ in range(300)]
    assert {status for status, _ in tiny} == {400}
    assert all("$.fraction" in ans["error"] for _, ans in tiny)
    answers = [api(srv.url, "POST", "/v1/leases", tok, {"n": 1, "mem_mib": 1}) for _ in range(300)]
    granted = [ans for status, ans in answers if status == 201]
    assert len(granted) == 32
    assert {(status, ans["code"]) for status, ans in answers if status != 201} == {(403, "limit_exceeded")}
    for lease in granted:
        (part,) = lease["partitions"]
        assert part["mem_bytes"] == 80 * GIB // 64 and part["fraction"] == pytest.approx(1 / 64)
    _, clients = api(srv.url, "GET", "/v1/admin/clients", admin)
    alice = next(c for c in clients["clients"] if c["client"] == "alice")
    assert alice["usage"] == pytest.approx(0.5) and alice["leases_active"] == 32
    _, gpus = api(srv.url, "GET", "/v1/gpus", tok)
    assert gpus["gpus"][0]["mem_free_bytes"] == 40 * GIB  # the reservations are real
    # the refusal says where the client stands, in GPUs, not "0.00"
    refusal = next(ans for status, ans in answers if status == 403)
    assert refusal["usage"] == pytest.approx(0.5) and refusal["limit"] == 0.5


def test_caps_on_leases_and_on_running_workers_per_client(tmp_path):
    """``max_leases_per_client`` and ``max_workers_per_client`` refuse the next lease (403
    limit_exceeded, naming the cap) while another client is unaffected; releasing frees the slot.
    Remote leases (a worker process each) count against both; the defaults protect a fresh server."""
    srv = ServerProc(tmp_path / "s", "2xH100-80GB", env={"GPUPOOL_WORKER_EXECUTOR": "host"}).start()
    try:
        admin, tok, other = srv.token("root", admin=True), srv.token("bob"), srv.token("carol")
        _, policy = api(srv.url, "GET", "/v1/admin/policy", admin)
        assert (policy["max_leases_per_client"], policy["max_workers_per_client"]) == (32, 8)
        api(
            srv.url,
            "PUT",
            "/v1/admin/policy",
            admin,
            {"max_leases_per_client": 3, "max_workers_per_client": 1},
        )
        remote = {"n": 1, "mem_mib": 2048, "remote": True}
        status, first = api(srv.url, "POST", "/v1/leases", tok, remote)
        assert status == 201 and first["worker"] is not None
        status, ans = api(srv.url, "POST", "/v1/leases", tok, remote)
        assert status == 403 and ans["code"] == "limit_exceeded" and ans["cap"] == "max_workers_per_client"
        status, fit = api(srv.url, "POST", "/v1/fit", tok, remote)
        assert fit["code"] == "limit_exceeded"  # gpuattach hears it before claiming, and does not wait
        local = {"n": 1, "mem_mib": 2048}
        assert [api(srv.url, "POST", "/v1/leases", tok, local)[0] for _ in range(2)] == [201, 201]
        status, ans = api(srv.url, "POST", "/v1/leases", tok, local)
        assert status == 403 and ans["cap"] == "max_leases_per_client"
        assert api(srv.url, "POST", "/v1/leases", other, remote)[0] == 201  # caps are per client
        _, clients = api(srv.url, "GET", "/v1/admin/clients", admin)
        bob = next(c for c in clients["clients"] if c["client"] == "bob")
        assert (bob["leases_active"], bob["workers_active"]) == (3, 1)
        assert api(srv.url, "DELETE", f"/v1/leases/{first['id']}", tok)[0] == 200
        assert api(srv.url, "POST", "/v1/leases", tok, remote)[0] == 201
    finally:
        srv.stop()


POLICY_OUT_OF_RANGE = [
    {"lease_ttl_s": 5e-324},
    {"lease_ttl_s": 0},
    {"default_idle_timeout_s": 1e-300},
    {"default_idle_timeout_s": -1},
    {"max_lease_s": 0.5},
    {"default_limit": -1},
    {"default_limit": 1e6},
    {"max_leases_per_client": 0},
    {"max_leases_per_client": 2.5},
    {"max_workers_per_client": 10**6},
]


@pytest.mark.parametrize("body", POLICY_OUT_OF_RANGE, ids=[json.dumps(b) for b in POLICY_OUT_OF_RANGE])
def test_policy_out_of_range_is_refused_in_one_line_and_changes_nothing(one_gpu, body):
    """Each policy field has a range (docs/pool.md, Ranges): outside it, a 400 naming the field,
    and the policy in force stays as it was."""
    srv = one_gpu
    admin = srv.token("root", admin=True)
    _, before = api(srv.url, "GET", "/v1/admin/policy", admin)
    status, ans = api(srv.url, "PUT", "/v1/admin/policy", admin, body)
    (field,) = body
    assert status == 400 and ans["code"] == "bad_request" and field in ans["error"], ans
    assert "\n" not in ans["error"]
    assert api(srv.url, "GET", "/v1/admin/policy", admin)[1] == before


def test_policy_and_client_edges_inside_the_ranges_are_taken(one_gpu):
    """The ends of each range are allowed, and 0 where it means "off" (never reclaim, no maximum)."""
    srv = one_gpu
    admin = srv.token("root", admin=True)
    body = {"lease_ttl_s": 1, "default_idle_timeout_s": 0, "max_lease_s": 0, "default_limit": 0,
            "max_leases_per_client": 10_000, "max_workers_per_client": 0}  # fmt: skip
    status, policy = api(srv.url, "PUT", "/v1/admin/policy", admin, body)
    assert status == 200 and all(policy[k] == v for k, v in body.items()), policy
    status, alice = api(
        srv.url, "PUT", "/v1/admin/clients/alice", admin, {"limit": 100_000, "idle_timeout_s": 1}
    )
    assert status == 200 and (alice["limit"], alice["idle_timeout_s"]) == (100_000, 1)
    for field, raw in (("limit", b'{"limit": -0.5}'), ("idle_timeout_s", b'{"idle_timeout_s": 1e-300}'),
                       ("limit", b'{"limit": 1e999}')):  # fmt: skip
        status, ans = api(srv.url, "PUT", "/v1/admin/clients/alice", admin, raw=raw)
        assert status == 400 and field in ans["error"], ans


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--limit", "inf"], ["--limit inf is out of range"]),
        (["--limit", "nan"], ["--limit nan is out of range"]),
        (["--limit", "-1"], ["--limit -1 is out of range"]),
        (["--idle-timeout", "1ms"], ["--idle-timeout 0.001 is out of range"]),
    ],
)
def test_client_set_refuses_inf_nan_and_tiny_timeouts_and_stores_nothing(tmp_path, args, words):
    """``gpupool-server client set`` checks the same ranges as the API: ``--limit inf`` is not stored
    as Infinity, ``--limit nan`` is not "no limit"; one line, exit 2, the stored setting unchanged."""
    state = tmp_path / "state"
    state.mkdir()
    assert server_cli("client", "set", "alice", "--limit", "2.5", "--state-dir", str(state)).returncode == 0
    out = server_cli("client", "set", "alice", *args, "--state-dir", str(state))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("gpupool-server: error: ") and all(w in line for w in words), line
    db = sqlite3.connect(state / "pool.sqlite")
    try:
        row = db.execute("SELECT limit_gpus, idle_timeout_s FROM clients WHERE name = 'alice'").fetchone()
    finally:
        db.close()
    assert row == (2.5, None)


@pytest.mark.parametrize(
    ("policy", "words"),
    [
        ("lease_ttl = 5e-324", "policy.lease_ttl 5e-324 is out of range (1s-1d)"),
        ('default_idle_timeout = "1ms"', "policy.default_idle_timeout 0.001 is out of range"),
        ("default_limit = inf", "policy.default_limit inf is out of range"),
        ("default_limit = nan", "policy.default_limit nan is out of range"),
        ("max_workers_per_client = -1", "policy.max_workers_per_client -1 is out of range"),
        ('reap_interval = "1ms"', "reap_interval 0.001 is out of range"),
    ],
)
def test_config_file_values_out_of_range_stop_the_server_in_one_line(tmp_path, policy, words):
    """server.toml's values are checked against the same ranges before the server starts."""
    cfg = tmp_path / "server.toml"
    cfg.write_text(f"[policy]\n{policy}\n")
    out = server_cli(
        "--config", str(cfg), "--simulate-gpus", "1xH100-80GB", "--state-dir", str(tmp_path / "s")
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert words in line, line
    assert not (tmp_path / "s").exists()


def test_out_of_range_values_stored_by_an_older_version_are_not_applied_after_a_restart(tmp_path):
    """A stored policy lease_ttl_s of 5e-324 and idle timeout of 1e-300 (what older versions took)
    would end every lease at once after a restart; a stored client limit of Infinity would make the
    API answer invalid JSON. The server logs each as not applied and uses the config's values."""
    srv = ServerProc(tmp_path / "s", "1xH100-80GB", config="[policy]\nreap_interval = 0.2\n").start()
    admin, tok = srv.token("root", admin=True), srv.token("dave")
    srv.stop()
    db = sqlite3.connect(srv.state_dir / "pool.sqlite")
    with db:
        db.executemany(
            "INSERT INTO policy(key, value) VALUES (?, ?)",
            [("lease_ttl_s", "5e-324"), ("default_idle_timeout_s", "1e-300")],
        )
        db.execute("INSERT OR REPLACE INTO clients(name, limit_gpus) VALUES ('dave', ?)", (float("inf"),))
    db.close()
    srv.start()
    try:
        log = srv.log.read_text()
        for words in (
            "policy lease_ttl_s 5e-324",
            "policy default_idle_timeout_s 1e-300",
            "client dave: limit inf",
        ):
            assert words in log and "not applied" in log, log[-2000:]
        policy = strict_json(srv.url, "/v1/admin/policy", admin)
        assert policy["lease_ttl_s"] == 30 and policy["default_idle_timeout_s"] is None
        dave = next(
            c for c in strict_json(srv.url, "/v1/admin/clients", admin)["clients"] if c["client"] == "dave"
        )
        assert dave["limit"] is None and dave["limit_source"] == "default"
        status, lease = api(srv.url, "POST", "/v1/leases", tok, {"n": 1, "fraction": 0.5})
        assert status == 201 and lease["ttl_s"] == 30
        time.sleep(1.0)  # five reaper passes: a lease with the stored TTL would have expired in the first
        assert api(srv.url, "GET", f"/v1/leases/{lease['id']}", tok)[1]["state"] == "active"
    finally:
        srv.stop()


def test_the_ranges_table_in_the_docs_is_the_one_the_code_checks():
    """docs/pool.md's Ranges table is what ``server.ranges`` enforces (``python -m server.ranges``)."""
    from server import ranges

    doc = (ROOT / "docs" / "pool.md").read_text()
    start = doc.index("<!-- ranges: python -m server.ranges writes this table -->\n")
    table = doc[start:].split("\n", 1)[1].split("\n<!-- /ranges -->", 1)[0]
    assert table == ranges.markdown()


def test_a_token_lifetime_out_of_range_is_refused_and_no_token_is_stored(tmp_path, one_gpu):
    """``token create --expires 99999999999y`` once stored a token and then crashed printing its
    expiry; ``--expires 0`` made a token that never expires. Both are refused in one line, nothing is
    stored, and the API refuses the same lifetimes."""
    state = one_gpu.state_dir
    before = server_cli("token", "list", "--state-dir", str(state)).stdout
    for lifetime in ("99999999999y", "0", "0.5s"):
        out = server_cli("token", "create", "mallory", "--expires", lifetime, "--state-dir", str(state))
        assert out.returncode == 2 and "Traceback" not in out.stderr and out.stdout == ""
        (line,) = out.stderr.strip().splitlines()
        assert "--expires" in line and "out of range (1s-100y)" in line, line
    assert server_cli("token", "list", "--state-dir", str(state)).stdout == before
    admin = one_gpu.token("root", admin=True)
    for body in ({"client": "mallory", "expires_in_s": 0.5}, {"client": "mallory", "expires_in_s": 1e12}):
        status, ans = api(one_gpu.url, "POST", "/v1/admin/tokens", admin, body)
        assert status == 400 and "expires_in_s" in ans["error"], ans
