"""The guard's multicast objects (NVLink SHARP, `cuMulticast*`): an object over the lease's own GPUs, bound
only to memory of the lease, mapped, given access and released as memory of the virtual memory API is
(`_executor_guard.Session`'s cuMemMap, cuMemSetAccess, cuMemRelease). None is shared with another process:
its handle types must be none, so no export names it. Also the NVLink fabric's cliques of a lease's device.
"""

from __future__ import annotations

import struct
from typing import ClassVar

from virtualize.common._calls import Call
from virtualize.common._results import CUresult
from virtualize.server._executor import INVALID_VALUE, CudaError
from virtualize.server._guard_concern import Concern

MULTICAST_PROP = struct.Struct("<I4xQQQ")  # CUmulticastObjectProp: numDevices, size, handleTypes, flags
MAX_CLIQUES = 64  # CUcliqueInfo one cuDeviceGetCliqueInfo answers at most (the shim's limit too)


def lease_device(session, dev: int) -> int:
    if not 0 <= dev < len(session.lease.limits):
        raise CudaError(CUresult.INVALID_DEVICE, f"device {dev} is not one of the lease's")
    return dev


def lease_range(session, ptr: int, size: int) -> None:
    """[ptr, ptr + size) is memory of the lease: a range this process mapped, or within an allocation."""
    if not any(m <= ptr and ptr + size <= m + n for m, n in session.vm_mapped.items()):
        session._check_range(ptr, size)


class MulticastCalls(Concern):
    """One connection's multicast objects and the calls about them."""

    CALLS: ClassVar[dict[str, str]] = {
        "cuMulticastCreate": "create",
        "cuMulticastAddDevice": "add_device",
        "cuMulticastBindMem": "bind_memory",
        "cuMulticastBindAddr": "bind_address",
        "cuMulticastUnbind": "unbind",
        "cuMulticastBindMem_v2": "bind_memory_on",
        "cuMulticastBindAddr_v2": "bind_address_on",
        "cuMulticastGetGranularity": "granularity",
        "cuDeviceGetCliqueInfo": "clique_info",
    }

    def __init__(self, session) -> None:
        super().__init__(session)
        self.sizes: dict[int, int] = {}  # multicast object this process created -> its size

    def _prop(self) -> tuple[int, int, int]:
        """The properties' device count (at most the lease's devices), size and flags."""
        raw = self.session.channel.read_bulk(limit=MULTICAST_PROP.size)
        if len(raw) != MULTICAST_PROP.size:
            raise CudaError(INVALID_VALUE, "CUmulticastObjectProp")
        devices, size, handle_types, flags = MULTICAST_PROP.unpack(raw)
        if not 1 <= devices <= len(self.session.lease.limits):
            raise CudaError(INVALID_VALUE, f"a multicast object over {devices} devices: the lease has fewer")
        if handle_types:
            raise CudaError(CUresult.NOT_SUPPORTED, "a multicast object shared with other processes")
        return devices, size, flags

    def clique_info(self, call: Call, ins: tuple):
        """cuDeviceGetCliqueInfo of one of the lease's devices: up to `capacity` CUcliqueInfo (type, id)."""
        dev, capacity = ins
        self._device(dev)
        cliques = self.session.executor.cuDeviceGetCliqueInfo(dev, min(capacity, MAX_CLIQUES))
        return call.out_struct.pack(len(cliques)), b"".join(struct.pack("<iI", *c) for c in cliques)

    def _object(self, handle: int) -> int:
        """The size of `handle`, a multicast object this process created and has not released."""
        if handle not in self.sizes or handle not in self.session.vm_handles:
            raise CudaError(INVALID_VALUE, "not a multicast object this process created")
        return self.sizes[handle]

    def _within(self, handle: int, offset: int, size: int) -> None:
        if not size or offset + size > self._object(handle):
            raise CudaError(INVALID_VALUE, "past the multicast object's end")

    def _device(self, dev: int) -> int:
        return lease_device(self.session, dev)

    def create(self, call: Call, ins: tuple):
        devices, size, flags = self._prop()
        handle = self.session.executor.cuMulticastCreate(devices, size, flags)
        # A handle of the virtual memory API from here; it counts nothing against the partition (the
        # memory bound to it does).
        self.session.vm_handles[handle] = (size, 0)
        self.session.lease.vm_hold(handle, 0, 0)
        self.sizes[handle] = size
        return struct.pack("<Q", handle), b""

    def add_device(self, call: Call, ins: tuple):
        mc, dev = ins
        self._object(mc)
        self.session.executor.cuMulticastAddDevice(mc, self._device(dev))

    def bind_memory(self, call: Call, ins: tuple):
        """Memory this process created (cuMemCreate), from `mem_offset`, bound at `mc_offset`."""
        mc, mc_offset, memory, mem_offset, size, flags = ins
        self._within(mc, mc_offset, size)
        held = self.session.vm_handles.get(memory)
        if memory in self.sizes or held is None or mem_offset + size > held[0]:
            raise CudaError(INVALID_VALUE, "not memory this process created, or past its end")
        self.session.executor.cuMulticastBindMem(mc, mc_offset, memory, mem_offset, size, flags)

    def bind_address(self, call: Call, ins: tuple):
        """Memory of the lease at `ptr` (mapped by this process, or allocated), bound at `mc_offset`."""
        mc, mc_offset, ptr, size, flags = ins
        self._within(mc, mc_offset, size)
        lease_range(self.session, ptr, size)
        self.session.executor.cuMulticastBindAddr(mc, mc_offset, ptr, size, flags)

    def bind_memory_on(self, call: Call, ins: tuple):
        """cuMulticastBindMem_v2: memory of device `dev`, which must be the memory's own device; bound as
        cuMulticastBindMem binds it."""
        mc, dev, mc_offset, memory, mem_offset, size, flags = ins
        held = self.session.vm_handles.get(memory)
        if held is not None and held[1] != self._device(dev):
            raise CudaError(CUresult.INVALID_DEVICE, f"the memory is not device {dev}'s")
        return self.bind_memory(call, (mc, mc_offset, memory, mem_offset, size, flags))

    def bind_address_on(self, call: Call, ins: tuple):
        """cuMulticastBindAddr_v2: memory of the lease at `ptr` on device `dev` (its allocation's device);
        bound as cuMulticastBindAddr binds it."""
        mc, dev, mc_offset, ptr, size, flags = ins
        held = self.session.lease.find(ptr)
        mapped = [m for m in self.session.vm_mapping_of if m <= ptr < m + self.session.vm_mapped.get(m, 0)]
        device = (
            held.device if held is not None else self.session.vm_mapping_of[mapped[0]][2] if mapped else None
        )
        if device is not None and device != self._device(dev):
            raise CudaError(CUresult.INVALID_DEVICE, f"0x{ptr:x} is not device {dev}'s memory")
        return self.bind_address(call, (mc, mc_offset, ptr, size, flags))

    def unbind(self, call: Call, ins: tuple):
        mc, dev, mc_offset, size = ins
        self._within(mc, mc_offset, size)
        self.session.executor.cuMulticastUnbind(mc, self._device(dev), mc_offset, size)

    def granularity(self, call: Call, ins: tuple):
        (option,) = ins
        devices, size, flags = self._prop()
        return struct.pack(
            "<Q", self.session.executor.cuMulticastGetGranularity(devices, size, flags, option)
        ), b""
