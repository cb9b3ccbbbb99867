/* gpupool's libcuda.so.1, hand-written calls: what a program advised about its managed memory and where
 * it last prefetched it, kept in the client per range of whole pages, as cuMemRangeGetAttribute(s) read
 * them back (numba and CuPy ask them). The mirror (shim_managed.c) needs none of it: the hints change
 * where the driver would keep pages, never the bytes a program sees. */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "shim_calls.h"

enum { LOC_INVALID = 0, LOC_DEVICE = 1, LOC_HOST = 2 }; /* CUmemLocationType */
#define DEVICE_CPU (-1)    /* CU_DEVICE_CPU */
#define DEVICE_INVALID (-2) /* CU_DEVICE_INVALID */
#define HOST_BIT 63        /* accessed_by: bit d for device d, this one for the host */

/* A stretch of pages with one set of hints; pages in no stretch have none. */
struct hints {
    uint64_t lo, hi;
    int read_mostly;
    int32_t preferred_type, preferred_id, prefetch_type, prefetch_id;
    uint64_t accessed_by;
};

static struct hints *spans;
static size_t n_spans, cap_spans;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void page_bounds(uint64_t ptr, uint64_t count, uint64_t *lo, uint64_t *hi) {
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    *lo = ptr / page * page;
    *hi = (ptr + count + page - 1) / page * page;
}

static int push(struct hints h) {
    if (n_spans == cap_spans) {
        size_t cap = cap_spans ? 2 * cap_spans : 64;
        struct hints *grown = realloc(spans, cap * sizeof *spans);
        if (!grown) return -1;
        spans = grown, cap_spans = cap;
    }
    spans[n_spans++] = h;
    return 0;
}

static int by_start(const void *a, const void *b) {
    uint64_t x = ((const struct hints *)a)->lo, y = ((const struct hints *)b)->lo;
    return x < y ? -1 : x > y;
}

/* The pages of [lo, hi) each made one span of their own (split where a span crosses an end, gaps filled
 * with spans of no hints); returns the index of the first, spans sorted. Call with the lock held. */
static CUresult cover(uint64_t lo, uint64_t hi, size_t *first) {
    size_t n = n_spans;
    for (size_t i = 0; i < n; i++) {
        struct hints s = spans[i];
        if (s.hi <= lo || s.lo >= hi) continue;
        if (s.lo < lo) {
            spans[i].lo = lo;
            if (push((struct hints){.lo = s.lo, .hi = lo, .read_mostly = s.read_mostly,
                                    .preferred_type = s.preferred_type, .preferred_id = s.preferred_id,
                                    .prefetch_type = s.prefetch_type, .prefetch_id = s.prefetch_id,
                                    .accessed_by = s.accessed_by}))
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
        if (s.hi > hi) {
            struct hints right = spans[i];
            right.lo = hi, right.hi = s.hi;
            spans[i].hi = hi;
            if (push(right)) return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    qsort(spans, n_spans, sizeof *spans, by_start);
    uint64_t at = lo;
    for (size_t i = 0, n_sorted = n_spans; i < n_sorted && at < hi; i++) {
        if (spans[i].hi <= at) continue;
        if (spans[i].lo > at && push((struct hints){.lo = at, .hi = spans[i].lo < hi ? spans[i].lo : hi}))
            return CUDA_ERROR_OUT_OF_MEMORY;
        at = spans[i].hi;
    }
    if (at < hi && push((struct hints){.lo = at, .hi = hi})) return CUDA_ERROR_OUT_OF_MEMORY;
    qsort(spans, n_spans, sizeof *spans, by_start);
    size_t i = 0;
    while (i < n_spans && spans[i].hi <= lo) i++;
    *first = i;
    return CUDA_SUCCESS;
}

/* cuMemAllocManaged's memory starts with no hints (whatever memory was there before had). */
void gp_hints_clear(uint64_t base, uint64_t size) {
    uint64_t lo, hi;
    page_bounds(base, size, &lo, &hi);
    pthread_mutex_lock(&lock);
    size_t kept = 0;
    for (size_t i = 0; i < n_spans; i++)
        if (spans[i].hi <= lo || spans[i].lo >= hi) spans[kept++] = spans[i];
    n_spans = kept; /* spans crossing the allocation's edges lie in other memory's pages: dropped too */
    pthread_mutex_unlock(&lock);
}

static int32_t location_type(int32_t device) { return device == DEVICE_CPU ? LOC_HOST : LOC_DEVICE; }

/* cuMemAdvise's advice (CUmem_advise 1..6) at a location (CUmemLocation's type and id). */
CUresult gp_hints_advise(uint64_t ptr, uint64_t count, int32_t advice, int32_t type, int32_t id) {
    if (advice < 1 || advice > 6) return CUDA_ERROR_INVALID_VALUE;
    int needs_place = advice == 3 || advice == 5;
    if (needs_place && type != LOC_DEVICE && type != LOC_HOST) return CUDA_ERROR_INVALID_VALUE;
    if ((advice == 5 || advice == 6) && type == LOC_DEVICE && (id < 0 || id >= HOST_BIT))
        return CUDA_ERROR_INVALID_DEVICE;
    uint64_t lo, hi, bit = type == LOC_HOST ? 1ull << HOST_BIT : 1ull << (id & 63);
    size_t first;
    page_bounds(ptr, count, &lo, &hi);
    pthread_mutex_lock(&lock);
    CUresult r = cover(lo, hi, &first);
    for (size_t i = first; r == CUDA_SUCCESS && i < n_spans && spans[i].lo < hi; i++) {
        struct hints *s = &spans[i];
        switch (advice) {
        case 1: s->read_mostly = 1; break;
        case 2: s->read_mostly = 0; break;
        case 3: s->preferred_type = type, s->preferred_id = type == LOC_HOST ? 0 : id; break;
        case 4: s->preferred_type = LOC_INVALID, s->preferred_id = 0; break;
        case 5: s->accessed_by |= bit; break;
        case 6: s->accessed_by &= ~bit; break;
        }
    }
    pthread_mutex_unlock(&lock);
    return r;
}

CUresult gp_hints_advise_device(uint64_t ptr, uint64_t count, int32_t advice, int32_t device) {
    return gp_hints_advise(ptr, count, advice, location_type(device), device == DEVICE_CPU ? 0 : device);
}

/* Where a prefetch took [ptr, ptr + count). */
void gp_hints_prefetched(uint64_t ptr, uint64_t count, int32_t type, int32_t id) {
    uint64_t lo, hi;
    size_t first;
    page_bounds(ptr, count, &lo, &hi);
    pthread_mutex_lock(&lock);
    if (cover(lo, hi, &first) == CUDA_SUCCESS)
        for (size_t i = first; i < n_spans && spans[i].lo < hi; i++)
            spans[i].prefetch_type = type, spans[i].prefetch_id = type == LOC_HOST ? 0 : id;
    pthread_mutex_unlock(&lock);
}

/* Folds one stretch's hints into what the stretches so far share: a field they disagree on reads as none. */
static void fold(struct hints *all, int *seen, const struct hints *s) {
    if (!*seen) {
        *all = *s;
        *seen = 1;
        return;
    }
    all->read_mostly &= s->read_mostly;
    all->accessed_by &= s->accessed_by;
    if (s->preferred_type != all->preferred_type || s->preferred_id != all->preferred_id)
        all->preferred_type = LOC_INVALID, all->preferred_id = 0;
    if (s->prefetch_type != all->prefetch_type || s->prefetch_id != all->prefetch_id)
        all->prefetch_type = LOC_INVALID, all->prefetch_id = 0;
}

/* The hints every page of [lo, hi) shares (spans are sorted and do not overlap; gaps have none). */
static struct hints common(uint64_t lo, uint64_t hi) {
    static const struct hints none;
    struct hints all = none;
    int seen = 0;
    uint64_t at = lo;
    for (size_t i = 0; i < n_spans && at < hi; i++) {
        if (spans[i].hi <= at) continue;
        if (spans[i].lo >= hi) break;
        if (spans[i].lo > at) fold(&all, &seen, &none);
        fold(&all, &seen, &spans[i]);
        at = spans[i].hi;
    }
    if (at < hi) fold(&all, &seen, &none);
    return all;
}

static int32_t as_device(int32_t type, int32_t id) {
    return type == LOC_DEVICE ? id : type == LOC_HOST ? DEVICE_CPU : DEVICE_INVALID;
}

/* CUmem_range_attribute: READ_MOSTLY 1, PREFERRED_LOCATION 2, ACCESSED_BY 3, LAST_PREFETCH_LOCATION 4,
 * and CUDA 12.2's PREFERRED_LOCATION_TYPE/_ID 5/6, LAST_PREFETCH_LOCATION_TYPE/_ID 7/8. */
CUresult cuMemRangeGetAttribute(void *data, uint64_t size, int32_t attribute, uint64_t ptr, uint64_t count) {
    GP_TRACE("cuMemRangeGetAttribute");
    if (!data || !count || attribute < 1 || attribute > 8) return CUDA_ERROR_INVALID_VALUE;
    if (attribute == 3 ? size == 0 || size % 4 : size != 4) return CUDA_ERROR_INVALID_VALUE;
    if (gp_managed_lookup(ptr) != GP_MIRROR_MANAGED || gp_managed_lookup(ptr + count - 1) != GP_MIRROR_MANAGED)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t lo, hi;
    page_bounds(ptr, count, &lo, &hi);
    pthread_mutex_lock(&lock);
    struct hints h = common(lo, hi);
    pthread_mutex_unlock(&lock);
    int32_t *out = data;
    switch (attribute) {
    case 1: *out = h.read_mostly; break;
    case 2: *out = as_device(h.preferred_type, h.preferred_id); break;
    case 3: {
        size_t n = 0, slots = size / 4;
        for (int d = 0; d < HOST_BIT && n < slots; d++)
            if (h.accessed_by >> d & 1) out[n++] = d;
        if (h.accessed_by >> HOST_BIT & 1 && n < slots) out[n++] = DEVICE_CPU;
        while (n < slots) out[n++] = DEVICE_INVALID;
        break;
    }
    case 4: *out = as_device(h.prefetch_type, h.prefetch_id); break;
    case 5: *out = h.preferred_type; break;
    case 6: *out = h.preferred_id; break;
    case 7: *out = h.prefetch_type; break;
    case 8: *out = h.prefetch_id; break;
    }
    return CUDA_SUCCESS;
}

CUresult cuMemRangeGetAttributes(void *data, void *sizes, void *attributes, uint64_t n, uint64_t ptr,
                                 uint64_t count) {
    GP_TRACE("cuMemRangeGetAttributes");
    if (!data || !sizes || !attributes || !n) return CUDA_ERROR_INVALID_VALUE;
    for (uint64_t i = 0; i < n; i++) {
        CUresult r = cuMemRangeGetAttribute(((void **)data)[i], ((uint64_t *)sizes)[i], ((int32_t *)attributes)[i],
                                            ptr, count);
        if (r != CUDA_SUCCESS) return r;
    }
    return CUDA_SUCCESS;
}
