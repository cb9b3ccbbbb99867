"""The guard's tensor maps (cuTensorMapEncode*, cuTensorMapReplaceAddress, cuTensorMapSetAllocationClass):
the whole tensor a map describes must be the lease's memory, and a map to re-point or re-class must be one
this lease encoded (kept with its tensor's extent, per lease). Each map's recipe is kept too (what it was encoded
from, and the re-pointings and re-classings since): a move to another server's worker encodes it anew there and
checks that the target's driver gives the same bytes, which kernels hold in their parameters
(virtualize.server._migrate_state).
"""

from __future__ import annotations

import struct
from typing import ClassVar

from virtualize.common._calls import Call
from virtualize.server._executor import INVALID_VALUE, NOT_SUPPORTED, CudaError
from virtualize.server._guard_concern import Concern

TENSOR_MAP_BYTES, TENSOR_RANK_MAX = 128, 5  # CUtensorMap
# Each tensor-map call's shape arrays in the bulk, in the C order: (count as rank + offset, struct code).
TENSOR_SHAPE_ARRAYS = {
    "cuTensorMapEncodeTiled": (
        (0, "Q"),
        (-1, "Q"),
        (0, "I"),
        (0, "I"),
    ),  # dims, strides, box, element strides
    "cuTensorMapEncodeIm2col": (
        (0, "Q"),
        (-1, "Q"),
        (-2, "i"),
        (-2, "i"),
        (0, "I"),
    ),  # + lower, upper corners
    "cuTensorMapEncodeIm2colWide": ((0, "Q"), (-1, "Q"), (0, "I")),  # dims, strides, element strides
}
# Bytes of one element of each CUtensorMapDataType (the packed 4- and 6-bit types: at most one).
TENSOR_ELEMENT_BYTES = {
    0: 1,
    1: 2,
    2: 4,
    3: 4,
    4: 8,
    5: 8,
    6: 2,
    7: 4,
    8: 8,
    9: 2,
    10: 4,
    11: 4,
    12: 4,
    13: 1,
    14: 1,
    15: 1,
}
# CUtensorMapAllocClass: AUTO (the driver's conservative choice from the tensor's geometry), SMALL (a 4 KiB
# window), LARGE (a 128 KiB window that the TMA's out-of-bounds addressing may reach from the tensor's base).
ALLOC_CLASS_AUTO, ALLOC_CLASS_SMALL, ALLOC_CLASS_LARGE = 0, 1, 2
LARGE_WINDOW = 128 << 10
TENSOR_MAPS_KEPT = 65536  # maps a lease encoded, kept with their extent for cuTensorMapReplaceAddress


def tensor_extent(dtype: int, dims: list[int], strides: list[int]) -> int:
    """Bytes from a tensor's address to the end of its last element: a row of dims[0] elements, and
    dims[i] steps of strides[i-1] bytes along each other dimension."""
    if dtype not in TENSOR_ELEMENT_BYTES:
        raise CudaError(INVALID_VALUE, f"tensor data type {dtype}")
    if not all(dims):
        raise CudaError(INVALID_VALUE, "a tensor dimension of 0")
    return dims[0] * TENSOR_ELEMENT_BYTES[dtype] + sum(
        (d - 1) * s for d, s in zip(dims[1:], strides, strict=True)
    )


class TensorMapCalls(Concern):
    """Encoding tensor maps over the lease's memory, and moving them to other lease memory."""

    CALLS: ClassVar[dict[str, str]] = {
        "cuTensorMapEncodeTiled": "encode",
        "cuTensorMapEncodeIm2col": "encode",
        "cuTensorMapEncodeIm2colWide": "encode",
        "cuTensorMapReplaceAddress": "replace_address",
        "cuTensorMapSetAllocationClass": "set_allocation_class",
    }

    def encode(self, call: Call, ins: tuple):
        """cuTensorMapEncodeTiled / Im2col / Im2colWide: the shape arrays from the bulk; the whole tensor
        (its dimensions and strides from its address) must be memory of this lease; the 128 bytes go
        back as bulk, and the tensor's extent is kept for cuTensorMapReplaceAddress."""
        self.session._check(call, ins)
        dtype, rank, address = ins[:3]
        if not 1 <= rank <= TENSOR_RANK_MAX:
            raise CudaError(INVALID_VALUE, "tensor rank")
        raw = self.session.channel.read_bulk(limit=TENSOR_RANK_MAX * 24)
        arrays, at = [], 0
        for offset, code in TENSOR_SHAPE_ARRAYS[call.name]:
            n = max(rank + offset, 0)
            if at + n * struct.calcsize(code) > len(raw):
                raise CudaError(INVALID_VALUE, "tensor shape arrays")
            arrays.append(list(struct.unpack_from(f"<{n}{code}", raw, at)))
            at += n * struct.calcsize(code)
        extent = tensor_extent(dtype, arrays[0], arrays[1])
        self.session._check_range(address, extent)
        encoded = self.session.executor.tensor_map(call.name, ins, arrays)
        self._keep(encoded, extent, (call.name, tuple(ins), arrays, ()))
        return b"", encoded

    def replace_address(self, call: Call, ins: tuple):
        """cuTensorMapReplaceAddress: a map this lease encoded, its tensor moved to other lease memory."""
        self.session._check(call, ins)
        encoded, extent = self._encoded_map()
        self.session._check_range(ins[0], extent)
        replaced = self.session.executor.tensor_map_address(encoded, ins[0])
        self._keep(replaced, extent, self._then(encoded, ("address", ins[0])))
        return b"", replaced

    def set_allocation_class(self, call: Call, ins: tuple):
        """cuTensorMapSetAllocationClass: a map this lease encoded; the large class's window reaches 128 KiB
        from the tensor's base, which must then be the tensor's own (the lease's memory: its extent was
        checked), so a smaller tensor's map may not take it. AUTO is the driver's conservative choice."""
        (alloc_class,) = ins
        encoded, extent = self._encoded_map()
        if alloc_class not in (ALLOC_CLASS_AUTO, ALLOC_CLASS_SMALL, ALLOC_CLASS_LARGE):
            raise CudaError(INVALID_VALUE, f"allocation class {alloc_class}")
        if alloc_class == ALLOC_CLASS_LARGE and extent < LARGE_WINDOW:
            raise CudaError(
                NOT_SUPPORTED,
                f"the large allocation class on a tensor of {extent} bytes: its 128 KiB window could reach "
                "memory outside the lease",
            )
        changed, effective = self.session.executor.tensor_map_alloc_class(encoded, alloc_class)
        self._keep(changed, extent, self._then(encoded, ("class", alloc_class)))
        return call.out_struct.pack(effective), changed

    def _encoded_map(self) -> tuple[bytes, int]:
        """The 128-byte map in the request's bulk, and its tensor's extent: a map this lease encoded."""
        encoded = bytes(self.session.channel.read_bulk(limit=TENSOR_MAP_BYTES))
        if len(encoded) != TENSOR_MAP_BYTES:
            raise CudaError(INVALID_VALUE, "a tensor map is 128 bytes")
        extent = self.session.lease.tensor_maps.get(encoded)
        if extent is None:
            raise CudaError(INVALID_VALUE, "not a tensor map this lease encoded")
        return encoded, extent

    def _then(self, encoded: bytes, step: tuple) -> tuple:
        """The recipe of `encoded` with one more step (a new address or allocation class)."""
        name, ins, arrays, steps = self.session.lease.tensor_map_recipes[encoded]
        return name, ins, arrays, (*steps, step)

    def _keep(self, encoded: bytes, extent: int, recipe: tuple) -> None:
        maps, recipes = self.session.lease.tensor_maps, self.session.lease.tensor_map_recipes
        with self.session.lease.lock:
            maps[bytes(encoded)] = extent
            recipes[bytes(encoded)] = recipe
            while len(maps) > TENSOR_MAPS_KEPT:  # the oldest first (dicts keep insertion order)
                oldest = next(iter(maps))
                del maps[oldest], recipes[oldest]


def encoded_anew(executor, recipe: tuple) -> bytes:
    """A tensor map made again from its recipe (name, the encode's ins, its shape arrays, steps since)."""
    name, ins, arrays, steps = recipe
    encoded = executor.tensor_map(name, tuple(ins), [list(a) for a in arrays])
    for kind, value in steps:
        if kind == "address":
            encoded = executor.tensor_map_address(encoded, value)
        else:
            encoded, _ = executor.tensor_map_alloc_class(encoded, value)
    return bytes(encoded)
