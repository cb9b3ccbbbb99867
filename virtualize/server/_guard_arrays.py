"""The guard's CUDA arrays, mipmapped arrays, copies in rows and slices (gpMemcpy3D), textures and
surfaces: one connection's arrays (counted against the partition, destroyed when the client leaves),
and the check that every array, texture resource and row a call names is the lease's.
"""

from __future__ import annotations

import logging
import struct
from typing import ClassVar

from virtualize.common import _wire
from virtualize.common._calls import CALLS, Call
from virtualize.common._results import CUresult
from virtualize.server._arrays import (
    ARRAY,
    ARRAY_MAP_INFO,
    DEVICE,
    HOST,
    RESOURCE_DESC_BYTES,
    TEXTURE_DESC_BYTES,
    VIEW_DESC_BYTES,
    ArrayShape,
    array_mappings,
    resource,
)
from virtualize.server._executor import INVALID_HANDLE, INVALID_VALUE, CopySide, CudaError
from virtualize.server._guard_concern import Concern

log = logging.getLogger("gpupool.worker")
MAX_MAP_INFOS = 1024  # tile mappings of one cuMemMapArrayAsync (the shim's limit too)

DESTROY_CALL = {  # the call that destroys an array of each kind (a client's leftovers, at its end)
    "array": next(c for c in CALLS if c.name == "cuArrayDestroy"),
    "mipmap": next(c for c in CALLS if c.name == "cuMipmappedArrayDestroy"),
}


class ArrayCalls(Concern):
    """One connection's arrays and the calls about arrays, textures and surfaces."""

    # call (exported symbol, or an internal call's name) -> the method that serves it
    CALLS: ClassVar[dict[str, str]] = {
        "cuArrayCreate_v2": "create",
        "cuArray3DCreate_v2": "create",
        "cuMipmappedArrayCreate": "create",
        "cuArrayDestroy": "destroy",
        "cuMipmappedArrayDestroy": "destroy",
        "cuArrayGetDescriptor_v2": "descriptor",
        "cuArray3DGetDescriptor_v2": "descriptor",
        "cuMipmappedArrayGetLevel": "sub_array",
        "cuArrayGetPlane": "sub_array",
        "cuArrayGetSparseProperties": "object_descriptor",
        "cuMipmappedArrayGetSparseProperties": "object_descriptor",
        "cuArrayGetMemoryRequirements": "object_descriptor",
        "cuMipmappedArrayGetMemoryRequirements": "object_descriptor",
        "cuMemMapArrayAsync": "map_tiles",
        "gpMemcpy3D": "copy_3d",
        "cuTexObjectCreate": "texture_object",
        "cuSurfObjectCreate": "surface_object",
        "cuTexObjectGetResourceDesc": "object_descriptor",
        "cuTexObjectGetTextureDesc": "object_descriptor",
        "cuTexObjectGetResourceViewDesc": "object_descriptor",
        "cuSurfObjectGetResourceDesc": "object_descriptor",
        "cuTexRefSetAddress2D_v3": "texture_reference_2d",
    }

    def __init__(self, session) -> None:
        super().__init__(session)
        # array or mipmap -> (kind, bytes, device, ctx)
        self.arrays: dict[int, tuple[str, int, int, int]] = {}

    def create(self, call: Call, ins: tuple):
        """cuArrayCreate / cuArray3DCreate / cuMipmappedArrayCreate: counted against the partition (a
        mipmapped array at twice its first level, more than its levels take)."""
        raw = self.session.channel.read_bulk(limit=64)
        shape = ArrayShape.from_2d(raw) if call.name == "cuArrayCreate" else ArrayShape.from_3d(raw)
        mipmapped = call.name == "cuMipmappedArrayCreate"
        size, device = shape.nbytes * (2 if mipmapped else 1), self.session._device()
        self.session.lease.take(device, size)
        try:
            if mipmapped:
                handle = self.session.executor.cuMipmappedArrayCreate(shape, ins[0])
            else:
                handle = self.session.executor.cuArray3DCreate(shape)
        except BaseException:
            self.session.lease.give_back(device, size)
            raise
        kind = "mipmap" if mipmapped else "array"
        self.session.lease.handles[kind].add(handle)
        self.arrays[handle] = (kind, size, device, self.session.ctx)
        return struct.pack("<Q", handle), b""

    def destroy(self, call: Call, ins: tuple):
        self.session._check(call, ins)
        (handle,) = ins
        if handle not in self.arrays:
            raise CudaError(INVALID_VALUE, "not an array this process created")  # a mipmap's level, say
        kind, size, device, _ = self.arrays[handle]
        getattr(self.session.executor, call.name)(handle)
        del self.arrays[handle]
        self.session.lease.handles[kind].discard(handle)
        for level in self.session.lease.children.pop(handle, ()):
            self.session.lease.handles["array"].discard(level)
        self.session.lease.give_back(device, size)

    def descriptor(self, call: Call, ins: tuple):
        self.session._check(call, ins)
        shape = self.session.executor.cuArray3DGetDescriptor(ins[0])
        return b"", shape.pack_2d() if call.name == "cuArrayGetDescriptor" else shape.pack_3d()

    def sub_array(self, call: Call, ins: tuple):
        """A mipmapped array's level or an NV12 array's plane: an array of the lease, gone with its own."""
        self.session._check(call, ins)
        handle, index = ins
        array = getattr(self.session.executor, call.name)(handle, index)
        self.session.lease.handles["array"].add(array)
        self.session.lease.children.setdefault(handle, set()).add(array)
        return struct.pack("<Q", array), b""

    def close(self) -> None:
        """The client is gone: destroy the arrays it left, in the contexts they were made in."""
        for handle, (kind, _size, _device, ctx) in list(self.arrays.items()):
            try:
                self.session.executor.set_context(ctx)
                self.destroy(DESTROY_CALL[kind], (handle,))
            except CudaError as exc:
                log.warning("could not destroy the client's %s 0x%x: %s", kind, handle, exc)

    def _copy_side(self, side: CopySide, width: int, height: int, depth: int) -> None:
        """Host rows come packed; device rows must lie in the lease's memory; an array must be the lease's
        (its driver refuses rows outside it)."""
        if side.kind == HOST:
            if (side.x, side.y, side.z, side.pitch, side.height) != (0, 0, 0, width, height):
                raise CudaError(INVALID_VALUE, "host rows travel packed")
        elif side.kind == DEVICE:
            rows = side.height if depth > 1 or side.z else height
            if ((height > 1 or depth > 1) and side.pitch < width) or (depth > 1 and rows < height):
                raise CudaError(INVALID_VALUE, "a pitch shorter than a row, or a slice shorter than the copy")
            start = side.at + (side.z * rows + side.y) * side.pitch + side.x
            self.session._check_range(
                start, (depth - 1) * rows * side.pitch + (height - 1) * side.pitch + width
            )
        elif side.kind == ARRAY:
            if side.at not in self.session.lease.handles["array"]:
                raise CudaError(INVALID_HANDLE, "array")
        else:
            raise CudaError(INVALID_VALUE, f"memory type {side.kind}")

    def copy_3d(self, call: Call, ins: tuple):
        """gpMemcpy3D: a host source's rows from the request, a host destination's into the reply."""
        self.session._check(call, ins)
        kinds, *sides, width, height, depth, stream, flags = ins
        src = CopySide(kinds & 0xFF, *sides[:6])
        dst = CopySide(kinds >> 8, *sides[6:])
        if not width or not height or not depth:
            raise CudaError(INVALID_VALUE, "an empty copy")
        for side in (src, dst):
            self._copy_side(side, width, height, depth)
        packed = width * height * depth
        data = None
        if src.kind == HOST:
            data = self.session.channel.read_bulk(limit=_wire.MAX_SMALL_BULK_BYTES)
            if len(data) != packed:
                raise CudaError(INVALID_VALUE, "the host rows' bytes")
        elif dst.kind == HOST and packed > _wire.MAX_SMALL_BULK_BYTES:
            raise CudaError(INVALID_VALUE, "a copy to the host of more than the reply can carry")
        out = self.session.executor.copy_3d(
            src, dst, (width, height, depth), stream if flags & 1 else None, data
        )
        return b"", bytes(out) if dst.kind == HOST else b""

    def _resource(self, raw: bytes) -> None:
        """What a resource descriptor names must be the lease's: an array, a mipmapped array, memory."""
        named = resource(raw)
        if named.kind in (0, 1):
            if named.handle not in self.session.lease.handles["array" if named.kind == 0 else "mipmap"]:
                raise CudaError(INVALID_HANDLE, "the resource's array")
        else:
            self.session._check_range(named.handle, named.size)

    def texture_object(self, call: Call, ins: tuple):
        """cuTexObjectCreate: the resource, texture and (optional) view descriptors, one after another."""
        raw = self.session.channel.read_bulk(limit=RESOURCE_DESC_BYTES + TEXTURE_DESC_BYTES + VIEW_DESC_BYTES)
        texture_at, view_at = RESOURCE_DESC_BYTES, RESOURCE_DESC_BYTES + TEXTURE_DESC_BYTES
        if len(raw) not in (view_at, view_at + VIEW_DESC_BYTES):
            raise CudaError(INVALID_VALUE, "texture descriptors")
        self._resource(raw[:texture_at])
        tex = self.session.executor.cuTexObjectCreate(
            raw[:texture_at], raw[texture_at:view_at], raw[view_at:] or None
        )
        self.session.lease.handles["texobj"].add(tex)
        return struct.pack("<Q", tex), b""

    def surface_object(self, call: Call, ins: tuple):
        raw = self.session.channel.read_bulk(limit=RESOURCE_DESC_BYTES)
        if resource(raw).kind != 0:
            raise CudaError(INVALID_VALUE, "a surface is made over an array")
        self._resource(raw)
        surf = self.session.executor.cuSurfObjectCreate(raw)
        self.session.lease.handles["surfobj"].add(surf)
        return struct.pack("<Q", surf), b""

    def texture_reference_2d(self, call: Call, ins: tuple):
        """cuTexRefSetAddress2D: rows of `pitch` bytes of the lease's memory, as many as the descriptor has,
        each as wide as its format says."""
        self.session._check(call, ins)
        tex, ptr, pitch, width, height, format_, channels = ins
        row = ArrayShape(width, height, 0, format_, channels).row_bytes
        if not height or pitch < row:
            raise CudaError(INVALID_VALUE, "a pitch shorter than a row, or no rows")
        self.session._check_range(ptr, pitch * (height - 1) + row)
        self.session.executor.cuTexRefSetAddress2D(
            tex, ptr, pitch, ArrayShape(width, height, 0, format_, channels)
        )

    def object_descriptor(self, call: Call, ins: tuple):
        """A texture's or surface's descriptor, a sparse array's properties or an array's memory
        requirements (on a device of the lease), as the executor's driver gives it, in the reply's bulk."""
        self.session._check(call, ins)
        return b"", bytes(getattr(self.session.executor, call.name)(*ins))

    def map_tiles(self, call: Call, ins: tuple):
        """cuMemMapArrayAsync: each tile range of a sparse or deferred-mapping array of the lease mapped to
        (or unmapped from) memory a process of the lease created, on devices of the lease; nothing is sent
        to the driver unless every one is."""
        self.session._check(call, ins)
        count, stream = ins
        raw = self.session.channel.read_bulk(limit=MAX_MAP_INFOS * ARRAY_MAP_INFO.size)
        mappings = array_mappings(raw)
        if len(mappings) != count or not count:
            raise CudaError(INVALID_VALUE, "CUarrayMapInfo count")
        lease = self.session.lease
        for m in mappings:
            if m.kind not in (0, 1) or m.array not in lease.handles["array" if m.kind == 0 else "mipmap"]:
                raise CudaError(INVALID_HANDLE, "an array that is not the lease's")
            if m.operation not in (1, 2) or m.handle_type != 0:  # CU_MEM_OPERATION_TYPE_MAP / UNMAP; generic
                raise CudaError(INVALID_VALUE, "memory operation or handle type")
            if m.operation == 1 and m.memory not in lease.handles["vmem"]:
                raise CudaError(INVALID_HANDLE, "memory that is not the lease's")
            if m.devices >> len(lease.limits) or not m.devices:
                raise CudaError(CUresult.INVALID_DEVICE, "a device mask beyond the lease's devices")
        self.session.executor.cuMemMapArrayAsync(mappings, stream)
