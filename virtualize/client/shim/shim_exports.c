/* gpupool's libcuda.so.1, part 3: the driver's private export tables (cuGetExportTable).
 *
 * The CUDA runtime (libcudart, and the copies of it linked into cuBLAS, cuDNN, NCCL ...) asks the
 * driver for tables of functions keyed by UUIDs. virtualize/client/_exports.py lists the tables and slots
 * gpupool answers and the functions below that answer them; exports_gen.h is generated from it. What
 * the runtime keeps per context (context-local storage) and the tool buffers belong to this process and
 * live here; the primary context and the device facts come from the worker through the public calls. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "shim.h"

struct gp_export_table { const char *name; unsigned char uuid[16]; void *const *table; };
static CUresult gp_export_refused(int table, int slot, uint64_t a, uint64_t b, uint64_t c, uint64_t d);

/* ---- cudart_interface ----------------------------------------------------------------------------- */

/* What the runtime registers for each embedded fatbin (__fatBinC_Wrapper_t). */
struct fatbin_wrapper { uint32_t magic; uint32_t version; const void *data; const void *unused; };

static CUresult gp_x_primary_context(uint64_t *ctx, int32_t dev) {
    GP_TRACE("(export) primary_context"); return cuDevicePrimaryCtxRetain(ctx, dev); }

static CUresult gp_x_module_from_fatbin_wrapper(uint64_t *module, const struct fatbin_wrapper *w) {
    GP_TRACE("(export) module_from_fatbin_wrapper");
    if (!module || !w || !w->data) return CUDA_ERROR_INVALID_VALUE;
    return cuModuleLoadFatBinary(module, (void *)w->data);
}

static CUresult gp_x_module_from_fatbin_wrapper_ext(uint64_t *module, const struct fatbin_wrapper *w, void *a,
                                                    void *b, uint32_t n) {
    GP_TRACE("(export) module_from_fatbin_wrapper_ext");
    if (a || b || n) return gp_export_refused(0, 6, (uint64_t)a, (uint64_t)b, n, 0);
    return gp_x_module_from_fatbin_wrapper(module, w);
}

static CUresult gp_x_module_from_fatbin_header_ext(const void *header, uint64_t *module, void *a, void *b,
                                                   uint32_t n) {
    GP_TRACE("(export) module_from_fatbin_header_ext");
    if (a || b || n) return gp_export_refused(0, 8, (uint64_t)a, (uint64_t)b, n, 0);
    if (!module || !header) return CUDA_ERROR_INVALID_VALUE;
    return cuModuleLoadFatBinary(module, (void *)header);
}

static void gp_x_nothing(size_t unused) {
    GP_TRACE("(export) nothing"); (void)unused; }
static CUresult gp_x_success(void) {
    GP_TRACE("(export) success"); return CUDA_SUCCESS; }
static uint32_t gp_x_zero(void) {
    GP_TRACE("(export) zero"); return 0; }
static CUresult gp_x_declined(void) {
    GP_TRACE("(export) declined"); return CUDA_ERROR_NOT_SUPPORTED; }

static CUresult gp_x_runtime_message(const char *source, uint64_t level, const char *format, va_list args) {
    if (gp_trace_enabled && format) {
        char text[512];
        vsnprintf(text, sizeof text, format, args);
        gp_say("(export) runtime message from %s (level %llu): %s", source ? source : "?",
               (unsigned long long)level, text);
    }
    return CUDA_SUCCESS;
}

/* ---- tools: no profiler tool is attached to a remote run -------------------------------------------- */

/* A thread's tool state, shaped as the driver's own when no tool is attached (its scalar fields as read
 * on driver 580; its pointer fields point at zeroed objects here). With it cuBLASLt's fp32 GEMM runs
 * remotely bit-equal to native (measured on an H100). */
static uint64_t tools_objects[3][64];
struct tools_state;
/* The object tools_callbacks slot 51 hands out for a state (the driver's: its state's word 13), as read
 * on driver 580: flags 1 and 1 around a pointer back to the state. */
static struct {
    uint64_t one_a, zero_a;
    struct tools_state *state;
    uint64_t zero_b, zero_c, one_b;
    uint64_t rest[10];
} tools_object;
static struct tools_state {
    uint32_t zero, one, three_a, three_b;
    void *a, *b;
    uint64_t one_c;
    void *c;
    uint32_t two, three_c;
    uint64_t one_d;
    void *more[6];  /* words 8-13: word 13 is the object above */
    uint64_t rest[50];
} tools_state = {0, 1, 3, 3, tools_objects[0], tools_objects[1], 1, tools_objects[2], 2, 3, 1,
                 {tools_objects[0], 0, 0, 0, 0, &tools_object}, {0}};
static struct tools_state *tools_state_init(void) {
    tools_object.one_a = tools_object.one_b = 1;
    tools_object.state = &tools_state;
    return &tools_state;
}

static CUresult gp_x_tools_tls(void **state) {
    GP_TRACE("(export) tools_tls");
    if (state) *state = tools_state_init();
    return CUDA_SUCCESS;
}

/* cuBLAS, before some GEMMs, asks for the state's object (slot 51) and then a value of it (slot 39): the
 * driver answers the object above and 7 (measured natively on driver 580 under CuPy's matmul). */
static CUresult gp_x_tools_state_object(void *state, uint64_t which, void **object) {
    GP_TRACE("(export) tools_state_object");
    (void)state, (void)which;
    tools_state_init();
    if (object) *object = &tools_object;
    return CUDA_SUCCESS;
}

static CUresult gp_x_tools_object_value(void *state, void *object, uint64_t *value) {
    GP_TRACE("(export) tools_object_value");
    (void)state, (void)object;
    if (value) *value = 7;
    return CUDA_SUCCESS;
}

/* cuFFT, right after it loads one of its modules with cuModuleLoadData, asks for the module's functions:
 * the driver calls `each(arg, function)` for each one and answers how many there were (traced natively on
 * driver 580: one call per module, a one-kernel module, `each` a setter of *arg, answer 1; the function
 * it set is the one cuFFT then launches). Answered from the module's functions on the worker. */
static uint64_t gp_x_module_functions(void *ctx, uint64_t module, void (*each)(void *arg, uint64_t function),
                                      void *arg) {
    GP_TRACE("(export) module_functions");
    (void)ctx; /* the caller made it current */
    uint32_t count = 0;
    if (!each || cuModuleGetFunctionCount(&count, module) != CUDA_SUCCESS) return 0;
    uint64_t functions[256];
    if (count > 256 || cuModuleEnumerateFunctions(functions, count, module) != CUDA_SUCCESS) return 0;
    for (uint32_t i = 0; i < count; i++) each(arg, functions[i]);
    return count;
}

static CUresult gp_x_tools_callback_state(void *state, uint64_t *answer) {
    GP_TRACE("(export) tools_callback_state");
    (void)state;
    if (answer) *answer = 1;
    return CUDA_SUCCESS;
}

static uint32_t hooks_buffer_1[1024], hooks_buffer_2[16];

static void gp_x_hooks_buffer_1(void **buffer, size_t *size) {
    GP_TRACE("(export) hooks_buffer_1");
    if (buffer) *buffer = hooks_buffer_1;
    if (size) *size = 1024;
}

static void gp_x_hooks_buffer_2(void **buffer, size_t *size) {
    GP_TRACE("(export) hooks_buffer_2");
    if (buffer) *buffer = hooks_buffer_2;
    if (size) *size = 14;
}

/* ---- context-local storage: the runtime's per-context state, kept in this process ---------------- */

typedef void (*cls_dtor)(uint64_t ctx, void *key, void *value);
struct cls_entry { uint64_t ctx; void *key; void *value; cls_dtor dtor; };
static struct cls_entry *cls;
static size_t n_cls, cap_cls;
static pthread_mutex_t cls_lock = PTHREAD_MUTEX_INITIALIZER;

static struct cls_entry *cls_find(uint64_t ctx, void *key) {
    for (size_t i = 0; i < n_cls; i++) {
        if (cls[i].ctx == ctx && cls[i].key == key) return &cls[i];
    }
    return NULL;
}

static CUresult cls_context(uint64_t *ctx) {
    if (!*ctx) *ctx = gp_ctx_current();
    return *ctx ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

static CUresult gp_x_cls_put(uint64_t ctx, void *key, void *value, cls_dtor dtor) {
    GP_TRACE("(export) cls_put");
    CUresult r = cls_context(&ctx);
    if (r) return r;
    pthread_mutex_lock(&cls_lock);
    struct cls_entry *e = cls_find(ctx, key);
    if (!e && n_cls == cap_cls) {
        size_t cap = cap_cls ? 2 * cap_cls : 16;
        struct cls_entry *grown = realloc(cls, cap * sizeof *grown);
        if (grown) {
            cls = grown;
            cap_cls = cap;
        }
    }
    if (!e && n_cls < cap_cls) e = &cls[n_cls++];
    if (e) *e = (struct cls_entry){ctx, key, value, dtor};
    pthread_mutex_unlock(&cls_lock);
    return e ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult gp_x_cls_delete(uint64_t ctx, void *key) {
    GP_TRACE("(export) cls_delete");
    CUresult r = cls_context(&ctx);
    if (r) return r;
    pthread_mutex_lock(&cls_lock);
    struct cls_entry *e = cls_find(ctx, key);
    if (e) *e = cls[--n_cls];
    pthread_mutex_unlock(&cls_lock);
    return CUDA_SUCCESS;
}

static CUresult gp_x_cls_get(void **value, uint64_t ctx, void *key) {
    GP_TRACE("(export) cls_get");
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cls_context(&ctx);
    if (r) return r;
    pthread_mutex_lock(&cls_lock);
    struct cls_entry *e = cls_find(ctx, key);
    if (e) *value = e->value;
    pthread_mutex_unlock(&cls_lock);
    if (gp_trace_enabled) gp_say("  context-local storage of %#lx key %p: %s", (unsigned long)ctx, key, e ? "found" : "none");
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* ---- context checks ------------------------------------------------------------------------------ */

static CUresult gp_x_context_check(uint64_t ctx, uint32_t *flags, const void **extra) {
    GP_TRACE("(export) context_check");
    (void)ctx;
    (void)extra;
    if (flags) *flags = 0;
    return CUDA_SUCCESS;
}

/* ---- the integrity check: HMAC-MD2 (RFC 1319, RFC 2104) over what both sides can see ----------------
 *
 * The runtime hands the driver its version and the time, and compares the answer with its own
 * computation over the same facts: this process and thread, the addresses of this table, of the
 * cudart_interface table and of this function, the driver version, and each device's UUID and PCI
 * location. The key is fixed. */

static const uint8_t md2_pi[256] = {
    41,  46,  67,  201, 162, 216, 124, 1,   61,  54,  84,  161, 236, 240, 6,   19,  98,  167, 5,   243, 192, 199,
    115, 140, 152, 147, 43,  217, 188, 76,  130, 202, 30,  155, 87,  60,  253, 212, 224, 22,  103, 66,  111, 24,
    138, 23,  229, 18,  190, 78,  196, 214, 218, 158, 222, 73,  160, 251, 245, 142, 187, 47,  238, 122, 169, 104,
    121, 145, 21,  178, 7,   63,  148, 194, 16,  137, 11,  34,  95,  33,  128, 127, 93,  154, 90,  144, 50,  39,
    53,  62,  204, 231, 191, 247, 151, 3,   255, 25,  48,  179, 72,  165, 181, 209, 215, 94,  146, 42,  172, 86,
    170, 198, 79,  184, 56,  210, 150, 164, 125, 182, 118, 252, 107, 226, 156, 116, 4,   241, 69,  157, 112, 89,
    100, 113, 135, 32,  134, 91,  207, 101, 230, 45,  168, 2,   27,  96,  37,  173, 174, 176, 185, 246, 28,  70,
    97,  105, 52,  64,  126, 15,  85,  71,  163, 35,  221, 81,  175, 58,  195, 92,  249, 206, 186, 197, 234, 38,
    44,  83,  13,  110, 133, 40,  132, 9,   211, 223, 205, 244, 65,  129, 77,  82,  106, 220, 55,  200, 108, 193,
    171, 250, 36,  225, 123, 8,   12,  189, 177, 74,  120, 136, 149, 139, 227, 99,  232, 109, 233, 203, 213, 254,
    59,  0,   29,  57,  242, 239, 183, 14,  102, 88,  208, 228, 166, 119, 114, 248, 235, 117, 75,  10,  49,  68,
    80,  180, 143, 237, 31,  26,  219, 153, 141, 51,  159, 17,  131, 20,
};

struct md2 { uint8_t x[48], checksum[16], block[16]; unsigned n; };

static void md2_block(struct md2 *h) {
    uint8_t last = h->checksum[15];
    for (int i = 0; i < 16; i++) {
        h->x[16 + i] = h->block[i];
        h->x[32 + i] = h->block[i] ^ h->x[i];
        last = h->checksum[i] ^= md2_pi[h->block[i] ^ last];
    }
    unsigned t = 0;
    for (unsigned round = 0; round < 18; round++) {
        for (int i = 0; i < 48; i++) t = h->x[i] ^= md2_pi[t];
        t = (t + round) & 0xff;
    }
}

static void md2_update(struct md2 *h, const void *data, size_t len) {
    const uint8_t *p = data;
    for (size_t i = 0; i < len; i++) {
        h->block[h->n++] = p[i];
        if (h->n == 16) {
            md2_block(h);
            h->n = 0;
        }
    }
}

static void md2_final(struct md2 *h, uint8_t digest[16]) {
    uint8_t pad[16];
    unsigned k = 16 - h->n;
    memset(pad, (int)k, k);
    md2_update(h, pad, k);
    uint8_t sum[16];
    memcpy(sum, h->checksum, 16);
    md2_update(h, sum, 16);
    memcpy(digest, h->x, 16);
}

static const uint8_t integrity_key[16] = {0x14, 0x6a, 0xdd, 0xae, 0x53, 0xa9, 0xa7, 0x52,
                                          0xaa, 0x08, 0x41, 0x36, 0x0b, 0xf5, 0x5a, 0x9f};

static void hmac_md2_start(struct md2 *h, uint8_t mask) {
    uint8_t pad[16];
    for (int i = 0; i < 16; i++) pad[i] = integrity_key[i] ^ mask;
    memset(h, 0, sizeof *h);
    md2_update(h, pad, 16);
}

/* Exposed (not exported) for the unit test of the hash against a reference MD2. */
void gp_hmac_md2(const void *message, size_t len, uint8_t out[16]);
void gp_hmac_md2(const void *message, size_t len, uint8_t out[16]) {
    struct md2 h;
    uint8_t inner[16];
    hmac_md2_start(&h, 0x36);
    md2_update(&h, message, len);
    md2_final(&h, inner);
    hmac_md2_start(&h, 0x5c);
    md2_update(&h, inner, 16);
    md2_final(&h, out);
}

struct integrity_facts {
    uint32_t driver_version, runtime_version, process, thread;
    const void *cudart_table, *integrity_table, *function;
    uint64_t unix_seconds;
} __attribute__((packed));
struct integrity_device { uint8_t uuid[16]; int32_t pci_domain, pci_bus, pci_device; } __attribute__((packed));

#define MAX_DEVICES 64

static CUresult gp_x_integrity_check(uint32_t runtime_version, uint64_t unix_seconds, uint64_t result[2]);

static void *const *find_table(const char *name);

static CUresult gp_x_integrity_check(uint32_t runtime_version, uint64_t unix_seconds, uint64_t result[2]) {
    GP_TRACE("(export) integrity_check");
    if (!result) return CUDA_ERROR_INVALID_VALUE;
    /* Constant answers for these runtime versions, as the driver gives them. */
    static const uint64_t fixed[2][2] = {{0x3341181C03CB675Cull, 0x8ED383AA1F4CD1E8ull},
                                         {0x1841181C03CB675Cull, 0x8ED383AA1F4CD1E8ull}};
    if (runtime_version % 10 < 2) {
        memcpy(result, fixed[runtime_version % 10], 16);
        return CUDA_SUCCESS;
    }
    int32_t driver_version = 0, count = 0;
    CUresult r = cuDriverGetVersion(&driver_version);
    if (!r) r = cuDeviceGetCount(&count);
    if (r) return r;
    if (count > MAX_DEVICES) count = MAX_DEVICES;
    struct {
        struct integrity_facts facts;
        struct integrity_device devices[MAX_DEVICES];
    } __attribute__((packed)) message;
    void *const *integrity_table = find_table("integrity_check");
    message.facts = (struct integrity_facts){
        .driver_version = (uint32_t)driver_version,
        .runtime_version = runtime_version,
        .process = (uint32_t)getpid(),
        .thread = (uint32_t)pthread_self(),
        .cudart_table = find_table("cudart_interface"),
        .integrity_table = integrity_table,
        .function = integrity_table[1],
        .unix_seconds = unix_seconds,
    };
    for (int d = 0; d < count && !r; d++) {
        int32_t domain = 0, bus = 0, device = 0;
        r = cuDeviceGetUuid_v2(message.devices[d].uuid, d);
        if (!r) r = cuDeviceGetAttribute(&domain, 50, d); /* CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID */
        if (!r) r = cuDeviceGetAttribute(&bus, 33, d);    /* CU_DEVICE_ATTRIBUTE_PCI_BUS_ID */
        if (!r) r = cuDeviceGetAttribute(&device, 34, d); /* CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID */
        message.devices[d].pci_domain = domain;
        message.devices[d].pci_bus = bus;
        message.devices[d].pci_device = device;
    }
    if (r) return r;
    uint8_t digest[16];
    gp_hmac_md2(&message, sizeof message.facts + (size_t)count * sizeof message.devices[0], digest);
    memcpy(result, digest, 16);
    return CUDA_SUCCESS;
}

/* ---- the tables and cuGetExportTable ------------------------------------------------------------ */

#include "exports_gen.h"

#define N_TABLES (sizeof gp_export_tables / sizeof gp_export_tables[0])

static void *const *find_table(const char *name) {
    for (size_t i = 0; i < N_TABLES; i++) {
        if (strcmp(gp_export_tables[i].name, name) == 0) return gp_export_tables[i].table;
    }
    return NULL;
}

static pthread_mutex_t said_lock = PTHREAD_MUTEX_INITIALIZER;

static void uuid_text(const unsigned char *u, char out[37]) {
    snprintf(out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2],
             u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

/* The first four arguments are what the caller passed in registers, whatever the slot's real signature:
 * printed under GPUPOOL_SHIM_TRACE, for working out what a slot is. */
static CUresult gp_export_refused(int table, int slot, uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
    if (gp_trace_enabled)
        gp_say("(export) refused %s slot %d (%#llx, %#llx, %#llx, %#llx)", gp_export_tables[table].name, slot,
               (unsigned long long)a, (unsigned long long)b, (unsigned long long)c, (unsigned long long)d);
    static unsigned char said[N_TABLES][32];
    pthread_mutex_lock(&said_lock);
    int first = !said[table][slot & 31];
    said[table][slot & 31] = 1;
    pthread_mutex_unlock(&said_lock);
    if (first) {
        char u[37];
        uuid_text(gp_export_tables[table].uuid, u);
        gp_say("the CUDA runtime called slot %d of the driver's private export table %s {%s}, which gpupool "
               "does not emulate; it returns CUDA_ERROR_NOT_SUPPORTED (docs/remote.md)",
               slot, gp_export_tables[table].name, u);
    }
    return CUDA_ERROR_NOT_SUPPORTED;
}

GP_EXPORT CUresult cuGetExportTable(void *table, void *uuid) {
    if (!table || !uuid) return CUDA_ERROR_INVALID_VALUE;
    char u[37];
    if (gp_trace_enabled) uuid_text(uuid, u);
    for (size_t i = 0; i < N_TABLES; i++) {
        if (memcmp(gp_export_tables[i].uuid, uuid, 16) == 0) {
            if (gp_trace_enabled) gp_say("call cuGetExportTable {%s} -> %s", u, gp_export_tables[i].name);
            *(void *const **)table = gp_export_tables[i].table;
            return CUDA_SUCCESS;
        }
    }
    /* A table this shim does not know: refused the way a driver refuses a table it does not have (an
     * older driver under a newer runtime), which the runtime and NVRTC take in their stride. */
    if (gp_trace_enabled) gp_say("call cuGetExportTable {%s} -> not known to gpupool, refused", u);
    *(const void **)table = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}
