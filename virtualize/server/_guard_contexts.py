"""The guard's contexts: which one is current on a connection, the primary contexts a process retains
(of the lease's devices only), and the contexts it creates, destroyed with their memory when it asks or
leaves.

A process's primary context of a device is its own: a context the worker creates for that process at its
first cuDevicePrimaryCtxRetain (with the flags it set by cuDevicePrimaryCtxSetFlags), counted, released,
reset and destroyed for it alone, as the driver keeps one per process. A sticky error (an illegal
address, a device-side assert, a launch failure) then spoils that process's context only, as it would
natively, never the lease's other processes'. Their memory is shared all the same: the address windows
are mappings of the worker's, reachable from every context of the device (docs/remote.md).
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass
from typing import ClassVar

from virtualize.common._calls import Call
from virtualize.common._results import CUresult
from virtualize.server._executor import INVALID_CONTEXT, INVALID_VALUE, CudaError
from virtualize.server._guard_concern import Concern

log = logging.getLogger("gpupool.worker")

# CUresults a driver keeps for good in the context whose kernel met them (sticky): illegal address, launch
# timeout, device-side assert, hardware stack error, illegal instruction, misaligned address, invalid
# address space, invalid program counter, launch failure.
STICKY_ERRORS = frozenset({700, 702, 710, 714, 715, 716, 717, 718, 719})
# CUctx_flags a primary context takes: the scheduling policy (SPIN, YIELD, BLOCKING_SYNC, or AUTO: 0),
# MAP_HOST, LMEM_RESIZE_TO_MAX, COREDUMP_ENABLE, USER_COREDUMP_ENABLE, SYNC_MEMOPS.
SCHED_MASK, SCHED_POLICIES, PRIMARY_FLAGS = 0x07, frozenset({0, 1, 2, 4}), 0xFF


@dataclass
class Primary:
    """One process's primary context of one device, as the driver keeps it for a process."""

    ctx: int = 0  # 0: not created (never retained, or released to zero, or reset)
    retains: int = 0
    flags: int = 0


class ContextCalls(Concern):
    """The current context of one connection, its process's primary contexts, and the contexts it creates."""

    CALLS: ClassVar[dict[str, str]] = {
        "gpSetContext": "set_context",
        "cuDevicePrimaryCtxRetain": "primary_ctx_retain",
        "cuDevicePrimaryCtxRelease": "primary_ctx_release",
        "cuDevicePrimaryCtxRelease_v2": "primary_ctx_release",
        "cuDevicePrimaryCtxGetState": "primary_ctx_state",
        "cuDevicePrimaryCtxSetFlags": "primary_ctx_set_flags",
        "cuDevicePrimaryCtxSetFlags_v2": "primary_ctx_set_flags",
        "cuDevicePrimaryCtxReset": "primary_ctx_reset",
        "cuDevicePrimaryCtxReset_v2": "primary_ctx_reset",
        "cuCtxSynchronize_v2": "synchronize_v2",
        "cuStreamGetCtx_v2": "stream_ctx_v2",
        "cuCtxCreate_v2": "create",
        "cuCtxDestroy_v2": "destroy",
    }

    def __init__(self, session) -> None:
        super().__init__(session)
        self.created: set[int] = set()  # cuCtxCreate's on this connection, destroyed when it closes
        self.primary: dict[int, Primary] = {}  # device -> this process's primary context of it
        # The connection's current context when the worker destroyed it: the client still believes it
        # current on the worker (it sends gpSetContext only when its own changes), so a new context that
        # the driver gives the same value is current again at once.
        self.destroyed_current = 0
        self.spoiled_at_exit: dict[int, bool] = {}  # context -> whether a sticky error spoiled it

    def close(self) -> None:
        """The client is gone: the contexts it created go, and their memory with them."""
        for ctx in list(self.created):
            self._destroy_left(ctx)

    def close_primary(self) -> None:
        """The client is gone and its memory freed: its primary contexts go (a sticky error in one goes
        with it; the lease's other processes never saw it)."""
        for primary in self.primary.values():
            if primary.ctx:
                self._destroy_left(primary.ctx)
                primary.ctx = primary.retains = 0

    def _destroy_left(self, ctx: int) -> None:
        try:
            self.session.executor.set_context(0)
            self.destroy_context(ctx)
        except CudaError as exc:
            log.warning("could not destroy context 0x%x after the client left: %s", ctx, exc)

    def exit_context(self, dev: int) -> int:
        """The context this process's memory of `dev` is given back in when it leaves: its primary
        context, synchronised first, or none where a sticky error spoiled it (that context refuses the
        calls; the memory of its address window is the worker's mappings, given back without one)."""
        ctx = self.primary_context(dev)
        if ctx and ctx not in self.spoiled_at_exit:
            executor = self.session.executor
            try:
                executor.set_context(ctx)
                executor.cuCtxSynchronize()
                self.spoiled_at_exit[ctx] = False
            except CudaError as exc:
                self.spoiled_at_exit[ctx] = exc.code in STICKY_ERRORS
                if self.spoiled_at_exit[ctx]:
                    log.info("the client's context of device %d met a sticky error (%s)", dev, exc)
        return 0 if self.spoiled_at_exit.get(ctx) else ctx

    def spoiled(self) -> bool:
        """Whether a sticky error spoiled one of this process's primary contexts (known at its exit)."""
        return any(self.exit_context(dev) != self.primary_context(dev) for dev in self.primary)

    def primary_context(self, dev: int) -> int:
        """This process's primary context of `dev`, 0 while it has none."""
        primary = self.primary.get(dev)
        return primary.ctx if primary is not None else 0

    def set_context(self, call: Call, ins: tuple):
        (ctx,) = ins
        try:
            self.session._check(call, ins)
        except CudaError:  # a context gone (or never made): the client holds it current all the same
            self.session.executor.set_context(0)
            self.session.ctx, self.destroyed_current = 0, ctx
            raise
        self.session.executor.set_context(ctx)
        self.session.ctx = ctx
        self.destroyed_current = 0

    def _primary(self, dev: int) -> Primary:
        return self.primary.setdefault(self._device(dev), Primary())

    def _device(self, dev: int) -> int:
        if not 0 <= dev < len(self.session.lease.limits):
            raise CudaError(CUresult.INVALID_DEVICE, "device ordinal")
        return dev

    def primary_ctx_retain(self, call: Call, ins: tuple):
        (dev,) = ins
        primary = self._primary(dev)
        if not primary.ctx:  # the process's first retain (or the first since a release to zero or a reset)
            primary.ctx = self._made(self.session.executor.cuCtxCreate(primary.flags, dev), dev)
        primary.retains += 1
        return struct.pack("<Q", primary.ctx), b""

    def primary_ctx_release(self, call: Call, ins: tuple):
        """As the driver: the last release destroys the context, and its memory with it."""
        (dev,) = ins
        primary = self._primary(dev)
        if not primary.retains:
            raise CudaError(INVALID_CONTEXT, "the primary context is not retained")
        primary.retains -= 1
        if not primary.retains:
            self._primary_destroy(primary)

    def primary_ctx_state(self, call: Call, ins: tuple):
        (dev,) = ins
        primary = self._primary(dev)
        return struct.pack("<Ii", primary.flags, int(primary.retains > 0)), b""

    def primary_ctx_set_flags(self, call: Call, ins: tuple):
        """The flags the context is created with (the driver's _v2 takes them while it is active too)."""
        dev, flags = ins
        primary = self._primary(dev)
        if flags & ~PRIMARY_FLAGS or flags & SCHED_MASK not in SCHED_POLICIES:
            raise CudaError(INVALID_VALUE, f"primary context flags 0x{flags:x}")
        primary.flags = flags

    def primary_ctx_reset(self, call: Call, ins: tuple):
        """Destroys this process's primary context and all its memory; the next retain makes a new one."""
        (dev,) = ins
        primary = self._primary(dev)
        if primary.ctx:
            self._primary_destroy(primary)
        primary.retains = 0

    def _primary_destroy(self, primary: Primary) -> None:
        ctx, primary.ctx = primary.ctx, 0
        self.destroy_context(ctx)

    def _made(self, ctx: int, dev: int) -> int:
        self.session.lease.handles["ctx"].add(ctx)
        self.session.lease.ctx_device[ctx] = dev
        if ctx == self.destroyed_current:  # the value the client still has current here
            self.session.executor.set_context(ctx)
            self.session.ctx, self.destroyed_current = ctx, 0
        return ctx

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

    def stream_ctx_v2(self, call: Call, ins: tuple):
        self.session._check(call, ins)
        return struct.pack("<QQ", self.session.executor.cuStreamGetCtx(ins[0]), 0), b""

    def create(self, call: Call, ins: tuple):
        flags, dev = ins
        ctx = self._made(self.session.executor.cuCtxCreate(flags, self._device(dev)), dev)
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
        if session.ctx == ctx:  # its asynchronous error, not yet reported, went with it
            session.ctx, self.destroyed_current, session.pending = 0, ctx, 0
