/*
 * transport_conformance.h - what the transport conformance suite
 * (transport_conformance.c) needs from a backend: a harness that plays the
 * agent side and hands the cases a region's bytes and descriptor.
 *
 * The suite's cases are written once against struct lynx_transport_ops
 * (the frontend side: connect, writev, read, flush, poll, wait_fd, notify,
 * close) and run once per backend: the conformance executable is
 * transport_conformance.c linked with one conformance_<backend>.c, which
 * defines tc_backend. Every agent-side call (agent_create/destroy,
 * region_alloc, format, export, free) is made by the harness, never in a case,
 * so a change of the agent-side API touches only the harnesses: rdma's own, and
 * the tc_agent_* one below that shm and tcp share.
 */
#ifndef LYNX_TRANSPORT_CONFORMANCE_H
#define LYNX_TRANSPORT_CONFORMANCE_H

#include <stdint.h>

#include "mqueue.h"
#include "transport.h"

/* The geometry and identity every harness formats its regions with. */
#define TC_Q 2u
#define TC_S 8u
#define TC_Z 256u
#define TC_ACCEL 3u

/* One agent-side region, as a case sees it. */
struct tc_region {
  uint8_t *mem; /* its bytes as the accelerator sees them */
  struct lynx_geom g;
  struct lynx_region_desc d; /* what the agent advertises for it */
  void *priv;                /* the harness's */
};

/* What a backend does beyond the contract's minimum. */
#define TC_CAP_KEY 0x1u           /* descriptors carry an access key */
#define TC_CAP_WAIT_FD 0x2u       /* wait_fd gives an fd (else -ENOTSUP) */
#define TC_CAP_FREE_DROPS 0x4u    /* region_free ends live connections */
#define TC_CAP_FENCE_COUNTS 0x10u /* the agent counts fenced refusals, cuts */
#define TC_CAP_FENCE_PRODUCERS 0x20u /* ... and live producers */
#define TC_CAP_PUSH 0x40u            /* subscribe: the agent pushes answers */

struct tc_backend {
  const char *name;
  const struct lynx_transport_ops *ops;
  unsigned caps;
  /* The errors connect returns where backends differ (0: not applicable). */
  struct {
    int wrong_key;   /* a key the agent does not know */
    int stale_epoch; /* the region's epoch moved on */
    int bad_desc;    /* region_size disagrees with the geometry */
    int gone;        /* the region was freed */
    int fenced;      /* a newer frontend epoch holds the region */
    int cut;         /* any op of a connection a newer epoch cut */
  } err;
  int reads_max; /* a bound above the reads in flight it takes unpolled */

  /* The process around the cases (shm sweeps its files after a crash);
   * NULL: run() directly. Returns the exit status. */
  int (*main)(int (*run)(void));
  /* The agent side, once per run (NULL: nothing to start). 0 or -1. */
  int (*start)(void);
  void (*stop)(void);
  /* Allocates, formats (TC_Q x TC_S x TC_Z, TC_ACCEL) and exports a
   * region; fills r. 0 or -errno. */
  int (*region_new)(struct tc_region *r, uint32_t ordering, uint64_t epoch);
  /* The agent restarts the region: it vanishes, and comes back zeroed and
   * formatted under the same locator with epoch; r->d is the new
   * descriptor. 0 or -errno. */
  int (*region_renew)(struct tc_region *r, uint64_t epoch);
  /* Unexports and frees r; harmless on a freed or half-built one. */
  void (*region_free)(struct tc_region *r);
  /* A frontend connects to the region d names (the frontend's connect,
   * with whatever the backend's agent does in between). */
  int (*connect)(const struct lynx_region_desc *d, struct lynx_tconn **out);
  /* The agent's fencing of r (lynx_region_fence_stats). */
  void (*fence_stats)(struct tc_region *r, struct lynx_fence_stats *out);
};

/* Defined by the harness linked in. */
extern const struct tc_backend tc_backend;

/* For a harness whose agent side is its backend's own, run in this process
 * (shm, tcp): tc_backend.ops makes every agent-side call. Defined in
 * transport_conformance.c, apart from the cases. */
/* start: the agent side, created with o. 0 or -1. */
int tc_agent_start(const struct lynx_transport_opts *o);
void tc_agent_stop(void);
/* region_new, the region allocated under name (shm: its file; the same
 * name again on region_renew, as an agent restarting it does). */
int tc_agent_region_new(struct tc_region *t, const char *name,
                        uint32_t ordering, uint64_t epoch);
int tc_agent_region_renew(struct tc_region *t, uint64_t epoch);
void tc_agent_region_free(struct tc_region *t);
/* connect: the backend's own. */
int tc_agent_connect(const struct lynx_region_desc *d, struct lynx_tconn **out);
/* fence_stats: lynx_region_fence_stats of the agent's region. */
void tc_agent_fence_stats(struct tc_region *t, struct lynx_fence_stats *out);

#endif
