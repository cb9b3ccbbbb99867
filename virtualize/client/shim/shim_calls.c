/* gpupool's libcuda.so.1, part 2: the exported CUDA calls; here the general ones (cuGetProcAddress,
 * error strings, devices, contexts, pointer attributes, log callbacks) and the generated ones.
 *
 * Plain calls are generated from virtualize/common/_calls.py (calls_gen.h, included here only). The
 * ones written by hand, here and in the files of one concern beside this one (listed in shim_calls.h,
 * which they share), need the client's own state: host memory and the context stack stay local,
 * allocations are reserved in this address space, generic copies are sorted into host/device by
 * address, kernel parameters are packed at the offsets the worker reported once per function, and
 * module images are measured before sending. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim_calls.h"
static CUresult gp_unforwarded(const char *name); /* refuses a driver function not forwarded */
#include "calls_gen.h"

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
static const struct gp_proc *lookup_abi(const char *name, int version);

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
    const struct gp_proc *newest = lookup_abi(base, 1 << 30);
    if (newest) {
        /* an old ABI that means something else (32-bit device pointers, a 3.1-API context): say what to call */
        static __thread char why_buf[512];
        Dl_info info;
        if (!strcmp(name, base) && newest->fn && dladdr(newest->fn, &info) && info.dli_sname &&
            strcmp(info.dli_sname, name) != 0) { /* the plain name: the oldest ABI */
            snprintf(why_buf, sizeof why_buf, "an old ABI of %s that means something else; call %s, which cuda.h's "
                     "%s means", base, info.dli_sname, base);
            return why_buf;
        }
        return "an ABI version of a forwarded call that is not forwarded";
    }
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

/* Whether the worker's driver lacks the ABI (GP_ENV_LACKS: `name@since` of each ABI of the call table the
 * worker found its own driver without, commas; lease 0's under --spread, asked before a rank's lease is
 * picked). */
static int driver_lacks(const struct gp_proc *abi) {
    const char *lacks = getenv(GP_ENV_LACKS);
    char entry[160];
    int n = snprintf(entry, sizeof entry, "%s@%d", abi->name, abi->since);
    if (n <= 0 || (size_t)n >= sizeof entry) return 0;
    for (const char *p = lacks; p && *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == (size_t)n && strncmp(p, entry, len) == 0) return 1;
        p = end ? end + 1 : NULL;
    }
    return 0;
}

/* Whether the worker's driver has no ABI of the table's name at all (then no version finds it). */
static int driver_lacks_name(const char *name) {
    const struct gp_proc *abi = lookup_abi(name, 1 << 30);
    for (; abi && strcmp(abi->name, name) == 0; abi = abi > gp_procs ? abi - 1 : NULL) {
        if (!driver_lacks(abi)) return 0;
    }
    return 1;
}

/* A name the driver does not hand out at that version: with a status to fill the driver answers success and
 * says why there (as the 580 driver does; measured against it by tests/gpu/remote/prog_proc_addresses.py). */
static CUresult not_found(void **pfn, int *status, int why) {
    *pfn = NULL;
    if (!status) return CUDA_ERROR_NOT_FOUND;
    *status = why;
    return CUDA_SUCCESS;
}

/* The worker's driver version (the lease's cuDriverGetVersion, kept after the first answer); 0 when it cannot
 * be asked, and then no version is too new. */
static int worker_driver_version(void) {
    static _Atomic int known;
    int32_t version = atomic_load(&known);
    if (!version && cuDriverGetVersion(&version) == CUDA_SUCCESS && version > 0) atomic_store(&known, version);
    return version > 0 ? version : 0;
}

/* As the GPU server's driver answers (name, version): a version newer than that driver is CUDA_ERROR_INVALID_
 * VALUE, nothing filled in; for a name of the call table, the newest of its ABIs up to `version` that the
 * worker's driver has (one it lacks falls back to the one before, as a driver without a newer ABI hands out
 * its older one); a name the driver has no ABI of is CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND at any version,
 * else none up to `version` is CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT. Every other name is found, and refuses when called (its census
 * reason). */
GP_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, uint64_t flags, int *status) {
    (void)flags; /* per-thread default stream variants: the worker runs one thread per connection */
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    int driver = worker_driver_version();
    if (driver && version > driver) return CUDA_ERROR_INVALID_VALUE;
    if (strcmp(symbol, "cuGetProcAddress") != 0 && lookup_abi(symbol, 1 << 30)) { /* a name of the table */
        if (driver_lacks_name(symbol)) return not_found(pfn, status, 1); /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
        const struct gp_proc *abi = lookup_abi(symbol, version);
        while (abi && driver_lacks(abi)) abi = abi > gp_procs && strcmp(abi[-1].name, symbol) == 0 ? abi - 1 : NULL;
        if (!abi) return not_found(pfn, status, 2); /* CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT */
        /* an ABI that is not forwarded refuses as its versioned symbol, never runs as another one */
        *pfn = abi->fn ? abi->fn : stub_for(abi->refused);
        if (status) *status = 0; /* CU_GET_PROC_ADDRESS_SUCCESS */
        return CUDA_SUCCESS;
    }
    void *fn = lookup_proc(symbol, version);
    *pfn = fn ? fn : stub_for(symbol);
    if (status) *status = 0; /* CU_GET_PROC_ADDRESS_SUCCESS */
    return CUDA_SUCCESS;
}

GP_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, uint64_t flags) {
    return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}

static const struct gp_proc *lookup_abi(const char *name, int version) {
    const struct gp_proc *best = NULL;
    size_t n = sizeof gp_procs / sizeof gp_procs[0];
    for (size_t i = 0; i < n; i++) { /* sorted by name then version: the last fitting one wins */
        if (strcmp(gp_procs[i].name, name) == 0 && gp_procs[i].since <= version) best = &gp_procs[i];
    }
    return best;
}

static void *lookup_proc(const char *name, int version) {
    if (strcmp(name, "cuGetProcAddress") == 0) return version >= 12000 ? (void *)cuGetProcAddress_v2 : (void *)cuGetProcAddress;
    const struct gp_proc *abi = lookup_abi(name, version);
    return abi ? abi->fn : NULL;
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

/* CUcliqueInfo (type, id): up to the count the program's array holds, and how many came back. */
#define MAX_CLIQUES 64

CUresult cuDeviceGetCliqueInfo(void *info, void *count, int32_t dev) {
    GP_TRACE("cuDeviceGetCliqueInfo");
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    uint64_t capacity;
    memcpy(&capacity, count, 8);
    if (capacity && !info) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuDeviceGetCliqueInfo in = {.dev = dev, .capacity = capacity < MAX_CLIQUES ? capacity : MAX_CLIQUES};
    struct gp_out_cuDeviceGetCliqueInfo out;
    CUresult r = gp_call(GP_CALL_cuDeviceGetCliqueInfo, WANT, &in, sizeof in, NULL, 0, &out, sizeof out, info,
                         8 * in.capacity);
    if (r == CUDA_SUCCESS) memcpy(count, &out.count, 8);
    return r;
}

/* Atomics between a device and the program's host: none is native, as HOST_NATIVE_ATOMIC_SUPPORTED
 * (0 remotely) says; the host memory kernels see is the worker's mirror of the program's. */
#define ATOMIC_OPERATION_KINDS 13 /* CU_ATOMIC_OPERATION_MAX */

CUresult cuDeviceGetHostAtomicCapabilities(void *capabilities, void *operations, uint32_t count, int32_t dev) {
    GP_TRACE("cuDeviceGetHostAtomicCapabilities");
    int32_t devices;
    if (!capabilities || !operations || !count) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cuDeviceGetCount(&devices);
    if (r != CUDA_SUCCESS) return r;
    if (dev < 0 || dev >= devices) return CUDA_ERROR_INVALID_DEVICE;
    for (uint32_t i = 0; i < count; i++) {
        int32_t op = ((const int32_t *)operations)[i];
        if (op < 0 || op >= ATOMIC_OPERATION_KINDS) return CUDA_ERROR_INVALID_VALUE;
    }
    memset(capabilities, 0, 4ull * count);
    return CUDA_SUCCESS;
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

/* The pre-4.0 ABI, called by name (LEGACY_OWN_ANSWERS): as _v2, except that the context already current to
 * the calling thread is not pushed again (driver 580 answers CUDA_ERROR_INVALID_CONTEXT). */
CUresult cuCtxPushCurrent(uint64_t ctx) {
    GP_TRACE("cuCtxPushCurrent");
    if (ctx && ctx == gp_ctx_current()) return CUDA_ERROR_INVALID_CONTEXT;
    return cuCtxPushCurrent_v2(ctx);
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

/* SYNC_MEMOPS (a bool) is the one attribute a program may set; the worker checks the pointer. */
#define POINTER_SYNC_MEMOPS 6

CUresult cuPointerSetAttribute(void *value, int32_t attr, uint64_t ptr) {
    GP_TRACE("cuPointerSetAttribute");
    if (!value || attr != POINTER_SYNC_MEMOPS) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuPointerSetAttribute in = {.attr = attr, .ptr = ptr, .value = *(const uint32_t *)value};
    return gp_call(GP_CALL_cuPointerSetAttribute, WANT, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
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

/* Asynchronous notifications (over budget) concern the worker's process: a registration for a device
 * of the lease is kept, never called. */
CUresult cuDeviceRegisterAsyncNotification(int32_t dev, void *callback, void *user_data, uint64_t *handle) {
    GP_TRACE("cuDeviceRegisterAsyncNotification");
    (void)user_data;
    int32_t count;
    if (!callback || !handle) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cuDeviceGetCount(&count);
    if (r != CUDA_SUCCESS) return r;
    if (dev < 0 || dev >= count) return CUDA_ERROR_INVALID_DEVICE;
    static uint64_t next_handle = 0xa51c;
    *handle = __atomic_add_fetch(&next_handle, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

CUresult cuDeviceUnregisterAsyncNotification(int32_t dev, uint64_t handle) {
    GP_TRACE("cuDeviceUnregisterAsyncNotification");
    int32_t count;
    CUresult r = cuDeviceGetCount(&count);
    if (r != CUDA_SUCCESS) return r;
    if (dev < 0 || dev >= count) return CUDA_ERROR_INVALID_DEVICE;
    return handle ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* The worker's driver log: its bytes come back without the NUL, which the client adds. The driver keeps
 * at most this much (older messages are overwritten): no dump is larger. */
#define LOG_BYTES_MAX 25600

CUresult cuLogsDumpToMemory(void *iterator_, void *buffer_, void *size_, uint32_t flags) {
    GP_TRACE("cuLogsDumpToMemory");
    uint32_t *iterator = iterator_; /* CUlogIterator: an unsigned int */
    char *buffer = buffer_;
    uint64_t *size = size_;
    if (!buffer || !size) return CUDA_ERROR_INVALID_VALUE;
    uint64_t room = *size < LOG_BYTES_MAX + 1 ? *size : LOG_BYTES_MAX + 1;
    struct gp_in_cuLogsDumpToMemory in = {
        .from_start = !iterator, .iterator = iterator ? *iterator : 0, .size = room, .flags = flags};
    struct gp_out_cuLogsDumpToMemory out = {0};
    CUresult r = gp_call(GP_CALL_cuLogsDumpToMemory, WANT, &in, sizeof in, NULL, 0, &out, sizeof out, buffer,
                         room ? room - 1 : 0);
    if (r != CUDA_SUCCESS) {
        if (r == CUDA_ERROR_INVALID_VALUE) *size = 0;
        return r;
    }
    if (out.written >= room) out.written = room ? room - 1 : 0; /* the worker never sends more */
    if (room) buffer[out.written] = 0;
    *size = out.written;
    if (iterator) *iterator = out.next;
    return CUDA_SUCCESS;
}

CUresult cuLogsDumpToFile(void *iterator, const char *path, uint32_t flags) {
    GP_TRACE("cuLogsDumpToFile");
    if (!path) return CUDA_ERROR_INVALID_VALUE;
    char *text = malloc(LOG_BYTES_MAX + 1);
    if (!text) return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t size = LOG_BYTES_MAX + 1;
    CUresult r = cuLogsDumpToMemory(iterator, text, &size, flags);
    FILE *file = r == CUDA_SUCCESS ? fopen(path, "w") : NULL;
    if (r == CUDA_SUCCESS && (!file || fwrite(text, 1, size, file) != size)) r = CUDA_ERROR_INVALID_VALUE;
    if (file && fclose(file) != 0) r = CUDA_ERROR_INVALID_VALUE;
    free(text);
    return r;
}
