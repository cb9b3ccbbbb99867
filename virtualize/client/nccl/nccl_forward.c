/* gpupool's libgpupool_nccl.so: NCCL forwarded at its API to the worker of the process's lease.
 *
 * Preloaded (LD_PRELOAD) by `gpuattach run --spread` (and where GPUPOOL_NCCL=forward), it defines every name
 * NCCL's libnccl.so.2 exports, so a program's NCCL calls (PyTorch's ProcessGroupNCCL, CuPy, a ctypes
 * program) land here instead of in a libnccl of the client. Each is sent, through gpupool's libcuda.so.1 on
 * the process's connection (its `gpupool_forward`), to the lease's worker, where the server's NCCL runs it
 * on the lease's GPU (virtualize/server/_guard_nccl.py): NCCL's bootstrap and its transports connect the
 * ranks' workers to each other, server to server, and the collectives' bytes never cross the client.
 *
 * A collective, a group start or end and an operator's destruction are enqueued like a launch (no reply:
 * in order with the process's CUDA calls, on the same connection); their errors come back with the next
 * ncclCommGetAsyncError. The calls that answer something wait for the worker. A communicator is the
 * worker's id of one the lease made; one this process did not make is refused here
 * (ncclInvalidArgument) and again by the worker. ncclMemAlloc / ncclMemFree are the lease's cuMemAlloc /
 * cuMemFree. Every other name (nccl_stubs_gen.h, from nccl_symbols.txt) answers ncclInvalidUsage and says so
 * once on stderr: never a crash, never a silent wrong result.
 *
 * No nccl.h here: its few types are declared below (ABI of NCCL 2.x). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../shim/shim.h" /* the call table's ids and wire structs (calls_gen_types.h) */

#define GP_ALIAS(other, name) extern __typeof__(name) other __attribute__((alias(#name), visibility("default")));

typedef int ncclResult_t;
enum { ncclSuccess, ncclUnhandledCudaError, ncclSystemError, ncclInternalError, ncclInvalidArgument,
       ncclInvalidUsage, ncclRemoteError, ncclInProgress, ncclTimeout, ncclNumResults };
typedef struct gp_nccl_comm *ncclComm_t; /* the worker's id of a communicator of the lease */
typedef void *cudaStream_t;              /* a CUstream of the lease */
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
typedef int ncclScalarResidence_t;
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;
/* ncclConfig_t as NCCL 2.30 declares it; a program built against an older nccl.h passes a smaller one
 * (its `size`): the fields past it are read as unset. */
typedef struct {
    size_t size;
    unsigned int magic, version;
    int blocking, cgaClusterSize, minCTAs, maxCTAs;
    const char *netName;
    int splitShare, trafficClass;
    const char *commName;
    int collnetEnable, CTAPolicy, shrinkShare, nvlsCTAs, nChannelsPerNetPeer, nvlinkCentricSched, graphUsageMode,
        numRmaCtx, maxP2pPeers, graphStreamOrdering;
} ncclConfig_t;
#define NCCL_API_MAGIC 0xcafebeef
static const int element_bytes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1}; /* per ncclDataType_t */

/* ---- the shim's connection ------------------------------------------------------------------------- */
typedef CUresult (*forward_fn)(uint32_t, uint32_t, const void *, uint32_t, const void *, uint64_t, void *, uint32_t,
                               void *, uint64_t);
typedef CUresult (*mem_alloc_fn)(uint64_t *, size_t);
typedef CUresult (*mem_free_fn)(uint64_t);
static forward_fn forward;
static mem_alloc_fn cu_mem_alloc;
static mem_free_fn cu_mem_free;
static pthread_once_t found_once = PTHREAD_ONCE_INIT;

static __thread char last_error[256];

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    fprintf(stderr, "gpupool: NCCL: %s\n", last_error);
}

static void find_shim(void) {
    void *where = RTLD_DEFAULT;
    forward = (forward_fn)dlsym(where, "gpupool_forward");
    if (!forward) { /* NCCL asked for before CUDA loaded the driver: load it (gpupool's, first on the path) */
        where = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
        forward = where ? (forward_fn)dlsym(where, "gpupool_forward") : NULL;
    }
    if (!forward) {
        say("the libcuda.so.1 of this process is not gpupool's: NCCL cannot reach the lease (run the program "
            "under gpuattach run, or set GPUPOOL_NCCL=off to use the program's own NCCL)");
        return;
    }
    cu_mem_alloc = (mem_alloc_fn)dlsym(where, "cuMemAlloc_v2");
    cu_mem_free = (mem_free_fn)dlsym(where, "cuMemFree_v2");
}

/* One call to the worker. `out` starts with the call's NCCL result (every answering call's first out). */
static ncclResult_t call(uint32_t id, int wants_reply, const void *in, uint32_t in_len, const void *bulk,
                         uint64_t bulk_len, void *out, uint32_t out_len, void *bulk_out, uint64_t bulk_out_len) {
    pthread_once(&found_once, find_shim);
    if (!forward) return ncclSystemError;
    CUresult r = forward(id, wants_reply ? GP_FLAG_WANTS_REPLY : 0, in, in_len, bulk, bulk_len, out, out_len, bulk_out,
                         bulk_out_len);
    if (r != CUDA_SUCCESS) {
        say("%s: the lease's worker did not run it (CUresult %d)", gp_call_names[id] + 2, r);
        return ncclSystemError;
    }
    if (!wants_reply) return ncclSuccess;
    int32_t result;
    memcpy(&result, out, sizeof result);
    return result;
}

/* ---- the communicators this process made (ids of the worker's) --------------------------------------- */
static pthread_mutex_t comms_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t *comms;
static size_t n_comms, cap_comms;

static void comm_add(uint64_t id) {
    pthread_mutex_lock(&comms_lock);
    if (n_comms == cap_comms) {
        size_t cap = cap_comms ? 2 * cap_comms : 16;
        uint64_t *grown = realloc(comms, cap * sizeof *comms);
        if (grown) comms = grown, cap_comms = cap;
    }
    if (n_comms < cap_comms) comms[n_comms++] = id;
    pthread_mutex_unlock(&comms_lock);
}

static int comm_known(const ncclComm_t comm, const char *what) {
    uint64_t id = (uint64_t)(uintptr_t)comm;
    int found = 0;
    pthread_mutex_lock(&comms_lock);
    for (size_t i = 0; i < n_comms && !found; i++) found = comms[i] == id;
    pthread_mutex_unlock(&comms_lock);
    if (!found) say("%s: communicator %p is not one this process made (or it was destroyed)", what, (void *)comm);
    return found;
}

static void comm_drop(const ncclComm_t comm) {
    uint64_t id = (uint64_t)(uintptr_t)comm;
    pthread_mutex_lock(&comms_lock);
    for (size_t i = 0; i < n_comms; i++)
        if (comms[i] == id) { comms[i] = comms[--n_comms]; break; }
    pthread_mutex_unlock(&comms_lock);
}

/* ---- the library and its errors ---------------------------------------------------------------------- */
GP_EXPORT ncclResult_t ncclGetVersion(int *version) {
    static int known; /* the server's NCCL does not change while the process runs */
    if (!version) return ncclInvalidArgument;
    if (known) { *version = known; return ncclSuccess; }
    struct gp_out_gpNcclVersion out = {0};
    ncclResult_t r = call(GP_CALL_gpNcclVersion, 1, NULL, 0, NULL, 0, &out, sizeof out, NULL, 0);
    if (r == ncclSuccess) *version = known = out.version;
    return r;
}

GP_EXPORT const char *ncclGetErrorString(ncclResult_t result) {
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    case ncclTimeout: return "NCCL operation timed out";
    default: return "unknown result code";
    }
}

GP_EXPORT const char *ncclGetLastError(ncclComm_t comm) {
    (void)comm;
    return last_error; /* this process's last refusal; the server's NCCL logs its own (NCCL_DEBUG on the server) */
}

/* ---- communicators ------------------------------------------------------------------------------------ */
GP_EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId *unique_id) {
    if (!unique_id) return ncclInvalidArgument;
    struct gp_out_gpNcclGetUniqueId out = {0};
    return call(GP_CALL_gpNcclGetUniqueId, 1, NULL, 0, NULL, 0, &out, sizeof out, unique_id->internal,
                NCCL_UNIQUE_ID_BYTES);
}

/* The config's ints (GP_NCCL_CONFIG_INTS' order; unset where the program's struct is too small to hold one),
 * then its two names, NUL-terminated. Returns the bytes written. */
static size_t config_bytes(const ncclConfig_t *config, char *buf, size_t cap) {
    size_t n = 0, have = config->size;
    int32_t value;
#define GP_CONFIG_INT(field)                                                                                   \
    value = offsetof(ncclConfig_t, field) + sizeof(int) <= have ? config->field : INT_MIN;                    \
    memcpy(buf + n, &value, sizeof value);                                                                     \
    n += sizeof value;
    GP_NCCL_CONFIG_INTS(GP_CONFIG_INT)
#undef GP_CONFIG_INT
    const char *names[2] = {
        offsetof(ncclConfig_t, netName) + sizeof(char *) <= have ? config->netName : NULL,
        offsetof(ncclConfig_t, commName) + sizeof(char *) <= have ? config->commName : NULL,
    };
    for (int i = 0; i < 2; i++) {
        size_t len = names[i] ? strnlen(names[i], 255) : 0;
        if (n + len + 1 > cap) break;
        memcpy(buf + n, names[i] ? names[i] : "", len);
        buf[n + len] = 0;
        n += len + 1;
    }
    return n;
}

static int config_ok(const ncclConfig_t *config) {
    if (!config) return 1;
    if (config->magic != NCCL_API_MAGIC || config->size < offsetof(ncclConfig_t, netName)) {
        say("the communicator's config was not set up with NCCL_CONFIG_INITIALIZER");
        return 0;
    }
    return 1;
}

static ncclResult_t init_rank(ncclComm_t *comm, int nranks, const ncclUniqueId *id, int rank, ncclConfig_t *config) {
    if (!comm) return ncclInvalidArgument;
    *comm = NULL;
    if (!config_ok(config)) return ncclInvalidArgument;
    char bulk[NCCL_UNIQUE_ID_BYTES + 16 * sizeof(int32_t) + 2 * 256];
    memcpy(bulk, id->internal, NCCL_UNIQUE_ID_BYTES);
    size_t len = NCCL_UNIQUE_ID_BYTES;
    if (config) len += config_bytes(config, bulk + len, sizeof bulk - len);
    struct gp_in_gpNcclCommInitRank in = {.nranks = nranks, .rank = rank, .has_config = config != NULL};
    struct gp_out_gpNcclCommInitRank out = {0};
    ncclResult_t r = call(GP_CALL_gpNcclCommInitRank, 1, &in, sizeof in, bulk, len, &out, sizeof out, NULL, 0);
    if (out.comm) {
        comm_add(out.comm);
        *comm = (ncclComm_t)(uintptr_t)out.comm;
    }
    return r;
}

GP_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    return init_rank(comm, nranks, &id, rank, NULL);
}

GP_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                              ncclConfig_t *config) {
    return init_rank(comm, nranks, &id, rank, config);
}

/* One device per process is what a spread lease shows (device 0): a clique of one. */
GP_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t *comms_out, int ndev, const int *devlist) {
    if (!comms_out || ndev != 1 || (devlist && devlist[0] != 0)) {
        say("ncclCommInitAll is forwarded for one device (device 0) only: start one process per GPU");
        return ncclInvalidUsage;
    }
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    return r != ncclSuccess ? r : init_rank(comms_out, 1, &id, 0, NULL);
}

GP_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config) {
    if (!newcomm) return ncclInvalidArgument;
    *newcomm = NULL;
    if (!comm_known(comm, "ncclCommSplit") || !config_ok(config)) return ncclInvalidArgument;
    char bulk[16 * sizeof(int32_t) + 2 * 256];
    size_t len = config ? config_bytes(config, bulk, sizeof bulk) : 0;
    struct gp_in_gpNcclCommSplit in = {
        .parent = (uint64_t)(uintptr_t)comm, .color = color, .key = key, .has_config = config != NULL};
    struct gp_out_gpNcclCommSplit out = {0};
    ncclResult_t r = call(GP_CALL_gpNcclCommSplit, 1, &in, sizeof in, bulk, len, &out, sizeof out, NULL, 0);
    if (out.comm) {
        comm_add(out.comm);
        *newcomm = (ncclComm_t)(uintptr_t)out.comm;
    }
    return r;
}

static ncclResult_t comm_end(ncclComm_t comm, uint32_t how, const char *what) {
    if (!comm) return ncclSuccess; /* NCCL accepts a NULL communicator here */
    if (!comm_known(comm, what)) return ncclInvalidArgument;
    struct gp_in_gpNcclCommEnd in = {.comm = (uint64_t)(uintptr_t)comm, .how = how};
    struct gp_out_gpNcclCommEnd out = {0};
    ncclResult_t r = call(GP_CALL_gpNcclCommEnd, 1, &in, sizeof in, NULL, 0, &out, sizeof out, NULL, 0);
    if (how) comm_drop(comm); /* destroyed or aborted: gone whatever NCCL said */
    return r;
}

GP_EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) { return comm_end(comm, 0, "ncclCommFinalize"); }
GP_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) { return comm_end(comm, 1, "ncclCommDestroy"); }
GP_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) { return comm_end(comm, 2, "ncclCommAbort"); }

static ncclResult_t query(const ncclComm_t comm, struct gp_out_gpNcclCommQuery *out, const char *what) {
    if (!comm_known(comm, what)) return ncclInvalidArgument;
    struct gp_in_gpNcclCommQuery in = {.comm = (uint64_t)(uintptr_t)comm};
    return call(GP_CALL_gpNcclCommQuery, 1, &in, sizeof in, NULL, 0, out, sizeof *out, NULL, 0);
}

GP_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async_error) {
    struct gp_out_gpNcclCommQuery out = {0};
    if (!async_error) return ncclInvalidArgument;
    ncclResult_t r = query(comm, &out, "ncclCommGetAsyncError");
    if (r == ncclSuccess) *async_error = out.async_error;
    return r;
}

#define GP_COMM_INT(name, field)                                                                               \
    GP_EXPORT ncclResult_t name(const ncclComm_t comm, int *value) {                                           \
        struct gp_out_gpNcclCommQuery out = {0};                                                               \
        if (!value) return ncclInvalidArgument;                                                                \
        ncclResult_t r = query(comm, &out, #name);                                                             \
        if (r == ncclSuccess) *value = out.field;                                                              \
        return r;                                                                                              \
    }
GP_COMM_INT(ncclCommCount, count)
GP_COMM_INT(ncclCommCuDevice, device)
GP_COMM_INT(ncclCommUserRank, rank)

/* ---- collectives: enqueued on the lease's stream, no reply ----------------------------------------------- */
static ncclResult_t collective(uint32_t kind, const void *send, void *recv, size_t count, ncclDataType_t datatype,
                               ncclRedOp_t op, int peer, ncclComm_t comm, cudaStream_t stream, const char *what) {
    if (!comm_known(comm, what)) return ncclInvalidArgument;
    if (datatype < 0 || datatype >= (int)(sizeof element_bytes / sizeof *element_bytes)) {
        say("%s: no NCCL datatype %d", what, datatype);
        return ncclInvalidArgument;
    }
    struct gp_in_gpNcclCollective in = {.comm = (uint64_t)(uintptr_t)comm, .stream = (uint64_t)(uintptr_t)stream,
                                        .send = (uint64_t)(uintptr_t)send, .recv = (uint64_t)(uintptr_t)recv,
                                        .count = count, .datatype = datatype, .op = op, .peer = peer, .kind = kind};
    return call(GP_CALL_gpNcclCollective, 0, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
}

GP_EXPORT ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                                     ncclComm_t comm, cudaStream_t stream) {
    return collective(GP_NCCL_AllReduce, send, recv, count, datatype, op, 0, comm, stream, "ncclAllReduce");
}
GP_EXPORT ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t datatype, int root,
                                     ncclComm_t comm, cudaStream_t stream) {
    return collective(GP_NCCL_Broadcast, send, recv, count, datatype, 0, root, comm, stream, "ncclBroadcast");
}
GP_EXPORT ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                                 cudaStream_t stream) {
    return collective(GP_NCCL_Broadcast, buff, buff, count, datatype, 0, root, comm, stream, "ncclBcast");
}
GP_EXPORT ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                                  int root, ncclComm_t comm, cudaStream_t stream) {
    return collective(GP_NCCL_Reduce, send, recv, count, datatype, op, root, comm, stream, "ncclReduce");
}
GP_EXPORT ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t datatype,
                                     ncclComm_t comm, cudaStream_t stream) {
    return collective(GP_NCCL_AllGather, send, recv, count, datatype, 0, 0, comm, stream, "ncclAllGather");
}
GP_EXPORT ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t datatype,
                                         ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    return collective(GP_NCCL_ReduceScatter, send, recv, count, datatype, op, 0, comm, stream, "ncclReduceScatter");
}
GP_EXPORT ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                                cudaStream_t stream) {
    return collective(GP_NCCL_Send, send, NULL, count, datatype, 0, peer, comm, stream, "ncclSend");
}
GP_EXPORT ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                                cudaStream_t stream) {
    return collective(GP_NCCL_Recv, NULL, recv, count, datatype, 0, peer, comm, stream, "ncclRecv");
}
GP_EXPORT ncclResult_t ncclAlltoAll(const void *send, void *recv, size_t count, ncclDataType_t datatype,
                                    ncclComm_t comm, cudaStream_t stream) {
    return collective(GP_NCCL_AlltoAll, send, recv, count, datatype, 0, 0, comm, stream, "ncclAlltoAll");
}
GP_EXPORT ncclResult_t ncclGather(const void *send, void *recv, size_t count, ncclDataType_t datatype, int root,
                                  ncclComm_t comm, cudaStream_t stream) {
    return collective(GP_NCCL_Gather, send, recv, count, datatype, 0, root, comm, stream, "ncclGather");
}
GP_EXPORT ncclResult_t ncclScatter(const void *send, void *recv, size_t count, ncclDataType_t datatype, int root,
                                   ncclComm_t comm, cudaStream_t stream) {
    return collective(GP_NCCL_Scatter, send, recv, count, datatype, 0, root, comm, stream, "ncclScatter");
}

static ncclResult_t group(uint32_t start) {
    struct gp_in_gpNcclGroup in = {.start = start};
    return call(GP_CALL_gpNcclGroup, 0, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
}
GP_EXPORT ncclResult_t ncclGroupStart(void) { return group(1); }
GP_EXPORT ncclResult_t ncclGroupEnd(void) { return group(0); }

/* ---- reduction operators, registrations, memory ---------------------------------------------------------- */
GP_EXPORT ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                                ncclScalarResidence_t residence, ncclComm_t comm) {
    if (!op || !scalar || datatype < 0 || datatype >= (int)(sizeof element_bytes / sizeof *element_bytes))
        return ncclInvalidArgument;
    if (!comm_known(comm, "ncclRedOpCreatePreMulSum")) return ncclInvalidArgument;
    /* host-immediate (1): the scalar's bytes travel; in device memory (0): its address does */
    uint64_t value = 0;
    if (residence == 1) memcpy(&value, scalar, (size_t)element_bytes[datatype]);
    else value = (uint64_t)(uintptr_t)scalar;
    struct gp_in_gpNcclRedOpCreatePreMulSum in = {
        .scalar = value, .datatype = datatype, .residence = residence, .comm = (uint64_t)(uintptr_t)comm};
    struct gp_out_gpNcclRedOpCreatePreMulSum out = {0};
    ncclResult_t r = call(GP_CALL_gpNcclRedOpCreatePreMulSum, 1, &in, sizeof in, NULL, 0, &out, sizeof out, NULL, 0);
    if (r == ncclSuccess) *op = out.op;
    return r;
}

GP_EXPORT ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
    if (!comm_known(comm, "ncclRedOpDestroy")) return ncclInvalidArgument;
    struct gp_in_gpNcclRedOpDestroy in = {.op = op, .comm = (uint64_t)(uintptr_t)comm};
    return call(GP_CALL_gpNcclRedOpDestroy, 0, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
}

GP_EXPORT ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle) {
    if (!handle) return ncclInvalidArgument;
    if (!comm_known(comm, "ncclCommRegister")) return ncclInvalidArgument;
    struct gp_in_gpNcclRegister in = {.comm = (uint64_t)(uintptr_t)comm, .buffer = (uint64_t)(uintptr_t)buff, .size = size};
    struct gp_out_gpNcclRegister out = {0};
    ncclResult_t r = call(GP_CALL_gpNcclRegister, 1, &in, sizeof in, NULL, 0, &out, sizeof out, NULL, 0);
    *handle = r == ncclSuccess ? (void *)(uintptr_t)out.handle : NULL;
    return r;
}

GP_EXPORT ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle) {
    if (!comm_known(comm, "ncclCommDeregister")) return ncclInvalidArgument;
    struct gp_in_gpNcclDeregister in = {.comm = (uint64_t)(uintptr_t)comm, .handle = (uint64_t)(uintptr_t)handle};
    struct gp_out_gpNcclDeregister out = {0};
    return call(GP_CALL_gpNcclDeregister, 1, &in, sizeof in, NULL, 0, &out, sizeof out, NULL, 0);
}

/* NCCL's allocator gives memory its transports can register; here the lease's own allocations are that. */
GP_EXPORT ncclResult_t ncclMemAlloc(void **ptr, size_t size) {
    pthread_once(&found_once, find_shim);
    if (!ptr) return ncclInvalidArgument;
    if (!cu_mem_alloc) return ncclSystemError;
    uint64_t dptr = 0;
    CUresult r = cu_mem_alloc(&dptr, size);
    if (r != CUDA_SUCCESS) {
        say("ncclMemAlloc: cuMemAlloc of %zu bytes failed (CUresult %d)", size, r);
        return ncclUnhandledCudaError;
    }
    *ptr = (void *)(uintptr_t)dptr;
    return ncclSuccess;
}

GP_EXPORT ncclResult_t ncclMemFree(void *ptr) {
    pthread_once(&found_once, find_shim);
    if (!ptr) return ncclSuccess;
    if (!cu_mem_free) return ncclSystemError;
    return cu_mem_free((uint64_t)(uintptr_t)ptr) == CUDA_SUCCESS ? ncclSuccess : ncclUnhandledCudaError;
}

/* ---- everything else NCCL exports: refused, said once per name ------------------------------------------- */
static int unforwarded(const char *name, int *said) {
    if (!__atomic_exchange_n(said, 1, __ATOMIC_RELAXED))
        say("%s is not forwarded to the lease's worker: it returns ncclInvalidUsage", name);
    return ncclInvalidUsage;
}
#define GP_STUB(name)                                                                                          \
    GP_EXPORT int name(void) {                                                                                 \
        static int said;                                                                                       \
        return unforwarded(#name, &said);                                                                      \
    }

#include "nccl_stubs_gen.h"
