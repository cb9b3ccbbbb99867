"""One rank of an NCCL program for tests/test_nccl_forward.py: CUDA through `libcuda.so.1`, NCCL through
whatever defines NCCL's names in the process (under `gpuattach run --spread`, the preloaded
libgpupool_nccl.so). The ranks meet through files in $NCCL_TEST_DIR (rank 0's unique id, each rank's
communicator handle). Prints `name value` lines; run with LOCAL_RANK set, as torchrun starts ranks.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys
import time
from pathlib import Path

c_u64, c_void_p, c_size_t = ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t
FLOAT32, INT32, SUM = 7, 2, 0
COUNT = 1 << 18  # floats: 1 MiB per buffer
RANKS = 2

cuda = ctypes.CDLL("libcuda.so.1")
nccl = ctypes.CDLL(None)  # the process's NCCL names, as a program linked against libnccl sees them
rank = int(os.environ["LOCAL_RANK"])
meet = Path(os.environ["NCCL_TEST_DIR"])


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]  # ncclUniqueId: passed by value


def say(name, value) -> None:
    print(name, value, flush=True)


def check(rc: int, what: str) -> None:
    if rc != 0:
        say("FAILED", f"{what} rc={rc}")
        sys.exit(1)


def publish(name: str, data: bytes) -> None:
    tmp = meet / f".{name}.{os.getpid()}"
    tmp.write_bytes(data)
    tmp.replace(meet / name)


def wait_for(name: str) -> bytes:
    deadline = time.monotonic() + 30
    while not (meet / name).exists():
        if time.monotonic() > deadline:
            say("FAILED", f"no {name} from the other rank")
            sys.exit(1)
        time.sleep(0.05)
    return (meet / name).read_bytes()


def device_buffer(values: bytes) -> int:
    ptr = c_u64()
    check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), c_size_t(len(values))), "cuMemAlloc")
    check(cuda.cuMemcpyHtoD_v2(ptr, values, c_size_t(len(values))), "cuMemcpyHtoD")
    return ptr.value


def read_back(ptr: int, size: int) -> bytes:
    out = ctypes.create_string_buffer(size)
    check(cuda.cuMemcpyDtoH_v2(out, c_u64(ptr), c_size_t(size)), "cuMemcpyDtoH")
    return out.raw


def main() -> None:
    say("pid", os.getpid())
    check(cuda.cuInit(0), "cuInit")
    devices, ctx = ctypes.c_int(), c_u64()
    check(cuda.cuDeviceGetCount(ctypes.byref(devices)), "cuDeviceGetCount")
    check(
        cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), rank % devices.value), "retain"
    )  # as torchrun's ranks
    check(cuda.cuCtxSetCurrent(ctx), "set current")
    stream = c_u64()
    check(cuda.cuStreamCreate(ctypes.byref(stream), 0), "cuStreamCreate")
    version = ctypes.c_int()
    check(nccl.ncclGetVersion(ctypes.byref(version)), "ncclGetVersion")
    say("version", version.value)

    uid = UniqueId()
    if rank == 0:
        check(nccl.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        publish("id", bytes(uid))
    else:
        uid = UniqueId.from_buffer_copy(wait_for("id"))
    comm = c_void_p()
    check(nccl.ncclCommInitRank(ctypes.byref(comm), RANKS, uid, rank), "ncclCommInitRank")
    publish(f"comm{rank}", struct.pack("<Q", comm.value))
    count = ctypes.c_int()
    check(nccl.ncclCommCount(comm, ctypes.byref(count)), "ncclCommCount")
    say("count", count.value)

    # All-reduce: rank r contributes r + 1 everywhere; every rank gets the sum.
    size = COUNT * 4
    send = device_buffer(struct.pack(f"<{COUNT}f", *([rank + 1.0] * COUNT)))
    recv = device_buffer(bytes(size))
    rc = nccl.ncclAllReduce(
        c_void_p(send), c_void_p(recv), c_size_t(COUNT), FLOAT32, SUM, comm, c_void_p(stream.value)
    )
    check(rc, "ncclAllReduce")
    check(cuda.cuStreamSynchronize(stream), "cuStreamSynchronize")
    total = set(struct.unpack(f"<{COUNT}f", read_back(recv, size)))
    say("allreduce", ",".join(str(v) for v in sorted(total)))

    # Broadcast from rank 1: every rank ends with rank 1's values.
    values = [rank * 1000 + i for i in range(256)]
    buf = device_buffer(struct.pack("<256i", *values))
    check(
        nccl.ncclBroadcast(
            c_void_p(buf), c_void_p(buf), c_size_t(256), INT32, 1, comm, c_void_p(stream.value)
        ),
        "bcast",
    )
    check(cuda.cuStreamSynchronize(stream), "cuStreamSynchronize")
    got = struct.unpack("<256i", read_back(buf, 256 * 4))
    say("broadcast", "ok" if list(got) == [1000 + i for i in range(256)] else f"wrong {got[:4]}")

    async_error = ctypes.c_int(-1)
    check(nccl.ncclCommGetAsyncError(comm, ctypes.byref(async_error)), "ncclCommGetAsyncError")
    say("async_error", async_error.value)

    if rank == 0:
        # The other rank's communicator (its own lease's): refused here, and by this lease's worker.
        (other,) = struct.unpack("<Q", wait_for("comm1"))
        rc = nccl.ncclAllReduce(c_void_p(send), c_void_p(recv), c_size_t(COUNT), FLOAT32, SUM, c_void_p(other),
                                c_void_p(stream.value))  # fmt: skip
        say("foreign_allreduce", rc)
        forward = ctypes.CDLL("libcuda.so.1").gpupool_forward
        query, outs = struct.pack("<Q", other), ctypes.create_string_buffer(20)
        rc = forward(
            int(os.environ["NCCL_TEST_QUERY_CALL"]),
            1,
            query,
            len(query),
            None,
            c_u64(0),
            outs,
            20,
            None,
            c_u64(0),
        )
        say("foreign_query", f"{rc} {struct.unpack_from('<i', outs.raw)[0]}")
        # A buffer that is not the lease's memory: the call is enqueued (no reply), the worker refuses it
        # before NCCL sees it, and the communicator's asynchronous error says so from then on.
        rc = nccl.ncclAllReduce(c_void_p(0x1000), c_void_p(recv), c_size_t(COUNT), FLOAT32, SUM, comm,
                                c_void_p(stream.value))  # fmt: skip
        check(nccl.ncclCommGetAsyncError(comm, ctypes.byref(async_error)), "ncclCommGetAsyncError")
        say("stray_buffer", f"{rc} {async_error.value}")
        # A name NCCL has that is not forwarded: refused, no crash.
        say("unforwarded", nccl.ncclCommShrink(comm, None, 0, ctypes.byref(c_void_p()), None, 0))
    if os.environ.get("NCCL_TEST_LEAVE"):  # exit holding the communicator, as a crashed rank does
        say("left", 1)
        return
    publish(f"done{rank}", b"")
    wait_for(f"done{1 - rank}")  # the other rank is through with its checks before the communicator goes
    check(nccl.ncclCommDestroy(comm), "ncclCommDestroy")
    say("after_destroy", nccl.ncclCommCount(comm, ctypes.byref(count)))


if __name__ == "__main__":
    main()
