/* A stand-in for the server's libnccl.so.2, for tests without a GPU: the worker loads it
 * (GPUPOOL_WORKER_NCCL_LIBRARY) and calls it as it calls NCCL, with the host executor's memory as "device"
 * memory. It does the few calls tests/test_nccl_forward.py uses, over TCP between the ranks' processes,
 * as NCCL's socket transport would: the unique id names rank 0's listening address, every other rank
 * connects to it, and rank 0 reduces and sends back (a star). Each connection and each collective is logged
 * to $GPUPOOL_STANDIN_NCCL_LOG with the process that made it, so the test can tell that workers, not
 * clients, talked to each other. Built by the test with the system's C compiler. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define MAX_RANKS 64
enum { ok, cuda_error, system_error, internal_error, invalid_argument, invalid_usage };
typedef struct { char internal[128]; } unique_id;
struct comm { int nranks, rank, fds[MAX_RANKS]; };
static const int element_bytes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
static int roots[16]; /* listening sockets made by ncclGetUniqueId, by slot; 0: free */

static void logline(const char *what, int fd) {
    const char *path = getenv("GPUPOOL_STANDIN_NCCL_LOG");
    if (!path) return;
    char cmd[512] = "", local[64] = "?", peer[64] = "?";
    int f = open("/proc/self/cmdline", O_RDONLY);
    if (f >= 0) {
        ssize_t n = read(f, cmd, sizeof cmd - 1);
        close(f);
        for (ssize_t i = 0; i < n - 1; i++) if (!cmd[i]) cmd[i] = ' ';
    }
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    if (fd >= 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        snprintf(local, sizeof local, "%s:%d", inet_ntoa(a.sin_addr), ntohs(a.sin_port));
    len = sizeof a;
    if (fd >= 0 && getpeername(fd, (struct sockaddr *)&a, &len) == 0)
        snprintf(peer, sizeof peer, "%s:%d", inet_ntoa(a.sin_addr), ntohs(a.sin_port));
    char line[1024];
    int n = snprintf(line, sizeof line, "%s pid=%d local=%s peer=%s cmd=%s\n", what, (int)getpid(), local, peer, cmd);
    f = open(path, O_WRONLY | O_APPEND | O_CREAT, 0600);
    if (f >= 0) {
        if (write(f, line, (size_t)n) < 0) perror("stand-in NCCL log");
        close(f);
    }
}

static int send_all(int fd, const void *p, size_t n) {
    for (const char *c = p; n;) {
        ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
        if (k <= 0) return -1;
        c += k, n -= (size_t)k;
    }
    return 0;
}

static int recv_all(int fd, void *p, size_t n) {
    for (char *c = p; n;) {
        ssize_t k = recv(fd, c, n, 0);
        if (k <= 0) return -1;
        c += k, n -= (size_t)k;
    }
    return 0;
}

EXPORT int ncclGetVersion(int *version) { *version = 23007; return ok; }

EXPORT int ncclGetUniqueId(unique_id *id) {
    int fd = socket(AF_INET, SOCK_STREAM, 0), slot = 0;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, MAX_RANKS) ||
        getsockname(fd, (struct sockaddr *)&a, &len))
        return system_error;
    while (slot < 16 && roots[slot]) slot++;
    if (slot == 16) return internal_error;
    roots[slot] = fd;
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "standin %d 127.0.0.1 %d", slot, ntohs(a.sin_port));
    logline("listen", fd);
    return ok;
}

EXPORT int ncclCommInitRank(struct comm **out, int nranks, unique_id id, int rank) {
    int slot, port;
    char host[32];
    if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks) return invalid_argument;
    if (sscanf(id.internal, "standin %d %31s %d", &slot, host, &port) != 3) return invalid_argument;
    struct comm *c = calloc(1, sizeof *c);
    c->nranks = nranks, c->rank = rank;
    if (rank == 0) {
        if (slot < 0 || slot >= 16 || !roots[slot]) return invalid_usage; /* the id was made elsewhere */
        for (int i = 1; i < nranks; i++) {
            int fd = accept(roots[slot], NULL, NULL), peer = -1;
            if (fd < 0 || recv_all(fd, &peer, sizeof peer) || peer < 1 || peer >= nranks) return system_error;
            c->fds[peer] = fd;
            logline("accepted", fd);
        }
        close(roots[slot]);
        roots[slot] = 0;
    } else {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        inet_pton(AF_INET, host, &a.sin_addr);
        if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) || send_all(fd, &rank, sizeof rank)) return system_error;
        c->fds[0] = fd;
        logline("connected", fd);
    }
    *out = c;
    return ok;
}

EXPORT int ncclCommInitRankConfig(struct comm **out, int nranks, unique_id id, int rank, void *config) {
    (void)config;
    return ncclCommInitRank(out, nranks, id, rank);
}

static void reduce(void *acc, const void *in, size_t count, int type, int op) {
#define REDUCE(T)                                                                                              \
    for (size_t i = 0; i < count; i++) {                                                                       \
        T *a = (T *)acc + i, b = ((const T *)in)[i];                                                           \
        *a = op == 0 ? *a + b : op == 1 ? *a * b : op == 2 ? (*a > b ? *a : b) : (*a < b ? *a : b);            \
    }
    switch (type) {
    case 2: REDUCE(int32_t) break;
    case 4: REDUCE(int64_t) break;
    case 7: REDUCE(float) break;
    case 8: REDUCE(double) break;
    }
#undef REDUCE
}

EXPORT int ncclAllReduce(const void *send, void *recv, size_t count, int type, int op, struct comm *c, void *stream) {
    (void)stream;
    if (type != 2 && type != 4 && type != 7 && type != 8) return invalid_argument;
    if (op < 0 || op > 3) return invalid_argument;
    size_t bytes = count * (size_t)element_bytes[type];
    if (c->rank == 0) {
        void *got = malloc(bytes ? bytes : 1);
        memmove(recv, send, bytes);
        for (int r = 1; r < c->nranks; r++) {
            if (recv_all(c->fds[r], got, bytes)) return system_error;
            reduce(recv, got, count, type, op);
        }
        free(got);
        for (int r = 1; r < c->nranks; r++)
            if (send_all(c->fds[r], recv, bytes)) return system_error;
    } else if (send_all(c->fds[0], send, bytes) || recv_all(c->fds[0], recv, bytes)) {
        return system_error;
    }
    char what[64];
    snprintf(what, sizeof what, "allreduce bytes=%zu", bytes);
    logline(what, c->fds[c->rank == 0 ? 1 : 0]);
    return ok;
}

EXPORT int ncclBroadcast(const void *send, void *recv, size_t count, int type, int root, struct comm *c, void *stream) {
    (void)stream;
    if (type < 0 || type > 11 || root < 0 || root >= c->nranks) return invalid_argument;
    size_t bytes = count * (size_t)element_bytes[type];
    if (c->rank == root) memmove(recv, send, bytes);
    if (c->rank == 0) {
        if (root != 0 && recv_all(c->fds[root], recv, bytes)) return system_error;
        for (int r = 1; r < c->nranks; r++)
            if (r != root && send_all(c->fds[r], recv, bytes)) return system_error;
    } else if (c->rank == root) {
        if (send_all(c->fds[0], recv, bytes)) return system_error;
    } else if (recv_all(c->fds[0], recv, bytes)) {
        return system_error;
    }
    return ok;
}

static int end(struct comm *c) {
    for (int r = 0; r < c->nranks; r++) if (c->fds[r] > 0) close(c->fds[r]);
    free(c);
    return ok;
}
EXPORT int ncclCommDestroy(struct comm *c) { return end(c); }
EXPORT int ncclCommAbort(struct comm *c) { logline("aborted", -1); return end(c); }
EXPORT int ncclCommCount(struct comm *c, int *n) { *n = c->nranks; return ok; }
EXPORT int ncclCommUserRank(struct comm *c, int *r) { *r = c->rank; return ok; }
EXPORT int ncclCommGetAsyncError(struct comm *c, int *e) { (void)c; *e = ok; return ok; }
EXPORT int ncclGroupStart(void) { return ok; }
EXPORT int ncclGroupEnd(void) { return ok; }
EXPORT const char *ncclGetLastError(void *c) { (void)c; return "stand-in NCCL"; }
