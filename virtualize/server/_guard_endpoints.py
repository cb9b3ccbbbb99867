"""The guard's logical endpoints (CUDA 13.3, `cuLogicalEndpoint*`): ids a process reserves, endpoints it
creates on them over the lease's own GPUs, bound only to memory of the lease, as its multicast objects are
(`_guard_multicast`). None is shared with another process or node: an endpoint's IPC handle types must be
none, and export and import are refused (the census says why). A process's endpoints are destroyed and its
ids released when it goes.
"""

from __future__ import annotations

import logging
import struct
from typing import ClassVar

from virtualize.common._calls import Call
from virtualize.common._results import CUresult
from virtualize.server._executor import FABRIC_COPY, INVALID_VALUE, CudaError
from virtualize.server._guard_concern import EMPTY, Concern
from virtualize.server._guard_multicast import lease_device, lease_range

log = logging.getLogger("gpupool.worker")

# CUlogicalEndpointProp: type, the unicast owner device or the multicast team's device count, size,
# ipcHandleTypes, flags.
ENDPOINT_PROP = struct.Struct("<IiQII")
UNICAST, MULTICAST = 1, 2  # CUlogicalEndpointType
POINTER, LOGICAL_ENDPOINT = 0, 1  # CUfabricCpyOperandType
MAX_FABRIC_COPIES = 4096  # operations one batch carries at most (the shim's limit too)
MAX_IDS = 1 << 16  # ids one process reserves at most


class EndpointCalls(Concern):
    """One connection's logical endpoint ids and endpoints."""

    CALLS: ClassVar[dict[str, str]] = {
        "cuLogicalEndpointIdReserve": "reserve",
        "cuLogicalEndpointIdRelease": "release",
        "cuLogicalEndpointCreate": "create",
        "cuLogicalEndpointAddDevice": "add_device",
        "cuLogicalEndpointDestroy": "destroy",
        "cuLogicalEndpointBindAddr": "bind_address",
        "cuLogicalEndpointBindMem": "bind_memory",
        "cuLogicalEndpointUnbind": "unbind",
        "cuLogicalEndpointGetLimits": "limits",
        "cuLogicalEndpointQuery": "query",
        "cuFabricCpyBatchAsync": "fabric_copies",
    }

    def __init__(self, session) -> None:
        super().__init__(session)
        self.reserved: dict[int, int] = {}  # base id -> count, of the ranges this process reserved
        self.sizes: dict[int, int] = {}  # endpoint this process created -> its size per device

    def _prop(self) -> tuple[int, int, int, int]:
        """The properties: type, owner device or team size (the lease's devices), size, flags."""
        raw = self.session.channel.read_bulk(limit=ENDPOINT_PROP.size)
        if len(raw) != ENDPOINT_PROP.size:
            raise CudaError(INVALID_VALUE, "CUlogicalEndpointProp")
        kind, devices, size, handle_types, flags = ENDPOINT_PROP.unpack(raw)
        if handle_types:
            raise CudaError(CUresult.NOT_SUPPORTED, "a logical endpoint shared with other processes or nodes")
        if kind == UNICAST:
            lease_device(self.session, devices)
        elif kind == MULTICAST:
            if not 1 <= devices <= len(self.session.lease.limits):
                raise CudaError(INVALID_VALUE, f"an endpoint over {devices} devices: the lease has fewer")
        else:
            raise CudaError(INVALID_VALUE, f"logical endpoint type {kind}")
        return kind, devices, size, flags

    def _ids(self, base: int, count: int) -> None:
        """`count` ids from `base`, all in ranges this process reserved."""
        if not count or not all(
            any(b <= i < b + n for b, n in self.reserved.items()) for i in range(base, base + count)
        ):
            raise CudaError(INVALID_VALUE, "logical endpoint ids this process did not reserve")

    def _endpoint(self, le: int, offset: int = 0, size: int = 0) -> None:
        """`le` an endpoint this process created; [offset, offset + size) within its size."""
        if le not in self.sizes:
            raise CudaError(INVALID_VALUE, "not a logical endpoint this process created")
        if offset + size > self.sizes[le]:
            raise CudaError(INVALID_VALUE, "past the logical endpoint's end")

    def reserve(self, call: Call, ins: tuple):
        (count,) = ins
        if not 0 < count <= MAX_IDS - sum(self.reserved.values()):
            raise CudaError(INVALID_VALUE, f"{count} logical endpoint ids (at most {MAX_IDS} a process)")
        base = self.session.executor.cuLogicalEndpointIdReserve(count)
        self.reserved[base] = count
        return struct.pack("<I", base), b""

    def release(self, call: Call, ins: tuple):
        base, count = ins
        if self.reserved.get(base) != count:
            raise CudaError(INVALID_VALUE, "not a range of logical endpoint ids this process reserved")
        if any(base <= le < base + count for le in self.sizes):
            raise CudaError(INVALID_VALUE, "the range still has endpoints: destroy them first")
        self.session.executor.cuLogicalEndpointIdRelease(base, count)
        del self.reserved[base]
        return EMPTY

    def create(self, call: Call, ins: tuple):
        (le,) = ins
        self._ids(le, 1)
        if le in self.sizes:
            raise CudaError(INVALID_VALUE, "the id already has an endpoint")
        kind, devices, size, flags = self._prop()
        self.session.executor.cuLogicalEndpointCreate(le, kind, devices, size, flags)
        self.sizes[le] = size
        return EMPTY

    def add_device(self, call: Call, ins: tuple):
        le, dev = ins
        self._endpoint(le)
        self.session.executor.cuLogicalEndpointAddDevice(le, lease_device(self.session, dev))
        return EMPTY

    def destroy(self, call: Call, ins: tuple):
        (le,) = ins
        self._endpoint(le)
        self.session.executor.cuLogicalEndpointDestroy(le)
        del self.sizes[le]
        return EMPTY

    def bind_address(self, call: Call, ins: tuple):
        """Memory of the lease at `ptr` (mapped by this process, or allocated), bound at `offset`."""
        le, dev, offset, ptr, size, flags = ins
        self._endpoint(le, offset, size)
        lease_range(self.session, ptr, size)
        self.session.executor.cuLogicalEndpointBindAddr(
            le, lease_device(self.session, dev), offset, ptr, size, flags
        )
        return EMPTY

    def bind_memory(self, call: Call, ins: tuple):
        """Memory this process created (cuMemCreate), from `mem_offset`, bound at `offset`."""
        le, dev, offset, memory, mem_offset, size, flags = ins
        self._endpoint(le, offset, size)
        held = self.session.vm_handles.get(memory)
        if held is None or not size or mem_offset + size > held[0]:
            raise CudaError(INVALID_VALUE, "not memory this process created, or past its end")
        self.session.executor.cuLogicalEndpointBindMem(
            le, lease_device(self.session, dev), offset, memory, mem_offset, size, flags
        )
        return EMPTY

    def unbind(self, call: Call, ins: tuple):
        le, dev, offset, size = ins
        self._endpoint(le, offset, size)
        self.session.executor.cuLogicalEndpointUnbind(le, lease_device(self.session, dev), offset, size)
        return EMPTY

    def limits(self, call: Call, ins: tuple):
        kind, devices, size, flags = self._prop()
        return call.out_struct.pack(
            *self.session.executor.cuLogicalEndpointGetLimits(kind, devices, size, flags)
        ), b""

    def query(self, call: Call, ins: tuple):
        le, count = ins
        self._ids(le, count)
        return struct.pack("<i", self.session.executor.cuLogicalEndpointQuery(le, count)), b""

    def fabric_copies(self, call: Call, ins: tuple):
        """cuFabricCpyBatchAsync: each operand memory of the lease (a pointer and `size` bytes from it) or
        an endpoint this process created (the offset and `size` within it), or none is sent."""
        self.session._check(call, ins)
        count, flags, stream = ins
        raw = self.session.channel.read_bulk(limit=MAX_FABRIC_COPIES * FABRIC_COPY.size)
        if not 1 <= count <= MAX_FABRIC_COPIES or len(raw) != count * FABRIC_COPY.size:
            raise CudaError(INVALID_VALUE, "fabric copy operations")
        operations = list(FABRIC_COPY.iter_unpack(raw))
        for src_type, src, src_at, dst_type, dst, dst_at, size, _ in operations:
            for kind, first, second in ((src_type, src, src_at), (dst_type, dst, dst_at)):
                if kind == POINTER:
                    lease_range(self.session, first, size)
                elif kind == LOGICAL_ENDPOINT:
                    self._endpoint(first & 0xFFFFFFFF, second, size)
                else:
                    raise CudaError(INVALID_VALUE, f"fabric copy operand type {kind}")
        self.session.executor.cuFabricCpyBatchAsync(operations, flags, stream)
        return EMPTY

    def close(self) -> None:
        """The client is gone: its endpoints are destroyed and its ids released."""
        executor = self.session.executor
        for le in list(self.sizes):
            try:
                executor.cuLogicalEndpointDestroy(le)
            except CudaError as exc:
                log.warning("logical endpoint %d left by a client: %s", le, exc)
        for base, count in list(self.reserved.items()):
            try:
                executor.cuLogicalEndpointIdRelease(base, count)
            except CudaError as exc:
                log.warning("logical endpoint ids %d+%d left by a client: %s", base, count, exc)
        self.sizes.clear()
        self.reserved.clear()
