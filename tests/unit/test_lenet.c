/*
 * test_lenet.c - unit tests of LeNet-5 inference (accel/lenet.h, lenet.c;
 * docs/lenet.md): each layer against a plain loop written another way, the
 * canonical summation order and the absence of fused multiply-adds, the
 * wire formats, the weights file's refusals, and the whole network against
 * the training script's reference: the logits of the reference images bit
 * for bit, the class of every test image.
 *
 * Built with -ffp-contract=off like accel/lenet.c (tests/CMakeLists.txt).
 * The cases that need the Fashion-MNIST test set skip (77) without the
 * Debian package dataset-fashion-mnist.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "lenet_data.h"
#include "lenet_model.h"
#include "ut_main.h"

/* LENET_TEST_MODEL, LENET_TEST_REF: the committed files (CMake) */

static uint64_t rng = 0x1e4e7;
static float frand(void) { /* uniform in [-1, 1) */
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (float)(int32_t)(rng >> 32) / 2147483648.0f;
}

static uint8_t *read_all(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  uint8_t *buf;
  long n;
  assert_non_null(f);
  assert_int_equal(fseek(f, 0, SEEK_END), 0);
  n = ftell(f);
  assert_true(n > 0);
  rewind(f);
  buf = malloc((size_t)n);
  assert_non_null(buf);
  assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  *len = (size_t)n;
  return buf;
}

/* ---- layers ---- */

/* conv1's and conv2's shapes with random weights and inputs, against a
 * loop over an explicitly zero-padded copy of the input (no bounds tests):
 * the same terms in the same order, so bit-equal. */
static void check_conv(int in_c, int side, int pad, int out_c) {
  int ps = side + 2 * pad, os = ps - LENET_K + 1;
  float *w = malloc(sizeof(float) * (size_t)(out_c * in_c * 25));
  float *b = malloc(sizeof(float) * (size_t)out_c);
  float *in = malloc(sizeof(float) * (size_t)(in_c * side * side));
  float *padded = calloc((size_t)(in_c * ps * ps), sizeof(float));
  float *out = malloc(sizeof(float) * (size_t)(out_c * os * os));
  assert_true(w && b && in && padded && out);
  for (int i = 0; i < out_c * in_c * 25; i++)
    w[i] = frand();
  for (int i = 0; i < out_c; i++)
    b[i] = frand();
  for (int i = 0; i < in_c * side * side; i++)
    in[i] = frand();
  for (int c = 0; c < in_c; c++)
    for (int y = 0; y < side; y++)
      for (int x = 0; x < side; x++)
        padded[(c * ps + y + pad) * ps + x + pad] =
            in[(c * side + y) * side + x];
  lenet_conv_layer(w, b, in, in_c, side, pad, out_c, os, 0, out);
  for (int o = 0; o < out_c; o++)
    for (int y = 0; y < os; y++)
      for (int x = 0; x < os; x++) {
        float acc = b[o];
        for (int c = 0; c < in_c; c++)
          for (int ky = 0; ky < 5; ky++)
            for (int kx = 0; kx < 5; kx++) {
              float prod = w[((o * in_c + c) * 5 + ky) * 5 + kx] *
                           padded[(c * ps + y + ky) * ps + x + kx];
              acc = acc + prod;
            }
        float got = out[(o * os + y) * os + x];
        if (memcmp(&got, &acc, 4) != 0)
          fail_msg("conv %dx%d pad %d: out (%d,%d,%d) = %a, want %a", in_c,
                   side, pad, o, y, x, (double)got, (double)acc);
      }
  /* with ReLU: the same, negatives (and -0) become +0 */
  float *r = malloc(sizeof(float) * (size_t)(out_c * os * os));
  assert_non_null(r);
  lenet_conv_layer(w, b, in, in_c, side, pad, out_c, os, 1, r);
  for (int i = 0; i < out_c * os * os; i++) {
    float want = out[i] > 0.0f ? out[i] : 0.0f;
    assert_memory_equal(&r[i], &want, 4);
  }
  free(r);
  free(w);
  free(b);
  free(in);
  free(padded);
  free(out);
}

static void test_conv_layers(void **state) {
  (void)state;
  check_conv(1, LENET_SIDE, LENET_C1_PAD, LENET_C1_OUT);
  check_conv(LENET_C1_OUT, LENET_P1_SIDE, 0, LENET_C2_OUT);
}

/* A hand-made case: an all-ones 5x5 kernel over a 3x3 image with pad 2 sums
 * the in-image neighbourhood; corners see 4 pixels, the centre all 9. */
static void test_conv_padding(void **state) {
  float w[25], b[1] = {0.5f};
  float in[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, out[9];
  (void)state;
  for (int i = 0; i < 25; i++)
    w[i] = 1.0f;
  lenet_conv_layer(w, b, in, 1, 3, 2, 1, 3, 0, out);
  /* with pad 2 every output of a 3x3 image covers the whole image */
  for (int i = 0; i < 9; i++)
    assert_true(out[i] == 45.5f);
  /* a 1x1 image with pad 2: one output, the pixel times the kernel's
   * centre */
  w[12] = 3.0f;
  float one[1] = {2.0f}, o1[1];
  lenet_conv_layer(w, b, one, 1, 1, 2, 1, 1, 0, o1);
  assert_true(o1[0] == 6.5f);
}

static void test_pool(void **state) {
  /* 1 channel 4x4: windows' maxima at each corner of its window */
  float in[16] = {1, 2,  5, 3, /* */
                  4, 3,  9, 7, /* */
                  8, -1, 0, 0, /* */
                  2, 2,  0, -0.0f};
  float out[4];
  (void)state;
  lenet_pool_layer(in, 1, 4, out);
  assert_true(out[0] == 4.0f && out[1] == 9.0f && out[2] == 8.0f);
  /* a tie of +0 and -0: the first one stays (strictly greater only) */
  assert_true(out[3] == 0.0f && !signbit(out[3]));
  float neg[4] = {-0.0f, 0.0f, 0.0f, 0.0f}, o;
  lenet_pool_layer(neg, 1, 2, &o);
  assert_true(signbit(o)); /* -0 first, +0 is not greater */
  /* two channels, the layer walks channel-major */
  float two[8] = {1, 2, 3, 4, 8, 7, 6, 5}, o2[2];
  lenet_pool_layer(two, 2, 2, o2);
  assert_true(o2[0] == 4.0f && o2[1] == 8.0f);
  assert_true(lenet_relu(-0.0f) == 0.0f && !signbit(lenet_relu(-0.0f)));
  assert_true(lenet_relu(-1e-30f) == 0.0f && lenet_relu(2.5f) == 2.5f);
}

static void test_fc_layer(void **state) {
  enum { I = 400, O = 120 };
  static float w[O * I], b[O], in[I], out[O];
  (void)state;
  for (int i = 0; i < O * I; i++)
    w[i] = frand();
  for (int i = 0; i < O; i++)
    b[i] = frand();
  for (int i = 0; i < I; i++)
    in[i] = frand();
  lenet_fc_layer(w, b, in, I, O, 0, out);
  for (int o = 0; o < O; o++) {
    float acc = b[o];
    for (int i = 0; i < I; i++) {
      float prod = w[o * I + i] * in[i];
      acc = acc + prod;
    }
    assert_memory_equal(&out[o], &acc, 4);
  }
}

/* The canonical order: bias first, then inputs ascending; another order
 * gives another float here, so a reordering fails this test. */
static void test_fc_order(void **state) {
  float w[3] = {1.0f, 1.0f, 1.0f}, in[3] = {1.0f, 1e8f, -1e8f}, b0[1] = {0};
  float b1[1] = {1.0f}, w2[2] = {1.0f, 1.0f}, in2[2] = {1e8f, -1e8f}, out;
  (void)state;
  /* ascending: (0 + 1) + 1e8 rounds to 1e8 (spacing 8), then 0;
   * descending would be (-1e8 + 1e8) + 1 = 1 */
  lenet_fc_layer(w, b0, in, 3, 1, 0, &out);
  assert_true(out == 0.0f);
  /* bias first: (1 + 1e8) rounds to 1e8, then 0; bias last would be 1 */
  lenet_fc_layer(w2, b1, in2, 2, 1, 0, &out);
  assert_true(out == 0.0f);
}

/* Products are rounded before they are added: with x = 1 + 2^-12,
 * x * x = 1 + 2^-11 + 2^-24 rounds to 1 + 2^-11 (a tie, to even), so
 * -1 + x*x is 2^-11; a fused multiply-add keeps 2^-24 more. Fails when
 * lenet.c is compiled with contraction on a machine with FMA (aarch64,
 * x86-64-v3). */
static void test_no_fma(void **state) {
  volatile float xv = 1.0f + 0x1p-12f;
  float x = xv, w[1] = {x}, in[1] = {x}, b[1] = {-1.0f}, out;
  (void)state;
  lenet_fc_layer(w, b, in, 1, 1, 0, &out);
  assert_true(out == 0x1p-11f);
  assert_true(fmaf(x, x, -1.0f) != 0x1p-11f); /* the test can tell */
  float cw[25] = {0}, cin[1] = {x}, cb[1] = {-1.0f};
  cw[12] = x;
  lenet_conv_layer(cw, cb, cin, 1, 1, 2, 1, 1, 0, &out);
  assert_true(out == 0x1p-11f);
}

static void test_scale(void **state) {
  (void)state;
  assert_true(lenet_scale(0) == 0.0f);
  assert_true(lenet_scale(255) == 1.0f);
  for (int p = 1; p < 256; p++) {
    float s = lenet_scale((uint8_t)p);
    /* correctly rounded: within half an ulp of p/255 */
    double err = fabs((double)s - p / 255.0);
    assert_true(err <= 0.5 * (nextafterf(s, 2.0f) - s));
    assert_true(s > lenet_scale((uint8_t)(p - 1)));
  }
}

/* ---- wire formats ---- */

static void test_wire(void **state) {
  uint8_t buf[LENET_RESP_MAX + 4];
  float logits[LENET_CLASSES], back[LENET_CLASSES];
  const uint8_t *ck;
  uint32_t cklen;
  int cls;
  (void)state;
  assert_int_equal(lenet_req_cookie_len(784), 0);
  assert_int_equal(lenet_req_cookie_len(800), 16);
  assert_int_equal(lenet_req_cookie_len(783), -1);
  assert_int_equal(lenet_req_cookie_len(801), -1);
  assert_int_equal(lenet_req_cookie_len(0), -1);
  for (int i = 0; i < LENET_CLASSES; i++)
    logits[i] = frand() * 100.0f;
  logits[3] = -0.0f;
  assert_int_equal(
      lenet_resp_encode(buf, 7, logits, (const uint8_t *)"cookie!", 7), 51);
  assert_int_equal(buf[0], 7);
  assert_int_equal(buf[1] | buf[2] | buf[3], 0);
  { /* little-endian binary32 */
    uint32_t bits;
    memcpy(&bits, &logits[1], 4);
    assert_int_equal(buf[8], bits & 0xff);
    assert_int_equal(buf[11], bits >> 24);
  }
  assert_int_equal(lenet_resp_decode(buf, 51, &cls, back, &ck, &cklen), 0);
  assert_int_equal(cls, 7);
  assert_memory_equal(back, logits, sizeof(logits));
  assert_int_equal(cklen, 7);
  assert_memory_equal(ck, "cookie!", 7);
  assert_int_equal(lenet_resp_decode(buf, 43, &cls, NULL, &ck, &cklen), -1);
  assert_int_equal(lenet_resp_decode(buf, 61, &cls, NULL, &ck, &cklen), -1);
  buf[2] = 1;
  assert_int_equal(lenet_resp_decode(buf, 51, &cls, NULL, &ck, &cklen), -1);
  buf[2] = 0;
  buf[0] = 10;
  assert_int_equal(lenet_resp_decode(buf, 51, &cls, NULL, &ck, &cklen), -1);
  /* argmax: the first of equal maxima */
  float l[LENET_CLASSES] = {0, 5, 1, 5, 0, 0, 0, 0, 0, -1};
  assert_int_equal(lenet_argmax(l), 1);
}

/* ---- the weights file ---- */

static void wr32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

/* parse must refuse buf with a reason containing want */
static void refuse(const uint8_t *buf, size_t len, const char *want) {
  static struct lenet_model m;
  char why[320] = "";
  int rc = lenet_model_parse(buf, len, &m, why, sizeof(why));
  if (rc != -EINVAL || !strstr(why, want))
    fail_msg("rc %d, reason '%s': want -EINVAL and '%s'", rc, why, want);
  printf("refused: %s\n", why);
}

static void test_model_file(void **state) {
  static struct lenet_model m;
  size_t len;
  uint8_t *good = read_all(LENET_TEST_MODEL, &len), *b;
  char why[320];
  (void)state;
  assert_int_equal(len, LENET_FILE_SIZE);
  assert_int_equal(lenet_model_parse(good, len, &m, why, sizeof(why)), 0);
  assert_true(m.test_total == 10000 && m.test_correct >= 8800);
  assert_int_equal(m.crc,
                   lenet_crc32(good + LENET_FILE_HDR, len - LENET_FILE_HDR));
  assert_int_equal(lenet_crc32((const uint8_t *)"123456789", 9), 0xcbf43926);
  b = malloc(len + 8);
  assert_non_null(b);

  refuse(good, 0, "shorter than");
  refuse(good, LENET_FILE_HDR - 1, "shorter than");
  refuse(good, len - 1, "truncated");
  refuse(good, LENET_FILE_HDR + 400, "truncated");
  memcpy(b, good, len);
  memset(b + len, 0, 8);
  refuse(b, len + 4, "trailing bytes");
  memcpy(b, good, len);
  b[0] = 'X';
  refuse(b, len, "magic");
  memcpy(b, good, len);
  wr32(b + 8, 2);
  refuse(b, len, "version 2");
  memcpy(b, good, len);
  wr32(b + 20, LENET_PARAMS - 1);
  refuse(b, len, "parameters");
  memcpy(b, good, len);
  wr32(b + 40 + 16 * 2, 100); /* fc1 with 100 outputs */
  refuse(b, len, "layer fc1 is 100x400");
  memcpy(b, good, len);
  wr32(b + 36, 256);
  refuse(b, len, "input scale 256");
  memcpy(b, good, len);
  b[LENET_FILE_HDR + 1000] ^= 0x10; /* one bit of conv2 */
  refuse(b, len, "CRC-32");
  /* NaN and infinity, with the checksum made right so that the value check
   * is what refuses them */
  const struct {
    uint32_t index, bits;
    const char *want;
  } bad[] = {{LENET_F1_W + 7, 0x7fc00000u, "(layer fc1) is NaN"},
             {LENET_C1_B, 0xff800000u, "(layer conv1) is infinite"},
             {LENET_PARAMS - 1, 0x7f800001u, "(layer fc3) is NaN"}};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    memcpy(b, good, len);
    wr32(b + LENET_FILE_HDR + 4 * bad[i].index, bad[i].bits);
    wr32(b + 24, lenet_crc32(b + LENET_FILE_HDR, len - LENET_FILE_HDR));
    refuse(b, len, bad[i].want);
  }

  /* through the file system */
  struct lenet_model *lm;
  char path[] = "/tmp/lenet-test-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, good, len / 2), (ssize_t)(len / 2));
  close(fd);
  assert_int_equal(lenet_model_load(path, &lm, why, sizeof(why)), -EINVAL);
  assert_non_null(strstr(why, path));
  assert_non_null(strstr(why, "truncated"));
  assert_null(lm);
  unlink(path);
  assert_int_equal(lenet_model_load(path, &lm, why, sizeof(why)), -ENOENT);
  assert_non_null(strstr(why, "cannot open"));
  assert_int_equal(lenet_model_load("/tmp", &lm, why, sizeof(why)), -EISDIR);
  assert_int_equal(lenet_model_load(LENET_TEST_MODEL, &lm, why, sizeof(why)),
                   0);
  assert_memory_equal(lm->params, m.params, sizeof(m.params));
  lenet_model_free(lm);
  free(b);
  free(good);
}

/* ---- against the reference ---- */

struct ctx {
  struct lenet_model *m;
  struct lenet_ref ref;
  struct lenet_testset ts;
};

static int load_ctx(struct ctx *c) {
  char why[320];
  memset(c, 0, sizeof(*c));
  int rc = lenet_testset_load(LENET_DATA_DIR, &c->ts, why, sizeof(why));
  /* absent: a skip; there but unreadable or malformed: a failure */
  if (rc == -ENOENT) {
    printf("SKIP: %s (install dataset-fashion-mnist: deploy/install-deps.sh "
           "test)\n",
           why);
    return 0;
  }
  if (rc)
    fail_msg("the Fashion-MNIST test set is there but does not load: %s", why);
  if (lenet_model_load(LENET_TEST_MODEL, &c->m, why, sizeof(why)) ||
      lenet_ref_load(LENET_TEST_REF, &c->ref, why, sizeof(why)))
    fail_msg("%s", why);
  assert_int_equal(c->ref.crc, c->m->crc); /* the same weights */
  assert_int_equal(c->ref.images, c->ts.count);
  return 1;
}

static void free_ctx(struct ctx *c) {
  lenet_model_free(c->m);
  lenet_ref_free(&c->ref);
  lenet_testset_free(&c->ts);
}

static void test_reference_logits(void **state) {
  struct ctx c;
  static struct lenet_acts a;
  (void)state;
  if (!load_ctx(&c))
    skip();
  assert_true(c.ref.logit_images >= 100);
  for (uint32_t i = 0; i < c.ref.logit_images; i++) {
    float want[LENET_CLASSES], got[LENET_CLASSES];
    int cls = lenet_forward(c.m->params, c.ts.images + (size_t)i * 784, &a);
    lenet_ref_logits(&c.ref, i, want);
    if (memcmp(a.logits, want, sizeof(want)) != 0) {
      for (int k = 0; k < LENET_CLASSES; k++)
        printf("image %u logit %d: %a want %a\n", i, k, (double)a.logits[k],
               (double)want[k]);
      fail_msg("image %u: logits differ from the reference", i);
    }
    assert_int_equal(cls, c.ref.classes[i]);
    assert_int_equal(lenet_infer(c.m, c.ts.images + (size_t)i * 784, got), cls);
    assert_memory_equal(got, want, sizeof(want));
  }
  printf("%u images: logits bit-equal to the reference\n", c.ref.logit_images);
  free_ctx(&c);
}

static void test_reference_classes(void **state) {
  struct ctx c;
  uint32_t correct = 0, differ = 0;
  struct timespec t0, t1;
  (void)state;
  if (!load_ctx(&c))
    skip();
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (uint32_t i = 0; i < c.ts.count; i++) {
    float l[LENET_CLASSES];
    int cls = lenet_infer(c.m, c.ts.images + (size_t)i * 784, l);
    if (cls != c.ref.classes[i] && differ++ < 10)
      printf("image %u: class %d, the reference says %u\n", i, cls,
             c.ref.classes[i]);
    correct += cls == c.ts.labels[i];
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  printf("%u images in %.2f s: %u differ from the reference; accuracy "
         "%u/%u = %.2f%%\n",
         c.ts.count,
         (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9,
         differ, correct, c.ts.count, 100.0 * correct / c.ts.count);
  assert_int_equal(differ, 0);
  assert_int_equal(correct, c.ref.correct);
  assert_int_equal(correct, c.m->test_correct);
  assert_true(correct >= 8800);
  free_ctx(&c);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_conv_layers),
      cmocka_unit_test(test_conv_padding),
      cmocka_unit_test(test_pool),
      cmocka_unit_test(test_fc_layer),
      cmocka_unit_test(test_fc_order),
      cmocka_unit_test(test_no_fma),
      cmocka_unit_test(test_scale),
      cmocka_unit_test(test_wire),
      cmocka_unit_test(test_model_file),
      cmocka_unit_test(test_reference_logits),
      cmocka_unit_test(test_reference_classes),
  };
  return LYNX_UT_MAIN(argc, argv, "tests", tests, NULL, NULL);
}
