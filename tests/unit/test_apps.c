/*
 * test_apps.c - unit tests of accel/apps.c (echo, sockperf-echo) driven
 * through a real mqueue, the test acting as the frontend.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "apps.h"
#include "ut_main.h"
#include "ut_ring.h"

#define Z 256u
#define S 4u

struct fx {
  struct ut_region r;
  struct lynx_mq mq;
  uint32_t rx_prod;
  uint32_t tx_cons;
};

static int fx_setup(void **state) {
  struct fx *f = calloc(1, sizeof(*f));
  if (!f)
    return -1;
  if (ut_region_init(&f->r, 1, S, Z) != 0) {
    free(f);
    return -1;
  }
  lynx_mq_bind(&f->mq, f->r.mem, &f->r.g, 0);
  *state = f;
  return 0;
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

/* Frontend sends one request; accelerator receives it into *m. */
static void push_recv(struct fx *f, uint32_t tag, const void *data,
                      uint32_t len, struct lynx_msg *m) {
  assert_false(lynx_ring_full(f->rx_prod, ut_actrl(&f->r, 0)->rx_cons, S));
  ut_put(&f->r, 0, f->rx_prod++, tag, data, len);
  assert_int_equal(lynx_mq_recv(&f->mq, m), 0);
  assert_int_equal(m->tag, tag);
  assert_int_equal(m->len, len);
}

/* Frontend takes the next response; returns its metadata and payload. */
static void pop_tx(struct fx *f, struct lynx_slot_meta *tm,
                   const uint8_t **data) {
  assert_int_equal(ut_get_tx(&f->r, 0, f->tx_cons, tm, data), 0);
  f->tx_cons++;
  ut_fctrl(&f->r, 0)->tx_cons = f->tx_cons;
}

static void no_tx(struct fx *f) {
  struct lynx_slot_meta tm = {0};
  const uint8_t *data = NULL;
  assert_int_equal(ut_get_tx(&f->r, 0, f->tx_cons, &tm, &data), -EAGAIN);
  assert_int_equal(ut_actrl(&f->r, 0)->tx_prod, f->tx_cons);
}

/* Handles m with app, then releases it as the CPU backend does. */
static int run_app(struct fx *f, const struct lynx_app *app,
                   const struct lynx_msg *m, int *replied) {
  int rc;
  *replied = -1;
  rc = lynx_app_handle(app, &f->mq, m, replied, NULL);
  if (rc == 0)
    lynx_release(&f->mq);
  return rc;
}

static void sp_hdr(uint8_t *b, uint64_t seq, uint16_t flags, uint32_t len) {
  for (int i = 0; i < 8; i++)
    b[i] = (uint8_t)(seq >> (56 - 8 * i));
  b[8] = (uint8_t)(flags >> 8);
  b[9] = (uint8_t)flags;
  b[10] = (uint8_t)(len >> 24);
  b[11] = (uint8_t)(len >> 16);
  b[12] = (uint8_t)(len >> 8);
  b[13] = (uint8_t)len;
}

static void test_app_find(void **state) {
  const struct lynx_app *a;
  (void)state;
  a = lynx_app_find("echo");
  assert_non_null(a);
  assert_string_equal(a->name, "echo");
  assert_non_null(a->def->handle);
  a = lynx_app_find("sockperf-echo");
  assert_non_null(a);
  assert_string_equal(a->name, "sockperf-echo");
  assert_null(lynx_app_find("nope"));
  assert_null(lynx_app_find(""));
  assert_null(lynx_app_find("ECHO"));
  assert_non_null(strstr(lynx_app_names(), "echo"));
  assert_non_null(strstr(lynx_app_names(), "sockperf-echo"));
}

static void test_echo_echoes(void **state) {
  struct fx *f = *state;
  const struct lynx_app *app = lynx_app_find("echo");
  struct lynx_msg m = {0};
  struct lynx_slot_meta tm = {0};
  const uint8_t *data = NULL;
  uint8_t big[240];
  int replied;

  assert_non_null(app);
  push_recv(f, 0xE0000001u, "ping 1", 6, &m);
  assert_int_equal(run_app(f, app, &m, &replied), 0);
  assert_int_equal(replied, 1);
  pop_tx(f, &tm, &data);
  assert_int_equal(tm.tag, 0xE0000001u);
  assert_int_equal(tm.status, LYNX_ST_OK);
  assert_int_equal(tm.len, 6);
  assert_memory_equal(data, "ping 1", 6);
  assert_int_equal(ut_actrl(&f->r, 0)->rx_cons, 1);

  /* empty and slot-sized requests */
  push_recv(f, 2, NULL, 0, &m);
  assert_int_equal(run_app(f, app, &m, &replied), 0);
  assert_int_equal(replied, 1);
  pop_tx(f, &tm, &data);
  assert_int_equal(tm.tag, 2);
  assert_int_equal(tm.len, 0);
  assert_int_equal(tm.status, LYNX_ST_OK);

  for (size_t i = 0; i < sizeof(big); i++)
    big[i] = (uint8_t)(i * 7 + 3);
  push_recv(f, 3, big, sizeof(big), &m);
  assert_int_equal(run_app(f, app, &m, &replied), 0);
  assert_int_equal(replied, 1);
  pop_tx(f, &tm, &data);
  assert_int_equal(tm.tag, 3);
  assert_int_equal(tm.len, sizeof(big));
  assert_memory_equal(data, big, sizeof(big));
  no_tx(f);
}

static void test_echo_tx_full(void **state) {
  struct fx *f = *state;
  const struct lynx_app *app = lynx_app_find("echo");
  struct lynx_msg m = {0};
  struct lynx_slot_meta tm = {0};
  const uint8_t *data = NULL;
  int replied;
  /* the frontend does not drain: after S answers the next one must wait */
  for (uint32_t i = 0; i < S; i++) {
    push_recv(f, 10 + i, "x", 1, &m);
    assert_int_equal(run_app(f, app, &m, &replied), 0);
    assert_int_equal(replied, 1);
  }
  push_recv(f, 99, "late", 4, &m);
  assert_int_equal(run_app(f, app, &m, &replied), -EAGAIN);
  assert_int_equal(replied, 0);
  assert_int_equal(ut_actrl(&f->r, 0)->rx_cons, S); /* still held */
  pop_tx(f, &tm, &data);
  assert_int_equal(tm.tag, 10);
  assert_int_equal(run_app(f, app, &m, &replied), 0);
  assert_int_equal(replied, 1);
  for (uint32_t i = 1; i < S; i++) {
    pop_tx(f, &tm, &data);
    assert_int_equal(tm.tag, 10 + i);
  }
  pop_tx(f, &tm, &data);
  assert_int_equal(tm.tag, 99);
  assert_memory_equal(data, "late", 4);
}

static void test_sockperf_answers_pong_request(void **state) {
  struct fx *f = *state;
  const struct lynx_app *app = lynx_app_find("sockperf-echo");
  struct lynx_msg m = {0};
  struct lynx_slot_meta tm = {0};
  const uint8_t *data = NULL;
  uint8_t req[64], want[64];
  int replied;

  assert_non_null(app);
  for (size_t i = 0; i < sizeof(req); i++)
    req[i] = (uint8_t)(0xA0 + i);
  /* client + pong request, in network order: 0x0003 */
  sp_hdr(req, 0x0102030405060708ull, 0x0003, sizeof(req));
  memcpy(want, req, sizeof(want));
  want[9] = 0x02; /* client flag cleared, nothing else changes */
  push_recv(f, 0x5000AAAAu, req, sizeof(req), &m);
  assert_int_equal(run_app(f, app, &m, &replied), 0);
  assert_int_equal(replied, 1);
  pop_tx(f, &tm, &data);
  assert_int_equal(tm.tag, 0x5000AAAAu);
  assert_int_equal(tm.status, LYNX_ST_OK);
  assert_int_equal(tm.len, sizeof(req));
  assert_memory_equal(data, want, sizeof(want));
  /* the request itself is not modified */
  assert_int_equal(req[9], 0x03);

  /* exactly a header, high flag byte set: 0x0103 -> 0x0102 */
  sp_hdr(req, 42, 0x0103, 14);
  memcpy(want, req, 14);
  want[8] = 0x01;
  want[9] = 0x02;
  push_recv(f, 7, req, 14, &m);
  assert_int_equal(run_app(f, app, &m, &replied), 0);
  assert_int_equal(replied, 1);
  pop_tx(f, &tm, &data);
  assert_int_equal(tm.tag, 7);
  assert_int_equal(tm.len, 14);
  assert_memory_equal(data, want, 14);

  /* a pong request without the client flag keeps its flags */
  sp_hdr(req, 43, 0x0002, 20);
  push_recv(f, 8, req, 20, &m);
  assert_int_equal(run_app(f, app, &m, &replied), 0);
  assert_int_equal(replied, 1);
  pop_tx(f, &tm, &data);
  assert_int_equal(tm.tag, 8);
  assert_memory_equal(data, req, 20);
  no_tx(f);
}

static void expect_dropped(struct fx *f, uint32_t tag) {
  struct lynx_slot_meta tm = {0};
  const uint8_t *data = NULL;
  pop_tx(f, &tm, &data);
  assert_int_equal(tm.tag, tag);
  assert_int_equal(tm.status, LYNX_ST_DROPPED);
  assert_int_equal(tm.len, 0);
}

static void test_sockperf_drops_others(void **state) {
  struct fx *f = *state;
  const struct lynx_app *app = lynx_app_find("sockperf-echo");
  struct lynx_msg m = {0};
  uint8_t req[32];
  int replied;
  const uint16_t no_pong[] = {
      0x0000, /* nothing */
      0x0001, /* client, no pong request */
      0x0200, /* 0x0002 only if read little-endian */
      0xFFFD, /* every flag but pong request */
  };
  assert_non_null(app);
  for (size_t k = 0; k < sizeof(no_pong) / sizeof(no_pong[0]); k++) {
    memset(req, 0x33, sizeof(req));
    sp_hdr(req, k, no_pong[k], sizeof(req));
    push_recv(f, 0xD0000000u + (uint32_t)k, req, sizeof(req), &m);
    assert_int_equal(run_app(f, app, &m, &replied), 0);
    assert_int_equal(replied, 0);
    expect_dropped(f, 0xD0000000u + (uint32_t)k);
    assert_int_equal(ut_actrl(&f->r, 0)->rx_cons, f->rx_prod);
  }
  no_tx(f);
}

static void test_sockperf_drops_short(void **state) {
  struct fx *f = *state;
  const struct lynx_app *app = lynx_app_find("sockperf-echo");
  struct lynx_msg m = {0};
  uint8_t req[14];
  int replied;
  assert_non_null(app);
  sp_hdr(req, 1, 0x0003, 14);
  /* every length below the header is dropped, even with pong flags set */
  for (uint32_t len = 0; len < 14; len++) {
    push_recv(f, 0x5E000000u + len, req, len, &m);
    assert_int_equal(run_app(f, app, &m, &replied), 0);
    assert_int_equal(replied, 0);
    expect_dropped(f, 0x5E000000u + len);
  }
  no_tx(f);
}

static void test_sockperf_tx_full(void **state) {
  struct fx *f = *state;
  const struct lynx_app *app = lynx_app_find("sockperf-echo");
  struct lynx_msg m = {0};
  uint8_t req[14];
  int replied;
  sp_hdr(req, 1, 0x0003, 14);
  for (uint32_t i = 0; i < S; i++) {
    push_recv(f, i, req, 14, &m);
    assert_int_equal(run_app(f, app, &m, &replied), 0);
    assert_int_equal(replied, 1);
  }
  /* TX full: an answer and a drop must both be retried, not lost */
  push_recv(f, 50, req, 14, &m);
  assert_int_equal(run_app(f, app, &m, &replied), -EAGAIN);
  assert_int_equal(replied, 0);
  lynx_release(&f->mq);
  sp_hdr(req, 1, 0x0001, 14);
  push_recv(f, 51, req, 14, &m);
  assert_int_equal(run_app(f, app, &m, &replied), -EAGAIN);
  assert_int_equal(replied, 0);
  assert_int_equal(ut_actrl(&f->r, 0)->tx_prod, S);
  f->tx_cons = S;
  ut_fctrl(&f->r, 0)->tx_cons = S;
  assert_int_equal(run_app(f, app, &m, &replied), 0);
  expect_dropped(f, 51);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_app_find),
      cmocka_unit_test_setup_teardown(test_echo_echoes, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_echo_tx_full, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_sockperf_answers_pong_request,
                                      fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_sockperf_drops_others, fx_setup,
                                      fx_teardown),
      cmocka_unit_test_setup_teardown(test_sockperf_drops_short, fx_setup,
                                      fx_teardown),
      cmocka_unit_test_setup_teardown(test_sockperf_tx_full, fx_setup,
                                      fx_teardown),
  };
  return LYNX_UT_MAIN(argc, argv, "apps", tests, NULL, NULL);
}
