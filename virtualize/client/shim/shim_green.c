/* gpupool's libcuda.so.1, hand-written calls: green contexts' device resources. A CUdevResource is the
 * driver's 144-byte struct (type, 92 bytes of padding, then the SM fields); the real one stays on the
 * worker, and the program's copy carries its id there in the padding, with the SM fields filled in as
 * the driver fills them. What a program passes back (to split, to make a descriptor) is that id, which
 * the worker checks is the lease's; the rest of the struct is never trusted. */
#include <string.h>

#include "shim_calls.h"

#define RESOURCE_BYTES 144   /* sizeof(CUdevResource), RESOURCE_ABI_VERSION 1 */
#define RESOURCE_ID_AT 4     /* the worker's id, in _internal_padding */
#define RESOURCE_SM_AT 96    /* CUdevSmResource: smCount, minSmPartitionSize, smCoscheduledAlignment */
#define RESOURCE_TYPE_SM 1   /* CU_DEV_RESOURCE_TYPE_SM */
#define MAX_GROUPS 1024      /* a split's groups in one reply (more SMs than any GPU has) */
#define MAX_DESC_RESOURCES 64

/* One resource as the worker describes it (the split's reply bulk: one per group). */
struct wire_resource {
    uint64_t id;
    uint32_t sm_count, min_partition, alignment;
} __attribute__((packed));

static void fill(void *resource, uint64_t id, uint32_t sm_count, uint32_t min_partition, uint32_t alignment) {
    unsigned char *r = resource;
    uint32_t type = RESOURCE_TYPE_SM, sm[3] = {sm_count, min_partition, alignment};
    memset(r, 0, RESOURCE_BYTES);
    memcpy(r, &type, 4);
    memcpy(r + RESOURCE_ID_AT, &id, 8);
    memcpy(r + RESOURCE_SM_AT, sm, sizeof sm);
}

static uint64_t id_of(const void *resource) {
    uint64_t id;
    memcpy(&id, (const unsigned char *)resource + RESOURCE_ID_AT, 8);
    return id;
}

#define GET_RESOURCE(call, in)                                                                                 \
    do {                                                                                                        \
        GP_TRACE(#call);                                                                                        \
        if (!resource) return CUDA_ERROR_INVALID_VALUE;                                                        \
        struct gp_out_##call out;                                                                               \
        CUresult r = CALL(call, WANT, in, out);                                                                 \
        if (r == CUDA_SUCCESS) fill(resource, out.resource, out.sm_count, out.min_partition, out.alignment);   \
        return r;                                                                                               \
    } while (0)

CUresult cuDeviceGetDevResource(int32_t dev, void *resource, int32_t type) {
    struct gp_in_cuDeviceGetDevResource in = {.dev = dev, .type = type};
    GET_RESOURCE(cuDeviceGetDevResource, in);
}

CUresult cuCtxGetDevResource(uint64_t ctx, void *resource, int32_t type) {
    struct gp_in_cuCtxGetDevResource in = {.ctx = ctx, .type = type};
    GET_RESOURCE(cuCtxGetDevResource, in);
}

CUresult cuGreenCtxGetDevResource(uint64_t green, void *resource, int32_t type) {
    struct gp_in_cuGreenCtxGetDevResource in = {.green = green, .type = type};
    GET_RESOURCE(cuGreenCtxGetDevResource, in);
}

CUresult cuStreamGetDevResource(uint64_t stream, void *resource, int32_t type) {
    struct gp_in_cuStreamGetDevResource in = {.stream = stream, .type = type};
    GET_RESOURCE(cuStreamGetDevResource, in);
}

/* With `result` NULL only the number of groups is asked (the driver's count query). */
CUresult cuDevSmResourceSplitByCount(void *result, void *nb_groups, void *input, void *remaining, uint32_t flags,
                                     uint32_t min_count) {
    GP_TRACE("cuDevSmResourceSplitByCount");
    uint32_t want;
    if (!nb_groups || !input) return CUDA_ERROR_INVALID_VALUE;
    memcpy(&want, nb_groups, 4);
    if (result && (want == 0 || want > MAX_GROUPS)) return CUDA_ERROR_INVALID_VALUE;
    static __thread struct wire_resource groups[MAX_GROUPS];
    struct gp_in_cuDevSmResourceSplitByCount in = {
        .input = id_of(input), .nb_groups = result ? want : 0, .flags = flags, .min_count = min_count,
        .count_only = result == NULL};
    struct gp_out_cuDevSmResourceSplitByCount out;
    CUresult r = gp_call(GP_CALL_cuDevSmResourceSplitByCount, WANT, &in, sizeof in, NULL, 0, &out, sizeof out,
                         groups, sizeof groups);
    if (r != CUDA_SUCCESS) return r;
    uint32_t n = out.groups < MAX_GROUPS ? out.groups : MAX_GROUPS;
    if (result)
        for (uint32_t i = 0; i < n; i++)
            fill((unsigned char *)result + (size_t)i * RESOURCE_BYTES, groups[i].id, groups[i].sm_count,
                 groups[i].min_partition, groups[i].alignment);
    if (remaining) fill(remaining, out.remaining, out.sm_count, out.min_partition, out.alignment);
    memcpy(nb_groups, &n, 4);
    return CUDA_SUCCESS;
}

/* CUDA 13.1's structured split: the group parameters go (64 bytes each) and come back, the driver's SM counts
 * filled in where they were 0 (discovery); with `result` NULL only they are asked for. */
#define GROUP_PARAMS_BYTES 64 /* CU_DEV_SM_RESOURCE_GROUP_PARAMS */
#define MAX_STRUCTURED_GROUPS 256

CUresult cuDevSmResourceSplit(void *result, uint32_t nb_groups, void *input, void *remainder, uint32_t flags,
                              void *params) {
    GP_TRACE("cuDevSmResourceSplit");
    if (!input || !params || nb_groups == 0 || nb_groups > MAX_STRUCTURED_GROUPS) return CUDA_ERROR_INVALID_VALUE;
    static __thread unsigned char back[MAX_STRUCTURED_GROUPS * (GROUP_PARAMS_BYTES + sizeof(struct wire_resource))];
    size_t params_bytes = (size_t)nb_groups * GROUP_PARAMS_BYTES;
    struct gp_in_cuDevSmResourceSplit in = {
        .input = id_of(input), .nb_groups = nb_groups, .flags = flags, .want_groups = result != NULL};
    struct gp_out_cuDevSmResourceSplit out;
    CUresult r = gp_call(GP_CALL_cuDevSmResourceSplit, WANT, &in, sizeof in, params, params_bytes, &out, sizeof out,
                         back, params_bytes + (result ? nb_groups * sizeof(struct wire_resource) : 0));
    if (r != CUDA_SUCCESS) return r;
    memcpy(params, back, params_bytes);
    for (uint32_t i = 0; result && i < nb_groups; i++) {
        struct wire_resource g;
        memcpy(&g, back + params_bytes + i * sizeof g, sizeof g);
        fill((unsigned char *)result + (size_t)i * RESOURCE_BYTES, g.id, g.sm_count, g.min_partition, g.alignment);
    }
    if (remainder) fill(remainder, out.remaining, out.sm_count, out.min_partition, out.alignment);
    return CUDA_SUCCESS;
}

CUresult cuDevResourceGenerateDesc(void *desc, void *resources, uint32_t count) {
    GP_TRACE("cuDevResourceGenerateDesc");
    if (!desc || !resources || count == 0 || count > MAX_DESC_RESOURCES) return CUDA_ERROR_INVALID_VALUE;
    uint64_t ids[MAX_DESC_RESOURCES];
    for (uint32_t i = 0; i < count; i++) ids[i] = id_of((const unsigned char *)resources + (size_t)i * RESOURCE_BYTES);
    struct gp_in_cuDevResourceGenerateDesc in = {.count = count};
    struct gp_out_cuDevResourceGenerateDesc out;
    CUresult r = gp_call(GP_CALL_cuDevResourceGenerateDesc, WANT, &in, sizeof in, ids, count * sizeof ids[0], &out,
                         sizeof out, NULL, 0);
    if (r == CUDA_SUCCESS) memcpy(desc, &out.desc, 8);
    return r;
}

/* The green context's CUcontext goes on this thread's context stack like any other: its device is noted. */
CUresult cuCtxFromGreenCtx(void *ctx, uint64_t green) {
    GP_TRACE("cuCtxFromGreenCtx");
    if (!ctx) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuCtxFromGreenCtx in = {.green = green};
    struct gp_out_cuCtxFromGreenCtx out;
    CUresult r = CALL(cuCtxFromGreenCtx, WANT, in, out);
    if (r == CUDA_SUCCESS) {
        gp_ctx_note_device(out.ctx, out.dev);
        memcpy(ctx, &out.ctx, 8);
    }
    return r;
}

/* CUexecAffinityParam: its type, then the SM count (CUexecAffinitySmCount). */
CUresult cuCtxGetExecAffinity(void *affinity, int32_t type) {
    GP_TRACE("cuCtxGetExecAffinity");
    if (!affinity) return CUDA_ERROR_INVALID_VALUE;
    struct gp_in_cuCtxGetExecAffinity in = {.type = type};
    struct gp_out_cuCtxGetExecAffinity out;
    CUresult r = CALL(cuCtxGetExecAffinity, WANT, in, out);
    if (r == CUDA_SUCCESS) {
        memcpy(affinity, &type, 4);
        memcpy((unsigned char *)affinity + 4, &out.sm_count, 4);
    }
    return r;
}
