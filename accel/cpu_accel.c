/*
 * cpu_accel.c - CPU accelerator threads (cpu_accel.h), and the CPU backend
 * of the accelerator ops table (accel.h, at the end): one instance is one
 * struct lynx_cpu_accel over a region the agent allocated in host memory.
 */
#include "cpu_accel.h"

#include <errno.h>
#include <sched.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "accel.h"
#include "bell.h"
#include "log.h"

struct mq_state {
  struct lynx_mq mq;
  uint32_t q;           /* its index in the region */
  struct lynx_msg held; /* a request the app could not answer yet (TX full) */
  int has_held;
  uint32_t bad_reported;
  uint64_t taken_ns;     /* when the request in hand was taken */
  struct lynx_seen seen; /* first-seen stamps (lathist.h) */
};

/* Spinning holds a core as a GPU kernel holds its SMs; sleeping leaves the
 * host's cores to others, as an accelerator computing elsewhere does (used
 * to emulate many accelerators on few cores). */
static void emulate_work(uint32_t us, int sleep) {
  uint64_t end;
  if (!us)
    return;
  if (sleep) {
    struct timespec ts = {us / 1000000u, (long)(us % 1000000u) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
      ;
    return;
  }
  end = lynx_now_ns() + (uint64_t)us * 1000u;
  while (lynx_now_ns() < end)
    lynx_cpu_relax();
}

/* One request through the app; 1 when it is finished with (its service
 * time stamped), 0 when TX was full and it must be retried. */
static int serve_one(struct lynx_cpu_thread *t, struct mq_state *s,
                     const struct lynx_msg *m) {
  int replied = 0;
  uint32_t prod = s->mq.tx_prod;
  int rc = lynx_app_handle(t->acc->app, &s->mq, m, &replied, &t->acc->env.ctx);
  uint64_t now;
  if (s->mq.tx_prod != prod)
    lynx_bell_after_publish(&s->mq, "CPU accelerator");
  if (rc == -EAGAIN)
    return 0;
  now = lynx_now_ns();
  lynx_lat_add(&t->lat.service, now > s->taken_ns ? now - s->taken_ns : 0);
  if (replied)
    lynx_cnt_add(&t->responses, 1);
  else
    lynx_cnt_add(&t->drops, 1);
  lynx_release(&s->mq);
  return 1;
}

static void *cpu_thread_main(void *arg) {
  struct lynx_cpu_thread *t = arg;
  struct lynx_cpu_accel *a = t->acc;
  const struct lynx_region_hdr *h = (const struct lynx_region_hdr *)a->region;
  uint32_t *sleeping = (uint32_t *)(a->region + LYNX_OFF_SLEEPING);
  uint32_t *bell = (uint32_t *)(a->region + LYNX_OFF_DOORBELL);
  struct lynx_geom g;
  uint32_t n = 0;
  struct mq_state *mqs;
  uint64_t idle_since = lynx_now_ns();

  prctl(PR_SET_TIMERSLACK, 1000UL); /* 1 us: wake promptly from the futex */
  if (lynx_geom_init(&g, h->n_mqueues, h->slots, h->slot_size,
                     h->large_bytes)) {
    LYNX_ERR("cpu-accel", "accel %u: region header has a bad geometry", a->id);
    return NULL;
  }
  mqs = calloc(g.n_mqueues, sizeof(*mqs));
  if (!mqs) {
    LYNX_ERR("cpu-accel", "accel %u: out of memory, thread not serving", a->id);
    return NULL;
  }
  for (uint32_t q = t->first_q; q < a->n_server; q += t->step) {
    lynx_mq_bind(&mqs[n].mq, a->region, &g, q);
    if (a->resume)
      lynx_mq_tx_resume(&mqs[n].mq);
    mqs[n].q = q;
    mqs[n].seen.pos = mqs[n].seen.acq = mqs[n].mq.rx_head;
    n++;
  }

  while (!a->stop) {
    int work = 0, fenced = 0;
    uint64_t now = lynx_now_ns();
    /* first-seen stamps for the whole pass, before any request is taken */
    for (uint32_t i = 0; i < n; i++)
      lynx_seen_scan(&mqs[i].seen, &mqs[i].mq, now);
    for (uint32_t i = 0; i < n; i++) {
      struct mq_state *s = &mqs[i];
      struct lynx_msg m;
      /* one request per mqueue per pass: requests spread over the mqueues
       * in arrival order are answered in that order, and none starves */
      for (int k = 0; k < 1; k++) {
        if (s->has_held) {
          if (!serve_one(t, s, &s->held))
            break;
          s->has_held = 0;
          work++;
          continue;
        }
        /* checked right before each request is taken, so that none is
         * taken once the agent's lease may have run out */
        if (lynx_cpu_accel_fenced(a, lynx_now_ns())) {
          fenced = 1;
          break;
        }
        if (lynx_recv(&s->mq, &m) != 0)
          break;
        if (a->taken) /* before anything of it runs */
          __atomic_store_n(&a->taken[s->q], s->mq.rx_head, __ATOMIC_RELEASE);
        lynx_cnt_add(&t->requests, 1);
        now = lynx_now_ns();
        s->taken_ns = now;
        lynx_lat_add(&t->lat.queue,
                     now - lynx_seen_at(&s->seen, s->mq.rx_head - 1u, now));
        emulate_work(a->work_us, a->work_sleep);
        if (!serve_one(t, s, &m)) {
          s->held = m;
          s->has_held = 1;
          break;
        }
        work++;
      }
      if (s->mq.bad != s->bad_reported) {
        lynx_cnt_add(&t->bad, s->mq.bad - s->bad_reported);
        s->bad_reported = s->mq.bad;
        LYNX_LOG_RL(LYNX_LOG_WARN, "cpu-accel",
                    "accel %u: skipped malformed request slots (%u so far)",
                    a->id, s->bad_reported);
      }
    }
    if (work) {
      idle_since = lynx_now_ns();
      continue;
    }
    if (lynx_now_ns() - idle_since < (uint64_t)a->spin_us * 1000u) {
      sched_yield();
      continue;
    }
    /* Sleep protocol (docs/mqueue.md "Doorbells"). */
    uint32_t v = __atomic_load_n(bell, __ATOMIC_SEQ_CST);
    __atomic_fetch_add(sleeping, 1, __ATOMIC_SEQ_CST);
    int ready = 0, timed_out = 0;
    /* fenced, waiting requests are no reason to stay awake: the agent kicks
     * the doorbell when its lease is renewed */
    for (uint32_t i = 0; i < n && !ready; i++)
      ready = mqs[i].has_held || (!fenced && lynx_mq_rx_ready(&mqs[i].mq));
    if (!ready && !a->stop) {
      struct timespec ts = {0, 50 * 1000 * 1000};
      lynx_cnt_add(&t->sleeps, 1);
      timed_out = syscall(SYS_futex, bell, FUTEX_WAIT, v, &ts, NULL, 0) != 0 &&
                  errno == ETIMEDOUT;
    }
    __atomic_fetch_sub(sleeping, 1, __ATOMIC_SEQ_CST);
    /* rung: spin a while, requests come in bursts; the nap's end with
     * nothing rung: one look at the mqueues and back to sleep, no spin (an
     * idle instance's thread spun spin_us every 50 ms: with hundreds of
     * idle services, most of a core; issue 38) */
    idle_since = timed_out ? 0 : lynx_now_ns();
  }
  free(mqs);
  return NULL;
}

int lynx_cpu_accel_start(struct lynx_cpu_accel *a) {
  const struct lynx_region_hdr *h = (const struct lynx_region_hdr *)a->region;
  struct lynx_client *clients = NULL;
  uint32_t n_clients;
  struct lynx_geom g;
  if (!a->n_server || a->n_server > h->n_mqueues)
    a->n_server = h->n_mqueues;
  if (a->n_threads == 0 || a->n_threads > a->n_server)
    a->n_threads = a->n_threads ? a->n_server : 1;
  if (lynx_geom_init(&g, h->n_mqueues, h->slots, h->slot_size, h->large_bytes))
    return -EINVAL;
  /* the threads ring response doorbells (before the region is advertised:
   * a frontend that connects sees the flag) */
  ((struct lynx_region_hdr *)a->region)->flags |= LYNX_HDR_RESP_BELL;
  n_clients = h->n_mqueues - a->n_server;
  if (n_clients) {
    clients = calloc(n_clients, sizeof(*clients));
    if (!clients)
      return -ENOMEM;
    for (uint32_t k = 0; k < n_clients; k++) {
      struct lynx_client *c = &clients[k];
      lynx_mq_bind(&c->mq, a->region, &g, a->n_server + k);
      if (a->resume)
        lynx_mq_tx_resume(&c->mq);
      pthread_mutex_init(&c->lock, NULL);
      /* from a point of its own: a late reply to a call of a process
       * that served this region before (apphost.c) is not taken for a
       * call of this one */
      c->next_tag = (uint32_t)(lynx_now_ns() * 2654435761u) ^ k;
      if (a->backend_names)
        snprintf(c->name, sizeof(c->name), "%s", a->backend_names[k]);
    }
  }
  lynx_app_env_init(&a->env, a->app, clients, n_clients, a->app_state, &a->stop,
                    a->call_timeout_ns ? a->call_timeout_ns
                                       : LYNX_CALL_TIMEOUT_NS);
  a->stop = 0;
  a->threads = a->threads_mem ? a->threads_mem
                              : calloc(a->n_threads, sizeof(*a->threads));
  if (!a->threads) {
    lynx_cpu_accel_free(a); /* the client mqueues */
    return -ENOMEM;
  }
  /* memory of a process that died: its threads are not ours (their
   * counters go on) */
  for (uint32_t i = 0; a->threads_mem && i < a->n_threads; i++)
    a->threads[i].started = 0;
  for (uint32_t i = 0; i < a->n_threads; i++) {
    struct lynx_cpu_thread *t = &a->threads[i];
    int rc;
    t->acc = a;
    t->first_q = i;
    t->step = a->n_threads;
    rc = pthread_create(&t->tid, NULL, cpu_thread_main, t);
    if (rc) {
      lynx_cpu_accel_stop(a);
      lynx_cpu_accel_free(a);
      return -rc;
    }
    t->started = 1;
  }
  return 0;
}

void lynx_cpu_accel_kick(struct lynx_cpu_accel *a) {
  uint32_t *bell = (uint32_t *)(a->region + LYNX_OFF_DOORBELL);
  __atomic_fetch_add(bell, 1, __ATOMIC_SEQ_CST);
  syscall(SYS_futex, bell, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

void lynx_cpu_accel_stop(struct lynx_cpu_accel *a) {
  if (!a->threads)
    return;
  a->stop = 1;
  lynx_cpu_accel_kick(a);
  for (uint32_t i = 0; i < a->n_threads; i++)
    if (a->threads[i].started)
      pthread_join(a->threads[i].tid, NULL);
}

void lynx_cpu_accel_free(struct lynx_cpu_accel *a) {
  if (a->threads != a->threads_mem)
    free(a->threads);
  a->threads = NULL;
  for (uint32_t k = 0; a->env.clients && k < a->env.n_clients; k++)
    pthread_mutex_destroy(&a->env.clients[k].lock);
  free(a->env.clients);
  a->env.clients = NULL;
}

uint64_t lynx_cpu_accel_drop_taken(uint8_t *region, const struct lynx_geom *g,
                                   uint32_t n_server, const uint32_t *taken) {
  uint64_t dropped = 0;
  for (uint32_t q = 0; q < n_server && q < g->n_mqueues; q++) {
    uint32_t end = __atomic_load_n(&taken[q], __ATOMIC_ACQUIRE);
    struct lynx_mq mq;
    struct lynx_msg m;
    lynx_mq_bind(&mq, region, g, q);
    if (end - mq.rx_cons > g->slots) /* never taken, or another lap's */
      continue;
    /* by position: malformed slots the dead process skipped are skipped
     * again, not counted */
    while (mq.rx_head != end && lynx_recv(&mq, &m) == 0) {
      (void)lynx_drop(&mq, m.tag); /* -EAGAIN: its tag expires instead */
      lynx_release(&mq);
      dropped++;
    }
    lynx_bell_after_publish(&mq, "a plug-in's takeover");
  }
  return dropped;
}

void lynx_cpu_accel_counters(const struct lynx_cpu_accel *a, uint64_t *req,
                             uint64_t *resp, uint64_t *drops, uint64_t *bad) {
  *req = *resp = *drops = *bad = 0;
  for (uint32_t i = 0; a->threads && i < a->n_threads; i++) {
    *req += lynx_cnt_get(&a->threads[i].requests);
    *resp += lynx_cnt_get(&a->threads[i].responses);
    *drops += lynx_cnt_get(&a->threads[i].drops);
    *bad += lynx_cnt_get(&a->threads[i].bad);
  }
}

void lynx_cpu_accel_latency(const struct lynx_cpu_accel *a,
                            struct lynx_lat *out) {
  memset(out, 0, sizeof(*out));
  for (uint32_t i = 0; a->threads && i < a->n_threads; i++) {
    lynx_lat_merge(&out->queue, &a->threads[i].lat.queue);
    lynx_lat_merge(&out->service, &a->threads[i].lat.service);
  }
}

/* ---- the CPU backend (accel.h) --------------------------------------- */

struct cpu_inst {
  struct lynx_accel_inst base;
  struct lynx_cpu_accel cpu;
};

#define CPU_ACCELS_MAX 4096u /* far above what the agent's options allow */

/* spec: how many CPU-emulated accelerators (--cpu-accels). */
static int cpu_discover(const char *spec, const struct lynx_transport_ops *tops,
                        enum lynx_region_where mem, struct lynx_accel_dev **out,
                        uint32_t *n, char *err, size_t errlen) {
  char *end;
  unsigned long v = strtoul(spec, &end, 10);
  struct lynx_accel_dev *a;
  (void)tops; /* host memory: every transport reaches it */
  *out = NULL;
  *n = 0;
  if (end == spec || *end || v > CPU_ACCELS_MAX) {
    snprintf(err, errlen, "--cpu-accels '%s': expected a count up to %u", spec,
             CPU_ACCELS_MAX);
    return -EINVAL;
  }
  if (!v)
    return 0;
  a = calloc(v, sizeof(*a));
  if (!a) {
    snprintf(err, errlen, "--cpu-accels: out of memory");
    return -ENOMEM;
  }
  for (uint32_t i = 0; i < v; i++) {
    a[i].ops = &lynx_accel_cpu;
    a[i].device = (int)i;
    snprintf(a[i].model, sizeof(a[i].model), "cpu-emulated");
    a[i].ordering = LYNX_ORDER_COALESCED; /* stores to host memory */
    a[i].numa_node = -1;                  /* the threads' own memory */
    snprintf(a[i].where, sizeof(a[i].where), "CPU-emulated %u", i);
  }
  *out = a;
  *n = (uint32_t)v;
  return 0;
}

static int cpu_runs_app(const struct lynx_accel_dev *a,
                        const struct lynx_app *app) {
  (void)a;
  /* every app but a GPU module is C code the threads run (a plug-in's
   * through its process: apphost.c) */
  return !app->image;
}

/* A CPU runs no device code. */
static int cpu_adopt(const struct lynx_accel_dev *devs, uint32_t n,
                     struct lynx_app *app, char *why, size_t whylen) {
  (void)devs, (void)n, (void)app, (void)why, (void)whylen;
  return -ENOTSUP;
}

/* One client mqueue per back end: the threads share it, one call at a
 * time (struct lynx_client's lock). */
static int cpu_client_mqs(const struct lynx_accel_launch *l,
                          uint32_t *per_backend, char *why, size_t whylen) {
  (void)l;
  (void)why;
  (void)whylen;
  *per_backend = 1;
  return 0;
}

static int cpu_start(const struct lynx_accel_launch *l, struct lynx_region *r,
                     struct lynx_accel_inst **out, char *why, size_t whylen) {
  struct cpu_inst *ci;
  struct lynx_cpu_accel *c;
  int rc;
  (void)r; /* the caller's, in host memory: l->region */
  *out = NULL;
  if (!l->app->def) { /* a GPU module's (or a plug-in's process's) */
    snprintf(why, whylen, "application '%s' %s", l->app->name,
             l->app->image ? "is a GPU application (a CUDA module): it runs "
                             "on GPUs only"
                           : "runs in its plug-in's process, not here");
    return -ENOTSUP;
  }
  ci = calloc(1, sizeof(*ci));
  if (!ci) {
    snprintf(why, whylen, "cannot start threads: %s", strerror(ENOMEM));
    return -ENOMEM;
  }
  ci->base.ops = &lynx_accel_cpu;
  c = &ci->cpu;
  c->region = l->region;
  c->app = l->app;
  c->app_state = l->app_state;
  c->work_us = l->work_us;
  c->n_server = l->n_server;
  c->backend_names = l->backends;
  c->work_sleep = l->work_sleep;
  c->spin_us = l->spin_us;
  c->n_threads = l->cpu_threads;
  c->id = l->accel_id;
  c->serve_until = l->serve_until;
  rc = lynx_cpu_accel_start(c);
  if (rc) {
    snprintf(why, whylen, "cannot start threads: %s", strerror(-rc));
    lynx_cpu_accel_free(c); /* what start left allocated */
    free(ci);
    return rc;
  }
  *out = &ci->base;
  return 0;
}

static int cpu_fence(struct lynx_accel_inst *in, uint64_t serve_until_ns,
                     int wake) {
  struct cpu_inst *ci = container_of(in, struct cpu_inst, base);
  (void)serve_until_ns; /* the threads read *serve_until themselves */
  if (wake)
    lynx_cpu_accel_kick(&ci->cpu);
  return 0;
}

static int cpu_counters(struct lynx_accel_inst *in, uint64_t *req,
                        uint64_t *resp, uint64_t *drops, uint64_t *bad) {
  struct cpu_inst *ci = container_of(in, struct cpu_inst, base);
  lynx_cpu_accel_counters(&ci->cpu, req, resp, drops, bad);
  return 0;
}

static int cpu_latency(struct lynx_accel_inst *in, struct lynx_lat *out) {
  lynx_cpu_accel_latency(&container_of(in, struct cpu_inst, base)->cpu, out);
  return 0;
}

/* Host memory: the transports reach it with loads and stores. */
static void cpu_copies(struct lynx_accel_inst *in,
                       struct lynx_accel_copies *out) {
  (void)in;
  memset(out, 0, sizeof(*out));
}

static int cpu_stop(struct lynx_accel_inst *in) {
  lynx_cpu_accel_stop(&container_of(in, struct cpu_inst, base)->cpu);
  return 0;
}

static void cpu_put(struct lynx_accel_inst *in) {
  struct cpu_inst *ci = container_of(in, struct cpu_inst, base);
  lynx_cpu_accel_free(&ci->cpu);
  free(ci);
}

/* Host threads: nothing to lose or fail short of the process. */
static void cpu_health(const struct lynx_accel_dev *a, int *lost, int *failed,
                       char *err, size_t errlen) {
  (void)a;
  *lost = 0;
  *failed = 0;
  if (errlen)
    err[0] = 0;
}

/* A CPU accelerator's threads have no resident-block budget. */
static int cpu_blocks(const struct lynx_accel_dev *a, uint32_t threads,
                      uint32_t *resident, uint32_t *held) {
  (void)a;
  (void)threads;
  *resident = *held = 0;
  return 0;
}

static void cpu_shutdown(void) {}

const struct lynx_accel_ops lynx_accel_cpu = LYNX_ACCEL_OPS("cpu", "CPU", cpu);
