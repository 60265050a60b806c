/*
 * instance.c - one service on one accelerator: a region and the app
 * polling it, started, fenced, counted and stopped through the
 * accelerator's backend (accel.h). Regions are named
 * lynx-<node>-<pid>-i<instance id> so that an agent killed with -9 leaves
 * files the next agent recognises as stale (main.c).
 */
#include <errno.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <arpa/inet.h>

#include "agent.h"
#include "lynx.pb-c.h"
#include "log.h"
#include "mqueue.h"

/* The region's descriptor, as the transport left it. */
static void fill_desc(struct agent *ag, struct instance *in,
                      const struct lynx_geom *g, uint32_t accel) {
  in->desc.accel_id = accel;
  snprintf(in->desc.transport, sizeof(in->desc.transport), "%s",
           ag->tops->name);
  snprintf(in->desc.locator, sizeof(in->desc.locator), "%s",
           in->region.locator);
  in->desc.region_size = g->region_size;
  in->desc.epoch = ag->epoch;
  in->desc.n_mqueues = g->n_mqueues;
  in->desc.slots = g->slots;
  in->desc.slot_size = g->slot_size;
  in->desc.large_bytes = g->large_bytes;
  in->desc.ordering = ag->acc[accel].ordering;
  in->desc.key = in->region.key;
  in->desc.remote_addr = in->region.remote_addr;
  memcpy(in->desc.rkeys, in->region.rkeys, sizeof(in->desc.rkeys));
  if (in->region.shm[0]) { /* tcp's region is a file too (--transport auto) */
    snprintf(in->desc.shm_locator, sizeof(in->desc.shm_locator), "%s",
             in->region.shm);
    snprintf(in->desc.host_id, sizeof(in->desc.host_id), "%s", ag->host_id);
    snprintf(in->desc.netns_id, sizeof(in->desc.netns_id), "%s", ag->netns_id);
  }
}

/* A region in host memory through the transport, formatted and exported,
 * for a backend that serves one (!own_memory). */
static int host_region(struct agent *ag, struct instance *in,
                       const struct lynx_geom *g, const char *name, char *why,
                       size_t whylen) {
  int rc =
      ag->tops->region_alloc(ag->tagent, &in->region, name, g->region_size);
  if (rc) {
    snprintf(why, whylen, "cannot allocate a %llu-byte region: %s",
             (unsigned long long)g->region_size, strerror(-rc));
    return rc;
  }
  rc = lynx_region_format(&in->region, g->n_mqueues, g->slots, g->slot_size,
                          g->large_bytes, ag->acc[in->accel].ordering,
                          ag->epoch, in->accel);
  if (!rc)
    rc = ag->tops->region_export(&in->region);
  if (rc) {
    snprintf(why, whylen, "cannot export its region over %s: %s",
             ag->tops->name, strerror(-rc));
    goto fail;
  }
  return 0;
fail:
  ag->tops->region_free(&in->region);
  return rc;
}

/* The app on the accelerator through its backend: the region first where
 * the backend does not place it in its own memory. */
static int start_run(struct agent *ag, struct instance *in,
                     const struct lynx_app *app, const char *config,
                     const struct lynx_geom *g, const char *name, char *why,
                     size_t whylen) {
  const struct lynx_accel_dev *acc = &ag->acc[in->accel].info;
  /* a plug-in's instances run in its process (apphost.c) */
  const struct lynx_accel_ops *ops =
      app->runner && acc->ops == &lynx_accel_cpu ? app->runner : acc->ops;
  struct lynx_accel_launch l = {
      .acc = acc,
      .tops = ag->tops,
      .tagent = ag->tagent,
      .name = name,
      .app = app,
      .service = in->service,
      .app_config = config,
      /* under a coordinator a plug-in's start is not waited for */
      .async_ok = ag->report_ready != NULL,
      .n_mqueues = g->n_mqueues,
      .n_server = in->n_server,
      .slots = g->slots,
      .slot_size = g->slot_size,
      .large_bytes = g->large_bytes,
      .ordering = ag->acc[in->accel].ordering,
      .accel_id = in->accel,
      .backends = in->backends,
      .n_backends = in->n_backends,
      .epoch = ag->epoch,
      .work_us = in->work_us,
      .work_sleep = ag->cfg.work_mode == 1,
      .spin_us = ag->cfg.spin_us,
      .cpu_threads = ag->cfg.accel_threads,
      .gpu_threads = ag->cfg.gpu_threads,
      .gpu_blocks = ag->cfg.gpu_blocks,
      .gpu_idle_ns = ag->cfg.gpu_idle_ns,
      .serve_until = &ag->serve_until_ns,
  };
  const char *bnames[LYNX_BACKENDS_MAX];
  int rc;
  for (uint32_t k = 0; k < in->n_backends && k < LYNX_BACKENDS_MAX; k++)
    bnames[k] = in->backends[k];
  /* the application's own checks (its configuration) before any memory */
  rc = lynx_app_start(app, in->service, config, in->n_server,
                      lynx_slot_cap(g->slot_size), lynx_msg_cap(g), bnames,
                      in->n_backends, &in->app_state, why, whylen);
  if (rc)
    return rc;
  l.app_state = in->app_state;
  if (!acc->own_memory) {
    rc = host_region(ag, in, g, name, why, whylen);
    if (rc)
      goto fail;
    l.region = in->region.base;
  }
  rc = ops->start(&l, &in->region, &in->run, why, whylen);
  if (rc == 1) { /* started; the app's start ends later */
    in->pending = 1;
    return 0;
  }
  if (rc && !acc->own_memory)
    ag->tops->region_free(&in->region);
  if (!rc)
    return 0;
fail:
  lynx_app_stop(app, in->app_state);
  in->app_state = NULL;
  return rc;
}

/* Client mqueues per back end, as the accelerator's backend lays them out
 * (accel.h client_mqs: one on a CPU, one per block of a GPU kernel that
 * calls back ends). */
static int client_layout(struct agent *ag, const struct instance_req *q,
                         uint32_t *per_backend, char *why, size_t whylen) {
  const struct lynx_accel_dev *acc = &ag->acc[q->accel].info;
  struct lynx_accel_launch l = {
      .acc = acc,
      .tops = ag->tops,
      .app = q->app,
      .n_server = q->mqueues,
      .slots = q->slots,
      .slot_size = q->slot_size,
      .large_bytes = lynx_large_for(q->msg_max, q->slot_size),
      .ordering = ag->acc[q->accel].ordering,
      .accel_id = q->accel,
      .backends = q->backends,
      .n_backends = q->n_backends,
      .work_us = q->work_us,
      .cpu_threads = ag->cfg.accel_threads,
      .gpu_threads = ag->cfg.gpu_threads,
      .gpu_blocks = ag->cfg.gpu_blocks,
  };
  *per_backend = 1;
  if (!q->n_backends)
    return 0;
  return acc->ops->client_mqs(&l, per_backend, why, whylen);
}

int agent_instance_start(struct agent *ag, const struct instance_req *q,
                         struct instance **out, char *why, size_t whylen) {
  const uint64_t id = q->id;
  const uint32_t accel = q->accel, mqueues = q->mqueues,
                 n_backends = q->n_backends;
  const char *service = q->service;
  const struct lynx_app *app = q->app;
  struct lynx_geom g;
  struct instance *in;
  uint32_t per_backend = 1;
  char name[128];
  int rc;
  why[0] = 0;
  if (accel >= ag->n_acc) {
    snprintf(why, whylen, "no accelerator %u on this node", accel);
    return -ENODEV;
  }
  if (agent_instance_find(ag, id)) {
    snprintf(why, whylen, "instance %llu exists", (unsigned long long)id);
    return -EEXIST;
  }
  /* server mqueues, then per_backend client mqueues per back end */
  rc = client_layout(ag, q, &per_backend, why, whylen);
  if (rc) {
    LYNX_ERR("agent", "%s: instance %llu (%s, app %s) on accel %u: %s",
             ag->node_id, (unsigned long long)id, service, app->name, accel,
             why);
    return rc;
  }
  rc = per_backend < 1 || per_backend > LYNX_MQUEUES_MAX
           ? -EINVAL
           : lynx_geom_init(&g, mqueues + n_backends * per_backend, q->slots,
                            q->slot_size,
                            lynx_large_for(q->msg_max, q->slot_size));
  if (rc) {
    snprintf(why, whylen, "invalid geometry");
    return -EINVAL;
  }
  in = calloc(1, sizeof(*in));
  if (!in)
    return -ENOMEM;
  in->watch = calloc(mqueues, sizeof(*in->watch));
  if (!in->watch) {
    free(in);
    return -ENOMEM;
  }
  if (n_backends) {
    in->backends = calloc(n_backends, sizeof(*in->backends));
    if (!in->backends) {
      free(in->watch);
      free(in);
      return -ENOMEM;
    }
    memcpy(in->backends, q->backends, n_backends * sizeof(*in->backends));
  }
  in->n_backends = n_backends;
  in->id = id;
  in->accel = accel;
  in->n_server = mqueues;
  in->work_us = q->work_us;
  in->region.fd = -1;
  snprintf(in->service, sizeof(in->service), "%s", service);
  snprintf(name, sizeof(name), "lynx-%s-%d-i%llu", ag->node_id, (int)getpid(),
           (unsigned long long)id);
  in->app = app;
  rc = start_run(ag, in, app, q->config, &g, name, why, whylen);
  if (rc) {
    LYNX_ERR("agent", "%s: instance %llu (%s, app %s) on accel %u: %s",
             ag->node_id, (unsigned long long)id, service, app->name, accel,
             why);
    free(in->backends);
    free(in->watch);
    free(in);
    return rc;
  }
  fill_desc(ag, in, &g, accel);
  in->running = 1;
  in->next = ag->instances;
  ag->instances = in;
  LYNX_INFO("agent",
            "%s: instance %llu (%s, app %s) on accel %u (%s): %u "
            "mqueues x %u slots x %u B, messages up to %u B, %s %s%s%s",
            ag->node_id, (unsigned long long)id, service, app->name, accel,
            ag->acc[accel].info.model, mqueues, q->slots, q->slot_size,
            lynx_msg_cap(&g), ag->tops->name, in->region.locator,
            in->region.shm[0] ? ", shm " : "", in->region.shm);
  *out = in;
  return 0;
}

void agent_instance_pb(const struct agent *ag, const struct instance *in,
                       const struct lynx_ctl *ctl, char *loc,
                       Lynx__RegionDesc *pb) {
  lynx_desc_to_pb(&in->desc, pb);
  pb->kind = (char *)ag->acc[in->accel].info.ops->kind;
  pb->model = (char *)ag->acc[in->accel].info.model;
  pb->memory_bytes = in->region.size;
  snprintf(loc, LYNX_LOCATOR_MAX, "%s", in->desc.locator);
  if (ag->cfg.advertise) {
    lynx_locator_set_host(loc, LYNX_LOCATOR_MAX, ag->cfg.advertise);
  } else if (ctl) {
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    char host[INET6_ADDRSTRLEN];
    const void *a = NULL;
    if (uv_tcp_getsockname(&ctl->tcp, (struct sockaddr *)&ss, &len) == 0)
      a = ss.ss_family == AF_INET6
              ? (const void *)&((struct sockaddr_in6 *)&ss)->sin6_addr
              : (const void *)&((struct sockaddr_in *)&ss)->sin_addr;
    if (a && inet_ntop(ss.ss_family, a, host, sizeof(host)))
      lynx_locator_set_host(loc, LYNX_LOCATOR_MAX, host);
  }
  pb->locator = loc;
}

struct instance *agent_instance_find(struct agent *ag, uint64_t id) {
  for (struct instance *in = ag->instances; in; in = in->next)
    if (in->id == id)
      return in;
  return NULL;
}

/* What a stopped instance leaves in its server mqueues, read through the
 * transport's view of the region (copies out of GPU memory) once its
 * accelerator no longer moves the indices: *queued, request slots still
 * published from the consumer index on (their requests never ran, but for
 * a request taken and not yet released), and *unread, answers written
 * and not consumed by a frontend (their requests ran). Zeros where a read
 * fails. */
static void leftovers(const struct instance *in, uint64_t *queued,
                      uint64_t *unread) {
  struct lynx_actrl a[LYNX_MQUEUES_MAX];
  struct lynx_fctrl f[LYNX_MQUEUES_MAX];
  struct lynx_geom g;
  *queued = *unread = 0;
  if (!in->n_server ||
      lynx_geom_init(&g, in->desc.n_mqueues, in->desc.slots, in->desc.slot_size,
                     in->desc.large_bytes) ||
      lynx_region_read(&in->region, lynx_actrl_off(&g, 0), a,
                       in->n_server * sizeof(a[0])) ||
      lynx_region_read(&in->region, lynx_fctrl_off(&g, 0), f,
                       in->n_server * sizeof(f[0])))
    return;
  for (uint32_t q = 0; q < in->n_server; q++) {
    uint32_t pos = a[q].rx_cons, n = 0;
    for (; n < g.slots; n++, pos++) {
      struct lynx_slot_meta m;
      if (lynx_region_read(&in->region,
                           lynx_slot_off(&g, lynx_rx_ring_off(&g, q), pos) +
                               g.slot_size - LYNX_META_SIZE,
                           &m, sizeof(m)) ||
          m.seq != lynx_seq_for(pos))
        break;
    }
    *queued += n;
    /* a frontend's index past the answers is a bad one: nothing counted */
    if (a[q].tx_prod - f[q].tx_cons <= g.slots)
      *unread += a[q].tx_prod - f[q].tx_cons;
  }
}

void agent_instance_stop(struct agent *ag, struct instance *in) {
  struct instance **pp = &ag->instances;
  uint64_t rq = 0, rs = 0, dr = 0, bad = 0, queued = 0, unread = 0;
  int stopped = 0;
  while (*pp && *pp != in)
    pp = &(*pp)->next;
  if (*pp)
    *pp = in->next;
  if (in->running) {
    /* one that does not stop keeps its memory (accel.h), and its app's
     * state, which it may still read */
    stopped = in->run->ops->stop(in->run) == 0;
    in->run->ops->counters(in->run, &rq, &rs, &dr, &bad);
    agent_stats_keep(ag, in);
    leftovers(in, &queued, &unread);
    /* taken and neither answered nor dropped: it ran, or began to, and
     * no answer went */
    if (rq > rs + dr)
      unread += rq - rs - dr;
  }
  ag->acc[in->accel].requests += rq;
  ag->acc[in->accel].responses += rs;
  __atomic_store_n(&ag->left_queued, ag->left_queued + queued,
                   __ATOMIC_RELAXED);
  __atomic_store_n(&ag->left_unread, ag->left_unread + unread,
                   __ATOMIC_RELAXED);
  LYNX_INFO("agent",
            "%s: instance %llu (%s) on accel %u stopped: %llu requests, %llu "
            "responses, %llu dropped by the app, %llu malformed; left %llu "
            "requests queued (never run) and %llu answers no frontend read",
            ag->node_id, (unsigned long long)in->id, in->service, in->accel,
            (unsigned long long)rq, (unsigned long long)rs,
            (unsigned long long)dr, (unsigned long long)bad,
            (unsigned long long)queued, (unsigned long long)unread);
  ag->tops->region_free(&in->region);
  in->run->ops->put(in->run); /* memory in the transport's hands goes later */
  if (stopped)
    lynx_app_stop(in->app, in->app_state);
  free(in->backends);
  free(in->watch);
  free(in);
  /* what its threads freed goes back to the system (glibc keeps each
   * thread's arena otherwise: bench/services.sh) */
  malloc_trim(0);
}

void agent_instance_started(struct agent *ag, struct instance *in, int rc,
                            const char *why) {
  if (!in->pending)
    return;
  in->pending = 0;
  if (!rc) {
    LYNX_INFO("agent", "%s: instance %llu (%s): its application started",
              ag->node_id, (unsigned long long)in->id, in->service);
    if (ag->report_ready)
      ag->report_ready(ag, in);
    return;
  }
  LYNX_ERR("agent", "%s: instance %llu (%s): %s", ag->node_id,
           (unsigned long long)in->id, in->service, why);
  if (ag->report_failed) {
    char msg[400];
    snprintf(msg, sizeof(msg), "cannot start on accel %u: %s", in->accel, why);
    ag->report_failed(ag, in->id, msg);
  }
  agent_instance_stop(ag, in);
}

void agent_instances_stop_all(struct agent *ag) {
  while (ag->instances)
    agent_instance_stop(ag, ag->instances);
}

void agent_instances_fence(struct agent *ag, int wake) {
  uint64_t until = __atomic_load_n(&ag->serve_until_ns, __ATOMIC_ACQUIRE);
  for (struct instance *in = ag->instances; in; in = in->next)
    if (in->running)
      in->run->ops->fence(in->run, until, wake);
}

void agent_accel_counters(struct agent *ag, uint32_t accel, uint64_t *req,
                          uint64_t *resp) {
  *req = ag->acc[accel].requests;
  *resp = ag->acc[accel].responses;
  for (struct instance *in = ag->instances; in; in = in->next) {
    uint64_t rq, rs, dr, bad;
    if (in->accel != accel || !in->running)
      continue;
    in->run->ops->counters(in->run, &rq, &rs, &dr, &bad);
    *req += rq;
    *resp += rs;
  }
}
