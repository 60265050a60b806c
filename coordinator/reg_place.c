/*
 * reg_place.c - placement: which instances run where (registry.h, struct
 * lynx_service_spec's placement and selector).
 *
 * Design notes:
 * - Placement builds a per-call array of nodes and looks instances' nodes
 *   up by pointer, so one pass costs O(services x instances + nodes x
 *   accelerators), not a scan per accelerator.
 * - Instances on DRAINING nodes are left alone by placement (in-flight
 *   requests still come back through them); the drain stops them. Instances
 *   on DOWN nodes are forgotten without a stop (their agent is gone).
 * - Replicas follow capacity: when a node joins or returns and the
 *   placement policy would put a replica there rather than where one runs
 *   (fewer of the service's instances on that node, or a less loaded
 *   accelerator), one instance of the service moves at a time: its
 *   replacement starts while it serves; once the replacement is ready it
 *   RETIRES (out of the tables) and is stopped when the frontends report
 *   nothing outstanding on it, as a drain does: nothing is lost
 *   (reg_drain.c).
 * - A failed instance is forgotten and placement retries on the next tick,
 *   not at once, so an application that cannot start does not spin.
 * - An accelerator out of dispatch for its health keeps its instances
 *   (they count as placed) but gets no new one (reg_accel.c).
 * - A GPU gets no instance whose blocks its resident-block budget cannot
 *   hold (AccelInfo.resident_blocks): the blocks taken are what its agent
 *   last reported held, plus the fewest each starting instance takes, and
 *   never less than the fewest of all its instances (blocks_need). Its
 *   agent refuses a start that does not fit all the same (docs/gpu.md);
 *   placement only avoids asking.
 */
#include "reg_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "mqueue.h"

struct rc_node {
  struct lynx_reg_node *n;
  uint32_t *load;   /* instances of any service, per accel position */
  uint32_t *blocks; /* a GPU's resident blocks taken, per accel position */
  uint64_t have;    /* accel positions with an instance of this service */
  uint32_t svc_cnt; /* instances of this service on the node */
  int eligible;     /* READY and matching this service's selector */
};

struct rc_key {
  const struct lynx_reg_node *n;
  uint32_t idx;
};

struct rc_ctx {
  struct rc_node *nodes;
  struct rc_key *keys; /* by node pointer, for lookups */
  uint32_t n_nodes;
  uint32_t *loads;
  uint32_t *blocks; /* per accel position, like loads: GPU blocks taken */
};

static int key_cmp(const void *a, const void *b) {
  const struct rc_key *x = a, *y = b;
  uintptr_t px = (uintptr_t)x->n, py = (uintptr_t)y->n;
  return px < py ? -1 : px > py;
}

static struct rc_node *rc_lookup(struct rc_ctx *c,
                                 const struct lynx_reg_node *n) {
  struct rc_key k = {n, 0}, *hit;
  hit = bsearch(&k, c->keys, c->n_nodes, sizeof(k), key_cmp);
  return hit ? &c->nodes[hit->idx] : NULL;
}

int lynx_reg_labels_match(const struct lynx_reg_node *n,
                          const struct lynx_service_spec *sp) {
  uint32_t s, l;
  for (s = 0; s < sp->n_selector; s++) {
    int found = 0;
    for (l = 0; l < n->n_labels && !found; l++)
      found = !strcmp(n->labels[l].key, sp->selector[s].key) &&
              !strcmp(n->labels[l].value, sp->selector[s].value);
    if (!found)
      return 0;
  }
  return 1;
}

static void rc_free(struct rc_ctx *c) {
  free(c->nodes);
  free(c->keys);
  free(c->loads);
  free(c->blocks);
}

/* The fewest of a GPU's resident blocks an instance of sp takes on a: the
 * agent's --gpu-blocks (at most one per mqueue), or auto's one block per
 * LYNX_GPU_MQS_PER_BLOCK mqueues (auto takes more while more are free). 0
 * where a has no budget (a CPU, an agent that does not say). */
static uint32_t blocks_need(const struct lynx_reg_accel *a,
                            const struct lynx_service_spec *sp) {
  uint32_t mq = sp->mqueues_per_accel ? sp->mqueues_per_accel : 1;
  if (!a->info.resident_blocks)
    return 0;
  if (a->info.instance_blocks)
    return a->info.instance_blocks < mq ? a->info.instance_blocks : mq;
  return (mq + LYNX_GPU_MQS_PER_BLOCK - 1) / LYNX_GPU_MQS_PER_BLOCK;
}

/* 1 when an instance of sp fits in what is left of the budget of the
 * accelerator at position pos of rn (always where there is none). */
static int blocks_fit(const struct rc_node *rn, uint32_t pos,
                      const struct lynx_service_spec *sp) {
  const struct lynx_reg_accel *a = &rn->n->accels[pos];
  uint32_t need = blocks_need(a, sp);
  return !need || (uint64_t)rn->blocks[pos] + need <= a->info.resident_blocks;
}

/* Counts a new instance of sp at position pos of rn as placed: the
 * service's there, one more of its node's and of the accelerator's load,
 * its fewest blocks taken from the GPU's budget. */
static void rc_took(struct rc_node *rn, uint32_t pos,
                    const struct lynx_service_spec *sp) {
  rn->have |= 1ull << pos;
  rn->svc_cnt++;
  rn->load[pos]++;
  rn->blocks[pos] += blocks_need(&rn->n->accels[pos], sp);
}

static int rc_build(struct lynx_registry *r, struct rc_ctx *c) {
  struct lynx_reg_node *n;
  struct lynx_reg_instance *i;
  uint32_t cnt = 0, acc = 0, k;
  memset(c, 0, sizeof(*c));
  for (n = r->nodes; n; n = n->next) {
    cnt++;
    acc += n->n_accels;
  }
  c->nodes = calloc(cnt ? cnt : 1, sizeof(*c->nodes));
  c->keys = calloc(cnt ? cnt : 1, sizeof(*c->keys));
  c->loads = calloc(acc ? acc : 1, sizeof(*c->loads));
  c->blocks = calloc(acc ? acc : 1, sizeof(*c->blocks));
  if (!c->nodes || !c->keys || !c->loads || !c->blocks) {
    rc_free(c);
    return -ENOMEM;
  }
  c->n_nodes = cnt;
  acc = 0;
  for (n = r->nodes, k = 0; n; n = n->next, k++) {
    c->nodes[k].n = n;
    c->nodes[k].load = c->loads + acc;
    c->nodes[k].blocks = c->blocks + acc;
    acc += n->n_accels;
    c->keys[k].n = n;
    c->keys[k].idx = k;
  }
  qsort(c->keys, cnt, sizeof(*c->keys), key_cmp);
  /* a GPU's blocks taken: what its agent last reported held plus what
   * instances still starting will take (not in that report yet), and never
   * less than every instance's fewest */
  {
    uint32_t *least = calloc(acc ? acc : 1, sizeof(*least));
    if (!least) {
      rc_free(c);
      return -ENOMEM;
    }
    for (i = r->instances; i; i = i->next) {
      struct rc_node *rn = rc_lookup(c, i->node);
      int pos = lynx__reg_accel_pos(i->node, i->accel_idx);
      uint32_t need;
      if (!rn || pos < 0 || i->node->state == LYNX_NODE_DOWN)
        continue;
      rn->load[pos]++;
      need = blocks_need(&i->node->accels[pos], &i->svc->spec);
      least[rn->blocks - c->blocks + pos] += need;
      if (i->state == LYNX_INST_STARTING)
        rn->blocks[pos] += need;
    }
    for (k = 0; k < cnt; k++)
      for (uint32_t a = 0; a < c->nodes[k].n->n_accels; a++) {
        uint32_t *b = &c->nodes[k].blocks[a];
        *b += c->nodes[k].n->accels[a].blocks_held;
        if (*b < least[b - c->blocks])
          *b = least[b - c->blocks];
      }
    free(least);
  }
  return 0;
}

/* Creates a STARTING instance of s on (n, accel position pos), appended at
 * *tailp (the list's end), and asks the agent to start it. */
static int inst_start(struct lynx_registry *r, struct lynx_reg_service *s,
                      struct lynx_reg_node *n, uint32_t pos,
                      struct lynx_reg_instance ***tailp) {
  struct lynx_reg_instance *i = calloc(1, sizeof(*i));
  if (!i)
    return -ENOMEM;
  i->id = r->next_instance_id++;
  i->svc = s;
  i->node = n;
  i->accel_idx = n->accels[pos].info.idx;
  i->state = LYNX_INST_STARTING;
  i->fe_fresh = 1; /* a new region: no producer yet (partition.c) */
  **tailp = i;
  *tailp = &i->next;
  r->version++;
  if (r->ops.start_instance)
    r->ops.start_instance(r->ops.data, n, i);
  return 0;
}

/* 1 while a is in its failed-start backoff; notes when the tick must
 * place again. */
static int backing_off(struct lynx_registry *r,
                       const struct lynx_reg_accel *a) {
  if (a->retry_at_ms <= r->now_ms)
    return 0;
  if (!r->next_retry_ms || a->retry_at_ms < r->next_retry_ms)
    r->next_retry_ms = a->retry_at_ms;
  return 1;
}

int lynx_reg_accel_runs(const struct lynx_reg_accel *a, const char *app) {
  if (!a->info.n_apps)
    return 1;
  for (uint32_t k = 0; k < a->info.n_apps && k < LYNX_APPS_MAX; k++)
    if (!strcmp(a->info.apps[k], app))
      return 1;
  return 0;
}

/* Whether a new instance of s may go on a now. An accelerator that cannot
 * run s's app gets none (no start that can only fail), nor does an
 * unhealthy one (its health changing bumps r->version, so the next tick
 * places). */
static int placeable(struct lynx_registry *r, const struct lynx_reg_service *s,
                     const struct lynx_reg_accel *a) {
  return lynx_reg_accel_runs(a, s->spec.app) &&
         lynx_reg_accel_dispatchable(a) && !backing_off(r, a);
}

/* Whether a new instance of s may go at position pos of rn: none of s
 * there yet, the accelerator placeable, its GPU's budget not exceeded. */
static int rc_can_take(struct lynx_registry *r, const struct rc_node *rn,
                       uint32_t pos, const struct lynx_reg_service *s) {
  return !(rn->have & (1ull << pos)) && placeable(r, s, &rn->n->accels[pos]) &&
         blocks_fit(rn, pos, &s->spec);
}

/* Picks the eligible (node, accel) without an instance of this service that
 * spreads best: fewest of the service's instances on the node, then the
 * least-loaded accelerator, then registration order. */
static int rc_pick(struct lynx_registry *r, struct rc_ctx *c,
                   const struct lynx_reg_service *s, uint32_t *node_out,
                   uint32_t *pos_out) {
  uint32_t k, a;
  int found = 0;
  uint32_t best_cnt = 0, best_load = 0;
  for (k = 0; k < c->n_nodes; k++) {
    struct rc_node *rn = &c->nodes[k];
    /* a suspect node keeps what it runs (counted kept, as on an unhealthy
     * accelerator) but gets nothing new while it is silent */
    if (!rn->eligible || rn->n->suspect)
      continue;
    for (a = 0; a < rn->n->n_accels; a++) {
      if (!rc_can_take(r, rn, a, s))
        continue;
      if (!found || rn->svc_cnt < best_cnt ||
          (rn->svc_cnt == best_cnt && rn->load[a] < best_load)) {
        found = 1;
        best_cnt = rn->svc_cnt;
        best_load = rn->load[a];
        *node_out = k;
        *pos_out = a;
      }
    }
  }
  return found;
}

/* Replicas follow capacity: when the policy would rather place one of s's
 * replicas elsewhere than where the most crowded one runs, that one gets
 * a replacement there (it serves until the replacement is ready, then
 * retires). Called when s has its replicas and nothing of it is starting,
 * retiring or replaced, so one instance moves at a time. A move must leave
 * the placement strictly better, so it never moves back: fewer of s's
 * instances on the target node than the source will have after (2 nodes
 * apart), or as few and an accelerator with less load (2 apart). */
static int rc_move(struct lynx_registry *r, struct rc_ctx *c,
                   struct lynx_reg_service *s,
                   struct lynx_reg_instance ***tailp) {
  struct lynx_reg_instance *i, *w = NULL;
  struct rc_node *wrn = NULL, *brn;
  int wpos = 0, better, rc;
  uint32_t nk, pos;
  if (s->spec.placement != LYNX_PLACE_REPLICAS)
    return 0;
  for (i = r->instances; i; i = i->next) {
    struct rc_node *rn;
    int p;
    /* one on an unhealthy accelerator stays put: it may recover */
    if (i->svc != s || i->state != LYNX_INST_READY ||
        !lynx__reg_inst_accel_ok(i))
      continue;
    rn = rc_lookup(c, i->node);
    p = lynx__reg_accel_pos(i->node, i->accel_idx);
    if (!rn || !rn->eligible || p < 0)
      continue;
    if (!w || rn->svc_cnt > wrn->svc_cnt ||
        (rn->svc_cnt == wrn->svc_cnt && rn->load[p] > wrn->load[wpos])) {
      w = i;
      wrn = rn;
      wpos = p;
    }
  }
  if (!w || !rc_pick(r, c, s, &nk, &pos))
    return 0;
  brn = &c->nodes[nk];
  if (brn == wrn)
    better = brn->load[pos] + 1 < wrn->load[wpos];
  else
    better = brn->svc_cnt + 1 < wrn->svc_cnt ||
             (brn->svc_cnt + 1 <= wrn->svc_cnt &&
              brn->load[pos] + 1 < wrn->load[wpos]);
  if (!better)
    return 0;
  rc = inst_start(r, s, brn->n, pos, tailp);
  if (rc)
    return rc;
  w->replaced_by = r->next_instance_id - 1; /* the one just started */
  rc_took(brn, pos, &s->spec);
  r->moves_started++;
  LYNX_INFO("registry",
            "service %s: instance %" PRIu64 " moves from %s/%u "
            "to %s/%u (placement prefers it there); it serves until its "
            "replacement %" PRIu64 " is ready",
            s->spec.name, w->id, w->node->id, w->accel_idx, brn->n->id,
            brn->n->accels[pos].info.idx, w->replaced_by);
  return 0;
}

static int reconcile_service(struct lynx_registry *r, struct rc_ctx *c,
                             struct lynx_reg_service *s) {
  const struct lynx_service_spec *sp = &s->spec;
  struct lynx_reg_instance **pp, **tail;
  uint32_t k, a, kept = 0;
  int rc, moving = 0;

  for (k = 0; k < c->n_nodes; k++) {
    struct rc_node *rn = &c->nodes[k];
    rn->have = 0;
    rn->svc_cnt = 0;
    rn->eligible = rn->n->state == LYNX_NODE_READY && rn->n->n_accels &&
                   lynx_reg_labels_match(rn->n, sp);
  }

  /* Existing instances: keep what is still wanted, stop the rest. One
   * that retires, or is being replaced, still runs where it is but no
   * longer counts. */
  pp = &r->instances;
  while (*pp) {
    struct lynx_reg_instance *i = *pp;
    struct rc_node *rn;
    int pos, leaving;
    if (i->svc != s) {
      pp = &i->next;
      continue;
    }
    if (i->node->state == LYNX_NODE_DOWN) {
      lynx__reg_inst_forget_at(r, pp);
      continue;
    }
    if (i->node->state == LYNX_NODE_DRAINING) {
      pp = &i->next; /* the drain stops it */
      continue;
    }
    if (i->replaced_by && !lynx__reg_inst_find(r, i->replaced_by, NULL))
      i->replaced_by = 0; /* its replacement failed: it stays */
    leaving = i->state == LYNX_INST_RETIRING || i->replaced_by;
    moving |= leaving || i->state == LYNX_INST_STARTING;
    rn = rc_lookup(c, i->node);
    pos = lynx__reg_accel_pos(i->node, i->accel_idx);
    if (!rn || pos < 0 || !rn->eligible || (rn->have & (1ull << pos))) {
      if (rn && pos >= 0 && rn->load[pos])
        rn->load[pos]--;
      lynx__reg_inst_stop_at(r, pp);
      continue;
    }
    rn->have |= 1ull << pos;
    if (!leaving) {
      rn->svc_cnt++;
      kept++;
    }
    pp = &i->next;
  }
  tail = pp; /* the end of the list: new instances go here */

  if (sp->placement == LYNX_PLACE_ALL) {
    for (k = 0; k < c->n_nodes; k++) {
      struct rc_node *rn = &c->nodes[k];
      if (!rn->eligible || rn->n->suspect)
        continue;
      for (a = 0; a < rn->n->n_accels; a++) {
        if (!rc_can_take(r, rn, a, s))
          continue;
        rc = inst_start(r, s, rn->n, a, &tail);
        if (rc)
          return rc;
        rc_took(rn, a, sp);
      }
    }
    return 0;
  }

  /* Replicas: remove extras from the most crowded nodes first (instances
   * that do not serve, not yet ready or on an unhealthy accelerator, before
   * serving ones), then add. An instance on an unhealthy accelerator counts
   * as kept: it is not replaced while it may recover. */
  while (kept > sp->replicas) {
    struct lynx_reg_instance **victim = NULL, **q;
    struct rc_node *vrn = NULL;
    for (q = &r->instances; *q; q = &(*q)->next) {
      struct lynx_reg_instance *i = *q;
      struct rc_node *rn;
      if (i->svc != s || i->node->state != LYNX_NODE_READY ||
          i->state == LYNX_INST_RETIRING || i->replaced_by)
        continue;
      rn = rc_lookup(c, i->node);
      if (!rn || !rn->eligible)
        continue;
      if (!victim || rn->svc_cnt > vrn->svc_cnt ||
          (rn->svc_cnt == vrn->svc_cnt &&
           (i->state != LYNX_INST_READY || !lynx__reg_inst_accel_ok(i) ||
            ((*victim)->state == LYNX_INST_READY &&
             lynx__reg_inst_accel_ok(*victim))))) {
        victim = q;
        vrn = rn;
      }
    }
    if (!victim)
      break;
    {
      int pos = lynx__reg_accel_pos((*victim)->node, (*victim)->accel_idx);
      if (pos >= 0) {
        vrn->have &= ~(1ull << pos);
        if (vrn->load[pos])
          vrn->load[pos]--;
      }
    }
    vrn->svc_cnt--;
    if (&(*victim)->next == tail)
      tail = victim;
    lynx__reg_inst_stop_at(r, victim);
    kept--;
  }
  while (kept < sp->replicas) {
    uint32_t nk, pos;
    struct rc_node *rn;
    if (!rc_pick(r, c, s, &nk, &pos))
      break; /* not enough capacity: retried when nodes join */
    rn = &c->nodes[nk];
    rc = inst_start(r, s, rn->n, pos, &tail);
    if (rc)
      return rc;
    rc_took(rn, pos, sp);
    kept++;
    moving = 1;
  }
  return moving ? 0 : rc_move(r, c, s, &tail);
}

/* Instances of deleted services never remain; instances whose service is
 * gone would be a bug, so placement only walks services. */
int lynx__reg_reconcile(struct lynx_registry *r) {
  struct rc_ctx c;
  struct lynx_reg_service *s;
  struct lynx_reg_instance **pp;
  int rc;

  /* Instances on DOWN nodes: their agent is gone. On DRAINED nodes: the
   * drain stopped them all, so any here is stale. */
  pp = &r->instances;
  while (*pp) {
    if ((*pp)->node->state == LYNX_NODE_DOWN)
      lynx__reg_inst_forget_at(r, pp);
    else if ((*pp)->node->state == LYNX_NODE_DRAINED)
      lynx__reg_inst_stop_at(r, pp);
    else
      pp = &(*pp)->next;
  }
  rc = rc_build(r, &c);
  if (rc)
    return rc;
  for (s = r->services; s; s = s->next) {
    rc = reconcile_service(r, &c, s);
    if (rc)
      break;
  }
  rc_free(&c);
  if (rc == 0)
    r->placed_version = r->version;
  return rc;
}
