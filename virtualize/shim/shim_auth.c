/* gpupool's libcuda.so.1, part 5: the handshake's cryptography, from the system's OpenSSL.
 *
 * The shim proves it holds the lease secret with HMAC-SHA256 over both ends' nonces and checks the
 * worker's proof the same way (virtualize/_wire.py). libcrypto is loaded when the first connection is
 * made, not linked: the shim builds without OpenSSL's headers and loads wherever libcrypto 3 or 1.1 is
 * installed (every mainstream Linux distribution, conda, the CUDA containers). */
#define _GNU_SOURCE
#include "shim.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/random.h>

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
