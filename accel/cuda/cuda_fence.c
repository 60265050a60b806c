/*
 * cuda_fence.c - the lease fence of a persistent kernel: the host's
 * deadline (gpu_instance_fence, gpu.h) written into the kernel's control
 * block in the GPU's clock (%globaltimer), converted with an offset
 * measured from the clock readings the kernel publishes there.
 */
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "cuda_internal.h"
#include "gpu.h"
#include "log.h"
#include "lynx_cuda.h"
#include "util.h"

#define CLOCK_WINDOW_NS (10ull * 1000000000ull)
/* The drift the offset allows for since its sample, in parts per million
 * of the time since: crystal clocks stay within +-50 ppm of each other's
 * rate; 100 covers a GPU clock that runs slow against the host's. */
#define CLOCK_DRIFT_PPM 100u
/* What a deadline gives up for %globaltimer's step while that is not known
 * (about 1 us on the GPUs seen, docs/metrics.md) and at most: the kernel
 * compares a reading that may lag the true time by up to a step. */
#define CLOCK_STEP_DEFAULT_NS 1000u
#define CLOCK_STEP_MAX_NS 1000000u

static uint64_t gcd64(uint64_t a, uint64_t b) {
  while (b) {
    uint64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

uint64_t lynx__cuda_clock_step(const struct gpu_instance *gi) {
  return gi->gt_steps >= 3 ? gi->gt_step : 0;
}

/* %globaltimer's step from a new reading gt: the greatest common divisor
 * of every difference between readings (a coarse timer's readings are
 * whole steps apart; a fine one's divisor falls to a few ns). Said once,
 * when it is coarse enough to matter to the latency figures. */
static void step_sample(struct gpu_instance *gi, uint64_t gt) {
  uint64_t d;
  if (gi->gt_last && gt != gi->gt_last) {
    d = gt > gi->gt_last ? gt - gi->gt_last : gi->gt_last - gt;
    gi->gt_step = gi->gt_step ? gcd64(gi->gt_step, d) : d;
    if (++gi->gt_steps == 3 && gi->gt_step >= 128)
      LYNX_INFO("cuda",
                "GPU %d: %%globaltimer moves in steps of %llu ns: latency "
                "figures below a few steps count whole steps, and the lease "
                "fence gives up one step",
                gi->device, (unsigned long long)gi->gt_step);
  }
  gi->gt_last = gt;
}

/* A sample of the kernel's clock (gt, published by block 0) against the
 * host's (host_after, taken once the copy that brought gt returned). The
 * offset is a lower bound, so a converted deadline errs early; the largest
 * recent one is kept, a stale one replaced (clocks drift). */
void lynx__cuda_clock_sample(struct gpu_instance *gi, uint64_t gt,
                             uint64_t host_after) {
  int64_t off = (int64_t)(gt - host_after);
  if (!gt)
    return; /* nothing published yet */
  step_sample(gi, gt);
  if (!gi->calibrated || off > gi->gt_off ||
      host_after - gi->gt_off_at > CLOCK_WINDOW_NS) {
    gi->gt_off = off;
    gi->gt_off_at = host_after;
    gi->calibrated = 1;
  }
}

/* The offset to convert a host deadline with at host time now_ns: the
 * kept sample less the drift it allows for since (CLOCK_DRIFT_PPM) and one
 * step of the GPU's timer (a kernel reading taken just before the timer
 * moves lags the true time by up to that). The
 * sample is a lower bound of the offset when taken, but the largest one
 * of a 10 s window would overstate it later if the GPU's clock ran slow
 * against the host's, and a deadline converted with it would pass late:
 * the unsafe direction. Lock held. */
int64_t lynx__cuda_clock_offset(const struct gpu_instance *gi,
                                uint64_t now_ns) {
  uint64_t since = now_ns > gi->gt_off_at ? now_ns - gi->gt_off_at : 0;
  uint64_t step = lynx__cuda_clock_step(gi);
  /* and one step of the timer: the kernel's reading may lag by that much */
  if (!step)
    step = CLOCK_STEP_DEFAULT_NS;
  if (step > CLOCK_STEP_MAX_NS)
    step = CLOCK_STEP_MAX_NS;
  return gi->gt_off - (int64_t)(since / (1000000u / CLOCK_DRIFT_PPM)) -
         (int64_t)step;
}

/* Writes kctl->serve_until_gt (lock held). */
cudaError_t lynx__cuda_fence_write(struct gpu_instance *gi, uint64_t gt) {
  cudaError_t e;
  gi->fence_gt = gt;
  e = cudaMemcpyAsync(&gi->kctl->serve_until_gt, &gi->fence_gt,
                      sizeof(gi->fence_gt), cudaMemcpyHostToDevice, gi->copy);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(gi->copy);
  return e;
}

/* The control block's header: the kernel's clock sample (lock held). */
cudaError_t lynx__cuda_kctl_header(struct gpu_instance *gi,
                                   struct lynx_cuda_kctl *h) {
  cudaError_t e = cudaMemcpyAsync(h, gi->kctl, sizeof(*h),
                                  cudaMemcpyDeviceToHost, gi->copy);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(gi->copy);
  if (e == cudaSuccess)
    lynx__cuda_clock_sample(gi, h->now_gt, lynx_now_ns());
  return e;
}

int gpu_instance_fence(struct gpu_instance *gi, uint64_t serve_until_ns) {
  uint64_t gt;
  cudaError_t e;
  if (!gi->kctl || gi->stopped)
    return 0;
  cudaSetDevice(gi->device);
  pthread_mutex_lock(&gi->lock);
  if (serve_until_ns == UINT64_MAX) {
    gt = 0;
  } else if (!gi->calibrated) {
    gt = 1; /* no conversion yet: fenced */
  } else {
    int64_t v =
        (int64_t)serve_until_ns + lynx__cuda_clock_offset(gi, lynx_now_ns());
    gt = v < 1 ? 1 : (uint64_t)v;
  }
  e = gt == gi->fence_gt ? cudaSuccess : lynx__cuda_fence_write(gi, gt);
  pthread_mutex_unlock(&gi->lock);
  if (e != cudaSuccess) {
    lynx__cuda_note(gi->device, e, "lease fence");
    return lynx__cuda_errno(e);
  }
  return 0;
}
