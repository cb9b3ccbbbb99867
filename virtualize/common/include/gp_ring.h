/* The command ring (issue 31): a connection's two byte streams through memory both ends map, for a
 * process and a worker on one host. The same bytes the socket would carry (frames to the worker, answers
 * to the client) go through two single-writer, single-reader byte rings instead, so everything a
 * connection sends keeps its one order by construction; the socket stays open beside them only to carry
 * file descriptors (gpShmAttach's, gpPinnedShare's) and to tell either end that the other is gone.
 *
 * A reader with nothing to read spins `spin_ns`, then sleeps on a futex in the shared page (the writer
 * wakes it after publishing, only when it says it sleeps); asleep, it looks at the socket every
 * GP_RING_CHECK_NS, and a peer that has closed it (killed, exited) ends the wait. A writer without room
 * waits the same way. One source for both ends: the shim (virtualize/client/shim/shim.c) and the worker's
 * native loop (virtualize/server/native/dispatch.c) include this header. */
#ifndef GP_RING_H
#define GP_RING_H

#include <errno.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define GP_RING_MAGIC 0x676e6972u /* "ring" */
#define GP_RING_HEADER 4096u       /* the page of positions and futexes, then each direction's bytes */
#define GP_RING_CHECK_NS 20000000L /* asleep: how often the socket is looked at for a peer that is gone */
#define GP_RING_PAUSE_NS 5000u     /* spinning: how long before each turn yields the CPU */

/* One direction: positions count bytes ever written and read (never wrap), each on its own cache line. */
struct gp_ring_dir {
    _Alignas(64) uint64_t head; /* bytes written: the writer's */
    uint32_t data;              /* bumped after each write: the futex a reader sleeps on */
    uint32_t reader_asleep;
    _Alignas(64) uint64_t tail; /* bytes read: the reader's */
    uint32_t space;             /* bumped after each read: the futex a writer waiting for room sleeps on */
    uint32_t writer_asleep;
};

struct gp_ring_page {
    uint32_t magic, bytes; /* each direction's bytes: a power of two */
    struct gp_ring_dir to_worker, to_client;
};
_Static_assert(sizeof(struct gp_ring_page) <= GP_RING_HEADER, "the ring's header fits its page");

/* One end's view: the direction it reads, the one it writes, the connection's socket. */
struct gp_ring_end {
    struct gp_ring_page *page;
    struct gp_ring_dir *in, *out;
    uint8_t *in_data, *out_data;
    uint64_t bytes, spin_ns;
    int fd;
};

static inline uint64_t gp_ring_bytes_total(uint32_t bytes) { return GP_RING_HEADER + 2 * (uint64_t)bytes; }

/* `map`: gp_ring_bytes_total(bytes) of shared memory (zeroed, when `create`). `worker`: which end. */
static inline int gp_ring_open(struct gp_ring_end *e, void *map, uint32_t bytes, int worker, int create, int fd) {
    struct gp_ring_page *page = map;
    if (!bytes || (bytes & (bytes - 1))) return -1;
    if (create) page->magic = GP_RING_MAGIC, page->bytes = bytes;
    else if (page->magic != GP_RING_MAGIC || page->bytes != bytes) return -1;
    uint8_t *to_worker = (uint8_t *)map + GP_RING_HEADER, *to_client = to_worker + bytes;
    e->page = page;
    e->in = worker ? &page->to_worker : &page->to_client;
    e->out = worker ? &page->to_client : &page->to_worker;
    e->in_data = worker ? to_worker : to_client;
    e->out_data = worker ? to_client : to_worker;
    e->bytes = bytes;
    e->fd = fd;
    return 0;
}

static inline void gp_ring_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline uint64_t gp_ring_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* The other end has closed the socket (its process ended): nothing more will come or be read. */
static inline int gp_ring_peer_gone(int fd) {
    struct pollfd p = {fd, POLLRDHUP, 0};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* Until *pos leaves `seen` (the other end moved): 0, or -1 when the peer is gone. */
static inline int gp_ring_wait(const struct gp_ring_end *e, uint64_t *pos, uint64_t seen, uint32_t *word,
                               uint32_t *asleep) {
    uint64_t until = 0;
    for (;;) {
        if (__atomic_load_n(pos, __ATOMIC_ACQUIRE) != seen) return 0;
        if (e->spin_ns) {
            uint64_t now = gp_ring_now();
            if (!until) until = now + e->spin_ns;
            if (now < until) { /* pause for a few µs, then give the CPU away at each turn: where the two
                                * ends share one CPU the other end runs (and answers) sooner */
                if (until - now + GP_RING_PAUSE_NS > e->spin_ns) gp_ring_relax();
                else sched_yield();
                continue;
            }
        }
        /* Said asleep before looking again, the writer after publishing looks whether to wake: one of
         * the two sees the other (both sequentially consistent), so no wake-up is lost. */
        uint32_t w = __atomic_load_n(word, __ATOMIC_SEQ_CST);
        __atomic_store_n(asleep, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(pos, __ATOMIC_SEQ_CST) == seen) {
            struct timespec limit = {0, GP_RING_CHECK_NS};
            syscall(SYS_futex, word, FUTEX_WAIT, w, &limit, NULL, 0);
        }
        __atomic_store_n(asleep, 0, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(pos, __ATOMIC_ACQUIRE) != seen) return 0;
        if (gp_ring_peer_gone(e->fd)) return -1;
    }
}

/* After moving a position: bump the futex word, and wake the other end if it sleeps on it. */
static inline void gp_ring_wake(uint32_t *word, uint32_t *asleep) {
    __atomic_add_fetch(word, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(asleep, __ATOMIC_SEQ_CST) && __atomic_exchange_n(asleep, 0, __ATOMIC_SEQ_CST))
        syscall(SYS_futex, word, FUTEX_WAKE, 1, NULL, NULL, 0); /* once per sleep: it says asleep again */
}

/* Both positions are in memory the other end can write: every length is taken from one reading of them
 * and checked, so a peer that scribbles on them breaks its own stream, never a copy's bounds. */
static inline int gp_ring_broken(const struct gp_ring_end *e, uint64_t head, uint64_t tail) {
    if (head - tail <= e->bytes) return 0;
    errno = EPROTO;
    return 1;
}

/* Like recv(2): up to `n` bytes, waiting for at least one unless `nowait` (then -1, errno EAGAIN); 0 once
 * the peer is gone and nothing is left to read; -1 (errno EPROTO) when the positions make no sense. */
static inline long gp_ring_recv(const struct gp_ring_end *e, void *buf, size_t n, int nowait) {
    struct gp_ring_dir *d = e->in;
    uint64_t tail = __atomic_load_n(&d->tail, __ATOMIC_RELAXED), head = __atomic_load_n(&d->head, __ATOMIC_ACQUIRE);
    if (head == tail) {
        if (nowait) {
            errno = EAGAIN;
            return -1;
        }
        if (gp_ring_wait(e, &d->head, tail, &d->data, &d->reader_asleep) < 0) return 0;
        head = __atomic_load_n(&d->head, __ATOMIC_ACQUIRE);
    }
    if (gp_ring_broken(e, head, tail)) return -1;
    uint64_t take = head - tail < n ? head - tail : n, at = tail & (e->bytes - 1);
    uint64_t first = e->bytes - at < take ? e->bytes - at : take;
    memcpy(buf, e->in_data + at, first);
    memcpy((uint8_t *)buf + first, e->in_data, take - first);
    __atomic_store_n(&d->tail, tail + take, __ATOMIC_SEQ_CST);
    gp_ring_wake(&d->space, &d->writer_asleep);
    return (long)take;
}

/* Every byte of the pieces written, in order, each published as soon as it is in (one wake-up where
 * they fit at once): 0, or -1 (errno EPIPE) when the peer is gone, EPROTO when the positions make no sense. */
static inline int gp_ring_sendv(const struct gp_ring_end *e, const struct iovec *iov, int n) {
    struct gp_ring_dir *d = e->out;
    uint64_t head = __atomic_load_n(&d->head, __ATOMIC_RELAXED), published = head;
    for (int i = 0; i < n; i++) {
        const uint8_t *p = iov[i].iov_base;
        size_t left = iov[i].iov_len;
        while (left) {
            uint64_t tail = __atomic_load_n(&d->tail, __ATOMIC_ACQUIRE);
            if (gp_ring_broken(e, head, tail)) return -1;
            if (head - tail == e->bytes) { /* full: what is written goes first, then wait for room */
                if (published != head) {
                    __atomic_store_n(&d->head, head, __ATOMIC_SEQ_CST);
                    gp_ring_wake(&d->data, &d->reader_asleep);
                    published = head;
                }
                if (gp_ring_wait(e, &d->tail, tail, &d->space, &d->writer_asleep) < 0) {
                    errno = EPIPE;
                    return -1;
                }
                continue;
            }
            uint64_t room = e->bytes - (head - tail), put = left < room ? left : room, at = head & (e->bytes - 1);
            uint64_t first = e->bytes - at < put ? e->bytes - at : put;
            memcpy(e->out_data + at, p, first);
            memcpy(e->out_data, p + first, put - first);
            head += put, p += put, left -= put;
        }
    }
    if (published != head) {
        __atomic_store_n(&d->head, head, __ATOMIC_SEQ_CST);
        gp_ring_wake(&d->data, &d->reader_asleep);
    }
    return 0;
}

static inline int gp_ring_send(const struct gp_ring_end *e, const void *p, size_t n) {
    struct iovec one = {(void *)p, n};
    return gp_ring_sendv(e, &one, 1);
}

#endif
