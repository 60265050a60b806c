/*
 * ut_main.h - the one main of every cmocka test executable.
 *
 * ctest registers each case of an executable as its own test
 * (tests/CMakeLists.txt reads the case names from the source's tests[]
 * array) and runs it as `bin/<exe> <case>`. With a case name, the
 * executable runs only that case and exits 77 when the case called skip(),
 * so `ctest` shows it as skipped (SKIP_RETURN_CODE 77) instead of passed.
 * Without one, it runs every case as cmocka always did (skips count as
 * passes there).
 *
 * Include it after <cmocka.h>: it wraps skip() to note that the case
 * skipped, which cmocka's own return value does not tell.
 */
#ifndef LYNX_UT_MAIN_H
#define LYNX_UT_MAIN_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The time scale (docs/testing.md): LYNX_TEST_TIME_SCALE, a whole number
 * from 1 to 99 in the environment (ctest passes the build's: 2 under the
 * sanitizers, 5 under emulation, 3 for make test-busy; 1 when unset),
 * multiplies every bound a case asserts on elapsed wall-clock time:
 * ut_scaled(bound). A lower bound (a wait the code must make) is never
 * scaled. A value that is not such a number fails the case that asks. */
static inline unsigned long long ut_scaled(unsigned long long bound) {
  const char *s = getenv("LYNX_TEST_TIME_SCALE");
  char *end;
  unsigned long v;
  if (s == NULL || *s == '\0')
    return bound;
  v = strtoul(s, &end, 10);
  if (*end != '\0' || v < 1 || v > 99) {
    fprintf(stderr,
            "LYNX_TEST_TIME_SCALE=%s: want a whole number from 1 to 99\n", s);
    fail();
  }
  return bound * v;
}

static int lynx_ut_skipped;

#undef skip
#define skip()                                                                 \
  do {                                                                         \
    lynx_ut_skipped = 1;                                                       \
    _skip(__FILE__, __LINE__);                                                 \
  } while (0)

/* ut_skip(fmt, ...): skips the case, naming on stdout ("SKIP: ...") what
 * it needs and this machine lacks; CI's skip check (tests/check-skips.py)
 * shows that line, and holds a skip without one for a failure. */
#define ut_skip(...)                                                           \
  do {                                                                         \
    printf("SKIP: " __VA_ARGS__);                                              \
    printf("\n");                                                              \
    fflush(stdout);                                                            \
    skip();                                                                    \
  } while (0)

/* Runs tests[] (or only the case named argv[1]) as the cmocka group name
 * with the group's setup/teardown (NULL for none). Returns the process's
 * exit status: 0 passed, 77 the named case skipped, 1 an unknown case
 * name, else cmocka's count of failed cases. */
static inline int lynx_ut_run(int argc, char **argv, const char *group,
                              const struct CMUnitTest *tests, size_t n,
                              CMFixtureFunction setup,
                              CMFixtureFunction teardown) {
  int rc;
  if (argc > 2) {
    fprintf(stderr, "usage: %s [CASE]\n", argv[0]);
    return 1;
  }
  if (argc == 2) {
    size_t i;
    for (i = 0; i < n; i++)
      if (strcmp(tests[i].name, argv[1]) == 0)
        break;
    if (i == n) {
      fprintf(stderr, "%s: no case named '%s'\n", argv[0], argv[1]);
      return 1;
    }
    /* the names have no glob characters: the filter matches this one */
    cmocka_set_test_filter(argv[1]);
  }
  rc = _cmocka_run_group_tests(group, tests, n, setup, teardown);
  /* a skip in the case's setup is a failed setup to cmocka (rc 1): still a
   * skip, as skip() leaves the case before it ran any of its checks */
  if (argc == 2 && lynx_ut_skipped)
    return 77;
  return rc;
}

#define LYNX_UT_MAIN(argc, argv, group, tests, setup, teardown)                \
  lynx_ut_run(argc, argv, group, tests, sizeof(tests) / sizeof((tests)[0]),    \
              setup, teardown)

#endif
