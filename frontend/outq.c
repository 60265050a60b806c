/* outq.c - see outq.h. */
#include "outq.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

uint8_t *fe_outq_reserve(struct fe_outq *q, size_t n, size_t max) {
  if (q->len + n > max)
    return NULL;
  if (q->len + n > q->cap) {
    uint8_t *p = lynx_grow(q->buf, &q->cap, q->len + n, 4096, 0);
    if (!p)
      return NULL;
    q->buf = p;
  }
  return q->buf + q->len;
}

int fe_outq_flush(struct fe_outq *q, uv_stream_t *s, void *data,
                  uv_write_cb cb) {
  uv_buf_t b;
  int n, rc;
  if (q->writing || !q->len)
    return 0;
  b = uv_buf_init((char *)q->buf, (unsigned)q->len);
  n = uv_try_write(s, &b, 1);
  if (n < 0 && n != UV_EAGAIN)
    return n;
  if (n > 0) {
    memmove(q->buf, q->buf + n, q->len - (size_t)n);
    q->len -= (size_t)n;
  }
  if (!q->len)
    return 0;
  q->wbuf = malloc(q->len); /* a copy: buf keeps taking appends */
  if (!q->wbuf)
    return UV_ENOMEM;
  memcpy(q->wbuf, q->buf, q->len);
  b = uv_buf_init((char *)q->wbuf, (unsigned)q->len);
  q->len = 0;
  q->req.data = data;
  rc = uv_write(&q->req, s, &b, 1, cb);
  if (rc) {
    free(q->wbuf);
    q->wbuf = NULL;
    return rc;
  }
  q->writing = 1;
  return 0;
}

void fe_outq_written(struct fe_outq *q) {
  q->writing = 0;
  free(q->wbuf);
  q->wbuf = NULL;
}

void fe_outq_free(struct fe_outq *q) {
  free(q->buf);
  free(q->wbuf);
  memset(q, 0, sizeof(*q));
}
