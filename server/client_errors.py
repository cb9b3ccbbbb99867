"""The errors of the pool's client library, one tree for ``gpuattach`` and the console.

Each carries a one-line ``title`` and a ``hint`` (what to do); the commands print them and exit
non-zero, the console shows them in place. ``str()`` is the title, then the hint in parentheses.

    PoolClientError        (a server.errors.ServerError; gpuattach exits 125 on one)
    ├── ConfigError        no servers or token configured, an unreadable client.toml, a bad URL
    ├── Unreachable        a server did not answer (refused, timeout, TLS, not a gpupool-server)
    ├── ApiError           a server answered with its Error object (status, code, message, hint)
    │   └── LeaseEnded     the lease was released, expired or reclaimed (carries the reason)
    ├── CannotFit          no server can ever serve the request (or the client's limit forbids it)
    └── WaitTimeout        the pool could serve it, but not within --timeout

The server's own refusals are ``server._errors.PoolError`` (one per HTTP status); a client sees them
as ``ApiError`` with the same ``code``.
"""

from __future__ import annotations

import urllib.parse
from typing import TYPE_CHECKING

from server.errors import ServerError

if TYPE_CHECKING:
    from server.api import Error


class PoolClientError(ServerError):
    unreachable = False  # True for Unreachable: the server may answer later (the console retries)
    exit_code = 125  # gpuattach's "it did not run" (126/127: the command could not be executed/found)


class ConfigError(PoolClientError):
    pass


class Unreachable(PoolClientError):
    unreachable = True

    def __init__(self, url: str, reason: str, *, title: str | None = None, hint: str | None = None):
        super().__init__(
            title or f"server {url} unreachable: {reason}",
            "check the address in client.toml and that gpupool-server runs there" if hint is None else hint,
        )
        self.url = url


class ApiError(PoolClientError):
    """``answer``: the server's Error object (``server.api.Error``): ``code``, ``hint``, and for a lease
    that ended its ``state`` and ``reason``."""

    def __init__(
        self, url: str, status: int, answer: Error, *, title: str | None = None, hint: str | None = None
    ):
        self.url, self.status, self.answer = url, status, answer
        self.code = answer.code
        super().__init__(
            title or f"{answer.error} [{host(url)}]", (answer.hint or "") if hint is None else hint
        )


class LeaseEnded(ApiError):
    pass


class CannotFit(PoolClientError):
    pass


class WaitTimeout(PoolClientError):
    pass


def host(url: str) -> str:
    return urllib.parse.urlsplit(url).netloc
