/*
 * registry.c - the coordinator's registry (see registry.h).
 *
 * Design notes:
 * - Lists, not indexes: nodes in registration order, services in creation
 *   order, instances by id (new ids are appended, so the instance list stays
 *   sorted). Placement builds a per-call array of nodes and looks instances'
 *   nodes up by pointer, so one pass costs O(services x instances + nodes x
 *   accelerators), not a scan per accelerator.
 * - The dispatch table is not stored: it is the READY instances on READY
 *   nodes. Every change to that set marks r->table_dirty; the public call
 *   that made it ends with table_commit(), which bumps table_version once and
 *   calls ops.tables_changed once, with the registry consistent.
 * - Instances on DRAINING nodes are left alone by placement (in-flight
 *   requests still come back through them); the drain stops them. Instances
 *   on DOWN nodes are forgotten without a stop (their agent is gone).
 * - Replicas follow capacity: when a node joins or returns and the
 *   placement policy would put a replica there rather than where one runs
 *   (fewer of the service's instances on that node, or a less loaded
 *   accelerator), one instance of the service moves at a time: its
 *   replacement starts while it serves; once the replacement is ready it
 *   RETIRES (out of the tables) and is stopped when the frontends report
 *   nothing outstanding on it, as a drain does: nothing is lost.
 * - A failed instance is forgotten and placement retries on the next tick,
 *   not at once, so an application that cannot start does not spin.
 * - Accelerator health (heartbeats) is part of dispatchability, not of
 *   placement's bookkeeping: instances on an accelerator that is lost,
 *   failed or has a stalled mqueue leave the table but stay placed (and
 *   count as the service's instances), because a stalled application may
 *   recover and then serves again without a restart. Placement only
 *   refuses to put new instances there. Whatever made it unhealthy, the
 *   accelerator is back as soon as a heartbeat reports it healthy; a new
 *   agent epoch starts healthy.
 */
#include "registry.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "log.h"
#include "mqueue.h"
#include "util.h"

#define COMP "registry"

/* ---- small helpers -------------------------------------------------- */

static void set_err(struct lynx_reg_err *err, int status, const char *code,
                    const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void set_err(struct lynx_reg_err *err, int status, const char *code,
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

#define ERR_INVALID(err, ...) set_err(err, 400, "invalid_argument", __VA_ARGS__)
#define ERR_NOTFOUND(err, ...) set_err(err, 404, "not_found", __VA_ARGS__)
#define ERR_CONFLICT(err, ...) set_err(err, 409, "conflict", __VA_ARGS__)

/* strlen bounded by the array: max means "not terminated inside". */
static size_t slen(const char *s, size_t max) { return strnlen(s, max); }

/* Identifiers that appear in API paths and label selectors. */
static int id_char_ok(char c, int colon) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-' ||
         (colon && c == ':');
}

static int id_ok(const char *s, size_t max, int colon) {
  size_t n, i;
  if (!s)
    return 0;
  n = slen(s, max);
  if (n == 0 || n >= max)
    return 0;
  for (i = 0; i < n; i++)
    if (!id_char_ok(s[i], colon))
      return 0;
  return 1;
}

static void copy_str(char *dst, size_t size, const char *src) {
  snprintf(dst, size, "%s", src ? src : "");
}

/* ---- text ------------------------------------------------------------ */

/* The UTF-8 sequence at s (n bytes available): its length, with its code
 * point in *cp; 0 when it is not a valid one (a stray continuation byte,
 * an overlong form, a surrogate, above U+10FFFF, or cut short). */
static size_t utf8_seq(const unsigned char *s, size_t n, uint32_t *cp) {
  uint32_t c;
  size_t len, i;
  if (!n)
    return 0;
  c = s[0];
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  if (c >= 0xc2 && c <= 0xdf)
    len = 2, c &= 0x1f;
  else if (c >= 0xe0 && c <= 0xef)
    len = 3, c &= 0x0f;
  else if (c >= 0xf0 && c <= 0xf4)
    len = 4, c &= 0x07;
  else
    return 0;
  if (n < len)
    return 0;
  for (i = 1; i < len; i++) {
    if ((s[i] & 0xc0) != 0x80)
      return 0;
    c = c << 6 | (s[i] & 0x3fu);
  }
  if ((len == 3 && c < 0x800) || (len == 4 && (c < 0x10000 || c > 0x10ffff)) ||
      (c >= 0xd800 && c <= 0xdfff))
    return 0;
  *cp = c;
  return len;
}

/* C0 controls, DEL and C1 controls: what a terminal may act on. */
static int is_control(uint32_t c) { return c < 0x20 || (c >= 0x7f && c <= 0x9f); }

int lynx_text_ok(const char *s, size_t len) {
  size_t i = 0, k;
  uint32_t c;
  if (!s)
    return len == 0;
  while (i < len) {
    k = utf8_seq((const unsigned char *)s + i, len - i, &c);
    if (!k || is_control(c))
      return 0;
    i += k;
  }
  return 1;
}

char *lynx_text_clean(char *dst, size_t size, const char *src) {
  size_t n, i = 0, o = 0, k;
  uint32_t c;
  if (!size)
    return dst;
  n = src ? strlen(src) : 0;
  /* o never passes i: the output is never longer than what it came from,
   * so cleaning in place only ever moves bytes backwards */
  while (i < n) {
    k = utf8_seq((const unsigned char *)src + i, n - i, &c);
    if (!k || is_control(c)) {
      if (o + 1 >= size)
        break;
      dst[o++] = k ? ' ' : '?';
      i += k ? k : 1;
      continue;
    }
    if (o + k >= size)
      break;
    memmove(dst + o, src + i, k);
    o += k;
    i += k;
  }
  dst[o] = '\0';
  return dst;
}

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

/* ---- accelerator health --------------------------------------------- */

int lynx_reg_accel_dispatchable(const struct lynx_reg_accel *a) {
  return !a->device_lost && !a->failed && a->stalled_mqueues == 0;
}

const char *lynx_reg_accel_health_str(const struct lynx_reg_accel *a,
                                      char *buf, size_t len) {
  size_t l = 0;
  if (!buf || len == 0)
    return buf;
  buf[0] = '\0';
  if (lynx_reg_accel_dispatchable(a)) {
    snprintf(buf, len, "ok");
    return buf;
  }
  if (a->device_lost)
    l = lynx_appendf(buf, len, l, "; ", "device lost");
  if (a->failed)
    l = lynx_appendf(buf, len, l, "; ", "failed%s%.*s",
                     a->last_error[0] ? ": " : "",
                     (int)sizeof(a->last_error), a->last_error);
  else if (a->device_lost && a->last_error[0])
    l = lynx_appendf(buf, len, l, "; ", "last error: %.*s",
                     (int)sizeof(a->last_error), a->last_error);
  if (a->stalled_mqueues)
    lynx_appendf(buf, len, l, "; ", "%" PRIu32 " mqueue%s stalled for %" PRIu64
                 " ms", a->stalled_mqueues,
                 a->stalled_mqueues == 1 ? "" : "s", a->stall_ms);
  return buf;
}

/* ---- dispatch table bookkeeping ------------------------------------- */

uint64_t lynx_reg_suspect_ms(const struct lynx_registry *r) {
  return r->suspect_ms && r->suspect_ms < r->lease_ms ? r->suspect_ms
                                                      : r->lease_ms;
}

/* n was heard (a heartbeat, a registration): its leases run from now, and
 * a suspect node is back in the tables. */
static void node_heard(struct lynx_registry *r, struct lynx_reg_node *n,
                       uint64_t now_ms) {
  uint64_t silent = now_ms > n->last_heartbeat_ms
                        ? now_ms - n->last_heartbeat_ms
                        : 0;
  n->last_heartbeat_ms = now_ms;
  n->lease_deadline_ms = now_ms + r->lease_ms;
  if (!n->suspect)
    return;
  n->suspect = 0;
  r->version++;
  r->table_dirty = 1;
  LYNX_INFO(COMP, "node %s heard again after %" PRIu64 " ms: back in the "
            "dispatch tables", n->id, silent);
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
  LYNX_WARN(COMP, "node %s is suspect: no heartbeat for %" PRIu64 " ms; out "
            "of the dispatch tables until it is heard again (declared down "
            "at %" PRIu64 " ms)", n->id, lynx_reg_suspect_ms(r),
            r->lease_ms);
  lynx_ev_add(&r->ev, LYNX_EV_NODE_SUSPECT, n->id,
              "node %s is suspect: no heartbeat for %" PRIu64 " ms; out of "
              "dispatch until heard again, down at %" PRIu64 " ms", n->id,
              lynx_reg_suspect_ms(r), r->lease_ms);
}

static int accel_pos(const struct lynx_reg_node *n, uint32_t idx) {
  uint32_t a;
  for (a = 0; a < n->n_accels; a++)
    if (n->accels[a].info.idx == idx)
      return (int)a;
  return -1;
}

/* Whether i's accelerator lets it serve. One the node no longer reports
 * counts as healthy: the placement that follows in the same call stops the
 * instance, and its removal must still mark the table. */
static int inst_accel_ok(const struct lynx_reg_instance *i) {
  int pos = accel_pos(i->node, i->accel_idx);
  return pos < 0 || lynx_reg_accel_dispatchable(&i->node->accels[pos]);
}

static int inst_dispatchable(const struct lynx_reg_instance *i) {
  return i->state == LYNX_INST_READY && i->node->state == LYNX_NODE_READY &&
         !i->node->suspect && inst_accel_ok(i);
}

int lynx_reg_inst_dispatchable(const struct lynx_reg_instance *inst) {
  return inst && inst_dispatchable(inst);
}

/* Ends every public call that may have changed the table. */
void lynx_reg_table_commit(struct lynx_registry *r) {
  if (!r->table_dirty)
    return;
  r->table_dirty = 0;
  r->table_version++;
  r->version++;
  r->table_pushes++;
  if (r->ops.tables_changed)
    r->ops.tables_changed(r->ops.data);
}

/* Whether n has an instance that is in the table whenever n is READY. */
static int node_has_ready_inst(const struct lynx_registry *r,
                               const struct lynx_reg_node *n) {
  const struct lynx_reg_instance *i;
  for (i = r->instances; i; i = i->next)
    if (i->node == n && i->state == LYNX_INST_READY && inst_accel_ok(i))
      return 1;
  return 0;
}

static void node_set_state(struct lynx_registry *r, struct lynx_reg_node *n,
                           enum lynx_node_state s) {
  if (n->state == s)
    return;
  /* down and ready after down are recorded where their reason is known */
  if (s == LYNX_NODE_DRAINING)
    lynx_ev_add(&r->ev, LYNX_EV_NODE_DRAINING, n->id,
                "node %s drains%s: its instances stop once the frontends "
                "answered what they hold", n->id,
                n->leaving ? " to leave (its agent is stopping)" : "");
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

/* Unlinks *pp and frees it (no message to the agent). */
static void inst_forget_at(struct lynx_registry *r,
                           struct lynx_reg_instance **pp) {
  struct lynx_reg_instance *i = *pp;
  if (inst_dispatchable(i))
    r->table_dirty = 1;
  *pp = i->next;
  free(i);
  r->version++;
}

/* Asks the agent to stop *pp, then forgets it. */
static void inst_stop_at(struct lynx_registry *r,
                         struct lynx_reg_instance **pp) {
  struct lynx_reg_instance *i = *pp;
  if (r->ops.stop_instance)
    r->ops.stop_instance(r->ops.data, i->node, i->id);
  inst_forget_at(r, pp); /* marks the table dirty if it was dispatchable */
}

/* Forgets (stop = 0) or stops every instance on node n. */
static void node_drop_instances(struct lynx_registry *r,
                                struct lynx_reg_node *n, int stop) {
  struct lynx_reg_instance **pp = &r->instances;
  while (*pp) {
    if ((*pp)->node != n) {
      pp = &(*pp)->next;
      continue;
    }
    if (stop)
      inst_stop_at(r, pp);
    else
      inst_forget_at(r, pp);
  }
}

static struct lynx_reg_instance *inst_find(struct lynx_registry *r, uint64_t id,
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

/* ---- placement ------------------------------------------------------ */

struct rc_node {
  struct lynx_reg_node *n;
  uint32_t *load;   /* instances of any service, per accel position */
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
  if (!c->nodes || !c->keys || !c->loads) {
    rc_free(c);
    return -ENOMEM;
  }
  c->n_nodes = cnt;
  acc = 0;
  for (n = r->nodes, k = 0; n; n = n->next, k++) {
    c->nodes[k].n = n;
    c->nodes[k].load = c->loads + acc;
    acc += n->n_accels;
    c->keys[k].n = n;
    c->keys[k].idx = k;
  }
  qsort(c->keys, cnt, sizeof(*c->keys), key_cmp);
  for (i = r->instances; i; i = i->next) {
    struct rc_node *rn = rc_lookup(c, i->node);
    int pos = accel_pos(i->node, i->accel_idx);
    if (rn && pos >= 0 && i->node->state != LYNX_NODE_DOWN)
      rn->load[pos]++;
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
static int backing_off(struct lynx_registry *r, const struct lynx_reg_accel *a) {
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
      if (rn->have & (1ull << a) || !placeable(r, s, &rn->n->accels[a]))
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
    if (i->svc != s || i->state != LYNX_INST_READY || !inst_accel_ok(i))
      continue;
    rn = rc_lookup(c, i->node);
    p = accel_pos(i->node, i->accel_idx);
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
  brn->have |= 1ull << pos;
  brn->svc_cnt++;
  brn->load[pos]++;
  r->moves_started++;
  LYNX_INFO("registry", "service %s: instance %" PRIu64 " moves from %s/%u "
            "to %s/%u (placement prefers it there); it serves until its "
            "replacement %" PRIu64 " is ready", s->spec.name, w->id,
            w->node->id, w->accel_idx, brn->n->id,
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
      inst_forget_at(r, pp);
      continue;
    }
    if (i->node->state == LYNX_NODE_DRAINING) {
      pp = &i->next; /* the drain stops it */
      continue;
    }
    if (i->replaced_by && !inst_find(r, i->replaced_by, NULL))
      i->replaced_by = 0; /* its replacement failed: it stays */
    leaving = i->state == LYNX_INST_RETIRING || i->replaced_by;
    moving |= leaving || i->state == LYNX_INST_STARTING;
    rn = rc_lookup(c, i->node);
    pos = accel_pos(i->node, i->accel_idx);
    if (!rn || pos < 0 || !rn->eligible || (rn->have & (1ull << pos))) {
      if (rn && pos >= 0 && rn->load[pos])
        rn->load[pos]--;
      inst_stop_at(r, pp);
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
        if (rn->have & (1ull << a) || !placeable(r, s, &rn->n->accels[a]))
          continue;
        rc = inst_start(r, s, rn->n, a, &tail);
        if (rc)
          return rc;
        rn->have |= 1ull << a;
        rn->svc_cnt++;
        rn->load[a]++;
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
           (i->state != LYNX_INST_READY || !inst_accel_ok(i) ||
            ((*victim)->state == LYNX_INST_READY &&
             inst_accel_ok(*victim))))) {
        victim = q;
        vrn = rn;
      }
    }
    if (!victim)
      break;
    {
      int pos = accel_pos((*victim)->node, (*victim)->accel_idx);
      if (pos >= 0) {
        vrn->have &= ~(1ull << pos);
        if (vrn->load[pos])
          vrn->load[pos]--;
      }
    }
    vrn->svc_cnt--;
    if (&(*victim)->next == tail)
      tail = victim;
    inst_stop_at(r, victim);
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
    rn->have |= 1ull << pos;
    rn->svc_cnt++;
    rn->load[pos]++;
    kept++;
    moving = 1;
  }
  return moving ? 0 : rc_move(r, c, s, &tail);
}

/* Instances of deleted services never remain; instances whose service is
 * gone would be a bug, so placement only walks services. */
static int reconcile(struct lynx_registry *r) {
  struct rc_ctx c;
  struct lynx_reg_service *s;
  struct lynx_reg_instance **pp;
  int rc;

  /* Instances on DOWN nodes: their agent is gone. On DRAINED nodes: the
   * drain stopped them all, so any here is stale. */
  pp = &r->instances;
  while (*pp) {
    if ((*pp)->node->state == LYNX_NODE_DOWN)
      inst_forget_at(r, pp);
    else if ((*pp)->node->state == LYNX_NODE_DRAINED)
      inst_stop_at(r, pp);
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

/* ---- drain ---------------------------------------------------------- */

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
static void inst_retire(struct lynx_registry *r, struct lynx_reg_instance *i,
                        uint64_t now_ms) {
  if (inst_dispatchable(i))
    r->table_dirty = 1;
  i->state = LYNX_INST_RETIRING;
  /* the commit ending this call bumps the version once if the table
   * changed: that table is the first without i */
  i->retire_table_version = r->table_version + (r->table_dirty ? 1 : 0);
  i->retire_deadline_ms = now_ms + r->drain_timeout_ms;
  r->version++;
}

/* Stops retiring instances that are quiet or past their deadline. */
static void retire_check_all(struct lynx_registry *r, uint64_t now_ms) {
  struct lynx_reg_instance **pp = &r->instances;
  while (*pp) {
    struct lynx_reg_instance *i = *pp;
    if (i->state == LYNX_INST_RETIRING &&
        (now_ms >= i->retire_deadline_ms ||
         frontends_quiet(r, i->retire_table_version, &i->id, 1))) {
      LYNX_INFO("registry", "service %s: instance %" PRIu64 " on %s/%u "
                "moved away and is %s: stopped", i->svc->spec.name, i->id,
                i->node->id, i->accel_idx,
                now_ms >= i->retire_deadline_ms
                    ? "past the drain timeout"
                    : "quiet (nothing outstanding on it)");
      r->moves_done++;
      inst_stop_at(r, pp);
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
  node_drop_instances(r, n, 1);
  node_set_state(r, n, LYNX_NODE_DRAINED);
}

static void drain_check_all(struct lynx_registry *r, uint64_t now_ms) {
  struct lynx_reg_node *n;
  for (n = r->nodes; n; n = n->next)
    drain_check(r, n, now_ms);
  retire_check_all(r, now_ms);
}

/* ---- agents --------------------------------------------------------- */

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

static int take_drain_intent(struct lynx_registry *r, const char *id) {
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
  if (!id_ok(id, LYNX_ID_MAX, 1))
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
  copy_str(d->id, sizeof(d->id), id);
  *pp = d;
  r->version++;
  return 0;
}

static int check_registration(const char *id, const char *address,
                              const struct lynx_label *labels,
                              uint32_t n_labels,
                              const struct lynx_accel_info *accels,
                              uint32_t n_accels, struct lynx_reg_err *err) {
  uint32_t a, b;
  if (!id_ok(id, LYNX_ID_MAX, 1)) {
    ERR_INVALID(err, "id: must be 1-%d characters of [A-Za-z0-9_.:-]",
                LYNX_ID_MAX - 1);
    return -EINVAL;
  }
  if (address && slen(address, LYNX_ID_MAX) >= LYNX_ID_MAX) {
    ERR_INVALID(err, "address: longer than %d characters", LYNX_ID_MAX - 1);
    return -EINVAL;
  }
  if (n_labels > LYNX_LABELS_MAX || (n_labels && !labels)) {
    ERR_INVALID(err, "labels: at most %d", LYNX_LABELS_MAX);
    return -EINVAL;
  }
  for (a = 0; a < n_labels; a++) {
    size_t kl = slen(labels[a].key, LYNX_LABEL_MAX);
    if (kl == 0 || kl >= LYNX_LABEL_MAX ||
        slen(labels[a].value, LYNX_LABEL_MAX) >= LYNX_LABEL_MAX) {
      ERR_INVALID(err, "labels: key must be 1-%d characters, value at most %d",
                  LYNX_LABEL_MAX - 1, LYNX_LABEL_MAX - 1);
      return -EINVAL;
    }
    /* selectors match labels byte for byte and the API shows them: a label
     * is refused rather than changed */
    if (!lynx_text_ok(labels[a].key, kl) ||
        !lynx_text_ok(labels[a].value, slen(labels[a].value, LYNX_LABEL_MAX))) {
      ERR_INVALID(err, "labels[%u]: key or value is not valid UTF-8 or holds "
                  "a control character", a);
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
    if (slen(accels[a].kind, sizeof(accels[a].kind)) >=
            sizeof(accels[a].kind) ||
        slen(accels[a].model, sizeof(accels[a].model)) >=
            sizeof(accels[a].model) ||
        slen(accels[a].pci_bus_id, sizeof(accels[a].pci_bus_id)) >=
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

/* Health the agent reported for an accelerator: what the same agent
 * registering again keeps and a new incarnation starts without. */
static void accel_health_copy(struct lynx_reg_accel *dst,
                              const struct lynx_reg_accel *src) {
  dst->device_lost = src->device_lost;
  dst->failed = src->failed;
  dst->stalled_mqueues = src->stalled_mqueues;
  dst->stall_ms = src->stall_ms;
  memcpy(dst->last_error, src->last_error, sizeof(dst->last_error));
  dst->unhealthy_since_ms = src->unhealthy_since_ms;
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
  copy_str(n->address, sizeof(n->address), address);
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
          accel_health_copy(&n->accels[a], &old[b]);
        else if (!lynx_reg_accel_dispatchable(&old[b]))
          LYNX_INFO(COMP, "node %s accel %" PRIu32 " back in dispatch: its "
                    "agent restarted (was: %s)", n->id, old[b].info.idx,
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
  if (inst_find(r, a->instance_id, NULL))
    return; /* known already (same incarnation, reconnected) */
  if (!s || accel_pos(n, a->accel_idx) < 0 ||
      n->state == LYNX_NODE_DRAINED || a->desc.n_mqueues !=
      s->spec.mqueues_per_accel || a->desc.slots != s->spec.slots ||
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
  if (inst_dispatchable(i))
    r->table_dirty = 1;
  r->version++;
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
      set_err(err, 500, "internal", "out of memory");
      return -ENOMEM;
    }
    copy_str(n->id, sizeof(n->id), id);
    n->drain_intent = take_drain_intent(r, id);
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
    ERR_CONFLICT(err, "node %s: epoch %llu was declared down (its lease "
                 "expired or it left) and its requests in flight were "
                 "counted lost: register as a new incarnation", id,
                 (unsigned long long)epoch);
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
    node_drop_instances(r, n, 0);
    node_fill(n, address, labels, n_labels, accels, n_accels, conn, 0);
    n->epoch = epoch;
    n->drain_deadline_ms = 0;
    n->drain_table_version = 0;
    node_set_state(r, n, n->drain_intent ? LYNX_NODE_DRAINED : LYNX_NODE_READY);
  }
  node_heard(r, n, now_ms);
  for (uint32_t k = 0; k < n_adopt; k++)
    adopt_one(r, n, &adopt[k]);
  lynx_ev_add(&r->ev, LYNX_EV_NODE_REGISTERED, n->id,
              "node %s registered from %s: epoch %llu%s, %u accelerators%s",
              n->id, n->address, (unsigned long long)n->epoch,
              again ? " again" : fresh ? "" : " (a new incarnation)",
              n->n_accels, n_adopt ? ", its running instances adopted" : "");
  r->registrations++;
  r->version++;
  reconcile(r);
  lynx_reg_table_commit(r);
  return 0;
}

/* Whether the accelerator at position pos of n runs a READY instance. */
static int accel_has_ready_inst(const struct lynx_registry *r,
                                const struct lynx_reg_node *n, uint32_t pos) {
  const struct lynx_reg_instance *i;
  for (i = r->instances; i; i = i->next)
    if (i->node == n && i->state == LYNX_INST_READY &&
        i->accel_idx == n->accels[pos].info.idx)
      return 1;
  return 0;
}

/* What makes an accelerator unhealthy, as bits: a change of these while it
 * stays out of dispatch is worth a log line and a version. */
static unsigned health_bits(const struct lynx_reg_accel *a) {
  return (a->device_lost ? 1u : 0u) | (a->failed ? 2u : 0u) |
         (a->stalled_mqueues ? 4u : 0u);
}

/* Stores rep's health in the accelerator at position pos of n. When its
 * dispatchability changes: logged, r->version bumped, the table marked if
 * its instances are in (or come back into) it. */
static void accel_health_update(struct lynx_registry *r,
                                struct lynx_reg_node *n, uint32_t pos,
                                const struct lynx_accel_report *rep,
                                uint64_t now_ms) {
  struct lynx_reg_accel *a = &n->accels[pos];
  int was_ok = lynx_reg_accel_dispatchable(a), ok;
  unsigned was_bits = health_bits(a);
  size_t el = strnlen(rep->last_error, sizeof(rep->last_error) - 1);
  char why[256], subj[LYNX_ID_MAX + 16];

  a->device_lost = rep->device_lost != 0;
  a->failed = rep->failed != 0;
  a->stalled_mqueues = rep->stalled_mqueues;
  a->stall_ms = rep->stall_ms;
  memset(a->last_error, 0, sizeof(a->last_error));
  memcpy(a->last_error, rep->last_error, el);
  /* a device's message, cut to the field by the daemon: shown as text */
  lynx_text_clean(a->last_error, sizeof(a->last_error), a->last_error);
  ok = lynx_reg_accel_dispatchable(a);
  if (was_ok == ok) {
    if (!ok && health_bits(a) != was_bits) {
      r->version++;
      LYNX_WARN(COMP, "node %s accel %" PRIu32 " still out of dispatch: %s",
                n->id, a->info.idx,
                lynx_reg_accel_health_str(a, why, sizeof(why)));
    }
    return;
  }
  r->version++;
  if (n->state == LYNX_NODE_READY && accel_has_ready_inst(r, n, pos))
    r->table_dirty = 1;
  if (!ok) {
    a->unhealthy_since_ms = now_ms;
    a->health_outages++;
    lynx_reg_accel_health_str(a, why, sizeof(why));
    LYNX_WARN(COMP, "node %s accel %" PRIu32 " out of dispatch: %s", n->id,
              a->info.idx, why);
    snprintf(subj, sizeof(subj), "%s/%" PRIu32, n->id, a->info.idx);
    lynx_ev_add(&r->ev, LYNX_EV_ACCEL_OUT, subj,
                "accelerator %s out of dispatch: %s", subj, why);
  } else {
    uint64_t out = now_ms > a->unhealthy_since_ms
                       ? now_ms - a->unhealthy_since_ms
                       : 0;
    snprintf(subj, sizeof(subj), "%s/%" PRIu32, n->id, a->info.idx);
    lynx_ev_add(&r->ev, LYNX_EV_ACCEL_BACK, subj,
                "accelerator %s healthy again after %" PRIu64 " ms", subj,
                out);
    if (n->state == LYNX_NODE_READY)
      LYNX_INFO(COMP,
                "node %s accel %" PRIu32 " back in dispatch after %" PRIu64
                " ms", n->id, a->info.idx, out);
    else
      LYNX_INFO(COMP, "node %s accel %" PRIu32 " healthy again after %" PRIu64
                " ms (the node is %s)", n->id, a->info.idx, out,
                lynx_node_state_name(n->state));
  }
}

/* What an agent's message names: the node id at this epoch. 0 with *out,
 * -ENOENT (no such node), -ESTALE (another epoch: counted refused). */
static int node_at_epoch(struct lynx_registry *r, const char *id,
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

int lynx_reg_heartbeat(struct lynx_registry *r, const char *id, uint64_t epoch,
                       const struct lynx_accel_report *reports, uint32_t n,
                       uint64_t now_ms) {
  struct lynx_reg_node *node;
  uint32_t k;
  int rc = node_at_epoch(r, id, epoch, &node);
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
    int pos = accel_pos(node, reports[k].idx);
    if (pos < 0)
      continue;
    node->accels[pos].requests = reports[k].requests;
    node->accels[pos].lat = reports[k].lat;
    node->accels[pos].responses = reports[k].responses;
    accel_health_update(r, node, (uint32_t)pos, &reports[k], now_ms);
  }
  lynx_reg_table_commit(r);
  return 0;
}

/* A node goes DOWN: instances forgotten, replicas re-placed. */
static void node_down(struct lynx_registry *r, struct lynx_reg_node *n) {
  n->suspect = 0; /* down is worse */
  node_drop_instances(r, n, 0);
  node_set_state(r, n, LYNX_NODE_DOWN);
}

int lynx_reg_leave(struct lynx_registry *r, const char *id, uint64_t epoch,
                   uint64_t now_ms) {
  struct lynx_reg_node *n;
  int rc = node_at_epoch(r, id, epoch, &n);
  (void)now_ms;
  if (rc)
    return rc;
  if (n->state == LYNX_NODE_DOWN)
    return 0;
  lynx_ev_add(&r->ev, LYNX_EV_NODE_LEFT, n->id, "node %s left", n->id);
  node_down(r, n);
  reconcile(r);
  lynx_reg_table_commit(r);
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

static int inst_of_node(struct lynx_registry *r, const char *node_id,
                        uint64_t epoch, uint64_t instance_id,
                        struct lynx_reg_instance ***ppp) {
  struct lynx_reg_node *n;
  struct lynx_reg_instance *i;
  int rc = node_at_epoch(r, node_id, epoch, &n);
  if (rc)
    return rc;
  i = inst_find(r, instance_id, ppp);
  if (!i || i->node != n)
    return -ENOENT;
  return 0;
}

/* Field by field: padding bytes are not part of a descriptor. */
static int desc_equal(const struct lynx_region_desc *a,
                      const struct lynx_region_desc *b) {
  return a->accel_id == b->accel_id && !strcmp(a->transport, b->transport) &&
         !strcmp(a->locator, b->locator) && a->region_size == b->region_size &&
         a->epoch == b->epoch && a->n_mqueues == b->n_mqueues &&
         a->slot_size == b->slot_size && a->slots == b->slots &&
         a->large_bytes == b->large_bytes && a->ordering == b->ordering && a->key == b->key &&
         a->remote_addr == b->remote_addr &&
         !memcmp(a->rkeys, b->rkeys, sizeof(a->rkeys));
}

int lynx_reg_instance_ready(struct lynx_registry *r, const char *node_id,
                            uint64_t epoch, uint64_t instance_id,
                            const struct lynx_region_desc *desc,
                            uint64_t now_ms) {
  struct lynx_reg_instance **pp, *i;
  struct lynx_region_desc d;
  int rc;
  if (!desc)
    return -EINVAL;
  rc = inst_of_node(r, node_id, epoch, instance_id, &pp);
  if (rc)
    return rc;
  i = *pp;
  d = *desc;
  d.transport[sizeof(d.transport) - 1] = '\0';
  d.locator[sizeof(d.locator) - 1] = '\0';
  if (i->state == LYNX_INST_READY && desc_equal(&i->desc, &d))
    return 0; /* a repeated report */
  {
    int pos = accel_pos(i->node, i->accel_idx);
    if (pos >= 0) {
      i->node->accels[pos].failures = 0;
      i->node->accels[pos].retry_at_ms = 0;
    }
  }
  i->desc = d;
  i->state = LYNX_INST_READY;
  if (i->svc->last_error[0]) { /* it starts after all */
    i->svc->last_error[0] = 0;
    i->svc->last_error_ms = 0;
  }
  if (inst_dispatchable(i))
    r->table_dirty = 1;
  r->version++;
  for (struct lynx_reg_instance *j = r->instances; j; j = j->next)
    if (j->replaced_by == i->id && j->state == LYNX_INST_READY)
      inst_retire(r, j, now_ms);
  retire_check_all(r, now_ms); /* no frontend (and settled): at once */
  lynx_reg_table_commit(r);
  return 0;
}

int lynx_reg_instance_failed(struct lynx_registry *r, const char *node_id,
                             uint64_t epoch, uint64_t instance_id,
                             const char *why, uint64_t now_ms) {
  struct lynx_reg_instance **pp;
  int rc;
  rc = inst_of_node(r, node_id, epoch, instance_id, &pp);
  if (rc)
    return rc;
  r->now_ms = now_ms;
  {
    struct lynx_reg_instance *i = *pp;
    int pos = accel_pos(i->node, i->accel_idx);
    /* the operator sees why in the service's state: an agent's text,
     * cleaned (a byte that is not UTF-8 becomes '?') */
    snprintf(i->svc->last_error, sizeof(i->svc->last_error),
             "instance on %s/%u failed to start: ", node_id, i->accel_idx);
    lynx_text_clean(i->svc->last_error + strlen(i->svc->last_error),
                    sizeof(i->svc->last_error) - strlen(i->svc->last_error),
                    why ? why : "");
    i->svc->last_error_ms = now_ms;
    i->svc->failures++;
    r->version++;
    if (pos >= 0) {
      struct lynx_reg_accel *a = &i->node->accels[pos];
      uint32_t f = a->failures < 8 ? a->failures : 8;
      uint64_t backoff = 200ull << f;
      a->failures++;
      a->retry_at_ms = now_ms + (backoff > 30000 ? 30000 : backoff);
      if (!r->next_retry_ms || a->retry_at_ms < r->next_retry_ms)
        r->next_retry_ms = a->retry_at_ms;
    }
  }
  /* Forgotten now; placement starts it again once the accelerator's
   * backoff has passed (so an app that cannot start is not hammered). */
  inst_forget_at(r, pp);
  lynx_reg_table_commit(r);
  return 0;
}

/* ---- services ------------------------------------------------------- */

int lynx_service_spec_validate(const struct lynx_service_spec *sp,
                               struct lynx_reg_err *err) {
  struct lynx_geom g;
  uint32_t k, j;
  if (!sp) {
    ERR_INVALID(err, "service: missing");
    return -EINVAL;
  }
  if (!id_ok(sp->name, sizeof(sp->name), 0)) {
    ERR_INVALID(err, "name: must be 1-%zu characters of [A-Za-z0-9_.-]",
                sizeof(sp->name) - 1);
    return -EINVAL;
  }
  if (slen(sp->proto, sizeof(sp->proto)) >= sizeof(sp->proto) ||
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
  if (slen(sp->app, sizeof(sp->app)) == 0 ||
      slen(sp->app, sizeof(sp->app)) >= sizeof(sp->app)) {
    ERR_INVALID(err, "app: must be 1-%zu characters", sizeof(sp->app) - 1);
    return -EINVAL;
  }
  if (!lynx_text_ok(sp->app, slen(sp->app, sizeof(sp->app)))) {
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
  if (lynx_geom_init(&g, sp->mqueues_per_accel, sp->slots, sp->slot_size,
                     0)) {
    ERR_INVALID(err, "slots: geometry out of bounds");
    return -EINVAL;
  }
  if (sp->msg_max > LYNX_LARGE_MAX / 2) { /* 0: what a slot holds */
    ERR_INVALID(err, "msg_max: must be at most %u bytes",
                LYNX_LARGE_MAX / 2);
    return -EINVAL;
  }
  if (sp->fixed_len > (sp->msg_max > lynx_slot_cap(sp->slot_size)
                            ? sp->msg_max
                            : lynx_slot_cap(sp->slot_size))) {
    ERR_INVALID(err, "framing: fixed messages of %u bytes are longer than "
                "msg_max (%u) and a %u-byte slot's payload", sp->fixed_len,
                sp->msg_max, sp->slot_size);
    return -EINVAL;
  }
  if (sp->n_backends > LYNX_BACKENDS_MAX ||
      lynx_geom_init(&g, sp->mqueues_per_accel + sp->n_backends, sp->slots,
                     sp->slot_size, lynx_large_for(sp->msg_max, sp->slot_size))) {
    ERR_INVALID(err, "backends: at most %u, and mqueues_per_accel plus "
                "backends at most %u", LYNX_BACKENDS_MAX, LYNX_MQUEUES_MAX);
    return -EINVAL;
  }
  for (k = 0; k < sp->n_backends; k++) {
    const struct lynx_backend_spec *b = &sp->backends[k];
    struct sockaddr_storage ss;
    if (!id_ok(b->name, sizeof(b->name), 0)) {
      ERR_INVALID(err, "backends[%u].name: must be 1-%zu characters of "
                  "[A-Za-z0-9_.-]", k, sizeof(b->name) - 1);
      return -EINVAL;
    }
    if (slen(b->address, sizeof(b->address)) >= sizeof(b->address) ||
        lynx_parse_hostport(b->address, &ss) ||
        ((struct sockaddr_in *)&ss)->sin_port == 0) {
      ERR_INVALID(err, "backends[%u].address: must be a numeric host:port",
                  k);
      return -EINVAL;
    }
    if (strcmp(b->proto, "memcached") && strcmp(b->proto, "len32")) {
      ERR_INVALID(err, "backends[%u].proto: must be \"memcached\" or "
                  "\"len32\"", k);
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
    size_t kl = slen(sp->selector[k].key, LYNX_LABEL_MAX);
    if (kl == 0 || kl >= LYNX_LABEL_MAX ||
        slen(sp->selector[k].value, LYNX_LABEL_MAX) >= LYNX_LABEL_MAX) {
      ERR_INVALID(err,
                  "placement.selector: keys must be 1-%d characters, values "
                  "at most %d",
                  LYNX_LABEL_MAX - 1, LYNX_LABEL_MAX - 1);
      return -EINVAL;
    }
    if (!lynx_text_ok(sp->selector[k].key, kl) ||
        !lynx_text_ok(sp->selector[k].value,
                      slen(sp->selector[k].value, LYNX_LABEL_MAX))) {
      ERR_INVALID(err, "placement.selector: key and value %u must be valid "
                  "UTF-8 without control characters", k);
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

/* The operator's limit on a valid spec's region: -EFBIG (422) above
 * r->region_max_bytes, naming the computed size. */
static int region_limit(const struct lynx_registry *r,
                        const struct lynx_service_spec *sp,
                        struct lynx_reg_err *err) {
  uint64_t bytes = lynx_service_region_bytes(sp);
  if (!r->region_max_bytes || bytes <= r->region_max_bytes)
    return 0;
  set_err(err, 422, "limit_exceeded",
          "region: %u slots of %u bytes (and %u bytes for large messages) "
          "in %u mqueues (%u per accelerator + %u for back ends), each with "
          "an RX and a TX ring, take %" PRIu64
          " bytes (%" PRIu64 " MiB) on every accelerator; the limit is "
          "%" PRIu64 " MiB (--region-max-mb)",
          sp->slots, sp->slot_size, lynx_large_for(sp->msg_max, sp->slot_size),
          sp->mqueues_per_accel + sp->n_backends, sp->mqueues_per_accel,
          sp->n_backends, bytes,
          (bytes + (1u << 20) - 1) >> 20, r->region_max_bytes >> 20);
  return -EFBIG;
}

/* The applications the accelerators of nodes that are not down say they
 * run, ", "-separated without repeats, into buf (len bytes). Returns 1
 * when one of them runs app, or one does not say (it may run any). */
static int apps_known(const struct lynx_registry *r, const char *app,
                      char *buf, size_t len) {
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

/* The back end app calls by name, as a registered accelerator that runs
 * it says (AccelInfo.app_backends): "" when it calls none, NULL when no
 * such accelerator says. */
static const char *app_backend(const struct lynx_registry *r,
                               const char *app) {
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
  const char *need;
  size_t l = 0;
  if (!apps_known(r, sp->app, known, sizeof(known)) && known[0]) {
    set_err(err, 422, "unknown_app",
            "app: no registered accelerator runs application '%s' (they "
            "run: %s)", sp->app, known);
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
  set_err(err, 400, "invalid_argument",
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
  set_err(err, 409, "limit_exceeded",
          "services: %" PRIu32 " exist, the limit (--services-max); delete "
          "one first",
          n);
  return -ENOSPC;
}

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
    set_err(err, 500, "internal", "out of memory");
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
  reconcile(r);
  lynx_reg_table_commit(r);
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
      inst_forget_at(r, pp);
    else
      inst_stop_at(r, pp);
  }
  *sp = s->next;
  free(s);
  r->version++;
  reconcile(r);
  lynx_reg_table_commit(r);
  return 0;
}

/* ---- operators: nodes ----------------------------------------------- */

/* A READY node drains: out of the table now, its instances stopped by
 * drain_check. One draining or drained already stays as it is. */
static void drain_begin(struct lynx_registry *r, struct lynx_reg_node *n,
                        uint64_t now_ms) {
  if (n->state != LYNX_NODE_READY)
    return;
  node_set_state(r, n, LYNX_NODE_DRAINING);
  lynx_reg_table_commit(r); /* the table without n: frontends must run it */
  n->drain_table_version = r->table_version;
  n->drain_deadline_ms = now_ms + r->drain_timeout_ms;
  /* replicas get their replacements while n drains */
  reconcile(r);
  drain_check(r, n, now_ms); /* no frontend (and settled): done at once */
  lynx_reg_table_commit(r);
}

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
  drain_begin(r, n, now_ms);
  return 0;
}

int lynx_reg_leave_drain(struct lynx_registry *r, const char *id,
                         uint64_t epoch, uint64_t now_ms) {
  struct lynx_reg_node *n;
  int rc = node_at_epoch(r, id, epoch, &n);
  if (rc)
    return rc;
  if (n->state == LYNX_NODE_DOWN)
    return -ENOTCONN;
  if (n->state == LYNX_NODE_READY)
    n->leaving = 1;
  drain_begin(r, n, now_ms);
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
    ERR_CONFLICT(err, "node %s drains to leave: its agent is stopping (a "
                 "new agent registers it ready)", n->id);
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
  node_set_state(r, n, LYNX_NODE_READY);
  reconcile(r);
  lynx_reg_table_commit(r);
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
    node_drop_instances(r, n, 0); /* forgotten, not stopped: they serve */
    *pp = n->next;
    free(n);
    gone++;
  }
  if (gone) {
    r->version++;
    lynx_reg_table_commit(r);
  }
  return gone;
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
  node_drop_instances(r, n, 0); /* none: a down node has none */
  *pp = n->next;
  free(n);
  r->version++;
  lynx_reg_table_commit(r);
  return 0;
}

/* ---- frontends ------------------------------------------------------ */

struct lynx_reg_frontend *lynx_reg_frontend_find(struct lynx_registry *r,
                                                 const char *id) {
  struct lynx_reg_frontend *f;
  if (!id)
    return NULL;
  for (f = r->frontends; f; f = f->next)
    if (!strncmp(f->id, id, sizeof(f->id)))
      return f;
  return NULL;
}

struct lynx_reg_frontend *
lynx_reg_frontend_connect(struct lynx_registry *r, const char *id,
                          const char *address, void *conn, uint64_t now_ms) {
  struct lynx_reg_frontend *f, **tail;
  if (!id || !*id || slen(id, LYNX_ID_MAX) >= LYNX_ID_MAX)
    return NULL;
  f = lynx_reg_frontend_find(r, id);
  if (!f) {
    f = calloc(1, sizeof(*f));
    if (!f)
      return NULL;
    copy_str(f->id, sizeof(f->id), id);
    for (tail = &r->frontends; *tail; tail = &(*tail)->next)
      ;
    *tail = f;
  }
  copy_str(f->address, sizeof(f->address), address);
  f->conn = conn;
  f->connected = 1;
  lynx_ev_add(&r->ev, LYNX_EV_FRONTEND_CONNECTED, f->id,
              "frontend %s connected from %s", f->id, f->address);
  f->active = 0; /* the daemon decides (lynx_reg_frontend_set_active) */
  free(f->claims);
  f->claims = NULL;
  f->n_claims = 0;
  f->last_seen_ms = now_ms;
  /* Until it reports, assume it runs no table and knows nothing: a drain
   * waits for its first report (it may be a new process). */
  f->table_version_applied = 0;
  free(f->mqs);
  f->mqs = NULL;
  f->n_mqs = 0;
  free(f->listen);
  f->listen = NULL;
  f->n_listen = 0;
  r->version++;
  return f;
}

void lynx_reg_frontend_disconnected(struct lynx_registry *r, void *conn) {
  struct lynx_reg_frontend *f;
  if (!conn)
    return;
  for (f = r->frontends; f; f = f->next)
    if (f->conn == conn) {
      lynx_ev_add(&r->ev, LYNX_EV_FRONTEND_GONE, f->id,
                  "frontend %s disconnected%s", f->id,
                  f->active ? ": its instances go to another active frontend"
                            : "");
      f->conn = NULL;
      f->connected = 0;
      f->active = 0;
      r->version++;
    }
}

int lynx_reg_frontend_claims(struct lynx_registry *r, const char *id,
                             const struct lynx_fe_claim *c, uint32_t n) {
  struct lynx_reg_frontend *f = lynx_reg_frontend_find(r, id);
  struct lynx_fe_claim *copy = NULL;
  if (!f)
    return -ENOENT;
  if (n) {
    copy = malloc((size_t)n * sizeof(*copy));
    if (!copy)
      return -ENOMEM;
    memcpy(copy, c, (size_t)n * sizeof(*copy));
  }
  free(f->claims);
  f->claims = copy;
  f->n_claims = n;
  return 0;
}

void lynx_reg_frontend_claims_done(struct lynx_registry *r, const char *id) {
  struct lynx_reg_frontend *f = lynx_reg_frontend_find(r, id);
  if (!f || !f->n_claims)
    return;
  free(f->claims);
  f->claims = NULL;
  f->n_claims = 0;
}

int lynx_reg_frontend_drain(struct lynx_registry *r, const char *id,
                            int drain, struct lynx_reg_err *err) {
  struct lynx_reg_frontend *f = lynx_reg_frontend_find(r, id);
  if (!f) {
    ERR_NOTFOUND(err, "frontend '%s' not found", id ? id : "");
    return -ENOENT;
  }
  if (f->drain_intent == (drain != 0))
    return 0;
  f->drain_intent = drain != 0;
  lynx_ev_add(&r->ev,
              drain ? LYNX_EV_FRONTEND_DRAINING : LYNX_EV_FRONTEND_UNDRAINED,
              f->id, "frontend %s %s", f->id,
              drain ? "drains: its instances move to the other active "
                      "frontends"
                    : "is undrained");
  LYNX_INFO(COMP, "frontend %s %s", f->id,
            drain ? "drains: its instances move to the other active frontends "
                    "once it answered what it holds on them"
                  : "is undrained");
  r->version++;
  r->table_dirty = 1; /* the daemon chooses the active frontends again */
  lynx_reg_table_commit(r);
  return 0;
}

void lynx_reg_frontend_set_active(struct lynx_registry *r, const char *id,
                                  int active) {
  struct lynx_reg_frontend *f = lynx_reg_frontend_find(r, id);
  if (!f || f->active == (active && f->connected))
    return;
  f->active = active && f->connected;
  lynx_ev_add(&r->ev,
              f->active ? LYNX_EV_FRONTEND_ACTIVE : LYNX_EV_FRONTEND_STANDBY,
              f->id, "frontend %s is %s", f->id,
              f->active ? "active: instances are given to it"
                        : "a standby: it serves nothing");
  r->version++;
}

void lynx_reg_frontend_status(struct lynx_registry *r, const char *id,
                              uint64_t table_version,
                              const struct lynx_fe_mq_report *mqs, uint32_t n,
                              uint64_t now_ms) {
  struct lynx_reg_frontend *f = lynx_reg_frontend_find(r, id);
  struct lynx_fe_mq_report *copy = NULL;
  if (!f)
    return;
  f->last_seen_ms = now_ms;
  if (n && mqs) {
    copy = malloc((size_t)n * sizeof(*copy));
    if (!copy)
      return; /* keep the last report: a drain must not see a false 0 */
    memcpy(copy, mqs, (size_t)n * sizeof(*copy));
  } else {
    n = 0;
  }
  free(f->mqs);
  f->mqs = copy;
  f->n_mqs = n;
  if (f->table_version_applied != table_version) {
    f->table_version_applied = table_version;
    r->version++;
  }
  drain_check_all(r, now_ms);
  lynx_reg_table_commit(r);
}

void lynx_reg_frontend_listen(struct lynx_registry *r, const char *id,
                              const struct lynx_fe_listen *l, uint32_t n) {
  struct lynx_reg_frontend *f = lynx_reg_frontend_find(r, id);
  struct lynx_fe_listen *copy = NULL;
  if (!f)
    return;
  if (n == f->n_listen &&
      (!n || !memcmp(l, f->listen, (size_t)n * sizeof(*l))))
    return; /* as before: no news for watchers */
  if (n) {
    copy = malloc((size_t)n * sizeof(*copy));
    if (!copy)
      return;
    memcpy(copy, l, (size_t)n * sizeof(*copy));
  }
  free(f->listen);
  f->listen = copy;
  f->n_listen = n;
  r->version++;
}

/* A connected frontend that reports it cannot listen on s's port, or
 * NULL (with its listener record in *out). */
static const struct lynx_reg_frontend *
listen_failure(const struct lynx_registry *r, const struct lynx_reg_service *s,
               const struct lynx_fe_listen **out) {
  for (const struct lynx_reg_frontend *f = r->frontends; f; f = f->next) {
    if (!f->connected)
      continue;
    for (uint32_t k = 0; k < f->n_listen; k++)
      if (!f->listen[k].listening && !strcmp(f->listen[k].service, s->spec.name)) {
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
    apps_known(r, s->spec.app, known, sizeof(known));
    snprintf(reason, len, "no accelerator of the matching nodes runs "
             "application '%s' (they run: %s)", s->spec.app, known);
  } else
    snprintf(reason, len, "%" PRIu64 " of %" PRIu64 " instances ready", *ready,
             *wanted);
  return *ready ? "degraded" : "pending";
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
                  "its requests in flight are counted lost", n->id,
                  (unsigned long long)r->lease_ms);
      node_down(r, n);
    }
  drain_check_all(r, now_ms);
  if (r->version != r->placed_version)
    reconcile(r);
  lynx_reg_partition(r, now_ms); /* commits the table */
}

/* ---- dispatch table ------------------------------------------------- */

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
