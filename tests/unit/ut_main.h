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
#include <string.h>

static int lynx_ut_skipped;

#undef skip
#define skip()                                                                 \
  do {                                                                         \
    lynx_ut_skipped = 1;                                                       \
    _skip(__FILE__, __LINE__);                                                 \
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
  if (argc == 2 && rc == 0 && lynx_ut_skipped)
    return 77;
  return rc;
}

#define LYNX_UT_MAIN(argc, argv, group, tests, setup, teardown)                \
  lynx_ut_run(argc, argv, group, tests, sizeof(tests) / sizeof((tests)[0]),    \
              setup, teardown)

#endif
