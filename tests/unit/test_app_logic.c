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

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hang_valid),
      cmocka_unit_test(test_hang_not_a_hang),
      cmocka_unit_test(test_sockperf_wants_reply),
      cmocka_unit_test(test_sockperf_make_reply),
  };
  return LYNX_UT_MAIN(argc, argv, "app_logic", tests, NULL, NULL);
}
