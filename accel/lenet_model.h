/*
 * lenet_model.h - the host side of the lenet service (docs/lenet.md): its
 * weights file, loaded and checked once per agent and then shared
 * read-only by every instance, and the whole network on a CPU (lenet.c),
 * layer by layer over lenet.h's per-element functions.
 *
 * Weights file (little-endian; tools/train-lenet.py writes it):
 *
 *   off  size  field
 *   0    8     magic "LYNXLNT5"
 *   8    4     version (1)
 *   12   4     header bytes (128): the parameters start there
 *   16   4     layers (5)
 *   20   4     parameters (61706 float32 after the header)
 *   24   4     CRC-32 (zlib's) of the parameters' bytes
 *   28   4     test images the training script's reference inference
 *              classified right
 *   32   4     test images (10000)
 *   36   4     input scale (255: x = pixel / 255)
 *   40   80    per layer: u32 out, in, kh, kw: (6,1,5,5) (16,6,5,5)
 *              (120,400,1,1) (84,120,1,1) (10,84,1,1)
 *   120  8     zero
 *   128  ...   per layer its weights, then its biases, float32 (the
 *              offsets in lenet.h)
 *
 * A file that differs in anything is refused with the reason: size, magic,
 * version, shapes, checksum, a NaN or infinite parameter.
 */
#ifndef LYNX_LENET_MODEL_H
#define LYNX_LENET_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "lenet.h"

#define LENET_FILE_MAGIC "LYNXLNT5"
#define LENET_FILE_VERSION 1u
#define LENET_FILE_HDR 128u
#define LENET_FILE_LAYERS 5u
#define LENET_FILE_SIZE (LENET_FILE_HDR + 4u * LENET_PARAMS)

struct lenet_model {
  float params[LENET_PARAMS]; /* lenet.h's layout */
  uint32_t crc;               /* the parameters' CRC-32, as in the file */
  uint32_t test_correct, test_total; /* the training script's accuracy */
};

/* Every activation of one image, for the CPU forward pass and its tests. */
struct lenet_acts {
  float in[LENET_PIXELS];
  float c1[LENET_C1_OUT * LENET_C1_SIDE * LENET_C1_SIDE]; /* after ReLU */
  float p1[LENET_C1_OUT * LENET_P1_SIDE * LENET_P1_SIDE];
  float c2[LENET_C2_OUT * LENET_C2_SIDE * LENET_C2_SIDE]; /* after ReLU */
  float p2[LENET_FLAT];
  float f1[LENET_F1_OUT]; /* after ReLU */
  float f2[LENET_F2_OUT]; /* after ReLU */
  float logits[LENET_CLASSES];
};

/* Checks a weights file's bytes and fills m: 0, or -EINVAL with the
 * reason in why. */
int lenet_model_parse(const uint8_t *buf, size_t len, struct lenet_model *m,
                      char *why, size_t whylen);

/* Reads and checks the weights file at path: 0 and *out (free with
 * lenet_model_free), or -errno with the reason in why (-ENOENT and the
 * like when it cannot be read, -EINVAL when it is not a valid file). */
int lenet_model_load(const char *path, struct lenet_model **out, char *why,
                     size_t whylen);
void lenet_model_free(struct lenet_model *m);

/* zlib's CRC-32 (the file's checksum). */
uint32_t lenet_crc32(const uint8_t *p, size_t n);

/* One layer on the CPU, every output element in turn (lenet.h), ReLU
 * applied where relu. */
void lenet_conv_layer(const float *w, const float *b, const float *in, int in_c,
                      int side, int pad, int out_c, int out_side, int relu,
                      float *out);
void lenet_pool_layer(const float *in, int c, int side, float *out);
void lenet_fc_layer(const float *w, const float *b, const float *in, int n_in,
                    int n_out, int relu, float *out);

/* The whole network over a 784-byte image: every activation in a, the
 * logits in a->logits; returns the class. */
int lenet_forward(const float *params, const uint8_t *pixels,
                  struct lenet_acts *a);

/* The same, logits only (a's worth of scratch on the stack). */
int lenet_infer(const struct lenet_model *m, const uint8_t *pixels,
                float logits[LENET_CLASSES]);

#endif
