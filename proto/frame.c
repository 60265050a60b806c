/* frame.c - length-prefixed protobuf-c framing; see frame.h. */
#include "frame.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h" /* lynx_grow (inline: nothing of lynx_common is linked) */

int lynx_frame_encode(const Lynx__Envelope *env, size_t max, uint8_t **out,
                      size_t *len) {
  size_t n = lynx__envelope__get_packed_size(env);
  uint8_t *b;
  if (n > max)
    return -EMSGSIZE;
  b = malloc(n + LYNX_FRAME_HDR);
  if (!b)
    return -ENOMEM;
  b[0] = (uint8_t)(n >> 24);
  b[1] = (uint8_t)(n >> 16);
  b[2] = (uint8_t)(n >> 8);
  b[3] = (uint8_t)n;
  lynx__envelope__pack(env, b + LYNX_FRAME_HDR);
  *out = b;
  *len = n + LYNX_FRAME_HDR;
  return 0;
}

void lynx_frame_reader_init(struct lynx_frame_reader *r, size_t max) {
  memset(r, 0, sizeof(*r));
  r->max = max ? max : LYNX_FRAME_MAX_DEFAULT;
}

void lynx_frame_reader_free(struct lynx_frame_reader *r) {
  free(r->buf);
  memset(r, 0, sizeof(*r));
}

int lynx_frame_feed(struct lynx_frame_reader *r, const void *data, size_t n) {
  if (n == 0) /* nothing to add; r->buf may still be NULL */
    return 0;
  if (r->len + n > r->cap) {
    uint8_t *b = lynx_grow(r->buf, &r->cap, r->len + n, 4096, 0);
    if (!b)
      return -ENOMEM;
    r->buf = b;
  }
  memcpy(r->buf + r->len, data, n);
  r->len += n;
  return 0;
}

int lynx_frame_next(struct lynx_frame_reader *r, Lynx__Envelope **env) {
  size_t n;
  Lynx__Envelope *e;
  if (r->len < LYNX_FRAME_HDR)
    return 0;
  n = (size_t)r->buf[0] << 24 | (size_t)r->buf[1] << 16 |
      (size_t)r->buf[2] << 8 | r->buf[3];
  if (n > r->max)
    return -EMSGSIZE;
  if (r->len < LYNX_FRAME_HDR + n)
    return 0;
  e = lynx__envelope__unpack(NULL, n, r->buf + LYNX_FRAME_HDR);
  memmove(r->buf, r->buf + LYNX_FRAME_HDR + n, r->len - LYNX_FRAME_HDR - n);
  r->len -= LYNX_FRAME_HDR + n;
  if (!e)
    return -EBADMSG;
  if (e->msg_case == LYNX__ENVELOPE__MSG__NOT_SET) {
    lynx__envelope__free_unpacked(e, NULL);
    return -EBADMSG;
  }
  *env = e;
  return 1;
}

int lynx_token_equal(const char *given, const char *token) {
  size_t glen = strlen(given), tlen = strlen(token);
  unsigned char d = glen != tlen;
  for (size_t i = 0; i < tlen; i++) { /* every byte, whatever differs first */
    unsigned char g = i < glen ? (unsigned char)given[i] : 0;
    d |= (unsigned char)(g ^ (unsigned char)token[i]);
  }
  return d == 0;
}

int lynx_hello_check(const Lynx__Hello *h, const char *token, char *err,
                     size_t errlen) {
  const char *want = token ? token : "";
  const char *got = h->token ? h->token : "";
  if (h->proto_version != LYNX_PROTO_VERSION) {
    snprintf(err, errlen,
             "protocol version %u not supported (this side speaks %u)",
             h->proto_version, LYNX_PROTO_VERSION);
    return -EPROTO;
  }
  if (!lynx_token_equal(got, want)) {
    snprintf(err, errlen, "%s",
             *want ? "wrong cluster token" : "unexpected cluster token");
    return -EACCES;
  }
  return 0;
}
