"""Copies into a client's page-locked memory that complete later (cuMemcpyDtoHAsync, cuMemcpyAsync).

The executor queues each copy behind its stream into a host buffer of its own and the client's call
returns at once. Each copy's bytes then go to the client as one frame (`_wire.COPY_DATA`) on its
process's callback connection, where the shim's callback thread writes them into the destination: from
a thread of their own as soon as they are in host memory, and from whoever is about to tell the client
something that could show it the copy is done. Before a host function is called back, the copies done
by then go first on the same connection. Before any reply, they go too, and the client hears how many
frames the callback connection has carried (`_wire.COPIES_SENT`) and reads the reply once it has landed
as many — so it never sees "done" before the bytes.

While a host function is out at the client (its answer awaited) nothing goes on the callback
connection: the client's callback thread is running the function, and a program thread waiting there
for bytes behind it could be what the function waits for. Copies due ahead of a reply then travel on
the process's own connection instead, ahead of the reply, read by the thread that waits for it — after
a COPIES_SENT where delivery connections may still carry pieces of earlier copies (those are read by
threads of their own, and every counted frame before the function landed before it ran).

Frames go out in the order they are counted: one lock covers picking copies and sending them.

Over TLS a connection carries what one CPU encrypts (~1.6 GB/s on an H200 host), so a process may attach
more connections beside its callback connection (gpDeliveryAttach; "outlets" here). A copy of
PIECES_FROM bytes or more then goes as pieces (`_wire.COPY_PIECE`: the copy id, the piece's offset) on
the callback connection and every outlet at once, each piece a counted frame; the client's readers land
them in parallel and the copy is done when all its bytes are in. Each piece names how many frames went
before its copy, and the client lands it only once as many have landed, so copies into the same memory
land in their order; a whole copy sent after pieces has COPIES_SENT ahead of it for the same reason. A
piece whose outlet is gone goes again on the callback connection, and that outlet is dropped.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from virtualize.common import _wire
from virtualize.server._executor import CudaError, StagedCopy

log = logging.getLogger("gpupool.worker")

PIECES_FROM = 2 << 20  # copies from this size go in pieces across the outlets
PIECE_LEAST = 1 << 20  # and no piece is smaller than this (each costs a frame and a wake-up)
BATCH_FRAMES = 64  # copies done together go out in one send, at most so many (3 pieces each: under IOV_MAX)
MAX_OUTLETS = 9  # the callback connection and at most 8 delivery connections (the shim's GP_MAX_LANES)


@dataclass
class _Copy:
    ident: int  # the client's id of the copy
    staged: StagedCopy | None  # None: it failed before it was queued
    error: int = 0


class Deliveries:
    """One client process's copies in flight. `send(*parts) -> bool` writes a frame on its callback
    connection (False once that is gone); `outlet` is held by whoever uses that connection for a host
    function, from sending its id until its answer. Thread-safe."""

    def __init__(self, send: Callable[..., bool], outlet: threading.Lock) -> None:
        self._send = send
        self._outlet = outlet
        self._queue: deque[_Copy] = deque()
        self._changed = threading.Condition()
        self._sending = threading.Lock()  # held from picking copies until their frames are out
        self.sent = 0  # frames sent on the callback connection (the client counts those it has landed)
        self._closed = False
        self._thread: threading.Thread | None = None
        self._outlets: list[Callable[..., bool]] = []  # the delivery connections' senders
        self._senders: ThreadPoolExecutor | None = None  # one thread per outlet, sending pieces
        self._pieces_landing = False  # the last copy went in pieces: a whole one after it says COPIES_SENT

    def all_told(self, told: int) -> bool:
        """Nothing queued or being sent, and the client told of every frame sent (`told`: the count of its
        last COPIES_SENT): a reply then needs nothing ahead of it, so the worker's native loop may answer
        calls. It stays so while the loop serves: the one call that queues a copy is the Python path's."""
        with self._changed:
            return not self._queue and not self._sending.locked() and self.sent == told

    def has_outlets(self) -> bool:
        return bool(self._outlets)

    def add_outlet(self, send: Callable[..., bool]) -> None:
        """One more connection for pieces of large copies (gpDeliveryAttach)."""
        with self._changed:
            if not self._closed:
                self._outlets.append(send)

    def add(self, ident: int, staged: StagedCopy) -> None:
        self._push(_Copy(ident, staged))
        if staged.transient:  # its bytes are the device's own: out before another call can change them
            self.flush()  # (only executors whose streams run at once make these: no host function is out)

    def failed(self, ident: int, error: int) -> None:
        """A copy refused before it was queued: the client hears of it too, so it stops waiting."""
        self._push(_Copy(ident, None, error))

    def _push(self, copy: _Copy) -> None:
        with self._changed:
            if self._closed:  # the client is gone: its buffer goes back
                if copy.staged is not None:
                    copy.staged.release()
                return
            self._queue.append(copy)
            self._changed.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="gpupool-deliveries", daemon=True)
                self._thread.start()

    def flush(
        self, wait: bool = False, inline: Callable[..., None] | None = None, quick: bool = False
    ) -> int:
        """Send every copy that is done by now (`wait`: every copy queued, once it is done) on the
        callback connection — or, given `inline` (a reply's connection) while a host function is out, on
        that. Returns how many frames the callback connection has carried, for the client to wait for.
        `quick` (the delivery thread's own rounds, which nothing waits on): a copy behind one of its stream
        that is not done is left for the next round unasked."""
        if wait:
            for copy in list(self._queue):
                if copy.staged is not None:
                    copy.staged.wait()
        if self._outlet.acquire(blocking=inline is None):
            try:
                return self._send_done(None, quick)
            finally:
                self._outlet.release()
        self._send_done(inline, quick)
        return self.sent

    def send_done(self) -> int:
        """`flush` on the callback connection, by a caller that holds `outlet`."""
        return self._send_done(None)

    def _send_done(self, inline: Callable[..., None] | None, quick: bool = False) -> int:
        with self._sending:
            while True:
                with self._changed:
                    done = self._done_now(quick)
                    for c in done:
                        self._queue.remove(c)
                if not done:
                    return self.sent
                if inline is not None and self._outlets:
                    # pieces sent before may still be landing on the delivery connections: a copy here must
                    # not land under them (a later copy into the same memory keeps its bytes, as natively)
                    count = _wire.COPIES_COUNT.pack(self.sent)
                    inline(_wire.REPLY.pack(_wire.COPIES_SENT, len(count), 0), count)
                batch: list[tuple[tuple, _Copy]] = []
                for c in done:
                    self._deliver(c, inline, batch)
                self._send_batch(batch)

    def _done_now(self, quick: bool) -> list[_Copy]:
        """The queued copies that are done by now (under `_changed`). `quick`: a copy behind one of its own
        stream that is not done is not asked (with 16 copies in flight on one stream, one question a round,
        not 16). Only where nothing waits on the answer: a stream's handle can be another stream's after a
        destroy, so a reply's round asks every copy."""
        done, waiting = [], set()
        for c in self._queue:
            order = None if c.staged is None or not quick else c.staged.order
            if order is not None and order in waiting:
                continue
            if c.staged is None or c.staged.ready():
                done.append(c)
            elif order is not None:
                waiting.add(order)
        return done

    def _deliver(self, copy: _Copy, inline: Callable[..., None] | None, batch: list) -> None:
        """One frame (under `_sending`): the bytes, or the error the copy met. A whole copy for the
        callback connection joins `batch`, sent with the copies done with it (`_send_batch`)."""
        error, data = copy.error, b""
        if copy.staged is not None:
            try:
                data = copy.staged.view()
            except CudaError as exc:
                error = exc.code
        batched = False
        try:
            if inline is None and not error and self._outlets and len(data) >= PIECES_FROM:
                self._send_batch(batch)  # the copies before it land first
                self._deliver_pieces(copy.ident, memoryview(data))
                return
            if inline is None and self._pieces_landing:  # the pieces sent before land first (their order)
                count = _wire.COPIES_COUNT.pack(self.sent)
                if not self._send(_wire.REPLY.pack(_wire.COPIES_SENT, len(count), 0), count):
                    self.close()
                    return
                self._pieces_landing = False
            head = _wire.COPY_HEAD.pack(copy.ident, error, 0)
            frame = (_wire.REPLY.pack(_wire.COPY_DATA, len(head), len(data)), head, data)
            if inline is not None:
                inline(*frame)
                return
            batch.append((frame, copy))
            batched = True
            if len(batch) >= BATCH_FRAMES:
                self._send_batch(batch)
        finally:
            if copy.staged is not None and not batched:
                copy.staged.release()

    def _send_batch(self, batch: list[tuple[tuple, _Copy]]) -> None:
        """The batched copies' frames in one send (over TLS one flush: the client wakes once for them),
        each counted; their buffers go back once the frames are out."""
        if not batch:
            return
        try:
            if not self._send(*(part for frame, _ in batch for part in frame)):
                self.close()  # the client's process is gone
            self.sent += len(batch)
        finally:
            for _, copy in batch:
                if copy.staged is not None:
                    copy.staged.release()
            batch.clear()

    def _deliver_pieces(self, ident: int, data: memoryview) -> None:
        """One copy as pieces on the callback connection and the outlets at once (under `_sending`); each
        counted once it is out, so a reply's count never runs ahead of bytes still being sent."""
        outlets = [self._send, *self._outlets]
        n = max(1, min(len(outlets), len(data) // PIECE_LEAST))
        size = -(-len(data) // n)
        pieces = [(at, data[at : at + size]) for at in range(0, len(data), size)]

        before = self.sent
        self._pieces_landing = True

        def frame(at: int, piece: memoryview) -> tuple:
            head = _wire.COPY_PIECE_HEAD.pack(ident, at, len(data), before)
            return _wire.REPLY.pack(_wire.COPY_PIECE, len(head), len(piece)), head, piece

        if self._senders is None:
            self._senders = ThreadPoolExecutor(max_workers=MAX_OUTLETS, thread_name_prefix="gpupool-pieces")
        sent = [self._senders.submit(send, *frame(*p)) for send, p in zip(outlets, pieces, strict=False)]
        for send, p, future in zip(outlets, pieces, sent, strict=False):
            if future.result():
                self.sent += 1
                continue
            if send is self._send:  # the callback connection: the client's process is gone
                self.close()
                return
            with self._changed:  # that connection is gone: its piece again on the callback connection
                if send in self._outlets:
                    self._outlets.remove(send)
            if not self._send(*frame(*p)):
                self.close()
                return
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
                self.flush(quick=True)
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
        if self._senders is not None:
            self._senders.shutdown(wait=False)
