"""gpuattach against real gpupool-server processes on loopback (simulated GPUs)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from pool_harness import ROOT, ServerProc, api, client_env, env_for, gpuattach, gpuattach_cmd, wait_for

pytestmark = pytest.mark.timeout(120)
PY = sys.executable


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    base = tmp_path_factory.mktemp("cpool")
    a = ServerProc(base / "a", "4xH100-80GB").start()
    b = ServerProc(base / "b", "2xA100-40GB").start()
    yield a, b
    a.stop()
    b.stop()


def active(server, token):
    return api(server.url, "GET", "/v1/leases", token)[1]["leases"]


def one_line_error(stderr: str, *words: str) -> None:
    errors = [line for line in stderr.splitlines() if line.startswith("gpuattach: error:")]
    assert len(errors) == 1, stderr
    assert "Traceback" not in stderr
    for w in words:
        assert w in errors[0], errors[0]


def test_run_returns_the_command_exit_code_and_releases(pool, tmp_path):
    a, b = pool
    env, token = env_for(tmp_path, [a, b], "runner")
    code = "import os, sys; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['GPUPOOL_LEASE_ID']); sys.exit(7)"
    out = gpuattach("run", "-n", "2", "-p", "0.5", "--local", "--", PY, "-c", code, env=env)
    assert out.returncode == 7, out.stderr
    uuids, lease_id = out.stdout.split()
    assert len(uuids.split(",")) == 2 and lease_id.startswith("lease-")
    assert "advisory" in out.stderr and "SIMULATED" in out.stderr
    assert active(a, token) == [] and active(b, token) == []
    ended = [
        lease for s in (a, b) for lease in api(s.url, "GET", "/v1/leases?state=ended", token)[1]["leases"]
    ]
    assert [(lease["id"], lease["state"]) for lease in ended] == [(lease_id, "released")]


def test_more_gpus_than_any_server_fails_at_once(pool, tmp_path):
    env, _ = env_for(tmp_path, list(pool), "greedy")
    start = time.monotonic()
    out = gpuattach("run", "-n", "5", "-p", "0.5", "--local", "--timeout", "60s", "--", "true", env=env)
    assert out.returncode == 125
    assert time.monotonic() - start < 10  # no waiting for something that can never fit
    one_line_error(out.stderr, "asks for 5 GPUs", "largest server of the pool has 4")


def test_tightest_fit_wins_across_servers(pool, tmp_path):
    a, b = pool
    env, token = env_for(tmp_path, [a, b], "packer")
    # half of B's GPU 1 is taken: a quarter there leaves the least memory free anywhere in the pool
    _, half = api(b.url, "POST", "/v1/leases", token, {"n": 1, "fraction": 0.5, "filters": ["device.id=1"]})
    out = gpuattach(
        "run",
        "-n",
        "1",
        "-p",
        "0.25",
        "--local",
        "--",
        PY,
        "-c",
        "import os; print(os.environ['GPUPOOL_LEASE_ID'])",
        env=env,
    )
    status, ended = api(b.url, "GET", f"/v1/leases/{out.stdout.strip()}", token)
    assert status == 200 and ended["partitions"][0]["gpu_index"] == 1
    api(b.url, "DELETE", f"/v1/leases/{half['id']}", token)
    # a filter that only A can satisfy moves it
    out = gpuattach("run", "-n", "1", "-p", "0.25", "--local", "--filter", "device.name=H100", "--", PY, "-c",
                    "import os; print(os.environ['GPUPOOL_LEASE_ID'])", env=env)  # fmt: skip
    assert api(a.url, "GET", f"/v1/leases/{out.stdout.strip()}", token)[0] == 200


def test_waits_with_backoff_until_a_partition_frees_or_the_timeout(tmp_path):
    srv = ServerProc(tmp_path / "s", "1xH100-80GB").start()
    try:
        env, token = env_for(tmp_path, [srv], "waiter")
        _, blocker = api(srv.url, "POST", "/v1/leases", token, {"n": 1, "fraction": 1.0})
        out = gpuattach("run", "-n", "1", "-p", "0.5", "--local", "--timeout", "1s", "--", "true", env=env)
        assert out.returncode == 125
        one_line_error(out.stderr, "waited 1s for 1 GPU × 0.5 of a GPU", "not available now")
        proc = subprocess.Popen([*gpuattach_cmd(), "run", "-n", "1", "-p", "0.5", "--local", "--timeout", "20s", "--", "true"],
                                env=env, stderr=subprocess.PIPE, text=True, cwd=ROOT)  # fmt: skip
        time.sleep(1.5)
        assert proc.poll() is None  # still waiting
        api(srv.url, "DELETE", f"/v1/leases/{blocker['id']}", token)
        assert proc.wait(timeout=20) == 0
        assert "waiting up to 20s" in proc.stderr.read()
    finally:
        srv.stop()


CHILD = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *a: sys.exit(42))
signal.signal(signal.SIGINT, lambda *a: sys.exit(33))
print("ready", flush=True)
time.sleep(30)
"""


@pytest.mark.parametrize(
    ("sig", "code"), [(signal.SIGTERM, 42), (signal.SIGINT, 33)], ids=["SIGTERM", "SIGINT (Ctrl-C)"]
)
def test_signals_are_forwarded_and_the_lease_released(pool, tmp_path, sig, code):
    a, _ = pool
    env, token = env_for(tmp_path, [a], f"signals{code}")
    proc = subprocess.Popen([*gpuattach_cmd(), "run", "-n", "1", "-p", "0.1", "--local", "--", PY, "-c", CHILD],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)  # fmt: skip
    assert proc.stdout.readline().strip() == "ready"
    assert len(active(a, token)) == 1
    proc.send_signal(sig)
    assert proc.wait(timeout=20) == code
    assert active(a, token) == []


def test_kill9_of_the_client_loses_the_lease_after_the_ttl(tmp_path):
    srv = ServerProc(
        tmp_path / "s", "1xH100-80GB", config='[policy]\nlease_ttl = "1s"\nreap_interval = 0.2\n'
    ).start()
    try:
        env, token = env_for(tmp_path, [srv], "killed")
        proc = subprocess.Popen([*gpuattach_cmd(), "run", "-n", "1", "-p", "0.5", "--local", "--", PY, "-c", CHILD],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)  # fmt: skip
        assert proc.stdout.readline().strip() == "ready"
        (lease,) = active(srv, token)
        time.sleep(1.5)  # heartbeats keep it past one TTL
        assert api(srv.url, "GET", f"/v1/leases/{lease['id']}", token)[1]["state"] == "active"
        child_pid = [
            p for p in api(srv.url, "GET", f"/v1/leases/{lease['id']}", token)[1]["pids"] if p != proc.pid
        ]
        proc.kill()
        proc.wait(timeout=10)
        got = wait_for(
            lambda: (
                (g := api(srv.url, "GET", f"/v1/leases/{lease['id']}", token)[1])["state"] == "expired" and g
            ),
            5,
            what="expiry",
        )
        assert "no heartbeat for 1s" in got["reason"]
        for pid in child_pid:
            subprocess.run(["kill", "-9", str(pid)], check=False)
    finally:
        srv.stop()


def test_idle_run_is_reclaimed_and_told_why_busy_run_is_not(tmp_path):
    config = '[policy]\nreap_interval = 0.2\ndefault_idle_timeout = "1.5s"\n'
    srv = ServerProc(tmp_path / "s", "1xH100-80GB", config=config).start()
    try:
        env, _ = env_for(tmp_path, [srv], "sleepy")
        out = gpuattach("run", "-n", "1", "-p", "0.5", "--local", "--", "sleep", "30", env=env, timeout=30)
        assert out.returncode == 128 + signal.SIGTERM
        assert "was reclaimed: idle for" in out.stderr and "stopping the command" in out.stderr
        # simulated GPUs: CPU time of the lease's processes stands in for GPU work
        busy = "import time\nt = time.time()\nwhile time.time() - t < 3.5: pass\nprint('done')"
        out = gpuattach("run", "-n", "1", "-p", "0.5", "--local", "--", PY, "-c", busy, env=env, timeout=30)
        assert out.returncode == 0 and out.stdout.strip() == "done", out.stderr
    finally:
        srv.stop()


def test_session_lease_is_kept_alive_by_its_keeper_and_released(tmp_path):
    srv = ServerProc(
        tmp_path / "s", "2xH100-80GB", config='[policy]\nlease_ttl = "1s"\nreap_interval = 0.2\n'
    ).start()
    try:
        env, token = env_for(tmp_path, [srv], "session")
        out = gpuattach("request", "-n", "1", "-m", "8192", "--local", env=env)
        assert out.returncode == 0, out.stderr
        lease_id = out.stdout.strip()
        time.sleep(2.5)  # well past the 1 s TTL: the keeper heartbeats it
        lease = api(srv.url, "GET", f"/v1/leases/{lease_id}", token)[1]
        assert lease["state"] == "active" and lease["partitions"][0]["mem_bytes"] == 8192 << 20
        out = gpuattach(  # as docs/pool.md shows it: a --local lease runs locally without saying so again
            "run",
            "--lease",
            lease_id,
            "--",
            PY,
            "-c",
            "import os; print(os.environ['GPUPOOL_LEASE_ID'])",
            env=env,
        )
        assert out.returncode == 0 and out.stdout.strip() == lease_id
        assert (
            api(srv.url, "GET", f"/v1/leases/{lease_id}", token)[1]["state"] == "active"
        )  # run --lease keeps it
        out = gpuattach("smi", lease_id, env=env)
        assert lease_id in out.stdout and "8192MiB" in out.stdout.replace("8.0GiB", "8192MiB")
        out = gpuattach("release", lease_id, env=env)
        assert out.returncode == 0 and "released" in out.stdout
        log = tmp_path / "cache" / "gpupool" / f"keeper-{lease_id}.log"
        wait_for(lambda: log.exists() and "ended" in log.read_text(), 5, what="keeper exit")
    finally:
        srv.stop()


def test_read_only_commands_show_the_pool(pool, tmp_path):
    env, _ = env_for(tmp_path, list(pool), "viewer")
    out = gpuattach("list-gpus", env=env)
    assert out.returncode == 0 and out.stdout.count("(simulated)") >= 6 and "A100" in out.stdout
    out = gpuattach("servers", env=env)
    assert out.returncode == 0 and out.stdout.count(" up ") == 2
    out = gpuattach("smi", env=env)
    assert out.returncode == 0 and "6 GPUs" in out.stdout and "SIMULATED" in out.stdout
    out = gpuattach("list-gpus", "--json", env=env)
    answers = json.loads(out.stdout)
    assert sorted(a["url"] for a in answers) == sorted(s.url for s in pool)  # which server said what
    assert all(a["server"]["hostname"] and a["gpus"] for a in answers)


def test_clear_errors(pool, tmp_path):
    a, _ = pool
    env, _ = env_for(tmp_path, [a], "errs")
    out = gpuattach(
        "run", "-n", "1", "-p", "0.5", "--local", "--filter", "gpu.kind=H100", "--", "true", env=env
    )
    assert out.returncode == 125
    one_line_error(out.stderr, "unknown filter key 'gpu.kind'", "device.phy-memory")
    out = gpuattach("run", "-n", "1", "-p", "1.5", "--local", "--", "true", env=env)
    one_line_error(out.stderr, "-p", "1.5", "out of range (0.015625-1)")
    assert out.returncode == 125
    out = gpuattach("--token", "gp_wrong", "list-gpus", env=env)
    assert out.returncode == 125
    one_line_error(out.stderr, "invalid token")
    out = gpuattach("run", "-n", "1", "-p", "0.5", "--local", "--token", "gp_wrong", "--", "true", env=env)
    one_line_error(out.stderr, "invalid token")
    out = gpuattach("--server", "127.0.0.1:1", "run", "-n", "1", "--local", "--", "true", env=env)
    one_line_error(out.stderr, "unreachable", "127.0.0.1:1")
    out = gpuattach("--server", f"{a.url},127.0.0.1:1", "servers", env=env)
    assert out.returncode == 125 and "DOWN" in out.stdout and " up " in out.stdout
    out = gpuattach(
        "--server", f"{a.url},127.0.0.1:1", "run", "-n", "1", "-p", "0.1", "--local", "--", "true", env=env
    )
    assert out.returncode == 0, out.stderr  # one dead server does not stop the pool
    out = gpuattach(
        "run", "-n", "1", "-p", "0.5", "--", "true", env=env
    )  # remote, but the GPUs are simulated
    one_line_error(out.stderr, "no server of the pool runs remote leases", "simulated", "--local")
    out = gpuattach(
        "run", "-n", "1", "-p", "0.5", "--", "true", env=env
    )  # remote, but the GPUs are simulated
    one_line_error(out.stderr, "no server of the pool runs remote leases", "simulated", "--local")
    out = gpuattach("run", "-n", "1", "-p", "0.5", "--local", "--isolate", "--", "true", env=env)
    assert out.returncode == 125
    one_line_error(out.stderr, "--isolate is for remote runs")
    lease = gpuattach("request", "-n", "1", "-p", "0.25", "--local", env=env).stdout.strip()
    out = gpuattach("run", "--lease", lease, "--isolate", "--", "true", env=env)  # a --local lease: the same
    assert out.returncode == 125
    one_line_error(out.stderr, "--isolate is for remote runs", lease)
    assert gpuattach("release", lease, env=env).returncode == 0
    out = gpuattach("run", "-n", "1", "--local", "--", "no-such-command-xyz", env=env)
    assert out.returncode == 127 and "command not found" in out.stderr
    out = gpuattach("release", "lease-000000000000", env=env)
    assert out.returncode == 125 and "no lease lease-000000000000" in out.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("servers = [")
    out = gpuattach("--config", str(bad), "servers", env=env)
    one_line_error(out.stderr, "not valid TOML")


def test_tls_with_a_private_ca(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)  # fmt: skip
    srv = ServerProc(
        tmp_path / "s",
        "1xH100-80GB",
        config='[policy]\nlease_ttl = "1s"\n',
        extra=("--tls-cert", str(cert), "--tls-key", str(key)),
    ).start()
    try:
        assert srv.url.startswith("https://")
        token = srv.token("secure")
        cfg = tmp_path / "tls.toml"
        cfg.write_text(f'token = "{token}"\nservers = ["{srv.url}"]\nca_cert = "{cert}"\n')
        env = client_env(tmp_path, [srv.url], token)
        out = gpuattach("--config", str(cfg), "run", "-n", "1", "-p", "0.5", "--local", "--", "true", env=env)
        assert out.returncode == 0, out.stderr
        out = gpuattach("--config", str(cfg), "request", "-n", "1", "-p", "0.25", "--local", env=env)
        lease_id = out.stdout.strip()
        time.sleep(0.5)  # the keeper heartbeats over TLS too (it was given the CA)
        out = gpuattach("--config", str(cfg), "release", lease_id, env=env)
        assert out.returncode == 0
        log = tmp_path / "cache" / "gpupool" / f"keeper-{lease_id}.log"
        wait_for(lambda: log.exists() and "released" in log.read_text(), 40, what="keeper over TLS")
        out = gpuattach("list-gpus", env=env)  # without the CA: refused, one line
        assert out.returncode == 125 and "TLS failed" in out.stderr
    finally:
        srv.stop()


def test_many_gpuattach_processes_race_for_the_last_partitions(tmp_path):
    servers = [ServerProc(tmp_path / f"s{i}", "1xH100-80GB").start() for i in range(2)]
    try:
        env, token = env_for(tmp_path, servers, "racers")
        # 2 servers × 1 GPU × 4 quarters = 8 partitions for 14 clients that do not wait
        procs = [subprocess.Popen([*gpuattach_cmd(), "request", "-n", "1", "-p", "0.25", "--local", "--no-keeper", "--timeout", "0"],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
                 for _ in range(14)]  # fmt: skip
        results = [(p.wait(timeout=60), p.stdout.read().strip(), p.stderr.read()) for p in procs]
        won = [out for rc, out, _ in results if rc == 0]
        lost = [err for rc, _, err in results if rc != 0]
        assert len(won) == 8 and len(set(won)) == 8
        assert all("waited 0s" in err for err in lost), lost
        leases = [lease for s in servers for lease in active(s, token)]
        assert sorted(lease["id"] for lease in leases) == sorted(won)
        for s in servers:
            _, gpus = api(s.url, "GET", "/v1/gpus", token)
            assert gpus["gpus"][0]["mem_free_bytes"] == 0  # full, and not one byte more
    finally:
        for s in servers:
            s.stop()


def test_a_run_survives_a_server_kill9_and_restart(tmp_path):
    srv = ServerProc(
        tmp_path / "s", "1xH100-80GB", config='[policy]\nlease_ttl = "2s"\nreap_interval = 0.2\n'
    ).start()
    try:
        env, token = env_for(tmp_path, [srv], "survivor")
        child = "import time; print('ready', flush=True); time.sleep(5); print('done', flush=True)"
        proc = subprocess.Popen([*gpuattach_cmd(), "run", "-n", "1", "-p", "0.5", "--local", "--", PY, "-c", child],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)  # fmt: skip
        assert proc.stdout.readline().strip() == "ready"
        (lease,) = active(srv, token)
        srv.kill9()
        time.sleep(1.5)  # the client's heartbeats fail meanwhile; it warns and keeps trying
        srv.start()  # same state dir, same port
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0 and out.strip() == "done", err
        assert "heartbeat failed" in err and "was expired" not in err
        got = api(srv.url, "GET", f"/v1/leases/{lease['id']}", token)[1]
        assert got["state"] == "released" and got["reason"] == "released by its client"
    finally:
        srv.stop()


def test_ctrl_c_at_a_terminal_stops_the_command_and_releases(pool, tmp_path):
    """A real pseudo-terminal: the command gets the foreground, ^C reaches it once, the lease goes."""
    import os
    import pty

    a, _ = pool
    env, token = env_for(tmp_path, [a], "terminal")
    child = "import sys, time\ntry:\n    print('ready', flush=True)\n    time.sleep(30)\nexcept KeyboardInterrupt:\n    print('interrupted once', flush=True)\n    sys.exit(5)"
    pid, fd = pty.fork()
    if pid == 0:  # the child: gpuattach on the terminal
        os.chdir(ROOT)
        os.execvpe(
            gpuattach_cmd()[0],
            [*gpuattach_cmd(), "run", "-n", "1", "-p", "0.1", "--local", "--", PY, "-c", child],
            env,
        )
    output = b""
    try:
        deadline = time.monotonic() + 30
        while b"ready" not in output and time.monotonic() < deadline:
            output += os.read(fd, 1024)
        assert b"ready" in output, output
        os.write(fd, b"\x03")  # Ctrl-C typed at the terminal
        _, status = os.waitpid(pid, 0)
        try:
            while chunk := os.read(fd, 1024):
                output += chunk
        except OSError:
            pass  # the terminal closed
    finally:
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 5, output
    assert output.count(b"interrupted once") == 1
    assert active(a, token) == []


def test_the_heartbeat_loop_reports_a_lease_that_ended_once_and_stops(pool):
    """The one heartbeat loop (``server.client.Heartbeater``, run by ``gpuattach run`` and the session
    keeper): a lease released under it is reported once with its final state and reason, and the loop
    ends."""
    from server.client import Heartbeater, LeaseRequest, PoolClient
    from server.client_config import ClientConfig, ServerRef

    a, _ = pool
    server = ServerRef(a.url, a.token("beats"))
    client = PoolClient(ClientConfig(servers=[server], token=server.token))
    _, lease = client.acquire(LeaseRequest(n=1, fraction=0.25), timeout_s=5)
    client.release(server, lease.id)
    ends: list[tuple[str, str]] = []
    beats = Heartbeater(
        client, server, lease.id, 0.05, on_end=lambda *end: ends.append(end), give_up_after_s=5
    )
    assert beats.run() == "ended"
    assert len(ends) == 1 and ends[0][0] == "released" and "released by" in ends[0][1], ends


def test_the_heartbeat_loop_gives_up_on_a_server_that_stays_away(tmp_path):
    """With ``give_up_after_s`` (the keeper: three TTLs), a server that never answers ends the loop as
    "gave up" after warning once, not once per beat."""
    import socket

    from server.client import Heartbeater, PoolClient
    from server.client_config import ClientConfig, ServerRef

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ServerRef(f"http://127.0.0.1:{port}", "gp_token")
    client = PoolClient(ClientConfig(servers=[server], token=server.token))
    troubles = []
    beats = Heartbeater(client, server, "lease-x", 0.02, on_end=lambda *_: None, on_trouble=troubles.append,
                        give_up_after_s=0.3)  # fmt: skip
    started = time.monotonic()
    assert beats.run() == "gave up"
    assert 0.3 <= time.monotonic() - started < 5
    assert len(troubles) == 1 and troubles[0].unreachable
