/*
 * test_transport_rdma.c - unit tests of the rdma transport up to the verbs
 * calls: transport/rdma_dp.c (work requests, signalling, doorbells, bounds and
 * access classes, completions and errors), transport/rdma_cm.c (the
 * connection state machine, connect private data, reject reasons) and the
 * no-device paths of transport/transport_rdma.c and transport/rdma_agent.c.
 *
 * A fake NIC (fake_verbs.h) stands in for the device: it records every
 * posted chain and plays the remote side against a formatted region in
 * local memory, enforcing the agent's registrations (rkey per access
 * class, lkey and the staging/bounce split). In deferred mode it holds
 * posted WRs until the test runs them, and reads non-inline payloads only
 * then, which shows the staging copy lives until completion. Error
 * statuses can be injected at any WR.
 *
 * What every backend promises (the ops table, bounds, refusals at
 * connect, PUBLISH, completions, a region freed or restarted) is the
 * conformance suite's (transport_conformance.c), run for rdma over the
 * same fake NIC as unit_transport_conformance_rdma.
 *
 * What needs a real device (rdma_cm, memory registration, the agent's CM
 * thread) is covered by tests/integration/rdma_device.sh, which skips
 * without one.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "lynx.pb-c.h"
#include "mqueue.h"
#include "rdma_internal.h"
#include "transport.h"
#include "ut_main.h"
#include "ut_region.h"
#include "ut_tconn.h"
#include "util.h"

#define Q 4u
#define S 8u
#define Z 256u
#define EPOCH 0x5EED0000CAFEull
#define KEY 0x0123456789ABCDEFull
#define ACCEL 3u

#include "fake_verbs.h"

/* ---- fixture ------------------------------------------------------------ */

struct fx {
  struct fake *f;
  struct lynx_geom g;
  uint8_t *region;
  uint8_t *buf;
  size_t stage, bounce;
  struct lynx_region_desc d;
  struct lynx_tconn *tc;
  struct lynx__rdma_conn *c;
};

/* (Re)builds the connection over a fresh fake NIC. */
static void attach(struct fx *x, uint32_t sq, uint32_t max_inline, size_t stage,
                   size_t bounce, int deferred) {
  ut_tconn_close(&x->tc);
  free(x->buf);
  x->buf = aligned_alloc(4096, stage + bounce);
  assert_non_null(x->buf);
  memset(x->buf, 0, stage + bounce);
  x->stage = stage;
  x->bounce = bounce;
  fake_init(x->f, x->region, &x->g, x->buf, stage + bounce, sq, max_inline,
            deferred);
  x->f->stage_len = stage;
  assert_int_equal(fake_attach(x->f, &x->d, &x->tc), 0);
  assert_ptr_equal(x->tc->ops, &lynx_transport_rdma);
  x->c = container_of(x->tc, struct lynx__rdma_conn, base);
}

static int fx_setup(void **state) {
  struct fx *x = calloc(1, sizeof(*x));
  struct lynx_region r;
  size_t stage, bounce;
  if (!x)
    return -1;
  *state = x;
  x->f = calloc(1, sizeof(*x->f));
  if (!x->f || lynx_geom_init(&x->g, Q, S, Z, 0) ||
      ut_region_mem(&r, x->g.region_size))
    return -1;
  x->region = r.base;
  if (lynx_region_format(&r, Q, S, Z, 0, LYNX_ORDER_COALESCED, EPOCH, ACCEL))
    return -1;
  fake_desc(&x->d, &x->g, ACCEL, EPOCH, LYNX_ORDER_COALESCED, KEY);
  lynx__rdma_buf_sizes(&x->g, &stage, &bounce);
  attach(x, LYNX_RDMA_SQ_DEPTH, LYNX_RDMA_INLINE, stage, bounce, 0);
  return 0;
}

static int fx_teardown(void **state) {
  struct fx *x = *state;
  if (!x)
    return 0;
  ut_tconn_close(&x->tc);
  free(x->buf);
  free(x->region);
  free(x->f);
  free(x);
  *state = NULL;
  return 0;
}

static uint64_t rx_slot(const struct fx *x, uint32_t q, uint32_t pos) {
  return lynx_slot_off(&x->g, lynx_rx_ring_off(&x->g, q), pos);
}

static uint64_t tx_slot(const struct fx *x, uint32_t q, uint32_t pos) {
  return lynx_slot_off(&x->g, lynx_tx_ring_off(&x->g, q), pos);
}

/* A 4-byte publish write of v to mqueue q's fctrl word. */
static int write_fctrl(struct fx *x, uint32_t q, uint32_t *v) {
  struct iovec iov = {v, 4};
  return x->tc->ops->writev(x->tc, lynx_fctrl_off(&x->g, q), &iov, 1,
                            LYNX_WR_PUBLISH);
}

/* Writes a request into RX slot pos of mqueue q the way the frontend's
 * worker does (payload, zero pad, metadata, one publish write). */
static int write_request(struct fx *x, uint32_t q, uint32_t pos,
                         const void *data, uint32_t len, uint32_t tag,
                         unsigned extra_flags) {
  static const uint8_t zeros[16];
  uint32_t poff = lynx_payload_off(Z, len);
  struct lynx_slot_meta m = {len, tag, LYNX_ST_OK, (uint16_t)(poff / 16u),
                             lynx_seq_for(pos)};
  struct iovec iov[3] = {{(void *)data, len},
                         {(void *)zeros, lynx_slot_cap(Z) - poff - len},
                         {&m, sizeof(m)}};
  return x->tc->ops->writev(x->tc, rx_slot(x, q, pos) + poff, iov, 3,
                            LYNX_WR_PUBLISH | extra_flags);
}

static int signalled(const struct posted *p) {
  return (p->flags & IBV_SEND_SIGNALED) != 0;
}

/* ---- writes -------------------------------------------------------------- */

static void test_write_builds_rdma_write(void **state) {
  struct fx *x = *state;
  const char msg[] = "hello, accel!"; /* 14 bytes with the NUL */
  uint32_t poff = lynx_payload_off(Z, sizeof(msg));
  uint64_t off = rx_slot(x, 1, 0) + poff;
  const struct posted *p;
  struct lynx_mq mq;
  struct lynx_msg m;

  assert_int_equal(write_request(x, 1, 0, msg, sizeof(msg), 0xBEEF, 0), 0);
  /* posted, not started: nothing before the doorbell */
  assert_int_equal(x->f->posts, 0);
  assert_int_equal(x->f->n_log, 0);
  assert_int_equal(x->tc->ops->flush(x->tc), 0);
  assert_int_equal(x->f->posts, 1);
  assert_int_equal(x->f->chain[0], 1);
  p = &x->f->log[0];
  assert_int_equal(p->opcode, IBV_WR_RDMA_WRITE);
  assert_true(p->raddr == RADDR + off);
  assert_int_equal(p->rkey, RK_WRITE);
  assert_int_equal(p->num_sge, 1);
  assert_int_equal(p->len, Z - poff); /* payload + pad + metadata */
  assert_true(p->flags & IBV_SEND_INLINE);
  assert_false(p->flags & IBV_SEND_FENCE);
  /* the accelerator's ring code sees a complete request */
  lynx_mq_bind(&mq, x->region, &x->g, 1);
  assert_int_equal(lynx_mq_recv(&mq, &m), 0);
  assert_int_equal(m.len, sizeof(msg));
  assert_int_equal(m.tag, 0xBEEF);
  assert_memory_equal(m.data, msg, sizeof(msg));
  assert_int_equal(x->tc->ops->poll(x->tc, NULL, 0), 0);
}

static void test_write_staged(void **state) {
  struct fx *x = *state;
  uint8_t data[200];
  const struct posted *p;
  struct iovec iov[2];
  uint64_t off = rx_slot(x, 2, 3);
  for (size_t i = 0; i < sizeof(data); i++)
    data[i] = (uint8_t)(i * 7 + 1);
  /* a 240-byte gather write is above the inline limit: staged */
  iov[0].iov_base = data;
  iov[0].iov_len = sizeof(data);
  iov[1].iov_base = data;
  iov[1].iov_len = 40;
  assert_int_equal(x->tc->ops->writev(x->tc, off, iov, 2, 0), 0);
  /* the caller's buffer may change right after writev: the copy counts */
  memset(data, 0xEE, sizeof(data));
  assert_int_equal(x->tc->ops->flush(x->tc), 0);
  p = &x->f->log[0];
  assert_false(p->flags & IBV_SEND_INLINE);
  assert_int_equal(p->len, 240);
  assert_int_equal(p->lkey, LKEY);
  assert_true(p->addr >= (uintptr_t)x->buf &&
              p->addr + p->len <= (uintptr_t)x->buf + x->stage);
  assert_true(p->raddr == RADDR + off);
  assert_int_equal(p->rkey, RK_WRITE);
  for (size_t i = 0; i < 240; i++)
    assert_int_equal(x->region[off + i], (uint8_t)((i % 200) * 7 + 1));
}

static void test_inline_threshold(void **state) {
  struct fx *x = *state;
  uint8_t data[LYNX_RDMA_INLINE + 4];
  struct iovec iov = {data, LYNX_RDMA_INLINE};
  uint32_t v = 5;
  memset(data, 0x5A, sizeof(data));
  assert_int_equal(x->tc->ops->writev(x->tc, rx_slot(x, 0, 0), &iov, 1, 0), 0);
  iov.iov_len = LYNX_RDMA_INLINE + 1;
  assert_int_equal(x->tc->ops->writev(x->tc, rx_slot(x, 0, 1), &iov, 1, 0), 0);
  assert_int_equal(x->tc->ops->flush(x->tc), 0);
  assert_true(x->f->log[0].flags & IBV_SEND_INLINE);
  assert_int_equal(x->f->log[0].len, LYNX_RDMA_INLINE);
  assert_false(x->f->log[1].flags & IBV_SEND_INLINE);
  assert_int_equal(x->f->log[1].len, LYNX_RDMA_INLINE + 1);
  assert_false(x->f->broken);
  /* a device without inline data: even 4 bytes are staged */
  attach(x, 64, 0, x->stage, x->bounce, 0);
  assert_int_equal(write_fctrl(x, 0, &v), 0);
  assert_int_equal(x->tc->ops->flush(x->tc), 0);
  assert_false(x->f->log[0].flags & IBV_SEND_INLINE);
  assert_false(x->f->broken);
  assert_memory_equal(x->region + lynx_fctrl_off(&x->g, 0), &v, 4);
}

static void test_fence_flag(void **state) {
  struct fx *x = *state;
  uint8_t pay[32] = {1, 2, 3};
  struct lynx_slot_meta m = {32, 9, 0, 0, 1};
  struct iovec iov = {pay, sizeof(pay)};
  uint8_t scratch[4];
  uint64_t slot = rx_slot(x, 0, 0);
  /* fenced mode: payload, a read as barrier, metadata with a fence */
  assert_int_equal(x->tc->ops->writev(x->tc, slot, &iov, 1, 0), 0);
  assert_int_equal(
      x->tc->ops->read(x->tc, lynx_actrl_off(&x->g, 0), scratch, 4, 77), 0);
  iov.iov_base = &m;
  iov.iov_len = sizeof(m);
  assert_int_equal(x->tc->ops->writev(x->tc, slot + Z - LYNX_META_SIZE, &iov, 1,
                                      LYNX_WR_PUBLISH | LYNX_WR_FENCE),
                   0);
  assert_int_equal(x->tc->ops->flush(x->tc), 0);
  assert_int_equal(x->f->chain[0], 3);
  assert_false(x->f->log[0].flags & IBV_SEND_FENCE);
  assert_int_equal(x->f->log[1].opcode, IBV_WR_RDMA_READ);
  assert_int_equal(x->f->log[1].rkey, RK_CTL);
  assert_int_equal(x->f->log[2].opcode, IBV_WR_RDMA_WRITE);
  assert_true(x->f->log[2].flags & IBV_SEND_FENCE);
}

static void test_signalling_cadence(void **state) {
  struct fx *x = *state;
  uint32_t v = 0, nsig = 0;
  uint64_t id;
  uint8_t buf[8];
  for (uint32_t i = 0; i < 100; i++)
    assert_int_equal(write_fctrl(x, i % Q, &v), 0);
  assert_int_equal(x->tc->ops->flush(x->tc), 0);
  assert_int_equal(x->f->posts, 1);
  assert_int_equal(x->f->chain[0], 100);
  for (uint32_t i = 0; i < 100; i++) {
    int want = (i + 1) % LYNX_RDMA_SIGNAL_EVERY == 0;
    if (signalled(&x->f->log[i]) != want)
      fail_msg("WR %u: signalled %d, want %d", i, signalled(&x->f->log[i]),
               want);
    nsig += (uint32_t)want;
  }
  assert_int_equal(nsig, 3);
  /* reads are always signalled, and restart the count */
  assert_int_equal(x->tc->ops->read(x->tc, 0, buf, 8, 1), 0);
  for (uint32_t i = 0; i < 31; i++)
    assert_int_equal(write_fctrl(x, 0, &v), 0);
  assert_int_equal(x->tc->ops->notify(x->tc), 0); /* the 32nd after the read */
  assert_true(signalled(&x->f->log[100]));
  for (uint32_t i = 101; i < 132; i++)
    assert_false(signalled(&x->f->log[i]));
  assert_int_equal(x->f->log[132].opcode, IBV_WR_SEND);
  assert_true(signalled(&x->f->log[132]));
  assert_int_equal(x->tc->ops->poll(x->tc, &id, 1), 1);
  assert_true(id == 1);
  assert_int_equal(x->f->enomem, 0);
}

static void test_flush_one_chain_in_order(void **state) {
  struct fx *x = *state;
  uint32_t v[4] = {10, 11, 12, 13};
  uint8_t dst[8];
  assert_int_equal(x->tc->ops->flush(x->tc), 0); /* nothing: no doorbell */
  assert_int_equal(x->f->posts, 0);
  assert_int_equal(write_fctrl(x, 3, &v[0]), 0);
  assert_int_equal(write_fctrl(x, 1, &v[1]), 0);
  assert_int_equal(x->tc->ops->read(x->tc, x->g.actrl_off, dst, 8, 5), 0);
  assert_int_equal(write_fctrl(x, 2, &v[2]), 0);
  assert_int_equal(write_fctrl(x, 0, &v[3]), 0);
  assert_int_equal(x->f->posts, 0);
  assert_int_equal(x->tc->ops->flush(x->tc), 0);
  assert_int_equal(x->f->posts, 1);
  assert_int_equal(x->f->chain[0], 5);
  assert_true(x->f->log[0].raddr == RADDR + lynx_fctrl_off(&x->g, 3));
  assert_true(x->f->log[1].raddr == RADDR + lynx_fctrl_off(&x->g, 1));
  assert_true(x->f->log[2].raddr == RADDR + x->g.actrl_off);
  assert_true(x->f->log[3].raddr == RADDR + lynx_fctrl_off(&x->g, 2));
  assert_true(x->f->log[4].raddr == RADDR + lynx_fctrl_off(&x->g, 0));
  for (uint32_t i = 1; i < 5; i++)
    assert_true(x->f->log[i].wr_id == x->f->log[i - 1].wr_id + 1);
  /* everything went: the next flush rings nothing */
  assert_int_equal(x->tc->ops->flush(x->tc), 0);
  assert_int_equal(x->f->posts, 1);
  for (uint32_t q = 0; q < Q; q++)
    assert_memory_equal(x->region + lynx_fctrl_off(&x->g, q),
                        &v[q == 3   ? 0
                           : q == 1 ? 1
                           : q == 2 ? 2
                                    : 3],
                        4);
}

/* ---- reads --------------------------------------------------------------- */

static void test_reads_land_with_ids(void **state) {
  struct fx *x = *state;
  struct lynx_actrl a[Q], want[Q];
  uint8_t slots[2 * Z], zero[2 * Z];
  uint64_t ids[8];
  memset(slots, 0, sizeof(slots));
  memset(zero, 0, sizeof(zero));
  memset(a, 0, sizeof(a));
  for (uint32_t q = 0; q < Q; q++) {
    want[q].tx_prod = 100 + q;
    want[q].rx_cons = 200 + q;
  }
  memcpy(x->region + x->g.actrl_off, want, sizeof(want));
  for (uint32_t i = 0; i < 2 * Z; i++)
    x->region[tx_slot(x, 1, 6) + i] = (uint8_t)(i ^ 0x3C);
  assert_int_equal(x->tc->ops->read(x->tc, x->g.actrl_off, a, sizeof(a),
                                    0x1000000000000007ull),
                   0);
  assert_int_equal(
      x->tc->ops->read(x->tc, tx_slot(x, 1, 6), slots, sizeof(slots), 9), 0);
  assert_int_equal(x->tc->ops->flush(x->tc), 0);
  assert_int_equal(x->f->log[0].rkey, RK_CTL);
  assert_int_equal(x->f->log[1].rkey, RK_TX);
  assert_true(signalled(&x->f->log[0]) && signalled(&x->f->log[1]));
  /* the NIC has written the bounce area; dst is the caller's only once
   * the id is reported */
  assert_memory_equal(slots, zero, sizeof(slots));
  assert_int_equal(x->tc->ops->poll(x->tc, ids, 1), 1);
  assert_true(ids[0] == 0x1000000000000007ull);
  assert_memory_equal(a, want, sizeof(a));
  assert_int_equal(x->tc->ops->poll(x->tc, ids, 8), 1);
  assert_true(ids[0] == 9);
  assert_memory_equal(slots, x->region + tx_slot(x, 1, 6), sizeof(slots));
  assert_int_equal(x->tc->ops->poll(x->tc, ids, 8), 0);
}

static void test_class_violations_refused_before_posting(void **state) {
  struct fx *x = *state;
  uint8_t b[64] = {0};
  struct iovec iov = {b, 8};
  struct iovec big[2] = {{b, UINT64_MAX / 2 + 2}, {b, UINT64_MAX / 2 + 2}};
  uint64_t rx = lynx_rx_ring_off(&x->g, 0), tx = lynx_tx_ring_off(&x->g, 0);
  uint64_t end = x->g.region_size;
  const struct lynx_transport_ops *o = x->tc->ops;
  /* writes: only fctrl and the RX rings */
  assert_int_equal(o->writev(x->tc, tx_slot(x, 0, 0), &iov, 1, 0), -EFAULT);
  assert_int_equal(o->writev(x->tc, 0, &iov, 1, 0), -EFAULT); /* header */
  assert_int_equal(o->writev(x->tc, x->g.actrl_off, &iov, 1, 0), -EFAULT);
  assert_int_equal(o->writev(x->tc, x->g.fctrl_off - 4, &iov, 1, 0),
                   -EFAULT); /* straddle */
  assert_int_equal(o->writev(x->tc, tx - 4, &iov, 1, 0), -EFAULT); /* RX|TX */
  assert_int_equal(o->writev(x->tc, end - 4, &iov, 1, 0), -EFAULT);
  assert_int_equal(o->writev(x->tc, UINT64_MAX - 3, &iov, 1, 0), -EFAULT);
  assert_int_equal(o->writev(x->tc, rx, big, 2, 0), -EFAULT); /* wrap */
  /* reads: any class (each MR is readable), never across two MRs */
  assert_int_equal(o->read(x->tc, tx - 4, b, 8, 1), -EFAULT);
  assert_int_equal(o->read(x->tc, x->g.fctrl_off - 4, b, 8, 1), -EFAULT);
  assert_int_equal(o->read(x->tc, end - 4, b, 8, 1), -EFAULT);
  assert_int_equal(o->read(x->tc, UINT64_MAX - 3, b, 8, 1), -EFAULT);
  assert_int_equal(o->read(x->tc, 4, b, UINT64_MAX - 2, 1), -EFAULT);
  /* publish argument checks, as shm */
  iov.iov_len = 3;
  assert_int_equal(o->writev(x->tc, rx, &iov, 1, LYNX_WR_PUBLISH), -EINVAL);
  iov.iov_len = 8;
  assert_int_equal(o->writev(x->tc, rx + 2, &iov, 1, LYNX_WR_PUBLISH), -EINVAL);
  /* none of it reached the send queue */
  assert_int_equal(o->flush(x->tc), 0);
  assert_int_equal(x->f->posts, 0);
  assert_int_equal(x->f->n_log, 0);
  /* and the edges that are legal pass */
  assert_int_equal(o->writev(x->tc, tx - 8, &iov, 1, LYNX_WR_PUBLISH), 0);
  assert_int_equal(o->read(x->tc, end - 8, b, 8, 2), 0);
  assert_int_equal(o->read(x->tc, x->g.fctrl_off - 8, b, 8, 3), 0);
  assert_int_equal(o->flush(x->tc), 0);
  assert_int_equal(x->f->n_log, 3);
  assert_false(x->f->broken);
}

static void test_too_large_emsgsize(void **state) {
  struct fx *x = *state;
  uint8_t *b = calloc(1, 8192);
  struct iovec iov = {b, 4096};
  assert_non_null(b);
  attach(x, 64, 0, 4096, 4096, 0);
  assert_int_equal(x->tc->ops->read(x->tc, tx_slot(x, 0, 0), b, 4097, 1),
                   -EMSGSIZE);
  assert_int_equal(x->tc->ops->read(x->tc, tx_slot(x, 0, 0), b, 4096, 1), 0);
  iov.iov_len = 4097;
  assert_int_equal(x->tc->ops->writev(x->tc, rx_slot(x, 0, 0), &iov, 1, 0),
                   -EMSGSIZE);
  iov.iov_len = 4096;
  assert_int_equal(x->tc->ops->writev(x->tc, rx_slot(x, 0, 0), &iov, 1, 0), 0);
  free(b);
}

/* ---- resources full ------------------------------------------------------ */

static void test_sq_full_enobufs(void **state) {
  struct fx *x = *state;
  uint32_t v = 7;
  uint8_t dst[8];
  attach(x, 8, LYNX_RDMA_INLINE, x->stage, x->bounce, 1);
  for (uint32_t i = 0; i < 8; i++)
    assert_int_equal(write_fctrl(x, 0, &v), 0);
  /* the period (32) is longer than the queue (8): the WR that fills the
   * queue is signalled anyway, or nothing would ever free it */
  assert_int_equal(write_fctrl(x, 0, &v), -ENOBUFS);
  assert_int_equal(x->tc->ops->read(x->tc, 0, dst, 8, 1), -ENOBUFS);
  assert_int_equal(x->tc->ops->notify(x->tc), -ENOBUFS);
  /* full, so the pending chain was rung without an explicit flush */
  assert_int_equal(x->f->posts, 1);
  assert_int_equal(x->f->chain[0], 8);
  for (uint32_t i = 0; i < 7; i++)
    assert_false(signalled(&x->f->log[i]));
  assert_true(signalled(&x->f->log[7]));
  /* the device completes: room again, without a poll call */
  fake_run(x->f, 8);
  assert_int_equal(write_fctrl(x, 1, &v), 0);
  assert_int_equal(x->tc->ops->read(x->tc, 0, dst, 8, 1), 0);
  assert_int_equal(x->tc->ops->flush(x->tc), 0);
  fake_run(x->f, 8);
  assert_int_equal(x->tc->ops->poll(x->tc, (uint64_t[4]){0}, 4), 1);
  /* the transport never posted beyond the device's queue */
  assert_int_equal(x->f->enomem, 0);
  assert_false(x->f->broken);
}

static void test_staging_full_enobufs(void **state) {
  struct fx *x = *state;
  uint64_t rx = lynx_rx_ring_off(&x->g, 0); /* RX rings: 8 KiB, writable */
  uint8_t pat[5][1024];
  struct iovec iov;
  attach(x, 64, 0, 4096, 4096, 1);
  for (int k = 0; k < 5; k++)
    memset(pat[k], 0x10 + k, sizeof(pat[k]));
  for (int k = 0; k < 4; k++) {
    iov.iov_base = pat[k];
    iov.iov_len = 1024;
    assert_int_equal(
        x->tc->ops->writev(x->tc, rx + (uint64_t)k * 1024, &iov, 1, 0), 0);
  }
  iov.iov_base = pat[4];
  assert_int_equal(x->tc->ops->writev(x->tc, rx + 4096, &iov, 1, 0), -ENOBUFS);
  /* half the staging ring used since the last signal: signalled */
  assert_int_equal(x->f->n_log, 4);
  assert_false(signalled(&x->f->log[0]));
  assert_true(signalled(&x->f->log[1]));
  assert_false(signalled(&x->f->log[2]));
  assert_true(signalled(&x->f->log[3]));
  /* the device reads the staged bytes only now: they must be intact */
  fake_run(x->f, 4);
  for (int k = 0; k < 4; k++)
    assert_memory_equal(x->region + rx + (uint64_t)k * 1024, pat[k], 1024);
  assert_int_equal(x->tc->ops->writev(x->tc, rx + 4096, &iov, 1, 0), 0);
  assert_int_equal(x->tc->ops->flush(x->tc), 0);
  fake_run(x->f, 1);
  assert_memory_equal(x->region + rx + 4096, pat[4], 1024);
  assert_false(x->f->broken);
}

/* The staging ring skips its end rather than split a copy, and an empty
 * ring restarts at its beginning; a copy never spills into the bounce area
 * (the fake NIC checks that). */
static void test_staging_wraps(void **state) {
  struct fx *x = *state;
  uint64_t rx = lynx_rx_ring_off(&x->g, 0);
  uint8_t pat[5][1536];
  struct iovec iov;
  attach(x, 64, 0, 4096, 4096, 0);
  for (int k = 0; k < 5; k++) {
    memset(pat[k], 0x40 + k, sizeof(pat[k]));
    iov.iov_base = pat[k];
    iov.iov_len = sizeof(pat[k]);
    /* 0: [0,1536) 1: [1536,3072) 2: skips the end, [0,1536) once 0 and 1
     * completed; 3: [1536,3072); 4: skips again, [0,1536) beside 3 */
    assert_int_equal(
        x->tc->ops->writev(x->tc, rx + (uint64_t)k * 1536, &iov, 1, 0), 0);
    assert_int_equal(x->tc->ops->flush(x->tc), 0);
  }
  assert_int_equal(x->f->n_log, 5);
  assert_false(x->f->broken);
  assert_true(x->f->log[2].addr == (uintptr_t)x->buf);
  assert_true(x->f->log[3].addr == (uintptr_t)x->buf + 1536);
  assert_true(x->f->log[4].addr == (uintptr_t)x->buf);
  for (int k = 0; k < 5; k++)
    assert_memory_equal(x->region + rx + (uint64_t)k * 1536, pat[k], 1536);
  /* empty again at 2112: a 4000-byte copy fits only from the start */
  attach(x, 64, 0, 4096, 4096, 0);
  iov.iov_base = x->region; /* any 4000 bytes */
  iov.iov_len = 2100;
  assert_int_equal(x->tc->ops->writev(x->tc, rx, &iov, 1, 0), 0);
  assert_int_equal(x->tc->ops->flush(x->tc), 0);
  assert_true(signalled(&x->f->log[0]));
  iov.iov_len = 4000;
  assert_int_equal(x->tc->ops->writev(x->tc, rx, &iov, 1, 0), 0);
  assert_int_equal(x->tc->ops->flush(x->tc), 0);
  assert_true(x->f->log[1].addr == (uintptr_t)x->buf);
  assert_false(x->f->broken);
}

/* Completed reads wait in the transport until poll hands their ids out;
 * it takes no more reads than it can hold ids for. */
static void test_read_ids_bounded(void **state) {
  struct fx *x = *state;
  uint64_t ids[16];
  uint8_t b[8];
  attach(x, 8, LYNX_RDMA_INLINE, x->stage, x->bounce, 0);
  for (uint64_t i = 0; i < 8; i++)
    assert_int_equal(x->tc->ops->read(x->tc, 0, b, 8, 100 + i), 0);
  assert_int_equal(x->tc->ops->flush(x->tc), 0);
  assert_int_equal(x->tc->ops->poll(x->tc, ids, 0), 0); /* reaps, keeps */
  assert_int_equal(x->tc->ops->read(x->tc, 0, b, 8, 999), -ENOBUFS);
  assert_int_equal(x->tc->ops->poll(x->tc, ids, 16), 8);
  for (uint64_t i = 0; i < 8; i++)
    assert_true(ids[i] == 100 + i);
  assert_int_equal(x->tc->ops->read(x->tc, 0, b, 8, 999), 0);
}

static void test_bounce_full_enobufs(void **state) {
  struct fx *x = *state;
  uint8_t d[3][2048];
  uint64_t ids[4];
  attach(x, 64, LYNX_RDMA_INLINE, 4096, 4096, 1);
  for (uint32_t i = 0; i < 2048; i++)
    x->region[tx_slot(x, 2, 0) + i] = (uint8_t)(i * 3);
  assert_int_equal(x->tc->ops->read(x->tc, tx_slot(x, 2, 0), d[0], 2048, 1), 0);
  assert_int_equal(x->tc->ops->read(x->tc, tx_slot(x, 2, 0), d[1], 2048, 2), 0);
  assert_int_equal(x->tc->ops->read(x->tc, tx_slot(x, 2, 0), d[2], 2048, 3),
                   -ENOBUFS);
  fake_run(x->f, 2);
  assert_int_equal(x->tc->ops->poll(x->tc, ids, 4), 2);
  assert_true(ids[0] == 1 && ids[1] == 2);
  assert_memory_equal(d[0], x->region + tx_slot(x, 2, 0), 2048);
  assert_memory_equal(d[1], x->region + tx_slot(x, 2, 0), 2048);
  assert_int_equal(x->tc->ops->read(x->tc, tx_slot(x, 2, 0), d[2], 2048, 3), 0);
  assert_int_equal(x->tc->ops->flush(x->tc), 0);
  fake_run(x->f, 1);
  assert_int_equal(x->tc->ops->poll(x->tc, ids, 4), 1);
  assert_true(ids[0] == 3);
  assert_memory_equal(d[2], x->region + tx_slot(x, 2, 0), 2048);
}

/* ---- completion errors --------------------------------------------------- */

static void expect_dead(struct fx *x, int err) {
  uint8_t b[8];
  uint32_t v = 1;
  uint64_t id;
  assert_int_equal(x->tc->ops->poll(x->tc, &id, 1), err);
  /* sticky: every call reports it, none crashes */
  assert_int_equal(x->tc->ops->poll(x->tc, &id, 1), err);
  assert_int_equal(write_fctrl(x, 0, &v), err);
  assert_int_equal(x->tc->ops->read(x->tc, 0, b, 8, 1), err);
  assert_int_equal(x->tc->ops->flush(x->tc), err);
  assert_int_equal(x->tc->ops->notify(x->tc), err);
}

static void inject_and_read(struct fx *x, uint32_t ord, enum ibv_wc_status st) {
  uint8_t b[3][8];
  x->f->inject = 1;
  x->f->inject_ord = ord;
  x->f->inject_status = st;
  for (int i = 0; i < 3; i++)
    assert_int_equal(x->tc->ops->read(x->tc, 0, b[i], 8, (uint64_t)i), 0);
  assert_int_equal(x->tc->ops->flush(x->tc), 0);
}

static void test_error_completion_eio(void **state) {
  struct fx *x = *state;
  inject_and_read(x, 1, IBV_WC_REM_ACCESS_ERR);
  expect_dead(x, -EIO);
}

static void test_retry_exceeded_eio(void **state) {
  struct fx *x = *state;
  inject_and_read(x, 0, IBV_WC_RETRY_EXC_ERR);
  expect_dead(x, -EIO);
}

static void test_flush_error_econnreset(void **state) {
  struct fx *x = *state;
  inject_and_read(x, 0, IBV_WC_WR_FLUSH_ERR);
  expect_dead(x, -ECONNRESET);
}

/* An error on an unsignalled write still comes back (the device reports
 * failures whether or not they were signalled). */
static void test_unsignalled_write_error(void **state) {
  struct fx *x = *state;
  uint32_t v = 3;
  x->f->inject = 1;
  x->f->inject_ord = 0;
  x->f->inject_status = IBV_WC_REM_OP_ERR;
  assert_int_equal(write_fctrl(x, 0, &v), 0);
  assert_int_equal(x->tc->ops->flush(x->tc), 0);
  assert_false(signalled(&x->f->log[0]));
  expect_dead(x, -EIO);
}

/* The fake enforces rkeys per class: a descriptor whose rkeys are in the
 * wrong order is caught by the remote side, not silently accepted. */
static void test_wrong_rkey_remote_access_error(void **state) {
  struct fx *x = *state;
  uint8_t b[8];
  x->d.rkeys[LYNX_MR_CTL] = RK_TX;
  x->d.rkeys[LYNX_MR_TX] = RK_CTL;
  attach(x, 64, LYNX_RDMA_INLINE, x->stage, x->bounce, 0);
  assert_int_equal(x->tc->ops->read(x->tc, 0, b, 8, 1), 0);
  assert_int_equal(x->tc->ops->flush(x->tc), 0);
  expect_dead(x, -EIO);
}

/* ---- notify -------------------------------------------------------------- */

static void test_notify_send(void **state) {
  struct fx *x = *state;
  uint32_t v = 4;
  assert_int_equal(write_fctrl(x, 0, &v), 0);
  assert_int_equal(x->tc->ops->notify(x->tc), 0);
  /* the notify is the batch's doorbell: one post, the write first */
  assert_int_equal(x->f->posts, 1);
  assert_int_equal(x->f->chain[0], 2);
  assert_int_equal(x->f->log[0].opcode, IBV_WR_RDMA_WRITE);
  assert_int_equal(x->f->log[1].opcode, IBV_WR_SEND);
  assert_int_equal(x->f->log[1].num_sge, 0);
  assert_false(signalled(&x->f->log[1]));
  assert_true(x->f->log[1].flags & IBV_SEND_INLINE);
  assert_int_equal(x->f->notifies, 1);
  assert_int_equal(x->tc->ops->flush(x->tc), 0);
  assert_int_equal(x->f->posts, 1);
  /* a connection without a completion channel has no fd to sleep on */
  assert_int_equal(x->tc->ops->wait_fd(x->tc), -ENOTSUP);
}

/* ---- CM events on an established connection ------------------------------ */

static void test_cm_disconnect_kills(void **state) {
  struct fx *x = *state;
  lynx__rdma_conn_cm_event(x->c, RDMA_CM_EVENT_DISCONNECTED, 0);
  assert_int_equal(x->c->cm, LYNX_RCM_DISCONNECTED);
  expect_dead(x, -ECONNRESET);
  /* later events change nothing */
  lynx__rdma_conn_cm_event(x->c, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0);
  assert_int_equal(x->c->cm, LYNX_RCM_DISCONNECTED);
  expect_dead(x, -ECONNRESET);
}

static void test_cm_device_removal_kills(void **state) {
  struct fx *x = *state;
  lynx__rdma_conn_cm_event(x->c, RDMA_CM_EVENT_DEVICE_REMOVAL, 0);
  expect_dead(x, -ECONNRESET);
}

static void test_cm_stray_event_kills(void **state) {
  struct fx *x = *state;
  lynx__rdma_conn_cm_event(x->c, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
  expect_dead(x, -EPROTO);
}

/* ---- CM state machine ---------------------------------------------------- */

struct cm_case {
  enum lynx__rdma_cm_state from;
  enum rdma_cm_event_type ev;
  int status;
  enum lynx__rdma_cm_state to;
  enum lynx__rdma_cm_action act;
  int err;
};

static void check_cases(const struct cm_case *c, size_t n) {
  for (size_t i = 0; i < n; i++) {
    struct lynx__rdma_cm_step st =
        lynx__rdma_cm_next(c[i].from, c[i].ev, c[i].status);
    if (st.next != c[i].to || st.act != c[i].act || st.err != c[i].err)
      fail_msg("case %zu: %s + %s(%d) -> %s/%d/%d, want %s/%d/%d", i,
               lynx__rdma_cm_state_str(c[i].from), rdma_event_str(c[i].ev),
               c[i].status, lynx__rdma_cm_state_str(st.next), st.act, st.err,
               lynx__rdma_cm_state_str(c[i].to), c[i].act, c[i].err);
  }
}

static void test_cm_success_path(void **state) {
  static const struct cm_case c[] = {
      {LYNX_RCM_ADDR_RESOLVING, RDMA_CM_EVENT_ADDR_RESOLVED, 0,
       LYNX_RCM_ROUTE_RESOLVING, LYNX_RCM_ACT_RESOLVE_ROUTE, 0},
      {LYNX_RCM_ROUTE_RESOLVING, RDMA_CM_EVENT_ROUTE_RESOLVED, 0,
       LYNX_RCM_CONNECTING, LYNX_RCM_ACT_CONNECT, 0},
      {LYNX_RCM_CONNECTING, RDMA_CM_EVENT_ESTABLISHED, 0, LYNX_RCM_ESTABLISHED,
       LYNX_RCM_ACT_READY, 0},
      {LYNX_RCM_ESTABLISHED, RDMA_CM_EVENT_DISCONNECTED, 0,
       LYNX_RCM_DISCONNECTED, LYNX_RCM_ACT_TEARDOWN, -ECONNRESET},
      {LYNX_RCM_DISCONNECTED, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0,
       LYNX_RCM_DISCONNECTED, LYNX_RCM_ACT_NONE, 0},
  };
  (void)state;
  check_cases(c, sizeof(c) / sizeof(c[0]));
}

static void test_cm_failures(void **state) {
  static const struct cm_case c[] = {
      /* address */
      {LYNX_RCM_ADDR_RESOLVING, RDMA_CM_EVENT_ADDR_ERROR, -ETIMEDOUT,
       LYNX_RCM_FAILED, LYNX_RCM_ACT_TEARDOWN, -ETIMEDOUT},
      {LYNX_RCM_ADDR_RESOLVING, RDMA_CM_EVENT_ADDR_ERROR, 0, LYNX_RCM_FAILED,
       LYNX_RCM_ACT_TEARDOWN, -EHOSTUNREACH},
      {LYNX_RCM_ADDR_RESOLVING, RDMA_CM_EVENT_ADDR_RESOLVED, -ENODEV,
       LYNX_RCM_FAILED, LYNX_RCM_ACT_TEARDOWN, -ENODEV},
      /* route */
      {LYNX_RCM_ROUTE_RESOLVING, RDMA_CM_EVENT_ROUTE_ERROR, 0, LYNX_RCM_FAILED,
       LYNX_RCM_ACT_TEARDOWN, -ENETUNREACH},
      {LYNX_RCM_ROUTE_RESOLVING, RDMA_CM_EVENT_ROUTE_ERROR, -ETIMEDOUT,
       LYNX_RCM_FAILED, LYNX_RCM_ACT_TEARDOWN, -ETIMEDOUT},
      /* connect */
      {LYNX_RCM_CONNECTING, RDMA_CM_EVENT_REJECTED, 28, LYNX_RCM_FAILED,
       LYNX_RCM_ACT_TEARDOWN, -ECONNREFUSED},
      {LYNX_RCM_CONNECTING, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT,
       LYNX_RCM_FAILED, LYNX_RCM_ACT_TEARDOWN, -ETIMEDOUT},
      {LYNX_RCM_CONNECTING, RDMA_CM_EVENT_UNREACHABLE, 0, LYNX_RCM_FAILED,
       LYNX_RCM_ACT_TEARDOWN, -EHOSTUNREACH},
      {LYNX_RCM_CONNECTING, RDMA_CM_EVENT_CONNECT_ERROR, 0, LYNX_RCM_FAILED,
       LYNX_RCM_ACT_TEARDOWN, -ECONNREFUSED},
      {LYNX_RCM_CONNECTING, RDMA_CM_EVENT_DISCONNECTED, 0, LYNX_RCM_FAILED,
       LYNX_RCM_ACT_TEARDOWN, -ECONNRESET},
      {LYNX_RCM_CONNECTING, RDMA_CM_EVENT_ESTABLISHED, -EIO, LYNX_RCM_FAILED,
       LYNX_RCM_ACT_TEARDOWN, -EIO},
      /* device removal anywhere */
      {LYNX_RCM_ADDR_RESOLVING, RDMA_CM_EVENT_DEVICE_REMOVAL, 0,
       LYNX_RCM_FAILED, LYNX_RCM_ACT_TEARDOWN, -ENODEV},
      {LYNX_RCM_ROUTE_RESOLVING, RDMA_CM_EVENT_DEVICE_REMOVAL, 0,
       LYNX_RCM_FAILED, LYNX_RCM_ACT_TEARDOWN, -ENODEV},
      {LYNX_RCM_CONNECTING, RDMA_CM_EVENT_DEVICE_REMOVAL, 0, LYNX_RCM_FAILED,
       LYNX_RCM_ACT_TEARDOWN, -ENODEV},
      {LYNX_RCM_ESTABLISHED, RDMA_CM_EVENT_DEVICE_REMOVAL, 0,
       LYNX_RCM_DISCONNECTED, LYNX_RCM_ACT_TEARDOWN, -ECONNRESET},
      /* up, then gone */
      {LYNX_RCM_ESTABLISHED, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0,
       LYNX_RCM_DISCONNECTED, LYNX_RCM_ACT_TEARDOWN, -ECONNRESET},
      {LYNX_RCM_ESTABLISHED, RDMA_CM_EVENT_ADDR_CHANGE, 0,
       LYNX_RCM_DISCONNECTED, LYNX_RCM_ACT_TEARDOWN, -ECONNRESET},
      /* out of order */
      {LYNX_RCM_IDLE, RDMA_CM_EVENT_ADDR_RESOLVED, 0, LYNX_RCM_FAILED,
       LYNX_RCM_ACT_TEARDOWN, -EPROTO},
      {LYNX_RCM_ADDR_RESOLVING, RDMA_CM_EVENT_ESTABLISHED, 0, LYNX_RCM_FAILED,
       LYNX_RCM_ACT_TEARDOWN, -EPROTO},
      {LYNX_RCM_ADDR_RESOLVING, RDMA_CM_EVENT_ROUTE_RESOLVED, 0,
       LYNX_RCM_FAILED, LYNX_RCM_ACT_TEARDOWN, -EPROTO},
      {LYNX_RCM_ROUTE_RESOLVING, RDMA_CM_EVENT_ADDR_RESOLVED, 0,
       LYNX_RCM_FAILED, LYNX_RCM_ACT_TEARDOWN, -EPROTO},
      {LYNX_RCM_CONNECTING, RDMA_CM_EVENT_ROUTE_RESOLVED, 0, LYNX_RCM_FAILED,
       LYNX_RCM_ACT_TEARDOWN, -EPROTO},
      {LYNX_RCM_CONNECTING, RDMA_CM_EVENT_CONNECT_RESPONSE, 0, LYNX_RCM_FAILED,
       LYNX_RCM_ACT_TEARDOWN, -EPROTO},
      {LYNX_RCM_CONNECTING, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0, LYNX_RCM_FAILED,
       LYNX_RCM_ACT_TEARDOWN, -EPROTO},
      {LYNX_RCM_ESTABLISHED, RDMA_CM_EVENT_ESTABLISHED, 0,
       LYNX_RCM_DISCONNECTED, LYNX_RCM_ACT_TEARDOWN, -EPROTO},
      {LYNX_RCM_ESTABLISHED, RDMA_CM_EVENT_CONNECT_REQUEST, 0,
       LYNX_RCM_DISCONNECTED, LYNX_RCM_ACT_TEARDOWN, -EPROTO},
      /* terminal states absorb */
      {LYNX_RCM_FAILED, RDMA_CM_EVENT_ESTABLISHED, 0, LYNX_RCM_FAILED,
       LYNX_RCM_ACT_NONE, 0},
      {LYNX_RCM_FAILED, RDMA_CM_EVENT_ADDR_RESOLVED, 0, LYNX_RCM_FAILED,
       LYNX_RCM_ACT_NONE, 0},
      {LYNX_RCM_DISCONNECTED, RDMA_CM_EVENT_ESTABLISHED, 0,
       LYNX_RCM_DISCONNECTED, LYNX_RCM_ACT_NONE, 0},
      {LYNX_RCM_DISCONNECTED, RDMA_CM_EVENT_DISCONNECTED, 0,
       LYNX_RCM_DISCONNECTED, LYNX_RCM_ACT_NONE, 0},
  };
  (void)state;
  check_cases(c, sizeof(c) / sizeof(c[0]));
}

/* Every state x every event (and some that do not exist) x a few
 * statuses: an answer that keeps the machine's invariants, never a crash. */
static void test_cm_exhaustive(void **state) {
  static const int statuses[] = {0, -ETIMEDOUT, 28, -1, 1000000};
  (void)state;
  for (int s = 0; s < LYNX_RCM_STATE_COUNT + 1; s++)
    for (int e = 0; e <= RDMA_CM_EVENT_TIMEWAIT_EXIT + 3; e++)
      for (size_t k = 0; k < sizeof(statuses) / sizeof(statuses[0]); k++) {
        struct lynx__rdma_cm_step st =
            lynx__rdma_cm_next((enum lynx__rdma_cm_state)s,
                               (enum rdma_cm_event_type)e, statuses[k]);
        assert_true(st.next > LYNX_RCM_IDLE && st.next < LYNX_RCM_STATE_COUNT);
        assert_true((st.act == LYNX_RCM_ACT_TEARDOWN) == (st.err < 0));
        assert_true(st.err <= 0 && st.err > -4096);
        if (st.act == LYNX_RCM_ACT_TEARDOWN)
          assert_true(st.next == LYNX_RCM_FAILED ||
                      st.next == LYNX_RCM_DISCONNECTED);
        /* up only from CONNECTING, on ESTABLISHED with status 0 */
        if (st.next == LYNX_RCM_ESTABLISHED)
          assert_true(s == LYNX_RCM_CONNECTING &&
                      e == RDMA_CM_EVENT_ESTABLISHED && statuses[k] == 0);
        /* down only from up: a set-up failure is FAILED */
        if (st.next == LYNX_RCM_DISCONNECTED)
          assert_true(s == LYNX_RCM_ESTABLISHED || s == LYNX_RCM_DISCONNECTED);
        if (s == LYNX_RCM_FAILED || s == LYNX_RCM_DISCONNECTED) {
          assert_int_equal(st.next, s);
          assert_int_equal(st.act, LYNX_RCM_ACT_NONE);
        }
      }
  assert_string_equal(lynx__rdma_cm_state_str(LYNX_RCM_CONNECTING),
                      "CONNECTING");
  assert_string_equal(lynx__rdma_cm_state_str(LYNX_RCM_STATE_COUNT), "?");
}

/* ---- private data -------------------------------------------------------- */

static void test_private_data(void **state) {
  uint8_t pd[56], bad[56];
  uint64_t k = 0, e = 0, p = 0;
  (void)state;
  memset(pd, 0, sizeof(pd)); /* the CM pads to 56 bytes on IB/RoCE */
  lynx__rdma_pd_encode(pd, KEY, EPOCH, 0x700000000000007ull);
  assert_memory_equal(pd, "LXR1", 4);
  assert_int_equal(pd[4], LYNX_RDMA_PD_VERSION);
  assert_int_equal(pd[8], KEY & 0xff); /* little-endian */
  assert_int_equal(pd[24], 7);
  assert_int_equal(lynx__rdma_pd_decode(pd, sizeof(pd), &k, &e, &p), 0);
  assert_true(k == KEY && e == EPOCH && p == 0x700000000000007ull);
  assert_int_equal(lynx__rdma_pd_decode(pd, LYNX_RDMA_PD_LEN, &k, &e, &p), 0);
  assert_int_equal(lynx__rdma_pd_decode(pd, LYNX_RDMA_PD_LEN - 1, &k, &e, &p),
                   -EPROTO);
  assert_int_equal(lynx__rdma_pd_decode(NULL, 0, &k, &e, &p), -EPROTO);
  memcpy(bad, pd, sizeof(bad));
  bad[0] = 'X';
  assert_int_equal(lynx__rdma_pd_decode(bad, sizeof(bad), &k, &e, &p), -EPROTO);
  memcpy(bad, pd, sizeof(bad));
  bad[4] = 1; /* version 1: no producer epoch, cannot be fenced */
  assert_int_equal(lynx__rdma_pd_decode(bad, sizeof(bad), &k, &e, &p), -EPROTO);
  /* admission against a region {key, epoch} */
  assert_int_equal(lynx__rdma_pd_admit(pd, sizeof(pd), KEY, EPOCH), 0);
  assert_int_equal(lynx__rdma_pd_admit(pd, sizeof(pd), KEY ^ 1, EPOCH),
                   -EACCES);
  assert_int_equal(
      lynx__rdma_pd_admit(pd, sizeof(pd), KEY ^ (1ull << 63), EPOCH), -EACCES);
  assert_int_equal(lynx__rdma_pd_admit(pd, sizeof(pd), KEY, EPOCH + 1),
                   -ESTALE);
  assert_int_equal(lynx__rdma_pd_admit(bad, sizeof(bad), KEY, EPOCH), -EPROTO);
  assert_int_equal(lynx__rdma_pd_admit(pd, 10, KEY, EPOCH), -EPROTO);
}

static void test_reject_reasons(void **state) {
  uint8_t r[LYNX_RDMA_REJ_LEN];
  (void)state;
  for (int w = 0; w < LYNX_RDMA_REJ_COUNT; w++) {
    lynx__rdma_rej_encode(r, (enum lynx__rdma_reject)w);
    assert_int_equal(lynx__rdma_rej_decode(r, sizeof(r)), w);
    assert_non_null(lynx__rdma_rej_str((enum lynx__rdma_reject)w));
    for (int v = 0; v < w; v++)
      assert_string_not_equal(lynx__rdma_rej_str((enum lynx__rdma_reject)v),
                              lynx__rdma_rej_str((enum lynx__rdma_reject)w));
  }
  lynx__rdma_rej_encode(r, LYNX_RDMA_REJ_EPOCH);
  assert_int_equal(lynx__rdma_rej_decode(r, 4), LYNX_RDMA_REJ_NONE);
  assert_int_equal(lynx__rdma_rej_decode(NULL, 0), LYNX_RDMA_REJ_NONE);
  r[7] = 0x7f; /* reason out of range */
  assert_int_equal(lynx__rdma_rej_decode(r, sizeof(r)), LYNX_RDMA_REJ_NONE);
  r[0] = 0;
  r[7] = 0;
  assert_int_equal(lynx__rdma_rej_decode(r, sizeof(r)), LYNX_RDMA_REJ_NONE);
  /* fenced: connect says -ESTALE (the frontend counts it apart), every
   * other reject keeps the CM's error */
  assert_int_equal(lynx__rdma_rej_errno(LYNX_RDMA_REJ_FENCED, -ECONNREFUSED),
                   -ESTALE);
  assert_int_equal(lynx__rdma_rej_errno(LYNX_RDMA_REJ_EPOCH, -ECONNREFUSED),
                   -ECONNREFUSED);
  assert_non_null(strstr(lynx__rdma_rej_str(LYNX_RDMA_REJ_FENCED), "fenced"));
}

/* ---- fencing: the agent's cut of an older frontend's QP ------------------ */

/* lynx__rdma_qp_err moves the QP to ERR through the verbs call; from then
 * on the frontend's writes and reads fail (what the agent does to every
 * connection of an older epoch on a takeover, before disconnecting it). */
static void test_fence_qp_err(void **state) {
  struct fx *x = *state;
  int (*real)(struct ibv_qp *, struct ibv_qp_attr *, int) =
      lynx__rdma_modify_qp;
  uint32_t v = 1;
  uint8_t b[8];
  lynx__rdma_modify_qp = fake_modify_qp;
  assert_int_equal(lynx__rdma_qp_err(&x->f->qp), 0);
  lynx__rdma_modify_qp = real;
  assert_int_equal(x->f->qp_err, 1);
  assert_int_equal(write_fctrl(x, 0, &v), 0);
  assert_int_equal(x->tc->ops->read(x->tc, 0, b, 8, 1), 0);
  assert_int_equal(x->tc->ops->flush(x->tc), 0);
  expect_dead(x, -ECONNRESET);
  /* nothing of it landed */
  assert_int_equal(
      ((const struct lynx_fctrl *)(x->region + lynx_fctrl_off(&x->g, 0)))
          ->tx_cons,
      0);
}

/* The rule the agent applies (lynx_fence_admit, shared by tcp and rdma):
 * older refused and counted, newer takes over, equal admitted; 0 only
 * while nothing newer was admitted. */
static void test_fence_rule(void **state) {
  struct lynx_fence f;
  uint64_t was = 99;
  char why[160];
  (void)state;
  memset(&f, 0, sizeof(f));
  assert_int_equal(lynx_fence_admit(&f, 0, &was, why, sizeof(why)), 0);
  assert_int_equal(lynx_fence_admit(&f, 5, &was, why, sizeof(why)),
                   LYNX_FENCE_TAKEOVER);
  assert_true(was == 0 && f.epoch == 5 && f.producers == 1);
  lynx_fence_took_over(&f, was, 5, 1);
  assert_int_equal(lynx_fence_admit(&f, 5, &was, why, sizeof(why)), 0);
  assert_true(f.producers == 2);
  assert_int_equal(lynx_fence_admit(&f, 4, &was, why, sizeof(why)), -ESTALE);
  assert_string_equal(why, "fenced: frontend epoch 4 is older than 5, the "
                           "newest this region admitted");
  assert_int_equal(lynx_fence_admit(&f, 0, &was, why, sizeof(why)), -ESTALE);
  assert_true(f.refused == 2 && f.cut == 1);
  lynx_fence_release(&f, 5);
  lynx_fence_release(&f, 0); /* a cut one: not a producer any more */
  assert_true(f.producers == 1);
}

/* ---- descriptor ---------------------------------------------------------- */

static void test_desc_rkeys_roundtrip(void **state) {
  struct fx *x = *state;
  Lynx__RegionDesc pb, *back;
  struct lynx_region_desc out;
  uint8_t *buf;
  char err[256];
  size_t n;
  x->d.rkeys[0] = 0xDEAD0001u;
  x->d.rkeys[1] = 0xDEAD0002u;
  x->d.rkeys[2] = 0xFFFFFFFFu;
  lynx_desc_to_pb(&x->d, &pb);
  assert_int_equal(pb.n_rkeys, LYNX_MR_COUNT);
  n = lynx__region_desc__get_packed_size(&pb);
  buf = malloc(n);
  assert_non_null(buf);
  lynx__region_desc__pack(&pb, buf);
  back = lynx__region_desc__unpack(NULL, n, buf);
  free(buf);
  assert_non_null(back);
  assert_int_equal(lynx_desc_from_pb(back, &out, err, sizeof(err)), 0);
  assert_memory_equal(out.rkeys, x->d.rkeys, sizeof(out.rkeys));
  assert_true(out.key == KEY);
  assert_true(out.remote_addr == RADDR);
  assert_true(out.epoch == EPOCH);
  assert_string_equal(out.transport, "rdma");
  assert_string_equal(out.locator, x->d.locator);
  /* an rdma descriptor must carry all three */
  back->n_rkeys = 2;
  assert_int_equal(lynx_desc_from_pb(back, &out, err, sizeof(err)), -EINVAL);
  back->n_rkeys = 3;
  lynx__region_desc__free_unpacked(back, NULL);
}

/* ---- sizes and set-up checks --------------------------------------------- */

static void test_buf_sizes(void **state) {
  static const uint32_t geo[][3] = {{1, 2, 64},       {4, 8, 256},
                                    {8, 1024, 2048},  {1024, 65536, 64},
                                    {2, 4, 1u << 20}, {16, 256, 65536}};
  (void)state;
  for (size_t i = 0; i < sizeof(geo) / sizeof(geo[0]); i++) {
    struct lynx_geom g;
    size_t st, bo;
    assert_int_equal(lynx_geom_init(&g, geo[i][0], geo[i][1], geo[i][2], 0), 0);
    lynx__rdma_buf_sizes(&g, &st, &bo);
    assert_int_equal(st % 4096, 0);
    assert_int_equal(bo % 4096, 0);
    assert_true(st >= 2ull * g.slot_size);
    assert_true(bo >= 2ull * g.slot_size ||
                bo >= g.fctrl_off + (uint64_t)g.n_mqueues * g.ring_bytes);
    assert_true(bo >= 64 * 1024);
    assert_true(st <= 4u << 20 && bo <= 4u << 20);
  }
}

static void test_attach_refuses_bad_input(void **state) {
  struct fx *x = *state;
  struct lynx__rdma_attach a = {&x->f->qp, &x->f->cq, x->buf, LKEY, 4096,
                                4096,      8,         0,      0};
  struct lynx_region_desc d = x->d;
  struct lynx_tconn *tc = NULL;
  a.sq_depth = 1;
  assert_int_equal(lynx__rdma_attach(&d, &a, &tc), -EINVAL);
  a.sq_depth = 8;
  a.stage_size = 100; /* not a multiple of 64 */
  assert_int_equal(lynx__rdma_attach(&d, &a, &tc), -EINVAL);
  a.stage_size = 4096;
  a.qp = NULL;
  assert_int_equal(lynx__rdma_attach(&d, &a, &tc), -EINVAL);
  a.qp = &x->f->qp;
  d.region_size += 4096; /* geometry and size disagree */
  assert_int_equal(lynx__rdma_attach(&d, &a, &tc), -EINVAL);
  d = x->d;
  d.slots = 3;
  assert_int_equal(lynx__rdma_attach(&d, &a, &tc), -EINVAL);
  assert_null(tc);
}

/* ---- without a device ---------------------------------------------------- */

static void test_no_device(void **state) {
  const struct lynx_transport_ops *o = &lynx_transport_rdma;
  struct lynx_region r;
  struct lynx_tconn *tc = NULL;
  struct lynx_transport_agent *ta = NULL;
  char err[512] = "";
  struct fx *x = *state;
  if (lynx__rdma_device_count() > 0) {
    ut_skip("an RDMA device exists: the no-device paths are covered by "
            "rdma_device.sh instead");
  }
  memset(&r, 0, sizeof(r));
  assert_int_equal(o->region_alloc(NULL, &r, "x", 4096), -ENOTCONN);
  o->region_free(&r); /* half-built: fine */
  assert_int_equal(o->region_export(&r), -EINVAL);
  assert_int_equal(
      o->agent_create(&(struct lynx_transport_opts){.listen = "127.0.0.1:0"},
                      &ta, err, sizeof(err)),
      -ENODEV);
  assert_non_null(strstr(err, "no RDMA device found"));
  assert_non_null(strstr(err, "--transport tcp"));
  assert_non_null(strstr(err, "rdma link add"));
  o->agent_destroy(ta); /* never created (NULL): a no-op */
  assert_int_equal(o->connect(&x->d, &tc), -ENODEV);
  assert_null(tc);
  snprintf(x->d.locator, sizeof(x->d.locator), "not-an-address");
  assert_int_equal(o->connect(&x->d, &tc), -EINVAL);
}

int main(int argc, char **argv) {
#define T(fn) cmocka_unit_test_setup_teardown(fn, fx_setup, fx_teardown)
  const struct CMUnitTest tests[] = {
      T(test_write_builds_rdma_write),
      T(test_write_staged),
      T(test_inline_threshold),
      T(test_fence_flag),
      T(test_signalling_cadence),
      T(test_flush_one_chain_in_order),
      T(test_reads_land_with_ids),
      T(test_class_violations_refused_before_posting),
      T(test_too_large_emsgsize),
      T(test_sq_full_enobufs),
      T(test_staging_full_enobufs),
      T(test_staging_wraps),
      T(test_read_ids_bounded),
      T(test_bounce_full_enobufs),
      T(test_error_completion_eio),
      T(test_retry_exceeded_eio),
      T(test_flush_error_econnreset),
      T(test_unsignalled_write_error),
      T(test_wrong_rkey_remote_access_error),
      T(test_notify_send),
      T(test_cm_disconnect_kills),
      T(test_cm_device_removal_kills),
      T(test_cm_stray_event_kills),
      cmocka_unit_test(test_cm_success_path),
      cmocka_unit_test(test_cm_failures),
      cmocka_unit_test(test_cm_exhaustive),
      cmocka_unit_test(test_private_data),
      cmocka_unit_test(test_reject_reasons),
      T(test_fence_qp_err),
      cmocka_unit_test(test_fence_rule),
      T(test_desc_rkeys_roundtrip),
      cmocka_unit_test(test_buf_sizes),
      T(test_attach_refuses_bad_input),
      T(test_no_device),
  };
#undef T
  return LYNX_UT_MAIN(argc, argv, "transport_rdma", tests, NULL, NULL);
}
