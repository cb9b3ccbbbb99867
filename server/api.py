"""Request bodies of the API as msgspec structs: typed decoding with one message naming the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, ClassVar

import msgspec
from msgspec import Meta

from server import ranges
from server._errors import BadRequest

ClientName = Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")]
Pid = Annotated[int, Meta(ge=1, le=1 << 31)]


def _bounded(r: ranges.Range):
    """A field type with ``r``'s bounds (the schema shows them); a range with an "off" value below
    its floor also takes that value, and ``_Checked`` refuses the gap between the two."""
    kind = int if r.whole else float
    low = r.lo if r.off is None else r.off
    return Annotated[kind, Meta(ge=low, le=r.hi, description=f"range {r.text()}")]


class _Checked(msgspec.Struct, forbid_unknown_fields=True):
    """Checks every field against its row of ``server.ranges`` once decoded (what Meta cannot say)."""

    _ranges: ClassVar[dict[str, ranges.Range]] = {}

    def __post_init__(self):
        for name in self._ranges:
            value = getattr(self, name)
            if value is not msgspec.UNSET and (why := ranges.problem(self._ranges, name, value)):
                raise ValueError(why)


REQUEST, POLICY, CLIENT, TOKEN = ranges.REQUEST, ranges.POLICY, ranges.CLIENT, ranges.TOKEN
Unset = msgspec.UnsetType


JobField = Annotated[
    str, Meta(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f\x7f]+$")
]  # no control characters


class Job(msgspec.Struct, forbid_unknown_fields=True):
    """The batch job a lease serves (a scheduler integration fills it in): its GPU-hours are booked to
    this job, account and user in the pool's events, beside the client that holds the lease."""

    scheduler: JobField  # e.g. "slurm" or "slurm/<cluster name>"
    id: JobField
    account: JobField | None = None
    user: JobField | None = None


class LeaseRequest(_Checked):
    _ranges: ClassVar = REQUEST
    n: _bounded(REQUEST["n"])
    fraction: _bounded(REQUEST["fraction"]) | None = None
    mem_mib: _bounded(REQUEST["mem_mib"]) | None = None
    sm_share: _bounded(REQUEST["sm_share"]) | None = None
    filters: list[str] = []
    local: bool = False
    remote: bool = False
    ttl_s: _bounded(REQUEST["ttl_s"]) | None = None
    pids: list[Pid] = []
    label: Annotated[str, Meta(max_length=200)] | None = None
    job: Job | None = None


class Heartbeat(msgspec.Struct, forbid_unknown_fields=True):
    pids: list[Pid] = []


def _update(name: str, table: dict[str, ranges.Range]) -> type:
    """A struct of every field of ``table``, each optional (UNSET: not given; None: drop the setting):
    a row added to the table is a field of the API at once."""
    fields = [(key, _bounded(r) | Unset | None, msgspec.UNSET) for key, r in table.items()]
    return msgspec.defstruct(name, fields, bases=(_Checked,), namespace={"_ranges": table}, module=__name__)


ClientUpdate = _update("ClientUpdate", CLIENT)
PolicyUpdate = _update("PolicyUpdate", POLICY)


class TokenCreate(_Checked):
    _ranges: ClassVar = TOKEN
    client: ClientName
    expires_in_s: _bounded(TOKEN["expires_in_s"]) | None = None
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


def convert(data: dict, kind: type):
    """``data`` (from a command line, not JSON) as ``kind``, checked as ``decode`` checks a body; a value
    out of its range is named in ``server.ranges``' words."""
    table = getattr(kind, "_ranges", {})
    for name, value in data.items():
        if name in table and (why := ranges.problem(table, name, value)):
            raise BadRequest(why, "see the ranges in docs/pool.md (Ranges)")
    try:
        return msgspec.convert(data, kind)
    except msgspec.ValidationError as exc:
        raise BadRequest(f"invalid value: {exc}", "see the ranges in docs/pool.md (Ranges)") from None


class MigrateRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Move a running remote lease's partition to another GPU of its server (admin)."""

    to: Annotated[int, Meta(ge=0, le=1023, description="the target GPU's index on this server")]
    partition: Annotated[int, Meta(ge=0, le=1023, description="which of the lease's partitions, from 0")] = 0


REQUESTS = (LeaseRequest, Heartbeat, ClientUpdate, PolicyUpdate, TokenCreate, MigrateRequest)
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
