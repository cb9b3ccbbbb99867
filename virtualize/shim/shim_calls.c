/* gpupool's libcuda.so.1, part 2: the exported CUDA calls.
 *
 * Plain calls are generated from virtualize/_calls.py (calls_gen.h). The ones written here need the
 * client's own state: host memory and the context stack stay local, allocations are reserved in this
 * address space, generic copies are sorted into host/device by address, kernel parameters are packed
 * at the offsets the worker reported once per function, and module images are measured before sending. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim.h"
static CUresult gp_unforwarded(const char *name); /* refuses a driver function not forwarded */
static CUresult copies_settle_host(const void *p); /* copies landing in p's page-locked range first */
#include "calls_gen.h"

#define WANT GP_FLAG_WANTS_REPLY
#define CALL(key, flags, in, out) gp_call(GP_CALL_##key, flags, &in, sizeof in, NULL, 0, &out, sizeof out, NULL, 0)

/* ---- cuGetProcAddress: every name resolves; unknown names to a stub that says so once ------------ */

#define N_STUBS 1024
static const char *stub_names[N_STUBS];
static int stub_said[N_STUBS];
static int n_stub_names;
static pthread_mutex_t stub_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *refusal_of(const char *name);

static CUresult stub_hit(int slot) {
    pthread_mutex_lock(&stub_lock);
    int first = !stub_said[slot];
    stub_said[slot] = 1;
    pthread_mutex_unlock(&stub_lock);
    if (first) {
        const char *name = stub_names[slot] ? stub_names[slot] : "an unknown CUDA call";
        gp_say("%s is not forwarded to the remote GPU (%s); it returns CUDA_ERROR_NOT_SUPPORTED "
               "(docs/driver-census.md says why)",
               name, refusal_of(name));
    }
    return CUDA_ERROR_NOT_SUPPORTED;
}

#define STUB1(n) static CUresult stub_##n(void) { return stub_hit(n); }
#define STUB4(n) STUB1(n##0) STUB1(n##1) STUB1(n##2) STUB1(n##3)
#define STUB16(n) STUB4(n##0) STUB4(n##1) STUB4(n##2) STUB4(n##3)
#define STUB64(n) STUB16(n##0) STUB16(n##1) STUB16(n##2) STUB16(n##3)
#define STUB256(n) STUB64(n##0) STUB64(n##1) STUB64(n##2) STUB64(n##3)
/* Each stub's slot is its name's digits after the leading 1, read in base 4: 0..1023. */
#define stub_hit(n) stub_hit(base4(#n + 1))
static int base4(const char *digits) {
    int v = 0;
    for (const char *d = digits; *d; d++) v = v * 4 + (*d - '0');
    return v;
}
STUB256(10) STUB256(11) STUB256(12) STUB256(13)
#undef stub_hit
#define REF1(n) (void *)stub_##n,
#define REF4(n) REF1(n##0) REF1(n##1) REF1(n##2) REF1(n##3)
#define REF16(n) REF4(n##0) REF4(n##1) REF4(n##2) REF4(n##3)
#define REF64(n) REF16(n##0) REF16(n##1) REF16(n##2) REF16(n##3)
#define REF256(n) REF64(n##0) REF64(n##1) REF64(n##2) REF64(n##3)
static void *const stubs[N_STUBS] = {REF256(10) REF256(11) REF256(12) REF256(13)};

static void *stub_for(const char *name) {
    pthread_mutex_lock(&stub_lock);
    int slot = -1;
    for (int i = 0; i < n_stub_names; i++) {
        if (strcmp(stub_names[i], name) == 0) slot = i;
    }
    if (slot < 0 && n_stub_names < N_STUBS) {
        slot = n_stub_names++;
        stub_names[slot] = strdup(name);
    }
    pthread_mutex_unlock(&stub_lock);
    return stubs[slot < 0 ? N_STUBS - 1 : slot];
}

static void *lookup_proc(const char *name, int version);

static const char *refusal_in_census(const char *name) {
    for (size_t i = 0; i < sizeof gp_refusals / sizeof *gp_refusals; i++) {
        const char *entry = gp_refusals[i].name;
        size_t n = strlen(entry);
        if (entry[n - 1] == '*' ? strncmp(name, entry, n - 1) == 0 : strcmp(name, entry) == 0)
            return gp_refusals[i].why;
    }
    return NULL;
}

/* The census's reason for a name (with or without its _vN, _ptsz or _ptds ending), or what else it is. */
static const char *refusal_of(const char *name) {
    const char *why = refusal_in_census(name);
    if (why) return why;
    char base[128];
    snprintf(base, sizeof base, "%s", name);
    char *end = strstr(base, "_pt");
    if (end && (!strcmp(end, "_ptsz") || !strcmp(end, "_ptds"))) *end = 0;
    end = strrchr(base, '_');
    if (end && end[1] == 'v' && end[2] >= '0' && end[2] <= '9') *end = 0;
    if ((why = refusal_in_census(base)) != NULL) return why;
    if (lookup_proc(base, 1 << 30)) return "an ABI version of a forwarded call that is not forwarded";
    return "not an entry point of cuda.h";
}

/* What an exported but unforwarded driver function (driver_symbols.txt) answers when called. */
static CUresult gp_unforwarded(const char *name) {
    pthread_mutex_lock(&stub_lock);
    int slot = -1;
    for (int i = 0; i < n_stub_names && slot < 0; i++) {
        if (strcmp(stub_names[i], name) == 0) slot = i;
    }
    if (slot < 0 && n_stub_names < N_STUBS) {
        slot = n_stub_names++;
        stub_names[slot] = name;
    }
    pthread_mutex_unlock(&stub_lock);
    return stub_hit(slot < 0 ? N_STUBS - 1 : slot);
}

GP_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, uint64_t flags, int *status) {
    (void)flags; /* per-thread default stream variants: the worker runs one thread per connection */
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    void *fn = lookup_proc(symbol, version);
    *pfn = fn ? fn : stub_for(symbol);
    if (status) *status = 0; /* CU_GET_PROC_ADDRESS_SUCCESS */
    return CUDA_SUCCESS;
}

GP_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, uint64_t flags) {
    return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}

static void *lookup_proc(const char *name, int version) {
    if (strcmp(name, "cuGetProcAddress") == 0) return version >= 12000 ? (void *)cuGetProcAddress_v2 : (void *)cuGetProcAddress;
    void *best = NULL;
    size_t n = sizeof gp_procs / sizeof gp_procs[0];
    for (size_t i = 0; i < n; i++) { /* sorted by name then version: the last fitting one wins */
        if (strcmp(gp_procs[i].name, name) == 0 && gp_procs[i].since <= version) best = gp_procs[i].fn;
    }
    return best;
}

/* ---- error strings ----------------------------------------------------------------------------- */

static const struct gp_result_text *result_text(int code) {
    for (size_t i = 0; i < sizeof gp_result_texts / sizeof gp_result_texts[0]; i++) {
        if (gp_result_texts[i].code == code) return &gp_result_texts[i];
    }
    return NULL;
}

CUresult cuGetErrorName(int32_t error, void *str) {
    const struct gp_result_text *t = result_text(error);
    if (!str) return CUDA_ERROR_INVALID_VALUE;
    *(const char **)str = t ? t->name : NULL;
    return t ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(int32_t error, void *str) {
    const struct gp_result_text *t = result_text(error);
    if (!str) return CUDA_ERROR_INVALID_VALUE;
    *(const char **)str = t ? t->text : NULL;
    return t ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* CUdevprop (deprecated): fourteen ints, device attributes 1 (MAX_THREADS_PER_BLOCK) to 14 (TEXTURE_ALIGNMENT)
 * in order; each a kept answer (shim_memo.c). */
CUresult cuDeviceGetProperties(void *prop, int32_t dev) {
    GP_TRACE("cuDeviceGetProperties");
    if (!prop) return CUDA_ERROR_INVALID_VALUE;
    int32_t *fields = prop;
    CUresult r = CUDA_SUCCESS;
    for (int i = 0; i < 14 && r == CUDA_SUCCESS; i++) r = cuDeviceGetAttribute(&fields[i], i + 1, dev);
    return r;
}

/* ---- devices by PCI bus id: the lease's devices' own ids, compared as numbers ----------------------- */

/* "[domain]:[bus]:[device].[function]", "[domain]:[bus]:[device]" or "[bus]:[device].[function]". */
static int parse_bus_id(const char *id, unsigned v[4]) {
    int colons = 0;
    for (const char *c = id; *c; c++) colons += *c == ':';
    v[0] = v[3] = 0;
    if (colons == 2) return sscanf(id, "%x:%x:%x.%x", &v[0], &v[1], &v[2], &v[3]) >= 3;
    if (colons == 1) return sscanf(id, "%x:%x.%x", &v[1], &v[2], &v[3]) == 3;
    return 0;
}

/* Which atomic operations one of the lease's GPUs can make on another's memory (CUDA 13). */
#define P2P_ATOMIC_OPERATIONS_MAX 64 /* CUatomicOperation has fewer kinds; a list past it is refused */

CUresult cuDeviceGetP2PAtomicCapabilities(void *capabilities, void *operations, uint32_t count, int32_t src,
                                          int32_t dst) {
    GP_TRACE("cuDeviceGetP2PAtomicCapabilities");
    if (!capabilities || !operations || !count || count > P2P_ATOMIC_OPERATIONS_MAX) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuDeviceGetP2PAtomicCapabilities in = {.count = count, .src = src, .dst = dst};
    return gp_call(GP_CALL_cuDeviceGetP2PAtomicCapabilities, WANT, &in, sizeof in, operations, 4ull * count, NULL,
                   0, capabilities, 4ull * count);
}

CUresult cuDeviceGetByPCIBusId(int32_t *dev, const char *bus_id) {
    GP_TRACE("cuDeviceGetByPCIBusId");
    unsigned want[4], have[4];
    int32_t count;
    if (!dev || !bus_id || !parse_bus_id(bus_id, want)) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cuDeviceGetCount(&count);
    for (int32_t i = 0; r == CUDA_SUCCESS && i < count; i++) {
        char id[64];
        r = cuDeviceGetPCIBusId(id, sizeof id, i);
        if (r == CUDA_SUCCESS && parse_bus_id(id, have) && !memcmp(have, want, sizeof want)) {
            *dev = i;
            return CUDA_SUCCESS;
        }
    }
    return r == CUDA_SUCCESS ? CUDA_ERROR_INVALID_DEVICE : r;
}

/* ---- contexts ---------------------------------------------------------------------------------- */

CUresult cuDevicePrimaryCtxRetain(uint64_t *ctx, int32_t dev) {
    GP_TRACE("cuDevicePrimaryCtxRetain");
    if (!ctx) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuDevicePrimaryCtxRetain in = {.dev = dev};
    struct gp_out_cuDevicePrimaryCtxRetain out;
    CUresult r = CALL(cuDevicePrimaryCtxRetain, WANT, in, out);
    if (r == CUDA_SUCCESS) {
        *ctx = out.ctx;
        gp_ctx_note_device(out.ctx, dev);
    }
    return r;
}

/* A context the program creates lives on the worker and becomes current here, as natively. */
CUresult cuCtxCreate_v2(uint64_t *ctx, uint32_t flags, int32_t dev) {
    GP_TRACE("cuCtxCreate_v2");
    if (!ctx) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuCtxCreate_v2 in = {.flags = flags, .dev = dev};
    struct gp_out_cuCtxCreate_v2 out;
    CUresult r = CALL(cuCtxCreate_v2, WANT, in, out);
    if (r != CUDA_SUCCESS) return r;
    gp_ctx_note_device(out.ctx, dev);
    if (gp_ctx_push(out.ctx) != 0) return CUDA_ERROR_INVALID_VALUE;
    *ctx = out.ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxCreate_v3(uint64_t *ctx, void *affinity, int32_t n, uint32_t flags, int32_t dev) {
    GP_TRACE("cuCtxCreate_v3");
    if (affinity && n > 0) return CUDA_ERROR_NOT_SUPPORTED; /* execution affinity (SM partitions) */
    return cuCtxCreate_v2(ctx, flags, dev);
}

CUresult cuCtxCreate_v4(uint64_t *ctx, void *params, uint32_t flags, int32_t dev) {
    GP_TRACE("cuCtxCreate_v4");
    if (params) { /* CUctxCreateParams { CUexecAffinityParam *, int n, CUctxCigParam * } */
        const unsigned char *p = params;
        void *affinity, *cig;
        int32_t n;
        memcpy(&affinity, p, sizeof affinity);
        memcpy(&n, p + 8, sizeof n);
        memcpy(&cig, p + 16, sizeof cig);
        if ((affinity && n > 0) || cig) return CUDA_ERROR_NOT_SUPPORTED; /* affinity, CUDA-in-graphics */
    }
    return cuCtxCreate_v2(ctx, flags, dev);
}

CUresult cuCtxDestroy_v2(uint64_t ctx) {
    GP_TRACE("cuCtxDestroy_v2");
    if (!ctx) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuCtxDestroy_v2 in = {.ctx = ctx};
    CUresult r = gp_call(GP_CALL_cuCtxDestroy_v2, WANT, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
    if (r == CUDA_SUCCESS) gp_ctx_forget(ctx);
    return r;
}

CUresult cuCtxGetCurrent(uint64_t *ctx) {
    GP_TRACE("cuCtxGetCurrent");
    if (!ctx) return CUDA_ERROR_INVALID_VALUE;
    *ctx = gp_ctx_current();
    return CUDA_SUCCESS;
}

static int known_ctx(uint64_t ctx) {
    int dev;
    return gp_ctx_device(ctx, &dev);
}

CUresult cuCtxSetCurrent(uint64_t ctx) {
    GP_TRACE("cuCtxSetCurrent");
    if (ctx && !known_ctx(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    gp_ctx_set(ctx);
    return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent_v2(uint64_t ctx) {
    GP_TRACE("cuCtxPushCurrent_v2");
    if (!ctx || !known_ctx(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    return gp_ctx_push(ctx) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuCtxPopCurrent_v2(uint64_t *ctx) {
    GP_TRACE("cuCtxPopCurrent_v2");
    int ok;
    uint64_t popped = gp_ctx_pop(&ok);
    if (!ok) return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx) *ctx = popped;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice_v2(int32_t *device, uint64_t ctx) {
    GP_TRACE("cuCtxGetDevice_v2");
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (!ctx) ctx = gp_ctx_current();
    int dev;
    if (!ctx || !gp_ctx_device(ctx, &dev)) return CUDA_ERROR_INVALID_CONTEXT;
    *device = dev;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(int32_t *device) { return cuCtxGetDevice_v2(device, 0); }

/* ---- device memory ----------------------------------------------------------------------------- */

/* Allocations land in this process's window of device addresses (gp_window_ensure), reserved here in
 * advance. Where one cannot (no window, a capture's memory node, a full window) and its address is
 * already host memory in this process, it is kept aside and the worker asked again, so the client can
 * always tell host from device pointers; the ones kept aside are freed. */
#define MAX_TRIES 8

static CUresult free_remote(uint64_t ptr, uint64_t stream, int async) {
    if (async) {
        struct gp_in_cuMemFreeAsync in = {.dptr = ptr, .stream = stream};
        return gp_call(GP_CALL_cuMemFreeAsync, 0, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
    }
    struct gp_in_cuMemFree_v2 in = {.dptr = ptr};
    return gp_call(GP_CALL_cuMemFree_v2, WANT, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
}

static CUresult alloc_reserved(uint64_t *dptr, uint64_t bytesize, int kind, uint64_t pool, uint64_t stream) {
    if (!dptr) return CUDA_ERROR_INVALID_VALUE;
    gp_window_ensure();
    uint64_t aside[MAX_TRIES];
    int n_aside = 0;
    CUresult r = CUDA_SUCCESS;
    for (;;) {
        uint64_t ptr = 0;
        if (kind == 0) {
            struct gp_in_cuMemAlloc_v2 in = {.bytesize = bytesize};
            struct gp_out_cuMemAlloc_v2 out;
            r = CALL(cuMemAlloc_v2, WANT, in, out);
            ptr = out.dptr;
        } else if (kind == 1) {
            struct gp_in_cuMemAllocAsync in = {.bytesize = bytesize, .stream = stream};
            struct gp_out_cuMemAllocAsync out;
            r = CALL(cuMemAllocAsync, WANT, in, out);
            ptr = out.dptr;
        } else {
            struct gp_in_cuMemAllocFromPoolAsync in = {.bytesize = bytesize, .pool = pool, .stream = stream};
            struct gp_out_cuMemAllocFromPoolAsync out;
            r = CALL(cuMemAllocFromPoolAsync, WANT, in, out);
            ptr = out.dptr;
        }
        if (r != CUDA_SUCCESS) break;
        if (gp_dev_add(ptr, bytesize, 1) == 0) {
            *dptr = ptr;
            break;
        }
        if (n_aside == MAX_TRIES) {
            gp_say("device address 0x%llx is host memory in this process, and so were %d more: allocation refused",
                   (unsigned long long)ptr, MAX_TRIES);
            free_remote(ptr, stream, kind != 0);
            r = CUDA_ERROR_OUT_OF_MEMORY;
            break;
        }
        aside[n_aside++] = ptr;
    }
    for (int i = 0; i < n_aside; i++) free_remote(aside[i], stream, kind != 0);
    return r;
}

CUresult cuMemAlloc_v2(uint64_t *dptr, uint64_t bytesize) {
    GP_TRACE("cuMemAlloc_v2");
    return alloc_reserved(dptr, bytesize, 0, 0, 0);
}

/* Rows of `width` bytes padded to the device's texture pitch alignment (CU_DEVICE_ATTRIBUTE_
 * TEXTURE_PITCH_ALIGNMENT, 51; at least 512 bytes, as the driver pads), in one allocation. */
CUresult cuMemAllocPitch_v2(uint64_t *dptr, uint64_t *pitch, uint64_t width, uint64_t height, uint32_t element_size) {
    GP_TRACE("cuMemAllocPitch_v2");
    int dev;
    int32_t align = 0;
    if (!dptr || !pitch || !width || !height || (element_size != 4 && element_size != 8 && element_size != 16))
        return CUDA_ERROR_INVALID_VALUE;
    if (gp_ctx_device(gp_ctx_current(), &dev)) cuDeviceGetAttribute(&align, 51, dev);
    uint64_t unit = align > 512 ? (uint64_t)align : 512;
    uint64_t padded = (width + unit - 1) / unit * unit;
    if (padded / unit > (1ull << 40) / height) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cuMemAlloc_v2(dptr, padded * height);
    if (r == CUDA_SUCCESS) *pitch = padded;
    return r;
}

CUresult cuMemAllocAsync(uint64_t *dptr, uint64_t bytesize, uint64_t stream) {
    GP_TRACE("cuMemAllocAsync");
    return alloc_reserved(dptr, bytesize, 1, 0, stream);
}

CUresult cuMemAllocFromPoolAsync(uint64_t *dptr, uint64_t bytesize, uint64_t pool, uint64_t stream) {
    GP_TRACE("cuMemAllocFromPoolAsync");
    if (gp_pool_is_local(pool)) return gp_pool_alloc_local(dptr, bytesize, pool); /* host or managed memory */
    return alloc_reserved(dptr, bytesize, 2, pool, stream);
}

/* Memory another process of the lease exported (an IPC handle, a pool's pointer): freeing it here ends
 * this process's use of it, as the driver does for an imported pointer; the owner's allocation stays. */
static int imported(uint64_t dptr) {
    uint64_t base;
    int owned;
    return gp_dev_lookup(dptr, &base, NULL, &owned) && base == dptr && owned == 0;
}

/* Managed memory and DEVICEMAP host memory: a device allocation of its own 2 MiB pages (so no other
 * allocation shares its host pages), zeroed, mirrored by host pages at the same address
 * (shim_managed.c). */
#define MANAGED_MIN ((1u << 20) + 1) /* past the worker's small allocations, which share pages */

static CUresult mirrored_alloc(uint64_t *dptr, uint64_t bytesize, int kind) {
    uint64_t ptr;
    CUresult r = alloc_reserved(&ptr, bytesize < MANAGED_MIN ? MANAGED_MIN : bytesize, 0, 0, 0);
    if (r != CUDA_SUCCESS) return r;
    struct gp_in_cuMemsetD8_v2 zero = {.dst = ptr, .value = 0, .count = bytesize};
    r = gp_call(GP_CALL_cuMemsetD8_v2, 0, &zero, sizeof zero, NULL, 0, NULL, 0, NULL, 0);
    if (r == CUDA_SUCCESS && gp_managed_add(ptr, bytesize, kind) != 0) r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r != CUDA_SUCCESS) {
        free_remote(ptr, 0, 0);
        gp_dev_remove(ptr);
        return r;
    }
    *dptr = ptr;
    return CUDA_SUCCESS;
}

CUresult cuMemAllocManaged(uint64_t *dptr, uint64_t bytesize, uint32_t flags) {
    GP_TRACE("cuMemAllocManaged");
    if (!dptr || !bytesize || (flags & ~3u) || !flags) return CUDA_ERROR_INVALID_VALUE; /* ATTACH_GLOBAL|HOST */
    return mirrored_alloc(dptr, bytesize, GP_MIRROR_MANAGED);
}

/* Prefetch and advice are hints to the driver's page migration; the mirror has none to give. A prefetch
 * to a device sends what the host wrote (as the next launch would); one to the host waits for the
 * next touch. Memory that is not managed is refused, as the driver does. */
#define LOCATION_HOST 2 /* CU_MEM_LOCATION_TYPE_HOST */

static CUresult managed_hint(uint64_t dptr, uint64_t count, int to_device) {
    if (gp_managed_lookup(dptr) != GP_MIRROR_MANAGED || (count && gp_managed_lookup(dptr + count - 1) != GP_MIRROR_MANAGED))
        return CUDA_ERROR_INVALID_VALUE;
    if (to_device) gp_managed_before(GP_CALL_cuMemsetD8_v2); /* as before any device work */
    return CUDA_SUCCESS;
}

CUresult cuMemPrefetchAsync(uint64_t dptr, uint64_t count, int32_t device, uint64_t stream) {
    GP_TRACE("cuMemPrefetchAsync");
    (void)stream;
    return managed_hint(dptr, count, device >= 0); /* CU_DEVICE_CPU is -1 */
}

CUresult cuMemPrefetchAsync_v2(uint64_t dptr, uint64_t count, uint64_t location, uint32_t flags, uint64_t stream) {
    GP_TRACE("cuMemPrefetchAsync_v2");
    (void)flags, (void)stream;
    return managed_hint(dptr, count, (int32_t)(location & 0xffffffffu) != LOCATION_HOST);
}

CUresult cuMemAdvise(uint64_t dptr, uint64_t count, int32_t advice, int32_t device) {
    GP_TRACE("cuMemAdvise");
    (void)advice, (void)device;
    return managed_hint(dptr, count, 0);
}

CUresult cuMemAdvise_v2(uint64_t dptr, uint64_t count, int32_t advice, uint64_t location) {
    GP_TRACE("cuMemAdvise_v2");
    (void)advice, (void)location;
    return managed_hint(dptr, count, 0);
}

CUresult cuMemFree_v2(uint64_t dptr) {
    GP_TRACE("cuMemFree_v2");
    if (!dptr) return CUDA_SUCCESS; /* as the driver does: cudart's cudaFree(NULL) idiom ends here */
    int mirror = gp_managed_lookup(dptr);
    if (mirror == GP_MIRROR_MAPPED) return CUDA_ERROR_INVALID_VALUE; /* host memory: cuMemFreeHost's */
    if (mirror == GP_MIRROR_MANAGED) gp_managed_remove(dptr);
    if (imported(dptr)) {
        gp_dev_remove(dptr);
        return CUDA_SUCCESS;
    }
    CUresult r = free_remote(dptr, 0, 0);
    if (r == CUDA_SUCCESS) gp_dev_remove(dptr);
    return r;
}

CUresult cuMemFreeAsync(uint64_t dptr, uint64_t stream) {
    GP_TRACE("cuMemFreeAsync");
    CUresult freed;
    if (gp_pool_free_local(dptr, &freed)) return freed; /* from a pool of host or managed memory */
    if (imported(dptr)) {
        gp_dev_remove(dptr);
        return CUDA_SUCCESS;
    }
    int owned = 0;
    uint64_t base = 0;
    if (!gp_dev_lookup(dptr, &base, NULL, &owned) || base != dptr || owned != 1) return CUDA_ERROR_INVALID_VALUE;
    gp_dev_remove(dptr);
    return free_remote(dptr, stream, 1);
}

/* ---- the virtual memory API: ranges from this process's window, memory created on the worker ------- */

#define ALLOCATION_PROP_BYTES 32 /* CUmemAllocationProp */
#define ACCESS_DESC_BYTES 12     /* CUmemAccessDesc: location type, location id, flags */
#define RESERVED_RANGE 2         /* gp_dev_add's `owned` for an address range (not an allocation) */

CUresult cuMemAddressReserve(uint64_t *ptr, uint64_t size, uint64_t alignment, uint64_t addr, uint64_t flags) {
    GP_TRACE("cuMemAddressReserve");
    if (!ptr || !size) return CUDA_ERROR_INVALID_VALUE;
    gp_window_ensure();
    struct gp_in_cuMemAddressReserve in = {.size = size, .alignment = alignment, .addr = addr, .flags = flags};
    struct gp_out_cuMemAddressReserve out;
    CUresult r = CALL(cuMemAddressReserve, WANT, in, out);
    if (r != CUDA_SUCCESS) return r;
    if (gp_dev_add(out.ptr, size, RESERVED_RANGE) != 0) { /* outside the window and host memory here */
        gp_say("device address range 0x%llx is host memory in this process: reservation refused",
               (unsigned long long)out.ptr);
        struct gp_in_cuMemAddressFree back = {.ptr = out.ptr, .size = size};
        gp_call(GP_CALL_cuMemAddressFree, WANT, &back, sizeof back, NULL, 0, NULL, 0, NULL, 0);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *ptr = out.ptr;
    return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(uint64_t ptr, uint64_t size) {
    GP_TRACE("cuMemAddressFree");
    struct gp_in_cuMemAddressFree in = {.ptr = ptr, .size = size};
    CUresult r = gp_call(GP_CALL_cuMemAddressFree, WANT, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
    if (r == CUDA_SUCCESS) gp_dev_remove(ptr);
    return r;
}

CUresult cuMemCreate(uint64_t *handle, uint64_t size, void *prop, uint64_t flags) {
    GP_TRACE("cuMemCreate");
    if (!handle || !prop) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuMemCreate in = {.size = size, .flags = flags};
    struct gp_out_cuMemCreate out;
    CUresult r = gp_call(GP_CALL_cuMemCreate, WANT, &in, sizeof in, prop, ALLOCATION_PROP_BYTES, &out, sizeof out,
                         NULL, 0);
    if (r == CUDA_SUCCESS) *handle = out.handle;
    return r;
}

CUresult cuMemSetAccess(uint64_t ptr, uint64_t size, void *desc, uint64_t count) {
    GP_TRACE("cuMemSetAccess");
    if ((!desc && count) || count > 64) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuMemSetAccess in = {.ptr = ptr, .size = size, .count = count};
    return gp_call(GP_CALL_cuMemSetAccess, WANT, &in, sizeof in, desc, count * ACCESS_DESC_BYTES, NULL, 0, NULL, 0);
}

CUresult cuMemGetAllocationGranularity(uint64_t *granularity, void *prop, int32_t option) {
    GP_TRACE("cuMemGetAllocationGranularity");
    if (!granularity || !prop) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuMemGetAllocationGranularity in = {.option = option};
    struct gp_out_cuMemGetAllocationGranularity out;
    CUresult r = gp_call(GP_CALL_cuMemGetAllocationGranularity, WANT, &in, sizeof in, prop, ALLOCATION_PROP_BYTES,
                         &out, sizeof out, NULL, 0);
    if (r == CUDA_SUCCESS) *granularity = out.granularity;
    return r;
}

CUresult cuMemPoolCreate(uint64_t *pool, void *props) {
    GP_TRACE("cuMemPoolCreate");
    if (!pool || !props) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = gp_pool_create_local(pool, props);
    if (r != CUDA_ERROR_NOT_FOUND) return r; /* a pool of host or managed memory, answered here */
    struct gp_out_cuMemPoolCreate out;
    r = gp_call(GP_CALL_cuMemPoolCreate, WANT, NULL, 0, props, 88 /* CUmemPoolProps */, &out, sizeof out,
                         NULL, 0);
    if (r == CUDA_SUCCESS) *pool = out.pool;
    return r;
}

/* ---- stream memory operations: words of device memory ---------------------------------------------- */

/* A word of mirrored host memory (mapped, registered or managed) is refused: the program reads it without
 * a synchronisation, and the mirror brings the device's bytes back only at one (docs/remote.md), so a
 * flag the stream wrote would never be seen, and one the host wrote never waited for. */
static CUresult stream_value(uint32_t call, uint64_t stream, uint64_t addr, uint64_t value, uint32_t flags, int wide) {
    static int said;
    if (gp_managed_lookup(addr) || gp_mirror_of_device(addr)) {
        if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
            gp_say("%s on mapped, registered or managed host memory is not forwarded (the program would see it "
                   "only at a synchronisation); it returns CUDA_ERROR_NOT_SUPPORTED (docs/remote.md)",
                   gp_call_names[call]);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
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

/* ---- tensor maps: encoded by the worker's driver (the address is the lease's), 128 bytes back ------ */

#define TENSOR_MAP_BYTES 128
#define TENSOR_RANK_MAX 5

CUresult cuTensorMapEncodeTiled(void *map, int32_t dtype, uint32_t rank, void *address, void *dims, void *strides,
                                void *box, void *element_strides, int32_t interleave, int32_t swizzle, int32_t l2,
                                int32_t oob) {
    GP_TRACE("cuTensorMapEncodeTiled");
    if (!map || !dims || !box || !element_strides || rank < 1 || rank > TENSOR_RANK_MAX || (rank > 1 && !strides))
        return CUDA_ERROR_INVALID_VALUE;
    unsigned char shape[TENSOR_RANK_MAX * 24];
    size_t at = 0;
    memcpy(shape + at, dims, 8 * rank), at += 8 * rank;
    if (rank > 1) memcpy(shape + at, strides, 8 * (rank - 1)), at += 8 * (rank - 1);
    memcpy(shape + at, box, 4 * rank), at += 4 * rank;
    memcpy(shape + at, element_strides, 4 * rank), at += 4 * rank;
    struct gp_in_cuTensorMapEncodeTiled in = {dtype, rank, (uint64_t)address, interleave, swizzle, l2, oob};
    return gp_call(GP_CALL_cuTensorMapEncodeTiled, WANT, &in, sizeof in, shape, at, NULL, 0, map, TENSOR_MAP_BYTES);
}

CUresult cuTensorMapEncodeIm2col(void *map, int32_t dtype, uint32_t rank, void *address, void *dims, void *strides,
                                 void *lower, void *upper, uint32_t channels, uint32_t pixels, void *element_strides,
                                 int32_t interleave, int32_t swizzle, int32_t l2, int32_t oob) {
    GP_TRACE("cuTensorMapEncodeIm2col");
    if (!map || !dims || !strides || !lower || !upper || !element_strides || rank < 3 || rank > TENSOR_RANK_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned char shape[TENSOR_RANK_MAX * 24];
    size_t at = 0;
    memcpy(shape + at, dims, 8 * rank), at += 8 * rank;
    memcpy(shape + at, strides, 8 * (rank - 1)), at += 8 * (rank - 1);
    memcpy(shape + at, lower, 4 * (rank - 2)), at += 4 * (rank - 2);
    memcpy(shape + at, upper, 4 * (rank - 2)), at += 4 * (rank - 2);
    memcpy(shape + at, element_strides, 4 * rank), at += 4 * rank;
    struct gp_in_cuTensorMapEncodeIm2col in = {dtype, rank, (uint64_t)address, channels, pixels, interleave, swizzle,
                                               l2, oob};
    return gp_call(GP_CALL_cuTensorMapEncodeIm2col, WANT, &in, sizeof in, shape, at, NULL, 0, map, TENSOR_MAP_BYTES);
}

CUresult cuTensorMapEncodeIm2colWide(void *map, int32_t dtype, uint32_t rank, void *address, void *dims, void *strides,
                                     int32_t lower, int32_t upper, uint32_t channels, uint32_t pixels,
                                     void *element_strides, int32_t interleave, int32_t mode, int32_t swizzle,
                                     int32_t l2, int32_t oob) {
    GP_TRACE("cuTensorMapEncodeIm2colWide");
    if (!map || !dims || !strides || !element_strides || rank < 3 || rank > TENSOR_RANK_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned char shape[TENSOR_RANK_MAX * 24];
    size_t at = 0;
    memcpy(shape + at, dims, 8 * rank), at += 8 * rank;
    memcpy(shape + at, strides, 8 * (rank - 1)), at += 8 * (rank - 1);
    memcpy(shape + at, element_strides, 4 * rank), at += 4 * rank;
    struct gp_in_cuTensorMapEncodeIm2colWide in = {dtype, rank, (uint64_t)address, lower, upper, channels, pixels,
                                                   interleave, mode, swizzle, l2, oob};
    return gp_call(GP_CALL_cuTensorMapEncodeIm2colWide, WANT, &in, sizeof in, shape, at, NULL, 0, map,
                   TENSOR_MAP_BYTES);
}

CUresult cuTensorMapReplaceAddress(void *map, void *address) {
    GP_TRACE("cuTensorMapReplaceAddress");
    if (!map) return CUDA_ERROR_INVALID_VALUE;
    unsigned char before[TENSOR_MAP_BYTES];
    memcpy(before, map, sizeof before);
    struct gp_in_cuTensorMapReplaceAddress in = {(uint64_t)address};
    return gp_call(GP_CALL_cuTensorMapReplaceAddress, WANT, &in, sizeof in, before, sizeof before, NULL, 0, map,
                   TENSOR_MAP_BYTES);
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

/* ---- IPC between the processes of one lease ------------------------------------------------------ */

static const char ipc_magic[16] = "gpupool ipc 1";

CUresult cuIpcGetMemHandle(void *handle, uint64_t dptr) {
    GP_TRACE("cuIpcGetMemHandle");
    uint64_t base, size;
    int owned;
    if (!handle || !gp_dev_lookup(dptr, &base, &size, &owned) || owned != 1) return CUDA_ERROR_INVALID_VALUE;
    unsigned char h[64] = {0};
    memcpy(h, ipc_magic, sizeof ipc_magic);
    memcpy(h + 16, &base, 8);
    memcpy(h + 24, &size, 8);
    memcpy(handle, h, sizeof h);
    return CUDA_SUCCESS;
}

static CUresult ipc_open(uint64_t *pdptr, struct gp_ipc_handle handle) {
    uint64_t base, size;
    if (!pdptr || memcmp(handle.reserved, ipc_magic, sizeof ipc_magic) != 0) return CUDA_ERROR_INVALID_VALUE;
    memcpy(&base, handle.reserved + 16, 8);
    memcpy(&size, handle.reserved + 24, 8);
    /* The worker answers only for this lease's live memory: a handle of another lease, or of an
     * allocation freed since, is refused there. */
    uint64_t got_base = 0, got_size = 0;
    CUresult r = cuMemGetAddressRange_v2(&got_base, &got_size, base);
    if (r != CUDA_SUCCESS) return r;
    if (got_base != base || got_size < size) return CUDA_ERROR_INVALID_VALUE; /* not that allocation any more */
    int owned;
    if (!gp_dev_lookup(base, NULL, NULL, &owned)) gp_dev_add(base, size, 0);
    *pdptr = base;
    return CUDA_SUCCESS;
}

CUresult cuIpcOpenMemHandle(uint64_t *pdptr, struct gp_ipc_handle handle, uint32_t flags) {
    GP_TRACE("cuIpcOpenMemHandle");
    (void)flags;
    return ipc_open(pdptr, handle);
}

CUresult cuIpcOpenMemHandle_v2(uint64_t *pdptr, struct gp_ipc_handle handle, uint32_t flags) {
    GP_TRACE("cuIpcOpenMemHandle_v2");
    (void)flags;
    return ipc_open(pdptr, handle);
}

/* A handle shared between processes of one lease is a real file descriptor (a memfd holding a magic and
 * the worker's handle), so a program passes it over a Unix socket, or to a child, as it would the driver's. */
#define POSIX_FILE_DESCRIPTOR 1 /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR */

static CUresult handle_to_fd(const char magic[16], uint64_t value, int *fd_out) {
    int fd = (int)syscall(SYS_memfd_create, "gpupool-handle", 0);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    unsigned char data[24];
    memcpy(data, magic, 16);
    memcpy(data + 16, &value, 8);
    if (pwrite(fd, data, sizeof data, 0) != (ssize_t)sizeof data) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *fd_out = fd;
    return CUDA_SUCCESS;
}

static CUresult handle_from_fd(const char magic[16], int fd, uint64_t *value) {
    unsigned char data[24];
    if (pread(fd, data, sizeof data, 0) != (ssize_t)sizeof data || memcmp(data, magic, 16) != 0)
        return CUDA_ERROR_INVALID_VALUE; /* not a handle exported by a process of a gpupool lease */
    memcpy(value, data + 16, 8);
    return CUDA_SUCCESS;
}

/* Pools shared between processes of one lease: the exported pool is a descriptor naming the lease's
 * pool; the exported pointer is 64 bytes naming the allocation, opened as an IPC memory handle is. */
static const char pool_magic[16] = "gpupool pool 1";
#define POOL_ATTR_RELEASE_THRESHOLD 4

static CUresult pool_of_lease(uint64_t pool) { /* the worker refuses a pool that is not the lease's */
    uint64_t threshold;
    return cuMemPoolGetAttribute(pool, POOL_ATTR_RELEASE_THRESHOLD, &threshold);
}

CUresult cuMemPoolExportToShareableHandle(void *handle, uint64_t pool, int32_t type, uint64_t flags) {
    GP_TRACE("cuMemPoolExportToShareableHandle");
    (void)flags;
    if (!handle) return CUDA_ERROR_INVALID_VALUE;
    if (type != POSIX_FILE_DESCRIPTOR || gp_pool_is_local(pool)) return CUDA_ERROR_NOT_SUPPORTED;
    CUresult r = pool_of_lease(pool);
    return r != CUDA_SUCCESS ? r : handle_to_fd(pool_magic, pool, (int *)handle);
}

CUresult cuMemPoolImportFromShareableHandle(uint64_t *pool, void *handle, int32_t type, uint64_t flags) {
    GP_TRACE("cuMemPoolImportFromShareableHandle");
    (void)flags;
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    if (type != POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
    uint64_t p;
    CUresult r = handle_from_fd(pool_magic, (int)(intptr_t)handle, &p);
    if (r == CUDA_SUCCESS) r = pool_of_lease(p);
    if (r == CUDA_SUCCESS) *pool = p;
    return r;
}

/* Memory of the virtual memory API shared between processes of one lease, as NCCL's cuMem transport
 * shares its buffers: the worker records the export in the lease and gives an importing process a
 * reference of its own, only to memory exported in the same lease. */
static const char vmem_magic[16] = "gpupool vmem 1";

CUresult cuMemExportToShareableHandle(void *shareable, uint64_t handle, int32_t type, uint64_t flags) {
    GP_TRACE("cuMemExportToShareableHandle");
    (void)flags;
    if (!shareable) return CUDA_ERROR_INVALID_VALUE;
    if (type != POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED; /* fabric, Win32: names outside the lease */
    struct gp_in_cuMemExportToShareableHandle in = {.handle = handle, .type = type};
    CUresult r = gp_call(GP_CALL_cuMemExportToShareableHandle, WANT, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
    return r != CUDA_SUCCESS ? r : handle_to_fd(vmem_magic, handle, (int *)shareable);
}

CUresult cuMemImportFromShareableHandle(uint64_t *handle, void *os_handle, int32_t type) {
    GP_TRACE("cuMemImportFromShareableHandle");
    if (!handle) return CUDA_ERROR_INVALID_VALUE;
    if (type != POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
    uint64_t exported;
    CUresult r = handle_from_fd(vmem_magic, (int)(intptr_t)os_handle, &exported);
    struct gp_in_cuMemImportFromShareableHandle in = {.exported = exported};
    struct gp_out_cuMemImportFromShareableHandle out;
    if (r == CUDA_SUCCESS) r = CALL(cuMemImportFromShareableHandle, WANT, in, out);
    if (r == CUDA_SUCCESS) *handle = out.handle;
    return r;
}

CUresult cuMemPoolExportPointer(void *data, uint64_t ptr) {
    GP_TRACE("cuMemPoolExportPointer");
    return cuIpcGetMemHandle(data, ptr);
}

CUresult cuMemPoolImportPointer(uint64_t *ptr, uint64_t pool, void *data) {
    GP_TRACE("cuMemPoolImportPointer");
    if (!data) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = pool_of_lease(pool);
    if (r != CUDA_SUCCESS) return r;
    struct gp_ipc_handle handle;
    memcpy(&handle, data, sizeof handle);
    return ipc_open(ptr, handle);
}

CUresult cuIpcCloseMemHandle(uint64_t dptr) {
    GP_TRACE("cuIpcCloseMemHandle");
    uint64_t base;
    int owned;
    if (!gp_dev_lookup(dptr, &base, NULL, &owned) || owned || base != dptr) return CUDA_ERROR_INVALID_VALUE;
    gp_dev_remove(base);
    return CUDA_SUCCESS;
}

/* Events: the importing process gets the exporter's own event (both talk to the lease's worker), so
 * its cuEventDestroy must close only its opening of it. Opened events, with how often, are kept here. */
static const char ipc_event_magic[16] = "gpupool ipcev 1";
static struct { uint64_t event; int opens; } ipc_events[256];
static int n_ipc_events;
static pthread_mutex_t ipc_event_lock = PTHREAD_MUTEX_INITIALIZER;

CUresult cuIpcGetEventHandle(void *handle, uint64_t event) {
    GP_TRACE("cuIpcGetEventHandle");
    if (!handle || !event) return CUDA_ERROR_INVALID_VALUE;
    unsigned char h[64] = {0};
    memcpy(h, ipc_event_magic, sizeof ipc_event_magic);
    memcpy(h + 16, &event, 8);
    memcpy(handle, h, sizeof h);
    return CUDA_SUCCESS;
}

CUresult cuIpcOpenEventHandle(uint64_t *event, struct gp_ipc_handle handle) {
    GP_TRACE("cuIpcOpenEventHandle");
    if (!event || memcmp(handle.reserved, ipc_event_magic, sizeof ipc_event_magic) != 0) return CUDA_ERROR_INVALID_VALUE;
    uint64_t e;
    memcpy(&e, handle.reserved + 16, 8);
    /* The worker answers for this lease's events only: another lease's is CUDA_ERROR_INVALID_HANDLE. */
    CUresult r = cuEventQuery(e);
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_READY) return r;
    pthread_mutex_lock(&ipc_event_lock);
    int i;
    for (i = 0; i < n_ipc_events && ipc_events[i].event != e; i++) {
    }
    if (i == n_ipc_events && n_ipc_events < (int)(sizeof ipc_events / sizeof ipc_events[0])) {
        ipc_events[n_ipc_events].event = e;
        ipc_events[n_ipc_events++].opens = 0;
    }
    int kept = i < n_ipc_events;
    if (kept) ipc_events[i].opens++;
    pthread_mutex_unlock(&ipc_event_lock);
    if (!kept) return CUDA_ERROR_OUT_OF_MEMORY;
    *event = e;
    return CUDA_SUCCESS;
}

CUresult cuEventDestroy_v2(uint64_t event) {
    GP_TRACE("cuEventDestroy_v2");
    int opened = 0;
    pthread_mutex_lock(&ipc_event_lock);
    for (int i = 0; i < n_ipc_events; i++) {
        if (ipc_events[i].event == event) {
            opened = 1;
            if (--ipc_events[i].opens == 0) ipc_events[i] = ipc_events[--n_ipc_events];
            break;
        }
    }
    pthread_mutex_unlock(&ipc_event_lock);
    if (opened) return CUDA_SUCCESS; /* the exporter's event stays */
    struct gp_in_cuEventDestroy_v2 in = {.event = event};
    return gp_call(GP_CALL_cuEventDestroy_v2, 0, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
}

static void note_global(uint64_t *dptr, uint64_t *bytes, uint64_t d, uint64_t n) {
    gp_dev_add(d, n, 0);
    if (dptr) *dptr = d;
    if (bytes) *bytes = n;
}

CUresult cuModuleGetGlobal_v2(uint64_t *dptr, uint64_t *bytes, uint64_t module, const char *name) {
    GP_TRACE("cuModuleGetGlobal_v2");
    if (!name) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuModuleGetGlobal_v2 in = {.module = module};
    struct gp_out_cuModuleGetGlobal_v2 out;
    CUresult r = gp_call(GP_CALL_cuModuleGetGlobal_v2, WANT, &in, sizeof in, name, strlen(name) + 1, &out, sizeof out,
                         NULL, 0);
    if (r == CUDA_SUCCESS) note_global(dptr, bytes, out.dptr, out.bytes);
    return r;
}

CUresult cuLibraryGetGlobal(uint64_t *dptr, uint64_t *bytes, uint64_t library, const char *name) {
    GP_TRACE("cuLibraryGetGlobal");
    if (!name) return CUDA_ERROR_INVALID_VALUE;
    if (gp_trace_enabled) gp_say("  global %s", name);
    struct gp_in_cuLibraryGetGlobal in = {.library = library};
    struct gp_out_cuLibraryGetGlobal out;
    CUresult r = gp_call(GP_CALL_cuLibraryGetGlobal, WANT, &in, sizeof in, name, strlen(name) + 1, &out, sizeof out,
                         NULL, 0);
    if (r == CUDA_SUCCESS) note_global(dptr, bytes, out.dptr, out.bytes);
    return r;
}

/* ---- host memory stays here ---------------------------------------------------------------------- */

/* Page-locked memory is host memory of this process. What kernels are to read as well (DEVICEMAP, or
 * memory whose device pointer is asked for) is mirrored by device memory of the lease, which counts
 * against the partition (shim_managed.c). */
#define HOSTALLOC_DEVICEMAP 0x02

/* Under unified addressing every cuMemAllocHost / cuMemHostAlloc allocation is the GPU's at its own
 * address, whatever its flags: programs hand such buffers to kernels as they are (cuda.core's
 * examples do). So each lies in a range of device addresses reserved for it on the worker
 * (cuMemAddressReserve, from this process's window): host pages only, copied to and from as any
 * page-locked memory, until a kernel or kernel node is given an address in it or its device pointer
 * is asked for. Then memory of the lease is mapped at the same addresses (cuMemCreate, cuMemMap) and
 * the pages become its mirror (shim_managed.c): the kernel reads what the host wrote, the host what
 * the kernel wrote. From then on it counts against the partition. */
#define PINNED_GRANULE (2ull << 20) /* the driver's mapping granularity */
#define MAX_PINNED 4096
struct pinned {
    uint64_t base, range, size, handle; /* handle: the device memory mapped there, 0 until then */
    int shared;                         /* the worker maps its pages too (gp_pinned_share) */
    uint64_t landing;                   /* copies sent into it since it was last settled */
};
static struct pinned pinned[MAX_PINNED];
static int n_pinned;
static pthread_mutex_t pinned_lock = PTHREAD_MUTEX_INITIALIZER;
/* Page-locked ranges whose own address the device cannot use (not mapped yet, registered memory): while
 * there are none, launches look at no parameter. */
static int n_unreachable;

/* And the 2 MiB granules of the address space they lie in, a bit each (8 MiB of address space for the
 * 47-bit user half, pages only where bits are set): a launch's parameter words elsewhere — device
 * pointers, sizes — pass without a lock. A pinned allocation's granules are its own and are cleared
 * when it is mapped or freed; those of registered memory stay set (a lookup then says no more). */
#define GRANULE_SHIFT 21
static uint64_t *granules;

static void granules_mark(uint64_t base, uint64_t size, int set) {
    if (!granules) {
        void *bits = mmap(NULL, (1ull << (47 - GRANULE_SHIFT)) / 8, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (bits == MAP_FAILED) return; /* unmarked: launches look every word up */
        void *none = NULL;
        if (!__atomic_compare_exchange_n(&granules, &none, bits, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            munmap(bits, (1ull << (47 - GRANULE_SHIFT)) / 8);
    }
    for (uint64_t g = base >> GRANULE_SHIFT; g <= (base + size - 1) >> GRANULE_SHIFT && g >> (47 - GRANULE_SHIFT) == 0;
         g++) {
        if (set) __atomic_fetch_or(&granules[g / 64], 1ull << (g % 64), __ATOMIC_RELEASE);
        else __atomic_fetch_and(&granules[g / 64], ~(1ull << (g % 64)), __ATOMIC_RELEASE);
    }
}

static int granule_marked(uint64_t v) { /* v in the user half */
    uint64_t g = v >> GRANULE_SHIFT, *bits = __atomic_load_n(&granules, __ATOMIC_ACQUIRE);
    return !bits || (__atomic_load_n(&bits[g / 64], __ATOMIC_ACQUIRE) >> (g % 64) & 1);
}

static CUresult pinned_alloc(uint64_t *pp, uint64_t bytesize, unsigned flags) {
    uint64_t range = (bytesize + PINNED_GRANULE - 1) / PINNED_GRANULE * PINNED_GRANULE;
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), pages = (bytesize + page - 1) / page * page;
    gp_window_ensure();
    struct gp_in_cuMemAddressReserve in = {.size = range, .alignment = PINNED_GRANULE};
    struct gp_out_cuMemAddressReserve out;
    CUresult r = CALL(cuMemAddressReserve, WANT, in, out);
    if (r != CUDA_SUCCESS) return r;
    pthread_mutex_lock(&pinned_lock);
    int room = n_pinned < MAX_PINNED;
    /* On the worker's host its pages are the worker's pinned memory too: copies need no bytes sent. */
    int reserved = room && gp_reserve_range(out.ptr, range) == 0;
    int fd = reserved ? gp_pinned_share(out.ptr, pages) : -1;
    if (fd >= 0 && mmap((void *)out.ptr, pages, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
        struct gp_in_gpPinnedDrop drop = {.base = out.ptr};
        gp_call(GP_CALL_gpPinnedDrop, WANT, &drop, sizeof drop, NULL, 0, NULL, 0, NULL, 0);
        close(fd);
        fd = -1;
    }
    int shared = fd >= 0;
    if (shared) close(fd);
    if (reserved && (shared || mmap((void *)out.ptr, pages, PROT_READ | PROT_WRITE,
                                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED)) {
        pinned[n_pinned++] = (struct pinned){out.ptr, range, bytesize, 0, shared, 0};
        gp_host_add(out.ptr, bytesize, flags, 1);
        granules_mark(out.ptr, range, 1);
        __atomic_add_fetch(&n_unreachable, 1, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&pinned_lock);
        *pp = out.ptr;
        return CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&pinned_lock);
    struct gp_in_cuMemAddressFree back = {.ptr = out.ptr, .size = range};
    gp_call(GP_CALL_cuMemAddressFree, WANT, &back, sizeof back, NULL, 0, NULL, 0, NULL, 0);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

static struct pinned *pinned_find(uint64_t base) { /* under pinned_lock */
    for (int i = 0; i < n_pinned; i++)
        if (pinned[i].base == base) return &pinned[i];
    return NULL;
}

/* Device memory of the current context's device mapped at p's own addresses, readable and writable by
 * that device and each lease device that can reach it (as page-locked memory is every device's), the
 * host pages its mirror (all of them written: the next device work sends them). */
#define MAX_ACCESS 16
static CUresult copies_settle(const void *p, uint64_t count);
static CUresult socket_copies_settle(const void *p, uint64_t count);
static CUresult pinned_settle_held(uint64_t at, uint64_t count);

static CUresult pinned_map(struct pinned *p) {
    int dev = 0, count = 1, peer;
    gp_ctx_device(gp_ctx_current(), &dev);
    int32_t prop[8] = {1 /* PINNED */, 0, 1 /* LOCATION_DEVICE */, dev}; /* CUmemAllocationProp, 32 bytes */
    int32_t access[MAX_ACCESS][3]; /* CUmemAccessDesc: LOCATION_DEVICE, the device, PROT_READWRITE */
    uint32_t n_access = 0;
    if (cuDeviceGetCount(&count) != CUDA_SUCCESS || count > MAX_ACCESS) count = 1;
    for (int d = 0; d < count; d++)
        if (d == dev || (cuDeviceCanAccessPeer(&peer, d, dev) == CUDA_SUCCESS && peer)) {
            access[n_access][0] = 1, access[n_access][1] = d, access[n_access][2] = 3;
            n_access++;
        }
    uint64_t handle, page = (uint64_t)sysconf(_SC_PAGESIZE);
    /* the pages hold every copy to them first (the caller holds pinned_lock) */
    CUresult r = pinned_settle_held(p->base, p->size);
    if (r == CUDA_SUCCESS) r = socket_copies_settle((const void *)p->base, p->size);
    if (r != CUDA_SUCCESS) return r;
    r = cuMemCreate(&handle, p->range, prop, 0);
    if (r != CUDA_SUCCESS) return r;
    r = cuMemMap(p->base, p->range, 0, handle, 0);
    if (r == CUDA_SUCCESS) {
        r = cuMemSetAccess(p->base, p->range, access, n_access);
        if (r == CUDA_SUCCESS && gp_mirror_host(p->base, (p->size + page - 1) / page * page, p->base) != 0)
            r = CUDA_ERROR_NOT_SUPPORTED; /* the mirrors' table is full */
        if (r != CUDA_SUCCESS) cuMemUnmap(p->base, p->range);
    }
    if (r != CUDA_SUCCESS) {
        cuMemRelease(handle);
        return r;
    }
    p->handle = handle;
    granules_mark(p->base, p->range, 0);
    __atomic_sub_fetch(&n_unreachable, 1, __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
}

/* The page-locked allocation at base, usable by the device at its own address from now on;
 * CUDA_ERROR_NOT_FOUND when it is not one of those (registered memory). */
static CUresult pinned_reach(uint64_t base) {
    pthread_mutex_lock(&pinned_lock);
    struct pinned *p = pinned_find(base);
    CUresult r = !p ? CUDA_ERROR_NOT_FOUND : p->handle ? CUDA_SUCCESS : pinned_map(p);
    pthread_mutex_unlock(&pinned_lock);
    return r;
}

/* cuMemFreeHost of a pinned allocation (1), or 0 when `at` is none: the device memory goes once the GPU
 * is done with it (the driver's cuMemFreeHost waits too), the pages go back to being reserved. */
static int pinned_free(uint64_t at) {
    pthread_mutex_lock(&pinned_lock);
    struct pinned *found = pinned_find(at), p = found ? *found : (struct pinned){0};
    if (found) *found = pinned[--n_pinned];
    pthread_mutex_unlock(&pinned_lock);
    if (!found) return 0;
    if (p.shared) { /* the worker lets go of its side once copies into it are done */
        struct gp_in_gpPinnedDrop drop = {.base = p.base};
        gp_call(GP_CALL_gpPinnedDrop, WANT, &drop, sizeof drop, NULL, 0, NULL, 0, NULL, 0);
    }
    if (p.handle) {
        gp_managed_forget(p.base);
        cuCtxSynchronize();
        cuMemUnmap(p.base, p.range);
        cuMemRelease(p.handle);
    } else {
        granules_mark(p.base, p.range, 0);
        __atomic_sub_fetch(&n_unreachable, 1, __ATOMIC_RELEASE);
    }
    mmap((void *)p.base, p.range, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    struct gp_in_cuMemAddressFree back = {.ptr = p.base, .size = p.range};
    gp_call(GP_CALL_cuMemAddressFree, WANT, &back, sizeof back, NULL, 0, NULL, 0, NULL, 0);
    return 1;
}

void gp_pinned_touch(uint64_t ptr) {
    uint64_t base;
    if (__atomic_load_n(&n_unreachable, __ATOMIC_ACQUIRE) && !(ptr >> 47) && granule_marked(ptr) &&
        gp_host_lookup(ptr, &base, NULL, NULL))
        pinned_reach(base); /* if it cannot be, the call fails on the worker as for any other address */
}

/* Each 8-byte word of a kernel's packed parameters that is an address of page-locked memory here: that
 * memory is made the device's at that address if it can be (pinned_map); if not (registered memory,
 * whose device pointer is another), the launch is refused at the call, with a word on stderr once —
 * the kernel would fault on the worker, where the address is nothing of the program's. */
static CUresult params_reach(const unsigned char *params, int64_t len) {
    static int said;
    if (!__atomic_load_n(&n_unreachable, __ATOMIC_ACQUIRE)) return CUDA_SUCCESS;
    for (int64_t at = 0; at + 8 <= len; at += 8) {
        uint64_t v, base, dev;
        memcpy(&v, params + at, 8);
        if (v < 4096 || v >> 47 || !granule_marked(v) || !gp_host_lookup(v, &base, NULL, NULL)) continue;
        if (gp_mirror_device(v, &dev) && dev == v) continue; /* DEVICEMAP, or pinned and mapped */
        CUresult r = pinned_reach(base);
        if (r == CUDA_ERROR_NOT_FOUND) {
            if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
                gp_say("a kernel was given 0x%llx, an address of registered page-locked memory of this process: the "
                       "remote GPU cannot use it there; the launch returns CUDA_ERROR_NOT_SUPPORTED (give it "
                       "cuMemHostGetDevicePointer's pointer, or allocate with cuMemHostAlloc)",
                       (unsigned long long)v);
            return CUDA_ERROR_NOT_SUPPORTED;
        }
        if (r != CUDA_SUCCESS) return r;
    }
    return CUDA_SUCCESS;
}

static CUresult host_alloc(uint64_t *pp, uint64_t bytesize, unsigned flags) {
    if (!pp || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    if (flags & HOSTALLOC_DEVICEMAP) { /* at its device address, as unified addressing has it */
        CUresult r = mirrored_alloc(pp, bytesize, GP_MIRROR_MAPPED);
        if (r == CUDA_SUCCESS) gp_host_add(*pp, bytesize, flags, 1);
        return r;
    }
    if (pinned_alloc(pp, bytesize, flags) == CUDA_SUCCESS) return CUDA_SUCCESS;
    /* No device addresses for it (none left in the window, or they are host memory here): host pages
     * alone, whole ones of its own so that it can be mirrored page by page; kernels given its address
     * are refused (params_reach). */
    void *p = NULL;
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    if (posix_memalign(&p, page, (bytesize + page - 1) / page * page) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    gp_host_add((uint64_t)p, bytesize, flags, 1);
    granules_mark((uint64_t)p, bytesize, 1);
    __atomic_add_fetch(&n_unreachable, 1, __ATOMIC_RELEASE);
    *pp = (uint64_t)p;
    return CUDA_SUCCESS;
}

CUresult cuMemAllocHost_v2(uint64_t *pp, uint64_t bytesize) {
    GP_TRACE("cuMemAllocHost_v2");
    return host_alloc(pp, bytesize, 0);
}

CUresult cuMemHostAlloc(uint64_t *pp, uint64_t bytesize, uint32_t flags) {
    GP_TRACE("cuMemHostAlloc");
    return host_alloc(pp, bytesize, flags);
}

/* The device side of mirrored host memory at base goes (its bytes back in the host pages first). */
static void unmirror(uint64_t base) {
    uint64_t dev = gp_managed_remove(base);
    if (!dev) return;
    free_remote(dev, 0, 0);
    gp_dev_remove(dev);
}

CUresult cuMemFreeHost(void *p) {
    GP_TRACE("cuMemFreeHost");
    copies_settle_host(p);
    uint64_t at = (uint64_t)p;
    int mirror = gp_managed_lookup(at);
    if (mirror == GP_MIRROR_MANAGED) return CUDA_ERROR_INVALID_VALUE;
    if (gp_host_remove(at, 1) != 0) return CUDA_ERROR_INVALID_VALUE;
    if (pinned_free(at)) return CUDA_SUCCESS;
    unmirror(at);
    if (mirror != GP_MIRROR_MAPPED) { /* a mapped allocation's pages were the window's */
        free(p);
        __atomic_sub_fetch(&n_unreachable, 1, __ATOMIC_RELEASE);
    }
    return CUDA_SUCCESS;
}

CUresult cuMemHostRegister_v2(void *p, uint64_t bytesize, uint32_t flags) {
    GP_TRACE("cuMemHostRegister_v2");
    if (!p || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    if (gp_host_add((uint64_t)p, bytesize, flags, 0) != 0) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    granules_mark((uint64_t)p, bytesize, 1);
    __atomic_add_fetch(&n_unreachable, 1, __ATOMIC_RELEASE); /* its own address is never the device's */
    return CUDA_SUCCESS;
}

CUresult cuMemHostUnregister(void *p) {
    GP_TRACE("cuMemHostUnregister");
    copies_settle_host(p);
    if (gp_host_remove((uint64_t)p, 0) != 0) return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    __atomic_sub_fetch(&n_unreachable, 1, __ATOMIC_RELEASE);
    unmirror((uint64_t)p);
    return CUDA_SUCCESS;
}

CUresult cuMemHostGetFlags(uint32_t *flags, void *p) {
    GP_TRACE("cuMemHostGetFlags");
    unsigned f;
    if (!flags || !gp_host_lookup((uint64_t)p, NULL, NULL, &f)) return CUDA_ERROR_INVALID_VALUE;
    *flags = f;
    return CUDA_SUCCESS;
}

/* An allocation's device pointer is its own address (DEVICEMAP, or pinned: mapped now). Registered
 * memory is mirrored from the first time its device pointer is asked for, by a device allocation of the
 * lease: the pointer is that allocation's (a kernel given the host address itself is refused,
 * params_reach). */
CUresult cuMemHostGetDevicePointer_v2(uint64_t *pdptr, void *p, uint32_t flags) {
    GP_TRACE("cuMemHostGetDevicePointer_v2");
    uint64_t at = (uint64_t)p, base, size, dev;
    if (!pdptr || flags != 0 || !gp_host_lookup(at, &base, &size, NULL)) return CUDA_ERROR_INVALID_VALUE;
    if (gp_mirror_device(at, pdptr)) return CUDA_SUCCESS;
    CUresult reached = pinned_reach(base);
    if (reached != CUDA_ERROR_NOT_FOUND) {
        if (reached == CUDA_SUCCESS) *pdptr = at;
        return reached;
    }
    CUresult r = alloc_reserved(&dev, size, 0, 0, 0);
    if (r != CUDA_SUCCESS) return r;
    if (gp_mirror_host(base, size, dev) != 0) {
        gp_say("page-locked memory at 0x%llx shares a page with other mapped memory (or 4096 are mapped): "
               "it cannot be mapped for kernels", (unsigned long long)base);
        free_remote(dev, 0, 0);
        gp_dev_remove(dev);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    *pdptr = dev + (at - base);
    return CUDA_SUCCESS;
}

/* ---- copies ------------------------------------------------------------------------------------ */

static int device_range(uint64_t ptr, uint64_t count) {
    uint64_t base, size;
    return gp_dev_lookup(ptr, &base, &size, NULL) && count <= size - (ptr - base);
}

static int is_device(uint64_t ptr) { return gp_dev_lookup(ptr, NULL, NULL, NULL); }

/* Copies to the host still landing in [p, p+count) are in place before the caller reads or frees it
 * (the worker sends every copy in flight, each once done; natively the stream order or the free's
 * synchronisation gives the same). Nothing to ask while none lands there. */
static CUresult copies_settle(const void *p, uint64_t count) {
    pthread_mutex_lock(&pinned_lock);
    CUresult r = pinned_settle_held((uint64_t)p, count);
    pthread_mutex_unlock(&pinned_lock);
    return r == CUDA_SUCCESS ? socket_copies_settle(p, count) : r;
}

static CUresult socket_copies_settle(const void *p, uint64_t count) {
    if (!gp_copies_into(p, count)) return CUDA_SUCCESS;
    struct gp_in_gpCopiesFlush in = {.wait = 1};
    return gp_call(GP_CALL_gpCopiesFlush, WANT, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
}

static CUresult copies_settle_host(const void *p) { /* before page-locked memory is given back */
    uint64_t base, size;
    return gp_host_lookup((uint64_t)p, &base, &size, NULL) ? copies_settle((void *)base, size) : CUDA_SUCCESS;
}

/* Page-locked memory named where the device's side of a copy goes: under unified addressing the device
 * reaches it at the host's address, so natively such a copy works. Memory the device already uses (a
 * mirror, shim_managed.c) is copied through its device copy (*side set to it, 2 returned: the lease's
 * memory, as the worker checks); memory it never used is copied here, host to host, once copies still
 * landing there are in (1 returned, *r set). 0: not page-locked memory. */
static int page_locked(const void *p, uint64_t count);

static int page_locked_side(uint64_t *side, uint64_t other, uint64_t count, int to_side, CUresult *r) {
    uint64_t mirrored;
    if (is_device(*side)) return 0;
    if (gp_mirror_device(*side, &mirrored)) {
        *side = mirrored;
        return 2;
    }
    if (!page_locked((const void *)*side, count)) return 0;
    *r = copies_settle((const void *)*side, count);
    if (*r == CUDA_SUCCESS) *r = copies_settle((const void *)other, count);
    if (*r == CUDA_SUCCESS)
        memmove(to_side ? (void *)*side : (void *)other, to_side ? (const void *)other : (const void *)*side, count);
    return 1;
}

/* The shared page-locked allocation [p, +count) lies in, not used by the device at its own address
 * (a mirror's copies go to its device copy): its base, or 0. `landing`: a copy into it is being sent. */
static uint64_t pinned_shared(const void *p, uint64_t count, int landing) {
    uint64_t at = (uint64_t)p, base = 0;
    pthread_mutex_lock(&pinned_lock);
    for (int i = 0; i < n_pinned && !base; i++)
        if (pinned[i].shared && !pinned[i].handle && pinned[i].base <= at && count <= pinned[i].size &&
            at - pinned[i].base <= pinned[i].size - count) {
            base = pinned[i].base;
            pinned[i].landing += landing != 0;
        }
    pthread_mutex_unlock(&pinned_lock);
    return base;
}

/* A copy between the lease's memory and shared page-locked memory: the worker's DMA on the stream does
 * it all, so an Async one is one unanswered frame, ordered by its stream alone as natively; a
 * synchronous one (the legacy default stream) is answered once done. */
static CUresult pinned_copy(uint32_t call, uint64_t device, const void *host, uint64_t count, uint64_t stream) {
    int to_device = call == GP_CALL_cuMemcpyHtoD_v2 || call == GP_CALL_cuMemcpyHtoDAsync_v2;
    int synchronous = call == GP_CALL_cuMemcpyHtoD_v2 || call == GP_CALL_cuMemcpyDtoH_v2;
    struct gp_in_gpPinnedCopy in = {.device = device, .host = (uint64_t)host, .count = count,
                                    .stream = synchronous ? 0 : stream, .flags = to_device | synchronous << 1};
    CUresult r = gp_call(GP_CALL_gpPinnedCopy, synchronous ? WANT : 0, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
    if (r == CUDA_SUCCESS && synchronous && gp_copies_in_flight()) {
        /* A synchronous copy waits for the default stream: copies to the host done by then land first. */
        struct gp_in_gpCopiesFlush flush = {.wait = 0};
        r = gp_call(GP_CALL_gpCopiesFlush, WANT, &flush, sizeof flush, NULL, 0, NULL, 0, NULL, 0);
    }
    return r;
}

/* Before the host reads or writes shared page-locked memory outside any stream (here, not by a program
 * that synchronised): the copies sent into it are in place. Under pinned_lock. */
static CUresult pinned_settle_held(uint64_t at, uint64_t count) {
    uint64_t due = 0;
    for (int i = 0; i < n_pinned; i++)
        if (pinned[i].shared && pinned[i].landing && pinned[i].base < at + count && at < pinned[i].base + pinned[i].size) {
            due += pinned[i].landing;
            pinned[i].landing = 0;
        }
    if (!due) return CUDA_SUCCESS;
    struct gp_in_gpPinnedSettle in = {.host = at, .count = count};
    return gp_call(GP_CALL_gpPinnedSettle, WANT, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
}

/* The child's connection is a new client to the worker, which shares nothing with it: its copies of the
 * parent's allocations go as any page-locked memory's (the pages stay shared with the parent). */
void gp_pinned_after_fork_in_child(void) {
    for (int i = 0; i < n_pinned; i++) pinned[i].shared = 0;
    pthread_mutex_init(&pinned_lock, NULL);
}

static CUresult htod(uint32_t call, uint64_t dst, const void *src, uint64_t count, uint64_t stream) {
    uint64_t mirrored;
    CUresult here;
    if (count == 0) return CUDA_SUCCESS;
    int locked = page_locked_side(&dst, (uint64_t)src, count, 1, &here);
    if (locked == 1) return here;
    if (gp_mirror_device((uint64_t)src, &mirrored)) /* mirrored memory as the source: the device copy of it */
        return call == GP_CALL_cuMemcpyHtoD_v2 ? cuMemcpyDtoD_v2(dst, mirrored, count)
                                               : cuMemcpyDtoDAsync_v2(dst, mirrored, count, stream);
    /* A device address as the host side would fault inside sendmsg and cost the connection. */
    if (!src || (!locked && !device_range(dst, count)) || is_device((uint64_t)src)) return CUDA_ERROR_INVALID_VALUE;
    if (!locked && pinned_shared(src, count, 0)) {
        gp_managed_before(call);
        return pinned_copy(call, dst, src, count, stream);
    }
    /* The bytes are read now, so a copy to the host still landing in them must be there first (on a
     * GPU the stream orders the two). */
    CUresult r = copies_settle(src, count);
    if (r != CUDA_SUCCESS) return r;
    struct gp_in_cuMemcpyHtoD_v2 in = {.dst = dst, .count = count, .stream = stream};
    /* Returns once the bytes are in the socket (or the worker's DMA has read them from the memory it
     * shares with this process): the caller may reuse its buffer at once. */
    if (!gp_bulk_copy(call, dst, (void *)src, count, stream, &r)) r = gp_call(call, 0, &in, sizeof in, src, count, NULL, 0, NULL, 0);
    if (r == CUDA_SUCCESS && call == GP_CALL_cuMemcpyHtoD_v2 && gp_copies_in_flight()) {
        /* A synchronous copy waits for the default stream: copies to the host done by then land first. */
        struct gp_in_gpCopiesFlush flush = {.wait = 0};
        r = gp_call(GP_CALL_gpCopiesFlush, WANT, &flush, sizeof flush, NULL, 0, NULL, 0, NULL, 0);
    }
    return r;
}

static int page_locked(const void *p, uint64_t count) {
    uint64_t base, size;
    return gp_host_lookup((uint64_t)p, &base, &size, NULL) && count <= size - ((uint64_t)p - base);
}

static CUresult dtoh(uint32_t call, void *dst, uint64_t src, uint64_t count, uint64_t stream) {
    uint64_t mirrored;
    CUresult here;
    if (count == 0) return CUDA_SUCCESS;
    int locked = page_locked_side(&src, (uint64_t)dst, count, 0, &here);
    if (locked == 1) return here;
    if (gp_mirror_device((uint64_t)dst, &mirrored)) /* into mirrored memory: into its device copy */
        return call == GP_CALL_cuMemcpyDtoH_v2 ? cuMemcpyDtoD_v2(mirrored, src, count)
                                               : cuMemcpyDtoDAsync_v2(mirrored, src, count, stream);
    if (!dst || (!locked && !device_range(src, count)) || is_device((uint64_t)dst)) return CUDA_ERROR_INVALID_VALUE;
    if (!locked && pinned_shared(dst, count, 1)) {
        gp_managed_before(call); /* as before any copy: what the host wrote to managed memory first */
        return pinned_copy(call, src, dst, count, stream);
    }
    if (call == GP_CALL_cuMemcpyDtoHAsync_v2 && page_locked(dst, count) && gp_callbacks_start() == CUDA_SUCCESS) {
        /* Into page-locked memory the call returns at once, as natively; the bytes come on the callback
         * connection once the worker's stream gets there (shim.c). */
        gp_managed_before(call); /* as before any copy: what the host wrote to managed memory first */
        uint64_t id = gp_copy_expect(dst, count);
        if (!id) return CUDA_ERROR_OUT_OF_MEMORY;
        struct gp_in_gpMemcpyDtoHAsync in = {.src = src, .count = count, .stream = stream, .id = id};
        CUresult r = gp_call(GP_CALL_gpMemcpyDtoHAsync, 0, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
        if (r != CUDA_SUCCESS) gp_copy_drop(id);
        return r;
    }
    /* Into pageable memory the driver's copy is synchronous too: the reply streams straight into the
     * caller's buffer. */
    CUresult r;
    if (gp_bulk_copy(call, src, dst, count, stream, &r)) return r;
    struct gp_in_cuMemcpyDtoH_v2 in = {.src = src, .count = count, .stream = stream};
    return gp_call(call, WANT, &in, sizeof in, NULL, 0, NULL, 0, dst, count);
}

CUresult cuMemcpyHtoD_v2(uint64_t dst, void *src, uint64_t count) {
    GP_TRACE("cuMemcpyHtoD_v2");
    return htod(GP_CALL_cuMemcpyHtoD_v2, dst, src, count, 0);
}

CUresult cuMemcpyHtoDAsync_v2(uint64_t dst, void *src, uint64_t count, uint64_t stream) {
    GP_TRACE("cuMemcpyHtoDAsync_v2");
    return htod(GP_CALL_cuMemcpyHtoDAsync_v2, dst, src, count, stream);
}

CUresult cuMemcpyDtoH_v2(void *dst, uint64_t src, uint64_t count) {
    GP_TRACE("cuMemcpyDtoH_v2");
    return dtoh(GP_CALL_cuMemcpyDtoH_v2, dst, src, count, 0);
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, uint64_t src, uint64_t count, uint64_t stream) {
    GP_TRACE("cuMemcpyDtoHAsync_v2");
    return dtoh(GP_CALL_cuMemcpyDtoHAsync_v2, dst, src, count, stream);
}

static CUresult generic_copy(uint64_t dst, uint64_t src, uint64_t count, uint64_t stream, int async) {
    int d = is_device(dst), s = is_device(src);
    if (d && s) {
        if (async) return cuMemcpyDtoDAsync_v2(dst, src, count, stream);
        return cuMemcpyDtoD_v2(dst, src, count);
    }
    if (d) return htod(async ? GP_CALL_cuMemcpyHtoDAsync_v2 : GP_CALL_cuMemcpyHtoD_v2, dst, (void *)src, count, stream);
    if (s) return dtoh(async ? GP_CALL_cuMemcpyDtoHAsync_v2 : GP_CALL_cuMemcpyDtoH_v2, (void *)dst, src, count, stream);
    if (count && (!dst || !src)) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = copies_settle((const void *)src, count); /* copies to the host still landing there first */
    if (r == CUDA_SUCCESS) r = copies_settle((const void *)dst, count);
    if (r != CUDA_SUCCESS) return r;
    memmove((void *)dst, (const void *)src, count); /* host to host, as unified addressing allows */
    return CUDA_SUCCESS;
}

CUresult cuMemcpy(uint64_t dst, uint64_t src, uint64_t count) {
    GP_TRACE("cuMemcpy");
    return generic_copy(dst, src, count, 0, 0);
}

CUresult cuMemcpyAsync(uint64_t dst, uint64_t src, uint64_t count, uint64_t stream) {
    GP_TRACE("cuMemcpyAsync");
    return generic_copy(dst, src, count, stream, 1);
}

/* ---- batched copies: each as cuMemcpyAsync sends it, in the batch's order (the driver promises none) -- */

#define MEMCPY_ATTRIBUTES_BYTES 24 /* CUmemcpyAttributes: srcAccessOrder, two CUmemLocation hints, flags */
#define SRC_ACCESS_ORDER_ANY 3     /* STREAM 1, DURING_API_CALL 2, ANY 3; 0 is invalid */

/* Each copy reads its host source before the call returns (as a single copy does), which every source
 * access order allows. */
static CUresult batch_copy(const uint64_t *dsts, const uint64_t *srcs, const uint64_t *sizes, uint64_t count,
                           const void *attrs, const uint64_t *attrs_idxs, uint64_t num_attrs, uint64_t *fail_idx,
                           uint64_t stream) {
    if (fail_idx) *fail_idx = UINT64_MAX; /* SIZE_MAX: the error is of no one copy */
    if (!count || !dsts || !srcs || !sizes || !attrs || !attrs_idxs || !num_attrs || num_attrs > count ||
        attrs_idxs[0] != 0)
        return CUDA_ERROR_INVALID_VALUE;
    for (uint64_t k = 0; k < num_attrs; k++) {
        int32_t order;
        memcpy(&order, (const unsigned char *)attrs + k * MEMCPY_ATTRIBUTES_BYTES, 4);
        if ((k && attrs_idxs[k] <= attrs_idxs[k - 1]) || attrs_idxs[k] >= count || order < 1 ||
            order > SRC_ACCESS_ORDER_ANY)
            return CUDA_ERROR_INVALID_VALUE;
    }
    for (uint64_t i = 0; i < count; i++) {
        CUresult r = generic_copy(dsts[i], srcs[i], sizes[i], stream, 1);
        if (r != CUDA_SUCCESS) {
            if (fail_idx) *fail_idx = i;
            return r;
        }
    }
    return CUDA_SUCCESS;
}

CUresult cuMemcpyBatchAsync(void *dsts, void *srcs, void *sizes, uint64_t count, void *attrs, void *attrs_idxs,
                            uint64_t num_attrs, void *fail_idx, uint64_t stream) {
    GP_TRACE("cuMemcpyBatchAsync");
    return batch_copy(dsts, srcs, sizes, count, attrs, attrs_idxs, num_attrs, fail_idx, stream);
}

CUresult cuMemcpyBatchAsync_v2(void *dsts, void *srcs, void *sizes, uint64_t count, void *attrs, void *attrs_idxs,
                               uint64_t num_attrs, uint64_t stream) {
    GP_TRACE("cuMemcpyBatchAsync_v2");
    return batch_copy(dsts, srcs, sizes, count, attrs, attrs_idxs, num_attrs, NULL, stream);
}

/* CUDA_MEMCPY3D_BATCH_OP (112 bytes): two CUmemcpy3DOperands of 40 (type, then for a pointer: ptr,
 * rowLength, layerHeight, a location hint), the extent (width, height, depth), srcAccessOrder, flags.
 * Between pointers an element is a byte; each run of contiguous rows goes as one copy. CUDA arrays
 * are not forwarded. */
#define BATCH_OP_BYTES 112
#define OPERAND_POINTER 1

static CUresult batch_copy_3d(uint64_t num_ops, const void *ops, uint64_t *fail_idx, uint64_t flags,
                              uint64_t stream) {
    static int said;
    if (fail_idx) *fail_idx = UINT64_MAX;
    if (!num_ops || !ops || flags) return CUDA_ERROR_INVALID_VALUE;
    for (uint64_t i = 0; i < num_ops; i++) {
        const unsigned char *op = (const unsigned char *)ops + i * BATCH_OP_BYTES;
        int32_t src_type, dst_type, order;
        uint64_t src[3], dst[3], extent[3]; /* ptr, rowLength, layerHeight; width, height, depth */
        memcpy(&src_type, op, 4), memcpy(src, op + 8, 24);
        memcpy(&dst_type, op + 40, 4), memcpy(dst, op + 48, 24);
        memcpy(extent, op + 80, 24), memcpy(&order, op + 104, 4);
        CUresult r = CUDA_SUCCESS;
        if (src_type != OPERAND_POINTER || dst_type != OPERAND_POINTER) {
            if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
                gp_say("cuMemcpy3DBatchAsync: copies to or from CUDA arrays are not forwarded to the remote GPU; "
                       "they return CUDA_ERROR_NOT_SUPPORTED");
            r = CUDA_ERROR_NOT_SUPPORTED;
        } else if (!extent[0] || !extent[1] || !extent[2] || order < 1 || order > SRC_ACCESS_ORDER_ANY) {
            r = CUDA_ERROR_INVALID_VALUE;
        }
        uint64_t src_row = src[1] ? src[1] : extent[0], dst_row = dst[1] ? dst[1] : extent[0];
        uint64_t src_layer = src[2] ? src[2] : extent[1], dst_layer = dst[2] ? dst[2] : extent[1];
        if (r == CUDA_SUCCESS && (src_row < extent[0] || dst_row < extent[0] || src_layer < extent[1] ||
                                  dst_layer < extent[1]))
            r = CUDA_ERROR_INVALID_VALUE;
        /* Whole layers, or the whole copy, are contiguous when the rows (and layers) have no gaps. */
        int rows_whole = src_row == extent[0] && dst_row == extent[0];
        int layers_whole = rows_whole && src_layer == extent[1] && dst_layer == extent[1];
        for (uint64_t z = 0; r == CUDA_SUCCESS && z < extent[2]; z++) {
            for (uint64_t y = 0; r == CUDA_SUCCESS && y < extent[1]; y++) {
                uint64_t n = extent[0];
                if (layers_whole) n *= extent[1] * extent[2];
                else if (rows_whole) n *= extent[1];
                r = generic_copy(dst[0] + (z * dst_layer + y) * dst_row, src[0] + (z * src_layer + y) * src_row, n,
                                 stream, 1);
                if (rows_whole) break;
            }
            if (layers_whole) break;
        }
        if (r != CUDA_SUCCESS) {
            if (fail_idx) *fail_idx = i;
            return r;
        }
    }
    return CUDA_SUCCESS;
}

CUresult cuMemcpy3DBatchAsync(uint64_t num_ops, void *ops, void *fail_idx, uint64_t flags, uint64_t stream) {
    GP_TRACE("cuMemcpy3DBatchAsync");
    return batch_copy_3d(num_ops, ops, fail_idx, flags, stream);
}

CUresult cuMemcpy3DBatchAsync_v2(uint64_t num_ops, void *ops, uint64_t flags, uint64_t stream) {
    GP_TRACE("cuMemcpy3DBatchAsync_v2");
    return batch_copy_3d(num_ops, ops, NULL, flags, stream);
}

/* The virtual memory API's queries: the properties a handle was created with, a mapping's access. */
CUresult cuMemGetAllocationPropertiesFromHandle(void *prop, uint64_t handle) {
    GP_TRACE("cuMemGetAllocationPropertiesFromHandle");
    if (!prop) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuMemGetAllocationPropertiesFromHandle in = {.handle = handle};
    return gp_call(GP_CALL_cuMemGetAllocationPropertiesFromHandle, WANT, &in, sizeof in, NULL, 0, NULL, 0, prop,
                   32 /* CUmemAllocationProp */);
}

CUresult cuMemGetAccess(uint64_t *flags, void *location, uint64_t ptr) {
    GP_TRACE("cuMemGetAccess");
    if (!flags || !location) return CUDA_ERROR_INVALID_VALUE;
    int32_t where[2]; /* CUmemLocation: type, id */
    memcpy(where, location, sizeof where);
    struct gp_in_cuMemGetAccess in = {.location_type = where[0], .location_id = where[1], .ptr = ptr};
    struct gp_out_cuMemGetAccess out;
    CUresult r = gp_call(GP_CALL_cuMemGetAccess, WANT, &in, sizeof in, NULL, 0, &out, sizeof out, NULL, 0);
    if (r == CUDA_SUCCESS) *flags = out.flags;
    return r;
}

/* ---- CUDA arrays, 2D and 3D copies, textures and surfaces: objects of the worker's driver ----------- */

#define ARRAY_DESC_BYTES 24    /* CUDA_ARRAY_DESCRIPTOR: width, height, format, channels */
#define ARRAY3D_DESC_BYTES 40  /* CUDA_ARRAY3D_DESCRIPTOR: width, height, depth, format, channels, flags */
#define RESOURCE_DESC_BYTES 144 /* CUDA_RESOURCE_DESC */
#define TEXTURE_DESC_BYTES 104  /* CUDA_TEXTURE_DESC */
#define VIEW_DESC_BYTES 112     /* CUDA_RESOURCE_VIEW_DESC */

static CUresult array_create(uint32_t call, uint64_t *handle, const void *desc, uint64_t bytes) {
    if (!handle || !desc) return CUDA_ERROR_INVALID_VALUE;
    struct gp_out_cuArrayCreate_v2 out;
    CUresult r = gp_call(call, WANT, NULL, 0, desc, bytes, &out, sizeof out, NULL, 0);
    if (r == CUDA_SUCCESS) *handle = out.handle;
    return r;
}

CUresult cuArrayCreate_v2(uint64_t *handle, void *desc) {
    GP_TRACE("cuArrayCreate_v2");
    return array_create(GP_CALL_cuArrayCreate_v2, handle, desc, ARRAY_DESC_BYTES);
}

CUresult cuArray3DCreate_v2(uint64_t *handle, void *desc) {
    GP_TRACE("cuArray3DCreate_v2");
    return array_create(GP_CALL_cuArray3DCreate_v2, handle, desc, ARRAY3D_DESC_BYTES);
}

CUresult cuArrayGetDescriptor_v2(void *desc, uint64_t handle) {
    GP_TRACE("cuArrayGetDescriptor_v2");
    if (!desc) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuArrayGetDescriptor_v2 in = {.handle = handle};
    return gp_call(GP_CALL_cuArrayGetDescriptor_v2, WANT, &in, sizeof in, NULL, 0, NULL, 0, desc, ARRAY_DESC_BYTES);
}

CUresult cuArray3DGetDescriptor_v2(void *desc, uint64_t handle) {
    GP_TRACE("cuArray3DGetDescriptor_v2");
    if (!desc) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuArray3DGetDescriptor_v2 in = {.handle = handle};
    return gp_call(GP_CALL_cuArray3DGetDescriptor_v2, WANT, &in, sizeof in, NULL, 0, NULL, 0, desc,
                   ARRAY3D_DESC_BYTES);
}

CUresult cuMipmappedArrayCreate(uint64_t *handle, void *desc, uint32_t levels) {
    GP_TRACE("cuMipmappedArrayCreate");
    if (!handle || !desc) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuMipmappedArrayCreate in = {.levels = levels};
    struct gp_out_cuMipmappedArrayCreate out;
    CUresult r = gp_call(GP_CALL_cuMipmappedArrayCreate, WANT, &in, sizeof in, desc, ARRAY3D_DESC_BYTES, &out,
                         sizeof out, NULL, 0);
    if (r == CUDA_SUCCESS) *handle = out.handle;
    return r;
}

/* One side of a copy (CUmemorytype: 1 host, 2 device, 3 array, 4 unified); `at` is the host pointer,
 * the device address or the array; x in bytes, y in rows, z in slices of `height` rows of `pitch`. */
struct copy_side { uint32_t kind; uint64_t at, x, y, z, pitch, height; };

static int resolve_side(struct copy_side *side) {
    if (side->kind == 4) side->kind = is_device(side->at) ? 2 : 1; /* unified: whichever memory it is */
    return side->kind >= 1 && side->kind <= 3;
}

static unsigned char *host_row(const struct copy_side *side, uint64_t row, uint64_t slice) {
    return (unsigned char *)side->at + side->x + ((side->z + slice) * side->height + side->y + row) * side->pitch;
}

/* The host side's rows, first byte to last, to settle copies landing there before it is read or written. */
static uint64_t host_span(const struct copy_side *side, uint64_t width, uint64_t height, uint64_t depth) {
    return (depth - 1) * side->height * side->pitch + (height - 1) * side->pitch + width;
}

static CUresult copy_3d(struct copy_side src, struct copy_side dst, uint64_t width, uint64_t height, uint64_t depth,
                        uint64_t stream, int async) {
    if (!resolve_side(&src) || !resolve_side(&dst)) return CUDA_ERROR_INVALID_VALUE;
    if (!width || !height || !depth) return CUDA_SUCCESS;
    for (const struct copy_side *side = &src; side; side = side == &src ? &dst : NULL) {
        if (side->kind == 1 && (!side->at || (height > 1 && side->pitch < width) ||
                                (depth > 1 && (side->pitch < width || side->height < height))))
            return CUDA_ERROR_INVALID_VALUE;
    }
    if (width > (1ull << 40) / height / depth) return CUDA_ERROR_INVALID_VALUE; /* more than any GPU holds */
    uint64_t packed = width * height * depth;
    CUresult r = CUDA_SUCCESS;
    if (src.kind == 1) r = copies_settle((void *)host_row(&src, 0, 0), host_span(&src, width, height, depth));
    if (r == CUDA_SUCCESS && dst.kind == 1)
        r = copies_settle((void *)host_row(&dst, 0, 0), host_span(&dst, width, height, depth));
    if (r != CUDA_SUCCESS) return r;
    if (src.kind == 1 && dst.kind == 1) { /* host to host: here, row by row */
        for (uint64_t k = 0; k < depth; k++)
            for (uint64_t j = 0; j < height; j++) memmove(host_row(&dst, j, k), host_row(&src, j, k), width);
        return CUDA_SUCCESS;
    }
    unsigned char *rows = (src.kind == 1 || dst.kind == 1) ? malloc(packed) : NULL;
    if ((src.kind == 1 || dst.kind == 1) && !rows) return CUDA_ERROR_OUT_OF_MEMORY;
    if (src.kind == 1)
        for (uint64_t k = 0; k < depth; k++)
            for (uint64_t j = 0; j < height; j++) memcpy(rows + (k * height + j) * width, host_row(&src, j, k), width);
    struct gp_in_gpMemcpy3D in = {
        .kinds = src.kind | dst.kind << 8, .width = width, .height = height, .depth = depth, .stream = stream,
        .flags = async ? 1 : 0,
        .src = src.kind == 1 ? 0 : src.at, .src_x = src.kind == 1 ? 0 : src.x, .src_y = src.kind == 1 ? 0 : src.y,
        .src_z = src.kind == 1 ? 0 : src.z, .src_pitch = src.kind == 1 ? width : src.pitch,
        .src_height = src.kind == 1 ? height : src.height,
        .dst = dst.kind == 1 ? 0 : dst.at, .dst_x = dst.kind == 1 ? 0 : dst.x, .dst_y = dst.kind == 1 ? 0 : dst.y,
        .dst_z = dst.kind == 1 ? 0 : dst.z, .dst_pitch = dst.kind == 1 ? width : dst.pitch,
        .dst_height = dst.kind == 1 ? height : dst.height};
    r = gp_call(GP_CALL_gpMemcpy3D, WANT, &in, sizeof in, src.kind == 1 ? rows : NULL, src.kind == 1 ? packed : 0,
                NULL, 0, dst.kind == 1 ? rows : NULL, dst.kind == 1 ? packed : 0);
    if (r == CUDA_SUCCESS && dst.kind == 1)
        for (uint64_t k = 0; k < depth; k++)
            for (uint64_t j = 0; j < height; j++) memcpy(host_row(&dst, j, k), rows + (k * height + j) * width, width);
    free(rows);
    return r;
}

/* CUDA_MEMCPY2D (128 bytes): each side's x, y, memory type, host, device, array, pitch; the source at 0,
 * the destination at 56; the extent at 112. */
static struct copy_side side_2d(const unsigned char *p) {
    struct copy_side side = {0};
    uint64_t host, device, array;
    memcpy(&side.x, p, 8), memcpy(&side.y, p + 8, 8), memcpy(&side.kind, p + 16, 4);
    memcpy(&host, p + 24, 8), memcpy(&device, p + 32, 8), memcpy(&array, p + 40, 8), memcpy(&side.pitch, p + 48, 8);
    side.at = side.kind == 1 ? host : side.kind == 3 ? array : device;
    side.height = 1;
    return side;
}

static CUresult copy_2d(const void *copy, uint64_t stream, int async) {
    if (!copy) return CUDA_ERROR_INVALID_VALUE;
    const unsigned char *p = copy;
    uint64_t width, height;
    memcpy(&width, p + 112, 8), memcpy(&height, p + 120, 8);
    struct copy_side src = side_2d(p), dst = side_2d(p + 56);
    src.height = dst.height = height; /* one slice */
    return copy_3d(src, dst, width, height, 1, stream, async);
}

/* CUDA_MEMCPY3D (200 bytes): each side's x, y, z, LOD, memory type, host, device, array, reserved,
 * pitch, height; the source at 0, the destination at 88; the extent at 176. */
static struct copy_side side_3d(const unsigned char *p) {
    struct copy_side side = {0};
    uint64_t host, device, array;
    memcpy(&side.x, p, 8), memcpy(&side.y, p + 8, 8), memcpy(&side.z, p + 16, 8), memcpy(&side.kind, p + 32, 4);
    memcpy(&host, p + 40, 8), memcpy(&device, p + 48, 8), memcpy(&array, p + 56, 8);
    memcpy(&side.pitch, p + 72, 8), memcpy(&side.height, p + 80, 8);
    side.at = side.kind == 1 ? host : side.kind == 3 ? array : device;
    return side;
}

static CUresult copy_3d_params(const void *copy, uint64_t stream, int async) {
    if (!copy) return CUDA_ERROR_INVALID_VALUE;
    const unsigned char *p = copy;
    uint64_t width, height, depth;
    memcpy(&width, p + 176, 8), memcpy(&height, p + 184, 8), memcpy(&depth, p + 192, 8);
    struct copy_side src = side_3d(p), dst = side_3d(p + 88);
    if (depth <= 1) src.height = src.height ? src.height : height, dst.height = dst.height ? dst.height : height;
    return copy_3d(src, dst, width, height, depth, stream, async);
}

CUresult cuMemcpy2D_v2(void *copy) {
    GP_TRACE("cuMemcpy2D_v2");
    return copy_2d(copy, 0, 0);
}

CUresult cuMemcpy2DUnaligned_v2(void *copy) {
    GP_TRACE("cuMemcpy2DUnaligned_v2");
    return copy_2d(copy, 0, 0);
}

CUresult cuMemcpy2DAsync_v2(void *copy, uint64_t stream) {
    GP_TRACE("cuMemcpy2DAsync_v2");
    return copy_2d(copy, stream, 1);
}

CUresult cuMemcpy3D_v2(void *copy) {
    GP_TRACE("cuMemcpy3D_v2");
    return copy_3d_params(copy, 0, 0);
}

CUresult cuMemcpy3DAsync_v2(void *copy, uint64_t stream) {
    GP_TRACE("cuMemcpy3DAsync_v2");
    return copy_3d_params(copy, stream, 1);
}

/* Copies of `count` bytes to or from a one-dimensional stretch of an array, from byte `offset`. */
static struct copy_side linear(uint32_t kind, uint64_t at, uint64_t offset, uint64_t count) {
    return (struct copy_side){.kind = kind, .at = at, .x = offset, .pitch = count, .height = 1};
}

CUresult cuMemcpyHtoA_v2(uint64_t dst, uint64_t offset, void *src, uint64_t count) {
    GP_TRACE("cuMemcpyHtoA_v2");
    return copy_3d(linear(1, (uint64_t)src, 0, count), linear(3, dst, offset, count), count, 1, 1, 0, 0);
}

CUresult cuMemcpyHtoAAsync_v2(uint64_t dst, uint64_t offset, void *src, uint64_t count, uint64_t stream) {
    GP_TRACE("cuMemcpyHtoAAsync_v2");
    return copy_3d(linear(1, (uint64_t)src, 0, count), linear(3, dst, offset, count), count, 1, 1, stream, 1);
}

CUresult cuMemcpyAtoH_v2(void *dst, uint64_t src, uint64_t offset, uint64_t count) {
    GP_TRACE("cuMemcpyAtoH_v2");
    return copy_3d(linear(3, src, offset, count), linear(1, (uint64_t)dst, 0, count), count, 1, 1, 0, 0);
}

CUresult cuMemcpyAtoHAsync_v2(void *dst, uint64_t src, uint64_t offset, uint64_t count, uint64_t stream) {
    GP_TRACE("cuMemcpyAtoHAsync_v2");
    return copy_3d(linear(3, src, offset, count), linear(1, (uint64_t)dst, 0, count), count, 1, 1, stream, 1);
}

CUresult cuMemcpyDtoA_v2(uint64_t dst, uint64_t offset, uint64_t src, uint64_t count) {
    GP_TRACE("cuMemcpyDtoA_v2");
    return copy_3d(linear(2, src, 0, count), linear(3, dst, offset, count), count, 1, 1, 0, 0);
}

CUresult cuMemcpyAtoD_v2(uint64_t dst, uint64_t src, uint64_t offset, uint64_t count) {
    GP_TRACE("cuMemcpyAtoD_v2");
    return copy_3d(linear(3, src, offset, count), linear(2, dst, 0, count), count, 1, 1, 0, 0);
}

CUresult cuMemcpyAtoA_v2(uint64_t dst, uint64_t dst_offset, uint64_t src, uint64_t src_offset, uint64_t count) {
    GP_TRACE("cuMemcpyAtoA_v2");
    return copy_3d(linear(3, src, src_offset, count), linear(3, dst, dst_offset, count), count, 1, 1, 0, 0);
}

/* Texture and surface objects: the descriptors go as they are (the worker checks what they name). */
CUresult cuTexObjectCreate(uint64_t *tex, void *res, void *tex_desc, void *view) {
    GP_TRACE("cuTexObjectCreate");
    if (!tex || !res || !tex_desc) return CUDA_ERROR_INVALID_VALUE;
    unsigned char descs[RESOURCE_DESC_BYTES + TEXTURE_DESC_BYTES + VIEW_DESC_BYTES];
    memcpy(descs, res, RESOURCE_DESC_BYTES);
    memcpy(descs + RESOURCE_DESC_BYTES, tex_desc, TEXTURE_DESC_BYTES);
    size_t n = RESOURCE_DESC_BYTES + TEXTURE_DESC_BYTES;
    if (view) memcpy(descs + n, view, VIEW_DESC_BYTES), n += VIEW_DESC_BYTES;
    struct gp_out_cuTexObjectCreate out;
    CUresult r = gp_call(GP_CALL_cuTexObjectCreate, WANT, NULL, 0, descs, n, &out, sizeof out, NULL, 0);
    if (r == CUDA_SUCCESS) *tex = out.tex;
    return r;
}

/* A texture's or surface's descriptor read back: the object's handle in, the C struct out. */
static CUresult object_desc(uint32_t call, uint64_t handle, void *desc, uint64_t bytes) {
    if (!desc) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuTexObjectGetResourceDesc in = {.tex = handle};
    return gp_call(call, WANT, &in, sizeof in, NULL, 0, NULL, 0, desc, bytes);
}

CUresult cuTexObjectGetResourceDesc(void *desc, uint64_t tex) {
    GP_TRACE("cuTexObjectGetResourceDesc");
    return object_desc(GP_CALL_cuTexObjectGetResourceDesc, tex, desc, RESOURCE_DESC_BYTES);
}

CUresult cuTexObjectGetTextureDesc(void *desc, uint64_t tex) {
    GP_TRACE("cuTexObjectGetTextureDesc");
    return object_desc(GP_CALL_cuTexObjectGetTextureDesc, tex, desc, TEXTURE_DESC_BYTES);
}

CUresult cuTexObjectGetResourceViewDesc(void *desc, uint64_t tex) {
    GP_TRACE("cuTexObjectGetResourceViewDesc");
    return object_desc(GP_CALL_cuTexObjectGetResourceViewDesc, tex, desc, VIEW_DESC_BYTES);
}

CUresult cuSurfObjectGetResourceDesc(void *desc, uint64_t surf) {
    GP_TRACE("cuSurfObjectGetResourceDesc");
    return object_desc(GP_CALL_cuSurfObjectGetResourceDesc, surf, desc, RESOURCE_DESC_BYTES);
}

CUresult cuSurfObjectCreate(uint64_t *surf, void *res) {
    GP_TRACE("cuSurfObjectCreate");
    if (!surf || !res) return CUDA_ERROR_INVALID_VALUE;
    struct gp_out_cuSurfObjectCreate out;
    CUresult r = gp_call(GP_CALL_cuSurfObjectCreate, WANT, NULL, 0, res, RESOURCE_DESC_BYTES, &out, sizeof out, NULL,
                         0);
    if (r == CUDA_SUCCESS) *surf = out.surf;
    return r;
}

/* ---- 2D memsets: one memset per row, or one for all when the rows touch ---------------------------- */

static CUresult memset_rows(int width_bytes, uint64_t dst, uint64_t pitch, uint32_t value, uint64_t width,
                            uint64_t height, uint64_t stream, int async) {
    if (!width || !height) return CUDA_SUCCESS;
    if (height > 1 && pitch < width * width_bytes) return CUDA_ERROR_INVALID_VALUE;
    uint64_t rows = pitch == width * width_bytes ? 1 : height, count = rows == 1 ? width * height : width;
    CUresult r = CUDA_SUCCESS;
    for (uint64_t row = 0; row < rows && r == CUDA_SUCCESS; row++) {
        uint64_t at = dst + row * pitch;
        if (width_bytes == 1)
            r = async ? cuMemsetD8Async(at, (uint8_t)value, count, stream) : cuMemsetD8_v2(at, (uint8_t)value, count);
        else if (width_bytes == 2)
            r = async ? cuMemsetD16Async(at, (uint16_t)value, count, stream) : cuMemsetD16_v2(at, (uint16_t)value, count);
        else
            r = async ? cuMemsetD32Async(at, value, count, stream) : cuMemsetD32_v2(at, value, count);
    }
    return r;
}

CUresult cuMemsetD2D8_v2(uint64_t dst, uint64_t pitch, uint8_t value, uint64_t width, uint64_t height) {
    GP_TRACE("cuMemsetD2D8_v2");
    return memset_rows(1, dst, pitch, value, width, height, 0, 0);
}

CUresult cuMemsetD2D16_v2(uint64_t dst, uint64_t pitch, uint16_t value, uint64_t width, uint64_t height) {
    GP_TRACE("cuMemsetD2D16_v2");
    return memset_rows(2, dst, pitch, value, width, height, 0, 0);
}

CUresult cuMemsetD2D32_v2(uint64_t dst, uint64_t pitch, uint32_t value, uint64_t width, uint64_t height) {
    GP_TRACE("cuMemsetD2D32_v2");
    return memset_rows(4, dst, pitch, value, width, height, 0, 0);
}

CUresult cuMemsetD2D8Async(uint64_t dst, uint64_t pitch, uint8_t value, uint64_t width, uint64_t height,
                           uint64_t stream) {
    GP_TRACE("cuMemsetD2D8Async");
    return memset_rows(1, dst, pitch, value, width, height, stream, 1);
}

CUresult cuMemsetD2D16Async(uint64_t dst, uint64_t pitch, uint16_t value, uint64_t width, uint64_t height,
                            uint64_t stream) {
    GP_TRACE("cuMemsetD2D16Async");
    return memset_rows(2, dst, pitch, value, width, height, stream, 1);
}

CUresult cuMemsetD2D32Async(uint64_t dst, uint64_t pitch, uint32_t value, uint64_t width, uint64_t height,
                            uint64_t stream) {
    GP_TRACE("cuMemsetD2D32Async");
    return memset_rows(4, dst, pitch, value, width, height, stream, 1);
}

/* ---- pointer attributes ------------------------------------------------------------------------ */

static CUresult host_attribute(void *data, int attr, uint64_t ptr) {
    uint64_t base, size, dev;
    unsigned flags;
    if (!gp_host_lookup(ptr, &base, &size, &flags)) return CUDA_ERROR_INVALID_VALUE;
    int mapped = gp_mirror_device(ptr, &dev);
    switch (attr) {
    case 2: *(unsigned *)data = 1; return CUDA_SUCCESS; /* CU_MEMORYTYPE_HOST */
    case 3: { /* the device pointer: as cuMemHostGetDevicePointer answers (mapping the memory now) */
        CUresult r = mapped ? CUDA_SUCCESS : cuMemHostGetDevicePointer_v2(&dev, (void *)ptr, 0);
        if (r == CUDA_SUCCESS) *(uint64_t *)data = dev;
        return r;
    }
    case 4: *(uint64_t *)data = ptr; return CUDA_SUCCESS;
    case 11: *(uint64_t *)data = base; return CUDA_SUCCESS;
    case 12: *(uint64_t *)data = size; return CUDA_SUCCESS;
    case 8: *(unsigned *)data = 0; return CUDA_SUCCESS; /* not managed */
    case 13: *(unsigned *)data = (unsigned)mapped; return CUDA_SUCCESS;
    case 9: *(int *)data = -1; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
}

CUresult cuPointerGetAttribute(void *data, int32_t attr, uint64_t ptr) {
    GP_TRACE("cuPointerGetAttribute");
    if (!data) return CUDA_ERROR_INVALID_VALUE;
    int mirror = gp_managed_lookup(ptr);
    if (!is_device(ptr) || mirror == GP_MIRROR_MAPPED) return host_attribute(data, attr, ptr);
    if (attr == 8 /* IS_MANAGED */) {
        *(unsigned *)data = mirror == GP_MIRROR_MANAGED;
        return CUDA_SUCCESS;
    }
    unsigned size = attr >= 0 && attr < 32 ? gp_pointer_attribute_size[attr] : 0;
    if (!size) return CUDA_ERROR_NOT_SUPPORTED;
    struct gp_in_cuPointerGetAttribute in = {.attr = attr, .ptr = ptr};
    struct gp_out_cuPointerGetAttribute out;
    CUresult r = CALL(cuPointerGetAttribute, WANT, in, out);
    if (r == CUDA_SUCCESS) {
        if (size == 4) *(uint32_t *)data = (uint32_t)out.value;
        else *(uint64_t *)data = out.value;
    }
    return r;
}

CUresult cuPointerGetAttributes(uint32_t count, void *attrs, void *data, uint64_t ptr) {
    GP_TRACE("cuPointerGetAttributes");
    if (!attrs || !data) return CUDA_ERROR_INVALID_VALUE;
    for (uint32_t i = 0; i < count; i++) {
        int attr = ((int *)attrs)[i];
        void *slot = ((void **)data)[i];
        if (!slot) continue;
        unsigned size = attr >= 0 && attr < 32 ? gp_pointer_attribute_size[attr] : 0;
        if (!size) size = 8;
        CUresult r = cuPointerGetAttribute(slot, attr, ptr);
        /* Like CUDA: an attribute that does not apply to this pointer reads as zero. */
        if (r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_NOT_SUPPORTED) memset(slot, 0, size);
        else if (r != CUDA_SUCCESS) return r;
    }
    return CUDA_SUCCESS;
}

/* ---- modules ----------------------------------------------------------------------------------- */

/* How many bytes a module image spans: ELF (cubin), fatbin, a fatbin wrapper, or NUL-terminated PTX. */
static uint64_t image_size(const void *image, const void **start) {
    const unsigned char *p = image;
    uint32_t magic;
    memcpy(&magic, p, 4);
    *start = image;
    if (magic == 0x466243b1u) { /* __fatBinC_Wrapper_t { int magic; int version; const void *data; ... } */
        const void *data;
        memcpy(&data, p + 8, sizeof data);
        return image_size(data, start);
    }
    if (magic == 0xba55ed50u) { /* fatbin header: magic, u16 version, u16 header size, u64 payload size */
        uint16_t header;
        uint64_t payload;
        memcpy(&header, p + 6, 2);
        memcpy(&payload, p + 8, 8);
        return header + payload;
    }
    if (p[0] == 0x7f && p[1] == 'E' && p[2] == 'L' && p[3] == 'F' && p[4] == 2) { /* 64-bit ELF */
        uint64_t phoff, shoff, end;
        uint16_t phentsize, phnum, shentsize, shnum;
        memcpy(&phoff, p + 0x20, 8);
        memcpy(&shoff, p + 0x28, 8);
        memcpy(&phentsize, p + 0x36, 2);
        memcpy(&phnum, p + 0x38, 2);
        memcpy(&shentsize, p + 0x3a, 2);
        memcpy(&shnum, p + 0x3c, 2);
        end = shoff + (uint64_t)shentsize * shnum;
        if (phoff + (uint64_t)phentsize * phnum > end) end = phoff + (uint64_t)phentsize * phnum;
        for (unsigned i = 0; i < shnum; i++) { /* section contents may follow the headers */
            const unsigned char *sh = p + shoff + (uint64_t)i * shentsize;
            uint32_t type;
            uint64_t off, size;
            memcpy(&type, sh + 4, 4);
            memcpy(&off, sh + 0x18, 8);
            memcpy(&size, sh + 0x20, 8);
            if (type != 8 && off + size > end) end = off + size; /* 8: SHT_NOBITS */
        }
        return end;
    }
    return strlen((const char *)p) + 1;
}

static CUresult load_image(uint32_t call, uint64_t *handle, const void *image) {
    if (!handle || !image) return CUDA_ERROR_INVALID_VALUE;
    const void *start;
    uint64_t size = image_size(image, &start);
    struct { uint64_t handle; } __attribute__((packed)) out;
    CUresult r = gp_call(call, WANT, NULL, 0, start, size, &out, sizeof out, NULL, 0);
    if (r == CUDA_SUCCESS) *handle = out.handle;
    return r;
}

CUresult cuModuleLoadData(uint64_t *module, void *image) {
    GP_TRACE("cuModuleLoadData");
    return load_image(GP_CALL_cuModuleLoadData, module, image);
}

CUresult cuModuleLoadDataEx(uint64_t *module, void *image, uint32_t n, void *options, void *values) {
    GP_TRACE("cuModuleLoadDataEx");
    (void)n, (void)options, (void)values; /* JIT options (log buffers, levels) are not forwarded */
    return load_image(GP_CALL_cuModuleLoadDataEx, module, image);
}

CUresult cuModuleLoadFatBinary(uint64_t *module, void *image) {
    GP_TRACE("cuModuleLoadFatBinary");
    return load_image(GP_CALL_cuModuleLoadFatBinary, module, image);
}

CUresult cuLibraryLoadData(uint64_t *library, void *code, void *jit_opts, void *jit_vals, uint32_t n_jit,
                           void *lib_opts, void *lib_vals, uint32_t n_lib) {
    GP_TRACE("cuLibraryLoadData");
    (void)jit_opts, (void)jit_vals, (void)n_jit, (void)lib_opts, (void)lib_vals, (void)n_lib;
    return load_image(GP_CALL_cuLibraryLoadData, library, code);
}

/* ---- launches ---------------------------------------------------------------------------------- */

struct layout { uint64_t func; uint32_t count, total; uint32_t *offset_size; };
static struct layout *layouts;
static size_t n_layouts, cap_layouts;
static pthread_mutex_t layout_lock = PTHREAD_MUTEX_INITIALIZER;

/* Parameter offsets and sizes of a function (or kernel), asked of the worker once. */
static CUresult layout_of(uint64_t func, struct layout *result) {
    pthread_mutex_lock(&layout_lock);
    for (size_t i = 0; i < n_layouts; i++) {
        if (layouts[i].func == func) {
            *result = layouts[i];
            pthread_mutex_unlock(&layout_lock);
            return CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&layout_lock);
    uint32_t pairs[2 * 1024];
    struct gp_in_gpParamLayout in = {.func = func};
    struct gp_out_gpParamLayout out;
    CUresult r = gp_call(GP_CALL_gpParamLayout, WANT, &in, sizeof in, NULL, 0, &out, sizeof out, pairs, sizeof pairs);
    if (r != CUDA_SUCCESS) return r;
    if (out.count > 1024) return CUDA_ERROR_NOT_SUPPORTED;
    struct layout l = {func, out.count, 0, malloc(sizeof(uint32_t) * 2 * (out.count ? out.count : 1))};
    if (!l.offset_size) return CUDA_ERROR_OUT_OF_MEMORY;
    memcpy(l.offset_size, pairs, sizeof(uint32_t) * 2 * out.count);
    for (uint32_t i = 0; i < out.count; i++) {
        uint32_t end = pairs[2 * i] + pairs[2 * i + 1];
        if (end > l.total) l.total = end;
    }
    pthread_mutex_lock(&layout_lock);
    if (n_layouts == cap_layouts) {
        cap_layouts = cap_layouts ? cap_layouts * 2 : 64;
        layouts = realloc(layouts, cap_layouts * sizeof *layouts);
    }
    layouts[n_layouts++] = l;
    pthread_mutex_unlock(&layout_lock);
    *result = l;
    return CUDA_SUCCESS;
}

/* Unloading code may free function handles the driver hands out again: forget every layout. */
static void forget_layouts(void) {
    pthread_mutex_lock(&layout_lock);
    for (size_t i = 0; i < n_layouts; i++) free(layouts[i].offset_size);
    n_layouts = 0;
    pthread_mutex_unlock(&layout_lock);
}

CUresult cuModuleUnload(uint64_t module) {
    GP_TRACE("cuModuleUnload");
    struct gp_in_cuModuleUnload in = {.module = module};
    gp_memo_forget(GP_MEMO_functions, module, GP_HANDLE_module, -1); /* the kept answers of its functions go */
    CUresult r = gp_call(GP_CALL_cuModuleUnload, WANT, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
    gp_memo_forget(GP_MEMO_functions, module, GP_HANDLE_module, -1);
    forget_layouts();
    return r;
}

CUresult cuLibraryUnload(uint64_t library) {
    GP_TRACE("cuLibraryUnload");
    struct gp_in_cuLibraryUnload in = {.library = library};
    gp_memo_forget(GP_MEMO_functions, library, GP_HANDLE_library, -1); /* the kept answers of its functions go */
    CUresult r = gp_call(GP_CALL_cuLibraryUnload, WANT, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
    gp_memo_forget(GP_MEMO_functions, library, GP_HANDLE_library, -1);
    forget_layouts();
    return r;
}

/* ---- what a module or library holds: its functions or kernels, their names and parameter counts --- */

/* The handles come in the reply's bulk; each is linked to its module or library, whose unload forgets
 * the answers kept about it (shim_memo.c). */
CUresult cuModuleEnumerateFunctions(void *out, uint32_t num, uint64_t mod) {
    GP_TRACE("cuModuleEnumerateFunctions");
    uint64_t *functions = out;
    if (!functions) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuModuleEnumerateFunctions in = {.num = num, .mod = mod};
    CUresult r = gp_call(GP_CALL_cuModuleEnumerateFunctions, WANT, &in, sizeof in, NULL, 0, NULL, 0, functions,
                         (uint64_t)num * 8);
    for (uint32_t i = 0; r == CUDA_SUCCESS && i < num; i++) gp_memo_link(functions[i], mod, GP_HANDLE_module);
    return r;
}

CUresult cuLibraryEnumerateKernels(void *out, uint32_t num, uint64_t lib) {
    GP_TRACE("cuLibraryEnumerateKernels");
    uint64_t *kernels = out;
    if (!kernels) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuLibraryEnumerateKernels in = {.num = num, .lib = lib};
    CUresult r = gp_call(GP_CALL_cuLibraryEnumerateKernels, WANT, &in, sizeof in, NULL, 0, NULL, 0, kernels,
                         (uint64_t)num * 8);
    for (uint32_t i = 0; r == CUDA_SUCCESS && i < num; i++) gp_memo_link(kernels[i], lib, GP_HANDLE_library);
    return r;
}

/* The driver's name of a kernel or function stays valid while its handle does: the shim keeps one copy
 * per handle (names are few; a handle asked again gets the same pointer). */
static struct { uint64_t handle; char *name; } *names;
static size_t n_names, cap_names;
static pthread_mutex_t name_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *kept_name(uint64_t handle, const char *name) {
    const char *kept = NULL;
    pthread_mutex_lock(&name_lock);
    for (size_t i = 0; i < n_names && !kept; i++)
        if (names[i].handle == handle && strcmp(names[i].name, name) == 0) kept = names[i].name;
    if (!kept && n_names == cap_names) {
        size_t cap = cap_names ? cap_names * 2 : 64;
        void *grown = realloc(names, cap * sizeof *names);
        if (grown) names = grown, cap_names = cap;
    }
    if (!kept && n_names < cap_names && (names[n_names].name = strdup(name)) != NULL) {
        names[n_names].handle = handle;
        kept = names[n_names++].name;
    }
    pthread_mutex_unlock(&name_lock);
    return kept;
}

#define NAME_BYTES 4096

/* cuKernelGetName and cuFuncGetName: the same wire layout (the handle, the buffer's length). */
static CUresult name_of(uint32_t call, uint64_t handle, void *out) {
    const char **name = out;
    if (!name) return CUDA_ERROR_INVALID_VALUE;
    char buf[NAME_BYTES];
    struct gp_in_cuKernelGetName in = {.kernel = handle, .length = sizeof buf};
    _Static_assert(sizeof in == sizeof(struct gp_in_cuFuncGetName), "one layout for both names");
    CUresult r = gp_call(call, WANT, &in, sizeof in, NULL, 0, NULL, 0, buf, sizeof buf);
    if (r != CUDA_SUCCESS) return r;
    buf[sizeof buf - 1] = 0;
    return (*name = kept_name(handle, buf)) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuKernelGetName(void *name, uint64_t kernel) {
    GP_TRACE("cuKernelGetName");
    return name_of(GP_CALL_cuKernelGetName, kernel, name);
}

CUresult cuFuncGetName(void *name, uint64_t func) {
    GP_TRACE("cuFuncGetName");
    return name_of(GP_CALL_cuFuncGetName, func, name);
}

static CUresult param_count(uint64_t func, uint64_t *count) {
    struct layout l;
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = layout_of(func, &l);
    if (r == CUDA_SUCCESS) *count = l.count;
    return r;
}

CUresult cuKernelGetParamCount(uint64_t kernel, uint64_t *count) {
    GP_TRACE("cuKernelGetParamCount");
    return param_count(kernel, count);
}

CUresult cuFuncGetParamCount(uint64_t func, uint64_t *count) {
    GP_TRACE("cuFuncGetParamCount");
    return param_count(func, count);
}

#define LAUNCH_ATTRIBUTE_BYTES GP_LAUNCH_ATTRIBUTE_BYTES /* CUlaunchAttribute: id, padding, a 64-byte value union */

/* Packs kernelParams (or the `extra` buffer) into `buf`; returns its length or -1. */
static int64_t pack_params(const struct layout *l, void **params, void **extra, unsigned char *buf, size_t cap) {
    if (params) {
        if (l->total > cap) return -1;
        memset(buf, 0, l->total);
        for (uint32_t i = 0; i < l->count; i++) {
            if (!params[i]) return -1;
            memcpy(buf + l->offset_size[2 * i], params[i], l->offset_size[2 * i + 1]);
        }
        return l->total;
    }
    if (extra) { /* CU_LAUNCH_PARAM_BUFFER_POINTER (1), CU_LAUNCH_PARAM_BUFFER_SIZE (2), END (0) */
        const void *pointer = NULL;
        size_t size = 0;
        for (size_t i = 0; extra[i] != NULL; i += 2) {
            if (extra[i] == (void *)1) pointer = extra[i + 1];
            else if (extra[i] == (void *)2) size = *(size_t *)extra[i + 1];
            else return -1;
        }
        if (!pointer || size > cap) return -1;
        memcpy(buf, pointer, size);
        return (int64_t)size;
    }
    return l->count == 0 ? 0 : -1;
}

/* A launch the driver would refuse on the spot is refused here too, from the call itself, not at a
 * later synchronise: block and grid dimensions against the device's limits, threads against what the
 * function's registers allow, dynamic shared memory against the function's maximum. The limits are
 * kept answers (shim_memo.c), so after a function's first launch this costs no round trip. A limit
 * that cannot be learnt (0, or the query fails) is not checked: the worker's driver still is. */
/* By pointer: the query has run (and written it) before the value is read. */
static int known_limit(CUresult r, const int32_t *value) { return r == CUDA_SUCCESS && *value > 0; }

static CUresult check_launch_config(uint64_t f, const uint32_t dims[7]) {
    for (int i = 0; i < 6; i++)
        if (dims[i] == 0) return CUDA_ERROR_INVALID_VALUE;
    int dev;
    int32_t v;
    uint64_t threads = (uint64_t)dims[3] * dims[4] * dims[5];
    if (gp_ctx_device(gp_ctx_current(), &dev)) {
        /* CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK 1, MAX_BLOCK_DIM_X..Z 2-4, MAX_GRID_DIM_X..Z 5-7 */
        if (known_limit(cuDeviceGetAttribute(&v, 1, dev), &v) && threads > (uint64_t)v) return CUDA_ERROR_INVALID_VALUE;
        for (int i = 0; i < 3; i++) {
            if (known_limit(cuDeviceGetAttribute(&v, 2 + i, dev), &v) && dims[3 + i] > (uint32_t)v)
                return CUDA_ERROR_INVALID_VALUE;
            if (known_limit(cuDeviceGetAttribute(&v, 5 + i, dev), &v) && dims[i] > (uint32_t)v)
                return CUDA_ERROR_INVALID_VALUE;
        }
    }
    /* CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK 0: past it, the driver says "too many resources" when the
     * function's registers (NUM_REGS 4) for that many threads exceed the block's (the device's
     * MAX_REGISTERS_PER_BLOCK 12), and "invalid value" when a launch bound set the limit (measured).
     * CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES 8. */
    if (known_limit(cuFuncGetAttribute(&v, 0, f), &v) && threads > (uint64_t)v) {
        int32_t regs, block_regs;
        int by_registers = known_limit(cuFuncGetAttribute(&regs, 4, f), &regs) &&
                           gp_ctx_device(gp_ctx_current(), &dev) &&
                           known_limit(cuDeviceGetAttribute(&block_regs, 12, dev), &block_regs) &&
                           (uint64_t)regs * threads > (uint64_t)block_regs;
        return by_registers ? CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES : CUDA_ERROR_INVALID_VALUE;
    }
    if (dims[6] && known_limit(cuFuncGetAttribute(&v, 8, f), &v) && dims[6] > (uint32_t)v) return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* Launch attributes the worker passes on are plain data (_calls.FORWARDED_LAUNCH_ATTRIBUTES); any other
 * is refused here, at the call, and said once per kind — never sent half translated. */
static CUresult check_attributes(const void *attrs, uint32_t n_attrs) {
    static uint64_t said;
    for (uint32_t i = 0; i < n_attrs; i++) {
        int32_t id;
        memcpy(&id, (const unsigned char *)attrs + (size_t)i * LAUNCH_ATTRIBUTE_BYTES, 4);
        if (id >= 0 && id < 64 && (GP_FORWARDED_LAUNCH_ATTRIBUTES >> id & 1)) continue;
        uint64_t bit = 1ull << (id >= 0 && id < 64 ? id : 63);
        if (!(__atomic_fetch_or(&said, bit, __ATOMIC_RELAXED) & bit))
            gp_say("launch attribute %d (a CUlaunchAttributeID) is not forwarded to the remote GPU; the launch returns "
                   "CUDA_ERROR_NOT_SUPPORTED (docs/remote.md lists the forwarded ones)",
                   id);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    return CUDA_SUCCESS;
}

/* A cooperative launch (CU_LAUNCH_ATTRIBUTE_COOPERATIVE, 2, with a value other than 0) runs all its blocks
 * at once: the driver refuses, on the spot, a device without cooperative launches (attribute 95) and
 * more blocks than the function's occupancy per multiprocessor times the multiprocessors (attribute 16),
 * the rule cuLaunchCooperativeKernel's documentation gives. Both answers are kept (shim_memo.c). */
static int is_cooperative(const unsigned char *attrs, uint32_t n_attrs) {
    for (uint32_t i = 0; i < n_attrs; i++) {
        uint32_t id;
        int32_t value;
        memcpy(&id, attrs + LAUNCH_ATTRIBUTE_BYTES * i, 4);
        memcpy(&value, attrs + LAUNCH_ATTRIBUTE_BYTES * i + 8, 4);
        if (id == 2 && value) return 1;
    }
    return 0;
}

static CUresult check_cooperative(uint64_t f, const uint32_t dims[7]) {
    int dev;
    int32_t v, per_sm, sms;
    if (!gp_ctx_device(gp_ctx_current(), &dev)) return CUDA_SUCCESS;
    if (cuDeviceGetAttribute(&v, 95, dev) == CUDA_SUCCESS && v == 0) return CUDA_ERROR_NOT_SUPPORTED;
    uint64_t blocks = (uint64_t)dims[0] * dims[1] * dims[2];
    int32_t threads = (int32_t)(dims[3] * dims[4] * dims[5]);
    if (cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, f, threads, dims[6]) == CUDA_SUCCESS &&
        known_limit(cuDeviceGetAttribute(&sms, 16, dev), &sms) && blocks > (uint64_t)per_sm * (uint64_t)sms)
        return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
    return CUDA_SUCCESS;
}

/* Under GPUPOOL_SHIM_TRACE, a launch the shim itself refuses says which check refused it (the worker's
 * refusals are in its log, at DEBUG). */
static CUresult refused_here(uint64_t f, const uint32_t dims[7], CUresult r, const char *check) {
    if (r != CUDA_SUCCESS && gp_trace_enabled)
        gp_say("launch of 0x%llx (grid %u,%u,%u block %u,%u,%u, %u bytes shared) refused here: %d (%s)",
               (unsigned long long)f, dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6], r, check);
    return r;
}

static CUresult launch(uint64_t f, const uint32_t dims[7], uint64_t stream, void **params, void **extra,
                       const void *attrs, uint32_t n_attrs) {
    struct layout l;
    CUresult r = refused_here(f, dims, check_launch_config(f, dims), "the function's and device's limits");
    if (r == CUDA_SUCCESS) r = refused_here(f, dims, check_attributes(attrs, n_attrs), "a launch attribute");
    if (r == CUDA_SUCCESS && is_cooperative(attrs, n_attrs))
        r = refused_here(f, dims, check_cooperative(f, dims), "a cooperative launch's size");
    if (r != CUDA_SUCCESS) return r;
    r = refused_here(f, dims, layout_of(f, &l), "the parameter layout");
    if (r != CUDA_SUCCESS) return r;
    unsigned char small[4096];
    size_t cap = l.total > sizeof small ? l.total : sizeof small;
    if (extra && !params) cap = 1 << 16;
    unsigned char *buf = cap > sizeof small ? malloc(cap) : small;
    if (!buf) return CUDA_ERROR_OUT_OF_MEMORY;
    int64_t len = pack_params(&l, params, extra, buf, cap);
    r = len < 0 ? refused_here(f, dims, CUDA_ERROR_INVALID_VALUE, "packing the parameters")
                : refused_here(f, dims, params_reach(buf, len), "page-locked memory the parameters name");
    if (r != CUDA_SUCCESS) {
        if (buf != small) free(buf);
        return r;
    }
    struct gp_in_cuLaunchKernelEx in = {.f = f, .gx = dims[0], .gy = dims[1], .gz = dims[2], .bx = dims[3],
                                        .by = dims[4], .bz = dims[5], .smem = dims[6], .stream = stream,
                                        .n_attrs = n_attrs};
    r = gp_call2(GP_CALL_cuLaunchKernelEx, 0, &in, sizeof in, buf, (uint64_t)len, attrs,
                 (uint64_t)n_attrs * LAUNCH_ATTRIBUTE_BYTES, NULL,
                 0, NULL, 0);
    if (buf != small) free(buf);
    return r;
}

CUresult cuLaunchKernel(uint64_t f, uint32_t gx, uint32_t gy, uint32_t gz, uint32_t bx, uint32_t by, uint32_t bz,
                        uint32_t smem, uint64_t stream, void *params, void *extra) {
    GP_TRACE("cuLaunchKernel");
    const uint32_t dims[7] = {gx, gy, gz, bx, by, bz, smem};
    return launch(f, dims, stream, params, extra, NULL, 0);
}

CUresult cuLaunchCooperativeKernel(uint64_t f, uint32_t gx, uint32_t gy, uint32_t gz, uint32_t bx, uint32_t by,
                                   uint32_t bz, uint32_t smem, uint64_t stream, void *params) {
    GP_TRACE("cuLaunchCooperativeKernel");
    const uint32_t dims[7] = {gx, gy, gz, bx, by, bz, smem};
    unsigned char cooperative[72] = {2}; /* CU_LAUNCH_ATTRIBUTE_COOPERATIVE; its value (at 8): 1 */
    cooperative[8] = 1;
    return launch(f, dims, stream, params, NULL, cooperative, 1);
}

/* CUlaunchConfig: seven unsigned ints, then CUstream at 32, CUlaunchAttribute* at 40, unsigned at 48;
 * each CUlaunchAttribute is 72 bytes (id, padding, a 64-byte value union). */
CUresult cuLaunchKernelEx(void *config, uint64_t f, void *params, void *extra) {
    GP_TRACE("cuLaunchKernelEx");
    if (!config) return CUDA_ERROR_INVALID_VALUE;
    const unsigned char *c = config;
    uint32_t dims[7];
    uint64_t stream;
    const void *attrs;
    uint32_t n_attrs;
    memcpy(dims, c, sizeof dims);
    memcpy(&stream, c + 32, 8);
    memcpy(&attrs, c + 40, 8);
    memcpy(&n_attrs, c + 48, 4);
    if (n_attrs && !attrs) return CUDA_ERROR_INVALID_VALUE;
    return launch(f, dims, stream, params, extra, attrs, n_attrs);
}

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
    int with_data = call == GP_CALL_cuGraphAddDependencies_v2;
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
    if (r == CUDA_SUCCESS) *node = out.node;
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
    NODE_EVENT_RECORD = 7, NODE_CONDITIONAL = 13
};

static CUresult add_node_of_type(uint64_t *node, uint64_t graph, void *deps, uint64_t num_deps, void *params);

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

static CUresult capture_info(uint64_t stream, int32_t *status, uint64_t *id, uint64_t *graph, const void **deps,
                             const void **edges, size_t *num_deps) {
    struct gp_in_cuStreamGetCaptureInfo_v3 in = {.stream = stream};
    struct gp_out_cuStreamGetCaptureInfo_v3 out;
    CUresult r = gp_call(GP_CALL_cuStreamGetCaptureInfo_v3, WANT, &in, sizeof in, NULL, 0, &out, sizeof out,
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

/* ---- module and link input files: read in the client, sent as an image ---------------------------- */

/* The whole file, NUL-terminated (PTX is text: its size is its length); NULL if it cannot be read. */
static char *read_whole(const char *path, size_t *length) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *data = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 65536 + 1 > cap) {
            cap = (len + 65536 + 1) * 2;
            char *grown = realloc(data, cap);
            if (!grown) break;
            data = grown;
        }
        size_t got = fread(data + len, 1, cap - len - 1, f);
        len += got;
        if (got == 0) break;
    }
    int failed = ferror(f) || !data;
    fclose(f);
    if (failed) {
        free(data);
        return NULL;
    }
    data[len] = 0;
    *length = len;
    return data;
}

CUresult cuModuleLoad(uint64_t *module, const char *fname) {
    GP_TRACE("cuModuleLoad");
    if (!module || !fname) return CUDA_ERROR_INVALID_VALUE;
    size_t len;
    char *image = read_whole(fname, &len);
    if (!image) return CUDA_ERROR_FILE_NOT_FOUND;
    CUresult r = load_image(GP_CALL_cuModuleLoadData, module, image);
    free(image);
    return r;
}

CUresult cuLibraryLoadFromFile(uint64_t *library, const char *fname, void *jit_opts, void *jit_vals, uint32_t n_jit,
                               void *lib_opts, void *lib_vals, uint32_t n_lib) {
    GP_TRACE("cuLibraryLoadFromFile");
    (void)jit_opts, (void)jit_vals, (void)n_jit, (void)lib_opts, (void)lib_vals, (void)n_lib;
    if (!library || !fname) return CUDA_ERROR_INVALID_VALUE;
    size_t len;
    char *image = read_whole(fname, &len);
    if (!image) return CUDA_ERROR_FILE_NOT_FOUND;
    CUresult r = load_image(GP_CALL_cuLibraryLoadData, library, image);
    free(image);
    return r;
}

/* ---- the driver's linker: it runs on the worker; the image it makes is copied here --------------- */

/* Each link state's image, owned here until cuLinkDestroy (as the driver owns it natively). */
struct linked { uint64_t state; void *image; };
static struct linked *linked;
static size_t n_linked;
static pthread_mutex_t linked_lock = PTHREAD_MUTEX_INITIALIZER;

CUresult cuLinkCreate_v2(uint32_t n, void *options, void *values, uint64_t *state) {
    GP_TRACE("cuLinkCreate_v2");
    (void)n, (void)options, (void)values; /* JIT options (log buffers, levels) are not forwarded */
    if (!state) return CUDA_ERROR_INVALID_VALUE;
    struct gp_out_cuLinkCreate_v2 out;
    CUresult r = gp_call(GP_CALL_cuLinkCreate_v2, WANT, NULL, 0, NULL, 0, &out, sizeof out, NULL, 0);
    if (r == CUDA_SUCCESS) *state = out.state;
    return r;
}

CUresult cuLinkAddData_v2(uint64_t state, int32_t type, void *data, uint64_t size, const char *name, uint32_t n,
                          void *options, void *values) {
    GP_TRACE("cuLinkAddData_v2");
    (void)name, (void)n, (void)options, (void)values;
    if (!data || !size) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuLinkAddData_v2 in = {.state = state, .type = type};
    return gp_call(GP_CALL_cuLinkAddData_v2, WANT, &in, sizeof in, data, size, NULL, 0, NULL, 0);
}

CUresult cuLinkAddFile_v2(uint64_t state, int32_t type, const char *path, uint32_t n, void *options, void *values) {
    GP_TRACE("cuLinkAddFile_v2");
    if (!path) return CUDA_ERROR_INVALID_VALUE;
    size_t len;
    char *data = read_whole(path, &len);
    if (!data) return CUDA_ERROR_FILE_NOT_FOUND;
    CUresult r = cuLinkAddData_v2(state, type, data, len + 1, path, n, options, values); /* with its NUL */
    free(data);
    return r;
}

CUresult cuLinkComplete(uint64_t state, void *cubin_out_, void *size_out_) {
    GP_TRACE("cuLinkComplete");
    void **cubin_out = cubin_out_;
    size_t *size_out = size_out_;
    if (!cubin_out || !size_out) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuLinkComplete in = {.state = state};
    struct gp_out_cuLinkComplete out;
    CUresult r = gp_call(GP_CALL_cuLinkComplete, WANT, &in, sizeof in, NULL, 0, &out, sizeof out, NULL, 0);
    if (r != CUDA_SUCCESS) return r;
    void *image = malloc(out.size ? out.size : 1);
    if (!image) return CUDA_ERROR_OUT_OF_MEMORY;
    struct gp_in_gpLinkImage ask = {.state = state, .size = out.size};
    r = gp_call(GP_CALL_gpLinkImage, WANT, &ask, sizeof ask, NULL, 0, NULL, 0, image, out.size);
    pthread_mutex_lock(&linked_lock);
    struct linked *grown = r == CUDA_SUCCESS ? realloc(linked, (n_linked + 1) * sizeof *linked) : NULL;
    if (grown) {
        linked = grown;
        linked[n_linked++] = (struct linked){state, image};
    }
    pthread_mutex_unlock(&linked_lock);
    if (!grown) {
        free(image);
        return r != CUDA_SUCCESS ? r : CUDA_ERROR_OUT_OF_MEMORY;
    }
    *cubin_out = image;
    *size_out = (size_t)out.size;
    return CUDA_SUCCESS;
}

CUresult cuLinkDestroy(uint64_t state) {
    GP_TRACE("cuLinkDestroy");
    struct gp_in_cuLinkDestroy in = {.state = state};
    CUresult r = gp_call(GP_CALL_cuLinkDestroy, WANT, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
    pthread_mutex_lock(&linked_lock);
    for (size_t i = 0; i < n_linked;) {
        if (linked[i].state == state) {
            free(linked[i].image);
            linked[i] = linked[--n_linked];
        } else {
            i++;
        }
    }
    pthread_mutex_unlock(&linked_lock);
    return r;
}

/* ---- driver log callbacks ------------------------------------------------------------------------- */

CUresult cuLogsRegisterCallback(void *callback, void *user_data, uint64_t *handle) {
    GP_TRACE("cuLogsRegisterCallback");
    (void)user_data;
    if (!callback || !handle) return CUDA_ERROR_INVALID_VALUE;
    static uint64_t next_handle = 0x109;
    *handle = __atomic_add_fetch(&next_handle, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

CUresult cuLogsUnregisterCallback(uint64_t handle) {
    GP_TRACE("cuLogsUnregisterCallback");
    return handle ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- cluster occupancy: the launch configuration travels as cuLaunchKernelEx's does --------------- */

static CUresult cluster_occupancy(uint32_t call, int32_t *value, uint64_t f, const void *config) {
    if (!value || !config) return CUDA_ERROR_INVALID_VALUE;
    const unsigned char *c = config;
    struct {
        uint64_t f;
        uint32_t dims[7];
        uint64_t stream;
        uint32_t n_attrs;
    } __attribute__((packed)) in;
    const void *attrs;
    in.f = f;
    memcpy(in.dims, c, sizeof in.dims);
    memcpy(&in.stream, c + 32, 8);
    memcpy(&attrs, c + 40, 8);
    memcpy(&in.n_attrs, c + 48, 4);
    if (in.n_attrs && !attrs) return CUDA_ERROR_INVALID_VALUE;
    int32_t out;
    CUresult r = gp_call(call, WANT, &in, sizeof in, attrs, (uint64_t)in.n_attrs * LAUNCH_ATTRIBUTE_BYTES, &out,
                         sizeof out, NULL, 0);
    if (r == CUDA_SUCCESS) *value = out;
    return r;
}

CUresult cuOccupancyMaxActiveClusters(int32_t *count, uint64_t func, void *config) {
    GP_TRACE("cuOccupancyMaxActiveClusters");
    return cluster_occupancy(GP_CALL_cuOccupancyMaxActiveClusters, count, func, config);
}

CUresult cuOccupancyMaxPotentialClusterSize(int32_t *size, uint64_t func, void *config) {
    GP_TRACE("cuOccupancyMaxPotentialClusterSize");
    return cluster_occupancy(GP_CALL_cuOccupancyMaxPotentialClusterSize, size, func, config);
}
