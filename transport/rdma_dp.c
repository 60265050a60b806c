/*
 * rdma_dp.c - the rdma transport's data path: posted RDMA WRITEs and READs
 * (and the notify SEND) over one RC QP, for one frontend worker.
 *
 * Design (docs/rdma.md):
 *  - Every operation becomes one work request in a ring that mirrors the
 *    send queue: sq_head (oldest not known complete) <= sq_posted (first
 *    not handed to the NIC) <= sq_tail. flush() links [sq_posted, sq_tail)
 *    into one chain and rings the doorbell once (ibv_post_send).
 *  - Writes are copied when posted, because the caller's buffers may be
 *    gone by flush: into the WR itself when small enough to go inline,
 *    else into a registered staging ring. Reads land in a registered
 *    bounce ring and are copied to the caller's dst when they complete,
 *    before their id is reported.
 *  - Selective signalling: reads always, writes and notifies every
 *    signal_every-th WR and whenever the send queue or the staging ring is
 *    about to fill. RC completes a send queue in order, so one completion
 *    frees every WR up to it (and the staging and bounce bytes they held).
 *  - Nothing blocks: when the send queue or a ring is full the call rings
 *    the doorbell for what is pending, reaps the CQ once, and otherwise
 *    returns -ENOBUFS for the caller to retry.
 *  - The first failed completion kills the connection: WR_FLUSH_ERR (the QP
 *    was flushed: peer gone, disconnect) is -ECONNRESET, any other status
 *    -EIO; every later call returns the same error.
 * Only ibv_post_send and ibv_poll_cq are called here, which is what lets
 * the unit test put a fake NIC under it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "rdma_internal.h"
#include "util.h"

#define STAGE_MIN (256u << 10)
#define STAGE_MAX (4u << 20)
#define BOUNCE_MIN (64u << 10)
#define BOUNCE_MAX (4u << 20)
#define AREA_ALIGN 64u /* cache line: the NIC's DMA never shares one */
#define RING_MAX 16384u
#define REAP_BATCH 16

static uint64_t clamp64(uint64_t v, uint64_t lo, uint64_t hi) {
  return v < lo ? lo : v > hi ? hi : v;
}

void lynx__rdma_buf_sizes(const struct lynx_geom *g, size_t *stage,
                          size_t *bounce) {
  /* what the data path reads: header + actrl, and every TX ring (the RX
   * rings only in small reads of a takeover's scan) */
  uint64_t readable = g->fctrl_off + (uint64_t)g->n_mqueues * g->ring_bytes;
  uint64_t s = clamp64(4ull * g->slot_size, STAGE_MIN, STAGE_MAX);
  uint64_t b = clamp64(lynx_align_up(readable, 4096), BOUNCE_MIN, BOUNCE_MAX);
  /* a slot-sized write or read must always fit, twice over */
  if (s < 2ull * g->slot_size)
    s = 2ull * g->slot_size;
  if (b < 2ull * g->slot_size && b < lynx_align_up(readable, 4096))
    b = 2ull * g->slot_size;
  *stage = (size_t)s;
  *bounce = (size_t)b;
}

static int set_dead(struct lynx__rdma_conn *c, int err) {
  if (!c->dead)
    c->dead = err;
  return c->dead;
}

static const char *kind_str(uint8_t kind) {
  switch (kind) {
  case LYNX_RWR_WRITE:
    return "RDMA WRITE";
  case LYNX_RWR_READ:
    return "RDMA READ";
  case LYNX_RWR_SEND:
    return "SEND (notify)";
  default:
    return "unknown WR";
  }
}

/*
 * Reserves len contiguous bytes of a ring of size bytes holding [*head,
 * *tail) (free-running counters). A range never wraps: the tail skips the
 * ring's end when it would. An empty ring restarts at a lap boundary so a
 * range as large as the ring fits. 0 with *pos set, or -ENOBUFS.
 */
static int area_alloc(uint64_t size, uint64_t *head, uint64_t *tail,
                      uint64_t len, uint64_t *pos) {
  uint64_t t = lynx_align_up(*tail, AREA_ALIGN), p = t % size;
  if (p + len > size) {
    t += size - p;
    p = 0;
    if (*head == *tail)
      *head = t; /* nothing live: moving head up frees the skipped end */
  }
  if (t + len - *head > size)
    return -ENOBUFS;
  *tail = t + len;
  *pos = p;
  return 0;
}

/* ---- completions ------------------------------------------------------ */

/* The WR seq completed, and with it (RC order) every WR before it. */
static void complete_upto(struct lynx__rdma_conn *c, uint64_t seq) {
  for (uint64_t s = c->sq_head; s <= seq; s++) {
    struct lynx__rdma_wr *w = &c->ring[s & c->ring_mask];
    if (w->kind == LYNX_RWR_READ) {
      if (w->len)
        memcpy(w->dst, w->bounce, w->len);
      c->done[c->done_tail++ & c->ring_mask] = w->user_id;
    }
    /* heads only move forward (area_alloc may have moved them past) */
    if (w->stage_end > c->stage_head)
      c->stage_head = w->stage_end;
    if (w->bounce_end > c->bounce_head)
      c->bounce_head = w->bounce_end;
  }
  c->sq_head = seq + 1;
}

static int on_wc(struct lynx__rdma_conn *c, const struct ibv_wc *wc) {
  uint64_t seq = wc->wr_id;
  int known = seq >= c->sq_head && seq < c->sq_posted;
  const char *what =
      known ? kind_str(c->ring[seq & c->ring_mask].kind) : "unknown WR";
  if (wc->status != IBV_WC_SUCCESS) {
    /* only wr_id, status and vendor_err are valid in a failed completion:
     * the opcode comes from our own record */
    int err = wc->status == IBV_WC_WR_FLUSH_ERR ? -ECONNRESET : -EIO;
    if (!c->dead)
      LYNX_LOG_RL(LYNX_LOG_WARN, "rdma",
                  "%s: %s #%llu failed: %s (status %d, vendor error 0x%x); "
                  "connection dead",
                  c->name, what, (unsigned long long)seq,
                  ibv_wc_status_str(wc->status), (int)wc->status,
                  wc->vendor_err);
    return set_dead(c, err);
  }
  if (!known) {
    LYNX_LOG_RL(LYNX_LOG_ERROR, "rdma",
                "%s: completion for WR #%llu outside [%llu, %llu) "
                "(opcode %d); connection dead",
                c->name, (unsigned long long)seq,
                (unsigned long long)c->sq_head,
                (unsigned long long)c->sq_posted, (int)wc->opcode);
    return set_dead(c, -EIO);
  }
  complete_upto(c, seq);
  return 0;
}

/* Takes what the CQ holds, at most one send queue's worth per call (the
 * CQ never holds more: every CQE is a signalled WR of this QP). */
static int reap(struct lynx__rdma_conn *c) {
  struct ibv_wc wc[REAP_BATCH];
  uint32_t budget = c->ring_mask + 1;
  while (budget > 0) {
    int n = ibv_poll_cq(c->cq, REAP_BATCH, wc);
    if (n < 0) {
      LYNX_LOG_RL(LYNX_LOG_WARN, "rdma",
                  "%s: ibv_poll_cq failed (%d); "
                  "connection dead",
                  c->name, n);
      return set_dead(c, -EIO);
    }
    for (int i = 0; i < n; i++) {
      int rc = on_wc(c, &wc[i]);
      if (rc)
        return rc;
    }
    if (n < REAP_BATCH)
      break;
    budget = (uint32_t)n >= budget ? 0 : budget - (uint32_t)n;
  }
  return 0;
}

/* ---- posting ---------------------------------------------------------- */

/* Hands [sq_posted, sq_tail) to the NIC as one chain, one doorbell. */
static int post_pending(struct lynx__rdma_conn *c) {
  struct ibv_send_wr *bad = NULL;
  int rc;
  if (c->sq_posted == c->sq_tail)
    return 0;
  for (uint64_t s = c->sq_posted; s < c->sq_tail; s++)
    c->ring[s & c->ring_mask].wr.next =
        s + 1 < c->sq_tail ? &c->ring[(s + 1) & c->ring_mask].wr : NULL;
  rc = ibv_post_send(c->qp, &c->ring[c->sq_posted & c->ring_mask].wr, &bad);
  c->posts++;
  if (rc == 0) {
    c->sq_posted = c->sq_tail;
    return 0;
  }
  /* bad and everything after it were not posted */
  if (bad && bad->wr_id >= c->sq_posted && bad->wr_id < c->sq_tail)
    c->sq_posted = bad->wr_id;
  rc = rc > 0 ? rc : EIO;
  if (rc == ENOMEM)
    return -ENOBUFS; /* the provider's queue is fuller than we count */
  LYNX_LOG_RL(LYNX_LOG_WARN, "rdma",
              "%s: ibv_post_send failed: %s; "
              "connection dead",
              c->name, strerror(rc));
  return set_dead(c, -EIO);
}

/*
 * Room for one more WR, stage_len staging bytes and bounce_len bounce
 * bytes (is_read: a read id must also fit the done ring). When full, rings
 * the doorbell for the pending chain and reaps the CQ once; never waits.
 */
static int reserve(struct lynx__rdma_conn *c, uint64_t stage_len,
                   uint64_t bounce_len, int is_read, uint64_t *spos,
                   uint64_t *bpos) {
  for (int attempt = 0;; attempt++) {
    uint64_t sh = c->stage_head, st = c->stage_tail;
    uint64_t bh = c->bounce_head, bt = c->bounce_tail;
    int rc;
    if (c->sq_tail - c->sq_head < c->sq_cap &&
        (!is_read || c->reads_held <= c->ring_mask) &&
        (!stage_len ||
         area_alloc(c->stage_size, &sh, &st, stage_len, spos) == 0) &&
        (!bounce_len ||
         area_alloc(c->bounce_size, &bh, &bt, bounce_len, bpos) == 0)) {
      c->stage_head = sh;
      c->stage_tail = st;
      c->bounce_head = bh;
      c->bounce_tail = bt;
      return 0;
    }
    if (attempt)
      return -ENOBUFS;
    rc = post_pending(c);
    if (rc && rc != -ENOBUFS)
      return rc;
    rc = reap(c);
    if (rc)
      return rc;
  }
}

/* Finishes the WR at sq_tail: id, signalling, what its completion frees. */
static void commit(struct lynx__rdma_conn *c, struct lynx__rdma_wr *w,
                   uint8_t kind) {
  int sig = kind == LYNX_RWR_READ || c->unsignalled + 1 >= c->signal_every ||
            c->sq_tail + 1 - c->sq_head >= c->sq_cap ||
            c->stage_tail - c->stage_mark >= c->stage_size / 2;
  w->kind = kind;
  w->wr.wr_id = c->sq_tail;
  w->wr.next = NULL;
  if (sig) {
    w->wr.send_flags |= IBV_SEND_SIGNALED;
    c->unsignalled = 0;
    c->stage_mark = c->stage_tail;
  } else {
    c->unsignalled++;
  }
  w->stage_end = c->stage_tail;
  w->bounce_end = c->bounce_tail;
  c->sq_tail++;
}

static struct lynx__rdma_wr *next_wr(struct lynx__rdma_conn *c) {
  struct lynx__rdma_wr *w = &c->ring[c->sq_tail & c->ring_mask];
  memset(&w->wr, 0, sizeof(w->wr));
  memset(&w->sge, 0, sizeof(w->sge));
  w->dst = NULL;
  w->bounce = NULL;
  w->len = 0;
  w->user_id = 0;
  return w;
}

/* ---- operations ------------------------------------------------------- */

int lynx__rdma_writev(struct lynx_tconn *tc, uint64_t off,
                      const struct iovec *iov, int iovcnt, unsigned flags) {
  struct lynx__rdma_conn *c = container_of(tc, struct lynx__rdma_conn, base);
  struct lynx__rdma_wr *w;
  uint64_t total = 0, spos = 0;
  size_t at = 0;
  uint8_t *dst;
  int inl, rc;
  if (c->dead)
    return c->dead;
  /* the side that performs the access checks it: only fctrl and the RX
   * rings are registered for remote write */
  rc = lynx_writev_check(&c->g, off, iov, iovcnt, flags, &total);
  if (rc)
    return rc;
  if (total == 0)
    return 0;
  inl = total <= c->max_inline;
  if (!inl && total > c->stage_size)
    return -EMSGSIZE;
  rc = reserve(c, inl ? 0 : total, 0, 0, &spos, NULL);
  if (rc)
    return rc;
  w = next_wr(c);
  dst = inl ? w->inl : c->stage + spos;
  for (int i = 0; i < iovcnt; i++) {
    if (iov[i].iov_len)
      memcpy(dst + at, iov[i].iov_base, iov[i].iov_len);
    at += iov[i].iov_len;
  }
  w->sge.addr = (uintptr_t)dst;
  w->sge.length = (uint32_t)total;
  w->sge.lkey = c->lkey;
  w->wr.sg_list = &w->sge;
  w->wr.num_sge = 1;
  w->wr.opcode = IBV_WR_RDMA_WRITE;
  /* PUBLISH needs nothing more on RC: the responder places a WRITE's
   * bytes in order, so the seq word lands last (coalesced mode) */
  w->wr.send_flags = (inl ? IBV_SEND_INLINE : 0) |
                     ((flags & LYNX_WR_FENCE) ? IBV_SEND_FENCE : 0);
  w->wr.wr.rdma.remote_addr = c->base.desc.remote_addr + off;
  w->wr.wr.rdma.rkey = c->base.desc.rkeys[LYNX_MR_WRITE];
  commit(c, w, LYNX_RWR_WRITE);
  return 0;
}

int lynx__rdma_read(struct lynx_tconn *tc, uint64_t off, void *dst, size_t len,
                    uint64_t wr_id) {
  struct lynx__rdma_conn *c = container_of(tc, struct lynx__rdma_conn, base);
  struct lynx__rdma_wr *w;
  uint64_t bpos = 0;
  int cls, rc;
  if (c->dead)
    return c->dead;
  cls = lynx_region_class(&c->g, off, len); /* every class is readable */
  if (cls < 0)
    return -EFAULT;
  if (len && !dst)
    return -EINVAL;
  if (len > c->bounce_size)
    return -EMSGSIZE;
  rc = reserve(c, 0, len, 1, NULL, &bpos);
  if (rc)
    return rc;
  w = next_wr(c);
  w->dst = dst;
  w->bounce = c->bounce + bpos;
  w->len = (uint32_t)len;
  w->user_id = wr_id;
  w->sge.addr = (uintptr_t)w->bounce;
  w->sge.length = (uint32_t)len;
  w->sge.lkey = c->lkey;
  w->wr.sg_list = &w->sge;
  w->wr.num_sge = len ? 1 : 0;
  w->wr.opcode = IBV_WR_RDMA_READ;
  w->wr.wr.rdma.remote_addr = c->base.desc.remote_addr + off;
  w->wr.wr.rdma.rkey = c->base.desc.rkeys[cls];
  c->reads_held++;
  commit(c, w, LYNX_RWR_READ);
  return 0;
}

int lynx__rdma_flush(struct lynx_tconn *tc) {
  struct lynx__rdma_conn *c = container_of(tc, struct lynx__rdma_conn, base);
  if (c->dead)
    return c->dead;
  return post_pending(c);
}

int lynx__rdma_poll_cq(struct lynx__rdma_conn *c, uint64_t *ids, int max) {
  int n = 0, rc;
  if (c->dead)
    return c->dead;
  rc = reap(c);
  if (rc)
    return rc;
  while (n < max && c->done_head != c->done_tail) {
    ids[n++] = c->done[c->done_head++ & c->ring_mask];
    c->reads_held--;
  }
  return n;
}

/* A 0-byte SEND the agent's receive queue turns into a futex wake. Posted
 * at once with whatever is pending (notify is the batch's doorbell), after
 * the writes it announces: RC delivers it after they are placed. */
int lynx__rdma_notify(struct lynx_tconn *tc) {
  struct lynx__rdma_conn *c = container_of(tc, struct lynx__rdma_conn, base);
  struct lynx__rdma_wr *w;
  int rc;
  if (c->dead)
    return c->dead;
  rc = reserve(c, 0, 0, 0, NULL, NULL);
  if (rc)
    return rc;
  w = next_wr(c);
  w->wr.opcode = IBV_WR_SEND;
  w->wr.num_sge = 0;
  w->wr.sg_list = NULL;
  w->wr.send_flags = c->max_inline ? IBV_SEND_INLINE : 0;
  commit(c, w, LYNX_RWR_SEND);
  return post_pending(c);
}

/* ---- set-up ----------------------------------------------------------- */

int lynx__rdma_conn_new(const struct lynx_transport_ops *ops,
                        const struct lynx_region_desc *d,
                        struct lynx__rdma_conn **out) {
  struct lynx__rdma_conn *c;
  struct lynx_geom g;
  if (lynx_geom_init(&g, d->n_mqueues, d->slots, d->slot_size,
                     d->large_bytes) ||
      g.region_size != d->region_size)
    return -EINVAL;
  c = calloc(1, sizeof(*c));
  if (!c)
    return -ENOMEM;
  c->base.ops = ops;
  c->base.desc = *d;
  c->g = g;
  c->cm = LYNX_RCM_IDLE;
  c->epfd = -1;
  c->efd = -1;
  snprintf(c->name, sizeof(c->name), "accel %u at %s", d->accel_id, d->locator);
  *out = c;
  return 0;
}

int lynx__rdma_dp_init(struct lynx__rdma_conn *c,
                       const struct lynx__rdma_attach *a) {
  uint32_t ring = 2;
  if (!a->qp || !a->cq || !a->buf || a->sq_depth < 2 ||
      a->sq_depth > RING_MAX || !a->stage_size || !a->bounce_size ||
      a->stage_size % AREA_ALIGN || a->bounce_size % AREA_ALIGN)
    return -EINVAL;
  while (ring < a->sq_depth)
    ring <<= 1;
  c->ring = calloc(ring, sizeof(*c->ring));
  c->done = calloc(ring, sizeof(*c->done));
  if (!c->ring || !c->done) {
    lynx__rdma_dp_fini(c);
    return -ENOMEM;
  }
  c->ring_mask = ring - 1;
  c->qp = a->qp;
  c->cq = a->cq;
  c->lkey = a->lkey;
  c->stage = a->buf;
  c->stage_size = a->stage_size;
  c->bounce = a->buf + a->stage_size;
  c->bounce_size = a->bounce_size;
  c->sq_cap = a->sq_depth;
  c->max_inline = a->max_inline < LYNX_RDMA_INLINE_BUF ? a->max_inline
                                                       : LYNX_RDMA_INLINE_BUF;
  /* a period above sq_cap is fine: the WR that fills the queue is
   * signalled whatever the period */
  c->signal_every = a->signal_every ? a->signal_every : LYNX_RDMA_SIGNAL_EVERY;
  return 0;
}

void lynx__rdma_dp_fini(struct lynx__rdma_conn *c) {
  free(c->ring);
  free(c->done);
  c->ring = NULL;
  c->done = NULL;
}

void lynx__rdma_conn_cm_event(struct lynx__rdma_conn *c,
                              enum rdma_cm_event_type ev, int status) {
  struct lynx__rdma_cm_step st = lynx__rdma_cm_next(c->cm, ev, status);
  if (st.next != c->cm)
    LYNX_WARN("rdma", "%s: %s (status %d): %s -> %s", c->name,
              rdma_event_str(ev), status, lynx__rdma_cm_state_str(c->cm),
              lynx__rdma_cm_state_str(st.next));
  c->cm = st.next;
  if (st.act == LYNX_RCM_ACT_TEARDOWN)
    set_dead(c, st.err);
}
