/* The worker's end of an encrypted data connection, in C: TLS 1.3 through the system's libssl.
 *
 * Across hosts every byte of a copy is encrypted, and in the worker's Python (ssl over memory buffers)
 * that cost about a CPU-second per GB and a round of Python per 16 KiB record, held copies to a fraction
 * of a 25 Gbit/s link, and kept the native loop (dispatch.c) off encrypted connections. Here the
 * handshake, records and socket I/O are OpenSSL's, called from C: the Python side (virtualize/
 * _native_tls.py) reads and writes through the same stream as the native loop, with the GIL let go.
 *
 * One thread may read while another writes (a callback connection carries copies out while an answer
 * is awaited): the socket is non-blocking, every OpenSSL call is made under the stream's lock, and the
 * waiting for the socket happens outside it. libssl is looked up at run time, as the shim does, so
 * nothing of OpenSSL is needed to build this. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "native.h"

#define EXPORT __attribute__((visibility("default")))

enum { SSL_ERROR_SSL = 1, SSL_ERROR_WANT_READ = 2, SSL_ERROR_WANT_WRITE = 3, SSL_ERROR_SYSCALL = 5, SSL_ERROR_ZERO_RETURN = 6 };
enum { SSL_CTRL_MODE = 33, SSL_CTRL_SET_READ_AHEAD = 41, SSL_CTRL_SET_MIN_PROTO_VERSION = 123, TLS1_3_VERSION = 0x0304 };
enum { SSL_MODE_ENABLE_PARTIAL_WRITE = 1, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER = 2, SSL_FILETYPE_PEM = 1 };
enum { BIO_CTRL_FLUSH = 11, BIO_C_SET_BUFF_SIZE = 117, BIO_FLAGS_SHOULD_RETRY = 8 };
/* A copy's records are read many per system call and written through a buffer sent in large pieces:
 * one system call per 16 KiB record each way cost about as much as the cipher. */
enum { IO_BUFFER = 256 << 10, MOST_PER_CALL = 1 << 30 };
#define SSL_OP_IGNORE_UNEXPECTED_EOF (1ull << 7) /* OpenSSL 3 */

static struct {
    const void *(*server_method)(void);
    void *(*ctx_new)(const void *);
    void (*ctx_free)(void *);
    long (*ctx_ctrl)(void *, int, long, void *);
    int (*use_chain)(void *, const char *);
    int (*use_key)(void *, const char *, int);
    int (*check_key)(const void *);
    int (*set_num_tickets)(void *, size_t);           /* 1.1.1 and later; optional */
    uint64_t (*set_options)(void *, uint64_t);        /* OpenSSL 3 (1.1's takes an unsigned long) */
    void (*set_read_buffer)(void *, size_t);          /* optional */
    void *(*ssl_new)(void *);
    int (*set_fd)(void *, int);
    int (*accept)(void *);
    int (*read)(void *, void *, int);
    int (*write)(void *, const void *, int);
    int (*get_error)(const void *, int);
    const char *(*version)(const void *);
    void (*ssl_free)(void *);
    unsigned long (*err_get)(void);
    void (*err_clear)(void);
    void (*err_string)(unsigned long, char *, size_t);
    const void *(*f_buffer)(void);
    void *(*bio_new)(const void *);
    void *(*bio_push)(void *, void *);
    long (*bio_ctrl)(void *, int, long, void *);
    int (*bio_test_flags)(const void *, int);
    int (*bio_up_ref)(void *);
    int (*bio_free)(void *);
    void *(*get_wbio)(const void *);
    void (*set0_wbio)(void *, void *);
} ossl;
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int loaded;

static void load(void) {
    static const char *const names[] = {"libssl.so.3", "libssl.so.1.1", "libssl.so"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!lib) continue;
        struct {
            void **slot;
            const char *name;
            int optional;
        } want[] = {
            {(void **)&ossl.server_method, "TLS_server_method", 0},
            {(void **)&ossl.ctx_new, "SSL_CTX_new", 0},
            {(void **)&ossl.ctx_free, "SSL_CTX_free", 0},
            {(void **)&ossl.ctx_ctrl, "SSL_CTX_ctrl", 0},
            {(void **)&ossl.use_chain, "SSL_CTX_use_certificate_chain_file", 0},
            {(void **)&ossl.use_key, "SSL_CTX_use_PrivateKey_file", 0},
            {(void **)&ossl.check_key, "SSL_CTX_check_private_key", 0},
            {(void **)&ossl.set_num_tickets, "SSL_CTX_set_num_tickets", 1},
            {(void **)&ossl.set_options, "SSL_CTX_set_options", 1},
            {(void **)&ossl.set_read_buffer, "SSL_CTX_set_default_read_buffer_len", 1},
            {(void **)&ossl.ssl_new, "SSL_new", 0},
            {(void **)&ossl.set_fd, "SSL_set_fd", 0},
            {(void **)&ossl.accept, "SSL_accept", 0},
            {(void **)&ossl.read, "SSL_read", 0},
            {(void **)&ossl.write, "SSL_write", 0},
            {(void **)&ossl.get_error, "SSL_get_error", 0},
            {(void **)&ossl.version, "SSL_get_version", 0},
            {(void **)&ossl.ssl_free, "SSL_free", 0},
            /* libcrypto's, found through libssl's dependencies */
            {(void **)&ossl.err_get, "ERR_get_error", 0},
            {(void **)&ossl.err_clear, "ERR_clear_error", 0},
            {(void **)&ossl.err_string, "ERR_error_string_n", 0},
            {(void **)&ossl.f_buffer, "BIO_f_buffer", 0},
            {(void **)&ossl.bio_new, "BIO_new", 0},
            {(void **)&ossl.bio_push, "BIO_push", 0},
            {(void **)&ossl.bio_ctrl, "BIO_ctrl", 0},
            {(void **)&ossl.bio_test_flags, "BIO_test_flags", 0},
            {(void **)&ossl.bio_up_ref, "BIO_up_ref", 0},
            {(void **)&ossl.bio_free, "BIO_free", 0},
            {(void **)&ossl.get_wbio, "SSL_get_wbio", 0},
            {(void **)&ossl.set0_wbio, "SSL_set0_wbio", 0},
        };
        int ok = 1;
        for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
            *want[k].slot = dlsym(lib, want[k].name);
            if (!*want[k].slot && !want[k].optional) ok = 0;
        }
        if (ok) {
            loaded = 1;
            return;
        }
        memset(&ossl, 0, sizeof ossl);
        dlclose(lib);
    }
}

static void why_from_openssl(char *why, size_t why_len, const char *what) {
    unsigned long e = ossl.err_get ? ossl.err_get() : 0;
    char detail[200] = "";
    if (e) ossl.err_string(e, detail, sizeof detail);
    snprintf(why, why_len, "%s%s%s", what, e ? ": " : "", detail);
}

/* A server context for the worker's certificate and key (PEM files): NULL and `why` where libssl is
 * missing or the files do not load. */
EXPORT void *gpt_context_new(const char *cert, const char *key, char *why, size_t why_len) {
    pthread_once(&load_once, load);
    if (!loaded) {
        snprintf(why, why_len, "cannot load the system's OpenSSL (libssl.so.3 or .so.1.1)");
        return NULL;
    }
    void *ctx = ossl.ctx_new(ossl.server_method());
    if (!ctx) {
        why_from_openssl(why, why_len, "cannot make a TLS context");
        return NULL;
    }
    if (ossl.ctx_ctrl(ctx, SSL_CTRL_SET_MIN_PROTO_VERSION, TLS1_3_VERSION, NULL) != 1 ||
        ossl.use_chain(ctx, cert) != 1 || ossl.use_key(ctx, key, SSL_FILETYPE_PEM) != 1 || ossl.check_key(ctx) != 1) {
        why_from_openssl(why, why_len, "cannot load the worker's certificate and key");
        ossl.ctx_free(ctx);
        return NULL;
    }
    /* Nobody resumes a session (each connection proves the lease secret anew): send no tickets. */
    if (ossl.set_num_tickets) ossl.set_num_tickets(ctx, 0);
    /* A client that closes its socket without TLS's goodbye has ended the stream, not broken it (the
     * frames say where each call ends); OpenSSL 1.1 reads it that way already. */
    if (ossl.set_options) ossl.set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
    /* A write may return after part of a large buffer (the socket is non-blocking) and continue from a
     * moved pointer. */
    ossl.ctx_ctrl(ctx, SSL_CTRL_SET_READ_AHEAD, 1, NULL);
    if (ossl.set_read_buffer) ossl.set_read_buffer(ctx, IO_BUFFER);
    ossl.ctx_ctrl(ctx, SSL_CTRL_MODE, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER, NULL);
    return ctx;
}

EXPORT void gpt_context_free(void *ctx) {
    if (ctx) ossl.ctx_free(ctx);
}

struct gpt_stream {
    pthread_mutex_t lock;
    void *ssl;
    int fd;
    int timeout_ms; /* each wait for the socket; -1: none */
};

static uint64_t now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000u + (uint64_t)t.tv_nsec / 1000000u;
}

/* Wait for the socket: 0 ready, -1 failed, -2 not within wait_ms. */
static int wait_for(int fd, short events, int wait_ms) {
    uint64_t until = wait_ms > 0 ? now_ms() + (uint64_t)wait_ms : 0;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        int left = wait_ms < 0 ? -1 : wait_ms == 0 ? 0 : (int)(until > now_ms() ? until - now_ms() : 0);
        int r = poll(&p, 1, left);
        if (r > 0) return 0; /* readable, writable, or an error the next OpenSSL call reports */
        if (r == 0) return -2;
        if (errno != EINTR) return -1;
    }
}

/* One OpenSSL call under the lock: its result, and the error class when it did not succeed. */
#define UNDER_LOCK(s, call, result, error)                                                                   \
    do {                                                                                                     \
        pthread_mutex_lock(&(s)->lock);                                                                      \
        ossl.err_clear();                                                                                    \
        (result) = (call);                                                                                   \
        (error) = (result) > 0 ? 0 : ossl.get_error((s)->ssl, (result));                                     \
        pthread_mutex_unlock(&(s)->lock);                                                                    \
    } while (0)

/* Records written into a buffer on the socket, sent when it fills or is flushed (gpt_send_all). */
static void buffer_writes(void *ssl) {
    void *socket_bio = ossl.get_wbio(ssl), *buffer = ossl.bio_new(ossl.f_buffer());
    int for_writing = 1;
    if (buffer && ossl.bio_ctrl(buffer, BIO_C_SET_BUFF_SIZE, IO_BUFFER, &for_writing) == 1 &&
        ossl.bio_up_ref(socket_bio) == 1) {
        ossl.bio_push(buffer, socket_bio);
        ossl.set0_wbio(ssl, buffer);
    } else if (buffer) {
        ossl.bio_free(buffer); /* written record by record */
    }
}

/* The server's handshake on an accepted connection (which becomes non-blocking); NULL and `why` if it
 * fails or the client says nothing within timeout_ms. The caller keeps and closes the socket. */
EXPORT struct gpt_stream *gpt_accept(void *ctx, int fd, int timeout_ms, char *why, size_t why_len) {
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
        snprintf(why, why_len, "cannot make the socket non-blocking: %s", strerror(errno));
        return NULL;
    }
    struct gpt_stream *s = calloc(1, sizeof *s);
    if (!s || !(s->ssl = ossl.ssl_new(ctx)) || ossl.set_fd(s->ssl, fd) != 1) {
        why_from_openssl(why, why_len, "cannot start TLS");
        if (s && s->ssl) ossl.ssl_free(s->ssl);
        free(s);
        return NULL;
    }
    pthread_mutex_init(&s->lock, NULL);
    s->fd = fd;
    s->timeout_ms = timeout_ms;
    for (;;) {
        int r, e;
        UNDER_LOCK(s, ossl.accept(s->ssl), r, e);
        if (r == 1) {
            buffer_writes(s->ssl);
            return s;
        }
        int w = e == SSL_ERROR_WANT_READ ? wait_for(fd, POLLIN, timeout_ms)
                : e == SSL_ERROR_WANT_WRITE ? wait_for(fd, POLLOUT, timeout_ms)
                                            : -1;
        if (w) {
            if (w == -2) snprintf(why, why_len, "no TLS handshake within %d ms", timeout_ms);
            else if (e == SSL_ERROR_ZERO_RETURN || (e == SSL_ERROR_SYSCALL && !r))
                snprintf(why, why_len, "the peer closed the connection");
            else why_from_openssl(why, why_len, "TLS handshake failed");
            ossl.ssl_free(s->ssl);
            pthread_mutex_destroy(&s->lock);
            free(s);
            return NULL;
        }
    }
}

long gpt_recv(struct gpt_stream *s, void *buf, size_t n, int wait_ms) {
    if (!n) return 0;
    int want = n > MOST_PER_CALL ? MOST_PER_CALL : (int)n;
    if (wait_ms < 0) wait_ms = s->timeout_ms;
    for (;;) {
        int r, e;
        UNDER_LOCK(s, ossl.read(s->ssl, buf, want), r, e);
        if (r > 0) return r;
        int w;
        switch (e) {
        case SSL_ERROR_WANT_READ: w = wait_for(s->fd, POLLIN, wait_ms); break;
        case SSL_ERROR_WANT_WRITE: w = wait_for(s->fd, POLLOUT, wait_ms); break;
        case SSL_ERROR_ZERO_RETURN: return 0;                 /* close_notify */
        case SSL_ERROR_SYSCALL: return r == 0 ? 0 : -1; /* closed without a goodbye, or reset */
        default: return -1;
        }
        if (w) return w;
    }
}

/* n bytes into records, kept in the write buffer (sent as it fills): 0, or -1 failed. */
static int write_records(struct gpt_stream *s, const void *p, size_t n) {
    const uint8_t *at = p;
    while (n) {
        int r, e, chunk = n > MOST_PER_CALL ? MOST_PER_CALL : (int)n;
        UNDER_LOCK(s, ossl.write(s->ssl, at, chunk), r, e);
        if (r > 0) {
            at += r, n -= (size_t)r;
            continue;
        }
        int w = e == SSL_ERROR_WANT_WRITE ? wait_for(s->fd, POLLOUT, s->timeout_ms)
                : e == SSL_ERROR_WANT_READ ? wait_for(s->fd, POLLIN, s->timeout_ms)
                                           : -1;
        if (w) return -1;
    }
    return 0;
}

/* What the write buffer holds, out: 0, or -1 failed. */
static int flush_records(struct gpt_stream *s) {
    for (;;) {
        pthread_mutex_lock(&s->lock);
        void *wbio = ossl.get_wbio(s->ssl);
        long r = ossl.bio_ctrl(wbio, BIO_CTRL_FLUSH, 0, NULL);
        int again = r <= 0 && ossl.bio_test_flags(wbio, BIO_FLAGS_SHOULD_RETRY);
        pthread_mutex_unlock(&s->lock);
        if (r > 0) return 0;
        if (!again || wait_for(s->fd, POLLOUT, s->timeout_ms)) return -1;
    }
}

EXPORT long gpt_read(struct gpt_stream *s, void *buf, uint64_t n) { return gpt_recv(s, buf, n, -1); }

/* All n bytes (a copy's bulk): 1, 0 if the stream ended first, -1 failed, -2 timed out. */
EXPORT int gpt_read_all(struct gpt_stream *s, void *buf, uint64_t n) {
    uint8_t *at = buf;
    while (n) {
        long got = gpt_recv(s, at, n, -1);
        if (got <= 0) return got == 0 ? 0 : (int)got;
        at += got, n -= (uint64_t)got;
    }
    return 1;
}

int gpt_send_all(struct gpt_stream *s, const void *p, size_t n) {
    return write_records(s, p, n) < 0 ? -1 : flush_records(s);
}

EXPORT int gpt_write(struct gpt_stream *s, const void *p, uint64_t n) { return gpt_send_all(s, p, n); }

/* Several pieces (a frame's header, head and bytes; several frames) sent with one flush: the peer wakes
 * once for them, not once a piece. */
EXPORT int gpt_write_many(struct gpt_stream *s, const void *const *parts, const uint64_t *lens, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        if (lens[i] && write_records(s, parts[i], lens[i]) < 0) return -1;
    return flush_records(s);
}

EXPORT void gpt_set_timeout(struct gpt_stream *s, int timeout_ms) { s->timeout_ms = timeout_ms; }

EXPORT const char *gpt_version(struct gpt_stream *s) { return ossl.version(s->ssl); }

EXPORT void gpt_free(struct gpt_stream *s) {
    if (!s) return;
    ossl.ssl_free(s->ssl);
    pthread_mutex_destroy(&s->lock);
    free(s);
}
