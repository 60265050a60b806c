/*
 * test_mqueue.c - unit tests of include/lynx/mqueue.h: geometry, slot metadata
 * and the bounds rule, seq/phase, and the accelerator-side ring operations,
 * with the test acting as the frontend (ut_ring.h).
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "lynx_io.h"
#include "mqueue.h"
#include "ut_main.h"
#include "ut_ring.h"

/* ---- fixture: one region, mqueue 0 bound ----------------------------- */

struct fx {
  struct ut_region r;
  struct lynx_mq mq;
};

static struct fx *fx_new_l(uint32_t q, uint32_t s, uint32_t z, uint32_t l) {
  struct fx *f = calloc(1, sizeof(*f));
  assert_non_null(f);
  assert_int_equal(ut_region_init_l(&f->r, q, s, z, l), 0);
  return f;
}

static struct fx *fx_new(uint32_t q, uint32_t s, uint32_t z) {
  return fx_new_l(q, s, z, 0);
}

static int fx_teardown(void **state) {
  struct fx *f = *state;
  if (f) {
    ut_region_free(&f->r);
    free(f);
  }
  *state = NULL;
  return 0;
}

/* ---- geometry --------------------------------------------------------- */

static void test_geom_valid_layout(void **state) {
  struct lynx_geom g;
  (void)state;
  assert_int_equal(lynx_geom_init(&g, 1, 2, 64, 0), 0);
  assert_int_equal(g.n_mqueues, 1);
  assert_int_equal(g.slots, 2);
  assert_int_equal(g.slot_size, 64);
  assert_int_equal(g.actrl_off, 192);
  assert_int_equal(g.fctrl_off, 256); /* 192 + align64(8) */
  assert_int_equal(g.rings_off, 4096);
  assert_int_equal(g.ring_bytes, 128);
  assert_int_equal(g.region_size, 8192); /* 4096 + 256, rounded to 4096 */

  assert_int_equal(lynx_geom_init(&g, 3, 8, 2048, 0), 0);
  assert_int_equal(g.fctrl_off, 192 + 64);
  assert_int_equal(g.rings_off, 4096);
  assert_int_equal(g.ring_bytes, 8 * 2048);
  assert_int_equal(g.region_size, 4096 + 3 * 2 * 8 * 2048);
  /* mqueue 2 of 3: RX at rings_off + 2*S*Z, TX after the 3 RX rings */
  assert_int_equal(lynx_rx_ring_off(&g, 2), 4096 + 2 * 8 * 2048);
  assert_int_equal(lynx_tx_ring_off(&g, 2), 4096 + (3 + 2) * 8 * 2048);
  assert_int_equal(lynx_actrl_off(&g, 2), 192 + 16);
  assert_int_equal(lynx_fctrl_off(&g, 2), 256 + 16);
  /* slot index is pos & (S-1), including free-running positions */
  assert_int_equal(lynx_slot_off(&g, 4096, 9), 4096 + 1 * 2048);
  assert_int_equal(lynx_slot_off(&g, 4096, 0xFFFFFFFFu), 4096 + 7 * 2048);

  /* the upper limits are accepted; control arrays grow with Q */
  assert_int_equal(
      lynx_geom_init(&g, LYNX_MQUEUES_MAX, LYNX_SLOTS_MAX, LYNX_SLOT_MAX, 0),
      0);
  assert_int_equal(g.fctrl_off, 192 + 8 * 1024);
  assert_int_equal(g.rings_off, 20480); /* align4096(192 + 2 * 8192) */
  assert_int_equal(g.ring_bytes, 65536ull << 20);
  assert_true(g.region_size == 20480ull + 2048ull * (65536ull << 20));
  assert_int_equal(g.rings_off % LYNX_RINGS_ALIGN, 0);
  assert_int_equal(g.region_size % LYNX_RINGS_ALIGN, 0);
  /* Q = 9: control arrays of align64(72) = 128 bytes each */
  assert_int_equal(lynx_geom_init(&g, 9, 4, 128, 0), 0);
  assert_int_equal(g.fctrl_off, 192 + 128);
}

static void test_geom_rejects_out_of_bounds(void **state) {
  struct lynx_geom g;
  (void)state;
  /* mqueues 1..1024 */
  assert_int_equal(lynx_geom_init(&g, 0, 8, 256, 0), -22);
  assert_int_equal(lynx_geom_init(&g, 1025, 8, 256, 0), -22);
  assert_int_equal(lynx_geom_init(&g, 0xFFFFFFFFu, 8, 256, 0), -22);
  /* slots: power of two, 2..65536 */
  assert_int_equal(lynx_geom_init(&g, 1, 0, 256, 0), -22);
  assert_int_equal(lynx_geom_init(&g, 1, 1, 256, 0), -22);
  assert_int_equal(lynx_geom_init(&g, 1, 3, 256, 0), -22);
  assert_int_equal(lynx_geom_init(&g, 1, 6, 256, 0), -22);
  assert_int_equal(lynx_geom_init(&g, 1, 1000, 256, 0), -22);
  assert_int_equal(lynx_geom_init(&g, 1, 65535, 256, 0), -22);
  assert_int_equal(lynx_geom_init(&g, 1, 131072, 256, 0), -22);
  assert_int_equal(lynx_geom_init(&g, 1, 0x80000000u, 256, 0), -22);
  /* slot size: power of two, 64 B .. 1 MiB */
  assert_int_equal(lynx_geom_init(&g, 1, 8, 0, 0), -22);
  assert_int_equal(lynx_geom_init(&g, 1, 8, 32, 0), -22);
  assert_int_equal(lynx_geom_init(&g, 1, 8, 63, 0), -22);
  assert_int_equal(lynx_geom_init(&g, 1, 8, 96, 0), -22);
  assert_int_equal(lynx_geom_init(&g, 1, 8, 1000, 0), -22);
  assert_int_equal(lynx_geom_init(&g, 1, 8, 2049, 0), -22);
  assert_int_equal(lynx_geom_init(&g, 1, 8, 2u << 20, 0), -22);
  assert_int_equal(lynx_geom_init(&g, 1, 8, 0x80000000u, 0), -22);
  /* the lower limits are accepted */
  assert_int_equal(lynx_geom_init(&g, 1, 2, 64, 0), 0);
  assert_int_equal(lynx_geom_init(&g, 1024, 2, 64, 0), 0);

  assert_false(lynx_is_pow2(0));
  assert_true(lynx_is_pow2(1));
  assert_false(lynx_is_pow2(12));
  assert_true(lynx_is_pow2(0x80000000u));
}

/* ---- slot metadata and the bounds rule -------------------------------- */

static void test_payload_off(void **state) {
  (void)state;
  assert_int_equal(lynx_slot_cap(2048), 2032);
  /* 14-byte message in a 2 KiB slot: 32 bytes on the wire */
  assert_int_equal(lynx_payload_off(2048, 14), 2016);
  assert_int_equal(2048 - lynx_payload_off(2048, 14), 32);
  assert_int_equal(lynx_payload_off(2048, 0), 2032);
  assert_int_equal(lynx_payload_off(2048, 2032), 0);
  assert_int_equal(lynx_payload_off(64, 48), 0);
  assert_int_equal(lynx_payload_off(64, 1), 32);
  for (uint32_t len = 0; len <= 2032; len++) {
    uint32_t off = lynx_payload_off(2048, len);
    assert_int_equal(off % 16, 0);
    assert_true(off + len <= 2032);
    assert_true(off + len + 16 > 2032); /* pad < 16 */
  }
}

static void test_meta_check(void **state) {
  struct lynx_slot_meta m;
  const uint32_t z = 256, cap = 240;
  (void)state;
  memset(&m, 0, sizeof(m));
  assert_int_equal(lynx_meta_check(&m, z), 0);
  m.len = cap; /* exactly the slot's capacity */
  assert_int_equal(lynx_meta_check(&m, z), 0);
  m.len = cap + 1;
  assert_int_equal(lynx_meta_check(&m, z), -90);
  assert_int_equal(lynx_meta_check(&m, z), -EMSGSIZE);
  m.len = z; /* the whole slot, metadata included */
  assert_int_equal(lynx_meta_check(&m, z), -90);
  m.len = 0xFFFFFFFFu;
  assert_int_equal(lynx_meta_check(&m, z), -90);
  /* off16 out of range: payload would run into the metadata */
  m.len = 16;
  m.off16 = (cap - 16) / 16; /* ends exactly at the metadata: fine */
  assert_int_equal(lynx_meta_check(&m, z), 0);
  m.off16++;
  assert_int_equal(lynx_meta_check(&m, z), -90);
  m.len = 0;
  m.off16 = cap / 16; /* empty payload at the metadata: fine */
  assert_int_equal(lynx_meta_check(&m, z), 0);
  m.off16 = cap / 16 + 1;
  assert_int_equal(lynx_meta_check(&m, z), -90);
  m.off16 = 0xFFFF; /* far outside: no wrap-around in the check */
  assert_int_equal(lynx_meta_check(&m, z), -90);
  m.len = 0xFFFFFFF0u;
  assert_int_equal(lynx_meta_check(&m, z), -90);
  /* 1 MiB slots: the largest off16 (65535) is exactly the capacity */
  m.len = 0;
  m.off16 = 0xFFFF;
  assert_int_equal(lynx_meta_check(&m, LYNX_SLOT_MAX), 0);
  m.len = 1;
  assert_int_equal(lynx_meta_check(&m, LYNX_SLOT_MAX), -90);
  assert_int_equal(sizeof(struct lynx_slot_meta), LYNX_META_SIZE);
  assert_int_equal(offsetof(struct lynx_slot_meta, seq), 12);
  assert_int_equal(sizeof(struct lynx_region_hdr), 64);
}

static void test_ring_full_and_used(void **state) {
  (void)state;
  assert_int_equal(lynx_ring_used(5, 5), 0);
  assert_false(lynx_ring_full(5, 5, 4));
  assert_false(lynx_ring_full(8, 5, 4));
  assert_true(lynx_ring_full(9, 5, 4));
  /* across 2^32 */
  assert_int_equal(lynx_ring_used(2, 0xFFFFFFFEu), 4);
  assert_true(lynx_ring_full(2, 0xFFFFFFFEu, 4));
  assert_false(lynx_ring_full(1, 0xFFFFFFFEu, 4));
  assert_false(lynx_ring_full(0xFFFFFFFFu, 0xFFFFFFFEu, 4));
  assert_true(lynx_ring_full(0x0000FFFFu, 0xFFFFFFFFu, 65536));
  assert_false(lynx_ring_full(0x0000FFFEu, 0xFFFFFFFFu, 65536));
  assert_int_equal(lynx_seq_for(0), 1);
  assert_int_equal(lynx_seq_for(0xFFFFFFFEu), 0xFFFFFFFFu);
  assert_int_equal(lynx_seq_for(0xFFFFFFFFu), 0);
}

/* ---- receive, release, send ------------------------------------------- */

static void test_recv_send_basic(void **state) {
  struct fx *f = *state = fx_new(2, 4, 256);
  struct lynx_msg m = {0};
  struct lynx_slot_meta tm = {0};
  const uint8_t *data = NULL;
  const char req[] = "hello, accelerator";
  uint8_t *slot;

  /* bind mqueue 1 so that mqueue indices in the offsets matter */
  lynx_mq_bind(&f->mq, f->r.mem, &f->r.g, 1);
  assert_int_equal(lynx_mq_recv(&f->mq, &m), -EAGAIN);
  assert_false(lynx_mq_rx_ready(&f->mq));

  ut_put(&f->r, 1, 0, 0xABCD0001u, req, sizeof(req));
  /* nothing for mqueue 0 */
  ut_put(&f->r, 0, 0, 0, NULL, 0);
  assert_true(lynx_mq_rx_ready(&f->mq));
  assert_int_equal(lynx_mq_recv(&f->mq, &m), 0);
  slot = ut_rx_slot(&f->r, 1, 0);
  /* zero copy: a view into the slot at the 16-byte aligned payload_off */
  assert_ptr_equal(m.data, slot + lynx_payload_off(256, sizeof(req)));
  assert_int_equal(m.len, sizeof(req));
  assert_int_equal(m.tag, 0xABCD0001u);
  assert_int_equal(m.status, LYNX_ST_OK);
  assert_memory_equal(m.data, req, sizeof(req));
  assert_int_equal(lynx_mq_recv(&f->mq, &m), -EAGAIN);
  /* not released yet: the frontend still sees the slot in use */
  assert_int_equal(ut_actrl(&f->r, 1)->rx_cons, 0);

  assert_int_equal(lynx_send(&f->mq, 0xABCD0001u, "pong", 4), 0);
  assert_int_equal(ut_actrl(&f->r, 1)->tx_prod, 1);
  assert_int_equal(ut_actrl(&f->r, 0)->tx_prod, 0);
  assert_int_equal(ut_get_tx(&f->r, 1, 0, &tm, &data), 0);
  assert_int_equal(tm.len, 4);
  assert_int_equal(tm.tag, 0xABCD0001u);
  assert_int_equal(tm.status, LYNX_ST_OK);
  assert_int_equal(tm.off16 * 16u, lynx_payload_off(256, 4));
  assert_memory_equal(data, "pong", 4);
  assert_int_equal(ut_get_tx(&f->r, 1, 1, &tm, &data), -EAGAIN);

  lynx_mq_release(&f->mq);
  assert_int_equal(ut_actrl(&f->r, 1)->rx_cons, 1);
  /* releasing with nothing held changes nothing */
  lynx_mq_release(&f->mq);
  assert_int_equal(ut_actrl(&f->r, 1)->rx_cons, 1);
  assert_int_equal(f->mq.bad, 0);

  /* a CLIENT_CLOSED status is passed through */
  ut_put_raw(&f->r, 1, 1, 77, NULL, 0, (uint16_t)(240 / 16),
             LYNX_ST_CLIENT_CLOSED, lynx_seq_for(1));
  assert_int_equal(lynx_mq_recv(&f->mq, &m), 0);
  assert_int_equal(m.status, LYNX_ST_CLIENT_CLOSED);
  assert_int_equal(m.len, 0);
  assert_int_equal(m.tag, 77);
}

/* The producer may leave the payload lower than payload_off: the consumer
 * trusts off16 (within the bounds rule). */
static void test_recv_trusts_off16(void **state) {
  struct fx *f = *state = fx_new(1, 4, 256);
  struct lynx_msg m = {0};
  lynx_mq_bind(&f->mq, f->r.mem, &f->r.g, 0);
  ut_put_raw(&f->r, 0, 0, 5, "abcdef", 6, 3, LYNX_ST_OK, 1);
  assert_int_equal(lynx_mq_recv(&f->mq, &m), 0);
  assert_ptr_equal(m.data, ut_rx_slot(&f->r, 0, 0) + 48);
  assert_memory_equal(m.data, "abcdef", 6);
}

/* Reserve for a maximum, commit a shorter response: the payload stays where
 * it was reserved, and the metadata says so. */
static void test_reserve_commit_shorter(void **state) {
  struct fx *f = *state = fx_new(1, 4, 256);
  struct lynx_slot_meta tm = {0};
  const uint8_t *data = NULL;
  uint8_t *buf = NULL;
  lynx_mq_bind(&f->mq, f->r.mem, &f->r.g, 0);
  assert_int_equal(lynx_mq_reserve(&f->mq, 100, &buf), 0);
  assert_ptr_equal(buf, ut_tx_slot(&f->r, 0, 0) + lynx_payload_off(256, 100));
  memcpy(buf, "short", 5);
  lynx_mq_commit(&f->mq, 9, 5, 100, LYNX_ST_OK);
  assert_int_equal(ut_get_tx(&f->r, 0, 0, &tm, &data), 0);
  assert_int_equal(tm.len, 5);
  assert_int_equal(tm.off16 * 16u, lynx_payload_off(256, 100));
  assert_ptr_equal(data, buf);
  assert_memory_equal(data, "short", 5);
  assert_int_equal(lynx_meta_check(&tm, 256), 0);
}

static void test_reserve_emsgsize(void **state) {
  struct fx *f = *state = fx_new(1, 4, 256);
  uint8_t *buf = NULL;
  uint8_t big[241];
  memset(big, 0x5a, sizeof(big));
  lynx_mq_bind(&f->mq, f->r.mem, &f->r.g, 0);
  assert_int_equal(lynx_mq_reserve(&f->mq, 241, &buf), -90);
  assert_int_equal(-90, -EMSGSIZE);
  assert_null(buf);
  assert_int_equal(lynx_mq_reserve(&f->mq, 0xFFFFFFFFu, &buf), -EMSGSIZE);
  assert_int_equal(lynx_send(&f->mq, 1, big, sizeof(big)), -EMSGSIZE);
  /* nothing was published */
  assert_int_equal(f->mq.tx_prod, 0);
  assert_int_equal(ut_actrl(&f->r, 0)->tx_prod, 0);
  assert_int_equal(ut_meta_of(&f->r, ut_tx_slot(&f->r, 0, 0))->seq, 0);
  /* exactly the capacity fits, at the very start of the slot */
  assert_int_equal(lynx_mq_reserve(&f->mq, 240, &buf), 0);
  assert_ptr_equal(buf, ut_tx_slot(&f->r, 0, 0));
  assert_int_equal(lynx_send(&f->mq, 1, big, 240), 0);
  assert_int_equal(ut_actrl(&f->r, 0)->tx_prod, 1);
}

static void test_drop_publishes_dropped(void **state) {
  struct fx *f = *state = fx_new(1, 2, 128);
  struct lynx_slot_meta tm = {0};
  const uint8_t *data = NULL;
  lynx_mq_bind(&f->mq, f->r.mem, &f->r.g, 0);
  /* make the slot look used, so len 0 must be written, not inherited */
  ut_meta_of(&f->r, ut_tx_slot(&f->r, 0, 0))->len = 99;
  assert_int_equal(lynx_mq_drop(&f->mq, 0x1234u), 0);
  assert_int_equal(ut_actrl(&f->r, 0)->tx_prod, 1);
  assert_int_equal(ut_get_tx(&f->r, 0, 0, &tm, &data), 0);
  assert_int_equal(tm.status, LYNX_ST_DROPPED);
  assert_int_equal(tm.status, 2);
  assert_int_equal(tm.len, 0);
  assert_int_equal(tm.tag, 0x1234u);
  assert_int_equal(tm.seq, 1);
  assert_int_equal(lynx_drop(&f->mq, 0x1235u), 0);
  /* TX full (2 slots, frontend drained none): drop is refused, not lost */
  assert_int_equal(lynx_mq_drop(&f->mq, 0x1236u), -EAGAIN);
  assert_int_equal(ut_actrl(&f->r, 0)->tx_prod, 2);
  ut_fctrl(&f->r, 0)->tx_cons = 1;
  assert_int_equal(lynx_mq_drop(&f->mq, 0x1236u), 0);
  assert_int_equal(ut_get_tx(&f->r, 0, 2, &tm, &data), 0);
  assert_int_equal(tm.tag, 0x1236u);
  assert_int_equal(tm.status, LYNX_ST_DROPPED);
}

/* ---- full rings -------------------------------------------------------- */

static void test_tx_full_eagain(void **state) {
  struct fx *f = *state = fx_new(1, 4, 128);
  uint8_t *buf;
  uint32_t v;
  lynx_mq_bind(&f->mq, f->r.mem, &f->r.g, 0);
  for (v = 0; v < 4; v++)
    assert_int_equal(lynx_send(&f->mq, v, &v, sizeof(v)), 0);
  assert_int_equal(lynx_mq_reserve(&f->mq, 4, &buf), -EAGAIN);
  assert_int_equal(lynx_mq_reserve(&f->mq, 4, &buf), -11);
  assert_int_equal(lynx_send(&f->mq, 4, &v, sizeof(v)), -EAGAIN);
  assert_int_equal(ut_actrl(&f->r, 0)->tx_prod, 4);
  /* the frontend sees the ring full too */
  assert_true(lynx_ring_full(ut_actrl(&f->r, 0)->tx_prod,
                             ut_fctrl(&f->r, 0)->tx_cons, 4));
  /* the frontend drains two: reserve re-reads fctrl and succeeds twice */
  ut_fctrl(&f->r, 0)->tx_cons = 2;
  assert_int_equal(lynx_send(&f->mq, 4, &v, sizeof(v)), 0);
  assert_int_equal(lynx_send(&f->mq, 5, &v, sizeof(v)), 0);
  assert_int_equal(lynx_send(&f->mq, 6, &v, sizeof(v)), -EAGAIN);
  assert_int_equal(ut_actrl(&f->r, 0)->tx_prod, 6);
  /* position 4 and 5 reuse slots 0 and 1 with the next lap's seq */
  assert_int_equal(ut_meta_of(&f->r, ut_tx_slot(&f->r, 0, 4))->seq, 5);
  assert_int_equal(ut_meta_of(&f->r, ut_tx_slot(&f->r, 0, 5))->tag, 5);
}

static void test_rx_full_enobufs(void **state) {
  struct fx *f = *state = fx_new(1, 4, 128);
  struct lynx_msg m = {0};
  uint32_t rx_prod = 0;
  lynx_mq_bind(&f->mq, f->r.mem, &f->r.g, 0);
  /* the frontend fills the ring, checking flow control as it goes */
  while (!lynx_ring_full(rx_prod, ut_actrl(&f->r, 0)->rx_cons, 4) &&
         rx_prod - ut_actrl(&f->r, 0)->rx_cons < 100) {
    ut_put(&f->r, 0, rx_prod, rx_prod, &rx_prod, 4);
    rx_prod++;
  }
  assert_int_equal(rx_prod, 4);
  for (uint32_t i = 0; i < 4; i++) {
    assert_int_equal(lynx_mq_recv(&f->mq, &m), 0);
    assert_int_equal(m.tag, i);
  }
  /* every slot held: the next recv must not look at slot 0 again */
  assert_int_equal(lynx_mq_recv(&f->mq, &m), -ENOBUFS);
  assert_true(lynx_ring_full(rx_prod, ut_actrl(&f->r, 0)->rx_cons, 4));
  lynx_mq_release(&f->mq);
  assert_int_equal(ut_actrl(&f->r, 0)->rx_cons, 1);
  assert_false(lynx_ring_full(rx_prod, ut_actrl(&f->r, 0)->rx_cons, 4));
  assert_int_equal(lynx_mq_recv(&f->mq, &m), -EAGAIN);
  ut_put(&f->r, 0, rx_prod, 100, &rx_prod, 4);
  rx_prod++;
  assert_int_equal(lynx_mq_recv(&f->mq, &m), 0);
  assert_int_equal(m.tag, 100);
  assert_ptr_equal(m.data, ut_rx_slot(&f->r, 0, 0) + lynx_payload_off(128, 4));
}

/* ---- wrap-around of the free-running indices -------------------------- */

static void test_wraparound_u32(void **state) {
  struct fx *f = *state = fx_new(2, 8, 128);
  const uint32_t start = 0xFFFFFFF0u, total = 64;
  struct lynx_msg m = {0};
  uint32_t rx_prod = start, tx_cons = start, sent = 0, answered = 0;
  uint32_t got = 0;

  ut_age_mq(&f->r, 1, start);
  lynx_mq_bind(&f->mq, f->r.mem, &f->r.g, 1);
  assert_int_equal(f->mq.rx_head, start);
  assert_int_equal(f->mq.tx_prod, start);
  assert_int_equal(f->mq.tx_cons, start);
  /* last lap's messages are not new */
  assert_int_equal(lynx_mq_recv(&f->mq, &m), -EAGAIN);

  for (int rounds = 0; answered < total; rounds++) {
    assert_true(rounds < 1000); /* no progress: fail, do not hang */
    /* frontend: fill what flow control allows, at most 5 per batch */
    for (int k = 0; k < 5 && sent < total &&
                    !lynx_ring_full(rx_prod, ut_actrl(&f->r, 1)->rx_cons, 8);
         k++) {
      uint32_t body[2] = {rx_prod, ~rx_prod};
      ut_put(&f->r, 1, rx_prod, 0x7000u + sent, body, sizeof(body));
      rx_prod++;
      sent++;
    }
    /* accelerator: answer everything waiting, echo with the tag */
    for (int guard = 0;; guard++) {
      assert_true(guard <= 8); /* never more than a ring's worth */
      int rc = lynx_mq_recv(&f->mq, &m);
      if (rc == -EAGAIN)
        break;
      assert_int_equal(rc, 0);
      assert_int_equal(m.tag, 0x7000u + got);
      assert_int_equal(m.len, 8);
      assert_int_equal(lynx_send(&f->mq, m.tag, m.data, m.len), 0);
      lynx_mq_release(&f->mq);
      got++;
    }
    /* frontend: forward responses in order, then write tx_cons back */
    for (int guard = 0;; guard++) {
      assert_true(guard <= 8);
      struct lynx_slot_meta tm = {0};
      const uint8_t *data = NULL;
      uint32_t body[2];
      int rc = ut_get_tx(&f->r, 1, tx_cons, &tm, &data);
      if (rc == -EAGAIN)
        break;
      assert_int_equal(rc, 0);
      assert_int_equal(tm.tag, 0x7000u + answered);
      assert_int_equal(tm.len, 8);
      memcpy(body, data, sizeof(body));
      assert_int_equal(body[0], start + answered);
      assert_int_equal(body[1], ~(start + answered));
      tx_cons++;
      answered++;
    }
    assert_int_equal(lynx_ring_used(ut_actrl(&f->r, 1)->tx_prod, tx_cons), 0);
    ut_fctrl(&f->r, 1)->tx_cons = tx_cons;
  }
  assert_int_equal(got, total);
  /* every index crossed 2^32 */
  assert_int_equal(rx_prod, 0x30u);
  assert_int_equal(ut_actrl(&f->r, 1)->rx_cons, 0x30u);
  assert_int_equal(ut_actrl(&f->r, 1)->tx_prod, 0x30u);
  assert_int_equal(f->mq.rx_head, 0x30u);
  assert_int_equal(f->mq.bad, 0);
  /* the message at position 0xFFFFFFFF carried seq 0 */
  assert_int_equal(lynx_seq_for(0xFFFFFFFFu), 0);
  /* the other mqueue was never touched */
  assert_int_equal(ut_actrl(&f->r, 0)->rx_cons, 0);
  assert_int_equal(ut_actrl(&f->r, 0)->tx_prod, 0);
}

/* Full ring detection and TX flow control right at the 2^32 boundary. */
static void test_wraparound_full(void **state) {
  struct fx *f = *state = fx_new(1, 4, 128);
  const uint32_t start = 0xFFFFFFFEu;
  struct lynx_msg m = {0};
  uint8_t *buf;
  uint32_t rx_prod = start;

  ut_age_mq(&f->r, 0, start);
  lynx_mq_bind(&f->mq, f->r.mem, &f->r.g, 0);
  while (!lynx_ring_full(rx_prod, ut_actrl(&f->r, 0)->rx_cons, 4) &&
         rx_prod - ut_actrl(&f->r, 0)->rx_cons < 100) {
    ut_put(&f->r, 0, rx_prod, rx_prod, NULL, 0);
    rx_prod++;
  }
  assert_int_equal(rx_prod, 2); /* 0xFFFFFFFE + 4 */
  for (uint32_t i = 0; i < 4; i++) {
    assert_int_equal(lynx_mq_recv(&f->mq, &m), 0);
    assert_int_equal(m.tag, start + i);
    assert_int_equal(lynx_mq_drop(&f->mq, m.tag), 0);
  }
  assert_int_equal(lynx_mq_recv(&f->mq, &m), -ENOBUFS);
  assert_int_equal(lynx_mq_reserve(&f->mq, 0, &buf), -EAGAIN);
  assert_int_equal(ut_actrl(&f->r, 0)->tx_prod, 2);
  for (uint32_t i = 0; i < 4; i++)
    lynx_mq_release(&f->mq);
  assert_int_equal(ut_actrl(&f->r, 0)->rx_cons, 2);
  assert_int_equal(lynx_mq_recv(&f->mq, &m), -EAGAIN);
  ut_fctrl(&f->r, 0)->tx_cons = 1;
  assert_int_equal(lynx_mq_reserve(&f->mq, 0, &buf), 0);
}

/* ---- phase ------------------------------------------------------------ */

static void test_phase_flip_across_laps(void **state) {
  struct fx *f = *state = fx_new(1, 4, 128);
  struct lynx_msg m = {0};
  uint32_t pos;
  lynx_mq_bind(&f->mq, f->r.mem, &f->r.g, 0);

  /* lap 0: positions 0..3, all received and released */
  for (pos = 0; pos < 4; pos++)
    ut_put(&f->r, 0, pos, 100 + pos, "lap0", 4);
  for (pos = 0; pos < 4; pos++) {
    assert_int_equal(lynx_mq_recv(&f->mq, &m), 0);
    assert_int_equal(m.tag, 100 + pos);
    lynx_mq_release(&f->mq);
  }
  /* The consumer now expects position 4 in slot 0, which still holds the
   * lap-0 message (seq 1): it must not be received again. */
  assert_int_equal(ut_meta_of(&f->r, ut_rx_slot(&f->r, 0, 4))->seq, 1);
  assert_false(lynx_mq_rx_ready(&f->mq));
  assert_int_equal(lynx_mq_recv(&f->mq, &m), -EAGAIN);
  assert_int_equal(f->mq.rx_head, 4);

  /* A slot carrying a seq from another lap ahead (position 8) is not the
   * message at position 4 either. */
  ut_put_raw(&f->r, 0, 4, 666, NULL, 0, 15, LYNX_ST_OK, lynx_seq_for(8));
  assert_int_equal(lynx_mq_recv(&f->mq, &m), -EAGAIN);
  /* Two laps behind (position 0xFFFFFFFC, i.e. -4) neither. */
  ut_put_raw(&f->r, 0, 4, 667, NULL, 0, 15, LYNX_ST_OK,
             lynx_seq_for(0xFFFFFFFCu));
  assert_int_equal(lynx_mq_recv(&f->mq, &m), -EAGAIN);
  assert_int_equal(f->mq.bad, 0);

  /* lap 1: the real message at position 4 */
  ut_put(&f->r, 0, 4, 104, "lap1", 4);
  assert_true(lynx_mq_rx_ready(&f->mq));
  assert_int_equal(lynx_mq_recv(&f->mq, &m), 0);
  assert_int_equal(m.tag, 104);
  assert_memory_equal(m.data, "lap1", 4);
  /* position 5's slot holds lap 0's position 1 */
  assert_int_equal(lynx_mq_recv(&f->mq, &m), -EAGAIN);
}

/* The TX side carries the phase too: a forwarder expecting position 4 does
 * not take lap 0's response in slot 0 for it. */
static void test_phase_tx_side(void **state) {
  struct fx *f = *state = fx_new(1, 4, 128);
  struct lynx_slot_meta tm = {0};
  const uint8_t *data = NULL;
  lynx_mq_bind(&f->mq, f->r.mem, &f->r.g, 0);
  for (uint32_t i = 0; i < 4; i++)
    assert_int_equal(lynx_send(&f->mq, i, "x", 1), 0);
  for (uint32_t i = 0; i < 4; i++)
    assert_int_equal(ut_get_tx(&f->r, 0, i, &tm, &data), 0);
  ut_fctrl(&f->r, 0)->tx_cons = 4;
  assert_int_equal(ut_get_tx(&f->r, 0, 4, &tm, &data), -EAGAIN);
  assert_int_equal(lynx_send(&f->mq, 44, "y", 1), 0);
  assert_int_equal(ut_get_tx(&f->r, 0, 4, &tm, &data), 0);
  assert_int_equal(tm.tag, 44);
  assert_int_equal(tm.seq, 5);
}

/* ---- out-of-order responses -------------------------------------------- */

static void test_out_of_order_by_tag(void **state) {
  struct fx *f = *state = fx_new(1, 8, 256);
  struct lynx_msg m[3] = {{0}};
  const char *body[3] = {"first", "second", "third"};
  const uint32_t tags[3] = {0x11110001u, 0x22220002u, 0x33330003u};
  const int order[3] = {2, 0, 1}; /* answer 3, 1, 2 */
  lynx_mq_bind(&f->mq, f->r.mem, &f->r.g, 0);
  for (uint32_t i = 0; i < 3; i++)
    ut_put(&f->r, 0, i, tags[i], body[i], (uint32_t)strlen(body[i]));
  for (int i = 0; i < 3; i++) {
    assert_int_equal(lynx_mq_recv(&f->mq, &m[i]), 0);
    assert_int_equal(m[i].tag, tags[i]);
  }
  for (int k = 0; k < 3; k++) {
    const struct lynx_msg *r = &m[order[k]];
    char out[32];
    int n = snprintf(out, sizeof(out), "re:%.*s", (int)r->len,
                     (const char *)r->data);
    assert_int_equal(lynx_send(&f->mq, r->tag, out, (uint32_t)n), 0);
  }
  assert_int_equal(ut_actrl(&f->r, 0)->tx_prod, 3);
  for (uint32_t pos = 0; pos < 3; pos++) {
    struct lynx_slot_meta tm = {0};
    const uint8_t *data = NULL;
    char want[32];
    int n = snprintf(want, sizeof(want), "re:%s", body[order[pos]]);
    assert_int_equal(ut_get_tx(&f->r, 0, pos, &tm, &data), 0);
    assert_int_equal(tm.tag, tags[order[pos]]);
    assert_int_equal(tm.len, n);
    assert_memory_equal(data, want, (size_t)n);
  }
  /* RX releases are in receive order regardless */
  for (uint32_t i = 1; i <= 3; i++) {
    lynx_mq_release(&f->mq);
    assert_int_equal(ut_actrl(&f->r, 0)->rx_cons, i);
  }
}

/* ---- malformed requests ----------------------------------------------- */

/* Nothing held: the malformed slot is skipped, counted and released at
 * once; the ring does not leak a slot. */
static void test_malformed_skipped_unheld(void **state) {
  struct fx *f = *state = fx_new(1, 4, 256);
  struct lynx_msg m = {0};
  uint32_t rx_prod = 0, n;
  struct lynx_slot_meta *bad;
  lynx_mq_bind(&f->mq, f->r.mem, &f->r.g, 0);

  ut_put_raw(&f->r, 0, 0, 1, NULL, 256 /* > Z - 16 */, 0, LYNX_ST_OK, 1);
  bad = ut_meta_of(&f->r, ut_rx_slot(&f->r, 0, 0));
  assert_int_equal(lynx_meta_check(bad, 256), -EMSGSIZE);
  ut_put(&f->r, 0, 1, 2, "ok", 2);
  rx_prod = 2;
  assert_int_equal(lynx_mq_recv(&f->mq, &m), 0);
  assert_int_equal(m.tag, 2);
  assert_int_equal(f->mq.bad, 1);
  /* the skipped slot is already free, the held one is not */
  assert_int_equal(ut_actrl(&f->r, 0)->rx_cons, 1);
  lynx_mq_release(&f->mq);
  assert_int_equal(ut_actrl(&f->r, 0)->rx_cons, 2);
  assert_int_equal(lynx_mq_recv(&f->mq, &m), -EAGAIN);

  /* the producer can fill S more slots */
  for (n = 0; !lynx_ring_full(rx_prod, ut_actrl(&f->r, 0)->rx_cons, 4); n++) {
    ut_put(&f->r, 0, rx_prod, 10 + n, "more", 4);
    rx_prod++;
  }
  assert_int_equal(n, 4);
  for (n = 0; n < 4; n++) {
    assert_int_equal(lynx_mq_recv(&f->mq, &m), 0);
    assert_int_equal(m.tag, 10 + n);
    lynx_mq_release(&f->mq);
  }
  assert_int_equal(ut_actrl(&f->r, 0)->rx_cons, 6);
  assert_int_equal(f->mq.bad, 1);
}

/* A request held by the app, then a malformed slot (off16 out of range),
 * then a good one: the malformed slot is freed with the held one before
 * it, in order, and nothing leaks. */
static void test_malformed_skipped_behind_held(void **state) {
  struct fx *f = *state = fx_new(1, 4, 256);
  struct lynx_msg m0 = {0}, m2 = {0};
  uint32_t rx_prod, n;
  lynx_mq_bind(&f->mq, f->r.mem, &f->r.g, 0);

  ut_put(&f->r, 0, 0, 100, "held", 4);
  ut_put_raw(&f->r, 0, 1, 101, NULL, 16, 15 /* 240 + 16 > 240 */, LYNX_ST_OK,
             2);
  assert_int_equal(
      lynx_meta_check(ut_meta_of(&f->r, ut_rx_slot(&f->r, 0, 1)), 256), -90);
  ut_put(&f->r, 0, 2, 102, "next", 4);
  rx_prod = 3;

  assert_int_equal(lynx_mq_recv(&f->mq, &m0), 0);
  assert_int_equal(m0.tag, 100);
  assert_int_equal(lynx_mq_recv(&f->mq, &m2), 0);
  assert_int_equal(m2.tag, 102);
  assert_int_equal(f->mq.bad, 1);
  /* slot 0 is still held: nothing may be released yet */
  assert_int_equal(ut_actrl(&f->r, 0)->rx_cons, 0);
  assert_memory_equal(m0.data, "held", 4);
  lynx_mq_release(&f->mq); /* frees 0 and the skipped 1 */
  assert_int_equal(ut_actrl(&f->r, 0)->rx_cons, 2);
  lynx_mq_release(&f->mq);
  assert_int_equal(ut_actrl(&f->r, 0)->rx_cons, 3);

  for (n = 0; !lynx_ring_full(rx_prod, ut_actrl(&f->r, 0)->rx_cons, 4); n++) {
    ut_put(&f->r, 0, rx_prod, 200 + n, "more", 4);
    rx_prod++;
  }
  assert_int_equal(n, 4);
  for (n = 0; n < 4; n++) {
    assert_int_equal(lynx_mq_recv(&f->mq, &m0), 0);
    assert_int_equal(m0.tag, 200 + n);
  }
  assert_int_equal(lynx_mq_recv(&f->mq, &m0), -ENOBUFS);
  for (n = 0; n < 4; n++)
    lynx_mq_release(&f->mq);
  assert_int_equal(ut_actrl(&f->r, 0)->rx_cons, 7);
  assert_int_equal(f->mq.bad, 1);
}

/* Malformed slots at the end, behind a held request, with nothing after
 * them; and several in a row with nothing held. */
static void test_malformed_trailing_and_runs(void **state) {
  struct fx *f = *state = fx_new(1, 8, 128);
  struct lynx_msg m = {0};
  lynx_mq_bind(&f->mq, f->r.mem, &f->r.g, 0);

  ut_put(&f->r, 0, 0, 1, "a", 1);
  ut_put_raw(&f->r, 0, 1, 2, NULL, 0xFFFFFFFFu, 0, LYNX_ST_OK, 2);
  ut_put_raw(&f->r, 0, 2, 3, NULL, 1, 0xFFFF, LYNX_ST_OK, 3);
  assert_int_equal(lynx_mq_recv(&f->mq, &m), 0);
  assert_int_equal(lynx_mq_recv(&f->mq, &m), -EAGAIN);
  assert_int_equal(f->mq.bad, 2);
  assert_int_equal(f->mq.rx_head, 3);
  assert_int_equal(ut_actrl(&f->r, 0)->rx_cons, 0);
  lynx_mq_release(&f->mq);
  assert_int_equal(ut_actrl(&f->r, 0)->rx_cons, 3);

  /* three malformed in a row, nothing held: all freed during recv */
  for (uint32_t p = 3; p < 6; p++)
    ut_put_raw(&f->r, 0, p, p, NULL, 113, 0, LYNX_ST_OK, lynx_seq_for(p));
  ut_put(&f->r, 0, 6, 6, "g", 1);
  assert_int_equal(lynx_mq_recv(&f->mq, &m), 0);
  assert_int_equal(m.tag, 6);
  assert_int_equal(f->mq.bad, 5);
  assert_int_equal(ut_actrl(&f->r, 0)->rx_cons, 6);
  lynx_mq_release(&f->mq);
  assert_int_equal(ut_actrl(&f->r, 0)->rx_cons, 7);
}

/* A ring full of malformed slots cannot wedge the accelerator. */
static void test_malformed_whole_ring(void **state) {
  struct fx *f = *state = fx_new(1, 4, 128);
  struct lynx_msg m = {0};
  uint32_t rx_prod = 0;
  lynx_mq_bind(&f->mq, f->r.mem, &f->r.g, 0);
  for (int lap = 0; lap < 3; lap++) {
    while (!lynx_ring_full(rx_prod, ut_actrl(&f->r, 0)->rx_cons, 4) &&
           rx_prod - ut_actrl(&f->r, 0)->rx_cons < 100) {
      ut_put_raw(&f->r, 0, rx_prod, rx_prod, NULL, 500, 0, LYNX_ST_OK,
                 lynx_seq_for(rx_prod));
      rx_prod++;
    }
    assert_int_equal(lynx_mq_recv(&f->mq, &m), -EAGAIN);
    assert_int_equal(ut_actrl(&f->r, 0)->rx_cons, rx_prod);
  }
  assert_int_equal(f->mq.bad, 12);
}

/* ---- large messages (docs/mqueue.md, "Large messages") ---------------- */

static void test_large_geometry(void **state) {
  struct lynx_geom g;
  (void)state;
  /* the area follows each ring's slots; access classes stay contiguous */
  assert_int_equal(lynx_geom_init(&g, 3, 8, 2048, 65536), 0);
  assert_int_equal(g.large_bytes, 65536);
  assert_int_equal(g.slots_bytes, 8 * 2048);
  assert_int_equal(g.ring_bytes, 8 * 2048 + 65536);
  assert_int_equal(lynx_rx_large_off(&g, 1), lynx_rx_ring_off(&g, 1) + 16384);
  assert_int_equal(lynx_rx_ring_off(&g, 2), lynx_rx_large_off(&g, 1) + 65536);
  assert_int_equal(lynx_tx_ring_off(&g, 0), lynx_rx_large_off(&g, 2) + 65536);
  assert_int_equal(lynx_tx_large_off(&g, 2) + 65536,
                   g.rings_off + 6ull * g.ring_bytes);
  assert_true(g.region_size >= lynx_tx_large_off(&g, 2) + 65536);
  /* a power of two in [4 KiB, 64 MiB], or 0 */
  assert_int_equal(lynx_geom_init(&g, 1, 8, 2048, 4096), 0);
  assert_int_equal(lynx_geom_init(&g, 1, 8, 2048, LYNX_LARGE_MAX), 0);
  assert_int_equal(lynx_geom_init(&g, 1, 8, 2048, 2048), -22);
  assert_int_equal(lynx_geom_init(&g, 1, 8, 2048, 100000), -22);
  assert_int_equal(lynx_geom_init(&g, 1, 8, 2048, LYNX_LARGE_MAX * 2), -22);
  /* the area a cap needs: none while a slot holds it, else >= 2x */
  assert_int_equal(lynx_large_for(2032, 2048), 0);
  assert_int_equal(lynx_large_for(2033, 2048), 4096);
  assert_int_equal(lynx_large_for(2049, 2048), 8192);
  assert_int_equal(lynx_large_for(65507, 2048), 131072);
  assert_int_equal(lynx_large_for(1u << 20, 2048), 2u << 20);
  assert_int_equal(lynx_large_for(LYNX_LARGE_MAX / 2 + 1, 2048), 0);
  assert_int_equal(lynx_geom_init(&g, 1, 8, 2048, 131072), 0);
  assert_int_equal(lynx_msg_cap(&g), 65536);
  assert_int_equal(lynx_geom_init(&g, 1, 8, 2048, 0), 0);
  assert_int_equal(lynx_msg_cap(&g), 2032);
}

static void fill(uint8_t *p, uint32_t len, uint32_t seed) {
  for (uint32_t i = 0; i < len; i++)
    p[i] = (uint8_t)(seed * 131u + i * 7u + (i >> 8));
}

/* Requests and answers of every size class through one mqueue, many laps
 * of both large areas: each seen whole and exact, in order, and the areas
 * freed as the other side consumes. */
static void test_large_roundtrip(void **state) {
  struct fx *f = *state = fx_new_l(1, 8, 256, 16384);
  struct lynx_large_alloc fa = {0, 0}; /* the frontend's RX allocator */
  static const uint32_t sizes[] = {240, 241, 1000, 4096, 7000, 8192, 100, 5};
  uint8_t *want = malloc(8192), *rev = malloc(8192);
  uint32_t tx = 0;
  unsigned seed = 7;
  assert_non_null(want);
  assert_non_null(rev);
  lynx_mq_bind(&f->mq, f->r.mem, &f->r.g, 0);
  for (uint32_t round = 0; round < 400; round++) {
    uint32_t len =
        round < 8 ? sizes[round] : 1 + (uint32_t)(rand_r(&seed) % 8192);
    struct lynx_msg m = {0};
    struct lynx_slot_meta tm = {0};
    const uint8_t *data = NULL;
    uint32_t got = 0;
    uint8_t *out;
    fill(want, len, round);
    if (len > lynx_slot_cap(256))
      assert_int_equal(ut_put_large(&f->r, 0, round, round, want, len, &fa), 0);
    else
      ut_put(&f->r, 0, round, round, want, len);
    assert_int_equal(lynx_mq_recv(&f->mq, &m), 0);
    assert_int_equal(m.tag, round);
    assert_int_equal(m.len, len);
    assert_int_equal(m.status, LYNX_ST_OK); /* the flag is not the app's */
    assert_memory_equal(m.data, want, len);
    /* the answer: the request reversed, as long */
    for (uint32_t i = 0; i < len; i++)
      rev[i] = m.data[len - 1 - i];
    assert_int_equal(lynx_reserve(&f->mq, len, &out), 0);
    memcpy(out, rev, len);
    lynx_commit(&f->mq, round, len, len);
    lynx_mq_release(&f->mq);
    /* the accelerator released it: the frontend frees its large area */
    fa.tail = fa.head;
    assert_int_equal(ut_get_tx_msg(&f->r, 0, tx, &tm, &data, &got), 0);
    assert_int_equal(tm.tag, round);
    assert_int_equal(got, len);
    assert_int_equal(!!(tm.status & LYNX_ST_LARGE), len > lynx_slot_cap(256));
    assert_memory_equal(data, rev, len);
    tx++;
    ut_fctrl(&f->r, 0)->tx_cons = tx;
  }
  assert_int_equal(f->mq.bad, 0);
  free(want);
  free(rev);
}

/* The TX large area fills while the frontend consumes nothing (-EAGAIN),
 * and frees only up to what it consumed; a message longer than the area
 * is -EMSGSIZE, and without an area anything over a slot is. */
static void test_large_tx_full_and_reclaim(void **state) {
  struct fx *f = *state = fx_new_l(1, 16, 256, 16384);
  struct ut_region r0;
  struct lynx_mq mq0;
  uint8_t *out;
  lynx_mq_bind(&f->mq, f->r.mem, &f->r.g, 0);
  assert_int_equal(lynx_reserve(&f->mq, 16385, &out), -EMSGSIZE);
  /* three of 5000 (5056 with alignment) fit 16 KiB; the fourth waits */
  for (uint32_t i = 0; i < 3; i++) {
    assert_int_equal(lynx_reserve(&f->mq, 5000, &out), 0);
    memset(out, (int)i, 5000);
    lynx_commit(&f->mq, i, 5000, 5000);
  }
  assert_int_equal(lynx_reserve(&f->mq, 5000, &out), -EAGAIN);
  /* small answers still go: they need a slot only */
  assert_int_equal(lynx_send(&f->mq, 9, "x", 1), 0);
  /* the frontend consumes the first: room for one more, at the area's
   * start (no message wraps: the 1,216 bytes at the end are skipped) */
  ut_fctrl(&f->r, 0)->tx_cons = 1;
  assert_int_equal(lynx_reserve(&f->mq, 5000, &out), 0);
  assert_ptr_equal(out, f->r.mem + lynx_tx_large_off(&f->r.g, 0));
  lynx_commit(&f->mq, 3, 5000, 5000);
  assert_int_equal(lynx_reserve(&f->mq, 5000, &out), -EAGAIN);
  /* a bad tx_cons (beyond what was sent) frees nothing */
  ut_fctrl(&f->r, 0)->tx_cons = 1000;
  assert_int_equal(lynx_reserve(&f->mq, 5000, &out), -EAGAIN);
  /* all consumed: the whole area again */
  ut_fctrl(&f->r, 0)->tx_cons = f->mq.tx_prod;
  assert_int_equal(lynx_reserve(&f->mq, 16384, &out), 0);
  lynx_commit(&f->mq, 4, 16384, 16384);

  assert_int_equal(ut_region_init(&r0, 1, 16, 256), 0);
  lynx_mq_bind(&mq0, r0.mem, &r0.g, 0);
  assert_int_equal(lynx_reserve(&mq0, 241, &out), -EMSGSIZE);
  ut_region_free(&r0);
}

/* A large slot whose reference lies outside the area, or whose length is
 * not a reference's, is malformed: skipped and released like any other,
 * also behind a held request. */
static void test_large_malformed(void **state) {
  struct fx *f = *state = fx_new_l(1, 8, 256, 8192);
  struct lynx_large_alloc fa = {0, 0};
  struct lynx_large_ref bad[] = {
      {8192, 1, 0, 0}, {4096, 4097, 0, 0}, {0, 8193, 0, 0}};
  struct lynx_msg m = {0};
  uint8_t req[3000];
  uint32_t pos = 0;
  fill(req, sizeof(req), 1);
  lynx_mq_bind(&f->mq, f->r.mem, &f->r.g, 0);
  assert_int_equal(ut_put_large(&f->r, 0, pos++, 100, req, sizeof(req), &fa),
                   0);
  for (uint32_t i = 0; i < 3; i++, pos++)
    ut_put_raw(&f->r, 0, pos, 200 + i, &bad[i], sizeof(bad[i]),
               (uint16_t)(lynx_payload_off(256, 16) / 16u),
               LYNX_ST_OK | LYNX_ST_LARGE, lynx_seq_for(pos));
  /* a large flag on a slot whose length is not a reference's */
  ut_put_raw(&f->r, 0, pos, 300, req, 8,
             (uint16_t)(lynx_payload_off(256, 8) / 16u),
             LYNX_ST_OK | LYNX_ST_LARGE, lynx_seq_for(pos));
  pos++;
  ut_put(&f->r, 0, pos++, 400, "ok", 2);
  assert_int_equal(lynx_mq_recv(&f->mq, &m), 0);
  assert_int_equal(m.tag, 100);
  assert_memory_equal(m.data, req, sizeof(req));
  assert_int_equal(lynx_mq_recv(&f->mq, &m), 0);
  assert_int_equal(m.tag, 400);
  assert_int_equal(f->mq.bad, 4);
  /* releasing the first frees the four skipped behind it, not the held
   * last one */
  lynx_mq_release(&f->mq);
  assert_int_equal(ut_actrl(&f->r, 0)->rx_cons, 5);
  lynx_mq_release(&f->mq);
  assert_int_equal(ut_actrl(&f->r, 0)->rx_cons, 6);
}

/* ---- two threads: frontend and accelerator at once ------------------- */

/*
 * The ring protocol between two threads, as a frontend and an accelerator
 * run it: the frontend thread writes requests (payload, then the seq word
 * with a store-release) as long as rx_cons (loaded with acquire) leaves
 * room, and reads answers (seq with acquire, then the payload), moving
 * tx_cons (release); the accelerator thread receives, checks every byte,
 * answers with the bytes reversed and releases. Lengths change from one
 * request to the next, so a reader that saw a seq before the payload
 * behind it would see the previous lap's bytes. LYNX_UT_RING_ITERS sets
 * the number of requests (default 100,000): make test-arm64 raises it,
 * where the ring code runs on an emulated arm64 (docs/bluefield.md).
 */
struct duo {
  struct ut_region r;
  struct lynx_mq mq;
  uint32_t n;
  int bad; /* the accelerator saw a wrong byte */
};

static uint32_t duo_len(uint32_t i) { return 1 + (i * 37u) % 200u; }
static uint8_t duo_byte(uint32_t i, uint32_t k) {
  return (uint8_t)(i * 131u + k * 7u + 1u);
}

static void *duo_accel(void *arg) {
  struct duo *d = arg;
  uint8_t out[256];
  for (uint32_t i = 0; i < d->n;) {
    struct lynx_msg m = {0};
    const uint8_t *p;
    if (lynx_mq_recv(&d->mq, &m) != 0) {
      sched_yield();
      continue;
    }
    p = m.data;
    if (m.tag != i || m.len != duo_len(i))
      d->bad = 1;
    for (uint32_t k = 0; !d->bad && k < m.len; k++) {
      if (p[k] != duo_byte(i, k))
        d->bad = 1;
      out[m.len - 1 - k] = p[k];
    }
    while (lynx_send(&d->mq, m.tag, out, m.len) == -EAGAIN)
      sched_yield();
    lynx_mq_release(&d->mq);
    if (d->bad)
      break;
    i++;
  }
  return NULL;
}

static void test_two_threads(void **state) {
  struct duo *d = calloc(1, sizeof(*d));
  const char *env = getenv("LYNX_UT_RING_ITERS");
  uint8_t req[256];
  uint32_t sent = 0, got = 0, s;
  pthread_t t;
  (void)state;
  assert_non_null(d);
  d->n = env ? (uint32_t)strtoul(env, NULL, 10) : 100000u;
  assert_int_equal(ut_region_init(&d->r, 1, 8, 256), 0);
  lynx_mq_bind(&d->mq, d->r.mem, &d->r.g, 0);
  s = d->r.g.slots;
  assert_int_equal(pthread_create(&t, NULL, duo_accel, d), 0);
  while (got < d->n && !__atomic_load_n(&d->bad, __ATOMIC_RELAXED)) {
    struct lynx_slot_meta tm;
    const uint8_t *data;
    int moved = 0;
    if (sent < d->n &&
        sent - lynx_load_acquire32(&ut_actrl(&d->r, 0)->rx_cons) < s) {
      for (uint32_t k = 0; k < duo_len(sent); k++)
        req[k] = duo_byte(sent, k);
      ut_put(&d->r, 0, sent, sent, req, duo_len(sent));
      sent++;
      moved = 1;
    }
    if (ut_get_tx(&d->r, 0, got, &tm, &data) == 0) {
      assert_int_equal(tm.tag, got);
      assert_int_equal(tm.len, duo_len(got));
      for (uint32_t k = 0; k < tm.len; k++)
        if (data[k] != duo_byte(got, tm.len - 1 - k))
          fail_msg("answer %u byte %u: %#x", got, k, data[k]);
      got++;
      lynx_store_release32(&ut_fctrl(&d->r, 0)->tx_cons, got);
      moved = 1;
    }
    if (!moved)
      sched_yield();
  }
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_int_equal(d->bad, 0);
  assert_int_equal(got, d->n);
  ut_region_free(&d->r);
  free(d);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_geom_valid_layout),
      cmocka_unit_test(test_geom_rejects_out_of_bounds),
      cmocka_unit_test(test_payload_off),
      cmocka_unit_test(test_meta_check),
      cmocka_unit_test(test_ring_full_and_used),
      cmocka_unit_test_teardown(test_recv_send_basic, fx_teardown),
      cmocka_unit_test_teardown(test_recv_trusts_off16, fx_teardown),
      cmocka_unit_test_teardown(test_reserve_commit_shorter, fx_teardown),
      cmocka_unit_test_teardown(test_reserve_emsgsize, fx_teardown),
      cmocka_unit_test_teardown(test_drop_publishes_dropped, fx_teardown),
      cmocka_unit_test_teardown(test_tx_full_eagain, fx_teardown),
      cmocka_unit_test_teardown(test_rx_full_enobufs, fx_teardown),
      cmocka_unit_test_teardown(test_wraparound_u32, fx_teardown),
      cmocka_unit_test_teardown(test_wraparound_full, fx_teardown),
      cmocka_unit_test_teardown(test_phase_flip_across_laps, fx_teardown),
      cmocka_unit_test_teardown(test_phase_tx_side, fx_teardown),
      cmocka_unit_test_teardown(test_out_of_order_by_tag, fx_teardown),
      cmocka_unit_test_teardown(test_malformed_skipped_unheld, fx_teardown),
      cmocka_unit_test_teardown(test_malformed_skipped_behind_held,
                                fx_teardown),
      cmocka_unit_test_teardown(test_malformed_trailing_and_runs, fx_teardown),
      cmocka_unit_test_teardown(test_malformed_whole_ring, fx_teardown),
      cmocka_unit_test(test_large_geometry),
      cmocka_unit_test_teardown(test_large_roundtrip, fx_teardown),
      cmocka_unit_test_teardown(test_large_tx_full_and_reclaim, fx_teardown),
      cmocka_unit_test_teardown(test_large_malformed, fx_teardown),
      cmocka_unit_test(test_two_threads),
  };
  return LYNX_UT_MAIN(argc, argv, "mqueue", tests, NULL, NULL);
}
