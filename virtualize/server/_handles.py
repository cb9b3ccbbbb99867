"""Handle values across a live migration: the client keeps the values it was given, the objects behind
them are re-created on the target GPU with new values (virtualize.server._migrate).

`Translated` sits between the guard and the executor. Every executor method that takes or returns a
handle maps it in one place, from declarations, not call by call: a per-call method's handle parameters
and results are the call table's (`virtualize.common._calls`: each parameter's kind, matched to the
method's parameter of the same name), a shaped method's are in `SHAPED_HANDLES`. Until the lease first
moves, the map is empty and every value passes unchanged.

It also keeps what a move needs to re-create the lease's objects: the call that made each context,
stream, event, module, function and pool (its arguments as the client named them, and the context it
was made in), and the calls that configured them since (`SETTERS`). A move replays them on the target,
in order, each object's handle arguments mapped to the objects already re-created there, and from then
on maps the client's old values to the new ones. Libraries and kernels are the process's, not a
context's: they stay as they are and load into the target's context when first used there. Graphs,
their nodes and instantiated graphs are not replayed but read on the source and built on the target
(`virtualize.server._migrate_graphs`; a move to another server's worker sends what it read there as
JSON: `graphs_exported`, `graphs_imported`); their values map the same way, a node named with an
instantiated graph through that graph's own map.

A device's primary context is the process's, counted: the driver keeps it while a reference is held.
The move gives the target's primary context as many references as the lease's processes hold on the
source (the replayed retain is one of them; none held: it is let go after the commit), so what the
program sees — `cuDevicePrimaryCtxGetState`, and when its last release lets the context go — is what
an unmigrated run shows. The executor lets go of the source's references itself once the move commits.

CUDA arrays, mipmapped arrays and the program's own virtual memory (cuMemCreate handles) are re-created
by the executor itself (their bytes copied GPU to GPU;
`Executor.migrate` answers which new object stands for which): their values map as the replayed
objects' do, in every call that names one — directly, as a 3D copy's side, or in a texture's or
surface's resource description. Texture and surface objects keep their values (kernels hold them in
their parameters): the executor makes them anew with the same values or the move fails.
"""

from __future__ import annotations

import base64
import bisect
import inspect
import itertools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, fields, replace

from virtualize.common._calls import CALLS, DESTROYS, EVENT_LAUNCH_ATTRIBUTES, HANDLE_TYPES
from virtualize.common._wire import is_event_name
from virtualize.server import _migrate_graphs as graphs
from virtualize.server._arrays import ARRAY, resource_mapped
from virtualize.server._arrays import DEVICE as DEVICE_MEMORY  # a copy side's kind
from virtualize.server._executor import (
    INVALID_CONTEXT,
    INVALID_VALUE,
    NOT_SUPPORTED,
    PER_CALL,
    Copy3D,
    CudaError,
    Executor,
    Launch,
    executor_method,
)

log = logging.getLogger("gpupool.worker")

# One value space per kind, but a CUfunction parameter may carry a CUkernel: those two share one.
NAMESPACE = {**{kind: kind for kind in HANDLE_TYPES}, "kernel": "func"}
RECREATED = frozenset({"ctx", "stream", "event", "module", "func", "pool"})  # a context's objects
REBUILT = frozenset({"graph", "node", "graphexec"})  # read on the source and built anew (_migrate_graphs)
# Re-created by the executor's move itself (its answer's "made").
MOVED = frozenset({"array", "mipmap", "vmem"})
# Kept by a move to another GPU (the worker process's), made anew from its record by a move to another server's
# worker (virtualize.server._migrate_out), where the client's values then map to them.
CARRIED = frozenset({"library"})
MAPPED = RECREATED | REBUILT | MOVED | CARRIED
KEPT = frozenset({"library", "kernel"})  # the process's: valid in every context, not re-created
DESTROYED_BY = {**DESTROYS, "cuCtxDestroy": "ctx"}
BUILTIN_STREAMS = frozenset({0, 1, 2})  # NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD: every context's
# Calls that configure an object or a context and are replayed after it on the target (the newest
# call of each argument list last).
SETTERS = frozenset({
    "cuDevicePrimaryCtxSetFlags", "cuCtxSetLimit", "cuCtxSetCacheConfig", "cuCtxSetSharedMemConfig",
    "cuCtxSetFlags", "cuCtxEnablePeerAccess", "cuFuncSetAttribute", "cuFuncSetCacheConfig",
    "cuFuncSetSharedMemConfig", "cuKernelSetAttribute", "cuKernelSetCacheConfig", "cuStreamSetAttribute",
    "cuMemPoolSetAttribute",
})  # fmt: skip
LAUNCH = "launch"  # a `Launch` argument: its function, its stream, and the events its attributes name
NODES = "nodes"  # a list of graph nodes
EDGES = "edges"  # a list of (from, to) graph nodes
SUBJECT = "subject"  # a graph or a node (graph_node_list: the roots of a graph, or a node's neighbours)
ARRAY_SIDE = "array side"  # a 3D copy's side (`CopySide`): a CUDA array where it names one
RESOURCE = "resource"  # a CUDA_RESOURCE_DESC's bytes: the array or mipmapped array it names
RESOURCE_PARAMS = {"cuTexObjectCreate": "res", "cuSurfObjectCreate": "res"}  # methods taking one
# Handles the guard passes that the table does not declare: the exported memory another process imports.
GUARD_HANDLES = {
    "cuMemImportFromShareableHandle": {"handle": "vmem"},
    "ipc_event_handle": {
        "event": "event"
    },  # an event the client may have named (virtualize.server._ipc_workers)
}
RESOURCE_RESULTS = frozenset({"cuTexObjectGetResourceDesc", "cuSurfObjectGetResourceDesc"})  # answering one
# The shaped methods' parameters that hold handles of the kinds a move re-creates (the others keep
# their values: nothing re-creates them).
SHAPED_HANDLES: dict[str, dict[str, str]] = {
    "set_context": {"ctx": "ctx"},
    "param_layout": {"func": "func"},
    "launch": {"launch": LAUNCH},
    "cluster_occupancy": {"launch": LAUNCH},
    "graph_add_kernel_node": {"graph": "graph", "deps": NODES, "launch": LAUNCH},
    "graph_exec_kernel_node": {"graph_exec": "graphexec", "node": "node", "launch": LAUNCH},
    "graph_kernel_node_set": {"node": "node", "launch": LAUNCH},
    "graph_add_event_node": {"graph": "graph", "deps": NODES, "event": "event"},
    "graph_add_conditional_node": {"graph": "graph", "deps": NODES, "ctx": "ctx"},
    "graph_add_child_node": {"graph": "graph", "deps": NODES, "child": "graph"},
    "graph_exec_update": {"graph_exec": "graphexec", "graph": "graph"},
    "graph_node_list": {"subject": SUBJECT},
    "capture_to_graph": {"stream": "stream", "graph": "graph", "deps": NODES},
    "update_capture_dependencies": {"stream": "stream", "deps": NODES},
    **{method: {"graph": "graph", "deps": NODES} for method in (
        "graph_add_memcpy_node", "graph_add_host_node", "graph_add_memset_node", "graph_add_empty_node")},
    **{method: {"graph_exec": "graphexec", "node": "node"} for method in (
        "graph_exec_memcpy_node", "graph_host_node_set", "graph_exec_memset_node")},
    **{method: {"graph": "graph", "edges": EDGES} for method in (
        "graph_add_dependencies", "graph_remove_dependencies")},
    **{method: {"graph": "graph"} for method in ("graph_nodes", "graph_edges")},
    **{method: {"node": "node"} for method in (
        "graph_memset_node_set", "graph_memcpy_node_set", "graph_kernel_node_params",
        "graph_memcpy_node_params")},
    "nccl_stream": {"stream": "stream"},
    "nccl_buffer": {},  # its address is mapped (SHAPED_ADDRESSES)
    **{method: {"stream": "stream"} for method in (
        "copy_to_device", "copy_from_device", "copy_in_from", "copy_out_into", "copy_out_piece",
        "copy_from_device_async", "memset", "launch_host_func", "capture_info", "lane_staged")},
    "copy_3d": {"stream": "stream", "src": ARRAY_SIDE, "dst": ARRAY_SIDE},
}  # fmt: skip
# The shaped methods' results that are handles: (position in the result tuple, None: the result itself;
# kind).
SHAPED_RESULTS: dict[str, tuple[tuple[int | None, str], ...]] = {
    **{method: ((None, "node"),) for method in (
        "graph_add_kernel_node", "graph_add_event_node", "graph_add_memcpy_node", "graph_add_host_node",
        "graph_add_memset_node", "graph_add_empty_node", "graph_add_child_node")},
    "graph_add_conditional_node": ((0, "node"), (1, "graphs")),
    "graph_nodes": ((None, NODES),),
    "graph_edges": ((None, EDGES),),
    "graph_node_list": ((0, NODES),),
    "capture_info": ((2, "graph"), (3, NODES)),
    "graph_kernel_node_params": ((0, "func"),),
}  # fmt: skip
# The shaped methods' device addresses (a module's global variable is at another address on the target).
SHAPED_ADDRESSES: dict[str, tuple[str, ...]] = {
    "copy_to_device": ("dst",), "copy_from_device": ("src",), "copy_in_from": ("dst",),
    "copy_out_into": ("src",), "copy_out_piece": ("src",), "copy_from_device_async": ("src",), "lane_staged": ("dst",),
    "memset": ("dst",), "nccl_buffer": ("ptr",),
    # graph copy and memset nodes (a Copy3D: both its sides)
    "graph_add_memcpy_node": ("copy",), "graph_memcpy_node_set": ("copy",), "graph_exec_memcpy_node": ("copy",),
    "graph_add_memset_node": ("dst",), "graph_memset_node_set": ("dst",), "graph_exec_memset_node": ("dst",),
}  # fmt: skip
# Results that hold device addresses, beside the call table's: a copy node's copy, a memset node's parameters.
ADDRESS_RESULTS: dict[str, tuple[int, ...]] = {
    "graph_memcpy_node_params": (0,),
    "cuGraphMemsetNodeGetParams": (0,),
}


def address_mapped(value, mapped: Callable[[int], int]):
    """A device address, or each side of a Copy3D, through `mapped`."""
    if isinstance(value, Copy3D):
        return graphs.copy_mapped(value, mapped)
    return mapped(value)


LISTS = frozenset({NODES, EDGES, "graphs"})  # results that are lists of handles
# Calls whose effect on the lease's graphs a move needs to know (graphs._migrate_graphs.Book).
BOOKED = (
    graphs.GRAPH_MAKERS
    | graphs.EXEC_SETTERS
    | {"cuGraphInstantiateWithFlags", "graph_exec_update", "cuGraphExecDestroy", "cuGraphDestroy"}
)
# The call table's parameter names that the executors' methods spell otherwise.
PARAM_ALIASES = {"exec": "graph_exec"}
GLOBAL_GETTERS = frozenset({"cuModuleGetGlobal", "cuLibraryGetGlobal"})  # -> (address, size)
DEVICE_PARAMS = ("dev", "device")  # the lease device a call names, where it names one
# How each call changes the references the lease's processes hold to a device's primary context.
PRIMARY_REFERENCES: dict[str, Callable[[int], int]] = {
    "cuDevicePrimaryCtxRetain": lambda held: held + 1,
    "cuDevicePrimaryCtxRelease": lambda held: max(0, held - 1),
    "cuDevicePrimaryCtxReset": lambda held: 0,
}
SYNTHETIC = 0x7FF0_0000_0000_0000  # values handed out where a new object's value is an old one's
PLAIN_TAGS = {Launch: "launch", Copy3D: "copy"}  # the executor's structures a move to another server sends


@dataclass
class Record:
    """A call that made (`made`: its namespace and the client's value) or configured a lease object."""

    method: str
    args: tuple
    kinds: tuple[tuple[int, str], ...]  # (position, kind) of each handle argument
    ctx: int  # the client's context current when it ran
    device: int | None  # the lease device it belongs to (None: that of its context)
    made: tuple[str, int] | None = None
    made_at: int = 0  # the result that is the made object


class HandleMap:
    """The client's value of each re-created object -> the executor's, and back (a bijection per
    namespace; a value the client never saw maps to itself). Events the client named itself
    (gpEventCreateNamed) are in it from their making, moved or not."""

    def __init__(self) -> None:
        self.to_real: dict[str, dict[int, int]] = {ns: {} for ns in set(NAMESPACE.values())}
        self.to_client: dict[str, dict[int, int]] = {ns: {} for ns in set(NAMESPACE.values())}
        self._synthetic = itertools.count(SYNTHETIC)
        self.lock = threading.Lock()
        self.named = False  # whether a client has named an object: calls map their handles from then on

    def name(self, ns: str, client: int, real: int) -> bool:
        """The client calls the executor's new `real` by `client`, a value it chose; False (nothing changed)
        when that value names an object already (two processes of a lease naming at once)."""
        with self.lock:
            if client in self.to_real[ns]:
                return False
            self.to_real[ns][client], self.to_client[ns][real] = real, client
            self.named = True
            return True

    def unname(self, ns: str, client: int) -> None:
        """A named object is gone: its value leaves the map (a training names millions of events)."""
        with self.lock:
            real = self.to_real[ns].pop(client, None)
            if real is not None and self.to_client[ns].get(real) == client:
                del self.to_client[ns][real]

    def real(self, ns: str, value: int) -> int:
        return self.to_real[ns].get(value, value)

    def client(self, ns: str, value: int) -> int:
        found = self.to_client[ns].get(value)
        if found is not None:
            return found
        if value not in self.to_real[ns]:
            return value
        with self.lock:  # the client names another object by this value: it gets one of its own
            found = self.to_client[ns].get(value)
            if found is None:
                found = next(self._synthetic)
                self.to_real[ns][found], self.to_client[ns][value] = value, found
            return found

    def move(self, ns: str, client: int, real: int) -> None:
        """From now on the client's `client` names the executor's `real`."""
        with self.lock:
            old = self.to_real[ns].pop(client, client)
            if self.to_client[ns].get(old) == client:  # (else another client's value maps to `old`: it stays)
                del self.to_client[ns][old]
            if real != client:
                self.to_real[ns][client], self.to_client[ns][real] = real, client


def _table_kinds() -> dict[str, tuple[dict[str, str], tuple[tuple[int, str], ...]]]:
    """Per-call method -> (its handle parameters by name -> kind, (position, kind) of handle results)."""
    kinds: dict[str, tuple[dict[str, str], tuple[tuple[int, str], ...]]] = {}
    for call in CALLS:
        method = executor_method(call)
        if method not in PER_CALL:
            continue
        ins = {p.name: p.type for p in call.ins if p.type in NAMESPACE}
        outs = tuple((i, p.type) for i, p in enumerate(call.outs) if p.type in NAMESPACE)
        known_ins, known_outs = kinds.get(method, ({}, ()))
        kinds[method] = ({**known_ins, **ins}, outs or known_outs)
    return kinds


def _table_addresses() -> dict[str, tuple[tuple[str, ...], tuple[int, ...]]]:
    """Per-call method -> (its device address parameters by name, positions of address results)."""
    found: dict[str, tuple[tuple[str, ...], tuple[int, ...]]] = {}
    for call in CALLS:
        method = executor_method(call)
        if method in PER_CALL:
            ins = tuple(p.name for p in call.ins if p.type == "dptr")
            outs = tuple(i for i, p in enumerate(call.outs) if p.type == "dptr")
            if ins or outs:
                found[method] = ins, outs
    return found


TABLE_KINDS = _table_kinds()
TABLE_ADDRESSES = _table_addresses()


def _value_json(value):
    """A record's argument as JSON: tagged where JSON has no such type (bytes, tuples; a launch and a copy,
    which set an instantiated graph's nodes)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"b": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, (tuple, list)):
        return {"t": [_value_json(v) for v in value]}
    if isinstance(value, (Launch, Copy3D)):
        return {PLAIN_TAGS[type(value)]: [_value_json(getattr(value, f.name)) for f in fields(value)]}
    raise TypeError(f"a {type(value).__name__}")


def _value_from_json(value):
    if isinstance(value, dict):
        if "b" in value:
            return base64.b64decode(value["b"])
        if "launch" in value:
            launch = Launch(*(_value_from_json(v) for v in value["launch"]))
            return replace(launch, layout=list(launch.layout))
        if "copy" in value:
            return Copy3D(*(int(v) for v in value["copy"]))
        return tuple(_value_from_json(v) for v in value["t"])
    return value


def _record_json(record: Record) -> dict:
    try:
        args = [_value_json(a) for a in record.args]
    except TypeError as exc:
        raise TypeError(
            f"{record.method} holds {exc}, which a move to another server does not send"
        ) from None
    return {"method": record.method, "args": args, "kinds": [list(k) for k in record.kinds], "ctx": record.ctx,
            "device": record.device, "made": list(record.made) if record.made else None, "made_at": record.made_at}  # fmt: skip


def _filling_from(data: bytes) -> Callable[[memoryview], None]:
    """A `copy_to_device` fill that hands out `data` chunk by chunk."""
    offset = 0

    def fill(chunk: memoryview) -> None:
        nonlocal offset
        chunk[:] = data[offset : offset + len(chunk)]
        offset += len(chunk)

    return fill


def _record_from_json(j: dict) -> Record:
    if j["method"] not in PER_CALL:  # only the executor's per-call methods make or configure objects
        raise ValueError(f"{j['method']!r} is no call a record is made of")
    return Record(str(j["method"]), tuple(_value_from_json(a) for a in j["args"]),
                  tuple((int(i), str(k)) for i, k in j["kinds"]), int(j["ctx"]),
                  None if j["device"] is None else int(j["device"]),
                  (str(j["made"][0]), int(j["made"][1])) if j["made"] else None, int(j["made_at"]))  # fmt: skip


def _kinds(name: str, params: list[str]) -> tuple[tuple[tuple[int, str], ...], tuple]:
    """A method's handle parameters ((position, kind)) and handle results, by its parameters' names."""
    if name in SHAPED_HANDLES:
        ins, outs = SHAPED_HANDLES[name], SHAPED_RESULTS.get(name, ())
    else:
        ins, outs = TABLE_KINDS.get(name, ({}, ()))
    ins = {PARAM_ALIASES.get(p, p) if p not in params else p: kind for p, kind in ins.items()}
    if name in RESOURCE_PARAMS:
        ins[RESOURCE_PARAMS[name]] = RESOURCE
    ins.update(GUARD_HANDLES.get(name, {}))
    return tuple((params.index(p), kind) for p, kind in ins.items() if p in params), outs


def _exec_node(kinds) -> tuple[int, int] | None:
    """Where a call names an instantiated graph and a node of it: (the graph's position, the node's)."""
    at = {kind: i for i, kind in kinds}
    return (at["graphexec"], at["node"]) if "graphexec" in at and "node" in at else None


@dataclass
class GlobalVariable:
    """A module's global variable whose address the client asked for: where it asked, how."""

    method: str  # cuModuleGetGlobal or cuLibraryGetGlobal
    args: tuple  # (module or library, name) as the client names them
    ctx: int
    size: int


class Addresses:
    """Device addresses the client holds -> where the bytes are now (module globals that moved)."""

    def __init__(self) -> None:
        self.ranges: list[tuple[int, int, int]] = []  # (client's base, size, real base), by base

    def real(self, address: int) -> int:
        i = bisect.bisect_right(self.ranges, (address, 1 << 64, 0)) - 1
        if i >= 0:
            base, size, real = self.ranges[i]
            if base <= address < base + size:
                return real + address - base
        return address

    def client(self, address: int) -> int:
        for base, size, real in self.ranges:
            if real <= address < real + size:
                return base + address - real
        return address

    def move(self, base: int, size: int, real: int) -> None:
        self.ranges = sorted(
            [r for r in self.ranges if r[0] != base] + ([(base, size, real)] if real != base else [])
        )


class Translated:
    """The executor as the guard sees it: handle values as the client knows them (module docstring)."""

    def __init__(
        self,
        inner: Executor,
        alive: Callable[[str, int], bool] = lambda kind, value: True,
        held: Callable[[str], list[int]] = lambda kind: [],
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self.alive = alive  # whether the lease still holds a handle (the guard's tables)
        self.held = held  # the handles of a kind the lease holds
        self.book = graphs.Book()  # its graphs and instantiated graphs, as a move reads and builds them
        # The CUkernels launched, per the client's context, and the executor's function of each there (what
        # a captured launch's kernel node names): a move finds the kernel of such a node by it.
        self.kernels_launched: set[tuple[int, int]] = set()
        self.kernel_functions: dict[int, dict[int, int]] = {}  # the client's context -> function -> kernel
        self.map = HandleMap()
        self.addresses = Addresses()
        self.globals: dict[int, GlobalVariable] = {}  # the client's address of each -> how it got it
        self.generation = 0  # moves so far: a thread whose context predates the last one sets it again
        self.records: dict[tuple, Record] = {}  # in the order the objects were made and configured
        self.uses: dict[tuple[str, int], set[tuple]] = {}  # an object -> the records naming it
        self.record_lock = threading.Lock()
        self.local = threading.local()  # the client's context current on this thread
        self.cached: set[str] = set()  # methods looked up and kept on this object
        self.primary_held: dict[int, int] = {}  # lease device -> references to its primary context

    def __getattr__(self, name: str):
        method = getattr(self.inner, name)
        wrapped = self._wrap(name, method) if callable(method) else None
        if callable(method):  # built once: later lookups find it directly (until the next move)
            setattr(self, name, wrapped or method)
            self.cached.add(name)
        return wrapped or method

    # -- the per-call wrappers -------------------------------------------------------------------------

    def _wrap(self, name: str, method: Callable):
        try:
            params = list(inspect.signature(method).parameters)
        except (TypeError, ValueError):
            return None
        kinds, outs = _kinds(name, params)
        outs = tuple((i, kind) for i, kind in outs if NAMESPACE.get(kind, kind) in MAPPED or kind in LISTS)
        if name in RESOURCE_RESULTS:
            outs = ((None, RESOURCE),)
        exec_node = _exec_node(kinds)  # a node named together with its instantiated graph
        address_ins, address_outs = (
            (SHAPED_ADDRESSES.get(name, ()), ())
            if name in SHAPED_HANDLES
            else TABLE_ADDRESSES.get(name, ((), ()))
        )
        address_outs = address_outs or ADDRESS_RESULTS.get(name, ())
        addresses = tuple(params.index(p) for p in address_ins if p in params)
        device_at = next((params.index(p) for p in DEVICE_PARAMS if p in params), None)
        makes = (
            ()
            if name in SHAPED_HANDLES
            else tuple((i, k) for i, k in outs if NAMESPACE.get(k) in RECREATED | CARRIED)
        )
        recorded = name in SETTERS or bool(makes)
        destroys = DESTROYED_BY.get(name)
        if name == "set_context":
            return self._set_context
        variable = name in GLOBAL_GETTERS
        booked = name in BOOKED
        references = PRIMARY_REFERENCES.get(name)
        if (
            not kinds and not outs and not recorded and not destroys and not variable and not references
            and not self.generation
        ):  # fmt: skip
            return None  # nothing to map, and every thread's context is the client's

        def call(*args):
            given = args  # as the client names them (what the records keep)
            mapped = self.generation or self.map.named
            if mapped:
                self._current()
                args = self._args_in(args, kinds, addresses, exec_node)
                if name == "graph_kernel_node_params":  # the guard's callback learns the client's function
                    layout_of = args[1]
                    args = (args[0], lambda func: layout_of(self.map.client("func", func)))
            result = method(*args)
            if references is not None and device_at is not None:
                with self.record_lock:
                    dev = given[device_at]
                    self.primary_held[dev] = references(self.primary_held.get(dev, 0))
            if mapped and (outs or address_outs):
                result = self._results_out(result, outs, address_outs)
            if variable:
                self._global(name, given, result)
            elif recorded:
                self._record(name, given, kinds, result, makes, device_at)
            elif destroys and NAMESPACE[destroys] in RECREATED | CARRIED:
                self._forget(NAMESPACE[destroys], given[0])
            if booked:
                self._book(name, given, args, result, exec_node)
            elif (
                name == "launch"
                and (getattr(self.local, "ctx", 0), given[0].func) not in self.kernels_launched
            ):
                self._kernel_launched(given[0].func)
            return result

        call.__name__ = name
        return call

    def _set_context(self, ctx: int) -> None:
        self.inner.set_context(self.map.real("ctx", ctx) if self.generation else ctx)
        self.local.ctx, self.local.generation = ctx, self.generation

    def current(self) -> None:
        """This thread's context is the client's current one as of the last move (the native loop calls
        the driver on the connection's thread)."""
        self._current()

    def _current(self) -> None:
        """This thread's context is the client's current one as of the last move."""
        local = self.local
        if getattr(local, "generation", 0) != self.generation:
            ctx = getattr(local, "ctx", 0)
            if ctx:
                self.inner.set_context(self.map.real("ctx", ctx))
            local.generation = self.generation

    def _args_in(self, args: tuple, kinds, addresses=(), exec_node=None) -> tuple:
        given, args = args, list(args)
        for i, kind in kinds:
            if i < len(args):
                args[i] = self._in(kind, args[i])
        if exec_node is not None and max(exec_node) < len(args):
            at_exec, at_node = exec_node
            found = self.book.exec_node(given[at_exec], given[at_node])
            if found is not None:  # a move instantiated the graph anew: its own twin of the node
                args[at_node] = found
        if self.addresses.ranges:
            for i in addresses:
                if i < len(args) and args[i]:
                    args[i] = address_mapped(args[i], self.addresses.real)
        return tuple(args)

    def _in(self, kind: str, value):
        if kind == LAUNCH:
            return self._launch_in(value)
        if kind == NODES:
            return [self.map.real("node", n) for n in value]
        if kind == EDGES:
            return [(self.map.real("node", a), self.map.real("node", b)) for a, b in value]
        if kind == SUBJECT:  # a node's value, or else a graph's (distinct objects: distinct values)
            node = self.map.real("node", value)
            return node if node != value else self.map.real("graph", value)
        if (
            kind == ARRAY_SIDE
        ):  # an array's handle, or device memory's address (a module global moved elsewhere)
            if value.kind == ARRAY:
                return replace(value, at=self.map.real("array", value.at))
            return replace(value, at=self.addresses.real(value.at)) if value.kind == DEVICE_MEMORY else value
        if kind == RESOURCE:
            return resource_mapped(value, self.map.real)
        ns = NAMESPACE[kind]
        if ns not in MAPPED or not value or (ns == "stream" and value in BUILTIN_STREAMS):
            return value
        return self.map.real(ns, value)

    def _launch_in(self, launch: Launch) -> Launch:
        attributes = tuple(
            (
                attr,
                self.map.real("event", int.from_bytes(value[:8], "little")).to_bytes(8, "little") + value[8:],
            )
            if attr in EVENT_LAUNCH_ATTRIBUTES and len(value) >= 8  # a value that starts with a CUevent
            else (attr, value)
            for attr, value in launch.attributes
        )
        return replace(launch, func=self._in("func", launch.func), stream=self._in("stream", launch.stream),
                       attributes=attributes,
                       params=graphs.params_mapped(launch, self.addresses.real) if self.addresses.ranges
                       else launch.params)  # fmt: skip

    def _out(self, kind: str, value):
        if kind == NODES:
            return [self.map.client("node", n) for n in value]
        if kind == EDGES:
            return [(self.map.client("node", a), self.map.client("node", b)) for a, b in value]
        if kind == "graphs":
            return [self.map.client("graph", g) for g in value]
        if kind == RESOURCE:
            return resource_mapped(value, self.map.client)
        return self.map.client(NAMESPACE[kind], value)

    def _results_out(self, result, outs, addresses=()):
        if outs and outs[0][0] is None:  # a shaped method's result is itself a handle, or a list
            return self._out(outs[0][1], result) if result else result
        values = list(result) if isinstance(result, tuple) else [result]
        for i, kind in outs:
            if i < len(values) and values[i]:
                values[i] = self._out(kind, values[i])
        for i in addresses:
            if i < len(values) and values[i]:
                values[i] = address_mapped(values[i], self.addresses.client)
        return tuple(values) if isinstance(result, tuple) else values[0]

    def _global(self, name: str, args: tuple, result) -> None:
        """A module's global variable the client now has the address of: a move re-finds it in the
        re-created module and copies its bytes there."""
        address, size = result
        with self.record_lock:
            self.globals.setdefault(
                address, GlobalVariable(name, tuple(args), getattr(self.local, "ctx", 0), size)
            )

    def _book(self, name: str, given: tuple, args: tuple, result, exec_node) -> None:
        """What a move needs to know of the lease's graphs (`graphs.Book`), as the client names them."""
        ctx = getattr(self.local, "ctx", 0)
        if name in graphs.GRAPH_MAKERS:
            self.book.made(result, ctx)
        elif name == "cuGraphInstantiateWithFlags":
            self.book.instantiated(self.inner, result, given[0], args[0], given[1], ctx, self._client_node)
        elif name == "graph_exec_update":
            if not result[1]:  # updated: the instantiated graph is now that graph's
                self.book.instantiated(self.inner, given[0], given[1], args[1], 0, ctx, self._client_node)
        elif name == "cuGraphExecDestroy":
            self.book.forget_exec(self.inner, given[0])
        elif name == "cuGraphDestroy":
            self.book.forget_graph(given[0])
        elif exec_node is not None and given[exec_node[0]]:  # graph_host_node_set names no exec: a graph's
            self.book.set_anew(name, given, *exec_node)

    def _kernel_launched(self, func: int) -> None:
        """A launch's function first seen in this context: a CUkernel's function here is noted."""
        ctx = getattr(self.local, "ctx", 0)
        if self.alive("kernel", func):
            function = self.inner.cuKernelGetFunction(self.map.real("func", func))  # (carried: another value)
            with self.record_lock:
                self.kernel_functions.setdefault(ctx, {})[function] = func
        self.kernels_launched.add((ctx, func))

    def _client_node(self, node: int) -> int:
        return self.map.client("node", node)

    # -- what a move replays ---------------------------------------------------------------------------

    def _record(self, name: str, args: tuple, kinds, result, makes, device_at) -> None:
        device = args[device_at] if device_at is not None and device_at < len(args) else None
        ctx = getattr(self.local, "ctx", 0)
        made = None
        position = 0
        if makes:
            values = result if isinstance(result, tuple) else (result,)
            position, kind = makes[0]
            value = values[position] if position < len(values) else 0
            if not value:
                return
            made = (NAMESPACE[kind], value)
            if name == "cuDevicePrimaryCtxRetain" or name == "cuCtxCreate":
                ctx = value  # a context belongs to itself (its device is the call's)
        record = Record(name, tuple(args), kinds, ctx, device, made, position)
        key = ("made", *made) if made is not None else ("set", name, ctx, record.args)
        with self.record_lock:
            if made is not None and key in self.records:
                return  # an object made before, asked for again (retained, or a getter's answer)
            self.records.pop(key, None)
            self.records[key] = record  # a setting: the newest last
            for i, kind in kinds:
                ns = NAMESPACE.get(kind)
                if ns in RECREATED | CARRIED and i < len(args) and args[i]:
                    self.uses.setdefault((ns, args[i]), set()).add(key)

    def _forget(self, ns: str, value: int) -> None:
        with self.record_lock:
            self._forget_locked(ns, value)
        if ns == "event" and is_event_name(value):
            self.map.unname(ns, value)

    def event_named(self, name: int, flags: int) -> None:
        """gpEventCreateNamed: an event made now, in the thread's context, that the client calls `name`;
        recorded as cuEventCreate's under that name, so a move makes it again and maps the name."""
        if self.generation:
            self._current()
        real = self.inner.cuEventCreate(flags)
        if not self.map.name("event", name, real):  # another connection took the name meanwhile
            self.inner.cuEventDestroy(real)
            raise CudaError(INVALID_VALUE, "that value names an event already")
        self._event_recorded(name, flags, getattr(self.local, "ctx", 0))

    def event_made_elsewhere(self, name: int, real: int, flags: int, ctx: int) -> None:
        """An event the native loop made for gpEventCreateNamed in the client's context `ctx` (the lease's
        C table already has the name; so no connection can have taken it)."""
        self.map.name("event", name, real)
        self._event_recorded(name, flags, ctx)

    def event_destroyed_elsewhere(self, name: int) -> None:
        """A named event the native loop destroyed: gone from the name map and the records."""
        self._forget("event", name)

    def _event_recorded(self, name: int, flags: int, ctx: int) -> None:
        record = Record("cuEventCreate", (flags,), (), ctx, None, ("event", name), 0)
        with self.record_lock:
            self.records[("made", "event", name)] = record

    def _forget_locked(self, ns: str, value: int) -> None:
        """An object is gone: its record, and those of what was made from it or configures it (a
        module's functions), so that its value, used again, is recorded anew."""
        self.records.pop(("made", ns, value), None)
        for key in self.uses.pop((ns, value), ()):
            self.records.pop(key, None)

    def _device_of(self, record: Record, contexts: dict[int, int]) -> int | None:
        return record.device if record.device is not None else contexts.get(record.ctx)

    def _holds(self, record: Record) -> bool:
        """Whether the lease still holds what the record made or configures."""
        if record.made is not None:
            ns, value = record.made
            return self.alive(ns, value)
        return all(
            self.alive(NAMESPACE[kind], record.args[i])
            for i, kind in record.kinds
            if kind != LAUNCH and NAMESPACE[kind] in RECREATED | CARRIED and record.args[i]
            and not (NAMESPACE[kind] == "stream" and record.args[i] in BUILTIN_STREAMS)
        )  # fmt: skip

    def moving(self, device: int) -> list[Record]:
        """The records a move of lease device `device` replays, in order."""
        with self.record_lock:
            records = list(self.records.values())
        contexts = {r.made[1]: r.device for r in records if r.made and r.made[0] == "ctx"}
        return [
            r
            for r in records
            if self._device_of(r, contexts) == device
            and self._holds(r)
            and not (r.made and r.made[0] in CARRIED)
        ]

    def contexts(self, device: int) -> list[int]:
        """The client's contexts on lease device `device`."""
        return [r.made[1] for r in self.moving(device) if r.made and r.made[0] == "ctx"]

    def drain(self, device: int) -> None:
        """Synchronise each of the client's contexts on lease device `device` (the calls paused): nothing runs
        while its memory is copied."""
        for ctx in self.contexts(device):
            self.inner.set_context(self.map.real("ctx", ctx))
            self.inner.cuCtxSynchronize()

    # -- the records as data: a move to another server's worker (virtualize.server._migrate_out) --------

    def exported(self) -> dict:
        """The records of every lease device as JSON, in the order they replay, and the references the
        lease's processes hold to each primary context (the calls paused): libraries too (`CARRIED`). A record
        holding an argument that is not plain data (an int, bytes, a string, a float, None, or a tuple of
        them) raises TypeError."""
        with self.record_lock:
            records = [r for r in self.records.values() if self._holds(r)]
            held = dict(self.primary_held)
            variables = list(self.globals.items())
        return {"records": [_record_json(r) for r in records], "primary_held": held,
                "globals": [g for address, v in variables if (g := self._global_json(address, v))]}  # fmt: skip

    def _global_json(self, address: int, variable: GlobalVariable) -> dict | None:
        """A module global whose address the client holds, with its bytes as they are now (read from the
        device, the calls paused), for the receiving worker to find again (`_globals_imported`); None when the
        lease has let go of its module."""
        owner, ns = variable.args[0], "module" if variable.method == "cuModuleGetGlobal" else "library"
        if not self.alive(ns, owner):
            return None
        if variable.ctx:
            self.inner.set_context(self.map.real("ctx", variable.ctx))
        chunks: list[bytes] = []
        self.inner.copy_from_device(self.addresses.real(address), variable.size, None,
                                    lambda view: chunks.append(bytes(view)))  # fmt: skip
        return {"address": address, "method": variable.method, "args": [_value_json(a) for a in variable.args],
                "ctx": variable.ctx, "size": variable.size, "bytes": base64.b64encode(b"".join(chunks)).decode()}  # fmt: skip

    def _globals_imported(self, carried: list[dict], made: dict[tuple[str, int], int]) -> None:
        """The carried globals found again in their re-created modules here, their bytes written there, and
        each client's address mapped to where the bytes now are (`addresses`)."""
        for g in carried:
            variable = GlobalVariable(str(g["method"]), tuple(_value_from_json(a) for a in g["args"]),
                                      int(g["ctx"]), int(g["size"]))  # fmt: skip
            if variable.method not in GLOBAL_GETTERS:
                raise ValueError(f"{variable.method!r} is no call a global is found by")
            (owner, name), ns = (
                variable.args,
                "module" if variable.method == "cuModuleGetGlobal" else "library",
            )
            if variable.ctx:
                self.inner.set_context(made.get(("ctx", variable.ctx), self.map.real("ctx", variable.ctx)))
            found, size = getattr(self.inner, variable.method)(
                made.get((ns, owner), self.map.real(ns, owner)), name
            )
            data = base64.b64decode(g["bytes"])
            if size != variable.size or len(data) != size:
                raise ValueError(f"the global {name!r} is {size} bytes here, {variable.size} on the source")
            self.inner.copy_to_device(found, size, None, _filling_from(data))
            address = int(g["address"])
            self.addresses.move(address, size, found)
            self.globals[address] = variable

    def imported(self, exported: dict) -> int:
        """Re-create the objects of another worker's `exported()` records here, on this worker's fresh
        executor, in order, and map the client's values to them from now on; how many objects were made.
        A failed call raises its CudaError (this worker is then let go: nothing of the source changes)."""
        records = [_record_from_json(j) for j in exported["records"]]
        held = {int(device): int(n) for device, n in exported["primary_held"].items()}
        made: dict[tuple[str, int], int] = {}
        for record in records:
            self._replay(record, made)
        contexts = {r.made[1]: r.device for r in records if r.made and r.made[0] == "ctx"}
        for device in {self._device_of(r, contexts) for r in records} - {None}:
            primary = any(r.method == "cuDevicePrimaryCtxRetain" and r.args[-1] == device for r in records)
            for _ in range(held.get(device, 0) - 1 if primary else 0):  # the replay retained it once
                self.inner.cuDevicePrimaryCtxRetain(device)
            if primary and not held.get(device, 0):  # made to re-create its objects; nobody holds it
                self.inner.cuDevicePrimaryCtxRelease(device)
        self._globals_imported(exported.get("globals", []), made)
        for (ns, client), real in made.items():
            self.map.move(ns, client, real)
        with self.record_lock:
            for record in records:
                key = ("made", *record.made) if record.made is not None else ("set", record.method, record.ctx,
                                                                              record.args)  # fmt: skip
                self.records[key] = record
                for i, kind in record.kinds:
                    ns = NAMESPACE.get(kind)
                    if ns in RECREATED | CARRIED and i < len(record.args) and record.args[i]:
                        self.uses.setdefault((ns, record.args[i]), set()).add(key)
            self.primary_held.update(held)
        self.generation += 1
        for name in self.cached:  # wrapped anew: every call first sets its thread's context to the new one
            self.__dict__.pop(name, None)
        self.cached.clear()
        return len(made)

    def graphs_exported(self) -> dict:
        """The lease's graphs and instantiated graphs as JSON in the client's values (read as a move between
        GPUs reads them, the calls paused), for another server's worker to build (`graphs_imported`).
        CudaError for a graph a move cannot re-create or that holds a host node; TypeError for a setting
        that is not plain data."""

        def client(kind: str, value: int) -> int:
            named = self.map.client(kind, value)
            if kind == "event" and not self.alive("event", named):
                raise CudaError(NOT_SUPPORTED, "an event node whose event the lease destroyed")
            return named

        return graphs.plans_json(self._graph_plans(None), client, _value_json)

    def graphs_imported(self, carried: dict) -> int:
        """Build the graphs and instantiated graphs of another worker's `graphs_exported()` here, after its
        records were replayed (`imported`: the objects their nodes name), and map the client's graph, node
        and instantiated-graph values to them; how many objects were made. A failed call raises its
        CudaError, a plan that names what no plan holds ValueError (this worker is then let go)."""
        plans = graphs.plans_from_json(carried, _value_from_json)
        with self.record_lock:  # what the plans' nodes name, as the records made it here
            made = {r.made: self.map.real(*r.made) for r in self.records.values() if r.made is not None}
        rebuilt = self._graphs_built(None, plans, made, lambda kind, value: value)
        built = [(ns, client, real) for (ns, client), real in made.items() if ns in REBUILT]
        for ns, client, real in built:
            self.map.move(ns, client, real)
        for g, ctx, _ in plans.graphs:
            self.book.made(g, ctx)
        self._graphs_kept(rebuilt)
        return len(built)

    def migrate(self, device: int, target: int, mappings: list, **where) -> dict:
        """Move lease device `device` to GPU `target` (`Executor.migrate`), the calls paused: drain its
        contexts, let the executor move the memory and re-create the objects by replaying their records,
        then map the client's values to the new objects."""
        records = self.moving(device)
        self.drain(device)
        made: dict[tuple[str, int], int] = {}

        contexts = {r.made[1]: r.device for r in records if r.made and r.made[0] == "ctx"}
        variables = [
            (address, v) for address, v in list(self.globals.items()) if contexts.get(v.ctx) == device
        ]
        placed: list[tuple[int, int, int]] = []  # the globals' (client's address, size, target's address)
        plans = self._graph_plans(device)  # read on the source before anything is made on the target
        rebuilt: list[tuple[int, graphs.Instantiated]] = []
        kernel_functions: dict[int, dict[int, int]] = {}

        held = self.primary_held.get(device, 0)
        primary = any(r.method == "cuDevicePrimaryCtxRetain" for r in records)

        def placed_address(address: int) -> int:  # the target's address of one the client holds
            for base, size, real in placed:
                if base <= address < base + size:
                    return real + address - base
            return self.addresses.real(address)

        def recreate() -> list[tuple[str, int, int]]:
            for record in records:
                self._replay(record, made)
            for _ in range(held - 1 if primary else 0):  # the replay retained it once: the others
                self.inner.cuDevicePrimaryCtxRetain(device)
            for address, variable in variables:
                placed.extend(self._global_moved(address, variable, made))
            rebuilt.extend(self._graphs_built(device, plans, made, address=placed_address))
            kernel_functions.update(self._kernel_functions_on_target(made))
            return [(ns, self.map.real(ns, client), real) for (ns, client), real in made.items()]

        moved = self.inner.migrate(device, target, mappings, recreate, **where)
        for (ns, client), real in made.items():
            self.map.move(ns, client, real)
        moved_too = moved.pop(
            "made", []
        )  # the executor's own: arrays (their values as the executor had them)
        for ns, old, new in moved_too:
            self.map.move(ns, self.map.client(ns, old), new)
        for address, size, real in placed:
            self.addresses.move(address, size, real)
        if primary and not held:  # made to re-create its objects; the processes hold no reference to it
            try:
                self.inner.cuDevicePrimaryCtxRelease(device)
            except CudaError as exc:
                log.warning("the target's primary context was not let go after the move: %s", exc)
        self._graphs_committed(plans, rebuilt)
        release_source = moved.pop("release_source", None)
        if release_source is not None:  # the executor lets go of the source GPU: nothing names it any more
            try:
                release_source()
            except Exception as exc:  # the lease runs on the target already: what stays is logged
                log.warning("the source GPU was not let go entirely after the move: %s", exc)
        with self.record_lock:
            self.kernel_functions.update(kernel_functions)
        self.generation += 1
        for name in self.cached:  # wrapped anew: every call first sets its thread's context to the new one
            self.__dict__.pop(name, None)
        self.cached.clear()
        return {**moved, "objects": len(made) + len(moved_too)}

    def migration_refusal(self, target: int, holding: dict[str, int], uuid: str = "") -> str | None:
        reason = self.inner.migration_refusal(target, holding, uuid)
        if reason:
            return reason
        try:
            self._graph_plans(None)
        except CudaError as exc:
            return f"the lease holds a CUDA graph that a move cannot re-create ({exc})"
        return None

    # -- graphs: read on the source, built on the target (virtualize.server._migrate_graphs) -----------

    def _graph_plans(self, device: int | None) -> graphs.Plans:
        """The lease's graphs and instantiated graphs of lease device `device` (every device: None) as they
        are on the source, and where each kernel node's function comes from."""
        with self.record_lock:
            contexts = {r.made[1]: r.device for r in self.records.values() if r.made and r.made[0] == "ctx"}
        with self.book.lock:
            made_graphs = [(g, ctx) for g, ctx in self.book.graphs.items() if self.alive("graph", g)]
            execs = [(e, x) for e, x in self.book.execs.items() if self.alive("graphexec", e)]

        def mine(ctx: int) -> bool:  # a graph made with no context current goes with any move
            return device is None or contexts.get(ctx, device) == device

        def layout_of(func: int) -> list:
            return self.inner.param_layout(func, self.alive("kernel", func))

        client = self.addresses.client  # copy and memset nodes' addresses as the client knows them
        plans = graphs.Plans(
            [(g, ctx, graphs.describe(self.inner, self.map.real("graph", g), layout_of, address=client))
             for g, ctx in made_graphs if mine(ctx)],
            [(e, x, graphs.describe(self.inner, x.snapshot, layout_of, x.unkept, client))
             for e, x in execs if mine(x.ctx)],
        )  # fmt: skip
        plans.exec_values = {e: self.map.real("graphexec", e) for e, _, _ in plans.execs}
        kernels: dict[int, dict[int, int]] = {}  # per context: its functions of the lease's kernels
        for ctx, func in plans.functions():
            if func not in plans.origins:  # (a graph made with no context current: the device's first)
                plans.origins[func] = self._origin(func, ctx or next(iter(contexts), 0), kernels)
        return plans

    def _origin(self, func: int, ctx: int, kernels: dict[int, dict[int, int]]) -> tuple[str, int]:
        """Where a kernel node's function (the source's) comes from: ("func", the client's function) or
        ("kernel", the lease's CUkernel as the client names it, which loads into the target's context); a
        move re-creates both from their records."""
        client = self.map.client("func", func)
        if self.alive("kernel", client):
            return "kernel", client
        if ("made", "func", client) in self.records:
            return "func", client
        launched = self.kernel_functions.get(ctx, {}).get(func)
        if launched is not None and self.alive("kernel", launched):  # a captured launch of a CUkernel
            return "kernel", launched
        if ctx not in kernels:  # else ask the driver for each of the lease's kernels' function there
            self.inner.set_context(self.map.real("ctx", ctx))
            kernels[ctx] = {
                self.inner.cuKernelGetFunction(self.map.real("func", k)): k for k in self.held("kernel")
            }
        if func in kernels[ctx]:
            return "kernel", kernels[ctx][func]
        raise CudaError(NOT_SUPPORTED, "a kernel node whose function is not one the lease loaded")

    def _graphs_built(
        self,
        device: int | None,
        plans: graphs.Plans,
        made: dict,
        client: Callable[[str, int], int] | None = None,
        address: Callable[[int], int] | None = None,
    ) -> list[tuple[int, graphs.Instantiated]]:
        """The plans built on the target (its contexts and their objects already made, in `made`): the new
        graphs and their nodes go into `made`; the instantiated graphs as they will be kept after the move.
        `client`: the client's value of a plan's node, graph or event (the plans of a move between GPUs name
        the source's; those carried from another server, the client's already); `address`: the target's
        address of a device address the client holds (default: as this worker maps them); `device` None: every
        device's."""
        client = client or self.map.client
        address = address or self.addresses.real

        def function(func: int) -> tuple[int, bool]:
            kind, value = plans.origins[func]
            return made.get(("func", value), self.map.real("func", value)), kind == "kernel"

        def event(source: int) -> int:
            named = client("event", source)
            if ("event", named) in made:
                return made["event", named]
            raise CudaError(NOT_SUPPORTED, "an event node whose event the lease destroyed")

        targets = graphs.Targets(function, event, self.inner.param_layout, address)
        contexts = self.contexts(device) if device is not None else [c for ns, c in made if ns == "ctx"]
        fallback = next((made["ctx", c] for c in contexts if ("ctx", c) in made), None)
        for g, ctx, plan in plans.graphs:
            self._target_context(made.get(("ctx", ctx), fallback))
            new, nodes = self.inner.cuGraphCreate(0), {}
            graphs.build(self.inner, plan, new, targets, nodes)
            made["graph", g] = new
            made.update({("node", client("node", n)): real for n, real in nodes.items()})
            for source, real in graphs.child_graphs(plan, nodes, self.inner).items():
                made["graph", client("graph", source)] = real
        rebuilt = []
        for e, kept, plan in plans.execs:
            self._target_context(made.get(("ctx", kept.ctx), fallback))
            snapshot, nodes = self.inner.cuGraphCreate(0), {}
            graphs.build(self.inner, plan, snapshot, targets, nodes)
            new = self.inner.cuGraphInstantiateWithFlags(snapshot, kept.flags)
            made["graphexec", e] = new
            twins = {n: nodes[t] for n, t in kept.twins.items() if t in nodes}
            for (method, _), args in kept.setters.items():
                self._set_anew(method, args, new, twins, made, address)
            rebuilt.append((e, replace(kept, snapshot=snapshot, twins=twins, setters=dict(kept.setters))))
        return rebuilt

    def _kernel_functions_on_target(self, made: dict) -> dict[int, dict[int, int]]:
        """The launched CUkernels' functions in the moved contexts, on the target (what the kernel nodes
        of graphs captured after the move name)."""
        found: dict[int, dict[int, int]] = {}
        for ctx, func in sorted(self.kernels_launched):
            if ("ctx", ctx) in made and self.alive("kernel", func):
                self.inner.set_context(made["ctx", ctx])
                found.setdefault(ctx, {})[self.inner.cuKernelGetFunction(self.map.real("func", func))] = func
        return found

    def _target_context(self, ctx: int | None) -> None:
        if ctx:  # a lease with no context on the device builds no node that needs one
            self.inner.set_context(ctx)

    def _set_anew(
        self, method: str, args: tuple, graph_exec: int, twins: dict[int, int], made: dict, address
    ) -> None:
        """A call that set an instantiated graph's node, replayed on the target's instantiated graph (its
        device addresses, as the client gave them, through `address`)."""
        params = list(inspect.signature(getattr(self.inner, method)).parameters)
        kinds, _ = _kinds(method, params)
        args = list(args)
        for name in SHAPED_ADDRESSES.get(method, ()):
            if name in params and params.index(name) < len(args) and args[params.index(name)]:
                args[params.index(name)] = address_mapped(args[params.index(name)], address)
        for i, kind in kinds:
            ns = NAMESPACE.get(kind)
            if kind == "graphexec":
                args[i] = graph_exec
            elif kind == "node":
                if args[i] not in twins:
                    return  # a node added after instantiation: the instantiated graph never had it
                args[i] = twins[args[i]]
            elif kind == LAUNCH:
                func = args[i].func
                args[i] = replace(args[i], func=made.get(("func", func), self.map.real("func", func)),
                                  params=graphs.params_mapped(args[i], address))  # fmt: skip
            elif ns in MAPPED and args[i] and not (ns == "stream" and args[i] in BUILTIN_STREAMS):
                args[i] = made.get((ns, args[i]), self.map.real(ns, args[i]))
        getattr(self.inner, method)(*args)

    def _graphs_committed(self, plans: graphs.Plans, rebuilt: list[tuple[int, graphs.Instantiated]]) -> None:
        """After the move: the instantiated graphs' new snapshots and node maps kept, the source's graphs,
        instantiated graphs and snapshots destroyed (their nodes name objects of the source's contexts)."""
        self._graphs_kept(rebuilt)
        for method, value in plans.sources():
            try:
                getattr(self.inner, method)(value)
            except CudaError as exc:  # the lease runs on the target already: the source's leftovers only
                log.warning("the source's graph %x was not destroyed after the move: %s", value, exc)

    def _graphs_kept(self, rebuilt: list[tuple[int, graphs.Instantiated]]) -> None:
        """The instantiated graphs built on the target: their snapshots and node maps, as a move reads them."""
        with self.book.lock:
            for e, kept in rebuilt:
                self.book.execs[e] = kept
                self.book.exec_nodes[e] = dict(kept.twins)

    def _global_moved(self, address: int, variable: GlobalVariable, made) -> list[tuple[int, int, int]]:
        """The global variable found again in its re-created module on the target, its bytes copied there
        from the source; ([(the client's address, size, the new address)]), or [] when the lease has let
        go of its module."""
        (owner, name), ns = variable.args, "module" if variable.method == "cuModuleGetGlobal" else "library"
        if not self.alive(ns, owner) or ("ctx", variable.ctx) not in made:
            return []
        self.inner.set_context(made["ctx", variable.ctx])
        found, size = getattr(self.inner, variable.method)(
            made.get((ns, owner), self.map.real(ns, owner)), name
        )
        source_ctx = self.map.real("ctx", variable.ctx)
        self.inner.cuMemcpyPeer(
            found, made["ctx", variable.ctx], self.addresses.real(address), source_ctx, size
        )
        return [(address, size, found)]

    def _replay(self, record: Record, made: dict[tuple[str, int], int]) -> None:
        def target(ns: str, value: int) -> int:
            return made.get((ns, value), self.map.real(ns, value))

        if record.ctx and record.method not in ("cuDevicePrimaryCtxRetain", "cuCtxCreate"):
            if ("ctx", record.ctx) not in made:  # never made on the source GPU's context: all or nothing
                raise CudaError(INVALID_CONTEXT, f"{record.method}: its context was not re-created")
            self.inner.set_context(made["ctx", record.ctx])
        args = list(record.args)
        for i, kind in record.kinds:
            ns = NAMESPACE.get(kind)
            if ns in RECREATED | CARRIED and args[i] and not (ns == "stream" and args[i] in BUILTIN_STREAMS):
                args[i] = target(ns, args[i])
        result = getattr(self.inner, record.method)(*args)
        if record.made is not None:
            values = result if isinstance(result, tuple) else (result,)
            made[record.made] = int(values[record.made_at])
