/*
 * lathist.c - host-side reading of latency histograms (lathist.h).
 */
#include "lathist.h"

uint64_t lynx_lat_count(const struct lynx_lat_hist *h) {
  uint64_t n = 0;
  for (uint32_t i = 0; i < LYNX_LAT_BUCKETS; i++)
    n += __atomic_load_n(&h->b[i], __ATOMIC_RELAXED);
  return n;
}

static uint64_t delta(const struct lynx_lat_hist *cur,
                      const struct lynx_lat_hist *old, uint32_t i) {
  uint64_t c = __atomic_load_n(&cur->b[i], __ATOMIC_RELAXED);
  uint64_t o = old ? old->b[i] : 0;
  return c > o ? c - o : 0; /* a restarted source counts from zero */
}

uint64_t lynx_lat_quantile(const struct lynx_lat_hist *cur,
                           const struct lynx_lat_hist *old, double q,
                           uint64_t *n) {
  uint64_t total = 0, seen = 0;
  double rank;
  for (uint32_t i = 0; i < LYNX_LAT_BUCKETS; i++)
    total += delta(cur, old, i);
  if (n)
    *n = total;
  if (!total)
    return 0;
  if (q <= 0)
    q = 0;
  if (q > 1)
    q = 1;
  rank = q * (double)total; /* the value with this many at or below it */
  for (uint32_t i = 0; i < LYNX_LAT_BUCKETS; i++) {
    uint64_t d = delta(cur, old, i);
    uint64_t lo = lynx_lat_bucket_lo(i), hi = lynx_lat_bucket_hi(i);
    if (!d || (double)(seen + d) < rank) {
      seen += d;
      continue;
    }
    if (hi == UINT64_MAX) /* the open bucket: its lower bound is all we know */
      return lo;
    /* linear within the bucket, as Prometheus' histogram_quantile */
    return lo +
           (uint64_t)((double)(hi - lo) * ((rank - (double)seen) / (double)d));
  }
  return lynx_lat_bucket_lo(LYNX_LAT_BUCKETS - 1u);
}
