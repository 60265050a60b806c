/*
 * coordd.h - lynx-coordinator's own state, shared by the daemon's files:
 * main.c (flags, start, stop), tick.c (the lease tick, wake-ups and the
 * election's role changes), ctlport.c (the control port: agents' and
 * frontends' connections and messages) and actions.c (what the registry
 * asks for, under its lock, sent from the loop: instance starts and
 * stops, epochs, dispatch tables). Calls go one way: main.c -> tick.c ->
 * ctlport.c -> actions.c.
 */
#ifndef LYNX_COORDD_H
#define LYNX_COORDD_H

#include <pthread.h>
#include <stdint.h>
#include <uv.h>

#include "coord.h"
#include "ctlconn.h"
#include "elect.h"
#include "lynx.pb-c.h"
#include "registry.h"
#include "store_etcd.h"
#include "tls.h"
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
   * (coord_elect_changed, coord_on_role): a wake merged into one still pending
   * must not leave coord_on_role reading the role from before the change */
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
  int unsure; /* a leader past its vouched lease (coord_on_tick): logged once */
  /* --tls-*: the API is served over HTTPS (tls_on), and with --tls-ca
   * every control connection is TLS with a client certificate the CA
   * signed (tls.has_ca) */
  struct lynx_tls tls;
  int tls_on, tls_ctl;
};

#define HELLO_TIMEOUT_MS 10000 /* a peer that says nothing is closed */

#define TICK_MS 100 /* leases, drains, placement retries */

/* Monotonic milliseconds: the registry's clock (lynx_coord.now_ms). */
static inline uint64_t coord_now_ms(void) { return lynx_now_ns() / 1000000u; }

/* After any registry change, lock held: wakes the watchers
 * (lynx_coord.on_change). */
static inline void coord_changed(struct lynx_coord *c) {
  pthread_cond_broadcast(&c->changed);
}

/* actions.c: the registry's ops (struct lynx_reg_ops; called under
 * c.lock on any thread: they only queue work for the loop) */
void coord_act_start(void *data, struct lynx_reg_node *node,
                     struct lynx_reg_instance *inst);
void coord_act_stop(void *data, struct lynx_reg_node *node,
                    uint64_t instance_id);
void coord_act_tables(void *data);
int coord_act_issue_epoch(void *data, uint64_t *epoch);
/* Sends env to peer p (loop thread); a peer that cannot take it is
 * closed. */
void coord_send_env(struct cpeer *p, Lynx__Envelope *env);
/* A new epoch from the store, strictly increasing across restarts: 0, or
 * -EAGAIN when etcd has none issued ahead yet (err says so). Lock held. */
int coord_issue_epoch(struct coordinator *co, int frontend, uint64_t *epoch,
                      char *err, size_t errlen);
/* Sends every frontend the table it should run, if it has not got it yet.
 * Loop thread, lock held. */
void coord_push_tables(struct coordinator *co);
/* After any registry call on the loop thread (lock held): sends what the
 * registry queued, wakes the API's watchers. */
void coord_after_change(struct coordinator *co);

/* ctlport.c: the control port's listener callback, and why this
 * coordinator may not answer peers now (a leader past its vouched lease;
 * ctlport.c says so to the peers it refuses, tick.c in its log) */
void coord_on_connection(uv_stream_t *server, int status);
void coord_unsure_why(struct coordinator *co, char *why, size_t len);

/* tick.c: the loop's timers and wake-ups. coord_settle holds tables and
 * drains back after a start until the agents are found again; on_tick is
 * the TICK_MS lease tick; on_wake flushes what an API thread queued;
 * elect_changed (the election's thread) and on_role (the loop) apply a
 * change of role. */
void coord_settle(struct coordinator *co);
void coord_on_tick(uv_timer_t *t);
void coord_on_wake(uv_async_t *a);
void coord_elect_changed(void *arg);
void coord_on_role(uv_async_t *a);

#endif
