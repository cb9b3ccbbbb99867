"""The CUDA executor hands the driver's tensor-map calls a 64-byte-aligned CUtensorMap (the driver refuses
any other with CUDA_ERROR_INVALID_VALUE; cuda.bindings' own CUtensorMap objects are only 16-byte aligned).

The driver's entry point is the seam: a C-callable stand-in records what the driver would be given.
"""

from __future__ import annotations

import ctypes

import pytest

from virtualize.server._cuda import TENSOR_MAP_CALLS, with_aligned_tensor_map
from virtualize.server._executor import CudaError

REPLACE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *TENSOR_MAP_CALLS["cuTensorMapReplaceAddress"][1])


def test_every_tensor_map_call_gets_a_64_byte_aligned_map_holding_what_the_client_sent():
    """cuTensorMapReplaceAddress's map as the driver sees it: aligned to 64 bytes on every call (a map at
    16 would be refused three times in four), holding the client's 128 bytes; the driver's writes come
    back."""
    seen = []

    def driver(tensor_map, address):
        seen.append((tensor_map % 64, ctypes.string_at(tensor_map, 128)))
        ctypes.memmove(tensor_map + 8, ctypes.c_uint64(address).value.to_bytes(8, "little"), 8)
        return 0

    function = REPLACE(driver)
    before = bytes(range(128))
    for _ in range(64):
        after = with_aligned_tensor_map(function, (0x7F0000001000,), before)
        assert after == before[:8] + (0x7F0000001000).to_bytes(8, "little") + before[16:]
    assert {alignment for alignment, _ in seen} == {0}
    assert all(held == before for _, held in seen)


def test_a_driver_refusal_is_the_calls_result():
    """A tensor-map call the driver refuses fails with the driver's CUresult, not a made-up one."""
    function = REPLACE(lambda tensor_map, address: 1)  # CUDA_ERROR_INVALID_VALUE
    with pytest.raises(CudaError) as refused:
        with_aligned_tensor_map(function, (0,), bytes(128))
    assert refused.value.code == 1


def test_each_tensor_map_call_declares_the_abi_of_the_header():
    """The parameter lists after the map match cuda.h's (from cuda-bindings' declarations): a wrong
    count would pass garbage to the driver."""
    from virtualize.common._census import installed_header

    declared = installed_header().entry_points
    for name, (_version, argtypes) in TENSOR_MAP_CALLS.items():
        assert len(argtypes) + 1 == declared[name], name
