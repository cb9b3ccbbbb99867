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
from pathlib import Path

TLS_RECORD_FIRST_BYTE = 0x16  # a TLS handshake record; the plaintext protocol starts with gpHello's id 0


class TlsUnavailable(RuntimeError):
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
    cert_path, key_path = state_dir / "worker.crt", state_dir / "worker.key"
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


def is_loopback(host: str) -> bool:
    """Whether a peer address never left this machine (127.0.0.0/8, ::1, IPv4-mapped loopback)."""
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return host == "localhost"
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or bool(mapped and mapped.is_loopback)
