/*
 * fake_verbs.h - a fake NIC for the rdma transport's unit tests: ibv_post_send
 * and ibv_poll_cq are static inlines that call qp->context->ops, so a fake
 * ibv_context records every posted chain and plays the remote side against a
 * formatted region in local memory. It enforces what the real agent's
 * registrations would: the rkey must be that of the access class the remote
 * range falls in, writes only into fctrl + RX rings, reads only of
 * header/actrl and TX rings, local buffers only inside the registered
 * staging/bounce buffer with its lkey. In deferred mode it holds posted WRs
 * until the test runs them, and reads non-inline payloads only then. Error
 * statuses can be injected at any WR. For the conformance harness it can
 * also play the agent's side of a region that goes away (every WR then
 * flushes) and wake a sleeping accelerator on a SEND, as the agent does.
 *
 * Also the descriptor of such a region and the frontend's data path attached
 * over the fake. Header-only; include after <cmocka.h>. Used by
 * test_transport_rdma.c and conformance_rdma.c.
 */
#ifndef LYNX_FAKE_VERBS_H
#define LYNX_FAKE_VERBS_H

#include <stdint.h>
#include <string.h>

#include "mqueue.h"
#include "rdma_internal.h"
#include "transport.h"
#include "ut_region.h"

#define RADDR 0x7f0012340000ull /* the region's VA "in the agent" */
#define RK_CTL 0x1111u
#define RK_WRITE 0x2222u
#define RK_TX 0x3333u
#define LKEY 0xABCDu
#define FAKE_LOG 4096u

/* ---- the fake NIC ------------------------------------------------------- */

struct posted {
  uint64_t wr_id;
  int opcode;
  unsigned flags;
  uint64_t raddr;
  uint32_t rkey;
  int num_sge;
  uint64_t addr;
  uint32_t len, lkey;
  uint8_t inl[LYNX_RDMA_INLINE_BUF];
};

struct fake {
  struct ibv_context ctx; /* first: qp->context and cq->context point here */
  struct ibv_qp qp;
  struct ibv_cq cq;
  /* remote side */
  uint8_t *region;
  struct lynx_geom g;
  /* local registered buffer */
  uint8_t *buf;
  size_t buf_len, stage_len; /* staging ring, then bounce ring */
  uint32_t max_inline;
  /* send queue, as the device counts it */
  uint32_t sq_max, sq_used, enomem;
  int deferred;
  uint32_t run_next; /* next WR to execute */
  int broken;        /* QP in error: everything flushes */
  int inject;
  uint32_t inject_ord;
  enum ibv_wc_status inject_status;
  /* what was posted */
  uint32_t posts;
  uint32_t chain[FAKE_LOG];
  struct posted log[FAKE_LOG];
  uint32_t n_log;
  uint32_t notifies;
  /* playing the agent (conformance_rdma.c): */
  const int *gone;  /* nonzero: the region was freed, every WR flushes */
  uint32_t qp_err;  /* ibv_modify_qp to ERR (fake_modify_qp): the agent
                       fenced this connection, every WR flushes */
  int wake_on_send; /* a SEND wakes a sleeping accelerator */
  /* completion queue */
  struct ibv_wc cqe[FAKE_LOG];
  uint32_t cqe_ord[FAKE_LOG];
  uint32_t cq_head, cq_tail;
};

static const uint32_t rkeys[3] = {RK_CTL, RK_WRITE, RK_TX};

static enum ibv_wc_status fake_apply(struct fake *f, const struct posted *p) {
  uint8_t *local = NULL;
  uint64_t off;
  int cls;
  if (p->opcode == IBV_WR_SEND) {
    if (p->num_sge != 0)
      return IBV_WC_LOC_LEN_ERR;
    f->notifies++;
    if (f->wake_on_send)
      lynx_region_wake(f->region);
    return IBV_WC_SUCCESS;
  }
  if (p->raddr < RADDR)
    return IBV_WC_REM_ACCESS_ERR;
  off = p->raddr - RADDR;
  cls = lynx_region_class(&f->g, off, p->len);
  /* the agent's MRs: the rkey of the class the range is in, with that
   * class's access only */
  if (cls < 0 || p->rkey != rkeys[cls])
    return IBV_WC_REM_ACCESS_ERR;
  if (p->num_sge != 1)
    return IBV_WC_LOC_LEN_ERR;
  if (p->opcode == IBV_WR_RDMA_READ || !(p->flags & IBV_SEND_INLINE)) {
    /* the registered buffer, and the right part of it: a staged write
     * must not spill into the bounce area nor a read into staging */
    uintptr_t lo = (uintptr_t)f->buf, hi = lo + f->buf_len;
    if (p->opcode == IBV_WR_RDMA_READ)
      lo += f->stage_len;
    else
      hi = lo + f->stage_len;
    if (p->lkey != LKEY || p->addr < lo || p->addr + p->len > hi)
      return IBV_WC_LOC_PROT_ERR;
    local = (uint8_t *)(uintptr_t)p->addr;
  }
  if (p->opcode == IBV_WR_RDMA_WRITE) {
    if (cls != LYNX_MR_WRITE)
      return IBV_WC_REM_ACCESS_ERR;
    if (p->flags & IBV_SEND_INLINE) {
      if (p->len > f->max_inline)
        return IBV_WC_LOC_LEN_ERR;
      memcpy(f->region + off, p->inl, p->len);
    } else {
      memcpy(f->region + off, local, p->len);
    }
    return IBV_WC_SUCCESS;
  }
  if (p->opcode == IBV_WR_RDMA_READ) { /* every class is readable */
    if (p->flags & IBV_SEND_INLINE)
      return IBV_WC_LOC_QP_OP_ERR;
    memcpy(local, f->region + off, p->len);
    return IBV_WC_SUCCESS;
  }
  return IBV_WC_LOC_QP_OP_ERR;
}

static void fake_exec(struct fake *f, uint32_t ord) {
  const struct posted *p = &f->log[ord];
  enum ibv_wc_status st;
  if (f->broken || (f->gone && *f->gone))
    st = IBV_WC_WR_FLUSH_ERR;
  else if (f->inject && f->inject_ord == ord)
    st = f->inject_status;
  else
    st = fake_apply(f, p);
  if (st != IBV_WC_SUCCESS)
    f->broken = 1;
  if ((p->flags & IBV_SEND_SIGNALED) || st != IBV_WC_SUCCESS) {
    uint32_t i = f->cq_tail++ % FAKE_LOG;
    memset(&f->cqe[i], 0, sizeof(f->cqe[i]));
    f->cqe[i].wr_id = p->wr_id;
    f->cqe[i].status = st;
    f->cqe[i].opcode = p->opcode == IBV_WR_RDMA_READ    ? IBV_WC_RDMA_READ
                       : p->opcode == IBV_WR_RDMA_WRITE ? IBV_WC_RDMA_WRITE
                                                        : IBV_WC_SEND;
    f->cqe_ord[i] = ord;
  }
}

/* The agent's ibv_modify_qp, installed as lynx__rdma_modify_qp: a QP
 * moved to ERR flushes everything from then on, as a real one does. */
static inline int fake_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr,
                                 int mask) {
  struct fake *f = (struct fake *)qp->context;
  if (!(mask & IBV_QP_STATE) || attr->qp_state != IBV_QPS_ERR)
    return EINVAL; /* the agent asks for nothing else */
  f->qp_err++;
  f->broken = 1;
  return 0;
}

/* Deferred mode: executes up to n held WRs, in order. */
static void fake_run(struct fake *f, uint32_t n) {
  while (n-- && f->run_next < f->n_log)
    fake_exec(f, f->run_next++);
}

static int fake_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr,
                          struct ibv_send_wr **bad) {
  struct fake *f = (struct fake *)qp->context;
  uint32_t n = 0;
  for (struct ibv_send_wr *w = wr; w; w = w->next)
    n++;
  f->chain[f->posts++ % FAKE_LOG] = n;
  if (f->sq_used + n > f->sq_max) {
    f->enomem++;
    *bad = wr;
    return ENOMEM;
  }
  for (struct ibv_send_wr *w = wr; w; w = w->next) {
    struct posted *p = &f->log[f->n_log];
    if (f->n_log + 1 >= FAKE_LOG)
      fail_msg("fake NIC log full");
    memset(p, 0, sizeof(*p));
    p->wr_id = w->wr_id;
    p->opcode = w->opcode;
    p->flags = w->send_flags;
    p->raddr = w->wr.rdma.remote_addr;
    p->rkey = w->wr.rdma.rkey;
    p->num_sge = w->num_sge;
    if (w->num_sge > 0) {
      p->addr = w->sg_list[0].addr;
      p->len = w->sg_list[0].length;
      p->lkey = w->sg_list[0].lkey;
      /* inline: the device copies the payload when it is posted */
      if ((w->send_flags & IBV_SEND_INLINE) && p->len <= sizeof(p->inl))
        memcpy(p->inl, (void *)(uintptr_t)p->addr, p->len);
    }
    f->n_log++;
    f->sq_used++;
    if (!f->deferred)
      fake_run(f, 1);
  }
  return 0;
}

static int fake_poll_cq(struct ibv_cq *cq, int num, struct ibv_wc *wc) {
  struct fake *f = (struct fake *)cq->context;
  int n = 0;
  while (n < num && f->cq_head != f->cq_tail) {
    uint32_t i = f->cq_head++ % FAKE_LOG;
    wc[n++] = f->cqe[i];
    /* RC: this completion frees its WR and every one before it */
    f->sq_used = f->n_log - (f->cqe_ord[i] + 1);
  }
  return n;
}

static void fake_init(struct fake *f, uint8_t *region,
                      const struct lynx_geom *g, uint8_t *buf, size_t len,
                      uint32_t sq, uint32_t max_inline, int deferred) {
  memset(f, 0, sizeof(*f));
  f->ctx.ops.post_send = fake_post_send;
  f->ctx.ops.poll_cq = fake_poll_cq;
  f->qp.context = &f->ctx;
  f->qp.qp_num = 42;
  f->cq.context = &f->ctx;
  f->region = region;
  f->g = *g;
  f->buf = buf;
  f->buf_len = len;
  f->sq_max = sq;
  f->max_inline = max_inline;
  f->deferred = deferred;
}

/* ---- the frontend's side over it ----------------------------------------- */

/* The descriptor of a region of geometry g in the pretend agent: its
 * address, the three rkeys above, key and epoch. */
static void fake_desc(struct lynx_region_desc *d, const struct lynx_geom *g,
                      uint32_t accel, uint64_t epoch, uint32_t ordering,
                      uint64_t key) {
  ut_desc_fill(d, "rdma", "192.0.2.7:7471", g, accel, epoch, ordering);
  d->key = key;
  d->remote_addr = RADDR;
  memcpy(d->rkeys, rkeys, sizeof(rkeys));
}

/* The frontend's data path for d over f's QP and CQ (f as fake_init made it,
 * its stage_len set): f's registered buffer, send queue and inline bound. */
static int fake_attach(struct fake *f, const struct lynx_region_desc *d,
                       struct lynx_tconn **out) {
  struct lynx__rdma_attach a = {0};
  a.qp = &f->qp;
  a.cq = &f->cq;
  a.buf = f->buf;
  a.lkey = LKEY;
  a.stage_size = f->stage_len;
  a.bounce_size = f->buf_len - f->stage_len;
  a.sq_depth = f->sq_max;
  a.max_inline = f->max_inline;
  return lynx__rdma_attach(d, &a, out);
}

#endif
