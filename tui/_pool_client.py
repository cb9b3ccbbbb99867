"""The console's client for one `gpupool-server` (HTTP/JSON, see server/openapi.json).

Blocking stdlib ``urllib`` on purpose: the console calls it only from worker threads, and it keeps
the console free of an event-loop dependency. Every failure becomes a ``PoolError`` with a one-line
title and a hint, which the console shows as is.

    PoolError
    ├── unreachable   connection refused, DNS, timeout, TLS (status None)
    └── answered      the server said no: its Error object's message, code and HTTP status
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any


class PoolError(Exception):
    """A call to a pool server that failed; ``title`` is the one line to show, ``hint`` what to do."""

    def __init__(self, title: str, hint: str = "", *, status: int | None = None, code: str = ""):
        super().__init__(title)
        self.title = title
        self.hint = hint
        self.status = status
        self.code = code

    @property
    def unreachable(self) -> bool:
        return self.status is None

    def __str__(self) -> str:
        return f"{self.title} ({self.hint})" if self.hint else self.title


@dataclass(frozen=True)
class PoolClientOptions:
    timeout_s: float = 3.0  # per call: a dead server must not stall a refresh for long
    user_agent: str = "gpupool-console"
    ca_cert: str | None = None  # PEM of the CA that signed the servers' certificates (private CA)


def normalize_url(url: str) -> str:
    """``host:port`` or ``http(s)://host:port[/]`` -> ``http(s)://host:port``; ValueError if not a URL."""
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not a server URL: {url!r} (example: http://gpu-host:7070)")
    try:
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise ValueError(f"not a server URL: {url!r} ({exc})") from None
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"


class PoolClient:
    """One server of the pool. Methods return the decoded JSON of the documented answers."""

    def __init__(self, url: str, token: str | None = None, options: PoolClientOptions | None = None):
        self.url = normalize_url(url)
        self.token = token
        self.options = options or PoolClientOptions()
        self._tls = (
            ssl.create_default_context(cafile=self.options.ca_cert) if self.url.startswith("https") else None
        )

    def __repr__(self) -> str:
        return f"PoolClient({self.url!r}, token={'set' if self.token else 'none'})"

    # Reads ---------------------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return self._call("GET", "/v1/health", auth=False)

    def gpus(self) -> dict[str, Any]:
        return self._call("GET", "/v1/gpus")

    def leases(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/leases?all=true&state=active")["leases"]

    def clients(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/admin/clients").get("clients", [])

    def policy(self) -> dict[str, Any]:
        return self._call("GET", "/v1/admin/policy")

    # Operator actions (admin token) --------------------------------------------------------------
    def release(self, lease_id: str) -> dict[str, Any]:
        return self._call("DELETE", f"/v1/leases/{urllib.parse.quote(lease_id, safe='')}")

    def update_client(self, client: str, **fields: float | None) -> dict[str, Any]:
        """Set ``limit`` and/or ``idle_timeout_s`` of a client; None clears it back to the default."""
        return self._call("PUT", f"/v1/admin/clients/{urllib.parse.quote(client, safe='')}", fields)

    def update_policy(self, **fields: float | None) -> dict[str, Any]:
        return self._call("PUT", "/v1/admin/policy", fields)

    # Transport -----------------------------------------------------------------------------------
    def _call(self, method: str, path: str, body: dict | None = None, *, auth: bool = True) -> Any:
        headers = {"Accept": "application/json", "User-Agent": self.options.user_agent}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if auth and self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(
                request, timeout=self.options.timeout_s, context=self._tls
            ) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise self._answered_error(exc, method, path) from None
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
            tls = exc if isinstance(exc, ssl.SSLError) else getattr(exc, "reason", None)
            if isinstance(tls, ssl.SSLError):
                raise PoolError(
                    f"{self.url} TLS failed: {getattr(tls, 'verify_message', '') or tls}",
                    "for a private CA pass --ca-cert PATH (the CA that signed the server's certificate)",
                ) from None
            reason = getattr(exc, "reason", exc)
            raise PoolError(
                f"{self.url} unreachable: {reason}",
                "is gpupool-server running there? the console keeps retrying",
            ) from None
        try:
            return json.loads(raw) if raw else {}
        except ValueError:
            raise PoolError(
                f"{self.url}{path}: answer is not JSON", "is this URL a gpupool-server?", status=200
            ) from None

    def _answered_error(self, exc: urllib.error.HTTPError, method: str, path: str) -> PoolError:
        try:
            payload = json.loads(exc.read() or b"{}")
        except ValueError:
            payload = {}
        if not isinstance(payload, dict):
            payload = {}
        message = payload.get("error") or f"HTTP {exc.code} {exc.reason}"
        hint = payload.get("hint", "")
        if exc.code in (401, 403):  # the server's hint speaks to gpuattach users; this is the console
            hint = "start the console with an admin token: --admin-token or GPUPOOL_ADMIN_TOKEN"
        if exc.code == 404 and not payload:
            hint = "is this URL a gpupool-server of this version?"
        return PoolError(
            f"{method} {path.split('?')[0]} on {self.url}: {message}",
            hint,
            status=exc.code,
            code=payload.get("code", ""),
        )
