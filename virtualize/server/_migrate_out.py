"""Moving a running lease to another server's worker (docs/remote.md, "Between servers"): both ends.

The sending end (`send`, in the lease's worker, asked by its pool server through the request file as a
move to another GPU is): refuse up front what cannot leave this host (`refusal`), open the link to the
receiving worker (`virtualize.server._migrate_link`: TLS, the one-time secret), pause the lease's calls as
a move to another GPU does (`_migrate.Gate`, the native loop leaving frames to Python), drain its
contexts, and send the manifest — the processes' address windows and the memory mapped in them — and then
that memory, chunk by chunk, read from the device as it is.

The receiving end (`receive`, in a worker started with ``--receive SECONDS``): wait that long for one
sender that proves the secret, reserve each window at the SAME address (a range taken on this GPU fails
the move), map the memory there and fill it from the link, and say what it holds. Then it waits for the
sender's decision.

Until the receiving worker holds everything, the lease runs on its source: the sender resumes the calls
whatever failed (the link dropped, the receiving worker died or refused, a timeout), and a receiving
worker whose sender is gone or that no sender reached exits, which frees its GPUs (its server ends the
admission as for any worker that exits).

With the memory, the manifest carries the records the lease's objects are made from (contexts, streams,
events, modules, functions, pools and what configured them: `Translated.exported`, as JSON); the receiving
worker replays them on its executor and maps the client's handle values to what it made
(`Translated.imported`). Not carried yet (named in the answer): graphs, arrays, textures and surfaces, the
program's own virtual memory, libraries, module globals.

What is not built yet: the commit — each process's connection state (the guard's tables, its window)
re-attached on the receiving worker, the shim reconnecting there at a synchronising call, the lease's
record moving. Until it is, the sender ends every move once the receiving worker holds what it was sent,
with that reason (`NOT_BUILT`), and the lease runs on where it was.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

from virtualize.server import _migrate, _migrate_link
from virtualize.server._executor import CudaError
from virtualize.server._migrate import DRAIN_TIMEOUT_S, MPS_REFUSAL, MigrationRefused

log = logging.getLogger("gpupool.worker")

LINK_TIMEOUT_S = 60.0  # the longest one read or write of the link may take before the move fails
NOT_BUILT = (
    "committing the move to another server is not built yet (its processes' connections re-attached there, "
    "the shim reconnecting, the lease's record moving: docs/remote.md, Between servers)"
)
# Tests only: the receiving worker dies (exit 9, as a killed process) after this many bytes of memory.
DIES_AFTER_ENV = "GPUPOOL_TEST_RECEIVER_DIES_AFTER_BYTES"


def refusal(worker) -> str | None:
    """Why the lease cannot move to another server's worker, or None: what cannot move at all, and what
    only this host has."""
    if os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
        return MPS_REFUSAL
    lease = worker.lease
    if lease.nccl_comms:
        return "the lease holds NCCL communicators: their connections to the other ranks are this worker's"
    if any(session.pinned for session in list(worker.sessions)):
        return (
            "a process of the lease shares page-locked host memory with this worker (on its host): another "
            "server's worker cannot map it"
        )
    return _migrate.lease_refusal(worker, set(range(len(worker.devices))))


def send(worker, target: dict, timeout: float = DRAIN_TIMEOUT_S) -> dict:
    """Send the lease to the receiving worker `target` ({"host", "migrate_port", "tls_sha256", "secret"});
    the answer for the server, or MigrationRefused (the lease runs on here)."""
    reason = refusal(worker)
    if reason:
        raise MigrationRefused(reason)
    where = f"{target['host']}:{target['migrate_port']}"
    try:
        link = _migrate_link.connect(str(target["host"]), int(target["migrate_port"]), str(target["tls_sha256"]),
                                     str(target["secret"]).encode(), LINK_TIMEOUT_S)  # fmt: skip
    except (OSError, _migrate_link.LinkError) as exc:
        raise MigrationRefused(f"the receiving worker at {where} cannot be reached: {_why(exc)}") from None
    with link:
        try:
            return _sent(worker, link, where, timeout)
        except (OSError, _migrate_link.LinkError) as exc:
            raise MigrationRefused(
                f"the link to the receiving worker at {where} failed: {_why(exc)}"
            ) from None
        except CudaError as exc:
            raise MigrationRefused(f"reading the lease's memory failed: {exc}") from None
        finally:
            worker.executor.end_thread()  # this thread's staging buffers (page-locked on a GPU)


def _sent(worker, link: _migrate_link.Link, where: str, timeout: float) -> dict:
    asked = time.monotonic()
    try:
        _migrate._native_paused(worker, timeout)
        with worker.lease.gate.closed(timeout):
            paused = time.monotonic()
            reason = refusal(worker)  # a call just before the pause may have changed it
            if reason:
                raise MigrationRefused(reason)
            with _migrate._windows_held(worker.lease):
                for device in range(len(worker.devices)):
                    worker.executor.drain(device)
                held = _migrate.mappings(worker.lease)
                total = sum(m.size for m in held)
                link.send(_manifest(worker, held), total)
                for m in held:
                    worker.executor.copy_from_device(m.base, m.size, None, link.send_bytes)
                answer = link.receive()
            if answer.get("ok") is not True:
                raise MigrationRefused(f"the receiving worker at {where} failed: {answer.get('error')}")
            took = time.monotonic() - paused
            objects = int(answer.get("objects", 0))
            log.info("the lease reached the receiving worker at %s: %d bytes at the same addresses and %d objects "
                     "re-created in %.3f s", where, total, objects, took)  # fmt: skip
            link.send({"commit": False, "reason": NOT_BUILT})
            raise MigrationRefused(f"{total / 2**20:.1f} MiB of the lease's memory reached {where} at the same "
                                   f"addresses and {objects} of its objects were re-created there in {took:.3f} s"
                                   f"{_not_carried(worker)}, but {NOT_BUILT}")  # fmt: skip
    finally:
        if worker.native is not None:  # nothing moved: C serves again, its handles as they were
            worker.native.python_only(False)
        log.info("the lease's calls waited %.3f s for the move to another server", time.monotonic() - asked)


def _manifest(worker, held: list) -> dict:
    """What the receiving worker re-creates: each process's windows, the memory mapped in them (in the order
    its bytes follow), and the records its objects are made from (`Translated.exported`)."""
    windows = [[w.base, w.size] for memory in list(worker.lease.windows) for w in memory.windows]
    try:
        objects = worker.executor.exported()
    except TypeError as exc:
        raise MigrationRefused(str(exc)) from None
    return {"lease": worker.lease_id, "devices": len(worker.devices), "windows": windows,
            "memory": [[m.base, m.size, m.device] for m in held], "objects": objects}  # fmt: skip


# What the lease may hold that a move to another server does not carry yet (named in its answer).
NOT_CARRIED = {
    "graph": "CUDA graphs", "graphexec": "instantiated graphs", "array": "CUDA arrays",
    "mipmap": "mipmapped arrays", "texobj": "texture objects", "surfobj": "surface objects",
    "vmem": "memory of the virtual memory API", "library": "libraries (cuLibraryLoadData)",
    "global": "module globals whose address the program asked for",
}  # fmt: skip


def _not_carried(worker) -> str:
    held = _migrate.holding(worker.lease)
    kinds = [what for kind, what in NOT_CARRIED.items() if held.get(kind)]
    return f" (not carried yet: {', '.join(kinds)})" if kinds else ""


def _why(exc: BaseException) -> str:
    return getattr(exc, "title", "") or str(exc) or type(exc).__name__


# -- the receiving end ---------------------------------------------------------------------------------


def receive(worker, listener: socket.socket, secret: bytes, wait_s: float) -> None:
    """In a thread of a receiving worker: wait `wait_s` for the sender, take the lease's memory, and exit
    the process when the move will not complete (its GPUs are free then)."""

    def run() -> None:
        deadline = time.monotonic() + wait_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                _exit(f"no lease arrived within {wait_s:g} s")
            listener.settimeout(left)
            try:
                sock, peer = listener.accept()
            except TimeoutError:
                continue
            try:
                link = _migrate_link.accept(sock, worker.tls, secret, LINK_TIMEOUT_S)
            except (OSError, _migrate_link.LinkError) as exc:
                log.warning("migration link from %s refused: %s", peer[0], _why(exc))
                sock.close()
                continue
            break
        with link:
            try:
                reason = _held(worker, link)
            except (OSError, _migrate_link.LinkError) as exc:
                reason = f"the sending worker's link failed: {_why(exc)}"
        _exit(reason)

    threading.Thread(target=run, name="gpupool-receive", daemon=True).start()


def _held(worker, link: _migrate_link.Link) -> str:
    """Take the manifest and the memory; tell the sender; why this worker ends (the sender's decision)."""
    manifest = link.receive()
    dies_after = int(os.environ.get(DIES_AFTER_ENV, "0") or 0)
    executor, got = worker.executor.inner, 0  # nothing here is the clients': no records, no handle map
    contexts: dict[int, int] = {}  # device -> its primary context, current while its memory is copied
    try:
        for base, size in manifest["windows"]:
            at = executor.reserve_addresses(size, base)
            if at != base:
                executor.release_addresses(at, size)
                raise MigrationRefused(
                    f"device addresses [0x{base:x}, +{size}) are taken on this server's GPU"
                )
        for base, size, device in manifest["memory"]:
            if not 0 <= device < len(worker.devices):
                raise MigrationRefused(f"the lease's memory names device {device}; this worker has "
                                       f"{len(worker.devices)}")  # fmt: skip
            executor.map_memory(base, size, device)
            if device not in contexts:
                contexts[device] = executor.cuDevicePrimaryCtxRetain(device)
            executor.set_context(contexts[device])

            def fill(view: memoryview) -> None:
                nonlocal got
                link.read_into(view)
                got += len(view)
                if dies_after and got >= dies_after:
                    os._exit(9)

            executor.copy_to_device(base, size, None, fill)
    except (MigrationRefused, CudaError) as exc:
        why = getattr(exc, "title", "") or str(exc)
        link.send({"ok": False, "error": why})
        return why
    except (KeyError, TypeError, ValueError) as exc:
        link.send({"ok": False, "error": f"an unreadable manifest ({exc})"})
        return f"an unreadable manifest ({exc})"
    log.info("holding the lease's memory: %d bytes in %d range(s) at the addresses it had", got,
             len(manifest["memory"]))  # fmt: skip
    try:
        for device in contexts:  # the copies' references: the lease's own are the records'
            executor.cuDevicePrimaryCtxRelease(device)
        objects = worker.executor.imported(manifest["objects"])
    except (CudaError, TypeError, ValueError, KeyError) as exc:
        why = f"re-creating the lease's objects failed: {getattr(exc, 'title', '') or exc}"
        link.send({"ok": False, "error": why})
        return why
    log.info("holding the lease's objects: %d re-created, the client's handle values mapped to them", objects)
    link.send({"ok": True, "bytes": got, "objects": objects})
    decision = link.receive()
    return str(decision.get("reason") or "the sender did not commit")


def _exit(reason: str) -> None:
    """The move will not complete here: the worker exits and its GPUs are free (its server sees it exit)."""
    log.warning("the lease did not move here (%s): exiting, its GPUs are free", reason)
    logging.shutdown()
    os._exit(0)
