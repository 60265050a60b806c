/*
 * lynx_cuda.h - the host-callable side of the CUDA device code.
 *
 * The agent's CUDA backend (accel/cuda/cuda_launch.c, C) launches applications
 * as persistent kernels through this interface; the kernels (apps.cu,
 * CUDA C++) run the shared ring code of include/lynx/mqueue.h through the
 * per-threadblock I/O library accel/cuda/lynx_dev.cuh. Built only when
 * the CUDA toolkit is (make LYNX_CUDA=ON|AUTO).
 */
#ifndef LYNX_CUDA_H
#define LYNX_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "lathist.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Server mqueues one block can serve (their state lives in the block's
 * shared memory): launch at least ceil(n_server / this) blocks. */
#define LYNX_CUDA_MQS_PER_BLOCK LYNX_GPU_MQS_PER_BLOCK

/* Applications with a CUDA kernel (struct lynx_app.cuda_app). */
enum lynx_cuda_app {
  LYNX_CUDA_APP_NONE = 0,
  LYNX_CUDA_APP_ECHO = 1,
  LYNX_CUDA_APP_SOCKPERF_ECHO = 2,
  LYNX_CUDA_APP_SOCKPERF_FAULT = 3,
  LYNX_CUDA_APP_MC_GET = 4,      /* calls back end "db" (client mqueues) */
  LYNX_CUDA_APP_FACE_VERIFY = 5, /* calls back end "db" (client mqueues) */
  LYNX_CUDA_APP_LENET = 6,       /* needs its weights (lynx_cuda_launch) */
};

/* 1 when the application's kernel calls a back end through client
 * mqueues, so each block needs one of its own (below). */
LYNX_HD int lynx_cuda_app_calls(uint32_t app) {
  return app == LYNX_CUDA_APP_MC_GET || app == LYNX_CUDA_APP_FACE_VERIFY;
}

/* One threadblock's counters, written by the block's thread 0 only. */
struct lynx_cuda_block_stats {
  uint64_t requests, responses, drops, bad;
};

/* Control block in device memory, zeroed by the host before launch (but
 * for serve_until_gt). The host writes `stop` and `serve_until_gt` and
 * reads the rest with copies on its own stream while the kernel runs. */
struct lynx_cuda_kctl {
  uint32_t stop;    /* host writes 1: every block returns */
  uint32_t started; /* blocks that began serving (atomicAdd) */
  uint32_t exited;  /* blocks that returned (atomicAdd) */
  uint32_t reserved;
  /* Lease fence: no block takes a new request once %globaltimer reaches
   * it (0: no fence). The agent moves it forward as its lease is renewed
   * and launches with 1 (fenced) until it has converted its own deadline. */
  uint64_t serve_until_gt;
  /* %globaltimer as block 0 last read it (at start and every pass): what
   * the agent converts host times to the GPU's clock with. */
  uint64_t now_gt;
  struct lynx_cuda_block_stats blocks[]; /* one per block */
  /* then, at lynx_cuda_kctl_lat_off: struct lynx_lat per block, the
   * block's queueing and service times (lathist.h), %globaltimer
   * nanoseconds, written by the block's thread 0 as it goes */
};

struct lynx_cuda_launch {
  void *region;                         /* device pointer, formatted */
  uint32_t n_mqueues, slots, slot_size; /* its geometry (as formatted) */
  uint32_t large_bytes;                 /* each ring's large area */
  uint32_t n_server; /* server mqueues served: [0, n_server) */
  uint32_t app;      /* enum lynx_cuda_app */
  uint32_t work_us;  /* emulated work per request (%globaltimer) */
  uint32_t blocks;   /* block b serves mqueues q with q % blocks == b, at
                        most LYNX_CUDA_MQS_PER_BLOCK */
  uint32_t threads;  /* threads per block (multiple of 32, <= 1024) */
  uint32_t idle_ns;  /* adaptive polling: longest __nanosleep when idle */
  struct lynx_cuda_kctl *kctl; /* device pointer, lynx_cuda_kctl_size */
  /* Host memory (a device pointer to it) of one struct lynx_actrl per
   * mqueue, which every block also writes its mqueues' indices to, or
   * NULL: the tcp agent reads a region in GPU memory's indices there
   * without a copy (include/lynx/mqueue.h lynx_mq_mirror; docs/gpu.md). */
  void *actrl_mirror;
  /* 1: every reader of the region is a CPU thread with acquire loads (host
   * memory over shm or tcp), so a publish needs only the I/O thread's
   * release; 0: a NIC or copy engine may read it (GPU memory, rdma), and
   * every writer fences first (lynx_dev.cuh lynx_block_commit) */
  uint32_t thread_readers;
  /* Client mqueues, for an app that calls a back end (lynx_cuda_app_calls;
   * docs/client-mqueues.md, "On a GPU"): every block has its own for each
   * of the service's n_backends back ends, block b's of back end k being
   * mqueue lynx_cuda_client_mq(l, b, k) = client_base + b * n_backends + k,
   * so the region holds client_base + blocks * n_backends mqueues and no
   * two blocks ever share a ring. n_backends 0: the app calls none. */
  uint32_t n_backends;
  uint32_t client_base;     /* the first client mqueue: n_server */
  uint32_t app_backend;     /* k of the back end the app calls ("db") */
  uint64_t call_timeout_ns; /* how long a call waits for its reply
                               (%globaltimer), LYNX_CALL_TIMEOUT_NS */
  /* lenet: its LENET_PARAMS float parameters in GPU memory (lenet.h's
   * layout), copied there by the agent before the launch; NULL otherwise */
  const float *lenet_params;
};

/* Block b's client mqueue of back end k. */
LYNX_HD uint32_t lynx_cuda_client_mq(const struct lynx_cuda_launch *l,
                                     uint32_t b, uint32_t k) {
  return l->client_base + b * l->n_backends + k;
}

/* Where a control block's latency histograms start, and its bytes, for
 * that many blocks. */
LYNX_HD size_t lynx_cuda_kctl_lat_off(uint32_t blocks) {
  return sizeof(struct lynx_cuda_kctl) +
         (size_t)blocks * sizeof(struct lynx_cuda_block_stats);
}
LYNX_HD size_t lynx_cuda_kctl_size(uint32_t blocks) {
  return lynx_cuda_kctl_lat_off(blocks) +
         (size_t)blocks * sizeof(struct lynx_lat);
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

/* Launches the persistent kernel on stream (a cudaStream_t) of the
 * current device. 0, or a cudaError_t value with its text in err; -22
 * (EINVAL) for a launch description that is out of bounds, e.g. more than
 * 64 server mqueues per block (ceil(n_server / blocks)), with the reason in
 * err. Blocks beyond n_server serve nothing and only idle. An app that
 * calls a back end needs n_backends >= 1, app_backend < n_backends,
 * client_base == n_server and n_mqueues == client_base + blocks *
 * n_backends (-22 otherwise). */
int lynx_cuda_start(const struct lynx_cuda_launch *l, void *stream, char *err,
                    size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
