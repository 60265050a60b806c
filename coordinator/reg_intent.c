/*
 * reg_intent.c - what the operator asks of nodes: drain, undrain, forget,
 * and the drains remembered for nodes that have not registered
 * (registry.h, "operators").
 *
 * Operator intent outlives the coordinator: the state directory or etcd
 * keeps the services and the drained nodes (store.c, store_etcd.c; beside
 * the epochs it issues), and nothing else: the rest is rebuilt from what
 * agents and frontends report. So each change here has a check
 * (lynx_reg_*_check) that leaves r unchanged, for the API to save the
 * change before it applies it: once the check passes, the change
 * succeeds. A drain is kept on the node
 * (drain_intent) or, for a node not registered, in r->drain_intents until
 * it registers (lynx__reg_take_drain_intent). A drain an agent asks for to
 * leave is not an intent (reg_node.c), nor is a frontend's drain.
 */
#include "reg_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- drain intents -------------------------------------------------- */

int lynx__reg_take_drain_intent(struct lynx_registry *r, const char *id) {
  struct lynx_reg_drain_intent **pp, *d;
  for (pp = &r->drain_intents; *pp; pp = &(*pp)->next)
    if (!strcmp((*pp)->id, id)) {
      d = *pp;
      *pp = d->next;
      free(d);
      return 1;
    }
  return 0;
}

void lynx_reg_intent_clear(struct lynx_registry *r, uint64_t now_ms) {
  struct lynx_reg_err err;
  while (r->services)
    lynx_reg_service_delete(r, r->services->spec.name, now_ms, &err);
  while (r->drain_intents) {
    struct lynx_reg_drain_intent *d = r->drain_intents;
    r->drain_intents = d->next;
    free(d);
    r->version++;
  }
}

int lynx_reg_drain_intent_add(struct lynx_registry *r, const char *id) {
  struct lynx_reg_node *n;
  struct lynx_reg_drain_intent *d, **pp;
  if (!lynx__reg_id_ok(id, LYNX_ID_MAX, 1))
    return -EINVAL;
  n = lynx_reg_node_find(r, id);
  if (n) {
    if (!n->drain_intent)
      r->version++;
    n->drain_intent = 1;
    return 0;
  }
  for (pp = &r->drain_intents; *pp; pp = &(*pp)->next)
    if (!strcmp((*pp)->id, id))
      return 0;
  d = calloc(1, sizeof(*d));
  if (!d)
    return -ENOMEM;
  lynx__reg_copy_str(d->id, sizeof(d->id), id);
  *pp = d;
  r->version++;
  return 0;
}

/* ---- node operations ------------------------------------------------ */

int lynx_reg_drain_check(struct lynx_registry *r, const char *id,
                         struct lynx_reg_node **out, struct lynx_reg_err *err) {
  struct lynx_reg_node *n = lynx_reg_node_find(r, id);
  *out = n;
  if (!n) {
    ERR_NOTFOUND(err, "node %s not found", id ? id : "");
    return -ENOENT;
  }
  if (n->state == LYNX_NODE_DOWN) {
    ERR_CONFLICT(err, "node %s is down", n->id);
    return -EINVAL;
  }
  return 0;
}

int lynx_reg_drain(struct lynx_registry *r, const char *id, uint64_t now_ms,
                   struct lynx_reg_err *err) {
  struct lynx_reg_node *n;
  int rc = lynx_reg_drain_check(r, id, &n, err);
  if (rc)
    return rc;
  if (!n->drain_intent) {
    n->drain_intent = 1;
    r->version++;
  }
  lynx__reg_drain_begin(r, n, now_ms);
  return 0;
}

int lynx_reg_undrain_check(struct lynx_registry *r, const char *id,
                           struct lynx_reg_node **out,
                           struct lynx_reg_err *err) {
  struct lynx_reg_node *n;
  int rc = lynx_reg_drain_check(r, id, &n, err);
  *out = n;
  if (rc)
    return rc;
  if (n->leaving) {
    /* undone, its agent would stop anyway at its --stop-timeout-ms, with
     * requests in flight: the drain is what makes that stop lossless */
    ERR_CONFLICT(err,
                 "node %s drains to leave: its agent is stopping (a "
                 "new agent registers it ready)",
                 n->id);
    return -EINVAL;
  }
  return 0;
}

int lynx_reg_undrain(struct lynx_registry *r, const char *id, uint64_t now_ms,
                     struct lynx_reg_err *err) {
  struct lynx_reg_node *n;
  int rc = lynx_reg_undrain_check(r, id, &n, err);
  (void)now_ms;
  if (rc)
    return rc;
  if (n->drain_intent) {
    n->drain_intent = 0;
    r->version++;
  }
  n->drain_deadline_ms = 0;
  n->drain_table_version = 0;
  lynx__reg_node_set_state(r, n, LYNX_NODE_READY);
  lynx__reg_reconcile(r);
  lynx__reg_table_commit(r);
  return 0;
}

int lynx_reg_forget_check(struct lynx_registry *r, const char *id,
                          struct lynx_reg_node **out,
                          struct lynx_reg_err *err) {
  struct lynx_reg_node *n = lynx_reg_node_find(r, id);
  *out = n;
  if (!n) {
    ERR_NOTFOUND(err, "node %s not found", id ? id : "");
    return -ENOENT;
  }
  if (n->state != LYNX_NODE_DOWN) {
    ERR_CONFLICT(err, "node %s is %s: only a down node can be forgotten", n->id,
                 lynx_node_state_name(n->state));
    return -EBUSY;
  }
  return 0;
}

int lynx_reg_forget(struct lynx_registry *r, const char *id,
                    struct lynx_reg_err *err) {
  struct lynx_reg_node **pp, *n;
  int rc = lynx_reg_forget_check(r, id, &n, err);
  if (rc)
    return rc;
  for (pp = &r->nodes; *pp != n; pp = &(*pp)->next)
    ;
  lynx__reg_node_drop_instances(r, n, 0); /* none: a down node has none */
  *pp = n->next;
  free(n);
  r->version++;
  lynx__reg_table_commit(r);
  return 0;
}
