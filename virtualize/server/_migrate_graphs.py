"""CUDA graphs across a live migration (virtualize.server._migrate): the lease's graphs and instantiated
graphs made anew on the target GPU, whichever way they were built.

A graph is not replayed from the calls that built it (a captured graph's nodes came from launches that
already ran): a move reads each graph as it is now on the source (`describe`: its nodes in order, each
node's type and parameters, its edges with their data) and builds that on the target (`build`), so graphs
built node by node, captured, cloned, set anew or captured into (cuStreamBeginCaptureToGraph) move alike.
A graph's nodes name the lease's contexts' objects (functions, events): those are already re-created on
the target when graphs are built, and a node names the new ones.

An instantiated graph cannot be read back, and its graph may be changed or destroyed after instantiation
(PyTorch destroys it): at instantiation the worker keeps a clone of the graph (`Book`, the snapshot), and
each call that sets the instantiated graph's nodes anew since (`EXEC_SETTERS`). A move builds the snapshot
on the target, instantiates it with the same flags and replays those calls. The client names the nodes
of the graph it instantiated; the target's instantiated graph knows the snapshot's: each instantiated
graph has its own map of the client's nodes to the target's (`Book.exec_nodes`).

Node types a move re-creates: kernel, copy (device memory), memset, host, child graph, empty, event
record and event wait. Others (memory allocation and free, external semaphores, stream memory
operations, conditional nodes) are refused up front, with the type, and the lease stays.

A move to another server's worker (virtualize.server._migrate_out) carries the same plans as JSON
(`plans_json`, `plans_from_json`), in the client's values: each graph's nodes, its child graphs and the
events its nodes name as the client knows them, a kernel node's function by where it comes from (the
client's function or CUkernel, re-created there by the records), an instantiated graph's snapshot with the
calls that set its nodes anew (a snapshot's nodes, which the client never saw, by their values here: names
that only link the snapshot to its twins). A host node is not carried: its function is the program's,
called back through its connection to this worker.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from virtualize.server._executor import NOT_SUPPORTED, Copy3D, CudaError, Launch
from virtualize.server._guard_graphs import KERNEL_NODE_ATTRIBUTES

KERNEL, MEMCPY, MEMSET, HOST, CHILD, EMPTY, WAIT_EVENT, RECORD_EVENT = range(8)  # CUgraphNodeType
NODE_TYPES = {8: "external semaphore signal", 9: "external semaphore wait", 10: "memory allocation",
              11: "memory free", 12: "stream memory operation", 13: "conditional"}  # fmt: skip
GRAPH_MAKERS = frozenset({"cuGraphCreate", "cuGraphClone", "cuStreamEndCapture"})  # a graph of its own
# Calls that set an instantiated graph's node anew (replayed on the target's instantiated graph).
EXEC_SETTERS = frozenset({
    "graph_exec_kernel_node", "graph_exec_memcpy_node", "graph_exec_memset_node", "graph_host_node_set",
    "cuGraphExecChildGraphNodeSetParams", "cuGraphExecEventRecordNodeSetEvent",
    "cuGraphExecEventWaitNodeSetEvent", "cuGraphNodeSetEnabled",
})  # fmt: skip


@dataclass
class Node:
    """A node as read on the source: its value there, its type and what building it again needs."""

    value: int
    type: int
    params: tuple = ()  # per type: see `describe`
    child: Graph | None = None  # a child graph node's graph
    attributes: dict[int, bytes] = field(default_factory=dict)  # a kernel node's, where set (clusters...)


@dataclass
class Graph:
    """A graph as read on the source: its nodes in the order they run, its edges and their data."""

    value: int
    nodes: list[Node] = field(default_factory=list)
    edges: list[tuple[int, int]] = field(default_factory=list)
    edge_data: list[bytes] = field(default_factory=list)


@dataclass
class Instantiated:
    """What the worker keeps of an instantiated graph (client values, but `snapshot`: the executor's)."""

    graph: int  # the client's graph it was instantiated from (or last updated from)
    snapshot: int  # the executor's clone of that graph, as it was then
    flags: int
    ctx: int  # the client's context current at instantiation
    twins: dict[int, int]  # the client's node of `graph` -> its twin in `snapshot` (the executor's)
    setters: dict[tuple, tuple] = field(default_factory=dict)  # (method, node) -> the newest call's args
    unkept: str = ""  # why no snapshot could be kept (snapshot 0): a move refuses the lease then


@dataclass
class Plans:
    """What a move of one device re-creates: the graphs and instantiated graphs as read on the source."""

    graphs: list[tuple[int, int, Graph]]  # (the client's graph, the client's context it was made in, read)
    execs: list[tuple[int, Instantiated, Graph]]  # (the client's, what is kept of it, its snapshot read)
    exec_values: dict[int, int] = field(default_factory=dict)  # the client's -> the source's
    origins: dict[int, tuple[str, int]] = field(default_factory=dict)  # a node's function -> its origin

    def functions(self):
        """(the client's context, the source's function) of every kernel node, child graphs' included."""

        def walk(graph: Graph, ctx: int):
            for node in graph.nodes:
                if node.type == KERNEL:
                    yield ctx, node.params[0]
                elif node.child is not None:
                    yield from walk(node.child, ctx)

        for _, ctx, graph in self.graphs:
            yield from walk(graph, ctx)
        for _, kept, graph in self.execs:
            yield from walk(graph, kept.ctx)

    def sources(self):
        """(the executor's method, the source's value) destroying each once the lease has moved."""
        yield from (("cuGraphExecDestroy", value) for value in self.exec_values.values())
        yield from (("cuGraphDestroy", kept.snapshot) for _, kept, _ in self.execs)
        yield from (("cuGraphDestroy", graph.value) for _, _, graph in self.graphs)


class Book:
    """The lease's graphs and instantiated graphs, as a move needs them (kept by `Translated`)."""

    def __init__(self) -> None:
        self.graphs: dict[int, int] = {}  # the client's graph -> the client's context current when made
        self.execs: dict[int, Instantiated] = {}
        self.exec_nodes: dict[int, dict[int, int]] = {}  # after a move: exec -> client node -> target's
        self.lock = threading.Lock()

    def made(self, graph: int, ctx: int) -> None:
        with self.lock:
            self.graphs[graph] = ctx

    def instantiated(self, inner, graph_exec: int, graph: int, real_graph: int, flags: int, ctx: int,
                     client_node: Callable[[int], int]) -> None:  # fmt: skip
        """Keep a clone of the graph as it is at instantiation, and which of its nodes is which there (a
        graph the driver does not clone only keeps the lease from moving, not the program from running)."""
        snapshot, twins, unkept = 0, {}, ""
        try:
            snapshot = inner.cuGraphClone(real_graph)
            for n in inner.graph_nodes(real_graph):
                twins[client_node(n)] = inner.cuGraphNodeFindInClone(n, snapshot)
        except CudaError as exc:
            unkept = f"an instantiated graph whose graph the driver did not clone: {exc}"
            if snapshot:
                with contextlib.suppress(CudaError):
                    inner.cuGraphDestroy(snapshot)
                snapshot = 0
        with self.lock:
            old = self.execs.get(graph_exec)
            self.execs[graph_exec] = Instantiated(graph, snapshot, flags if old is None else old.flags,
                                                  ctx if old is None else old.ctx, twins, unkept=unkept)  # fmt: skip
            self.exec_nodes.pop(graph_exec, None)
        if old is not None and old.snapshot:
            with contextlib.suppress(CudaError):
                inner.cuGraphDestroy(old.snapshot)

    def set_anew(self, method: str, args: tuple, exec_at: int, node_at: int) -> None:
        with self.lock:
            found = self.execs.get(args[exec_at])
            if found is not None:
                key = (method, args[node_at])
                found.setters.pop(key, None)
                found.setters[key] = args  # the newest last

    def exec_node(self, graph_exec: int, node: int) -> int | None:
        """The executor's node that the client's `node` names in `graph_exec`, where a move set it."""
        return self.exec_nodes.get(graph_exec, {}).get(node)

    def forget_graph(self, graph: int) -> None:
        with self.lock:
            self.graphs.pop(graph, None)

    def forget_exec(self, inner, graph_exec: int) -> None:
        with self.lock:
            found = self.execs.pop(graph_exec, None)
            self.exec_nodes.pop(graph_exec, None)
        if found is not None and found.snapshot:
            with contextlib.suppress(CudaError):
                inner.cuGraphDestroy(found.snapshot)


def _attributes(inner, node: int) -> dict[int, bytes]:
    """A kernel node's launch attributes that are set (a cuBLASLt kernel's cluster shape, a priority...)."""
    found = {}
    for attr in sorted(KERNEL_NODE_ATTRIBUTES):
        with contextlib.suppress(CudaError):  # an attribute this driver does not know for the node
            value = bytes(inner.cuGraphKernelNodeGetAttribute(node, attr))
            if any(value):
                found[attr] = value
    return found


def describe(
    inner, graph: int, layout_of: Callable[[int], list], unkept: str = "", address: Callable[[int], int] = int
) -> Graph:
    """The source's `graph` read node by node (refuses a node type a move does not re-create, and an
    instantiated graph of which no snapshot was kept: `unkept` says why); `address`: a copy or memset node's
    device address as the plan holds it (the client's: a module global moved before is elsewhere here)."""
    if unkept:
        raise CudaError(NOT_SUPPORTED, unkept)
    found = Graph(graph)
    for value in inner.graph_nodes(graph):
        kind = inner.cuGraphNodeGetType(value)
        node = Node(value, kind)
        if kind == KERNEL:
            func, grid, block, shared_mem, packed = inner.graph_kernel_node_params(value, layout_of)
            as_launch = Launch(func, grid, block, shared_mem, 0, bytes(packed), layout_of(func))
            node.params = (func, grid, block, shared_mem, params_mapped(as_launch, address))
            node.attributes = _attributes(inner, value)
        elif kind == MEMCPY:
            node.params = (copy_mapped(inner.graph_memcpy_node_params(value), address),)
        elif kind == MEMSET:
            dst, *rest = inner.cuGraphMemsetNodeGetParams(value)
            node.params = (address(dst), *rest)
        elif kind == HOST:
            node.params = (inner.graph_host_node_fn(value),)
        elif kind == CHILD:
            node.child = describe(
                inner, inner.cuGraphChildGraphNodeGetGraph(value), layout_of, address=address
            )
        elif kind in (WAIT_EVENT, RECORD_EVENT):
            getter = (
                inner.cuGraphEventWaitNodeGetEvent
                if kind == WAIT_EVENT
                else inner.cuGraphEventRecordNodeGetEvent
            )
            node.params = (getter(value),)
        elif kind != EMPTY:
            raise CudaError(NOT_SUPPORTED, f"a graph holds a {NODE_TYPES.get(kind, f'type {kind}')} node, which a "
                            "move does not re-create")  # fmt: skip
        found.nodes.append(node)
        deps, data = inner.graph_node_list("cuGraphNodeGetDependencies", value)
        found.edges += [(d, value) for d in deps]
        found.edge_data += list(data) or [bytes(8)] * len(deps)
    return found


@dataclass
class Targets:
    """How a node's handles are found on the target: functions (kernel nodes), events, and the lease's
    layout of a function's parameters."""

    function: Callable[[int], tuple[int, bool]]  # the source's function -> (the target's, is a CUkernel)
    event: Callable[[int], int]
    layout: Callable[[int, bool], list]
    address: Callable[[int], int] = int  # a plan's device address (the client's) -> the target's


def params_mapped(launch: Launch, mapped: Callable[[int], int]) -> bytes:
    """A launch's parameters with each of 8 bytes passed through `mapped` (a module global's address the program
    passes a kernel is another address after a move; any other value comes back as it was)."""
    params = launch.params
    for offset, size in launch.layout:
        if size == 8 and offset + 8 <= len(params):
            value = int.from_bytes(params[offset : offset + 8], "little")
            found = mapped(value)
            if found != value:
                params = params[:offset] + found.to_bytes(8, "little") + params[offset + 8 :]
    return params


def copy_mapped(copy: Copy3D, address: Callable[[int], int]) -> Copy3D:
    """A copy node's copy with both sides' addresses mapped."""
    return replace(copy, src=address(copy.src), dst=address(copy.dst))


def build(inner, described: Graph, into: int, targets: Targets, nodes: dict[int, int]) -> None:
    """Make `described`'s nodes and edges in the target's graph `into`; `nodes`: source node -> new one."""
    for node in described.nodes:
        nodes[node.value] = _node(inner, node, into, targets, nodes)
    if described.edges:
        edges = [(nodes[a], nodes[b]) for a, b in described.edges]
        inner.graph_add_dependencies(into, edges, described.edge_data)


def _node(inner, node: Node, graph: int, targets: Targets, nodes: dict[int, int]) -> int:
    kind, params = node.type, node.params
    if kind == KERNEL:
        func, grid, block, shared_mem, packed = params
        target, is_kernel = targets.function(func)
        launch = Launch(target, tuple(grid), tuple(block), shared_mem, 0, bytes(packed),
                        targets.layout(target, is_kernel), is_kernel=is_kernel)  # fmt: skip
        launch = replace(launch, params=params_mapped(launch, targets.address))
        made = inner.graph_add_kernel_node(graph, [], launch)
        built = _attributes(inner, made)  # what the node has already (a cluster shape compiled in, ...)
        for attr, value in node.attributes.items():
            if built.get(attr) != value:
                inner.cuGraphKernelNodeSetAttribute(made, attr, value)
        return made
    if kind == MEMCPY:
        return inner.graph_add_memcpy_node(graph, [], copy_mapped(params[0], targets.address))
    if kind == MEMSET:
        return inner.graph_add_memset_node(graph, [], targets.address(params[0]), *params[1:])
    if kind == HOST:
        return inner.graph_add_host_node(graph, [], params[0])
    if kind == CHILD:  # an empty child, then its own graph built in place (its nodes are the new ones)
        empty = inner.cuGraphCreate(0)
        try:
            made = inner.graph_add_child_node(graph, [], empty)
        finally:
            inner.cuGraphDestroy(empty)
        build(inner, node.child, inner.cuGraphChildGraphNodeGetGraph(made), targets, nodes)
        return made
    if kind in (WAIT_EVENT, RECORD_EVENT):
        return inner.graph_add_event_node(graph, [], targets.event(params[0]), kind == WAIT_EVENT)
    return inner.graph_add_empty_node(graph, [])


def child_graphs(described: Graph, made: dict[int, int], inner) -> dict[int, int]:
    """The source's child graph nodes' graphs -> the target's (the client may hold them)."""
    found: dict[int, int] = {}
    for node in described.nodes:
        if node.child is not None:
            found[node.child.value] = inner.cuGraphChildGraphNodeGetGraph(made[node.value])
            found.update(child_graphs(node.child, made, inner))
    return found


def launch_in(launch: Launch, function: Callable[[int], int]) -> Launch:
    return replace(launch, func=function(launch.func))


# -- the plans as data: a move to another server's worker (virtualize.server._migrate_out) -------------

HOST_NOT_CARRIED = (
    "a graph holds a host node (a function of the program, called back through its connection to this "
    "worker), which a move to another server does not carry"
)
CARRIED_TYPES = frozenset({KERNEL, MEMCPY, MEMSET, CHILD, EMPTY, WAIT_EVENT, RECORD_EVENT})


def plans_json(plans: Plans, client: Callable[[str, int], int], value_json: Callable) -> dict:
    """`plans` as JSON in the client's values (`client(kind, value)`: the client's value of this worker's node,
    graph or event; `value_json`: a value as JSON). CudaError for a host node; TypeError for a setting
    that is not plain data."""

    def snapshot(kind: str, value: int) -> int:  # a snapshot's nodes and child graphs: this worker's values
        return client(kind, value) if kind == "event" else value

    def setter(key: tuple, args: tuple) -> list:
        return [key[0], key[1], [value_json(a) for a in args]]

    return {
        "graphs": [[g, ctx, _graph_json(graph, client, value_json)] for g, ctx, graph in plans.graphs],
        "execs": [
            {"exec": e, "graph": kept.graph, "flags": kept.flags, "ctx": kept.ctx,
             "twins": [[n, t] for n, t in kept.twins.items()],
             "setters": [setter(key, args) for key, args in kept.setters.items()],
             "snapshot": _graph_json(graph, snapshot, value_json)}
            for e, kept, graph in plans.execs
        ],
        "origins": [[func, kind, value] for func, (kind, value) in plans.origins.items()],
    }  # fmt: skip


def _graph_json(graph: Graph, client: Callable[[str, int], int], value_json: Callable) -> dict:
    return {
        "graph": client("graph", graph.value),
        "nodes": [_node_json(node, client, value_json) for node in graph.nodes],
        "edges": [[client("node", a), client("node", b)] for a, b in graph.edges],
        "edge_data": [value_json(data) for data in graph.edge_data],
    }


def _node_json(node: Node, client: Callable[[str, int], int], value_json: Callable) -> dict:
    if node.type == HOST:
        raise CudaError(NOT_SUPPORTED, HOST_NOT_CARRIED)
    params = (client("event", node.params[0]),) if node.type in (WAIT_EVENT, RECORD_EVENT) else node.params
    return {"node": client("node", node.value), "type": node.type, "params": value_json(params),
            "child": None if node.child is None else _graph_json(node.child, client, value_json),
            "attributes": [[attr, value_json(value)] for attr, value in node.attributes.items()]}  # fmt: skip


def plans_from_json(j: dict, value_from_json: Callable) -> Plans:
    """The plans another server's worker sent (`plans_json`); ValueError for what no plan holds (a node type
    a move does not build, a call that does not set an instantiated graph's node)."""
    execs = []
    for x in j["execs"]:
        setters = {}
        for method, node, args in x["setters"]:
            if method not in EXEC_SETTERS:
                raise ValueError(f"{method!r} is no call that sets an instantiated graph's node")
            setters[str(method), int(node)] = tuple(value_from_json(a) for a in args)
        kept = Instantiated(int(x["graph"]), 0, int(x["flags"]), int(x["ctx"]),
                            {int(n): int(t) for n, t in x["twins"]}, setters)  # fmt: skip
        execs.append((int(x["exec"]), kept, _graph_from_json(x["snapshot"], value_from_json)))
    plans = Plans(
        [(int(g), int(ctx), _graph_from_json(graph, value_from_json)) for g, ctx, graph in j["graphs"]], execs
    )
    for func, kind, value in j["origins"]:
        if kind not in ("func", "kernel"):
            raise ValueError(f"a kernel node's function from {kind!r}")
        plans.origins[int(func)] = (str(kind), int(value))
    return plans


def _graph_from_json(j: dict, value_from_json: Callable) -> Graph:
    graph = Graph(int(j["graph"]), edges=[(int(a), int(b)) for a, b in j["edges"]],
                  edge_data=[bytes(value_from_json(d)) for d in j["edge_data"]])  # fmt: skip
    for n in j["nodes"]:
        kind = int(n["type"])
        if kind not in CARRIED_TYPES:
            raise ValueError(f"a graph node of type {kind}, which a move to another server does not build")
        child = None if n["child"] is None else _graph_from_json(n["child"], value_from_json)
        attributes = {int(attr): bytes(value_from_json(value)) for attr, value in n["attributes"]}
        graph.nodes.append(Node(int(n["node"]), kind, tuple(value_from_json(n["params"])), child, attributes))
    return graph
