"""The guard's graph memory: what the lease's graphs hold of its partition, as the driver holds it.

A graph allocation (an allocation node, or a stream-ordered allocation made during a capture) counts against
the partition from the node's creation until a free node or cuMemFree frees it, as before. The driver
keeps a graph allocation's address for the life of its node, which ends when the graph and its executable
graph are both destroyed; destroying them does not free an allocation a launch made live, and memory a
graph allocation had stays in the driver's graph memory reserve until cuDeviceGraphMemTrim returns it.
So when the last of a graph and its executable graph is destroyed, its allocations stop counting one by
one, and from then the lease is charged the driver's reserve (CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, the
worker's and so this lease's alone) beyond the graph allocations still counted: read again at each of
these calls, at a trim, and at cuMemGetInfo, so a lease that builds and destroys such graphs in a loop
stays within its partition and gets it back when the driver returns the memory.
"""

from __future__ import annotations

import struct
from typing import ClassVar

from virtualize.common._calls import Call
from virtualize.server._guard_concern import Concern

RESERVED_MEM_CURRENT = 2  # CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT


def graph_reserve_read(lease, executor, device: int) -> None:
    """Charge `device`'s graph memory reserve as the driver reports it now, beyond the lease's graph
    allocations charged one by one (those may not hold memory yet: never launched)."""
    reserved = executor.cuDeviceGetGraphMemAttribute(device, RESERVED_MEM_CURRENT)
    with lease.lock:
        counted = sum(
            a.size for a in lease.allocations.values() if a.graph and a.charged and a.device == device
        )
        beyond = max(0, reserved - counted)
        lease.used[device] += beyond - lease.graph_reserve[device]
        lease.graph_reserve[device] = beyond


class GraphMemoryCalls(Concern):
    """Instantiation and destruction of graphs and executable graphs, and the driver's trim."""

    CALLS: ClassVar[dict[str, str]] = {
        "cuGraphInstantiateWithFlags": "instantiate",
        "cuGraphUpload": "reserve_changed",
        "cuGraphExecDestroy": "exec_destroy",
        "cuGraphDestroy": "graph_destroy",
        "cuDeviceGraphMemTrim": "reserve_changed",
        "cuDeviceSetGraphMemAttribute": "reserve_changed",
    }

    def instantiate(self, call: Call, ins: tuple):
        answer = self.session._plain(call, ins)
        (graph_exec,) = struct.unpack_from("<Q", answer[0])
        with self.session.lease.lock:
            self.session.lease.exec_graph[graph_exec] = ins[0]
        return answer

    def exec_destroy(self, call: Call, ins: tuple):
        answer = self.session._plain(call, ins)
        lease = self.session.lease
        with lease.lock:
            graph = lease.exec_graph.pop(ins[0], None)
            gone = graph in lease.graphs_gone and graph not in lease.exec_graph.values()
            if gone:
                lease.graphs_gone.discard(graph)
        if gone:
            self._nodes_gone(graph)
        return answer

    def graph_destroy(self, call: Call, ins: tuple):
        answer = self.session._plain(call, ins)
        lease = self.session.lease
        with lease.lock:
            instantiated = ins[0] in lease.exec_graph.values()
            if instantiated:  # its executable graph keeps the nodes (and may still launch them)
                lease.graphs_gone.add(ins[0])
        if not instantiated:
            self._nodes_gone(ins[0])
        return answer

    def reserve_changed(self, call: Call, ins: tuple):
        """A trim (or an upload, or a high-water mark reset): the driver's reserve read again after it."""
        answer = self.session._plain(call, ins)
        if self.session.lease.has_graph_memory:
            for device in range(len(self.session.lease.limits)):
                graph_reserve_read(self.session.lease, self.session.executor, device)
        return answer

    def _nodes_gone(self, graph: int) -> None:
        """The graph's allocation nodes are gone: their allocations stop counting one by one (the address
        stays the lease's: a launch may have made the allocation live, which only a free frees), and the
        driver's reserve counts what they still hold."""
        lease = self.session.lease
        with lease.lock:
            devices = set()
            for a in lease.allocations.values():
                if a.graph == graph and a.charged:
                    a.charged = False
                    if a.owned:
                        lease.used[a.device] -= a.size
                    devices.add(a.device)
        for device in sorted(devices):
            graph_reserve_read(lease, self.session.executor, device)
