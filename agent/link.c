/*
 * link.c - the agent's connection to the coordinator.
 *
 * States: HELLO (connecting, or Hello sent: the dialer does both) ->
 * REGISTERING (Register sent) -> REGISTERED (heartbeats every lease/3;
 * RegisterReply.lease_ms is the heartbeat lease, fence_ms the fence's).
 * Any failure closes the connection and goes back to HELLO, with a
 * reconnect after the dialer's jittered exponential backoff (100 ms .. 2 s,
 * at most a quarter lease once a lease is known). Re-registering carries
 * the same epoch and the instances still running, so a restarted
 * coordinator adopts them instead of starting duplicates. A wrong token or
 * protocol version is final: the agent stops with a clear message.
 *
 * The lease fence (docs/design.md, "Delivery guarantees"): frontends count
 * a node's requests in flight lost once the coordinator declares it down,
 * and a lost request must never run later. So the accelerators take new
 * requests only until ag->serve_until_ns: the send time of the latest
 * heartbeat (or Register) the coordinator answered, plus the lease, less a
 * margin (RegisterReply.fence_ms, which the coordinator makes long enough
 * to ride out a leader failover; the heartbeat lease, lease_ms, only takes
 * a silent node out of dispatch). The coordinator declares the node down
 * no earlier than the receipt of that heartbeat plus the fence lease, so
 * the accelerators stop first, whether this process was stopped, starved
 * or cut off.
 *
 * A coordinator that stops answering heartbeats (stopped, wedged, cut off)
 * is left at the next heartbeat after one went unanswered for a heartbeat
 * period: the connection is closed and the dialer tries the next address
 * (another coordinator may lead by now: docs/etcd.md), well within the
 * fence lease. While no coordinator
 * listens at all (its connection refused: it is being restarted), nobody
 * can declare the node down, and each refused attempt renews the fence, so
 * instances keep serving. So does a Hello refused with no_leader: with
 * several coordinators on etcd, the one asked knows of no leader (etcd
 * without quorum: docs/etcd.md, "etcd without a quorum"). A registration the
 * coordinator refuses because the epoch was declared down makes this agent a
 * new incarnation: it discards its instances, with their queued requests, and
 * registers with a new epoch.
 *
 * Stopping (main.c, on_signal): a registered agent with instances sends
 * Leave with drain and keeps heartbeating while the coordinator drains its
 * node; the StopInstance that stops the last instance ends the wait (a
 * Leave without drain, then the agent exits). A drain lives in the
 * leader's memory only: after a lost connection the agent dials again and
 * asks the coordinator that registers it (restarted, or a new leader) for
 * the drain again; none within LEAVE_REDIAL_MS (or a lease), or a silent
 * one, ends the wait.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent.h"
#include "frame.h"
#include "log.h"
#include "notify.h"
#include "util.h"

enum link_state {
  LINK_HELLO,       /* connecting or Hello sent, waiting for HelloReply */
  LINK_REGISTERING, /* Register sent, waiting for RegisterReply */
  LINK_REGISTERED,  /* lease held: heartbeats flow */
};

#define HB_RING 64 /* heartbeats awaiting their reply, remembered */
/* A coordinator that accepts the connection but does not answer the Hello
 * within this (a stopped one: the kernel accepts for it) is passed over
 * for the next address. A live coordinator answers a Hello at once. */
#define HELLO_TIMEOUT_MS 1000u
/* Draining to leave, a lost coordinator is waited for this long at most
 * (or a lease, if shorter): long enough for a restart under systemd or a
 * leader that stepped down to hand over, short enough that stopping the
 * whole cluster at once does not keep agents waiting. */
#define LEAVE_REDIAL_MS 2000u

struct coord_link {
  struct agent *ag;
  struct agent_link_hooks hooks; /* how the link ends the agent (main.c) */
  struct lynx_dialer d;          /* d.ctl is the connection */
  uv_timer_t beat;
  uv_timer_t fence; /* fires when serve_until_ns passes: logs the fence */
  enum link_state state;
  uint64_t lease_ms; /* heartbeat lease: heartbeats every third of it */
  uint64_t fence_ms; /* the fence's lease (RegisterReply.fence_ms) */
  int acks;          /* the coordinator answers heartbeats (RegisterReply) */
  int drains;        /* it drains a node on Leave with drain (RegisterReply) */
  int fenced;        /* the fence stopped the accelerators (logged) */
  int no_leader;     /* refused by a coordinator that knows of no leader:
                      * logged once until a registration succeeds */
  uint64_t lost_ns;  /* draining to leave: when the link was lost (0: not) */
  uint64_t register_sent_ns;
  /* send times of heartbeats, by sequence number; replies come in order */
  uint64_t hb_sent_ns[HB_RING];
  uint64_t hb_sent, hb_answered;
  uint64_t beat_ms; /* the heartbeat period */
  int stopping;
  int timers_closed;
  char target[96];
};

#define TIMERS 3 /* beat, fence, the dialer's retry */

/* ---- lease fence ------------------------------------------------------ */

static void fence_fired(uv_timer_t *t) {
  struct coord_link *l = t->data;
  struct agent *ag = l->ag;
  uint64_t now = lynx_now_ns();
  uint64_t until = __atomic_load_n(&ag->serve_until_ns, __ATOMIC_ACQUIRE);
  if (l->fenced || now < until || !ag->instances)
    return;
  if (ag->leaving) {
    /* a coordinator that went silent cannot finish the drain, and may
     * already count what the instances hold lost */
    l->hooks.stop_soon(ag, "no heartbeat answered within the lease while "
                           "draining");
    return;
  }
  l->fenced = 1;
  LYNX_WARN("agent",
            "%s: no heartbeat answered within the lease (%llu ms): "
            "accelerators take no new request until the coordinator "
            "answers (frontends may already count them lost)",
            ag->node_id, (unsigned long long)l->fence_ms);
}

/* The lease holds until sent_ns + fence lease - margin (sent_ns: when the
 * message the coordinator answered left): moves the fence forward. The
 * margin is a quarter of the lease up to a second: the coordinator counts
 * from the receipt, later than the send, so it only has to cover a
 * request taken right at the fence and the clocks' rates. */
static void lease_renew(struct coord_link *l, uint64_t sent_ns) {
  struct agent *ag = l->ag;
  uint64_t margin = l->fence_ms / 4;
  uint64_t until, old, now = lynx_now_ns();
  if (margin > 1000)
    margin = 1000;
  if (margin < 20)
    margin = 20;
  if (!l->fence_ms || margin >= l->fence_ms)
    return;
  if (l->d.cur < LYNX_ADDRS_MAX) /* who renewed it (--metrics) */
    __atomic_add_fetch(&ag->lease_renewals[l->d.cur], 1, __ATOMIC_RELAXED);
  until = sent_ns + (l->fence_ms - margin) * 1000000u;
  old = __atomic_load_n(&ag->serve_until_ns, __ATOMIC_ACQUIRE);
  if (until <= old)
    return;
  __atomic_store_n(&ag->serve_until_ns, until, __ATOMIC_RELEASE);
  if (l->fenced) {
    l->fenced = 0;
    LYNX_INFO("agent",
              "%s: lease renewed after %llu ms: accelerators take "
              "requests again",
              ag->node_id,
              (unsigned long long)(now > old ? (now - old) / 1000000u : 0));
  }
  agent_instances_fence(ag, now >= old);
  if (until > now)
    uv_timer_start(&l->fence, fence_fired, (until - now) / 1000000u + 1, 0);
}

/* The coordinator declared this epoch down: every instance goes, with the
 * requests queued in its mqueues (frontends counted them lost), and the
 * agent registers again as a new incarnation, with epoch 0: the
 * coordinator issues the next one from its store. */
static void new_incarnation(struct coord_link *l, const char *why) {
  struct agent *ag = l->ag;
  uint64_t old = ag->epoch;
  uint32_t n = 0;
  for (struct instance *in = ag->instances; in; in = in->next)
    n++;
  __atomic_store_n(&ag->epoch, 0, __ATOMIC_RELAXED);
  LYNX_WARN("agent",
            "%s: %s; discarding %u instances of epoch %llu with "
            "their queued requests, registering again as a new incarnation",
            ag->node_id, why, n, (unsigned long long)old);
  agent_instances_stop_all(ag);
}

static void link_instance_ready(struct agent *ag, struct instance *in);

static void send_env(struct coord_link *l, Lynx__Envelope *env) {
  if (l->d.ctl && lynx_ctl_send(l->d.ctl, env))
    lynx_ctl_close(l->d.ctl, "cannot queue a message to the coordinator");
}

static void send_register(struct coord_link *l) {
  struct agent *ag = l->ag;
  Lynx__Envelope env = LYNX__ENVELOPE__INIT;
  Lynx__Register reg = LYNX__REGISTER__INIT;
  Lynx__Label labels[LYNX_LABELS_MAX], *lp[LYNX_LABELS_MAX];
  Lynx__AppRefused refused[LYNX_REFUSED_APPS_MAX], *refp[LYNX_REFUSED_APPS_MAX];
  size_t n_refused = 0;
  const char *rname, *rreason;
  Lynx__AccelInfo *acc = calloc(ag->n_acc, sizeof(*acc));
  Lynx__AccelInfo **ap = calloc(ag->n_acc, sizeof(*ap));
  /* per accelerator, the apps it runs (pointers to the app table's names) */
  char *(*apps)[LYNX_APPS_MAX] = calloc(ag->n_acc + 1, sizeof(*apps));
  char *(*app_backends)[LYNX_APPS_MAX] =
      calloc(ag->n_acc + 1, sizeof(*app_backends));
  size_t n_inst = 0;
  Lynx__InstanceInfo *ii;
  Lynx__InstanceInfo **ip;
  Lynx__RegionDesc *rd;
  char(*locs)[LYNX_LOCATOR_MAX];
  char addr[64] = "";
  struct sockaddr_storage ss;
  int len = sizeof(ss);
  for (struct instance *in = ag->instances; in; in = in->next)
    n_inst++;
  ii = calloc(n_inst + 1, sizeof(*ii));
  ip = calloc(n_inst + 1, sizeof(*ip));
  rd = calloc(n_inst + 1, sizeof(*rd));
  locs = calloc(n_inst + 1, sizeof(*locs));
  if (!acc || !ap || !apps || !app_backends || !ii || !ip || !rd || !locs) {
    lynx_ctl_close(l->d.ctl, "out of memory building Register");
    goto out;
  }
  if (uv_tcp_getsockname(&l->d.ctl->tcp, (struct sockaddr *)&ss, &len) == 0)
    lynx_fmt_addr((struct sockaddr *)&ss, addr, sizeof(addr));
  agent_health_blocks(ag); /* the budget as of now */
  for (uint32_t i = 0; i < ag->n_labels; i++) {
    lynx__label__init(&labels[i]);
    labels[i].key = ag->labels[i].key;
    labels[i].value = ag->labels[i].value;
    lp[i] = &labels[i];
  }
  for (uint32_t i = 0; i < ag->n_acc; i++) {
    lynx__accel_info__init(&acc[i]);
    const struct agent_accel *a = &ag->acc[i];
    acc[i].idx = i;
    acc[i].kind = (char *)a->info.ops->kind;
    acc[i].model = (char *)a->info.model;
    acc[i].ordering = a->ordering ? LYNX__ORDERING__ORDERING_FENCED
                                  : LYNX__ORDERING__ORDERING_COALESCED;
    /* 0 and "" where the backend has none (host memory): not on the wire */
    acc[i].memory_bytes = a->info.memory;
    acc[i].pci_bus_id = (char *)a->info.pci_bus_id;
    acc[i].gpudirect_rdma = a->info.gpudirect_rdma;
    acc[i].rdma_writes_ordering = a->info.rdma_writes_ordering;
    /* the GPU's resident-block budget, so that placement puts no instance
     * on a GPU that cannot keep its blocks resident (0: none, a CPU) */
    acc[i].resident_blocks = a->resident_blocks;
    acc[i].instance_blocks = a->resident_blocks ? ag->cfg.gpu_blocks : 0;
    /* what it can run, so the coordinator places nothing that cannot
     * start (the backend's start refuses the others) */
    for (size_t k = 0; lynx_app_at(k) && acc[i].n_apps < LYNX_APPS_MAX; k++) {
      const struct lynx_app *app = lynx_app_at(k);
      if (!a->info.ops->runs_app(&a->info, app))
        continue;
      /* and the back end it calls, so that a service without it is refused
       * at creation rather than failing here at every start */
      app_backends[i][acc[i].n_apps] =
          (char *)(app->needs_backend ? app->needs_backend : "");
      apps[i][acc[i].n_apps++] = (char *)app->name;
    }
    acc[i].apps = apps[i];
    acc[i].n_app_backends = acc[i].n_apps;
    acc[i].app_backends = app_backends[i];
    ap[i] = &acc[i];
  }
  n_inst = 0;
  for (struct instance *in = ag->instances; in; in = in->next) {
    lynx__instance_info__init(&ii[n_inst]);
    ii[n_inst].instance_id = in->id;
    ii[n_inst].service = in->service;
    ii[n_inst].accel_idx = in->accel;
    agent_instance_pb(ag, in, l->d.ctl, locs[n_inst], &rd[n_inst]);
    ii[n_inst].region = &rd[n_inst];
    ip[n_inst] = &ii[n_inst];
    n_inst++;
  }
  reg.node_id = ag->node_id;
  reg.address = addr;
  reg.epoch = ag->epoch;
  reg.n_labels = ag->n_labels;
  reg.labels = lp;
  reg.n_accels = ag->n_acc;
  reg.accels = ap;
  reg.n_instances = n_inst;
  reg.instances = ip;
  for (; n_refused < LYNX_REFUSED_APPS_MAX &&
         lynx_app_refused_at(n_refused, &rname, &rreason);
       n_refused++) {
    lynx__app_refused__init(&refused[n_refused]);
    refused[n_refused].name = (char *)rname;
    refused[n_refused].reason = (char *)rreason;
    refp[n_refused] = &refused[n_refused];
  }
  reg.n_refused_apps = n_refused;
  reg.refused_apps = refp;
  env.msg_case = LYNX__ENVELOPE__MSG_REGISTER;
  env.register_ = &reg;
  l->register_sent_ns = lynx_now_ns();
  send_env(l, &env);
  l->state = LINK_REGISTERING;
out:
  free(locs);
  free(acc);
  free(ap);
  free(apps);
  free(app_backends);
  free(ii);
  free(ip);
  free(rd);
}

static void on_beat(uv_timer_t *t) {
  struct coord_link *l = t->data;
  struct agent *ag = l->ag;
  Lynx__Envelope env = LYNX__ENVELOPE__INIT;
  Lynx__Heartbeat hb = LYNX__HEARTBEAT__INIT;
  Lynx__AccelCounters *c, **cp;
  Lynx__AppFault faults[LYNX_APP_FAULTS_MAX], *faultp[LYNX_APP_FAULTS_MAX];
  if (l->state != LINK_REGISTERED)
    return;
  if (l->acks && l->hb_sent > l->hb_answered &&
      l->hb_sent - l->hb_answered <= HB_RING) {
    /* the oldest heartbeat still unanswered: one period old means the
     * coordinator let a whole period pass (stopped, wedged, cut off) */
    uint64_t age =
        (lynx_now_ns() - l->hb_sent_ns[l->hb_answered % HB_RING]) / 1000000u;
    if (age >= l->beat_ms - l->beat_ms / 10) {
      lynx_dialer_silent(&l->d, "no heartbeat answered", age);
      return;
    }
  }
  c = calloc(ag->n_acc, sizeof(*c));
  cp = calloc(ag->n_acc, sizeof(*cp));
  if (!c || !cp)
    goto out;
  agent_health_blocks(ag); /* the blocks held as of now */
  for (uint32_t i = 0; i < ag->n_acc; i++) {
    struct agent_accel *a = &ag->acc[i];
    lynx__accel_counters__init(&c[i]);
    c[i].idx = i;
    agent_accel_counters(ag, i, &c[i].requests, &c[i].responses);
    c[i].device_lost = a->device_lost;
    c[i].failed = a->failed;
    c[i].last_error = a->last_error;
    c[i].stalled_mqueues = a->stalled_mqueues;
    c[i].stall_ms = a->stall_ms;
    c[i].window_requests = a->q.window_requests;
    c[i].queue_p50_ns = a->q.queue_p50;
    c[i].queue_p99_ns = a->q.queue_p99;
    c[i].service_p50_ns = a->q.service_p50;
    c[i].service_p99_ns = a->q.service_p99;
    c[i].blocks_held = a->blocks_held;
    cp[i] = &c[i];
  }
  hb.node_id = ag->node_id;
  hb.epoch = ag->epoch;
  hb.healthy = 1;
  hb.n_counters = ag->n_acc;
  hb.counters = cp;
  hb.n_app_faults = agent_apphosts_faults(ag, faults);
  for (size_t k = 0; k < hb.n_app_faults; k++)
    faultp[k] = &faults[k];
  hb.app_faults = faultp;
  env.msg_case = LYNX__ENVELOPE__MSG_HEARTBEAT;
  env.heartbeat = &hb;
  l->hb_sent_ns[l->hb_sent % HB_RING] = lynx_now_ns();
  l->hb_sent++;
  send_env(l, &env);
  if (!l->acks) /* a coordinator that does not answer: sending must do */
    lease_renew(l, l->hb_sent_ns[(l->hb_sent - 1) % HB_RING]);
out:
  free(c);
  free(cp);
}

static void reply_instance(struct coord_link *l, uint64_t id,
                           const struct instance *in, const char *error) {
  struct agent *ag = l->ag;
  Lynx__Envelope env = LYNX__ENVELOPE__INIT;
  if (in) {
    Lynx__InstanceReady r = LYNX__INSTANCE_READY__INIT;
    Lynx__RegionDesc rd;
    char loc[LYNX_LOCATOR_MAX];
    agent_instance_pb(ag, in, l->d.ctl, loc, &rd);
    r.node_id = ag->node_id;
    r.epoch = ag->epoch;
    r.instance_id = id;
    r.region = &rd;
    env.msg_case = LYNX__ENVELOPE__MSG_INSTANCE_READY;
    env.instance_ready = &r;
    send_env(l, &env);
  } else {
    Lynx__InstanceFailed f = LYNX__INSTANCE_FAILED__INIT;
    f.node_id = ag->node_id;
    f.epoch = ag->epoch;
    f.instance_id = id;
    f.error = (char *)error;
    env.msg_case = LYNX__ENVELOPE__MSG_INSTANCE_FAILED;
    env.instance_failed = &f;
    send_env(l, &env);
  }
}

static void on_start(struct coord_link *l, const Lynx__StartInstance *s) {
  struct agent *ag = l->ag;
  const Lynx__ServiceSpec *sp = s->service;
  const struct lynx_app *app;
  struct instance *in = agent_instance_find(ag, s->instance_id);
  char why[320];
  int rc;
  if (in) {           /* a repeated request: it runs already */
    if (!in->pending) /* else its start's end says it */
      reply_instance(l, s->instance_id, in, NULL);
    return;
  }
  if (ag->leaving) { /* sent before the coordinator read our Leave */
    reply_instance(l, s->instance_id, NULL,
                   "the agent is stopping (its node drains to leave)");
    return;
  }
  if (!sp || !sp->name || !sp->app) {
    reply_instance(l, s->instance_id, NULL, "StartInstance without a service");
    return;
  }
  app = lynx_app_find(sp->app);
  if (!app) {
    const char *reason = lynx_app_refusal(sp->app);
    if (reason)
      snprintf(why, sizeof(why),
               "application '%s': its plug-in was refused: %s", sp->app,
               reason);
    else
      snprintf(why, sizeof(why), "unknown application '%s' (known: %s)",
               sp->app, lynx_app_names());
    LYNX_WARN("agent", "%s: instance %llu: %s", ag->node_id,
              (unsigned long long)s->instance_id, why);
    reply_instance(l, s->instance_id, NULL, why);
    return;
  }
  {
    char names[LYNX_BACKENDS_MAX][LYNX_BACKEND_NAME_MAX];
    uint32_t nb = 0;
    for (size_t k = 0; k < sp->n_backends && k < LYNX_BACKENDS_MAX; k++)
      snprintf(names[nb++], sizeof(names[0]), "%s",
               sp->backends[k]->name ? sp->backends[k]->name : "");
    if (app->needs_backend) {
      int found = 0;
      for (uint32_t k = 0; k < nb; k++)
        found |= !strcmp(names[k], app->needs_backend);
      if (!found) {
        snprintf(why, sizeof(why),
                 "application '%s' needs a back end named "
                 "'%s' in the service's backends",
                 sp->app, app->needs_backend);
        LYNX_WARN("agent", "%s: instance %llu: %s", ag->node_id,
                  (unsigned long long)s->instance_id, why);
        reply_instance(l, s->instance_id, NULL, why);
        return;
      }
    }
    char err[256] = "";
    struct instance_req q = {.id = s->instance_id,
                             .accel = s->accel_idx,
                             .service = sp->name,
                             .app = app,
                             .mqueues = sp->mqueues_per_accel,
                             .slots = sp->slots,
                             .slot_size = sp->slot_size,
                             .msg_max = sp->msg_max,
                             .work_us = sp->work_us,
                             .backends = names,
                             .n_backends = nb,
                             .config = s->app_config};
    rc = agent_instance_start(ag, &q, &in, err, sizeof(err));
    if (rc) {
      snprintf(why, sizeof(why), "cannot start on accel %u: %s", s->accel_idx,
               err[0] ? err : strerror(-rc));
      reply_instance(l, s->instance_id, NULL, why);
      return;
    }
  }
  if (!in->pending) /* else when its application's start ends */
    reply_instance(l, s->instance_id, in, NULL);
}

/* Leave, asking for a drain first when drain. */
static void send_leave(struct coord_link *l, int drain) {
  Lynx__Envelope env = LYNX__ENVELOPE__INIT;
  Lynx__Leave lv = LYNX__LEAVE__INIT;
  lv.node_id = l->ag->node_id;
  lv.epoch = l->ag->epoch;
  lv.drain = drain != 0;
  env.msg_case = LYNX__ENVELOPE__MSG_LEAVE;
  env.leave = &lv;
  send_env(l, &env);
}

/* Registered again while draining to leave (the coordinator restarted, or
 * another one leads): a drain lives in the leader's memory only, so the
 * new one is asked for it again. */
static void drain_again(struct coord_link *l) {
  struct agent *ag = l->ag;
  if (!ag->instances) { /* a new incarnation: they went with the old one */
    LYNX_INFO("agent", "%s: no instance left to drain; leaving", ag->node_id);
    l->hooks.shutdown(ag, 0);
  } else if (!l->drains) {
    l->hooks.stop_soon(ag, "the coordinator now answering does not drain a "
                           "node whose agent stops");
  } else {
    LYNX_INFO("agent",
              "%s: asking coordinator %s again to drain the node "
              "before stopping",
              ag->node_id, l->d.ctl->peer);
    send_leave(l, 1);
  }
}

static void link_msg(struct lynx_ctl *c, Lynx__Envelope *env) {
  struct coord_link *l = c->data;
  struct agent *ag = l->ag;
  char why[200];
  switch (env->msg_case) {
  case LYNX__ENVELOPE__MSG_HELLO_REPLY:
    if (l->state != LINK_HELLO)
      break;
    if (!env->hello_reply->ok && env->hello_reply->no_leader) {
      /* No coordinator leads (etcd without quorum, or an election under
       * way): nobody can declare this node down meanwhile, and a leader
       * elected later takes only the nodes that register with it, so
       * the instances keep serving, as while a single coordinator is
       * being restarted. The caveat (a follower cut from etcd answering
       * us while we are cut from a live leader): docs/etcd.md. */
      if (!l->no_leader)
        LYNX_WARN("agent",
                  "%s: no coordinator leads (etcd without "
                  "quorum?): instances keep serving on the last tables; "
                  "%s says: %s",
                  ag->node_id, c->peer, env->hello_reply->error);
      l->no_leader = 1;
      lease_renew(l, lynx_now_ns());
      lynx_ctl_close(c, NULL);
      return;
    }
    if (!env->hello_reply->ok) {
      LYNX_ERR("agent", "%s: coordinator %s refused us: %s", ag->node_id,
               c->peer, env->hello_reply->error);
      lynx_ctl_close(c, NULL);
      if (!env->hello_reply->retryable)
        l->hooks.shutdown(ag,
                          1); /* wrong token or version: retrying can't help */
      return;
    }
    lynx_dialer_connected(&l->d);
    send_register(l);
    return;
  case LYNX__ENVELOPE__MSG_REGISTER_REPLY:
    if (l->state != LINK_REGISTERING)
      break;
    if (!env->register_reply->ok) {
      snprintf(why, sizeof(why), "registration refused: %s",
               env->register_reply->error);
      if (env->register_reply->new_incarnation)
        new_incarnation(l, why);
      lynx_ctl_close(c, env->register_reply->new_incarnation ? NULL : why);
      return;
    }
    /* a new incarnation (epoch 0) takes the epoch the store issued; one
     * registering again keeps its own (the reply repeats it) */
    if (!ag->epoch && env->register_reply->epoch)
      __atomic_store_n(&ag->epoch, env->register_reply->epoch,
                       __ATOMIC_RELAXED);
    if (!ag->epoch) {
      lynx_ctl_close(c, "registration answered without an epoch (a "
                        "coordinator older than this agent?)");
      return;
    }
    l->state = LINK_REGISTERED;
    if (l->no_leader)
      LYNX_INFO("agent", "%s: a coordinator leads again", ag->node_id);
    l->no_leader = 0; /* the episode is over: the next one is logged */
    l->lease_ms =
        env->register_reply->lease_ms ? env->register_reply->lease_ms : 3000;
    l->fence_ms = env->register_reply->fence_ms
                      ? env->register_reply->fence_ms
                      : l->lease_ms; /* an older coordinator */
    l->acks = env->register_reply->acks_heartbeats;
    l->drains = env->register_reply->drains_on_leave;
    l->hb_sent = l->hb_answered = 0;
    /* a restarted coordinator must hear from us well within a lease */
    l->d.backoff_max_ms = l->lease_ms / 4 < 100 ? 100 : l->lease_ms / 4;
    if (l->d.backoff_max_ms > 2000)
      l->d.backoff_max_ms = 2000;
    lease_renew(l, l->register_sent_ns);
    LYNX_INFO("agent",
              "%s: registered with coordinator %s (epoch %llu, "
              "heartbeat lease %llu ms, fence lease %llu ms)",
              ag->node_id, c->peer, (unsigned long long)ag->epoch,
              (unsigned long long)l->lease_ms, (unsigned long long)l->fence_ms);
    lynx_notify_ready("registered with coordinator %s (epoch %llu)", c->peer,
                      (unsigned long long)ag->epoch);
    {
      uint64_t every = l->lease_ms / 3 < 100 ? 100 : l->lease_ms / 3;
      l->beat_ms = every;
      uv_timer_start(&l->beat, on_beat, every, every);
    }
    on_beat(&l->beat);
    l->lost_ns = 0;
    if (ag->leaving)
      drain_again(l);
    return;
  case LYNX__ENVELOPE__MSG_HEARTBEAT_REPLY:
    if (l->state != LINK_REGISTERED || !l->acks)
      break;
    if (l->hb_answered >= l->hb_sent) {
      lynx_ctl_close(c, "a heartbeat reply for no heartbeat");
      return;
    }
    /* a reply whose send time fell out of the ring renews nothing */
    if (l->hb_sent - l->hb_answered <= HB_RING &&
        env->heartbeat_reply->epoch == ag->epoch)
      lease_renew(l, l->hb_sent_ns[l->hb_answered % HB_RING]);
    l->hb_answered++;
    return;
  case LYNX__ENVELOPE__MSG_START_INSTANCE:
    if (l->state == LINK_REGISTERED)
      on_start(l, env->start_instance);
    return;
  case LYNX__ENVELOPE__MSG_STOP_INSTANCE:
    if (l->state == LINK_REGISTERED) {
      struct instance *in =
          agent_instance_find(ag, env->stop_instance->instance_id);
      if (in)
        agent_instance_stop(ag, in);
      if (ag->leaving && !ag->instances) {
        LYNX_INFO("agent", "%s: drained: every instance stopped; leaving",
                  ag->node_id);
        l->hooks.shutdown(ag, 0);
      }
    }
    return;
  default:
    break;
  }
  snprintf(why, sizeof(why), "unexpected message (case %d) in state %d",
           (int)env->msg_case, (int)l->state);
  lynx_ctl_close(c, why);
}

/* The link is freed once its timers are closed and its connection gone. */
static void maybe_free(struct coord_link *l) {
  if (l->stopping == 2 && l->timers_closed == TIMERS && !l->d.ctl) {
    l->ag->link = NULL;
    free(l);
  }
}

/* The dialer frees c after this returns. */
static void link_closed(struct lynx_ctl *c) {
  struct coord_link *l = c->data;
  int was = l->state == LINK_REGISTERED;
  l->state = LINK_HELLO;
  uv_timer_stop(&l->beat);
  if (l->stopping == 2) {
    maybe_free(l); /* the dialer touches only c after this */
    return;
  }
  if (l->ag->leaving) {
    /* A drain lives in the leader's memory: one restarted, or a new
     * leader, that answers within LEAVE_REDIAL_MS is asked for it again
     * (it settles first); a coordinator gone for longer (the whole
     * cluster stopping, a crashed leader's lease still running) is not
     * waited for. */
    uint64_t now = lynx_now_ns();
    uint64_t wait_ms =
        l->lease_ms < LEAVE_REDIAL_MS ? l->lease_ms : LEAVE_REDIAL_MS;
    if (was) {
      l->lost_ns = now;
      LYNX_WARN("agent",
                "%s: lost the coordinator while draining; "
                "reconnecting to ask again for the drain (for %llu ms at "
                "most)",
                l->ag->node_id, (unsigned long long)wait_ms);
    } else if (l->lost_ns && now - l->lost_ns >= wait_ms * 1000000u) {
      l->hooks.stop_soon(l->ag, "no coordinator answered again while "
                                "draining");
      return;
    }
  } else if (was)
    LYNX_WARN("agent",
              "%s: lost the coordinator; instances keep serving "
              "while it is restarted (its port refuses connections) and "
              "until the lease runs out otherwise; reconnecting",
              l->ag->node_id);
  /* Nothing listens: no coordinator runs there to declare us down, and a
   * restarted one knows nothing of this node until it registers. With
   * several coordinators another may lead and declare us down: no. */
  if (l->d.connect_status == UV_ECONNREFUSED && l->d.n_addr == 1)
    lease_renew(l, lynx_now_ns());
  lynx_dialer_retry(&l->d);
}

int agent_link_start(struct agent *ag, const struct agent_link_hooks *hooks) {
  struct coord_link *l = calloc(1, sizeof(*l));
  if (!l)
    return -ENOMEM;
  l->ag = ag;
  l->hooks = *hooks;
  snprintf(l->target, sizeof(l->target), "coordinator %s", ag->cfg.coordinator);
  if (lynx_dialer_init(&l->d, &ag->loop, ag->cfg.coordinator, "agent",
                       l->target, ag->cfg.frame_max)) {
    free(l);
    return -EINVAL;
  }
  l->d.role = "agent";
  l->d.hello_timeout_ms = HELLO_TIMEOUT_MS;
  l->d.id = ag->node_id;
  l->d.token = ag->token;
  l->d.tls = ag->tls_on ? &ag->tls : NULL;
  l->d.on_msg = link_msg;
  l->d.on_close = link_closed;
  l->d.data = l;
  uv_timer_init(&ag->loop, &l->beat);
  l->beat.data = l;
  uv_timer_init(&ag->loop, &l->fence);
  l->fence.data = l;
  ag->link = l;
  ag->report_failed = agent_link_instance_failed;
  ag->report_ready = link_instance_ready;
  lynx_dialer_connect(&l->d);
  return 0;
}

static void beat_closed(uv_handle_t *h) {
  struct coord_link *l = h->data;
  l->timers_closed++;
  maybe_free(l);
}

static void retry_closed(uv_handle_t *h) {
  struct coord_link *l = container_of(h, struct coord_link, d.retry);
  l->timers_closed++;
  maybe_free(l);
}

void agent_link_instance_failed(struct agent *ag, uint64_t id,
                                const char *why) {
  struct coord_link *l = ag->link;
  if (l && l->state == LINK_REGISTERED && l->d.ctl)
    reply_instance(l, id, NULL, why);
}

static void link_instance_ready(struct agent *ag, struct instance *in) {
  struct coord_link *l = ag->link;
  if (l && l->state == LINK_REGISTERED && l->d.ctl)
    reply_instance(l, in->id, in, NULL);
}

int agent_link_leave_drained(struct agent *ag) {
  struct coord_link *l = ag->link;
  if (!l || l->stopping || l->state != LINK_REGISTERED || !l->d.ctl ||
      !l->drains || !ag->instances)
    return -1;
  send_leave(l, 1);
  return 0;
}

void agent_link_stop(struct agent *ag) {
  struct coord_link *l = ag->link;
  if (!l || l->stopping == 2)
    return;
  l->stopping = 2;
  if (l->d.ctl) {
    if (l->state == LINK_REGISTERED) {
      send_leave(l, 0);
      l->d.ctl->close_after_write = 1;
      LYNX_INFO("agent", "%s: leaving the cluster", ag->node_id);
    } else {
      lynx_ctl_close(l->d.ctl, NULL);
    }
  }
  lynx_dialer_close(&l->d, retry_closed);
  uv_close((uv_handle_t *)&l->beat, beat_closed);
  uv_close((uv_handle_t *)&l->fence, beat_closed);
}
