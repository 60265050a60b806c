/*
 * lenet_data.h - what the lenet tools and tests read (docs/lenet.md): the
 * Fashion-MNIST test set in MNIST's IDX format, gzipped as the Debian
 * package dataset-fashion-mnist installs it (or not), and the reference
 * file tools/train-lenet.py writes next to the weights.
 *
 * Reference file (little-endian):
 *   0   8   magic "LYNXLREF"
 *   8   4   version (1)
 *   12  4   images: classes that follow (the whole test set, 10000)
 *   16  4   logit images: the first that many images' logits follow (500)
 *   20  4   CRC-32 of the weights file's parameters it was computed with
 *   24  4   images of the test set the reference classifies right
 *   28  4   zero
 *   32  images        the reference class of every test image, one byte
 *   ... 40 * logit images   their logits, float32 [image][10]
 *
 * Header-only (static functions); needs zlib (gzread reads plain files
 * too).
 */
#ifndef LYNX_LENET_DATA_H
#define LYNX_LENET_DATA_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>

#include "lenet.h"

#define LENET_DATA_DIR "/usr/share/datasets/fashion-mnist"
#define LENET_TEST_IMAGES_FILE "t10k-images-idx3-ubyte.gz"
#define LENET_TEST_LABELS_FILE "t10k-labels-idx1-ubyte.gz"
#define LENET_REF_MAGIC "LYNXLREF"
#define LENET_REF_HDR 32u
#define LENET_IDX_MAX (64u << 20) /* far above the 60000-image training set */

/* The whole (decompressed) file at path into *out (free it), *len bytes.
 * 0, or -errno with the reason in why. */
static int lenet_gz_slurp(const char *path, uint8_t **out, size_t *len,
                          char *why, size_t whylen) {
  gzFile f = gzopen(path, "rb");
  size_t cap = 1u << 20, n = 0;
  uint8_t *buf;
  *out = NULL;
  *len = 0;
  if (!f) {
    int e = errno ? errno : ENOMEM;
    snprintf(why, whylen, "cannot open %s: %s", path, strerror(e));
    return -e;
  }
  buf = malloc(cap);
  for (;;) {
    int got;
    if (!buf) {
      gzclose(f);
      snprintf(why, whylen, "%s: out of memory", path);
      return -ENOMEM;
    }
    if (n == cap) {
      uint8_t *nb;
      if (cap >= LENET_IDX_MAX) {
        free(buf);
        gzclose(f);
        snprintf(why, whylen, "%s: larger than %u bytes", path, LENET_IDX_MAX);
        return -EFBIG;
      }
      nb = realloc(buf, cap * 2);
      if (!nb)
        free(buf);
      buf = nb;
      cap *= 2;
      continue;
    }
    got = gzread(f, buf + n, (unsigned)(cap - n));
    if (got < 0) {
      int e;
      snprintf(why, whylen, "cannot read %s: %s", path, gzerror(f, &e));
      free(buf);
      gzclose(f);
      return -EIO;
    }
    if (got == 0)
      break;
    n += (size_t)got;
  }
  gzclose(f);
  *out = buf;
  *len = n;
  return 0;
}

static uint32_t lenet_be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 |
         p[3];
}

static uint32_t lenet_le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
         (uint32_t)p[3] << 24;
}

/* An IDX file of unsigned bytes with dims dimensions: rows (the first
 * dimension) in *count, the items' bytes (dims 2..) must multiply to
 * item; *data points at the first item inside *buf (free *buf). */
static int lenet_idx_load(const char *path, int dims, uint32_t item,
                          uint8_t **buf, const uint8_t **data, uint32_t *count,
                          char *why, size_t whylen) {
  size_t len;
  uint64_t per = 1;
  int rc = lenet_gz_slurp(path, buf, &len, why, whylen);
  if (rc)
    return rc;
  if (len < 4 + 4u * (uint32_t)dims || (*buf)[0] || (*buf)[1] ||
      (*buf)[2] != 0x08 || (*buf)[3] != dims) {
    snprintf(why, whylen, "%s: not an IDX file of %d-dimensional bytes", path,
             dims);
    goto bad;
  }
  for (int d = 1; d < dims; d++)
    per *= lenet_be32(*buf + 4 + 4 * d);
  *count = lenet_be32(*buf + 4);
  if (per != item || len != 4 + 4u * (uint32_t)dims + (uint64_t)*count * item) {
    snprintf(why, whylen, "%s: %zu bytes, not %u items of %u bytes", path, len,
             *count, item);
    goto bad;
  }
  *data = *buf + 4 + 4 * dims;
  return 0;
bad:
  free(*buf);
  *buf = NULL;
  return -EINVAL;
}

/* The test set: images (count x 784) and labels (count), from dir. */
struct lenet_testset {
  uint8_t *ibuf, *lbuf;
  const uint8_t *images, *labels;
  uint32_t count;
};

static void lenet_testset_free(struct lenet_testset *t) {
  free(t->ibuf);
  free(t->lbuf);
  memset(t, 0, sizeof(*t));
}

static int lenet_testset_load(const char *dir, struct lenet_testset *t,
                              char *why, size_t whylen) {
  char path[1024];
  uint32_t nl;
  int rc;
  memset(t, 0, sizeof(*t));
  snprintf(path, sizeof(path), "%s/%s", dir, LENET_TEST_IMAGES_FILE);
  rc = lenet_idx_load(path, 3, LENET_PIXELS, &t->ibuf, &t->images, &t->count,
                      why, whylen);
  if (rc)
    return rc;
  snprintf(path, sizeof(path), "%s/%s", dir, LENET_TEST_LABELS_FILE);
  rc = lenet_idx_load(path, 1, 1, &t->lbuf, &t->labels, &nl, why, whylen);
  if (rc) {
    lenet_testset_free(t);
    return rc;
  }
  if (nl != t->count) {
    snprintf(why, whylen, "%s: %u labels for %u images", dir, nl, t->count);
    lenet_testset_free(t);
    return -EINVAL;
  }
  for (uint32_t i = 0; i < nl; i++)
    if (t->labels[i] >= LENET_CLASSES) {
      snprintf(why, whylen, "%s: label %u of image %u", dir, t->labels[i], i);
      lenet_testset_free(t);
      return -EINVAL;
    }
  return 0;
}

struct lenet_ref {
  uint8_t *buf;
  const uint8_t *classes; /* [images] */
  uint32_t images, logit_images, crc, correct;
};

static void lenet_ref_free(struct lenet_ref *r) {
  free(r->buf);
  memset(r, 0, sizeof(*r));
}

/* The logits of image i < logit_images. */
static void lenet_ref_logits(const struct lenet_ref *r, uint32_t i,
                             float out[LENET_CLASSES]) {
  const uint8_t *p = r->buf + LENET_REF_HDR + r->images + 40u * i;
  for (int k = 0; k < LENET_CLASSES; k++) {
    uint32_t bits = lenet_le32(p + 4 * k);
    memcpy(&out[k], &bits, 4);
  }
}

static int lenet_ref_load(const char *path, struct lenet_ref *r, char *why,
                          size_t whylen) {
  size_t len;
  int rc;
  memset(r, 0, sizeof(*r));
  rc = lenet_gz_slurp(path, &r->buf, &len, why, whylen);
  if (rc)
    return rc;
  if (len < LENET_REF_HDR || memcmp(r->buf, LENET_REF_MAGIC, 8) ||
      lenet_le32(r->buf + 8) != 1) {
    snprintf(why, whylen, "%s: not a version 1 LeNet reference file", path);
    goto bad;
  }
  r->images = lenet_le32(r->buf + 12);
  r->logit_images = lenet_le32(r->buf + 16);
  r->crc = lenet_le32(r->buf + 20);
  r->correct = lenet_le32(r->buf + 24);
  if (r->logit_images > r->images || r->correct > r->images ||
      len != LENET_REF_HDR + (uint64_t)r->images + 40ull * r->logit_images) {
    snprintf(why, whylen,
             "%s: %zu bytes do not hold %u classes and %u "
             "images' logits",
             path, len, r->images, r->logit_images);
    goto bad;
  }
  r->classes = r->buf + LENET_REF_HDR;
  for (uint32_t i = 0; i < r->images; i++)
    if (r->classes[i] >= LENET_CLASSES) {
      snprintf(why, whylen, "%s: class %u of image %u", path, r->classes[i], i);
      goto bad;
    }
  return 0;
bad:
  lenet_ref_free(r);
  return -EINVAL;
}

#endif
