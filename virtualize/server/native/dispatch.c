/* The worker's native hot path: frames of the calls a training loop sends most, served in C.
 *
 * The worker's Python loop (virtualize/server/worker.py) hands its connection's socket (and its TLS stream,
 * tls.c, when the connection is encrypted, or its command ring, gp_ring.h, when a program on this host
 * asked for one: then the frames come from the ring and the answers go into it) and receive buffer to
 * gpf_serve, which reads frames and
 * runs, without Python, the ones it can answer exactly as the Python path would: kernel launches of
 * functions the Python path has already launched once (their parameter layout is known), graph launches,
 * event records, waits and elapsed times (many pairs at once too), memsets, copies up to 1 MiB in the
 * frame, copies through the client's page-locked memory shared on this host (gpPinnedCopy) and through the
 * memory a connection shares with its process (gpShmHtoD, gpShmDtoH), and the synchronising calls
 * (stream/event/context synchronise and query) when no earlier asynchronous error and nothing else is to
 * be said first. Handles
 * are checked against the lease's own objects, mirrored here by virtualize/server/_native_dispatch.py from the
 * guard's tables: a handle the guard has never seen, or has forgotten, is never passed to the driver.
 * Every other frame, and every case the Python path answers differently, goes back to Python untouched:
 * gpf_serve returns with the buffer positioned at that frame's header.
 *
 * The frame layout, the served calls' ids and argument offsets, and the guard's checks of each argument
 * (handles by kind, builtin streams, device ranges, copies a capture refuses) are generated from the
 * Python tables the guard itself reads (dispatch_gen.h, by `python -m virtualize.common._shimgen`): this file
 * applies them and types none of them. No Python API and no CUDA headers: the Python side drives it
 * through ctypes (which lets go of the GIL for the whole call), and the driver's entry points are looked
 * up in the libcuda.so.1 the worker has loaded. A worker without a GPU (the host executor) passes its own
 * functions instead, so the same loop is tested where there is no driver. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../../common/include/gp_ranges.h"
#include "../../common/include/gp_ring.h"
#include "dispatch_gen.h"
#include "native.h"

#define EXPORT __attribute__((visibility("default")))

enum { HEADER = GPF_REQUEST_BYTES, REPLY = GPF_REPLY_BYTES, ATTR_BYTES = GPF_LAUNCH_ATTRIBUTE_BYTES };
enum { KIND_STREAM, KIND_EVENT, KIND_FUNC, KIND_GRAPHEXEC, KINDS };
/* Why gpf_serve returned. */
enum { TO_PYTHON = 0, ASYNC_ERROR = 1, CLOSED = 2, IO_ERROR = 3, SERVED = 4, REPLY_AFTER_OUTPUT = 5, SHARED_ERROR = 6 };
/* SHARED_ERROR: a piece of a copy through the connection's shared memory (gpShmHtoD, not its last) failed:
 * the Python path keeps the error for the copy's answer. */
/* REPLY_AFTER_OUTPUT with bytes: a copy to the host whose reply (result, then the bytes at
 * outcome.data) follows the kernel output. */
/* The calls served here (C_LAUNCH ...) and their rules: gpf_calls, in dispatch_gen.h. */
enum { SMALL_COPY = 1 << 20 }; /* larger copies go through shared memory or Python's chunked path */

/* -- how calls are executed: the driver's entry points, or the host executor's functions ------------- */

typedef int (*launch_fn)(uint64_t func, const uint32_t dims[7], uint64_t stream, void **args,
                         const uint8_t *params, uint64_t params_len, const void *attrs, uint32_t n_attrs);
/* `args`: the frame's arguments, each widened to 64 bits; `out`: the call's one answered value
 * (cuEventElapsedTime's milliseconds), little-endian. */
typedef int (*call_fn)(uint32_t which, const uint64_t *args, uint64_t *out);
/* C_HTOD..C_DTOH_ASYNC: `count` bytes between device address `device` and `host` (on `stream`, and
 * done on return); C_PINNED_COPY: between `device` and the worker's mapping of the client's shared
 * page-locked memory (`flags` as gpPinnedCopy's: 1 to the device, 2 synchronous, else queued on `stream`);
 * C_SHM_HTOD: from the connection's shared memory to `device` (flags as gpShmHtoD's: 1 the copy's last
 * piece, read by the DMA on return; 2 on `stream`, else on the legacy stream); C_SHM_DTOH: a piece from
 * `device` into the connection's shared memory, there on return (flags 2: on `stream`, else the legacy
 * stream; Executor.copy_out_piece). */
typedef int (*copy_fn)(uint32_t which, uint64_t device, void *host, uint64_t count, uint64_t stream, uint32_t flags);
typedef int (*capturing_fn)(uint64_t stream, int *capturing);

struct ops {
    launch_fn launch;
    call_fn call;
    copy_fn copy;
    capturing_fn capturing;
};

static int (*drv_launch)(uint64_t, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t, uint64_t,
                         void **, void **);
static int (*drv_launch_ex)(const void *, uint64_t, void **, void **);
static int (*drv_ctx_sync)(void);
static int (*drv_stream_sync)(uint64_t);  /* cuStreamSynchronize */
static int (*drv_stream_query)(uint64_t);
static int (*drv_event_sync)(uint64_t);
static int (*drv_event_query)(uint64_t);
static int (*drv_event_record)(uint64_t, uint64_t);
static int (*drv_event_record_flags)(uint64_t, uint64_t, uint32_t);
static int (*drv_stream_wait)(uint64_t, uint64_t, uint32_t);
static int (*drv_htod)(uint64_t, const void *, size_t);
static int (*drv_htod_async)(uint64_t, const void *, size_t, uint64_t);
static int (*drv_dtoh)(void *, uint64_t, size_t);
static int (*drv_dtoh_async)(void *, uint64_t, size_t, uint64_t);
static int (*drv_is_capturing)(uint64_t, int *);
static int (*drv_graph_launch)(uint64_t, uint64_t);
static int (*drv_dtod)(uint64_t, uint64_t, size_t);
static int (*drv_dtod_async)(uint64_t, uint64_t, size_t, uint64_t);
static int (*drv_elapsed)(float *, uint64_t, uint64_t); /* cuEventElapsedTime_v2 where the driver has it */
static int (*drv_memset_d8)(uint64_t, uint8_t, size_t);
static int (*drv_memset_d16)(uint64_t, uint16_t, size_t);
static int (*drv_memset_d32)(uint64_t, uint32_t, size_t);
static int (*drv_memset_d8_async)(uint64_t, uint8_t, size_t, uint64_t);
static int (*drv_memset_d16_async)(uint64_t, uint16_t, size_t, uint64_t);
static int (*drv_memset_d32_async)(uint64_t, uint32_t, size_t, uint64_t);
static int (*drv_event_create)(uint64_t *, uint32_t);
static int (*drv_event_destroy)(uint64_t);
static int (*drv_write_value32)(uint64_t, uint64_t, uint32_t, uint32_t); /* cuStreamWriteValue32_v2 */

struct launch_config { /* CUlaunchConfig */
    uint32_t dims[7];
    uint32_t pad;
    uint64_t stream;
    const void *attrs;
    uint32_t n_attrs;
};

static int driver_launch(uint64_t func, const uint32_t d[7], uint64_t stream, void **args, const uint8_t *params,
                         uint64_t params_len, const void *attrs, uint32_t n_attrs) {
    (void)params, (void)params_len;
    if (!n_attrs) return drv_launch(func, d[0], d[1], d[2], d[3], d[4], d[5], d[6], stream, args, NULL);
    struct launch_config config = {.stream = stream, .attrs = attrs, .n_attrs = n_attrs};
    memcpy(config.dims, d, sizeof config.dims);
    return drv_launch_ex(&config, func, args, NULL);
}

static int driver_call(uint32_t which, const uint64_t *args, uint64_t *out) {
    uint64_t a = args[0], b = args[1];
    uint32_t c = (uint32_t)args[2];
    switch (which) {
    case C_GRAPH_LAUNCH: return drv_graph_launch(a, b);
    case C_DTOD: return drv_dtod(a, b, args[2]);
    case C_DTOD_ASYNC: return drv_dtod_async(a, b, args[2], args[3]);
    case C_EVENT_ELAPSED:
    case C_EVENT_ELAPSED_V2: {
        float ms = 0;
        int r = drv_elapsed(&ms, a, b);
        memcpy(out, &ms, sizeof ms);
        return r;
    }
    case C_CTX_SYNC: return drv_ctx_sync();
    case C_STREAM_SYNC: return drv_stream_sync(a);
    case C_STREAM_QUERY: return drv_stream_query(a);
    case C_EVENT_SYNC: return drv_event_sync(a);
    case C_EVENT_QUERY: return drv_event_query(a);
    case C_EVENT_RECORD: return drv_event_record(a, b);
    case C_EVENT_RECORD_FLAGS: return drv_event_record_flags(a, b, c);
    case C_STREAM_WAIT_EVENT: return drv_stream_wait(a, b, c);
    case C_MEMSET_D8: return drv_memset_d8(a, (uint8_t)b, args[2]);
    case C_MEMSET_D16: return drv_memset_d16(a, (uint16_t)b, args[2]);
    case C_MEMSET_D32: return drv_memset_d32(a, (uint32_t)b, args[2]);
    case C_MEMSET_D8_ASYNC: return drv_memset_d8_async(a, (uint8_t)b, args[2], args[3]);
    case C_MEMSET_D16_ASYNC: return drv_memset_d16_async(a, (uint16_t)b, args[2], args[3]);
    case C_MEMSET_D32_ASYNC: return drv_memset_d32_async(a, (uint32_t)b, args[2], args[3]);
    case C_EVENT_CREATE_NAMED: return drv_event_create(out, (uint32_t)a); /* args: flags, the client's name */
    case C_EVENT_DESTROY: return drv_event_destroy(a);
    }
    return 1; /* CUDA_ERROR_INVALID_VALUE */
}

/* The client's shared page-locked memory, as the Python path copies it (CopyCalls.pinned_copy): the
 * worker's DMA straight into or out of it; a synchronous one on the legacy stream, done on return. */
static int driver_pinned_copy(uint64_t device, void *host, uint64_t count, uint64_t stream, uint32_t flags) {
    int synchronous = flags & 2;
    uint64_t on = synchronous ? 0 : stream;
    int r = flags & 1 ? drv_htod_async(device, host, count, on) : drv_dtoh_async(host, device, count, on);
    return r || !synchronous ? r : drv_stream_sync(on);
}

/* Pageable host memory, as the Python path copies it: the driver has taken (or written) the bytes on
 * return; a copy to the host on a stream is waited for. */
static int driver_copy(uint32_t which, uint64_t device, void *host, uint64_t count, uint64_t stream, uint32_t flags) {
    switch (which) {
    case C_SHM_HTOD: { /* as CopyCalls.shm_htod has the executor copy (copy_in_from) */
        uint64_t on = flags & 2 ? stream : 0;
        int r = drv_htod_async(device, host, count, on);
        return r || !(flags & 1) ? r : drv_stream_sync(on);
    }
    case C_SHM_DTOH: { /* as CudaExecutor.copy_out_piece */
        uint64_t on = flags & 2 ? stream : 0;
        int r = drv_dtoh_async(host, device, count, on);
        return r ? r : drv_stream_sync(on);
    }
    case C_PINNED_COPY: return driver_pinned_copy(device, host, count, stream, flags);
    case C_HTOD: return drv_htod(device, host, count);
    case C_HTOD_ASYNC: return drv_htod_async(device, host, count, stream);
    case C_DTOH: return drv_dtoh(host, device, count);
    case C_DTOH_ASYNC: {
        int r = drv_dtoh_async(host, device, count, stream);
        return r ? r : drv_stream_sync(stream);
    }
    }
    return 1;
}

static int driver_capturing(uint64_t stream, int *capturing) { return drv_is_capturing(stream, capturing); }

static const struct ops driver_ops = {driver_launch, driver_call, driver_copy, driver_capturing};

/* The driver the worker's process has loaded (cuda-python opened it): 0, or -1 where there is none. */
EXPORT int gpf_use_driver(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!lib) return -1;
    struct {
        void **slot;
        const char *name;
    } want[] = {
        {(void **)&drv_launch, "cuLaunchKernel"},           {(void **)&drv_launch_ex, "cuLaunchKernelEx"},
        {(void **)&drv_ctx_sync, "cuCtxSynchronize"},       {(void **)&drv_stream_sync, "cuStreamSynchronize"},
        {(void **)&drv_stream_query, "cuStreamQuery"},      {(void **)&drv_event_sync, "cuEventSynchronize"},
        {(void **)&drv_event_query, "cuEventQuery"},        {(void **)&drv_event_record, "cuEventRecord"},
        {(void **)&drv_event_record_flags, "cuEventRecordWithFlags"},
        {(void **)&drv_stream_wait, "cuStreamWaitEvent"},
        {(void **)&drv_htod, "cuMemcpyHtoD_v2"},
        {(void **)&drv_htod_async, "cuMemcpyHtoDAsync_v2"},
        {(void **)&drv_dtoh, "cuMemcpyDtoH_v2"},
        {(void **)&drv_dtoh_async, "cuMemcpyDtoHAsync_v2"},
        {(void **)&drv_is_capturing, "cuStreamIsCapturing"},
        {(void **)&drv_graph_launch, "cuGraphLaunch"},
        {(void **)&drv_dtod, "cuMemcpyDtoD_v2"},
        {(void **)&drv_dtod_async, "cuMemcpyDtoDAsync_v2"},
        {(void **)&drv_elapsed, "cuEventElapsedTime"},
        {(void **)&drv_memset_d8, "cuMemsetD8_v2"},
        {(void **)&drv_memset_d16, "cuMemsetD16_v2"},
        {(void **)&drv_memset_d32, "cuMemsetD32_v2"},
        {(void **)&drv_memset_d8_async, "cuMemsetD8Async"},
        {(void **)&drv_memset_d16_async, "cuMemsetD16Async"},
        {(void **)&drv_memset_d32_async, "cuMemsetD32Async"},
        {(void **)&drv_event_create, "cuEventCreate"},
        {(void **)&drv_event_destroy, "cuEventDestroy_v2"},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        *want[i].slot = dlsym(lib, want[i].name);
        if (!*want[i].slot) return -1;
    }
    void *elapsed_v2 = dlsym(lib, "cuEventElapsedTime_v2"); /* CUDA 12.8+: what cuda-python's name calls */
    if (elapsed_v2) drv_elapsed = (int (*)(float *, uint64_t, uint64_t))elapsed_v2;
    /* only gpf_copy_to_host_marked's (the loop serves without it) */
    drv_write_value32 = (int (*)(uint64_t, uint64_t, uint32_t, uint32_t))dlsym(lib, "cuStreamWriteValue32_v2");
    return 0;
}

/* The call table this loop was generated from: the worker uses it only with the same table. */
EXPORT uint32_t gpf_wire_version(void) { return GPF_WIRE_VERSION; }

/* -- the lease's handles: open-addressed sets of 64-bit keys, a function's layout as the value ------- */

#define TOMB UINT64_MAX

struct layout {
    uint32_t n, min_len;
    uint32_t offsets[]; /* n offsets, then n sizes */
};

struct table {
    uint64_t *keys; /* 0: empty slot, TOMB: removed */
    struct layout **values;
    uint64_t *reals; /* the executor's value of the client's handle after a live migration; 0: the same */
    size_t cap, used; /* used counts tombstones too */
};

struct range {
    uint64_t base, size;
};
_Static_assert(offsetof(struct range, base) == 0, "gp_ranges_upper reads each range's base first");

struct lease {
    pthread_mutex_t lock;
    struct table kinds[KINDS];
    struct range *ranges; /* the lease's memory (the guard's allocations), sorted by base */
    size_t n_ranges, cap_ranges;
    struct ops ops;
    int python_only; /* every frame to Python: the lease is migrating */
    uint64_t moves;  /* live migrations done: a session that began serving before the last one goes to Python */
    uint64_t *moved; /* module globals a move placed elsewhere: (client's base, size, executor's base) each */
    size_t n_moved;
    int events_here; /* named events are made and destroyed here (the executor keeps a name map) */
    struct event_note *notes; /* what Python's tables have not yet heard of (gpf_events_take) */
    size_t n_notes, cap_notes;
};

/* A named event made here (its executor's handle, the client's context then, its flags), or one
 * destroyed here that Python's tables hold (made: 0). */
struct event_note {
    uint64_t made, name, real, ctx, flags;
};

static size_t slot_of(const struct table *t, uint64_t key) {
    size_t mask = t->cap - 1, i = (size_t)(key * 0x9E3779B97F4A7C15ull >> 17) & mask;
    while (t->keys[i] && t->keys[i] != key) i = (i + 1) & mask;
    return i;
}

static int table_has(const struct table *t, uint64_t key, struct layout **value) {
    if (!t->cap || !key || key == TOMB) return 0;
    size_t i = slot_of(t, key);
    if (t->keys[i] != key) return 0;
    if (value) *value = t->values[i];
    return 1;
}

/* The value to hand the executor for the client's `key` (one of the table's). */
static uint64_t table_real(const struct table *t, uint64_t key) {
    if (!t->cap || !key || key == TOMB) return key;
    size_t i = slot_of(t, key);
    return t->keys[i] == key && t->reals[i] ? t->reals[i] : key;
}

static void table_put(struct table *t, uint64_t key, struct layout *value);

static int table_grow(struct table *t) {
    struct table bigger = {0};
    bigger.cap = t->cap ? t->cap * 2 : 64;
    while (bigger.cap / 2 < t->used) bigger.cap *= 2;
    bigger.keys = calloc(bigger.cap, sizeof *bigger.keys);
    bigger.values = calloc(bigger.cap, sizeof *bigger.values);
    bigger.reals = calloc(bigger.cap, sizeof *bigger.reals);
    if (!bigger.keys || !bigger.values || !bigger.reals) {
        free(bigger.keys), free(bigger.values), free(bigger.reals);
        return -1;
    }
    for (size_t i = 0; i < t->cap; i++)
        if (t->keys[i] && t->keys[i] != TOMB) {
            table_put(&bigger, t->keys[i], t->values[i]);
            bigger.reals[slot_of(&bigger, t->keys[i])] = t->reals[i];
        }
    free(t->keys), free(t->values), free(t->reals);
    *t = bigger;
    return 0;
}

static void table_put(struct table *t, uint64_t key, struct layout *value) {
    if (!key || key == TOMB) {
        free(value);
        return;
    }
    if ((t->used + 1) * 2 > t->cap && table_grow(t) < 0) {
        free(value);
        return; /* not mirrored: its calls take the Python path */
    }
    size_t mask = t->cap - 1, i = (size_t)(key * 0x9E3779B97F4A7C15ull >> 17) & mask, tomb = SIZE_MAX;
    while (t->keys[i] && t->keys[i] != key) {
        if (t->keys[i] == TOMB && tomb == SIZE_MAX) tomb = i;
        i = (i + 1) & mask;
    }
    if (t->keys[i] == key) { /* known: a new layout, the same executor's value */
        free(t->values[i]);
        t->values[i] = value;
        return;
    }
    if (tomb != SIZE_MAX) i = tomb;
    else t->used++;
    t->keys[i] = key;
    t->values[i] = value;
    t->reals[i] = 0;
}

static void table_drop(struct table *t, uint64_t key) {
    if (!t->cap || !key || key == TOMB) return;
    size_t i = slot_of(t, key);
    if (t->keys[i] != key) return;
    t->keys[i] = TOMB;
    free(t->values[i]);
    t->values[i] = NULL;
    t->reals[i] = 0;
}

static void table_clear(struct table *t) {
    for (size_t i = 0; i < t->cap; i++) free(t->values[i]);
    free(t->keys), free(t->values), free(t->reals);
    memset(t, 0, sizeof *t);
}

/* ops: NULL for the driver (gpf_use_driver first), else the host executor's functions. */
EXPORT struct lease *gpf_lease_new(launch_fn launch, call_fn call, copy_fn copy, capturing_fn capturing) {
    struct lease *l = calloc(1, sizeof *l);
    if (!l) return NULL;
    pthread_mutex_init(&l->lock, NULL);
    l->ops = launch && call && copy && capturing ? (struct ops){launch, call, copy, capturing} : driver_ops;
    return l;
}

/* The first range whose base is above `ptr` (under the lock). */
static size_t range_after(const struct lease *l, uint64_t ptr) {
    return gp_ranges_upper(l->ranges, l->n_ranges, sizeof *l->ranges, ptr);
}

/* [ptr, ptr + count) inside one allocation of the lease, as the guard's _check_range says. */
static int range_ok(const struct lease *l, uint64_t ptr, uint64_t count) {
    size_t i = range_after(l, ptr);
    if (!i) return 0;
    const struct range *r = &l->ranges[i - 1];
    return gp_range_holds(r->base, r->size, ptr) && count <= r->base + r->size - ptr;
}

EXPORT void gpf_range_drop(struct lease *l, uint64_t base) {
    pthread_mutex_lock(&l->lock);
    size_t i = range_after(l, base);
    if (i && l->ranges[i - 1].base == base) {
        memmove(&l->ranges[i - 1], &l->ranges[i], (l->n_ranges - i) * sizeof *l->ranges);
        l->n_ranges--;
    }
    pthread_mutex_unlock(&l->lock);
}

EXPORT void gpf_range_add(struct lease *l, uint64_t base, uint64_t size) {
    gpf_range_drop(l, base);
    pthread_mutex_lock(&l->lock);
    if (l->n_ranges == l->cap_ranges) {
        size_t cap = l->cap_ranges ? l->cap_ranges * 2 : 256;
        struct range *bigger = realloc(l->ranges, cap * sizeof *bigger);
        if (!bigger) { /* not mirrored: copies into it take the Python path */
            pthread_mutex_unlock(&l->lock);
            return;
        }
        l->ranges = bigger, l->cap_ranges = cap;
    }
    size_t i = range_after(l, base);
    memmove(&l->ranges[i + 1], &l->ranges[i], (l->n_ranges - i) * sizeof *l->ranges);
    l->ranges[i] = (struct range){base, size};
    l->n_ranges++;
    pthread_mutex_unlock(&l->lock);
}

EXPORT void gpf_lease_free(struct lease *l) {
    free(l->notes);
    free(l->ranges);
    free(l->moved);
    for (int k = 0; k < KINDS; k++) table_clear(&l->kinds[k]);
    pthread_mutex_destroy(&l->lock);
    free(l);
}

EXPORT void gpf_handle_add(struct lease *l, int kind, uint64_t handle) {
    if (kind < 0 || kind >= KINDS || kind == KIND_FUNC) return;
    pthread_mutex_lock(&l->lock);
    table_put(&l->kinds[kind], handle, NULL);
    pthread_mutex_unlock(&l->lock);
}

EXPORT void gpf_handle_drop(struct lease *l, int kind, uint64_t handle) {
    if (kind < 0 || kind >= KINDS) return;
    pthread_mutex_lock(&l->lock);
    table_drop(&l->kinds[kind], handle);
    pthread_mutex_unlock(&l->lock);
}

/* After a live migration the client's `handle` names the executor's `real` (the same value: unmapped);
 * the frames C serves pass `real` on. A handle the table does not hold is left alone. */
EXPORT void gpf_handle_map(struct lease *l, int kind, uint64_t handle, uint64_t real) {
    if (kind < 0 || kind >= KINDS) return;
    pthread_mutex_lock(&l->lock);
    struct table *t = &l->kinds[kind];
    if (t->cap && handle && handle != TOMB) {
        size_t i = slot_of(t, handle);
        if (t->keys[i] == handle) t->reals[i] = real == handle ? 0 : real;
    }
    pthread_mutex_unlock(&l->lock);
}

EXPORT void gpf_handle_clear(struct lease *l, int kind) {
    if (kind < 0 || kind >= KINDS) return;
    pthread_mutex_lock(&l->lock);
    table_clear(&l->kinds[kind]);
    pthread_mutex_unlock(&l->lock);
}

/* Whether named events are made and destroyed here: only where the executor maps names (else Python
 * refuses them, and so the loop leaves them to it). */
EXPORT void gpf_lease_events_here(struct lease *l, int on) { __atomic_store_n(&l->events_here, on, __ATOMIC_SEQ_CST); }

/* Notes not yet taken, so Python need not take the lock to learn there are none. */
EXPORT size_t gpf_events_noted(struct lease *l) { return __atomic_load_n(&l->n_notes, __ATOMIC_SEQ_CST); }

/* Up to `cap` notes, oldest first, into `out` (5 values each: made, name, real, ctx, flags); how many. */
EXPORT size_t gpf_events_take(struct lease *l, uint64_t *out, size_t cap) {
    pthread_mutex_lock(&l->lock);
    size_t n = l->n_notes < cap ? l->n_notes : cap;
    memcpy(out, l->notes, n * sizeof *l->notes);
    memmove(l->notes, l->notes + n, (l->n_notes - n) * sizeof *l->notes);
    __atomic_store_n(&l->n_notes, l->n_notes - n, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&l->lock);
    return n;
}

/* Room for one more note, made before the call it is about (the call cannot be undone); under the lock. */
static int notes_room(struct lease *l) {
    if (l->n_notes < l->cap_notes) return 0;
    size_t cap = l->cap_notes ? 2 * l->cap_notes : 64;
    struct event_note *more = realloc(l->notes, cap * sizeof *more);
    if (!more) return -1;
    l->notes = more, l->cap_notes = cap;
    return 0;
}

static int event_note(struct lease *l, struct event_note note) { /* under the lock */
    if (notes_room(l) < 0) return -1;
    l->notes[l->n_notes] = note;
    __atomic_store_n(&l->n_notes, l->n_notes + 1, __ATOMIC_SEQ_CST);
    return 0;
}

/* A function the Python path has launched: its parameters' offsets and sizes, and the bytes they need. */
EXPORT void gpf_function_add(struct lease *l, uint64_t func, uint32_t n, const uint32_t *offsets,
                             const uint32_t *sizes, uint32_t min_len) {
    struct layout *layout = malloc(sizeof *layout + 2 * (size_t)n * sizeof(uint32_t));
    if (!layout) return;
    layout->n = n;
    layout->min_len = min_len;
    memcpy(layout->offsets, offsets, (size_t)n * sizeof(uint32_t));
    memcpy(layout->offsets + n, sizes, (size_t)n * sizeof(uint32_t));
    pthread_mutex_lock(&l->lock);
    table_put(&l->kinds[KIND_FUNC], func, layout);
    pthread_mutex_unlock(&l->lock);
}

/* The module globals a move placed at another address (`n` triples: the client's base, size, the executor's
 * base; sorted by base, not overlapping): a kernel parameter of 8 bytes inside one is handed over mapped. */
EXPORT void gpf_addresses_moved(struct lease *l, size_t n, const uint64_t *triples) {
    uint64_t *copy = n ? malloc(3 * n * sizeof *copy) : NULL;
    if (n && !copy) n = 0; /* (no memory: parameters go as they are, as before this) */
    if (copy) memcpy(copy, triples, 3 * n * sizeof *copy);
    pthread_mutex_lock(&l->lock);
    free(l->moved);
    l->moved = copy, l->n_moved = n;
    pthread_mutex_unlock(&l->lock);
}

/* A launch's parameters (at `params`, per `layout`): each of 8 bytes that lies in a moved global, mapped
 * (under the lock). */
static void params_mapped(const struct lease *l, const struct layout *layout, uint8_t *params) {
    for (uint32_t i = 0; i < layout->n; i++) {
        if (layout->offsets[layout->n + i] != 8) continue;
        uint64_t v;
        memcpy(&v, params + layout->offsets[i], 8);
        size_t lo = 0, hi = l->n_moved; /* the last range whose base is at or below v */
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (l->moved[3 * mid] <= v) lo = mid + 1;
            else hi = mid;
        }
        if (lo && v - l->moved[3 * (lo - 1)] < l->moved[3 * (lo - 1) + 1]) {
            v = l->moved[3 * (lo - 1) + 2] + (v - l->moved[3 * (lo - 1)]);
            memcpy(params + layout->offsets[i], &v, 8);
        }
    }
}

/* -- kernel output: the worker's stdout pipe, read by a Python thread ------------------------------- */

static int output_fd = -1;
static int output_seen; /* set (atomically) by that thread before it reads, cleared when it is taken */

EXPORT void gpf_output_watch(int fd) { output_fd = fd; }
EXPORT void gpf_output_mark(int seen) { __atomic_store_n(&output_seen, seen, __ATOMIC_SEQ_CST); }

/* Whether a kernel printed something not yet sent: bytes in the pipe, or the reader holding some. */
static int output_waiting(void) {
    if (output_fd < 0) return 0;
    if (__atomic_load_n(&output_seen, __ATOMIC_SEQ_CST)) return 1;
    int n = 0;
    return ioctl(output_fd, FIONREAD, &n) == 0 ? n > 0 : 1;
}

/* -- one connection --------------------------------------------------------------------------------- */

/* A copy into the client's shared page-locked memory queued here and not yet settled: the stream it is
 * on, and the context that was current (the Python path waits for these at gpPinnedSettle and before
 * the memory goes: gpf_pinned_landing). */
struct landing {
    uint64_t stream, ctx;
};
enum { LANDING_STREAMS = 8 }; /* per allocation; a copy on a further stream takes the Python path */

/* One page-locked allocation of the client's that the worker maps too (gpPinnedShare): the client's
 * address range and the worker's mapping of the same pages. */
struct pinned {
    uint64_t base, size;
    uint8_t *mapped;
    uint32_t n_landing;
    struct landing landing[LANDING_STREAMS];
};

/* Used only by its connection's thread (the native loop and the Python path that drives it), so its
 * own tables need no lock. */
struct session {
    struct lease *lease;
    int busy;        /* inside a driver call now (a long synchronise is use of the lease) */
    uint64_t calls;  /* frames served here, ever */
    uint64_t syncs;  /* synchronisations served here that succeeded (a pool gives freed memory back at one) */
    uint8_t *scratch; /* a launch's parameters, aligned */
    size_t scratch_cap;
    uint8_t *copied; /* a small copy to the host: [REPLY header][bytes], SMALL_COPY + REPLY */
    uint8_t *answers; /* gpEventElapsedMany's reply: [REPLY header][an answer per pair] */
    size_t answers_cap;
    uint64_t ctx;    /* the connection's current context (the Python path's, passed to gpf_serve) */
    struct pinned *pinned; /* the connection's shared page-locked allocations */
    size_t n_pinned, cap_pinned;
    uint8_t *shm;     /* the memory the connection shares with its process (gpShmAttach), its size */
    uint64_t shm_size;
    int shm_ok;       /* no piece of a copy through it has failed yet (passed to gpf_serve) */
    uint64_t moves;   /* the lease's moves when this serve began (its thread's context is of then) */
    /* where the loop's time went (gpf_set_stats): serving, reading frames (waiting for and decrypting
     * their bytes), in launches; frames served, reads that had to wait for bytes, launches */
    uint64_t st_serve_ns, st_read_ns, st_launch_ns, st_frames, st_reads, st_launches, st_driver_ns;
};

EXPORT struct session *gpf_session_new(struct lease *l) {
    struct session *s = calloc(1, sizeof *s);
    if (s) s->lease = l;
    return s;
}

EXPORT void gpf_session_free(struct session *s) {
    if (!s) return;
    free(s->scratch);
    free(s->copied);
    free(s->answers);
    free(s->pinned);
    free(s);
}

/* The allocation of the client's shared page-locked memory holding all of [host, host + count), or NULL. */
static struct pinned *pinned_at(const struct session *s, uint64_t host, uint64_t count) {
    for (size_t i = 0; i < s->n_pinned; i++) {
        struct pinned *p = &s->pinned[i];
        if (host >= p->base && count <= p->size && host - p->base <= p->size - count) return p;
    }
    return NULL;
}

static struct pinned *pinned_find(const struct session *s, uint64_t base) {
    for (size_t i = 0; i < s->n_pinned; i++)
        if (s->pinned[i].base == base) return &s->pinned[i];
    return NULL;
}

/* The client's allocation at `base` is the worker's memory at `mapped` too (CopyCalls.pinned_share):
 * 0, or -1 (not mirrored: its copies take the Python path). */
EXPORT int gpf_pinned_add(struct session *s, uint64_t base, uint64_t size, void *mapped) {
    if (pinned_find(s, base)) return -1;
    if (s->n_pinned == s->cap_pinned) {
        size_t cap = s->cap_pinned ? s->cap_pinned * 2 : 16;
        struct pinned *bigger = realloc(s->pinned, cap * sizeof *bigger);
        if (!bigger) return -1;
        s->pinned = bigger, s->cap_pinned = cap;
    }
    s->pinned[s->n_pinned++] = (struct pinned){.base = base, .size = size, .mapped = mapped};
    return 0;
}

/* The copies into the allocation at `base` queued here and not yet waited for, taken (up to
 * LANDING_STREAMS; each stream once, with its context): the caller waits for them. */
EXPORT uint32_t gpf_pinned_landing(struct session *s, uint64_t base, uint64_t *streams, uint64_t *ctxs) {
    struct pinned *p = pinned_find(s, base);
    if (!p) return 0;
    uint32_t n = p->n_landing;
    for (uint32_t i = 0; i < n; i++) streams[i] = p->landing[i].stream, ctxs[i] = p->landing[i].ctx;
    p->n_landing = 0;
    return n;
}

/* The allocation at `base` is no longer shared (its landing copies taken and waited for first). */
EXPORT void gpf_pinned_drop(struct session *s, uint64_t base) {
    struct pinned *p = pinned_find(s, base);
    if (p) *p = s->pinned[--s->n_pinned];
}

/* The memory this connection shares with its process on this host (CopyCalls.shm_attach). */
EXPORT void gpf_shm_set(struct session *s, void *mapped, uint64_t size) {
    s->shm = mapped;
    s->shm_size = size;
}

/* A copy into `p` queued on `stream` is noted for the next settle: 0, or -1 when the allocation has
 * copies on LANDING_STREAMS other streams already. */
static int pinned_note_landing(struct session *s, struct pinned *p, uint64_t stream) {
    for (uint32_t i = 0; i < p->n_landing; i++)
        if (p->landing[i].stream == stream && p->landing[i].ctx == s->ctx) return 0;
    if (p->n_landing == LANDING_STREAMS) return -1;
    p->landing[p->n_landing++] = (struct landing){stream, s->ctx};
    return 0;
}


EXPORT int gpf_session_busy(const struct session *s) { return __atomic_load_n(&s->busy, __ATOMIC_SEQ_CST); }

/* From now on (on: 1) every frame goes to Python. A session that is about to call the driver has said
 * so (busy) before it looks, so once the switch is on and no session is busy, none calls it again. */
EXPORT void gpf_lease_python_only(struct lease *l, int on) { __atomic_store_n(&l->python_only, on, __ATOMIC_SEQ_CST); }

/* The lease has moved (its handles mapped anew: gpf_handle_map) and C serves it again; a session serving
 * since before leaves its next frame to Python, which makes the target's context current on its thread. */
EXPORT void gpf_lease_moved(struct lease *l) {
    __atomic_fetch_add(&l->moves, 1, __ATOMIC_SEQ_CST);
    __atomic_store_n(&l->python_only, 0, __ATOMIC_SEQ_CST);
}

/* Before a driver call: busy, unless the lease's frames are Python's now (0: leave the frame to it). */
static int enter(struct session *s) {
    __atomic_store_n(&s->busy, 1, __ATOMIC_SEQ_CST);
    if (!__atomic_load_n(&s->lease->python_only, __ATOMIC_SEQ_CST) &&
        __atomic_load_n(&s->lease->moves, __ATOMIC_SEQ_CST) == s->moves)
        return 1;
    __atomic_store_n(&s->busy, 0, __ATOMIC_SEQ_CST);
    return 0;
}

/* enter(), and `stream` not capturing (a copy queued on a capturing stream is the guard's to record,
 * refuse or spoil): 1, or 0 (not busy) to leave the frame to Python. */
static int enter_uncaptured(struct session *s, uint64_t stream) {
    if (!enter(s)) return 0;
    int capturing = 1;
    if (s->lease->ops.capturing(stream, &capturing) == 0 && !capturing) return 1;
    __atomic_store_n(&s->busy, 0, __ATOMIC_RELAXED);
    return 0;
}
EXPORT uint64_t gpf_session_calls(const struct session *s) { return __atomic_load_n(&s->calls, __ATOMIC_RELAXED); }
EXPORT uint64_t gpf_session_syncs(const struct session *s) { return __atomic_load_n(&s->syncs, __ATOMIC_RELAXED); }

struct buffer {
    uint8_t *data;
    uint64_t cap, start, end;
};

struct outcome {
    int32_t result; /* ASYNC_ERROR: the call's error; REPLY_AFTER_OUTPUT: the reply's result */
    uint32_t served;
    const uint8_t *data; /* REPLY_AFTER_OUTPUT of a copy to the host: its bytes */
    uint64_t data_len;
};

static uint32_t u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint64_t u64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* How long the loop polls the socket for the next frame before its thread sleeps in recv: a program
 * between calls sends the next one within microseconds, and waking a sleeping thread costs as much
 * again (GPUPOOL_WORKER_SPIN_US, default 40; 0: never poll). */
static uint64_t spin_ns = 40000;

EXPORT void gpf_set_spin(uint64_t ns) { spin_ns = ns; }

/* Whether each connection keeps where its loop's time goes (GPUPOOL_WORKER_NATIVE_STATS; off, no clock is
 * read per frame), and what it kept: serving, reading frames, launching (ns); frames, reads, launches; of
 * the launching, in the executor's launch call itself (ns). */
static int stats_on;
EXPORT void gpf_set_stats(int on) { stats_on = on; }
EXPORT void gpf_session_stats(const struct session *s, uint64_t *out) {
    uint64_t kept[7] = {s->st_serve_ns, s->st_read_ns, s->st_launch_ns, s->st_frames,
                        s->st_reads,    s->st_launches, s->st_driver_ns};
    memcpy(out, kept, sizeof kept);
}

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* The connection: a plain socket, the TLS stream over it (tls.c), or the command ring beside it. */
struct io {
    int fd;
    struct gpt_stream *tls;
    const struct gp_ring_end *ring;
};

/* -- the command ring (gp_ring.h): a local connection's bytes through memory the client maps too ---- */

/* The worker's end of a ring in the memory of `memfd` (its size: gp_ring_bytes_total(bytes)), beside
 * the connection's socket `fd`; NULL where it cannot be mapped. The caller may close `memfd` after. */
EXPORT struct gp_ring_end *gpf_ring_map(int memfd, uint32_t bytes, int fd) {
    struct gp_ring_end *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    void *map = mmap(NULL, gp_ring_bytes_total(bytes), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, memfd, 0);
    if (map == MAP_FAILED || gp_ring_open(e, map, bytes, 1, 1, fd) < 0) {
        if (map != MAP_FAILED) munmap(map, gp_ring_bytes_total(bytes));
        free(e);
        return NULL;
    }
    e->spin_ns = spin_ns;
    return e;
}

/* The bytes of a ring's memory (its header page and both directions), for the memory made to map. */
EXPORT uint64_t gpf_ring_total(uint32_t bytes) { return gp_ring_bytes_total(bytes); }

EXPORT void gpf_ring_free(struct gp_ring_end *e) {
    if (!e) return;
    munmap(e->page, gp_ring_bytes_total((uint32_t)e->bytes));
    free(e);
}

/* The Python path's reads and writes of a ring connection (worker.py's Channel): like recv(2) (0: the
 * client is gone), and 0 or -1 when every byte is written. ctypes lets go of the GIL around both. */
EXPORT long gpf_ring_recv(const struct gp_ring_end *e, void *p, uint64_t n) { return gp_ring_recv(e, p, n, 0); }
EXPORT int gpf_ring_send(const struct gp_ring_end *e, const void *p, uint64_t n) { return gp_ring_send(e, p, n); }

/* Like recv(2), MSG_DONTWAIT when `nowait`. */
static ssize_t io_recv(const struct io *io, void *p, size_t n, int nowait) {
    if (io->ring) return gp_ring_recv(io->ring, p, n, nowait);
    if (!io->tls) return recv(io->fd, p, n, nowait ? MSG_DONTWAIT : 0);
    long got = gpt_recv(io->tls, p, n, nowait ? 0 : -1);
    if (got >= 0) return got;
    errno = got == -2 ? EAGAIN : EIO;
    return -1;
}

/* At least `need` bytes from start: reads more (waiting), moving what is kept to the front first when
 * the buffer's end is in the way. 0, CLOSED or IO_ERROR. */
static int fill(const struct io *io, struct buffer *b, uint64_t need) {
    uint64_t until = 0;
    while (b->end - b->start < need) {
        if (b->cap - b->start < need) {
            memmove(b->data, b->data + b->start, b->end - b->start);
            b->end -= b->start;
            b->start = 0;
        }
        int polling = !io->ring && spin_ns && (!until || now_ns() < until); /* a ring spins in gp_ring_recv */
        ssize_t got = io_recv(io, b->data + b->end, b->cap - b->end, polling);
        if (got == 0) return CLOSED;
        if (got < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                if (!until) until = now_ns() + spin_ns;
                continue;
            }
            if (errno == EINTR) continue;
            return IO_ERROR;
        }
        b->end += (uint64_t)got;
    }
    return 0;
}

static int which_call(uint32_t id) {
    for (int c = 0; c < C_COUNT; c++)
        if (gpf_calls[c].id == id) return c;
    return -1;
}

/* Argument i of served call c, from its frame's arguments at `a`. */
static uint64_t arg(int c, int i, const uint8_t *a) {
    const struct gpf_arg *g = &gpf_calls[c].args[i];
    uint64_t v = 0;
    memcpy(&v, a + g->offset, g->size); /* little-endian, as the wire */
    return v;
}

static int stream_known(struct lease *l, uint64_t stream) {
    return GPF_BUILTIN_STREAM(stream) || table_has(&l->kinds[KIND_STREAM], stream, NULL);
}

/* The executor's value of a checked argument (a handle the client names: mapped after a move). */
static uint64_t real_arg(struct lease *l, int check, uint64_t v) {
    switch (check) {
    case GPF_STREAM: return GPF_BUILTIN_STREAM(v) ? v : table_real(&l->kinds[KIND_STREAM], v);
    case GPF_EVENT: return table_real(&l->kinds[KIND_EVENT], v);
    case GPF_FUNC: return table_real(&l->kinds[KIND_FUNC], v);
    case GPF_GRAPHEXEC: return table_real(&l->kinds[KIND_GRAPHEXEC], v);
    default: return v;
    }
}

/* A stream the client names, as the executor knows it (under the lock). */
static uint64_t real_stream(struct lease *l, uint64_t stream) {
    pthread_mutex_lock(&l->lock);
    uint64_t real = real_arg(l, GPF_STREAM, stream);
    pthread_mutex_unlock(&l->lock);
    return real;
}

/* Every argument of the frame passes the guard's check of it (Session._check, _check_ranges): handles
 * the lease's, device bytes inside one of its allocations (under the lock). */
static int args_ok(const struct session *s, int c, const uint8_t *a) {
    struct lease *l = s->lease;
    for (int i = 0; i < gpf_calls[c].n_args; i++) {
        const struct gpf_arg *g = &gpf_calls[c].args[i];
        uint64_t v = arg(c, i, a);
        int ok;
        switch (g->check) {
        case GPF_PLAIN: ok = 1; break;
        case GPF_STREAM: ok = stream_known(l, v); break;
        case GPF_EVENT: ok = table_has(&l->kinds[KIND_EVENT], v, NULL); break;
        case GPF_FUNC: ok = table_has(&l->kinds[KIND_FUNC], v, NULL); break; /* only functions launched once */
        case GPF_GRAPHEXEC: ok = table_has(&l->kinds[KIND_GRAPHEXEC], v, NULL); break;
        case GPF_PINNED: ok = pinned_at(s, v, arg(c, g->length, a)) != NULL; break;
        case GPF_SHARED: {
            uint64_t count = arg(c, g->length, a);
            ok = s->shm && count <= s->shm_size && v <= s->shm_size - count;
            break;
        }
        case GPF_RANGE: { /* the length counts elements of g->element bytes (a memset's values) */
            uint64_t bytes = 0;
            ok = (g->length == GPF_NO_ARG || !__builtin_mul_overflow(arg(c, g->length, a), g->element, &bytes)) &&
                 ((g->length != GPF_NO_ARG && !bytes) || range_ok(l, v, bytes)); /* no bytes: any address */
            break;
        }
        default: ok = 0; /* a check this loop does not know: Python's */
        }
        if (!ok) return 0;
    }
    return 1;
}

/* args_ok under the lease's lock; `real` (if not NULL): each argument as the executor knows it. */
static int checked(struct session *s, int c, const uint8_t *a, uint64_t *real) {
    pthread_mutex_lock(&s->lease->lock);
    int ok = args_ok(s, c, a);
    if (ok && real)
        for (int i = 0; i < gpf_calls[c].n_args; i++) real[i] = real_arg(s->lease, gpf_calls[c].args[i].check, arg(c, i, a));
    pthread_mutex_unlock(&s->lease->lock);
    return ok;
}

static int send_all(const struct io *io, const void *p, size_t n) {
    if (io->ring) return gp_ring_send(io->ring, p, n);
    if (io->tls) return gpt_send_all(io->tls, p, n);
    const uint8_t *c = p;
    while (n) {
        ssize_t sent = send(io->fd, c, n, MSG_NOSIGNAL);
        if (sent < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        c += sent, n -= (size_t)sent;
    }
    return 0;
}

/* A launch's frame (args at `a`, parameters then attributes at `bulk`): run, or -1 for the Python path. */
static int launch(struct session *s, const uint8_t *a, const uint8_t *bulk, uint64_t bulk_len, int *result) {
    struct lease *l = s->lease;
    uint64_t func = u64(a + GPF_AT_LAUNCH_f), stream = u64(a + GPF_AT_LAUNCH_stream);
    uint32_t dims[7], n_attrs = u32(a + GPF_AT_LAUNCH_n_attrs);
    for (int i = 0; i < 7; i++) dims[i] = u32(a + GPF_AT_LAUNCH_gx + 4 * i); /* grid, block, shared memory */
    if ((uint64_t)n_attrs * ATTR_BYTES > bulk_len || n_attrs > 64) return -1;
    uint64_t params_len = bulk_len - (uint64_t)n_attrs * ATTR_BYTES;
    uint64_t attrs[64 * ATTR_BYTES / 8]; /* aligned copies of the attributes */
    for (uint32_t i = 0; i < n_attrs; i++) {
        uint32_t id = u32(bulk + params_len + (uint64_t)i * ATTR_BYTES);
        /* an attribute holding an event: the client's value, which Python maps to the executor's */
        if (id >= 64 || !(GPF_FORWARDED_LAUNCH_ATTRIBUTES >> id & 1) || (GPF_EVENT_LAUNCH_ATTRIBUTES >> id & 1))
            return -1;
    }
    memcpy(attrs, bulk + params_len, (size_t)n_attrs * ATTR_BYTES);
    pthread_mutex_lock(&l->lock);
    struct layout *layout = NULL;
    int known = args_ok(s, C_LAUNCH, a) && table_has(&l->kinds[KIND_FUNC], func, &layout) && layout;
    func = real_arg(l, GPF_FUNC, func), stream = real_arg(l, GPF_STREAM, stream); /* the executor's */
    uint32_t n = known ? layout->n : 0;
    /* Parameters shorter than the layout (an `extra` buffer: NCCL declares a 4 KiB argument struct and
     * sends the bytes its work uses) are padded with zeros: the driver reads the layout's length. */
    uint64_t padded_len = known && params_len < layout->min_len ? layout->min_len : params_len;
    void *small[64], **args = small;
    if (known && n > 64 && !(args = malloc(n * sizeof *args))) known = 0;
    if (known && s->scratch_cap < padded_len + 1) {
        size_t cap = padded_len + 1 > 4096 ? padded_len + 1 : 4096;
        void *bigger = NULL;
        if (posix_memalign(&bigger, 16, cap) == 0) {
            free(s->scratch);
            s->scratch = bigger, s->scratch_cap = cap;
        } else {
            known = 0;
        }
    }
    if (known) {
        memcpy(s->scratch, bulk, params_len);
        memset(s->scratch + params_len, 0, padded_len - params_len);
        for (uint32_t i = 0; i < n; i++) args[i] = s->scratch + layout->offsets[i];
        if (l->n_moved) params_mapped(l, layout, s->scratch); /* a moved global's address the program passes */
    }
    pthread_mutex_unlock(&l->lock);
    if (!known || !enter(s)) {
        if (args != small) free(args);
        return -1;
    }
    uint64_t calling = stats_on ? now_ns() : 0;
    *result = l->ops.launch(func, dims, stream, n ? args : NULL, s->scratch, padded_len, n_attrs ? attrs : NULL,
                            n_attrs);
    if (calling) s->st_driver_ns += now_ns() - calling;
    __atomic_store_n(&s->busy, 0, __ATOMIC_RELAXED);
    if (args != small) free(args);
    return 0;
}

/* Any other call served here: checked, run (its answered value at *out); -1 for the Python path. */
static int other(struct session *s, int c, const uint8_t *a, int *result, uint64_t *out) {
    struct lease *l = s->lease;
    uint64_t args[sizeof gpf_calls[c].args / sizeof gpf_calls[c].args[0]] = {0};
    if (!checked(s, c, a, args) || !enter(s)) return -1;
    *result = l->ops.call((uint32_t)c, args, out);
    __atomic_store_n(&s->busy, 0, __ATOMIC_RELAXED);
    if (*result == 0 && (c == C_CTX_SYNC || c == C_STREAM_SYNC || c == C_EVENT_SYNC))
        __atomic_add_fetch(&s->syncs, 1, __ATOMIC_RELAXED);
    return 0;
}

enum { MAX_NOTES = 1 << 16 }; /* events made here that Python has not yet heard of, at most */

/* gpEventCreateNamed, as the guard's _event_create_named and the executor's event_named run it: an event
 * made in the connection's context, called by the client's name from now on, in the lease's table at
 * once and noted for Python's (the guard's handles, the executor's name map and the record a move
 * replays). -1 for the Python path: no name map here, a value not the client's to choose or already an
 * event, flags other than blocking-sync and disable-timing, or a failure (Python's path says why, at
 * the next synchronising call, as for any unanswered call). */
static int event_create_named(struct session *s, const uint8_t *a, int *result) {
    struct lease *l = s->lease;
    uint32_t flags = u32(a + GPF_AT_EVENT_CREATE_NAMED_flags);
    uint64_t name = u64(a + GPF_AT_EVENT_CREATE_NAMED_name), real = 0, args[2] = {flags, name};
    if (!__atomic_load_n(&l->events_here, __ATOMIC_SEQ_CST) || name >> 56 != GPF_EVENT_NAME_TAG || flags & ~3u)
        return -1;
    pthread_mutex_lock(&l->lock); /* (notes pile up only while no call goes to Python: then one does) */
    int free_name = !table_has(&l->kinds[KIND_EVENT], name, NULL) && l->n_notes < MAX_NOTES && notes_room(l) == 0;
    pthread_mutex_unlock(&l->lock);
    if (!free_name || !enter(s)) return -1;
    int r = l->ops.call(C_EVENT_CREATE_NAMED, args, &real);
    if (r || !real) {
        __atomic_store_n(&s->busy, 0, __ATOMIC_RELAXED);
        return -1;
    }
    pthread_mutex_lock(&l->lock); /* still busy until noted: a move waits for that, then takes the notes */
    struct table *t = &l->kinds[KIND_EVENT];
    int kept = !table_has(t, name, NULL);
    if (kept) table_put(t, name, NULL), kept = table_has(t, name, NULL); /* (no memory: not kept) */
    if (kept) {
        t->reals[slot_of(t, name)] = real == name ? 0 : real;
        if (event_note(l, (struct event_note){1, name, real, s->ctx, flags}) < 0) table_drop(t, name), kept = 0;
    }
    pthread_mutex_unlock(&l->lock);
    if (!kept) { /* undone: the Python path makes it */
        uint64_t undo[1] = {real}, none = 0;
        l->ops.call(C_EVENT_DESTROY, undo, &none);
    }
    __atomic_store_n(&s->busy, 0, __ATOMIC_SEQ_CST);
    *result = 0;
    return kept ? 0 : -1;
}

/* cuEventDestroy of an event of the lease's, as the guard runs it: destroyed, out of the lease's table,
 * and noted for Python's tables (its handles, and the executor's name map and records), or, made here
 * and not yet taken by Python, its note dropped. -1 for the Python path. */
static int event_destroy(struct session *s, const uint8_t *a, int *result) {
    struct lease *l = s->lease;
    uint64_t name = u64(a + GPF_AT_EVENT_DESTROY_event), none = 0;
    pthread_mutex_lock(&l->lock);
    int known = table_has(&l->kinds[KIND_EVENT], name, NULL) && notes_room(l) == 0;
    uint64_t args[1] = {table_real(&l->kinds[KIND_EVENT], name)};
    pthread_mutex_unlock(&l->lock);
    if (!known || !enter(s)) return -1;
    int r = l->ops.call(C_EVENT_DESTROY, args, &none);
    if (r) {
        __atomic_store_n(&s->busy, 0, __ATOMIC_RELAXED);
        return -1;
    }
    pthread_mutex_lock(&l->lock); /* still busy until noted */
    table_drop(&l->kinds[KIND_EVENT], name);
    size_t i = l->n_notes;
    while (i > 0 && !(l->notes[i - 1].made && l->notes[i - 1].name == name)) i--;
    if (i > 0) { /* Python never hears of it */
        memmove(l->notes + i - 1, l->notes + i, (l->n_notes - i) * sizeof *l->notes);
        __atomic_store_n(&l->n_notes, l->n_notes - 1, __ATOMIC_SEQ_CST);
    } else {
        event_note(l, (struct event_note){0, name, 0, 0, 0}); /* room was made before the destroy */
    }
    pthread_mutex_unlock(&l->lock);
    __atomic_store_n(&s->busy, 0, __ATOMIC_SEQ_CST);
    *result = 0;
    return 0;
}

/* A small copy (args: device address, count, stream; a copy to the device's bytes at `bulk`): checked
 * as the guard checks it, run; -1 for the Python path (outside the lease's memory, a capture, ...).
 * A copy to the host leaves [reply header][bytes] at s->copied. */
static int copy(struct session *s, int c, const uint8_t *a, const uint8_t *bulk, uint64_t bulk_len, int *result) {
    struct lease *l = s->lease;
    const struct gpf_call *call = &gpf_calls[c];
    uint64_t device = arg(c, 0, a), count = arg(c, 1, a), stream = arg(c, 2, a);
    int to_device = call->bulk_in;
    if (count > SMALL_COPY || (to_device ? bulk_len != count : bulk_len != 0) || !count) return -1;
    uint64_t real[sizeof call->args / sizeof call->args[0]] = {0};
    if (!checked(s, c, a, real)) return -1;
    stream = real[2];
    if (!to_device && !s->copied && !(s->copied = malloc(REPLY + SMALL_COPY))) return -1;
    if (!(call->capture != GPF_NO_ARG ? enter_uncaptured(s, real[call->capture]) : enter(s))) return -1;
    *result = l->ops.copy((uint32_t)c, device, to_device ? (void *)bulk : s->copied + REPLY, count, stream, 0);
    __atomic_store_n(&s->busy, 0, __ATOMIC_RELAXED);
    return 0;
}

/* A copy between the lease's memory and the client's shared page-locked memory (gpPinnedCopy), as
 * CopyCalls.pinned_copy runs it: checked, queued on its stream (a synchronous one done on return); -1
 * for the Python path (a check fails, a queued one on a capturing stream, too many streams landing). */
static int pinned_copy(struct session *s, const uint8_t *a, int *result) {
    struct lease *l = s->lease;
    uint64_t device = u64(a + GPF_AT_PINNED_COPY_device), host = u64(a + GPF_AT_PINNED_COPY_host);
    uint64_t count = u64(a + GPF_AT_PINNED_COPY_count), stream = u64(a + GPF_AT_PINNED_COPY_stream);
    uint32_t flags = u32(a + GPF_AT_PINNED_COPY_flags);
    int to_device = flags & 1, synchronous = flags & 2;
    if (!checked(s, C_PINNED_COPY, a, NULL)) return -1;
    struct pinned *p = pinned_at(s, host, count);
    uint64_t on = real_stream(l, stream); /* the client's `stream` is what a landing is noted with */
    if (!(synchronous ? enter(s) : enter_uncaptured(s, on))) return -1;
    if (!synchronous && !to_device && pinned_note_landing(s, p, stream) < 0) {
        __atomic_store_n(&s->busy, 0, __ATOMIC_RELAXED);
        return -1;
    }
    *result = l->ops.copy(C_PINNED_COPY, device, p->mapped + (host - p->base), count, on, flags);
    __atomic_store_n(&s->busy, 0, __ATOMIC_RELAXED);
    return 0;
}

/* A piece of a copy to the device through the connection's shared memory (gpShmHtoD), as
 * CopyCalls.shm_htod runs it: checked, copied; -1 for the Python path (a check fails, an earlier piece
 * failed, a piece on a capturing stream: the Python path records or spoils it). */
static int shm_htod(struct session *s, const uint8_t *a, int *result) {
    struct lease *l = s->lease;
    uint64_t device = u64(a + GPF_AT_SHM_HTOD_dst), count = u64(a + GPF_AT_SHM_HTOD_count);
    uint64_t stream = u64(a + GPF_AT_SHM_HTOD_stream), offset = u64(a + GPF_AT_SHM_HTOD_offset);
    uint32_t flags = u32(a + GPF_AT_SHM_HTOD_flags);
    if (!s->shm_ok || !checked(s, C_SHM_HTOD, a, NULL)) return -1;
    stream = real_stream(l, stream);
    if (!(flags & 2 ? enter_uncaptured(s, stream) : enter(s))) return -1;
    *result = l->ops.copy(C_SHM_HTOD, device, s->shm + offset, count, stream, flags & 3);
    __atomic_store_n(&s->busy, 0, __ATOMIC_RELAXED);
    return 0;
}

/* A copy to the host through the connection's shared memory (gpShmDtoH), as CopyCalls.shm_dtoh runs it:
 * checked, then `chunk` bytes at a time into the memory from its start, each piece answered (its offset
 * and size) once it is there, so the client copies one piece out while the next lands; a piece that fails
 * is answered with its error and ends the copy. 0: answered; -1: the Python path's, nothing answered (a
 * check fails, a queued copy on a capturing stream, kernel output to send before the first answer); -2:
 * the connection failed. */
static int shm_dtoh(struct session *s, const struct io *io, const uint8_t *a) {
    struct lease *l = s->lease;
    uint64_t device = u64(a + GPF_AT_SHM_DTOH_src), count = u64(a + GPF_AT_SHM_DTOH_count);
    uint64_t stream = u64(a + GPF_AT_SHM_DTOH_stream), chunk = u32(a + GPF_AT_SHM_DTOH_chunk);
    uint32_t on_stream = u32(a + GPF_AT_SHM_DTOH_flags) & 2;
    if (!s->shm || !count || count > s->shm_size || !chunk || !checked(s, C_SHM_DTOH, a, NULL)) return -1;
    stream = real_stream(l, stream); /* the executor's stream (mapped after a move) */
    if (!(on_stream ? enter_uncaptured(s, stream) : enter(s))) return -1;
    int r = 0, done = 0;
    for (uint64_t at = 0; at < count && !r && !done;) {
        uint64_t n = count - at < chunk ? count - at : chunk, piece[2] = {at, n};
        r = l->ops.copy(C_SHM_DTOH, device + at, s->shm + at, n, stream, on_stream);
        /* What kernels printed comes before the first answer: the Python path sends it, and copies this
         * piece again (into memory nobody reads before the answer). */
        if (at == 0 && !r && output_waiting()) done = -1;
        uint8_t reply[REPLY + sizeof piece] = {0};
        uint32_t outs = r ? 0 : sizeof piece;
        memcpy(reply + GPF_REPLY_RESULT, &r, 4);
        memcpy(reply + GPF_REPLY_OUTS_LEN, &outs, 4);
        memcpy(reply + REPLY, piece, sizeof piece); /* little-endian, as the wire */
        if (!done && send_all(io, reply, REPLY + outs) < 0) done = -2;
        at += n;
    }
    __atomic_store_n(&s->busy, 0, __ATOMIC_RELAXED);
    return done;
}

/* The elapsed times of many pairs of events (gpEventElapsedMany), as LaunchCalls.elapsed_many answers
 * them: a pair with an event not the lease's is INVALID_HANDLE without reaching the driver, each other
 * pair the driver's answer. 0, its answer sent when `replies`; -1 for the Python path (a count that does
 * not match its pairs); -2 the connection failed. */
static int elapsed_many(struct session *s, const struct io *io, const uint8_t *a, const uint8_t *bulk,
                        uint64_t bulk_len, int replies) {
    struct lease *l = s->lease;
    uint32_t n = u32(a + GPF_AT_EVENT_ELAPSED_MANY_count);
    if (!n || n > GPF_MAX_EVENT_PAIRS || bulk_len != (uint64_t)n * GPF_EVENT_PAIR_BYTES) return -1;
    if (s->answers_cap < REPLY + (size_t)n * GPF_EVENT_ELAPSED_BYTES) {
        uint8_t *bigger = realloc(s->answers, REPLY + (size_t)GPF_MAX_EVENT_PAIRS * GPF_EVENT_ELAPSED_BYTES);
        if (!bigger) return -1;
        s->answers = bigger, s->answers_cap = REPLY + (size_t)GPF_MAX_EVENT_PAIRS * GPF_EVENT_ELAPSED_BYTES;
    }
    if (!enter(s)) return -1;
    uint8_t *answer = s->answers + REPLY;
    for (uint32_t i = 0; i < n; i++, answer += GPF_EVENT_ELAPSED_BYTES) {
        const uint8_t *at = bulk + (uint64_t)i * GPF_EVENT_PAIR_BYTES;
        /* a full argument array, as other() passes (the driver's call reads a third word) */
        uint64_t pair[sizeof gpf_calls[0].args / sizeof gpf_calls[0].args[0]] = {u64(at), u64(at + 8)};
        pthread_mutex_lock(&l->lock);
        const struct table *events = &l->kinds[KIND_EVENT];
        int known = table_has(events, pair[0], NULL) && table_has(events, pair[1], NULL);
        if (known) pair[0] = real_arg(l, GPF_EVENT, pair[0]), pair[1] = real_arg(l, GPF_EVENT, pair[1]);
        pthread_mutex_unlock(&l->lock);
        uint64_t ms = 0;
        int32_t result = known ? l->ops.call(C_EVENT_ELAPSED, pair, &ms) : 400; /* CUDA_ERROR_INVALID_HANDLE */
        if (result) ms = 0; /* a failed pair answers 0.0 */
        memcpy(answer, &result, 4);
        memcpy(answer + 4, &ms, 4); /* the float's bytes, little-endian */
    }
    __atomic_store_n(&s->busy, 0, __ATOMIC_RELAXED);
    if (!replies) return 0;
    uint64_t answers_len = (uint64_t)n * GPF_EVENT_ELAPSED_BYTES;
    memset(s->answers, 0, REPLY);
    memcpy(s->answers + GPF_REPLY_BULK_LEN, &answers_len, 8);
    return send_all(io, s->answers, REPLY + answers_len) < 0 ? -2 : 0;
}

/* Serve frames from `fd` (through `tls` when the connection is encrypted, `ring` when it has gone over to
 * the command ring: NULL for a plain socket) until one is Python's (TO_PYTHON: b->start is its header), an asynchronous call
 * failed (ASYNC_ERROR, its frame consumed: the Python path keeps it for the next synchronising call),
 * a synchronising call's reply must follow kernel output (REPLY_AFTER_OUTPUT: Python sends both), the
 * client is gone, or `budget` frames were served (SERVED). `may_reply`: no earlier asynchronous error is
 * pending and nothing else is owed before a reply, so synchronising calls are answered here. `ctx`: the
 * connection's current context (copies landing in shared page-locked memory are noted with it). */
static int serve(struct session *s, const struct io *io, struct buffer *b, int may_reply, uint32_t budget,
                 struct outcome *out);

EXPORT int gpf_serve(struct session *s, int fd, struct gpt_stream *tls, const struct gp_ring_end *ring,
                     struct buffer *b, int may_reply, int shared_ok, uint64_t ctx, uint32_t budget,
                     struct outcome *out) {
    const struct io io = {fd, tls, ring};
    uint64_t start = stats_on ? now_ns() : 0;
    s->ctx = ctx;
    s->moves = __atomic_load_n(&s->lease->moves, __ATOMIC_SEQ_CST); /* the caller made its context current */
    s->shm_ok = shared_ok;
    out->served = 0;
    out->result = 0;
    int r = serve(s, &io, b, may_reply, budget, out);
    if (stats_on) {
        s->st_serve_ns += now_ns() - start;
        s->st_frames += out->served;
    }
    return r;
}

/* gpf_serve's loop, on the connection `io`. */
static int serve(struct session *s, const struct io *io_, struct buffer *b, int may_reply, uint32_t budget,
                 struct outcome *out) {
    const struct io io = *io_;
    while (out->served < budget) {
        uint64_t reading = 0;
        if (stats_on && b->end - b->start < HEADER) reading = now_ns(), s->st_reads++;
        int r = fill(&io, b, HEADER);
        if (reading) s->st_read_ns += now_ns() - reading;
        if (r) return r;
        const uint8_t *h = b->data + b->start;
        uint32_t id = u32(h + GPF_REQUEST_CALL), flags = u32(h + GPF_REQUEST_FLAGS);
        uint32_t args_len = u32(h + GPF_REQUEST_ARGS_LEN);
        uint64_t bulk_len = u64(h + GPF_REQUEST_BULK_LEN);
        int c = which_call(id);
        if (c < 0 || args_len != gpf_calls[c].args_bytes || HEADER + args_len + bulk_len > b->cap) return TO_PYTHON;
        int pinned = c == C_PINNED_COPY, shm = c == C_SHM_HTOD, shm_out = c == C_SHM_DTOH, sync = gpf_calls[c].sync;
        int many = c == C_EVENT_ELAPSED_MANY;
        int copying = gpf_calls[c].data;
        /* Answered when the frame asks, and a copy to the host always (its bytes come back, as on the
         * Python path); a synchronising call sent without asking (an async gpPinnedCopy) is run
         * unanswered, its error kept for the next one, as the Python path does. */
        int replies = gpf_calls[c].replies && (flags & GPF_FLAG_WANTS_REPLY || copying);
        if ((replies || shm_out) && !may_reply) return TO_PYTHON; /* a copy through shared memory answers, always */
        if (!gpf_calls[c].bulk_in && bulk_len) return TO_PYTHON;
        if ((r = fill(&io, b, HEADER + args_len + bulk_len))) return r;
        h = b->data + b->start;
        if (shm) { /* a copy through shared memory answers its last piece, always, and no other */
            replies = u32(h + HEADER + GPF_AT_SHM_HTOD_flags) & 1;
            if (replies && !may_reply) return TO_PYTHON;
        }
        int result = 0;
        uint64_t value = 0; /* the answered value, if the call has one */
        const uint8_t *a = h + HEADER, *bulk = h + HEADER + args_len;
        if (shm_out || many) { /* answered by their handlers: piece by piece, or all pairs at once */
            if ((r = shm_out ? shm_dtoh(s, &io, a) : elapsed_many(s, &io, a, bulk, bulk_len, replies)) == -1)
                return TO_PYTHON;
            b->start += HEADER + args_len + bulk_len;
            out->served++;
            __atomic_fetch_add(&s->calls, 1, __ATOMIC_RELAXED);
            if (r < 0) return IO_ERROR;
            continue;
        }
        uint64_t launching = stats_on && c == C_LAUNCH ? now_ns() : 0;
        if ((c == C_LAUNCH ? launch(s, a, bulk, bulk_len, &result)
             : pinned      ? pinned_copy(s, a, &result)
             : shm         ? shm_htod(s, a, &result)
             : copying     ? copy(s, c, a, bulk, bulk_len, &result)
             : c == C_EVENT_CREATE_NAMED ? event_create_named(s, a, &result)
             : c == C_EVENT_DESTROY      ? event_destroy(s, a, &result)
                                         : other(s, c, a, &result, &value)) < 0)
            return TO_PYTHON;
        if (launching) s->st_launch_ns += now_ns() - launching, s->st_launches++;
        b->start += HEADER + args_len + bulk_len;
        out->served++;
        __atomic_fetch_add(&s->calls, 1, __ATOMIC_RELAXED);
        if (!replies) {
            if (result) {
                out->result = result;
                return shm ? SHARED_ERROR : ASYNC_ERROR;
            }
            continue;
        }
        uint64_t count = copying ? arg(c, 1, a) : 0, sent = result ? 0 : count; /* bytes of a copy to the host */
        if (sync && output_waiting()) {
            out->result = result;
            out->data = sent ? s->copied + REPLY : NULL;
            out->data_len = sent;
            return REPLY_AFTER_OUTPUT;
        }
        uint8_t head[REPLY + 8] = {0}, *reply = copying ? s->copied : head;
        uint32_t outs = result ? 0 : gpf_calls[c].outs; /* a failed call answers no value */
        memset(reply, 0, REPLY);
        memcpy(reply + GPF_REPLY_RESULT, &result, 4);
        memcpy(reply + GPF_REPLY_OUTS_LEN, &outs, 4);
        memcpy(reply + GPF_REPLY_BULK_LEN, &sent, 8);
        memcpy(reply + REPLY, &value, outs); /* little-endian, as the wire */
        if (send_all(&io, reply, REPLY + (copying ? sent : outs)) < 0) return IO_ERROR;
    }
    return SERVED;
}

/* -- a copy's mark, waited for without the driver ------------------------------------------------------
 * A copy into the worker's page-locked staging memory is followed on its stream by a write of its mark
 * (cuStreamWriteValue32, _cuda._InFlight). The delivery thread waited for the copy with cuEventSynchronize
 * in the copy's context while the connection's thread queued the next copies there: the two met in the
 * driver and in the GIL taken back after each call (bench/RESULTS.md, run CG). Here the word is read until
 * it holds `value`: polled for spin_ns (the loop's spin: none on a host of few CPUs), then every 20 µs,
 * the GIL let go once for the whole wait. 1: it came; 0: not within timeout_ns (the caller asks the driver
 * why: a context that failed writes no mark). */
EXPORT int gpf_wait_word(const uint32_t *word, uint32_t value, uint64_t spin_ns, uint64_t timeout_ns) {
    uint64_t start = now_ns();
    for (;;) {
        if (__atomic_load_n(word, __ATOMIC_ACQUIRE) == value) return 1;
        uint64_t waited = now_ns() - start;
        if (waited >= timeout_ns) return 0;
        if (waited < spin_ns) {
            gp_ring_relax();
            continue;
        }
        static __thread int slack_set; /* the default 50 µs of timer slack would make each 20 µs nap 70 */
        if (!slack_set) slack_set = prctl(PR_SET_TIMERSLACK, 1000UL) == 0 ? 1 : -1;
        struct timespec nap = {0, 20000};
        nanosleep(&nap, NULL);
    }
}

/* A copy into the worker's page-locked staging memory queued behind its stream, its event recorded and its
 * mark written after it: _cuda._InFlight's three driver calls in one, so that the connection's thread takes
 * the GIL back once for them, not three times (each time, maybe, after the delivery thread: run CG).
 * Returns 0, or the first failure with *failed saying which call: 0 the copy, 1 the record, 2 the mark (refused
 * where the device has no stream memory operations: the caller has a semaphore posted instead). -1: the driver's
 * entry points are not found here (gpf_use_driver). */
EXPORT int gpf_copy_to_host_marked(void *dst, uint64_t src, uint64_t count, uint64_t stream, uint64_t event,
                                   uint64_t mark, uint32_t value, int *failed) {
    if (!drv_dtoh_async || !drv_event_record || !drv_write_value32) return *failed = 0, -1;
    int r = drv_dtoh_async(dst, src, count, stream);
    if (r) return *failed = 0, r;
    r = drv_event_record(event, stream);
    if (r) return *failed = 1, r;
    r = drv_write_value32(stream, mark, value, 0);
    return *failed = 2, r;
}
