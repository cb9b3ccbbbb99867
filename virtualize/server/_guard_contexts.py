"""The guard's contexts: which one is current on a connection, the primary contexts a process retains
(of the lease's devices only), and the contexts it creates, destroyed with their memory when it asks or
leaves.
"""

from __future__ import annotations

import logging
import struct
from typing import ClassVar

from virtualize.common._calls import Call
from virtualize.common._results import CUresult
from virtualize.server._executor import INVALID_CONTEXT, CudaError
from virtualize.server._guard_concern import Concern

log = logging.getLogger("gpupool.worker")


class ContextCalls(Concern):
    """The current context of one connection, and the contexts it creates."""

    CALLS: ClassVar[dict[str, str]] = {
        "gpSetContext": "set_context",
        "cuDevicePrimaryCtxRetain": "primary_ctx_retain",
        "cuCtxSynchronize_v2": "synchronize_v2",
        "cuStreamGetCtx_v2": "stream_ctx_v2",
        "cuCtxCreate_v2": "create",
        "cuCtxDestroy_v2": "destroy",
    }

    def __init__(self, session) -> None:
        super().__init__(session)
        self.created: set[int] = set()  # cuCtxCreate's on this connection, destroyed when it closes

    def close(self) -> None:
        """The client is gone: the contexts it created go, and their memory with them."""
        for ctx in list(self.created):
            try:
                self.session.executor.set_context(0)
                self.destroy_context(ctx)
            except CudaError as exc:
                log.warning("could not destroy context 0x%x after the client left: %s", ctx, exc)

    def set_context(self, call: Call, ins: tuple):
        (ctx,) = ins
        self.session._check(call, ins)
        self.session.executor.set_context(ctx)
        self.session.ctx = ctx

    def primary_ctx_retain(self, call: Call, ins: tuple):
        (dev,) = ins
        if not 0 <= dev < len(self.session.lease.limits):
            raise CudaError(CUresult.INVALID_DEVICE, "device ordinal")
        ctx = self.session.executor.cuDevicePrimaryCtxRetain(dev)
        self.session.lease.handles["ctx"].add(ctx)
        self.session.lease.ctx_device[ctx] = dev
        self.session.lease.primary_ctx[dev] = ctx
        return struct.pack("<Q", ctx), b""

    def synchronize_v2(self, call: Call, ins: tuple):
        (ctx,) = ins
        self.session._check(call, ins)
        if ctx and ctx != self.session.ctx:
            self.session.executor.set_context(ctx)
            try:
                self.session.executor.cuCtxSynchronize()
            finally:
                self.session.executor.set_context(self.session.ctx)
        else:
            self.session.executor.cuCtxSynchronize()
        self.session.syncs += 1

    def stream_ctx_v2(self, call: Call, ins: tuple):
        self.session._check(call, ins)
        return struct.pack("<QQ", self.session.executor.cuStreamGetCtx(ins[0]), 0), b""

    def create(self, call: Call, ins: tuple):
        flags, dev = ins
        if not 0 <= dev < len(self.session.lease.limits):
            raise CudaError(CUresult.INVALID_DEVICE, "device ordinal")
        ctx = self.session.executor.cuCtxCreate(flags, dev)
        self.session.lease.handles["ctx"].add(ctx)
        self.session.lease.ctx_device[ctx] = dev
        self.created.add(ctx)
        return struct.pack("<Q", ctx), b""

    def destroy(self, call: Call, ins: tuple):
        (ctx,) = ins
        if ctx not in self.created:  # a primary context, another process's, or none
            raise CudaError(INVALID_CONTEXT, "not a context this process created")
        self.destroy_context(ctx)

    def destroy_context(self, ctx: int) -> None:
        """As the driver does: the context's memory goes with it, and comes back to the quota."""
        session, lease = self.session, self.session.lease
        session.executor.cuCtxDestroy(ctx)
        self.created.discard(ctx)
        lease.handles["ctx"].discard(ctx)
        lease.ctx_device.pop(ctx, None)
        for base in [b for b in session.owned if getattr(lease.allocations.get(b), "ctx", None) == ctx]:
            a = lease.remove(base)
            if a is not None and a.window is not None:  # mapped memory outlives contexts: unmap it here
                a.window.free(base, wait=False)
            session.owned.discard(base)
        if session.ctx == ctx:
            session.ctx = 0
