/* gpupool's libcuda.so.1, hand-written calls: copies, sorted into host and device sides by address;
 * batched copies; 2D memsets. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim_calls.h"

/* ---- copies ------------------------------------------------------------------------------------ */

/* An asynchronous copy with page-locked memory that the worker does not map too (registered memory;
 * any page-locked memory across hosts), on a stream being captured: natively the graph gets a copy node
 * with those pages. Here the memory is made the device's now, as for a kernel given its address
 * (gp_host_reach), so the copy below is captured as a device copy with it, kept in step with the pages
 * at launches and synchronisations. Outside a capture nothing changes: the bytes travel with the call. */
static void reach_if_captured(const void *host, uint64_t count, uint64_t stream) {
    uint64_t base, dev;
    int32_t status = 0;
    /* no capture open: the common case costs no round trip (an async copy into page-locked memory
     * across hosts is one unanswered frame, and must stay one) */
    if (!gp_capture_open() || !page_locked(host, count) || pinned_shared(host, count, 0) ||
        gp_mirror_device((uint64_t)host, &dev))
        return;
    if (cuStreamIsCapturing(stream, &status) != CUDA_SUCCESS || status != 1) return; /* ACTIVE */
    if (gp_host_lookup((uint64_t)host, &base, NULL, NULL)) gp_host_reach((uint64_t)host, base, &dev);
}

static CUresult htod(uint32_t call, uint64_t dst, const void *src, uint64_t count, uint64_t stream) {
    uint64_t mirrored;
    CUresult here;
    if (count == 0) return CUDA_SUCCESS;
    int locked = page_locked_side(&dst, (uint64_t)src, count, 1, &here);
    if (locked == 1) return here;
    if (call == GP_CALL_cuMemcpyHtoDAsync_v2) reach_if_captured(src, count, stream);
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

static CUresult dtoh(uint32_t call, void *dst, uint64_t src, uint64_t count, uint64_t stream) {
    uint64_t mirrored;
    CUresult here;
    if (count == 0) return CUDA_SUCCESS;
    int locked = page_locked_side(&src, (uint64_t)dst, count, 0, &here);
    if (locked == 1) return here;
    if (call == GP_CALL_cuMemcpyDtoHAsync_v2) reach_if_captured(dst, count, stream);
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

/* One copy with a batch's attributes (CUDA 13), checked as the batch's are. */
CUresult cuMemcpyWithAttributesAsync(uint64_t dst, uint64_t src, uint64_t size, void *attr, uint64_t stream) {
    GP_TRACE("cuMemcpyWithAttributesAsync");
    int32_t order;
    if (!attr) return CUDA_ERROR_INVALID_VALUE;
    memcpy(&order, attr, 4);
    if (order < 1 || order > SRC_ACCESS_ORDER_ANY) return CUDA_ERROR_INVALID_VALUE;
    return generic_copy(dst, src, size, stream, 1);
}

CUresult cuMemcpy3DWithAttributesAsync(void *op, uint64_t flags, uint64_t stream) {
    GP_TRACE("cuMemcpy3DWithAttributesAsync");
    return batch_copy_3d(1, op, NULL, flags, stream);
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

/* ---- batched decompression: the operations (CUmemDecompressParams, 64 bytes each) as they are; the worker
 * checks each one's memory, and the index of the one the driver refused comes back. */
#define DECOMPRESS_PARAMS_BYTES 64
#define MAX_DECOMPRESSIONS 4096

CUresult cuMemBatchDecompressAsync(void *params, uint64_t count, uint32_t flags, void *error_index, uint64_t stream) {
    GP_TRACE("cuMemBatchDecompressAsync");
    uint64_t none = UINT64_MAX;
    if (error_index) memcpy(error_index, &none, 8);
    if (!params || !count || count > MAX_DECOMPRESSIONS) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuMemBatchDecompressAsync in = {.count = count, .flags = flags, .stream = stream};
    struct gp_out_cuMemBatchDecompressAsync out;
    CUresult r = gp_call(GP_CALL_cuMemBatchDecompressAsync, WANT, &in, sizeof in, params,
                         count * DECOMPRESS_PARAMS_BYTES, &out, sizeof out, NULL, 0);
    if (r == CUDA_SUCCESS && error_index) memcpy(error_index, &out.error_index, 8);
    return r;
}
