"""The worker's native hot path (``virtualize/server/native/dispatch.c``), driven from the connection loop.

A training loop sends mostly kernel launches, event records and waits, and synchronising calls. In the
worker's Python each costs 10-20 µs of dispatch, more than the driver's own launch (~4 µs), so the
launch rate and the round trip were the worker's, not the GPU's. The C loop serves those frames from
the connection's socket and receive buffer without Python and returns at the first frame it does not
serve exactly as the Python path (`_executor_guard.Session`) would; that frame then goes through
Python as before, so every check, quota and lease rule stays in one readable place.

What C may touch is what the guard has already checked: the lease's streams and events are mirrored
into C as the guard's tables change (`MirroredHandles`), and a function is served natively only after
the Python path has launched it once (its parameter layout known and checked). A handle the guard
forgets is dropped from C before it leaves the guard's table.
C checks each argument by the guard's own rules, generated into it from `_guard_rules` and the call
table (native/dispatch_gen.h); tests/test_native_guard_parity.py holds the two paths to one verdict.

``GPUPOOL_WORKER_NATIVE=0`` turns it off (every frame through Python: for comparing, or if in doubt).

The same library holds the worker's end of the command ring (`Ring`, gpRingAttach): a local
connection's bytes through memory the program maps too; the loop and the Python path both read and
write through it once the connection went over.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path

from virtualize.common import _wire
from virtualize.common._calls import WIRE_VERSION
from virtualize.common._results import CUresult
from virtualize.server._executor import CudaError, Launch, SharedHostMemory
from virtualize.server._guard_rules import BUILTIN_STREAMS, ELEMENT_BYTES, element_bytes, native_calls

log = logging.getLogger("gpupool.worker")

ENV = "GPUPOOL_WORKER_NATIVE"
SPIN_ENV = "GPUPOOL_WORKER_SPIN_US"  # how long the loop polls for the next frame before it sleeps
# 1: each connection logs, as it closes, where its native loop's time went (reading frames, launching)
STATS_ENV = "GPUPOOL_WORKER_NATIVE_STATS"
LIBRARY_MODULE = "virtualize.server._dispatch"
# The calls C serves (C's `which` is the index): their ids, argument offsets and the guard's checks of
# each argument are generated into native/dispatch_gen.h (`python -m virtualize.common._shimgen`).
IN_C_CALLS = native_calls()
KINDS = {"stream": 0, "event": 1, "func": 2, "kernel": 2, "graphexec": 3}  # the guard's handle tables C reads
NAMESPACES = {
    "stream": "stream",
    "event": "event",
    "func": "func",
    "kernel": "func",
    "graphexec": "graphexec",
}
LANDING_STREAMS = 8  # dispatch.c's: the streams with copies landing in one shared page-locked allocation
TO_PYTHON, ASYNC_ERROR, CLOSED, IO_ERROR, SERVED, REPLY_AFTER_OUTPUT, SHARED_ERROR = range(7)
BUDGET = 4096  # frames per return to Python (the worker notes activity between)

_LAUNCH = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.c_uint64,
    ctypes.POINTER(ctypes.c_uint32),
    ctypes.c_uint64,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_uint64,
    ctypes.c_void_p,
    ctypes.c_uint32,
)
_CALL = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64)
)
_COPY = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.c_uint32,
    ctypes.c_uint64,
    ctypes.c_void_p,
    ctypes.c_uint64,
    ctypes.c_uint64,
    ctypes.c_uint32,
)
_CAPTURING = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, ctypes.POINTER(ctypes.c_int))


class _Buffer(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("cap", ctypes.c_uint64),
        ("start", ctypes.c_uint64),
        ("end", ctypes.c_uint64),
    ]


class _Outcome(ctypes.Structure):
    _fields_ = [
        ("result", ctypes.c_int32),
        ("served", ctypes.c_uint32),
        ("data", ctypes.c_void_p),  # REPLY_AFTER_OUTPUT of a copy to the host: its bytes
        ("data_len", ctypes.c_uint64),
    ]


_library: ctypes.CDLL | None = None


def _load() -> ctypes.CDLL | None:
    """The built loop, its call ids set from the table; None where it is not built (no C compiler)."""
    global _library
    if _library is not None:
        return _library
    spec = importlib.util.find_spec(LIBRARY_MODULE)
    if spec is None or not spec.origin or not Path(spec.origin).is_file():
        return None
    try:
        lib = ctypes.CDLL(spec.origin)
    except OSError as exc:  # built for another machine or Python: the Python path serves every call
        log.warning("native dispatch not loaded (%s): every call through Python", exc)
        return None
    p, u64, u32, i = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_int
    for name, args, res in (
        ("gpf_use_driver", [], i),
        ("gpf_wire_version", [], u32),
        ("gpf_set_spin", [u64], None),
        ("gpf_set_stats", [i], None),
        ("gpf_session_stats", [p, ctypes.POINTER(u64)], None),
        ("gpf_lease_new", [_LAUNCH, _CALL, _COPY, _CAPTURING], p),
        ("gpf_range_add", [p, u64, u64], None),
        ("gpf_range_drop", [p, u64], None),
        ("gpf_lease_free", [p], None),
        ("gpf_handle_add", [p, i, u64], None),
        ("gpf_handle_drop", [p, i, u64], None),
        ("gpf_handle_clear", [p, i], None),
        ("gpf_handle_map", [p, i, u64, u64], None),
        ("gpf_function_add", [p, u64, u32, ctypes.POINTER(u32), ctypes.POINTER(u32), u32], None),
        ("gpf_addresses_moved", [p, ctypes.c_size_t, ctypes.POINTER(u64)], None),
        ("gpf_output_watch", [i], None),
        ("gpf_output_mark", [i], None),
        ("gpf_session_new", [p], p),
        ("gpf_session_free", [p], None),
        ("gpf_session_busy", [p], i),
        ("gpf_lease_python_only", [p, i], None),
        ("gpf_lease_events_here", [p, i], None),
        ("gpf_events_noted", [p], ctypes.c_size_t),
        ("gpf_events_take", [p, ctypes.POINTER(u64), ctypes.c_size_t], ctypes.c_size_t),
        ("gpf_lease_moved", [p], None),
        ("gpf_session_calls", [p], u64),
        ("gpf_session_syncs", [p], u64),
        ("gpf_pinned_add", [p, u64, u64, p], i),
        ("gpf_pinned_landing", [p, u64, ctypes.POINTER(u64), ctypes.POINTER(u64)], u32),
        ("gpf_pinned_drop", [p, u64], None),
        ("gpf_shm_set", [p, p, u64], None),
        ("gpf_serve", [p, i, p, p, ctypes.POINTER(_Buffer), i, i, u64, u32, ctypes.POINTER(_Outcome)], i),
        ("gpf_ring_map", [i, u32, i], p),
        ("gpf_ring_total", [u32], u64),
        ("gpf_ring_free", [p], None),
        ("gpf_ring_recv", [p, p, u64], ctypes.c_long),
        ("gpf_ring_send", [p, p, u64], i),
        ("gpf_wait_word", [p, u32, u64, u64], i),
        ("gpf_copy_to_host_marked", [p, u64, u64, u64, u64, u64, u32, ctypes.POINTER(i)], i),
    ):
        fn = getattr(lib, name, None)
        if fn is None:  # an older build of the loop: its functions are not these
            log.warning(
                "native dispatch not loaded: an older build (rebuild it: python setup.py build_ext --inplace)"
            )
            return None
        fn.argtypes, fn.restype = args, res
    if lib.gpf_wire_version() != WIRE_VERSION:  # its call ids and rules are another table's
        log.warning(
            "native dispatch not loaded: built from another call table (rebuild it: python setup.py "
            "build_ext --inplace); every call through Python"
        )
        return None
    lib.gpf_set_spin(_spin_ns())
    lib.gpf_set_stats(_stats_on())
    _library = lib
    return lib


def _stats_on() -> bool:
    return os.environ.get(STATS_ENV, "0") not in ("", "0")


def _spin_ns() -> int:
    """40 µs where there are 4 CPUs or more; on fewer, polling takes the CPU the client needs."""
    default = 40_000 if (os.cpu_count() or 1) >= 4 else 0
    try:
        return max(int(float(os.environ[SPIN_ENV]) * 1000), 0) if SPIN_ENV in os.environ else default
    except ValueError:
        log.warning("%s=%r is not a number of microseconds; the default", SPIN_ENV, os.environ[SPIN_ENV])
        return default


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


def copy_queuer() -> Callable[..., tuple[int, int]] | None:
    """`queue(dst, src, count, stream, event, mark, value) -> (CUresult, which call failed: 0 copy, 1 record,
    2 mark)`: a copy to the host, its event and its mark in one C call (gpf_copy_to_host_marked); None where
    the loop is not built or finds no driver in this process."""
    lib = _load()
    if lib is None or lib.gpf_use_driver() != 0:
        return None

    def queue(
        dst: int, src: int, count: int, stream: int, event: int, mark: int, value: int
    ) -> tuple[int, int]:
        failed = ctypes.c_int()
        result = lib.gpf_copy_to_host_marked(
            dst, src, count, stream, event, mark, value, ctypes.byref(failed)
        )
        return result, failed.value

    return queue


def word_waiter() -> Callable[[int, int, int], bool] | None:
    """`wait(address, value, timeout_ns)`: whether the 32-bit word at `address` came to hold `value` within
    the time, waited for in C with the GIL let go (gpf_wait_word); None where the loop is not built."""
    lib = _load()
    if lib is None:
        return None
    spin = _spin_ns()
    return lambda address, value, timeout_ns: lib.gpf_wait_word(address, value, spin, timeout_ns) == 1


class MirroredHandles(set):
    """A guard handle table that C reads too: every handle leaves C before it leaves the set."""

    def __init__(self, items, add: Callable[[int], None], drop: Callable[[int], None]) -> None:
        super().__init__()
        self._add, self._drop = add, drop
        self.update(items)

    def add(self, handle) -> None:
        super().add(handle)
        self._add(handle)

    def update(self, *others) -> None:
        for other in others:
            for handle in list(other):
                self.add(handle)

    def discard(self, handle) -> None:
        self._drop(handle)
        super().discard(handle)

    def remove(self, handle) -> None:
        self._drop(handle)
        super().remove(handle)

    def pop(self):
        handle = next(iter(self))
        self.remove(handle)
        return handle

    def clear(self) -> None:
        for handle in list(self):
            self._drop(handle)
        super().clear()

    def difference_update(self, *others) -> None:
        for other in others:
            for handle in list(other):
                self.discard(handle)

    def intersection_update(self, *others) -> None:
        self.difference_update(set(self).difference(*others))

    def symmetric_difference_update(self, other) -> None:
        other = set(other)
        self.difference_update(self & other)
        self.update(other - self)

    def __isub__(self, other):
        self.difference_update(other)
        return self

    def __iand__(self, other):
        self.intersection_update(other)
        return self

    def __ior__(self, other):
        self.update(other)
        return self

    def __ixor__(self, other):
        self.symmetric_difference_update(other)
        return self


class NativeLease:
    """The C side of one lease's handle tables, shared by its connections."""

    def __init__(self, lib: ctypes.CDLL, lease, executor) -> None:
        self.lib = lib
        self.lease = lease
        self._callbacks = None
        if executor.name != "cuda":  # no driver: C calls back into the executor (the host one: tests, CI)
            self._callbacks = (
                _LAUNCH(self._host_launch),
                _CALL(self._host_call),
                _COPY(self._host_copy),
                _CAPTURING(self._host_capturing),
            )
            self.ptr = lib.gpf_lease_new(*self._callbacks)
        else:
            self.ptr = lib.gpf_lease_new(_LAUNCH(), _CALL(), _COPY(), _CAPTURING())
        self.executor = executor
        # What C calls back with are the executor's values (a live migration maps the client's to them).
        translated = hasattr(type(executor), "current")  # virtualize.server._handles.Translated
        self.direct = executor.inner if translated else executor
        self.current = executor.current if translated else None
        self.learned: dict[int, list[tuple[int, int]]] = {}  # functions C launches -> their layout
        self.layouts: dict[int, list[tuple[int, int]]] = {}  # the same, by the executor's value
        # the worker's mappings of clients' shared page-locked memory C copies through: address -> memory
        self.mapped: dict[int, SharedHostMemory] = {}
        for name, kind in KINDS.items():
            keep = kind != 2  # functions reach C with their layout, at their first launch (`learn`)
            lease.handles[name] = MirroredHandles(
                lease.handles[name],
                (lambda h, n=name: self._add(n, h)) if keep else (lambda h: None),
                lambda h, k=kind: self._forget(k, h),
            )
        with lease.lock:  # its memory: copies into it may be served in C (LeaseState keeps this up to date)
            for a in lease.allocations.values():
                lib.gpf_range_add(self.ptr, a.base, a.size)
            lease.native = self
        # Named events made and destroyed in C where the executor maps names (settle_events tells Python).
        lib.gpf_lease_events_here(self.ptr, int(translated))
        self._settling = threading.Lock()

    def settle_events(self) -> None:
        """What C did to named events since last asked, into Python's tables: the executor's name map and
        the records a move replays, and the guard's handles. Before Python reads the lease's events: each
        call the Python path serves, a move, the end of a connection."""
        if not self.lib.gpf_events_noted(self.ptr):
            return
        notes = (ctypes.c_uint64 * (5 * 256))()
        with self._settling:  # in the order C made them, whoever asks
            while n := self.lib.gpf_events_take(self.ptr, notes, 256):
                for made, name, real, ctx, flags in zip(*[iter(notes[: 5 * n])] * 5, strict=True):
                    if made:
                        self.executor.event_made_elsewhere(name, real, flags, ctx)
                        self.lease.handles["event"].add(name)
                    else:
                        self.lease.handles["event"].discard(name)
                        if self.current is not None:  # the executor's records (Translated)
                            self.executor.event_destroyed_elsewhere(name)

    def range_added(self, base: int, size: int) -> None:
        self.lib.gpf_range_add(self.ptr, base, size)

    def range_dropped(self, base: int) -> None:
        self.lib.gpf_range_drop(self.ptr, base)

    def _real(self, name: str, handle: int) -> int:
        """The executor's value of the client's handle (itself until the lease first moves)."""
        return self.executor.map.real(NAMESPACES[name], handle) if self.current is not None else handle

    def _add(self, name: str, handle: int) -> None:
        self.lib.gpf_handle_add(self.ptr, KINDS[name], handle)
        real = self._real(name, handle)
        if real != handle:  # an object made after a move whose value the client knows as another
            self.lib.gpf_handle_map(self.ptr, KINDS[name], handle, real)

    def _forget(self, kind: int, handle: int) -> None:
        self.lib.gpf_handle_drop(self.ptr, kind, handle)
        if kind == 2:
            layout = self.learned.pop(handle, None)
            if layout is not None:
                self.layouts.pop(self._real("func", handle), None)

    def learn(self, func: int, layout: list[tuple[int, int]]) -> None:
        """A function the Python path has just launched: from now on C launches it too."""
        if func in self.learned:
            return
        self.learned[func] = layout
        offsets = (ctypes.c_uint32 * max(len(layout), 1))(*(offset for offset, _ in layout))
        sizes = (ctypes.c_uint32 * max(len(layout), 1))(*(size for _, size in layout))
        need = max((offset + size for offset, size in layout), default=0)
        self.lib.gpf_function_add(self.ptr, func, len(layout), offsets, sizes, need)
        real = self._real("func", func)
        self.layouts[real] = layout
        if real != func:
            self.lib.gpf_handle_map(self.ptr, KINDS["func"], func, real)

    def moved(self) -> None:
        """After a live migration: C hands the executor the target's objects (the client's handles mapped as
        the Python path maps them), and leaves copies naming a moved module global (at another address on
        the target) to the Python path; then it serves the lease's frames again."""
        for name, kind in KINDS.items():
            for handle in list(self.lease.handles[name]):
                if kind != 2 or handle in self.learned:
                    self.lib.gpf_handle_map(self.ptr, kind, handle, self._real(name, handle))
        self.layouts = {self._real("func", f): layout for f, layout in self.learned.items()}
        for base, _size, _real in self.executor.addresses.ranges if self.current is not None else []:
            self.lib.gpf_range_drop(self.ptr, base)
        self.addresses_moved()
        self.lib.gpf_lease_moved(self.ptr)

    def addresses_moved(self) -> None:
        """The module globals at another address than the client's: C maps a launch's parameters naming them."""
        ranges = self.executor.addresses.ranges if self.current is not None else []
        flat = (ctypes.c_uint64 * max(3 * len(ranges), 1))(*(v for triple in ranges for v in triple))
        self.lib.gpf_addresses_moved(self.ptr, len(ranges), flat)

    def session(self) -> NativeSession:
        return NativeSession(self)

    def python_only(self, on: bool = True) -> None:
        """Every frame of the lease through Python from now on (a live migration, until `moved`), or C
        serves again."""
        self.lib.gpf_lease_python_only(self.ptr, int(on))

    # -- the host executor's side (ctypes callbacks, on the connection's thread) ---------------------

    def _host_launch(self, func, dims, stream, _args, params, params_len, attrs, n_attrs) -> int:
        from virtualize.server._guard_launches import launch_attributes

        def run() -> None:
            raw = ctypes.string_at(attrs, n_attrs * _wire.LAUNCH_ATTRIBUTE_BYTES) if n_attrs else b""
            grid, block = (dims[0], dims[1], dims[2]), (dims[3], dims[4], dims[5])
            data = ctypes.string_at(params, params_len) if params_len else b""
            layout, attributes = self.layouts[func], tuple(launch_attributes(raw))
            self.direct.launch(Launch(func, grid, block, dims[6], stream, data, layout, attributes))

        return self._run(run)

    def _host_call(self, which, args, out) -> int:
        call = IN_C_CALLS[which]

        def run() -> None:
            if call.name == "gpEventCreateNamed":  # as C has the driver make it: the new event's handle
                out[0] = self.direct.cuEventCreate(args[0])
                return
            if call.symbol in ELEMENT_BYTES:  # a memset, as CopyCalls.memset has the executor run it
                stream = args[3] if len(call.ins) > 3 else None
                self.direct.memset(args[0], args[1], element_bytes(call), args[2], stream)
                return
            value = getattr(self.direct, call.name)(*args[: len(call.ins)])
            if call.out_struct.size:  # its one answered value, as the wire packs it
                out[0] = int.from_bytes(call.out_struct.pack(value), "little")

        return self._run(run)

    def _host_copy(self, which, device, host, count, stream, flags) -> int:
        call = IN_C_CALLS[which]
        if call.name == "gpPinnedCopy":
            return self._run(lambda: self._host_pinned_copy(device, host, count, stream, flags))
        if call.name == "gpShmHtoD":
            return self._run(lambda: self._host_shared_copy(device, host, count, stream, flags))
        if call.name == "gpShmDtoH":  # a piece, as CopyCalls.shm_dtoh has the executor copy it
            at, shared = self._mapping(host)
            on = stream if flags & 2 else None
            return self._run(lambda: self.executor.copy_out_piece(shared, host - at, device, count, on))
        to_device, on_stream = call.bulk_in, call.name.endswith("Async")
        window = (ctypes.c_char * count).from_address(host)
        view = memoryview(window).cast("B")
        at = 0

        def move(piece: memoryview) -> None:
            nonlocal at
            if to_device:
                piece[:] = view[at : at + len(piece)]
            else:
                view[at : at + len(piece)] = piece
            at += len(piece)

        if to_device:
            return self._run(
                lambda: self.direct.copy_to_device(device, count, stream if on_stream else None, move)
            )
        return self._run(
            lambda: self.direct.copy_from_device(device, count, stream if on_stream else None, move)
        )

    def _mapping(self, host: int) -> tuple[int, SharedHostMemory]:
        return next((a, m) for a, m in self.mapped.items() if a <= host < a + m.size)

    def _host_shared_copy(self, device, host, count, stream, flags) -> None:
        """As CopyCalls.shm_htod has the executor copy a piece (`host`: in the shared memory)."""
        at, shared = self._mapping(host)
        self.direct.copy_in_from(
            device, shared, host - at, count, stream if flags & 2 else None, bool(flags & 1)
        )

    def _host_pinned_copy(self, device, host, count, stream, flags) -> None:
        """As CopyCalls.pinned_copy has the executor copy (`host`: in the worker's mapping)."""
        at, shared = self._mapping(host)
        on = None if flags & 2 else stream
        if flags & 1:
            self.direct.copy_in_from(device, shared, host - at, count, on, bool(flags & 2))
        else:
            self.direct.copy_out_into(shared, host - at, device, count, on)

    def _host_capturing(self, stream, capturing) -> int:
        def ask() -> None:
            capturing[0] = int(bool(self.direct.cuStreamIsCapturing(stream)))

        return self._run(ask)

    def _run(self, fn) -> int:
        try:
            with self.lease.gate:  # held while the lease migrates, as the Python path's calls are
                fn()
        except CudaError as exc:
            return exc.code
        except Exception:  # a bug must not unwind into C
            log.exception("native dispatch: the host executor failed")
            return int(CUresult.UNKNOWN)
        return 0


class NativeSession:
    """One connection's native loop."""

    def __init__(self, lease: NativeLease) -> None:
        self.lease = lease
        self.lib = lease.lib
        self.ptr = self.lib.gpf_session_new(lease.ptr)
        self._outcome = _Outcome()
        self._seen_calls = 0
        self._syncs_at_close = 0
        self._lock = threading.Lock()  # `active` (the worker's activity thread) against `close`
        self._pinned: dict[int, int] = {}  # the client's shared page-locked allocations -> C's address
        self._ctx = 0  # the connection's current context (the guard Session's), for settling copies
        self._shared = 0  # where C reaches the memory shared with the process (gpShmAttach), once set

    # -- the client's page-locked memory shared with the worker (CopyCalls.pinned_*) -------------------

    @staticmethod
    def _address(shared: SharedHostMemory) -> int:
        """Where C reaches `shared`: the executor's pinned address, else (the host executor) its mapping."""
        if shared.address:
            return shared.address
        window = ctypes.c_char.from_buffer(shared.map)
        address = ctypes.addressof(window)
        del window  # the mapping must stay closable
        return address

    def shared_set(self, shared: SharedHostMemory) -> None:
        """Copies through the memory this connection shares with its process (gpShmHtoD, gpShmDtoH) run
        in C from now on."""
        if self.ptr:
            address = self._address(shared)
            self.lib.gpf_shm_set(self.ptr, address, shared.size)
            self.lease.mapped[address] = shared
            self._shared = address

    def pinned_add(self, base: int, shared: SharedHostMemory) -> None:
        """Copies between the lease's memory and the client's allocation at `base` run in C from now on."""
        address = self._address(shared)
        if self.ptr and self.lib.gpf_pinned_add(self.ptr, base, shared.size, address) == 0:
            self._pinned[base] = address
            self.lease.mapped[address] = shared

    def pinned_settle(self, base: int) -> None:
        """Every copy into the allocation at `base` that C queued is in place (its streams waited for,
        each in the context it was queued in). On the connection's thread, inside its call's gate."""
        if not self.ptr or base not in self._pinned:
            return
        streams, ctxs = (ctypes.c_uint64 * LANDING_STREAMS)(), (ctypes.c_uint64 * LANDING_STREAMS)()
        executor, handles = self.lease.executor, self.lease.lease.handles
        for i in range(self.lib.gpf_pinned_landing(self.ptr, base, streams, ctxs)):
            # A stream or context the program destroyed since is a freed handle to the driver (a segfault,
            # not an error): a context gone took its copies with it; a stream gone, its context's work
            if ctxs[i] and ctxs[i] not in handles["ctx"]:
                continue
            if ctxs[i] != self._ctx:
                executor.set_context(ctxs[i])
            try:
                if streams[i] in BUILTIN_STREAMS or streams[i] in handles["stream"]:
                    executor.cuStreamSynchronize(streams[i])
                else:
                    executor.cuCtxSynchronize()
            except CudaError:  # the stream is gone since: its context's work, all of it
                try:
                    executor.cuCtxSynchronize()
                except CudaError as exc:
                    log.warning("copies into shared page-locked memory not waited for: %s", exc)
            finally:
                if ctxs[i] != self._ctx:
                    executor.set_context(self._ctx)

    def pinned_drop(self, base: int) -> None:
        """The allocation at `base` is no longer shared: C's copies into it are waited for, then forgotten."""
        self.pinned_settle(base)
        address = self._pinned.pop(base, None)
        if address is not None:
            self.lib.gpf_pinned_drop(self.ptr, base)
            self.lease.mapped.pop(address, None)

    def active(self) -> bool:
        """Inside a driver call now, or served calls since last asked (the idle reclaimer's activity)."""
        with self._lock:
            if not self.ptr:
                return False
            calls = self.lib.gpf_session_calls(self.ptr)
            busy = self.lib.gpf_session_busy(self.ptr)
        moved, self._seen_calls = calls != self._seen_calls, calls
        return moved or bool(busy)

    def syncs(self) -> int:
        """Synchronisations this loop served that succeeded, ever (a pool's freed memory goes back at one)."""
        with self._lock:
            return self.lib.gpf_session_syncs(self.ptr) if self.ptr else self._syncs_at_close

    def busy(self) -> bool:
        """Inside a driver call now."""
        with self._lock:
            return bool(self.ptr) and bool(self.lib.gpf_session_busy(self.ptr))

    def serve(self, channel, session, touch: Callable[[], None]) -> None:
        """Frames served in C until the next one is Python's (the channel's buffer starts with it)."""
        fd = channel.sock.fileno()
        tls = getattr(channel.sock, "native_stream", None)  # an encrypted connection's stream in C
        outcome = self._outcome
        if self.lease.current is not None:  # after a move: this thread's context is the target's (C calls
            self.lease.current()  # the driver)
        while True:
            # A process with a callback connection (host functions, copies to its page-locked memory across
            # hosts) is answered here too while no copy of it is in flight or untold (Deliveries.all_told).
            callbacks = session.callbacks
            may_reply = not session.pending and (
                callbacks is None or callbacks.deliveries.all_told(session.copies_announced)
            )
            self._ctx = session.ctx
            buf = channel.buf
            window = (ctypes.c_char * len(buf)).from_buffer(buf)
            b = _Buffer(ctypes.addressof(window), len(buf), channel.start, channel.end)
            try:
                reason = self.lib.gpf_serve(
                    self.ptr,
                    fd,
                    tls,
                    channel.ring.ptr if channel.ring is not None else None,
                    ctypes.byref(b),
                    may_reply,
                    not session.shared_error,
                    session.ctx,
                    BUDGET,
                    ctypes.byref(outcome),
                )
            finally:
                del window  # the bytearray may grow again (read_exact)
            channel.start, channel.end = b.start, b.end
            session.calls += outcome.served
            if reason == TO_PYTHON:
                return
            if reason == SERVED:
                touch()
            elif reason == ASYNC_ERROR:
                if not session.pending:
                    session.pending = outcome.result
            elif reason == SHARED_ERROR:  # kept for the copy's answer, at its last piece
                session.shared_error = session.shared_error or outcome.result
            elif reason == REPLY_AFTER_OUTPUT:  # (a copy to the host: its bytes after the header)
                session._send_kernel_output()
                data = ctypes.string_at(outcome.data, outcome.data_len) if outcome.data_len else b""
                channel.send(_wire.REPLY.pack(outcome.result, 0, len(data)), data)
            elif reason == CLOSED:
                raise ConnectionResetError("the client closed the connection")
            else:
                raise OSError("the connection failed")

    def close(self) -> None:
        self.lease.settle_events()  # what this connection's loop did to named events, before anything is freed
        for base in list(self._pinned):  # no DMA may still be landing in memory the guard then frees
            self.pinned_drop(base)
        self.lease.mapped.pop(self._shared, None)
        if self.ptr and _stats_on():
            self._log_stats()
        with self._lock:
            if self.ptr:
                self._syncs_at_close = self.lib.gpf_session_syncs(self.ptr)
                self.lib.gpf_session_free(self.ptr)
                self.ptr = None

    def _log_stats(self) -> None:
        kept = (ctypes.c_uint64 * 7)()
        self.lib.gpf_session_stats(self.ptr, kept)
        serve, read, launch, frames, reads, launches, driver = (int(v) for v in kept)
        if not frames:  # a lane, a callback connection: nothing served in C
            return
        log.info("native loop of a connection: %d frames served in %.3f s: %.3f s reading them (waiting for and "
                 "decrypting their bytes, %d reads), %.3f s in %d launches (%.1f µs each, %.1f µs of it in the "
                 "executor's launch call), %.3f s in the rest",
                 frames, serve / 1e9, read / 1e9, reads, launch / 1e9, launches, launch / max(launches, 1) / 1e3,
                 driver / max(launches, 1) / 1e3, (serve - read - launch) / 1e9)  # fmt: skip


class Ring:
    """The worker's end of a connection's command ring (native/dispatch.c, common/include/gp_ring.h):
    the bytes the socket would carry, both ways, through memory the client on this host maps too."""

    BYTES = 1 << 20  # each direction's; a frame or answer of any size streams through

    def __init__(self, lib: ctypes.CDLL, ptr: int, fd: int) -> None:
        self.lib, self.ptr, self.fd = lib, ptr, fd

    @classmethod
    def create(cls, sock_fd: int) -> Ring | None:
        """A new ring beside the connection `sock_fd` (its memory's descriptor at `.fd`, to send once and
        close); None where the native library is not built."""
        lib = _load()
        if lib is None:
            return None
        fd = os.memfd_create("gpupool-ring", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, lib.gpf_ring_total(cls.BYTES))  # gp_ring.h: its header page, then each direction
            ptr = lib.gpf_ring_map(fd, cls.BYTES, sock_fd)
        except OSError:
            os.close(fd)
            raise
        if not ptr:
            os.close(fd)
            return None
        return cls(lib, ptr, fd)

    def recv_into(self, view: memoryview) -> int:
        """Like socket.recv_into: at least one byte, waiting; 0 once the client is gone."""
        window = (ctypes.c_char * len(view)).from_buffer(view)
        try:
            got = self.lib.gpf_ring_recv(self.ptr, ctypes.addressof(window), len(view))
        finally:
            del window
        if got < 0:  # its positions make no sense: the client broke its own stream
            raise ConnectionResetError("the client's command ring is corrupt")
        return got

    def send(self, view: memoryview) -> None:
        """Every byte of `view`, in order after what was sent before."""
        if view.readonly:  # bytes: ctypes passes their own buffer
            data = view.obj if isinstance(view.obj, bytes) and len(view.obj) == len(view) else view.tobytes()
            sent = self.lib.gpf_ring_send(
                self.ptr, ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p), len(data)
            )
        else:
            window = (ctypes.c_char * len(view)).from_buffer(view)
            try:
                sent = self.lib.gpf_ring_send(self.ptr, ctypes.addressof(window), len(view))
            finally:
                del window
        if sent < 0:
            raise ConnectionResetError("the client is gone, or its command ring is corrupt")

    def close_fd(self) -> None:
        """The memory's descriptor, once sent: the mappings stay."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def close(self) -> None:
        self.close_fd()
        if self.ptr:
            self.lib.gpf_ring_free(self.ptr)
            self.ptr = None


def for_worker(lease, executor) -> NativeLease | None:
    """The native loop for this worker's lease, or None (turned off, not built, no driver symbols)."""
    if not enabled():
        log.info("native dispatch off (%s=0): every call through Python", ENV)
        return None
    lib = _load()
    if lib is None:
        log.info("native dispatch not built: every call through Python")
        return None
    if executor.name == "cuda" and lib.gpf_use_driver() != 0:
        log.warning("native dispatch: the driver's entry points were not found; every call through Python")
        return None
    return NativeLease(lib, lease, executor)


def can_serve(sock) -> bool:
    """Plain sockets, and TLS streams in C (`_native_tls`); not a TLS connection decrypted in Python."""
    return isinstance(sock, socket.socket) or getattr(sock, "native_stream", None) is not None


def watch_kernel_output(fd: int) -> Callable[[int], None] | None:
    """Tell C where kernels' printf lands; returns the reader thread's marker (None: no native loop)."""
    lib = _load() if enabled() else None
    if lib is None:
        return None
    lib.gpf_output_watch(fd)
    return lib.gpf_output_mark
