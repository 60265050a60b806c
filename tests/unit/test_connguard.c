/*
 * test_connguard.c - the caps and the authentication back-off of a port
 * strangers can reach (common/connguard.c).
 */
#include <arpa/inet.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "connguard.h"
#include "ut_main.h"

#define S 1000000000ull

static struct sockaddr_storage v4(const char *a) {
  struct sockaddr_storage ss;
  memset(&ss, 0, sizeof(ss));
  ss.ss_family = AF_INET;
  inet_pton(AF_INET, a, &((struct sockaddr_in *)&ss)->sin_addr);
  return ss;
}

/* Over each cap a connection is refused and counted by reason; what
 * authenticates stops counting against the unauthenticated caps; closes
 * give the room back. */
static void test_caps(void **state) {
  static struct lynx_guard g;
  struct lynx_guard_src *s[8], *x;
  struct sockaddr_storage a = v4("10.0.0.1"), b = v4("10.0.0.2"),
                          c = v4("10.0.0.3");
  (void)state;
  lynx_guard_init(&g, 6, 4, 2);
  assert_int_equal(lynx_guard_admit(&g, &a, 1, &s[0]), LYNX_GUARD_ADMIT);
  assert_int_equal(lynx_guard_admit(&g, &a, 2, &s[1]), LYNX_GUARD_ADMIT);
  assert_ptr_equal(s[0], s[1]); /* one record per address */
  assert_int_equal(lynx_guard_admit(&g, &a, 3, &x), LYNX_GUARD_PER_SOURCE);
  assert_null(x);
  assert_int_equal(lynx_guard_admit(&g, &b, 4, &s[2]), LYNX_GUARD_ADMIT);
  assert_int_equal(lynx_guard_admit(&g, &b, 5, &s[3]), LYNX_GUARD_ADMIT);
  assert_int_equal(lynx_guard_admit(&g, &c, 6, &x), LYNX_GUARD_UNAUTH_MAX);
  assert_int_equal(g.unauth, 4);
  /* two of them authenticate: room for strangers again, per address too */
  lynx_guard_auth_ok(&g, s[0]);
  lynx_guard_auth_ok(&g, s[2]);
  assert_int_equal(g.unauth, 2);
  assert_int_equal(lynx_guard_admit(&g, &a, 7, &s[4]), LYNX_GUARD_ADMIT);
  assert_int_equal(lynx_guard_admit(&g, &c, 8, &s[5]), LYNX_GUARD_ADMIT);
  /* six open: the total cap */
  assert_int_equal(g.open, 6);
  assert_int_equal(lynx_guard_admit(&g, &c, 9, &x), LYNX_GUARD_CONN_MAX);
  lynx_guard_closed(&g, s[0], 1);
  lynx_guard_closed(&g, s[1], 0);
  assert_int_equal(g.open, 4);
  assert_int_equal(g.unauth, 3);
  assert_int_equal(lynx_guard_admit(&g, &c, 10, &s[6]), LYNX_GUARD_ADMIT);
  assert_int_equal(g.accepted, 7);
  assert_int_equal(g.refused[LYNX_GUARD_PER_SOURCE], 1);
  assert_int_equal(g.refused[LYNX_GUARD_UNAUTH_MAX], 1);
  assert_int_equal(g.refused[LYNX_GUARD_CONN_MAX], 1);
}

/* A source that keeps presenting wrong credentials gets its answers
 * later and later (after a free allowance); the right credential is
 * served at once and clears the record; a quiet minute forgives. */
static void test_backoff(void **state) {
  static struct lynx_guard g;
  struct lynx_guard_src *src;
  struct sockaddr_storage a = v4("192.0.2.7");
  uint64_t t = 100 * S, want = LYNX_GUARD_BACKOFF_MIN_NS;
  (void)state;
  lynx_guard_init(&g, 0, 0, 0);
  for (int i = 0; i < LYNX_GUARD_FAILS_FREE; i++) {
    assert_int_equal(lynx_guard_admit(&g, &a, t, &src), LYNX_GUARD_ADMIT);
    assert_int_equal(lynx_guard_auth_failed(&g, src, t), 0);
    lynx_guard_closed(&g, src, 0);
    t += S / 10;
  }
  for (int i = 0; i < 10; i++) { /* doubling, up to the cap */
    assert_int_equal(lynx_guard_admit(&g, &a, t, &src), LYNX_GUARD_ADMIT);
    assert_int_equal(lynx_guard_auth_failed(&g, src, t), want);
    lynx_guard_closed(&g, src, 0);
    t += want;
    want = want * 2 > LYNX_GUARD_BACKOFF_MAX_NS ? LYNX_GUARD_BACKOFF_MAX_NS
                                                : want * 2;
  }
  assert_int_equal(g.auth_failed, LYNX_GUARD_FAILS_FREE + 10);
  assert_int_equal(g.delayed, 10);
  /* the right key from the same address: admitted, and forgiven */
  assert_int_equal(lynx_guard_admit(&g, &a, t, &src), LYNX_GUARD_ADMIT);
  lynx_guard_auth_ok(&g, src);
  assert_int_equal(src->failures, 0);
  lynx_guard_closed(&g, src, 1);
  assert_int_equal(lynx_guard_admit(&g, &a, t, &src), LYNX_GUARD_ADMIT);
  assert_int_equal(lynx_guard_auth_failed(&g, src, t), 0);
  lynx_guard_closed(&g, src, 0);
  /* failures spread wider than the window never back off */
  for (int i = 0; i < 3 * LYNX_GUARD_FAILS_FREE; i++) {
    t += LYNX_GUARD_WINDOW_NS + S;
    assert_int_equal(lynx_guard_admit(&g, &a, t, &src), LYNX_GUARD_ADMIT);
    assert_int_equal(lynx_guard_auth_failed(&g, src, t), 0);
    lynx_guard_closed(&g, src, 0);
  }
  assert_int_equal(g.open, 0);
  assert_int_equal(g.unauth, 0);
}

/* The table of sources is bounded: a flood of addresses reuses the
 * records of sources with nothing pending, never those with connections
 * waiting to authenticate (whose counts the caps rely on). */
static void test_source_table_bounded(void **state) {
  static struct lynx_guard g;
  struct lynx_guard_src *held, *src;
  struct sockaddr_storage a = v4("198.51.100.1");
  char ip[32];
  (void)state;
  lynx_guard_init(&g, 0, 0, 1);
  assert_int_equal(lynx_guard_admit(&g, &a, 1, &held), LYNX_GUARD_ADMIT);
  for (int i = 0; i < 4 * LYNX_GUARD_SOURCES; i++) {
    struct sockaddr_storage b;
    snprintf(ip, sizeof(ip), "10.%d.%d.%d", (i >> 16) & 255, (i >> 8) & 255,
             i & 255);
    b = v4(ip);
    assert_int_equal(lynx_guard_admit(&g, &b, 2 + (uint64_t)i, &src),
                     LYNX_GUARD_ADMIT);
    assert_non_null(src);
    lynx_guard_closed(&g, src, 0);
  }
  /* the held source's record survived: its cap still holds */
  assert_int_equal(lynx_guard_admit(&g, &a, 1u << 20, &src),
                   LYNX_GUARD_PER_SOURCE);
  lynx_guard_closed(&g, held, 0);
  assert_int_equal(lynx_guard_admit(&g, &a, 1u << 21, &src), LYNX_GUARD_ADMIT);
}

/* The Prometheus text names every series with the prefix. */
static void test_metrics_text(void **state) {
  static struct lynx_guard g;
  struct lynx_guard_src *src;
  struct sockaddr_storage a = v4("10.1.1.1");
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  (void)state;
  lynx_guard_init(&g, 1, 1, 1);
  assert_int_equal(lynx_guard_admit(&g, &a, 1, &src), LYNX_GUARD_ADMIT);
  assert_int_equal(lynx_guard_admit(&g, &a, 2, &src), LYNX_GUARD_CONN_MAX);
  lynx_guard_metrics(f, "lynx_x", "test port", &g);
  fclose(f);
  assert_non_null(
      strstr(buf, "lynx_x_connections{state=\"unauthenticated\"} 1\n"));
  assert_non_null(
      strstr(buf, "lynx_x_connections{state=\"authenticated\"} 0\n"));
  assert_non_null(
      strstr(buf, "lynx_x_connections_refused_total{reason=\"conn_max\"} 1\n"));
  assert_non_null(strstr(buf, "lynx_x_connections_accepted_total 1\n"));
  assert_non_null(strstr(buf, "lynx_x_auth_failures_total 0\n"));
  free(buf);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_caps),
      cmocka_unit_test(test_backoff),
      cmocka_unit_test(test_source_table_bounded),
      cmocka_unit_test(test_metrics_text),
  };
  return LYNX_UT_MAIN(argc, argv, "tests", tests, NULL, NULL);
}
