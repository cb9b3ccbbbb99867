"""The guard's NCCL: a client's NCCL calls, forwarded at NCCL's API, run by the server's NCCL in this worker.

The client's `libgpupool_nccl.so` (virtualize/client/nccl/nccl_forward.c) sends each NCCL call of the
program here; the server's libnccl (`virtualize.server._nccl`) runs it in the lease's context, on the
lease's streams and memory (device addresses are the same in the client and the worker). So NCCL's
bootstrap root listens on this server (the unique id names it) and the ranks' workers connect to each
other: the collectives' bytes go worker to worker, never through the clients.

Communicators are objects of the lease (handle kind `comm`): the client holds an id, never NCCL's
pointer, and an id the lease did not make is refused (ncclInvalidArgument) before NCCL sees it; so are
buffers outside the lease's memory and streams that are not the lease's. A connection's communicators
are aborted when it ends (the process is gone, as a crashed rank's are natively). Each call's NCCL result
travels as its out `nccl`; an enqueued call (a collective, a group end) has no reply, and its error is
kept: ncclCommGetAsyncError of its communicator (a group end's: of any) returns it from then on.
"""

from __future__ import annotations

import ctypes
import logging
import secrets
import struct
from dataclasses import dataclass, field
from typing import ClassVar

from virtualize.common._calls import NCCL_COLLECTIVES, Call
from virtualize.server import _nccl
from virtualize.server._executor import CudaError
from virtualize.server._guard_concern import EMPTY, Concern
from virtualize.server._nccl import (
    CONFIG_INTS,
    CONFIG_STRINGS,
    DATATYPE_BYTES,
    INVALID_ARGUMENT,
    INVALID_USAGE,
    SUCCESS,
    SYSTEM_ERROR,
    UNIQUE_ID_BYTES,
    NcclConfig,
    NcclUnavailable,
)

log = logging.getLogger("gpupool.worker")

CONFIG_HEAD = struct.Struct(f"<{len(CONFIG_INTS)}i")  # the config's ints on the wire; its strings follow
CONFIG_MAX_BYTES = CONFIG_HEAD.size + 2 * 256  # two NUL-terminated names of up to 255 bytes
BUILTIN_OPS = 5  # ncclSum .. ncclAvg; ncclRedOpCreatePreMulSum makes the others, per communicator
HOW_ENDED = ("Finalize", "Destroy", "Abort")  # gpNcclCommEnd's `how`
SCALAR_HOST_IMMEDIATE = 1  # ncclScalarHostImmediate: the scalar's bytes cross in the call


class Refused(Exception):
    """A call the guard or the server's NCCL cannot run: its ncclResult_t and why (the worker's log)."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code = code


@dataclass
class Communicator:
    """One of the lease's communicators: NCCL's pointer and what the guard checks calls against."""

    real: int
    nranks: int
    rank: int
    device: int
    error: int = SUCCESS  # the first error of a call enqueued on it (no reply carried it)
    ops: set[int] = field(default_factory=set)  # the reduction operators made for it
    registered: dict[int, int] = field(default_factory=dict)  # registration id -> NCCL's handle


def decode_config(data: bytes) -> NcclConfig:
    """The config the client sent: its ints (CONFIG_INTS' order), then its two names, NUL-terminated."""
    if len(data) < CONFIG_HEAD.size:
        raise Refused(INVALID_ARGUMENT, "the communicator's config is cut short")
    config = NcclConfig()
    config.size = ctypes.sizeof(NcclConfig)
    config.magic = _nccl.API_MAGIC
    result, version = NcclCalls._lib().version()
    config.version = version if result == SUCCESS else 0
    for name, value in zip(CONFIG_INTS, CONFIG_HEAD.unpack_from(data), strict=True):
        setattr(config, name, value)
    names = data[CONFIG_HEAD.size :].split(b"\0")
    for name, value in zip(CONFIG_STRINGS, names, strict=False):
        setattr(config, name, value or None)
    return config


def element_counts(kind: str, count: int, nranks: int, me: int, root: int) -> tuple[int, int]:
    """How many elements a collective reads from its send buffer and writes to its receive buffer on
    this rank (0: NCCL does not touch that buffer here)."""
    at_root = me == root
    return {
        "AllReduce": (count, count),
        "Broadcast": (count if at_root else 0, count),
        "Reduce": (count, count if at_root else 0),
        "AllGather": (count, count * nranks),
        "ReduceScatter": (count * nranks, count),
        "Send": (count, 0),
        "Recv": (0, count),
        "AlltoAll": (count * nranks, count * nranks),
        "Gather": (count, count * nranks if at_root else 0),
        "Scatter": (count * nranks if at_root else 0, count),
    }[kind]


class NcclCalls(Concern):
    """NCCL's calls for one connection: communicators, collectives, groups, operators, registrations."""

    CALLS: ClassVar[dict[str, str]] = {
        "gpNcclVersion": "version",
        "gpNcclGetUniqueId": "unique_id",
        "gpNcclCommInitRank": "init_rank",
        "gpNcclCommSplit": "split",
        "gpNcclCommEnd": "end",
        "gpNcclCommQuery": "query",
        "gpNcclCollective": "collective",
        "gpNcclGroup": "group",
        "gpNcclRedOpCreatePreMulSum": "premul_sum",
        "gpNcclRedOpDestroy": "op_destroy",
        "gpNcclRegister": "register",
        "gpNcclDeregister": "deregister",
    }

    def __init__(self, session) -> None:
        super().__init__(session)
        self.made: set[int] = set()  # the communicators this connection made (aborted when it ends)
        self.error = SUCCESS  # the first error of an enqueued call that names no communicator (a group)

    # -- the calls that answer -------------------------------------------------------------------------

    def version(self, call: Call, ins: tuple):
        return self._reply(call, lambda: (*self._lib().version(),))

    def unique_id(self, call: Call, ins: tuple):
        def run():
            result, uid = self._lib().unique_id()
            return (result, len(uid)), uid if result == SUCCESS else b""

        return self._reply(call, run, with_bulk=True)

    def init_rank(self, call: Call, ins: tuple):
        nranks, rank, has_config = ins
        data = self.session.channel.read_bulk(limit=UNIQUE_ID_BYTES + CONFIG_MAX_BYTES)

        def run():
            if len(data) < UNIQUE_ID_BYTES:
                raise Refused(INVALID_ARGUMENT, "the unique id is cut short")
            if not 0 <= rank < nranks:
                raise Refused(INVALID_ARGUMENT, f"rank {rank} of {nranks}")
            config = decode_config(data[UNIQUE_ID_BYTES:]) if has_config else None
            device = self._device()
            lib = self._lib()
            # Blocks this connection's thread until every rank's worker has joined (NCCL's bootstrap).
            result, real = lib.init_rank(nranks, rank, data[:UNIQUE_ID_BYTES], config)
            return result, self._keep(real, nranks, rank, device) if real else 0

        return self._reply(call, run)

    def split(self, call: Call, ins: tuple):
        parent_id, color, key, has_config = ins
        data = self.session.channel.read_bulk(limit=CONFIG_MAX_BYTES)

        def run():
            parent = self._comm(parent_id)
            config = decode_config(data) if has_config else None
            result, real = self._lib().split(parent.real, color, key, config)
            if not real:  # NCCL_SPLIT_NOCOLOR: no communicator for this rank
                return result, 0
            count = self._lib().comm_int("Count", real)[1]
            rank = self._lib().comm_int("UserRank", real)[1]
            return result, self._keep(real, count, rank, parent.device)

        return self._reply(call, run)

    def end(self, call: Call, ins: tuple):
        comm_id, how = ins

        def run():
            if how >= len(HOW_ENDED):
                raise Refused(INVALID_ARGUMENT, f"no way {how} to end a communicator")
            comm = self._comm(comm_id)
            result = self._lib().end(HOW_ENDED[how], comm.real)
            if HOW_ENDED[how] != "Finalize":
                self._forget(comm_id)
            return (result,)

        return self._reply(call, run)

    def query(self, call: Call, ins: tuple):
        (comm_id,) = ins

        def run():
            comm = self._comm(comm_id)
            result, error = self._lib().comm_int("GetAsyncError", comm.real)
            # An enqueued call's error stays, as NCCL's own asynchronous errors do: the communicator is broken.
            return result, comm.error or self.error or error, comm.nranks, comm.device, comm.rank

        return self._reply(call, run)

    def premul_sum(self, call: Call, ins: tuple):
        scalar, datatype, residence, comm_id = ins

        def run():
            comm = self._comm(comm_id)
            size = self._element_bytes(datatype)
            if residence == SCALAR_HOST_IMMEDIATE:
                held = ctypes.create_string_buffer(struct.pack("<Q", scalar)[:size], 8)
                address = ctypes.addressof(held)
            else:
                self.session._check_range(scalar, size)
                address = self.session.executor.nccl_buffer(scalar, size)
            result, op = self._lib().premul_sum(address, datatype, residence, comm.real)
            if result == SUCCESS:
                comm.ops.add(op)
            return result, op

        return self._reply(call, run)

    def register(self, call: Call, ins: tuple):
        comm_id, buffer, size = ins

        def run():
            comm = self._comm(comm_id)
            self.session._check_range(buffer, size)
            result, handle = self._lib().register(
                comm.real, self.session.executor.nccl_buffer(buffer, size), size
            )
            if result != SUCCESS:
                return result, 0
            ident = secrets.randbits(62) + 1
            comm.registered[ident] = handle
            return result, ident

        return self._reply(call, run)

    def deregister(self, call: Call, ins: tuple):
        comm_id, ident = ins

        def run():
            comm = self._comm(comm_id)
            handle = comm.registered.pop(ident, None)
            if handle is None:
                raise Refused(INVALID_ARGUMENT, "no registration of this communicator has that handle")
            return (self._lib().deregister(comm.real, handle),)

        return self._reply(call, run)

    # -- the calls that are enqueued (no reply) --------------------------------------------------------

    def collective(self, call: Call, ins: tuple):
        comm_id, stream, send, recv, count, datatype, op, peer, kind = ins
        comm = None
        try:
            comm = self._comm(comm_id)
            if kind >= len(NCCL_COLLECTIVES):
                raise Refused(INVALID_ARGUMENT, f"no collective of kind {kind}")
            name = NCCL_COLLECTIVES[kind]
            size = self._element_bytes(datatype)
            reduces = name in ("AllReduce", "Reduce", "ReduceScatter")
            if reduces and op >= BUILTIN_OPS and op not in comm.ops:
                raise Refused(INVALID_ARGUMENT, f"reduction operator {op} was not made for this communicator")
            if (
                name in ("Broadcast", "Reduce", "Send", "Recv", "Gather", "Scatter")
                and not 0 <= peer < comm.nranks
            ):
                raise Refused(INVALID_ARGUMENT, f"rank {peer} of {comm.nranks}")
            sends, receives = element_counts(name, count, comm.nranks, comm.rank, peer)
            send_at = self._buffer(send, sends * size)
            recv_at = self._buffer(recv, receives * size)
            self.session._check(call, ins)  # the stream is the lease's
            c_stream = ctypes.c_void_p(self.session.executor.nccl_stream(stream))
            c_comm, c_count = ctypes.c_void_p(comm.real), ctypes.c_size_t(count)
            args = {
                "AllReduce": (send_at, recv_at, c_count, datatype, op, c_comm, c_stream),
                "Broadcast": (send_at, recv_at, c_count, datatype, peer, c_comm, c_stream),
                "Reduce": (send_at, recv_at, c_count, datatype, op, peer, c_comm, c_stream),
                "AllGather": (send_at, recv_at, c_count, datatype, c_comm, c_stream),
                "ReduceScatter": (send_at, recv_at, c_count, datatype, op, c_comm, c_stream),
                "Send": (send_at, c_count, datatype, peer, c_comm, c_stream),
                "Recv": (recv_at, c_count, datatype, peer, c_comm, c_stream),
                "AlltoAll": (send_at, recv_at, c_count, datatype, c_comm, c_stream),
                "Gather": (send_at, recv_at, c_count, datatype, peer, c_comm, c_stream),
                "Scatter": (send_at, recv_at, c_count, datatype, peer, c_comm, c_stream),
            }[name]
            result = self._lib().collective(f"nccl{name}", *args)
            if result not in (SUCCESS, _nccl.IN_PROGRESS):  # in progress: a non-blocking communicator's
                raise Refused(result, f"nccl{name} returned {result}: {self._lib().last_error()}")
        except (Refused, CudaError) as exc:
            self._keep_error(comm, exc)
        finally:
            self._restore_context()
        return EMPTY

    def group(self, call: Call, ins: tuple):
        (start,) = ins
        try:
            result = self._lib().group(bool(start))
            if result not in (SUCCESS, _nccl.IN_PROGRESS):
                raise Refused(result, f"ncclGroup{'Start' if start else 'End'} returned {result}")
        except Refused as exc:
            self._keep_error(None, exc)
        finally:
            self._restore_context()  # a group end launches
        return EMPTY

    def op_destroy(self, call: Call, ins: tuple):
        op, comm_id = ins
        comm = None
        try:
            comm = self._comm(comm_id)
            if op not in comm.ops:
                raise Refused(INVALID_ARGUMENT, f"reduction operator {op} was not made for this communicator")
            comm.ops.discard(op)
            result = self._lib().op_destroy(op, comm.real)
            if result != SUCCESS:
                raise Refused(result, f"ncclRedOpDestroy returned {result}")
        except Refused as exc:
            self._keep_error(comm, exc)
        return EMPTY

    # -- the lease's communicators ---------------------------------------------------------------------

    def _keep(self, real: int, nranks: int, rank: int, device: int) -> int:
        ident = secrets.randbits(62) + 1  # never NCCL's pointer: the client holds an id of the lease's
        lease = self.session.lease
        with lease.lock:
            lease.nccl_comms[ident] = Communicator(real, nranks, rank, device)
            lease.handles["comm"].add(ident)
        self.made.add(ident)
        return ident

    def _comm(self, ident: int) -> Communicator:
        comm = self.session.lease.nccl_comms.get(ident)
        if comm is None:
            raise Refused(INVALID_ARGUMENT, f"communicator 0x{ident:x} is not one of this lease's")
        return comm

    def _forget(self, ident: int) -> None:
        lease = self.session.lease
        with lease.lock:
            lease.nccl_comms.pop(ident, None)
            lease.handles["comm"].discard(ident)
        self.made.discard(ident)

    def close(self) -> None:
        """The process is gone: its communicators are aborted (their peers see the rank leave)."""
        for ident in list(self.made):
            comm = self.session.lease.nccl_comms.get(ident)
            if comm is not None:
                log.info(
                    "aborting NCCL communicator rank %d of %d the client left behind", comm.rank, comm.nranks
                )
                try:
                    self.session.executor.set_context(self.session.lease.primary_ctx.get(comm.device, 0))
                    self._lib().end("Abort", comm.real)
                except (Refused, CudaError) as exc:
                    log.warning("could not abort an NCCL communicator the client left: %s", exc)
            self._forget(ident)

    # -- helpers ---------------------------------------------------------------------------------------

    @staticmethod
    def _lib() -> _nccl.Nccl:
        try:
            return _nccl.nccl()
        except NcclUnavailable as exc:
            raise Refused(
                SYSTEM_ERROR, f"{exc} (set {_nccl.LIBRARY_ENV} in the server's environment)"
            ) from exc

    def _device(self) -> int:
        try:
            return self.session._device()
        except CudaError as exc:
            raise Refused(INVALID_USAGE, "no current CUDA context: set a device before NCCL") from exc

    @staticmethod
    def _element_bytes(datatype: int) -> int:
        if not 0 <= datatype < len(DATATYPE_BYTES):
            raise Refused(INVALID_ARGUMENT, f"no NCCL datatype {datatype}")
        return DATATYPE_BYTES[datatype]

    def _buffer(self, ptr: int, count: int) -> ctypes.c_void_p:
        """The address NCCL is given for `count` bytes at `ptr`, checked to be the lease's memory; a side
        the call does not touch on this rank is given NULL."""
        if count == 0:
            return ctypes.c_void_p(0)
        self.session._check_range(ptr, count)
        return ctypes.c_void_p(self.session.executor.nccl_buffer(ptr, count))

    def _keep_error(self, comm: Communicator | None, exc: Exception) -> None:
        code = exc.code if isinstance(exc, Refused) else INVALID_ARGUMENT
        log.info("NCCL call refused: %s", exc)
        if comm is not None:
            comm.error = comm.error or code
        else:
            self.error = self.error or code

    def _reply(self, call: Call, run, *, with_bulk: bool = False):
        """Run a call that answers: its outs (the NCCL result first) packed as the table says; a
        refusal answers its code and zeros."""
        try:
            answer = run()
            values, bulk = answer if with_bulk else (answer, b"")
        except (Refused, CudaError) as exc:
            code = exc.code if isinstance(exc, Refused) else INVALID_ARGUMENT
            log.info("NCCL call %s refused: %s", call.name, exc)
            values, bulk = (code,) + (0,) * (len(call.outs) - 1), b""
        finally:
            self._restore_context()
        return call.out_struct.pack(*values), bulk

    def _restore_context(self) -> None:
        """NCCL makes its device's primary context current on the calling thread (cudaSetDevice); the
        connection's next calls run in the context the client has current, which may be another."""
        if self.session.ctx:
            try:
                self.session.executor.set_context(self.session.ctx)
            except CudaError as exc:
                log.warning("could not make the client's context current again after NCCL: %s", exc)
