"""Which connection a copy to the client's page-locked memory travels on (virtualize/server/_deliveries.py),
with a staged copy the test finishes by hand: the callback connection, counted, unless a host function
is out there; then ahead of the reply, on the process's own connection."""

from __future__ import annotations

import threading

from virtualize.common import _wire
from virtualize.server._deliveries import Deliveries
from virtualize.server._executor import StagedCopy


class Staged(StagedCopy):
    """A copy the test says is done (the worker's delivery thread waits for it meanwhile)."""

    def __init__(self, data: bytes, order: object = None) -> None:
        self.data, self.done, self.released = data, threading.Event(), False
        self.order, self.asked = order, 0

    def ready(self) -> bool:
        self.asked += 1
        return self.done.is_set()

    def wait(self) -> None:
        self.done.wait()

    def view(self) -> memoryview:
        return memoryview(self.data)

    def release(self) -> None:
        self.released = True


def frames(sent: list[bytes]) -> list[tuple[int, bytes]]:
    """(copy id, bytes) of each COPY_DATA frame written, one or several frames a send."""
    out = []
    for written in sent:
        at = 0
        while at < len(written):
            result, outs_len, bulk_len = _wire.REPLY.unpack_from(written, at)
            assert result == _wire.COPY_DATA
            ident, error, _ = _wire.COPY_HEAD.unpack_from(written, at + _wire.REPLY.size)
            assert error == 0
            start = at + _wire.REPLY.size + outs_len
            out.append((ident, written[start : start + bulk_len]))
            at = start + bulk_len
    return out


def test_a_copy_goes_once_it_is_done_and_the_count_covers_it():
    callback, outlet = [], threading.Lock()
    deliveries = Deliveries(lambda *parts: callback.append(b"".join(map(bytes, parts))) or True, outlet)
    first, second = Staged(b"one"), Staged(b"two")
    deliveries.add(1, first)
    deliveries.add(2, second)
    second.done.set()  # a later copy on another stream finishes first
    assert deliveries.flush() == 1
    assert frames(callback) == [(2, b"two")] and second.released and not first.released
    first.done.set()
    assert deliveries.flush(wait=True) == 2
    assert frames(callback) == [(2, b"two"), (1, b"one")]
    deliveries.close()


def test_copies_done_together_go_in_one_send_whole_in_order_and_each_counted():
    """A data loader's batches finish together: their frames go out in one send (over TLS one flush, so
    the client wakes once), each frame whole and in the order of the queue, each counted for the replies'
    COPIES_SENT, and no copy's buffer goes back before its bytes are out."""
    sends, outlet = [], threading.Lock()
    staged = [Staged(bytes([k]) * (1000 + k)) for k in range(5)]

    def send(*parts):
        assert not any(s.released for s in staged)  # the bytes are still the copy's while they go out
        sends.append(b"".join(map(bytes, parts)))
        return True

    deliveries = Deliveries(send, outlet)
    with outlet:  # the delivery thread waits: all five are done before anything is sent
        for k, copy in enumerate(staged):
            copy.done.set()
            deliveries.add(10 + k, copy)
        assert deliveries.send_done() == 5
    assert len(sends) == 1
    assert frames(sends) == [(10 + k, bytes([k]) * (1000 + k)) for k in range(5)]
    assert all(s.released for s in staged)
    deliveries.close()


def test_the_delivery_thread_asks_one_copy_a_stream_and_a_reply_asks_every_copy():
    """Copies on one stream finish in order: the delivery thread's round asks only the first that is not
    done (each question costs the driver a context switch and a query), while a round before a reply asks
    every copy, since a stream's handle may name a newer stream after a destroy, whose copy is done."""
    callback, outlet = [], threading.Lock()
    deliveries = Deliveries(lambda *parts: callback.append(b"".join(map(bytes, parts))) or True, outlet)
    queued = [Staged(bytes([k]), order=5) for k in range(4)]
    with outlet:  # the delivery thread's own rounds wait: this test makes them
        for k, copy in enumerate(queued):
            deliveries.add(k, copy)
        queued[3].done.set()  # the stream's handle now names a newer stream: its copy is done
        asked = [c.asked for c in queued]
        deliveries._send_done(None, quick=True)
        assert [c.asked - a for c, a in zip(queued, asked, strict=True)] == [1, 0, 0, 0] and callback == []
        assert deliveries.send_done() == 1  # before a reply: every copy asked, the done one sent
        assert frames(callback) == [(3, bytes([3]))]
    for copy in queued[:3]:
        copy.done.set()
    assert deliveries.flush(wait=True) == 4
    deliveries.close()


def test_while_a_host_function_is_out_copies_go_ahead_of_the_reply_uncounted():
    callback, reply, outlet = [], [], threading.Lock()
    deliveries = Deliveries(lambda *parts: callback.append(b"".join(map(bytes, parts))) or True, outlet)
    staged = Staged(b"bytes")
    staged.done.set()
    with outlet:  # a host function's id was sent; its answer is awaited
        deliveries.add(7, staged)
        sent = deliveries.flush(inline=lambda *parts: reply.append(b"".join(map(bytes, parts))))
    assert sent == 0 and callback == []  # nothing the client's callback thread could be stuck behind
    assert frames(reply) == [(7, b"bytes")]
    deliveries.close()


def test_a_copy_ahead_of_a_reply_lands_after_the_pieces_sent_before_it():
    """Pieces of a large copy go on the delivery connections, landed by threads of their own; a later copy
    sent ahead of a reply (a host function is out) must not land before them, or their bytes would cover
    its own where both copies wrote the same memory: the reply's connection says first how many frames to
    wait for."""
    callback, outlet_frames, reply, outlet = [], [], [], threading.Lock()
    deliveries = Deliveries(lambda *parts: callback.append(b"".join(map(bytes, parts))) or True, outlet)
    deliveries.add_outlet(lambda *parts: outlet_frames.append(b"".join(map(bytes, parts))) or True)
    large, small = Staged(bytes(4 << 20)), Staged(b"later")
    large.done.set()
    deliveries.add(1, large)
    assert deliveries.flush(wait=True) == 2  # two pieces: the callback connection's and the outlet's
    small.done.set()
    with outlet:  # a host function is out
        deliveries.add(2, small)
        deliveries.flush(inline=lambda *parts: reply.append(b"".join(map(bytes, parts))))
    kinds = [_wire.REPLY.unpack_from(frame)[0] for frame in reply]
    assert kinds == [_wire.COPIES_SENT, _wire.COPY_DATA]
    assert _wire.COPIES_COUNT.unpack_from(reply[0], _wire.REPLY.size) == (2,)
    assert frames(reply[1:]) == [(2, b"later")]
    deliveries.close()
