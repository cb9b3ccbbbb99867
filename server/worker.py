"""A lease's worker: one process per remote lease that runs the lease's CUDA calls on its GPUs.

The pool server calls `start_worker` when it grants a lease with remote=true and `WorkerHandle.stop()`
when the lease ends; the client's `libcuda.so.1` (virtualize/shim) connects to `host:port` and
proves itself with `secret`. The process owns the lease's GPUs through `server._cuda` (cuda-python),
listens on TCP, serves each connection on its own thread through `server._executor_guard`, touches
`<state dir>/activity` at most once a second while calls arrive or run (the idle reclaimer reads its
mtime),
and exits when its parent dies.

    python -m server.worker --lease ID --devices '[{"index":0,"uuid":"GPU-..","mem_limit_bytes":1073741824}]'
"""

from __future__ import annotations

import argparse
import contextlib
import hmac
import json
import logging
import os
import secrets
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from virtualize import _wire
from virtualize._calls import CALL_IDS, INTERNAL

log = logging.getLogger("gpupool.worker")

EXECUTOR_ENV = "GPUPOOL_WORKER_EXECUTOR"  # "cuda" (default) or "host" (tests only: no GPU)
SECRET_ENV = "GPUPOOL_WORKER_SECRET"
START_TIMEOUT_S = 60.0
HELLO_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class WorkerDevice:
    index: int  # the GPU's index on this host
    uuid: str  # "GPU-…"; the worker sees the lease's GPUs as devices 0..n-1 in this order
    mem_limit_bytes: int  # the partition


class WorkerError(RuntimeError):
    """The worker process could not be started."""


class WorkerHandle:
    """The server's view of a running worker."""

    def __init__(self, proc: subprocess.Popen, host: str, port: int, secret: str, state_dir: Path) -> None:
        self.proc = proc
        self.host = host
        self.port = port
        self.secret = secret
        self.pid = proc.pid
        self.state_dir = state_dir
        self._started = time.time()

    def last_activity(self) -> float:
        """time.time() of the last forwarded call (the start time before any)."""
        try:
            return (self.state_dir / "activity").stat().st_mtime
        except OSError:
            return self._started

    def alive(self) -> bool:
        return self.proc.poll() is None

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
) -> WorkerHandle:
    """Start the worker process of one lease and return once it listens.

    `env` is added to the worker's environment (the MPS limits of the partition). `executor` picks
    the executor ("cuda", or "host" in tests); by default GPUPOOL_WORKER_EXECUTOR, else "cuda".
    """
    secret = secrets.token_urlsafe(32)
    state_dir = Path(tempfile.mkdtemp(prefix=f"gpupool-worker-{_safe(lease_id)}-"))
    child_env = {**os.environ, **env, SECRET_ENV: secret}
    child_env[EXECUTOR_ENV] = executor or env.get(EXECUTOR_ENV) or os.environ.get(EXECUTOR_ENV, "cuda")
    # The worker sees exactly the lease's GPUs, as devices 0..n-1 in the lease's order (the MPS limits
    # in `env` are keyed that way) and shows them to the client in that order.
    if devices:
        child_env["CUDA_VISIBLE_DEVICES"] = ",".join(d.uuid or str(d.index) for d in devices)
    cmd = [
        sys.executable,
        "-m",
        "server.worker",
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
    return WorkerHandle(proc, host, int(ready["port"]), secret, state_dir)


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


# ---- inside the worker process -------------------------------------------------------------------


class ConnectionClosed(ConnectionError):
    pass


class Channel:
    """A client connection: buffered reads of frames, bulk bytes read in chunks, gathered sends."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray(1 << 20)
        self.view = memoryview(self.buf)
        self.start = self.end = 0
        self.bulk_left = 0
        self._scratch: bytearray | None = None

    def read_exact(self, n: int) -> bytes:
        while self.end - self.start < n:
            if self.start and (self.end == self.start or len(self.buf) - self.start < n):
                self.buf[: self.end - self.start] = self.buf[self.start : self.end]
                self.end -= self.start
                self.start = 0
            if n > len(self.buf):  # a large module image: grow (the view must go before the resize)
                self.view.release()
                self.buf.extend(bytes(n - len(self.buf)))
                self.view = memoryview(self.buf)
            got = self.sock.recv_into(self.view[self.end :])
            if not got:
                raise ConnectionClosed
            self.end += got
        data = bytes(self.view[self.start : self.start + n])
        self.start += n
        return data

    def read_into(self, out: memoryview) -> None:
        have = min(self.end - self.start, len(out))
        out[:have] = self.view[self.start : self.start + have]
        self.start += have
        pos = have
        while pos < len(out):
            got = self.sock.recv_into(out[pos:])
            if not got:
                raise ConnectionClosed
            pos += got

    def read_bulk(self, limit: int) -> bytes:
        from server._executor import INVALID_VALUE, CudaError

        if self.bulk_left > limit:
            raise CudaError(INVALID_VALUE, f"{self.bulk_left} bytes of data is more than {limit}")
        data = self.read_exact(self.bulk_left)
        self.bulk_left = 0
        return data

    def bulk_chunks(self):
        """The request's bulk bytes, one chunk (a view of a reused buffer) at a time."""
        buf = self.scratch(min(self.bulk_left, _wire.CHUNK_BYTES))
        while self.bulk_left:
            n = min(self.bulk_left, len(buf))
            self.read_into(buf[:n])
            self.bulk_left -= n
            yield buf[:n]

    def scratch(self, n: int) -> memoryview:
        if self._scratch is None or len(self._scratch) < n:
            self._scratch = bytearray(max(n, 1))
        return memoryview(self._scratch)[: max(n, 1)]

    def skip(self, n: int) -> None:
        while n:
            take = min(n, _wire.CHUNK_BYTES)
            self.read_into(self.scratch(take)[:take])
            n -= take
        self.bulk_left = 0

    def send(self, *parts) -> None:
        views = [memoryview(p).cast("B") for p in parts if len(p)]
        while views:
            sent = self.sock.sendmsg(views)
            while views and sent >= len(views[0]):
                sent -= len(views[0])
                views.pop(0)
            if views and sent:
                views[0] = views[0][sent:]


class Worker:
    def __init__(
        self, lease_id: str, devices: list[WorkerDevice], executor, state_dir: Path, secret: str
    ) -> None:
        from server._executor_guard import LeaseState

        self.lease_id = lease_id
        self.devices = devices
        self.executor = executor
        self.lease = LeaseState([d.mem_limit_bytes for d in devices])
        self.activity = state_dir / "activity"
        self.secret = secret.encode()
        self._last_touch = 0.0
        self.in_calls: set[int] = set()  # connections executing a call now (a long sync is use, not idleness)

    def serve(self, listener: socket.socket) -> None:
        threading.Thread(target=self._touch_while_busy, daemon=True).start()
        while True:
            sock, peer = listener.accept()
            threading.Thread(target=self._connection, args=(sock, peer), daemon=True).start()

    def _connection(self, sock: socket.socket, peer) -> None:
        from server._executor_guard import Session

        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        channel = Channel(sock)
        who = f"{peer[0]}:{peer[1]}"
        session = None
        try:
            if not self._hello(channel, who):
                return
            session = Session(self.lease, self.executor, channel)
            log.info("client %s connected", who)
            header = _wire.REQUEST
            while True:
                call_id, flags, args_len, _, bulk_len = header.unpack(channel.read_exact(header.size))
                if args_len > _wire.MAX_ARGS_BYTES:
                    log.warning("client %s sent a corrupt frame; closing", who)
                    return
                self.in_calls.add(id(session))
                try:
                    session.dispatch(call_id, flags, channel.read_exact(args_len), bulk_len)
                finally:
                    self.in_calls.discard(id(session))
                self._touch()
        except (ConnectionClosed, ConnectionError):
            log.info("client %s disconnected", who)
        except Exception:
            log.exception("client %s: worker error; closing its connection", who)
        finally:
            sock.close()
            if session is not None:
                session.close()

    def _hello(self, channel: Channel, who: str) -> bool:
        hello = INTERNAL["gpHello"]
        channel.sock.settimeout(HELLO_TIMEOUT_S)
        call_id, _flags, args_len, _, bulk_len = _wire.REQUEST.unpack(channel.read_exact(_wire.REQUEST.size))
        if call_id != CALL_IDS[hello] or args_len != struct.calcsize(hello.in_format) or bulk_len > 4096:
            log.warning("client %s did not start with a hello; closing", who)
            return False
        (version,) = struct.unpack(hello.in_format, channel.read_exact(args_len))
        secret = channel.read_exact(bulk_len)
        channel.sock.settimeout(None)
        if not hmac.compare_digest(secret, self.secret):
            log.warning("client %s gave a wrong lease secret; refused", who)
            channel.send(_wire.REPLY.pack(800, 0, 0))
            return False
        if version != _wire.PROTOCOL_VERSION:
            log.warning(
                "client %s speaks protocol %d, this worker %d; refused", who, version, _wire.PROTOCOL_VERSION
            )
            channel.send(_wire.REPLY.pack(801, 0, 0))
            return False
        outs = struct.pack(hello.out_format, len(self.devices))
        channel.send(_wire.REPLY.pack(0, len(outs), 0), outs)
        return True

    def _touch_while_busy(self) -> None:
        """A call that runs for minutes (a synchronise behind long kernels) keeps the lease in use."""
        while True:
            time.sleep(1.0)
            if self.in_calls:
                self._touch()

    def _touch(self) -> None:
        now = time.monotonic()
        if now - self._last_touch >= 1.0:
            self._last_touch = now
            with contextlib.suppress(OSError):
                self.activity.touch()


def make_executor(kind: str, devices: list[WorkerDevice]):
    if kind == "host":
        from server._executor_host import HostExecutor

        return HostExecutor(devices)
    if kind == "cuda":
        from server._cuda import CudaExecutor

        return CudaExecutor(devices)
    raise ValueError(f"unknown executor {kind!r} (cuda or host)")


def _watch_parent(parent: int) -> None:
    while True:
        if os.getppid() != parent:
            log.warning("the pool server (pid %d) is gone; worker exits", parent)
            os._exit(3)
        time.sleep(1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m server.worker", description=__doc__.split("\n\n")[0])
    parser.add_argument("--lease", required=True, help="the lease id (for logs)")
    parser.add_argument("--bind", default="127.0.0.1", help="address to listen on (port: any free one)")
    parser.add_argument("--devices", required=True, help="JSON list of {index, uuid, mem_limit_bytes}")
    parser.add_argument("--state-dir", required=True, help="directory of the activity file")
    parser.add_argument("--parent", type=int, default=0, help="exit when this process is gone")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("GPUPOOL_WORKER_LOG", "INFO"),
        format=f"%(asctime)s gpupool-worker[{args.lease}] %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    devices = [WorkerDevice(**d) for d in json.loads(args.devices)]
    secret = os.environ.pop(SECRET_ENV, "")
    kind = os.environ.get(EXECUTOR_ENV, "cuda")

    def ready(**answer) -> None:
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()

    if not secret:
        ready(error=f"{SECRET_ENV} is not set")
        return 2
    try:
        executor = make_executor(kind, devices)
    except Exception as exc:
        ready(error=f"{kind} executor: {exc}")
        return 2
    listener = socket.create_server((args.bind, 0), backlog=64)
    host, port = listener.getsockname()[:2]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if args.parent:
        threading.Thread(target=_watch_parent, args=(args.parent,), daemon=True).start()
    log.info("listening on %s:%d, %d device(s), %s executor", host, port, len(devices), executor.name)
    ready(host=host, port=port, pid=os.getpid())
    try:
        Worker(args.lease, devices, executor, Path(args.state_dir), secret).serve(listener)
    finally:
        executor.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
