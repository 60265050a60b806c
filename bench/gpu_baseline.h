/*
 * gpu_baseline.h - the GPU side of lynx-gpu-baseline, the host-centric GPU
 * server Lynx is compared with (paper §6): a pool of CUDA streams, each
 * taking one request at a time: copy in, one kernel launch, copy out.
 * The host program (gpu_baseline.c) receives, fetches what the request
 * needs from back ends, submits, polls and sends.
 */
#ifndef LYNX_GPU_BASELINE_H
#define LYNX_GPU_BASELINE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What the kernels compute: the same device code the Lynx persistent
 * kernel's application runs (accel/app_logic.h and friends). */
enum lynx_gb_app {
  LYNX_GB_ECHO = 0,          /* the request back */
  LYNX_GB_SOCKPERF_ECHO = 1, /* sockperf's server: pong requests only */
  LYNX_GB_FACE_VERIFY = 2,   /* the request (face.h) against aux, the
                                stored image the host fetched */
  LYNX_GB_LENET = 3,         /* LeNet-5 (lenet.h) with params */
};

struct lynx_gb;

struct lynx_gb_cfg {
  int device;
  enum lynx_gb_app app;
  uint32_t streams;    /* requests in flight at once, one per stream */
  uint32_t req_max;    /* bytes of a request */
  uint32_t aux_max;    /* bytes fetched for it from a back end (0: none) */
  uint32_t resp_max;   /* bytes of an answer */
  uint32_t work_us;    /* emulated processing per request (%globaltimer) */
  const float *params; /* lenet: LENET_PARAMS floats, copied to the GPU */
};

/* 0, or -1 with the CUDA error in err. */
int lynx_gb_open(const struct lynx_gb_cfg *c, struct lynx_gb **out, char *err,
                 size_t errlen);
/* Starts request req (len bytes, at most req_max) with aux (aux_len bytes)
 * on stream slot, which must be idle: copies into its pinned buffer, then
 * on its stream a copy to the GPU, the kernel, a copy back and an event.
 * 0, or -1 with the CUDA error in err. */
int lynx_gb_submit(struct lynx_gb *g, uint32_t slot, const void *req,
                   uint32_t len, const void *aux, uint32_t aux_len, char *err,
                   size_t errlen);
/* Whether slot's request is done: 1 with its answer in *resp (*resp_len
 * bytes, 0 for no answer; valid until the next submit on slot), 0 while it
 * runs, -1 with the CUDA error in err. */
int lynx_gb_poll(struct lynx_gb *g, uint32_t slot, const uint8_t **resp,
                 uint32_t *resp_len, char *err, size_t errlen);
void lynx_gb_close(struct lynx_gb *g);

#ifdef __cplusplus
}
#endif

#endif
