/*
 * outq.h - bytes waiting to go out on a libuv stream (a TCP client of a
 * TCP service, a back-end connection), bounded.
 *
 * Appends go to buf; flush hands buf to the kernel with uv_try_write and,
 * for what the kernel does not take, one uv_write of a copy (so buf can keep
 * growing meanwhile). At most one uv_write is in flight.
 */
#ifndef LYNX_FE_OUTQ_H
#define LYNX_FE_OUTQ_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

struct fe_outq {
  uint8_t *buf; /* not yet handed to libuv */
  size_t len, cap;
  uint8_t *wbuf; /* the uv_write in flight */
  uv_write_t req;
  int writing;
};

/* Room for n more bytes, at most max queued: a pointer to write them to
 * (then add n to len), or NULL (-ENOBUFS past max, or out of memory). */
uint8_t *fe_outq_reserve(struct fe_outq *q, size_t n, size_t max);

/* Hands queued bytes to the kernel; cb (with req.data = data) is called
 * when a uv_write completes (call fe_outq_written first thing). 0, or a
 * libuv error: the stream is broken. */
int fe_outq_flush(struct fe_outq *q, uv_stream_t *s, void *data,
                  uv_write_cb cb);

/* The uv_write in flight completed. */
void fe_outq_written(struct fe_outq *q);

void fe_outq_free(struct fe_outq *q);

#endif
