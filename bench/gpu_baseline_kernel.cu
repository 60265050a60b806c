/*
 * gpu_baseline_kernel.cu - the device half of lynx-gpu-baseline: per
 * stream, pinned host buffers and device buffers for one request; per
 * request a copy in, a one-block kernel running the application's device
 * code (the same functions Lynx's persistent kernel calls), a copy back
 * and an event the host polls. The fastest honest form of the design Lynx
 * replaces: the host CPU and two copies on every request, several requests
 * in flight on a pool of streams.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "app_logic.h"
#include "face_dev.cuh"
#include "gpu_baseline.h"
#include "lenet_dev.cuh"

#define GB_THREADS 128

/* An answer: 4-byte length (0: no answer), then its bytes. */
#define GB_HDR 4u

struct gb_slot {
  cudaStream_t s;
  cudaEvent_t done;
  uint8_t *h_in, *h_out; /* pinned: request then aux; length then answer */
  uint8_t *d_in, *d_out;
  uint32_t back; /* answer bytes copied back for the request in flight */
};

struct lynx_gb {
  struct lynx_gb_cfg c;
  struct gb_slot *slot;
  float *d_params; /* lenet's weights in GPU memory */
};

__device__ static uint64_t gb_globaltimer(void) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/* echo and sockperf-echo: every thread copies, thread 0 decides. */
__device__ static void gb_echo(const uint8_t *in, uint32_t len, uint8_t *out,
                               int sockperf) {
  uint32_t *olen = (uint32_t *)out;
  for (uint32_t i = threadIdx.x; i < len; i += blockDim.x)
    out[GB_HDR + i] = in[i];
  __syncthreads();
  if (threadIdx.x == 0) {
    int r = !sockperf || lynx_sockperf_wants_reply(in, len);
    if (r && sockperf)
      lynx_sockperf_make_reply(out + GB_HDR);
    *olen = r ? len : 0;
  }
}

/* face-verify: the request's probe against the stored image (aux, which
 * the host fetched and checked), with the device code of Lynx's kernel. */
__device__ static void gb_face(const uint8_t *in, uint32_t len,
                               const uint8_t *aux, uint32_t aux_len,
                               uint8_t *out) {
  __shared__ __align__(16) uint8_t probe[FACE_PIXELS], stored[FACE_PIXELS];
  __shared__ uint32_t hist[FACE_HIST_BINS];
  __shared__ unsigned long long sum;
  if (len != FACE_REQ_LEN || aux_len != FACE_PIXELS) { /* the host's check */
    if (threadIdx.x == 0)
      *(uint32_t *)out = 0;
    return;
  }
  for (uint32_t i = threadIdx.x; i < FACE_PIXELS; i += blockDim.x) {
    probe[i] = in[FACE_LABEL_LEN + i];
    stored[i] = aux[i];
  }
  __syncthreads();
  face_block_verify(probe, stored, hist, &sum, out + GB_HDR);
  if (threadIdx.x == 0)
    *(uint32_t *)out = FACE_RESP_LEN;
}

/* lenet: the block runs lenet_dev.cuh, the code of Lynx's lenet kernel;
 * a request of another size gets no answer, as there. */
__device__ static void gb_lenet(const float *w, const uint8_t *in, uint32_t len,
                                uint8_t *out) {
  __shared__ struct lenet_smem act;
  __shared__ float logits[LENET_CLASSES];
  int clen = lenet_req_cookie_len(len);
  if (clen < 0 || !w) {
    if (threadIdx.x == 0)
      *(uint32_t *)out = 0;
    return;
  }
  lenet_block_infer(w, in, logits, &act);
  if (threadIdx.x == 0)
    *(uint32_t *)out =
        lenet_resp_encode(out + GB_HDR, lenet_argmax(logits), logits,
                          in + LENET_PIXELS, (uint32_t)clen);
}

__global__ void gb_kernel(uint32_t app, const uint8_t *in, uint32_t len,
                          const uint8_t *aux, uint32_t aux_len, uint8_t *out,
                          uint32_t work_us, const float *params) {
  if (work_us && threadIdx.x == 0) {
    uint64_t end = gb_globaltimer() + (uint64_t)work_us * 1000u;
    while (gb_globaltimer() < end)
      __nanosleep(256);
  }
  __syncthreads();
  switch (app) {
  case LYNX_GB_ECHO:
  case LYNX_GB_SOCKPERF_ECHO:
    gb_echo(in, len, out, app == LYNX_GB_SOCKPERF_ECHO);
    break;
  case LYNX_GB_FACE_VERIFY:
    gb_face(in, len, aux, aux_len, out);
    break;
  case LYNX_GB_LENET:
    gb_lenet(params, in, len, out);
    break;
  default:
    if (threadIdx.x == 0)
      *(uint32_t *)out = 0;
  }
}

static int fail(cudaError_t e, const char *what, char *err, size_t errlen) {
  snprintf(err, errlen, "%s: %s", what, cudaGetErrorString(e));
  return -1;
}

extern "C" int lynx_gb_open(const struct lynx_gb_cfg *c, struct lynx_gb **out,
                            char *err, size_t errlen) {
  struct lynx_gb *g = (struct lynx_gb *)calloc(1, sizeof(*g));
  size_t in = (size_t)c->req_max + c->aux_max, o = GB_HDR + (size_t)c->resp_max;
  cudaError_t e = cudaSuccess;
  *out = NULL;
  if (g)
    g->slot = (struct gb_slot *)calloc(c->streams, sizeof(*g->slot));
  if (!g || !g->slot) {
    free(g);
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  g->c = *c;
  e = cudaSetDevice(c->device);
  if (e == cudaSuccess && c->app == LYNX_GB_LENET) {
    if (!c->params) {
      lynx_gb_close(g);
      snprintf(err, errlen, "lenet without its weights");
      return -1;
    }
    e = cudaMalloc((void **)&g->d_params, LENET_PARAMS * sizeof(float));
    if (e == cudaSuccess)
      e = cudaMemcpy(g->d_params, c->params, LENET_PARAMS * sizeof(float),
                     cudaMemcpyHostToDevice);
  }
  for (uint32_t i = 0; i < c->streams && e == cudaSuccess; i++) {
    struct gb_slot *s = &g->slot[i];
    e = cudaStreamCreateWithFlags(&s->s, cudaStreamNonBlocking);
    if (e == cudaSuccess)
      e = cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming);
    if (e == cudaSuccess)
      e = cudaMallocHost((void **)&s->h_in, in);
    if (e == cudaSuccess)
      e = cudaMallocHost((void **)&s->h_out, o);
    if (e == cudaSuccess)
      e = cudaMalloc((void **)&s->d_in, in);
    if (e == cudaSuccess)
      e = cudaMalloc((void **)&s->d_out, o);
  }
  if (e != cudaSuccess) {
    lynx_gb_close(g);
    return fail(e, "GPU set-up", err, errlen);
  }
  *out = g;
  return 0;
}

extern "C" int lynx_gb_submit(struct lynx_gb *g, uint32_t slot, const void *req,
                              uint32_t len, const void *aux, uint32_t aux_len,
                              char *err, size_t errlen) {
  struct gb_slot *s = &g->slot[slot];
  cudaError_t e;
  if (len > g->c.req_max)
    len = g->c.req_max;
  if (aux_len > g->c.aux_max)
    aux_len = g->c.aux_max;
  memcpy(s->h_in, req, len);
  if (aux_len)
    memcpy(s->h_in + g->c.req_max, aux, aux_len);
  e = cudaMemcpyAsync(s->d_in, s->h_in, len, cudaMemcpyHostToDevice, s->s);
  if (e == cudaSuccess && aux_len)
    e = cudaMemcpyAsync(s->d_in + g->c.req_max, s->h_in + g->c.req_max, aux_len,
                        cudaMemcpyHostToDevice, s->s);
  if (e == cudaSuccess) {
    gb_kernel<<<1, GB_THREADS, 0, s->s>>>((uint32_t)g->c.app, s->d_in, len,
                                          s->d_in + g->c.req_max, aux_len,
                                          s->d_out, g->c.work_us, g->d_params);
    e = cudaGetLastError();
  }
  /* length and answer in one copy, as long as the answer can be (an echo
   * no longer than its request): no second round trip for the length */
  s->back = g->c.app == LYNX_GB_ECHO || g->c.app == LYNX_GB_SOCKPERF_ECHO
                ? len
                : g->c.resp_max;
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(s->h_out, s->d_out, GB_HDR + s->back,
                        cudaMemcpyDeviceToHost, s->s);
  if (e == cudaSuccess)
    e = cudaEventRecord(s->done, s->s);
  if (e != cudaSuccess)
    return fail(e, "submitting a request", err, errlen);
  return 0;
}

extern "C" int lynx_gb_poll(struct lynx_gb *g, uint32_t slot,
                            const uint8_t **resp, uint32_t *resp_len, char *err,
                            size_t errlen) {
  struct gb_slot *s = &g->slot[slot];
  uint32_t n;
  cudaError_t e = cudaEventQuery(s->done);
  if (e == cudaErrorNotReady)
    return 0;
  if (e != cudaSuccess)
    return fail(e, "a request's stream", err, errlen);
  memcpy(&n, s->h_out, sizeof(n));
  *resp = s->h_out + GB_HDR;
  *resp_len = n <= s->back ? n : 0;
  return 1;
}

extern "C" void lynx_gb_close(struct lynx_gb *g) {
  if (!g)
    return;
  cudaSetDevice(g->c.device);
  for (uint32_t i = 0; g->slot && i < g->c.streams; i++) {
    struct gb_slot *s = &g->slot[i];
    if (s->s)
      cudaStreamSynchronize(s->s);
    cudaFree(s->d_in);
    cudaFree(s->d_out);
    cudaFreeHost(s->h_in);
    cudaFreeHost(s->h_out);
    if (s->done)
      cudaEventDestroy(s->done);
    if (s->s)
      cudaStreamDestroy(s->s);
  }
  cudaFree(g->d_params);
  free(g->slot);
  free(g);
}
