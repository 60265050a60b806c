/*
 * registry.c - the coordinator's registry (see registry.h): its lists and
 * lookups, the states every entity shares, and the dispatch table.
 *
 * The registry is split by what it keeps (reg_internal.h draws the
 * layers): this file is the bottom one, which every other calls, and it
 * calls none of them. It holds what the invariants of registry.h rest on:
 * who is in the table (lynx_reg_inst_dispatchable), the one commit that
 * ends a call (lynx__reg_table_commit), node state changes and the
 * instance list.
 *
 * Design notes:
 * - Lists, not indexes: nodes in registration order, services in creation
 *   order, instances by id (new ids are appended, so the instance list stays
 *   sorted). What needs more builds it per call (placement: reg_place.c).
 * - The dispatch table is not stored: it is the READY instances on READY
 *   nodes. Every change to that set marks r->table_dirty; the public call
 *   that made it ends with lynx__reg_table_commit(), which bumps
 *   table_version once and calls ops.tables_changed once, with the registry
 *   consistent.
 */
#include "reg_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- small helpers -------------------------------------------------- */

void lynx__reg_set_err(struct lynx_reg_err *err, int status, const char *code,
                       const char *fmt, ...) {
  va_list ap;
  if (!err)
    return;
  err->status = status;
  snprintf(err->code, sizeof(err->code), "%s", code);
  va_start(ap, fmt);
  vsnprintf(err->message, sizeof(err->message), fmt, ap);
  va_end(ap);
}

/* Identifiers that appear in API paths and label selectors. */
static int id_char_ok(char c, int colon) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-' ||
         (colon && c == ':');
}

int lynx__reg_id_ok(const char *s, size_t max, int colon) {
  size_t n, i;
  if (!s)
    return 0;
  n = lynx__reg_slen(s, max);
  if (n == 0 || n >= max)
    return 0;
  for (i = 0; i < n; i++)
    if (!id_char_ok(s[i], colon))
      return 0;
  return 1;
}

void lynx__reg_copy_str(char *dst, size_t size, const char *src) {
  snprintf(dst, size, "%s", src ? src : "");
}

/* ---- init / free ---------------------------------------------------- */

void lynx_reg_init(struct lynx_registry *r, uint64_t lease_ms,
                   uint64_t drain_timeout_ms, const struct lynx_reg_ops *ops) {
  memset(r, 0, sizeof(*r));
  r->lease_ms = lease_ms;
  r->drain_timeout_ms = drain_timeout_ms;
  r->next_instance_id = 1;
  if (ops)
    r->ops = *ops;
  /* placement has never run: make the first tick run it */
  r->placed_version = UINT64_MAX;
}

void lynx_reg_free(struct lynx_registry *r) {
  struct lynx_reg_instance *i, *inext;
  struct lynx_reg_node *n, *nnext;
  struct lynx_reg_service *s, *snext;
  struct lynx_reg_frontend *f, *fnext;
  struct lynx_reg_drain_intent *d, *dnext;
  if (!r)
    return;
  lynx_ev_free(&r->ev);
  for (i = r->instances; i; i = inext) {
    inext = i->next;
    free(i);
  }
  for (n = r->nodes; n; n = nnext) {
    nnext = n->next;
    free(n);
  }
  for (s = r->services; s; s = snext) {
    snext = s->next;
    free(s);
  }
  for (f = r->frontends; f; f = fnext) {
    fnext = f->next;
    free(f->mqs);
    free(f->listen);
    free(f->claims);
    free(f);
  }
  for (d = r->drain_intents; d; d = dnext) {
    dnext = d->next;
    free(d);
  }
  memset(r, 0, sizeof(*r));
}

uint64_t lynx_reg_suspect_ms(const struct lynx_registry *r) {
  return r->suspect_ms && r->suspect_ms < r->lease_ms ? r->suspect_ms
                                                      : r->lease_ms;
}

/* ---- the dispatch table --------------------------------------------- */

int lynx_reg_accel_dispatchable(const struct lynx_reg_accel *a) {
  return !a->device_lost && !a->failed && a->stalled_mqueues == 0;
}

int lynx__reg_accel_pos(const struct lynx_reg_node *n, uint32_t idx) {
  uint32_t a;
  for (a = 0; a < n->n_accels; a++)
    if (n->accels[a].info.idx == idx)
      return (int)a;
  return -1;
}

/* Whether i's accelerator lets it serve. One the node no longer reports
 * counts as healthy: the placement that follows in the same call stops the
 * instance, and its removal must still mark the table. */
int lynx__reg_inst_accel_ok(const struct lynx_reg_instance *i) {
  int pos = lynx__reg_accel_pos(i->node, i->accel_idx);
  return pos < 0 || lynx_reg_accel_dispatchable(&i->node->accels[pos]);
}

static int inst_dispatchable(const struct lynx_reg_instance *i) {
  return i->state == LYNX_INST_READY && i->node->state == LYNX_NODE_READY &&
         !i->node->suspect && lynx__reg_inst_accel_ok(i);
}

int lynx_reg_inst_dispatchable(const struct lynx_reg_instance *inst) {
  return inst && inst_dispatchable(inst);
}

/* Ends every public call that may have changed the table. */
void lynx__reg_table_commit(struct lynx_registry *r) {
  if (!r->table_dirty)
    return;
  r->table_dirty = 0;
  r->table_version++;
  r->version++;
  r->table_pushes++;
  if (r->ops.tables_changed)
    r->ops.tables_changed(r->ops.data);
}

void lynx_reg_table_foreach(struct lynx_registry *r,
                            void (*fn)(void *arg,
                                       const struct lynx_reg_service *svc,
                                       const struct lynx_reg_instance *inst),
                            void *arg) {
  const struct lynx_reg_service *s;
  const struct lynx_reg_instance *i;
  if (!fn)
    return;
  for (s = r->services; s; s = s->next)
    for (i = r->instances; i; i = i->next)
      if (i->svc == s && inst_dispatchable(i))
        fn(arg, s, i);
}

/* ---- node states ---------------------------------------------------- */

const char *lynx_node_state_name(enum lynx_node_state s) {
  switch (s) {
  case LYNX_NODE_READY:
    return "ready";
  case LYNX_NODE_DRAINING:
    return "draining";
  case LYNX_NODE_DRAINED:
    return "drained";
  case LYNX_NODE_DOWN:
    return "down";
  }
  return "unknown";
}

/* Whether n has an instance that is in the table whenever n is READY. */
static int node_has_ready_inst(const struct lynx_registry *r,
                               const struct lynx_reg_node *n) {
  const struct lynx_reg_instance *i;
  for (i = r->instances; i; i = i->next)
    if (i->node == n && i->state == LYNX_INST_READY &&
        lynx__reg_inst_accel_ok(i))
      return 1;
  return 0;
}

void lynx__reg_node_set_state(struct lynx_registry *r, struct lynx_reg_node *n,
                              enum lynx_node_state s) {
  if (n->state == s)
    return;
  /* down and ready after down are recorded where their reason is known */
  if (s == LYNX_NODE_DRAINING)
    lynx_ev_add(&r->ev, LYNX_EV_NODE_DRAINING, n->id,
                "node %s drains%s: its instances stop once the frontends "
                "answered what they hold",
                n->id, n->leaving ? " to leave (its agent is stopping)" : "");
  else if (s == LYNX_NODE_DRAINED && n->state != LYNX_NODE_DOWN)
    lynx_ev_add(&r->ev, LYNX_EV_NODE_DRAINED, n->id,
                "node %s is drained: nothing runs there", n->id);
  else if (s == LYNX_NODE_READY && n->state != LYNX_NODE_DOWN)
    lynx_ev_add(&r->ev, LYNX_EV_NODE_UNDRAINED, n->id,
                "node %s is undrained: placement may use it again", n->id);
  if ((n->state == LYNX_NODE_READY || s == LYNX_NODE_READY) &&
      node_has_ready_inst(r, n))
    r->table_dirty = 1;
  if (s != LYNX_NODE_DRAINING && s != LYNX_NODE_DRAINED)
    n->leaving = 0; /* it left (or a new incarnation registered) */
  n->state = s;
  r->version++;
}

/* ---- the lists ------------------------------------------------------ */

/* Unlinks *pp and frees it (no message to the agent). */
void lynx__reg_inst_forget_at(struct lynx_registry *r,
                              struct lynx_reg_instance **pp) {
  struct lynx_reg_instance *i = *pp;
  if (inst_dispatchable(i))
    r->table_dirty = 1;
  *pp = i->next;
  free(i);
  r->version++;
}

/* Asks the agent to stop *pp, then forgets it. */
void lynx__reg_inst_stop_at(struct lynx_registry *r,
                            struct lynx_reg_instance **pp) {
  struct lynx_reg_instance *i = *pp;
  if (r->ops.stop_instance)
    r->ops.stop_instance(r->ops.data, i->node, i->id);
  /* marks the table dirty if it was dispatchable */
  lynx__reg_inst_forget_at(r, pp);
}

/* Forgets (stop = 0) or stops every instance on node n. */
void lynx__reg_node_drop_instances(struct lynx_registry *r,
                                   struct lynx_reg_node *n, int stop) {
  struct lynx_reg_instance **pp = &r->instances;
  while (*pp) {
    if ((*pp)->node != n) {
      pp = &(*pp)->next;
      continue;
    }
    if (stop)
      lynx__reg_inst_stop_at(r, pp);
    else
      lynx__reg_inst_forget_at(r, pp);
  }
}

struct lynx_reg_instance *lynx__reg_inst_find(struct lynx_registry *r,
                                              uint64_t id,
                                              struct lynx_reg_instance ***ppp) {
  struct lynx_reg_instance **pp;
  for (pp = &r->instances; *pp; pp = &(*pp)->next)
    if ((*pp)->id == id) {
      if (ppp)
        *ppp = pp;
      return *pp;
    }
  return NULL;
}

struct lynx_reg_node *lynx_reg_node_find(struct lynx_registry *r,
                                         const char *id) {
  struct lynx_reg_node *n;
  if (!id)
    return NULL;
  for (n = r->nodes; n; n = n->next)
    if (!strncmp(n->id, id, sizeof(n->id)))
      return n;
  return NULL;
}

void lynx_reg_node_refused(struct lynx_registry *r, const char *id,
                           const struct lynx_app_refusal *ref, uint32_t n) {
  struct lynx_reg_node *nd = lynx_reg_node_find(r, id);
  if (!nd)
    return;
  if (n > LYNX_REFUSED_APPS_MAX)
    n = LYNX_REFUSED_APPS_MAX;
  if (n)
    memcpy(nd->refused_apps, ref, n * sizeof(*ref));
  nd->n_refused_apps = n;
}

void lynx_reg_node_app_faults(struct lynx_registry *r, const char *id,
                              const struct lynx_app_fault *f, uint32_t n) {
  struct lynx_reg_node *nd = lynx_reg_node_find(r, id);
  if (!nd)
    return;
  if (n > LYNX_APP_FAULTS_MAX)
    n = LYNX_APP_FAULTS_MAX;
  if (nd->n_app_faults != n ||
      (n && memcmp(nd->app_faults, f, n * sizeof(*f)))) /* shown: a new
                                                         * version */
    r->version++;
  if (n)
    memcpy(nd->app_faults, f, n * sizeof(*f));
  nd->n_app_faults = n;
}

/* What an agent's message names: the node id at this epoch. 0 with *out,
 * -ENOENT (no such node), -ESTALE (another epoch: counted refused). */
int lynx__reg_node_at_epoch(struct lynx_registry *r, const char *id,
                            uint64_t epoch, struct lynx_reg_node **out) {
  struct lynx_reg_node *n = lynx_reg_node_find(r, id);
  if (!n)
    return -ENOENT;
  if (epoch != n->epoch) {
    r->refused_epochs++;
    return -ESTALE;
  }
  *out = n;
  return 0;
}
