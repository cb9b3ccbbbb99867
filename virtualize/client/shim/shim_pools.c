/* gpupool's libcuda.so.1, part 7: stream-ordered pools of page-locked host memory and of managed memory
 * (cuMemPoolCreate with a host location or the managed allocation type; the current and default pools
 * of those kinds, cuMemGetMemPool / cuMemGetDefaultMemPool) — cuda.core's PinnedMemoryResource and
 * ManagedMemoryResource. They are answered here: a pool of the device's own kind is the worker's, these
 * are bookkeeping over what this process already serves. An allocation from a host pool is page-locked
 * memory as cuMemHostAlloc makes it (the device's at its own address once a kernel uses it), one from a
 * managed pool is managed memory as cuMemAllocManaged makes it; cuMemFreeAsync frees either at once
 * (copies still landing in it settle first, and unmapping waits for the GPU), which is as early as the
 * stream could have let the driver reuse it. A pool's handle is a value no pointer takes (its tag in the
 * top bits), so it is never mistaken for a worker's pool. Sharing such a pool with another process
 * (handle types other than none) is not built. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

#define POOL_TAG 0xfffe000000000000ull /* kernel-half addresses: never a pointer of either process */
#define MAX_POOLS 256
#define LOCATION_NONE 0
#define LOCATION_DEVICE 1
#define LOCATION_HOST 2
#define LOCATION_HOST_NUMA 3
#define LOCATION_HOST_NUMA_CURRENT 4
#define ALLOCATION_PINNED 1
#define ALLOCATION_MANAGED 2
/* CUmemPool_attribute: three reuse flags (ints), then cuuint64_t release threshold, reserved current and
 * high, used current and high. */
enum { REUSE_LAST = 3, RELEASE_THRESHOLD = 4, RESERVED_CURRENT, RESERVED_HIGH, USED_CURRENT, USED_HIGH };

struct pool {
    int live, managed, location, id;
    int reuse[REUSE_LAST];
    uint64_t threshold, used, used_high;
};
struct allocation {
    uint64_t ptr, size;
    int pool;
};

static struct pool pools[MAX_POOLS];
static int n_pools;
static int current[2][5]; /* [managed][location type]: 1 + the current pool, 0 for the default */
static int defaults[2][5];
static struct allocation *allocations;
static size_t n_allocations, cap_allocations;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static struct pool *find(uint64_t handle) { /* under lock */
    uint64_t i = handle - POOL_TAG;
    return (handle & POOL_TAG) == POOL_TAG && i < (uint64_t)n_pools && pools[i].live ? &pools[i] : NULL;
}

int gp_pool_is_local(uint64_t handle) {
    pthread_mutex_lock(&lock);
    int local = find(handle) != NULL;
    pthread_mutex_unlock(&lock);
    return local;
}

static int location_of(int type) { /* host pools are one kind whatever their NUMA node */
    return type == LOCATION_HOST_NUMA || type == LOCATION_HOST_NUMA_CURRENT ? LOCATION_HOST : type;
}

static CUresult add(uint64_t *handle, int managed, int location, int id) { /* under lock */
    if (n_pools == MAX_POOLS) return CUDA_ERROR_OUT_OF_MEMORY;
    pools[n_pools] = (struct pool){.live = 1, .managed = managed, .location = location, .id = id,
                                   .reuse = {1, 1, 1}};
    *handle = POOL_TAG + (uint64_t)n_pools++;
    return CUDA_SUCCESS;
}

/* A host pool lies on the host; a managed pool's location is a preference: none, a device or the host. */
static int valid_location(int managed, int location) {
    return location == LOCATION_HOST || (managed && (location == LOCATION_NONE || location == LOCATION_DEVICE));
}

/* CUmemPoolProps: allocType, handleTypes, location {type, id}, win32 attributes, maxSize, ... */
CUresult gp_pool_create_local(uint64_t *handle, const void *props) {
    int32_t head[4];
    memcpy(head, props, sizeof head);
    int managed = head[0] == ALLOCATION_MANAGED, location = location_of(head[2]);
    if (!managed && (head[0] != ALLOCATION_PINNED || location == LOCATION_DEVICE)) return CUDA_ERROR_NOT_FOUND;
    if (!valid_location(managed, location)) return CUDA_ERROR_INVALID_VALUE;
    if (head[1] != 0) {
        gp_say("cuMemPoolCreate: a pool of %s memory shared with other processes (handle types 0x%x) is not "
               "forwarded to the remote GPU; it returns CUDA_ERROR_NOT_SUPPORTED",
               managed ? "managed" : "page-locked", head[1]);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    pthread_mutex_lock(&lock);
    CUresult r = add(handle, managed, location, head[3]);
    pthread_mutex_unlock(&lock);
    return r;
}

/* CUmemLocation: type, id. The device's own pools (pinned, on a device) are the worker's: NOT_FOUND. */
static CUresult kind_of(const void *location, int type, int *managed, int *where) {
    if (!location) return CUDA_ERROR_INVALID_VALUE;
    int32_t loc[2];
    memcpy(loc, location, sizeof loc);
    *managed = type == ALLOCATION_MANAGED;
    *where = location_of(loc[0]);
    if (!*managed && type != ALLOCATION_PINNED) return CUDA_ERROR_INVALID_VALUE;
    if (!*managed && *where == LOCATION_DEVICE) return CUDA_ERROR_NOT_FOUND;
    return valid_location(*managed, *where) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static CUresult current_pool(uint64_t *pool, void *location, int32_t type, int want_default) {
    int managed, where, dev;
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = kind_of(location, type, &managed, &where);
    if (r == CUDA_ERROR_NOT_FOUND) { /* the device's: its pool on the worker */
        memcpy(&dev, (const char *)location + 4, 4);
        return want_default ? cuDeviceGetDefaultMemPool(pool, dev) : cuDeviceGetMemPool(pool, dev);
    }
    if (r != CUDA_SUCCESS) return r;
    pthread_mutex_lock(&lock);
    int *slot = &defaults[managed][where];
    if (!*slot) {
        uint64_t handle;
        r = add(&handle, managed, where, 0);
        if (r == CUDA_SUCCESS) *slot = 1 + (int)(handle - POOL_TAG);
    }
    int chosen = !want_default && current[managed][where] ? current[managed][where] : *slot;
    if (r == CUDA_SUCCESS) *pool = POOL_TAG + (uint64_t)(chosen - 1);
    pthread_mutex_unlock(&lock);
    return r;
}

CUresult cuMemGetMemPool(uint64_t *pool, void *location, int32_t type) {
    GP_TRACE("cuMemGetMemPool");
    return current_pool(pool, location, type, 0);
}

CUresult cuMemGetDefaultMemPool(uint64_t *pool, void *location, int32_t type) {
    GP_TRACE("cuMemGetDefaultMemPool");
    return current_pool(pool, location, type, 1);
}

CUresult cuMemSetMemPool(void *location, int32_t type, uint64_t pool) {
    GP_TRACE("cuMemSetMemPool");
    int managed, where;
    CUresult r = kind_of(location, type, &managed, &where);
    if (r == CUDA_ERROR_NOT_FOUND) { /* the device's: its current pool on the worker */
        int32_t dev;
        memcpy(&dev, (const char *)location + 4, 4);
        return cuDeviceSetMemPool(dev, pool);
    }
    if (r != CUDA_SUCCESS) return r;
    pthread_mutex_lock(&lock);
    struct pool *p = find(pool);
    if (!p || p->managed != managed || p->location != where) r = CUDA_ERROR_INVALID_VALUE;
    else current[managed][where] = 1 + (int)(pool - POOL_TAG);
    pthread_mutex_unlock(&lock);
    return r;
}

CUresult gp_pool_alloc_local(uint64_t *dptr, uint64_t size, uint64_t handle) {
    pthread_mutex_lock(&lock);
    struct pool *p = find(handle);
    int managed = p ? p->managed : 0;
    pthread_mutex_unlock(&lock);
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    if (!dptr || !size) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = managed ? cuMemAllocManaged(dptr, size, 1 /* ATTACH_GLOBAL */) : cuMemHostAlloc(dptr, size, 0);
    if (r != CUDA_SUCCESS) return r;
    pthread_mutex_lock(&lock);
    if (n_allocations == cap_allocations) {
        size_t cap = cap_allocations ? 2 * cap_allocations : 64;
        struct allocation *more = realloc(allocations, cap * sizeof *more);
        if (more) allocations = more, cap_allocations = cap;
    }
    if (n_allocations < cap_allocations) {
        allocations[n_allocations++] = (struct allocation){*dptr, size, (int)(handle - POOL_TAG)};
        p->used += size;
        if (p->used > p->used_high) p->used_high = p->used;
    } else {
        r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_unlock(&lock);
    if (r != CUDA_SUCCESS) managed ? cuMemFree_v2(*dptr) : cuMemFreeHost((void *)*dptr);
    return r;
}

/* 1 when ptr is an allocation of a pool of this file's (freed, its result in *r), 0 otherwise. */
int gp_pool_free_local(uint64_t ptr, CUresult *r) {
    pthread_mutex_lock(&lock);
    size_t i = 0;
    while (i < n_allocations && allocations[i].ptr != ptr) i++;
    if (i == n_allocations) {
        pthread_mutex_unlock(&lock);
        return 0;
    }
    struct allocation a = allocations[i];
    allocations[i] = allocations[--n_allocations];
    pools[a.pool].used -= a.size;
    int managed = pools[a.pool].managed;
    pthread_mutex_unlock(&lock);
    *r = managed ? cuMemFree_v2(ptr) : cuMemFreeHost((void *)ptr);
    return 1;
}

/* cuMemPoolSetAttribute / GetAttribute of a pool of this file's: reuse flags and the release threshold
 * are kept; what is reserved is what is used (nothing is cached); high marks reset to 0 only. */
CUresult gp_pool_attribute_local(uint64_t handle, int32_t attr, void *value, int set) {
    pthread_mutex_lock(&lock);
    struct pool *p = find(handle);
    CUresult r = p && value ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    uint64_t v = 0;
    if (r == CUDA_SUCCESS && set) {
        if (attr >= 1 && attr <= REUSE_LAST) p->reuse[attr - 1] = *(int *)value != 0;
        else if (attr == RELEASE_THRESHOLD) p->threshold = *(uint64_t *)value;
        else if ((attr == RESERVED_HIGH || attr == USED_HIGH) && *(uint64_t *)value == 0) p->used_high = p->used;
        else r = CUDA_ERROR_INVALID_VALUE;
    } else if (r == CUDA_SUCCESS) {
        if (attr >= 1 && attr <= REUSE_LAST) *(int *)value = p->reuse[attr - 1];
        else if (attr == RELEASE_THRESHOLD) v = p->threshold;
        else if (attr == RESERVED_CURRENT || attr == USED_CURRENT) v = p->used;
        else if (attr == RESERVED_HIGH || attr == USED_HIGH) v = p->used_high;
        else r = CUDA_ERROR_INVALID_VALUE;
        if (r == CUDA_SUCCESS && attr > REUSE_LAST) *(uint64_t *)value = v;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

/* A pool goes; its allocations stay until freed, as the driver defers the pool's end until then. The
 * current and default pools cannot be destroyed, as the driver says. */
CUresult gp_pool_destroy_local(uint64_t handle) {
    pthread_mutex_lock(&lock);
    struct pool *p = find(handle);
    CUresult r = p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    int index = 1 + (int)(handle - POOL_TAG);
    for (int m = 0; r == CUDA_SUCCESS && m < 2; m++)
        for (int w = 0; w < 5; w++)
            if (defaults[m][w] == index || current[m][w] == index) r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) p->live = 0;
    pthread_mutex_unlock(&lock);
    return r;
}

/* Access from the devices: a host or managed pool's memory is every device's already (as under unified
 * addressing); a device pool's access map is not forwarded. CUmemAccessDesc: location {type, id}, flags. */
CUresult cuMemPoolSetAccess(uint64_t pool, void *map, uint64_t count) {
    GP_TRACE("cuMemPoolSetAccess");
    static int said;
    if (gp_pool_is_local(pool)) return map || !count ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
        gp_say("cuMemPoolSetAccess on a device's pool is not forwarded to the remote GPU; it returns "
               "CUDA_ERROR_NOT_SUPPORTED");
    return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuMemPoolGetAccess(void *flags, uint64_t pool, void *location) {
    GP_TRACE("cuMemPoolGetAccess");
    static int said;
    if (!flags || !location) return CUDA_ERROR_INVALID_VALUE;
    if (gp_pool_is_local(pool)) {
        *(int32_t *)flags = 3; /* CU_MEM_ACCESS_FLAGS_PROT_READWRITE */
        return CUDA_SUCCESS;
    }
    if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
        gp_say("cuMemPoolGetAccess on a device's pool is not forwarded to the remote GPU; it returns "
               "CUDA_ERROR_NOT_SUPPORTED");
    return CUDA_ERROR_NOT_SUPPORTED;
}
