/*
 * worker.c - the frontend's data path, one thread per worker.
 *
 * Ingress (Message Dispatcher): libuv receives datagrams in batches
 * (recvmmsg, up to 20 per call); each gets a tag and is written into the RX
 * slot of the mqueue the policy picks, payload and metadata in one posted
 * write. After the batch every touched accelerator gets one flush (the
 * doorbell) and one notify.
 *
 * Egress (Message Forwarder): per accelerator connection, a small state
 * machine: read the accelerator's control array (all its indices in one
 * read), then read the new TX slots of this worker's mqueues, then map each
 * response's tag back to its client and send them with one sendmmsg per 64,
 * then write the TX consumer indices back (lazily: once per cycle). Reads
 * are asynchronous so a remote transport pipelines; shm completes them at
 * once.
 *
 * Polling (docs/design.md): after the last work, spin for spin_us, then
 * sleep in ppoll on libuv's backend fd: with requests outstanding for a
 * short, growing timeout (responses arrive without any fd event), with none
 * until a datagram or timer. --poll busy never sleeps.
 */
#include <errno.h>
#include <sched.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <unistd.h>

#include "frontend.h"
#include "log.h"

#define WR_KIND_SHIFT 60
#define WR_CTRL (1ull << WR_KIND_SHIFT)
#define WR_SLOT (2ull << WR_KIND_SHIFT)
#define WR_FENCE (3ull << WR_KIND_SHIFT)
#define WR_KIND(id) ((id) >> WR_KIND_SHIFT)

#define STAGE_BYTES (256u * 1024u) /* TX staging per mqueue per cycle */
#define MAX_BACKOFF_NS (500u * 1000u)
#define EXPIRE_EVERY_NS (10u * 1000u * 1000u)
#define FE_WAIT_FDS 64 /* remote connections a sleeping worker watches */

const char *const fe_wdrop_names[FE_WDROP_MAX] = {
    "oversize", "ring_full", "no_mqueue", "tag_full", "shutdown"};
const char *const fe_qdrop_names[FE_QDROP_MAX] = {
    "stale_tag", "tx_oversize", "tx_bad_seq", "bad_index", "app_dropped",
    "expired",   "lost",        "write_error", "send_error", "client_gone",
    "backend_down", "in_doubt"};

static const uint8_t zeros[16];

static void run_commands(struct fe_worker *w);
static void reap_removed(struct fe_worker *w);
static void retry_dead(struct fe_worker *w);
static uint32_t conn_outstanding(const struct fe_conn *c);

/* outstanding is written by its worker only and read by the status and
 * metrics threads: relaxed atomic stores, no locked instruction */
static void outstanding_set(struct fe_mq *mq, uint32_t v) {
  __atomic_store_n(&mq->dq.outstanding, v, __ATOMIC_RELAXED);
}

/* ---- request completion ------------------------------------------- */

/* Every way a request ends (answered, dropped, expired, lost) comes here:
 * its flow has one request fewer in flight. */
static void flow_done(struct fe_worker *w, const struct lynx_tag_entry *e) {
  if (w->flows && w->flows[e->flow].outstanding)
    w->flows[e->flow].outstanding--;
}

static void tag_done(struct fe_worker *w, struct lynx_tag_entry *e) {
  flow_done(w, e);
  lynx_tag_release(&w->tags, e);
}

static void on_lost(void *arg, const struct lynx_tag_entry *e) {
  struct fe_worker *w = arg;
  flow_done(w, e);
  if (w->fe->proto == FE_PROTO_TCP)
    fe_tcp_abort(w, e->cli, e->cli_gen);
}

/* ---- connection failure ------------------------------------------- */

#define RETRY_MIN_NS (100u * 1000u * 1000u)
#define RETRY_MAX_NS (5000ull * 1000u * 1000u)

/* Schedules the next attempt to reopen a dead connection (jittered
 * exponential backoff). */
static void retry_later(struct fe_worker *w, struct fe_conn *c) {
  c->retry_ns = lynx_now_ns() + lynx_backoff_next(&c->retry_wait_ns,
                                                  RETRY_MIN_NS, RETRY_MAX_NS,
                                                  &w->retry_seed);
}

/* Takes a connection out of dispatch: its mqueues leave the dispatcher and
 * every request outstanding on them ends, counted as reason: lost when
 * its node was declared down (its agent's lease fence guarantees it never
 * runs later), in doubt when the accelerator may still run it (docs/
 * design.md, "Delivery guarantees"). */
static void conn_down(struct fe_worker *w, struct fe_conn *c, const char *why,
                      enum fe_qdrop reason) {
  if (c->state == FE_CONN_DEAD)
    return;
  LYNX_WARN("frontend", "worker %u: accelerator %s/%u (instance %llu) out "
            "of dispatch: %s", w->id, c->acc.node, c->acc.desc.accel_id,
            (unsigned long long)c->acc.instance_id, why);
  c->state = FE_CONN_DEAD;
  retry_later(w, c);
  for (uint32_t i = 0; i < c->n_mqs; i++) {
    struct fe_mq *mq = &c->mqs[i];
    uint32_t n = lynx_tag_release_mq(&w->tags, mq->gid, on_lost, w);
    mq->dq.up = 0;
    outstanding_set(mq, 0);
    lynx_cnt_add(&mq->drops[reason], n);
  }
  if (c->tc) {
    c->tc->ops->close(c->tc);
    c->tc = NULL;
  }
}

static void conn_fail(struct fe_worker *w, struct fe_conn *c, int rc) {
  char why[96];
  snprintf(why, sizeof(why), "transport error: %s", strerror(-rc));
  conn_down(w, c, why, FE_QDROP_IN_DOUBT);
}

/* ---- egress --------------------------------------------------------- */

static int resp_cmp(const void *a, const void *b) {
  const struct fe_resp *x = a, *y = b;
  return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Sends every gathered response, in dispatch order, 64 per sendmmsg. */
static void flush_sends(struct fe_worker *w) {
  uint32_t base = 0;
  int fd;
  if (!w->n_resp)
    return;
  if (w->n_resp > 1)
    qsort(w->resp, w->n_resp, sizeof(*w->resp), resp_cmp);
  if (w->fe->proto == FE_PROTO_TCP) {
    for (uint32_t i = 0; i < w->n_resp; i++)
      fe_tcp_send(w, &w->resp[i]);
    w->n_resp = 0;
    return;
  }
  if (uv_fileno((uv_handle_t *)&w->udp, &fd) != 0) {
    /* the socket is closed (stopping): these answers cannot go out */
    for (uint32_t i = 0; i < w->n_resp; i++)
      lynx_cnt_add(&w->resp[i].mq->drops[FE_QDROP_SEND_ERR], 1);
    w->n_resp = 0;
    return;
  }
  while (base < w->n_resp) {
    uint32_t n = w->n_resp - base, done = 0;
    if (n > FE_SEND_BATCH)
      n = FE_SEND_BATCH;
    for (uint32_t i = 0; i < n; i++) {
      struct fe_resp *r = &w->resp[base + i];
      struct msghdr *h = &w->out[i].msg_hdr;
      w->out_iov[i].iov_base = (void *)r->data;
      w->out_iov[i].iov_len = r->len;
      memset(h, 0, sizeof(*h));
      h->msg_name = &r->addr;
      h->msg_namelen = r->addr.sa.sa_family == AF_INET6 ? sizeof(r->addr.v6)
                                                        : sizeof(r->addr.v4);
      h->msg_iov = &w->out_iov[i];
      h->msg_iovlen = 1;
    }
    while (done < n) {
      int k = sendmmsg(fd, w->out + done, n - done, MSG_DONTWAIT);
      if (k > 0) {
        for (uint32_t i = done; i < done + (uint32_t)k; i++)
          lynx_cnt_add(&w->resp[base + i].mq->responded, 1);
        done += (uint32_t)k;
        continue;
      }
      if (k < 0 && errno == EINTR)
        continue;
      /* the first of the rest failed: count it, go on with the others */
      LYNX_LOG_RL(LYNX_LOG_WARN, "frontend", "worker %u: send failed: %s",
                  w->id, strerror(errno));
      lynx_cnt_add(&w->resp[base + done].mq->drops[FE_QDROP_SEND_ERR], 1);
      done++;
    }
    base += n;
  }
  w->n_resp = 0;
}

static void queue_send(struct fe_worker *w, struct fe_mq *mq,
                       const struct lynx_tag_entry *e, const uint8_t *data,
                       uint32_t len) {
  struct fe_resp *r = &w->resp[w->n_resp++];
  r->seq = e->seq;
  r->addr = e->peer;
  r->cli = e->cli;
  r->cli_gen = e->cli_gen;
  r->data = data;
  r->len = len;
  r->mq = mq;
}

/* An index from the accelerator that breaks the ring rules: counted once
 * per distinct bad value (it is seen again at every poll), logged. */
static void bad_index(struct fe_mq *mq, const char *which, uint32_t v) {
  if (mq->bad_value == v + 1)
    return;
  mq->bad_value = v + 1;
  lynx_cnt_add(&mq->drops[FE_QDROP_BAD_INDEX], 1);
  LYNX_LOG_RL(LYNX_LOG_WARN, "frontend",
              "accelerator %s/%u mqueue %u: %s %u out of range (rx %u..%u, "
              "tx_cons %u), ignored",
              mq->conn->acc.node, mq->conn->acc.desc.accel_id, mq->q, which,
              v, mq->dq.rx_cons, mq->dq.rx_prod, mq->tx_cons);
}

/* The actrl array arrived: refresh flow control, post reads of new TX
 * slots. */
static int conn_on_ctrl(struct fe_worker *w, struct fe_conn *c) {
  const struct lynx_geom *g = &c->acc.g;
  struct lynx_tconn *tc = c->tc;
  int rc;
  for (uint32_t i = 0; i < c->n_mqs; i++) {
    struct fe_mq *mq = &c->mqs[i];
    struct lynx_actrl a = c->snap[mq->q];
    uint32_t avail, n, first, n1;
    uint64_t ring = lynx_tx_ring_off(g, mq->q);
    /* rx_cons may only move forward within what we produced; a bad value
     * is ignored (flow control keeps the last good one) */
    if (a.rx_cons - mq->dq.rx_cons <= mq->dq.rx_prod - mq->dq.rx_cons)
      mq->dq.rx_cons = a.rx_cons;
    else
      bad_index(mq, "rx_cons", a.rx_cons);
    avail = a.tx_prod - mq->tx_cons;
    if (avail == 0)
      continue;
    if (avail > g->slots) {
      bad_index(mq, "tx_prod", a.tx_prod);
      continue;
    }
    n = avail < mq->stage_slots ? avail : mq->stage_slots;
    first = mq->tx_cons & (g->slots - 1);
    n1 = g->slots - first < n ? g->slots - first : n;
    /* -ENOBUFS: the transport has no room for more reads in flight; what
     * was not posted is read next cycle */
    rc = tc->ops->read(tc, ring + (uint64_t)first * g->slot_size, mq->stage,
                       (size_t)n1 * g->slot_size, WR_SLOT | i);
    if (rc == -ENOBUFS)
      break;
    if (rc)
      return rc;
    c->reads_pending++;
    mq->tx_staged = n1;
    if (n > n1) {
      rc = tc->ops->read(tc, ring, mq->stage + (size_t)n1 * g->slot_size,
                         (size_t)(n - n1) * g->slot_size, WR_SLOT | i);
      if (rc == -ENOBUFS)
        break;
      if (rc)
        return rc;
      c->reads_pending++;
      mq->tx_staged = n;
    }
  }
  c->state = c->reads_pending ? FE_CONN_SLOTS : FE_CONN_IDLE;
  rc = c->reads_pending ? tc->ops->flush(tc) : 0;
  c->flush_again = rc == -ENOBUFS; /* the reads are posted: rung next cycle */
  return rc == -ENOBUFS ? 0 : rc;
}

/* One staged response slot. Returns 0 when consumed, -EAGAIN when the slot
 * is not published yet (retry next cycle from here). */
static int forward_slot(struct fe_worker *w, struct fe_mq *mq,
                        const uint8_t *slot, uint32_t pos) {
  uint32_t z = mq->conn->acc.g.slot_size;
  struct lynx_slot_meta m;
  struct lynx_tag_entry *e;
  memcpy(&m, slot + z - LYNX_META_SIZE, sizeof(m));
  if (mq->be && m.seq == lynx_seq_for(pos)) {
    /* a client mqueue: the application's request to its back end */
    if (lynx_meta_check(&m, z) != 0) {
      lynx_cnt_add(&mq->drops[FE_QDROP_TX_OVERSIZE], 1);
      return 0;
    }
    return fe_backend_request(w, mq, slot + (uint32_t)m.off16 * 16u, m.len,
                              m.tag);
  }
  if (m.seq != lynx_seq_for(pos)) {
    /* tx_prod ran ahead of the slot: an accelerator bug; counted once per
     * position, retried at every cycle */
    if (mq->bad_seq_pos != pos + 1) {
      mq->bad_seq_pos = pos + 1;
      lynx_cnt_add(&mq->drops[FE_QDROP_TX_SEQ], 1);
      LYNX_LOG_RL(LYNX_LOG_WARN, "frontend",
                  "mqueue %s/%u/%u: TX slot %u announced but not published "
                  "(seq %u)",
                  mq->conn->acc.node, mq->conn->acc.desc.accel_id, mq->q,
                  pos, m.seq);
    }
    return -EAGAIN;
  }
  e = lynx_tag_lookup(&w->tags, m.tag, mq->gid);
  if (!e) {
    lynx_cnt_add(&mq->drops[FE_QDROP_STALE_TAG], 1);
    LYNX_LOG_RL(LYNX_LOG_WARN, "frontend",
                "mqueue %s/%u/%u: response with unknown or stale tag 0x%08x "
                "discarded",
                mq->conn->acc.node, mq->conn->acc.desc.accel_id, mq->q,
                m.tag);
    return 0;
  }
  outstanding_set(mq, mq->dq.outstanding - 1);
  if (m.status == LYNX_ST_DROPPED) {
    lynx_cnt_add(&mq->drops[FE_QDROP_APP], 1);
  } else if (lynx_meta_check(&m, z) != 0) {
    lynx_cnt_add(&mq->drops[FE_QDROP_TX_OVERSIZE], 1);
    LYNX_LOG_RL(LYNX_LOG_WARN, "frontend",
                "mqueue %s/%u/%u: response of %u bytes at %u does not fit a "
                "%u-byte slot, dropped",
                mq->conn->acc.node, mq->conn->acc.desc.accel_id, mq->q,
                m.len, m.off16 * 16u, z);
  } else {
    queue_send(w, mq, e, slot + (uint32_t)m.off16 * 16u, m.len);
  }
  tag_done(w, e);
  return 0;
}

/* All slot reads are in: forward, then write TX consumer indices back. */
static int conn_on_slots(struct fe_worker *w, struct fe_conn *c) {
  const struct lynx_geom *g = &c->acc.g;
  uint32_t sent = 0;
  int rc;
  for (uint32_t i = 0; i < c->n_mqs; i++) {
    struct fe_mq *mq = &c->mqs[i];
    for (uint32_t k = 0; k < mq->tx_staged; k++) {
      if (forward_slot(w, mq, mq->stage + (size_t)k * g->slot_size,
                       mq->tx_cons) != 0)
        break;
      mq->tx_cons++;
      mq->tx_cons_dirty = 1;
      sent++;
    }
    mq->tx_staged = 0;
  }
  /* The payloads stay in the staging buffers, which are only read into
   * again at this connection's next cycle, after the worker has sent. */
  for (uint32_t i = 0; i < c->n_mqs; i++) {
    struct fe_mq *mq = &c->mqs[i];
    struct iovec iov = {&mq->tx_cons, 4};
    if (!mq->tx_cons_dirty)
      continue;
    rc = c->tc->ops->writev(c->tc, lynx_fctrl_off(g, mq->q), &iov, 1,
                            LYNX_WR_PUBLISH);
    if (rc == -ENOBUFS)
      break; /* the transport is full: written back next cycle */
    if (rc)
      return rc;
    mq->tx_cons_dirty = 0;
  }
  c->state = FE_CONN_IDLE;
  if (sent) {
    rc = c->tc->ops->flush(c->tc);
    c->flush_again = rc == -ENOBUFS;
    if (rc && rc != -ENOBUFS)
      return rc;
  }
  return (int)sent;
}

/* Advances one connection's forwarder; returns responses handled (>= 0). */
static int conn_progress(struct fe_worker *w, struct fe_conn *c) {
  struct lynx_tconn *tc = c->tc;
  uint64_t ids[32];
  int rc, work = 0;
  if (c->state == FE_CONN_DEAD)
    return 0;
  if (c->flush_again) { /* an earlier doorbell found the transport full */
    rc = tc->ops->flush(tc);
    c->flush_again = rc == -ENOBUFS;
    if (rc && rc != -ENOBUFS)
      goto fail;
  }
  if (c->state == FE_CONN_IDLE) {
    /* Responses come only for requests in flight: with none, polling the
     * control array would only cost the agent (tcp) or the NIC (rdma). Its
     * rx_cons is read again with the next request's first cycle. */
    if (conn_outstanding(c) == 0 && !c->n_client_mqs)
      return 0;
    rc = tc->ops->read(tc, c->acc.g.actrl_off, c->snap,
                       8u * c->acc.g.n_mqueues, WR_CTRL);
    if (rc == -ENOBUFS) {
      rc = 0; /* no room: polled again next cycle */
    } else if (!rc) {
      c->state = FE_CONN_CTRL;
      rc = tc->ops->flush(tc);
      c->flush_again = rc == -ENOBUFS; /* posted; rung next cycle */
      if (rc == -ENOBUFS)
        rc = 0;
    }
    if (rc)
      goto fail;
  }
  /* ctrl completion posts slot reads, whose completions may already be
   * there: a few rounds, bounded */
  for (int round = 0; round < 4; round++) {
    int n = tc->ops->poll(tc, ids, (int)LYNX_ARRAY_SIZE(ids));
    if (n < 0) {
      rc = n;
      goto fail;
    }
    if (n == 0)
      break;
    for (int i = 0; i < n; i++) {
      switch (WR_KIND(ids[i])) {
      case 1: /* WR_CTRL */
        rc = conn_on_ctrl(w, c);
        if (rc)
          goto fail;
        break;
      case 2: /* WR_SLOT */
        if (c->reads_pending)
          c->reads_pending--;
        break;
      default: /* fence reads carry no data we use */
        break;
      }
    }
    if (c->state == FE_CONN_SLOTS && c->reads_pending == 0) {
      rc = conn_on_slots(w, c);
      if (rc < 0)
        goto fail;
      work += rc;
    }
  }
  return work;
fail:
  conn_fail(w, c, rc);
  return work;
}

/* ---- ingress -------------------------------------------------------- */

static void on_alloc(uv_handle_t *h, size_t sz, uv_buf_t *buf) {
  struct fe_worker *w = h->data;
  (void)sz;
  *buf = uv_buf_init(w->rbuf, FE_RECV_CHUNKS * FE_DGRAM_MAX);
}

static int write_request(struct fe_worker *w, struct fe_mq *mq,
                         const void *data, uint32_t len, uint32_t tag) {
  return fe_write_rx(w, mq, data, len, tag, LYNX_ST_OK);
}

int fe_write_rx(struct fe_worker *w, struct fe_mq *mq, const void *data,
                uint32_t len, uint32_t tag, uint16_t status) {
  struct fe_conn *c = mq->conn;
  const struct lynx_geom *g = &c->acc.g;
  uint32_t pos = mq->dq.rx_prod;
  uint32_t poff = lynx_payload_off(g->slot_size, len);
  uint64_t slot = lynx_slot_off(g, lynx_rx_ring_off(g, mq->q), pos);
  struct lynx_slot_meta m = {len, tag, status, (uint16_t)(poff / 16u),
                             lynx_seq_for(pos)};
  struct iovec iov[3] = {{(void *)data, len},
                         {(void *)zeros, lynx_slot_cap(g->slot_size) - poff - len},
                         {&m, sizeof(m)}};
  struct lynx_tconn *tc = c->tc;
  int rc;
  if (c->acc.desc.ordering == LYNX_ORDER_COALESCED)
    return tc->ops->writev(tc, slot + poff, iov, 3, LYNX_WR_PUBLISH);
  /* fenced: payload, a read as write barrier, then the metadata */
  rc = tc->ops->writev(tc, slot + poff, iov, 2, 0);
  if (!rc)
    /* any read of the region flushes the posted payload ahead of it; the
     * mqueue's actrl word is readable under every transport's access rules
     * (rdma registers the RX rings write-only) */
    rc = tc->ops->read(tc, lynx_actrl_off(g, mq->q), w->fence_scratch, 4,
                       WR_FENCE);
  if (!rc)
    rc = tc->ops->writev(tc, slot + g->slot_size - LYNX_META_SIZE, &iov[2], 1,
                         LYNX_WR_PUBLISH | LYNX_WR_FENCE);
  return rc;
}

static void on_recv(uv_udp_t *h, ssize_t nread, const uv_buf_t *buf,
                    const struct sockaddr *addr, unsigned flags) {
  struct fe_worker *w = h->data;
  uint32_t flow;
  int rc;
  if (nread < 0) {
    LYNX_LOG_RL(LYNX_LOG_WARN, "frontend", "worker %u: receive error: %s",
                w->id, uv_strerror((int)nread));
    return;
  }
  /* nread == 0 with an address is an empty datagram, a request like any
   * other; without one it is libuv's end of batch or buffer release */
  if (addr == NULL)
    return;
  w->got++;
  lynx_cnt_add(&w->received, 1);
  if (__atomic_load_n(&w->fe->stopping, __ATOMIC_RELAXED)) {
    lynx_cnt_add(&w->drops[FE_DROP_SHUTDOWN], 1);
    return;
  }
  if ((flags & UV_UDP_PARTIAL) || (w->cap && (size_t)nread > w->cap)) {
    lynx_cnt_add(&w->drops[FE_DROP_OVERSIZE], 1);
    LYNX_LOG_RL(LYNX_LOG_INFO, "frontend",
                "worker %u: %zd-byte datagram is larger than a slot's %u-byte "
                "payload, dropped",
                w->id, nread, w->cap);
    return;
  }
  flow = w->flows ? lynx_flow_hash(addr) & w->flow_mask : 0;
  rc = fe_submit(w, buf->base, (uint32_t)nread, flow, addr, 0, 0, 0);
  if (rc > 0 && rc < FE_WDROP_MAX)
    lynx_cnt_add(&w->drops[rc], 1);
}

int fe_submit(struct fe_worker *w, const void *data, uint32_t len,
              uint32_t flow, const struct sockaddr *peer, uint32_t cli,
              uint32_t cli_gen, int hold) {
  struct lynx_flow *fl = w->flows ? &w->flows[flow] : NULL;
  struct fe_mq *mq;
  struct lynx_tag_entry *e;
  uint32_t tag;
  int i, rc;
  if (hold && fl && fl->outstanding) {
    /* a stream keeps its order: it waits for room on its mqueue rather
     * than moving */
    const struct lynx_dq *q = fl->q < w->disp.n ? w->disp.q[fl->q] : NULL;
    if (q && q->up && q->rx_prod - q->rx_cons >= q->slots)
      return -EAGAIN;
  }
  i = lynx_dispatch_pick_flow(&w->disp, fl);
  if (i < 0) {
    if (i == -ENOSPC && hold)
      return -EAGAIN;
    LYNX_LOG_RL(LYNX_LOG_INFO, "frontend", "worker %u: request dropped: %s",
                w->id, i == -ENOSPC ? "every RX ring is full"
                                    : "no mqueue in dispatch");
    return i == -ENOSPC ? FE_DROP_RING_FULL : FE_DROP_NO_MQUEUE;
  }
  mq = container_of(w->dqs[i], struct fe_mq, dq);
  e = lynx_tag_alloc(&w->tags, mq->gid, peer, w->now_ns, &tag);
  if (!e)
    return hold ? -EAGAIN : FE_DROP_TAG_FULL;
  rc = write_request(w, mq, data, len, tag);
  if (rc) {
    lynx_tag_release(&w->tags, e);
    lynx_cnt_add(&mq->drops[FE_QDROP_WRITE_ERR], 1);
    /* -ENOBUFS: the transport's queues are full for now (the request is
     * dropped, the connection stays; a fenced request's payload may be
     * posted without its metadata, which is never published) */
    if (rc == -ENOBUFS)
      LYNX_LOG_RL(LYNX_LOG_WARN, "frontend", "worker %u: accelerator %s/%u: "
                  "transport queue full, request dropped", w->id,
                  mq->conn->acc.node, mq->conn->acc.desc.accel_id);
    else
      conn_fail(w, mq->conn, rc);
    return FE_WDROP_MAX; /* counted on the mqueue */
  }
  e->seq = w->dispatch_seq++;
  e->flow = flow;
  e->cli = cli;
  e->cli_gen = cli_gen;
  if (fl) {
    if (fl->outstanding && fl->q != (uint32_t)i)
      lynx_cnt_add(&w->flow_moves, 1);
    fl->q = (uint32_t)i;
    fl->outstanding++;
  }
  mq->dq.rx_prod++;
  outstanding_set(mq, mq->dq.outstanding + 1);
  mq->conn->dirty = 1;
  lynx_cnt_add(&mq->dispatched, 1);
  return 0;
}

/* ---- loop ----------------------------------------------------------- */

static void on_expire(void *arg, const struct lynx_tag_entry *e) {
  struct fe_worker *w = arg;
  struct fe_mq *mq = NULL;
  for (uint32_t i = 0; i < w->n_conns && !mq; i++)
    for (uint32_t k = 0; k < w->conns[i]->n_mqs && !mq; k++)
      if (w->conns[i]->mqs[k].gid == e->mq)
        mq = &w->conns[i]->mqs[k];
  flow_done(w, e);
  if (w->fe->proto == FE_PROTO_TCP)
    fe_tcp_abort(w, e->cli, e->cli_gen);
  if (!mq)
    return;
  outstanding_set(mq, mq->dq.outstanding - 1);
  lynx_cnt_add(&mq->drops[FE_QDROP_EXPIRED], 1);
}

static uint32_t outstanding(const struct fe_worker *w) {
  return w->tags.in_use;
}

static void ring_doorbells(struct fe_worker *w) {
  for (uint32_t i = 0; i < w->n_conns; i++) {
    struct fe_conn *c = w->conns[i];
    int rc;
    if (!c->dirty || c->state == FE_CONN_DEAD)
      continue;
    rc = c->tc->ops->flush(c->tc);
    if (rc == -ENOBUFS)
      continue; /* rung again next iteration */
    c->dirty = 0;
    if (!rc) {
      rc = c->tc->ops->notify(c->tc);
      if (rc == -ENOTSUP || rc == -ENOBUFS)
        rc = 0;
    }
    if (rc)
      conn_fail(w, c, rc);
  }
}

static void on_wake(uv_async_t *a) { (void)a; }

static void udp_close(struct fe_worker *w) {
  if (!w->udp_open)
    return;
  uv_udp_recv_stop(&w->udp);
  uv_close((uv_handle_t *)&w->udp, NULL);
  w->udp_open = 0;
}

/* ---- the service's socket ----------------------------------------------- */

static int open_udp(struct fe_worker *w);

#define LISTEN_RETRY_MIN_NS (1000ull * 1000000ull)
#define LISTEN_RETRY_MAX_NS (30000ull * 1000000ull)

static int open_listener(struct fe_worker *w) {
  return w->fe->proto == FE_PROTO_TCP ? fe_tcp_open(w) : open_udp(w);
}

/* A socket error that another process or the host's configuration causes,
 * and that may go away: the worker keeps trying. */
static int bind_error(int rc) {
  return rc == -EADDRINUSE || rc == -EACCES || rc == -EADDRNOTAVAIL ||
         rc == -EPERM;
}

void fe_listen_error_str(const struct frontend *fe, int err, char *buf,
                         size_t len) {
  char addr[80];
  lynx_fmt_addr((const struct sockaddr *)&fe->udp_addr, addr, sizeof(addr));
  snprintf(buf, len, "cannot bind %s %s: %s",
           fe->proto == FE_PROTO_TCP ? "TCP" : "UDP", addr, strerror(err));
}

int fe_listen_error(const struct frontend *fe) {
  for (uint32_t i = 0; fe->w && i < fe->n_w; i++) {
    int e = __atomic_load_n(&fe->w[i].listen_err, __ATOMIC_RELAXED);
    if (e)
      return e;
  }
  return 0;
}

/* Opens (or tries again to open) the service's socket. A port that is
 * taken is no reason to give up the service: its accelerators are
 * connected meanwhile, the coordinator hears why clients get no answer,
 * and it serves as soon as the port is free. 0, or the error of anything
 * else. */
static int listen_try(struct fe_worker *w) {
  struct frontend *fe = w->fe;
  char why[160];
  int rc = open_listener(w), was = w->listen_err;
  if (!rc) {
    __atomic_store_n(&w->listen_err, 0, __ATOMIC_RELAXED);
    w->listen_wait_ns = 0;
    if (was && w->id == 0) {
      fe_listen_error_str(fe, was, why, sizeof(why));
      LYNX_INFO("frontend", "service %s: listening now (the port was taken: "
                "%s)", fe->service, why);
    }
    return 0;
  }
  if (!bind_error(rc))
    return rc;
  __atomic_store_n(&w->listen_err, -rc, __ATOMIC_RELAXED);
  w->listen_retry_ns = lynx_now_ns() +
                       lynx_backoff_next(&w->listen_wait_ns, LISTEN_RETRY_MIN_NS,
                                         LISTEN_RETRY_MAX_NS, &w->retry_seed);
  if (w->id == 0) {
    fe_listen_error_str(fe, -rc, why, sizeof(why));
    if (!was)
      LYNX_WARN("frontend", "service %s: %s; clients get no answer until it "
                "is free (retrying every 1 s to 30 s)", fe->service, why);
    else
      LYNX_LOG_RL(LYNX_LOG_INFO, "frontend", "service %s: still %s",
                  fe->service, why);
  }
  return 0;
}

static void worker_loop(struct fe_worker *w) {
  struct frontend *fe = w->fe;
  uint64_t last_work, next_expire, backoff = 0;
  uint64_t spin_ns = (uint64_t)fe->cfg->spin_us * 1000u;
  uint64_t timeout_ns = (uint64_t)fe->cfg->timeout_ms * 1000000u;
  int busy = fe->cfg->poll == 1, stopping = 0;
  int bfd = uv_backend_fd(&w->loop);
  /* scan the tag table once per quarter timeout, a slice every 10 ms: an
   * expired request is found at most timeout/4 late, and an idle-but-busy
   * table costs little */
  uint64_t slices = timeout_ns / 4 / EXPIRE_EVERY_NS;
  uint32_t expire_budget =
      slices ? (uint32_t)((w->tags.size + slices - 1) / slices) : w->tags.size;
  if (expire_budget < 64)
    expire_budget = 64;

  w->now_ns = last_work = lynx_now_ns();
  next_expire = w->now_ns + EXPIRE_EVERY_NS;
  for (;;) {
    int work;
    w->got = 0;
    w->now_ns = lynx_now_ns();
    if (__atomic_load_n(&w->cmds_pending, __ATOMIC_ACQUIRE))
      run_commands(w);
    uv_run(&w->loop, UV_RUN_NOWAIT);
    ring_doorbells(w);
    work = (int)w->got;
    for (uint32_t i = 0; i < w->n_conns; i++)
      work += conn_progress(w, w->conns[i]);
    flush_sends(w);
    if (w->paused)
      work += fe_tcp_resume(w);
    if (w->n_client_mqs)
      work += fe_backend_progress(w);
    w->now_ns = lynx_now_ns();
    if (w->now_ns >= next_expire) {
      next_expire = w->now_ns + EXPIRE_EVERY_NS;
      reap_removed(w);
      retry_dead(w);
      if (w->listen_err && !stopping && w->now_ns >= w->listen_retry_ns)
        listen_try(w);
      if (w->tags.in_use && w->now_ns > timeout_ns)
        lynx_tag_expire(&w->tags, w->now_ns - timeout_ns, expire_budget,
                        on_expire, w);
    }
    if (!stopping && __atomic_load_n(&fe->stopping, __ATOMIC_ACQUIRE)) {
      stopping = 1;
      udp_close(w); /* stop receiving; answer what is in flight */
      fe_tcp_stop_accepting(w);
    }
    if (stopping &&
        (outstanding(w) == 0 || w->now_ns >= fe->stop_deadline_ns))
      break;
    if (work) {
      last_work = w->now_ns;
      backoff = 0;
      continue;
    }
    if (busy || w->now_ns - last_work < spin_ns) {
      if (!busy) sched_yield(); else lynx_cpu_relax();
      continue;
    }
    {
      struct pollfd pfd[1 + FE_WAIT_FDS];
      nfds_t nfd = 1;
      struct timespec ts;
      uint64_t ns;
      pfd[0] = (struct pollfd){bfd, POLLIN, 0};
      if (outstanding(w) || w->n_client_mqs) {
        /* responses over a remote transport wake us through its fd */
        for (uint32_t i = 0; i < w->n_conns && nfd <= FE_WAIT_FDS; i++) {
          struct fe_conn *c = w->conns[i];
          int fd;
          if (c->state == FE_CONN_DEAD || c->state == FE_CONN_IDLE)
            continue;
          fd = c->tc->ops->wait_fd(c->tc);
          if (fd >= 0)
            pfd[nfd++] = (struct pollfd){fd, POLLIN, 0};
        }
        backoff = backoff ? backoff * 2 : 2000;
        if (backoff > MAX_BACKOFF_NS)
          backoff = MAX_BACKOFF_NS;
        ns = backoff;
      } else {
        int ms = uv_backend_timeout(&w->loop);
        ns = (ms < 0 || ms > 100) ? 100000000ull : (uint64_t)ms * 1000000u;
      }
      ts.tv_sec = (time_t)(ns / 1000000000u);
      ts.tv_nsec = (long)(ns % 1000000000u);
      ppoll(pfd, nfd, &ts, NULL);
    }
  }
  /* Whatever is still outstanding is lost to its clients, though its
   * accelerator may still run it: in doubt. */
  for (uint32_t i = 0; i < w->n_conns; i++)
    for (uint32_t k = 0; k < w->conns[i]->n_mqs; k++) {
      struct fe_mq *mq = &w->conns[i]->mqs[k];
      uint32_t n = lynx_tag_release_mq(&w->tags, mq->gid, on_lost, w);
      if (n) {
        lynx_cnt_add(&mq->drops[FE_QDROP_IN_DOUBT], n);
        LYNX_WARN("frontend", "worker %u: %u requests on mqueue %u unanswered "
                  "at the shutdown deadline", w->id, n, mq->gid);
      }
    }
}

static void *worker_main(void *arg) {
  struct fe_worker *w = arg;
  prctl(PR_SET_TIMERSLACK, 1000UL);
  worker_loop(w);
  udp_close(w);
  fe_tcp_close_all(w);
  /* back-end connections are handles of this loop: closed before it ends */
  for (uint32_t i = 0; i < w->n_conns; i++)
    for (uint32_t k = 0; k < w->conns[i]->n_mqs; k++)
      if (w->conns[i]->mqs[k].be) {
        fe_backend_close(w->conns[i]->mqs[k].be);
        w->conns[i]->mqs[k].be = NULL;
      }
  uv_close((uv_handle_t *)&w->wake, NULL);
  uv_run(&w->loop, UV_RUN_DEFAULT);
  if (uv_loop_close(&w->loop) != 0)
    LYNX_WARN("frontend", "worker %u: loop closed with handles open", w->id);
  return NULL;
}

/* ---- set-up --------------------------------------------------------- */

static int open_udp(struct fe_worker *w) {
  struct frontend *fe = w->fe;
  int one = 1, fd, rc, sz = (int)fe->cfg->rcvbuf_kb * 1024;
  socklen_t alen = fe->udp_addr.ss_family == AF_INET6
                       ? sizeof(struct sockaddr_in6)
                       : sizeof(struct sockaddr_in);
  fd = socket(fe->udp_addr.ss_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
              0);
  if (fd < 0)
    return -errno;
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) != 0)
    goto fail;
  /* a deep receive buffer absorbs bursts; FORCE needs CAP_NET_ADMIN */
  if (sz && setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &sz, sizeof(sz)) != 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
  if (sz && setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &sz, sizeof(sz)) != 0)
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
  if (bind(fd, (struct sockaddr *)&fe->udp_addr, alen) != 0)
    goto fail;
  /* AF_UNSPEC: libuv creates no socket of its own; we hand it ours */
  rc = uv_udp_init_ex(&w->loop, &w->udp, AF_UNSPEC | UV_UDP_RECVMMSG);
  if (rc) {
    close(fd);
    return rc;
  }
  w->udp.data = w;
  w->udp_open = 1;
  rc = uv_udp_open(&w->udp, fd);
  if (rc) {
    close(fd);
    return rc;
  }
  return uv_udp_recv_start(&w->udp, on_alloc, on_recv);
fail:
  rc = -errno;
  close(fd);
  return rc;
}

/* ---- connections come and go (worker thread) ------------------------ */

/* Reads the accelerator's indices synchronously (when a connection is
 * added; shm answers at once, a remote transport within the deadline). */
static int conn_resume(struct fe_conn *c) {
  struct lynx_tconn *tc = c->tc;
  uint64_t id;
  uint64_t deadline = lynx_now_ns() + 2000000000ull;
  int rc = tc->ops->read(tc, c->acc.g.actrl_off, c->snap,
                         8u * c->acc.g.n_mqueues, WR_CTRL);
  if (!rc)
    rc = tc->ops->flush(tc);
  while (!rc) {
    rc = tc->ops->poll(tc, &id, 1);
    if (rc == 1)
      return 0;
    if (rc == 0 && lynx_now_ns() > deadline)
      rc = -ETIMEDOUT;
  }
  return rc;
}

static void conn_free(struct fe_conn *c) {
  if (c->tc)
    c->tc->ops->close(c->tc);
  for (uint32_t i = 0; c->mqs && i < c->n_mqs; i++) {
    free(c->mqs[i].stage);
    if (c->mqs[i].be)
      fe_backend_close(c->mqs[i].be);
  }
  free(c->mqs);
  free(c->snap);
  free(c);
}

/*
 * Rebuilds what depends on the set of connections: the dispatch order
 * (interleaving accelerators: a0q0, a1q0, a0q1, ... so consecutive requests
 * spread over all of them), the payload cap, the response batch size, and
 * the flow table's mqueue indices. Called with w->lock held.
 */
static int rebuild(struct fe_worker *w) {
  uint32_t n = 0, k = 0, cap = 0, max_resp = 0;
  struct lynx_dq **dqs, **old = w->dqs;
  for (uint32_t i = 0; i < w->n_conns; i++) {
    struct fe_conn *c = w->conns[i];
    n += c->n_mqs - c->n_client_mqs;
    for (uint32_t q = 0; q < c->n_mqs; q++)
      max_resp += c->mqs[q].stage_slots;
    if (!c->removing && c->state != FE_CONN_DEAD &&
        (cap == 0 || lynx_slot_cap(c->acc.g.slot_size) < cap))
      cap = lynx_slot_cap(c->acc.g.slot_size);
  }
  dqs = calloc(n + 1, sizeof(*dqs));
  if (!dqs)
    return -ENOMEM;
  for (uint32_t round = 0; k < n; round++)
    for (uint32_t i = 0; i < w->n_conns; i++)
      if (round < w->conns[i]->n_mqs && !w->conns[i]->mqs[round].be)
        dqs[k++] = &w->conns[i]->mqs[round].dq;
  if (max_resp > w->max_resp) {
    struct fe_resp *r = realloc(w->resp, max_resp * sizeof(*r));
    if (!r) {
      free(dqs);
      return -ENOMEM;
    }
    w->resp = r;
    w->max_resp = max_resp;
  }
  /* a flow in flight keeps its mqueue across the rebuild */
  for (uint32_t f = 0; w->flows && f <= w->flow_mask; f++) {
    struct lynx_flow *fl = &w->flows[f];
    uint32_t to = UINT32_MAX;
    if (!fl->outstanding || fl->q >= w->n_mqs || !old)
      continue;
    for (uint32_t j = 0; j < n && to == UINT32_MAX; j++)
      if (dqs[j] == old[fl->q])
        to = j;
    fl->q = to == UINT32_MAX ? 0 : to;
    if (to == UINT32_MAX)
      fl->outstanding = 0; /* its mqueue is gone; its requests counted there */
  }
  w->n_client_mqs = 0;
  for (uint32_t i = 0; i < w->n_conns; i++)
    w->n_client_mqs += w->conns[i]->n_client_mqs;
  w->dqs = dqs;
  w->n_mqs = n;
  w->cap = cap;
  w->disp.q = dqs;
  w->disp.n = n;
  w->disp.cursor = 0;
  free(old);
  return 0;
}

/* Connects (or reconnects) c's transport and takes its rings over where
 * they are: the region may have served an earlier frontend or this one
 * before the connection broke; responses to those requests show up as
 * stale tags. On success c is in dispatch. */
static int conn_open(struct fe_worker *w, struct fe_conn *c) {
  const struct fe_accel *acc = &c->acc;
  int rc = acc->ops->connect(&acc->desc, &c->tc);
  if (rc) {
    c->tc = NULL;
    LYNX_LOG_RL(LYNX_LOG_WARN, "frontend", "worker %u: cannot connect to "
                "accelerator %s/%u (%s %s): %s", w->id, acc->node,
                acc->desc.accel_id, acc->desc.transport, acc->desc.locator,
                strerror(-rc));
    return rc;
  }
  rc = conn_resume(c);
  if (rc) {
    LYNX_LOG_RL(LYNX_LOG_WARN, "frontend", "worker %u: cannot read "
                "accelerator %s/%u's indices: %s", w->id, acc->node,
                acc->desc.accel_id, strerror(-rc));
    goto fail;
  }
  for (uint32_t i = 0; i < c->n_mqs; i++) {
    struct fe_mq *mq = &c->mqs[i];
    struct iovec iov = {&mq->tx_cons, 4};
    mq->dq.rx_prod = mq->dq.rx_cons = c->snap[mq->q].rx_cons;
    mq->tx_cons = c->snap[mq->q].tx_prod;
    mq->tx_staged = 0;
    mq->tx_cons_dirty = 0;
    rc = c->tc->ops->writev(c->tc, lynx_fctrl_off(&acc->g, mq->q), &iov, 1,
                            LYNX_WR_PUBLISH);
    if (rc)
      goto fail;
  }
  rc = c->tc->ops->flush(c->tc);
  if (rc)
    goto fail;
  c->state = FE_CONN_IDLE;
  c->reads_pending = 0;
  c->dirty = 0;
  for (uint32_t i = 0; i < c->n_mqs; i++)
    c->mqs[i].dq.up = 1;
  return 0;
fail:
  c->tc->ops->close(c->tc);
  c->tc = NULL;
  return rc;
}

static int conn_add(struct fe_worker *w, const struct fe_accel *acc) {
  struct frontend *fe = w->fe;
  struct fe_conn *c, **conns;
  uint32_t n = 0;
  int rc;
  for (uint32_t q = w->id; q < acc->g.n_mqueues; q += fe->n_w)
    n++;
  if (n == 0) {
    LYNX_WARN("frontend", "worker %u: instance %llu has %u mqueues for %u "
              "workers: this worker gets none", w->id,
              (unsigned long long)acc->instance_id, acc->g.n_mqueues, fe->n_w);
    return 0;
  }
  c = calloc(1, sizeof(*c));
  if (!c)
    return -ENOMEM;
  c->acc = *acc;
  c->snap = calloc(acc->g.n_mqueues, sizeof(*c->snap));
  c->mqs = calloc(n, sizeof(*c->mqs));
  if (!c->snap || !c->mqs) {
    rc = -ENOMEM;
    goto fail;
  }
  for (uint32_t q = w->id; q < acc->g.n_mqueues; q += fe->n_w) {
    struct fe_mq *mq = &c->mqs[c->n_mqs++];
    mq->conn = c;
    mq->q = q;
    mq->gid = w->next_gid++;
    mq->dq.slots = acc->g.slots;
    mq->stage_slots = STAGE_BYTES / acc->g.slot_size;
    if (mq->stage_slots == 0)
      mq->stage_slots = 1;
    if (mq->stage_slots > acc->g.slots)
      mq->stage_slots = acc->g.slots;
    mq->stage = malloc((size_t)mq->stage_slots * acc->g.slot_size);
    if (!mq->stage) {
      rc = -ENOMEM;
      goto fail;
    }
    if (q >= acc->n_server && q - acc->n_server < fe->n_backends) {
      rc = fe_backend_open(w, mq, &fe->backends[q - acc->n_server]);
      if (rc)
        goto fail;
      c->n_client_mqs++;
    }
  }
  /* an accelerator that cannot be reached yet stays in the table, out of
   * dispatch, and is retried with backoff */
  if (conn_open(w, c)) {
    c->state = FE_CONN_DEAD;
    retry_later(w, c);
  }
  pthread_mutex_lock(&w->lock);
  conns = realloc(w->conns, (w->n_conns + 1) * sizeof(*conns));
  if (conns) {
    w->conns = conns;
    w->conns[w->n_conns++] = c;
    rc = rebuild(w);
    if (rc)
      w->n_conns--;
  } else {
    rc = -ENOMEM;
  }
  pthread_mutex_unlock(&w->lock);
  if (rc)
    goto fail;
  if (c->state != FE_CONN_DEAD)
    LYNX_INFO("frontend", "worker %u: accelerator %s/%u (instance %llu) in "
              "dispatch over %s: %u mqueues", w->id, acc->node,
              acc->desc.accel_id, (unsigned long long)acc->instance_id,
              acc->desc.transport, c->n_mqs);
  return 0;
fail:
  conn_free(c);
  return rc;
}

/* Reopens dead connections still in the table whose retry time came. */
static void retry_dead(struct fe_worker *w) {
  for (uint32_t i = 0; i < w->n_conns; i++) {
    struct fe_conn *c = w->conns[i];
    if (c->state != FE_CONN_DEAD || c->removing || w->now_ns < c->retry_ns)
      continue;
    if (conn_open(w, c)) {
      c->failures++;
      retry_later(w, c);
      continue;
    }
    pthread_mutex_lock(&w->lock);
    if (rebuild(w)) { /* out of memory: out of dispatch again, retry */
      for (uint32_t q = 0; q < c->n_mqs; q++)
        c->mqs[q].dq.up = 0;
    }
    pthread_mutex_unlock(&w->lock);
    LYNX_INFO("frontend", "worker %u: accelerator %s/%u (instance %llu) back "
              "in dispatch over %s after %u failed attempts", w->id,
              c->acc.node, c->acc.desc.accel_id,
              (unsigned long long)c->acc.instance_id, c->acc.desc.transport,
              c->failures);
    c->failures = 0;
    c->retry_wait_ns = 0;
  }
}

/* The connection to an instance; one being removed counts only when
 * any_state (a LOST may hit a connection that is draining). */
static struct fe_conn *conn_find(struct fe_worker *w, uint64_t instance_id,
                                 int any_state) {
  for (uint32_t i = 0; i < w->n_conns; i++)
    if (w->conns[i]->acc.instance_id == instance_id &&
        (any_state || !w->conns[i]->removing))
      return w->conns[i];
  return NULL;
}

static uint32_t conn_outstanding(const struct fe_conn *c) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < c->n_mqs; i++)
    n += c->mqs[i].dq.outstanding;
  return n;
}

/* Out of dispatch: new requests go elsewhere, answers still come back. */
static void conn_remove(struct fe_worker *w, struct fe_conn *c) {
  if (c->removing)
    return;
  c->removing = 1;
  for (uint32_t i = 0; i < c->n_mqs; i++)
    c->mqs[i].dq.up = 0;
  LYNX_INFO("frontend", "worker %u: accelerator %s/%u (instance %llu) leaves "
            "dispatch with %u requests in flight", w->id, c->acc.node,
            c->acc.desc.accel_id, (unsigned long long)c->acc.instance_id,
            conn_outstanding(c));
}

/* Frees removed connections whose requests are all answered (or expired:
 * the request timeout bounds the wait). */
static void reap_removed(struct fe_worker *w) {
  uint32_t i = 0;
  while (i < w->n_conns) {
    struct fe_conn *c = w->conns[i];
    int rc;
    if (!c->removing ||
        (c->state != FE_CONN_DEAD && conn_outstanding(c) != 0)) {
      i++;
      continue;
    }
    pthread_mutex_lock(&w->lock);
    w->conns[i] = w->conns[--w->n_conns];
    rc = rebuild(w);
    if (rc) { /* out of memory: put it back, try again later */
      w->conns[w->n_conns++] = w->conns[i];
      w->conns[i] = c;
    }
    pthread_mutex_unlock(&w->lock);
    if (rc)
      return;
    LYNX_INFO("frontend", "worker %u: accelerator %s/%u (instance %llu) "
              "released", w->id, c->acc.node, c->acc.desc.accel_id,
              (unsigned long long)c->acc.instance_id);
    for (uint32_t q = 0; q < c->n_mqs; q++) {
      lynx_cnt_add(&w->retired_dispatched, lynx_cnt_get(&c->mqs[q].dispatched));
      lynx_cnt_add(&w->retired_responded, lynx_cnt_get(&c->mqs[q].responded));
      for (int k = 0; k < FE_QDROP_MAX; k++)
        lynx_cnt_add(&w->retired_drops[k], lynx_cnt_get(&c->mqs[q].drops[k]));
    }
    conn_free(c); /* conns[i] is another connection now: look at it next */
  }
}

static void run_commands(struct fe_worker *w) {
  struct fe_cmd *cmd;
  pthread_mutex_lock(&w->lock);
  cmd = w->cmds;
  w->cmds = NULL;
  w->cmds_tail = &w->cmds;
  __atomic_store_n(&w->cmds_pending, 0, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&w->lock);
  while (cmd) {
    struct fe_cmd *next = cmd->next;
    struct fe_conn *c;
    switch (cmd->kind) {
    case FE_CMD_ADD:
      if (!conn_find(w, cmd->acc.instance_id, 0))
        conn_add(w, &cmd->acc);
      break;
    case FE_CMD_REMOVE:
      c = conn_find(w, cmd->instance_id, 0);
      if (c)
        conn_remove(w, c);
      break;
    case FE_CMD_LOST:
    case FE_CMD_ABANDON:
      c = conn_find(w, cmd->instance_id, 1);
      if (c) {
        conn_remove(w, c);
        if (cmd->kind == FE_CMD_LOST)
          conn_down(w, c, "its node was declared down", FE_QDROP_LOST);
        else
          conn_down(w, c, "its agent left (its control connection closed)",
                    FE_QDROP_IN_DOUBT);
      }
      break;
    }
    __atomic_store_n(&w->applied_seq, cmd->seq, __ATOMIC_RELEASE);
    free(cmd);
    cmd = next;
  }
  reap_removed(w);
}

/* ---- set-up (main thread) -------------------------------------------- */

#define FE_TAGS 65536 /* outstanding requests per worker */

static void worker_free(struct fe_worker *w) {
  for (uint32_t i = 0; w->conns && i < w->n_conns; i++)
    conn_free(w->conns[i]);
  while (w->cmds) {
    struct fe_cmd *c = w->cmds;
    w->cmds = c->next;
    free(c);
  }
  free(w->clients);
  free(w->conns);
  free(w->dqs);
  free(w->rbuf);
  free(w->resp);
  free(w->flows);
  lynx_tagtab_free(&w->tags);
  pthread_mutex_destroy(&w->lock);
}

static int worker_setup(struct frontend *fe, struct fe_worker *w) {
  uint32_t seed;
  int rc;
  pthread_mutex_init(&w->lock, NULL);
  w->cmds_tail = &w->cmds;
  w->retry_seed = (unsigned)lynx_now_ns() ^ (w->id * 2654435761u);
  w->rbuf = malloc((size_t)FE_RECV_CHUNKS * FE_DGRAM_MAX);
  if (!w->rbuf)
    return -ENOMEM;
  w->disp.policy = (enum lynx_dispatch_policy)fe->cfg->dispatch;
  if (fe->cfg->order == 0) { /* flow order */
    w->flow_mask = FE_FLOWS - 1;
    w->flows = calloc(FE_FLOWS, sizeof(*w->flows));
    if (!w->flows)
      return -ENOMEM;
  }
  /* a random first generation: tags of an earlier frontend on the same
   * rings are not mistaken for ours */
  if (getrandom(&seed, sizeof(seed), 0) != sizeof(seed))
    seed = (uint32_t)lynx_now_ns();
  rc = lynx_tagtab_init(&w->tags, FE_TAGS, seed);
  if (rc)
    return rc;
  rc = uv_loop_init(&w->loop);
  if (rc)
    return rc;
  w->loop_ready = 1;
  rc = uv_async_init(&w->loop, &w->wake, on_wake);
  if (rc)
    return rc;
  w->wake.data = w;
  return listen_try(w);
}

int fe_workers_start(struct frontend *fe) {
  int rc;
  fe->w = calloc(fe->n_w, sizeof(*fe->w));
  if (!fe->w)
    return -ENOMEM;
  fe->workers_running = 1;
  for (uint32_t i = 0; i < fe->n_w; i++) {
    struct fe_worker *w = &fe->w[i];
    w->fe = fe;
    w->id = i;
    rc = worker_setup(fe, w);
    if (rc) {
      LYNX_ERR("frontend", "service %s worker %u: set-up failed: %s",
               fe->service, i, strerror(rc < 0 ? -rc : rc));
      return rc;
    }
  }
  for (uint32_t i = 0; i < fe->n_w; i++) {
    rc = pthread_create(&fe->w[i].tid, NULL, worker_main, &fe->w[i]);
    if (rc)
      return -rc;
    fe->w[i].started = 1;
  }
  return 0;
}

uint64_t fe_post(struct frontend *fe, enum fe_cmd_kind kind,
                 const struct fe_accel *acc, uint64_t instance_id) {
  uint64_t seq = ++fe->cmd_seq;
  for (uint32_t i = 0; fe->w && i < fe->n_w; i++) {
    struct fe_worker *w = &fe->w[i];
    struct fe_cmd *c = calloc(1, sizeof(*c));
    if (!c) {
      LYNX_ERR("frontend", "out of memory posting a command");
      continue;
    }
    c->kind = kind;
    if (acc)
      c->acc = *acc;
    c->instance_id = instance_id;
    c->seq = seq;
    pthread_mutex_lock(&w->lock);
    *w->cmds_tail = c;
    w->cmds_tail = &c->next;
    __atomic_store_n(&w->cmds_pending, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&w->lock);
    if (w->started)
      uv_async_send(&w->wake);
  }
  return seq;
}

int fe_applied(struct frontend *fe, uint64_t seq) {
  for (uint32_t i = 0; fe->w && i < fe->n_w; i++)
    if (fe->w[i].started &&
        __atomic_load_n(&fe->w[i].applied_seq, __ATOMIC_ACQUIRE) < seq)
      return 0;
  return 1;
}

void fe_foreach_mq(struct frontend *fe,
                   void (*fn)(void *arg, const struct fe_worker *w,
                              const struct fe_conn *c, const struct fe_mq *mq),
                   void *arg) {
  for (uint32_t i = 0; fe->w && i < fe->n_w; i++) {
    struct fe_worker *w = &fe->w[i];
    pthread_mutex_lock(&w->lock);
    for (uint32_t k = 0; k < w->n_conns; k++)
      for (uint32_t q = 0; q < w->conns[k]->n_mqs; q++)
        fn(arg, w, w->conns[k], &w->conns[k]->mqs[q]);
    pthread_mutex_unlock(&w->lock);
  }
}

void fe_workers_stop(struct frontend *fe) {
  if (!fe->workers_running)
    return;
  fe->stop_deadline_ns =
      lynx_now_ns() + (uint64_t)fe->cfg->drain_ms * 1000000u;
  __atomic_store_n(&fe->stopping, 1, __ATOMIC_RELEASE);
  for (uint32_t i = 0; fe->w && i < fe->n_w; i++)
    if (fe->w[i].started)
      uv_async_send(&fe->w[i].wake);
  for (uint32_t i = 0; fe->w && i < fe->n_w; i++)
    if (fe->w[i].started)
      pthread_join(fe->w[i].tid, NULL);
  fe_log_totals(fe); /* final counts, before the workers are freed */
  for (uint32_t i = 0; fe->w && i < fe->n_w; i++) {
    struct fe_worker *w = &fe->w[i];
    if (w->started) {
      /* joined above */
    } else if (w->loop_ready) {
      /* set up but never started: close its handles here */
      udp_close(w);
      fe_tcp_close_all(w);
      if (w->wake.loop && !uv_is_closing((uv_handle_t *)&w->wake))
        uv_close((uv_handle_t *)&w->wake, NULL);
      uv_run(&w->loop, UV_RUN_DEFAULT);
      uv_loop_close(&w->loop);
    }
    if (w->fe) /* only workers that were set up hold resources */
      worker_free(w);
  }
  free(fe->w);
  fe->w = NULL;
  fe->workers_running = 0;
}
