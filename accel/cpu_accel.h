/*
 * cpu_accel.h - CPU-emulated accelerators (the paper's methodology, §6.3).
 *
 * Each emulated accelerator owns one mqueue region and runs the application
 * as T persistent polling threads; thread t serves mqueues q with
 * q % T == t. Polling is adaptive: a thread spins for spin_us after its last
 * request, then announces that it sleeps (region word `sleeping`) and waits
 * on the region's doorbell futex until the frontend rings it, or 50 ms pass.
 * work_us emulates processing time per request by spinning, as a busy
 * accelerator would be, or (work_sleep) by sleeping, which leaves the host's
 * cores free as an accelerator computing elsewhere does.
 *
 * The agent reaches these through the accelerator ops table (accel.h):
 * lynx_accel_cpu, at the end of cpu_accel.c, runs one struct
 * lynx_cpu_accel per instance.
 */
#ifndef LYNX_CPU_ACCEL_H
#define LYNX_CPU_ACCEL_H

#include <pthread.h>
#include <stdint.h>

#include "apps.h"
#include "lathist.h"
#include "util.h"
#include "wire.h"

struct lynx_cpu_accel;

struct lynx_cpu_thread {
  struct lynx_cpu_accel *acc;
  pthread_t tid;
  int started;
  uint32_t first_q, step;
  lynx_counter requests, responses, drops, bad, sleeps;
  struct lynx_lat lat; /* this thread's queueing and service times */
};

struct lynx_cpu_accel {
  uint8_t *region; /* formatted region (caller owns the memory) */
  const struct lynx_app *app;
  uint32_t work_us, spin_us, n_threads, id;
  int work_sleep; /* emulate work_us by sleeping instead of spinning */
  /* mqueues [0, n_server) are server mqueues the threads serve (0: all);
   * mqueue n_server + k is the client mqueue of back end backend_names[k] */
  uint32_t n_server;
  char (*backend_names)[LYNX_BACKEND_NAME_MAX];
  /* the app's ctx over the client mqueues; app_state: its start's */
  struct lynx_app_env env;
  void *app_state;
  uint64_t call_timeout_ns; /* 0: LYNX_CALL_TIMEOUT_NS */
  volatile int stop;
  /* Lease fence (NULL: none): a thread takes a new request only while
   * lynx_now_ns() is below *serve_until, which the agent moves forward as
   * its lease is renewed (docs/design.md, "Delivery guarantees"). A fenced
   * thread sleeps on the doorbell; lynx_cpu_accel_kick wakes it. */
  const uint64_t *serve_until;
  struct lynx_cpu_thread *threads;
  /* In a plug-in's process (agent/apphost.c), memory the agent reads too:
   * the threads' array (n_threads of them, zeroed; NULL: start allocates
   * it) and, per server mqueue, the position after the last request a
   * thread took (NULL: not kept), so that what a process that died had
   * in hand is known (lynx_cpu_accel_drop_taken). */
  struct lynx_cpu_thread *threads_mem;
  uint32_t *taken;
  /* 1: another process served this region before (and died): each
   * mqueue's TX large area is taken over as its unread answers hold it
   * (lynx_mq_tx_resume) */
  int resume;
};

/* Starts n_threads threads over an already formatted region. 0 or -errno;
 * on error nothing is left running. */
int lynx_cpu_accel_start(struct lynx_cpu_accel *a);

/* Stops and joins the threads; accepts a half-started accelerator. */
void lynx_cpu_accel_stop(struct lynx_cpu_accel *a);
/* Frees what start allocated; after stop (counters stay readable until). */
void lynx_cpu_accel_free(struct lynx_cpu_accel *a);

/* Wakes threads sleeping on the region's doorbell (after *serve_until
 * moved forward). */
void lynx_cpu_accel_kick(struct lynx_cpu_accel *a);

/* 1 while the lease fence stops new requests at time now. */
static inline int lynx_cpu_accel_fenced(const struct lynx_cpu_accel *a,
                                        uint64_t now) {
  return a->serve_until &&
         now >= __atomic_load_n(a->serve_until, __ATOMIC_ACQUIRE);
}

/* A region a process that died served (its threads gone), of geometry g
 * (the caller's own, never the region header's: the dead process could
 * write that): each server mqueue's requests it had taken and not
 * released (positions from rx_cons up to taken[q]) are dropped, their
 * tags freed (a drop needs a TX slot: one that finds none is released
 * unanswered, and the frontend's timeout frees its tag), so no request
 * runs twice. The number of them. */
uint64_t lynx_cpu_accel_drop_taken(uint8_t *region, const struct lynx_geom *g,
                                   uint32_t n_server, const uint32_t *taken);

/* Sums of the threads' counters. */
void lynx_cpu_accel_counters(const struct lynx_cpu_accel *a, uint64_t *req,
                             uint64_t *resp, uint64_t *drops, uint64_t *bad);

/* The threads' latency histograms, merged (lynx_now_ns nanoseconds). */
void lynx_cpu_accel_latency(const struct lynx_cpu_accel *a,
                            struct lynx_lat *out);

#endif
