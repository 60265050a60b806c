/*
 * ut_ring.h - test helpers: an mqueue region in plain process memory, and
 * the frontend's side of the rings (write RX slots, read TX slots) done by
 * hand, byte for byte as docs/mqueue.md describes it. Header-only; used by
 * test_mqueue.c and test_apps.c.
 */
#ifndef LYNX_UT_RING_H
#define LYNX_UT_RING_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mqueue.h"

struct ut_region {
  uint8_t *mem;
  struct lynx_geom g;
};

/* The region of Q x S x Z, each ring with an L-byte large area, in mem
 * (4096-aligned, at least size bytes; the caller's): zeroed, its header
 * written. 0, the lynx_geom_init error, or -12 when it does not fit. */
static inline int ut_region_at(struct ut_region *r, uint8_t *mem, uint64_t size,
                               uint32_t q, uint32_t s, uint32_t z, uint32_t l) {
  struct lynx_region_hdr *h;
  int rc;
  memset(r, 0, sizeof(*r));
  rc = lynx_geom_init(&r->g, q, s, z, l);
  if (rc)
    return rc;
  if (r->g.region_size > size)
    return -12;
  r->mem = mem;
  memset(r->mem, 0, (size_t)r->g.region_size);
  h = (struct lynx_region_hdr *)r->mem;
  h->layout_version = LYNX_LAYOUT_VERSION;
  h->region_size = r->g.region_size;
  h->n_mqueues = q;
  h->slots = s;
  h->slot_size = z;
  h->actrl_off = r->g.actrl_off;
  h->fctrl_off = r->g.fctrl_off;
  h->rings_off = r->g.rings_off;
  h->large_bytes = l;
  h->magic = LYNX_REGION_MAGIC;
  return 0;
}

/* The same in a zeroed, 4096-aligned allocation (ut_region_free). 0 or
 * the lynx_geom_init error; -12 when out of memory. */
static inline int ut_region_init_l(struct ut_region *r, uint32_t q, uint32_t s,
                                   uint32_t z, uint32_t l) {
  struct lynx_geom g;
  uint8_t *mem;
  int rc;
  memset(r, 0, sizeof(*r));
  rc = lynx_geom_init(&g, q, s, z, l);
  if (rc)
    return rc;
  mem = aligned_alloc(LYNX_RINGS_ALIGN, (size_t)g.region_size);
  if (!mem)
    return -12;
  return ut_region_at(r, mem, g.region_size, q, s, z, l);
}

static inline int ut_region_init(struct ut_region *r, uint32_t q, uint32_t s,
                                 uint32_t z) {
  return ut_region_init_l(r, q, s, z, 0);
}

static inline void ut_region_free(struct ut_region *r) {
  free(r->mem);
  r->mem = NULL;
}

static inline struct lynx_actrl *ut_actrl(struct ut_region *r, uint32_t q) {
  return (struct lynx_actrl *)(r->mem + lynx_actrl_off(&r->g, q));
}

static inline struct lynx_fctrl *ut_fctrl(struct ut_region *r, uint32_t q) {
  return (struct lynx_fctrl *)(r->mem + lynx_fctrl_off(&r->g, q));
}

static inline uint8_t *ut_rx_slot(struct ut_region *r, uint32_t q,
                                  uint32_t pos) {
  return r->mem + lynx_slot_off(&r->g, lynx_rx_ring_off(&r->g, q), pos);
}

static inline uint8_t *ut_tx_slot(struct ut_region *r, uint32_t q,
                                  uint32_t pos) {
  return r->mem + lynx_slot_off(&r->g, lynx_tx_ring_off(&r->g, q), pos);
}

static inline struct lynx_slot_meta *ut_meta_of(struct ut_region *r,
                                                uint8_t *slot) {
  return (struct lynx_slot_meta *)(slot + r->g.slot_size - LYNX_META_SIZE);
}

/* Frontend producer: writes a request at RX position pos of mqueue q with
 * arbitrary metadata (len/off16/seq as given, so malformed slots can be
 * made), seq last with a store-release. Copies min(len, room) payload bytes
 * at off16*16 when that lies in the slot. */
static inline void ut_put_raw(struct ut_region *r, uint32_t q, uint32_t pos,
                              uint32_t tag, const void *data, uint32_t len,
                              uint16_t off16, uint16_t status, uint32_t seq) {
  uint8_t *slot = ut_rx_slot(r, q, pos);
  struct lynx_slot_meta *m = ut_meta_of(r, slot);
  uint32_t cap = lynx_slot_cap(r->g.slot_size);
  uint64_t off = (uint64_t)off16 * 16u;
  if (data && off < cap) {
    uint64_t n = len;
    if (n > cap - off)
      n = cap - off;
    memcpy(slot + off, data, (size_t)n);
  }
  m->len = len;
  m->tag = tag;
  m->status = status;
  m->off16 = off16;
  lynx_store_release32(&m->seq, seq);
}

/* Frontend producer, well-formed request at position pos. */
static inline void ut_put(struct ut_region *r, uint32_t q, uint32_t pos,
                          uint32_t tag, const void *data, uint32_t len) {
  ut_put_raw(r, q, pos, tag, data, len,
             (uint16_t)(lynx_payload_off(r->g.slot_size, len) / 16u),
             LYNX_ST_OK, lynx_seq_for(pos));
}

/* Frontend forwarder: the TX slot at position pos if it is published for
 * that position (seq == pos + 1) and passes the bounds rule; fills *m and
 * *data. 0, -11 when not published, -90 when malformed. */
static inline int ut_get_tx(struct ut_region *r, uint32_t q, uint32_t pos,
                            struct lynx_slot_meta *m, const uint8_t **data) {
  uint8_t *slot = ut_tx_slot(r, q, pos);
  struct lynx_slot_meta *sm = ut_meta_of(r, slot);
  if (lynx_load_acquire32(&sm->seq) != lynx_seq_for(pos))
    return -11;
  memcpy(m, sm, sizeof(*m));
  if (lynx_meta_check(m, r->g.slot_size) != 0)
    return -90;
  *data = slot + (uint32_t)m->off16 * 16u;
  return 0;
}

/* Frontend producer of a large request at RX position pos: the bytes into
 * the RX large area where a (the frontend's allocator) puts them, the
 * reference into the slot. 0, or -11 when the area has no room. */
static inline int ut_put_large(struct ut_region *r, uint32_t q, uint32_t pos,
                               uint32_t tag, const void *data, uint32_t len,
                               struct lynx_large_alloc *a) {
  uint32_t start, l = r->g.large_bytes;
  struct lynx_large_ref ref;
  if (lynx_large_place(a, l, len, &start))
    return -11;
  ref = lynx_large_ref_at(start, len, l);
  memcpy(r->mem + lynx_rx_large_off(&r->g, q) + ref.off, data, len);
  a->head = ref.end;
  ut_put_raw(r, q, pos, tag, &ref, sizeof(ref),
             (uint16_t)(lynx_payload_off(r->g.slot_size, sizeof(ref)) / 16u),
             LYNX_ST_OK | LYNX_ST_LARGE, lynx_seq_for(pos));
  return 0;
}

/* Frontend forwarder of a TX slot that may be large: as ut_get_tx, with
 * *data and *len the message (in the TX large area when large). -90 also
 * for a reference outside the area. */
static inline int ut_get_tx_msg(struct ut_region *r, uint32_t q, uint32_t pos,
                                struct lynx_slot_meta *m, const uint8_t **data,
                                uint32_t *len) {
  struct lynx_large_ref ref;
  int rc = ut_get_tx(r, q, pos, m, data);
  if (rc)
    return rc;
  *len = m->len;
  if (!(m->status & LYNX_ST_LARGE))
    return 0;
  memcpy(&ref, *data, sizeof(ref));
  if (lynx_large_check(m, &ref, r->g.large_bytes))
    return -90;
  *data = r->mem + lynx_tx_large_off(&r->g, q) + ref.off;
  *len = ref.len;
  return 0;
}

/* Sets every index of mqueue q to start (as if 'start' messages had gone
 * through each ring already) and writes the previous lap's messages into
 * both rings (positions start-S .. start-1), as a real run would have left
 * them. Call before lynx_mq_bind. */
static inline void ut_age_mq(struct ut_region *r, uint32_t q, uint32_t start) {
  uint32_t s = r->g.slots;
  struct lynx_actrl *a = ut_actrl(r, q);
  struct lynx_fctrl *f = ut_fctrl(r, q);
  for (uint32_t k = 0; k < s; k++) {
    uint32_t pos = start - s + k;
    uint8_t old[8] = {0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0};
    struct lynx_slot_meta *tm = ut_meta_of(r, ut_tx_slot(r, q, pos));
    memcpy(old + 4, &pos, 4);
    ut_put(r, q, pos, 0xdead0000u | k, old, sizeof(old));
    tm->len = 0;
    tm->tag = 0xdead0000u | k;
    tm->status = LYNX_ST_OK;
    tm->off16 = 0;
    tm->seq = lynx_seq_for(pos);
  }
  a->rx_cons = start;
  a->tx_prod = start;
  f->tx_cons = start;
}

#endif
