/*
 * test_prom.c - the Prometheus text writer (common/prom.c): family
 * headers, samples with and without labels, label-value and HELP escapes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "prom.h"
#include "ut_main.h"

/* Runs fn into a memory stream and compares the text with want. */
#define EXPECT_TEXT(want, ...)                                                 \
  do {                                                                         \
    char *buf_ = NULL;                                                         \
    size_t len_ = 0;                                                           \
    FILE *f = open_memstream(&buf_, &len_);                                    \
    assert_non_null(f);                                                        \
    __VA_ARGS__;                                                               \
    assert_int_equal(fclose(f), 0);                                            \
    assert_string_equal(buf_, want);                                           \
    free(buf_);                                                                \
  } while (0)

static void test_family(void **state) {
  (void)state;
  EXPECT_TEXT(
      "# HELP lynx_x_total Things counted.\n"
      "# TYPE lynx_x_total counter\n",
      lynx_prom_family(f, "lynx_x_total", "counter", "Things counted."));
  /* a quote is literal in HELP; backslash and newline are escaped */
  EXPECT_TEXT("# HELP g A \"q\" a\\\\b\\nc\n# TYPE g gauge\n",
              lynx_prom_family(f, "g", "gauge", "A \"q\" a\\b\nc"));
}

static void test_samples(void **state) {
  (void)state;
  EXPECT_TEXT("lynx_y 42\n", lynx_prom_u64(f, "lynx_y", NULL, 42));
  EXPECT_TEXT("lynx_y 18446744073709551615\n",
              lynx_prom_u64(f, "lynx_y",
                            (const struct lynx_prom_label[]){{NULL, NULL}},
                            UINT64_MAX));
  EXPECT_TEXT("lynx_y{a=\"1\",b=\"two\"} 7\n",
              lynx_prom_u64(f, "lynx_y",
                            (const struct lynx_prom_label[]){
                                {"a", "1"}, {"b", "two"}, {NULL, NULL}},
                            7));
  EXPECT_TEXT("lynx_s_total 1.500\n",
              lynx_prom_double(f, "lynx_s_total", NULL, 1.5, 3));
  EXPECT_TEXT("lynx_s_total{k=\"v\"} 0.000\n",
              lynx_prom_double(
                  f, "lynx_s_total",
                  (const struct lynx_prom_label[]){{"k", "v"}, {NULL, NULL}},
                  0.0, 3));
}

/* Label values escape backslash, double quote and newline, nothing else. */
static void test_label_escapes(void **state) {
  (void)state;
  EXPECT_TEXT("m{node=\"a\\\\b\\\"c\\nd e\"} 1\n",
              lynx_prom_u64(f, "m",
                            (const struct lynx_prom_label[]){
                                {"node", "a\\b\"c\nd e"}, {NULL, NULL}},
                            1));
  EXPECT_TEXT("a\\\\\\\"\\n", lynx_prom_escape(f, "a\\\"\n"));
  EXPECT_TEXT("m{empty=\"\"} 0\n",
              lynx_prom_u64(
                  f, "m",
                  (const struct lynx_prom_label[]){{"empty", ""}, {NULL, NULL}},
                  0));
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_family),
      cmocka_unit_test(test_samples),
      cmocka_unit_test(test_label_escapes),
  };
  return LYNX_UT_MAIN(argc, argv, "prom", tests, NULL, NULL);
}
