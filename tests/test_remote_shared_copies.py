"""Large copies through memory a worker shares with a process on its host (gpShmAttach / gpShmHtoD /
gpShmDtoH), at the socket level against a real host-executor worker, and for a whole program.

The memory comes as a file descriptor over the worker's local socket only; every piece of a copy is
checked against the lease's memory like any copy; a copy larger than the shared memory goes in parts
and lands byte for byte; the program sees the same answers with the shared memory and without it.
"""

from __future__ import annotations

import mmap
import os
import re
import socket
import struct

import remote_helpers
from remote_helpers import client_env, needs_cc, run_client
from test_remote_handshake import handshake, reply

from server.workers import WorkerDevice, start_worker
from virtualize.common import _wire
from virtualize.common._calls import CALL_IDS, CALLS, INTERNAL
from virtualize.common._results import CUresult

shim_dir = remote_helpers.shim_dir  # fixtures
worker = remote_helpers.worker
BY_SYMBOL = {c.symbol: c for c in CALLS if c.symbol != "-"}
MiB = 1 << 20


def call(sock, c, *args, flags=_wire.FLAG_WANTS_REPLY, bulk=b""):
    packed = c.in_struct.pack(*args) if c.ins else b""
    sock.sendall(_wire.REQUEST.pack(CALL_IDS[c], flags, len(packed), 0, len(bulk)) + packed + bulk)
    if not flags & _wire.FLAG_WANTS_REPLY:
        return None
    result, outs, data = reply(sock)
    return result, (c.out_struct.unpack(outs) if outs else ()), data


def joined(worker, local: bool) -> socket.socket:
    if local:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect("\0" + worker.local)
    else:
        sock = socket.create_connection((worker.host, worker.port))
    sock.settimeout(10)
    assert handshake(sock, worker.secret.encode()) == 0
    result, (ctx,), _ = call(sock, BY_SYMBOL["cuDevicePrimaryCtxRetain"], 0)
    assert result == 0
    call(sock, INTERNAL["gpSetContext"], ctx, flags=0)
    return sock


def attach(sock) -> mmap.mmap:
    sock.sendall(_wire.REQUEST.pack(CALL_IDS[INTERNAL["gpShmAttach"]], _wire.FLAG_WANTS_REPLY, 0, 0, 0))
    data, fds, _, _ = socket.recv_fds(sock, _wire.REPLY.size + 8, 1)
    result, _, _ = _wire.REPLY.unpack(data[: _wire.REPLY.size])
    assert result == 0 and len(fds) == 1
    (size,) = struct.unpack("<Q", data[_wire.REPLY.size :])
    shared = mmap.mmap(fds[0], size)
    os.close(fds[0])
    return shared


def test_only_a_process_on_the_workers_host_gets_the_memory(worker):
    with joined(worker, local=False) as sock:  # TCP: the worker could be another host's
        assert call(sock, INTERNAL["gpShmAttach"])[0] == CUresult.NOT_SUPPORTED


def test_pieces_land_in_lease_memory_only_and_come_back_byte_for_byte(worker):
    htod, dtoh = INTERNAL["gpShmHtoD"], INTERNAL["gpShmDtoH"]
    with joined(worker, local=True) as sock:
        shared = attach(sock)
        result, (dptr,), _ = call(sock, BY_SYMBOL["cuMemAlloc_v2"], 3 * MiB)
        assert result == 0
        data = os.urandom(3 * MiB)
        shared[: 3 * MiB] = data
        # Three pieces of one copy: the first two unanswered, the last answered for all.
        for i in range(2):
            call(sock, htod, dptr + i * MiB, MiB, 0, i * MiB, 0, flags=0)
        assert call(sock, htod, dptr + 2 * MiB, MiB, 0, 2 * MiB, 1)[0] == 0
        shared[: 3 * MiB] = bytes(3 * MiB)
        sock.sendall(_wire.REQUEST.pack(CALL_IDS[dtoh], _wire.FLAG_WANTS_REPLY, 32, 0, 0)
                     + dtoh.in_struct.pack(dptr, 3 * MiB, 0, 0, MiB))  # fmt: skip
        answers = [reply(sock) for _ in range(3)]  # one per piece, as each lands
        assert [(r, dtoh.out_struct.unpack(outs)) for r, outs, _ in answers] == [
            (0, (0, MiB)), (0, (MiB, MiB)), (0, (2 * MiB, MiB))
        ]  # fmt: skip
        assert shared[: 3 * MiB] == data
        # Outside the lease's memory (a guessed address, past the allocation's end): refused.
        call(sock, htod, 0x7E0000000000, MiB, 0, 0, 0, flags=0)  # an unanswered piece fails...
        assert call(sock, htod, dptr, MiB, 0, MiB, 1)[0] == CUresult.INVALID_VALUE  # ...and the copy says so
        assert call(sock, htod, dptr + 2 * MiB, 2 * MiB, 0, 0, 1)[0] == CUresult.INVALID_VALUE
        assert call(sock, dtoh, dptr + MiB, 4 * MiB, 0, 0, MiB)[0] == CUresult.INVALID_VALUE
        assert call(sock, htod, dptr, MiB, 0, 64 * MiB, 1)[0] == CUresult.INVALID_VALUE  # past the memory
        assert call(sock, htod, dptr, MiB, 0, 0, 1)[0] == 0  # the connection goes on
        shared.close()


@needs_cc
def test_a_program_copies_the_same_with_the_shared_memory_and_without(shim_dir):
    """The same bytes land every way a copy can go: through shared memory (one or two threads writing
    it), through the socket only, with copies up to 1 MiB in their frames (GPUPOOL_SHIM_SHARED_MIN_KIB),
    and with that knob misspelt (said on stderr, the default kept); the shim's profile says which way
    the copies went."""
    big = start_worker(
        "copies", [WorkerDevice(0, "", 128 * MiB)], bind_host="127.0.0.1", env={}, executor="host"
    )
    try:
        with_shared, profiled = run_client(
            "shared_copies", client_env(shim_dir, big, GPUPOOL_SHIM_PROFILE="1")
        )
        two_threads, _ = run_client("shared_copies", client_env(shim_dir, big, GPUPOOL_SHIM_COPY_THREADS="2"))
        without, unshared = run_client(
            "shared_copies",
            client_env(shim_dir, big, GPUPOOL_SHIM_SHARED_COPIES="0", GPUPOOL_SHIM_PROFILE="1"),
        )
        # up to 1 MiB in their frames (the worker's native loop), larger ones through the shared memory
        in_frames, _ = run_client(
            "shared_copies", client_env(shim_dir, big, GPUPOOL_SHIM_SHARED_MIN_KIB="1024")
        )
        misspelt, said = run_client(
            "shared_copies", client_env(shim_dir, big, GPUPOOL_SHIM_SHARED_MIN_KIB="1M")
        )
    finally:
        big.stop()
    assert with_shared == two_threads == without == in_frames == misspelt
    assert "GPUPOOL_SHIM_SHARED_MIN_KIB=1M is not a number of KiB" in said
    assert "went through memory shared with the worker" in profiled
    assert "no memory shared with the worker: every copy went through the socket" in unshared
    assert with_shared == {
        "sizes": "262144 1048577 70254592",
        "htod_dtoh_equal": "True True True",
        "async_equal": "True",
        "offset_equal": "True",
        "past_allocation": "1",
    }


@needs_cc
def test_each_piece_of_a_shared_copy_goes_to_the_worker_as_it_is_written(shim_dir):
    """A large copy through the shared memory is eight pieces: each goes to the worker as soon as it is
    written here, so the worker's DMA of one overlaps the writing of the next — never held back with the
    frames that want no answer (GPUPOOL_SHIM_COALESCE_US, 10 ms here) until the copy's last piece."""
    big = start_worker(
        "pieces", [WorkerDevice(0, "", 128 * MiB)], bind_host="127.0.0.1", env={}, executor="host"
    )
    sends = {}
    try:
        for mib in (0, 32):
            env = client_env(
                shim_dir,
                big,
                GPUPOOL_SHIM_PROFILE="1",
                GPUPOOL_SHIM_COALESCE_US="10000",
                SHM_COPY_MIB=str(mib),
            )
            out, err = run_client("shared_copy_once", env)
            assert out["landed"] == "True"
            sends[mib] = int(re.search(r"frames went to the worker in (\d+) sends", err).group(1))
    finally:
        big.stop()
    assert sends[32] - sends[0] >= 8  # the pieces (4 MiB each), one send each at the least
