/*
 * dispatcher.c - the Message Dispatcher (Lynx paper §4.2, ingress).
 *
 * Datagrams come in on one of two receive paths (--rx; docs/design.md,
 * "Receive path"): libuv's recvmmsg in batches of up to 20 per call (the
 * socket path, which works everywhere), or an io_uring multishot recvmsg
 * whose completions the worker harvests without a system call (rxring.c).
 * Either way each datagram gets a tag and is written, through the Remote
 * Message Queue Manager, into the RX slot of the mqueue the policy
 * (dispatch.c) picks. The worker rings the touched accelerators' doorbells
 * after the batch. TCP services hand their framed messages to fe_submit
 * the same way (tcpsvc.c).
 *
 * Owns: the UDP socket and its receive path, the dispatch order over the
 * worker's server mqueues (interleaving accelerators, rebuilt when
 * connections come or go), the payload cap, the flow table (--order
 * flow: a flow's requests in flight stay on one mqueue), and the counts of
 * what it received and dropped (struct fe_ingress). It reaches the
 * manager, the tag table, the clock and the stop flag only through what it
 * was given at fe_dispatcher_init.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dispatcher.h"
#include "log.h"

const char *const fe_wdrop_names[FE_WDROP_MAX] = {
    "oversize", "ring_full", "flow_full", "no_mqueue", "tag_full", "shutdown"};

const char *const fe_rx_path_names[FE_RX_MAX] = {"socket", "uring"};

/* ---- request completion ------------------------------------------- */

/* Every way a request ends (answered, dropped, expired, lost) comes here:
 * its flow has one request fewer in flight. */
void fe_flow_done(struct fe_ingress *in, const struct lynx_tag_entry *e) {
  if (in->flows && in->flows[e->flow].outstanding)
    in->flows[e->flow].outstanding--;
}

void fe_request_done(struct fe_ingress *in, struct lynx_tag_entry *e) {
  fe_flow_done(in, e);
  lynx_tag_release(in->opts.tags, e);
}

/* ---- receive --------------------------------------------------------- */

static void on_alloc(uv_handle_t *h, size_t sz, uv_buf_t *buf) {
  struct fe_ingress *in = h->data;
  (void)sz;
  *buf = uv_buf_init(in->rbuf, FE_RECV_CHUNKS * FE_DGRAM_MAX);
}

static int write_request(struct fe_ingress *in, struct fe_mq *mq,
                         const void *data, uint32_t len, uint32_t tag) {
  return fe_write_rx(in->opts.rmq, mq, data, len, tag, LYNX_ST_OK);
}

/* One datagram from a UDP peer, from either receive path: data holds
 * nread bytes, only its first ones if truncated (it was longer than the
 * receive buffer). */
static void on_datagram(struct fe_ingress *in, const void *data, ssize_t nread,
                        const struct sockaddr *addr, int truncated) {
  enum fe_wdrop drop;
  uint32_t flow;
  int rc;
  in->got++;
  lynx_cnt_add(&in->received, 1);
  if (__atomic_load_n(in->opts.stopping, __ATOMIC_RELAXED)) {
    lynx_cnt_add(&in->drops[FE_DROP_SHUTDOWN], 1);
    return;
  }
  if (truncated || (in->cap && (size_t)nread > in->cap)) {
    lynx_cnt_add(&in->drops[FE_DROP_OVERSIZE], 1);
    LYNX_LOG_RL(LYNX_LOG_INFO, "frontend",
                "worker %u: %zd-byte datagram is larger than the %u bytes "
                "the accelerators take (--msg-max), dropped",
                in->opts.worker, nread, in->cap);
    return;
  }
  flow = in->flows ? lynx_flow_hash(addr) & in->flow_mask : 0;
  rc = fe_submit(in, data, (uint32_t)nread, flow, addr, 0, 0, 0, &drop);
  if (rc && drop < FE_WDROP_MAX)
    lynx_cnt_add(&in->drops[drop], 1);
}

/* The socket path: libuv's recvmmsg. */
static void on_recv(uv_udp_t *h, ssize_t nread, const uv_buf_t *buf,
                    const struct sockaddr *addr, unsigned flags) {
  struct fe_ingress *in = h->data;
  /* every recvmmsg call ends with one callback without an address: after
   * its batch, when it found nothing, or with its error */
  if (addr == NULL)
    lynx_cnt_add(&in->rx_calls, 1);
  if (nread < 0) {
    LYNX_LOG_RL(LYNX_LOG_WARN, "frontend", "worker %u: receive error: %s",
                in->opts.worker, uv_strerror((int)nread));
    return;
  }
  /* nread == 0 with an address is an empty datagram, a request like any
   * other; without one it is libuv's end of batch or buffer release */
  if (addr == NULL)
    return;
  on_datagram(in, buf->base, nread, addr, (flags & UV_UDP_PARTIAL) != 0);
}

/* The uring path: a datagram from the ring's buffer (rxring.h). */
static void on_ring_datagram(void *arg, const void *data, size_t len,
                             const struct sockaddr *from, int truncated) {
  on_datagram(arg, data, (ssize_t)len, from, truncated);
}

/* Receives on the socket path: the configured one, or the fallback when
 * a worker's ring cannot be built or keeps failing. 0 or -errno. */
static int rx_socket(struct fe_ingress *in) {
  lynx_rxring_free(&in->rx);
  __atomic_store_n(&in->rx_path, FE_RX_SOCKET, __ATOMIC_RELAXED);
  return uv_udp_recv_start(&in->udp, on_alloc, on_recv);
}

void fe_dispatcher_poll(struct fe_ingress *in) {
  uint64_t enters = in->rx.enters, nobufs = in->rx.nobufs;
  int rc;
  if (!in->udp_open || in->rx_path != FE_RX_URING)
    return;
  /* at most one ring of buffers per pass, as libuv bounds its reads */
  rc = lynx_rxring_poll(&in->rx, LYNX_RXRING_BUFS, on_ring_datagram, in);
  lynx_cnt_add(&in->rx_calls, in->rx.enters - enters);
  lynx_cnt_add(&in->rx_nobufs, in->rx.nobufs - nobufs);
  if (rc >= 0)
    return;
  LYNX_WARN("frontend",
            "service %s worker %u: io_uring receive failed: %s; "
            "receiving through the socket (recvmmsg) from now on",
            in->opts.service, in->opts.worker, strerror(-rc));
  rc = rx_socket(in);
  if (rc)
    LYNX_ERR("frontend", "service %s worker %u: cannot receive: %s",
             in->opts.service, in->opts.worker, uv_strerror(rc));
}

int fe_dispatcher_wait_fd(const struct fe_ingress *in) {
  return in->udp_open && in->rx_path == FE_RX_URING ? lynx_rxring_fd(&in->rx)
                                                    : -1;
}

/* fe_submit found no mqueue (pick's -ENOSPC, -EBUSY or -ENOENT): with
 * hold, room may come (-EAGAIN); otherwise the request is dropped. */
static int pick_failed(const struct fe_ingress *in, int i, int hold,
                       enum fe_wdrop *drop) {
  const char *why;
  if (hold && (i == -ENOSPC || i == -EBUSY))
    return -EAGAIN; /* a stream keeps its order: it waits for room */
  switch (i) {
  case -ENOSPC:
    *drop = FE_DROP_RING_FULL;
    why = "every RX ring is full";
    break;
  case -EBUSY:
    *drop = FE_DROP_FLOW_FULL;
    why = "its flow's RX ring is full (another mqueue would reorder its "
          "answers)";
    break;
  default:
    *drop = FE_DROP_NO_MQUEUE;
    why = "no mqueue in dispatch";
  }
  LYNX_LOG_RL(LYNX_LOG_INFO, "frontend", "worker %u: request dropped: %s",
              in->opts.worker, why);
  return i;
}

int fe_submit(struct fe_ingress *in, const void *data, uint32_t len,
              uint32_t flow, const struct sockaddr *peer, uint32_t cli,
              uint32_t cli_gen, int hold, enum fe_wdrop *drop) {
  struct lynx_tagtab *tags = in->opts.tags;
  struct lynx_flow *fl = in->flows ? &in->flows[flow] : NULL;
  struct fe_mq *mq;
  struct lynx_tag_entry *e;
  uint32_t tag;
  int i, rc;
  *drop = FE_WDROP_MAX;
  i = lynx_dispatch_pick_flow(&in->disp, fl);
  if (i < 0)
    return pick_failed(in, i, hold, drop);
  mq = container_of(in->dqs[i], struct fe_mq, dq);
  e = lynx_tag_alloc(tags, mq->gid, peer, *in->opts.now_ns, &tag);
  if (!e) {
    if (hold)
      return -EAGAIN;
    *drop = FE_DROP_TAG_FULL;
    return -ENOSPC;
  }
  rc = write_request(in, mq, data, len, tag);
  if (rc == -ENOSPC || rc == -EMSGSIZE) {
    /* the mqueue's large area has no room yet (or, between connection
     * changes, is smaller than the cap): a stream waits, a datagram is
     * dropped as on a full ring */
    lynx_tag_release(tags, e);
    if (hold && rc == -ENOSPC)
      return -EAGAIN;
    *drop = rc == -ENOSPC ? FE_DROP_RING_FULL : FE_DROP_OVERSIZE;
    LYNX_LOG_RL(LYNX_LOG_INFO, "frontend",
                "worker %u: %u-byte request "
                "dropped: %s",
                in->opts.worker, len,
                rc == -ENOSPC ? "its mqueue's large-message area is full"
                              : "larger than its mqueue's large-message area");
    return rc;
  }
  if (rc) {
    lynx_tag_release(tags, e);
    lynx_cnt_add(&mq->drops[FE_QDROP_WRITE_ERR], 1);
    /* -ENOBUFS: the transport's queues are full for now (the request is
     * dropped, the connection stays; a fenced request's payload may be
     * posted without its metadata, which is never published) */
    if (rc == -ENOBUFS)
      LYNX_LOG_RL(LYNX_LOG_WARN, "frontend",
                  "worker %u: accelerator %s/%u: "
                  "transport queue full, request dropped",
                  in->opts.worker, mq->conn->acc.node,
                  mq->conn->acc.desc.accel_id);
    else
      fe_rmq_fail(in->opts.rmq, mq->conn, rc);
    return rc; /* *drop: FE_WDROP_MAX, counted on the mqueue */
  }
  e->seq = in->dispatch_seq++;
  e->flow = flow;
  e->cli = cli;
  e->cli_gen = cli_gen;
  if (fl) {
    /* (only when its mqueue left dispatch: a full one refuses) */
    if (fl->outstanding && fl->q != (uint32_t)i)
      lynx_cnt_add(&in->flow_moves, 1);
    fl->q = (uint32_t)i;
    fl->outstanding++;
  }
  mq->dq.rx_prod++;
  fe_mq_outstanding_set(mq, mq->dq.outstanding + 1);
  mq->conn->dirty = 1;
  lynx_cnt_add(&mq->dispatched, 1);
  return 0;
}

/* ---- the dispatch order -------------------------------------------- */

/*
 * Rebuilds what depends on the set of connections: the dispatch order
 * (interleaving accelerators: a0q0, a1q0, a0q1, ... so consecutive requests
 * spread over all of them), the payload cap, and the flow table's mqueue
 * indices. Called with the manager's lock held.
 */
int fe_dispatcher_rebuild(struct fe_ingress *in) {
  const struct fe_rmq *r = in->opts.rmq;
  uint32_t n = 0, k = 0, cap = 0;
  struct lynx_dq **dqs, **old = in->dqs;
  for (uint32_t i = 0; i < r->n_conns; i++) {
    const struct fe_conn *c = r->conns[i];
    n += c->n_mqs - c->n_client_mqs;
    if (!c->removing && c->state != FE_CONN_DEAD &&
        (cap == 0 || lynx_msg_cap(&c->acc.g) < cap))
      cap = lynx_msg_cap(&c->acc.g);
  }
  dqs = calloc(n + 1, sizeof(*dqs));
  if (!dqs)
    return -ENOMEM;
  for (uint32_t round = 0; k < n; round++)
    for (uint32_t i = 0; i < r->n_conns; i++)
      if (round < r->conns[i]->n_mqs && !r->conns[i]->mqs[round].be)
        dqs[k++] = &r->conns[i]->mqs[round].dq;
  /* a flow in flight keeps its mqueue across the rebuild */
  for (uint32_t f = 0; in->flows && f <= in->flow_mask; f++) {
    struct lynx_flow *fl = &in->flows[f];
    uint32_t to = UINT32_MAX;
    if (!fl->outstanding || fl->q >= in->n_mqs || !old)
      continue;
    for (uint32_t j = 0; j < n && to == UINT32_MAX; j++)
      if (dqs[j] == old[fl->q])
        to = j;
    fl->q = to == UINT32_MAX ? 0 : to;
    if (to == UINT32_MAX)
      fl->outstanding = 0; /* its mqueue is gone; its requests counted there */
  }
  in->dqs = dqs;
  in->n_mqs = n;
  in->cap = cap;
  in->disp.q = dqs;
  in->disp.n = n;
  in->disp.cursor = 0;
  free(old);
  return 0;
}

/* ---- set-up --------------------------------------------------------- */

int fe_dispatcher_init(struct fe_ingress *in, const struct fe_ingress_opts *o) {
  memset(in, 0, sizeof(*in));
  in->opts = *o;
  in->rbuf = malloc((size_t)FE_RECV_CHUNKS * FE_DGRAM_MAX);
  if (!in->rbuf)
    return -ENOMEM;
  in->disp.policy = o->policy;
  if (o->flow_order) {
    in->flow_mask = FE_FLOWS - 1;
    in->flows = calloc(FE_FLOWS, sizeof(*in->flows));
    if (!in->flows)
      return -ENOMEM;
  }
  return 0;
}

void fe_dispatcher_free(struct fe_ingress *in) {
  free(in->dqs);
  free(in->rbuf);
  free(in->flows);
  in->dqs = NULL;
  in->rbuf = NULL;
  in->flows = NULL;
}

int fe_dispatcher_open_udp(struct fe_ingress *in) {
  const struct fe_ingress_opts *o = &in->opts;
  int one = 1, fd, rc, sz = (int)o->rcvbuf_kb * 1024;
  socklen_t alen = o->addr->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                  : sizeof(struct sockaddr_in);
  fd = socket(o->addr->ss_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -errno;
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) != 0)
    goto fail;
  /* a deep receive buffer absorbs bursts; FORCE needs CAP_NET_ADMIN */
  if (sz && setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &sz, sizeof(sz)) != 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
  if (sz && setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &sz, sizeof(sz)) != 0)
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
  if (bind(fd, (const struct sockaddr *)o->addr, alen) != 0)
    goto fail;
  /* AF_UNSPEC: libuv creates no socket of its own; we hand it ours */
  rc = uv_udp_init_ex(o->loop, &in->udp, AF_UNSPEC | UV_UDP_RECVMMSG);
  if (rc) {
    close(fd);
    return rc;
  }
  in->udp.data = in;
  in->udp_open = 1;
  rc = uv_udp_open(&in->udp, fd);
  if (rc) {
    close(fd);
    return rc;
  }
  if (!o->rx_uring)
    return rx_socket(in);
  /* the ring is armed by the worker's first fe_dispatcher_poll: the
   * kernel receives on the thread that armed it */
  rc = lynx_rxring_init(&in->rx, fd);
  if (!rc) {
    __atomic_store_n(&in->rx_path, FE_RX_URING, __ATOMIC_RELAXED);
    return 0;
  }
  /* io_uring worked at start (main.c's probe): a running frontend keeps
   * serving, under --rx uring too */
  LYNX_WARN("frontend",
            "service %s worker %u: cannot set up its io_uring "
            "receive ring: %s; receiving through the socket (recvmmsg)",
            o->service, o->worker, strerror(-rc));
  return rx_socket(in);
fail:
  rc = -errno;
  close(fd);
  return rc;
}

void fe_dispatcher_close_udp(struct fe_ingress *in) {
  if (!in->udp_open)
    return;
  /* the ring holds the socket: cancelled and freed before it closes */
  lynx_rxring_free(&in->rx);
  uv_udp_recv_stop(&in->udp);
  uv_close((uv_handle_t *)&in->udp, NULL);
  in->udp_open = 0;
}
