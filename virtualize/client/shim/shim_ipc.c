/* gpupool's libcuda.so.1, hand-written calls: IPC between the processes of one lease (memory, pool,
 * virtual memory and event handles). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim_calls.h"

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
    if (r != CUDA_SUCCESS && gp_isolated()) { /* another worker of the lease may hold it: mapped into this one */
        struct gp_in_gpIpcImport in = {.base = base, .size = size};
        r = gp_call(GP_CALL_gpIpcImport, WANT, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
        if (r == CUDA_SUCCESS) r = cuMemGetAddressRange_v2(&got_base, &got_size, base);
    }
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

/* Pools imported from another process's worker (GPUPOOL_ISOLATE): this worker does not hold them. */
static uint64_t imported_pools[64];
static int n_imported_pools;
static pthread_mutex_t imported_pools_lock = PTHREAD_MUTEX_INITIALIZER;

static int pool_imported(uint64_t pool, int forget) {
    pthread_mutex_lock(&imported_pools_lock);
    int i;
    for (i = 0; i < n_imported_pools && imported_pools[i] != pool; i++) {
    }
    int found = i < n_imported_pools;
    if (found && forget) imported_pools[i] = imported_pools[--n_imported_pools];
    pthread_mutex_unlock(&imported_pools_lock);
    return found;
}

int gp_pool_forget_imported(uint64_t pool) { return pool_imported(pool, 1); }

static CUresult pool_of_lease(uint64_t pool) { /* the worker refuses a pool that is not the lease's */
    uint64_t threshold;
    if (pool_imported(pool, 0)) return CUDA_SUCCESS; /* another worker's, imported here */
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
    if (r != CUDA_SUCCESS) return r; /* not a pool a process of a gpupool lease exported */
    r = pool_of_lease(p);
    if (r != CUDA_SUCCESS && gp_isolated()) {
        /* another worker's pool: held here, its pointers open as IPC memory handles do (from this lease's
         * workers only), destroying it forgets it */
        pthread_mutex_lock(&imported_pools_lock);
        int room = n_imported_pools < (int)(sizeof imported_pools / sizeof *imported_pools);
        if (room) imported_pools[n_imported_pools++] = p;
        pthread_mutex_unlock(&imported_pools_lock);
        r = room ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    }
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

void gp_ipc_release(uint64_t base) {
    if (!gp_isolated()) return; /* one worker: nothing was mapped for this process */
    struct gp_in_gpIpcRelease in = {.base = base}; /* the worker ignores memory it did not map from another */
    gp_call(GP_CALL_gpIpcRelease, 0, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
}

CUresult cuIpcCloseMemHandle(uint64_t dptr) {
    GP_TRACE("cuIpcCloseMemHandle");
    uint64_t base;
    int owned;
    if (!gp_dev_lookup(dptr, &base, NULL, &owned) || owned || base != dptr) return CUDA_ERROR_INVALID_VALUE;
    gp_dev_remove(base);
    gp_ipc_release(base);
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
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_READY && gp_isolated()) {
        /* another worker of the lease may hold it: opened in this process's worker, an event of its own */
        struct gp_in_gpIpcEventImport in = {.event = e};
        struct gp_out_gpIpcEventImport out;
        r = gp_call(GP_CALL_gpIpcEventImport, WANT, &in, sizeof in, NULL, 0, &out, sizeof out, NULL, 0);
        if (r != CUDA_SUCCESS) return r;
        gp_event_interprocess(out.opened);
        *event = out.opened; /* this process's own: its cuEventDestroy destroys it */
        return CUDA_SUCCESS;
    }
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
    gp_event_interprocess(e);
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

/* A library's managed variable: reserved here at its device address and mirrored as managed memory (the
 * first touch fetches what the library's image put there), once; asked again, the same. One whose address
 * is already host memory here cannot be mirrored: refused, said once. */
CUresult cuLibraryGetManaged(uint64_t *dptr, uint64_t *bytes, uint64_t library, const char *name) {
    GP_TRACE("cuLibraryGetManaged");
    static int said;
    if (!name) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuLibraryGetManaged in = {.library = library};
    struct gp_out_cuLibraryGetManaged out;
    CUresult r = gp_call(GP_CALL_cuLibraryGetManaged, WANT, &in, sizeof in, name, strlen(name) + 1, &out, sizeof out,
                         NULL, 0);
    if (r != CUDA_SUCCESS) return r;
    if (gp_managed_lookup(out.dptr) != GP_MIRROR_MANAGED &&
        (gp_dev_add(out.dptr, out.bytes, 0) != 0 || gp_managed_add_initialised(out.dptr, out.bytes) != 0)) {
        if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
            gp_say("cuLibraryGetManaged: the variable %s lies at 0x%llx, which is host memory in this process; it "
                   "returns CUDA_ERROR_NOT_SUPPORTED", name, (unsigned long long)out.dptr);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (dptr) *dptr = out.dptr;
    if (bytes) *bytes = out.bytes;
    return CUDA_SUCCESS;
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
