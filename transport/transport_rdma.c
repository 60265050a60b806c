/*
 * transport_rdma.c - the "rdma" backend: rdma-core verbs with librdmacm
 * connection set-up. One RC QP per connect call, i.e. per (frontend
 * worker, accelerator); the frontend writes fctrl and the RX rings with
 * RDMA WRITE and reads the header, actrl and the TX rings with RDMA READ,
 * each through the memory registration of its access class (docs/rdma.md).
 *
 * This file is the frontend's connection: a synchronous connect that
 * drives the state machine of rdma_cm.c with the events of its own event
 * channel (2 s in all), validates the region header it reads over the new
 * QP, and a close that undoes everything. The data path is rdma_dp.c, the
 * agent side rdma_agent.c; the ops table at the end ties them together.
 * They sit below this file and do not name the table: it is handed to
 * them when a connection or an agent handle is created.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "rdma_internal.h"
#include "util.h"

#define CONNECT_MS 2000        /* the whole connect, header read included */
#define RESOLVE_MS 500         /* address and route resolution, each */
#define CM_CHECK_NS 1000000ull /* poll looks at the CM channel every 1 ms */
#define CM_EVENTS_PER_POLL 8   /* bounded: poll is on the data path */
#define INIT_DEPTH_MAX 16      /* RDMA READs in flight per QP */
#define ACK_TIMEOUT 14         /* 4.096 us * 2^14 = 67 ms per retry */
#define RETRY_COUNT 7          /* a dead peer shows in about 0.5 s */
#define RNR_RETRY 7            /* 7 = forever: the agent reposts receives */

static int set_nonblock(int fd) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
    return -errno;
  return 0;
}

/* What the connect loop keeps of an rdma_cm event (acked at once). */
struct cm_ev {
  enum rdma_cm_event_type type;
  int status;
  enum lynx__rdma_reject why;
};

/* Next event of c's channel before deadline: 0, -ETIMEDOUT or -errno. */
static int cm_wait(struct lynx__rdma_conn *c, uint64_t deadline,
                   struct cm_ev *ev) {
  for (;;) {
    struct rdma_cm_event *e;
    struct pollfd p = {c->ch->fd, POLLIN, 0};
    uint64_t now;
    if (rdma_get_cm_event(c->ch, &e) == 0) {
      ev->type = e->event;
      ev->status = e->status;
      ev->why = e->event == RDMA_CM_EVENT_REJECTED
                    ? lynx__rdma_rej_decode(e->param.conn.private_data,
                                            e->param.conn.private_data_len)
                    : LYNX_RDMA_REJ_NONE;
      rdma_ack_cm_event(e);
      return 0;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      return -errno;
    now = lynx_now_ns();
    if (now >= deadline)
      return -ETIMEDOUT;
    if (poll(&p, 1, (int)((deadline - now + 999999) / 1000000)) < 0 &&
        errno != EINTR)
      return -errno;
  }
}

/* Event channel and id, then address resolution: IDLE -> ADDR_RESOLVING. */
static int fe_open(struct lynx__rdma_conn *c,
                   const struct sockaddr_storage *ss) {
  uint8_t tmo = ACK_TIMEOUT;
  int rc;
  c->ch = rdma_create_event_channel();
  if (!c->ch)
    return -errno;
  rc = set_nonblock(c->ch->fd);
  if (rc)
    return rc;
  if (rdma_create_id(c->ch, &c->id, c, RDMA_PS_TCP))
    return -errno;
  /* the default ACK timeout makes a dead peer take many seconds to show;
   * older kernels lack the option, which only costs detection time */
  if (rdma_set_option(c->id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &tmo,
                      sizeof(tmo)))
    LYNX_DBG("rdma", "%s: cannot set the ACK timeout: %s", c->name,
             strerror(errno));
  if (rdma_resolve_addr(c->id, NULL, (struct sockaddr *)ss, RESOLVE_MS))
    return -errno;
  c->cm = LYNX_RCM_ADDR_RESOLVING;
  return 0;
}

/* What wait_fd hands a sleeping worker: one epoll fd over the CQ's
 * completion channel, the CM channel and a self-wake eventfd. Optional: on
 * any failure the connection has none (wait_fd: -ENOTSUP, the worker
 * sleeps on its timer). */
static void wait_setup(struct lynx__rdma_conn *c, struct ibv_context *ctx) {
  struct epoll_event ev = {.events = EPOLLIN};
  c->cc = ibv_create_comp_channel(ctx);
  c->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  c->epfd = epoll_create1(EPOLL_CLOEXEC);
  if (c->cc && c->efd >= 0 && c->epfd >= 0 && set_nonblock(c->cc->fd) == 0 &&
      epoll_ctl(c->epfd, EPOLL_CTL_ADD, c->cc->fd, &ev) == 0 &&
      epoll_ctl(c->epfd, EPOLL_CTL_ADD, c->efd, &ev) == 0 &&
      epoll_ctl(c->epfd, EPOLL_CTL_ADD, c->ch->fd, &ev) == 0)
    return;
  LYNX_DBG("rdma", "%s: no wait fd (%s): the worker polls on a timer", c->name,
           strerror(errno));
  if (c->epfd >= 0)
    close(c->epfd);
  c->epfd = -1;
}

/* PD, CQ, RC QP and the registered staging + bounce buffer on the device
 * the route resolved to; then the data path over them. */
static int fe_setup(struct lynx__rdma_conn *c, uint8_t *init_depth) {
  struct ibv_context *ctx = c->id->verbs;
  struct lynx__rdma_attach a = {0};
  struct ibv_device_attr da;
  struct ibv_qp_init_attr qa;
  uint32_t depth = LYNX_RDMA_SQ_DEPTH;
  size_t stage, bounce;
  int rc;
  rc = ibv_query_device(ctx, &da);
  if (rc)
    return -rc;
  if (da.max_qp_wr > 0 && (uint32_t)da.max_qp_wr < depth)
    depth = (uint32_t)da.max_qp_wr;
  *init_depth =
      (uint8_t)(da.max_qp_init_rd_atom < INIT_DEPTH_MAX ? da.max_qp_init_rd_atom
                                                        : INIT_DEPTH_MAX);
  c->pd = ibv_alloc_pd(ctx);
  if (!c->pd)
    return errno ? -errno : -ENOMEM;
  wait_setup(c, ctx);
  /* every CQE is a signalled WR of this QP: depth is enough */
  c->own_cq = ibv_create_cq(ctx, (int)depth + 2, c, c->cc, 0);
  if (!c->own_cq)
    return errno ? -errno : -ENOMEM;
  memset(&qa, 0, sizeof(qa));
  qa.send_cq = c->own_cq;
  qa.recv_cq = c->own_cq;
  qa.qp_type = IBV_QPT_RC;
  qa.sq_sig_all = 0;
  qa.cap.max_send_wr = depth;
  qa.cap.max_recv_wr = 1; /* never used: some providers refuse 0 */
  qa.cap.max_send_sge = 1;
  qa.cap.max_recv_sge = 1;
  qa.cap.max_inline_data = LYNX_RDMA_INLINE;
  if (rdma_create_qp(c->id, c->pd, &qa)) {
    /* some devices (iWARP, older HCAs) have no inline data */
    qa.cap.max_inline_data = 0;
    if (rdma_create_qp(c->id, c->pd, &qa))
      return -errno;
  }
  lynx__rdma_buf_sizes(&c->g, &stage, &bounce);
  c->buf = aligned_alloc(4096, stage + bounce);
  if (!c->buf)
    return -ENOMEM;
  c->mr = ibv_reg_mr(c->pd, c->buf, stage + bounce, IBV_ACCESS_LOCAL_WRITE);
  if (!c->mr)
    return errno ? -errno : -ENOMEM;
  a.qp = c->id->qp;
  a.cq = c->own_cq;
  a.buf = c->buf;
  a.lkey = c->mr->lkey;
  a.stage_size = stage;
  a.bounce_size = bounce;
  a.sq_depth = depth; /* what the CQ was sized for, even if the QP got more */
  a.max_inline = qa.cap.max_inline_data;
  return lynx__rdma_dp_init(c, &a);
}

static int fe_connect(struct lynx__rdma_conn *c, uint8_t init_depth) {
  uint8_t pd[LYNX_RDMA_PD_LEN];
  struct rdma_conn_param p;
  lynx__rdma_pd_encode(pd, c->base.desc.key, c->base.desc.epoch,
                       c->base.desc.producer);
  memset(&p, 0, sizeof(p));
  p.private_data = pd;
  p.private_data_len = sizeof(pd);
  p.initiator_depth = init_depth ? init_depth : 1;
  p.responder_resources = 0; /* nobody reads the frontend */
  p.retry_count = RETRY_COUNT;
  p.rnr_retry_count = RNR_RETRY;
  return rdma_connect(c->id, &p) ? -errno : 0;
}

/* Runs the state machine until ESTABLISHED, a failure or the deadline. */
static int fe_drive(struct lynx__rdma_conn *c, uint64_t deadline) {
  for (;;) {
    enum lynx__rdma_cm_state was = c->cm;
    struct lynx__rdma_cm_step st;
    uint8_t init_depth = 1;
    struct cm_ev ev = {0};
    int rc = cm_wait(c, deadline, &ev);
    if (rc) {
      LYNX_WARN("rdma", "%s: %s while %s", c->name,
                rc == -ETIMEDOUT ? "timed out" : strerror(-rc),
                lynx__rdma_cm_state_str(c->cm));
      c->cm = LYNX_RCM_FAILED;
      return rc;
    }
    st = lynx__rdma_cm_next(c->cm, ev.type, ev.status);
    c->cm = st.next;
    switch (st.act) {
    case LYNX_RCM_ACT_NONE:
      continue;
    case LYNX_RCM_ACT_READY:
      return 0;
    case LYNX_RCM_ACT_TEARDOWN:
      LYNX_WARN("rdma", "%s: %s (status %d) while %s: %s%s%s", c->name,
                rdma_event_str(ev.type), ev.status,
                lynx__rdma_cm_state_str(was), strerror(-st.err),
                ev.type == RDMA_CM_EVENT_REJECTED ? ": agent says " : "",
                ev.type == RDMA_CM_EVENT_REJECTED ? lynx__rdma_rej_str(ev.why)
                                                  : "");
      return lynx__rdma_rej_errno(ev.why, st.err);
    case LYNX_RCM_ACT_RESOLVE_ROUTE:
      rc = rdma_resolve_route(c->id, RESOLVE_MS) ? -errno : 0;
      break;
    case LYNX_RCM_ACT_CONNECT:
      rc = fe_setup(c, &init_depth);
      if (!rc)
        rc = fe_connect(c, init_depth);
      break;
    }
    if (rc) {
      LYNX_WARN("rdma", "%s: %s failed: %s", c->name,
                st.act == LYNX_RCM_ACT_CONNECT ? "QP set-up or rdma_connect"
                                               : "rdma_resolve_route",
                strerror(-rc));
      c->cm = LYNX_RCM_FAILED;
      return rc;
    }
  }
}

/* Reads the 64-byte header over the new QP (the CTL registration) and
 * checks it against the descriptor before any data access. */
static int fe_check_region(struct lynx__rdma_conn *c, uint64_t deadline) {
  struct lynx_region_hdr h;
  char err[256];
  uint64_t id;
  int rc = lynx__rdma_read(&c->base, 0, &h, sizeof(h), 0);
  if (!rc)
    rc = lynx__rdma_flush(&c->base);
  while (!rc) {
    struct timespec ts = {0, 20000};
    rc = lynx__rdma_poll_cq(c, &id, 1);
    if (rc == 1)
      break;
    if (rc == 0 && lynx_now_ns() >= deadline)
      rc = -ETIMEDOUT;
    else if (rc == 0)
      nanosleep(&ts, NULL);
  }
  if (rc < 0) {
    LYNX_WARN("rdma", "%s: cannot read the region header: %s", c->name,
              strerror(-rc));
    return rc;
  }
  rc = lynx_region_validate(&h, c->base.desc.region_size, &c->base.desc, err,
                            sizeof(err));
  if (rc)
    LYNX_WARN("rdma", "%s: region refused: %s", c->name, err);
  return rc;
}

/* Accepts a half-built connection. */
static void lynx__rdma_close(struct lynx_tconn *tc) {
  struct lynx__rdma_conn *c = container_of(tc, struct lynx__rdma_conn, base);
  if (c->id) {
    if (c->cm == LYNX_RCM_ESTABLISHED || c->cm == LYNX_RCM_CONNECTING)
      rdma_disconnect(c->id);
    if (c->id->qp)
      rdma_destroy_qp(c->id);
  }
  if (c->mr)
    ibv_dereg_mr(c->mr);
  if (c->own_cq)
    ibv_destroy_cq(c->own_cq); /* every CQ event it raised is acked */
  if (c->cc)
    ibv_destroy_comp_channel(c->cc);
  if (c->pd)
    ibv_dealloc_pd(c->pd);
  if (c->epfd >= 0)
    close(c->epfd);
  if (c->efd >= 0)
    close(c->efd);
  if (c->id)
    rdma_destroy_id(c->id); /* every event it had is acked */
  if (c->ch)
    rdma_destroy_event_channel(c->ch);
  free(c->buf);
  lynx__rdma_dp_fini(c);
  free(c);
}

static int lynx__rdma_connect(const struct lynx_region_desc *d,
                              struct lynx_tconn **out) {
  uint64_t deadline = lynx_now_ns() + CONNECT_MS * 1000000ull;
  struct lynx__rdma_conn *c;
  struct sockaddr_storage ss;
  int rc;
  if (lynx_parse_hostport(d->locator, &ss))
    return -EINVAL;
  if (lynx__rdma_device_count() == 0) {
    LYNX_LOG_RL(LYNX_LOG_WARN, "rdma",
                "accel %u at %s: no RDMA device on "
                "this host (ibv_get_device_list returned none)",
                d->accel_id, d->locator);
    return -ENODEV;
  }
  rc = lynx__rdma_conn_new(&lynx_transport_rdma, d, &c);
  if (rc)
    return rc;
  rc = fe_open(c, &ss);
  if (!rc)
    rc = fe_drive(c, deadline);
  if (!rc)
    rc = fe_check_region(c, deadline);
  if (rc) {
    lynx__rdma_close(&c->base);
    return rc;
  }
  LYNX_INFO("rdma",
            "%s: connected (QP %u, %u-entry send queue, %u B "
            "inline)",
            c->name, c->id->qp->qp_num, c->sq_cap, c->max_inline);
  *out = &c->base;
  return 0;
}

/* The CM channel is read on the data path's poll, at most once per
 * CM_CHECK_NS: a disconnect or device removal shows within a millisecond
 * even when no WR is in flight to fail. */
static void cm_check(struct lynx__rdma_conn *c) {
  uint64_t now = lynx_now_ns();
  if (now < c->next_cm_ns)
    return;
  c->next_cm_ns = now + CM_CHECK_NS;
  for (int i = 0; i < CM_EVENTS_PER_POLL && !c->dead; i++) {
    struct rdma_cm_event *e;
    enum rdma_cm_event_type type;
    int status;
    if (rdma_get_cm_event(c->ch, &e))
      return; /* EAGAIN: nothing */
    type = e->event;
    status = e->status;
    rdma_ack_cm_event(e);
    lynx__rdma_conn_cm_event(c, type, status);
  }
}

static int lynx__rdma_poll(struct lynx_tconn *tc, uint64_t *ids, int max) {
  struct lynx__rdma_conn *c = container_of(tc, struct lynx__rdma_conn, base);
  if (c->woken) {
    uint64_t v;
    c->woken = 0;
    if (read(c->efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
      LYNX_DBG("rdma", "%s: eventfd read: %s", c->name, strerror(errno));
  }
  if (c->ch && !c->dead)
    cm_check(c);
  return lynx__rdma_poll_cq(c, ids, max);
}

/* One-sided reads are served by the NIC, not a thread: the two-step path
 * costs no wake-up a compound read would save. */
#define lynx__rdma_read_tx lynx__read_tx_none
#define lynx__rdma_subscribe lynx__subscribe_none
/* completions wake a sleeping worker through the CQ's channel (wait_fd) */
#define lynx__rdma_arm lynx__arm_none

/* Called by a worker about to sleep: acks what the completion channel
 * raised, re-arms the CQ, and reaps once, because a completion that came
 * before the CQ was armed raises no event; if that (or the CM channel)
 * left something for poll, the eventfd makes the fd readable at once. */
static int lynx__rdma_wait_fd(struct lynx_tconn *tc) {
  struct lynx__rdma_conn *c = container_of(tc, struct lynx__rdma_conn, base);
  struct ibv_cq *cq;
  void *ctx;
  if (c->epfd < 0 || c->dead)
    return -ENOTSUP;
  while (ibv_get_cq_event(c->cc, &cq, &ctx) == 0) {
    ibv_ack_cq_events(cq, 1);
    c->armed = 0;
  }
  if (!c->armed) {
    if (ibv_req_notify_cq(c->cq, 0))
      return -ENOTSUP;
    c->armed = 1;
  }
  c->next_cm_ns = 0;
  cm_check(c);
  lynx__rdma_poll_cq(c, NULL, 0); /* reaps; ids stay for poll */
  if (!c->woken && (c->dead || c->done_head != c->done_tail)) {
    uint64_t one = 1;
    if (write(c->efd, &one, sizeof(one)) == sizeof(one))
      c->woken = 1;
  }
  return c->epfd;
}

/* A connection over the caller's QP, CQ and buffer, no CM (the unit
 * test's fake NIC). */
int lynx__rdma_attach(const struct lynx_region_desc *d,
                      const struct lynx__rdma_attach *a,
                      struct lynx_tconn **out) {
  struct lynx__rdma_conn *c;
  int rc = lynx__rdma_conn_new(&lynx_transport_rdma, d, &c);
  if (rc)
    return rc;
  rc = lynx__rdma_dp_init(c, a);
  if (rc) {
    free(c);
    return rc;
  }
  c->cm = LYNX_RCM_ESTABLISHED;
  *out = &c->base;
  return 0;
}

static int lynx__rdma_agent_create(const struct lynx_transport_opts *o,
                                   struct lynx_transport_agent **out, char *err,
                                   size_t errlen) {
  return lynx__rdma_agent_start(&lynx_transport_rdma, o, out, err, errlen);
}

const struct lynx_transport_ops lynx_transport_rdma =
    LYNX_TRANSPORT_OPS("rdma", lynx__rdma);
