"""Where telemetry lives: a directory, or an S3-compatible bucket (``s3://bucket/prefix``).

The one module that owns ``pyarrow.fs.S3FileSystem`` (the S3 client inside the pyarrow wheel the
collector already needs). The collector writes objects through it; analytics reads through it too,
handing DuckDB an fsspec wrapper of the same client (``collector.reader``), because DuckDB's own
httpfs extension is not in the duckdb wheel and its extension repository may not be reachable.

Both layouts are the same: ``<root>/<table>/date=YYYY-MM-DD/host=<host>/<segment>.parquet`` where
``<root>`` is a directory or ``bucket/prefix``.

Credentials, endpoint and region come from the standard AWS environment (nothing on the command line,
so no secret shows in ``ps``):

=========================  =====================================================================
``AWS_ACCESS_KEY_ID``      access key; with ``AWS_SECRET_ACCESS_KEY`` (and ``AWS_SESSION_TOKEN``).
                           Unset: the AWS default chain (``~/.aws/credentials``, instance role).
``AWS_ENDPOINT_URL_S3``    the server of an S3-compatible store (MinIO, Ceph RGW), e.g.
                           ``https://minio.example:9000``; falls back to ``AWS_ENDPOINT_URL``.
                           Unset: AWS S3 itself.
``AWS_REGION``             the bucket's region (falls back to ``AWS_DEFAULT_REGION``, then
                           ``us-east-1``, which MinIO and Ceph accept).
=========================  =====================================================================
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from collector._errors import TelemetryWriteError

SCHEME = "s3://"
CONNECT_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 30.0
RETRY_ATTEMPTS = 3
_BUCKET_OK = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


@dataclass(frozen=True)
class S3Location:
    """``s3://bucket/prefix``: telemetry objects are keyed ``<prefix>/<table>/date=…/host=…/…``."""

    bucket: str
    prefix: str = ""  # no leading or trailing slash; "" is the bucket's top

    @property
    def root(self) -> str:
        """``bucket/prefix``: the path pyarrow's S3 filesystem takes (no scheme)."""
        return f"{self.bucket}/{self.prefix}" if self.prefix else self.bucket

    def key(self, *parts: str) -> str:
        """The filesystem path of an object under the location: ``bucket/prefix/part/part``."""
        return "/".join((self.root, *parts))

    def __str__(self) -> str:
        return SCHEME + self.root


Location = Path | S3Location


def is_s3(text: str | os.PathLike) -> bool:
    return isinstance(text, S3Location) or str(text).startswith(SCHEME)


def parse_location(text: str | os.PathLike | S3Location) -> Location:
    """A directory path or an ``S3Location``; raises ``TelemetryWriteError`` for a malformed URL."""
    if isinstance(text, S3Location):
        return text
    if not is_s3(text):
        return Path(text)
    rest = str(text)[len(SCHEME) :]
    bucket, _, prefix = rest.partition("/")
    prefix = "/".join(p for p in prefix.split("/") if p)
    if not _BUCKET_OK.match(bucket) or ".." in bucket or any(p in (".", "..") for p in prefix.split("/")):
        raise TelemetryWriteError(
            f"not a telemetry bucket location: {text}",
            "write s3://BUCKET or s3://BUCKET/PREFIX (bucket: 3-63 lowercase letters, digits, '.', '-')",
        )
    return S3Location(bucket, prefix)


def endpoint() -> str | None:
    """The S3 endpoint URL from the environment, or None for AWS itself."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def region() -> str:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


_ENV_KEYS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ENDPOINT_URL",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
)
_clients: dict[tuple, object] = {}
_clients_lock = threading.Lock()


def s3_filesystem():
    """A ``pyarrow.fs.S3FileSystem`` configured from the AWS environment variables (module doc): one
    per set of their values, shared (pyarrow's client is thread-safe; making one costs milliseconds,
    and a reader asks for one per segment footer)."""
    key = tuple(os.environ.get(k) for k in _ENV_KEYS)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = _new_s3_filesystem()
        return client


def _new_s3_filesystem():
    from pyarrow import fs

    options: dict = {
        "region": region(),
        "connect_timeout": CONNECT_TIMEOUT_S,
        "request_timeout": REQUEST_TIMEOUT_S,
        "retry_strategy": fs.AwsStandardS3RetryStrategy(max_attempts=RETRY_ATTEMPTS),
        # never create or delete buckets: a typo in --out must fail, not make a new bucket
        "allow_bucket_creation": False,
        "allow_bucket_deletion": False,
    }
    url = endpoint()
    if url:
        parts = urlsplit(url if "://" in url else f"https://{url}")
        if not parts.hostname:
            raise TelemetryWriteError(
                f"AWS_ENDPOINT_URL is not a URL: {url!r}", "write it as http(s)://HOST[:PORT]"
            )
        options["endpoint_override"] = parts.netloc
        options["scheme"] = parts.scheme or "https"
    return fs.S3FileSystem(**options)


def filesystem(loc: Location):
    """``(pyarrow filesystem, base path)`` of a location: one way to list and read either kind."""
    if isinstance(loc, S3Location):
        return s3_filesystem(), loc.root
    from pyarrow import fs

    return fs.LocalFileSystem(), str(Path(loc).absolute())


def where(loc: S3Location) -> str:
    """``s3://bucket/prefix at http://endpoint``: what an error line names."""
    url = endpoint()
    return f"{loc} at {url}" if url else str(loc)


def describe_s3_error(exc: OSError, loc: S3Location, *, reading: bool = False) -> TelemetryWriteError:
    """One line for what an S3 request said: a missing bucket, refused credentials, no answer.
    ``reading``: the hints name what a reader's key needs (analytics turns it into its own error)."""
    text = str(exc)
    upper = text.upper()
    if "NO_SUCH_BUCKET" in upper or "NOSUCHBUCKET" in upper or "BUCKET DOES NOT EXIST" in upper:
        return TelemetryWriteError(
            f"bucket {loc.bucket!r} does not exist ({where(loc)})",
            "create it (or fix the name in --out s3://BUCKET/PREFIX); gpupool never creates buckets",
        )
    if any(
        word in upper
        for word in (
            "ACCESS_DENIED",
            "ACCESSDENIED",
            "INVALID_ACCESS_KEY",
            "INVALIDACCESSKEYID",
            "SIGNATURE_DOES_NOT_MATCH",
            "SIGNATUREDOESNOTMATCH",
            "HTTP STATUS 403",
            "FORBIDDEN",
            "CREDENTIAL",
        )
    ):
        return TelemetryWriteError(
            f"the object store refused these credentials for {where(loc)}",
            "check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY and that the key may "
            + (
                "list and read (s3:ListBucket, s3:GetObject) there"
                if reading
                else "write (s3:PutObject) there"
            ),
        )
    if any(
        word in upper
        for word in ("NETWORK_CONNECTION", "COULDN'T CONNECT", "CURLCODE", "TIMED OUT", "TIMEOUT", "RESOLVE")
    ):
        return TelemetryWriteError(
            f"object store not reachable: {endpoint() or 'AWS S3'} ({loc})",
            "check AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL and the network",
        )
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return TelemetryWriteError(
        f"cannot write telemetry to {where(loc)}: {first}", "check the bucket and the key"
    )
