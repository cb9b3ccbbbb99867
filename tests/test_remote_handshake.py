"""The data connection's handshake and frame decoder, at the socket level.

The shim and a lease's worker prove to each other that they hold the lease's secret without sending it
(virtualize/common/_wire.py); a recorded handshake replayed later is refused; a peer without the secret gets
nothing; and whatever bytes a client sends after the handshake, the worker answers or closes that
connection and keeps serving the others. Real worker processes (host executor), real sockets, the
shim compiled from this tree.
"""

from __future__ import annotations

import os
import secrets
import socket
import struct
import threading
from typing import ClassVar

import pytest
import remote_helpers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from raw_wire_client import HELLO, PROVE, frame, handshake, hello, recv_exact, reply, secret_leaks
from remote_helpers import client_env, needs_cc, run_client
from tcp_proxy import TcpProxy

from server.workers import WorkerDevice, start_worker
from virtualize.common import _wire
from virtualize.common._calls import CALLS, INTERNAL
from virtualize.common._results import CUresult

shim_dir = remote_helpers.shim_dir  # fixtures
worker = remote_helpers.worker


def connect(handle) -> socket.socket:
    return socket.create_connection((handle.host, handle.port), timeout=10)


def test_both_ends_prove_the_secret_and_a_joined_client_is_served(worker):
    with connect(worker) as sock:
        nonce_c, nonce_w, proof_w = hello(sock)
        secret = worker.secret.encode()
        assert proof_w == _wire.proof(secret, _wire.WORKER_LABEL, nonce_c, nonce_w)  # the worker holds it
        sock.sendall(frame(PROVE, b"", _wire.proof(secret, _wire.CLIENT_LABEL, nonce_w, nonce_c)))
        result, outs, _ = reply(sock)
        assert result == 0 and PROVE.out_struct.unpack(outs) == (1,)  # one device in this lease
        sock.sendall(_wire.REQUEST.pack(60000, _wire.FLAG_WANTS_REPLY, 0, 0, 3) + b"xyz")  # no such call
        assert reply(sock)[0] == CUresult.INVALID_VALUE


def test_a_client_that_does_not_open_with_the_handshake_is_closed_at_once(worker):
    with connect(worker) as sock:
        sock.sendall(_wire.REQUEST.pack(5, _wire.FLAG_WANTS_REPLY, 0, 0, 0))
        assert sock.recv(64) == b""
    with connect(worker) as sock:  # a hello, then a call instead of the proof
        hello(sock)
        sock.sendall(frame(INTERNAL["gpSetContext"], struct.pack("<Q", 0)))
        assert sock.recv(64) == b""


def test_a_client_without_the_secret_is_refused(worker):
    with connect(worker) as sock:
        assert handshake(sock, b"guessed") == CUresult.NOT_PERMITTED
        assert sock.recv(64) == b""  # and the connection is closed


@needs_cc
def test_the_secret_never_crosses_the_wire_and_a_recorded_handshake_cannot_be_replayed(shim_dir, worker):
    proxy = TcpProxy(worker.host, worker.port)
    try:
        env = client_env(shim_dir, worker, **through(proxy))
        out, _ = run_client("copies", env)
        assert out  # the program ran through the proxy
    finally:
        proxy.close()
    seen = bytes(proxy.to_target) + bytes(proxy.to_client)
    assert secret_leaks(worker.secret, seen) == []  # no piece of it, in any encoding
    assert KNOWN_PLAINTEXT in seen  # on loopback the data itself is not encrypted (next test)
    # Replay what the client sent, byte for byte, on a new connection: the worker's nonce is new, so
    # the recorded proof is wrong and the worker refuses before any call runs.
    handshake_bytes = _wire.REQUEST.size * 2 + HELLO.in_struct.size + _wire.NONCE_BYTES + _wire.PROOF_BYTES
    with connect(worker) as sock:
        sock.sendall(bytes(proxy.to_target[:handshake_bytes]))
        assert reply(sock)[0] == 0  # the hello is answered (with a fresh nonce) ...
        assert reply(sock)[0] == CUresult.NOT_PERMITTED  # ... the replayed proof is not


KNOWN_PLAINTEXT = bytes(range(256))  # what the `copies` scenario copies with cuMemcpy, among random data


def through(proxy: TcpProxy) -> dict[str, str]:
    """The client's environment for reaching the worker through `proxy`, which stands for the network
    between two hosts: so no local socket either."""
    return {"GPUPOOL_WORKER": f"127.0.0.1:{proxy.port}", "GPUPOOL_WORKER_LOCAL": ""}


def recorded_run(shim_dir, worker, scenario: str, **env) -> tuple[dict[str, str], str, bytes]:
    """Run a scenario through a recording proxy; its output, stderr and every byte the proxy saw."""
    proxy = TcpProxy(worker.host, worker.port)
    try:
        out, err = run_client(scenario, client_env(shim_dir, worker, **through(proxy), **env))
    finally:
        proxy.close()
    return out, err, bytes(proxy.to_target) + bytes(proxy.to_client)


# The shim's answers over TLS: read at once (as on hosts of fewer than 4 CPUs), or polled for 40 µs first (it
# peeks at the socket before SSL_read sleeps; the default on larger hosts), with answers slower than that.
SPIN = pytest.mark.parametrize("spin", ["0", "40"], ids=["reads-at-once", "polls-first"])


@needs_cc
@SPIN
def test_host_functions_come_back_over_an_encrypted_callback_connection(shim_dir, worker, spin):
    out, err, _ = recorded_run(
        shim_dir, worker, "callbacks", GPUPOOL_DATA_ENCRYPTION="always", GPUPOOL_SHIM_SPIN_US=spin
    )
    assert out["order"] == "host1,callback2:0:True,host3" and out["many"] == "True", out
    assert "gpupool:" not in err


@needs_cc
@SPIN
def test_copies_to_page_locked_memory_come_back_over_an_encrypted_callback_connection(shim_dir, worker, spin):
    """Their bytes share the callback connection with host functions, sent while the worker waits for
    a host function's answer on it: one TLS session, written and read at once."""
    out, err, _ = recorded_run(
        shim_dir, worker, "async_copies", GPUPOOL_DATA_ENCRYPTION="always", GPUPOOL_SHIM_SPIN_US=spin
    )
    assert out["stream_sync"] == out["host_function"] == "True,True", out
    assert out["many_landed"] == out["many_sent_back"] == out["host_function_saw"] == "True", out
    assert "gpupool:" not in err


@needs_cc
@pytest.mark.parametrize("lanes", ["3", "0"])
def test_large_copies_to_page_locked_memory_come_back_in_pieces_over_several_encrypted_connections(
    shim_dir, capfd, lanes
):
    """Over TLS a connection carries what one CPU encrypts, so a process attaches as many delivery
    connections as it has lanes beside its callback connection, and a copy of 2 MiB or more into its
    page-locked memory comes back in pieces on all of them at once (GPUPOOL_SHIM_LANES=0: none, whole on
    the callback connection). Either way each copy's bytes land whole and in place before anything shows
    it done, and a host function behind it sees them."""
    handle = start_worker(
        "pieces", [WorkerDevice(0, "", 64 << 20)], bind_host="127.0.0.1", env={}, executor="host"
    )
    try:
        env = client_env(shim_dir, handle, GPUPOOL_DATA_ENCRYPTION="always", GPUPOOL_SHIM_LANES=lanes)
        out, err = run_client("async_copies", env)
    finally:
        handle.stop()
    shown_done = ("stream_sync", "event_sync", "event_query", "ctx_sync", "stream_wait_event")
    assert {k: out[k] for k in shown_done} == dict.fromkeys(shown_done, "True,True"), out
    assert out["host_function"] == "True,True" and out["many_landed"] == out["host_function_saw"] == "True", (
        out
    )
    assert "gpupool:" not in err
    attached = capfd.readouterr().err.count("a delivery connection of its process")
    assert attached == (3 if lanes == "3" else 0)


@needs_cc
def test_overlapping_copies_in_pieces_keep_the_later_ones_bytes(shim_dir, worker):
    """Copies of different sizes into one page-locked buffer on one stream, back to back: their pieces
    are cut at different offsets and land from several connections' threads at once, yet where two
    wrote the later one's bytes stay, in every round, as natively."""
    out, err = run_client(
        "overlapping_async_copies", client_env(shim_dir, worker, GPUPOOL_DATA_ENCRYPTION="always")
    )
    assert out["rounds_wrong"] == "0", err


@needs_cc
def test_an_encrypted_run_shows_the_network_neither_the_secret_nor_the_data(shim_dir, worker):
    """What the shim does whenever the worker is on another host, forced here on loopback."""
    out, _, seen = recorded_run(shim_dir, worker, "copies", GPUPOOL_DATA_ENCRYPTION="always")
    assert out["htod_dtoh"] == "True" and out["generic"] == "True"
    assert len(seen) > 20 << 20  # the run's 10 MiB copies went through the proxy, both ways
    assert secret_leaks(worker.secret, seen) == []
    assert KNOWN_PLAINTEXT not in seen
    assert seen[:1] == b"\x16"  # a TLS record from the first byte


@needs_cc
def test_the_shim_refuses_a_worker_whose_certificate_is_not_the_pinned_one(shim_dir, worker):
    env = {"GPUPOOL_DATA_ENCRYPTION": "always", "GPUPOOL_WORKER_TLS_SHA256": "00" * 32}
    out, err = run_client("no_lease", client_env(shim_dir, worker, **env))
    assert out == {"init": "800", "count": "800"}
    assert "its TLS certificate is not the one the pool server gave for this lease" in err


@needs_cc
def test_a_worker_that_offers_no_encryption_is_refused_when_encryption_is_needed(shim_dir, worker):
    env = {"GPUPOOL_DATA_ENCRYPTION": "always", "GPUPOOL_WORKER_TLS_SHA256": ""}
    out, err = run_client("no_lease", client_env(shim_dir, worker, **env))
    assert out == {"init": "800", "count": "800"}
    assert "offers no encryption" in err


def test_only_addresses_on_this_host_count_as_loopback():
    from virtualize.server._data_tls import is_loopback

    assert all(map(is_loopback, ["127.0.0.1", "127.3.4.5", "::1", "::ffff:127.0.0.1", "localhost"]))
    assert not any(map(is_loopback, ["10.0.0.1", "192.168.1.2", "::ffff:10.0.0.1", "fe80::1", "gpu1"]))


@needs_cc
def test_the_shim_refuses_a_worker_that_cannot_prove_the_secret(shim_dir, worker):
    """Something else listening at the lease's address (a stale port reused, an impostor) gets no calls."""
    impostor = socket.create_server(("127.0.0.1", 0))
    got = bytearray()

    def answer() -> None:
        sock, _ = impostor.accept()
        with sock:
            got.extend(recv_exact(sock, _wire.REQUEST.size + HELLO.in_struct.size + _wire.NONCE_BYTES))
            bulk = os.urandom(_wire.NONCE_BYTES + _wire.PROOF_BYTES)
            sock.sendall(_wire.REPLY.pack(0, 0, len(bulk)) + bulk)
            got.extend(sock.recv(4096))  # the shim must close here, sending nothing more

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    env = client_env(
        shim_dir, worker, GPUPOOL_WORKER=f"127.0.0.1:{impostor.getsockname()[1]}", GPUPOOL_WORKER_LOCAL=""
    )
    out, err = run_client("no_lease", env)
    thread.join(10)
    impostor.close()
    assert out == {"init": "800", "count": "800"}  # CUDA_ERROR_NOT_PERMITTED
    assert "do not share the lease's secret" in err
    assert len(got) == _wire.REQUEST.size + HELLO.in_struct.size + _wire.NONCE_BYTES  # no proof, no calls


# -- the frame decoder under arbitrary input ---------------------------------------------------------------

frames = st.lists(
    st.tuples(
        st.one_of(st.integers(0, len(CALLS) + 5), st.integers(0, 2**32 - 1)),  # call id: real ones mostly
        st.integers(0, 3),  # flags
        st.binary(max_size=96),  # in-arguments, of any length
        st.binary(max_size=64),  # bulk
        st.integers(-8, 8),  # how much the declared bulk length lies
    ),
    min_size=1,
    max_size=12,
)


@pytest.fixture(scope="module")
def fuzzed_worker():
    handle = remote_helpers.start_worker(
        "fuzzed-lease",
        [remote_helpers.WorkerDevice(0, "", 64 * remote_helpers.MiB)],
        bind_host="127.0.0.1",
        env={},
        executor="host",
    )
    yield handle
    handle.stop()


@settings(
    max_examples=250,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(frames=frames)
def test_the_worker_survives_any_frames_after_the_handshake(fuzzed_worker, frames):
    with connect(fuzzed_worker) as sock:
        sock.settimeout(5)
        assert handshake(sock, fuzzed_worker.secret.encode()) == 0
        for call_id, flags, args, bulk, lie in frames:
            declared = max(0, len(bulk) + lie)
            try:
                sock.sendall(_wire.REQUEST.pack(call_id, flags, len(args), 0, declared) + args + bulk)
            except OSError:
                break  # the worker closed this connection: allowed
    # Whatever that connection did, the worker serves a new one.
    with connect(fuzzed_worker) as sock:
        assert handshake(sock, fuzzed_worker.secret.encode()) == 0
        sock.sendall(frame(INTERNAL["gpSetContext"], struct.pack("<Q", 0), flags=0))
        count = next(c for c in CALLS if c.name == "cuDeviceGetCount")
        sock.sendall(frame(count))
        result, outs, _ = reply(sock)
        assert (result, outs) == (0, struct.pack("<i", 1))


def test_kernel_parameters_shorter_than_the_functions_layout_are_launched_padded_with_zeros(tmp_path):
    """A launch whose parameters end before the function's layout does (an `extra` buffer: NCCL declares a
    4 KiB argument struct and sends the part its work uses, and the driver takes it) runs, on the Python
    path and on the native loop alike, with the missing bytes zero: the driver reads the layout's length
    and never past what arrived."""
    from virtualize.server._executor_host import HostExecutor
    from virtualize.server.worker import Worker

    class Spy(HostExecutor):
        launched: ClassVar[list[bytes]] = []

        def launch(self, launch) -> None:
            self.launched.append(bytes(launch.params))
            super().launch(launch)

    devices = [remote_helpers.WorkerDevice(0, "", 64 * remote_helpers.MiB)]
    worker = Worker("spy", devices, Spy(devices), tmp_path, "the secret")
    sock, served = socket.socketpair()
    thread = threading.Thread(target=worker._connection, args=(served, None))
    thread.start()

    def call(name: str, *ins, bulk: bytes = b"", symbol: str | None = None):
        c = next(c for c in CALLS if c.name == name and (symbol is None or c.symbol == symbol))
        sock.sendall(frame(c, c.in_struct.pack(*ins) if c.ins else b"", bulk, flags=_wire.FLAG_WANTS_REPLY))
        result, outs, _ = reply(sock)
        return result, (c.out_struct.unpack(outs) if outs else ())

    try:
        assert handshake(sock, b"the secret") == 0
        assert call("cuInit", 0)[0] == 0
        result, (ctx,) = call("cuDevicePrimaryCtxRetain", 0)
        sock.sendall(frame(INTERNAL["gpSetContext"], struct.pack("<Q", ctx), flags=0))
        ptx = b".visible .entry k(.param .u64 out, .param .u32 n)\n{ ret; }\n"  # 12 bytes of parameters
        _, (module,) = call("cuModuleLoadData", bulk=ptx)
        result, (func,) = call("cuModuleGetFunction", module, bulk=b"k\0")
        assert result == 0
        launch = next(c for c in CALLS if c.name == "cuLaunchKernelEx")
        sent = [struct.pack("<QI", 7, 9), struct.pack("<Q", 7), struct.pack("<Q", 7), b""]
        for (
            params
        ) in sent:  # the first launch of a function is the Python path's; the later ones may be native
            sock.sendall(
                frame(launch, launch.in_struct.pack(func, 1, 1, 1, 1, 1, 1, 0, 0, 0), params, flags=0)
            )
            assert call("cuCtxSynchronize", symbol="cuCtxSynchronize")[0] == 0
        assert Spy.launched == [p.ljust(12, b"\0") for p in sent]
    finally:
        sock.close()
        thread.join(10)


def test_each_connections_thread_state_is_freed_when_its_client_goes(tmp_path):
    """The executor's per-thread state (the CUDA executor's page-locked staging buffers) goes with the
    connection: a worker serving many short runs would otherwise pin memory for every run it served."""
    from virtualize.server._executor_host import HostExecutor
    from virtualize.server.worker import Worker

    class Spy(HostExecutor):
        ended: ClassVar[list[int]] = []

        def end_thread(self) -> None:
            self.ended.append(threading.get_ident())

    devices = [remote_helpers.WorkerDevice(0, "", 64 * remote_helpers.MiB)]
    worker = Worker("spy", devices, Spy(devices), tmp_path, "the secret")
    served_by = []
    for _ in range(3):
        client, served = socket.socketpair()
        thread = threading.Thread(target=worker._connection, args=(served, None))
        thread.start()
        assert handshake(client, b"the secret") == 0
        client.close()
        thread.join(10)
        served_by.append(thread.ident)
    assert Spy.ended == served_by  # once per connection, on its own thread, after it ended


def test_the_leak_check_finds_a_short_piece_of_the_secret_in_any_of_its_encodings():
    """What the two recordings above are checked with: a 6-byte piece of the secret as text, as its key
    bytes, in hex, in base64 or in UTF-16, anywhere in megabytes of traffic, is found; clean traffic is not
    flagged."""
    from raw_wire_client import secret_forms

    secret = secrets.token_urlsafe(32)
    noise = os.urandom(4 << 20)
    assert secret_leaks(secret, noise) == []
    for form, data in secret_forms(secret).items():
        piece = data[7:19] if form == "UTF-16" else data[7:13]
        assert secret_leaks(secret, noise[:1000] + piece + noise[1000:]), form
