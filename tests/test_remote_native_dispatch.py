"""The worker's native loop (virtualize/server/native/dispatch.c): what it serves itself, and what it leaves to
the Python path, at the socket level; and a whole program answered the same with it and without it.

The socket-level tests drive the loop as the worker does (a real socket pair, the worker's `Channel`;
plain, and encrypted through the worker's TLS in C against Python's ssl as the client) with a recording
executor at the executor seam, so each test sees exactly which calls ran in C. The program-level test
runs tests/remote_client.py through the shim against a host-executor worker with the loop on and off,
in plaintext and over TLS.
"""

from __future__ import annotations

import ctypes
import os
import re
import socket
import ssl
import struct
import threading
import time
from types import SimpleNamespace

import pytest
import remote_helpers
from remote_helpers import client_env, needs_cc, run_client

from server.workers import WorkerDevice, start_worker
from virtualize.common import _wire
from virtualize.common._calls import CALL_IDS, CALLS
from virtualize.common._results import CUresult
from virtualize.server import _data_tls, _native_dispatch, _native_tls
from virtualize.server._executor import CopiedBytes, CudaError, SharedHostMemory
from virtualize.server._executor_guard import Allocation, LeaseState
from virtualize.server._handles import Translated
from virtualize.server.worker import Channel

shim_dir = remote_helpers.shim_dir  # fixture
BY_SYMBOL = {c.symbol if c.symbol != "-" else c.name: c for c in CALLS}  # internal calls by name
STREAM, EVENT, FUNC, OTHER_FUNC, CAPTURING, GRAPH_EXEC = 0x5000, 0x6000, 0xF00, 0xF08, 0x5008, 0x7000
ELAPSED_MS = 1.5  # what the recording executor says of any two events
PINNED = 0x7F0000000000  # the client's address of its page-locked allocation shared with the worker
LAYOUT = [(0, 8), (8, 4)]  # a pointer and a u32: 12 bytes of parameters

pytestmark = pytest.mark.needs("native")


class Recorder:
    """The executor seam: records what reaches it; a launch whose u32 parameter is 700 fails."""

    name = "recording"

    def __init__(self) -> None:
        self.ran: list[tuple] = []

    def launch(self, launch) -> None:
        self.ran.append(
            ("launch", launch.func, launch.grid, launch.block, launch.stream, bytes(launch.params))
        )
        if struct.unpack_from("<I", launch.params, 8)[0] == 700:
            raise CudaError(700, "illegal address")

    def copy_to_device(self, dst, count, stream, fill) -> None:
        data = bytearray(count)
        fill(memoryview(data))
        self.ran.append(("htod", dst, bytes(data), stream))

    def copy_from_device(self, src, count, stream, send) -> None:
        self.ran.append(("dtoh", src, count, stream))
        send(memoryview(bytes(i % 251 for i in range(count))))

    def cuStreamIsCapturing(self, stream) -> int:
        return int(stream == CAPTURING)

    def cuEventElapsedTime(self, start, end) -> float:
        self.ran.append(("cuEventElapsedTime", start, end))
        return ELAPSED_MS

    def cuEventCreate(self, flags) -> int:
        self.ran.append(("cuEventCreate", flags))
        return 0xE000 + len(self.ran)  # a handle of its own, the same on both paths

    # The client's page-locked memory shared with the worker (gpPinnedShare), as the host executor's.
    def shared_host_memory(self, size: int) -> SharedHostMemory:
        return SharedHostMemory(size)

    def release_shared_host_memory(self, shared: SharedHostMemory) -> None:
        shared.close()

    def copy_in_from(self, dst, shared, offset, count, stream, last) -> None:
        self.ran.append(("pinned_in", dst, bytes(shared.view[offset : offset + count]), stream, last))

    def copy_out_into(self, shared, offset, src, count, stream) -> CopiedBytes:
        shared.view[offset : offset + count] = bytes(i % 251 for i in range(count))
        self.ran.append(("pinned_out", src, offset, count, stream))
        return CopiedBytes(b"")

    def copy_out_piece(self, shared, offset, src, count, stream) -> None:
        shared.view[offset : offset + count] = bytes((src + i) % 251 for i in range(count))
        self.ran.append(("shared_out", src, offset, count, stream))

    def memset(self, dst, value, element_size, count, stream) -> None:
        self.ran.append(("memset", dst, value, element_size, count, stream))

    def __getattr__(self, name):
        if not name.startswith("cu"):
            raise AttributeError(name)
        return lambda *args: self.ran.append((name, *args))


def frame(symbol: str, *args, bulk: bytes = b"", flags: int = 0) -> bytes:
    call = BY_SYMBOL[symbol]
    packed = call.in_struct.pack(*args)
    return _wire.REQUEST.pack(CALL_IDS[call], flags, len(packed), 0, len(bulk)) + packed + bulk


def launch(func: int, stream: int, word: int, block: int = 64) -> bytes:
    params = struct.pack("<QI", 0x1000, word)
    return frame("cuLaunchKernelEx", func, 1, 1, 1, block, 1, 1, 0, stream, 0, bulk=params)


def sync(symbol: str, *args) -> bytes:
    return frame(symbol, *args, flags=_wire.FLAG_WANTS_REPLY)


def python_frame() -> bytes:
    """A frame the loop never serves (a device count): it ends a batch."""
    return frame("cuDeviceGetCount", flags=_wire.FLAG_WANTS_REPLY)


def encrypted_pair(state_dir) -> tuple[ssl.SSLSocket, _native_tls.NativeTlsStream]:
    """A socket pair with TLS 1.3 on it: the worker's end in C, the client's Python's ssl."""
    _data_tls.server_context(state_dir, "test")
    context = _native_tls.server_context(state_dir)
    assert context is not None, "libssl did not load"
    raw_client, raw_served = socket.socketpair()
    accepted = {}
    thread = threading.Thread(
        target=lambda: accepted.setdefault("stream", _native_tls.NativeTlsStream(context, raw_served, 10.0))
    )
    thread.start()
    client_context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_context.check_hostname, client_context.verify_mode = False, ssl.CERT_NONE
    client = client_context.wrap_socket(raw_client)
    thread.join(10)
    accepted["stream"].settimeout(None)
    return client, accepted["stream"]


@pytest.fixture(params=["plain", "tls"])
def loop(request, tmp_path):
    lease = LeaseState([1 << 30])
    executor = Recorder()
    translated = Translated(executor)  # as the worker has it: the client's values, mapped after a move
    native = _native_dispatch.for_worker(lease, translated)
    lease.handles["stream"].update({STREAM, CAPTURING})
    lease.handles["event"].add(EVENT)
    lease.handles["func"].update({FUNC, OTHER_FUNC})
    native.learn(FUNC, LAYOUT)
    client, served = socket.socketpair() if request.param == "plain" else encrypted_pair(tmp_path)
    channel = Channel(served)
    session = SimpleNamespace(
        pending=0, callbacks=None, calls=0, ctx=0, shared_error=0, _send_kernel_output=lambda: None
    )
    native_session = native.session()

    def serve(*frames: bytes) -> bytes:
        """Send the frames and a last one only Python serves; serve until Python's turn; return the
        header Python reads next, and skip what is left (the batches stay apart)."""
        sent = b"".join(frames) + python_frame()
        before = channel.start  # small batches: the 1 MiB buffer is never compacted here
        client.sendall(sent)
        native_session.serve(channel, session, touch=lambda: None)
        at = channel.start - before
        header = channel.read_exact(_wire.REQUEST.size)
        channel.read_exact(len(sent) - at - _wire.REQUEST.size)
        return header

    yield SimpleNamespace(
        lease=lease, executor=executor, native=native, client=client, channel=channel, session=session,
        serve=serve, native_session=native_session, translated=translated,
    )  # fmt: skip
    native_session.close()
    client.close()
    served.close()


def recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        got = sock.recv(n - len(data))
        assert got, "the worker closed the connection"
        data += got
    return data


def reply(sock: socket.socket) -> int:
    return _wire.REPLY.unpack(recv_exact(sock, _wire.REPLY.size))[0]


def call_id_of(header: bytes) -> int:
    return _wire.REQUEST.unpack(header)[0]


def test_a_known_kernel_and_events_run_in_c_and_the_first_unknown_frame_waits_for_python(loop):
    unknown = launch(0xBAD, STREAM, 1)
    header = loop.serve(
        launch(FUNC, STREAM, 1, block=128),
        frame("cuEventRecord", EVENT, STREAM),
        frame("cuStreamWaitEvent", 2, EVENT, 0),
        unknown,
        launch(FUNC, STREAM, 2),  # after Python's frame: not run yet
    )
    assert loop.executor.ran == [
        ("launch", FUNC, (1, 1, 1), (128, 1, 1), STREAM, struct.pack("<QI", 0x1000, 1)),
        ("cuEventRecord", EVENT, STREAM),
        ("cuStreamWaitEvent", 2, EVENT, 0),
    ]
    assert header == unknown[: _wire.REQUEST.size]  # untouched, for the Python path to refuse
    assert loop.session.calls == 3


def test_a_function_python_has_not_launched_goes_to_python_and_a_short_parameter_block_is_padded(loop):
    """A function the Python path never launched is left to it; a parameter block shorter than a known
    function's layout (an `extra` buffer) runs here with the missing bytes zero, as on the Python path."""
    header = loop.serve(launch(OTHER_FUNC, STREAM, 1))  # a handle of the lease, never launched
    assert call_id_of(header) == CALL_IDS[BY_SYMBOL["cuLaunchKernelEx"]] and loop.executor.ran == []
    short = frame("cuLaunchKernelEx", FUNC, 1, 1, 1, 1, 1, 1, 0, STREAM, 0, bulk=b"\1" * 8)
    loop.serve(short)
    assert loop.executor.ran == [("launch", FUNC, (1, 1, 1), (1, 1, 1), STREAM, b"\1" * 8 + b"\0" * 4)]


def test_a_handle_the_guard_forgets_is_never_passed_to_the_driver_again(loop):
    loop.lease.handles["stream"].discard(STREAM)
    stale = launch(FUNC, STREAM, 1)
    assert loop.serve(stale) == stale[: _wire.REQUEST.size]
    loop.lease.handles["func"].discard(FUNC)  # its module unloaded
    again = launch(FUNC, 0, 1)
    assert loop.serve(again) == again[: _wire.REQUEST.size]
    loop.lease.handles["event"].clear()
    record = frame("cuEventRecord", EVENT, 0)
    assert loop.serve(record) == record[: _wire.REQUEST.size]
    assert loop.executor.ran == []


def test_synchronising_calls_are_answered_in_c_unless_an_error_is_owed_first(loop):
    loop.serve(sync("cuStreamSynchronize", STREAM), sync("cuEventQuery", EVENT), sync("cuCtxSynchronize"))
    assert [reply(loop.client) for _ in range(3)] == [0, 0, 0]
    assert [r[0] for r in loop.executor.ran] == ["cuStreamSynchronize", "cuEventQuery", "cuCtxSynchronize"]
    loop.executor.ran.clear()
    # A launch that fails: served in C, its error kept for Python's next synchronising call.
    owed = sync("cuStreamSynchronize", STREAM)
    assert loop.serve(launch(FUNC, STREAM, 700), launch(FUNC, STREAM, 1), owed) == owed[: _wire.REQUEST.size]
    assert loop.session.pending == 700
    assert [r[0] for r in loop.executor.ran] == ["launch", "launch"]  # the second still ran, as on a GPU


def test_small_copies_within_the_leases_memory_run_in_c_and_the_rest_goes_to_python(loop):
    loop.lease.add(Allocation(0x10000, 4096, 0, owned=True))
    data = bytes(range(256)) * 4
    outside = frame("cuMemcpyHtoD_v2", 0x10000 + 4000, 200, 0, bulk=bytes(200))  # past the allocation's end
    header = loop.serve(
        frame("cuMemcpyHtoDAsync_v2", 0x10000, len(data), STREAM, bulk=data),
        sync("cuMemcpyDtoH_v2", 0x10000 + 8, 64, 0),
        outside,
    )
    assert header == outside[: _wire.REQUEST.size]
    assert loop.executor.ran == [("htod", 0x10000, data, STREAM), ("dtoh", 0x10008, 64, None)]
    assert _wire.REPLY.unpack(recv_exact(loop.client, _wire.REPLY.size)) == (0, 0, 64)
    assert recv_exact(loop.client, 64) == bytes(range(64))
    loop.executor.ran.clear()
    on_capture = frame("cuMemcpyHtoDAsync_v2", 0x10000, 4, CAPTURING, bulk=b"1234")  # the guard spoils it
    assert loop.serve(on_capture) == on_capture[: _wire.REQUEST.size]
    loop.lease.remove(0x10000)  # freed: no longer the lease's
    freed = frame("cuMemcpyHtoD_v2", 0x10000, 4, 0, bulk=b"1234")
    assert loop.serve(freed) == freed[: _wire.REQUEST.size] and loop.executor.ran == []


def test_a_one_mib_copy_each_way_runs_in_c(loop):
    """Copies up to 1 MiB travel whole in one frame and are served in C, the copy to the host answered
    with its bytes; a larger one goes to Python's chunked path."""
    loop.lease.add(Allocation(0x100000, 4 << 20, 0, owned=True))
    data = bytes(i % 253 for i in range(1 << 20))
    larger = frame("cuMemcpyHtoD_v2", 0x100000, (1 << 20) + 1, 0, bulk=bytes((1 << 20) + 1))
    sent = (
        frame("cuMemcpyHtoD_v2", 0x100000, len(data), 0, bulk=data)
        + sync("cuMemcpyDtoH_v2", 0x100000, 1 << 20, STREAM)
        + larger
    )
    answer = {}
    # more than a socket buffer each way: the client sends and reads on threads of its own
    sender = threading.Thread(target=loop.client.sendall, args=(sent,))
    reader = threading.Thread(
        target=lambda: answer.update(reply=recv_exact(loop.client, _wire.REPLY.size + (1 << 20)))
    )
    sender.start(), reader.start()
    loop.native_session.serve(loop.channel, loop.session, touch=lambda: None)
    reader.join(30)
    assert loop.channel.read_exact(_wire.REQUEST.size) == larger[: _wire.REQUEST.size]
    loop.channel.read_exact(len(larger) - _wire.REQUEST.size)
    sender.join(30)
    assert loop.executor.ran == [("htod", 0x100000, data, None), ("dtoh", 0x100000, 1 << 20, None)]
    assert _wire.REPLY.unpack(answer["reply"][: _wire.REPLY.size]) == (0, 0, 1 << 20)
    assert answer["reply"][_wire.REPLY.size :] == bytes(i % 251 for i in range(1 << 20))


def test_graph_launches_and_elapsed_times_run_in_c_and_a_forgotten_graph_goes_to_python(loop):
    """cuGraphLaunch of the lease's executable graph is one unanswered frame served in C; an elapsed time
    is answered in C with the executor's milliseconds as the wire packs them; a graph the guard has
    forgotten (destroyed) is never launched from C."""
    loop.lease.handles["graphexec"].add(GRAPH_EXEC)
    loop.serve(frame("cuGraphLaunch", GRAPH_EXEC, STREAM), sync("cuEventElapsedTime_v2", EVENT, EVENT))
    assert loop.executor.ran == [("cuGraphLaunch", GRAPH_EXEC, STREAM), ("cuEventElapsedTime", EVENT, EVENT)]
    assert _wire.REPLY.unpack(recv_exact(loop.client, _wire.REPLY.size)) == (0, 4, 0)
    assert struct.unpack("<f", recv_exact(loop.client, 4)) == (ELAPSED_MS,)
    loop.lease.handles["graphexec"].discard(GRAPH_EXEC)
    stale = frame("cuGraphLaunch", GRAPH_EXEC, STREAM)
    assert loop.serve(stale) == stale[: _wire.REQUEST.size]
    assert len(loop.executor.ran) == 2


def test_after_a_move_c_serves_the_lease_again_with_the_targets_objects(loop):
    """After a live migration the client's stream, event, function and instantiated graph name new objects
    on the target: C serves the lease's frames again (none goes to the Python path) and hands the
    executor the new objects, as the Python path maps them; a copy names the new stream too."""
    loop.lease.handles["graphexec"].add(GRAPH_EXEC)
    loop.lease.add(Allocation(0x10000, 4096, 0, owned=True))
    targets = {"stream": (STREAM, 0x15000), "event": (EVENT, 0x16000), "func": (FUNC, 0x1F00),
               "graphexec": (GRAPH_EXEC, 0x17000)}  # fmt: skip
    loop.native.python_only()  # as a migration does, until the lease has moved
    for ns, (client, real) in targets.items():
        loop.translated.map.move(ns, client, real)
    loop.translated.generation += 1
    loop.native.moved()
    loop.serve(
        launch(FUNC, STREAM, 1),
        frame("cuEventRecord", EVENT, STREAM),
        frame("cuGraphLaunch", GRAPH_EXEC, 0),
        frame("cuMemcpyHtoDAsync_v2", 0x10000, 4, STREAM, bulk=b"abcd"),
        sync("cuStreamSynchronize", STREAM),
    )
    assert loop.executor.ran == [
        ("launch", 0x1F00, (1, 1, 1), (64, 1, 1), 0x15000, struct.pack("<QI", 0x1000, 1)),
        ("cuEventRecord", 0x16000, 0x15000),
        ("cuGraphLaunch", 0x17000, 0),
        ("htod", 0x10000, b"abcd", 0x15000),
        ("cuStreamSynchronize", 0x15000),
    ]
    assert loop.session.calls == 5  # every frame in C
    assert reply(loop.client) == 0


def test_settling_page_locked_memory_never_hands_the_driver_a_stream_or_context_the_program_destroyed(loop):
    """Copies into shared page-locked memory were queued on a stream (and in a context) the program then
    destroyed: settling the memory waits for the context's work instead of synchronising the stream, and for
    nothing when the context went too — the driver, given a destroyed handle, crashes the worker (a segfault
    in JAX's suite, at its page-locked memory's release)."""
    loop.lease.add(Allocation(0x10000, 4096, 0, owned=True))
    shared = loop.executor.shared_host_memory(4096)
    loop.native_session.pinned_add(PINNED, shared)
    loop.serve(frame("gpPinnedCopy", 0x10000, PINNED + 64, 32, STREAM, 0))  # to the host, queued on STREAM
    loop.lease.handles["stream"].discard(STREAM)  # cuStreamDestroy
    loop.executor.ran.clear()
    loop.native_session.pinned_settle(PINNED)
    assert loop.executor.ran == [("cuCtxSynchronize",)]
    ctx, stream = 0xC000, 0x5010
    loop.lease.handles["ctx"].add(ctx)
    loop.lease.handles["stream"].add(stream)
    loop.session.ctx = ctx
    loop.serve(frame("gpPinnedCopy", 0x10000, PINNED + 64, 32, stream, 0))
    assert loop.executor.ran[-1][0] == "pinned_out"  # queued in C, in that context
    loop.lease.handles["ctx"].discard(ctx)  # cuCtxDestroy: its copies went with it
    loop.executor.ran.clear()
    loop.native_session.pinned_drop(PINNED)
    assert loop.executor.ran == []
    shared.close()


def test_copies_through_shared_page_locked_memory_run_in_c_and_are_waited_for_before_it_is_read(loop):
    """gpPinnedCopy: a queued copy either way is one unanswered frame served in C, a synchronous one is
    answered once done; the copies queued into the memory are waited for (their stream synchronised,
    once) when the guard settles it or lets it go. A copy past the shared memory's end, one queued on a
    capturing stream, and any once the memory is no longer shared go to Python."""
    loop.lease.add(Allocation(0x10000, 4096, 0, owned=True))
    shared = loop.executor.shared_host_memory(4096)
    shared.view[:8] = b"12345678"
    loop.native_session.pinned_add(PINNED, shared)
    past_end = frame("gpPinnedCopy", 0x10000, PINNED + 4090, 16, STREAM, 0)
    header = loop.serve(
        frame("gpPinnedCopy", 0x10000, PINNED, 8, STREAM, 1),  # to the device, queued
        frame("gpPinnedCopy", 0x10000, PINNED + 64, 32, STREAM, 0),  # to the host, queued
        sync("gpPinnedCopy", 0x10000, PINNED, 8, 0, 3),  # to the device, synchronous
        past_end,
    )
    assert header == past_end[: _wire.REQUEST.size]
    assert loop.executor.ran == [
        ("pinned_in", 0x10000, b"12345678", STREAM, False),
        ("pinned_out", 0x10000, 64, 32, STREAM),
        ("pinned_in", 0x10000, b"12345678", None, True),
    ]
    assert reply(loop.client) == 0  # the synchronous one's only
    assert bytes(shared.view[64:96]) == bytes(range(32))
    loop.executor.ran.clear()
    loop.native_session.pinned_settle(PINNED)
    loop.native_session.pinned_settle(PINNED)  # nothing landing since
    assert loop.executor.ran == [("cuStreamSynchronize", STREAM)]
    on_capture = frame("gpPinnedCopy", 0x10000, PINNED + 64, 32, CAPTURING, 0)
    assert loop.serve(on_capture) == on_capture[: _wire.REQUEST.size]
    loop.native_session.pinned_drop(PINNED)
    gone = frame("gpPinnedCopy", 0x10000, PINNED, 8, STREAM, 1)
    assert loop.serve(gone) == gone[: _wire.REQUEST.size]
    assert loop.executor.ran == [("cuStreamSynchronize", STREAM)]
    shared.close()


def test_pieces_of_a_copy_through_the_connections_shared_memory_run_in_c_and_the_last_is_answered(loop):
    """gpShmHtoD on the worker's host: each piece of a copy to the device is copied from the shared
    memory in C, and only the copy's last piece is answered; once a piece has failed (the Python path
    keeps its error for the answer), the copy's later pieces go to Python, which answers with it. A
    piece past the shared memory's end goes to Python."""
    loop.lease.add(Allocation(0x10000, 8192, 0, owned=True))
    shared = loop.executor.shared_host_memory(8192)
    shared.view[:16] = bytes(range(16))
    loop.native_session.shared_set(shared)
    past_end = frame("gpShmHtoD", 0x10000, 16, STREAM, 8190, 2)
    header = loop.serve(
        frame("gpShmHtoD", 0x10000, 8, STREAM, 0, 2),  # a piece, on the stream
        frame("gpShmHtoD", 0x10008, 8, STREAM, 8, 3, flags=_wire.FLAG_WANTS_REPLY),  # the last
        past_end,
    )
    assert header == past_end[: _wire.REQUEST.size]
    assert loop.executor.ran == [
        ("pinned_in", 0x10000, bytes(range(8)), STREAM, False),
        ("pinned_in", 0x10008, bytes(range(8, 16)), STREAM, True),
    ]
    assert _wire.REPLY.unpack(recv_exact(loop.client, _wire.REPLY.size)) == (0, 0, 0)
    loop.session.shared_error = 700  # an earlier piece failed on the Python path
    piece = frame("gpShmHtoD", 0x10000, 8, 0, 0, 1, flags=_wire.FLAG_WANTS_REPLY)
    assert loop.serve(piece) == piece[: _wire.REQUEST.size]
    assert len(loop.executor.ran) == 2
    shared.close()


def test_a_loop_built_from_another_call_table_is_not_used(monkeypatch, caplog):
    """Its generated call ids and rules would be another table's: the worker serves every call in Python
    and says to rebuild."""
    monkeypatch.setattr(_native_dispatch, "_library", None)
    monkeypatch.setattr(_native_dispatch, "WIRE_VERSION", _native_dispatch.WIRE_VERSION ^ 1)
    with caplog.at_level("WARNING", logger="gpupool.worker"):
        assert _native_dispatch.for_worker(LeaseState([1 << 30]), Recorder()) is None
    assert "build_ext" in caplog.text


def test_a_synchronise_after_kernel_output_sends_the_output_first(loop):
    read, write = os.pipe()
    sent = []
    loop.session._send_kernel_output = lambda: sent.append(os.read(read, 100))
    _native_dispatch.watch_kernel_output(read)
    try:
        os.write(write, b"kernel says 1\n")
        loop.serve(sync("cuCtxSynchronize"))
    finally:
        _native_dispatch._load().gpf_output_watch(-1)
        os.close(read)
        os.close(write)
    assert sent == [b"kernel says 1\n"] and reply(loop.client) == 0


@needs_cc
def test_with_stats_on_each_connection_says_where_its_native_loop_spent_its_time(shim_dir, capfd):
    """GPUPOOL_WORKER_NATIVE_STATS=1: as a connection closes the worker logs how many frames its native loop
    served and how its time split between reading them and launching (and of a launch, the executor's call
    itself) — the 500 launches of a training-like
    loop over TLS among them (what the next profile of a worker across a step reads). The worker is stopped
    the moment its client has gone, as a pool server stops a released lease's: the lines are still written
    (a stopped worker lets connections that are closing finish)."""
    handle = start_worker(
        "stats", [WorkerDevice(0, "", 64 << 20)], bind_host="127.0.0.1",
        env={_native_dispatch.STATS_ENV: "1"}, executor="host",
    )  # fmt: skip
    pattern = re.compile(
        r"native loop of a connection: (\d+) frames served in ([\d.]+) s: ([\d.]+) s reading them .*?(\d+) reads\), "
        r"([\d.]+) s in (\d+) launches \(([\d.]+) µs each, ([\d.]+) µs of it in the executor's launch call\)"
    )
    try:
        run_client("native_dispatch", client_env(shim_dir, handle, GPUPOOL_DATA_ENCRYPTION="always"))
    finally:
        handle.stop()
    lines = pattern.findall(capfd.readouterr().err)
    assert lines, "no connection said where its loop's time went"
    frames, serve, read, reads, launch, launches, each, in_call = max(lines, key=lambda line: int(line[5]))
    assert int(launches) >= 490 and int(frames) >= int(launches) and int(reads) >= 1
    assert float(read) + float(launch) <= float(serve) + 0.002
    assert 0 < float(in_call) <= float(each)  # the executor's call, apart from the loop's checks around it


@needs_cc
@pytest.mark.parametrize("encryption", ["never", "always"])
def test_a_program_gets_the_same_answers_with_the_native_loop_and_without(shim_dir, encryption):
    outputs = {}
    for native in ("1", "0"):  # over TLS: the loop and TLS in C, or both in Python
        handle = start_worker(
            "native", [WorkerDevice(0, "", 64 << 20)], bind_host="127.0.0.1",
            env={_native_dispatch.ENV: native}, executor="host",
        )  # fmt: skip
        try:
            env = client_env(shim_dir, handle, GPUPOOL_DATA_ENCRYPTION=encryption)
            outputs[native], _ = run_client("native_dispatch", env)
        finally:
            handle.stop()
    assert outputs["1"] == outputs["0"]
    assert outputs["1"] == {
        "event_query_250": "0",
        "event_sync_250": "0",
        "event_query_500": "0",
        "event_sync_500": "0",
        "stream_sync": "0",
        "stream_query": "0",
        "last_launch_wrote": "500 500",
        "wild_launch": "0",
        "sync_after_wild": "700",  # CUDA_ERROR_ILLEGAL_ADDRESS at the next synchronise
        "sync_again": "0",
        "launch_on_destroyed_stream": "0",
        "sync_after_destroyed_stream": "400",  # CUDA_ERROR_INVALID_HANDLE
        "query_destroyed_stream": "400",
        "query_destroyed_event": "400",
        "record_destroyed_event": "0",
        "sync_after_destroyed_event": "400",
        "kernel": "says 2",
        "printed": "after sync",
    }


@needs_cc
@pytest.mark.parametrize("encryption", ["never", "always"])
def test_a_process_with_a_callback_connection_is_answered_by_the_native_loop_between_its_copies(
    shim_dir, capfd, encryption
):
    """Across hosts a copy into page-locked memory opens the process's callback connection, and every call
    that wanted an answer then went through the worker's Python path (~70 µs a call on an H200 host, against
    ~8 in the native loop) for the rest of the process. Now the native loop answers while no copy is in flight
    or untold, and Python still answers, with the copies' bytes ahead, while one is: each copy's bytes are in
    place at its stream's synchronise, and the 300 event synchronises between the copies are served in C."""
    handle = start_worker(
        "answers", [WorkerDevice(0, "", 64 << 20)], bind_host="127.0.0.1",
        env={_native_dispatch.STATS_ENV: "1"}, executor="host",
    )  # fmt: skip
    try:
        env = client_env(shim_dir, handle, GPUPOOL_DATA_ENCRYPTION=encryption)
        env.pop(_wire.ENV_LOCAL, None)  # across hosts: the copies' bytes through the callback connection
        out, err = run_client("answered_beside_copies", env)
    finally:
        handle.stop()
    assert out == {"wrong": "0", "failed": "0"}, err
    served = re.findall(r"native loop of a connection: (\d+) frames served", capfd.readouterr().err)
    assert served and max(map(int, served)) >= 800, (
        served
    )  # 300 memsets, records and synchronises, nearly all


def test_events_the_native_loop_makes_and_destroys_are_the_ones_python_calls_name(shim_dir, capfd):
    """The native loop makes and destroys named events itself (no trip through the worker's Python path,
    which a loop that makes events as it goes would wait behind); a call Python serves afterwards (a graph's
    event-record node) names the same event, and a destroyed one is named by no call, served or not."""
    handle = start_worker(
        "events", [WorkerDevice(0, "", 64 << 20)], bind_host="127.0.0.1",
        env={_native_dispatch.STATS_ENV: "1"}, executor="host",
    )  # fmt: skip
    try:
        out, err = run_client("events_made_in_c", client_env(shim_dir, handle))
    finally:
        handle.stop()
    assert out == {
        "short_lived": "True",
        "node": "0",
        "node_event": "True",
        "synchronised": "0",
        "query_after": str(int(CUresult.INVALID_HANDLE)),
        "node_after": str(int(CUresult.INVALID_HANDLE)),
    }, err
    # the 50 short-lived events' making, record, synchronise and destroy: all served in C
    served = re.findall(r"native loop of a connection: (\d+) frames served", capfd.readouterr().err)
    assert served and max(map(int, served)) >= 200, served


def test_a_copys_mark_is_waited_for_in_c_until_its_stream_writes_it_or_the_time_is_up():
    """The delivery thread waits for a copy's mark (the word its stream writes into page-locked memory after
    the copy) in C, with no driver call and the GIL let go (_cuda._InFlight.wait): the wait ends once the word
    holds the copy's value, written from another thread meanwhile — not at an older value — and reports a
    word that never comes after its time, so the driver can be asked why."""
    wait = _native_dispatch.word_waiter()
    assert wait is not None  # the loop is built wherever the worker runs (setup.py)
    word = ctypes.c_uint32(6)
    address = ctypes.addressof(word)
    assert wait(address, 6, 1_000_000)
    assert not wait(address, 7, 5_000_000)  # 5 ms, nobody writes it

    def stream_writes() -> None:
        time.sleep(0.05)
        word.value = 8  # an older mark first: the wait goes on
        time.sleep(0.05)
        word.value = 9

    writer = threading.Thread(target=stream_writes)
    started = time.monotonic()
    writer.start()
    assert wait(address, 9, 5_000_000_000)
    waited = time.monotonic() - started
    writer.join()
    assert word.value == 9 and waited >= 0.09  # it waited for the write, did not return on the older one
