/*
 * test_top.c - lynxctl top's model (cli/top.c): frames read from
 * the API's JSON (pages, mqueues, frontends), rates against the previous
 * frame, the sort keys, and the text of durations, rates, health and a
 * whole batch frame.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <json-c/json.h>

#include "top.h"
#include "ut_main.h"

/* ---- building the API's answers ------------------------------------------ */

/* An accelerator as /v1/nodes carries it. */
static struct json_object *accel_json(const char *node, uint32_t idx,
                                      uint64_t requests, uint64_t window,
                                      uint64_t qp99, uint64_t sp99) {
  char id[96];
  struct json_object *a = json_object_new_object(),
                     *h = json_object_new_object(),
                     *l = json_object_new_object();
  snprintf(id, sizeof(id), "%s/%u", node, idx);
  json_object_object_add(a, "id", json_object_new_string(id));
  json_object_object_add(a, "node", json_object_new_string(node));
  json_object_object_add(a, "kind", json_object_new_string("cpu"));
  json_object_object_add(a, "model", json_object_new_string("cpu-emulated"));
  json_object_object_add(a, "requests",
                         json_object_new_int64((int64_t)requests));
  json_object_object_add(h, "dispatchable", json_object_new_boolean(1));
  json_object_object_add(h, "device_lost", json_object_new_boolean(0));
  json_object_object_add(h, "failed", json_object_new_boolean(0));
  json_object_object_add(h, "last_error", json_object_new_string(""));
  json_object_object_add(h, "stalled_mqueues", json_object_new_int64(0));
  json_object_object_add(h, "stall_ms", json_object_new_int64(0));
  json_object_object_add(a, "health", h);
  json_object_object_add(l, "window_requests",
                         json_object_new_int64((int64_t)window));
  json_object_object_add(l, "queue_p99_ns",
                         json_object_new_int64((int64_t)qp99));
  json_object_object_add(l, "service_p99_ns",
                         json_object_new_int64((int64_t)sp99));
  json_object_object_add(a, "latency", l);
  return a;
}

static struct json_object *health_of(struct json_object *a) {
  struct json_object *h = NULL;
  json_object_object_get_ex(a, "health", &h);
  return h;
}

static void set_bool(struct json_object *o, const char *k, int v) {
  json_object_object_add(o, k, json_object_new_boolean(v));
}

static struct json_object *node_json(const char *id, const char *state,
                                     uint64_t epoch) {
  struct json_object *n = json_object_new_object();
  json_object_object_add(n, "id", json_object_new_string(id));
  json_object_object_add(n, "state", json_object_new_string(state));
  json_object_object_add(n, "epoch", json_object_new_int64((int64_t)epoch));
  json_object_object_add(n, "accelerators", json_object_new_array());
  return n;
}

static void node_add(struct json_object *n, struct json_object *a) {
  struct json_object *arr;
  json_object_object_get_ex(n, "accelerators", &arr);
  json_object_array_add(arr, a);
}

/* {"version": v, "items": [...]} */
static struct json_object *list_json(uint64_t version) {
  struct json_object *l = json_object_new_object();
  json_object_object_add(l, "version", json_object_new_int64((int64_t)version));
  json_object_object_add(l, "items", json_object_new_array());
  return l;
}

static void list_add(struct json_object *l, struct json_object *item) {
  struct json_object *arr;
  json_object_object_get_ex(l, "items", &arr);
  json_object_array_add(arr, item);
}

static struct json_object *mq_json(const char *node, uint32_t accel,
                                   uint64_t outstanding) {
  struct json_object *m = json_object_new_object();
  json_object_object_add(m, "node", json_object_new_string(node));
  json_object_object_add(m, "accel", json_object_new_int64(accel));
  json_object_object_add(m, "outstanding",
                         json_object_new_int64((int64_t)outstanding));
  return m;
}

static struct json_object *fe_json(int connected, int active) {
  struct json_object *f = json_object_new_object();
  set_bool(f, "connected", connected);
  set_bool(f, "active", active);
  return f;
}

/* The id of the row shown at position i */
static const char *view_id(const struct lynx_top_frame *f, size_t i) {
  static char id[96];
  snprintf(id, sizeof(id), "%s/%u", f->view[i]->node, f->view[i]->idx);
  return id;
}

/* The view's first four rows are w0..w3, in that order. */
static void assert_view4(const struct lynx_top_frame *f, const char *w0,
                         const char *w1, const char *w2, const char *w3) {
  const char *want[4] = {w0, w1, w2, w3};
  for (size_t i = 0; i < 4; i++)
    assert_string_equal(view_id(f, i), want[i]);
}

/* ---- text ---------------------------------------------------------------- */

static void test_fmt_rate(void **state) {
  char b[32];
  (void)state;
  static const struct {
    double v;
    const char *want;
  } cases[] = {
      {-1, "-"},
      {0, "0.0"},
      {699.84, "699.8"},
      /* where "%.1f" would round to 1000.0, the unit moves on */
      {999.96, "1.0k"},
      {3850, "3.9k"},
      {999949, "999.9k"},
      {999950, "1.00M"},
      {2.5e6, "2.50M"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    lynx_top_fmt_rate(cases[i].v, b, sizeof(b));
    assert_string_equal(b, cases[i].want);
  }
}

static void test_fmt_dur(void **state) {
  char b[32];
  (void)state;
  static const struct {
    uint64_t v;
    const char *want;
  } cases[] = {
      {0, "0ns"},        {999, "999ns"},      {1000, "1.0us"},
      {12345, "12.3us"}, {4560000, "4.56ms"}, {1230000000, "1.23s"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    lynx_top_fmt_dur(cases[i].v, b, sizeof(b));
    assert_string_equal(b, cases[i].want);
  }
}

static void test_health_text(void **state) {
  struct lynx_top_health h;
  struct lynx_top_row r;
  char b[256];
  (void)state;
  memset(&h, 0, sizeof(h));
  h.dispatchable = 1;
  lynx_top_health_fmt(&h, b, sizeof(b));
  assert_string_equal(b, "ok");
  h.dispatchable = 0;
  lynx_top_health_fmt(&h, b, sizeof(b));
  assert_string_equal(b, "out"); /* out of dispatch, no reason given */
  h.failed = 1;
  snprintf(h.last_error, sizeof(h.last_error), "simulated failure");
  lynx_top_health_fmt(&h, b, sizeof(b));
  assert_string_equal(b, "failed: simulated failure");
  h.lost = 1;
  h.stalled_mqueues = 2;
  h.stall_ms = 2345;
  lynx_top_health_fmt(&h, b, sizeof(b));
  assert_string_equal(b, "lost, failed: simulated failure, stalled 2 mq 2.3s");
  memset(&h, 0, sizeof(h));
  h.stalled_mqueues = 1;
  h.stall_ms = 400;
  lynx_top_health_fmt(&h, b, sizeof(b));
  assert_string_equal(b, "stalled 1 mq 0.4s");

  /* a row adds its node's state when the node is not ready */
  memset(&r, 0, sizeof(r));
  r.health.dispatchable = 1;
  r.state = LYNX_TOP_READY;
  lynx_top_row_health(&r, b, sizeof(b));
  assert_string_equal(b, "ok");
  r.state = LYNX_TOP_DRAINED;
  lynx_top_row_health(&r, b, sizeof(b));
  assert_string_equal(b, "node drained");
  r.state = LYNX_TOP_DOWN;
  r.health.dispatchable = 0;
  r.health.failed = 1;
  snprintf(r.health.last_error, sizeof(r.health.last_error), "Xid 79");
  lynx_top_row_health(&r, b, sizeof(b));
  assert_string_equal(b, "failed: Xid 79, node down");

  /* parsed from the API's object */
  {
    struct json_object *a = accel_json("n", 0, 0, 0, 0, 0);
    set_bool(health_of(a), "dispatchable", 0);
    set_bool(health_of(a), "device_lost", 1);
    lynx_top_health_parse(health_of(a), &h);
    assert_false(h.dispatchable);
    assert_true(h.lost);
    assert_false(h.failed);
    lynx_top_health_fmt(&h, b, sizeof(b));
    assert_string_equal(b, "lost");
    json_object_put(a);
  }
}

static void test_key_names(void **state) {
  enum lynx_top_key k;
  (void)state;
  assert_int_equal(lynx_top_key_parse("rate", &k), 0);
  assert_int_equal(k, LYNX_TOP_BY_RATE);
  assert_int_equal(lynx_top_key_parse("outstanding", &k), 0);
  assert_int_equal(k, LYNX_TOP_BY_OUTSTANDING);
  assert_int_equal(lynx_top_key_parse("p99", &k), 0);
  assert_int_equal(k, LYNX_TOP_BY_P99);
  assert_int_equal(lynx_top_key_parse("id", &k), 0);
  assert_int_equal(k, LYNX_TOP_BY_ID);
  assert_int_not_equal(lynx_top_key_parse("cpu", &k), 0);
  assert_int_not_equal(lynx_top_key_parse("", &k), 0);
  assert_string_equal(lynx_top_key_name(LYNX_TOP_BY_P99), "p99");
}

/* ---- frames -------------------------------------------------------------- */

/* Two pages of nodes (b's accelerators listed out of order, a node
 * without accelerators, a draining node, a failed and a stalled
 * accelerator), mqueues and frontends. */
static void fill_frame(struct lynx_top_frame *f) {
  struct json_object *p1 = list_json(41), *p2 = list_json(42), *n, *a;
  struct json_object *mq = list_json(42), *fe = list_json(42);

  n = node_json("a", "ready", 7);
  node_add(n, accel_json("a", 0, 100, 10, 2000, 30000));
  a = accel_json("a", 1, 200, 0, 0, 0);
  set_bool(health_of(a), "dispatchable", 0);
  set_bool(health_of(a), "failed", 1);
  json_object_object_add(health_of(a), "last_error",
                         json_object_new_string("boom"));
  node_add(n, a);
  list_add(p1, n);
  list_add(p1, node_json("empty", "down", 1));

  n = node_json("b", "draining", 9);
  node_add(n, accel_json("b", 10, 5, 1, 1000, 9000));
  a = accel_json("b", 9, 7, 1, 1000, 9000);
  set_bool(health_of(a), "dispatchable", 0);
  json_object_object_add(health_of(a), "stalled_mqueues",
                         json_object_new_int64(1));
  json_object_object_add(health_of(a), "stall_ms", json_object_new_int64(2300));
  node_add(n, a);
  list_add(p2, n);

  assert_int_equal(lynx_top_add_nodes(f, p1), 0);
  assert_int_equal(lynx_top_add_nodes(f, p2), 0);
  assert_int_equal(lynx_top_index(f), 0);

  list_add(mq, mq_json("a", 0, 3));
  list_add(mq, mq_json("a", 0, 4));
  list_add(mq, mq_json("b", 10, 5));
  list_add(mq, mq_json("ghost", 0, 100)); /* no such accelerator */
  list_add(mq, mq_json("b", 11, 100));
  assert_int_equal(lynx_top_add_mqueues(f, mq), 0);

  list_add(fe, fe_json(1, 1));
  list_add(fe, fe_json(1, 0));
  list_add(fe, fe_json(0, 0)); /* gone */
  assert_int_equal(lynx_top_add_frontends(f, fe), 0);
  json_object_put(p1);
  json_object_put(p2);
  json_object_put(mq);
  json_object_put(fe);
}

static void test_frame_from_json(void **state) {
  struct lynx_top_frame f;
  struct json_object *bad = json_object_new_object();
  (void)state;
  lynx_top_frame_init(&f);
  fill_frame(&f);
  assert_int_equal(f.version, 41); /* the first page's */
  assert_int_equal(f.n, 4);
  assert_int_equal(f.nodes[LYNX_TOP_READY], 1);
  assert_int_equal(f.nodes[LYNX_TOP_DRAINING], 1);
  assert_int_equal(f.nodes[LYNX_TOP_DOWN], 1);
  assert_int_equal(f.nodes[LYNX_TOP_DRAINED], 0);
  /* a/0 only: a/1 failed, b's node is draining */
  assert_int_equal(f.dispatchable, 1);
  assert_int_equal(f.stalled, 1);
  assert_int_equal(f.broken, 1);
  assert_int_equal(f.frontends, 2);
  assert_int_equal(f.frontends_active, 1);
  /* in id order, the index compared as a number: b/9 before b/10 */
  assert_string_equal(f.rows[0].node, "a");
  assert_int_equal(f.rows[0].idx, 0);
  assert_int_equal(f.rows[1].idx, 1);
  assert_string_equal(f.rows[2].node, "b");
  assert_int_equal(f.rows[2].idx, 9);
  assert_int_equal(f.rows[3].idx, 10);
  assert_int_equal(f.rows[3].state, LYNX_TOP_DRAINING);
  assert_int_equal(f.rows[3].epoch, 9);
  /* outstanding summed over each accelerator's mqueues */
  assert_int_equal(f.rows[0].outstanding, 7);
  assert_int_equal(f.rows[1].outstanding, 0);
  assert_int_equal(f.rows[3].outstanding, 5);
  assert_int_equal(f.rows[0].service_p99_ns, 30000);
  assert_string_equal(f.rows[1].health.last_error, "boom");

  /* not a list */
  assert_int_equal(lynx_top_add_nodes(&f, bad), -EINVAL);
  assert_int_equal(lynx_top_add_mqueues(&f, bad), -EINVAL);
  assert_int_equal(lynx_top_add_frontends(&f, bad), -EINVAL);
  assert_int_equal(lynx_top_add_nodes(&f, NULL), -EINVAL);
  json_object_put(bad);
  lynx_top_frame_free(&f);
}

/* A frame read at at_ns of nodes n0..n(nodes-1) whose last heartbeat is
 * age_ms old, with `per` accelerators each, accelerator k's requests
 * req(k); nodes listed last first. */
static void make_frame(struct lynx_top_frame *f, uint32_t nodes, uint32_t per,
                       uint64_t at_ns, uint64_t age_ms,
                       uint64_t (*req)(uint32_t k), uint64_t epoch) {
  struct json_object *l = list_json(1);
  lynx_top_frame_init(f);
  f->at_ns = at_ns;
  for (uint32_t i = nodes; i-- > 0;) {
    char id[32];
    struct json_object *n;
    snprintf(id, sizeof(id), "n%u", i);
    n = node_json(id, "ready", epoch);
    json_object_object_add(n, "last_heartbeat_ms",
                           json_object_new_int64((int64_t)age_ms));
    for (uint32_t a = 0; a < per; a++)
      node_add(n, accel_json(id, a, req(i * per + a), 0, 0, 0));
    list_add(l, n);
  }
  assert_int_equal(lynx_top_add_nodes(f, l), 0);
  assert_int_equal(lynx_top_index(f), 0);
  json_object_put(l);
}

static uint64_t req_before(uint32_t k) { return 1000u + k; }
/* accelerator k took 20 x (1 + k % 7) requests more */
static uint64_t req_after(uint32_t k) { return 1000u + k + 20u * (1 + k % 7); }

/* k of row i of a frame of make_frame's with 2 accelerators a node */
static uint32_t k_of(const struct lynx_top_frame *f, size_t i) {
  return (uint32_t)(f->rows[i].node[1] - '0') * 2 + f->rows[i].idx;
}

static int near(double x, double want) {
  return x > want - 1e-6 && x < want + 1e-6;
}

static void test_rates(void **state) {
  struct lynx_top_frame prev, cur, again;
  uint64_t s = 1000000000u;
  (void)state;
  make_frame(&prev, 3, 2, 5 * s, 200, req_before, 1);
  lynx_top_rates(&prev, NULL); /* the first frame: none known */
  for (size_t i = 0; i < prev.n; i++)
    assert_true(prev.rows[i].rate < 0);
  assert_int_equal(prev.rates_known, 0);

  /* read 2 s later, the heartbeats as old: 2 s between them */
  make_frame(&cur, 3, 2, 7 * s, 200, req_after, 1);
  lynx_top_rates(&cur, &prev);
  for (size_t i = 0; i < cur.n; i++)
    assert_true(near(cur.rows[i].rate, 10.0 * (1 + k_of(&cur, i) % 7)));
  assert_int_equal(cur.rates_known, 6);
  /* 10 x (1+2+3+4+5+6) */
  assert_true(near(cur.rate_sum, 210));
  lynx_top_frame_free(&cur);

  /* the time between the heartbeats, not between the reads: read 2 s
   * later, but the last heartbeat 400 ms old instead of 200 */
  make_frame(&cur, 3, 2, 7 * s, 400, req_after, 1);
  lynx_top_rates(&cur, &prev);
  for (size_t i = 0; i < cur.n; i++)
    assert_true(near(cur.rows[i].rate, 20.0 * (1 + k_of(&cur, i) % 7) / 1.8));

  /* the same heartbeat again, in the same encoding of the list (read again
   * within its second: the same ages) or in a new one (older by the time
   * between the reads): the last rates stay */
  make_frame(&again, 3, 2, 7 * s + s / 2, 400, req_after, 1);
  lynx_top_rates(&again, &cur);
  for (size_t i = 0; i < again.n; i++)
    assert_true(near(again.rows[i].rate, cur.rows[i].rate));
  assert_int_equal(again.rates_known, 6);
  lynx_top_frame_free(&again);
  make_frame(&again, 3, 2, 8 * s, 1400, req_after, 1);
  again.rows[5].state = LYNX_TOP_DOWN; /* but not on a down node */
  again.rows[4].sampled_ns += s / 10;  /* n2/0: a heartbeat, no request */
  again.rows[4].requests = cur.rows[4].requests;
  lynx_top_rates(&again, &cur);
  for (size_t i = 0; i < 4; i++)
    assert_true(near(again.rows[i].rate, cur.rows[i].rate));
  assert_true(near(again.rows[4].rate, 0));
  assert_true(again.rows[5].rate < 0);
  assert_int_equal(again.rates_known, 5);
  lynx_top_frame_free(&again);
  lynx_top_frame_free(&cur);

  /* an idle accelerator whose heartbeat age happens to be the same to the
   * ms in both frames (one time in a few hundred): its rate is 0, known,
   * as long as the rest of the list moved */
  make_frame(&cur, 3, 2, 7 * s, 200, req_after, 1);
  cur.rows[0].requests = prev.rows[0].requests;
  lynx_top_rates(&cur, &prev);
  assert_true(near(cur.rows[0].rate, 0));
  assert_int_equal(cur.rates_known, 6);
  lynx_top_frame_free(&cur);

  /* unknown: an accelerator prev lacks, a counter that went back, a new
   * epoch (the agent restarted) */
  make_frame(&cur, 3, 2, 7 * s, 200, req_after, 1);
  prev.rows[0].idx = 77;            /* n0/0 is not in prev (n0/77 is) */
  prev.rows[1].requests = 1u << 30; /* n0/1 went back */
  prev.rows[2].epoch = 0;           /* n1/0 restarted */
  assert_int_equal(lynx_top_index(&prev), 0); /* n0/77 in its place */
  lynx_top_rates(&cur, &prev);
  assert_true(cur.rows[0].rate < 0);
  assert_true(cur.rows[1].rate < 0);
  assert_true(cur.rows[2].rate < 0);
  assert_true(cur.rows[3].rate > 0);
  assert_int_equal(cur.rates_known, 3);
  lynx_top_frame_free(&prev);
  lynx_top_frame_free(&cur);
}

static void test_sort_keys(void **state) {
  struct lynx_top_frame f;
  (void)state;
  lynx_top_frame_init(&f);
  fill_frame(&f); /* a/0 a/1 b/9 b/10 */
  f.rows[0].rate = 5;
  f.rows[1].rate = -1; /* unknown: last */
  f.rows[2].rate = 9;
  f.rows[3].rate = 5; /* a tie with a/0: by id */
  lynx_top_sort(&f, LYNX_TOP_BY_RATE);
  assert_view4(&f, "b/9", "a/0", "b/10", "a/1");

  /* outstanding 7, 0, 0, 5 */
  lynx_top_sort(&f, LYNX_TOP_BY_OUTSTANDING);
  assert_view4(&f, "a/0", "b/10", "a/1", "b/9");

  /* service p99 30us, none (a/1: empty window, last), 9us, 9us */
  lynx_top_sort(&f, LYNX_TOP_BY_P99);
  assert_view4(&f, "a/0", "b/9", "b/10", "a/1");

  lynx_top_sort(&f, LYNX_TOP_BY_ID);
  assert_view4(&f, "a/0", "a/1", "b/9", "b/10");
  lynx_top_frame_free(&f);
}

static void test_print_frame(void **state) {
  struct lynx_top_frame f;
  char *buf = NULL;
  size_t len = 0;
  FILE *out;
  (void)state;
  lynx_top_frame_init(&f);
  fill_frame(&f);
  f.rows[0].rate = 1234.5;
  f.rows[2].rate = 0;
  f.rows[3].rate = 12.25;
  f.rate_sum = 1246.75;
  f.rates_known = 3;
  lynx_top_sort(&f, LYNX_TOP_BY_RATE);
  out = open_memstream(&buf, &len);
  assert_non_null(out);
  assert_int_equal(
      lynx_top_print(out, &f, "http://h:1", LYNX_TOP_BY_RATE, "12:00:00"), 0);
  fclose(out);
  assert_string_equal(
      buf,
      "lynxctl top: http://h:1  registry version 41  12:00:00  sort: rate\n"
      "nodes: 3 total, 1 ready, 1 draining, 0 drained, 1 down\n"
      "accelerators: 4 total, 1 dispatchable, 1 stalled, 1 lost or failed\n"
      "frontends: 2 connected, 1 active  requests/s: 1.2k\n"
      "ID    STATE     KIND  MODEL         RATE     OUTSTANDING  QUEUE-P99  "
      "SERVICE-P99  HEALTH\n"
      "a/0   ready     cpu   cpu-emulated  1.2k     7            2.0us      "
      "30.0us       ok\n"
      "b/10  draining  cpu   cpu-emulated  12.2     5            1.0us      "
      "9.0us        node draining\n"
      "b/9   draining  cpu   cpu-emulated  0.0      0            1.0us      "
      "9.0us        stalled 1 mq 2.3s, node draining\n"
      "a/1   ready     cpu   cpu-emulated  -        0            -          "
      "-            failed: boom\n"
      "\n");
  free(buf);
  lynx_top_frame_free(&f);
}

static uint64_t req_many_before(uint32_t k) { return (uint64_t)k * 1000u; }
static uint64_t req_many_after(uint32_t k) {
  return (uint64_t)k * 1000u + (k % 13);
}

/* 10,000 accelerators (2,500 nodes listed in reverse): every rate comes
 * from its own accelerator, and the rate order holds over all of them. */
static void test_many(void **state) {
  struct lynx_top_frame prev, cur;
  (void)state;
  /* heartbeats 1.25 s apart */
  make_frame(&prev, 2500, 4, 1000000000u, 250, req_many_before, 1);
  make_frame(&cur, 2500, 4, 2000000000u, 0, req_many_after, 1);
  assert_int_equal(cur.n, 10000);
  lynx_top_rates(&cur, &prev);
  assert_int_equal(cur.rates_known, 10000);
  for (size_t i = 0; i < cur.n; i++) {
    uint32_t k =
        (uint32_t)strtoul(cur.rows[i].node + 1, NULL, 10) * 4 + cur.rows[i].idx;
    assert_true(near(cur.rows[i].rate, (double)(k % 13) / 1.25));
  }
  lynx_top_sort(&cur, LYNX_TOP_BY_RATE);
  for (size_t i = 1; i < cur.n; i++)
    assert_true(cur.view[i - 1]->rate >= cur.view[i]->rate);
  assert_true(near(cur.view[0]->rate, 12 / 1.25));
  /* the first by id of those at 12 (402 % 13): ids compare as text */
  assert_string_equal(view_id(&cur, 0), "n100/2");
  lynx_top_frame_free(&prev);
  lynx_top_frame_free(&cur);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fmt_rate),
      cmocka_unit_test(test_fmt_dur),
      cmocka_unit_test(test_health_text),
      cmocka_unit_test(test_key_names),
      cmocka_unit_test(test_frame_from_json),
      cmocka_unit_test(test_rates),
      cmocka_unit_test(test_sort_keys),
      cmocka_unit_test(test_print_frame),
      cmocka_unit_test(test_many),
  };
  return LYNX_UT_MAIN(argc, argv, "top", tests, NULL, NULL);
}
