"""A lease's worker process: runs the lease's CUDA calls on its GPUs (``python -m virtualize.server.worker``).

The pool server starts it through ``server.workers`` (which never imports this module) and stops it
when the lease ends; the client's ``libcuda.so.1`` (virtualize/client/shim) connects to ``host:port`` and
proves itself with the lease's secret. The process owns the lease's GPUs through ``virtualize.server._cuda``
(cuda-python), listens on TCP, serves each connection on its own thread through
``virtualize.server._executor_guard``, touches ``<state dir>/activity`` at most once a second while calls
arrive or run (the idle reclaimer reads its mtime), and exits when its parent dies. Its command line,
environment and ready line are the interface ``server.workers`` declares.

    python -m virtualize.server.worker --lease ID --devices '[{"index":0,"uuid":"GPU-..","mem_limit_bytes":1073741824}]'
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import hmac
import json
import logging
import os
import re
import secrets
import select
import signal
import socket
import ssl
import struct
import sys
import threading
import time
from pathlib import Path

from server.workers import (
    ACTIVITY_FILE,
    EXECUTOR_ENV,
    MIGRATION_SECRET_ENV,
    SECRET_ENV,
    USAGE_FILE,
    WORKER_MODULE,
    WorkerDevice,
)
from virtualize.common import _wire
from virtualize.common._calls import CALL_IDS, INTERNAL, WIRE_VERSION
from virtualize.common._results import CUresult
from virtualize.server import (
    _data_tls,
    _migrate,
    _migrate_out,
    _native_dispatch,
    _native_tls,
    _process_workers,
)
from virtualize.server._executor import CudaError
from virtualize.server._handles import Translated

log = logging.getLogger("gpupool.worker")

HELLO_TIMEOUT_S = 10.0
SMALL_REPLY_BYTES = 64 << 10
CLOSING_WAIT_S = 3.0  # how long a stopped worker lets closing connections finish (Worker.wait_closing)
CLOSING_NOTICE_S = 0.25  # and how long it gives a connection whose client has just gone to notice
PROFILE_ENV = "GPUPOOL_WORKER_PROFILE"  # a directory: each connection's cProfile, sorted by own time


class ConnectionClosed(ConnectionError):
    pass


class Channel:
    """A client connection: buffered reads of frames, bulk bytes read in chunks, gathered sends."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.local = getattr(sock, "family", None) == socket.AF_UNIX  # a process on this host
        self.encrypted = not isinstance(sock, socket.socket)  # a TLS stream, in C or in Python
        self.buf = bytearray((1 << 20) + 4096)  # a 1 MiB copy's whole frame: the native loop serves it here
        self.view = memoryview(self.buf)
        self.start = self.end = 0
        self.bulk_left = 0
        self._scratch: bytearray | None = None
        # The command ring, once the client asked for it (gpRingAttach): every byte after its answer,
        # both ways, goes through it; the socket then carries only descriptors and the client's end.
        self.ring: _native_dispatch.Ring | None = None

    def new_ring(self) -> _native_dispatch.Ring | None:
        """A command ring beside this connection (gpRingAttach); None where the native library is not built."""
        return _native_dispatch.Ring.create(self.sock.fileno())

    def _recv_into(self, view: memoryview) -> int:
        return self.ring.recv_into(view) if self.ring is not None else self.sock.recv_into(view)

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
            got = self._recv_into(self.view[self.end :])
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
        if have == len(out):
            return
        # The rest is bulk the client is sending now: filled in one call (MSG_WAITALL; the TLS stream
        # decrypts record after record in one loop), not one round of Python per segment received.
        if self.encrypted:
            if not self.sock.recv_into_all(out[have:]):
                raise ConnectionClosed
            return
        pos = have
        while pos < len(out):
            got = (
                self._recv_into(out[pos:])
                if self.ring
                else self.sock.recv_into(out[pos:], 0, socket.MSG_WAITALL)
            )
            if not got:
                raise ConnectionClosed
            pos += got

    def read_bulk(self, limit: int) -> bytes:
        from virtualize.server._executor import INVALID_VALUE, CudaError

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

    def send_with_fd(self, fd: int, *parts) -> None:
        """A small reply and a file descriptor for the client (a local socket only). Over the ring the
        descriptor goes ahead on the socket with one byte, the reply through the ring."""
        if self.ring is None:
            socket.send_fds(self.sock, [b"".join(parts)], [fd])
            return
        socket.send_fds(self.sock, [b"\0"], [fd])
        self.send(*parts)

    def send(self, *parts) -> None:
        views = [memoryview(p).cast("B") for p in parts if len(p)]
        if self.ring is not None:  # small replies published at once: one wake-up of the client
            if len(views) > 1 and sum(map(len, views)) <= SMALL_REPLY_BYTES:
                views = [memoryview(b"".join(views))]
            for view in views:
                self.ring.send(view)
            return
        if self.encrypted:  # no sendmsg over TLS: small replies go as one record
            if sum(map(len, views)) <= SMALL_REPLY_BYTES:
                self.sock.sendall(b"".join(views))
            elif hasattr(self.sock, "sendall_many"):  # TLS in C: the pieces' records, flushed once
                self.sock.sendall_many(views)
            else:
                for view in views:
                    self.sock.sendall(view)
            return
        while views:
            sent = self.sock.sendmsg(views)
            while views and sent >= len(views[0]):
                sent -= len(views[0])
                views.pop(0)
            if views and sent:
                views[0] = views[0][sent:]


class KernelOutput:
    """The worker's stdout, where the driver writes what kernels print (device printf), kept for the
    client that synchronises next. Started after the ready line: from then on fd 1 is a pipe read here,
    continuously (a full pipe would block the driver inside a synchronise)."""

    LIMIT = 16 << 20  # kept while no client synchronises; older text is dropped

    def __init__(self) -> None:
        sys.stdout.flush()
        read, write = os.pipe()
        os.dup2(write, 1)
        os.close(write)
        os.set_blocking(read, False)
        self.fd = read
        self.lock = threading.Lock()
        self.buffer = bytearray()
        # The native loop answers a synchronise itself only when nothing was printed: it looks at the
        # pipe, and at this mark, set before this thread reads and cleared when the text is taken.
        self.mark = _native_dispatch.watch_kernel_output(read) or (lambda seen: None)
        threading.Thread(target=self._pump, name="gpupool-kernel-output", daemon=True).start()

    def _pump(self) -> None:
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        while True:
            poller.poll()
            self.mark(1)
            with self.lock:
                if not self._read_available():
                    return  # the write end is gone: the process is ending

    def _read_available(self) -> bool:
        while True:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return True
            if not chunk:
                return False
            self.buffer += chunk
            if len(self.buffer) > self.LIMIT:
                del self.buffer[: len(self.buffer) - self.LIMIT]

    def take(self) -> bytes:
        """Everything kernels printed so far (the driver's writes are done when a synchronise returns)."""
        with self.lock:
            self._read_available()
            text, self.buffer = bytes(self.buffer), bytearray()
            self.mark(0)
        return text


def partition_limits(devices: list[WorkerDevice], executor) -> list[int]:
    """Each device's partition, at most what CUDA says the GPU has: a whole-GPU lease's limit is NVML's
    total, which counts memory the driver reserves, so allocations would otherwise pass the partition's
    check that the GPU cannot hold (and memory a pool keeps would not be in their way, as natively)."""
    limits = []
    for index, d in enumerate(devices):
        try:
            limits.append(min(d.mem_limit_bytes, executor.cuDeviceTotalMem(index)))
        except CudaError as exc:
            log.warning("device %d's total memory is unknown (%s): the partition stays %d bytes", index, exc,
                        d.mem_limit_bytes)  # fmt: skip
            limits.append(d.mem_limit_bytes)
    return limits


class Worker:
    def __init__(
        self,
        lease_id: str,
        devices: list[WorkerDevice],
        executor,
        state_dir: Path,
        secret: str,
        tls: ssl.SSLContext | None = None,
        kernel_output: KernelOutput | None = None,
    ) -> None:
        from virtualize.server._executor_guard import LeaseState

        self.lease_id = lease_id
        self.devices = devices
        self.lease = LeaseState(partition_limits(devices, executor))
        # The executor behind the handle values the client knows, which a live migration keeps.
        self.executor = Translated(executor, self.lease.holds, lambda kind: list(self.lease.handles[kind]))
        self.state_dir = state_dir
        self.activity = state_dir / ACTIVITY_FILE
        self.usage = state_dir / USAGE_FILE
        self._usage_written: list[int] | None = None
        self.secret = secret.encode()
        self.tls = tls
        # The same certificate served from C where it can be (the Python stream otherwise).
        self.native_tls = _native_tls.server_context(state_dir) if tls is not None else None
        self.kernel_output = kernel_output
        self._last_touch = 0.0
        self.in_calls: set[int] = set()  # connections executing a call now (a long sync is use, not idleness)
        # connections whose client has gone and that are still cleaning up (see wait_closing)
        self._closing, self._closed = 0, threading.Condition()
        self.native = _native_dispatch.for_worker(self.lease, self.executor)
        self.native_sessions: set = set()  # connections' native loops (their calls are activity too)
        self.sessions: set = set()  # every connection's Session (a move to another server looks at them)
        self.moved = None  # once the lease moved to another server's worker: _migrate_out.Moved
        # the lease's processes that asked for a worker of their own (_process_workers); set up by main()
        self.process_workers: _process_workers.ProcessWorkers | None = None

    def share_usage(self, state_dir: Path, slot: int) -> None:
        """Count this worker's memory in its slot of the lease's usage file (slot 0, the lease's worker,
        makes the file): every worker of the lease then checks allocations against the lease's total."""
        path = state_dir / _process_workers.USAGE_SLOTS_FILE
        self.lease.used = _process_workers.SharedUsage(path, len(self.devices), slot, create=slot == 0)

    def serve(self, listener: socket.socket, local: socket.socket | None = None) -> None:
        threading.Thread(target=self._touch_while_busy, daemon=True).start()
        if local is not None:
            threading.Thread(target=self._accept, args=(local,), daemon=True).start()
        self._accept(listener)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            sock, peer = listener.accept()
            threading.Thread(target=self._connection, args=(sock, peer), daemon=True).start()

    def _connection(self, sock: socket.socket, peer) -> None:
        from virtualize.server._executor_guard import Session

        peer_pid = 0
        if sock.family == socket.AF_UNIX:  # a process on this host: name it by its pid and user
            peer_pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            who = f"pid {peer_pid} (uid {uid}, this host)"
        else:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            who = f"{peer[0]}:{peer[1]}"
        session = native = channel = None
        profiler = _start_profile()
        try:
            secured = sock if sock.family == socket.AF_UNIX else self._secure(sock, peer[0], who)
            if secured is None:
                return
            sock = secured
            channel = Channel(sock)
            if not self._hello(channel, who):
                return
            take = self.kernel_output.take if self.kernel_output is not None else None
            session = Session(self.lease, self.executor, channel, take)
            session.peer_pid = peer_pid
            if self.process_workers is not None:
                session.process_start = self.process_workers.start
            self.sessions.add(session)
            how = (
                sock.version()
                if channel.encrypted
                else "local socket"
                if sock.family == socket.AF_UNIX
                else "unencrypted, this host"
            )
            native = self.native.session() if self.native and _native_dispatch.can_serve(sock) else None
            if native is not None:
                self.native_sessions.add(native)
                session.native = native
            log.info("client %s connected (%s)%s", who, how, ", native dispatch" if native else "")
            header, lane_logged = _wire.REQUEST, False
            while True:
                if native is not None:
                    native.serve(channel, session, self._touch)
                call_id, flags, args_len, _, bulk_len = header.unpack(channel.read_exact(header.size))
                if args_len > _wire.MAX_ARGS_BYTES:
                    log.warning("client %s sent a corrupt frame; closing", who)
                    return
                self.in_calls.add(id(session))
                try:
                    # held while the lease migrates; not by a lane: its pieces belong to a copy whose owner's
                    # call holds the gate, or fill a queued copy's staging buffer that its stream (drained by the
                    # pause) waits for
                    with self.lease.gate if session.lane_of is None else contextlib.nullcontext():
                        # moved to another server: the process is told, or the frame goes on there
                        if self.moved is not None:
                            args = channel.read_exact(args_len)
                            if not self.moved.frame(session, channel, call_id, flags, args, bulk_len):
                                return
                            continue
                        session.dispatch(call_id, flags, channel.read_exact(args_len), bulk_len)
                finally:
                    self.in_calls.discard(id(session))
                self._touch()
                if session.lane_of is not None and not lane_logged:
                    log.info("client %s: a copy lane of its process's connection", who)
                    lane_logged = True
                if session.calls_back_for is not None:  # the process's callback connection from now on
                    what = "a delivery connection" if session.delivers else "callback connection"
                    log.info("client %s: %s of its process", who, what)
                    session.calls_back_for.callbacks.closed.wait()
                    return
        except (ConnectionClosed, OSError):  # gone, reset, timed out in the hello, or a TLS failure
            log.info("client %s disconnected", who)
        except Exception:
            log.exception("client %s: worker error; closing its connection", who)
        finally:
            with self._closed:
                self._closing += 1
            try:
                self._close_connection(sock, channel, native, session, profiler, who)
            finally:
                with self._closed:
                    self._closing -= 1
                    self._closed.notify_all()

    def _close_connection(self, sock, channel, native, session, profiler, who: str) -> None:
        if profiler is not None:
            _write_profile(profiler, who)
        sock.close()
        if channel is not None and channel.ring is not None:
            channel.ring.close()
        if native is not None:
            self.native_sessions.discard(native)
            native.close()
        if session is not None:
            self.sessions.discard(session)
            self._end_thread(who)
            session.close()
            if self.moved is not None:
                self._left_after_move(session)
            if self.process_workers is not None and self.process_workers.ended(session):
                threading.Thread(target=self._leave_with_process, daemon=True).start()

    def wait_closing(self, timeout: float) -> None:
        """Up to `timeout` s for the connections whose clients have gone to finish cleaning up (their
        page-locked memory dropped, their statistics and profiles written) before this process exits:
        a worker is stopped right after its last client leaves."""
        if self.sessions:  # a client that has just left: its connection's thread is about to see it
            time.sleep(CLOSING_NOTICE_S)
        with self._closed:
            self._closed.wait_for(lambda: self._closing == 0, timeout)

    def _left_after_move(self, session) -> None:
        """A connection ended after the lease moved away: once none of the moved processes is left here, this
        worker has nothing more to do (its GPU memory went with the processes' sessions)."""
        if self.moved.closed(session) and not self.sessions:
            self.leave_after_move()

    def leave_after_move(self) -> None:
        """Nothing of the lease is here any more: the worker exits (its server cleans up after it)."""
        log.info("every process of the lease reconnected to its new worker (or ended): exiting")
        logging.shutdown()
        os._exit(0)

    def _leave_with_process(self) -> None:
        """A process worker's process has ended: once its other connections have closed too, so does the
        worker (its contexts, and whatever fault they hold, go with it)."""
        with self._closed:
            self._closed.wait_for(lambda: not self.sessions and self._closing == 0, CLOSING_WAIT_S)
        log.info("its process has ended: the process worker exits")
        if self.process_workers is not None and self.process_workers.exporter:
            self.process_workers.exporter.close()  # its IPC socket goes with it
        with contextlib.suppress(Exception):
            self.executor.close()
        logging.shutdown()
        os._exit(0)

    def _end_thread(self, who: str) -> None:
        """This connection's per-thread executor state (page-locked staging), before its session frees
        the client's contexts."""
        try:
            self.executor.end_thread()
        except Exception:  # never stops the cleanup that follows
            log.exception("client %s: freeing the connection's staging buffers failed", who)

    def _secure(self, sock: socket.socket, host: str, who: str):
        """The connection to read frames from: TLS when the client opens with it (it must, from another
        host), plaintext from this host. None: refused (and closed by the caller)."""
        sock.settimeout(HELLO_TIMEOUT_S)
        try:
            first = sock.recv(1, socket.MSG_PEEK)
        except OSError:
            return None  # nothing within the hello's time, or gone
        if first and first[0] == _data_tls.TLS_RECORD_FIRST_BYTE and self.tls is not None:
            try:
                if self.native_tls is not None:
                    return _native_tls.NativeTlsStream(self.native_tls, sock, HELLO_TIMEOUT_S)
                stream = _data_tls.TlsStream(sock, self.tls, server_side=True)
                stream.do_handshake()
                return stream
            except (ssl.SSLError, OSError) as exc:
                log.warning("client %s: TLS handshake failed (%s); closing", who, exc)
                return None
        if not _data_tls.is_loopback(host):
            log.warning(
                "client %s sent plaintext from another host; the data connection must be encrypted", who
            )
            return None
        return sock

    def _hello(self, channel: Channel, who: str) -> bool:
        """The handshake of _wire: both ends prove they hold the lease secret; it never crosses the wire."""
        channel.sock.settimeout(HELLO_TIMEOUT_S)
        try:
            (version,), nonce_c = self._frame(channel, "gpHello", _wire.NONCE_BYTES)
        except ValueError:
            log.warning("client %s did not start with a hello; closing", who)
            return False
        if version != WIRE_VERSION:
            log.warning(
                "client %s speaks protocol %#x, this worker %#x (another gpupool version); refused",
                who,
                version,
                WIRE_VERSION,
            )
            channel.send(_wire.REPLY.pack(CUresult.NOT_SUPPORTED, 0, 0))
            return False
        nonce_w = secrets.token_bytes(_wire.NONCE_BYTES)
        mine = _wire.proof(self.secret, _wire.WORKER_LABEL, nonce_c, nonce_w)
        channel.send(_wire.REPLY.pack(CUresult.SUCCESS, 0, len(nonce_w) + len(mine)), nonce_w, mine)
        try:
            _, theirs = self._frame(channel, "gpProve", _wire.PROOF_BYTES)
        except ValueError:
            log.warning("client %s did not prove it holds the lease secret; closing", who)
            return False
        channel.sock.settimeout(None)
        if not hmac.compare_digest(theirs, _wire.proof(self.secret, _wire.CLIENT_LABEL, nonce_w, nonce_c)):
            log.warning("client %s does not hold the lease secret; refused", who)
            channel.send(_wire.REPLY.pack(CUresult.NOT_PERMITTED, 0, 0))
            return False
        outs = struct.pack(INTERNAL["gpProve"].out_format, len(self.devices))
        channel.send(_wire.REPLY.pack(CUresult.SUCCESS, len(outs), 0), outs)
        return True

    @staticmethod
    def _frame(channel: Channel, name: str, bulk_bytes: int) -> tuple[tuple, bytes]:
        """One handshake frame: exactly the call `name` with its in-arguments and `bulk_bytes` of bulk."""
        call = INTERNAL[name]
        call_id, _flags, args_len, _, bulk_len = _wire.REQUEST.unpack(channel.read_exact(_wire.REQUEST.size))
        if call_id != CALL_IDS[call] or args_len != call.in_struct.size or bulk_len != bulk_bytes:
            raise ValueError(name)
        return call.in_struct.unpack(channel.read_exact(args_len)), channel.read_exact(bulk_len)

    def _touch_while_busy(self) -> None:
        """A call that runs for minutes (a synchronise behind long kernels) keeps the lease in use;
        and what the lease holds is written for the server within a second of a change."""
        while True:
            self._write_usage()
            time.sleep(1.0)
            if self.in_calls or any([n.active() for n in list(self.native_sessions)]):
                self._touch()

    def _write_usage(self) -> None:
        """What the lease holds, for the pool server: the lease's worker writes it, its process workers'
        memory included."""
        if self.process_workers is not None and not self.process_workers.is_root:
            return
        total = getattr(self.lease.used, "total", None)
        used = total() if total is not None else list(self.lease.used)
        if used == self._usage_written:
            return
        tmp = self.usage.with_name(f".{USAGE_FILE}.tmp")
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps(used))
            tmp.replace(self.usage)  # the server never reads half a list
            self._usage_written = used

    def _touch(self) -> None:
        now = time.monotonic()
        if now - self._last_touch >= 1.0:
            self._last_touch = now
            with contextlib.suppress(OSError):
                self.activity.touch()


def _start_profile():
    """Under GPUPOOL_WORKER_PROFILE=DIR, profile this connection's thread (for finding where time goes)."""
    if not os.environ.get(PROFILE_ENV):
        return None
    import cProfile

    profiler = cProfile.Profile()
    try:
        profiler.enable()
    except ValueError:  # Python 3.12+: one profiler at a time; the first connection (the program's) has it
        log.info("%s: another connection of this worker is being profiled; this one is not", PROFILE_ENV)
        return None
    return profiler


def _write_profile(profiler, who: str) -> None:
    import pstats

    profiler.disable()
    path = Path(os.environ[PROFILE_ENV]) / f"worker-{os.getpid()}-{re.sub(r'[^0-9A-Za-z.]+', '-', who)}.txt"
    with contextlib.suppress(OSError), path.open("w") as out:
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(45)
        log.info("profile of client %s written to %s", who, path)


def make_executor(kind: str, devices: list[WorkerDevice]):
    if kind == "host":
        from virtualize.server._executor_host import HostExecutor

        return HostExecutor(devices)
    if kind == "cuda":
        from virtualize.server._cuda import CudaExecutor

        executor = CudaExecutor(devices)
        executor.word_waiter = _native_dispatch.word_waiter()  # copies' marks waited for in C
        executor.copy_queuer = _native_dispatch.copy_queuer()  # and queued in one C call with them
        return executor
    raise ValueError(f"unknown executor {kind!r} (cuda or host)")


def _watch_parent(parent: int, who: str) -> None:
    while True:
        if os.getppid() != parent:
            log.warning("%s (pid %d) is gone; worker exits", who, parent)
            os._exit(3)
        time.sleep(1.0)


def _local_listener(lease: str) -> tuple[socket.socket | None, str]:
    """A Unix socket in the abstract namespace for clients on this host: it skips the TCP stack (about
    twice the bulk rate of loopback TCP) and, never leaving the kernel, needs no encryption. Clients
    still prove the lease secret on it. (None, "") where there is none (not Linux)."""
    name = f"gpupool-worker-{lease}-{secrets.token_hex(8)}"
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind("\0" + name)
        sock.listen(64)
    except OSError as exc:
        log.info("no local socket (%s): clients on this host use TCP", exc)
        return None, ""
    return sock, name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {WORKER_MODULE}", description=__doc__.split("\n\n")[0])
    parser.add_argument("--lease", required=True, help="the lease id (for logs)")
    parser.add_argument("--bind", default="127.0.0.1", help="address to listen on (port: any free one)")
    parser.add_argument("--devices", required=True, help="JSON list of {index, uuid, mem_limit_bytes}")
    parser.add_argument("--state-dir", required=True, help="directory of the activity file")
    parser.add_argument("--parent", type=int, default=0, help="exit when this process is gone")
    parser.add_argument("--receive", type=float, default=0.0, metavar="SECONDS",
                        help="receive the running lease from another server's worker: wait this long for it on a "
                        f"second port (the one-time secret in ${MIGRATION_SECRET_ENV}), then exit")  # fmt: skip
    parser.add_argument("--process-of", type=int, default=-1, metavar="SLOT",
                        help="a process worker of the lease (started by the lease's worker for one process that "
                        "asked for a worker of its own): its slot in the lease's usage file")  # fmt: skip
    args = parser.parse_args(argv)
    process_worker = args.process_of >= 0
    # A crash in the driver or the bindings (SIGSEGV, SIGABRT) leaves the Python stacks of every thread in the
    # worker's log, not only "the worker died": what the operator and the next fix need.
    faulthandler.enable(all_threads=True)
    level = os.environ.get("GPUPOOL_WORKER_LOG", "INFO").strip().upper()
    known = level in logging.getLevelNamesMapping()
    logging.basicConfig(
        level=level if known else "INFO",
        format=f"%(asctime)s gpupool-worker[{args.lease}{f' process {args.process_of}' if process_worker else ''}]"
        " %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    if not known:
        log.warning("GPUPOOL_WORKER_LOG=%r is not a log level (DEBUG, INFO, WARNING, ERROR); INFO", level)
    devices = [WorkerDevice(**d) for d in json.loads(args.devices)]
    secret = os.environ.pop(SECRET_ENV, "")
    migration_secret = os.environ.pop(MIGRATION_SECRET_ENV, "")
    kind = os.environ.get(EXECUTOR_ENV, "cuda")

    def ready(**answer) -> None:
        try:
            sys.stdout.write(json.dumps(answer) + "\n")
            sys.stdout.flush()
        except OSError:  # whoever started this worker is gone (a spare started as its lease ended)
            log.info("nobody reads this worker's ready line any more: it exits")
            os._exit(2)

    if not secret:
        ready(error=f"{SECRET_ENV} is not set")
        return 2
    if args.receive and not migration_secret:
        ready(error=f"--receive needs {MIGRATION_SECRET_ENV}")
        return 2
    try:
        executor = make_executor(kind, devices)
    except Exception as exc:
        ready(error=f"{kind} executor: {exc}")
        return 2
    try:
        if process_worker:  # the lease's certificate, which its worker made: the client pinned that one
            tls, fingerprint = _data_tls.shared_context(Path(args.state_dir))
        else:
            tls, fingerprint = _data_tls.server_context(Path(args.state_dir), args.lease)
    except _data_tls.TlsUnavailable as exc:
        if process_worker and not Path(args.state_dir).is_dir():  # its lease has ended: nothing to serve
            ready(error=str(exc))
            return 2
        if not _data_tls.is_loopback(args.bind):
            ready(error=f"cannot encrypt the data connection: {exc}")
            return 2
        log.warning("%s: clients on this host only, unencrypted", exc)
        tls, fingerprint = None, ""
    listener = socket.create_server((args.bind, 0), backlog=64)
    host, port = listener.getsockname()[:2]
    local, local_name = _local_listener(args.lease)
    arrivals = socket.create_server((args.bind, 0), backlog=4) if args.receive else None
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if args.parent:
        who = "the lease's worker" if process_worker else "the pool server"  # whoever started this one
        threading.Thread(target=_watch_parent, args=(args.parent, who), daemon=True).start()
    log.info("listening on %s:%d, %d device(s), %s executor", host, port, len(devices), executor.name)
    lacks = executor.driver_lacks()
    if lacks:
        log.info(
            "this driver lacks %d ABI(s) of the call table (name@version): %s", len(lacks), ", ".join(lacks)
        )
    migrate_port = arrivals.getsockname()[1] if arrivals is not None else 0
    ready(host=host, port=port, pid=os.getpid(), tls_sha256=fingerprint, local=local_name, lacks=lacks,
          migrate_port=migrate_port)  # fmt: skip
    output = KernelOutput()  # after the ready line, the last thing this process says on stdout
    worker = None
    try:
        worker = Worker(args.lease, devices, executor, Path(args.state_dir), secret, tls, output)
        worker.share_usage(Path(args.state_dir), max(args.process_of, 0))
        worker.process_workers = _process_workers.ProcessWorkers(
            worker, _process_workers.worker_arguments(args), secret, is_root=not process_worker
        )
        if not process_worker:  # a move is the lease's worker's to answer
            _migrate.serve_requests(worker, Path(args.state_dir), _migrate_out.request)
        if arrivals is not None:
            log.info("waiting up to %g s for the lease's state on port %d", args.receive, migrate_port)
            _migrate_out.receive(worker, arrivals, migration_secret.encode(), args.receive)
        worker.serve(listener, local)
    finally:
        if worker is not None:
            worker.wait_closing(CLOSING_WAIT_S)
            if worker.process_workers is not None:
                worker.process_workers.stop()
        executor.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
