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
 * copies, and the persistent kernel. The transport
 * reaches the region through struct lynx_region_mem (below); the instance
 * is reference-counted between the agent's handle and the transport's
 * memory, so the memory goes only after the last data connection and never
 * under a kernel that did not stop.
 *
 * Errors from any call are recorded per device (gpu_health): the last one,
 * and whether it is sticky (the context is unusable: the device needs a
 * reset), for the heartbeat.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <infiniband/verbs.h>

#include "accel.h"
#include "gpu.h"
#include "log.h"
#include "lenet_model.h"
#include "lynx_cuda.h"
#include "mqueue.h"
#include "util.h"

#define GPU_PAGE (64u * 1024u)
#define GPU_MAX 64
#ifndef STOP_WAIT_MS /* unit_cuda_backend waits less */
#define STOP_WAIT_MS 3000u
#endif

/* ---- per-device error record --------------------------------------- */

static struct {
  pthread_mutex_t lock;
  struct {
    char last_error[128];
    int failed, lost;
    int hung; /* a kernel did not stop: cudaFree would wait for it */
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

static void note(int dev, cudaError_t e, const char *what) {
  if (dev < 0 || dev >= GPU_MAX || e == cudaSuccess)
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

static int cuda_errno(cudaError_t e) {
  return e == cudaErrorMemoryAllocation ? -ENOMEM
         : gone(e)                      ? -ENODEV
                                        : -EIO;
}

/* ---- driver entry points (no link against libcuda) ------------------ */

typedef CUresult (*pfn_get_handle)(void *handle, CUdeviceptr dptr,
                                   size_t size, CUmemRangeHandleType type,
                                   unsigned long long flags);
typedef CUresult (*pfn_set_attr)(const void *value,
                                 CUpointer_attribute attribute,
                                 CUdeviceptr ptr);

static void *driver_fn(const char *name) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault,
                                       &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess)
    return NULL;
  return fn;
}

/* ---- gdrcopy, when libgdrapi is installed (dlopen) ------------------ */

typedef struct gdr *gdr_t;
typedef struct {
  unsigned long h;
} gdr_mh_t;

static struct {
  pthread_once_t once;
  gdr_t g;
  int (*pin)(gdr_t, unsigned long, size_t, uint64_t, uint32_t, gdr_mh_t *);
  int (*unpin)(gdr_t, gdr_mh_t);
  int (*map)(gdr_t, gdr_mh_t, void **, size_t);
  int (*unmap)(gdr_t, gdr_mh_t, void *, size_t);
  int (*to)(gdr_mh_t, void *, const void *, size_t);
  int (*from)(gdr_mh_t, void *, const void *, size_t);
} gdr = {.once = PTHREAD_ONCE_INIT};

static void gdr_load(void) {
  void *h = dlopen("libgdrapi.so.2", RTLD_NOW | RTLD_LOCAL);
  gdr_t (*open_fn)(void);
  if (!h)
    return; /* not installed: cudaMemcpyAsync serves the tcp transport */
  open_fn = (gdr_t(*)(void))dlsym(h, "gdr_open");
  *(void **)&gdr.pin = dlsym(h, "gdr_pin_buffer");
  *(void **)&gdr.unpin = dlsym(h, "gdr_unpin_buffer");
  *(void **)&gdr.map = dlsym(h, "gdr_map");
  *(void **)&gdr.unmap = dlsym(h, "gdr_unmap");
  *(void **)&gdr.to = dlsym(h, "gdr_copy_to_mapping");
  *(void **)&gdr.from = dlsym(h, "gdr_copy_from_mapping");
  if (!open_fn || !gdr.pin || !gdr.unpin || !gdr.map || !gdr.unmap ||
      !gdr.to || !gdr.from) {
    LYNX_WARN("cuda", "libgdrapi.so.2 lacks the gdrcopy 2.x API: not used");
    dlclose(h);
    return;
  }
  gdr.g = open_fn(); /* NULL without the gdrdrv kernel module */
  if (!gdr.g) {
    LYNX_INFO("cuda", "gdrcopy installed but gdr_open failed (is the gdrdrv "
              "module loaded?): the tcp transport copies with "
              "cudaMemcpyAsync");
    dlclose(h);
  }
}

/* ---- discovery ------------------------------------------------------- */

int gpu_built(void) { return 1; }

static int parse_list(const char *spec, int count, int *ids, uint32_t *n,
                      char *err, size_t errlen) {
  const char *p = spec;
  *n = 0;
  if (!strcmp(spec, "all")) {
    for (int d = 0; d < count && d < GPU_MAX; d++)
      ids[(*n)++] = d;
    return 0;
  }
  while (*p) {
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p || v < 0 || (*end && *end != ',') ||
        (*end == ',' && !end[1])) {
      snprintf(err, errlen, "--cuda-accels '%s': expected 'all' or GPU "
               "ordinals like 0,1", spec);
      return -EINVAL;
    }
    if (v >= count) {
      snprintf(err, errlen, "--cuda-accels: CUDA GPU %ld does not exist "
               "(this host has %d)", v, count);
      return -ENODEV;
    }
    for (uint32_t i = 0; i < *n; i++)
      if (ids[i] == (int)v) {
        snprintf(err, errlen, "--cuda-accels: GPU %ld named twice", v);
        return -EINVAL;
      }
    if (*n >= GPU_MAX) {
      snprintf(err, errlen, "--cuda-accels: at most %d GPUs", GPU_MAX);
      return -EINVAL;
    }
    ids[(*n)++] = (int)v;
    p = *end ? end + 1 : end;
  }
  if (!*n) {
    snprintf(err, errlen, "--cuda-accels: empty list");
    return -EINVAL;
  }
  return 0;
}

int gpu_discover(const char *spec, struct gpu_info **out, uint32_t *n,
                 char *err, size_t errlen) {
  int count = 0, ids[GPU_MAX], rc;
  struct gpu_info *g;
  cudaError_t e = cudaGetDeviceCount(&count);
  *out = NULL;
  *n = 0;
  if (e != cudaSuccess) {
    snprintf(err, errlen, "--cuda-accels %s: no usable CUDA GPU: "
             "cudaGetDeviceCount: %s (%s)", spec, cudaGetErrorName(e),
             cudaGetErrorString(e));
    return -ENODEV;
  }
  if (count == 0) {
    snprintf(err, errlen, "--cuda-accels %s: no CUDA GPU on this host",
             spec);
    return -ENODEV;
  }
  rc = parse_list(spec, count, ids, n, err, errlen);
  if (rc) {
    *n = 0; /* no GPUs with *out NULL, also after a partly parsed list */
    return rc;
  }
  g = calloc(*n, sizeof(*g));
  if (!g) {
    *n = 0;
    snprintf(err, errlen, "--cuda-accels: out of memory");
    return -ENOMEM;
  }
  for (uint32_t i = 0; i < *n; i++) {
    struct cudaDeviceProp p;
    int v = 0;
    g[i].device = ids[i];
    e = cudaGetDeviceProperties(&p, ids[i]);
    if (e == cudaSuccess)
      e = cudaDeviceGetPCIBusId(g[i].pci_bus_id, sizeof(g[i].pci_bus_id),
                                ids[i]);
    if (e != cudaSuccess) {
      snprintf(err, errlen, "CUDA GPU %d: cannot read its properties: %s",
               ids[i], cudaGetErrorString(e));
      free(g);
      *n = 0;
      return -ENODEV;
    }
    snprintf(g[i].name, sizeof(g[i].name), "%.63s", p.name);
    g[i].memory = p.totalGlobalMem;
    g[i].cc_major = p.major;
    g[i].cc_minor = p.minor;
    g[i].sms = p.multiProcessorCount;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrGPUDirectRDMASupported,
                               ids[i]) == cudaSuccess)
      g[i].gpudirect_rdma = v != 0;
    v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrGPUDirectRDMAWritesOrdering,
                               ids[i]) == cudaSuccess)
      g[i].rdma_writes_ordering = (uint32_t)v;
    /* Without native ordering of GPUDirect RDMA writes, the kernel may see
     * a slot's seq before its payload: the paper's fenced mode (payload,
     * a read as a barrier, then the metadata). */
    g[i].ordering = g[i].rdma_writes_ordering >=
                            (uint32_t)cudaGPUDirectRDMAWritesOrderingOwner
                        ? LYNX_ORDER_COALESCED
                        : LYNX_ORDER_FENCED;
    if (p.major < 7)
      LYNX_WARN("cuda", "GPU %d (%s) has compute capability %d.%d; the "
                "kernels need 7.0 or newer (built for %s)", ids[i], p.name,
                p.major, p.minor, "sm_80, sm_90 + PTX");
  }
  *out = g;
  return 0;
}

/* ---- device memory ---------------------------------------------------
 *
 * Never cudaFree while the agent runs: cudaFree synchronises the whole
 * device, which never completes while another instance's persistent kernel
 * runs on it (and cudaDeviceSynchronize likewise). Memory an instance gives
 * back goes to a per-device free list and is reused (first fit);
 * gpu_shutdown frees it once every kernel is gone. Zeroing is a
 * cudaMemsetAsync on the instance's own non-blocking stream.
 */

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
static cudaError_t dev_alloc(int device, size_t size, cudaStream_t s,
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
    e = cudaMalloc(p, size);
    *got = size;
  }
  if (e == cudaSuccess)
    e = cudaMemsetAsync(*p, 0, *got, s);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(s);
  return e;
}

static void dev_free(int device, void *p, size_t size) {
  struct dev_chunk *c;
  if (!p)
    return;
  c = malloc(sizeof(*c));
  if (!c) { /* keep it out of use rather than synchronise the device */
    LYNX_WARN("cuda", "GPU %d: out of memory: %zu device bytes leak",
              device, size);
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

/* Pinned host buffers of STAGE_BYTES (staging, below), one list for all
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

/* size bytes of pinned host memory for device (the current one). */
static cudaError_t pinned_alloc(int device, size_t size, void **p) {
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
  return cudaHostAlloc(p, size, cudaHostAllocPortable);
}

static void pinned_free(int device, void *p) {
  struct pinned_buf *b;
  if (!p)
    return;
  b = malloc(sizeof(*b));
  if (!b) {
    LYNX_WARN("cuda", "GPU %d: out of memory: a pinned staging buffer "
              "leaks", device);
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
  pthread_mutex_lock(&pinned.lock);
  while (pinned.free) {
    struct pinned_buf *b = pinned.free;
    int hung;
    pinned.free = b->next;
    pthread_mutex_lock(&rec.lock);
    hung = b->device >= 0 && b->device < GPU_MAX && rec.dev[b->device].hung;
    pthread_mutex_unlock(&rec.lock);
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
    pthread_mutex_lock(&rec.lock);
    hung = c->device >= 0 && c->device < GPU_MAX && rec.dev[c->device].hung;
    pthread_mutex_unlock(&rec.lock);
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

/* ---- instances ------------------------------------------------------- */

/*
 * Staging for the tcp transport (without gdrcopy, whose CPU mapping the
 * server loads and stores instead).
 *
 * The server reaches GPU memory with copies on the instance's copy stream.
 * From the caller's pageable memory a copy goes through the driver's own
 * bounce buffer and may be synchronous, and a read that waits for the
 * stream per request puts a PCIe round trip behind every other request of
 * the connection. So an instance has a ring of pinned host memory
 * (STAGE_BYTES, allocated with the instance):
 *
 * - A write is copied into the ring and a cudaMemcpyAsync issued from
 *   there; nothing waits for it. Stream order keeps writes in the order
 *   they were made, and a publishing write is two copies, its last word
 *   after its body. In a batch (write_start), a write adjacent to the
 *   previous one in the region and in the ring joins its copy, which is
 *   held back until a non-adjacent write, a read or the flush; the
 *   publishing word never joins anything.
 * - A batch's reads (read_start) are copies into the ring; the flush waits
 *   once for the stream, after which the server fills its replies from the
 *   ring. Stream order makes each read see the writes before it.
 * - Ring space is reused only once the copy that used it completed: the
 *   span of each batch is closed with an event, and space is reclaimed
 *   oldest span first with cudaEventQuery; only when the ring wrapped onto
 *   a copy still in flight does it wait (cudaEventSynchronize, counted as a
 *   staging wait). A batch's reads keep their span until the server used
 *   their bytes (its next batch call).
 * - What the ring cannot take (an access larger than the ring, or space
 *   held by reads) is copied straight from or to the caller's memory, as
 *   without staging, and counted as unstaged.
 *
 * Positions are bytes since the instance started; the ring offset is the
 * position modulo STAGE_BYTES, and an allocation that would straddle the
 * end skips to the start. Everything here runs under gi->lock.
 */
#define STAGE_BYTES (4u << 20) /* the largest tcp operation fits */
#define STAGE_SEGS 64u         /* closed spans in flight before a wait */
#define STAGE_NONE UINT64_MAX

struct stage_seg {
  uint64_t end; /* a closed span ends here; it starts where the last ended */
  int done;     /* a stream synchronisation completed it: no event to ask */
};

struct stage {
  uint8_t *buf;         /* pinned STAGE_BYTES, or NULL: no staging */
  uint64_t head, tail;  /* [tail, head) is in use */
  uint64_t open_from;   /* the open span, [open_from, head): no event yet */
  struct stage_seg seg[STAGE_SEGS]; /* closed spans over [tail, open_from) */
  cudaEvent_t ev[STAGE_SEGS];       /* seg[i]'s */
  uint32_t seg_first, seg_n;
  uint64_t hold;        /* reads' bytes from here on are the server's */
  int reads;            /* read_starts since the last flush */
  int held;             /* the last flush handed reads over */
  struct {              /* a batch's write held back to join the next */
    uint64_t off, pos;
    size_t len;
    int live;
  } pend;
  struct lynx_accel_copies st;
};

struct gpu_instance {
  struct lynx_accel_inst acc; /* the ops table's handle (accel.h) */
  int device;
  uint32_t writes_ordering;
  struct lynx_region_mem mem;
  void *raw;      /* device memory (dev_alloc) */
  size_t raw_size;
  uint8_t *base;  /* raw aligned to GPU_PAGE, or host's device address */
  void *host;     /* a host region registered with the GPU, or NULL */
  uint64_t size;  /* region bytes */
  uint64_t alloc; /* bytes from base, a multiple of GPU_PAGE */
  cudaStream_t copy, kern;
  pthread_mutex_t lock; /* the copy stream, dma-buf fd, gdr mapping */
  struct lynx_cuda_kctl *kctl;
  size_t kctl_size;
  float *params; /* lenet: its weights in GPU memory, or NULL */
  size_t params_size;
  uint32_t blocks;
  int dmabuf_fd; /* -1: none yet; -2: dma-buf unavailable */
  char dmabuf_why[96]; /* why, when -2 */
  gdr_mh_t gmh;
  void *gva; /* gdrcopy's CPU mapping of base, or NULL */
  int refs;  /* the agent's handle + the transport's memory */
  int launched, stopping, stopped, hung;
  uint64_t stats[4]; /* last counters read */
  struct lynx_lat lat; /* last latency histograms read (summed) */
  /* %globaltimer - host monotonic clock, as measured from the kernel's
   * now_gt (a lower bound: the value was read before the copy returned),
   * the best in the last CLOCK_WINDOW_NS; used for the lease fence */
  int64_t gt_off;
  uint64_t gt_off_at;
  int calibrated;
  uint64_t fence_gt; /* the value last written to kctl->serve_until_gt */
  struct stage stg;  /* the tcp transport's staging (above) */
};

#define CLOCK_WINDOW_NS (10ull * 1000000000ull)
#define CLOCK_WAIT_MS 2000u /* how long start waits for the kernel's clock */

/* A sample of the kernel's clock (gt, published by block 0) against the
 * host's (host_after, taken once the copy that brought gt returned). The
 * offset is a lower bound, so a converted deadline errs early; the largest
 * recent one is kept, a stale one replaced (clocks drift). */
static void clock_sample(struct gpu_instance *gi, uint64_t gt,
                         uint64_t host_after) {
  int64_t off = (int64_t)(gt - host_after);
  if (!gt)
    return; /* nothing published yet */
  if (!gi->calibrated || off > gi->gt_off ||
      host_after - gi->gt_off_at > CLOCK_WINDOW_NS) {
    gi->gt_off = off;
    gi->gt_off_at = host_after;
    gi->calibrated = 1;
  }
}

/* Writes kctl->serve_until_gt (lock held). */
static cudaError_t fence_write(struct gpu_instance *gi, uint64_t gt) {
  cudaError_t e;
  gi->fence_gt = gt;
  e = cudaMemcpyAsync(&gi->kctl->serve_until_gt, &gi->fence_gt,
                      sizeof(gi->fence_gt), cudaMemcpyHostToDevice, gi->copy);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(gi->copy);
  return e;
}

/* The control block's header: the kernel's clock sample (lock held). */
static cudaError_t kctl_header(struct gpu_instance *gi,
                               struct lynx_cuda_kctl *h) {
  cudaError_t e = cudaMemcpyAsync(h, gi->kctl, sizeof(*h),
                                  cudaMemcpyDeviceToHost, gi->copy);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(gi->copy);
  if (e == cudaSuccess)
    clock_sample(gi, h->now_gt, lynx_now_ns());
  return e;
}

/* ---- the region's memory for the tcp transport (staging above) ------- */

/* A CUDA error of a copy for the transport: recorded, as -errno. */
static int copy_err(struct gpu_instance *gi, cudaError_t e, const char *what) {
  note(gi->device, e, what);
  return cuda_errno(e);
}

/* Issues the held-back write's copy, if any. */
static int stage_issue(struct gpu_instance *gi) {
  struct stage *sg = &gi->stg;
  cudaError_t e;
  if (!sg->pend.live)
    return 0;
  sg->pend.live = 0;
  sg->st.copies++;
  e = cudaMemcpyAsync(gi->base + sg->pend.off,
                      sg->buf + sg->pend.pos % STAGE_BYTES, sg->pend.len,
                      cudaMemcpyHostToDevice, gi->copy);
  return e == cudaSuccess ? 0 : copy_err(gi, e, "copy into the region");
}

/* Frees the oldest closed span once its copies completed; wait: for them,
 * when they have not (the ring wrapped onto them). 0, -EAGAIN (not
 * complete, no wait), -ENOBUFS (the span holds reads the server has not
 * used yet) or the device's -errno. */
static int stage_reclaim(struct gpu_instance *gi, int wait) {
  struct stage *sg = &gi->stg;
  uint32_t i = sg->seg_first;
  if (sg->hold != STAGE_NONE && sg->seg[i].end > sg->hold)
    return -ENOBUFS;
  if (!sg->seg[i].done) {
    cudaError_t e = cudaEventQuery(sg->ev[i]);
    if (e == cudaErrorNotReady) {
      if (!wait)
        return -EAGAIN;
      sg->st.staging_waits++;
      e = cudaEventSynchronize(sg->ev[i]);
    }
    if (e != cudaSuccess)
      return copy_err(gi, e, "staging: waiting for a copy");
  }
  sg->tail = sg->seg[i].end;
  sg->seg_first = (i + 1) % STAGE_SEGS;
  sg->seg_n--;
  return 0;
}

/* Closes the open span: an event after its copies (the held-back write's
 * issued first). 0 or -errno (-ENOBUFS: every span is in flight and the
 * oldest holds the server's reads). */
static int stage_close(struct gpu_instance *gi) {
  struct stage *sg = &gi->stg;
  uint32_t i;
  cudaError_t e;
  int rc = stage_issue(gi);
  if (rc || sg->head == sg->open_from)
    return rc;
  if (sg->seg_n == STAGE_SEGS && (rc = stage_reclaim(gi, 1)) != 0)
    return rc;
  i = (sg->seg_first + sg->seg_n) % STAGE_SEGS;
  e = cudaEventRecord(sg->ev[i], gi->copy);
  if (e != cudaSuccess)
    return copy_err(gi, e, "staging: recording an event");
  sg->seg[i].end = sg->head;
  sg->seg[i].done = 0;
  sg->seg_n++;
  sg->open_from = sg->head;
  return 0;
}

/* len bytes of the ring at *pos, contiguous, free of any copy in flight.
 * 0, -E2BIG (never fits), -ENOBUFS (the server's reads hold the space) or
 * the device's -errno. */
static int stage_alloc(struct gpu_instance *gi, size_t len, uint64_t *pos) {
  struct stage *sg = &gi->stg;
  if (len > STAGE_BYTES)
    return -E2BIG;
  for (;;) {
    uint64_t at = sg->head % STAGE_BYTES;
    uint64_t skip = at + len > STAGE_BYTES ? STAGE_BYTES - at : 0;
    int rc;
    if (sg->head == sg->tail && at) {
      /* empty: start again at the ring's start, nothing to skip */
      sg->head = sg->tail = sg->open_from = sg->head + STAGE_BYTES - at;
      continue;
    }
    if (STAGE_BYTES - (sg->head - sg->tail) >= skip + len) {
      sg->head += skip;
      *pos = sg->head;
      sg->head += len;
      return 0;
    }
    /* reclaim the oldest span; the open one has to be closed first */
    if (!sg->seg_n && (rc = stage_close(gi)) != 0)
      return rc;
    if ((rc = stage_reclaim(gi, 1)) != 0)
      return rc;
  }
}

/* The next batch call: the bytes the last flush handed over are used. */
static void stage_unhold(struct stage *sg) {
  if (sg->held) {
    sg->held = 0;
    sg->hold = STAGE_NONE;
  }
}

/* A copy straight from the caller's memory, where the ring cannot take
 * it: the driver stages pageable memory itself before the call returns,
 * so src may be reused; stream order lands a publishing word last. */
static int unstaged_write(struct gpu_instance *gi, uint64_t off,
                          const uint8_t *src, size_t len, unsigned flags) {
  size_t body = flags & LYNX_WR_PUBLISH ? len - 4 : len;
  cudaError_t e = cudaSuccess;
  int rc = stage_issue(gi);
  if (rc)
    return rc;
  gi->stg.st.unstaged++;
  if (body) {
    gi->stg.st.copies++;
    e = cudaMemcpyAsync(gi->base + off, src, body, cudaMemcpyHostToDevice,
                        gi->copy);
  }
  if (e == cudaSuccess && body < len) {
    gi->stg.st.copies++;
    e = cudaMemcpyAsync(gi->base + off + body, src + body, 4,
                        cudaMemcpyHostToDevice, gi->copy);
  }
  return e == cudaSuccess ? 0 : copy_err(gi, e, "copy into the region");
}

/* A write through the ring; join: the copy may be held back to join the
 * next adjacent write (a batch), else it is issued now. */
static int stage_write(struct gpu_instance *gi, uint64_t off,
                       const uint8_t *src, size_t len, unsigned flags,
                       int join) {
  struct stage *sg = &gi->stg;
  size_t body = flags & LYNX_WR_PUBLISH ? len - 4 : len;
  uint64_t pos;
  cudaError_t e;
  int rc = stage_alloc(gi, len, &pos);
  if (rc == -E2BIG || rc == -ENOBUFS)
    return unstaged_write(gi, off, src, len, flags);
  if (rc)
    return rc;
  memcpy(sg->buf + pos % STAGE_BYTES, src, len);
  if (body) {
    if (sg->pend.live && sg->pend.off + sg->pend.len == off &&
        sg->pend.pos + sg->pend.len == pos &&
        sg->pend.pos % STAGE_BYTES + sg->pend.len + body <= STAGE_BYTES) {
      sg->pend.len += body; /* one copy for both */
      sg->st.merged++;
    } else {
      rc = stage_issue(gi);
      if (rc)
        return rc;
      sg->pend.off = off;
      sg->pend.pos = pos;
      sg->pend.len = body;
      sg->pend.live = 1;
    }
  }
  if (!join || body < len) {
    rc = stage_issue(gi);
    if (rc)
      return rc;
  }
  if (body < len) {
    /* the publishing word: a copy of its own after its body's */
    sg->st.copies++;
    e = cudaMemcpyAsync(gi->base + off + body,
                        sg->buf + (pos + body) % STAGE_BYTES, 4,
                        cudaMemcpyHostToDevice, gi->copy);
    if (e != cudaSuccess)
      return copy_err(gi, e, "copy into the region");
  }
  return 0;
}

static int mem_write(void *ctx, uint64_t off, const void *src, size_t len) {
  struct gpu_instance *gi = ctx;
  int rc = 0;
  if (lynx_bounds_ok(gi->size, off, len))
    return -EFAULT;
  pthread_mutex_lock(&gi->lock);
  gi->stg.st.writes++;
  if (gi->gva) {
    gdr.to(gi->gmh, (uint8_t *)gi->gva + off, src, len);
    /* write-combined stores leave in order only across a fence; without
     * native ordering of peer writes, a read back makes this write land
     * before the next one (the fenced mode's barrier, done here) */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (gi->writes_ordering < (uint32_t)cudaGPUDirectRDMAWritesOrderingOwner) {
      uint32_t sink;
      gdr.from(gi->gmh, &sink, (uint8_t *)gi->gva + (off & ~3ull), 4);
    }
  } else {
    cudaSetDevice(gi->device);
    rc = gi->stg.buf ? stage_write(gi, off, src, len, 0, 0)
                     : unstaged_write(gi, off, src, len, 0);
  }
  pthread_mutex_unlock(&gi->lock);
  return rc;
}

/* A single read (the agent's own: the header, health): straight into dst,
 * complete on return. */
static int mem_read(void *ctx, uint64_t off, void *dst, size_t len) {
  struct gpu_instance *gi = ctx;
  cudaError_t e = cudaSuccess;
  int rc = 0;
  if (lynx_bounds_ok(gi->size, off, len))
    return -EFAULT;
  pthread_mutex_lock(&gi->lock);
  gi->stg.st.reads++;
  if (gi->gva) {
    gdr.from(gi->gmh, dst, (uint8_t *)gi->gva + off, len);
  } else {
    cudaSetDevice(gi->device);
    rc = stage_issue(gi); /* a batch's write made before it */
    if (!rc) {
      gi->stg.st.copies++;
      gi->stg.st.syncs++;
      e = cudaMemcpyAsync(dst, gi->base + off, len, cudaMemcpyDeviceToHost,
                          gi->copy);
      if (e == cudaSuccess)
        e = cudaStreamSynchronize(gi->copy);
      if (e != cudaSuccess)
        rc = copy_err(gi, e, "copy out of the region");
    }
  }
  pthread_mutex_unlock(&gi->lock);
  return rc;
}

/* The batch ops (struct lynx_region_mem): set only where the instance
 * stages (no gdrcopy mapping). */
static int mem_write_start(void *ctx, uint64_t off, const void *src,
                           size_t len, unsigned flags) {
  struct gpu_instance *gi = ctx;
  int rc;
  if (lynx_bounds_ok(gi->size, off, len))
    return -EFAULT;
  if ((flags & LYNX_WR_PUBLISH) && len < 4)
    return -EINVAL;
  pthread_mutex_lock(&gi->lock);
  cudaSetDevice(gi->device);
  stage_unhold(&gi->stg);
  gi->stg.st.writes++;
  rc = stage_write(gi, off, src, len, flags & LYNX_WR_PUBLISH, 1);
  pthread_mutex_unlock(&gi->lock);
  return rc;
}

static int mem_read_start(void *ctx, uint64_t off, size_t len,
                          const void **bytes) {
  struct gpu_instance *gi = ctx;
  struct stage *sg = &gi->stg;
  uint64_t pos;
  cudaError_t e;
  int rc;
  if (lynx_bounds_ok(gi->size, off, len))
    return -EFAULT;
  pthread_mutex_lock(&gi->lock);
  cudaSetDevice(gi->device);
  stage_unhold(sg);
  rc = stage_issue(gi); /* the read sees it: stream order */
  if (!rc)
    rc = stage_alloc(gi, len, &pos);
  if (!rc) {
    sg->st.reads++;
    sg->st.copies++;
    e = cudaMemcpyAsync(sg->buf + pos % STAGE_BYTES, gi->base + off, len,
                        cudaMemcpyDeviceToHost, gi->copy);
    if (e == cudaSuccess) {
      if (sg->hold == STAGE_NONE)
        sg->hold = pos; /* kept until the server used the bytes */
      sg->reads++;
      *bytes = sg->buf + pos % STAGE_BYTES;
    } else {
      rc = copy_err(gi, e, "copy out of the region");
    }
  }
  pthread_mutex_unlock(&gi->lock);
  return rc;
}

static int mem_flush(void *ctx) {
  struct gpu_instance *gi = ctx;
  struct stage *sg = &gi->stg;
  cudaError_t e;
  int rc;
  pthread_mutex_lock(&gi->lock);
  cudaSetDevice(gi->device);
  rc = stage_issue(gi);
  if (sg->reads) {
    /* the one wait of the batch: every copy so far has completed after
     * it, so every span is done; the reads' part stays held */
    sg->reads = 0;
    sg->st.syncs++;
    e = cudaStreamSynchronize(gi->copy);
    if (e == cudaSuccess) {
      sg->seg_first = 0;
      sg->seg_n = 0;
      if (sg->hold > sg->tail)
        sg->seg[sg->seg_n++] = (struct stage_seg){sg->hold, 1};
      if (sg->head > sg->hold)
        sg->seg[sg->seg_n++] = (struct stage_seg){sg->head, 1};
      sg->open_from = sg->head;
      sg->held = 1;
    } else {
      sg->hold = STAGE_NONE;
      if (!rc)
        rc = copy_err(gi, e, "copy out of the region");
    }
  } else if (!rc) {
    /* writes only: an event marks when their span is free again */
    rc = stage_close(gi);
    if (rc == -ENOBUFS)
      rc = 0; /* it stays open: closed by a later allocation */
    while (!rc && sg->seg_n && stage_reclaim(gi, 0) == 0)
      ;
  }
  pthread_mutex_unlock(&gi->lock);
  return rc;
}

/* Pinned staging and its events, for an instance whose transport copies
 * (tcp). 0, or -errno with the reason in err. */
static int stage_init(struct gpu_instance *gi, char *err, size_t errlen) {
  struct stage *sg = &gi->stg;
  void *p = NULL;
  cudaError_t e = pinned_alloc(gi->device, STAGE_BYTES, &p);
  const char *what = "pinned staging allocation";
  sg->hold = STAGE_NONE;
  if (e == cudaSuccess) {
    sg->buf = p;
    what = "staging events";
    for (uint32_t i = 0; i < STAGE_SEGS && e == cudaSuccess; i++)
      e = cudaEventCreateWithFlags(&sg->ev[i], cudaEventDisableTiming);
  }
  if (e != cudaSuccess) {
    note(gi->device, e, what);
    snprintf(err, errlen, "GPU %d: cannot set up the tcp transport's %u KiB "
             "of pinned staging (%s): %s", gi->device, STAGE_BYTES >> 10,
             what, cudaGetErrorString(e));
    return cuda_errno(e);
  }
  return 0;
}

/* Gives the staging back, once no copy uses it (the copy stream runs no
 * kernel: this waits for copies only). */
static void stage_fini(struct gpu_instance *gi) {
  struct stage *sg = &gi->stg;
  const struct lynx_accel_copies *st = &sg->st;
  for (uint32_t i = 0; i < STAGE_SEGS; i++)
    if (sg->ev[i])
      cudaEventDestroy(sg->ev[i]);
  if (st->writes || st->reads)
    LYNX_INFO("cuda", "GPU %d: the region's tcp copies: %llu writes, %llu "
              "reads, %llu copies (%llu writes merged), %llu stream "
              "synchronisations, %llu staging waits, %llu unstaged",
              gi->device, (unsigned long long)st->writes,
              (unsigned long long)st->reads, (unsigned long long)st->copies,
              (unsigned long long)st->merged, (unsigned long long)st->syncs,
              (unsigned long long)st->staging_waits,
              (unsigned long long)st->unstaged);
  if (!sg->buf)
    return;
  if (gi->copy && cudaStreamSynchronize(gi->copy) != cudaSuccess) {
    LYNX_WARN("cuda", "GPU %d: copies on the staging may not have ended: "
              "its %u KiB stay out of use", gi->device, STAGE_BYTES >> 10);
    return;
  }
  pinned_free(gi->device, sg->buf);
  sg->buf = NULL;
}

void gpu_instance_copy_stats(struct gpu_instance *gi,
                             struct lynx_accel_copies *st) {
  pthread_mutex_lock(&gi->lock);
  *st = gi->stg.st;
  st->staging_bytes = gi->stg.buf ? STAGE_BYTES : 0;
  pthread_mutex_unlock(&gi->lock);
}

/* RDMA registration of GPU memory: dma-buf first (upstream kernels, open
 * GPU module), then the device pointer as is (nvidia-peermem). */
static int mem_reg_mr(void *ctx, void *pd, uint64_t off, size_t len,
                      int access, void **mr, char *err, size_t errlen) {
  struct gpu_instance *gi = ctx;
  char dmabuf_why[96] = "";
  struct ibv_mr *m = NULL;
  if (lynx_bounds_ok(gi->alloc, off, len))
    return -EFAULT;
  pthread_mutex_lock(&gi->lock);
  if (gi->dmabuf_fd == -1) {
    pfn_get_handle get = (pfn_get_handle)driver_fn(
        "cuMemGetHandleForAddressRange");
    int fd = -1;
    CUresult cr = get ? get(&fd, (CUdeviceptr)(uintptr_t)gi->base, gi->alloc,
                            CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0)
                      : CUDA_ERROR_NOT_SUPPORTED;
    if (cr == CUDA_SUCCESS && fd >= 0) {
      gi->dmabuf_fd = fd;
    } else {
      gi->dmabuf_fd = -2;
      snprintf(dmabuf_why, sizeof(dmabuf_why),
               "cuMemGetHandleForAddressRange: %s",
               get ? "CUresult error" : "not in this driver");
      if (get)
        snprintf(dmabuf_why, sizeof(dmabuf_why),
                 "cuMemGetHandleForAddressRange: CUresult %d", (int)cr);
      memcpy(gi->dmabuf_why, dmabuf_why, sizeof(dmabuf_why));
    }
  } else if (gi->dmabuf_fd == -2) {
    memcpy(dmabuf_why, gi->dmabuf_why, sizeof(dmabuf_why));
  }
  if (gi->dmabuf_fd >= 0) {
    m = ibv_reg_dmabuf_mr(pd, off, len, (uintptr_t)gi->base + off,
                          gi->dmabuf_fd, access);
    if (!m)
      snprintf(dmabuf_why, sizeof(dmabuf_why), "ibv_reg_dmabuf_mr: %s",
               strerror(errno));
  }
  if (!m) {
    m = ibv_reg_mr(pd, gi->base + off, len, access);
    if (!m)
      snprintf(err, errlen, "GPU %d: neither dma-buf (%s) nor "
               "nvidia-peermem (ibv_reg_mr: %s) registers its memory; load "
               "nvidia-peermem, or use the open GPU kernel module with a "
               "dma-buf capable kernel (5.12+) and NIC driver", gi->device,
               dmabuf_why[0] ? dmabuf_why : "not tried", strerror(errno));
    else if (dmabuf_why[0])
      LYNX_INFO("cuda", "GPU %d: registered through nvidia-peermem (%s)",
                gi->device, dmabuf_why);
  }
  pthread_mutex_unlock(&gi->lock);
  if (!m)
    return -EIO;
  *mr = m;
  return 0;
}

/* Unmaps a host region from the GPU (its kernel is gone). */
static void host_unmap(struct gpu_instance *gi) {
  cudaError_t e;
  if (!gi->host)
    return;
  e = cudaHostUnregister(gi->host);
  if (e != cudaSuccess)
    note(gi->device, e, "host region unregistration");
  gi->host = NULL;
}

/* A formatted region in host memory (the transport's), pinned and mapped
 * into the GPU: the kernel reaches it across PCIe at gi->base, with the
 * same volatile loads and system-scope fences as GPU memory (mqueue.md);
 * the frontend (shm) or the tcp agent reach it with plain stores. */
static int gi_map_host(struct gpu_instance *gi, uint8_t *host, uint64_t size,
                       char *err, size_t errlen) {
  void *dev = NULL;
  cudaError_t e = cudaStreamCreateWithFlags(&gi->copy, cudaStreamNonBlocking);
  if (e == cudaSuccess)
    e = cudaStreamCreateWithFlags(&gi->kern, cudaStreamNonBlocking);
  if (e == cudaSuccess) {
    e = cudaHostRegister(host, size,
                         cudaHostRegisterMapped | cudaHostRegisterPortable);
    if (e == cudaSuccess)
      gi->host = host;
  }
  if (e == cudaSuccess)
    e = cudaHostGetDevicePointer(&dev, host, 0);
  if (e != cudaSuccess) {
    note(gi->device, e, "host region mapping");
    snprintf(err, errlen, "GPU %d: cannot map a %llu-byte host region into "
             "the GPU: %s", gi->device, (unsigned long long)size,
             cudaGetErrorString(e));
    return cuda_errno(e);
  }
  gi->base = dev;
  gi->size = gi->alloc = size;
  return 0;
}

static void gi_free(struct gpu_instance *gi) {
  cudaSetDevice(gi->device);
  if (gi->hung) {
    /* the kernel may still touch it: freeing would let it corrupt the
     * next allocation */
    LYNX_ERR("cuda", "GPU %d: keeping %llu bytes of a region whose kernel "
             "did not stop, until the agent exits", gi->device,
             (unsigned long long)gi->alloc);
    return;
  }
  host_unmap(gi);
  if (gi->gva) {
    gdr.unmap(gdr.g, gi->gmh, gi->gva, gi->alloc);
    gdr.unpin(gdr.g, gi->gmh);
  }
  if (gi->dmabuf_fd >= 0)
    close(gi->dmabuf_fd);
  stage_fini(gi); /* before its stream goes */
  if (gi->copy)
    cudaStreamDestroy(gi->copy);
  if (gi->kern)
    cudaStreamDestroy(gi->kern);
  dev_free(gi->device, gi->kctl, gi->kctl_size);
  dev_free(gi->device, gi->params, gi->params_size);
  dev_free(gi->device, gi->raw, gi->raw_size);
  pthread_mutex_destroy(&gi->lock);
  free(gi);
}

static void gi_put(struct gpu_instance *gi) {
  if (__atomic_sub_fetch(&gi->refs, 1, __ATOMIC_ACQ_REL) == 0)
    gi_free(gi);
}

static void mem_release(void *ctx) { gi_put(ctx); }

void gpu_instance_put(struct gpu_instance *gi) {
  if (gi)
    gi_put(gi);
}

/* Device memory, zeroed, for the region; streams; gdrcopy mapping. */
static int gi_alloc(struct gpu_instance *gi, uint64_t size, char *err,
                    size_t errlen) {
  cudaError_t e;
  pfn_set_attr set_attr;
  gi->alloc = lynx_align_up(size, GPU_PAGE);
  e = cudaStreamCreateWithFlags(&gi->copy, cudaStreamNonBlocking);
  if (e == cudaSuccess)
    e = cudaStreamCreateWithFlags(&gi->kern, cudaStreamNonBlocking);
  if (e == cudaSuccess)
    e = dev_alloc(gi->device, gi->alloc + GPU_PAGE, gi->copy, &gi->raw,
                  &gi->raw_size);
  if (e != cudaSuccess) {
    note(gi->device, e, "region allocation");
    snprintf(err, errlen, "GPU %d: cannot allocate a %llu-byte region: %s",
             gi->device, (unsigned long long)size, cudaGetErrorString(e));
    return cuda_errno(e);
  }
  gi->base = (uint8_t *)lynx_align_up((uintptr_t)gi->raw, GPU_PAGE);
  gi->size = size;
  /* GPUDirect RDMA: memory operations on this range synchronise with
   * peer accesses (CUDA's GPUDirect RDMA guide) */
  set_attr = (pfn_set_attr)driver_fn("cuPointerSetAttribute");
  if (set_attr) {
    unsigned one = 1;
    if (set_attr(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS,
                 (CUdeviceptr)(uintptr_t)gi->base) != CUDA_SUCCESS)
      LYNX_DBG("cuda", "GPU %d: cannot set SYNC_MEMOPS on the region",
                 gi->device);
  }
  pthread_once(&gdr.once, gdr_load);
  if (gdr.g) {
    if (gdr.pin(gdr.g, (unsigned long)(uintptr_t)gi->base, gi->alloc, 0, 0,
                &gi->gmh) == 0) {
      if (gdr.map(gdr.g, gi->gmh, &gi->gva, gi->alloc) != 0) {
        gdr.unpin(gdr.g, gi->gmh);
        gi->gva = NULL;
      }
    }
    LYNX_INFO("cuda", "GPU %d: tcp transport copies %s", gi->device,
              gi->gva ? "through gdrcopy's CPU mapping"
                      : "with cudaMemcpyAsync (gdrcopy could not map)");
  }
  return 0;
}

/* 1 when l's kernel calls back ends through client mqueues: each block
 * then has its own (docs/client-mqueues.md, "On a GPU"). */
static int calls_backends(const struct lynx_accel_launch *l) {
  return l->n_backends && l->app && lynx_cuda_app_calls(l->app->cuda_app);
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
static int pick_blocks(int device, const struct lynx_accel_launch *l,
                       uint32_t resident, uint32_t *out, char *err,
                       size_t errlen) {
  uint32_t need = (l->n_server + LYNX_CUDA_MQS_PER_BLOCK - 1) /
                  LYNX_CUDA_MQS_PER_BLOCK;
  uint32_t b = l->gpu_blocks, room = UINT32_MAX;
  int sms = 0;
  if (calls_backends(l))
    room = l->n_server < LYNX_MQUEUES_MAX
               ? (LYNX_MQUEUES_MAX - l->n_server) / l->n_backends
               : 0;
  if (!b) {
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount,
                               device) != cudaSuccess || sms < 1)
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
    snprintf(err, errlen, "%u server mqueues need at least %u blocks (a "
             "block serves at most %u): --gpu-blocks %u", l->n_server, need,
             LYNX_CUDA_MQS_PER_BLOCK, l->gpu_blocks);
    return -EINVAL;
  }
  if (b > resident) {
    snprintf(err, errlen, "GPU %d keeps at most %u blocks of %u threads "
             "resident, %u needed", device, resident, l->gpu_threads, b);
    return -EINVAL;
  }
  if (b > room) {
    snprintf(err, errlen, "%u blocks with a client mqueue for each of %u "
             "back ends and %u server mqueues exceed a region's %u mqueues "
             "(fewer --gpu-blocks or mqueues_per_accel)", b, l->n_backends,
             l->n_server, LYNX_MQUEUES_MAX);
    return -EINVAL;
  }
  *out = b;
  return 0;
}

/*
 * The client mqueue layout of a kernel that calls back ends: one block per
 * client mqueue of each back end, so the blocks are the region's layout
 * (l->n_mqueues = n_server + blocks * n_backends, from client_mqs) and are
 * taken from it, after the same checks pick_blocks makes. *backend: the
 * back end the app calls (its needs_backend). 0 or -EINVAL with the
 * reason.
 */
static int client_blocks(const struct lynx_accel_launch *l,
                         uint32_t resident, uint32_t *blocks,
                         uint32_t *backend, char *err, size_t errlen) {
  uint32_t per, need = (l->n_server + LYNX_CUDA_MQS_PER_BLOCK - 1) /
                       LYNX_CUDA_MQS_PER_BLOCK;
  *backend = l->n_backends;
  for (uint32_t k = 0; l->backends && l->app->needs_backend &&
                       k < l->n_backends; k++)
    if (!strcmp(l->backends[k], l->app->needs_backend)) {
      *backend = k;
      break;
    }
  if (*backend == l->n_backends) {
    snprintf(err, errlen, "application '%s' needs a back end named '%s'",
             l->app->name,
             l->app->needs_backend ? l->app->needs_backend : "?");
    return -EINVAL;
  }
  per = (l->n_mqueues - l->n_server) / l->n_backends;
  if (l->n_mqueues <= l->n_server ||
      l->n_server + per * l->n_backends != l->n_mqueues || per < need ||
      per > resident || per > l->n_server) {
    snprintf(err, errlen, "client mqueue layout: %u mqueues, %u server "
             "mqueues and %u back ends do not give each of the kernel's "
             "blocks its own (%u resident at most)", l->n_mqueues,
             l->n_server, l->n_backends, resident);
    return -EINVAL;
  }
  *blocks = per;
  return 0;
}

/* lenet: its weights (the agent's, loaded once: lenet_model.h) into GPU
 * memory, copied and waited for before the launch, since the kernel runs
 * on another stream. 0 or -errno with the reason in err. */
static int upload_lenet(struct gpu_instance *gi, const void *app_data,
                        char *err, size_t errlen) {
  const struct lenet_model *m = app_data;
  void *p = NULL;
  cudaError_t e;
  if (!m) {
    snprintf(err, errlen, "lenet: no weights loaded");
    return -ENOENT;
  }
  e = dev_alloc(gi->device, sizeof(m->params), gi->copy, &p,
                &gi->params_size);
  gi->params = p;
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(gi->params, m->params, sizeof(m->params),
                        cudaMemcpyHostToDevice, gi->copy);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(gi->copy);
  if (e != cudaSuccess) {
    note(gi->device, e, "lenet weights");
    snprintf(err, errlen, "GPU %d: lenet weights: %s", gi->device,
             cudaGetErrorString(e));
    return cuda_errno(e);
  }
  return 0;
}

int gpu_instance_start(const struct lynx_accel_launch *l,
                       struct lynx_region *r,
                       struct gpu_instance **out, char *err, size_t errlen) {
  /* the caller's host region where the GPU does not own the memory */
  uint8_t *host = l->acc->own_memory ? NULL : l->region;
  /* the lease fence as of now (later moves: gpu_instance_fence) */
  uint64_t serve_until = l->serve_until ? __atomic_load_n(l->serve_until,
                                                          __ATOMIC_ACQUIRE)
                                        : UINT64_MAX;
  struct gpu_instance *gi;
  struct lynx_geom g;
  struct lynx_cuda_launch kl;
  uint32_t resident = 0, app_backend = 0;
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
  gi->writes_ordering = l->acc->rdma_writes_ordering;
  gi->dmabuf_fd = -1;
  gi->refs = 1; /* the agent's; the transport takes its own below */
  pthread_mutex_init(&gi->lock, NULL);
  e = cudaSetDevice(gi->device);
  if (e != cudaSuccess) {
    note(gi->device, e, "cudaSetDevice");
    snprintf(err, errlen, "GPU %d: %s", gi->device, cudaGetErrorString(e));
    gi_put(gi);
    return cuda_errno(e);
  }
  if (host) {
    rc = gi_map_host(gi, host, g.region_size, err, errlen);
    if (rc) {
      gi_put(gi);
      return rc;
    }
    goto launch;
  }
  rc = gi_alloc(gi, g.region_size, err, errlen);
  /* staging where the transport copies every request (tcp; rdma's NIC
   * reaches the memory itself) and gdrcopy does not map it */
  if (!rc && !gi->gva && l->tops != &lynx_transport_rdma)
    rc = stage_init(gi, err, errlen);
  if (rc) {
    gi_put(gi);
    return rc;
  }
  gi->mem = (struct lynx_region_mem){
      .kind = "cuda",
      .write = mem_write,
      .read = mem_read,
      .write_start = gi->stg.buf ? mem_write_start : NULL,
      .read_start = gi->stg.buf ? mem_read_start : NULL,
      .flush = gi->stg.buf ? mem_flush : NULL,
      .reg_mr = mem_reg_mr,
      .release = mem_release,
      .dev_addr = (uintptr_t)gi->base,
      .ctx = gi,
  };
  gi->refs++;
  rc = l->tops->region_attach(l->tagent, r, l->name, g.region_size, &gi->mem);
  if (rc) {
    snprintf(err, errlen, "the %s transport cannot reach GPU memory%s",
             l->tops->name, rc == -ENOTSUP ? " (use tcp or rdma)" : "");
    gi_put(gi); /* the transport released its reference */
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
    snprintf(err, errlen, "cannot export the region in GPU memory over %s: "
             "%s", l->tops->name, strerror(-rc));
    goto fail;
  }
launch:
  rc = lynx_cuda_resident_blocks(gi->device, l->gpu_threads, &resident, err,
                                 errlen);
  if (rc) {
    rc = -EIO;
    goto fail;
  }
  if (calls_backends(l))
    rc = client_blocks(l, resident, &gi->blocks, &app_backend, err, errlen);
  else
    rc = pick_blocks(gi->device, l, resident, &gi->blocks, err, errlen);
  if (rc)
    goto fail;
  {
    void *k = NULL;
    e = dev_alloc(gi->device, lynx_cuda_kctl_size(gi->blocks), gi->copy, &k,
                  &gi->kctl_size);
    gi->kctl = k;
  }
  /* under a lease the kernel starts fenced: the deadline can only be put
   * in its clock once it has published a reading */
  if (e == cudaSuccess && serve_until != UINT64_MAX) {
    pthread_mutex_lock(&gi->lock);
    e = fence_write(gi, 1);
    pthread_mutex_unlock(&gi->lock);
  }
  if (e != cudaSuccess) {
    note(gi->device, e, "control block");
    snprintf(err, errlen, "GPU %d: control block: %s", gi->device,
             cudaGetErrorString(e));
    rc = cuda_errno(e);
    goto fail;
  }
  if (l->app->cuda_app == LYNX_CUDA_APP_LENET) {
    rc = upload_lenet(gi, l->app_data, err, errlen);
    if (rc)
      goto fail;
  }
  kl = (struct lynx_cuda_launch){
      .lenet_params = gi->params,
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
      .idle_ns = 20000,
      .kctl = gi->kctl,
  };
  if (calls_backends(l)) {
    kl.n_backends = l->n_backends;
    kl.client_base = l->n_server;
    kl.app_backend = app_backend;
    kl.call_timeout_ns = LYNX_CALL_TIMEOUT_NS;
  }
  rc = lynx_cuda_start(&kl, gi->kern, err, errlen);
  if (rc) {
    if (rc > 0)
      note(gi->device, (cudaError_t)rc, "kernel launch");
    rc = rc > 0 ? cuda_errno((cudaError_t)rc) : rc;
    goto fail;
  }
  gi->launched = 1;
  if (serve_until != UINT64_MAX) {
    struct lynx_cuda_kctl h;
    uint64_t end = lynx_now_ns() + CLOCK_WAIT_MS * 1000000ull;
    pthread_mutex_lock(&gi->lock);
    while ((e = kctl_header(gi, &h)) == cudaSuccess && !gi->calibrated &&
           lynx_now_ns() < end) {
      pthread_mutex_unlock(&gi->lock);
      usleep(1000);
      pthread_mutex_lock(&gi->lock);
    }
    pthread_mutex_unlock(&gi->lock);
    if (e != cudaSuccess)
      note(gi->device, e, "control block");
    if (gi->calibrated)
      gpu_instance_fence(gi, serve_until);
    else
      LYNX_WARN("cuda", "GPU %d: the persistent kernel of %s published no "
                "clock within %u ms: it takes no request until it does "
                "(checked at every heartbeat)", gi->device, l->name,
                CLOCK_WAIT_MS);
  }
  if (kl.n_backends)
    LYNX_INFO("cuda", "GPU %d: persistent kernel of %s: %u blocks x %u "
              "threads over %u mqueues, each block with its own client "
              "mqueue to each of %u back ends (mqueues %u..%u)", gi->device,
              l->name, gi->blocks, l->gpu_threads, l->n_server,
              kl.n_backends, kl.client_base, l->n_mqueues - 1);
  else
    LYNX_INFO("cuda", "GPU %d: persistent kernel of %s: %u blocks x %u "
              "threads over %u mqueues", gi->device, l->name, gi->blocks,
              l->gpu_threads, l->n_server);
  *out = gi;
  return 0;
fail:
  if (!host)
    l->tops->region_free(r); /* releases the transport's reference */
  gi_put(gi);                /* unmaps a host region */
  return rc;
}

int gpu_instance_stop(struct gpu_instance *gi) {
  const uint32_t one = 1;
  uint64_t end;
  cudaError_t e;
  if (!gi->launched || gi->stopped)
    return gi->hung ? -ETIMEDOUT : 0;
  cudaSetDevice(gi->device);
  gi->stopping = 1; /* from here on, an exited kernel is expected */
  pthread_mutex_lock(&gi->lock);
  e = cudaMemcpyAsync(&gi->kctl->stop, &one, sizeof(one),
                      cudaMemcpyHostToDevice, gi->copy);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(gi->copy);
  pthread_mutex_unlock(&gi->lock);
  if (e != cudaSuccess)
    note(gi->device, e, "stop request");
  end = lynx_now_ns() + STOP_WAIT_MS * 1000000ull;
  while ((e = cudaStreamQuery(gi->kern)) == cudaErrorNotReady &&
         lynx_now_ns() < end)
    usleep(1000);
  if (e == cudaErrorNotReady) {
    gi->stopped = 1;
    gi->hung = 1; /* its counters are still read live */
    pthread_mutex_lock(&rec.lock);
    rec.dev[gi->device].hung = 1;
    rec.dev[gi->device].failed = 1; /* only a context reset clears it */
    snprintf(rec.dev[gi->device].last_error,
             sizeof(rec.dev[gi->device].last_error),
             "a persistent kernel did not stop within %u ms", STOP_WAIT_MS);
    pthread_mutex_unlock(&rec.lock);
    LYNX_ERR("cuda", "GPU %d: the persistent kernel did not stop within %u "
             "ms (hung)", gi->device, STOP_WAIT_MS);
    return -ETIMEDOUT;
  }
  if (e != cudaSuccess)
    note(gi->device, e, "persistent kernel");
  /* the counters the blocks published as they returned, kept from here */
  gpu_instance_counters(gi, &gi->stats[0], &gi->stats[1], &gi->stats[2],
                        &gi->stats[3]);
  gpu_instance_latency(gi, &gi->lat);
  gi->stopped = 1;
  host_unmap(gi); /* before its owner frees it */
  return 0;
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
    int64_t v = (int64_t)serve_until_ns + gi->gt_off;
    gt = v < 1 ? 1 : (uint64_t)v;
  }
  e = gt == gi->fence_gt ? cudaSuccess : fence_write(gi, gt);
  pthread_mutex_unlock(&gi->lock);
  if (e != cudaSuccess) {
    note(gi->device, e, "lease fence");
    return cuda_errno(e);
  }
  return 0;
}

int gpu_instance_counters(struct gpu_instance *gi, uint64_t *req,
                          uint64_t *resp, uint64_t *drops, uint64_t *bad) {
  size_t n = lynx_cuda_kctl_lat_off(gi->blocks); /* header and stats */
  struct lynx_cuda_kctl *k;
  cudaError_t e;
  *req = gi->stats[0];
  *resp = gi->stats[1];
  *drops = gi->stats[2];
  *bad = gi->stats[3];
  if (!gi->kctl || (gi->stopped && !gi->hung))
    return 0; /* final counters kept at stop */
  k = malloc(n);
  if (!k)
    return -ENOMEM;
  cudaSetDevice(gi->device);
  pthread_mutex_lock(&gi->lock);
  e = cudaMemcpyAsync(k, gi->kctl, n, cudaMemcpyDeviceToHost, gi->copy);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(gi->copy);
  if (e == cudaSuccess)
    clock_sample(gi, k->now_gt, lynx_now_ns());
  pthread_mutex_unlock(&gi->lock);
  if (e != cudaSuccess) {
    note(gi->device, e, "reading counters");
    free(k);
    return cuda_errno(e);
  }
  *req = *resp = *drops = *bad = 0;
  for (uint32_t b = 0; b < gi->blocks; b++) {
    *req += k->blocks[b].requests;
    *resp += k->blocks[b].responses;
    *drops += k->blocks[b].drops;
    *bad += k->blocks[b].bad;
  }
  gi->stats[0] = *req;
  gi->stats[1] = *resp;
  gi->stats[2] = *drops;
  gi->stats[3] = *bad;
  free(k);
  /* a kernel that died reports here: record it for the heartbeat */
  e = cudaStreamQuery(gi->kern);
  if (e != cudaSuccess && e != cudaErrorNotReady)
    note(gi->device, e, "persistent kernel");
  else if (e == cudaSuccess && !gi->stopping)
    LYNX_LOG_RL(LYNX_LOG_WARN, "cuda", "GPU %d: a persistent kernel exited "
                "without being asked to", gi->device);
  return 0;
}

int gpu_instance_latency(struct gpu_instance *gi, struct lynx_lat *out) {
  size_t n = (size_t)gi->blocks * sizeof(struct lynx_lat);
  struct lynx_lat *k;
  cudaError_t e;
  if (out != &gi->lat)
    *out = gi->lat;
  if (!gi->kctl || (gi->stopped && !gi->hung))
    return 0; /* final histograms kept at stop */
  k = malloc(n);
  if (!k)
    return -ENOMEM;
  cudaSetDevice(gi->device);
  pthread_mutex_lock(&gi->lock);
  e = cudaMemcpyAsync(k, (uint8_t *)gi->kctl + lynx_cuda_kctl_lat_off(gi->blocks),
                      n, cudaMemcpyDeviceToHost, gi->copy);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(gi->copy);
  pthread_mutex_unlock(&gi->lock);
  if (e != cudaSuccess) {
    note(gi->device, e, "reading latency histograms");
    free(k);
    return cuda_errno(e);
  }
  memset(&gi->lat, 0, sizeof(gi->lat));
  for (uint32_t b = 0; b < gi->blocks; b++) {
    lynx_lat_merge(&gi->lat.queue, &k[b].queue);
    lynx_lat_merge(&gi->lat.service, &k[b].service);
  }
  free(k);
  if (out != &gi->lat)
    *out = gi->lat;
  return 0;
}

void gpu_health(const struct gpu_info *g, int *lost, int *failed, char *err,
                size_t errlen) {
  int v = 0, dev = g->device;
  cudaError_t e = cudaSetDevice(dev);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&v, cudaDevAttrPciBusId, dev);
  if (e != cudaSuccess)
    note(dev, e, "device query");
  pthread_mutex_lock(&rec.lock);
  *lost = dev < GPU_MAX ? rec.dev[dev].lost || gone(e) : 1;
  *failed = dev < GPU_MAX ? rec.dev[dev].failed : 0;
  snprintf(err, errlen, "%s", dev < GPU_MAX ? rec.dev[dev].last_error : "");
  pthread_mutex_unlock(&rec.lock);
}

/* ---- the CUDA backend of the ops table (accel.h) ---------------------
 *
 * The agent's view of a GPU (struct lynx_accel_dev) over the functions
 * above: discovery's gpu_info is kept in the info's fields and rebuilt
 * from them.
 */

static void info_gpu(const struct lynx_accel_dev *a, struct gpu_info *g) {
  memset(g, 0, sizeof(*g));
  g->device = a->device;
  snprintf(g->name, sizeof(g->name), "%s", a->model);
  snprintf(g->pci_bus_id, sizeof(g->pci_bus_id), "%s", a->pci_bus_id);
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
                         struct lynx_accel_dev **out, uint32_t *n,
                         char *err, size_t errlen) {
  struct gpu_info *g = NULL;
  struct lynx_accel_dev *a;
  uint32_t k = 0;
  int own, rc;
  *out = NULL;
  *n = 0;
  if (mem == LYNX_REGION_AUTO)
    mem = tops == &lynx_transport_rdma ? LYNX_REGION_DEVICE
                                       : LYNX_REGION_HOST;
  own = mem == LYNX_REGION_DEVICE;
  if (own && tops == &lynx_transport_shm) {
    snprintf(err, errlen, "--cuda-accels: --region-mem device puts a GPU's "
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
    a[i].memory = g[i].memory;
    a[i].gpudirect_rdma = g[i].gpudirect_rdma;
    a[i].rdma_writes_ordering = g[i].rdma_writes_ordering;
    /* in GPU memory: fenced when the GPU does not order GPUDirect RDMA
     * writes itself; in host memory the frontend's (or the tcp agent's)
     * stores reach it in program order, so no demand */
    a[i].ordering = own ? g[i].ordering : LYNX_ORDER_COALESCED;
    snprintf(a[i].where, sizeof(a[i].where), "GPU %d, %s", g[i].device,
             g[i].pci_bus_id);
    snprintf(a[i].about, sizeof(a[i].about), "GPU %d %s (%s), %llu MiB, "
             "compute %d.%d, %d SMs, GPUDirect RDMA %s, RDMA writes "
             "ordering %u; mqueues in %s", g[i].device, g[i].name,
             g[i].pci_bus_id, (unsigned long long)(g[i].memory >> 20),
             g[i].cc_major, g[i].cc_minor, g[i].sms,
             g[i].gpudirect_rdma ? "yes" : "no", g[i].rdma_writes_ordering,
             own ? "GPU memory" : "host memory mapped into the GPU");
  }
  free(g);
  *out = a;
  *n = k;
  return 0;
}

/* A kernel (apps.cu); one that calls a back end does so through client
 * mqueues of its blocks' own (client_mqs). */
static int cuda_runs_app(const struct lynx_app *app) {
  return app->cuda_app &&
         (!app->needs_backend || lynx_cuda_app_calls(app->cuda_app));
}

/* One client mqueue per back end for each block of a kernel that calls
 * back ends (its blocks, as start will pick them: pick_blocks), so no
 * block ever waits for another's call or takes its reply; one, unused by
 * the kernel, for any other app (the frontend connects it all the same). */
static int cuda_client_mqs(const struct lynx_accel_launch *l,
                           uint32_t *per_backend, char *why, size_t whylen) {
  uint32_t resident = 0;
  int rc;
  *per_backend = 1;
  if (!calls_backends(l))
    return 0;
  rc = lynx_cuda_resident_blocks(l->acc->device, l->gpu_threads, &resident,
                                 why, whylen);
  if (rc)
    return -EIO;
  return pick_blocks(l->acc->device, l, resident, per_backend, why, whylen);
}

/* The region in the GPU's memory (or the caller's host region mapped into
 * the GPU), the app as a persistent kernel. */
static int cuda_start(const struct lynx_accel_launch *l,
                      struct lynx_region *r, struct lynx_accel_inst **out,
                      char *why, size_t whylen) {
  struct gpu_instance *gi = NULL;
  int rc;
  *out = NULL;
  if (!l->app->cuda_app) {
    snprintf(why, whylen, "application '%s' has no CUDA kernel (GPU "
             "applications: %s)", l->app->name, lynx_app_cuda_names());
    return -ENOTSUP;
  }
  if (!cuda_runs_app(l->app)) {
    snprintf(why, whylen, "application '%s' calls back end '%s', which its "
             "CUDA kernel cannot", l->app->name, l->app->needs_backend);
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
  return gpu_instance_counters(container_of(in, struct gpu_instance, acc),
                               req, resp, drops, bad);
}

static int cuda_stop(struct lynx_accel_inst *in) {
  return gpu_instance_stop(container_of(in, struct gpu_instance, acc));
}

static void cuda_put(struct lynx_accel_inst *in) {
  gpu_instance_put(container_of(in, struct gpu_instance, acc));
}

static void cuda_health(const struct lynx_accel_dev *a, int *lost,
                        int *failed, char *err, size_t errlen) {
  struct gpu_info g;
  info_gpu(a, &g);
  gpu_health(&g, lost, failed, err, errlen);
}

static void cuda_shutdown(void) { gpu_shutdown(); }

const struct lynx_accel_ops lynx_accel_cuda =
    LYNX_ACCEL_OPS("cuda", "GPU", cuda);
