/*
 * gpu_hostcentric_kernel.cu - the device half of lynx-gpu-hostcentric: per
 * request, a copy into the GPU, a one-block kernel running sockperf-echo's
 * logic (accel/app_logic.h, what the persistent kernel runs), a copy back
 * and a stream synchronisation. Pinned host buffers, one stream: the
 * fastest honest form of the design Lynx replaces.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "app_logic.h"
#include "gpu_hostcentric.h"

struct lynx_hc {
  int device;
  uint32_t max, work_us;
  cudaStream_t s;
  uint8_t *h_in, *h_out; /* pinned */
  uint8_t *d_in, *d_out;
  int *h_reply, *d_reply;
};

__device__ static uint64_t hc_globaltimer(void) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void hc_sockperf_echo(const uint8_t *in, uint8_t *out,
                                 uint32_t len, uint32_t work_us,
                                 int *reply) {
  for (uint32_t i = threadIdx.x; i < len; i += blockDim.x)
    out[i] = in[i];
  __syncthreads();
  if (threadIdx.x == 0) {
    int r = lynx_sockperf_wants_reply(in, len);
    if (work_us) {
      uint64_t end = hc_globaltimer() + (uint64_t)work_us * 1000u;
      while (hc_globaltimer() < end)
        ;
    }
    if (r)
      lynx_sockperf_make_reply(out);
    *reply = r;
  }
}

static int fail(cudaError_t e, const char *what, char *err, size_t errlen) {
  snprintf(err, errlen, "%s: %s", what, cudaGetErrorString(e));
  return -1;
}

extern "C" int lynx_hc_open(int device, uint32_t max, uint32_t work_us,
                            struct lynx_hc **out, char *err, size_t errlen) {
  struct lynx_hc *h = (struct lynx_hc *)calloc(1, sizeof(*h));
  cudaError_t e;
  *out = NULL;
  if (!h) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  h->device = device;
  h->max = max;
  h->work_us = work_us;
  e = cudaSetDevice(device);
  if (e == cudaSuccess)
    e = cudaStreamCreateWithFlags(&h->s, cudaStreamNonBlocking);
  if (e == cudaSuccess)
    e = cudaMallocHost((void **)&h->h_in, max);
  if (e == cudaSuccess)
    e = cudaMallocHost((void **)&h->h_out, max);
  if (e == cudaSuccess)
    e = cudaMallocHost((void **)&h->h_reply, sizeof(int));
  if (e == cudaSuccess)
    e = cudaMalloc((void **)&h->d_in, max);
  if (e == cudaSuccess)
    e = cudaMalloc((void **)&h->d_out, max);
  if (e == cudaSuccess)
    e = cudaMalloc((void **)&h->d_reply, sizeof(int));
  if (e != cudaSuccess) {
    lynx_hc_close(h);
    return fail(e, "GPU set-up", err, errlen);
  }
  *out = h;
  return 0;
}

extern "C" int lynx_hc_serve(struct lynx_hc *h, const void *req, uint32_t len,
                             void *resp, char *err, size_t errlen) {
  cudaError_t e;
  if (len > h->max)
    len = h->max;
  memcpy(h->h_in, req, len);
  e = cudaMemcpyAsync(h->d_in, h->h_in, len, cudaMemcpyHostToDevice, h->s);
  if (e == cudaSuccess) {
    hc_sockperf_echo<<<1, 128, 0, h->s>>>(h->d_in, h->d_out, len, h->work_us,
                                          h->d_reply);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(h->h_reply, h->d_reply, sizeof(int),
                        cudaMemcpyDeviceToHost, h->s);
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(h->h_out, h->d_out, len, cudaMemcpyDeviceToHost, h->s);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(h->s);
  if (e != cudaSuccess)
    return fail(e, "serving a request", err, errlen);
  if (!*h->h_reply)
    return 0;
  memcpy(resp, h->h_out, len);
  return 1;
}

extern "C" void lynx_hc_close(struct lynx_hc *h) {
  if (!h)
    return;
  cudaSetDevice(h->device);
  if (h->s)
    cudaStreamSynchronize(h->s);
  cudaFree(h->d_in);
  cudaFree(h->d_out);
  cudaFree(h->d_reply);
  cudaFreeHost(h->h_in);
  cudaFreeHost(h->h_out);
  cudaFreeHost(h->h_reply);
  if (h->s)
    cudaStreamDestroy(h->s);
  free(h);
}
