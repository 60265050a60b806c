/*
 * forwarder.c - the Message Forwarder (Lynx paper §4.2, egress).
 *
 * Each pass runs every connection's Remote Message Queue Manager cycle,
 * which hands each new TX slot here (fe_forward_slot): the response's tag
 * is mapped back to its client (the tag table), the response is gathered,
 * and after the pass every gathered response is sent in dispatch order:
 * one sendmmsg per 64 for UDP, framed onto its connection for TCP
 * (tcpsvc.c). A client mqueue's slot is a request of the application to
 * its back end instead (backend.c).
 *
 * Owns: the gathered responses (struct fe_egress) and their accounting:
 * responded and the end-to-end histogram when one goes out, a drop on its
 * mqueue when it cannot (tcpsvc.c only frames). Their payloads stay in
 * the mqueues' staging buffers, which the manager reads into again only at
 * that connection's next cycle, after the pass has sent. It reaches the
 * manager, tags, dispatcher and TCP connections only through what it was
 * given at fe_forwarder_init.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "dispatcher.h"
#include "forwarder.h"
#include "log.h"
#include "tcpsvc.h"

static int resp_cmp(const void *a, const void *b) {
  const struct fe_resp *x = a, *y = b;
  return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* r went out (handed to the kernel at now_ns): counted responded on its
 * mqueue, its end-to-end time into the histogram. */
static void resp_sent(struct fe_egress *eg, const struct fe_resp *r,
                      uint64_t now_ns) {
  lynx_cnt_add(&r->mq->responded, 1);
  lynx_lat_add(&eg->e2e, now_ns > r->t_ns ? now_ns - r->t_ns : 0);
}

/* Sends every gathered response, in dispatch order, 64 per sendmmsg (UDP)
 * or framed onto its connection (TCP, tcpsvc.c). */
static void flush_sends(struct fe_egress *eg) {
  uint32_t base = 0;
  int fd;
  if (!eg->n_resp)
    return;
  if (eg->n_resp > 1)
    qsort(eg->resp, eg->n_resp, sizeof(*eg->resp), resp_cmp);
  if (eg->opts.tcp) {
    for (uint32_t i = 0; i < eg->n_resp; i++) {
      struct fe_resp *r = &eg->resp[i];
      uint64_t at;
      int rc =
          fe_tcp_send(eg->opts.tcp, r->cli, r->cli_gen, r->data, r->len, &at);
      if (rc == 0)
        resp_sent(eg, r, at);
      else
        lynx_cnt_add(&r->mq->drops[rc == -ENOTCONN ? FE_QDROP_CLIENT_GONE
                                                   : FE_QDROP_SEND_ERR],
                     1);
    }
    eg->n_resp = 0;
    return;
  }
  if (uv_fileno((uv_handle_t *)&eg->opts.ingress->udp, &fd) != 0) {
    /* the socket is closed (stopping): these answers cannot go out */
    for (uint32_t i = 0; i < eg->n_resp; i++)
      lynx_cnt_add(&eg->resp[i].mq->drops[FE_QDROP_SEND_ERR], 1);
    eg->n_resp = 0;
    return;
  }
  while (base < eg->n_resp) {
    uint32_t n = eg->n_resp - base, done = 0;
    if (n > FE_SEND_BATCH)
      n = FE_SEND_BATCH;
    for (uint32_t i = 0; i < n; i++) {
      struct fe_resp *r = &eg->resp[base + i];
      struct msghdr *h = &eg->out[i].msg_hdr;
      eg->out_iov[i].iov_base = (void *)r->data;
      eg->out_iov[i].iov_len = r->len;
      memset(h, 0, sizeof(*h));
      h->msg_name = &r->addr;
      h->msg_namelen = r->addr.sa.sa_family == AF_INET6 ? sizeof(r->addr.v6)
                                                        : sizeof(r->addr.v4);
      h->msg_iov = &eg->out_iov[i];
      h->msg_iovlen = 1;
    }
    while (done < n) {
      int k = sendmmsg(fd, eg->out + done, n - done, MSG_DONTWAIT);
      if (k > 0) {
        uint64_t now = lynx_now_ns();
        for (uint32_t i = done; i < done + (uint32_t)k; i++)
          resp_sent(eg, &eg->resp[base + i], now);
        done += (uint32_t)k;
        continue;
      }
      if (k < 0 && errno == EINTR)
        continue;
      /* the first of the rest failed: count it, go on with the others */
      LYNX_LOG_RL(LYNX_LOG_WARN, "frontend", "worker %u: send failed: %s",
                  eg->opts.worker, strerror(errno));
      lynx_cnt_add(&eg->resp[base + done].mq->drops[FE_QDROP_SEND_ERR], 1);
      done++;
    }
    base += n;
  }
  eg->n_resp = 0;
}

static void queue_send(struct fe_egress *eg, struct fe_mq *mq,
                       const struct lynx_tag_entry *e, const uint8_t *data,
                       uint32_t len) {
  struct fe_resp *r = &eg->resp[eg->n_resp++];
  r->seq = e->seq;
  r->addr = e->peer;
  r->cli = e->cli;
  r->cli_gen = e->cli_gen;
  r->data = data;
  r->len = len;
  r->mq = mq;
  r->t_ns = e->t_ns;
}

int fe_forward_slot(struct fe_egress *eg, struct fe_mq *mq, const uint8_t *slot,
                    uint32_t pos, const uint8_t *large, uint32_t large_len) {
  uint32_t z = mq->conn->acc.g.slot_size, len;
  struct lynx_slot_meta m;
  struct lynx_tag_entry *e;
  const uint8_t *data;
  int bad, large_ref = 0;
  memcpy(&m, slot + z - LYNX_META_SIZE, sizeof(m));
  /* the message: in the slot, or (large) read from the TX large area by
   * the manager, which found its reference sound */
  bad = lynx_meta_check(&m, z) != 0;
  data = slot + (uint32_t)m.off16 * 16u;
  len = m.len;
  if (m.status & LYNX_ST_LARGE) {
    large_ref = !bad && !large;
    bad = bad || !large;
    data = large;
    len = large_len;
    m.status = (uint16_t)(m.status & ~LYNX_ST_LARGE);
  }
  if (mq->be && m.seq == lynx_seq_for(pos)) {
    /* a client mqueue: the application's request to its back end */
    if (bad) {
      lynx_cnt_add(&mq->drops[FE_QDROP_TX_OVERSIZE], 1);
      return 0;
    }
    return fe_backend_request(mq, data, len, m.tag);
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
                  mq->conn->acc.node, mq->conn->acc.desc.accel_id, mq->q, pos,
                  m.seq);
    }
    return -EAGAIN;
  }
  e = lynx_tag_lookup(eg->opts.tags, m.tag, mq->gid);
  if (!e) {
    lynx_cnt_add(&mq->drops[FE_QDROP_STALE_TAG], 1);
    LYNX_LOG_RL(LYNX_LOG_WARN, "frontend",
                "mqueue %s/%u/%u: response with unknown or stale tag 0x%08x "
                "discarded",
                mq->conn->acc.node, mq->conn->acc.desc.accel_id, mq->q, m.tag);
    return 0;
  }
  fe_mq_outstanding_set(mq, mq->dq.outstanding - 1);
  if (m.status == LYNX_ST_DROPPED) {
    lynx_cnt_add(&mq->drops[FE_QDROP_APP], 1);
  } else if (bad) {
    lynx_cnt_add(&mq->drops[FE_QDROP_TX_OVERSIZE], 1);
    if (large_ref)
      LYNX_LOG_RL(LYNX_LOG_WARN, "frontend",
                  "mqueue %s/%u/%u: large response whose reference lies "
                  "outside the %u-byte large area, dropped",
                  mq->conn->acc.node, mq->conn->acc.desc.accel_id, mq->q,
                  mq->conn->acc.g.large_bytes);
    else
      LYNX_LOG_RL(LYNX_LOG_WARN, "frontend",
                  "mqueue %s/%u/%u: response of %u bytes at %u does not fit "
                  "a %u-byte slot, dropped",
                  mq->conn->acc.node, mq->conn->acc.desc.accel_id, mq->q, m.len,
                  m.off16 * 16u, z);
  } else {
    queue_send(eg, mq, e, data, len);
  }
  fe_request_done(eg->opts.ingress, e);
  return 0;
}

int fe_forward(struct fe_egress *eg) {
  struct fe_rmq *r = eg->opts.rmq;
  int work = 0;
  for (uint32_t i = 0; i < r->n_conns; i++)
    work += fe_rmq_progress(r, r->conns[i]);
  flush_sends(eg);
  return work;
}

/* One pass gathers at most what every mqueue's staging holds. */
int fe_forwarder_reserve(struct fe_egress *eg) {
  const struct fe_rmq *rmq = eg->opts.rmq;
  uint32_t max_resp = 0;
  for (uint32_t i = 0; i < rmq->n_conns; i++) {
    const struct fe_conn *c = rmq->conns[i];
    for (uint32_t q = 0; q < c->n_mqs; q++)
      max_resp += c->mqs[q].stage_slots;
  }
  if (max_resp > eg->max_resp) {
    struct fe_resp *r = realloc(eg->resp, max_resp * sizeof(*r));
    if (!r)
      return -ENOMEM;
    eg->resp = r;
    eg->max_resp = max_resp;
  }
  return 0;
}

void fe_forwarder_init(struct fe_egress *eg, const struct fe_egress_opts *o) {
  memset(eg, 0, sizeof(*eg));
  eg->opts = *o;
}

void fe_forwarder_free(struct fe_egress *eg) {
  free(eg->resp);
  eg->resp = NULL;
  eg->n_resp = eg->max_resp = 0;
}
