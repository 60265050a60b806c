/*
 * mqueue.h - byte layout and ring logic of a Lynx mqueue region.
 *
 * The one definition of the region layout (docs/mqueue.md) and of the
 * producer/consumer rules over it. Plain C with no libc calls beyond
 * memcpy-free arithmetic and atomics, so it compiles for the host (gcc, clang)
 * and for CUDA device code (every function is LYNX_HD). The CPU accelerator
 * backend and the unit tests run exactly this code.
 *
 * Memory ordering: indices and the slot's seq word are published with
 * store-release and read with load-acquire. On the host these are the GCC
 * __atomic builtins on plain uint32_t (the region is shared memory between
 * processes, so C11 _Atomic objects would not fit); on the device they are a
 * volatile access plus __threadfence_system().
 */
#ifndef LYNX_MQUEUE_H
#define LYNX_MQUEUE_H

#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define LYNX_HD __host__ __device__ static inline
#else
#define LYNX_HD static inline
#endif

#define LYNX_REGION_MAGIC 0x584E594Cu /* "LYNX" little-endian */
#define LYNX_LAYOUT_VERSION 2u
#define LYNX_META_SIZE 16u
#define LYNX_SLOT_MIN 64u
#define LYNX_SLOT_MAX (1u << 20)
#define LYNX_SLOTS_MIN 2u
#define LYNX_SLOTS_MAX 65536u
#define LYNX_MQUEUES_MAX 1024u
#define LYNX_RINGS_ALIGN 4096u

enum lynx_ordering {
  LYNX_ORDER_COALESCED = 0, /* payload+meta in one write, placed in order */
  LYNX_ORDER_FENCED = 1,    /* payload write, read barrier, meta write */
};

enum lynx_slot_status {
  LYNX_ST_OK = 0,
  LYNX_ST_CLIENT_CLOSED = 1, /* RX: the client's TCP connection closed */
  LYNX_ST_DROPPED = 2,       /* TX: application drops the request, no reply */
  LYNX_ST_BACKEND_DOWN = 3,  /* RX of a client mqueue: the back end cannot be
                                reached; no reply bytes */
  LYNX_ST_TOO_LONG = 4,      /* RX of a client mqueue: the back end's reply
                                does not fit a slot; no reply bytes */
};

/* Region header: written once by the agent, read-only afterwards. */
struct lynx_region_hdr {
  uint32_t magic;
  uint16_t layout_version;
  uint16_t ordering;
  uint64_t epoch;
  uint64_t region_size;
  uint32_t n_mqueues;
  uint32_t slot_size;
  uint32_t slots;
  uint32_t accel_id;
  uint32_t actrl_off;
  uint32_t fctrl_off;
  uint64_t rings_off;
  uint64_t reserved;
};

#define LYNX_OFF_SLEEPING 64u  /* u32, accelerator-written */
#define LYNX_OFF_DOORBELL 128u /* u32, frontend-written futex word */
#define LYNX_OFF_ACTRL 192u

struct lynx_actrl { /* accelerator-written, one per mqueue */
  uint32_t tx_prod;
  uint32_t rx_cons;
};

struct lynx_fctrl { /* frontend-written, one per mqueue */
  uint32_t tx_cons;
  uint32_t reserved;
};

struct lynx_slot_meta { /* the last 16 bytes of every slot */
  uint32_t len;
  uint32_t tag;
  uint16_t status;
  uint16_t off16;
  uint32_t seq; /* publish word, written last: position + 1 */
};

/* Geometry of a region, derived from (Q, S, Z). */
struct lynx_geom {
  uint32_t n_mqueues, slots, slot_size;
  uint32_t actrl_off, fctrl_off;
  uint64_t rings_off, ring_bytes, region_size;
};

LYNX_HD int lynx_is_pow2(uint32_t v) { return v && !(v & (v - 1)); }

LYNX_HD uint64_t lynx_align_up(uint64_t v, uint64_t a) {
  return (v + a - 1) & ~(a - 1);
}

/* Fills *g for Q mqueues of S slots of Z bytes; 0 or -22 (EINVAL) when a
 * parameter is out of the documented bounds. */
LYNX_HD int lynx_geom_init(struct lynx_geom *g, uint32_t q, uint32_t s,
                           uint32_t z) {
  uint64_t ctrl;
  if (q < 1 || q > LYNX_MQUEUES_MAX || !lynx_is_pow2(s) || s < LYNX_SLOTS_MIN ||
      s > LYNX_SLOTS_MAX || !lynx_is_pow2(z) || z < LYNX_SLOT_MIN ||
      z > LYNX_SLOT_MAX)
    return -22;
  ctrl = lynx_align_up(8ull * q, 64);
  g->n_mqueues = q;
  g->slots = s;
  g->slot_size = z;
  g->actrl_off = LYNX_OFF_ACTRL;
  g->fctrl_off = (uint32_t)(LYNX_OFF_ACTRL + ctrl);
  g->rings_off = lynx_align_up(LYNX_OFF_ACTRL + 2 * ctrl, LYNX_RINGS_ALIGN);
  g->ring_bytes = (uint64_t)s * z;
  g->region_size =
      lynx_align_up(g->rings_off + 2ull * q * g->ring_bytes, LYNX_RINGS_ALIGN);
  return 0;
}

LYNX_HD uint32_t lynx_slot_cap(uint32_t slot_size) {
  return slot_size - LYNX_META_SIZE;
}

/* Every RX ring, then every TX ring: each access class (frontend-written,
 * accelerator-written) is one contiguous range, registered once (rdma) and
 * checked with one comparison (tcp). */
LYNX_HD uint64_t lynx_rx_ring_off(const struct lynx_geom *g, uint32_t q) {
  return g->rings_off + (uint64_t)q * g->ring_bytes;
}

LYNX_HD uint64_t lynx_tx_ring_off(const struct lynx_geom *g, uint32_t q) {
  return g->rings_off + ((uint64_t)g->n_mqueues + q) * g->ring_bytes;
}

/* Offset of the slot at free-running position pos within a ring. */
LYNX_HD uint64_t lynx_slot_off(const struct lynx_geom *g, uint64_t ring_off,
                               uint32_t pos) {
  return ring_off + (uint64_t)(pos & (g->slots - 1)) * g->slot_size;
}

LYNX_HD uint32_t lynx_actrl_off(const struct lynx_geom *g, uint32_t q) {
  return g->actrl_off + 8u * q;
}

LYNX_HD uint32_t lynx_fctrl_off(const struct lynx_geom *g, uint32_t q) {
  return g->fctrl_off + 8u * q;
}

/* Where a producer puts a payload of len bytes: 16-byte aligned, right
 * against the metadata. Caller has checked len <= cap. */
LYNX_HD uint32_t lynx_payload_off(uint32_t slot_size, uint32_t len) {
  return (lynx_slot_cap(slot_size) - len) & ~15u;
}

/* Bounds rule: 0 if the metadata describes a payload inside the slot,
 * -90 (EMSGSIZE) otherwise. */
LYNX_HD int lynx_meta_check(const struct lynx_slot_meta *m,
                            uint32_t slot_size) {
  uint32_t cap = lynx_slot_cap(slot_size);
  if (m->len > cap || (uint64_t)m->off16 * 16u + m->len > cap)
    return -90;
  return 0;
}

LYNX_HD uint32_t lynx_seq_for(uint32_t pos) { return pos + 1u; }

/* Ring occupancy with free-running indices. */
LYNX_HD uint32_t lynx_ring_used(uint32_t prod, uint32_t cons) {
  return prod - cons;
}

LYNX_HD int lynx_ring_full(uint32_t prod, uint32_t cons, uint32_t slots) {
  return prod - cons >= slots;
}

/* ---- atomics -------------------------------------------------------- */

#if defined(__CUDA_ARCH__)
LYNX_HD uint32_t lynx_load_acquire32(const uint32_t *p) {
  uint32_t v = *(const volatile uint32_t *)p;
  __threadfence_system();
  return v;
}
LYNX_HD void lynx_store_release32(uint32_t *p, uint32_t v) {
  __threadfence_system();
  *(volatile uint32_t *)p = v;
}
LYNX_HD void lynx_cpu_relax(void) {}
#else
LYNX_HD uint32_t lynx_load_acquire32(const uint32_t *p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
LYNX_HD void lynx_store_release32(uint32_t *p, uint32_t v) {
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
LYNX_HD void lynx_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield" ::: "memory");
#endif
}
#endif

/* ---- accelerator-side mqueue ---------------------------------------- */

/*
 * The accelerator's view of one mqueue, in its own memory. Owned by exactly
 * one accelerator thread (one GPU thread of a threadblock, or one CPU thread).
 * Ordering of RX releases is receive order; responses may be sent in any
 * order by tag.
 */
struct lynx_mq {
  uint8_t *rx;                  /* RX ring base */
  uint8_t *tx;                  /* TX ring base */
  struct lynx_actrl *actrl;     /* this mqueue's accelerator-written indices */
  const struct lynx_fctrl *fctrl; /* this mqueue's frontend-written indices */
  uint32_t slots, slot_size;
  uint32_t rx_head;  /* next position to receive */
  uint32_t rx_cons;  /* oldest position not yet released */
  uint32_t tx_prod;  /* next position to send */
  uint32_t tx_cons;  /* cached fctrl->tx_cons */
  uint32_t bad;      /* malformed requests skipped */
};

/* A received request: a view into the RX slot, valid until released. */
struct lynx_msg {
  const uint8_t *data;
  uint32_t len;
  uint32_t tag;
  uint16_t status;
};

LYNX_HD void lynx_mq_bind(struct lynx_mq *mq, uint8_t *region,
                          const struct lynx_geom *g, uint32_t q) {
  mq->rx = region + lynx_rx_ring_off(g, q);
  mq->tx = region + lynx_tx_ring_off(g, q);
  mq->actrl = (struct lynx_actrl *)(region + lynx_actrl_off(g, q));
  mq->fctrl = (const struct lynx_fctrl *)(region + lynx_fctrl_off(g, q));
  mq->slots = g->slots;
  mq->slot_size = g->slot_size;
  mq->rx_head = mq->rx_cons = lynx_load_acquire32(&mq->actrl->rx_cons);
  mq->tx_prod = lynx_load_acquire32(&mq->actrl->tx_prod);
  mq->tx_cons = lynx_load_acquire32(&mq->fctrl->tx_cons);
  mq->bad = 0;
}

LYNX_HD struct lynx_slot_meta *lynx_mq_meta(uint8_t *ring, uint32_t slot_size,
                                            uint32_t slots, uint32_t pos) {
  return (struct lynx_slot_meta *)(ring +
                                   (uint64_t)(pos & (slots - 1)) * slot_size +
                                   slot_size - LYNX_META_SIZE);
}

/* Copies a slot's metadata out. On the device every word is a volatile load
 * (served by L2): the NIC or a copy engine wrote it, and their writes never
 * update an SM's L1, where an earlier lap's plain loads of this slot may
 * still sit. Read after the seq acquire. */
LYNX_HD void lynx_meta_load(const struct lynx_slot_meta *src,
                            struct lynx_slot_meta *dst) {
#if defined(__CUDA_ARCH__)
  const volatile struct lynx_slot_meta *v = src;
  dst->len = v->len;
  dst->tag = v->tag;
  dst->status = v->status;
  dst->off16 = v->off16;
  dst->seq = v->seq;
#else
  *dst = *src;
#endif
}

/* Releases the oldest received request (receive order), together with any
 * malformed slots recv skipped right behind it, so skipped slots never leak. */
LYNX_HD void lynx_mq_release(struct lynx_mq *mq) {
  struct lynx_slot_meta mv;
  if (mq->rx_cons == mq->rx_head)
    return;
  for (;;) {
    mq->rx_cons++;
    if (mq->rx_cons == mq->rx_head)
      break;
    lynx_meta_load(lynx_mq_meta(mq->rx, mq->slot_size, mq->slots, mq->rx_cons),
                   &mv);
    if (lynx_meta_check(&mv, mq->slot_size) == 0)
      break;
  }
  lynx_store_release32(&mq->actrl->rx_cons, mq->rx_cons);
}

/*
 * Next request, zero copy. Returns 0 and fills *m, -11 (EAGAIN) when there
 * is none, -105 (ENOBUFS) when every slot is held unreleased by the caller.
 * Malformed slots (bounds rule) are released, counted in mq->bad, skipped.
 */
LYNX_HD int lynx_mq_recv(struct lynx_mq *mq, struct lynx_msg *m) {
  for (;;) {
    struct lynx_slot_meta *meta, mv;
    uint32_t seq;
    if (mq->rx_head - mq->rx_cons >= mq->slots)
      return -105;
    meta = lynx_mq_meta(mq->rx, mq->slot_size, mq->slots, mq->rx_head);
    seq = lynx_load_acquire32(&meta->seq);
    if (seq != lynx_seq_for(mq->rx_head))
      return -11;
    lynx_meta_load(meta, &mv);
    if (lynx_meta_check(&mv, mq->slot_size) != 0) {
      mq->bad++;
      mq->rx_head++;
      /* Releases are in order: with nothing held, free the slot now;
       * otherwise lynx_mq_release frees it after the held one before it. */
      if (mq->rx_cons + 1 == mq->rx_head) {
        mq->rx_cons++;
        lynx_store_release32(&mq->actrl->rx_cons, mq->rx_cons);
      }
      continue;
    }
    m->data = (const uint8_t *)meta - (mq->slot_size - LYNX_META_SIZE) +
              (uint32_t)mv.off16 * 16u;
    m->len = mv.len;
    m->tag = mv.tag;
    m->status = mv.status;
    mq->rx_head++;
    return 0;
  }
}

/* 1 when a request is waiting at rx_head (cheap check for idle loops). */
LYNX_HD int lynx_mq_rx_ready(const struct lynx_mq *mq) {
  const struct lynx_slot_meta *meta =
      lynx_mq_meta(mq->rx, mq->slot_size, mq->slots, mq->rx_head);
  return lynx_load_acquire32(&meta->seq) == lynx_seq_for(mq->rx_head);
}

/*
 * Reserves a TX slot for a response of at most max_len bytes and returns a
 * pointer to where the payload goes (*buf). 0, -11 (EAGAIN) when the TX ring
 * is full, -90 (EMSGSIZE) when max_len exceeds the slot. Commit with
 * lynx_mq_commit; at most one reservation is open at a time.
 */
LYNX_HD int lynx_mq_reserve(struct lynx_mq *mq, uint32_t max_len,
                            uint8_t **buf) {
  uint32_t cap = lynx_slot_cap(mq->slot_size);
  if (max_len > cap)
    return -90;
  if (lynx_ring_full(mq->tx_prod, mq->tx_cons, mq->slots)) {
    mq->tx_cons = lynx_load_acquire32(&mq->fctrl->tx_cons);
    if (lynx_ring_full(mq->tx_prod, mq->tx_cons, mq->slots))
      return -11;
  }
  *buf = mq->tx + (uint64_t)(mq->tx_prod & (mq->slots - 1)) * mq->slot_size +
         lynx_payload_off(mq->slot_size, max_len);
  return 0;
}

/* Publishes the reserved slot as the response to tag: len bytes at the
 * reserved pointer (len <= the reserved max_len). */
LYNX_HD void lynx_mq_commit(struct lynx_mq *mq, uint32_t tag, uint32_t len,
                            uint32_t max_len, uint16_t status) {
  struct lynx_slot_meta *meta =
      lynx_mq_meta(mq->tx, mq->slot_size, mq->slots, mq->tx_prod);
  meta->len = len;
  meta->tag = tag;
  meta->status = status;
  meta->off16 = (uint16_t)(lynx_payload_off(mq->slot_size, max_len) / 16u);
  lynx_store_release32(&meta->seq, lynx_seq_for(mq->tx_prod));
  mq->tx_prod++;
  lynx_store_release32(&mq->actrl->tx_prod, mq->tx_prod);
}

/* Tells the frontend that the request with this tag gets no reply, so its
 * tag is freed at once rather than at its timeout. 0 or -11 (TX full). */
LYNX_HD int lynx_mq_drop(struct lynx_mq *mq, uint32_t tag) {
  uint8_t *buf;
  int rc = lynx_mq_reserve(mq, 0, &buf);
  if (rc == 0)
    lynx_mq_commit(mq, tag, 0, 0, LYNX_ST_DROPPED);
  return rc;
}

#endif /* LYNX_MQUEUE_H */
