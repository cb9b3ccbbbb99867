"""One process of an NCCL program for tests/test_nccl_forward.py, run under `gpuattach run` with NCCL forwarded:
CUDA through `libcuda.so.1`, NCCL through the preloaded libgpupool_nccl.so (ctypes, as tests/nccl_rank.py).
Prints `name value` lines. What it does is the first argument:

  threads  thread A starts rank 0 of two (ncclCommInitRank blocks until rank 1 joins) while another thread
           goes on with CUDA calls on the same connection; then thread B joins as rank 1 (on the lease's
           second GPU where it has one).
  group    both ranks' ncclCommInitRank from one thread inside ncclGroupStart/End (waited for at the end).
  memory   what the lease's partition shows (cuMemGetInfo's free) around a one-rank communicator's life, and
           whether an allocation that fits only without NCCL's buffers is refused while it lives; then a
           communicator made where the partition has no room for NCCL's buffers; then one whose first
           collective's connections do not fit; then a non-blocking one.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time

c_u64, c_void_p, c_size_t = ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t
FLOAT32, SUM, IN_PROGRESS = 7, 0, 7
MIB = 1 << 20
WAIT_S = 20.0  # a CUDA call that has not returned by then is held behind the initialisation

cuda = ctypes.CDLL("libcuda.so.1")
nccl = ctypes.CDLL(None)
contexts: list[c_u64] = []  # each device's primary context; a thread starts with none current


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


class Config(ctypes.Structure):
    """The head of ncclConfig_t (a program built against an older nccl.h passes a smaller one: its size)."""

    _fields_ = [("size", c_size_t), ("magic", ctypes.c_uint), ("version", ctypes.c_uint), ("blocking", ctypes.c_int),
                ("cgaClusterSize", ctypes.c_int), ("minCTAs", ctypes.c_int), ("maxCTAs", ctypes.c_int),
                ("netName", ctypes.c_char_p)]  # fmt: skip


def say(name, value) -> None:
    print(name, value, flush=True)


def check(rc: int, what: str) -> None:
    if rc != 0:
        say("FAILED", f"{what} rc={rc}")
        sys.exit(1)


def free_bytes() -> int:
    free, total = c_size_t(), c_size_t()
    check(cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
    return free.value


def alloc(size: int) -> tuple[int, int]:
    """cuMemAlloc's result for `size` bytes, and the memory."""
    ptr = c_u64()
    return cuda.cuMemAlloc_v2(ctypes.byref(ptr), c_size_t(size)), ptr.value


def alloc_rc(size: int) -> int:
    """cuMemAlloc's result for `size` bytes (freed again where it worked)."""
    rc, ptr = alloc(size)
    if rc == 0:
        check(cuda.cuMemFree_v2(c_u64(ptr)), "cuMemFree")
    return rc


def threads() -> None:
    uid = UniqueId()
    check(nccl.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
    comms, results = [c_void_p(), c_void_p()], [None, None]

    def init(rank: int) -> None:  # rank r on device r (NCCL wants a GPU per rank), where the lease has two
        check(cuda.cuCtxSetCurrent(contexts[rank % len(contexts)]), "set current")
        results[rank] = nccl.ncclCommInitRank(ctypes.byref(comms[rank]), 2, uid, rank)

    first = threading.Thread(target=init, args=(0,), daemon=True)
    first.start()
    time.sleep(0.5)  # rank 0 is inside ncclCommInitRank, waiting for rank 1
    cuda_done = []

    def cuda_calls() -> None:  # the connection the initialisation uses, from another thread
        check(cuda.cuCtxSetCurrent(contexts[0]), "set current")
        ptr, data = c_u64(), bytes(range(256)) * 16
        check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), c_size_t(len(data))), "cuMemAlloc")
        check(cuda.cuMemcpyHtoD_v2(ptr, data, c_size_t(len(data))), "cuMemcpyHtoD")
        back = ctypes.create_string_buffer(len(data))
        check(cuda.cuMemcpyDtoH_v2(back, ptr, c_size_t(len(data))), "cuMemcpyDtoH")
        check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
        cuda_done.append(back.raw == data)

    worker = threading.Thread(target=cuda_calls, daemon=True)
    worker.start()
    worker.join(WAIT_S)
    say("cuda_during_init", "ok" if cuda_done == [True] else "blocked" if not cuda_done else "wrong")
    say("init_still_waiting", int(first.is_alive()))
    if not cuda_done:
        sys.stdout.flush()
        sys.exit(1)  # rank 1 never comes: the process's connection is held
    second = threading.Thread(target=init, args=(1,), daemon=True)
    second.start()
    first.join(WAIT_S)
    second.join(WAIT_S)
    say("init_rc", " ".join(str(r) for r in results))
    for comm in comms:
        check(nccl.ncclCommDestroy(comm), "ncclCommDestroy")


def group() -> None:
    """Both ranks' communicators made from this one thread inside ncclGroupStart/End (one GPU each where the
    lease has two), as a single process drives several GPUs: each init returns at once, the group's end
    returns once both are made."""
    uid = UniqueId()
    check(nccl.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
    comms, results = [c_void_p(), c_void_p()], []
    check(nccl.ncclGroupStart(), "ncclGroupStart")
    for rank in (0, 1):
        check(cuda.cuCtxSetCurrent(contexts[rank % len(contexts)]), "set current")
        results.append(nccl.ncclCommInitRank(ctypes.byref(comms[rank]), 2, uid, rank))
    results.append(nccl.ncclGroupEnd())
    say("group_rc", " ".join(map(str, results)))
    counts = []
    for comm in comms:
        count = ctypes.c_int()
        check(nccl.ncclCommCount(comm, ctypes.byref(count)), "ncclCommCount")
        counts.append(count.value)
        check(nccl.ncclCommDestroy(comm), "ncclCommDestroy")
    say("group_counts", " ".join(map(str, counts)))


def new_comm(blocking: bool | None) -> tuple[int, c_void_p]:
    """A one-rank communicator (config with `blocking` where given): ncclCommInitRank*'s result and it."""
    uid, comm = UniqueId(), c_void_p()
    check(nccl.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
    if blocking is None:
        return nccl.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0), comm
    unset = -(1 << 31)
    config = Config(ctypes.sizeof(Config), 0xCAFEBEEF, 0, int(blocking), unset, unset, unset, None)
    return nccl.ncclCommInitRankConfig(ctypes.byref(comm), 1, uid, 0, ctypes.byref(config)), comm


def memory() -> None:
    before = free_bytes()

    def taken() -> int:  # bytes of the partition in use since the start
        return before - free_bytes()

    rc, comm = new_comm(None)
    say("init_rc", rc)
    say("comm_null", int(not comm.value))
    check(rc, "ncclCommInitRank")
    held = taken()
    say("init_mib", round(held / MIB))
    say("init_bytes", held)
    fits_alone = before - held // 2  # fits the partition, but not beside the communicator
    say("alloc_beside_comm", alloc_rc(fits_alone) if held else "-")
    stream = c_u64()
    check(cuda.cuStreamCreate(ctypes.byref(stream), 0), "cuStreamCreate")
    rc, buf = alloc(4096)
    check(rc, "cuMemAlloc")
    check(nccl.ncclAllReduce(c_void_p(buf), c_void_p(buf), c_size_t(1024), FLOAT32, SUM, comm,
                             c_void_p(stream.value)), "ncclAllReduce")  # fmt: skip
    check(cuda.cuStreamSynchronize(stream), "cuStreamSynchronize")
    check(cuda.cuMemFree_v2(c_u64(buf)), "cuMemFree")
    say("connected_mib", round(taken() / MIB))  # NCCL's connections, made at the first collective
    say("connected_bytes", taken())
    check(nccl.ncclCommDestroy(comm), "ncclCommDestroy")
    say("destroyed_bytes", taken())
    say("alloc_after_destroy", alloc_rc(fits_alone))

    if held:  # a communicator where the partition has no room for NCCL's buffers
        rc, hog = alloc(fits_alone)
        check(rc, "cuMemAlloc")
        rc, comm = new_comm(None)
        say("crowded_init_rc", rc)
        say("crowded_comm_null", int(not comm.value))
        say("crowded_left_bytes", taken() - fits_alone)  # what the failed communicator left counted
        check(cuda.cuMemFree_v2(c_u64(hog)), "cuMemFree")

    # NCCL's connections, made at a first collective where the partition has no room left for them: counted
    # all the same (the memory is taken), and the communicator keeps an error from then on.
    rc, comm = new_comm(None)
    check(rc, "ncclCommInitRank")
    rc, hog = alloc(free_bytes() - MIB)  # what is left of the partition, but a MiB
    check(rc, "cuMemAlloc")
    rc, buf = alloc(4096)
    check(rc, "cuMemAlloc")
    check(nccl.ncclAllReduce(c_void_p(buf), c_void_p(buf), c_size_t(1024), FLOAT32, SUM, comm,
                             c_void_p(stream.value)), "ncclAllReduce")  # fmt: skip
    check(cuda.cuStreamSynchronize(stream), "cuStreamSynchronize")
    state = ctypes.c_int(-1)
    check(nccl.ncclCommGetAsyncError(comm, ctypes.byref(state)), "ncclCommGetAsyncError")
    say("overgrown_async_error", state.value)
    say("overgrown_free_bytes", free_bytes())  # nothing left: NCCL's connections are counted past it
    check(nccl.ncclCommDestroy(comm), "ncclCommDestroy")
    for ptr in (hog, buf):
        check(cuda.cuMemFree_v2(c_u64(ptr)), "cuMemFree")
    say("overgrown_destroyed_bytes", taken())

    rc, comm = new_comm(False)  # non-blocking: the program asks until it is made
    state, polls = ctypes.c_int(IN_PROGRESS), 0
    while state.value == IN_PROGRESS and polls < 30000:
        check(nccl.ncclCommGetAsyncError(comm, ctypes.byref(state)), "ncclCommGetAsyncError")
        polls += 1
        time.sleep(0.001)
    say("nonblocking", f"{rc} {state.value}")
    say("nonblocking_bytes", taken())
    check(nccl.ncclCommAbort(comm), "ncclCommAbort")
    say("aborted_bytes", taken())


def main() -> None:
    check(cuda.cuInit(0), "cuInit")
    count = ctypes.c_int()
    check(cuda.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
    for device in range(count.value):
        contexts.append(c_u64())
        check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(contexts[-1]), device), "retain")
    check(cuda.cuCtxSetCurrent(contexts[0]), "set current")
    if sys.argv[1] == "threads":
        threads()
    elif sys.argv[1] == "group":
        group()
    else:
        memory()


if __name__ == "__main__":
    main()
