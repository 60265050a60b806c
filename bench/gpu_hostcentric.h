/*
 * gpu_hostcentric.h - the GPU side of lynx-gpu-hostcentric (the
 * host-centric GPU server Lynx replaces): one request at a time, copied to
 * the GPU, answered by a one-block kernel, copied back, on one stream.
 */
#ifndef LYNX_GPU_HOSTCENTRIC_H
#define LYNX_GPU_HOSTCENTRIC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct lynx_hc;

/* GPU device, requests up to max bytes, work_us of emulated processing per
 * request (%globaltimer). 0, or -1 with the CUDA error in err. */
int lynx_hc_open(int device, uint32_t max, uint32_t work_us,
                 struct lynx_hc **out, char *err, size_t errlen);
/* The sockperf-echo answer to req (len bytes) into resp: 1 with an answer,
 * 0 for none (sockperf's server answers pong requests only), -1 with the
 * CUDA error in err. */
int lynx_hc_serve(struct lynx_hc *h, const void *req, uint32_t len,
                  void *resp, char *err, size_t errlen);
void lynx_hc_close(struct lynx_hc *h);

#ifdef __cplusplus
}
#endif

#endif
