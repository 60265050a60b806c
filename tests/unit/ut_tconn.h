/*
 * ut_tconn.h - test helpers for the frontend side of a transport: wait for
 * posted reads to complete, close a connection a fixture holds.
 * Header-only; used by transport_conformance.c, test_transport_{shm,tcp,
 * rdma}.c and test_cuda_backend.c.
 */
#ifndef LYNX_UT_TCONN_H
#define LYNX_UT_TCONN_H

#include <stdint.h>
#include <unistd.h>

#include "transport.h"
#include "util.h"

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
