"""Request bodies of the API as msgspec structs: typed decoding with one message naming the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import msgspec
from msgspec import Meta

from server._errors import BadRequest

MAX_SECONDS = 100 * 365 * 86400  # a duration past a century is a typo, and past time_t's range a crash
Fraction = Annotated[float, Meta(gt=0, le=1)]
NonNegative = Annotated[float, Meta(ge=0)]
Seconds = Annotated[float, Meta(gt=0, le=MAX_SECONDS)]
NonNegativeSeconds = Annotated[float, Meta(ge=0, le=MAX_SECONDS)]
ClientName = Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")]
MAX_GPUS_PER_REQUEST = 1024


class LeaseRequest(msgspec.Struct, forbid_unknown_fields=True):
    n: Annotated[int, Meta(ge=1, le=MAX_GPUS_PER_REQUEST)]
    fraction: Fraction | None = None
    mem_mib: Annotated[int, Meta(ge=1, le=1 << 30)] | None = None
    sm_share: Fraction | None = None
    filters: list[str] = []
    local: bool = False
    remote: bool = False
    ttl_s: Seconds | None = None
    pids: list[Annotated[int, Meta(ge=1, le=1 << 31)]] = []
    label: Annotated[str, Meta(max_length=200)] | None = None


class Heartbeat(msgspec.Struct, forbid_unknown_fields=True):
    pids: list[Annotated[int, Meta(ge=1, le=1 << 31)]] = []


class ClientUpdate(msgspec.Struct, forbid_unknown_fields=True):
    limit: NonNegative | msgspec.UnsetType | None = msgspec.UNSET
    idle_timeout_s: NonNegativeSeconds | msgspec.UnsetType | None = msgspec.UNSET


class PolicyUpdate(msgspec.Struct, forbid_unknown_fields=True):
    default_limit: NonNegative | msgspec.UnsetType | None = msgspec.UNSET
    default_idle_timeout_s: NonNegativeSeconds | msgspec.UnsetType | None = msgspec.UNSET
    max_lease_s: NonNegativeSeconds | msgspec.UnsetType | None = msgspec.UNSET
    lease_ttl_s: Seconds | msgspec.UnsetType | None = msgspec.UNSET


class TokenCreate(msgspec.Struct, forbid_unknown_fields=True):
    client: ClientName
    expires_in_s: Seconds | None = None
    admin: bool = False


def decode(body: bytes, kind: type, *, empty_ok: bool = False):
    """Decode a JSON body into ``kind``; any problem is one BadRequest line naming the field."""
    if not body.strip():
        if empty_ok:
            return kind()
        raise BadRequest("request body is empty", "send a JSON object (Content-Type: application/json)")
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise BadRequest(
            f"invalid request: {exc}", "see /openapi.json for the fields and their ranges"
        ) from None
    except msgspec.DecodeError as exc:
        raise BadRequest(
            f"malformed JSON: {exc}", "send a JSON object (Content-Type: application/json)"
        ) from None


REQUESTS = (LeaseRequest, Heartbeat, ClientUpdate, PolicyUpdate, TokenCreate)
OPENAPI = Path(__file__).with_name("openapi.json")


def openapi_request_schemas() -> dict:
    """The request bodies' JSON schemas, derived from the structs above (openapi.json holds a copy)."""
    _, components = msgspec.json.schema_components(REQUESTS, ref_template="#/components/schemas/{name}")
    return components


if __name__ == "__main__":  # python -m server.api: write the request schemas into openapi.json
    document = json.loads(OPENAPI.read_text())
    document["components"]["schemas"].update(openapi_request_schemas())
    OPENAPI.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n")
    print(f"updated the request schemas in {OPENAPI}")
