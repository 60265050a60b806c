/*
 * regjson.c - the registry as JSON (see regjson.h).
 *
 * Encoders build fresh json-c objects from the registry; they only read it.
 * The decoder is strict on purpose: an operator's typo ("replica": 3, a
 * port as a string) is refused with the field named instead of silently
 * becoming a default. Range checks shared with the registry live in
 * lynx_service_spec_validate, so the API and the C entry points agree.
 */
#include "regjson.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mqueue.h"

#define WORK_US_MAX 10000000u /* the agent's --work-us bound: 10 s */
#define REPLICAS_MAX 1000000u

/* ---- encoding ------------------------------------------------------- */

/* Every string the API sends goes through here. JSON must be UTF-8, and
 * json-c copies bytes as they are: a string that is not clean text (an
 * agent's, or one from a request path) is sent cleaned (lynx_text_clean),
 * so no registry content can make an answer invalid JSON. */
static void add_str(struct json_object *o, const char *k, const char *v) {
  char fixed[512];
  if (!v)
    v = "";
  if (!lynx_text_ok(v, strlen(v)))
    v = lynx_text_clean(fixed, sizeof(fixed), v);
  json_object_object_add(o, k, json_object_new_string(v));
}

static void add_u64(struct json_object *o, const char *k, uint64_t v) {
  json_object_object_add(o, k, json_object_new_uint64(v));
}

static uint64_t since(uint64_t now_ms, uint64_t t) {
  return now_ms > t ? now_ms - t : 0;
}

static const char *ordering_name(uint32_t o) {
  return o == LYNX_ORDER_FENCED ? "fenced" : "coalesced";
}

static struct json_object *labels_obj(const struct lynx_label *l, uint32_t n) {
  struct json_object *o = json_object_new_object();
  uint32_t k;
  for (k = 0; k < n; k++)
    add_str(o, l[k].key, l[k].value);
  return o;
}

static struct json_object *list_obj(const struct lynx_registry *r,
                                    struct json_object *items) {
  struct json_object *o = json_object_new_object();
  add_u64(o, "version", r->version);
  json_object_object_add(o, "items", items);
  return o;
}

/* The accelerator's health as its agent reports it; "dispatchable" is the
 * accelerator's own verdict (its node's state is "state" beside it). */
static struct json_object *health_obj(const struct lynx_reg_accel *a,
                                      uint64_t now_ms) {
  struct json_object *o = json_object_new_object();
  int ok = lynx_reg_accel_dispatchable(a);
  char err[sizeof(a->last_error) + 1];
  /* the registry terminates it; bound it anyway, it came off the wire */
  snprintf(err, sizeof(err), "%.*s", (int)sizeof(a->last_error), a->last_error);
  json_object_object_add(o, "dispatchable", json_object_new_boolean(ok));
  json_object_object_add(o, "device_lost",
                         json_object_new_boolean(a->device_lost));
  json_object_object_add(o, "failed", json_object_new_boolean(a->failed));
  add_str(o, "last_error", err);
  add_u64(o, "stalled_mqueues", a->stalled_mqueues);
  add_u64(o, "stall_ms", a->stall_ms);
  add_u64(o, "unhealthy_for_ms", ok ? 0 : since(now_ms, a->unhealthy_since_ms));
  add_u64(o, "outages", a->health_outages);
  return o;
}

/* A GPU's resident-block budget (all 0 for a CPU): what placement counts
 * instances against (reg_place.c). */
static struct json_object *blocks_obj(const struct lynx_reg_accel *a) {
  struct json_object *o = json_object_new_object();
  add_u64(o, "resident", a->info.resident_blocks);
  add_u64(o, "held", a->blocks_held);
  add_u64(o, "per_instance", a->info.instance_blocks);
  return o;
}

/* Queueing and service time as the accelerator stamped them, over its
 * agent's recent window (docs/metrics.md, "Accelerator latency"). */
static struct json_object *latency_obj(const struct lynx_accel_latency *l) {
  struct json_object *o = json_object_new_object();
  add_u64(o, "window_requests", l->window_requests);
  add_u64(o, "queue_p50_ns", l->queue_p50_ns);
  add_u64(o, "queue_p99_ns", l->queue_p99_ns);
  add_u64(o, "service_p50_ns", l->service_p50_ns);
  add_u64(o, "service_p99_ns", l->service_p99_ns);
  return o;
}

struct json_object *lynx_json_accel(const struct lynx_reg_node *n,
                                    const struct lynx_reg_accel *a,
                                    uint64_t now_ms) {
  struct json_object *o = json_object_new_object();
  char id[LYNX_ID_MAX + 16];
  snprintf(id, sizeof(id), "%s/%" PRIu32, n->id, a->info.idx);
  add_str(o, "id", id);
  add_str(o, "node", n->id);
  add_str(o, "kind", a->info.kind);
  add_str(o, "model", a->info.model);
  add_u64(o, "memory_bytes", a->info.memory_bytes);
  add_str(o, "ordering", ordering_name(a->info.ordering));
  add_str(o, "pci_bus_id", a->info.pci_bus_id);
  json_object_object_add(o, "gpudirect_rdma",
                         json_object_new_boolean(a->info.gpudirect_rdma));
  add_u64(o, "rdma_writes_ordering", a->info.rdma_writes_ordering);
  {
    /* what it runs, as its agent registered it (built in and plug-ins) */
    struct json_object *apps = json_object_new_array();
    for (uint32_t k = 0; k < a->info.n_apps && k < LYNX_APPS_MAX; k++)
      json_object_array_add(apps, json_object_new_string(a->info.apps[k]));
    json_object_object_add(o, "apps", apps);
  }
  add_str(o, "state", lynx_node_state_name(n->state));
  add_u64(o, "requests", a->requests);
  add_u64(o, "responses", a->responses);
  json_object_object_add(o, "blocks", blocks_obj(a));
  json_object_object_add(o, "health", health_obj(a, now_ms));
  json_object_object_add(o, "latency", latency_obj(&a->lat));
  return o;
}

struct json_object *lynx_json_node(const struct lynx_registry *r,
                                   const struct lynx_reg_node *n,
                                   uint64_t now_ms) {
  struct json_object *o = json_object_new_object(), *accels;
  uint32_t a;
  (void)r;
  add_str(o, "id", n->id);
  add_str(o, "state", lynx_node_state_name(n->state));
  /* silent past its heartbeat lease: out of dispatch, not down yet */
  json_object_object_add(o, "suspect", json_object_new_boolean(n->suspect));
  /* draining (or drained) because its agent is stopping */
  json_object_object_add(o, "leaving", json_object_new_boolean(n->leaving));
  add_str(o, "address", n->address);
  add_u64(o, "epoch", n->epoch);
  json_object_object_add(o, "labels", labels_obj(n->labels, n->n_labels));
  accels = json_object_new_array();
  for (a = 0; a < n->n_accels; a++)
    json_object_array_add(accels, lynx_json_accel(n, &n->accels[a], now_ms));
  json_object_object_add(o, "accelerators", accels);
  if (n->n_refused_apps) {
    struct json_object *ra = json_object_new_array();
    for (uint32_t k = 0; k < n->n_refused_apps; k++) {
      struct json_object *e = json_object_new_object();
      add_str(e, "name", n->refused_apps[k].name);
      add_str(e, "reason", n->refused_apps[k].reason);
      json_object_array_add(ra, e);
    }
    json_object_object_add(o, "refused_apps", ra);
  }
  if (n->n_app_faults) {
    struct json_object *fa = json_object_new_array();
    for (uint32_t k = 0; k < n->n_app_faults; k++) {
      struct json_object *e = json_object_new_object();
      add_str(e, "name", n->app_faults[k].name);
      add_str(e, "last_death", n->app_faults[k].last_death);
      add_u64(e, "restarts", n->app_faults[k].restarts);
      add_u64(e, "lost", n->app_faults[k].lost);
      json_object_array_add(fa, e);
    }
    json_object_object_add(o, "app_faults", fa);
  }
  add_u64(o, "last_heartbeat_ms", since(now_ms, n->last_heartbeat_ms));
  return o;
}

/* The spec alone: what the state file stores and the decoder reads. */
struct json_object *
lynx_json_service_spec_obj(const struct lynx_service_spec *sp) {
  struct json_object *o = json_object_new_object();
  add_str(o, "name", sp->name);
  add_str(o, "proto", sp->proto);
  if (!strcmp(sp->proto, "tcp")) {
    if (sp->fixed_len) {
      struct json_object *f = json_object_new_object();
      add_u64(f, "fixed", sp->fixed_len);
      json_object_object_add(o, "framing", f);
    } else {
      add_str(o, "framing", "len32");
    }
  }
  add_u64(o, "port", sp->port);
  add_str(o, "app", sp->app);
  if (sp->app_config[0]) {
    struct json_object *c = json_tokener_parse(sp->app_config);
    if (c)
      json_object_object_add(o, "app_config", c);
  }
  add_u64(o, "slot_size", sp->slot_size);
  add_u64(o, "slots", sp->slots);
  add_u64(o, "msg_max", sp->msg_max);
  add_u64(o, "mqueues_per_accel", sp->mqueues_per_accel);
  add_u64(o, "work_us", sp->work_us);
  if (sp->n_backends) {
    struct json_object *a = json_object_new_array();
    for (uint32_t i = 0; i < sp->n_backends; i++) {
      struct json_object *b = json_object_new_object();
      add_str(b, "name", sp->backends[i].name);
      add_str(b, "address", sp->backends[i].address);
      add_str(b, "proto", sp->backends[i].proto);
      json_object_array_add(a, b);
    }
    json_object_object_add(o, "backends", a);
  }
  if (sp->placement == LYNX_PLACE_ALL && sp->n_selector == 0) {
    add_str(o, "placement", "all");
  } else {
    struct json_object *p = json_object_new_object();
    if (sp->placement == LYNX_PLACE_REPLICAS)
      add_u64(p, "replicas", sp->replicas);
    json_object_object_add(p, "selector",
                           labels_obj(sp->selector, sp->n_selector));
    json_object_object_add(o, "placement", p);
  }
  return o;
}

struct json_object *lynx_json_service(const struct lynx_registry *r,
                                      const struct lynx_reg_service *s,
                                      const char *unknown) {
  struct json_object *o = lynx_json_service_spec_obj(&s->spec), *inst;
  uint64_t ready = 0, wanted = 0;
  char reason[512];
  const char *state;
  if (unknown) {
    json_object_object_add(o, "instances", NULL);
    json_object_object_add(o, "state", json_object_new_string("unknown"));
    add_str(o, "reason", unknown);
    return o;
  }
  state = lynx_reg_service_state(r, s, &ready, &wanted, reason, sizeof(reason));
  inst = json_object_new_object();
  add_u64(inst, "ready", ready);
  add_u64(inst, "wanted", wanted);
  add_u64(inst, "failed_starts", s->failures);
  json_object_object_add(o, "instances", inst);
  json_object_object_add(o, "state", json_object_new_string(state));
  add_str(o, "reason", reason);
  /* its application's process deaths where it runs as a plug-in: the
   * instances were taken over, the lost requests counted */
  {
    struct json_object *fa = NULL;
    for (const struct lynx_reg_node *n = r->nodes; n; n = n->next)
      for (uint32_t k = 0; n->state != LYNX_NODE_DOWN && k < n->n_app_faults;
           k++) {
        struct json_object *e;
        if (strcmp(n->app_faults[k].name, s->spec.app))
          continue;
        if (!fa)
          fa = json_object_new_array();
        e = json_object_new_object();
        add_str(e, "node", n->id);
        add_str(e, "last_death", n->app_faults[k].last_death);
        add_u64(e, "restarts", n->app_faults[k].restarts);
        add_u64(e, "lost", n->app_faults[k].lost);
        json_object_array_add(fa, e);
      }
    if (fa)
      json_object_object_add(o, "app_faults", fa);
  }
  return o;
}

struct json_object *lynx_json_frontend(const struct lynx_registry *r,
                                       const struct lynx_reg_frontend *f,
                                       uint64_t now_ms) {
  struct json_object *o = json_object_new_object();
  uint64_t produces = 0, releasing = 0, epoch = 0;
  for (const struct lynx_reg_instance *i = r->instances; i; i = i->next) {
    if (strcmp(i->fe_owner, f->id) || !lynx_reg_inst_dispatchable(i))
      continue;
    produces += !i->fe_release_version;
    releasing += i->fe_release_version != 0;
    if (i->fe_epoch > epoch)
      epoch = i->fe_epoch;
  }
  add_str(o, "id", f->id);
  add_str(o, "address", f->address);
  json_object_object_add(o, "connected", json_object_new_boolean(f->connected));
  /* one of the frontends the instances are partitioned among (else a
   * standby), the instances it produces into, those it is letting go of
   * (answering what it holds on them), and the newest epoch it has */
  json_object_object_add(o, "active", json_object_new_boolean(f->active));
  json_object_object_add(o, "draining",
                         json_object_new_boolean(f->drain_intent));
  add_u64(o, "instances", produces);
  add_u64(o, "releasing", releasing);
  add_u64(o, "epoch", epoch);
  add_u64(o, "table_version", f->table_version_applied);
  add_u64(o, "last_seen_ms", since(now_ms, f->last_seen_ms));
  return o;
}

struct json_object *lynx_json_nodes(const struct lynx_registry *r,
                                    uint64_t now_ms) {
  struct json_object *items = json_object_new_array();
  const struct lynx_reg_node *n;
  for (n = r->nodes; n; n = n->next)
    json_object_array_add(items, lynx_json_node(r, n, now_ms));
  return list_obj(r, items);
}

struct json_object *lynx_json_accels(const struct lynx_registry *r,
                                     uint64_t now_ms) {
  struct json_object *items = json_object_new_array();
  const struct lynx_reg_node *n;
  uint32_t a;
  for (n = r->nodes; n; n = n->next)
    for (a = 0; a < n->n_accels; a++)
      json_object_array_add(items, lynx_json_accel(n, &n->accels[a], now_ms));
  return list_obj(r, items);
}

/* ---- pages of the big lists ---------------------------------------------- */

static int node_ptr_cmp(const void *a, const void *b) {
  const struct lynx_reg_node *x = *(const struct lynx_reg_node *const *)a,
                             *y = *(const struct lynx_reg_node *const *)b;
  return strcmp(x->id, y->id);
}

/* The nodes sorted by id ((*n) of them; NULL when there are none or out of
 * memory: *n says which). */
static const struct lynx_reg_node **nodes_by_id(const struct lynx_registry *r,
                                                size_t *n) {
  const struct lynx_reg_node **v, *nd;
  size_t k = 0;
  *n = 0;
  for (nd = r->nodes; nd; nd = nd->next)
    k++;
  if (!k)
    return NULL;
  v = malloc(k * sizeof(*v));
  if (!v) {
    *n = SIZE_MAX;
    return NULL;
  }
  k = 0;
  for (nd = r->nodes; nd; nd = nd->next)
    v[k++] = nd;
  qsort(v, k, sizeof(*v), node_ptr_cmp);
  *n = k;
  return v;
}

int lynx_json_each_by_id(const struct lynx_registry *r, uint64_t now_ms,
                         int accels,
                         void (*fn)(void *arg, const char *node, uint32_t idx,
                                    struct json_object *o),
                         void *arg) {
  size_t n;
  const struct lynx_reg_node **v = nodes_by_id(r, &n);
  if (n == SIZE_MAX)
    return -ENOMEM;
  for (size_t k = 0; k < n; k++) {
    if (!accels) {
      fn(arg, v[k]->id, 0, lynx_json_node(r, v[k], now_ms));
      continue;
    }
    /* by index (an agent may list them in any order): positions sorted
     * by insertion, a node has at most LYNX_ACCELS_MAX */
    {
      uint32_t pos[LYNX_ACCELS_MAX], m = 0;
      for (uint32_t a = 0; a < v[k]->n_accels && m < LYNX_ACCELS_MAX; a++) {
        uint32_t j = m++;
        while (j &&
               v[k]->accels[pos[j - 1]].info.idx > v[k]->accels[a].info.idx) {
          pos[j] = pos[j - 1];
          j--;
        }
        pos[j] = a;
      }
      for (uint32_t j = 0; j < m; j++)
        fn(arg, v[k]->id, v[k]->accels[pos[j]].info.idx,
           lynx_json_accel(v[k], &v[k]->accels[pos[j]], now_ms));
    }
  }
  free(v);
  return 0;
}

/* Frontends' per-mqueue reports merged by (instance, q): sorted, one entry
 * per key, so each mqueue finds its sums with one binary search. */
struct mq_sum {
  uint64_t instance_id;
  uint32_t q;
  uint64_t dispatched, responded, outstanding;
  /* 1 + enum lynx_transport_id as a connected frontend reports it, its
   * negative as a disconnected one's last report did, 0: none said */
  int transport;
};

static int mq_sum_cmp(const void *a, const void *b) {
  const struct mq_sum *x = a, *y = b;
  if (x->instance_id != y->instance_id)
    return x->instance_id < y->instance_id ? -1 : 1;
  return x->q < y->q ? -1 : x->q > y->q;
}

static struct mq_sum *mq_sums(const struct lynx_registry *r, size_t *count) {
  const struct lynx_reg_frontend *f;
  struct mq_sum *v;
  size_t total = 0, k = 0, m, out;
  *count = 0;
  for (f = r->frontends; f; f = f->next)
    total += f->n_mqs;
  if (!total)
    return NULL;
  v = malloc(total * sizeof(*v));
  if (!v)
    return NULL;
  for (f = r->frontends; f; f = f->next)
    for (m = 0; m < f->n_mqs; m++, k++) {
      v[k].instance_id = f->mqs[m].instance_id;
      v[k].q = f->mqs[m].q;
      v[k].dispatched = f->mqs[m].dispatched;
      v[k].responded = f->mqs[m].responded;
      /* a disconnected frontend's counts stay, its in-flight view is stale */
      v[k].outstanding = f->connected ? f->mqs[m].outstanding : 0;
      v[k].transport =
          f->connected ? f->mqs[m].transport : -f->mqs[m].transport;
    }
  qsort(v, total, sizeof(*v), mq_sum_cmp);
  for (k = 1, out = 0; k < total; k++) {
    if (!mq_sum_cmp(&v[k], &v[out])) {
      v[out].dispatched += v[k].dispatched;
      v[out].responded += v[k].responded;
      v[out].outstanding += v[k].outstanding;
      /* a report, a connected frontend's over a disconnected one's */
      if (v[out].transport == 0 || (v[out].transport < 0 && v[k].transport > 0))
        v[out].transport = v[k].transport;
    } else {
      v[++out] = v[k];
    }
  }
  *count = out + 1;
  return v;
}

/* The frontend producing into i (its owner, while it is not moving), or
 * NULL. */
static const struct lynx_reg_frontend *
inst_producer(const struct lynx_registry *r,
              const struct lynx_reg_instance *i) {
  if (i->fe_release_version || !i->fe_owner[0])
    return NULL;
  for (const struct lynx_reg_frontend *f = r->frontends; f; f = f->next)
    if (strcmp(f->id, i->fe_owner) == 0)
      return f;
  return NULL;
}

/* How f reports it reaches instance id's mqueue q (1 + enum
 * lynx_transport_id), or 0 where f (NULL: none) does not say. */
static int fe_transport(const struct lynx_reg_frontend *f, uint64_t id,
                        uint32_t q) {
  for (uint32_t m = 0; f && m < f->n_mqs; m++)
    if (f->mqs[m].instance_id == id && f->mqs[m].q == q)
      return f->mqs[m].transport;
  return 0;
}

/* A reported transport (mq_sum's) by name, else the descriptor's. */
static const char *mq_transport(int t, const char *desc) {
  t = (t < 0 ? -t : t) - 1;
  return t >= 0 && t < LYNX_TRANSPORT_COUNT ? lynx_transport_names[t] : desc;
}

struct json_object *lynx_json_mqueues(const struct lynx_registry *r) {
  struct json_object *items = json_object_new_array();
  const struct lynx_reg_service *s;
  const struct lynx_reg_instance *i;
  size_t n_sums;
  struct mq_sum *sums = mq_sums(r, &n_sums);
  uint32_t q;
  for (s = r->services; s; s = s->next)
    for (i = r->instances; i; i = i->next) {
      if (i->svc != s || i->state != LYNX_INST_READY)
        continue;
      const struct lynx_reg_frontend *prod = inst_producer(r, i);
      for (q = 0; q < i->desc.n_mqueues; q++) {
        struct json_object *o = json_object_new_object();
        int t;
        struct mq_sum key = {i->id, q, 0, 0, 0, 0}, *hit = NULL;
        char id[3 * LYNX_ID_MAX + 32];
        if (sums)
          hit = bsearch(&key, sums, n_sums, sizeof(key), mq_sum_cmp);
        snprintf(id, sizeof(id), "%s/%s/%" PRIu32 "/%" PRIu32, s->spec.name,
                 i->node->id, i->accel_idx, q);
        add_str(o, "id", id);
        add_str(o, "service", s->spec.name);
        add_str(o, "node", i->node->id);
        add_u64(o, "accel", i->accel_idx);
        add_u64(o, "instance", i->id);
        add_u64(o, "index", q);
        add_u64(o, "slots", i->desc.slots);
        add_u64(o, "slot_size", i->desc.slot_size);
        /* how its producer reaches it, as that frontend reports; else
         * as another frontend did (a connected one's report first: the
         * producer moving, or not yet reporting); else the descriptor's */
        t = fe_transport(prod, i->id, q);
        if (!t && hit)
          t = hit->transport;
        add_str(o, "transport", mq_transport(t, i->desc.transport));
        add_str(o, "locator", i->desc.locator);
        {
          struct json_object *offer = json_object_new_array();
          json_object_array_add(offer,
                                json_object_new_string(i->desc.transport));
          if (i->desc.shm_locator[0])
            json_object_array_add(offer, json_object_new_string("shm"));
          json_object_object_add(o, "transports", offer);
        }
        /* its one producer ("" none: no active frontend, or moving) */
        add_str(o, "frontend", i->fe_release_version ? "" : i->fe_owner);
        add_u64(o, "epoch", i->fe_release_version ? 0 : i->fe_epoch);
        add_u64(o, "dispatched", hit ? hit->dispatched : 0);
        add_u64(o, "responded", hit ? hit->responded : 0);
        add_u64(o, "outstanding", hit ? hit->outstanding : 0);
        /* in the frontends' table: node ready and accelerator healthy */
        json_object_object_add(
            o, "dispatchable",
            json_object_new_boolean(lynx_reg_inst_dispatchable(i)));
        json_object_array_add(items, o);
      }
    }
  free(sums);
  return list_obj(r, items);
}

struct json_object *lynx_json_services(const struct lynx_registry *r,
                                       const char *unknown) {
  struct json_object *items = json_object_new_array();
  const struct lynx_reg_service *s;
  for (s = r->services; s; s = s->next)
    json_object_array_add(items, lynx_json_service(r, s, unknown));
  return list_obj(r, items);
}

struct json_object *lynx_json_frontends(const struct lynx_registry *r,
                                        uint64_t now_ms) {
  struct json_object *items = json_object_new_array();
  const struct lynx_reg_frontend *f;
  for (f = r->frontends; f; f = f->next)
    json_object_array_add(items, lynx_json_frontend(r, f, now_ms));
  return list_obj(r, items);
}

struct json_object *lynx_json_error(const char *code, const char *message) {
  struct json_object *o = json_object_new_object(), *e;
  e = json_object_new_object();
  add_str(e, "code", code);
  add_str(e, "message", message);
  json_object_object_add(o, "error", e);
  return o;
}

/* ---- decoding ------------------------------------------------------- */

static int bad(struct lynx_reg_err *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int bad(struct lynx_reg_err *err, const char *fmt, ...) {
  va_list ap;
  if (err) {
    err->status = 400;
    snprintf(err->code, sizeof(err->code), "invalid_argument");
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
  }
  return -EINVAL;
}

static int get_string(struct json_object *v, const char *field, char *dst,
                      size_t size, struct lynx_reg_err *err) {
  const char *s;
  size_t len;
  if (!json_object_is_type(v, json_type_string))
    return bad(err, "%s: must be a string", field);
  s = json_object_get_string(v);
  len = (size_t)json_object_get_string_len(v);
  if (len >= size)
    return bad(err, "%s: longer than %zu characters", field, size - 1);
  if (memchr(s, '\0', len))
    return bad(err, "%s: contains a NUL character", field);
  if (!lynx_text_ok(s, len))
    return bad(err, "%s: must be valid UTF-8 without control characters",
               field);
  memcpy(dst, s, len);
  dst[len] = '\0';
  return 0;
}

/* A non-negative JSON integer up to UINT32_MAX. With clamp, a larger value
 * becomes UINT32_MAX so the range check that follows (and names the real
 * bounds) refuses it. */
static int get_u32(struct json_object *v, const char *field, int clamp,
                   uint32_t *out, struct lynx_reg_err *err) {
  uint64_t u;
  if (!json_object_is_type(v, json_type_int))
    return bad(err, "%s: must be an integer", field);
  if (json_object_get_int64(v) < 0)
    return bad(err, "%s: must not be negative", field);
  u = json_object_get_uint64(v);
  if (u > UINT32_MAX) {
    if (!clamp)
      return bad(err, "%s: must be at most %" PRIu32, field, UINT32_MAX);
    u = UINT32_MAX;
  }
  *out = (uint32_t)u;
  return 0;
}

static int get_selector(struct json_object *v, struct lynx_service_spec *sp,
                        struct lynx_reg_err *err) {
  char field[LYNX_LABEL_MAX + 32];
  sp->n_selector = 0;
  if (!json_object_is_type(v, json_type_object))
    return bad(err, "placement.selector: must be an object of strings");
  json_object_object_foreach(v, key, val) {
    struct lynx_label *l;
    if (sp->n_selector >= LYNX_LABELS_MAX)
      return bad(err, "placement.selector: at most %d labels", LYNX_LABELS_MAX);
    l = &sp->selector[sp->n_selector];
    if (!*key || strlen(key) >= LYNX_LABEL_MAX)
      return bad(err, "placement.selector: keys must be 1-%d characters",
                 LYNX_LABEL_MAX - 1);
    if (!lynx_text_ok(key, strlen(key)))
      return bad(err, "placement.selector: keys must be valid UTF-8 without "
                      "control characters");
    snprintf(field, sizeof(field), "placement.selector.%s", key);
    if (get_string(val, field, l->value, sizeof(l->value), err))
      return -EINVAL;
    snprintf(l->key, sizeof(l->key), "%s", key);
    sp->n_selector++;
  }
  return 0;
}

/* "framing": "len32" or {"fixed": N} (N > 0). */
static int get_framing(struct json_object *v, struct lynx_service_spec *sp,
                       struct lynx_reg_err *err) {
  struct json_object *n;
  if (json_object_is_type(v, json_type_string) &&
      !strcmp(json_object_get_string(v), "len32")) {
    sp->fixed_len = 0;
    return 0;
  }
  if (json_object_is_type(v, json_type_object) &&
      json_object_object_length(v) == 1 &&
      json_object_object_get_ex(v, "fixed", &n)) {
    int rc = get_u32(n, "framing.fixed", 1, &sp->fixed_len, err);
    if (!rc && sp->fixed_len == 0)
      rc = bad(err, "framing.fixed: must be at least 1");
    return rc;
  }
  return bad(err, "framing: must be \"len32\" or {\"fixed\": N}");
}

/* "backends": [{"name": N, "address": "host:port", "proto": P}, ...] */
static int get_backends(struct json_object *v, struct lynx_service_spec *sp,
                        struct lynx_reg_err *err) {
  size_t n;
  if (!json_object_is_type(v, json_type_array))
    return bad(err, "backends: must be an array of {\"name\", \"address\", "
                    "\"proto\"}");
  n = json_object_array_length(v);
  if (n > LYNX_BACKENDS_MAX)
    return bad(err, "backends: at most %u", LYNX_BACKENDS_MAX);
  sp->n_backends = 0;
  for (size_t i = 0; i < n; i++) {
    struct json_object *b = json_object_array_get_idx(v, i);
    struct lynx_backend_spec *o = &sp->backends[i];
    char f[48];
    int have_name = 0, have_addr = 0;
    memset(o, 0, sizeof(*o));
    snprintf(o->proto, sizeof(o->proto), "len32");
    if (!json_object_is_type(b, json_type_object))
      return bad(err, "backends[%zu]: must be an object", i);
    json_object_object_foreach(b, key, val) {
      int rc;
      snprintf(f, sizeof(f), "backends[%zu].%s", i, key);
      if (!strcmp(key, "name")) {
        rc = get_string(val, f, o->name, sizeof(o->name), err);
        have_name = 1;
      } else if (!strcmp(key, "address")) {
        rc = get_string(val, f, o->address, sizeof(o->address), err);
        have_addr = 1;
      } else if (!strcmp(key, "proto")) {
        rc = get_string(val, f, o->proto, sizeof(o->proto), err);
      } else {
        rc = bad(err, "%s: unknown field", f);
      }
      if (rc)
        return rc;
    }
    if (!have_name || !have_addr)
      return bad(err, "backends[%zu]: name and address are required", i);
    sp->n_backends++;
  }
  return 0;
}

static int get_placement(struct json_object *v, struct lynx_service_spec *sp,
                         struct lynx_reg_err *err) {
  int have_replicas = 0;
  if (json_object_is_type(v, json_type_string)) {
    if (strcmp(json_object_get_string(v), "all"))
      return bad(err, "placement: must be \"all\" or {\"replicas\": N, "
                      "\"selector\": {...}}");
    sp->placement = LYNX_PLACE_ALL;
    sp->replicas = 0;
    sp->n_selector = 0;
    return 0;
  }
  if (!json_object_is_type(v, json_type_object))
    return bad(err,
               "placement: must be \"all\" or {\"replicas\": N, \"selector\": "
               "{...}}");
  sp->n_selector = 0;
  json_object_object_foreach(v, key, val) {
    if (!strcmp(key, "replicas")) {
      if (get_u32(val, "placement.replicas", 0, &sp->replicas, err))
        return -EINVAL;
      if (sp->replicas < 1 || sp->replicas > REPLICAS_MAX)
        return bad(err, "placement.replicas: must be between 1 and %u",
                   REPLICAS_MAX);
      have_replicas = 1;
    } else if (!strcmp(key, "selector")) {
      if (get_selector(val, sp, err))
        return -EINVAL;
    } else {
      return bad(err, "placement.%s: unknown field", key);
    }
  }
  /* {"selector": {...}} alone: every accelerator of every matching node */
  sp->placement = have_replicas ? LYNX_PLACE_REPLICAS : LYNX_PLACE_ALL;
  if (!have_replicas)
    sp->replicas = 0;
  return 0;
}

/* app_config: any JSON object, kept as its compact text; the application
 * checks it when an instance starts. */
static int get_app_config(struct json_object *v, struct lynx_service_spec *sp,
                          struct lynx_reg_err *err) {
  const char *t;
  size_t n;
  if (!json_object_is_type(v, json_type_object))
    return bad(err, "app_config: must be a JSON object (the application's "
                    "configuration)");
  t = json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN);
  n = t ? strlen(t) : 0;
  if (!t || n >= sizeof(sp->app_config))
    return bad(err, "app_config: %zu bytes of JSON; at most %zu", n,
               sizeof(sp->app_config) - 1);
  memcpy(sp->app_config, t, n + 1);
  return 0;
}

int lynx_json_service_spec(struct json_object *j, struct lynx_service_spec *out,
                           struct lynx_reg_err *err) {
  struct lynx_service_spec sp;
  int have_name = 0, have_port = 0, have_app = 0, have_framing = 0, rc;

  if (!out)
    return -EINVAL;
  if (!j || !json_object_is_type(j, json_type_object))
    return bad(err, "service: must be a JSON object");
  memset(&sp, 0, sizeof(sp));
  snprintf(sp.proto, sizeof(sp.proto), "udp");
  sp.slot_size = 2048;
  sp.slots = 256;
  sp.mqueues_per_accel = 4;
  sp.work_us = 0;
  sp.placement = LYNX_PLACE_ALL;

  json_object_object_foreach(j, key, val) {
    if (!strcmp(key, "name")) {
      rc = get_string(val, "name", sp.name, sizeof(sp.name), err);
      have_name = 1;
    } else if (!strcmp(key, "proto")) {
      rc = get_string(val, "proto", sp.proto, sizeof(sp.proto), err);
      if (rc == -EINVAL && json_object_is_type(val, json_type_string))
        rc = bad(err, "proto: must be \"udp\" or \"tcp\"");
    } else if (!strcmp(key, "backends")) {
      rc = get_backends(val, &sp, err);
    } else if (!strcmp(key, "framing")) {
      rc = get_framing(val, &sp, err);
      have_framing = 1;
    } else if (!strcmp(key, "port")) {
      rc = get_u32(val, "port", 1, &sp.port, err);
      have_port = 1;
    } else if (!strcmp(key, "app")) {
      rc = get_string(val, "app", sp.app, sizeof(sp.app), err);
      have_app = 1;
    } else if (!strcmp(key, "slot_size")) {
      rc = get_u32(val, "slot_size", 1, &sp.slot_size, err);
    } else if (!strcmp(key, "slots")) {
      rc = get_u32(val, "slots", 1, &sp.slots, err);
    } else if (!strcmp(key, "msg_max")) {
      rc = get_u32(val, "msg_max", 1, &sp.msg_max, err);
    } else if (!strcmp(key, "mqueues_per_accel")) {
      rc = get_u32(val, "mqueues_per_accel", 1, &sp.mqueues_per_accel, err);
    } else if (!strcmp(key, "work_us")) {
      rc = get_u32(val, "work_us", 1, &sp.work_us, err);
      if (!rc && sp.work_us > WORK_US_MAX)
        rc = bad(err, "work_us: must be between 0 and %u", WORK_US_MAX);
    } else if (!strcmp(key, "placement")) {
      rc = get_placement(val, &sp, err);
    } else if (!strcmp(key, "app_config")) {
      rc = get_app_config(val, &sp, err);
    } else {
      rc = bad(err, "%s: unknown field", key);
    }
    if (rc)
      return rc;
  }
  if (!have_name)
    return bad(err, "name: required");
  if (!have_port)
    return bad(err, "port: required");
  if (!have_app)
    return bad(err, "app: required");
  if (have_framing && strcmp(sp.proto, "tcp"))
    return bad(err, "framing: only a tcp service has one");
  if (!sp.msg_max) /* absent or 0: the protocol's (a datagram, a len32
                    * frame, N fixed bytes) */
    sp.msg_max = strcmp(sp.proto, "tcp") ? LYNX_UDP_MSG_MAX
                 : sp.fixed_len          ? sp.fixed_len
                                         : LYNX_TCP_MSG_MAX;
  rc = lynx_service_spec_validate(&sp, err);
  if (rc)
    return rc;
  *out = sp;
  return 0;
}
