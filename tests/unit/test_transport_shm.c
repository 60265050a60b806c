/*
 * test_transport_shm.c - what only the shm backend (transport/transport_shm.c)
 * does: its regions are files in /dev/shm (named, sized, mode 0600,
 * removed by region_free, a name never taken twice), connect maps the file
 * a locator names (refused when the name is malformed, missing, or the
 * file was truncated), and notify wakes a thread sleeping on the doorbell
 * through the frontend's own mapping (futex); arm asks a CPU accelerator
 * for the frontend worker's response doorbell (common/bell.h: the bell's
 * own behaviour is tested here too, as shm is what it serves). What every
 * backend promises
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
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "bell.h"
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
  assert_true(s.slept_ns < ut_scaled(5000000000ull));
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

/* ---- response doorbells ------------------------------------------------ */

static char *bell_path(char *buf, size_t len, uint32_t id) {
  snprintf(buf, len, "/dev/shm/lynx-bell-%08x", id);
  return buf;
}

/* whether b's socket turns readable within ms */
static int bell_rings_within(const struct lynx_bell *b, int ms) {
  struct pollfd p = {b->fd, POLLIN, 0};
  return poll(&p, 1, ms) == 1;
}

/* A bell is a socket file in /dev/shm named by its id; rings queue up as
 * datagrams until its queue is full (net.unix.max_dgram_qlen: -EAGAIN,
 * the worker has rings to drain already), a drain takes up to 16 at a
 * time; a closed bell is gone, and ringing it says so. */
static void test_bell_open_ring_drain_close(void **state) {
  struct lynx_bell a, b;
  char path[64];
  struct stat st;
  int queued = 0, drained = 0, n;
  (void)state;
  assert_int_equal(lynx_bell_open(&a), 0);
  assert_int_equal(lynx_bell_open(&b), 0);
  assert_true(a.fd >= 0 && a.id != 0 && b.id != 0 && a.id != b.id);
  assert_int_equal(stat(bell_path(path, sizeof(path), a.id), &st), 0);
  assert_true(S_ISSOCK(st.st_mode));
  assert_int_equal(lynx_bell_drain(&a), 0); /* nothing rang */
  for (int i = 0; i < 40; i++) {
    int rc = lynx_bell_ring(a.id);
    if (rc == -EAGAIN)
      break;
    assert_int_equal(rc, 0);
    queued++;
  }
  assert_true(queued >= 1);
  assert_true(bell_rings_within(&a, 1000));
  assert_false(bell_rings_within(&b, 0)); /* only the bell rung */
  while ((n = lynx_bell_drain(&a)) > 0) {
    assert_true(n <= 16);
    drained += n;
  }
  assert_int_equal(drained, queued);
  assert_false(bell_rings_within(&a, 0));
  assert_int_equal(lynx_bell_ring(a.id), 0); /* room again */
  assert_int_equal(lynx_bell_drain(&a), 1);
  lynx_bell_close(&a);
  assert_int_equal(a.fd, -1);
  assert_int_equal(a.id, 0);
  assert_int_equal(stat(path, &st), -1);
  assert_int_equal(lynx_bell_ring(b.id), 0);
  lynx_bell_close(&b);
  assert_int_equal(lynx_bell_ring(b.id ? b.id : 1), -ENOENT);
  /* closing twice, or a bell never opened, is harmless */
  lynx_bell_close(&a);
  memset(&b, 0, sizeof(b));
  lynx_bell_close(&b);
}

/* A bell path left behind by a worker that died (bound, never unlinked)
 * refuses a ring: the accelerator is told, and nothing blocks; the next
 * bell opened removes it, and leaves live bells alone. */
static void test_bell_dead_worker(void **state) {
  struct lynx_bell a;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  int fd;
  (void)state;
  assert_int_equal(lynx_bell_open(&a), 0);
  bell_path(sa.sun_path, sizeof(sa.sun_path), a.id);
  /* what a killed worker leaves: the file without a socket behind it */
  close(a.fd);
  a.fd = -1;
  fd = socket(AF_UNIX, SOCK_DGRAM, 0);
  assert_true(fd >= 0);
  assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), -1);
  assert_int_equal(errno, ECONNREFUSED);
  close(fd);
  assert_int_equal(lynx_bell_ring(a.id), -ECONNREFUSED);
  {
    struct lynx_bell live, next;
    struct stat st;
    char path[64];
    assert_int_equal(lynx_bell_open(&live), 0);
    assert_int_equal(stat(sa.sun_path, &st), -1); /* swept */
    assert_int_equal(errno, ENOENT);
    assert_int_equal(lynx_bell_open(&next), 0);
    assert_int_equal(stat(bell_path(path, sizeof(path), live.id), &st), 0);
    assert_int_equal(lynx_bell_ring(live.id), 0);
    lynx_bell_close(&live);
    lynx_bell_close(&next);
  }
  unlink(sa.sun_path);
}

static void set_resp_bell(struct fx *f) {
  ((struct lynx_region_hdr *)f->r.base)->flags |= LYNX_HDR_RESP_BELL;
}

/* A region whose accelerator does not ring (a GPU's: no header flag) and
 * a bad mqueue index are refused; nothing is written. */
static void test_arm_refused(void **state) {
  struct fx *f = *state;
  struct lynx_arm a = {0, 0};
  const struct lynx_fctrl *fc =
      (const struct lynx_fctrl *)(f->r.base + lynx_fctrl_off(&f->g, 0));
  connect_ok(f);
  assert_int_equal(f->c->ops->arm(f->c, 0x1234, &a, 1), -ENOTSUP);
  assert_int_equal(fc->waiter, 0);
  ut_tconn_close(&f->c);
  set_resp_bell(f);
  connect_ok(f);
  a.q = UT_Q;
  assert_int_equal(f->c->ops->arm(f->c, 0x1234, &a, 1), -EINVAL);
}

/* The whole doorbell: a worker arms mqueue 1 only; a publish on mqueue 0
 * rings nothing, one on mqueue 1 rings the bell; arming with a consumed
 * position behind the TX ring reports a message waiting; withdrawing
 * clears waiter, after which publishing rings nothing. */
static void test_arm_bell_round_trip(void **state) {
  struct fx *f = *state;
  struct lynx_bell b;
  struct lynx_mq m0, m1;
  struct lynx_arm a = {1, 0};
  const struct lynx_fctrl *fc1 =
      (const struct lynx_fctrl *)(f->r.base + lynx_fctrl_off(&f->g, 1));
  const struct lynx_fctrl *fc0 =
      (const struct lynx_fctrl *)(f->r.base + lynx_fctrl_off(&f->g, 0));
  uint8_t *buf;
  set_resp_bell(f);
  connect_ok(f);
  assert_int_equal(lynx_bell_open(&b), 0);
  lynx_mq_bind(&m0, f->r.base, &f->g, 0);
  lynx_mq_bind(&m1, f->r.base, &f->g, 1);

  assert_int_equal(f->c->ops->arm(f->c, b.id, &a, 1), 0);
  assert_int_equal(fc1->waiter, b.id);
  assert_int_equal(fc0->waiter, 0);
  /* a publish on an mqueue nobody waits on rings nothing */
  assert_int_equal(lynx_mq_reserve(&m0, 8, &buf), 0);
  lynx_mq_commit(&m0, 7, 8, 8, LYNX_ST_OK);
  assert_int_equal(lynx_bell_after_publish(&m0, "test"), 0);
  assert_false(bell_rings_within(&b, 50));
  /* one on the armed mqueue rings the worker's bell */
  assert_int_equal(lynx_mq_reserve(&m1, 8, &buf), 0);
  lynx_mq_commit(&m1, 9, 8, 8, LYNX_ST_OK);
  assert_int_equal(lynx_bell_after_publish(&m1, "test"), 1);
  assert_true(bell_rings_within(&b, 1000));
  assert_int_equal(lynx_bell_drain(&b), 1);
  /* withdrawn: waiter cleared, nothing rings */
  assert_int_equal(f->c->ops->arm(f->c, 0, &a, 1), 0);
  assert_int_equal(fc1->waiter, 0);
  assert_int_equal(lynx_bell_after_publish(&m1, "test"), 0);
  assert_false(bell_rings_within(&b, 50));
  /* the message the worker has not consumed: arm says so, and stands */
  assert_int_equal(f->c->ops->arm(f->c, b.id, &a, 1), 1);
  assert_int_equal(fc1->waiter, b.id);
  a.cons = 1; /* consumed: nothing more to wait for */
  assert_int_equal(f->c->ops->arm(f->c, b.id, &a, 1), 0);
  assert_int_equal(f->c->ops->arm(f->c, 0, &a, 1), 0);
  lynx_bell_close(&b);
  /* a waiter whose worker is gone: the accelerator is told, not stuck */
  assert_int_equal(f->c->ops->arm(f->c, b.id ? b.id : 0x5eed, &a, 1), 0);
  assert_true(lynx_bell_after_publish(&m1, "test") < 0);
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
      T(test_region_file),         T(test_connect_refuses_file),
      T(test_connect_unformatted), T(test_notify_wakes_sleeper),
      T(test_notify_not_sleeping), T(test_bell_open_ring_drain_close),
      T(test_bell_dead_worker),    T(test_arm_refused),
      T(test_arm_bell_round_trip), T(test_region_free_removes_file),
  };
#undef T
  return LYNX_UT_MAIN(g_argc, g_argv, "transport_shm", tests, NULL, NULL);
}

int main(int argc, char **argv) {
  g_argc = argc;
  g_argv = argv;
  return ut_shm_main("transport_shm", run_all);
}
