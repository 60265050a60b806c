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

int agent_instance_start(struct agent *ag, uint64_t id, uint32_t accel,
                         const char *service, const struct lynx_app *app,
                         uint32_t mqueues, uint32_t slots, uint32_t slot_size,
                         uint32_t work_us, char (*backends)[32],
                         uint32_t n_backends, struct instance **out) {
  struct lynx_geom g;
  struct instance *in;
  char name[128];
  int rc;
  if (accel >= ag->n_acc)
    return -ENODEV;
  if (agent_instance_find(ag, id))
    return -EEXIST;
  /* server mqueues, then one client mqueue per back end */
  rc = lynx_geom_init(&g, mqueues + n_backends, slots, slot_size);
  if (rc)
    return -EINVAL;
  in = calloc(1, sizeof(*in));
  if (!in)
    return -ENOMEM;
  if (n_backends) {
    in->backends = calloc(n_backends, sizeof(*in->backends));
    if (!in->backends) {
      free(in);
      return -ENOMEM;
    }
    memcpy(in->backends, backends, n_backends * sizeof(*in->backends));
  }
  in->id = id;
  in->accel = accel;
  in->region.fd = -1;
  snprintf(in->service, sizeof(in->service), "%s", service);
  snprintf(name, sizeof(name), "lynx-%s-%d-i%llu", ag->node_id, (int)getpid(),
           (unsigned long long)id);
  rc = ag->tops->region_alloc(&in->region, name, g.region_size);
  if (rc) {
    LYNX_ERR("agent", "%s: instance %llu: cannot allocate a %llu-byte region: "
             "%s", ag->node_id, (unsigned long long)id,
             (unsigned long long)g.region_size, strerror(-rc));
    free(in->backends);
    free(in);
    return rc;
  }
  rc = lynx_region_format(&in->region, g.n_mqueues, g.slots, g.slot_size,
                          (uint32_t)ag->cfg.ordering, ag->epoch, accel);
  if (!rc)
    rc = ag->tops->region_export(&in->region);
  if (rc) {
    LYNX_ERR("agent", "%s: instance %llu: cannot export its region over %s: "
             "%s", ag->node_id, (unsigned long long)id, ag->tops->name,
             strerror(-rc));
    goto fail;
  }
  in->desc.accel_id = accel;
  snprintf(in->desc.transport, sizeof(in->desc.transport), "%s",
           ag->tops->name);
  snprintf(in->desc.locator, sizeof(in->desc.locator), "%s",
           in->region.locator);
  in->desc.region_size = g.region_size;
  in->desc.epoch = ag->epoch;
  in->desc.n_mqueues = g.n_mqueues;
  in->desc.slots = g.slots;
  in->desc.slot_size = g.slot_size;
  in->desc.ordering = (uint32_t)ag->cfg.ordering;
  in->desc.key = in->region.key;
  in->desc.remote_addr = in->region.remote_addr;
  memcpy(in->desc.rkeys, in->region.rkeys, sizeof(in->desc.rkeys));
  in->cpu.region = in->region.base;
  in->cpu.app = app;
  in->cpu.work_us = work_us;
  in->cpu.n_server = mqueues;
  in->cpu.backend_names = in->backends;
  in->cpu.work_sleep = ag->cfg.work_mode == 1;
  in->cpu.spin_us = ag->cfg.spin_us;
  in->cpu.n_threads = ag->cfg.accel_threads;
  in->cpu.id = accel;
  rc = lynx_cpu_accel_start(&in->cpu);
  if (rc) {
    LYNX_ERR("agent", "%s: instance %llu: cannot start threads: %s",
             ag->node_id, (unsigned long long)id, strerror(-rc));
    goto fail;
  }
  in->running = 1;
  in->next = ag->instances;
  ag->instances = in;
  LYNX_INFO("agent", "%s: instance %llu (%s, app %s) on accel %u: %u mqueues "
            "x %u slots x %u B, %s %s", ag->node_id, (unsigned long long)id,
            service, app->name, accel, mqueues, slots, slot_size,
            ag->tops->name, in->region.locator);
  *out = in;
  return 0;
fail:
  ag->tops->region_free(&in->region);
  free(in->backends);
  free(in);
  return rc;
}

void agent_instance_pb(const struct agent *ag, const struct instance *in,
                       const struct lynx_ctl *ctl, char *loc,
                       Lynx__RegionDesc *pb) {
  lynx_desc_to_pb(&in->desc, pb);
  pb->kind = "cpu";
  pb->model = "cpu-emulated";
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
  if (in->running) {
    lynx_cpu_accel_stop(&in->cpu);
    lynx_cpu_accel_counters(&in->cpu, &rq, &rs, &dr, &bad);
    ag->acc[in->accel].requests += rq;
    ag->acc[in->accel].responses += rs;
    lynx_cpu_accel_free(&in->cpu);
  }
  LYNX_INFO("agent",
            "%s: instance %llu (%s) on accel %u stopped: %llu requests, %llu "
            "responses, %llu dropped by the app, %llu malformed",
            ag->node_id, (unsigned long long)in->id, in->service, in->accel,
            (unsigned long long)rq, (unsigned long long)rs,
            (unsigned long long)dr, (unsigned long long)bad);
  ag->tops->region_free(&in->region);
  free(in->backends);
  free(in);
}

void agent_instances_stop_all(struct agent *ag) {
  while (ag->instances)
    agent_instance_stop(ag, ag->instances);
}

void agent_accel_counters(struct agent *ag, uint32_t accel, uint64_t *req,
                          uint64_t *resp) {
  *req = ag->acc[accel].requests;
  *resp = ag->acc[accel].responses;
  for (struct instance *in = ag->instances; in; in = in->next) {
    uint64_t rq, rs, dr, bad;
    if (in->accel != accel || !in->running)
      continue;
    lynx_cpu_accel_counters(&in->cpu, &rq, &rs, &dr, &bad);
    *req += rq;
    *resp += rs;
  }
}
