/*
 * face.h - face verification (paper §6.4): wire formats, a deterministic
 * synthetic face generator, local binary pattern (LBP) histograms and their
 * chi-square distance.
 *
 * Shared by the accelerator-side application, the host-centric baseline
 * server (bench/face_baseline.c) and the load tool (bench/face_load.c), so
 * the three compute the very same answer, and by the GPU's face-verify
 * kernel (accel/cuda/apps.cu). Plain C11: no allocation, no libc beyond
 * memcpy, no libm. The LBP, the distance and the wire formats are defined
 * here, static inline and __host__ __device__ under nvcc (FACE_HDI), so the
 * kernel compiles the very code the CPU runs; the synthetic generator is
 * in face.c (FACE_HD), which the kernel does not need.
 *
 * Wire formats (docs/face-verify.md):
 *
 *   request  (FACE_REQ_LEN = 1036 bytes)
 *     0   12    label: ASCII, padded at the end with NUL or space bytes;
 *               after trimming the padding, 1..12 bytes of 0x21..0x7e
 *     12  1024  image: 32x32 grayscale, row-major, one u8 per pixel
 *
 *   response (FACE_RESP_LEN = 8 bytes)
 *     0   1     match: 1 when distance < FACE_THRESHOLD, else 0
 *     1   3     zero
 *     4   4     chi-square distance, IEEE-754 binary32, little-endian
 *
 *   error response: the 5 bytes "ERROR" (malformed request, unknown label,
 *   back-end failure)
 *
 *   database: memcached key "face:" + trimmed label, value = the 1024-byte
 *   stored image.
 *
 * Method: every pixel gets an 8-neighbour LBP code (borders replicate the
 * edge pixels), mapped to one of 59 uniform-pattern bins; the image is a 4x4
 * grid of 8x8 cells and the descriptor is the 16 cell histograms
 * concatenated (944 bins). Two images are compared by the chi-square
 * distance of their descriptors, sum (a-b)^2/(a+b), computed in 16.16 fixed
 * point with integer sums, so it is bit-identical whatever the summation
 * order (a GPU reduction gives the CPU's result).
 */
#ifndef LYNX_FACE_H
#define LYNX_FACE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define FACE_HD __host__ __device__
#else
#define FACE_HD
#endif

#define FACE_W 32
#define FACE_H 32
#define FACE_PIXELS (FACE_W * FACE_H) /* 1024 */
#define FACE_LABEL_LEN 12
#define FACE_REQ_LEN (FACE_LABEL_LEN + FACE_PIXELS) /* 1036 */
#define FACE_RESP_LEN 8
#define FACE_ERROR "ERROR"
#define FACE_ERROR_LEN 5
#define FACE_KEY_PREFIX "face:"
#define FACE_KEY_PREFIX_LEN 5
#define FACE_KEY_MAX (FACE_KEY_PREFIX_LEN + FACE_LABEL_LEN + 1) /* with NUL */

#define FACE_CELL 8                        /* cell side, pixels */
#define FACE_GRID (FACE_W / FACE_CELL)     /* 4 cells per side */
#define FACE_CELLS (FACE_GRID * FACE_GRID) /* 16 */
#define FACE_LBP_BINS 59                   /* 58 uniform patterns + 1 */
#define FACE_HIST_BINS (FACE_CELLS * FACE_LBP_BINS) /* 944 */
#define FACE_DIST_MAX (2.0f * FACE_PIXELS)          /* chi-square upper bound */

/* Distances below it are a match. Chosen between the genuine and impostor
 * distributions of the synthetic generator (docs/face-verify.md). */
#define FACE_THRESHOLD 540.0f

/* ---- LBP and distance ---- */

/*
 * Defined here, static inline and host+device (FACE_HDI), not in face.c:
 * the CUDA kernel (accel/cuda/apps.cu) is compiled on its own, without a
 * device link step, so it can only run what a header gives it, and it must
 * run this very code for its answers to be the CPU's. The pieces a
 * threadblock shares out (face_hist_index per pixel, face_chi2_term per
 * bin) are what the one-call face_histogram, face_chi2 and face_verify are
 * made of; everything is integer arithmetic up to the one conversion in
 * face_chi2_dist, so the order in which threads add their parts changes
 * nothing.
 */
#if defined(__CUDACC__)
#define FACE_HDI __host__ __device__ static inline
#else
#define FACE_HDI static inline
#endif

FACE_HDI int face_clampi(int v, int lo, int hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

/* The 8-neighbour LBP code of pixel (x, y) of a w x h image: bit p is set
 * when neighbour p >= the centre, neighbours in clockwise order starting at
 * the top-left one: p0 (x-1,y-1), p1 (x,y-1), p2 (x+1,y-1), p3 (x+1,y),
 * p4 (x+1,y+1), p5 (x,y+1), p6 (x-1,y+1), p7 (x-1,y). Coordinates outside
 * the image are clamped to the edge. */
FACE_HDI uint8_t face_lbp_code(const uint8_t *img, int w, int h, int x, int y) {
  /* clamped neighbour coordinates; no tables, so no static data on the
   * device */
  int xl = face_clampi(x - 1, 0, w - 1), xr = face_clampi(x + 1, 0, w - 1);
  const uint8_t *up = img + face_clampi(y - 1, 0, h - 1) * w;
  const uint8_t *mid = img + y * w;
  const uint8_t *dn = img + face_clampi(y + 1, 0, h - 1) * w;
  uint8_t c = mid[x];
  unsigned code = 0;
  code |= (unsigned)(up[xl] >= c) << 0;
  code |= (unsigned)(up[x] >= c) << 1;
  code |= (unsigned)(up[xr] >= c) << 2;
  code |= (unsigned)(mid[xr] >= c) << 3;
  code |= (unsigned)(dn[xr] >= c) << 4;
  code |= (unsigned)(dn[x] >= c) << 5;
  code |= (unsigned)(dn[xl] >= c) << 6;
  code |= (unsigned)(mid[xl] >= c) << 7;
  return (uint8_t)code;
}

FACE_HDI int face_popcount8(unsigned v) {
  v = v - ((v >> 1) & 0x55u);
  v = (v & 0x33u) + ((v >> 2) & 0x33u);
  return (int)((v + (v >> 4)) & 0x0fu);
}

/* The histogram bin of an LBP code: 0 for 0x00, 1..56 for the patterns
 * with one circular run of 1..7 ones (1 + (ones-1)*8 + position of the
 * run's first bit), 57 for 0xff, 58 for every non-uniform pattern. */
FACE_HDI int face_lbp_bin(uint8_t code) {
  unsigned c = code;
  unsigned rot = ((c << 1) | (c >> 7)) & 0xffu; /* bit p = bit p-1 of c */
  int trans = face_popcount8(c ^ rot);
  if (trans == 0)
    return c == 0 ? 0 : 57;
  if (trans != 2)
    return 58;
  /* one run of ones: it starts at the only set bit whose predecessor is
   * clear; its position is the number of bits below it */
  unsigned first = c & ~rot;
  return 1 + (face_popcount8(c) - 1) * 8 + face_popcount8(first - 1);
}

/* Where pixel p (row-major, 0..1023) of a 32x32 image counts in its
 * descriptor: its cell's histogram, its LBP code's bin. */
FACE_HDI int face_hist_index(const uint8_t *img, int p) {
  int x = p % FACE_W, y = p / FACE_W;
  int cell = (y / FACE_CELL) * FACE_GRID + x / FACE_CELL;
  return cell * FACE_LBP_BINS +
         face_lbp_bin(face_lbp_code(img, FACE_W, FACE_H, x, y));
}

/* The 944-bin descriptor of a 32x32 image: hist[cell*59 + bin], cells in
 * row-major order, each summing to 64. */
FACE_HDI void face_histogram(const uint8_t *img, uint16_t *hist) {
  for (int i = 0; i < FACE_HIST_BINS; i++)
    hist[i] = 0;
  for (int p = 0; p < FACE_PIXELS; p++)
    hist[face_hist_index(img, p)]++;
}

/* One bin's chi-square term (a-b)^2/(a+b) in 16.16 fixed point, rounded;
 * 0 where a + b == 0. Counts are at most 64 per bin. */
FACE_HDI uint64_t face_chi2_term(uint32_t a, uint32_t b) {
  uint32_t s = a + b;
  int32_t d = (int32_t)a - (int32_t)b;
  if (s == 0)
    return 0;
  return (((uint64_t)(uint32_t)(d * d) << 16) + s / 2) / s;
}

/* The distance from the sum of every bin's term: each term is an integer,
 * so the sum is exact and independent of the order it was added in; it is
 * at most 2 * FACE_PIXELS << 16 = 2^27 and converts exactly. */
FACE_HDI float face_chi2_dist(uint64_t sum) {
  return (float)sum * (1.0f / 65536.0f);
}

/* Chi-square distance of two descriptors, 0..FACE_DIST_MAX; symmetric. */
FACE_HDI float face_chi2(const uint16_t *a, const uint16_t *b) {
  uint64_t sum = 0;
  for (int i = 0; i < FACE_HIST_BINS; i++)
    sum += face_chi2_term(a[i], b[i]);
  return face_chi2_dist(sum);
}

/* 1 when a distance means the same face. */
FACE_HDI int face_is_match(float dist) { return dist < FACE_THRESHOLD; }

/* Compares two 32x32 images: 1 when they show the same face (distance <
 * FACE_THRESHOLD), else 0; *dist gets the distance when dist != NULL. */
FACE_HDI int face_verify(const uint8_t *probe, const uint8_t *stored,
                         float *dist) {
  uint16_t ha[FACE_HIST_BINS], hb[FACE_HIST_BINS];
  float d;
  face_histogram(probe, ha);
  face_histogram(stored, hb);
  d = face_chi2(ha, hb);
  if (dist)
    *dist = d;
  return face_is_match(d);
}

/* ---- wire formats ---- */

/* The memcached key of a label, NUL-terminated, into key (FACE_KEY_MAX
 * bytes): its length (6..17), or -1 when the label is malformed (empty,
 * a byte outside 0x21..0x7e before the padding, or non-padding after it). */
FACE_HDI int face_key(const uint8_t *label, char *key) {
  const char *prefix = FACE_KEY_PREFIX;
  int n = FACE_LABEL_LEN;
  while (n > 0 && (label[n - 1] == 0 || label[n - 1] == ' '))
    n--;
  if (n == 0)
    return -1;
  for (int i = 0; i < n; i++)
    if (label[i] < 0x21 || label[i] > 0x7e)
      return -1;
  for (int i = 0; i < FACE_KEY_PREFIX_LEN; i++)
    key[i] = prefix[i];
  for (int i = 0; i < n; i++)
    key[FACE_KEY_PREFIX_LEN + i] = (char)label[i];
  key[FACE_KEY_PREFIX_LEN + n] = 0;
  return FACE_KEY_PREFIX_LEN + n;
}

/* Splits a request: 0 and *label, *img pointing into msg, or -1 when len
 * is not FACE_REQ_LEN or the label is malformed. */
FACE_HDI int face_req_parse(const void *msg, size_t len, const uint8_t **label,
                            const uint8_t **img) {
  char key[FACE_KEY_MAX];
  if (!msg || len != FACE_REQ_LEN)
    return -1;
  if (face_key((const uint8_t *)msg, key) < 0)
    return -1;
  *label = (const uint8_t *)msg;
  *img = (const uint8_t *)msg + FACE_LABEL_LEN;
  return 0;
}

/* Builds a request into out (FACE_REQ_LEN bytes). */
FACE_HDI void face_req_encode(uint8_t *out, const uint8_t *label,
                              const uint8_t *img) {
  for (int i = 0; i < FACE_LABEL_LEN; i++)
    out[i] = label[i];
  for (int i = 0; i < FACE_PIXELS; i++)
    out[FACE_LABEL_LEN + i] = img[i];
}

/* The bits of a float (no type punning through pointers). */
FACE_HDI uint32_t face_f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t bits;
  memcpy(&bits, &f, 4);
  return bits;
#endif
}

FACE_HDI float face_f32_from_bits(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  memcpy(&f, &bits, 4);
  return f;
#endif
}

/* Writes the 8-byte response. */
FACE_HDI void face_resp_encode(uint8_t *out, int match, float dist) {
  uint32_t bits = face_f32_bits(dist);
  out[0] = match ? 1 : 0;
  out[1] = out[2] = out[3] = 0;
  for (int i = 0; i < 4; i++)
    out[4 + i] = (uint8_t)(bits >> (8 * i));
}

/* Reads a response: 0, or -1 when len != FACE_RESP_LEN, match is not 0/1
 * or the padding is not zero. */
FACE_HDI int face_resp_decode(const void *buf, size_t len, int *match,
                              float *dist) {
  const uint8_t *p = (const uint8_t *)buf;
  uint32_t bits = 0;
  if (!buf || len != FACE_RESP_LEN || p[0] > 1 || p[1] || p[2] || p[3])
    return -1;
  for (int i = 0; i < 4; i++)
    bits |= (uint32_t)p[4 + i] << (8 * i);
  *match = p[0];
  *dist = face_f32_from_bits(bits);
  return 0;
}

/* ---- deterministic synthetic database ---- */

/* The label of identity index under seed: 12 characters of [0-9a-z]
 * (Crockford base32, lower case), distinct for distinct indices below
 * 2^32 under one seed. */
FACE_HD void face_label(uint64_t seed, uint32_t index, uint8_t *label);

/* The stored (enrolment) image of an identity: a smooth synthetic face
 * whose layout, features and shading depend on (seed, index). */
FACE_HD void face_image(uint64_t seed, uint32_t index, uint8_t *img);

/* Another capture of the same identity: sub-pixel shift, gray-level gain
 * and offset, and pixel noise, all drawn from (seed, index, variant). A
 * genuine probe is face_probe(seed, i, v) sent with face_label(seed, i); an
 * impostor probe is face_probe(seed, j, v) with j != i. */
FACE_HD void face_probe(uint64_t seed, uint32_t index, uint32_t variant,
                        uint8_t *img);

/* An identity other than index among n >= 2, drawn from (seed, index,
 * variant): the impostor for that request. */
FACE_HD uint32_t face_impostor(uint64_t seed, uint32_t index, uint32_t variant,
                               uint32_t n);

#endif
