"""The worker's TLS in C (``virtualize/server/native/tls.c``): the encrypted data connection at the cipher's speed.

In Python (`_data_tls.TlsStream`) each GB a copy moves across hosts cost the worker about a CPU-second
and a round of Python per 16 KiB record, and the native loop could not serve an encrypted connection
(bench/RESULTS.md, issue 12). `NativeTlsStream` runs the same TLS 1.3 server (the same certificate
and key, pinned by the client the same way) through the system's libssl from C; the worker's Python
reads and writes through it with the GIL let go, and the native loop serves frames from it directly.

Where the library is not built or libssl does not load, `server_context` says why and returns None:
the worker then uses `_data_tls.TlsStream`. ``GPUPOOL_WORKER_NATIVE=0`` turns this off with the loop.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import socket
import threading
from pathlib import Path

from virtualize.server import _data_tls, _native_dispatch

log = logging.getLogger("gpupool.worker")

_declared: ctypes.CDLL | None = None


def _library() -> ctypes.CDLL | None:
    global _declared
    lib = _native_dispatch._load() if _native_dispatch.enabled() else None
    if lib is None or lib is _declared:
        return lib
    p, u64, i = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int
    for name, args, res in (
        ("gpt_context_new", [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t], p),
        ("gpt_context_free", [p], None),
        ("gpt_accept", [p, i, i, ctypes.c_char_p, ctypes.c_size_t], p),
        ("gpt_read", [p, p, u64], ctypes.c_long),
        ("gpt_read_all", [p, p, u64], i),
        ("gpt_write", [p, p, u64], i),
        ("gpt_write_many", [p, p, p, ctypes.c_uint32], i),
        ("gpt_set_timeout", [p, i], None),
        ("gpt_version", [p], ctypes.c_char_p),
        ("gpt_free", [p], None),
    ):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    _declared = lib
    return lib


class NativeServerContext:
    """The worker's certificate and key loaded into a libssl server context (TLS 1.3 only)."""

    def __init__(self, lib: ctypes.CDLL, ptr: int) -> None:
        self.lib, self.ptr = lib, ptr

    def stream(self, sock: socket.socket, timeout: float | None) -> NativeTlsStream:
        """`sock`, accepted, after the server's handshake in C (ConnectionError if it fails)."""
        return NativeTlsStream(self, sock, timeout)


def server_context(state_dir: Path) -> NativeServerContext | None:
    """The C TLS context for the certificate `_data_tls.server_context` wrote; None (logged) where it cannot be."""
    lib = _library()
    if lib is None:
        return None
    why = ctypes.create_string_buffer(256)
    cert, key = (str(state_dir / name).encode() for name in (_data_tls.CERT_FILE, _data_tls.KEY_FILE))
    ptr = lib.gpt_context_new(cert, key, why, len(why))
    if not ptr:
        log.warning(
            "TLS in C not available (%s): the data connection is encrypted in Python", why.value.decode()
        )
        return None
    return NativeServerContext(lib, ptr)


def _address(buffer, nbytes: int) -> tuple[int, object]:
    """The address of a writable buffer's first byte, and what keeps it alive while C writes there."""
    view = memoryview(buffer).cast("B")
    window = (ctypes.c_char * max(nbytes, 1)).from_buffer(view)
    return ctypes.addressof(window), window


def _readable_address(view: memoryview) -> tuple[int, object]:
    """The address of bytes C only reads, and what keeps them alive: bytes where they are, a writable
    buffer's own memory, a copy of any other read-only view."""
    if not view.readonly:
        return _address(view, len(view))
    keep = view.obj if isinstance(view.obj, bytes) and len(view.obj) == len(view) else view.tobytes()
    return ctypes.cast(ctypes.c_char_p(keep), ctypes.c_void_p).value, keep


class NativeTlsStream:
    """An accepted connection after the server's handshake in C. It offers what the worker uses of a
    socket (recv_into, recv_into_all, sendall, settimeout, version, fileno, close) and hands the native
    loop its stream (`native_stream`). One thread may read while another writes, and `close` from
    another thread waits for them to leave C (the socket shut down first wakes a blocked read) before
    the TLS session is freed."""

    def __init__(self, context: NativeServerContext, sock: socket.socket, timeout: float | None) -> None:
        self.lib = context.lib
        self.sock = sock
        self.family = sock.family
        self._inside = 0  # threads in a C call on this stream now
        self._cond = threading.Condition()
        why = ctypes.create_string_buffer(256)
        self.ptr = self.lib.gpt_accept(context.ptr, sock.fileno(), _millis(timeout), why, len(why))
        if not self.ptr:
            raise ConnectionError(why.value.decode() or "TLS handshake failed")

    @contextlib.contextmanager
    def _using(self):
        with self._cond:
            if not self.ptr:
                raise ConnectionResetError("the connection is closed")
            self._inside += 1
        try:
            yield self.ptr
        finally:
            with self._cond:
                self._inside -= 1
                self._cond.notify_all()

    def recv_into(self, buffer, nbytes: int = 0) -> int:
        want = nbytes or len(buffer)
        address, keep = _address(buffer, want)
        with self._using() as ptr:
            got = self.lib.gpt_read(ptr, address, want)
        del keep
        return self._checked(got)

    def recv_into_all(self, view: memoryview) -> bool:
        """Fill all of `view` with decrypted bytes (a copy's bulk); False if the stream ends first."""
        if not len(view):
            return True
        address, keep = _address(view, len(view))
        with self._using() as ptr:
            done = self.lib.gpt_read_all(ptr, address, len(view))
        del keep
        return bool(self._checked(done))

    def sendall(self, data) -> None:
        view = memoryview(data).cast("B")
        if not len(view):
            return
        address, keep = _readable_address(view)
        with self._using() as ptr:
            failed = self.lib.gpt_write(ptr, address, len(view))
        del keep
        if failed:
            raise ConnectionResetError("the client's connection failed while sending")

    def sendall_many(self, views: list[memoryview]) -> None:
        """Several pieces one after the other, flushed once: the client wakes once for a frame's header,
        head and bytes, or for several frames, not once a piece."""
        keep, addresses, lengths = [], (ctypes.c_void_p * len(views))(), (ctypes.c_uint64 * len(views))()
        for k, view in enumerate(views):
            addresses[k], kept = _readable_address(view)
            keep.append(kept)
            lengths[k] = len(view)
        with self._using() as ptr:
            failed = self.lib.gpt_write_many(ptr, addresses, lengths, len(views))
        del keep
        if failed:
            raise ConnectionResetError("the client's connection failed while sending")

    @staticmethod
    def _checked(got: int) -> int:
        if got == -2:
            raise TimeoutError("timed out")
        if got < 0:
            raise ConnectionResetError("the client's connection failed (TLS)")
        return got

    def settimeout(self, timeout: float | None) -> None:
        with self._using() as ptr:
            self.lib.gpt_set_timeout(ptr, _millis(timeout))

    def version(self) -> str | None:
        with self._using() as ptr:
            return self.lib.gpt_version(ptr).decode()

    @property
    def native_stream(self) -> int | None:
        return self.ptr

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        with self._cond:
            ptr, self.ptr = self.ptr, None  # no new call starts
        if ptr:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)  # a read waiting in C returns
            with self._cond:
                if self._cond.wait_for(lambda: self._inside == 0, timeout=10):
                    self.lib.gpt_free(ptr)  # (else kept: a leak rather than a crash)
        self.sock.close()


def _millis(timeout: float | None) -> int:
    return -1 if timeout is None else max(int(timeout * 1000), 0)
