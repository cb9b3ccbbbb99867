"""Live migration of a running lease to another GPU of this server (docs/remote.md, "Migration").

The worker owns every GPU object of the lease and the client holds only handles and addresses from
its address window, so a lease can move while its processes run: the lease's calls are held at a
point where none is executing (`Gate`), each context is synchronised (its streams drained), the
executor copies the device's memory to the target GPU at the same addresses and re-creates what the
processes hold there (`Executor.migrate`: all or nothing, the source untouched until it commits; CUDA
graphs are read on the source and built there: `virtualize.server._migrate_graphs`),
and the calls resume. The client notices a pause. The objects made anew have new handle values: the
worker's executor maps the client's values to them from then on (`virtualize.server._handles`), and
the native loop is given the same map (its handle tables' values) once the lease has moved.

What cannot move is refused before anything pauses, with the reason (`refusal`); the lease keeps
running. The pool server asks through the worker's state directory (``server.workers``: the request
file, SIGUSR1, the result file), so no frame of the client protocol changes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

from server.workers import MIGRATE_REQUEST_FILE, MIGRATE_RESULT_FILE
from virtualize.common.errors import VirtualizeError
from virtualize.server._executor import CudaError

log = logging.getLogger("gpupool.worker")

DRAIN_TIMEOUT_S = 30.0  # the longest a migration waits for the calls executing now to return
CAPTURING = 0  # CU_STREAM_CAPTURE_STATUS_NONE: any other status is a capture in flight
GREEN_KINDS = ("devres", "resdesc", "greenctx")  # SM partitions of the GPU the lease is on (_guard_green)


class MigrationRefused(VirtualizeError):
    """The lease cannot move now; it keeps running where it is (the title says why; the worker answers it
    to the pool server, which reports it as a ``MigrationFailed``)."""


class Gate:
    """Lets the lease's calls through, or holds new ones while the lease moves.

    Each call runs inside ``with gate:`` (one lock taken twice: it is on every call's path);
    `closed()` stops new calls and waits until those executing have returned (a call blocked in a
    synchronise keeps the lease from moving until it returns, or the migration gives up after its
    timeout and the lease runs on)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when the last running call returns
        self._open = threading.Event()
        self._open.set()
        self._running = 0

    def __enter__(self) -> None:
        while True:
            with self._lock:
                if self._open.is_set():
                    self._running += 1
                    return
            self._open.wait()

    def __exit__(self, *_) -> None:
        with self._lock:
            self._running -= 1
            if not self._running and not self._open.is_set():
                self._idle.notify_all()

    @contextlib.contextmanager
    def closed(self, timeout: float):
        with self._lock:
            if not self._open.is_set():
                raise MigrationRefused("a migration of this lease is already under way")
            self._open.clear()
            if not self._idle.wait_for(lambda: self._running == 0, timeout):
                self._open.set()
                raise MigrationRefused(f"the lease's calls did not pause within {timeout:.0f} s")
        try:
            yield
        finally:
            self._open.set()


def holding(lease) -> dict[str, int]:
    """How many objects of each handle kind the lease holds, and module globals whose address it has."""
    with lease.lock:
        held = {kind: len(values) for kind, values in lease.handles.items()}
        held["global"] = sum(1 for a in lease.allocations.values() if a.is_global)
    return held


def refusal(worker, device: int, target: int, uuid: str = "") -> str | None:
    """Why the lease's `device` cannot move to GPU `target` of this host now, or None."""
    devices = worker.devices
    if not 0 <= device < len(devices):
        return f"the lease has no device {device} (it has {len(devices)})"
    if target in {d.index for d in devices}:
        return f"GPU {target} already holds a partition of this lease"
    if os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
        return MPS_REFUSAL
    reason = worker.executor.migration_refusal(target, holding(worker.lease), uuid)
    return reason or lease_refusal(worker, {device})


MPS_REFUSAL = "the lease runs under MPS: its memory belongs to the GPU's MPS server, which cannot move it"


def lease_refusal(worker, devices: set[int]) -> str | None:
    """What keeps the lease's `devices` from moving wherever they would go, or None."""
    lease = worker.lease
    if any(lease.handles[kind] for kind in GREEN_KINDS):
        return (
            "the lease holds device resources or green contexts: they are partitions of this GPU's SMs, "
            "not re-created on another"
        )
    if any(not a.window for a in lease.allocations.values() if a.owned and a.device in devices):
        return "memory outside the processes' address windows (an older client): its addresses cannot be kept"
    for stream in list(lease.handles["stream"]):
        with contextlib.suppress(CudaError):  # a stream of a context gone meanwhile is not a capture
            if worker.executor.cuStreamIsCapturing(stream) != CAPTURING:
                return "a stream capture is in flight; migrate after cuStreamEndCapture"
    return None


def mappings(lease) -> list:
    """The address windows' mapped pages, of every device (`Mapping`s: a move replaces their backing);
    with the windows held (`_windows_held`)."""
    found: dict[int, object] = {}
    for window in list(lease.windows):
        for m in [*window.mappings.values(), *(m for slabs in window.slabs.values() for m in slabs)]:
            found[id(m)] = m
    return list(found.values())


@contextlib.contextmanager
def _windows_held(lease):
    """No process's window maps or unmaps while its memory moves (a client leaving closes its window
    outside the gate)."""
    with contextlib.ExitStack() as stack:
        for window in sorted(lease.windows, key=id):
            stack.enter_context(window.lock)
        yield


def _native_paused(worker, timeout: float) -> None:
    """The native loop leaves every frame to the Python path (gated, translated) until the lease has
    moved (`NativeLease.moved`), and the calls it is inside of return first."""
    native = worker.native
    if native is None:
        return
    native.python_only()
    deadline = time.monotonic() + timeout
    while any(session.busy() for session in list(worker.native_sessions)):
        if time.monotonic() > deadline:
            raise MigrationRefused(f"the lease's calls did not pause within {timeout:.0f} s")
        time.sleep(0.001)
    native.settle_events()  # the named events C made are in the records the move replays


def migrate(worker, device: int, target: int, timeout: float = DRAIN_TIMEOUT_S, uuid: str = "") -> dict:
    """Move the lease's `device` to GPU `target`; the answer for the server, or MigrationRefused."""
    reason = refusal(worker, device, target, uuid)
    if reason:
        raise MigrationRefused(reason)
    source = worker.devices[device].index
    asked = time.monotonic()
    try:
        _native_paused(worker, timeout)
        with worker.lease.gate.closed(timeout):
            paused = time.monotonic()
            reason = refusal(worker, device, target, uuid)  # a call just before the pause may have changed it
            if reason:
                raise MigrationRefused(reason)
            try:
                with _windows_held(worker.lease):
                    moved = worker.executor.migrate(device, target, mappings(worker.lease), uuid=uuid)
            except Exception as exc:  # the executor left the lease on its source
                log.exception("migration of device %d to GPU %d failed; the lease stays on GPU %d",
                              device, target, source)  # fmt: skip
                raise MigrationRefused(
                    f"the target GPU {target} failed: {exc}; the lease stays on GPU {source}"
                ) from None
            worker.devices[device] = replace(worker.devices[device], index=target, uuid=moved.get("uuid", ""))
            if worker.native is not None:  # C passes the target's objects on and serves again
                worker.native.moved()
            resumed = time.monotonic()
    except MigrationRefused:
        if worker.native is not None:  # nothing moved: C serves again, its handles as they were
            worker.native.python_only(False)
        raise
    answer = {"device": device, "from": source, "to": target, "bytes": moved["bytes"],
              "objects": moved.get("objects", 0), "pause_s": round(resumed - paused, 6),
              "wait_s": round(paused - asked, 6)}  # fmt: skip
    log.info("migrated device %d from GPU %d to GPU %d: %d bytes, %d objects re-created, paused %.3f s",
             device, source, target, moved["bytes"], moved.get("objects", 0), resumed - paused)  # fmt: skip
    return answer


def serve_requests(worker, state_dir: Path, to_server) -> None:
    """Answer the pool server's migration requests (SIGUSR1 after it writes the request file): to another GPU
    here, or to another server's receiving worker through `to_server(worker, target)` (_migrate_out.request,
    given by the worker: that module builds on this one)."""

    def run() -> None:
        request = state_dir / MIGRATE_REQUEST_FILE
        try:
            asked = json.loads(request.read_text())
            request.unlink()
            workers = getattr(worker, "process_workers", None)
            if workers is not None and workers.running():
                raise MigrationRefused(f"{workers.running()} of the lease's processes run in workers of their own "
                                       "(gpuattach run --isolate), which do not move yet")  # fmt: skip
            if "server" in asked:  # to another server's receiving worker (None: only whether it could leave)
                answer = to_server(worker, None if asked["server"] is None else dict(asked["server"]))
            else:
                answer = {"ok": True, **migrate(worker, int(asked["device"]), int(asked["to"]),
                                                uuid=str(asked.get("uuid") or ""))}  # fmt: skip
        except MigrationRefused as exc:
            answer = {"ok": False, "error": exc.title}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            answer = {"ok": False, "error": f"unreadable migration request ({exc})"}
        except Exception as exc:  # a bug: the server still gets its answer, not a wait for its timeout
            log.exception("migration failed")
            answer = {"ok": False, "error": f"the worker failed: {exc}"}
        result = state_dir / MIGRATE_RESULT_FILE
        partial = result.with_suffix(".partial")
        partial.write_text(json.dumps(answer))
        partial.replace(result)  # the server never reads half an answer
        moved = getattr(worker, "moved", None)
        if moved is not None and not moved.tokens and moved.closed(None) and not worker.sessions:
            worker.leave_after_move()  # it moved to another server with no process connected here

    signal.signal(signal.SIGUSR1, lambda *_: threading.Thread(target=run, name="gpupool-migrate").start())
