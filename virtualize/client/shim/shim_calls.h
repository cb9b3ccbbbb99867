/* gpupool's libcuda.so.1: what the files of hand-written calls (shim_calls.c, shim_memory.c,
 * shim_copies.c, shim_ipc.c, shim_arrays.c, shim_modules.c, shim_graphs.c, shim_streams.c) share.
 * Internal to the shim: hidden like everything not exported (-fvisibility=hidden). */
#pragma once
#include "shim.h"

#define WANT GP_FLAG_WANTS_REPLY
#define CALL(key, flags, in, out) gp_call(GP_CALL_##key, flags, &in, sizeof in, NULL, 0, &out, sizeof out, NULL, 0)

/* Where an address is (copies, pointer attributes, graph nodes): a range of the lease's device memory
 * known here, any address in one, page-locked host memory of this process. */
static inline int device_range(uint64_t ptr, uint64_t count) {
    uint64_t base, size;
    return gp_dev_lookup(ptr, &base, &size, NULL) && count <= size - (ptr - base);
}
static inline int is_device(uint64_t ptr) { return gp_dev_lookup(ptr, NULL, NULL, NULL); }
static inline int page_locked(const void *p, uint64_t count) {
    uint64_t base, size;
    return gp_host_lookup((uint64_t)p, &base, &size, NULL) && count <= size - ((uint64_t)p - base);
}

/* Page-locked host memory and the copies landing in it (shim_memory.c): copies still landing in
 * [p, p+count) (or in p's whole allocation) in place first; the device's side of a copy that names
 * page-locked memory; the shared page-locked allocation a copy lies in; a copy by the worker's DMA. */
CUresult copies_settle(const void *p, uint64_t count);
CUresult copies_settle_host(const void *p);
int page_locked_side(uint64_t *side, uint64_t other, uint64_t count, int to_side, CUresult *r);
uint64_t pinned_shared(const void *p, uint64_t count, int landing);
CUresult pinned_copy(uint32_t call, uint64_t device, const void *host, uint64_t count, uint64_t stream);
/* Page-locked memory here made reachable by the device (its device address in *dev); kernel parameters
 * that are addresses of it made the device's, registered memory's replaced by its mirror's. */
CUresult gp_host_reach(uint64_t host, uint64_t base, uint64_t *dev);
CUresult params_reach(unsigned char *params, int64_t len);

/* Kernel parameter layouts, asked of the worker once per function, and packing (shim_modules.c). */
struct layout { uint64_t func; uint32_t count, total; uint32_t *offset_size; };
CUresult layout_of(uint64_t func, struct layout *result);
int64_t pack_params(const struct layout *l, void **params, void **extra, unsigned char *buf, size_t cap);
/* Stream memory operations (shim_streams.c): a batch of CUstreamBatchMemOpParams (48 bytes each) checked
 * as cuStreamBatchMemOp checks it: known operations, no word of mirrored host memory. */
#define MEM_OP_BYTES 48
#define MEM_OPS_MAX 256 /* the driver's limit on one batch */
CUresult mem_ops_check(uint32_t call, const void *ops, uint32_t count);
/* The legacy launch API's per-function state (shim_legacy.c), forgotten with the layouts at an unload. */
void legacy_forget(void);
