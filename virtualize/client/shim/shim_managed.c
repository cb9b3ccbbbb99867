/* gpupool's libcuda.so.1, part 5: memory both sides touch — managed memory (cuMemAllocManaged) and
 * mapped page-locked host memory (cuMemHostAlloc with DEVICEMAP, cuMemHostGetDevicePointer) — written
 * and read by the program's host code and by its kernels, though the kernels run on another machine.
 *
 * The device side is an ordinary allocation of the lease; the host side is host pages of this process
 * (a mirror). For managed memory and DEVICEMAP allocations the host pages are anonymous memory mapped
 * at the device allocation's own address (this process's window of device addresses reserves it), so
 * a pointer means the same on both sides, as under unified addressing. Page-locked memory the program
 * already holds (cuMemAllocHost, cuMemHostRegister) is mirrored where it is, once the program asks for
 * its device pointer: that pointer is then the device allocation's; pages it shares with other data
 * (the first and last of a registered range need not be its own) are never protected — their bytes
 * are sent before every device work and fetched after each synchronisation. The host view is kept per 64 KiB
 * chunk, in one of three states: DEVICE (no access here: the device copy is the one), CLEAN (readable,
 * equal to the device's) and DIRTY (written here since). A touch of a DEVICE chunk faults (SIGSEGV);
 * the handler fetches the chunk from the worker and makes it readable; a write to a CLEAN chunk faults
 * too and marks it DIRTY. Before each call that makes the GPU work on memory (a launch, a copy, a
 * memset, a graph launch) or waits for it (a synchronise, a query), DIRTY chunks are sent to the worker
 * and every chunk goes back to DEVICE, because a kernel may write them: so what the host wrote before a
 * launch is what the kernel reads, what it wrote before a synchronise reaches a kernel still running
 * (a flag that releases it), and what the kernel wrote is what the host reads after the synchronisation
 * (the fetch is ordered after it). Costs: a launch with mirrored memory in the process costs an mprotect per allocation and
 * one copy per run of written chunks; each chunk the host touches after it costs one round trip and
 * 64 KiB. The device reports no concurrent managed access: between those calls host access while
 * kernels run is not kept coherent (a host loop that polls a flag a kernel sets, calling nothing, waits
 * for ever), as on GPUs without it. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "shim.h"

#define CHUNK (64u << 10)
#define MAX_MANAGED 4096
enum { DEVICE = 0, CLEAN = 1, DIRTY = 2 };

/* The data [base, base + size) is the device's [dev, dev + size); the host pages [lo, lo + mapped) of
 * it (whole pages, the data's own) are kept by page protection, chunk i being [lo + i * CHUNK, ...);
 * the bytes outside them (edges: [base, lo) and [lo + mapped, base + size)) by copies both ways. For
 * memory mapped at its device address lo == base == dev and there are no edges. */
struct managed { uint64_t lo, mapped, base, size, dev; int kind; uint8_t *state; int edges_stale; uint64_t ctx; };
static struct managed managed[MAX_MANAGED];
static int n_managed;
static pthread_mutex_t managed_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sigaction previous;
static int handler_installed;
static __thread int in_managed; /* this thread is moving managed memory: no hook, no recursion */

int gp_managed_count(void) { return __atomic_load_n(&n_managed, __ATOMIC_ACQUIRE); }

/* The mirror whose protected host pages hold addr. */
static struct managed *find(uint64_t addr) {
    for (int i = 0; i < n_managed; i++)
        if (addr - managed[i].lo < managed[i].mapped) return &managed[i];
    return NULL;
}

/* The mirror whose data holds ptr. */
static struct managed *find_data(uint64_t ptr) {
    for (int i = 0; i < n_managed; i++)
        if (ptr - managed[i].base < managed[i].size) return &managed[i];
    return NULL;
}

int gp_managed_lookup(uint64_t ptr) {
    if (!gp_managed_count()) return 0; /* every copy asks: no lock while the process has none */
    pthread_mutex_lock(&managed_lock);
    struct managed *m = find_data(ptr);
    int kind = m ? m->kind : 0;
    pthread_mutex_unlock(&managed_lock);
    return kind;
}

int gp_mirror_device(uint64_t ptr, uint64_t *dev) {
    if (!gp_managed_count()) return 0;
    pthread_mutex_lock(&managed_lock);
    struct managed *m = find_data(ptr);
    if (m && dev) *dev = m->dev + (ptr - m->base);
    pthread_mutex_unlock(&managed_lock);
    return m != NULL;
}

int gp_mirror_of_device(uint64_t ptr) {
    if (!gp_managed_count()) return 0;
    pthread_mutex_lock(&managed_lock);
    int found = 0;
    for (int i = 0; i < n_managed && !found; i++)
        found = managed[i].dev <= ptr && ptr < managed[i].dev + managed[i].size;
    pthread_mutex_unlock(&managed_lock);
    return found;
}

static uint64_t chunks_of(const struct managed *m) { return m->mapped / CHUNK + (m->mapped % CHUNK != 0); }

static uint64_t span_of(const struct managed *m, uint64_t i) {
    return m->mapped - i * CHUNK < CHUNK ? m->mapped - i * CHUNK : CHUNK;
}

/* The data bytes [*from, *to) of chunks [i, j); none when *to <= *from. */
static void data_of(const struct managed *m, uint64_t i, uint64_t j, uint64_t *from, uint64_t *to) {
    uint64_t a = m->lo + i * CHUNK, b = m->lo + j * CHUNK;
    *from = a > m->base ? a : m->base;
    *to = b < m->base + m->size ? b : m->base + m->size;
}

/* The bytes [from, to) of m's data between the host and the device, as the caller asks. */
static CUresult move(struct managed *m, uint64_t from, uint64_t to, int to_device) {
    if (to <= from) return CUDA_SUCCESS;
    in_managed++;
    /* In the context the memory was made in: the thread may have another current one, or none (a host thread
     * that reads the memory, PyTorch's parallel loops among them, which natively need no context at all). */
    int ok, pushed = m->ctx && gp_ctx_current() != m->ctx && gp_ctx_push(m->ctx) == 0;
    CUresult r;
    if (to_device) {
        struct gp_in_cuMemcpyHtoD_v2 in = {.dst = m->dev + (from - m->base), .count = to - from};
        r = gp_call(GP_CALL_cuMemcpyHtoD_v2, 0, &in, sizeof in, (void *)from, to - from, NULL, 0, NULL, 0);
    } else {
        struct gp_in_cuMemcpyDtoH_v2 in = {.src = m->dev + (from - m->base), .count = to - from};
        r = gp_call(GP_CALL_cuMemcpyDtoH_v2, GP_FLAG_WANTS_REPLY, &in, sizeof in, NULL, 0, NULL, 0, (void *)from,
                    to - from);
    }
    if (pushed) gp_ctx_pop(&ok);
    in_managed--;
    return r;
}

/* The edges of m (bytes on pages it shares), one way. */
static void move_edges(struct managed *m, int to_device) {
    if (m->lo == m->base && m->mapped >= m->size) return;
    uint64_t end = m->base + m->size, inner = m->mapped ? m->lo + m->mapped : m->lo;
    move(m, m->base, m->mapped ? m->lo : end, to_device);
    if (m->mapped) move(m, inner, end, to_device);
}

/* The device copy of chunk i into the host pages (made writable for it), then readable only. */
static int fetch(struct managed *m, uint64_t i) {
    void *at = (void *)(m->lo + i * CHUNK);
    uint64_t from, to;
    if (mprotect(at, span_of(m, i), PROT_READ | PROT_WRITE) != 0) return -1;
    data_of(m, i, i + 1, &from, &to);
    CUresult r = move(m, from, to, 0);
    if (r != CUDA_SUCCESS) gp_say("could not fetch mirrored memory at 0x%llx from the worker (%d): it reads as it was",
                                  (unsigned long long)from, r);
    mprotect(at, span_of(m, i), PROT_READ);
    m->state[i] = CLEAN;
    return 0;
}

static void on_fault(int sig, siginfo_t *info, void *context) {
    uint64_t addr = (uint64_t)info->si_addr;
    int saved = errno, handled = 0;
    pthread_mutex_lock(&managed_lock);
    struct managed *m = find(addr);
    if (m) {
        uint64_t i = (addr - m->lo) / CHUNK;
        if (m->state[i] == DEVICE) handled = fetch(m, i) == 0; /* a write faults again, below */
        else if (m->state[i] == CLEAN) {
            handled = mprotect((void *)(m->lo + i * CHUNK), span_of(m, i), PROT_READ | PROT_WRITE) == 0;
            if (handled) m->state[i] = DIRTY;
        }
    }
    pthread_mutex_unlock(&managed_lock);
    errno = saved;
    if (handled) return; /* the access runs again */
    /* Not managed memory: whatever handled SIGSEGV before (Python's faulthandler, the default). */
    if (previous.sa_flags & SA_SIGINFO) {
        if (previous.sa_sigaction) previous.sa_sigaction(sig, info, context);
        return;
    }
    if (previous.sa_handler == SIG_IGN) return;
    if (previous.sa_handler != SIG_DFL) {
        previous.sa_handler(sig);
        return;
    }
    signal(sig, SIG_DFL); /* the access faults again and ends the process as it would have */
}

static int device_work(uint32_t call) {
    switch (call) {
    case GP_CALL_cuLaunchKernelEx: case GP_CALL_cuGraphLaunch: case GP_CALL_cuLaunchCooperativeKernelMultiDevice:
    case GP_CALL_cuMemcpyHtoD_v2: case GP_CALL_cuMemcpyHtoDAsync_v2: case GP_CALL_cuMemcpyDtoH_v2:
    case GP_CALL_cuMemcpyDtoHAsync_v2: case GP_CALL_cuMemcpyDtoD_v2: case GP_CALL_cuMemcpyDtoDAsync_v2:
    case GP_CALL_cuMemcpyPeer: case GP_CALL_cuMemcpyPeerAsync: case GP_CALL_cuFabricCpyBatchAsync:
    case GP_CALL_cuMemsetD8_v2: case GP_CALL_cuMemsetD16_v2: case GP_CALL_cuMemsetD32_v2:
    case GP_CALL_cuMemsetD8Async: case GP_CALL_cuMemsetD16Async: case GP_CALL_cuMemsetD32Async:
        return 1;
    default:
        return 0;
    }
}

/* Calls that wait for the device or ask how far it got. Natively the host's stores to mapped memory reach
 * a running kernel at once (XLA's timer releases its delay kernel by a host store, then synchronises on
 * its stop event) and the kernel's stores reach the host: here the host's writes go to the worker before
 * such a call, and the host view is the device's again after it. */
static int waits_for_device(uint32_t call) {
    switch (call) {
    case GP_CALL_cuCtxSynchronize: case GP_CALL_cuCtxSynchronize_v2: case GP_CALL_cuStreamSynchronize:
    case GP_CALL_cuStreamQuery: case GP_CALL_cuEventSynchronize: case GP_CALL_cuEventQuery:
        return 1;
    default:
        return 0;
    }
}

/* Before `call` makes the GPU work on memory, or waits for it: written chunks to the worker, then every
 * chunk back to DEVICE. Nothing when the process has no managed memory. */
void gp_managed_before(uint32_t call) {
    if (in_managed || !gp_managed_count() || !(device_work(call) || waits_for_device(call))) return;
    in_managed++;
    pthread_mutex_lock(&managed_lock);
    for (int k = 0; k < n_managed; k++) {
        struct managed *m = &managed[k];
        uint64_t chunks = chunks_of(m), any = 0;
        for (uint64_t i = 0; i < chunks;) {
            if (m->state[i] != DIRTY) {
                any |= m->state[i] != DEVICE;
                i++;
                continue;
            }
            uint64_t j = i;
            while (j < chunks && m->state[j] == DIRTY) j++;
            uint64_t from, to;
            data_of(m, i, j, &from, &to);
            move(m, from, to, 1);
            any = 1;
            i = j;
        }
        if (any) {
            mprotect((void *)m->lo, m->mapped, PROT_NONE);
            memset(m->state, DEVICE, chunks);
        }
        if (m->kind == GP_MIRROR_HOST && !m->edges_stale) {
            move_edges(m, 1);
            m->edges_stale = 1;
        }
    }
    pthread_mutex_unlock(&managed_lock);
    in_managed--;
}

/* After a call that can tell the program that device work is done (a synchronise, a query that
 * succeeds): the edges of registered memory get the device's bytes, as its pages would on a touch. */
void gp_managed_after(uint32_t call, CUresult r) {
    if (r != CUDA_SUCCESS || in_managed || !gp_managed_count()) return;
    if (!waits_for_device(call) && call != GP_CALL_cuMemcpyDtoH_v2) return;
    in_managed++;
    pthread_mutex_lock(&managed_lock);
    for (int k = 0; k < n_managed; k++) {
        if (!managed[k].edges_stale) continue;
        move_edges(&managed[k], 0);
        managed[k].edges_stale = 0;
    }
    pthread_mutex_unlock(&managed_lock);
    in_managed--;
}

static void install_handler(void) {
    if (handler_installed) return;
    struct sigaction sa = {0};
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    handler_installed = sigaction(SIGSEGV, &sa, &previous) == 0;
}

/* A mirror of m's kind, unless the table is full or its pages are another mirror's (two registrations
 * sharing a page could not be told apart when it faults). */
static int insert(struct managed m) {
    m.ctx = gp_ctx_current(); /* where its device side was made: moves run there (move) */
    pthread_mutex_lock(&managed_lock);
    int rc = n_managed < MAX_MANAGED ? 0 : -1;
    for (int k = 0; rc == 0 && k < n_managed; k++)
        if (m.lo < managed[k].lo + managed[k].mapped && managed[k].lo < m.lo + m.mapped) rc = -1;
    if (rc == 0) {
        managed[n_managed] = m;
        __atomic_store_n(&n_managed, n_managed + 1, __ATOMIC_RELEASE);
        install_handler();
    }
    pthread_mutex_unlock(&managed_lock);
    return rc;
}

/* Memory at `base` mirrored at its device address (an allocation of the lease in this process's
 * window: managed memory, GP_MIRROR_MANAGED, or a DEVICEMAP host allocation,
 * GP_MIRROR_MAPPED): host pages mapped over the
 * window's reservation there, zero on both sides. */
int gp_managed_add(uint64_t base, uint64_t size, int kind) {
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), mapped = (size + page - 1) / page * page;
    uint64_t chunks = mapped / CHUNK + (mapped % CHUNK != 0);
    uint8_t *state = malloc(chunks ? chunks : 1);
    if (!state) return -1;
    memset(state, CLEAN, chunks);
    void *p = mmap((void *)base, mapped, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (p == MAP_FAILED) {
        free(state);
        return -1;
    }
    if (insert((struct managed){base, mapped, base, size, base, kind, state, 0, 0}) != 0) {
        mmap(p, mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
        free(state);
        return -1;
    }
    gp_hints_clear(base, size);
    return 0;
}

/* Managed memory the device side already holds data of (a library's managed variable, as its image set
 * it): mirrored at its device address, the host's first touch fetches it. */
int gp_managed_add_initialised(uint64_t base, uint64_t size) {
    if (gp_managed_add(base, size, GP_MIRROR_MANAGED) != 0) return -1;
    pthread_mutex_lock(&managed_lock);
    for (int k = 0; k < n_managed; k++) {
        if (managed[k].base != base) continue;
        mprotect((void *)managed[k].lo, managed[k].mapped, PROT_NONE);
        memset(managed[k].state, DEVICE, chunks_of(&managed[k]));
    }
    pthread_mutex_unlock(&managed_lock);
    return 0;
}

/* Page-locked memory the program holds at [base, base + size), mirrored by the device allocation at
 * dev (GP_MIRROR_HOST): the host's bytes are the ones until the next device work sends them. Only the
 * pages wholly inside it are protected. */
int gp_mirror_host(uint64_t base, uint64_t size, uint64_t dev) {
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), lo = (base + page - 1) / page * page;
    uint64_t hi = (base + size) / page * page, mapped = hi > lo ? hi - lo : 0;
    uint64_t chunks = mapped / CHUNK + (mapped % CHUNK != 0);
    uint8_t *state = malloc(chunks ? chunks : 1);
    if (!state) return -1;
    memset(state, DIRTY, chunks);
    if (insert((struct managed){mapped ? lo : base, mapped, base, size, dev, GP_MIRROR_HOST, state, 0, 0}) != 0) {
        free(state);
        return -1;
    }
    return 0;
}

/* The end of the mirror at `base` whose memory is being freed: nothing fetched, its pages writable
 * again for whoever unmaps them. */
void gp_managed_forget(uint64_t base) {
    pthread_mutex_lock(&managed_lock);
    for (int i = 0; i < n_managed; i++) {
        struct managed *m = &managed[i];
        if (m->base != base) continue;
        if (m->mapped) mprotect((void *)m->lo, m->mapped, PROT_READ | PROT_WRITE);
        free(m->state);
        managed[i] = managed[n_managed - 1];
        __atomic_store_n(&n_managed, n_managed - 1, __ATOMIC_RELEASE);
        break;
    }
    pthread_mutex_unlock(&managed_lock);
}

/* The end of the mirror at `base` (its data's start). Memory the program keeps (GP_MIRROR_HOST) gets the
 * device's bytes back and its pages their access; the others' pages go back to being the window's
 * reservation. Returns the mirror's device address, or 0 when there is none. */
uint64_t gp_managed_remove(uint64_t base) {
    pthread_mutex_lock(&managed_lock);
    uint64_t dev = 0;
    for (int i = 0; i < n_managed; i++) {
        struct managed *m = &managed[i];
        if (m->base != base) continue;
        dev = m->dev;
        if (m->kind == GP_MIRROR_HOST) {
            for (uint64_t k = 0; k < chunks_of(m); k++)
                if (m->state[k] == DEVICE) fetch(m, k);
            if (m->edges_stale) move_edges(m, 0);
            if (m->mapped) mprotect((void *)m->lo, m->mapped, PROT_READ | PROT_WRITE);
        } else {
            mmap((void *)base, m->mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
        }
        free(m->state);
        managed[i] = managed[n_managed - 1];
        __atomic_store_n(&n_managed, n_managed - 1, __ATOMIC_RELEASE);
        break;
    }
    pthread_mutex_unlock(&managed_lock);
    return dev;
}

/* ---- where managed memory is (cuMemGetLocationInfo) ---------------------------------------------- */

/* A sample's location: the host's pages where the host read or wrote its chunk since the last device
 * work (CLEAN, DIRTY: the mirror holds the data), else the device allocation's (DEVICE, and the edges,
 * which are copied both ways). */
static int on_host(const struct managed *m, uint64_t addr) {
    return addr >= m->lo && addr - m->lo < m->mapped && m->state[(addr - m->lo) / CHUNK] != DEVICE;
}

/* Managed memory of this process only: the device side of the lease's other memory is an ordinary
 * allocation of the worker, and the program's pageable memory is on its own machine, which the lease's
 * devices cannot reach (no pageable memory access), so both are CUDA_ERROR_INVALID_VALUE, as the driver
 * answers for memory that is neither. Each summary region gets its most common sampled location (a tie:
 * the device); a sampling granularity of 0 samples each 64 KiB chunk. */
CUresult cuMemGetLocationInfo(uint64_t ptr, uint64_t size, uint64_t summary, uint64_t sampling, void *location_out) {
    GP_TRACE("cuMemGetLocationInfo");
    if (!location_out || !size || !summary || summary > size || sampling > summary) return CUDA_ERROR_INVALID_VALUE;
    if (ptr + size < ptr) return CUDA_ERROR_INVALID_VALUE;
    int device = 0;
    gp_ctx_device(gp_ctx_current(), &device);
    uint64_t step = sampling ? sampling : CHUNK;
    pthread_mutex_lock(&managed_lock);
    struct managed *m = find_data(ptr);
    if (!m || m->kind != GP_MIRROR_MANAGED || size > m->size - (ptr - m->base)) {
        pthread_mutex_unlock(&managed_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    int32_t *out = location_out; /* CUmemLocation: the type, then the id */
    for (uint64_t region = 0, at = ptr; at < ptr + size; region++, at += summary) {
        uint64_t end = size - (at - ptr) < summary ? ptr + size : at + summary, host = 0, samples = 0;
        for (uint64_t a = at; a < end; a += step, samples++) host += on_host(m, a);
        int h = host * 2 > samples;
        out[2 * region] = h ? 2 : 1; /* CU_MEM_LOCATION_TYPE_HOST or _DEVICE */
        out[2 * region + 1] = h ? 0 : device;
    }
    pthread_mutex_unlock(&managed_lock);
    return CUDA_SUCCESS;
}
