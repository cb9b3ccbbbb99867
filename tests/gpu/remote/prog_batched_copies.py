"""Batched copies (issue 25): cuda.core's `copy_batch` (cuMemcpyBatchAsync) with pinned, pageable-backed
and device buffers in both directions and per-copy options, and cuda.bindings' cuMemcpy3DBatchAsync
moving a sub-rectangle between a host image and a device image of another row pitch, both ways.

Runs unchanged on a local GPU or, under gpupool's libcuda.so.1, on a leased one; prints the same.
"""

from __future__ import annotations

import sys

import numpy as np
from _common import loaded_libcuda
from cuda.bindings import driver
from cuda.core import Device, LegacyPinnedMemoryResource
from cuda.core.utils import CopyOptions, MemcpySrcAccessOrder, copy_batch


def ok(result):
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA error {err}")
    return rest[0] if len(rest) == 1 else rest


def operand(ptr: int, row: int, layer: int):
    o = driver.CUmemcpy3DOperand()
    o.type = driver.CUmemcpy3DOperandType.CU_MEMCPY_OPERAND_TYPE_POINTER
    o.op.ptr.ptr, o.op.ptr.rowLength, o.op.ptr.layerHeight = ptr, row, layer
    return o


def copy_3d(src, dst, extent, stream) -> None:
    op = driver.CUDA_MEMCPY3D_BATCH_OP()
    op.src, op.dst = src, dst
    op.extent.width, op.extent.height, op.extent.depth = extent
    op.srcAccessOrder = driver.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
    ok(driver.cuMemcpy3DBatchAsync(1, [op], 0, stream))


def main() -> int:
    dev = Device(0)
    dev.set_current()
    stream = dev.create_stream()
    pinned, device = LegacyPinnedMemoryResource(), dev.memory_resource
    size, count = 1 << 16, 6

    def host_array(buf):
        return np.from_dlpack(buf).view(np.uint8)

    sources = [pinned.allocate(size) for _ in range(count)]
    for i, buf in enumerate(sources):
        host_array(buf)[:] = np.arange(size, dtype=np.uint32).astype(np.uint8) ^ (i + 1)
    on_device = [device.allocate(size, stream=stream) for _ in range(count)]
    copy_batch(stream, sources, on_device, options=CopyOptions(src_access_order=MemcpySrcAccessOrder.STREAM))
    back = [pinned.allocate(size) for _ in range(count)]
    orders = [MemcpySrcAccessOrder.STREAM, MemcpySrcAccessOrder.ANY, MemcpySrcAccessOrder.DURING_API_CALL]
    options = [CopyOptions(src_access_order=orders[i % 3]) for i in range(count)]
    copy_batch(stream, on_device, back, options=options)
    stream.sync()
    same = [bool((host_array(b) == host_array(s)).all()) for s, b in zip(sources, back, strict=True)]
    print("round trip through the device, each copy equal", same)
    print("checksums", [int(host_array(b).sum(dtype=np.int64)) for b in back])

    # A 3 x 8 window at row 1, column 4 of a 16-byte-pitch host image, into a 32-byte-pitch device image.
    image = pinned.allocate(128)
    host_array(image)[:] = np.arange(128, dtype=np.uint8)
    target = device.allocate(256, stream=stream)
    zero = pinned.allocate(256)
    host_array(zero)[:] = 0
    target.copy_from(zero, stream=stream)
    s = int(stream.handle)
    copy_3d(operand(int(image.handle) + 16 + 4, 16, 8), operand(int(target.handle), 32, 8), (8, 3, 1), s)
    down = pinned.allocate(96)
    copy_3d(operand(int(target.handle), 0, 0), operand(int(down.handle), 0, 0), (96, 1, 1), s)
    stream.sync()
    rows = host_array(down).reshape(3, 32)
    print("3D window rows", rows[:, :8].tolist(), "rest of the rows zero", not rows[:, 8:].any())

    for buf in [*sources, *back, image, zero, down]:
        buf.close()
    for buf in [*on_device, target]:
        buf.close(stream)
    stream.sync()
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
