/*
 * actions.c - what the registry asks the coordinator to do (its ops,
 * called under c.lock on the loop thread or an API thread), queued and
 * then sent from the loop (flush): instance starts and stops to agents,
 * epochs, and the frontends' dispatch tables (which frontends are active,
 * each one's table of the instances it produces into).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordd.h"
#include "ctlmsg.h"
#include "log.h"

/* ---- registry actions (called under the lock, on any thread) --------- */

static void queue_action(struct coordinator *co, struct action *a) {
  a->next = NULL;
  *co->actions_tail = a;
  co->actions_tail = &a->next;
  uv_async_send(&co->wake);
}

void coord_act_start(void *data, struct lynx_reg_node *node,
                     struct lynx_reg_instance *inst) {
  struct coordinator *co = data;
  struct action *a = calloc(1, sizeof(*a));
  if (!a) {
    LYNX_ERR("coordinator", "out of memory queueing a start");
    return;
  }
  a->kind = ACT_START;
  snprintf(a->node, sizeof(a->node), "%s", node->id);
  a->instance_id = inst->id;
  a->accel = inst->accel_idx;
  a->spec = inst->svc->spec;
  queue_action(co, a);
}

void coord_act_stop(void *data, struct lynx_reg_node *node,
                    uint64_t instance_id) {
  struct coordinator *co = data;
  struct action *a = calloc(1, sizeof(*a));
  if (!a) {
    LYNX_ERR("coordinator", "out of memory queueing a stop");
    return;
  }
  a->kind = ACT_STOP;
  snprintf(a->node, sizeof(a->node), "%s", node->id);
  a->instance_id = instance_id;
  queue_action(co, a);
}

void coord_act_tables(void *data) {
  struct coordinator *co = data;
  struct action *a = calloc(1, sizeof(*a));
  if (!a)
    return;
  a->kind = ACT_TABLES;
  queue_action(co, a);
}

/* ---- sending --------------------------------------------------------- */

void coord_send_env(struct cpeer *p, Lynx__Envelope *env) {
  if (lynx_ctl_send(&p->ctl, env))
    lynx_ctl_close(&p->ctl, "cannot queue a message");
}

/* pb->backends points into bk (LYNX_BACKENDS_MAX entries) and s. */
static void spec_to_pb(const struct lynx_service_spec *s, Lynx__ServiceSpec *pb,
                       Lynx__Backend *bk, Lynx__Backend **bkp) {
  lynx__service_spec__init(pb);
  pb->name = (char *)s->name;
  pb->proto = (char *)s->proto;
  pb->port = s->port;
  pb->app = (char *)s->app;
  pb->slot_size = s->slot_size;
  pb->slots = s->slots;
  pb->msg_max = s->msg_max;
  pb->mqueues_per_accel = s->mqueues_per_accel;
  pb->work_us = s->work_us;
  pb->fixed_len = s->fixed_len;
  for (uint32_t i = 0; i < s->n_backends && i < LYNX_BACKENDS_MAX; i++) {
    lynx__backend__init(&bk[i]);
    bk[i].name = (char *)s->backends[i].name;
    bk[i].address = (char *)s->backends[i].address;
    bk[i].proto = (char *)s->backends[i].proto;
    bkp[i] = &bk[i];
  }
  pb->n_backends = s->n_backends;
  pb->backends = bkp;
}

static struct cpeer *agent_peer(struct coordinator *co, const char *node) {
  for (struct cpeer *p = co->peers; p; p = p->next)
    if (p->role == ROLE_AGENT && p->registered && strcmp(p->id, node) == 0 &&
        !p->ctl.closing)
      return p;
  return NULL;
}

/* A new epoch from the store (etcd's revisions, or the state directory's
 * counter): strictly increasing across restarts of anything. Lock held;
 * with etcd, one issued ahead (elect.h), so the loop never waits on etcd:
 * -EAGAIN when none is ready yet. */
int coord_issue_epoch(struct coordinator *co, int frontend, uint64_t *epoch,
                      char *err, size_t errlen) {
  if (co->cfg.etcd) /* issued ahead by the election thread: no waiting */
    return lynx_elect_take_epoch(&co->elect, &co->c.reg, frontend, epoch, err,
                                 errlen);
  return lynx_store_issue_epoch(co->cfg.state_dir, &co->c.reg, frontend, epoch,
                                err, errlen);
}

/* The registry gives instances to frontends (partition.c): a frontend
 * epoch for the round. Loop thread, lock held. */
int coord_act_issue_epoch(void *data, uint64_t *epoch) {
  struct coordinator *co = data;
  char err[256] = "";
  int rc = coord_issue_epoch(co, 1, epoch, err, sizeof(err));
  if (rc && rc != -EAGAIN) /* -EAGAIN: one is on its way (elect.h) */
    LYNX_LOG_RL(LYNX_LOG_ERROR, "coordinator",
                "no frontend epoch could be "
                "issued: %s",
                err[0] ? err : strerror(-rc));
  return rc;
}

/* The newest epoch f produces with (an instance the registry gives it, or
 * one it claimed when it connected); 0: none. *owns: whether the registry
 * gives it any instance (releasing ones too). */
static uint64_t fe_newest_epoch(const struct lynx_registry *r,
                                const struct lynx_reg_frontend *f, int *owns) {
  uint64_t e = 0;
  *owns = 0;
  for (const struct lynx_reg_instance *i = r->instances; i; i = i->next)
    if (!strcmp(i->fe_owner, f->id)) {
      *owns = 1;
      if (i->fe_epoch > e)
        e = i->fe_epoch;
    }
  for (uint32_t k = 0; k < f->n_claims; k++)
    if (f->claims[k].epoch > e)
      e = f->claims[k].epoch;
  return e;
}

/* Chooses the active frontends (--active-frontends; 0: every one), which
 * the registry partitions the instances among; any other is a standby.
 * Those that produce already come first, the newest epoch first (a
 * frontend reconnecting to a restarted or newly elected coordinator keeps
 * producing, so a control-plane failover does not move the data plane),
 * then the earliest connected. A draining frontend does not count: it
 * stays active only while it still has instances to let go of. Lock
 * held. */
static void choose_active(struct coordinator *co) {
  struct lynx_registry *r = &co->c.reg;
  struct cand {
    struct cpeer *p;
    uint64_t epoch;
    int draining, owns;
  } * c;
  size_t n = 0, taken = 0, want = co->cfg.active_frontends;
  for (struct cpeer *p = co->peers; p; p = p->next)
    n += p->role == ROLE_FRONTEND;
  c = calloc(n + 1, sizeof(*c));
  if (!c)
    return; /* as before: tried again at the next push */
  n = 0;
  for (struct cpeer *p = co->peers; p; p = p->next) {
    struct lynx_reg_frontend *f;
    if (p->role != ROLE_FRONTEND)
      continue;
    f = lynx_reg_frontend_find(r, p->id);
    if (!f || f->conn != p)
      continue;
    if (p->ctl.closing) { /* cut off or going: its instances move now */
      lynx_reg_frontend_set_active(r, p->id, 0);
      continue;
    }
    c[n].p = p;
    c[n].epoch = fe_newest_epoch(r, f, &c[n].owns);
    c[n].draining = f->drain_intent;
    n++;
  }
  for (size_t a = 0; a < n; a++) { /* few frontends: a selection sort */
    size_t best = a;
    for (size_t b = a + 1; b < n; b++)
      if (c[b].draining < c[best].draining ||
          (c[b].draining == c[best].draining &&
           (c[b].epoch > c[best].epoch ||
            (c[b].epoch == c[best].epoch &&
             c[b].p->connected_seq < c[best].p->connected_seq))))
        best = b;
    struct cand t = c[a];
    c[a] = c[best];
    c[best] = t;
    if (c[a].draining) {
      lynx_reg_frontend_set_active(r, c[a].p->id, c[a].owns);
      continue;
    }
    lynx_reg_frontend_set_active(r, c[a].p->id, !want || taken < want);
    taken++;
  }
  free(c);
}

struct table_build {
  Lynx__ServiceTable *svcs;
  Lynx__ServiceTable **svc_ptrs;
  Lynx__ServiceSpec *specs;
  Lynx__Backend (*bk)[LYNX_BACKENDS_MAX]; /* per service */
  Lynx__Backend *(*bkp)[LYNX_BACKENDS_MAX];
  Lynx__TableEntry *entries, **entry_ptrs;
  Lynx__RegionDesc *regions;
  size_t n_svcs, n_entries;
  uint64_t newest; /* the newest entry epoch */
};

static void table_build_free(struct table_build *tb) {
  free(tb->svcs);
  free(tb->svc_ptrs);
  free(tb->specs);
  free(tb->bk);
  free(tb->bkp);
  free(tb->entries);
  free(tb->entry_ptrs);
  free(tb->regions);
  memset(tb, 0, sizeof(*tb));
}

/* The services active frontend f serves, with the instances it produces
 * into (lynx_reg_fe_produces), each with its epoch. -ENOMEM. */
static int table_build(struct lynx_registry *r,
                       const struct lynx_reg_frontend *f,
                       struct table_build *tb) {
  size_t cap_s = 0, cap_e = 0;
  memset(tb, 0, sizeof(*tb));
  for (const struct lynx_reg_service *s = r->services; s; s = s->next)
    cap_s++;
  for (const struct lynx_reg_instance *i = r->instances; i; i = i->next)
    cap_e += lynx_reg_fe_produces(f, i);
  tb->svcs = calloc(cap_s + 1, sizeof(*tb->svcs));
  tb->svc_ptrs = calloc(cap_s + 1, sizeof(*tb->svc_ptrs));
  tb->specs = calloc(cap_s + 1, sizeof(*tb->specs));
  tb->bk = calloc(cap_s + 1, sizeof(*tb->bk));
  tb->bkp = calloc(cap_s + 1, sizeof(*tb->bkp));
  tb->entries = calloc(cap_e + 1, sizeof(*tb->entries));
  tb->entry_ptrs = calloc(cap_e + 1, sizeof(*tb->entry_ptrs));
  tb->regions = calloc(cap_e + 1, sizeof(*tb->regions));
  if (!tb->svcs || !tb->svc_ptrs || !tb->specs || !tb->bk || !tb->bkp ||
      !tb->entries || !tb->entry_ptrs || !tb->regions) {
    table_build_free(tb);
    return -ENOMEM;
  }
  for (const struct lynx_reg_service *s = r->services; s; s = s->next) {
    Lynx__ServiceTable *st = &tb->svcs[tb->n_svcs];
    if (!lynx_reg_fe_serves(r, f, s))
      continue;
    lynx__service_table__init(st);
    spec_to_pb(&s->spec, &tb->specs[tb->n_svcs], tb->bk[tb->n_svcs],
               tb->bkp[tb->n_svcs]);
    st->service = &tb->specs[tb->n_svcs];
    st->entries = &tb->entry_ptrs[tb->n_entries];
    for (const struct lynx_reg_instance *i = r->instances; i; i = i->next) {
      Lynx__TableEntry *e = &tb->entries[tb->n_entries];
      if (i->svc != s || !lynx_reg_fe_produces(f, i))
        continue;
      lynx__table_entry__init(e);
      e->instance_id = i->id;
      e->node_id = i->node->id;
      e->epoch = i->fe_epoch;
      lynx_desc_to_pb(&i->desc, &tb->regions[tb->n_entries]);
      e->region = &tb->regions[tb->n_entries];
      tb->entry_ptrs[tb->n_entries++] = e;
      st->n_entries++;
      if (i->fe_epoch > tb->newest)
        tb->newest = i->fe_epoch;
    }
    tb->svc_ptrs[tb->n_svcs++] = st;
  }
  return 0;
}

/* Sends every frontend the table it should run, if it has not got it yet:
 * an active one the services it serves and the instances it produces into
 * (partition.c), a standby an empty one. Loop thread, lock held. */
void coord_push_tables(struct coordinator *co) {
  struct lynx_registry *r = &co->c.reg;
  char **down = NULL;
  size_t n_down = 0;
  if (coord_now_ms() < co->c.reg.settle_until_ms)
    return; /* the tick pushes once the agents had their chance */
  /* a follower's tables are no one's: one that just stepped down (its
   * frontends not closed yet) would hand them what it no longer knows,
   * e.g. no node at all once it released them (registry.h) */
  if (!lynx_coord_leads(&co->c))
    return;
  choose_active(co);
  lynx_reg_partition(r, coord_now_ms());
  for (struct lynx_reg_node *n = r->nodes; n; n = n->next)
    n_down += n->state == LYNX_NODE_DOWN;
  down = calloc(n_down + 1, sizeof(*down));
  if (!down) {
    LYNX_ERR("coordinator", "out of memory building dispatch tables");
    return;
  }
  n_down = 0;
  for (struct lynx_reg_node *n = r->nodes; n; n = n->next)
    if (n->state == LYNX_NODE_DOWN)
      down[n_down++] = n->id;
  for (struct cpeer *p = co->peers; p; p = p->next) {
    Lynx__Envelope env = LYNX__ENVELOPE__INIT;
    Lynx__DispatchTable t = LYNX__DISPATCH_TABLE__INIT;
    struct table_build tb;
    struct lynx_reg_frontend *f;
    int standby;
    if (p->role != ROLE_FRONTEND || p->ctl.closing)
      continue;
    f = lynx_reg_frontend_find(r, p->id);
    standby = !f || f->conn != p || !f->active;
    if (p->table_sent == r->table_version + 1 && p->standby_sent == standby)
      continue;
    memset(&tb, 0, sizeof(tb));
    if (!standby && table_build(r, f, &tb)) {
      LYNX_ERR("coordinator",
               "out of memory building frontend %s's dispatch "
               "table; tried again at the next change",
               p->id);
      continue;
    }
    t.version = r->table_version;
    t.standby = standby;
    t.frontend_epoch = tb.newest;
    t.n_services = tb.n_svcs;
    t.services = tb.svc_ptrs;
    t.n_down_nodes = n_down;
    t.down_nodes = down;
    env.msg_case = LYNX__ENVELOPE__MSG_DISPATCH_TABLE;
    env.dispatch_table = &t;
    coord_send_env(p, &env);
    p->table_sent = r->table_version + 1;
    p->standby_sent = standby;
    /* what it claimed at Hello is settled by this table: given back, or
     * (a standby, or given to another) to be fenced out; a claim kept
     * would be stale by the next failure */
    lynx_reg_frontend_claims_done(r, p->id);
    LYNX_INFO("coordinator",
              "table %llu -> frontend %s%s (%zu services, "
              "%zu instances)",
              (unsigned long long)t.version, p->id, standby ? " (standby)" : "",
              tb.n_svcs, tb.n_entries);
    table_build_free(&tb);
  }
  free(down);
}

/* Runs queued actions; loop thread, lock held. */
static void flush_actions(struct coordinator *co) {
  int tables = 0;
  while (co->actions) {
    struct action *a = co->actions;
    struct cpeer *p;
    co->actions = a->next;
    if (!co->actions)
      co->actions_tail = &co->actions;
    switch (a->kind) {
    case ACT_START:
    case ACT_STOP:
      p = agent_peer(co, a->node);
      if (!p) {
        LYNX_DBG("coordinator",
                 "node %s not connected: %s of instance %llu "
                 "not sent",
                 a->node, a->kind == ACT_START ? "start" : "stop",
                 (unsigned long long)a->instance_id);
        break;
      }
      if (a->kind == ACT_START) {
        Lynx__Envelope env = LYNX__ENVELOPE__INIT;
        Lynx__StartInstance s = LYNX__START_INSTANCE__INIT;
        Lynx__ServiceSpec sp;
        Lynx__Backend bk[LYNX_BACKENDS_MAX], *bkp[LYNX_BACKENDS_MAX];
        spec_to_pb(&a->spec, &sp, bk, bkp);
        s.instance_id = a->instance_id;
        s.accel_idx = a->accel;
        s.service = &sp;
        s.app_config = a->spec.app_config;
        env.msg_case = LYNX__ENVELOPE__MSG_START_INSTANCE;
        env.start_instance = &s;
        coord_send_env(p, &env);
      } else {
        Lynx__Envelope env = LYNX__ENVELOPE__INIT;
        Lynx__StopInstance s = LYNX__STOP_INSTANCE__INIT;
        s.instance_id = a->instance_id;
        env.msg_case = LYNX__ENVELOPE__MSG_STOP_INSTANCE;
        env.stop_instance = &s;
        coord_send_env(p, &env);
      }
      break;
    case ACT_TABLES:
      tables = 1;
      break;
    }
    free(a);
  }
  if (tables)
    coord_push_tables(co);
}

/* After any registry call on the loop thread (lock held). */
void coord_after_change(struct coordinator *co) {
  flush_actions(co);
  if (co->c.reg.version != co->seen_version) {
    co->seen_version = co->c.reg.version;
    coord_changed(&co->c);
  }
}
