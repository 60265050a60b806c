/*
 * conformance_tcp.c - the tcp backend's harness for the transport
 * conformance suite (transport_conformance.h): its agent side runs in this
 * process on 127.0.0.1 (one server thread, started once for the run), and
 * the accelerator's view of a region is the agent's anonymous memory.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport_conformance.h"

static struct lynx_transport_agent *g_ta; /* the agent side's handle */

static int tcp_start(void) {
  char err[256];
  if (lynx_transport_tcp.agent_create(
          &(struct lynx_transport_opts){.listen = "127.0.0.1:0"}, &g_ta, err,
          sizeof(err))) {
    fprintf(stderr, "agent_create: %s\n", err);
    return -1;
  }
  return 0;
}

static void tcp_stop(void) {
  lynx_transport_tcp.agent_destroy(g_ta);
  g_ta = NULL;
}

static int make(struct tc_region *t, struct lynx_region *r, uint32_t ordering,
                uint64_t epoch) {
  struct lynx_region_desc *d = &t->d;
  int rc;
  memset(r, 0, sizeof(*r));
  r->fd = -1;
  rc = lynx_transport_tcp.region_alloc(g_ta, r, "ut", t->g.region_size);
  if (!rc)
    rc = lynx_region_format(r, TC_Q, TC_S, TC_Z, ordering, epoch, TC_ACCEL);
  if (!rc)
    rc = lynx_transport_tcp.region_export(r);
  if (rc)
    return rc;
  t->mem = r->base;
  memset(d, 0, sizeof(*d));
  d->accel_id = TC_ACCEL;
  snprintf(d->transport, sizeof(d->transport), "tcp");
  snprintf(d->locator, sizeof(d->locator), "%s", r->locator);
  d->region_size = t->g.region_size;
  d->epoch = epoch;
  d->n_mqueues = TC_Q;
  d->slots = TC_S;
  d->slot_size = TC_Z;
  d->ordering = ordering;
  d->key = r->key;
  return 0;
}

static int tcp_region_new(struct tc_region *t, uint32_t ordering,
                          uint64_t epoch) {
  struct lynx_region *r = calloc(1, sizeof(*r));
  memset(t, 0, sizeof(*t));
  if (!r)
    return -ENOMEM;
  r->fd = -1;
  t->priv = r;
  if (lynx_geom_init(&t->g, TC_Q, TC_S, TC_Z))
    return -EINVAL;
  return make(t, r, ordering, epoch);
}

/* A restarted region is served at the same port with a new key. */
static int tcp_region_renew(struct tc_region *t, uint64_t epoch) {
  struct lynx_region *r = t->priv;
  lynx_transport_tcp.region_free(r);
  return make(t, r, t->d.ordering, epoch);
}

static void tcp_region_free(struct tc_region *t) {
  struct lynx_region *r = t->priv;
  if (!r)
    return;
  lynx_transport_tcp.region_free(r);
  free(r);
  t->priv = NULL;
  t->mem = NULL;
}

static int tcp_connect(const struct lynx_region_desc *d,
                       struct lynx_tconn **out) {
  return lynx_transport_tcp.connect(d, out);
}

const struct tc_backend tc_backend = {
    .name = "tcp",
    .ops = &lynx_transport_tcp,
    .caps = TC_CAP_KEY | TC_CAP_WAIT_FD | TC_CAP_FREE_DROPS,
    .err = {.wrong_key = -ESTALE, .stale_epoch = -ESTALE, .bad_desc = -EPROTO,
            .gone = -ESTALE},
    .reads_max = 5000,
    .start = tcp_start,
    .stop = tcp_stop,
    .region_new = tcp_region_new,
    .region_renew = tcp_region_renew,
    .region_free = tcp_region_free,
    .connect = tcp_connect,
};
