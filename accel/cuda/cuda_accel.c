/*
 * cuda_accel.c - the CUDA backend (gpu.h, and the accelerator ops table
 * lynx_accel_cuda of accel.h at the end): GPUs as accelerators.
 *
 * Host C over the CUDA runtime, linked statically so the agent starts on a
 * host without the NVIDIA driver and says why it cannot use a GPU. Driver
 * API calls (dma-buf export, pointer attributes) go through
 * cudaGetDriverEntryPointByVersion: the agent never links libcuda.
 *
 * An instance: its region in cudaMalloc'd memory (aligned to the 64 KiB
 * GPU page GPUDirect RDMA and gdrcopy pin), a control block for the kernel,
 * two non-blocking streams (the kernel's, and one for every copy the
 * transport and the agent make), pinned staging for the tcp transport's
 * copies, and the persistent kernel. The transport reaches the region
 * through struct lynx_region_mem (cuda_region.c); the instance is
 * reference-counted between the agent's handle and the transport's memory,
 * so the memory goes only after the last data connection and never under a
 * kernel that did not stop.
 *
 * Errors from any call are recorded per device (gpu_health): the last one,
 * and whether it is sticky (the context is unusable: the device needs a
 * reset), for the heartbeat.
 *
 * Its files, one concern each (what they share: cuda_internal.h):
 *   cuda_health.c    the per-device error record (gpu_health)
 *   cuda_driver.c    driver entry points and gdrcopy, reached without
 *                    linking them
 *   cuda_calls.c     CUDA calls that may wait for the device, made on a
 *                    thread of their own, bounded at a start, queued at a
 *                    stop
 *   cuda_pool.c      device memory and pinned buffers, reused, never freed
 *                    under a running kernel (gpu_shutdown)
 *   cuda_discover.c  the GPUs --cuda-accels names (gpu_discover)
 *   cuda_blocks.c    how many blocks a persistent kernel runs
 *   cuda_region.c    an instance's region and its memory for the
 *                    transport, RDMA registration, the instance's references
 *   cuda_stage.c     the tcp transport's copies: pinned staging, gdrcopy
 *   cuda_launch.c    an instance's start and stop (the persistent kernel)
 *   cuda_module.c    GPU applications as CUDA modules: loaded, checked,
 *                    sized and launched through the driver API
 *   cuda_fence.c     the lease fence, in the kernel's clock
 *   cuda_counters.c  the kernel's counters and latency histograms
 *   cuda_accel.c     the ops table over them (this file)
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel.h"
#include "cuda_internal.h"
#include "gpu.h"
#include "lynx_cuda.h"
#include "util.h"

/* ---- the CUDA backend of the ops table (accel.h) ---------------------
 *
 * The agent's view of a GPU (struct lynx_accel_dev) over the functions
 * of gpu.h: discovery's gpu_info is kept in the info's fields and rebuilt
 * from them.
 */

static void info_gpu(const struct lynx_accel_dev *a, struct gpu_info *g) {
  memset(g, 0, sizeof(*g));
  g->device = a->device;
  snprintf(g->name, sizeof(g->name), "%s", a->model);
  snprintf(g->pci_bus_id, sizeof(g->pci_bus_id), "%s", a->pci_bus_id);
  g->numa_node = a->numa_node;
  g->memory = a->memory;
  g->gpudirect_rdma = a->gpudirect_rdma;
  g->rdma_writes_ordering = a->rdma_writes_ordering;
  g->ordering = a->ordering;
}

/* spec: --cuda-accels, "all" or ordinals. Regions in host memory mapped
 * into the GPU unless in GPU memory is asked for, or auto and the
 * transport is rdma (GPUDirect RDMA writes GPU memory directly). */
static int cuda_discover(const char *spec,
                         const struct lynx_transport_ops *tops,
                         enum lynx_region_where mem,
                         struct lynx_accel_dev **out, uint32_t *n, char *err,
                         size_t errlen) {
  struct gpu_info *g = NULL;
  struct lynx_accel_dev *a;
  uint32_t k = 0;
  int own, rc;
  *out = NULL;
  *n = 0;
  if (mem == LYNX_REGION_AUTO)
    mem = tops == &lynx_transport_rdma ? LYNX_REGION_DEVICE : LYNX_REGION_HOST;
  own = mem == LYNX_REGION_DEVICE;
  if (own && tops == &lynx_transport_shm) {
    snprintf(err, errlen,
             "--cuda-accels: --region-mem device puts a GPU's "
             "mqueues in its memory, which the shm transport cannot map; "
             "use --region-mem host, or --transport tcp or rdma");
    return -EINVAL;
  }
  rc = gpu_discover(spec, &g, &k, err, errlen);
  if (rc)
    return rc;
  a = calloc(k, sizeof(*a));
  if (!a) {
    snprintf(err, errlen, "--cuda-accels: out of memory");
    free(g);
    return -ENOMEM;
  }
  for (uint32_t i = 0; i < k; i++) {
    a[i].ops = &lynx_accel_cuda;
    a[i].own_memory = own;
    a[i].device = g[i].device;
    snprintf(a[i].model, sizeof(a[i].model), "%s", g[i].name);
    snprintf(a[i].pci_bus_id, sizeof(a[i].pci_bus_id), "%s", g[i].pci_bus_id);
    a[i].numa_node = g[i].numa_node;
    a[i].memory = g[i].memory;
    a[i].gpudirect_rdma = g[i].gpudirect_rdma;
    a[i].rdma_writes_ordering = g[i].rdma_writes_ordering;
    /* in GPU memory: fenced when the GPU does not order GPUDirect RDMA
     * writes itself; in host memory the frontend's (or the tcp agent's)
     * stores reach it in program order, so no demand */
    a[i].ordering = own ? g[i].ordering : LYNX_ORDER_COALESCED;
    snprintf(a[i].where, sizeof(a[i].where), "GPU %d, %s", g[i].device,
             g[i].pci_bus_id);
    {
      char node[40] = "";
      if (g[i].numa_node >= 0)
        snprintf(node, sizeof(node), " (on NUMA node %d)", g[i].numa_node);
      snprintf(a[i].about, sizeof(a[i].about),
               "GPU %d %s (%s), %llu MiB, "
               "compute %d.%d, %d SMs, GPUDirect RDMA %s, RDMA writes "
               "ordering %u; mqueues in %s%s",
               g[i].device, g[i].name, g[i].pci_bus_id,
               (unsigned long long)(g[i].memory >> 20), g[i].cc_major,
               g[i].cc_minor, g[i].sms, g[i].gpudirect_rdma ? "yes" : "no",
               g[i].rdma_writes_ordering,
               own ? "GPU memory" : "host memory mapped into the GPU",
               own ? "" : node);
    }
  }
  free(g);
  *out = a;
  *n = k;
  return 0;
}

/* A kernel (apps.cu); one that calls a back end does so through client
 * mqueues of its blocks' own (client_mqs). */
static int cuda_runs_app(const struct lynx_accel_dev *a,
                         const struct lynx_app *app) {
  if (app->module) /* a GPU application's own, where it has code */
    return lynx__cuda_module_runs(app->module, a->device);
  return app->cuda_app &&
         (!app->needs_backend || lynx_cuda_app_calls(app->cuda_app));
}

static int cuda_adopt(const struct lynx_accel_dev *devs, uint32_t n,
                      struct lynx_app *app, char *why, size_t whylen) {
  if (!app->image)
    return -ENOTSUP;
  return lynx__cuda_adopt(devs, n, app, why, whylen);
}

/* One client mqueue per back end for each block of a kernel that calls
 * back ends (its blocks, as start will pick them: lynx__cuda_pick_blocks),
 * so no block ever waits for another's call or takes its reply; one,
 * unused by the kernel, for any other app (the frontend connects it all
 * the same). */
static int cuda_client_mqs(const struct lynx_accel_launch *l,
                           uint32_t *per_backend, char *why, size_t whylen) {
  uint32_t resident = 0;
  int rc;
  *per_backend = 1;
  if (!lynx__cuda_calls_backends(l))
    return 0;
  rc = lynx__cuda_resident(l, &resident, why, whylen);
  if (rc)
    return rc;
  return lynx__cuda_pick_blocks(l->acc->device, l, resident, per_backend, why,
                                whylen);
}

/* The region in the GPU's memory (or the caller's host region mapped into
 * the GPU), the app as a persistent kernel. */
static int cuda_start(const struct lynx_accel_launch *l, struct lynx_region *r,
                      struct lynx_accel_inst **out, char *why, size_t whylen) {
  struct gpu_instance *gi = NULL;
  int rc;
  *out = NULL;
  if (!l->app->cuda_app && !l->app->module) {
    snprintf(why, whylen,
             "application '%s' has no CUDA kernel (GPU "
             "applications: %s)",
             l->app->name, lynx_app_cuda_names());
    return -ENOTSUP;
  }
  if (l->app->module && !cuda_runs_app(l->acc, l->app)) {
    lynx__cuda_module_why(l->app->module, l->acc->device, why, whylen);
    return -ENOEXEC;
  }
  if (!cuda_runs_app(l->acc, l->app)) {
    snprintf(why, whylen,
             "application '%s' calls back end '%s', which its "
             "CUDA kernel cannot",
             l->app->name, l->app->needs_backend);
    return -ENOTSUP;
  }
  rc = gpu_instance_start(l, r, &gi, why, whylen);
  if (rc)
    return rc;
  gi->acc.ops = &lynx_accel_cuda;
  *out = &gi->acc;
  return 0;
}

static int cuda_fence(struct lynx_accel_inst *in, uint64_t serve_until_ns,
                      int wake) {
  (void)wake; /* the kernel polls: it never sleeps on the doorbell */
  return gpu_instance_fence(container_of(in, struct gpu_instance, acc),
                            serve_until_ns);
}

static void cuda_copies(struct lynx_accel_inst *in,
                        struct lynx_accel_copies *out) {
  gpu_instance_copy_stats(container_of(in, struct gpu_instance, acc), out);
}

static int cuda_latency(struct lynx_accel_inst *in, struct lynx_lat *out) {
  return gpu_instance_latency(container_of(in, struct gpu_instance, acc), out);
}

static int cuda_counters(struct lynx_accel_inst *in, uint64_t *req,
                         uint64_t *resp, uint64_t *drops, uint64_t *bad) {
  return gpu_instance_counters(container_of(in, struct gpu_instance, acc), req,
                               resp, drops, bad);
}

static int cuda_stop(struct lynx_accel_inst *in) {
  return gpu_instance_stop(container_of(in, struct gpu_instance, acc));
}

static void cuda_put(struct lynx_accel_inst *in) {
  gpu_instance_put(container_of(in, struct gpu_instance, acc));
}

static void cuda_health(const struct lynx_accel_dev *a, int *lost, int *failed,
                        char *err, size_t errlen) {
  struct gpu_info g;
  info_gpu(a, &g);
  gpu_health(&g, lost, failed, err, errlen);
}

/* The occupancy query's figure for an empty GPU (cuda_blocks.c) and what
 * this agent's running kernels hold of it (the budget, cuda_health.c). */
static int cuda_blocks(const struct lynx_accel_dev *a, uint32_t threads,
                       uint32_t *resident, uint32_t *held) {
  /* the empty GPU's figure does not change: asked once per device and
   * thread count (the agent asks at every health sample and heartbeat) */
  static struct { uint32_t threads, resident; } known[GPU_MAX];
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  char why[128];
  int d = a->device, rc = 0;
  *held = lynx__cuda_blocks_held(d);
  if (d < 0 || d >= GPU_MAX)
    return -EINVAL;
  pthread_mutex_lock(&lock);
  if (known[d].threads != threads) {
    if (lynx_cuda_resident_blocks(d, threads, &known[d].resident, why,
                                  sizeof(why)))
      rc = -EIO; /* asked again next time */
    else
      known[d].threads = threads;
  }
  *resident = rc ? 0 : known[d].resident;
  pthread_mutex_unlock(&lock);
  return rc;
}

static void cuda_shutdown(void) {
  lynx__cuda_modules_unload();
  gpu_shutdown();
}

const struct lynx_accel_ops lynx_accel_cuda =
    LYNX_ACCEL_OPS("cuda", "GPU", cuda);
