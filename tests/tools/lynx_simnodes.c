/*
 * lynx-simnodes - many simulated agents against one coordinator, for the
 * control-plane benchmark (bench/control-plane.sh) and scale tests.
 *
 * Each simulated node is what lynx-agent is to the coordinator, minus the
 * accelerators: its own TCP connection (the protocol has one connection per
 * node), Hello{role "agent", node id, token}, Register{node id, address,
 * epoch, labels, A accelerators of kind "sim"}, then a Heartbeat every
 * lease/3 (zero counters unless --rate). A StartInstance is answered with
 * InstanceFailed("simulated node"); StopInstance is ignored. A lost
 * connection is re-established with a jittered backoff (100 ms .. 2 s) and
 * the same epoch, as the real agent does (agent/link.c).
 *
 * Something to look at (lynxctl top, integration.lynxctl_top): the
 * accelerators are numbered k = node index x A + accel index.
 *   --rate R     accelerator k's requests and responses counters grow at
 *                R x (1 + k % 7) per second (from the tool's start), so the
 *                accelerators have distinct, known rates; each heartbeat
 *                carries the window's latency as an agent does: the requests
 *                of the last 10 s (window_requests), queue p50/p99
 *                (1 + k % 5) / (5 + k % 11) us and service p50/p99
 *                (10 + k % 10) / (20 + k % 50) us.
 *   --stalled K  accelerator 0 of nodes 0 .. K-1 reports 1 stalled mqueue,
 *                its stall_ms the time since the tool started;
 *   --failed K   accelerator 0 of nodes K_stalled .. K_stalled+K-1 reports
 *                failed, last_error "simulated failure".
 *   --leaving K  the last K nodes, once registered, ask to be drained to
 *                leave (Leave with drain, as a stopping agent does) and
 *                go on heartbeating: their nodes stay draining or drained
 *                with "leaving" (a coordinator that does not say it drains
 *                on such a Leave is not asked).
 * A stalled or failed accelerator takes nothing, as a real one: its
 * counters and window stay 0 whatever --rate says. The coordinator takes
 * them out of dispatch like an agent's (health in /v1/accelerators).
 *
 * Registrations are paced: at most --concurrency nodes are between connect
 * and RegisterReply at any time, so that a few thousand connects do not
 * overflow the coordinator's listen backlog (SYNs dropped there come back
 * only after TCP's 1 s retransmission and would distort the timing).
 *
 * Output (stdout, one line each, for scripts):
 *   simnodes: registered nodes=N accels=M elapsed_ms=T reg_p50_ms=..
 * reg_p99_ms=.. reg_max_ms=.. once every node holds a lease (elapsed_ms: from
 * the first connect); simnodes: stopped nodes=N registered=R heartbeats=H
 * start_requests=S reconnects=C refusals=F at exit. Warnings (lost connections,
 * refusals) go to stderr.
 *
 * File descriptors: one per node. RLIMIT_NOFILE is raised to nodes + 64
 * (within the hard limit) or the tool refuses to start. The coordinator
 * needs as many: start it from a shell with `ulimit -n` >= nodes + 100.
 *
 * Exit status: 0 after a clean stop (SIGINT, SIGTERM or --duration), 1 when
 * the coordinator refused us for good (wrong token or protocol version), 2
 * on usage errors.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <uv.h>

#include "ctlconn.h"
#include "frame.h"
#include "log.h"
#include "options.h"
#include "util.h"

#define COMP "simnodes"
#define LABELS_MAX 16

struct sim_cfg {
  char *coordinator, *prefix, *labels, *token_file, *log_level;
  uint32_t nodes, accels, duration, concurrency, no_leave;
  uint32_t rate, stalled, failed, leaving;
};

#define O(f) offsetof(struct sim_cfg, f)
static const struct lynx_opt sim_opts[] = {
    {"coordinator", LYNX_OPT_STR, O(coordinator), "127.0.0.1:7700", 0, 0, NULL,
     "coordinator control address host:port"},
    {"nodes", LYNX_OPT_U32, O(nodes), "1", 1, 100000, NULL,
     "simulated nodes (one TCP connection each)"},
    {"accels", LYNX_OPT_U32, O(accels), "4", 1, 64, NULL,
     "accelerators per node (kind \"sim\")"},
    {"prefix", LYNX_OPT_STR, O(prefix), "sim", 0, 0, NULL,
     "node ids are PREFIX followed by a 5-digit index"},
    {"labels", LYNX_OPT_STR, O(labels), "sim=1", 0, 0, NULL,
     "k=v,... labels of every node (\"\" for none)"},
    {"duration", LYNX_OPT_U32, O(duration), "0", 0, 86400, NULL,
     "stop after this many seconds (0: at SIGINT or SIGTERM)"},
    {"concurrency", LYNX_OPT_U32, O(concurrency), "64", 1, 100000, NULL,
     "nodes between connect and RegisterReply at a time"},
    {"no-leave", LYNX_OPT_FLAG, O(no_leave), NULL, 0, 0, NULL,
     "at the end just close the connections (leases expire) instead of "
     "sending Leave"},
    {"token-file", LYNX_OPT_STR, O(token_file), NULL, 0, 0, NULL,
     "file holding the cluster token"},
    {"rate", LYNX_OPT_U32, O(rate), "0", 0, 10000000, NULL,
     "accelerator k's counters grow at RATE x (1 + k % 7) requests/s, with "
     "latency quantiles in each heartbeat (0: counters stay 0)"},
    {"stalled", LYNX_OPT_U32, O(stalled), "0", 0, 100000, NULL,
     "accelerator 0 of the first K nodes reports a stalled mqueue"},
    {"failed", LYNX_OPT_U32, O(failed), "0", 0, 100000, NULL,
     "accelerator 0 of the K nodes after the stalled ones reports failed"},
    {"leaving", LYNX_OPT_U32, O(leaving), "0", 0, 100000, NULL,
     "the last K nodes ask to be drained to leave once registered"},
    LYNX_OPT_LOG_LEVEL(O(log_level), "warn"),
    LYNX_OPT_END,
};
#undef O

enum node_state {
  N_IDLE,        /* not started yet, or waiting for the retry timer */
  N_CONNECTING,  /* TCP connect in progress */
  N_HELLO,       /* Hello sent */
  N_REGISTERING, /* Register sent */
  N_REGISTERED,  /* lease held */
};

struct sim;

struct simnode {
  struct sim *s;
  uint32_t idx;
  char id[40];
  uint64_t epoch;
  enum node_state state;
  struct lynx_ctl *ctl;
  uv_timer_t beat, retry;
  uint64_t backoff_ms;
  uint64_t t_begin_ns; /* first connect of the initial registration */
  int ever_registered;
  int in_flight; /* counted in s->in_flight */
};

struct sim {
  struct sim_cfg cfg;
  uv_loop_t loop;
  struct sockaddr_storage addr;
  struct simnode *nodes;
  char *token;
  Lynx__Label labels[LABELS_MAX];
  Lynx__Label *label_ptrs[LABELS_MAX];
  uint32_t n_labels;
  uint32_t next_start, in_flight, registered_now, registered_once;
  uint64_t lease_ms;
  uint64_t t0_ns;
  uint64_t *reg_ns; /* per node: time to its first RegisterReply */
  int all_reported, stopping, exit_code;
  unsigned open_ctls;
  uint64_t heartbeats, start_requests, reconnects, refusals;
  uv_timer_t stop_timer, hard_stop;
  uv_signal_t sigint, sigterm;
};

static void node_schedule_retry(struct simnode *n);
static void pump(struct sim *s);
static void sim_stop(struct sim *s, int code);

static void send_env(struct simnode *n, Lynx__Envelope *env) {
  if (n->ctl && lynx_ctl_send(n->ctl, env))
    lynx_ctl_close(n->ctl, "cannot queue a message to the coordinator");
}

static void flight_done(struct simnode *n) {
  if (n->in_flight) {
    n->in_flight = 0;
    n->s->in_flight--;
  }
}

static void send_register(struct simnode *n) {
  struct sim *s = n->s;
  Lynx__Envelope env = LYNX__ENVELOPE__INIT;
  Lynx__Register reg = LYNX__REGISTER__INIT;
  Lynx__AccelInfo acc[64], *ap[64];
  char addr[64] = "";
  struct sockaddr_storage ss;
  int len = sizeof(ss);
  if (uv_tcp_getsockname(&n->ctl->tcp, (struct sockaddr *)&ss, &len) == 0)
    lynx_fmt_addr((struct sockaddr *)&ss, addr, sizeof(addr));
  for (uint32_t i = 0; i < s->cfg.accels; i++) {
    lynx__accel_info__init(&acc[i]);
    acc[i].idx = i;
    acc[i].kind = "sim";
    acc[i].model = "simulated";
    acc[i].memory_bytes = 0;
    acc[i].ordering = LYNX__ORDERING__ORDERING_COALESCED;
    ap[i] = &acc[i];
  }
  reg.node_id = n->id;
  reg.address = addr;
  reg.epoch = n->epoch;
  reg.n_labels = s->n_labels;
  reg.labels = s->label_ptrs;
  reg.n_accels = s->cfg.accels;
  reg.accels = ap;
  env.msg_case = LYNX__ENVELOPE__MSG_REGISTER;
  env.register_ = &reg;
  n->state = N_REGISTERING;
  send_env(n, &env);
}

#define WINDOW_NS 10000000000ull /* the latency window --rate reports */

/* Accelerator i of node n as --rate, --stalled and --failed make it (the
 * fields agent/link.c's on_beat fills), at now_ns. */
static void sim_counters(const struct simnode *n, uint32_t i, uint64_t now_ns,
                         Lynx__AccelCounters *c) {
  const struct sim *s = n->s;
  uint64_t k = (uint64_t)n->idx * s->cfg.accels + i;
  uint64_t up_ns = now_ns - s->t0_ns, per_s = s->cfg.rate * (1 + k % 7);
  int stalled = i == 0 && n->idx < s->cfg.stalled;
  int failed = i == 0 && !stalled && n->idx < s->cfg.stalled + s->cfg.failed;
  if (stalled) {
    c->stalled_mqueues = 1;
    c->stall_ms = up_ns / 1000000u;
  }
  if (failed) {
    c->failed = 1;
    c->last_error = "simulated failure";
  }
  if (!per_s || stalled || failed)
    return; /* it takes nothing */
  /* in two steps: a rate of 10^7 for a day would overflow in one */
  c->requests = per_s * (up_ns / 1000000000u) +
                per_s * (up_ns % 1000000000u) / 1000000000u;
  c->responses = c->requests;
  c->window_requests =
      per_s * (up_ns < WINDOW_NS ? up_ns : WINDOW_NS) / 1000000000u;
  if (!c->window_requests)
    return; /* quantiles are 0 when none was taken */
  c->queue_p50_ns = (1 + k % 5) * 1000u;
  c->queue_p99_ns = (5 + k % 11) * 1000u;
  c->service_p50_ns = (10 + k % 10) * 1000u;
  c->service_p99_ns = (20 + k % 50) * 1000u;
}

static void on_beat(uv_timer_t *t) {
  struct simnode *n = t->data;
  struct sim *s = n->s;
  Lynx__Envelope env = LYNX__ENVELOPE__INIT;
  Lynx__Heartbeat hb = LYNX__HEARTBEAT__INIT;
  Lynx__AccelCounters c[64], *cp[64];
  uint64_t now = lynx_now_ns();
  if (n->state != N_REGISTERED)
    return;
  for (uint32_t i = 0; i < s->cfg.accels; i++) {
    lynx__accel_counters__init(&c[i]);
    c[i].idx = i;
    sim_counters(n, i, now, &c[i]);
    cp[i] = &c[i];
  }
  hb.node_id = n->id;
  hb.epoch = n->epoch;
  hb.healthy = 1;
  hb.n_counters = s->cfg.accels;
  hb.counters = cp;
  env.msg_case = LYNX__ENVELOPE__MSG_HEARTBEAT;
  env.heartbeat = &hb;
  send_env(n, &env);
  s->heartbeats++;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static double pct_ms(const uint64_t *sorted, uint32_t n, double p) {
  uint32_t k = (uint32_t)(p * n + 0.999999);
  if (k < 1)
    k = 1;
  if (k > n)
    k = n;
  return (double)sorted[k - 1] / 1e6;
}

static void report_registered(struct sim *s) {
  uint64_t now = lynx_now_ns();
  uint32_t n = s->cfg.nodes;
  qsort(s->reg_ns, n, sizeof(*s->reg_ns), cmp_u64);
  printf("simnodes: registered nodes=%u accels=%llu elapsed_ms=%.1f "
         "reg_p50_ms=%.2f reg_p99_ms=%.2f reg_max_ms=%.2f lease_ms=%llu\n",
         n, (unsigned long long)n * s->cfg.accels,
         (double)(now - s->t0_ns) / 1e6, pct_ms(s->reg_ns, n, 0.50),
         pct_ms(s->reg_ns, n, 0.99), pct_ms(s->reg_ns, n, 1.0),
         (unsigned long long)s->lease_ms);
  fflush(stdout);
  s->all_reported = 1;
}

static void on_registered(struct simnode *n, uint64_t lease_ms) {
  struct sim *s = n->s;
  uint64_t every;
  n->state = N_REGISTERED;
  n->backoff_ms = 0;
  s->lease_ms = lease_ms ? lease_ms : 3000;
  s->registered_now++;
  if (!n->ever_registered) {
    n->ever_registered = 1;
    s->reg_ns[n->idx] = lynx_now_ns() - n->t_begin_ns;
    s->registered_once++;
  } else {
    LYNX_INFO(COMP, "%s: registered again", n->id);
  }
  flight_done(n);
  every = s->lease_ms / 3 < 100 ? 100 : s->lease_ms / 3;
  /* first beat at a random phase, so the nodes' heartbeats spread out
   * over the period instead of arriving in the order they registered */
  uv_timer_start(&n->beat, on_beat, 1 + (uint64_t)rand() % every, every);
  if (!s->all_reported && s->registered_once == s->cfg.nodes)
    report_registered(s);
  pump(s);
}

/* Leave, asking for a drain first when drain (--leaving). */
static void send_leave(struct simnode *n, int drain) {
  Lynx__Envelope env = LYNX__ENVELOPE__INIT;
  Lynx__Leave lv = LYNX__LEAVE__INIT;
  lv.node_id = n->id;
  lv.epoch = n->epoch;
  lv.drain = drain != 0;
  env.msg_case = LYNX__ENVELOPE__MSG_LEAVE;
  env.leave = &lv;
  send_env(n, &env);
}

static void answer_start(struct simnode *n, const Lynx__StartInstance *si) {
  Lynx__Envelope env = LYNX__ENVELOPE__INIT;
  Lynx__InstanceFailed f = LYNX__INSTANCE_FAILED__INIT;
  n->s->start_requests++;
  f.node_id = n->id;
  f.epoch = n->epoch;
  f.instance_id = si->instance_id;
  f.error = "simulated node";
  env.msg_case = LYNX__ENVELOPE__MSG_INSTANCE_FAILED;
  env.instance_failed = &f;
  send_env(n, &env);
}

static void on_msg(struct lynx_ctl *c, Lynx__Envelope *env) {
  struct simnode *n = c->data;
  struct sim *s = n->s;
  char why[300];
  switch (env->msg_case) {
  case LYNX__ENVELOPE__MSG_HELLO_REPLY:
    if (n->state != N_HELLO)
      break;
    if (!env->hello_reply->ok) {
      s->refusals++;
      LYNX_ERR(COMP, "%s: coordinator refused us: %s", n->id,
               env->hello_reply->error ? env->hello_reply->error : "");
      lynx_ctl_close(c, NULL);
      if (!env->hello_reply->retryable)
        sim_stop(s, 1); /* wrong token or version: retrying cannot help */
      return;
    }
    send_register(n);
    return;
  case LYNX__ENVELOPE__MSG_REGISTER_REPLY:
    if (n->state != N_REGISTERING)
      break;
    if (!env->register_reply->ok) {
      s->refusals++;
      snprintf(why, sizeof(why), "registration refused: %s",
               env->register_reply->error ? env->register_reply->error : "");
      lynx_ctl_close(c, why);
      return;
    }
    on_registered(n, env->register_reply->lease_ms);
    if (n->idx >= s->cfg.nodes - s->cfg.leaving &&
        env->register_reply->drains_on_leave) {
      send_leave(n, 1);
    }
    return;
  case LYNX__ENVELOPE__MSG_START_INSTANCE:
    if (n->state == N_REGISTERED)
      answer_start(n, env->start_instance);
    return;
  case LYNX__ENVELOPE__MSG_STOP_INSTANCE:
    return; /* nothing runs here */
  case LYNX__ENVELOPE__MSG_HEARTBEAT_REPLY:
    /* the coordinator answers every heartbeat (a real agent renews its
     * lease fence on them); nothing here is fenced */
    if (n->state == N_REGISTERED)
      return;
    break;
  default:
    break;
  }
  snprintf(why, sizeof(why), "unexpected message (case %d) in state %d",
           (int)env->msg_case, (int)n->state);
  lynx_ctl_close(c, why);
}

static void on_closed(struct lynx_ctl *c) {
  struct simnode *n = c->data;
  struct sim *s = n->s;
  int was = n->state == N_REGISTERED;
  free(c);
  n->ctl = NULL;
  s->open_ctls--;
  if (was)
    s->registered_now--;
  n->state = N_IDLE;
  uv_timer_stop(&n->beat);
  flight_done(n);
  if (s->stopping) {
    if (s->open_ctls == 0)
      uv_stop(&s->loop);
    return;
  }
  if (was)
    LYNX_WARN(COMP, "%s: lost the coordinator; reconnecting", n->id);
  node_schedule_retry(n);
  pump(s);
}

static void on_connected(uv_connect_t *req, int status) {
  struct lynx_ctl *c = req->data;
  struct simnode *n = c->data;
  Lynx__Envelope env = LYNX__ENVELOPE__INIT;
  Lynx__Hello h = LYNX__HELLO__INIT;
  free(req);
  if (status < 0) {
    LYNX_LOG_RL(LYNX_LOG_WARN, COMP, "cannot reach coordinator %s: %s",
                n->s->cfg.coordinator, uv_strerror(status));
    lynx_ctl_close(c, NULL);
    return;
  }
  if (c->closing)
    return;
  if (lynx_ctl_start(c)) {
    lynx_ctl_close(c, "cannot start reading");
    return;
  }
  h.proto_version = LYNX_PROTO_VERSION;
  h.role = "agent";
  h.id = n->id;
  h.token = n->s->token ? n->s->token : "";
  env.msg_case = LYNX__ENVELOPE__MSG_HELLO;
  env.hello = &h;
  n->state = N_HELLO;
  send_env(n, &env);
}

static void node_connect(struct simnode *n) {
  struct sim *s = n->s;
  struct lynx_ctl *c;
  uv_connect_t *req;
  int rc;
  if (s->stopping || n->ctl)
    return;
  c = calloc(1, sizeof(*c));
  req = calloc(1, sizeof(*req));
  if (!c || !req) {
    free(c);
    free(req);
    node_schedule_retry(n);
    return;
  }
  if (!n->in_flight) {
    n->in_flight = 1;
    s->in_flight++;
  }
  uv_tcp_init(&s->loop, &c->tcp);
  lynx_ctl_init(c, COMP, LYNX_FRAME_MAX_DEFAULT, on_msg, on_closed);
  c->data = n;
  n->ctl = c;
  s->open_ctls++;
  n->state = N_CONNECTING;
  req->data = c;
  rc = uv_tcp_connect(req, &c->tcp, (struct sockaddr *)&s->addr, on_connected);
  if (rc) {
    free(req);
    LYNX_LOG_RL(LYNX_LOG_WARN, COMP, "connect: %s", uv_strerror(rc));
    lynx_ctl_close(c, NULL);
  }
}

static void on_retry(uv_timer_t *t) {
  struct simnode *n = t->data;
  n->s->reconnects++;
  node_connect(n);
}

static void node_schedule_retry(struct simnode *n) {
  n->backoff_ms = n->backoff_ms ? n->backoff_ms * 2 : 100;
  if (n->backoff_ms > 2000)
    n->backoff_ms = 2000;
  uv_timer_start(&n->retry, on_retry,
                 n->backoff_ms / 2 + (uint64_t)rand() % (n->backoff_ms / 2 + 1),
                 0);
}

/* Starts initial registrations while fewer than --concurrency are open. */
static void pump(struct sim *s) {
  while (!s->stopping && s->next_start < s->cfg.nodes &&
         s->in_flight < s->cfg.concurrency) {
    struct simnode *n = &s->nodes[s->next_start++];
    n->t_begin_ns = lynx_now_ns();
    node_connect(n);
  }
}

/* ---- stopping --------------------------------------------------------- */

static void on_hard_stop(uv_timer_t *t) {
  struct sim *s = t->data;
  LYNX_WARN(COMP, "%u connections still open 5 s after the stop; exiting",
            s->open_ctls);
  uv_stop(&s->loop);
}

static void sim_stop(struct sim *s, int code) {
  if (s->stopping)
    return;
  s->stopping = 1;
  s->exit_code = code;
  uv_timer_stop(&s->stop_timer);
  uv_signal_stop(&s->sigint);
  uv_signal_stop(&s->sigterm);
  for (uint32_t i = 0; i < s->cfg.nodes; i++) {
    struct simnode *n = &s->nodes[i];
    uv_timer_stop(&n->beat);
    uv_timer_stop(&n->retry);
    if (!n->ctl)
      continue;
    if (n->state == N_REGISTERED && !s->cfg.no_leave && !n->ctl->closing) {
      send_leave(n, 0);
      if (n->ctl && !n->ctl->closing) {
        n->ctl->close_after_write = 1;
        if (n->ctl->pending_writes == 0)
          lynx_ctl_close(n->ctl, NULL);
      }
    } else {
      lynx_ctl_close(n->ctl, NULL);
    }
  }
  if (s->open_ctls == 0) {
    uv_stop(&s->loop);
    return;
  }
  uv_timer_start(&s->hard_stop, on_hard_stop, 5000, 0);
}

static void on_signal(uv_signal_t *h, int signum) {
  struct sim *s = h->data;
  LYNX_INFO(COMP, "%s: stopping", strsignal(signum));
  sim_stop(s, 0);
}

static void on_duration(uv_timer_t *t) { sim_stop(t->data, 0); }

/* ---- set-up ----------------------------------------------------------- */

static int raise_nofile(uint32_t need) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl))
    return -errno;
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur >= need)
    return 0;
  if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need) {
    fprintf(stderr,
            "lynx-simnodes: %u nodes need %u file descriptors, but the hard "
            "limit (ulimit -Hn) is %llu\n",
            need - 64, need, (unsigned long long)rl.rlim_max);
    return -EMFILE;
  }
  rl.rlim_cur = need;
  if (setrlimit(RLIMIT_NOFILE, &rl))
    return -errno;
  return 0;
}

static int parse_labels(struct sim *s, const char *spec) {
  char *copy, *save = NULL, *tok;
  if (!spec || !*spec)
    return 0;
  copy = strdup(spec);
  if (!copy)
    return -ENOMEM;
  for (tok = strtok_r(copy, ",", &save); tok;
       tok = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(tok, '=');
    if (!eq || eq == tok || s->n_labels == LABELS_MAX) {
      free(copy);
      return -EINVAL;
    }
    *eq = 0;
    lynx__label__init(&s->labels[s->n_labels]);
    s->labels[s->n_labels].key = strdup(tok);
    s->labels[s->n_labels].value = strdup(eq + 1);
    s->label_ptrs[s->n_labels] = &s->labels[s->n_labels];
    s->n_labels++;
  }
  free(copy);
  return 0;
}

int main(int argc, char **argv) {
  int help = 0; /* --help was printed */
  static struct sim s;
  struct timeval tv;
  uint64_t epoch;
  int rc, lvl;

  rc = lynx_opts_parse(sim_opts, &s.cfg, argc, argv,
                       "usage: lynx-simnodes [options]\n"
                       "Simulated agents for coordinator benchmarks: each node "
                       "registers A accelerators and keeps its lease.\n",
                       &help);
  if (rc || help)
    return rc ? 2 : 0;
  lvl = lynx_log_parse_level(s.cfg.log_level);
  if (lvl < 0) {
    fprintf(stderr, "--log-level: unknown level '%s'\n", s.cfg.log_level);
    return 2;
  }
  lynx_log_level = lvl;
  if (lynx_parse_hostport(s.cfg.coordinator, &s.addr)) {
    fprintf(stderr, "--coordinator: '%s' is not host:port\n",
            s.cfg.coordinator);
    return 2;
  }
  if (strlen(s.cfg.prefix) > 30) {
    fprintf(stderr, "--prefix: at most 30 characters\n");
    return 2;
  }
  if (s.cfg.leaving > s.cfg.nodes) {
    fprintf(stderr, "--leaving %u: more than the %u nodes\n", s.cfg.leaving,
            s.cfg.nodes);
    return 2;
  }
  if ((uint64_t)s.cfg.stalled + s.cfg.failed > s.cfg.nodes) {
    fprintf(stderr,
            "--stalled %u --failed %u: more than the %u nodes (accelerator "
            "0 of one node each)\n",
            s.cfg.stalled, s.cfg.failed, s.cfg.nodes);
    return 2;
  }
  if (parse_labels(&s, s.cfg.labels)) {
    fprintf(stderr, "--labels: expected k=v,k2=v2 (at most %d)\n", LABELS_MAX);
    return 2;
  }
  if (s.cfg.token_file) {
    char err[320];
    if (lynx_read_token(s.cfg.token_file, &s.token, err, sizeof(err))) {
      fprintf(stderr, "%s\n", err);
      return 1;
    }
  }
  if ((rc = raise_nofile(s.cfg.nodes + 64))) {
    if (rc != -EMFILE)
      fprintf(stderr, "lynx-simnodes: cannot raise RLIMIT_NOFILE: %s\n",
              strerror(-rc));
    return 2;
  }
  gettimeofday(&tv, NULL);
  /* one epoch for the whole run, like an agent start: it grows from run to
   * run (wall-clock microseconds) */
  epoch = (uint64_t)tv.tv_sec * 1000000u + (uint64_t)tv.tv_usec;
  srand((unsigned)(epoch ^ (uint64_t)getpid()));

  s.nodes = calloc(s.cfg.nodes, sizeof(*s.nodes));
  s.reg_ns = calloc(s.cfg.nodes, sizeof(*s.reg_ns));
  if (!s.nodes || !s.reg_ns) {
    fprintf(stderr, "lynx-simnodes: out of memory\n");
    return 1;
  }
  uv_loop_init(&s.loop);
  for (uint32_t i = 0; i < s.cfg.nodes; i++) {
    struct simnode *n = &s.nodes[i];
    n->s = &s;
    n->idx = i;
    n->epoch = epoch;
    snprintf(n->id, sizeof(n->id), "%s%05u", s.cfg.prefix, i);
    uv_timer_init(&s.loop, &n->beat);
    uv_timer_init(&s.loop, &n->retry);
    n->beat.data = n->retry.data = n;
  }
  uv_timer_init(&s.loop, &s.stop_timer);
  uv_timer_init(&s.loop, &s.hard_stop);
  s.stop_timer.data = s.hard_stop.data = &s;
  uv_signal_init(&s.loop, &s.sigint);
  uv_signal_init(&s.loop, &s.sigterm);
  s.sigint.data = s.sigterm.data = &s;
  uv_signal_start(&s.sigint, on_signal, SIGINT);
  uv_signal_start(&s.sigterm, on_signal, SIGTERM);
  if (s.cfg.duration)
    uv_timer_start(&s.stop_timer, on_duration, s.cfg.duration * 1000ull, 0);

  LYNX_INFO(COMP, "%u nodes x %u accelerators -> %s (prefix %s, epoch %llu)",
            s.cfg.nodes, s.cfg.accels, s.cfg.coordinator, s.cfg.prefix,
            (unsigned long long)epoch);
  s.t0_ns = lynx_now_ns();
  pump(&s);
  uv_run(&s.loop, UV_RUN_DEFAULT);

  printf("simnodes: stopped nodes=%u registered=%u heartbeats=%llu "
         "start_requests=%llu reconnects=%llu refusals=%llu\n",
         s.cfg.nodes, s.registered_once, (unsigned long long)s.heartbeats,
         (unsigned long long)s.start_requests, (unsigned long long)s.reconnects,
         (unsigned long long)s.refusals);
  fflush(stdout);
  /* The process ends here: the loop's handles are not closed one by one
   * (thousands of them); the kernel closes the sockets. */
  return s.exit_code;
}
