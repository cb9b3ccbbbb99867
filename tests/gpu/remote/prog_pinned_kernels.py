"""Kernels given the host address of page-locked memory, as cuda.core's own examples do (issue 25's two
illegal-address rows): `graph_update.py` (a captured graph updated with `Graph.update` to a second
pinned target, relaunched; an executable kernel node given new arguments) and `thread_block_cluster.py`
(a launch with a cluster shape, here also reading a neighbour block's value through distributed shared memory), each
writing into LegacyPinnedMemoryResource buffers; then the same pinned memory copied to and from the
device, written by the host between kernels, and moved by a graph's copy nodes.

Runs unchanged on a local GPU or, under gpupool's libcuda.so.1, on a leased one; prints the same.
"""

from __future__ import annotations

import sys

import numpy as np
from _common import loaded_libcuda
from cuda.core import Device, LaunchConfig, LegacyPinnedMemoryResource, Program, ProgramOptions, launch
from cuda.core.graph import GraphDefinition

SOURCE = r"""
extern "C" __global__ void add_one(int *value) {
    if (threadIdx.x == 0 && blockIdx.x == 0) *value += 1;
}

extern "C" __global__ void add(int *a, int v, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] += v;
}

// Cluster primitives in PTX (no headers needed): the block's rank in its cluster, the cluster's size,
// its barrier, and a read of another block's shared memory (distributed shared memory).
__device__ unsigned cluster_rank() { unsigned r; asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)); return r; }
__device__ unsigned cluster_blocks() { unsigned r; asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r)); return r; }
__device__ void cluster_sync() { asm volatile("barrier.cluster.arrive;\n\tbarrier.cluster.wait;" ::: "memory"); }
__device__ unsigned read_shared_of(unsigned *mine, unsigned rank) {
    unsigned long long local;
    unsigned remote, value;
    asm volatile("cvta.to.shared.u64 %0, %1;" : "=l"(local) : "l"(mine));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"((unsigned)local), "r"(rank));
    asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(value) : "r"(remote) : "memory");
    return value;
}

// Each block of a cluster writes its rank into its shared memory; after the cluster's barrier every
// block reads its neighbour's and records it with the cluster's shape.
extern "C" __global__ void neighbours(unsigned *out) {
    __shared__ unsigned mine;
    unsigned rank = cluster_rank(), blocks = cluster_blocks();
    if (threadIdx.x == 0) mine = rank * 10 + 1;
    cluster_sync();
    if (threadIdx.x == 0) {
        unsigned *row = out + 4 * blockIdx.x;
        row[0] = read_shared_of(&mine, (rank + 1) % blocks);
        row[1] = blocks;
        row[2] = gridDim.x;
        row[3] = rank;
    }
    cluster_sync();
}
"""


def build_increment_graph(dev, kernel, target: int):
    builder = dev.create_graph_builder().begin_building()
    one = LaunchConfig(grid=1, block=1)
    launch(builder, one, kernel, target)
    launch(builder, one, kernel, target)
    return builder.end_building()


def main() -> int:
    dev = Device(0)
    dev.set_current()
    stream = dev.create_stream()
    options = ProgramOptions(std="c++17", arch=f"sm_{dev.arch}")
    module = Program(SOURCE, code_type="c++", options=options).compile("cubin")
    add_one, add, neighbours = (module.get_kernel(k) for k in ("add_one", "add", "neighbours"))
    pinned = LegacyPinnedMemoryResource()

    # graph_update.py: two increments of values[0], then the same executable updated to values[1].
    buffer = pinned.allocate(2 * 4)
    values = np.from_dlpack(buffer).view(np.int32)
    values[:] = 0
    first = build_increment_graph(dev, add_one, values[0:].ctypes.data)
    second = build_increment_graph(dev, add_one, values[1:].ctypes.data)
    graph = first.complete()
    graph.upload(stream)
    graph.launch(stream)
    stream.sync()
    print("graph launched", values.tolist())
    graph.update(second)
    graph.upload(stream)
    graph.launch(stream)
    stream.sync()
    print("graph updated and relaunched", values.tolist())

    # A bigger pinned array: a kernel adds, the host writes, a kernel adds again, copies both ways.
    n = 100_000
    big = pinned.allocate(4 * n)
    words = np.from_dlpack(big).view(np.int32)
    words[:] = np.arange(n, dtype=np.int32)
    blocks = LaunchConfig(grid=(n + 255) // 256, block=256)
    launch(stream, blocks, add, big, np.int32(5), np.uint32(n))
    stream.sync()
    words[1] = 1000  # the host's write between two kernels
    launch(stream, blocks, add, big, np.int32(1), np.uint32(n))
    stream.sync()
    print(
        "pinned array after two kernels",
        words[:3].tolist(),
        int(words[n - 1]),
        int(words.sum(dtype=np.int64)),
    )
    on_device = dev.memory_resource.allocate(4 * n, stream=stream)
    on_device.copy_from(big, stream=stream)
    launch(stream, blocks, add, on_device, np.int32(100), np.uint32(n))
    big.copy_from(on_device, stream=stream)
    stream.sync()
    print("copied through the device", words[:3].tolist(), int(words[n - 1]))

    # A graph's copy nodes to and from pinned memory (the runtime's cudaGraphAddMemcpyNode samples):
    # pinned input to the device, a kernel, back into another pinned buffer; launched twice.
    staged_in, staged_out = pinned.allocate(4 * n), pinned.allocate(4 * n)
    words_in = np.from_dlpack(staged_in).view(np.int32)
    words_out = np.from_dlpack(staged_out).view(np.int32)
    definition = GraphDefinition()
    up = definition.memcpy(on_device, staged_in, 4 * n)
    added = up.launch(blocks, add, on_device, np.int32(7), np.uint32(n))
    added.memcpy(staged_out, on_device, 4 * n)
    copies = definition.instantiate()
    for start in (0, 1000):
        words_in[:] = np.arange(start, start + n, dtype=np.int32)
        copies.launch(stream)
        stream.sync()
        print("graph copy nodes", words_out[:3].tolist(), int(words_out[n - 1]))
    copies.close()

    # thread_block_cluster.py: 4 clusters of 2 blocks each, results in pinned memory.
    if dev.compute_capability.major >= 9:
        out = pinned.allocate(4 * 4 * 8)
        seen = np.from_dlpack(out).view(np.uint32)
        seen[:] = 0
        launch(stream, LaunchConfig(grid=4, cluster=2, block=32), neighbours, out)
        stream.sync()
        print("cluster neighbours", seen.reshape(8, 4).tolist())
        out.close()
    else:
        print("cluster neighbours: needs compute capability 9.0")

    on_device.close(stream)
    graph.close()
    first.close()
    second.close()
    big.close()
    staged_in.close()
    staged_out.close()
    buffer.close()
    stream.sync()
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
