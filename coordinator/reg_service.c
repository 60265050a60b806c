/*
 * reg_service.c - services: the checks on a spec, adding and deleting one,
 * and whether it is served (registry.h, "operators").
 *
 * A spec is checked on its own (lynx_service_spec_validate, shared with
 * the JSON decoder), against the operator's limits (--region-max-mb,
 * --services-max) and against what the registered accelerators run, then
 * added whole: lynx_reg_service_prepare makes every check without
 * touching r, so the API saves the service before lynx_reg_service_add,
 * which cannot fail. Placement (reg_place.c) then starts its instances.
 */
#include "reg_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "mqueue.h"
#include "util.h"

/* ---- the spec ------------------------------------------------------- */

int lynx_service_spec_validate(const struct lynx_service_spec *sp,
                               struct lynx_reg_err *err) {
  struct lynx_geom g;
  uint32_t k, j;
  if (!sp) {
    ERR_INVALID(err, "service: missing");
    return -EINVAL;
  }
  if (!lynx__reg_id_ok(sp->name, sizeof(sp->name), 0)) {
    ERR_INVALID(err, "name: must be 1-%zu characters of [A-Za-z0-9_.-]",
                sizeof(sp->name) - 1);
    return -EINVAL;
  }
  if (lynx__reg_slen(sp->proto, sizeof(sp->proto)) >= sizeof(sp->proto) ||
      (strcmp(sp->proto, "udp") && strcmp(sp->proto, "tcp"))) {
    ERR_INVALID(err, "proto: must be \"udp\" or \"tcp\"");
    return -EINVAL;
  }
  if (sp->fixed_len && strcmp(sp->proto, "tcp")) {
    ERR_INVALID(err, "framing: only a tcp service has one");
    return -EINVAL;
  }
  if (sp->port < 1 || sp->port > 65535) {
    ERR_INVALID(err, "port: must be between 1 and 65535");
    return -EINVAL;
  }
  if (lynx__reg_slen(sp->app, sizeof(sp->app)) == 0 ||
      lynx__reg_slen(sp->app, sizeof(sp->app)) >= sizeof(sp->app)) {
    ERR_INVALID(err, "app: must be 1-%zu characters", sizeof(sp->app) - 1);
    return -EINVAL;
  }
  if (!lynx_text_ok(sp->app, lynx__reg_slen(sp->app, sizeof(sp->app)))) {
    ERR_INVALID(err, "app: must be valid UTF-8 without control characters");
    return -EINVAL;
  }
  if (!lynx_is_pow2(sp->slot_size) || sp->slot_size < LYNX_SLOT_MIN ||
      sp->slot_size > LYNX_SLOT_MAX) {
    ERR_INVALID(err, "slot_size: must be a power of two between %u and %u",
                LYNX_SLOT_MIN, LYNX_SLOT_MAX);
    return -EINVAL;
  }
  if (!lynx_is_pow2(sp->slots) || sp->slots < LYNX_SLOTS_MIN ||
      sp->slots > LYNX_SLOTS_MAX) {
    ERR_INVALID(err, "slots: must be a power of two between %u and %u",
                LYNX_SLOTS_MIN, LYNX_SLOTS_MAX);
    return -EINVAL;
  }
  if (sp->mqueues_per_accel < 1 || sp->mqueues_per_accel > LYNX_MQUEUES_MAX) {
    ERR_INVALID(err, "mqueues_per_accel: must be between 1 and %u",
                LYNX_MQUEUES_MAX);
    return -EINVAL;
  }
  if (lynx_geom_init(&g, sp->mqueues_per_accel, sp->slots, sp->slot_size, 0)) {
    ERR_INVALID(err, "slots: geometry out of bounds");
    return -EINVAL;
  }
  if (sp->msg_max > LYNX_LARGE_MAX / 2) { /* 0: what a slot holds */
    ERR_INVALID(err, "msg_max: must be at most %u bytes", LYNX_LARGE_MAX / 2);
    return -EINVAL;
  }
  if (sp->fixed_len > (sp->msg_max > lynx_slot_cap(sp->slot_size)
                           ? sp->msg_max
                           : lynx_slot_cap(sp->slot_size))) {
    ERR_INVALID(err,
                "framing: fixed messages of %u bytes are longer than "
                "msg_max (%u) and a %u-byte slot's payload",
                sp->fixed_len, sp->msg_max, sp->slot_size);
    return -EINVAL;
  }
  if (sp->n_backends > LYNX_BACKENDS_MAX ||
      lynx_geom_init(&g, sp->mqueues_per_accel + sp->n_backends, sp->slots,
                     sp->slot_size,
                     lynx_large_for(sp->msg_max, sp->slot_size))) {
    ERR_INVALID(err,
                "backends: at most %u, and mqueues_per_accel plus "
                "backends at most %u",
                LYNX_BACKENDS_MAX, LYNX_MQUEUES_MAX);
    return -EINVAL;
  }
  for (k = 0; k < sp->n_backends; k++) {
    const struct lynx_backend_spec *b = &sp->backends[k];
    struct sockaddr_storage ss;
    if (!lynx__reg_id_ok(b->name, sizeof(b->name), 0)) {
      ERR_INVALID(err,
                  "backends[%u].name: must be 1-%zu characters of "
                  "[A-Za-z0-9_.-]",
                  k, sizeof(b->name) - 1);
      return -EINVAL;
    }
    if (lynx__reg_slen(b->address, sizeof(b->address)) >= sizeof(b->address) ||
        lynx_parse_hostport(b->address, &ss) ||
        ((struct sockaddr_in *)&ss)->sin_port == 0) {
      ERR_INVALID(err, "backends[%u].address: must be a numeric host:port", k);
      return -EINVAL;
    }
    if (strcmp(b->proto, "memcached") && strcmp(b->proto, "len32")) {
      ERR_INVALID(err,
                  "backends[%u].proto: must be \"memcached\" or "
                  "\"len32\"",
                  k);
      return -EINVAL;
    }
    for (j = 0; j < k; j++)
      if (!strcmp(sp->backends[j].name, b->name)) {
        ERR_INVALID(err, "backends[%u].name: '%s' appears twice", k, b->name);
        return -EINVAL;
      }
  }
  if (sp->placement != LYNX_PLACE_ALL && sp->placement != LYNX_PLACE_REPLICAS) {
    ERR_INVALID(err, "placement: must be \"all\" or {\"replicas\": N}");
    return -EINVAL;
  }
  if (sp->placement == LYNX_PLACE_REPLICAS && sp->replicas < 1) {
    ERR_INVALID(err, "placement.replicas: must be at least 1");
    return -EINVAL;
  }
  if (sp->n_selector > LYNX_LABELS_MAX) {
    ERR_INVALID(err, "placement.selector: at most %d labels", LYNX_LABELS_MAX);
    return -EINVAL;
  }
  for (k = 0; k < sp->n_selector; k++) {
    size_t kl = lynx__reg_slen(sp->selector[k].key, LYNX_LABEL_MAX);
    if (kl == 0 || kl >= LYNX_LABEL_MAX ||
        lynx__reg_slen(sp->selector[k].value, LYNX_LABEL_MAX) >=
            LYNX_LABEL_MAX) {
      ERR_INVALID(err,
                  "placement.selector: keys must be 1-%d characters, values "
                  "at most %d",
                  LYNX_LABEL_MAX - 1, LYNX_LABEL_MAX - 1);
      return -EINVAL;
    }
    if (!lynx_text_ok(sp->selector[k].key, kl) ||
        !lynx_text_ok(sp->selector[k].value,
                      lynx__reg_slen(sp->selector[k].value, LYNX_LABEL_MAX))) {
      ERR_INVALID(err,
                  "placement.selector: key and value %u must be valid "
                  "UTF-8 without control characters",
                  k);
      return -EINVAL;
    }
    for (j = 0; j < k; j++)
      if (!strcmp(sp->selector[k].key, sp->selector[j].key)) {
        ERR_INVALID(err, "placement.selector: key %s appears twice",
                    sp->selector[k].key);
        return -EINVAL;
      }
  }
  return 0;
}

uint64_t lynx_service_region_bytes(const struct lynx_service_spec *sp) {
  struct lynx_geom g;
  if (!sp || sp->n_backends > LYNX_BACKENDS_MAX ||
      lynx_geom_init(&g, sp->mqueues_per_accel + sp->n_backends, sp->slots,
                     sp->slot_size, lynx_large_for(sp->msg_max, sp->slot_size)))
    return 0;
  return g.region_size;
}

/* ---- the registry's checks ------------------------------------------ */

/* The operator's limit on a valid spec's region: -EFBIG (422) above
 * r->region_max_bytes, naming the computed size. */
static int region_limit(const struct lynx_registry *r,
                        const struct lynx_service_spec *sp,
                        struct lynx_reg_err *err) {
  uint64_t bytes = lynx_service_region_bytes(sp);
  if (!r->region_max_bytes || bytes <= r->region_max_bytes)
    return 0;
  lynx__reg_set_err(
      err, 422, "limit_exceeded",
      "region: %u slots of %u bytes (and %u bytes for large messages) "
      "in %u mqueues (%u per accelerator + %u for back ends), each with "
      "an RX and a TX ring, take %" PRIu64 " bytes (%" PRIu64
      " MiB) on every accelerator; the limit is "
      "%" PRIu64 " MiB (--region-max-mb)",
      sp->slots, sp->slot_size, lynx_large_for(sp->msg_max, sp->slot_size),
      sp->mqueues_per_accel + sp->n_backends, sp->mqueues_per_accel,
      sp->n_backends, bytes, (bytes + (1u << 20) - 1) >> 20,
      r->region_max_bytes >> 20);
  return -EFBIG;
}

/* The applications the accelerators of nodes that are not down say they
 * run, ", "-separated without repeats, into buf (len bytes). Returns 1
 * when one of them runs app, or one does not say (it may run any). */
static int apps_known(const struct lynx_registry *r, const char *app, char *buf,
                      size_t len) {
  const char *seen[LYNX_APPS_MAX * 2];
  uint32_t n_seen = 0;
  size_t l = 0;
  buf[0] = 0;
  for (const struct lynx_reg_node *n = r->nodes; n; n = n->next) {
    if (n->state == LYNX_NODE_DOWN)
      continue;
    for (uint32_t a = 0; a < n->n_accels; a++) {
      const struct lynx_accel_info *in = &n->accels[a].info;
      if (lynx_reg_accel_runs(&n->accels[a], app))
        return 1;
      for (uint32_t k = 0; k < in->n_apps && k < LYNX_APPS_MAX; k++) {
        uint32_t j = 0;
        while (j < n_seen && strcmp(seen[j], in->apps[k]))
          j++;
        if (j < n_seen || n_seen == LYNX_APPS_MAX * 2)
          continue;
        seen[n_seen++] = in->apps[k];
        l = lynx_appendf(buf, len, l, ", ", "%s", in->apps[k]);
      }
    }
  }
  return 0;
}

/* A node that is not down whose agent refused app's plug-in, with the
 * reason in *reason; NULL when none did. */
static const struct lynx_reg_node *app_refused(const struct lynx_registry *r,
                                               const char *app,
                                               const char **reason) {
  for (const struct lynx_reg_node *n = r->nodes; n; n = n->next) {
    if (n->state == LYNX_NODE_DOWN)
      continue;
    for (uint32_t k = 0; k < n->n_refused_apps; k++)
      if (!strcmp(n->refused_apps[k].name, app)) {
        *reason = n->refused_apps[k].reason;
        return n;
      }
  }
  return NULL;
}

/* The back end app calls by name, as a registered accelerator that runs
 * it says (AccelInfo.app_backends): "" when it calls none, NULL when no
 * such accelerator says. */
static const char *app_backend(const struct lynx_registry *r, const char *app) {
  for (const struct lynx_reg_node *n = r->nodes; n; n = n->next) {
    if (n->state == LYNX_NODE_DOWN)
      continue;
    for (uint32_t a = 0; a < n->n_accels; a++) {
      const struct lynx_accel_info *in = &n->accels[a].info;
      if (!in->has_app_backends)
        continue;
      for (uint32_t k = 0; k < in->n_apps && k < LYNX_APPS_MAX; k++)
        if (!strcmp(in->apps[k], app))
          return in->app_backends[k];
    }
  }
  return NULL;
}

/* An app the registered accelerators cannot run: 422 naming it and what
 * they run. An app that calls a back end the service does not give (mc-get
 * without "db"): 400, as it could start nowhere. With no agent registered,
 * or one that does not list what it runs, it is taken, and the service's
 * state says pending until one that runs it registers. */
static int app_check(const struct lynx_registry *r,
                     const struct lynx_service_spec *sp,
                     struct lynx_reg_err *err) {
  char known[512], have[LYNX_BACKENDS_MAX * (LYNX_BACKEND_NAME_MAX + 2)];
  const char *need, *why;
  size_t l = 0;
  /* an app an agent refused is taken: the service's reason then says why
   * it runs nowhere, until an agent loads it */
  if (!apps_known(r, sp->app, known, sizeof(known)) && known[0] &&
      !app_refused(r, sp->app, &why)) {
    lynx__reg_set_err(
        err, 422, "unknown_app",
        "app: no registered accelerator runs application '%s' (they "
        "run: %s)",
        sp->app, known);
    return -EINVAL;
  }
  need = app_backend(r, sp->app);
  if (!need || !need[0])
    return 0;
  have[0] = 0;
  for (uint32_t k = 0; k < sp->n_backends; k++) {
    if (!strcmp(sp->backends[k].name, need))
      return 0;
    l = lynx_appendf(have, sizeof(have), l, ", ", "%s", sp->backends[k].name);
  }
  lynx__reg_set_err(
      err, 400, "invalid_argument",
      "backends: application '%s' calls back end '%s', which this "
      "service does not give (its back ends: %s); add {\"name\": "
      "\"%s\", \"address\": \"host:port\"} (docs/client-mqueues.md)",
      sp->app, need, have[0] ? have : "none", need);
  return -EINVAL;
}

/* The operator's limit on the number of services: -ENOSPC (409) when
 * r->services_max exist. Each one costs every frontend a thread and
 * descriptors, and every accelerator it runs on a region. */
static int count_limit(const struct lynx_registry *r,
                       struct lynx_reg_err *err) {
  const struct lynx_reg_service *s;
  uint32_t n = 0;
  if (!r->services_max)
    return 0;
  for (s = r->services; s; s = s->next)
    n++;
  if (n < r->services_max)
    return 0;
  lynx__reg_set_err(err, 409, "limit_exceeded",
                    "services: %" PRIu32
                    " exist, the limit (--services-max); delete "
                    "one first",
                    n);
  return -ENOSPC;
}

/* ---- services ------------------------------------------------------- */

struct lynx_reg_service *lynx_reg_service_find(struct lynx_registry *r,
                                               const char *name) {
  struct lynx_reg_service *s;
  if (!name)
    return NULL;
  for (s = r->services; s; s = s->next)
    if (!strncmp(s->spec.name, name, sizeof(s->spec.name)))
      return s;
  return NULL;
}

int lynx_reg_service_prepare(struct lynx_registry *r,
                             const struct lynx_service_spec *spec,
                             struct lynx_reg_service **out,
                             struct lynx_reg_err *err) {
  const struct lynx_reg_service *o;
  struct lynx_reg_service *s;
  int rc = lynx_service_spec_validate(spec, err);
  *out = NULL;
  if (rc)
    return rc;
  rc = region_limit(r, spec, err);
  if (!rc)
    rc = app_check(r, spec, err);
  if (rc)
    return rc;
  if (lynx_reg_service_find(r, spec->name)) {
    ERR_CONFLICT(err, "name: service %s already exists", spec->name);
    return -EEXIST;
  }
  for (o = r->services; o; o = o->next)
    if (o->spec.port == spec->port) {
      ERR_CONFLICT(err, "port: %u is in use by service %s", spec->port,
                   o->spec.name);
      return -EADDRINUSE;
    }
  rc = count_limit(r, err);
  if (rc)
    return rc;
  s = calloc(1, sizeof(*s));
  if (!s) {
    lynx__reg_set_err(err, 500, "internal", "out of memory");
    return -ENOMEM;
  }
  s->spec = *spec;
  /* normalise: unused selector entries and a meaningless replica count */
  if (s->spec.placement == LYNX_PLACE_ALL)
    s->spec.replicas = 0;
  memset(s->spec.selector + s->spec.n_selector, 0,
         (LYNX_LABELS_MAX - s->spec.n_selector) * sizeof(s->spec.selector[0]));
  *out = s;
  return 0;
}

void lynx_reg_service_add(struct lynx_registry *r, struct lynx_reg_service *s,
                          uint64_t now_ms) {
  struct lynx_reg_service **tail;
  s->created_ms = now_ms;
  s->next = NULL;
  for (tail = &r->services; *tail; tail = &(*tail)->next)
    ;
  *tail = s;
  r->version++;
  lynx__reg_reconcile(r);
  lynx__reg_table_commit(r);
}

int lynx_reg_service_create(struct lynx_registry *r,
                            const struct lynx_service_spec *spec,
                            uint64_t now_ms, struct lynx_reg_err *err) {
  struct lynx_reg_service *s;
  int rc = lynx_reg_service_prepare(r, spec, &s, err);
  if (!rc)
    lynx_reg_service_add(r, s, now_ms);
  return rc;
}

int lynx_reg_service_delete(struct lynx_registry *r, const char *name,
                            uint64_t now_ms, struct lynx_reg_err *err) {
  struct lynx_reg_service *s, **sp;
  struct lynx_reg_instance **pp;
  (void)now_ms;
  for (sp = &r->services; *sp; sp = &(*sp)->next)
    if (name && !strncmp((*sp)->spec.name, name, sizeof((*sp)->spec.name)))
      break;
  if (!*sp) {
    ERR_NOTFOUND(err, "service %s not found", name ? name : "");
    return -ENOENT;
  }
  s = *sp;
  pp = &r->instances;
  while (*pp) {
    if ((*pp)->svc != s) {
      pp = &(*pp)->next;
      continue;
    }
    if ((*pp)->node->state == LYNX_NODE_DOWN)
      lynx__reg_inst_forget_at(r, pp);
    else
      lynx__reg_inst_stop_at(r, pp);
  }
  *sp = s->next;
  free(s);
  r->version++;
  lynx__reg_reconcile(r);
  lynx__reg_table_commit(r);
  return 0;
}

/* ---- whether it is served ------------------------------------------- */

/* A connected frontend that reports it cannot listen on s's port, or
 * NULL (with its listener record in *out). */
static const struct lynx_reg_frontend *
listen_failure(const struct lynx_registry *r, const struct lynx_reg_service *s,
               const struct lynx_fe_listen **out) {
  for (const struct lynx_reg_frontend *f = r->frontends; f; f = f->next) {
    if (!f->connected)
      continue;
    for (uint32_t k = 0; k < f->n_listen; k++)
      if (!f->listen[k].listening &&
          !strcmp(f->listen[k].service, s->spec.name)) {
        *out = &f->listen[k];
        return f;
      }
  }
  return NULL;
}

const char *lynx_reg_service_state(const struct lynx_registry *r,
                                   const struct lynx_reg_service *s,
                                   uint64_t *ready, uint64_t *wanted,
                                   char *reason, size_t len) {
  const struct lynx_fe_listen *fl = NULL;
  const struct lynx_reg_frontend *f;
  uint64_t matching = 0, runs = 0, nodes = 0;
  *ready = *wanted = 0;
  reason[0] = 0;
  /* ready: in the dispatch table (an instance on an unhealthy accelerator
   * is placed but not counted) */
  for (const struct lynx_reg_instance *i = r->instances; i; i = i->next)
    if (i->svc == s && lynx_reg_inst_dispatchable(i))
      (*ready)++;
  for (const struct lynx_reg_node *n = r->nodes; n; n = n->next) {
    nodes += n->state != LYNX_NODE_DOWN;
    if (n->state != LYNX_NODE_READY || !lynx_reg_labels_match(n, &s->spec))
      continue;
    matching += n->n_accels;
    for (uint32_t a = 0; a < n->n_accels; a++)
      runs += lynx_reg_accel_runs(&n->accels[a], s->spec.app);
  }
  *wanted = s->spec.placement == LYNX_PLACE_REPLICAS ? s->spec.replicas : runs;
  f = listen_failure(r, s, &fl);
  if (f) {
    snprintf(reason, len, "frontend %s: %s", f->id, fl->error);
    return "pending";
  }
  if (*ready && *ready >= *wanted)
    return "ready";
  if (s->last_error[0])
    snprintf(reason, len, "%s", s->last_error);
  else if (!nodes)
    snprintf(reason, len, "no agent has registered");
  else if (!matching)
    snprintf(reason, len, "no ready node matches the service's placement");
  else if (!runs) {
    char known[256];
    const char *why;
    const struct lynx_reg_node *n = app_refused(r, s->spec.app, &why);
    apps_known(r, s->spec.app, known, sizeof(known));
    if (n)
      snprintf(reason, len,
               "node %s refused the plug-in of application '%s': %s", n->id,
               s->spec.app, why);
    else
      snprintf(reason, len,
               "no accelerator of the matching nodes runs "
               "application '%s' (they run: %s)",
               s->spec.app, known);
  } else
    snprintf(reason, len, "%" PRIu64 " of %" PRIu64 " instances ready", *ready,
             *wanted);
  return *ready ? "degraded" : "pending";
}
