/*
 * conformance_rdma.c - the rdma backend's harness for the transport
 * conformance suite (transport_conformance.h), over the fake NIC of
 * fake_verbs.h: no device, no rdma_cm. The harness plays the agent: its
 * regions are formatted local memory with the three access classes the
 * fake enforces; connect does what the frontend's connect does around the
 * CM (geometry checked on the descriptor, the agent's admission of the
 * private data with its reject turned into the CM's error, a data path
 * attached to a fresh fake QP, the header read over it and validated), and
 * freeing a region makes every work request of its connections flush, as
 * a destroyed QP does. The frontend's data path (writev, read, flush,
 * poll, notify, close) is the real one. Fencing: the agent's shared rule
 * (lynx_fence_admit), its reject reason and its move of an older
 * connection's QP to ERR (lynx__rdma_qp_err, through fake_modify_qp);
 * the pretend agent does not see closes, so producers are not counted.
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

#include "fake_verbs.h"
#include "transport_conformance.h"
#include "util.h"

#define KEY 0x0123456789ABCDEFull

/* One region of the pretend agent; kept until no connection can use it. */
struct rd_region {
  uint8_t *mem;
  struct lynx_geom g;
  uint64_t key, epoch;
  struct lynx_fence fence;
  int gone; /* read by the fakes of its connections */
  struct rd_region *next;
};

/* One frontend connection's fake NIC and registered buffer. */
struct rd_conn {
  struct fake f;
  uint8_t *buf;
  struct rd_region *reg;
  uint64_t producer;
  struct rd_conn *next;
};

static struct rd_region *g_regions;
static struct rd_conn *g_conns;
static uint64_t g_keys;

/* Frees the connections and regions of freed regions; called where no
 * connection to them can still be open (a case's set-up, the end). */
static void sweep(int all) {
  struct rd_conn **pc = &g_conns;
  struct rd_region **pr = &g_regions;
  while (*pc) {
    struct rd_conn *c = *pc;
    if (all || c->reg->gone) {
      *pc = c->next;
      free(c->buf);
      free(c);
    } else {
      pc = &c->next;
    }
  }
  while (*pr) {
    struct rd_region *r = *pr;
    if (all || r->gone) {
      *pr = r->next;
      free(r->mem);
      free(r);
    } else {
      pr = &r->next;
    }
  }
}

static void rd_stop(void) { sweep(1); }

static int rd_start(void) {
  lynx__rdma_modify_qp = fake_modify_qp;
  return 0;
}

static int make(struct tc_region *t, uint32_t ordering, uint64_t epoch,
                uint64_t key) {
  struct rd_region *reg = calloc(1, sizeof(*reg));
  struct lynx_region r;
  if (!reg)
    return -ENOMEM;
  reg->next = g_regions;
  g_regions = reg;
  reg->g = t->g;
  reg->key = key;
  reg->epoch = epoch;
  if (ut_region_mem(&r, t->g.region_size)) {
    reg->gone = 1;
    return -ENOMEM;
  }
  reg->mem = r.base;
  if (lynx_region_format(&r, TC_Q, TC_S, TC_Z, 0, ordering, epoch, TC_ACCEL)) {
    reg->gone = 1;
    return -EINVAL;
  }
  t->priv = reg;
  t->mem = reg->mem;
  fake_desc(&t->d, &t->g, TC_ACCEL, epoch, ordering, key);
  return 0;
}

static int rd_region_new(struct tc_region *t, uint32_t ordering,
                         uint64_t epoch) {
  sweep(0);
  memset(t, 0, sizeof(*t));
  if (lynx_geom_init(&t->g, TC_Q, TC_S, TC_Z, 0))
    return -EINVAL;
  return make(t, ordering, epoch, KEY + g_keys++);
}

static void rd_region_free(struct tc_region *t) {
  struct rd_region *reg = t->priv;
  if (reg)
    reg->gone = 1; /* its memory goes with the next sweep */
  t->priv = NULL;
  t->mem = NULL;
}

/* Same key, new epoch: the agent's admission then says "stale epoch". */
static int rd_region_renew(struct tc_region *t, uint64_t epoch) {
  struct rd_region *reg = t->priv;
  uint64_t key = reg ? reg->key : KEY + g_keys++;
  rd_region_free(t);
  return make(t, t->d.ordering, epoch, key);
}

/* The agent's side of a CONNECT_REQUEST (rdma_agent.c on_request): the
 * region whose key and epoch the private data names, or NULL (rejected). */
static struct rd_region *admit(const struct lynx_region_desc *d) {
  uint8_t pd[LYNX_RDMA_PD_LEN];
  lynx__rdma_pd_encode(pd, d->key, d->epoch, d->producer);
  for (struct rd_region *r = g_regions; r; r = r->next)
    if (!r->gone && lynx__rdma_pd_admit(pd, sizeof(pd), r->key, r->epoch) == 0)
      return r;
  return NULL;
}

/* rdma_agent.c's fence_request: 0, or the frontend's error for a reject
 * with LYNX_RDMA_REJ_FENCED. A takeover moves the QP of every older
 * connection to ERR. */
static int fence(struct rd_region *reg, uint64_t producer) {
  uint64_t was = 0;
  unsigned n = 0;
  char why[160];
  int rc = lynx_fence_admit(&reg->fence, producer, &was, why, sizeof(why));
  if (rc < 0)
    return lynx__rdma_rej_errno(LYNX_RDMA_REJ_FENCED, -ECONNREFUSED);
  if (rc != LYNX_FENCE_TAKEOVER)
    return 0;
  lynx_fence_store(reg->mem, NULL, producer);
  for (struct rd_conn *c = g_conns; c; c = c->next)
    if (c->reg == reg && c->producer < producer && !c->f.qp_err &&
        lynx__rdma_qp_err(&c->f.qp) == 0)
      n++;
  lynx_fence_took_over(&reg->fence, was, producer, n);
  return 0;
}

/* What transport_rdma.c's fe_check_region does over the new QP. */
static int check_header(struct lynx_tconn *tc) {
  struct lynx_region_hdr h;
  char err[256];
  uint64_t id;
  int rc = tc->ops->read(tc, 0, &h, sizeof(h), 0);
  if (!rc)
    rc = tc->ops->flush(tc);
  if (!rc)
    rc = tc->ops->poll(tc, &id, 1) == 1 ? 0 : -EIO;
  if (!rc)
    rc = lynx_region_validate(&h, tc->desc.region_size, &tc->desc, err,
                              sizeof(err));
  return rc;
}

static int rd_connect(const struct lynx_region_desc *d,
                      struct lynx_tconn **out) {
  struct sockaddr_storage ss;
  struct rd_region *reg;
  struct rd_conn *c;
  struct lynx_tconn *tc = NULL;
  size_t stage, bounce;
  struct lynx_geom g;
  int rc;
  if (lynx_parse_hostport(d->locator, &ss))
    return -EINVAL;
  if (lynx_geom_init(&g, d->n_mqueues, d->slots, d->slot_size,
                     d->large_bytes) ||
      g.region_size != d->region_size)
    return -EINVAL; /* what the data path's set-up refuses */
  reg = admit(d);
  if (!reg) /* rejected: what the frontend's CM state machine makes of it */
    return lynx__rdma_cm_next(LYNX_RCM_CONNECTING, RDMA_CM_EVENT_REJECTED, 28)
        .err;
  rc = fence(reg, d->producer);
  if (rc)
    return rc;
  c = calloc(1, sizeof(*c));
  if (!c)
    return -ENOMEM;
  lynx__rdma_buf_sizes(&g, &stage, &bounce);
  c->buf = aligned_alloc(4096, stage + bounce);
  if (!c->buf) {
    free(c);
    return -ENOMEM;
  }
  memset(c->buf, 0, stage + bounce);
  c->reg = reg;
  c->producer = d->producer;
  c->next = g_conns;
  g_conns = c;
  fake_init(&c->f, reg->mem, &reg->g, c->buf, stage + bounce,
            LYNX_RDMA_SQ_DEPTH, LYNX_RDMA_INLINE, 0);
  c->f.stage_len = stage;
  c->f.gone = &reg->gone;
  c->f.wake_on_send = 1;
  rc = fake_attach(&c->f, d, &tc);
  if (rc)
    return rc;
  rc = check_header(tc);
  if (rc) {
    tc->ops->close(tc);
    return rc;
  }
  *out = tc;
  return 0;
}

static void rd_fence_stats(struct tc_region *t, struct lynx_fence_stats *out) {
  struct rd_region *reg = t->priv;
  struct lynx_region r;
  memset(&r, 0, sizeof(r));
  r.fence = reg ? &reg->fence : NULL;
  lynx_region_fence_stats(&r, out);
}

const struct tc_backend tc_backend = {
    .name = "rdma",
    .ops = &lynx_transport_rdma,
    .caps = TC_CAP_KEY | TC_CAP_FREE_DROPS | TC_CAP_FENCE_COUNTS,
    /* a cut connection's QP is in error: its ops fail as any dead one's
     * (the NIC cannot say why); its reconnect hears "fenced" */
    .err = {.wrong_key = -ECONNREFUSED,
            .stale_epoch = -ECONNREFUSED,
            .bad_desc = -EINVAL,
            .gone = -ECONNREFUSED,
            .fenced = -ESTALE,
            .cut = -ECONNRESET},
    .reads_max = 1000,
    .start = rd_start,
    .stop = rd_stop,
    .region_new = rd_region_new,
    .region_renew = rd_region_renew,
    .region_free = rd_region_free,
    .connect = rd_connect,
    .fence_stats = rd_fence_stats,
};
