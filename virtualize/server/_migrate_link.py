"""The link between a lease's worker and the worker of another server that receives the lease
(docs/remote.md, "Between servers"): one TCP connection, TLS where the receiving worker has a
certificate (pinned by its SHA-256, as the shim pins a worker's), and a handshake in which each end
proves it holds the receiving worker's one-time secret without sending it (HMAC over both ends'
nonces, as the client protocol's hello, with labels of its own so that neither proof is one of the
other protocol's).

On it go messages: a JSON object and the bulk bytes that follow it (`HEADER`: the JSON's length, the
bulk's length), e.g. the lease's manifest, then its memory, chunk by chunk. The memory may go over more
connections of the link, each made as the first (`virtualize.server._migrate_stripes`).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import secrets
import socket
import ssl
import struct

from virtualize.common import _wire
from virtualize.common.errors import VirtualizeError
from virtualize.server import _data_tls

SOURCE_LABEL = b"gpupool migration source 1\n"
TARGET_LABEL = b"gpupool migration target 1\n"
HEADER = struct.Struct("<IQ")  # the JSON's bytes, the bulk's bytes
MAX_JSON_BYTES = 2 << 30  # a manifest: its records carry the images of the lease's modules and libraries
HANDSHAKE_TIMEOUT_S = 10.0


class LinkError(VirtualizeError):
    """The link failed: refused, a wrong proof or certificate, a broken message, or the peer gone."""


class Link:
    """One end of the link: messages out and in, bulk bytes in chunks."""

    def __init__(self, sock) -> None:
        self.sock = sock
        self.bulk_left = 0

    def __enter__(self) -> Link:
        return self

    def __exit__(self, *_) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def abort(self) -> None:
        """End the connection now, from any thread: a read or write blocked on it in another thread fails at
        once (close would not wake it, and its descriptor could be reused under that thread: the owner closes
        it). The TCP socket's own shutdown: TLS's would drop its state under that thread."""
        native = getattr(self.sock, "native_stream", None)  # TLS in C: the stream's own socket
        raw = self.sock.sock if native else self.sock
        with contextlib.suppress(OSError):
            socket.socket.shutdown(raw, socket.SHUT_RDWR)

    def send(self, message: dict, bulk_bytes: int = 0) -> None:
        body = json.dumps(message).encode()
        self.sock.sendall(HEADER.pack(len(body), bulk_bytes) + body)

    def send_bytes(self, chunk) -> None:
        self.sock.sendall(chunk)

    def receive(self) -> dict:
        """The next message (its bulk, `bulk_left` bytes, is read with `read_into`)."""
        if self.bulk_left:
            raise LinkError(f"{self.bulk_left} bytes of the last message were not read")
        size, self.bulk_left = HEADER.unpack(self._exact(HEADER.size))
        if size > MAX_JSON_BYTES:
            raise LinkError(f"a message of {size} bytes is more than {MAX_JSON_BYTES}")
        try:
            message = json.loads(self._exact(size))
        except ValueError as exc:
            raise LinkError(f"an unreadable message ({exc})") from None
        if not isinstance(message, dict):
            raise LinkError("a message that is not a JSON object")
        return message

    def read_into(self, view: memoryview) -> None:
        """The next len(view) bytes of the message's bulk."""
        if len(view) > self.bulk_left:
            raise LinkError(f"{len(view)} bytes asked of a message with {self.bulk_left} left")
        if hasattr(self.sock, "recv_into_all"):  # TLS in C: the whole chunk in one call, outside the GIL
            if not self.sock.recv_into_all(view):
                raise LinkError("the other worker closed the link")
            self.bulk_left -= len(view)
            return
        got = 0
        while got < len(view):
            n = self.sock.recv_into(view[got:])
            if not n:
                raise LinkError("the other worker closed the link")
            got += n
        self.bulk_left -= len(view)

    def _exact(self, n: int) -> bytes:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self.sock.recv_into(view[got:])
            if not k:
                raise LinkError("the other worker closed the link")
            got += k
        return bytes(buf)


def connect(host: str, port: int, tls_sha256: str, secret: bytes, timeout: float) -> Link:
    """The sending worker's end: connect, encrypt (pinning `tls_sha256`; plaintext only to loopback) and
    prove the secret both ways. LinkError or OSError."""
    sock = socket.create_connection((host, port), timeout=HANDSHAKE_TIMEOUT_S)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls_sha256:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.minimum_version = ssl.TLSVersion.TLSv1_3
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE  # pinned below: the certificate is the worker's own
            sock = context.wrap_socket(sock)
            seen = hashlib.sha256(sock.getpeercert(binary_form=True) or b"").hexdigest()
            if not hmac.compare_digest(seen, tls_sha256.lower()):
                raise LinkError(f"{host}:{port} presented another certificate than its server announced")
        elif not _data_tls.is_loopback(sock.getpeername()[0]):
            raise LinkError(f"{host}:{port} offers no encryption and the link would leave this host")
        link = Link(sock)
        mine = secrets.token_bytes(_wire.NONCE_BYTES)
        link.send({"hello": mine.hex()})
        theirs, proof = _nonce_and_proof(link.receive())
        if not hmac.compare_digest(proof, _wire.proof(secret, TARGET_LABEL, mine, theirs)):
            raise LinkError(f"{host}:{port} does not hold the receiving worker's secret")
        link.send({"proof": _wire.proof(secret, SOURCE_LABEL, theirs, mine).hex()})
        if link.receive().get("ok") is not True:
            raise LinkError(f"{host}:{port} refused the link")
        sock.settimeout(timeout)
        return link
    except BaseException:
        with contextlib.suppress(OSError):
            sock.close()
        raise


def accept(
    sock: socket.socket, tls: ssl.SSLContext | None, secret: bytes, timeout: float, native_tls=None
) -> Link:
    """The receiving worker's end of a connection it accepted: TLS when it has a certificate (plaintext
    only from loopback), and the proofs; `timeout`: the longest one read or write may take from then on
    (a sender that stalls must not keep the GPUs). `native_tls`: the worker's TLS in C (the same certificate),
    which reads the lease's memory a chunk per call where Python's ssl takes a round of Python per 16 KiB record
    (`_native_tls`). LinkError or OSError."""
    sock.settimeout(HANDSHAKE_TIMEOUT_S)
    if tls is not None and native_tls is not None:
        sock = native_tls.stream(sock, HANDSHAKE_TIMEOUT_S)
    elif tls is not None:
        sock = tls.wrap_socket(sock, server_side=True)
    elif not _data_tls.is_loopback(sock.getpeername()[0]):
        raise LinkError(f"{sock.getpeername()[0]} sent plaintext from another host")
    link = Link(sock)
    hello = link.receive().get("hello")
    try:
        theirs = bytes.fromhex(str(hello))
    except ValueError:
        raise LinkError("the first message is not a hello") from None
    mine = secrets.token_bytes(_wire.NONCE_BYTES)
    link.send({"nonce": mine.hex(), "proof": _wire.proof(secret, TARGET_LABEL, theirs, mine).hex()})
    try:
        proof = bytes.fromhex(str(link.receive().get("proof")))
    except ValueError:
        raise LinkError("the second message is not a proof") from None
    if not hmac.compare_digest(proof, _wire.proof(secret, SOURCE_LABEL, mine, theirs)):
        link.send({"ok": False})
        raise LinkError("the sender does not hold this worker's migration secret")
    link.send({"ok": True})
    sock.settimeout(timeout)
    return link


def _nonce_and_proof(message: dict) -> tuple[bytes, bytes]:
    try:
        return bytes.fromhex(str(message["nonce"])), bytes.fromhex(str(message["proof"]))
    except (KeyError, ValueError):
        raise LinkError("the answer to the hello is not a nonce and a proof") from None
