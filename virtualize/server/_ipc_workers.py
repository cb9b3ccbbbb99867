"""CUDA IPC memory handles between the workers of one lease (``gpuattach run --isolate``: a worker process
per client process, virtualize.server._process_workers).

A process's IPC handle names its allocation's address and size (the shim's cuIpcGetMemHandle). Under
isolation the process that opens it talks to another worker, which does not hold that memory. So each
worker of such a lease makes its window pages exportable (a POSIX file descriptor: measured on an H200 to
cost nothing, bench/bench_exportable_memory.py) and answers, on a Unix socket in the lease's state folder,
``ipc-<pid>.sock``, for the pages an allocation of its own lives on: their range, device and descriptor
(SCM_RIGHTS). The opening worker asks each of the lease's other workers, maps those pages at the same
address in its own process (the address the handle names, as natively the program uses it) and serves
the range as memory of the lease that it does not count: the partition counts it once, in the exporter.

An interprocess event's handle is carried the same way: the opener's worker asks for the driver's own IPC
handle of the event and opens it, an event of its own that waits on the exporter's records, as natively.
So is memory of the virtual memory API that a process exported as a POSIX descriptor (NCCL's cuMem
transport): the importer's worker gets the driver's descriptor of it and imports it, a handle of its own
that the program maps where it likes.

Only the lease's workers reach the socket (the state folder is the lease's, its owner's alone); a handle
of another lease names memory no worker of this lease has, and is refused as natively. Memory opened
from another worker counts against the partition in its exporter's worker, and in the opener's once the
exporting process has exited (Imports.count_departed).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from virtualize.server._executor import INVALID_VALUE, CudaError

log = logging.getLogger("gpupool.worker")

SOCKET_PREFIX = "ipc-"
WINDOWS_PREFIX = "windows-"
REQUEST = struct.Struct("<IQQ")  # MEMORY: the allocation's address and size; EVENT, VMEM: the handle, 0
# CLOSED: an allocation opened with MEMORY closed again (base, 0); VM_CLOSED: memory imported with VMEM
# released again by every process of the importing worker (the exported handle, 0)
MEMORY, EVENT, VMEM, CLOSED, VM_CLOSED = 0, 1, 2, 3, 4
CLOSED_ANSWER = struct.Struct("<i")  # CLOSED's and VM_CLOSED's: 0 once the exporter has counted the close
# MEMORY's answer: 0 or a CUresult; the pages' base and size; their device; the pid of the process the
# exporting worker serves (0: not on this host) (and a descriptor with 0)
ANSWER = struct.Struct("<iQQii")
# EVENT's answer: 0 or a CUresult; the driver's IPC handle of the event
EVENT_ANSWER = struct.Struct("<i64s")
# VMEM's answer: 0 or a CUresult; the memory's size, device, the pid of the process the exporting worker
# serves, and its CUmemAllocationProp (length, bytes); and a descriptor with 0
VMEM_ANSWER = struct.Struct("<iQiiI64s")
ASK_TIMEOUT_S = 5.0


def socket_path(state_dir: Path, pid: int) -> Path:
    return state_dir / f"{SOCKET_PREFIX}{pid}.sock"


def running(pid: int) -> bool:
    """Whether process `pid` of this host still runs (0, unknown: taken as running)."""
    if not pid:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's: it runs
        return True
    return True


def _of_running_workers(paths, prefix: str) -> list[Path]:
    """The files among `paths` (`<prefix><pid>...`) of workers still running; a worker that crashed left
    its own behind: removed here, so no one asks it or keeps clear of its windows again."""
    kept = []
    for path in paths:
        digits = path.name[len(prefix) :].split(".")[0]
        if digits.isdigit() and not running(int(digits)):
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        kept.append(path)
    return kept


@dataclass
class Pages:
    """Another worker's pages mapped here: `opens` of the program's handles use them."""

    base: int
    size: int
    backing: object
    window: int  # the base of the reservation here that holds them (Imports.windows)
    opens: int = 0


class Exporter:
    """This worker's side: answers the lease's other workers for the pages of its allocations and for its
    interprocess events. `pages_of` (address, size) -> (pages' base, size, device, backing) or a CudaError;
    `export` (backing) -> a descriptor for the pages, closed here once sent; `event_handle` (event) -> the
    driver's 64-byte IPC handle of it, or a CudaError; `vm_export` (handle a process exported) -> (size,
    device, CUmemAllocationProp bytes, a descriptor closed here once sent), or a CudaError; `serving` () ->
    the pid of the process this worker serves, where it is on this host (else 0); `opened`, `closed` (base,
    the asking worker's pid): another worker opened this worker's allocation at `base`, or closed it again
    (LeaseState.opened_by, closed_by: one freed meanwhile stays counted here until its last opener closes it);
    `vm_opened`, `vm_closed` (exported handle, the asking worker's pid): the same for memory of the virtual
    memory API (LeaseState.vm_opened_by, vm_closed_by)."""

    def __init__(
        self,
        state_dir: Path,
        pages_of: Callable,
        export: Callable[[object], int],
        event_handle: Callable,
        vm_export: Callable,
        serving: Callable[[], int],
        opened: Callable[[int, int], None] = lambda base, worker: None,
        closed: Callable[[int, int], None] = lambda base, worker: None,
        vm_opened: Callable[[int, int], None] = lambda handle, worker: None,
        vm_closed: Callable[[int, int], None] = lambda handle, worker: None,
    ) -> None:
        self.path = socket_path(state_dir, os.getpid())
        self.pages_of, self.export, self.event_handle = pages_of, export, event_handle
        self.vm_export, self.serving = vm_export, serving
        self.opened, self.closed = opened, closed
        self.vm_opened, self.vm_closed = vm_opened, vm_closed
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(self.path))
        os.chmod(self.path, 0o600)
        self.sock.listen(16)
        threading.Thread(target=self._serve, name="gpupool-ipc-export", daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed: the worker ends
                return
            with conn:
                conn.settimeout(ASK_TIMEOUT_S)
                try:
                    self._answer(conn)
                except OSError:  # the asking worker has gone
                    pass
                except Exception:  # a bug here must not stop the answers to the next ones
                    log.exception("answering another worker of the lease failed")

    def _answer(self, conn: socket.socket) -> None:
        request = conn.recv(REQUEST.size, socket.MSG_WAITALL)
        if len(request) != REQUEST.size:
            return
        kind, base, size = REQUEST.unpack(request)
        asker = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
        if kind in (CLOSED, VM_CLOSED):
            (self.closed if kind == CLOSED else self.vm_closed)(base, asker)
            conn.sendall(CLOSED_ANSWER.pack(0))
            return
        if kind == EVENT:
            try:
                conn.sendall(EVENT_ANSWER.pack(0, self.event_handle(base)))
            except CudaError as exc:
                conn.sendall(EVENT_ANSWER.pack(exc.code, b""))
            return
        if kind == VMEM:
            try:
                vm_size, device, prop, fd = self.vm_export(base)
            except CudaError as exc:
                conn.sendall(VMEM_ANSWER.pack(exc.code, 0, 0, 0, 0, b""))
                return
            try:
                answer = VMEM_ANSWER.pack(0, vm_size, device, self.serving(), len(prop), prop)
                socket.send_fds(conn, [answer], [fd])
            finally:
                os.close(fd)
            self.vm_opened(base, asker)
            log.info("memory handle 0x%x (%d bytes) exported to another worker of the lease", base, vm_size)
            return
        try:
            pages_base, pages_size, device, backing = self.pages_of(base, size)
            fd = self.export(backing)
        except CudaError as exc:
            conn.sendall(ANSWER.pack(exc.code, 0, 0, 0, 0))
            return
        try:
            socket.send_fds(conn, [ANSWER.pack(0, pages_base, pages_size, device, self.serving())], [fd])
        finally:
            os.close(fd)
        self.opened(base, asker)
        log.info("pages [0x%x, +%d) exported to another worker of the lease", pages_base, pages_size)

    def close(self) -> None:
        """The worker ends: its socket, and the note of its windows (Neighbours), go."""
        self.sock.close()
        for path in (self.path, self.path.with_name(f"{WINDOWS_PREFIX}{os.getpid()}")):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def _ask_others(state_dir: Path, kind: int, value: int, size: int, answer: struct.Struct):
    """Each other worker of the lease in turn, until one answers 0: (its answer's fields, descriptors, its
    pid)."""
    mine = socket_path(state_dir, os.getpid()).name
    for path in _of_running_workers(sorted(state_dir.glob(f"{SOCKET_PREFIX}*.sock")), SOCKET_PREFIX):
        if path.name == mine:
            continue
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(ASK_TIMEOUT_S)
            try:
                sock.connect(str(path))
                sock.sendall(REQUEST.pack(kind, value, size))
                data, fds, _, _ = socket.recv_fds(sock, answer.size, 1)
            except OSError:  # that worker has gone (its process ended): ask the next
                continue
        fields = answer.unpack(data) if len(data) == answer.size else (-1,)
        if fields[0] == 0 and len(fds) == (kind != EVENT):
            return fields, fds, int(path.name[len(SOCKET_PREFIX) :].split(".")[0])
        for fd in fds:
            os.close(fd)
    return None


def fetch(state_dir: Path, base: int, size: int) -> tuple[int, int, int, int, int, int] | None:
    """The pages of another worker's allocation [base, +size): (descriptor, pages' base, size, device, the
    pid whose end means the exporter has gone: its process's, else its worker's; the worker's pid), or None
    when no other worker of the lease has that allocation."""
    found = _ask_others(state_dir, MEMORY, base, size, ANSWER)
    if found is None:
        return None
    (_, pages_base, pages_size, device, owner), fds, pid = found
    return fds[0], pages_base, pages_size, device, owner or pid, pid


def tell_closed(state_dir: Path, worker: int, base: int, kind: int = CLOSED) -> None:
    """Tell the worker `worker` that this one closed its allocation at `base` (opened with fetch; with
    VM_CLOSED: released the memory it exported under the handle `base`, imported with fetch_vm), and wait
    until it has counted that; nothing where that worker has ended (it counts nothing any more)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(ASK_TIMEOUT_S)
        try:
            sock.connect(str(socket_path(state_dir, worker)))
            sock.sendall(REQUEST.pack(kind, base, 0))
            sock.recv(CLOSED_ANSWER.size, socket.MSG_WAITALL)
        except OSError:
            pass


def fetch_event(state_dir: Path, event: int) -> bytes | None:
    """The driver's IPC handle of another worker's interprocess event `event`, or None if no worker has it."""
    found = _ask_others(state_dir, EVENT, event, 0, EVENT_ANSWER)
    return None if found is None else found[0][1]


def fetch_vm(state_dir: Path, handle: int) -> tuple[int, int, int, bytes, int, int] | None:
    """Memory of the virtual memory API that a process of another worker exported under `handle`:
    (descriptor, size, device, CUmemAllocationProp bytes, the pid whose end means the exporter has gone, the
    exporting worker's pid), or None when no other worker exported it."""
    found = _ask_others(state_dir, VMEM, handle, 0, VMEM_ANSWER)
    if found is None:
        return None
    (_, size, device, owner, prop_len, prop), fds, pid = found
    return fds[0], size, device, prop[:prop_len], owner or pid, pid


class Neighbours:
    """The address ranges each worker of the lease reserves, in `windows-<pid>` of the state folder: its own
    windows, and the other workers' windows it holds reserved for their pages (Imports). A new window keeps
    clear of all of them, so its pages can be mapped in any other worker at their own address; a held
    reservation stays noted after its exporter has gone, so no new window is drawn over it."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.path = state_dir / f"{WINDOWS_PREFIX}{os.getpid()}"
        self.own: list[tuple[int, int]] = []
        self.held: list[tuple[int, int]] = []
        self.lock = threading.Lock()

    def taken(self) -> list[tuple[int, int]]:
        """The ranges the other workers noted, and those this worker holds for them."""
        ranges = list(self.held)
        for path in _of_running_workers(self.state_dir.glob(f"{WINDOWS_PREFIX}*"), WINDOWS_PREFIX):
            if path != self.path and path.suffix != ".part":
                with contextlib.suppress(OSError, ValueError):
                    ranges += [
                        tuple(int(x, 16) for x in line.split()) for line in path.read_text().splitlines()
                    ]
        return ranges

    def note(self, windows: list[tuple[int, int]]) -> None:
        """This worker's windows now."""
        with self.lock:
            self.own = list(windows)
            self._write()

    def hold(self, ranges: list[tuple[int, int]]) -> None:
        """The other workers' windows this worker holds reserved now."""
        with self.lock:
            self.held = list(ranges)
            self._write()

    def _write(self) -> None:
        """Written whole, then renamed: a reader sees all of it or the previous note."""
        part = self.path.with_suffix(".part")
        part.write_text("".join(f"{base:x} {size:x}\n" for base, size in self.own + self.held))
        part.replace(self.path)


class Imports:
    """This worker's side of opening: other workers' pages mapped here, by their base; each opened range
    is served as memory of the lease that its exporter's worker counts, and this one once the exporting
    process has gone (count_departed).

    The pages go where the exporter has them, inside a reservation here of the exporter's whole window:
    the driver places a reservation at the address asked for when it is window-shaped (1 GiB aligned, as
    the exporter's own was made), not a few pages' worth (measured on an H200: a 2 MiB reservation at
    another worker's address was put elsewhere)."""

    def __init__(self, state_dir: Path, executor, neighbours: Neighbours, lease) -> None:
        self.state_dir, self.executor, self.neighbours, self.lease = state_dir, executor, neighbours, lease
        # What this worker opened of another's, by ("ipc", address) or ("vm", handle): [the exporter's pid
        # (fetch), size, device, counted here]. The exporter's worker counts it against the partition; once
        # the exporter has gone, this one does, for as long as it holds it (count_departed).
        self.exported_by: dict[tuple[str, int], list] = {}
        self.pages: dict[int, Pages] = {}
        self.opened: dict[int, int] = {}  # an opened range's address -> its pages' base
        # another worker's window reserved here: its base -> [its size, how many pages mapped in it]
        self.windows: dict[int, list[int]] = {}
        self.lock = threading.Lock()

    def open(self, base: int, size: int) -> int | None:
        """Map the pages of [base, +size) from the worker that has them; their device, or None if none has."""
        found = fetch(self.state_dir, base, size)
        if found is None:
            return None
        fd, pages_base, pages_size, device, pid, worker = found
        try:
            with self.lock:
                pages = self.pages.get(pages_base)
                if pages is None:
                    window = self.reserve_window(pages_base, pages_size)
                    try:
                        backing = self.executor.import_memory(fd, pages_base, pages_size, device)
                    except CudaError as exc:  # the program sees only an error code: say here what failed
                        self.release_window(window)
                        tell_closed(self.state_dir, worker, base)  # not opened after all
                        log.warning("pages [0x%x, +%d) of another worker of the lease could not be mapped "
                                    "here: %s", pages_base, pages_size, exc)  # fmt: skip
                        raise
                    pages = self.pages[pages_base] = Pages(pages_base, pages_size, backing, window)
                pages.opens += 1
                self.opened[base] = pages_base
                with self.lease.lock:
                    self.exported_by[("ipc", base)] = [pid, size, device, False, worker]
        finally:
            os.close(fd)
        return device

    def reserve_window(self, base: int, size: int) -> int:
        """The exporter's window holding [base, +size), reserved here at its own address (once for all the
        pages mapped from it) and noted as held (Neighbours); its base. Under `lock`."""
        window = next(
            ((b, n) for b, n in self.neighbours.taken() if b <= base and base + size <= b + n), None
        )
        window_base, window_size = window or (base, size)  # no note of it: the pages' own range
        held = self.windows.get(window_base)
        if held is None:
            got = self.executor.reserve_addresses(window_size, window_base)
            if got != window_base:
                self.executor.release_addresses(got, window_size)
                log.warning("another worker's window [0x%x, +%d) is not free here: the driver offered 0x%x",
                            window_base, window_size, got)  # fmt: skip
                raise CudaError(
                    INVALID_VALUE, f"[0x{window_base:x}, +{window_size}) is not free in this worker"
                )
            held = self.windows[window_base] = [window_size, 0]
            self.neighbours.hold([(b, n) for b, (n, _) in self.windows.items()])
        held[1] += 1
        return window_base

    def release_window(self, window_base: int) -> None:
        """One page fewer mapped in that window: with its last, the reservation and its note go. Under `lock`."""
        held = self.windows[window_base]
        held[1] -= 1
        if not held[1]:
            del self.windows[window_base]
            self.executor.release_addresses(window_base, held[0])
            self.neighbours.hold([(b, n) for b, (n, _) in self.windows.items()])

    def close(self, base: int) -> bool:
        """The program closed its handle to [base, ...): unmapped once no handle uses its pages."""
        with self.lock:
            pages_base = self.opened.pop(base, None)
            if pages_base is None:
                return False
            with self.lease.lock:  # exported_by is the lease lock's (count_departed runs under it)
                _, size, device, counted, worker = self.exported_by.pop(("ipc", base))
                if counted:
                    self.lease.used[device] -= size
            tell_closed(self.state_dir, worker, base)  # its worker counted it, if it still does
            pages = self.pages[pages_base]
            pages.opens -= 1
            if pages.opens:
                return True
            del self.pages[pages_base]
            self.executor.unmap_imported(pages.base, pages.size, pages.backing)
            self.release_window(pages.window)
        return True

    def note_vm(self, handle: int, pid: int, size: int, device: int, worker: int, exported: int) -> None:
        """`handle` here is memory the process `pid` exported under `exported`, in the worker `worker` (its
        vm_charged entry counts nothing here): that worker counts it until vm_released says otherwise."""
        with self.lease.lock:
            self.exported_by[("vm", handle)] = [pid, size, device, False, worker, exported]

    def vm_released(self) -> None:
        """After a release or an unmap: memory imported from another worker that no process of this one
        holds or maps any more is no longer its exporter's worker's to count for us (told VM_CLOSED, as
        natively the memory goes with its last holder and mapping). An imported handle is its memory's own
        key (note_vm: the first import)."""
        with self.lease.lock:
            gone = [key for key in self.exported_by if key[0] == "vm" and not self.lease.vm_in_use(key[1])]
            told = [self.exported_by.pop(key)[4:6] for key in gone]
        for worker, exported in told:
            tell_closed(self.state_dir, worker, exported, VM_CLOSED)

    def count_departed(self) -> None:
        """What this worker holds of workers that have gone is counted here from now on (the caller holds
        the lease's lock): natively memory counts while any process holds it."""
        gone: dict[int, bool] = {}  # one check per exporter, however many of its allocations are open here
        for key, entry in list(self.exported_by.items()):
            pid, size, device, counted = entry[:4]
            kind, value = key
            if kind == "vm" and not self.lease.vm_in_use(value):  # released since (vm_released)
                continue
            if counted:
                continue
            if pid not in gone:
                gone[pid] = not running(pid)
            if not gone[pid]:
                continue
            if kind == "vm":  # counted through its vm_charged entry from here on: dropped with it
                memory = value  # the imported handle is its memory's key (note_vm)
                if self.lease.vm_charged.get(memory, (1, 0))[0]:
                    continue  # counted here already (another holder of it made here)
                self.lease.vm_charged[memory] = (size, device)
                del self.exported_by[key]
            else:
                entry[3] = True
            self.lease.used[device] += size


def not_found(base: int) -> CudaError:
    return CudaError(INVALID_VALUE, f"0x{base:x} is memory of no worker of this lease")
