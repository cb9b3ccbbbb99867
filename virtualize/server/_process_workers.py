"""A worker process per client process, for a lease whose processes ask for it (``gpuattach run --isolate``,
GPUPOOL_ISOLATE=1 in the program's environment).

Natively each process has its own CUDA context: a device-side assert or an illegal address ends that
process's context, and its parent, children and siblings go on. A lease's worker serves all the lease's
processes in one context per GPU, so such a fault would end every process of the lease. Isolation is
therefore a process boundary: the lease's worker (the *root*, the one the pool server started) serves
the first process that asks, and answers every later one MOVED_TO a worker it starts for that process
alone (a *process worker*: the same command line, the lease's secret, the root's TLS certificate). The
shim connects there and starts anew; its extra connections (callbacks, copy lanes) follow it, and its
environment still names the root, so the processes it starts ask the root in turn. A process worker
serves one process and exits when that process's connections have closed.

What the lease's processes share across these workers is the partition: each worker's memory in use is
a slot of one file every worker of the lease maps (`SharedUsage`), and an allocation fits only if the
lease's total does. Under MPS, the device-side assert of one client leaves the others working (measured
on an H200: docs/remote.md, "Isolation"); an illegal address ends every client of that GPU, as MPS
documents, so only a whole-GPU lease (no MPS) isolates that one.
CUDA IPC memory, event and pool handles are carried across them (virtualize.server._ipc_workers); not yet
virtual-memory handles (opening one fails, and the shim says why), nor a move to another GPU or server
(refused). NCCL between ranks in different workers connects worker to worker, as under --spread.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from virtualize.common import _wire
from virtualize.server import _ipc_workers
from virtualize.server._executor import INVALID_HANDLE, INVALID_VALUE, CudaError

log = logging.getLogger("gpupool.worker")

ISOLATE = 1  # gpProcessStart's flag: this process wants a worker of its own
USAGE_SLOTS_FILE = "processes.usage"
SLOTS = 256  # workers of one lease at once; one more process is served by the root (not isolated)
START_TIMEOUT_S = 60.0


class SharedUsage:
    """One worker's memory in use per device (a list to LeaseState), kept in its slot of a file that every
    worker of the lease maps: SLOTS slots of 2 + devices int64s, the holder's pid (0: a free slot), the pid
    of the process it serves where that one is on this host (0: unknown), then the bytes per device."""

    FIRST = 2  # the per-device words' index in a slot

    def __init__(self, path: Path, devices: int, slot: int, *, create: bool) -> None:
        self.devices, self.slot = devices, slot
        self.width = self.FIRST + devices
        size = SLOTS * self.width * 8
        fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            self.map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.words = memoryview(self.map).cast("q")
        self.words[slot * self.width] = os.getpid()

    def __len__(self) -> int:
        return self.devices

    def __getitem__(self, device: int) -> int:
        if not 0 <= device < self.devices:
            raise IndexError(device)
        return self.words[self.slot * self.width + self.FIRST + device]

    def __setitem__(self, device: int, value: int) -> None:
        if not 0 <= device < self.devices:
            raise IndexError(device)
        self.words[self.slot * self.width + self.FIRST + device] = value

    def __iter__(self):
        return iter([self[d] for d in range(self.devices)])

    def elsewhere(self, device: int) -> int:
        """What the lease's other workers use of `device` now (a free slot's words are all 0: `clear`)."""
        return sum(self.words[self.FIRST + device :: self.width]) - self[device]

    def serving(self, pid: int) -> None:
        """This worker serves the process `pid` (on this host)."""
        self.words[self.slot * self.width + 1] = pid

    def wait_for_departed(self, device: int, timeout: float = 2.0) -> None:
        """Wait (up to `timeout` s) while a process worker still counts memory of `device` for a process of
        this host that has exited: natively a process's memory is free once it has exited, and its worker
        frees it a moment later."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(
            self.words[slot * self.width] and self.words[slot * self.width + self.FIRST + device]
            and not _ipc_workers.running(self.words[slot * self.width + 1])
            for slot in range(SLOTS) if slot != self.slot
        ):  # fmt: skip
            time.sleep(0.01)

    def total(self) -> list[int]:
        return [self[d] + self.elsewhere(d) for d in range(self.devices)]

    def take_slot(self) -> int | None:
        """A free slot, marked taken (its worker writes its own pid over the mark when it starts)."""
        w = self.width
        slot = next((s for s in range(SLOTS) if s != self.slot and not self.words[s * w]), None)
        if slot is not None:
            self.words[slot * w] = -1
        return slot

    def clear(self, slot: int) -> None:
        w = self.width
        for i in range(w):
            self.words[slot * w + (w - 1 - i)] = 0  # the bytes first, the pid last


class ProcessWorkers:
    """The worker's side of gpProcessStart: serve the process here, or send it to a worker of its own.
    `is_root`: the lease's worker, which starts process workers (a process worker serves its one process).

    Once the lease's worker has sent one process away it keeps a process worker started and waiting (a
    program that starts one process with CUDA tends to start more: test suites, data loaders), so the
    next process does not wait for a worker to start."""

    def __init__(self, worker, argv: list[str], secret: str, *, is_root: bool) -> None:
        self.worker = worker
        self.argv = argv  # this worker's own arguments, less --parent, --receive and --process-of
        self.secret = secret
        self.is_root = is_root
        self.lock = threading.Lock()
        self.served = None  # the Session of the one process this worker serves as isolated
        self.children: dict[int, tuple[subprocess.Popen, int]] = {}  # pid -> (process, slot): serving
        self.spare: tuple[subprocess.Popen, int, dict] | None = None  # started, waiting for a process
        self.spare_starting = False  # one spare at a time: a burst of processes starts no burst of spares
        self.stopping = False
        # once a process it serves is isolated (False: the socket could not be made)
        self.exporter: _ipc_workers.Exporter | bool | None = None

    def running(self) -> int:
        """How many process workers of the lease serve a process now."""
        with self.lock:
            return len(self.children)

    def start(self, session, flags: int):
        """gpProcessStart: (b"", b"") to serve the process here, or the MOVED_TO answer already sent."""
        from virtualize.server._executor_guard import ANSWERED

        if not flags & ISOLATE:
            return b"", b""
        with self.lock:
            if self.served is None:
                self.served = session
                usage = self.worker.lease.used
                if not self.is_root and isinstance(usage, SharedUsage):
                    usage.serving(session.peer_pid)
                self._share_memory(session)
                return b"", b""
        if not self.is_root:  # only where the environment was changed to name this worker: served, and said
            log.warning("a second process reached this process worker: it shares it, not isolated")
            return b"", b""
        try:
            outs = self._hand_out(session.channel, session.peer_pid)
        except OSError as exc:  # no room for another process: served here, not isolated, and said so
            log.warning("no worker of its own for a new process (%s): it shares the lease's worker", exc)
            return b"", b""
        session.channel.send(_wire.REPLY.pack(_wire.MOVED, len(outs), 0), outs)
        return ANSWERED

    def _share_memory(self, session) -> None:
        """IPC memory handles between the lease's workers (virtualize.server._ipc_workers): the process's pages
        exportable, another worker's memory opened through this worker's imports, this worker's answered."""
        state_dir, executor = self.worker.state_dir, self.worker.executor
        session.window.exportable = True
        session.window.neighbours = _ipc_workers.Neighbours(state_dir)
        lease = self.worker.lease
        session.ipc_imports = _ipc_workers.Imports(state_dir, executor, session.window.neighbours, lease)
        lease.departed_exports.append(session.ipc_imports.count_departed)
        if self.exporter is None:
            try:
                self.exporter = _ipc_workers.Exporter(
                    state_dir, self._pages_of, executor.export_memory, self._event_handle, self._vm_export,
                    lambda: self.served.peer_pid if self.served is not None else 0,
                    opened=lease.opened_by, closed=lease.closed_by,
                    vm_opened=lease.vm_opened_by, vm_closed=lease.vm_closed_by,
                )  # fmt: skip
                lease.departed_exports.append(lambda: lease.count_openers_gone(_ipc_workers.running))
            except OSError as exc:  # a state folder too deep for a socket's path, say: the process runs on
                log.warning("this worker's memory cannot be opened by the lease's other processes (%s)", exc)
                self.exporter = False

    def _pages_of(self, base: int, size: int) -> tuple[int, int, int, object]:
        """The pages of this worker's allocation [base, +size) for another worker (its exporter's lookup)."""
        a = self.worker.lease.find(base)
        pages = a.window.pages_of(base) if a and a.base == base and size <= a.size and a.window else None
        if pages is None:
            raise _ipc_workers.not_found(base)
        self._in_lease_context()
        return pages

    def _event_handle(self, event: int) -> bytes:
        """The driver's IPC handle of this worker's event `event`."""
        if self.worker.lease.native is not None:  # events the native loop destroyed are gone first
            self.worker.lease.native.settle_events()
        if event not in self.worker.lease.handles["event"]:
            raise CudaError(INVALID_HANDLE, f"0x{event:x} is an event of no process of this worker")
        self._in_lease_context()
        return self.worker.executor.ipc_event_handle(event)

    def _vm_export(self, handle: int) -> tuple[int, int, bytes, int]:
        """Memory a process of this worker exported (cuMemExportToShareableHandle): its size, device, properties
        and the driver's descriptor of it, for another worker's process to import."""
        lease = self.worker.lease
        with lease.lock:
            found = lease.vm_exported.get(handle)
        if found is None:
            raise CudaError(INVALID_VALUE, f"0x{handle:x} is memory no process of this worker exported")
        self._in_lease_context()
        return (*found, self.worker.executor.export_vm(handle))

    def _in_lease_context(self) -> None:
        """The exporter's thread in a context of the lease (a primary one), as the driver's calls want one."""
        ctx = next(iter(self.worker.lease.primary_ctx.values()), 0)
        if ctx:
            self.worker.executor.set_context(ctx)

    def _hand_out(self, channel, client_pid: int) -> bytes:
        """A process worker for one new process (the spare, or one started now) and its MOVED_TO outs; a new
        spare is started behind it."""
        with self.lock:
            spare, self.spare = self.spare, None
        if spare is None or spare[0].poll() is not None:
            spare = self._start()
        proc, slot, ready = spare
        with self.lock:
            self.children[proc.pid] = (proc, slot)
        threading.Thread(target=self._keep_spare, name="gpupool-spare-worker", daemon=True).start()
        who = f" (pid {client_pid}, this host)" if client_pid else ""
        log.info("a new process of the lease%s gets a worker of its own (pid %d, port %d)", who, proc.pid,
                 ready["port"])  # fmt: skip
        return _wire.MOVED_TO.pack(0, _where(channel, ready).encode(), str(ready.get("local", "")).encode(),
                                   str(ready.get("tls_sha256", "")).encode())  # fmt: skip

    def _keep_spare(self) -> None:
        with self.lock:
            if self.stopping or self.spare is not None or self.spare_starting:
                return
            self.spare_starting = True
        try:
            spare = self._start()
        except OSError as exc:
            log.info("no spare process worker (%s): the next process waits for its worker to start", exc)
            return
        finally:
            with self.lock:
                self.spare_starting = False
        with self.lock:
            if self.spare is None and not self.stopping:
                self.spare, spare = spare, None
        if spare is not None:  # one is waiting already, or the lease ends
            with contextlib.suppress(OSError):
                spare[0].terminate()

    def _start(self) -> tuple[subprocess.Popen, int, dict]:
        """A process worker started and ready: (process, slot, ready line)."""
        from server.workers import SECRET_ENV, _read_ready_line

        usage = self.worker.lease.used
        with self.lock:
            slot = usage.take_slot() if isinstance(usage, SharedUsage) else None
        if slot is None:
            raise OSError(f"the lease has {SLOTS} worker processes already")
        cmd = [sys.executable, "-m", "virtualize.server.worker", *self.argv, "--parent", str(os.getpid()),
               "--process-of", str(slot)]  # fmt: skip
        proc = subprocess.Popen(cmd, env={**os.environ, SECRET_ENV: self.secret}, stdout=subprocess.PIPE,
                                stdin=subprocess.DEVNULL)  # fmt: skip
        ready = _read_ready_line(proc, START_TIMEOUT_S)
        if "port" not in ready:
            with contextlib.suppress(OSError):
                proc.kill()
            proc.wait(5)
            usage.clear(slot)
            raise OSError(f"its worker did not start: {ready.get('error', 'no answer')}")
        threading.Thread(
            target=self._reap, args=(proc, slot), name="gpupool-process-worker", daemon=True
        ).start()
        return proc, slot, ready

    def _reap(self, proc: subprocess.Popen, slot: int) -> None:
        status = proc.wait()
        usage = self.worker.lease.used
        if isinstance(usage, SharedUsage):
            usage.clear(slot)  # what a worker that crashed still counted is the lease's again
        with self.lock:
            served = self.children.pop(proc.pid, None) is not None
        if served or status not in (0, -15):  # a spare let go (SIGTERM) is no news
            (log.info if status == 0 else log.warning)(
                "process worker pid %d exited (status %d)", proc.pid, status
            )

    def ended(self, session) -> bool:
        """A connection closed: whether it was the process this process worker serves (it then exits)."""
        return not self.is_root and session is self.served

    def stop(self) -> None:
        """The lease ends: its process workers end with it."""
        if self.exporter:
            self.exporter.close()
        with self.lock:
            self.stopping = True
            children = [p for p, _ in self.children.values()] + ([self.spare[0]] if self.spare else [])
            self.spare = None
        for proc in children:
            with contextlib.suppress(OSError):
                proc.terminate()
        for proc in children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)


def _where(channel, ready: dict) -> str:
    """host:port of a process worker as the client reaches it: the address it reached this worker at (the
    process worker listens where this one does), or loopback over the local socket."""
    host = "127.0.0.1"
    sock = getattr(channel.sock, "sock", channel.sock)  # a TLS stream's own socket
    with contextlib.suppress(OSError, IndexError, TypeError):
        name = sock.getsockname()
        if isinstance(name, tuple):
            host = name[0]
    return f"{_bracket(host)}:{ready['port']}"


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def worker_arguments(args) -> list[str]:
    """The arguments a process worker is started with: this worker's, less what is the root's alone."""
    return [
        "--lease",
        args.lease,
        "--bind",
        args.bind,
        "--devices",
        args.devices,
        "--state-dir",
        args.state_dir,
    ]
