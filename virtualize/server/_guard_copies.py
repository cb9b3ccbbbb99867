"""The guard's copies between the client's memory and the GPU, and within the GPU: in the request and
the reply (small ones), through memory a process on this host maps too (gpShm*), striped across a
process's extra connections (gpLane*), into its page-locked memory later (gpMemcpyDtoHAsync); device
to device and memsets. Every byte range must be the lease's (_guard_rules.DEVICE_RANGES), and a copy of
the client's memory on a capturing stream spoils the capture (cuStreamEndCapture then fails).

The connection's state these use (its pending error, shared memory, lanes, spoiled captures) stays on
the Session, which its other calls and its close() read too.
"""

from __future__ import annotations

import logging
import struct
from typing import ClassVar

from virtualize.common import _wire
from virtualize.common._calls import CALLS, Call
from virtualize.common._results import CUresult
from virtualize.server._executor import DECOMPRESS_PARAMS, INVALID_VALUE, CudaError
from virtualize.server._guard_concern import ANSWERED, EMPTY, Concern
from virtualize.server._guard_rules import capture_refuses, element_bytes
from virtualize.server._lanes import LANE_GO_FIRST, LANE_LATER, Lanes

log = logging.getLogger("gpupool.worker")

MAX_LANE_PIECES = 64
DECOMPRESS_ALGORITHMS = (
    1,
    2,
    4,
)  # DEFLATE, SNAPPY, LZ4; at most MAX_DECOMPRESSIONS in one batch (the shim's too)
MAX_DECOMPRESSIONS = 4096
SHARED_COPY_BYTES = 64 << 20  # per client connection on this host: the largest piece of one copy
PINNED_SHARE_MAX = 1 << 40  # one page-locked allocation shared with a client (a sanity bound only)
_HTOD_ASYNC = next(c for c in CALLS if c.symbol == "cuMemcpyHtoDAsync_v2")
_DTOH_ASYNC = next(c for c in CALLS if c.symbol == "cuMemcpyDtoHAsync_v2")


class CopyCalls(Concern):
    """Every copy and memset of one connection, and the capture a copy spoils."""

    CALLS: ClassVar[dict[str, str]] = {
        "cuStreamEndCapture": "end_capture",
        "cuMemcpyHtoD_v2": "htod",
        "cuMemcpyHtoDAsync_v2": "htod",
        "cuMemcpyDtoH_v2": "dtoh",
        "cuMemcpyDtoHAsync_v2": "dtoh",
        "gpMemcpyDtoHAsync": "dtoh_async",
        "gpCopiesFlush": "copies_flush",
        "gpShmAttach": "shm_attach",
        "gpRingAttach": "ring_attach",
        "gpShmHtoD": "shm_htod",
        "gpShmDtoH": "shm_dtoh",
        "gpPinnedShare": "pinned_share",
        "gpPinnedCopy": "pinned_copy",
        "gpPinnedSettle": "pinned_settle",
        "gpPinnedDrop": "pinned_drop",
        "gpLaneAttach": "lane_attach",
        "gpLaneCopy": "lane_copy",
        "gpLanePiece": "lane_piece",
        "cuMemBatchDecompressAsync": "decompress",
        "cuMemcpyDtoD_v2": "device_copy",
        "cuMemcpyDtoDAsync_v2": "device_copy",
        "cuMemcpyPeer": "device_copy",
        "cuMemcpyPeerAsync": "device_copy",
        **dict.fromkeys(
            (
                "cuMemsetD8_v2",
                "cuMemsetD16_v2",
                "cuMemsetD32_v2",
                "cuMemsetD8Async",
                "cuMemsetD16Async",
                "cuMemsetD32Async",
            ),
            "memset",
        ),
    }

    def _capturing(self, call: Call, stream: int) -> bool:
        """A copy between the client's memory and the GPU on a stream being captured cannot become a
        graph node (the worker cannot read or write the client's memory when the graph is launched):
        the capture is spoiled, and cuStreamEndCapture says so, as the driver does after a call that
        a capture does not allow. Never a copy done once at capture time and missing from the replays."""
        if not capture_refuses(call) or not self.session.executor.cuStreamIsCapturing(stream):
            return False
        self.session.spoiled_captures.add(stream)
        log.warning(
            "%s during a stream capture: copies from or to the client's memory cannot be captured; "
            "the capture fails at cuStreamEndCapture (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)",
            call.symbol,
        )
        return True

    def end_capture(self, call: Call, ins: tuple):
        answer = self.session._plain(call, ins)
        if ins[0] in self.session.spoiled_captures:
            self.session.spoiled_captures.discard(ins[0])
            (graph,) = struct.unpack("<Q", answer[0])
            self.session.executor.cuGraphDestroy(graph)
            self.session.lease.handles["graph"].discard(graph)
            raise CudaError(CUresult.STREAM_CAPTURE_INVALIDATED, "a copy from or to the client's memory")
        return answer

    def htod(self, call: Call, ins: tuple):
        dst, count, stream = ins
        self.session._check(call, ins)
        if count != self.session.channel.bulk_left:
            raise CudaError(INVALID_VALUE, "copy size and data differ")
        self.session._check_ranges(call, ins)
        if self._capturing(call, stream):
            return EMPTY  # the bytes are skipped
        channel = self.session.channel

        def fill(view: memoryview) -> None:
            channel.read_into(view)
            channel.bulk_left -= len(view)

        self.session.executor.copy_to_device(
            dst, count, stream if call.name.endswith("Async") else None, fill
        )

    def dtoh(self, call: Call, ins: tuple):
        src, count, stream = ins
        self.session._check_ranges(call, ins)
        if self._capturing(call, stream):
            raise CudaError(CUresult.STREAM_CAPTURE_UNSUPPORTED, "a copy to the client's memory")
        if count == 0:
            return EMPTY
        sent = 0

        def send(view: memoryview) -> None:
            nonlocal sent
            if sent == 0:  # the first chunk is in: the call has worked so far, answer with the header
                result, self.session.pending = (
                    (self.session.pending, 0) if call.sync_point else (0, self.session.pending)
                )
                self.session._send_kernel_output()
                self.session._announce_copies()
                self.session.channel.send(_wire.REPLY.pack(result, 0, count), view)
            else:
                self.session.channel.send(view)
            sent += len(view)

        try:
            self.session.executor.copy_from_device(
                src, count, stream if call.name.endswith("Async") else None, send
            )
        except CudaError as exc:
            if sent == 0:
                raise  # nothing sent yet: the reply carries the error
            self.session.pending = (
                self.session.pending or exc.code
            )  # the header is out: send the length promised
            while sent < count:
                send(memoryview(bytes(min(count - sent, _wire.CHUNK_BYTES))))
        return ANSWERED

    # -- copies through memory the client maps too (a process on this host) ------------------------

    def shm_attach(self, call: Call, ins: tuple):
        if not self.session.channel.local:
            raise CudaError(CUresult.NOT_SUPPORTED, "shared memory is for a process on this host")
        if self.session.shared is None:
            self.session.shared = self.session.executor.shared_host_memory(SHARED_COPY_BYTES)
            if self.session.native is not None:  # its pieces to the device are served in C from now on
                self.session.native.shared_set(self.session.shared)
        outs = call.out_struct.pack(self.session.shared.size)
        self.session._announce_copies()
        self.session.channel.send_with_fd(self.session.shared.fd, _wire.REPLY.pack(0, len(outs), 0), outs)
        return ANSWERED

    def ring_attach(self, call: Call, ins: tuple):
        """The command ring (GPUPOOL_SHIM_RING=1): answered on the socket with its memory's descriptor;
        every byte after this answer, both ways, goes through the ring."""
        channel = self.session.channel
        if not channel.local or channel.ring is not None:
            raise CudaError(CUresult.NOT_SUPPORTED, "the command ring is for a process on this host, once")
        ring = channel.new_ring()
        if ring is None:
            raise CudaError(CUresult.NOT_SUPPORTED, "the worker's native library is not built")
        outs = call.out_struct.pack(ring.BYTES)
        self.session._announce_copies()
        try:
            channel.send_with_fd(ring.fd, _wire.REPLY.pack(0, len(outs), 0), outs)
        except OSError:
            ring.close()
            raise
        ring.close_fd()  # the client maps its own; the worker's mapping stays
        channel.ring = ring
        log.info("a client on this host: its connection goes over to the command ring")
        return ANSWERED

    # The client's page-locked memory, shared with the worker on this host: copies by the worker's DMA.
    def pinned_share(self, call: Call, ins: tuple):
        """The client's new page-locked allocation at `base`: memory of the worker's, pinned, that the
        client maps there (its descriptor with the answer), so copies go straight into and out of it."""
        session = self.session
        base, size = ins
        if not session.channel.local:
            raise CudaError(CUresult.NOT_SUPPORTED, "shared memory is for a process on this host")
        if not size or size > PINNED_SHARE_MAX or base in session.pinned:
            raise CudaError(INVALID_VALUE, "not a new allocation of a size the worker shares")
        shared = session.executor.shared_host_memory(size)
        session.pinned[base] = shared
        if session.native is not None:  # its copies are served in C from now on
            session.native.pinned_add(base, shared)
        session._announce_copies()
        session.channel.send_with_fd(shared.fd, _wire.REPLY.pack(0, 0, 0))
        return ANSWERED

    def _pinned_at(self, host: int, count: int):
        for base, shared in self.session.pinned.items():
            if base <= host and host + count <= base + shared.size:
                return base, shared
        raise CudaError(
            INVALID_VALUE, f"[0x{host:x}, +{count}) is not page-locked memory shared with the worker"
        )

    def pinned_copy(self, call: Call, ins: tuple):
        """A copy between the lease's memory and the client's shared page-locked memory, by the worker's
        DMA on the client's stream: nothing more to send; the stream orders it, as natively (on a stream
        being captured, a node of the graph)."""
        session = self.session
        device, host, count, stream, flags = ins
        to_device, synchronous = flags & 1, flags & 2
        session._check_ranges(call, ins)
        base, shared = self._pinned_at(host, count)
        if not synchronous and session.executor.cuStreamIsCapturing(stream) != 0:
            # The pages are the client's own, mapped here too: a node that copies at each launch, as the
            # driver captures a copy with page-locked memory (PyTorch's pinned copies in CUDA graphs).
            session.executor.copy_pinned_captured(device, shared, host - base, count, stream, bool(to_device))
            return EMPTY
        on = None if synchronous else stream
        if to_device:
            session.executor.copy_in_from(device, shared, host - base, count, on, bool(synchronous))
            return EMPTY
        landing = session.pinned_landing.setdefault(base, [])
        landing[:] = [c for c in landing if not c.ready()]
        landing.append(session.executor.copy_out_into(shared, host - base, device, count, on))
        return EMPTY

    def pinned_settle(self, call: Call, ins: tuple):
        """Answered once every copy into the client's shared memory at [host, +count) has landed."""
        host, count = ins
        for base, shared in self.session.pinned.items():
            if base < host + count and host < base + shared.size:
                if self.session.native is not None:
                    self.session.native.pinned_settle(base)
                for copy in self.session.pinned_landing.pop(base, []):
                    copy.wait()
        return EMPTY

    def pinned_drop(self, call: Call, ins: tuple):
        (base,) = ins
        if base not in self.session.pinned:
            raise CudaError(INVALID_VALUE, "not page-locked memory shared with the worker")
        self.pinned_release(self.session, base)
        return EMPTY

    @staticmethod
    def pinned_release(session, base: int) -> None:
        """Give back one shared page-locked allocation (its copies landed first: no DMA into memory that
        goes); the Session's close() calls it for what the client left."""
        if session.native is not None:
            session.native.pinned_drop(base)
        for copy in session.pinned_landing.pop(base, []):
            copy.wait()
        try:
            session.executor.release_shared_host_memory(session.pinned.pop(base))
        except (CudaError, OSError) as exc:
            log.warning("could not release page-locked memory shared with the client: %s", exc)

    def shm_htod(self, call: Call, ins: tuple):
        """One piece of a copy to the device; the last piece is answered with the first error of all."""
        dst, count, stream, offset, flags = ins
        last, is_async = flags & 1, flags & 2
        try:
            self.session._check_ranges(call, ins)
            if self.session.shared is None or offset + count > self.session.shared.size:
                raise CudaError(INVALID_VALUE, "not in the shared memory")
            if not self.session.shared_error and not (is_async and self._capturing(_HTOD_ASYNC, stream)):
                self.session.executor.copy_in_from(
                    dst, self.session.shared, offset, count, stream if is_async else None, bool(last)
                )
        except CudaError as exc:
            self.session.shared_error = self.session.shared_error or exc.code
        if last:
            result, self.session.shared_error = self.session.shared_error, 0
            self.session._answer(True, EMPTY, result)
        return ANSWERED

    def shm_dtoh(self, call: Call, ins: tuple):
        """A copy to the client: answered once per `chunk` bytes as each is in the shared memory (the
        worker's DMA of the next piece runs while the client copies this one out). The native loop
        serves it the same way, piece by piece (dispatch.c shm_dtoh)."""
        src, count, stream, flags, chunk = ins
        is_async = flags & 2
        self.session._check_ranges(call, ins)
        if self.session.shared is None or count > self.session.shared.size or not chunk:
            raise CudaError(INVALID_VALUE, "not in the shared memory")
        if is_async and self._capturing(_DTOH_ASYNC, stream):
            raise CudaError(CUresult.STREAM_CAPTURE_UNSUPPORTED, "a copy to the client's memory")
        if not is_async and self.session.pending:  # a synchronous copy reports the earlier asynchronous error
            result, self.session.pending = self.session.pending, 0
            raise CudaError(result, "an earlier asynchronous error")
        for at in range(0, count, chunk):
            n = min(chunk, count - at)
            try:
                self.session.executor.copy_out_piece(
                    self.session.shared, at, src + at, n, stream if is_async else None
                )
            except CudaError as exc:
                self.session._answer(True, None, exc.code)
                return ANSWERED
            if at == 0:
                self.session._send_kernel_output()
                self.session._announce_copies()
            outs = call.out_struct.pack(at, n)
            self.session.channel.send(_wire.REPLY.pack(0, len(outs), 0), outs)
        return ANSWERED

    # -- copies striped across the process's connections (virtualize/server/_lanes.py) ----------------------

    def lane_attach(self, call: Call, ins: tuple):
        with self.session.lease.lock:
            owner = self.session.lease.callback_tokens.get(ins[0])
            if owner is None:
                raise CudaError(INVALID_VALUE, "not a connection of this lease")
            if owner.lanes is None:
                owner.lanes = Lanes()
            owner.lanes.attached += 1
        self.session.lane_of = owner

    def lane_copy(self, call: Call, ins: tuple):
        """Checked like any copy, in order; answered (or its error kept) once every piece is done. With
        LANE_GO_FIRST the process waits for a first answer before it sends the pieces: a copy that reaches a
        worker the lease has left is answered MOVED like any answered call, and no piece of it is on that
        worker's lanes (so a lease whose processes copy across lanes can move to another server)."""
        device, count, stream, flags, pieces, ident = ins
        to_device, is_async, go_first = bool(flags & 1), bool(flags & 2), bool(flags & LANE_GO_FIRST)
        later = to_device and is_async and go_first and bool(flags & LANE_LATER)
        lanes = self.session.lanes
        if lanes is None or lanes.lost:
            raise CudaError(INVALID_VALUE, "this connection has no lanes")
        if go_first:
            self.session._answer(True, None, 0)  # the pieces may come
        else:
            lanes.unmovable = True  # a shim that sends the pieces at once: some may be in flight at a pause
        allowed, error = True, 0
        try:
            self.session._check(call, ins)
            self.session._check_range(device, count)
            if not 0 < pieces <= MAX_LANE_PIECES:
                raise CudaError(INVALID_VALUE, "pieces")
            if is_async and self._capturing(_HTOD_ASYNC if to_device else _DTOH_ASYNC, stream):
                if not to_device:
                    raise CudaError(CUresult.STREAM_CAPTURE_UNSUPPORTED, "a copy to the client's memory")
                allowed = False  # the capture is spoiled; the bytes are consumed
            if (
                not to_device and not is_async and self.session.pending
            ):  # the earlier asynchronous error first
                result, self.session.pending = self.session.pending, 0
                raise CudaError(result, "an earlier asynchronous error")
        except CudaError as exc:
            allowed, error = False, exc.code
        staged = None
        if later and allowed:  # queued now, behind a mark; the connection goes on while the pieces come
            try:
                staged = self.session.executor.lane_staged(device, count, stream)
            except CudaError as exc:
                allowed, error = False, exc.code
        where = {
            "device": device,
            "count": count,
            "stream": stream if is_async else None,
            "ctx": self.session.ctx,
        }
        lanes.release(ident, pieces, allowed, error, to_device=to_device, staged=staged, **where)
        if staged is not None:
            return ANSWERED  # a failure in its pieces comes with a later synchronising call (lane_piece)
        copy = lanes.wait_done(ident)
        if not to_device:
            self.session._send_kernel_output()  # a copy to the host is a synchronising call
        if go_first and to_device:  # answered already: its error comes with the next synchronising call
            if copy.error and not self.session.pending:
                self.session.pending = copy.error
            return ANSWERED
        if copy.error:
            raise CudaError(copy.error, "a striped copy")
        return EMPTY

    def lane_piece(self, call: Call, ins: tuple):
        ident, offset, count = ins
        owner = self.session.lane_of
        if owner is None or owner.lanes is None:
            raise CudaError(INVALID_VALUE, "not a lane")
        copy = owner.lanes.piece(ident)
        if copy is None:
            raise CudaError(CUresult.DEVICE_UNAVAILABLE, "the copy was never checked")
        error = 0
        try:
            if offset + count > copy.count or (copy.to_device and count != self.session.channel.bulk_left):
                raise CudaError(INVALID_VALUE, "a piece outside its copy")
            if not copy.allowed:
                if copy.to_device:
                    return EMPTY  # refused or spoiled: its bytes are consumed, nothing is written
                raise CudaError(copy.error or INVALID_VALUE, "the copy was refused")
            if self.session.ctx != copy.ctx:  # the copy runs in its connection's context
                self.session.executor.set_context(copy.ctx)
                self.session.ctx = copy.ctx
            if copy.to_device:
                channel = self.session.channel

                def fill(view: memoryview) -> None:
                    channel.read_into(view)
                    channel.bulk_left -= len(view)

                if copy.staged is not None:  # into the queued copy's buffer; its stream copies it
                    fill(copy.staged.view[offset : offset + count])
                    return EMPTY
                self.session.executor.copy_to_device(copy.device + offset, count, copy.stream, fill)
                return EMPTY
            error = self._lane_send(copy.device + offset, count, copy.stream)
            return ANSWERED
        except CudaError as exc:
            error = exc.code
            raise
        finally:
            if owner.lanes.piece_done(copy, error) and copy.error and not owner.pending:
                owner.pending = copy.error  # a queued copy failed: its process hears at its next synchronise

    def _lane_send(self, src: int, count: int, stream: int | None) -> int:
        """A piece to the host: the reply header once its first chunk is in, then the bytes. Raises if
        it fails before anything is sent (the reply says so); later, the bytes promised are sent and the
        error returned (the copy's answer says so)."""
        sent = 0

        def send(view: memoryview) -> None:
            nonlocal sent
            if sent == 0:
                self.session.channel.send(_wire.REPLY.pack(0, 0, count), view)
            else:
                self.session.channel.send(view)
            sent += len(view)

        try:
            self.session.executor.copy_from_device(src, count, stream, send)
        except CudaError as exc:
            if sent == 0:
                raise
            while sent < count:
                send(memoryview(bytes(min(count - sent, _wire.CHUNK_BYTES))))
            return exc.code
        return 0

    def dtoh_async(self, call: Call, ins: tuple):
        """gpMemcpyDtoHAsync: queued behind its stream; its bytes (or its error) go to the client later."""
        src, count, stream, ident = ins
        callbacks = self.session.callbacks
        if callbacks is None:  # the shim starts the callback connection first
            raise CudaError(CUresult.NOT_SUPPORTED, "no callback connection")
        try:
            self.session._check_ranges(call, ins)
            if self._capturing(call, stream):
                raise CudaError(CUresult.STREAM_CAPTURE_UNSUPPORTED, "a copy to the client's memory")
            staged = self.session.executor.copy_from_device_async(src, count, stream)
        except Exception as exc:  # the client stops waiting for it either way
            callbacks.deliveries.failed(ident, getattr(exc, "code", CUresult.UNKNOWN))
            raise  # and kept for the next synchronising call, as an asynchronous error is
        callbacks.deliveries.add(ident, staged)

    def copies_flush(self, call: Call, ins: tuple):
        """Every copy done by now reaches the client before this answer (`wait`: every copy queued)."""
        self.session._announce_copies(wait=bool(ins[0]))

    def decompress(self, call: Call, ins: tuple):
        """cuMemBatchDecompressAsync: every operation's source, destination and actual-size word memory of
        the lease, or none is sent; the index of the operation the driver refused comes back."""
        self.session._check(call, ins)
        count, flags, stream = ins
        raw = self.session.channel.read_bulk(limit=MAX_DECOMPRESSIONS * DECOMPRESS_PARAMS.size)
        if not 1 <= count <= MAX_DECOMPRESSIONS or len(raw) != count * DECOMPRESS_PARAMS.size:
            raise CudaError(INVALID_VALUE, "decompression parameters")
        operations = list(DECOMPRESS_PARAMS.iter_unpack(raw))
        for src_bytes, dst_bytes, actual, src, dst, algorithm in operations:
            if algorithm not in DECOMPRESS_ALGORITHMS:
                raise CudaError(INVALID_VALUE, f"decompression algorithm {algorithm}")
            for ptr, size in ((src, src_bytes), (dst, dst_bytes), (actual, 4)):
                self.session._check_range(ptr, size)
        index = self.session.executor.cuMemBatchDecompressAsync(operations, flags, stream)
        return struct.pack("<Q", index), b""

    def device_copy(self, call: Call, ins: tuple):
        """Device to device (within a context, or between two: cuMemcpyPeer): both ranges the lease's."""
        self.session._check_ranges(call, ins)
        getattr(self.session.executor, call.name)(*ins)

    def memset(self, call: Call, ins: tuple):
        self.session._check_ranges(call, ins)  # `count` values of element_bytes(call) each
        dst, value, count = ins[:3]
        stream = ins[3] if len(ins) > 3 else None
        self.session.executor.memset(dst, value, element_bytes(call), count, stream)
