/* One process asks, another answers, over a Unix socket pair or over the command ring
 * (virtualize/common/include/gp_ring.h), as a program and its worker on one host exchange a synchronising
 * call's frame and its reply: bench/bench_ring.py compiles and runs it.
 *
 *   ring_pingpong socket|ring ROUNDS SPIN_NS REQUEST_BYTES REPLY_BYTES
 *
 * Prints the median and the 99th percentile of a round trip in µs. Both ends poll the socket (or spin on
 * the ring) for SPIN_NS before they sleep, as the shim and the worker do. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../virtualize/common/include/gp_ring.h"

enum { RING_BYTES = 1 << 20 };

static uint64_t spin_ns;

/* Exactly n bytes from the socket: polled for spin_ns, then waited for (as the shim's recv_header). */
static int sock_recv(int fd, uint8_t *p, size_t n) {
    uint64_t until = 0;
    while (n) {
        ssize_t got = recv(fd, p, n, spin_ns ? MSG_DONTWAIT : 0);
        if (got > 0) {
            p += got, n -= (size_t)got;
            continue;
        }
        if (got == 0) return -1;
        if (errno != EAGAIN && errno != EINTR) return -1;
        uint64_t now = gp_ring_now();
        if (!until) until = now + spin_ns;
        if (now >= until) {
            struct pollfd w = {fd, POLLIN, 0};
            poll(&w, 1, -1);
        }
    }
    return 0;
}

static int sock_send(int fd, const uint8_t *p, size_t n) {
    while (n) {
        ssize_t sent = send(fd, p, n, MSG_NOSIGNAL);
        if (sent < 0 && errno == EINTR) continue;
        if (sent <= 0) return -1;
        p += sent, n -= (size_t)sent;
    }
    return 0;
}

static int ring_recv_all(const struct gp_ring_end *e, uint8_t *p, size_t n) {
    while (n) {
        long got = gp_ring_recv(e, p, n, 0);
        if (got <= 0) return -1;
        p += got, n -= (size_t)got;
    }
    return 0;
}

static int cmp(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s socket|ring ROUNDS SPIN_NS REQUEST_BYTES REPLY_BYTES\n", argv[0]);
        return 2;
    }
    int ring = strcmp(argv[1], "ring") == 0;
    long rounds = atol(argv[2]);
    spin_ns = strtoull(argv[3], NULL, 10);
    size_t ask = strtoull(argv[4], NULL, 10), answer = strtoull(argv[5], NULL, 10);
    if (rounds <= 0 || !ask || !answer || ask > RING_BYTES || answer > RING_BYTES) return 2;
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != 0) return 1;
    void *map = mmap(NULL, gp_ring_bytes_total(RING_BYTES), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) return 1;
    uint8_t *buf = calloc(1, ask > answer ? ask : answer);
    struct gp_ring_end worker, client;
    gp_ring_open(&worker, map, RING_BYTES, 1, 1, pair[1]);
    gp_ring_open(&client, map, RING_BYTES, 0, 0, pair[0]);
    worker.spin_ns = client.spin_ns = spin_ns;
    pid_t child = fork();
    if (child == 0) { /* the worker: read a request, answer it, until the client is gone */
        close(pair[0]);
        for (;;) {
            if (ring ? ring_recv_all(&worker, buf, ask) : sock_recv(pair[1], buf, ask)) _exit(0);
            if (ring ? gp_ring_send(&worker, buf, answer) : sock_send(pair[1], buf, answer)) _exit(0);
        }
    }
    close(pair[1]);
    uint64_t *took = calloc((size_t)rounds, sizeof *took);
    for (long i = -rounds / 10; i < rounds; i++) { /* a tenth more first, not counted: warm */
        uint64_t t = gp_ring_now();
        if (ring ? gp_ring_send(&client, buf, ask) || ring_recv_all(&client, buf, answer)
                 : sock_send(pair[0], buf, ask) || sock_recv(pair[0], buf, answer)) {
            fprintf(stderr, "the answering process is gone\n");
            return 1;
        }
        if (i >= 0) took[i] = gp_ring_now() - t;
    }
    close(pair[0]);
    waitpid(child, NULL, 0);
    qsort(took, (size_t)rounds, sizeof *took, cmp);
    printf("%.2f %.2f\n", took[rounds / 2] / 1e3, took[rounds * 99 / 100] / 1e3);
    return 0;
}
