/*
 * fuzz_beframe.c - a back end's replies (client mqueues): the byte stream
 * a memcached or len32 back end sends, cut into replies by
 * fe_be_reply_len (frontend/beframe.c) the way backend.c's be_parse cuts
 * it, reply after reply from the front of its buffer.
 *
 * Input: byte 0 picks the protocol (bit 0: len32, else memcached); the
 * rest is the stream. Besides memory errors, checked: a reply never claims
 * more bytes than are there (len32: never less than its length word);
 * a reply is judged on its own bytes (the same length when nothing
 * follows it) and none of its proper prefixes is complete or malformed
 * (more bytes could only complete it); bytes that are not yet a reply
 * stay so when cut shorter.
 */
#include "beframe.h"
#include "fuzz.h"

/* The checks on one position of the stream: p[0, n) whose first reply
 * fe_be_reply_len says is r bytes long (or 0, -1). */
static void check_prefixes(enum fe_be_proto proto, const uint8_t *p, size_t n,
                           long r) {
  if (r > 0) {
    FZ_CHECK((size_t)r <= n);
    FZ_CHECK(proto != FE_BE_LEN32 || r >= 4);
    FZ_CHECK(fe_be_reply_len(proto, p, (size_t)r) == r);
    FZ_CHECK(fe_be_reply_len(proto, p, (size_t)r - 1) == 0);
    FZ_CHECK(fe_be_reply_len(proto, p, (size_t)r / 2) == 0);
  } else if (n) {
    long k = fe_be_reply_len(proto, p, n - 1);
    /* incomplete stays incomplete; malformed may need its last byte */
    FZ_CHECK(r == 0 ? k == 0 : k <= 0);
    k = fe_be_reply_len(proto, p, n / 2);
    FZ_CHECK(r == 0 ? k == 0 : k <= 0);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct fz f = {data, size};
  enum fe_be_proto proto = fz_u8(&f) & 1 ? FE_BE_LEN32 : FE_BE_MEMCACHED;
  size_t n, off = 0;
  const uint8_t *p = fz_rest(&f, &n);
  for (;;) {
    long r = fe_be_reply_len(proto, p + off, n - off);
    check_prefixes(proto, p + off, n - off, r);
    if (r <= 0)
      break;
    off += (size_t)r;
  }
  return 0;
}
