/*
 * lynx_gpu.h - the layout a GPU application's persistent kernel and the
 * agent share (docs/writing-apps.md, "GPU applications"): what the kernel
 * is launched with (struct lynx_cuda_launch, its only parameter), the
 * control block it reports through and takes its stop word and lease
 * fence from (struct lynx_cuda_kctl), and what a CUDA module built with
 * lynx_kernel.cuh's LYNX_GPU_APP exports for the agent to find and check.
 * Plain C, for the agent's host code and for device code alike.
 *
 * Versioning: LYNX_GPU_ABI_VERSION changes when a structure here, the
 * region layout (mqueue.h: LYNX_LAYOUT_VERSION) or what the kernel must do
 * changes incompatibly. A module carries the version and the sizes it was
 * built with (struct lynx_gpu_app_info), and an agent launches only a
 * module of its own version whose sizes match its own.
 */
#ifndef LYNX_GPU_H
#define LYNX_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "lathist.h"
#include "mqueue.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LYNX_GPU_ABI_VERSION 1u

/* What a module exports (LYNX_GPU_APP): its description, and the kernel in
 * two forms that differ only in the registers ptxas may give a thread
 * (lynx_kernel.cuh says why): blocks of up to LYNX_GPU_NARROW_MAX threads
 * run the first, wider ones the second. */
#define LYNX_GPU_INFO_NAME "lynx_gpu_app_info"
#define LYNX_GPU_KERNEL_NAME "lynx_gpu_kernel"
#define LYNX_GPU_KERNEL_WIDE_NAME "lynx_gpu_kernel_wide"
#define LYNX_GPU_NARROW_MAX 512u
#define LYNX_GPU_THREADS_MAX 1024u

/* Server mqueues one block can serve (their state lives in the block's
 * shared memory): launch at least ceil(n_server / this) blocks. */
#define LYNX_CUDA_MQS_PER_BLOCK LYNX_GPU_MQS_PER_BLOCK

/* A module's description, a __device__ variable the agent reads (by name,
 * LYNX_GPU_INFO_NAME) before it launches anything of the module. The
 * first two fields are the same in every version. */
struct lynx_gpu_app_info {
  uint32_t abi_version; /* LYNX_GPU_ABI_VERSION it was built with */
  uint32_t size;        /* sizeof(struct lynx_gpu_app_info) there */
  uint32_t launch_size; /* sizeof(struct lynx_cuda_launch) there */
  uint32_t kctl_size;   /* sizeof(struct lynx_cuda_kctl) there */
  uint32_t mq_size;     /* sizeof(struct lynx_mq) there */
  uint32_t reserved;
  char name[32];          /* the application's name (LYNX_APP_NAME_MAX) */
  char needs_backend[32]; /* the back end it calls, "" for none */
  char help[96];          /* one line for --list-apps */
};

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
  /* the built-in application the agent's own kernel runs (the agent's
   * enum lynx_cuda_app); 0 in a module's kernel, which runs its own */
  uint32_t app;
  uint32_t work_us; /* emulated work per request (%globaltimer) */
  uint32_t blocks;  /* block b serves mqueues q with q % blocks == b, at
                       most LYNX_CUDA_MQS_PER_BLOCK */
  uint32_t threads; /* threads per block (multiple of 32, <= 1024) */
  uint32_t idle_ns; /* adaptive polling: longest __nanosleep when idle */
  struct lynx_cuda_kctl *kctl; /* device pointer, lynx_cuda_kctl_size */
  /* Host memory (a device pointer to it) of one struct lynx_actrl per
   * mqueue, which every block also writes its mqueues' indices to, or
   * NULL: the tcp agent reads a region in GPU memory's indices there
   * without a copy (mqueue.h lynx_mq_mirror; docs/gpu.md). */
  void *actrl_mirror;
  /* 1: every reader of the region is a CPU thread with acquire loads (host
   * memory over shm or tcp), so a publish needs only the I/O thread's
   * release; 0: a NIC or copy engine may read it (GPU memory, rdma), and
   * every writer fences first (lynx_dev.cuh lynx_block_commit) */
  uint32_t thread_readers;
  /* Client mqueues, for an app that calls a back end (calls;
   * docs/client-mqueues.md, "On a GPU"): every block has its own for each
   * of the service's n_backends back ends, block b's of back end k being
   * mqueue lynx_cuda_client_mq(l, b, k) = client_base + b * n_backends + k,
   * so the region holds client_base + blocks * n_backends mqueues and no
   * two blocks ever share a ring. n_backends 0: the app calls none. */
  uint32_t n_backends;
  uint32_t client_base;     /* the first client mqueue: n_server */
  uint32_t app_backend;     /* k of the back end the app calls */
  uint64_t call_timeout_ns; /* how long a call waits for its reply
                               (%globaltimer), LYNX_CALL_TIMEOUT_NS */
  /* the application's data in GPU memory, copied there by the agent
   * before the launch (lenet: its weights, lenet.h's layout), or NULL */
  const void *app_data;
  /* 1: the app calls back end app_backend (each block binds its own
   * client mqueue of it); 0: it calls none */
  uint32_t calls;
  /* the service's app configuration, a JSON object's text of config_len
   * bytes and a NUL, in GPU memory (never NULL: "{}" when none) */
  uint32_t config_len;
  const char *config;
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

#ifdef __cplusplus
}
#endif

#endif
