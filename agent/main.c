/*
 * lynx-agent - one per accelerator host.
 *
 * Discovers accelerators through their backends (accel.h: CPU-emulated
 * ones, GPUs) and runs instances on them: one service on one accelerator,
 * with a mqueue region allocated through the transport and the
 * application's persistent polling code. The agent stays out of the data
 * path.
 *
 * Static mode (--app): one instance per accelerator from the start, and the
 * descriptors served to one frontend on --listen (serve.c). Coordinator
 * mode (--coordinator): register, heartbeat, start and stop instances as
 * the coordinator says (link.c).
 *
 * Threads: the main thread runs the libuv loop (control connections,
 * signals); each instance's accelerator polls its mqueues on its own
 * (CPU threads, or a GPU's persistent kernel).
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

#include "agent.h"
#include "log.h"
#include "notify.h"
#include "mqueue.h"
#include "options.h"
#include "prom.h"
#include "promhttp.h"
#include "util.h"

/* auto: tcp, with each host-memory region also a shared-memory file that
 * a frontend on this host and in this network namespace maps (shm);
 * the others: that transport alone */
static const char *const transports[] = {"auto", "tcp", "shm", "rdma", NULL};
#define TRANSPORT_AUTO 0
static const char *const work_modes[] = {"spin", "sleep", NULL};
static const char *const orderings[] = {"coalesced", "fenced", NULL};
/* in enum lynx_region_where's order */
static const char *const region_mems[] = {"auto", "device", "host", NULL};

/* The committed weights in the source tree, for `make run` from a build
 * tree; an installed agent is built with LYNX_LENET_MODEL pointing where
 * the package puts them (agent/CMakeLists.txt). */
#ifndef LYNX_LENET_MODEL_DEFAULT
#define LYNX_LENET_MODEL_DEFAULT "models/lenet-fashion.bin"
#endif

#define O(f) offsetof(struct agent_cfg, f)
static const struct lynx_opt agent_opts[] = {
    {"cpu-accels", LYNX_OPT_U32, O(cpu_accels), "2", 0, 64, NULL,
     "number of CPU-emulated accelerators (none with --cuda-accels unless "
     "given)"},
    {"cuda-accels", LYNX_OPT_STR, O(cuda_accels), NULL, 0, 0, NULL,
     "GPUs to serve as accelerators: all, or CUDA ordinals 0,1,... (needs a "
     "lynx-agent built with CUDA and the NVIDIA driver)"},
    {"list-accels", LYNX_OPT_FLAG, O(list_accels), NULL, 0, 0, NULL,
     "print the accelerators found, one a line, tab-separated (index, kind, "
     "model, memory bytes, PCI bus id, ordering mode) and exit"},
    {"gpu-threads", LYNX_OPT_U32, O(gpu_threads), "128", 32, 1024, NULL,
     "threads per block of a GPU application's persistent kernel"},
    {"gpu-blocks", LYNX_OPT_U32, O(gpu_blocks), "0", 0, 65536, NULL,
     "blocks of a GPU application's persistent kernel, each scanning its "
     "share of the mqueues (at most 64); 0: one per mqueue up to one per SM "
     "(docs/gpu.md)"},
    {"gpu-idle-ns", LYNX_OPT_U32, O(gpu_idle_ns), "500", 0, 1000000, NULL,
     "longest sleep of an idle GPU block between passes over its mqueues "
     "(__nanosleep, doubling from 64 ns while nothing comes; it may sleep up "
     "to twice this, so 500 adds at most about 1 us to a request that finds "
     "its block asleep); 0: the block never sleeps (docs/gpu.md)"},
    {"stall-ms", LYNX_OPT_U32, O(stall_ms), "2000", 100, 3600000, NULL,
     "an accelerator whose mqueue has a request pending this long without "
     "consuming it is reported stalled (out of dispatch until it consumes)"},
    {"app", LYNX_OPT_STR, O(app), NULL, 0, 0, NULL,
     "static mode: application to run (echo, sockperf-echo, sockperf-fault, "
     "...) [default sockperf-echo without --coordinator]"},
    {"lenet-model", LYNX_OPT_STR, O(lenet_model), LYNX_LENET_MODEL_DEFAULT, 0,
     0, NULL,
     "weights file of the lenet application (docs/lenet.md) for services "
     "whose app configuration names none ({\"model\": PATH}), loaded by "
     "each instance; one that is missing or invalid stops lenet instances "
     "from starting, with the reason"},
    {"app-load", LYNX_OPT_STR, O(app_load), NULL, 0, 0, NULL,
     "plug-in applications to load: [NAME=]PATH[,[NAME=]PATH...], each a "
     "shared object (CPU) or a CUDA fatbin (GPU, --cuda-accels) built "
     "against the SDK (docs/writing-apps.md); NAME, "
     "when given, must be the name it defines. One that does not fit is "
     "refused with the reason (--list-apps; the coordinator shows it on "
     "the services that use it) and the agent runs without it"},
    {"app-config", LYNX_OPT_STR, O(app_config), NULL, 0, 0, NULL,
     "static mode: the configuration --app's instances start with, a JSON "
     "object (docs/writing-apps.md) [default: the application's own]"},
    {"app-dir", LYNX_OPT_STR, O(app_dir), NULL, 0, 0, NULL,
     "a directory whose *.so and *.fatbin files are loaded as plug-in "
     "applications, in name order, after --app-load's"},
    {"list-apps", LYNX_OPT_FLAG, O(list_apps), NULL, 0, 0, NULL,
     "print the applications this agent runs, one a line, tab-separated "
     "(name, origin, the back end it calls or -, GPU kernel yes/no), then "
     "the refused plug-ins (refused, name, reason), and exit"},
    {"coordinator", LYNX_OPT_ADDRS, O(coordinator), NULL, 1, 65535, NULL,
     "host:port[,host:port...] of the coordinators: register with the one "
     "that leads and run what it places"},
    {"labels", LYNX_OPT_STR, O(labels), NULL, 0, 0, NULL,
     "k=v,... labels for placement selectors"},
    {"mqueues", LYNX_OPT_U32, O(mqueues), "4", 1, LYNX_MQUEUES_MAX, NULL,
     "static mode: server mqueues per accelerator"},
    {"slots", LYNX_OPT_U32, O(slots), "256", LYNX_SLOTS_MIN, LYNX_SLOTS_MAX,
     NULL, "static mode: slots per RX/TX ring (power of two)"},
    {"slot-size", LYNX_OPT_U32, O(slot_size), "2048", LYNX_SLOT_MIN,
     LYNX_SLOT_MAX, NULL,
     "static mode: bytes per slot incl. 16 B metadata (power of two)"},
    {"msg-max", LYNX_OPT_U32, O(msg_max), "1048576", 1, LYNX_LARGE_MAX / 2,
     NULL,
     "static mode: largest request or answer in bytes; beyond a "
     "slot's payload each ring gets a large-message area of the power of "
     "two at least twice this (docs/mqueue.md)"},
    {"work-us", LYNX_OPT_U32, O(work_us), "0", 0, 10000000, NULL,
     "static mode: emulated processing time per request, microseconds"},
    {"work-mode", LYNX_OPT_ENUM, O(work_mode), "spin", 0, 0, work_modes,
     "how work-us is emulated: spin (holds a core, like a busy GPU) or sleep "
     "(frees the core: many emulated accelerators on few cores)"},
    {"spin-us", LYNX_OPT_U32, O(spin_us), "200", 0, 10000000, NULL,
     "accelerator spins this long after its last request before it sleeps"},
    {"accel-threads", LYNX_OPT_U32, O(accel_threads), "1", 1, 64, NULL,
     "polling threads per accelerator"},
    {"listen", LYNX_OPT_ADDR, O(listen), "127.0.0.1:7701", 1, 65535, NULL,
     "static mode: control address frontends connect to"},
    {"node-id", LYNX_OPT_STR, O(node_id), NULL, 0, 0, NULL,
     "node name [default: host name]"},
    {"transport", LYNX_OPT_ENUM, O(transport), "auto", 0, 0, transports,
     "how frontends reach the mqueues: auto (shm for a frontend on this "
     "host and in this network namespace, tcp for the others), tcp (any "
     "host), shm (frontends on this host only), rdma (RDMA NIC)"},
    {"data-listen", LYNX_OPT_ADDR, O(data_listen), "0.0.0.0:0", 0, 65535, NULL,
     "tcp/rdma: address frontends' data connections reach (port 0: any)"},
    {"advertise", LYNX_OPT_STR, O(advertise), NULL, 0, 0, NULL,
     "tcp/rdma: host frontends use to reach --data-listen when it is a "
     "wildcard [default: this host's address on the control connection]"},
    {"ordering", LYNX_OPT_ENUM, O(ordering), "coalesced", 0, 0, orderings,
     "mqueue ordering mode advertised to frontends"},
    {"region-mem", LYNX_OPT_ENUM, O(region_mem), "auto", 0, 0, region_mems,
     "GPUs: where mqueue regions live: host (pinned host memory mapped "
     "into the GPU), device (GPU memory), auto (device for rdma, else "
     "host)"},
    LYNX_OPT_FRAME_MAX(O(frame_max)),
    {"data-conn-max", LYNX_OPT_U32, O(data_conn_max), "1024", 1, 1u << 20, NULL,
     "tcp: data connections open at once; more are closed at once"},
    {"data-unauth-max", LYNX_OPT_U32, O(data_unauth_max), "64", 1, 1u << 20,
     NULL,
     "tcp: of those, connections that have not presented a region "
     "key yet"},
    {"data-unauth-per-client", LYNX_OPT_U32, O(data_unauth_per_client), "8", 1,
     1u << 20, NULL, "tcp: of those, from one address"},
    {"control-conn-max", LYNX_OPT_U32, O(ctl_conn_max), "256", 1, 1u << 20,
     NULL, "static mode: control connections open at once"},
    {"control-unauth-max", LYNX_OPT_U32, O(ctl_unauth_max), "64", 1, 1u << 20,
     NULL, "static mode: of those, connections before a valid Hello"},
    {"control-unauth-per-client", LYNX_OPT_U32, O(ctl_unauth_per_client), "8",
     1, 1u << 20, NULL, "static mode: of those, from one address"},
    {"stop-timeout-ms", LYNX_OPT_U32, O(stop_timeout_ms), "15000", 0, 3600000,
     NULL,
     "under a coordinator, SIGTERM or SIGINT first has the node "
     "drained (nothing in flight lost), waiting at most this long; keep it "
     "above the coordinator's --drain-timeout-ms and below the service "
     "manager's stop timeout; 0: stop at once (a second signal does too)"},
    {"metrics", LYNX_OPT_ADDR, O(metrics), NULL, 1, 65535, NULL,
     "host:port for Prometheus /metrics and /healthz [default: off]"},
    {"token-file", LYNX_OPT_STR, O(token_file), NULL, 0, 0, NULL,
     "file holding the cluster token peers must present"},
    LYNX_OPT_TLS(O(tls_ca), O(tls_cert), O(tls_key),
                 "the cluster CA (PEM): the connection to the coordinator is "
                 "TLS, its certificate checked against the address dialed; "
                 "needs --tls-cert and --tls-key (docs/tls.md)"),
    LYNX_OPT_LOG_LEVEL(O(log_level), "info"),
    LYNX_OPT_END,
};
#undef O

/* Removes shared-memory files that an earlier agent of this node id left
 * when it died without cleaning up (kill -9): lynx-<node>-<pid>-i<id>
 * whose pid is gone, or is this agent's (called before any region). Only this
 * node id's files: region names start with the node id (which holds no '-'),
 * and files of other agents on the host, another node id's or another test's,
 * are theirs to clean. */
static void remove_stale_regions(const char *node_id) {
  DIR *d = opendir("/dev/shm");
  struct dirent *e;
  char prefix[LYNX_ID_MAX + 8];
  size_t plen;
  if (!d)
    return;
  plen = (size_t)snprintf(prefix, sizeof(prefix), "lynx-%s-", node_id);
  while ((e = readdir(d))) {
    char path[300];
    unsigned long long id;
    int pid, end = 0;
    if (strncmp(e->d_name, prefix, plen) != 0)
      continue;
    if (sscanf(e->d_name + plen, "%d-i%llu%n", &pid, &id, &end) != 2 ||
        e->d_name[plen + (size_t)end] != '\0')
      continue;
    /* this process's own pid is a dead predecessor's too (a container's
     * PID 1 restarted with the same /dev/shm): nothing of ours exists yet */
    if (pid <= 0 ||
        (pid != (int)getpid() && (kill(pid, 0) == 0 || errno != ESRCH)))
      continue;
    snprintf(path, sizeof(path), "/%s", e->d_name);
    if (shm_unlink(path) == 0)
      LYNX_INFO("agent", "removed stale region %s of dead agent pid %d", path,
                pid);
  }
  closedir(d);
}

/* --metrics (its own thread): the ports' guards and the lease fence. The
 * data port's guard is the transport handle's; before the handle exists,
 * and for a transport without one (shm, rdma), it reads as nothing. */
static void write_metrics(FILE *f, void *arg) {
  static const struct lynx_guard no_guard;
  struct agent *ag = arg;
  uint64_t until = __atomic_load_n(&ag->serve_until_ns, __ATOMIC_ACQUIRE);
  struct lynx_transport_agent *ta =
      __atomic_load_n(&ag->tagent, __ATOMIC_ACQUIRE);
  lynx_guard_metrics(f, "lynx_agent_data", "data port (tcp transport)",
                     ta && ta->guard ? ta->guard : &no_guard);
  lynx_guard_metrics(f, "lynx_agent_control", "static mode's control port",
                     &ag->ctl_guard);
  lynx_prom_family(f, "lynx_agent_lease_fenced", "gauge",
                   "1 while the accelerators take no new request because the "
                   "lease was not renewed (docs/design.md, \"Delivery "
                   "guarantees\").");
  lynx_prom_u64(f, "lynx_agent_lease_fenced", NULL, lynx_now_ns() >= until);
  agent_apphosts_metrics(f, ag);
  if (ag->cfg.coordinator) {
    struct sockaddr_storage ss[LYNX_ADDRS_MAX];
    char addrs[LYNX_ADDRS_MAX][LYNX_ADDR_STR_MAX];
    unsigned n = 0;
    lynx_prom_family(f, "lynx_agent_lease_renewals_total", "counter",
                     "Answers that renewed the lease fence, by the "
                     "coordinator address (--coordinator) that gave them: "
                     "heartbeat and registration answers, Hellos refused "
                     "because no coordinator leads, and connections "
                     "refused by a lone coordinator being restarted.");
    if (lynx_parse_hostports(ag->cfg.coordinator, ss, addrs, LYNX_ADDRS_MAX,
                             &n) == 0)
      for (unsigned i = 0; i < n; i++)
        lynx_prom_u64(
            f, "lynx_agent_lease_renewals_total",
            (const struct lynx_prom_label[]){{"coordinator", addrs[i]},
                                             {NULL, NULL}},
            __atomic_load_n(&ag->lease_renewals[i], __ATOMIC_RELAXED));
  }
  lynx_prom_family(f, "lynx_agent_left_requests_total", "counter",
                   "What instances left in their server mqueues when they "
                   "stopped: state=\"queued\", requests never taken (never "
                   "run); state=\"unread\", requests taken whose answers no "
                   "frontend read (they ran; a frontend may have counted "
                   "them lost).");
  lynx_prom_u64(
      f, "lynx_agent_left_requests_total",
      (const struct lynx_prom_label[]){{"state", "queued"}, {NULL, NULL}},
      __atomic_load_n(&ag->left_queued, __ATOMIC_RELAXED));
  lynx_prom_u64(
      f, "lynx_agent_left_requests_total",
      (const struct lynx_prom_label[]){{"state", "unread"}, {NULL, NULL}},
      __atomic_load_n(&ag->left_unread, __ATOMIC_RELAXED));
  lynx_prom_family(f, "lynx_agent_epoch", "gauge", "This agent's incarnation.");
  lynx_prom_u64(f, "lynx_agent_epoch", NULL,
                __atomic_load_n(&ag->epoch, __ATOMIC_RELAXED));
  agent_stats_metrics(ag, f);
}

static void agent_shutdown(struct agent *ag, int exit_code);

static void stop_timer_fired(uv_timer_t *t) {
  struct agent *ag = t->data;
  uint32_t n = 0;
  for (struct instance *in = ag->instances; in; in = in->next)
    n++;
  if (ag->stop_why)
    LYNX_WARN("agent", "%s: %s: stopping now, with %u instances", ag->node_id,
              ag->stop_why, n);
  else
    LYNX_WARN("agent",
              "%s: the drain did not finish within %u ms "
              "(--stop-timeout-ms): stopping now, with %u instances; "
              "requests in flight there end lost or in doubt",
              ag->node_id, ag->cfg.stop_timeout_ms, n);
  agent_shutdown(ag, 0);
}

/* A drain before stopping ends early for this reason (logged): the agent
 * shuts down on the next turn of the loop. */
static void agent_stop_soon(struct agent *ag, const char *why) {
  if (ag->stopping || !ag->leaving)
    return;
  ag->stop_why = why;
  uv_timer_start(&ag->stop_timer, stop_timer_fired, 0, 0);
}

/* SIGTERM or SIGINT (on_signal), or a device this process cannot use
 * again (agent_restart), what says which. Under a coordinator, with
 * instances running, the first one drains the node before the agent stops (a
 * restart under systemd or Kubernetes loses nothing in flight): the coordinator
 * takes it out of the frontends' tables, stops its instances once they answered
 * what they hold, and the agent then leaves. A second signal, or
 * --stop-timeout-ms, stops it at once. */
static void begin_stop(struct agent *ag, const char *what) {
  if (!ag->leaving && !ag->stopping && ag->cfg.stop_timeout_ms) {
    ag->leaving = 1; /* first: the link may end the wait (agent_stop_soon) */
    if (agent_link_leave_drained(ag) == 0) {
      LYNX_INFO("agent",
                "%s: %s: draining before stopping: the "
                "coordinator moves new requests away and stops the instances "
                "once the frontends answered what they hold (at most %u ms; "
                "a second signal stops at once)",
                ag->node_id, what, ag->cfg.stop_timeout_ms);
      lynx_notify_stopping("%s: draining, then shutting down", what);
      if (!uv_is_active((uv_handle_t *)&ag->stop_timer))
        uv_timer_start(&ag->stop_timer, stop_timer_fired,
                       ag->cfg.stop_timeout_ms, 0);
      return;
    }
    ag->leaving = 0;
  }
  LYNX_INFO("agent", "%s: %s, shutting down", ag->node_id, what);
  lynx_notify_stopping("%s, shutting down", what);
  agent_shutdown(ag, 0);
}

static void on_signal(uv_signal_t *s, int signum) {
  begin_stop(s->data, strsignal(signum));
}

/* ag->restart (health.c): a device this process cannot use again. */
static void agent_restart(struct agent *ag, const char *why) {
  int again = ag->exit_wanted || ag->leaving || ag->stopping;
  (void)why; /* logged by the caller */
  ag->exit_wanted = LYNX_EXIT_RESTART;
  /* another device failing (a module's bug faults every GPU it runs on),
   * or one during a drain already under way, does not cut that drain short
   * as a second signal would: the exit status alone changes */
  if (!again)
    begin_stop(ag, "a device failed for good in this process");
}

/* Orderly shutdown with this exit code (idempotent). */
static void agent_shutdown(struct agent *ag, int exit_code) {
  if (ag->stopping)
    return;
  ag->stopping = 1;
  ag->exit_code = exit_code ? exit_code : ag->exit_wanted;
  agent_serve_stop(ag);
  agent_link_stop(ag);
  agent_health_stop(ag);
  agent_apphosts_quiesce(ag); /* no plug-in's process is started again */
  uv_close((uv_handle_t *)&ag->sigint, NULL);
  uv_close((uv_handle_t *)&ag->sigterm, NULL);
  uv_close((uv_handle_t *)&ag->stop_timer, NULL);
}

/* Static mode: one instance per accelerator that runs app, ids 0..N-1 (a
 * GPU application's module none on the CPU accelerators beside it). */
static int static_instances(struct agent *ag, const struct lynx_app *app) {
  uint32_t started = 0;
  for (uint32_t i = 0; i < ag->n_acc; i++) {
    struct instance *in;
    char why[256];
    struct instance_req q = {.id = i,
                             .accel = i,
                             .service = app->name,
                             .app = app,
                             .mqueues = ag->cfg.mqueues,
                             .slots = ag->cfg.slots,
                             .slot_size = ag->cfg.slot_size,
                             .msg_max = ag->cfg.msg_max,
                             .work_us = ag->cfg.work_us,
                             .config = ag->cfg.app_config};
    int rc;
    if (!ag->acc[i].info.ops->runs_app(&ag->acc[i].info, app)) {
      LYNX_INFO("agent", "accel %u (%s) does not run '%s': no instance there",
                i, ag->acc[i].info.where, app->name);
      continue;
    }
    rc = agent_instance_start(ag, &q, &in, why, sizeof(why));
    if (rc) {
      fprintf(stderr, "lynx-agent: accel %u: %s\n", i,
              why[0] ? why : strerror(-rc));
      return rc;
    }
    started++;
  }
  if (!started) {
    fprintf(stderr,
            "lynx-agent: --app %s: no accelerator of this agent runs it\n",
            app->name);
    return -ENOTSUP;
  }
  return 0;
}

/* The accelerator backends (accel.h), in the order their accelerators are
 * numbered: GPUs first (--cuda-accels), then CPU-emulated ones
 * (--cpu-accels). */
#define N_BACKENDS 2
static const struct lynx_accel_ops *const backends[N_BACKENDS] = {
    &lynx_accel_cuda, &lynx_accel_cpu};

/* What the command line asks of each backend (NULL: nothing); cpus holds
 * the CPU count's text. */
static void backend_specs(const struct agent_cfg *cfg, int cpu_given,
                          char *cpus, size_t cpus_len,
                          const char *spec[N_BACKENDS]) {
  snprintf(cpus, cpus_len, "%u", cfg->cpu_accels);
  spec[0] = cfg->cuda_accels;
  /* none alongside --cuda-accels unless --cpu-accels is given */
  spec[1] = cfg->cpu_accels && (cpu_given || !cfg->cuda_accels) ? cpus : NULL;
}

/* The accelerators, each backend's in turn. 0, or -errno after printing
 * why (-EINVAL: the command line asks for what cannot be). */
static int find_accels(struct agent *ag, int cpu_given) {
  struct lynx_accel_dev *found[N_BACKENDS] = {NULL};
  uint32_t n[N_BACKENDS] = {0}, total = 0, k = 0;
  const char *spec[N_BACKENDS];
  char cpus[16];
  int rc = 0;
  backend_specs(&ag->cfg, cpu_given, cpus, sizeof(cpus), spec);
  for (int b = 0; b < N_BACKENDS; b++) {
    char err[320];
    if (!spec[b])
      continue;
    rc = backends[b]->discover(spec[b], ag->tops,
                               (enum lynx_region_where)ag->cfg.region_mem,
                               &found[b], &n[b], err, sizeof(err));
    if (rc) {
      fprintf(stderr, "lynx-agent: %s\n", err);
      goto out;
    }
    total += n[b];
  }
  if (total == 0) {
    fprintf(stderr, "lynx-agent: no accelerators (--cpu-accels 0 without "
                    "--cuda-accels)\n");
    rc = -EINVAL;
    goto out;
  }
  if (total > LYNX_ACCELS_MAX) {
    fprintf(stderr, "lynx-agent: at most %d accelerators\n", LYNX_ACCELS_MAX);
    rc = -EINVAL;
    goto out;
  }
  ag->n_acc = total;
  ag->acc = calloc(ag->n_acc, sizeof(*ag->acc));
  if (!ag->acc) {
    rc = -ENOMEM;
    goto out;
  }
  for (int b = 0; b < N_BACKENDS; b++)
    for (uint32_t j = 0; j < n[b]; j++, k++) {
      struct agent_accel *a = &ag->acc[k];
      a->info = found[b][j];
      a->ordering = (uint32_t)ag->cfg.ordering;
      /* fenced when the device does not order the NIC's writes itself */
      if (a->info.ordering == LYNX_ORDER_FENCED)
        a->ordering = LYNX_ORDER_FENCED;
      if (a->info.about[0])
        fprintf(stderr, "lynx-agent: accel %u: %s -> %s mode\n", k,
                a->info.about,
                a->ordering == LYNX_ORDER_FENCED ? "fenced" : "coalesced");
    }
out:
  for (int b = 0; b < N_BACKENDS; b++)
    free(found[b]);
  return rc;
}

/* The GPU applications read at load (lynx_app_load_module), each taken by
 * the backend of the accelerators found that runs its code (accel.h's
 * adopt), or refused with the reason, kept for the coordinator. */
static void adopt_modules(struct agent *ag) {
  struct lynx_accel_dev *devs =
      calloc(ag->n_acc ? ag->n_acc : 1, sizeof(*devs));
  struct lynx_app *app;
  while ((app = lynx_app_module_at(0))) {
    char why[320] = "";
    int rc = -ENOTSUP;
    for (int b = 0; devs && b < N_BACKENDS && rc == -ENOTSUP; b++) {
      uint32_t n = 0;
      for (uint32_t i = 0; i < ag->n_acc; i++)
        if (ag->acc[i].info.ops == backends[b])
          devs[n++] = ag->acc[i].info;
      if (n)
        rc = backends[b]->adopt(devs, n, app, why, sizeof(why));
    }
    if (!devs)
      snprintf(why, sizeof(why), "out of memory");
    else if (rc == -ENOTSUP)
      snprintf(why, sizeof(why),
               "a GPU application (a CUDA module), and this agent has no "
               "GPU (--cuda-accels)");
    if (rc)
      lynx_app_drop(app, why);
  }
  free(devs);
}

/* A plug-in's file: a CUDA module is read here and taken by the CUDA
 * backend once it has found its GPUs (adopt_modules); a shared object is
 * served by a process of its own (apphost.c). */
static int load_plugin(void *arg, const char *name, const char *path, char *why,
                       size_t whylen) {
  if (lynx_app_is_fatbin(path))
    return lynx_app_load_module(name, path, why, whylen);
  return agent_apphost_load(arg, name, path, why, whylen);
}

/* --lenet-model as lenet's default configuration, then the plug-ins of
 * --app-load and --app-dir. A plug-in refused is logged and kept with its
 * reason (registered with the coordinator); -1 only when the options
 * themselves are wrong (printed). */
static int load_apps(struct agent *ag) {
  const struct agent_cfg *cfg = &ag->cfg;
  char why[768];
  if (cfg->lenet_model && cfg->lenet_model[0]) {
    struct json_object *o = json_object_new_object();
    int rc;
    if (!o)
      return -1;
    json_object_object_add(o, "model",
                           json_object_new_string(cfg->lenet_model));
    rc = lynx_app_set_default(
        "lenet", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN), why,
        sizeof(why));
    json_object_put(o);
    if (rc) {
      fprintf(stderr, "--lenet-model: %s\n", why);
      return -1;
    }
  }
  if (cfg->app_load) {
    char *list = strdup(cfg->app_load), *save = NULL;
    if (!list)
      return -1;
    for (char *it = strtok_r(list, ",", &save); it;
         it = strtok_r(NULL, ",", &save)) {
      char *eq = strchr(it, '='), *name = NULL, *path = it;
      if (eq && (!strchr(it, '/') || eq < strchr(it, '/'))) {
        *eq = 0;
        name = it;
        path = eq + 1;
      }
      if (!path[0]) {
        fprintf(stderr, "--app-load: '%s' names no file ([NAME=]PATH)\n", it);
        free(list);
        return -1;
      }
      if (load_plugin(ag, name, path, why, sizeof(why)))
        LYNX_ERR("agent", "--app-load: plug-in refused: %s", why);
    }
    free(list);
  }
  if (cfg->app_dir &&
      lynx_app_load_dir(cfg->app_dir, load_plugin, ag, why, sizeof(why)) < 0)
    LYNX_ERR("agent", "%s", why); /* loaded nothing; the agent runs */
  return 0;
}

/* Why static mode's --app name has no application: its plug-in's refusal,
 * or none of that name (stderr). */
static void app_missing(const char *name) {
  const char *reason = lynx_app_refusal(name);
  if (reason)
    fprintf(stderr, "--app %s: its plug-in was refused: %s\n", name, reason);
  else
    fprintf(stderr, "--app: unknown application '%s' (known: %s)\n", name,
            lynx_app_names());
}

/* Static mode's --app once the GPU modules were taken (adopt_modules), when
 * it may be one: origin is the file of the module it named (read under its
 * file's name, which its description may have changed), "" for a name the
 * agent did not know before (perhaps a module's own). The application, or
 * NULL after printing why. */
static const struct lynx_app *static_app(const struct agent *ag,
                                         const char *origin) {
  const char *name = ag->cfg.app ? ag->cfg.app : "sockperf-echo";
  const struct lynx_app *a = NULL;
  if (origin[0]) {
    for (size_t i = 0; (a = lynx_app_at(i)); i++)
      if (a->image && !strcmp(a->origin, origin))
        break;
  } else {
    a = lynx_app_find(name);
  }
  if (a && strcmp(a->name, name))
    LYNX_INFO("agent", "--app %s: the module %s names its application '%s'",
              name, origin, a->name);
  if (!a)
    app_missing(name);
  return a;
}

static void list_apps(void) {
  const struct lynx_app *a;
  const char *name, *reason;
  for (size_t i = 0; (a = lynx_app_at(i)); i++)
    printf("%s\t%s\t%s\t%s\n", a->name, a->origin,
           a->needs_backend ? a->needs_backend : "-",
           a->cuda_app != LYNX_CUDA_APP_NONE ? "yes"
           : a->image ? "only" /* a module: its GPUs are looked at later */
                      : "no");
  for (size_t i = 0; lynx_app_refused_at(i, &name, &reason); i++)
    printf("refused\t%s\t%s\n", name, reason);
}

int main(int argc, char **argv) {
  int help = 0; /* --help was printed */
  static struct agent ag;
  const struct lynx_app *app = NULL;
  struct lynx_geom g;
  int rc, lvl, exit_code = 1;
  struct timeval tv;
  char static_module[4096] = ""; /* static mode's GPU module (static_app) */
  int static_later = 0;          /* --app is looked up once they are taken */
  char tok_err[320];

  /* a plug-in's process (apphost.c), started by an agent: no options */
  if (argc > 1 && !strcmp(argv[1], "--app-host"))
    return agent_app_host_main(argc, argv);
  pthread_mutex_init(&ag.lat_lock, NULL);
  rc = lynx_opts_parse_conf(agent_opts, &ag.cfg, argc, argv,
                            "usage: lynx-agent [options]\n"
                            "Runs accelerator instances: static (--app) "
                            "or as the coordinator places them "
                            "(--coordinator).",
                            &help);
  if (rc || help)
    return rc ? lynx_opts_exit_code(rc) : 0;
  signal(SIGPIPE, SIG_IGN);
  srand((unsigned)lynx_now_ns());
  lvl = lynx_log_parse_level(ag.cfg.log_level);
  if (lvl < 0) {
    fprintf(stderr, "--log-level: unknown level '%s'\n", ag.cfg.log_level);
    goto usage;
  }
  lynx_log_level = lvl;
  if (load_apps(&ag))
    goto usage;
  if (ag.cfg.list_apps) {
    list_apps();
    exit_code = 0;
    goto out_opts;
  }
  if (ag.cfg.app_config) {
    struct json_object *c = json_tokener_parse(ag.cfg.app_config);
    int ok = c && json_object_is_type(c, json_type_object) &&
             strlen(ag.cfg.app_config) < LYNX_APP_CONFIG_MAX;
    json_object_put(c);
    if (ag.cfg.coordinator || !ok) {
      fprintf(stderr, "--app-config: %s\n",
              ag.cfg.coordinator
                  ? "for static mode (--app); under a coordinator each "
                    "service carries its own (app_config)"
                  : "not a JSON object of at most 4095 bytes");
      goto usage;
    }
  }
  if (ag.cfg.coordinator && ag.cfg.app) {
    fprintf(stderr,
            "--app %s: --app is for static mode; with --coordinator "
            "the coordinator says what to run\n",
            ag.cfg.app);
    goto usage;
  }
  if (!ag.cfg.coordinator) {
    const char *name = ag.cfg.app ? ag.cfg.app : "sockperf-echo";
    app = lynx_app_find(name);
    /* a GPU module read under its file's name may be renamed by its own
     * description, or be the one named, once adopted (static_app) */
    if (app && app->image) {
      snprintf(static_module, sizeof(static_module), "%s", app->origin);
      static_later = 1;
    }
    if (!app && !lynx_app_refusal(name) && lynx_app_module_at(0)) {
      static_later = 1; /* unknown until the modules are taken */
    } else if (!app) {
      app_missing(name);
      goto usage;
    }
    if (lynx_geom_init(&g, ag.cfg.mqueues, ag.cfg.slots, ag.cfg.slot_size,
                       lynx_large_for(ag.cfg.msg_max, ag.cfg.slot_size))) {
      fprintf(stderr,
              "--slots %u, --slot-size %u: both must be powers of "
              "two\n",
              ag.cfg.slots, ag.cfg.slot_size);
      goto usage;
    }
  }
  if (ag.cfg.labels && lynx_labels_parse(ag.cfg.labels, ag.labels,
                                         LYNX_LABELS_MAX, &ag.n_labels)) {
    fprintf(stderr, "--labels: '%s' is not k=v,k2=v2 (at most %d)\n",
            ag.cfg.labels, LYNX_LABELS_MAX);
    goto usage;
  }
  ag.tops = lynx_transport_find(ag.cfg.transport == TRANSPORT_AUTO
                                    ? "tcp"
                                    : transports[ag.cfg.transport]);
  if (ag.cfg.transport == TRANSPORT_AUTO &&
      lynx_local_identity(ag.host_id, ag.netns_id))
    LYNX_WARN("agent", "--transport auto: this host's identity is not in "
                       "/proc: frontends reach the regions over tcp only");
  if (!ag.tops) {
    fprintf(stderr, "--transport %s: not built into this lynx-agent\n",
            transports[ag.cfg.transport]);
    goto usage;
  }
  if (ag.cfg.token_file &&
      lynx_read_token(ag.cfg.token_file, &ag.token, tok_err, sizeof(tok_err))) {
    fprintf(stderr, "%s\n", tok_err);
    goto out_opts;
  }
  {
    struct lynx_tls_files tf = {ag.cfg.tls_ca, ag.cfg.tls_cert, ag.cfg.tls_key};
    char tls_err[512];
    rc = lynx_tls_load_client(&ag.tls, &tf, ag.cfg.coordinator != NULL, tls_err,
                              sizeof(tls_err));
    if (rc < 0) {
      fprintf(stderr, "%s\n", tls_err);
      goto usage;
    }
    ag.tls_on = rc == 0;
  }
  if (ag.cfg.node_id) {
    if (strlen(ag.cfg.node_id) >= 32 || strpbrk(ag.cfg.node_id, "-/ ")) {
      fprintf(stderr,
              "--node-id: '%s' is not a node id (at most 31 "
              "characters, no '-', '/' or ' ')\n",
              ag.cfg.node_id);
      goto usage;
    }
    snprintf(ag.node_id, sizeof(ag.node_id), "%s", ag.cfg.node_id);
  } else {
    gethostname(ag.node_id, 32);
    ag.node_id[31] = 0;
    for (char *c = ag.node_id; *c; c++)
      if (*c == '-' || *c == '/' || *c == ' ')
        *c = '_';
  }
  /* Under a coordinator the epoch is 0 until it issues one from its store
   * (RegisterReply.epoch: strictly increasing whatever this host's clock
   * does). Static mode has no store: microseconds of wall-clock time. */
  gettimeofday(&tv, NULL);
  ag.epoch = !ag.cfg.coordinator
                 ? (uint64_t)tv.tv_sec * 1000000u + (uint64_t)tv.tv_usec
                 : 0;
  {
    int cpu_given = 0;
    for (int i = 1; i < argc; i++)
      cpu_given |= !strncmp(argv[i], "--cpu-accels", 12);
    rc = find_accels(&ag, cpu_given);
    if (rc == -EINVAL) /* the command line asks for what cannot be */
      goto usage;
    if (rc)
      goto out_opts;
  }
  adopt_modules(&ag);
  if (static_later && !(app = static_app(&ag, static_module)))
    goto out_acc;
  if (ag.cfg.list_accels) {
    for (uint32_t i = 0; i < ag.n_acc; i++) {
      const struct agent_accel *a = &ag.acc[i];
      printf("%u\t%s\t%s\t%llu\t%s\t%s\n", i, a->info.ops->kind, a->info.model,
             (unsigned long long)a->info.memory,
             a->info.pci_bus_id[0] ? a->info.pci_bus_id : "-",
             a->ordering == LYNX_ORDER_FENCED ? "fenced" : "coalesced");
    }
    exit_code = 0;
    goto out_acc;
  }

  lynx_guard_init(&ag.ctl_guard, ag.cfg.ctl_conn_max, ag.cfg.ctl_unauth_max,
                  ag.cfg.ctl_unauth_per_client);
  if (ag.cfg.metrics && lynx_prom_start(ag.cfg.metrics, "lynx_agent_metrics",
                                        write_metrics, &ag, &ag.metrics))
    goto out_acc; /* the reason, with the address, is on stderr */
  {
    const struct lynx_transport_opts topts = {
        .listen = ag.cfg.data_listen,
        .conn_max = ag.cfg.data_conn_max,
        .unauth_max = ag.cfg.data_unauth_max,
        .per_source = ag.cfg.data_unauth_per_client,
        .share = ag.cfg.transport == TRANSPORT_AUTO && ag.host_id[0],
    };
    struct lynx_transport_agent *ta = NULL;
    char err[320];
    rc = ag.tops->agent_create(&topts, &ta, err, sizeof(err));
    if (rc) {
      fprintf(stderr, "lynx-agent: --transport %s: %s\n", ag.tops->name, err);
      lynx_prom_stop(ag.metrics);
      goto out_acc;
    }
    snprintf(ag.data_bound, sizeof(ag.data_bound), "%s", ta->bound);
    __atomic_store_n(&ag.tagent, ta, __ATOMIC_RELEASE); /* for --metrics */
  }
  remove_stale_regions(ag.node_id);
  uv_loop_init(&ag.loop);
  uv_signal_init(&ag.loop, &ag.sigint);
  uv_signal_init(&ag.loop, &ag.sigterm);
  ag.sigint.data = ag.sigterm.data = &ag;
  uv_timer_init(&ag.loop, &ag.stop_timer);
  ag.stop_timer.data = &ag;
  uv_signal_start(&ag.sigint, on_signal, SIGINT);
  uv_signal_start(&ag.sigterm, on_signal, SIGTERM);
  ag.restart = agent_restart;
  agent_health_start(&ag);
  ag.loop_ready = 1;
  agent_apphosts_start(&ag);
  /* static mode has no lease: nothing fences its accelerators; under a
   * coordinator they take requests once the registration is answered */
  ag.serve_until_ns = app ? UINT64_MAX : 0;
  if (app) {
    rc = static_instances(&ag, app);
    if (!rc)
      rc = agent_serve_start(&ag);
  } else {
    static const struct agent_link_hooks hooks = {.shutdown = agent_shutdown,
                                                  .stop_soon = agent_stop_soon};
    rc = agent_link_start(&ag, &hooks);
  }
  if (rc) {
    agent_shutdown(&ag, 1);
  } else {
    struct json_object *j = lynx_opts_json(agent_opts, &ag.cfg);
    char counts[64] = ""; /* "1 GPU and 2 CPU", a count per backend */
    for (int b = 0; b < N_BACKENDS; b++) {
      size_t len = strlen(counts);
      uint32_t n = 0;
      for (uint32_t i = 0; i < ag.n_acc; i++)
        n += ag.acc[i].info.ops == backends[b];
      snprintf(counts + len, sizeof(counts) - len, "%s%u %s", b ? " and " : "",
               n, backends[b]->noun);
    }
    /* static mode serves its descriptors to frontends itself; under a
     * coordinator they go to it with the registration */
    LYNX_INFO("agent",
              "%s: epoch %llu, %s accelerators, %s %s; "
              "transport %s%s%s%s; config %s",
              ag.node_id, (unsigned long long)ag.epoch, counts,
              app ? "static mode: serving descriptors on"
                  : "coordinator mode: registering its descriptors with",
              app ? ag.cfg.listen : ag.cfg.coordinator, ag.tops->name,
              ag.data_bound[0] ? " on " : "", ag.data_bound,
              ag.tagent->share ? "; shm too, to frontends on this host and "
                                 "in this network namespace"
                               : "",
              json_object_to_json_string_ext(j, JSON_C_TO_STRING_PLAIN));
    json_object_put(j);
  }
  if (app) /* static: serving now (coordinator mode: once registered) */
    lynx_notify_ready("static mode: serving descriptors on %s", ag.cfg.listen);
  uv_run(&ag.loop, UV_RUN_DEFAULT);
  if (uv_loop_close(&ag.loop))
    LYNX_WARN("agent", "loop closed with handles open");
  exit_code = ag.exit_code;
  agent_instances_stop_all(&ag);
  lynx_prom_stop(ag.metrics); /* it reads the handle's guard */
  agent_stats_free(&ag);
  ag.tops->agent_destroy(ag.tagent); /* every region's memory released */
  ag.tagent = NULL;
  for (int b = 0; b < N_BACKENDS; b++)
    backends[b]->shutdown();
out_acc:
  free(ag.acc);
  goto out_opts;
usage:
  exit_code = LYNX_EXIT_USAGE;
out_opts:
  agent_apphosts_stop(&ag); /* no instance runs any more */
  lynx_apps_unload();
  if (ag.tls_on)
    lynx_tls_free(&ag.tls);
  free(ag.token);
  lynx_opts_free(agent_opts, &ag.cfg);
  return exit_code;
}
