/* gpupool's libcuda.so.1, part 4: answers the client already has.
 *
 * The CUDA runtime asks the driver the same questions thousands of times a second (a primary
 * context's state before each launch, a kernel's attributes, the version); each forwarded question
 * costs a round trip to the worker. Calls marked `memo` in virtualize/common/_calls.py keep their answer
 * here, keyed by the call, its in-arguments and (where the answer depends on it) the current
 * context, until a call that can change it is made.
 *
 * Two ways an answer stops being kept:
 *  - a whole group moves on: each memo group has a generation that the calls marked `invalidates`
 *    bump before they are sent and after they return (gp_call2); an answer is kept only in its
 *    group's current generation;
 *  - one subject is forgotten: a call marked `forgets` (an attribute setter, an unload) drops only
 *    the answers about its own function, kernel, module or library. Which answers those are follows
 *    from where each handle came from (the calls marked `links`: a kernel from its library, a
 *    function from its kernel or module): a kernel's setter drops the kernel's answers and its
 *    functions', an unload all that came from the library or module. An answer about a handle of
 *    unknown origin is dropped by every forget, so nothing is kept that a change could miss.
 * Either way the group's epoch moves, and an answer fetched across such a move is not kept. A group
 * can also be paused (a stream capture is under way: a capture's status changes with calls that are
 * not its own).
 *
 * Setters marked `memo` (no outs) skip a repeat of the identical call that succeeded since the last
 * change of that attribute. A question about something that is not a handle at all is answered
 * CUDA_ERROR_INVALID_HANDLE by the driver every time (the runtime asks so of each host function it
 * is given before it looks the function up); that answer is kept too, until a call hands out that
 * value as a new handle. The store is 4-way associative: a full set overwrites, it never answers
 * wrongly. */
#include "shim.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define MEMO_SLOTS 8192u /* in sets of MEMO_WAYS */
#define MEMO_WAYS 4u
#define MEMO_KEY_BYTES 48u
#define MEMO_OUT_BYTES 24u
#define LINK_SLOTS 65536u /* handle -> where it came from; full at 3/4: then forgets drop a whole group */

struct memo_entry {
    uint64_t generation; /* 0: empty */
    uint64_t subject;    /* the function or kernel the answer is about (0: none) ... */
    uint64_t kernel;     /* ... the kernel a change of it reaches (kernel_of) ... */
    uint64_t root;       /* ... and the library or module it came from (0: unknown) */
    int32_t result;      /* CUDA_SUCCESS, or CUDA_ERROR_INVALID_HANDLE for a value that is not a handle */
    int32_t attrib;      /* a setter's record: the attribute it set; -1 for an answer */
    uint32_t group, call, key_len;
    unsigned char key[MEMO_KEY_BYTES];
    unsigned char out[MEMO_OUT_BYTES];
};

struct link {
    uint64_t child, parent;
    int parent_kind;
};

static struct memo_entry memo_table[MEMO_SLOTS];
static struct link links[LINK_SLOTS];
static uint32_t links_used;
static int links_full;
static uint32_t memo_victim; /* which way a full set gives up next */
static pthread_mutex_t memo_lock = PTHREAD_MUTEX_INITIALIZER;
/* Generations start at 1 so that an empty entry (0) never matches. */
static uint64_t memo_generations[GP_N_MEMO_GROUPS] = {[0 ... GP_N_MEMO_GROUPS - 1] = 1};
static uint64_t memo_epochs[GP_N_MEMO_GROUPS];
static int memo_paused[GP_N_MEMO_GROUPS];
static int memo_off; /* GPUPOOL_SHIM_MEMO=0: for telling a kept answer's fault from the worker's */

/* Why a kept answer was not there, per call, for the profile: found, never kept or dropped, pushed
 * out of its set, an older generation, paused, fetched across a change, a failure not worth keeping. */
enum { MEMO_KEPT, MEMO_EMPTY, MEMO_PUSHED_OUT, MEMO_OLDER, MEMO_PAUSED, MEMO_RACED, MEMO_FAILED, MEMO_N_OUTCOMES };
static uint64_t memo_outcomes[GP_N_CALLS][MEMO_N_OUTCOMES];

static void memo_count(uint32_t call, int outcome) {
    if (call < GP_N_CALLS) __atomic_fetch_add(&memo_outcomes[call][outcome], 1, __ATOMIC_RELAXED);
}

__attribute__((constructor)) static void memo_init(void) {
    const char *memo = getenv(GP_ENV_MEMO);
    memo_off = memo && strcmp(memo, "0") == 0;
}

uint64_t gp_memo_kept(uint32_t call) { return call < GP_N_CALLS ? memo_outcomes[call][MEMO_KEPT] : 0; }

/* At exit under GPUPOOL_SHIM_PROFILE=1: for each call that keeps answers, why the others were sent. */
void gp_memo_print_outcomes(void) {
    static const char *names[MEMO_N_OUTCOMES] = {"kept", "empty", "pushed out", "older", "paused", "raced", "failed"};
    fprintf(stderr, "gpupool: %-44s", "calls that keep answers: found, or why not");
    for (int o = 0; o < MEMO_N_OUTCOMES; o++) fprintf(stderr, " %10s", names[o]);
    fputc('\n', stderr);
    for (uint32_t i = 0; i < GP_N_CALLS; i++) {
        uint64_t sum = 0;
        for (int o = 0; o < MEMO_N_OUTCOMES; o++) sum += memo_outcomes[i][o];
        if (!sum) continue;
        fprintf(stderr, "gpupool:   %-42s", gp_call_names[i]);
        for (int o = 0; o < MEMO_N_OUTCOMES; o++) fprintf(stderr, " %10llu", (unsigned long long)memo_outcomes[i][o]);
        fputc('\n', stderr);
    }
}

static struct memo_entry *memo_set(uint32_t call, const unsigned char *key, uint32_t len) {
    uint32_t h = 2166136261u ^ call;
    for (uint32_t i = 0; i < len; i++) h = (h ^ key[i]) * 16777619u;
    return &memo_table[(h % (MEMO_SLOTS / MEMO_WAYS)) * MEMO_WAYS];
}

static int memo_same(const struct memo_entry *e, uint32_t call, const unsigned char *key, uint32_t len) {
    return e->generation && e->call == call && e->key_len == len && memcmp(e->key, key, len) == 0;
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

/* ---- where handles came from (memo_lock held) ---------------------------------------------------- */

static struct link *link_slot(uint64_t child) {
    uint64_t h = child * 0x9E3779B97F4A7C15ull;
    for (uint32_t i = (uint32_t)(h >> 48) % LINK_SLOTS;; i = (i + 1) % LINK_SLOTS)
        if (links[i].child == child || links[i].child == 0) return &links[i];
}

static const struct link *link_of(uint64_t child) {
    const struct link *l = child ? link_slot(child) : NULL;
    return l && l->child ? l : NULL;
}

/* The kernel a change of `subject` reaches: its kernel when it is a kernel's function, else itself
 * (a kernel, a kernel passed where a function goes as the runtime does, or a module's function). */
static uint64_t kernel_of(uint64_t subject) {
    const struct link *l = link_of(subject);
    return l && l->parent_kind == GP_HANDLE_kernel ? l->parent : subject;
}

/* The library or module `subject` came from, or 0 when its origin is not known. */
static uint64_t root_of(uint64_t subject) {
    for (int hops = 0; hops < 4; hops++) {
        const struct link *l = link_of(subject);
        if (!l) return 0;
        if (l->parent_kind == GP_HANDLE_library || (l->parent_kind == GP_HANDLE_module && !link_of(l->parent)))
            return l->parent;
        subject = l->parent;
    }
    return 0;
}

/* `child` was just handed out, from `parent`. Nothing kept about that value still holds (it may have
 * been "not a handle", or another object's handle before an unload). */
void gp_memo_link(uint64_t child, uint64_t parent, int parent_kind) {
    if (!child) return;
    pthread_mutex_lock(&memo_lock);
    struct link *l = link_slot(child);
    if (l->child || links_used < LINK_SLOTS / 4 * 3) {
        if (!l->child) links_used++;
        l->child = child;
        l->parent = parent;
        l->parent_kind = parent_kind;
    } else {
        links_full = 1;
    }
    for (uint32_t i = 0; i < MEMO_SLOTS; i++)
        if (memo_table[i].generation && memo_table[i].subject == child) memo_table[i].generation = 0;
    for (int g = 0; g < (int)GP_N_MEMO_GROUPS; g++) memo_epochs[g]++;
    pthread_mutex_unlock(&memo_lock);
}

/* ---- keeping and finding answers ----------------------------------------------------------------- */

uint64_t gp_memo_epoch(int group) { return __atomic_load_n(&memo_epochs[group], __ATOMIC_ACQUIRE); }

int gp_memo_get(uint32_t call, int group, int with_ctx, const void *in, uint32_t in_len, void *out, uint32_t out_len,
                CUresult *result) {
    unsigned char key[MEMO_KEY_BYTES];
    if (memo_off || !gp_initialized()) return 0; /* before cuInit the call is refused, never answered */
    uint32_t len = memo_key(key, in, in_len, with_ctx);
    if (!len && in_len) return 0;
    int outcome = MEMO_EMPTY;
    pthread_mutex_lock(&memo_lock);
    struct memo_entry *set = memo_set(call, key, len);
    for (uint32_t w = 0; w < MEMO_WAYS; w++) {
        struct memo_entry *e = &set[w];
        if (!memo_same(e, call, key, len)) continue;
        if (memo_paused[group]) {
            outcome = MEMO_PAUSED;
        } else if (e->generation != memo_generations[group]) {
            outcome = MEMO_OLDER;
        } else {
            if (out_len && e->result == CUDA_SUCCESS) memcpy(out, e->out, out_len);
            *result = e->result;
            outcome = MEMO_KEPT;
        }
        break;
    }
    pthread_mutex_unlock(&memo_lock);
    memo_count(call, outcome);
    return outcome == MEMO_KEPT;
}

void gp_memo_put(uint32_t call, int group, int with_ctx, uint64_t epoch, uint64_t subject, int32_t attrib,
                 CUresult result, const void *in, uint32_t in_len, const void *out, uint32_t out_len) {
    unsigned char key[MEMO_KEY_BYTES];
    /* "Not a handle" is kept only for questions about a function or kernel; every other failure may
     * depend on state this table does not follow. */
    if (result != CUDA_SUCCESS && !(result == CUDA_ERROR_INVALID_HANDLE && subject)) {
        memo_count(call, MEMO_FAILED);
        return;
    }
    uint32_t len = memo_key(key, in, in_len, with_ctx);
    if ((!len && in_len) || out_len > MEMO_OUT_BYTES) return;
    pthread_mutex_lock(&memo_lock);
    if (epoch != memo_epochs[group]) memo_count(call, MEMO_RACED);
    if (!memo_paused[group] && epoch == memo_epochs[group]) {
        struct memo_entry *set = memo_set(call, key, len), *e = NULL;
        for (uint32_t w = 0; w < MEMO_WAYS && !e; w++)
            if (memo_same(&set[w], call, key, len)) e = &set[w];
        for (uint32_t w = 0; w < MEMO_WAYS && !e; w++)
            if (set[w].generation != memo_generations[set[w].group]) e = &set[w]; /* empty or stale */
        if (!e) {
            e = &set[memo_victim++ % MEMO_WAYS];
            memo_count(e->call, MEMO_PUSHED_OUT);
        }
        e->generation = memo_generations[group];
        e->subject = subject;
        e->kernel = kernel_of(subject);
        e->root = root_of(subject);
        e->result = result;
        e->attrib = attrib;
        e->group = (uint32_t)group;
        e->call = call;
        e->key_len = len;
        memcpy(e->key, key, len);
        if (out_len && result == CUDA_SUCCESS) memcpy(e->out, out, out_len);
    }
    pthread_mutex_unlock(&memo_lock);
}

/* Does a setter of `attrib` on (the kernel of) `kernel`, or the unload of library or module
 * `unloaded`, change what `e` holds? An answer about a handle of unknown origin: yes. "Not a handle"
 * stays so (only gp_memo_link makes a value a handle). A setter's record of another attribute stays. */
static int memo_changed_by(const struct memo_entry *e, uint64_t kernel, int32_t attrib, uint64_t unloaded) {
    if (e->result != CUDA_SUCCESS) return 0;
    if (unloaded) return !e->root || e->root == unloaded || e->subject == unloaded;
    if (attrib >= 0 && e->attrib >= 0 && e->attrib != attrib) return 0;
    return !e->root || e->subject == kernel || e->kernel == kernel;
}

/* A setter (`attrib`, or -1 for one that may change any) or an unload of `subject`, before it is sent
 * and after it returns: the answers it can change go. */
void gp_memo_forget(int group, uint64_t subject, int kind, int32_t attrib) {
    pthread_mutex_lock(&memo_lock);
    memo_epochs[group]++;
    if (links_full) {
        memo_generations[group]++;
    } else {
        int unload = kind == GP_HANDLE_library || kind == GP_HANDLE_module;
        uint64_t kernel = unload ? 0 : kernel_of(subject), unloaded = unload ? subject : 0;
        for (uint32_t i = 0; i < MEMO_SLOTS; i++) {
            struct memo_entry *e = &memo_table[i];
            if (e->generation != memo_generations[group] || e->group != (uint32_t)group) continue;
            if (memo_changed_by(e, kernel, attrib, unloaded)) e->generation = 0;
        }
    }
    pthread_mutex_unlock(&memo_lock);
}

/* Around every forwarded call (gp_call2): the groups it can change move on, before and after. */
void gp_memo_changing(uint32_t call) {
    uint32_t mask = gp_call_invalidates[call];
    if (!mask) return;
    pthread_mutex_lock(&memo_lock);
    for (int g = 0; mask; g++, mask >>= 1)
        if (mask & 1) {
            memo_generations[g]++;
            memo_epochs[g]++;
        }
    pthread_mutex_unlock(&memo_lock);
}

/* The streams whose capture this process began (a pausing call that succeeded) and has not seen end: the
 * group stays paused while one is listed. A resuming call (cuStreamEndCapture) that succeeded ended its
 * stream's capture. One that failed may have ended it (an invalidated capture ends with its error) or
 * not (the wrong thread, a stream that was not the capture's origin): the worker is asked whether the
 * stream still captures. A stream not listed began no capture here, so its end resumes nothing. A capture
 * begun beyond the table is never known to end: the group stays paused, slower and never wrong. */
#define CAPTURES_MAX 128
static struct {
    uint64_t stream;
    int group;
} captures[CAPTURES_MAX];
static int n_captures;

static int capture_listed(uint64_t stream, int group, int remove) { /* under memo_lock */
    for (int i = 0; i < n_captures; i++)
        if (captures[i].stream == stream && captures[i].group == group) {
            if (remove) captures[i] = captures[--n_captures];
            return 1;
        }
    return 0;
}

static int still_capturing(uint64_t stream) { /* paused: asks the worker */
    int32_t status = 0;
    return cuStreamIsCapturing(stream, &status) != CUDA_SUCCESS || status != 0;
}

void gp_memo_changed(uint32_t call, CUresult result, const void *args, uint32_t args_len) {
    gp_memo_changing(call);
    uint32_t pause = gp_call_pauses[call], resume = gp_call_resumes[call];
    if (!pause && !resume) return;
    uint64_t stream = 0; /* pausing and resuming calls name their stream first (_shimgen checks) */
    if (args_len >= sizeof stream) memcpy(&stream, args, sizeof stream);
    int ended = result == CUDA_SUCCESS;
    if (resume && !ended) {
        pthread_mutex_lock(&memo_lock);
        int listed = 0;
        for (int g = 0; g < (int)GP_N_MEMO_GROUPS; g++) listed |= (resume >> g) & 1 && capture_listed(stream, g, 0);
        pthread_mutex_unlock(&memo_lock);
        ended = listed && !still_capturing(stream);
    }
    pthread_mutex_lock(&memo_lock);
    for (int g = 0; g < (int)GP_N_MEMO_GROUPS; g++) {
        if ((pause >> g) & 1 && result == CUDA_SUCCESS) {
            memo_paused[g]++;
            if (n_captures < CAPTURES_MAX) captures[n_captures++] = (typeof(captures[0])){stream, g};
        }
        if ((resume >> g) & 1 && ended && capture_listed(stream, g, 1) && memo_paused[g] > 0) memo_paused[g]--;
    }
    pthread_mutex_unlock(&memo_lock);
}

/* Whether a stream capture this process began is still open (a successful cuStreamBeginCapture* not yet
 * ended): without one no stream of the process can be capturing, and nobody need ask the worker. */
int gp_capture_open(void) { return __atomic_load_n(&memo_paused[GP_MEMO_capture], __ATOMIC_ACQUIRE) > 0; }

/* A forked child talks to the worker on its own connection, with its own objects: nothing carries over. */
void gp_memo_after_fork_in_child(void) {
    pthread_mutex_init(&memo_lock, NULL);
    for (int g = 0; g < (int)GP_N_MEMO_GROUPS; g++) {
        memo_generations[g]++;
        memo_epochs[g]++;
        memo_paused[g] = 0;
    }
    n_captures = 0;
}
