/*
 * spin.h - the adaptive wait's rule (frontend/worker.c, docs/design.md
 * "Adaptive polling"): whether a worker that found no work spins for the
 * next piece of it or sleeps, and for how long; header-only, so that the
 * rule is tested alone (tests/unit/test_spin.c).
 */
#ifndef LYNX_FE_SPIN_H
#define LYNX_FE_SPIN_H

#include <stdint.h>

/* Adaptive polling. A sleep in ppoll and the wake-up after it cost the
 * worker CPU and add to the latency of the work that ends it: a few
 * microseconds on bare metal, 20 to 50 in a small VM (docs/design.md).
 * Spinning pays only for waits shorter than that: shorter than
 * SPIN_PAYS_NS, or than twice the observed lateness of a timed sleep. */
#define SPIN_PAYS_NS (20u * 1000u)
/* spin at most this many expected waits: a wait a little longer than the
 * estimate is still caught spinning, a much longer one is slept */
#define SPIN_WAITS 4u
/* The CPU a sleep and its wake-up cost the worker, before it measured one
 * (about what this 2-core VM measures: 10 us; a few on bare metal), and
 * the most one sample counts (a sleep preempted by another thread). */
#define WAKE_CPU_INIT_NS (10u * 1000u)
#define WAKE_CPU_MAX_NS (100u * 1000u)
/* A wait is spun for only while it is expected within this many
 * wake-ups' CPU: a sleep costs its wake-up's CPU and, on top, the latency
 * of being woken (which an expected wait measured from the last work
 * includes once the worker sleeps: a ping-pong that started sleeping
 * would stay asleep at a wait of 1 wake-up) */
#define SPIN_CPU_WAKES 3u
/* How long to spin (yielding) before sleeping in a wait whose expected
 * length is est_ns: a few expected waits where spinning pays both in
 * latency (the wait is shorter than a sleep and wake-up: SPIN_PAYS_NS, or
 * twice the lateness late_ns of a timed sleep) and in CPU (the spin is
 * expected to cost no more than SPIN_CPU_WAKES wake-ups of wake_cpu_ns
 * each: a slow machine's late timers make spinning pay in latency at any
 * moderate load, where the core spent spinning belongs to others); none
 * otherwise; never more than cap_ns (--spin-us). */
static inline uint64_t fe_spin_budget(uint64_t est_ns, uint64_t late_ns,
                                      uint64_t wake_cpu_ns, uint64_t cap_ns) {
  uint64_t b;
  if (est_ns >= SPIN_PAYS_NS && est_ns >= 2 * late_ns)
    return 0;
  if (est_ns > SPIN_CPU_WAKES * wake_cpu_ns)
    return 0;
  b = est_ns * SPIN_WAITS;
  return b < cap_ns ? b : cap_ns;
}

#endif
