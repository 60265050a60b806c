/*
 * ut_spec.h - a service spec for registry tests: UDP sockperf-echo on port,
 * 2 mqueues of 256 slots of 2 KiB per accelerator, on every eligible
 * accelerator (replicas 0) or on that many, selector "k=v,..." or NULL;
 * and the descriptor of an instance's region (ut_desc_for). Include after
 * <cmocka.h> and registry.h.
 */
#ifndef LYNX_UT_SPEC_H
#define LYNX_UT_SPEC_H

#include <stdio.h>
#include <string.h>

static inline struct lynx_service_spec ut_spec(const char *name, uint32_t port,
                                               uint32_t replicas,
                                               const char *selector) {
  struct lynx_service_spec s;
  memset(&s, 0, sizeof(s));
  snprintf(s.name, sizeof(s.name), "%s", name);
  snprintf(s.proto, sizeof(s.proto), "udp");
  s.port = port;
  snprintf(s.app, sizeof(s.app), "sockperf-echo");
  s.slot_size = 2048;
  s.slots = 256;
  s.mqueues_per_accel = 2;
  s.placement = replicas ? LYNX_PLACE_REPLICAS : LYNX_PLACE_ALL;
  s.replicas = replicas;
  if (selector)
    assert_int_equal(
        lynx_labels_parse(selector, s.selector, LYNX_LABELS_MAX, &s.n_selector),
        0);
  return s;
}

/* The descriptor an agent reports for instance i (InstanceReady): a shm
 * region of region_size bytes with i's service geometry. */
static inline struct lynx_region_desc
ut_desc_for(const struct lynx_reg_instance *i, uint64_t region_size) {
  struct lynx_region_desc d;
  memset(&d, 0, sizeof(d));
  d.accel_id = i->accel_idx;
  snprintf(d.transport, sizeof(d.transport), "shm");
  snprintf(d.locator, sizeof(d.locator), "/lynx-%llu",
           (unsigned long long)i->id);
  d.region_size = region_size;
  d.epoch = i->node->epoch;
  d.n_mqueues = i->svc->spec.mqueues_per_accel;
  d.slot_size = i->svc->spec.slot_size;
  d.slots = i->svc->spec.slots;
  return d;
}

#endif
