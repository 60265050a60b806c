/* face.c - see face.h. */
#include "face.h"

#include <string.h>

/* The generator's float arithmetic must give the same bytes on every host
 * (x86-64 with or without FMA, the BlueField's aarch64), since the load
 * tool regenerates what the fill tool stored: no multiply-add contraction.
 * (The LBP and the distance use integers only.) */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__) && !defined(__CUDACC__)
#pragma GCC optimize("fp-contract=off")
#endif

/* ---- LBP and distance ---- */

static FACE_HD int clampi(int v, int lo, int hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

FACE_HD uint8_t face_lbp_code(const uint8_t *img, int w, int h, int x, int y) {
  /* clamped neighbour coordinates; no tables, so no static data on the
   * device */
  int xl = clampi(x - 1, 0, w - 1), xr = clampi(x + 1, 0, w - 1);
  const uint8_t *up = img + clampi(y - 1, 0, h - 1) * w;
  const uint8_t *mid = img + y * w;
  const uint8_t *dn = img + clampi(y + 1, 0, h - 1) * w;
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

static FACE_HD int popcount8(unsigned v) {
  v = v - ((v >> 1) & 0x55u);
  v = (v & 0x33u) + ((v >> 2) & 0x33u);
  return (int)((v + (v >> 4)) & 0x0fu);
}

FACE_HD int face_lbp_bin(uint8_t code) {
  unsigned c = code;
  unsigned rot = ((c << 1) | (c >> 7)) & 0xffu; /* bit p = bit p-1 of c */
  int trans = popcount8(c ^ rot);
  if (trans == 0)
    return c == 0 ? 0 : 57;
  if (trans != 2)
    return 58;
  /* one run of ones: it starts at the only set bit whose predecessor is
   * clear; its position is the number of bits below it */
  unsigned first = c & ~rot;
  return 1 + (popcount8(c) - 1) * 8 + popcount8(first - 1);
}

FACE_HD void face_histogram(const uint8_t *img, uint16_t *hist) {
  for (int i = 0; i < FACE_HIST_BINS; i++)
    hist[i] = 0;
  for (int y = 0; y < FACE_H; y++) {
    int row = (y / FACE_CELL) * FACE_GRID;
    for (int x = 0; x < FACE_W; x++) {
      int cell = row + x / FACE_CELL;
      int bin = face_lbp_bin(face_lbp_code(img, FACE_W, FACE_H, x, y));
      hist[cell * FACE_LBP_BINS + bin]++;
    }
  }
}

FACE_HD float face_chi2(const uint16_t *a, const uint16_t *b) {
  /* Each term in 16.16 fixed point, summed as integers: exact and
   * independent of the summation order. The sum is at most
   * 2 * FACE_PIXELS << 16 = 2^27. */
  uint64_t sum = 0;
  for (int i = 0; i < FACE_HIST_BINS; i++) {
    uint32_t s = (uint32_t)a[i] + b[i];
    if (s == 0)
      continue;
    int32_t d = (int32_t)a[i] - (int32_t)b[i];
    sum += (((uint64_t)(uint32_t)(d * d) << 16) + s / 2) / s;
  }
  return (float)sum * (1.0f / 65536.0f);
}

FACE_HD int face_verify(const uint8_t *probe, const uint8_t *stored,
                        float *dist) {
  uint16_t ha[FACE_HIST_BINS], hb[FACE_HIST_BINS];
  face_histogram(probe, ha);
  face_histogram(stored, hb);
  float d = face_chi2(ha, hb);
  if (dist)
    *dist = d;
  return d < FACE_THRESHOLD;
}

/* ---- wire formats ---- */

FACE_HD int face_key(const uint8_t *label, char *key) {
  int n = FACE_LABEL_LEN;
  while (n > 0 && (label[n - 1] == 0 || label[n - 1] == ' '))
    n--;
  if (n == 0)
    return -1;
  for (int i = 0; i < n; i++)
    if (label[i] < 0x21 || label[i] > 0x7e)
      return -1;
  memcpy(key, FACE_KEY_PREFIX, FACE_KEY_PREFIX_LEN);
  memcpy(key + FACE_KEY_PREFIX_LEN, label, (size_t)n);
  key[FACE_KEY_PREFIX_LEN + n] = 0;
  return FACE_KEY_PREFIX_LEN + n;
}

FACE_HD int face_req_parse(const void *msg, size_t len, const uint8_t **label,
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

FACE_HD void face_req_encode(uint8_t *out, const uint8_t *label,
                             const uint8_t *img) {
  memcpy(out, label, FACE_LABEL_LEN);
  memcpy(out + FACE_LABEL_LEN, img, FACE_PIXELS);
}

FACE_HD void face_resp_encode(uint8_t *out, int match, float dist) {
  uint32_t bits;
  memcpy(&bits, &dist, 4);
  out[0] = match ? 1 : 0;
  out[1] = out[2] = out[3] = 0;
  for (int i = 0; i < 4; i++)
    out[4 + i] = (uint8_t)(bits >> (8 * i));
}

FACE_HD int face_resp_decode(const void *buf, size_t len, int *match,
                             float *dist) {
  const uint8_t *p = (const uint8_t *)buf;
  uint32_t bits = 0;
  if (!buf || len != FACE_RESP_LEN || p[0] > 1 || p[1] || p[2] || p[3])
    return -1;
  for (int i = 0; i < 4; i++)
    bits |= (uint32_t)p[4 + i] << (8 * i);
  *match = p[0];
  memcpy(dist, &bits, 4);
  return 0;
}

/* ---- deterministic synthetic database ---- */

/* splitmix64's finaliser: a bijection of 64-bit words */
static FACE_HD uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* A 64-bit hash of (seed, index, stream, k). */
static FACE_HD uint64_t hash4(uint64_t seed, uint32_t index, uint32_t stream,
                              uint32_t k) {
  uint64_t z = mix64(seed + 0x9E3779B97F4A7C15ull);
  z = mix64(z ^ ((uint64_t)index << 32 | stream));
  return mix64(z + 0x9E3779B97F4A7C15ull * (k + 1));
}

/* Uniform in [lo, hi). */
static FACE_HD float urand(uint64_t h, float lo, float hi) {
  return lo + (hi - lo) * (float)(h >> 40) * (1.0f / 16777216.0f);
}

FACE_HD void face_label(uint64_t seed, uint32_t index, uint8_t *label) {
  const uint64_t m60 = (1ull << 60) - 1;
  /* an invertible map of 60-bit words (xorshift and odd multiplies modulo
   * 2^60), so distinct indices give distinct labels */
  uint64_t z = (index + (mix64(seed) & m60)) & m60;
  z ^= z >> 29;
  z = (z * 0xBF58476D1CE4E5B9ull) & m60;
  z ^= z >> 31;
  z = (z * 0x94D049BB133111EBull) & m60;
  z ^= z >> 30;
  for (int i = 0; i < FACE_LABEL_LEN; i++)
    label[i] = (uint8_t) "0123456789abcdefghjkmnpqrstvwxyz"
        [(z >> (5 * (FACE_LABEL_LEN - 1 - i))) & 31];
}

/* The parameters of one identity. */
struct face_model {
  float bg, gx, gy;             /* background level and slope */
  float cx, cy, rx, ry;         /* face ellipse */
  float skin, lx, ly;           /* face brightness and lighting direction */
  float ex, ey, er, edepth;     /* eyes: offset from centre, radius, darkness */
  float nx, ny, nr, nbright;    /* nose */
  float mx, my, mw, mh, mdepth; /* mouth */
  float tex[8][8];              /* value-noise lattice, spacing TEX_STEP */
};

#define TEX_STEP 6.0f
#define TEX_ORIGIN (-5.0f) /* lattice covers [-5, 37) */

enum { S_MODEL = 1, S_TEX = 2, S_PROBE = 3, S_NOISE = 4, S_IMPOSTOR = 5 };

static FACE_HD void model_init(struct face_model *m, uint64_t seed,
                               uint32_t index) {
  uint32_t k = 0;
#define R(lo, hi) urand(hash4(seed, index, S_MODEL, k++), (lo), (hi))
  m->bg = R(50.0f, 90.0f);
  m->gx = R(-1.2f, 1.2f);
  m->gy = R(-1.2f, 1.2f);
  m->cx = R(13.5f, 17.5f);
  m->cy = R(13.5f, 17.5f);
  m->rx = R(9.0f, 12.0f);
  m->ry = R(11.0f, 14.0f);
  m->skin = R(50.0f, 90.0f);
  m->lx = R(-0.5f, 0.5f);
  m->ly = R(-0.5f, 0.5f);
  m->ex = R(3.5f, 6.0f);
  m->ey = R(2.5f, 5.0f);
  m->er = R(1.5f, 2.8f);
  m->edepth = R(40.0f, 80.0f);
  m->nx = R(-1.0f, 1.0f);
  m->ny = R(0.0f, 3.0f);
  m->nr = R(1.5f, 2.5f);
  m->nbright = R(15.0f, 40.0f);
  m->mx = R(-1.5f, 1.5f);
  m->my = R(5.0f, 8.0f);
  m->mw = R(3.0f, 6.0f);
  m->mh = R(1.0f, 2.0f);
  m->mdepth = R(30.0f, 60.0f);
#undef R
  float amp = urand(hash4(seed, index, S_TEX, 64), 30.0f, 50.0f);
  for (int j = 0; j < 8; j++)
    for (int i = 0; i < 8; i++)
      m->tex[j][i] =
          urand(hash4(seed, index, S_TEX, (uint32_t)(j * 8 + i)), -amp, amp);
}

/* 1 / (1 + d^2/r^2)^2: a smooth bump of height 1 and radius about r */
static FACE_HD float bump(float dx, float dy, float rx, float ry) {
  float q = 1.0f + dx * dx / (rx * rx) + dy * dy / (ry * ry);
  return 1.0f / (q * q);
}

static FACE_HD float smooth(float t) { return t * t * (3.0f - 2.0f * t); }

/* Value noise at (x, y): the lattice interpolated with a smoothstep. */
static FACE_HD float texture(const struct face_model *m, float x, float y) {
  float u = (x - TEX_ORIGIN) / TEX_STEP, v = (y - TEX_ORIGIN) / TEX_STEP;
  if (u < 0.0f)
    u = 0.0f;
  if (v < 0.0f)
    v = 0.0f;
  int i = (int)u, j = (int)v;
  if (i > 6)
    i = 6;
  if (j > 6)
    j = 6;
  float fu = u - (float)i, fv = v - (float)j;
  if (fu > 1.0f)
    fu = 1.0f;
  if (fv > 1.0f)
    fv = 1.0f;
  fu = smooth(fu);
  fv = smooth(fv);
  float top = m->tex[j][i] + (m->tex[j][i + 1] - m->tex[j][i]) * fu;
  float bot = m->tex[j + 1][i] + (m->tex[j + 1][i + 1] - m->tex[j + 1][i]) * fu;
  return top + (bot - top) * fv;
}

/* The identity's intensity at (x, y), before gray-level changes. */
static FACE_HD float model_at(const struct face_model *m, float x, float y) {
  float dx = x - m->cx, dy = y - m->cy;
  float q = dx * dx / (m->rx * m->rx) + dy * dy / (m->ry * m->ry);
  float mask = 1.0f / (1.0f + q * q * q * q); /* ~1 inside, ~0 outside */
  float shade = 1.0f + m->lx * dx / m->rx + m->ly * dy / m->ry;
  float v = m->bg + m->gx * (x - 15.5f) + m->gy * (y - 15.5f);
  float face = m->skin * shade;
  face -= m->edepth * (bump(dx - m->ex, dy + m->ey, m->er, m->er) +
                       bump(dx + m->ex, dy + m->ey, m->er, m->er));
  face += m->nbright * bump(dx - m->nx, dy - m->ny, m->nr, 2.0f * m->nr);
  face -= m->mdepth * bump(dx - m->mx, dy - m->my, m->mw, m->mh);
  return v + mask * face + texture(m, x, y);
}

static FACE_HD uint8_t to_u8(float v) {
  if (v <= 0.0f)
    return 0;
  if (v >= 255.0f)
    return 255;
  return (uint8_t)(int)(v + 0.5f);
}

FACE_HD void face_image(uint64_t seed, uint32_t index, uint8_t *img) {
  struct face_model m;
  model_init(&m, seed, index);
  for (int y = 0; y < FACE_H; y++)
    for (int x = 0; x < FACE_W; x++)
      img[y * FACE_W + x] = to_u8(model_at(&m, (float)x, (float)y));
}

FACE_HD void face_probe(uint64_t seed, uint32_t index, uint32_t variant,
                        uint8_t *img) {
  struct face_model m;
  model_init(&m, seed, index);
  uint32_t k = 0;
#define R(lo, hi)                                                              \
  urand(hash4(seed, index, S_PROBE, variant * 8u + k++), (lo), (hi))
  float ox = R(-1.0f, 1.0f), oy = R(-1.0f, 1.0f);
  float gain = R(0.85f, 1.15f), off = R(-15.0f, 15.0f);
#undef R
  for (int y = 0; y < FACE_H; y++)
    for (int x = 0; x < FACE_W; x++) {
      int p = y * FACE_W + x;
      /* noise in [-1, 1], four pixels per hash */
      uint64_t h =
          hash4(seed, index, S_NOISE, variant * 256u + (uint32_t)p / 4);
      float noise = (float)((h >> (16 * (p & 3))) % 3u) - 1.0f;
      float v = model_at(&m, (float)x + ox, (float)y + oy);
      img[p] = to_u8(gain * v + off + noise);
    }
}

FACE_HD uint32_t face_impostor(uint64_t seed, uint32_t index, uint32_t variant,
                               uint32_t n) {
  if (n < 2)
    return index;
  uint64_t h = hash4(seed, index, S_IMPOSTOR, variant);
  return (uint32_t)((index % n + 1 + h % (n - 1)) % n);
}
