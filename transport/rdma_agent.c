/*
 * rdma_agent.c - the agent side of the rdma transport: listens with
 * rdma_cm, registers every exported region as three memory regions (one per
 * access class, each with only the remote access it needs), and admits a
 * frontend's RC QP to a region when its connect private data carries that
 * region's key and epoch.
 *
 * Fencing (docs/mqueue.md "Fencing"): the private data also carries the
 * frontend's epoch. An older one than the region admitted is rejected
 * (LYNX_RDMA_REJ_FENCED); a newer one takes the region over: every QP of
 * an older epoch is moved to ERR at once (the NIC fails its one-sided
 * writes from then on), then disconnected and destroyed.
 *
 * The agent is out of the data path: once a QP is up, the frontend's RDMA
 * WRITEs and READs are served by the NIC. The agent only receives the
 * frontend's notify SENDs (0 bytes) and turns them into a futex wake of a
 * sleeping CPU accelerator.
 *
 * Threads: one CM thread per handle (struct rdma_agent, from agent_create)
 * polls its event channel, the completion channel of the notify receives
 * and a stop eventfd. Everything of a handle is guarded by its lock
 * (ag->lock); the CM thread takes it around each batch of events and reads and
 * acks every event inside it, so region_free (agent main thread) may
 * destroy a connection's id under the lock without an unacked event ever
 * being in flight (rdma_destroy_id waits for those).
 *
 * One device: the one the listen address is on (or, listening on a
 * wildcard, the first device; with several, the agent warns). Regions are
 * registered on its PD, each accepted QP is created on the same PD, and a
 * request arriving on any other device is rejected with a reason.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <unistd.h>

#include "log.h"
#include "rdma_internal.h"
#include "util.h"

#define AG_BACKLOG 64
#define AG_RQ_DEPTH 64        /* notify receives posted per QP */
#define AG_EVENTS_PER_WAKE 32 /* bounded: the stop fd is served between */
#define AG_SINK 64            /* receive buffer of notify SENDs (0 bytes) */

struct ag_region {
  uint8_t *base; /* host memory, or NULL: mem (a GPU's) */
  const struct lynx_region_mem *mem;
  uint64_t key, epoch;
  struct lynx_fence fence;          /* under ag->lock; metrics read it */
  struct ibv_mr *mr[LYNX_MR_COUNT]; /* NULL once the device is gone */
  struct ag_region *next;
};

struct ag_conn {
  struct rdma_cm_id *id;
  struct ag_region *reg;
  uint64_t producer; /* its frontend epoch, admitted by reg->fence */
  struct ibv_cq *cq; /* its notify receives, on its agent's cc */
  int established;
  char peer[64];
  struct ag_conn *next;
};

/* The agent-side handle: base.bound is the "host:port" listened on. */
struct rdma_agent {
  struct lynx_transport_agent base;
  pthread_mutex_t lock;
  int running;
  int removed;  /* DEVICE_REMOVAL seen: nothing is served any more */
  int drop_all; /* set by an event, acted on after its ack */
  struct rdma_event_channel *ch;
  struct rdma_cm_id *listen;
  struct ibv_context **devs; /* rdma_get_devices, for a wildcard listen */
  struct ibv_context *ctx;
  struct ibv_device_attr attr;
  struct ibv_pd *pd;
  struct ibv_comp_channel *cc;
  struct ibv_mr *sink_mr;
  uint8_t sink[AG_SINK] __attribute__((aligned(64)));
  int stop_fd;
  pthread_t thread;
  struct ag_region *regions;
  struct ag_conn *conns;
};

static int set_nonblock(int fd) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
    return -errno;
  return 0;
}

static int errno_or(int dflt) { return errno ? -errno : dflt; }

/* ---- connections ------------------------------------------------------ */

static int post_recv(struct rdma_agent *ag, struct ag_conn *cn) {
  struct ibv_sge sge = {(uintptr_t)ag->sink, AG_SINK, ag->sink_mr->lkey};
  struct ibv_recv_wr wr, *bad;
  memset(&wr, 0, sizeof(wr));
  wr.sg_list = &sge;
  wr.num_sge = 1;
  return ibv_post_recv(cn->id->qp, &wr, &bad);
}

/* Unlinks and frees cn with its QP and CQ; returns its id, which the
 * caller destroys once every event of it is acked. */
static struct rdma_cm_id *conn_drop(struct rdma_agent *ag, struct ag_conn *cn) {
  struct ag_conn **pp = &ag->conns;
  struct rdma_cm_id *id = cn->id;
  while (*pp && *pp != cn)
    pp = &(*pp)->next;
  if (*pp)
    *pp = cn->next;
  lynx_fence_release(&cn->reg->fence, cn->producer);
  if (cn->established)
    rdma_disconnect(id); /* the frontend sees DISCONNECTED at once */
  if (id->qp)
    rdma_destroy_qp(id);
  if (cn->cq)
    ibv_destroy_cq(cn->cq); /* its completion events are all acked */
  id->context = NULL;
  free(cn);
  return id;
}

/* Creates the QP of an admitted request on the region's PD and accepts.
 * 0 or -errno (the caller rejects). */
static int conn_accept(struct rdma_agent *ag, struct rdma_cm_id *id,
                       struct ag_region *reg, uint64_t producer,
                       const struct rdma_conn_param *req, const char *peer) {
  struct ibv_qp_init_attr qa;
  struct rdma_conn_param p;
  struct ag_conn *cn = calloc(1, sizeof(*cn));
  int rc;
  if (!cn) {
    lynx_fence_release(&reg->fence, producer);
    return -ENOMEM;
  }
  cn->id = id;
  cn->reg = reg;
  cn->producer = producer;
  snprintf(cn->peer, sizeof(cn->peer), "%s", peer);
  cn->cq = ibv_create_cq(ag->ctx, AG_RQ_DEPTH + 2, cn, ag->cc, 0);
  if (!cn->cq || ibv_req_notify_cq(cn->cq, 0)) {
    rc = errno_or(-ENOMEM);
    goto fail;
  }
  memset(&qa, 0, sizeof(qa));
  qa.send_cq = cn->cq;
  qa.recv_cq = cn->cq;
  qa.qp_type = IBV_QPT_RC;
  qa.cap.max_send_wr = 1; /* the agent never sends */
  qa.cap.max_recv_wr = AG_RQ_DEPTH;
  qa.cap.max_send_sge = 1;
  qa.cap.max_recv_sge = 1;
  if (rdma_create_qp(id, ag->pd, &qa)) {
    rc = errno_or(-ENOMEM);
    goto fail;
  }
  for (int i = 0; i < AG_RQ_DEPTH; i++) {
    rc = post_recv(ag, cn);
    if (rc) {
      rc = -rc;
      goto fail;
    }
  }
  memset(&p, 0, sizeof(p));
  /* the frontend's RDMA READs: as many in flight as it asked for, within
   * what this device serves */
  p.responder_resources = req->initiator_depth < ag->attr.max_qp_rd_atom
                              ? req->initiator_depth
                              : (uint8_t)ag->attr.max_qp_rd_atom;
  p.initiator_depth = 0;
  p.rnr_retry_count = 7;
  id->context = cn;
  cn->next = ag->conns;
  ag->conns = cn;
  if (rdma_accept(id, &p)) {
    rc = errno_or(-EIO);
    conn_drop(ag, cn); /* the id stays: the caller rejects and destroys it */
    return rc;
  }
  return 0;
fail:
  lynx_fence_release(&reg->fence, producer);
  if (id->qp)
    rdma_destroy_qp(id);
  if (cn->cq)
    ibv_destroy_cq(cn->cq);
  free(cn);
  return rc;
}

/* A takeover of reg by producer: every connection of an older epoch has
 * its QP moved to ERR first (its frontend's writes fail at once), then is
 * disconnected and destroyed. Under ag->lock. The number cut. */
static unsigned cut_older(struct rdma_agent *ag, struct ag_region *reg,
                          uint64_t producer) {
  unsigned n = 0;
  for (struct ag_conn *cn = ag->conns, *nx; cn; cn = nx) {
    int rc;
    nx = cn->next;
    if (cn->reg != reg || cn->producer >= producer)
      continue;
    rc = cn->id->qp ? lynx__rdma_qp_err(cn->id->qp) : 0;
    if (rc)
      LYNX_LOG_RL(LYNX_LOG_WARN, "rdma",
                  "agent: frontend %s: cannot move "
                  "its QP to the error state: %s (disconnecting it)",
                  cn->peer, strerror(-rc));
    rdma_destroy_id(conn_drop(ag, cn));
    n++;
  }
  return n;
}

/* Fencing of a request for reg presenting producer: 0 admitted (older
 * connections cut on a takeover), or -ESTALE (reason logged). */
static int fence_request(struct rdma_agent *ag, struct ag_region *reg,
                         uint64_t producer, const char *peer) {
  char why[160];
  uint64_t was = 0;
  int rc = lynx_fence_admit(&reg->fence, producer, &was, why, sizeof(why));
  if (rc < 0) {
    LYNX_LOG_RL(LYNX_LOG_WARN, "rdma",
                "agent: refused a connection from "
                "%s: %s",
                peer, why);
    return rc;
  }
  if (rc == LYNX_FENCE_TAKEOVER) {
    if (lynx_fence_store(reg->base, reg->mem, producer))
      LYNX_LOG_RL(LYNX_LOG_WARN, "rdma",
                  "agent: region %s: cannot write "
                  "its fence word",
                  reg->fence.name);
    lynx_fence_took_over(&reg->fence, was, producer,
                         cut_older(ag, reg, producer));
  }
  return 0;
}

/* CONNECT_REQUEST: admit to a region or reject with a reason. Returns the
 * id to destroy after the ack (rejected), or NULL. */
static struct rdma_cm_id *on_request(struct rdma_agent *ag,
                                     struct rdma_cm_event *e) {
  const struct rdma_conn_param *req = &e->param.conn;
  enum lynx__rdma_reject why = LYNX_RDMA_REJ_KEY;
  struct ag_region *reg = NULL;
  uint64_t key, epoch, producer = 0;
  uint8_t rej[LYNX_RDMA_REJ_LEN];
  char peer[64];
  int rc = 0;
  lynx_fmt_addr(rdma_get_peer_addr(e->id), peer, sizeof(peer));
  if (lynx__rdma_pd_decode(req->private_data, req->private_data_len, &key,
                           &epoch, &producer)) {
    why = LYNX_RDMA_REJ_FORMAT;
  } else {
    for (struct ag_region *r = ag->regions; r && !reg; r = r->next) {
      rc = lynx__rdma_pd_admit(req->private_data, req->private_data_len, r->key,
                               r->epoch);
      if (rc == 0 && r->mr[0])
        reg = r;
      else if (rc == -ESTALE)
        why = LYNX_RDMA_REJ_EPOCH;
    }
  }
  if (reg && e->id->verbs != ag->ctx) {
    reg = NULL;
    why = LYNX_RDMA_REJ_DEVICE;
  }
  if (reg && fence_request(ag, reg, producer, peer)) {
    lynx__rdma_rej_encode(rej, LYNX_RDMA_REJ_FENCED);
    rdma_reject(e->id, rej, sizeof(rej));
    return e->id; /* logged */
  }
  if (reg) {
    rc = conn_accept(ag, e->id, reg, producer, req, peer);
    if (rc == 0) {
      LYNX_INFO("rdma", "agent: frontend %s admitted to region 0x%llx", peer,
                (unsigned long long)(uintptr_t)reg->base);
      return NULL;
    }
    why = LYNX_RDMA_REJ_RESOURCE;
    LYNX_WARN("rdma", "agent: cannot accept frontend %s: %s", peer,
              strerror(-rc));
  }
  LYNX_LOG_RL(LYNX_LOG_WARN, "rdma",
              "agent: refused a connection from %s: "
              "%s",
              peer, lynx__rdma_rej_str(why));
  lynx__rdma_rej_encode(rej, why);
  rdma_reject(e->id, rej, sizeof(rej));
  return e->id;
}

/* One CM event; returns an id to destroy after the ack, or NULL. */
static struct rdma_cm_id *on_event(struct rdma_agent *ag,
                                   struct rdma_cm_event *e) {
  struct ag_conn *cn = e->id ? e->id->context : NULL;
  switch (e->event) {
  case RDMA_CM_EVENT_CONNECT_REQUEST:
    return on_request(ag, e);
  case RDMA_CM_EVENT_ESTABLISHED:
    if (cn)
      cn->established = 1;
    return NULL;
  case RDMA_CM_EVENT_DISCONNECTED:
  case RDMA_CM_EVENT_REJECTED:
  case RDMA_CM_EVENT_CONNECT_ERROR:
  case RDMA_CM_EVENT_UNREACHABLE:
    if (!cn)
      return NULL;
    LYNX_INFO("rdma", "agent: frontend %s: %s", cn->peer,
              rdma_event_str(e->event));
    cn->established = 0; /* nothing to disconnect */
    return conn_drop(ag, cn);
  case RDMA_CM_EVENT_DEVICE_REMOVAL:
    LYNX_ERR("rdma",
             "agent: RDMA device removed: dropping every connection "
             "and registration; frontends cannot reach this agent's regions "
             "until it restarts");
    ag->drop_all = 1;
    return NULL;
  case RDMA_CM_EVENT_ADDR_CHANGE:
    LYNX_WARN("rdma", "agent: the listen address changed");
    return NULL;
  default: /* TIMEWAIT_EXIT and the like */
    LYNX_DBG("rdma", "agent: %s ignored", rdma_event_str(e->event));
    return NULL;
  }
}

/* ---- device ----------------------------------------------------------- */

/* Registrations of one region, one per access class; NULL-safe. */
static void region_dereg(struct ag_region *reg) {
  for (int i = 0; i < LYNX_MR_COUNT; i++) {
    if (reg->mr[i])
      ibv_dereg_mr(reg->mr[i]);
    reg->mr[i] = NULL;
  }
}

/* Every connection, every registration, the PD and channels: after
 * agent_destroy's join, or in the CM thread after a DEVICE_REMOVAL's ack. */
static void drop_device(struct rdma_agent *ag) {
  while (ag->conns)
    rdma_destroy_id(conn_drop(ag, ag->conns));
  for (struct ag_region *r = ag->regions; r; r = r->next)
    region_dereg(r);
  if (ag->sink_mr)
    ibv_dereg_mr(ag->sink_mr);
  if (ag->cc)
    ibv_destroy_comp_channel(ag->cc);
  if (ag->pd)
    ibv_dealloc_pd(ag->pd);
  ag->sink_mr = NULL;
  ag->cc = NULL;
  ag->pd = NULL;
  ag->ctx = NULL;
  if (ag->listen)
    rdma_destroy_id(ag->listen);
  ag->listen = NULL;
}

static int device_open(struct rdma_agent *ag, char *err, size_t errlen) {
  struct ibv_context *ctx = ag->listen->verbs;
  int n = 0, rc;
  if (!ctx) { /* wildcard: no device yet */
    ag->devs = rdma_get_devices(&n);
    if (!ag->devs || n == 0) {
      snprintf(err, errlen, "rdma transport: rdma_get_devices found none");
      return -ENODEV;
    }
    ctx = ag->devs[0];
    if (n > 1)
      LYNX_WARN("rdma",
                "agent: listening on a wildcard with %d RDMA devices: "
                "regions are registered on %s only; pass the address of its "
                "interface to serve through one device explicitly",
                n, ibv_get_device_name(ctx->device));
  }
  rc = ibv_query_device(ctx, &ag->attr);
  if (rc) {
    snprintf(err, errlen, "rdma transport: ibv_query_device: %s", strerror(rc));
    return -rc;
  }
  ag->pd = ibv_alloc_pd(ctx);
  ag->cc = ag->pd ? ibv_create_comp_channel(ctx) : NULL;
  ag->sink_mr =
      ag->cc ? ibv_reg_mr(ag->pd, ag->sink, AG_SINK, IBV_ACCESS_LOCAL_WRITE)
             : NULL;
  if (!ag->sink_mr || set_nonblock(ag->cc->fd)) {
    rc = errno_or(-ENOMEM);
    snprintf(err, errlen,
             "rdma transport: cannot set up %s (PD, completion "
             "channel, receive buffer): %s",
             ibv_get_device_name(ctx->device), strerror(-rc));
    return rc;
  }
  ag->ctx = ctx;
  return 0;
}

/* ---- CM thread -------------------------------------------------------- */

/* Notify receives of one connection: repost, then wake the accelerator. */
static void conn_drain(struct rdma_agent *ag, struct ag_conn *cn) {
  struct ibv_wc wc[16];
  int wake = 0, n, budget = 2 * AG_RQ_DEPTH;
  if (ibv_req_notify_cq(cn->cq, 0))
    LYNX_LOG_RL(LYNX_LOG_WARN, "rdma",
                "agent: frontend %s: cannot re-arm "
                "its CQ",
                cn->peer);
  while (budget > 0 && (n = ibv_poll_cq(cn->cq, 16, wc)) > 0) {
    budget -= n;
    for (int i = 0; i < n; i++) {
      if (wc[i].status == IBV_WC_SUCCESS && wc[i].opcode == IBV_WC_RECV) {
        wake = 1;
        if (post_recv(ag, cn))
          LYNX_LOG_RL(LYNX_LOG_WARN, "rdma",
                      "agent: frontend %s: cannot "
                      "repost a receive",
                      cn->peer);
      } else if (wc[i].status != IBV_WC_SUCCESS &&
                 wc[i].status != IBV_WC_WR_FLUSH_ERR) {
        LYNX_LOG_RL(LYNX_LOG_WARN, "rdma",
                    "agent: frontend %s: receive "
                    "failed: %s",
                    cn->peer, ibv_wc_status_str(wc[i].status));
      }
    }
  }
  if (wake && cn->reg && cn->reg->base) /* a GPU's kernel polls */
    lynx_region_wake(cn->reg->base);
}

static void serve_cq_events(struct rdma_agent *ag) {
  for (int i = 0; i < AG_EVENTS_PER_WAKE && ag->cc; i++) {
    struct ibv_cq *cq;
    void *ctx;
    if (ibv_get_cq_event(ag->cc, &cq, &ctx))
      return; /* EAGAIN */
    ibv_ack_cq_events(cq, 1);
    conn_drain(ag, ctx);
  }
}

static void serve_cm_events(struct rdma_agent *ag) {
  for (int i = 0; i < AG_EVENTS_PER_WAKE; i++) {
    struct rdma_cm_event *e;
    struct rdma_cm_id *gone;
    if (rdma_get_cm_event(ag->ch, &e)) {
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        LYNX_LOG_RL(LYNX_LOG_WARN, "rdma", "agent: rdma_get_cm_event: %s",
                    strerror(errno));
      return;
    }
    gone = on_event(ag, e);
    rdma_ack_cm_event(e);
    if (gone)
      rdma_destroy_id(gone);
    if (ag->drop_all) {
      drop_device(ag);
      ag->drop_all = 0;
      ag->removed = 1;
    }
  }
}

static void *cm_main(void *arg) {
  struct rdma_agent *ag = arg;
  prctl(PR_SET_NAME, "lynx-rdma-cm", 0, 0, 0);
  for (;;) {
    struct pollfd p[3] = {{ag->stop_fd, POLLIN, 0},
                          {ag->ch->fd, POLLIN, 0},
                          {ag->cc ? ag->cc->fd : -1, POLLIN, 0}};
    if (poll(p, 3, -1) < 0) {
      if (errno != EINTR) {
        LYNX_LOG_RL(LYNX_LOG_ERROR, "rdma", "agent: poll: %s", strerror(errno));
        usleep(10000);
      }
      continue;
    }
    if (p[0].revents)
      break;
    pthread_mutex_lock(&ag->lock);
    if (p[1].revents)
      serve_cm_events(ag);
    if (p[2].revents)
      serve_cq_events(ag);
    pthread_mutex_unlock(&ag->lock);
  }
  return NULL;
}

/* ---- ops -------------------------------------------------------------- */

static void agent_teardown(struct rdma_agent *ag) {
  drop_device(ag);
  if (ag->devs)
    rdma_free_devices(ag->devs);
  ag->devs = NULL;
  if (ag->ch)
    rdma_destroy_event_channel(ag->ch);
  ag->ch = NULL;
  if (ag->stop_fd >= 0)
    close(ag->stop_fd);
  ag->stop_fd = -1;
  ag->removed = 0;
}

static int listen_on(struct rdma_agent *ag, struct sockaddr_storage *ss,
                     char *err, size_t errlen) {
  ag->ch = rdma_create_event_channel();
  if (!ag->ch || set_nonblock(ag->ch->fd) ||
      rdma_create_id(ag->ch, &ag->listen, NULL, RDMA_PS_TCP)) {
    snprintf(err, errlen, "rdma transport: cannot create an rdma_cm id: %s",
             strerror(errno));
    return errno_or(-ENOMEM);
  }
  if (rdma_bind_addr(ag->listen, (struct sockaddr *)ss) ||
      rdma_listen(ag->listen, AG_BACKLOG)) {
    int rc = errno_or(-EADDRNOTAVAIL);
    snprintf(err, errlen,
             "rdma transport: cannot listen: %s (is the "
             "address on an RDMA device's interface?)",
             strerror(-rc));
    return rc;
  }
  if (ss->ss_family == AF_INET)
    ((struct sockaddr_in *)ss)->sin_port = rdma_get_src_port(ag->listen);
  else
    ((struct sockaddr_in6 *)ss)->sin6_port = rdma_get_src_port(ag->listen);
  return 0;
}

int lynx__rdma_agent_start(const struct lynx_transport_ops *ops,
                           const struct lynx_transport_opts *o,
                           struct lynx_transport_agent **out, char *err,
                           size_t errlen) {
  struct sockaddr_storage ss;
  struct rdma_agent *ag;
  int rc;
  if (lynx__rdma_device_count() == 0) {
    snprintf(err, errlen,
             "rdma transport: no RDMA device found "
             "(ibv_get_device_list returned none); use --transport tcp, or "
             "add SoftRoCE: rdma link add rxe0 type rxe netdev IFACE");
    return -ENODEV;
  }
  if (lynx_parse_hostport(o->listen, &ss)) {
    snprintf(err, errlen,
             "rdma transport: bad listen address '%s' "
             "(expected host:port)",
             o->listen);
    return -EINVAL;
  }
  /* the receive sink inside is 64-byte aligned */
  ag = aligned_alloc(64, lynx_align_up(sizeof(*ag), 64));
  if (!ag) {
    snprintf(err, errlen, "rdma transport: out of memory");
    return -ENOMEM;
  }
  memset(ag, 0, sizeof(*ag));
  ag->base.ops = ops;
  ag->stop_fd = -1;
  pthread_mutex_init(&ag->lock, NULL);
  pthread_mutex_lock(&ag->lock);
  rc = listen_on(ag, &ss, err, errlen);
  if (!rc)
    rc = device_open(ag, err, errlen);
  if (!rc) {
    ag->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ag->stop_fd < 0) {
      rc = -errno;
      snprintf(err, errlen, "rdma transport: eventfd: %s", strerror(-rc));
    }
  }
  if (!rc) {
    rc = -pthread_create(&ag->thread, NULL, cm_main, ag);
    if (rc)
      snprintf(err, errlen, "rdma transport: cannot start its thread: %s",
               strerror(-rc));
  }
  if (rc) {
    agent_teardown(ag);
    pthread_mutex_unlock(&ag->lock);
    pthread_mutex_destroy(&ag->lock);
    free(ag);
    return rc;
  }
  lynx_fmt_addr((struct sockaddr *)&ss, ag->base.bound, sizeof(ag->base.bound));
  ag->running = 1;
  pthread_mutex_unlock(&ag->lock);
  LYNX_INFO("rdma", "agent: listening on %s (device %s)", ag->base.bound,
            ibv_get_device_name(ag->ctx->device));
  *out = &ag->base;
  return 0;
}

void lynx__rdma_agent_destroy(struct lynx_transport_agent *a) {
  struct rdma_agent *ag;
  uint64_t one = 1;
  int kept;
  if (!a)
    return;
  ag = container_of(a, struct rdma_agent, base);
  if (ag->running) {
    if (write(ag->stop_fd, &one, sizeof(one)) != sizeof(one))
      LYNX_ERR("rdma", "agent: cannot stop the CM thread: %s", strerror(errno));
    else
      pthread_join(ag->thread, NULL);
    pthread_mutex_lock(&ag->lock);
    agent_teardown(ag); /* regions stay listed, unregistered, for region_free */
    ag->running = 0;
    pthread_mutex_unlock(&ag->lock);
  }
  pthread_mutex_lock(&ag->lock);
  kept = ag->regions != NULL;
  pthread_mutex_unlock(&ag->lock);
  if (kept) { /* their region_free still takes the lock */
    LYNX_WARN("rdma", "agent: transport stopped with regions still exported: "
                      "its handle stays for their region_free");
    return;
  }
  pthread_mutex_destroy(&ag->lock);
  free(ag);
}

int lynx__rdma_region_alloc(struct lynx_transport_agent *a,
                            struct lynx_region *r, const char *name,
                            uint64_t size) {
  return lynx_region_map_served(r, a, name, size);
}

int lynx__rdma_region_attach(struct lynx_transport_agent *a,
                             struct lynx_region *r, const char *name,
                             uint64_t size, const struct lynx_region_mem *mem) {
  int rc = lynx_region_attach_served(r, a, size, mem);
  snprintf(r->name, sizeof(r->name), "%s", name ? name : "");
  return rc;
}

static int region_reg(struct rdma_agent *ag, struct ag_region *reg,
                      const struct lynx_geom *g) {
  uint64_t tx = g->rings_off + (uint64_t)g->n_mqueues * g->ring_bytes;
  const uint64_t from[LYNX_MR_COUNT] = {0, g->fctrl_off, tx};
  const uint64_t to[LYNX_MR_COUNT] = {g->fctrl_off, tx, g->region_size};
  /* only the remote access each class needs: a frontend can never write
   * the header, actrl or a TX ring; it reads what it writes (a takeover
   * resumes the RX rings after the requests still published there) */
  const int access[LYNX_MR_COUNT] = {
      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ,
      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ,
  };
  for (int i = 0; i < LYNX_MR_COUNT; i++) {
    if (reg->mem) {
      /* GPU memory: dma-buf or nvidia-peermem (the CUDA backend decides) */
      char why[200] = "";
      void *mr = NULL;
      int rc = reg->mem->reg_mr(reg->mem->ctx, ag->pd, from[i], to[i] - from[i],
                                access[i], &mr, why, sizeof(why));
      if (rc) {
        LYNX_ERR("rdma", "agent: cannot register %s memory: %s", reg->mem->kind,
                 why);
        region_dereg(reg);
        return rc;
      }
      reg->mr[i] = mr;
      continue;
    }
    reg->mr[i] =
        ibv_reg_mr(ag->pd, reg->base + from[i], to[i] - from[i], access[i]);
    if (!reg->mr[i]) {
      int rc = errno_or(-ENOMEM);
      region_dereg(reg);
      return rc;
    }
  }
  return 0;
}

int lynx__rdma_region_export(struct lynx_region *r) {
  struct rdma_agent *ag =
      r->agent ? container_of(r->agent, struct rdma_agent, base) : NULL;
  struct lynx_region_hdr h;
  struct ag_region *reg;
  struct lynx_geom g;
  int rc;
  if ((!r->base && !r->mem) || r->priv ||
      lynx_region_read(r, 0, &h, sizeof(h)) || h.magic != LYNX_REGION_MAGIC ||
      lynx_geom_init(&g, h.n_mqueues, h.slots, h.slot_size, h.large_bytes) ||
      g.region_size > r->size)
    return -EINVAL;
  if (!ag)
    return -ENOTCONN;
  reg = calloc(1, sizeof(*reg));
  if (!reg)
    return -ENOMEM;
  reg->base = r->base;
  reg->mem = r->mem;
  reg->epoch = h.epoch;
  snprintf(reg->fence.name, sizeof(reg->fence.name), "%s",
           r->name[0] ? r->name : r->locator);
  do { /* 0 is no key */
    if (getrandom(&reg->key, sizeof(reg->key), 0) != sizeof(reg->key)) {
      free(reg);
      return -EIO;
    }
  } while (reg->key == 0);
  pthread_mutex_lock(&ag->lock);
  rc = !ag->running ? -ENOTCONN : ag->removed || !ag->pd ? -ENODEV : 0;
  if (!rc)
    rc = region_reg(ag, reg, &g);
  if (!rc) {
    reg->next = ag->regions;
    ag->regions = reg;
  }
  pthread_mutex_unlock(&ag->lock);
  if (rc) {
    LYNX_ERR("rdma", "agent: cannot register a %llu-byte region: %s",
             (unsigned long long)g.region_size, strerror(-rc));
    free(reg);
    return rc;
  }
  r->key = reg->key;
  r->remote_addr = r->mem ? r->mem->dev_addr : (uintptr_t)r->base;
  for (int i = 0; i < LYNX_MR_COUNT; i++)
    r->rkeys[i] = reg->mr[i]->rkey;
  r->priv = reg;
  r->fence = &reg->fence;
  return 0;
}

void lynx__rdma_region_free(struct lynx_region *r) {
  struct ag_region *reg = r->priv;
  if (reg) {
    struct rdma_agent *ag = container_of(r->agent, struct rdma_agent, base);
    struct ag_region **pp = &ag->regions;
    pthread_mutex_lock(&ag->lock);
    while (*pp && *pp != reg)
      pp = &(*pp)->next;
    if (*pp)
      *pp = reg->next;
    /* its frontends first: no QP may outlive the registrations */
    for (struct ag_conn *cn = ag->conns, *nx; cn; cn = nx) {
      nx = cn->next;
      if (cn->reg == reg)
        rdma_destroy_id(conn_drop(ag, cn));
    }
    region_dereg(reg);
    pthread_mutex_unlock(&ag->lock);
    free(reg);
  }
  if (r->mem)
    r->mem->release(r->mem->ctx); /* no registration or QP uses it now */
  else if (r->base)
    lynx_region_unmap_served(r, 1);
  r->base = NULL;
  r->mem = NULL;
  r->priv = NULL;
  r->fence = NULL;
}
