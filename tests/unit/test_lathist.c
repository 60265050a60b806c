/*
 * test_lathist.c - accelerator latency stamps and histograms
 * (include/lynx/lathist.h): bucket bounds, quantiles over a window, first-seen
 * stamps over a real ring, the Prometheus histogram text.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "lathist.h"
#include "prom.h"
#include "ut_main.h"
#include "ut_ring.h"

/* Every duration falls in the bucket whose bounds hold it; bounds grow. */
static void test_buckets(void **state) {
  uint64_t probes[] = {0,
                       1,
                       127,
                       128,
                       129,
                       159,
                       160,
                       191,
                       192,
                       255,
                       256,
                       1000,
                       4095,
                       4096,
                       65535,
                       1000000,
                       999999999,
                       1ull << 30,
                       (1ull << 31) - 1,
                       1ull << 31,
                       1ull << 40,
                       UINT64_MAX};
  (void)state;
  assert_int_equal(lynx_lat_bucket(0), 0);
  assert_int_equal(lynx_lat_bucket(127), 0);
  assert_int_equal(lynx_lat_bucket(128), 1);
  assert_int_equal(lynx_lat_bucket(160), 2); /* 128 + 32: the next quarter */
  assert_int_equal(lynx_lat_bucket(256), 5);
  assert_int_equal(lynx_lat_bucket(UINT64_MAX), LYNX_LAT_BUCKETS - 1);
  for (size_t i = 0; i < sizeof(probes) / sizeof(probes[0]); i++) {
    uint32_t b = lynx_lat_bucket(probes[i]);
    assert_true(lynx_lat_bucket_lo(b) <= probes[i]);
    assert_true(probes[i] < lynx_lat_bucket_hi(b) ||
                lynx_lat_bucket_hi(b) == UINT64_MAX);
  }
  for (uint32_t b = 0; b + 1 < LYNX_LAT_BUCKETS; b++) {
    assert_true(lynx_lat_bucket_lo(b) < lynx_lat_bucket_hi(b));
    assert_int_equal(lynx_lat_bucket_hi(b), lynx_lat_bucket_lo(b + 1));
    /* within 25% of its lower bound past the first: quantiles to 12.5% */
    if (b > 1)
      assert_true(lynx_lat_bucket_hi(b) - lynx_lat_bucket_lo(b) <=
                  lynx_lat_bucket_lo(b) / 4 + 1);
  }
  assert_int_equal(lynx_lat_bucket_hi(LYNX_LAT_BUCKETS - 1), UINT64_MAX);
}

/* p50/p99 of known values land in their buckets; a window (cur - old)
 * sees only what came after old. */
static void test_quantiles(void **state) {
  struct lynx_lat_hist *h = calloc(1, sizeof(*h)),
                       *old = calloc(1, sizeof(*old));
  uint64_t n, v;
  (void)state;
  assert_int_equal(lynx_lat_quantile(h, NULL, 0.5, &n), 0);
  assert_int_equal(n, 0);
  for (int i = 0; i < 99; i++)
    lynx_lat_add(h, 10000); /* 10 us */
  lynx_lat_add(h, 5000000); /* one of 5 ms */
  assert_int_equal(lynx_lat_count(h), 100);
  assert_int_equal(h->sum_ns, 99 * 10000ull + 5000000ull);
  v = lynx_lat_quantile(h, NULL, 0.5, &n);
  assert_int_equal(n, 100);
  assert_true(v >= lynx_lat_bucket_lo(lynx_lat_bucket(10000)) &&
              v < lynx_lat_bucket_hi(lynx_lat_bucket(10000)));
  v = lynx_lat_quantile(h, NULL, 0.99, NULL);
  assert_true(v <= lynx_lat_bucket_hi(lynx_lat_bucket(10000)));
  v = lynx_lat_quantile(h, NULL, 1.0, NULL);
  assert_true(v >= lynx_lat_bucket_lo(lynx_lat_bucket(5000000)) &&
              v <= lynx_lat_bucket_hi(lynx_lat_bucket(5000000)));
  /* the window since a snapshot: only the slow ones after it */
  memcpy(old, h, sizeof(*h));
  for (int i = 0; i < 10; i++)
    lynx_lat_add(h, 3000000);
  v = lynx_lat_quantile(h, old, 0.5, &n);
  assert_int_equal(n, 10);
  assert_true(v >= lynx_lat_bucket_lo(lynx_lat_bucket(3000000)) &&
              v < lynx_lat_bucket_hi(lynx_lat_bucket(3000000)));
  /* a source that restarted (counts below the snapshot) is not negative */
  memset(h, 0, sizeof(*h));
  assert_int_equal(lynx_lat_quantile(h, old, 0.5, &n), 0);
  assert_int_equal(n, 0);
  free(h);
  free(old);
}

/* First-seen stamps: requests are stamped when a scan first finds them,
 * up to LYNX_SEEN_WIN ahead of the head; one taken before any scan saw it
 * counts as seen when taken. */
static void test_seen(void **state) {
  struct ut_region r;
  struct lynx_mq mq;
  struct lynx_seen s;
  struct lynx_msg m;
  uint8_t b[8] = {0};
  (void)state;
  assert_int_equal(ut_region_init(&r, 1, 16, 256), 0);
  lynx_mq_bind(&mq, r.mem, &r.g, 0);
  memset(&s, 0, sizeof(s));
  assert_int_equal(lynx_seen_scan(&s, &mq, 100), 0); /* empty */
  ut_put(&r, 0, 0, 1, b, sizeof(b));
  ut_put(&r, 0, 1, 2, b, sizeof(b));
  assert_int_equal(lynx_seen_scan(&s, &mq, 200), 1);
  ut_put(&r, 0, 2, 3, b, sizeof(b));
  assert_int_equal(lynx_seen_scan(&s, &mq, 300), 1);
  assert_int_equal(lynx_seen_scan(&s, &mq, 400), 1); /* nothing new */
  assert_int_equal(lynx_mq_recv(&mq, &m), 0);
  assert_int_equal(lynx_seen_at(&s, mq.rx_head - 1, 500), 200);
  lynx_mq_release(&mq);
  assert_int_equal(lynx_mq_recv(&mq, &m), 0);
  assert_int_equal(lynx_seen_at(&s, mq.rx_head - 1, 500), 200);
  lynx_mq_release(&mq);
  assert_int_equal(lynx_mq_recv(&mq, &m), 0);
  assert_int_equal(lynx_seen_at(&s, mq.rx_head - 1, 500), 300);
  lynx_mq_release(&mq);
  /* never scanned: seen when taken */
  ut_put(&r, 0, 3, 4, b, sizeof(b));
  assert_int_equal(lynx_mq_recv(&mq, &m), 0);
  assert_int_equal(lynx_seen_at(&s, mq.rx_head - 1, 600), 600);
  lynx_mq_release(&mq);
  /* a deep ring: only the window ahead of the head is stamped */
  for (uint32_t p = 4; p < 4 + 12; p++)
    ut_put(&r, 0, p, p, b, sizeof(b));
  assert_int_equal(lynx_seen_scan(&s, &mq, 700), 1);
  assert_int_equal(s.pos, 4 + LYNX_SEEN_WIN);
  for (uint32_t k = 0; k < LYNX_SEEN_WIN; k++) {
    assert_int_equal(lynx_mq_recv(&mq, &m), 0);
    assert_int_equal(lynx_seen_at(&s, mq.rx_head - 1, 900), 700);
    lynx_mq_release(&mq);
  }
  assert_int_equal(lynx_seen_scan(&s, &mq, 800), 1); /* the other four */
  assert_int_equal(s.pos, 16);
  assert_int_equal(lynx_mq_recv(&mq, &m), 0);
  assert_int_equal(lynx_seen_at(&s, mq.rx_head - 1, 900), 800);
  ut_region_free(&r);
}

/* What a scan's acquire load showed published (the head it first finds,
 * and every position before it: the producer publishes in order) is
 * received without loading its seq word again (lynx_mq_recv_seen), one
 * PCIe round trip per request on a GPU over host memory; anything past it
 * is looked at as before. A stale mark never wraps ahead of the head. */
static void test_recv_seen(void **state) {
  struct ut_region r;
  struct lynx_mq mq, copy;
  struct lynx_seen s;
  struct lynx_msg m;
  uint8_t b[8] = {0};
  uint32_t *seq0, *seq2;
  (void)state;
  assert_int_equal(ut_region_init(&r, 1, 16, 256), 0);
  lynx_mq_bind(&mq, r.mem, &r.g, 0);
  memset(&s, 0, sizeof(s));
  ut_put(&r, 0, 0, 1, b, sizeof(b));
  ut_put(&r, 0, 1, 2, b, sizeof(b));
  assert_int_equal(lynx_seen_scan(&s, &mq, 100), 1);
  assert_int_equal(s.pos, 2);
  assert_int_equal(s.acq, 1); /* slot 0 by acquire; slot 1 only peeked */
  /* slot 0's seq word is not loaded again: spoilt now, it is received
   * anyway, where a plain receive (which loads it) finds nothing */
  seq0 = &lynx_mq_meta(mq.rx, mq.slot_size, mq.slots, 0)->seq;
  *seq0 = 0xdead;
  copy = mq;
  assert_int_equal(lynx_mq_recv(&copy, &m), -11);
  assert_int_equal(lynx_mq_recv_seen(&mq, &m, s.acq), 0);
  assert_int_equal(m.tag, 1);
  lynx_mq_release(&mq);
  /* slot 1 was not acquired: loaded, published, received */
  assert_int_equal(lynx_mq_recv_seen(&mq, &m, s.acq), 0);
  assert_int_equal(m.tag, 2);
  lynx_mq_release(&mq);
  /* past the mark, a slot is looked at: spoilt, nothing is there */
  ut_put(&r, 0, 2, 3, b, sizeof(b));
  seq2 = &lynx_mq_meta(mq.rx, mq.slot_size, mq.slots, 2)->seq;
  *seq2 = 0xbeef;
  assert_int_equal(lynx_mq_recv_seen(&mq, &m, s.acq), -11);
  /* a mark 2^31 behind the head would read as ahead: the scan keeps it
   * between the head and what it has seen */
  s.acq = mq.rx_head - 0x80000005u;
  lynx_seen_scan(&s, &mq, 200);
  assert_int_equal(s.acq, mq.rx_head);
  assert_int_equal(lynx_mq_recv_seen(&mq, &m, s.acq), -11);
  ut_region_free(&r);
}

static void test_prom_histogram(void **state) {
  struct lynx_lat_hist *h = calloc(1, sizeof(*h));
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  (void)state;
  assert_non_null(f);
  lynx_lat_add(h, 100);  /* below 128 ns */
  lynx_lat_add(h, 3000); /* in (2048, 4096] */
  lynx_lat_add(h, 3000);
  lynx_lat_add(h, 1ull << 40); /* beyond every bound */
  lynx_prom_histogram(
      f, "lynx_t_seconds",
      (const struct lynx_prom_label[]){{"accel", "0"}, {NULL, NULL}}, h);
  assert_int_equal(fclose(f), 0);
  assert_non_null(
      strstr(buf, "lynx_t_seconds_bucket{accel=\"0\",le=\"0.000000128\"} 1\n"));
  assert_non_null(
      strstr(buf, "lynx_t_seconds_bucket{accel=\"0\",le=\"0.000002048\"} 1\n"));
  assert_non_null(
      strstr(buf, "lynx_t_seconds_bucket{accel=\"0\",le=\"0.000004096\"} 3\n"));
  assert_non_null(
      strstr(buf, "lynx_t_seconds_bucket{accel=\"0\",le=\"4.294967296\"} 3\n"));
  assert_non_null(
      strstr(buf, "lynx_t_seconds_bucket{accel=\"0\",le=\"+Inf\"} 4\n"));
  assert_non_null(strstr(buf, "lynx_t_seconds_count{accel=\"0\"} 4\n"));
  assert_non_null(
      strstr(buf, "lynx_t_seconds_sum{accel=\"0\"} 1099.511633876\n"));
  free(buf);
  free(h);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_buckets),        cmocka_unit_test(test_quantiles),
      cmocka_unit_test(test_seen),           cmocka_unit_test(test_recv_seen),
      cmocka_unit_test(test_prom_histogram),
  };
  return LYNX_UT_MAIN(argc, argv, "lathist", tests, NULL, NULL);
}
