"""Real gpupool-server processes on loopback (simulated GPUs) and real gpuattach runs, for the pool tests.

Every wait is bounded: a server that does not print its address within 20 s fails the test; every
HTTP call has a timeout; every gpuattach run has one.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import selectors
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def server_cmd() -> list[str]:
    exe = BIN / "gpupool-server"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "server.cli"]


def gpuattach_cmd() -> list[str]:
    exe = BIN / "gpuattach"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "virtualize.client.cli"]


class ServerProc:
    """One gpupool-server on 127.0.0.1 with its own state directory; kill -9 and restart keep it."""

    def __init__(
        self,
        state_dir: Path,
        gpus: str | None = "4xH100-80GB",
        config: str | None = None,
        extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ):
        self.env = env  # added to the server's environment
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.gpus = gpus
        self.extra = list(extra)
        self.config_path = None
        if config is not None:
            self.config_path = self.state_dir / "server.toml"
            self.config_path.write_text(config)
        self.proc: subprocess.Popen | None = None
        self.url: str | None = None
        self.port = 0
        self.log = self.state_dir / "server.log"

    def start(self, timeout: float = 20.0) -> ServerProc:
        args = [
            *server_cmd(),
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--state-dir",
            str(self.state_dir),
            *self.extra,
        ]
        if self.gpus:  # None: the host's real GPUs (tests/gpu)
            args += ["--simulate-gpus", self.gpus]
        if self.config_path:
            args += ["--config", str(self.config_path)]
        logf = open(self.log, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=logf, cwd=ROOT, env={**os.environ, **(self.env or {})}
        )
        logf.close()
        deadline = time.monotonic() + timeout
        line = b""
        waiting = selectors.DefaultSelector()  # poll, not select(): a test process may hold 1024+ descriptors
        waiting.register(self.proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if waiting.select(0.2):
                line = self.proc.stdout.readline()
                if b"listening on" in line:
                    break
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"gpupool-server exited {self.proc.returncode}: {self.log.read_text()[-2000:]}"
                )
        else:
            self.proc.kill()
            raise RuntimeError(f"gpupool-server did not start in {timeout}s: {self.log.read_text()[-2000:]}")
        waiting.close()
        self.banner = line.decode().strip()  # what the server says it serves, and how
        self.url = line.split(b"listening on ")[1].split()[0].decode()
        self.port = int(self.url.rsplit(":", 1)[1])  # a restart comes back on the same port
        return self

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)

    def token(
        self, client: str, *, admin: bool = False, expires_in_s: float | None = None, token: str | None = None
    ) -> str:
        """A new token (or ``token`` made on another server, as `gpupool-server token import` stores it)."""
        from server._store import Store

        store = Store(self.state_dir / "pool.sqlite")
        try:
            return store.create_token(client, admin=admin, expires_in_s=expires_in_s, token=token)["token"]
        finally:
            store.close()


def api(
    url: str,
    method: str,
    path: str,
    token: str | None = None,
    body=None,
    raw: bytes | None = None,
    timeout: float = 10.0,
):
    """(status, decoded JSON) of one HTTP call."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    payload = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    try:
        conn.request(method, path, body=payload, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    return resp.status, (json.loads(data) if data else None)


def client_env(tmp_path: Path, servers: list[str], token: str) -> dict[str, str]:
    """Environment for gpuattach with a client.toml listing ``servers`` (no --server needed)."""
    cfg = tmp_path / f"client-{abs(hash((tuple(servers), token))) % 10**8}.toml"
    cfg.write_text(f'token = {json.dumps(token)}\nservers = {json.dumps(servers)}\ntimeout = "20s"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env.update(GPUPOOL_CONFIG=str(cfg), XDG_CACHE_HOME=str(tmp_path / "cache"), PYTHONUNBUFFERED="1")
    return env


def env_for(tmp_path: Path, servers: list[ServerProc], client: str) -> tuple[dict[str, str], str]:
    """gpuattach's environment for a pool of these servers and one client token that all of them take
    (each server has its own token store, so each stores the same token)."""
    token = servers[0].token(client)
    for s in servers[1:]:
        s.token(client, token=token)
    return client_env(tmp_path, [s.url for s in servers], token), token


def gpuattach(*args: str, env: dict[str, str], timeout: float = 30.0) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*gpuattach_cmd(), *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


@contextlib.contextmanager
def killed_on_failure(run: subprocess.Popen):
    """The program under test is killed if the block fails (nothing waits for it then); else it goes on."""
    try:
        yield
    except BaseException:
        run.kill()
        raise


def start_remote_program(server, tmp_path: Path, client: str, admin: str, scenario: str, *, token: str | None = None,
                         env: dict[str, str] | None = None) -> tuple[subprocess.Popen, dict]:  # fmt: skip
    """tests/remote_client.py's `scenario` under `gpuattach run -n 1 -m 256` on `server` as `client` (its token,
    or `token`; `env` added), once it says it is ready (holding its objects); its lease, as `admin` sees it."""
    run_env = {**client_env(tmp_path, [server.url], token or server.token(client)), **(env or {})}
    run = subprocess.Popen([*gpuattach_cmd(), "run", "-n", "1", "-m", "256", "--", sys.executable,
                            "tests/remote_client.py", scenario], env=run_env, stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)  # fmt: skip
    for line in run.stdout:
        assert not line.startswith("FAILED"), line
        if line.startswith("ready"):
            break
    else:
        raise AssertionError(f"the program ended before it was ready: {run.stderr.read()}")
    _, leases = api(server.url, "GET", "/v1/leases?all=true", admin)
    (lease,) = [lease for lease in leases["leases"] if lease["client"] == client]
    return run, lease


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
