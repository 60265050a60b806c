/* test_frame.c - unit tests of proto/frame.c: framing and the hello check. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "frame.h"
#include "ut_main.h"

/* Everything a test may have to free, released by the teardown whichever
 * way the test ends. */
struct fx {
  struct lynx_frame_reader r;
  uint8_t *buf[4];
  Lynx__Envelope *env[4];
};

static int fx_setup(void **state) {
  struct fx *f = calloc(1, sizeof(*f));
  if (!f)
    return -1;
  lynx_frame_reader_init(&f->r, 0);
  *state = f;
  return 0;
}

static int fx_teardown(void **state) {
  struct fx *f = *state;
  if (f) {
    lynx_frame_reader_free(&f->r);
    for (int i = 0; i < 4; i++) {
      free(f->buf[i]);
      if (f->env[i])
        lynx__envelope__free_unpacked(f->env[i], NULL);
    }
    free(f);
  }
  *state = NULL;
  return 0;
}

static void make_hello(Lynx__Envelope *env, Lynx__Hello *h) {
  lynx__envelope__init(env);
  lynx__hello__init(h);
  h->proto_version = LYNX_PROTO_VERSION;
  h->role = "frontend";
  h->id = "fe-1";
  h->token = "s3cret";
  env->msg_case = LYNX__ENVELOPE__MSG_HELLO;
  env->hello = h;
}

struct desc_msg {
  Lynx__Envelope env;
  Lynx__Descriptors d;
  Lynx__RegionDesc r[2];
  Lynx__RegionDesc *rp[2];
};

static void make_descriptors(struct desc_msg *m) {
  lynx__envelope__init(&m->env);
  lynx__descriptors__init(&m->d);
  m->d.node_id = "node-7";
  m->d.epoch = 0x1122334455667788ull;
  m->d.app = "sockperf-echo";
  m->d.service = "0.0.0.0:11111";
  for (int i = 0; i < 2; i++) {
    lynx__region_desc__init(&m->r[i]);
    m->r[i].accel_id = (uint32_t)i;
    m->r[i].transport = "shm";
    m->r[i].locator = i ? "/lynx-b" : "/lynx-a";
    m->r[i].region_size = 4096u * (uint64_t)(i + 3);
    m->r[i].epoch = m->d.epoch;
    m->r[i].n_mqueues = 2u + (uint32_t)i;
    m->r[i].slot_size = 2048;
    m->r[i].slots = 64;
    m->r[i].ordering = i ? LYNX__ORDERING__ORDERING_FENCED
                         : LYNX__ORDERING__ORDERING_COALESCED;
    m->r[i].kind = "cpu";
    m->r[i].model = "x86-64";
    m->r[i].memory_bytes = 1ull << 33;
    m->r[i].key = 0xABCDu + (uint64_t)i;
    m->r[i].remote_addr = 0x7f0000000000ull + (uint64_t)i;
    m->rp[i] = &m->r[i];
  }
  m->d.n_regions = 2;
  m->d.regions = m->rp;
  m->env.msg_case = LYNX__ENVELOPE__MSG_DESCRIPTORS;
  m->env.descriptors = &m->d;
}

static void check_hello(const Lynx__Envelope *e) {
  assert_non_null(e);
  assert_int_equal(e->msg_case, LYNX__ENVELOPE__MSG_HELLO);
  assert_non_null(e->hello);
  assert_int_equal(e->hello->proto_version, LYNX_PROTO_VERSION);
  assert_string_equal(e->hello->role, "frontend");
  assert_string_equal(e->hello->id, "fe-1");
  assert_string_equal(e->hello->token, "s3cret");
}

static void check_descriptors(const Lynx__Envelope *e,
                              const struct desc_msg *m) {
  const Lynx__Descriptors *d;
  assert_non_null(e);
  assert_int_equal(e->msg_case, LYNX__ENVELOPE__MSG_DESCRIPTORS);
  d = e->descriptors;
  assert_non_null(d);
  assert_string_equal(d->node_id, "node-7");
  assert_true(d->epoch == 0x1122334455667788ull);
  assert_string_equal(d->app, "sockperf-echo");
  assert_string_equal(d->service, "0.0.0.0:11111");
  assert_int_equal(d->n_regions, 2);
  for (int i = 0; i < 2; i++) {
    const Lynx__RegionDesc *g = d->regions[i], *w = &m->r[i];
    assert_int_equal(g->accel_id, w->accel_id);
    assert_string_equal(g->transport, w->transport);
    assert_string_equal(g->locator, w->locator);
    assert_true(g->region_size == w->region_size);
    assert_true(g->epoch == w->epoch);
    assert_int_equal(g->n_mqueues, w->n_mqueues);
    assert_int_equal(g->slot_size, w->slot_size);
    assert_int_equal(g->slots, w->slots);
    assert_int_equal(g->ordering, w->ordering);
    assert_string_equal(g->kind, w->kind);
    assert_string_equal(g->model, w->model);
    assert_true(g->memory_bytes == w->memory_bytes);
    assert_true(g->key == w->key);
    assert_true(g->remote_addr == w->remote_addr);
  }
}

static uint32_t be32(const uint8_t *b) {
  return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 |
         b[3];
}

static void test_roundtrip_hello(void **state) {
  struct fx *f = *state;
  Lynx__Envelope env;
  Lynx__Hello h;
  size_t len = 0;
  make_hello(&env, &h);
  assert_int_equal(
      lynx_frame_encode(&env, LYNX_FRAME_MAX_DEFAULT, &f->buf[0], &len), 0);
  assert_true(len > LYNX_FRAME_HDR);
  /* 4-byte big-endian length of the body */
  assert_int_equal(be32(f->buf[0]), len - LYNX_FRAME_HDR);
  assert_int_equal(len - LYNX_FRAME_HDR, lynx__envelope__get_packed_size(&env));
  assert_int_equal(lynx_frame_feed(&f->r, f->buf[0], len), 0);
  assert_int_equal(lynx_frame_next(&f->r, &f->env[0]), 1);
  check_hello(f->env[0]);
  assert_int_equal(f->r.len, 0);
  assert_int_equal(lynx_frame_next(&f->r, &f->env[1]), 0);
  assert_null(f->env[1]);
}

static void test_roundtrip_descriptors(void **state) {
  struct fx *f = *state;
  struct desc_msg m;
  size_t len = 0;
  make_descriptors(&m);
  assert_int_equal(
      lynx_frame_encode(&m.env, LYNX_FRAME_MAX_DEFAULT, &f->buf[0], &len), 0);
  assert_int_equal(be32(f->buf[0]), len - LYNX_FRAME_HDR);
  assert_int_equal(lynx_frame_feed(&f->r, f->buf[0], len), 0);
  assert_int_equal(lynx_frame_next(&f->r, &f->env[0]), 1);
  check_descriptors(f->env[0], &m);
  assert_int_equal(lynx_frame_next(&f->r, &f->env[1]), 0);
}

static void test_encode_over_max(void **state) {
  struct fx *f = *state;
  struct desc_msg m;
  size_t len = 12345, n;
  make_descriptors(&m);
  n = lynx__envelope__get_packed_size(&m.env);
  assert_int_equal(lynx_frame_encode(&m.env, n - 1, &f->buf[0], &len),
                   -EMSGSIZE);
  assert_null(f->buf[0]);
  assert_int_equal(len, 12345);
  assert_int_equal(lynx_frame_encode(&m.env, n, &f->buf[0], &len), 0);
  assert_int_equal(len, n + LYNX_FRAME_HDR);
}

/* Fed one byte at a time: nothing comes out until the last byte. */
static void test_truncated_bytewise(void **state) {
  struct fx *f = *state;
  struct desc_msg m;
  size_t len = 0;
  make_descriptors(&m);
  assert_int_equal(
      lynx_frame_encode(&m.env, LYNX_FRAME_MAX_DEFAULT, &f->buf[0], &len), 0);
  assert_int_equal(lynx_frame_next(&f->r, &f->env[0]), 0); /* empty */
  for (size_t i = 0; i < len; i++) {
    assert_int_equal(lynx_frame_feed(&f->r, f->buf[0] + i, 1), 0);
    if (i + 1 < len) {
      assert_int_equal(lynx_frame_next(&f->r, &f->env[0]), 0);
      assert_null(f->env[0]);
      /* nothing consumed while incomplete */
      assert_int_equal(f->r.len, i + 1);
    }
  }
  assert_int_equal(lynx_frame_next(&f->r, &f->env[0]), 1);
  check_descriptors(f->env[0], &m);
  assert_int_equal(lynx_frame_next(&f->r, &f->env[1]), 0);
}

static void test_oversized_length_early(void **state) {
  struct fx *f = *state;
  const uint8_t hdr101[4] = {0, 0, 0, 101};
  const uint8_t hdr100[4] = {0, 0, 0, 100};
  const uint8_t huge[4] = {0xFF, 0xFF, 0xFF, 0xFF};
  Lynx__Envelope *e = NULL;

  lynx_frame_reader_free(&f->r);
  lynx_frame_reader_init(&f->r, 100);
  /* only the header has arrived: the cap is enforced already */
  assert_int_equal(lynx_frame_feed(&f->r, hdr101, 4), 0);
  assert_int_equal(lynx_frame_next(&f->r, &e), -EMSGSIZE);
  assert_null(e);

  lynx_frame_reader_free(&f->r);
  lynx_frame_reader_init(&f->r, 100);
  assert_int_equal(lynx_frame_feed(&f->r, hdr100, 4), 0);
  assert_int_equal(lynx_frame_next(&f->r, &e), 0); /* at the cap: wait */

  lynx_frame_reader_free(&f->r);
  lynx_frame_reader_init(&f->r, 0); /* default cap, 1 MiB */
  assert_int_equal(f->r.max, LYNX_FRAME_MAX_DEFAULT);
  assert_int_equal(lynx_frame_feed(&f->r, huge, 4), 0);
  assert_int_equal(lynx_frame_next(&f->r, &e), -EMSGSIZE);
  assert_null(e);
  /* the reader did not grow to the announced size */
  assert_true(f->r.cap < 65536);
}

static void test_garbage_body(void **state) {
  struct fx *f = *state;
  /* field 1 (hello), length-delimited, announces 16 bytes, has 1 */
  const uint8_t bad1[] = {0, 0, 0, 3, 0x0a, 0x10, 0x01};
  /* wire type 7 does not exist */
  const uint8_t bad2[] = {0, 0, 0, 5, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
  Lynx__Envelope *e = NULL;
  assert_int_equal(lynx_frame_feed(&f->r, bad1, sizeof(bad1)), 0);
  assert_int_equal(lynx_frame_next(&f->r, &e), -EBADMSG);
  assert_null(e);
  lynx_frame_reader_free(&f->r);
  lynx_frame_reader_init(&f->r, 0);
  assert_int_equal(lynx_frame_feed(&f->r, bad2, sizeof(bad2)), 0);
  assert_int_equal(lynx_frame_next(&f->r, &e), -EBADMSG);
  assert_null(e);
}

static void test_empty_envelope(void **state) {
  struct fx *f = *state;
  Lynx__Envelope env, *e = NULL;
  /* field 9, varint: a valid encoding that sets no member of the oneof */
  const uint8_t unknown[] = {0, 0, 0, 2, 0x48, 0x01};
  size_t len = 0;
  lynx__envelope__init(&env);
  assert_int_equal(
      lynx_frame_encode(&env, LYNX_FRAME_MAX_DEFAULT, &f->buf[0], &len), 0);
  assert_int_equal(len, LYNX_FRAME_HDR); /* an empty body */
  assert_int_equal(lynx_frame_feed(&f->r, f->buf[0], len), 0);
  assert_int_equal(lynx_frame_next(&f->r, &e), -EBADMSG);
  assert_null(e);
  lynx_frame_reader_free(&f->r);
  lynx_frame_reader_init(&f->r, 0);
  assert_int_equal(lynx_frame_feed(&f->r, unknown, sizeof(unknown)), 0);
  assert_int_equal(lynx_frame_next(&f->r, &e), -EBADMSG);
  assert_null(e);
}

static void test_two_frames_one_feed(void **state) {
  struct fx *f = *state;
  Lynx__Envelope env;
  Lynx__Hello h;
  struct desc_msg m;
  size_t l1 = 0, l2 = 0;
  make_hello(&env, &h);
  make_descriptors(&m);
  assert_int_equal(
      lynx_frame_encode(&env, LYNX_FRAME_MAX_DEFAULT, &f->buf[0], &l1), 0);
  assert_int_equal(
      lynx_frame_encode(&m.env, LYNX_FRAME_MAX_DEFAULT, &f->buf[1], &l2), 0);
  f->buf[2] = malloc(l1 + l2 + l1);
  assert_non_null(f->buf[2]);
  memcpy(f->buf[2], f->buf[0], l1);
  memcpy(f->buf[2] + l1, f->buf[1], l2);
  memcpy(f->buf[2] + l1 + l2, f->buf[0], l1);
  /* both frames and the first 3 bytes of a third in one feed */
  assert_int_equal(lynx_frame_feed(&f->r, f->buf[2], l1 + l2 + 3), 0);
  assert_int_equal(lynx_frame_next(&f->r, &f->env[0]), 1);
  check_hello(f->env[0]);
  assert_int_equal(lynx_frame_next(&f->r, &f->env[1]), 1);
  check_descriptors(f->env[1], &m);
  assert_int_equal(lynx_frame_next(&f->r, &f->env[2]), 0);
  assert_int_equal(f->r.len, 3);
  assert_int_equal(lynx_frame_feed(&f->r, f->buf[2] + l1 + l2 + 3, l1 - 3), 0);
  assert_int_equal(lynx_frame_next(&f->r, &f->env[2]), 1);
  check_hello(f->env[2]);
  assert_int_equal(lynx_frame_next(&f->r, &f->env[3]), 0);
  assert_int_equal(f->r.len, 0);
}

/* Feeding nothing is a no-op, on a fresh reader as on a used one. */
static void test_feed_empty(void **state) {
  struct fx *f = *state;
  Lynx__Envelope env;
  Lynx__Hello h;
  size_t len = 0;
  uint8_t none = 0;
  assert_int_equal(lynx_frame_feed(&f->r, &none, 0), 0);
  assert_int_equal(f->r.len, 0);
  assert_int_equal(lynx_frame_next(&f->r, &f->env[0]), 0);
  make_hello(&env, &h);
  assert_int_equal(
      lynx_frame_encode(&env, LYNX_FRAME_MAX_DEFAULT, &f->buf[0], &len), 0);
  assert_int_equal(lynx_frame_feed(&f->r, f->buf[0], 2), 0);
  assert_int_equal(lynx_frame_feed(&f->r, &none, 0), 0);
  assert_int_equal(f->r.len, 2);
  assert_int_equal(lynx_frame_feed(&f->r, f->buf[0] + 2, len - 2), 0);
  assert_int_equal(lynx_frame_next(&f->r, &f->env[0]), 1);
  check_hello(f->env[0]);
}

/* Many frames through one reader: the buffer is reused and grows only to
 * what is pending. */
static void test_many_frames_streamed(void **state) {
  struct fx *f = *state;
  Lynx__Envelope env;
  Lynx__Hello h;
  size_t len = 0;
  make_hello(&env, &h);
  assert_int_equal(
      lynx_frame_encode(&env, LYNX_FRAME_MAX_DEFAULT, &f->buf[0], &len), 0);
  for (int i = 0; i < 1000; i++) {
    Lynx__Envelope *e = NULL;
    /* split each frame at a different point */
    size_t cut = (size_t)i % (len + 1);
    assert_int_equal(lynx_frame_feed(&f->r, f->buf[0], cut), 0);
    if (cut < len)
      assert_int_equal(lynx_frame_next(&f->r, &e), 0);
    assert_int_equal(lynx_frame_feed(&f->r, f->buf[0] + cut, len - cut), 0);
    assert_int_equal(lynx_frame_next(&f->r, &e), 1);
    check_hello(e);
    lynx__envelope__free_unpacked(e, NULL);
  }
  assert_int_equal(f->r.len, 0);
  assert_true(f->r.cap <= 4096);
}

/* The token comparison the Hello check and the API use: right answers for
 * tokens that differ anywhere, or only in length (it looks at every byte
 * of the token whatever differs first: constant time by construction). */
static void test_token_equal(void **state) {
  char a[512], b[512];
  (void)state;
  assert_true(lynx_token_equal("", ""));
  assert_true(lynx_token_equal("s3cret", "s3cret"));
  assert_false(lynx_token_equal("s3cret", "s3cres"));
  assert_false(lynx_token_equal("s3cret", "x3cret"));
  assert_false(lynx_token_equal("s3cret", "s3cre"));
  assert_false(lynx_token_equal("s3cre", "s3cret"));
  assert_false(lynx_token_equal("", "s"));
  memset(a, 'k', sizeof(a) - 1);
  a[sizeof(a) - 1] = 0;
  memcpy(b, a, sizeof(b));
  assert_true(lynx_token_equal(a, b));
  for (size_t i = 0; i < sizeof(a) - 1; i += 37) {
    b[i] ^= 1;
    assert_false(lynx_token_equal(a, b));
    b[i] ^= 1;
  }
}

static void test_hello_check(void **state) {
  Lynx__Hello h;
  char err[256];
  char want[16];
  (void)state;
  lynx__hello__init(&h);
  h.proto_version = LYNX_PROTO_VERSION;
  h.token = "tok";

  err[0] = 0;
  assert_int_equal(lynx_hello_check(&h, "tok", err, sizeof(err)), 0);

  /* wrong version: refused, the reason names both versions */
  h.proto_version = 42;
  assert_int_equal(lynx_hello_check(&h, "tok", err, sizeof(err)), -EPROTO);
  assert_non_null(strstr(err, "42"));
  snprintf(want, sizeof(want), "%u", LYNX_PROTO_VERSION);
  assert_non_null(strstr(err, want));
  h.proto_version = 0;
  assert_int_equal(lynx_hello_check(&h, "tok", err, sizeof(err)), -EPROTO);
  /* version is checked before the token */
  h.proto_version = 42;
  assert_int_equal(lynx_hello_check(&h, "other", err, sizeof(err)), -EPROTO);
  h.proto_version = LYNX_PROTO_VERSION;

  /* wrong token */
  err[0] = 0;
  assert_int_equal(lynx_hello_check(&h, "TOK", err, sizeof(err)), -EACCES);
  assert_true(strlen(err) > 0);
  assert_int_equal(lynx_hello_check(&h, "tok2", err, sizeof(err)), -EACCES);
  assert_int_equal(lynx_hello_check(&h, "to", err, sizeof(err)), -EACCES);
  /* missing token while one is configured (empty string and NULL) */
  h.token = "";
  assert_int_equal(lynx_hello_check(&h, "tok", err, sizeof(err)), -EACCES);
  h.token = NULL;
  assert_int_equal(lynx_hello_check(&h, "tok", err, sizeof(err)), -EACCES);
  /* a token while none is configured */
  h.token = "tok";
  assert_int_equal(lynx_hello_check(&h, NULL, err, sizeof(err)), -EACCES);
  assert_int_equal(lynx_hello_check(&h, "", err, sizeof(err)), -EACCES);
  /* none on either side */
  h.token = "";
  assert_int_equal(lynx_hello_check(&h, NULL, err, sizeof(err)), 0);
  assert_int_equal(lynx_hello_check(&h, "", err, sizeof(err)), 0);
  h.token = NULL;
  assert_int_equal(lynx_hello_check(&h, NULL, err, sizeof(err)), 0);

  /* a small error buffer is not overrun */
  {
    char small[8];
    memset(small, 'X', sizeof(small));
    h.proto_version = 123456;
    assert_int_equal(lynx_hello_check(&h, NULL, small, 6), -EPROTO);
    assert_int_equal(small[5], 0);
    assert_int_equal(small[6], 'X');
  }
}

/* A Hello that went through the wire is checked the same way. */
static void test_hello_check_decoded(void **state) {
  struct fx *f = *state;
  Lynx__Envelope env;
  Lynx__Hello h;
  size_t len = 0;
  char err[128];
  make_hello(&env, &h);
  h.token = ""; /* proto3: arrives as an empty string */
  assert_int_equal(
      lynx_frame_encode(&env, LYNX_FRAME_MAX_DEFAULT, &f->buf[0], &len), 0);
  assert_int_equal(lynx_frame_feed(&f->r, f->buf[0], len), 0);
  assert_int_equal(lynx_frame_next(&f->r, &f->env[0]), 1);
  assert_int_equal(lynx_hello_check(f->env[0]->hello, NULL, err, sizeof(err)),
                   0);
  assert_int_equal(lynx_hello_check(f->env[0]->hello, "tok", err, sizeof(err)),
                   -EACCES);
}

int main(int argc, char **argv) {
#define T(fn) cmocka_unit_test_setup_teardown(fn, fx_setup, fx_teardown)
  const struct CMUnitTest tests[] = {
      T(test_roundtrip_hello),
      T(test_roundtrip_descriptors),
      T(test_encode_over_max),
      T(test_truncated_bytewise),
      T(test_oversized_length_early),
      T(test_garbage_body),
      T(test_empty_envelope),
      T(test_two_frames_one_feed),
      T(test_feed_empty),
      T(test_many_frames_streamed),
      cmocka_unit_test(test_token_equal),
      cmocka_unit_test(test_hello_check),
      T(test_hello_check_decoded),
  };
#undef T
  return LYNX_UT_MAIN(argc, argv, "frame", tests, NULL, NULL);
}
