/*
 * test_rmq.c - unit tests of frontend/rmq.c (the Remote Message Queue
 * Manager) over the tcp transport, its agent in this process: how a
 * connection takes an accelerator's rings over.
 *
 * Two managers stand in for two frontends, each made alone (struct fe_rmq
 * with its options and hooks: no worker, dispatcher or forwarder around
 * it): the old one (epoch 5) publishes requests through fe_write_rx, the
 * new one (epoch 7) takes the region over while the accelerator has not
 * consumed them. The accelerator side is the region's memory read through
 * the ring code (lynx_mq_recv), as a CPU accelerator reads it; its answers
 * are pushed to the manager (tcp's subscribe), counted by the slot hook.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "bell.h"
#include "mqueue.h"
#include "rmq.h"
#include "tagtab.h"
#include "transport.h"
#include "ut_main.h"
#include "ut_region.h"
#include "util.h"

#define S 8u
#define Z 256u
#define L 4096u
#define NAME "rmq-takeover"

static const struct lynx_transport_ops *T;
static struct lynx_transport_agent *g_ta;
static char g_bound[LYNX_LOCATOR_MAX];

/* The answers the slot hook was handed: tag, length and every byte's
 * value (the test's answers are one byte repeated; 0xFF: mixed). */
#define ANSWERS_MAX 16
struct answers {
  uint32_t n, tag[ANSWERS_MAX], len[ANSWERS_MAX];
  uint8_t fill[ANSWERS_MAX];
};
static struct answers g_ans;

/* The hooks: the layers above the manager, which these cases need only
 * as far as the answers handed up (no back ends, no forwarder). */
static int hk_changed(void *ctx) {
  (void)ctx;
  return 0;
}
static int hk_slot(void *ctx, struct fe_mq *mq, const uint8_t *slot,
                   uint32_t pos, const uint8_t *large, uint32_t large_len) {
  struct lynx_slot_meta m;
  const uint8_t *data;
  uint32_t len, i = g_ans.n;
  (void)ctx, (void)pos;
  memcpy(&m, slot + mq->conn->acc.g.slot_size - LYNX_META_SIZE, sizeof(m));
  data = (m.status & LYNX_ST_LARGE) ? large : slot + (uint32_t)m.off16 * 16u;
  len = (m.status & LYNX_ST_LARGE) ? large_len : m.len;
  if (i < ANSWERS_MAX && data) {
    g_ans.tag[i] = m.tag;
    g_ans.len[i] = len;
    g_ans.fill[i] = len ? data[0] : 0;
    for (uint32_t k = 1; k < len; k++)
      if (data[k] != data[0])
        g_ans.fill[i] = 0xFF;
  }
  g_ans.n++;
  return 0;
}
static void hk_lost(void *ctx, const struct lynx_tag_entry *e) {
  (void)ctx, (void)e;
}
static int hk_be_open(void *ctx, struct fe_mq *mq,
                      const struct fe_backend_cfg *cfg) {
  (void)ctx, (void)mq, (void)cfg;
  return -ENOTSUP;
}
static void hk_be_close(struct fe_backend *be) { (void)be; }
static const struct fe_rmq_hooks hooks = {hk_changed, hk_slot, hk_lost,
                                          hk_be_open, hk_be_close};

struct fx {
  struct lynx_region r;
  struct lynx_region_desc d;
  struct lynx_geom g;
  struct fe_rmq m[2]; /* [0] the old frontend's, [1] the new one's */
  struct lynx_tagtab tags[2];
  unsigned seed[2];
  struct lynx_mq amq; /* the accelerator's view of mqueue 0 */
};

/* Manager i: the only worker (every mqueue its), no back ends. */
static void rmq_init(struct fx *f, int i, uint32_t seed) {
  struct fe_rmq_opts o = {.worker = 0,
                          .n_workers = 1,
                          .tags = &f->tags[i],
                          .retry_seed = &f->seed[i]};
  f->seed[i] = seed;
  assert_int_equal(lynx_tagtab_init(&f->tags[i], 64, seed), 0);
  fe_rmq_init(&f->m[i], &o, &hooks, f);
}

static int fx_setup(void **state) {
  struct fx *f = calloc(1, sizeof(*f));
  if (!f)
    return -1;
  ut_region_empty(&f->r);
  if (lynx_geom_init(&f->g, 1, S, Z, L) ||
      ut_region_serve(T, g_ta, &f->r, NAME, &f->g, LYNX_ORDER_COALESCED,
                      UT_EPOCH, UT_ACCEL, &f->d))
    return -1;
  rmq_init(f, 0, 11);
  rmq_init(f, 1, 22);
  memset(&g_ans, 0, sizeof(g_ans));
  lynx_mq_bind(&f->amq, f->r.base, &f->g, 0);
  *state = f;
  return 0;
}

static int fx_teardown(void **state) {
  struct fx *f = *state;
  for (int i = 0; i < 2; i++) {
    fe_rmq_free(&f->m[i]);
    lynx_tagtab_free(&f->tags[i]);
  }
  T->region_free(&f->r);
  free(f);
  return 0;
}

/* Manager r's connection to the region, as frontend epoch producer. */
static struct fe_conn *add_as(struct fx *f, struct fe_rmq *r,
                              uint64_t producer) {
  struct fe_accel acc;
  memset(&acc, 0, sizeof(acc));
  acc.desc = f->d;
  acc.desc.producer = producer;
  acc.ops = T;
  acc.g = f->g;
  acc.n_server = 1;
  acc.instance_id = 1;
  snprintf(acc.node, sizeof(acc.node), "n1");
  assert_int_equal(fe_rmq_add(r, &acc), 0);
  assert_int_equal(r->n_conns, 1);
  return r->conns[0];
}

/* Free RX slots of c's mqueue as the frontend counts them. */
static uint32_t room(const struct fe_conn *c) {
  return S - (c->mqs[0].dq.rx_prod - c->mqs[0].dq.rx_cons);
}

/* A request of len bytes (len > a slot's payload: large), every byte
 * fill, written as the dispatcher writes it; rung at once. */
static void send_req(struct fe_rmq *r, struct fe_conn *c, uint32_t len,
                     uint8_t fill, uint32_t tag) {
  struct fe_mq *mq = &c->mqs[0];
  uint8_t *buf = malloc(len);
  assert_non_null(buf);
  memset(buf, fill, len);
  assert_true(room(c) > 0);
  assert_int_equal(fe_write_rx(r, mq, buf, len, tag, 0), 0);
  mq->dq.rx_prod++;
  c->dirty = 1;
  fe_rmq_doorbells(r);
  free(buf);
}

/* The tcp agent applies writes on its own thread: waits until the
 * accelerator sees n requests published from its rx_head on. */
static void await_published(struct fx *f, uint32_t n) {
  uint64_t end = lynx_now_ns() + 2000000000ull;
  for (;;) {
    uint32_t pos = f->amq.rx_head + n - 1;
    struct lynx_slot_meta *m =
        lynx_mq_meta(f->amq.rx, f->amq.slot_size, f->amq.slots, pos);
    if (lynx_load_acquire32(&m->seq) == lynx_seq_for(pos))
      return;
    assert_true(lynx_now_ns() < end);
    usleep(1000);
  }
}

/* The accelerator receives the next request: len bytes of fill, tag. */
static void expect_req(struct fx *f, uint32_t len, uint8_t fill, uint32_t tag) {
  struct lynx_msg m = {0};
  assert_int_equal(lynx_mq_recv(&f->amq, &m), 0);
  assert_int_equal(m.tag, tag);
  assert_int_equal(m.len, len);
  for (uint32_t i = 0; i < len; i++)
    if (((const uint8_t *)m.data)[i] != fill)
      fail_msg("request %#x byte %u: %#x, not %#x", tag, i,
               ((const uint8_t *)m.data)[i], fill);
  lynx_mq_release(&f->amq);
}

/* Runs c's cycle until it read the accelerator's rx_cons at want. */
static void await_rx_cons(struct fe_rmq *r, struct fe_conn *c, uint32_t want) {
  uint64_t end = lynx_now_ns() + 2000000000ull;
  fe_mq_outstanding_set(&c->mqs[0], 1); /* polled only with some */
  while (c->mqs[0].dq.rx_cons != want) {
    assert_true(fe_rmq_progress(r, c) >= 0);
    assert_true(lynx_now_ns() < end);
    usleep(1000);
  }
  fe_mq_outstanding_set(&c->mqs[0], 0);
}

/* The old frontend published three requests (one large) the accelerator
 * has not consumed; the new one takes over. It resumes after them: the
 * accelerator runs all five in order, nothing overwritten (the large area
 * the old request uses included), its rx_cons stays within what the new
 * frontend counts as written (no bad index), and the old frontend is cut
 * off. */
static void test_takeover_resumes_after_published(void **state) {
  struct fx *f = *state;
  struct fe_conn *old = add_as(f, &f->m[0], 5), *nw;
  struct fe_mq *mq;
  struct lynx_msg m;
  uint64_t end = lynx_now_ns() + 2000000000ull;
  /* one consumed before: the ring does not start at 0 */
  send_req(&f->m[0], old, 10, 0xA0, 0x100);
  await_published(f, 1);
  expect_req(f, 10, 0xA0, 0x100);
  send_req(&f->m[0], old, 20, 0xA1, 0x101);
  send_req(&f->m[0], old, 1000, 0xA2, 0x102); /* large */
  send_req(&f->m[0], old, 30, 0xA3, 0x103);
  await_published(f, 3);

  nw = add_as(f, &f->m[1], 7);
  mq = &nw->mqs[0];
  assert_int_equal(nw->state, FE_CONN_IDLE);
  assert_int_equal(mq->dq.rx_cons, 1);
  assert_int_equal(mq->dq.rx_prod, 4);
  assert_int_equal(mq->rx_ln, 1);            /* the old large request's area */
  send_req(&f->m[1], nw, 2000, 0xB0, 0x200); /* large, after it */
  send_req(&f->m[1], nw, 40, 0xB1, 0x201);
  await_published(f, 5);
  expect_req(f, 20, 0xA1, 0x101);
  expect_req(f, 1000, 0xA2, 0x102);
  expect_req(f, 30, 0xA3, 0x103);
  expect_req(f, 2000, 0xB0, 0x200);
  expect_req(f, 40, 0xB1, 0x201);
  assert_int_equal(lynx_mq_recv(&f->amq, &m), -EAGAIN);
  assert_int_equal(f->amq.bad, 0);

  await_rx_cons(&f->m[1], nw, 6);
  assert_int_equal(lynx_cnt_get(&mq->drops[FE_QDROP_BAD_INDEX]), 0);
  /* the operations it posted, by what they were for: the opening's reads
   * and index write, two requests (one large: its area, then its slot),
   * polls for answers, no fenced barrier (coalesced ordering) */
  {
    const lynx_counter *ops = f->m[1].op_counts;
    assert_true(lynx_cnt_get(&ops[FE_OP_OPEN_READ]) >= 1);
    assert_true(lynx_cnt_get(&ops[FE_OP_INDEX_WRITE]) >= 1);
    assert_int_equal(lynx_cnt_get(&ops[FE_OP_REQUEST_WRITE]), 3);
    assert_int_equal(lynx_cnt_get(&ops[FE_OP_SUBSCRIBE]), 1);
    assert_int_equal(lynx_cnt_get(&ops[FE_OP_POLL]), 0); /* pushed */
    assert_int_equal(lynx_cnt_get(&ops[FE_OP_FENCE_READ]), 0);
  }
  assert_int_equal(mq->rx_ln, 0); /* every large area released */
  assert_int_equal(room(nw), S);

  /* the old frontend's next cycle finds its connection cut */
  fe_mq_outstanding_set(&old->mqs[0], 1);
  while (old->state != FE_CONN_DEAD) {
    fe_rmq_progress(&f->m[0], old);
    assert_true(lynx_now_ns() < end);
    usleep(1000);
  }
}

/* Every slot published and unconsumed: the new frontend has no room until
 * the accelerator consumes, then its request follows the old ones. */
static void test_takeover_of_full_ring(void **state) {
  struct fx *f = *state;
  struct fe_conn *old = add_as(f, &f->m[0], 5), *nw;
  for (uint32_t i = 0; i < S; i++)
    send_req(&f->m[0], old, 16, (uint8_t)(0xC0 + i), 0x300 + i);
  await_published(f, S);
  nw = add_as(f, &f->m[1], 7);
  assert_int_equal(room(nw), 0);
  expect_req(f, 16, 0xC0, 0x300);
  expect_req(f, 16, 0xC1, 0x301);
  await_rx_cons(&f->m[1], nw, 2);
  assert_int_equal(room(nw), 2);
  send_req(&f->m[1], nw, 16, 0xD0, 0x400);
  await_published(f, S - 1);
  for (uint32_t i = 2; i < S; i++)
    expect_req(f, 16, (uint8_t)(0xC0 + i), 0x300 + i);
  expect_req(f, 16, 0xD0, 0x400);
  assert_int_equal(lynx_cnt_get(&nw->mqs[0].drops[FE_QDROP_BAD_INDEX]), 0);
}

/* The same frontend reconnects after its connection broke: what it
 * published before is in the accelerator's hands (its requests ended in
 * doubt); the new connection resumes after it. */
static void test_reconnect_resumes_after_own(void **state) {
  struct fx *f = *state;
  struct fe_rmq *r = &f->m[0];
  struct fe_conn *c = add_as(f, r, 5);
  send_req(r, c, 16, 0xE0, 0x500);
  send_req(r, c, 3000, 0xE1, 0x501); /* large */
  await_published(f, 2);
  fe_rmq_down(r, c, "test: connection broke", FE_QDROP_IN_DOUBT);
  assert_int_equal(c->state, FE_CONN_DEAD);
  fe_rmq_retry(r, UINT64_MAX); /* the backoff is over */
  assert_int_equal(c->state, FE_CONN_IDLE);
  assert_int_equal(c->mqs[0].dq.rx_prod, 2);
  /* the large area holds the earlier large request until it is consumed */
  {
    uint8_t big[1500] = {0};
    assert_int_equal(fe_write_rx(r, &c->mqs[0], big, sizeof(big), 0x5FF, 0),
                     -ENOSPC);
  }
  send_req(r, c, 16, 0xE2, 0x502);
  await_published(f, 3);
  expect_req(f, 16, 0xE0, 0x500);
  expect_req(f, 3000, 0xE1, 0x501);
  expect_req(f, 16, 0xE2, 0x502);
  await_rx_cons(r, c, 3);
  send_req(r, c, 1500, 0xE3, 0x503);
  await_published(f, 1);
  expect_req(f, 1500, 0xE3, 0x503);
}

/* The accelerator answers the request it receives next: len bytes of
 * fill under the request's tag (a large answer past a slot's payload),
 * then rings the bell a waiter named, as a CPU accelerator does. */
static void answer_next(struct fx *f, uint32_t len, uint8_t fill) {
  struct lynx_msg m = {0};
  uint8_t *buf = NULL;
  assert_int_equal(lynx_mq_recv(&f->amq, &m), 0);
  assert_int_equal(lynx_mq_reserve(&f->amq, len, &buf), 0);
  memset(buf, fill, len);
  lynx_mq_commit(&f->amq, m.tag, len, len, 0);
  lynx_bell_after_publish(&f->amq, "test accelerator");
  lynx_mq_release(&f->amq);
}

/* Answers are pushed: published by the accelerator (small ones and large
 * ones, over more than a ring's positions), they reach the slot hook with
 * no poll, no slot or large read on the wire, whether the region's
 * accelerator rings the agent's bell (rings) or the agent watches its
 * control words (a GPU's); the consumer index written back frees the
 * accelerator's TX ring, and rx_cons comes with them or soon after. */
static void answers_pushed(struct fx *f, int rings) {
  struct lynx_region_hdr *h = (struct lynx_region_hdr *)f->r.base;
  struct fe_rmq *r = &f->m[0];
  struct fe_conn *c;
  const lynx_counter *ops = r->op_counts;
  uint32_t want = 0;
  if (rings)
    __atomic_or_fetch(&h->flags, LYNX_HDR_RESP_BELL, __ATOMIC_RELEASE);
  c = add_as(f, r, 5);
  assert_true(c->pushing);
  for (uint32_t round = 0; round < 3 * S / 2; round++) {
    uint64_t end = lynx_now_ns() + 5000000000ull;
    uint32_t big = round % 3 == 1 ? 1500 : 12; /* large: past the slot */
    send_req(r, c, 16, (uint8_t)round, 0x600 + round);
    await_published(f, 1);
    answer_next(f, big, (uint8_t)(0x40 + round));
    fe_mq_outstanding_set(&c->mqs[0], 1);
    want++;
    while (g_ans.n < want) {
      assert_true(fe_rmq_progress(r, c) >= 0);
      assert_int_not_equal(c->state, FE_CONN_DEAD);
      assert_true(lynx_now_ns() < end);
    }
    assert_int_equal(g_ans.n, want);
    if (round < ANSWERS_MAX) {
      assert_int_equal(g_ans.tag[round], 0x600 + round);
      assert_int_equal(g_ans.len[round], big);
      assert_int_equal(g_ans.fill[round], 0x40 + round);
    }
  }
  fe_mq_outstanding_set(&c->mqs[0], 0);
  /* every request consumed: rx_cons reaches the frontend without a read */
  await_rx_cons(r, c, 3 * S / 2);
  assert_int_equal(lynx_cnt_get(&ops[FE_OP_POLL]), 0);
  assert_int_equal(lynx_cnt_get(&ops[FE_OP_SLOT_READ]), 0);
  assert_int_equal(lynx_cnt_get(&ops[FE_OP_LARGE_READ]), 0);
  assert_int_equal(lynx_cnt_get(&ops[FE_OP_SUBSCRIBE]), 1);
  assert_int_equal(lynx_cnt_get(&c->mqs[0].drops[FE_QDROP_BAD_INDEX]), 0);
}

static void test_answers_pushed_bell(void **state) {
  answers_pushed(*state, 1);
}

static void test_answers_pushed_watched(void **state) {
  answers_pushed(*state, 0);
}

/* --tcp-answers poll (no_push): the connection never subscribes and its
 * answers come by the compound read, as before protocol version 5. */
static void test_answers_polled(void **state) {
  struct fx *f = *state;
  struct fe_rmq *r = &f->m[0];
  const lynx_counter *ops = r->op_counts;
  uint64_t end = lynx_now_ns() + 5000000000ull;
  struct fe_conn *c;
  r->opts.no_push = 1;
  c = add_as(f, r, 5);
  assert_false(c->pushing);
  send_req(r, c, 16, 1, 0x650);
  await_published(f, 1);
  answer_next(f, 12, 0x51);
  fe_mq_outstanding_set(&c->mqs[0], 1);
  while (g_ans.n < 1) {
    assert_true(fe_rmq_progress(r, c) >= 0);
    assert_true(lynx_now_ns() < end);
  }
  assert_int_equal(g_ans.tag[0], 0x650);
  assert_int_equal(g_ans.fill[0], 0x51);
  assert_true(lynx_cnt_get(&ops[FE_OP_POLL]) >= 1);
  assert_int_equal(lynx_cnt_get(&ops[FE_OP_SUBSCRIBE]), 0);
}

static int group_setup(void **state) {
  (void)state;
  return ut_tcp_agent(&T, &g_ta, g_bound, sizeof(g_bound));
}

static int group_teardown(void **state) {
  (void)state;
  T->agent_destroy(g_ta);
  return 0;
}

int main(int argc, char **argv) {
#define TF(fn) cmocka_unit_test_setup_teardown(fn, fx_setup, fx_teardown)
  const struct CMUnitTest tests[] = {
      TF(test_takeover_resumes_after_published), TF(test_takeover_of_full_ring),
      TF(test_reconnect_resumes_after_own),      TF(test_answers_pushed_bell),
      TF(test_answers_pushed_watched),           TF(test_answers_polled),
  };
#undef TF
  return LYNX_UT_MAIN(argc, argv, "rmq", tests, group_setup, group_teardown);
}
