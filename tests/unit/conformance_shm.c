/*
 * conformance_shm.c - the shm backend's harness for the transport
 * conformance suite (transport_conformance.h): regions are shm files named
 * by ut_shm.h (removed on every path, a crash included), the accelerator's
 * view is the agent's own mapping, and there is no agent to start.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "transport_conformance.h"
#include "ut_shm.h"

struct shm_reg {
  struct lynx_region r;
  char name[64];
};

static void fill(struct tc_region *t, struct shm_reg *s, uint32_t ordering,
                 uint64_t epoch) {
  struct lynx_region_desc *d = &t->d;
  t->mem = s->r.base;
  memset(d, 0, sizeof(*d));
  d->accel_id = TC_ACCEL;
  snprintf(d->transport, sizeof(d->transport), "shm");
  snprintf(d->locator, sizeof(d->locator), "%s", s->r.locator);
  d->region_size = t->g.region_size;
  d->epoch = epoch;
  d->n_mqueues = TC_Q;
  d->slots = TC_S;
  d->slot_size = TC_Z;
  d->ordering = ordering;
}

static struct lynx_transport_agent *g_ta; /* the agent side's handle */

static int shm_start(void) {
  char err[256];
  if (lynx_transport_shm.agent_create(&(struct lynx_transport_opts){0}, &g_ta,
                                      err, sizeof(err))) {
    fprintf(stderr, "agent_create: %s\n", err);
    return -1;
  }
  return 0;
}

static void shm_stop(void) {
  lynx_transport_shm.agent_destroy(g_ta);
  g_ta = NULL;
}

static int make(struct tc_region *t, struct shm_reg *s, uint32_t ordering,
                uint64_t epoch) {
  int rc;
  memset(&s->r, 0, sizeof(s->r));
  s->r.fd = -1;
  rc = lynx_transport_shm.region_alloc(g_ta, &s->r, s->name, t->g.region_size);
  if (!rc)
    rc = lynx_region_format(&s->r, TC_Q, TC_S, TC_Z, ordering, epoch,
                            TC_ACCEL);
  if (!rc)
    rc = lynx_transport_shm.region_export(&s->r);
  if (rc)
    return rc;
  fill(t, s, ordering, epoch);
  return 0;
}

static int shm_region_new(struct tc_region *t, uint32_t ordering,
                          uint64_t epoch) {
  struct shm_reg *s = calloc(1, sizeof(*s));
  memset(t, 0, sizeof(*t));
  if (!s)
    return -ENOMEM;
  t->priv = s;
  s->r.fd = -1;
  if (lynx_geom_init(&t->g, TC_Q, TC_S, TC_Z))
    return -EINVAL;
  ut_shm_new_name(s->name, sizeof(s->name));
  return make(t, s, ordering, epoch);
}

/* The same file name again: what an agent restarting the instance does. */
static int shm_region_renew(struct tc_region *t, uint64_t epoch) {
  struct shm_reg *s = t->priv;
  lynx_transport_shm.region_free(&s->r);
  return make(t, s, t->d.ordering, epoch);
}

static void shm_region_free(struct tc_region *t) {
  struct shm_reg *s = t->priv;
  if (!s)
    return;
  lynx_transport_shm.region_free(&s->r);
  free(s);
  t->priv = NULL;
  t->mem = NULL;
}

static int shm_connect(const struct lynx_region_desc *d,
                       struct lynx_tconn **out) {
  return lynx_transport_shm.connect(d, out);
}

static int shm_main(int (*run)(void)) {
  return ut_shm_main("transport_conformance_shm", run);
}

const struct tc_backend tc_backend = {
    .name = "shm",
    .ops = &lynx_transport_shm,
    .caps = 0,
    .err = {.wrong_key = 0, .stale_epoch = -EPROTO, .bad_desc = -EPROTO,
            .gone = -ENOENT},
    .reads_max = 1000,
    .main = shm_main,
    .start = shm_start,
    .stop = shm_stop,
    .region_new = shm_region_new,
    .region_renew = shm_region_renew,
    .region_free = shm_region_free,
    .connect = shm_connect,
};
