"""Encryption of the data connection, the worker's side: a certificate of its own, pinned by the client.

Each worker makes a fresh key pair and a self-signed certificate when it starts (the `cryptography`
package; the key never leaves the worker's state directory) and reports the certificate's SHA-256
in its ready line; the pool server hands that fingerprint to the lease's owner with the secret, and
the shim accepts only a worker showing that certificate (TLS 1.3 through the system's libssl). The
secret handshake then runs inside the encrypted connection. Clients on the worker's own host may
skip encryption (loopback never leaves the machine); from anywhere else, plaintext is refused.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import os
import ssl
import threading
from pathlib import Path

from virtualize.common.errors import VirtualizeError

TLS_RECORD_FIRST_BYTE = 0x16  # a TLS handshake record; the plaintext protocol starts with gpHello's id 0
CERT_FILE, KEY_FILE = "worker.crt", "worker.key"  # in the worker's state directory


class TlsUnavailable(VirtualizeError):
    """The worker cannot offer encryption (the `cryptography` package is missing)."""


def server_context(state_dir: Path, lease_id: str) -> tuple[ssl.SSLContext, str]:
    """A TLS 1.3 server context with a new self-signed certificate, and that certificate's SHA-256 (hex)."""
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError as exc:
        raise TlsUnavailable(
            "the `cryptography` package is not installed (pip install 'gpupool[server]')"
        ) from exc
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"gpupool worker {lease_id}"[:64])])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=366))  # pinned by fingerprint: no expiry to manage
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = state_dir / CERT_FILE, state_dir / KEY_FILE
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.load_cert_chain(cert_path, key_path)
    return context, hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def shared_context(state_dir: Path) -> tuple[ssl.SSLContext, str]:
    """The context of the certificate `server_context` wrote to `state_dir` (a process worker shows the
    lease's worker's certificate), and its SHA-256."""
    cert_path, key_path = state_dir / CERT_FILE, state_dir / KEY_FILE
    try:
        pem = cert_path.read_text()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.load_cert_chain(cert_path, key_path)
    except (OSError, ssl.SSLError) as exc:
        raise TlsUnavailable(f"the lease's certificate in {state_dir} is unreadable ({exc})") from exc
    return context, hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem)).hexdigest()


def is_loopback(host: str) -> bool:
    """Whether a peer address never left this machine (127.0.0.0/8, ::1, IPv4-mapped loopback)."""
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return host == "localhost"
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or bool(mapped and mapped.is_loopback)


class TlsStream:
    """The worker's end of an encrypted data connection: TLS through memory buffers, the socket read
    and written in large pieces.

    `SSLContext.wrap_socket` reads a record's 5-byte header and its body in two system calls and
    writes each 16 KiB record with one more: ~200 000 system calls per GiB each way, which held a
    copy across a 25 Gbit/s link to a fraction of what the cipher does (bench/RESULTS.md, issue 12).
    Here OpenSSL en- and decrypts between memory BIOs and the socket moves up to `IO_BYTES` per call.
    It offers what the worker uses of a socket: recv_into, sendall, settimeout, version, close; and
    recv_into_all, a copy's bulk decrypted record after record in one loop. One thread may read while
    another writes (a callback connection carries copies out while an answer is awaited): the TLS
    session and its buffers are used under a lock, the socket's blocking reads outside it."""

    IO_BYTES = 1 << 20

    def __init__(self, sock, context: ssl.SSLContext, *, server_side: bool) -> None:
        self.sock = sock
        self.family = sock.family
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._in, self._out, server_side=server_side)
        self._buf = bytearray(self.IO_BYTES)
        self._view = memoryview(self._buf)
        self._lock = threading.Lock()

    def do_handshake(self) -> None:
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._flush()
                if not self._fill():
                    raise ConnectionResetError(
                        "the peer closed the connection during the TLS handshake"
                    ) from None
        self._flush()

    def recv_into(self, buffer, nbytes: int = 0) -> int:
        """Up to `nbytes` (default: len(buffer)) decrypted bytes into `buffer`; 0 at the end of the stream."""
        want = nbytes or len(buffer)
        while True:
            with self._lock:
                buffered = self._in.pending or self._tls.pending()
            if not buffered and not self._fill():
                return 0  # nothing buffered: read the socket first rather than fail a read (an exception)
            with self._lock:
                try:
                    got = self._tls.read(want, buffer)
                except ssl.SSLWantReadError:
                    got = -1
                except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                    return 0
                if self._out.pending:  # a post-handshake answer (a key update): out before anything else
                    self._flush()
            if got >= 0:
                return got
            if not self._fill():
                return 0

    def recv_into_all(self, view: memoryview) -> bool:
        """Fill all of `view` with decrypted bytes (a copy's bulk); False if the stream ends first."""
        read, n, pos = self._tls.read, len(view), 0
        while pos < n:
            with self._lock:
                try:
                    got = read(n - pos, view[pos:])
                except ssl.SSLWantReadError:
                    got = -1
                except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                    return False
            if got < 0:
                if not self._fill():
                    return False
                continue
            if not got:
                return False
            pos += got
        with self._lock:
            if self._out.pending:
                self._flush()
        return True

    def sendall(self, data) -> None:
        if len(data) <= self.IO_BYTES and isinstance(data, bytes):  # a reply: one record, one send
            with self._lock:
                self._tls.write(data)
                self._flush()
            return
        view = memoryview(data).cast("B")
        for start in range(0, len(view), self.IO_BYTES):
            with self._lock:
                self._tls.write(view[start : start + self.IO_BYTES])
                self._flush()

    def _fill(self) -> bool:
        got = self.sock.recv_into(self._view)  # the blocking part, outside the lock
        with self._lock:
            if not got:
                self._in.write_eof()
                return False
            self._in.write(self._view[:got])
        return True

    def _flush(self) -> None:
        if self._out.pending:
            self.sock.sendall(self._out.read())

    def version(self) -> str | None:
        return self._tls.version()

    def settimeout(self, timeout: float | None) -> None:
        self.sock.settimeout(timeout)

    def close(self) -> None:
        self.sock.close()
