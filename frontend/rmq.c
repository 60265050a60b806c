/*
 * rmq.c - the Remote Message Queue Manager (Lynx paper §4.2): keeps the
 * mqueues in accelerator memory, reached only by one-sided reads and
 * writes through the transport ops table (shm, tcp, rdma).
 *
 * Owns a worker's connection set: each connection to one accelerator
 * instance, the worker's mqueues on it, its state machine, its reconnects.
 *
 * Per connection, one cycle of the state machine: read the accelerator's
 * control array (all its indices in one read), then read the new TX slots
 * of this worker's mqueues, hand each slot up (the forwarder's hook), then
 * write the TX consumer indices back (lazily: once per cycle). Where the
 * transport has a compound read (tcp's read_tx) the first two steps are
 * one: its agent reads the array and, from it, the new slots, in one round
 * trip. Where the transport pushes answers (tcp's subscribe) there is no
 * poll at all: the agent sends each published slot as it comes, the
 * cycle forwards what arrived and writes the consumer indices back; reads
 * stay for opening, resuming and large messages the push did not carry.
 * Reads are asynchronous so a remote transport pipelines; shm
 * completes them at once. RX slots are written payload and metadata in
 * one posted write (or fenced: payload, a read as barrier, metadata);
 * after a batch every touched connection gets one doorbell (flush and
 * notify).
 *
 * A connection that fails goes out of dispatch, its outstanding requests
 * end (in doubt, or lost when its node was declared down), and it is
 * reopened with jittered backoff while it stays in the table. One that is
 * fenced (-ESTALE: a newer frontend took its region over) ends the same
 * way, its requests counted as fenced; it is reopened with the same
 * backoff, and stays refused until a later table renews desc.producer.
 *
 * Calls no other frontend file and knows no worker: what it needs comes
 * in struct fe_rmq_opts at fe_rmq_init, and upward events go through the
 * struct fe_rmq_hooks registered there, with their context pointer.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "rmq.h"

#define WR_KIND_SHIFT 60
#define WR_CTRL (1ull << WR_KIND_SHIFT)
#define WR_SLOT (2ull << WR_KIND_SHIFT)
#define WR_FENCE (3ull << WR_KIND_SHIFT)
#define WR_TXC (4ull << WR_KIND_SHIFT)
#define WR_SUB (5ull << WR_KIND_SHIFT)
#define WR_KIND(id) ((id) >> WR_KIND_SHIFT)

#define STAGE_BYTES (256u * 1024u) /* TX staging per mqueue per cycle */
/* slots one compound read may bring, over all of a connection's mqueues:
 * an answer stays well within what one transport operation carries */
#define TXC_BYTES (1024u * 1024u)
/* opening a connection: its synchronous reads' deadline; the takeover
 * scan's slots per mqueue per round trip, and the bytes it reads of each:
 * a large slot's reference and the metadata (docs/mqueue.md) */
#define OPEN_WAIT_NS 2000000000ull
#define SCAN_SLOTS 16u
#define SCAN_TAIL 32u

const char *const fe_qdrop_names[FE_QDROP_MAX] = {
    "stale_tag",    "tx_oversize", "tx_bad_seq",  "bad_index",  "app_dropped",
    "expired",      "lost",        "write_error", "send_error", "client_gone",
    "backend_down", "in_doubt",    "fenced"};

const char *const fe_op_names[FE_OP_MAX] = {
    "poll",      "slot_read",     "large_read",  "fence_read",
    "open_read", "request_write", "index_write", "subscribe"};

static const uint8_t zeros[16];

/* One operation of kind k posted on c (counted once the transport took it:
 * rc 0); rc passed through. */
static int op_posted(struct fe_conn *c, enum fe_op k, int rc) {
  if (!rc && c->op_counts)
    lynx_cnt_add(&c->op_counts[k], 1);
  return rc;
}

uint32_t fe_conn_outstanding(const struct fe_conn *c) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < c->n_mqs; i++)
    n += c->mqs[i].dq.outstanding;
  return n;
}

int fe_rmq_arm(struct fe_conn *c, uint32_t bell) {
  int rc;
  if (c->no_bell || (!bell && !c->armed))
    return c->no_bell ? -ENOTSUP : 0;
  for (uint32_t i = 0; i < c->n_mqs; i++)
    c->arm[i] = (struct lynx_arm){c->mqs[i].q, c->mqs[i].tx_cons};
  rc = c->tc->ops->arm(c->tc, bell, c->arm, (int)c->n_mqs);
  if (rc < 0) {
    c->no_bell = 1;
    c->armed = 0;
    return rc;
  }
  c->armed = bell != 0;
  return rc;
}

/* The connection set changed: the layers above rebuild what depends on it
 * (r->lock held). 0, or -errno and they changed nothing. */
static int set_changed(struct fe_rmq *r) {
  int rc = r->hooks->changed(r->ctx);
  if (rc)
    return rc;
  r->n_client_mqs = 0;
  for (uint32_t i = 0; i < r->n_conns; i++)
    r->n_client_mqs += r->conns[i]->n_client_mqs;
  return 0;
}

/* ---- connection failure ------------------------------------------- */

#define RETRY_MIN_NS (100u * 1000u * 1000u)
#define RETRY_MAX_NS (5000ull * 1000u * 1000u)

/* Schedules the next attempt to reopen a dead connection (jittered
 * exponential backoff). */
static void retry_later(struct fe_rmq *r, struct fe_conn *c) {
  c->retry_ns =
      lynx_now_ns() + lynx_backoff_next(&c->retry_wait_ns, RETRY_MIN_NS,
                                        RETRY_MAX_NS, r->opts.retry_seed);
}

/* Takes a connection out of dispatch: its mqueues leave the dispatcher and
 * every request outstanding on them ends, counted as reason: lost when
 * its node was declared down (its agent's lease fence guarantees it never
 * runs later), in doubt when the accelerator may still run it (docs/
 * design.md, "Delivery guarantees"). */
void fe_rmq_down(struct fe_rmq *r, struct fe_conn *c, const char *why,
                 enum fe_qdrop reason) {
  if (c->state == FE_CONN_DEAD)
    return;
  LYNX_WARN("frontend",
            "worker %u: accelerator %s/%u (instance %llu) out "
            "of dispatch: %s",
            r->opts.worker, c->acc.node, c->acc.desc.accel_id,
            (unsigned long long)c->acc.instance_id, why);
  c->state = FE_CONN_DEAD;
  retry_later(r, c);
  for (uint32_t i = 0; i < c->n_mqs; i++) {
    struct fe_mq *mq = &c->mqs[i];
    uint32_t n =
        lynx_tag_release_mq(r->opts.tags, mq->gid, r->hooks->lost, r->ctx);
    mq->dq.up = 0;
    fe_mq_outstanding_set(mq, 0);
    lynx_cnt_add(&mq->drops[reason], n);
  }
  if (c->tc) {
    c->tc->ops->close(c->tc);
    c->tc = NULL;
  }
}

void fe_rmq_fail(struct fe_rmq *r, struct fe_conn *c, int rc) {
  char why[96];
  if (rc == -ESTALE) { /* only fencing makes a data-path op say so */
    LYNX_LOG_RL(LYNX_LOG_WARN, "frontend",
                "worker %u: accelerator %s/%u: "
                "fenced: a newer frontend (than our epoch %llu) took this "
                "region over",
                r->opts.worker, c->acc.node, c->acc.desc.accel_id,
                (unsigned long long)c->acc.desc.producer);
    fe_rmq_down(r, c, "fenced by a newer frontend", FE_QDROP_FENCED);
    return;
  }
  snprintf(why, sizeof(why), "transport error: %s", strerror(-rc));
  fe_rmq_down(r, c, why, FE_QDROP_IN_DOUBT);
}

/* ---- the remote rings ------------------------------------------------ */

/* Writes a message longer than a slot into mq's RX large area: *ref says
 * where, for the slot. The area is only taken (rx_large_taken) once the
 * slot is written too. 0 or -errno (-ENOSPC: no room until the
 * accelerator releases earlier ones). */
static int write_large(struct fe_conn *c, struct fe_mq *mq, const void *data,
                       uint32_t len, struct lynx_large_ref *ref) {
  const struct lynx_geom *g = &c->acc.g;
  struct iovec iov = {(void *)data, len};
  uint32_t start;
  if (len > g->large_bytes)
    return -EMSGSIZE;
  if (lynx_large_place(&mq->rx_la, g->large_bytes, len, &start))
    return -ENOSPC;
  *ref = lynx_large_ref_at(start, len, g->large_bytes);
  /* ordered before the slot that names it (coalesced: placed in order;
   * fenced: the slot's barrier read follows it too) */
  return op_posted(c, FE_OP_REQUEST_WRITE,
                   c->tc->ops->writev(c->tc,
                                      lynx_rx_large_off(g, mq->q) + ref->off,
                                      &iov, 1, 0));
}

/* The large request at ring position pos is written: its area is taken
 * until the accelerator releases that position. */
static void rx_large_taken(struct fe_mq *mq, uint32_t pos, uint32_t end) {
  uint32_t mask = mq->conn->acc.g.slots - 1;
  uint32_t at = (mq->rx_lfirst + mq->rx_ln) & mask;
  mq->rx_lpos[at] = pos;
  mq->rx_lend[at] = end;
  mq->rx_ln++;
  mq->rx_la.head = end;
}

/* The accelerator released up to dq.rx_cons: free the large area of the
 * large requests before it. */
static void rx_large_release(struct fe_mq *mq) {
  uint32_t mask = mq->conn->acc.g.slots - 1;
  while (mq->rx_ln &&
         (int32_t)(mq->rx_lpos[mq->rx_lfirst] - mq->dq.rx_cons) < 0) {
    lynx_large_free(&mq->rx_la, mq->rx_lend[mq->rx_lfirst]);
    mq->rx_lfirst = (mq->rx_lfirst + 1) & mask;
    mq->rx_ln--;
  }
}

int fe_write_rx(struct fe_rmq *r, struct fe_mq *mq, const void *data,
                uint32_t len, uint32_t tag, uint16_t status) {
  struct fe_conn *c = mq->conn;
  const struct lynx_geom *g = &c->acc.g;
  uint32_t pos = mq->dq.rx_prod, poff;
  uint64_t slot = lynx_slot_off(g, lynx_rx_ring_off(g, mq->q), pos);
  struct lynx_tconn *tc = c->tc;
  struct lynx_large_ref ref;
  struct lynx_slot_meta m;
  struct iovec iov[3];
  int large = len > lynx_slot_cap(g->slot_size), rc;
  if (large) {
    rc = write_large(c, mq, data, len, &ref);
    if (rc)
      return rc;
    data = &ref;
    len = sizeof(ref);
    status = (uint16_t)(status | LYNX_ST_LARGE);
  }
  poff = lynx_payload_off(g->slot_size, len);
  m = (struct lynx_slot_meta){len, tag, status, (uint16_t)(poff / 16u),
                              lynx_seq_for(pos)};
  iov[0] = (struct iovec){(void *)data, len};
  iov[1] =
      (struct iovec){(void *)zeros, lynx_slot_cap(g->slot_size) - poff - len};
  iov[2] = (struct iovec){&m, sizeof(m)};
  if (c->acc.desc.ordering == LYNX_ORDER_COALESCED) {
    rc = op_posted(c, FE_OP_REQUEST_WRITE,
                   tc->ops->writev(tc, slot + poff, iov, 3, LYNX_WR_PUBLISH));
  } else {
    /* fenced: payload, a read as write barrier, then the metadata */
    rc = op_posted(c, FE_OP_REQUEST_WRITE,
                   tc->ops->writev(tc, slot + poff, iov, 2, 0));
    if (!rc)
      /* any read of the region flushes the posted payload ahead of it;
       * the mqueue's actrl word, small and never written by a frontend */
      rc = op_posted(c, FE_OP_FENCE_READ,
                     tc->ops->read(tc, lynx_actrl_off(g, mq->q),
                                   r->fence_scratch, 4, WR_FENCE));
    if (!rc)
      rc = op_posted(c, FE_OP_REQUEST_WRITE,
                     tc->ops->writev(tc, slot + g->slot_size - LYNX_META_SIZE,
                                     &iov[2], 1,
                                     LYNX_WR_PUBLISH | LYNX_WR_FENCE));
  }
  if (!rc && large)
    rx_large_taken(mq, pos, ref.end);
  return rc;
}

/* c's consumer indices as posted went out with a flush. */
static void index_flushed(struct fe_conn *c) {
  for (uint32_t i = 0; i < c->n_mqs; i++)
    c->mqs[i].tx_cons_flushed = c->mqs[i].tx_cons;
  c->index_lazy = 0;
}

/* Where answers are pushed, the consumer indices written back after
 * forwarding go out with the next flush: the next request's doorbell,
 * ahead of that request in the stream, under load (one send for both),
 * or fe_rmq_flush_indices when the worker's work runs out. The
 * accelerator needs them sooner only to reuse TX room: at once for a
 * client mqueue (its requests to back ends come unasked), or once half a
 * ring was forwarded since the last went out. */
static int index_urgent(const struct fe_conn *c) {
  if (c->n_client_mqs)
    return 1;
  for (uint32_t i = 0; i < c->n_mqs; i++)
    if (c->mqs[i].tx_cons - c->mqs[i].tx_cons_flushed >= c->acc.g.slots / 2)
      return 1;
  return 0;
}

void fe_rmq_flush_indices(struct fe_rmq *r) {
  for (uint32_t i = 0; i < r->n_conns; i++) {
    struct fe_conn *c = r->conns[i];
    int rc;
    if (!c->index_lazy || c->state == FE_CONN_DEAD)
      continue;
    rc = c->tc->ops->flush(c->tc);
    if (!rc)
      index_flushed(c);
    else if (rc != -ENOBUFS)
      fe_rmq_fail(r, c, rc);
  }
}

void fe_rmq_doorbells(struct fe_rmq *r) {
  for (uint32_t i = 0; i < r->n_conns; i++) {
    struct fe_conn *c = r->conns[i];
    int rc;
    if (!c->dirty || c->state == FE_CONN_DEAD)
      continue;
    rc = c->tc->ops->flush(c->tc);
    if (rc == -ENOBUFS)
      continue; /* rung again next iteration */
    c->dirty = 0;
    if (!rc)
      index_flushed(c);
    if (!rc) {
      rc = c->tc->ops->notify(c->tc);
      if (rc == -ENOTSUP || rc == -ENOBUFS)
        rc = 0;
    }
    if (rc)
      fe_rmq_fail(r, c, rc);
  }
}

/* ---- one connection's cycle ---------------------------------------- */

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
              mq->conn->acc.node, mq->conn->acc.desc.accel_id, mq->q, which, v,
              mq->dq.rx_cons, mq->dq.rx_prod, mq->tx_cons);
}

/* Posts the reads of mq's (the i-th of c) next n TX slots into its stage:
 * one read, or two where the slots wrap around the ring's end. 0, or
 * -ENOBUFS when the transport has no room for more reads in flight (what
 * was not posted, beyond mq->tx_staged, is read next cycle), or another
 * error. */
static int post_slot_reads(struct fe_conn *c, struct fe_mq *mq, uint32_t i,
                           uint32_t n) {
  const struct lynx_geom *g = &c->acc.g;
  uint64_t ring = lynx_tx_ring_off(g, mq->q);
  for (uint32_t done = 0; done < n;) {
    uint32_t at = (mq->tx_cons + done) & (g->slots - 1);
    uint32_t k = g->slots - at < n - done ? g->slots - at : n - done;
    int rc =
        op_posted(c, FE_OP_SLOT_READ,
                  c->tc->ops->read(c->tc, ring + (uint64_t)at * g->slot_size,
                                   mq->stage + (size_t)done * g->slot_size,
                                   (size_t)k * g->slot_size, WR_SLOT | i));
    if (rc)
      return rc;
    c->reads_pending++;
    done += k;
    mq->tx_staged = done;
  }
  return 0;
}

/* mq's word of the control array arrived: refresh flow control. Returns
 * the TX slots published beyond tx_cons (0 also for a bad tx_prod). */
static uint32_t mq_on_ctrl(struct fe_mq *mq, struct lynx_actrl a) {
  uint32_t avail;
  /* rx_cons may only move forward within what we produced; a bad value
   * is ignored (flow control keeps the last good one) */
  if (a.rx_cons - mq->dq.rx_cons <= mq->dq.rx_prod - mq->dq.rx_cons) {
    mq->dq.rx_cons = a.rx_cons;
    if (mq->rx_ln)
      rx_large_release(mq);
  } else
    bad_index(mq, "rx_cons", a.rx_cons);
  avail = a.tx_prod - mq->tx_cons;
  if (avail > mq->conn->acc.g.slots) {
    bad_index(mq, "tx_prod", a.tx_prod);
    return 0;
  }
  return avail;
}

/* The actrl array arrived: refresh flow control, post reads of new TX
 * slots. */
static int conn_on_ctrl(struct fe_conn *c) {
  struct lynx_tconn *tc = c->tc;
  int rc;
  for (uint32_t i = 0; i < c->n_mqs; i++) {
    struct fe_mq *mq = &c->mqs[i];
    uint32_t avail = mq_on_ctrl(mq, c->snap[mq->q]);
    if (avail == 0)
      continue;
    rc = post_slot_reads(c, mq, i,
                         avail < mq->stage_slots ? avail : mq->stage_slots);
    if (rc == -ENOBUFS)
      break;
    if (rc)
      return rc;
  }
  c->state = c->reads_pending ? FE_CONN_SLOTS : FE_CONN_IDLE;
  rc = c->reads_pending ? tc->ops->flush(tc) : 0;
  c->flush_again = rc == -ENOBUFS; /* the reads are posted: rung next cycle */
  return rc == -ENOBUFS ? 0 : rc;
}

/* A compound read arrived: the array refreshes flow control as above, and
 * the slots it names are staged already (the transport checked that each
 * count is the one the array gives). */
static void conn_on_txc(struct fe_conn *c) {
  for (uint32_t i = 0; i < c->n_mqs; i++) {
    struct fe_mq *mq = &c->mqs[i];
    mq_on_ctrl(mq, c->snap[mq->q]);
    mq->tx_staged = c->txr[i].got;
  }
  c->state = FE_CONN_SLOTS;
}

/* Posts a cycle's first read: the compound read where the transport has
 * one, else the control array's (its completion posts the slot reads). */
static int post_poll(struct fe_conn *c) {
  struct lynx_tconn *tc = c->tc;
  if (!c->two_step) {
    int rc;
    for (uint32_t i = 0; i < c->n_mqs; i++)
      c->txr[i].from = c->mqs[i].tx_cons;
    rc = tc->ops->read_tx(tc, c->snap, c->txr, (int)c->n_mqs, WR_TXC);
    if (rc != -ENOTSUP && rc != -EMSGSIZE)
      return op_posted(c, FE_OP_POLL, rc);
    c->two_step = 1; /* for as long as this connection lives */
  }
  return op_posted(c, FE_OP_POLL,
                   tc->ops->read(tc, c->acc.g.actrl_off, c->snap,
                                 8u * c->acc.g.n_mqueues, WR_CTRL));
}

#define LARGE_READ_MAX (1u << 20) /* one read of a large message, bytes */

/* The k-th of mq's (the idx-th of c) staged TX slots, ring position pos:
 * in its stage (read), or where answers are pushed in the copy of its
 * ring (sub), at that position. */
static const uint8_t *staged_slot(const struct fe_conn *c,
                                  const struct fe_mq *mq, uint32_t idx,
                                  uint32_t k, uint32_t pos) {
  const struct lynx_geom *g = &c->acc.g;
  if (c->pushing)
    return c->sub[idx].ring + (size_t)(pos & (g->slots - 1)) * g->slot_size;
  return mq->stage + (size_t)k * g->slot_size;
}

/* The staged slots are in: posts the reads of the large messages they
 * name into each mqueue's lbuf, and says where each one's bytes will be
 * (ldata). Slots from one that does not fit lbuf on are left for the next
 * cycle. Returns reads posted (>= 0) or -errno. */
static int post_large_reads(struct fe_conn *c) {
  const struct lynx_geom *g = &c->acc.g;
  uint32_t z = g->slot_size, L = g->large_bytes;
  int posted = 0;
  if (!L)
    return 0;
  for (uint32_t i = 0; i < c->n_mqs; i++) {
    struct fe_mq *mq = &c->mqs[i];
    uint64_t area = lynx_tx_large_off(g, mq->q);
    uint32_t used = 0;
    memset(mq->ldata, 0, mq->tx_staged * sizeof(*mq->ldata));
    for (uint32_t k = 0; k < mq->tx_staged; k++) {
      const uint8_t *slot = staged_slot(c, mq, i, k, mq->tx_cons + k);
      struct lynx_slot_meta m;
      struct lynx_large_ref ref;
      uint32_t done = 0;
      int large = lynx_slot_large(slot, z, L, &m, &ref);
      if (m.seq != lynx_seq_for(mq->tx_cons + k))
        break; /* not published: the forwarder stops here */
      if (!large)
        continue;       /* not large, or malformed: the forwarder judges */
      if (c->pushing) { /* pushed with its slot: in the area's copy */
        const struct lynx_tx_large *lm =
            &c->sub[i].lmsg[(mq->tx_cons + k) & (g->slots - 1)];
        if (lm->len == ref.len && lm->off == ref.off) {
          mq->ldata[k] = c->sub[i].large + ref.off;
          mq->llen[k] = ref.len;
          continue;
        }
      }
      if (ref.len > L - used) {
        mq->tx_staged = k; /* the rest next cycle, lbuf empty again */
        break;
      }
      while (done < ref.len) {
        uint32_t n =
            ref.len - done < LARGE_READ_MAX ? ref.len - done : LARGE_READ_MAX;
        int rc =
            op_posted(c, FE_OP_LARGE_READ,
                      c->tc->ops->read(c->tc, area + ref.off + done,
                                       mq->lbuf + used + done, n, WR_SLOT | i));
        if (rc == -ENOBUFS && done == 0)
          break; /* the transport is full: this one next cycle */
        if (rc)
          return rc;
        c->reads_pending++;
        posted++;
        done += n;
      }
      if (done < ref.len) {
        mq->tx_staged = k;
        break;
      }
      mq->ldata[k] = mq->lbuf + used;
      mq->llen[k] = ref.len;
      used += ref.len;
    }
  }
  return posted;
}

/* All slot reads are in: forward, then write TX consumer indices back. */
static int conn_on_slots(struct fe_rmq *r, struct fe_conn *c) {
  const struct lynx_geom *g = &c->acc.g;
  uint32_t sent = 0;
  int rc;
  for (uint32_t i = 0; i < c->n_mqs; i++) {
    struct fe_mq *mq = &c->mqs[i];
    for (uint32_t k = 0; k < mq->tx_staged; k++) {
      const uint8_t *large = g->large_bytes ? mq->ldata[k] : NULL;
      if (r->hooks->slot(r->ctx, mq, staged_slot(c, mq, i, k, mq->tx_cons),
                         mq->tx_cons, large, large ? mq->llen[k] : 0) != 0)
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
    rc = op_posted(c, FE_OP_INDEX_WRITE,
                   c->tc->ops->writev(c->tc, lynx_fctrl_off(g, mq->q), &iov, 1,
                                      LYNX_WR_PUBLISH));
    if (rc == -ENOBUFS)
      break; /* the transport is full: written back next cycle */
    if (rc)
      return rc;
    mq->tx_cons_dirty = 0;
  }
  c->state = FE_CONN_IDLE;
  c->index_lazy |= sent != 0;
  if (sent && (!c->pushing || index_urgent(c))) {
    rc = c->tc->ops->flush(c->tc);
    c->flush_again = rc == -ENOBUFS;
    if (rc && rc != -ENOBUFS)
      return rc;
    if (!rc)
      index_flushed(c);
  }
  return (int)sent;
}

/* The slots are staged (read, or pushed): once their reads are in, the
 * reads of the large messages they name (those a push did not carry),
 * then, once those are in, the forwarder. Slots handled, or -errno. */
static int conn_staged(struct fe_rmq *r, struct fe_conn *c) {
  int rc;
  if (c->state == FE_CONN_SLOTS && c->reads_pending == 0) {
    rc = post_large_reads(c);
    if (rc < 0)
      return rc;
    c->state = FE_CONN_LARGE;
    if (rc > 0) {
      rc = c->tc->ops->flush(c->tc);
      c->flush_again = rc == -ENOBUFS;
      if (rc && rc != -ENOBUFS)
        return rc;
    }
  }
  if (c->state == FE_CONN_LARGE && c->reads_pending == 0)
    return conn_on_slots(r, c);
  return 0;
}

/* A cycle where answers are pushed: poll applies what came (and reports
 * large reads), the words pushed refresh flow control as the control
 * array's would, and the slots they announce are forwarded from the
 * ring's copy. One batch of slots per call: the worker sends what it
 * forwarded before the next, which may bring slots into the positions
 * those leave (the consumer index written back frees them). Slots
 * handled, or -errno. */
static int push_cycle(struct fe_rmq *r, struct fe_conn *c) {
  struct lynx_tconn *tc = c->tc;
  uint64_t ids[32];
  int n;
  if (c->state == FE_CONN_IDLE && fe_conn_outstanding(c) == 0 &&
      !c->n_client_mqs)
    return 0; /* nothing awaited: what came waits in the socket */
  n = tc->ops->poll(tc, ids, (int)LYNX_ARRAY_SIZE(ids));
  if (n < 0)
    return n;
  for (int i = 0; i < n; i++)
    if (WR_KIND(ids[i]) == 2 && c->reads_pending) /* WR_SLOT: large */
      c->reads_pending--;
  if (c->state == FE_CONN_IDLE) {
    uint32_t staged = 0;
    for (uint32_t i = 0; i < c->n_mqs; i++) {
      struct fe_mq *mq = &c->mqs[i];
      uint32_t avail = mq_on_ctrl(
          mq, (struct lynx_actrl){c->sub[i].prod, c->sub[i].rx_cons});
      mq->tx_staged = avail < mq->stage_slots ? avail : mq->stage_slots;
      staged += mq->tx_staged;
    }
    if (!staged)
      return 0;
    c->state = FE_CONN_SLOTS;
  }
  return conn_staged(r, c);
}

int fe_rmq_progress(struct fe_rmq *r, struct fe_conn *c) {
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
  if (c->pushing) {
    rc = push_cycle(r, c);
    if (rc < 0)
      goto fail;
    return rc;
  }
  if (c->state == FE_CONN_IDLE) {
    /* Responses come only for requests in flight: with none, polling the
     * control array would only cost the agent (tcp) or the NIC (rdma). Its
     * rx_cons is read again with the next request's first cycle. */
    if (fe_conn_outstanding(c) == 0 && !c->n_client_mqs)
      return 0;
    rc = post_poll(c);
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
        rc = conn_on_ctrl(c);
        if (rc)
          goto fail;
        break;
      case 2: /* WR_SLOT */
        if (c->reads_pending)
          c->reads_pending--;
        break;
      case 4: /* WR_TXC */
        conn_on_txc(c);
        break;
      default: /* fence reads carry no data we use */
        break;
      }
    }
    rc = conn_staged(r, c);
    if (rc < 0)
      goto fail;
    work += rc;
  }
  return work;
fail:
  fe_rmq_fail(r, c, rc);
  return work;
}

/* ---- connections come and go (worker thread) ------------------------ */

/* Waits for n reads posted and flushed on tc (synchronous use when a
 * connection opens: shm answers at once, a remote transport within the
 * deadline). 0 or -errno. */
static int wait_reads(struct lynx_tconn *tc, uint32_t n, uint64_t deadline) {
  uint64_t ids[16];
  while (n) {
    int rc = tc->ops->poll(tc, ids, n < 16 ? (int)n : 16);
    if (rc < 0)
      return rc;
    if (rc == 0 && lynx_now_ns() > deadline)
      return -ETIMEDOUT;
    n -= (uint32_t)rc;
  }
  return 0;
}

/* Reads the accelerator's indices synchronously (when a connection is
 * added). */
static int conn_resume(struct fe_conn *c) {
  struct lynx_tconn *tc = c->tc;
  int rc = op_posted(c, FE_OP_OPEN_READ,
                     tc->ops->read(tc, c->acc.g.actrl_off, c->snap,
                                   8u * c->acc.g.n_mqueues, WR_CTRL));
  if (!rc)
    rc = tc->ops->flush(tc);
  return rc ? rc : wait_reads(tc, 1, lynx_now_ns() + OPEN_WAIT_NS);
}

/* One published slot the scan found at ring position pos (tail: its last
 * SCAN_TAIL bytes): a large one keeps its area taken until the
 * accelerator releases pos, so new large requests go after it. A
 * reference this area could not hold (not the frontend's writing) is
 * left out, counted as a bad index: that request may read bytes a later
 * one overwrites. */
static void scan_take(struct fe_mq *mq, uint32_t pos, const uint8_t *tail,
                      const struct lynx_slot_meta *m) {
  uint32_t size = mq->conn->acc.g.large_bytes, start;
  struct lynx_large_ref ref;
  if (!(m->status & LYNX_ST_LARGE))
    return;
  /* the frontend writes a reference right before the metadata */
  memcpy(&ref, tail, sizeof(ref));
  start = ref.end - lynx_large_end(0, ref.len);
  if (!size || m->len != sizeof(ref) ||
      m->off16 * 16u != mq->conn->acc.g.slot_size - SCAN_TAIL || ref.len == 0 ||
      ref.len > size || ref.off != (start & (size - 1)) ||
      ref.off + ref.len > size ||
      (mq->rx_ln &&
       (start - mq->rx_la.head > size || ref.end - mq->rx_la.tail > size))) {
    bad_index(mq, "large reference end", ref.end);
    return;
  }
  if (!mq->rx_ln)
    mq->rx_la.head = mq->rx_la.tail = start;
  rx_large_taken(mq, pos, ref.end);
}

/*
 * Finds where c's RX rings resume. The region may hold requests an earlier
 * producer published and the accelerator has not consumed yet: a fenced
 * frontend's, or this worker's before its connection broke. They are the
 * accelerator's to run (their answers come back as stale tags); writing
 * over them would race the accelerator reading them, and the accelerator,
 * consuming them too, would move rx_cons past what this producer wrote.
 * So each ring resumes after the run of slots published in their lap from
 * rx_cons on (seq = position + 1; the next slot holds an older lap's),
 * read SCAN_SLOTS slot tails per mqueue per round trip. Transports cut
 * the old producer before admitting this one (tcp: on the agent's
 * thread; rdma: its QP in error first), so the run no longer grows; shm
 * has the residual window of docs/mqueue.md. rx_prod = rx_cons = the
 * snapshot's rx_cons on entry.
 */
static int conn_scan_rx(struct fe_conn *c) {
  const struct lynx_geom *g = &c->acc.g;
  struct lynx_tconn *tc = c->tc;
  uint64_t deadline = lynx_now_ns() + OPEN_WAIT_NS;
  uint32_t *posted = calloc(c->n_mqs, sizeof(*posted));
  uint8_t *buf = malloc((size_t)c->n_mqs * SCAN_SLOTS * SCAN_TAIL);
  uint8_t *open = calloc(c->n_mqs, 1);
  uint32_t n_open = c->n_mqs;
  int rc = 0;
  if (!posted || !buf || !open) {
    rc = -ENOMEM;
    goto out;
  }
  memset(open, 1, c->n_mqs);
  while (n_open && !rc) {
    uint32_t n = 0;
    /* (a round the transport cut short leaves the rest at 0) */
    memset(posted, 0, c->n_mqs * sizeof(*posted));
    for (uint32_t i = 0; i < c->n_mqs && !rc; i++) {
      struct fe_mq *mq = &c->mqs[i];
      uint64_t ring = lynx_rx_ring_off(g, mq->q);
      for (uint32_t k = 0; open[i] && k < SCAN_SLOTS &&
                           mq->dq.rx_prod + k - mq->dq.rx_cons < g->slots;
           k++) {
        rc = op_posted(
            c, FE_OP_OPEN_READ,
            tc->ops->read(tc,
                          lynx_slot_off(g, ring, mq->dq.rx_prod + k) +
                              g->slot_size - SCAN_TAIL,
                          buf + ((size_t)i * SCAN_SLOTS + k) * SCAN_TAIL,
                          SCAN_TAIL, WR_CTRL));
        if (rc)
          break;
        posted[i]++;
        n++;
      }
    }
    if (rc == -ENOBUFS && n) /* the rest next round */
      rc = 0;
    if (!rc)
      rc = tc->ops->flush(tc);
    if (!rc)
      rc = wait_reads(tc, n, deadline);
    for (uint32_t i = 0; i < c->n_mqs && !rc; i++) {
      struct fe_mq *mq = &c->mqs[i];
      int more = open[i];
      for (uint32_t k = 0; more && k < posted[i]; k++) {
        const uint8_t *tail = buf + ((size_t)i * SCAN_SLOTS + k) * SCAN_TAIL;
        struct lynx_slot_meta m;
        memcpy(&m, tail + SCAN_TAIL - LYNX_META_SIZE, sizeof(m));
        more = m.seq == lynx_seq_for(mq->dq.rx_prod);
        if (more) {
          scan_take(mq, mq->dq.rx_prod, tail, &m);
          mq->dq.rx_prod++;
        }
      }
      /* ended, or full: every slot is the accelerator's */
      if (open[i] && (!more || mq->dq.rx_prod - mq->dq.rx_cons == g->slots)) {
        open[i] = 0;
        n_open--;
      }
    }
  }
out:
  free(posted);
  free(buf);
  free(open);
  return rc;
}

static void conn_free(struct fe_rmq *r, struct fe_conn *c) {
  if (c->tc)
    c->tc->ops->close(c->tc);
  for (uint32_t i = 0; c->mqs && i < c->n_mqs; i++) {
    free(c->mqs[i].stage);
    free(c->mqs[i].rx_lpos);
    free(c->mqs[i].rx_lend);
    free(c->mqs[i].lbuf);
    free(c->mqs[i].ldata);
    free(c->mqs[i].llen);
    if (c->mqs[i].be)
      r->hooks->be_close(c->mqs[i].be);
  }
  for (uint32_t i = 0; c->sub && i < c->n_mqs; i++) {
    free(c->sub[i].ring);
    free(c->sub[i].large);
    free(c->sub[i].lmsg);
  }
  free(c->sub);
  free(c->mqs);
  free(c->snap);
  free(c->txr);
  free(c->arm);
  free(c);
}

/* Asks c's agent to push answers from where the rings resume (each
 * mqueue's tx_cons and rx_cons), into copies of the TX rings and large
 * areas allocated at the first time. 0 with c->pushing set where it does,
 * 0 where it does not (the transport or the agent: the cycle polls), or
 * -errno when the transport failed. */
static int conn_subscribe(struct fe_rmq *r, struct fe_conn *c) {
  const struct lynx_geom *g = &c->acc.g;
  struct lynx_tconn *tc = c->tc;
  int rc;
  c->pushing = 0;
  if (r->opts.no_push || tc->ops->subscribe == lynx__subscribe_none)
    return 0;
  if (!c->sub) {
    int ok = (c->sub = calloc(c->n_mqs, sizeof(*c->sub))) != NULL;
    for (uint32_t i = 0; ok && i < c->n_mqs; i++) {
      struct lynx_tx_sub *t = &c->sub[i];
      t->ring = malloc(g->slots_bytes);
      t->large = g->large_bytes ? malloc(g->large_bytes) : NULL;
      t->lmsg = g->large_bytes ? calloc(g->slots, sizeof(*t->lmsg)) : NULL;
      ok = t->ring && (!g->large_bytes || (t->large && t->lmsg));
    }
    if (!ok) {
      LYNX_LOG_RL(LYNX_LOG_WARN, "frontend",
                  "worker %u: accelerator %s/%u: no memory for copies of "
                  "its TX rings: its answers are polled for",
                  r->opts.worker, c->acc.node, c->acc.desc.accel_id);
      return 0; /* conn_free frees what was allocated */
    }
  }
  for (uint32_t i = 0; i < c->n_mqs; i++) {
    struct lynx_tx_sub *t = &c->sub[i];
    t->q = c->mqs[i].q;
    t->from = t->prod = c->mqs[i].tx_cons;
    t->rx_cons = c->mqs[i].dq.rx_cons;
    t->flags = c->mqs[i].be ? LYNX_SUB_RX_EAGER : 0;
    if (t->lmsg)
      memset(t->lmsg, 0, g->slots * sizeof(*t->lmsg));
  }
  c->push = (struct lynx_push){c->sub, (int)c->n_mqs, 0};
  rc = op_posted(c, FE_OP_SUBSCRIBE, tc->ops->subscribe(tc, &c->push, WR_SUB));
  if (rc == -ENOTSUP)
    return 0;
  if (!rc)
    rc = tc->ops->flush(tc);
  if (!rc)
    rc = wait_reads(tc, 1, lynx_now_ns() + OPEN_WAIT_NS);
  if (rc)
    return rc;
  c->pushing = c->push.state == 1;
  return 0;
}

/* Connects (or reconnects) c's transport and takes its rings over where
 * they are: the region may have served an earlier frontend or this one
 * before the connection broke; the RX rings resume after the requests
 * still published there (conn_scan_rx), and responses to those show up
 * as stale tags. On success c is in dispatch. */
static int conn_open(struct fe_rmq *r, struct fe_conn *c) {
  const struct fe_accel *acc = &c->acc;
  uint64_t earlier = 0;
  int rc = acc->ops->connect(&acc->desc, &c->tc);
  if (rc) {
    c->tc = NULL;
    /* -ESTALE: fenced (a newer frontend epoch holds the region) or a
     * descriptor of an older incarnation; the transport logged which.
     * Either way only a newer table helps: the backoff paces retries. */
    LYNX_LOG_RL(LYNX_LOG_WARN, "frontend",
                "worker %u: cannot connect to "
                "accelerator %s/%u (%s %s, frontend epoch %llu): %s%s",
                r->opts.worker, acc->node, acc->desc.accel_id,
                acc->desc.transport, acc->desc.locator,
                (unsigned long long)acc->desc.producer, strerror(-rc),
                rc == -ESTALE ? " (fenced by a newer frontend, or a stale "
                                "descriptor)"
                              : "");
    return rc;
  }
  rc = conn_resume(c);
  if (rc) {
    LYNX_LOG_RL(LYNX_LOG_WARN, "frontend",
                "worker %u: cannot read "
                "accelerator %s/%u's indices: %s",
                r->opts.worker, acc->node, acc->desc.accel_id, strerror(-rc));
    goto fail;
  }
  for (uint32_t i = 0; i < c->n_mqs; i++) {
    struct fe_mq *mq = &c->mqs[i];
    mq->dq.rx_prod = mq->dq.rx_cons = c->snap[mq->q].rx_cons;
    /* what an earlier connection wrote is in the accelerator's hands:
     * the scan finds it; new requests, large ones too, go after it */
    mq->rx_la.tail = mq->rx_la.head;
    mq->rx_ln = 0;
    mq->rx_lfirst = 0;
  }
  rc = conn_scan_rx(c);
  if (rc) {
    LYNX_LOG_RL(LYNX_LOG_WARN, "frontend",
                "worker %u: cannot read "
                "accelerator %s/%u's RX rings: %s",
                r->opts.worker, acc->node, acc->desc.accel_id, strerror(-rc));
    goto fail;
  }
  for (uint32_t i = 0; i < c->n_mqs; i++) {
    struct fe_mq *mq = &c->mqs[i];
    struct iovec iov = {&mq->tx_cons, 4};
    earlier += mq->dq.rx_prod - mq->dq.rx_cons;
    mq->tx_cons = mq->tx_cons_flushed = c->snap[mq->q].tx_prod;
    mq->tx_staged = 0;
    mq->tx_cons_dirty = 0;
    rc = op_posted(c, FE_OP_INDEX_WRITE,
                   c->tc->ops->writev(c->tc, lynx_fctrl_off(&acc->g, mq->q),
                                      &iov, 1, LYNX_WR_PUBLISH));
    if (rc)
      goto fail;
  }
  rc = c->tc->ops->flush(c->tc);
  if (!rc)
    rc = conn_subscribe(r, c);
  if (rc)
    goto fail;
  if (earlier)
    LYNX_INFO("frontend",
              "worker %u: accelerator %s/%u: resuming after %llu "
              "requests an earlier producer published (the accelerator "
              "still runs them)",
              r->opts.worker, acc->node, acc->desc.accel_id,
              (unsigned long long)earlier);
  c->state = FE_CONN_IDLE;
  c->reads_pending = 0;
  c->dirty = 0;
  c->two_step = 0; /* the transport may offer a compound read again */
  /* a frontend that died asleep left its bell in waiter: withdrawn (also
   * tells whether this accelerator rings at all) */
  c->no_bell = 0;
  c->armed = 1;
  fe_rmq_arm(c, 0);
  for (uint32_t i = 0; i < c->n_mqs; i++)
    c->mqs[i].dq.up = 1;
  return 0;
fail:
  c->tc->ops->close(c->tc);
  c->tc = NULL;
  return rc;
}

/* The slots a compound read asks of each of n mqueues: its stage, within
 * TXC_BYTES over all of them, and at least one. */
static uint32_t txc_slots(const struct fe_accel *acc, uint32_t n,
                          uint32_t stage_slots) {
  uint32_t k = TXC_BYTES / n / acc->g.slot_size;
  if (k == 0)
    k = 1;
  return k < stage_slots ? k : stage_slots;
}

int fe_rmq_add(struct fe_rmq *r, const struct fe_accel *acc) {
  const struct fe_rmq_opts *o = &r->opts;
  struct fe_conn *c, **conns;
  uint32_t n = 0;
  int rc;
  for (uint32_t q = o->worker; q < acc->g.n_mqueues; q += o->n_workers)
    n++;
  if (n == 0) {
    LYNX_WARN("frontend",
              "worker %u: instance %llu has %u mqueues for %u "
              "workers: this worker gets none",
              o->worker, (unsigned long long)acc->instance_id, acc->g.n_mqueues,
              o->n_workers);
    return 0;
  }
  c = calloc(1, sizeof(*c));
  if (!c)
    return -ENOMEM;
  c->acc = *acc;
  c->op_counts = r->op_counts;
  c->snap = calloc(acc->g.n_mqueues, sizeof(*c->snap));
  c->mqs = calloc(n, sizeof(*c->mqs));
  c->txr = calloc(n, sizeof(*c->txr));
  c->arm = calloc(n, sizeof(*c->arm));
  if (!c->snap || !c->mqs || !c->txr || !c->arm) {
    rc = -ENOMEM;
    goto fail;
  }
  for (uint32_t q = o->worker; q < acc->g.n_mqueues; q += o->n_workers) {
    struct fe_mq *mq = &c->mqs[c->n_mqs++];
    mq->conn = c;
    mq->q = q;
    mq->gid = r->next_gid++;
    mq->dq.slots = acc->g.slots;
    mq->stage_slots = STAGE_BYTES / acc->g.slot_size;
    if (mq->stage_slots == 0)
      mq->stage_slots = 1;
    if (mq->stage_slots > acc->g.slots)
      mq->stage_slots = acc->g.slots;
    mq->stage = malloc((size_t)mq->stage_slots * acc->g.slot_size);
    mq->ldata = calloc(mq->stage_slots, sizeof(*mq->ldata));
    mq->llen = calloc(mq->stage_slots, sizeof(*mq->llen));
    if (!mq->stage || !mq->ldata || !mq->llen) {
      rc = -ENOMEM;
      goto fail;
    }
    c->txr[c->n_mqs - 1] = (struct lynx_tx_read){
        .q = q, .max = txc_slots(acc, n, mq->stage_slots), .dst = mq->stage};
    if (acc->g.large_bytes) {
      mq->rx_lpos = calloc(acc->g.slots, sizeof(*mq->rx_lpos));
      mq->rx_lend = calloc(acc->g.slots, sizeof(*mq->rx_lend));
      mq->lbuf = malloc(acc->g.large_bytes);
      if (!mq->rx_lpos || !mq->rx_lend || !mq->lbuf) {
        rc = -ENOMEM;
        goto fail;
      }
    }
    /* client mqueue n_server + j * B + k is back end k's j-th (one per
     * block of a GPU kernel; j is 0 only, on a CPU) */
    if (q >= acc->n_server && o->n_backends) {
      rc = r->hooks->be_open(r->ctx, mq,
                             &o->backends[(q - acc->n_server) % o->n_backends]);
      if (rc)
        goto fail;
      c->n_client_mqs++;
    }
  }
  /* an accelerator that cannot be reached yet stays in the table, out of
   * dispatch, and is retried with backoff */
  if (conn_open(r, c)) {
    c->state = FE_CONN_DEAD;
    retry_later(r, c);
  }
  pthread_mutex_lock(&r->lock);
  conns = realloc(r->conns, (r->n_conns + 1) * sizeof(*conns));
  if (conns) {
    r->conns = conns;
    r->conns[r->n_conns++] = c;
    rc = set_changed(r);
    if (rc)
      r->n_conns--;
  } else {
    rc = -ENOMEM;
  }
  pthread_mutex_unlock(&r->lock);
  if (rc)
    goto fail;
  if (c->state != FE_CONN_DEAD)
    LYNX_INFO("frontend",
              "worker %u: accelerator %s/%u (instance %llu) in "
              "dispatch over %s%s%s%s: %u mqueues, answers %s",
              r->opts.worker, acc->node, acc->desc.accel_id,
              (unsigned long long)acc->instance_id, acc->desc.transport,
              acc->offered[0] ? " (on its agent's host and network "
                                "namespace; offered "
                              : "",
              acc->offered, acc->offered[0] ? " too)" : "", c->n_mqs,
              c->pushing ? "pushed" : "polled for");
  return 0;
fail:
  conn_free(r, c);
  return rc;
}

/* Reopens dead connections still in the table whose retry time came. */
void fe_rmq_retry(struct fe_rmq *r, uint64_t now_ns) {
  for (uint32_t i = 0; i < r->n_conns; i++) {
    struct fe_conn *c = r->conns[i];
    if (c->state != FE_CONN_DEAD || c->removing || now_ns < c->retry_ns)
      continue;
    if (conn_open(r, c)) {
      c->failures++;
      retry_later(r, c);
      continue;
    }
    pthread_mutex_lock(&r->lock);
    if (set_changed(r)) { /* out of memory: out of dispatch again, retry */
      for (uint32_t q = 0; q < c->n_mqs; q++)
        c->mqs[q].dq.up = 0;
    }
    pthread_mutex_unlock(&r->lock);
    LYNX_INFO("frontend",
              "worker %u: accelerator %s/%u (instance %llu) back "
              "in dispatch over %s after %u failed attempts",
              r->opts.worker, c->acc.node, c->acc.desc.accel_id,
              (unsigned long long)c->acc.instance_id, c->acc.desc.transport,
              c->failures);
    c->failures = 0;
    c->retry_wait_ns = 0;
  }
}

/* (a LOST may hit a connection that is draining: any_state) */
struct fe_conn *fe_rmq_find(const struct fe_rmq *r, uint64_t instance_id,
                            int any_state) {
  for (uint32_t i = 0; i < r->n_conns; i++)
    if (r->conns[i]->acc.instance_id == instance_id &&
        (any_state || !r->conns[i]->removing))
      return r->conns[i];
  return NULL;
}

struct fe_mq *fe_rmq_mq(const struct fe_rmq *r, uint32_t gid) {
  for (uint32_t i = 0; i < r->n_conns; i++)
    for (uint32_t k = 0; k < r->conns[i]->n_mqs; k++)
      if (r->conns[i]->mqs[k].gid == gid)
        return &r->conns[i]->mqs[k];
  return NULL;
}

/* Out of dispatch: new requests go elsewhere, answers still come back. */
void fe_rmq_remove(struct fe_rmq *r, struct fe_conn *c) {
  if (c->removing)
    return;
  c->removing = 1;
  for (uint32_t i = 0; i < c->n_mqs; i++)
    c->mqs[i].dq.up = 0;
  LYNX_INFO("frontend",
            "worker %u: accelerator %s/%u (instance %llu) leaves "
            "dispatch with %u requests in flight",
            r->opts.worker, c->acc.node, c->acc.desc.accel_id,
            (unsigned long long)c->acc.instance_id, fe_conn_outstanding(c));
}

/* Frees removed connections whose requests are all answered (or expired:
 * the request timeout bounds the wait). */
int fe_rmq_quiet(const struct fe_rmq *r) {
  for (uint32_t i = 0; i < r->n_conns; i++)
    if (r->conns[i]->removing || r->conns[i]->state == FE_CONN_DEAD)
      return 0;
  return 1;
}

void fe_rmq_reap(struct fe_rmq *r) {
  uint32_t i = 0;
  while (i < r->n_conns) {
    struct fe_conn *c = r->conns[i];
    int rc;
    if (!c->removing ||
        (c->state != FE_CONN_DEAD && fe_conn_outstanding(c) != 0)) {
      i++;
      continue;
    }
    pthread_mutex_lock(&r->lock);
    r->conns[i] = r->conns[--r->n_conns];
    rc = set_changed(r);
    if (rc) { /* out of memory: put it back, try again later */
      r->conns[r->n_conns++] = r->conns[i];
      r->conns[i] = c;
    }
    pthread_mutex_unlock(&r->lock);
    if (rc)
      return;
    LYNX_INFO("frontend",
              "worker %u: accelerator %s/%u (instance %llu) "
              "released",
              r->opts.worker, c->acc.node, c->acc.desc.accel_id,
              (unsigned long long)c->acc.instance_id);
    for (uint32_t q = 0; q < c->n_mqs; q++) {
      lynx_cnt_add(&r->retired_dispatched, lynx_cnt_get(&c->mqs[q].dispatched));
      lynx_cnt_add(&r->retired_responded, lynx_cnt_get(&c->mqs[q].responded));
      for (int k = 0; k < FE_QDROP_MAX; k++)
        lynx_cnt_add(&r->retired_drops[k], lynx_cnt_get(&c->mqs[q].drops[k]));
    }
    /* conns[i] is another connection now: look at it next */
    conn_free(r, c);
  }
}

/* ---- set-up (main thread) and other threads -------------------------- */

void fe_rmq_init(struct fe_rmq *r, const struct fe_rmq_opts *opts,
                 const struct fe_rmq_hooks *hooks, void *ctx) {
  memset(r, 0, sizeof(*r));
  r->opts = *opts;
  r->hooks = hooks;
  r->ctx = ctx;
  pthread_mutex_init(&r->lock, NULL);
}

void fe_rmq_free(struct fe_rmq *r) {
  for (uint32_t i = 0; r->conns && i < r->n_conns; i++)
    conn_free(r, r->conns[i]);
  free(r->conns);
  r->conns = NULL;
  r->n_conns = 0;
  pthread_mutex_destroy(&r->lock);
}

void fe_rmq_foreach_mq(struct fe_rmq *r,
                       void (*fn)(void *arg, const struct fe_rmq *rmq,
                                  const struct fe_conn *c,
                                  const struct fe_mq *mq),
                       void *arg) {
  pthread_mutex_lock(&r->lock);
  for (uint32_t k = 0; k < r->n_conns; k++)
    for (uint32_t q = 0; q < r->conns[k]->n_mqs; q++)
      fn(arg, r, r->conns[k], &r->conns[k]->mqs[q]);
  pthread_mutex_unlock(&r->lock);
}
