"""A small etcd v3 client over etcd's JSON gateway (HTTP), for cluster mode.

Why the gateway and not a client library: the `etcd3` package is unmaintained and breaks with current
protobuf, and the maintained async clients pull in gRPC. etcd serves the same v3 API as JSON over HTTP
on its client port (`/v3/kv/range`, `/v3/kv/txn`, `/v3/lease/grant`, …), so the standard library is
enough: keys and values travel base64-encoded, 64-bit numbers as strings.

The client tries the endpoints in turn. A member that is down is skipped; a member that is up but
cut off from the majority cannot answer a linearizable request, which shows here as a timeout or an
error. Either way, when no endpoint answers within the timeout, the call raises `EtcdUnavailable`
with the message users see: "pool state unavailable: no etcd quorum".
"""

from __future__ import annotations

import base64
import http.client
import json
import threading
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass

from server.errors import ServerError


class EtcdUnavailable(ServerError):
    """No etcd member answered: no quorum, or every endpoint is down."""

    def __init__(self, detail: str = ""):
        super().__init__("pool state unavailable: no etcd quorum" + (f" ({detail})" if detail else ""))
        self.detail = detail


class EtcdError(ServerError):
    """etcd answered with an error that retrying elsewhere will not fix (a malformed request)."""


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    mod_revision: int
    version: int
    lease: int = 0


def _b64(text: str | bytes) -> str:
    raw = text.encode() if isinstance(text, str) else text
    return base64.b64encode(raw).decode()


def _prefix_end(prefix: str) -> str:
    # etcd's range_end for "every key starting with prefix": the prefix with its last byte + 1.
    raw = bytearray(prefix.encode())
    while raw and raw[-1] == 0xFF:
        raw.pop()
    if not raw:
        return _b64(b"\0")
    raw[-1] += 1
    return _b64(bytes(raw))


def _kv(item: dict) -> KeyValue:
    return KeyValue(
        key=base64.b64decode(item["key"]).decode(),
        value=base64.b64decode(item.get("value", "")),
        mod_revision=int(item.get("mod_revision", 0)),
        version=int(item.get("version", 0)),
        lease=int(item.get("lease", 0)),
    )


# Builders for transaction operations, so callers never hand-write the gateway's JSON.
def compare_version(key: str, version: int) -> dict:
    """True when the key's version equals `version` (0: the key does not exist)."""
    return {"key": _b64(key), "target": "VERSION", "result": "EQUAL", "version": str(version)}


def compare_mod_revision(key: str, revision: int) -> dict:
    """True when the key was last modified at `revision` (optimistic concurrency)."""
    return {"key": _b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(revision)}


def op_put(key: str, value: bytes | str, lease: int = 0) -> dict:
    body = {"key": _b64(key), "value": _b64(value)}
    if lease:
        body["lease"] = str(lease)
    return {"requestPut": body}


def op_delete(key: str) -> dict:
    return {"requestDeleteRange": {"key": _b64(key)}}


class EtcdClient:
    """Synchronous, thread-safe etcd v3 client. One HTTP connection per thread and endpoint."""

    def __init__(self, endpoints: Sequence[str], *, timeout: float = 3.0):
        if not endpoints:
            raise ValueError("no etcd endpoint given")
        self._endpoints = [self._parse(e) for e in endpoints]
        self._timeout = timeout
        self._local = threading.local()
        self._preferred = 0  # index of the endpoint that answered last; tried first next time

    @staticmethod
    def _parse(endpoint: str) -> tuple[str, int]:
        url = urllib.parse.urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
        if not url.hostname or not url.port:
            raise ValueError(f"etcd endpoint needs host:port, got {endpoint!r}")
        return url.hostname, url.port

    @classmethod
    def from_url(cls, url: str, **kwargs) -> EtcdClient:
        """`etcd://h1:2379,h2:2379` (the form `gpupool-server --cluster` takes)."""
        rest = url.removeprefix("etcd://")
        return cls([e for e in rest.split(",") if e], **kwargs)

    def _connection(self, index: int) -> http.client.HTTPConnection:
        conns = self._local.__dict__.setdefault("conns", {})
        conn = conns.get(index)
        if conn is None:
            host, port = self._endpoints[index]
            conn = conns[index] = http.client.HTTPConnection(host, port, timeout=self._timeout)
        return conn

    def _drop(self, index: int) -> None:
        conn = self._local.__dict__.get("conns", {}).pop(index, None)
        if conn is not None:
            conn.close()

    def call(self, path: str, body: dict) -> dict:
        """POST one gateway request, failing over between endpoints."""
        payload = json.dumps(body).encode()
        order = list(range(len(self._endpoints)))
        order = order[self._preferred :] + order[: self._preferred]
        failures = []
        for index in order:
            try:
                conn = self._connection(index)
                conn.request("POST", path, payload, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                data = json.loads(resp.read() or b"{}")
            except (OSError, http.client.HTTPException, ValueError) as exc:
                self._drop(index)
                failures.append(
                    f"{self._endpoints[index][0]}:{self._endpoints[index][1]}: {exc or type(exc).__name__}"
                )
                continue
            if resp.status == 200:
                self._preferred = index
                return data
            message = data.get("message") or data.get("error") or f"HTTP {resp.status}"
            if resp.status in (400, 404) and "timed out" not in message and "leader" not in message:
                raise EtcdError(message)
            # Unavailable, no leader, request timed out: another member may still have the majority.
            failures.append(f"{self._endpoints[index][0]}:{self._endpoints[index][1]}: {message}")
        raise EtcdUnavailable("; ".join(failures))

    # -- key/value ------------------------------------------------------------------------------
    def get(self, key: str) -> KeyValue | None:
        kvs = self.call("/v3/kv/range", {"key": _b64(key)}).get("kvs", [])
        return _kv(kvs[0]) if kvs else None

    def get_prefix(self, prefix: str) -> list[KeyValue]:
        data = self.call("/v3/kv/range", {"key": _b64(prefix), "range_end": _prefix_end(prefix)})
        return [_kv(item) for item in data.get("kvs", [])]

    def put(self, key: str, value: bytes | str, *, lease: int = 0) -> int:
        """Store `value`; return the new revision."""
        body = op_put(key, value, lease)["requestPut"]
        return int(self.call("/v3/kv/put", body)["header"]["revision"])

    def delete(self, key: str) -> int:
        """Delete one key; return how many were deleted (0 or 1)."""
        return int(self.call("/v3/kv/deleterange", {"key": _b64(key)}).get("deleted", 0))

    def delete_prefix(self, prefix: str) -> int:
        body = {"key": _b64(prefix), "range_end": _prefix_end(prefix)}
        return int(self.call("/v3/kv/deleterange", body).get("deleted", 0))

    def txn(self, compare: list[dict], success: list[dict], failure: Sequence[dict] = ()) -> bool:
        """Run a transaction; True when every comparison held and `success` was applied."""
        body = {"compare": compare, "success": success, "failure": list(failure)}
        return bool(self.call("/v3/kv/txn", body).get("succeeded", False))

    # -- leases (membership TTLs) ---------------------------------------------------------------
    def lease_grant(self, ttl_s: int) -> int:
        return int(self.call("/v3/lease/grant", {"TTL": str(ttl_s)})["ID"])

    def lease_keepalive(self, lease_id: int) -> int:
        """Renew a lease; return its remaining TTL (0 or less: the lease is gone)."""
        data = self.call("/v3/lease/keepalive", {"ID": str(lease_id)})
        return int(data.get("result", data).get("TTL", 0))

    def lease_revoke(self, lease_id: int) -> None:
        self.call("/v3/lease/revoke", {"ID": str(lease_id)})

    def close(self) -> None:
        for index in list(self._local.__dict__.get("conns", {})):
            self._drop(index)
