/*
 * cuda_counters.c - what a persistent kernel counts (gpu_instance_counters,
 * gpu_instance_latency, gpu.h): its blocks' counters and latency
 * histograms, read from its control block while it runs and kept once it
 * stopped.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_internal.h"
#include "gpu.h"
#include "log.h"
#include "lynx_cuda.h"
#include "util.h"

int gpu_instance_counters(struct gpu_instance *gi, uint64_t *req,
                          uint64_t *resp, uint64_t *drops, uint64_t *bad) {
  size_t n = lynx_cuda_kctl_lat_off(gi->blocks); /* header and stats */
  struct lynx_cuda_kctl *k;
  cudaError_t e;
  *req = gi->stats[0];
  *resp = gi->stats[1];
  *drops = gi->stats[2];
  *bad = gi->stats[3];
  if (!gi->kctl || (gi->stopped && !gi->hung))
    return 0; /* final counters kept at stop */
  k = malloc(n);
  if (!k)
    return -ENOMEM;
  cudaSetDevice(gi->device);
  pthread_mutex_lock(&gi->lock);
  e = cudaMemcpyAsync(k, gi->kctl, n, cudaMemcpyDeviceToHost, gi->copy);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(gi->copy);
  if (e == cudaSuccess)
    lynx__cuda_clock_sample(gi, k->now_gt, lynx_now_ns());
  pthread_mutex_unlock(&gi->lock);
  if (e != cudaSuccess) {
    lynx__cuda_note(gi->device, e, "reading counters");
    free(k);
    return lynx__cuda_errno(e);
  }
  *req = *resp = *drops = *bad = 0;
  for (uint32_t b = 0; b < gi->blocks; b++) {
    *req += k->blocks[b].requests;
    *resp += k->blocks[b].responses;
    *drops += k->blocks[b].drops;
    *bad += k->blocks[b].bad;
  }
  gi->stats[0] = *req;
  gi->stats[1] = *resp;
  gi->stats[2] = *drops;
  gi->stats[3] = *bad;
  free(k);
  /* a kernel that died reports here: record it for the heartbeat */
  e = cudaStreamQuery(gi->kern);
  if (e != cudaSuccess && e != cudaErrorNotReady)
    lynx__cuda_note(gi->device, e, "persistent kernel");
  else if (e == cudaSuccess && !gi->stopping)
    LYNX_LOG_RL(LYNX_LOG_WARN, "cuda",
                "GPU %d: a persistent kernel exited "
                "without being asked to",
                gi->device);
  return 0;
}

int gpu_instance_latency(struct gpu_instance *gi, struct lynx_lat *out) {
  size_t n = (size_t)gi->blocks * sizeof(struct lynx_lat);
  struct lynx_lat *k;
  cudaError_t e;
  if (out != &gi->lat)
    *out = gi->lat;
  if (!gi->kctl || (gi->stopped && !gi->hung))
    return 0; /* final histograms kept at stop */
  k = malloc(n);
  if (!k)
    return -ENOMEM;
  cudaSetDevice(gi->device);
  pthread_mutex_lock(&gi->lock);
  e = cudaMemcpyAsync(k,
                      (uint8_t *)gi->kctl + lynx_cuda_kctl_lat_off(gi->blocks),
                      n, cudaMemcpyDeviceToHost, gi->copy);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(gi->copy);
  pthread_mutex_unlock(&gi->lock);
  if (e != cudaSuccess) {
    lynx__cuda_note(gi->device, e, "reading latency histograms");
    free(k);
    return lynx__cuda_errno(e);
  }
  memset(&gi->lat, 0, sizeof(gi->lat));
  for (uint32_t b = 0; b < gi->blocks; b++) {
    lynx_lat_merge(&gi->lat.queue, &k[b].queue);
    lynx_lat_merge(&gi->lat.service, &k[b].service);
  }
  free(k);
  if (out != &gi->lat)
    *out = gi->lat;
  return 0;
}
