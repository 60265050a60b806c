/*
 * reg_node.c - nodes: agents registering (new incarnations, adoption of
 * what they still run), their heartbeats and leases, leaving, and the tick
 * that expires leases and drives the rest (registry.h, "agents", "time").
 *
 * Design notes:
 * - A node is one incarnation per epoch (registry.h, "Epochs"): every
 *   message an agent sends names its epoch, checked by
 *   lynx__reg_node_at_epoch, and an epoch declared down never serves
 *   again.
 * - Two leases per node, both counted from the last time it was heard: a
 *   heartbeat lease (suspect: out of the tables, instances kept) and the
 *   lease (down: instances forgotten, requests in flight counted lost by
 *   the frontends). The tick credits a pause of the coordinator to every
 *   lease before it checks any.
 * - The tick is the top of the registry's calls: leases, then drains and
 *   retirements (reg_drain.c), placement when anything changed
 *   (reg_place.c), and partitioning, which commits the table
 *   (reg_frontend.c).
 */
#include "reg_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "mqueue.h"

#define COMP "registry"

/* ---- leases --------------------------------------------------------- */

/* n was heard (a heartbeat, a registration): its leases run from now, and
 * a suspect node is back in the tables. */
static void node_heard(struct lynx_registry *r, struct lynx_reg_node *n,
                       uint64_t now_ms) {
  uint64_t silent =
      now_ms > n->last_heartbeat_ms ? now_ms - n->last_heartbeat_ms : 0;
  n->last_heartbeat_ms = now_ms;
  n->lease_deadline_ms = now_ms + r->lease_ms;
  if (!n->suspect)
    return;
  n->suspect = 0;
  r->version++;
  r->table_dirty = 1;
  LYNX_INFO(COMP,
            "node %s heard again after %" PRIu64 " ms: back in the "
            "dispatch tables",
            n->id, silent);
  lynx_ev_add(&r->ev, LYNX_EV_NODE_HEARD, n->id,
              "node %s heard again after %" PRIu64 " ms: back in dispatch",
              n->id, silent);
}

/* n went silent for its heartbeat lease: out of the tables (its
 * instances stay, what it holds in flight may still be answered) until it
 * is heard again or its lease expires. */
static void node_suspect(struct lynx_registry *r, struct lynx_reg_node *n) {
  n->suspect = 1;
  r->suspicions++;
  r->version++;
  r->table_dirty = 1;
  LYNX_WARN(COMP,
            "node %s is suspect: no heartbeat for %" PRIu64 " ms; out "
            "of the dispatch tables until it is heard again (declared down "
            "at %" PRIu64 " ms)",
            n->id, lynx_reg_suspect_ms(r), r->lease_ms);
  lynx_ev_add(&r->ev, LYNX_EV_NODE_SUSPECT, n->id,
              "node %s is suspect: no heartbeat for %" PRIu64 " ms; out of "
              "dispatch until heard again, down at %" PRIu64 " ms",
              n->id, lynx_reg_suspect_ms(r), r->lease_ms);
}

/* ---- registration --------------------------------------------------- */

static int check_registration(const char *id, const char *address,
                              const struct lynx_label *labels,
                              uint32_t n_labels,
                              const struct lynx_accel_info *accels,
                              uint32_t n_accels, struct lynx_reg_err *err) {
  uint32_t a, b;
  if (!lynx__reg_id_ok(id, LYNX_ID_MAX, 1)) {
    ERR_INVALID(err, "id: must be 1-%d characters of [A-Za-z0-9_.:-]",
                LYNX_ID_MAX - 1);
    return -EINVAL;
  }
  if (address && lynx__reg_slen(address, LYNX_ID_MAX) >= LYNX_ID_MAX) {
    ERR_INVALID(err, "address: longer than %d characters", LYNX_ID_MAX - 1);
    return -EINVAL;
  }
  if (n_labels > LYNX_LABELS_MAX || (n_labels && !labels)) {
    ERR_INVALID(err, "labels: at most %d", LYNX_LABELS_MAX);
    return -EINVAL;
  }
  for (a = 0; a < n_labels; a++) {
    size_t kl = lynx__reg_slen(labels[a].key, LYNX_LABEL_MAX);
    if (kl == 0 || kl >= LYNX_LABEL_MAX ||
        lynx__reg_slen(labels[a].value, LYNX_LABEL_MAX) >= LYNX_LABEL_MAX) {
      ERR_INVALID(err, "labels: key must be 1-%d characters, value at most %d",
                  LYNX_LABEL_MAX - 1, LYNX_LABEL_MAX - 1);
      return -EINVAL;
    }
    /* selectors match labels byte for byte and the API shows them: a label
     * is refused rather than changed */
    if (!lynx_text_ok(labels[a].key, kl) ||
        !lynx_text_ok(labels[a].value,
                      lynx__reg_slen(labels[a].value, LYNX_LABEL_MAX))) {
      ERR_INVALID(err,
                  "labels[%u]: key or value is not valid UTF-8 or holds "
                  "a control character",
                  a);
      return -EINVAL;
    }
    for (b = 0; b < a; b++)
      if (!strcmp(labels[a].key, labels[b].key)) {
        ERR_INVALID(err, "labels: key %s appears twice", labels[a].key);
        return -EINVAL;
      }
  }
  if (n_accels > LYNX_ACCELS_MAX || (n_accels && !accels)) {
    ERR_INVALID(err, "accelerators: at most %d per node", LYNX_ACCELS_MAX);
    return -EINVAL;
  }
  for (a = 0; a < n_accels; a++) {
    if (lynx__reg_slen(accels[a].kind, sizeof(accels[a].kind)) >=
            sizeof(accels[a].kind) ||
        lynx__reg_slen(accels[a].model, sizeof(accels[a].model)) >=
            sizeof(accels[a].model) ||
        lynx__reg_slen(accels[a].pci_bus_id, sizeof(accels[a].pci_bus_id)) >=
            sizeof(accels[a].pci_bus_id)) {
      ERR_INVALID(err, "accelerators[%u]: kind, model or pci_bus_id too long",
                  a);
      return -EINVAL;
    }
    if (accels[a].ordering > LYNX_ORDER_FENCED) {
      ERR_INVALID(err, "accelerators[%u].ordering: unknown ordering %u", a,
                  accels[a].ordering);
      return -EINVAL;
    }
    for (b = 0; b < a; b++)
      if (accels[a].idx == accels[b].idx) {
        ERR_INVALID(err, "accelerators[%u].idx: %u appears twice", a,
                    accels[a].idx);
        return -EINVAL;
      }
  }
  return 0;
}

/* keep_health: the same incarnation (epoch) registers again, so the health
 * its last heartbeat reported still holds; a new one reports afresh. The
 * caller has already forgotten the instances in the second case. */
static void node_fill(struct lynx_reg_node *n, const char *address,
                      const struct lynx_label *labels, uint32_t n_labels,
                      const struct lynx_accel_info *accels, uint32_t n_accels,
                      void *conn, int keep_health) {
  uint32_t a, b;
  struct lynx_reg_accel old[LYNX_ACCELS_MAX];
  uint32_t n_old = n->n_accels;
  char why[256];
  memcpy(old, n->accels, sizeof(old));
  lynx__reg_copy_str(n->address, sizeof(n->address), address);
  memset(n->labels, 0, sizeof(n->labels));
  if (n_labels)
    memcpy(n->labels, labels, n_labels * sizeof(*labels));
  n->n_labels = n_labels;
  memset(n->accels, 0, sizeof(n->accels));
  /* free text an agent sends is shown, not matched: cleaned, not refused
   * (the coordinator cuts a long one, possibly inside a character) */
  lynx_text_clean(n->address, sizeof(n->address), n->address);
  for (a = 0; a < n_accels; a++) {
    struct lynx_accel_info *in = &n->accels[a].info;
    *in = accels[a];
    lynx_text_clean(in->kind, sizeof(in->kind), in->kind);
    lynx_text_clean(in->model, sizeof(in->model), in->model);
    lynx_text_clean(in->pci_bus_id, sizeof(in->pci_bus_id), in->pci_bus_id);
    /* counters carry over for an accelerator the node still has */
    for (b = 0; b < n_old; b++)
      if (old[b].info.idx == accels[a].idx) {
        n->accels[a].requests = old[b].requests;
        n->accels[a].responses = old[b].responses;
        n->accels[a].health_outages = old[b].health_outages;
        if (keep_health)
          lynx__reg_accel_health_copy(&n->accels[a], &old[b]);
        else if (!lynx_reg_accel_dispatchable(&old[b]))
          LYNX_INFO(COMP,
                    "node %s accel %" PRIu32 " back in dispatch: its "
                    "agent restarted (was: %s)",
                    n->id, old[b].info.idx,
                    lynx_reg_accel_health_str(&old[b], why, sizeof(why)));
      }
  }
  n->n_accels = n_accels;
  n->conn = conn;
}

int lynx_reg_register(struct lynx_registry *r, const char *id,
                      const char *address, uint64_t epoch,
                      const struct lynx_label *labels, uint32_t n_labels,
                      const struct lynx_accel_info *accels, uint32_t n_accels,
                      void *conn, uint64_t now_ms, struct lynx_reg_err *err) {
  return lynx_reg_register_adopt(r, id, address, epoch, labels, n_labels,
                                 accels, n_accels, NULL, 0, conn, now_ms, err);
}

/* Takes over an instance the agent reports running, if its service exists
 * and nothing else runs it here already; otherwise asks the agent to stop
 * it. Placement, which runs next, stops any that policy does not want. */
static void adopt_one(struct lynx_registry *r, struct lynx_reg_node *n,
                      const struct lynx_reg_adopt *a) {
  struct lynx_reg_service *s = lynx_reg_service_find(r, a->service);
  struct lynx_reg_instance *i, **tail;
  if (lynx__reg_inst_find(r, a->instance_id, NULL))
    return; /* known already (same incarnation, reconnected) */
  if (!s || lynx__reg_accel_pos(n, a->accel_idx) < 0 ||
      n->state == LYNX_NODE_DRAINED ||
      a->desc.n_mqueues != s->spec.mqueues_per_accel ||
      a->desc.slots != s->spec.slots ||
      a->desc.slot_size != s->spec.slot_size ||
      a->desc.large_bytes !=
          lynx_large_for(s->spec.msg_max, s->spec.slot_size)) {
    if (r->ops.stop_instance)
      r->ops.stop_instance(r->ops.data, n, a->instance_id);
    return;
  }
  i = calloc(1, sizeof(*i));
  if (!i) {
    if (r->ops.stop_instance)
      r->ops.stop_instance(r->ops.data, n, a->instance_id);
    return;
  }
  i->id = a->instance_id;
  i->svc = s;
  i->node = n;
  i->accel_idx = a->accel_idx;
  i->state = LYNX_INST_READY;
  i->desc = a->desc;
  i->desc.transport[sizeof(i->desc.transport) - 1] = '\0';
  i->desc.locator[sizeof(i->desc.locator) - 1] = '\0';
  for (tail = &r->instances; *tail; tail = &(*tail)->next)
    ;
  *tail = i;
  if (r->next_instance_id <= a->instance_id)
    r->next_instance_id = a->instance_id + 1;
  if (lynx_reg_inst_dispatchable(i))
    r->table_dirty = 1;
  r->version++;
}

/*
 * The same incarnation registered again: the instances it was asked to
 * start whose answer never came (the StartInstance, or the agent's reply,
 * went down with the old connection). One the agent runs (listed in adopt)
 * is ready with the region it lists, as its lost reply would have said;
 * one it does not list is stopped (should a start still be under way
 * there) and forgotten, so placement starts it again on the new
 * connection. Left STARTING, either waited forever (500 services
 * created at once starved the coordinator past an agent's heartbeat:
 * integration.many_services).
 */
static void starting_settle(struct lynx_registry *r, struct lynx_reg_node *n,
                            const struct lynx_reg_adopt *adopt,
                            uint32_t n_adopt, uint64_t now_ms) {
  struct lynx_reg_instance **pp = &r->instances;
  while (*pp) {
    struct lynx_reg_instance *i = *pp;
    const struct lynx_reg_adopt *a = NULL;
    if (i->node != n || i->state != LYNX_INST_STARTING) {
      pp = &i->next;
      continue;
    }
    for (uint32_t k = 0; k < n_adopt && !a; k++)
      if (adopt[k].instance_id == i->id && adopt[k].accel_idx == i->accel_idx)
        a = &adopt[k];
    if (a && lynx_reg_instance_ready(r, n->id, n->epoch, i->id, &a->desc,
                                     now_ms) == 0) {
      pp = &i->next; /* (ready may retire another: never one before i) */
      continue;
    }
    lynx__reg_inst_stop_at(r, pp);
  }
}

int lynx_reg_register_adopt(struct lynx_registry *r, const char *id,
                            const char *address, uint64_t epoch,
                            const struct lynx_label *labels, uint32_t n_labels,
                            const struct lynx_accel_info *accels,
                            uint32_t n_accels,
                            const struct lynx_reg_adopt *adopt,
                            uint32_t n_adopt, void *conn, uint64_t now_ms,
                            struct lynx_reg_err *err) {
  struct lynx_reg_node *n, **tail;
  int rc, fresh, again;

  rc = check_registration(id, address, labels, n_labels, accels, n_accels, err);
  if (rc)
    return rc;
  n = lynx_reg_node_find(r, id);
  fresh = !n;
  if (n && epoch < n->epoch) {
    r->refused_epochs++;
    ERR_CONFLICT(err, "node %s: epoch %llu is older than %llu", id,
                 (unsigned long long)epoch, (unsigned long long)n->epoch);
    return -ESTALE;
  }
  if (!n) {
    n = calloc(1, sizeof(*n));
    if (!n) {
      lynx__reg_set_err(err, 500, "internal", "out of memory");
      return -ENOMEM;
    }
    lynx__reg_copy_str(n->id, sizeof(n->id), id);
    n->drain_intent = lynx__reg_take_drain_intent(r, id);
    n->state = LYNX_NODE_DOWN; /* set below */
    for (tail = &r->nodes; *tail; tail = &(*tail)->next)
      ;
    *tail = n;
  }
  if (!fresh && epoch == n->epoch && n->state == LYNX_NODE_DOWN) {
    /* Stopped or cut off past its lease: the frontends counted what it had
     * in flight lost, and a lost request must never run later. Only a new
     * incarnation, which starts without the old queues, may serve. */
    r->new_incarnations++;
    ERR_CONFLICT(err,
                 "node %s: epoch %llu was declared down (its lease "
                 "expired or it left) and its requests in flight were "
                 "counted lost: register as a new incarnation",
                 id, (unsigned long long)epoch);
    if (err)
      err->new_incarnation = 1;
    return -ESTALE;
  }
  again = !fresh && epoch == n->epoch;
  if (again) {
    /* The same agent again (its connection or the coordinator restarted):
     * its instances are still running. Placement below stops any on an
     * accelerator it no longer reports. */
    node_fill(n, address, labels, n_labels, accels, n_accels, conn, 1);
  } else {
    /* A new incarnation: whatever ran there is gone. */
    lynx__reg_node_drop_instances(r, n, 0);
    node_fill(n, address, labels, n_labels, accels, n_accels, conn, 0);
    n->epoch = epoch;
    n->drain_deadline_ms = 0;
    n->drain_table_version = 0;
    lynx__reg_node_set_state(
        r, n, n->drain_intent ? LYNX_NODE_DRAINED : LYNX_NODE_READY);
  }
  node_heard(r, n, now_ms);
  if (again)
    starting_settle(r, n, adopt, n_adopt, now_ms);
  for (uint32_t k = 0; k < n_adopt; k++)
    adopt_one(r, n, &adopt[k]);
  lynx_ev_add(&r->ev, LYNX_EV_NODE_REGISTERED, n->id,
              "node %s registered from %s: epoch %llu%s, %u accelerators%s",
              n->id, n->address, (unsigned long long)n->epoch,
              again   ? " again"
              : fresh ? ""
                      : " (a new incarnation)",
              n->n_accels, n_adopt ? ", its running instances adopted" : "");
  r->registrations++;
  r->version++;
  lynx__reg_reconcile(r);
  lynx__reg_table_commit(r);
  return 0;
}

/* ---- agents' messages ----------------------------------------------- */

int lynx_reg_heartbeat(struct lynx_registry *r, const char *id, uint64_t epoch,
                       const struct lynx_accel_report *reports, uint32_t n,
                       uint64_t now_ms) {
  struct lynx_reg_node *node;
  uint32_t k;
  int rc = lynx__reg_node_at_epoch(r, id, epoch, &node);
  if (rc)
    return rc;
  if (node->state == LYNX_NODE_DOWN)
    return -ENOTCONN;
  node_heard(r, node, now_ms);
  /* Counters (and a stall growing longer) are not "changes" for watchers:
   * they move on every heartbeat and would wake every watcher every second.
   * Health that changes dispatchability is: it changes the table too. An
   * accelerator back in dispatch gets new instances from the next tick's
   * placement (r->version moved). */
  for (k = 0; k < n && reports; k++) {
    int pos = lynx__reg_accel_pos(node, reports[k].idx);
    if (pos < 0)
      continue;
    node->accels[pos].requests = reports[k].requests;
    node->accels[pos].lat = reports[k].lat;
    /* blocks a GPU's kernels gave back may make room for an instance that
     * did not fit: placement runs again (the stop that freed them moved
     * the version before this report came) */
    if (reports[k].blocks_held < node->accels[pos].blocks_held)
      r->version++;
    node->accels[pos].blocks_held = reports[k].blocks_held;
    node->accels[pos].responses = reports[k].responses;
    lynx__reg_accel_health_update(r, node, (uint32_t)pos, &reports[k], now_ms);
  }
  lynx__reg_table_commit(r);
  return 0;
}

/* A node goes DOWN: instances forgotten, replicas re-placed. */
static void node_down(struct lynx_registry *r, struct lynx_reg_node *n) {
  n->suspect = 0; /* down is worse */
  lynx__reg_node_drop_instances(r, n, 0);
  lynx__reg_node_set_state(r, n, LYNX_NODE_DOWN);
}

int lynx_reg_leave(struct lynx_registry *r, const char *id, uint64_t epoch,
                   uint64_t now_ms) {
  struct lynx_reg_node *n;
  int rc = lynx__reg_node_at_epoch(r, id, epoch, &n);
  (void)now_ms;
  if (rc)
    return rc;
  if (n->state == LYNX_NODE_DOWN)
    return 0;
  lynx_ev_add(&r->ev, LYNX_EV_NODE_LEFT, n->id, "node %s left", n->id);
  node_down(r, n);
  lynx__reg_reconcile(r);
  lynx__reg_table_commit(r);
  return 0;
}

void lynx_reg_node_disconnected(struct lynx_registry *r, void *conn) {
  struct lynx_reg_node *n;
  if (!conn)
    return;
  for (n = r->nodes; n; n = n->next)
    if (n->conn == conn)
      n->conn = NULL;
}

int lynx_reg_leave_drain(struct lynx_registry *r, const char *id,
                         uint64_t epoch, uint64_t now_ms) {
  struct lynx_reg_node *n;
  int rc = lynx__reg_node_at_epoch(r, id, epoch, &n);
  if (rc)
    return rc;
  if (n->state == LYNX_NODE_DOWN)
    return -ENOTCONN;
  if (n->state == LYNX_NODE_READY)
    n->leaving = 1;
  lynx__reg_drain_begin(r, n, now_ms);
  return 0;
}

uint32_t lynx_reg_nodes_release(struct lynx_registry *r) {
  struct lynx_reg_node **pp = &r->nodes, *n;
  uint32_t gone = 0;
  while (*pp) {
    n = *pp;
    if (n->state == LYNX_NODE_DOWN) {
      pp = &n->next;
      continue;
    }
    /* forgotten, not stopped: they serve */
    lynx__reg_node_drop_instances(r, n, 0);
    *pp = n->next;
    free(n);
    gone++;
  }
  if (gone) {
    r->version++;
    lynx__reg_table_commit(r);
  }
  return gone;
}

/* ---- time ----------------------------------------------------------- */

void lynx_reg_tick(struct lynx_registry *r, uint64_t now_ms) {
  struct lynx_reg_node *n;
  r->now_ms = now_ms;
  r->last_pause_ms = 0;
  if (r->tick_ms && r->last_tick_ms && now_ms > r->last_tick_ms &&
      now_ms - r->last_tick_ms > 2 * r->tick_ms) {
    /* Lease age counts the time the coordinator ran to hear heartbeats:
     * the heartbeats sent while it did not run wait in its sockets, read
     * after this tick. */
    uint64_t gap = now_ms - r->last_tick_ms - r->tick_ms;
    for (n = r->nodes; n; n = n->next)
      if (n->state != LYNX_NODE_DOWN)
        n->lease_deadline_ms += gap;
    r->pauses++;
    r->paused_ms += gap;
    r->last_pause_ms = gap;
  }
  r->last_tick_ms = now_ms;
  if (r->next_retry_ms && now_ms >= r->next_retry_ms) {
    r->next_retry_ms = 0;
    r->placed_version = r->version - 1; /* a backoff ended: place again */
  }
  /* the heartbeat lease ends where the lease does, less the difference
   * (the pauses credited to one are credited to the other) */
  for (n = r->nodes; n; n = n->next)
    if (n->state != LYNX_NODE_DOWN && !n->suspect &&
        now_ms + (r->lease_ms - lynx_reg_suspect_ms(r)) >=
            n->lease_deadline_ms &&
        now_ms < n->lease_deadline_ms)
      node_suspect(r, n);
  for (n = r->nodes; n; n = n->next)
    if (n->state != LYNX_NODE_DOWN && now_ms >= n->lease_deadline_ms) {
      r->lease_expiries++;
      n->expired_ms = now_ms;
      lynx_ev_add(&r->ev, LYNX_EV_NODE_DOWN, n->id,
                  "node %s is down: no heartbeat for its lease (%llu ms); "
                  "its requests in flight are counted lost",
                  n->id, (unsigned long long)r->lease_ms);
      node_down(r, n);
    }
  lynx__reg_drain_check_all(r, now_ms);
  if (r->version != r->placed_version)
    lynx__reg_reconcile(r);
  lynx_reg_partition(r, now_ms); /* commits the table */
}
