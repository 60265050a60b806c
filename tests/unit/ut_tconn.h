/*
 * ut_tconn.h - test helpers for the frontend side of a transport: connect
 * (or be refused), wait for posted reads to complete, close a connection a
 * fixture holds. Header-only; include after <cmocka.h>. Used by
 * transport_conformance.c, test_transport_{shm,tcp,rdma}.c and
 * test_cuda_backend.c.
 */
#ifndef LYNX_UT_TCONN_H
#define LYNX_UT_TCONN_H

#include <stdint.h>
#include <unistd.h>

#include "transport.h"
#include "util.h"

/* A connect: the backend's own (ops->connect), or a harness's. */
typedef int (*ut_connect_fn)(const struct lynx_region_desc *d,
                             struct lynx_tconn **out);

static inline void ut_connect_ok(ut_connect_fn connect,
                                 const struct lynx_region_desc *d,
                                 struct lynx_tconn **c) {
  assert_int_equal(connect(d, c), 0);
  assert_non_null(*c);
}

/* Connecting to d fails with want and leaves *out untouched. */
static inline void ut_expect_refused(ut_connect_fn connect,
                                     const struct lynx_region_desc *d,
                                     int want) {
  struct lynx_tconn *sentinel = (struct lynx_tconn *)(uintptr_t)0x1;
  struct lynx_tconn *c = sentinel;
  int rc = connect(d, &c);
  if (rc == 0 && c != sentinel && c)
    c->ops->close(c);
  assert_int_equal(rc, want);
  assert_ptr_equal(c, sentinel); /* *out untouched on failure */
}

/* Polls until n completions arrived (or 2 s passed); returns the count, or
 * the poll error. */
static inline int ut_poll_n(struct lynx_tconn *c, uint64_t *ids, int n) {
  uint64_t end = lynx_now_ns() + 2000000000ull;
  int got = 0;
  while (got < n && lynx_now_ns() < end) {
    int k = c->ops->poll(c, ids + got, n - got);
    if (k < 0)
      return k;
    got += k;
    if (!k)
      usleep(100);
  }
  return got;
}

/* Closes *c if it is open and forgets it, so that a fixture's teardown
 * does not close it again. */
static inline void ut_tconn_close(struct lynx_tconn **c) {
  if (*c)
    (*c)->ops->close(*c);
  *c = NULL;
}

#endif
