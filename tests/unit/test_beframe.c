/*
 * test_beframe.c - where a back end's reply ends (frontend/beframe.c): the
 * memcached text protocol and len32, complete, partial and malformed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "beframe.h"
#include "ut_main.h"

static long mc(const char *s, size_t n) {
  return fe_be_reply_len(FE_BE_MEMCACHED, (const uint8_t *)s, n);
}
#define MC(lit) mc(lit, sizeof(lit) - 1)

static void test_memcached_one_line(void **state) {
  (void)state;
  assert_int_equal(MC("END\r\n"), 5);           /* a miss */
  assert_int_equal(MC("STORED\r\nEND\r\n"), 8); /* the first reply only */
  assert_int_equal(MC("ERROR\r\n"), 7);
  assert_int_equal(MC("SERVER_ERROR out of memory\r\n"), 28);
  assert_int_equal(MC("EN"), 0); /* more bytes needed */
  assert_int_equal(MC("END\r"), 0);
  assert_int_equal(MC("END\n"), -1); /* no CR */
  assert_int_equal(MC("\r\n"), -1);  /* an empty line */
}

static void test_memcached_values(void **state) {
  static const char hit[] = "VALUE k 0 5\r\nhello\r\nEND\r\n";
  static const char crlf[] = "VALUE k 7 4\r\n\r\n\r\n\r\nEND\r\n";
  static const char two[] = "VALUE a 0 1\r\nx\r\nVALUE b 0 2\r\nyz\r\nEND\r\n";
  (void)state;
  assert_int_equal(MC(hit), (long)sizeof(hit) - 1);
  /* a value holding CR LF is skipped by its length, not by lines */
  assert_int_equal(MC(crlf), (long)sizeof(crlf) - 1);
  assert_int_equal(MC(two), (long)sizeof(two) - 1);
  /* every proper prefix needs more bytes */
  for (size_t n = 0; n < sizeof(hit) - 1; n++)
    assert_int_equal(mc(hit, n), 0);
  for (size_t n = 0; n < sizeof(two) - 1; n++)
    assert_int_equal(mc(two, n), 0);
  /* what follows the reply is not part of it */
  assert_int_equal(MC("VALUE k 0 1\r\nx\r\nEND\r\nEND\r\n"), 21);
}

static void test_memcached_malformed(void **state) {
  char big[700];
  (void)state;
  assert_int_equal(MC("VALUE k 0 5\r\nhelloXXEND\r\n"), -1);  /* no CR LF */
  assert_int_equal(MC("VALUE k 0 1\r\nx\r\nSTORED\r\n"), -1); /* not END */
  assert_int_equal(MC("VALUE k zero 1\r\nx\r\nEND\r\n"), -1);
  assert_int_equal(MC("VALUE k 0 99999999\r\n"), -1); /* > 1 MiB */
  /* a line that never ends is not waited for forever */
  memset(big, 'A', sizeof(big));
  assert_int_equal(mc(big, sizeof(big)), -1);
  assert_int_equal(mc(big, 100), 0);
}

/* A back end (or anything at its address) sending a reply line longer
 * than any real one: refused, never copied. A 600-byte VALUE line whose
 * numbers parse once overflowed a 512-byte stack buffer and crashed the
 * frontend on connect. */
static void test_memcached_long_lines(void **state) {
  char r[1024];
  size_t n = 0;
  (void)state;
  n += (size_t)sprintf(r, "VALUE k 0 1 ");
  memset(r + n, ' ', 600);
  n += 600;
  n += (size_t)sprintf(r + n, "\r\nx\r\nEND\r\n");
  assert_int_equal(mc(r, n), -1);
  /* the longest line accepted: BE_LINE_MAX bytes with its CR LF */
  n = (size_t)sprintf(r, "VALUE k 0 1 ");
  memset(r + n, ' ', BE_LINE_MAX - 2 - n);
  n = BE_LINE_MAX - 2;
  n += (size_t)sprintf(r + n, "\r\nx\r\nEND\r\n");
  assert_int_equal(mc(r, n), (long)n);
  /* one byte more: refused, whether VALUE or a one-line reply */
  n = (size_t)sprintf(r, "VALUE k 0 1 ");
  memset(r + n, ' ', BE_LINE_MAX - 1 - n);
  n = BE_LINE_MAX - 1;
  n += (size_t)sprintf(r + n, "\r\nx\r\nEND\r\n");
  assert_int_equal(mc(r, n), -1);
  n = (size_t)sprintf(r, "SERVER_ERROR ");
  memset(r + n, 'e', 600);
  n += 600;
  n += (size_t)sprintf(r + n, "\r\n");
  assert_int_equal(mc(r, n), -1);
}

static void test_len32(void **state) {
  uint8_t b[16] = {0, 0, 0, 3, 'a', 'b', 'c', 0, 0, 0, 0};
  (void)state;
  assert_int_equal(fe_be_reply_len(FE_BE_LEN32, b, 7), 7);
  assert_int_equal(fe_be_reply_len(FE_BE_LEN32, b, 11), 7);
  for (size_t n = 0; n < 7; n++)
    assert_int_equal(fe_be_reply_len(FE_BE_LEN32, b, n), 0);
  assert_int_equal(fe_be_reply_len(FE_BE_LEN32, b + 7, 4), 4); /* empty */
  b[0] = 0x01; /* 16 MiB + 3: over the limit */
  assert_int_equal(fe_be_reply_len(FE_BE_LEN32, b, 7), -1);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_memcached_one_line),
      cmocka_unit_test(test_memcached_values),
      cmocka_unit_test(test_memcached_malformed),
      cmocka_unit_test(test_memcached_long_lines),
      cmocka_unit_test(test_len32),
  };
  return LYNX_UT_MAIN(argc, argv, "tests", tests, NULL, NULL);
}
