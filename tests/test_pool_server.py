"""gpupool-server over real HTTP on loopback (simulated GPUs): leases, filters, limits, liveness, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from pool_harness import ROOT, ServerProc, api, server_cmd, wait_for

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    """Two servers: A with 4 H100s (advertised as 127.0.0.1), B with 2 A100s (advertised as 127.0.0.2)."""
    base = tmp_path_factory.mktemp("pool")
    a = ServerProc(base / "a", "4xH100-80GB").start()
    b = ServerProc(base / "b", "2xA100-40GB", extra=("--advertise-addr", "127.0.0.2")).start()
    yield a, b
    a.stop()
    b.stop()


def lease_req(n=1, fraction=None, mem_mib=None, **kw):
    body = {"n": n, **kw}
    if fraction is not None:
        body["fraction"] = fraction
    if mem_mib is not None:
        body["mem_mib"] = mem_mib
    return body


def test_every_route_is_in_the_openapi_document_and_served(pool):
    from server._app import ROUTES

    doc = json.loads((ROOT / "server" / "openapi.json").read_text())
    routes = {(m.lower(), p) for m, p, _ in ROUTES}
    documented = {(m, p) for p, ops in doc["paths"].items() for m in ops}
    assert routes == documented
    status, served = api(pool[0].url, "GET", "/openapi.json")
    assert status == 200 and served == doc


def test_filters_choose_servers_and_gpus(pool):
    a, b = pool
    ta, tb = a.token("filt"), b.token("filt")

    def fits(server, token, *filters, n=1):
        status, ans = api(server.url, "POST", "/v1/fit", token, lease_req(n, 0.5, filters=list(filters)))
        assert status == 200, ans
        return ans

    assert fits(a, ta, "device.name=H100")["fits_now"]
    assert fits(b, tb, "device.name=H100")["code"] == "impossible"
    assert fits(b, tb, "device.name!=H100")["fits_now"]
    assert fits(a, ta, "device.phy-memory>=80000")["fits_now"]
    assert fits(b, tb, "device.phy-memory>=80000")["code"] == "impossible"
    assert fits(b, tb, "device.phy-memory<50000", "device.phy-memory>40000")["fits_now"]
    assert fits(a, ta, "device.id=3")["placement"] == [3]
    assert fits(b, tb, "device.id>=2")["code"] == "impossible"
    assert fits(b, tb, "server.addr=127.0.0.2")["fits_now"]
    assert fits(a, ta, "server.addr=127.0.0.0/31")["fits_now"]
    assert fits(a, ta, "server.addr!=127.0.0.1")["code"] == "impossible"
    assert fits(a, ta, "server.cuda-version>=12.4", "server.driver-version>=550")["fits_now"]
    assert fits(a, ta, "server.cuda-version>12.10")["code"] == "impossible"  # 12.4 < 12.10: numeric, not text
    ans = fits(a, ta, "device.id<=1", n=3)
    assert ans["code"] == "impossible" and "2 of its 4 GPUs match" in ans["reason"]
    # a granted lease lands on a GPU the filters allow
    status, lease = api(a.url, "POST", "/v1/leases", ta, lease_req(1, 0.25, filters=["device.id=2"]))
    assert status == 201 and [p["gpu_index"] for p in lease["partitions"]] == [2]
    api(a.url, "DELETE", f"/v1/leases/{lease['id']}", ta)


def test_partitions_of_one_lease_sit_on_separate_gpus(tmp_path):
    srv = ServerProc(tmp_path, "2xH100-80GB").start()
    try:
        tok = srv.token("sep")
        status, big = api(srv.url, "POST", "/v1/leases", tok, lease_req(1, 1.0))
        assert status == 201
        # 2 × 0.25 would fit in the free GPU's memory, but one request's partitions need 2 separate GPUs
        status, ans = api(srv.url, "POST", "/v1/leases", tok, lease_req(2, 0.25))
        assert status == 409 and ans["code"] == "busy", ans
        api(srv.url, "DELETE", f"/v1/leases/{big['id']}", tok)
        status, lease = api(srv.url, "POST", "/v1/leases", tok, lease_req(2, 0.25))
        assert status == 201
        assert sorted(p["gpu_index"] for p in lease["partitions"]) == [0, 1]
        # n greater than the server's GPUs: impossible at once, whatever is free
        status, ans = api(srv.url, "POST", "/v1/leases", tok, lease_req(3, 0.1))
        assert status == 422 and "has 2" in ans["error"]
    finally:
        srv.stop()


def test_a_lease_answer_says_how_much_memory_it_holds_in_all(pool):
    """A lease's answer carries ``mem_bytes_total``, the sum of its partitions' memory, on every route that
    answers with a lease (grant, read, heartbeat, release)."""
    a, _ = pool
    tok = a.token("memsum")
    status, lease = api(a.url, "POST", "/v1/leases", tok, lease_req(2, 0.25))
    assert status == 201, lease
    held = sum(p["mem_bytes"] for p in lease["partitions"])
    assert held > 0 and lease["mem_bytes_total"] == held
    for method, path in (("GET", ""), ("POST", "/heartbeat"), ("DELETE", "")):
        status, again = api(a.url, method, f"/v1/leases/{lease['id']}{path}", tok)
        assert status == 200 and again["mem_bytes_total"] == held, again


def test_limits_count_fractions_and_name_usage_and_limit(pool):
    a, _ = pool
    admin, tok = a.token("root-limits", admin=True), a.token("carol")
    status, c = api(a.url, "PUT", "/v1/admin/clients/carol", admin, {"limit": 2.5})
    assert status == 200 and c["limit"] == 2.5 and c["limit_source"] == "client"
    held = []
    for f in (1.0, 0.75, 0.75):
        status, lease = api(a.url, "POST", "/v1/leases", tok, lease_req(1, f))
        assert status == 201, lease
        held.append(lease["id"])
    status, ans = api(a.url, "POST", "/v1/leases", tok, lease_req(1, 0.25))
    assert status == 403 and ans["code"] == "limit_exceeded"
    assert "2.50 GPUs of its limit of 2.50" in ans["error"], ans
    status, fit = api(a.url, "POST", "/v1/fit", tok, lease_req(1, 0.25))
    assert fit["code"] == "limit_exceeded"
    status, clients = api(a.url, "GET", "/v1/admin/clients", admin)
    carol = next(c for c in clients["clients"] if c["client"] == "carol")
    assert carol["usage"] == pytest.approx(2.5) and carol["leases_active"] == 3
    api(a.url, "DELETE", f"/v1/leases/{held[1]}", tok)
    status, lease = api(a.url, "POST", "/v1/leases", tok, lease_req(1, 0.5))
    assert status == 201
    # the default limit applies to clients without their own
    status, policy = api(a.url, "PUT", "/v1/admin/policy", admin, {"default_limit": 0.5})
    assert policy["default_limit"] == 0.5
    dave = a.token("dave")
    assert api(a.url, "POST", "/v1/leases", dave, lease_req(1, 0.5))[0] == 201
    status, ans = api(a.url, "POST", "/v1/leases", dave, lease_req(1, 0.5))
    assert status == 403 and "limit of 0.50" in ans["error"]
    api(a.url, "PUT", "/v1/admin/policy", admin, {"default_limit": None})
    for lid in [held[0], held[2], lease["id"]]:
        api(a.url, "DELETE", f"/v1/leases/{lid}", tok)


def test_lease_expires_after_ttl_without_heartbeats_and_heartbeat_says_why(tmp_path):
    srv = ServerProc(
        tmp_path, "1xH100-80GB", config='[policy]\nlease_ttl = "1s"\nreap_interval = 0.2\n'
    ).start()
    try:
        tok = srv.token("ttl")
        status, lease = api(srv.url, "POST", "/v1/leases", tok, lease_req(1, 0.5))
        assert lease["ttl_s"] == 1.0
        for _ in range(4):  # heartbeats keep it alive past its TTL
            time.sleep(0.4)
            assert api(srv.url, "POST", f"/v1/leases/{lease['id']}/heartbeat", tok)[0] == 200
        wait_for(
            lambda: api(srv.url, "GET", f"/v1/leases/{lease['id']}", tok)[1]["state"] == "expired",
            5,
            what="expiry",
        )
        status, ans = api(srv.url, "POST", f"/v1/leases/{lease['id']}/heartbeat", tok)
        assert status == 410 and ans["state"] == "expired" and "no heartbeat" in ans["reason"]
        status, gpus = api(srv.url, "GET", "/v1/gpus", tok)
        assert gpus["gpus"][0]["free_fraction"] == 1.0
    finally:
        srv.stop()


def test_idle_lease_is_reclaimed_per_client_timeout(tmp_path):
    config = '[policy]\nreap_interval = 0.2\n[clients.idler]\nidle_timeout = "1s"\n'
    srv = ServerProc(tmp_path, "1xH100-80GB", config=config).start()
    try:
        idler, other = srv.token("idler"), srv.token("other")
        _, idle = api(srv.url, "POST", "/v1/leases", idler, lease_req(1, 0.25))
        _, kept = api(srv.url, "POST", "/v1/leases", other, lease_req(1, 0.25))
        assert idle["idle_timeout_s"] == 1.0 and kept["idle_timeout_s"] is None

        def reclaimed():
            s, ans = api(srv.url, "POST", f"/v1/leases/{idle['id']}/heartbeat", idler)
            return ans if s == 410 else None

        ans = wait_for(reclaimed, 6, what="idle reclaim")
        assert ans["state"] == "reclaimed" and "idle for" in ans["reason"] and "idler" in ans["reason"]
        _, got = api(srv.url, "GET", f"/v1/leases/{idle['id']}", idler)
        assert got["state"] == "reclaimed" and got["reason"] == ans["reason"]
        assert api(srv.url, "GET", f"/v1/leases/{kept['id']}", other)[1]["state"] == "active"
        # an admin changes the timeout live; the change applies to live leases
        admin = srv.token("root", admin=True)
        api(srv.url, "PUT", "/v1/admin/clients/other", admin, {"idle_timeout_s": 1.0})
        wait_for(
            lambda: api(srv.url, "GET", f"/v1/leases/{kept['id']}", other)[1]["state"] == "reclaimed",
            6,
            what="reclaim",
        )
    finally:
        srv.stop()


def test_max_lease_length_ends_a_heartbeated_lease(tmp_path):
    srv = ServerProc(
        tmp_path, "1xH100-80GB", config='[policy]\nmax_lease = "1s"\nreap_interval = 0.2\n'
    ).start()
    try:
        tok = srv.token("long")
        _, lease = api(srv.url, "POST", "/v1/leases", tok, lease_req(1, 0.5))
        assert lease["max_end_at"] is not None

        def ended():
            s, ans = api(srv.url, "POST", f"/v1/leases/{lease['id']}/heartbeat", tok)
            return ans if s == 410 else None

        assert "maximum lease length of 1s" in wait_for(ended, 5, what="max length")["reason"]
    finally:
        srv.stop()


def test_restart_after_kill9_keeps_live_leases_and_cleans_dead_ones(tmp_path):
    srv = ServerProc(tmp_path, "2xH100-80GB").start()
    alive = subprocess.Popen(["sleep", "60"])
    doomed = subprocess.Popen(["sleep", "60"])
    try:
        tok = srv.token("restart")
        _, live = api(srv.url, "POST", "/v1/leases", tok, lease_req(1, 0.5, local=True, pids=[alive.pid]))
        _, dead = api(srv.url, "POST", "/v1/leases", tok, lease_req(1, 0.75, local=True, pids=[doomed.pid]))
        _, session = api(srv.url, "POST", "/v1/leases", tok, lease_req(1, 0.25))  # no local processes: kept
        srv.kill9()
        doomed.kill()
        doomed.wait()
        srv.start()
        assert api(srv.url, "GET", f"/v1/leases/{live['id']}", tok)[1]["state"] == "active"
        assert api(srv.url, "GET", f"/v1/leases/{session['id']}", tok)[1]["state"] == "active"
        _, gone = api(srv.url, "GET", f"/v1/leases/{dead['id']}", tok)
        assert gone["state"] == "expired" and "processes are gone" in gone["reason"]
        _, gpus = api(srv.url, "GET", "/v1/gpus", tok)
        used = sorted(round(1 - g["free_fraction"], 2) for g in gpus["gpus"])
        assert used == [0.25, 0.5]  # the live leases still hold their memory; the dead one's is free
        assert api(srv.url, "POST", f"/v1/leases/{live['id']}/heartbeat", tok)[0] == 200
    finally:
        alive.kill()
        alive.wait()
        srv.stop()


def test_racing_clients_never_double_book(tmp_path):
    srv = ServerProc(tmp_path, "2xH100-80GB").start()
    try:
        tokens = [srv.token(f"racer{i}") for i in range(8)]
        start = threading.Barrier(48)

        def claim(i):
            start.wait(timeout=30)
            return api(srv.url, "POST", "/v1/leases", tokens[i % 8], lease_req(1, 0.25), timeout=30)

        with ThreadPoolExecutor(48) as ex:
            results = list(ex.map(claim, range(48)))
        granted = [ans for status, ans in results if status == 201]
        assert len(granted) == 8  # 2 GPUs × 4 quarters, no more
        assert all(status == 409 and ans["code"] == "busy" for status, ans in results if status != 201)
        per_gpu = {}
        for lease in granted:
            for p in lease["partitions"]:
                per_gpu[p["gpu_index"]] = per_gpu.get(p["gpu_index"], 0) + p["mem_bytes"]
        assert all(v <= 80 * 2**30 for v in per_gpu.values()) and len(per_gpu) == 2
        _, gpus = api(srv.url, "GET", "/v1/gpus", tokens[0])
        assert all(g["mem_free_bytes"] == 0 for g in gpus["gpus"])
    finally:
        srv.stop()


BAD_INPUTS = [
    # (what, method, path, body-or-raw, expected status, code, words in the message)
    ("malformed JSON", "POST", "/v1/leases", b"{n: 1", 400, "bad_request", "malformed JSON"),
    ("not an object", "POST", "/v1/leases", b"[1, 2]", 400, "bad_request", "Expected `object`"),
    ("empty body", "POST", "/v1/leases", b"", 400, "bad_request", "empty"),
    ("n as text", "POST", "/v1/leases", {"n": "two", "fraction": 0.5}, 400, "bad_request", "$.n"),
    ("n zero", "POST", "/v1/leases", {"n": 0, "fraction": 0.5}, 400, "bad_request", ">= 1"),
    ("n negative", "POST", "/v1/leases", {"n": -3, "fraction": 0.5}, 400, "bad_request", ">= 1"),
    ("n huge", "POST", "/v1/leases", {"n": 10**30, "fraction": 0.5}, 400, "bad_request", "$.n"),
    ("n above the server", "POST", "/v1/leases", {"n": 1000, "fraction": 0.5}, 422, "impossible", "has 4"),
    ("fraction zero", "POST", "/v1/leases", {"n": 1, "fraction": 0}, 400, "bad_request", "$.fraction"),
    ("fraction negative", "POST", "/v1/leases", {"n": 1, "fraction": -0.5}, 400, "bad_request", "$.fraction"),
    ("p > 1", "POST", "/v1/leases", {"n": 1, "fraction": 1.5}, 400, "bad_request", "<= 1"),
    ("MiB zero", "POST", "/v1/leases", {"n": 1, "mem_mib": 0}, 400, "bad_request", "$.mem_mib"),
    ("MiB above the GPU", "POST", "/v1/leases", {"n": 1, "mem_mib": 10**7}, 422, "impossible", "can hold"),
    ("no size", "POST", "/v1/leases", {"n": 1}, 400, "bad_request", "exactly one partition size"),
    (
        "two sizes",
        "POST",
        "/v1/leases",
        {"n": 1, "fraction": 0.5, "mem_mib": 10},
        400,
        "bad_request",
        "exactly one",
    ),
    (
        "unknown field",
        "POST",
        "/v1/leases",
        {"n": 1, "fraction": 0.5, "gpus": 2},
        400,
        "bad_request",
        "unknown field",
    ),
    (
        "filters not a list",
        "POST",
        "/v1/leases",
        {"n": 1, "fraction": 0.5, "filters": "device.id=0"},
        400,
        "bad_request",
        "$.filters",
    ),
    (
        "unknown filter key",
        "POST",
        "/v1/fit",
        {"n": 1, "fraction": 0.5, "filters": ["gpu.name=H100"]},
        400,
        "bad_request",
        "unknown filter key",
    ),
    (
        "filter without op",
        "POST",
        "/v1/fit",
        {"n": 1, "fraction": 0.5, "filters": ["device.name"]},
        400,
        "bad_request",
        "cannot read filter",
    ),
    (
        "filter bad number",
        "POST",
        "/v1/fit",
        {"n": 1, "fraction": 0.5, "filters": ["device.phy-memory>=lots"]},
        400,
        "bad_request",
        "whole number",
    ),
    (
        "sm share > 1",
        "POST",
        "/v1/leases",
        {"n": 1, "fraction": 0.5, "sm_share": 2},
        400,
        "bad_request",
        "$.sm_share",
    ),
    (
        "ttl too long",
        "POST",
        "/v1/leases",
        {"n": 1, "fraction": 0.5, "ttl_s": 7200},
        400,
        "bad_request",
        "maximum",
    ),
    (
        "heartbeat pids wrong",
        "POST",
        "/v1/leases/lease-x/heartbeat",
        {"pids": "1"},
        400,
        "bad_request",
        "$.pids",
    ),
    ("unknown lease", "GET", "/v1/leases/lease-nope", None, 404, "not_found", "no lease lease-nope"),
    ("unknown route", "GET", "/v1/nothing", None, 404, "not_found", "no route"),
    ("wrong method", "PATCH", "/v1/leases", None, 405, "bad_request", "not allowed"),
    ("bad state query", "GET", "/v1/leases?state=zombie", None, 400, "bad_request", "state="),
    ("all without admin", "GET", "/v1/leases?all=true", None, 403, "forbidden", "admin"),
    ("admin route", "GET", "/v1/admin/clients", None, 403, "forbidden", "admin token"),
    ("body too large", "POST", "/v1/leases", b"[" + b"1," * 600_000 + b"1]", 413, "bad_request", ""),
]


@pytest.mark.parametrize("case", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_one_clear_4xx_and_the_server_keeps_serving(pool, case):
    what, method, path, body, status, code, words = case
    a, _ = pool
    tok = a.token("badinput")
    raw = body if isinstance(body, bytes) else None
    got, ans = api(a.url, method, path, tok, body=None if raw is not None else body, raw=raw)
    assert got == status, (what, ans)
    assert ans["code"] == code and words in ans["error"], ans
    assert "\n" not in ans["error"] and "Traceback" not in json.dumps(ans)
    assert api(a.url, "GET", "/v1/health")[0] == 200


def test_tokens_missing_wrong_revoked_expired(pool):
    a, _ = pool
    url = a.url
    status, ans = api(url, "GET", "/v1/gpus")
    assert status == 401 and ans["error"] == "missing token"
    status, ans = api(url, "GET", "/v1/gpus", "gp_not-a-real-token")
    assert status == 401 and ans["error"] == "invalid token"
    expired = a.token("shortlived", expires_in_s=0.2)
    assert api(url, "GET", "/v1/gpus", expired)[0] == 200
    time.sleep(0.4)
    status, ans = api(url, "GET", "/v1/gpus", expired)
    assert status == 401 and ans["code"] == "token_expired" and ans["error"].startswith("token expired at 20")
    # created and revoked through the admin API; the secret is shown once, listing never shows it
    admin = a.token("root-tokens", admin=True)
    status, created = api(url, "POST", "/v1/admin/tokens", admin, {"client": "erin", "expires_in_s": 3600})
    assert status == 201 and created["token"].startswith("gp_")
    assert api(url, "GET", "/v1/gpus", created["token"])[0] == 200
    _, listing = api(url, "GET", "/v1/admin/tokens", admin)
    assert created["token"] not in json.dumps(listing)
    api(url, "DELETE", f"/v1/admin/tokens/{created['id']}", admin)
    status, ans = api(url, "GET", "/v1/gpus", created["token"])
    assert status == 401 and "revoked" in ans["error"]
    status, ans = api(url, "POST", "/v1/admin/tokens", admin, {"client": "bad name!"})
    assert status == 400 and "$.client" in ans["error"]


def test_token_cli_prints_a_token_and_stores_only_its_hash(tmp_path):
    state = tmp_path / "state"
    state.mkdir()  # a state directory that does not exist is a typo, not a new store
    out = subprocess.run([*server_cmd(), "token", "create", "frank", "--expires", "365d", "--state-dir", str(state)],
                         capture_output=True, text=True, timeout=30, cwd=ROOT)  # fmt: skip
    assert out.returncode == 0, out.stderr
    token = out.stdout.strip()
    assert token.startswith("gp_") and "expires 20" in out.stderr
    assert token.encode() not in (state / "pool.sqlite").read_bytes()
    listing = subprocess.run(
        [*server_cmd(), "token", "list", "--state-dir", str(state)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert "frank" in listing.stdout and token not in listing.stdout
    bad = subprocess.run(
        [*server_cmd(), "token", "create", "x y", "--state-dir", str(state)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode != 0 and bad.stderr.count("\n") == 1 and "not allowed" in bad.stderr


def test_remote_lease_on_simulated_gpus_is_refused_clearly(pool):
    a, _ = pool
    tok = a.token("remote")
    status, ans = api(a.url, "POST", "/v1/leases", tok, lease_req(1, 0.5, remote=True))
    assert status == 422 and ans["code"] == "remote_unavailable" and "simulated" in ans["error"]
    _, fit = api(a.url, "POST", "/v1/fit", tok, lease_req(1, 0.5, remote=True))
    assert fit["fits_now"] is False and fit["code"] == "remote_unavailable"
    assert api(a.url, "GET", "/v1/leases", tok)[1]["leases"] == []


def test_every_answer_is_labelled_simulated(pool):
    a, _ = pool
    tok = a.token("labels")
    assert api(a.url, "GET", "/v1/health")[1]["simulated"] is True
    assert api(a.url, "GET", "/v1/gpus", tok)[1]["simulated"] is True
    _, lease = api(a.url, "POST", "/v1/leases", tok, lease_req(1, 0.1))
    assert lease["simulated"] is True and lease["server"]["simulated"] is True
    assert all("(simulated)" in p["gpu_name"] for p in lease["partitions"])
    api(a.url, "DELETE", f"/v1/leases/{lease['id']}", tok)


def test_pool_events_land_in_telemetry(tmp_path):
    tel = tmp_path / "telemetry"
    srv = ServerProc(tmp_path / "s", "2xH100-80GB", extra=("--telemetry", str(tel))).start()
    tok = srv.token("events")
    _, lease = api(srv.url, "POST", "/v1/leases", tok, lease_req(2, 0.5))
    api(srv.url, "POST", "/v1/leases", tok, lease_req(3, 0.5))  # impossible: a denial with its reason
    api(srv.url, "DELETE", f"/v1/leases/{lease['id']}", tok)
    srv.proc.send_signal(signal.SIGTERM)  # a clean stop flushes the buffered events
    assert srv.proc.wait(timeout=20) == 0
    import pyarrow.dataset as ds

    rows = ds.dataset(tel / "pool_events", format="parquet", partitioning="hive").to_table().to_pylist()
    events = sorted((r["event"], r["gpu_index"]) for r in rows)
    assert events[:2] == [("deny", None), ("grant", 0)] and ("release", 1) in events
    deny = next(r for r in rows if r["event"] == "deny")
    assert "has 2" in deny["reason"] and deny["client"] == "events" and deny["simulated"] is True
    release = [r for r in rows if r["event"] == "release"]
    assert all(
        r["lease_id"] == lease["id"] and r["fraction"] == 0.5 and r["duration_s"] >= 0 for r in release
    )
    assert {r["host"] for r in rows} == {os.uname().nodename}


def test_startup_errors_are_one_line(tmp_path, pool):
    a, _ = pool
    (tmp_path / "file").write_text("")
    cases = [
        ((), "no GPUs to serve"),  # no NVML on this machine (on a GPU host this case is skipped)
        (("--simulate-gpus", "4xFOO"), "cannot read simulated GPU spec"),
        (("--simulate-gpus", "1xH100-80GB", "--mps"), "--mps needs real GPUs"),
        (
            ("--simulate-gpus", "1xH100-80GB", "--port", str(a.port), "--host", "127.0.0.1"),
            "cannot listen on",
        ),
        (
            ("--simulate-gpus", "1xH100-80GB", "--telemetry", str(tmp_path / "file" / "x")),
            "telemetry directory not writable",
        ),
        (
            ("--simulate-gpus", "1xH100-80GB", "--tls-cert", str(tmp_path / "file")),
            "needs both --tls-cert and --tls-key",
        ),
        (("--config", str(tmp_path / "nope.toml")), "config file"),
    ]
    for extra, words in cases:
        out = subprocess.run([*server_cmd(), "serve", "--state-dir", str(tmp_path / "state"), "--port", "0", *extra],
                             capture_output=True, text=True, timeout=30, cwd=ROOT)  # fmt: skip
        if not extra and out.returncode == 0:
            continue
        assert out.returncode == 2, (extra, out.stderr)
        errors = [line for line in out.stderr.splitlines() if line.startswith("gpupool-server: error: ")]
        assert len(errors) == 1 and words in errors[0] and out.stderr.endswith(errors[0] + "\n"), (
            extra,
            out.stderr,
        )
        assert "Traceback" not in out.stderr


def test_admin_sees_and_releases_any_lease_with_the_reason_saying_so(pool):
    a, _ = pool
    admin, tok = a.token("root-release", admin=True), a.token("victim")
    _, lease = api(a.url, "POST", "/v1/leases", tok, lease_req(1, 0.1))
    _, everyone = api(a.url, "GET", "/v1/leases?all=true", admin)
    seen = next(x for x in everyone["leases"] if x["id"] == lease["id"])
    assert "env" not in seen and "worker" not in seen  # another client's secrets stay hidden
    status, other = api(a.url, "DELETE", f"/v1/leases/{lease['id']}", a.token("someone-else"))
    assert status == 403 and other["code"] == "forbidden"
    status, ended = api(a.url, "DELETE", f"/v1/leases/{lease['id']}", admin)
    assert (
        status == 200 and ended["state"] == "released" and ended["reason"] == "released by admin root-release"
    )
    _, mine = api(a.url, "GET", f"/v1/leases/{lease['id']}", tok)
    assert mine["reason"] == "released by admin root-release"


def test_client_cli_changes_policy_of_a_running_server(pool):
    a, _ = pool
    tok = a.token("cli-limited")
    run = [
        *server_cmd(),
        "client",
        "set",
        "cli-limited",
        "--limit",
        "0.5",
        "--idle-timeout",
        "1h",
        "--state-dir",
        str(a.state_dir),
    ]
    out = subprocess.run(run, capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert out.returncode == 0 and "cli-limited" in out.stdout and "3600s" in out.stdout, out.stderr
    status, ans = api(a.url, "POST", "/v1/leases", tok, lease_req(1, 0.75))
    assert status == 403 and "limit of 0.50" in ans["error"]
    listing = subprocess.run(
        [*server_cmd(), "client", "list", "--state-dir", str(a.state_dir)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert any(line.split()[:2] == ["cli-limited", "0.5"] for line in listing.stdout.splitlines())


def test_a_query_parameter_the_route_does_not_take_is_refused_not_ignored(pool):
    a, _ = pool
    tok = a.token("typo")
    status, ans = api(a.url, "GET", "/v1/leases?al=true", tok)
    assert status == 400 and ans["error"] == "unknown query parameter 'al' for GET /v1/leases"
    assert "all" in ans["hint"]
    assert api(a.url, "GET", "/v1/leases?all=false", tok)[0] == 200
