/* gpupool's libcuda.so.1: shared declarations of the transport (shim.c) and the calls (shim_calls.c and
 * the files of hand-written calls beside it, shim_calls.h).
 * No cuda.h: the few CUDA types the shim needs are declared here, handles travel as 64-bit values. */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef int CUresult;
#define GP_EXPORT __attribute__((visibility("default")))

struct gp_proc { const char *name; int since; void *fn; const char *refused; }; /* refused: a newer ABI's symbol */
struct gp_result_text { int code; const char *name; const char *text; };

/* CUipcMemHandle: 64 bytes, passed by value. gpupool's: a magic, then the allocation's base and size. */
struct gp_ipc_handle { char reserved[64]; };

#include "calls_gen_types.h"

extern int gp_trace_enabled;
void gp_trace(const char *name);
#define GP_TRACE(n) do { if (gp_trace_enabled) gp_trace(n); } while (0)

/* One call on the wire. Sends the request; with GP_FLAG_WANTS_REPLY waits for the reply and copies
 * its fixed outs into `outs` and its bulk into `bulk_out` (each up to the given size). */
CUresult gp_call(uint32_t call, uint32_t flags, const void *args, uint32_t args_len, const void *bulk,
                 uint64_t bulk_len, void *outs, uint32_t outs_len, void *bulk_out, uint64_t bulk_out_len);
/* Same, with the bulk in two pieces (kernel parameters then launch attributes). */
CUresult gp_call2(uint32_t call, uint32_t flags, const void *args, uint32_t args_len, const void *bulk1,
                  uint64_t bulk1_len, const void *bulk2, uint64_t bulk2_len, void *outs, uint32_t outs_len,
                  void *bulk_out, uint64_t bulk_out_len);
/* Copies of at least this many bytes go through memory shared with a worker on this host (shim.c). To
 * the device a copy in its frame needs no answer, through shared memory one, so small ones stay in the
 * frame; to the host both need one and shared memory saves the socket's two copies of the bytes. H100:
 * 4 KiB to the device 63 % of native in the frame, 44 % through it; 64 KiB 56 % / 64 % (to the host 44 % / 69 %). */
#define GP_SHM_MIN_HTOD (32u << 10)
#define GP_SHM_MIN_DTOH (4u << 10)
int gp_bulk_copy(uint32_t call, uint64_t device, void *host, uint64_t count, uint64_t stream, CUresult *result);
int gp_pinned_share(uint64_t base, uint64_t size);
void gp_pinned_after_fork_in_child(void);

/* Answers kept in the client (shim_memo.c): a group's epoch, a kept answer, keeping one, forgetting
 * the answers about one function, kernel, module or library, where a handle came from, what gp_call2
 * does around each call (the groups it changes, pausing a group during a capture), and how many
 * answers of a call were kept (for the profile). */
enum gp_handle_kind { GP_HANDLE_func = 1, GP_HANDLE_kernel, GP_HANDLE_module, GP_HANDLE_library };
uint64_t gp_memo_epoch(int group);
/* Whether the program has called cuInit (before it, the driver's calls answer NOT_INITIALIZED). */
int gp_initialized(void);
/* Whether a stream capture this process began is still open (shim_memo.c). */
int gp_capture_open(void);
int gp_memo_get(uint32_t call, int group, int with_ctx, const void *in, uint32_t in_len, void *out, uint32_t out_len,
                CUresult *result);
void gp_memo_put(uint32_t call, int group, int with_ctx, uint64_t epoch, uint64_t subject, int32_t attrib,
                 CUresult result, const void *in, uint32_t in_len, const void *out, uint32_t out_len);
void gp_memo_forget(int group, uint64_t subject, int kind, int32_t attrib);
void gp_memo_link(uint64_t child, uint64_t parent, int parent_kind);
void gp_memo_changing(uint32_t call);
void gp_memo_changed(uint32_t call, CUresult result, const void *args, uint32_t args_len);
uint64_t gp_memo_kept(uint32_t call);
/* Synchronisations answered here when nothing can be pending (shim_idle.c). */
void gp_idle_frame(uint32_t call, uint32_t flags);
uint64_t gp_idle_generation(void);
int gp_idle_answers(uint32_t call, const void *args);
void gp_idle_done(uint32_t call, uint32_t flags, const void *args, uint64_t started, CUresult r);
void gp_idle_stream_done(uint64_t stream, uint64_t started); /* a copy the worker finished on `stream` */
uint64_t gp_idle_kept(uint32_t call);
void gp_memo_print_outcomes(void);
void gp_memo_after_fork_in_child(void);
/* Events' elapsed times (shim_streams.c): an event record sent on a stream, noted for asking many pairs
 * at once; a forked child forgets them. */
void gp_event_recorded(uint64_t event, uint64_t stream);
/* A frame's flag for the shim alone (never on the wire): it goes out at once, with what is held before it. */
#define GP_FLAG_SEND_NOW (1u << 31)
/* A copy of at least this many bytes is sent at once rather than held with the frames after it. */
#define GP_SEND_NOW_BYTES (64u << 10)
void gp_event_interprocess(uint64_t event); /* made interprocess, or opened: its records go out at once */
int gp_event_is_interprocess(uint64_t event);
void gp_events_after_fork_in_child(void);

/* The handshake's cryptography (shim_auth.c, the system's libcrypto loaded at first use). */
int gp_auth_ready(void);
int gp_auth_nonce(unsigned char *out, size_t len);
int gp_auth_proof(const char *secret, const char *label, const unsigned char *first, const unsigned char *second,
                  unsigned char out[GP_PROOF_BYTES]);
int gp_auth_equal(const unsigned char *a, const unsigned char *b, size_t len);
/* TLS 1.3 over a connected socket, the peer's certificate pinned by its SHA-256 (hex); NULL and `why` on
 * failure. Reads return bytes read, 0 at the end, -1 on error; writes 0 or -1. */
void *gp_tls_connect(int fd, const char *pin_hex, char *why, size_t why_len);
int gp_tls_write(void *ssl, const void *buf, size_t len);
struct iovec;
int gp_tls_writev(void *ssl, const struct iovec *iov, int n);
long gp_tls_read(void *ssl, void *buf, size_t len);
int gp_tls_holds(const void *ssl); /* bytes OpenSSL has read and not handed out (a record begun, or more) */
void gp_tls_free(void *ssl);

/* The current context of the calling thread (kept in the client; the worker is told on change). */
uint64_t gp_ctx_current(void);
void gp_ctx_set(uint64_t ctx);
int gp_ctx_push(uint64_t ctx);
uint64_t gp_ctx_pop(int *ok);
void gp_ctx_note_device(uint64_t ctx, int device);
int gp_ctx_device(uint64_t ctx, int *device);
void gp_ctx_forget(uint64_t ctx);

/* This process's window of device addresses: asked of the worker and reserved here before the first
 * allocation, so allocations never land on (or later under) host memory of this process. */
void gp_window_ensure(void);

/* Host functions the worker calls back (shim.c): the callback connection started once, each function
 * registered under an id until it has run (kind 0: a CUhostFn, 1: a CUstreamCallback, GP_HOST_RECAPTURE:
 * a CUgraphRecaptureCallback, asked for as long as the process lives). */
enum { GP_HOST_RECAPTURE = 2 };
#define GP_MAX_RECAPTURE_BYTES (1u << 20) /* a recapture's question: two nodes and their arguments */
CUresult gp_callbacks_start(void);
uint64_t gp_host_call_add(int kind, void *fn, void *data, uint64_t stream, int keep);
uint64_t gp_recapture_callback(void *fn, void *data);
void gp_host_call_drop(uint64_t id);
int gp_host_call_find(uint64_t id, void **fn, void **data);
/* Copies into page-locked memory that complete later (shim.c): each registered before its request is
 * sent (its id; 0: no memory) and dropped if it could not be sent; whether any is in flight, and whether
 * one lands in [p, p+count). The callback thread writes each one's bytes when the worker sends them. */
uint64_t gp_copy_expect(void *dst, uint64_t count);
void gp_copy_drop(uint64_t id);
int gp_copies_in_flight(void);
int gp_copies_into(const void *p, uint64_t count);

/* Managed and mapped host memory (shim_managed.c): host pages mirroring device allocations, kept in
 * step around the calls that make the GPU work (gp_managed_before, from gp_call2). Kinds: */
enum { GP_MIRROR_MANAGED = 1, GP_MIRROR_MAPPED = 2, GP_MIRROR_HOST = 3 };
int gp_managed_add(uint64_t base, uint64_t size, int kind);
int gp_managed_add_initialised(uint64_t base, uint64_t size); /* managed memory the device side holds data of */
int gp_mirror_host(uint64_t base, uint64_t size, uint64_t dev);
uint64_t gp_managed_remove(uint64_t base);
void gp_managed_forget(uint64_t base); /* the mirror ends, its bytes not wanted (the memory is freed) */
int gp_managed_lookup(uint64_t ptr);               /* the kind of the mirror holding ptr, or 0 */
int gp_mirror_device(uint64_t ptr, uint64_t *dev); /* ptr's device address when a mirror holds it */
int gp_mirror_of_device(uint64_t ptr);             /* whether ptr is the device side of a mirror */
/* What a program advised about its managed memory and where it prefetched it (shim_hints.c), per page;
 * locations as CUmemLocation's type and id. */
void gp_hints_clear(uint64_t base, uint64_t size);
CUresult gp_hints_advise(uint64_t ptr, uint64_t count, int32_t advice, int32_t type, int32_t id);
CUresult gp_hints_advise_device(uint64_t ptr, uint64_t count, int32_t advice, int32_t device);
void gp_hints_prefetched(uint64_t ptr, uint64_t count, int32_t type, int32_t id);
void gp_managed_before(uint32_t call);
int gp_managed_count(void); /* mirrors in the process (0: none) */
void gp_managed_after(uint32_t call, CUresult r);

/* The lease's device ranges known to this process: allocations (owned) and module globals. */
int gp_dev_add(uint64_t base, uint64_t size, int owned); /* 0, or -1 when the range is host memory here */
void gp_dev_remove(uint64_t base);
int gp_reserve_range(uint64_t base, uint64_t size); /* kept from this process's own mappings; 0, or -1 */
int gp_dev_lookup(uint64_t ptr, uint64_t *base, uint64_t *size, int *owned);

/* Page-locked host memory served locally; an address in an allocation of it that a forwarded call
 * names as device memory makes that allocation the device's at its own address (shim_memory.c). */
void gp_pinned_touch(uint64_t ptr);
/* Page-locked host memory served locally. */
int gp_host_add(uint64_t base, uint64_t size, unsigned flags, int allocated);
int gp_host_remove(uint64_t base, int allocated);
int gp_host_lookup(uint64_t ptr, uint64_t *base, uint64_t *size, unsigned *flags);
/* Copies to the device still sending their pieces across the lanes have sent them (shim.c): before
 * page-locked memory they read is given back. */
CUresult gp_lanes_sent(void);

/* Pools of page-locked host memory and of managed memory, answered in this process (shim_pools.c):
 * create answers CUDA_ERROR_NOT_FOUND for a pool of the device's own kind (the worker's). */
int gp_pool_is_local(uint64_t pool);
CUresult gp_pool_create_local(uint64_t *pool, const void *props);
CUresult gp_pool_alloc_local(uint64_t *dptr, uint64_t size, uint64_t pool);
int gp_pool_free_local(uint64_t ptr, CUresult *r); /* 1 when ptr was one of theirs (freed, *r its result) */
CUresult gp_pool_attribute_local(uint64_t pool, int32_t attr, void *value, int set);
CUresult gp_pool_destroy_local(uint64_t pool);

/* IPC between the workers of an isolated lease (shim_ipc.c): memory this process opened from another process's
 * worker goes there too when the program lets it go; a pool imported from another process's worker is held
 * here only (its pointers open as IPC memory handles do), and destroying it forgets it. */
void gp_ipc_release(uint64_t base);
int gp_isolated(void); /* GPUPOOL_ISOLATE: this process has a worker of its own (shim.c) */
int gp_pool_forget_imported(uint64_t pool);

void gp_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
