/* gpupool's libcuda.so.1, part 1: the connection to the lease's worker, the client-side tables.
 *
 * One TCP connection per process (TCP_NODELAY, keep-alive), opened at the first forwarded call and
 * guarded by one mutex. Calls that want no reply are written and forgotten; the worker keeps their
 * first error and reports it at the next synchronising call. When the connection breaks, every later
 * call fails with CUDA_ERROR_DEVICE_UNAVAILABLE and the shim says once on stderr what happened. With a
 * worker on this host and GPUPOOL_SHIM_RING=1, the connection's bytes go through the command ring
 * instead (ring_attach_locked; the socket stays for descriptors and to notice the worker gone). */
#define _GNU_SOURCE
#include "shim.h"
#include "../../common/include/gp_ranges.h"
#include "../../common/include/gp_ring.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

int gp_trace_enabled;

void gp_say(const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "gpupool: %s\n", line);
    fflush(stderr);
}

void gp_trace(const char *name) { fprintf(stderr, "gpupool: call %s\n", name); }

/* ---- the connection ---------------------------------------------------------------------------- */

static pthread_mutex_t conn_lock = PTHREAD_MUTEX_INITIALIZER;
/* The process connection's socket has one writer at a time: a thread sending there holds this (taken under
 * conn_lock, so what is sent keeps the calls' order), and the flusher sends held frames holding only this. */
static pthread_mutex_t wire_lock = PTHREAD_MUTEX_INITIALIZER;
/* A connection to the worker: the process's own (every call), or the callback thread's (host functions
 * the worker calls back, shim_streams.c). The I/O below works on the calling thread's connection. */
struct gp_conn {
    int fd;
    void *ssl;              /* the TLS session when the connection leaves this host (shim_auth.c) */
    unsigned char *joined;  /* a frame's small pieces joined into one TLS record (send_tls) */
};
static struct gp_conn main_conn = {-1, NULL, NULL};
static __thread struct gp_conn *thread_conn;
static struct gp_conn *conn(void) { return thread_conn ? thread_conn : &main_conn; }
/* The process's connection's command ring, once it went over to it (ring_attach_locked): its bytes
 * both ways; NULL on the socket. Only main_conn has one. */
static struct gp_ring_end *conn_ring;
static struct gp_ring_end ring_end;
static struct gp_ring_end *ring_of(void) { return thread_conn ? NULL : conn_ring; }
static void ring_drop(void);
#define conn_fd (conn()->fd)
#define conn_ssl (conn()->ssl)
static CUresult conn_failure; /* sticky: once set, every call returns it */
static int conn_local;        /* the process's connection is the worker's Unix socket (same host) */
static uint64_t conn_ctx;     /* the context the worker's thread has current */
static char conn_where[300];
/* This process's own worker (GPUPOOL_ISOLATE: the lease's worker answered gpProcessStart MOVED_TO one started for
 * it): where this process's connections go. The environment keeps naming the lease's worker, so the processes
 * this one starts ask it for workers of their own. Empty: the environment's worker. */
static char own_where[257], own_local[129], own_tls[73];

static int window_state; /* gp_window_ensure: 0 not asked yet, 1 reserved, -1 none to be had */
static void callbacks_after_fork_in_child(void);
static void shm_after_fork_in_child(void);
static void lanes_after_fork_in_child(void);
static void held_after_fork_in_child(void);

static int context_hint_said; /* shared_context_hint: once a process */

static void after_fork_in_child(void) {
    /* The child must not share the parent's stream of frames; it opens its own on first use. */
    context_hint_said = 0;
    if (main_conn.fd >= 0) close(main_conn.fd);
    main_conn.fd = -1;
    ring_drop(); /* the parent's ring: its worker connection's bytes, not ours */
    main_conn.ssl = NULL; /* the parent's session: not ours to use or to end */
    callbacks_after_fork_in_child();
    lanes_after_fork_in_child();
    held_after_fork_in_child();
    conn_ctx = 0;
    pthread_mutex_init(&conn_lock, NULL);
    pthread_mutex_init(&wire_lock, NULL);
    gp_memo_after_fork_in_child();
    gp_events_after_fork_in_child();
    window_state = 0; /* the child's connection is a new client process to the worker: its own window */
    own_where[0] = own_local[0] = own_tls[0] = 0; /* a new process: it asks the lease's worker for its own */
    shm_after_fork_in_child();
    gp_pinned_after_fork_in_child();
}

/* ---- the profile (GPUPOOL_SHIM_PROFILE=1): per forwarded call, how often and how long ----------- */

static int profile_enabled;
static uint64_t profile_lane_copies, profile_lane_bytes; /* copies striped across the lanes (below) */
static int profile_lanes;
/* copies through the memory shared with a worker on this host (below): how many, their bytes, the time
 * this process spent copying bytes into or out of it and waiting for the worker's answers */
static uint64_t profile_shm_copies, profile_shm_bytes, profile_shm_copy_ns, profile_shm_wait_ns;
static int shm_state; /* 0 not asked yet, 1 attached, -1 none: every copy through the socket */
/* the process connection's frames, and the sends (system calls, TLS writes) that took them to the worker */
static uint64_t profile_frames, profile_sends;
/* `slow`, `slow_ns`: the calls that took 1 ms or more, apart, so that a few long waits (a first
 * compilation, a synchronise) are told from a call that is slow each time */
enum { PROFILE_SLOW_NS = 1000000 };
static struct {
    uint64_t calls, waited, ns, bytes_out, bytes_in, slow, slow_ns;
} profile[GP_N_CALLS];

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void profile_note(uint32_t call, uint32_t flags, uint64_t ns, uint64_t out, uint64_t in) {
    if (call >= GP_N_CALLS) return;
    __atomic_fetch_add(&profile[call].calls, 1, __ATOMIC_RELAXED);
    if (flags & GP_FLAG_WANTS_REPLY) __atomic_fetch_add(&profile[call].waited, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&profile[call].ns, ns, __ATOMIC_RELAXED);
    __atomic_fetch_add(&profile[call].bytes_out, out, __ATOMIC_RELAXED);
    __atomic_fetch_add(&profile[call].bytes_in, in, __ATOMIC_RELAXED);
    if (ns >= PROFILE_SLOW_NS) {
        __atomic_fetch_add(&profile[call].slow, 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&profile[call].slow_ns, ns, __ATOMIC_RELAXED);
    }
}

static long coalesce_ns(void);

static void profile_print(void) {
    /* Sorted by time spent, the calls that cost this process the most first. */
    uint32_t order[GP_N_CALLS], n = 0;
    uint64_t total_ns = 0, total_calls = 0, total_waited = 0;
    for (uint32_t i = 0; i < GP_N_CALLS; i++) {
        if (!profile[i].calls && !gp_memo_kept(i)) continue;
        order[n++] = i;
        total_ns += profile[i].ns;
        total_calls += profile[i].calls;
        total_waited += profile[i].waited;
    }
    for (uint32_t i = 1; i < n; i++)
        for (uint32_t j = i; j > 0 && profile[order[j]].ns > profile[order[j - 1]].ns; j--) {
            uint32_t t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    fprintf(stderr,
            "gpupool: profile of pid %d: %llu forwarded calls (%llu waited for the worker), %.3f s inside them\n"
            "gpupool: %-44s %10s %10s %11s %9s %12s %12s %10s %8s %11s %13s\n",
            (int)getpid(), (unsigned long long)total_calls, (unsigned long long)total_waited, total_ns / 1e9,
            "call", "calls", "waited", "total ms", "mean us", "bytes sent", "bytes recv", "kept", ">=1 ms",
            "their ms", "others' mean");
    for (uint32_t k = 0; k < n; k++) {
        uint32_t i = order[k];
        uint64_t quick = profile[i].calls - profile[i].slow;
        fprintf(stderr, "gpupool: %-44s %10llu %10llu %11.1f %9.1f %12llu %12llu %10llu %8llu %11.1f %10.1f us\n",
                gp_call_names[i], (unsigned long long)profile[i].calls, (unsigned long long)profile[i].waited,
                profile[i].ns / 1e6, profile[i].calls ? profile[i].ns / 1e3 / (double)profile[i].calls : 0.0,
                (unsigned long long)profile[i].bytes_out, (unsigned long long)profile[i].bytes_in,
                (unsigned long long)(gp_memo_kept(i) + gp_idle_kept(i)), (unsigned long long)profile[i].slow, profile[i].slow_ns / 1e6,
                quick ? (profile[i].ns - profile[i].slow_ns) / 1e3 / (double)quick : 0.0);
    }
    if (profile_lane_copies)
        fprintf(stderr, "gpupool: %llu of these copies (%.1f MiB) went in pieces across %d connections at once\n",
                (unsigned long long)profile_lane_copies, profile_lane_bytes / 1048576.0, profile_lanes);
    if (profile_shm_copies)
        fprintf(stderr,
                "gpupool: %llu of these copies (%.1f MiB) went through memory shared with the worker: %.1f ms "
                "copying their bytes here, %.1f ms waiting for the worker\n",
                (unsigned long long)profile_shm_copies, profile_shm_bytes / 1048576.0, profile_shm_copy_ns / 1e6,
                profile_shm_wait_ns / 1e6);
    else if (shm_state < 0)
        fprintf(stderr, "gpupool: no memory shared with the worker: every copy went through the socket\n");
    if (conn_ring)
        fprintf(stderr, "gpupool: the connection's frames and answers went through the command ring (memory "
                        "shared with the worker)\n");
    else if (profile_frames)
        fprintf(stderr, "gpupool: the connection's %llu frames went to the worker in %llu sends (those that want no "
                "answer held up to %ld us to go together: GPUPOOL_SHIM_COALESCE_US)\n",
                (unsigned long long)profile_frames, (unsigned long long)profile_sends, coalesce_ns() / 1000);
    gp_memo_print_outcomes();
    fflush(stderr);
}

static void held_flush_at_exit(void);

__attribute__((constructor)) static void shim_init(void) {
    const char *trace = getenv(GP_ENV_TRACE);
    gp_trace_enabled = trace && *trace && strcmp(trace, "0") != 0;
    const char *prof = getenv(GP_ENV_PROFILE);
    profile_enabled = prof && *prof && strcmp(prof, "0") != 0;
    if (profile_enabled) atexit(profile_print);
    atexit(held_flush_at_exit);
    pthread_atfork(NULL, NULL, after_fork_in_child);
}

static size_t n_held; /* bytes of unanswered frames not sent yet (held_append_locked, below) */
/* Events whose record is among those frames (record_is_held_locked, below); -1: more than fit */
enum { HELD_RECORDS = 64 };
static uint64_t held_records[HELD_RECORDS];
static int n_held_records;
static void held_none(void) { /* what was held is sent, or is no one's any more (under conn_lock) */
    n_held = 0;
    n_held_records = 0;
}
static CUresult fail(CUresult code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The connection's TLS session ended and its socket closed; the process connection's not while the flusher
 * is sending on it. */
static void conn_close_fd(void) {
    int main = conn() == &main_conn;
    if (main) pthread_mutex_lock(&wire_lock);
    gp_tls_free(conn_ssl);
    conn_ssl = NULL;
    if (conn_fd >= 0) close(conn_fd);
    conn_fd = -1;
    if (main) pthread_mutex_unlock(&wire_lock);
}

static CUresult fail(CUresult code, const char *fmt, ...) {
    char line[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (!conn_failure) gp_say("%s", line);
    conn_failure = code;
    if (!thread_conn) {
        ring_drop();
        held_none(); /* frames held for a connection that is gone */
    }
    conn_close_fd();
    return code;
}

static CUresult lost(const char *what) {
    gp_idle_frame(GP_N_CALLS, 0); /* nothing is answered as done here any more */
    return fail(CUDA_ERROR_DEVICE_UNAVAILABLE,
                "lost the connection to the lease's worker at %s (%s): the remote GPU is gone, CUDA calls "
                "fail from now on (check the lease with `gpuattach leases`, then run again)",
                conn_where, what);
}

/* ---- unanswered frames, held a moment and sent together ---------------------------------------------
 * Each frame was one send(): over TLS also one record, 7.6 µs a launch in the shim where the driver's own
 * launch costs ~3 (a ResNet-50 step's 825 launches on an H200, bench/RESULTS.md); on a plain socket 8-10 µs
 * a launch where the worker sleeps between a framework's calls (each send wakes it: CuPy's own suites,
 * bench_remote's eager loop). Frames that want no answer (launches, copies to the device, memsets, records)
 * now wait in `held` for at most GPUPOOL_SHIM_COALESCE_US (default 30; 0: never) and go in one send (one
 * record) with the frames after them: at once with the next frame that wants an answer (a synchronise, a
 * query), when 16 KiB are held, or when the time is up (the flusher thread) — so a program that launches and
 * then only waits on the host, or on another process, has its work at the worker within that time. Under
 * conn_lock; the main connection only, and not its command ring (a write there wakes nobody that spins). */
/* Every byte of the pieces on a plain socket: 0, or -1 (errno) when the connection is broken. */
static int send_plain(int fd, struct iovec *iov, int n) {
    while (n > 0) {
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t sent = sendmsg(fd, &msg, MSG_NOSIGNAL);
        if (sent < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        while (n > 0 && (size_t)sent >= iov->iov_len) {
            sent -= (ssize_t)iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + sent;
            iov->iov_len -= (size_t)sent;
        }
    }
    return 0;
}

enum { HOLD_MAX = 16 << 10 };
static unsigned char *held;
static uint64_t held_since; /* when the first frame held now was */
static long hold_ns = -1;
static int flusher_running;
static pthread_cond_t held_cond = PTHREAD_COND_INITIALIZER;

static long coalesce_ns(void) {
    if (hold_ns < 0) {
        const char *env = getenv("GPUPOOL_SHIM_COALESCE_US");
        long us = env && *env ? atol(env) : 30;
        hold_ns = us > 0 ? (us < 10000 ? us : 10000) * 1000 : 0;
    }
    return hold_ns;
}

static int held_flush_locked(void) {
    if (!n_held) return 0;
    size_t n = n_held;
    held_none();
    profile_sends++;
    struct iovec all = {held, n};
    pthread_mutex_lock(&wire_lock);
    int r = main_conn.ssl ? gp_tls_write(main_conn.ssl, held, n) : send_plain(main_conn.fd, &all, 1);
    pthread_mutex_unlock(&wire_lock);
    return r;
}

/* The flusher's send of what is held: the buffer handed over and sent holding wire_lock alone, so that the
 * program's calls go on holding frames (into the other buffer) meanwhile instead of waiting for the send —
 * which wakes the worker, several µs (CuPy's launches on an H200), more over TLS. A TLS session is never
 * used by two threads at once all the same: every send holds wire_lock, and a reply is read only under
 * conn_lock right after the reader's own send, while the flusher needs conn_lock to begin one. */
static unsigned char *spare;
static int held_flush_aside_locked(void) {
    if (!spare && !(spare = malloc(HOLD_MAX))) return held_flush_locked();
    unsigned char *sending = held;
    struct iovec all = {sending, n_held};
    held = spare, spare = NULL;
    held_none();
    profile_sends++;
    int fd = main_conn.fd;
    void *ssl = main_conn.ssl;
    pthread_mutex_lock(&wire_lock); /* taken before conn_lock is let go: nothing sent later goes first */
    pthread_mutex_unlock(&conn_lock);
    int r = ssl ? gp_tls_write(ssl, sending, all.iov_len) : send_plain(fd, &all, 1), saved = errno;
    pthread_mutex_unlock(&wire_lock);
    pthread_mutex_lock(&conn_lock);
    spare = sending;
    errno = saved;
    return r;
}

static CUresult lost(const char *what);

/* The flusher stays awake, looking every hold time, for FLUSHER_LINGER_NS after the last frame it sent, and
 * only then waits to be told of a first frame: a program sending frames steadily (a framework's launches a
 * few µs apart) never pays a wake-up of it in its own calls — that was 4 µs of each batch's first frame. */
enum { FLUSHER_LINGER_NS = 2000000 };
static int flusher_parked; /* the flusher waits on held_cond: the next first frame wakes it (under conn_lock) */

static void sleep_unlocked(uint64_t ns) {
    struct timespec wait = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
    pthread_mutex_unlock(&conn_lock);
    nanosleep(&wait, NULL);
    pthread_mutex_lock(&conn_lock);
}

static void *flusher(void *arg) {
    (void)arg;
    prctl(PR_SET_TIMERSLACK, 1000UL); /* its sleeps are tens of µs: the default 50 µs of slack would double them */
    pthread_mutex_lock(&conn_lock);
    uint64_t last_sent = now_ns();
    for (;;) {
        if (!n_held) {
            if (now_ns() - last_sent < FLUSHER_LINGER_NS) {
                sleep_unlocked((uint64_t)hold_ns);
                continue;
            }
            flusher_parked = 1;
            while (!n_held) pthread_cond_wait(&held_cond, &conn_lock);
            flusher_parked = 0;
        }
        uint64_t due = held_since + (uint64_t)hold_ns, now = now_ns();
        if (now < due) {
            sleep_unlocked(due - now);
            continue;
        }
        if (held_flush_aside_locked() < 0) lost(strerror(errno));
        last_sent = now_ns();
    }
    return NULL;
}

static void held_after_fork_in_child(void) { /* the parent's frames, and its flusher: not the child's */
    held_none();
    flusher_running = flusher_parked = 0;
    pthread_cond_init(&held_cond, NULL);
}

/* Held (1) to go with later frames, or 0 where it is not for holding: sent at once then, after what is held. */
static int held_append_locked(struct iovec *iov, int n, size_t total, int hold) {
    if (conn() != &main_conn || !coalesce_ns() || (!hold && !n_held)) return 0;
    if (n_held + total > HOLD_MAX && held_flush_locked() < 0) return -1;
    if (total > HOLD_MAX || (!held && !(held = malloc(HOLD_MAX)))) return held_flush_locked() < 0 ? -1 : 0;
    int first = !n_held;
    if (first) held_since = now_ns();
    for (int i = 0; i < n; i++) {
        memcpy(held + n_held, iov[i].iov_base, iov[i].iov_len);
        n_held += iov[i].iov_len;
    }
    if (!hold) return held_flush_locked() < 0 ? -1 : 1; /* this frame with everything before it: one record */
    if (!flusher_running) {
        pthread_t thread;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        flusher_running = pthread_create(&thread, &attr, flusher, NULL) == 0;
        pthread_attr_destroy(&attr);
        if (!flusher_running) return held_flush_locked() < 0 ? -1 : 1; /* no thread: nothing is held */
    }
    if (first && flusher_parked) pthread_cond_signal(&held_cond); /* it sleeps until told of a first frame */
    return 1;
}

/* ---- a query of an event whose record is still held here ----------------------------------------------
 * That record has not reached the worker, so the GPU cannot have completed it: the query is NOT_READY, as
 * the driver answers for work still queued, with no round trip, and what is held goes at once, since the
 * program now waits for it. CuPy's pinned-memory pool queries each event right after recording it (5,400
 * round trips of 71 µs in the Lanczos tests, bench/RESULTS.md). Only for a record held behind other frames
 * (work sent within the hold time, which natively would still be running too): a record on an idle stream
 * the driver may report done at once, so that query still asks. Never while a capture is open (a query
 * there is the worker's to refuse), nor for an interprocess event (its record is never held). */
static void record_held_locked(uint64_t event) { /* a record just appended: held, unless n_held is 0 */
    if (!n_held || n_held_records < 0 || conn() != &main_conn) return;
    if (n_held_records == HELD_RECORDS) n_held_records = -1; /* too many to follow: queries ask the worker */
    else held_records[n_held_records++] = event;
}

static void record_forget_locked(uint64_t event) { /* destroyed: its query is the worker's to refuse */
    for (int i = 0; i < n_held_records; i++)
        if (held_records[i] == event) held_records[i--] = held_records[--n_held_records];
}

static int record_is_held_locked(uint64_t event) {
    if (!n_held) return 0;
    for (int i = 0; i < n_held_records; i++)
        if (held_records[i] == event) return 1;
    return 0;
}

/* At the program's exit: what is held still goes (work whose effects the program never waited for, as the
 * driver would still run it), unless another thread is in a call (then nothing can be said of its frames). */
static void held_flush_at_exit(void) {
    if (pthread_mutex_trylock(&conn_lock) != 0) return;
    held_flush_locked();
    pthread_mutex_unlock(&conn_lock);
}

static int send_tls(struct iovec *iov, int n, size_t total) {
    /* A frame's small pieces go as one TLS record; large bulk goes as it is. Each connection has its
     * own buffer for joining: the copy lanes send on theirs at the same time. */
    enum { JOINED = 64 << 10 };
    struct gp_conn *c = conn();
    if (total <= JOINED && (c->joined || (c->joined = malloc(JOINED)))) {
        size_t at = 0;
        for (int i = 0; i < n; i++) {
            memcpy(c->joined + at, iov[i].iov_base, iov[i].iov_len);
            at += iov[i].iov_len;
        }
        return gp_tls_write(conn_ssl, c->joined, total);
    }
    return gp_tls_writev(conn_ssl, iov, n);
}

static int send_iov(struct iovec *iov, int n, int hold) {
    if (ring_of()) return gp_ring_sendv(ring_of(), iov, n);
    size_t total = 0;
    for (int i = 0; i < n; i++) total += iov[i].iov_len;
    int kept = held_append_locked(iov, n, total, hold);
    if (kept) return kept < 0 ? -1 : 0;
    if (conn() != &main_conn) return conn_ssl ? send_tls(iov, n, total) : send_plain(conn_fd, iov, n);
    profile_sends++;
    pthread_mutex_lock(&wire_lock);
    int r = conn_ssl ? send_tls(iov, n, total) : send_plain(conn_fd, iov, n);
    pthread_mutex_unlock(&wire_lock);
    return r;
}

/* A file descriptor the worker sent with a reply (gpShmAttach's), taken by whoever asked for it. */
static int received_fd = -1;

/* recv on a plain socket, keeping a descriptor that comes with the bytes (recv would drop it). */
static ssize_t recv_plain(void *p, size_t want, int flags) {
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } control;
    struct iovec iov = {p, want};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                         .msg_controllen = sizeof control.buf};
    ssize_t got = recvmsg(conn_fd, &msg, flags | MSG_CMSG_CLOEXEC);
    for (struct cmsghdr *c = got > 0 ? CMSG_FIRSTHDR(&msg) : NULL; c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(sizeof(int))) {
            int fd;
            memcpy(&fd, CMSG_DATA(c), sizeof fd);
            if (received_fd >= 0) close(received_fd);
            received_fd = fd;
        }
    }
    return got;
}

static int recv_all(void *buf, uint64_t len) {
    char *p = buf;
    while (len > 0) {
        size_t want = len > (1u << 30) ? (1u << 30) : (size_t)len;
        ssize_t got = ring_of() ? gp_ring_recv(ring_of(), p, want, 0)
                      : conn_ssl ? gp_tls_read(conn_ssl, p, want)
                                 : recv_plain(p, want, 0);
        if (got == 0) {
            errno = ECONNRESET;
            return -1;
        }
        if (got < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += got;
        len -= (uint64_t)got;
    }
    return 0;
}

/* A reply's header: polled for a few microseconds before the thread sleeps in recv, or in SSL_read over
 * TLS (a worker answering a synchronise or a query replies within microseconds, and a sleeping thread
 * takes about as long again to wake). GPUPOOL_SHIM_SPIN_US: how long (0: never); by default 40 µs
 * where there are 4 CPUs or more, else never (there polling takes the CPU the worker needs). */
static long spin_ns = -1;

static long shim_spin_ns(void) {
    if (spin_ns < 0) {
        const char *env = getenv("GPUPOOL_SHIM_SPIN_US");
        spin_ns = env ? atol(env) * 1000 : sysconf(_SC_NPROCESSORS_ONLN) >= 4 ? 40000 : 0;
        if (spin_ns < 0) spin_ns = 0;
    }
    return spin_ns;
}

/* Over TLS: until the answer's first bytes are on the socket, or OpenSSL holds some already (then
 * SSL_read has what it needs, or the rest of a record that is arriving), for at most spin_ns. Without
 * this the thread slept in SSL_read at every answer: 25 µs a synchronise over loopback TLS against 8 µs
 * on the local socket (H200, bench/RESULTS.md). */
static void tls_poll(void) {
    uint64_t until = 0;
    for (;;) {
        char c;
        if (gp_tls_holds(conn_ssl)) return;
        ssize_t got = recv(conn_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (got >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return; /* SSL_read says */
        uint64_t now = now_ns();
        if (!until) until = now + (uint64_t)spin_ns;
        else if (now >= until) return;
    }
}

static int recv_header(void *buf, uint64_t len) {
    shim_spin_ns();
    if (spin_ns <= 0 || ring_of()) return recv_all(buf, len); /* a ring spins in gp_ring_recv */
    if (conn_ssl) {
        tls_poll();
        return recv_all(buf, len);
    }
    uint64_t until = 0;
    for (;;) {
        ssize_t got = recv_plain(buf, len, MSG_DONTWAIT);
        if (got > 0) return (uint64_t)got == len ? 0 : recv_all((char *)buf + got, len - (uint64_t)got);
        if (got == 0) {
            errno = ECONNRESET;
            return -1;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -1;
        uint64_t now = now_ns();
        if (!until) until = now + (uint64_t)spin_ns;
        else if (now >= until) return recv_all(buf, len);
    }
}

static int discard(uint64_t len) {
    char scratch[16384];
    while (len > 0) {
        uint64_t n = len < sizeof scratch ? len : sizeof scratch;
        if (recv_all(scratch, n) < 0) return -1;
        len -= n;
    }
    return 0;
}

/* The last frame sent on the process's connection: when the lease moved to another server's worker, the
 * old one answers it MOVED without running it, and it goes to the new one again (its arguments and bulk are
 * still the caller's, which waits for the reply). */
static struct {
    uint32_t call, flags, args_len;
    const void *args, *b1, *b2;
    uint64_t b1_len, b2_len;
} last_frame;

static int send_frame(uint32_t call, uint32_t flags, const void *args, uint32_t args_len, const void *b1,
                      uint64_t b1_len, const void *b2, uint64_t b2_len) {
    if (conn() == &main_conn) {
        profile_frames++;
        last_frame.call = call, last_frame.flags = flags, last_frame.args = args, last_frame.args_len = args_len;
        last_frame.b1 = b1, last_frame.b1_len = b1_len, last_frame.b2 = b2, last_frame.b2_len = b2_len;
    }
    gp_idle_frame(call, flags); /* work the worker may still be doing (shim_idle.c) */
    struct gp_request hdr = {call, flags & ~GP_FLAG_SEND_NOW, args_len, 0, b1_len + b2_len};
    struct iovec iov[4];
    int n = 0;
    iov[n++] = (struct iovec){&hdr, sizeof hdr};
    if (args_len) iov[n++] = (struct iovec){(void *)args, args_len};
    if (b1_len) iov[n++] = (struct iovec){(void *)b1, b1_len};
    if (b2_len) iov[n++] = (struct iovec){(void *)b2, b2_len};
    return send_iov(iov, n, !(flags & (GP_FLAG_WANTS_REPLY | GP_FLAG_SEND_NOW)));
}

/* Reads one reply; returns its result, or -1 on a broken connection. */
/* What a kernel printed, sent ahead of a reply: onto this process's stdout, as the driver would write it. */
static int kernel_output(uint64_t len) {
    char chunk[16384];
    while (len > 0) {
        size_t n = len < sizeof chunk ? (size_t)len : sizeof chunk;
        if (recv_all(chunk, n) < 0) return -1;
        for (size_t done = 0; done < n;) {
            ssize_t w = write(STDOUT_FILENO, chunk + done, n - done);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) break; /* stdout closed: the text is dropped, the call goes on */
            done += (size_t)w;
        }
        len -= n;
    }
    return 0;
}

static void copies_wait(uint64_t need);
static int land_copy(const struct gp_reply *rep, int counted);

/* Where the lease moved (virtualize/common/_wire.py MOVED_TO): the token this process resumes with there, the
 * new worker's host:port, its local socket name and its certificate's SHA-256, each NUL-padded. */
struct gp_moved_to {
    uint64_t token;
    char where[256], local[128], tls[72];
} __attribute__((packed));
_Static_assert(sizeof(struct gp_moved_to) == GP_MOVED_TO_BYTES, "MOVED_TO");
static int moved_to(const struct gp_moved_to *to);
static int lanes_state; /* 0 not tried, n > 0 lanes open, -1 none (under conn_lock) */
static void lanes_close_locked(void);
static void lanes_open_locked(void);
static int callbacks_reattach_locked(void);

static int recv_reply(int32_t *result, void *outs, uint32_t outs_len, void *bulk_out, uint64_t bulk_out_len) {
    struct gp_reply rep;
    if (recv_header(&rep, sizeof rep) < 0) return -1;
    for (;;) {
        if (rep.result == GP_KERNEL_OUTPUT && rep.outs_len == 0) {
            fflush(stdout); /* what the program printf'ed before the synchronise comes first */
            if (kernel_output(rep.bulk_len) < 0) return -1;
        } else if (rep.result == GP_COPIES_SENT && rep.outs_len == sizeof(uint64_t) && rep.bulk_len == 0) {
            /* Copies the worker finished before this reply: in place before the reply is read (it may
             * say they are done, or carry newer bytes for the same buffer). */
            uint64_t need;
            if (recv_all(&need, sizeof need) < 0) return -1;
            copies_wait(need);
        } else if (rep.result == GP_COPY_DATA) { /* a copy sent here while a host function runs */
            if (land_copy(&rep, 0) < 0) return -1;
        } else if (rep.result == GP_MOVED && rep.outs_len == sizeof(struct gp_moved_to) && conn() == &main_conn) {
            /* The lease moved to another server's worker: this frame did not run; it goes there. */
            struct gp_moved_to to;
            if (recv_all(&to, sizeof to) < 0 || discard(rep.bulk_len) < 0 || moved_to(&to) < 0) return -1;
        } else {
            break;
        }
        if (recv_all(&rep, sizeof rep) < 0) return -1;
    }
    uint32_t take = rep.outs_len < outs_len ? rep.outs_len : outs_len;
    if (take && recv_all(outs, take) < 0) return -1;
    if (discard(rep.outs_len - take) < 0) return -1;
    uint64_t btake = rep.bulk_len < bulk_out_len ? rep.bulk_len : bulk_out_len;
    if (btake && recv_all(bulk_out, btake) < 0) return -1;
    if (discard(rep.bulk_len - btake) < 0) return -1;
    *result = rep.result;
    return 0;
}

static int is_loopback(const struct sockaddr *addr) {
    static const unsigned char v6_loopback[16] = {[15] = 1};
    static const unsigned char v4_mapped[12] = {[10] = 0xff, [11] = 0xff};
    if (addr->sa_family == AF_INET) return (ntohl(((const struct sockaddr_in *)addr)->sin_addr.s_addr) >> 24) == 127;
    if (addr->sa_family != AF_INET6) return 0;
    const unsigned char *a = ((const struct sockaddr_in6 *)addr)->sin6_addr.s6_addr;
    return memcmp(a, v6_loopback, 16) == 0 || (memcmp(a, v4_mapped, 12) == 0 && a[12] == 127);
}

/* Is `addr` one of this host's own addresses (the pool server may advertise its LAN address to a
 * client on the GPU server itself)? */
static int is_this_host(const struct sockaddr *addr) {
    if (is_loopback(addr)) return 1;
    struct ifaddrs *all = NULL;
    if (getifaddrs(&all) != 0) return 0;
    int found = 0;
    for (struct ifaddrs *i = all; i && !found; i = i->ifa_next) {
        const struct sockaddr *a = i->ifa_addr;
        if (!a || a->sa_family != addr->sa_family) continue;
        if (a->sa_family == AF_INET)
            found = ((const struct sockaddr_in *)a)->sin_addr.s_addr == ((const struct sockaddr_in *)addr)->sin_addr.s_addr;
        else if (a->sa_family == AF_INET6)
            found = memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)addr)->sin6_addr,
                           16) == 0;
    }
    freeifaddrs(all);
    return found;
}

/* The worker's Unix socket in the abstract namespace, when it runs on this host: no TCP stack (about
 * twice the bulk rate of loopback TCP), and the bytes never leave the kernel, so nothing to encrypt.
 * -1 where there is none or it cannot be reached (another network namespace): TCP then. */
static int connect_local(const char *name) {
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    size_t len = strlen(name);
    if (!len || len + 1 > sizeof sun.sun_path) return -1;
    memcpy(sun.sun_path + 1, name, len); /* sun_path[0] = 0: the abstract namespace */
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (connect(fd, (struct sockaddr *)&sun, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + len)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static CUresult handshake(const char *secret);

/* A run spread over several leases (gpuattach run --spread): the process whose LOCAL_RANK (torchrun,
 * accelerate; OMPI_COMM_WORLD_LOCAL_RANK under Open MPI) is r talks to lease r's worker, named by the
 * lease variables with the suffix _r; a process that is no rank uses lease 0's, which have none. */
static char rank_suffix[24];

static const char *lease_getenv(const char *name) {
    if (!rank_suffix[0]) return getenv(name);
    char key[128];
    snprintf(key, sizeof key, "%s%s", name, rank_suffix);
    return getenv(key);
}

static CUresult pick_rank_lease(void) {
    const char *ranks = getenv(GP_ENV_RANKS);
    const char *rank = getenv("LOCAL_RANK");
    if (!rank || !*rank) rank = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    rank_suffix[0] = 0;
    if (!ranks || !*ranks || !rank || !*rank) return CUDA_SUCCESS;
    char *end;
    long n = strtol(ranks, NULL, 10), r = strtol(rank, &end, 10);
    if (*end || r < 0 || r >= n)
        return fail(CUDA_ERROR_NO_DEVICE,
                    "this process's local rank is %s but the run holds %ld leases, one per rank (gpuattach run "
                    "--spread -n %ld): start as many ranks per node as -n",
                    rank, n, n);
    snprintf(rank_suffix, sizeof rank_suffix, "_%ld", r);
    return CUDA_SUCCESS;
}

/* Where gpuattach says the lease's worker has been (GPUPOOL_WORKER_FILE: one block of `worker HOST:PORT`, `local
 * NAME`, `tls SHA256` lines per worker, the first the lease had first, the one it has now last), taken into this
 * process's environment when the environment names an earlier one: a process started after the lease moved to
 * another server's worker, with the old worker's address in its environment, connects to the new one. A worker
 * the file does not list yet (this process, or the one that started it, was told MOVED before gpuattach heard
 * of the move) is newer than the file: it is kept. So the file never sends a process back. */
static void lease_setenv(const char *name, const char *value);

static void lease_location_read(void) {
    const char *path = lease_getenv(GP_ENV_WORKER_FILE), *now = lease_getenv(GP_ENV_WORKER);
    FILE *f = path && *path && now ? fopen(path, "re") : NULL;
    if (!f) return;
    char line[512], worker[512] = "", local[512] = "", tls[512] = "";
    int blocks = 0, listed_at = -1;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (strncmp(line, "worker ", 7) == 0) {
            snprintf(worker, sizeof worker, "%s", line + 7);
            local[0] = tls[0] = 0;
            if (strcmp(worker, now) == 0) listed_at = blocks;
            blocks++;
        } else if (strncmp(line, "local ", 6) == 0) {
            snprintf(local, sizeof local, "%s", line + 6);
        } else if (strncmp(line, "tls ", 4) == 0) {
            snprintf(tls, sizeof tls, "%s", line + 4);
        }
    }
    fclose(f);
    if (listed_at < 0 || listed_at == blocks - 1) return; /* newer than the file, or where the lease is now */
    lease_setenv(GP_ENV_WORKER, worker);
    lease_setenv(GP_ENV_LOCAL, local);
    lease_setenv(GP_ENV_TLS, tls);
}

static CUresult connect_worker(void) {
    CUresult picked = pick_rank_lease();
    if (picked != CUDA_SUCCESS) return picked;
    if (!own_where[0]) lease_location_read();
    const char *where = own_where[0] ? own_where : lease_getenv(GP_ENV_WORKER);
    const char *secret = lease_getenv(GP_ENV_SECRET);
    if (!where || !*where || !secret) {
        return fail(CUDA_ERROR_NO_DEVICE,
                    "no GPU lease for this process: this libcuda.so.1 is gpupool's remote-execution shim and "
                    "%s is not set; run the program under `gpuattach run -- ...`",
                    GP_ENV_WORKER);
    }
    const char *lease = lease_getenv(GP_ENV_LEASE);
    if (lease && *lease) snprintf(conn_where, sizeof conn_where, "%s (lease %s)", where, lease);
    else snprintf(conn_where, sizeof conn_where, "%s", where);
    char host[256];
    const char *colon = strrchr(where, ':');
    if (!colon || colon == where || (size_t)(colon - where) >= sizeof host) {
        return fail(CUDA_ERROR_NO_DEVICE, "%s=%s is not HOST:PORT", GP_ENV_WORKER, where);
    }
    memcpy(host, where, (size_t)(colon - where));
    host[colon - where] = 0;
    if (host[0] == '[' && host[strlen(host) - 1] == ']') {
        memmove(host, host + 1, strlen(host));
        host[strlen(host) - 1] = 0;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int rc = getaddrinfo(host, colon + 1, &hints, &res);
    if (rc != 0) return fail(CUDA_ERROR_NO_DEVICE, "cannot resolve the lease's worker %s: %s", where, gai_strerror(rc));
    int fd = -1;
    int err = 0;
    int loopback = 0;
    const char *pin = own_where[0] ? own_tls : lease_getenv(GP_ENV_TLS), *policy = getenv(GP_ENV_ENCRYPT);
    const char *local = own_where[0] ? own_local : lease_getenv(GP_ENV_LOCAL);
    int always_encrypt = policy && strcmp(policy, "always") == 0;
    if (local && *local && !always_encrypt) {
        for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next)
            if (is_this_host(ai->ai_addr)) fd = connect_local(local);
    }
    if (fd >= 0) {
        freeaddrinfo(res);
        conn_fd = fd;
        conn_ctx = 0;
        conn_ssl = NULL;
        conn_local = 1;
        return handshake(secret);
    }
    conn_local = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        loopback = is_loopback(ai->ai_addr);
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) continue;
        /* Connect with a deadline: a firewalled worker must not hang the program. */
        int fl = fcntl(fd, F_GETFL);
        fcntl(fd, F_SETFL, fl | O_NONBLOCK);
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 || errno == EINPROGRESS) {
            struct pollfd pfd = {fd, POLLOUT, 0};
            socklen_t len = sizeof err;
            if (poll(&pfd, 1, 10000) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) {
                fcntl(fd, F_SETFL, fl);
                break;
            }
            if (!err) err = ETIMEDOUT;
        } else {
            err = errno;
        }
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        return fail(CUDA_ERROR_DEVICE_UNAVAILABLE,
                    "cannot reach the lease's worker at %s (%s): the lease may have ended", conn_where, strerror(err));
    }
    int one = 1, idle = 10, interval = 5, count = 3;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
    conn_fd = fd;
    conn_ctx = 0;
    conn_ssl = NULL;
    /* Encrypted unless the worker is on this host (loopback never leaves it), or always when asked. */
    int encrypt = !loopback || always_encrypt;
    if (encrypt && !(pin && *pin)) {
        return fail(CUDA_ERROR_NOT_PERMITTED,
                    "the lease's worker at %s offers no encryption and the connection would leave this host "
                    "unencrypted: refused (is the GPU server's gpupool older than this one, or %s not set?)",
                    conn_where, GP_ENV_TLS);
    }
    if (encrypt) {
        struct timeval limit = {10, 0}, none = {0, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
        char why[300];
        conn_ssl = gp_tls_connect(fd, pin, why, sizeof why);
        if (!conn_ssl) return fail(CUDA_ERROR_NOT_PERMITTED, "the lease's worker at %s refused: %s", conn_where, why);
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof none);
    }
    return handshake(secret);
}

/* The handshake of virtualize/common/_wire.py: the secret never crosses the wire. */
static CUresult handshake(const char *secret) {
    if (!gp_auth_ready()) {
        return fail(CUDA_ERROR_NOT_INITIALIZED,
                    "cannot load the system's OpenSSL (libcrypto.so.3 or .so.1.1), which the connection to the "
                    "lease's worker needs to prove the lease secret: install OpenSSL (e.g. apt-get install libssl3)");
    }
    unsigned char nonce_c[GP_NONCE_BYTES], answer[GP_NONCE_BYTES + GP_PROOF_BYTES], expect[GP_PROOF_BYTES];
    unsigned char mine[GP_PROOF_BYTES];
    if (gp_auth_nonce(nonce_c, sizeof nonce_c) < 0) return fail(CUDA_ERROR_NOT_INITIALIZED, "no random bytes: %s", strerror(errno));
    struct gp_in_gpHello hello = {.version = GP_PROTOCOL_VERSION};
    int32_t result;
    if (send_frame(GP_CALL_gpHello, GP_FLAG_WANTS_REPLY, &hello, sizeof hello, nonce_c, sizeof nonce_c, NULL, 0) < 0 ||
        recv_reply(&result, NULL, 0, answer, sizeof answer) < 0) {
        return lost(strerror(errno));
    }
    if (result != 0) {
        return fail(CUDA_ERROR_NOT_PERMITTED, "the lease's worker at %s refused this process: it speaks another protocol "
                    "version (update gpupool on this machine or on the GPU server)", conn_where);
    }
    const unsigned char *nonce_w = answer, *theirs = answer + GP_NONCE_BYTES;
    if (gp_auth_proof(secret, GP_WORKER_LABEL, nonce_c, nonce_w, expect) < 0 ||
        !gp_auth_equal(expect, theirs, GP_PROOF_BYTES)) {
        return fail(CUDA_ERROR_NOT_PERMITTED,
                    "the lease's worker at %s refused this process: the two do not share the lease's secret (%s "
                    "is not this lease's: run the program under `gpuattach run`; or something else listens there)",
                    conn_where, GP_ENV_SECRET);
    }
    struct gp_out_gpProve proved;
    if (gp_auth_proof(secret, GP_CLIENT_LABEL, nonce_w, nonce_c, mine) < 0)
        return fail(CUDA_ERROR_NOT_INITIALIZED, "OpenSSL could not compute the lease proof");
    if (send_frame(GP_CALL_gpProve, GP_FLAG_WANTS_REPLY, NULL, 0, mine, sizeof mine, NULL, 0) < 0 ||
        recv_reply(&result, &proved, sizeof proved, NULL, 0) < 0) {
        return lost(strerror(errno));
    }
    if (result != 0) {
        return fail(CUDA_ERROR_NOT_PERMITTED,
                    "the lease's worker at %s refused this process: wrong lease secret (%s does not belong to "
                    "this lease; run the program under `gpuattach run`)", conn_where, GP_ENV_SECRET);
    }
    return CUDA_SUCCESS;
}

/* ---- the command ring (issue 31): a worker on this host, GPUPOOL_SHIM_RING=1 ----------------------
 * Right after the handshake the process's connection asks for it (gpRingAttach, on the socket); from its
 * answer on, every byte of the connection both ways goes through memory both map (gp_ring.h), so a
 * synchronising call's round trip is two cache-line hand-overs, not four system calls and two wake-ups.
 * The socket stays: descriptors come on it (take_fd) and its end tells either side the other is gone.
 * Where the worker cannot (its native library not built), the connection stays on the socket. */
static void ring_drop(void) {
    if (conn_ring) munmap(conn_ring->page, gp_ring_bytes_total((uint32_t)conn_ring->bytes));
    conn_ring = NULL;
}

static int ring_wanted(void) {
    const char *env = getenv("GPUPOOL_SHIM_RING");
    return env && *env && strcmp(env, "0") != 0;
}

/* The errors after which a CUDA context is unusable (a kernel's fault): ILLEGAL_ADDRESS, LAUNCH_TIMEOUT, ASSERT,
 * HARDWARE_STACK_ERROR, ILLEGAL_INSTRUCTION, MISALIGNED_ADDRESS, INVALID_ADDRESS_SPACE, INVALID_PC, LAUNCH_FAILED. */
static int is_context_fault(CUresult r) { return r == 700 || r == 702 || r == 710 || (r >= 714 && r <= 719); }

/* Without --isolate the lease's processes share one context on the GPU server, so a kernel fault in one is
 * every one's from then on, where natively it is only the faulting process's: said once, with the way out. */
static void shared_context_hint(CUresult r) {
    if (gp_isolated() || __atomic_exchange_n(&context_hint_said, 1, __ATOMIC_RELAXED)) return;
    gp_say("CUDA error %d ends the context this lease's processes share on the GPU server: every process of the run "
           "gets it from now on, where natively only the faulting one would; `gpuattach run --isolate` gives each "
           "process a context of its own (docs/remote.md, \"Isolation\")", (int)r);
}

/* GPUPOOL_ISOLATE=1 (gpuattach run --isolate): this process runs in a worker process of its own, so a fault of
 * its kernels (a device-side assert) ends its own context only, as natively (virtualize/server/_process_workers.py). */
int gp_isolated(void) {
    const char *env = getenv("GPUPOOL_ISOLATE");
    return env && *env && strcmp(env, "0") != 0;
}

/* The process's first frame (under conn_lock): served where it is, or MOVED_TO its own worker, which recv_reply
 * follows (moved_to keeps that worker as this process's own). A worker of an older gpupool does not know the call:
 * the process shares the lease's worker, as it would have. */
static void process_start_locked(void) {
    uint32_t flags = 1; /* _process_workers.ISOLATE */
    int32_t result;
    if (send_frame(GP_CALL_gpProcessStart, GP_FLAG_WANTS_REPLY, &flags, sizeof flags, NULL, 0, NULL, 0) < 0 ||
        recv_reply(&result, NULL, 0, NULL, 0) < 0) {
        lost(strerror(errno));
        return;
    }
    if (gp_trace_enabled) gp_say("gpProcessStart: %d, this process's worker %s", result, own_where[0] ? own_where : "the lease's");
}

static void ring_attach_locked(void) {
    struct gp_out_gpRingAttach out;
    int32_t result;
    if (send_frame(GP_CALL_gpRingAttach, GP_FLAG_WANTS_REPLY, NULL, 0, NULL, 0, NULL, 0) < 0 ||
        recv_reply(&result, &out, sizeof out, NULL, 0) < 0) {
        lost(strerror(errno));
        return;
    }
    int fd = received_fd;
    received_fd = -1;
    if (result != CUDA_SUCCESS || fd < 0 || !out.size || out.size > (1u << 30)) {
        if (fd >= 0) close(fd);
        if (result == CUDA_SUCCESS) lost("the worker's command ring came without its memory");
        else gp_say("GPUPOOL_SHIM_RING is set but the lease's worker offers no command ring (its native library is "
                    "not built): this process's connection stays on the socket");
        return; /* refused: the socket, as before */
    }
    void *map = mmap(NULL, gp_ring_bytes_total((uint32_t)out.size), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                     fd, 0);
    close(fd);
    /* The worker reads its ring from now on: a ring this process cannot map ends the connection. */
    if (map == MAP_FAILED || gp_ring_open(&ring_end, map, (uint32_t)out.size, 0, 0, conn_fd) < 0) {
        if (map != MAP_FAILED) munmap(map, gp_ring_bytes_total((uint32_t)out.size));
        lost("the worker's command ring could not be mapped");
        return;
    }
    ring_end.spin_ns = (uint64_t)shim_spin_ns();
    conn_ring = &ring_end;
}

/* The descriptor that came with a reply just read (gpShmAttach's, gpPinnedShare's): with the reply on a
 * socket, or over the ring ahead of it on the socket with one byte. -1 when none came. */
static int take_fd(void) {
    if (ring_of() && received_fd < 0) {
        char byte;
        ssize_t got;
        do got = recv_plain(&byte, 1, 0);
        while (got < 0 && errno == EINTR);
    }
    int fd = received_fd;
    received_fd = -1;
    return fd;
}

static void lease_setenv(const char *name, const char *value) {
    char key[128];
    snprintf(key, sizeof key, "%s%s", name, rank_suffix);
    setenv(key, value, 1);
}

/* Reconnect to the lease's new worker (under conn_lock, reading a reply): prove the lease secret there, resume
 * this process's state with its token, and send the frame the old worker answered MOVED again; its reply is
 * the next to read. -1 (the connection lost, with the reason said) when the new worker cannot be reached. */
static int moved_to(const struct gp_moved_to *to) {
    char where[sizeof to->where + 1], local[sizeof to->local + 1], pin[sizeof to->tls + 1];
    snprintf(where, sizeof where, "%.*s", (int)sizeof to->where, to->where);
    snprintf(local, sizeof local, "%.*s", (int)sizeof to->local, to->local);
    snprintf(pin, sizeof pin, "%.*s", (int)sizeof to->tls, to->tls);
    __typeof__(last_frame) frame = last_frame;
    uint64_t ctx = conn_ctx;
    int own = frame.call == GP_CALL_gpProcessStart; /* a worker of this process's own, not a move of the lease */
    if (gp_trace_enabled) gp_say(own ? "this process's own worker is %s: connecting" : "the lease moved to %s: reconnecting", where);
    if (!thread_conn) ring_drop(); /* the old worker's ring: the connection goes on over the new socket */
    conn_close_fd();
    if (own) {
        snprintf(own_where, sizeof own_where, "%s", where);
        snprintf(own_local, sizeof own_local, "%s", local);
        snprintf(own_tls, sizeof own_tls, "%s", pin);
    } else {
        own_where[0] = own_local[0] = own_tls[0] = 0;
        lease_setenv(GP_ENV_WORKER, where);
        lease_setenv(GP_ENV_LOCAL, local);
        lease_setenv(GP_ENV_TLS, pin);
    }
    if (connect_worker() != CUDA_SUCCESS) return -1;
    if (to->token) { /* 0: this process connected after the move and starts anew there */
        /* Its callback connection first: the frames it sent since the pause run at the resume, and a copy to
         * page-locked memory among them needs one there. */
        if (callbacks_reattach_locked() < 0) {
            fail(CUDA_ERROR_DEVICE_UNAVAILABLE, "the lease moved to %s, which did not take this process's "
                 "callback connection: the remote GPU is gone, CUDA calls fail from now on", where);
            return -1;
        }
        struct gp_in_gpResume in = {.token = to->token};
        int32_t result;
        if (send_frame(GP_CALL_gpResume, GP_FLAG_WANTS_REPLY, &in, sizeof in, NULL, 0, NULL, 0) < 0 ||
            recv_reply(&result, NULL, 0, NULL, 0) < 0) {
            lost(strerror(errno));
            return -1;
        }
        if (result != 0) {
            fail(CUDA_ERROR_DEVICE_UNAVAILABLE, "the lease moved to %s, which does not hold this process's state "
                 "(error %d): the remote GPU is gone, CUDA calls fail from now on", where, result);
            return -1;
        }
        conn_ctx = ctx; /* the new worker's thread has the context the old one had */
        if (lanes_state > 0) { /* its copy lanes go to the new worker too, before a copy is sent there again */
            lanes_close_locked();
            lanes_state = 0;
            lanes_open_locked();
            conn_ctx = ctx;
        }
    }
    if (send_frame(frame.call, frame.flags, frame.args, frame.args_len, frame.b1, frame.b1_len, frame.b2,
                   frame.b2_len) < 0) {
        lost(strerror(errno));
        return -1;
    }
    return 0;
}

static __thread uint64_t ctx_stack[32];
static __thread int ctx_depth;

/* Connected, and the worker's thread in this thread's context: before any frame (under conn_lock). */
static CUresult prepare_locked(void) {
    if (conn_failure) return conn_failure;
    if (conn_fd < 0) {
        CUresult r = connect_worker();
        if (r) return r;
        if (!thread_conn && gp_isolated()) process_start_locked();
        if (conn_failure) return conn_failure;
        if (!thread_conn && conn_local && !conn_ssl && ring_wanted()) ring_attach_locked();
        if (conn_failure) return conn_failure;
    }
    uint64_t want = gp_ctx_current();
    if (want != conn_ctx) {
        struct gp_in_gpSetContext in = {.ctx = want};
        if (send_frame(GP_CALL_gpSetContext, 0, &in, sizeof in, NULL, 0, NULL, 0) < 0) return lost(strerror(errno));
        conn_ctx = want;
    }
    return CUDA_SUCCESS;
}

static CUresult call_locked(uint32_t call, uint32_t flags, const void *args, uint32_t args_len, const void *b1,
                            uint64_t b1_len, const void *b2, uint64_t b2_len, void *outs, uint32_t outs_len,
                            void *bulk_out, uint64_t bulk_out_len) {
    CUresult r = prepare_locked();
    if (r) return r;
    if (send_frame(call, flags, args, args_len, b1, b1_len, b2, b2_len) < 0) return lost(strerror(errno));
    if (!(flags & GP_FLAG_WANTS_REPLY)) return CUDA_SUCCESS;
    int32_t result;
    if (recv_reply(&result, outs, outs_len, bulk_out, bulk_out_len) < 0) return lost(strerror(errno));
    return result;
}

/* Until the program calls cuInit the driver answers every entry point but a few with
 * CUDA_ERROR_NOT_INITIALIZED (PyTorch checks that `import torch` initialises nothing by calling
 * cuDeviceGetCount and expecting exactly that). The worker's driver was initialised long before, so the
 * shim keeps the rule for every driver call of the table; its own frames (gp*) are not the program's. */
static int program_initialized;

int gp_initialized(void) { return __atomic_load_n(&program_initialized, __ATOMIC_ACQUIRE); }

static int answered_before_init(uint32_t call) {
    static const char *const allowed[] = {"cuInit", "cuDriverGetVersion", "cuGetErrorName", "cuGetErrorString",
                                          "cuGetExportTable", "cuGetProcAddress", "cuGetProcAddress_v2"};
    if (call >= GP_N_CALLS || strncmp(gp_call_names[call], "cu", 2) != 0) return 1;
    for (size_t i = 0; i < sizeof allowed / sizeof allowed[0]; i++)
        if (strcmp(gp_call_names[call], allowed[i]) == 0) return 1;
    return 0;
}

CUresult gp_call2(uint32_t call, uint32_t flags, const void *args, uint32_t args_len, const void *bulk1,
                  uint64_t bulk1_len, const void *bulk2, uint64_t bulk2_len, void *outs, uint32_t outs_len,
                  void *bulk_out, uint64_t bulk_out_len) {
    if (!gp_initialized() && !answered_before_init(call)) return CUDA_ERROR_NOT_INITIALIZED;
    uint64_t start = profile_enabled ? now_ns() : 0;
    if (gp_idle_answers(call, args)) { /* nothing sent since it last completed */
        if (profile_enabled) profile_note(call, 0, now_ns() - start, 0, 0);
        return CUDA_SUCCESS;
    }
    if (call == GP_CALL_cuEventQuery && !gp_capture_open()) {
        const struct gp_in_cuEventQuery *query = args;
        pthread_mutex_lock(&conn_lock);
        int held_record = record_is_held_locked(query->event);
        CUresult sent = held_record && held_flush_locked() < 0 ? lost(strerror(errno)) : CUDA_SUCCESS;
        pthread_mutex_unlock(&conn_lock);
        if (held_record) {
            if (profile_enabled) profile_note(call, 0, now_ns() - start, 0, 0);
            return sent != CUDA_SUCCESS ? sent : CUDA_ERROR_NOT_READY;
        }
    }
    uint64_t generation = gp_idle_generation();
    int changes = call < GP_N_CALLS && (gp_call_invalidates[call] | gp_call_pauses[call] | gp_call_resumes[call]);
    if (changes) gp_memo_changing(call);
    uint64_t shared_event = 0; /* an interprocess event recorded: another process may wait on it once this returns */
    uint64_t recorded = 0;
    if (call == GP_CALL_cuEventRecord || call == GP_CALL_cuEventRecordWithFlags) {
        const struct gp_in_cuEventRecord *record = args; /* both begin with the event and the stream */
        recorded = record->event;
        gp_event_recorded(record->event, record->stream);
        if (gp_event_is_interprocess(record->event)) {
            flags |= GP_FLAG_SEND_NOW;
            shared_event = record->event;
        }
    }
    gp_managed_before(call);
    pthread_mutex_lock(&conn_lock);
    int after_work = n_held > 0; /* frames sent within the hold time are held before it */
    CUresult r = call_locked(call, flags, args, args_len, bulk1, bulk1_len, bulk2, bulk2_len, outs, outs_len,
                             bulk_out, bulk_out_len);
    if (recorded && after_work && !shared_event && r == CUDA_SUCCESS) record_held_locked(recorded);
    if (call == GP_CALL_cuEventDestroy_v2) record_forget_locked(((const struct gp_in_cuEventDestroy_v2 *)args)->event);
    if (shared_event && r == CUDA_SUCCESS && gp_isolated()) {
        /* The other process's worker is another: the record must be done here before that one's wait is, as
         * natively. A query behind it on this connection comes back once it is (its answer does not matter). */
        struct gp_in_cuEventQuery query = {.event = shared_event};
        call_locked(GP_CALL_cuEventQuery, GP_FLAG_WANTS_REPLY, &query, sizeof query, NULL, 0, NULL, 0, NULL, 0, NULL,
                    0);
    }
    pthread_mutex_unlock(&conn_lock);
    if (is_context_fault(r)) shared_context_hint(r);
    /* after the program's cuInit its calls go to the worker even when it failed: a lease that cannot be
     * reached keeps answering why (NO_DEVICE, NOT_PERMITTED), not NOT_INITIALIZED */
    if (call == GP_CALL_cuInit) __atomic_store_n(&program_initialized, 1, __ATOMIC_RELEASE);
    gp_managed_after(call, r);
    gp_idle_done(call, flags, args, generation, r);
    if (changes) gp_memo_changed(call, r, args, args_len);
    if (profile_enabled) profile_note(call, flags, now_ns() - start, args_len + bulk1_len + bulk2_len, bulk_out_len);
    return r;
}

/* ---- large copies through memory the worker maps too (a worker on this host) --------------------
 * Over the socket a copy's bytes are copied into the kernel and out again into the worker's page-locked
 * buffer before its DMA: two memcpys of every byte on two processes, about half of what a local
 * pageable copy reaches. With a worker on this host it hands over page-locked memory of its own
 * (gpShmAttach: a file descriptor with the reply); a copy to the device is then one memcpy here into
 * it, piece by piece, each piece's DMA running while the next is written; a copy to the host is the
 * worker's DMAs into it, each piece copied out here as soon as the worker says it has landed. A copy
 * larger than the memory goes in parts. Once per process connection; never over TLS or TCP. */
static uint8_t *shm_base;
static uint64_t shm_size;

/* The bytes of a piece of 512 KiB or more are copied by two threads (this one and a helper kept for it): one
 * thread's memcpy (6-8 GB/s measured) is what held copies through the shared memory below a local
 * pageable copy. Under conn_lock: one piece at a time. Only where there are 4 CPUs or more
 * (GPUPOOL_SHIM_COPY_THREADS=1 or 2 decides instead). */
static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    void *dst;
    const void *src;
    size_t n;
    uint64_t asked, done; /* jobs handed over and finished (atomics) */
    int state;            /* 0 not started, 1 running, -1 none (few CPUs, or no thread) */
} helper = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

static void *helper_main(void *unused) {
    (void)unused;
    uint64_t seen = 0;
    for (;;) {
        uint64_t until = now_ns() + 200000; /* the next piece usually follows within microseconds */
        while (__atomic_load_n(&helper.asked, __ATOMIC_ACQUIRE) == seen && now_ns() < until) {}
        pthread_mutex_lock(&helper.lock);
        while (__atomic_load_n(&helper.asked, __ATOMIC_ACQUIRE) == seen) pthread_cond_wait(&helper.cond, &helper.lock);
        pthread_mutex_unlock(&helper.lock);
        seen = __atomic_load_n(&helper.asked, __ATOMIC_ACQUIRE);
        memcpy(helper.dst, helper.src, helper.n);
        __atomic_store_n(&helper.done, seen, __ATOMIC_RELEASE);
    }
    return NULL;
}

static void copy_bytes(void *dst, const void *src, size_t n) {
    if (n < (512u << 10) || helper.state < 0) {
        memcpy(dst, src, n);
        return;
    }
    if (helper.state == 0) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        const char *env = getenv("GPUPOOL_SHIM_COPY_THREADS"); /* 1: this thread alone; 2: two, whatever the CPUs */
        int two = env ? strcmp(env, "2") == 0 : sysconf(_SC_NPROCESSORS_ONLN) >= 4;
        helper.state = two && pthread_create(&t, &attr, helper_main, NULL) == 0 ? 1 : -1;
        pthread_attr_destroy(&attr);
        if (helper.state < 0) {
            memcpy(dst, src, n);
            return;
        }
    }
    size_t half = (n / 2 + 4095) & ~(size_t)4095;
    helper.dst = (char *)dst + half;
    helper.src = (const char *)src + half;
    helper.n = n - half;
    pthread_mutex_lock(&helper.lock);
    uint64_t job = __atomic_add_fetch(&helper.asked, 1, __ATOMIC_RELEASE);
    pthread_cond_signal(&helper.cond);
    pthread_mutex_unlock(&helper.lock);
    memcpy(dst, src, half);
    while (__atomic_load_n(&helper.done, __ATOMIC_ACQUIRE) != job) {}
}

static void shm_after_fork_in_child(void) {
    /* The helper thread is not in the child: a new one when needed. */
    pthread_mutex_init(&helper.lock, NULL);
    pthread_cond_init(&helper.cond, NULL);
    helper.asked = helper.done = 0;
    if (helper.state > 0) helper.state = 0;
    if (shm_base) munmap(shm_base, shm_size); /* the parent's: its worker connection, not ours */
    shm_base = NULL;
    shm_size = 0;
    shm_state = 0;
}

static void shm_attach_locked(void) {
    shm_state = -1;
    struct gp_out_gpShmAttach out;
    int32_t result;
    if (send_frame(GP_CALL_gpShmAttach, GP_FLAG_WANTS_REPLY, NULL, 0, NULL, 0, NULL, 0) < 0 ||
        recv_reply(&result, &out, sizeof out, NULL, 0) < 0) {
        lost(strerror(errno));
        return;
    }
    int fd = result == CUDA_SUCCESS ? take_fd() : -1;
    if (result != CUDA_SUCCESS || fd < 0 || !out.size) {
        if (fd >= 0) close(fd);
        return;
    }
    void *p = mmap(NULL, out.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return;
    shm_base = p;
    shm_size = out.size;
    shm_state = 1;
}

/* Page-locked memory shared with a worker on this host (issue 31): a descriptor of new memory the worker
 * has pinned, for the allocation at `base` to be mapped onto, so the worker's DMAs go straight into and
 * out of it; -1 where it is not shared (another host, TLS, GPUPOOL_SHIM_SHARED_PINNED=0, refused). */
int gp_pinned_share(uint64_t base, uint64_t size) {
    const char *env = getenv("GPUPOOL_SHIM_SHARED_PINNED");
    if (thread_conn || (env && strcmp(env, "0") == 0)) return -1;
    struct gp_in_gpPinnedShare in = {.base = base, .size = size};
    int fd = -1;
    pthread_mutex_lock(&conn_lock);
    if (prepare_locked() == CUDA_SUCCESS && conn_local && !conn_ssl) {
        int32_t result;
        if (send_frame(GP_CALL_gpPinnedShare, GP_FLAG_WANTS_REPLY, &in, sizeof in, NULL, 0, NULL, 0) < 0 ||
            recv_reply(&result, NULL, 0, NULL, 0) < 0) {
            lost(strerror(errno));
        } else {
            fd = result == CUDA_SUCCESS ? take_fd() : -1;
            if (result != CUDA_SUCCESS && fd >= 0) {
                close(fd);
                fd = -1;
            }
        }
    }
    pthread_mutex_unlock(&conn_lock);
    return fd;
}

static uint64_t shm_piece(uint64_t count) { /* a copy's pieces: about 8 of them, 512 KiB to 4 MiB */
    uint64_t chunk = count / 8;
    chunk = chunk < (512u << 10) ? (512u << 10) : chunk > (4u << 20) ? (4u << 20) : chunk;
    return (chunk + 4095) & ~(uint64_t)4095;
}

static CUresult shm_htod_locked(uint64_t dst, const uint8_t *src, uint64_t count, uint64_t stream, int is_async) {
    CUresult r = CUDA_SUCCESS;
    for (uint64_t done = 0; done < count && r == CUDA_SUCCESS;) {
        uint64_t part = count - done < shm_size ? count - done : shm_size, chunk = shm_piece(part);
        for (uint64_t at = 0; at < part; at += chunk) {
            uint64_t n = part - at < chunk ? part - at : chunk, start = profile_enabled ? now_ns() : 0;
            copy_bytes(shm_base + at, src + done + at, n);
            if (profile_enabled) profile_shm_copy_ns += now_ns() - start;
            int last = at + n == part;
            struct gp_in_gpShmHtoD in = {.dst = dst + done + at, .count = n, .stream = stream, .offset = at,
                                         .flags = (uint32_t)(last | (is_async ? 2 : 0))};
            /* each piece at once: its DMA overlaps the copying of the next piece here (never held) */
            if (send_frame(GP_CALL_gpShmHtoD, last ? GP_FLAG_WANTS_REPLY : GP_FLAG_SEND_NOW, &in, sizeof in, NULL, 0,
                           NULL, 0) < 0)
                return lost(strerror(errno));
        }
        int32_t result;
        uint64_t start = profile_enabled ? now_ns() : 0;
        if (recv_reply(&result, NULL, 0, NULL, 0) < 0) return lost(strerror(errno));
        if (profile_enabled) profile_shm_wait_ns += now_ns() - start;
        r = result;
        done += part;
    }
    return r;
}

static CUresult shm_dtoh_locked(uint8_t *dst, uint64_t src, uint64_t count, uint64_t stream, int is_async) {
    for (uint64_t done = 0; done < count;) {
        uint64_t part = count - done < shm_size ? count - done : shm_size;
        struct gp_in_gpShmDtoH in = {.src = src + done, .count = part, .stream = stream,
                                     .flags = is_async ? 2u : 0u, .chunk = (uint32_t)shm_piece(part)};
        if (send_frame(GP_CALL_gpShmDtoH, GP_FLAG_WANTS_REPLY, &in, sizeof in, NULL, 0, NULL, 0) < 0)
            return lost(strerror(errno));
        for (uint64_t got = 0; got < part;) { /* a reply per piece as it lands, in order */
            struct gp_out_gpShmDtoH out;
            int32_t result;
            uint64_t start = profile_enabled ? now_ns() : 0;
            if (recv_reply(&result, &out, sizeof out, NULL, 0) < 0) return lost(strerror(errno));
            if (profile_enabled) profile_shm_wait_ns += now_ns() - start, start = now_ns();
            if (result != CUDA_SUCCESS) return result;
            if (out.offset != got || !out.size || out.size > part - got) return lost("a copy's pieces out of order");
            copy_bytes(dst + done + got, shm_base + got, out.size);
            if (profile_enabled) profile_shm_copy_ns += now_ns() - start;
            got += out.size;
        }
        done += part;
    }
    return CUDA_SUCCESS;
}

/* ---- large copies over an encrypted connection, striped across more connections ("lanes") ---------
 * One TLS connection is one core's record layer at each end: 1.2-1.9 GB/s on a fast host, less than a
 * 25 Gbit/s link carries. A copy of GP_LANE_MIN_COPY or more over an encrypted connection goes as one
 * frame on the process's connection (in order with everything sent before it; the worker goes on with
 * the next frame when the copy is done) and its bytes in pieces, one per lane, each lane's TLS on its
 * own thread here and on the worker (virtualize/server/_lanes.py). The lanes open at the first such copy
 * (each proves the lease secret like any connection); where they cannot, copies go through the
 * process's connection as before. GPUPOOL_SHIM_LANES: how many (default 3; 0 or 1: none). From 4 MiB: a
 * training's batch of images (9.6 MB of uint8 ResNet-50 input) went through one connection at 1.26 GB/s
 * across a 25 Gbit/s link (bench/RESULTS.md, the seventh session's run 3), the GPU idle meanwhile. */
#define GP_LANE_MIN_COPY (4u << 20)
#define GP_MAX_LANES 8
static struct gp_conn lane_conns[GP_MAX_LANES];
static uint64_t next_lane_copy = 1;

static void lane_close(struct gp_conn *c) {
    gp_tls_free(c->ssl);
    if (c->fd >= 0) close(c->fd);
    free(c->joined);
    *c = (struct gp_conn){-1, NULL, NULL};
}

static int lanes_sent_locked(void);

static void lanes_close_locked(void) {
    lanes_sent_locked(); /* nothing is still writing to them */
    for (int i = 0; i < lanes_state; i++) lane_close(&lane_conns[i]);
    lanes_state = -1;
}

static int n_sending; /* pieces of the last copy still going out on their own threads (under conn_lock) */

static void lanes_after_fork_in_child(void) {
    /* The parent's lanes: the child drops its copies of their sockets and opens its own if it needs
     * (the threads sending the parent's pieces are not the child's). */
    n_sending = 0;
    for (int i = 0; i < lanes_state; i++) {
        if (lane_conns[i].fd >= 0) close(lane_conns[i].fd);
        free(lane_conns[i].joined);
        lane_conns[i] = (struct gp_conn){-1, NULL, NULL};
    }
    lanes_state = 0;
    next_lane_copy = 1;
}

/* Under conn_lock, the process's connection up and encrypted: lanes_state set. A lane that cannot
 * connect leaves the process's connection as it was (its failure is not the process's). */
static int lanes_wanted(void) {
    const char *env = getenv("GPUPOOL_SHIM_LANES");
    int want = env ? atoi(env) : 3;
    return want > GP_MAX_LANES ? GP_MAX_LANES : want;
}

static void lanes_open_locked(void) {
    int want = lanes_wanted();
    struct gp_out_gpCallbackToken token;
    if (want < 2 || call_locked(GP_CALL_gpCallbackToken, GP_FLAG_WANTS_REPLY, NULL, 0, NULL, 0, NULL, 0, &token,
                                sizeof token, NULL, 0) != CUDA_SUCCESS) {
        lanes_state = -1;
        return;
    }
    CUresult failure = conn_failure;
    uint64_t ctx = conn_ctx;
    int opened = 0;
    for (; opened < want; opened++) {
        lane_conns[opened] = (struct gp_conn){-1, NULL, NULL};
        thread_conn = &lane_conns[opened];
        struct gp_in_gpLaneAttach in = {.token = token.token};
        int32_t result = -1;
        int ok = connect_worker() == CUDA_SUCCESS && conn_ssl &&
                 send_frame(GP_CALL_gpLaneAttach, GP_FLAG_WANTS_REPLY, &in, sizeof in, NULL, 0, NULL, 0) == 0 &&
                 recv_reply(&result, NULL, 0, NULL, 0) == 0 && result == 0;
        thread_conn = NULL;
        if (!ok) {
            lane_close(&lane_conns[opened]);
            break;
        }
    }
    conn_failure = failure;
    conn_ctx = ctx;
    lanes_state = opened;
    if (opened < want) {
        lanes_close_locked();
        gp_say("the copy lanes to the lease's worker did not open: large copies go through one connection");
    }
}

struct lane_piece {
    int lane, to_device, failed;
    int32_t result;
    uint64_t id, offset, count;
    char *host;
};

static void *lane_run(void *arg) {
    struct lane_piece *p = arg;
    thread_conn = &lane_conns[p->lane];
    struct gp_in_gpLanePiece in = {.id = p->id, .offset = p->offset, .count = p->count};
    if (p->to_device)
        p->failed = send_frame(GP_CALL_gpLanePiece, 0, &in, sizeof in, p->host, p->count, NULL, 0) < 0;
    else /* the reply carries the bytes, straight into the caller's buffer; an error reply none */
        p->failed = send_frame(GP_CALL_gpLanePiece, GP_FLAG_WANTS_REPLY, &in, sizeof in, NULL, 0, NULL, 0) < 0 ||
                    recv_reply(&p->result, NULL, 0, p->host, p->count) < 0;
    thread_conn = NULL;
    return NULL;
}

/* gpLaneCopy's flags beside direction and async (virtualize/server/_lanes.py): answered once before its pieces
 * go; a copy to the device from page-locked memory whose pieces may come after the process's next frames. */
enum { GP_LANE_GO_FIRST = 4, GP_LANE_LATER = 8 };

/* A copy to the device from page-locked memory returns once its pieces are on their way, as natively the
 * call returns before the DMA reads the memory: the worker queues the copy behind a mark its stream waits
 * for and goes on with the process's next frames, and the pieces land in its staging memory meanwhile (a
 * data loader's next batch crosses the network while the GPU runs this step). Their threads are joined
 * before the lanes carry anything else, close, or the memory is given back (gp_lanes_sent). */
static struct lane_piece sending[GP_MAX_LANES];
static pthread_t sending_threads[GP_MAX_LANES];
static int sending_started[GP_MAX_LANES];

/* The pieces still going out have gone: 0, or -1 if one failed (the worker fails that copy and says so at
 * the next synchronise; this process's lanes are closed and the failure is the connection's). */
static int lanes_sent_locked(void) {
    int failed = 0;
    for (int i = 0; i < n_sending; i++) {
        if (sending_started[i]) pthread_join(sending_threads[i], NULL);
        failed |= sending[i].failed;
    }
    n_sending = 0;
    return failed ? -1 : 0;
}

CUresult gp_lanes_sent(void) {
    pthread_mutex_lock(&conn_lock);
    int failed = lanes_sent_locked();
    if (failed) lanes_close_locked();
    pthread_mutex_unlock(&conn_lock);
    return failed ? lost("a copy lane failed") : CUDA_SUCCESS;
}

static CUresult lane_copy_locked(int to_device, int is_async, uint64_t device, char *host, uint64_t count,
                                 uint64_t stream) {
    if (lanes_sent_locked() < 0) { /* the last copy's pieces, before this one's use the lanes */
        lanes_close_locked();
        return lost("a copy lane failed");
    }
    int n = lanes_state;
    /* from page-locked memory the caller leaves it alone until the stream gets there, as with a GPU */
    uint64_t base, size;
    int later = to_device && is_async && gp_host_lookup((uint64_t)host, &base, &size, NULL) &&
                count <= size - ((uint64_t)host - base);
    struct gp_in_gpLaneCopy in = {.device = device, .count = count, .stream = stream,
                                  .flags = (to_device ? 1u : 0u) | (is_async ? 2u : 0u) | GP_LANE_GO_FIRST |
                                           (later ? GP_LANE_LATER : 0u),
                                  .pieces = (uint32_t)n, .id = next_lane_copy++};
    /* The pieces go once the worker has answered: a worker the lease has left answers MOVED instead, and the
     * copy is sent again to the new one (moved_to), over lanes to that one, before any piece leaves. */
    int32_t go = -1;
    if (send_frame(GP_CALL_gpLaneCopy, GP_FLAG_WANTS_REPLY, &in, sizeof in, NULL, 0, NULL, 0) < 0 ||
        recv_reply(&go, NULL, 0, NULL, 0) < 0)
        return lost(strerror(errno));
    if (go != 0) return go;
    if (lanes_state != n) { /* the lease moved and fewer lanes opened to its new worker than the copy names */
        lanes_close_locked();
        return lost("the copy lanes did not open again to the lease's new worker");
    }
    uint64_t each = (count / (uint64_t)n + 4095) & ~4095ull, at = 0;
    for (int i = 0; i < n; i++) {
        uint64_t len = i == n - 1 ? count - at : each;
        sending[i] = (struct lane_piece){.lane = i, .to_device = to_device, .id = in.id, .offset = at, .count = len,
                                         .host = host + at};
        at += len;
        sending_started[i] = pthread_create(&sending_threads[i], NULL, lane_run, &sending[i]) == 0;
        if (!sending_started[i]) lane_run(&sending[i]); /* no thread to be had: this one carries the piece */
    }
    n_sending = n;
    if (later) return CUDA_SUCCESS; /* on their way; joined before the lanes are used again */
    if (lanes_sent_locked() < 0) { /* the worker hears the lanes close and fails the copy; so does this process */
        lanes_close_locked();
        return lost("a copy lane failed");
    }
    if (to_device) return CUDA_SUCCESS; /* every byte is sent: an error comes with the next synchronise */
    int32_t result;
    if (recv_reply(&result, NULL, 0, NULL, 0) < 0) return lost(strerror(errno));
    return result;
}

/* A large copy between pageable memory here and the device, through the memory shared with a worker on
 * this host or across the lanes of an encrypted connection: 1 with *result set, or 0 where neither is
 * for it (small, plaintext TCP, turned off, a callback thread): the process's connection then. */
/* The smallest copy that goes through shared memory: GPUPOOL_SHIM_SHARED_MIN_KIB for both directions,
 * else GP_SHM_MIN_HTOD / GP_SHM_MIN_DTOH; smaller ones travel in their frame, which the worker's native
 * loop serves up to 1 MiB. Not a number: the defaults, said once. */
static uint64_t shm_min_copy(int to_device) {
    static uint64_t min; /* 0: not read yet, 1: the defaults (a benign race: every thread reads the same) */
    if (!min) {
        const char *env = getenv("GPUPOOL_SHIM_SHARED_MIN_KIB");
        char *end = NULL;
        unsigned long long kib = env ? strtoull(env, &end, 10) : 0;
        if (env && (!*env || *end || kib > (1ull << 30))) {
            gp_say("GPUPOOL_SHIM_SHARED_MIN_KIB=%s is not a number of KiB; copies to the device of %u KiB and "
                   "more, to the host of %u KiB and more, go through shared memory", env, GP_SHM_MIN_HTOD >> 10,
                   GP_SHM_MIN_DTOH >> 10);
            env = NULL;
        }
        min = env && kib ? kib << 10 : 1;
    }
    return min > 1 ? min : to_device ? GP_SHM_MIN_HTOD : GP_SHM_MIN_DTOH;
}

int gp_bulk_copy(uint32_t call, uint64_t device, void *host, uint64_t count, uint64_t stream, CUresult *result) {
    if (!gp_initialized()) return 0; /* the connection's path, which refuses it as the driver does */
    int to_device = call == GP_CALL_cuMemcpyHtoD_v2 || call == GP_CALL_cuMemcpyHtoDAsync_v2;
    int lanes_fit = count >= GP_LANE_MIN_COPY && lanes_state >= 0;
    if ((count < shm_min_copy(to_device) && !lanes_fit) || thread_conn || (shm_state < 0 && !lanes_fit)) return 0;
    if (shm_state == 0) {
        const char *env = getenv("GPUPOOL_SHIM_SHARED_COPIES"); /* 0: every copy through the socket */
        if (env && strcmp(env, "0") == 0) shm_state = -1;
    }
    int is_async = call == GP_CALL_cuMemcpyHtoDAsync_v2 || call == GP_CALL_cuMemcpyDtoHAsync_v2;
    uint64_t start = profile_enabled ? now_ns() : 0, generation = gp_idle_generation();
    gp_managed_before(call);
    pthread_mutex_lock(&conn_lock);
    CUresult r = prepare_locked();
    int lanes = 0;
    if (r == CUDA_SUCCESS) {
        if (shm_state == 0 && conn_local && !conn_ssl) shm_attach_locked();
        if (shm_state != 1 && lanes_fit) {
            if (!conn_ssl || conn_local) lanes_state = -1; /* plaintext: one connection is fast enough */
            else if (lanes_state == 0) lanes_open_locked();
            lanes = lanes_state > 0;
        }
        if (shm_state != 1 && !lanes) {
            pthread_mutex_unlock(&conn_lock);
            return 0;
        }
        if (lanes) r = lane_copy_locked(to_device, is_async, device, host, count, stream);
        else r = to_device ? shm_htod_locked(device, host, count, stream, is_async)
                           : shm_dtoh_locked(host, device, count, stream, is_async);
    }
    pthread_mutex_unlock(&conn_lock);
    gp_managed_after(call, r);
    if (!lanes && r == CUDA_SUCCESS) /* through shared memory: answered once its stream (the legacy one for a
                                       * synchronous copy) had done the copy */
        gp_idle_stream_done(is_async ? stream : 0, generation);
    else if (!lanes) gp_idle_frame(GP_N_CALLS, 0); /* a copy that failed part-way may have left pieces queued */
    if (profile_enabled) {
        uint32_t waited = lanes && to_device ? 0 : GP_FLAG_WANTS_REPLY; /* striped to the device: no answer */
        profile_note(call, waited, now_ns() - start, to_device ? count : 0, to_device ? 0 : count);
        if (lanes) {
            __atomic_fetch_add(&profile_lane_copies, 1, __ATOMIC_RELAXED);
            __atomic_fetch_add(&profile_lane_bytes, count, __ATOMIC_RELAXED);
            profile_lanes = lanes_state > 0 ? lanes_state : profile_lanes;
        } else {
            __atomic_fetch_add(&profile_shm_copies, 1, __ATOMIC_RELAXED);
            __atomic_fetch_add(&profile_shm_bytes, count, __ATOMIC_RELAXED);
        }
    }
    *result = r;
    return 1;
}

CUresult gp_call(uint32_t call, uint32_t flags, const void *args, uint32_t args_len, const void *bulk,
                 uint64_t bulk_len, void *outs, uint32_t outs_len, void *bulk_out, uint64_t bulk_out_len) {
    CUresult r = gp_call2(call, flags, args, args_len, bulk, bulk_len, NULL, 0, outs, outs_len, bulk_out, bulk_out_len);
    if (r && gp_trace_enabled) { /* with its in-arguments in hex: what the program asked that the driver refused */
        char hex[2 * 64 + 1] = "";
        for (uint32_t i = 0; i < args_len && i < 64; i++) snprintf(hex + 2 * i, 3, "%02x", ((const unsigned char *)args)[i]);
        gp_say("call %s returned %d (arguments %s)", call < GP_N_CALLS ? gp_call_names[call] : "?", r, hex);
    }
    return r;
}

/* The entry point of gpupool's libraries that forward another API over this process's connection
 * (libgpupool_nccl.so: NCCL at its API, virtualize/client/nccl/nccl_forward.c): one call of the table,
 * in order with the process's CUDA calls on the same connection. */
GP_EXPORT CUresult gpupool_forward(uint32_t call, uint32_t flags, const void *args, uint32_t args_len,
                                   const void *bulk, uint64_t bulk_len, void *outs, uint32_t outs_len,
                                   void *bulk_out, uint64_t bulk_out_len) {
    return gp_call(call, flags, args, args_len, bulk, bulk_len, outs, outs_len, bulk_out, bulk_out_len);
}

/* What the lease holds of device `dev` now (gpLeaseMemory), for gpupool's libnvidia-ml.so.1 in this process: NVML's
 * used memory then follows the program's allocations at once, not the view's refresh a second later. -1 while this
 * process has no connection to its worker (an NVML query never opens one) or the worker does not answer. */
GP_EXPORT int gpupool_memory_in_use(int dev, uint64_t *used) {
    if (!used || __atomic_load_n(&main_conn.fd, __ATOMIC_RELAXED) < 0 || conn_failure) return -1;
    struct gp_in_gpLeaseMemory in = {.dev = dev};
    struct gp_out_gpLeaseMemory out;
    if (gp_call(GP_CALL_gpLeaseMemory, GP_FLAG_WANTS_REPLY, &in, sizeof in, NULL, 0, &out, sizeof out, NULL, 0) !=
        CUDA_SUCCESS)
        return -1;
    *used = out.used;
    return 0;
}

/* ---- host functions the worker calls back (cuLaunchHostFunc, cuStreamAddCallback) ---------------
 *
 * When a stream reaches a host function, the worker's driver thread sends its id on a second
 * connection of this process, kept by the callback thread, and waits: the thread runs the function
 * here and answers with the id, and only then does the stream go on, as natively. A second connection,
 * so that a host function runs while the program's own threads wait in a synchronise on the first. */

/* keep: captured into a graph, so it runs at every launch of it (kept as long as the process lives). */
struct host_call { uint64_t id, stream; int kind, keep; void *fn, *data; struct host_call *next; };
static pthread_mutex_t host_calls_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t callbacks_cond = PTHREAD_COND_INITIALIZER;
static struct host_call *host_calls;
static uint64_t next_host_call = 1;
/* The process's callback connection: a new one after the lease moved to another server's worker (the old
 * one's thread reads what the old worker sent until it closes, then ends without stopping the copies). */
static struct gp_conn first_callback_conn = {-1, NULL, NULL};
static struct gp_conn *callback_conn = &first_callback_conn;
static int callbacks_state; /* 0 not started, 1 starting, 2 running, or the CUresult that stopped it (< 0) */
static CUresult callbacks_result;

uint64_t gp_host_call_add(int kind, void *fn, void *data, uint64_t stream, int keep) {
    struct host_call *c = malloc(sizeof *c);
    if (!c) return 0;
    pthread_mutex_lock(&host_calls_lock);
    *c = (struct host_call){next_host_call++, stream, kind, keep, fn, data, host_calls};
    host_calls = c;
    pthread_mutex_unlock(&host_calls_lock);
    return c->id;
}

/* The host call `id` (taken out unless it is kept); 0 when there is none. */
static int host_call_take(uint64_t id, struct host_call *copy, int drop) {
    pthread_mutex_lock(&host_calls_lock);
    struct host_call **at = &host_calls;
    while (*at && (*at)->id != id) at = &(*at)->next;
    struct host_call *c = *at;
    if (c) *copy = *c;
    if (c && (drop || !c->keep)) {
        *at = c->next;
        free(c);
    }
    pthread_mutex_unlock(&host_calls_lock);
    return c != NULL;
}

/* The function and argument kept under `id` for a graph (a host node's), left in place; 0 when none. */
int gp_host_call_find(uint64_t id, void **fn, void **data) {
    pthread_mutex_lock(&host_calls_lock);
    struct host_call *c = host_calls;
    while (c && c->id != id) c = c->next;
    if (c && c->keep) *fn = c->fn, *data = c->data;
    int found = c && c->keep;
    pthread_mutex_unlock(&host_calls_lock);
    return found;
}

void gp_host_call_drop(uint64_t id) {
    struct host_call c;
    host_call_take(id, &c, 1);
}

/* A recapture's callback and its data, kept for the process's life under one id however often the
 * program recaptures with them (a program recaptures in a loop, always with the same callback). */
uint64_t gp_recapture_callback(void *fn, void *data) {
    pthread_mutex_lock(&host_calls_lock);
    struct host_call *c = host_calls;
    while (c && !(c->kind == GP_HOST_RECAPTURE && c->fn == fn && c->data == data)) c = c->next;
    uint64_t id = c ? c->id : 0;
    pthread_mutex_unlock(&host_calls_lock);
    return id ? id : gp_host_call_add(GP_HOST_RECAPTURE, fn, data, 0, 1);
}

/* An answer on the callback connection this callback thread reads (its own, after a move too). */
static int callback_send(const void *buf, size_t len) {
    struct gp_conn *c = conn();
    if (c->ssl) return gp_tls_write(c->ssl, buf, len);
    for (const char *p = buf; len > 0;) {
        ssize_t n = send(c->fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* ---- copies into page-locked memory that complete later (cuMemcpyDtoHAsync, cuMemcpyAsync) --------
 *
 * The call returns once its request is sent. The worker queues the copy behind its stream and, once
 * its bytes are in host memory there, sends them on the callback connection, where the callback thread
 * writes them into the destination. Before any reply on the process's connection the worker says how
 * many such frames it has sent (GP_COPIES_SENT) and recv_reply waits until as many have landed, so no
 * synchronise, query that says done, or copy returns before the bytes it could show the program. */

/* `landed`: the bytes of its pieces landed so far (a large copy comes in pieces, GP_COPY_PIECE) */
struct pending_copy { uint64_t id; void *dst; uint64_t count; struct pending_copy *next; uint64_t landed; };
static pthread_mutex_t copies_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t copies_cond = PTHREAD_COND_INITIALIZER;
static struct pending_copy *copies;
static uint64_t next_copy = 1, copies_landed, copies_in_flight;
static int copies_stopped; /* the callback connection ended: nothing more will land */

uint64_t gp_copy_expect(void *dst, uint64_t count) {
    struct pending_copy *c = malloc(sizeof *c);
    if (!c) return 0;
    pthread_mutex_lock(&copies_lock);
    *c = (struct pending_copy){next_copy++, dst, count, copies, 0};
    copies = c;
    __atomic_add_fetch(&copies_in_flight, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&copies_lock);
    return c->id;
}

static struct pending_copy *copy_unlink(uint64_t id) { /* under copies_lock */
    struct pending_copy **at = &copies;
    while (*at && (*at)->id != id) at = &(*at)->next;
    struct pending_copy *c = *at;
    if (c) {
        *at = c->next;
        __atomic_sub_fetch(&copies_in_flight, 1, __ATOMIC_RELEASE);
    }
    return c;
}

void gp_copy_drop(uint64_t id) { /* its request never left: nothing will come for it */
    pthread_mutex_lock(&copies_lock);
    free(copy_unlink(id));
    pthread_mutex_unlock(&copies_lock);
}

int gp_copies_in_flight(void) { return __atomic_load_n(&copies_in_flight, __ATOMIC_ACQUIRE) != 0; }

int gp_copies_into(const void *p, uint64_t count) {
    if (!gp_copies_in_flight()) return 0;
    uint64_t lo = (uint64_t)p, hi = lo + count;
    int hit = 0;
    pthread_mutex_lock(&copies_lock);
    for (struct pending_copy *c = copies; c && !hit; c = c->next)
        hit = (uint64_t)c->dst < hi && lo < (uint64_t)c->dst + c->count;
    pthread_mutex_unlock(&copies_lock);
    return hit;
}

/* One copy's frame: its bytes straight into the destination. `counted`: it came on the callback
 * connection (the frames the worker counts in GP_COPIES_SENT), else ahead of a reply. */
static int land_copy(const struct gp_reply *rep, int counted) {
    struct gp_copy_head head;
    if (rep->outs_len != sizeof head || recv_all(&head, sizeof head) < 0) return -1;
    pthread_mutex_lock(&copies_lock);
    struct pending_copy *c = copies;
    while (c && c->id != head.id) c = c->next;
    pthread_mutex_unlock(&copies_lock); /* only the frame's reader takes it out once it was sent */
    uint64_t take = c && rep->bulk_len <= c->count ? rep->bulk_len : 0;
    if (take && recv_all(c->dst, take) < 0) return -1;
    if (discard(rep->bulk_len - take) < 0) return -1;
    pthread_mutex_lock(&copies_lock);
    free(copy_unlink(head.id));
    copies_landed += counted != 0;
    pthread_cond_broadcast(&copies_cond);
    pthread_mutex_unlock(&copies_lock);
    return 0;
}

/* One piece of a large copy, from whichever connection it came on (the callback connection or a delivery
 * connection: the worker sends a copy's pieces on all of them at once); the copy is done when all of its
 * bytes have landed. Each piece is a frame the worker counts in GP_COPIES_SENT. */
static int land_piece(const struct gp_reply *rep) {
    struct gp_copy_piece_head head;
    if (rep->outs_len != sizeof head || recv_all(&head, sizeof head) < 0) return -1;
    pthread_mutex_lock(&copies_lock);
    /* every frame sent before this copy first (they may still land on other connections): copies into the
     * same memory land in their order, as natively the later one's bytes stay */
    while (copies_landed < head.before && !copies_stopped) pthread_cond_wait(&copies_cond, &copies_lock);
    struct pending_copy *c = copies;
    while (c && c->id != head.id) c = c->next;
    /* the copy stays listed until its last byte lands, so no other reader frees it meanwhile */
    char *dst = c && head.offset <= c->count && rep->bulk_len <= c->count - head.offset ? (char *)c->dst + head.offset
                                                                                       : NULL;
    pthread_mutex_unlock(&copies_lock);
    uint64_t take = dst ? rep->bulk_len : 0;
    if (take && recv_all(dst, take) < 0) return -1;
    if (discard(rep->bulk_len - take) < 0) return -1;
    pthread_mutex_lock(&copies_lock);
    if (dst && (c->landed += take) >= c->count) free(copy_unlink(head.id));
    copies_landed++;
    pthread_cond_broadcast(&copies_cond);
    pthread_mutex_unlock(&copies_lock);
    return 0;
}

static void copies_wait(uint64_t need) {
    pthread_mutex_lock(&copies_lock);
    while (copies_landed < need && !copies_stopped) pthread_cond_wait(&copies_cond, &copies_lock);
    pthread_mutex_unlock(&copies_lock);
}

static void copies_stop(void) {
    pthread_mutex_lock(&copies_lock);
    copies_stopped = 1;
    pthread_cond_broadcast(&copies_cond);
    pthread_mutex_unlock(&copies_lock);
}

static void copies_resume(void) { /* a new callback connection: copies land through it from now on */
    pthread_mutex_lock(&copies_lock);
    copies_stopped = 0;
    pthread_mutex_unlock(&copies_lock);
}

static void copies_after_fork_in_child(void) {
    /* The parent's copies land in the parent; the child starts with none (their entries are the
     * parent's memory, left as they are). */
    copies = NULL;
    next_copy = 1;
    copies_landed = copies_in_flight = 0;
    copies_stopped = 0;
    pthread_mutex_init(&copies_lock, NULL);
    pthread_cond_init(&copies_cond, NULL);
}

/* One side of a recapture's question as the program reads it: the CUgraphNodeParams, a kernel node's
 * kernelParams pointing at this side's copy of the arguments. NULL when the bytes do not add up. */
struct recapture_side { unsigned char params[GP_NODE_PARAMS_BYTES]; void **pointers; unsigned char *args; };

static const unsigned char *recapture_side_read(struct recapture_side *side, const unsigned char *p,
                                                const unsigned char *end) {
    struct gp_recapture_side head;
    if ((size_t)(end - p) < sizeof head) return NULL;
    memcpy(&head, p, sizeof head);
    p += sizeof head;
    uint64_t offsets_bytes = 4ull * head.n_args;
    if ((uint64_t)(end - p) < offsets_bytes + head.args_bytes) return NULL;
    memcpy(side->params, head.params, sizeof side->params);
    side->pointers = calloc(head.n_args ? head.n_args : 1, sizeof(void *));
    side->args = malloc(head.args_bytes ? head.args_bytes : 1);
    if (!side->pointers || !side->args) return NULL;
    memcpy(side->args, p + offsets_bytes, head.args_bytes);
    for (uint32_t i = 0; i < head.n_args; i++) {
        uint32_t offset;
        memcpy(&offset, p + 4ull * i, 4);
        if (offset > head.args_bytes) return NULL; /* a parameter of no bytes may sit at the end */
        side->pointers[i] = side->args + offset;
    }
    int32_t type;
    memcpy(&type, side->params, 4);
    if (type == 0 && head.n_args) { /* CU_GRAPH_NODE_TYPE_KERNEL: kernelParams, 40 bytes into the kernel's */
        void **pointers = side->pointers;
        memcpy(side->params + 16 + 40, &pointers, sizeof pointers);
    }
    return p + offsets_bytes + head.args_bytes;
}

/* A recapture's question: the program's callback (CUgraphRecaptureCallback) with the node and both sides;
 * the answer is its CUresult (CUDA_ERROR_INVALID_VALUE where the question could not be read). */
static int recapture_answer(const struct gp_reply *rep) {
    struct gp_recapture_head head;
    if (rep->outs_len != sizeof head || recv_all(&head, sizeof head) < 0) return -1;
    if (rep->bulk_len > GP_MAX_RECAPTURE_BYTES) return -1;
    unsigned char *bulk = malloc(rep->bulk_len ? rep->bulk_len : 1);
    if (!bulk || recv_all(bulk, rep->bulk_len) < 0) {
        free(bulk);
        return -1;
    }
    struct recapture_side original = {0}, recaptured = {0};
    const unsigned char *p = recapture_side_read(&original, bulk, bulk + rep->bulk_len);
    p = p ? recapture_side_read(&recaptured, p, bulk + rep->bulk_len) : NULL;
    struct gp_recapture_answer answer = {.id = head.id, .result = CUDA_ERROR_INVALID_VALUE};
    struct host_call c;
    if (p && host_call_take(head.id, &c, 0) && c.kind == GP_HOST_RECAPTURE)
        answer.result = ((CUresult(*)(void *, uint64_t, const void *, const void *, int32_t))c.fn)(
            c.data, head.node, original.params, recaptured.params, head.status);
    free(original.pointers), free(original.args), free(recaptured.pointers), free(recaptured.args), free(bulk);
    return callback_send(&answer, sizeof answer);
}

/* Connect the calling thread's connection (thread_conn) to the worker and attach it as `token`'s callback
 * connection (under conn_lock: the handshake's I/O shares buffers with the process's connection). */
static CUresult callback_attach_locked(uint64_t token) {
    CUresult r = connect_worker();
    if (r != CUDA_SUCCESS) return r;
    struct gp_in_gpCallbackAttach in = {.token = token};
    int32_t result = -1;
    if (send_frame(GP_CALL_gpCallbackAttach, GP_FLAG_WANTS_REPLY, &in, sizeof in, NULL, 0, NULL, 0) < 0 ||
        recv_reply(&result, NULL, 0, NULL, 0) < 0)
        return CUDA_ERROR_DEVICE_UNAVAILABLE;
    return result;
}

static void *callback_reader(void *arg);

/* ---- delivery connections: large copies into page-locked memory, in pieces on several connections ----
 *
 * Over TLS one connection carries what one CPU encrypts and decrypts (~1.6 GB/s on an H200 host: half a
 * 25 Gbit/s link), so as many connections as the lanes (GPUPOOL_SHIM_LANES) attach beside the callback
 * connection, each with a thread of its own landing the pieces the worker sends on it. Opened once, with
 * the callback connection, on an encrypted connection only (on this host copies go through shared
 * memory); where one cannot open, copies come whole on the callback connection as before. After the lease
 * moves to another server the old ones end with the old worker, and as many open to the new one with the
 * new callback connection (each round's connections are new memory: the old round's threads may still be
 * reading theirs until the old worker closes them). */
static struct gp_conn *delivery_conns; /* this round's */
static int n_delivery_conns;

static void *delivery_reader(void *arg) {
    thread_conn = arg;
    struct gp_reply rep;
    while (recv_all(&rep, sizeof rep) == 0) { /* copies whole, and pieces of large ones */
        if (rep.result == GP_COPY_DATA ? land_copy(&rep, 1) < 0 : rep.result != GP_COPY_PIECE || land_piece(&rep) < 0)
            break;
    }
    return NULL; /* the worker closed it (the process's connection ended, or the lease moved) */
}

/* Under conn_lock, from the callback thread once its connection is attached as `token`'s. */
static void deliveries_open_locked(uint64_t token, struct gp_conn *mine) {
    int want = lanes_wanted();
    if (!mine->ssl || want < 2) return;
    struct gp_conn *round = calloc((size_t)want, sizeof *round);
    if (!round) return;
    delivery_conns = round;
    n_delivery_conns = 0;
    CUresult failure = conn_failure;
    uint64_t ctx = conn_ctx;
    struct gp_conn *was = thread_conn;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    for (int i = 0; i < want; i++) {
        struct gp_conn *c = &round[i];
        *c = (struct gp_conn){-1, NULL, NULL};
        thread_conn = c;
        struct gp_in_gpDeliveryAttach in = {.token = token};
        int32_t result = -1;
        int ok = connect_worker() == CUDA_SUCCESS && conn_ssl &&
                 send_frame(GP_CALL_gpDeliveryAttach, GP_FLAG_WANTS_REPLY, &in, sizeof in, NULL, 0, NULL, 0) == 0 &&
                 recv_reply(&result, NULL, 0, NULL, 0) == 0 && result == 0;
        pthread_t thread;
        if (!ok || pthread_create(&thread, &attr, delivery_reader, c) != 0) {
            lane_close(c); /* an older worker refuses the call: copies come whole, as before */
            break;
        }
        n_delivery_conns++;
    }
    pthread_attr_destroy(&attr);
    thread_conn = was;
    conn_failure = failure;
    conn_ctx = ctx;
}

static void deliveries_after_fork_in_child(void) {
    /* The parent's: their threads are the parent's; the child's callback connection opens its own. */
    for (int i = 0; i < n_delivery_conns; i++)
        if (delivery_conns[i].fd >= 0) close(delivery_conns[i].fd);
    delivery_conns = NULL; /* the parent's memory, left as it is */
    n_delivery_conns = 0;
}

static void *callback_thread(void *arg) {
    uint64_t token = *(uint64_t *)arg;
    struct gp_conn *mine = callback_conn;
    thread_conn = mine;
    pthread_mutex_lock(&conn_lock);
    CUresult r = callback_attach_locked(token);
    if (r == CUDA_SUCCESS) deliveries_open_locked(token, mine);
    pthread_mutex_unlock(&conn_lock);
    pthread_mutex_lock(&host_calls_lock);
    callbacks_result = r;
    callbacks_state = r == CUDA_SUCCESS ? 2 : -1;
    pthread_cond_broadcast(&callbacks_cond);
    pthread_mutex_unlock(&host_calls_lock);
    return r == CUDA_SUCCESS ? callback_reader(mine) : NULL;
}

/* Read the callback connection `arg` until the worker closes it: host functions to run, copies landing. */
static void *callback_reader(void *arg) {
    struct gp_conn *mine = arg;
    thread_conn = mine;
    CUresult r = CUDA_SUCCESS;
    while (r == CUDA_SUCCESS) {
        struct gp_reply rep;
        uint64_t id;
        if (recv_all(&rep, sizeof rep) < 0) break;
        if (rep.result == GP_COPY_DATA) {
            if (land_copy(&rep, 1) < 0) break;
            continue;
        }
        if (rep.result == GP_COPY_PIECE) {
            if (land_piece(&rep) < 0) break;
            continue;
        }
        if (rep.result == GP_COPIES_SENT) { /* pieces on the delivery connections land before what follows */
            uint64_t sent;
            if (rep.outs_len != sizeof sent || recv_all(&sent, sizeof sent) < 0) break;
            copies_wait(sent);
            continue;
        }
        if (rep.result == GP_RECAPTURE_CALL) {
            if (recapture_answer(&rep) < 0) break;
            continue;
        }
        if (rep.outs_len != sizeof id || recv_all(&id, sizeof id) < 0) break;
        struct host_call c;
        if (host_call_take(id, &c, 0)) {
            if (c.kind == 0) ((void (*)(void *))c.fn)(c.data);
            else if (c.kind == 1) ((void (*)(uint64_t, CUresult, void *))c.fn)(c.stream, rep.result, c.data);
        }
        if (callback_send(&id, sizeof id) < 0) break; /* the function returned: the stream goes on */
    }
    /* Nothing more lands: no call waits for it — unless the lease moved and the new worker's connection
     * goes on. Decided under host_calls_lock, which a reattach holds while it replaces the connection and
     * lets copies be waited for again (the old worker closes this one at the pause, maybe before). */
    pthread_mutex_lock(&host_calls_lock);
    if (mine == callback_conn) copies_stop();
    pthread_mutex_unlock(&host_calls_lock);
    return NULL; /* the worker closed it: the process's connection is ending */
}

/* After the lease moved (moved_to, under conn_lock, on the process's connection to the new worker): where this
 * process had a callback connection, a new one to the new worker, attached before the process resumes there,
 * with a thread of its own reading it. 0 also where it had none. */
static int callbacks_reattach_locked(void) {
    pthread_mutex_lock(&host_calls_lock);
    int running = callbacks_state == 2;
    pthread_mutex_unlock(&host_calls_lock);
    if (!running) return 0;
    struct gp_out_gpCallbackToken out;
    int32_t result = -1;
    if (send_frame(GP_CALL_gpCallbackToken, GP_FLAG_WANTS_REPLY, NULL, 0, NULL, 0, NULL, 0) < 0 ||
        recv_reply(&result, &out, sizeof out, NULL, 0) < 0 || result != 0)
        return -1;
    struct gp_conn *fresh = malloc(sizeof *fresh);
    if (!fresh) return -1;
    *fresh = (struct gp_conn){-1, NULL, NULL};
    struct gp_conn *mine = thread_conn;
    thread_conn = fresh;
    CUresult r = callback_attach_locked(out.token);
    thread_conn = mine;
    pthread_t thread;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (r == CUDA_SUCCESS) {
        pthread_mutex_lock(&host_calls_lock);
        callback_conn = fresh; /* the old connection's struct stays: its thread still reads it */
        copies_resume();       /* its reader may have ended already, saying nothing more would land */
        pthread_mutex_unlock(&host_calls_lock);
        if (pthread_create(&thread, &attr, callback_reader, fresh) != 0) r = CUDA_ERROR_OUT_OF_MEMORY;
        else deliveries_open_locked(out.token, fresh); /* large copies in pieces again, to the new worker */
    }
    pthread_attr_destroy(&attr);
    if (r != CUDA_SUCCESS && callback_conn != fresh) {
        gp_tls_free(fresh->ssl);
        if (fresh->fd >= 0) close(fresh->fd);
        free(fresh);
    }
    return r == CUDA_SUCCESS ? 0 : -1;
}

CUresult gp_callbacks_start(void) {
    pthread_mutex_lock(&host_calls_lock);
    int state = callbacks_state;
    if (state == 0) callbacks_state = 1;
    pthread_mutex_unlock(&host_calls_lock);
    if (state == 0) {
        static uint64_t token;
        struct gp_out_gpCallbackToken out;
        CUresult r = gp_call(GP_CALL_gpCallbackToken, GP_FLAG_WANTS_REPLY, NULL, 0, NULL, 0, &out, sizeof out, NULL, 0);
        token = out.token;
        pthread_t thread;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (r == CUDA_SUCCESS && pthread_create(&thread, &attr, callback_thread, &token) != 0) r = CUDA_ERROR_OUT_OF_MEMORY;
        pthread_attr_destroy(&attr);
        if (r != CUDA_SUCCESS) {
            pthread_mutex_lock(&host_calls_lock);
            callbacks_result = r;
            callbacks_state = -1;
            pthread_cond_broadcast(&callbacks_cond);
            pthread_mutex_unlock(&host_calls_lock);
        }
    }
    pthread_mutex_lock(&host_calls_lock);
    while (callbacks_state == 1) pthread_cond_wait(&callbacks_cond, &host_calls_lock);
    CUresult r = callbacks_state == 2 ? CUDA_SUCCESS : callbacks_result;
    pthread_mutex_unlock(&host_calls_lock);
    return r;
}

static void callbacks_after_fork_in_child(void) {
    /* The callback thread and its connection stay with the parent; the child starts its own. */
    copies_after_fork_in_child();
    deliveries_after_fork_in_child();
    first_callback_conn = (struct gp_conn){-1, NULL, callback_conn->joined};
    callback_conn = &first_callback_conn;
    callbacks_state = 0;
    host_calls = NULL;
    pthread_mutex_init(&host_calls_lock, NULL);
    pthread_cond_init(&callbacks_cond, NULL);
}

/* ---- contexts ---------------------------------------------------------------------------------- */

uint64_t gp_ctx_current(void) { return ctx_depth ? ctx_stack[ctx_depth - 1] : 0; }

void gp_ctx_set(uint64_t ctx) {
    if (ctx_depth == 0) {
        if (ctx) ctx_stack[ctx_depth++] = ctx;
    } else if (ctx) {
        ctx_stack[ctx_depth - 1] = ctx;
    } else {
        ctx_depth--; /* cuCtxSetCurrent(NULL) unbinds the top of the stack */
    }
}

int gp_ctx_push(uint64_t ctx) {
    if (ctx_depth == (int)(sizeof ctx_stack / sizeof ctx_stack[0])) return -1;
    ctx_stack[ctx_depth++] = ctx;
    return 0;
}

uint64_t gp_ctx_pop(int *ok) {
    *ok = ctx_depth > 0;
    return ctx_depth ? ctx_stack[--ctx_depth] : 0;
}

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static struct { uint64_t ctx; int device; } ctx_devices[64];
static int n_ctx_devices;

void gp_ctx_note_device(uint64_t ctx, int device) {
    pthread_mutex_lock(&table_lock);
    int i;
    for (i = 0; i < n_ctx_devices && ctx_devices[i].ctx != ctx; i++) {
    }
    if (i < (int)(sizeof ctx_devices / sizeof ctx_devices[0])) {
        ctx_devices[i].ctx = ctx;
        ctx_devices[i].device = device;
        if (i == n_ctx_devices) n_ctx_devices++;
    }
    pthread_mutex_unlock(&table_lock);
}

/* A destroyed context: no longer known, and off the calling thread's stack (other threads' use of it
 * fails at the worker, as natively). */
void gp_ctx_forget(uint64_t ctx) {
    pthread_mutex_lock(&table_lock);
    for (int i = 0; i < n_ctx_devices; i++)
        if (ctx_devices[i].ctx == ctx) ctx_devices[i] = ctx_devices[--n_ctx_devices];
    pthread_mutex_unlock(&table_lock);
    int w = 0;
    for (int i = 0; i < ctx_depth; i++)
        if (ctx_stack[i] != ctx) ctx_stack[w++] = ctx_stack[i];
    ctx_depth = w;
}

int gp_ctx_device(uint64_t ctx, int *device) {
    int found = 0;
    pthread_mutex_lock(&table_lock);
    for (int i = 0; i < n_ctx_devices; i++) {
        if (ctx_devices[i].ctx == ctx) {
            *device = ctx_devices[i].device;
            found = 1;
        }
    }
    pthread_mutex_unlock(&table_lock);
    return found;
}

/* ---- ranges: device allocations and page-locked host memory, each a sorted array --------------- */

struct range { uint64_t base, size; unsigned flags; int owned; };
struct ranges { struct range *v; size_t n, cap; };
static struct ranges dev_ranges, host_ranges, reserved;

_Static_assert(offsetof(struct range, base) == 0, "gp_ranges_upper reads each range's base first");

static size_t ranges_upper(const struct ranges *r, uint64_t ptr) { /* first index with base > ptr */
    return gp_ranges_upper(r->v, r->n, sizeof *r->v, ptr);
}

static const struct range *ranges_find(const struct ranges *r, uint64_t ptr) {
    size_t i = ranges_upper(r, ptr);
    if (i == 0) return NULL;
    const struct range *x = &r->v[i - 1];
    return gp_range_holds(x->base, x->size, ptr) ? x : NULL;
}

static int ranges_insert(struct ranges *r, struct range x) {
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 64;
        struct range *v = realloc(r->v, cap * sizeof *v);
        if (!v) return -1;
        r->v = v;
        r->cap = cap;
    }
    size_t i = ranges_upper(r, x.base);
    if (i > 0 && r->v[i - 1].base == x.base) { /* the same base again (a reused address): replace */
        r->v[i - 1] = x;
        return 0;
    }
    memmove(&r->v[i + 1], &r->v[i], (r->n - i) * sizeof x);
    r->v[i] = x;
    r->n++;
    return 0;
}

static int ranges_remove(struct ranges *r, uint64_t base, struct range *removed) {
    size_t i = ranges_upper(r, base);
    if (i == 0 || r->v[i - 1].base != base) return -1;
    if (removed) *removed = r->v[i - 1];
    memmove(&r->v[i - 1], &r->v[i], (r->n - i) * sizeof *r->v);
    r->n--;
    return 0;
}

/* Reserve [base, base+size) of this process's address space (PROT_NONE, nothing committed) in 2 MiB
 * chunks, so no host allocation of the client can ever land on a lease's device address. Chunks stay
 * reserved until exit: pools hand the same addresses out again. */
#define CHUNK (2ull << 20)
static int reserve(uint64_t base, uint64_t size) {
    uint64_t a = base & ~(CHUNK - 1), end = (base + size + CHUNK - 1) & ~(CHUNK - 1);
    while (a < end) {
        const struct range *r = ranges_find(&reserved, a);
        if (r) {
            a = r->base + r->size;
            continue;
        }
        size_t next = ranges_upper(&reserved, a);
        uint64_t stop = next < reserved.n && reserved.v[next].base < end ? reserved.v[next].base : end;
        void *p = mmap((void *)a, stop - a, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE,
                       -1, 0);
        if (p == MAP_FAILED) return -1;
        if ((uint64_t)p != a) { /* an old kernel took the address as a hint */
            munmap(p, stop - a);
            return -1;
        }
        ranges_insert(&reserved, (struct range){a, stop - a, 0, 0});
        a = stop;
    }
    return 0;
}

/* The worker offers a range it reserved for this process (virtualize/server/_address_window.py); a range this
 * process cannot reserve (some of it is already mapped here) is passed over and another asked for. */
#define WINDOW_TRIES 8
static pthread_mutex_t window_lock = PTHREAD_MUTEX_INITIALIZER;

void gp_window_ensure(void) {
    if (__atomic_load_n(&window_state, __ATOMIC_ACQUIRE)) return;
    pthread_mutex_lock(&window_lock);
    if (!window_state) {
        int state = -1, taken = 0;
        for (int i = 0; i < WINDOW_TRIES && state < 0; i++) {
            struct gp_out_gpWindowOffer offer;
            if (gp_call(GP_CALL_gpWindowOffer, GP_FLAG_WANTS_REPLY, NULL, 0, NULL, 0, &offer, sizeof offer, NULL, 0))
                break;
            pthread_mutex_lock(&table_lock);
            int rc = reserve(offer.base, offer.size);
            pthread_mutex_unlock(&table_lock);
            if (rc != 0) {
                taken++;
                continue;
            }
            struct gp_in_gpWindowAccept accept = {.base = offer.base};
            if (gp_call(GP_CALL_gpWindowAccept, GP_FLAG_WANTS_REPLY, &accept, sizeof accept, NULL, 0, NULL, 0, NULL, 0))
                break;
            state = 1;
        }
        if (state < 0)
            gp_say("no window of device addresses could be reserved (%d offered ranges were host memory here): "
                   "each allocation's addresses are reserved as it arrives",
                   taken);
        __atomic_store_n(&window_state, state, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&window_lock);
}

int gp_dev_add(uint64_t base, uint64_t size, int owned) {
    pthread_mutex_lock(&table_lock);
    int rc = reserve(base, size ? size : 1);
    if (rc == 0 || !owned) ranges_insert(&dev_ranges, (struct range){base, size, 0, owned});
    pthread_mutex_unlock(&table_lock);
    return rc;
}

int gp_reserve_range(uint64_t base, uint64_t size) {
    pthread_mutex_lock(&table_lock);
    int rc = reserve(base, size);
    pthread_mutex_unlock(&table_lock);
    return rc;
}

void gp_dev_remove(uint64_t base) {
    pthread_mutex_lock(&table_lock);
    ranges_remove(&dev_ranges, base, NULL);
    pthread_mutex_unlock(&table_lock);
}

int gp_dev_lookup(uint64_t ptr, uint64_t *base, uint64_t *size, int *owned) {
    pthread_mutex_lock(&table_lock);
    const struct range *r = ranges_find(&dev_ranges, ptr);
    if (r) {
        if (base) *base = r->base;
        if (size) *size = r->size;
        if (owned) *owned = r->owned;
    }
    pthread_mutex_unlock(&table_lock);
    return r != NULL;
}

int gp_host_add(uint64_t base, uint64_t size, unsigned flags, int allocated) {
    pthread_mutex_lock(&table_lock);
    int rc = -1;
    const struct range *before = ranges_find(&host_ranges, base);
    size_t next = ranges_upper(&host_ranges, base);
    int overlaps = before || (next < host_ranges.n && host_ranges.v[next].base < base + size);
    if (!overlaps) rc = ranges_insert(&host_ranges, (struct range){base, size, flags, allocated});
    pthread_mutex_unlock(&table_lock);
    return rc;
}

int gp_host_remove(uint64_t base, int allocated) {
    pthread_mutex_lock(&table_lock);
    struct range r;
    int rc = -1;
    const struct range *x = ranges_find(&host_ranges, base);
    if (x && x->base == base && x->owned == allocated) rc = ranges_remove(&host_ranges, base, &r);
    pthread_mutex_unlock(&table_lock);
    return rc;
}

int gp_host_lookup(uint64_t ptr, uint64_t *base, uint64_t *size, unsigned *flags) {
    pthread_mutex_lock(&table_lock);
    const struct range *r = ranges_find(&host_ranges, ptr);
    if (r) {
        if (base) *base = r->base;
        if (size) *size = r->size;
        if (flags) *flags = r->flags;
    }
    pthread_mutex_unlock(&table_lock);
    return r != NULL;
}
