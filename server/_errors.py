"""Errors the pool answers with: each is one HTTP status, one code and one line a user can read.

PoolError                  every refusal the API answers with (never a traceback)
├── BadRequest       400   malformed JSON, wrong types, values out of range, unknown filter keys
├── Unauthorized     401   missing, unknown or revoked token; ``token_expired`` for an expired one
├── Forbidden        403   admin route with a client token, another client's lease
├── LimitExceeded    403   the client's GPU limit would be passed (names usage and limit)
├── NotFound         404   no such lease / token
├── Busy             409   fits this server, but not now: the client backs off and retries
├── Gone             410   heartbeat on a released, expired or reclaimed lease (carries the reason)
├── Impossible       422   can never fit this server (more GPUs than it has, filters leave too few)
│   └── RemoteNotOffered 422  a remote lease from a server whose GPUs are simulated
├── RemoteUnavailable 503  remote execution cannot start on this server (its worker did not start)
└── StorageFull      507   the state directory's disk is full: a write (a grant, a token, a setting)
                           cannot be stored; running leases, heartbeats and releases go on (kept in
                           memory until the disk has room, server._store)
"""

from __future__ import annotations

from server.errors import ServerError


class PoolError(ServerError):
    """A refusal: ``title`` is the answer's ``error`` line; ``extra`` fields go into the answer too (each
    declared on ``server.api.Error``). A command that stops on one exits 2."""

    status = 500
    code = "internal"
    exit_code = 2

    def __init__(self, title: str, hint: str = "", **extra: object):
        super().__init__(title, hint)
        self.extra = extra

    def body(self) -> dict:
        out: dict = {"error": self.title, "code": self.code}
        if self.hint:
            out["hint"] = self.hint
        out.update(self.extra)
        return out


class BadRequest(PoolError):
    status, code = 400, "bad_request"


class Unauthorized(PoolError):
    status, code = 401, "unauthorized"


class TokenExpired(Unauthorized):
    code = "token_expired"


class Forbidden(PoolError):
    status, code = 403, "forbidden"


class LimitExceeded(PoolError):
    status, code = 403, "limit_exceeded"


class NotFound(PoolError):
    status, code = 404, "not_found"


class Busy(PoolError):
    status, code = 409, "busy"


class MigrationFailed(PoolError):
    """409: the lease's worker refused or failed a live migration; the lease keeps running where it was."""

    status, code = 409, "migration_failed"


class Gone(PoolError):
    """410: the lease was released, expired or reclaimed (the client sees ``ApiError`` ``LeaseEnded``)."""

    status, code = 410, "lease_ended"


class Impossible(PoolError):
    status, code = 422, "impossible"


class RemoteUnavailable(PoolError):
    status, code = 503, "remote_unavailable"


class RemoteNotOffered(RemoteUnavailable):
    """Never possible on this server (simulated GPUs): 422 like Impossible, so no client retries it."""

    status = 422


class StorageFull(PoolError):
    """507 Insufficient Storage: nothing new can be stored until the state disk has room again."""

    status, code = 507, "storage_full"
