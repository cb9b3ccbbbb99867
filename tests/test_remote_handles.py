"""The client's handle values across a live migration (virtualize.server._handles): every handle argument
is mapped from the call table's declarations, the lease's objects are re-created from what it did, and
the client's old values reach the new objects — on the real host executor, in process."""

from __future__ import annotations

import inspect

import pytest

from virtualize.common._results import CUresult
from virtualize.server._arrays import NV12, SPARSE, ArrayShape
from virtualize.server._cuda import CANNOT_MOVE, CudaExecutor
from virtualize.server._executor import CudaError, Launch
from virtualize.server._executor_host import HostExecutor
from virtualize.server._handles import (
    MAPPED,
    NAMESPACE,
    PARAM_ALIASES,
    SHAPED_ADDRESSES,
    SHAPED_HANDLES,
    SYNTHETIC,
    TABLE_ADDRESSES,
    TABLE_KINDS,
    HandleMap,
    Translated,
)

MiB = 1 << 20
MAX_DYNAMIC_SHARED = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
# Per-call methods that take no handle the table declares, and why that is right.
GUARD_SETS = {"cuCtxSynchronize": "the guard makes the context it names current first (cuCtxSynchronize_v2)"}


@pytest.mark.parametrize("executor", [HostExecutor, CudaExecutor], ids=["host", "cuda"])
def test_every_declared_handle_reaches_a_parameter_of_the_same_name(executor):
    """Each handle and device address the call table declares for a call (graphs' included), and each of a
    shaped method, is a parameter of that name (or its declared alias) of the executor's method: the map finds every one (a renamed parameter
    would pass the client's old value to the driver after a move)."""
    missing = []
    for name, (ins, _) in TABLE_KINDS.items():
        params = inspect.signature(getattr(executor, name)).parameters
        missing += [
            (name, p)
            for p, kind in ins.items()
            if NAMESPACE[kind] in MAPPED and p not in params and PARAM_ALIASES.get(p) not in params
        ]
    for name, ins in SHAPED_HANDLES.items():
        params = inspect.signature(getattr(executor, name)).parameters
        missing += [(name, p) for p in ins if p not in params]
    for name, (ins, _) in TABLE_ADDRESSES.items():  # device addresses too (a global moves)
        params = inspect.signature(getattr(executor, name)).parameters
        missing += [(name, p) for p in ins if p not in params]
    for name, ins in SHAPED_ADDRESSES.items():
        params = inspect.signature(getattr(executor, name)).parameters
        missing += [(name, p) for p in ins if p not in params]
    assert [m for m in missing if m[0] not in GUARD_SETS] == []


def test_a_new_object_whose_value_the_client_uses_for_another_gets_a_value_of_its_own():
    """After a move the client's value V names a new object; should the driver later give another new
    object the value V, the client gets a different value for it, and each value reaches its object."""
    handles = HandleMap()
    handles.move("stream", 0x100, 0x200)  # the client's 0x100 is the target's 0x200 now
    assert handles.real("stream", 0x100) == 0x200
    assert handles.client("stream", 0x200) == 0x100
    other = handles.client("stream", 0x100)  # a new stream the driver put at 0x100
    assert other != 0x100 and other >= SYNTHETIC
    assert handles.real("stream", other) == 0x100 and handles.real("stream", 0x100) == 0x200
    assert handles.client("stream", 0x100) == other  # asked again: the same value
    assert handles.real("event", 0x100) == 0x100  # another kind: its own values


def test_objects_made_anew_at_each_others_values_keep_each_clients_value():
    """A move that gives the client's objects new values among its own (as a fresh worker of another server
    does: node 0x11 is now at 0x10, node 0x10 at 0x12): each new object answers with the client's value of it,
    and each client value reaches its new object, whichever order the values are mapped in."""
    for order in ((0x11, 0x10), (0x10, 0x11)):
        handles = HandleMap()
        made = {0x11: 0x10, 0x10: 0x12}
        for client in order:
            handles.move("node", client, made[client])
        for client, real in made.items():
            assert handles.real("node", client) == real, (order, client)
            assert handles.client("node", real) == client, (order, client)


@pytest.fixture
def lease():
    held: dict[str, set[int]] = {}

    def holds(kind: str, value: int) -> bool:
        return value in held.get(kind, set())

    translated = Translated(HostExecutor([64 * MiB]), holds)
    return translated, held


def _make(translated: Translated, held: dict[str, set[int]]) -> dict[str, int]:
    """A context, a module and its function (with an attribute raised), a stream and an event."""
    ctx = translated.cuCtxCreate(0, 0)
    translated.set_context(ctx)
    made = {"ctx": ctx, "stream": translated.cuStreamCreate(0), "event": translated.cuEventCreate(0)}
    made["module"] = translated.cuModuleLoadData(b"// module\n")
    made["func"] = translated.cuModuleGetFunction(made["module"], "add_u32")
    translated.cuFuncSetAttribute(made["func"], MAX_DYNAMIC_SHARED, 96 << 10)
    for kind, value in made.items():
        held.setdefault(kind, set()).add(value)
    return made


def test_the_clients_values_reach_the_objects_made_anew_on_the_target(lease):
    """A move re-creates the context's objects with new values and configures them as the client did;
    the client's old values then reach the new objects (the old ones are gone: a call that reached one
    would fail), results come back as the client's values, and a second move maps them again."""
    translated, held = lease
    made = _make(translated, held)
    before = {kind: translated.map.real(kind, value) for kind, value in made.items()}
    moved = translated.migrate(0, 1, [])
    assert moved["objects"] == len(made)
    for kind, value in made.items():
        assert translated.map.real(kind, value) != before[kind], kind
    translated.cuEventRecord(made["event"], made["stream"])  # old values, new objects
    translated.cuStreamSynchronize(made["stream"])
    assert translated.cuEventQuery(made["event"]) is None
    assert translated.cuFuncGetAttribute(MAX_DYNAMIC_SHARED, made["func"]) == 96 << 10  # replayed
    assert translated.cuStreamGetCtx(made["stream"]) == made["ctx"]  # a result: the client's value
    ptr = translated.cuMemAlloc(4096)
    translated.memset(ptr, 0, 4, 4, None)
    params = ptr.to_bytes(8, "little") + (3).to_bytes(4, "little") + (4).to_bytes(4, "little")
    layout = translated.param_layout(made["func"], False)
    translated.launch(Launch(made["func"], (1, 1, 1), (4, 1, 1), 0, made["stream"], params, layout))
    got = bytearray()
    translated.copy_from_device(ptr, 16, made["stream"], got.extend)
    assert got == (3).to_bytes(4, "little") * 4  # the function ran on the moved stream
    translated.migrate(0, 0, [])  # and back: the same client values, objects made again
    translated.cuStreamSynchronize(made["stream"])
    assert translated.cuEventQuery(made["event"]) is None


def test_an_event_the_client_names_reaches_its_event_before_and_after_a_move_and_is_not_named_twice(lease):
    """gpEventCreateNamed: the client's chosen value reaches the event made for it (recorded, queried), a
    move makes it again under the same value, a second making under a value already held is refused with
    nothing changed (its event let go), and once destroyed the value leaves the map."""
    translated, held = lease
    made = _make(translated, held)
    name = 0xEE00_0001_0000_0001
    translated.event_named(name, 0)
    held["event"].add(name)
    first = translated.map.real("event", name)
    assert first != name
    events_before = len(translated.inner.events)
    with pytest.raises(CudaError) as refused:
        translated.event_named(name, 0)
    assert refused.value.code == CUresult.INVALID_VALUE
    assert translated.map.real("event", name) == first and len(translated.inner.events) == events_before
    translated.cuEventRecord(name, made["stream"])
    translated.cuStreamSynchronize(made["stream"])
    assert translated.cuEventQuery(name) is None
    translated.migrate(0, 1, [])
    assert translated.map.real("event", name) not in (name, first)  # made again on the target
    translated.cuEventRecord(name, made["stream"])
    translated.cuStreamSynchronize(made["stream"])
    assert translated.cuEventQuery(name) is None
    translated.cuEventDestroy(name)
    assert translated.map.real("event", name) == name  # gone from the map


def test_objects_the_lease_let_go_of_are_not_made_again(lease):
    """A destroyed stream is not re-created by a move; what the lease still holds is."""
    translated, held = lease
    made = _make(translated, held)
    gone = translated.cuStreamCreate(0)
    held["stream"].add(gone)
    translated.cuStreamDestroy(gone)
    held["stream"].discard(gone)
    moved = translated.migrate(0, 1, [])
    assert moved["objects"] == len(made)


def test_a_replay_that_fails_leaves_the_client_on_its_source(lease):
    """A move whose re-creation fails changes no mapping: the client's values still reach the source's
    objects and the lease keeps running."""
    translated, held = lease
    made = _make(translated, held)
    source = {kind: translated.map.real(kind, value) for kind, value in made.items()}

    def target_died(module, name):
        raise CudaError(CUresult.DEVICE_UNAVAILABLE, "the target GPU fell off the bus")

    translated.inner.cuModuleGetFunction = target_died  # the seam: the target fails mid-replay
    with pytest.raises(CudaError):
        translated.migrate(0, 1, [])
    assert {kind: translated.map.real(kind, value) for kind, value in made.items()} == source
    assert translated.generation == 0
    translated.cuEventRecord(made["event"], made["stream"])
    translated.cuStreamSynchronize(made["stream"])


class WithGlobals(HostExecutor):
    """The host executor with module global variables (it has none): each (module, name) is 64 bytes of
    its own, made at the first ask in the current context — the seam stands in for a GPU module."""

    def __init__(self, devices) -> None:
        super().__init__(devices)
        self.variables: dict[tuple[int, str], int] = {}

    def cuModuleGetGlobal(self, module, name):
        if (module, name) not in self.variables:
            self.variables[module, name] = self.cuMemAlloc(64)
        return self.variables[module, name], 64


def _write(translated, address: int, data: bytes) -> None:
    def fill(view) -> None:
        view[:] = data[: len(view)]

    translated.copy_to_device(address, len(data), None, fill)


def _read(executor, address: int, count: int) -> bytes:
    got = bytearray()
    executor.copy_from_device(address, count, None, got.extend)
    return bytes(got)


def test_a_global_variable_moves_with_its_module_and_keeps_the_clients_address():
    """The address of a module's global the client holds reaches the variable of the re-created module
    after a move: its bytes were copied there, a copy through the old address lands in the new variable
    (not the source's), and asking for the global again answers the address the client has."""
    held: dict[str, set[int]] = {}
    translated = Translated(WithGlobals([64 * MiB]), lambda kind, value: value in held.get(kind, set()))
    made = _make(translated, held)
    address, size = translated.cuModuleGetGlobal(made["module"], "counter")
    _write(translated, address, b"before".ljust(size, b"."))
    translated.migrate(0, 1, [])
    new_module = translated.map.real("module", made["module"])
    moved_to = translated.inner.variables[new_module, "counter"]
    assert moved_to != address and translated.addresses.real(address) == moved_to
    assert _read(translated, address, size) == b"before".ljust(size, b".")
    _write(translated, address, b"after".ljust(size, b"."))
    assert _read(translated.inner, moved_to, size) == b"after".ljust(size, b".")
    assert _read(translated.inner, address, size) == b"before".ljust(size, b".")  # the source's, untouched
    assert translated.cuModuleGetGlobal(made["module"], "counter") == (address, size)


@pytest.mark.parametrize("kind", sorted(CANNOT_MOVE))
def test_the_cuda_executor_refuses_what_it_does_not_move_and_says_what(kind):
    """A lease holding a link in progress, an array, a texture, its own virtual memory, ... is refused before anything
    pauses, and the reason names what it holds (checked before the executor asks the driver anything)."""
    executor = object.__new__(CudaExecutor)  # its refusal of held objects needs no GPU
    reason = CudaExecutor.migration_refusal(executor, 1, {kind: 1, "stream": 3})
    assert reason and CANNOT_MOVE[kind] in reason


@pytest.mark.parametrize(
    ("shape", "said"),
    [
        (ArrayShape(64, 64, 0, 0x20, 1, SPARSE), "sparse"),
        (ArrayShape(64, 64, 0, NV12, 1), "planar"),
        (ArrayShape(64, 64, 0, 0x91, 1), "block-compressed"),
    ],
)
def test_the_cuda_executor_refuses_arrays_it_cannot_make_anew(shape, said):
    """CUDA arrays move with their lease, but not sparse ones (their tiles are mapped memory) nor those of a
    planar or block-compressed format: a lease holding one is refused up front, naming it."""
    executor = object.__new__(CudaExecutor)  # its refusal of held arrays needs no GPU
    executor.array_homes, executor.mipmap_homes = {1: (7, shape)}, {}
    reason = CudaExecutor.migration_refusal(executor, 1, {"array": 1})
    assert reason and said in reason


@pytest.mark.parametrize(
    ("state", "said"),
    [
        ({"vm_homes": {5: (2 << 20, 0, 0, 0)}, "vm_shared": {5}}, "another reference"),  # imported, retained
        ({"vm_maps": {1 << 40: (2 << 20, 0, 9)}}, "did not make here"),  # a multicast object's, say
        ({"vm_homes": {5: (2 << 20, 0, 0, 1)}}, "sparse"),  # CU_MEM_CREATE_USAGE_TILE_POOL
    ],
)
def test_the_cuda_executor_refuses_virtual_memory_it_cannot_follow(state, said):
    """The program's own cuMemCreate memory moves with its lease, but not memory another reference holds, a
    mapping of a handle not made here, or tiles of sparse arrays: refused up front, naming it."""
    executor = object.__new__(CudaExecutor)  # its refusal needs no GPU
    executor.array_homes, executor.mipmap_homes = {}, {}
    executor.vm_homes, executor.vm_maps, executor.vm_shared, executor.vm_released = {}, {}, set(), {}
    for name, value in state.items():
        setattr(executor, name, value)
    reason = CudaExecutor.migration_refusal(executor, 1, {"vmem": 1})
    assert reason and said in reason


def test_a_graph_the_driver_does_not_clone_runs_on_and_keeps_the_lease_from_moving(lease, monkeypatch):
    """At instantiation the worker keeps a clone of the graph for a move; where the driver refuses the
    clone, the program's instantiated graph still runs, and a move is refused up front with the reason."""
    translated, held = lease
    made = _make(translated, held)
    graph = translated.cuGraphCreate(0)
    ptr = translated.cuMemAlloc(4096)
    translated.graph_add_memset_node(graph, [], ptr, 0, 7, 1, 16, 1)

    def no_clone(graph):
        raise CudaError(CUresult.NOT_SUPPORTED, "this graph cannot be cloned")

    monkeypatch.setattr(translated.inner, "cuGraphClone", no_clone)
    graph_exec = translated.cuGraphInstantiateWithFlags(graph, 0)  # the program's call succeeds
    held.setdefault("graph", set()).add(graph)
    held.setdefault("graphexec", set()).add(graph_exec)
    translated.cuGraphLaunch(graph_exec, made["stream"])
    got = bytearray()
    translated.copy_from_device(ptr, 16, made["stream"], got.extend)
    assert got == bytes([7]) * 16
    reason = translated.migration_refusal(1, {})
    assert reason and "clone" in reason


def test_another_workers_executor_re_creates_the_objects_from_the_records_as_data(lease):
    """The records a move to another server sends (`exported`, as JSON through the link) re-create the
    context's objects on another worker's fresh executor (`imported`), configured as the client did; there
    the client's values reach them (the executor's own values differ: it made objects before), results come
    back as the client's values, and a kernel runs on memory there."""
    import json

    translated, held = lease
    made = _make(translated, held)
    sent = json.loads(json.dumps(translated.exported()))  # only what JSON carries crosses the link
    # The receiving worker's guard holds what the client holds (the same values).
    other = Translated(HostExecutor([64 * MiB]), lambda kind, value: value in held.get(kind, set()))
    other.inner.cuCtxCreate(0, 0)  # the receiving worker's executor gives other values than the source's
    other.inner.cuStreamCreate(0)
    other.inner.cuEventCreate(0)
    assert other.imported(sent) == len(made)
    for kind, value in made.items():
        assert other.map.real(kind, value) != value, kind
    other.set_context(made["ctx"])
    other.cuEventRecord(made["event"], made["stream"])
    other.cuStreamSynchronize(made["stream"])
    assert other.cuFuncGetAttribute(MAX_DYNAMIC_SHARED, made["func"]) == 96 << 10  # replayed
    assert other.cuStreamGetCtx(made["stream"]) == made["ctx"]
    ptr = other.cuMemAlloc(4096)
    other.memset(ptr, 0, 4, 4, None)
    params = ptr.to_bytes(8, "little") + (3).to_bytes(4, "little") + (4).to_bytes(4, "little")
    other.launch(Launch(made["func"], (1, 1, 1), (4, 1, 1), 0, made["stream"], params,
                        other.param_layout(made["func"], False)))  # fmt: skip
    got = bytearray()
    other.copy_from_device(ptr, 16, made["stream"], got.extend)
    assert bytes(got) == (3).to_bytes(4, "little") * 4


def test_a_record_that_names_no_executor_call_is_refused_by_the_receiving_end(lease):
    """Records arriving over the link name only the executor's calls: any other method name is refused
    before anything runs (the link's peer proved the one-time secret, but a record is still data)."""
    translated, held = lease
    _make(translated, held)
    sent = translated.exported()
    sent["records"][0]["method"] = "close"
    other = Translated(HostExecutor([64 * MiB]), lambda kind, value: True)
    with pytest.raises(ValueError):
        other.imported(sent)
