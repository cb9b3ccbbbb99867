/* gpupool's libcuda.so.1, hand-written calls: modules and libraries (images read here and sent),
 * launches (kernel parameters packed at the offsets the worker reported once per function), the
 * driver's linker, cluster occupancy. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim_calls.h"

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

static struct layout *layouts;
static size_t n_layouts, cap_layouts;
static pthread_mutex_t layout_lock = PTHREAD_MUTEX_INITIALIZER;

/* Parameter offsets and sizes of a function (or kernel), asked of the worker once. */
CUresult layout_of(uint64_t func, struct layout *result) {
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
    legacy_forget();
    return r;
}

CUresult cuLibraryUnload(uint64_t library) {
    GP_TRACE("cuLibraryUnload");
    struct gp_in_cuLibraryUnload in = {.library = library};
    gp_memo_forget(GP_MEMO_functions, library, GP_HANDLE_library, -1); /* the kept answers of its functions go */
    CUresult r = gp_call(GP_CALL_cuLibraryUnload, WANT, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
    gp_memo_forget(GP_MEMO_functions, library, GP_HANDLE_library, -1);
    forget_layouts();
    legacy_forget();
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
int64_t pack_params(const struct layout *l, void **params, void **extra, unsigned char *buf, size_t cap) {
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

/* cuLaunchCooperativeKernelMultiDevice (deprecated): CUDA_LAUNCH_PARAMS are the function, grid and block
 * dimensions, shared memory (at 32), the stream (at 40) and the kernel's parameters (at 48), 56 bytes each.
 * Each launch is checked and packed as cuLaunchCooperativeKernel's, then all go as one call (its kernels
 * may synchronise across devices): per launch a head (function, seven dimensions, the parameters' length,
 * stream), then the parameters. */
#define LAUNCH_PARAMS_BYTES 56
#define MULTI_LAUNCH_HEAD 48
#define MAX_MULTI_LAUNCHES 64

CUresult cuLaunchCooperativeKernelMultiDevice(void *list, uint32_t count, uint32_t flags) {
    GP_TRACE("cuLaunchCooperativeKernelMultiDevice");
    if (!list || !count || count > MAX_MULTI_LAUNCHES) return CUDA_ERROR_INVALID_VALUE;
    size_t cap = 0, used = 0;
    unsigned char *bulk = NULL;
    CUresult r = CUDA_SUCCESS;
    for (uint32_t i = 0; i < count && r == CUDA_SUCCESS; i++) {
        const unsigned char *p = (const unsigned char *)list + (size_t)i * LAUNCH_PARAMS_BYTES;
        uint64_t f, stream;
        uint32_t dims[7];
        void **params;
        memcpy(&f, p, 8), memcpy(dims, p + 8, sizeof dims), memcpy(&stream, p + 40, 8), memcpy(&params, p + 48, 8);
        struct layout l;
        r = refused_here(f, dims, check_launch_config(f, dims), "the function's and device's limits");
        if (r == CUDA_SUCCESS) r = refused_here(f, dims, check_cooperative(f, dims), "a cooperative launch's size");
        if (r == CUDA_SUCCESS) r = refused_here(f, dims, layout_of(f, &l), "the parameter layout");
        if (r != CUDA_SUCCESS) break;
        size_t need = used + MULTI_LAUNCH_HEAD + (l.total > 4096 ? l.total : 4096);
        if (need > cap) {
            unsigned char *grown = realloc(bulk, need);
            if (!grown) {
                r = CUDA_ERROR_OUT_OF_MEMORY;
                break;
            }
            bulk = grown, cap = need;
        }
        int64_t len = pack_params(&l, params, NULL, bulk + used + MULTI_LAUNCH_HEAD, cap - used - MULTI_LAUNCH_HEAD);
        r = len < 0 ? refused_here(f, dims, CUDA_ERROR_INVALID_VALUE, "packing the parameters")
                    : refused_here(f, dims, params_reach(bulk + used + MULTI_LAUNCH_HEAD, len),
                                   "page-locked memory the parameters name");
        if (r != CUDA_SUCCESS) break;
        uint32_t length = (uint32_t)len;
        memcpy(bulk + used, &f, 8), memcpy(bulk + used + 8, dims, sizeof dims);
        memcpy(bulk + used + 36, &length, 4), memcpy(bulk + used + 40, &stream, 8);
        used += MULTI_LAUNCH_HEAD + (size_t)len;
    }
    if (r == CUDA_SUCCESS) {
        struct gp_in_cuLaunchCooperativeKernelMultiDevice in = {.count = count, .flags = flags};
        r = gp_call(GP_CALL_cuLaunchCooperativeKernelMultiDevice, WANT, &in, sizeof in, bulk, used, NULL, 0, NULL,
                    0);
    }
    free(bulk);
    return r;
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
