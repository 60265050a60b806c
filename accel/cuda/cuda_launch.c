/*
 * cuda_launch.c - an instance's start and stop (gpu_instance_start,
 * gpu_instance_stop, gpu.h): its region set up (cuda_region.c), its
 * control block, the app's data (lenet's weights), the persistent kernel
 * launched on the instance's kernel stream, every block of it confirmed
 * resident (or the start fails, saying how many were) and, under a lease,
 * fenced until its clock is known; stop asks the kernel to return and
 * waits a bounded time, after which a kernel still running is hung.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "cuda_internal.h"
#include "gpu.h"
#include "lenet_model.h"
#include "log.h"
#include "lynx_cuda.h"
#include "mqueue.h"
#include "util.h"

#ifndef STOP_WAIT_MS /* unit_cuda_backend waits less */
#define STOP_WAIT_MS 3000u
#endif
#define CLOCK_WAIT_MS 2000u /* how long start waits for the kernel's clock */
#ifndef RESIDENT_WAIT_MS    /* unit_cuda_backend waits less */
/* how long start waits for every block of its kernel to begin: blocks
 * start within microseconds of a launch when SMs are free; one that waits
 * longer waits for SMs other kernels hold, and never serves */
#define RESIDENT_WAIT_MS 1000u
#endif

/* Every block of gi's kernel began (kctl->started, which each block
 * increments first), within RESIDENT_WAIT_MS of the launch: 0. Else
 * -EBUSY with the reason in err: the blocks that wait are those the
 * occupancy query promised but the GPU cannot hold beside the kernels it
 * runs (other instances, another process, a smaller shared-memory
 * carveout), and their mqueues would never be served. */
static int confirm_resident(struct gpu_instance *gi, const char *name,
                            char *err, size_t errlen) {
  uint64_t end = lynx_now_ns() + RESIDENT_WAIT_MS * 1000000ull;
  struct lynx_cuda_kctl h;
  cudaError_t e;
  for (;;) {
    pthread_mutex_lock(&gi->lock);
    e = lynx__cuda_kctl_header(gi, &h);
    pthread_mutex_unlock(&gi->lock);
    if (e != cudaSuccess) {
      lynx__cuda_note(gi->device, e, "control block");
      snprintf(err, errlen, "GPU %d: control block: %s", gi->device,
               cudaGetErrorString(e));
      return lynx__cuda_errno(e);
    }
    if (h.started >= gi->blocks)
      return 0;
    if (lynx_now_ns() >= end)
      break;
    usleep(200);
  }
  snprintf(err, errlen,
           "GPU %d: only %u of the %u blocks of %s's persistent kernel "
           "became resident within %u ms: the others wait for SMs that "
           "kernels already running there hold, and their mqueues would "
           "never be served (fewer instances or --gpu-blocks on this GPU)",
           gi->device, h.started, gi->blocks, name, RESIDENT_WAIT_MS);
  return -EBUSY;
}

/* A kernel whose start failed after its launch: asked to stop. Blocks
 * that never became resident start when SMs free up, see the stop and
 * return, so the kernel ends only then: until it has, its memory is kept
 * (gi->hung: never freed, never reused) without calling the device hung,
 * which it is not. */
/* The kernels of failed starts whose blocks still waited: their memory
 * stays (reachable, until the agent exits), as a hung kernel's does. */
static struct gpu_instance *kept;
static pthread_mutex_t kept_lock = PTHREAD_MUTEX_INITIALIZER;

/* Writes 1 to the kernel's stop word (on the copy stream) and waits up to
 * wait_ms for its stream to finish: cudaErrorNotReady when it has not, else
 * the stream's last status. */
static cudaError_t stop_and_wait(struct gpu_instance *gi, unsigned wait_ms) {
  const uint32_t one = 1;
  uint64_t end;
  cudaError_t e;
  pthread_mutex_lock(&gi->lock);
  e = cudaMemcpyAsync(&gi->kctl->stop, &one, sizeof(one),
                      cudaMemcpyHostToDevice, gi->copy);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(gi->copy);
  pthread_mutex_unlock(&gi->lock);
  if (e != cudaSuccess)
    lynx__cuda_note(gi->device, e, "stop request");
  end = lynx_now_ns() + wait_ms * 1000000ull;
  while ((e = cudaStreamQuery(gi->kern)) == cudaErrorNotReady &&
         lynx_now_ns() < end)
    usleep(1000);
  return e;
}

static void abandon_launch(struct gpu_instance *gi) {
  cudaError_t e = stop_and_wait(gi, 100);
  gi->stopped = 1;
  if (e == cudaErrorNotReady) {
    gi->hung = 1;
    pthread_mutex_lock(&kept_lock);
    gi->kept_next = kept;
    kept = gi;
    pthread_mutex_unlock(&kept_lock);
    LYNX_WARN("cuda",
              "GPU %d: the kernel of a start that failed still has "
              "blocks waiting for SMs: its memory is kept until the agent "
              "exits",
              gi->device);
  }
}

/* lenet: its weights (the agent's, loaded once: lenet_model.h) into GPU
 * memory, copied and waited for before the launch, since the kernel runs
 * on another stream. 0 or -errno with the reason in err. */
static int upload_lenet(struct gpu_instance *gi, const void *app_state,
                        char *err, size_t errlen) {
  const struct lenet_model *m = app_state;
  void *p = NULL;
  cudaError_t e;
  if (!m) {
    snprintf(err, errlen, "lenet: no weights loaded");
    return -ENOENT;
  }
  e = lynx__cuda_dev_alloc(gi->device, sizeof(m->params), gi->copy, &p,
                           &gi->params_size);
  gi->params = p;
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(gi->params, m->params, sizeof(m->params),
                        cudaMemcpyHostToDevice, gi->copy);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(gi->copy);
  if (e != cudaSuccess) {
    lynx__cuda_note(gi->device, e, "lenet weights");
    snprintf(err, errlen, "GPU %d: lenet weights: %s", gi->device,
             lynx__cuda_strerror(e));
    return lynx__cuda_errno(e);
  }
  return 0;
}

/* The service's app configuration: its own, else the app's default, else
 * "{}". */
static const char *config_of(const struct lynx_accel_launch *l) {
  return l->app_config && l->app_config[0] ? l->app_config
         : l->app->default_config          ? l->app->default_config
                                           : "{}";
}

/* The configuration c (len bytes and its NUL) into GPU memory, after the
 * control block (gi->config), for the kernel's launch (lynx_gpu.h config).
 * 0 or -errno with the reason in err. */
static int upload_config(struct gpu_instance *gi, const char *c, size_t len,
                         char *err, size_t errlen) {
  cudaError_t e =
      cudaMemcpyAsync(gi->config, c, len + 1, cudaMemcpyHostToDevice, gi->copy);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(gi->copy);
  if (e != cudaSuccess) {
    lynx__cuda_note(gi->device, e, "app configuration");
    snprintf(err, errlen, "GPU %d: app configuration: %s", gi->device,
             lynx__cuda_strerror(e));
    return lynx__cuda_errno(e);
  }
  return 0;
}

int lynx__cuda_resident(const struct lynx_accel_launch *l, uint32_t *resident,
                        char *err, size_t errlen) {
  int d = l->acc->device;
  if (l->app->module)
    return lynx__cuda_module_resident(l->app->module, d, l->gpu_threads,
                                      resident, err, errlen);
  return lynx_cuda_resident_blocks(d, l->gpu_threads, resident, err, errlen)
             ? -EIO
             : 0;
}

int gpu_instance_start(const struct lynx_accel_launch *l, struct lynx_region *r,
                       struct gpu_instance **out, char *err, size_t errlen) {
  /* the caller's host region where the GPU does not own the memory */
  uint8_t *host = l->acc->own_memory ? NULL : l->region;
  /* the lease fence as of now (later moves: gpu_instance_fence) */
  uint64_t serve_until = l->serve_until
                             ? __atomic_load_n(l->serve_until, __ATOMIC_ACQUIRE)
                             : UINT64_MAX;
  /* the service's app configuration, for the kernel (upload_config) */
  const char *config = config_of(l);
  size_t config_len = strlen(config);
  struct gpu_instance *gi;
  struct lynx_geom g;
  struct lynx_cuda_launch kl;
  uint32_t resident = 0, app_backend = 0, held, free_blocks;
  cudaError_t e;
  int rc;
  *out = NULL;
  if (lynx_geom_init(&g, l->n_mqueues, l->slots, l->slot_size,
                     l->large_bytes) ||
      !l->n_server || l->n_server > l->n_mqueues) {
    snprintf(err, errlen, "invalid geometry");
    return -EINVAL;
  }
  gi = calloc(1, sizeof(*gi));
  if (!gi)
    return -ENOMEM;
  gi->device = l->acc->device;
  gi->numa_node = l->acc->numa_node;
  gi->writes_ordering = l->acc->rdma_writes_ordering;
  gi->dmabuf_fd = -1;
  gi->refs = 1; /* the agent's; the transport takes its own below */
  pthread_mutex_init(&gi->lock, NULL);
  e = cudaSetDevice(gi->device);
  if (e != cudaSuccess) {
    lynx__cuda_note(gi->device, e, "cudaSetDevice");
    snprintf(err, errlen, "GPU %d: %s", gi->device, cudaGetErrorString(e));
    gpu_instance_put(gi);
    return lynx__cuda_errno(e);
  }
  if (host) {
    rc = lynx__cuda_map_host(gi, host, g.region_size, err, errlen);
    if (rc) {
      gpu_instance_put(gi);
      return rc;
    }
    goto launch;
  }
  rc = lynx__cuda_region_alloc(gi, g.region_size, err, errlen);
  /* staging where the transport copies every request (tcp; rdma's NIC
   * reaches the memory itself) and gdrcopy does not map it */
  if (!rc && !gi->gva && l->tops != &lynx_transport_rdma)
    rc = lynx__cuda_stage_init(gi, err, errlen);
  if (rc) {
    gpu_instance_put(gi);
    return rc;
  }
  lynx__cuda_region_mem(gi);
  gi->refs++;
  rc = l->tops->region_attach(l->tagent, r, l->name, g.region_size, &gi->mem);
  if (rc) {
    snprintf(err, errlen, "the %s transport cannot reach GPU memory%s",
             l->tops->name, rc == -ENOTSUP ? " (use tcp or rdma)" : "");
    gpu_instance_put(gi); /* the transport released its reference */
    return rc;
  }
  rc = lynx_region_format(r, l->n_mqueues, l->slots, l->slot_size,
                          l->large_bytes, l->ordering, l->epoch, l->accel_id);
  if (rc) {
    snprintf(err, errlen, "cannot format the region in GPU memory: %s",
             strerror(-rc));
    goto fail;
  }
  rc = l->tops->region_export(r);
  if (rc) {
    snprintf(err, errlen,
             "cannot export the region in GPU memory over %s: "
             "%s",
             l->tops->name, strerror(-rc));
    goto fail;
  }
launch:
  rc = lynx__cuda_resident(l, &resident, err, errlen);
  if (rc)
    goto fail;
  /* the query speaks of an empty GPU: this agent's running kernels hold
   * part of it (the budget, lynx__cuda_blocks_held) */
  held = lynx__cuda_blocks_held(gi->device);
  free_blocks = resident > held ? resident - held : 0;
  if (lynx__cuda_calls_backends(l))
    rc = lynx__cuda_client_blocks(l, free_blocks, &gi->blocks, &app_backend,
                                  err, errlen);
  else
    rc = lynx__cuda_pick_blocks(gi->device, l, free_blocks, &gi->blocks, err,
                                errlen);
  if (rc && held) {
    size_t n = strlen(err);
    snprintf(err + n, errlen > n ? errlen - n : 0,
             " (%u of GPU %d's %u resident blocks are held by the "
             "instances running there)",
             held, gi->device, resident);
  }
  if (rc)
    goto fail;
  {
    /* the control block, then the app configuration (8-byte aligned) */
    size_t off = (lynx_cuda_kctl_size(gi->blocks) + 7u) & ~(size_t)7u;
    void *k = NULL;
    e = lynx__cuda_dev_alloc(gi->device, off + config_len + 1, gi->copy, &k,
                             &gi->kctl_size);
    gi->kctl = k;
    gi->config = k ? (char *)k + off : NULL;
  }
  /* under a lease the kernel starts fenced: the deadline can only be put
   * in its clock once it has published a reading */
  if (e == cudaSuccess && serve_until != UINT64_MAX) {
    pthread_mutex_lock(&gi->lock);
    e = lynx__cuda_fence_write(gi, 1);
    pthread_mutex_unlock(&gi->lock);
  }
  if (e != cudaSuccess) {
    lynx__cuda_note(gi->device, e, "control block");
    snprintf(err, errlen, "GPU %d: control block: %s", gi->device,
             lynx__cuda_strerror(e));
    rc = lynx__cuda_errno(e);
    goto fail;
  }
  if (l->app->cuda_app == LYNX_CUDA_APP_LENET) {
    rc = upload_lenet(gi, l->app_state, err, errlen);
    if (rc)
      goto fail;
  }
  rc = upload_config(gi, config, config_len, err, errlen);
  if (rc)
    goto fail;
  kl = (struct lynx_cuda_launch){
      .app_data = gi->params,
      .config = gi->config,
      .config_len = (uint32_t)config_len,
      .region = gi->base,
      .n_mqueues = l->n_mqueues,
      .slots = l->slots,
      .slot_size = l->slot_size,
      .large_bytes = l->large_bytes,
      .n_server = l->n_server,
      .app = l->app->cuda_app,
      .work_us = l->work_us,
      .blocks = gi->blocks,
      .threads = l->gpu_threads,
      .idle_ns = l->gpu_idle_ns,
      .kctl = gi->kctl,
      /* staged (tcp, GPU memory): the kernel keeps the control array's
       * copy the tcp server reads without a copy */
      .actrl_mirror = gi->stg.buf ? gi->stg.mirror_dev : NULL,
      /* host memory read by CPU threads only (shm, tcp): no writer fence */
      .thread_readers = host && l->tops != &lynx_transport_rdma,
  };
  if (lynx__cuda_calls_backends(l)) {
    kl.calls = 1;
    kl.n_backends = l->n_backends;
    kl.client_base = l->n_server;
    kl.app_backend = app_backend;
    kl.call_timeout_ns = LYNX_CALL_TIMEOUT_NS;
  }
  rc = l->app->module ? lynx__cuda_module_launch(l->app->module, gi->device,
                                                 &kl, gi->kern, err, errlen)
                      : lynx_cuda_start(&kl, gi->kern, err, errlen);
  if (rc) {
    if (rc > 0)
      lynx__cuda_note(gi->device, (cudaError_t)rc, "kernel launch");
    rc = rc > 0 ? lynx__cuda_errno((cudaError_t)rc) : rc;
    goto fail;
  }
  gi->launched = 1;
  rc = confirm_resident(gi, l->name, err, errlen);
  if (rc) {
    LYNX_ERR("cuda", "%s", err);
    abandon_launch(gi);
    goto fail;
  }
  lynx__cuda_blocks_hold(gi->device, gi->blocks, 1);
  gi->holds_blocks = 1;
  if (serve_until != UINT64_MAX) {
    struct lynx_cuda_kctl h;
    uint64_t end = lynx_now_ns() + CLOCK_WAIT_MS * 1000000ull;
    pthread_mutex_lock(&gi->lock);
    while ((e = lynx__cuda_kctl_header(gi, &h)) == cudaSuccess &&
           !gi->calibrated && lynx_now_ns() < end) {
      pthread_mutex_unlock(&gi->lock);
      usleep(1000);
      pthread_mutex_lock(&gi->lock);
    }
    pthread_mutex_unlock(&gi->lock);
    if (e != cudaSuccess)
      lynx__cuda_note(gi->device, e, "control block");
    if (gi->calibrated)
      gpu_instance_fence(gi, serve_until);
    else
      LYNX_WARN("cuda",
                "GPU %d: the persistent kernel of %s published no "
                "clock within %u ms: it takes no request until it does "
                "(checked at every heartbeat)",
                gi->device, l->name, CLOCK_WAIT_MS);
  }
  if (kl.n_backends)
    LYNX_INFO("cuda",
              "GPU %d: persistent kernel of %s: %u blocks x %u "
              "threads over %u mqueues, each block with its own client "
              "mqueue to each of %u back ends (mqueues %u..%u)",
              gi->device, l->name, gi->blocks, l->gpu_threads, l->n_server,
              kl.n_backends, kl.client_base, l->n_mqueues - 1);
  else
    LYNX_INFO("cuda",
              "GPU %d: persistent kernel of %s: %u blocks x %u "
              "threads over %u mqueues",
              gi->device, l->name, gi->blocks, l->gpu_threads, l->n_server);
  *out = gi;
  return 0;
fail:
  if (!host)
    l->tops->region_free(r); /* releases the transport's reference */
  gpu_instance_put(gi);      /* unmaps a host region */
  return rc;
}

int gpu_instance_stop(struct gpu_instance *gi) {
  cudaError_t e;
  if (!gi->launched || gi->stopped)
    return gi->hung ? -ETIMEDOUT : 0;
  cudaSetDevice(gi->device);
  gi->stopping = 1; /* from here on, an exited kernel is expected */
  e = stop_and_wait(gi, STOP_WAIT_MS);
  if (e == cudaErrorNotReady) {
    gi->stopped = 1;
    gi->hung = 1; /* its counters are still read live */
    lynx__cuda_set_hung(gi->device, STOP_WAIT_MS);
    LYNX_ERR("cuda",
             "GPU %d: the persistent kernel did not stop within %u "
             "ms (hung)",
             gi->device, STOP_WAIT_MS);
    return -ETIMEDOUT;
  }
  if (e != cudaSuccess)
    lynx__cuda_note(gi->device, e, "persistent kernel");
  if (gi->holds_blocks) { /* its SMs are free again */
    lynx__cuda_blocks_hold(gi->device, gi->blocks, 0);
    gi->holds_blocks = 0;
  }
  /* the counters the blocks published as they returned, kept from here */
  gpu_instance_counters(gi, &gi->stats[0], &gi->stats[1], &gi->stats[2],
                        &gi->stats[3]);
  gpu_instance_latency(gi, &gi->lat);
  gi->stopped = 1;
  lynx__cuda_host_unmap(gi); /* before its owner frees it */
  return 0;
}
