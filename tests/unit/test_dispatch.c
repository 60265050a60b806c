/* test_dispatch.c - unit tests of frontend/dispatch.c (rr, lo, flow order). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include "dispatch.h"
#include "ut_main.h"

#define NQ 4

struct fx {
  struct lynx_dq dq[NQ];
  struct lynx_dq *ptr[NQ];
  struct lynx_dispatcher d;
};

static void fx_init(struct fx *f, enum lynx_dispatch_policy p, uint32_t n,
                    uint32_t slots) {
  memset(f, 0, sizeof(*f));
  for (uint32_t i = 0; i < NQ; i++) {
    f->dq[i].slots = slots;
    f->dq[i].up = 1;
    f->ptr[i] = &f->dq[i];
  }
  f->d.policy = p;
  f->d.q = f->ptr;
  f->d.n = n;
}

/* What the worker does after a successful write to the picked mqueue. */
static void commit(struct fx *f, int i) {
  f->dq[i].rx_prod++;
  f->dq[i].outstanding++;
}

/* The accelerator frees every slot of mqueue i. */
static void drain(struct fx *f, int i) { f->dq[i].rx_cons = f->dq[i].rx_prod; }

static void make_full(struct lynx_dq *q) { q->rx_prod = q->rx_cons + q->slots; }

static void test_rr_rotates_evenly(void **state) {
  struct fx f;
  int count[NQ] = {0};
  (void)state;
  fx_init(&f, LYNX_DISPATCH_RR, 3, 8);
  for (int k = 0; k < 300; k++) {
    int i = lynx_dispatch_pick(&f.d);
    assert_int_equal(i, k % 3); /* strict rotation */
    commit(&f, i);
    drain(&f, i);
    count[i]++;
  }
  assert_int_equal(count[0], 100);
  assert_int_equal(count[1], 100);
  assert_int_equal(count[2], 100);
  assert_int_equal(count[3], 0); /* not among the dispatcher's n */
}

static void test_rr_skips_full_and_down(void **state) {
  struct fx f;
  int count[NQ] = {0};
  (void)state;
  fx_init(&f, LYNX_DISPATCH_RR, 4, 8);
  /* mqueue 1 full (with indices across 2^32), mqueue 3 out of dispatch */
  f.dq[1].rx_cons = 0xFFFFFFFCu;
  make_full(&f.dq[1]);
  assert_int_equal(f.dq[1].rx_prod, 4);
  f.dq[3].up = 0;
  for (int k = 0; k < 100; k++) {
    int i = lynx_dispatch_pick(&f.d);
    assert_true(i == 0 || i == 2);
    assert_int_equal(i, (k % 2) * 2); /* 0, 2, 0, 2, ... */
    commit(&f, i);
    drain(&f, i);
    count[i]++;
  }
  assert_int_equal(count[0], 50);
  assert_int_equal(count[2], 50);
  /* one slot short of full is not full */
  f.dq[1].rx_cons++;
  {
    int seen1 = 0;
    for (int k = 0; k < 2; k++)
      seen1 |= lynx_dispatch_pick(&f.d) == 1;
    assert_true(seen1);
  }
}

/* A mqueue that fills up mid-run drops out of the rotation, and comes back
 * when the accelerator releases slots. */
static void test_rr_fill_up(void **state) {
  struct fx f;
  (void)state;
  fx_init(&f, LYNX_DISPATCH_RR, 2, 4);
  /* nobody drains: 8 picks fill both rings, alternating */
  for (int k = 0; k < 8; k++) {
    int i = lynx_dispatch_pick(&f.d);
    assert_int_equal(i, k % 2);
    commit(&f, i);
  }
  assert_int_equal(lynx_dispatch_pick(&f.d), -ENOSPC);
  f.dq[1].rx_cons += 2;
  assert_int_equal(lynx_dispatch_pick(&f.d), 1);
  commit(&f, 1);
  assert_int_equal(lynx_dispatch_pick(&f.d), 1);
  commit(&f, 1);
  assert_int_equal(lynx_dispatch_pick(&f.d), -ENOSPC);
}

static void test_all_full_enospc(void **state) {
  struct fx f;
  (void)state;
  for (int p = 0; p < 2; p++) {
    fx_init(&f, p ? LYNX_DISPATCH_LO : LYNX_DISPATCH_RR, 3, 16);
    for (int i = 0; i < 3; i++) {
      f.dq[i].rx_cons = 1000u * (uint32_t)i + 0xFFFFFFF8u;
      make_full(&f.dq[i]);
    }
    assert_int_equal(lynx_dispatch_pick(&f.d), -ENOSPC);
    /* full and down mixed: still -ENOSPC (something is in dispatch) */
    f.dq[0].up = 0;
    assert_int_equal(lynx_dispatch_pick(&f.d), -ENOSPC);
    f.dq[2].rx_cons++;
    assert_int_equal(lynx_dispatch_pick(&f.d), 2);
  }
}

static void test_none_up_enoent(void **state) {
  struct fx f;
  (void)state;
  for (int p = 0; p < 2; p++) {
    fx_init(&f, p ? LYNX_DISPATCH_LO : LYNX_DISPATCH_RR, 3, 16);
    for (int i = 0; i < 3; i++)
      f.dq[i].up = 0;
    assert_int_equal(lynx_dispatch_pick(&f.d), -ENOENT);
    /* down and full: still nothing in dispatch */
    make_full(&f.dq[1]);
    assert_int_equal(lynx_dispatch_pick(&f.d), -ENOENT);
    f.dq[2].up = 1;
    assert_int_equal(lynx_dispatch_pick(&f.d), 2);
    /* no mqueues at all */
    f.d.n = 0;
    assert_int_equal(lynx_dispatch_pick(&f.d), -ENOENT);
  }
}

static void test_lo_picks_least_outstanding(void **state) {
  struct fx f;
  (void)state;
  fx_init(&f, LYNX_DISPATCH_LO, 4, 64);
  f.dq[0].outstanding = 5;
  f.dq[1].outstanding = 7;
  f.dq[2].outstanding = 2;
  f.dq[3].outstanding = 9;
  assert_int_equal(lynx_dispatch_pick(&f.d), 2);
  assert_int_equal(lynx_dispatch_pick(&f.d), 2); /* nothing changed */
  f.dq[2].outstanding = 6;
  assert_int_equal(lynx_dispatch_pick(&f.d), 0);
  /* the least loaded is skipped when its ring is full or it is down */
  f.dq[0].rx_prod = 64;
  assert_int_equal(lynx_dispatch_pick(&f.d), 2);
  f.dq[2].up = 0;
  assert_int_equal(lynx_dispatch_pick(&f.d), 1);
  /* with answers coming back, load evens out */
  fx_init(&f, LYNX_DISPATCH_LO, 3, 64);
  f.dq[0].outstanding = 10;
  for (int k = 0; k < 20; k++) {
    int i = lynx_dispatch_pick(&f.d);
    assert_true(i >= 0);
    commit(&f, i);
  }
  assert_int_equal(f.dq[0].outstanding, 10);
  assert_int_equal(f.dq[1].outstanding, 10);
  assert_int_equal(f.dq[2].outstanding, 10);
}

static void test_lo_rotates_ties(void **state) {
  struct fx f;
  int count[NQ] = {0};
  (void)state;
  fx_init(&f, LYNX_DISPATCH_LO, 4, 64);
  /* equal load that does not change (answers as fast as requests): ties
   * must rotate, not always go to the first mqueue */
  for (int k = 0; k < 40; k++) {
    int i = lynx_dispatch_pick(&f.d);
    assert_int_equal(i, k % 4);
    count[i]++;
  }
  for (int i = 0; i < 4; i++)
    assert_int_equal(count[i], 10);
  /* ties among a subset: 1 and 3 at 0, the others loaded */
  f.dq[0].outstanding = 3;
  f.dq[2].outstanding = 3;
  {
    int a = lynx_dispatch_pick(&f.d);
    int b = lynx_dispatch_pick(&f.d);
    int c = lynx_dispatch_pick(&f.d);
    assert_true((a == 1 && b == 3) || (a == 3 && b == 1));
    assert_int_equal(c, a);
  }
}

/* Flow order: a flow with requests in flight stays on its mqueue; with none
 * in flight, or when its mqueue is down, the policy places it; when its
 * mqueue is full it is refused (test_flow_full_refused). */
static void test_flow_sticks_while_outstanding(void **state) {
  struct fx f;
  struct lynx_flow fl = {0, 0};
  int i;
  (void)state;
  fx_init(&f, LYNX_DISPATCH_RR, NQ, 4);
  /* nothing in flight: round robin moves the flow along */
  assert_int_equal(lynx_dispatch_pick_flow(&f.d, &fl), 0);
  assert_int_equal(lynx_dispatch_pick_flow(&f.d, &fl), 1);
  /* one in flight on mqueue 2: it stays there while others rotate */
  fl.q = 2;
  fl.outstanding = 1;
  for (int k = 0; k < 3; k++) {
    i = lynx_dispatch_pick_flow(&f.d, &fl);
    assert_int_equal(i, 2);
    commit(&f, i);
  }
  /* mqueue 2 full (4 slots): the busy flow is refused, not moved */
  commit(&f, 2);
  assert_int_equal(lynx_dispatch_pick_flow(&f.d, &fl), -EBUSY);
  /* mqueue 2 leaves dispatch: the flow moves */
  drain(&f, 2);
  f.dq[2].up = 0;
  assert_int_not_equal(lynx_dispatch_pick_flow(&f.d, &fl), 2);
  /* a flow index beyond the table (stale) falls back to the policy */
  fl.q = NQ + 3;
  i = lynx_dispatch_pick_flow(&f.d, &fl);
  assert_true(i >= 0 && i < NQ && i != 2);
  /* NULL flow is plain pick */
  assert_true(lynx_dispatch_pick_flow(&f.d, NULL) >= 0);
}

/* The pick decision for a busy flow whose mqueue is full, under both
 * policies: refused with -EBUSY while that mqueue is in dispatch (another
 * mqueue's answers could overtake the queued ones), however much room the
 * others have; moved once it leaves dispatch; an idle flow on the same full
 * mqueue is placed by the policy. */
static void test_flow_full_refused(void **state) {
  struct fx f;
  struct lynx_flow busy = {1, 3}, idle = {1, 0};
  (void)state;
  for (int p = 0; p < 2; p++) {
    uint32_t cursor;
    int i;
    fx_init(&f, p ? LYNX_DISPATCH_LO : LYNX_DISPATCH_RR, NQ, 4);
    make_full(&f.dq[1]);
    f.dq[1].outstanding = 3;
    cursor = f.d.cursor;
    /* every other mqueue is empty: still refused, and the policy's
     * rotation is left alone */
    for (int k = 0; k < 3; k++)
      assert_int_equal(lynx_dispatch_pick_flow(&f.d, &busy), -EBUSY);
    assert_int_equal(f.d.cursor, cursor);
    /* one slot freed: the flow stays */
    f.dq[1].rx_cons++;
    assert_int_equal(lynx_dispatch_pick_flow(&f.d, &busy), 1);
    make_full(&f.dq[1]);
    /* an idle flow is the policy's: anywhere but the full mqueue 1 */
    i = lynx_dispatch_pick_flow(&f.d, &idle);
    assert_true(i >= 0 && i < NQ && i != 1);
    /* every mqueue full: the busy flow is still -EBUSY (its own ring),
     * an idle one gets the policy's -ENOSPC */
    for (int q = 0; q < NQ; q++)
      make_full(&f.dq[q]);
    assert_int_equal(lynx_dispatch_pick_flow(&f.d, &busy), -EBUSY);
    assert_int_equal(lynx_dispatch_pick_flow(&f.d, &idle), -ENOSPC);
    /* mqueue 1 (still full) leaves dispatch: the busy flow moves to
     * whichever mqueue the policy finds room on */
    f.dq[1].up = 0;
    f.dq[3].rx_cons++;
    assert_int_equal(lynx_dispatch_pick_flow(&f.d, &busy), 3);
    /* ... and with none left in dispatch it gets -ENOENT */
    for (int q = 0; q < NQ; q++)
      f.dq[q].up = 0;
    assert_int_equal(lynx_dispatch_pick_flow(&f.d, &busy), -ENOENT);
  }
}

static void test_flow_hash(void **state) {
  struct sockaddr_in a, b;
  struct sockaddr_in6 c;
  (void)state;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(0x7f000001);
  a.sin_port = htons(4000);
  b = a;
  assert_int_equal(lynx_flow_hash((struct sockaddr *)&a),
                   lynx_flow_hash((struct sockaddr *)&b));
  b.sin_port = htons(4001);
  assert_int_not_equal(lynx_flow_hash((struct sockaddr *)&a),
                       lynx_flow_hash((struct sockaddr *)&b));
  memset(&c, 0, sizeof(c));
  c.sin6_family = AF_INET6;
  c.sin6_port = htons(4000);
  c.sin6_addr.s6_addr[15] = 1;
  assert_int_not_equal(lynx_flow_hash((struct sockaddr *)&a),
                       lynx_flow_hash((struct sockaddr *)&c));
  /* ports of one host spread over a 4096-slot table */
  {
    static unsigned char seen[4096];
    unsigned distinct = 0;
    for (uint16_t p = 0; p < 1000; p++) {
      uint32_t h;
      b.sin_port = htons((uint16_t)(30000 + p));
      h = lynx_flow_hash((struct sockaddr *)&b) & 4095u;
      if (!seen[h]++)
        distinct++;
    }
    assert_true(distinct > 850);
  }
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rr_rotates_evenly),
      cmocka_unit_test(test_rr_skips_full_and_down),
      cmocka_unit_test(test_rr_fill_up),
      cmocka_unit_test(test_all_full_enospc),
      cmocka_unit_test(test_none_up_enoent),
      cmocka_unit_test(test_lo_picks_least_outstanding),
      cmocka_unit_test(test_lo_rotates_ties),
      cmocka_unit_test(test_flow_sticks_while_outstanding),
      cmocka_unit_test(test_flow_full_refused),
      cmocka_unit_test(test_flow_hash),
  };
  return LYNX_UT_MAIN(argc, argv, "dispatch", tests, NULL, NULL);
}
