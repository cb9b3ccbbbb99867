/* gpupool's libcuda.so.1, hand-written calls: CUDA arrays, 2D and 3D copies, textures, surfaces and
 * tensor maps, all objects of the worker's driver. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim_calls.h"

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

/* CUDA_MEMCPY3D_PEER: CUDA_MEMCPY3D's layout, the contexts where its reserved words are (ignored). */
CUresult cuMemcpy3DPeer(void *copy) {
    GP_TRACE("cuMemcpy3DPeer");
    return copy_3d_params(copy, 0, 0);
}

CUresult cuMemcpy3DPeerAsync(void *copy, uint64_t stream) {
    GP_TRACE("cuMemcpy3DPeerAsync");
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

/* A sparse array's properties (CUDA_ARRAY_SPARSE_PROPERTIES) and an array's memory requirements on a
 * device (CUDA_ARRAY_MEMORY_REQUIREMENTS), read back as the descriptors are. */
#define SPARSE_PROPERTIES_BYTES 48
#define MEMORY_REQUIREMENTS_BYTES 32

CUresult cuArrayGetSparseProperties(void *props, uint64_t array) {
    GP_TRACE("cuArrayGetSparseProperties");
    return object_desc(GP_CALL_cuArrayGetSparseProperties, array, props, SPARSE_PROPERTIES_BYTES);
}

CUresult cuMipmappedArrayGetSparseProperties(void *props, uint64_t mipmap) {
    GP_TRACE("cuMipmappedArrayGetSparseProperties");
    return object_desc(GP_CALL_cuMipmappedArrayGetSparseProperties, mipmap, props, SPARSE_PROPERTIES_BYTES);
}

static CUresult requirements(uint32_t call, uint64_t handle, int32_t dev, void *reqs) {
    if (!reqs) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuArrayGetMemoryRequirements in = {.array = handle, .dev = dev};
    return gp_call(call, WANT, &in, sizeof in, NULL, 0, NULL, 0, reqs, MEMORY_REQUIREMENTS_BYTES);
}

CUresult cuArrayGetMemoryRequirements(void *reqs, uint64_t array, int32_t dev) {
    GP_TRACE("cuArrayGetMemoryRequirements");
    return requirements(GP_CALL_cuArrayGetMemoryRequirements, array, dev, reqs);
}

CUresult cuMipmappedArrayGetMemoryRequirements(void *reqs, uint64_t mipmap, int32_t dev) {
    GP_TRACE("cuMipmappedArrayGetMemoryRequirements");
    return requirements(GP_CALL_cuMipmappedArrayGetMemoryRequirements, mipmap, dev, reqs);
}

/* Tiles of sparse or deferred-mapping arrays mapped to memory of cuMemCreate: the CUarrayMapInfo list as
 * it is (its handles are the worker's); the worker checks each array, memory handle and device. */
#define ARRAY_MAP_INFO_BYTES 96
#define MAX_MAP_INFOS 1024

CUresult cuMemMapArrayAsync(void *infos, uint32_t count, uint64_t stream) {
    GP_TRACE("cuMemMapArrayAsync");
    if (!infos || !count || count > MAX_MAP_INFOS) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuMemMapArrayAsync in = {.count = count, .stream = stream};
    return gp_call(GP_CALL_cuMemMapArrayAsync, WANT, &in, sizeof in, infos, (uint64_t)count * ARRAY_MAP_INFO_BYTES,
                   NULL, 0, NULL, 0);
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

/* ---- legacy texture references: the fields of what C passes by pointer -------------------------- */

/* CUDA_ARRAY_DESCRIPTOR: width, height, format, channels; the worker checks the rows lie in the lease. */
CUresult cuTexRefSetAddress2D_v3(uint64_t tex, void *desc, uint64_t ptr, uint64_t pitch) {
    GP_TRACE("cuTexRefSetAddress2D_v3");
    if (!desc) return CUDA_ERROR_INVALID_VALUE;
    const unsigned char *d = desc;
    struct gp_in_cuTexRefSetAddress2D_v3 in = {.tex = tex, .ptr = ptr, .pitch = pitch};
    memcpy(&in.width, d, 8), memcpy(&in.height, d + 8, 8), memcpy(&in.format, d + 16, 4);
    memcpy(&in.channels, d + 20, 4);
    return gp_call(GP_CALL_cuTexRefSetAddress2D_v3, WANT, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
}

/* The border color: four floats, red, green, blue, alpha. */
CUresult cuTexRefSetBorderColor(uint64_t tex, void *color) {
    GP_TRACE("cuTexRefSetBorderColor");
    if (!color) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuTexRefSetBorderColor in = {.tex = tex};
    memcpy(&in.red, color, 16);
    return gp_call(GP_CALL_cuTexRefSetBorderColor, WANT, &in, sizeof in, NULL, 0, NULL, 0, NULL, 0);
}

CUresult cuTexRefGetBorderColor(void *color, uint64_t tex) {
    GP_TRACE("cuTexRefGetBorderColor");
    if (!color) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuTexRefGetBorderColor in = {.tex = tex};
    struct gp_out_cuTexRefGetBorderColor out;
    CUresult r = CALL(cuTexRefGetBorderColor, WANT, in, out);
    if (r == CUDA_SUCCESS) memcpy(color, &out.red, 16);
    return r;
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

/* The class in effect is SMALL until the call succeeds, as the driver says; the map changes only then. */
CUresult cuTensorMapSetAllocationClass(void *map, int32_t alloc_class, void *effective) {
    GP_TRACE("cuTensorMapSetAllocationClass");
    if (effective) *(int32_t *)effective = 1; /* CU_TENSOR_MAP_ALLOC_CLASS_SMALL */
    if (!map) return CUDA_ERROR_INVALID_VALUE;
    unsigned char before[TENSOR_MAP_BYTES], after[TENSOR_MAP_BYTES];
    memcpy(before, map, sizeof before);
    struct gp_in_cuTensorMapSetAllocationClass in = {.alloc_class = alloc_class};
    struct gp_out_cuTensorMapSetAllocationClass out;
    CUresult r = gp_call(GP_CALL_cuTensorMapSetAllocationClass, WANT, &in, sizeof in, before, sizeof before, &out,
                         sizeof out, after, sizeof after);
    if (r != CUDA_SUCCESS) return r;
    memcpy(map, after, sizeof after);
    if (effective) *(int32_t *)effective = out.effective;
    return CUDA_SUCCESS;
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
