/*
 * conformance_tcp.c - the tcp backend's harness for the transport
 * conformance suite (transport_conformance.h): its agent side is the
 * suite's tc_agent_* (the backend's own, in this process) on 127.0.0.1,
 * one server thread started once for the run, and the accelerator's view
 * of a region is the agent's anonymous memory.
 */
#include <errno.h>

#include "transport_conformance.h"

static int tcp_start(void) {
  return tc_agent_start(&(struct lynx_transport_opts){.listen = "127.0.0.1:0"});
}

static int tcp_region_new(struct tc_region *t, uint32_t ordering,
                          uint64_t epoch) {
  return tc_agent_region_new(t, "ut", ordering, epoch);
}

/* region_renew: a restarted region is served at the same port with a new
 * key. */
const struct tc_backend tc_backend = {
    .name = "tcp",
    .ops = &lynx_transport_tcp,
    .caps = TC_CAP_KEY | TC_CAP_WAIT_FD | TC_CAP_FREE_DROPS |
            TC_CAP_FENCE_COUNTS | TC_CAP_FENCE_PRODUCERS | TC_CAP_PUSH,
    .err = {.wrong_key = -ESTALE,
            .stale_epoch = -ESTALE,
            .bad_desc = -EPROTO,
            .gone = -ESTALE,
            .fenced = -ESTALE,
            .cut = -ESTALE},
    .reads_max = 5000,
    .start = tcp_start,
    .stop = tc_agent_stop,
    .region_new = tcp_region_new,
    .region_renew = tc_agent_region_renew,
    .region_free = tc_agent_region_free,
    .connect = tc_agent_connect,
    .fence_stats = tc_agent_fence_stats,
};
