"""The pool API's requests and answers as msgspec structs: the one declaration of every field.

The server decodes requests with them (one message naming a bad field) and encodes its answers
through them; the client (``server.client``) encodes its requests and decodes the answers with the
same structs; ``python -m server.api`` writes their JSON schemas into openapi.json (a test checks it is
current). A field added here is a field of the API: give it a default so older peers keep working
(msgspec's schema evolution); answers ignore unknown fields, so an older client reads a newer server.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Annotated, ClassVar

import msgspec
from msgspec import Meta

from server import ranges
from server._errors import BadRequest

ClientName = Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")]
Pid = Annotated[int, Meta(ge=1, le=1 << 31)]


def _bounded(r: ranges.Range) -> Meta:
    """``r``'s bounds for a field (the schema shows them); a range with an "off" value below its floor
    also takes that value, and ``_Checked`` refuses the gap between the two."""
    low = r.lo if r.off is None else r.off
    return Meta(ge=low, le=r.hi, description=f"range {r.text()}")


def _number(r: ranges.Range) -> type:
    return int if r.whole else float


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
    n: Annotated[int, _bounded(REQUEST["n"])]
    fraction: Annotated[float, _bounded(REQUEST["fraction"])] | None = None
    mem_mib: Annotated[int, _bounded(REQUEST["mem_mib"])] | None = None
    sm_share: Annotated[float, _bounded(REQUEST["sm_share"])] | None = None
    filters: list[str] = []
    local: bool = False
    remote: bool = False
    ttl_s: Annotated[float, _bounded(REQUEST["ttl_s"])] | None = None
    pids: list[Pid] = []
    label: Annotated[str, Meta(max_length=200)] | None = None
    job: Job | None = None


class Heartbeat(msgspec.Struct, forbid_unknown_fields=True):
    pids: list[Pid] = []


def _update(name: str, table: dict[str, ranges.Range]) -> type:
    """A struct of every field of ``table``, each optional (UNSET: not given; None: drop the setting):
    a row added to the table is a field of the API at once."""
    fields = [
        (key, Annotated[_number(r), _bounded(r)] | Unset | None, msgspec.UNSET) for key, r in table.items()
    ]
    return msgspec.defstruct(name, fields, bases=(_Checked,), namespace={"_ranges": table}, module=__name__)


ClientUpdate = _update("ClientUpdate", CLIENT)
PolicyUpdate = _update("PolicyUpdate", POLICY)


class TokenCreate(_Checked):
    _ranges: ClassVar = TOKEN
    client: ClientName
    expires_in_s: Annotated[float, _bounded(TOKEN["expires_in_s"])] | None = None
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
    """Move a running remote lease's partition to another GPU of its server, or the whole lease to another
    server (admin): exactly one of ``to`` and ``server``."""

    to: Annotated[int, Meta(ge=0, le=1023, description="the target GPU's index on this server")] | None = None
    partition: Annotated[int, Meta(ge=0, le=1023, description="which of the lease's partitions, from 0")] = 0
    server: (
        Annotated[str, Meta(min_length=1, max_length=300, description="the target server: host:port or URL")]
        | None
    ) = None


class ReceivePartition(msgspec.Struct, forbid_unknown_fields=True):
    """One partition of a lease moving here: its size and the GPU model its program was made for."""

    mem_bytes: Annotated[int, Meta(ge=1, le=1 << 50)]
    gpu_name: Annotated[str, Meta(max_length=200)]
    compute_capability: Annotated[str, Meta(max_length=20)]
    fraction: Annotated[float, Meta(ge=0, le=1)] = 0.0
    sm_share: Annotated[float, Meta(gt=0, le=1)] | None = None


class ReceiveRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Admit a running lease that another server moves here (admin; that server asks, for ``gpupool-server
    lease migrate --to SERVER``): its partitions on GPUs of the same models, and a worker that waits
    ``wait_s`` for the lease's state, then exits and frees them."""

    client: ClientName
    source: Annotated[str, Meta(min_length=1, max_length=300, description="the lease's server, for the log")]
    partitions: Annotated[list[ReceivePartition], Meta(min_length=1, max_length=64)]
    secret: Annotated[str, Meta(min_length=16, max_length=200, description="the lease's worker secret")]
    ttl_s: Annotated[float, Meta(gt=0, le=10 * 365 * 86400)]
    label: Annotated[str, Meta(max_length=200)] | None = None
    wait_s: Annotated[float, Meta(ge=1, le=3600, description="how long the worker waits for the lease")] = (
        120.0
    )


# --- answers --------------------------------------------------------------------------------------


Time = Annotated[str, Meta(extra_json_schema={"format": "date-time"})]
TimeOrNone = Annotated[str | None, Meta(extra_json_schema={"format": "date-time"})]


def _enum(*values: str) -> Meta:
    """A string's values, for the schema; a client still decodes a value a newer server adds."""
    return Meta(extra_json_schema={"enum": list(values)})


class _Answer(msgspec.Struct, kw_only=True):
    """An answer of the server. Fields with an UNSET default are left out where they do not apply."""


ERROR_CODES = (
    "bad_request", "unauthorized", "token_expired", "forbidden", "not_found", "busy", "impossible",
    "limit_exceeded", "lease_ended", "remote_unavailable", "internal", "no_quorum", "cluster_busy",
    "storage_full", "migration_failed",
)  # fmt: skip
ERROR_CODES_TEXT = (
    "busy: fits this server but not now (retry later); impossible: never fits this server; limit_exceeded: "
    "the client's GPU limit; lease_ended: released, expired or reclaimed (see reason). no_quorum (503, "
    "cluster mode): etcd has no quorum, pool state unavailable; running leases keep running. cluster_busy "
    "(503, cluster mode): the client's cluster-wide grant kept conflicting with grants on other servers; "
    "retry. storage_full (507): the server's state disk is full; running leases go on, heartbeats and "
    "releases are kept in memory and written when it has room. migration_failed (409): the lease's worker "
    "refused or failed the move; the lease keeps running on its GPU."
)


class Error(_Answer, kw_only=True):
    """Every non-2xx answer. `error` is one line a user can read; `hint` says what to do."""

    error: str
    code: Annotated[str, _enum(*ERROR_CODES), Meta(description=ERROR_CODES_TEXT)]
    hint: str | Unset = msgspec.UNSET
    reason: Annotated[str | Unset | None, Meta(description="For lease_ended: why the lease ended.")] = (
        msgspec.UNSET
    )
    state: Annotated[str | Unset, Meta(description="For lease_ended: the lease's final state.")] = (
        msgspec.UNSET
    )
    gpu_count: Annotated[int | Unset, Meta(description="For impossible: how many GPUs this server has.")] = (
        msgspec.UNSET
    )
    moved_to: Annotated[
        str | Unset, Meta(description="For lease_ended: the server the lease moved to (heartbeat it there).")
    ] = msgspec.UNSET
    limit: Annotated[
        float | Unset, Meta(description="For limit_exceeded: the client's GPU limit (sum of fractions).")
    ] = msgspec.UNSET
    usage: Annotated[float | Unset, Meta(description="For limit_exceeded: what the client holds now.")] = (
        msgspec.UNSET
    )
    cap: Annotated[
        str | Unset,
        Meta(description="For limit_exceeded by a policy cap: which (max_leases_per_client, ...)."),
    ] = msgspec.UNSET


class ServerInfo(_Answer, kw_only=True):
    hostname: str
    addr: Annotated[str, Meta(description="The address clients reach this server at.")]
    port: int
    version: Annotated[str, Meta(description="gpupool version.")]
    simulated: Annotated[
        bool, Meta(description="True when the GPUs are a simulated fleet (control plane only).")
    ]
    mps: Annotated[bool, Meta(description="True when partitions are enforced with CUDA MPS.")]
    tls: bool = False
    driver_version: str | None = None
    cuda_version: str | None = None
    gpu_count: int
    started_at: Time | Unset = msgspec.UNSET
    draining: Annotated[bool, Meta(description="the server grants no new lease (gpupool-server drain)")] = (
        False
    )


class ClusterStatus(_Answer, kw_only=True):
    """Only in cluster mode (--cluster): the etcd cluster, this server's member name, whether etcd answers
    (quorum) and whether this server is registered."""

    url: str
    member: str
    quorum: bool
    registered: bool


class StoreStatus(_Answer, kw_only=True):
    """The server's state store (docs/pool.md, A full disk)."""

    writable: bool
    unsaved_leases: Annotated[
        int,
        Meta(
            description="Leases with a change (release, heartbeat, activity) kept in memory until the disk "
            "has room."
        ),
    ]
    problem: Annotated[str | Unset, Meta(description="Only when not writable: what the disk answered.")] = (
        msgspec.UNSET
    )
    since: Annotated[
        TimeOrNone | Unset, Meta(description="Only when not writable: when a write first failed.")
    ] = msgspec.UNSET
    hint: str | Unset = msgspec.UNSET


class Health(_Answer, kw_only=True):
    status: Annotated[
        str,
        _enum("ok", "degraded"),
        Meta(
            description="degraded: the state disk is full (see store); the server still "
            "answers, serves running leases, keeps heartbeats and releases in memory, and grants nothing new."
        ),
    ]
    server: ServerInfo
    simulated: bool
    leases_active: int
    uptime_s: float | Unset = msgspec.UNSET
    cluster: ClusterStatus | Unset = msgspec.UNSET
    store: StoreStatus


class PartitionUse(_Answer, kw_only=True):
    lease_id: str
    client: str
    mem_bytes: int
    fraction: float
    sm_share: float | None = None


class LiveSample(_Answer, kw_only=True):
    """Newest NVML sample of the GPU (null on simulated GPUs or before the first sample)."""

    ts: Time
    state: Annotated[str | None, Meta(description="ok, or lost")] = None
    util_gpu_mean: Annotated[float | None, Meta(description="ratio 0-1 (duty cycle)")] = None
    mem_used_bytes: Annotated[int | None, Meta(description="memory really in use on the GPU")] = None
    power_w: float | None = None
    temperature_c: float | None = None
    sm_activity: Annotated[float | None, Meta(description="GPM ratio 0-1 (Hopper+)")] = None
    sm_clock_hz: Annotated[float | None, Meta(description="the SM clock, in Hz")] = None


class Gpu(_Answer, kw_only=True):
    index: int
    uuid: str
    name: str
    mem_total_bytes: int
    mem_free_bytes: Annotated[int, Meta(description="Memory not held by any lease partition.")]
    free_fraction: Annotated[float, Meta(description="mem_free_bytes / mem_total_bytes (0-1).")]
    compute_capability: str | None = None
    partitions: list[PartitionUse] = []
    live: LiveSample | None = None
    draining: Annotated[bool, Meta(description="no new lease goes to this GPU (gpupool-server drain)")] = (
        False
    )


class GpuList(_Answer, kw_only=True):
    server: ServerInfo
    simulated: bool
    gpus: list[Gpu]


FitCode = Annotated[
    str, _enum("ok", "busy", "impossible", "limit_exceeded", "remote_unavailable", "storage_full")
]


class Fit(_Answer, kw_only=True):
    fits_now: bool
    code: FitCode
    reason: str | None = None
    hint: str | Unset = msgspec.UNSET
    score: Annotated[
        float | None,
        Meta(
            description="Free memory left on the chosen GPUs after placement, as a fraction of their total; "
            "lower is a tighter fit."
        ),
    ] = None
    placement: Annotated[list[int], Meta(description="GPU indices it would use.")] = []
    server: ServerInfo


class PartitionUsage(_Answer, kw_only=True):
    """What the lease itself uses of one GPU, for the NVML view of its runs (docs/remote.md, "What tools
    see"); null where the pool cannot tell."""

    mem_used_bytes: Annotated[
        int | None,
        Meta(
            description="Memory the lease holds: its worker's allocations (remote), else its processes' in the "
            "newest NVML sample."
        ),
    ] = None
    util_gpu: Annotated[
        float | None,
        Meta(
            description="The lease's busy share (0-1): its processes' per-process utilization in the newest sample."
        ),
    ] = None
    temperature_c: Annotated[float | None, Meta(description="The GPU's.")] = None
    power_w: Annotated[float | None, Meta(description="The GPU's.")] = None
    sm_clock_mhz: Annotated[int | None, Meta(description="The GPU's SM clock, in MHz.")] = None


class NvLink(_Answer, kw_only=True):
    """One active NVLink of the partition's GPU, as the GPU host's NVML reports it."""

    link: Annotated[int, Meta(description="The link's number on the GPU (0-17 on an H100).")]
    remote_pci_bus_id: Annotated[
        str, Meta(description='PCI bus id at the other end (a GPU or an NVSwitch), e.g. "00000000:1A:00.0".')
    ]
    version: Annotated[
        int | None,
        Meta(description="NVML's NVLink version number (6: NVLink 4.0); null where NVML does not say."),
    ] = None


class Partition(_Answer, kw_only=True):
    gpu_index: int
    gpu_uuid: str
    gpu_name: str
    mem_total_bytes: int | None = None
    mem_bytes: int
    fraction: Annotated[
        float, Meta(description="mem_bytes / the GPU's memory: what counts against the client's limit.")
    ]
    sm_share: float | None = None
    compute_capability: Annotated[str | None, Meta(description='The GPU\'s, e.g. "9.0".')] = None
    usage: Annotated[
        PartitionUsage | Unset | None,
        Meta(description="Only in GET /v1/leases/{id}; null: the pool cannot tell."),
    ] = msgspec.UNSET
    pci_bus_id: Annotated[
        str | None,
        Meta(
            description='The GPU\'s PCI bus id as NVML spells it, e.g. "00000000:19:00.0" (null for simulated GPUs).'
        ),
    ] = None
    nvlinks: Annotated[
        list[NvLink],
        Meta(
            description="The GPU's active NVLinks (none for simulated GPUs and GPUs without NVLink): the NVML view of "
            "a lease's runs answers NCCL's NVLink queries from them."
        ),
    ] = []


class Worker(_Answer, kw_only=True):
    """Remote-execution worker of the lease (only shown to the lease's owner)."""

    host: str
    port: int
    secret: Annotated[
        str, Meta(description="The lease secret; the client proves it holds it and never sends it.")
    ]
    tls_sha256: Annotated[
        str,
        Meta(
            description="SHA-256 (hex) of the worker's TLS certificate, which the client pins; empty when the "
            "worker offers no encryption (clients on its own host only)."
        ),
    ] = ""
    local: Annotated[
        str,
        Meta(
            description="Name of the worker's Unix socket in the abstract namespace: a client on the worker's own "
            "host connects there (no TCP, no encryption needed) and still proves the lease secret; empty "
            "when there is none."
        ),
    ] = ""
    lacks: Annotated[
        list[str],
        Meta(
            description="Driver entry points the call table forwards that the GPU server's driver does not "
            "have (a newer CUDA's calls): the client's shim answers cuGetProcAddress for them as that "
            "driver does, not found."
        ),
    ] = []


class LeaseJob(_Answer, kw_only=True):
    """The request's ``job`` as the answer carries it: the same fields as ``Job``, read leniently (an
    answer ignores what it does not know, ``Job`` refuses it in a request)."""

    scheduler: str
    id: str
    account: str | None = None
    user: str | None = None


LeaseState = Annotated[str, _enum("active", "released", "expired", "reclaimed")]


class Lease(_Answer, kw_only=True):
    id: str
    client: str
    state: LeaseState
    reason: Annotated[
        str | None, Meta(description="Why the lease ended (for released/expired/reclaimed).")
    ] = None
    label: str | None = None
    job: Annotated[
        LeaseJob | None,
        Meta(
            description="The batch job the lease serves (a scheduler integration's request); its GPU-hours are "
            "booked to it in pool_events."
        ),
    ] = None
    created_at: Time
    ended_at: TimeOrNone = None
    expires_at: Annotated[Time, Meta(description="Ends unless a heartbeat comes before.")]
    max_end_at: Annotated[
        TimeOrNone, Meta(description="Hard end from the server's maximum lease length.")
    ] = None
    ttl_s: float
    idle_timeout_s: float | None = None
    last_active_at: TimeOrNone = None
    local: bool = False
    remote: bool = False
    pids: list[int] = []
    simulated: bool
    mps: Annotated[
        bool, Meta(description="True when the memory limit is enforced by MPS; false: advisory.")
    ] = False
    server: ServerInfo
    partitions: list[Partition]
    fraction_total: Annotated[float, Meta(description="Sum of the partitions' fractions.")] = 0.0
    mem_bytes_total: Annotated[
        int, Meta(description="Sum of the partitions' memory: what the lease holds.")
    ] = 0
    env: Annotated[
        dict[str, str] | Unset,
        Meta(description="Environment a local run must set (CUDA_VISIBLE_DEVICES, MPS limits); owner only."),
    ] = msgspec.UNSET
    worker: Annotated[
        Worker | Unset | None, Meta(description="Owner only; null when the lease runs no worker.")
    ] = msgspec.UNSET


class Migration(_Answer, kw_only=True):
    """What the worker reports of a live migration (docs/remote.md, Migration)."""

    device: Annotated[int, Meta(description="the partition moved (its position in the lease)")]
    from_: Annotated[int, Meta(description="the GPU it left")] = msgspec.field(name="from")
    to: Annotated[int, Meta(description="the GPU it runs on now")]
    bytes: Annotated[int, Meta(description="device memory copied")]
    pause_s: Annotated[float, Meta(description="how long the lease's calls were held")]
    wait_s: Annotated[float, Meta(description="how long the migration waited for the calls running then")]
    stripes: Annotated[
        int,
        Meta(description="the connections the memory went over at once (a move to another server: "
                         "GPUPOOL_MIGRATE_STRIPES of the lease's worker; 1 for a move between GPUs)"),
    ] = 1  # fmt: skip


class MigratedLease(Lease, kw_only=True):
    """The answer to a migration: the lease as it is now, with the worker's report."""

    migration: Migration


class ReceivingWorker(_Answer, kw_only=True):
    """Where the lease's state goes: the receiving worker's migration port (its clients' port once it holds
    the lease)."""

    host: str
    port: Annotated[int, Meta(description="the port the lease's clients reach it at once it holds the lease")]
    migrate_port: Annotated[int, Meta(description="the port the lease's current worker sends its state to")]
    local: Annotated[
        str, Meta(description="its Unix socket's name for processes on its host (empty: none)")
    ] = ""
    tls_sha256: Annotated[
        str, Meta(description="its certificate's SHA-256 (empty: plaintext, loopback only)")
    ]


class Receiving(_Answer, kw_only=True):
    """A lease admitted to move here: its GPUs and the worker waiting for its state (``wait_s``)."""

    lease: str
    server: Annotated[str, Meta(description="this server's hostname")]
    gpus: list[int]
    worker: ReceivingWorker
    migration_secret: Annotated[str, Meta(description="the one-time secret the sending worker proves")]
    wait_s: float


class Moved(Migration, kw_only=True):
    """A lease a drain moved off the GPU."""

    lease: str


class Stayed(_Answer, kw_only=True):
    """A lease a drain left on the GPU, and why."""

    lease: str
    reason: str


class Drain(_Answer, kw_only=True):
    """A GPU's draining state, and what a drain moved and left (nothing on ``--undo``)."""

    gpu: int
    draining: Annotated[bool, Meta(description="no new lease goes to the GPU")]
    moved: list[Moved] = []
    stayed: list[Stayed] = []


class ServerDrain(_Answer, kw_only=True):
    """The server's draining state, and the leases still running on it with why each stays (none on
    ``--undo``)."""

    server: Annotated[str, Meta(description="the server's hostname")]
    draining: Annotated[bool, Meta(description="the server grants no new lease")]
    stayed: list[Stayed] = []


class LeaseList(_Answer, kw_only=True):
    leases: list[Lease]


class Client(_Answer, kw_only=True):
    client: str
    limit: Annotated[
        float | None, Meta(description="Effective GPU limit (sum of fractions); null = unlimited.")
    ] = None
    limit_source: Annotated[str, _enum("client", "default")] = "default"
    idle_timeout_s: Annotated[
        float | None, Meta(description="Effective idle timeout; null = never reclaimed.")
    ] = None
    idle_timeout_source: Annotated[str, _enum("client", "default")] = "default"
    usage: Annotated[float, Meta(description="Sum of fractions of its active leases on this server.")] = 0.0
    leases_active: int = 0
    workers_active: Annotated[
        int, Meta(description="Its active remote leases on this server (each runs a worker process).")
    ] = 0
    tokens: int = 0


class ClientList(_Answer, kw_only=True):
    clients: list[Client]


def _policy() -> type:
    """The policy in force, one field per row of ``server.ranges.POLICY`` (null: none / unlimited)."""
    fields = [
        # a whole-number setting always has a value; the others may be null (none, unlimited)
        (key, Annotated[int if r.whole else float | None, Meta(description=f"range {r.text()}")])
        for key, r in POLICY.items()
    ]
    return msgspec.defstruct("Policy", fields, bases=(_Answer,), module=__name__, kw_only=True)


Policy = _policy()
Policy.__doc__ = (
    "Effective server policy. Values set here are stored and win over the config file; null clears "
    "the override."
)


class Token(_Answer, kw_only=True):
    id: str
    client: str
    admin: bool
    created_at: Time
    expires_at: TimeOrNone = None
    revoked: bool = False
    token: Annotated[
        str | Unset,
        Meta(description="The secret; only in the answer to its creation (the server keeps a hash)."),
    ] = msgspec.UNSET


class TokenList(_Answer, kw_only=True):
    tokens: list[Token]


class MemberGpu(_Answer, kw_only=True):
    index: int
    name: str
    mem_total_bytes: int


class Member(_Answer, kw_only=True):
    """A server's record in the cluster (etcd key /gpupool/members/NAME), what ``discover()`` reads."""

    name: str
    url: str
    hostname: str | Unset = msgspec.UNSET
    addr: str | Unset = msgspec.UNSET
    simulated: bool | Unset = msgspec.UNSET
    started_at: Time | Unset | None = msgspec.UNSET
    gpus: list[MemberGpu] = []


def answer(kind: type, data) -> bytes:
    """``data`` (the server's dict, or a struct) as the JSON of ``kind``: what ``kind`` does not declare is
    not sent, and a missing or mistyped field is the server's bug (a 500 naming it), never a bad answer."""
    return msgspec.json.encode(data if isinstance(data, kind) else msgspec.convert(data, kind))


def read(raw: bytes, kind: type):
    """An answer's JSON as ``kind`` (the client's side); ``msgspec.ValidationError``/``DecodeError`` when it
    is not one."""
    return msgspec.json.decode(raw, type=kind)


REQUESTS = (LeaseRequest, Heartbeat, ClientUpdate, PolicyUpdate, TokenCreate, MigrateRequest, ReceiveRequest)
ANSWERS = (Error, Health, GpuList, Fit, Lease, LeaseList, ClientList, Client, Policy, Token, TokenList,
           MigratedLease, Drain, ServerDrain, Receiving)  # fmt: skip
OPENAPI = Path(__file__).with_name("openapi.json")


def openapi_schemas() -> dict:
    """The JSON schemas of every request and answer, derived from the structs above (openapi.json holds
    a copy, written by ``python -m server.api``)."""
    _, components = msgspec.json.schema_components(
        REQUESTS + ANSWERS, ref_template="#/components/schemas/{name}"
    )
    return _clean_descriptions(components)


def _clean_descriptions(schema):
    """Descriptions as `inspect.cleandoc` gives a docstring: msgspec 0.23 cleans them, earlier releases kept
    the docstring's indentation, and the document must not depend on which one is installed."""
    if isinstance(schema, dict):
        return {
            key: inspect.cleandoc(value) if key == "description" and isinstance(value, str)
            else _clean_descriptions(value)
            for key, value in schema.items()
        }  # fmt: skip
    if isinstance(schema, list):
        return [_clean_descriptions(item) for item in schema]
    return schema


if __name__ == "__main__":  # python -m server.api: write the schemas into openapi.json
    document = json.loads(OPENAPI.read_text())
    document["components"]["schemas"] = openapi_schemas()
    OPENAPI.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n")
    print(f"updated the schemas in {OPENAPI}")
