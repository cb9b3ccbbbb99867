"""The calls the worker's native loop serves in C (issue 31), checked for their results on a real GPU:
copies into and out of page-locked memory in flight on several streams chained by events (on the
worker's host: through memory both map, `gpPinnedCopy`), synchronous ones, device-to-device copies,
1 MiB copies from pageable memory, a memset and a 4 MiB copy into pageable memory queued behind a kernel
on a stream, a captured graph replayed, event elapsed times (a benchmark harness's many pairs too).

Runs unchanged on a local GPU or, under gpupool's libcuda.so.1, on a leased one; prints the same.
"""

from __future__ import annotations

import ctypes
import sys

import numpy as np
from _common import PTX, loaded_libcuda, ok
from cuda.bindings import driver as cu

N = 1 << 14  # float32 words per buffer: 64 KiB
BUFFERS, STREAMS = 16, 4


def pinned_array(size: int) -> tuple[int, np.ndarray]:
    ptr = ok(cu.cuMemAllocHost(size))
    return ptr, np.ctypeslib.as_array((ctypes.c_float * (size // 4)).from_address(int(ptr)))


def main() -> int:
    ok(cu.cuInit(0))
    ctx = ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0))))
    ok(cu.cuCtxSetCurrent(ctx))
    module = ok(cu.cuModuleLoadData(PTX.encode()))
    saxpy = ok(cu.cuModuleGetFunction(module, b"saxpy"))
    size = N * 4
    streams = [ok(cu.cuStreamCreate(1)) for _ in range(STREAMS)]  # CU_STREAM_NON_BLOCKING
    events = [ok(cu.cuEventCreate(2)) for _ in range(BUFFERS)]  # CU_EVENT_DISABLE_TIMING
    device = [ok(cu.cuMemAlloc(size)) for _ in range(BUFFERS)]
    pinned = [pinned_array(size) for _ in range(BUFFERS)]

    # Device buffers k hold k + 1.0 (memsets on the streams); each copy to the host waits for the previous
    # buffer's event, so the chain crosses all four streams.
    for k in range(BUFFERS):
        value = np.float32(k + 1).view(np.uint32)
        ok(cu.cuMemsetD32Async(device[k], int(value), N, streams[k % STREAMS]))
    for k in range(BUFFERS):
        s = streams[k % STREAMS]
        if k:
            ok(cu.cuStreamWaitEvent(s, events[k - 1], 0))
        ok(cu.cuMemcpyDtoHAsync(pinned[k][0], device[k], size, s))
        ok(cu.cuEventRecord(events[k], s))
    ok(cu.cuEventSynchronize(events[BUFFERS - 1]))  # the last event: every copy of the chain is in
    print(
        "chained copies to the host in place",
        all(bool((pinned[k][1] == k + 1).all()) for k in range(BUFFERS)),
    )

    # From page-locked memory back to the device, 16 in flight, then a kernel on each: y = 2 x + y.
    for k in range(BUFFERS):
        pinned[k][1][:] = 100 + k
        ok(cu.cuMemcpyHtoDAsync(device[k], pinned[k][0], size, streams[k % STREAMS]))
    ones = ok(cu.cuMemAlloc(size))
    ok(cu.cuMemsetD32(ones, int(np.float32(1).view(np.uint32)), N))
    ok(cu.cuCtxSynchronize())  # the legacy stream's memset before the non-blocking streams' kernels
    for k in range(BUFFERS):
        args = ((ones, device[k], 2.0, N), (None, None, ctypes.c_float, ctypes.c_uint32))
        ok(cu.cuLaunchKernel(saxpy, (N + 255) // 256, 1, 1, 256, 1, 1, 0, streams[k % STREAMS], args, 0))
        ok(cu.cuMemcpyDtoHAsync(pinned[k][0], device[k], size, streams[k % STREAMS]))
    for s in streams:
        ok(cu.cuStreamSynchronize(s))
    print(
        "copies from the host, kernels, back",
        all(bool((pinned[k][1] == 102 + k).all()) for k in range(BUFFERS)),
    )

    # Synchronous copies with page-locked memory, and device to device (both ways of the call).
    pinned[0][1][:] = 7
    ok(cu.cuMemcpyHtoD(device[1], pinned[0][0], size))
    ok(cu.cuMemcpyDtoD(device[2], device[1], size))
    ok(cu.cuCtxSynchronize())  # device to device returns before it is done; a non-blocking stream follows
    ok(cu.cuMemcpyDtoDAsync(device[3], device[2], size, streams[0]))
    ok(cu.cuStreamSynchronize(streams[0]))
    ok(cu.cuMemcpyDtoH(pinned[1][0], device[3], size))
    print("synchronous page-locked and device copies", bool((pinned[1][1] == 7).all()))

    # 1 MiB from pageable memory each way (one frame each over TCP).
    big = np.arange(1 << 18, dtype=np.float32)
    dbig = ok(cu.cuMemAlloc(big.nbytes))
    ok(cu.cuMemcpyHtoD(dbig, big.ctypes.data, big.nbytes))
    back = np.empty_like(big)
    ok(cu.cuMemcpyDtoH(back.ctypes.data, dbig, big.nbytes))
    print("1 MiB pageable round trip", bool((back == big).all()))

    # Behind a long kernel on a non-blocking stream: a memset, then a 4 MiB copy into pageable memory on
    # that stream (on the worker's host through the memory shared with it, piece by piece, in C), whose
    # call returns with the memset's values, never the bytes from before the kernel.
    spin = ok(cu.cuModuleGetFunction(module, b"spin"))
    spun = ok(cu.cuMemAlloc(132 * 256 * 4))  # spin writes one float per thread
    words = 1 << 20
    dwords = ok(cu.cuMemAlloc(words * 4))
    ok(cu.cuMemsetD32(dwords, 0, words))
    ok(cu.cuCtxSynchronize())
    args = ((spun, 20000), (None, ctypes.c_uint32))
    ok(cu.cuLaunchKernel(spin, 132, 1, 1, 256, 1, 1, 0, streams[2], args, 0))
    ok(cu.cuMemsetD32Async(dwords, int(np.float32(1).view(np.uint32)), words, streams[2]))
    landed = np.empty(words, dtype=np.float32)
    ok(cu.cuMemcpyDtoHAsync(landed.ctypes.data, dwords, words * 4, streams[2]))
    print("4 MiB pageable copy on a stream after a kernel and a memset", bool((landed == 1).all()))

    # A captured graph of three kernels, replayed ten times; elapsed time around the replays.
    ok(cu.cuMemsetD32(device[4], 0, N))
    ok(cu.cuCtxSynchronize())
    capture = streams[1]
    ok(cu.cuStreamBeginCapture(capture, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL))
    for _ in range(3):
        args = ((ones, device[4], 1.0, N), (None, None, ctypes.c_float, ctypes.c_uint32))
        ok(cu.cuLaunchKernel(saxpy, (N + 255) // 256, 1, 1, 256, 1, 1, 0, capture, args, 0))
    graph = ok(cu.cuStreamEndCapture(capture))
    executable = ok(cu.cuGraphInstantiate(graph, 0))
    start, end = ok(cu.cuEventCreate(0)), ok(cu.cuEventCreate(0))
    ok(cu.cuEventRecord(start, capture))
    for _ in range(10):
        ok(cu.cuGraphLaunch(executable, capture))
    ok(cu.cuEventRecord(end, capture))
    ok(cu.cuEventSynchronize(end))
    ok(cu.cuMemcpyDtoH(pinned[2][0], device[4], size))
    print("graph x10 of 3 kernels", bool((pinned[2][1] == 30).all()))
    elapsed = ok(cu.cuEventElapsedTime(start, end))
    print("elapsed time of the replays >= 0 and < 10 s", 0 <= elapsed < 10_000)

    # A benchmark harness's loop: a start and an end event around each of 40 launches on two streams,
    # one synchronise, then every pair's elapsed time (remotely a handful of requests), each pair reversed
    # (not asked before: negative or zero), and one pair again after its start was recorded anew.
    marks = [(ok(cu.cuEventCreate(0)), ok(cu.cuEventCreate(0))) for _ in range(40)]
    for k, (first, last) in enumerate(marks):
        args = ((ones, device[5 + k % 2], 1.0, N), (None, None, ctypes.c_float, ctypes.c_uint32))
        ok(cu.cuEventRecord(first, streams[k % 2]))
        ok(cu.cuLaunchKernel(saxpy, (N + 255) // 256, 1, 1, 256, 1, 1, 0, streams[k % 2], args, 0))
        ok(cu.cuEventRecord(last, streams[k % 2]))
    ok(cu.cuCtxSynchronize())
    times = [ok(cu.cuEventElapsedTime(first, last)) for first, last in marks]
    print("40 pairs' elapsed times >= 0", all(t >= 0 for t in times))
    print("reversed pairs <= 0", all(ok(cu.cuEventElapsedTime(last, first)) <= 0 for first, last in marks))
    ok(cu.cuEventRecord(marks[0][0], streams[0]))  # after its end now
    ok(cu.cuStreamSynchronize(streams[0]))
    print("a start recorded again gives a new answer", ok(cu.cuEventElapsedTime(*marks[0])) <= 0 < times[0])
    for pair in marks:
        for event in pair:
            ok(cu.cuEventDestroy(event))

    ok(cu.cuGraphExecDestroy(executable))
    ok(cu.cuGraphDestroy(graph))
    for ptr, _ in pinned:
        ok(cu.cuMemFreeHost(ptr))
    for ptr in (*device, ones, dbig, spun, dwords):
        ok(cu.cuMemFree(ptr))
    for s in streams:
        ok(cu.cuStreamDestroy(s))
    ok(cu.cuModuleUnload(module))
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
