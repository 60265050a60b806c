/*
 * lynx-agent - one per accelerator host.
 *
 * Discovers (here: emulates) accelerators, allocates one mqueue region per
 * accelerator through the chosen transport, starts the application on each,
 * and serves the regions' descriptors on its listen port: a frontend says
 * Hello, gets HelloReply and Descriptors, and keeps the connection open as a
 * liveness signal. The agent stays out of the data path.
 *
 * Static mode (this file): --app names the application. With a coordinator
 * (a later issue) the agent will be told what to run.
 *
 * Threads: the main thread runs the libuv loop (control connections,
 * signals); each accelerator runs its own polling threads (cpu_accel.c).
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <unistd.h>
#include <uv.h>

#include <json-c/json.h>

#include "cpu_accel.h"
#include "ctlconn.h"
#include "frame.h"
#include "log.h"
#include "mqueue.h"
#include "options.h"
#include "transport.h"
#include "util.h"

static const char *const transports[] = {"shm", NULL};
static const char *const orderings[] = {"coalesced", "fenced", NULL};

struct agent_cfg {
  uint32_t cpu_accels, mqueues, slots, slot_size, work_us, spin_us,
      accel_threads, frame_max;
  char *app, *listen, *node_id, *log_level, *token_file;
  int transport, ordering;
};

#define O(f) offsetof(struct agent_cfg, f)
static const struct lynx_opt agent_opts[] = {
    {"cpu-accels", LYNX_OPT_U32, O(cpu_accels), "2", 1, 64, NULL,
     "number of CPU-emulated accelerators"},
    {"app", LYNX_OPT_STR, O(app), "sockperf-echo", 0, 0, NULL,
     "application to run: echo, sockperf-echo"},
    {"mqueues", LYNX_OPT_U32, O(mqueues), "4", 1, LYNX_MQUEUES_MAX, NULL,
     "server mqueues per accelerator"},
    {"slots", LYNX_OPT_U32, O(slots), "256", LYNX_SLOTS_MIN, LYNX_SLOTS_MAX,
     NULL, "slots per RX/TX ring (power of two)"},
    {"slot-size", LYNX_OPT_U32, O(slot_size), "2048", LYNX_SLOT_MIN,
     LYNX_SLOT_MAX, NULL, "bytes per slot incl. 16 B metadata (power of two)"},
    {"work-us", LYNX_OPT_U32, O(work_us), "0", 0, 10000000, NULL,
     "emulated processing time per request, microseconds"},
    {"spin-us", LYNX_OPT_U32, O(spin_us), "200", 0, 10000000, NULL,
     "accelerator spins this long after its last request before it sleeps"},
    {"accel-threads", LYNX_OPT_U32, O(accel_threads), "1", 1, 64, NULL,
     "polling threads per accelerator"},
    {"listen", LYNX_OPT_STR, O(listen), "127.0.0.1:7701", 0, 0, NULL,
     "control address frontends connect to"},
    {"node-id", LYNX_OPT_STR, O(node_id), NULL, 0, 0, NULL,
     "node name [default: host name]"},
    {"transport", LYNX_OPT_ENUM, O(transport), "shm", 0, 0, transports,
     "how frontends reach the mqueues"},
    {"ordering", LYNX_OPT_ENUM, O(ordering), "coalesced", 0, 0, orderings,
     "mqueue ordering mode advertised to frontends"},
    {"frame-max", LYNX_OPT_U32, O(frame_max), "1048576", 64, 1u << 26, NULL,
     "largest accepted control frame, bytes"},
    {"token-file", LYNX_OPT_STR, O(token_file), NULL, 0, 0, NULL,
     "file holding the cluster token peers must present"},
    {"log-level", LYNX_OPT_STR, O(log_level), "info", 0, 0, NULL,
     "error, warn, info or debug"},
    LYNX_OPT_END,
};
#undef O

struct accel {
  struct lynx_region region;
  struct lynx_region_desc desc;
  struct lynx_cpu_accel cpu;
  int running;
};

struct agent {
  struct agent_cfg cfg;
  const struct lynx_transport_ops *tops;
  const struct lynx_app *app;
  char node_id[64];
  char *token;
  uint64_t epoch;
  struct accel *acc;
  uint32_t n_acc;
  uv_loop_t loop;
  uv_tcp_t server;
  uv_signal_t sigint, sigterm;
  struct peer *peers; /* open control connections */
  struct peer *owner; /* the frontend the mqueues are granted to */
};

struct peer {
  struct lynx_ctl ctl;
  struct agent *ag;
  struct peer *next, **pprev;
  int greeted;
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
  LYNX_INFO("agent", "%s: control connection %s closed", p->ag->node_id,
            c->peer);
  free(p);
}

static void send_reply(struct peer *p, int ok, int retryable,
                       const char *error) {
  Lynx__Envelope env = LYNX__ENVELOPE__INIT;
  Lynx__HelloReply r = LYNX__HELLO_REPLY__INIT;
  r.proto_version = LYNX_PROTO_VERSION;
  r.ok = ok;
  r.error = (char *)(error ? error : "");
  r.retryable = retryable;
  r.id = p->ag->node_id;
  env.msg_case = LYNX__ENVELOPE__MSG_HELLO_REPLY;
  env.hello_reply = &r;
  if (lynx_ctl_send(&p->ctl, &env))
    lynx_ctl_close(&p->ctl, "cannot queue hello reply");
}

static void send_descriptors(struct peer *p) {
  struct agent *ag = p->ag;
  Lynx__Envelope env = LYNX__ENVELOPE__INIT;
  Lynx__Descriptors d = LYNX__DESCRIPTORS__INIT;
  Lynx__RegionDesc *pbs = calloc(ag->n_acc, sizeof(*pbs));
  Lynx__RegionDesc **ptrs = calloc(ag->n_acc, sizeof(*ptrs));
  if (!pbs || !ptrs) {
    lynx_ctl_close(&p->ctl, "out of memory building descriptors");
    goto out;
  }
  for (uint32_t i = 0; i < ag->n_acc; i++) {
    lynx_desc_to_pb(&ag->acc[i].desc, &pbs[i]);
    pbs[i].kind = "cpu";
    pbs[i].model = "cpu-emulated";
    pbs[i].memory_bytes = ag->acc[i].region.size;
    ptrs[i] = &pbs[i];
  }
  d.node_id = ag->node_id;
  d.epoch = ag->epoch;
  d.app = ag->cfg.app;
  d.service = ag->cfg.app;
  d.n_regions = ag->n_acc;
  d.regions = ptrs;
  env.msg_case = LYNX__ENVELOPE__MSG_DESCRIPTORS;
  env.descriptors = &d;
  if (lynx_ctl_send(&p->ctl, &env))
    lynx_ctl_close(&p->ctl, "cannot queue descriptors");
out:
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
      LYNX_WARN("agent", "%s: refusing %s (%s %s): %s", p->ag->node_id,
                c->peer, env->hello->role ? env->hello->role : "?",
                env->hello->id ? env->hello->id : "?", err);
      send_reply(p, 0, 0, err);
      c->close_after_write = 1;
      return;
    }
    /* Each mqueue has one producer: in static mode one frontend at a time
     * gets the accelerators (the coordinator partitions them otherwise). */
    if (p->ag->owner) {
      snprintf(err, sizeof(err), "mqueues are in use by frontend at %s",
               p->ag->owner->ctl.peer);
      LYNX_WARN("agent", "%s: refusing %s: %s", p->ag->node_id, c->peer, err);
      send_reply(p, 0, 1, err);
      c->close_after_write = 1;
      return;
    }
    p->ag->owner = p;
    p->greeted = 1;
    LYNX_INFO("agent", "%s: %s %s connected from %s", p->ag->node_id,
              env->hello->role ? env->hello->role : "peer",
              env->hello->id ? env->hello->id : "", c->peer);
    send_reply(p, 1, 0, NULL);
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
      lynx_ctl_start(&p->ctl))
    lynx_ctl_close(&p->ctl, "accept failed");
}

static void on_signal(uv_signal_t *s, int signum) {
  struct agent *ag = s->data;
  LYNX_INFO("agent", "%s: %s, shutting down", ag->node_id, strsignal(signum));
  for (struct peer *p = ag->peers; p; p = p->next)
    lynx_ctl_close(&p->ctl, NULL);
  uv_close((uv_handle_t *)&ag->server, NULL);
  uv_close((uv_handle_t *)&ag->sigint, NULL);
  uv_close((uv_handle_t *)&ag->sigterm, NULL);
}

/* Removes shared-memory files of agents that died without cleaning up
 * (kill -9): lynx-<node>-<pid>-a<i> whose pid is gone. */
static void remove_stale_regions(void) {
  DIR *d = opendir("/dev/shm");
  struct dirent *e;
  if (!d)
    return;
  while ((e = readdir(d))) {
    char node[128], path[300];
    int pid, idx;
    if (strncmp(e->d_name, "lynx-", 5) != 0)
      continue;
    if (sscanf(e->d_name, "lynx-%127[^-]-%d-a%d", node, &pid, &idx) != 3)
      continue;
    if (pid <= 0 || kill(pid, 0) == 0 || errno != ESRCH)
      continue;
    snprintf(path, sizeof(path), "/%s", e->d_name);
    if (shm_unlink(path) == 0)
      LYNX_INFO("agent", "removed stale region %s of dead agent pid %d",
                path, pid);
  }
  closedir(d);
}

static void accels_stop(struct agent *ag) {
  for (uint32_t i = 0; ag->acc && i < ag->n_acc; i++) {
    struct accel *a = &ag->acc[i];
    if (a->running) {
      uint64_t rq, rs, dr, bad;
      lynx_cpu_accel_stop(&a->cpu);
      lynx_cpu_accel_counters(&a->cpu, &rq, &rs, &dr, &bad);
      LYNX_INFO("agent",
                "%s: accel %u served %llu requests: %llu responses, %llu "
                "dropped by the app, %llu malformed",
                ag->node_id, i, (unsigned long long)rq,
                (unsigned long long)rs, (unsigned long long)dr,
                (unsigned long long)bad);
      lynx_cpu_accel_free(&a->cpu);
      a->running = 0;
    }
    if (a->region.ops)
      a->region.ops->region_free(&a->region);
  }
  free(ag->acc);
  ag->acc = NULL;
}

static int accels_start(struct agent *ag) {
  struct lynx_geom g;
  int rc = lynx_geom_init(&g, ag->cfg.mqueues, ag->cfg.slots,
                          ag->cfg.slot_size);
  if (rc) {
    LYNX_ERR("agent", "slots and slot-size must be powers of two");
    return -EINVAL;
  }
  ag->acc = calloc(ag->cfg.cpu_accels, sizeof(*ag->acc));
  if (!ag->acc)
    return -ENOMEM;
  ag->n_acc = ag->cfg.cpu_accels;
  for (uint32_t i = 0; i < ag->n_acc; i++) {
    struct accel *a = &ag->acc[i];
    char name[100];
    a->region.fd = -1;
    snprintf(name, sizeof(name), "lynx-%s-%d-a%u", ag->node_id, (int)getpid(),
             i);
    rc = ag->tops->region_alloc(&a->region, name, g.region_size);
    if (rc) {
      LYNX_ERR("agent", "accel %u: cannot allocate %llu-byte region %s: %s",
               i, (unsigned long long)g.region_size, name, strerror(-rc));
      return rc;
    }
    rc = lynx_region_format(&a->region, g.n_mqueues, g.slots, g.slot_size,
                            (uint32_t)ag->cfg.ordering, ag->epoch, i);
    if (rc)
      return rc;
    a->desc.accel_id = i;
    snprintf(a->desc.transport, sizeof(a->desc.transport), "%s",
             ag->tops->name);
    snprintf(a->desc.locator, sizeof(a->desc.locator), "%s",
             a->region.locator);
    a->desc.region_size = g.region_size;
    a->desc.epoch = ag->epoch;
    a->desc.n_mqueues = g.n_mqueues;
    a->desc.slots = g.slots;
    a->desc.slot_size = g.slot_size;
    a->desc.ordering = (uint32_t)ag->cfg.ordering;
    a->cpu.region = a->region.base;
    a->cpu.app = ag->app;
    a->cpu.work_us = ag->cfg.work_us;
    a->cpu.spin_us = ag->cfg.spin_us;
    a->cpu.n_threads = ag->cfg.accel_threads;
    a->cpu.id = i;
    rc = lynx_cpu_accel_start(&a->cpu);
    if (rc) {
      LYNX_ERR("agent", "accel %u: cannot start threads: %s", i,
               strerror(-rc));
      return rc;
    }
    a->running = 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  struct agent ag;
  struct sockaddr_storage ss;
  char addr[64];
  int rc, lvl, exit_code = 1;
  struct timeval tv;

  memset(&ag, 0, sizeof(ag));
  rc = lynx_opts_parse(agent_opts, &ag.cfg, argc, argv,
                       "usage: lynx-agent [options]\n"
                       "Emulates accelerators, places their mqueues in "
                       "shared memory and serves their descriptors.");
  if (rc)
    return rc > 0 ? 0 : 2;
  signal(SIGPIPE, SIG_IGN);
  lvl = lynx_log_parse_level(ag.cfg.log_level);
  if (lvl < 0) {
    fprintf(stderr, "--log-level: unknown level '%s'\n", ag.cfg.log_level);
    goto out_opts;
  }
  lynx_log_level = lvl;
  ag.app = lynx_app_find(ag.cfg.app);
  if (!ag.app) {
    fprintf(stderr, "--app: unknown application '%s' (known: %s)\n",
            ag.cfg.app, lynx_app_names());
    goto out_opts;
  }
  ag.tops = lynx_transport_find(transports[ag.cfg.transport]);
  if (lynx_parse_hostport(ag.cfg.listen, &ss)) {
    fprintf(stderr, "--listen: '%s' is not host:port\n", ag.cfg.listen);
    goto out_opts;
  }
  if (ag.cfg.token_file && (rc = lynx_read_token(ag.cfg.token_file, &ag.token))) {
    fprintf(stderr, "--token-file %s: %s\n", ag.cfg.token_file,
            rc == -EINVAL ? "file is empty" : strerror(-rc));
    goto out_opts;
  }
  if (ag.cfg.node_id) {
    if (strlen(ag.cfg.node_id) >= 32 || strpbrk(ag.cfg.node_id, "-/ ")) {
      fprintf(stderr, "--node-id: at most 31 characters, no '-', '/' or ' '\n");
      goto out_opts;
    }
    snprintf(ag.node_id, sizeof(ag.node_id), "%s", ag.cfg.node_id);
  } else {
    gethostname(ag.node_id, 32);
    ag.node_id[31] = 0;
    for (char *c = ag.node_id; *c; c++)
      if (*c == '-' || *c == '/' || *c == ' ')
        *c = '_';
  }
  /* The epoch grows on every start: microseconds of wall-clock time. */
  gettimeofday(&tv, NULL);
  ag.epoch = (uint64_t)tv.tv_sec * 1000000u + (uint64_t)tv.tv_usec;

  remove_stale_regions();
  rc = accels_start(&ag);
  if (rc)
    goto out_acc;

  uv_loop_init(&ag.loop);
  uv_tcp_init(&ag.loop, &ag.server);
  ag.server.data = &ag;
  rc = uv_tcp_bind(&ag.server, (struct sockaddr *)&ss, 0);
  if (!rc)
    rc = uv_listen((uv_stream_t *)&ag.server, 64, on_connection);
  if (rc) {
    LYNX_ERR("agent", "cannot listen on %s: %s", ag.cfg.listen,
             uv_strerror(rc));
    uv_close((uv_handle_t *)&ag.server, NULL);
    uv_run(&ag.loop, UV_RUN_DEFAULT);
    uv_loop_close(&ag.loop);
    goto out_acc;
  }
  uv_signal_init(&ag.loop, &ag.sigint);
  uv_signal_init(&ag.loop, &ag.sigterm);
  ag.sigint.data = ag.sigterm.data = &ag;
  uv_signal_start(&ag.sigint, on_signal, SIGINT);
  uv_signal_start(&ag.sigterm, on_signal, SIGTERM);

  {
    struct json_object *j = lynx_opts_json(agent_opts, &ag.cfg);
    LYNX_INFO("agent", "%s: epoch %llu, %u %s accelerators x %u mqueues "
              "(%u slots x %u B), serving descriptors on %s; config %s",
              ag.node_id, (unsigned long long)ag.epoch, ag.n_acc, ag.app->name,
              ag.cfg.mqueues, ag.cfg.slots, ag.cfg.slot_size,
              lynx_fmt_addr((struct sockaddr *)&ss, addr, sizeof(addr)),
              json_object_to_json_string_ext(j, JSON_C_TO_STRING_PLAIN));
    json_object_put(j);
  }
  uv_run(&ag.loop, UV_RUN_DEFAULT);
  rc = uv_loop_close(&ag.loop);
  if (rc)
    LYNX_WARN("agent", "loop closed with handles open: %s", uv_strerror(rc));
  exit_code = 0;
out_acc:
  accels_stop(&ag);
out_opts:
  free(ag.token);
  lynx_opts_free(agent_opts, &ag.cfg);
  return exit_code;
}
