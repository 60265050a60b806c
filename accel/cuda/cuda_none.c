/*
 * cuda_none.c - the CUDA backend (lynx_accel_cuda, accel.h) of an agent
 * built without the CUDA toolkit (LYNX_CUDA=OFF, or AUTO where nvcc was not
 * found): discovery says so, and the agent refuses --cuda-accels with that
 * reason. With no accelerator found, no other op is reached; each still
 * answers as a backend without devices would.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "accel.h"

#define NO_CUDA                                                                \
  "this lynx-agent was built without the CUDA backend (no CUDA toolkit at "    \
  "build time, or LYNX_CUDA=OFF): no GPU accelerators; rebuild with "          \
  "`make LYNX_CUDA=ON` on a host with the CUDA toolkit"

static int none_discover(const char *spec,
                         const struct lynx_transport_ops *tops,
                         enum lynx_region_where mem,
                         struct lynx_accel_dev **out, uint32_t *n, char *err,
                         size_t errlen) {
  (void)spec;
  (void)tops;
  (void)mem;
  *out = NULL;
  *n = 0;
  snprintf(err, errlen, "%s", NO_CUDA);
  return -ENOTSUP;
}

static int none_runs_app(const struct lynx_accel_dev *a,
                         const struct lynx_app *app) {
  (void)a, (void)app;
  return 0;
}

/* Never called: this table finds no accelerator. */
static int none_adopt(const struct lynx_accel_dev *devs, uint32_t n,
                      struct lynx_app *app, char *why, size_t whylen) {
  (void)devs, (void)n, (void)app;
  snprintf(why, whylen, "%s", NO_CUDA);
  return -ENOTSUP;
}

/* Whatever the layout, start says the agent was built without CUDA. */
static int none_client_mqs(const struct lynx_accel_launch *l,
                           uint32_t *per_backend, char *why, size_t whylen) {
  (void)l;
  (void)why;
  (void)whylen;
  *per_backend = 1;
  return 0;
}

static int none_start(const struct lynx_accel_launch *l, struct lynx_region *r,
                      struct lynx_accel_inst **out, char *why, size_t whylen) {
  (void)l;
  (void)r;
  *out = NULL;
  snprintf(why, whylen, "%s", NO_CUDA);
  return -ENOTSUP;
}

static int none_fence(struct lynx_accel_inst *in, uint64_t serve_until_ns,
                      int wake) {
  (void)in;
  (void)serve_until_ns;
  (void)wake;
  return -ENOTSUP;
}

static int none_counters(struct lynx_accel_inst *in, uint64_t *req,
                         uint64_t *resp, uint64_t *drops, uint64_t *bad) {
  (void)in;
  *req = *resp = *drops = *bad = 0;
  return -ENOTSUP;
}

static int none_latency(struct lynx_accel_inst *in, struct lynx_lat *out) {
  (void)in;
  memset(out, 0, sizeof(*out));
  return -ENOTSUP;
}

static void none_copies(struct lynx_accel_inst *in,
                        struct lynx_accel_copies *out) {
  (void)in;
  memset(out, 0, sizeof(*out));
}

static int none_stop(struct lynx_accel_inst *in) {
  (void)in;
  return -ENOTSUP;
}

static void none_put(struct lynx_accel_inst *in) { (void)in; }

static void none_health(const struct lynx_accel_dev *a, int *lost, int *failed,
                        char *err, size_t errlen) {
  (void)a;
  *lost = 1;
  *failed = 0;
  snprintf(err, errlen, "%s", NO_CUDA);
}

static int none_blocks(const struct lynx_accel_dev *a, uint32_t threads,
                       uint32_t *resident, uint32_t *held) {
  (void)a;
  (void)threads;
  *resident = *held = 0;
  return -ENOTSUP;
}

static void none_shutdown(void) {}

const struct lynx_accel_ops lynx_accel_cuda =
    LYNX_ACCEL_OPS("cuda", "GPU", none);
