/* gpupool's libcuda.so.1, hand-written calls: device memory, the virtual memory API and page-locked
 * host memory. Allocations are reserved in this address space; host memory stays here, and copies
 * still landing in it are settled before the host reads or frees it. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim_calls.h"

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

#define LOCATION_DEVICE 1 /* CU_MEM_LOCATION_TYPE_DEVICE */
#define LOCATION_HOST_NUMA_CURRENT 4

/* A prefetch to a CUmemLocation (its type in the low word, its id in the high one), kept for
 * cuMemRangeGetAttribute's LAST_PREFETCH_LOCATION. A device the lease does not have is refused as the
 * driver refuses an ordinal it does not have (CuPy's test_managed_memory_prefetch_basic). */
static CUresult prefetch(uint64_t dptr, uint64_t count, uint64_t location) {
    int32_t type = (int32_t)(location & 0xffffffffu), id = (int32_t)(location >> 32), devices = 0;
    if (type < LOCATION_DEVICE || type > LOCATION_HOST_NUMA_CURRENT) return CUDA_ERROR_INVALID_VALUE;
    if (type == LOCATION_DEVICE && (cuDeviceGetCount(&devices) != CUDA_SUCCESS || id < 0 || id >= devices))
        return CUDA_ERROR_INVALID_DEVICE;
    CUresult r = managed_hint(dptr, count, type != LOCATION_HOST);
    if (r == CUDA_SUCCESS) gp_hints_prefetched(dptr, count, type, id);
    return r;
}

static uint64_t location_of_device(int32_t device) { /* CU_DEVICE_CPU (-1) is the host */
    return device == -1 ? LOCATION_HOST : LOCATION_DEVICE | (uint64_t)(uint32_t)device << 32;
}

CUresult cuMemPrefetchAsync(uint64_t dptr, uint64_t count, int32_t device, uint64_t stream) {
    GP_TRACE("cuMemPrefetchAsync");
    (void)stream;
    return prefetch(dptr, count, location_of_device(device));
}

CUresult cuMemPrefetchAsync_v2(uint64_t dptr, uint64_t count, uint64_t location, uint32_t flags, uint64_t stream) {
    GP_TRACE("cuMemPrefetchAsync_v2");
    (void)flags, (void)stream;
    return prefetch(dptr, count, location);
}

CUresult cuMemAdvise(uint64_t dptr, uint64_t count, int32_t advice, int32_t device) {
    GP_TRACE("cuMemAdvise");
    CUresult r = managed_hint(dptr, count, 0);
    return r == CUDA_SUCCESS ? gp_hints_advise_device(dptr, count, advice, device) : r;
}

CUresult cuMemAdvise_v2(uint64_t dptr, uint64_t count, int32_t advice, uint64_t location) {
    GP_TRACE("cuMemAdvise_v2");
    CUresult r = managed_hint(dptr, count, 0);
    return r == CUDA_SUCCESS ? gp_hints_advise(dptr, count, advice, (int32_t)(location & 0xffffffffu),
                                               (int32_t)(location >> 32))
                             : r;
}

/* Attaching managed memory to a stream only says which streams may touch it while others run: the
 * mirror needs no such hint. The whole allocation (length 0) or the range must be managed memory. */
#define ATTACH_GLOBAL 1
#define ATTACH_HOST 2
#define ATTACH_SINGLE 4

CUresult cuStreamAttachMemAsync(uint64_t stream, uint64_t dptr, uint64_t length, uint32_t flags) {
    GP_TRACE("cuStreamAttachMemAsync");
    (void)stream;
    if (flags != ATTACH_GLOBAL && flags != ATTACH_HOST && flags != ATTACH_SINGLE) return CUDA_ERROR_INVALID_VALUE;
    return managed_hint(dptr, length ? length : 1, 0);
}

/* Batched prefetch and discard (CUDA 13): location k applies to ranges location_idxs[k] up to the next
 * index (the last to the end); each range goes as cuMemPrefetchAsync_v2 to its location. A discard makes
 * the contents undefined: keeping them is one of the outcomes it allows, so a discard is checked only. */
static CUresult batch_ranges(const uint64_t *dptrs, const uint64_t *sizes, uint64_t count, const uint64_t *locations,
                             const uint64_t *location_idxs, uint64_t num_locations, uint64_t flags, int prefetching) {
    if (!count || !dptrs || !sizes || flags) return CUDA_ERROR_INVALID_VALUE;
    if (prefetching) {
        if (!locations || !location_idxs || !num_locations || num_locations > count || location_idxs[0] != 0)
            return CUDA_ERROR_INVALID_VALUE;
        for (uint64_t k = 1; k < num_locations; k++)
            if (location_idxs[k] <= location_idxs[k - 1] || location_idxs[k] >= count) return CUDA_ERROR_INVALID_VALUE;
    }
    for (uint64_t i = 0; i < count; i++)
        if (managed_hint(dptrs[i], sizes[i], 0) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_VALUE;
    for (uint64_t i = 0, k = 0; prefetching && i < count; i++) {
        while (k + 1 < num_locations && location_idxs[k + 1] <= i) k++;
        prefetch(dptrs[i], sizes[i], locations[k]);
    }
    return CUDA_SUCCESS;
}

CUresult cuMemPrefetchBatchAsync(void *dptrs, void *sizes, uint64_t count, void *locations, void *location_idxs,
                                 uint64_t num_locations, uint64_t flags, uint64_t stream) {
    GP_TRACE("cuMemPrefetchBatchAsync");
    (void)stream;
    return batch_ranges(dptrs, sizes, count, locations, location_idxs, num_locations, flags, 1);
}

CUresult cuMemDiscardBatchAsync(void *dptrs, void *sizes, uint64_t count, uint64_t flags, uint64_t stream) {
    GP_TRACE("cuMemDiscardBatchAsync");
    (void)stream;
    return batch_ranges(dptrs, sizes, count, NULL, NULL, 0, flags, 0);
}

CUresult cuMemDiscardAndPrefetchBatchAsync(void *dptrs, void *sizes, uint64_t count, void *locations,
                                           void *location_idxs, uint64_t num_locations, uint64_t flags,
                                           uint64_t stream) {
    GP_TRACE("cuMemDiscardAndPrefetchBatchAsync");
    (void)stream;
    return batch_ranges(dptrs, sizes, count, locations, location_idxs, num_locations, flags, 1);
}

CUresult cuMemFree_v2(uint64_t dptr) {
    GP_TRACE("cuMemFree_v2");
    if (!dptr) return CUDA_SUCCESS; /* as the driver does: cudart's cudaFree(NULL) idiom ends here */
    int mirror = gp_managed_lookup(dptr);
    if (mirror == GP_MIRROR_MAPPED) return CUDA_ERROR_INVALID_VALUE; /* host memory: cuMemFreeHost's */
    if (mirror == GP_MIRROR_MANAGED) gp_managed_remove(dptr);
    if (imported(dptr)) {
        gp_dev_remove(dptr);
        gp_ipc_release(dptr);
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
        gp_ipc_release(dptr);
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

/* Multicast objects: the properties (CUmulticastObjectProp: device count, size, handle types, flags) travel
 * as they are; the handle is mapped, given access and released as created memory's is. */
#define MULTICAST_PROP_BYTES 32

CUresult cuMulticastCreate(uint64_t *handle, void *prop) {
    GP_TRACE("cuMulticastCreate");
    if (!handle || !prop) return CUDA_ERROR_INVALID_VALUE;
    struct gp_out_cuMulticastCreate out;
    CUresult r = gp_call(GP_CALL_cuMulticastCreate, WANT, NULL, 0, prop, MULTICAST_PROP_BYTES, &out, sizeof out, NULL,
                         0);
    if (r == CUDA_SUCCESS) *handle = out.handle;
    return r;
}

/* Logical endpoints (CUDA 13.3): CUlogicalEndpointProp travels in the bulk, the worker checks it. */
#define ENDPOINT_PROP_BYTES 24

CUresult cuLogicalEndpointCreate(uint32_t id, void *prop) {
    GP_TRACE("cuLogicalEndpointCreate");
    if (!prop) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuLogicalEndpointCreate in = {.id = id};
    return gp_call(GP_CALL_cuLogicalEndpointCreate, WANT, &in, sizeof in, prop, ENDPOINT_PROP_BYTES, NULL, 0, NULL, 0);
}

CUresult cuLogicalEndpointGetLimits(uint64_t *alignment, uint64_t *max_size, void *prop) {
    GP_TRACE("cuLogicalEndpointGetLimits");
    if (!alignment || !max_size || !prop) return CUDA_ERROR_INVALID_VALUE;
    struct gp_out_cuLogicalEndpointGetLimits out;
    CUresult r = gp_call(GP_CALL_cuLogicalEndpointGetLimits, WANT, NULL, 0, prop, ENDPOINT_PROP_BYTES, &out,
                         sizeof out, NULL, 0);
    if (r == CUDA_SUCCESS) *alignment = out.alignment, *max_size = out.max_size;
    return r;
}

#define FABRIC_COPY_BYTES 64 /* CUDA_FABRIC_COPY_BATCH_OP */
#define MAX_FABRIC_COPIES 4096

CUresult cuFabricCpyBatchAsync(uint64_t count, void *ops, uint64_t flags, uint64_t stream) {
    GP_TRACE("cuFabricCpyBatchAsync");
    if (!ops || !count || count > MAX_FABRIC_COPIES) return CUDA_ERROR_INVALID_VALUE;
    gp_managed_before(GP_CALL_cuFabricCpyBatchAsync);
    struct gp_in_cuFabricCpyBatchAsync in = {.count = count, .flags = flags, .stream = stream};
    CUresult r = gp_call(GP_CALL_cuFabricCpyBatchAsync, WANT, &in, sizeof in, ops, count * FABRIC_COPY_BYTES, NULL, 0,
                         NULL, 0);
    gp_managed_after(GP_CALL_cuFabricCpyBatchAsync, r);
    return r;
}

CUresult cuMulticastGetGranularity(uint64_t *granularity, void *prop, int32_t option) {
    GP_TRACE("cuMulticastGetGranularity");
    if (!granularity || !prop) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuMulticastGetGranularity in = {.option = option};
    struct gp_out_cuMulticastGetGranularity out;
    CUresult r = gp_call(GP_CALL_cuMulticastGetGranularity, WANT, &in, sizeof in, prop, MULTICAST_PROP_BYTES, &out,
                         sizeof out, NULL, 0);
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

/* Page-locked memory of this process at `host` (known to be), made reachable by the device: an allocation
 * at its own address (pinned_map), registered memory through its mirror (cuMemHostGetDevicePointer,
 * mirrored now if it was not). *dev: the device address that reaches `host`. */
CUresult gp_host_reach(uint64_t host, uint64_t base, uint64_t *dev) {
    CUresult r = pinned_reach(base);
    if (r == CUDA_SUCCESS) *dev = host;
    if (r == CUDA_ERROR_NOT_FOUND) r = cuMemHostGetDevicePointer_v2(dev, (void *)host, 0);
    return r;
}

/* Each 8-byte word of a kernel's packed parameters that is an address of page-locked memory here: that
 * memory is made the device's (gp_host_reach), and a word naming registered memory, whose device pointer
 * is another (its mirror), is replaced by that pointer: natively a GPU with unified addressing takes a
 * registered page's own address in a kernel (PyTorch's pinned memory under
 * `pinned_use_cuda_host_register` is passed so). `params` is the shim's packed copy, rewritten in place. */
CUresult params_reach(unsigned char *params, int64_t len) {
    if (!__atomic_load_n(&n_unreachable, __ATOMIC_ACQUIRE)) return CUDA_SUCCESS;
    for (int64_t at = 0; at + 8 <= len; at += 8) {
        uint64_t v, base, dev;
        memcpy(&v, params + at, 8);
        if (v < 4096 || v >> 47 || !granule_marked(v) || !gp_host_lookup(v, &base, NULL, NULL)) continue;
        if (gp_mirror_device(v, &dev) && dev == v) continue; /* DEVICEMAP, or pinned and mapped */
        CUresult r = gp_host_reach(v, base, &dev);
        if (r != CUDA_SUCCESS) return r;
        if (dev != v) memcpy(params + at, &dev, 8);
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
 * lease: the pointer is that allocation's (a kernel given the host address itself gets it instead,
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

/* ---- copies landing in page-locked memory: settled before the host reads or frees it ---------- */

/* Copies to the host still landing in [p, p+count) are in place before the caller reads or frees it
 * (the worker sends every copy in flight, each once done; natively the stream order or the free's
 * synchronisation gives the same). Nothing to ask while none lands there. */
CUresult copies_settle(const void *p, uint64_t count) {
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

CUresult copies_settle_host(const void *p) { /* before page-locked memory is given back */
    uint64_t base, size;
    gp_lanes_sent(); /* a copy from it across the lanes has read it (a lane's failure is the connection's) */
    return gp_host_lookup((uint64_t)p, &base, &size, NULL) ? copies_settle((void *)base, size) : CUDA_SUCCESS;
}

/* Page-locked memory named where the device's side of a copy goes: under unified addressing the device
 * reaches it at the host's address, so natively such a copy works. Memory the device already uses (a
 * mirror, shim_managed.c) is copied through its device copy (*side set to it, 2 returned: the lease's
 * memory, as the worker checks); memory it never used is copied here, host to host, once copies still
 * landing there are in (1 returned, *r set). 0: not page-locked memory. */

int page_locked_side(uint64_t *side, uint64_t other, uint64_t count, int to_side, CUresult *r) {
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
uint64_t pinned_shared(const void *p, uint64_t count, int landing) {
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
CUresult pinned_copy(uint32_t call, uint64_t device, const void *host, uint64_t count, uint64_t stream) {
    int to_device = call == GP_CALL_cuMemcpyHtoD_v2 || call == GP_CALL_cuMemcpyHtoDAsync_v2;
    int synchronous = call == GP_CALL_cuMemcpyHtoD_v2 || call == GP_CALL_cuMemcpyDtoH_v2;
    struct gp_in_gpPinnedCopy in = {.device = device, .host = (uint64_t)host, .count = count,
                                    .stream = synchronous ? 0 : stream, .flags = to_device | synchronous << 1};
    /* A large copy goes at once, not held with the frames after it (shim.c, "held"): its DMA is work worth
     * starting now, and a syscall is small beside it. */
    uint32_t flags = synchronous ? WANT : count >= GP_SEND_NOW_BYTES ? GP_FLAG_SEND_NOW : 0;
    CUresult r = gp_call(GP_CALL_gpPinnedCopy, flags, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
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
