"""The guard is one set of rules on both paths: for every call the native loop serves, the same frames —
a valid one, and one per rule the guard applies to it (a handle not the lease's, a stream every context
has, device bytes outside or past the end of the lease's memory, a copy on a capturing stream) — are run in C exactly when the
Python path (`_executor_guard.Session`) runs them, with the same effect at the executor seam.

The frames are generated from the call table and the guard's rule tables, not picked by hand: a call
newly served in C, or a rule tightened in Python but not in C's generated table, shows up here.
"""

from __future__ import annotations

import inspect
import socket
import struct

import pytest
from test_remote_native_dispatch import (
    CAPTURING,
    EVENT,
    FUNC,
    GRAPH_EXEC,
    LAYOUT,
    STREAM,
    Recorder,
    python_frame,
)

from virtualize.common import _shimgen, _wire
from virtualize.common._calls import CALL_IDS, CALLS, Call
from virtualize.server import _guard_rules, _native_dispatch
from virtualize.server._executor import executor_method
from virtualize.server._executor_guard import Allocation, LeaseState, Session
from virtualize.server._handles import Translated
from virtualize.server.worker import Channel

pytestmark = pytest.mark.skipif(_native_dispatch._load() is None, reason="the native loop is not built")

BASE, SIZE, COUNT = 0x10000, 4096, 64  # the lease's one allocation; the bytes each copy names
PINNED, PINNED_SIZE = 0x7F0000000000, 4096  # the client's page-locked allocation shared with the worker
SHARED_SIZE = 4096  # the memory the connection shares with its process (gpShmAttach)
FOREIGN = 0xDEAD0000  # a handle or address the lease never made
VALID = {"stream": STREAM, "event": EVENT, "func": FUNC, "graphexec": GRAPH_EXEC, "dptr": BASE + 16}
CHUNK = COUNT // 2  # a copy through the shared memory answered in pieces (gpShmDtoH's `chunk`): two
# gpEventElapsedMany's pairs: one of the lease's events, one naming an event it never made
EVENT_PAIRS = ((EVENT, EVENT), (FOREIGN, EVENT))
NEW_EVENT_NAME = _wire.EVENT_NAME_TAG << 56 | 0x42  # a value the client may name a new event by


def valid_args(call: Call) -> list[int]:
    ranges = (
        *_guard_rules.range_positions(call),
        *_guard_rules.pinned_positions(call),
        *_guard_rules.shared_positions(call),
    )
    lengths = {length for _, length in ranges}
    pinned = {at for at, _ in _guard_rules.pinned_positions(call)}
    shared = {at for at, _ in _guard_rules.shared_positions(call)}
    return [
        PINNED + 16
        if i in pinned
        else 16
        if i in shared
        else CHUNK
        if p.name == "chunk"
        else len(EVENT_PAIRS)
        if call.name == "gpEventElapsedMany"
        else NEW_EVENT_NAME
        if call.name == "gpEventCreateNamed" and p.name == "name"
        else VALID.get(p.type, COUNT if i in lengths else 0)
        for i, p in enumerate(call.ins)
    ]


def bulk_of(call: Call, args: list[int]) -> bytes:
    """A launch's kernel parameters (LAYOUT's 12 bytes), a copy to the device's data, or nothing."""
    if not call.bulk_in:
        return b""
    if any(p.type == "func" for p in call.ins):
        return struct.pack("<QI", 0x1000, 7)
    if call.name == "gpEventElapsedMany":
        return b"".join(_wire.EVENT_PAIR.pack(*pair) for pair in EVENT_PAIRS)
    (_, length), *_ = _guard_rules.range_positions(call)
    return bytes(i % 251 for i in range(args[length]))


def cases() -> list[tuple[str, Call, list[int]]]:
    """(what is wrong, call, arguments) for every served call: the valid frame, then each rule broken."""
    out = []
    for call in _native_dispatch.IN_C_CALLS:
        valid = valid_args(call)
        out.append(("valid", call, valid))
        ranges = dict(_guard_rules.range_positions(call))
        pinned = dict(_guard_rules.pinned_positions(call))
        shared = dict(_guard_rules.shared_positions(call))
        for i, p in enumerate(call.ins):
            broken = {}
            if i in shared:
                broken[f"{p.name} past the shared memory's end"] = SHARED_SIZE - COUNT // 2
            if i in pinned:
                broken[f"{p.name} outside the shared page-locked memory"] = PINNED + PINNED_SIZE + 4096
                broken[f"{p.name} past the shared memory's end"] = PINNED + PINNED_SIZE - COUNT // 2
            if p.type in VALID and p.type != "dptr":
                broken[f"foreign {p.type}"] = FOREIGN
            if p.name == "chunk":
                broken["no chunk"] = 0
            if call.name == "gpEventCreateNamed" and p.name == "name":  # a value not the client's to choose
                broken["not a name"] = FOREIGN
            if call.name == "gpEventElapsedMany":  # a count its pairs do not match, none, too many
                broken.update(
                    {"count past its pairs": 3, "no pairs": 0, "too many pairs": _wire.MAX_EVENT_PAIRS + 1}
                )
            if p.name == "flags":  # each of the copy's modes (to the device, synchronous, a last piece, ...)
                for bits in (1, 2, 3):
                    broken[f"flags {bits}"] = bits
            if p.type == "stream":
                broken["capturing stream"] = CAPTURING
                for builtin in sorted(_guard_rules.BUILTIN_STREAMS):  # every context's own: allowed
                    broken[f"builtin stream {builtin}"] = builtin
                broken["the stream after the builtin ones"] = max(_guard_rules.BUILTIN_STREAMS) + 1
            if p.type == "dptr":
                broken[f"{p.name} outside the lease"] = BASE + SIZE + 4096
                if i in ranges:
                    broken[f"{p.name} past the allocation's end"] = BASE + SIZE - COUNT // 2
                if i in ranges and _guard_rules.element_bytes(call) > 1:  # counts values wider than bytes
                    broken[f"{p.name} with room for {COUNT} bytes, not {COUNT} values"] = BASE + SIZE - COUNT
            for what, value in broken.items():
                out.append((what, call, [value if j == i else v for j, v in enumerate(valid)]))
        flags = next((i for i, p in enumerate(call.ins) if p.name == "flags"), None)
        streams = [i for i, p in enumerate(call.ins) if p.type == "stream"]
        if flags is not None and streams:  # a copy queued on a capturing stream, in each mode
            for bits in (1, 2, 3):
                args = list(valid)
                args[flags], args[streams[0]] = bits, CAPTURING
                out.append((f"flags {bits} on a capturing stream", call, args))
    return out


CASES = cases()
# After a live migration the client's values name new objects (the executor's values here).
MOVED = {"stream": (STREAM, 0x15000), "event": (EVENT, 0x16000), "func": (FUNC, 0x1F00),
         "graphexec": (GRAPH_EXEC, 0x17000)}  # fmt: skip


class NamedRecorder(Recorder):
    """The recording executor with each per-call method's parameters named as the call table names them,
    as the executors' are, so the worker's handle translation finds them."""

    def __getattr__(self, name):
        record = super().__getattr__(name)
        call = next((c for c in CALLS if executor_method(c) == name), None)
        if call is not None:
            kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
            record.__signature__ = inspect.Signature([inspect.Parameter(p.name, kind) for p in call.ins])
        return record


def lease_with_handles(
    moved: bool = False,
) -> tuple[LeaseState, Recorder, _native_dispatch.NativeLease, object]:
    """The lease's tables, the recording executor, the native loop, and the executor the guard calls: the
    worker's translation of the client's values (`moved`: after a move mapped them to others)."""
    lease = LeaseState([1 << 30])
    executor = NamedRecorder()  # behind the worker's translation of handles, as in every worker
    guarded = Translated(executor, lease.holds)
    native = _native_dispatch.for_worker(lease, guarded)
    lease.handles["stream"].update({STREAM, CAPTURING})
    lease.handles["event"].add(EVENT)
    lease.handles["func"].add(FUNC)
    lease.handles["graphexec"].add(GRAPH_EXEC)
    lease.layouts[FUNC] = LAYOUT
    native.learn(FUNC, LAYOUT)
    lease.add(Allocation(BASE, SIZE, 0, owned=True))
    if moved:
        native.python_only()
        for ns, (client, real) in MOVED.items():
            guarded.map.move(ns, client, real)
        guarded.generation += 1
        native.moved()
    return lease, executor, native, guarded


def answered(client: socket.socket) -> bytes:
    """What the worker has sent the client so far."""
    client.setblocking(False)
    data = b""
    try:
        while chunk := client.recv(1 << 16):
            data += chunk
    except BlockingIOError:
        pass
    return data


def run_in_c(call: Call, args: list[int], bulk: bytes, flags: int, moved=False) -> tuple[bool, list, bytes]:
    """Whether the native loop served the frame itself, what reached the executor, what it answered."""
    _, executor, native, _ = lease_with_handles(moved)
    client, served = socket.socketpair()
    session = native.session()
    memories = [executor.shared_host_memory(PINNED_SIZE), executor.shared_host_memory(SHARED_SIZE)]
    session.pinned_add(PINNED, memories[0])
    session.shared_set(memories[1])
    try:
        channel = Channel(served)
        state = type(
            "PythonSide", (), {"pending": 0, "callbacks": None, "calls": 0, "ctx": 0, "shared_error": 0}
        )()
        packed = call.in_struct.pack(*args)
        client.sendall(
            _wire.REQUEST.pack(CALL_IDS[call], flags, len(packed), 0, len(bulk))
            + packed
            + bulk
            + python_frame()
        )
        session.serve(channel, state, touch=lambda: None)
        header = channel.read_exact(_wire.REQUEST.size)
        return header == python_frame()[: _wire.REQUEST.size], list(executor.ran), answered(client)
    finally:
        session.close()
        client.close()
        served.close()
        for memory in memories:  # each holds a descriptor: a thousand cases would pass select()'s 1024
            memory.close()


def run_in_python(call: Call, args: list[int], bulk: bytes, flags: int, moved=False) -> tuple[list, bytes]:
    """What reached the executor when the Python path ran the frame, and what it answered."""
    lease, executor, _, guarded = lease_with_handles(moved)
    client, served = socket.socketpair()
    memories = [executor.shared_host_memory(PINNED_SIZE), executor.shared_host_memory(SHARED_SIZE)]
    try:
        session = Session(lease, guarded, Channel(served))
        session.pinned[PINNED], session.shared = memories
        client.sendall(bulk)
        session.dispatch(CALL_IDS[call], flags, call.in_struct.pack(*args), len(bulk))
        return executor.ran, answered(client)
    finally:
        client.close()
        served.close()
        for memory in memories:
            memory.close()


@pytest.mark.parametrize(
    ("what", "call", "args"),
    CASES,
    ids=[f"{call.symbol if call.symbol != '-' else call.name}: {what}" for what, call, _ in CASES],
)
def test_a_frame_runs_in_c_exactly_when_the_python_guard_runs_it(what, call, args):
    """C serves a frame exactly when the Python guard would run it, with the same executor calls; a frame
    that breaks a rule (other than a capture, which only copies mind) never reaches the executor."""
    bulk = bulk_of(call, args)
    flags = _wire.FLAG_WANTS_REPLY if call.sync_point else 0
    in_c, ran_from_c, _ = run_in_c(call, args, bulk, flags)
    ran_from_python, _ = run_in_python(call, args, bulk, flags)
    assert in_c == bool(ran_from_python), (
        f"{call.symbol} with {what}: the Python guard {'runs' if ran_from_python else 'refuses'} it, "
        f"the native loop {'serves' if in_c else 'leaves'} it"
    )
    if in_c:
        assert ran_from_c == ran_from_python
    if what != "valid":
        allowed = "capturing stream" in what or what.startswith(("builtin stream", "flags"))
        assert not ran_from_python or allowed, f"{what} reached the executor"


@pytest.mark.parametrize("moved", [False, True], ids=["", "after a move"])
@pytest.mark.parametrize("asks", [True, False], ids=["answer asked", "no answer asked"])
@pytest.mark.parametrize(
    "call",
    _native_dispatch.IN_C_CALLS,
    ids=[c.symbol if c.symbol != "-" else c.name for c in _native_dispatch.IN_C_CALLS],
)
def test_a_served_call_answers_the_client_byte_for_byte_as_the_python_path(call, asks, moved):
    """Every served call's valid frame, asking for an answer and not, before and after a live migration
    (the client's stream, event, function and instantiated graph then name other objects): C runs what
    the Python path runs, on the same objects, and sends the client exactly the bytes it sends (an
    answer, an answered value, a copy's bytes, or none)."""
    args = valid_args(call)
    bulk = bulk_of(call, args)
    flags = _wire.FLAG_WANTS_REPLY if asks else 0
    in_c, ran_from_c, from_c = run_in_c(call, args, bulk, flags, moved)
    ran_from_python, from_python = run_in_python(call, args, bulk, flags, moved)
    assert in_c and ran_from_c == ran_from_python
    assert from_c == from_python
    if moved:  # the new objects reached the executor, not the client's values
        reached = {value for ran in ran_from_c for value in ran[1:] if isinstance(value, int)}
        assert not reached & {client for client, real in MOVED.values() if client != real}


def test_every_served_call_is_checked_valid_and_broken():
    """The cases cover every call the native loop serves, each with at least its valid frame, and each
    served call's valid frame runs in C (a rule C cannot apply would send every such frame to Python)."""
    served = {call.symbol if call.symbol != "-" else call.name for what, call, _ in CASES if what == "valid"}
    assert served == set(_guard_rules.NATIVE_CALLS)
    for what, call, args in CASES:
        if what == "valid":
            flags = _wire.FLAG_WANTS_REPLY if call.sync_point else 0
            assert run_in_c(call, args, bulk_of(call, args), flags)[0], f"{call.symbol} not served in C"


def test_a_served_call_with_an_argument_c_cannot_check_stops_the_generator(monkeypatch):
    """Serving a call in C whose argument the guard checks by a rule C lacks (a context) is refused when
    the C is generated, naming the call and the argument, instead of C serving it unchecked."""
    monkeypatch.setattr(
        _guard_rules, "NATIVE_CALLS", {**_guard_rules.NATIVE_CALLS, "cuCtxSynchronize_v2": "CTX_SYNC_V2"}
    )
    with pytest.raises(_shimgen.UncheckedArgument, match=r"cuCtxSynchronize_v2.*`ctx`"):
        _shimgen.generate_native()
