/*
 * serve.c - static mode: serve the instances' descriptors to one frontend.
 *
 * A frontend says Hello and gets HelloReply and Descriptors; it keeps the
 * connection open as a liveness signal. Each mqueue has one producer, so
 * one frontend at a time gets the accelerators; another is refused with a
 * retryable reason until the first one goes.
 *
 * The port is guarded (ag->ctl_guard, connguard.h): connections over its
 * caps are closed at once, one that says no valid Hello within
 * HELLO_TIMEOUT_MS is closed, and a source that keeps presenting a wrong
 * token gets its refusals later and later.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent.h"
#include "frame.h"
#include "log.h"
#include "util.h"

#define HELLO_TIMEOUT_MS 10000 /* a peer that says nothing is closed */

struct peer {
  struct lynx_ctl ctl;
  struct agent *ag;
  struct peer *next, **pprev;
  int greeted;
  int admitted, authed; /* counted by ag->ctl_guard; its Hello passed */
  struct lynx_guard_src *src;
  uint64_t since_ns;
};

static void peer_closed(struct lynx_ctl *c) {
  struct peer *p = container_of(c, struct peer, ctl);
  if (p->ag->owner == p) {
    p->ag->owner = NULL;
    LYNX_INFO("agent", "%s: mqueues released by %s", p->ag->node_id, c->peer);
  }
  *p->pprev = p->next;
  if (p->next)
    p->next->pprev = p->pprev;
  if (p->admitted)
    lynx_guard_closed(&p->ag->ctl_guard, p->src, p->authed);
  if (p->authed)
    LYNX_INFO("agent", "%s: control connection %s closed", p->ag->node_id,
              c->peer);
  free(p);
}

/* Accepts a Hello, or refuses it and closes once the refusal is written;
 * hold_ms holds a refusal back (a source that keeps presenting a wrong
 * token: connguard.h). */
static void send_reply(struct peer *p, int ok, int retryable, const char *error,
                       uint64_t hold_ms) {
  Lynx__Envelope env = LYNX__ENVELOPE__INIT;
  Lynx__HelloReply r = LYNX__HELLO_REPLY__INIT;
  r.proto_version = LYNX_PROTO_VERSION;
  r.ok = ok;
  r.error = (char *)(error ? error : "");
  r.retryable = retryable;
  r.id = p->ag->node_id;
  env.msg_case = LYNX__ENVELOPE__MSG_HELLO_REPLY;
  env.hello_reply = &r;
  if (ok ? lynx_ctl_send(&p->ctl, &env)
         : lynx_ctl_refuse(&p->ctl, &env, hold_ms))
    lynx_ctl_close(&p->ctl, "cannot queue hello reply");
}

static void send_descriptors(struct peer *p) {
  struct agent *ag = p->ag;
  Lynx__Envelope env = LYNX__ENVELOPE__INIT;
  Lynx__Descriptors d = LYNX__DESCRIPTORS__INIT;
  size_t n = 0, max = 0;
  Lynx__RegionDesc *pbs, **ptrs;
  char(*locs)[LYNX_LOCATOR_MAX];
  for (struct instance *in = ag->instances; in; in = in->next)
    max++;
  pbs = calloc(max + 1, sizeof(*pbs));
  ptrs = calloc(max + 1, sizeof(*ptrs));
  locs = calloc(max + 1, sizeof(*locs));
  if (!pbs || !ptrs || !locs) {
    lynx_ctl_close(&p->ctl, "out of memory building descriptors");
    goto out;
  }
  for (struct instance *in = ag->instances; in; in = in->next) {
    agent_instance_pb(ag, in, &p->ctl, locs[n], &pbs[n]);
    ptrs[n] = &pbs[n];
    n++;
  }
  d.node_id = ag->node_id;
  d.epoch = ag->epoch;
  d.app = ag->cfg.app;
  d.service = ag->cfg.app;
  d.n_regions = n;
  d.regions = ptrs;
  env.msg_case = LYNX__ENVELOPE__MSG_DESCRIPTORS;
  env.descriptors = &d;
  if (lynx_ctl_send(&p->ctl, &env))
    lynx_ctl_close(&p->ctl, "cannot queue descriptors");
out:
  free(locs);
  free(pbs);
  free(ptrs);
}

static void peer_msg(struct lynx_ctl *c, Lynx__Envelope *env) {
  struct peer *p = container_of(c, struct peer, ctl);
  char err[160];
  if (!p->greeted) {
    if (env->msg_case != LYNX__ENVELOPE__MSG_HELLO) {
      lynx_ctl_close(c, "first message is not a Hello");
      return;
    }
    if (lynx_hello_check(env->hello, p->ag->token, err, sizeof(err))) {
      uint64_t hold =
          lynx_guard_auth_failed(&p->ag->ctl_guard, p->src, lynx_now_ns());
      LYNX_LOG_RL(LYNX_LOG_WARN, "agent", "%s: refusing %s (%s %s): %s%s",
                  p->ag->node_id, c->peer,
                  env->hello->role ? env->hello->role : "?",
                  env->hello->id ? env->hello->id : "?", err,
                  hold ? " (answer held back: this address keeps presenting "
                         "a wrong token)"
                       : "");
      send_reply(p, 0, 0, err, hold / 1000000u);
      return;
    }
    p->authed = 1;
    lynx_guard_auth_ok(&p->ag->ctl_guard, p->src);
    lynx_ctl_trust(c);
    /* Each mqueue has one producer: in static mode one frontend at a time
     * gets the accelerators (the coordinator partitions them otherwise). */
    if (p->ag->owner) {
      snprintf(err, sizeof(err), "mqueues are in use by frontend at %s",
               p->ag->owner->ctl.peer);
      LYNX_WARN("agent", "%s: refusing %s: %s", p->ag->node_id, c->peer, err);
      send_reply(p, 0, 1, err, 0);
      return;
    }
    p->ag->owner = p;
    p->greeted = 1;
    LYNX_INFO("agent", "%s: %s %s connected from %s", p->ag->node_id,
              env->hello->role ? env->hello->role : "peer",
              env->hello->id ? env->hello->id : "", c->peer);
    send_reply(p, 1, 0, NULL, 0);
    send_descriptors(p);
    return;
  }
  snprintf(err, sizeof(err), "unexpected message (case %d) after handshake",
           (int)env->msg_case);
  lynx_ctl_close(c, err);
}

static void on_connection(uv_stream_t *server, int status) {
  struct agent *ag = server->data;
  struct peer *p;
  struct sockaddr_storage ss;
  int len = sizeof(ss);
  if (status < 0) {
    LYNX_WARN("agent", "accept failed: %s", uv_strerror(status));
    return;
  }
  p = calloc(1, sizeof(*p));
  if (!p)
    return;
  p->ag = ag;
  uv_tcp_init(&ag->loop, &p->ctl.tcp);
  lynx_ctl_init(&p->ctl, "agent", ag->cfg.frame_max, peer_msg, peer_closed);
  p->next = ag->peers;
  if (p->next)
    p->next->pprev = &p->next;
  p->pprev = &ag->peers;
  ag->peers = p;
  if (uv_accept(server, (uv_stream_t *)&p->ctl.tcp) ||
      lynx_ctl_start(&p->ctl)) {
    lynx_ctl_close(&p->ctl, "accept failed");
    return;
  }
  memset(&ss, 0, sizeof(ss));
  uv_tcp_getpeername(&p->ctl.tcp, (struct sockaddr *)&ss, &len);
  p->since_ns = lynx_now_ns();
  {
    enum lynx_guard_refusal r =
        lynx_guard_admit(&ag->ctl_guard, &ss, p->since_ns, &p->src);
    if (r != LYNX_GUARD_ADMIT) {
      char why[160];
      snprintf(why, sizeof(why),
               "refused: %s (caps: %u connections, %u "
               "before Hello, %u of those per address)",
               lynx_guard_reason_names[r], ag->ctl_guard.conn_max,
               ag->ctl_guard.unauth_max, ag->ctl_guard.per_source);
      lynx_ctl_close(&p->ctl, why); /* rate-limited: not trusted */
      return;
    }
    p->admitted = 1;
  }
}

/* Closes connections that said no valid Hello in time. */
static void on_sweep(uv_timer_t *t) {
  struct agent *ag = t->data;
  uint64_t now = lynx_now_ns();
  for (struct peer *p = ag->peers; p; p = p->next)
    if (!p->authed && !p->ctl.held &&
        now - p->since_ns > HELLO_TIMEOUT_MS * 1000000ull)
      lynx_ctl_close(&p->ctl, "no Hello within 10 s");
}

int agent_serve_start(struct agent *ag) {
  struct sockaddr_storage ss;
  int rc;
  if (lynx_parse_hostport(ag->cfg.listen, &ss))
    return -EINVAL;
  uv_tcp_init(&ag->loop, &ag->server);
  ag->server.data = ag;
  ag->server_open = 1;
  uv_timer_init(&ag->loop, &ag->serve_sweep);
  ag->serve_sweep.data = ag;
  ag->sweep_open = 1;
  uv_timer_start(&ag->serve_sweep, on_sweep, 1000, 1000);
  rc = uv_tcp_bind(&ag->server, (struct sockaddr *)&ss, 0);
  if (!rc)
    rc = uv_listen((uv_stream_t *)&ag->server, 64, on_connection);
  if (rc)
    LYNX_ERR("agent", "cannot listen on %s: %s", ag->cfg.listen,
             uv_strerror(rc));
  return rc;
}

void agent_serve_stop(struct agent *ag) {
  for (struct peer *p = ag->peers; p; p = p->next)
    lynx_ctl_close(&p->ctl, NULL);
  if (ag->server_open) {
    uv_close((uv_handle_t *)&ag->server, NULL);
    ag->server_open = 0;
  }
  if (ag->sweep_open) {
    uv_close((uv_handle_t *)&ag->serve_sweep, NULL);
    ag->sweep_open = 0;
  }
}
