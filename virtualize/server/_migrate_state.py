"""The guard's state of a lease and of each of its processes, as data: what a move to another server's worker
carries besides the memory and the objects' records (docs/remote.md, "Between servers").

The guard knows the client's values only (the executor's `Translated` maps them), so its tables cross as
they are: the lease's allocations, handles, modules' functions, contexts' devices, kernels' parameter
layouts and the bytes counted; and per process (connection) its address window — windows, the pages mapped
in them and the slabs small allocations share — its allocations and created contexts, its current context,
the asynchronous error it is still owed, its arrays and its virtual memory (reserved ranges, mappings, handles
and their properties). The receiving worker rebuilds them around the memory it mapped (`backings`: what its
executor answered for each mapping, in the manifest's order), encodes the lease's tensor maps anew from their
recipes (they must come out the same bytes) and *parks* each process under a one-time token, until the
process reconnects with it (gpResume) and its connection adopts the state.

What a process may hold that this does not carry is refused before the move (`process_refusal`).
"""

from __future__ import annotations

import base64
import secrets
import threading
from dataclasses import dataclass, field

from virtualize.server._address_window import FreeRanges, Mapping, Window, WindowMemory
from virtualize.server._guard_tensor_maps import encoded_anew

RESUME_WAIT_S = 60.0  # how long a reconnecting process waits for its state to be complete here
# Lease tables that must be empty: what the move does not carry (named in the refusal).
UNCARRIED_TABLES = {
    "vm_exported": "memory of the virtual memory API exported to another process",
    "nccl_comms": "NCCL communicators", "host_nodes": "CUDA graphs",
}  # fmt: skip


def process_refusal(session) -> str | None:
    """What one connection holds that a move to another server does not carry, or None."""
    if session.lanes is not None and session.lanes.unmovable:
        return ("a process of the lease copies across several connections (copy lanes) with an older gpupool "
                "that sends a copy's pieces before its worker answers")  # fmt: skip
    if session.shared is not None:
        return "a process of the lease copies through memory it shares with this worker (same host)"
    if getattr(session.channel, "ring", None) is not None:
        return "a process of the lease talks to this worker through a command ring in shared memory (GPUPOOL_SHIM_RING)"
    if session.pinned:
        return "a process of the lease shares page-locked host memory with this worker"
    if any(session.vm_references.values()) or any(h not in session.vm_props for h in session.vm_handles):
        return ("a process of the lease holds memory of the virtual memory API through another reference "
                "(cuMemRetainAllocationHandle) or a multicast object")  # fmt: skip
    if any(session.lease.vm_memory_of.get(h, h) != h for h in session.vm_handles):
        return "a process of the lease holds memory of the virtual memory API imported from another process"
    if session.spoiled_captures:
        return "a process of the lease has a stream capture that met a copy it cannot hold"
    return None


def lease_refusal(lease) -> str | None:
    for table, what in UNCARRIED_TABLES.items():
        if getattr(lease, table):
            return f"the lease holds {what}, which a move to another server does not carry yet"
    return None


def exported(lease, sessions: list, mappings: list) -> tuple[dict, dict[int, int]]:
    """The lease's and its processes' state (the calls paused, the windows held; `mappings`: the memory in the
    manifest's order); and each session's token (by id(session))."""
    index = {id(m): i for i, m in enumerate(mappings)}
    tokens: dict[int, int] = {}
    processes = []
    windows_of: dict[int, int] = {}  # id(WindowMemory) -> its token
    for session in sessions:
        if session.lane_of is not None or session.calls_back_for is not None:
            continue
        token = secrets.randbits(63) | 1
        tokens[id(session)] = token
        windows_of[id(session.window)] = token
        # Copies to its page-locked memory done by now went out on its callback connection: the new worker's
        # count of them goes on from here (the process waits for as many to have landed).
        copies_sent = session.callbacks.deliveries.flush(wait=True) if session.callbacks is not None else 0
        processes.append({
            "token": token, "ctx": session.ctx, "pending": session.pending, "owned": sorted(session.owned),
            "created": sorted(session.context_calls.created), "window": _window_json(session.window, index),
            "copies_sent": copies_sent,
            "carried": _carried_json(session),
        })  # fmt: skip
    allocations = [
        [a.base, a.size, a.device, a.owned, a.ctx, windows_of.get(id(a.window)) if a.window else None,
         a.is_global, a.sync_memops]
        for a in lease.allocations.values()
    ]  # fmt: skip
    state = {
        "allocations": allocations,
        "handles": {kind: sorted(values) for kind, values in lease.handles.items()},
        "children": [[owner, sorted(made)] for owner, made in lease.children.items()],
        "ctx_device": [[c, d] for c, d in lease.ctx_device.items()],
        "primary_ctx": [[d, c] for d, c in lease.primary_ctx.items()],
        "layouts": [[f, [list(p) for p in layout]] for f, layout in lease.layouts.items()],
        # Memory pools keep after frees (`held`) stays behind: the processes' pools start empty there.
        "used": [used - held for used, held in zip(lease.used, lease.held, strict=True)],
        "processes": processes,
        "vm": _lease_vm_json(lease),
        "tensor_maps": _tensor_maps_json(lease),
    }
    return state, tokens


def graphs_exported(lease) -> dict:
    """What the guard keeps of the lease's graphs: the function or kernel the program gave each kernel node (what
    cuGraphKernelNodeGetParams answers), each instantiated graph's graph and the graphs destroyed while an
    instantiated graph of theirs lives (what their destruction counts of graph memory)."""
    with lease.lock:
        return {"kernel_nodes": [[node, func] for node, func in lease.kernel_nodes.items()],
                "exec_graph": [[e, g] for e, g in lease.exec_graph.items()], "graphs_gone": sorted(lease.graphs_gone)}  # fmt: skip


def graphs_imported(lease, j: dict) -> None:
    with lease.lock:
        lease.kernel_nodes.update({int(node): int(func) for node, func in j.get("kernel_nodes", [])})
        lease.exec_graph.update({int(e): int(g) for e, g in j.get("exec_graph", [])})
        lease.graphs_gone.update(int(g) for g in j.get("graphs_gone", []))


def _tensor_maps_json(lease) -> list:
    """The lease's tensor maps: each one's bytes, its tensor's extent and its recipe (`_guard_tensor_maps`)."""
    with lease.lock:
        maps = [
            (encoded, extent, lease.tensor_map_recipes[encoded])
            for encoded, extent in lease.tensor_maps.items()
        ]
    return [[base64.b64encode(encoded).decode(), extent, [name, list(ins), arrays, [list(s) for s in steps]]]
            for encoded, extent, (name, ins, arrays, steps) in maps]  # fmt: skip


def _tensor_maps_imported(lease, executor, maps: list) -> None:
    """Each tensor map encoded anew here from its recipe, for the same addresses: it must be the same bytes (the
    client's kernels hold them in their parameters), else the move fails before it commits."""
    for encoded_b64, extent, (name, ins, arrays, steps) in maps:
        encoded, recipe = (
            base64.b64decode(encoded_b64),
            (str(name), tuple(ins), arrays, tuple(map(tuple, steps))),
        )
        if encoded_anew(executor, recipe) != encoded:
            raise ValueError(
                f"a tensor map ({name}) encodes to other bytes on this GPU, and kernels hold its bytes"
            )
        lease.tensor_maps[encoded], lease.tensor_map_recipes[encoded] = int(extent), recipe


# The guard's tables of arrays and of the virtual memory API, as the client names them: per process (a
# connection's `Session`) and of the lease (`LeaseState`); each [attribute, its pairs] (JSON has no int keys).
PROCESS_TABLES = ("vm_ranges", "vm_mapped", "vm_handles", "vm_mapping_of")
LEASE_VM_TABLES = (
    "vm_holders",
    "vm_memory_of",
    "vm_memory_holders",
    "vm_charged",
    "vm_map_key",
    "vm_key_mappings",
)


def _carried_json(session) -> dict:
    """One process's arrays (array or mipmapped array -> kind, bytes, device, context) and virtual memory:
    reserved ranges, mappings, the memory it holds (and the CUmemAllocationProp each was made with)."""
    tables = {name: _pairs(getattr(session, name)) for name in PROCESS_TABLES}
    props = [[h, base64.b64encode(p).decode()] for h, p in session.vm_props.items()]
    return {
        **tables,
        "vm_props": props,
        "arrays": [[k, list(v)] for k, v in session.array_calls.arrays.items()],
    }


def _carried_adopted(session, j: dict) -> None:
    """A resuming process's connection takes its arrays and virtual memory as they were (`_carried_json`)."""
    for name in PROCESS_TABLES:
        setattr(session, name, _table(j.get(name, [])))
    session.vm_props = {int(h): base64.b64decode(p) for h, p in j.get("vm_props", [])}
    session.array_calls.arrays = {int(k): (str(v[0]), *map(int, v[1:])) for k, v in j.get("arrays", [])}


def _lease_vm_json(lease) -> dict:
    """The lease's virtual memory: who holds each handle, which memory it names, what is counted, where mapped."""
    with lease.lock:
        tables = {name: _pairs(getattr(lease, name)) for name in LEASE_VM_TABLES}
        tables["vm_mapped_at"] = [[h, sorted(at)] for h, at in lease.vm_mapped_at.items()]
    return tables


def _lease_vm_imported(lease, j: dict) -> None:
    for name in LEASE_VM_TABLES:
        table = getattr(lease, name)
        table.clear()
        table.update(_table(j.get(name, [])))
    lease.vm_mapped_at = {int(h): set(at) for h, at in j.get("vm_mapped_at", [])}


def _pairs(table: dict) -> list:
    return [[k, list(v) if isinstance(v, tuple) else v] for k, v in table.items()]


def _table(pairs: list) -> dict:
    """A table of `_pairs` back: int keys, each value an int or a tuple of ints."""
    return {int(k): tuple(v) if isinstance(v, list) else int(v) for k, v in pairs}


def _window_json(memory: WindowMemory, index: dict[int, int]) -> dict:
    windows = {id(w): i for i, w in enumerate(memory.windows)}
    return {
        "windows": [[w.base, w.size, list(w.pages.starts), [w.pages.sizes[s] for s in w.pages.starts]]
                    for w in memory.windows],
        "mappings": [[ptr, index[id(m)]] for ptr, m in memory.mappings.items()],
        "slabs": [[device, [index[id(m)] for m in slabs]] for device, slabs in memory.slabs.items()],
        "small_sizes": [[ptr, size] for ptr, size in memory.small_sizes.items()],
        # A window offered and not yet accepted (the process's gpWindowAccept may come after the move).
        "offered": [memory.offered.base, memory.offered.size] if memory.offered is not None else None,
        # cuMemAddressReserve'd ranges: in which window (its index), or None (reserved on their own)
        "ranges": [[base, size, windows.get(id(w)) if w is not None else None]
                   for base, (size, w) in memory.ranges.items()],
        "pages": [[index[id(m)], windows[id(m.window)], _ranges(m.slab), m.users]
                  for m in _unique([*memory.mappings.values(), *(m for s in memory.slabs.values() for m in s)])],
    }  # fmt: skip


def _ranges(free: FreeRanges | None):
    return None if free is None else [list(free.starts), [free.sizes[s] for s in free.starts]]


def _unique(mappings: list) -> list:
    return list({id(m): m for m in mappings}.values())


@dataclass
class Parked:
    """A process of a lease that moved here, until it reconnects (gpResume)."""

    window: WindowMemory
    ctx: int
    pending: int
    owned: set[int]
    created: set[int]
    carried: dict  # its arrays and virtual memory (`_carried_json`)
    copies_sent: int = 0  # copy frames the old worker sent on its callback connection (the client counts on)
    frames: list[tuple[int, int, bytes, bytes]] = field(default_factory=list)  # sent after the pause
    complete: threading.Event = field(default_factory=threading.Event)  # every frame of it arrived


def imported(lease, executor, state: dict, memory: list, backings: list, Allocation) -> dict[int, Parked]:
    """Rebuild the lease's and its processes' state here around the memory mapped (`memory`: the manifest's
    [base, size, device] entries, `backings`: what this executor answered for each); the processes parked
    by token. `Allocation`: the guard's record of an allocation (given: the guard builds on this module)."""

    _tensor_maps_imported(lease, executor, state.get("tensor_maps", []))  # first: it may fail the move
    parked: dict[int, Parked] = {}
    for p in state["processes"]:
        window = _window_from_json(executor, lease.limits, p["window"], memory, backings)
        parked[int(p["token"])] = Parked(
            window,
            int(p["ctx"]),
            int(p["pending"]),
            set(p["owned"]),
            set(p["created"]),
            p.get("carried", {}),
            int(p.get("copies_sent", 0)),
        )
    with lease.lock:
        for base, size, device, owned, ctx, token, is_global, sync_memops in state["allocations"]:
            window = parked[int(token)].window if token is not None else None
            lease.allocations[int(base)] = Allocation(int(base), int(size), int(device), bool(owned), int(ctx),
                                                      window, bool(is_global), int(sync_memops))  # fmt: skip
        lease.bases = sorted(lease.allocations)
        if lease.native is not None:  # the native loop checks copies against the lease's memory too
            for a in lease.allocations.values():
                if (
                    executor.addresses.real(a.base) == a.base
                ):  # (a module global elsewhere here: Python maps it)
                    lease.native.range_added(a.base, a.size)
            lease.native.addresses_moved()  # a launch passing a module global's address the client holds
        for kind, values in state["handles"].items():
            lease.handles[kind].update(values)  # (the native loop's tables mirror these: update, not replace)
        lease.children = {int(o): set(made) for o, made in state["children"]}
        lease.ctx_device = {int(c): int(d) for c, d in state["ctx_device"]}
        lease.primary_ctx = {int(d): int(c) for d, c in state["primary_ctx"]}
        lease.layouts = {int(f): [tuple(p) for p in layout] for f, layout in state["layouts"]}
        for device, used in enumerate(state["used"]):  # in place: it may be the lease's shared slot
            lease.used[device] = int(used)
        _lease_vm_imported(lease, state.get("vm", {}))
        for process in parked.values():
            lease.windows.add(process.window)
        lease.parked.update(parked)
    return parked


def _window_from_json(executor, limits: list[int], j: dict, memory: list, backings: list) -> WindowMemory:
    wm = WindowMemory(executor, limits)
    for base, size, starts, sizes in j["windows"]:
        w = Window(int(base), int(size))
        w.pages = _free(base, size, [starts, sizes])
        wm.windows.append(w)
    made: dict[int, Mapping] = {}
    for i, window, free, users in j["pages"]:
        base, size, device = memory[i]
        slab = None if free is None else _free(base, size, free)
        made[i] = Mapping(
            int(base), int(size), int(device), backings[i], wm.windows[window], slab, int(users)
        )
    wm.mappings = {int(ptr): made[i] for ptr, i in j["mappings"]}
    wm.slabs = {int(device): [made[i] for i in slabs] for device, slabs in j["slabs"]}
    wm.small_sizes = {int(ptr): int(size) for ptr, size in j["small_sizes"]}
    if j.get("offered"):
        wm.offered = Window(int(j["offered"][0]), int(j["offered"][1]))
    wm.ranges = {
        int(base): (int(size), None if w is None else wm.windows[w]) for base, size, w in j.get("ranges", [])
    }
    return wm


def _free(base: int, size: int, ranges: list) -> FreeRanges:
    """A FreeRanges of [base, base+size) with the free ranges `ranges` ([starts, sizes]) as they were."""
    free = FreeRanges(int(base), int(size))
    free.starts = [int(s) for s in ranges[0]]
    free.sizes = dict(zip(free.starts, map(int, ranges[1]), strict=True))
    return free


def resume(session, token: int) -> None:
    """A process reconnecting with its token: its connection adopts the parked state, and the frames it sent
    after the pause run first (ValueError: no such token here)."""
    parked = session.lease.parked.pop(token, None)
    if parked is None:
        raise ValueError("no process of this lease is parked under that token")
    if not parked.complete.wait(RESUME_WAIT_S):
        raise ValueError("the process's state did not arrive complete")
    session.lease.windows.discard(session.window)
    session.window = parked.window
    session.owned, session.context_calls.created = parked.owned, parked.created
    session.pending = parked.pending
    _carried_adopted(session, parked.carried)
    session.copies_announced = parked.copies_sent  # the client counts the copies that landed since it started
    if session.callbacks is not None:  # attached here before the resume (the shim does that first)
        session.callbacks.deliveries.sent = parked.copies_sent
    if parked.ctx:
        session.executor.set_context(parked.ctx)
        session.ctx = parked.ctx
    channel = session.channel
    try:
        for call_id, flags, args, bulk in parked.frames:  # asynchronous: nothing is answered
            session.channel = Replayed(bulk)
            session.dispatch(call_id, flags, args, len(bulk))
    finally:
        session.channel = channel


def discard(lease, executor, token: int, Session) -> None:
    """A parked process that will not come (it ended before it was told to): what it held here goes, as when a
    connection closes (its allocations, the contexts it created, its window). `Session`: the guard's (given:
    the guard builds on this module)."""

    if token not in lease.parked:
        return
    session = Session(lease, executor, Replayed(b""))
    resume(session, token)
    session.close()


class Replayed:
    """A frame's bulk, received earlier, as the channel a dispatch reads it from (it answers nothing)."""

    def __init__(self, bulk: bytes) -> None:
        self.bulk = memoryview(bulk)
        self.bulk_left = 0
        self.local = False
        self.encrypted = False

    def _take(self, n: int) -> memoryview:
        out, self.bulk = self.bulk[:n], self.bulk[n:]
        return out

    def read_exact(self, n: int) -> bytes:
        return bytes(self._take(n))

    def read_into(self, out: memoryview) -> None:
        out[:] = self._take(len(out))

    def read_bulk(self, limit: int) -> bytes:
        data = bytes(self._take(self.bulk_left))
        self.bulk_left = 0
        return data

    def bulk_chunks(self):
        while self.bulk_left:
            n = min(self.bulk_left, 4 << 20)
            self.bulk_left -= n
            yield self._take(n)

    def scratch(self, n: int) -> memoryview:
        return memoryview(bytearray(max(n, 1)))[: max(n, 1)]

    def skip(self, n: int) -> None:
        self._take(n)
        self.bulk_left = 0

    def send(self, *parts) -> None:
        pass

    def send_with_fd(self, fd: int, *parts) -> None:
        pass
