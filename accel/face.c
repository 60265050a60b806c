/* face.c - see face.h. */
#include "face.h"

/* The generator's float arithmetic must give the same bytes on every host
 * (x86-64 with or without FMA, the BlueField's aarch64), since the load
 * tool regenerates what the fill tool stored: no multiply-add contraction.
 * (The LBP and the distance, in face.h, use integers only.) */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__) && !defined(__CUDACC__)
#pragma GCC optimize("fp-contract=off")
#endif

/* The LBP, the distance and the wire formats are in face.h (host+device,
 * static inline). */

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
