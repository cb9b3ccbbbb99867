"""The data-plane wire format between gpupool's `libcuda.so.1` and a lease's worker, defined once.

`virtualize.common._shimgen` writes these numbers into the shim's C; the worker reads them from here.

Every request is a header, the call's fixed-size in-arguments (`virtualize.common._calls`), then `bulk_len`
bytes (copied data, a module image, a name). A reply, sent only for calls of mode REPLY, is a header,
the fixed-size outs, then `bulk_len` bytes (data copied to the host, a device name). Requests and
replies travel in order on one TCP connection, so replies need no ids. Integers are little-endian.
The handshake proves, both ways, that each end holds the lease's secret without sending it (HMAC-SHA256
over fresh nonces, so a recorded handshake cannot be replayed):

    client -> gpHello {version: _calls.WIRE_VERSION, the table's digest} + nonce_c (32 random bytes)
    worker -> reply: nonce_w (32 random bytes) + HMAC(secret, WORKER_LABEL + nonce_c + nonce_w)
    client checks the worker's proof (else it is not the lease's worker), then
    client -> gpProve + HMAC(secret, CLIENT_LABEL + nonce_w + nonce_c)
    worker -> reply: CUDA_SUCCESS and the device count, or CUDA_ERROR_NOT_PERMITTED and the connection closes

Anything else first closes the connection.
"""

from __future__ import annotations

import hashlib
import hmac
import struct

NONCE_BYTES = 32
PROOF_BYTES = 32  # HMAC-SHA256
WORKER_LABEL = b"gpupool worker proof 2\n"
CLIENT_LABEL = b"gpupool client proof 2\n"
REQUEST = struct.Struct("<IIIIQ")
REQUEST_FIELDS = ("call", "flags", "args_len", "reserved", "bulk_len")  # its fields, in order (C's offsets)
REPLY = struct.Struct("<iIQ")
REPLY_FIELDS = ("result", "outs_len", "bulk_len")  # the CUresult, the outs' bytes, the bulk's bytes
FLAG_WANTS_REPLY = 1
# Large copies move in chunks of this size: neither side holds more than one chunk of a copy.
CHUNK_BYTES = 4 << 20
# A reply header with this result carries text a kernel printed (device printf) as its bulk, for the
# client's stdout; the call's own reply follows. Sent before the reply of a synchronising call or a copy
# to the host, where the driver writes kernel output, so it lands in order with the program's own prints.
KERNEL_OUTPUT = -2
# Copies into the client's page-locked memory that complete later (cuMemcpyDtoHAsync): the worker sends
# each one's bytes, once they are in its host memory, on the process's callback connection as a header
# with COPY_DATA, outs COPY_HEAD (the client's copy id, the copy's CUresult) and the bytes as bulk.
# Before any reply on the process's connection it says how many such frames it has sent by then
# (COPIES_SENT, outs COPIES_COUNT), and the client lets no call return before that many have landed.
COPY_DATA = -3
COPY_HEAD = struct.Struct("<QiI")  # copy id, CUresult, 0
COPIES_SENT = -4
COPIES_COUNT = struct.Struct("<Q")
# A piece of such a copy (a large one, where the process attached delivery connections: gpDeliveryAttach):
# outs COPY_PIECE_HEAD (the copy id, the piece's offset in it, the copy's bytes, and how many frames the
# worker had sent before the copy's first piece: the client lands the piece only once as many have landed,
# so copies into the same memory land in their order), the piece's bytes as bulk; its pieces go on the
# callback and delivery connections at once, each a frame counted in COPIES_SENT, and the copy is done
# when its bytes have all landed. A whole copy sent after pieces has COPIES_SENT ahead of it, for the same.
COPY_PIECE = -7  # -6 is MOVED
COPY_PIECE_HEAD = struct.Struct("<QQQQ")
# A recapture's question (cuStreamBeginRecaptureToGraph): on the callback connection, a header with
# RECAPTURE_CALL, outs RECAPTURE_HEAD (the shim's callback id, the node, its CUgraphRecaptureStatus) and as
# bulk the node's two CUgraphNodeParams, original then recaptured, each a RECAPTURE_SIDE (the 256-byte
# struct with the worker's pointers zeroed; how many kernel arguments, their bytes) followed by one u32
# offset per argument and the arguments' bytes. The client answers RECAPTURE_ANSWER: the id, the
# callback's CUresult.
RECAPTURE_CALL = -5
RECAPTURE_HEAD = struct.Struct("<QQiI")
NODE_PARAMS_BYTES = 256  # sizeof(CUgraphNodeParams)
RECAPTURE_SIDE = struct.Struct(f"<{NODE_PARAMS_BYTES}sII")
RECAPTURE_ANSWER = struct.Struct("<QiI")
# The lease moved to another server's worker (virtualize.server._migrate_out): the answer to a frame that
# wants one, which did not run, with outs MOVED_TO (the token the process resumes with there, host:port, the
# worker's local socket name, its certificate's SHA-256 in hex). The client connects there, proves the lease
# secret, sends gpResume(token) and the frame again.
MOVED = -6  # -5 is the callback connection's RECAPTURE_CALL
MOVED_TO = struct.Struct("<Q256s128s72s")
# A launch's attributes follow its kernel parameters in the bulk, each a CUlaunchAttribute: its id (4 bytes),
# padding, a 64-byte value.
LAUNCH_ATTRIBUTE_BYTES = 72
# gpEventElapsedMany: its bulk holds (start, end) event pairs, its reply's bulk one answer per pair (the
# CUresult, the milliseconds where it is CUDA_SUCCESS); at most MAX_EVENT_PAIRS a request.
EVENT_PAIR = struct.Struct("<QQ")
EVENT_ELAPSED = struct.Struct("<if")
MAX_EVENT_PAIRS = 4096
# gpEventCreateNamed: the values the client names its events by have this top byte (kernel-half addresses,
# which no driver handle in a process takes); below it the process's random 24-bit prefix and a count.
EVENT_NAME_TAG = 0xEE


def is_event_name(value: int) -> bool:
    """Whether a value is one a client may name an event by (gpEventCreateNamed)."""
    return value >> 56 == EVENT_NAME_TAG


# A frame's fixed part is small; anything larger is a corrupt or hostile peer.
MAX_ARGS_BYTES = 1 << 16
# Module images and kernel parameters are bounded too (a fatbin of a big library is well under this).
MAX_SMALL_BULK_BYTES = 1 << 30

ENV_WORKER = "GPUPOOL_WORKER"  # host:port of the lease's worker
ENV_SECRET = "GPUPOOL_SECRET"  # the lease's worker secret
ENV_LEASE = "GPUPOOL_LEASE"  # the lease id, for messages
ENV_TLS = "GPUPOOL_WORKER_TLS_SHA256"  # the worker's certificate: the shim talks TLS to it and pins it
ENV_LACKS = "GPUPOOL_DRIVER_LACKS"  # ABIs (name@since, commas) the worker's driver lacks: cuGetProcAddress answers as it
ENV_LOCAL = "GPUPOOL_WORKER_LOCAL"  # the worker's Unix socket (abstract name), used when it runs on this host
# A file gpuattach keeps saying where the lease's worker is now (`worker`, `local`, `tls` lines): read by the shim
# at each new connection, so a process started after the lease moved to another server finds it there.
ENV_WORKER_FILE = "GPUPOOL_WORKER_FILE"
ENV_ENCRYPT = "GPUPOOL_DATA_ENCRYPTION"  # "auto" (default: all but loopback) or "always"
ENV_TRACE = "GPUPOOL_SHIM_TRACE"  # 1: the shim prints every call it handles to stderr
ENV_PROFILE = "GPUPOOL_SHIM_PROFILE"  # 1: at exit, the shim prints where the process's time went
ENV_MEMO = "GPUPOOL_SHIM_MEMO"  # 0: every question goes to the worker (answers are not kept)
# A run spread over several leases (`gpuattach run --spread`): how many; lease r's variables are the ones
# above with the suffix `_r`, and a process whose LOCAL_RANK is r talks to lease r's worker.
ENV_RANKS = "GPUPOOL_RANKS"
LEASE_ENV = (
    ENV_WORKER,
    ENV_SECRET,
    ENV_LEASE,
    ENV_TLS,
    ENV_LOCAL,
    ENV_LACKS,
    ENV_WORKER_FILE,
)  # what differs from one lease to another


def offsets(layout: struct.Struct, fields: tuple[str, ...]) -> dict[str, int]:
    """Each field's byte offset in a packed little-endian header (what C reads at fixed offsets)."""
    at = 0
    out: dict[str, int] = {}
    for name, code in zip(fields, layout.format.lstrip("<"), strict=True):
        out[name] = at
        at += struct.calcsize("<" + code)
    assert at == layout.size, "a field list that does not cover its header"
    return out


def proof(secret: bytes, label: bytes, first: bytes, second: bytes) -> bytes:
    """One side's proof that it holds the lease's secret, bound to both nonces of this connection."""
    return hmac.new(secret, label + first + second, hashlib.sha256).digest()
