/*
 * instance.c - one service on one accelerator: a region and the app's
 * polling threads. Regions are named lynx-<node>-<pid>-i<instance id> so
 * that an agent killed with -9 leaves files the next agent recognises as
 * stale (main.c).
 */
#include <errno.h>
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
  in->desc.ordering = ag->acc[accel].ordering;
  in->desc.key = in->region.key;
  in->desc.remote_addr = in->region.remote_addr;
  memcpy(in->desc.rkeys, in->region.rkeys, sizeof(in->desc.rkeys));
}

/* A CPU accelerator: the region through the transport, the app's threads. */
static int start_cpu(struct agent *ag, struct instance *in,
                     const struct lynx_app *app, const struct lynx_geom *g,
                     const char *name, char *why, size_t whylen) {
  int rc = ag->tops->region_alloc(ag->tagent, &in->region, name,
                                  g->region_size);
  if (rc) {
    snprintf(why, whylen, "cannot allocate a %llu-byte region: %s",
             (unsigned long long)g->region_size, strerror(-rc));
    return rc;
  }
  rc = lynx_region_format(&in->region, g->n_mqueues, g->slots, g->slot_size,
                          ag->acc[in->accel].ordering, ag->epoch, in->accel);
  if (!rc)
    rc = ag->tops->region_export(&in->region);
  if (rc) {
    snprintf(why, whylen, "cannot export its region over %s: %s",
             ag->tops->name, strerror(-rc));
    goto fail;
  }
  in->cpu.region = in->region.base;
  in->cpu.app = app;
  in->cpu.work_us = in->work_us;
  in->cpu.n_server = in->n_server;
  in->cpu.backend_names = in->backends;
  in->cpu.work_sleep = ag->cfg.work_mode == 1;
  in->cpu.spin_us = ag->cfg.spin_us;
  in->cpu.n_threads = ag->cfg.accel_threads;
  in->cpu.id = in->accel;
  in->cpu.serve_until = &ag->serve_until_ns;
  rc = lynx_cpu_accel_start(&in->cpu);
  if (rc) {
    snprintf(why, whylen, "cannot start threads: %s", strerror(-rc));
    goto fail;
  }
  return 0;
fail:
  ag->tops->region_free(&in->region);
  return rc;
}

/* A GPU: the region in its memory, the app as a persistent kernel. */
static int start_cuda(struct agent *ag, struct instance *in,
                      const struct lynx_app *app, const struct lynx_geom *g,
                      const char *name, char *why, size_t whylen) {
  struct gpu_launch l = {
      .gpu = &ag->acc[in->accel].gpu,
      .tops = ag->tops,
      .tagent = ag->tagent,
      .name = name,
      .n_mqueues = g->n_mqueues,
      .n_server = in->n_server,
      .slots = g->slots,
      .slot_size = g->slot_size,
      .ordering = ag->acc[in->accel].ordering,
      .accel_id = in->accel,
      .epoch = ag->epoch,
      .cuda_app = app->cuda_app,
      .work_us = in->work_us,
      .threads = ag->cfg.gpu_threads,
      .serve_until_ns = __atomic_load_n(&ag->serve_until_ns, __ATOMIC_ACQUIRE),
  };
  if (!app->cuda_app) {
    snprintf(why, whylen, "application '%s' has no CUDA kernel (GPU "
             "applications: %s)", app->name, lynx_app_cuda_names());
    return -ENOTSUP;
  }
  if (g->n_mqueues != in->n_server) {
    snprintf(why, whylen, "client mqueues (back ends) are served by CPU "
             "accelerators only");
    return -ENOTSUP;
  }
  return gpu_instance_start(&l, &in->region, &in->gpu, why, whylen);
}

int agent_instance_start(struct agent *ag, uint64_t id, uint32_t accel,
                         const char *service, const struct lynx_app *app,
                         uint32_t mqueues, uint32_t slots, uint32_t slot_size,
                         uint32_t work_us, char (*backends)[32],
                         uint32_t n_backends, struct instance **out,
                         char *why, size_t whylen) {
  struct lynx_geom g;
  struct instance *in;
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
  /* server mqueues, then one client mqueue per back end */
  rc = lynx_geom_init(&g, mqueues + n_backends, slots, slot_size);
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
    memcpy(in->backends, backends, n_backends * sizeof(*in->backends));
  }
  in->id = id;
  in->accel = accel;
  in->n_server = mqueues;
  in->work_us = work_us;
  in->region.fd = -1;
  snprintf(in->service, sizeof(in->service), "%s", service);
  snprintf(name, sizeof(name), "lynx-%s-%d-i%llu", ag->node_id, (int)getpid(),
           (unsigned long long)id);
  rc = ag->acc[accel].kind == ACCEL_CUDA
           ? start_cuda(ag, in, app, &g, name, why, whylen)
           : start_cpu(ag, in, app, &g, name, why, whylen);
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
  LYNX_INFO("agent", "%s: instance %llu (%s, app %s) on accel %u (%s): %u "
            "mqueues x %u slots x %u B, %s %s", ag->node_id,
            (unsigned long long)id, service, app->name, accel,
            agent_accel_model(&ag->acc[accel]), mqueues, slots, slot_size,
            ag->tops->name, in->region.locator);
  *out = in;
  return 0;
}

void agent_instance_pb(const struct agent *ag, const struct instance *in,
                       const struct lynx_ctl *ctl, char *loc,
                       Lynx__RegionDesc *pb) {
  lynx_desc_to_pb(&in->desc, pb);
  pb->kind = (char *)agent_accel_kind(&ag->acc[in->accel]);
  pb->model = (char *)agent_accel_model(&ag->acc[in->accel]);
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

void agent_instance_stop(struct agent *ag, struct instance *in) {
  struct instance **pp = &ag->instances;
  uint64_t rq = 0, rs = 0, dr = 0, bad = 0;
  while (*pp && *pp != in)
    pp = &(*pp)->next;
  if (*pp)
    *pp = in->next;
  if (in->running && in->gpu) {
    /* a kernel that does not stop keeps its memory (gpu.h) */
    gpu_instance_stop(in->gpu);
    gpu_instance_counters(in->gpu, &rq, &rs, &dr, &bad);
  } else if (in->running) {
    lynx_cpu_accel_stop(&in->cpu);
    lynx_cpu_accel_counters(&in->cpu, &rq, &rs, &dr, &bad);
    lynx_cpu_accel_free(&in->cpu);
  }
  ag->acc[in->accel].requests += rq;
  ag->acc[in->accel].responses += rs;
  LYNX_INFO("agent",
            "%s: instance %llu (%s) on accel %u stopped: %llu requests, %llu "
            "responses, %llu dropped by the app, %llu malformed",
            ag->node_id, (unsigned long long)in->id, in->service, in->accel,
            (unsigned long long)rq, (unsigned long long)rs,
            (unsigned long long)dr, (unsigned long long)bad);
  ag->tops->region_free(&in->region);
  gpu_instance_put(in->gpu); /* its memory goes with the transport's */
  free(in->backends);
  free(in->watch);
  free(in);
}

void agent_instances_stop_all(struct agent *ag) {
  while (ag->instances)
    agent_instance_stop(ag, ag->instances);
}

void agent_instances_fence(struct agent *ag, int wake_cpu) {
  uint64_t until = __atomic_load_n(&ag->serve_until_ns, __ATOMIC_ACQUIRE);
  for (struct instance *in = ag->instances; in; in = in->next) {
    if (!in->running)
      continue;
    if (in->gpu)
      gpu_instance_fence(in->gpu, until);
    else if (wake_cpu)
      lynx_cpu_accel_kick(&in->cpu);
  }
}

void agent_accel_counters(struct agent *ag, uint32_t accel, uint64_t *req,
                          uint64_t *resp) {
  *req = ag->acc[accel].requests;
  *resp = ag->acc[accel].responses;
  for (struct instance *in = ag->instances; in; in = in->next) {
    uint64_t rq, rs, dr, bad;
    if (in->accel != accel || !in->running)
      continue;
    if (in->gpu)
      gpu_instance_counters(in->gpu, &rq, &rs, &dr, &bad);
    else
      lynx_cpu_accel_counters(&in->cpu, &rq, &rs, &dr, &bad);
    *req += rq;
    *resp += rs;
  }
}
