"""The server's NCCL: the one module of the worker that loads libnccl and calls it (ctypes).

A client's NCCL calls arrive at its API (`virtualize.server._guard_nccl`) and run here, in the worker of
the rank's lease, on the lease's GPU: NCCL's bootstrap root listens on this server, and its transports
(sockets, InfiniBand, P2P where the GPUs allow) connect this worker to the other ranks' workers.

Which library: `GPUPOOL_WORKER_NCCL_LIBRARY` (a path), else the `nvidia.nccl` package's
`lib/libnccl.so.2` (what PyTorch's CUDA wheels install), else the system's `libnccl.so.2`. Loaded at
the first forwarded NCCL call, so a worker whose clients never use NCCL never loads it. NCCL reads its
own settings (NCCL_SOCKET_IFNAME, NCCL_IB_HCA, NCCL_DEBUG ...) from the worker's environment, which is
the server's.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import threading
from pathlib import Path

from virtualize.common._calls import NCCL_CONFIG_INTS, NCCL_CONFIG_STRINGS

LIBRARY_ENV = "GPUPOOL_WORKER_NCCL_LIBRARY"
UNIQUE_ID_BYTES = 128  # NCCL_UNIQUE_ID_BYTES
API_MAGIC = 0xCAFEBEEF  # NCCL_API_MAGIC, the config's mark
CONFIG_UNDEF_INT = -(1 << 31)  # NCCL_CONFIG_UNDEF_INT
# ncclResult_t
SUCCESS, UNHANDLED_CUDA_ERROR, SYSTEM_ERROR, INTERNAL_ERROR, INVALID_ARGUMENT, INVALID_USAGE = range(6)
REMOTE_ERROR, IN_PROGRESS, TIMEOUT = 6, 7, 8
# Bytes per element of each ncclDataType_t (int8, uint8, int32, uint32, int64, uint64, half, float,
# double, bfloat16, fp8 e4m3, fp8 e5m2).
DATATYPE_BYTES = (1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1)

CONFIG_INTS, CONFIG_STRINGS = NCCL_CONFIG_INTS, NCCL_CONFIG_STRINGS  # their order on the wire


class NcclConfig(ctypes.Structure):
    """ncclConfig_t as NCCL 2.30 declares it; NCCL reads the fields its own version knows (`version`)."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("magic", ctypes.c_uint),
        ("version", ctypes.c_uint),
        *((name, ctypes.c_int) for name in CONFIG_INTS[:4]),
        ("netName", ctypes.c_char_p),
        *((name, ctypes.c_int) for name in CONFIG_INTS[4:6]),
        ("commName", ctypes.c_char_p),
        *((name, ctypes.c_int) for name in CONFIG_INTS[6:]),
    ]


class UniqueId(ctypes.Structure):
    """ncclUniqueId: passed by value (a ctypes array would pass a pointer)."""

    _fields_ = [("internal", ctypes.c_char * UNIQUE_ID_BYTES)]


class NcclUnavailable(Exception):
    """This server has no NCCL library to run the client's calls with."""


def library_path() -> str:
    """Where the server's libnccl is (the module docstring's order); a bare name for the loader to find."""
    named = os.environ.get(LIBRARY_ENV)
    if named:
        return named
    spec = importlib.util.find_spec("nvidia.nccl") if importlib.util.find_spec("nvidia") else None
    folders = (spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        candidate = Path(folder) / "lib" / "libnccl.so.2"
        if candidate.is_file():
            return str(candidate)
    return "libnccl.so.2"


class Nccl:
    """The loaded library. Each method returns the ncclResult_t and the call's out-values; a function
    the library lacks answers ncclInvalidUsage (a stand-in or an old NCCL), never an exception."""

    def __init__(self, path: str) -> None:
        try:
            self.lib = ctypes.CDLL(path)
        except OSError as exc:
            raise NcclUnavailable(f"cannot load the server's NCCL ({path}): {exc}") from exc
        self.path = path
        self.missing: list[str] = []  # functions asked for that the library lacks

    def _fn(self, name: str):
        fn = getattr(self.lib, name, None)
        if fn is None:
            self.missing.append(name)
            return None
        fn.restype = ctypes.c_int
        return fn

    def version(self) -> tuple[int, int]:
        out = ctypes.c_int(0)
        fn = self._fn("ncclGetVersion")
        return (fn(ctypes.byref(out)) if fn else INVALID_USAGE), out.value

    def unique_id(self) -> tuple[int, bytes]:
        uid = UniqueId()
        fn = self._fn("ncclGetUniqueId")
        return (fn(ctypes.byref(uid)) if fn else INVALID_USAGE), bytes(uid)

    def init_rank(
        self, nranks: int, rank: int, unique_id: bytes, config: NcclConfig | None
    ) -> tuple[int, int]:
        comm = ctypes.c_void_p(0)
        uid = UniqueId.from_buffer_copy(unique_id[:UNIQUE_ID_BYTES].ljust(UNIQUE_ID_BYTES, b"\0"))
        if config is None:
            fn = self._fn("ncclCommInitRank")
            result = fn(ctypes.byref(comm), nranks, uid, rank) if fn else INVALID_USAGE
        else:
            fn = self._fn("ncclCommInitRankConfig")
            result = fn(ctypes.byref(comm), nranks, uid, rank, ctypes.byref(config)) if fn else INVALID_USAGE
        return result, comm.value or 0

    def split(self, parent: int, color: int, key: int, config: NcclConfig | None) -> tuple[int, int]:
        comm = ctypes.c_void_p(0)
        fn = self._fn("ncclCommSplit")
        if fn is None:
            return INVALID_USAGE, 0
        cfg = ctypes.byref(config) if config is not None else None
        return fn(ctypes.c_void_p(parent), color, key, ctypes.byref(comm), cfg), comm.value or 0

    def end(self, how: str, comm: int) -> int:
        """ncclCommFinalize, ncclCommDestroy or ncclCommAbort (`how`)."""
        fn = self._fn(f"ncclComm{how}")
        return fn(ctypes.c_void_p(comm)) if fn else INVALID_USAGE

    def comm_int(self, what: str, comm: int) -> tuple[int, int]:
        """ncclCommGetAsyncError, ncclCommCount, ncclCommCuDevice or ncclCommUserRank (`what`)."""
        out = ctypes.c_int(0)
        fn = self._fn(f"ncclComm{what}")
        return (fn(ctypes.c_void_p(comm), ctypes.byref(out)) if fn else INVALID_USAGE), out.value

    def collective(self, name: str, *args) -> int:
        """One of NCCL's enqueueing calls by name, its arguments already C values (see `_guard_nccl`)."""
        fn = self._fn(name)
        return fn(*args) if fn else INVALID_USAGE

    def group(self, start: bool) -> int:
        fn = self._fn("ncclGroupStart" if start else "ncclGroupEnd")
        return fn() if fn else INVALID_USAGE

    def premul_sum(self, scalar: int, datatype: int, residence: int, comm: int) -> tuple[int, int]:
        op = ctypes.c_int(0)
        fn = self._fn("ncclRedOpCreatePreMulSum")
        if fn is None:
            return INVALID_USAGE, 0
        return fn(
            ctypes.byref(op), ctypes.c_void_p(scalar), datatype, residence, ctypes.c_void_p(comm)
        ), op.value

    def op_destroy(self, op: int, comm: int) -> int:
        fn = self._fn("ncclRedOpDestroy")
        return fn(op, ctypes.c_void_p(comm)) if fn else INVALID_USAGE

    def register(self, comm: int, buffer: int, size: int) -> tuple[int, int]:
        handle = ctypes.c_void_p(0)
        fn = self._fn("ncclCommRegister")
        if fn is None:
            return INVALID_USAGE, 0
        result = fn(
            ctypes.c_void_p(comm), ctypes.c_void_p(buffer), ctypes.c_size_t(size), ctypes.byref(handle)
        )
        return result, handle.value or 0

    def deregister(self, comm: int, handle: int) -> int:
        fn = self._fn("ncclCommDeregister")
        return fn(ctypes.c_void_p(comm), ctypes.c_void_p(handle)) if fn else INVALID_USAGE

    def last_error(self) -> str:
        fn = getattr(self.lib, "ncclGetLastError", None)
        if fn is None:
            return ""
        fn.restype = ctypes.c_char_p
        return (fn(None) or b"").decode(errors="replace")


_loaded: Nccl | None = None
_load_lock = threading.Lock()


def nccl() -> Nccl:
    """The worker's NCCL, loaded at the first call (NcclUnavailable where there is none)."""
    global _loaded
    with _load_lock:
        if _loaded is None:
            _loaded = Nccl(library_path())
        return _loaded
