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
 *
 * Fencing (docs/mqueue.md "Fencing"): each instance's region's fence, live
 * producers and fenced connections (lynx_region_fence_stats), sampled with
 * the health timer as well: lynx_agent_region_fence, _producers and
 * lynx_agent_fenced_connections_total.
 */
#include <stddef.h>
#include <stdlib.h>
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

/* Publishes every instance's fencing for --metrics (loop thread: it owns
 * the instances). Kept as it was when there is no memory for more. */
static void fence_sample(struct agent *ag) {
  struct agent_fence_pub *p;
  uint32_t n = 0, k = 0;
  for (struct instance *in = ag->instances; in; in = in->next)
    n++;
  pthread_mutex_lock(&ag->lat_lock);
  if (n > ag->fpub_cap) {
    p = realloc(ag->fpub, n * sizeof(*p));
    if (!p) {
      pthread_mutex_unlock(&ag->lat_lock);
      return;
    }
    ag->fpub = p;
    ag->fpub_cap = n;
  }
  for (struct instance *in = ag->instances; in; in = in->next, k++) {
    ag->fpub[k].instance = in->id;
    lynx_region_fence_stats(&in->region, &ag->fpub[k].s);
  }
  ag->n_fpub = k;
  pthread_mutex_unlock(&ag->lat_lock);
}

void agent_stats_free(struct agent *ag) {
  free(ag->fpub);
  ag->fpub = NULL;
  ag->n_fpub = ag->fpub_cap = 0;
}

/* One gauge of every instance's fencing, labelled by instance. */
static void fence_family(struct agent *ag, FILE *f, const char *name,
                         const char *type, const char *help, size_t off) {
  lynx_prom_family(f, name, type, help);
  pthread_mutex_lock(&ag->lat_lock);
  for (uint32_t i = 0; i < ag->n_fpub; i++) {
    char id[24];
    uint64_t v;
    snprintf(id, sizeof(id), "%llu", (unsigned long long)ag->fpub[i].instance);
    memcpy(&v, (const uint8_t *)&ag->fpub[i].s + off, sizeof(v));
    lynx_prom_u64(
        f, name,
        (const struct lynx_prom_label[]){{"instance", id}, {NULL, NULL}}, v);
  }
  pthread_mutex_unlock(&ag->lat_lock);
}

static void fence_metrics(struct agent *ag, FILE *f) {
  static const char fenced[] = "lynx_agent_fenced_connections_total";
  fence_family(ag, f, "lynx_agent_region_fence", "gauge",
               "The newest frontend epoch the instance's region admitted as "
               "its producer (0: none; docs/mqueue.md \"Fencing\").",
               offsetof(struct lynx_fence_stats, fence));
  fence_family(ag, f, "lynx_agent_region_producers", "gauge",
               "Live data connections of the instance's region admitted at "
               "its fence (shm: 0, frontends map the region themselves).",
               offsetof(struct lynx_fence_stats, producers));
  /* one family, two series per instance */
  lynx_prom_family(f, fenced, "counter",
                   "Data connections fenced: refused for presenting an older "
                   "frontend epoch, or cut when a newer one took the region "
                   "over (shm: not seen by the agent).");
  pthread_mutex_lock(&ag->lat_lock);
  for (uint32_t i = 0; i < ag->n_fpub; i++) {
    char id[24];
    snprintf(id, sizeof(id), "%llu", (unsigned long long)ag->fpub[i].instance);
    lynx_prom_u64(f, fenced,
                  (const struct lynx_prom_label[]){
                      {"instance", id}, {"why", "refused"}, {NULL, NULL}},
                  ag->fpub[i].s.refused);
    lynx_prom_u64(f, fenced,
                  (const struct lynx_prom_label[]){
                      {"instance", id}, {"why", "cut"}, {NULL, NULL}},
                  ag->fpub[i].s.cut);
  }
  pthread_mutex_unlock(&ag->lat_lock);
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
    a->q.queue_p50 =
        lynx_lat_quantile(&t.queue, &a->old.queue, 0.5, &a->q.window_requests);
    a->q.queue_p99 = lynx_lat_quantile(&t.queue, &a->old.queue, 0.99, NULL);
    a->q.service_p50 =
        lynx_lat_quantile(&t.service, &a->old.service, 0.5, NULL);
    a->q.service_p99 =
        lynx_lat_quantile(&t.service, &a->old.service, 0.99, NULL);
    pthread_mutex_lock(&ag->lat_lock);
    a->pub = t;
    a->cpub = ct;
    pthread_mutex_unlock(&ag->lat_lock);
  }
  fence_sample(ag);
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
      lynx_prom_u64(
          f, m[k].name,
          (const struct lynx_prom_label[]){{"accel", idx},
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
      lynx_prom_histogram(
          f, h[k].name,
          (const struct lynx_prom_label[]){{"accel", idx},
                                           {"kind", ag->acc[i].info.ops->kind},
                                           {NULL, NULL}},
          &snap);
    }
  }
  copies_metrics(ag, f);
  fence_metrics(ag, f);
}
