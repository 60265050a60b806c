/*
 * cuda_pool.c - the CUDA backend's memory: device memory and pinned host
 * buffers, reused and never freed while the agent runs (gpu_shutdown,
 * gpu.h, frees them at exit).
 *
 * Never cudaFree while the agent runs: cudaFree synchronises the whole
 * device, which never completes while another instance's persistent kernel
 * runs on it (and cudaDeviceSynchronize likewise). Memory an instance gives
 * back goes to a per-device free list and is reused (first fit);
 * gpu_shutdown frees it once every kernel is gone. Zeroing is a
 * cudaMemsetAsync on the instance's own non-blocking stream.
 */
#include <pthread.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "cuda_internal.h"
#include "gpu.h"
#include "log.h"

struct dev_chunk {
  int device;
  void *p;
  size_t size;
  struct dev_chunk *next;
};

static struct {
  pthread_mutex_t lock;
  struct dev_chunk *free;
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* size bytes of device memory on the current device, zeroed on stream s
 * (synchronised before return); *got is the chunk's real size. */
cudaError_t lynx__cuda_dev_alloc(int device, size_t size, cudaStream_t s,
                                 void **p, size_t *got) {
  struct dev_chunk **pp, *c = NULL;
  cudaError_t e = cudaSuccess;
  pthread_mutex_lock(&pool.lock);
  for (pp = &pool.free; *pp; pp = &(*pp)->next)
    if ((*pp)->device == device && (*pp)->size >= size &&
        (*pp)->size <= 2 * size) {
      c = *pp;
      *pp = c->next;
      break;
    }
  pthread_mutex_unlock(&pool.lock);
  if (c) {
    *p = c->p;
    *got = c->size;
    free(c);
  } else {
    e = lynx__cuda_call_malloc(device, size, p, lynx__cuda_dev_free);
    *got = size;
  }
  if (e == cudaSuccess)
    e = cudaMemsetAsync(*p, 0, *got, s);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(s);
  return e;
}

void lynx__cuda_dev_free(int device, void *p, size_t size) {
  struct dev_chunk *c;
  if (!p)
    return;
  c = malloc(sizeof(*c));
  if (!c) { /* keep it out of use rather than synchronise the device */
    LYNX_WARN("cuda", "GPU %d: out of memory: %zu device bytes leak", device,
              size);
    return;
  }
  c->device = device;
  c->p = p;
  c->size = size;
  pthread_mutex_lock(&pool.lock);
  c->next = pool.free;
  pool.free = c;
  pthread_mutex_unlock(&pool.lock);
}

/* Pinned host buffers of STAGE_BYTES + STAGE_MIRROR_BYTES (staging and the
 * control array's copy, which the kernel writes: mapped; cuda_stage.c),
 * one list for all
 * devices, each reused by instances of the device it was allocated on.
 * Never freed while the agent runs, for the same reason as device memory:
 * cudaFreeHost may wait for the device, which a persistent kernel keeps
 * busy. */
struct pinned_buf {
  int device;
  void *p;
  struct pinned_buf *next;
};

static struct {
  pthread_mutex_t lock;
  struct pinned_buf *free;
} pinned = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void pinned_back(int device, void *p, size_t size) {
  (void)size;
  lynx__cuda_pinned_free(device, p);
}

/* size bytes of pinned host memory for device (the current one). */
cudaError_t lynx__cuda_pinned_alloc(int device, size_t size, void **p) {
  struct pinned_buf **pp, *b = NULL;
  pthread_mutex_lock(&pinned.lock);
  for (pp = &pinned.free; *pp; pp = &(*pp)->next)
    if ((*pp)->device == device) {
      b = *pp;
      *pp = b->next;
      break;
    }
  pthread_mutex_unlock(&pinned.lock);
  if (b) {
    *p = b->p;
    free(b);
    return cudaSuccess;
  }
  return lynx__cuda_call_host_alloc(device, size, p, pinned_back);
}

void lynx__cuda_pinned_free(int device, void *p) {
  struct pinned_buf *b;
  if (!p)
    return;
  b = malloc(sizeof(*b));
  if (!b) {
    LYNX_WARN("cuda",
              "GPU %d: out of memory: a pinned staging buffer "
              "leaks",
              device);
    return;
  }
  b->device = device;
  b->p = p;
  pthread_mutex_lock(&pinned.lock);
  b->next = pinned.free;
  pinned.free = b;
  pthread_mutex_unlock(&pinned.lock);
}

void gpu_shutdown(void) {
  /* unregistrations first (a hung kernel's device may hold them: then the
   * process takes them with it) */
  int left = lynx__cuda_calls_drain(5000);
  if (left)
    LYNX_WARN("cuda",
              "%d CUDA calls still wait for the device at exit (a kernel "
              "did not stop)",
              left);
  pthread_mutex_lock(&pinned.lock);
  while (pinned.free) {
    struct pinned_buf *b = pinned.free;
    int hung;
    pinned.free = b->next;
    hung = lynx__cuda_hung(b->device);
    /* as for device memory below: the process takes it with it */
    if (!hung) {
      cudaSetDevice(b->device);
      cudaFreeHost(b->p);
    }
    free(b);
  }
  pthread_mutex_unlock(&pinned.lock);
  pthread_mutex_lock(&pool.lock);
  while (pool.free) {
    struct dev_chunk *c = pool.free;
    int hung;
    pool.free = c->next;
    hung = lynx__cuda_hung(c->device);
    /* a kernel that did not stop still runs there: cudaFree would wait for
     * it forever; the memory goes with the process */
    if (!hung) {
      cudaSetDevice(c->device);
      cudaFree(c->p);
    }
    free(c);
  }
  pthread_mutex_unlock(&pool.lock);
}
