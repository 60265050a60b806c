/*
 * test_transport_tcp_stop.c - the tcp transport's agent side stops:
 * the agent handle's destroy (transport/tcp_agent.c) returns, within a bound,
 * whatever its server thread was doing, and the agent daemon's SIGTERM
 * path, which ends in it, cannot hang there (issue 32, item 4).
 *
 * The bug this guards against (fixed in a124c73): destroy set the stop
 * flag with a plain store and woke the server thread with uv_async_send.
 * region_free, called just before (the fuzz harness's order, and the
 * agent's: its instances' regions, then the transport), sends a wake of
 * its own, so destroy's usually found one pending. uv_async_send then
 * only loads the pending flag (relaxed) and returns: the one callback
 * that follows must see stop. Nothing ordered the store of stop before
 * that load (a CPU may hold a store back past a later load, x86 too), so
 * the callback could clear the flag, read stop as 0 and close nothing;
 * the loop never ended and destroy's pthread_join waited forever. Now
 * stop is written and read under the handle's lock.
 *
 * That interleaving exists only on a memory model weaker than
 * sequential consistency: there is no order of the two threads' steps in
 * which the old code hangs, so a delay or a hook in either thread cannot
 * force it (a delay lets the held-back store drain). It showed about once
 * in 170,000 fuzz inputs. What is deterministic is the race itself: the
 * old store and load of stop are not ordered by anything a race detector
 * sees, on every iteration below, whichever thread gets there first. So
 * these cases run twice (tests/CMakeLists.txt): as unit_transport_tcp_stop,
 * which checks what a user sees (destroy returns within DESTROY_BOUND_S,
 * every connection closed), and as unit_transport_tcp_stop_tsan, the same
 * file with transport/ built under ThreadSanitizer (halt_on_error): there
 * the old code fails on the first iteration (a data race on stop, written
 * by tcp_agent_destroy, read by srv_on_wake), and the fixed code passes.
 *
 * Each case runs its iterations in a thread of its own; the case's thread
 * watches it and fails, saying which iteration and which step, when a
 * destroy has not returned within DESTROY_BOUND_S: the suite never hangs
 * on it (ctest's TIMEOUT is a backstop, not the check).
 */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "mqueue.h"
#include "transport.h"
#include "ut_main.h"
#include "ut_region.h"
#include "ut_tconn.h"
#include "util.h"

/* generous: a destroy takes well under a millisecond (a loaded 2-core
 * machine, ThreadSanitizer: a few); one that took this long never ends */
#define DESTROY_BOUND_S 10u
#define NPEERS 4 /* raw connections open at a destroy */

/* What a case's worker thread is at, for the watchdog and its message. */
struct run {
  void (*body)(struct run *);
  unsigned iters;
  /* written by the worker, read by the watchdog: atomics, everywhere
   * (a plain access beside them is a race to ThreadSanitizer) */
  unsigned at;         /* the iteration */
  const char *step;    /* what it does now */
  uint64_t destroy_ns; /* when the destroy under way began; 0: none */
  int done;            /* the worker returned */
  char why[256];       /* the worker's own failure; "" none */
};

static void step(struct run *r, const char *what) {
  __atomic_store_n(&r->step, what, __ATOMIC_RELEASE);
}

static unsigned at(const struct run *r) {
  return __atomic_load_n(&r->at, __ATOMIC_RELAXED);
}

/* for each iteration i of r: i published for the watchdog */
#define EACH_ITER(r, i)                                                        \
  for (unsigned i = 0;                                                         \
       i < (r)->iters && (__atomic_store_n(&(r)->at, i, __ATOMIC_RELAXED), 1); \
       i++)

/* The worker's failure (a set-up step that failed): noted for the
 * watchdog, which fails the case with it (cmocka's asserts belong to the
 * case's thread). */
static void worker_fail(struct run *r, const char *fmt, ...) {
  va_list ap;
  if (r->why[0])
    return;
  va_start(ap, fmt);
  vsnprintf(r->why, sizeof(r->why), fmt, ap);
  va_end(ap);
}

/* ta->agent_destroy, timed for the watchdog. */
static void destroy_timed(struct run *r, const struct lynx_transport_ops *t,
                          struct lynx_transport_agent *ta) {
  step(r, "tcp_agent_destroy");
  __atomic_store_n(&r->destroy_ns, lynx_now_ns(), __ATOMIC_RELEASE);
  t->agent_destroy(ta);
  __atomic_store_n(&r->destroy_ns, 0, __ATOMIC_RELEASE);
}

/* An agent on 127.0.0.1 with one region exported; 0, or -1 with the
 * reason noted. */
static int agent_with_region(struct run *r, unsigned i,
                             const struct lynx_transport_ops **t,
                             struct lynx_transport_agent **ta,
                             struct lynx_region *reg,
                             struct lynx_region_desc *d) {
  struct lynx_geom g;
  step(r, "agent_create");
  if (ut_tcp_agent(t, ta, (char[LYNX_LOCATOR_MAX]){0}, LYNX_LOCATOR_MAX)) {
    worker_fail(r, "iteration %u: no tcp agent on 127.0.0.1", i);
    return -1;
  }
  step(r, "region_export");
  ut_region_empty(reg);
  if (lynx_geom_init(&g, UT_Q, UT_S, UT_Z, 0) ||
      ut_region_serve(*t, *ta, reg, "stop", &g, LYNX_ORDER_COALESCED, UT_EPOCH,
                      UT_ACCEL, d)) {
    worker_fail(r, "iteration %u: the region was not exported", i);
    (*t)->region_free(reg);
    (*t)->agent_destroy(*ta);
    return -1;
  }
  return 0;
}

/* Fuzz harness order (tests/fuzz/fuzz_tcp_agent.c): region_free, whose
 * wake is then usually still pending, and destroy at once, whose wake is
 * coalesced with it; every fourth iteration waits a little first, so
 * that the server thread has read stop (as 0) before destroy writes it. */
static void body_wake_pending(struct run *r) {
  EACH_ITER(r, i) {
    const struct lynx_transport_ops *t;
    struct lynx_transport_agent *ta;
    struct lynx_region reg;
    struct lynx_region_desc d;
    if (agent_with_region(r, i, &t, &ta, &reg, &d))
      return;
    step(r, "region_free");
    t->region_free(&reg);
    if (i % 4 == 3)
      usleep(200);
    destroy_timed(r, t, ta);
  }
}

/* A frontend connected to the region when it is freed (its wake makes
 * the server thread close that connection, under the handle's lock),
 * then destroy: the agent daemon's SIGTERM path, whose instances' regions
 * go just before the transport. */
static void body_with_frontend(struct run *r) {
  EACH_ITER(r, i) {
    const struct lynx_transport_ops *t;
    struct lynx_transport_agent *ta;
    struct lynx_region reg;
    struct lynx_region_desc d;
    struct lynx_tconn *c = NULL;
    if (agent_with_region(r, i, &t, &ta, &reg, &d))
      return;
    step(r, "connect");
    if (t->connect(&d, &c) || !c) {
      worker_fail(r, "iteration %u: the frontend side did not connect", i);
      t->region_free(&reg);
      t->agent_destroy(ta);
      return;
    }
    step(r, "region_free");
    t->region_free(&reg);
    destroy_timed(r, t, ta);
    step(r, "frontend close");
    c->ops->close(c);
  }
}

/* Whether the peer of fd closed its side (EOF or a reset) within ms. */
static int peer_closed(int fd, int ms) {
  uint64_t end = lynx_now_ns() + (uint64_t)ms * 1000000u;
  char b[64];
  while (lynx_now_ns() < end) {
    struct pollfd p = {fd, POLLIN, 0};
    ssize_t n;
    if (poll(&p, 1, 50) <= 0)
      continue;
    n = recv(fd, b, sizeof(b), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
      return 1;
  }
  return 0;
}

/* Raw connections that never say HELLO, open at the destroy: it closes
 * every one (the "closed less than everything" half of the issue), and
 * returns. Some are accepted by then, some still in the listen queue. */
static void body_with_peers(struct run *r) {
  EACH_ITER(r, i) {
    const struct lynx_transport_ops *t;
    struct lynx_transport_agent *ta;
    struct lynx_region reg;
    struct lynx_region_desc d;
    struct sockaddr_storage ss;
    int fd[NPEERS];
    if (agent_with_region(r, i, &t, &ta, &reg, &d))
      return;
    step(r, "raw connect");
    if (lynx_parse_hostport(reg.locator, &ss)) {
      worker_fail(r, "iteration %u: locator %s", i, reg.locator);
      t->region_free(&reg);
      t->agent_destroy(ta);
      return;
    }
    for (int k = 0; k < NPEERS; k++) {
      fd[k] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd[k] < 0 ||
          connect(fd[k], (struct sockaddr *)&ss, sizeof(struct sockaddr_in)))
        worker_fail(r, "iteration %u: connect: %s", i, strerror(errno));
      if (k == NPEERS / 2)
        usleep(500); /* the first ones accepted, likely */
    }
    step(r, "region_free");
    t->region_free(&reg);
    destroy_timed(r, t, ta);
    step(r, "peers closed");
    for (int k = 0; k < NPEERS; k++) {
      if (fd[k] >= 0 && !peer_closed(fd[k], 2000))
        worker_fail(r,
                    "iteration %u: connection %d still open after "
                    "tcp_agent_destroy returned",
                    i, k);
      if (fd[k] >= 0)
        close(fd[k]);
    }
    if (r->why[0])
      return;
  }
}

static void *worker_main(void *arg) {
  struct run *r = arg;
  r->body(r);
  __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
  return NULL;
}

/* Runs body for iters iterations in a worker thread, failing the case
 * when a destroy has not returned within DESTROY_BOUND_S (the worker is
 * then left where it hangs: the process ends with the case's failure). */
static void run_bounded(void (*body)(struct run *), unsigned iters) {
  static struct run runs[8]; /* a hung worker's outlives its case */
  static unsigned nrun;
  struct run *r;
  pthread_t tid;
  assert_true(nrun < sizeof(runs) / sizeof(runs[0]));
  r = &runs[nrun++];
  r->body = body;
  r->iters = iters;
  step(r, "start");
  assert_int_equal(pthread_create(&tid, NULL, worker_main, r), 0);
  for (;;) {
    uint64_t since = __atomic_load_n(&r->destroy_ns, __ATOMIC_ACQUIRE);
    if (__atomic_load_n(&r->done, __ATOMIC_ACQUIRE))
      break;
    if (since && lynx_now_ns() - since > DESTROY_BOUND_S * 1000000000ull) {
      pthread_detach(tid);
      fail_msg("tcp_agent_destroy did not return within %u s (iteration %u "
               "of %u): its server thread never stopped, the stop lost "
               "behind a pending wake or a handle left open",
               DESTROY_BOUND_S, at(r) + 1, iters);
    }
    usleep(10 * 1000);
  }
  assert_int_equal(pthread_join(tid, NULL), 0);
  if (r->why[0])
    fail_msg("%s (at %s)", r->why, r->step);
}

/* Iterations: LYNX_UT_STOP_ITERS scales them (a long run: 100) */
static unsigned iters(unsigned n) {
  const char *s = getenv("LYNX_UT_STOP_ITERS");
  unsigned k = s ? (unsigned)strtoul(s, NULL, 10) : 1;
  return n * (k ? k : 1);
}

static void test_destroy_wake_pending(void **state) {
  (void)state;
  run_bounded(body_wake_pending, iters(400));
}

static void test_destroy_frontend_connected(void **state) {
  (void)state;
  run_bounded(body_with_frontend, iters(100));
}

static void test_destroy_closes_every_connection(void **state) {
  (void)state;
  run_bounded(body_with_peers, iters(50));
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_destroy_wake_pending),
      cmocka_unit_test(test_destroy_frontend_connected),
      cmocka_unit_test(test_destroy_closes_every_connection),
  };
  return LYNX_UT_MAIN(argc, argv, "tests", tests, NULL, NULL);
}
