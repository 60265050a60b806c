/*
 * lenet_dev.cuh - LeNet-5 inference by one threadblock: the GPU form of
 * accel/lenet.c's loop, over the same per-element functions (accel/lenet.h),
 * so a GPU and a CPU give the same logits bit for bit.
 *
 * Why one block per request (and not cooperative blocks or dynamic
 * parallelism, as in the paper): a LeNet request is small (about 0.4 M
 * multiply-adds, 6,000 output elements at its widest layer), so one block's
 * threads are already enough to keep each layer's elements busy, the
 * layers' activations fit the block's shared memory (25 KB, below), and
 * a layer waits for the previous one with one __syncthreads(). Several
 * requests are served at once by several blocks (the persistent kernel's
 * blocks, or the baseline's streams), with no grid-wide synchronisation
 * and no child-kernel launch latency (tens of microseconds per layer with
 * dynamic parallelism, which the paper's figure of about 300 us per
 * request reflects). Weights stay in global memory, written once before
 * the launch and read with plain loads: 247 KB, shared by every block, hot
 * in L2 and L1.
 *
 * Calling rule: all threads of the block, uniform control flow, as
 * lynx_dev.cuh's lynx_block_* functions.
 */
#ifndef LYNX_LENET_DEV_CUH
#define LYNX_LENET_DEV_CUH

#if !defined(__CUDACC__)
#error "lenet_dev.cuh is CUDA device code: compile it with nvcc"
#endif

#include <stdint.h>

#include "lenet.h"

/* The block's activations: two buffers used in turn, layer after layer
 * (a: 6x28x28 conv1 out; b: the scaled image, then 6x14x14). */
struct lenet_smem {
  float a[LENET_C1_OUT * LENET_C1_SIDE * LENET_C1_SIDE]; /* 4704 */
  float b[LENET_C1_OUT * LENET_P1_SIDE * LENET_P1_SIDE]; /* 1176 */
};

/* logits (10 floats, any memory) of the 784-pixel image img (global or
 * shared memory; global is read with L1-bypassing loads, lynx_dev.cuh)
 * under the parameters w (LENET_PARAMS floats in global memory). Ends with
 * a barrier: logits are written and visible to the block. */
static __device__ void lenet_block_infer(const float *w, const uint8_t *img,
                                         float *logits, struct lenet_smem *s) {
  const int t = (int)threadIdx.x, n = (int)blockDim.x;
  const int img_global = __isGlobal(img);
  int i;
  /* the image into shared memory (scaled): 16 bytes a load when aligned
   * (an RX payload always is), so 49 threads read it in one round trip
   * across PCIe instead of 7 byte loads in series each */
  if ((uintptr_t)img % 16u == 0 && LENET_PIXELS % 16 == 0) {
    const uint4 *i4 = (const uint4 *)img;
    for (i = t; i < LENET_PIXELS / 16; i += n) {
      uint4 v = img_global ? __ldcg(i4 + i) : i4[i];
      const uint8_t *px = (const uint8_t *)&v;
#pragma unroll
      for (int k = 0; k < 16; k++)
        s->b[i * 16 + k] = lenet_scale(px[k]);
    }
  } else {
    for (i = t; i < LENET_PIXELS; i += n)
      s->b[i] = lenet_scale(img_global ? __ldcg(img + i) : img[i]);
  }
  __syncthreads();
  /* conv1 + ReLU: b (1x28x28) -> a (6x28x28) */
  for (i = t; i < LENET_C1_OUT * LENET_C1_SIDE * LENET_C1_SIDE; i += n) {
    int oc = i / (LENET_C1_SIDE * LENET_C1_SIDE),
        r = i % (LENET_C1_SIDE * LENET_C1_SIDE);
    s->a[i] = lenet_relu(lenet_conv_elem(w + LENET_C1_W, w + LENET_C1_B, s->b,
                                         1, LENET_SIDE, LENET_C1_PAD, oc,
                                         r / LENET_C1_SIDE, r % LENET_C1_SIDE));
  }
  __syncthreads();
  /* pool1: a -> b (6x14x14) */
  for (i = t; i < LENET_C1_OUT * LENET_P1_SIDE * LENET_P1_SIDE; i += n) {
    int c = i / (LENET_P1_SIDE * LENET_P1_SIDE),
        r = i % (LENET_P1_SIDE * LENET_P1_SIDE);
    s->b[i] = lenet_pool_elem(s->a, LENET_C1_SIDE, c, r / LENET_P1_SIDE,
                              r % LENET_P1_SIDE);
  }
  __syncthreads();
  /* conv2 + ReLU: b -> a (16x10x10) */
  for (i = t; i < LENET_C2_OUT * LENET_C2_SIDE * LENET_C2_SIDE; i += n) {
    int oc = i / (LENET_C2_SIDE * LENET_C2_SIDE),
        r = i % (LENET_C2_SIDE * LENET_C2_SIDE);
    s->a[i] = lenet_relu(lenet_conv_elem(w + LENET_C2_W, w + LENET_C2_B, s->b,
                                         LENET_C1_OUT, LENET_P1_SIDE, 0, oc,
                                         r / LENET_C2_SIDE, r % LENET_C2_SIDE));
  }
  __syncthreads();
  /* pool2: a -> b (16x5x5 = the 400 inputs of fc1) */
  for (i = t; i < LENET_FLAT; i += n) {
    int c = i / (LENET_P2_SIDE * LENET_P2_SIDE),
        r = i % (LENET_P2_SIDE * LENET_P2_SIDE);
    s->b[i] = lenet_pool_elem(s->a, LENET_C2_SIDE, c, r / LENET_P2_SIDE,
                              r % LENET_P2_SIDE);
  }
  __syncthreads();
  for (i = t; i < LENET_F1_OUT; i += n) /* fc1 + ReLU: b -> a */
    s->a[i] = lenet_relu(
        lenet_fc_elem(w + LENET_F1_W, w + LENET_F1_B, s->b, LENET_FLAT, i));
  __syncthreads();
  for (i = t; i < LENET_F2_OUT; i += n) /* fc2 + ReLU: a -> b */
    s->b[i] = lenet_relu(
        lenet_fc_elem(w + LENET_F2_W, w + LENET_F2_B, s->a, LENET_F1_OUT, i));
  __syncthreads();
  for (i = t; i < LENET_CLASSES; i += n) /* fc3: b -> logits */
    logits[i] =
        lenet_fc_elem(w + LENET_F3_W, w + LENET_F3_B, s->b, LENET_F2_OUT, i);
  __syncthreads();
}

#endif
