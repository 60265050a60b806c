/*
 * agent.h - lynx-agent's shared state.
 *
 * One agent per accelerator host. It runs *instances*: one service on one
 * accelerator, with its own mqueue region (allocated through the transport)
 * and the application's persistent polling threads. In static mode
 * (--app) it starts one instance per accelerator and serves their
 * descriptors to one frontend (serve.c); under a coordinator (--coordinator)
 * it registers, heartbeats, and starts and stops instances when told
 * (link.c). Everything but the accelerator threads runs on the main
 * thread's libuv loop.
 */
#ifndef LYNX_AGENT_H
#define LYNX_AGENT_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <uv.h>

#include "accel.h"
#include "connguard.h"
#include "ctlconn.h"
#include "transport.h"
#include "wire.h"

struct agent_cfg {
  uint32_t cpu_accels, mqueues, slots, slot_size, msg_max, work_us, spin_us,
      accel_threads, frame_max, stall_ms, gpu_threads, gpu_blocks, gpu_idle_ns;
  uint32_t data_conn_max, data_unauth_max, data_unauth_per_client, ctl_conn_max,
      ctl_unauth_max, ctl_unauth_per_client, stop_timeout_ms;
  char *tls_ca, *tls_cert, *tls_key; /* the link to the coordinator */
  char *app, *listen, *node_id, *log_level, *token_file, *coordinator, *labels,
      *data_listen, *advertise, *cuda_accels, *metrics, *lenet_model;
  char *app_load, *app_dir; /* plug-ins (apps.h) */
  char *app_config;         /* static mode: --app's configuration */
  int transport, ordering, work_mode, list_accels, list_apps;
  int region_mem; /* enum lynx_region_where */
};

/* Liveness of one server mqueue (health.c). */
struct mq_watch {
  uint32_t cons;     /* RX consumer index last seen */
  uint64_t since_ns; /* a request pending at cons since (0: none) */
  int stalled;
};

struct instance {
  uint64_t id;
  uint32_t accel;
  char service[LYNX_ID_MAX];
  struct lynx_region region;
  struct lynx_region_desc desc;
  struct lynx_accel_inst *run; /* the accelerator's side (accel.h) */
  char (*backends)[LYNX_BACKEND_NAME_MAX]; /* names of its client mqueues' back
                                              ends */
  uint32_t n_backends;
  uint32_t n_server, work_us;
  struct mq_watch *watch; /* one per server mqueue */
  const struct lynx_app *app;
  void *app_state; /* its start's (lynx_app_start), for its stop */
  /* its app's start still runs elsewhere (a plug-in's process): not ready,
   * not registered, until agent_instance_started */
  int pending;
  int running;
  struct instance *next;
};

struct agent_accel {
  struct lynx_accel_dev info; /* as its backend found it (accel.h) */
  uint32_t ordering;          /* enum lynx_ordering its regions advertise */
  /* counters of instances that have stopped, so totals never go back */
  uint64_t requests, responses;
  /* health (health.c), reported in every heartbeat */
  int device_lost, failed;
  char last_error[128];
  uint32_t stalled_mqueues;
  uint64_t stall_ms;
  /* the device's budget of resident blocks at --gpu-threads and what the
   * running kernels hold of it (accel.h blocks; 0 and 0: none, a CPU),
   * registered and reported in every heartbeat */
  uint32_t resident_blocks, blocks_held;
  /* stats.c: queueing and service times as the accelerator stamps them
   * (lathist.h). done: instances that stopped; old and mid: totals at the
   * ends of the recent window (mid taken at mid_ns); q: its quantiles for
   * the heartbeat; pub: the last total, for --metrics (under lat_lock).
   * Copies into its memory likewise: cdone, cpub. */
  struct lynx_lat done, old, mid, pub;
  struct lynx_accel_copies cdone, cpub;
  uint64_t mid_ns;
  struct agent_lat_q {
    uint64_t window_requests, queue_p50, queue_p99, service_p50, service_p99;
  } q;
};

struct peer;
struct coord_link;

struct agent {
  struct agent_cfg cfg;
  const struct lynx_transport_ops *tops;
  struct lynx_transport_agent *tagent; /* tops' handle: regions, data port */
  char data_bound[LYNX_LOCATOR_MAX]; /* tcp/rdma: where data connections land */
  /* --transport auto: this host's and network namespace's identity, which
   * descriptors of shared regions carry (lynx_local_identity); "" else */
  char host_id[LYNX_IDENT_MAX], netns_id[LYNX_IDENT_MAX];
  char node_id[LYNX_ID_MAX];
  char *token;
  struct lynx_tls tls; /* --tls-*: loaded when tls_on */
  int tls_on;
  uint64_t epoch;
  struct lynx_label labels[LYNX_LABELS_MAX];
  uint32_t n_labels;
  struct agent_accel *acc;
  uint32_t n_acc;
  struct instance *instances;
  uv_loop_t loop;
  int loop_ready; /* loop initialised (apphost.c watches its processes) */
  struct app_host *apphosts; /* plug-ins' processes (apphost.c) */
  /* tells the coordinator that an instance failed (link.c sets it when it
   * starts: agent_link_instance_failed; NULL in static mode) */
  void (*report_failed)(struct agent *ag, uint64_t id, const char *why);
  /* tells the coordinator that a pending instance is ready (link.c) */
  void (*report_ready)(struct agent *ag, struct instance *in);
  /* drains this node, as a signal does, then exits with LYNX_EXIT_RESTART
   * for the supervisor to start the agent again (main.c; health.c calls it
   * when a device cannot be used again in this process) */
  void (*restart)(struct agent *ag, const char *why);
  uv_signal_t sigint, sigterm;
  int stopping, exit_code;
  int exit_wanted; /* the exit code a shutdown with 0 uses instead */
  /* A signal under a coordinator drains before stopping (main.c,
   * on_signal): leaving is set while the coordinator drains this node
   * (from just before the Leave with drain is sent; link.c reads it);
   * stop_timer ends the wait after --stop-timeout-ms, or at once (0 ms)
   * when the link can no longer finish it. */
  int leaving;
  uv_timer_t stop_timer;
  const char *stop_why;
  /* static mode */
  uv_tcp_t server;
  int server_open;
  struct lynx_guard ctl_guard; /* its control port (connguard.h) */
  uv_timer_t serve_sweep;      /* closes peers silent past the Hello timeout */
  int sweep_open;
  void *metrics; /* --metrics endpoint (promhttp.h) */
  struct peer *peers;
  struct peer *owner;
  /* coordinator mode */
  struct coord_link *link;
  /* Lease fence (link.c): accelerators take new requests only while the
   * monotonic clock (lynx_now_ns) is below this; UINT64_MAX in static mode
   * (no lease). Written by the loop thread, read by accelerator threads. */
  uint64_t serve_until_ns;
  /* Answers that renewed the fence, by the --coordinator address that gave
   * them (heartbeat and registration answers, no_leader refusals, a
   * refused connection): link.c counts, --metrics reads (relaxed). */
  uint64_t lease_renewals[LYNX_ADDRS_MAX];
  /* What instances left behind when they stopped (instance.c,
   * leftovers): request slots still published (never taken, but for one
   * taken and not yet released per accelerator thread) and requests taken
   * whose answers no frontend read (they ran). Loop thread writes, the
   * metrics thread reads (relaxed atomics). */
  uint64_t left_queued, left_unread;
  /* health.c */
  uv_timer_t health;
  int health_open;
  pthread_mutex_t lat_lock; /* every acc[].pub and cpub (stats.c) */
  /* stats.c: each instance's region fencing (lynx_region_fence_stats) as
   * the last health sample saw it, for --metrics (under lat_lock: the
   * metrics thread cannot walk instances) */
  struct agent_fence_pub {
    uint64_t instance;
    struct lynx_fence_stats s;
  } * fpub;
  uint32_t n_fpub, fpub_cap;
};

/* apphost.c: plug-in applications in processes of their own */
struct app_host;
/* A lynx_app_loader (apps.h): the plug-in at path, loaded by a process of
 * its own and registered as served by it. */
int agent_apphost_load(void *ag, const char *name, const char *path, char *why,
                       size_t whylen);
void agent_apphosts_start(struct agent *ag);   /* once the loop is ready */
void agent_apphosts_quiesce(struct agent *ag); /* at shutdown: no restarts */
void agent_apphosts_stop(struct agent *ag); /* after every instance stopped */
void agent_apphosts_metrics(FILE *f, struct agent *ag);
/* The plug-ins whose process died, for a heartbeat: into out (room for
 * LYNX_APP_FAULTS_MAX, pointing into the hosts), how many. */
struct Lynx__AppFault;
size_t agent_apphosts_faults(struct agent *ag, struct Lynx__AppFault *out);
/* Instance in (of any app) has had a request pending stall_ms: when a
 * plug-in's process runs it, that process is killed (and taken over) and
 * 1 is returned, so the stall is not the accelerator's; else 0. */
int agent_apphost_hung(struct agent *ag, struct instance *in,
                       uint64_t stall_ms);
/* lynx-agent --app-host PATH NAME LOGLEVEL: the process itself. */
int agent_app_host_main(int argc, char **argv);

/* instance.c */
/* What to start: instance id of app for service on accelerator accel, its
 * geometry, and the names of the back ends its client mqueues reach. */
struct instance_req {
  uint64_t id;
  uint32_t accel;
  const char *service;
  const struct lynx_app *app;
  uint32_t mqueues, slots, slot_size, msg_max, work_us;
  char (*backends)[LYNX_BACKEND_NAME_MAX];
  uint32_t n_backends;
  /* the service's app configuration, JSON ("" or NULL: the app's default) */
  const char *config;
};
/* 0, or -errno with the reason in why */
int agent_instance_start(struct agent *ag, const struct instance_req *q,
                         struct instance **out, char *why, size_t whylen);
void agent_instance_stop(struct agent *ag, struct instance *in);
/* A pending instance's start ended: ready (rc 0, reported), or failed
 * with why (reported, and the instance stopped). */
void agent_instance_started(struct agent *ag, struct instance *in, int rc,
                            const char *why);
/* The descriptor of an instance as advertised on control connection ctl:
 * a wildcard host in the locator becomes --advertise or the address ctl
 * is bound to. loc (LYNX_LOCATOR_MAX bytes) holds the locator pb points
 * to. */
void agent_instance_pb(const struct agent *ag, const struct instance *in,
                       const struct lynx_ctl *ctl, char *loc,
                       struct Lynx__RegionDesc *pb);
struct instance *agent_instance_find(struct agent *ag, uint64_t id);
void agent_instances_stop_all(struct agent *ag);
/* The lease fence moved to serve_until_ns: every running instance's
 * accelerator learns it (its backend's fence op), and is woken when wake:
 * the fence had passed, so its pollers may sleep on their doorbells. */
void agent_instances_fence(struct agent *ag, int wake);
/* totals per accelerator: stopped instances plus running ones */
void agent_accel_counters(struct agent *ag, uint32_t accel, uint64_t *req,
                          uint64_t *resp);

/* stats.c: accelerator-stamped latency (lathist.h) and the copies made
 * into accelerator memory, sampled with the health timer; a stopping
 * instance's kept; their --metrics (on the metrics thread) */
void agent_stats_sample(struct agent *ag, uint64_t now_ns);
void agent_stats_keep(struct agent *ag, struct instance *in);
void agent_stats_metrics(struct agent *ag, FILE *f);
void agent_stats_free(struct agent *ag);

/* health.c: data-path liveness and device health, sampled on a timer */
void agent_health_start(struct agent *ag);
void agent_health_stop(struct agent *ag);
void agent_health_sample(struct agent *ag, uint64_t now_ns);
/* Each accelerator's resident blocks and those held (accel.h blocks), as
 * of now: asked for each Register and each heartbeat, which send them. */
void agent_health_blocks(struct agent *ag);

/* serve.c (static mode) */
int agent_serve_start(struct agent *ag);
void agent_serve_stop(struct agent *ag);

/* link.c (coordinator mode). The link ends the agent through what the
 * process gives it at start (main.c's orderly shutdown and early end of a
 * drain), never by calling up into main.c. */
struct agent_link_hooks {
  /* orderly shutdown with this exit code (idempotent) */
  void (*shutdown)(struct agent *ag, int exit_code);
  /* a drain before stopping ends early for this reason (logged) */
  void (*stop_soon)(struct agent *ag, const char *why);
};
int agent_link_start(struct agent *ag, const struct agent_link_hooks *hooks);
void agent_link_stop(struct agent *ag); /* sends Leave when connected */
/* Tells the coordinator that instance id failed, with why (when
 * registered): it forgets it and places it again after a backoff. */
void agent_link_instance_failed(struct agent *ag, uint64_t id, const char *why);
/* Asks the coordinator to drain this node before it leaves (Leave with
 * drain; the caller sets ag->leaving first): 0, the agent waits until the
 * coordinator has stopped every instance (then hooks->shutdown); a link
 * lost meanwhile is dialled again and a coordinator that answers within
 * 2 s (or a lease) is asked again (else hooks->stop_soon; the caller's
 * stop timer bounds it all); -1 when there is nothing to drain, or no
 * coordinator to drain it (not registered): stop at once. */
int agent_link_leave_drained(struct agent *ag);

#endif
