"""Where the pool starts and stops a lease's worker: the process that runs the lease's CUDA calls.

The pool never imports remote execution: it starts ``python -m virtualize.server.worker`` (``WORKER_MODULE``)
by name and talks to it through the interface declared here, which the worker process implements:

- command line: ``--lease ID --bind HOST --devices JSON --state-dir DIR --parent PID``, the devices
  a JSON list of ``WorkerDevice`` (index: the physical NVML index; the worker shows the lease's GPUs as
  devices 0..n-1 in this order, found by UUID; it sees the host's others too, for a live migration,
  except under MPS or without UUIDs, where ``CUDA_VISIBLE_DEVICES`` is exactly the lease's GPUs)
- environment: ``GPUPOOL_WORKER_SECRET`` (the lease's secret, removed by the worker on start),
  ``GPUPOOL_WORKER_EXECUTOR`` (``cuda``, or ``host`` in tests), the MPS client settings of the lease
- the ready line: one JSON object on stdout, ``{"host", "port", "pid"}`` or ``{"error"}``
- activity: the mtime of ``<state dir>/activity`` is the time of its last call (``last_activity``)
- usage: ``<state dir>/usage`` is a JSON list of the bytes the lease holds on each of its GPUs (in
  partition order), rewritten within a second of a change (the lease's NVML view shows it)
- migration (``WorkerHandle.migrate``): the server writes ``<state dir>/migrate`` (JSON
  ``{"device": lease device, "to": GPU index on this host}``) and sends SIGUSR1; the worker moves the
  device (``virtualize.server._migrate``) and writes ``<state dir>/migrated``: ``{"ok": true, "from", "to",
  "bytes", "pause_s", ...}`` or ``{"ok": false, "error"}`` (the lease still runs where it was)
- moving the lease to another server (``WorkerHandle.migrate_to_server``): the same request file with
  ``{"server": {"host", "migrate_port", "tls_sha256", "secret"}}`` instead of ``"to"``: the receiving
  worker on that server, which the worker sends the lease's state to (``virtualize.server._migrate_out``);
  ``{"server": null}`` asks only whether the lease could leave (``WorkerHandle.may_leave``)
- receiving a lease (``start_worker(receive_s=...)``): ``--receive SECONDS`` and ``MIGRATION_SECRET_ENV``
  (the one-time secret the sending worker proves); it listens on a second port for the lease's state
  (the ready line's ``migrate_port``) and exits when nothing arrived within SECONDS (its GPUs are free then)
- it exits on SIGTERM (``WorkerHandle.stop``) or when its parent is gone

``env`` carries the MPS client settings of the lease when the server runs MPS (pipe directory,
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` keyed 0..n-1, since the worker makes the lease's GPUs its
``CUDA_VISIBLE_DEVICES`` in partition order; ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``). A worker that
fails to start makes the lease answer 503 with the reason; the server keeps serving local leases.

Simulated GPUs refuse remote leases, except when ``GPUPOOL_WORKER_EXECUTOR=host`` is set for the
server: the worker then serves CUDA calls from host memory (the remote-execution component's test
executor), so the whole ``gpuattach run`` path can be tested without a GPU. Such leases still say
``"simulated": true``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from server._errors import RemoteNotOffered, RemoteUnavailable
from server._inventory import MIB
from server.errors import ServerError

log = logging.getLogger("gpupool.server")

WORKER_MODULE = "virtualize.server.worker"
ACTIVITY_FILE = "activity"
USAGE_FILE = "usage"
EXECUTOR_ENV = "GPUPOOL_WORKER_EXECUTOR"  # "cuda" (default) or "host" (tests only: no GPU)
SECRET_ENV = "GPUPOOL_WORKER_SECRET"
MIGRATION_SECRET_ENV = "GPUPOOL_WORKER_MIGRATION_SECRET"  # a receiving worker's one-time secret
MIGRATE_REQUEST_FILE, MIGRATE_RESULT_FILE = "migrate", "migrated"
START_TIMEOUT_S = 60.0
MIGRATE_TIMEOUT_S = 600.0  # copying a full 80 GB GPU at a few GB/s, with room


@dataclass(frozen=True)
class WorkerDevice:
    index: int  # the GPU's index on this host
    uuid: str  # "GPU-…"; the worker sees the lease's GPUs as devices 0..n-1 in this order
    mem_limit_bytes: int  # the partition


class WorkerError(ServerError):
    """The worker process could not be started."""


def ask_migration(state_dir: Path, pid: int, device: int, to: int, timeout: float = MIGRATE_TIMEOUT_S,
                  uuid: str = "", alive: Callable[[], bool] = lambda: True) -> dict:  # fmt: skip
    """Ask the worker `pid` (its state directory) to move its lease's `device` to GPU `to`, and wait for its
    answer (WorkerHandle.migrate; a program timing itself across a move asks the same way)."""
    return ask_worker(state_dir, pid, {"device": device, "to": to, "uuid": uuid}, timeout, alive)


def ask_worker(state_dir: Path, pid: int, asked: dict, timeout: float, alive: Callable[[], bool]) -> dict:
    """Write a migration request, signal the worker and wait for its answer (``{"ok": false, "error"}`` when
    it refused, failed, exited or did not answer within `timeout`)."""
    result = state_dir / MIGRATE_RESULT_FILE
    result.unlink(missing_ok=True)
    request = state_dir / MIGRATE_REQUEST_FILE
    request.with_suffix(".partial").write_text(json.dumps(asked))
    request.with_suffix(".partial").replace(request)
    try:
        os.kill(pid, signal.SIGUSR1)
    except ProcessLookupError:
        return {"ok": False, "error": "the worker is gone"}
    deadline = time.monotonic() + timeout
    while not result.exists():
        if not alive() and not result.exists():  # (a worker may answer and then exit: its lease moved away)
            return {"ok": False, "error": "the worker exited during the migration"}
        if time.monotonic() > deadline:
            return {"ok": False, "error": f"the worker did not answer within {timeout:.0f} s"}
        time.sleep(0.02)
    answer = json.loads(result.read_text())
    result.unlink(missing_ok=True)
    return answer


class WorkerHandle:
    """The server's view of a running worker."""

    def __init__(
        self,
        proc: subprocess.Popen,
        host: str,
        port: int,
        secret: str,
        state_dir: Path,
        tls_sha256: str = "",
        local: str = "",
        lacks: list[str] | None = None,
        migrate_port: int = 0,
        migration_secret: str = "",
    ) -> None:
        self.proc = proc
        self.host = host
        self.port = port
        self.secret = secret
        self.tls_sha256 = (
            tls_sha256  # the worker's certificate, pinned by the client ("": none, loopback only)
        )
        self.local = local  # its Unix socket (abstract namespace) for clients on this host ("": none)
        self.lacks = list(lacks or [])  # entry points its driver does not have (the shim answers not found)
        self.pid = proc.pid
        self.state_dir = state_dir
        self.migrate_port = migrate_port  # a receiving worker's: where the lease's state arrives (0: none)
        self.migration_secret = migration_secret  # and the one-time secret its sender proves
        self._started = time.time()

    def answer(self, host: str | None = None, port: int | None = None) -> dict:
        """What the lease's owner needs to reach this worker (the lease answer's "worker"); `host` and
        `port`: another way to it (a relay, another address of its host)."""
        return {
            "host": host or self.host,
            "port": port or self.port,
            "secret": self.secret,
            "tls_sha256": self.tls_sha256,
            "local": self.local,
            "lacks": self.lacks,
        }

    def last_activity(self) -> float:
        """time.time() of the last forwarded call (the start time before any)."""
        try:
            return (self.state_dir / ACTIVITY_FILE).stat().st_mtime
        except OSError:
            return self._started

    def alive(self) -> bool:
        return self.proc.poll() is None

    def on_exit(self, callback) -> None:
        """Reap the worker the moment it exits (no zombie waits for the next sweep) and call `callback`."""

        def wait() -> None:
            self.proc.wait()
            callback(self)

        threading.Thread(target=wait, name=f"gpupool-worker-{self.pid}", daemon=True).start()

    def migrate(self, device: int, to: int, timeout: float = MIGRATE_TIMEOUT_S, uuid: str = "") -> dict:
        """Move the lease's `device` (its partition order) to GPU `to` of this host (`uuid`: its UUID, how
        the worker finds it; else by index); the worker's answer (``{"ok": false, "error"}`` when it
        refused or failed: the lease still runs where it was)."""
        return ask_migration(self.state_dir, self.pid, device, to, timeout, uuid, self.alive)

    def may_leave(self, timeout: float = 30.0) -> dict:
        """Whether the lease could move to another server now (nothing pauses): ``{"ok": true}`` or the
        worker's refusal."""
        return ask_worker(self.state_dir, self.pid, {"server": None}, timeout, self.alive)

    def migrate_to_server(self, target: dict, timeout: float = MIGRATE_TIMEOUT_S) -> dict:
        """Send the lease's state to the receiving worker `target` of another server (``{"host",
        "migrate_port", "tls_sha256", "secret"}``); the worker's answer, as `migrate`'s."""
        return ask_worker(self.state_dir, self.pid, {"server": target}, timeout, self.alive)

    def stop(self, timeout: float = 5.0) -> None:
        """Terminate the worker (its GPU memory goes with it) and wait; kill if it does not go."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def __repr__(self) -> str:
        return f"WorkerHandle(pid={self.pid}, {self.host}:{self.port}, alive={self.alive()})"


def start_worker(
    lease_id: str,
    devices: list[WorkerDevice],
    *,
    bind_host: str,
    env: dict[str, str],
    executor: str | None = None,
    prefix: Sequence[str] = (),
    secret: str | None = None,
    receive_s: float | None = None,
) -> WorkerHandle:
    """Start the worker process of one lease and return once it listens.

    `env` is added to the worker's environment (the MPS limits of the partition). `executor` picks
    the executor ("cuda", or "host" in tests); by default GPUPOOL_WORKER_EXECUTOR, else "cuda".
    `prefix` runs the worker under another command that then execs it (the benchmark's
    `ip netns exec NS`, to put it on the far side of a network link).
    `secret`: the lease's secret (a new one by default); `receive_s`: a receiving worker, which waits that
    long for the lease's state from its current worker (another server's), with a one-time secret of its own.
    """
    secret = secret or secrets.token_urlsafe(32)
    migration_secret = secrets.token_urlsafe(32) if receive_s else ""
    state_dir = Path(tempfile.mkdtemp(prefix=f"gpupool-worker-{_safe(lease_id)}-"))
    child_env = {**os.environ, **env, SECRET_ENV: secret}
    if receive_s:
        child_env[MIGRATION_SECRET_ENV] = migration_secret
    child_env[EXECUTOR_ENV] = executor or env.get(EXECUTOR_ENV) or os.environ.get(EXECUTOR_ENV, "cuda")
    # The worker shows the client the lease's GPUs as devices 0..n-1 in the lease's order. It finds them
    # by UUID, and sees the host's other GPUs too, so that a live migration can move the lease to one
    # (numbered as nvidia-smi numbers them). Under MPS (limits in `env`, keyed by visible ordinal), or
    # without UUIDs, it sees exactly the lease's GPUs, in that order.
    if devices and (any(k.startswith("CUDA_MPS_") for k in env) or not all(d.uuid for d in devices)):
        child_env["CUDA_VISIBLE_DEVICES"] = ",".join(d.uuid or str(d.index) for d in devices)
    elif devices:
        child_env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    cmd = [
        *prefix,
        sys.executable,
        "-m",
        WORKER_MODULE,
        "--lease",
        lease_id,
        "--bind",
        bind_host,
        "--devices",
        json.dumps([asdict(d) for d in devices]),
        "--state-dir",
        str(state_dir),
        "--parent",
        str(os.getpid()),
        *(["--receive", f"{receive_s:g}"] if receive_s else []),
    ]
    proc = subprocess.Popen(cmd, env=child_env, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    ready = _read_ready_line(proc, START_TIMEOUT_S)
    if "port" not in ready:
        with contextlib.suppress(OSError):
            proc.kill()
        proc.wait(5)
        shutil.rmtree(state_dir, ignore_errors=True)
        raise WorkerError(f"the worker of lease {lease_id} did not start: {ready.get('error', 'no answer')}")
    # A wildcard bind is reachable at this host's name; the pool server may advertise another.
    host = socket.getfqdn() if bind_host in ("", "0.0.0.0", "::") else bind_host
    return WorkerHandle(proc, host, int(ready["port"]), secret, state_dir, str(ready.get("tls_sha256", "")),
                        str(ready.get("local", "")), [str(n) for n in ready.get("lacks", [])],
                        int(ready.get("migrate_port", 0)), migration_secret)  # fmt: skip


def _read_ready_line(proc: subprocess.Popen, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    line = b""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                return {"error": f"no answer within {timeout:.0f} s"}
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                return {"error": f"the process exited (status {proc.wait()})"}
            line += chunk
    proc.stdout.close()
    try:
        return json.loads(line)
    except ValueError:
        return {"error": f"unreadable answer {line[:200]!r}"}


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in text)[:40]


def worker_env(lease: dict, mps) -> dict[str, str]:
    if mps is None:
        return {}
    env = dict(mps.client_env())
    env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(
        f"{i}={p['mem_bytes'] // MIB}M" for i, p in enumerate(lease["partitions"])
    )
    shares = {p["sm_share"] for p in lease["partitions"]} - {None}
    if shares:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, round(shares.pop() * 100)))
    return env


def remote_refusal(simulated: bool) -> RemoteUnavailable | None:
    """Why this server cannot run remote leases at all, or None."""
    if simulated and os.environ.get(EXECUTOR_ENV) != "host":
        return RemoteNotOffered(
            "remote execution unavailable: this server's GPUs are simulated (control plane only)",
            "use a server with real GPUs, or gpuattach run --local for control-plane tests",
        )
    return None


def start_remote_worker(
    lease: dict, *, simulated: bool, bind_host: str, mps=None, host_gpus: int | None = None,
    secret: str | None = None, receive_s: float | None = None,
):  # fmt: skip
    """Start the lease's worker; raises RemoteUnavailable with a one-line reason. `host_gpus`: how many GPUs
    this server has; a simulated server's host executor gets as many (a migration may go to any of them).
    `secret` and `receive_s`: a worker that receives the running lease from another server (`start_worker`)."""
    refusal = remote_refusal(simulated)
    if refusal is not None:
        raise refusal
    devices = [WorkerDevice(p["gpu_index"], p["gpu_uuid"], p["mem_bytes"]) for p in lease["partitions"]]
    env = worker_env(lease, mps)
    if simulated and host_gpus and "GPUPOOL_HOST_EXECUTOR_GPUS" not in os.environ:
        env["GPUPOOL_HOST_EXECUTOR_GPUS"] = str(host_gpus)
    try:
        return start_worker(
            lease["id"], devices, bind_host=bind_host, env=env, secret=secret, receive_s=receive_s
        )
    except Exception as exc:  # the worker's own failure, whatever it is, is the lease's 503
        log.exception("worker for %s failed to start", lease["id"])
        raise RemoteUnavailable(
            f"remote execution unavailable: the worker did not start ({exc})", "see the server log"
        ) from None
