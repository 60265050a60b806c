/*
 * conformance_shm.c - the shm backend's harness for the transport
 * conformance suite (transport_conformance.h): regions are shm files named
 * by ut_shm.h (removed on every path, a crash included), the accelerator's
 * view is the agent's own mapping. The agent side is the suite's tc_agent_*
 * (the backend's own, in this process), with no options.
 */
#include <errno.h>

#include "transport_conformance.h"
#include "ut_shm.h"

static int shm_start(void) {
  return tc_agent_start(&(struct lynx_transport_opts){0});
}

static int shm_region_new(struct tc_region *t, uint32_t ordering,
                          uint64_t epoch) {
  char name[64];
  return tc_agent_region_new(t, ut_shm_new_name(name, sizeof(name)), ordering,
                             epoch);
}

static int shm_main(int (*run)(void)) {
  return ut_shm_main("transport_conformance_shm", run);
}

/* region_renew: the same file name again, what an agent restarting the
 * instance does. */
const struct tc_backend tc_backend = {
    .name = "shm",
    .ops = &lynx_transport_shm,
    .caps = 0,
    .err = {.wrong_key = 0,
            .stale_epoch = -EPROTO,
            .bad_desc = -EPROTO,
            .gone = -ENOENT,
            .fenced = -ESTALE,
            .cut = -ESTALE},
    .reads_max = 1000,
    .main = shm_main,
    .start = shm_start,
    .stop = tc_agent_stop,
    .region_new = shm_region_new,
    .region_renew = tc_agent_region_renew,
    .region_free = tc_agent_region_free,
    .connect = tc_agent_connect,
    .fence_stats = tc_agent_fence_stats,
};
