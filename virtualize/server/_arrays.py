"""CUDA arrays' and texture resources' C structures, read from the bytes a client's shim sends.

The guard checks what they name (an array of the lease, a range of its memory) and counts an array's
bytes against the partition; the host executor emulates arrays with them. Layouts are cuda.h's.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from virtualize.server._executor import INVALID_VALUE, CudaError

ARRAY_DESCRIPTOR = struct.Struct("<QQiI")  # CUDA_ARRAY_DESCRIPTOR: width, height, format, channels
ARRAY3D_DESCRIPTOR = struct.Struct("<QQQiII4x")  # CUDA_ARRAY3D_DESCRIPTOR: ... depth, format, channels, flags
RESOURCE_DESC_BYTES, TEXTURE_DESC_BYTES, VIEW_DESC_BYTES = 144, 104, 112
SPARSE_PROPERTIES_BYTES, MEMORY_REQUIREMENTS_BYTES = (
    48,
    32,
)  # CUDA_ARRAY_SPARSE_PROPERTIES, _MEMORY_REQUIREMENTS
SPARSE, DEFERRED_MAPPING = 0x40, 0x80  # CUDA_ARRAY3D_SPARSE, CUDA_ARRAY3D_DEFERRED_MAPPING
NV12 = 0xB0  # CU_AD_FORMAT_NV12: a luma plane and a half-size chroma plane of two channels
HOST, DEVICE, ARRAY = 1, 2, 3  # CUmemorytype
# Bytes of one channel of each CUarray_format; the packed formats (UNORM_INT8X4 ...) are one channel of
# their whole element, block-compressed ones (BC1-BC7, 4x4 texels) and NV12 at most a byte per texel.
FORMAT_BYTES = {
    0x01: 1, 0x02: 2, 0x03: 4, 0x08: 1, 0x09: 2, 0x0A: 4, 0x10: 2, 0x20: 4,  # U8 U16 U32 S8 S16 S32 HALF FLOAT
    0xB0: 1,  # NV12
    0xC0: 1, 0xC1: 2, 0xC2: 4, 0xC3: 2, 0xC4: 4, 0xC5: 8,  # UNORM_INT8X1.. UNORM_INT16X4
    0xC6: 1, 0xC7: 2, 0xC8: 4, 0xC9: 2, 0xCA: 4, 0xCB: 8,  # SNORM_INT8X1.. SNORM_INT16X4
    **dict.fromkeys(range(0x91, 0xA0), 1),  # BC1-BC7 (UNORM, SRGB, SNORM, UF16, SF16)
    0x50: 4, 0x51: 4, 0x52: 4, 0x53: 4, 0x54: 4, 0x55: 4,  # 10:10:10:2, UINT 10:10:10:2, Y4xx/P01x packed
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class ArrayShape:
    """An array's descriptor: width in elements, height and depth (0: one dimension fewer)."""

    width: int
    height: int
    depth: int
    format: int
    channels: int
    flags: int = 0

    @classmethod
    def from_2d(cls, raw: bytes) -> ArrayShape:
        width, height, format_, channels = _unpack(ARRAY_DESCRIPTOR, raw)
        return cls(width, height, 0, format_, channels)

    @classmethod
    def from_3d(cls, raw: bytes) -> ArrayShape:
        return cls(*_unpack(ARRAY3D_DESCRIPTOR, raw))

    def pack_2d(self) -> bytes:
        return ARRAY_DESCRIPTOR.pack(self.width, self.height, self.format, self.channels)

    def pack_3d(self) -> bytes:
        return ARRAY3D_DESCRIPTOR.pack(
            self.width, self.height, self.depth, self.format, self.channels, self.flags
        )

    @property
    def row_bytes(self) -> int:
        if self.format not in FORMAT_BYTES or not 1 <= self.channels <= 4 or not self.width:
            raise CudaError(
                INVALID_VALUE, f"array format 0x{self.format:x} x {self.channels}, width {self.width}"
            )
        return self.width * FORMAT_BYTES[self.format] * self.channels

    @property
    def rows(self) -> int:
        return max(self.height, 1)

    @property
    def slices(self) -> int:
        return max(self.depth, 1)

    @property
    def nbytes(self) -> int:
        return self.row_bytes * self.rows * self.slices

    def level(self, n: int) -> ArrayShape:
        """Mipmap level `n`: each dimension halved n times, down to 1 (a dimension of 0 stays 0)."""
        return ArrayShape(
            *(max(d >> n, 1) if d else 0 for d in (self.width, self.height, self.depth)),
            self.format,
            self.channels,
            self.flags,
        )


def unmovable(shape: ArrayShape) -> str:
    """Why an array of this shape is not made anew on another GPU ("" where it is): its tiles are mapped
    memory, or its format's bytes are not rows of elements."""
    if shape.flags & (SPARSE | DEFERRED_MAPPING):
        return "sparse or deferred-mapping CUDA arrays (their tiles are mapped memory)"
    if shape.format == NV12 or 0x91 <= shape.format <= 0x9F or shape.format not in FORMAT_BYTES:
        return "CUDA arrays of a planar or block-compressed format"
    return ""


@dataclass(frozen=True, slots=True)
class Resource:
    """What a CUDA_RESOURCE_DESC names: an array (kind 0), a mipmapped array (1), or `size` bytes of
    device memory from `handle` (2 linear, 3 pitched 2D)."""

    kind: int
    handle: int
    size: int = 0


def resource(raw: bytes) -> Resource:
    if len(raw) < RESOURCE_DESC_BYTES:
        raise CudaError(INVALID_VALUE, "CUDA_RESOURCE_DESC")
    (kind,) = struct.unpack_from("<i", raw)
    (handle,) = struct.unpack_from("<Q", raw, 8)
    if kind in (0, 1):
        return Resource(kind, handle)
    if kind == 2:  # linear: format, channels, sizeInBytes
        return Resource(kind, handle, struct.unpack_from("<Q", raw, 24)[0])
    if kind == 3:  # pitched 2D: format, channels, width, height, pitchInBytes
        height, pitch = struct.unpack_from("<QQ", raw, 32)
        return Resource(kind, handle, height * pitch)
    raise CudaError(INVALID_VALUE, f"resource type {kind}")


def resource_mapped(raw: bytes, mapped) -> bytes:
    """A CUDA_RESOURCE_DESC with the array or mipmapped array it names as `mapped(namespace, handle)` says
    (a move re-created it); memory it names keeps its address."""
    if len(raw) < RESOURCE_DESC_BYTES:
        return raw
    (kind,) = struct.unpack_from("<i", raw)
    if kind not in (0, 1):
        return raw
    (handle,) = struct.unpack_from("<Q", raw, 8)
    return raw[:8] + struct.pack("<Q", mapped("array" if kind == 0 else "mipmap", handle)) + raw[16:]


# CUarrayMapInfo: resource type and handle, subresource type, the subresource (a sparse level's or the
# mip tail's place; not read here), memory operation and handle types, memory handle, its offset, the
# device bit mask and flags.
ARRAY_MAP_INFO = struct.Struct("<i4xQi4x32xiiQQII8x")
MAP_INFO_DEVICES = 80  # the device bit mask's offset, which the executor rewrites for its own ordinals


@dataclass(frozen=True, slots=True)
class ArrayMapping:
    """One CUarrayMapInfo: the array or mipmapped array (resource `kind` 0 or 1), map (1) or unmap (2),
    the memory handle mapped (generic handles only, `handle_type` 0), the lease devices of the mask."""

    kind: int
    array: int
    operation: int
    handle_type: int
    memory: int
    devices: int
    raw: bytes


def array_mappings(raw: bytes) -> list[ArrayMapping]:
    if len(raw) % ARRAY_MAP_INFO.size:
        raise CudaError(INVALID_VALUE, "CUarrayMapInfo list")
    found = []
    for at in range(0, len(raw), ARRAY_MAP_INFO.size):
        kind, array, _sub, operation, handle_type, memory, _offset, devices, _flags = (
            ARRAY_MAP_INFO.unpack_from(raw, at)
        )
        found.append(
            ArrayMapping(
                kind, array, operation, handle_type, memory, devices, raw[at : at + ARRAY_MAP_INFO.size]
            )
        )
    return found


def _unpack(layout: struct.Struct, raw: bytes) -> tuple:
    if len(raw) != layout.size:
        raise CudaError(INVALID_VALUE, f"an array descriptor is {layout.size} bytes")
    return layout.unpack(raw)
