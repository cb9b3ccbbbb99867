/* gpupool's libcuda.so.1, hand-written calls: graphs built node by node, user objects and stream
 * capture. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim_calls.h"

/* ---- graphs built node by node: the nodes are the worker's; parameters packed as a launch's -------- */

#define MAX_NODE_DEPS 4096

/* A node's context field: the current context (or none, which means it) is what every forwarded call
 * runs in; another context is not translated, so the node is refused rather than run in the wrong one. */
static CUresult node_context(const char *call, uint64_t ctx) {
    static int said;
    if (!ctx || ctx == gp_ctx_current()) return CUDA_SUCCESS;
    if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
        gp_say("%s: a node for a context other than the current one is not forwarded to the remote GPU; it "
               "returns CUDA_ERROR_NOT_SUPPORTED (make that context current first)",
               call);
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* CUDA_KERNEL_NODE_PARAMS_v2: func at 0, grid and block dimensions at 8..31, shared memory at 32,
 * kernelParams at 40, extra at 48, kern at 56, ctx at 64. */
static CUresult kernel_node(uint32_t call, const void *head, uint32_t head_len, const void *deps, uint64_t num_deps,
                            const void *params, uint64_t *node) {
    if (!params || (num_deps && !deps) || num_deps > MAX_NODE_DEPS) return CUDA_ERROR_INVALID_VALUE;
    const unsigned char *p = params;
    uint64_t func, kern, ctx;
    void **kernel_params, **extra;
    memcpy(&func, p, 8);
    memcpy(&kernel_params, p + 40, 8);
    memcpy(&extra, p + 48, 8);
    memcpy(&kern, p + 56, 8);
    memcpy(&ctx, p + 64, 8);
    uint64_t f = func ? func : kern;
    struct layout l;
    CUresult r = node_context("a kernel node", ctx);
    if (r == CUDA_SUCCESS) r = layout_of(f, &l);
    if (r != CUDA_SUCCESS) return r;
    size_t cap = l.total > 4096 ? l.total : 4096;
    if (extra && !kernel_params) cap = 1 << 16;
    unsigned char *buf = malloc(cap);
    if (!buf) return CUDA_ERROR_OUT_OF_MEMORY;
    int64_t len = pack_params(&l, kernel_params, extra, buf, cap);
    r = len < 0 ? CUDA_ERROR_INVALID_VALUE : params_reach(buf, len);
    if (r != CUDA_SUCCESS) {
        free(buf);
        return r;
    }
    unsigned char in[sizeof(struct gp_in_cuGraphAddKernelNode_v2)];
    memcpy(in, head, head_len); /* the graph or exec and node handles */
    size_t at = head_len;
    memcpy(in + at, &f, 8), at += 8;
    memcpy(in + at, p + 8, 7 * 4), at += 7 * 4; /* grid, block, shared memory */
    if (call == GP_CALL_cuGraphAddKernelNode_v2) memcpy(in + at, &num_deps, 8), at += 8;
    struct gp_out_cuGraphAddKernelNode_v2 out;
    r = gp_call2(call, WANT, in, (uint32_t)at, deps, num_deps * 8, buf, (uint64_t)len, node ? &out : NULL,
                 node ? sizeof out : 0, NULL, 0);
    free(buf);
    if (r == CUDA_SUCCESS && node) *node = out.node;
    return r;
}

CUresult cuGraphAddKernelNode_v2(uint64_t *node, uint64_t graph, void *deps, uint64_t num_deps, void *params) {
    GP_TRACE("cuGraphAddKernelNode_v2");
    if (!node) return CUDA_ERROR_INVALID_VALUE;
    return kernel_node(GP_CALL_cuGraphAddKernelNode_v2, &graph, 8, deps, num_deps, params, node);
}

CUresult cuGraphExecKernelNodeSetParams_v2(uint64_t exec, uint64_t node, void *params) {
    GP_TRACE("cuGraphExecKernelNodeSetParams_v2");
    uint64_t head[2] = {exec, node};
    return kernel_node(GP_CALL_cuGraphExecKernelNodeSetParams_v2, head, sizeof head, NULL, 0, params, NULL);
}

/* A kernel node read back: its parameters live here, one block per node (an array of pointers to each
 * argument's bytes, then the bytes), as the driver keeps them for the node: valid until the next read of
 * the same node, which refills the block in place where it fits. */
struct kernel_args {
    uint64_t node;
    size_t cap;
    unsigned char *block;
    struct kernel_args *next;
};
static struct kernel_args *kernel_args;
static pthread_mutex_t kernel_args_lock = PTHREAD_MUTEX_INITIALIZER;

#define MAX_PARAM_BYTES (1 << 16)

/* The block for `node`, at least `need` bytes (NULL when out of memory); under kernel_args_lock. */
static unsigned char *kernel_args_block(uint64_t node, size_t need) {
    struct kernel_args *k = kernel_args;
    while (k && k->node != node) k = k->next;
    if (!k) {
        if (!(k = calloc(1, sizeof *k))) return NULL;
        k->node = node, k->next = kernel_args, kernel_args = k;
    }
    if (k->cap < need) {
        unsigned char *grown = malloc(need);
        if (!grown) return NULL;
        free(k->block), k->block = grown, k->cap = need;
    }
    return k->block;
}

CUresult cuGraphKernelNodeGetParams_v2(uint64_t node, void *params) {
    GP_TRACE("cuGraphKernelNodeGetParams_v2");
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    unsigned char *packed = malloc(MAX_PARAM_BYTES);
    if (!packed) return CUDA_ERROR_OUT_OF_MEMORY;
    struct gp_in_cuGraphKernelNodeGetParams_v2 in = {.node = node};
    struct gp_out_cuGraphKernelNodeGetParams_v2 out;
    struct layout l;
    CUresult r = gp_call(GP_CALL_cuGraphKernelNodeGetParams_v2, WANT, &in, sizeof in, NULL, 0, &out, sizeof out,
                         packed, MAX_PARAM_BYTES);
    if (r == CUDA_SUCCESS) r = layout_of(out.func, &l);
    if (r == CUDA_SUCCESS && l.total > MAX_PARAM_BYTES) r = CUDA_ERROR_INVALID_VALUE;
    if (r != CUDA_SUCCESS) {
        free(packed);
        return r;
    }
    pthread_mutex_lock(&kernel_args_lock);
    unsigned char *block = kernel_args_block(node, 8 * (size_t)l.count + l.total + 1);
    if (block) {
        void **pointers = (void **)block;
        unsigned char *bytes = block + 8 * (size_t)l.count;
        memcpy(bytes, packed, l.total);
        for (uint32_t i = 0; i < l.count; i++) pointers[i] = bytes + l.offset_size[2 * i];
    }
    pthread_mutex_unlock(&kernel_args_lock);
    free(packed);
    if (!block) return CUDA_ERROR_OUT_OF_MEMORY;
    /* CUDA_KERNEL_NODE_PARAMS_v2: the function, dimensions, shared memory, kernelParams; no extra, no
     * kern (a node made from a CUkernel reads back as the kernel's function), the current context. */
    unsigned char *p = params;
    uint64_t ctx = gp_ctx_current();
    memset(p, 0, 72);
    memcpy(p, &out.func, 8), memcpy(p + 8, &out.gx, 7 * 4);
    memcpy(p + 40, &block, 8), memcpy(p + 64, &ctx, 8);
    return CUDA_SUCCESS;
}

/* A graph's kernel node set anew: packed and checked as a new kernel node is. */
CUresult cuGraphKernelNodeSetParams_v2(uint64_t node, void *params) {
    GP_TRACE("cuGraphKernelNodeSetParams_v2");
    return kernel_node(GP_CALL_cuGraphKernelNodeSetParams_v2, &node, 8, NULL, 0, params, NULL);
}

/* A kernel node's launch attribute: its 64-byte CUkernelNodeAttrValue each way (checked on the worker as a
 * stream attribute's). */
#define NODE_ATTR_BYTES 64

CUresult cuGraphKernelNodeGetAttribute(uint64_t node, int32_t attr, void *value) {
    GP_TRACE("cuGraphKernelNodeGetAttribute");
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuGraphKernelNodeGetAttribute in = {.node = node, .attr = attr};
    return gp_call(GP_CALL_cuGraphKernelNodeGetAttribute, WANT, &in, sizeof in, NULL, 0, NULL, 0, value,
                   NODE_ATTR_BYTES);
}

CUresult cuGraphKernelNodeSetAttribute(uint64_t node, int32_t attr, void *value) {
    GP_TRACE("cuGraphKernelNodeSetAttribute");
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuGraphKernelNodeSetAttribute in = {.node = node, .attr = attr};
    return gp_call(GP_CALL_cuGraphKernelNodeSetAttribute, WANT, &in, sizeof in, value, NODE_ATTR_BYTES, NULL, 0,
                   NULL, 0);
}

/* CUDA_MEMSET_NODE_PARAMS: dst, pitch, value, elementSize, width, height (40 bytes), into a request. */
#define MEMSET_NODE_PARAMS(in, params)                                                                    \
    do {                                                                                                  \
        const unsigned char *p_ = (params);                                                               \
        memcpy(&(in).dst, p_, 8), memcpy(&(in).pitch, p_ + 8, 8), memcpy(&(in).value, p_ + 16, 4);        \
        memcpy(&(in).element_size, p_ + 20, 4), memcpy(&(in).width, p_ + 24, 8);                          \
        memcpy(&(in).height, p_ + 32, 8);                                                                 \
    } while (0)

CUresult cuGraphAddMemsetNode(uint64_t *node, uint64_t graph, void *deps, uint64_t num_deps, void *params,
                              uint64_t ctx) {
    GP_TRACE("cuGraphAddMemsetNode");
    if (!node || !params || (num_deps && !deps) || num_deps > MAX_NODE_DEPS) return CUDA_ERROR_INVALID_VALUE;
    if (node_context("cuGraphAddMemsetNode", ctx) != CUDA_SUCCESS) return CUDA_ERROR_NOT_SUPPORTED;
    struct gp_in_cuGraphAddMemsetNode in = {.graph = graph, .num_deps = num_deps};
    MEMSET_NODE_PARAMS(in, params);
    struct gp_out_cuGraphAddMemsetNode out;
    CUresult r = gp_call(GP_CALL_cuGraphAddMemsetNode, WANT, &in, sizeof in, deps, num_deps * 8, &out, sizeof out,
                         NULL, 0);
    if (r == CUDA_SUCCESS) *node = out.node;
    return r;
}

/* An instantiated graph's memset node set anew: checked on the worker as a new memset node is. */
CUresult cuGraphExecMemsetNodeSetParams(uint64_t exec, uint64_t node, void *params, uint64_t ctx) {
    GP_TRACE("cuGraphExecMemsetNodeSetParams");
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    if (node_context("cuGraphExecMemsetNodeSetParams", ctx) != CUDA_SUCCESS) return CUDA_ERROR_NOT_SUPPORTED;
    struct gp_in_cuGraphExecMemsetNodeSetParams in = {.exec = exec, .node = node};
    MEMSET_NODE_PARAMS(in, params);
    return gp_call(GP_CALL_cuGraphExecMemsetNodeSetParams, WANT, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
}

/* A graph's memset node set anew (checked as a new one is), or read back: its address is the lease's
 * device memory, as the program gave it. */
CUresult cuGraphMemsetNodeSetParams(uint64_t node, void *params) {
    GP_TRACE("cuGraphMemsetNodeSetParams");
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuGraphMemsetNodeSetParams in = {.node = node};
    MEMSET_NODE_PARAMS(in, params);
    return gp_call(GP_CALL_cuGraphMemsetNodeSetParams, WANT, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
}

CUresult cuGraphMemsetNodeGetParams(uint64_t node, void *params) {
    GP_TRACE("cuGraphMemsetNodeGetParams");
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuGraphMemsetNodeGetParams in = {.node = node};
    struct gp_out_cuGraphMemsetNodeGetParams out;
    CUresult r = gp_call(GP_CALL_cuGraphMemsetNodeGetParams, WANT, &in, sizeof in, NULL, 0, &out, sizeof out,
                         NULL, 0);
    if (r != CUDA_SUCCESS) return r;
    unsigned char *p = params;
    memcpy(p, &out.dst, 8), memcpy(p + 8, &out.pitch, 8), memcpy(p + 16, &out.value, 4);
    memcpy(p + 20, &out.element_size, 4), memcpy(p + 24, &out.width, 8), memcpy(p + 32, &out.height, 8);
    return CUDA_SUCCESS;
}

CUresult cuGraphAddEmptyNode(uint64_t *node, uint64_t graph, void *deps, uint64_t num_deps) {
    GP_TRACE("cuGraphAddEmptyNode");
    if (!node || (num_deps && !deps) || num_deps > MAX_NODE_DEPS) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuGraphAddEmptyNode in = {.graph = graph, .num_deps = num_deps};
    struct gp_out_cuGraphAddEmptyNode out;
    CUresult r = gp_call(GP_CALL_cuGraphAddEmptyNode, WANT, &in, sizeof in, deps, num_deps * 8, &out, sizeof out,
                         NULL, 0);
    if (r == CUDA_SUCCESS) *node = out.node;
    return r;
}

/* Edge data (CUgraphEdgeData, 8 bytes each: from port, to port, type; the rest must be zero) other than
 * the default: programmatic dependencies between kernel nodes, which XLA's command buffers ask for. */
static int default_edges(const void *edge_data, uint64_t count) {
    static const unsigned char none[8];
    for (uint64_t i = 0; edge_data && i < count; i++)
        if (memcmp((const unsigned char *)edge_data + 8 * i, none, 8) != 0) return 0;
    return 1;
}

/* Where edges with data are not forwarded (a stream capture's dependencies): said once, never silently. */
static CUresult edges_refused(const char *where) {
    static int said;
    if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
        gp_say("%s: graph edges with data (programmatic dependencies) are not forwarded to the remote GPU there; "
               "the call returns CUDA_ERROR_NOT_SUPPORTED",
               where);
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* Edges travel as `count` (from, to) pairs, and through cuGraphAddDependencies_v2 each with its 8 bytes of
 * edge data (zero for the default edge); the worker's driver checks what a port or type allows. */
static CUresult add_dependencies(uint32_t call, uint64_t graph, const uint64_t *from, const uint64_t *to,
                                 const void *edge_data, uint64_t count) {
    if (count && (!from || !to)) return CUDA_ERROR_INVALID_VALUE;
    if (count > MAX_NODE_DEPS) return CUDA_ERROR_INVALID_VALUE;
    int with_data = call == GP_CALL_cuGraphAddDependencies_v2 || call == GP_CALL_cuGraphRemoveDependencies_v2;
    uint64_t words = with_data ? 3 : 2;
    uint64_t *edges = calloc(words * (count ? count : 1), 8);
    if (!edges) return CUDA_ERROR_OUT_OF_MEMORY;
    for (uint64_t i = 0; i < count; i++) {
        edges[words * i] = from[i], edges[words * i + 1] = to[i];
        if (with_data && edge_data) memcpy(&edges[words * i + 2], (const unsigned char *)edge_data + 8 * i, 8);
    }
    struct gp_in_cuGraphAddDependencies in = {.graph = graph, .count = count};
    CUresult r = gp_call(call, WANT, &in, sizeof in, edges, 8 * words * count, NULL, 0, NULL, 0);
    free(edges);
    return r;
}

CUresult cuGraphAddDependencies(uint64_t graph, void *from, void *to, uint64_t count) {
    GP_TRACE("cuGraphAddDependencies");
    return add_dependencies(GP_CALL_cuGraphAddDependencies, graph, from, to, NULL, count);
}

CUresult cuGraphAddDependencies_v2(uint64_t graph, void *from, void *to, void *edge_data, uint64_t count) {
    GP_TRACE("cuGraphAddDependencies_v2");
    return add_dependencies(GP_CALL_cuGraphAddDependencies_v2, graph, from, to, edge_data, count);
}

/* Edges removed travel as edges added do; the worker's driver refuses an edge the graph does not have. */
CUresult cuGraphRemoveDependencies(uint64_t graph, void *from, void *to, uint64_t count) {
    GP_TRACE("cuGraphRemoveDependencies");
    return add_dependencies(GP_CALL_cuGraphRemoveDependencies, graph, from, to, NULL, count);
}

CUresult cuGraphRemoveDependencies_v2(uint64_t graph, void *from, void *to, void *edge_data, uint64_t count) {
    GP_TRACE("cuGraphRemoveDependencies_v2");
    return add_dependencies(GP_CALL_cuGraphRemoveDependencies_v2, graph, from, to, edge_data, count);
}

CUresult cuGraphAddChildGraphNode(uint64_t *node, uint64_t graph, void *deps, uint64_t num_deps, uint64_t child) {
    GP_TRACE("cuGraphAddChildGraphNode");
    if (!node || (num_deps && !deps) || num_deps > MAX_NODE_DEPS) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuGraphAddChildGraphNode in = {.graph = graph, .child = child, .num_deps = num_deps};
    struct gp_out_cuGraphAddChildGraphNode out;
    CUresult r = gp_call(GP_CALL_cuGraphAddChildGraphNode, WANT, &in, sizeof in, deps, num_deps * 8, &out,
                         sizeof out, NULL, 0);
    if (r == CUDA_SUCCESS) *node = out.node;
    return r;
}

static CUresult event_node(uint32_t call, uint64_t *node, uint64_t graph, const void *deps, uint64_t num_deps,
                           uint64_t event) {
    if (!node || (num_deps && !deps) || num_deps > MAX_NODE_DEPS) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuGraphAddEventRecordNode in = {.graph = graph, .event = event, .num_deps = num_deps};
    struct gp_out_cuGraphAddEventRecordNode out;
    CUresult r = gp_call(call, WANT, &in, sizeof in, deps, num_deps * 8, &out, sizeof out, NULL, 0);
    if (r == CUDA_SUCCESS) *node = out.node;
    return r;
}

CUresult cuGraphAddEventRecordNode(uint64_t *node, uint64_t graph, void *deps, uint64_t num_deps, uint64_t event) {
    GP_TRACE("cuGraphAddEventRecordNode");
    return event_node(GP_CALL_cuGraphAddEventRecordNode, node, graph, deps, num_deps, event);
}

CUresult cuGraphAddEventWaitNode(uint64_t *node, uint64_t graph, void *deps, uint64_t num_deps, uint64_t event) {
    GP_TRACE("cuGraphAddEventWaitNode");
    return event_node(GP_CALL_cuGraphAddEventWaitNode, node, graph, deps, num_deps, event);
}

/* ---- memory nodes: graph memory the driver places when the node is added ---------------------------- */

/* CUDA_MEM_ALLOC_NODE_PARAMS: CUmemPoolProps (allocation type, handle types, location type and id, ...;
 * 88 bytes), then the access descriptors' pointer and count, the size, and the address (an out). */
#define POOL_PROPS_BYTES 88
#define ALLOC_ACCESS_AT 88
#define ALLOC_ACCESS_COUNT_AT 96
#define ALLOC_SIZE_AT 104
#define ALLOC_ADDRESS_AT 112
#define ACCESS_DESC_BYTES 12 /* CUmemAccessDesc: location type, location id, flags */
#define MAX_ACCESS_DESCS 64

/* The memory is the lease's from here: its address is reserved in this process as an allocation's is.
 * One that is host memory here is given back (a free node, then both nodes destroyed, so the worker stops
 * counting it) and the node refused. */
CUresult cuGraphAddMemAllocNode(uint64_t *node, uint64_t graph, void *deps, uint64_t num_deps, void *params) {
    GP_TRACE("cuGraphAddMemAllocNode");
    if (!node || !params || (num_deps && !deps) || num_deps > MAX_NODE_DEPS) return CUDA_ERROR_INVALID_VALUE;
    unsigned char *p = params;
    struct gp_in_cuGraphAddMemAllocNode in = {.graph = graph, .num_deps = num_deps};
    uint64_t count;
    const void *access;
    memcpy(&in.alloc_type, p, 4), memcpy(&in.handle_types, p + 4, 4);
    memcpy(&in.location_type, p + 8, 4), memcpy(&in.device, p + 12, 4);
    memcpy(&access, p + ALLOC_ACCESS_AT, 8), memcpy(&count, p + ALLOC_ACCESS_COUNT_AT, 8);
    memcpy(&in.bytesize, p + ALLOC_SIZE_AT, 8);
    if (count > MAX_ACCESS_DESCS || (count && !access)) return CUDA_ERROR_INVALID_VALUE;
    in.num_access = (uint32_t)count;
    struct gp_out_cuGraphAddMemAllocNode out;
    CUresult r = gp_call2(GP_CALL_cuGraphAddMemAllocNode, WANT, &in, sizeof in, deps, num_deps * 8, access,
                          count * ACCESS_DESC_BYTES, &out, sizeof out, NULL, 0);
    if (r != CUDA_SUCCESS) return r;
    if (gp_dev_add(out.dptr, in.bytesize, 1) != 0) {
        gp_say("cuGraphAddMemAllocNode: the driver placed the node's memory at 0x%llx, which is host memory in "
               "this process; it returns CUDA_ERROR_OUT_OF_MEMORY", (unsigned long long)out.dptr);
        uint64_t freeing = 0;
        if (cuGraphAddMemFreeNode(&freeing, graph, &out.node, 1, out.dptr) == CUDA_SUCCESS)
            cuGraphDestroyNode(freeing);
        cuGraphDestroyNode(out.node);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    memcpy(p + ALLOC_ADDRESS_AT, &out.dptr, 8);
    *node = out.node;
    return CUDA_SUCCESS;
}

/* The access descriptors read back live in a block of the node's, as a kernel node's arguments do. */
CUresult cuGraphMemAllocNodeGetParams(uint64_t node, void *params) {
    GP_TRACE("cuGraphMemAllocNodeGetParams");
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    unsigned char descs[MAX_ACCESS_DESCS * ACCESS_DESC_BYTES];
    struct gp_in_cuGraphMemAllocNodeGetParams in = {.node = node};
    struct gp_out_cuGraphMemAllocNodeGetParams out;
    CUresult r = gp_call(GP_CALL_cuGraphMemAllocNodeGetParams, WANT, &in, sizeof in, NULL, 0, &out, sizeof out,
                         descs, sizeof descs);
    if (r != CUDA_SUCCESS) return r;
    if (out.num_access > MAX_ACCESS_DESCS) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&kernel_args_lock);
    unsigned char *block = kernel_args_block(node, (size_t)out.num_access * ACCESS_DESC_BYTES + 1);
    if (block) memcpy(block, descs, (size_t)out.num_access * ACCESS_DESC_BYTES);
    pthread_mutex_unlock(&kernel_args_lock);
    if (!block) return CUDA_ERROR_OUT_OF_MEMORY;
    unsigned char *p = params;
    int32_t pinned = 1, on_device = 1;
    uint64_t count = out.num_access;
    memset(p, 0, ALLOC_ADDRESS_AT + 8);
    memcpy(p, &pinned, 4), memcpy(p + 8, &on_device, 4), memcpy(p + 12, &out.device, 4);
    memcpy(p + ALLOC_ACCESS_AT, &block, 8), memcpy(p + ALLOC_ACCESS_COUNT_AT, &count, 8);
    memcpy(p + ALLOC_SIZE_AT, &out.bytesize, 8), memcpy(p + ALLOC_ADDRESS_AT, &out.dptr, 8);
    return CUDA_SUCCESS;
}

/* A free node: the memory is no longer this process's to touch outside the graph. */
CUresult cuGraphAddMemFreeNode(uint64_t *node, uint64_t graph, void *deps, uint64_t num_deps, uint64_t dptr) {
    GP_TRACE("cuGraphAddMemFreeNode");
    if (!node || (num_deps && !deps) || num_deps > MAX_NODE_DEPS) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuGraphAddMemFreeNode in = {.graph = graph, .dptr = dptr, .num_deps = num_deps};
    struct gp_out_cuGraphAddMemFreeNode out;
    CUresult r = gp_call(GP_CALL_cuGraphAddMemFreeNode, WANT, &in, sizeof in, deps, num_deps * 8, &out, sizeof out,
                         NULL, 0);
    if (r != CUDA_SUCCESS) return r;
    gp_dev_remove(dptr);
    *node = out.node;
    return CUDA_SUCCESS;
}

/* The value is a cuuint64_t (only a high-water mark may be set, to 0: the worker's driver says). */
CUresult cuDeviceSetGraphMemAttribute(int32_t dev, int32_t attr, void *value) {
    GP_TRACE("cuDeviceSetGraphMemAttribute");
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuDeviceSetGraphMemAttribute in = {.dev = dev, .attr = attr};
    memcpy(&in.value, value, 8);
    return gp_call(GP_CALL_cuDeviceSetGraphMemAttribute, WANT, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
}

/* ---- batch memory-operation nodes ---------------------------------------------------------------- */

/* CUDA_BATCH_MEM_OP_NODE_PARAMS: the context, the count, the operations' array, the flags; the operations
 * are checked here as a stream's batch is, and each wait's or write's word on the worker. */
static CUresult batch_node_params(const char *name, const void *params, uint32_t *count, const void **ops,
                                  uint32_t *flags) {
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    const unsigned char *p = params;
    uint64_t ctx;
    memcpy(&ctx, p, 8), memcpy(count, p + 8, 4), memcpy(ops, p + 16, 8), memcpy(flags, p + 24, 4);
    if (node_context(name, ctx) != CUDA_SUCCESS) return CUDA_ERROR_NOT_SUPPORTED;
    return mem_ops_check(GP_CALL_cuGraphAddBatchMemOpNode, *ops, *count);
}

CUresult cuGraphAddBatchMemOpNode(uint64_t *node, uint64_t graph, void *deps, uint64_t num_deps, void *params) {
    GP_TRACE("cuGraphAddBatchMemOpNode");
    if (!node || (num_deps && !deps) || num_deps > MAX_NODE_DEPS) return CUDA_ERROR_INVALID_VALUE;
    uint32_t count, flags;
    const void *ops;
    CUresult r = batch_node_params("cuGraphAddBatchMemOpNode", params, &count, &ops, &flags);
    if (r != CUDA_SUCCESS) return r;
    struct gp_in_cuGraphAddBatchMemOpNode in = {.graph = graph, .num_deps = num_deps, .count = count, .flags = flags};
    struct gp_out_cuGraphAddBatchMemOpNode out;
    r = gp_call2(GP_CALL_cuGraphAddBatchMemOpNode, WANT, &in, sizeof in, deps, num_deps * 8, ops,
                 (uint64_t)in.count * MEM_OP_BYTES, &out, sizeof out, NULL, 0);
    if (r == CUDA_SUCCESS) *node = out.node;
    return r;
}

CUresult cuGraphBatchMemOpNodeSetParams(uint64_t node, void *params) {
    GP_TRACE("cuGraphBatchMemOpNodeSetParams");
    uint32_t count, flags;
    const void *ops;
    CUresult r = batch_node_params("cuGraphBatchMemOpNodeSetParams", params, &count, &ops, &flags);
    if (r != CUDA_SUCCESS) return r;
    struct gp_in_cuGraphBatchMemOpNodeSetParams in = {.node = node, .count = count, .flags = flags};
    return gp_call(GP_CALL_cuGraphBatchMemOpNodeSetParams, WANT, &in, sizeof in, ops,
                   (uint64_t)in.count * MEM_OP_BYTES, NULL, 0, NULL, 0);
}

CUresult cuGraphExecBatchMemOpNodeSetParams(uint64_t exec, uint64_t node, void *params) {
    GP_TRACE("cuGraphExecBatchMemOpNodeSetParams");
    uint32_t count, flags;
    const void *ops;
    CUresult r = batch_node_params("cuGraphExecBatchMemOpNodeSetParams", params, &count, &ops, &flags);
    if (r != CUDA_SUCCESS) return r;
    struct gp_in_cuGraphExecBatchMemOpNodeSetParams in = {.exec = exec, .node = node, .count = count, .flags = flags};
    return gp_call(GP_CALL_cuGraphExecBatchMemOpNodeSetParams, WANT, &in, sizeof in, ops,
                   (uint64_t)in.count * MEM_OP_BYTES, NULL, 0, NULL, 0);
}

/* Read back: the operations live in a block of the node's, as a kernel node's arguments do. */
CUresult cuGraphBatchMemOpNodeGetParams(uint64_t node, void *params) {
    GP_TRACE("cuGraphBatchMemOpNodeGetParams");
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    unsigned char *ops = malloc(MEM_OPS_MAX * MEM_OP_BYTES);
    if (!ops) return CUDA_ERROR_OUT_OF_MEMORY;
    struct gp_in_cuGraphBatchMemOpNodeGetParams in = {.node = node};
    struct gp_out_cuGraphBatchMemOpNodeGetParams out;
    CUresult r = gp_call(GP_CALL_cuGraphBatchMemOpNodeGetParams, WANT, &in, sizeof in, NULL, 0, &out, sizeof out, ops,
                         MEM_OPS_MAX * MEM_OP_BYTES);
    if (r == CUDA_SUCCESS && out.count > MEM_OPS_MAX) r = CUDA_ERROR_INVALID_VALUE;
    unsigned char *block = NULL;
    if (r == CUDA_SUCCESS) {
        pthread_mutex_lock(&kernel_args_lock);
        block = kernel_args_block(node, (size_t)out.count * MEM_OP_BYTES + 1);
        if (block) memcpy(block, ops, (size_t)out.count * MEM_OP_BYTES);
        pthread_mutex_unlock(&kernel_args_lock);
        if (!block) r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    free(ops);
    if (r != CUDA_SUCCESS) return r;
    unsigned char *p = params;
    uint64_t ctx = gp_ctx_current();
    memset(p, 0, 32);
    memcpy(p, &ctx, 8), memcpy(p + 8, &out.count, 4), memcpy(p + 16, &block, 8), memcpy(p + 24, &out.flags, 4);
    return CUDA_SUCCESS;
}

/* CUDA_HOST_NODE_PARAMS: the function and its argument, kept here (shim.c) and run at every launch. */
CUresult cuGraphAddHostNode(uint64_t *node, uint64_t graph, void *deps, uint64_t num_deps, void *params) {
    GP_TRACE("cuGraphAddHostNode");
    if (!node || !params || (num_deps && !deps) || num_deps > MAX_NODE_DEPS) return CUDA_ERROR_INVALID_VALUE;
    void *fn, *data;
    memcpy(&fn, params, 8);
    memcpy(&data, (unsigned char *)params + 8, 8);
    if (!fn) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = gp_callbacks_start();
    if (r != CUDA_SUCCESS) return r;
    uint64_t id = gp_host_call_add(0, fn, data, 0, 1);
    if (!id) return CUDA_ERROR_OUT_OF_MEMORY;
    struct gp_in_cuGraphAddHostNode in = {.graph = graph, .id = id, .num_deps = num_deps};
    struct gp_out_cuGraphAddHostNode out;
    r = gp_call(GP_CALL_cuGraphAddHostNode, WANT, &in, sizeof in, deps, num_deps * 8, &out, sizeof out, NULL, 0);
    if (r != CUDA_SUCCESS) gp_host_call_drop(id);
    else *node = out.node;
    return r;
}

/* A host node's function anew (CUDA_HOST_NODE_PARAMS): kept here under a new id, as cuGraphAddHostNode's;
 * the old one stays for the graphs instantiated before. `head`: the node, or the exec and the node. */
static CUresult host_node_set(uint32_t call, const uint64_t *head, uint32_t head_words, const void *params) {
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    void *fn, *data;
    memcpy(&fn, params, 8);
    memcpy(&data, (const unsigned char *)params + 8, 8);
    if (!fn) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = gp_callbacks_start();
    if (r != CUDA_SUCCESS) return r;
    uint64_t in[3];
    memcpy(in, head, 8 * head_words);
    in[head_words] = gp_host_call_add(0, fn, data, 0, 1);
    if (!in[head_words]) return CUDA_ERROR_OUT_OF_MEMORY;
    r = gp_call(call, WANT, in, 8 * (head_words + 1), NULL, 0, NULL, 0, NULL, 0);
    if (r != CUDA_SUCCESS) gp_host_call_drop(in[head_words]);
    return r;
}

CUresult cuGraphHostNodeSetParams(uint64_t node, void *params) {
    GP_TRACE("cuGraphHostNodeSetParams");
    return host_node_set(GP_CALL_cuGraphHostNodeSetParams, &node, 1, params);
}

CUresult cuGraphExecHostNodeSetParams(uint64_t exec, uint64_t node, void *params) {
    GP_TRACE("cuGraphExecHostNodeSetParams");
    uint64_t head[2] = {exec, node};
    return host_node_set(GP_CALL_cuGraphExecHostNodeSetParams, head, 2, params);
}

/* A host node's function and argument read back: the worker answers the id this shim keeps them under. */
CUresult cuGraphHostNodeGetParams(uint64_t node, void *params) {
    GP_TRACE("cuGraphHostNodeGetParams");
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuGraphHostNodeGetParams in = {.node = node};
    struct gp_out_cuGraphHostNodeGetParams out;
    CUresult r = gp_call(GP_CALL_cuGraphHostNodeGetParams, WANT, &in, sizeof in, NULL, 0, &out, sizeof out, NULL, 0);
    if (r != CUDA_SUCCESS) return r;
    void *fn, *data;
    if (!gp_host_call_find(out.id, &fn, &data)) return CUDA_ERROR_INVALID_VALUE;
    memcpy(params, &fn, 8);
    memcpy((unsigned char *)params + 8, &data, 8);
    return CUDA_SUCCESS;
}

/* One side of a CUDA_MEMCPY3D as a device address of the lease: device or unified memory, or mirrored
 * host memory (its device copy). Page-locked memory is mirrored now if it is not yet, as its device
 * pointer would be (pinned memory at its own address, registered memory by a device allocation): the
 * node copies to or from the mirror's device side when the graph runs, and the host sees those bytes
 * after the synchronisation, as for a kernel. 0 for what the worker cannot reach (pageable memory,
 * arrays). */
static uint64_t copy_side(const unsigned char *p, uint64_t *pitch, uint64_t *height) {
    uint64_t x, y, z, host, device;
    uint32_t type;
    memcpy(&x, p, 8), memcpy(&y, p + 8, 8), memcpy(&z, p + 16, 8);
    memcpy(&type, p + 32, 4), memcpy(&host, p + 40, 8), memcpy(&device, p + 48, 8);
    memcpy(pitch, p + 72, 8), memcpy(height, p + 80, 8);
    uint64_t at = type == 1 ? host : type == 2 || type == 4 ? device : 0, mirrored;
    if (!at) return 0;
    if (!gp_mirror_device(at, &mirrored) && gp_host_lookup(at, NULL, NULL, NULL))
        cuMemHostGetDevicePointer_v2(&mirrored, (void *)at, 0); /* page-locked: mirrored from now on */
    if (gp_mirror_device(at, &mirrored)) at = mirrored;
    else if (!is_device(at)) return 0;
    return at + (z * *height + y) * *pitch + x;
}

/* CUDA_MEMCPY3D (200 bytes): the source side at 0, the destination side at 88, the extent at 176; each
 * side as its first byte's device address (0: a side that cannot run on the GPU) and its pitches. */
#define MEMCPY_NODE_PARAMS(in, params)                                                                    \
    do {                                                                                                  \
        const unsigned char *p_ = (params);                                                               \
        uint64_t sp_, sh_, dp_, dh_;                                                                      \
        (in).src = copy_side(p_, &sp_, &sh_), (in).dst = copy_side(p_ + 88, &dp_, &dh_);                  \
        (in).src_pitch = sp_, (in).src_height = sh_, (in).dst_pitch = dp_, (in).dst_height = dh_;         \
        memcpy(&(in).width, p_ + 176, 8), memcpy(&(in).height, p_ + 184, 8);                              \
        memcpy(&(in).depth, p_ + 192, 8);                                                                 \
    } while (0)

/* The descriptors the program gave its copy nodes, each with the device-side copy it was sent as (what
 * cuGraphMemcpyNodeGetParams answers; a few hundred bytes per copy node, for the life of the process). */
#define MEMCPY3D_BYTES 200
struct copy_desc {
    uint64_t node;
    unsigned char desc[MEMCPY3D_BYTES];
    struct gp_out_cuGraphMemcpyNodeGetParams sent;
    struct copy_desc *next;
};
static struct copy_desc *copy_descs;
static pthread_mutex_t copy_descs_lock = PTHREAD_MUTEX_INITIALIZER;

static void copy_desc_keep(uint64_t node, const void *params, const struct gp_out_cuGraphMemcpyNodeGetParams *sent) {
    pthread_mutex_lock(&copy_descs_lock);
    struct copy_desc *d = copy_descs;
    while (d && d->node != node) d = d->next;
    if (!d && (d = malloc(sizeof *d)) != NULL) d->node = node, d->next = copy_descs, copy_descs = d;
    if (d) memcpy(d->desc, params, MEMCPY3D_BYTES), d->sent = *sent;
    pthread_mutex_unlock(&copy_descs_lock);
}

/* The request's copy (a node added or set anew) as the worker answers it back. */
#define COPY_DESC_KEEP(node, params, in)                                                                  \
    do {                                                                                                  \
        struct gp_out_cuGraphMemcpyNodeGetParams sent_ = {                                                \
            (in).src, (in).src_pitch, (in).src_height, (in).dst,  (in).dst_pitch,                         \
            (in).dst_height, (in).width, (in).height, (in).depth};                                        \
        copy_desc_keep((node), (params), &sent_);                                                         \
    } while (0)

static int copy_desc_find(uint64_t node, const struct gp_out_cuGraphMemcpyNodeGetParams *answer, void *params) {
    pthread_mutex_lock(&copy_descs_lock);
    struct copy_desc *d = copy_descs;
    while (d && d->node != node) d = d->next;
    int found = d && memcmp(&d->sent, answer, sizeof *answer) == 0;
    if (found) memcpy(params, d->desc, MEMCPY3D_BYTES);
    pthread_mutex_unlock(&copy_descs_lock);
    return found;
}

static CUresult memcpy_node_refused(const char *name) {
    gp_say("%s: a copy node from or to pageable host memory of the program (or a CUDA array) cannot run on "
           "the remote GPU; it returns CUDA_ERROR_NOT_SUPPORTED (page-locked memory can: docs/remote.md)", name);
    return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuGraphAddMemcpyNode(uint64_t *node, uint64_t graph, void *deps, uint64_t num_deps, void *params,
                              uint64_t ctx) {
    GP_TRACE("cuGraphAddMemcpyNode");
    if (!node || !params || (num_deps && !deps) || num_deps > MAX_NODE_DEPS) return CUDA_ERROR_INVALID_VALUE;
    if (node_context("cuGraphAddMemcpyNode", ctx) != CUDA_SUCCESS) return CUDA_ERROR_NOT_SUPPORTED;
    struct gp_in_cuGraphAddMemcpyNode in = {.graph = graph, .num_deps = num_deps};
    MEMCPY_NODE_PARAMS(in, params);
    if (!in.src || !in.dst) return memcpy_node_refused("cuGraphAddMemcpyNode");
    struct gp_out_cuGraphAddMemcpyNode out;
    CUresult r = gp_call(GP_CALL_cuGraphAddMemcpyNode, WANT, &in, sizeof in, deps, num_deps * 8, &out, sizeof out,
                         NULL, 0);
    if (r == CUDA_SUCCESS) {
        *node = out.node;
        COPY_DESC_KEEP(out.node, params, in);
    }
    return r;
}

/* An instantiated graph's copy node set anew: checked on the worker as a new copy node is. */
CUresult cuGraphExecMemcpyNodeSetParams(uint64_t exec, uint64_t node, void *params, uint64_t ctx) {
    GP_TRACE("cuGraphExecMemcpyNodeSetParams");
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    if (node_context("cuGraphExecMemcpyNodeSetParams", ctx) != CUDA_SUCCESS) return CUDA_ERROR_NOT_SUPPORTED;
    struct gp_in_cuGraphExecMemcpyNodeSetParams in = {.exec = exec, .node = node};
    MEMCPY_NODE_PARAMS(in, params);
    if (!in.src || !in.dst) return memcpy_node_refused("cuGraphExecMemcpyNodeSetParams");
    return gp_call(GP_CALL_cuGraphExecMemcpyNodeSetParams, WANT, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
}

/* A graph's copy node set anew: checked on the worker as a new copy node is. */
CUresult cuGraphMemcpyNodeSetParams(uint64_t node, void *params) {
    GP_TRACE("cuGraphMemcpyNodeSetParams");
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuGraphMemcpyNodeSetParams in = {.node = node};
    MEMCPY_NODE_PARAMS(in, params);
    if (!in.src || !in.dst) return memcpy_node_refused("cuGraphMemcpyNodeSetParams");
    CUresult r = gp_call(GP_CALL_cuGraphMemcpyNodeSetParams, WANT, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
    if (r == CUDA_SUCCESS) COPY_DESC_KEEP(node, params, in);
    return r;
}

/* A copy node read back: the program's own descriptor where the worker's device-side answer is still the
 * copy it was sent as (the node was not destroyed and another made under its handle since); else the
 * device-side copy as a descriptor of device memory (a copy captured from a stream, or a clone's twin). */
CUresult cuGraphMemcpyNodeGetParams(uint64_t node, void *params) {
    GP_TRACE("cuGraphMemcpyNodeGetParams");
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuGraphMemcpyNodeGetParams in = {.node = node};
    struct gp_out_cuGraphMemcpyNodeGetParams out;
    CUresult r = gp_call(GP_CALL_cuGraphMemcpyNodeGetParams, WANT, &in, sizeof in, NULL, 0, &out, sizeof out, NULL, 0);
    if (r != CUDA_SUCCESS || copy_desc_find(node, &out, params)) return r;
    unsigned char *p = params;
    const uint32_t device = 2; /* CU_MEMORYTYPE_DEVICE */
    memset(p, 0, MEMCPY3D_BYTES);
    memcpy(p + 32, &device, 4), memcpy(p + 48, &out.src, 8), memcpy(p + 72, &out.src_pitch, 8);
    memcpy(p + 80, &out.src_height, 8);
    memcpy(p + 88 + 32, &device, 4), memcpy(p + 88 + 48, &out.dst, 8), memcpy(p + 88 + 72, &out.dst_pitch, 8);
    memcpy(p + 88 + 80, &out.dst_height, 8);
    memcpy(p + 176, &out.width, 8), memcpy(p + 184, &out.height, 8), memcpy(p + 192, &out.depth, 8);
    return CUDA_SUCCESS;
}

/* A conditional node's body graphs, in an array the program reads through the node parameters'
 * phGraph_out (the driver's own, as long as the process lives; a few bytes per node). */
#define MAX_CONDITIONAL_BODIES 64

static CUresult conditional_node(uint64_t *node, uint64_t graph, const void *deps, uint64_t num_deps,
                                 unsigned char *p) {
    struct gp_in_gpGraphAddConditionalNode in = {.graph = graph, .num_deps = num_deps};
    memcpy(&in.handle, p, 8);
    memcpy(&in.kind, p + 8, 4);
    memcpy(&in.size, p + 12, 4);
    memcpy(&in.ctx, p + 24, 8);
    if (in.size < 1 || in.size > MAX_CONDITIONAL_BODIES) return CUDA_ERROR_INVALID_VALUE;
    uint64_t *bodies = calloc(in.size, 8);
    if (!bodies) return CUDA_ERROR_OUT_OF_MEMORY;
    struct gp_out_gpGraphAddConditionalNode out;
    CUresult r = gp_call(GP_CALL_gpGraphAddConditionalNode, WANT, &in, sizeof in, deps, num_deps * 8, &out,
                         sizeof out, bodies, 8 * (uint64_t)in.size);
    if (r != CUDA_SUCCESS) {
        free(bodies);
        return r;
    }
    *node = out.node;
    memcpy(p + 16, &bodies, 8); /* phGraph_out */
    return CUDA_SUCCESS;
}

/* CUgraphNodeParams: the type at 0, the type's parameters at 16 (each the newest version of the node
 * call's structure, which starts as the older one does). */
enum {
    NODE_KERNEL = 0, NODE_MEMCPY = 1, NODE_MEMSET = 2, NODE_HOST = 3, NODE_GRAPH = 4, NODE_EMPTY = 5, NODE_WAIT_EVENT = 6,
    NODE_EVENT_RECORD = 7, NODE_MEM_ALLOC = 10, NODE_MEM_FREE = 11, NODE_BATCH_MEM_OP = 12, NODE_CONDITIONAL = 13
};

static CUresult add_node_of_type(uint64_t *node, uint64_t graph, void *deps, uint64_t num_deps, void *params);

/* CUDA 13.4's CUgraphNodeParams (cuGraphAddNode_v3, cuGraphNodeSetParams_v2) against the older one, type by
 * type: the same bytes for every type but two, whose structures grew at their end (a host node's sync mode,
 * context and green context after the function and its argument; an event record node's context and green
 * context after the event), and three new types. A grown type is sent as the older ABI only when what it
 * added says what the older one meant (a sync mode is how the worker's driver waits, either runs as a host
 * function does: cuLaunchHostFunc_v2; the context the current one; no green context); anything else, and the
 * new types, are refused with the reason, never run as the older ABI with the new fields dropped. */
enum { NODE_MEMCPY_BATCH = 14, NODE_EXTERNAL_ENGINE = 17, NODE_FABRIC_CPY_BATCH = 18 };

static CUresult refused_as_older(const char *name, uint32_t type, const char *why) {
    gp_say("%s: a node of type %u %s, which the older CUgraphNodeParams the remote GPU is sent cannot say; "
           "it returns CUDA_ERROR_NOT_SUPPORTED (docs/remote.md)", name, type, why);
    return CUDA_ERROR_NOT_SUPPORTED;
}

static CUresult params_13_4_as_older(const char *name, const unsigned char *p) {
    uint32_t type, sync_mode;
    uint64_t ctx, green;
    memcpy(&type, p, 4);
    switch (type) {
    case NODE_HOST: /* CUDA_HOST_NODE_PARAMS_v2: fn, userData, syncMode at 16, ctx at 24, gCtx at 32 */
        memcpy(&sync_mode, p + 16 + 16, 4), memcpy(&ctx, p + 16 + 24, 8), memcpy(&green, p + 16 + 32, 8);
        if (sync_mode > 1) return CUDA_ERROR_INVALID_VALUE; /* neither BLOCKING nor SPINWAIT */
        break;
    case NODE_EVENT_RECORD: /* CUDA_EVENT_RECORD_NODE_PARAMS: event, ctx at 8, gCtx at 16 */
        memcpy(&ctx, p + 16 + 8, 8), memcpy(&green, p + 16 + 16, 8);
        break;
    case NODE_MEMCPY_BATCH:
        return refused_as_older(name, type, "(a batch of copies) is new in CUDA 13.4");
    case NODE_EXTERNAL_ENGINE: case NODE_FABRIC_CPY_BATCH:
        return refused_as_older(name, type, "(an external engine's work or NVLink-fabric copies) is new");
    default:
        return CUDA_SUCCESS; /* the same layout as the older ABI's */
    }
    if (green) return refused_as_older(name, type, "bound to a green context");
    return node_context(name, ctx);
}

static CUresult add_node(uint64_t *node, uint64_t graph, void *deps, const void *edges, uint64_t num_deps,
                         void *params) {
    if (!node || !params || (num_deps && !deps) || num_deps > MAX_NODE_DEPS) return CUDA_ERROR_INVALID_VALUE;
    if (default_edges(edges, num_deps)) return add_node_of_type(node, graph, deps, num_deps, params);
    /* Edges with data: the node first, then its incoming edges with their data (as the driver does at once);
     * an edge the driver refuses takes the node away again. */
    CUresult r = add_node_of_type(node, graph, NULL, 0, params);
    if (r != CUDA_SUCCESS) return r;
    uint64_t to[MAX_NODE_DEPS];
    for (uint64_t i = 0; i < num_deps; i++) to[i] = *node;
    r = add_dependencies(GP_CALL_cuGraphAddDependencies_v2, graph, deps, to, edges, num_deps);
    if (r != CUDA_SUCCESS) {
        cuGraphDestroyNode(*node);
        *node = 0;
    }
    return r;
}

static CUresult add_node_of_type(uint64_t *node, uint64_t graph, void *deps, uint64_t num_deps, void *params) {
    unsigned char *p = params;
    uint32_t type;
    memcpy(&type, p, 4);
    uint64_t u64;
    switch (type) {
    case NODE_KERNEL:
        return cuGraphAddKernelNode_v2(node, graph, deps, num_deps, p + 16);
    case NODE_MEMSET:
        memcpy(&u64, p + 16 + 40, 8); /* CUDA_MEMSET_NODE_PARAMS_v2's context */
        return cuGraphAddMemsetNode(node, graph, deps, num_deps, p + 16, u64);
    case NODE_GRAPH:
        memcpy(&u64, p + 16, 8);
        uint32_t ownership;
        memcpy(&ownership, p + 24, 4);
        if (ownership != 0) break; /* only CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE */
        return cuGraphAddChildGraphNode(node, graph, deps, num_deps, u64);
    case NODE_EMPTY:
        return cuGraphAddEmptyNode(node, graph, deps, num_deps);
    case NODE_HOST:
        return cuGraphAddHostNode(node, graph, deps, num_deps, p + 16);
    case NODE_MEMCPY: /* CUDA_MEMCPY_NODE_PARAMS: flags, reserved, the context, then CUDA_MEMCPY3D */
        memcpy(&u64, p + 16 + 8, 8);
        return cuGraphAddMemcpyNode(node, graph, deps, num_deps, p + 32, u64);
    case NODE_WAIT_EVENT: case NODE_EVENT_RECORD:
        memcpy(&u64, p + 16, 8);
        return event_node(type == NODE_WAIT_EVENT ? GP_CALL_cuGraphAddEventWaitNode : GP_CALL_cuGraphAddEventRecordNode,
                          node, graph, deps, num_deps, u64);
    case NODE_CONDITIONAL:
        return conditional_node(node, graph, deps, num_deps, p + 16);
    case NODE_MEM_ALLOC: /* CUDA_MEM_ALLOC_NODE_PARAMS_v2: its address written back there */
        return cuGraphAddMemAllocNode(node, graph, deps, num_deps, p + 16);
    case NODE_MEM_FREE:
        memcpy(&u64, p + 16, 8);
        return cuGraphAddMemFreeNode(node, graph, deps, num_deps, u64);
    case NODE_BATCH_MEM_OP:
        return cuGraphAddBatchMemOpNode(node, graph, deps, num_deps, p + 16);
    }
    gp_say("cuGraphAddNode: nodes of type %u are not forwarded to the remote GPU; it returns "
           "CUDA_ERROR_NOT_SUPPORTED (docs/remote.md)", type);
    return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuGraphAddNode(uint64_t *node, uint64_t graph, void *deps, uint64_t num_deps, void *params) {
    GP_TRACE("cuGraphAddNode");
    return add_node(node, graph, deps, NULL, num_deps, params);
}

CUresult cuGraphAddNode_v2(uint64_t *node, uint64_t graph, void *deps, void *edges, uint64_t num_deps, void *params) {
    GP_TRACE("cuGraphAddNode_v2");
    return add_node(node, graph, deps, edges, num_deps, params);
}

CUresult cuGraphAddNode_v3(uint64_t *node, uint64_t graph, void *deps, void *edges, uint64_t num_deps, void *params) {
    GP_TRACE("cuGraphAddNode_v3");
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = params_13_4_as_older("cuGraphAddNode", params);
    return r == CUDA_SUCCESS ? add_node(node, graph, deps, edges, num_deps, params) : r;
}

/* The generic setters (CUgraphNodeParams, as cuGraphAddNode reads it): sent as the typed call of the
 * node type the parameters name, a graph's node (`exec` 0) or an instantiated graph's; the worker checks
 * the node is of that type. */
static CUresult node_set_params(const char *name, uint64_t exec, uint64_t node, void *params) {
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    unsigned char *p = params;
    uint32_t type;
    memcpy(&type, p, 4);
    uint64_t u64;
    switch (type) {
    case NODE_KERNEL:
        return exec ? cuGraphExecKernelNodeSetParams_v2(exec, node, p + 16) : cuGraphKernelNodeSetParams_v2(node, p + 16);
    case NODE_MEMSET:
        memcpy(&u64, p + 16 + 40, 8); /* CUDA_MEMSET_NODE_PARAMS_v2's context */
        if (exec) return cuGraphExecMemsetNodeSetParams(exec, node, p + 16, u64);
        if (node_context(name, u64) != CUDA_SUCCESS) return CUDA_ERROR_NOT_SUPPORTED;
        return cuGraphMemsetNodeSetParams(node, p + 16);
    case NODE_MEMCPY: /* CUDA_MEMCPY_NODE_PARAMS: flags, reserved, the context, then CUDA_MEMCPY3D */
        memcpy(&u64, p + 16 + 8, 8);
        if (exec) return cuGraphExecMemcpyNodeSetParams(exec, node, p + 32, u64);
        if (node_context(name, u64) != CUDA_SUCCESS) return CUDA_ERROR_NOT_SUPPORTED;
        return cuGraphMemcpyNodeSetParams(node, p + 32);
    case NODE_HOST:
        return exec ? cuGraphExecHostNodeSetParams(exec, node, p + 16) : cuGraphHostNodeSetParams(node, p + 16);
    case NODE_GRAPH: /* only an instantiated graph's child graph node is set anew, as natively */
        memcpy(&u64, p + 16, 8);
        return exec ? cuGraphExecChildGraphNodeSetParams(exec, node, u64) : CUDA_ERROR_INVALID_VALUE;
    case NODE_WAIT_EVENT:
        memcpy(&u64, p + 16, 8);
        return exec ? cuGraphExecEventWaitNodeSetEvent(exec, node, u64) : cuGraphEventWaitNodeSetEvent(node, u64);
    case NODE_EVENT_RECORD:
        memcpy(&u64, p + 16, 8);
        return exec ? cuGraphExecEventRecordNodeSetEvent(exec, node, u64) : cuGraphEventRecordNodeSetEvent(node, u64);
    case NODE_BATCH_MEM_OP:
        return exec ? cuGraphExecBatchMemOpNodeSetParams(exec, node, p + 16) : cuGraphBatchMemOpNodeSetParams(node, p + 16);
    }
    gp_say("%s: nodes of type %u are not forwarded to the remote GPU; it returns CUDA_ERROR_NOT_SUPPORTED "
           "(docs/remote.md)", name, type);
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* The generic getter: the node's type, then its typed getter's answer in the union (CUgraphNodeParams:
 * the type at 0, the typed parameters at 16), with the current context where the parameters hold one. */
CUresult cuGraphNodeGetParams(uint64_t node, void *params) {
    GP_TRACE("cuGraphNodeGetParams");
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    int32_t type;
    CUresult r = cuGraphNodeGetType(node, &type);
    if (r != CUDA_SUCCESS) return r;
    unsigned char *p = params, *typed = p + 16;
    uint64_t ctx = gp_ctx_current();
    memset(p, 0, 256);
    memcpy(p, &type, 4);
    switch (type) {
    case NODE_KERNEL:
        return cuGraphKernelNodeGetParams_v2(node, typed);
    case NODE_MEMSET: /* CUDA_MEMSET_NODE_PARAMS_v2: the v1 fields, then the context */
        r = cuGraphMemsetNodeGetParams(node, typed);
        memcpy(typed + 40, &ctx, 8);
        return r;
    case NODE_MEMCPY: /* CUDA_MEMCPY_NODE_PARAMS: flags, reserved, the context, then CUDA_MEMCPY3D */
        memcpy(typed + 8, &ctx, 8);
        return cuGraphMemcpyNodeGetParams(node, typed + 16);
    case NODE_HOST:
        return cuGraphHostNodeGetParams(node, typed);
    case NODE_GRAPH:
        return cuGraphChildGraphNodeGetGraph(node, (uint64_t *)typed);
    case NODE_EMPTY:
        return CUDA_SUCCESS;
    case NODE_WAIT_EVENT:
        return cuGraphEventWaitNodeGetEvent(node, (uint64_t *)typed);
    case NODE_EVENT_RECORD:
        return cuGraphEventRecordNodeGetEvent(node, (uint64_t *)typed);
    case NODE_MEM_ALLOC:
        return cuGraphMemAllocNodeGetParams(node, typed);
    case NODE_MEM_FREE:
        return cuGraphMemFreeNodeGetParams(node, (uint64_t *)typed);
    case NODE_BATCH_MEM_OP:
        return cuGraphBatchMemOpNodeGetParams(node, typed);
    }
    gp_say("cuGraphNodeGetParams: nodes of type %d are not read back from the remote GPU; it returns "
           "CUDA_ERROR_NOT_SUPPORTED (docs/remote.md)", type);
    return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuGraphNodeSetParams(uint64_t node, void *params) {
    GP_TRACE("cuGraphNodeSetParams");
    return node_set_params("cuGraphNodeSetParams", 0, node, params);
}

CUresult cuGraphNodeSetParams_v2(uint64_t node, void *params) {
    GP_TRACE("cuGraphNodeSetParams_v2");
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = params_13_4_as_older("cuGraphNodeSetParams", params);
    return r == CUDA_SUCCESS ? node_set_params("cuGraphNodeSetParams", 0, node, params) : r;
}

CUresult cuGraphExecNodeSetParams(uint64_t exec, uint64_t node, void *params) {
    GP_TRACE("cuGraphExecNodeSetParams");
    if (!exec) return CUDA_ERROR_INVALID_VALUE;
    return node_set_params("cuGraphExecNodeSetParams", exec, node, params);
}

/* A graph's DOT description: the worker's driver writes it, the text comes back (asked again with room for
 * all of it where it did not fit), and is written here to the program's path. */
CUresult cuGraphDebugDotPrint(uint64_t graph, const char *path, uint32_t flags) {
    GP_TRACE("cuGraphDebugDotPrint");
    if (!path) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuGraphDebugDotPrint in = {.graph = graph, .flags = flags};
    struct gp_out_cuGraphDebugDotPrint out = {0};
    uint64_t cap = 1 << 20;
    char *text = NULL;
    for (;;) {
        free(text);
        if (!(text = malloc(cap))) return CUDA_ERROR_OUT_OF_MEMORY;
        CUresult r = gp_call(GP_CALL_cuGraphDebugDotPrint, WANT, &in, sizeof in, NULL, 0, &out, sizeof out, text, cap);
        if (r != CUDA_SUCCESS) {
            free(text);
            return r;
        }
        if (out.size <= cap) break;
        cap = out.size;
    }
    FILE *f = fopen(path, "wb");
    int written = f && fwrite(text, 1, out.size, f) == out.size;
    if (f && fclose(f) != 0) written = 0;
    free(text);
    return written ? CUDA_SUCCESS : (CUresult)304; /* CUDA_ERROR_OPERATING_SYSTEM, as the driver's */
}

/* CUgraphExecUpdateResultInfo: the result, then the error node and the node it came from (not forwarded:
 * they are left empty). */
CUresult cuGraphExecUpdate_v2(uint64_t exec, uint64_t graph, void *info) {
    GP_TRACE("cuGraphExecUpdate_v2");
    struct gp_in_cuGraphExecUpdate_v2 in = {.exec = exec, .graph = graph};
    struct gp_out_cuGraphExecUpdate_v2 out;
    CUresult r = CALL(cuGraphExecUpdate_v2, WANT, in, out);
    if (r != CUDA_SUCCESS) return r;
    if (info) {
        memset(info, 0, 24);
        memcpy(info, &out.result, 4);
    }
    return (CUresult)out.status;
}

/* CUDA_GRAPH_INSTANTIATE_PARAMS: flags, the upload stream, then the error node and the result (out). */
#define INSTANTIATE_FLAG_UPLOAD 2

CUresult cuGraphInstantiateWithParams(uint64_t *exec, uint64_t graph, void *params) {
    GP_TRACE("cuGraphInstantiateWithParams");
    if (!exec || !params) return CUDA_ERROR_INVALID_VALUE;
    unsigned char *p = params;
    uint64_t flags, stream, none = 0;
    memcpy(&flags, p, 8);
    memcpy(&stream, p + 8, 8);
    struct gp_in_cuGraphInstantiateWithFlags in = {.graph = graph, .flags = flags & ~(uint64_t)INSTANTIATE_FLAG_UPLOAD};
    struct gp_out_cuGraphInstantiateWithFlags out;
    CUresult r = CALL(cuGraphInstantiateWithFlags, WANT, in, out);
    if (r == CUDA_SUCCESS && (flags & INSTANTIATE_FLAG_UPLOAD)) {
        struct gp_in_cuGraphUpload up = {.graph_exec = out.graph_exec, .stream = stream};
        r = gp_call(GP_CALL_cuGraphUpload, 0, &up, sizeof up, NULL, 0, NULL, 0, NULL, 0);
    }
    uint32_t result = r == CUDA_SUCCESS ? 0 : 1; /* CUDA_GRAPH_INSTANTIATE_SUCCESS, _ERROR */
    memcpy(p + 16, &none, 8);
    memcpy(p + 24, &result, 4);
    if (r == CUDA_SUCCESS) *exec = out.graph_exec;
    return r;
}

/* ---- user objects: a reference count and a destructor, here in the client ----------------------------
 *
 * Programs tie what a graph's host nodes need (cuda.core: the Python callable) to the graph with a user
 * object. The references a graph holds are kept as long as the process lives — the worker's graphs and
 * the executable graphs made from them would otherwise have to report their destruction back — so the
 * destructor of an object a graph holds does not run (a few bytes per graph). */
struct user_object { void *ptr, *destroy; uint32_t refs; };

CUresult cuUserObjectCreate(uint64_t *obj, void *ptr, void *destroy, uint32_t refs, uint32_t flags) {
    GP_TRACE("cuUserObjectCreate");
    if (!obj || !destroy || !refs || flags != 1) return CUDA_ERROR_INVALID_VALUE; /* NO_DESTRUCTOR_SYNC */
    struct user_object *o = malloc(sizeof *o);
    if (!o) return CUDA_ERROR_OUT_OF_MEMORY;
    *o = (struct user_object){ptr, destroy, refs};
    *obj = (uint64_t)o;
    return CUDA_SUCCESS;
}

CUresult cuUserObjectRetain(uint64_t obj, uint32_t count) {
    GP_TRACE("cuUserObjectRetain");
    if (!obj || !count) return CUDA_ERROR_INVALID_VALUE;
    __atomic_add_fetch(&((struct user_object *)obj)->refs, count, __ATOMIC_ACQ_REL);
    return CUDA_SUCCESS;
}

CUresult cuUserObjectRelease(uint64_t obj, uint32_t count) {
    GP_TRACE("cuUserObjectRelease");
    if (!obj || !count) return CUDA_ERROR_INVALID_VALUE;
    struct user_object *o = (struct user_object *)obj;
    if (__atomic_sub_fetch(&o->refs, count, __ATOMIC_ACQ_REL) == 0) {
        ((void (*)(void *))o->destroy)(o->ptr);
        free(o);
    }
    return CUDA_SUCCESS;
}

CUresult cuGraphRetainUserObject(uint64_t graph, uint64_t obj, uint32_t count, uint32_t flags) {
    GP_TRACE("cuGraphRetainUserObject");
    if (!graph || !obj || !count || flags > 1) return CUDA_ERROR_INVALID_VALUE;
    /* CU_GRAPH_USER_OBJECT_MOVE hands the caller's references to the graph, which keeps them. */
    return flags ? CUDA_SUCCESS : cuUserObjectRetain(obj, count);
}

CUresult cuGraphReleaseUserObject(uint64_t graph, uint64_t obj, uint32_t count) {
    GP_TRACE("cuGraphReleaseUserObject");
    if (!graph || !obj || !count) return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS; /* the graph's references are kept (above) */
}

/* ---- stream capture: the worker captures; the client sees the status, the id, the graph and the
 * nodes the next captured work will depend on ------------------------------------------------------ */

static CUresult capture_deps(uint32_t call, uint64_t stream, uint64_t graph, const void *deps, const void *edges,
                             uint64_t num_deps, uint32_t flags_or_mode) {
    if ((num_deps && !deps) || num_deps > MAX_NODE_DEPS) return CUDA_ERROR_INVALID_VALUE;
    if (!default_edges(edges, num_deps)) return edges_refused("stream capture to a graph");
    if (call == GP_CALL_cuStreamBeginCaptureToGraph) {
        struct gp_in_cuStreamBeginCaptureToGraph in = {
            .stream = stream, .graph = graph, .num_deps = num_deps, .mode = (int32_t)flags_or_mode};
        return gp_call(call, WANT, &in, sizeof in, deps, num_deps * 8, NULL, 0, NULL, 0);
    }
    struct gp_in_cuStreamUpdateCaptureDependencies in = {.stream = stream, .num_deps = num_deps, .flags = flags_or_mode};
    return gp_call(call, WANT, &in, sizeof in, deps, num_deps * 8, NULL, 0, NULL, 0);
}

CUresult cuStreamBeginCaptureToGraph(uint64_t stream, uint64_t graph, void *deps, void *edges, uint64_t num_deps,
                                     int32_t mode) {
    GP_TRACE("cuStreamBeginCaptureToGraph");
    return capture_deps(GP_CALL_cuStreamBeginCaptureToGraph, stream, graph, deps, edges, num_deps, (uint32_t)mode);
}

/* Capture again into `graph`: the worker's driver compares each captured node with the graph's, and asks
 * the program's callback (run on the callback thread, shim.c) about each node whose parameters differ. */
CUresult cuStreamBeginRecaptureToGraph(uint64_t stream, int32_t mode, uint64_t graph, void *callback, void *data) {
    GP_TRACE("cuStreamBeginRecaptureToGraph");
    struct gp_in_cuStreamBeginRecaptureToGraph in = {.stream = stream, .mode = mode, .graph = graph};
    if (callback) {
        CUresult r = gp_callbacks_start();
        if (r != CUDA_SUCCESS) return r;
        in.id = gp_recapture_callback(callback, data);
        if (!in.id) return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return gp_call(GP_CALL_cuStreamBeginRecaptureToGraph, WANT, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
}

CUresult cuStreamUpdateCaptureDependencies(uint64_t stream, void *deps, uint64_t num_deps, uint32_t flags) {
    GP_TRACE("cuStreamUpdateCaptureDependencies");
    return capture_deps(GP_CALL_cuStreamUpdateCaptureDependencies, stream, 0, deps, NULL, num_deps, flags);
}

CUresult cuStreamUpdateCaptureDependencies_v2(uint64_t stream, void *deps, void *edges, uint64_t num_deps,
                                              uint32_t flags) {
    GP_TRACE("cuStreamUpdateCaptureDependencies_v2");
    return capture_deps(GP_CALL_cuStreamUpdateCaptureDependencies_v2, stream, 0, deps, edges, num_deps, flags);
}

/* The dependency nodes, in arrays of this thread's, valid until its next call (as the driver's). */
static __thread uint64_t capture_nodes[MAX_NODE_DEPS];
static __thread unsigned char capture_edges[8 * 64];

/* Libraries ask before each call whether its stream captures (cuBLAS and cuSPARSE through the runtime's
 * cudaStreamGetCaptureInfo, 100,000 times in a run of cupyx's Lanczos). While no capture this process
 * began is open, no stream of it captures: the answer is NONE, for a stream the worker has confirmed
 * (cuStreamIsCapturing's kept answer), as the worker's own answer would be (the other outputs are valid
 * only while a capture is active; the worker's read zero). */
static int capture_info_here(uint64_t stream, int32_t *status) {
    int32_t capturing = 1;
    return status && !gp_capture_open() && cuStreamIsCapturing(stream, &capturing) == CUDA_SUCCESS &&
           !capturing && !gp_capture_open();
}

static CUresult capture_info(uint64_t stream, int32_t *status, uint64_t *id, uint64_t *graph, const void **deps,
                             const void **edges, size_t *num_deps) {
    struct gp_in_cuStreamGetCaptureInfo_v3 in = {.stream = stream};
    struct gp_out_cuStreamGetCaptureInfo_v3 out = {0};
    CUresult r = capture_info_here(stream, status)
                     ? CUDA_SUCCESS
                     : gp_call(GP_CALL_cuStreamGetCaptureInfo_v3, WANT, &in, sizeof in, NULL, 0, &out, sizeof out,
                               capture_nodes, sizeof capture_nodes);
    if (r) return r;
    if (status) *status = out.status;
    if (id) *id = out.id;
    if (graph) *graph = out.graph;
    if (num_deps) *num_deps = (size_t)out.num_deps;
    if (deps) *deps = out.num_deps ? capture_nodes : NULL;
    if (edges) { /* the default edge data, which is all a capture makes here */
        if (out.num_deps > sizeof capture_edges / 8) return CUDA_ERROR_NOT_SUPPORTED;
        memset(capture_edges, 0, sizeof capture_edges);
        *edges = out.num_deps ? capture_edges : NULL;
    }
    return CUDA_SUCCESS;
}

CUresult cuStreamGetCaptureInfo_v2(uint64_t stream, void *status, void *id, void *graph, void *deps, void *num_deps) {
    GP_TRACE("cuStreamGetCaptureInfo_v2");
    return capture_info(stream, status, id, graph, deps, NULL, num_deps);
}

CUresult cuStreamGetCaptureInfo_v3(uint64_t stream, void *status, void *id, void *graph, void *deps, void *edges,
                                   void *num_deps) {
    GP_TRACE("cuStreamGetCaptureInfo_v3");
    return capture_info(stream, status, id, graph, deps, edges, num_deps);
}

/* The capture mode belongs to the calling thread; the worker runs a connection's calls on one thread, so
 * the exchange happens there, in the order the client's threads make it. */
CUresult cuThreadExchangeStreamCaptureMode(void *mode) {
    GP_TRACE("cuThreadExchangeStreamCaptureMode");
    if (!mode) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuThreadExchangeStreamCaptureMode in = {.mode = *(int32_t *)mode};
    struct gp_out_cuThreadExchangeStreamCaptureMode out;
    CUresult r = CALL(cuThreadExchangeStreamCaptureMode, WANT, in, out);
    if (r == CUDA_SUCCESS) *(int32_t *)mode = out.previous;
    return r;
}

/* A graph's nodes, root nodes or edges, or a node's neighbours: the count, then the handles (the same
 * request and answer for each: one handle in, a count out); the caller's arrays take at most *count.
 * A node's neighbours come with each edge's 8 bytes of data after the handles; a graph's edges do not
 * (cuGraphGetEdges_v2 reports the default edge). */
static CUresult graph_list(uint32_t call, uint64_t subject, uint64_t *a, uint64_t *b, void *edge_data,
                           size_t *count) {
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    int edges = call == GP_CALL_cuGraphGetEdges || call == GP_CALL_cuGraphGetEdges_v2;
    int with_data = call == GP_CALL_cuGraphNodeGetDependencies_v2 || call == GP_CALL_cuGraphNodeGetDependentNodes_v2;
    uint64_t room = (a || b) ? *count : 0, per = edges ? 2 : 1;
    uint64_t cap = MAX_NODE_DEPS > room ? MAX_NODE_DEPS : room;
    uint64_t *got = malloc(8 * (per + with_data) * cap + 8);
    if (!got) return CUDA_ERROR_OUT_OF_MEMORY;
    struct gp_in_cuGraphGetNodes in = {.graph = subject};
    struct gp_out_cuGraphGetNodes out;
    CUresult r = gp_call(call, WANT, &in, sizeof in, NULL, 0, &out, sizeof out, got, 8 * (per + with_data) * cap);
    if (r == CUDA_SUCCESS) {
        uint64_t n = out.count < room ? out.count : room;
        for (uint64_t i = 0; i < n; i++) {
            if (a) a[i] = got[per * i];
            if (b && edges) b[i] = got[per * i + 1];
        }
        for (uint64_t i = n; i < room; i++) { /* entries past the graph's read NULL, as the driver's */
            if (a) a[i] = 0;
            if (b && edges) b[i] = 0;
        }
        if (edge_data && n && with_data) memcpy(edge_data, got + out.count, 8 * n);
        else if (edge_data && n) memset(edge_data, 0, 8 * n); /* the default edges */
        *count = n < out.count && (a || b) ? n : out.count;
    }
    free(got);
    return r;
}

CUresult cuGraphGetNodes(uint64_t graph, void *nodes, void *count) {
    GP_TRACE("cuGraphGetNodes");
    return graph_list(GP_CALL_cuGraphGetNodes, graph, nodes, NULL, NULL, count);
}

CUresult cuGraphGetRootNodes(uint64_t graph, void *nodes, void *count) {
    GP_TRACE("cuGraphGetRootNodes");
    return graph_list(GP_CALL_cuGraphGetRootNodes, graph, nodes, NULL, NULL, count);
}

CUresult cuGraphNodeGetDependencies(uint64_t node, void *nodes, void *count) {
    GP_TRACE("cuGraphNodeGetDependencies");
    return graph_list(GP_CALL_cuGraphNodeGetDependencies, node, nodes, NULL, NULL, count);
}

CUresult cuGraphNodeGetDependencies_v2(uint64_t node, void *nodes, void *edge_data, void *count) {
    GP_TRACE("cuGraphNodeGetDependencies_v2");
    return graph_list(GP_CALL_cuGraphNodeGetDependencies_v2, node, nodes, NULL, edge_data, count);
}

CUresult cuGraphNodeGetDependentNodes(uint64_t node, void *nodes, void *count) {
    GP_TRACE("cuGraphNodeGetDependentNodes");
    return graph_list(GP_CALL_cuGraphNodeGetDependentNodes, node, nodes, NULL, NULL, count);
}

CUresult cuGraphNodeGetDependentNodes_v2(uint64_t node, void *nodes, void *edge_data, void *count) {
    GP_TRACE("cuGraphNodeGetDependentNodes_v2");
    return graph_list(GP_CALL_cuGraphNodeGetDependentNodes_v2, node, nodes, NULL, edge_data, count);
}

CUresult cuGraphGetEdges(uint64_t graph, void *from, void *to, void *count) {
    GP_TRACE("cuGraphGetEdges");
    return graph_list(GP_CALL_cuGraphGetEdges, graph, from, to, NULL, count);
}

CUresult cuGraphGetEdges_v2(uint64_t graph, void *from, void *to, void *edge_data, void *count) {
    GP_TRACE("cuGraphGetEdges_v2");
    return graph_list(GP_CALL_cuGraphGetEdges_v2, graph, from, to, edge_data, count);
}
