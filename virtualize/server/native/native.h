/* What the worker's native loop (dispatch.c) uses of its TLS stream (tls.c). */
#ifndef GPUPOOL_NATIVE_H
#define GPUPOOL_NATIVE_H

#include <stddef.h>

struct gpt_stream;

/* Up to n decrypted bytes: > 0 read, 0 the peer closed, -1 failed, -2 none within wait_ms (0: do not
 * wait; -1: the stream's own timeout, or forever). */
long gpt_recv(struct gpt_stream *s, void *buf, size_t n, int wait_ms);
/* All n bytes encrypted and sent: 0, or -1. */
int gpt_send_all(struct gpt_stream *s, const void *p, size_t n);

#endif
