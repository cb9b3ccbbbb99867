"""The guard's graphs built node by node, and the graph calls of stream captures: every node, dependency
and body graph a call names must be the lease's, and the nodes and graphs the driver hands back become
the lease's (a graph's nodes go with it).
"""

from __future__ import annotations

import dataclasses
import struct
from typing import ClassVar

from virtualize.common import _wire
from virtualize.common._calls import Call
from virtualize.common._results import CUresult
from virtualize.server._executor import HOST_NODE, INVALID_VALUE, Copy3D, CudaError, Launch, RecapturedNode
from virtualize.server._guard_concern import EMPTY, Concern
from virtualize.server._guard_graph_memory import graph_reserve_read
from virtualize.server._guard_rules import ACCESS_POLICY_WINDOW, STREAM_ATTRIBUTE_BYTES, padded_params

MAX_DOT_BYTES = 64 << 20  # a graph's DOT description sent back (cuGraphDebugDotPrint)
MAX_NODE_DEPS = 4096  # dependencies of one graph node (the shim's limit too)
MAX_CONDITIONAL_BODIES = 64  # body graphs of one conditional node (a switch's cases; the shim's limit too)
# A kernel node's launch attributes (CUlaunchAttributeID) whose values are plain numbers or an access-policy
# window: not the programmatic and completion events (7, 12: handles), nor the device-side node (13).
KERNEL_NODE_ATTRIBUTES = frozenset({ACCESS_POLICY_WINDOW, 2, 4, 5, 8, 9, 10, 11, 14, 16, 17, 18})
# A memory node's access descriptors on the wire (CUmemAccessDesc: location type, location id, flags), at
# most one per device of a lease (the shim's limit too).
ACCESS_DESC = struct.Struct("<iiI")
MAX_ACCESS_DESCS = 64
ALLOCATION_PINNED = 1  # CU_MEM_ALLOCATION_TYPE_PINNED, what graph memory is
LOCATION_DEVICE = 1  # CU_MEM_LOCATION_TYPE_DEVICE
# A batch memory-operation node's operations: CUstreamBatchMemOpParams, its type then (a wait or write) the
# address; at most the driver's batch (the shim's limit too). Waits and writes of 32 and 64 bits, by type.
MEM_OP = struct.Struct("<I4xQ32x")
MAX_MEM_OPS = 256
MEM_OP_WORDS = {1: 4, 2: 4, 4: 8, 5: 8}  # WAIT_VALUE_32, WRITE_VALUE_32, WAIT_VALUE_64, WRITE_VALUE_64
MEM_OP_OTHERS = (3, 6)  # FLUSH_REMOTE_WRITES, BARRIER: no address


class GraphCalls(Concern):
    """Graph nodes, edges and updates, and a capture's graph and dependencies."""

    CALLS: ClassVar[dict[str, str]] = {
        "cuGraphAddKernelNode_v2": "graph_kernel_node",
        "cuGraphExecKernelNodeSetParams_v2": "graph_kernel_node",
        "cuGraphKernelNodeSetParams_v2": "graph_kernel_node",
        "cuGraphAddMemsetNode": "graph_memset_node",
        "cuGraphAddEmptyNode": "graph_empty_node",
        "cuGraphAddDependencies": "graph_dependencies",
        "cuGraphAddDependencies_v2": "graph_dependencies",
        "cuGraphRemoveDependencies": "graph_dependencies",
        "cuGraphRemoveDependencies_v2": "graph_dependencies",
        "cuGraphAddChildGraphNode": "graph_child_node",
        "cuGraphAddEventRecordNode": "graph_event_node",
        "cuGraphAddEventWaitNode": "graph_event_node",
        "cuGraphAddHostNode": "graph_host_node",
        "cuGraphHostNodeSetParams": "graph_host_node_set",
        "cuGraphExecHostNodeSetParams": "graph_host_node_set",
        "cuGraphHostNodeGetParams": "graph_host_node_get",
        "cuGraphKernelNodeGetAttribute": "kernel_node_attribute",
        "cuGraphKernelNodeSetAttribute": "kernel_node_attribute",
        "cuGraphAddMemcpyNode": "graph_memcpy_node",
        "cuGraphAddMemAllocNode": "graph_mem_alloc_node",
        "cuGraphMemAllocNodeGetParams": "graph_mem_alloc_node_get",
        "cuGraphAddMemFreeNode": "graph_mem_free_node",
        "cuGraphAddBatchMemOpNode": "graph_batch_mem_op_node",
        "cuGraphBatchMemOpNodeSetParams": "graph_batch_mem_op_node",
        "cuGraphExecBatchMemOpNodeSetParams": "graph_batch_mem_op_node",
        "cuGraphBatchMemOpNodeGetParams": "graph_batch_mem_op_node_get",
        "cuGraphExecMemsetNodeSetParams": "graph_memset_node",
        "cuGraphExecMemcpyNodeSetParams": "graph_memcpy_node",
        "cuGraphMemsetNodeSetParams": "graph_memset_node",
        "cuGraphMemcpyNodeSetParams": "graph_memcpy_node",
        "cuGraphMemcpyNodeGetParams": "graph_memcpy_node_get",
        "cuGraphKernelNodeGetParams_v2": "graph_kernel_node_get",
        "cuGraphDebugDotPrint": "graph_dot",
        "cuGraphGetNodes": "graph_nodes",
        "cuGraphGetRootNodes": "graph_node_list",
        "cuGraphNodeGetDependencies": "graph_node_list",
        "cuGraphNodeGetDependencies_v2": "graph_node_list",
        "cuGraphNodeGetDependentNodes": "graph_node_list",
        "cuGraphNodeGetDependentNodes_v2": "graph_node_list",
        "cuGraphGetEdges": "graph_edges",
        "cuGraphGetEdges_v2": "graph_edges",
        "gpGraphAddConditionalNode": "graph_conditional_node",
        "cuGraphExecUpdate_v2": "graph_exec_update",
        "cuStreamGetCaptureInfo_v2": "capture_info",
        "cuStreamGetCaptureInfo_v3": "capture_info",
        "cuStreamBeginCaptureToGraph": "capture_to_graph",
        "cuStreamBeginRecaptureToGraph": "recapture_to_graph",
        "cuStreamUpdateCaptureDependencies": "capture_dependencies",
        "cuStreamUpdateCaptureDependencies_v2": "capture_dependencies",
    }

    def nodes(self, raw: bytes, count: int) -> list[int]:
        """`count` node handles of this lease from the front of `raw`."""
        if len(raw) < 8 * count:
            raise CudaError(INVALID_VALUE, "dependency array")
        nodes = list(struct.unpack_from(f"<{count}Q", raw))
        if any(n not in self.session.lease.handles["node"] for n in nodes):
            raise CudaError(INVALID_VALUE, "a node that is not this lease's")
        return nodes

    def _new_node(self, node: int, graph: int):
        self.session.lease.handles["node"].add(node)
        self.session.lease.children.setdefault(graph, set()).add(node)
        return struct.pack("<Q", node), b""

    def graph_kernel_node(self, call: Call, ins: tuple):
        """cuGraphAddKernelNode, or a kernel node set anew: a graph's (cuGraphKernelNodeSetParams) or an
        instantiated graph's (cuGraphExecKernelNodeSetParams)."""
        self.session._check(call, ins)
        adding = call.name == "cuGraphAddKernelNode"
        at = 2 if call.name == "cuGraphExecKernelNodeSetParams" else 1  # after (exec, node), a graph, a node
        owner, func, dims = ins[0], ins[at], ins[at + 1 : at + 8]
        num_deps = ins[-1] if adding else 0
        data = self.session.channel.read_bulk(limit=MAX_NODE_DEPS * 8 + (1 << 20))
        deps = self.nodes(data, num_deps)
        params = data[8 * num_deps :]
        layout = self.session._layout(func)
        params = padded_params(params, layout)
        is_kernel = func in self.session.lease.handles["kernel"]
        launch = Launch(
            func, tuple(dims[:3]), tuple(dims[3:6]), dims[6], 0, params, layout, is_kernel=is_kernel
        )
        executor = self.session.executor
        if call.name == "cuGraphKernelNodeSetParams":
            executor.graph_kernel_node_set(owner, launch)
            self.session.lease.kernel_nodes[owner] = func
        elif not adding:
            executor.graph_exec_kernel_node(owner, ins[1], launch)
        else:
            node = executor.graph_add_kernel_node(owner, deps, launch)
            self.session.lease.kernel_nodes[node] = func
            return self._new_node(node, owner)
        return EMPTY

    def _program_function(self, node: int, func: int) -> int:
        """The lease's handle for a kernel node's function `func` (the worker's): the one the program gave
        the node while it still names that function, else `func` where it is the lease's own."""
        handles = self.session.lease.handles
        given = self.session.lease.kernel_nodes.get(node)
        if given in handles["func"] and given == func:
            return given
        if given in handles["kernel"] and func in (given, self.session.executor.cuKernelGetFunction(given)):
            return given
        if func in handles["func"]:
            return func
        raise CudaError(CUresult.NOT_SUPPORTED, "a kernel node whose function is not one of the lease's")

    def graph_kernel_node_get(self, call: Call, ins: tuple):
        """The node's function (a handle of the lease; the kernel's function for a node made from a
        CUkernel, as a launch of it runs), shape and shared memory; its parameters in the bulk."""
        self.session._check(call, ins)
        node, program_func = ins[0], []

        def layout_of(func: int) -> list[tuple[int, int]]:
            program_func.append(self._program_function(node, func))
            return self.session._layout(program_func[0])

        executor = self.session.executor
        _func, grid, block, smem, params = executor.graph_kernel_node_params(node, layout_of)
        func = program_func[0]
        if func in self.session.lease.handles["kernel"]:  # a node made from a kernel: the kernel's function
            func = executor.cuKernelGetFunction(func)
            self.session.lease.handles["func"].add(func)
        return call.out_struct.pack(func, *grid, *block, smem), params

    def graph_memset_node(self, call: Call, ins: tuple):
        """cuGraphAddMemsetNode, or a memset node set anew: a graph's (cuGraphMemsetNodeSetParams) or an
        instantiated graph's (cuGraphExecMemsetNodeSetParams)."""
        self.session._check(call, ins)
        on_exec = call.name == "cuGraphExecMemsetNodeSetParams"
        owner = ins[0]
        dst, pitch, value, element_size, width, height = ins[1 + on_exec : 7 + on_exec]
        if element_size not in (1, 2, 4) or height < 1:
            raise CudaError(INVALID_VALUE, "memset node shape")
        self.session._check_range(dst, pitch * (height - 1) + width * element_size)
        executor = self.session.executor
        if on_exec:
            executor.graph_exec_memset_node(owner, ins[1], dst, pitch, value, element_size, width, height)
        elif call.name == "cuGraphMemsetNodeSetParams":
            executor.graph_memset_node_set(owner, dst, pitch, value, element_size, width, height)
        else:
            deps = self.nodes(self.session.channel.read_bulk(limit=MAX_NODE_DEPS * 8), ins[-1])
            node = executor.graph_add_memset_node(owner, deps, dst, pitch, value, element_size, width, height)
            return self._new_node(node, owner)
        return EMPTY

    def graph_empty_node(self, call: Call, ins: tuple):
        self.session._check(call, ins)
        graph, num_deps = ins
        deps = self.nodes(self.session.channel.read_bulk(limit=MAX_NODE_DEPS * 8), num_deps)
        return self._new_node(self.session.executor.graph_add_empty_node(graph, deps), graph)

    def graph_dependencies(self, call: Call, ins: tuple):
        """Edges added or removed as (from, to) pairs; the _v2 calls' each with its 8 bytes of edge data
        (from port, to port, type: a programmatic dependency), which the driver checks."""
        self.session._check(call, ins)
        graph, count = ins
        words = 3 if call.symbol.endswith("_v2") else 2
        data = self.session.channel.read_bulk(limit=MAX_NODE_DEPS * 8 * words)
        if len(data) != 8 * words * count:
            raise CudaError(INVALID_VALUE, "graph edges")
        triples = [data[8 * words * i : 8 * words * (i + 1)] for i in range(count)]
        nodes = self.nodes(b"".join(t[:16] for t in triples), 2 * count)
        edge_data = [t[16:24] if words == 3 else bytes(8) for t in triples]
        edges = list(zip(nodes[::2], nodes[1::2], strict=True))
        if call.name == "cuGraphRemoveDependencies":
            self.session.executor.graph_remove_dependencies(graph, edges, edge_data)
        else:
            self.session.executor.graph_add_dependencies(graph, edges, edge_data)

    def graph_child_node(self, call: Call, ins: tuple):
        self.session._check(call, ins)
        graph, child, num_deps = ins
        deps = self.nodes(self.session.channel.read_bulk(limit=MAX_NODE_DEPS * 8), num_deps)
        return self._new_node(self.session.executor.graph_add_child_node(graph, deps, child), graph)

    def graph_event_node(self, call: Call, ins: tuple):
        self.session._check(call, ins)
        graph, event, num_deps = ins
        deps = self.nodes(self.session.channel.read_bulk(limit=MAX_NODE_DEPS * 8), num_deps)
        node = self.session.executor.graph_add_event_node(
            graph, deps, event, call.name == "cuGraphAddEventWaitNode"
        )
        return self._new_node(node, graph)

    def graph_memcpy_node(self, call: Call, ins: tuple):
        """cuGraphAddMemcpyNode, or a copy node set anew: a graph's (cuGraphMemcpyNodeSetParams) or an
        instantiated graph's (cuGraphExecMemcpyNodeSetParams)."""
        self.session._check(call, ins)
        on_exec = call.name == "cuGraphExecMemcpyNodeSetParams"
        owner = ins[0]
        copy = Copy3D(*ins[1 + on_exec : 10 + on_exec])
        if copy.width == 0 or copy.height == 0 or copy.depth == 0:
            raise CudaError(INVALID_VALUE, "memcpy node extent")
        if copy.height > 1 and (copy.src_pitch < copy.width or copy.dst_pitch < copy.width):
            raise CudaError(INVALID_VALUE, "memcpy node pitch")
        self.session._check_range(copy.src, copy.span(copy.src_pitch, copy.src_height))
        self.session._check_range(copy.dst, copy.span(copy.dst_pitch, copy.dst_height))
        if on_exec:
            self.session.executor.graph_exec_memcpy_node(owner, ins[1], copy)
        elif call.name == "cuGraphMemcpyNodeSetParams":
            self.session.executor.graph_memcpy_node_set(owner, copy)
        else:
            deps = self.nodes(self.session.channel.read_bulk(limit=MAX_NODE_DEPS * 8), ins[-1])
            return self._new_node(self.session.executor.graph_add_memcpy_node(owner, deps, copy), owner)
        return EMPTY

    def _lease_device(self, device: int) -> int:
        if not 0 <= device < len(self.session.lease.limits):
            raise CudaError(CUresult.INVALID_DEVICE, f"device {device} is not one of the lease's")
        return device

    def graph_mem_alloc_node(self, call: Call, ins: tuple):
        """A memory allocation node: graph memory of one of the lease's devices, which the lease's devices
        may be given access to. The driver places it when the node is added; from then its bytes count
        against the device's partition (refused with OUT_OF_MEMORY past it) and its addresses are the
        lease's, until a free node or cuMemFree frees it, or its graphs are all gone (from then the
        driver's graph memory reserve counts what it still holds: virtualize.server._guard_graph_memory)."""
        self.session._check(call, ins)
        graph, alloc_type, handle_types, location_type, device, size, num_access, num_deps = ins
        if num_access > MAX_ACCESS_DESCS or not size or alloc_type != ALLOCATION_PINNED or handle_types:
            raise CudaError(INVALID_VALUE, "memory allocation node parameters")
        if location_type != LOCATION_DEVICE:
            raise CudaError(CUresult.NOT_SUPPORTED, "graph memory other than device memory is not forwarded")
        data = self.session.channel.read_bulk(limit=MAX_NODE_DEPS * 8 + MAX_ACCESS_DESCS * ACCESS_DESC.size)
        deps = self.nodes(data, num_deps)
        if len(data) != 8 * num_deps + ACCESS_DESC.size * num_access:
            raise CudaError(INVALID_VALUE, "access descriptors")
        access = []
        for kind, peer, flags in ACCESS_DESC.iter_unpack(data[8 * num_deps :]):
            if kind != LOCATION_DEVICE:
                raise CudaError(INVALID_VALUE, "an access descriptor not of a device")
            access.append((self._lease_device(peer), flags))
        device = self._lease_device(device)
        executor = self.session.executor
        if self.session.lease.has_graph_memory:  # the driver's reserve as it is now, reused by this node
            graph_reserve_read(self.session.lease, executor, device)
        node, ptr = self.session.charged(
            device, size, lambda: executor.graph_add_mem_alloc_node(graph, deps, device, size, access)
        )
        self.session.own(ptr, size, device, graph=graph)
        self._new_node(node, graph)
        return call.out_struct.pack(node, ptr), b""

    def graph_mem_alloc_node_get(self, call: Call, ins: tuple):
        """The node's device, size and address; its access descriptors in the bulk."""
        self.session._check(call, ins)
        device, size, ptr, access = self.session.executor.graph_mem_alloc_node_params(ins[0])
        described = b"".join(ACCESS_DESC.pack(LOCATION_DEVICE, peer, flags) for peer, flags in access)
        return call.out_struct.pack(device, size, ptr, len(access)), described

    def graph_mem_free_node(self, call: Call, ins: tuple):
        """A memory free node of an allocation of the lease (its first byte): from here the memory is no
        longer the lease's, nor counted against its partition, as a captured cuMemFreeAsync's is not."""
        self.session._check(call, ins)
        graph, ptr, num_deps = ins
        held = self.session.lease.allocations.get(ptr)
        if held is None or not held.owned or held.window is not None:
            raise CudaError(INVALID_VALUE, f"0x{ptr:x} is not graph memory of this lease")
        deps = self.nodes(self.session.channel.read_bulk(limit=MAX_NODE_DEPS * 8), num_deps)
        node = self.session.executor.graph_add_mem_free_node(graph, deps, ptr)
        self.session.lease.remove(ptr)
        self.session.owned.discard(ptr)
        return self._new_node(node, graph)

    def _memory_operations(self, raw: bytes, count: int) -> bytes:
        """`count` operations, each wait's or write's whole word memory of the lease."""
        if not 1 <= count <= MAX_MEM_OPS or len(raw) != count * MEM_OP.size:
            raise CudaError(INVALID_VALUE, "memory operations")
        for op, address in MEM_OP.iter_unpack(raw):
            if op in MEM_OP_WORDS:
                self.session._check_range(address, MEM_OP_WORDS[op])
            elif op not in MEM_OP_OTHERS:
                raise CudaError(INVALID_VALUE, f"memory operation {op}")
        return raw

    def graph_batch_mem_op_node(self, call: Call, ins: tuple):
        """cuGraphAddBatchMemOpNode, or a batch memory-operation node set anew: a graph's or an instantiated
        graph's."""
        self.session._check(call, ins)
        executor = self.session.executor
        if call.name == "cuGraphAddBatchMemOpNode":
            graph, count, flags, num_deps = ins
            data = self.session.channel.read_bulk(limit=MAX_NODE_DEPS * 8 + MAX_MEM_OPS * MEM_OP.size)
            deps = self.nodes(data, num_deps)
            ops = self._memory_operations(data[8 * num_deps :], count)
            return self._new_node(executor.graph_add_batch_mem_op_node(graph, deps, ops, flags), graph)
        graph_exec, node, count, flags = ins if len(ins) == 4 else (0, *ins)
        ops = self._memory_operations(self.session.channel.read_bulk(limit=MAX_MEM_OPS * MEM_OP.size), count)
        executor.graph_batch_mem_op_node_set(graph_exec, node, ops, flags)
        return EMPTY

    def graph_batch_mem_op_node_get(self, call: Call, ins: tuple):
        """The count and flags; the operations in the bulk."""
        self.session._check(call, ins)
        ops, flags = self.session.executor.graph_batch_mem_op_node_params(ins[0])
        return call.out_struct.pack(len(ops) // MEM_OP.size, flags), bytes(ops)

    def graph_memcpy_node_get(self, call: Call, ins: tuple):
        """A copy node's device-side copy; only between memory of this lease (a copy the worker made with
        memory of its own, such as a captured copy's staging, is not read back)."""
        self.session._check(call, ins)
        copy = self.session.executor.graph_memcpy_node_params(ins[0])
        for side, pitch, rows in (
            (copy.src, copy.src_pitch, copy.src_height),
            (copy.dst, copy.dst_pitch, copy.dst_height),
        ):
            try:
                self.session._check_range(side, copy.span(pitch, rows))
            except CudaError:
                raise CudaError(CUresult.NOT_SUPPORTED, "a copy node of memory not the lease's") from None
        return call.out_struct.pack(*dataclasses.astuple(copy)), b""

    def graph_dot(self, call: Call, ins: tuple):
        """The DOT text the worker's driver writes for the graph: its length, then the text in the bulk."""
        self.session._check(call, ins)
        text = bytes(self.session.executor.cuGraphDebugDotPrint(*ins))
        if len(text) > MAX_DOT_BYTES:
            raise CudaError(CUresult.OUT_OF_MEMORY, "a graph description past 64 MiB")
        return call.out_struct.pack(len(text)), text

    def _callbacks(self):
        callbacks = self.session.callbacks
        if callbacks is None:
            raise CudaError(CUresult.NOT_SUPPORTED, "no callback connection")
        return callbacks

    def graph_host_node(self, call: Call, ins: tuple):
        """A host node: the program's function `ident` (kept by its shim), called back at every launch."""
        self.session._check(call, ins)
        graph, ident, num_deps = ins
        deps = self.nodes(self.session.channel.read_bulk(limit=MAX_NODE_DEPS * 8), num_deps)
        callbacks = self._callbacks()
        node = self.session.executor.graph_add_host_node(graph, deps, lambda: callbacks.call(ident))
        self.session.lease.host_nodes[node] = (callbacks, ident)
        return self._new_node(node, graph)

    def graph_host_node_set(self, call: Call, ins: tuple):
        """A host node's function anew: the graph's (cuGraphHostNodeSetParams) or an instantiated graph's."""
        self.session._check(call, ins)
        graph_exec, node, ident = ins if len(ins) == 3 else (0, *ins)
        callbacks = self._callbacks()
        self.session.executor.graph_host_node_set(graph_exec, node, lambda: callbacks.call(ident))
        if not graph_exec:
            self.session.lease.host_nodes[node] = (callbacks, ident)
        return EMPTY

    def graph_host_node_get(self, call: Call, ins: tuple):
        """The id of the host node's function in its program; a node whose function is not this process's
        (another process's, or a clone's twin) is not read back."""
        self.session._check(call, ins)
        owner, ident = self.session.lease.host_nodes.get(ins[0], (None, 0))
        if self.session.executor.cuGraphNodeGetType(ins[0]) != 3:  # CU_GRAPH_NODE_TYPE_HOST
            raise CudaError(INVALID_VALUE, "not a host node")
        if owner is None or owner is not self.session.callbacks:
            raise CudaError(CUresult.NOT_SUPPORTED, "a host node whose function is not this process's")
        return call.out_struct.pack(ident), b""

    def kernel_node_attribute(self, call: Call, ins: tuple):
        """cuGraphKernelNodeGetAttribute / SetAttribute: a CUkernelNodeAttrValue (64 bytes) each way, checked
        as a stream attribute's."""
        self.session._check(call, ins)
        node, attr = ins
        if attr not in KERNEL_NODE_ATTRIBUTES:
            raise CudaError(CUresult.NOT_SUPPORTED, f"kernel node attribute {attr} is not forwarded")
        executor = self.session.executor
        if call.name == "cuGraphKernelNodeGetAttribute":
            return b"", bytes(executor.cuGraphKernelNodeGetAttribute(node, attr))[:STREAM_ATTRIBUTE_BYTES]
        value = self.session.channel.read_bulk(limit=STREAM_ATTRIBUTE_BYTES)
        if len(value) != STREAM_ATTRIBUTE_BYTES:
            raise CudaError(INVALID_VALUE, "a kernel node attribute's value is 64 bytes")
        base, size = struct.unpack_from("<QQ", value)
        if attr == ACCESS_POLICY_WINDOW and size:
            self.session._check_range(base, size)
        executor.cuGraphKernelNodeSetAttribute(node, attr, value)
        return EMPTY

    def graph_nodes(self, call: Call, ins: tuple):
        """The count; the nodes (now this lease's) in the bulk."""
        self.session._check(call, ins)
        nodes = self.session.executor.graph_nodes(ins[0])
        self.session.lease.handles["node"].update(nodes)
        self.session.lease.children.setdefault(ins[0], set()).update(nodes)
        return call.out_struct.pack(len(nodes)), struct.pack(f"<{len(nodes)}Q", *nodes)

    def graph_node_list(self, call: Call, ins: tuple):
        """A graph's root nodes, or a node's dependencies or dependents: the count; the nodes in the bulk,
        then (the _v2 calls) each edge's 8 bytes of data."""
        self.session._check(call, ins)
        nodes, edge_data = self.session.executor.graph_node_list(call.name, ins[0])
        self.session.lease.handles["node"].update(nodes)
        bulk = struct.pack(f"<{len(nodes)}Q", *nodes)
        if call.symbol.endswith("_v2"):
            bulk += b"".join(edge_data)
        return call.out_struct.pack(len(nodes)), bulk

    def graph_edges(self, call: Call, ins: tuple):
        """The count; the (from, to) pairs in the bulk."""
        self.session._check(call, ins)
        edges = self.session.executor.graph_edges(ins[0])
        flat = [n for edge in edges for n in edge]
        self.session.lease.handles["node"].update(flat)
        return call.out_struct.pack(len(edges)), struct.pack(f"<{len(flat)}Q", *flat)

    def graph_conditional_node(self, call: Call, ins: tuple):
        """A conditional node; its body graphs (the driver's, owned by the node's graph) become this
        lease's graphs, sent after the node's handle."""
        self.session._check(call, ins)
        graph, handle, kind, size, ctx, num_deps = ins
        if not 1 <= size <= MAX_CONDITIONAL_BODIES:
            raise CudaError(INVALID_VALUE, "conditional node size")
        deps = self.nodes(self.session.channel.read_bulk(limit=MAX_NODE_DEPS * 8), num_deps)
        node, bodies = self.session.executor.graph_add_conditional_node(graph, deps, handle, kind, size, ctx)
        self.session.lease.handles["graph"].update(bodies)
        self.session.lease.children.setdefault(graph, set()).update(bodies)
        out, _ = self._new_node(node, graph)
        return out, struct.pack(f"<{len(bodies)}Q", *bodies)

    def graph_exec_update(self, call: Call, ins: tuple):
        """The update's result and status both travel: a refused update says why (its result)."""
        self.session._check(call, ins)
        result, status = self.session.executor.graph_exec_update(*ins)
        return call.out_struct.pack(result, status), b""

    def capture_info(self, call: Call, ins: tuple):
        """Status, id, graph and the count; the dependency nodes (now this lease's) in the bulk."""
        self.session._check(call, ins)
        status, capture_id, graph, deps = self.session.executor.capture_info(ins[0])
        self.session.lease.handles["node"].update(deps)
        if graph:  # the graph being captured: nodes may be added to it (the one cuStreamEndCapture gives)
            self.session.lease.handles["graph"].add(graph)
            self.session.lease.children.setdefault(graph, set()).update(deps)
        return call.out_struct.pack(status, capture_id, graph, len(deps)), struct.pack(
            f"<{len(deps)}Q", *deps
        )

    def capture_to_graph(self, call: Call, ins: tuple):
        self.session._check(call, ins)
        stream, graph, num_deps, mode = ins
        deps = self.nodes(self.session.channel.read_bulk(limit=MAX_NODE_DEPS * 8), num_deps)
        self.session.executor.capture_to_graph(stream, graph, deps, mode)
        return EMPTY

    def recapture_to_graph(self, call: Call, ins: tuple):
        """Capture again into a graph of the lease. The program's callback (`ident`, 0 for none) is asked
        about each node whose parameters differ, over the process's callback connection while the captured
        call waits, as host functions run; a host node's function is the program's own captured anew, so
        the program is not asked about it (its new function runs)."""
        self.session._check(call, ins)
        stream, mode, graph, ident = ins
        on_mismatch = None
        if ident:
            callbacks = self._callbacks()

            def on_mismatch(
                node: int, original: RecapturedNode, recaptured: RecapturedNode, status: int
            ) -> int:
                if original.type == HOST_NODE:
                    return CUresult.SUCCESS
                head = _wire.RECAPTURE_HEAD.pack(ident, node, status, 0)
                return callbacks.ask(head, self._recapture_side(original) + self._recapture_side(recaptured))

        def layout_of(func: int) -> list[tuple[int, int]]:
            return self.session._layout(func) if self.session.lease.holds("func", func) else []

        self.session.executor.recapture_to_graph(stream, mode, graph, on_mismatch, layout_of)
        return EMPTY

    def _recapture_side(self, side: RecapturedNode) -> bytes:
        """A node's side of a recapture's question (_wire.RECAPTURE_SIDE, the arguments' offsets, bytes)."""
        layout = self.session._layout(side.func) if side.args else []
        offsets = [offset for offset, _size in layout]
        head = _wire.RECAPTURE_SIDE.pack(side.params, len(offsets), len(side.args))
        return head + struct.pack(f"<{len(offsets)}I", *offsets) + side.args

    def capture_dependencies(self, call: Call, ins: tuple):
        self.session._check(call, ins)
        stream, num_deps, flags = ins
        deps = self.nodes(self.session.channel.read_bulk(limit=MAX_NODE_DEPS * 8), num_deps)
        self.session.executor.update_capture_dependencies(stream, deps, flags)
        return EMPTY
