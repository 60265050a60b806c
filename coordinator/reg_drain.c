/*
 * reg_drain.c - drains and retirements: instances that leave the tables
 * first and are stopped once the frontends answered what they hold on
 * them (registry.h, lynx_reg_drain; docs/design.md, "Drain is driven by
 * the frontends' reports").
 *
 * Two things drain the same way: a DRAINING node (the operator drained it,
 * or its agent leaves: reg_intent.c, reg_node.c), and a RETIRING instance
 * that moved away (reg_place.c, "replicas follow capacity"). Each is out
 * of the tables from one table version on; it is stopped once every
 * connected frontend runs that version or later and reports nothing
 * outstanding on it, or at its deadline (--drain-timeout-ms). Never as
 * quiet while the coordinator settles: a frontend that still dispatches
 * to it may not have reconnected yet. The frontends' reports
 * (reg_frontend.c), instance reports (reg_instance.c) and the tick call
 * the checks.
 */
#include "reg_internal.h"

#include <inttypes.h>
#include <stdlib.h>

#include "log.h"

static int u64_cmp(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Whether every connected frontend runs table table_version or later and
 * reports nothing outstanding on the instances ids[0..cnt) (sorted); never
 * while the coordinator settles (a frontend holding them may be one that
 * has not reconnected yet). */
static int frontends_quiet(const struct lynx_registry *r,
                           uint64_t table_version, const uint64_t *ids,
                           size_t cnt) {
  const struct lynx_reg_frontend *f;
  if (r->settle_until_ms)
    return 0;
  for (f = r->frontends; f; f = f->next) {
    if (!f->connected)
      continue;
    if (f->table_version_applied < table_version)
      return 0;
    for (size_t m = 0; cnt && m < f->n_mqs; m++)
      if (f->mqs[m].outstanding &&
          bsearch(&f->mqs[m].instance_id, ids, cnt, sizeof(*ids), u64_cmp))
        return 0;
  }
  return 1;
}

/* Whether every connected frontend runs a table without n and reports
 * nothing outstanding on n's instances. */
static int drain_quiet(struct lynx_registry *r, struct lynx_reg_node *n) {
  struct lynx_reg_instance *i;
  uint64_t *ids = NULL;
  size_t cnt = 0, cap = 0;
  int quiet;

  for (i = r->instances; i; i = i->next) {
    if (i->node != n)
      continue;
    if (cnt == cap) {
      size_t ncap = cap ? 2 * cap : 16;
      uint64_t *nids = realloc(ids, ncap * sizeof(*ids));
      if (!nids) {
        free(ids);
        return 0; /* try again later; the deadline still bounds it */
      }
      ids = nids;
      cap = ncap;
    }
    ids[cnt++] = i->id;
  }
  if (cnt)
    qsort(ids, cnt, sizeof(*ids), u64_cmp);
  quiet = frontends_quiet(r, n->drain_table_version, ids, cnt);
  free(ids);
  return quiet;
}

/* A moved-away instance retires: out of the tables now, stopped once the
 * frontends run a table without it and have nothing outstanding on it. */
void lynx__reg_inst_retire(struct lynx_registry *r, struct lynx_reg_instance *i,
                           uint64_t now_ms) {
  if (lynx_reg_inst_dispatchable(i))
    r->table_dirty = 1;
  i->state = LYNX_INST_RETIRING;
  /* the commit ending this call bumps the version once if the table
   * changed: that table is the first without i */
  i->retire_table_version = r->table_version + (r->table_dirty ? 1 : 0);
  i->retire_deadline_ms = now_ms + r->drain_timeout_ms;
  r->version++;
}

/* Stops retiring instances that are quiet or past their deadline. */
void lynx__reg_retire_check_all(struct lynx_registry *r, uint64_t now_ms) {
  struct lynx_reg_instance **pp = &r->instances;
  while (*pp) {
    struct lynx_reg_instance *i = *pp;
    if (i->state == LYNX_INST_RETIRING &&
        (now_ms >= i->retire_deadline_ms ||
         frontends_quiet(r, i->retire_table_version, &i->id, 1))) {
      LYNX_INFO("registry",
                "service %s: instance %" PRIu64 " on %s/%u "
                "moved away and is %s: stopped",
                i->svc->spec.name, i->id, i->node->id, i->accel_idx,
                now_ms >= i->retire_deadline_ms
                    ? "past the drain timeout"
                    : "quiet (nothing outstanding on it)");
      r->moves_done++;
      lynx__reg_inst_stop_at(r, pp);
      continue;
    }
    pp = &i->next;
  }
}

/* Finishes the drain of n if it is complete or its deadline passed. */
static void drain_check(struct lynx_registry *r, struct lynx_reg_node *n,
                        uint64_t now_ms) {
  if (n->state != LYNX_NODE_DRAINING)
    return;
  if (now_ms < n->drain_deadline_ms && !drain_quiet(r, n))
    return;
  lynx__reg_node_drop_instances(r, n, 1);
  lynx__reg_node_set_state(r, n, LYNX_NODE_DRAINED);
}

void lynx__reg_drain_check_all(struct lynx_registry *r, uint64_t now_ms) {
  struct lynx_reg_node *n;
  for (n = r->nodes; n; n = n->next)
    drain_check(r, n, now_ms);
  lynx__reg_retire_check_all(r, now_ms);
}

/* A READY node drains: out of the table now, its instances stopped by
 * drain_check. One draining or drained already stays as it is. */
void lynx__reg_drain_begin(struct lynx_registry *r, struct lynx_reg_node *n,
                           uint64_t now_ms) {
  if (n->state != LYNX_NODE_READY)
    return;
  lynx__reg_node_set_state(r, n, LYNX_NODE_DRAINING);
  lynx__reg_table_commit(r); /* the table without n: frontends must run it */
  n->drain_table_version = r->table_version;
  n->drain_deadline_ms = now_ms + r->drain_timeout_ms;
  /* replicas get their replacements while n drains */
  lynx__reg_reconcile(r);
  drain_check(r, n, now_ms); /* no frontend (and settled): done at once */
  lynx__reg_table_commit(r);
}
