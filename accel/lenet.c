/*
 * lenet.c - see lenet_model.h. Compiled with -ffp-contract=off
 * (accel/CMakeLists.txt): the layer loops below inline lenet.h's
 * per-element sums, which must not become fused multiply-adds (lenet.h).
 */
#include "lenet_model.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* The layers' shapes as the file states them: (out, in, kh, kw). */
static const uint32_t file_shapes[LENET_FILE_LAYERS][4] = {
    {LENET_C1_OUT, 1, LENET_K, LENET_K},
    {LENET_C2_OUT, LENET_C1_OUT, LENET_K, LENET_K},
    {LENET_F1_OUT, LENET_FLAT, 1, 1},
    {LENET_F2_OUT, LENET_F1_OUT, 1, 1},
    {LENET_CLASSES, LENET_F2_OUT, 1, 1}};

/* Where each layer's weights start (its biases follow them). */
static const uint32_t layer_w[LENET_FILE_LAYERS] = {
    LENET_C1_W, LENET_C2_W, LENET_F1_W, LENET_F2_W, LENET_F3_W};
static const char *const layer_names[LENET_FILE_LAYERS] = {"conv1", "conv2",
                                                           "fc1", "fc2", "fc3"};

/* The offsets in lenet.h are the shapes laid end to end: a compile-time
 * check would need constant arrays, so the loader checks it once, and a
 * unit test too. */
static int layout_ok(void) {
  uint32_t off = 0;
  for (uint32_t i = 0; i < LENET_FILE_LAYERS; i++) {
    const uint32_t *s = file_shapes[i];
    if (off != layer_w[i])
      return 0;
    off += s[0] * s[1] * s[2] * s[3] + s[0];
  }
  return off == LENET_PARAMS;
}

static uint32_t rd32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
         (uint32_t)p[3] << 24;
}

uint32_t lenet_crc32(const uint8_t *p, size_t n) {
  /* zlib's CRC-32 (the same polynomial as Python's zlib.crc32, which the
   * training script writes): uInt at a time, since n may exceed it */
  uLong c = crc32(0L, Z_NULL, 0);
  while (n) {
    uInt k = n > UINT_MAX ? UINT_MAX : (uInt)n;
    c = crc32(c, p, k);
    p += k;
    n -= k;
  }
  return (uint32_t)c;
}

#define WHY(...) (snprintf(why, whylen, __VA_ARGS__), -EINVAL)

int lenet_model_parse(const uint8_t *buf, size_t len, struct lenet_model *m,
                      char *why, size_t whylen) {
  uint32_t crc;
  if (!layout_ok())
    return WHY("lenet.h's parameter offsets do not match the layer shapes "
               "(a build error)");
  if (len < LENET_FILE_HDR)
    return WHY("%zu bytes: shorter than the %u-byte header", len,
               LENET_FILE_HDR);
  if (memcmp(buf, LENET_FILE_MAGIC, 8) != 0)
    return WHY("not a LeNet weights file (magic is not \"%s\")",
               LENET_FILE_MAGIC);
  if (rd32(buf + 8) != LENET_FILE_VERSION)
    return WHY("format version %u (this build reads %u)", rd32(buf + 8),
               LENET_FILE_VERSION);
  if (rd32(buf + 12) != LENET_FILE_HDR || rd32(buf + 16) != LENET_FILE_LAYERS ||
      rd32(buf + 20) != LENET_PARAMS)
    return WHY("header says %u header bytes, %u layers, %u parameters; "
               "LeNet-5 has %u, %u, %u",
               rd32(buf + 12), rd32(buf + 16), rd32(buf + 20), LENET_FILE_HDR,
               LENET_FILE_LAYERS, LENET_PARAMS);
  if (rd32(buf + 36) != 255)
    return WHY("input scale %u (this build scales pixels by 1/255)",
               rd32(buf + 36));
  for (uint32_t i = 0; i < LENET_FILE_LAYERS; i++) {
    const uint8_t *s = buf + 40 + 16 * i;
    if (rd32(s) != file_shapes[i][0] || rd32(s + 4) != file_shapes[i][1] ||
        rd32(s + 8) != file_shapes[i][2] || rd32(s + 12) != file_shapes[i][3])
      return WHY("layer %s is %ux%ux%ux%u, LeNet-5's is %ux%ux%ux%u",
                 layer_names[i], rd32(s), rd32(s + 4), rd32(s + 8),
                 rd32(s + 12), file_shapes[i][0], file_shapes[i][1],
                 file_shapes[i][2], file_shapes[i][3]);
  }
  for (uint32_t i = 120; i < LENET_FILE_HDR; i++)
    if (buf[i])
      return WHY("reserved header byte %u is not zero", i);
  if (len < LENET_FILE_SIZE)
    return WHY("truncated: %zu bytes, want %u", len, LENET_FILE_SIZE);
  if (len > LENET_FILE_SIZE)
    return WHY("trailing bytes: longer than %u bytes", LENET_FILE_SIZE);
  if (rd32(buf + 32) == 0 || rd32(buf + 28) > rd32(buf + 32))
    return WHY("test accuracy %u/%u is not a fraction", rd32(buf + 28),
               rd32(buf + 32));
  crc = lenet_crc32(buf + LENET_FILE_HDR, 4u * LENET_PARAMS);
  if (crc != rd32(buf + 24))
    return WHY("parameters' CRC-32 is %08x, the header says %08x (corrupt)",
               crc, rd32(buf + 24));
  for (uint32_t i = 0; i < LENET_PARAMS; i++) {
    uint32_t bits = rd32(buf + LENET_FILE_HDR + 4 * i);
    float v;
    memcpy(&v, &bits, 4);
    if (!isfinite(v)) {
      uint32_t l = 0;
      while (l + 1 < LENET_FILE_LAYERS && i >= layer_w[l + 1])
        l++;
      return WHY("parameter %u (layer %s) is %s", i, layer_names[l],
                 isnan(v) ? "NaN" : "infinite");
    }
    m->params[i] = v;
  }
  m->crc = crc;
  m->test_correct = rd32(buf + 28);
  m->test_total = rd32(buf + 32);
  return 0;
}

int lenet_model_load(const char *path, struct lenet_model **out, char *why,
                     size_t whylen) {
  struct lenet_model *m = NULL;
  uint8_t *buf = NULL;
  struct stat st;
  size_t got = 0;
  int fd, rc;
  *out = NULL;
  fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    rc = -errno;
    snprintf(why, whylen, "cannot open %s: %s", path, strerror(errno));
    return rc;
  }
  if (fstat(fd, &st) != 0) {
    rc = -errno;
    snprintf(why, whylen, "cannot stat %s: %s", path, strerror(errno));
    goto out;
  }
  if (!S_ISREG(st.st_mode)) {
    rc = S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
    snprintf(why, whylen, "%s: not a regular file", path);
    goto out;
  }
  /* at most one byte more than a valid file: enough to say it is too long */
  if ((uint64_t)st.st_size > LENET_FILE_SIZE + 1u)
    st.st_size = LENET_FILE_SIZE + 1u;
  buf = malloc((size_t)st.st_size + 1);
  m = malloc(sizeof(*m));
  if (!buf || !m) {
    rc = -ENOMEM;
    snprintf(why, whylen, "%s: out of memory", path);
    goto out;
  }
  while (got < (size_t)st.st_size) {
    ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      rc = -errno;
      snprintf(why, whylen, "cannot read %s: %s", path, strerror(errno));
      goto out;
    }
    if (n == 0)
      break;
    got += (size_t)n;
  }
  rc = lenet_model_parse(buf, got, m, why, whylen);
  if (rc) {
    /* the path in front of the reason */
    char tmp[256];
    snprintf(tmp, sizeof(tmp), "%s", why);
    snprintf(why, whylen, "%s: %s", path, tmp);
    goto out;
  }
  *out = m;
  m = NULL;
out:
  close(fd);
  free(buf);
  free(m);
  return rc;
}

void lenet_model_free(struct lenet_model *m) { free(m); }

/* ---- the network on a CPU ---------------------------------------------- */

void lenet_conv_layer(const float *w, const float *b, const float *in, int in_c,
                      int side, int pad, int out_c, int out_side, int relu,
                      float *out) {
  for (int oc = 0; oc < out_c; oc++)
    for (int y = 0; y < out_side; y++)
      for (int x = 0; x < out_side; x++) {
        float v = lenet_conv_elem(w, b, in, in_c, side, pad, oc, y, x);
        *out++ = relu ? lenet_relu(v) : v;
      }
}

void lenet_pool_layer(const float *in, int c, int side, float *out) {
  for (int ch = 0; ch < c; ch++)
    for (int y = 0; y < side / 2; y++)
      for (int x = 0; x < side / 2; x++)
        *out++ = lenet_pool_elem(in, side, ch, y, x);
}

void lenet_fc_layer(const float *w, const float *b, const float *in, int n_in,
                    int n_out, int relu, float *out) {
  for (int o = 0; o < n_out; o++) {
    float v = lenet_fc_elem(w, b, in, n_in, o);
    out[o] = relu ? lenet_relu(v) : v;
  }
}

int lenet_forward(const float *p, const uint8_t *pixels, struct lenet_acts *a) {
  for (int i = 0; i < LENET_PIXELS; i++)
    a->in[i] = lenet_scale(pixels[i]);
  lenet_conv_layer(p + LENET_C1_W, p + LENET_C1_B, a->in, 1, LENET_SIDE,
                   LENET_C1_PAD, LENET_C1_OUT, LENET_C1_SIDE, 1, a->c1);
  lenet_pool_layer(a->c1, LENET_C1_OUT, LENET_C1_SIDE, a->p1);
  lenet_conv_layer(p + LENET_C2_W, p + LENET_C2_B, a->p1, LENET_C1_OUT,
                   LENET_P1_SIDE, 0, LENET_C2_OUT, LENET_C2_SIDE, 1, a->c2);
  lenet_pool_layer(a->c2, LENET_C2_OUT, LENET_C2_SIDE, a->p2);
  lenet_fc_layer(p + LENET_F1_W, p + LENET_F1_B, a->p2, LENET_FLAT,
                 LENET_F1_OUT, 1, a->f1);
  lenet_fc_layer(p + LENET_F2_W, p + LENET_F2_B, a->f1, LENET_F1_OUT,
                 LENET_F2_OUT, 1, a->f2);
  lenet_fc_layer(p + LENET_F3_W, p + LENET_F3_B, a->f2, LENET_F2_OUT,
                 LENET_CLASSES, 0, a->logits);
  return lenet_argmax(a->logits);
}

int lenet_infer(const struct lenet_model *m, const uint8_t *pixels,
                float logits[LENET_CLASSES]) {
  struct lenet_acts a;
  int cls = lenet_forward(m->params, pixels, &a);
  memcpy(logits, a.logits, sizeof(a.logits));
  return cls;
}
