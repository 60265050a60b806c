/*
 * ctlport.c - the coordinator's control port: connections from agents and
 * frontends (protobuf-c frames, ctlconn.h), their Hello (token, version,
 * TLS client certificates, leadership), registrations, heartbeats, the
 * frontends' reports, and closed peers.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordd.h"
#include "ctlmsg.h"
#include "frame.h"
#include "log.h"

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
    coord_push_tables(co); /* a standby may become the active frontend */
  }
  coord_after_change(co);
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
    coord_send_env(p, &env);
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
void coord_unsure_why(struct coordinator *co, char *why, size_t len) {
  uint64_t until = __atomic_load_n(&co->c.lead_until_ns, __ATOMIC_ACQUIRE);
  uint64_t now = lynx_now_ns();
  snprintf(why, len,
           "this coordinator is not sure it still leads (its "
           "leader lease ran past what it can vouch for %llu ms ago: it did "
           "not run, or etcd did not answer): it answers nothing until etcd "
           "says",
           (unsigned long long)(until && now > until ? (now - until) / 1000000u
                                                     : 0));
}

static int may_answer(struct coordinator *co, char *why, size_t len) {
  if (lynx_coord_leads(&co->c))
    return 1;
  if (!__atomic_load_n(&co->c.leader, __ATOMIC_ACQUIRE)) {
    snprintf(why, len, "this coordinator does not lead");
    return 0;
  }
  coord_unsure_why(co, why, len);
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
    uint64_t hold =
        lynx_guard_auth_failed(&co->c.ctl_guard, p->src, lynx_now_ns());
    LYNX_LOG_RL(LYNX_LOG_WARN, "coordinator", "refusing %s (%s %s): %s%s",
                p->ctl.peer, role, h->id ? h->id : "?", err,
                hold ? " (answer held back: this address keeps presenting "
                       "wrong credentials)"
                     : "");
    send_hello_reply(p, 0, err, hold / 1000000u);
    return;
  }
  if (!h->id || !*h->id || strlen(h->id) >= LYNX_ID_MAX) {
    LYNX_WARN("coordinator",
              "refusing %s (%s): hello without a valid id "
              "(1 to %d characters)",
              p->ctl.peer, role, LYNX_ID_MAX - 1);
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
      snprintf(err, sizeof(err),
               "this coordinator does not lead (the "
               "leader's API: %s)",
               api[0] ? api : "none elected yet");
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
    p->heard_ms = coord_now_ms();
    claims = lynx_ctl_claims(h);
    send_hello_reply(p, 1, NULL, 0);
    pthread_mutex_lock(&co->c.lock);
    lynx_reg_frontend_connect(&co->c.reg, p->id, p->ctl.peer, p,
                              coord_now_ms());
    /* without its claims it is given what it produced into with a new
     * epoch: its connections are made again (in-flight answers in doubt) */
    if (!claims || lynx_reg_frontend_claims(&co->c.reg, p->id, claims,
                                            (uint32_t)h->n_produces))
      LYNX_WARN("coordinator",
                "frontend %s: out of memory keeping the "
                "%zu instances it produces into",
                p->id, h->n_produces);
    free(claims);
    co->c.reg.version++;
    coord_push_tables(co);
    coord_after_change(co);
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
  LYNX_LOG_RL(LYNX_LOG_WARN, "coordinator", "refusing %s: %s%s", ctl->peer, err,
              hold ? " (answer held back: this address keeps "
                     "presenting wrong credentials)"
                   : "");
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
  LYNX_LOG_RL(LYNX_LOG_WARN, "coordinator",
              "refusing %s: plain text, not "
              "TLS",
              ctl->peer);
  p->refused = 1;
  send_hello_reply(p, 0, why, hold / 1000000u);
}

static void on_register(struct cpeer *p, const Lynx__Register *m) {
  struct coordinator *co = p->co;
  struct lynx_label labels[LYNX_LABELS_MAX];
  struct lynx_accel_info accels[LYNX_ACCELS_MAX];
  struct lynx_app_refusal refused[LYNX_REFUSED_APPS_MAX];
  struct lynx_reg_err err = {0};
  Lynx__Envelope env = LYNX__ENVELOPE__INIT;
  Lynx__RegisterReply rr = LYNX__REGISTER_REPLY__INIT;
  uint64_t now = coord_now_ms();
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
  if (!epoch && (rc = coord_issue_epoch(co, 0, &epoch, err.message,
                                        sizeof(err.message)))) {
    pthread_mutex_unlock(&co->c.lock);
    goto reply;
  }
  rc = lynx_reg_register_adopt(
      &co->c.reg, m->node_id, m->address ? m->address : "", epoch, labels,
      (uint32_t)m->n_labels, accels, (uint32_t)m->n_accels, adopt, n_adopt, p,
      now, &err);
  if (rc == 0)
    lynx_reg_node_refused(&co->c.reg, m->node_id, refused,
                          lynx_ctl_refused_apps(m, refused));
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
  coord_send_env(p, &env);
  free(adopt);
  if (rc) {
    LYNX_WARN("coordinator", "refused registration of %s from %s: %s",
              m->node_id ? m->node_id : "?", p->ctl.peer, err.message);
    p->ctl.close_after_write = 1;
    return;
  }
  p->registered = 1;
  LYNX_INFO("coordinator",
            "node %s registered from %s: epoch %llu%s, %zu "
            "accelerators, %zu running instances",
            p->id, p->ctl.peer, (unsigned long long)epoch,
            m->epoch ? "" : " (issued)", m->n_accels, m->n_instances);
  pthread_mutex_lock(&co->c.lock);
  coord_after_change(co);
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
  coord_send_env(p, &env);
}

static void on_agent_msg(struct cpeer *p, Lynx__Envelope *env) {
  struct coordinator *co = p->co;
  uint64_t now = coord_now_ms(), ack_epoch = 0;
  char why[200];
  int rc = 0;
  pthread_mutex_lock(&co->c.lock);
  switch (env->msg_case) {
  case LYNX__ENVELOPE__MSG_HEARTBEAT: {
    const Lynx__Heartbeat *hb = env->heartbeat;
    struct lynx_accel_report rep[LYNX_ACCELS_MAX];
    struct lynx_app_fault faults[LYNX_APP_FAULTS_MAX];
    uint32_t n = lynx_ctl_heartbeat(hb, rep);
    rc = lynx_reg_heartbeat(&co->c.reg, p->id, hb->epoch, rep, n, now);
    if (rc == 0)
      lynx_reg_node_app_faults(&co->c.reg, p->id, faults,
                               lynx_ctl_app_faults(hb, faults));
    ack_epoch = rc == 0 ? hb->epoch : 0;
    break;
  }
  case LYNX__ENVELOPE__MSG_INSTANCE_READY: {
    const Lynx__InstanceReady *ir = env->instance_ready;
    struct lynx_region_desc d;
    if (!ir->region || lynx_desc_from_pb(ir->region, &d, why, sizeof(why))) {
      LYNX_WARN("coordinator",
                "node %s: instance %llu reported with a bad "
                "region: %s",
                p->id, (unsigned long long)ir->instance_id,
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
        LYNX_INFO("coordinator",
                  "node %s drains to leave: its agent is "
                  "stopping",
                  p->id);
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
  coord_after_change(co);
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
  p->heard_ms = coord_now_ms();
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
                           (uint32_t)st->n_mqueues, coord_now_ms());
  if (fl)
    lynx_reg_frontend_listen(&co->c.reg, p->id, fl, nl);
  coord_after_change(co);
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
    coord_send_env(p, &e);
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

void coord_on_connection(uv_stream_t *server, int status) {
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
  p->accepted_ms = coord_now_ms();
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
      snprintf(why, sizeof(why),
               "refused: %s (caps: %u connections, %u "
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
