"""Large copies over an encrypted connection striped across more connections of the process ("lanes":
virtualize/server/_lanes.py on the worker, gp_bulk_copy in the shim): a program gets the same bytes and answers
with lanes and without, and the copies' pieces meet their copy whatever order they arrive in, with
nothing left waiting when a lane goes away."""

from __future__ import annotations

import re
import threading
import time

import pytest
import remote_helpers
from remote_helpers import client_env, ipc_pair, needs_cc, run_client

from virtualize.common._results import CUresult
from virtualize.server._lanes import WAIT_S, Lanes

shim_dir = remote_helpers.shim_dir  # fixture
worker = remote_helpers.worker  # fixture

EXPECTED = {
    "htod": "0",
    "dtoh": "0",
    "both_ways_equal": "True",
    "offset_equal": "True",
    "reads_equal": "True",
    "htod_async": "0",
    "dtoh_async": "0",
    "stream_sync": "0",
    "async_equal": "True",
    "dtoh_past_allocation": "1",  # CUDA_ERROR_INVALID_VALUE
    "htod_past_allocation": "1",
    "sync_after": "0",
    "still_works": "True",
}


@needs_cc
@pytest.mark.parametrize("lanes", ["3", "5"])
def test_striped_copies_land_as_through_one_connection(shim_dir, worker, lanes):
    runs = {}
    for name, env in {
        "lanes": {"GPUPOOL_DATA_ENCRYPTION": "always", "GPUPOOL_SHIM_LANES": lanes},
        "one connection": {"GPUPOOL_DATA_ENCRYPTION": "always", "GPUPOOL_SHIM_LANES": "0"},
        "plaintext": {"GPUPOOL_DATA_ENCRYPTION": "never"},
    }.items():
        runs[name] = run_client("lanes", client_env(shim_dir, worker, GPUPOOL_SHIM_PROFILE="1", **env))
    for name, (out, _) in runs.items():
        assert out == EXPECTED, name
    assert f"went in pieces across {lanes} connections" in runs["lanes"][1]
    assert "went in pieces" not in runs["one connection"][1] + runs["plaintext"][1]


PINNED_EXPECTED = {
    "in_flight_sync": "0",
    "in_flight_equal": "True",
    "freed_at_once": "0",
    "freed_sync": "0",
    "freed_equal": "True",
    "again_sync": "0",
    "again_equal": "True",
}


@needs_cc
def test_copies_from_page_locked_memory_return_before_their_pieces_and_land_in_stream_order(shim_dir, worker):
    """A copy to the device from page-locked memory across the lanes returns once its pieces are on their way
    (the shim joins them before the lanes carry anything else or the memory is freed); four in flight and a
    memset after them, a source freed right after its copy, a source refilled after a synchronise: the device
    holds what stream order gives, with lanes as through one connection."""
    runs = {}
    for name, env in {
        "lanes": {"GPUPOOL_DATA_ENCRYPTION": "always", "GPUPOOL_SHIM_LANES": "3"},
        "one connection": {"GPUPOOL_DATA_ENCRYPTION": "always", "GPUPOOL_SHIM_LANES": "0"},
    }.items():
        runs[name] = run_client("lanes_pinned", client_env(shim_dir, worker, GPUPOOL_SHIM_PROFILE="1", **env))
    for name, (out, _) in runs.items():
        assert out == PINNED_EXPECTED, name
    assert "went in pieces across 3 connections" in runs["lanes"][1]


@needs_cc
@pytest.mark.parametrize("encryption", ["always", "never"])
def test_frames_held_to_go_together_reach_the_worker_without_a_later_call(shim_dir, worker, encryption):
    """The shim holds unanswered frames a moment to send them together (over TLS in one record, on the
    worker's local socket in one send): a memset and a host function, then no CUDA call until the host
    function has run, still reach the worker (the flusher sends them once their time is up; without it this
    program waits forever); held frames, and the synchronise that follows them, keep their order."""
    for coalesce in ("30", "5000"):
        env = client_env(
            shim_dir, worker, GPUPOOL_DATA_ENCRYPTION=encryption, GPUPOOL_SHIM_COALESCE_US=coalesce
        )
        out, _ = run_client("held_frames", env)
        assert out["ran_without_a_call"] == "True", coalesce
        assert out["memset"] == "3c3c3c3c"


@needs_cc
def test_calls_that_want_no_answer_go_many_to_a_send_on_the_local_socket(shim_dir, worker):
    """A framework's stream of launches, memsets and records costs the program a system call each when
    each frame is its own send: 8-10 µs a launch where the worker sleeps between calls (CuPy's suites on
    an H200). Held together, 1000 memsets take far fewer sends, and the last one's bytes are the ones seen
    after the synchronise; with holding off (GPUPOOL_SHIM_COALESCE_US=0), one send each."""
    sends = {}
    for coalesce in ("30", "0"):
        env = client_env(shim_dir, worker, GPUPOOL_SHIM_PROFILE="1", GPUPOOL_SHIM_COALESCE_US=coalesce)
        out, err = run_client("held_sends", env)
        assert out["memset"] == "e7e7e7e7"
        frames, sent = map(int, re.search(r"(\d+) frames went to the worker in (\d+) sends", err).groups())
        assert frames > 1000
        sends[coalesce] = sent
    assert sends["0"] > 1000
    assert sends["30"] < 300


@pytest.mark.parametrize("encryption", ["always", "never"])
def test_a_query_of_an_event_whose_record_is_still_held_is_answered_not_ready_without_a_round_trip(
    shim_dir, worker, encryption
):
    """An event whose record the shim still holds cannot be done on the GPU: its query is NOT_READY at once,
    where it was a round trip each (71 µs in CuPy's Lanczos tests on an H200), and the held frames go then,
    so the next queries see it done and the bytes before the record in place; a destroyed event's query is
    refused by the worker as before. With holding off (GPUPOOL_SHIM_COALESCE_US=0) every query goes to the
    worker. Frames are held up to 10 ms here, not the default 30 µs, so that a busy test machine's flusher
    cannot send the record first: what is measured is the answer for a held record, not the scheduler."""
    answered_here = {}
    for coalesce in ("10000", "0"):
        env = client_env(shim_dir, worker, GPUPOOL_SHIM_PROFILE="1", GPUPOOL_SHIM_COALESCE_US=coalesce,
                         GPUPOOL_DATA_ENCRYPTION=encryption)  # fmt: skip
        out, err = run_client("query_after_record", env)
        assert out["stuck"] == "0" and out["wrong"] == "0", (coalesce, out)
        assert out["destroyed_query"] == str(int(CUresult.INVALID_HANDLE)), (coalesce, out)  # not NOT_READY
        calls, waited = map(int, re.search(r"gpupool: cuEventQuery\s+(\d+)\s+(\d+)", err).groups())
        answered_here[coalesce] = calls - waited
    assert answered_here["10000"] >= 150  # nearly every first query after a record
    assert answered_here["0"] == 0


@needs_cc
@pytest.mark.parametrize("encryption", ["always", "never"])
def test_frames_held_by_many_threads_reach_the_worker_whole_and_in_order(shim_dir, worker, encryption):
    """The shim's flusher sends held frames while the program's threads go on holding more and sending
    copies back at once: four threads' 8000 memsets and 160 copies all succeed (a frame cut into by another
    send would break the connection), each copy back finds the bytes of the memset its thread held just
    before it (sent after it, never ahead), and each thread's memory has its own last memset's bytes."""
    for coalesce in ("1", "30"):  # 1 µs: the flusher sends nearly each frame as the threads go on
        env = client_env(
            shim_dir, worker, GPUPOOL_DATA_ENCRYPTION=encryption, GPUPOOL_SHIM_COALESCE_US=coalesce
        )
        out, _ = run_client("held_threads", env)
        assert out["failed_calls"] == "0", coalesce
        assert out["last"] == " ".join(["cfcfcfcf"] * 4), coalesce


@pytest.mark.parametrize("encryption", ["always", "never"])
@pytest.mark.parametrize("isolate", ["0", "1"])
def test_a_record_of_an_interprocess_event_reaches_the_worker_before_the_call_returns(
    shim_dir, worker, isolate, encryption
):
    """Frames held to go together must not hide the work before an interprocess event's record from
    the lease's other processes: natively, once cuEventRecord returns, another process that waits on the
    event sees what came before the record on its stream, as PyTorch's CUDA tensors shared between
    processes rely on. Held back (up to 10 ms here), the memset before the record had not reached the
    worker when the other process looked. The same with a worker per process (GPUPOOL_ISOLATE): the
    consumer's worker maps the producer's memory and opens its event (virtualize.server._ipc_workers)."""
    env = client_env(
        shim_dir,
        worker,
        GPUPOOL_DATA_ENCRYPTION=encryption,
        GPUPOOL_SHIM_COALESCE_US="10000",
        GPUPOOL_ISOLATE=isolate,
    )
    if isolate == "1":  # two workers: the producer's must have done the record (behind a long kernel) first
        env["IPC_SLOW_PRODUCER"] = "1"
    with ipc_pair("ipc_event_producer", env) as tell:
        assert tell(tell.consumer, "before") == ["before", "00000000"]
        assert tell(tell.producer, "go") == ["recorded", "1"]
        assert tell(tell.consumer, "after_the_record") == ["after_the_record", "3c3c3c3c"]


class Staged:
    """The executor's queued copy (`Executor.lane_staged`), as the guard sees it: a buffer, and `filled()`."""

    def __init__(self, count: int) -> None:
        self.view = memoryview(bytearray(count))
        self.fills = 0

    def filled(self) -> None:
        self.fills += 1


def test_a_queued_copy_goes_on_once_its_last_piece_is_in_and_nobody_waits_for_it():
    lanes, staged = Lanes(), Staged(30)
    lanes.release(5, pieces=3, allowed=True, error=0, count=30, staged=staged)
    finished = []
    for _ in range(3):
        piece = lanes.piece(5)
        assert piece.staged is staged
        finished.append(lanes.piece_done(piece))
    assert finished == [False, False, True] and staged.fills == 1  # its stream goes on once, after the last


def test_a_lane_that_goes_away_lets_a_queued_copys_stream_go_on_with_an_error():
    lanes, staged = Lanes(), Staged(30)
    lanes.release(6, pieces=3, allowed=True, error=0, count=30, staged=staged)
    piece = lanes.piece(6)
    lanes.piece_done(piece)
    lanes.lane_lost()
    assert staged.fills == 1  # the stream is not left waiting for bytes that will not come
    assert piece.error == CUresult.DEVICE_UNAVAILABLE


def test_a_piece_that_comes_before_its_copy_waits_for_it():
    lanes, got = Lanes(), {}
    thread = threading.Thread(target=lambda: got.setdefault("copy", lanes.piece(7)))
    thread.start()
    time.sleep(0.05)
    assert "copy" not in got  # not checked yet: the piece must not touch memory
    lanes.release(7, pieces=1, allowed=True, error=0, device=0x1000, count=10)
    thread.join(5)
    assert got["copy"].allowed and got["copy"].device == 0x1000
    lanes.piece_done(got["copy"])
    assert lanes.wait_done(7).error == 0


def test_a_refused_copy_lets_its_pieces_through_and_answers_with_its_error():
    lanes = Lanes()
    copy = lanes.release(1, pieces=2, allowed=False, error=int(CUresult.INVALID_VALUE), count=10)
    for _ in range(2):
        piece = lanes.piece(1)
        assert piece is copy and not piece.allowed
        lanes.piece_done(piece)
    assert lanes.wait_done(1).error == CUresult.INVALID_VALUE


def test_a_lane_that_goes_away_fails_the_copy_waiting_for_it():
    lanes = Lanes()
    lanes.release(3, pieces=3, allowed=True, error=0, count=30)
    lanes.piece_done(lanes.piece(3))
    threading.Timer(0.1, lanes.lane_lost).start()
    started = time.monotonic()
    assert lanes.wait_done(3).error == CUresult.DEVICE_UNAVAILABLE
    assert time.monotonic() - started < WAIT_S / 2
    assert lanes.piece(4) is None  # and a piece of a copy never checked does not wait either
