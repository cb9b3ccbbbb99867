"""The worker's cost per frame, native loop vs Python path: python bench/bench_native_frames.py  (< 1 min, no GPU)

Sends the same run of frames of one call over a socket pair to the worker's connection code (the
worker's own `Channel`, `Session` and `_native_dispatch.NativeSession`), once served by the native loop
(dispatch.c) and once by the Python guard (`Session.dispatch`, as with GPUPOOL_WORKER_NATIVE=0), and
prints the worker's time per frame for each. The executor does nothing (every call returns at once),
so the numbers are the worker's dispatch alone — what each remote call costs on top of the driver's
own work. Without a driver the loop calls back into Python for the work (ctypes), as the host executor
does; on a GPU server C calls the driver directly: the third column is the loop with C functions that
do nothing in the driver's place (compiled here with `cc`), the loop's own cost as on a GPU server.

Calls measured: an asynchronous gpPinnedCopy of 64 KiB into the client's shared page-locked memory
(issue 31's data loader), cuGraphLaunch, cuEventRecord, cuEventElapsedTime (answered), a synchronous
64 KiB cuMemcpyHtoD (its bytes in the frame), cuMemsetD32Async, the elapsed times of 400 event pairs in
one frame (gpEventElapsedMany, what a benchmark harness's 200 elapsed times cost now), a synchronous 1 MiB copy to the
host through the memory the connection shares with its process (gpShmDtoH: two 512 KiB pieces, each
answered; the bytes themselves not copied by this executor), and an event named by the shim then destroyed
(gpEventCreateNamed + cuEventDestroy_v2: what PyTorch's graphed callables cost the worker per event; the
executor behind the worker's handle map, `Translated`, as in a worker).
"""

from __future__ import annotations

import argparse
import ctypes
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from virtualize.common import _wire  # noqa: E402
from virtualize.common._calls import CALL_IDS, CALLS  # noqa: E402
from virtualize.server import _native_dispatch  # noqa: E402
from virtualize.server._executor import CopiedBytes, SharedHostMemory  # noqa: E402
from virtualize.server._executor_guard import Allocation, LeaseState, Session  # noqa: E402
from virtualize.server._handles import Translated  # noqa: E402
from virtualize.server.worker import Channel  # noqa: E402

BY_NAME = {c.symbol if c.symbol != "-" else c.name: c for c in CALLS}
STREAM, EVENT, GRAPH_EXEC, BASE, PINNED = 0x5000, 0x6000, 0x7000, 0x10000, 0x7F0000000000
COPY = 64 << 10


class IdleExecutor:
    """Every call returns at once: the worker's dispatch is all that is measured."""

    name = "idle"

    def copy_to_device(self, dst, count, stream, fill) -> None:
        fill(memoryview(bytearray(count)))

    def copy_in_from(self, dst, shared, offset, count, stream, last) -> None:
        return None

    def copy_out_into(self, shared, offset, src, count, stream) -> CopiedBytes:
        return CopiedBytes(b"")

    def copy_out_piece(self, shared, offset, src, count, stream) -> None:
        return None

    def memset(self, dst, value, element_size, count, stream) -> None:
        return None

    def shared_host_memory(self, size: int) -> SharedHostMemory:
        return SharedHostMemory(size)

    def cuStreamIsCapturing(self, stream) -> int:
        return 0

    def cuEventElapsedTime(self, start, end) -> float:
        return 0.5

    def cuEventCreate(self, flags) -> int:
        self.events = getattr(self, "events", EVENT + 1) + 1
        return self.events

    def __getattr__(self, name):
        if not name.startswith("cu"):
            raise AttributeError(name)
        return lambda *args: None


def frame(name: str, *args, bulk: bytes = b"", flags: int = 0) -> bytes:
    call = BY_NAME[name]
    packed = call.in_struct.pack(*args)
    return _wire.REQUEST.pack(CALL_IDS[call], flags, len(packed), 0, len(bulk)) + packed + bulk


FRAMES = {
    "gpPinnedCopy, 64 KiB to the host, queued": frame("gpPinnedCopy", BASE, PINNED, COPY, STREAM, 0),
    "cuGraphLaunch": frame("cuGraphLaunch", GRAPH_EXEC, STREAM),
    "cuEventRecord": frame("cuEventRecord", EVENT, STREAM),
    "cuEventElapsedTime (answered)": frame(
        "cuEventElapsedTime_v2", EVENT, EVENT, flags=_wire.FLAG_WANTS_REPLY
    ),
    "cuMemcpyHtoD, 64 KiB in the frame": frame("cuMemcpyHtoD_v2", BASE, COPY, 0, bulk=bytes(COPY)),
    "cuMemsetD32Async": frame("cuMemsetD32Async", BASE, 7, COPY // 4, STREAM),
    "gpEventElapsedMany, 400 pairs (answered)": frame(
        "gpEventElapsedMany",
        400,
        bulk=_wire.EVENT_PAIR.pack(EVENT, EVENT) * 400,
        flags=_wire.FLAG_WANTS_REPLY,
    ),
    "gpShmDtoH, 1 MiB in two pieces (answered)": frame(
        "gpShmDtoH", BASE, 1 << 20, 0, 0, 512 << 10, flags=_wire.FLAG_WANTS_REPLY
    ),
}
END = frame("cuDeviceGetCount", flags=_wire.FLAG_WANTS_REPLY)  # no loop serves it: the run's end
NAME = _wire.EVENT_NAME_TAG << 56


def named_events(n: int) -> bytes:
    """n frames: n / 2 events named (each its own name), each destroyed right after."""
    return b"".join(
        frame("gpEventCreateNamed", 0, NAME + i) + frame("cuEventDestroy_v2", NAME + i) for i in range(n // 2)
    )


STREAMS = {"gpEventCreateNamed + cuEventDestroy_v2, an event made and destroyed": named_events}


# The driver's place, for the loop's own cost: every call succeeds at once, no stream is capturing.
STUB_C = """
#include <stdint.h>
int gp_stub_launch(void) { return 0; }
int gp_stub_call(void) { return 0; }
int gp_stub_copy(void) { return 0; }
int gp_stub_capturing(uint64_t stream, int *capturing) { (void)stream; *capturing = 0; return 0; }
"""


def stub_ops() -> tuple | None:
    """gpf_lease_new's four functions, compiled; None where there is no C compiler."""
    folder = Path(tempfile.mkdtemp(prefix="gpupool-bench-frames-"))
    (folder / "stub.c").write_text(STUB_C)
    built = subprocess.run(
        ["cc", "-O2", "-shared", "-fPIC", "-o", str(folder / "stub.so"), str(folder / "stub.c")],
        capture_output=True,
    )
    if built.returncode:
        return None
    lib = ctypes.CDLL(str(folder / "stub.so"))
    types = (
        _native_dispatch._LAUNCH,
        _native_dispatch._CALL,
        _native_dispatch._COPY,
        _native_dispatch._CAPTURING,
    )
    names = ("gp_stub_launch", "gp_stub_call", "gp_stub_copy", "gp_stub_capturing")
    return tuple(
        kind(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value)
        for kind, name in zip(types, names, strict=True)
    )


def lease_and_session(sock: socket.socket, native: bool, ops: tuple | None = None, mapped: bool = False):
    lease = LeaseState([1 << 30])
    executor = Translated(IdleExecutor()) if mapped else IdleExecutor()
    loop = _native_dispatch.for_worker(lease, executor) if native else None
    if loop is not None and ops is not None:  # C's own functions in the driver's place
        loop.ptr = loop.lib.gpf_lease_new(*ops)
    lease.handles["stream"].add(STREAM)
    lease.handles["event"].add(EVENT)
    lease.handles["graphexec"].add(GRAPH_EXEC)
    lease.add(Allocation(BASE, 1 << 20, 0, owned=True))
    channel = Channel(sock)
    session = Session(lease, executor, channel)
    shared = executor.shared_host_memory(1 << 20)
    session.pinned[PINNED] = shared
    session.shared = executor.shared_host_memory(1 << 20)  # gpShmAttach's
    native_session = loop.session() if loop is not None else None
    if native_session is not None:
        session.native = native_session
        native_session.pinned_add(PINNED, shared)
        native_session.shared_set(session.shared)
    return channel, session, native_session


def run(one: bytes | Callable[[int], bytes], n: int, native: bool, ops: tuple | None = None) -> float:
    """Seconds the worker spent on `n` frames of `one` (or the n frames it makes)."""
    client, served = socket.socketpair()
    channel, session, native_session = lease_and_session(served, native, ops, mapped=callable(one))
    drained = threading.Thread(target=lambda: _drain(client), daemon=True)
    drained.start()
    frames = one(n) if callable(one) else one * n
    sender = threading.Thread(target=client.sendall, args=(frames + END,), daemon=True)
    sender.start()
    start = time.perf_counter()
    if native_session is not None:
        native_session.serve(channel, session, touch=lambda: None)
    header = _wire.REQUEST
    while True:  # the Python path: every frame (after the loop: only the last one)
        call_id, flags, args_len, _, bulk_len = header.unpack(channel.read_exact(header.size))
        if call_id == CALL_IDS[BY_NAME["cuDeviceGetCount"]]:
            break
        session.dispatch(call_id, flags, channel.read_exact(args_len), bulk_len)
    took = time.perf_counter() - start
    sender.join(10)
    client.close()
    served.close()
    return took


def _drain(sock: socket.socket) -> None:
    try:
        while sock.recv(1 << 20):
            pass
    except OSError:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=20_000, help="frames per run (default 20000)")
    args = parser.parse_args()
    if _native_dispatch._load() is None:
        sys.exit("bench_native_frames: the native loop is not built (python setup.py build_ext --inplace)")
    ops = stub_ops()
    print(
        "| frame (idle executor) | Python path, µs per frame | native loop calling back into Python | "
        "native loop, C in the driver's place |"
    )
    print("| --- | --- | --- | --- |")
    for what, one in {**FRAMES, **STREAMS}.items():
        per = [
            min(run(one, args.frames, native, c_ops) for _ in range(3)) / args.frames * 1e6
            for native, c_ops in ((False, None), (True, None), (True, ops))
        ]
        stub = f"{per[2]:.2f}" if ops is not None else "(no cc)"
        print(f"| {what} | {per[0]:.2f} | {per[1]:.2f} | {stub} |")


if __name__ == "__main__":
    main()
