/* Sorted arrays of address ranges, searched the same way by the shim (the client's device allocations,
 * page-locked memory, reserved address space: shim/shim.c) and the worker's native loop (the lease's
 * allocations: native/dispatch.c). Each element starts with its uint64_t base; the array is sorted by it. */
#ifndef GP_RANGES_H
#define GP_RANGES_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The first index whose base is above `ptr` (n when none is): the range that may hold `ptr` is the one
 * before it. `stride`: the size of one element. */
static inline size_t gp_ranges_upper(const void *array, size_t n, size_t stride, uint64_t ptr) {
    const unsigned char *v = array;
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        uint64_t base;
        memcpy(&base, v + mid * stride, sizeof base);
        if (base <= ptr) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Whether [base, base + size) holds `ptr` (an empty range holds its base, as the driver's lookups do). */
static inline int gp_range_holds(uint64_t base, uint64_t size, uint64_t ptr) {
    return ptr >= base && ptr - base < (size ? size : 1);
}

#endif
