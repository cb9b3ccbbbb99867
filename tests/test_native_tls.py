"""The worker's TLS in C (virtualize/server/native/tls.c through virtualize/server/_native_tls.py), against Python's
ssl as the client on real sockets: bytes both ways at once, and every way a connection goes wrong
ending in a clear error, not a hang."""

from __future__ import annotations

import os
import socket
import ssl
import threading
import time

import pytest
from test_remote_native_dispatch import encrypted_pair

from virtualize.server import _data_tls, _native_dispatch, _native_tls

pytestmark = pytest.mark.needs("native")


def client_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    return context


def test_a_copys_bytes_cross_both_ways_at_once_unchanged(tmp_path):
    client, served = encrypted_pair(tmp_path)
    up, down = os.urandom(24 << 20), os.urandom(24 << 20)
    received = bytearray(len(up))
    reader = threading.Thread(target=lambda: served.recv_into_all(memoryview(received)))
    reader.start()
    writer = threading.Thread(target=lambda: served.sendall(bytearray(down)))  # while the read goes on
    writer.start()
    got = bytearray()
    sender = threading.Thread(target=client.sendall, args=(up,))
    sender.start()
    while len(got) < len(down):
        got += client.recv(1 << 20)
    for thread in (sender, reader, writer):
        thread.join(30)
    assert received == up and got == down
    assert served.version() == "TLSv1.3"
    small = bytearray(5)
    client.sendall(b"hello")
    assert served.recv_into(small) == 5 and small == b"hello"
    served.sendall(b"bytes, read where they are")
    assert client.recv(100) == b"bytes, read where they are"
    client.close()
    assert served.recv_into(bytearray(10)) == 0  # the client went away: the end of the stream
    served.close()


def listening_worker_end(tmp_path, timeout: float):
    """A listener and a thread accepting one TLS connection in C; its outcome lands in the dict."""
    _data_tls.server_context(tmp_path, "test")
    context = _native_tls.server_context(tmp_path)
    listener = socket.create_server(("127.0.0.1", 0))
    outcome: dict = {}

    def accept() -> None:
        sock, _ = listener.accept()
        started = time.monotonic()
        try:
            outcome["stream"] = _native_tls.NativeTlsStream(context, sock, timeout)
        except ConnectionError as exc:
            outcome["error"] = str(exc)
            sock.close()
        outcome["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=accept)
    thread.start()
    return listener, thread, outcome


def test_a_client_that_never_starts_the_handshake_is_dropped_after_the_timeout(tmp_path):
    listener, thread, outcome = listening_worker_end(tmp_path, timeout=0.3)
    with socket.create_connection(listener.getsockname()):
        thread.join(10)
    assert outcome["error"] == "no TLS handshake within 300 ms" and outcome["seconds"] < 5


def test_plaintext_where_tls_is_expected_fails_the_handshake_with_the_reason(tmp_path):
    listener, thread, outcome = listening_worker_end(tmp_path, timeout=5)
    with socket.create_connection(listener.getsockname()) as sock:
        sock.sendall(b"\x16\x03\x01\x00\x40" + b"not a client hello".ljust(64, b"."))  # a record of junk
        thread.join(10)
    assert outcome["error"].startswith("TLS handshake failed")


def test_a_client_that_goes_away_mid_handshake_is_reported(tmp_path):
    listener, thread, outcome = listening_worker_end(tmp_path, timeout=5)
    socket.create_connection(listener.getsockname()).close()
    thread.join(10)
    assert outcome["error"] == "the peer closed the connection"


def test_a_read_that_waits_longer_than_the_timeout_raises_timeout(tmp_path):
    client, served = encrypted_pair(tmp_path)
    served.settimeout(0.2)
    with pytest.raises(TimeoutError):
        served.recv_into(bytearray(10))
    client.sendall(b"late")  # the stream is still good afterwards
    data = bytearray(4)
    assert served.recv_into_all(memoryview(data)) and data == b"late"
    client.close()
    served.close()


def test_turned_off_with_the_native_loop(tmp_path, monkeypatch):
    _data_tls.server_context(tmp_path, "test")
    monkeypatch.setenv(_native_dispatch.ENV, "0")
    assert _native_tls.server_context(tmp_path) is None  # the worker then uses _data_tls.TlsStream


def test_a_certificate_that_does_not_load_is_reported(tmp_path, caplog):
    (tmp_path / _data_tls.CERT_FILE).write_text("not a certificate")
    (tmp_path / _data_tls.KEY_FILE).write_text("not a key")
    assert _native_tls.server_context(tmp_path) is None
    assert "cannot load the worker's certificate and key" in caplog.text


def test_closing_from_another_thread_ends_a_waiting_read_without_harm(tmp_path):
    """The callback connection's stream is closed by its own thread while the driver's thread may be
    waiting on it for an answer: the wait ends, the TLS session is freed only after it has."""
    client, served = encrypted_pair(tmp_path)
    outcome = {}

    def read() -> None:
        try:
            outcome["got"] = served.recv_into(bytearray(10))
        except OSError as exc:
            outcome["error"] = exc

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.1)  # the reader is waiting inside C
    served.close()
    reader.join(5)
    assert not reader.is_alive()
    assert outcome.get("got") == 0 or isinstance(outcome.get("error"), ConnectionError)
    with pytest.raises(ConnectionError):
        served.sendall(b"after close")
    client.close()
