"""A client of a lease's worker that speaks the wire protocol by hand, with none of the shim's checks:
it does not verify the worker's proof, so what a test sees is the worker's own decision. Also the check
that a recorded connection shows no usable piece of the lease's secret."""

from __future__ import annotations

import base64
import secrets
import socket

from virtualize.common import _wire
from virtualize.common._calls import CALL_IDS, INTERNAL, WIRE_VERSION

HELLO, PROVE = INTERNAL["gpHello"], INTERNAL["gpProve"]


def recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return data
        data += chunk
    return data


def reply(sock: socket.socket) -> tuple[int, bytes, bytes]:
    header = recv_exact(sock, _wire.REPLY.size)
    if len(header) < _wire.REPLY.size:
        raise ConnectionResetError("closed")
    result, outs_len, bulk_len = _wire.REPLY.unpack(header)
    return result, recv_exact(sock, outs_len), recv_exact(sock, bulk_len)


def frame(call, args: bytes = b"", bulk: bytes = b"", flags: int = _wire.FLAG_WANTS_REPLY) -> bytes:
    return _wire.REQUEST.pack(CALL_IDS[call], flags, len(args), 0, len(bulk)) + args + bulk


def hello(sock: socket.socket) -> tuple[bytes, bytes, bytes]:
    """Send a hello; return our nonce, the worker's nonce and its proof."""
    nonce_c = secrets.token_bytes(_wire.NONCE_BYTES)
    sock.sendall(frame(HELLO, HELLO.in_struct.pack(WIRE_VERSION), nonce_c))
    result, _, answer = reply(sock)
    assert result == 0
    return nonce_c, answer[: _wire.NONCE_BYTES], answer[_wire.NONCE_BYTES :]


def handshake(sock: socket.socket, secret: bytes) -> int:
    """The client's side of the handshake, the worker's proof unchecked; returns the answer to ours."""
    nonce_c, nonce_w, _ = hello(sock)
    sock.sendall(frame(PROVE, b"", _wire.proof(secret, _wire.CLIENT_LABEL, nonce_w, nonce_c)))
    return reply(sock)[0]


def connect_local(name: str) -> socket.socket:
    """The worker's local socket (abstract namespace), as any process on its host can reach it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect("\0" + name)
    return sock


# A piece this long of any form of the secret is worth reporting: 6 bytes are 48 bits of a 256-bit key,
# and random traffic of tens of MiB holds a given 6-byte string with a chance of about 1e-7.
LEAK_WINDOW = 6


def secret_forms(secret: str) -> dict[str, bytes]:
    """The ways a program could put the lease's secret (`secrets.token_urlsafe`) on the wire."""
    text = secret.encode()
    raw = base64.urlsafe_b64decode(text + b"=" * (-len(text) % 4))
    return {
        "text": text,
        "key bytes": raw,
        "hex": raw.hex().encode(),
        "HEX": raw.hex().upper().encode(),
        "base64 of the text": base64.b64encode(text),
        "UTF-16": secret.encode("utf-16-le"),
    }


def secret_leaks(secret: str, seen: bytes, window: int = LEAK_WINDOW) -> list[str]:
    """Every piece of `window` bytes (a character's width more for UTF-16) of each form of the secret
    found in `seen`: empty when the recording shows none of it."""
    found = []
    for form, data in secret_forms(secret).items():
        width = window * (2 if form == "UTF-16" else 1)
        for start in range(0, len(data) - width + 1):
            piece = data[start : start + width]
            if piece in seen:
                found.append(f"{form}[{start}:{start + width}]")
                break
    return found
