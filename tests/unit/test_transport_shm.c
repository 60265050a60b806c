/*
 * test_transport_shm.c - what only the shm backend (transport/transport_shm.c)
 * does: its regions are files in /dev/shm (named, sized, mode 0600,
 * removed by region_free, a name never taken twice), connect maps the file
 * a locator names (refused when the name is malformed, missing, or the
 * file was truncated), and notify wakes a thread sleeping on the doorbell
 * through the frontend's own mapping (futex). What every backend promises
 * is the conformance suite's (transport_conformance.c, run for shm as
 * unit_transport_conformance_shm); transport/transport.c's helpers are
 * test_transport_common.c's.
 *
 * Every shm file is named by ut_shm.h (lynx-ut-<pid>-<n>); the fixture's
 * teardown frees it whichever way a test ends, an atexit handler unlinks
 * anything left, and the parent process sweeps after a crash.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "mqueue.h"
#include "transport.h"
#include "ut_main.h"
#include "ut_region.h"
#include "ut_shm.h"
#include "ut_tconn.h"

/* ---- fixture ----------------------------------------------------------- */

struct fx {
  const struct lynx_transport_ops *ops;
  struct lynx_region r, r2; /* r2: a second region some tests need */
  struct lynx_geom g;
  struct lynx_region_desc d;
  struct lynx_tconn *c;
  struct lynx_transport_agent *ta; /* the agent-side handle */
};

static int fx_setup(void **state) {
  struct fx *f = calloc(1, sizeof(*f));
  char name[64];
  if (!f)
    return -1;
  *state = f;
  ut_region_empty(&f->r);
  ut_region_empty(&f->r2);
  if (ut_agent_create("shm", &(struct lynx_transport_opts){0}, &f->ops,
                      &f->ta) ||
      lynx_geom_init(&f->g, UT_Q, UT_S, UT_Z, 0))
    return -1;
  /* nonzero fails the setup, as -1 does */
  return ut_region_serve(f->ops, f->ta, &f->r,
                         ut_shm_new_name(name, sizeof(name)), &f->g,
                         LYNX_ORDER_COALESCED, UT_EPOCH, UT_ACCEL, &f->d);
}

static int fx_teardown(void **state) {
  struct fx *f = *state;
  if (!f)
    return 0;
  ut_tconn_close(&f->c);
  if (f->ops) {
    f->ops->region_free(&f->r);
    f->ops->region_free(&f->r2);
    f->ops->agent_destroy(f->ta);
  }
  free(f);
  *state = NULL;
  return 0;
}

static void connect_ok(struct fx *f) {
  ut_connect_ok(f->ops->connect, &f->d, &f->c);
}

static void expect_refused(struct fx *f, const struct lynx_region_desc *d,
                           int want) {
  ut_expect_refused(f->ops->connect, d, want);
}

/* ---- the file ------------------------------------------------------------ */

/* region_alloc makes a file of the region's size, readable by its owner
 * only, that outlives the connections to it. */
static void test_region_file(void **state) {
  struct fx *f = *state;
  struct stat st;
  char path[256];

  assert_ptr_equal(f->r.ops, &lynx_transport_shm);
  assert_int_equal(f->r.size, f->g.region_size);
  assert_int_equal(f->r.locator[0], '/');
  assert_true(f->r.fd >= 0);
  snprintf(path, sizeof(path), "/dev/shm%s", f->r.locator);
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(st.st_size, f->g.region_size);
  assert_int_equal(st.st_mode & 0777, 0600);

  connect_ok(f);
  assert_ptr_equal(f->c->ops, &lynx_transport_shm);
  /* closing the connection leaves the file with its agent */
  ut_tconn_close(&f->c);
  assert_true(ut_shm_exists(f->r.locator));
  connect_ok(f);
}

/* What connect refuses about the file a locator names. */
static void test_connect_refuses_file(void **state) {
  struct fx *f = *state;
  struct lynx_region_desc d;

  /* a file shorter than descriptor and header say (truncated behind the
   * agent's back): mapping it would fault on the missing pages */
  assert_int_equal(ftruncate(f->r.fd, (off_t)(f->g.region_size - 4096)), 0);
  expect_refused(f, &f->d, -EPROTO);
  assert_int_equal(ftruncate(f->r.fd, (off_t)f->g.region_size), 0);
  /* bad locators */
  d = f->d;
  snprintf(d.locator, sizeof(d.locator), "%s", f->r.locator + 1);
  expect_refused(f, &d, -EINVAL);
  d = f->d;
  snprintf(d.locator, sizeof(d.locator), "/x/%.64s", f->r.locator + 1);
  expect_refused(f, &d, -EINVAL);
  d = f->d;
  snprintf(d.locator, sizeof(d.locator), "/lynx-ut-%d-nonexistent",
           (int)getpid());
  expect_refused(f, &d, -ENOENT);
  /* and with everything restored it connects */
  connect_ok(f);
}

static void test_connect_unformatted(void **state) {
  struct fx *f = *state;
  struct lynx_region_desc d;
  char name[64];
  assert_int_equal(f->ops->region_alloc(f->ta, &f->r2,
                                        ut_shm_new_name(name, sizeof(name)),
                                        f->g.region_size),
                   0);
  ut_desc_fill(&d, "shm", f->r2.locator, &f->g, UT_ACCEL, UT_EPOCH,
               LYNX_ORDER_COALESCED);
  expect_refused(f, &d, -EPROTO); /* magic 0: not (yet) a region */
  assert_int_equal(lynx_region_format(&f->r2, UT_Q, UT_S, UT_Z, 0,
                                      LYNX_ORDER_FENCED, UT_EPOCH + 5, 9),
                   0);
  d.epoch = UT_EPOCH + 5;
  expect_refused(f, &d, -EPROTO); /* ordering still says coalesced */
  d.ordering = LYNX_ORDER_FENCED;
  assert_int_equal(f->ops->connect(&d, &f->c), 0);
}

/* ---- notify ------------------------------------------------------------ */

struct sleeper {
  uint32_t *bell;
  uint32_t expect;
  long timeout_ms;
  volatile int ready;
  volatile pid_t tid;
  int rc, err;
  uint64_t slept_ns;
};

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void *sleeper_main(void *arg) {
  struct sleeper *s = arg;
  struct timespec ts = {s->timeout_ms / 1000, (s->timeout_ms % 1000) * 1000000};
  uint64_t t0;
  s->tid = (pid_t)syscall(SYS_gettid);
  __atomic_store_n(&s->ready, 1, __ATOMIC_SEQ_CST);
  t0 = now_ns();
  s->rc = (int)syscall(SYS_futex, s->bell, FUTEX_WAIT, s->expect, &ts, NULL, 0);
  s->err = s->rc ? errno : 0;
  s->slept_ns = now_ns() - t0;
  return NULL;
}

/* 1 once thread tid is blocked (state S), 0 after ~5 s. */
static int wait_blocked(pid_t tid) {
  char path[64], buf[256];
  snprintf(path, sizeof(path), "/proc/self/task/%d/stat", (int)tid);
  for (int i = 0; i < 5000; i++) {
    FILE *fp = fopen(path, "r");
    size_t n = 0;
    if (fp) {
      n = fread(buf, 1, sizeof(buf) - 1, fp);
      fclose(fp);
    }
    buf[n] = 0;
    {
      const char *p = strrchr(buf, ')');
      if (p && p[1] == ' ' && p[2] == 'S')
        return 1;
    }
    usleep(1000);
  }
  return 0;
}

/* Starts a thread waiting on the agent's mapping of the doorbell; the
 * frontend notifies through its own mapping of the same file. */
static void start_sleeper(struct fx *f, struct sleeper *s, pthread_t *th,
                          long timeout_ms) {
  memset(s, 0, sizeof(*s));
  s->bell = (uint32_t *)(f->r.base + LYNX_OFF_DOORBELL);
  s->expect = __atomic_load_n(s->bell, __ATOMIC_SEQ_CST);
  s->timeout_ms = timeout_ms;
  assert_int_equal(pthread_create(th, NULL, sleeper_main, s), 0);
  while (!__atomic_load_n(&s->ready, __ATOMIC_SEQ_CST))
    usleep(100);
  if (!wait_blocked(s->tid)) {
    pthread_join(*th, NULL);
    fail_msg("sleeper thread never blocked");
  }
}

static void test_notify_wakes_sleeper(void **state) {
  struct fx *f = *state;
  uint32_t *sleeping = (uint32_t *)(f->r.base + LYNX_OFF_SLEEPING);
  uint32_t *bell = (uint32_t *)(f->r.base + LYNX_OFF_DOORBELL);
  struct sleeper s;
  pthread_t th;
  connect_ok(f);
  *bell = 41;
  __atomic_store_n(sleeping, 1, __ATOMIC_SEQ_CST);
  start_sleeper(f, &s, &th, 10000);
  assert_int_equal(f->c->ops->notify(f->c), 0);
  pthread_join(th, NULL);
  /* woken (0), not timed out, well before the 10 s timeout */
  assert_int_equal(s.rc, 0);
  assert_true(s.slept_ns < 5000000000ull);
  assert_int_equal(__atomic_load_n(bell, __ATOMIC_SEQ_CST), 42);
  /* sleeping is a count of sleeping threads; any nonzero value counts */
  __atomic_store_n(sleeping, 2, __ATOMIC_SEQ_CST);
  assert_int_equal(f->c->ops->notify(f->c), 0);
  assert_int_equal(__atomic_load_n(bell, __ATOMIC_SEQ_CST), 43);
  assert_int_equal(*sleeping, 2); /* notify never writes it */
}

static void test_notify_not_sleeping(void **state) {
  struct fx *f = *state;
  uint32_t *sleeping = (uint32_t *)(f->r.base + LYNX_OFF_SLEEPING);
  uint32_t *bell = (uint32_t *)(f->r.base + LYNX_OFF_DOORBELL);
  struct sleeper s;
  pthread_t th;
  connect_ok(f);
  *bell = 7;
  __atomic_store_n(sleeping, 0, __ATOMIC_SEQ_CST);
  for (int i = 0; i < 100; i++)
    assert_int_equal(f->c->ops->notify(f->c), 0);
  assert_int_equal(__atomic_load_n(bell, __ATOMIC_SEQ_CST), 7);
  /* a waiter (that has not said it sleeps) is not woken either */
  start_sleeper(f, &s, &th, 300);
  assert_int_equal(f->c->ops->notify(f->c), 0);
  pthread_join(th, NULL);
  assert_int_equal(s.rc, -1);
  assert_int_equal(s.err, ETIMEDOUT);
  assert_int_equal(__atomic_load_n(bell, __ATOMIC_SEQ_CST), 7);
}

/* ---- free ---------------------------------------------------------------- */

static void test_region_free_removes_file(void **state) {
  struct fx *f = *state;
  struct lynx_region dup;
  char loc[LYNX_LOCATOR_MAX];
  int fd;
  snprintf(loc, sizeof(loc), "%s", f->r.locator);
  assert_true(ut_shm_exists(loc));

  /* the same name again is refused and must not remove the first one */
  ut_region_empty(&dup);
  assert_int_equal(f->ops->region_alloc(f->ta, &dup, loc + 1, 4096), -EEXIST);
  f->ops->region_free(&dup);
  assert_true(ut_shm_exists(loc));

  connect_ok(f);
  ut_tconn_close(&f->c);
  f->ops->region_free(&f->r);
  assert_false(ut_shm_exists(loc));
  errno = 0;
  fd = shm_open(loc, O_RDONLY, 0);
  assert_int_equal(fd, -1);
  assert_int_equal(errno, ENOENT);
  assert_null(f->r.base);
  assert_int_equal(f->r.fd, -1);
  /* freeing again (or a half-built region) is harmless */
  f->ops->region_free(&f->r);
  /* and a frontend can no longer connect */
  expect_refused(f, &f->d, -ENOENT);
}

static int g_argc;
static char **g_argv;

static int run_all(void) {
#define T(fn) cmocka_unit_test_setup_teardown(fn, fx_setup, fx_teardown)
  const struct CMUnitTest tests[] = {
      T(test_region_file),
      T(test_connect_refuses_file),
      T(test_connect_unformatted),
      T(test_notify_wakes_sleeper),
      T(test_notify_not_sleeping),
      T(test_region_free_removes_file),
  };
#undef T
  return LYNX_UT_MAIN(g_argc, g_argv, "transport_shm", tests, NULL, NULL);
}

int main(int argc, char **argv) {
  g_argc = argc;
  g_argv = argv;
  return ut_shm_main("transport_shm", run_all);
}
