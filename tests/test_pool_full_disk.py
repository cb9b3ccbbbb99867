"""gpupool-server on a real full disk (a small tmpfs filled to the last byte), and one server per state dir.

What an operator whose disk fills must get: new writes refused with 507 and a one-line hint, releases
and heartbeats of running leases never lost (kept in memory, written when space returns), a server
that restarts read-only and says so, /v1/health telling the condition, CLIs that print one line.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import time

import pytest
from pool_harness import ROOT, ServerProc, api, client_env, gpuattach, server_cmd, wait_for
from small_disk import small_disk

pytestmark = pytest.mark.timeout(120)


def stored(state_dir, lease_id: str) -> dict:
    """The lease as the database file holds it (what a restart would find), read by another process's
    connection, not the server's memory."""
    from server._store import Store

    store = Store(state_dir / "pool.sqlite")
    try:
        return {k: v for k, v in store.lease_row(lease_id).items() if k in ("state", "reason", "expires")}
    finally:
        store.close()


def epoch(iso: str) -> float:
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def full_disk_server(tmp_path, disk, *extra) -> ServerProc:
    server = ServerProc(disk.path / "state", extra=("--log-level", "INFO", *extra))
    server.log = tmp_path / "server.log"  # the log stays readable while the state disk is full
    return server


def test_a_full_disk_refuses_new_writes_and_loses_no_release_or_heartbeat(tmp_path):
    """Disk full: grants, settings and tokens are refused (507, one CLI line, no token printed); a
    release, heartbeats and an expiry through two TTLs answer as with room and reach the database file
    once space is freed; health says degraded, then ok; new grants work again."""
    with small_disk(tmp_path / "disk") as disk:
        server = full_disk_server(tmp_path, disk, "--lease-ttl", "3s").start()
        try:
            token, admin = server.token("alice"), server.token("root", admin=True)
            ids = [
                api(server.url, "POST", "/v1/leases", token, {"n": 1, "fraction": 0.25})[1]["id"]
                for _ in range(3)
            ]
            kept_alive, released, abandoned = ids
            disk.fill(keep=True)  # whatever SQLite frees again is taken at once

            # What cannot wait is refused: 507, its code, a hint; nothing half-stored.
            status, answer = api(server.url, "POST", "/v1/leases", token, {"n": 1, "fraction": 0.25})
            assert status == 507 and answer["code"] == "storage_full" and answer["hint"]
            status, fit = api(server.url, "POST", "/v1/fit", token, {"n": 1, "fraction": 0.25})
            assert status == 200 and not fit["fits_now"] and fit["code"] == "storage_full"
            assert api(server.url, "PUT", "/v1/admin/policy", admin, {"default_limit": 2})[0] == 507
            cli = subprocess.run([*server_cmd(), "token", "create", "bob", "--state-dir", str(server.state_dir)],
                                 capture_output=True, text=True, timeout=60, cwd=ROOT)  # fmt: skip
            assert cli.returncode != 0 and cli.stdout == ""  # no token printed that was never stored
            assert len(cli.stderr.strip().splitlines()) == 1 and "Traceback" not in cli.stderr

            # A release answers released at once and its capacity is free in every view.
            status, lease = api(server.url, "DELETE", f"/v1/leases/{released}", token)
            assert status == 200 and lease["state"] == "released"
            assert api(server.url, "GET", f"/v1/leases/{released}", token)[1]["state"] == "released"
            in_use = {
                p["lease_id"]
                for g in api(server.url, "GET", "/v1/gpus", token)[1]["gpus"]
                for p in g["partitions"]
            }
            assert released not in in_use and kept_alive in in_use

            health = api(server.url, "GET", "/v1/health")[1]
            assert health["status"] == "degraded" and health["store"]["writable"] is False
            assert health["store"]["unsaved_leases"] >= 1 and health["store"]["hint"]

            # Two TTLs pass on the full disk: the heartbeated lease lives, the abandoned one expires.
            deadline = time.monotonic() + 7
            while time.monotonic() < deadline:
                status, beat = api(server.url, "POST", f"/v1/leases/{kept_alive}/heartbeat", token, {})
                assert status == 200, beat
                time.sleep(0.5)
            last_deadline = epoch(beat["expires_at"])
            assert api(server.url, "GET", f"/v1/leases/{kept_alive}", token)[1]["state"] == "active"
            assert api(server.url, "GET", f"/v1/leases/{abandoned}", token)[1]["state"] == "expired"
            assert stored(server.state_dir, released)["state"] == "active"  # nothing could be written yet

            disk.free()
            wait_for(lambda: api(server.url, "GET", "/v1/health")[1]["status"] == "ok", 15, what="health ok")
            assert api(server.url, "GET", "/v1/health")[1]["store"] == {"writable": True, "unsaved_leases": 0}
            # Everything kept in memory is now in the database file.
            assert stored(server.state_dir, released)["state"] == "released"
            assert stored(server.state_dir, abandoned)["state"] == "expired"
            assert stored(server.state_dir, kept_alive)["expires"] >= last_deadline - 1  # ISO rounds to 1 s
            assert api(server.url, "POST", "/v1/leases", token, {"n": 1, "fraction": 0.25})[0] == 201
            log = server.log.read_text()
            assert "state disk full" in log and "has room again" in log and "Traceback" not in log
        finally:
            server.stop()


def test_a_server_restarted_on_a_full_disk_serves_read_only_and_says_so(tmp_path):
    """A restart on a full disk (no room even for SQLite's shared-memory index) comes up read-only,
    says so on its ready line and in health, serves its leases, keeps a release until there is room,
    then grants again and lets the token CLI work beside it."""
    with small_disk(tmp_path / "disk") as disk:
        server = full_disk_server(tmp_path, disk).start()
        try:
            token = server.token("alice")
            lease = api(server.url, "POST", "/v1/leases", token, {"n": 1, "fraction": 0.5})[1]["id"]
            server.stop()
            disk.fill()
            server.start()  # starts: no crash on opening the store, no lost state
            assert "READ-ONLY" in server.banner
            health = api(server.url, "GET", "/v1/health")[1]
            assert health["status"] == "degraded" and health["store"]["writable"] is False
            assert api(server.url, "GET", f"/v1/leases/{lease}", token)[1]["state"] == "active"
            assert api(server.url, "POST", "/v1/leases", token, {"n": 1, "fraction": 0.25})[0] == 507
            assert api(server.url, "DELETE", f"/v1/leases/{lease}", token)[1]["state"] == "released"

            disk.free()
            wait_for(lambda: api(server.url, "GET", "/v1/health")[1]["status"] == "ok", 15, what="health ok")
            assert stored(server.state_dir, lease)["state"] == "released"
            assert api(server.url, "POST", "/v1/leases", token, {"n": 1, "fraction": 0.25})[0] == 201
            # Back to a shared database: the token CLI works beside the running server again.
            cli = subprocess.run([*server_cmd(), "token", "create", "bob", "--state-dir", str(server.state_dir)],
                                 capture_output=True, text=True, timeout=60, cwd=ROOT)  # fmt: skip
            assert cli.returncode == 0 and cli.stdout.startswith("gp_"), cli.stderr
        finally:
            server.stop()


def test_gpuattach_passes_over_a_full_disk_server_and_waits_when_it_is_the_only_one(tmp_path):
    """gpuattach takes its lease from a server with room while another's disk is full; with only the
    full one it waits and retries up to --timeout (the disk may get room) instead of refusing at once."""
    with small_disk(tmp_path / "disk") as disk:
        full = full_disk_server(tmp_path, disk).start()
        roomy = ServerProc(tmp_path / "roomy").start()
        try:
            token = full.token("alice")
            roomy.token("alice", token=token)
            disk.fill(keep=True)
            show_lease = "import os; print(os.environ['GPUPOOL_LEASE_ID'])"
            env = client_env(tmp_path, [full.url, roomy.url], token)
            out = gpuattach(
                "run", "-n", "1", "-p", "0.25", "--local", "--", sys.executable, "-c", show_lease, env=env
            )
            assert out.returncode == 0, out.stderr
            lease_id = out.stdout.strip().splitlines()[-1]
            assert api(roomy.url, "GET", f"/v1/leases/{lease_id}", token)[0] == 200

            only_full = client_env(tmp_path, [full.url], token)
            started = time.monotonic()
            out = gpuattach(
                "run", "-n", "1", "-p", "0.25", "--local", "--timeout", "2s", "--", "true", env=only_full
            )
            assert out.returncode == 125 and time.monotonic() - started >= 2, out.stderr
            assert out.stderr.strip().splitlines()[-1].startswith("gpuattach: error: ")  # one line at the end
            assert "Traceback" not in out.stderr
        finally:
            full.stop()
            roomy.stop()


def test_a_second_server_on_the_same_state_dir_is_refused_with_the_first_ones_pid(tmp_path):
    """Two real server processes on one state directory: the second exits non-zero with one line
    naming the first one's PID; after kill -9 of the first, a new one starts (no stale lock)."""
    first = ServerProc(tmp_path / "state").start()
    try:
        second = subprocess.run(
            [*server_cmd(), "serve", "--host", "127.0.0.1", "--port", "0", "--state-dir", str(first.state_dir),
             "--simulate-gpus", "1xH100-80GB"],
            capture_output=True, text=True, timeout=60, cwd=ROOT,
        )  # fmt: skip
        assert second.returncode != 0 and "listening on" not in second.stdout
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and f"PID {first.proc.pid}" in lines[0], second.stderr
        # A crash leaves no lock behind: the next server starts at once.
        first.kill9()
        first.start()
        assert api(first.url, "GET", "/v1/health")[0] == 200
    finally:
        first.stop()
