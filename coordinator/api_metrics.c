/*
 * api_metrics.c - GET /metrics: the coordinator's Prometheus text
 * (docs/metrics.md), from a snapshot of the registry and of the API's own
 * connection counters copied under the lock and rendered after it.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_internal.h"
#include "prom.h"

/* One accelerator's health series, copied under the lock. */
struct metrics_accel {
  char node[LYNX_ID_MAX];
  uint32_t idx;
  int dispatchable;
  uint32_t stalled_mqueues;
  uint64_t outages;
};

/* lynx_node_*: one series per registered node. */
struct metrics_node {
  char id[LYNX_ID_MAX];
  enum lynx_node_state state;
  int64_t lease_left_ms; /* until its lease runs out (not for down nodes) */
};

struct metrics_snap {
  int leader, no_leader;
  uint64_t lease_ms;
  uint64_t n_nodes;
  struct metrics_node *nodes_v; /* n_nodes entries, or NULL (no memory) */
  struct lynx_hc_stats api;     /* the API's connections */
  unsigned api_watches;         /* parked watches */
  uint64_t nodes[4];
  uint64_t accels, requests, responses;
  uint64_t services, frontends, frontends_active;
  uint64_t fe_assigned, fe_moves;
  uint64_t version, table_version;
  uint64_t lease_expiries, table_pushes, registrations, refused_epochs;
  uint64_t new_incarnations, pauses, paused_ms, moves_started, moves_done;
  uint64_t suspect, suspicions, unsure_refusals, suspect_ms;
  struct metrics_accel *acc; /* m.accels entries, or NULL (out of memory) */
};

/* lynx_accel_*: one series per accelerator of every registered node. */
static void metrics_accels(FILE *f, const struct metrics_snap *m) {
  static const struct {
    const char *name, *type, *help;
  } fam[] = {
      {"lynx_accel_dispatchable", "gauge",
       "1 when the accelerator's health lets it take requests (not lost, not "
       "failed, no stalled mqueue), else 0; its node's state is separate."},
      {"lynx_accel_stalled_mqueues", "gauge",
       "Mqueues of the accelerator with a request pending whose consumer has "
       "not moved for the agent's stall period."},
      {"lynx_accel_health_outages_total", "counter",
       "Times the accelerator went out of dispatch for its health."},
  };
  if (!m->acc)
    return;
  for (size_t k = 0; k < LYNX_ARRAY_SIZE(fam); k++) {
    lynx_prom_family(f, fam[k].name, fam[k].type, fam[k].help);
    for (uint64_t i = 0; i < m->accels; i++) {
      const struct metrics_accel *a = &m->acc[i];
      uint64_t v = k == 0   ? (uint64_t)(a->dispatchable ? 1 : 0)
                   : k == 1 ? a->stalled_mqueues
                            : a->outages;
      char idx[16];
      snprintf(idx, sizeof(idx), "%" PRIu32, a->idx);
      lynx_prom_u64(f, fam[k].name,
                    (const struct lynx_prom_label[]){
                        {"node", a->node}, {"accel", idx}, {NULL, NULL}},
                    v);
    }
  }
}

static const char *const node_states[4] = {"ready", "draining", "drained",
                                           "down"};

/* lynx_node_state (1 for the node's state, 0 for the others) and
 * lynx_node_lease_remaining_seconds (nodes not down): what alerts on a
 * node going down or missing heartbeats name the node by. */
static void metrics_nodes(FILE *f, const struct metrics_snap *m) {
  if (!m->nodes_v)
    return;
  lynx_prom_family(f, "lynx_node_state", "gauge",
                   "1 for the node's state (ready, draining, drained, down), "
                   "0 for the others.");
  for (uint64_t i = 0; i < m->n_nodes; i++)
    for (int k = 0; k < 4; k++)
      lynx_prom_u64(f, "lynx_node_state",
                    (const struct lynx_prom_label[]){{"node", m->nodes_v[i].id},
                                                     {"state", node_states[k]},
                                                     {NULL, NULL}},
                    (unsigned)m->nodes_v[i].state == (unsigned)k);
  lynx_prom_family(f, "lynx_node_lease_remaining_seconds", "gauge",
                   "Time until the node's lease runs out unless a heartbeat "
                   "renews it (heartbeats come every third of a lease); "
                   "nodes that are down have none.");
  for (uint64_t i = 0; i < m->n_nodes; i++)
    if (m->nodes_v[i].state != LYNX_NODE_DOWN)
      lynx_prom_double(f, "lynx_node_lease_remaining_seconds",
                       (const struct lynx_prom_label[]){
                           {"node", m->nodes_v[i].id}, {NULL, NULL}},
                       (double)m->nodes_v[i].lease_left_ms / 1000.0, 3);
}

void api_metrics(struct http_req *rq, struct http_out *out) {
  struct metrics_snap m;
  const struct lynx_registry *r = &rq->c->reg;
  char *buf = NULL;
  size_t len = 0;
  FILE *f;
  uint64_t now_ms = rq->c->now_ms(), k;

  memset(&m, 0, sizeof(m));
  pthread_mutex_lock(&rq->c->lock);
  m.leader = !rq->c->ha || __atomic_load_n(&rq->c->leader, __ATOMIC_ACQUIRE);
  m.no_leader = rq->c->ha && !m.leader && rq->c->no_leader;
  m.lease_ms = r->lease_ms;
  for (const struct lynx_reg_node *n = r->nodes; n; n = n->next)
    m.n_nodes++;
  m.nodes_v = m.n_nodes ? calloc(m.n_nodes, sizeof(*m.nodes_v)) : NULL;
  k = 0;
  for (const struct lynx_reg_node *n = r->nodes; n; n = n->next, k++) {
    if (m.nodes_v) {
      struct metrics_node *v = &m.nodes_v[k];
      snprintf(v->id, sizeof(v->id), "%s", n->id);
      v->state = n->state;
      v->lease_left_ms = (int64_t)n->lease_deadline_ms - (int64_t)now_ms;
    }
    if ((unsigned)n->state < 4)
      m.nodes[n->state]++;
    m.suspect += n->suspect != 0;
    m.accels += n->n_accels;
    for (uint32_t i = 0; i < n->n_accels && i < LYNX_ACCELS_MAX; i++) {
      m.requests += n->accels[i].requests;
      m.responses += n->accels[i].responses;
    }
  }
  /* the per-accelerator series are formatted after the lock is released;
   * without memory for the copy they are left out, the rest still answers */
  m.acc = m.accels ? calloc(m.accels, sizeof(*m.acc)) : NULL;
  if (m.acc) {
    k = 0;
    for (const struct lynx_reg_node *n = r->nodes; n; n = n->next)
      for (uint32_t i = 0; i < n->n_accels && i < LYNX_ACCELS_MAX; i++, k++) {
        const struct lynx_reg_accel *a = &n->accels[i];
        snprintf(m.acc[k].node, sizeof(m.acc[k].node), "%s", n->id);
        m.acc[k].idx = a->info.idx;
        m.acc[k].dispatchable = lynx_reg_accel_dispatchable(a);
        m.acc[k].stalled_mqueues = a->stalled_mqueues;
        m.acc[k].outages = a->health_outages;
      }
  }
  for (const struct lynx_reg_service *s = r->services; s; s = s->next)
    m.services++;
  for (const struct lynx_reg_frontend *fe = r->frontends; fe; fe = fe->next) {
    m.frontends += fe->connected ? 1 : 0;
    m.frontends_active += fe->connected && fe->active;
  }
  m.fe_assigned = r->fe_assigned;
  m.fe_moves = r->fe_moves;
  m.version = r->version;
  m.table_version = r->table_version;
  m.lease_expiries = r->lease_expiries;
  m.table_pushes = r->table_pushes;
  m.registrations = r->registrations;
  m.refused_epochs = r->refused_epochs;
  m.new_incarnations = r->new_incarnations;
  m.moves_started = r->moves_started;
  m.moves_done = r->moves_done;
  m.pauses = r->pauses;
  m.paused_ms = r->paused_ms;
  m.suspicions = r->suspicions;
  m.suspect_ms = lynx_reg_suspect_ms(r);
  m.unsure_refusals =
      __atomic_load_n(&rq->c->unsure_refusals, __ATOMIC_RELAXED);
  m.api_watches = rq->h->n_watchers;
  pthread_mutex_unlock(&rq->c->lock);
  lynx_hc_stats(rq->h->hc, &m.api);

  f = open_memstream(&buf, &len);
  if (!f) {
    free(m.nodes_v);
    free(m.acc);
    http_reply_oom(out);
    return;
  }
  lynx_prom_family(f, "lynx_coordinator_nodes", "gauge",
                   "Registered nodes by state.");
  for (int i = 0; i < 4; i++)
    lynx_prom_u64(f, "lynx_coordinator_nodes",
                  (const struct lynx_prom_label[]){{"state", node_states[i]},
                                                   {NULL, NULL}},
                  m.nodes[i]);
#define ONE(type, name, help, v)                                               \
  do {                                                                         \
    lynx_prom_family(f, name, type, help);                                     \
    lynx_prom_u64(f, name, NULL, v);                                           \
  } while (0)
#define GAUGE(name, help, v) ONE("gauge", name, help, v)
#define COUNTER(name, help, v) ONE("counter", name, help, v)
  GAUGE("lynx_coordinator_accelerators",
        "Accelerators of registered nodes (any state).", m.accels);
  COUNTER("lynx_coordinator_requests_total",
          "Requests reported by the accelerators' heartbeats, summed.",
          m.requests);
  COUNTER("lynx_coordinator_responses_total",
          "Responses reported by the accelerators' heartbeats, summed.",
          m.responses);
  COUNTER("lynx_coordinator_lease_expiries_total",
          "Nodes marked down because their lease expired.", m.lease_expiries);
  GAUGE("lynx_coordinator_nodes_suspect",
        "Nodes silent past their heartbeat lease (--suspect-ms): out of the "
        "dispatch tables until heard again, not down yet.",
        m.suspect);
  COUNTER("lynx_coordinator_suspicions_total",
          "Times a node went suspect (silent past --suspect-ms).",
          m.suspicions);
  COUNTER("lynx_coordinator_unsure_refusals_total",
          "Hellos, messages and connections of agents and frontends refused "
          "because this leader was not sure it still led (it did not run, "
          "or etcd did not answer, past what it could vouch for).",
          m.unsure_refusals);
  COUNTER("lynx_coordinator_table_pushes_total",
          "Dispatch tables pushed to frontends.", m.table_pushes);
  COUNTER("lynx_coordinator_registrations_total",
          "Agent registrations accepted.", m.registrations);
  COUNTER("lynx_coordinator_refused_epochs_total",
          "Agent messages refused for carrying an old epoch.",
          m.refused_epochs);
  COUNTER("lynx_coordinator_new_incarnations_total",
          "Re-registrations of a declared-down epoch sent back to register "
          "as a new incarnation.",
          m.new_incarnations);
  COUNTER("lynx_coordinator_replica_moves_started_total",
          "Replicas given a replacement on a node the placement prefers "
          "(replicas follow capacity).",
          m.moves_started);
  COUNTER("lynx_coordinator_replica_moves_done_total",
          "Moved-away replicas stopped once quiet (or at the drain "
          "timeout).",
          m.moves_done);
  COUNTER("lynx_coordinator_pauses_total",
          "Times the coordinator found it had not run for more than two "
          "ticks (stopped, starved) and extended every lease by the gap.",
          m.pauses);
  lynx_prom_family(f, "lynx_coordinator_paused_seconds_total", "counter",
                   "Time credited to leases for such pauses.");
  lynx_prom_double(f, "lynx_coordinator_paused_seconds_total", NULL,
                   (double)m.paused_ms / 1000.0, 3);
  GAUGE("lynx_coordinator_leader",
        "1 while this coordinator leads (always, without --etcd), 0 for a "
        "follower.",
        (uint64_t)m.leader);
  GAUGE("lynx_coordinator_no_leader",
        "1 while this follower knows of no leader (an election under way, "
        "or etcd without a quorum: the API answers 503 no_leader).",
        (uint64_t)m.no_leader);
  lynx_prom_family(f, "lynx_coordinator_lease_seconds", "gauge",
                   "The agents' lease (--lease-ms).");
  lynx_prom_double(f, "lynx_coordinator_lease_seconds", NULL,
                   (double)m.lease_ms / 1000.0, 3);
  lynx_prom_family(f, "lynx_coordinator_suspect_seconds", "gauge",
                   "The agents' heartbeat lease (--suspect-ms).");
  lynx_prom_double(f, "lynx_coordinator_suspect_seconds", NULL,
                   (double)m.suspect_ms / 1000.0, 3);
  GAUGE("lynx_coordinator_registry_version",
        "Registry version (grows on every observable change).", m.version);
  GAUGE("lynx_coordinator_table_version", "Dispatch table version.",
        m.table_version);
  GAUGE("lynx_coordinator_services", "Services defined.", m.services);
  GAUGE("lynx_coordinator_frontends", "Frontends connected.", m.frontends);
  GAUGE("lynx_coordinator_frontends_active",
        "Frontends the instances are partitioned among (the others are "
        "standbys).",
        m.frontends_active);
  COUNTER("lynx_coordinator_frontend_assignments_total",
          "Instances given to an active frontend, each with a new epoch "
          "that fences its earlier producers.",
          m.fe_assigned);
  COUNTER("lynx_coordinator_frontend_moves_total",
          "Instances released by a live frontend (it answered what it held "
          "on them, or the drain timeout passed) to go to another.",
          m.fe_moves);
  lynx_hc_metrics(f, "lynx_coordinator_api", "--http", &m.api);
  GAUGE("lynx_coordinator_api_watches",
        "GET /v1/watch long polls waiting for a change (each holds a "
        "connection, no thread).",
        m.api_watches);
#undef GAUGE
#undef COUNTER
#undef ONE
  lynx_guard_metrics(f, "lynx_coordinator_control", "control port",
                     &rq->c->ctl_guard);
  metrics_nodes(f, &m);
  metrics_accels(f, &m);
  free(m.nodes_v);
  free(m.acc);
  if (fclose(f) != 0 || !buf) {
    free(buf);
    http_reply_oom(out);
    return;
  }
  out->status = 200;
  out->text = buf;
  out->text_len = len;
  out->ctype = "text/plain; version=0.0.4; charset=utf-8";
}
