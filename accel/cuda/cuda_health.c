/*
 * cuda_health.c - the CUDA backend's per-device error record (gpu_health,
 * gpu.h): what the heartbeat says of each GPU.
 *
 * Every CUDA call that fails anywhere in the backend is recorded here
 * (lynx__cuda_note): the last error per device, whether it is sticky (the
 * context is unusable: the device needs a reset) and whether the device is
 * gone. A kernel that did not stop marks its device hung: its memory is
 * then never freed (cuda_pool.c), since cudaFree would wait for it.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>

#include <cuda_runtime_api.h>

#include "cuda_internal.h"
#include "gpu.h"
#include "log.h"

static struct {
  pthread_mutex_t lock;
  struct {
    char last_error[128];
    int failed, lost;
    int hung; /* a kernel did not stop: cudaFree would wait for it */
    uint32_t blocks_held; /* blocks of this agent's running kernels */
  } dev[GPU_MAX];
} rec = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Errors after which the CUDA context cannot be used again. */
static int sticky(cudaError_t e) {
  switch (e) {
  case cudaErrorIllegalAddress:
  case cudaErrorLaunchTimeout:
  case cudaErrorHardwareStackError:
  case cudaErrorIllegalInstruction:
  case cudaErrorMisalignedAddress:
  case cudaErrorInvalidAddressSpace:
  case cudaErrorInvalidPc:
  case cudaErrorLaunchFailure:
  case cudaErrorAssert:
  case cudaErrorECCUncorrectable:
    return 1;
  default:
    return 0;
  }
}

/* Errors that mean the device is gone from under the agent. */
static int gone(cudaError_t e) {
  return e == cudaErrorNoDevice || e == cudaErrorDevicesUnavailable ||
         e == cudaErrorSystemNotReady || e == cudaErrorInsufficientDriver;
}

void lynx__cuda_note(int dev, cudaError_t e, const char *what) {
  /* cudaErrorNotReady: a call that did not return in time (cuda_calls.c),
   * no fault of the device */
  if (dev < 0 || dev >= GPU_MAX || e == cudaSuccess || e == cudaErrorNotReady)
    return;
  pthread_mutex_lock(&rec.lock);
  snprintf(rec.dev[dev].last_error, sizeof(rec.dev[dev].last_error),
           "%s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
  rec.dev[dev].failed |= sticky(e);
  rec.dev[dev].lost |= gone(e);
  pthread_mutex_unlock(&rec.lock);
  LYNX_LOG_RL(LYNX_LOG_WARN, "cuda", "GPU %d: %s: %s (%s)", dev, what,
              cudaGetErrorName(e), cudaGetErrorString(e));
}

int lynx__cuda_errno(cudaError_t e) {
  return e == cudaErrorMemoryAllocation ? -ENOMEM
         : e == cudaErrorNotReady       ? -EBUSY
         : gone(e)                      ? -ENODEV
                                        : -EIO;
}

const char *lynx__cuda_strerror(cudaError_t e) {
  static __thread char buf[200];
  if (e != cudaErrorNotReady)
    return cudaGetErrorString(e);
  snprintf(buf, sizeof(buf),
           "the CUDA call did not return within %u ms: this driver makes it "
           "wait for the device, which running persistent kernels keep busy "
           "(docs/gpu.md)",
           CALL_WAIT_MS);
  return buf;
}

void lynx__cuda_set_hung(int dev, unsigned wait_ms) {
  pthread_mutex_lock(&rec.lock);
  rec.dev[dev].hung = 1;
  rec.dev[dev].failed = 1; /* only a context reset clears it */
  snprintf(rec.dev[dev].last_error, sizeof(rec.dev[dev].last_error),
           "a persistent kernel did not stop within %u ms", wait_ms);
  pthread_mutex_unlock(&rec.lock);
}

uint32_t lynx__cuda_blocks_held(int dev) {
  uint32_t n = 0;
  pthread_mutex_lock(&rec.lock);
  if (dev >= 0 && dev < GPU_MAX)
    n = rec.dev[dev].blocks_held;
  pthread_mutex_unlock(&rec.lock);
  return n;
}

void lynx__cuda_blocks_hold(int dev, uint32_t n, int take) {
  pthread_mutex_lock(&rec.lock);
  if (dev >= 0 && dev < GPU_MAX) {
    if (take)
      rec.dev[dev].blocks_held += n;
    else
      rec.dev[dev].blocks_held -=
          n < rec.dev[dev].blocks_held ? n : rec.dev[dev].blocks_held;
  }
  pthread_mutex_unlock(&rec.lock);
}

int lynx__cuda_hung(int dev) {
  int hung;
  pthread_mutex_lock(&rec.lock);
  hung = dev >= 0 && dev < GPU_MAX && rec.dev[dev].hung;
  pthread_mutex_unlock(&rec.lock);
  return hung;
}

void gpu_health(const struct gpu_info *g, int *lost, int *failed, char *err,
                size_t errlen) {
  int v = 0, dev = g->device;
  cudaError_t e = cudaSetDevice(dev);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&v, cudaDevAttrPciBusId, dev);
  if (e != cudaSuccess)
    lynx__cuda_note(dev, e, "device query");
  pthread_mutex_lock(&rec.lock);
  *lost = dev < GPU_MAX ? rec.dev[dev].lost || gone(e) : 1;
  *failed = dev < GPU_MAX ? rec.dev[dev].failed : 0;
  snprintf(err, errlen, "%s", dev < GPU_MAX ? rec.dev[dev].last_error : "");
  pthread_mutex_unlock(&rec.lock);
}
