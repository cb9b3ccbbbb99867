/* gpupool's libcuda.so.1, part 4: answers the client already has.
 *
 * The CUDA runtime asks the driver the same questions thousands of times a second (a primary
 * context's state before each launch, a kernel's attributes, the version); each forwarded question
 * costs a round trip to the worker. Calls marked `memo` in virtualize/_calls.py keep their answer
 * here, keyed by the call, its in-arguments and (where the answer depends on it) the current
 * context, until a call that can change it is made: each memo group has a generation that those
 * calls bump before they are sent and after they return (gp_call2), and an answer is kept only if
 * its group's generation did not move while it was being fetched. A group can also be paused (a
 * stream capture is under way: a capture's status changes with calls that are not its own).
 * Setters marked `memo` (no outs) skip a repeat of the identical call that succeeded in the same
 * generation. The store is a fixed-size table: a collision overwrites, it never answers wrongly. */
#include "shim.h"

#include <pthread.h>
#include <stdlib.h>

#define MEMO_SLOTS 8192u
#define MEMO_KEY_BYTES 48u
#define MEMO_OUT_BYTES 24u

struct memo_entry {
    uint64_t generation; /* 0: empty */
    uint32_t call;
    uint32_t key_len;
    unsigned char key[MEMO_KEY_BYTES];
    unsigned char out[MEMO_OUT_BYTES];
};

static struct memo_entry memo_table[MEMO_SLOTS];
static pthread_mutex_t memo_lock = PTHREAD_MUTEX_INITIALIZER;
/* Generations start at 1 so that an empty entry (0) never matches. */
static uint64_t memo_generations[GP_N_MEMO_GROUPS] = {[0 ... GP_N_MEMO_GROUPS - 1] = 1};
static int memo_paused[GP_N_MEMO_GROUPS];
static int memo_off; /* GPUPOOL_SHIM_MEMO=0: for telling a kept answer's fault from the worker's */

__attribute__((constructor)) static void memo_init(void) {
    const char *memo = getenv(GP_ENV_MEMO);
    memo_off = memo && strcmp(memo, "0") == 0;
}

static uint32_t memo_hash(uint32_t call, const unsigned char *key, uint32_t len) {
    uint32_t h = 2166136261u ^ call;
    for (uint32_t i = 0; i < len; i++) h = (h ^ key[i]) * 16777619u;
    return h % MEMO_SLOTS;
}

/* The key: the in-arguments, then the current context when the answer depends on it. */
static uint32_t memo_key(unsigned char *key, const void *in, uint32_t in_len, int with_ctx) {
    if (in_len > MEMO_KEY_BYTES - 8) return 0;
    memcpy(key, in, in_len);
    if (!with_ctx) return in_len;
    uint64_t ctx = gp_ctx_current();
    memcpy(key + in_len, &ctx, 8);
    return in_len + 8;
}

uint64_t gp_memo_generation(int group) { return __atomic_load_n(&memo_generations[group], __ATOMIC_ACQUIRE); }

int gp_memo_get(uint32_t call, int group, int with_ctx, const void *in, uint32_t in_len, void *out, uint32_t out_len) {
    unsigned char key[MEMO_KEY_BYTES];
    if (memo_off) return 0;
    uint32_t len = memo_key(key, in, in_len, with_ctx);
    if (!len && in_len) return 0;
    int found = 0;
    pthread_mutex_lock(&memo_lock);
    struct memo_entry *e = &memo_table[memo_hash(call, key, len)];
    if (!memo_paused[group] && e->generation == memo_generations[group] && e->call == call && e->key_len == len &&
        memcmp(e->key, key, len) == 0) {
        if (out_len) memcpy(out, e->out, out_len);
        found = 1;
    }
    pthread_mutex_unlock(&memo_lock);
    return found;
}

void gp_memo_put(uint32_t call, int group, int with_ctx, uint64_t generation, const void *in, uint32_t in_len,
                 const void *out, uint32_t out_len) {
    unsigned char key[MEMO_KEY_BYTES];
    uint32_t len = memo_key(key, in, in_len, with_ctx);
    if ((!len && in_len) || out_len > MEMO_OUT_BYTES) return;
    pthread_mutex_lock(&memo_lock);
    if (!memo_paused[group] && generation == memo_generations[group]) {
        struct memo_entry *e = &memo_table[memo_hash(call, key, len)];
        e->generation = generation;
        e->call = call;
        e->key_len = len;
        memcpy(e->key, key, len);
        if (out_len) memcpy(e->out, out, out_len);
    }
    pthread_mutex_unlock(&memo_lock);
}

/* Around every forwarded call (gp_call2): the groups it can change move on, before and after. */
void gp_memo_changing(uint32_t call) {
    uint32_t mask = gp_call_invalidates[call];
    for (int g = 0; mask; g++, mask >>= 1)
        if (mask & 1) __atomic_fetch_add(&memo_generations[g], 1, __ATOMIC_ACQ_REL);
}

void gp_memo_changed(uint32_t call, CUresult result) {
    gp_memo_changing(call);
    uint32_t pause = gp_call_pauses[call], resume = gp_call_resumes[call];
    if (!pause && !resume) return;
    pthread_mutex_lock(&memo_lock);
    for (int g = 0; g < (int)GP_N_MEMO_GROUPS; g++) {
        if ((pause >> g) & 1 && result == CUDA_SUCCESS) memo_paused[g]++;
        if ((resume >> g) & 1 && memo_paused[g] > 0) memo_paused[g]--;
    }
    pthread_mutex_unlock(&memo_lock);
}

/* A forked child talks to the worker on its own connection, with its own objects: nothing carries over. */
void gp_memo_after_fork_in_child(void) {
    pthread_mutex_init(&memo_lock, NULL);
    for (int g = 0; g < (int)GP_N_MEMO_GROUPS; g++) {
        memo_generations[g]++;
        memo_paused[g] = 0;
    }
}
