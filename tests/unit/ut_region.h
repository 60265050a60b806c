/*
 * ut_region.h - test fixtures for the transport tests: a struct lynx_region
 * that is empty or plain process memory, the descriptor an agent advertises
 * for a formatted region, a backend's agent side created for a test, and a
 * field-by-field descriptor comparison. The same few lines every transport
 * test needs, written once so that a change of the descriptor or of
 * agent_create touches one place.
 *
 * Header-only; include after <cmocka.h>. Used by test_transport_common.c,
 * test_transport_{shm,tcp,rdma}.c, test_cuda_backend.c, the conformance
 * suite (transport_conformance.c) and its rdma harness (via fake_verbs.h).
 */
#ifndef LYNX_UT_REGION_H
#define LYNX_UT_REGION_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mqueue.h"
#include "transport.h"

/* The geometry (UT_Q mqueues of UT_S slots of UT_Z bytes) and identity a
 * transport test formats its regions with where it needs no other; the
 * conformance suite's TC_* are the same. */
#define UT_Q 2u
#define UT_S 8u
#define UT_Z 256u
#define UT_EPOCH 0x5EED0000CAFEull
#define UT_ACCEL 3u

/* A region with nothing behind it yet: what region_alloc/region_free and
 * the fixtures' teardowns take as "not allocated". */
static inline void ut_region_empty(struct lynx_region *r) {
  memset(r, 0, sizeof(*r));
  r->fd = -1;
}

/* r over size zeroed, 4096-aligned bytes of process memory (the caller
 * frees r->base). 0 or -ENOMEM. */
static inline int ut_region_mem(struct lynx_region *r, uint64_t size) {
  ut_region_empty(r);
  r->base = aligned_alloc(4096, size);
  if (!r->base)
    return -ENOMEM;
  memset(r->base, 0, size);
  r->size = size;
  return 0;
}

/* The descriptor an agent of transport advertises for a region of geometry
 * g at locator, formatted with epoch, ordering and accel. No key, remote
 * address or rkeys: a caller whose backend has them sets them after. */
static inline void ut_desc_fill(struct lynx_region_desc *d,
                                const char *transport, const char *locator,
                                const struct lynx_geom *g, uint32_t accel,
                                uint64_t epoch, uint32_t ordering) {
  memset(d, 0, sizeof(*d));
  d->accel_id = accel;
  snprintf(d->transport, sizeof(d->transport), "%s", transport);
  snprintf(d->locator, sizeof(d->locator), "%s", locator);
  d->region_size = g->region_size;
  d->epoch = epoch;
  d->n_mqueues = g->n_mqueues;
  d->slots = g->slots;
  d->slot_size = g->slot_size;
  d->large_bytes = g->large_bytes;
  d->ordering = ordering;
}

/* What an agent does before it advertises a region: allocates r from ta
 * under name, formats it with g's geometry, ordering, epoch and accel, and
 * exports it; d is then the descriptor a frontend connects with, the
 * region's key included (0 where the backend has none). 0 or -errno. */
static inline int ut_region_serve(const struct lynx_transport_ops *ops,
                                  struct lynx_transport_agent *ta,
                                  struct lynx_region *r, const char *name,
                                  const struct lynx_geom *g, uint32_t ordering,
                                  uint64_t epoch, uint32_t accel,
                                  struct lynx_region_desc *d) {
  int rc = ops->region_alloc(ta, r, name, g->region_size);
  if (!rc)
    rc = lynx_region_format(r, g->n_mqueues, g->slots, g->slot_size,
                            g->large_bytes, ordering, epoch, accel);
  if (!rc)
    rc = ops->region_export(r);
  if (rc)
    return rc;
  ut_desc_fill(d, ops->name, r->locator, g, accel, epoch, ordering);
  d->key = r->key;
  return 0;
}

/* The agent side of the backend called name, created with o; *ops is that
 * backend. Says why on stderr when it cannot be. 0 or -1. */
static inline int ut_agent_create(const char *name,
                                  const struct lynx_transport_opts *o,
                                  const struct lynx_transport_ops **ops,
                                  struct lynx_transport_agent **ta) {
  char err[256] = "";
  *ops = lynx_transport_find(name);
  if (!*ops) {
    fprintf(stderr, "no transport '%s'\n", name);
    return -1;
  }
  if ((*ops)->agent_create(o, ta, err, sizeof(err))) {
    fprintf(stderr, "agent_create: %s\n", err);
    return -1;
  }
  return 0;
}

/* The tcp agent side on 127.0.0.1 at a port the kernel picks, for a whole
 * test file; bound gets the address it listens on. 0 or -1. */
static inline int ut_tcp_agent(const struct lynx_transport_ops **ops,
                               struct lynx_transport_agent **ta, char *bound,
                               size_t n) {
  if (ut_agent_create("tcp",
                      &(struct lynx_transport_opts){.listen = "127.0.0.1:0"},
                      ops, ta))
    return -1;
  snprintf(bound, n, "%s", (*ta)->bound);
  return 0;
}

static inline void ut_assert_desc_equal(const struct lynx_region_desc *a,
                                        const struct lynx_region_desc *b) {
  assert_int_equal(a->accel_id, b->accel_id);
  assert_string_equal(a->transport, b->transport);
  assert_string_equal(a->locator, b->locator);
  assert_true(a->region_size == b->region_size);
  assert_true(a->epoch == b->epoch);
  assert_int_equal(a->n_mqueues, b->n_mqueues);
  assert_int_equal(a->slot_size, b->slot_size);
  assert_int_equal(a->slots, b->slots);
  assert_int_equal(a->ordering, b->ordering);
  assert_true(a->key == b->key);
  assert_true(a->remote_addr == b->remote_addr);
  assert_memory_equal(a->rkeys, b->rkeys, sizeof(a->rkeys));
  assert_string_equal(a->shm_locator, b->shm_locator);
  assert_string_equal(a->host_id, b->host_id);
  assert_string_equal(a->netns_id, b->netns_id);
}

#endif
