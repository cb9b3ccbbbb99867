/* gpupool's libcuda.so.1, hand-written calls: the legacy launch API (deprecated since CUDA 4.0) and legacy
 * context attach, served in the client. A function's block shape, dynamic shared size and parameter
 * bytes are kept here per function, as the driver keeps them, and cuLaunch / cuLaunchGrid(Async) launch
 * through cuLaunchKernel with those bytes as its `extra` buffer (CU_LAUNCH_PARAM_BUFFER_POINTER/SIZE):
 * the grid from the call, everything else from the setters, the parameters at the offsets set. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim_calls.h"

/* The legacy API's parameter space: the kernel parameter limit since CUDA 12.1 (the 580 driver takes a
 * cuParamSetSize of 5000, past the 4 KiB of the toolkits that used this API). */
#define LEGACY_PARAM_BYTES 32764

struct legacy {
    uint64_t func;
    uint32_t block[3]; /* 0 until cuFuncSetBlockShape: a launch without one runs nothing, as on the driver */
    uint32_t shared;
    uint32_t size; /* cuParamSetSize: the bytes a launch passes */
    unsigned char params[LEGACY_PARAM_BYTES];
};

static struct legacy **legacies;
static size_t n_legacies, cap_legacies;
static pthread_mutex_t legacy_lock = PTHREAD_MUTEX_INITIALIZER;

/* The function's kept state, created on first use; call with legacy_lock held. NULL: out of memory. */
static struct legacy *state_of(uint64_t func) {
    for (size_t i = 0; i < n_legacies; i++)
        if (legacies[i]->func == func) return legacies[i];
    if (n_legacies == cap_legacies) {
        size_t cap = cap_legacies ? cap_legacies * 2 : 16;
        struct legacy **grown = realloc(legacies, cap * sizeof *grown);
        if (!grown) return NULL;
        legacies = grown, cap_legacies = cap;
    }
    struct legacy *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->func = func;
    return legacies[n_legacies++] = s;
}

/* Unloading code may free function handles the driver hands out again (shim_modules.c). */
void legacy_forget(void) {
    pthread_mutex_lock(&legacy_lock);
    for (size_t i = 0; i < n_legacies; i++) free(legacies[i]);
    n_legacies = 0;
    pthread_mutex_unlock(&legacy_lock);
}

/* A handle the worker does not know is refused as the driver refuses it (the layout is asked once per
 * function and kept, so this costs one round trip per function). */
static CUresult known_function(uint64_t func) {
    struct layout l;
    return func ? layout_of(func, &l) : CUDA_ERROR_INVALID_HANDLE;
}

/* Writes `count` bytes at `offset` of the function's parameters. Past the size set is accepted, as the
 * driver accepts it (the 580 driver answers CUDA_SUCCESS): a launch passes only the size set. */
static CUresult set_param(uint64_t func, int32_t offset, const void *value, uint32_t count) {
    CUresult r = known_function(func);
    if (r != CUDA_SUCCESS) return r;
    if (offset < 0 || (count && !value)) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&legacy_lock);
    struct legacy *s = state_of(func);
    if (!s) r = CUDA_ERROR_OUT_OF_MEMORY;
    else if ((uint64_t)offset + count > LEGACY_PARAM_BYTES) r = CUDA_ERROR_INVALID_VALUE;
    else memcpy(s->params + offset, value, count);
    pthread_mutex_unlock(&legacy_lock);
    return r;
}

CUresult cuFuncSetBlockShape(uint64_t f, int32_t x, int32_t y, int32_t z) {
    GP_TRACE("cuFuncSetBlockShape");
    CUresult r = known_function(f);
    if (r != CUDA_SUCCESS) return r;
    if (x < 1 || y < 1 || z < 1) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&legacy_lock);
    struct legacy *s = state_of(f);
    if (s) s->block[0] = (uint32_t)x, s->block[1] = (uint32_t)y, s->block[2] = (uint32_t)z;
    pthread_mutex_unlock(&legacy_lock);
    return s ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuFuncSetSharedSize(uint64_t f, uint32_t bytes) {
    GP_TRACE("cuFuncSetSharedSize");
    CUresult r = known_function(f);
    if (r != CUDA_SUCCESS) return r;
    pthread_mutex_lock(&legacy_lock);
    struct legacy *s = state_of(f);
    if (s) s->shared = bytes; /* checked against the function's maximum at the launch, as the driver does */
    pthread_mutex_unlock(&legacy_lock);
    return s ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuParamSetSize(uint64_t f, uint32_t numbytes) {
    GP_TRACE("cuParamSetSize");
    CUresult r = known_function(f);
    if (r != CUDA_SUCCESS) return r;
    if (numbytes > LEGACY_PARAM_BYTES) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&legacy_lock);
    struct legacy *s = state_of(f);
    if (s) s->size = numbytes;
    pthread_mutex_unlock(&legacy_lock);
    return s ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuParamSeti(uint64_t f, int32_t offset, uint32_t value) {
    GP_TRACE("cuParamSeti");
    return set_param(f, offset, &value, sizeof value);
}

CUresult cuParamSetf(uint64_t f, int32_t offset, float value) {
    GP_TRACE("cuParamSetf");
    return set_param(f, offset, &value, sizeof value);
}

CUresult cuParamSetv(uint64_t f, int32_t offset, void *p, uint32_t numbytes) {
    GP_TRACE("cuParamSetv");
    return set_param(f, offset, p, numbytes);
}

/* The launch itself: the kept state copied out under the lock, then sent as any cuLaunchKernel is. */
static CUresult launch_legacy(uint64_t f, int32_t gx, int32_t gy, uint64_t stream) {
    CUresult r = known_function(f);
    if (r != CUDA_SUCCESS) return r;
    if (gx < 1 || gy < 1) return CUDA_ERROR_INVALID_VALUE;
    struct legacy copy;
    pthread_mutex_lock(&legacy_lock);
    struct legacy *s = state_of(f);
    if (s) memcpy(&copy, s, sizeof copy);
    pthread_mutex_unlock(&legacy_lock);
    if (!s) return CUDA_ERROR_OUT_OF_MEMORY;
    if (!copy.block[0]) return CUDA_SUCCESS; /* no block shape yet: the driver answers success, no threads */
    size_t size = copy.size;
    void *extra[] = {(void *)1, copy.params, (void *)2, &size, NULL}; /* BUFFER_POINTER, BUFFER_SIZE, END */
    return cuLaunchKernel(f, (uint32_t)gx, (uint32_t)gy, 1, copy.block[0], copy.block[1], copy.block[2], copy.shared,
                          stream, NULL, extra);
}

CUresult cuLaunch(uint64_t f) {
    GP_TRACE("cuLaunch");
    return launch_legacy(f, 1, 1, 0);
}

CUresult cuLaunchGrid(uint64_t f, int32_t grid_width, int32_t grid_height) {
    GP_TRACE("cuLaunchGrid");
    return launch_legacy(f, grid_width, grid_height, 0);
}

CUresult cuLaunchGridAsync(uint64_t f, int32_t grid_width, int32_t grid_height, uint64_t stream) {
    GP_TRACE("cuLaunchGridAsync");
    return launch_legacy(f, grid_width, grid_height, stream);
}

/* ---- cuCtxAttach / cuCtxDetach: a usage count on a context of the lease ---------------------------- */

/* Attaches beyond the context's creation, per context: cuCtxDetach takes one back, and destroys the
 * context (cuCtxDestroy) when none is left, as the driver counts them. */
static struct { uint64_t ctx; uint64_t count; } *attaches;
static size_t n_attaches, cap_attaches;

CUresult cuCtxAttach(uint64_t *ctx, uint32_t flags) {
    GP_TRACE("cuCtxAttach");
    if (!ctx || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    uint64_t current = gp_ctx_current();
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&legacy_lock);
    size_t i = 0;
    while (i < n_attaches && attaches[i].ctx != current) i++;
    if (i == n_attaches) {
        if (n_attaches == cap_attaches) {
            size_t cap = cap_attaches ? cap_attaches * 2 : 8;
            void *grown = realloc(attaches, cap * sizeof *attaches);
            if (grown) attaches = grown, cap_attaches = cap;
        }
        if (n_attaches < cap_attaches) attaches[n_attaches++].ctx = current, attaches[i].count = 0;
        else r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (r == CUDA_SUCCESS) attaches[i].count++, *ctx = current;
    pthread_mutex_unlock(&legacy_lock);
    return r;
}

CUresult cuCtxDetach(uint64_t ctx) {
    GP_TRACE("cuCtxDetach");
    if (!ctx || ctx != gp_ctx_current()) return CUDA_ERROR_INVALID_CONTEXT; /* it must be the thread's current */
    int attached = 0;
    pthread_mutex_lock(&legacy_lock);
    for (size_t i = 0; i < n_attaches; i++) {
        if (attaches[i].ctx != ctx) continue;
        attached = 1;
        if (--attaches[i].count == 0) attaches[i] = attaches[--n_attaches];
        break;
    }
    pthread_mutex_unlock(&legacy_lock);
    return attached ? CUDA_SUCCESS : cuCtxDestroy_v2(ctx);
}
