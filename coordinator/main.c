/*
 * lynx-coordinator - the registry of every accelerator, placement, leases,
 * dispatch tables, and the operators' JSON API.
 *
 * Threads: the libuv loop thread owns the control connections (agents and
 * frontends, protobuf-c frames), the 100 ms lease tick and every message
 * sent; libmicrohttpd's threads serve the JSON API (http.c). Both take
 * c.lock around registry access. The registry's action callbacks run under
 * the lock on either thread and only queue work; the loop thread sends it
 * (flush_actions), woken by a uv_async when the API caused it.
 *
 * Files (coordd.h): this one is the process (flags, start, stop); tick.c
 * the loop's timers and wake-ups, ctlport.c the control port, actions.c
 * what the registry asks for. The API (http.c) and the election (elect.c)
 * get the clock and the change callback in struct lynx_coord.
 *
 * Frontends: up to --active-frontends are active (choose_active, actions.c) and
 * the registry partitions the instances among them (partition.c); each gets a
 * table of the instances it produces into, with their epochs. Any other is
 * a standby with an empty table, made active when an active one goes. Each
 * mqueue has exactly one producer that way (docs/frontends.md).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <json-c/json.h>

#include "coordd.h"
#include "ctlconn.h"
#include "ctlmsg.h"
#include "frame.h"
#include "httpconn.h"
#include "log.h"
#include "notify.h"
#include "options.h"
#include "store.h"
#include "tls.h"
#include "elect.h"
#include "store_etcd.h"
#include "util.h"

#define O(f) offsetof(struct coord_cfg, f)

static const struct lynx_opt coord_opts[] = {
    {"listen", LYNX_OPT_ADDR, O(listen), "127.0.0.1:7700", 1, 65535, NULL,
     "control address for agents and frontends"},
    {"http", LYNX_OPT_ADDR, O(http), "127.0.0.1:7780", 1, 65535, NULL,
     "JSON API address"},
    {"state-dir", LYNX_OPT_STR, O(state_dir), "./lynx-state", 0, 0, NULL,
     "where services and drain intents are kept (without --etcd)"},
    {"etcd", LYNX_OPT_STR, O(etcd), NULL, 0, 0, NULL,
     "etcd endpoints (http://host:port,...): services and drain intents "
     "are kept there instead of --state-dir (docs/etcd.md)"},
    {"etcd-prefix", LYNX_OPT_STR, O(etcd_prefix), LYNX_ETCD_PREFIX_DEFAULT, 0,
     0, NULL, "the keys' prefix in etcd"},
    {"etcd-timeout-ms", LYNX_OPT_U32, O(etcd_timeout_ms), "1000", 100, 60000,
     NULL,
     "an etcd call that takes longer fails (an API change then gets "
     "503)"},
    {"etcd-lease-s", LYNX_OPT_U32, O(etcd_lease_s), "3", 2, 60, NULL,
     "with --etcd: the leader's lease; a follower leads within about this "
     "long after the leader dies"},
    {"lease-ms", LYNX_OPT_U32, O(lease_ms), NULL, 100, 600000, NULL,
     "the agents' lease: a node without heartbeat for this long is down "
     "(its requests in flight are counted lost), and its agent stops "
     "taking requests before then (default 3000; with --etcd long enough "
     "to ride out a leader failover: 2/3 --suspect-ms + --etcd-lease-s + "
     "3.5 s, 8500 with the defaults; a shorter one is refused)"},
    {"suspect-ms", LYNX_OPT_U32, O(suspect_ms), NULL, 100, 600000, NULL,
     "a node without heartbeat for this long leaves the dispatch tables "
     "(no new request goes to it) until it is heard again; agents "
     "heartbeat every third of it (default 3000, or --lease-ms if "
     "shorter)"},
    {"frontend-timeout-ms", LYNX_OPT_U32, O(frontend_timeout_ms), "3000", 500,
     600000, NULL,
     "a frontend silent for this long (it reports every "
     "200 ms) is cut off, and its instances go to the other frontends"},
    {"active-frontends", LYNX_OPT_U32, O(active_frontends), "1", 0, 1024, NULL,
     "how many frontends are active (0: every one): each service's "
     "instances are partitioned among them, one producer per mqueue; any "
     "other frontend is a standby (docs/frontends.md)"},
    {"drain-timeout-ms", LYNX_OPT_U32, O(drain_ms), "10000", 0, 3600000, NULL,
     "a drain stops the node's instances at the latest after this"},
    {"token-file", LYNX_OPT_STR, O(token_file), NULL, 0, 0, NULL,
     "cluster token; without one only loopback peers are accepted"},
    LYNX_OPT_TLS(O(tls_ca), O(tls_cert), O(tls_key),
                 "the cluster CA (PEM): control connections then need TLS "
                 "and a client certificate it signed (with --tls-cert and "
                 "--tls-key, which alone serve the API over HTTPS)"),
    LYNX_OPT_FRAME_MAX(O(frame_max)),
    {"control-conn-max", LYNX_OPT_U32, O(ctl_conn_max), "4096", 1, 1u << 20,
     NULL,
     "control connections (agents, frontends) open at once; more are "
     "closed at once"},
    {"control-unauth-max", LYNX_OPT_U32, O(ctl_unauth_max), "64", 1, 1u << 20,
     NULL, "of those, connections that have not said a valid Hello yet"},
    {"control-unauth-per-client", LYNX_OPT_U32, O(ctl_unauth_per_client), "8",
     1, 1u << 20, NULL, "of those, from one address"},
    {"body-max", LYNX_OPT_U32, O(body_max), "65536", 256, 1u << 24, NULL,
     "largest accepted API request body, bytes"},
    {"http-conn-max", LYNX_OPT_U32, O(http_conn_max), "4096", 1, 1u << 20, NULL,
     "API connections open at once; past it a new one takes the place "
     "of the oldest that has not completed its request (or of the oldest "
     "watch, answered early); refused only when all are being answered"},
    {"http-conn-per-client", LYNX_OPT_U32, O(http_conn_per_client), "1024", 1,
     1u << 20, NULL,
     "API connections one client address may hold open; past "
     "it the same as --http-conn-max, among that address's connections"},
    {"http-header-timeout-ms", LYNX_OPT_U32, O(http_header_ms), "10000", 100,
     600000, NULL,
     "a request's headers must be in within this of the "
     "connection's start or the previous answer"},
    {"http-body-timeout-ms", LYNX_OPT_U32, O(http_body_ms), "30000", 100,
     3600000, NULL, "a request's body must be in within this of its headers"},
    {"services-max", LYNX_OPT_U32, O(services_max), "256", 1, 100000, NULL,
     "services that may exist (each costs every frontend a thread); more are "
     "refused"},
    {"region-max-mb", LYNX_OPT_U32, O(region_max_mb), "1024", 1, 1048576, NULL,
     "largest region a service may ask of each accelerator, MiB"},
    LYNX_OPT_LOG_LEVEL(O(log_level), "info"),
    LYNX_OPT_END,
};

#undef O

/* ---- leases ---------------------------------------------------------- */

/* The shortest agents' lease that rides out a leader failover on etcd
 * (docs/etcd.md, "Failover without loss"): the last heartbeat answered
 * before the leader died or stopped may be a heartbeat period old, and
 * another period passes before an agent gives a silent leader up; the dead
 * leader's key lives for the election lease; then etcd's 500 ms expiry
 * tick, the campaign, an agent's round of addresses (a stopped leader
 * holds a Hello 1 s, the backoff up to 0.5 s twice) and the fence's margin
 * (up to 1 s) take 3 s, and half a second to spare makes 3.5 s. */
static uint32_t failover_lease_ms(uint32_t suspect_ms, uint32_t etcd_lease_s) {
  return 2 * (suspect_ms / 3) + etcd_lease_s * 1000u + 3500u;
}

/* --lease-ms and --suspect-ms as given, or derived when not: coherent by
 * construction, and an incoherent pair given explicitly refused. 0 or -1
 * with the reason in err. */
static int leases_derive(struct coord_cfg *cfg, char *err, size_t errlen) {
  uint32_t need;
  if (!cfg->suspect_ms)
    cfg->suspect_ms =
        cfg->lease_ms && cfg->lease_ms < 3000 ? cfg->lease_ms : 3000;
  need = cfg->etcd ? failover_lease_ms(cfg->suspect_ms, cfg->etcd_lease_s)
                   : cfg->suspect_ms;
  if (!cfg->lease_ms) {
    cfg->lease_ms = need > 3000 ? need : 3000;
    return 0;
  }
  if (cfg->suspect_ms > cfg->lease_ms) {
    snprintf(err, errlen,
             "--suspect-ms %u is longer than --lease-ms %u: a "
             "silent node would be declared down (its requests counted "
             "lost) before it left the dispatch tables; give --suspect-ms "
             "%u or less",
             cfg->suspect_ms, cfg->lease_ms, cfg->lease_ms);
    return -1;
  }
  if (cfg->lease_ms < need) {
    snprintf(err, errlen,
             "--lease-ms %u cannot ride out a leader failover "
             "with --etcd-lease-s %u and --suspect-ms %u: the agents would "
             "stop taking requests while another coordinator takes over "
             "(up to about %u ms: two heartbeat periods, the election lease "
             "and 3.5 s; docs/etcd.md, \"Failover without loss\"); give "
             "--lease-ms %u or more, or leave it out (derived)",
             cfg->lease_ms, cfg->etcd_lease_s, cfg->suspect_ms, need, need);
    return -1;
  }
  return 0;
}

/* Every connection the caps admit needs a descriptor: the soft
 * RLIMIT_NOFILE is raised to what the control and API caps (and the
 * API's room for shed connections, httpconn.h) take, plus
 * DESCRIPTORS_SPARE for the store, logs and listeners. Where the hard
 * limit allows less, the API's cap is lowered to its share of what there
 * is, with a warning, so that it sheds before accept() runs out. */
#define DESCRIPTORS_SPARE 256u

static void fit_descriptors(struct coord_cfg *cfg) {
  unsigned long api = lynx_hc_limit_for(cfg->http_conn_max);
  unsigned long need = cfg->ctl_conn_max + api + DESCRIPTORS_SPARE;
  unsigned long have = lynx_raise_nofile(need), share;
  if (have >= need)
    return;
  share = have > DESCRIPTORS_SPARE * 2
              ? (have - DESCRIPTORS_SPARE) * cfg->http_conn_max /
                    (cfg->ctl_conn_max + cfg->http_conn_max)
              : 64;
  share = share * 4 / 5; /* its room for shed ones comes on top */
  if (share < 16)
    share = 16;
  if (share >= cfg->http_conn_max)
    return;
  LYNX_WARN("coordinator",
            "RLIMIT_NOFILE allows %lu descriptors, and --control-conn-max "
            "%u with --http-conn-max %u take %lu: the API holds at most %lu "
            "connections (raise the limit: LimitNOFILE= in the unit, ulimit "
            "-n)",
            have, cfg->ctl_conn_max, cfg->http_conn_max, need, share);
  cfg->http_conn_max = (uint32_t)share;
  if (cfg->http_conn_per_client > cfg->http_conn_max)
    cfg->http_conn_per_client = cfg->http_conn_max;
}

static void on_signal(uv_signal_t *s, int signum) {
  struct coordinator *co = s->data;
  if (co->stopping)
    return;
  co->stopping = 1;
  LYNX_INFO("coordinator", "%s, shutting down", strsignal(signum));
  lynx_notify_stopping("%s, shutting down", strsignal(signum));
  /* a leader hands over now (its lease revoked) rather than at its TTL;
   * the thread is gone before the handle it wakes */
  lynx_elect_stop(&co->elect);
  if (co->role_ready)
    uv_close((uv_handle_t *)&co->role, NULL);
  for (struct cpeer *p = co->peers; p; p = p->next)
    lynx_ctl_close(&p->ctl, NULL);
  uv_close((uv_handle_t *)&co->server, NULL);
  uv_close((uv_handle_t *)&co->tick, NULL);
  uv_close((uv_handle_t *)&co->wake, NULL);
  uv_close((uv_handle_t *)&co->sigint, NULL);
  uv_close((uv_handle_t *)&co->sigterm, NULL);
}

int main(int argc, char **argv) {
  int help = 0; /* --help was printed */
  static struct coordinator co;
  struct lynx_reg_ops ops = {coord_act_start, coord_act_stop, coord_act_tables,
                             coord_act_issue_epoch, &co};
  struct sockaddr_storage ss;
  char err[512], *token = NULL;
  int rc, lvl, exit_code = 1;

  rc = lynx_opts_parse_conf(coord_opts, &co.cfg, argc, argv,
                            "usage: lynx-coordinator [options]\n"
                            "Registry, placement, leases and dispatch "
                            "tables of a Lynx cluster, with a JSON API.",
                            &help);
  if (rc || help)
    return rc ? lynx_opts_exit_code(rc) : 0;
  signal(SIGPIPE, SIG_IGN);
  lvl = lynx_log_parse_level(co.cfg.log_level);
  if (lvl < 0) {
    fprintf(stderr, "--log-level: unknown level '%s'\n", co.cfg.log_level);
    exit_code = LYNX_EXIT_USAGE;
    goto out_opts;
  }
  lynx_log_level = lvl;
  if (leases_derive(&co.cfg, err, sizeof(err))) {
    fprintf(stderr, "%s\n", err);
    exit_code = LYNX_EXIT_USAGE;
    goto out_opts;
  }
  if (co.cfg.http_conn_per_client > co.cfg.http_conn_max) {
    fprintf(stderr,
            "--http-conn-per-client %u is more than --http-conn-max %u: one "
            "address could never hold that many\n",
            co.cfg.http_conn_per_client, co.cfg.http_conn_max);
    exit_code = LYNX_EXIT_USAGE;
    goto out_opts;
  }
  fit_descriptors(&co.cfg);
  lynx_parse_hostport(co.cfg.listen, &ss); /* checked by the option table */
  if (co.cfg.token_file &&
      lynx_read_token(co.cfg.token_file, &token, err, sizeof(err))) {
    fprintf(stderr, "%s\n", err);
    goto out_opts;
  }
  {
    struct lynx_tls_files tf = {co.cfg.tls_ca, co.cfg.tls_cert, co.cfg.tls_key};
    rc = lynx_tls_load(&co.tls, 1, &tf, err, sizeof(err));
    if (rc < 0) { /* refused at start only: a running one keeps its keys */
      fprintf(stderr, "%s\n", err);
      exit_code = LYNX_EXIT_USAGE;
      goto out_opts;
    }
    co.tls_on = rc == 0;
    co.tls_ctl = co.tls_on && co.tls.has_ca;
  }
  if (co.cfg.etcd) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    if (lynx_etcd_open(&co.store.etcd, co.cfg.etcd, co.cfg.etcd_timeout_ms, err,
                       sizeof(err)) ||
        lynx_store_etcd_init(&co.store, co.store.etcd, co.cfg.etcd_prefix, err,
                             sizeof(err))) {
      fprintf(stderr, "--etcd: %s\n", err);
      exit_code = LYNX_EXIT_USAGE;
      goto out_opts;
    }
    co.c.save = lynx_store_etcd_save_state;
    co.c.save_arg = &co.store;
    co.c.save_where = "etcd";
  } else if (mkdir(co.cfg.state_dir, 0700) != 0 && errno != EEXIST) {
    fprintf(stderr, "--state-dir %s: %s\n", co.cfg.state_dir, strerror(errno));
    goto out_opts;
  }
  if (!co.cfg.etcd) {
    struct stat st;
    if (stat(co.cfg.state_dir, &st) != 0) {
      fprintf(stderr, "--state-dir %s: %s\n", co.cfg.state_dir,
              strerror(errno));
      goto out_opts;
    }
    if (!S_ISDIR(st.st_mode)) {
      fprintf(stderr, "--state-dir %s: not a directory\n", co.cfg.state_dir);
      goto out_opts;
    }
    /* it holds the services and drain intents operators set */
    if (st.st_mode & 0077)
      LYNX_WARN("coordinator",
                "--state-dir %s can be %s by %s (mode %04o): "
                "the cluster's services are kept there; chmod 700 %s",
                co.cfg.state_dir, (st.st_mode & 0022) ? "changed" : "read",
                (st.st_mode & 0007) ? "every user" : "its group",
                (unsigned)(st.st_mode & 07777), co.cfg.state_dir);
  }
  pthread_mutex_init(&co.c.lock, NULL);
  pthread_mutex_init(&co.role_lock, NULL);
  pthread_mutex_init(&co.c.change_lock, NULL);
  pthread_cond_init(&co.c.changed, NULL);
  co.c.now_ms = coord_now_ms;
  co.c.on_change = coord_changed;
  co.c.state_dir = co.cfg.etcd ? NULL : co.cfg.state_dir;
  co.c.token = token;
  if (co.tls_on) {
    co.c.tls_cert_pem = co.tls.cert_pem;
    co.c.tls_key_pem = co.tls.key_pem;
  }
  co.c.body_max = co.cfg.body_max;
  co.c.http_conn_max = co.cfg.http_conn_max;
  co.c.http_conn_per_client = co.cfg.http_conn_per_client;
  co.c.http_header_timeout_ms = co.cfg.http_header_ms;
  co.c.http_body_timeout_ms = co.cfg.http_body_ms;
  co.actions_tail = &co.actions;
  lynx_guard_init(&co.c.ctl_guard, co.cfg.ctl_conn_max, co.cfg.ctl_unauth_max,
                  co.cfg.ctl_unauth_per_client);
  lynx_reg_init(&co.c.reg, co.cfg.lease_ms, co.cfg.drain_ms, &ops);
  co.c.reg.suspect_ms = co.cfg.suspect_ms;
  co.c.reg.tick_ms = TICK_MS;
  /* instance ids and table versions keep growing across coordinator
   * restarts (frontends and agents outlive us): start from the clock */
  co.c.reg.next_instance_id = (uint64_t)time(NULL) * 1000u;
  co.c.reg.table_version = (uint64_t)time(NULL) * 1000u;
  /* the loop and its wake-up exist before anything can queue an action */
  uv_loop_init(&co.loop);
  uv_async_init(&co.loop, &co.wake, coord_on_wake);
  co.wake.data = &co;
  rc = co.cfg.etcd ? lynx_store_etcd_load(&co.store, &co.c.reg, coord_now_ms(),
                                          err, sizeof(err))
                   : lynx_store_load(co.cfg.state_dir, &co.c.reg,
                                     coord_now_ms(), err, sizeof(err));
  if (rc) {
    LYNX_ERR("coordinator", "cannot load state from %s: %s",
             co.cfg.etcd ? co.cfg.etcd : co.cfg.state_dir, err);
    uv_close((uv_handle_t *)&co.wake, NULL);
    uv_run(&co.loop, UV_RUN_DEFAULT);
    uv_loop_close(&co.loop);
    goto out_reg;
  }
  /* the limits bind new services only: what the state directory holds
   * stays, even above a limit lowered since */
  co.c.reg.services_max = co.cfg.services_max;
  co.c.reg.region_max_bytes = (uint64_t)co.cfg.region_max_mb << 20;
  uv_tcp_init(&co.loop, &co.server);
  co.server.data = &co;
  rc = uv_tcp_bind(&co.server, (struct sockaddr *)&ss, 0);
  if (!rc)
    rc = uv_listen((uv_stream_t *)&co.server, 128, coord_on_connection);
  if (rc) {
    LYNX_ERR("coordinator", "cannot listen on %s: %s", co.cfg.listen,
             uv_strerror(rc));
    uv_close((uv_handle_t *)&co.server, NULL);
    uv_close((uv_handle_t *)&co.wake, NULL);
    uv_run(&co.loop, UV_RUN_DEFAULT);
    uv_loop_close(&co.loop);
    goto out_reg;
  }
  rc = lynx_http_start(&co.c, co.cfg.http);
  if (rc) {
    LYNX_ERR("coordinator", "cannot serve the API on %s: %s", co.cfg.http,
             strerror(-rc));
    uv_close((uv_handle_t *)&co.server, NULL);
    uv_close((uv_handle_t *)&co.wake, NULL);
    uv_run(&co.loop, UV_RUN_DEFAULT);
    uv_loop_close(&co.loop);
    goto out_reg;
  }
  /* with services on disk this is a restart: agents are re-registering */
  if (co.c.reg.services)
    coord_settle(&co);
  uv_timer_init(&co.loop, &co.tick);
  co.tick.data = &co;
  uv_timer_start(&co.tick, coord_on_tick, TICK_MS, TICK_MS);
  uv_signal_init(&co.loop, &co.sigint);
  uv_signal_init(&co.loop, &co.sigterm);
  co.sigint.data = co.sigterm.data = &co;
  uv_signal_start(&co.sigint, on_signal, SIGINT);
  uv_signal_start(&co.sigterm, on_signal, SIGTERM);
  if (co.cfg.etcd) {
    char id[LYNX_ID_MAX], host[64] = "host";
    gethostname(host, sizeof(host) - 1);
    snprintf(id, sizeof(id), "%.40s-%d", host, (int)getpid());
    uv_async_init(&co.loop, &co.role, coord_on_role);
    co.role.data = &co;
    co.role_ready = 1;
    co.elect.c = &co.c;
    co.elect.store = &co.store;
    co.elect.changed = coord_elect_changed;
    co.elect.arg = &co;
    if (lynx_elect_start(&co.elect, co.cfg.etcd, co.cfg.etcd_timeout_ms,
                         co.cfg.etcd_lease_s, id, co.cfg.http, co.cfg.listen,
                         err, sizeof(err))) {
      LYNX_ERR("coordinator", "cannot take part in the leader election: %s",
               err);
      co.elect_failed = 1;
      raise(SIGTERM);
    }
  }
  pthread_mutex_lock(&co.c.lock);
  co.c.ready = 1;
  pthread_mutex_unlock(&co.c.lock);
  lynx_notify_ready("serving control on %s and the API on %s", co.cfg.listen,
                    co.cfg.http);
  {
    struct json_object *j = lynx_opts_json(coord_opts, &co.cfg);
    LYNX_INFO("coordinator",
              "serving control on %s%s and the API on "
              "%s://%s%s; config %s",
              co.cfg.listen,
              co.tls_ctl ? " over TLS (peers need a certificate the CA "
                           "signed)"
                         : "",
              co.tls_on ? "https" : "http", co.cfg.http,
              co.tls_ctl || token ? "" : " (no token: loopback peers only)",
              json_object_to_json_string_ext(j, JSON_C_TO_STRING_PLAIN));
    json_object_put(j);
  }
  uv_run(&co.loop, UV_RUN_DEFAULT);
  lynx_http_stop(&co.c);
  if (uv_loop_close(&co.loop))
    LYNX_WARN("coordinator", "loop closed with handles open");
  exit_code = co.elect_failed;
out_reg:
  while (co.actions) {
    struct action *a = co.actions;
    co.actions = a->next;
    free(a);
  }
  lynx_reg_free(&co.c.reg);
  pthread_cond_destroy(&co.c.changed);
  pthread_mutex_destroy(&co.c.change_lock);
  pthread_mutex_destroy(&co.role_lock);
  pthread_mutex_destroy(&co.c.lock);
out_opts:
  lynx_etcd_close(co.store.etcd);
  if (co.tls_on)
    lynx_tls_free(&co.tls);
  free(token);
  lynx_opts_free(coord_opts, &co.cfg);
  return exit_code;
}
