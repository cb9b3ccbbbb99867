"""The guard's green contexts: partitions of a device's SMs, kept within the lease's own share of the GPU.

A lease with an SM share (an MPS partition: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE in the worker's
environment) sees, as a device's or a context's SM resource, a partition of that many SMs split off the
device's by the driver, so every split of it and every green context made from it stays within the share;
a descriptor naming more SMs than the share, or a split asking for more than its input holds, is refused
before the driver sees it. A whole-GPU lease sees the GPU's SMs. Resources, descriptors and green
contexts are handles of the lease (`devres`, `resdesc`, `greenctx`), a green context's CUcontext and the
streams made in it are the lease's contexts and streams; a connection's green contexts go when it closes.
Execution affinity is not offered at context creation; a context's affinity reads as its SM count.
"""

from __future__ import annotations

import logging
import os
import struct
from dataclasses import dataclass
from typing import ClassVar

from virtualize.common._calls import Call
from virtualize.common._results import CUresult
from virtualize.server._executor import INVALID_CONTEXT, CudaError
from virtualize.server._guard_concern import EMPTY, Concern

log = logging.getLogger("gpupool.worker")

RESOURCE_TYPE_SM = 1  # CU_DEV_RESOURCE_TYPE_SM, the only kind CUDA 12.4 to 13.0 has
MULTIPROCESSOR_COUNT = 16  # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
AFFINITY_SM_COUNT = 0  # CU_EXEC_AFFINITY_TYPE_SM_COUNT
SHARE_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"  # the lease's SM share, set by the pool (server/workers.py)
GROUP = struct.Struct("<QIII")  # a split's group on the wire: id, smCount, minSmPartitionSize, alignment
# CU_DEV_SM_RESOURCE_GROUP_PARAMS (CUDA 13.1): smCount, coscheduledSmCount, preferredCoscheduledSmCount,
# flags, localityDomainId, 11 reserved words.
GROUP_PARAMS = struct.Struct("<5I44x")
MAX_STRUCTURED_GROUPS = 256  # what the shim sends at most (shim_green.c)
MAX_DESC_RESOURCES = 64  # what the shim sends at most (shim_green.c)


def share_percent() -> int:
    """The lease's share of each GPU's SMs, in percent (100: the whole GPU)."""
    try:
        value = int(os.environ.get(SHARE_ENV, "100"))
    except ValueError:
        return 100
    return min(max(value, 1), 100)


def share_sms(total: int, min_partition: int, alignment: int, percent: int) -> int:
    """The SMs of a `percent` share of `total`: whole co-scheduled groups, at least the smallest partition
    the driver makes (MPS still holds the lease to its share of threads below that)."""
    if percent >= 100:
        return total
    sms = total * percent // 100
    sms -= sms % max(alignment, 1)
    return min(total, max(sms, min_partition))


@dataclass(frozen=True)
class Resource:
    """A resource of the lease as the worker knows it: its device and SM fields."""

    device: int
    sm_count: int
    min_partition: int
    alignment: int

    def wire(self, rid: int) -> bytes:
        return GROUP.pack(rid, self.sm_count, self.min_partition, self.alignment)


class GreenCalls(Concern):
    """Device resources, their splits and descriptors, and the green contexts made from them."""

    CALLS: ClassVar[dict[str, str]] = {
        "cuDeviceGetDevResource": "device_resource",
        "cuCtxGetDevResource": "context_resource",
        "cuGreenCtxGetDevResource": "green_resource",
        "cuStreamGetDevResource": "stream_resource",
        "cuDevSmResourceSplitByCount": "split",
        "cuDevSmResourceSplit": "split_structured",
        "cuDevResourceGenerateDesc": "generate_desc",
        "cuGreenCtxCreate": "create",
        "cuGreenCtxDestroy": "destroy",
        "cuCtxFromGreenCtx": "context_of",
        "cuDeviceGetExecAffinitySupport": "affinity_support",
        "cuCtxGetExecAffinity": "affinity",
    }

    def __init__(self, session) -> None:
        super().__init__(session)
        self.created: set[int] = set()  # green contexts made on this connection, destroyed when it closes

    # The lease's records, shared by its connections (LeaseState.green): id -> Resource of each resource
    # and descriptor, green context -> its device, green context -> its CUcontext.
    @property
    def resources(self) -> dict[int, Resource]:
        return self.session.lease.green["devres"]

    @property
    def descs(self) -> dict[int, Resource]:
        return self.session.lease.green["resdesc"]

    @property
    def greens(self) -> dict[int, Resource]:
        return self.session.lease.green["greenctx"]

    def _keep(self, kind: str, rid: int, resource: Resource) -> None:
        self.session.lease.handles[kind].add(rid)
        self.session.lease.green[kind][rid] = resource

    def _answer(self, rid: int, resource: Resource):
        return struct.pack("<QIII", rid, resource.sm_count, resource.min_partition, resource.alignment), b""

    def _device_ordinal(self, dev: int) -> int:
        if not 0 <= dev < len(self.session.lease.limits):
            raise CudaError(CUresult.INVALID_DEVICE, "device ordinal")
        return dev

    def _share_of(self, dev: int) -> tuple[int, Resource]:
        """The lease's SM resource of `dev`: the device's own, or a partition of the share split off it
        (made once per device and kept: asking again gives the same resource)."""
        lease = self.session.lease
        with lease.lock:
            kept = lease.device_resource.get(dev)
        if kept is not None:
            return kept, self.resources[kept]
        executor = self.session.executor
        rid, total, min_partition, alignment = executor.cuDeviceGetDevResource(dev, RESOURCE_TYPE_SM)
        # The share is of the GPU's SMs (its attribute): a resource the driver already limited to the
        # MPS partition is not cut again.
        gpu_sms = max(total, executor.cuDeviceGetAttribute(MULTIPROCESSOR_COUNT, dev))
        sms = share_sms(gpu_sms, min_partition, alignment, share_percent())
        if sms < total:  # one group of the share's SMs; the rest stays with the GPU's other tenants
            groups, _ = executor.sm_split(rid, 1, 0, sms, False)
            rid, total, min_partition, alignment = groups[0]
            log.info("device %d: the lease's SM resource is %d SMs of its share", dev, total)
        resource = Resource(dev, total, min_partition, alignment)
        with lease.lock:
            self._keep("devres", rid, resource)
            lease.device_resource[dev] = rid
        return rid, resource

    @staticmethod
    def _sm_type(kind: int) -> None:
        if kind != RESOURCE_TYPE_SM:
            raise CudaError(CUresult.INVALID_RESOURCE_TYPE, f"resource type {kind}")

    def device_resource(self, call: Call, ins: tuple):
        dev, kind = ins
        self._sm_type(kind)
        return self._answer(*self._share_of(self._device_ordinal(dev)))

    def context_resource(self, call: Call, ins: tuple):
        ctx, kind = ins
        self.session._check(call, ins)
        self._sm_type(kind)
        return self._context_resource(ctx)

    def _context_resource(self, ctx: int):
        """A green context's CUcontext has the green context's SMs; any other context the lease's share."""
        ctx = ctx or self.session.ctx
        if not ctx:
            raise CudaError(INVALID_CONTEXT, "no current context")
        green = next((g for g, c in self.session.lease.green_context.items() if c == ctx), None)
        if green is not None:
            return self._green_resource(green)
        return self._answer(*self._share_of(self.session.lease.ctx_device[ctx]))

    def affinity(self, call: Call, ins: tuple):
        """cuCtxGetExecAffinity: the current context's SM count (CU_EXEC_AFFINITY_TYPE_SM_COUNT, the only
        type), as its SM resource says."""
        (kind,) = ins
        if kind != AFFINITY_SM_COUNT:
            raise CudaError(CUresult.INVALID_VALUE, f"execution affinity type {kind}")
        packed, _ = self._context_resource(0)
        return struct.pack("<I", GROUP.unpack(packed)[1]), b""

    def green_resource(self, call: Call, ins: tuple):
        green, kind = ins
        self.session._check(call, ins)
        self._sm_type(kind)
        return self._green_resource(green)

    def stream_resource(self, call: Call, ins: tuple):
        """cuStreamGetDevResource (CUDA 13.1): a stream made in a green context has its SMs; any other
        stream (the NULL stream: the current context's) its context's."""
        stream, kind = ins
        self.session._check(call, ins)
        self._sm_type(kind)  # the work-queue types are CUDA_ERROR_INVALID_RESOURCE_TYPE, as the driver says
        executor = self.session.executor
        green = executor.cuStreamGetGreenCtx(stream) if stream else 0
        if green:
            return self._green_resource(green)
        return self._context_resource(executor.cuStreamGetCtx(stream) if stream else 0)

    def _green_resource(self, green: int):
        rid, sms, min_partition, alignment = self.session.executor.cuGreenCtxGetDevResource(
            green, RESOURCE_TYPE_SM
        )
        resource = Resource(self.greens[green].device, sms, min_partition, alignment)
        with self.session.lease.lock:
            self._keep("devres", rid, resource)
        return self._answer(rid, resource)

    def split(self, call: Call, ins: tuple):
        """cuDevSmResourceSplitByCount of one of the lease's resources: no group larger than it."""
        rid, nb_groups, flags, min_count, count_only = ins
        self.session._check(call, ins)
        source = self.resources[rid]
        if min_count > source.sm_count:
            raise CudaError(
                CUresult.INVALID_RESOURCE_CONFIGURATION,
                f"groups of {min_count} SMs from a resource of {source.sm_count} (the lease's share)",
            )
        groups, remaining = self.session.executor.sm_split(rid, nb_groups, flags, min_count, bool(count_only))
        if count_only:
            return call.out_struct.pack(remaining, 0, 0, 0, 0), b""
        bulk = self._keep_split(source, groups, remaining)
        return call.out_struct.pack(len(groups), *remaining), bulk

    def _keep_split(self, source, groups, remaining) -> bytes:
        """The resources a split made of `source` kept as the lease's (each group, and the remainder if
        any); the groups' wire records."""
        bulk = b""
        with self.session.lease.lock:
            for g, sms, min_partition, alignment in groups:
                resource = Resource(source.device, sms, min_partition, alignment)
                self._keep("devres", g, resource)
                bulk += resource.wire(g)
            r_id, r_sms, r_min, r_align = remaining
            if r_id:
                self._keep("devres", r_id, Resource(source.device, r_sms, r_min, r_align))
        return bulk

    def split_structured(self, call: Call, ins: tuple):
        """cuDevSmResourceSplit (CUDA 13.1) of one of the lease's resources: no group asking for more SMs
        than it has (the driver splits only what it is given: the groups stay within the lease's share)."""
        rid, nb_groups, flags, want_groups = ins
        self.session._check(call, ins)
        raw = bytes(self.session.channel.read_bulk(limit=GROUP_PARAMS.size * MAX_STRUCTURED_GROUPS))
        if not 0 < nb_groups <= MAX_STRUCTURED_GROUPS or len(raw) != GROUP_PARAMS.size * nb_groups:
            raise CudaError(CUresult.INVALID_VALUE, "group parameters")
        source = self.resources[rid]
        asked = max(GROUP_PARAMS.unpack_from(raw, i * GROUP_PARAMS.size)[0] for i in range(nb_groups))
        if asked > source.sm_count:
            raise CudaError(
                CUresult.INVALID_RESOURCE_CONFIGURATION,
                f"a group of {asked} SMs from a resource of {source.sm_count} (the lease's share)",
            )
        groups, remaining, params = self.session.executor.sm_split_structured(
            rid, nb_groups, flags, raw, bool(want_groups)
        )
        bulk = params + self._keep_split(source, groups, remaining)
        return call.out_struct.pack(*remaining), bulk

    def generate_desc(self, call: Call, ins: tuple):
        """A descriptor of the lease's resources of one device, together no more SMs than its share."""
        (count,) = ins
        data = self.session.channel.read_bulk(limit=8 * MAX_DESC_RESOURCES)
        if not 0 < count <= MAX_DESC_RESOURCES or len(data) != 8 * count:
            raise CudaError(CUresult.INVALID_VALUE, "resources")
        rids = list(dict.fromkeys(struct.unpack(f"<{count}Q", data)))
        if any(r not in self.session.lease.handles["devres"] for r in rids):
            raise CudaError(CUresult.INVALID_HANDLE, "not a device resource of this lease")
        chosen = [self.resources[r] for r in rids]
        devices = {r.device for r in chosen}
        if len(devices) != 1:
            raise CudaError(CUresult.INVALID_RESOURCE_CONFIGURATION, "resources of several devices")
        (dev,) = devices
        total = sum(r.sm_count for r in chosen)
        share = self._share_of(dev)[1].sm_count
        if total > share:
            raise CudaError(
                CUresult.INVALID_RESOURCE_CONFIGURATION,
                f"{total} SMs, more than the lease's share of device {dev} ({share})",
            )
        desc = self.session.executor.resource_desc(rids)
        with self.session.lease.lock:
            self._keep("resdesc", desc, Resource(dev, total, chosen[0].min_partition, chosen[0].alignment))
        return struct.pack("<Q", desc), b""

    def create(self, call: Call, ins: tuple):
        desc, dev, flags = ins
        self.session._check(call, ins)
        self._device_ordinal(dev)
        if self.descs[desc].device != dev:
            raise CudaError(CUresult.INVALID_DEVICE, "a descriptor of another device")
        green = self.session.executor.cuGreenCtxCreate(desc, dev, flags)
        with self.session.lease.lock:
            self._keep("greenctx", green, self.descs[desc])
        self.created.add(green)
        return struct.pack("<Q", green), b""

    def context_of(self, call: Call, ins: tuple):
        (green,) = ins
        self.session._check(call, ins)
        lease = self.session.lease
        ctx, dev = self.session.executor.cuCtxFromGreenCtx(green)
        with lease.lock:
            lease.handles["ctx"].add(ctx)
            lease.ctx_device[ctx] = dev
            lease.green_context[green] = ctx
        return struct.pack("<Qi", ctx, dev), b""

    def destroy(self, call: Call, ins: tuple):
        (green,) = ins
        self.session._check(call, ins)
        self.destroy_green(green)
        return EMPTY

    def destroy_green(self, green: int) -> None:
        lease = self.session.lease
        self.session.executor.cuGreenCtxDestroy(green)
        self.created.discard(green)
        with lease.lock:
            lease.handles["greenctx"].discard(green)
            lease.green["greenctx"].pop(green, None)
            ctx = lease.green_context.pop(green, None)
            if ctx is not None:
                lease.handles["ctx"].discard(ctx)
                lease.ctx_device.pop(ctx, None)
        if ctx is not None and self.session.ctx == ctx:
            self.session.ctx = 0

    def affinity_support(self, call: Call, ins: tuple):
        """Execution affinity is not offered (cuCtxCreate_v3's is refused): green contexts are the way to
        a part of the lease's SMs."""
        _, dev = ins
        self._device_ordinal(dev)
        return struct.pack("<i", 0), b""

    def close(self) -> None:
        """The client is gone: the green contexts it made go."""
        for green in list(self.created):
            try:
                self.destroy_green(green)
            except CudaError as exc:
                log.warning("could not destroy green context 0x%x after the client left: %s", green, exc)
