/*
 * lynx-frontend - serves UDP clients from mqueues in accelerator memory.
 *
 * Static mode (--agent): one agent, one service on --udp. The agent's
 * control connection is a liveness signal: when it drops, its accelerators
 * leave dispatch at once (in-flight requests counted in doubt); when the agent
 * comes back (a new epoch, new regions) they are added again, the workers
 * and the socket stay.
 *
 * Coordinator mode (--coordinator): the coordinator pushes versioned
 * dispatch tables: every service (port) with the instances to dispatch to.
 * A new table is applied as a difference: new services get workers, new
 * instances are added, instances no longer listed leave dispatch and are
 * released once their in-flight requests are answered; nothing else is
 * touched. Every 200 ms (and when a table is applied) the frontend reports
 * the table version it runs and its per-mqueue counters, which is how the
 * coordinator knows a drain is complete. Without the coordinator the
 * frontend keeps serving its last table and reconnects with backoff.
 *
 * SIGINT/SIGTERM: stop receiving, answer what is in flight within
 * --drain-ms, release everything, exit 0.
 */
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <json-c/json.h>

#include "ctlconn.h"
#include "frontend.h"
#include "log.h"
#include "notify.h"
#include "options.h"

static const char *const dispatch_names[] = {"rr", "lo", NULL};
static const char *const poll_names[] = {"adaptive", "busy", NULL};
static const char *const tcp_answers_names[] = {"push", "poll", NULL};
static const char *const order_names[] = {"flow", "none", NULL};
static const char *const rx_names[] = {"auto", "uring", "socket", NULL};

#define O(f) offsetof(struct fe_cfg, f)
static const struct lynx_opt fe_opts[] = {
    {"agent", LYNX_OPT_ADDR, O(agent), NULL, 1, 65535, NULL,
     "static mode: agent control address [default 127.0.0.1:7701]"},
    {"coordinator", LYNX_OPT_ADDRS, O(coordinator), NULL, 1, 65535, NULL,
     "coordinator control address(es), host:port[,host:port...]: serve what "
     "the one that leads says"},
    {"udp", LYNX_OPT_STR, O(udp), NULL, 0, 0, NULL,
     "static mode: UDP port, or host:port, to serve [default 7000]"},
    {"tcp", LYNX_OPT_STR, O(tcp), NULL, 0, 0, NULL,
     "static mode: serve a TCP port (or host:port) instead of --udp"},
    {"framing", LYNX_OPT_STR, O(framing), NULL, 0, 0, NULL,
     "static mode, with --tcp: len32 (4-byte big-endian length, then the "
     "message) or fixed:N (N-byte messages) [default len32]"},
    {"bind", LYNX_OPT_STR, O(bind), NULL, 0, 0, NULL,
     "coordinator mode: address the services' ports are bound on [default "
     "0.0.0.0]"},
    {"workers", LYNX_OPT_U32, O(workers), "1", 1, 64, NULL,
     "worker threads per service (each owns a share of every accelerator's "
     "mqueues)"},
    {"dispatch", LYNX_OPT_ENUM, O(dispatch), "rr", 0, 0, dispatch_names,
     "dispatch policy: round robin or least outstanding"},
    {"order", LYNX_OPT_ENUM, O(order), "flow", 0, 0, order_names,
     "flow: a client's requests in flight stay on one mqueue, so its answers "
     "keep their order (UDP: when it is full, the excess is dropped, "
     "flow_full); none: every request goes where the policy says"},
    {"poll", LYNX_OPT_ENUM, O(poll), "adaptive", 0, 0, poll_names,
     "adaptive: spin, then sleep; busy: never sleep (dedicated cores)"},
    {"tcp-answers", LYNX_OPT_ENUM, O(tcp_answers), "push", 0, 0,
     tcp_answers_names,
     "over the tcp transport: push (the agent sends each answer as it is "
     "published; protocol version 5) or poll (the frontend reads for them "
     "while requests are outstanding, as before version 5)"},
    {"rx", LYNX_OPT_ENUM, O(rx), "auto", 0, 0, rx_names,
     "UDP receive path: uring (io_uring multishot recvmsg; refuse to start "
     "where io_uring cannot receive), socket (libuv's recvmmsg), auto "
     "(uring where it works, else socket)"},
    {"spin-us", LYNX_OPT_U32, O(spin_us), "50", 0, 1000000, NULL,
     "adaptive polling: spin at most this long after the last work"},
    {"metrics", LYNX_OPT_ADDR, O(metrics), NULL, 1, 65535, NULL,
     "host:port for Prometheus /metrics [default: off]"},
    {"request-timeout-ms", LYNX_OPT_U32, O(timeout_ms), "1000", 1, 3600000,
     NULL, "a request without response is dropped (expired) after this"},
    {"drain-ms", LYNX_OPT_U32, O(drain_ms), "1000", 0, 60000, NULL,
     "on SIGTERM, wait this long for in-flight responses"},
    {"rcvbuf-kb", LYNX_OPT_U32, O(rcvbuf_kb), "4096", 0, 1048576, NULL,
     "UDP socket buffer size, KiB (0: system default)"},
    {"frontend-id", LYNX_OPT_STR, O(frontend_id), NULL, 0, 0, NULL,
     "name of this frontend [default: fe-<pid>]"},
    LYNX_OPT_FRAME_MAX(O(frame_max)),
    {"token-file", LYNX_OPT_STR, O(token_file), NULL, 0, 0, NULL,
     "file holding the cluster token"},
    LYNX_OPT_TLS(O(tls_ca), O(tls_cert), O(tls_key),
                 "the cluster CA (PEM): the connection to the coordinator is "
                 "TLS, its certificate checked against the address dialed; "
                 "needs --tls-cert and --tls-key (docs/tls.md)"),
    LYNX_OPT_LOG_LEVEL(O(log_level), "info"),
    LYNX_OPT_END,
};
#undef O

struct fe_main {
  struct fe_cfg cfg;
  char *token;
  struct lynx_tls tls; /* --tls-*: loaded when tls_on */
  int tls_on;
  char id[LYNX_ID_MAX];
  int coordinator_mode;
  uv_loop_t loop;
  uv_signal_t sigint, sigterm;
  uv_timer_t status;
  struct lynx_dialer d; /* d.ctl is the control connection */
  char target[96];
  int shutting_down, greeted, exit_code;
  /* coordinator mode: the coordinator answers every status report
   * (HelloReply.acks_status); heard_ns: when it last said anything */
  int acks;
  uint64_t heard_ns;
  /* the services, read by the metrics thread under list_lock */
  pthread_mutex_t list_lock;
  struct frontend *services;
  void *metrics;
  /* coordinator mode: the table we run, and the command watermark after
   * which it is fully applied */
  uint64_t table_version, table_seq_done;
  int have_table;
  /* the version every worker has carried out, as the last status report
   * said it (atomic: the metrics thread reads it) */
  uint64_t table_applied;
  /* the newest epoch the active table gave us (0: none, or a standby);
   * each connection presents its instance's (TableEntry.epoch) */
  uint64_t epoch;
  /* our Hello's produces: the instances we produce into, with the epoch
   * (claims_update; the dialer reads them) */
  Lynx__InstanceEpoch *claims, **claim_ptrs;
  size_t n_claims;
  /* the back ends of the service service_start is about to start */
  const struct fe_backend_cfg *pending_backends;
  uint32_t n_pending_backends;
  /* this host's and network namespace's identity (lynx_local_identity):
   * a region whose agent has the same is mapped through shm */
  char host_id[LYNX_IDENT_MAX], netns_id[LYNX_IDENT_MAX];
};

/* ---- the receive path --------------------------------------------------- */

/* Resolves --rx (docs/design.md, "Receive path"): io_uring when asked for
 * or under auto, if a probe receives a datagram through it here. Says
 * which path and why in one log line. 0, or -1 when --rx uring cannot be
 * given (the reason on stderr). */
static int choose_rx(struct fe_cfg *cfg) {
  char why[320];
  int rc;
  cfg->rx_uring = 0;
  if (cfg->rx == FE_RXOPT_SOCKET) {
    LYNX_INFO("frontend", "receive path: socket (recvmmsg), as --rx socket "
                          "says");
    return 0;
  }
  rc = lynx_rxring_probe(why, sizeof(why));
  if (rc == 0) {
    cfg->rx_uring = 1;
    LYNX_INFO("frontend",
              "receive path: io_uring (multishot recvmsg into "
              "%u provided buffers of %u bytes per worker), as --rx %s says",
              LYNX_RXRING_BUFS, LYNX_RXRING_BUF_SIZE, rx_names[cfg->rx]);
    return 0;
  }
  if (cfg->rx == FE_RXOPT_URING) {
    fprintf(stderr, "--rx uring: io_uring cannot receive UDP here: %s\n", why);
    return -1;
  }
  LYNX_INFO("frontend",
            "receive path: socket (recvmmsg): io_uring cannot "
            "receive UDP here: %s",
            why);
  return 0;
}

/* ---- services ---------------------------------------------------------- */

static struct frontend *service_find(struct fe_main *m, const char *name) {
  for (struct frontend *fe = m->services; fe; fe = fe->next)
    if (strcmp(fe->service, name) == 0)
      return fe;
  return NULL;
}

/* Starts a service's workers on udp (host:port); n_w clamped to mqueues. */
static struct frontend *service_start(struct fe_main *m, const char *name,
                                      const struct sockaddr_storage *udp,
                                      uint32_t mqueues, enum fe_proto proto,
                                      uint32_t fixed_len) {
  struct frontend *fe = calloc(1, sizeof(*fe));
  int rc;
  if (!fe)
    return NULL;
  fe->cfg = &m->cfg;
  snprintf(fe->service, sizeof(fe->service), "%s", name);
  fe->udp_addr = *udp;
  fe->proto = proto;
  fe->fixed_len = fixed_len;
  if (m->pending_backends) {
    memcpy(fe->backends, m->pending_backends,
           m->n_pending_backends * sizeof(fe->backends[0]));
    fe->n_backends = m->n_pending_backends;
    m->pending_backends = NULL;
  }
  fe->n_w = m->cfg.workers;
  if (mqueues && fe->n_w > mqueues) {
    LYNX_WARN("frontend",
              "service %s: %u workers but %u mqueues per "
              "accelerator: using %u workers so each owns a mqueue on every "
              "accelerator",
              name, fe->n_w, mqueues, mqueues);
    fe->n_w = mqueues;
  }
  rc = fe_workers_start(fe);
  if (rc) {
    LYNX_ERR("frontend", "service %s: cannot start: %s", name,
             strerror(rc < 0 ? -rc : rc));
    fe_workers_stop(fe);
    free(fe);
    return NULL;
  }
  pthread_mutex_lock(&m->list_lock);
  fe->next = m->services;
  m->services = fe;
  pthread_mutex_unlock(&m->list_lock);
  return fe;
}

static void service_stop(struct fe_main *m, struct frontend *fe) {
  struct frontend **pp = &m->services;
  pthread_mutex_lock(&m->list_lock);
  while (*pp && *pp != fe)
    pp = &(*pp)->next;
  if (*pp)
    *pp = fe->next;
  pthread_mutex_unlock(&m->list_lock);
  fe_workers_stop(fe); /* logs the service's totals */
  free(fe->instances);
  free(fe);
  /* what the service's threads freed goes back to the system: glibc keeps
   * each thread's arena otherwise, and a frontend that served hundreds of
   * services and lost them kept tens of MB (bench/services.sh) */
  malloc_trim(0);
}

static void services_stop_all(struct fe_main *m) {
  while (m->services)
    service_stop(m, m->services);
}

/* Whether fe dispatches to instance id, producing into it with epoch. */
static int instance_listed(const struct frontend *fe, uint64_t id,
                           uint64_t epoch) {
  for (uint32_t i = 0; i < fe->n_instances; i++)
    if (fe->instances[i].id == id && fe->instances[i].epoch == epoch)
      return 1;
  return 0;
}

static int node_listed(char *const *nodes, size_t n, const char *node) {
  for (size_t i = 0; i < n; i++)
    if (nodes[i] && strcmp(nodes[i], node) == 0)
      return 1;
  return 0;
}

/* The fastest path to a region: the shm file its agent offers when the
 * agent is on this host and in this network namespace (docs/design.md
 * "Local regions") and the file opens here (another mount namespace's
 * /dev/shm, or another user's file, does not: then the transport the
 * descriptor names). */
static void accel_choose(const struct fe_main *m, struct fe_accel *a) {
  struct lynx_region_desc *d = &a->desc;
  int fd;
  if (!lynx_desc_local(d, m->host_id, m->netns_id))
    return;
  fd = shm_open(d->shm_locator, O_RDWR, 0);
  if (fd < 0) {
    LYNX_LOG_RL(LYNX_LOG_WARN, "frontend",
                "accelerator %s/%u: its agent is on this host and network "
                "namespace, but its shm file %s does not open here (%s): "
                "over %s",
                a->node, d->accel_id, d->shm_locator, strerror(errno),
                d->transport);
    return;
  }
  close(fd);
  snprintf(a->offered, sizeof(a->offered), "%s", d->transport);
  snprintf(d->transport, sizeof(d->transport), "%s",
           lynx_transport_names[LYNX_TRANSPORT_SHM]);
  snprintf(d->locator, sizeof(d->locator), "%s", d->shm_locator);
}

/* Builds an fe_accel from a descriptor; 0 or -errno with a logged reason. */
static int accel_from_pb(const struct fe_main *m, const Lynx__RegionDesc *rd,
                         const char *node, uint64_t instance_id,
                         struct fe_accel *a) {
  char err[200];
  memset(a, 0, sizeof(*a));
  if (!rd || lynx_desc_from_pb(rd, &a->desc, err, sizeof(err))) {
    LYNX_ERR("frontend", "instance %llu on %s: bad descriptor: %s",
             (unsigned long long)instance_id, node, rd ? err : "none");
    return -EINVAL;
  }
  snprintf(a->node, sizeof(a->node), "%s", node ? node : "?");
  accel_choose(m, a);
  a->ops = lynx_transport_find(a->desc.transport);
  if (!a->ops) {
    LYNX_ERR("frontend", "instance %llu on %s: transport '%s' is not built in",
             (unsigned long long)instance_id, node, a->desc.transport);
    return -ENOTSUP;
  }
  lynx_geom_init(&a->g, a->desc.n_mqueues, a->desc.slots, a->desc.slot_size,
                 a->desc.large_bytes);
  a->n_server = a->g.n_mqueues; /* the service's spec may say fewer */
  a->instance_id = instance_id;
  return 0;
}

/* Makes fe dispatch to exactly accels[0..n): adds the new, takes the others
 * out of dispatch as gone says: FE_CMD_LOST or FE_CMD_ABANDON for all, or
 * FE_CMD_REMOVE: as lost when their node is listed in down, otherwise
 * gracefully (their answers still come back). An instance given again
 * with another epoch (desc.producer) was another frontend's meanwhile, or
 * the coordinator lost track of ours: its connection is made again with
 * the new epoch, what was in flight in doubt. Returns the last command's
 * sequence number (0 if none). */
static uint64_t service_set_instances(struct frontend *fe,
                                      const struct fe_accel *accels, uint32_t n,
                                      char *const *down, size_t n_down,
                                      enum fe_cmd_kind gone) {
  uint64_t seq = 0;
  struct fe_inst *keep = calloc(n + 1, sizeof(*keep));
  if (!keep)
    return 0;
  for (uint32_t i = 0; i < fe->n_instances; i++) {
    int still = 0, moved = 0;
    for (uint32_t k = 0; k < n && !still && !moved; k++) {
      still = accels[k].instance_id == fe->instances[i].id &&
              accels[k].desc.producer == fe->instances[i].epoch;
      moved = accels[k].instance_id == fe->instances[i].id && !still;
    }
    if (!still)
      seq = fe_post(fe,
                    moved ? FE_CMD_ABANDON
                    : gone == FE_CMD_REMOVE &&
                            node_listed(down, n_down, fe->instances[i].node)
                        ? FE_CMD_LOST
                        : gone,
                    NULL, fe->instances[i].id);
  }
  for (uint32_t k = 0; k < n; k++) {
    if (!instance_listed(fe, accels[k].instance_id, accels[k].desc.producer))
      seq = fe_post(fe, FE_CMD_ADD, &accels[k], accels[k].instance_id);
    keep[k].id = accels[k].instance_id;
    keep[k].epoch = accels[k].desc.producer;
    snprintf(keep[k].node, sizeof(keep[k].node), "%s", accels[k].node);
  }
  free(fe->instances);
  fe->instances = keep;
  fe->n_instances = n;
  return seq;
}

/* ---- static mode ------------------------------------------------------- */

static int apply_descriptors(struct fe_main *m, const Lynx__Descriptors *d) {
  struct frontend *fe = m->services;
  struct sockaddr_storage udp;
  struct fe_accel *accels;
  uint32_t min_q = UINT32_MAX;
  char addr[80];
  int rc = 0;
  if (d->n_regions == 0) {
    LYNX_ERR("frontend", "agent %s offers no accelerators", d->node_id);
    return -ENOENT;
  }
  accels = calloc(d->n_regions, sizeof(*accels));
  if (!accels) {
    rc = -ENOMEM;
    goto out;
  }
  for (size_t i = 0; i < d->n_regions; i++) {
    /* instance ids carry the agent's epoch: a restarted agent's regions are
     * new instances, the old ones are lost */
    uint64_t id = (d->epoch << 8) | d->regions[i]->accel_id;
    rc = accel_from_pb(m, d->regions[i], d->node_id, id, &accels[i]);
    if (rc)
      goto out;
    if (accels[i].g.n_mqueues < min_q)
      min_q = accels[i].g.n_mqueues;
  }
  if (!fe) {
    const char *port = m->cfg.tcp ? m->cfg.tcp : m->cfg.udp;
    snprintf(addr, sizeof(addr), "%s%s", strchr(port, ':') ? "" : ":", port);
    lynx_parse_hostport(addr, &udp); /* checked in main */
    fe = service_start(m, d->service && *d->service ? d->service : "default",
                       &udp, min_q, m->cfg.tcp ? FE_PROTO_TCP : FE_PROTO_UDP,
                       m->cfg.tcp ? m->cfg.fixed_len : 0);
    if (!fe) {
      rc = -EIO;
      goto out;
    }
  }
  /* a new epoch: the old agent process is gone, with its queues */
  service_set_instances(fe, accels, (uint32_t)d->n_regions, NULL, 0,
                        FE_CMD_LOST);
  lynx_notify_ready("serving %s %s for service %s", m->cfg.tcp ? "TCP" : "UDP",
                    m->cfg.tcp ? m->cfg.tcp : m->cfg.udp, fe->service);
  LYNX_INFO("frontend",
            "%s: serving %s %s for service %s: %zu accelerators "
            "of %s (epoch %llu), %u workers, dispatch %s, poll %s, rx %s",
            m->id, m->cfg.tcp ? "TCP" : "UDP",
            m->cfg.tcp ? m->cfg.tcp : m->cfg.udp, fe->service, d->n_regions,
            d->node_id, (unsigned long long)d->epoch, fe->n_w,
            dispatch_names[m->cfg.dispatch], poll_names[m->cfg.poll],
            m->cfg.tcp        ? "-"
            : m->cfg.rx_uring ? "uring"
                              : "socket");
out:
  free(accels);
  return rc;
}

/* ---- coordinator mode -------------------------------------------------- */

struct mq_report_ctx {
  Lynx__MqueueReport *r;
  Lynx__MqueueReport **p;
  size_t n, cap;
};

static void collect_mq(void *arg, const struct fe_rmq *rmq,
                       const struct fe_conn *c, const struct fe_mq *mq) {
  struct mq_report_ctx *x = arg;
  Lynx__MqueueReport *r;
  (void)rmq;
  if (x->n == x->cap) {
    size_t cap = x->cap ? x->cap * 2 : 64;
    Lynx__MqueueReport *nr = realloc(x->r, cap * sizeof(*nr));
    if (!nr)
      return;
    x->r = nr;
    x->cap = cap;
  }
  r = &x->r[x->n++];
  lynx__mqueue_report__init(r);
  r->instance_id = c->acc.instance_id;
  r->q = mq->q;
  r->outstanding = __atomic_load_n(&mq->dq.outstanding, __ATOMIC_RELAXED);
  r->dispatched = lynx_cnt_get(&mq->dispatched);
  r->responded = lynx_cnt_get(&mq->responded);
  {
    int t = lynx_transport_id(c->acc.desc.transport);
    /* a name that outlives the connection: the report is packed later */
    r->transport = t < 0 ? "" : (char *)lynx_transport_names[t];
  }
}

static void send_status(struct fe_main *m) {
  Lynx__Envelope env = LYNX__ENVELOPE__INIT;
  Lynx__FrontendStatus st = LYNX__FRONTEND_STATUS__INIT;
  struct mq_report_ctx x;
  uint64_t applied = m->table_version;
  Lynx__ServiceListen *sl = NULL, **slp = NULL;
  char(*errs)[160] = NULL;
  size_t n_sl = 0;
  if (!m->d.ctl || !m->greeted || !m->have_table)
    return;
  memset(&x, 0, sizeof(x));
  /* a table counts as applied once every worker carried out its commands */
  for (struct frontend *fe = m->services; fe; fe = fe->next)
    if (!fe_applied(fe, fe->cmd_seq))
      applied = m->table_seq_done;
  if (applied == m->table_version)
    m->table_seq_done = m->table_version;
  for (struct frontend *fe = m->services; fe; fe = fe->next)
    for (uint32_t i = 0; fe->w && i < fe->n_w; i++)
      fe_rmq_foreach_mq(&fe->w[i].rmq, collect_mq, &x);
  x.p = calloc(x.n + 1, sizeof(*x.p));
  if (!x.p)
    goto out;
  for (size_t i = 0; i < x.n; i++)
    x.p[i] = &x.r[i];
  /* whether each service's port is open: a taken port shows in the API */
  for (struct frontend *fe = m->services; fe; fe = fe->next)
    n_sl++;
  sl = calloc(n_sl + 1, sizeof(*sl));
  slp = calloc(n_sl + 1, sizeof(*slp));
  errs = calloc(n_sl + 1, sizeof(*errs));
  if (!sl || !slp || !errs)
    goto out;
  n_sl = 0;
  for (struct frontend *fe = m->services; fe; fe = fe->next) {
    int e = fe_listen_error(fe);
    lynx__service_listen__init(&sl[n_sl]);
    sl[n_sl].service = fe->service;
    sl[n_sl].listening = e == 0;
    if (e)
      fe_listen_error_str(fe, e, errs[n_sl], sizeof(errs[n_sl]));
    sl[n_sl].error = errs[n_sl];
    slp[n_sl] = &sl[n_sl];
    n_sl++;
  }
  st.frontend_id = m->id;
  st.table_version = applied;
  __atomic_store_n(&m->table_applied, applied, __ATOMIC_RELAXED);
  st.n_mqueues = x.n;
  st.mqueues = x.p;
  st.n_services = n_sl;
  st.services = slp;
  env.msg_case = LYNX__ENVELOPE__MSG_FRONTEND_STATUS;
  env.frontend_status = &st;
  if (lynx_ctl_send(m->d.ctl, &env))
    lynx_ctl_close(m->d.ctl, "cannot queue a status report");
out:
  free(x.r);
  free(x.p);
  free(sl);
  free(slp);
  free(errs);
}

/* A coordinator that answers status reports and said nothing for this
 * long (ten reports) does not run or cannot be reached: the next one is
 * tried (another may lead by now: docs/etcd.md). The table is kept. Not
 * shorter: a frontend that leaves an active coordinator may see a standby
 * made active meanwhile; and an election takes longer anyway. */
#define COORD_SILENCE_MS 2000u
/* ... and one that accepts the connection but does not answer the Hello */
#define COORD_HELLO_TIMEOUT_MS 1000u

static void on_status_timer(uv_timer_t *t) {
  struct fe_main *m = t->data;
  uint64_t quiet_ms = (lynx_now_ns() - m->heard_ns) / 1000000u;
  /* (without a table it reports nothing, so nothing is answered) */
  if (m->d.ctl && m->greeted && m->acks && m->have_table &&
      quiet_ms >= COORD_SILENCE_MS) {
    lynx_dialer_silent(&m->d, "no status report answered", quiet_ms);
    return;
  }
  send_status(m);
}

/* Whether a socket of type can bind addr as the workers will (with
 * SO_REUSEPORT): 0, or the errno. */
static int probe_bind(const struct sockaddr_storage *addr, int type) {
  int fd = socket(addr->ss_family, type | SOCK_CLOEXEC, 0), one = 1, e = 0;
  socklen_t alen = addr->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                               : sizeof(struct sockaddr_in);
  if (fd < 0)
    return errno;
  if ((type == SOCK_STREAM &&
       setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0) ||
      setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) != 0 ||
      bind(fd, (const struct sockaddr *)addr, alen) != 0)
    e = errno;
  close(fd);
  return e;
}

static int spec_addr(const struct fe_main *m, uint32_t port,
                     struct sockaddr_storage *ss) {
  char addr[96];
  snprintf(addr, sizeof(addr), "%s%s%s:%u", strchr(m->cfg.bind, ':') ? "[" : "",
           m->cfg.bind, strchr(m->cfg.bind, ':') ? "]" : "", port);
  return lynx_parse_hostport(addr, ss);
}

/* The service's back ends (client mqueues); -EINVAL when one is bad. */
static int spec_backends(const Lynx__ServiceSpec *sp,
                         struct fe_backend_cfg *out, uint32_t *n) {
  *n = 0;
  for (size_t i = 0; i < sp->n_backends && i < LYNX_BACKENDS_MAX; i++) {
    const Lynx__Backend *b = sp->backends[i];
    struct fe_backend_cfg *o = &out[(*n)++];
    memset(o, 0, sizeof(*o));
    if (!b->name || !b->address || !b->proto ||
        lynx_parse_hostport(b->address, &o->addr))
      return -EINVAL;
    snprintf(o->name, sizeof(o->name), "%s", b->name);
    snprintf(o->address, sizeof(o->address), "%s", b->address);
    o->proto = strcmp(b->proto, "memcached") ? FE_BE_LEN32 : FE_BE_MEMCACHED;
  }
  return sp->n_backends > LYNX_BACKENDS_MAX ? -EINVAL : 0;
}

static int same_backends(const struct frontend *fe,
                         const Lynx__ServiceSpec *sp) {
  struct fe_backend_cfg b[LYNX_BACKENDS_MAX];
  uint32_t n;
  if (spec_backends(sp, b, &n) || n != fe->n_backends)
    return 0;
  for (uint32_t i = 0; i < n; i++)
    if (strcmp(b[i].name, fe->backends[i].name) ||
        strcmp(b[i].address, fe->backends[i].address) ||
        b[i].proto != fe->backends[i].proto)
      return 0;
  return 1;
}

static enum fe_proto spec_proto(const Lynx__ServiceSpec *sp) {
  return sp->proto && !strcmp(sp->proto, "tcp") ? FE_PROTO_TCP : FE_PROTO_UDP;
}

/* The newest epoch the table gives us (each entry carries the one we
 * produce into its instance with: a connection whose epoch changes is made
 * again, service_set_instances). */
static void take_epoch(struct fe_main *m, const Lynx__DispatchTable *t) {
  uint64_t old = m->epoch;
  m->epoch =
      t->standby ? 0 : t->frontend_epoch; /* a standby produces nothing */
  if (m->epoch && m->epoch != old)
    LYNX_INFO("frontend",
              "%s: producing with frontend epoch %llu (the "
              "newest of the instances it is given)",
              m->id, (unsigned long long)m->epoch);
}

/* What our Hello tells a coordinator: the instances we produce into and
 * with which epoch (Hello.produces), so that one that lost track of them
 * (restarted, newly elected) gives them back to us as they are. */
static void claims_update(struct fe_main *m) {
  size_t n = 0;
  for (struct frontend *fe = m->services; fe; fe = fe->next)
    n += fe->n_instances;
  free(m->claims);
  free(m->claim_ptrs);
  m->claims = calloc(n + 1, sizeof(*m->claims));
  m->claim_ptrs = calloc(n + 1, sizeof(*m->claim_ptrs));
  m->n_claims = 0;
  if (!m->claims || !m->claim_ptrs) {
    free(m->claims);
    free(m->claim_ptrs);
    m->claims = NULL;
    m->claim_ptrs = NULL;
    return; /* a coordinator then gives them with new epochs */
  }
  for (struct frontend *fe = m->services; fe; fe = fe->next)
    for (uint32_t i = 0; i < fe->n_instances; i++) {
      Lynx__InstanceEpoch *c = &m->claims[m->n_claims];
      if (!fe->instances[i].epoch)
        continue;
      lynx__instance_epoch__init(c);
      c->instance_id = fe->instances[i].id;
      c->epoch = fe->instances[i].epoch;
      m->claim_ptrs[m->n_claims++] = c;
    }
}

static void apply_table(struct fe_main *m, const Lynx__DispatchTable *t) {
  take_epoch(m, t);
  /* services that are gone (or moved port) are stopped first */
  for (struct frontend *fe = m->services, *next; fe; fe = next) {
    int keep = 0;
    next = fe->next;
    for (size_t i = 0; !t->standby && i < t->n_services && !keep; i++) {
      const Lynx__ServiceSpec *sp = t->services[i]->service;
      struct sockaddr_storage ss;
      keep = sp && sp->name && strcmp(sp->name, fe->service) == 0 &&
             spec_addr(m, sp->port, &ss) == 0 &&
             memcmp(&ss, &fe->udp_addr, sizeof(ss)) == 0 &&
             spec_proto(sp) == fe->proto && sp->fixed_len == fe->fixed_len &&
             same_backends(fe, sp);
    }
    if (!keep) {
      LYNX_INFO("frontend", "%s: service %s no longer served here", m->id,
                fe->service);
      service_stop(m, fe);
    }
  }
  for (size_t i = 0; !t->standby && i < t->n_services; i++) {
    const Lynx__ServiceTable *st = t->services[i];
    const Lynx__ServiceSpec *sp = st->service;
    struct frontend *fe;
    struct fe_accel *accels;
    uint32_t n = 0;
    if (!sp || !sp->name || !*sp->name)
      continue;
    fe = service_find(m, sp->name);
    if (!fe) {
      struct sockaddr_storage ss;
      struct fe_backend_cfg bk[LYNX_BACKENDS_MAX];
      uint32_t nb;
      if (spec_addr(m, sp->port, &ss)) {
        LYNX_ERR("frontend", "service %s: bad port %u", sp->name, sp->port);
        continue;
      }
      if (spec_backends(sp, bk, &nb)) {
        LYNX_ERR("frontend", "service %s: a back end has a bad address",
                 sp->name);
        continue;
      }
      m->pending_backends = bk;
      m->n_pending_backends = nb;
      fe = service_start(m, sp->name, &ss, sp->mqueues_per_accel,
                         spec_proto(sp), sp->fixed_len);
      if (!fe)
        continue;
      LYNX_INFO("frontend", "%s: serving service %s on %s %s:%u", m->id,
                sp->name, spec_proto(sp) == FE_PROTO_TCP ? "TCP" : "UDP",
                m->cfg.bind, sp->port);
    }
    accels = calloc(st->n_entries + 1, sizeof(*accels));
    if (!accels)
      continue;
    for (size_t k = 0; k < st->n_entries; k++) {
      const Lynx__TableEntry *e = st->entries[k];
      if (accel_from_pb(m, e->region, e->node_id, e->instance_id, &accels[n]))
        continue;
      accels[n].desc.producer = e->epoch ? e->epoch : t->frontend_epoch;
      if (sp->n_backends) {
        /* server mqueues, then client mqueues, as many for each back end
         * (one on a CPU, one per block of a GPU kernel that calls them:
         * docs/client-mqueues.md) */
        uint32_t nq = accels[n].g.n_mqueues, ns = sp->mqueues_per_accel;
        if (nq <= ns || (nq - ns) % sp->n_backends) {
          LYNX_ERR("frontend",
                   "service %s: instance %llu has %u mqueues, "
                   "the spec says %u + a multiple of %zu back ends: skipped",
                   sp->name, (unsigned long long)e->instance_id, nq, ns,
                   sp->n_backends);
          continue;
        }
        accels[n].n_server = sp->mqueues_per_accel;
      }
      n++;
    }
    service_set_instances(fe, accels, n, t->down_nodes, t->n_down_nodes,
                          FE_CMD_REMOVE);
    free(accels);
  }
  claims_update(m);
  m->table_version = t->version;
  m->have_table = 1;
  LYNX_INFO("frontend", "%s: table %llu applied%s", m->id,
            (unsigned long long)t->version, t->standby ? " (standby)" : "");
  lynx_notify_ready("table %llu applied%s", (unsigned long long)t->version,
                    t->standby ? " (standby)" : "");
  send_status(m);
}

/* ---- the control connection -------------------------------------------- */

static void begin_shutdown(struct fe_main *m, int code) {
  if (m->shutting_down)
    return;
  m->shutting_down = 1;
  m->exit_code = code;
  fe_metrics_stop(m->metrics);
  m->metrics = NULL;
  services_stop_all(m);
  if (m->d.ctl)
    lynx_ctl_close(m->d.ctl, NULL);
  lynx_dialer_close(&m->d, NULL);
  uv_close((uv_handle_t *)&m->status, NULL);
  uv_close((uv_handle_t *)&m->sigint, NULL);
  uv_close((uv_handle_t *)&m->sigterm, NULL);
}

/* The dialer frees c after this returns. */
static void on_ctl_closed(struct lynx_ctl *c) {
  struct fe_main *m = c->data;
  m->greeted = 0;
  if (!m->coordinator_mode && m->services) {
    /* the agent is gone or unreachable: out of dispatch at once; what was
     * in flight may still run (no lease fences a static agent): in doubt */
    service_set_instances(m->services, NULL, 0, NULL, 0, FE_CMD_ABANDON);
  }
  if (m->coordinator_mode && !m->shutting_down)
    LYNX_LOG_RL(LYNX_LOG_WARN, "frontend",
                "%s: no coordinator; serving the last table (%llu)", m->id,
                (unsigned long long)m->table_version);
  if (!m->shutting_down)
    lynx_dialer_retry(&m->d);
}

static void on_ctl_msg(struct lynx_ctl *c, Lynx__Envelope *env) {
  struct fe_main *m = c->data;
  int rc;
  m->heard_ns = lynx_now_ns();
  if (!m->greeted) {
    if (env->msg_case != LYNX__ENVELOPE__MSG_HELLO_REPLY) {
      lynx_ctl_close(c, "peer's first message is not a HelloReply");
      return;
    }
    if (!env->hello_reply->ok && env->hello_reply->retryable) {
      LYNX_LOG_RL(LYNX_LOG_WARN, "frontend", "%s: %s; retrying", c->peer,
                  env->hello_reply->error);
      lynx_ctl_close(c, NULL);
      return;
    }
    if (!env->hello_reply->ok ||
        env->hello_reply->proto_version != LYNX_PROTO_VERSION) {
      LYNX_ERR("frontend", "%s refused us: %s", c->peer,
               env->hello_reply->error && *env->hello_reply->error
                   ? env->hello_reply->error
                   : "protocol version mismatch");
      /* a wrong token or version does not heal by retrying */
      begin_shutdown(m, 1);
      return;
    }
    m->greeted = 1;
    m->acks = m->coordinator_mode && env->hello_reply->acks_status;
    lynx_dialer_connected(&m->d);
    return;
  }
  if (!m->coordinator_mode &&
      env->msg_case == LYNX__ENVELOPE__MSG_DESCRIPTORS) {
    rc = apply_descriptors(m, env->descriptors);
    if (rc) {
      LYNX_ERR("frontend", "cannot serve agent %s's accelerators: %s", c->peer,
               strerror(-rc));
      lynx_ctl_close(c, "unusable descriptors");
    }
    return;
  }
  if (m->coordinator_mode &&
      env->msg_case == LYNX__ENVELOPE__MSG_DISPATCH_TABLE) {
    apply_table(m, env->dispatch_table);
    return;
  }
  if (m->coordinator_mode &&
      env->msg_case == LYNX__ENVELOPE__MSG_FRONTEND_STATUS_REPLY)
    return; /* it hears us: heard_ns */
  LYNX_DBG("frontend", "ignoring message case %d", (int)env->msg_case);
}

static void on_signal(uv_signal_t *s, int signum) {
  struct fe_main *m = s->data;
  LYNX_INFO("frontend", "%s: %s, draining and shutting down", m->id,
            strsignal(signum));
  lynx_notify_stopping("%s, draining and shutting down", strsignal(signum));
  begin_shutdown(m, 0);
}

/* The options of one mode given in the other are refused (a coordinator
 * says what to serve; static mode serves one port, given whole), then
 * each mode's defaults are set (malloc'd, as the option table's strings
 * are: lynx_opts_free frees them). 0, or -EINVAL with the reason on
 * stderr, or -ENOMEM. */
static int mode_options(struct fe_cfg *cfg, int coordinator_mode) {
  const char *stat_opt = cfg->udp       ? "udp"
                         : cfg->tcp     ? "tcp"
                         : cfg->framing ? "framing"
                                        : NULL;
  if (coordinator_mode && stat_opt) {
    fprintf(stderr,
            "--%s is static mode's (with --agent); with --coordinator the "
            "coordinator's services say what is served (lynxctl service "
            "create), on --bind\n",
            stat_opt);
    return -EINVAL;
  }
  if (!coordinator_mode && cfg->bind) {
    fprintf(stderr, "--bind is for --coordinator mode; in static mode "
                    "--udp or --tcp take host:port\n");
    return -EINVAL;
  }
  if (cfg->udp && cfg->tcp) {
    fprintf(stderr,
            "--udp %s and --tcp %s: static mode serves one port, "
            "either UDP or TCP\n",
            cfg->udp, cfg->tcp);
    return -EINVAL;
  }
  if (cfg->framing && !cfg->tcp) {
    fprintf(stderr, "--framing %s frames TCP messages: it needs --tcp\n",
            cfg->framing);
    return -EINVAL;
  }
  if ((!cfg->udp && !cfg->tcp && !(cfg->udp = strdup("7000"))) ||
      (!cfg->framing && !(cfg->framing = strdup("len32"))) ||
      (!cfg->bind && !(cfg->bind = strdup("0.0.0.0")))) {
    fprintf(stderr, "out of memory\n");
    return -ENOMEM;
  }
  return 0;
}

int main(int argc, char **argv) {
  int help = 0; /* --help was printed */
  static struct fe_main m;
  struct fe_cfg *cfg = &m.cfg;
  int rc, lvl;
  char udp[80];
  struct sockaddr_storage ss, bind_ss;
  const char *peer;

  rc = lynx_opts_parse_conf(fe_opts, cfg, argc, argv,
                            "usage: lynx-frontend [options]\n"
                            "Serves UDP clients from mqueues in "
                            "accelerator memory: static (--agent) or as "
                            "the coordinator says (--coordinator).",
                            &help);
  if (rc || help)
    return rc ? lynx_opts_exit_code(rc) : 0;
  m.exit_code = LYNX_EXIT_USAGE; /* until the command line is checked */
  signal(SIGPIPE, SIG_IGN);
  /* a TCP service holds a descriptor per client: lift the soft limit */
  lynx_raise_nofile((unsigned long)-1);
  pthread_mutex_init(&m.list_lock, NULL);
  lvl = lynx_log_parse_level(cfg->log_level);
  if (lvl < 0) {
    fprintf(stderr, "--log-level: unknown level '%s'\n", cfg->log_level);
    goto out;
  }
  lynx_log_level = lvl;
  if (cfg->agent && cfg->coordinator) {
    fprintf(stderr,
            "--agent %s (static mode) and --coordinator %s exclude "
            "each other\n",
            cfg->agent, cfg->coordinator);
    goto out;
  }
  m.coordinator_mode = cfg->coordinator != NULL;
  if (mode_options(cfg, m.coordinator_mode))
    goto out;
  peer = m.coordinator_mode ? cfg->coordinator
                            : (cfg->agent ? cfg->agent : "127.0.0.1:7701");
  if (!cfg->agent && !m.coordinator_mode)
    cfg->agent = strdup(peer);
  {
    unsigned n;
    struct sockaddr_storage all[LYNX_ADDRS_MAX];
    if (lynx_parse_hostports(peer, all, NULL, LYNX_ADDRS_MAX, &n) ||
        (!m.coordinator_mode && n > 1)) {
      fprintf(stderr, "--%s: '%s' is not host:port%s\n",
              m.coordinator_mode ? "coordinator" : "agent", peer,
              m.coordinator_mode ? "[,host:port...]" : "");
      goto out;
    }
  }
  {
    const char *port = cfg->tcp ? cfg->tcp : cfg->udp;
    snprintf(udp, sizeof(udp), "%s%s", strchr(port, ':') ? "" : ":", port);
    if (lynx_parse_hostport(udp, &ss)) {
      fprintf(stderr, "--%s: '%s' is not a port or host:port\n",
              cfg->tcp ? "tcp" : "udp", port);
      goto out;
    }
  }
  if (!strncmp(cfg->framing, "fixed:", 6)) {
    uint64_t n;
    if (lynx_parse_u64(cfg->framing + 6, 1, LYNX_SLOT_MAX, &n)) {
      fprintf(stderr, "--framing: '%s': fixed:N needs 1 <= N <= %u\n",
              cfg->framing, LYNX_SLOT_MAX);
      goto out;
    }
    cfg->fixed_len = (uint32_t)n;
  } else if (strcmp(cfg->framing, "len32")) {
    fprintf(stderr, "--framing: len32 or fixed:N, not '%s'\n", cfg->framing);
    goto out;
  }
  if (spec_addr(&m, 1, &bind_ss)) {
    fprintf(stderr, "--bind: '%s' is not an address\n", cfg->bind);
    goto out;
  }
  m.exit_code = LYNX_EXIT_RUNTIME; /* from here on, the world disagrees */
  if (lynx_local_identity(m.host_id, m.netns_id))
    LYNX_WARN("frontend", "this host's identity is not in /proc: every "
                          "region is reached over its agent's transport");
  /* which receive path UDP services take: an --rx uring this machine
   * cannot give fails the command at once, as a port that is taken does */
  if ((!cfg->tcp || m.coordinator_mode) && choose_rx(cfg))
    goto out;
  if (cfg->token_file) {
    char err[320];
    if (lynx_read_token(cfg->token_file, &m.token, err, sizeof(err))) {
      fprintf(stderr, "%s\n", err);
      goto out;
    }
  }
  {
    struct lynx_tls_files tf = {cfg->tls_ca, cfg->tls_cert, cfg->tls_key};
    char err[512];
    rc =
        lynx_tls_load_client(&m.tls, &tf, m.coordinator_mode, err, sizeof(err));
    if (rc < 0) {
      fprintf(stderr, "%s\n", err);
      m.exit_code = LYNX_EXIT_USAGE;
      goto out;
    }
    m.tls_on = rc == 0;
  }
  if (!m.coordinator_mode) {
    /* static mode serves one port, known now: one that is taken is this
     * command's failure, said at once (a coordinator's services, which
     * come and go, wait for their port instead) */
    int e = probe_bind(&ss, cfg->tcp ? SOCK_STREAM : SOCK_DGRAM);
    if (e) {
      char addr[80];
      lynx_fmt_addr((struct sockaddr *)&ss, addr, sizeof(addr));
      fprintf(stderr, "--%s %s: cannot bind %s %s: %s\n",
              cfg->tcp ? "tcp" : "udp", cfg->tcp ? cfg->tcp : cfg->udp,
              cfg->tcp ? "TCP" : "UDP", addr, strerror(e));
      goto out;
    }
  }
  if (cfg->frontend_id)
    snprintf(m.id, sizeof(m.id), "%s", cfg->frontend_id);
  else
    snprintf(m.id, sizeof(m.id), "fe-%d", (int)getpid());
  srand((unsigned)lynx_now_ns());
  if (cfg->metrics && fe_metrics_start(cfg->metrics, &m.services, &m.list_lock,
                                       &m.table_applied, &m.metrics))
    goto out; /* the reason, with the address, is on stderr */

  uv_loop_init(&m.loop);
  snprintf(m.target, sizeof(m.target), "%s %s",
           m.coordinator_mode ? "coordinator" : "agent", peer);
  lynx_dialer_init(&m.d, &m.loop, peer, "frontend", m.target, cfg->frame_max);
  m.d.role = "frontend";
  if (m.coordinator_mode)
    m.d.hello_timeout_ms = COORD_HELLO_TIMEOUT_MS;
  m.d.epoch = &m.epoch;
  m.d.produces = &m.claim_ptrs;
  m.d.n_produces = &m.n_claims;
  m.d.id = m.id;
  m.d.token = m.token;
  m.d.tls = m.tls_on ? &m.tls : NULL;
  m.d.on_msg = on_ctl_msg;
  m.d.on_close = on_ctl_closed;
  m.d.data = &m;
  uv_timer_init(&m.loop, &m.status);
  m.status.data = &m;
  uv_signal_init(&m.loop, &m.sigint);
  uv_signal_init(&m.loop, &m.sigterm);
  m.sigint.data = m.sigterm.data = &m;
  uv_signal_start(&m.sigint, on_signal, SIGINT);
  uv_signal_start(&m.sigterm, on_signal, SIGTERM);
  if (m.coordinator_mode)
    uv_timer_start(&m.status, on_status_timer, 200, 200);
  {
    struct json_object *j = lynx_opts_json(fe_opts, cfg);
    LYNX_INFO("frontend", "%s: starting in %s mode; config %s", m.id,
              m.coordinator_mode ? "coordinator" : "static",
              json_object_to_json_string_ext(j, JSON_C_TO_STRING_PLAIN));
    json_object_put(j);
  }
  m.exit_code = 0;
  lynx_dialer_connect(&m.d);
  uv_run(&m.loop, UV_RUN_DEFAULT);
  if (uv_loop_close(&m.loop) != 0)
    LYNX_WARN("frontend", "loop closed with handles open");
  fe_metrics_stop(m.metrics);
  services_stop_all(&m);
  LYNX_INFO("frontend", "%s: stopped", m.id);
out:
  if (m.tls_on)
    lynx_tls_free(&m.tls);
  free(m.token);
  free(m.claims);
  free(m.claim_ptrs);
  lynx_opts_free(fe_opts, cfg);
  pthread_mutex_destroy(&m.list_lock);
  return m.exit_code;
}
