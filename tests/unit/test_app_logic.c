/*
 * test_app_logic.c - unit tests of accel/app_logic.h: the per-request
 * decisions that the CPU handlers and the CUDA kernels (accel/cuda/apps.cu)
 * both run. Every input is copied into a heap buffer of exactly its length,
 * so a read past len is caught by the sanitizer build.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "app_logic.h"
#include "ut_main.h"
#include "ut_ring.h"

/* A copy of len bytes of s in a buffer of exactly len bytes. */
static uint8_t *exact(const void *s, uint32_t len) {
  uint8_t *b = malloc(len ? len : 1);
  assert_non_null(b);
  memcpy(b, s, len);
  return b;
}

static uint32_t hang(const char *s) {
  uint32_t len = (uint32_t)strlen(s);
  uint8_t *b = exact(s, len);
  uint32_t ms = lynx_fault_hang_ms(b, len);
  free(b);
  return ms;
}

static uint32_t hang_n(const char *s, uint32_t len) {
  uint8_t *b = exact(s, len);
  uint32_t ms = lynx_fault_hang_ms(b, len);
  free(b);
  return ms;
}

static void test_hang_valid(void **state) {
  (void)state;
  assert_int_equal(hang("LYNX-HANG 1"), 1);
  assert_int_equal(hang("LYNX-HANG 250"), 250);
  assert_int_equal(hang("LYNX-HANG 600000"), 600000);
  assert_int_equal(hang("LYNX-HANG 600000"), LYNX_FAULT_HANG_MAX_MS);
  /* leading zeros: any number of digits, the value decides */
  assert_int_equal(hang("LYNX-HANG 0000000000000000000000007"), 7);
  /* newline-terminated (a line-oriented client); what follows the line
   * end is not looked at */
  assert_int_equal(hang("LYNX-HANG 12\n"), 12);
  assert_int_equal(hang("LYNX-HANG 12\r\n"), 12);
  assert_int_equal(hang("LYNX-HANG 12\r"), 12);
  assert_int_equal(hang("LYNX-HANG 12\nLYNX-HANG 99 trailing"), 12);
  /* len, not a terminator, ends the request */
  assert_int_equal(hang_n("LYNX-HANG 1234", 13), 123);
}

static void test_hang_not_a_hang(void **state) {
  (void)state;
  assert_int_equal(lynx_fault_hang_ms(NULL, 0), 0);
  assert_int_equal(hang(""), 0);
  assert_int_equal(hang("hello"), 0);
  /* a prefix of the prefix, and the prefix without its space */
  assert_int_equal(hang("LYNX-"), 0);
  assert_int_equal(hang("LYNX-HANG"), 0);
  assert_int_equal(hang("LYNX-HANG5"), 0);
  assert_int_equal(hang_n("LYNX-HANG 5", 9), 0);
  /* exactly the prefix: no digits */
  assert_int_equal(hang("LYNX-HANG "), 0);
  /* empty digits before a line end */
  assert_int_equal(hang("LYNX-HANG \n"), 0);
  assert_int_equal(hang("LYNX-HANG \r\n"), 0);
  /* zero is no hang */
  assert_int_equal(hang("LYNX-HANG 0"), 0);
  assert_int_equal(hang("LYNX-HANG 000\n"), 0);
  /* over the bound, including values that would wrap a u32 */
  assert_int_equal(hang("LYNX-HANG 600001"), 0);
  assert_int_equal(hang("LYNX-HANG 1000000"), 0);
  assert_int_equal(hang("LYNX-HANG 4294967296"), 0);
  assert_int_equal(hang("LYNX-HANG 99999999999999999999"), 0);
  assert_int_equal(hang("LYNX-HANG 600001\n"), 0);
  /* trailing garbage */
  assert_int_equal(hang("LYNX-HANG 12x"), 0);
  assert_int_equal(hang("LYNX-HANG 12 "), 0);
  assert_int_equal(hang("LYNX-HANG 12 \n"), 0);
  assert_int_equal(hang("LYNX-HANG 1.5"), 0);
  assert_int_equal(hang_n("LYNX-HANG 12\0", 13), 0);
  /* signs, other spacing, case */
  assert_int_equal(hang("LYNX-HANG -5"), 0);
  assert_int_equal(hang("LYNX-HANG +5"), 0);
  assert_int_equal(hang("LYNX-HANG  5"), 0);
  assert_int_equal(hang(" LYNX-HANG 5"), 0);
  assert_int_equal(hang("lynx-hang 5"), 0);
}

/* A sockperf header (u64 seq, u16 flags, u32 len, network order) followed by
 * pad bytes, len bytes in all, in an exact buffer. */
static uint8_t *sp_msg(uint16_t flags, uint32_t len) {
  uint8_t full[64];
  for (uint32_t i = 0; i < sizeof(full); i++)
    full[i] = (uint8_t)(0xC0 + i);
  full[8] = (uint8_t)(flags >> 8);
  full[9] = (uint8_t)flags;
  assert_true(len <= sizeof(full));
  return exact(full, len);
}

static int wants(uint16_t flags, uint32_t len) {
  uint8_t *b = sp_msg(flags, len);
  int w = lynx_sockperf_wants_reply(b, len);
  free(b);
  return w;
}

static void test_sockperf_wants_reply(void **state) {
  (void)state;
  assert_int_equal(lynx_sockperf_wants_reply(NULL, 0), 0);
  /* pong request set: answered, whatever else is set */
  assert_int_equal(wants(0x0002, 14), 1);
  assert_int_equal(wants(0x0003, 14), 1);
  assert_int_equal(wants(0xFFFF, 64), 1);
  assert_int_equal(wants(0x0102, 20), 1);
  /* no pong request */
  assert_int_equal(wants(0x0000, 14), 0);
  assert_int_equal(wants(0x0001, 14), 0);
  assert_int_equal(wants(0xFFFD, 64), 0);
  /* network order: 0x0200 is not 0x0002 */
  assert_int_equal(wants(0x0200, 14), 0);
  /* shorter than a header: never, even with the flag's bytes present */
  assert_int_equal(wants(0x0003, 13), 0);
  assert_int_equal(wants(0x0003, 10), 0);
  assert_int_equal(wants(0x0003, 1), 0);
}

static void expect_reply(uint16_t flags, uint16_t want_flags, uint32_t len) {
  uint8_t *b = sp_msg(flags, len), *w = sp_msg(want_flags, len);
  lynx_sockperf_make_reply(b);
  /* only the client flag changes: seq, length field and pad stay */
  assert_memory_equal(b, w, len);
  free(b);
  free(w);
}

static void test_sockperf_make_reply(void **state) {
  (void)state;
  expect_reply(0x0003, 0x0002, 14);
  expect_reply(0x0003, 0x0002, 64);
  expect_reply(0xFFFF, 0xFFFE, 14);
  expect_reply(0x0102, 0x0102, 20); /* no client flag: unchanged */
  expect_reply(0x0103, 0x0102, 14); /* the high byte is kept */
  expect_reply(0x0002, 0x0002, 14);
}

/* ---- client mqueue calls --------------------------------------------- */

/* The frontend's side of a client mqueue by hand: replies written into the
 * RX ring (ut_put_raw), the accelerator taking them with lynx_call_poll. */
static void test_call_poll(void **state) {
  struct ut_region r;
  struct lynx_mq mq;
  struct lynx_msg m;
  uint32_t pos = 0;
  (void)state;
  assert_int_equal(ut_region_init(&r, 1, 4, 256), 0);
  lynx_mq_bind(&mq, r.mem, &r.g, 0);
  /* nothing yet */
  assert_int_equal(lynx_call_poll(&mq, 7, 100, &m), -11);
  /* a late reply to call 6 (timed out) is released and skipped; call 7's
   * own comes after it */
  ut_put(&r, 0, pos++, 6, "late", 4);
  assert_int_equal(lynx_call_poll(&mq, 7, 100, &m), -11);
  assert_int_equal(ut_actrl(&r, 0)->rx_cons, 1);
  ut_put(&r, 0, pos++, 7, "VALUE", 5);
  assert_int_equal(lynx_call_poll(&mq, 7, 100, &m), 0);
  assert_int_equal(m.tag, 7);
  assert_int_equal(m.len, 5);
  assert_memory_equal(m.data, "VALUE", 5);
  assert_int_equal(ut_actrl(&r, 0)->rx_cons, 1); /* the caller's to release */
  lynx_mq_release(&mq);
  assert_int_equal(ut_actrl(&r, 0)->rx_cons, 2);
  /* back end down: no bytes, released at once */
  ut_put_raw(&r, 0, pos, 8, NULL, 0, 0, LYNX_ST_BACKEND_DOWN,
             lynx_seq_for(pos));
  pos++;
  assert_int_equal(lynx_call_poll(&mq, 8, 100, &m), LYNX_CALL_EHOSTDOWN);
  assert_int_equal(ut_actrl(&r, 0)->rx_cons, 3);
  /* too long for a slot, and too long for the caller */
  ut_put_raw(&r, 0, pos, 9, NULL, 0, 0, LYNX_ST_TOO_LONG, lynx_seq_for(pos));
  pos++;
  assert_int_equal(lynx_call_poll(&mq, 9, 100, &m), LYNX_CALL_EMSGSIZE);
  ut_put(&r, 0, pos++, 10, "0123456789", 10);
  assert_int_equal(lynx_call_poll(&mq, 10, 9, &m), LYNX_CALL_EMSGSIZE);
  assert_int_equal(ut_actrl(&r, 0)->rx_cons, 5);
  /* a stale BACKEND_DOWN for an old call is skipped like any late reply */
  ut_put_raw(&r, 0, pos, 3, NULL, 0, 0, LYNX_ST_BACKEND_DOWN,
             lynx_seq_for(pos));
  pos++;
  ut_put(&r, 0, pos++, 11, "x", 1);
  assert_int_equal(lynx_call_poll(&mq, 11, 1, &m), 0);
  assert_memory_equal(m.data, "x", 1);
  lynx_mq_release(&mq);
  assert_int_equal(ut_actrl(&r, 0)->rx_cons, 7);
  assert_int_equal(lynx_call_reply_rc(LYNX_ST_OK, 5, 5), 0);
  assert_int_equal(lynx_call_reply_rc(LYNX_ST_OK, 6, 5), LYNX_CALL_EMSGSIZE);
  ut_region_free(&r);
}

/* ---- mc-get ------------------------------------------------------------ */

static int key_ok(const char *s, uint32_t len) {
  uint8_t *b = exact(s, len);
  int ok = lynx_mc_key_ok(b, len);
  free(b);
  return ok;
}

static void test_mc_key(void **state) {
  char big[LYNX_MC_KEY_MAX + 1];
  (void)state;
  memset(big, 'k', sizeof(big));
  assert_true(key_ok("k1", 2));
  assert_true(key_ok("face:0123456789ab", 17));
  assert_true(key_ok(big, LYNX_MC_KEY_MAX));
  assert_false(key_ok(big, LYNX_MC_KEY_MAX + 1));
  assert_false(key_ok("", 0));
  assert_false(key_ok("bad key", 7));
  assert_false(key_ok("tab\tkey", 7));
  assert_false(key_ok("nl\n", 3));
  assert_false(key_ok("del\x7f", 4));
  assert_false(key_ok("nul\0x", 5));
  assert_true(key_ok("\x80\xff", 2)); /* memcached takes any other byte */
}

static void test_mc_get_cmd(void **state) {
  uint8_t out[LYNX_MC_GET_CMD_MAX];
  (void)state;
  assert_int_equal(lynx_mc_get_cmd(out, (const uint8_t *)"k1", 2), 8);
  assert_memory_equal(out, "get k1\r\n", 8);
  /* the key already in place (a GPU block copies it there) */
  memset(out, 0, sizeof(out));
  memcpy(out + 4, "abc", 3);
  assert_int_equal(lynx_mc_get_cmd(out, out + 4, 3), 9);
  assert_memory_equal(out, "get abc\r\n", 9);
}

/* lynx_mc_parse_get on an exact copy, and the same through head + end as a
 * GPU reads them (head: at most LYNX_MC_LINE_MAX bytes, another buffer). */
static int parse(const char *s, uint32_t n, uint32_t *voff, uint32_t *vlen) {
  uint8_t *b = exact(s, n), *head;
  uint32_t avail = n < LYNX_MC_LINE_MAX ? n : LYNX_MC_LINE_MAX, o2 = 0, l2 = 0;
  int rc = lynx_mc_parse_get(b, n, voff, vlen), rc2;
  head = exact(s, avail);
  rc2 = lynx_mc_get_head(head, avail, n, &o2, &l2);
  if (rc2 == 0 && !lynx_mc_get_end(b + o2 + l2))
    rc2 = -74;
  assert_int_equal(rc2, rc);
  if (rc == 0) {
    assert_int_equal(o2, *voff);
    assert_int_equal(l2, *vlen);
  }
  free(head);
  free(b);
  return rc;
}

#define PARSE(s, o, l) parse((s), (uint32_t)(sizeof(s) - 1), (o), (l))

static void test_mc_parse_get(void **state) {
  uint32_t o = 0, l = 0;
  char big[400], keys[320];
  int n;
  (void)state;
  assert_int_equal(PARSE("VALUE k1 0 5\r\nhello\r\nEND\r\n", &o, &l), 0);
  assert_int_equal(o, 14);
  assert_int_equal(l, 5);
  /* with a CAS value (gets), other flags, an empty value */
  assert_int_equal(PARSE("VALUE k 42 3 77\r\nabc\r\nEND\r\n", &o, &l), 0);
  assert_int_equal(o, 17);
  assert_int_equal(l, 3);
  assert_int_equal(PARSE("VALUE k 0 0\r\n\r\nEND\r\n", &o, &l), 0);
  assert_int_equal(l, 0);
  /* a value holding what looks like the end */
  assert_int_equal(PARSE("VALUE k 0 7\r\n\r\nEND\r\n\r\nEND\r\n", &o, &l), 0);
  assert_int_equal(l, 7);
  /* miss */
  assert_int_equal(PARSE("END\r\n", &o, &l), -2);
  /* errors and malformed replies */
  assert_int_equal(PARSE("ERROR\r\n", &o, &l), -74);
  assert_int_equal(PARSE("SERVER_ERROR out of memory\r\n", &o, &l), -74);
  assert_int_equal(PARSE("END\r\nX", &o, &l), -74);
  assert_int_equal(PARSE("VALUE k 0 5\r\nhello\r\nEND\r", &o, &l), -74);
  assert_int_equal(PARSE("VALUE k 0 5\r\nhello\r\nEND\r\n\r\n", &o, &l), -74);
  assert_int_equal(PARSE("VALUE k 0 6\r\nhello\r\nEND\r\n", &o, &l), -74);
  assert_int_equal(PARSE("VALUE k 0 5\r\nhelloXXEND\r\n", &o, &l), -74);
  assert_int_equal(PARSE("VALUE k 0 5\nhello\r\nEND\r\n", &o, &l), -74);
  assert_int_equal(PARSE("VALUE k 0\r\nhello\r\nEND\r\n", &o, &l), -74);
  assert_int_equal(PARSE("VALUE  0 5\r\nhello\r\nEND\r\n", &o, &l), -74);
  assert_int_equal(PARSE("VALUE k x 5\r\nhello\r\nEND\r\n", &o, &l), -74);
  assert_int_equal(PARSE("VALUE k 0 5x\r\nhello\r\nEND\r\n", &o, &l), -74);
  assert_int_equal(PARSE("VALUE k 0 -5\r\nhello\r\nEND\r\n", &o, &l), -74);
  assert_int_equal(PARSE("VALUE k 0 4294967296\r\nhello\r\nEND\r\n", &o, &l),
                   -74);
  assert_int_equal(PARSE("VALUX k 0 5\r\nhello\r\nEND\r\n", &o, &l), -74);
  assert_int_equal(PARSE("VALUE", &o, &l), -74);
  assert_int_equal(parse("", 0, &o, &l), -74);
  /* a 250-byte key: the line fits the look-ahead */
  memset(keys, 'k', sizeof(keys));
  n = snprintf(big, sizeof(big), "VALUE %.*s 0 2\r\nhi\r\nEND\r\n", 250, keys);
  assert_int_equal(parse(big, (uint32_t)n, &o, &l), 0);
  assert_int_equal(o, (uint32_t)n - 9);
  assert_int_equal(l, 2);
  /* a line longer than the look-ahead is refused, as it always was */
  n = snprintf(big, sizeof(big), "VALUE %.*s 0 2\r\nhi\r\nEND\r\n", 320, keys);
  assert_int_equal(parse(big, (uint32_t)n, &o, &l), -74);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hang_valid),
      cmocka_unit_test(test_hang_not_a_hang),
      cmocka_unit_test(test_sockperf_wants_reply),
      cmocka_unit_test(test_sockperf_make_reply),
      cmocka_unit_test(test_call_poll),
      cmocka_unit_test(test_mc_key),
      cmocka_unit_test(test_mc_get_cmd),
      cmocka_unit_test(test_mc_parse_get),
  };
  return LYNX_UT_MAIN(argc, argv, "app_logic", tests, NULL, NULL);
}
