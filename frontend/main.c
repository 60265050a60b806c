/*
 * lynx-frontend - static mode: one agent, one UDP service.
 *
 * The main thread connects to the agent's control port, says Hello, maps
 * the regions the Descriptors name and starts the workers (worker.c). It
 * keeps the control connection as a liveness signal: when it drops, every
 * accelerator of that agent leaves dispatch at once (in-flight requests are
 * counted lost), and the frontend reconnects with backoff; an agent that
 * comes back (a new epoch, new regions) is served again with fresh workers.
 * SIGINT/SIGTERM: stop receiving, answer what is in flight within
 * --drain-ms, release everything, exit 0.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <json-c/json.h>

#include "ctlconn.h"
#include "frontend.h"
#include "log.h"
#include "options.h"

static const char *const dispatch_names[] = {"rr", "lo", NULL};
static const char *const poll_names[] = {"adaptive", "busy", NULL};
static const char *const order_names[] = {"flow", "none", NULL};

#define O(f) offsetof(struct fe_cfg, f)
static const struct lynx_opt fe_opts[] = {
    {"agent", LYNX_OPT_STR, O(agent), "127.0.0.1:7701", 0, 0, NULL,
     "agent control address (static mode)"},
    {"udp", LYNX_OPT_STR, O(udp), "7000", 0, 0, NULL,
     "UDP port, or host:port, to serve"},
    {"workers", LYNX_OPT_U32, O(workers), "1", 1, 64, NULL,
     "worker threads (each owns a share of every accelerator's mqueues)"},
    {"dispatch", LYNX_OPT_ENUM, O(dispatch), "rr", 0, 0, dispatch_names,
     "dispatch policy: round robin or least outstanding"},
    {"order", LYNX_OPT_ENUM, O(order), "flow", 0, 0, order_names,
     "flow: a client's requests in flight stay on one mqueue, so its answers "
     "keep their order; none: every request goes where the policy says"},
    {"poll", LYNX_OPT_ENUM, O(poll), "adaptive", 0, 0, poll_names,
     "adaptive: spin, then sleep; busy: never sleep (dedicated cores)"},
    {"spin-us", LYNX_OPT_U32, O(spin_us), "50", 0, 1000000, NULL,
     "adaptive polling: spin this long after the last work"},
    {"metrics", LYNX_OPT_STR, O(metrics), NULL, 0, 0, NULL,
     "host:port for Prometheus /metrics [default: off]"},
    {"request-timeout-ms", LYNX_OPT_U32, O(timeout_ms), "1000", 1, 3600000,
     NULL, "a request without response is dropped (expired) after this"},
    {"drain-ms", LYNX_OPT_U32, O(drain_ms), "1000", 0, 60000, NULL,
     "on SIGTERM, wait this long for in-flight responses"},
    {"rcvbuf-kb", LYNX_OPT_U32, O(rcvbuf_kb), "4096", 0, 1048576, NULL,
     "UDP socket buffer size, KiB (0: system default)"},
    {"frontend-id", LYNX_OPT_STR, O(frontend_id), NULL, 0, 0, NULL,
     "name of this frontend [default: fe-<pid>]"},
    {"frame-max", LYNX_OPT_U32, O(frame_max), "1048576", 64, 1u << 26, NULL,
     "largest accepted control frame, bytes"},
    {"token-file", LYNX_OPT_STR, O(token_file), NULL, 0, 0, NULL,
     "file holding the cluster token"},
    {"log-level", LYNX_OPT_STR, O(log_level), "info", 0, 0, NULL,
     "error, warn, info or debug"},
    LYNX_OPT_END,
};
#undef O

struct fe_main {
  struct frontend fe;
  uv_loop_t loop;
  uv_signal_t sigint, sigterm;
  uv_timer_t retry;
  struct lynx_ctl *ctl;
  struct sockaddr_storage agent_addr;
  char id[64];
  uint64_t backoff_ms;
  int shutting_down, greeted, exit_code;
};

static void schedule_connect(struct fe_main *m);

static void stop_workers(struct fe_main *m) {
  struct frontend *fe = &m->fe;
  if (!fe->workers_running)
    return;
  fe->stop_deadline_ns = lynx_now_ns() + (uint64_t)fe->cfg.drain_ms * 1000000u;
  __atomic_store_n(&fe->stopping, 1, __ATOMIC_RELEASE);
  fe_workers_wake(fe);
  fe_metrics_stop(fe);
  fe_workers_stop(fe);
  fe->workers_running = 0;
  free(fe->acc);
  fe->acc = NULL;
  fe->n_acc = 0;
}

static void on_ctl_closed(struct lynx_ctl *c) {
  struct fe_main *m = c->data;
  free(c);
  m->ctl = NULL;
  m->greeted = 0;
  if (m->fe.workers_running) {
    /* out of dispatch at once; workers count the in-flight requests lost */
    for (uint32_t i = 0; i < m->fe.n_acc; i++)
      __atomic_store_n(&m->fe.acc[i].up, 0, __ATOMIC_RELEASE);
    fe_workers_wake(&m->fe);
  }
  if (!m->shutting_down)
    schedule_connect(m);
}

/* Builds the accelerator table from Descriptors and (re)starts workers. */
static int apply_descriptors(struct fe_main *m, const Lynx__Descriptors *d) {
  struct frontend *fe = &m->fe;
  uint32_t min_q = UINT32_MAX;
  char err[200];
  int rc;
  if (d->n_regions == 0) {
    LYNX_ERR("frontend", "agent %s offers no accelerators", d->node_id);
    return -ENOENT;
  }
  /* new descriptors mean a new connection: the old workers' connections
   * were taken down when the old control connection dropped */
  stop_workers(m);
  __atomic_store_n(&fe->stopping, 0, __ATOMIC_RELEASE);
  fe->acc = calloc(d->n_regions, sizeof(*fe->acc));
  if (!fe->acc)
    return -ENOMEM;
  for (size_t i = 0; i < d->n_regions; i++) {
    struct fe_accel *a = &fe->acc[i];
    rc = lynx_desc_from_pb(d->regions[i], &a->desc, err, sizeof(err));
    if (rc) {
      LYNX_ERR("frontend", "agent %s: bad descriptor: %s", d->node_id, err);
      goto fail;
    }
    a->ops = lynx_transport_find(a->desc.transport);
    if (!a->ops) {
      LYNX_ERR("frontend", "agent %s accel %u: transport '%s' is not built in",
               d->node_id, a->desc.accel_id, a->desc.transport);
      rc = -ENOTSUP;
      goto fail;
    }
    lynx_geom_init(&a->g, a->desc.n_mqueues, a->desc.slots,
                   a->desc.slot_size);
    snprintf(a->node, sizeof(a->node), "%s", d->node_id ? d->node_id : "?");
    a->up = 1;
    if (a->g.n_mqueues < min_q)
      min_q = a->g.n_mqueues;
  }
  fe->n_acc = (uint32_t)d->n_regions;
  fe->epoch = d->epoch;
  snprintf(fe->service, sizeof(fe->service), "%s",
           d->service && *d->service ? d->service : "default");
  snprintf(fe->node, sizeof(fe->node), "%s", d->node_id ? d->node_id : "?");
  fe->n_w = fe->cfg.workers;
  if (fe->n_w > min_q) {
    LYNX_WARN("frontend", "%u workers but only %u mqueues per accelerator: "
              "using %u workers so each owns a mqueue on every accelerator",
              fe->n_w, min_q, min_q);
    fe->n_w = min_q;
  }
  rc = fe_workers_start(fe);
  if (rc) {
    fe->workers_running = 1; /* let stop_workers clean up what started */
    stop_workers(m);
    return rc;
  }
  rc = fe_metrics_start(fe);
  if (rc)
    return rc;
  LYNX_INFO("frontend",
            "%s: serving UDP %s for service %s: %u accelerators of %s "
            "(epoch %llu), %u workers, dispatch %s, poll %s",
            m->id, fe->cfg.udp, fe->service, fe->n_acc, fe->node,
            (unsigned long long)fe->epoch, fe->n_w,
            dispatch_names[fe->cfg.dispatch], poll_names[fe->cfg.poll]);
  return 0;
fail:
  free(fe->acc);
  fe->acc = NULL;
  return rc;
}

static void begin_shutdown(struct fe_main *m, int code) {
  if (m->shutting_down)
    return;
  m->shutting_down = 1;
  m->exit_code = code;
  stop_workers(m);
  if (m->ctl)
    lynx_ctl_close(m->ctl, NULL);
  uv_close((uv_handle_t *)&m->retry, NULL);
  uv_close((uv_handle_t *)&m->sigint, NULL);
  uv_close((uv_handle_t *)&m->sigterm, NULL);
}

static void on_ctl_msg(struct lynx_ctl *c, Lynx__Envelope *env) {
  struct fe_main *m = c->data;
  int rc;
  if (!m->greeted) {
    if (env->msg_case != LYNX__ENVELOPE__MSG_HELLO_REPLY) {
      lynx_ctl_close(c, "agent's first message is not a HelloReply");
      return;
    }
    if (!env->hello_reply->ok && env->hello_reply->retryable) {
      LYNX_LOG_RL(LYNX_LOG_WARN, "frontend", "agent %s: %s; retrying",
                  c->peer, env->hello_reply->error);
      lynx_ctl_close(c, NULL);
      return;
    }
    if (!env->hello_reply->ok || env->hello_reply->proto_version !=
                                     LYNX_PROTO_VERSION) {
      LYNX_ERR("frontend", "agent %s refused us: %s", c->peer,
               env->hello_reply->error && *env->hello_reply->error
                   ? env->hello_reply->error
                   : "protocol version mismatch");
      /* a wrong token or version does not heal by retrying */
      begin_shutdown(m, 1);
      return;
    }
    m->greeted = 1;
    return;
  }
  if (env->msg_case != LYNX__ENVELOPE__MSG_DESCRIPTORS) {
    LYNX_DBG("frontend", "ignoring message case %d", (int)env->msg_case);
    return;
  }
  rc = apply_descriptors(m, env->descriptors);
  if (rc) {
    LYNX_ERR("frontend", "cannot serve agent %s's accelerators: %s", c->peer,
             strerror(-rc));
    lynx_ctl_close(c, "unusable descriptors");
    return;
  }
  m->backoff_ms = 0;
}

static void on_connected(uv_connect_t *req, int status) {
  struct lynx_ctl *c = req->data;
  struct fe_main *m = c->data;
  Lynx__Envelope env = LYNX__ENVELOPE__INIT;
  Lynx__Hello h = LYNX__HELLO__INIT;
  free(req);
  if (status < 0) {
    LYNX_LOG_RL(LYNX_LOG_WARN, "frontend", "cannot reach agent %s: %s",
                m->fe.cfg.agent, uv_strerror(status));
    lynx_ctl_close(c, NULL);
    return;
  }
  if (lynx_ctl_start(c)) {
    lynx_ctl_close(c, "cannot start reading");
    return;
  }
  h.proto_version = LYNX_PROTO_VERSION;
  h.role = "frontend";
  h.id = m->id;
  h.token = m->fe.token ? m->fe.token : "";
  env.msg_case = LYNX__ENVELOPE__MSG_HELLO;
  env.hello = &h;
  if (lynx_ctl_send(c, &env))
    lynx_ctl_close(c, "cannot send hello");
}

static void do_connect(uv_timer_t *t) {
  struct fe_main *m = t->data;
  struct lynx_ctl *c;
  uv_connect_t *req;
  if (m->shutting_down || m->ctl)
    return;
  c = calloc(1, sizeof(*c));
  req = calloc(1, sizeof(*req));
  if (!c || !req) {
    free(c);
    free(req);
    schedule_connect(m);
    return;
  }
  uv_tcp_init(&m->loop, &c->tcp);
  lynx_ctl_init(c, "frontend", m->fe.cfg.frame_max, on_ctl_msg, on_ctl_closed);
  c->data = m;
  m->ctl = c;
  req->data = c;
  if (uv_tcp_connect(req, &c->tcp, (struct sockaddr *)&m->agent_addr,
                     on_connected)) {
    free(req);
    lynx_ctl_close(c, "connect failed");
  }
}

static void schedule_connect(struct fe_main *m) {
  /* jittered exponential backoff, 100 ms .. 2 s */
  m->backoff_ms = m->backoff_ms ? m->backoff_ms * 2 : 100;
  if (m->backoff_ms > 2000)
    m->backoff_ms = 2000;
  uv_timer_start(&m->retry, do_connect,
                 m->backoff_ms / 2 + (uint64_t)rand() % (m->backoff_ms / 2 + 1),
                 0);
}

static void on_signal(uv_signal_t *s, int signum) {
  struct fe_main *m = s->data;
  LYNX_INFO("frontend", "%s: %s, draining and shutting down", m->id,
            strsignal(signum));
  begin_shutdown(m, 0);
}

int main(int argc, char **argv) {
  static struct fe_main m;
  struct frontend *fe = &m.fe;
  int rc, lvl;
  char udp[80];

  rc = lynx_opts_parse(fe_opts, &fe->cfg, argc, argv,
                       "usage: lynx-frontend [options]\n"
                       "Serves UDP clients from mqueues in accelerator "
                       "memory (static mode: one agent).");
  if (rc)
    return rc > 0 ? 0 : 2;
  m.exit_code = 2;
  signal(SIGPIPE, SIG_IGN);
  lvl = lynx_log_parse_level(fe->cfg.log_level);
  if (lvl < 0) {
    fprintf(stderr, "--log-level: unknown level '%s'\n", fe->cfg.log_level);
    goto out;
  }
  lynx_log_level = lvl;
  if (lynx_parse_hostport(fe->cfg.agent, &m.agent_addr)) {
    fprintf(stderr, "--agent: '%s' is not host:port\n", fe->cfg.agent);
    goto out;
  }
  snprintf(udp, sizeof(udp), "%s%s", strchr(fe->cfg.udp, ':') ? "" : ":",
           fe->cfg.udp);
  if (lynx_parse_hostport(udp, &fe->udp_addr)) {
    fprintf(stderr, "--udp: '%s' is not a port or host:port\n", fe->cfg.udp);
    goto out;
  }
  if (fe->cfg.token_file && (rc = lynx_read_token(fe->cfg.token_file, &fe->token))) {
    fprintf(stderr, "--token-file %s: %s\n", fe->cfg.token_file,
            rc == -EINVAL ? "file is empty" : strerror(-rc));
    goto out;
  }
  if (fe->cfg.metrics) {
    struct sockaddr_storage ss;
    if (lynx_parse_hostport(fe->cfg.metrics, &ss)) {
      fprintf(stderr, "--metrics: '%s' is not host:port\n", fe->cfg.metrics);
      goto out;
    }
  }
  if (fe->cfg.frontend_id)
    snprintf(m.id, sizeof(m.id), "%s", fe->cfg.frontend_id);
  else
    snprintf(m.id, sizeof(m.id), "fe-%d", (int)getpid());
  srand((unsigned)lynx_now_ns());

  uv_loop_init(&m.loop);
  uv_timer_init(&m.loop, &m.retry);
  m.retry.data = &m;
  uv_signal_init(&m.loop, &m.sigint);
  uv_signal_init(&m.loop, &m.sigterm);
  m.sigint.data = m.sigterm.data = &m;
  uv_signal_start(&m.sigint, on_signal, SIGINT);
  uv_signal_start(&m.sigterm, on_signal, SIGTERM);
  {
    struct json_object *j = lynx_opts_json(fe_opts, &fe->cfg);
    LYNX_INFO("frontend", "%s: starting; config %s", m.id,
              json_object_to_json_string_ext(j, JSON_C_TO_STRING_PLAIN));
    json_object_put(j);
  }
  m.exit_code = 0;
  do_connect(&m.retry);
  uv_run(&m.loop, UV_RUN_DEFAULT);
  if (uv_loop_close(&m.loop) != 0)
    LYNX_WARN("frontend", "loop closed with handles open");
  stop_workers(&m);
  LYNX_INFO("frontend", "%s: stopped", m.id);
out:
  free(fe->token);
  lynx_opts_free(fe_opts, &fe->cfg);
  return m.exit_code;
}
