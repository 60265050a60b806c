// Compiles accel/lenet.h for the device (the ring_header_nvcc test,
// tests/cuda/nvcc-check.sh): the per-element LeNet functions, the
// non-contracting arithmetic (__fmul_rn/__fadd_rn/__fdiv_rn) and the wire
// formats, under -Werror all-warnings. Nothing here runs. The kernel is the
// shape a GPU lenet takes (docs/lenet.md): one block per image, its
// threads over each layer's output elements, a barrier between layers, so
// every element is the CPU's sum in the CPU's order.
#include "lenet.h"

__global__ void lenet_check_kernel(const float *p, const uint8_t *req,
                                   uint32_t len, uint8_t *resp,
                                   uint32_t *resp_len) {
  // 8868 floats (35.5 KB) of activations in shared memory
  __shared__ float in[LENET_PIXELS];
  __shared__ float c1[LENET_C1_OUT * LENET_C1_SIDE * LENET_C1_SIDE];
  __shared__ float p1[LENET_C1_OUT * LENET_P1_SIDE * LENET_P1_SIDE];
  __shared__ float c2[LENET_C2_OUT * LENET_C2_SIDE * LENET_C2_SIDE];
  __shared__ float p2[LENET_FLAT];
  __shared__ float f1[LENET_F1_OUT], f2[LENET_F2_OUT], lg[LENET_CLASSES];
  const int t = (int)threadIdx.x, n = (int)blockDim.x;
  const int s1 = LENET_C1_SIDE * LENET_C1_SIDE, s2 = LENET_C2_SIDE * LENET_C2_SIDE;
  int cookie = lenet_req_cookie_len(len);
  if (cookie < 0)
    return; // the application drops it
  for (int i = t; i < LENET_PIXELS; i += n)
    in[i] = lenet_scale(req[i]);
  __syncthreads();
  for (int e = t; e < LENET_C1_OUT * s1; e += n)
    c1[e] = lenet_relu(lenet_conv_elem(p + LENET_C1_W, p + LENET_C1_B, in, 1,
                                       LENET_SIDE, LENET_C1_PAD, e / s1,
                                       e % s1 / LENET_C1_SIDE,
                                       e % LENET_C1_SIDE));
  __syncthreads();
  for (int e = t; e < LENET_C1_OUT * LENET_P1_SIDE * LENET_P1_SIDE; e += n)
    p1[e] = lenet_pool_elem(c1, LENET_C1_SIDE,
                            e / (LENET_P1_SIDE * LENET_P1_SIDE),
                            e / LENET_P1_SIDE % LENET_P1_SIDE,
                            e % LENET_P1_SIDE);
  __syncthreads();
  for (int e = t; e < LENET_C2_OUT * s2; e += n)
    c2[e] = lenet_relu(lenet_conv_elem(p + LENET_C2_W, p + LENET_C2_B, p1,
                                       LENET_C1_OUT, LENET_P1_SIDE, 0, e / s2,
                                       e % s2 / LENET_C2_SIDE,
                                       e % LENET_C2_SIDE));
  __syncthreads();
  for (int e = t; e < LENET_FLAT; e += n)
    p2[e] = lenet_pool_elem(c2, LENET_C2_SIDE,
                            e / (LENET_P2_SIDE * LENET_P2_SIDE),
                            e / LENET_P2_SIDE % LENET_P2_SIDE,
                            e % LENET_P2_SIDE);
  __syncthreads();
  for (int o = t; o < LENET_F1_OUT; o += n)
    f1[o] = lenet_relu(
        lenet_fc_elem(p + LENET_F1_W, p + LENET_F1_B, p2, LENET_FLAT, o));
  __syncthreads();
  for (int o = t; o < LENET_F2_OUT; o += n)
    f2[o] = lenet_relu(
        lenet_fc_elem(p + LENET_F2_W, p + LENET_F2_B, f1, LENET_F1_OUT, o));
  __syncthreads();
  for (int o = t; o < LENET_CLASSES; o += n)
    lg[o] = lenet_fc_elem(p + LENET_F3_W, p + LENET_F3_B, f2, LENET_F2_OUT, o);
  __syncthreads();
  if (t == 0)
    *resp_len = lenet_resp_encode(resp, lenet_argmax(lg), lg,
                                  req + LENET_PIXELS, (uint32_t)cookie);
}
