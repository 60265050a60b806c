/*
 * test_spin.c - the adaptive wait's rule (frontend/spin.h): a worker
 * spins for a wait only where spinning pays in latency and in CPU, for a
 * few expected waits, never past --spin-us.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "spin.h"
#include "ut_main.h"

#define US 1000u
#define CAP (50u * US) /* --spin-us 50, the default */

/* A ping-pong's wait for its next datagram (a few µs) is spun for, 4
 * expected waits, capped; on bare metal (wake-ups of 2 µs CPU) too. */
static void test_short_waits_spin(void **state) {
  (void)state;
  assert_int_equal(fe_spin_budget(5 * US, 0, 10 * US, CAP), 20 * US);
  assert_int_equal(fe_spin_budget(8 * US, 50 * US, 10 * US, CAP), 32 * US);
  assert_int_equal(fe_spin_budget(20 * US, 50 * US, 10 * US, CAP), CAP);
  assert_int_equal(fe_spin_budget(5 * US, 3 * US, 2 * US, CAP), 20 * US);
}

/* 20,000 requests/s leave 50 µs between datagrams. On the 2-core VM,
 * whose timed sleeps end 50 µs late, latency alone said spin (twice the
 * lateness): the worker spun through every gap, most of a core. A
 * wake-up costs 10 µs of CPU there: a 50 µs spin is not worth it, the
 * worker sleeps. Where wake-ups cost more CPU, it spins again. */
static void test_moderate_load_sleeps(void **state) {
  (void)state;
  assert_int_equal(fe_spin_budget(50 * US, 50 * US, 10 * US, CAP), 0);
  assert_int_equal(fe_spin_budget(31 * US, 50 * US, 10 * US, CAP), 0);
  assert_int_equal(fe_spin_budget(30 * US, 50 * US, 10 * US, CAP), CAP);
  assert_int_equal(fe_spin_budget(50 * US, 50 * US, 20 * US, CAP), CAP);
}

/* A wait longer than a sleep and wake-up is slept at once, whatever it
 * would cost in CPU; no spin is longer than --spin-us. */
static void test_long_waits_sleep(void **state) {
  (void)state;
  assert_int_equal(fe_spin_budget(25 * US, 5 * US, 100 * US, CAP), 0);
  assert_int_equal(fe_spin_budget(1000 * US, 0, 100 * US, CAP), 0);
  assert_int_equal(fe_spin_budget(10 * US, 0, 10 * US, 0), 0);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_short_waits_spin),
      cmocka_unit_test(test_moderate_load_sleeps),
      cmocka_unit_test(test_long_waits_sleep),
  };
  return LYNX_UT_MAIN(argc, argv, "spin", tests, NULL, NULL);
}
