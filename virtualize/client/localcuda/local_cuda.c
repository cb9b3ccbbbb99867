/* gpupool's libcuda.so.1 for --local runs: the real driver, with the lease's memory size.
 *
 * `gpuattach run --local` puts this library first on the command's library path. It loads the GPU
 * host's real libcuda.so.1 by the absolute path in GPUPOOL_REAL_LIBCUDA (never by its bare name, which
 * would find this library again) and exports every name the driver exports (forward_gen.h, generated
 * from shim/driver_symbols.txt): each is a jump to the real function, arguments and result untouched.
 * It answers only the memory-size queries, so that cuMemGetInfo, cuDeviceTotalMem, the runtime's
 * cudaMemGetInfo / cudaGetDeviceProperties().totalGlobalMem and NVML (gpupool's libnvidia-ml.so.1) all
 * say the partition's size:
 *   cuDeviceTotalMem(_v2)  total = min(real total, partition)
 *   cuMemGetInfo(_v2)      total = partition, free = min(real free, partition - (real total - real free))
 *                          clamped at 0: everything in use on the GPU counts against the partition, so
 *                          "allocate all free memory" never asks for more than the partition holds
 *                          (conservative where other leases share the GPU).
 *   cuGetProcAddress(_v2)  the real answer, except that it hands out the two queries above — the CUDA
 *                          runtime reaches the driver this way, not through dlsym.
 * cuDeviceGetAttribute reports no global-memory size (CUdevice_attribute has none), and cuGetExportTable
 * is forwarded untouched. GPUPOOL_PARTITION_BYTES gives each device's partition in bytes, comma-separated
 * in device-ordinal order (CUDA_VISIBLE_DEVICES numbers the lease's GPUs 0..n-1); a device it does not
 * name keeps the real numbers. Plain C, no CUDA headers. Built by setup.py; virtualize/client/remote.py links it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long cuuint64_t;
#define CUDA_SUCCESS 0
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_NOT_SUPPORTED 801
#define MAX_DEVICES 64

/* The marker gpuattach and this library use to tell it apart from the driver's libcuda.so.1. */
__attribute__((visibility("default"))) const char gpupoolLocalCuda[] = "gpupool --local libcuda interposer";

static void *real_lib;
static size_t partition[MAX_DEVICES]; /* 0: not limited */
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void say(const char *fmt, const char *arg) {
    fprintf(stderr, "gpupool libcuda (--local): ");
    fprintf(stderr, fmt, arg);
    fputc('\n', stderr);
}

/* A driver entry point the real library lacks (an older driver): the error a driver without the
   feature returns, said once per name. */
static CUresult missing(const char *name) {
    if (real_lib) say("%s is not in this host's driver: CUDA_ERROR_NOT_SUPPORTED", name);
    return real_lib ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_NOT_INITIALIZED;
}

#if defined(__x86_64__)
#define JUMP_TO_REAL(name)                                                                        \
    __asm__(".text\n.globl " #name "\n.type " #name ", @function\n" #name ":\n"                   \
            "\tmovq real_" #name "(%rip), %rax\n\ttestq %rax, %rax\n\tjz missing_" #name "\n"     \
            "\tjmp *%rax\n.size " #name ", .-" #name "\n");
#elif defined(__aarch64__)
#define JUMP_TO_REAL(name)                                                                          \
    __asm__(".text\n.globl " #name "\n.type " #name ", %function\n" #name ":\n"                     \
            "\tadrp x16, real_" #name "\n\tldr x16, [x16, :lo12:real_" #name "]\n"                   \
            "\tcbz x16, missing_" #name "\n\tbr x16\n.size " #name ", .-" #name "\n");
#else
#error "the --local interposer forwards with a jump written for x86_64 and aarch64 only"
#endif

/* One slot per forwarded name, filled when the library loads; the jump reads it. */
#define FORWARD(name)                                                                  \
    __attribute__((used, visibility("hidden"))) void *real_##name;                   \
    __attribute__((used, visibility("hidden"))) CUresult missing_##name(void) {      \
        static int said;                                                             \
        if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED)) return missing(#name); \
        return real_lib ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_NOT_INITIALIZED;     \
    }                                                                                \
    JUMP_TO_REAL(name)
#include "forward_gen.h"
#undef FORWARD

/* The real functions behind the names answered here. */
static CUresult (*real_total_v1)(unsigned int *, CUdevice);
static CUresult (*real_total_v2)(size_t *, CUdevice);
static CUresult (*real_info_v1)(unsigned int *, unsigned int *);
static CUresult (*real_info_v2)(size_t *, size_t *);
static CUresult (*real_ctx_device)(CUdevice *);
static CUresult (*real_proc_v1)(const char *, void **, int, cuuint64_t);
static CUresult (*real_proc_v2)(const char *, void **, int, cuuint64_t, void *);

static void read_partitions(void) {
    const char *spec = getenv("GPUPOOL_PARTITION_BYTES");
    for (int dev = 0; spec && *spec && dev < MAX_DEVICES; dev++) {
        char *end;
        unsigned long long bytes = strtoull(spec, &end, 10);
        partition[dev] = end == spec ? 0 : (size_t)bytes;
        spec = strchr(spec, ',');
        if (spec) spec++;
    }
}

static void open_real(void) {
    read_partitions();
    const char *path = getenv("GPUPOOL_REAL_LIBCUDA");
    if (!path || path[0] != '/') {
        say("GPUPOOL_REAL_LIBCUDA is not an absolute path (%s): no driver; run the command under "
            "gpuattach run --local", path ? path : "unset");
        return;
    }
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        say("cannot load the real driver: %s", dlerror());
        return;
    }
    if (dlsym(lib, "gpupoolLocalCuda")) { /* ourselves again: every call would jump to itself */
        say("GPUPOOL_REAL_LIBCUDA names gpupool's interposer, not the driver (%s)", path);
        return;
    }
    real_lib = lib;
#define FORWARD(name) real_##name = dlsym(lib, #name);
#include "forward_gen.h"
#undef FORWARD
    real_total_v1 = (CUresult(*)(unsigned int *, CUdevice))dlsym(lib, "cuDeviceTotalMem");
    real_total_v2 = (CUresult(*)(size_t *, CUdevice))dlsym(lib, "cuDeviceTotalMem_v2");
    real_info_v1 = (CUresult(*)(unsigned int *, unsigned int *))dlsym(lib, "cuMemGetInfo");
    real_info_v2 = (CUresult(*)(size_t *, size_t *))dlsym(lib, "cuMemGetInfo_v2");
    real_ctx_device = (CUresult(*)(CUdevice *))dlsym(lib, "cuCtxGetDevice");
    real_proc_v1 = (CUresult(*)(const char *, void **, int, cuuint64_t))dlsym(lib, "cuGetProcAddress");
    real_proc_v2 = (CUresult(*)(const char *, void **, int, cuuint64_t, void *))dlsym(lib, "cuGetProcAddress_v2");
}

/* Loaded before any caller can reach an entry point (constructors of a library run before those of
   the libraries that link it, and before dlopen returns it). */
__attribute__((constructor)) static void load(void) { pthread_once(&once, open_real); }

static size_t limit_of(CUdevice dev) { return dev >= 0 && dev < MAX_DEVICES ? partition[dev] : 0; }

#define GP_ANSWER(ret, name, args) __attribute__((visibility("default"))) ret name args

GP_ANSWER(CUresult, cuDeviceTotalMem_v2, (size_t *bytes, CUdevice dev)) {
    if (!real_total_v2) return missing("cuDeviceTotalMem_v2");
    CUresult r = real_total_v2(bytes, dev);
    size_t limit = limit_of(dev);
    if (r == CUDA_SUCCESS && bytes && limit && limit < *bytes) *bytes = limit;
    return r;
}

GP_ANSWER(CUresult, cuDeviceTotalMem, (unsigned int *bytes, CUdevice dev)) {
    size_t total;
    CUresult r = cuDeviceTotalMem_v2(&total, dev);
    if (r == CUDA_SUCCESS && bytes) *bytes = total > UINT_MAX ? UINT_MAX : (unsigned int)total;
    return r;
}

GP_ANSWER(CUresult, cuMemGetInfo_v2, (size_t *free_bytes, size_t *total_bytes)) {
    if (!real_info_v2) return missing("cuMemGetInfo_v2");
    size_t free_real = 0, total_real = 0;
    CUresult r = real_info_v2(&free_real, &total_real);
    if (r != CUDA_SUCCESS) return r;
    CUdevice dev = -1;
    size_t limit = real_ctx_device && real_ctx_device(&dev) == CUDA_SUCCESS ? limit_of(dev) : 0;
    if (limit && limit < total_real) {
        size_t used = total_real - free_real;
        size_t left = limit > used ? limit - used : 0;
        free_real = free_real < left ? free_real : left;
        total_real = limit;
    }
    if (free_bytes) *free_bytes = free_real;
    if (total_bytes) *total_bytes = total_real;
    return r;
}

GP_ANSWER(CUresult, cuMemGetInfo, (unsigned int *free_bytes, unsigned int *total_bytes)) {
    size_t f, t;
    CUresult r = cuMemGetInfo_v2(&f, &t);
    if (r != CUDA_SUCCESS) return r;
    if (free_bytes) *free_bytes = f > UINT_MAX ? UINT_MAX : (unsigned int)f;
    if (total_bytes) *total_bytes = t > UINT_MAX ? UINT_MAX : (unsigned int)t;
    return r;
}

GP_ANSWER(CUresult, cuGetProcAddress_v2, (const char *, void **, int, cuuint64_t, void *));
GP_ANSWER(CUresult, cuGetProcAddress, (const char *, void **, int, cuuint64_t));

/* The driver's answer, with the memory-size queries swapped for ours: matched by the function the
   driver returned (the ABI version it chose for cudaVersion), else by name (an internal alias). */
static void swap_answered(const char *symbol, void **pfn) {
    if (!pfn || !*pfn) return;
    void *got = *pfn;
    if (got == (void *)real_info_v2) *pfn = (void *)cuMemGetInfo_v2;
    else if (got == (void *)real_info_v1) *pfn = (void *)cuMemGetInfo;
    else if (got == (void *)real_total_v2) *pfn = (void *)cuDeviceTotalMem_v2;
    else if (got == (void *)real_total_v1) *pfn = (void *)cuDeviceTotalMem;
    else if (symbol && strcmp(symbol, "cuMemGetInfo") == 0) *pfn = (void *)cuMemGetInfo_v2;
    else if (symbol && strcmp(symbol, "cuDeviceTotalMem") == 0) *pfn = (void *)cuDeviceTotalMem_v2;
    /* cuGetProcAddress itself: hand out ours, so a runtime that re-resolves it stays here */
    else if (got == (void *)real_proc_v2) *pfn = (void *)cuGetProcAddress_v2;
    else if (got == (void *)real_proc_v1) *pfn = (void *)cuGetProcAddress;
}

GP_ANSWER(CUresult, cuGetProcAddress_v2,
          (const char *symbol, void **pfn, int version, cuuint64_t flags, void *status)) {
    if (!real_proc_v2) return missing("cuGetProcAddress_v2");
    CUresult r = real_proc_v2(symbol, pfn, version, flags, status);
    if (r == CUDA_SUCCESS) swap_answered(symbol, pfn);
    return r;
}

GP_ANSWER(CUresult, cuGetProcAddress, (const char *symbol, void **pfn, int version, cuuint64_t flags)) {
    if (!real_proc_v1) return missing("cuGetProcAddress");
    CUresult r = real_proc_v1(symbol, pfn, version, flags);
    if (r == CUDA_SUCCESS) swap_answered(symbol, pfn);
    return r;
}
