/* gpupool's libcuda.so.1, part 5: the data connection's cryptography, from the system's OpenSSL.
 *
 * The shim proves it holds the lease secret with HMAC-SHA256 over both ends' nonces and checks the
 * worker's proof the same way (virtualize/common/_wire.py). libcrypto is loaded when the first connection is
 * made, not linked: the shim builds without OpenSSL's headers and loads wherever libcrypto 3 or 1.1 is
 * installed (every mainstream Linux distribution, conda, the CUDA containers). When the connection leaves
 * this host it runs over TLS 1.3 (libssl), and the worker must show the certificate whose SHA-256 the
 * pool server gave with the lease. */
#define _GNU_SOURCE
#include "shim.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/uio.h>

typedef const void *(*evp_md_fn)(void);
typedef unsigned char *(*hmac_fn)(const void *md, const void *key, int key_len, const unsigned char *data,
                                  size_t data_len, unsigned char *out, unsigned int *out_len);
typedef int (*memcmp_fn)(const void *a, const void *b, size_t len);

static pthread_once_t crypto_once = PTHREAD_ONCE_INIT;
static evp_md_fn evp_sha256;
static hmac_fn hmac_oneshot;
static memcmp_fn crypto_memcmp;

static void load_crypto(void) {
    static const char *const names[] = {"libcrypto.so.3", "libcrypto.so.1.1", "libcrypto.so"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!lib) continue;
        evp_sha256 = (evp_md_fn)dlsym(lib, "EVP_sha256");
        hmac_oneshot = (hmac_fn)dlsym(lib, "HMAC");
        crypto_memcmp = (memcmp_fn)dlsym(lib, "CRYPTO_memcmp");
        if (evp_sha256 && hmac_oneshot && crypto_memcmp) return;
        dlclose(lib);
    }
    evp_sha256 = NULL;
}

int gp_auth_ready(void) {
    pthread_once(&crypto_once, load_crypto);
    return evp_sha256 != NULL;
}

int gp_auth_nonce(unsigned char *out, size_t len) {
    size_t got = 0;
    while (got < len) {
        ssize_t n = getrandom(out + got, len - got, 0);
        if (n < 0) return -1;
        got += (size_t)n;
    }
    return 0;
}

int gp_auth_proof(const char *secret, const char *label, const unsigned char *first, const unsigned char *second,
                  unsigned char out[GP_PROOF_BYTES]) {
    unsigned char data[64 + 2 * GP_NONCE_BYTES];
    size_t label_len = strlen(label);
    if (!gp_auth_ready() || label_len > 64) return -1;
    memcpy(data, label, label_len);
    memcpy(data + label_len, first, GP_NONCE_BYTES);
    memcpy(data + label_len + GP_NONCE_BYTES, second, GP_NONCE_BYTES);
    unsigned int out_len = 0;
    if (!hmac_oneshot(evp_sha256(), secret, (int)strlen(secret), data, label_len + 2 * GP_NONCE_BYTES, out, &out_len))
        return -1;
    return out_len == GP_PROOF_BYTES ? 0 : -1;
}

int gp_auth_equal(const unsigned char *a, const unsigned char *b, size_t len) {
    return gp_auth_ready() && crypto_memcmp(a, b, len) == 0;
}

/* ---- TLS 1.3 to a worker whose certificate the lease answer pinned (libssl, loaded at first use) ----- */

typedef const void *(*method_fn)(void);
typedef void *(*ctx_new_fn)(const void *method);
typedef long (*ctx_ctrl_fn)(void *ctx, int cmd, long larg, void *parg);
typedef void *(*ssl_new_fn)(void *ctx);
typedef int (*ssl_int_fn)(void *ssl);
typedef int (*ssl_set_fd_fn)(void *ssl, int fd);
typedef int (*ssl_io_fn)(void *ssl, void *buf, int len);
typedef int (*ssl_get_error_fn)(const void *ssl, int ret);
typedef void *(*peer_cert_fn)(const void *ssl);
typedef int (*x509_digest_fn)(const void *cert, const void *md, unsigned char *out, unsigned int *len);
typedef void (*free_fn)(void *);
typedef unsigned long (*err_get_fn)(void);
typedef void (*err_string_fn)(unsigned long e, char *buf, size_t len);

#define SSL_CTRL_SET_MIN_PROTO_VERSION 123
#define SSL_CTRL_SET_READ_AHEAD 41
#define BIO_CTRL_FLUSH 11
#define BIO_C_SET_BUFF_SIZE 117
#define TLS1_3_VERSION 0x0304
/* A copy's records: read many per system call, written through a buffer sent in large pieces (one
 * system call per 16 KiB record each way held a copy to about a core's worth of system calls). */
#define TLS_IO_BUFFER (256 << 10)
#define SSL_ERROR_WANT_READ 2
#define SSL_ERROR_WANT_WRITE 3
#define SSL_ERROR_ZERO_RETURN 6

static pthread_once_t tls_once = PTHREAD_ONCE_INIT;
static struct {
    method_fn client_method;
    ctx_new_fn ctx_new;
    ctx_ctrl_fn ctx_ctrl;
    ssl_new_fn ssl_new;
    ssl_set_fd_fn set_fd;
    ssl_int_fn connect;
    ssl_io_fn read, write;
    ssl_get_error_fn get_error;
    peer_cert_fn peer_cert;
    x509_digest_fn digest;
    free_fn x509_free, ssl_free;
    err_get_fn err_get;
    err_string_fn err_string;
    /* optional: the buffering (GPUPOOL_SHIM_TLS_BUFFER=0 leaves it off) */
    void (*set_read_buffer)(void *ctx, size_t len);
    const void *(*f_buffer)(void);
    void *(*bio_new)(const void *method);
    void *(*bio_push)(void *bio, void *next);
    long (*bio_ctrl)(void *bio, int cmd, long larg, void *parg);
    int (*bio_up_ref)(void *bio);
    int (*bio_free)(void *bio);
    void *(*get_wbio)(const void *ssl);
    void (*set0_wbio)(void *ssl, void *bio);
    int buffered;
    void *ctx;
    int (*has_pending)(const void *ssl); /* SSL_has_pending (OpenSSL 1.1.0 and later) */
} tls;

static void load_tls(void) {
    static const char *const names[] = {"libssl.so.3", "libssl.so.1.1", "libssl.so"};
    if (!gp_auth_ready()) return;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!lib) continue;
        tls.client_method = (method_fn)dlsym(lib, "TLS_client_method");
        tls.ctx_new = (ctx_new_fn)dlsym(lib, "SSL_CTX_new");
        tls.ctx_ctrl = (ctx_ctrl_fn)dlsym(lib, "SSL_CTX_ctrl");
        tls.ssl_new = (ssl_new_fn)dlsym(lib, "SSL_new");
        tls.set_fd = (ssl_set_fd_fn)dlsym(lib, "SSL_set_fd");
        tls.connect = (ssl_int_fn)dlsym(lib, "SSL_connect");
        tls.read = (ssl_io_fn)dlsym(lib, "SSL_read");
        tls.write = (ssl_io_fn)dlsym(lib, "SSL_write");
        tls.get_error = (ssl_get_error_fn)dlsym(lib, "SSL_get_error");
        tls.peer_cert = (peer_cert_fn)dlsym(lib, "SSL_get1_peer_certificate"); /* OpenSSL 3 */
        if (!tls.peer_cert) tls.peer_cert = (peer_cert_fn)dlsym(lib, "SSL_get_peer_certificate"); /* 1.1 */
        tls.ssl_free = (free_fn)dlsym(lib, "SSL_free");
        /* libcrypto's, found through libssl's dependencies */
        tls.digest = (x509_digest_fn)dlsym(lib, "X509_digest");
        tls.x509_free = (free_fn)dlsym(lib, "X509_free");
        tls.err_get = (err_get_fn)dlsym(lib, "ERR_get_error");
        tls.err_string = (err_string_fn)dlsym(lib, "ERR_error_string_n");
        tls.set_read_buffer = (void (*)(void *, size_t))dlsym(lib, "SSL_CTX_set_default_read_buffer_len");
        tls.has_pending = (int (*)(const void *))dlsym(lib, "SSL_has_pending");
        tls.f_buffer = (const void *(*)(void))dlsym(lib, "BIO_f_buffer");
        tls.bio_new = (void *(*)(const void *))dlsym(lib, "BIO_new");
        tls.bio_push = (void *(*)(void *, void *))dlsym(lib, "BIO_push");
        tls.bio_ctrl = (long (*)(void *, int, long, void *))dlsym(lib, "BIO_ctrl");
        tls.bio_up_ref = (int (*)(void *))dlsym(lib, "BIO_up_ref");
        tls.bio_free = (int (*)(void *))dlsym(lib, "BIO_free");
        tls.get_wbio = (void *(*)(const void *))dlsym(lib, "SSL_get_wbio");
        tls.set0_wbio = (void (*)(void *, void *))dlsym(lib, "SSL_set0_wbio");
        const char *buffer_env = getenv("GPUPOOL_SHIM_TLS_BUFFER");
        tls.buffered = !(buffer_env && !strcmp(buffer_env, "0")) && tls.set_read_buffer && tls.f_buffer &&
                       tls.bio_new && tls.bio_push && tls.bio_ctrl && tls.bio_up_ref && tls.bio_free && tls.get_wbio &&
                       tls.set0_wbio;
        if (tls.client_method && tls.ctx_new && tls.ctx_ctrl && tls.ssl_new && tls.set_fd && tls.connect && tls.read &&
            tls.write && tls.get_error && tls.peer_cert && tls.ssl_free && tls.digest && tls.x509_free && tls.err_get &&
            tls.err_string) {
            tls.ctx = tls.ctx_new(tls.client_method());
            /* The peer is checked by its pinned fingerprint below, not by a CA: the default of no
             * verification during the handshake is what that needs. */
            if (tls.ctx && tls.ctx_ctrl(tls.ctx, SSL_CTRL_SET_MIN_PROTO_VERSION, TLS1_3_VERSION, NULL) == 1) {
                if (tls.buffered) {
                    tls.ctx_ctrl(tls.ctx, SSL_CTRL_SET_READ_AHEAD, 1, NULL);
                    tls.set_read_buffer(tls.ctx, TLS_IO_BUFFER);
                }
                return;
            }
        }
        dlclose(lib);
    }
    tls.ctx = NULL;
}

static void tls_error(char *why, size_t why_len, const char *what) {
    unsigned long e = tls.err_get ? tls.err_get() : 0;
    char detail[200] = "";
    if (e) tls.err_string(e, detail, sizeof detail);
    snprintf(why, why_len, "%s%s%s", what, e ? ": " : "", detail);
}

void *gp_tls_connect(int fd, const char *pin_hex, char *why, size_t why_len) {
    pthread_once(&tls_once, load_tls);
    if (!tls.ctx) {
        snprintf(why, why_len, "cannot load the system's OpenSSL (libssl.so.3 or .so.1.1)");
        return NULL;
    }
    void *ssl = tls.ssl_new(tls.ctx);
    if (!ssl || tls.set_fd(ssl, fd) != 1 || tls.connect(ssl) != 1) {
        tls_error(why, why_len, "TLS handshake failed");
        if (ssl) tls.ssl_free(ssl);
        return NULL;
    }
    unsigned char md[32];
    unsigned int md_len = 0;
    void *cert = tls.peer_cert(ssl);
    int ok = cert && tls.digest(cert, evp_sha256(), md, &md_len) == 1 && md_len == sizeof md;
    if (cert) tls.x509_free(cert);
    char hex[65];
    for (unsigned i = 0; ok && i < sizeof md; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
    if (!ok || strlen(pin_hex) != 64 || strncasecmp(hex, pin_hex, 64) != 0) {
        snprintf(why, why_len, "its TLS certificate is not the one the pool server gave for this lease");
        tls.ssl_free(ssl);
        return NULL;
    }
    if (tls.buffered) { /* records written into a buffer on the socket, sent when full or flushed */
        void *socket_bio = tls.get_wbio(ssl), *buffer = tls.bio_new(tls.f_buffer());
        int for_writing = 1;
        if (buffer && tls.bio_ctrl(buffer, BIO_C_SET_BUFF_SIZE, TLS_IO_BUFFER, &for_writing) == 1 &&
            tls.bio_up_ref(socket_bio) == 1) {
            tls.bio_push(buffer, socket_bio);
            tls.set0_wbio(ssl, buffer);
        } else if (buffer) {
            tls.bio_free(buffer); /* written record by record, as without the buffer */
        }
    }
    return ssl;
}

/* len bytes into records (in the write buffer when there is one, sent as it fills): 0, or -1. */
static int write_records(void *ssl, const void *buf, size_t len) {
    const char *p = buf;
    while (len > 0) {
        int n = tls.write(ssl, (void *)p, len > (1u << 30) ? (1 << 30) : (int)len);
        if (n <= 0) {
            int e = tls.get_error(ssl, n);
            if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) continue;
            errno = EPIPE;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int flush_records(void *ssl) {
    if (tls.buffered && tls.bio_ctrl(tls.get_wbio(ssl), BIO_CTRL_FLUSH, 0, NULL) <= 0) { /* all of it out */
        errno = EPIPE;
        return -1;
    }
    return 0;
}

int gp_tls_write(void *ssl, const void *buf, size_t len) {
    return write_records(ssl, buf, len) < 0 ? -1 : flush_records(ssl);
}

/* A frame's pieces (its header, arguments and bulk) one after the other, flushed once: the worker's reader
 * wakes once for the frame, not for a header sent on its own. */
int gp_tls_writev(void *ssl, const struct iovec *iov, int n) {
    for (int i = 0; i < n; i++)
        if (iov[i].iov_len && write_records(ssl, iov[i].iov_base, iov[i].iov_len) < 0) return -1;
    return flush_records(ssl);
}

long gp_tls_read(void *ssl, void *buf, size_t len) {
    for (;;) {
        int n = tls.read(ssl, buf, len > (1u << 30) ? (1 << 30) : (int)len);
        if (n > 0) return n;
        int e = tls.get_error(ssl, n);
        if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) continue;
        if (e == SSL_ERROR_ZERO_RETURN) return 0;
        if (!errno) errno = ECONNRESET;
        return -1;
    }
}

int gp_tls_holds(const void *ssl) { return tls.has_pending && tls.has_pending(ssl) == 1; }

void gp_tls_free(void *ssl) {
    if (ssl && tls.ssl_free) tls.ssl_free(ssl);
}
