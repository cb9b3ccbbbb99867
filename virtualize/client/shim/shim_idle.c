/* gpupool's libcuda.so.1: synchronisations the client answers itself, because nothing can be pending.
 *
 * A program reads a result back with a copy to pageable memory and then synchronises the stream
 * (cudaMemcpyAsync into a NumPy array, then cudaStreamSynchronize); a benchmark synchronises the
 * context after each synchronous copy. (PyTorch 2.11's `.item()` copies into page-locked memory:
 * that copy is still under way when it returns, and its synchronise asks.) The copy came back with its bytes, so the stream
 * had reached it; if nothing else went to the worker since, the synchronise has nothing to wait for and
 * would cost a round trip to learn it. Natively it returns at once.
 *
 * The rule has no list of calls that make work: every frame sent to the worker (send_frame, whatever
 * path sent it) moves a generation, except frames of calls that leave no work on any stream when they
 * return — kept answers and attribute setters (gp_call_keeps_answer, generated from the call table),
 * the synchronisations and queries themselves, and copies to the host the worker answered with their
 * bytes (over the socket or through the memory shared with a worker on this host). A successful
 * synchronise (or copy back) marks its stream (with the current context: 0, 1 and 2 name a stream of
 * whichever context is current), or its context, with the generation it started in; a later synchronise
 * of the same stream or context in that same generation, within 100 ms of the worker's answer
 * (GPUPOOL_SHIM_IDLE_FRESH_MS), is answered CUDA_SUCCESS here. Errors cannot have arisen since: nothing ran. Not answered here while the
 * process has mirrored memory (a synchronise moves the host's writes to the device, shim_managed.c). */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "shim.h"

#define STREAM_MARKS 8
/* A mark is trusted this long after the worker answered: a synchronise after a pause asks again, so an
 * idle program still learns that its lease moved (the old worker exits once its processes came back) or
 * that the worker is gone. */
static uint64_t fresh_ns(void) {
    static uint64_t value;
    if (!value) { /* GPUPOOL_SHIM_IDLE_FRESH_MS: the trust, ms (default 100; 0: never answer here) */
        const char *env = getenv("GPUPOOL_SHIM_IDLE_FRESH_MS");
        value = (env && *env ? strtoull(env, NULL, 10) : 100) * 1000000ull + 1;
    }
    return value - 1;
}

static uint64_t generation = 1; /* moved by every frame that may leave work behind */
static pthread_mutex_t marks_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    uint64_t stream, ctx, generation, at; /* ctx: 0, 1 and 2 name a stream of the current context */
} stream_marks[STREAM_MARKS];
static unsigned next_mark;
static uint64_t ctx_mark_ctx, ctx_mark_generation, ctx_mark_at;

static uint64_t monotonic_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}
static uint64_t answered[GP_N_CALLS]; /* for GPUPOOL_SHIM_PROFILE's "kept" column */

uint64_t gp_idle_kept(uint32_t call) { return call < GP_N_CALLS ? __atomic_load_n(&answered[call], __ATOMIC_RELAXED) : 0; }

static int completes(uint32_t call, uint32_t flags) {
    switch (call) {
    case GP_CALL_cuCtxSynchronize: case GP_CALL_cuCtxSynchronize_v2: case GP_CALL_cuStreamSynchronize:
    case GP_CALL_cuStreamQuery: case GP_CALL_cuEventSynchronize: case GP_CALL_cuEventQuery:
        return 1;
    case GP_CALL_cuMemcpyDtoH_v2: case GP_CALL_cuMemcpyDtoHAsync_v2: case GP_CALL_gpShmDtoH:
        return (flags & GP_FLAG_WANTS_REPLY) != 0; /* the reply carries the bytes: the copy is done */
    case GP_CALL_gpShmHtoD: /* pieces of one copy, the last answered once its stream has done it */
        return 1;
    default:
        return 0;
    }
}

void gp_idle_frame(uint32_t call, uint32_t flags) {
    if (call < GP_N_CALLS && (gp_call_keeps_answer[call] || completes(call, flags))) return;
    __atomic_add_fetch(&generation, 1, __ATOMIC_ACQ_REL);
}

uint64_t gp_idle_generation(void) { return __atomic_load_n(&generation, __ATOMIC_ACQUIRE); }

/* The stream a synchronise or a copy back is about, from its in-arguments; 0 is the legacy stream. */
static uint64_t stream_of(uint32_t call, const void *args) {
    switch (call) {
    case GP_CALL_cuStreamSynchronize: case GP_CALL_cuStreamQuery:
        return ((const struct gp_in_cuStreamSynchronize *)args)->stream;
    case GP_CALL_cuMemcpyDtoHAsync_v2:
        return ((const struct gp_in_cuMemcpyDtoHAsync_v2 *)args)->stream;
    default:
        return 0;
    }
}

static int is_context_wide(uint32_t call) { return call == GP_CALL_cuCtxSynchronize || call == GP_CALL_cuCtxSynchronize_v2; }

/* The context a context-wide synchronise is about: cuCtxSynchronize_v2's argument, else the current one. */
static uint64_t ctx_of(uint32_t call, const void *args) {
    uint64_t ctx = call == GP_CALL_cuCtxSynchronize_v2 ? ((const struct gp_in_cuCtxSynchronize_v2 *)args)->ctx : 0;
    return ctx ? ctx : gp_ctx_current();
}

static int marks_stream(uint32_t call) {
    return call == GP_CALL_cuStreamSynchronize || call == GP_CALL_cuStreamQuery || call == GP_CALL_cuMemcpyDtoH_v2 ||
           call == GP_CALL_cuMemcpyDtoHAsync_v2;
}

int gp_idle_answers(uint32_t call, const void *args) {
    int stream_wide = call == GP_CALL_cuStreamSynchronize || call == GP_CALL_cuStreamQuery;
    if ((!stream_wide && !is_context_wide(call)) || gp_managed_count() || !fresh_ns()) return 0;
    uint64_t now = gp_idle_generation(), fresh_since = monotonic_ns() - fresh_ns();
    int idle = 0;
    pthread_mutex_lock(&marks_lock);
    if (is_context_wide(call)) {
        idle = ctx_mark_generation == now && ctx_mark_ctx == ctx_of(call, args) && ctx_mark_at > fresh_since;
    } else {
        uint64_t stream = stream_of(call, args), ctx = gp_ctx_current();
        for (unsigned i = 0; i < STREAM_MARKS && !idle; i++)
            idle = stream_marks[i].generation == now && stream_marks[i].stream == stream &&
                   stream_marks[i].ctx == ctx && stream_marks[i].at > fresh_since;
    }
    pthread_mutex_unlock(&marks_lock);
    if (idle) __atomic_add_fetch(&answered[call], 1, __ATOMIC_RELAXED);
    return idle;
}

void gp_idle_stream_done(uint64_t stream, uint64_t started) {
    pthread_mutex_lock(&marks_lock);
    if (gp_idle_generation() == started) {
        stream_marks[next_mark].stream = stream;
        stream_marks[next_mark].ctx = gp_ctx_current();
        stream_marks[next_mark].at = monotonic_ns();
        stream_marks[next_mark].generation = started;
        next_mark = (next_mark + 1) % STREAM_MARKS;
    }
    pthread_mutex_unlock(&marks_lock);
}

void gp_idle_done(uint32_t call, uint32_t flags, const void *args, uint64_t started, CUresult r) {
    if (r != CUDA_SUCCESS || !completes(call, flags) || gp_idle_generation() != started) return;
    if (marks_stream(call)) {
        gp_idle_stream_done(stream_of(call, args), started);
    } else if (is_context_wide(call)) {
        pthread_mutex_lock(&marks_lock);
        ctx_mark_ctx = ctx_of(call, args);
        ctx_mark_generation = started;
        ctx_mark_at = monotonic_ns();
        pthread_mutex_unlock(&marks_lock);
    }
}
