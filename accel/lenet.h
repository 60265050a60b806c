/*
 * lenet.h - LeNet-5 inference for the `lenet` service (docs/lenet.md):
 * the network's shapes, the weights' layout, one output element of each
 * layer, the request and response formats. Plain C, every function LYNX_HD
 * (include/lynx/mqueue.h), so the CPU handler (accel/lenet.c, apps.c) and a GPU
 * kernel run the same code: a CPU loops over a layer's output elements, a
 * kernel gives them to threads.
 *
 * The network, input x = pixel / 255 (float32, row-major 28x28):
 *
 *   conv1  6@5x5, pad 2     1x28x28 -> 6x28x28, ReLU
 *   pool1  2x2 max          6x14x14
 *   conv2  16@5x5           16x10x10, ReLU
 *   pool2  2x2 max          16x5x5, read as 400 inputs (channel, row, col)
 *   fc1    400 -> 120, ReLU
 *   fc2    120 -> 84, ReLU
 *   fc3    84 -> 10         the logits; the class is the first largest
 *
 * Bit-exact results. Every output element is summed in one canonical
 * order: the bias first, then the terms in ascending (in-channel, ky, kx)
 * order for a convolution (a padding pixel is a +0.0 term like any other)
 * and in ascending input order for a fully connected layer; each product
 * is rounded to float32, then added and rounded (no fused multiply-add).
 * ReLU is v > 0 ? v : +0; a pool takes (0,0), then (0,1), (1,0), (1,1),
 * each only when strictly greater. All of these are exact IEEE-754
 * operations, so the training script's reference inference
 * (tools/train-lenet.py, numpy in the same order), this code on a CPU and
 * the same code on a GPU give the same logits bit for bit, and the same
 * class on every test image: a wrong class is a bug, never rounding.
 *
 * Two things would break that, and are ruled out:
 *  - contraction of a*b+c into an FMA (one rounding instead of two). gcc
 *    contracts by default in its GNU C modes (this project's -std=gnu11)
 *    wherever the target has FMA: always on aarch64 (the BlueField's
 *    cores), on x86-64 with -march=haswell or later. Host code that
 *    computes with these functions is compiled with -ffp-contract=off
 *    (accel/CMakeLists.txt). nvcc contracts by default too (--fmad=true),
 *    so device code uses __fmul_rn/__fadd_rn, which it never contracts
 *    (LENET_MUL/LENET_ADD below), and __fdiv_rn for the input scaling
 *    (correctly rounded even under --use_fast_math).
 *  - excess precision (x87): refused at compile time below.
 */
#ifndef LYNX_LENET_H
#define LYNX_LENET_H

#include <float.h>
#include <stdint.h>
#include <string.h>

#include "mqueue.h" /* LYNX_HD */

#if !defined(__CUDA_ARCH__) && defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD != 0
#error "lenet.h needs float arithmetic evaluated in float (FLT_EVAL_METHOD 0)"
#endif

#if defined(__CUDA_ARCH__)
#define LENET_MUL(a, b) __fmul_rn((a), (b))
#define LENET_ADD(a, b) __fadd_rn((a), (b))
#define LENET_DIV(a, b) __fdiv_rn((a), (b))
#else
#define LENET_MUL(a, b) ((a) * (b))
#define LENET_ADD(a, b) ((a) + (b))
#define LENET_DIV(a, b) ((a) / (b))
#endif

/* ---- shapes ---- */

#define LENET_SIDE 28
#define LENET_PIXELS (LENET_SIDE * LENET_SIDE) /* 784 */
#define LENET_CLASSES 10
#define LENET_INPUT_SCALE 255.0f /* x = pixel / 255 */
#define LENET_K 5                /* every convolution is 5x5 */

#define LENET_C1_OUT 6
#define LENET_C1_PAD 2
#define LENET_C1_SIDE 28 /* 28 + 2*2 - 5 + 1 */
#define LENET_P1_SIDE 14
#define LENET_C2_OUT 16
#define LENET_C2_SIDE 10 /* 14 - 5 + 1 */
#define LENET_P2_SIDE 5
#define LENET_FLAT (LENET_C2_OUT * LENET_P2_SIDE * LENET_P2_SIDE) /* 400 */
#define LENET_F1_OUT 120
#define LENET_F2_OUT 84

/* Offsets (in floats) of each layer's weights and biases in the parameter
 * array, which is the weights file's payload as it stands (lenet.c):
 * conv weights [out][in][ky][kx], fc weights [out][in], then the biases. */
#define LENET_C1_W 0     /* [6][1][5][5] */
#define LENET_C1_B 150   /* [6] */
#define LENET_C2_W 156   /* [16][6][5][5] */
#define LENET_C2_B 2556  /* [16] */
#define LENET_F1_W 2572  /* [120][400] */
#define LENET_F1_B 50572 /* [120] */
#define LENET_F2_W 50692 /* [84][120] */
#define LENET_F2_B 60772 /* [84] */
#define LENET_F3_W 60856 /* [10][84] */
#define LENET_F3_B 61696 /* [10] */
#define LENET_PARAMS 61706u

/* ---- one output element of each layer ---- */

/* Input pixel p scaled: p / 255, correctly rounded. */
LYNX_HD float lenet_scale(uint8_t p) {
  return LENET_DIV((float)p, LENET_INPUT_SCALE);
}

LYNX_HD float lenet_relu(float v) { return v > 0.0f ? v : 0.0f; }

/* Output (oc, oy, ox) of a 5x5 convolution with zero padding pad over in
 * ([in_c][side][side]), before ReLU: w is [out][in_c][5][5], b [out]. */
LYNX_HD float lenet_conv_elem(const float *w, const float *b, const float *in,
                              int in_c, int side, int pad, int oc, int oy,
                              int ox) {
  float acc = b[oc];
  const float *wo = w + oc * in_c * LENET_K * LENET_K;
  for (int ic = 0; ic < in_c; ic++) {
    const float *plane = in + ic * side * side;
    for (int ky = 0; ky < LENET_K; ky++) {
      int iy = oy + ky - pad;
      for (int kx = 0; kx < LENET_K; kx++) {
        int ix = ox + kx - pad;
        float v = iy >= 0 && iy < side && ix >= 0 && ix < side
                      ? plane[iy * side + ix]
                      : 0.0f;
        acc = LENET_ADD(acc,
                        LENET_MUL(wo[(ic * LENET_K + ky) * LENET_K + kx], v));
      }
    }
  }
  return acc;
}

/* Output (c, y, x) of a 2x2, stride 2 max pool over in ([c][side][side]). */
LYNX_HD float lenet_pool_elem(const float *in, int side, int c, int y, int x) {
  const float *p = in + (c * side + 2 * y) * side + 2 * x;
  float m = p[0];
  if (p[1] > m)
    m = p[1];
  if (p[side] > m)
    m = p[side];
  if (p[side + 1] > m)
    m = p[side + 1];
  return m;
}

/* Neuron o of a fully connected layer over n_in inputs, before ReLU: w is
 * [out][n_in], b [out]. */
LYNX_HD float lenet_fc_elem(const float *w, const float *b, const float *in,
                            int n_in, int o) {
  float acc = b[o];
  const float *wo = w + o * n_in;
  for (int i = 0; i < n_in; i++)
    acc = LENET_ADD(acc, LENET_MUL(wo[i], in[i]));
  return acc;
}

/* The class: the index of the first largest logit. */
LYNX_HD int lenet_argmax(const float *logits) {
  int best = 0;
  for (int i = 1; i < LENET_CLASSES; i++)
    if (logits[i] > logits[best])
      best = i;
  return best;
}

/* ---- wire formats (docs/lenet.md) ----
 *
 *   request  LENET_PIXELS + n bytes, n = 0..16
 *     0    784  the image: 28x28 grayscale, row-major, one u8 per pixel
 *                (0 white .. 255 black, as in the MNIST files)
 *     784  n    cookie: any bytes, echoed in the answer (a load generator
 *                matches answers to requests with it)
 *   Any other length gets no answer (the application drops it; the
 *   frontend counts it: lynx_frontend_dropped_total{reason="app_dropped"}).
 *
 *   response LENET_RESP_HDR + n bytes
 *     0    1    class, 0..9
 *     1    3    zero
 *     4    40   the 10 logits, IEEE-754 binary32, little-endian: bit-exact
 *                (the same on every accelerator); a softmax of them gives
 *                the scores
 *     44   n    the request's cookie
 */
#define LENET_COOKIE_MAX 16
#define LENET_REQ_MIN LENET_PIXELS
#define LENET_REQ_MAX (LENET_PIXELS + LENET_COOKIE_MAX)    /* 800 */
#define LENET_RESP_HDR (4 + 4 * LENET_CLASSES)             /* 44 */
#define LENET_RESP_MAX (LENET_RESP_HDR + LENET_COOKIE_MAX) /* 60 */

/* The cookie's length (0..16) of a well-formed request, or -1. */
LYNX_HD int lenet_req_cookie_len(uint32_t len) {
  return len >= LENET_REQ_MIN && len <= LENET_REQ_MAX
             ? (int)(len - LENET_REQ_MIN)
             : -1;
}

/* Writes the response (LENET_RESP_HDR + cookie_len bytes) into out; its
 * length. */
LYNX_HD uint32_t lenet_resp_encode(uint8_t *out, int cls, const float *logits,
                                   const uint8_t *cookie, uint32_t cookie_len) {
  out[0] = (uint8_t)cls;
  out[1] = out[2] = out[3] = 0;
  for (int i = 0; i < LENET_CLASSES; i++) {
    uint32_t bits;
    memcpy(&bits, &logits[i], 4);
    for (int k = 0; k < 4; k++)
      out[4 + 4 * i + k] = (uint8_t)(bits >> (8 * k));
  }
  for (uint32_t i = 0; i < cookie_len; i++)
    out[LENET_RESP_HDR + i] = cookie[i];
  return LENET_RESP_HDR + cookie_len;
}

/* Reads a response: 0 with *cls, logits (may be NULL), *cookie pointing
 * into buf and *cookie_len; -1 when len is out of range, the class is not
 * 0..9 or the padding is not zero. */
LYNX_HD int lenet_resp_decode(const uint8_t *buf, uint32_t len, int *cls,
                              float *logits, const uint8_t **cookie,
                              uint32_t *cookie_len) {
  if (len < LENET_RESP_HDR || len > LENET_RESP_MAX || buf[0] >= LENET_CLASSES ||
      buf[1] || buf[2] || buf[3])
    return -1;
  *cls = buf[0];
  for (int i = 0; logits && i < LENET_CLASSES; i++) {
    uint32_t bits = 0;
    for (int k = 0; k < 4; k++)
      bits |= (uint32_t)buf[4 + 4 * i + k] << (8 * k);
    memcpy(&logits[i], &bits, 4);
  }
  *cookie = buf + LENET_RESP_HDR;
  *cookie_len = len - LENET_RESP_HDR;
  return 0;
}

#endif
