/*
 * test_face.c - unit tests of accel/face.c: LBP codes and bins, the
 * chi-square distance, the wire formats and the synthetic database
 * (determinism, genuine vs impostor separation).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "face.h"
#include "ut_main.h"

#define SEED 0x5EEDull
/* face_label(1, 0) and the FNV-1a hash of face_image(1, 0) */
#define FACE_TEST_LABEL_1_0 "face:2a4brcmvqes7"
#define FACE_TEST_FNV_1_0 0xf7628f75u

/* ---- LBP ---- */

/* A 3x3 patch, centre c, neighbours n[p] in the code's clockwise order. */
static void patch(uint8_t img[9], uint8_t c, const uint8_t n[8]) {
  /* p0 (0,0) p1 (1,0) p2 (2,0) p3 (2,1) p4 (2,2) p5 (1,2) p6 (0,2) p7 (0,1) */
  img[0] = n[0];
  img[1] = n[1];
  img[2] = n[2];
  img[5] = n[3];
  img[8] = n[4];
  img[7] = n[5];
  img[6] = n[6];
  img[3] = n[7];
  img[4] = c;
}

static void test_lbp_codes(void **state) {
  (void)state;
  uint8_t img[9];
  const uint8_t dark[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const uint8_t bright[8] = {9, 9, 9, 9, 9, 9, 9, 9};
  const uint8_t equal[8] = {5, 5, 5, 5, 5, 5, 5, 5};
  patch(img, 5, dark);
  assert_int_equal(face_lbp_code(img, 3, 3, 1, 1), 0x00);
  patch(img, 5, bright);
  assert_int_equal(face_lbp_code(img, 3, 3, 1, 1), 0xff);
  patch(img, 5, equal); /* ">=": ties count as set bits */
  assert_int_equal(face_lbp_code(img, 3, 3, 1, 1), 0xff);
  /* each neighbour alone brighter: its own bit */
  for (int p = 0; p < 8; p++) {
    uint8_t n[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    n[p] = 200;
    patch(img, 100, n);
    assert_int_equal(face_lbp_code(img, 3, 3, 1, 1), 1u << p);
  }
  /* a horizontal edge: the top row brighter -> bits 0, 1, 2 */
  const uint8_t edge[8] = {50, 50, 50, 10, 10, 10, 10, 10};
  patch(img, 20, edge);
  assert_int_equal(face_lbp_code(img, 3, 3, 1, 1), 0x07);
  /* the values of a real pattern: 0b10110010 */
  const uint8_t mixed[8] = {3, 70, 1, 2, 60, 80, 4, 90};
  patch(img, 50, mixed);
  assert_int_equal(face_lbp_code(img, 3, 3, 1, 1), 0xb2);
  /* corners clamp to the edge: pixel (0,0) of a ramp */
  const uint8_t ramp[9] = {10, 20, 30, 20, 30, 40, 30, 40, 50};
  /* neighbours of (0,0) clamped: p0,p1,p6,p7 are (0,0) itself (>=), p2 (1,0)
   * 20, p3 (1,0) 20, p4 (1,1) 30, p5 (0,1) 20 -> all >= 10 */
  assert_int_equal(face_lbp_code(ramp, 3, 3, 0, 0), 0xff);
  /* pixel (2,2) = 50 is the maximum: only the neighbours clamped onto
   * itself, p3, p4 and p5, equal it */
  assert_int_equal(face_lbp_code(ramp, 3, 3, 2, 2), 0x38);
}

static void test_lbp_bins(void **state) {
  (void)state;
  int seen[FACE_LBP_BINS] = {0};
  int uniform = 0;
  for (int c = 0; c < 256; c++) {
    int b = face_lbp_bin((uint8_t)c);
    assert_in_range(b, 0, FACE_LBP_BINS - 1);
    seen[b]++;
    if (b != 58)
      uniform++;
  }
  assert_int_equal(uniform, 58);
  for (int b = 0; b < 58; b++)
    assert_int_equal(seen[b], 1); /* uniform patterns get a bin each */
  assert_int_equal(seen[58], 256 - 58);
  assert_int_equal(face_lbp_bin(0x00), 0);
  assert_int_equal(face_lbp_bin(0xff), 57);
  assert_int_equal(face_lbp_bin(0x01), 1);             /* 1 one at 0 */
  assert_int_equal(face_lbp_bin(0x80), 1 + 7);         /* 1 one at 7 */
  assert_int_equal(face_lbp_bin(0x07), 1 + 2 * 8 + 0); /* 3 ones at 0 */
  assert_int_equal(face_lbp_bin(0x81), 1 + 1 * 8 + 7); /* wraps: run at 7 */
  assert_int_equal(face_lbp_bin(0x7f), 1 + 6 * 8 + 0); /* 7 ones */
  assert_int_equal(face_lbp_bin(0x05), 58);            /* 4 transitions */
  assert_int_equal(face_lbp_bin(0xb2), 58);
}

static void test_histogram(void **state) {
  (void)state;
  uint8_t img[FACE_PIXELS];
  uint16_t h[FACE_HIST_BINS];
  face_image(SEED, 7, img);
  face_histogram(img, h);
  for (int c = 0; c < FACE_CELLS; c++) {
    int sum = 0;
    for (int b = 0; b < FACE_LBP_BINS; b++)
      sum += h[c * FACE_LBP_BINS + b];
    assert_int_equal(sum, FACE_CELL * FACE_CELL);
  }
  /* a flat image: every pixel is 0xff -> bin 57 everywhere */
  memset(img, 77, sizeof(img));
  face_histogram(img, h);
  for (int c = 0; c < FACE_CELLS; c++)
    assert_int_equal(h[c * FACE_LBP_BINS + 57], 64);
}

/* ---- distance ---- */

static void test_distance_basic(void **state) {
  (void)state;
  uint8_t a[FACE_PIXELS], b[FACE_PIXELS];
  float d1, d2;
  face_image(SEED, 1, a);
  assert_int_equal(face_verify(a, a, &d1), 1);
  assert_true(d1 == 0.0f);
  face_image(SEED, 2, b);
  int m1 = face_verify(a, b, &d1), m2 = face_verify(b, a, &d2);
  assert_true(d1 == d2); /* symmetric, bit for bit */
  assert_int_equal(m1, m2);
  assert_true(d1 > 0.0f && d1 <= FACE_DIST_MAX);
  assert_int_equal(face_verify(a, b, NULL), m1);
  /* the largest distance: disjoint histograms */
  uint16_t ha[FACE_HIST_BINS] = {0}, hb[FACE_HIST_BINS] = {0};
  for (int c = 0; c < FACE_CELLS; c++) {
    ha[c * FACE_LBP_BINS] = 64;
    hb[c * FACE_LBP_BINS + 57] = 64;
  }
  assert_true(face_chi2(ha, hb) == FACE_DIST_MAX);
  /* one pixel moved from one bin to another: (1-0)^2/1 + (0-1)^2/1 */
  memcpy(hb, ha, sizeof(ha));
  hb[0] = 63;
  hb[1] = 1;
  /* bin 0: 1/127, bin 1: 1/1 */
  float d = face_chi2(ha, hb);
  assert_true(d > 1.0078f && d < 1.0080f);
  /* a gray-level gain and offset leaves LBP codes alone */
  for (int i = 0; i < FACE_PIXELS; i++)
    b[i] = (uint8_t)(a[i] / 2 + 10);
  face_verify(a, b, &d1);
  assert_true(d1 < FACE_THRESHOLD);
}

/* What a GPU block does with face_hist_index and face_chi2_term: threads
 * take pixels and bins in any order and add their parts together. The
 * descriptor and the distance must be the CPU's, bit for bit, whatever the
 * order: here pixels and bins in a shuffled order, and the terms summed in
 * per-"thread" partial sums (stride 96, 128 threads) added in reverse. */
static void test_split_any_order(void **state) {
  (void)state;
  uint8_t a[FACE_PIXELS], b[FACE_PIXELS];
  uint16_t ha[FACE_HIST_BINS], hb[FACE_HIST_BINS];
  uint32_t ga[FACE_HIST_BINS], gb[FACE_HIST_BINS];
  int order[FACE_PIXELS];
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  for (uint32_t id = 0; id < 64; id++) {
    face_probe(SEED, id, id % 3, a);
    face_image(SEED, id % 5 == 0 ? id + 1 : id, b);
    face_histogram(a, ha);
    face_histogram(b, hb);
    for (int p = 0; p < FACE_PIXELS; p++)
      order[p] = p;
    for (int p = FACE_PIXELS - 1; p > 0; p--) { /* Fisher-Yates */
      int j;
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      j = (int)((seed >> 33) % (uint64_t)(p + 1));
      int t = order[p];
      order[p] = order[j];
      order[j] = t;
    }
    memset(ga, 0, sizeof(ga));
    memset(gb, 0, sizeof(gb));
    for (int p = 0; p < FACE_PIXELS; p++) {
      ga[face_hist_index(a, order[p])]++;
      gb[face_hist_index(b, order[FACE_PIXELS - 1 - p])]++;
    }
    for (int i = 0; i < FACE_HIST_BINS; i++) {
      assert_int_equal(ga[i], ha[i]);
      assert_int_equal(gb[i], hb[i]);
    }
    for (int threads = 1; threads <= 1024; threads *= 2) {
      uint64_t part[1024] = {0}, sum = 0;
      for (int t = 0; t < threads; t++)
        for (int i = t; i < FACE_HIST_BINS; i += threads)
          part[t] += face_chi2_term(ga[i], gb[i]);
      for (int t = threads - 1; t >= 0; t--)
        sum += part[t];
      float d = face_chi2_dist(sum), want = face_chi2(ha, hb), v;
      assert_memory_equal(&d, &want, sizeof(d));
      assert_int_equal(face_is_match(d), face_verify(a, b, &v));
      assert_memory_equal(&v, &want, sizeof(v));
    }
  }
}

/* ---- wire formats ---- */

static void test_key(void **state) {
  (void)state;
  char key[FACE_KEY_MAX];
  uint8_t l[FACE_LABEL_LEN];
  memcpy(l, "abcdefghijkl", 12);
  assert_int_equal(face_key(l, key), 17);
  assert_string_equal(key, "face:abcdefghijkl");
  memcpy(l, "bob\0\0\0\0\0\0\0\0\0", 12);
  assert_int_equal(face_key(l, key), 8);
  assert_string_equal(key, "face:bob");
  memcpy(l, "bob         ", 12);
  assert_int_equal(face_key(l, key), 8);
  assert_string_equal(key, "face:bob");
  memcpy(l, "bob \0 \0\0\0\0\0\0", 12); /* mixed padding */
  assert_int_equal(face_key(l, key), 8);
  /* malformed */
  memset(l, 0, 12);
  assert_int_equal(face_key(l, key), -1);
  memset(l, ' ', 12);
  assert_int_equal(face_key(l, key), -1);
  memcpy(l, "bo b\0\0\0\0\0\0\0\0", 12); /* space inside */
  assert_int_equal(face_key(l, key), -1);
  memcpy(l, "b\0b\0\0\0\0\0\0\0\0\0", 12); /* NUL inside */
  assert_int_equal(face_key(l, key), -1);
  memcpy(l, "bob\n\0\0\0\0\0\0\0\0", 12);
  assert_int_equal(face_key(l, key), -1);
  memcpy(l, "b\xc3\xa9\0\0\0\0\0\0\0\0\0", 12);
  assert_int_equal(face_key(l, key), -1);
}

static void test_request(void **state) {
  (void)state;
  static uint8_t msg[FACE_REQ_LEN + 1];
  uint8_t label[FACE_LABEL_LEN], img[FACE_PIXELS];
  const uint8_t *pl, *pi;
  face_label(SEED, 3, label);
  face_image(SEED, 3, img);
  face_req_encode(msg, label, img);
  assert_int_equal(face_req_parse(msg, FACE_REQ_LEN, &pl, &pi), 0);
  assert_ptr_equal(pl, msg);
  assert_ptr_equal(pi, msg + FACE_LABEL_LEN);
  assert_memory_equal(pi, img, FACE_PIXELS);
  /* malformed sizes */
  const size_t bad[] = {0, 1, 11, 12, 13, 1024, 1035, 1037, 2048, 65507};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    assert_int_equal(face_req_parse(msg, bad[i], &pl, &pi), -1);
  assert_int_equal(face_req_parse(NULL, FACE_REQ_LEN, &pl, &pi), -1);
  /* malformed label */
  msg[0] = ' ';
  assert_int_equal(face_req_parse(msg, FACE_REQ_LEN, &pl, &pi), -1);
}

static void test_response(void **state) {
  (void)state;
  uint8_t r[FACE_RESP_LEN + 1];
  int match;
  float d;
  face_resp_encode(r, 1, 123.25f);
  /* 123.25f = 0x42F68000, little-endian */
  const uint8_t want[8] = {1, 0, 0, 0, 0x00, 0x80, 0xf6, 0x42};
  assert_memory_equal(r, want, 8);
  assert_int_equal(face_resp_decode(r, 8, &match, &d), 0);
  assert_int_equal(match, 1);
  assert_true(d == 123.25f);
  face_resp_encode(r, 0, 0.0f);
  assert_int_equal(face_resp_decode(r, 8, &match, &d), 0);
  assert_int_equal(match, 0);
  assert_true(d == 0.0f);
  assert_int_equal(face_resp_decode(r, 7, &match, &d), -1);
  assert_int_equal(face_resp_decode(r, 9, &match, &d), -1);
  assert_int_equal(face_resp_decode("ERROR", 5, &match, &d), -1);
  r[0] = 2;
  assert_int_equal(face_resp_decode(r, 8, &match, &d), -1);
  r[0] = 1;
  r[2] = 1;
  assert_int_equal(face_resp_decode(r, 8, &match, &d), -1);
}

/* ---- synthetic database ---- */

static void test_determinism(void **state) {
  (void)state;
  uint8_t a[FACE_PIXELS], b[FACE_PIXELS];
  uint8_t la[FACE_LABEL_LEN], lb[FACE_LABEL_LEN];
  face_image(SEED, 42, a);
  face_image(SEED, 42, b);
  assert_memory_equal(a, b, FACE_PIXELS);
  face_probe(SEED, 42, 5, a);
  face_probe(SEED, 42, 5, b);
  assert_memory_equal(a, b, FACE_PIXELS);
  face_probe(SEED, 42, 6, b); /* another capture differs */
  assert_memory_not_equal(a, b, FACE_PIXELS);
  face_image(SEED + 1, 42, b); /* another seed, another face */
  face_image(SEED, 42, a);
  assert_memory_not_equal(a, b, FACE_PIXELS);
  face_label(SEED, 42, la);
  face_label(SEED, 42, lb);
  assert_memory_equal(la, lb, FACE_LABEL_LEN);
  /* a pinned value: the generator must not change silently, or stored
   * databases and recorded results would no longer match */
  face_label(1, 0, la);
  char key[FACE_KEY_MAX];
  assert_int_equal(face_key(la, key), 17);
  face_image(1, 0, a);
  uint32_t h = 2166136261u; /* FNV-1a of the image */
  for (int i = 0; i < FACE_PIXELS; i++)
    h = (h ^ a[i]) * 16777619u;
  printf("label(1,0)=%s image(1,0) fnv1a=0x%08x\n", key, h);
  assert_string_equal(key, FACE_TEST_LABEL_1_0);
  assert_int_equal(h, FACE_TEST_FNV_1_0);
}

static int cmp_u8_12(const void *a, const void *b) {
  return memcmp(a, b, FACE_LABEL_LEN);
}

static void test_labels_distinct(void **state) {
  (void)state;
  enum { N = 20000 };
  uint8_t(*l)[FACE_LABEL_LEN] = malloc((size_t)N * FACE_LABEL_LEN);
  char key[FACE_KEY_MAX];
  assert_non_null(l);
  for (uint32_t i = 0; i < N; i++) {
    face_label(SEED, i, l[i]);
    assert_int_equal(face_key(l[i], key), 17);
  }
  qsort(l, N, FACE_LABEL_LEN, cmp_u8_12);
  for (int i = 1; i < N; i++)
    assert_true(memcmp(l[i - 1], l[i], FACE_LABEL_LEN) != 0);
  free(l);
}

static void test_impostor(void **state) {
  (void)state;
  for (uint32_t i = 0; i < 1000; i++)
    for (uint32_t v = 0; v < 4; v++) {
      uint32_t j = face_impostor(SEED, i, v, 1000);
      assert_true(j != i && j < 1000);
    }
  assert_int_equal(face_impostor(SEED, 0, 0, 2), 1);
  assert_int_equal(face_impostor(SEED, 1, 0, 2), 0);
}

/* Genuine probes all match, impostors never do, with a margin around the
 * threshold on both sides. */
static void test_separation(void **state) {
  (void)state;
  enum { N = 1000, V = 3 };
  uint8_t stored[FACE_PIXELS], probe[FACE_PIXELS];
  float gmax = 0.0f, imin = FACE_DIST_MAX, d;
  int gmiss = 0, ihit = 0;
  for (uint32_t i = 0; i < N; i++) {
    face_image(SEED, i, stored);
    for (uint32_t v = 0; v < V; v++) {
      face_probe(SEED, i, v, probe);
      if (!face_verify(probe, stored, &d))
        gmiss++;
      if (d > gmax)
        gmax = d;
      face_probe(SEED, face_impostor(SEED, i, v, N), v, probe);
      if (face_verify(probe, stored, &d))
        ihit++;
      if (d < imin)
        imin = d;
    }
  }
  printf("separation: %d genuine, %d impostor probes: genuine max %.1f, "
         "impostor min %.1f, threshold %.1f\n",
         N * V, N * V, (double)gmax, (double)imin, (double)FACE_THRESHOLD);
  assert_int_equal(gmiss, 0);
  assert_int_equal(ihit, 0);
  assert_true(gmax < 0.9f * FACE_THRESHOLD);
  assert_true(imin > 1.1f * FACE_THRESHOLD);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lbp_codes),
      cmocka_unit_test(test_lbp_bins),
      cmocka_unit_test(test_histogram),
      cmocka_unit_test(test_distance_basic),
      cmocka_unit_test(test_split_any_order),
      cmocka_unit_test(test_key),
      cmocka_unit_test(test_request),
      cmocka_unit_test(test_response),
      cmocka_unit_test(test_determinism),
      cmocka_unit_test(test_labels_distinct),
      cmocka_unit_test(test_impostor),
      cmocka_unit_test(test_separation),
  };
  return LYNX_UT_MAIN(argc, argv, "tests", tests, NULL, NULL);
}
