/*
 * ut_spec.h - a service spec for registry tests: UDP sockperf-echo on port,
 * 2 mqueues of 256 slots of 2 KiB per accelerator, on every eligible
 * accelerator (replicas 0) or on that many, selector "k=v,..." or NULL.
 * Include after <cmocka.h> and registry.h.
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

#endif
