/*
 * lathist.h - accelerator-stamped latency: when a request was first seen
 * in its RX ring, when it was taken, when its answer (or drop) was
 * published; and the histograms those times go into.
 *
 * Every accelerator stamps its own requests with its own clock: a GPU with
 * %globaltimer (the same clock on every SM), a CPU accelerator with
 * lynx_now_ns. Two times per request (docs/metrics.md, "Accelerator
 * latency"):
 *
 *   queueing  taken - first seen: how long the request waited in its RX
 *             ring while the accelerator could see it. The accelerator
 *             looks ahead of each ring's head on every pass over its
 *             mqueues (lynx_seen_scan) and stamps each request the first
 *             time it finds it published, up to LYNX_SEEN_WIN requests
 *             ahead of the head. Not counted: the time before the first
 *             look (at most one pass, or one idle sleep), and, for a
 *             request more than LYNX_SEEN_WIN deep in its ring, the time
 *             until it came within the window: under overload the figure
 *             is a floor.
 *   service   published - taken: the application's time, including any
 *             wait for room in a full TX ring.
 *
 * Histograms have LYNX_LAT_BUCKETS log-linear buckets: [0, 128 ns), then
 * four per power of two (quantiles within 12.5%), the last one open from
 * 12.9 s (1.5 x 2^33 ns). The same code runs on the host and the GPU (LYNX_HD);
 * each histogram has one writer.
 */
#ifndef LYNX_LATHIST_H
#define LYNX_LATHIST_H

#include <stdint.h>

#include "mqueue.h"

#define LYNX_LAT_BUCKETS 108u
#define LYNX_LAT_MIN_LOG2 7u /* bucket 0: below 2^7 ns */
#define LYNX_LAT_SUB 4u      /* buckets per power of two */

/* A request is stamped when first seen at most this far ahead of its
 * ring's head (a power of two). */
#define LYNX_SEEN_WIN 8u

struct lynx_lat_hist {
  uint64_t b[LYNX_LAT_BUCKETS];
  uint64_t sum_ns; /* of every value added (wraps after 584 years) */
};

/* The two histograms of one accelerator (or one of its threads/blocks). */
struct lynx_lat {
  struct lynx_lat_hist queue, service;
};

LYNX_HD uint32_t lynx_lat_log2(uint64_t v) { /* v > 0 */
  uint32_t l = 0;
  while (v >>= 1)
    l++;
  return l;
}

/* The bucket of a duration of ns nanoseconds. */
LYNX_HD uint32_t lynx_lat_bucket(uint64_t ns) {
  uint32_t l, b;
  if (ns < (1ull << LYNX_LAT_MIN_LOG2))
    return 0;
  l = lynx_lat_log2(ns);
  b = 1u + (l - LYNX_LAT_MIN_LOG2) * LYNX_LAT_SUB +
      (uint32_t)((ns >> (l - 2u)) & (LYNX_LAT_SUB - 1u));
  return b < LYNX_LAT_BUCKETS ? b : LYNX_LAT_BUCKETS - 1u;
}

/* Bucket b holds [lo, hi): its lower bound in ns. */
LYNX_HD uint64_t lynx_lat_bucket_lo(uint32_t b) {
  uint32_t l;
  if (b == 0)
    return 0;
  l = LYNX_LAT_MIN_LOG2 + (b - 1u) / LYNX_LAT_SUB;
  return (1ull << l) + (uint64_t)((b - 1u) % LYNX_LAT_SUB) * (1ull << (l - 2u));
}

/* Its upper bound (exclusive); UINT64_MAX for the last, open bucket. */
LYNX_HD uint64_t lynx_lat_bucket_hi(uint32_t b) {
  return b + 1u >= LYNX_LAT_BUCKETS ? UINT64_MAX : lynx_lat_bucket_lo(b + 1u);
}

/* ---- first-seen stamps --------------------------------------------------- */

/* One mqueue's stamps: positions below pos were seen, the last
 * LYNX_SEEN_WIN of them at ns[position % LYNX_SEEN_WIN]. */
struct lynx_seen {
  uint32_t pos;
  /* positions before acq were published as an acquire load showed (the
   * head's, below): lynx_mq_recv_seen receives them without loading their
   * seq word again */
  uint32_t acq;
  uint64_t ns[LYNX_SEEN_WIN];
};

/* A seq word as it is now, with no ordering: the scan only learns that a
 * request is there (its contents are read after lynx_mq_recv's acquire),
 * and a GPU thread then pays no system-scope fence per look. */
LYNX_HD uint32_t lynx_seq_peek(const uint32_t *p) {
#if defined(__CUDA_ARCH__)
  return *(const volatile uint32_t *)p;
#else
  return __atomic_load_n(p, __ATOMIC_RELAXED);
#endif
}

/* Stamps with now every request published in mq's RX ring that was not
 * seen before, from the head up to LYNX_SEEN_WIN ahead of it. Reads only
 * seq words, never consumes. 1 when a request waits at the head.
 *
 * One load first (an idle ring costs one), then, when that slot is
 * published, the rest of the window's loads issued together before any is
 * looked at: on a GPU each is a round trip across PCIe to a host-mapped
 * ring, and loads that each waited for the one before would be up to
 * LYNX_SEEN_WIN round trips in series. */
LYNX_HD int lynx_seen_scan(struct lynx_seen *s, const struct lynx_mq *mq,
                           uint64_t now) {
  uint32_t seq[LYNX_SEEN_WIN], ahead, used, n, k;
  if ((int32_t)(s->pos - mq->rx_head) < 0)
    s->pos = mq->rx_head; /* fell behind (a malformed slot was skipped) */
  /* acq lies in [rx_head, pos]: one behind the head (its requests taken)
   * or anywhere else (it would wrap ahead of the head) starts at the head */
  if (s->acq - mq->rx_head > s->pos - mq->rx_head)
    s->acq = mq->rx_head;
  ahead = s->pos - mq->rx_head; /* the window's part already seen */
  used = s->pos - mq->rx_cons;  /* slots up to pos the producer may fill */
  n = ahead < LYNX_SEEN_WIN && used < mq->slots ? LYNX_SEEN_WIN - ahead : 0;
  if (n > mq->slots - used)
    n = mq->slots - used;
  /* the first with acquire: the producer publishes in order, so its seq
   * orders every earlier slot's bytes too, and receive need not load any
   * of them again (s->acq) */
  if (!n || lynx_load_acquire32(
                &lynx_mq_meta(mq->rx, mq->slot_size, mq->slots, s->pos)->seq) !=
                lynx_seq_for(s->pos))
    return s->pos != mq->rx_head;
  s->acq = s->pos + 1;
  /* a constant trip count, unrolled: seq[] stays in registers and the
   * loads have no store between them that would wait for one to land */
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (k = 1; k < LYNX_SEEN_WIN; k++)
    seq[k] = k < n ? lynx_seq_peek(&lynx_mq_meta(mq->rx, mq->slot_size,
                                                 mq->slots, s->pos + k)
                                        ->seq)
                   : 0;
  s->ns[s->pos % LYNX_SEEN_WIN] = now;
  s->pos++;
  {
    int more = 1; /* unrolled too, so that seq[] is never indexed at run time */
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (k = 1; k < LYNX_SEEN_WIN; k++) {
      more = more && k < n && seq[k] == lynx_seq_for(s->pos);
      if (more) {
        s->ns[s->pos % LYNX_SEEN_WIN] = now;
        s->pos++;
      }
    }
  }
  return s->pos != mq->rx_head;
}

/* When the request at position p was first seen; now when it never was
 * (taken before any scan found it). */
LYNX_HD uint64_t lynx_seen_at(const struct lynx_seen *s, uint32_t p,
                              uint64_t now) {
  uint32_t ahead = s->pos - p; /* p < pos: seen */
  if (ahead == 0 || ahead > LYNX_SEEN_WIN)
    return now;
  return s->ns[p % LYNX_SEEN_WIN] <= now ? s->ns[p % LYNX_SEEN_WIN] : now;
}

/* ---- host side ----------------------------------------------------------- */

#if !defined(__CUDA_ARCH__)
/* Adds one duration. Single writer; readers on other threads see each
 * word whole (relaxed atomics), possibly a mix of two consecutive adds. */
static inline void lynx_lat_add(struct lynx_lat_hist *h, uint64_t ns) {
  uint64_t *c = &h->b[lynx_lat_bucket(ns)];
  __atomic_store_n(c, __atomic_load_n(c, __ATOMIC_RELAXED) + 1,
                   __ATOMIC_RELAXED);
  __atomic_store_n(&h->sum_ns,
                   __atomic_load_n(&h->sum_ns, __ATOMIC_RELAXED) + ns,
                   __ATOMIC_RELAXED);
}

/* dst += src (both whole snapshots or live histograms of one writer). */
static inline void lynx_lat_merge(struct lynx_lat_hist *dst,
                                  const struct lynx_lat_hist *src) {
  for (uint32_t i = 0; i < LYNX_LAT_BUCKETS; i++)
    dst->b[i] += __atomic_load_n(&src->b[i], __ATOMIC_RELAXED);
  dst->sum_ns += __atomic_load_n(&src->sum_ns, __ATOMIC_RELAXED);
}

/* Values in h. */
uint64_t lynx_lat_count(const struct lynx_lat_hist *h);

/* The q-quantile (0 < q <= 1) of what was added to cur since old (NULL:
 * since the start), interpolated within its bucket, in ns; 0 when nothing
 * was. *n: how many values that is (may be NULL). */
uint64_t lynx_lat_quantile(const struct lynx_lat_hist *cur,
                           const struct lynx_lat_hist *old, double q,
                           uint64_t *n);
#endif

#endif
