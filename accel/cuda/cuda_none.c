/*
 * cuda_none.c - the CUDA backend of an agent built without the CUDA
 * toolkit (LYNX_CUDA=OFF, or AUTO where nvcc was not found): every entry
 * point says so, and the agent refuses --cuda-accels with that reason.
 */
#include <errno.h>
#include <stdio.h>

#include "gpu.h"

#define NO_CUDA                                                               \
  "this lynx-agent was built without the CUDA backend (no CUDA toolkit at "   \
  "build time, or LYNX_CUDA=OFF): no GPU accelerators; rebuild with "         \
  "`make LYNX_CUDA=ON` on a host with the CUDA toolkit"

int gpu_built(void) { return 0; }

int gpu_discover(const char *spec, struct gpu_info **out, uint32_t *n,
                 char *err, size_t errlen) {
  (void)spec;
  *out = NULL;
  *n = 0;
  snprintf(err, errlen, "%s", NO_CUDA);
  return -ENOTSUP;
}

int gpu_instance_start(const struct gpu_launch *l, struct lynx_region *r,
                       struct gpu_instance **out, char *err, size_t errlen) {
  (void)l;
  (void)r;
  *out = NULL;
  snprintf(err, errlen, "%s", NO_CUDA);
  return -ENOTSUP;
}

int gpu_instance_stop(struct gpu_instance *gi) {
  (void)gi;
  return -ENOTSUP;
}

int gpu_instance_fence(struct gpu_instance *gi, uint64_t serve_until_ns) {
  (void)gi;
  (void)serve_until_ns;
  return -ENOTSUP;
}

int gpu_instance_counters(struct gpu_instance *gi, uint64_t *req,
                          uint64_t *resp, uint64_t *drops, uint64_t *bad) {
  (void)gi;
  *req = *resp = *drops = *bad = 0;
  return -ENOTSUP;
}

void gpu_instance_put(struct gpu_instance *gi) { (void)gi; }

void gpu_shutdown(void) {}

void gpu_health(const struct gpu_info *g, int *lost, int *failed, char *err,
                size_t errlen) {
  (void)g;
  *lost = 1;
  *failed = 0;
  snprintf(err, errlen, "%s", NO_CUDA);
}
