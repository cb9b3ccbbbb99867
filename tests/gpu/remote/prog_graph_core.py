"""cuda.core's graph builder (issue 11): a graph captured from a stream with a while loop whose
condition a kernel counts down, an if/else whose condition a kernel sets from memory, a child graph
embedded, and a Python host callback; launched, then updated from a graph of the same shape built
with other values and launched again. Then an explicit graph (GraphDefinition): kernel, copy, event
record and wait, callback, if and child graph nodes.

Runs unchanged on a local GPU or, under gpupool's libcuda.so.1, on a leased one; prints the same.
"""

from __future__ import annotations

import sys

import numpy as np
from _common import loaded_libcuda
from cuda.core import Buffer, Device, LaunchConfig, Program, ProgramOptions, launch

SOURCE = r"""
typedef __device_builtin__ unsigned long long cudaGraphConditionalHandle;
extern "C" __device__ __cudart_builtin__ void cudaGraphSetConditional(cudaGraphConditionalHandle handle,
                                                                      unsigned int value);
extern "C" __global__ void add(int *a, int v) { a[threadIdx.x] += v; }
extern "C" __global__ void count_down(cudaGraphConditionalHandle h, int *counter) {
    int left = --*counter;
    cudaGraphSetConditional(h, left > 0 ? 1u : 0u);
}
extern "C" __global__ void pick(cudaGraphConditionalHandle h, const int *flag) {
    cudaGraphSetConditional(h, *flag ? 1u : 0u);
}
"""


def main() -> int:
    dev = Device(0)
    dev.set_current()
    stream = dev.create_stream()
    module = Program(
        SOURCE, code_type="c++", options=ProgramOptions(std="c++17", arch=f"sm_{dev.arch}")
    ).compile("cubin")
    add, count_down, pick = (module.get_kernel(k) for k in ("add", "count_down", "pick"))
    mr = dev.memory_resource
    words = mr.allocate(4 * 16, stream=stream)  # 4 counters of 4 ints, read back as one array
    host = np.zeros(16, dtype=np.int32)
    view = Buffer.from_handle(host.ctypes.data, host.nbytes)
    a, b, c, ctl = (int(words.handle) + 16 * i for i in range(4))  # ctl: [counter, flag, -, -]
    four, single = LaunchConfig(grid=1, block=4), LaunchConfig(grid=1, block=1)
    seen: list[str] = []

    def build(value: int):
        gb = stream.create_graph_builder().begin_building()
        launch(gb, four, add, a, np.int32(value))
        loop = gb.create_condition(default_value=1)
        body = gb.while_loop(loop)
        body.begin_building()
        launch(body, four, add, b, np.int32(1))
        launch(body, single, count_down, loop, ctl)
        body.end_building()
        choice = gb.create_condition()
        launch(gb, single, pick, choice, ctl + 4)
        then_branch, else_branch = gb.if_else(choice)
        for branch, amount in ((then_branch, 10), (else_branch, 1000)):
            branch.begin_building()
            launch(branch, four, add, c, np.int32(amount))
            branch.end_building()
        child = dev.create_stream().create_graph_builder().begin_building()
        launch(child, four, add, c, np.int32(value))
        child.end_building()
        gb.embed(child)
        gb.callback(lambda: seen.append(f"host callback {value}"))
        return gb.end_building()

    def run(graph, counter: int, flag: int) -> list[int]:
        host[:] = 0
        host[12], host[13] = counter, flag
        words.copy_from(view, stream=stream)
        graph.launch(stream)
        words.copy_to(view, stream=stream)
        stream.sync()
        return host.tolist()

    graph = build(100).complete()
    print("first launch", run(graph, 3, 1))
    graph.update(build(7))
    print("after update", run(graph, 5, 0))
    print("host callbacks", seen)
    graph.close()

    # The same kind of work as an explicit graph (GraphDefinition): node by node, with a copy node, an
    # event recorded and waited for, a Python callback, an if node on a default condition, a child graph.
    from cuda.core.graph import GraphDefinition

    definition = GraphDefinition()
    first = definition.launch(four, add, a, np.int32(2))
    copied = first.memcpy(b, a, 16)  # b[:4] = a[:4]
    event = dev.create_event()
    waited = copied.record(event).wait(event)
    later = waited.launch(four, add, c, np.int32(3))
    later.callback(lambda: seen.append("definition callback"))
    branch = later.if_then(definition.create_condition(default_value=1))
    branch.launch(four, add, c, np.int32(40))
    sub = GraphDefinition()
    sub.launch(four, add, a, np.int32(500))
    later.embed(sub)
    explicit = definition.instantiate()
    for _ in range(2):
        print("explicit graph", run(explicit, 0, 0)[:12])
    print("host callbacks", seen)
    explicit.close()
    words.close(stream)
    stream.sync()
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
