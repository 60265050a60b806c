/*
 * tcp_wire.c - the tcp transport's wire rules shared by its two sides
 * beyond the frame codec (the 24-byte little-endian frame header {u8 op,
 * u8 flags, u16 zero, u32 len, u64 off, u64 wr_id}, inline in
 * tcp_internal.h as every frame passes through it): the one rule both
 * sides apply to a compound read's counts, and the growable buffers
 * frames are built in (out) and parsed from (in). The format itself is
 * described in transport_tcp.c and docs/design.md ("tcp transport"); its
 * constants and operation codes are tcp_wire.h's.
 */
#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "mqueue.h"
#include "tcp_internal.h"
#include "util.h"

/* The slots a compound read takes of mqueue q from position from: those
 * the control array actrl (the region's bytes) says are published, at most
 * max; none when tx_prod is more than a ring ahead (a bad index, which the
 * frontend counts). The one rule both sides apply to the same bytes. */
uint32_t lynx__tcp_txr_count(const struct lynx_geom *g, const uint8_t *actrl,
                             uint32_t q, uint32_t from, uint32_t max) {
  struct lynx_actrl a;
  uint32_t avail;
  memcpy(&a, actrl + 8u * q, sizeof(a));
  avail = a.tx_prod - from;
  if (avail > g->slots)
    return 0;
  return avail < max ? avail : max;
}

/* ---- buffers ---------------------------------------------------------- */

int lynx__tcp_buf_reserve(struct tcp_buf *b, size_t more, size_t max) {
  size_t need;
  uint8_t *np;
  if (b->head && b->head == b->len)
    b->head = b->len = 0;
  if (b->len + more <= b->cap)
    return 0;
  if (b->head) { /* compact first */
    memmove(b->p, b->p + b->head, b->len - b->head);
    b->len -= b->head;
    b->head = 0;
    if (b->len + more <= b->cap)
      return 0;
  }
  need = b->len + more;
  if (need > max)
    return -ENOBUFS;
  np = lynx_grow(b->p, &b->cap, need, 65536, max);
  if (!np)
    return -ENOMEM;
  b->p = np;
  return 0;
}

void lynx__tcp_buf_free(struct tcp_buf *b) {
  free(b->p);
  memset(b, 0, sizeof(*b));
}
