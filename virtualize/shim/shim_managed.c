/* gpupool's libcuda.so.1, part 5: managed memory (cuMemAllocManaged) — one address, written and read
 * by the program's host code and by its kernels, though the kernels run on another machine.
 *
 * The device side is an ordinary allocation of the lease, in this process's window of device
 * addresses; the host side is anonymous memory mapped at the same address here (the window reserves
 * it), so a pointer means the same on both sides. The host view is kept per 64 KiB chunk, in one of
 * three states: DEVICE (no access here: the device copy is the one), CLEAN (readable, equal to the
 * device's) and DIRTY (written here since). A touch of a DEVICE chunk faults (SIGSEGV); the handler
 * fetches the chunk from the worker and makes it readable; a write to a CLEAN chunk faults too and
 * marks it DIRTY. Before each call that makes the GPU work on memory (a launch, a copy, a memset, a
 * graph launch), DIRTY chunks are sent to the worker and every chunk goes back to DEVICE, because the
 * kernel may write them: so what the host wrote before a launch is what the kernel reads, and what the
 * kernel wrote is what the host reads after the synchronisation (the fetch is ordered after it).
 * Costs: a launch with managed memory in the process costs an mprotect per allocation and one copy per
 * run of written chunks; each chunk the host touches after it costs one round trip and 64 KiB.
 * The device reports no concurrent managed access (host access while kernels run is not kept
 * coherent, as on GPUs without it: a program synchronises first). */
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

struct managed { uint64_t base, size, mapped; uint8_t *state; };
static struct managed managed[MAX_MANAGED];
static int n_managed;
static pthread_mutex_t managed_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sigaction previous;
static int handler_installed;
static __thread int in_managed; /* this thread is moving managed memory: no hook, no recursion */

int gp_managed_count(void) { return __atomic_load_n(&n_managed, __ATOMIC_ACQUIRE); }

static struct managed *find(uint64_t addr) {
    for (int i = 0; i < n_managed; i++)
        if (addr - managed[i].base < managed[i].mapped) return &managed[i];
    return NULL;
}

int gp_managed_lookup(uint64_t ptr) {
    if (!gp_managed_count()) return 0; /* every copy asks: no lock while the process has none */
    pthread_mutex_lock(&managed_lock);
    int found = find(ptr) != NULL;
    pthread_mutex_unlock(&managed_lock);
    return found;
}

static uint64_t chunk_bytes(const struct managed *m, uint64_t i) {
    uint64_t at = i * CHUNK;
    return at >= m->size ? 0 : (m->size - at < CHUNK ? m->size - at : CHUNK);
}

/* The device copy of chunk i into the host pages (made writable for it), then readable only. */
static int fetch(struct managed *m, uint64_t i) {
    void *at = (void *)(m->base + i * CHUNK);
    uint64_t span = m->mapped - i * CHUNK < CHUNK ? m->mapped - i * CHUNK : CHUNK;
    if (mprotect(at, span, PROT_READ | PROT_WRITE) != 0) return -1;
    uint64_t n = chunk_bytes(m, i);
    struct gp_in_cuMemcpyDtoH_v2 in = {.src = m->base + i * CHUNK, .count = n};
    in_managed++;
    CUresult r = n ? gp_call(GP_CALL_cuMemcpyDtoH_v2, GP_FLAG_WANTS_REPLY, &in, sizeof in, NULL, 0, NULL, 0, at, n)
                   : CUDA_SUCCESS;
    in_managed--;
    if (r != CUDA_SUCCESS) gp_say("could not fetch managed memory at 0x%llx from the worker (%d): it reads as it was",
                                  (unsigned long long)(m->base + i * CHUNK), r);
    mprotect(at, span, PROT_READ);
    m->state[i] = CLEAN;
    return 0;
}

static void on_fault(int sig, siginfo_t *info, void *context) {
    uint64_t addr = (uint64_t)info->si_addr;
    int saved = errno, handled = 0;
    pthread_mutex_lock(&managed_lock);
    struct managed *m = find(addr);
    if (m) {
        uint64_t i = (addr - m->base) / CHUNK;
        if (m->state[i] == DEVICE) handled = fetch(m, i) == 0; /* a write faults again, below */
        else if (m->state[i] == CLEAN) {
            uint64_t span = m->mapped - i * CHUNK < CHUNK ? m->mapped - i * CHUNK : CHUNK;
            handled = mprotect((void *)(m->base + i * CHUNK), span, PROT_READ | PROT_WRITE) == 0;
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
    case GP_CALL_cuLaunchKernelEx: case GP_CALL_cuGraphLaunch:
    case GP_CALL_cuMemcpyHtoD_v2: case GP_CALL_cuMemcpyHtoDAsync_v2: case GP_CALL_cuMemcpyDtoH_v2:
    case GP_CALL_cuMemcpyDtoHAsync_v2: case GP_CALL_cuMemcpyDtoD_v2: case GP_CALL_cuMemcpyDtoDAsync_v2:
    case GP_CALL_cuMemcpyPeer: case GP_CALL_cuMemcpyPeerAsync:
    case GP_CALL_cuMemsetD8_v2: case GP_CALL_cuMemsetD16_v2: case GP_CALL_cuMemsetD32_v2:
    case GP_CALL_cuMemsetD8Async: case GP_CALL_cuMemsetD16Async: case GP_CALL_cuMemsetD32Async:
        return 1;
    default:
        return 0;
    }
}

/* Before `call` makes the GPU work on memory: written chunks to the worker, then every chunk back to
 * DEVICE. Nothing when the process has no managed memory. */
void gp_managed_before(uint32_t call) {
    if (in_managed || !gp_managed_count() || !device_work(call)) return;
    in_managed++;
    pthread_mutex_lock(&managed_lock);
    for (int k = 0; k < n_managed; k++) {
        struct managed *m = &managed[k];
        uint64_t chunks = m->mapped / CHUNK + (m->mapped % CHUNK != 0), any = 0;
        for (uint64_t i = 0; i < chunks;) {
            if (m->state[i] != DIRTY) {
                any |= m->state[i] != DEVICE;
                i++;
                continue;
            }
            uint64_t j = i;
            while (j < chunks && m->state[j] == DIRTY) j++;
            uint64_t from = i * CHUNK, to = j * CHUNK < m->size ? j * CHUNK : m->size;
            if (to > from) {
                struct gp_in_cuMemcpyHtoD_v2 in = {.dst = m->base + from, .count = to - from};
                gp_call(GP_CALL_cuMemcpyHtoD_v2, 0, &in, sizeof in, (void *)(m->base + from), to - from, NULL, 0,
                        NULL, 0);
            }
            any = 1;
            i = j;
        }
        if (any) {
            mprotect((void *)m->base, m->mapped, PROT_NONE);
            memset(m->state, DEVICE, chunks);
        }
    }
    pthread_mutex_unlock(&managed_lock);
    in_managed--;
}

/* A managed allocation at `base` (an allocation of the lease in this process's window): host pages
 * mapped over the window's reservation there, zero on both sides. */
int gp_managed_add(uint64_t base, uint64_t size) {
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
    pthread_mutex_lock(&managed_lock);
    int rc = -1;
    if (n_managed < MAX_MANAGED) {
        managed[n_managed] = (struct managed){base, size, mapped, state};
        __atomic_store_n(&n_managed, n_managed + 1, __ATOMIC_RELEASE);
        rc = 0;
        if (!handler_installed) {
            struct sigaction sa = {0};
            sa.sa_sigaction = on_fault;
            sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
            sigemptyset(&sa.sa_mask);
            handler_installed = sigaction(SIGSEGV, &sa, &previous) == 0;
        }
    }
    pthread_mutex_unlock(&managed_lock);
    if (rc != 0) {
        mmap(p, mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
        free(state);
    }
    return rc;
}

/* cuMemFree of a managed allocation: its host pages go back to being the window's reservation. */
int gp_managed_remove(uint64_t base) {
    pthread_mutex_lock(&managed_lock);
    int found = -1;
    for (int i = 0; i < n_managed; i++) {
        if (managed[i].base != base) continue;
        mmap((void *)base, managed[i].mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
        free(managed[i].state);
        managed[i] = managed[n_managed - 1];
        __atomic_store_n(&n_managed, n_managed - 1, __ATOMIC_RELEASE);
        found = 0;
        break;
    }
    pthread_mutex_unlock(&managed_lock);
    return found;
}
