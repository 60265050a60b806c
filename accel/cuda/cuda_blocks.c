/*
 * cuda_blocks.c - how many blocks a persistent kernel runs, from the
 * launch's mqueues, the blocks the GPU keeps resident and, for a kernel
 * that calls back ends, the client mqueues each block needs (docs/gpu.md,
 * "Blocks and mqueues"; docs/client-mqueues.md, "On a GPU").
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "accel.h"
#include "cuda_internal.h"
#include "lynx_cuda.h"
#include "mqueue.h"

/* 1 when l's kernel calls back ends through client mqueues: each block
 * then has its own (docs/client-mqueues.md, "On a GPU"). */
int lynx__cuda_calls_backends(const struct lynx_accel_launch *l) {
  return l->n_backends && l->app &&
         (l->app->module ? l->app->needs_backend != NULL
                         : lynx_cuda_app_calls(l->app->cuda_app));
}

/*
 * How many blocks the persistent kernel runs (docs/gpu.md, "Blocks and
 * mqueues"). Auto (--gpu-blocks 0): one per server mqueue up to one per
 * SM, so a few mqueues get a block each and many share the SMs' blocks,
 * each block scanning its mqueues together; never fewer than a block can
 * serve (LYNX_CUDA_MQS_PER_BLOCK each). Every block must stay resident.
 * A kernel that calls back ends also needs n_backends client mqueues per
 * block in a region of at most LYNX_MQUEUES_MAX mqueues: auto takes fewer
 * blocks to fit, --gpu-blocks beyond it is refused.
 */
int lynx__cuda_pick_blocks(int device, const struct lynx_accel_launch *l,
                           uint32_t resident, uint32_t *out, char *err,
                           size_t errlen) {
  uint32_t need =
      (l->n_server + LYNX_CUDA_MQS_PER_BLOCK - 1) / LYNX_CUDA_MQS_PER_BLOCK;
  uint32_t b = l->gpu_blocks, room = UINT32_MAX;
  int sms = 0;
  if (lynx__cuda_calls_backends(l))
    room = l->n_server < LYNX_MQUEUES_MAX
               ? (LYNX_MQUEUES_MAX - l->n_server) / l->n_backends
               : 0;
  if (!b) {
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) !=
            cudaSuccess ||
        sms < 1)
      sms = 1;
    b = l->n_server < (uint32_t)sms ? l->n_server : (uint32_t)sms;
    if (b > resident)
      b = resident;
    if (b > room)
      b = room;
    if (b < need)
      b = need; /* refused below when that many do not fit */
  } else if (b > l->n_server) {
    b = l->n_server; /* a block beyond the mqueues would only idle */
  }
  if (b < need) {
    snprintf(err, errlen,
             "%u server mqueues need at least %u blocks (a "
             "block serves at most %u): --gpu-blocks %u",
             l->n_server, need, LYNX_CUDA_MQS_PER_BLOCK, l->gpu_blocks);
    return -EINVAL;
  }
  if (b > resident) {
    snprintf(err, errlen,
             "GPU %d keeps at most %u blocks of %u threads "
             "resident, %u needed",
             device, resident, l->gpu_threads, b);
    return -EINVAL;
  }
  if (b > room) {
    snprintf(err, errlen,
             "%u blocks with a client mqueue for each of %u "
             "back ends and %u server mqueues exceed a region's %u mqueues "
             "(fewer --gpu-blocks or mqueues_per_accel)",
             b, l->n_backends, l->n_server, LYNX_MQUEUES_MAX);
    return -EINVAL;
  }
  *out = b;
  return 0;
}

/*
 * The client mqueue layout of a kernel that calls back ends: one block per
 * client mqueue of each back end, so the blocks are the region's layout
 * (l->n_mqueues = n_server + blocks * n_backends, from client_mqs) and are
 * taken from it, after the same checks lynx__cuda_pick_blocks makes.
 * *backend: the back end the app calls (its needs_backend). 0 or -EINVAL
 * with the reason.
 */
int lynx__cuda_client_blocks(const struct lynx_accel_launch *l,
                             uint32_t resident, uint32_t *blocks,
                             uint32_t *backend, char *err, size_t errlen) {
  uint32_t per, need = (l->n_server + LYNX_CUDA_MQS_PER_BLOCK - 1) /
                       LYNX_CUDA_MQS_PER_BLOCK;
  *backend = l->n_backends;
  for (uint32_t k = 0;
       l->backends && l->app->needs_backend && k < l->n_backends; k++)
    if (!strcmp(l->backends[k], l->app->needs_backend)) {
      *backend = k;
      break;
    }
  if (*backend == l->n_backends) {
    snprintf(err, errlen, "application '%s' needs a back end named '%s'",
             l->app->name, l->app->needs_backend ? l->app->needs_backend : "?");
    return -EINVAL;
  }
  per = (l->n_mqueues - l->n_server) / l->n_backends;
  if (l->n_mqueues <= l->n_server ||
      l->n_server + per * l->n_backends != l->n_mqueues || per < need ||
      per > resident || per > l->n_server) {
    snprintf(err, errlen,
             "client mqueue layout: %u mqueues, %u server "
             "mqueues and %u back ends do not give each of the kernel's "
             "blocks its own (%u resident at most)",
             l->n_mqueues, l->n_server, l->n_backends, resident);
    return -EINVAL;
  }
  *blocks = per;
  return 0;
}
