/*
 * lynx_cuda.h - the host-callable side of the CUDA device code.
 *
 * The agent's CUDA backend (accel/cuda/cuda_launch.c, C) launches its
 * built-in applications as persistent kernels through this interface; the
 * kernels (apps.cu, CUDA C++) are the SDK's persistent kernel
 * (include/lynx/lynx_kernel.cuh, the one a plug-in's module is built
 * from too) over the built-ins' handlers. The launch and control-block
 * layout is the SDK's (include/lynx/lynx_gpu.h). Built only when the CUDA
 * toolkit is (make LYNX_CUDA=ON|AUTO).
 */
#ifndef LYNX_CUDA_H
#define LYNX_CUDA_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "lynx_gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Applications with a CUDA kernel of the agent's own (struct
 * lynx_app.cuda_app; struct lynx_cuda_launch.app). */
enum lynx_cuda_app {
  LYNX_CUDA_APP_NONE = 0,
  LYNX_CUDA_APP_ECHO = 1,
  LYNX_CUDA_APP_SOCKPERF_ECHO = 2,
  LYNX_CUDA_APP_SOCKPERF_FAULT = 3,
  LYNX_CUDA_APP_MC_GET = 4,      /* calls back end "db" (client mqueues) */
  LYNX_CUDA_APP_FACE_VERIFY = 5, /* calls back end "db" (client mqueues) */
  LYNX_CUDA_APP_LENET = 6,       /* needs its weights (app_data) */
};

/* 1 when the application's kernel calls a back end through client
 * mqueues, so each block needs one of its own (lynx_gpu.h). */
LYNX_HD int lynx_cuda_app_calls(uint32_t app) {
  return app == LYNX_CUDA_APP_MC_GET || app == LYNX_CUDA_APP_FACE_VERIFY;
}

/* How many blocks of `threads` threads the persistent kernel can keep
 * resident at once on device `device` (every block must be resident, or
 * the mqueues of the blocks that wait are never served). 0 or a
 * cudaError_t value, its text in err: cudaErrorInvalidValue for a thread
 * count that is not a multiple of 32 in 32..1024,
 * cudaErrorInvalidConfiguration when not even one block fits an SM. The
 * query switches to `device` and back to the calling thread's current
 * device. */
int lynx_cuda_resident_blocks(int device, uint32_t threads, uint32_t *max,
                              char *err, size_t errlen);

/* 1 for a thread count a block of the persistent kernel may have. */
static inline int lynx_cuda_threads_ok(uint32_t threads) {
  return threads >= 32 && threads <= LYNX_GPU_THREADS_MAX && threads % 32 == 0;
}

static inline int lynx_cuda_einval(char *err, size_t errlen, const char *msg) {
  if (err && errlen)
    snprintf(err, errlen, "%s", msg);
  return -22; /* EINVAL */
}

/* The checks of a launch description every persistent kernel needs (the
 * agent's built-in one and a module's, lynx_gpu.h): 0, or -22 (EINVAL)
 * with the reason in err for one that is out of bounds, e.g. more than 64
 * server mqueues per block (ceil(n_server / blocks)). Blocks beyond
 * n_server serve nothing and only idle. An app that calls a back end
 * (calls) needs n_backends >= 1, app_backend < n_backends, client_base ==
 * n_server and n_mqueues == client_base + blocks * n_backends. */
static inline int lynx_cuda_launch_check(const struct lynx_cuda_launch *l,
                                         char *err, size_t errlen) {
  struct lynx_geom g;
  uint32_t per_block;
  if (!l || !l->region || !l->kctl || !l->config)
    return lynx_cuda_einval(err, errlen,
                            "launch: no region, control block or "
                            "configuration");
  if (lynx_geom_init(&g, l->n_mqueues, l->slots, l->slot_size, l->large_bytes))
    return lynx_cuda_einval(err, errlen,
                            "launch: region geometry out of bounds");
  if (l->n_server < 1 || l->n_server > l->n_mqueues)
    return lynx_cuda_einval(
        err, errlen, "launch: server mqueues must be 1..the region's mqueues");
  if (!lynx_cuda_threads_ok(l->threads))
    return lynx_cuda_einval(err, errlen,
                            "launch: threads per block must be a multiple "
                            "of 32 in 32..1024");
  if (l->blocks < 1 || l->blocks > (uint32_t)INT32_MAX)
    return lynx_cuda_einval(err, errlen, "launch: bad block count");
  /* a block per client mqueue of each back end, and nothing else after
   * the server mqueues (lynx_cuda_client_mq) */
  if (l->calls &&
      (l->n_backends < 1 || l->app_backend >= l->n_backends ||
       l->client_base != l->n_server ||
       (uint64_t)l->client_base + (uint64_t)l->blocks * l->n_backends !=
           l->n_mqueues))
    return lynx_cuda_einval(err, errlen,
                            "launch: the application calls a back end: the "
                            "region needs each block's own client mqueue of "
                            "every back end after the server mqueues");
  per_block = (l->n_server + l->blocks - 1) / l->blocks;
  if (per_block > LYNX_CUDA_MQS_PER_BLOCK) {
    if (err && errlen)
      snprintf(err, errlen,
               "launch: %u server mqueues over %u blocks is %u per block; a "
               "block serves at most %u (launch at least %u blocks)",
               l->n_server, l->blocks, per_block, LYNX_CUDA_MQS_PER_BLOCK,
               (l->n_server + LYNX_CUDA_MQS_PER_BLOCK - 1) /
                   LYNX_CUDA_MQS_PER_BLOCK);
    return -22;
  }
  return 0;
}

/* Launches the agent's persistent kernel of built-in application l->app
 * on stream (a cudaStream_t) of the current device. 0, or a cudaError_t
 * value with its text in err; -22 (EINVAL) for a launch description
 * lynx_cuda_launch_check refuses, an app without a kernel, lenet without
 * its weights or calls that is not the app's, with the reason in err. */
int lynx_cuda_start(const struct lynx_cuda_launch *l, void *stream, char *err,
                    size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
