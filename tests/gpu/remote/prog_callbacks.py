"""Host callbacks (issue 11): CuPy's `Stream.launch_host_func` (cudaLaunchHostFunc) and `add_callback`
(cudaStreamAddCallback) between kernels: each runs in this process once the stream reaches it, in
stream order, on a thread other than the caller's, and the stream's later work waits for it (a slow
callback sets a value a later copy on the stream depends on being written first). A host function
captured into a graph runs at every replay of it (CuPy's own test_capture_launch_host_func: the worker
crashed at the second replay when it launched host functions through cuda.bindings' wrapper).

Runs unchanged on a local GPU or, under gpupool's libcuda.so.1, on a leased one; prints the same.
"""

from __future__ import annotations

import sys
import threading
import time

import cupy as cp
import numpy
from _common import loaded_libcuda


def main() -> int:
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    stream = cp.cuda.Stream(non_blocking=True)
    seen, threads = [], set()
    host = cp.zeros(1, dtype=cp.int64).get()  # a host array a callback fills

    def slow(arg):
        time.sleep(0.2)
        host[0] = 41
        seen.append(f"host {arg}")
        threads.add(threading.get_ident())

    def callback(s, status, arg):
        seen.append(f"callback {arg} status {status}")
        threads.add(threading.get_ident())

    with stream:
        x = cp.arange(1 << 20, dtype=cp.float32)
        stream.launch_host_func(slow, "first")
        y = (x * 2).sum()
        stream.add_callback(callback, "second")
        stream.launch_host_func(lambda arg: seen.append(f"host {arg} sees {int(host[0])}"), "third")
    stream.synchronize()
    print("order:", "; ".join(seen))
    print("sum", float(y))
    print("on another thread", threading.get_ident() not in threads)
    for i in range(100):
        stream.launch_host_func(seen.append, i)
    stream.synchronize()
    print("a hundred more in order", seen[-100:] == list(range(100)))

    # A callback that waits for the program's other work: a copy to pinned memory on another stream and
    # its synchronise (issue 12: those bytes must not queue behind the waiting callback).
    other = cp.cuda.Stream(non_blocking=True)
    released = threading.Event()
    pinned = cp.cuda.alloc_pinned_memory(x.nbytes)
    out = numpy.frombuffer(pinned, dtype=numpy.float32, count=x.size)
    stream.launch_host_func(lambda _: released.wait(30), None)
    x.get(stream=other, out=out)  # cudaMemcpyAsync into page-locked memory
    other.synchronize()
    print("copy beside a waiting callback", bool((out == cp.asnumpy(x)).all()))
    released.set()
    stream.synchronize()

    # A host function captured into a graph: a node that runs at every launch of the graph.
    counts = {"ran": 0}
    capture = cp.cuda.Stream(non_blocking=True)
    with capture:
        capture.begin_capture()
        capture.launch_host_func(lambda delta: counts.__setitem__("ran", counts["ran"] + delta), 1)
        graph = capture.end_capture()
    graph.upload()
    replays = []
    for _ in range(4):
        graph.launch(stream=capture)
        capture.synchronize()
        replays.append(counts["ran"])
    print("captured host function at each replay", replays)
    return 0


if __name__ == "__main__":
    sys.exit(main())
