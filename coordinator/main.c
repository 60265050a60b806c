/*
 * lynx-coordinator - the registry of every accelerator, placement, leases,
 * dispatch tables, and the operators' JSON API.
 *
 * Threads: the libuv loop thread owns the control connections (agents and
 * frontends, protobuf-c frames), the 100 ms lease tick and every message
 * sent; libmicrohttpd's threads serve the JSON API (http.c). Both take
 * c.lock around registry access. The registry's action callbacks run under
 * the lock on either thread and only queue work; the loop thread sends it
 * (flush_actions), woken by a uv_async when the API caused it.
 *
 * Frontends: up to --active-frontends are active (choose_active) and the
 * registry partitions the instances among them (partition.c); each gets a
 * table of the instances it produces into, with their epochs. Any other is
 * a standby with an empty table, made active when an active one goes. Each
 * mqueue has exactly one producer that way (docs/frontends.md).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <json-c/json.h>

#include "coord.h"
#include "ctlconn.h"
#include "ctlmsg.h"
#include "frame.h"
#include "httpconn.h"
#include "log.h"
#include "notify.h"
#include "options.h"
#include "store.h"
#include "tls.h"
#include "elect.h"
#include "store_etcd.h"
#include "util.h"

struct coord_cfg {
  uint32_t ctl_conn_max, ctl_unauth_max, ctl_unauth_per_client;
  char *listen, *http, *state_dir, *token_file, *log_level;
  char *tls_ca, *tls_cert, *tls_key;
  char *etcd, *etcd_prefix;
  uint32_t etcd_timeout_ms, etcd_lease_s;
  uint32_t lease_ms, suspect_ms, drain_ms, frontend_timeout_ms, frame_max,
      body_max;
  uint32_t active_frontends;
  uint32_t http_conn_max, http_conn_per_client, http_header_ms, http_body_ms;
  uint32_t services_max, region_max_mb;
};

#define O(f) offsetof(struct coord_cfg, f)
static const struct lynx_opt coord_opts[] = {
    {"listen", LYNX_OPT_ADDR, O(listen), "127.0.0.1:7700", 1, 65535, NULL,
     "control address for agents and frontends"},
    {"http", LYNX_OPT_ADDR, O(http), "127.0.0.1:7780", 1, 65535, NULL,
     "JSON API address"},
    {"state-dir", LYNX_OPT_STR, O(state_dir), "./lynx-state", 0, 0, NULL,
     "where services and drain intents are kept (without --etcd)"},
    {"etcd", LYNX_OPT_STR, O(etcd), NULL, 0, 0, NULL,
     "etcd endpoints (http://host:port,...): services and drain intents "
     "are kept there instead of --state-dir (docs/etcd.md)"},
    {"etcd-prefix", LYNX_OPT_STR, O(etcd_prefix), LYNX_ETCD_PREFIX_DEFAULT, 0,
     0, NULL, "the keys' prefix in etcd"},
    {"etcd-timeout-ms", LYNX_OPT_U32, O(etcd_timeout_ms), "1000", 100, 60000,
     NULL, "an etcd call that takes longer fails (an API change then gets "
     "503)"},
    {"etcd-lease-s", LYNX_OPT_U32, O(etcd_lease_s), "3", 2, 60, NULL,
     "with --etcd: the leader's lease; a follower leads within about this "
     "long after the leader dies"},
    {"lease-ms", LYNX_OPT_U32, O(lease_ms), NULL, 100, 600000, NULL,
     "the agents' lease: a node without heartbeat for this long is down "
     "(its requests in flight are counted lost), and its agent stops "
     "taking requests before then (default 3000; with --etcd long enough "
     "to ride out a leader failover: 2/3 --suspect-ms + --etcd-lease-s + "
     "3.5 s, 8500 with the defaults; a shorter one is refused)"},
    {"suspect-ms", LYNX_OPT_U32, O(suspect_ms), NULL, 100, 600000, NULL,
     "a node without heartbeat for this long leaves the dispatch tables "
     "(no new request goes to it) until it is heard again; agents "
     "heartbeat every third of it (default 3000, or --lease-ms if "
     "shorter)"},
    {"frontend-timeout-ms", LYNX_OPT_U32, O(frontend_timeout_ms), "3000", 500,
     600000, NULL, "a frontend silent for this long (it reports every "
     "200 ms) is cut off, and its instances go to the other frontends"},
    {"active-frontends", LYNX_OPT_U32, O(active_frontends), "1", 0, 1024, NULL,
     "how many frontends are active (0: every one): each service's "
     "instances are partitioned among them, one producer per mqueue; any "
     "other frontend is a standby (docs/frontends.md)"},
    {"drain-timeout-ms", LYNX_OPT_U32, O(drain_ms), "10000", 0, 3600000, NULL,
     "a drain stops the node's instances at the latest after this"},
    {"token-file", LYNX_OPT_STR, O(token_file), NULL, 0, 0, NULL,
     "cluster token; without one only loopback peers are accepted"},
    LYNX_OPT_TLS(O(tls_ca), O(tls_cert), O(tls_key),
                 "the cluster CA (PEM): control connections then need TLS "
                 "and a client certificate it signed (with --tls-cert and "
                 "--tls-key, which alone serve the API over HTTPS)"),
    LYNX_OPT_FRAME_MAX(O(frame_max)),
    {"control-conn-max", LYNX_OPT_U32, O(ctl_conn_max), "4096", 1, 1u << 20,
     NULL, "control connections (agents, frontends) open at once; more are "
     "closed at once"},
    {"control-unauth-max", LYNX_OPT_U32, O(ctl_unauth_max), "64", 1, 1u << 20,
     NULL, "of those, connections that have not said a valid Hello yet"},
    {"control-unauth-per-client", LYNX_OPT_U32, O(ctl_unauth_per_client), "8",
     1, 1u << 20, NULL, "of those, from one address"},
    {"body-max", LYNX_OPT_U32, O(body_max), "65536", 256, 1u << 24, NULL,
     "largest accepted API request body, bytes"},
    {"http-conn-max", LYNX_OPT_U32, O(http_conn_max), "4096", 1, 1u << 20,
     NULL, "API connections open at once; past it a new one takes the place "
     "of the oldest that has not completed its request (or of the oldest "
     "watch, answered early); refused only when all are being answered"},
    {"http-conn-per-client", LYNX_OPT_U32, O(http_conn_per_client), "1024", 1,
     1u << 20, NULL, "API connections one client address may hold open; past "
     "it the same as --http-conn-max, among that address's connections"},
    {"http-header-timeout-ms", LYNX_OPT_U32, O(http_header_ms), "10000", 100,
     600000, NULL, "a request's headers must be in within this of the "
     "connection's start or the previous answer"},
    {"http-body-timeout-ms", LYNX_OPT_U32, O(http_body_ms), "30000", 100,
     3600000, NULL, "a request's body must be in within this of its headers"},
    {"services-max", LYNX_OPT_U32, O(services_max), "256", 1, 100000, NULL,
     "services that may exist (each costs every frontend a thread); more are "
     "refused"},
    {"region-max-mb", LYNX_OPT_U32, O(region_max_mb), "1024", 1, 1048576,
     NULL, "largest region a service may ask of each accelerator, MiB"},
    LYNX_OPT_LOG_LEVEL(O(log_level), "info"),
    LYNX_OPT_END,
};
#undef O

enum action_kind { ACT_START, ACT_STOP, ACT_TABLES };

struct action {
  enum action_kind kind;
  char node[LYNX_ID_MAX];
  uint64_t instance_id;
  uint32_t accel;
  struct lynx_service_spec spec;
  struct action *next;
};

enum peer_role { ROLE_NONE, ROLE_AGENT, ROLE_FRONTEND };

struct cpeer {
  struct lynx_ctl ctl;
  struct coordinator *co;
  enum peer_role role;
  int registered;
  int admitted; /* counted by c.ctl_guard */
  int refused;  /* its certificate was refused: its messages are ignored */
  struct lynx_guard_src *src;
  char id[LYNX_ID_MAX];
  uint64_t connected_seq; /* frontends: the earliest connected are active */
  uint64_t table_sent;    /* last table version sent (+1; 0 = none) */
  uint64_t accepted_ms;
  uint64_t heard_ms; /* frontends: the last message (silence cuts them off) */
  int standby_sent;
  struct cpeer *next, **pprev;
};

struct coordinator {
  struct coord_cfg cfg;
  struct lynx_coord c;
  struct lynx_store_etcd store; /* --etcd: its client and prefix */
  struct lynx_elect elect;      /* --etcd: which coordinator leads */
  uv_async_t role;              /* the election changed our role */
  /* orders the election's role store before the loop's read of it
   * (elect_changed, on_role): a wake merged into one still pending must
   * not leave on_role reading the role from before the change */
  pthread_mutex_t role_lock;
  int role_ready, elect_failed;
  uv_loop_t loop;
  uv_tcp_t server;
  uv_timer_t tick;
  uv_async_t wake;
  uv_signal_t sigint, sigterm;
  struct cpeer *peers;
  struct action *actions, **actions_tail; /* under c.lock */
  uint64_t seen_version, fe_seq;
  int stopping;
  int unsure; /* a leader past its vouched lease (on_tick): logged once */
  /* --tls-*: the API is served over HTTPS (tls_on), and with --tls-ca
   * every control connection is TLS with a client certificate the CA
   * signed (tls.has_ca) */
  struct lynx_tls tls;
  int tls_on, tls_ctl;
};

#define HELLO_TIMEOUT_MS 10000 /* a peer that says nothing is closed */
#define TICK_MS 100 /* leases, drains, placement retries */

uint64_t lynx_coord_now_ms(void) { return lynx_now_ns() / 1000000u; }

void lynx_coord_changed(struct lynx_coord *c) {
  pthread_cond_broadcast(&c->changed);
}

/* ---- registry actions (called under the lock, on any thread) --------- */

static void queue_action(struct coordinator *co, struct action *a) {
  a->next = NULL;
  *co->actions_tail = a;
  co->actions_tail = &a->next;
  uv_async_send(&co->wake);
}

static void act_start(void *data, struct lynx_reg_node *node,
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

static void act_stop(void *data, struct lynx_reg_node *node,
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

static void act_tables(void *data) {
  struct coordinator *co = data;
  struct action *a = calloc(1, sizeof(*a));
  if (!a)
    return;
  a->kind = ACT_TABLES;
  queue_action(co, a);
}

/* ---- sending --------------------------------------------------------- */

static void send_env(struct cpeer *p, Lynx__Envelope *env) {
  if (lynx_ctl_send(&p->ctl, env))
    lynx_ctl_close(&p->ctl, "cannot queue a message");
}

/* pb->backends points into bk (LYNX_BACKENDS_MAX entries) and s. */
static void spec_to_pb(const struct lynx_service_spec *s,
                       Lynx__ServiceSpec *pb, Lynx__Backend *bk,
                       Lynx__Backend **bkp) {
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
static int issue_epoch(struct coordinator *co, int frontend, uint64_t *epoch,
                       char *err, size_t errlen) {
  if (co->cfg.etcd) /* issued ahead by the election thread: no waiting */
    return lynx_elect_take_epoch(&co->elect, &co->c.reg, frontend, epoch,
                                 err, errlen);
  return lynx_store_issue_epoch(co->cfg.state_dir, &co->c.reg, frontend,
                                epoch, err, errlen);
}

/* The registry gives instances to frontends (partition.c): a frontend
 * epoch for the round. Loop thread, lock held. */
static int act_issue_epoch(void *data, uint64_t *epoch) {
  struct coordinator *co = data;
  char err[256] = "";
  int rc = issue_epoch(co, 1, epoch, err, sizeof(err));
  if (rc && rc != -EAGAIN) /* -EAGAIN: one is on its way (elect.h) */
    LYNX_LOG_RL(LYNX_LOG_ERROR, "coordinator", "no frontend epoch could be "
                "issued: %s", err[0] ? err : strerror(-rc));
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
  } *c;
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
static int table_build(struct lynx_registry *r, const struct lynx_reg_frontend *f,
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
static void push_tables(struct coordinator *co) {
  struct lynx_registry *r = &co->c.reg;
  char **down = NULL;
  size_t n_down = 0;
  if (lynx_coord_now_ms() < co->c.reg.settle_until_ms)
    return; /* the tick pushes once the agents had their chance */
  /* a follower's tables are no one's: one that just stepped down (its
   * frontends not closed yet) would hand them what it no longer knows,
   * e.g. no node at all once it released them (registry.h) */
  if (!lynx_coord_leads(&co->c))
    return;
  choose_active(co);
  lynx_reg_partition(r, lynx_coord_now_ms());
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
      LYNX_ERR("coordinator", "out of memory building frontend %s's dispatch "
               "table; tried again at the next change", p->id);
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
    send_env(p, &env);
    p->table_sent = r->table_version + 1;
    p->standby_sent = standby;
    /* what it claimed at Hello is settled by this table: given back, or
     * (a standby, or given to another) to be fenced out; a claim kept
     * would be stale by the next failure */
    lynx_reg_frontend_claims_done(r, p->id);
    LYNX_INFO("coordinator", "table %llu -> frontend %s%s (%zu services, "
              "%zu instances)", (unsigned long long)t.version, p->id,
              standby ? " (standby)" : "", tb.n_svcs, tb.n_entries);
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
        LYNX_DBG("coordinator", "node %s not connected: %s of instance %llu "
                 "not sent", a->node, a->kind == ACT_START ? "start" : "stop",
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
        env.msg_case = LYNX__ENVELOPE__MSG_START_INSTANCE;
        env.start_instance = &s;
        send_env(p, &env);
      } else {
        Lynx__Envelope env = LYNX__ENVELOPE__INIT;
        Lynx__StopInstance s = LYNX__STOP_INSTANCE__INIT;
        s.instance_id = a->instance_id;
        env.msg_case = LYNX__ENVELOPE__MSG_STOP_INSTANCE;
        env.stop_instance = &s;
        send_env(p, &env);
      }
      break;
    case ACT_TABLES:
      tables = 1;
      break;
    }
    free(a);
  }
  if (tables)
    push_tables(co);
}

/* After any registry call on the loop thread (lock held). */
static void after_change(struct coordinator *co) {
  flush_actions(co);
  if (co->c.reg.version != co->seen_version) {
    co->seen_version = co->c.reg.version;
    lynx_coord_changed(&co->c);
  }
}

/* ---- control connections --------------------------------------------- */

static void peer_closed(struct lynx_ctl *ctl) {
  struct cpeer *p = container_of(ctl, struct cpeer, ctl);
  struct coordinator *co = p->co;
  *p->pprev = p->next;
  if (p->next)
    p->next->pprev = p->pprev;
  /* a failed handshake (no TLS, or our certificate not trusted there)
   * counts as a wrong credential does */
  if (p->admitted && p->ctl.tls_failed)
    lynx_guard_auth_failed(&co->c.ctl_guard, p->src, lynx_now_ns());
  if (p->admitted)
    lynx_guard_closed(&co->c.ctl_guard, p->src, p->role != ROLE_NONE);
  pthread_mutex_lock(&co->c.lock);
  if (p->role == ROLE_AGENT)
    lynx_reg_node_disconnected(&co->c.reg, p);
  else if (p->role == ROLE_FRONTEND) {
    lynx_reg_frontend_disconnected(&co->c.reg, p);
    co->c.reg.version++;
    push_tables(co); /* a standby may become the active frontend */
  }
  after_change(co);
  pthread_mutex_unlock(&co->c.lock);
  if (p->role != ROLE_NONE)
    LYNX_INFO("coordinator", "%s %s disconnected",
              p->role == ROLE_AGENT ? "agent" : "frontend", p->id);
  free(p);
}

/* Accepts a Hello, or refuses it and closes once the refusal is written;
 * hold_ms holds a refusal back (a source that keeps presenting a wrong
 * token: connguard.h). */
static void send_hello_reply_ex(struct cpeer *p, int ok, const char *error,
                                uint64_t hold_ms, int retryable,
                                int no_leader) {
  Lynx__Envelope env = LYNX__ENVELOPE__INIT;
  Lynx__HelloReply r = LYNX__HELLO_REPLY__INIT;
  r.proto_version = LYNX_PROTO_VERSION;
  r.ok = ok;
  r.retryable = retryable;
  r.no_leader = no_leader;
  r.acks_status = ok && p->role == ROLE_FRONTEND; /* FrontendStatusReply */
  r.error = (char *)(error ? error : "");
  r.id = "coordinator";
  env.msg_case = LYNX__ENVELOPE__MSG_HELLO_REPLY;
  env.hello_reply = &r;
  if (ok)
    send_env(p, &env);
  else if (lynx_ctl_refuse(&p->ctl, &env, hold_ms))
    lynx_ctl_close(&p->ctl, "cannot queue a refusal");
}

static void send_hello_reply(struct cpeer *p, int ok, const char *error,
                             uint64_t hold_ms) {
  send_hello_reply_ex(p, ok, error, hold_ms, 0, 0);
}

/* With etcd, whether this coordinator may answer agents and frontends now
 * (lynx_coord_leads): 1 if so; else 0 with why filled. A leader past its
 * vouched lease did not run, or etcd did not answer it, for a while:
 * another may lead by now, and whatever it answered (a heartbeat, a
 * registration, a table) could renew a lease or move the data plane on a
 * deposed leader's word (docs/etcd.md, "A paused leader"). */
static void unsure_why(struct coordinator *co, char *why, size_t len) {
  uint64_t until = __atomic_load_n(&co->c.lead_until_ns, __ATOMIC_ACQUIRE);
  uint64_t now = lynx_now_ns();
  snprintf(why, len, "this coordinator is not sure it still leads (its "
           "leader lease ran past what it can vouch for %llu ms ago: it did "
           "not run, or etcd did not answer): it answers nothing until etcd "
           "says", (unsigned long long)(until && now > until
                                            ? (now - until) / 1000000u
                                            : 0));
}

static int may_answer(struct coordinator *co, char *why, size_t len) {
  if (lynx_coord_leads(&co->c))
    return 1;
  if (!__atomic_load_n(&co->c.leader, __ATOMIC_ACQUIRE)) {
    snprintf(why, len, "this coordinator does not lead");
    return 0;
  }
  unsure_why(co, why, len);
  __atomic_add_fetch(&co->c.unsure_refusals, 1, __ATOMIC_RELAXED);
  return 0;
}

static void on_hello(struct cpeer *p, const Lynx__Hello *h) {
  struct coordinator *co = p->co;
  struct lynx_fe_claim *claims;
  char err[400];
  const char *role = h->role ? h->role : "";
  /* with TLS the certificate was checked (peer_tls_ready); the token is
   * required too when one is configured (it travels encrypted then) */
  if (lynx_hello_check(h, co->c.token, err, sizeof(err))) {
    uint64_t hold = lynx_guard_auth_failed(&co->c.ctl_guard, p->src,
                                           lynx_now_ns());
    LYNX_LOG_RL(LYNX_LOG_WARN, "coordinator", "refusing %s (%s %s): %s%s",
                p->ctl.peer, role, h->id ? h->id : "?", err,
                hold ? " (answer held back: this address keeps presenting "
                       "wrong credentials)" : "");
    send_hello_reply(p, 0, err, hold / 1000000u);
    return;
  }
  if (!h->id || !*h->id || strlen(h->id) >= LYNX_ID_MAX) {
    LYNX_WARN("coordinator", "refusing %s (%s): hello without a valid id "
              "(1 to %d characters)", p->ctl.peer, role, LYNX_ID_MAX - 1);
    send_hello_reply(p, 0, "hello without a valid id", 0);
    return;
  }
  snprintf(p->id, sizeof(p->id), "%s", h->id);
  if (co->c.ha && __atomic_load_n(&co->c.leader, __ATOMIC_ACQUIRE) &&
      !may_answer(co, err, sizeof(err))) {
    /* retryable, not no_leader: an agent renews nothing on it */
    LYNX_LOG_RL(LYNX_LOG_WARN, "coordinator", "refusing %s (%s %s): %s",
                p->ctl.peer, role, p->id, err);
    send_hello_reply_ex(p, 0, err, 0, 1, 0);
    return;
  }
  if (co->c.ha && !__atomic_load_n(&co->c.leader, __ATOMIC_ACQUIRE)) {
    /* agents and frontends find the leader among their --coordinator
     * addresses: this refusal sends them to the next */
    char api[sizeof(co->c.leader_api)];
    char why[sizeof(co->c.no_leader_why)];
    int none;
    pthread_mutex_lock(&co->c.lock);
    snprintf(api, sizeof(api), "%s", co->c.leader_api);
    none = co->c.no_leader;
    snprintf(why, sizeof(why), "%s", co->c.no_leader_why);
    pthread_mutex_unlock(&co->c.lock);
    if (none) /* agents keep their lease on this (docs/etcd.md) */
      snprintf(err, sizeof(err), "this coordinator does not lead: %s", why);
    else
      snprintf(err, sizeof(err), "this coordinator does not lead (the "
               "leader's API: %s)", api[0] ? api : "none elected yet");
    send_hello_reply_ex(p, 0, err, 0, 1, none);
    return;
  }
  if (strcmp(role, "agent") == 0 || strcmp(role, "frontend") == 0) {
    lynx_guard_auth_ok(&co->c.ctl_guard, p->src);
    lynx_ctl_trust(&p->ctl);
  }
  if (strcmp(role, "agent") == 0) {
    p->role = ROLE_AGENT;
    send_hello_reply(p, 1, NULL, 0);
  } else if (strcmp(role, "frontend") == 0) {
    p->role = ROLE_FRONTEND;
    p->connected_seq = ++co->fe_seq;
    p->heard_ms = lynx_coord_now_ms();
    claims = lynx_ctl_claims(h);
    send_hello_reply(p, 1, NULL, 0);
    pthread_mutex_lock(&co->c.lock);
    lynx_reg_frontend_connect(&co->c.reg, p->id, p->ctl.peer, p,
                              lynx_coord_now_ms());
    /* without its claims it is given what it produced into with a new
     * epoch: its connections are made again (in-flight answers in doubt) */
    if (!claims || lynx_reg_frontend_claims(&co->c.reg, p->id, claims,
                                            (uint32_t)h->n_produces))
      LYNX_WARN("coordinator", "frontend %s: out of memory keeping the "
                "%zu instances it produces into", p->id, h->n_produces);
    free(claims);
    co->c.reg.version++;
    push_tables(co);
    after_change(co);
    pthread_mutex_unlock(&co->c.lock);
    LYNX_INFO("coordinator", "frontend %s connected from %s", p->id,
              p->ctl.peer);
  } else {
    snprintf(err, sizeof(err), "unknown role '%s' (agent or frontend)", role);
    LYNX_WARN("coordinator", "refusing %s (%s): %s", p->ctl.peer, p->id, err);
    send_hello_reply(p, 0, err, 0);
  }
}

/* The handshake is done: a client without a certificate the cluster CA
 * signed is refused now, before its Hello, counted and held back as a
 * wrong token is, with an answer that says why (it reads it: it trusted
 * our certificate). */
static void peer_tls_ready(struct lynx_ctl *ctl) {
  struct cpeer *p = container_of(ctl, struct cpeer, ctl);
  char err[320];
  uint64_t hold;
  if (!lynx_tls_peer_check(ctl->tls, err, sizeof(err)))
    return;
  hold = p->admitted ? lynx_guard_auth_failed(&p->co->c.ctl_guard, p->src,
                                              lynx_now_ns())
                     : 0;
  LYNX_LOG_RL(LYNX_LOG_WARN, "coordinator", "refusing %s: %s%s", ctl->peer,
              err, hold ? " (answer held back: this address keeps "
                          "presenting wrong credentials)" : "");
  p->refused = 1;
  send_hello_reply(p, 0, err, hold / 1000000u);
}

/* A peer that speaks plain text to our TLS port (its Hello where a TLS
 * handshake belongs): told so in plain text, which it can read, and
 * counted as a wrong credential. */
static void peer_not_tls(struct lynx_ctl *ctl) {
  struct cpeer *p = container_of(ctl, struct cpeer, ctl);
  static const char why[] = "this coordinator speaks TLS only: give the "
                            "agent or frontend --tls-ca, --tls-cert and "
                            "--tls-key (docs/tls.md)";
  uint64_t hold = p->admitted ? lynx_guard_auth_failed(&p->co->c.ctl_guard,
                                                       p->src, lynx_now_ns())
                              : 0;
  LYNX_LOG_RL(LYNX_LOG_WARN, "coordinator", "refusing %s: plain text, not "
              "TLS", ctl->peer);
  p->refused = 1;
  send_hello_reply(p, 0, why, hold / 1000000u);
}

static void on_register(struct cpeer *p, const Lynx__Register *m) {
  struct coordinator *co = p->co;
  struct lynx_label labels[LYNX_LABELS_MAX];
  struct lynx_accel_info accels[LYNX_ACCELS_MAX];
  struct lynx_reg_err err = {0};
  Lynx__Envelope env = LYNX__ENVELOPE__INIT;
  Lynx__RegisterReply rr = LYNX__REGISTER_REPLY__INIT;
  uint64_t now = lynx_coord_now_ms();
  struct lynx_reg_adopt *adopt = NULL;
  uint32_t n_adopt = 0;
  uint64_t epoch = 0;
  int rc;
  if (!m->node_id || strcmp(m->node_id, p->id) != 0) {
    snprintf(err.message, sizeof(err.message),
             "registers node '%s' but said hello as '%s'",
             m->node_id ? m->node_id : "", p->id);
    rc = -EINVAL;
    goto reply;
  }
  rc = lynx_ctl_register(m, labels, accels, &adopt, &n_adopt, err.message,
                         sizeof(err.message));
  if (rc)
    goto reply;
  pthread_mutex_lock(&co->c.lock);
  epoch = m->epoch;
  /* a new incarnation: its epoch comes from the store, not its clock */
  if (!epoch &&
      (rc = issue_epoch(co, 0, &epoch, err.message, sizeof(err.message)))) {
    pthread_mutex_unlock(&co->c.lock);
    goto reply;
  }
  rc = lynx_reg_register_adopt(&co->c.reg, m->node_id,
                               m->address ? m->address : "", epoch, labels,
                               (uint32_t)m->n_labels, accels,
                               (uint32_t)m->n_accels, adopt, n_adopt, p, now,
                               &err);
  pthread_mutex_unlock(&co->c.lock);
reply:
  rr.ok = rc == 0;
  rr.error = err.message;
  rr.lease_ms = co->cfg.suspect_ms; /* heartbeats every third of it */
  rr.fence_ms = co->cfg.lease_ms;
  rr.new_incarnation = err.new_incarnation != 0;
  rr.acks_heartbeats = 1;
  rr.drains_on_leave = 1;
  rr.epoch = rc ? 0 : epoch;
  env.msg_case = LYNX__ENVELOPE__MSG_REGISTER_REPLY;
  env.register_reply = &rr;
  send_env(p, &env);
  free(adopt);
  if (rc) {
    LYNX_WARN("coordinator", "refused registration of %s from %s: %s",
              m->node_id ? m->node_id : "?", p->ctl.peer, err.message);
    p->ctl.close_after_write = 1;
    return;
  }
  p->registered = 1;
  LYNX_INFO("coordinator", "node %s registered from %s: epoch %llu%s, %zu "
            "accelerators, %zu running instances", p->id, p->ctl.peer,
            (unsigned long long)epoch, m->epoch ? "" : " (issued)",
            m->n_accels, m->n_instances);
  pthread_mutex_lock(&co->c.lock);
  after_change(co);
  pthread_mutex_unlock(&co->c.lock);
}

/* Renews the agent's own view of its lease: it keeps taking requests only
 * while heartbeats are answered (docs/design.md, "Delivery guarantees"). */
static void send_heartbeat_reply(struct cpeer *p, uint64_t epoch) {
  Lynx__Envelope env = LYNX__ENVELOPE__INIT;
  Lynx__HeartbeatReply r = LYNX__HEARTBEAT_REPLY__INIT;
  r.epoch = epoch;
  env.msg_case = LYNX__ENVELOPE__MSG_HEARTBEAT_REPLY;
  env.heartbeat_reply = &r;
  send_env(p, &env);
}

static void on_agent_msg(struct cpeer *p, Lynx__Envelope *env) {
  struct coordinator *co = p->co;
  uint64_t now = lynx_coord_now_ms(), ack_epoch = 0;
  char why[200];
  int rc = 0;
  pthread_mutex_lock(&co->c.lock);
  switch (env->msg_case) {
  case LYNX__ENVELOPE__MSG_HEARTBEAT: {
    const Lynx__Heartbeat *hb = env->heartbeat;
    struct lynx_accel_report rep[LYNX_ACCELS_MAX];
    uint32_t n = lynx_ctl_heartbeat(hb, rep);
    rc = lynx_reg_heartbeat(&co->c.reg, p->id, hb->epoch, rep, n, now);
    ack_epoch = rc == 0 ? hb->epoch : 0;
    break;
  }
  case LYNX__ENVELOPE__MSG_INSTANCE_READY: {
    const Lynx__InstanceReady *ir = env->instance_ready;
    struct lynx_region_desc d;
    if (!ir->region || lynx_desc_from_pb(ir->region, &d, why, sizeof(why))) {
      LYNX_WARN("coordinator", "node %s: instance %llu reported with a bad "
                "region: %s", p->id, (unsigned long long)ir->instance_id,
                ir->region ? why : "none");
      rc = lynx_reg_instance_failed(&co->c.reg, p->id, ir->epoch,
                                    ir->instance_id, "bad region", now);
    } else {
      rc = lynx_reg_instance_ready(&co->c.reg, p->id, ir->epoch,
                                   ir->instance_id, &d, now);
    }
    break;
  }
  case LYNX__ENVELOPE__MSG_INSTANCE_FAILED: {
    const Lynx__InstanceFailed *f = env->instance_failed;
    LYNX_LOG_RL(LYNX_LOG_WARN, "coordinator",
                "node %s: instance %llu failed: %s (retried with backoff)",
                p->id, (unsigned long long)f->instance_id,
                f->error ? f->error : "");
    rc = lynx_reg_instance_failed(&co->c.reg, p->id, f->epoch, f->instance_id,
                                  f->error ? f->error : "", now);
    break;
  }
  case LYNX__ENVELOPE__MSG_LEAVE:
    if (env->leave->drain) {
      rc = lynx_reg_leave_drain(&co->c.reg, p->id, env->leave->epoch, now);
      if (rc == 0)
        LYNX_INFO("coordinator", "node %s drains to leave: its agent is "
                  "stopping", p->id);
      break;
    }
    rc = lynx_reg_leave(&co->c.reg, p->id, env->leave->epoch, now);
    if (rc == 0)
      LYNX_INFO("coordinator", "node %s left", p->id);
    break;
  default:
    rc = -EPROTO;
    break;
  }
  after_change(co);
  pthread_mutex_unlock(&co->c.lock);
  if (ack_epoch)
    send_heartbeat_reply(p, ack_epoch);
  if (rc == -EPROTO) {
    snprintf(why, sizeof(why), "unexpected message (case %d) from an agent",
             (int)env->msg_case);
    lynx_ctl_close(&p->ctl, why);
  } else if (rc == -ESTALE || rc == -ENOTCONN || rc == -ENOENT) {
    /* an old epoch, or a node the registry declared down: it must register
     * again, on a new connection */
    snprintf(why, sizeof(why), "%s",
             rc == -ESTALE ? "message carries an old epoch"
                           : "node is not registered (lease expired?)");
    lynx_ctl_close(&p->ctl, why);
  }
}

static void on_frontend_msg(struct cpeer *p, Lynx__Envelope *env) {
  struct coordinator *co = p->co;
  const Lynx__FrontendStatus *st;
  struct lynx_fe_mq_report *mq;
  struct lynx_fe_listen *fl;
  uint32_t nl;
  char why[160];
  p->heard_ms = lynx_coord_now_ms();
  if (env->msg_case != LYNX__ENVELOPE__MSG_FRONTEND_STATUS) {
    snprintf(why, sizeof(why), "unexpected message (case %d) from a frontend",
             (int)env->msg_case);
    lynx_ctl_close(&p->ctl, why);
    return;
  }
  st = env->frontend_status;
  mq = lynx_ctl_fe_mqueues(st);
  if (!mq)
    return;
  fl = lynx_ctl_fe_listens(st, &nl);
  pthread_mutex_lock(&co->c.lock);
  lynx_reg_frontend_status(&co->c.reg, p->id, st->table_version, mq,
                           (uint32_t)st->n_mqueues, lynx_coord_now_ms());
  if (fl)
    lynx_reg_frontend_listen(&co->c.reg, p->id, fl, nl);
  after_change(co);
  pthread_mutex_unlock(&co->c.lock);
  free(fl);
  free(mq);
  {
    /* heard: a frontend that hears nothing turns to another coordinator */
    Lynx__Envelope e = LYNX__ENVELOPE__INIT;
    Lynx__FrontendStatusReply r = LYNX__FRONTEND_STATUS_REPLY__INIT;
    r.table_version = p->table_sent ? p->table_sent - 1 : 0;
    e.msg_case = LYNX__ENVELOPE__MSG_FRONTEND_STATUS_REPLY;
    e.frontend_status_reply = &r;
    send_env(p, &e);
  }
}

static void peer_msg(struct lynx_ctl *ctl, Lynx__Envelope *env) {
  struct cpeer *p = container_of(ctl, struct cpeer, ctl);
  char why[320];
  if (p->refused)
    return; /* its refusal is on its way */
  if (p->role != ROLE_NONE && !may_answer(p->co, why, sizeof(why))) {
    /* not a word on a lead it cannot vouch for: the peer finds the
     * leader (or this one again, once etcd has said) */
    lynx_ctl_close(ctl, why);
    return;
  }
  if (p->role == ROLE_NONE) {
    if (env->msg_case != LYNX__ENVELOPE__MSG_HELLO) {
      lynx_ctl_close(ctl, "first message is not a Hello");
      return;
    }
    on_hello(p, env->hello);
    return;
  }
  if (p->role == ROLE_AGENT && !p->registered) {
    if (env->msg_case != LYNX__ENVELOPE__MSG_REGISTER) {
      snprintf(why, sizeof(why), "agent sent message case %d before Register",
               (int)env->msg_case);
      lynx_ctl_close(ctl, why);
      return;
    }
    on_register(p, env->register_);
    return;
  }
  if (p->role == ROLE_AGENT)
    on_agent_msg(p, env);
  else
    on_frontend_msg(p, env);
}

static int is_loopback(const struct sockaddr_storage *ss) {
  if (ss->ss_family == AF_INET)
    return (ntohl(((const struct sockaddr_in *)ss)->sin_addr.s_addr) >> 24) ==
           127;
  if (ss->ss_family == AF_INET6) {
    const struct in6_addr *a = &((const struct sockaddr_in6 *)ss)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a) ||
           (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
  }
  return 0;
}

static void on_connection(uv_stream_t *server, int status) {
  struct coordinator *co = server->data;
  struct cpeer *p;
  struct sockaddr_storage ss;
  int len = sizeof(ss);
  if (status < 0) {
    LYNX_WARN("coordinator", "accept failed: %s", uv_strerror(status));
    return;
  }
  p = calloc(1, sizeof(*p));
  if (!p)
    return;
  p->co = co;
  p->accepted_ms = lynx_coord_now_ms();
  uv_tcp_init(&co->loop, &p->ctl.tcp);
  lynx_ctl_init(&p->ctl, "coordinator", co->cfg.frame_max, peer_msg,
                peer_closed);
  p->next = co->peers;
  if (p->next)
    p->next->pprev = &p->next;
  p->pprev = &co->peers;
  co->peers = p;
  if (uv_accept(server, (uv_stream_t *)&p->ctl.tcp)) {
    lynx_ctl_close(&p->ctl, "accept failed");
    return;
  }
  if (co->tls_ctl) {
    char err[256];
    if (lynx_ctl_tls(&p->ctl, &co->tls, NULL, peer_tls_ready, err,
                     sizeof(err))) {
      lynx_ctl_close(&p->ctl, err);
      return;
    }
    p->ctl.on_not_tls = peer_not_tls;
  }
  if (lynx_ctl_start(&p->ctl)) {
    lynx_ctl_close(&p->ctl, "accept failed");
    return;
  }
  memset(&ss, 0, sizeof(ss));
  uv_tcp_getpeername(&p->ctl.tcp, (struct sockaddr *)&ss, &len);
  {
    enum lynx_guard_refusal r =
        lynx_guard_admit(&co->c.ctl_guard, &ss, lynx_now_ns(), &p->src);
    if (r != LYNX_GUARD_ADMIT) {
      char why[160];
      snprintf(why, sizeof(why), "refused: %s (caps: %u connections, %u "
               "before Hello, %u of those per address)",
               lynx_guard_reason_names[r], co->c.ctl_guard.conn_max,
               co->c.ctl_guard.unauth_max, co->c.ctl_guard.per_source);
      lynx_ctl_close(&p->ctl, why); /* rate-limited: not trusted */
      return;
    }
    p->admitted = 1;
  }
  len = sizeof(ss);
  if (!co->c.token && !co->tls_ctl &&
      (uv_tcp_getpeername(&p->ctl.tcp, (struct sockaddr *)&ss, &len) ||
       !is_loopback(&ss)))
    lynx_ctl_close(&p->ctl, "no cluster token is configured, so only "
                            "loopback peers are accepted");
}

/* ---- leases ---------------------------------------------------------- */

/* The shortest agents' lease that rides out a leader failover on etcd
 * (docs/etcd.md, "Failover without loss"): the last heartbeat answered
 * before the leader died or stopped may be a heartbeat period old, and
 * another period passes before an agent gives a silent leader up; the dead
 * leader's key lives for the election lease; then etcd's 500 ms expiry
 * tick, the campaign, an agent's round of addresses (a stopped leader
 * holds a Hello 1 s, the backoff up to 0.5 s twice) and the fence's margin
 * (up to 1 s) take 3 s, and half a second to spare makes 3.5 s. */
static uint32_t failover_lease_ms(uint32_t suspect_ms, uint32_t etcd_lease_s) {
  return 2 * (suspect_ms / 3) + etcd_lease_s * 1000u + 3500u;
}

/* --lease-ms and --suspect-ms as given, or derived when not: coherent by
 * construction, and an incoherent pair given explicitly refused. 0 or -1
 * with the reason in err. */
static int leases_derive(struct coord_cfg *cfg, char *err, size_t errlen) {
  uint32_t need;
  if (!cfg->suspect_ms)
    cfg->suspect_ms = cfg->lease_ms && cfg->lease_ms < 3000 ? cfg->lease_ms
                                                            : 3000;
  need = cfg->etcd ? failover_lease_ms(cfg->suspect_ms, cfg->etcd_lease_s)
                   : cfg->suspect_ms;
  if (!cfg->lease_ms) {
    cfg->lease_ms = need > 3000 ? need : 3000;
    return 0;
  }
  if (cfg->suspect_ms > cfg->lease_ms) {
    snprintf(err, errlen, "--suspect-ms %u is longer than --lease-ms %u: a "
             "silent node would be declared down (its requests counted "
             "lost) before it left the dispatch tables; give --suspect-ms "
             "%u or less", cfg->suspect_ms, cfg->lease_ms, cfg->lease_ms);
    return -1;
  }
  if (cfg->lease_ms < need) {
    snprintf(err, errlen, "--lease-ms %u cannot ride out a leader failover "
             "with --etcd-lease-s %u and --suspect-ms %u: the agents would "
             "stop taking requests while another coordinator takes over "
             "(up to about %u ms: two heartbeat periods, the election lease "
             "and 3.5 s; docs/etcd.md, \"Failover without loss\"); give "
             "--lease-ms %u or more, or leave it out (derived)",
             cfg->lease_ms, cfg->etcd_lease_s, cfg->suspect_ms, need, need);
    return -1;
  }
  return 0;
}

/* ---- loop ------------------------------------------------------------ */

/* After a restart, or on becoming the leader, with services to serve: the
 * agents are finding us (their reconnect backoff is at most 2 s plus
 * jitter) and their instances are adopted as they register. Tables wait,
 * and no drain finishes, until every instance the frontends serve is
 * adopted again (frontends_settled) or a heartbeat lease (--suspect-ms, 3 s
 * at least) and a second have passed: a node not back by then is
 * suspect, out of the tables, as one that went silent. */
static void settle(struct coordinator *co) {
  co->c.reg.settle_until_ms =
      lynx_coord_now_ms() +
      (co->cfg.suspect_ms > 3000 ? co->cfg.suspect_ms : 3000) + 1000;
}

/* 1 when every instance a connected frontend reports serving is known
 * again (its agent re-registered and it was adopted), and at least one
 * frontend has reported. */
static int frontends_settled(struct coordinator *co) {
  struct lynx_registry *r = &co->c.reg;
  int reported = 0;
  for (const struct lynx_reg_frontend *f = r->frontends; f; f = f->next) {
    if (!f->connected)
      continue;
    if (f->table_version_applied || f->n_mqs)
      reported = 1;
    for (uint32_t i = 0; i < f->n_mqs; i++) {
      int known = 0;
      for (const struct lynx_reg_instance *in = r->instances; in && !known;
           in = in->next)
        known = in->id == f->mqs[i].instance_id &&
                in->state == LYNX_INST_READY;
      if (!known)
        return 0;
    }
  }
  return reported;
}

static void on_tick(uv_timer_t *t) {
  struct coordinator *co = t->data;
  uint64_t now = lynx_coord_now_ms();
  uint64_t expiries;
  int cut = 0;
  if (__atomic_load_n(&co->c.leader, __ATOMIC_ACQUIRE) &&
      !lynx_coord_leads(&co->c)) {
    /* not sure it still leads: it decides nothing (no lease expires, no
     * frontend is cut off, no table goes out) until etcd says; the tick
     * after credits the time to every lease, as a pause */
    if (!co->unsure) {
      char why[320];
      unsure_why(co, why, sizeof(why));
      LYNX_WARN("coordinator", "%s", why);
    }
    co->unsure = 1;
    return;
  }
  if (co->unsure && __atomic_load_n(&co->c.leader, __ATOMIC_ACQUIRE))
    LYNX_INFO("coordinator", "etcd vouches for this coordinator's lead "
              "again: it answers agents and frontends");
  co->unsure = 0;
  pthread_mutex_lock(&co->c.lock);
  expiries = co->c.reg.lease_expiries;
  lynx_reg_tick(&co->c.reg, now);
  if (co->c.reg.last_pause_ms)
    for (struct cpeer *p = co->peers; p; p = p->next)
      p->heard_ms = now; /* as leases: we could not hear them meanwhile */
  if (co->c.reg.last_pause_ms)
    LYNX_WARN("coordinator", "did not run for %llu ms (stopped or starved of "
              "CPU): every lease is extended by that much, as no heartbeat "
              "could be heard meanwhile",
              (unsigned long long)co->c.reg.last_pause_ms);
  if (co->c.reg.lease_expiries != expiries) /* rare: worth a scan */
    for (struct lynx_reg_node *n = co->c.reg.nodes; n; n = n->next)
      if (n->state == LYNX_NODE_DOWN && n->expired_ms == now)
        LYNX_WARN("coordinator", "node %s is down: no heartbeat for its "
                  "lease; its instances leave the dispatch tables", n->id);
  for (struct cpeer *p = co->peers; p; p = p->next)
    if ((p->role == ROLE_NONE || (p->role == ROLE_AGENT && !p->registered)) &&
        now - p->accepted_ms > HELLO_TIMEOUT_MS)
      lynx_ctl_close(&p->ctl, "no Hello/Register within 10 s");
    else if (p->role == ROLE_FRONTEND && !p->ctl.closing &&
             now - p->heard_ms > co->cfg.frontend_timeout_ms) {
      /* cut off (its host, or the network between): a standby takes over
       * with a newer epoch, which fences this one at the agents */
      char why[96];
      snprintf(why, sizeof(why), "silent for %llu ms (--frontend-timeout-ms)",
               (unsigned long long)(now - p->heard_ms));
      lynx_ctl_close(&p->ctl, why);
      cut = 1;
    }
  if (cut && !co->c.reg.settle_until_ms)
    push_tables(co); /* its instances go to the other frontends now */
  if (co->c.reg.settle_until_ms &&
      (now >= co->c.reg.settle_until_ms || frontends_settled(co))) {
    LYNX_INFO("coordinator", "settled after the restart: pushing tables");
    co->c.reg.settle_until_ms = 0;
    push_tables(co);
  }
  after_change(co);
  pthread_mutex_unlock(&co->c.lock);
}

static void on_wake(uv_async_t *a) {
  struct coordinator *co = a->data;
  pthread_mutex_lock(&co->c.lock);
  after_change(co);
  pthread_mutex_unlock(&co->c.lock);
}

/* The election thread says our role changed (elect.h). */
static void elect_changed(void *arg) {
  struct coordinator *co = arg;
  /* uv_async_send reads its pending flag with a plain load that nothing
   * orders after the role's store: had it seen the flag of a wake the
   * loop was clearing, on_role could read the old role and no second
   * callback would come. Through role_lock, either the loop takes it
   * after us (and reads the new role) or we take it after the loop
   * cleared the flag (and our send wakes it again). */
  pthread_mutex_lock(&co->role_lock);
  pthread_mutex_unlock(&co->role_lock);
  uv_async_send(&co->role);
}

static void on_role(uv_async_t *a) {
  struct coordinator *co = a->data;
  if (co->stopping)
    return;
  pthread_mutex_lock(&co->role_lock); /* see elect_changed */
  pthread_mutex_unlock(&co->role_lock);
  if (__atomic_load_n(&co->c.leader, __ATOMIC_ACQUIRE)) {
    /* as after a restart: the agents are finding us (the reloaded
     * services' instances are adopted as they register) */
    pthread_mutex_lock(&co->c.lock);
    if (co->c.reg.services)
      settle(co);
    after_change(co);
    pthread_mutex_unlock(&co->c.lock);
    return;
  }
  /* not leading: agents and frontends go and find the leader */
  for (struct cpeer *p = co->peers; p; p = p->next)
    lynx_ctl_close(&p->ctl, "this coordinator no longer leads");
  /* a follower follows no node's lease (registry.h): were it to keep
   * them, it would declare them down on its own and, leading again,
   * refuse their epochs and make them discard their instances */
  pthread_mutex_lock(&co->c.lock);
  if (!__atomic_load_n(&co->c.leader, __ATOMIC_ACQUIRE) &&
      lynx_reg_nodes_release(&co->c.reg))
    after_change(co);
  pthread_mutex_unlock(&co->c.lock);
}

/* Every connection the caps admit needs a descriptor: the soft
 * RLIMIT_NOFILE is raised to what the control and API caps (and the
 * API's room for shed connections, httpconn.h) take, plus
 * DESCRIPTORS_SPARE for the store, logs and listeners. Where the hard
 * limit allows less, the API's cap is lowered to its share of what there
 * is, with a warning, so that it sheds before accept() runs out. */
#define DESCRIPTORS_SPARE 256u
static void fit_descriptors(struct coord_cfg *cfg) {
  unsigned long api = lynx_hc_limit_for(cfg->http_conn_max);
  unsigned long need = cfg->ctl_conn_max + api + DESCRIPTORS_SPARE;
  unsigned long have = lynx_raise_nofile(need), share;
  if (have >= need)
    return;
  share = have > DESCRIPTORS_SPARE * 2
              ? (have - DESCRIPTORS_SPARE) * cfg->http_conn_max /
                    (cfg->ctl_conn_max + cfg->http_conn_max)
              : 64;
  share = share * 4 / 5; /* its room for shed ones comes on top */
  if (share < 16)
    share = 16;
  if (share >= cfg->http_conn_max)
    return;
  LYNX_WARN("coordinator",
            "RLIMIT_NOFILE allows %lu descriptors, and --control-conn-max "
            "%u with --http-conn-max %u take %lu: the API holds at most %lu "
            "connections (raise the limit: LimitNOFILE= in the unit, ulimit "
            "-n)",
            have, cfg->ctl_conn_max, cfg->http_conn_max, need, share);
  cfg->http_conn_max = (uint32_t)share;
  if (cfg->http_conn_per_client > cfg->http_conn_max)
    cfg->http_conn_per_client = cfg->http_conn_max;
}

static void on_signal(uv_signal_t *s, int signum) {
  struct coordinator *co = s->data;
  if (co->stopping)
    return;
  co->stopping = 1;
  LYNX_INFO("coordinator", "%s, shutting down", strsignal(signum));
  lynx_notify_stopping("%s, shutting down", strsignal(signum));
  /* a leader hands over now (its lease revoked) rather than at its TTL;
   * the thread is gone before the handle it wakes */
  lynx_elect_stop(&co->elect);
  if (co->role_ready)
    uv_close((uv_handle_t *)&co->role, NULL);
  for (struct cpeer *p = co->peers; p; p = p->next)
    lynx_ctl_close(&p->ctl, NULL);
  uv_close((uv_handle_t *)&co->server, NULL);
  uv_close((uv_handle_t *)&co->tick, NULL);
  uv_close((uv_handle_t *)&co->wake, NULL);
  uv_close((uv_handle_t *)&co->sigint, NULL);
  uv_close((uv_handle_t *)&co->sigterm, NULL);
}

int main(int argc, char **argv) {
  int help = 0; /* --help was printed */
  static struct coordinator co;
  struct lynx_reg_ops ops = {act_start, act_stop, act_tables, act_issue_epoch,
                             &co};
  struct sockaddr_storage ss;
  char err[512], *token = NULL;
  int rc, lvl, exit_code = 1;

  rc = lynx_opts_parse_conf(coord_opts, &co.cfg, argc, argv,
                            "usage: lynx-coordinator [options]\n"
                            "Registry, placement, leases and dispatch "
                            "tables of a Lynx cluster, with a JSON API.",
                            &help);
  if (rc || help)
    return rc ? lynx_opts_exit_code(rc) : 0;
  signal(SIGPIPE, SIG_IGN);
  lvl = lynx_log_parse_level(co.cfg.log_level);
  if (lvl < 0) {
    fprintf(stderr, "--log-level: unknown level '%s'\n", co.cfg.log_level);
    exit_code = LYNX_EXIT_USAGE;
    goto out_opts;
  }
  lynx_log_level = lvl;
  if (leases_derive(&co.cfg, err, sizeof(err))) {
    fprintf(stderr, "%s\n", err);
    exit_code = LYNX_EXIT_USAGE;
    goto out_opts;
  }
  if (co.cfg.http_conn_per_client > co.cfg.http_conn_max) {
    fprintf(stderr,
            "--http-conn-per-client %u is more than --http-conn-max %u: one "
            "address could never hold that many\n",
            co.cfg.http_conn_per_client, co.cfg.http_conn_max);
    exit_code = LYNX_EXIT_USAGE;
    goto out_opts;
  }
  fit_descriptors(&co.cfg);
  lynx_parse_hostport(co.cfg.listen, &ss); /* checked by the option table */
  if (co.cfg.token_file &&
      lynx_read_token(co.cfg.token_file, &token, err, sizeof(err))) {
    fprintf(stderr, "%s\n", err);
    goto out_opts;
  }
  {
    struct lynx_tls_files tf = {co.cfg.tls_ca, co.cfg.tls_cert,
                                co.cfg.tls_key};
    rc = lynx_tls_load(&co.tls, 1, &tf, err, sizeof(err));
    if (rc < 0) { /* refused at start only: a running one keeps its keys */
      fprintf(stderr, "%s\n", err);
      exit_code = LYNX_EXIT_USAGE;
      goto out_opts;
    }
    co.tls_on = rc == 0;
    co.tls_ctl = co.tls_on && co.tls.has_ca;
  }
  if (co.cfg.etcd) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    if (lynx_etcd_open(&co.store.etcd, co.cfg.etcd, co.cfg.etcd_timeout_ms,
                       err, sizeof(err)) ||
        lynx_store_etcd_init(&co.store, co.store.etcd, co.cfg.etcd_prefix,
                             err, sizeof(err))) {
      fprintf(stderr, "--etcd: %s\n", err);
      exit_code = LYNX_EXIT_USAGE;
      goto out_opts;
    }
    co.c.save = lynx_store_etcd_save_state;
    co.c.save_arg = &co.store;
    co.c.save_where = "etcd";
  } else if (mkdir(co.cfg.state_dir, 0700) != 0 && errno != EEXIST) {
    fprintf(stderr, "--state-dir %s: %s\n", co.cfg.state_dir, strerror(errno));
    goto out_opts;
  }
  if (!co.cfg.etcd) {
    struct stat st;
    if (stat(co.cfg.state_dir, &st) != 0) {
      fprintf(stderr, "--state-dir %s: %s\n", co.cfg.state_dir,
              strerror(errno));
      goto out_opts;
    }
    if (!S_ISDIR(st.st_mode)) {
      fprintf(stderr, "--state-dir %s: not a directory\n", co.cfg.state_dir);
      goto out_opts;
    }
    /* it holds the services and drain intents operators set */
    if (st.st_mode & 0077)
      LYNX_WARN("coordinator", "--state-dir %s can be %s by %s (mode %04o): "
                "the cluster's services are kept there; chmod 700 %s",
                co.cfg.state_dir, (st.st_mode & 0022) ? "changed" : "read",
                (st.st_mode & 0007) ? "every user" : "its group",
                (unsigned)(st.st_mode & 07777), co.cfg.state_dir);
  }
  pthread_mutex_init(&co.c.lock, NULL);
  pthread_mutex_init(&co.role_lock, NULL);
  pthread_mutex_init(&co.c.change_lock, NULL);
  pthread_cond_init(&co.c.changed, NULL);
  co.c.state_dir = co.cfg.etcd ? NULL : co.cfg.state_dir;
  co.c.token = token;
  if (co.tls_on) {
    co.c.tls_cert_pem = co.tls.cert_pem;
    co.c.tls_key_pem = co.tls.key_pem;
  }
  co.c.body_max = co.cfg.body_max;
  co.c.http_conn_max = co.cfg.http_conn_max;
  co.c.http_conn_per_client = co.cfg.http_conn_per_client;
  co.c.http_header_timeout_ms = co.cfg.http_header_ms;
  co.c.http_body_timeout_ms = co.cfg.http_body_ms;
  co.actions_tail = &co.actions;
  lynx_guard_init(&co.c.ctl_guard, co.cfg.ctl_conn_max, co.cfg.ctl_unauth_max,
                  co.cfg.ctl_unauth_per_client);
  lynx_reg_init(&co.c.reg, co.cfg.lease_ms, co.cfg.drain_ms, &ops);
  co.c.reg.suspect_ms = co.cfg.suspect_ms;
  co.c.reg.tick_ms = TICK_MS;
  /* instance ids and table versions keep growing across coordinator
   * restarts (frontends and agents outlive us): start from the clock */
  co.c.reg.next_instance_id = (uint64_t)time(NULL) * 1000u;
  co.c.reg.table_version = (uint64_t)time(NULL) * 1000u;
  /* the loop and its wake-up exist before anything can queue an action */
  uv_loop_init(&co.loop);
  uv_async_init(&co.loop, &co.wake, on_wake);
  co.wake.data = &co;
  rc = co.cfg.etcd ? lynx_store_etcd_load(&co.store, &co.c.reg,
                                           lynx_coord_now_ms(), err,
                                           sizeof(err))
                    : lynx_store_load(co.cfg.state_dir, &co.c.reg,
                                      lynx_coord_now_ms(), err, sizeof(err));
  if (rc) {
    LYNX_ERR("coordinator", "cannot load state from %s: %s",
             co.cfg.etcd ? co.cfg.etcd : co.cfg.state_dir, err);
    uv_close((uv_handle_t *)&co.wake, NULL);
    uv_run(&co.loop, UV_RUN_DEFAULT);
    uv_loop_close(&co.loop);
    goto out_reg;
  }
  /* the limits bind new services only: what the state directory holds
   * stays, even above a limit lowered since */
  co.c.reg.services_max = co.cfg.services_max;
  co.c.reg.region_max_bytes = (uint64_t)co.cfg.region_max_mb << 20;
  uv_tcp_init(&co.loop, &co.server);
  co.server.data = &co;
  rc = uv_tcp_bind(&co.server, (struct sockaddr *)&ss, 0);
  if (!rc)
    rc = uv_listen((uv_stream_t *)&co.server, 128, on_connection);
  if (rc) {
    LYNX_ERR("coordinator", "cannot listen on %s: %s", co.cfg.listen,
             uv_strerror(rc));
    uv_close((uv_handle_t *)&co.server, NULL);
    uv_close((uv_handle_t *)&co.wake, NULL);
    uv_run(&co.loop, UV_RUN_DEFAULT);
    uv_loop_close(&co.loop);
    goto out_reg;
  }
  rc = lynx_http_start(&co.c, co.cfg.http);
  if (rc) {
    LYNX_ERR("coordinator", "cannot serve the API on %s: %s", co.cfg.http,
             strerror(-rc));
    uv_close((uv_handle_t *)&co.server, NULL);
    uv_close((uv_handle_t *)&co.wake, NULL);
    uv_run(&co.loop, UV_RUN_DEFAULT);
    uv_loop_close(&co.loop);
    goto out_reg;
  }
  /* with services on disk this is a restart: agents are re-registering */
  if (co.c.reg.services)
    settle(&co);
  uv_timer_init(&co.loop, &co.tick);
  co.tick.data = &co;
  uv_timer_start(&co.tick, on_tick, TICK_MS, TICK_MS);
  uv_signal_init(&co.loop, &co.sigint);
  uv_signal_init(&co.loop, &co.sigterm);
  co.sigint.data = co.sigterm.data = &co;
  uv_signal_start(&co.sigint, on_signal, SIGINT);
  uv_signal_start(&co.sigterm, on_signal, SIGTERM);
  if (co.cfg.etcd) {
    char id[LYNX_ID_MAX], host[64] = "host";
    gethostname(host, sizeof(host) - 1);
    snprintf(id, sizeof(id), "%.40s-%d", host, (int)getpid());
    uv_async_init(&co.loop, &co.role, on_role);
    co.role.data = &co;
    co.role_ready = 1;
    co.elect.c = &co.c;
    co.elect.store = &co.store;
    co.elect.changed = elect_changed;
    co.elect.arg = &co;
    if (lynx_elect_start(&co.elect, co.cfg.etcd, co.cfg.etcd_timeout_ms,
                         co.cfg.etcd_lease_s, id, co.cfg.http, co.cfg.listen,
                         err, sizeof(err))) {
      LYNX_ERR("coordinator", "cannot take part in the leader election: %s",
               err);
      co.elect_failed = 1;
      raise(SIGTERM);
    }
  }
  pthread_mutex_lock(&co.c.lock);
  co.c.ready = 1;
  pthread_mutex_unlock(&co.c.lock);
  lynx_notify_ready("serving control on %s and the API on %s",
                    co.cfg.listen, co.cfg.http);
  {
    struct json_object *j = lynx_opts_json(coord_opts, &co.cfg);
    LYNX_INFO("coordinator", "serving control on %s%s and the API on "
              "%s://%s%s; config %s", co.cfg.listen,
              co.tls_ctl ? " over TLS (peers need a certificate the CA "
                           "signed)" : "",
              co.tls_on ? "https" : "http", co.cfg.http,
              co.tls_ctl || token ? "" : " (no token: loopback peers only)",
              json_object_to_json_string_ext(j, JSON_C_TO_STRING_PLAIN));
    json_object_put(j);
  }
  uv_run(&co.loop, UV_RUN_DEFAULT);
  lynx_http_stop(&co.c);
  if (uv_loop_close(&co.loop))
    LYNX_WARN("coordinator", "loop closed with handles open");
  exit_code = co.elect_failed;
out_reg:
  while (co.actions) {
    struct action *a = co.actions;
    co.actions = a->next;
    free(a);
  }
  lynx_reg_free(&co.c.reg);
  pthread_cond_destroy(&co.c.changed);
  pthread_mutex_destroy(&co.c.change_lock);
  pthread_mutex_destroy(&co.role_lock);
  pthread_mutex_destroy(&co.c.lock);
out_opts:
  lynx_etcd_close(co.store.etcd);
  if (co.tls_on)
    lynx_tls_free(&co.tls);
  free(token);
  lynx_opts_free(coord_opts, &co.cfg);
  return exit_code;
}
