"""The data-plane wire format between gpupool's `libcuda.so.1` and a lease's worker, defined once.

`virtualize._shimgen` writes these numbers into the shim's C; the worker reads them from here.

Every request is a header, the call's fixed-size in-arguments (`virtualize._calls`), then `bulk_len`
bytes (copied data, a module image, a name). A reply, sent only for calls of mode REPLY, is a header,
the fixed-size outs, then `bulk_len` bytes (data copied to the host, a device name). Requests and
replies travel in order on one TCP connection, so replies need no ids. Integers are little-endian.
The first request on a connection is `gpHello` carrying the lease's secret; anything else first
closes the connection.
"""

from __future__ import annotations

import struct

PROTOCOL_VERSION = 1
REQUEST = struct.Struct("<IIIIQ")  # call id, flags, args_len, reserved, bulk_len
REPLY = struct.Struct("<iIQ")  # CUresult, outs_len, bulk_len
FLAG_WANTS_REPLY = 1
# Large copies move in chunks of this size: neither side holds more than one chunk of a copy.
CHUNK_BYTES = 4 << 20
# A frame's fixed part is small; anything larger is a corrupt or hostile peer.
MAX_ARGS_BYTES = 1 << 16
# Module images and kernel parameters are bounded too (a fatbin of a big library is well under this).
MAX_SMALL_BULK_BYTES = 1 << 30

ENV_WORKER = "GPUPOOL_WORKER"  # host:port of the lease's worker
ENV_SECRET = "GPUPOOL_SECRET"  # the lease's worker secret
ENV_LEASE = "GPUPOOL_LEASE"  # the lease id, for messages
ENV_TRACE = "GPUPOOL_SHIM_TRACE"  # 1: the shim prints every call it handles to stderr
ENV_PROFILE = "GPUPOOL_SHIM_PROFILE"  # 1: at exit, the shim prints where the process's time went
ENV_MEMO = "GPUPOOL_SHIM_MEMO"  # 0: every question goes to the worker (answers are not kept)
