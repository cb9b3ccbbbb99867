"""The command ring (GPUPOOL_SHIM_RING=1, issue 31): a program on the worker's host whose connection's
frames and answers go through memory both map, against a real host-executor worker. The same programs
give the same answers over the ring as over the socket; either end dying is noticed by the other.
"""

from __future__ import annotations

import mmap
import os
import signal
import socket
import struct
import subprocess
import sys
import time

from remote_helpers import CLIENT, MiB, client_env, needs_cc, parse, run_client, shim_dir, worker
from test_remote_shared_copies import call, joined

from server.workers import WorkerDevice, start_worker
from virtualize.common import _wire
from virtualize.common._calls import CALL_IDS, CALLS, INTERNAL
from virtualize.common._results import CUresult

pytestmark = needs_cc
__all__ = ["shim_dir", "worker"]  # fixtures

RING_USED = "went through the command ring"  # the shim's profile says so at exit


def ring_env(shim_dir, worker, **extra) -> dict[str, str]:
    return client_env(shim_dir, worker, **{"GPUPOOL_SHIM_RING": "1", "GPUPOOL_SHIM_PROFILE": "1", **extra})


def test_off_or_across_tcp_the_connection_stays_on_the_socket(shim_dir, worker):
    """Unset or 0, nothing changes: the program's connection never asks for the ring; on over TCP (as
    from another host), there is no memory to share and it stays on the socket too."""
    unset = client_env(shim_dir, worker, GPUPOOL_SHIM_PROFILE="1")
    tcp = ring_env(shim_dir, worker)
    tcp.pop(_wire.ENV_LOCAL)
    for env in (unset, ring_env(shim_dir, worker, GPUPOOL_SHIM_RING="0"), tcp):
        out, err = run_client("native_dispatch", env)
        assert out["stream_sync"] == "0" and RING_USED not in err


def test_programs_get_the_same_answers_over_the_ring_as_over_the_socket(shim_dir, worker):
    """Launches, records, queries and synchronises the native loop serves, kernel output ahead of its
    synchronise, host functions called back, elapsed times of many pairs, copies of every size (in
    their frame, and through shared memory whose descriptor now comes beside the ring): the same
    answers, and the profile says the ring carried them."""
    for scenario in ("native_dispatch", "printf", "callbacks", "elapsed_many", "kernels", "copies"):
        socket_out, _ = run_client(scenario, client_env(shim_dir, worker))
        ring_out, err = run_client(scenario, ring_env(shim_dir, worker))
        if scenario == "copies":  # the last byte it prints is the allocation's random content
            socket_out["memsets"], ring_out["memsets"] = socket_out["memsets"][:-2], ring_out["memsets"][:-2]
        assert ring_out == socket_out, scenario
        assert RING_USED in err, scenario


def test_async_copies_in_flight_keep_stream_and_event_order_over_the_ring(shim_dir, worker):
    """Copies into page-locked memory on four streams chained by events and held at a host function:
    none lands before its event completes, each is there once its event shows done; synchronous copies'
    bytes are right; all with every frame and answer through the ring."""
    out, err = run_client("async_copy_ordering", ring_env(shim_dir, worker))
    assert out["held_none_landed"] == out["held_still_none"] == "True"  # never before its event
    assert out["each_event_shows_its_copies"] == out["waiter_saw_all"] == "True"  # never later
    assert out["host_functions_see_exactly_the_earlier_copies"] == "True"
    assert out["chain_landed"] == out["chain_sent_back"] == out["chain_overwritten_after"] == "True"
    assert out["memsets_and_pageable_copies_in_stream_order"] == "True"
    assert RING_USED in err
    out, err = run_client("async_copies", ring_env(shim_dir, worker))
    shown_done = ("stream_sync", "event_sync", "event_query", "ctx_sync", "stream_wait_event")
    assert {k: out[k] for k in shown_done} == dict.fromkeys(shown_done, "True,True")
    assert out["synchronous_copy"] == "True,True" and out["many_landed"] == "True"
    assert RING_USED in err


def test_a_worker_killed_while_the_program_waits_ends_the_wait_with_one_error(shim_dir, worker):
    """The program waits in a synchronise over the ring (asleep on its futex); the worker is killed:
    the wait ends within moments with CUDA_ERROR_DEVICE_UNAVAILABLE, said once on stderr, no hang."""
    proc = subprocess.Popen(
        [sys.executable, str(CLIENT), "worker_dies_while_waiting"],
        env=ring_env(shim_dir, worker),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "ready 1"
        time.sleep(0.3)  # the synchronise is out and waited for
        os.kill(worker.pid, signal.SIGKILL)
        worker.proc.wait(10)
        stdout, stderr = proc.communicate(timeout=20)
    finally:
        proc.kill()
    out = parse(stdout)
    assert out["sync"] == out["again"] == "46"  # CUDA_ERROR_DEVICE_UNAVAILABLE
    assert stderr.count("lost the connection to the lease's worker") == 1


def test_a_program_killed_mid_copy_leaves_the_worker_and_its_other_programs_serving(shim_dir, worker):
    """Two programs stream 4 MiB copies through their rings (each copy larger than the ring, so one is
    always half through it); one is killed: the worker notices, frees what it held, and the other goes
    on to the end with its bytes right; a new program then gets the whole partition back."""
    env = ring_env(shim_dir, worker, GPUPOOL_SHIM_SHARED_COPIES="0")  # every copy in its frame, in the ring
    flood = [
        subprocess.Popen(
            [sys.executable, str(CLIENT), "copy_flood"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        for proc in flood:
            assert proc.stdout.readline().strip() == "ready 1"
        time.sleep(0.3)
        flood[0].kill()  # SIGKILL, most likely inside a copy's bytes
        flood[0].wait(10)
        stdout, stderr = flood[1].communicate("stop\n", timeout=30)
    finally:
        for proc in flood:
            proc.kill()
    assert parse(stdout) == {"last_copy": "True", "sync": "0"}, stderr
    assert RING_USED in stderr
    # The killed one's 24 MiB are freed once the worker notices it gone: 40 MiB of 64 fit again.
    deadline = time.monotonic() + 10
    while True:
        out, _ = run_client("quota", ring_env(shim_dir, worker))
        if out["first"] == "0" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert out["first"] == "0"


def test_with_the_native_loop_off_the_python_path_reads_and_answers_through_the_ring(shim_dir):
    """GPUPOOL_WORKER_NATIVE=0: every frame through the worker's Python, which reads frames and writes
    answers through the ring itself; ordering and bytes as above."""
    python_only = start_worker(
        "ring-python", [WorkerDevice(0, "", 64 * MiB)], bind_host="127.0.0.1",
        env={"GPUPOOL_WORKER_NATIVE": "0"}, executor="host",
    )  # fmt: skip
    try:
        out, err = run_client("async_copy_ordering", ring_env(shim_dir, python_only))
        assert out["held_none_landed"] == out["each_event_shows_its_copies"] == "True", err
        assert out["memsets_and_pageable_copies_in_stream_order"] == "True"
        assert RING_USED in err
        out, err = run_client("copies", ring_env(shim_dir, python_only))
        assert out["htod_dtoh"] == out["dtod"] == out["htod_async_took_bytes"] == "True", err
        assert RING_USED in err
    finally:
        python_only.stop()


# The ring's header page, as gp_ring.h lays it out (each direction's positions on their own cache lines).
TO_WORKER_HEAD, TO_WORKER_TAIL, PAGE = 64, 128, 4096


def test_a_client_that_scribbles_on_the_rings_positions_loses_its_connection_not_the_worker(shim_dir, worker):
    """A raw client on the worker's host takes a ring, sends the start of a frame with 8 MiB of bulk, then
    writes a read position 1 TiB ahead: the worker, reading the bulk, sees positions that make no sense
    and closes that connection (never reads past the ring); it keeps serving other programs."""
    with joined(worker, local=True) as sock:
        sock.sendall(_wire.REQUEST.pack(CALL_IDS[INTERNAL["gpRingAttach"]], _wire.FLAG_WANTS_REPLY, 0, 0, 0))
        data, fds, _, _ = socket.recv_fds(sock, _wire.REPLY.size + 8, 1)
        assert _wire.REPLY.unpack(data[: _wire.REPLY.size])[0] == 0 and len(fds) == 1
        (size,) = struct.unpack("<Q", data[_wire.REPLY.size :])
        ring = mmap.mmap(fds[0], PAGE + 2 * size)
        os.close(fds[0])
        load = next(c for c in CALLS if c.symbol == "cuModuleLoadData")
        frame = _wire.REQUEST.pack(CALL_IDS[load], _wire.FLAG_WANTS_REPLY, 0, 0, 8 * MiB)
        ring[PAGE : PAGE + len(frame)] = frame
        struct.pack_into(
            "<Q", ring, TO_WORKER_HEAD, len(frame)
        )  # published: the worker now waits for the bulk
        deadline = time.monotonic() + 5
        while struct.unpack_from("<Q", ring, TO_WORKER_TAIL)[0] != len(frame) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
        struct.pack_into("<Q", ring, TO_WORKER_HEAD, len(frame) + (1 << 40))
        sock.settimeout(10)
        assert sock.recv(1) == b""  # the worker closed this connection
        ring.close()
    out, err = run_client("native_dispatch", ring_env(shim_dir, worker))
    assert out["stream_sync"] == "0" and RING_USED in err  # the worker lives and serves


def test_only_a_process_on_the_workers_host_gets_a_ring(worker):
    """Over TCP (the worker could be another host's) gpRingAttach is refused: no memory is shared."""
    with joined(worker, local=False) as sock:
        assert call(sock, INTERNAL["gpRingAttach"])[0] == CUresult.NOT_SUPPORTED
        assert call(sock, INTERNAL["gpShmAttach"])[0] == CUresult.NOT_SUPPORTED  # the connection goes on
