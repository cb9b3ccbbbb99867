/* gpupool's libcuda.so.1, hand-written calls: streams' memory operations, their attributes, and host
 * functions (run here when the worker's stream reaches them). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "shim_calls.h"

/* ---- stream memory operations: words of device memory ---------------------------------------------- */

/* A word of mirrored host memory (mapped, registered or managed) is refused: the program reads it without
 * a synchronisation, and the mirror brings the device's bytes back only at one (docs/remote.md), so a
 * flag the stream wrote would never be seen, and one the host wrote never waited for. */
static int mirrored(uint32_t call, uint64_t addr) {
    static int said;
    if (!gp_managed_lookup(addr) && !gp_mirror_of_device(addr)) return 0;
    if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
        gp_say("%s on mapped, registered or managed host memory is not forwarded (the program would see it "
               "only at a synchronisation); it returns CUDA_ERROR_NOT_SUPPORTED (docs/remote.md)",
               gp_call_names[call]);
    return 1;
}

static CUresult stream_value(uint32_t call, uint64_t stream, uint64_t addr, uint64_t value, uint32_t flags, int wide) {
    if (mirrored(call, addr)) return CUDA_ERROR_NOT_SUPPORTED;
    if (wide) {
        struct gp_in_cuStreamWriteValue64_v2 in = {.stream = stream, .addr = addr, .value = value, .flags = flags};
        return gp_call(call, 0, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
    }
    struct gp_in_cuStreamWriteValue32_v2 in = {.stream = stream, .addr = addr, .value = (uint32_t)value, .flags = flags};
    return gp_call(call, 0, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
}

#define STREAM_VALUE(name, bits, wide)                                                                    \
    CUresult name(uint64_t stream, uint64_t addr, uint##bits##_t value, uint32_t flags) {                  \
        GP_TRACE(#name);                                                                                  \
        return stream_value(GP_CALL_##name, stream, addr, value, flags, wide);                            \
    }
STREAM_VALUE(cuStreamWaitValue32, 32, 0)
STREAM_VALUE(cuStreamWaitValue32_v2, 32, 0)
STREAM_VALUE(cuStreamWriteValue32, 32, 0)
STREAM_VALUE(cuStreamWriteValue32_v2, 32, 0)
STREAM_VALUE(cuStreamWaitValue64, 64, 1)
STREAM_VALUE(cuStreamWaitValue64_v2, 64, 1)
STREAM_VALUE(cuStreamWriteValue64, 64, 1)
STREAM_VALUE(cuStreamWriteValue64_v2, 64, 1)

/* cuStreamBatchMemOp: CUstreamBatchMemOpParams is a 48-byte union, its operation first; a wait or write
 * holds the address at 8, the value at 16 and the flags at 24. Every operation is checked before any is
 * sent; then each wait or write goes as its own call, in the batch's order on the stream (which orders
 * them at least as strictly as a barrier would). A flush of remote writes has none to flush: nothing
 * outside the lease's worker can write its memory through GPUDirect RDMA. A word of mirrored host memory
 * refuses the whole batch, as it refuses a single wait or write. */
enum { OP_WAIT_32 = 1, OP_WRITE_32 = 2, OP_FLUSH_REMOTE_WRITES = 3, OP_WAIT_64 = 4, OP_WRITE_64 = 5, OP_BARRIER = 6 };

CUresult mem_ops_check(uint32_t call, const void *ops, uint32_t count) {
    if (!count || count > MEM_OPS_MAX || !ops) return CUDA_ERROR_INVALID_VALUE;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t op;
        uint64_t addr;
        memcpy(&op, (const unsigned char *)ops + (size_t)i * MEM_OP_BYTES, 4);
        memcpy(&addr, (const unsigned char *)ops + (size_t)i * MEM_OP_BYTES + 8, 8);
        if (op < OP_WAIT_32 || op > OP_BARRIER) return CUDA_ERROR_INVALID_VALUE;
        if (op != OP_FLUSH_REMOTE_WRITES && op != OP_BARRIER && mirrored(call, addr)) return CUDA_ERROR_NOT_SUPPORTED;
    }
    return CUDA_SUCCESS;
}

static CUresult batch_mem_op(uint64_t stream, uint32_t count, const void *ops, uint32_t flags, int v2) {
    if (flags) return CUDA_ERROR_INVALID_VALUE;
    CUresult checked = mem_ops_check(GP_CALL_cuStreamBatchMemOp, ops, count);
    if (checked != CUDA_SUCCESS) return checked;
    static const uint32_t calls[2][6] = {
        {GP_CALL_cuStreamWaitValue32, GP_CALL_cuStreamWriteValue32, 0, GP_CALL_cuStreamWaitValue64,
         GP_CALL_cuStreamWriteValue64, 0},
        {GP_CALL_cuStreamWaitValue32_v2, GP_CALL_cuStreamWriteValue32_v2, 0, GP_CALL_cuStreamWaitValue64_v2,
         GP_CALL_cuStreamWriteValue64_v2, 0},
    };
    for (uint32_t i = 0; i < count; i++) {
        const unsigned char *p = (const unsigned char *)ops + (size_t)i * MEM_OP_BYTES;
        uint32_t op, op_flags;
        uint64_t addr, value;
        memcpy(&op, p, 4), memcpy(&addr, p + 8, 8), memcpy(&value, p + 16, 8), memcpy(&op_flags, p + 24, 4);
        uint32_t call = calls[v2][op - 1];
        if (!call) continue; /* a barrier or a flush: see above */
        int wide = op == OP_WAIT_64 || op == OP_WRITE_64;
        CUresult r = stream_value(call, stream, addr, wide ? value : (uint32_t)value, op_flags, wide);
        if (r != CUDA_SUCCESS) return r;
    }
    return CUDA_SUCCESS;
}

CUresult cuStreamBatchMemOp(uint64_t stream, uint32_t count, void *ops, uint32_t flags) {
    GP_TRACE("cuStreamBatchMemOp");
    return batch_mem_op(stream, count, ops, flags, 0);
}

CUresult cuStreamBatchMemOp_v2(uint64_t stream, uint32_t count, void *ops, uint32_t flags) {
    GP_TRACE("cuStreamBatchMemOp_v2");
    return batch_mem_op(stream, count, ops, flags, 1);
}

/* ---- stream attributes: the 64-byte CUstreamAttrValue both ways ---------------------------------- */

#define STREAM_ATTR_BYTES 64

CUresult cuStreamGetAttribute(uint64_t stream, int32_t attr, void *value) {
    GP_TRACE("cuStreamGetAttribute");
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuStreamGetAttribute in = {.stream = stream, .attr = attr};
    return gp_call(GP_CALL_cuStreamGetAttribute, WANT, &in, sizeof in, NULL, 0, NULL, 0, value, STREAM_ATTR_BYTES);
}

CUresult cuStreamSetAttribute(uint64_t stream, int32_t attr, void *value) {
    GP_TRACE("cuStreamSetAttribute");
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuStreamSetAttribute in = {.stream = stream, .attr = attr};
    return gp_call(GP_CALL_cuStreamSetAttribute, WANT, &in, sizeof in, value, STREAM_ATTR_BYTES, NULL, 0, NULL, 0);
}

/* ---- host functions: run here when the worker's stream reaches them (shim.c) ------------------------ */

static CUresult host_call(int kind, uint32_t call, uint64_t stream, void *fn, void *data) {
    if (!fn) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = gp_callbacks_start();
    if (r != CUDA_SUCCESS) return r;
    int32_t capturing = 0; /* a host node of the graph being captured: it runs at every launch */
    if (cuStreamIsCapturing(stream, &capturing) != CUDA_SUCCESS) capturing = 0;
    uint64_t id = gp_host_call_add(kind, fn, data, stream, capturing != 0);
    if (!id) return CUDA_ERROR_OUT_OF_MEMORY;
    struct gp_in_cuLaunchHostFunc in = {.stream = stream, .id = id};
    r = gp_call(call, 0, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
    if (r != CUDA_SUCCESS) gp_host_call_drop(id);
    return r;
}

CUresult cuLaunchHostFunc(uint64_t stream, void *fn, void *data) {
    GP_TRACE("cuLaunchHostFunc");
    return host_call(0, GP_CALL_cuLaunchHostFunc, stream, fn, data);
}

/* CU_HOST_TASK_BLOCKING or CU_HOST_TASK_SPINWAIT: how the worker's driver waits for the stream, not what
 * the program sees, so either runs as cuLaunchHostFunc. */
CUresult cuLaunchHostFunc_v2(uint64_t stream, void *fn, void *data, uint32_t sync_mode) {
    GP_TRACE("cuLaunchHostFunc_v2");
    if (sync_mode > 1) return CUDA_ERROR_INVALID_VALUE;
    return host_call(0, GP_CALL_cuLaunchHostFunc, stream, fn, data);
}

CUresult cuStreamAddCallback(uint64_t stream, void *callback, void *data, uint32_t flags) {
    GP_TRACE("cuStreamAddCallback");
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE; /* reserved, as the driver says */
    return host_call(1, GP_CALL_cuStreamAddCallback, stream, callback, data);
}

CUresult cuMemPoolSetAttribute(uint64_t pool, int32_t attr, void *value) {
    GP_TRACE("cuMemPoolSetAttribute");
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    if (gp_pool_is_local(pool)) return gp_pool_attribute_local(pool, attr, value, 1);
    uint64_t v = GP_POOL_ATTRIBUTE_IS_INT(attr) ? (uint64_t)(uint32_t) * (int *)value : *(uint64_t *)value;
    struct gp_in_cuMemPoolSetAttribute in = {.pool = pool, .attr = attr, .value = v};
    return gp_call(GP_CALL_cuMemPoolSetAttribute, WANT, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
}

CUresult cuMemPoolTrimTo(uint64_t pool, uint64_t min_bytes_to_keep) {
    GP_TRACE("cuMemPoolTrimTo");
    if (gp_pool_is_local(pool)) return CUDA_SUCCESS; /* it keeps nothing to trim */
    struct gp_in_cuMemPoolTrimTo in = {.pool = pool, .min_bytes_to_keep = min_bytes_to_keep};
    return gp_call(GP_CALL_cuMemPoolTrimTo, WANT, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
}

CUresult cuMemPoolDestroy(uint64_t pool) {
    GP_TRACE("cuMemPoolDestroy");
    if (gp_pool_is_local(pool)) return gp_pool_destroy_local(pool);
    if (gp_pool_forget_imported(pool)) return CUDA_SUCCESS; /* another worker's: its exporter destroys it */
    struct gp_in_cuMemPoolDestroy in = {.pool = pool};
    return gp_call(GP_CALL_cuMemPoolDestroy, WANT, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
}

CUresult cuMemPoolGetAttribute(uint64_t pool, int32_t attr, void *value) {
    GP_TRACE("cuMemPoolGetAttribute");
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    if (gp_pool_is_local(pool)) return gp_pool_attribute_local(pool, attr, value, 0);
    struct gp_in_cuMemPoolGetAttribute in = {.pool = pool, .attr = attr};
    struct gp_out_cuMemPoolGetAttribute out;
    CUresult r = CALL(cuMemPoolGetAttribute, WANT, in, out);
    if (r == CUDA_SUCCESS) {
        if (GP_POOL_ATTRIBUTE_IS_INT(attr)) *(int *)value = (int)out.value;
        else *(uint64_t *)value = out.value;
    }
    return r;
}

/* ---- events' elapsed times: many pairs in one round trip ---------------------------------------------
 * A benchmark harness (triton's do_bench, torch.utils.benchmark) records a start and an end event around
 * each of hundreds of launches, synchronises once, then asks the elapsed time of every pair: natively a
 * local computation each, here a round trip each. So the records are noted as they are sent, and an
 * elapsed time the shim has no answer for asks the worker, in one request (gpEventElapsedMany), for the
 * asked pair and every pair of consecutive records on one stream since the last such request; the
 * answers are kept (shim_memo.c, group "elapsed": only successes, until an event is recorded again, made
 * or destroyed, a graph is launched or a context reset), so the next pairs asked are answered here. */

enum { RECENT_RECORDS = 2048, RECENT_STREAMS = 64 }; /* the newest records, on up to so many streams */
static struct {
    uint64_t event, stream;
} recent[RECENT_RECORDS];
static uint64_t n_recent; /* noted since the last request; the newest RECENT_RECORDS of them kept */
static pthread_mutex_t recent_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t ask_lock = PTHREAD_MUTEX_INITIALIZER; /* one request (and its buffers) at a time */

void gp_event_recorded(uint64_t event, uint64_t stream) {
    pthread_mutex_lock(&recent_lock);
    recent[n_recent++ % RECENT_RECORDS] = (typeof(recent[0])){event, stream};
    pthread_mutex_unlock(&recent_lock);
}

/* ---- interprocess events: their records are not held -----------------------------------------------
 * The shim holds unanswered frames a moment to send them together (shim.c, held_append_locked).
 * Another process of the lease may query or wait on an interprocess event as soon as this one's record
 * returns (PyTorch's CUDA tensors shared between processes: the producer records, the consumer waits), so a
 * record of one this process made interprocess, or opened, goes out at once with what is held before it.
 * Kept for the process's life: a handle the worker reuses after a destroy only costs an early send. */
static uint64_t *interprocess;
static size_t n_interprocess, interprocess_room;
static pthread_mutex_t interprocess_lock = PTHREAD_MUTEX_INITIALIZER;

void gp_event_interprocess(uint64_t event) {
    pthread_mutex_lock(&interprocess_lock);
    size_t i = 0;
    while (i < n_interprocess && interprocess[i] != event) i++;
    if (i == n_interprocess && n_interprocess == interprocess_room) {
        size_t room = interprocess_room ? 2 * interprocess_room : 16;
        uint64_t *grown = realloc(interprocess, room * sizeof *grown);
        if (grown) interprocess = grown, interprocess_room = room;
    }
    if (i == n_interprocess && n_interprocess < interprocess_room) interprocess[n_interprocess++] = event;
    pthread_mutex_unlock(&interprocess_lock);
}

int gp_event_is_interprocess(uint64_t event) {
    if (!__atomic_load_n(&n_interprocess, __ATOMIC_RELAXED)) return 0;
    pthread_mutex_lock(&interprocess_lock);
    size_t i = 0;
    while (i < n_interprocess && interprocess[i] != event) i++;
    int found = i < n_interprocess;
    pthread_mutex_unlock(&interprocess_lock);
    return found;
}

/* ---- events the program's own values name ------------------------------------------------------------
 *
 * A framework makes events as it goes (a graphed callable's cross-stream waits several a step, PyTorch's
 * pinned-memory allocator one a step, a benchmark harness two a repetition). Natively cuEventCreate waits
 * for nothing; here any call that waits for the worker waits for every frame before it, and in a GPU-bound
 * loop the worker is held by a full GPU queue, so each wait drained the pipeline (a batch of 16 fresh
 * events: 1.1 ms, bench/RESULTS.md). So the shim names the event itself and sends its making unanswered
 * (gpEventCreateNamed): the worker makes a real event in the thread's context and maps the name to it for
 * every later call, as it maps a moved lease's handles. A name: GP_EVENT_NAME_TAG in the top byte (a
 * kernel-half address, which no driver handle in a process takes), the process's random 24-bit prefix
 * (two processes of a lease cannot collide unnoticed: the worker refuses a name it already has), a count.
 * Making can still fail (no memory): the next synchronising call says so, as for a launch. Interprocess
 * events (another process opens the worker's own event by its value), flags the driver would refuse, and
 * a thread with no context ask the worker, one by one. */
enum { CU_EVENT_INTERPROCESS = 4, CU_EVENT_KNOWN_FLAGS = 7 };
static uint64_t name_prefix; /* 0: not drawn yet (this process, or a child after fork) */
static uint32_t names_given;
static pthread_mutex_t name_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t next_event_name(void) {
    pthread_mutex_lock(&name_lock);
    if (!name_prefix) {
        uint32_t r = 0;
        if (gp_auth_nonce((unsigned char *)&r, sizeof r) < 0) r = (uint32_t)getpid() * 2654435761u ^ (uint32_t)time(NULL);
        name_prefix = GP_EVENT_NAME_TAG << 56 | (uint64_t)(r & 0xffffffu) << 32;
        names_given = 0;
    }
    uint64_t name = name_prefix | ++names_given; /* 4 G names a process before the count comes round */
    pthread_mutex_unlock(&name_lock);
    return name;
}

CUresult cuEventCreate(uint64_t *event, uint32_t flags) {
    GP_TRACE("cuEventCreate");
    if (!event) return CUDA_ERROR_INVALID_VALUE;
    if (!gp_ctx_current() || (flags & CU_EVENT_INTERPROCESS) || (flags & ~(uint32_t)CU_EVENT_KNOWN_FLAGS)) {
        struct gp_in_cuEventCreate in = {.flags = flags};
        struct gp_out_cuEventCreate out;
        CUresult r = gp_call(GP_CALL_cuEventCreate, GP_FLAG_WANTS_REPLY, &in, sizeof in, NULL, 0, &out, sizeof out,
                             NULL, 0);
        if (r == CUDA_SUCCESS) *event = out.event;
        if (r == CUDA_SUCCESS && (flags & CU_EVENT_INTERPROCESS)) gp_event_interprocess(out.event);
        return r;
    }
    struct gp_in_gpEventCreateNamed in = {.flags = flags, .name = next_event_name()};
    CUresult r = gp_call(GP_CALL_gpEventCreateNamed, 0, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
    if (r == CUDA_SUCCESS) *event = in.name;
    return r;
}

void gp_events_after_fork_in_child(void) { /* the parent's events are not the child's lease's */
    pthread_mutex_init(&interprocess_lock, NULL);
    n_interprocess = 0;
    pthread_mutex_init(&recent_lock, NULL);
    pthread_mutex_init(&ask_lock, NULL);
    n_recent = 0;
    pthread_mutex_init(&name_lock, NULL);
    name_prefix = 0; /* the child draws its own: its names must not be the parent's */
}

/* The asked pair first, then each pair of consecutive records on one stream among the newest noted since
 * the last request (taken): how many, at most `most`. */
static uint32_t candidate_pairs(uint64_t start, uint64_t end, struct gp_event_pair *pairs, uint32_t most) {
    uint64_t streams[RECENT_STREAMS], last[RECENT_STREAMS];
    uint32_t n_streams = 0, n = 0;
    pairs[n++] = (struct gp_event_pair){start, end};
    pthread_mutex_lock(&recent_lock);
    uint64_t oldest = n_recent > RECENT_RECORDS ? n_recent - RECENT_RECORDS : 0;
    for (uint64_t k = oldest; k < n_recent && n < most; k++) {
        uint64_t event = recent[k % RECENT_RECORDS].event, stream = recent[k % RECENT_RECORDS].stream;
        uint32_t s = 0;
        while (s < n_streams && streams[s] != stream) s++;
        if (s == n_streams) {
            if (n_streams == RECENT_STREAMS) continue; /* more streams than that: theirs are asked one by one */
            streams[n_streams++] = stream;
        } else if (!(last[s] == start && event == end)) {
            pairs[n++] = (struct gp_event_pair){last[s], event};
        }
        last[s] = event;
    }
    n_recent = 0;
    pthread_mutex_unlock(&recent_lock);
    return n;
}

static CUresult elapsed(uint32_t call, float *ms, uint64_t start, uint64_t end) {
    if (!ms) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuEventElapsedTime key = {.start = start, .end = end};
    CUresult r;
    if (gp_memo_get(call, GP_MEMO_elapsed, 0, &key, sizeof key, ms, sizeof *ms, &r)) return r;
    uint64_t epoch = gp_memo_epoch(GP_MEMO_elapsed);
    static struct gp_event_pair pairs[GP_MAX_EVENT_PAIRS]; /* under ask_lock */
    static struct gp_event_elapsed answers[GP_MAX_EVENT_PAIRS];
    pthread_mutex_lock(&ask_lock);
    uint32_t n = candidate_pairs(start, end, pairs, GP_MAX_EVENT_PAIRS);
    struct gp_in_gpEventElapsedMany in = {.count = n};
    r = gp_call(GP_CALL_gpEventElapsedMany, GP_FLAG_WANTS_REPLY, &in, sizeof in, pairs, n * sizeof *pairs, NULL, 0,
                answers, n * sizeof *answers);
    for (uint32_t i = 0; r == CUDA_SUCCESS && i < n; i++) {
        struct gp_in_cuEventElapsedTime pair = {.start = pairs[i].start, .end = pairs[i].end};
        gp_memo_put(call, GP_MEMO_elapsed, 0, epoch, 0, -1, answers[i].result, &pair, sizeof pair, &answers[i].ms,
                    sizeof answers[i].ms);
    }
    if (r == CUDA_SUCCESS && (r = answers[0].result) == CUDA_SUCCESS) *ms = answers[0].ms;
    pthread_mutex_unlock(&ask_lock);
    return r;
}

CUresult cuEventElapsedTime(float *ms, uint64_t start, uint64_t end) {
    GP_TRACE("cuEventElapsedTime");
    return elapsed(GP_CALL_cuEventElapsedTime, ms, start, end);
}

CUresult cuEventElapsedTime_v2(float *ms, uint64_t start, uint64_t end) {
    GP_TRACE("cuEventElapsedTime_v2");
    return elapsed(GP_CALL_cuEventElapsedTime_v2, ms, start, end);
}
