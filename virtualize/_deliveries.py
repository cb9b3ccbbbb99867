"""Copies into a client's page-locked memory that complete later (cuMemcpyDtoHAsync, cuMemcpyAsync).

The executor queues each copy behind its stream into a host buffer of its own and the client's call
returns at once. Each copy's bytes then go to the client on its process's callback connection as one
frame (`_wire.COPY_DATA`): from a thread of their own as soon as they are in host memory, and from
whoever is about to tell the client something that could show it the copy is done — the connection's
thread before any reply, the host-function thread before it calls a host function back. Each of those
first sends every copy that is done by then, so the client, which waits for as many frames as the
worker says it has sent (`_wire.COPIES_SENT`), never sees "done" before the bytes.

Frames go out in the order they are counted: one lock covers picking copies and sending them.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from virtualize import _wire
from virtualize._executor import CudaError, StagedCopy

log = logging.getLogger("gpupool.worker")


@dataclass
class _Copy:
    ident: int  # the client's id of the copy
    staged: StagedCopy | None  # None: it failed before it was queued
    error: int = 0


class Deliveries:
    """One client process's copies in flight, sent with `send(*parts) -> bool` (its callback connection;
    False once that is gone). Thread-safe."""

    def __init__(self, send: Callable[..., bool]) -> None:
        self._send = send
        self._queue: deque[_Copy] = deque()
        self._changed = threading.Condition()
        self._sending = threading.Lock()  # held from picking copies until their frames are out
        self.sent = 0  # frames sent so far (the client counts the frames it has landed)
        self._closed = False
        self._thread: threading.Thread | None = None

    def add(self, ident: int, staged: StagedCopy) -> None:
        self._push(_Copy(ident, staged))
        if staged.transient:  # its bytes are the device's own: out before another call can change them
            self.flush()

    def failed(self, ident: int, error: int) -> None:
        """A copy refused before it was queued: the client hears of it too, so it stops waiting."""
        self._push(_Copy(ident, None, error))

    def _push(self, copy: _Copy) -> None:
        with self._changed:
            if self._closed:
                return
            self._queue.append(copy)
            self._changed.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="gpupool-deliveries", daemon=True)
                self._thread.start()

    def pending(self) -> bool:
        return bool(self._queue)

    def flush(self, wait: bool = False) -> int:
        """Send every copy that is done by now (`wait`: every copy queued, once it is done); returns
        how many frames have been sent in all, the count the client is to wait for."""
        if wait:
            for copy in list(self._queue):
                if copy.staged is not None:
                    copy.staged.wait()
        with self._sending:
            while True:
                with self._changed:
                    done = [c for c in self._queue if c.staged is None or c.staged.ready()]
                    for c in done:
                        self._queue.remove(c)
                if not done:
                    return self.sent
                for c in done:
                    self._deliver(c)

    def _deliver(self, copy: _Copy) -> None:
        """One frame (under `_sending`): the bytes, or the error the copy met."""
        error, data = copy.error, b""
        if copy.staged is not None:
            try:
                data = copy.staged.view()
            except CudaError as exc:
                error = exc.code
        head = _wire.COPY_HEAD.pack(copy.ident, error, 0)
        try:
            if not self._send(_wire.REPLY.pack(_wire.COPY_DATA, len(head), len(data)), head, data):
                self.close()  # the client's process is gone
        finally:
            if copy.staged is not None:
                copy.staged.release()
        self.sent += 1

    def _run(self) -> None:
        """Sends each copy as soon as it is done, oldest first (later ones that finish earlier go too)."""
        while True:
            with self._changed:
                while not self._queue and not self._closed:
                    self._changed.wait()
                if self._closed:
                    return
                head = self._queue[0]
            try:
                if head.staged is not None:
                    head.staged.wait()
                self.flush()
            except Exception:  # a bug here must not leave the client waiting for ever
                log.exception("sending a copy to the client failed")
                self.close()
                return

    def close(self) -> None:
        """The client is gone: nothing more is sent, buffers go back."""
        with self._changed:
            self._closed = True
            left = list(self._queue)
            self._queue.clear()
            self._changed.notify_all()
        for copy in left:
            if copy.staged is not None:
                copy.staged.release()
