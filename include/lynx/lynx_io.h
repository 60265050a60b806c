/*
 * lynx_io.h - the accelerator-side I/O API.
 *
 * What an application's persistent loop uses, and nothing else:
 *   lynx_recv    - zero-copy view of the next request (data, len, tag)
 *   lynx_send    - publish a response carrying the request's tag (copying)
 *   lynx_reserve/lynx_commit - the same without a copy: build the response
 *                  in place in the TX slot
 *   lynx_drop    - the request gets no reply; its tag is freed at once
 *   lynx_release - hand the oldest received request's slot back
 * The ring logic underneath is include/lynx/mqueue.h, shared with device code.
 */
#ifndef LYNX_IO_H
#define LYNX_IO_H

#include <string.h>

#include "mqueue.h"

static inline int lynx_recv(struct lynx_mq *mq, struct lynx_msg *m) {
  return lynx_mq_recv(mq, m);
}

static inline void lynx_release(struct lynx_mq *mq) { lynx_mq_release(mq); }

static inline int lynx_reserve(struct lynx_mq *mq, uint32_t max_len,
                               uint8_t **buf) {
  return lynx_mq_reserve(mq, max_len, buf);
}

static inline void lynx_commit(struct lynx_mq *mq, uint32_t tag, uint32_t len,
                               uint32_t max_len) {
  lynx_mq_commit(mq, tag, len, max_len, LYNX_ST_OK);
}

/* Copies len bytes from data into a TX slot and publishes it for tag.
 * 0, -EAGAIN (TX ring full: try again later), -EMSGSIZE (too long). */
static inline int lynx_send(struct lynx_mq *mq, uint32_t tag, const void *data,
                            uint32_t len) {
  uint8_t *buf;
  int rc = lynx_mq_reserve(mq, len, &buf);
  if (rc)
    return rc;
  memcpy(buf, data, len);
  lynx_mq_commit(mq, tag, len, len, LYNX_ST_OK);
  return 0;
}

static inline int lynx_drop(struct lynx_mq *mq, uint32_t tag) {
  return lynx_mq_drop(mq, tag);
}

#endif
