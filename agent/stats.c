/*
 * stats.c - what the agent samples from its accelerators' instances beside
 * their counters: accelerator-stamped latency (common/lathist.h) and the
 * copies the transport made into accelerator memory.
 *
 * Each accelerator stamps its requests with its own clock: when first seen
 * in the RX ring, when taken, when answered. Its backend keeps the
 * histograms (a GPU's in the kernel's control block, a CPU accelerator's
 * per thread; accel.h, latency); the agent reads them with the health
 * timer (HEALTH_MS), adds those of instances that stopped, and
 *   - exports them on --metrics as lynx_agent_accel_queue_seconds and
 *     lynx_agent_accel_service_seconds (Prometheus histograms, totals);
 *   - reports p50 and p99 over a recent window in every heartbeat, which
 *     `lynxctl accelerators` shows. The window is what was taken since a
 *     snapshot 10 to 20 s old: recent enough to follow a change in load,
 *     long enough for a p99 at modest rates.
 * docs/metrics.md, "Accelerator latency". Copies (tcp into GPU memory):
 * lynx_agent_accel_copies_total and friends, docs/gpu.md.
 */
#include <stddef.h>
#include <string.h>

#include "agent.h"
#include "log.h"
#include "prom.h"

#define WINDOW_NS (10ull * 1000000000ull)

static void copies_add(struct lynx_accel_copies *t,
                       const struct lynx_accel_copies *c) {
  t->staging_bytes += c->staging_bytes;
  t->writes += c->writes;
  t->reads += c->reads;
  t->copies += c->copies;
  t->merged += c->merged;
  t->syncs += c->syncs;
  t->staging_waits += c->staging_waits;
  t->unstaged += c->unstaged;
}

/* The accelerator's totals: instances that stopped plus running ones. */
static void accel_total(struct agent *ag, uint32_t accel, struct lynx_lat *t,
                        struct lynx_accel_copies *ct) {
  struct lynx_lat cur;
  struct lynx_accel_copies cc;
  *t = ag->acc[accel].done;
  *ct = ag->acc[accel].cdone;
  ct->staging_bytes = 0; /* of running instances only */
  for (struct instance *in = ag->instances; in; in = in->next) {
    if (in->accel != accel || !in->running)
      continue;
    /* an error leaves the last histograms read: still totals */
    in->run->ops->latency(in->run, &cur);
    lynx_lat_merge(&t->queue, &cur.queue);
    lynx_lat_merge(&t->service, &cur.service);
    in->run->ops->copies(in->run, &cc);
    copies_add(ct, &cc);
  }
}

void agent_stats_keep(struct agent *ag, struct instance *in) {
  struct agent_accel *a = &ag->acc[in->accel];
  struct lynx_lat last;
  struct lynx_accel_copies cc;
  in->run->ops->latency(in->run, &last);
  lynx_lat_merge(&a->done.queue, &last.queue);
  lynx_lat_merge(&a->done.service, &last.service);
  in->run->ops->copies(in->run, &cc);
  copies_add(&a->cdone, &cc);
}

void agent_stats_sample(struct agent *ag, uint64_t now_ns) {
  struct lynx_lat t;
  struct lynx_accel_copies ct;
  for (uint32_t i = 0; i < ag->n_acc; i++) {
    struct agent_accel *a = &ag->acc[i];
    accel_total(ag, i, &t, &ct);
    if (!a->mid_ns || now_ns - a->mid_ns >= WINDOW_NS) {
      a->old = a->mid; /* zero at first: the window starts at the start */
      a->mid = t;
      a->mid_ns = now_ns;
    }
    a->q.queue_p50 = lynx_lat_quantile(&t.queue, &a->old.queue, 0.5,
                                       &a->q.window_requests);
    a->q.queue_p99 = lynx_lat_quantile(&t.queue, &a->old.queue, 0.99, NULL);
    a->q.service_p50 = lynx_lat_quantile(&t.service, &a->old.service, 0.5,
                                         NULL);
    a->q.service_p99 = lynx_lat_quantile(&t.service, &a->old.service, 0.99,
                                         NULL);
    pthread_mutex_lock(&ag->lat_lock);
    a->pub = t;
    a->cpub = ct;
    pthread_mutex_unlock(&ag->lat_lock);
  }
}

/* The copy counters, one family each, by accelerator. */
static void copies_metrics(struct agent *ag, FILE *f) {
  static const struct {
    const char *name, *type, *help;
    size_t off;
  } m[] = {
      {"lynx_agent_accel_region_writes_total", "counter",
       "Writes the transport's agent made into the accelerator's own memory "
       "for frontends (tcp into GPU memory; 0 where it stores directly).",
       offsetof(struct lynx_accel_copies, writes)},
      {"lynx_agent_accel_region_reads_total", "counter",
       "Reads the transport's agent made out of the accelerator's own memory.",
       offsetof(struct lynx_accel_copies, reads)},
      {"lynx_agent_accel_copies_total", "counter",
       "Copies (cudaMemcpyAsync) those writes and reads took; merged writes "
       "share one.",
       offsetof(struct lynx_accel_copies, copies)},
      {"lynx_agent_accel_copy_syncs_total", "counter",
       "Stream synchronisations the agent waited for: one per batch of "
       "reads, none for writes.",
       offsetof(struct lynx_accel_copies, syncs)},
      {"lynx_agent_accel_staging_waits_total", "counter",
       "Waits for a copy still reading the pinned staging ring where it "
       "wrapped.",
       offsetof(struct lynx_accel_copies, staging_waits)},
      {"lynx_agent_accel_unstaged_total", "counter",
       "Accesses the staging ring could not take (copied from or to the "
       "agent's own buffers).",
       offsetof(struct lynx_accel_copies, unstaged)},
  };
  for (size_t k = 0; k < sizeof(m) / sizeof(m[0]); k++) {
    lynx_prom_family(f, m[k].name, m[k].type, m[k].help);
    for (uint32_t i = 0; i < ag->n_acc; i++) {
      char idx[16];
      uint64_t v;
      snprintf(idx, sizeof(idx), "%u", i);
      pthread_mutex_lock(&ag->lat_lock);
      memcpy(&v, (const uint8_t *)&ag->acc[i].cpub + m[k].off, sizeof(v));
      pthread_mutex_unlock(&ag->lat_lock);
      lynx_prom_u64(f, m[k].name,
                    (const struct lynx_prom_label[]){
                        {"accel", idx},
                        {"kind", ag->acc[i].info.ops->kind},
                        {NULL, NULL}},
                    v);
    }
  }
}

void agent_stats_metrics(struct agent *ag, FILE *f) {
  static const struct {
    const char *name, *help;
    size_t off;
  } h[] = {
      {"lynx_agent_accel_queue_seconds",
       "Time a request waited in its RX ring, from when the accelerator "
       "first saw it to when it took it, by the accelerator's own clock "
       "(docs/metrics.md, \"Accelerator latency\").",
       offsetof(struct lynx_lat, queue)},
      {"lynx_agent_accel_service_seconds",
       "Time from taking a request to publishing its answer (or drop), by "
       "the accelerator's own clock.",
       offsetof(struct lynx_lat, service)},
  };
  for (size_t k = 0; k < sizeof(h) / sizeof(h[0]); k++) {
    lynx_prom_family(f, h[k].name, "histogram", h[k].help);
    for (uint32_t i = 0; i < ag->n_acc; i++) {
      char idx[16];
      struct lynx_lat_hist snap;
      snprintf(idx, sizeof(idx), "%u", i);
      pthread_mutex_lock(&ag->lat_lock);
      memcpy(&snap, (const uint8_t *)&ag->acc[i].pub + h[k].off, sizeof(snap));
      pthread_mutex_unlock(&ag->lat_lock);
      lynx_prom_histogram(f, h[k].name,
                          (const struct lynx_prom_label[]){
                              {"accel", idx},
                              {"kind", ag->acc[i].info.ops->kind},
                              {NULL, NULL}},
                          &snap);
    }
  }
  copies_metrics(ag, f);
}
