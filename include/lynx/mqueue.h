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
 * processes, so C11 _Atomic objects would not fit); on the device they are
 * PTX's ld.acquire.sys and st.release.sys.
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
#define LYNX_LAYOUT_VERSION 3u
#define LYNX_META_SIZE 16u
#define LYNX_SLOT_MIN 64u
#define LYNX_SLOT_MAX (1u << 20)
#define LYNX_SLOTS_MIN 2u
#define LYNX_SLOTS_MAX 65536u
#define LYNX_MQUEUES_MAX 1024u
/* Server mqueues one block of a GPU's persistent kernel serves at most
 * (their state lives in its shared memory): a GPU instance runs at least
 * ceil(mqueues / this) blocks, which placement counts against the GPU's
 * resident-block budget (docs/gpu.md). */
#define LYNX_GPU_MQS_PER_BLOCK 64u
#define LYNX_RINGS_ALIGN 4096u
/* Large-message area at the end of every ring (docs/mqueue.md, "Large
 * messages"): 0, or a power of two in [LYNX_LARGE_MIN, LYNX_LARGE_MAX]. */
#define LYNX_LARGE_MIN 4096u
#define LYNX_LARGE_MAX (64u << 20)
#define LYNX_LARGE_ALIGN 64u /* every large message starts on a cache line */
/* Default message caps: any UDP datagram; a TCP service's len32 frame. */
#define LYNX_UDP_MSG_MAX 65507u
#define LYNX_TCP_MSG_MAX (1u << 20)

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

/* Status flag: the message is in the ring's large area; the slot's payload
 * is a struct lynx_large_ref saying where. lynx_mq_recv resolves it (the
 * application sees the message and the status without the flag). */
#define LYNX_ST_LARGE 0x8000u

/* A large message's place, the payload of its slot (meta.len = 16). */
struct lynx_large_ref {
  uint32_t off; /* byte offset within the ring's large area */
  uint32_t len; /* message length: off + len <= the area's size */
  uint32_t end; /* the producer's free-running allocation end (its own
                   bookkeeping: the area is free up to here once this slot
                   is consumed) */
  uint32_t reserved;
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
  uint32_t large_bytes; /* each ring's large-message area (0: none) */
  uint32_t flags;       /* LYNX_HDR_*, set before the region is advertised */
};

/* Header flag: the accelerator rings the bell a frontend worker names in
 * fctrl.waiter when it publishes on that mqueue (docs/mqueue.md "Response
 * doorbells"): a CPU accelerator sets it, a GPU does not. */
#define LYNX_HDR_RESP_BELL 1u

#define LYNX_OFF_SLEEPING 64u /* u32, accelerator-written */
/* u64, the region's fence: the newest frontend epoch it admitted as its
 * producer (docs/mqueue.md "Fencing"). shm: CAS-maxed by each frontend's
 * connect; tcp/rdma: written by the agent. */
#define LYNX_OFF_FENCE 72u
#define LYNX_OFF_DOORBELL 128u /* u32, frontend-written futex word */
#define LYNX_OFF_ACTRL 192u

struct lynx_actrl { /* accelerator-written, one per mqueue */
  uint32_t tx_prod;
  uint32_t rx_cons;
};

struct lynx_fctrl { /* frontend-written, one per mqueue */
  uint32_t tx_cons;
  uint32_t waiter; /* 0, or the bell of the frontend worker that sleeps
                      until this mqueue's TX ring gets a message */
};

struct lynx_slot_meta { /* the last 16 bytes of every slot */
  uint32_t len;
  uint32_t tag;
  uint16_t status;
  uint16_t off16;
  uint32_t seq; /* publish word, written last: position + 1 */
};

/* Geometry of a region, derived from (Q, S, Z, L). A ring is its S slots
 * of Z bytes followed by its L-byte large-message area. */
struct lynx_geom {
  uint32_t n_mqueues, slots, slot_size, large_bytes;
  uint32_t actrl_off, fctrl_off;
  uint64_t rings_off, ring_bytes, slots_bytes, region_size;
};

LYNX_HD int lynx_is_pow2(uint32_t v) { return v && !(v & (v - 1)); }

LYNX_HD uint64_t lynx_align_up(uint64_t v, uint64_t a) {
  return (v + a - 1) & ~(a - 1);
}

/* Fills *g for Q mqueues of S slots of Z bytes, each ring with an L-byte
 * large-message area (0: none); 0 or -22 (EINVAL) when a parameter is out
 * of the documented bounds. */
LYNX_HD int lynx_geom_init(struct lynx_geom *g, uint32_t q, uint32_t s,
                           uint32_t z, uint32_t l) {
  uint64_t ctrl;
  if (q < 1 || q > LYNX_MQUEUES_MAX || !lynx_is_pow2(s) || s < LYNX_SLOTS_MIN ||
      s > LYNX_SLOTS_MAX || !lynx_is_pow2(z) || z < LYNX_SLOT_MIN ||
      z > LYNX_SLOT_MAX ||
      (l && (!lynx_is_pow2(l) || l < LYNX_LARGE_MIN || l > LYNX_LARGE_MAX)))
    return -22;
  ctrl = lynx_align_up(8ull * q, 64);
  g->n_mqueues = q;
  g->slots = s;
  g->slot_size = z;
  g->large_bytes = l;
  g->actrl_off = LYNX_OFF_ACTRL;
  g->fctrl_off = (uint32_t)(LYNX_OFF_ACTRL + ctrl);
  g->rings_off = lynx_align_up(LYNX_OFF_ACTRL + 2 * ctrl, LYNX_RINGS_ALIGN);
  g->slots_bytes = (uint64_t)s * z;
  g->ring_bytes = g->slots_bytes + l;
  g->region_size =
      lynx_align_up(g->rings_off + 2ull * q * g->ring_bytes, LYNX_RINGS_ALIGN);
  return 0;
}

LYNX_HD uint32_t lynx_slot_cap(uint32_t slot_size) {
  return slot_size - LYNX_META_SIZE;
}

/* The largest message a region takes: half its large area (so two of the
 * largest are in flight on each ring), or a slot's payload without one. */
LYNX_HD uint32_t lynx_msg_cap(const struct lynx_geom *g) {
  uint32_t cap = lynx_slot_cap(g->slot_size);
  return g->large_bytes / 2 > cap ? g->large_bytes / 2 : cap;
}

/* The large area a ring needs for messages of up to msg_max bytes with
 * slots of slot_size: 0 when a slot holds them, else the power of two at
 * least twice msg_max (and at least LYNX_LARGE_MIN). 0 also when msg_max
 * is beyond LYNX_LARGE_MAX / 2: the caller refuses (lynx_geom_init takes
 * any 0). */
LYNX_HD uint32_t lynx_large_for(uint32_t msg_max, uint32_t slot_size) {
  uint32_t l = LYNX_LARGE_MIN;
  if (msg_max <= lynx_slot_cap(slot_size) || msg_max > LYNX_LARGE_MAX / 2)
    return 0;
  while (l < 2 * msg_max)
    l *= 2;
  return l;
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

/* The large-message area of mqueue q's RX and TX rings. */
LYNX_HD uint64_t lynx_rx_large_off(const struct lynx_geom *g, uint32_t q) {
  return lynx_rx_ring_off(g, q) + g->slots_bytes;
}

LYNX_HD uint64_t lynx_tx_large_off(const struct lynx_geom *g, uint32_t q) {
  return lynx_tx_ring_off(g, q) + g->slots_bytes;
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
/* ld.acquire.sys / st.release.sys (PTX ISA 6.0, sm_70 and newer; the
 * build targets sm_80 and up): acquire and release at system scope, what
 * the host's __atomic pair is, without the full fence.sc.sys
 * (membar.sys) the volatile access plus __threadfence_system() cost on
 * every index and seq word, each draining the SM's outstanding writes to
 * host memory across PCIe. Generic addressing: the region may be GPU
 * memory or host memory mapped into the GPU. */
LYNX_HD uint32_t lynx_load_acquire32(const uint32_t *p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
LYNX_HD void lynx_store_release32(uint32_t *p, uint32_t v) {
  asm volatile("st.release.sys.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
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

/* ---- the large-message area ------------------------------------------ */

/*
 * Each ring's large area is a byte ring its producer allocates in order:
 * free-running byte counters head (next allocation) and tail (free up to),
 * a message never wrapping around the area's end (the rest of the area is
 * skipped). Messages are consumed in ring order, so the producer frees in
 * allocation order: consuming a large slot frees the area up to the end
 * its reference carries.
 */
struct lynx_large_alloc {
  uint32_t head, tail;
};

LYNX_HD uint32_t lynx_large_end(uint32_t start, uint32_t len) {
  return start + ((len + LYNX_LARGE_ALIGN - 1) & ~(LYNX_LARGE_ALIGN - 1));
}

/* The reference to a message of len bytes placed at free-running start in
 * an area of size bytes. */
LYNX_HD struct lynx_large_ref lynx_large_ref_at(uint32_t start, uint32_t len,
                                                uint32_t size) {
  struct lynx_large_ref r;
  r.off = start & (size - 1);
  r.len = len;
  r.end = lynx_large_end(start, len);
  r.reserved = 0;
  return r;
}

/* Where a message of len bytes (0 < len <= size) goes: its free-running
 * start in *start (the area offset is start & (size - 1)). 0, or -11
 * (EAGAIN) while the area has no room. An empty area skips to its start
 * when the message would not fit before its end, so a message of the
 * whole area always fits an empty one. */
LYNX_HD int lynx_large_place(struct lynx_large_alloc *a, uint32_t size,
                             uint32_t len, uint32_t *start) {
  uint32_t s = a->head, off = a->head & (size - 1);
  if (off + len > size) {
    s += size - off;
    if (a->head == a->tail)
      a->head = a->tail = s;
  }
  if (lynx_large_end(s, len) - a->tail > size)
    return -11;
  *start = s;
  return 0;
}

/* Frees the area up to end (a consumed message's): ignored unless end lies
 * within what is allocated, so a corrupted reference frees nothing. */
LYNX_HD void lynx_large_free(struct lynx_large_alloc *a, uint32_t end) {
  if (end - a->tail <= a->head - a->tail)
    a->tail = end;
}

/* Copies a reference out of a slot (volatile on the device, as metadata:
 * lynx_meta_load). */
LYNX_HD void lynx_ref_load(const struct lynx_large_ref *src,
                           struct lynx_large_ref *dst) {
#if defined(__CUDA_ARCH__)
  const volatile struct lynx_large_ref *v = src;
  dst->off = v->off;
  dst->len = v->len;
  dst->end = v->end;
  dst->reserved = v->reserved;
#else
  *dst = *src;
#endif
}

/* Bounds rule of a large slot (its metadata passed lynx_meta_check): 0 when
 * the reference lies inside an area of size bytes, -90 otherwise. */
LYNX_HD int lynx_large_check(const struct lynx_slot_meta *m,
                             const struct lynx_large_ref *r, uint32_t size) {
  if (m->len != sizeof(*r) || !size || r->off >= size || r->len > size - r->off)
    return -90;
  return 0;
}

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
  uint8_t *rx_large, *tx_large; /* the rings' large areas */
  struct lynx_actrl *actrl;     /* this mqueue's accelerator-written indices */
  /* a copy of them in host memory the accelerator also writes (after
   * actrl, with the same release), or NULL: a GPU whose region is in its
   * own memory gives the tcp agent one to read without a copy
   * (lynx_mq_mirror; docs/gpu.md) */
  struct lynx_actrl *mirror;
  const struct lynx_fctrl *fctrl; /* this mqueue's frontend-written indices */
  uint32_t slots, slot_size, large_bytes;
  uint32_t rx_head;              /* next position to receive */
  uint32_t rx_cons;              /* oldest position not yet released */
  uint32_t tx_prod;              /* next position to send */
  uint32_t tx_cons;              /* cached fctrl->tx_cons */
  uint32_t bad;                  /* malformed requests skipped */
  struct lynx_large_alloc tx_la; /* the TX large area */
  uint32_t tx_lscan; /* TX slots before it were looked at for frees */
  uint32_t tx_lopen; /* start of the open large reservation */
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
  mq->rx_large = region + lynx_rx_large_off(g, q);
  mq->tx_large = region + lynx_tx_large_off(g, q);
  mq->actrl = (struct lynx_actrl *)(region + lynx_actrl_off(g, q));
  mq->fctrl = (const struct lynx_fctrl *)(region + lynx_fctrl_off(g, q));
  mq->slots = g->slots;
  mq->slot_size = g->slot_size;
  mq->large_bytes = g->large_bytes;
  mq->rx_head = mq->rx_cons = lynx_load_acquire32(&mq->actrl->rx_cons);
  mq->tx_prod = lynx_load_acquire32(&mq->actrl->tx_prod);
  mq->tx_cons = lynx_load_acquire32(&mq->fctrl->tx_cons);
  mq->mirror = 0;
  mq->bad = 0;
  mq->tx_la.head = mq->tx_la.tail = 0;
  mq->tx_lscan = mq->tx_prod;
  mq->tx_lopen = 0;
}

LYNX_HD struct lynx_slot_meta *lynx_mq_meta(uint8_t *ring, uint32_t slot_size,
                                            uint32_t slots, uint32_t pos) {
  return (struct lynx_slot_meta *)(ring +
                                   (uint64_t)(pos & (slots - 1)) * slot_size +
                                   slot_size - LYNX_META_SIZE);
}

/* Where a slot's payload (or large reference) begins, from its metadata. */
LYNX_HD uint8_t *lynx_meta_payload(struct lynx_slot_meta *meta,
                                   uint32_t slot_size, uint16_t off16) {
  return (uint8_t *)meta - (slot_size - LYNX_META_SIZE) + (uint32_t)off16 * 16u;
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

/* Resolves a published RX slot into *m: 0, or -90 when it breaks the bounds
 * rule (the slot's, or its large reference's). */
LYNX_HD int lynx_mq_resolve(const struct lynx_mq *mq,
                            struct lynx_slot_meta *meta, struct lynx_msg *m) {
  struct lynx_slot_meta mv;
  uint8_t *p;
  lynx_meta_load(meta, &mv);
  m->tag = mv.tag;
  if (lynx_meta_check(&mv, mq->slot_size) != 0)
    return -90;
  p = lynx_meta_payload(meta, mq->slot_size, mv.off16);
  if (mv.status & LYNX_ST_LARGE) {
    struct lynx_large_ref ref;
    lynx_ref_load((const struct lynx_large_ref *)p, &ref);
    if (lynx_large_check(&mv, &ref, mq->large_bytes) != 0)
      return -90;
    m->data = mq->rx_large + ref.off;
    m->len = ref.len;
    m->status = (uint16_t)(mv.status & ~LYNX_ST_LARGE);
    return 0;
  }
  m->data = p;
  m->len = mv.len;
  m->status = mv.status;
  return 0;
}

/* The indices also written to m (host memory the accelerator reaches),
 * starting with their values now. */
LYNX_HD void lynx_mq_mirror(struct lynx_mq *mq, struct lynx_actrl *m) {
  mq->mirror = m;
  lynx_store_release32(&m->rx_cons, mq->rx_cons);
  lynx_store_release32(&m->tx_prod, mq->tx_prod);
}

/* lynx_mq_bind, and where mirrors is not NULL (one struct lynx_actrl per
 * mqueue of the region) the indices also written to mirrors[q]. */
LYNX_HD void lynx_mq_bind_mirrored(struct lynx_mq *mq, uint8_t *region,
                                   const struct lynx_geom *g, uint32_t q,
                                   struct lynx_actrl *mirrors) {
  lynx_mq_bind(mq, region, g, q);
  if (mirrors)
    lynx_mq_mirror(mq, mirrors + q);
}

/* rx_cons and tx_prod published: actrl, then the mirror. */
LYNX_HD void lynx_mq_put_rx_cons(struct lynx_mq *mq) {
  lynx_store_release32(&mq->actrl->rx_cons, mq->rx_cons);
  if (mq->mirror)
    lynx_store_release32(&mq->mirror->rx_cons, mq->rx_cons);
}
LYNX_HD void lynx_mq_put_tx_prod(struct lynx_mq *mq) {
  lynx_store_release32(&mq->actrl->tx_prod, mq->tx_prod);
  if (mq->mirror)
    lynx_store_release32(&mq->mirror->tx_prod, mq->tx_prod);
}

/* Releases the oldest received request (receive order), together with any
 * malformed slots recv skipped right behind it, so skipped slots never leak. */
LYNX_HD void lynx_mq_release(struct lynx_mq *mq) {
  struct lynx_msg mm;
  if (mq->rx_cons == mq->rx_head)
    return;
  for (;;) {
    mq->rx_cons++;
    if (mq->rx_cons == mq->rx_head)
      break;
    if (lynx_mq_resolve(
            mq, lynx_mq_meta(mq->rx, mq->slot_size, mq->slots, mq->rx_cons),
            &mm) == 0)
      break;
  }
  lynx_mq_put_rx_cons(mq);
}

/*
 * Next request, zero copy. Returns 0 and fills *m, -11 (EAGAIN) when there
 * is none, -105 (ENOBUFS) when every slot is held unreleased by the caller.
 * A large message is seen whole, in place in the ring's large area.
 * Malformed slots (bounds rule) are released, counted in mq->bad, skipped.
 * lynx_mq_recv_seen: the same, positions before acq known published (an
 * acquire load of a later or the same position's seq showed it: the
 * look-ahead's, lathist.h), so their seq words are not loaded again; on a
 * GPU reading host memory each is a round trip across PCIe.
 */
LYNX_HD int lynx_mq_recv_seen(struct lynx_mq *mq, struct lynx_msg *m,
                              uint32_t acq) {
  for (;;) {
    struct lynx_slot_meta *meta;
    if (mq->rx_head - mq->rx_cons >= mq->slots)
      return -105;
    meta = lynx_mq_meta(mq->rx, mq->slot_size, mq->slots, mq->rx_head);
    /* published, as an acquire load before showed (acq), or as this one
     * shows */
    if ((int32_t)(acq - mq->rx_head) <= 0 &&
        lynx_load_acquire32(&meta->seq) != lynx_seq_for(mq->rx_head))
      return -11;
    if (lynx_mq_resolve(mq, meta, m) != 0) {
      mq->bad++;
      mq->rx_head++;
      /* Releases are in order: with nothing held, free the slot now;
       * otherwise lynx_mq_release frees it after the held one before it. */
      if (mq->rx_cons + 1 == mq->rx_head) {
        mq->rx_cons++;
        lynx_mq_put_rx_cons(mq);
      }
      continue;
    }
    mq->rx_head++;
    return 0;
  }
}

LYNX_HD int lynx_mq_recv(struct lynx_mq *mq, struct lynx_msg *m) {
  return lynx_mq_recv_seen(mq, m, mq->rx_head);
}

/* 1 when a request is waiting at rx_head (cheap check for idle loops). */
LYNX_HD int lynx_mq_rx_ready(const struct lynx_mq *mq) {
  const struct lynx_slot_meta *meta =
      lynx_mq_meta(mq->rx, mq->slot_size, mq->slots, mq->rx_head);
  return lynx_load_acquire32(&meta->seq) == lynx_seq_for(mq->rx_head);
}

/* The large-message reference this mqueue's own TX slot at pos carries:
 * 1 and *ref, or 0 when the slot holds its answer inline. */
LYNX_HD int lynx_mq_tx_large_ref(struct lynx_mq *mq, uint32_t pos,
                                 struct lynx_large_ref *ref) {
  struct lynx_slot_meta *meta =
                            lynx_mq_meta(mq->tx, mq->slot_size, mq->slots, pos),
                        mv;
  lynx_meta_load(meta, &mv);
  if (!(mv.status & LYNX_ST_LARGE))
    return 0;
  lynx_ref_load((const struct lynx_large_ref *)lynx_meta_payload(
                    meta, mq->slot_size, mv.off16),
                ref);
  return 1;
}

/* A producer that takes a mqueue over from one that left it (a plug-in's
 * new process, agent/apphost.c), right after lynx_mq_bind: its TX large
 * area as the answers not yet read, [tx_cons, tx_prod), hold it, so that
 * new answers are placed after theirs and never over them. */
LYNX_HD void lynx_mq_tx_resume(struct lynx_mq *mq) {
  int any = 0;
  mq->tx_la.head = mq->tx_la.tail = 0;
  mq->tx_lscan = mq->tx_cons;
  if (mq->tx_prod - mq->tx_cons > mq->slots) { /* a bad index */
    mq->tx_lscan = mq->tx_prod;
    return;
  }
  for (uint32_t pos = mq->tx_cons; pos != mq->tx_prod; pos++) {
    struct lynx_large_ref ref;
    if (!lynx_mq_tx_large_ref(mq, pos, &ref))
      continue;
    if (!any)
      mq->tx_la.tail = ref.end - lynx_large_end(0, ref.len);
    mq->tx_la.head = ref.end;
    any = 1;
  }
}

/* Frees the TX large area of the large slots the frontend consumed since
 * the last look: call after reading tx_cons. Reads back the references in
 * this mqueue's own TX slots, which stay until tx_prod laps them (only
 * possible past tx_cons, so always after this look). */
LYNX_HD void lynx_mq_tx_reclaim(struct lynx_mq *mq) {
  if (mq->tx_cons - mq->tx_lscan > mq->tx_prod - mq->tx_lscan)
    return; /* tx_cons beyond what was sent: a bad index, nothing freed */
  while (mq->tx_lscan != mq->tx_cons) {
    struct lynx_large_ref ref;
    if (mq->tx_la.head == mq->tx_la.tail) {
      mq->tx_lscan = mq->tx_cons; /* nothing allocated: nothing to free */
      return;
    }
    if (lynx_mq_tx_large_ref(mq, mq->tx_lscan, &ref))
      lynx_large_free(&mq->tx_la, ref.end);
    mq->tx_lscan++;
  }
}

/*
 * Reserves a TX slot for a response of at most max_len bytes and returns a
 * pointer to where the payload goes (*buf): in the slot, or in the TX
 * ring's large area when max_len exceeds a slot's payload. 0, -11 (EAGAIN)
 * when the TX ring (or its large area) is full, -90 (EMSGSIZE) when
 * max_len exceeds the slot and there is no large area or it is larger than
 * the area. Commit with lynx_mq_commit; at most one reservation is open at
 * a time.
 */
LYNX_HD int lynx_mq_reserve(struct lynx_mq *mq, uint32_t max_len,
                            uint8_t **buf) {
  uint32_t cap = lynx_slot_cap(mq->slot_size), start = 0;
  int large = max_len > cap;
  if (large && max_len > mq->large_bytes)
    return -90;
  if (lynx_ring_full(mq->tx_prod, mq->tx_cons, mq->slots) ||
      (large &&
       lynx_large_place(&mq->tx_la, mq->large_bytes, max_len, &start) != 0)) {
    mq->tx_cons = lynx_load_acquire32(&mq->fctrl->tx_cons);
    lynx_mq_tx_reclaim(mq);
    if (lynx_ring_full(mq->tx_prod, mq->tx_cons, mq->slots) ||
        (large &&
         lynx_large_place(&mq->tx_la, mq->large_bytes, max_len, &start) != 0))
      return -11;
  }
  if (large) {
    mq->tx_lopen = start;
    *buf = mq->tx_large + (start & (mq->large_bytes - 1));
    return 0;
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
  if (max_len > lynx_slot_cap(mq->slot_size)) {
    uint32_t poff = lynx_payload_off(mq->slot_size,
                                     (uint32_t)sizeof(struct lynx_large_ref));
    struct lynx_large_ref r =
        lynx_large_ref_at(mq->tx_lopen, len, mq->large_bytes);
    *(struct lynx_large_ref *)lynx_meta_payload(meta, mq->slot_size,
                                                (uint16_t)(poff / 16u)) = r;
    mq->tx_la.head = r.end;
    len = (uint32_t)sizeof(r);
    max_len = len;
    status = (uint16_t)(status | LYNX_ST_LARGE);
  }
  meta->len = len;
  meta->tag = tag;
  meta->status = status;
  meta->off16 = (uint16_t)(lynx_payload_off(mq->slot_size, max_len) / 16u);
  lynx_store_release32(&meta->seq, lynx_seq_for(mq->tx_prod));
  mq->tx_prod++;
  lynx_mq_put_tx_prod(mq);
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
