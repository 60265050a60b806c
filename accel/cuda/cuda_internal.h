/*
 * cuda_internal.h - internals of the CUDA backend shared by its files
 * (cuda_accel.c lists them): the instance (struct gpu_instance, opaque in
 * gpu.h) with its staging ring, and the lynx__cuda_ functions one file
 * defines for others. Not a public header: the agent reaches the backend
 * through accel.h, the unit test through gpu.h.
 *
 * The files call each other in one direction only (no circle, HACKING.md
 * "Layering"): the ops table (cuda_accel.c) over start and stop
 * (cuda_launch.c), over the region (cuda_region.c), the tcp transport's
 * copies (cuda_stage.c), the fence and counters, block selection, over the
 * memory pools and driver entry points, over the calls that may wait for
 * the device (cuda_calls.c, which hands memory back through the callers'
 * give_back), over the error record.
 */
#ifndef LYNX_CUDA_INTERNAL_H
#define LYNX_CUDA_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "accel.h"
#include "gpu.h"
#include "transport.h"

struct lynx_cuda_kctl; /* lynx_cuda.h */

#define GPU_MAX 64 /* devices --cuda-accels and the error record take */

/* ---- per-device error record (cuda_health.c) ------------------------ */

/* Records e (nothing for cudaSuccess) of what on device dev for
 * gpu_health, and logs it (rate-limited). */
void lynx__cuda_note(int dev, cudaError_t e, const char *what);
/* e as -errno: -ENOMEM, -EBUSY (a call that did not return in time:
 * cuda_calls.c), -ENODEV (the device is gone), else -EIO. */
int lynx__cuda_errno(cudaError_t e);
/* cudaGetErrorString(e), or for cudaErrorNotReady what the calls thread's
 * bound means. */
const char *lynx__cuda_strerror(cudaError_t e);
/* A kernel on dev did not stop within wait_ms: dev is hung and failed
 * (sticky: only a context reset clears it). */
void lynx__cuda_set_hung(int dev, unsigned wait_ms);
/* 1 when a kernel on dev did not stop: its memory is never freed. */
int lynx__cuda_hung(int dev);
/* The per-GPU budget of resident blocks across this agent's instances:
 * how many blocks its running kernels hold on dev, and a kernel's blocks
 * taken (take 1, once all are resident) or given back (0, once it ended;
 * a hung kernel's stay taken). */
uint32_t lynx__cuda_blocks_held(int dev);
void lynx__cuda_blocks_hold(int dev, uint32_t n, int take);

/* ---- driver entry points and gdrcopy (cuda_driver.c) ---------------- */

/* The driver API's function called name, or NULL where the driver lacks
 * it. */
void *lynx__cuda_driver_fn(const char *name);

typedef struct gdr *gdr_t;
typedef struct {
  unsigned long h;
} gdr_mh_t;

/* libgdrapi's functions, once lynx__cuda_gdr_open ran: g is NULL where
 * gdrcopy cannot be used (not installed, or no gdrdrv module). */
struct lynx__cuda_gdr {
  pthread_once_t once;
  gdr_t g;
  int (*pin)(gdr_t, unsigned long, size_t, uint64_t, uint32_t, gdr_mh_t *);
  int (*unpin)(gdr_t, gdr_mh_t);
  int (*map)(gdr_t, gdr_mh_t, void **, size_t);
  int (*unmap)(gdr_t, gdr_mh_t, void *, size_t);
  int (*to)(gdr_mh_t, void *, const void *, size_t);
  int (*from)(gdr_mh_t, void *, const void *, size_t);
};
extern struct lynx__cuda_gdr lynx__cuda_gdr;
/* Loads gdrcopy the first time (any thread; the others wait for it). */
void lynx__cuda_gdr_open(void);

/* ---- device memory and pinned buffers (cuda_pool.c) ----------------- */

/* size bytes of device memory on the current device, zeroed on stream s
 * (synchronised before return); *got is the chunk's real size. */
cudaError_t lynx__cuda_dev_alloc(int device, size_t size, cudaStream_t s,
                                 void **p, size_t *got);
/* Gives p (of size bytes, NULL: nothing) back for reuse, never cudaFree. */
void lynx__cuda_dev_free(int device, void *p, size_t size);
/* size bytes of pinned host memory for device (the current one). */
cudaError_t lynx__cuda_pinned_alloc(int device, size_t size, void **p);
/* Gives p (NULL: nothing) back for reuse, never cudaFreeHost. */
void lynx__cuda_pinned_free(int device, void *p);

/* ---- calls that may wait for the device (cuda_calls.c) -------------- */

#ifndef CALL_WAIT_MS /* unit_cuda_backend waits less */
/* how long a start waits for a registration or an allocation */
#define CALL_WAIT_MS 2000u
#endif
/* Where the memory of an allocation its caller gave up on goes. */
typedef void (*lynx__cuda_give_back)(int device, void *p, size_t size);
/* cudaMalloc and cudaHostAlloc (portable) on device, made on the calls
 * thread: the result, or cudaErrorNotReady when it did not return within
 * CALL_WAIT_MS (what it returns later goes to give_back). */
cudaError_t lynx__cuda_call_malloc(int device, size_t size, void **p,
                                   lynx__cuda_give_back give_back);
cudaError_t lynx__cuda_call_host_alloc(int device, size_t size, void **p,
                                       lynx__cuda_give_back give_back);
/* cudaHostRegister (mapped, portable) of size bytes at ours, a mapping of
 * map_len bytes the backend owns: the result, or cudaErrorNotReady (the
 * registration is undone and ours unmapped when it returns). */
cudaError_t lynx__cuda_call_register(int device, void *ours, size_t size,
                                     size_t map_len);
/* Queues the unregistration of ours, then its unmapping; never waits. */
void lynx__cuda_call_unregister(int device, void *ours, size_t map_len);
/* Calls queued or running (an abandoned one until it is undone). */
int lynx__cuda_calls_pending(void);
/* Ends the calls thread once the queue is empty, waiting up to wait_ms:
 * the calls left (0: the thread ended). */
int lynx__cuda_calls_drain(unsigned wait_ms);

/* ---- blocks of a persistent kernel (cuda_blocks.c) ------------------ */

/* 1 when l's kernel calls back ends through client mqueues. */
int lynx__cuda_calls_backends(const struct lynx_accel_launch *l);
/* How many blocks l's kernel runs on device (resident at most fit there):
 * *out, or -EINVAL with the reason in err. */
int lynx__cuda_pick_blocks(int device, const struct lynx_accel_launch *l,
                           uint32_t resident, uint32_t *out, char *err,
                           size_t errlen);
/* The blocks of a kernel that calls back ends, from l's client mqueue
 * layout, and the back end it calls: 0 or -EINVAL with the reason. */
int lynx__cuda_client_blocks(const struct lynx_accel_launch *l,
                             uint32_t resident, uint32_t *blocks,
                             uint32_t *backend, char *err, size_t errlen);

/* ---- GPU applications as CUDA modules (cuda_module.c) ---------------- */

struct lynx__cuda_module;
/* The accel ops' adopt (accel.h): app's module loaded and checked for the
 * GPUs devs, app->module set. 0, or -errno with the reason in why. */
int lynx__cuda_adopt(const struct lynx_accel_dev *devs, uint32_t n,
                     struct lynx_app *app, char *why, size_t whylen);
/* 1 when the module has code for GPU device (its kernels resolved there at
 * adopt); else why it has none, in why. */
int lynx__cuda_module_runs(const struct lynx__cuda_module *m, int device);
void lynx__cuda_module_why(const struct lynx__cuda_module *m, int device,
                           char *why, size_t whylen);
/* As lynx_cuda_resident_blocks (lynx_cuda.h) for the module's kernel: 0,
 * or -errno with the reason in err. */
int lynx__cuda_module_resident(const struct lynx__cuda_module *m, int device,
                               uint32_t threads, uint32_t *max, char *err,
                               size_t errlen);
/* As lynx_cuda_start for the module's kernel on device (the current one):
 * 0, a cudaError_t value or -errno, with the reason in err. */
int lynx__cuda_module_launch(const struct lynx__cuda_module *m, int device,
                             const struct lynx_cuda_launch *l, void *stream,
                             char *err, size_t errlen);
/* At exit, once no kernel runs: the modules unloaded (not where a kernel
 * hung). */
void lynx__cuda_modules_unload(void);

/* How many blocks of l's kernel (the agent's built-in one, or its app's
 * module's) GPU l->acc keeps resident when empty: 0, or -errno with the
 * reason in err (cuda_launch.c). */
int lynx__cuda_resident(const struct lynx_accel_launch *l, uint32_t *resident,
                        char *err, size_t errlen);

/* ---- the instance ---------------------------------------------------- */

/* The tcp transport's staging ring (cuda_stage.c says how it works). */
#define STAGE_BYTES (4u << 20) /* the largest tcp operation fits */
#define STAGE_SEGS 64u         /* closed spans in flight before a wait */
#define STAGE_NONE UINT64_MAX
/* after the staging, in the same pinned buffer: the kernel's copy of the
 * region's accelerator-control array (struct lynx_region_mem ctrl_mirror),
 * 8 bytes for each of at most 1,024 mqueues (LYNX_MQUEUES_MAX) */
#define STAGE_MIRROR_BYTES (8u * 1024u)

struct stage_seg {
  uint64_t end; /* a closed span ends here; it starts where the last ended */
  int done;     /* a stream synchronisation completed it: no event to ask */
};

struct stage {
  uint8_t *buf;        /* pinned STAGE_BYTES, or NULL: no staging */
  void *mirror;        /* buf + STAGE_BYTES: the control array's copy */
  void *mirror_dev;    /* ... as the kernel reaches it */
  uint64_t head, tail; /* [tail, head) is in use */
  uint64_t open_from;  /* the open span, [open_from, head): no event yet */
  struct stage_seg seg[STAGE_SEGS]; /* closed spans over [tail, open_from) */
  cudaEvent_t ev[STAGE_SEGS];       /* seg[i]'s */
  uint32_t seg_first, seg_n;
  uint64_t hold; /* reads' bytes from here on are the server's */
  int reads;     /* read_starts since the last flush */
  int held;      /* the last flush handed reads over */
  struct {       /* a batch's write held back to join the next */
    uint64_t off, pos;
    size_t len;
    int live;
  } pend;
  struct lynx_accel_copies st;
};

struct gpu_instance {
  struct lynx_accel_inst acc; /* the ops table's handle (accel.h) */
  int device;
  int numa_node; /* the GPU's (lynx_accel_dev), -1: none known */
  uint32_t writes_ordering;
  struct lynx_region_mem mem;
  void *raw; /* device memory (lynx__cuda_dev_alloc) */
  size_t raw_size;
  uint8_t *base; /* raw aligned to GPU_PAGE, or host's device address */
  void *host;    /* our mapping of a host region, registered, or NULL */
  size_t host_map_len;
  uint64_t size;  /* region bytes */
  uint64_t alloc; /* bytes from base, a multiple of GPU_PAGE */
  cudaStream_t copy, kern;
  pthread_mutex_t lock; /* the copy stream, dma-buf fd, gdr mapping */
  struct lynx_cuda_kctl *kctl;
  size_t kctl_size;
  float *params; /* lenet: its weights in GPU memory, or NULL */
  size_t params_size;
  char *config; /* the app configuration, after the control block */
  uint32_t blocks;
  int dmabuf_fd;       /* -1: none yet; -2: dma-buf unavailable */
  char dmabuf_why[96]; /* why, when -2 */
  gdr_mh_t gmh;
  void *gva; /* gdrcopy's CPU mapping of base, or NULL */
  int refs;  /* the agent's handle + the transport's memory */
  int launched, stopping, stopped, hung;
  int holds_blocks; /* its blocks count in the GPU's budget (cuda_health.c) */
  struct gpu_instance *kept_next; /* cuda_launch.c: kept, its start failed */
  uint64_t stats[4];              /* last counters read */
  struct lynx_lat lat;            /* last latency histograms read (summed) */
  /* %globaltimer - host monotonic clock, as measured from the kernel's
   * now_gt (a lower bound: the value was read before the copy returned),
   * the best in the last CLOCK_WINDOW_NS; used for the lease fence */
  int64_t gt_off;
  uint64_t gt_off_at;
  int calibrated;
  /* the step %globaltimer moves in: the greatest common divisor of the
   * differences between the readings seen (gt_steps of them), from gt_last */
  uint64_t gt_last, gt_step;
  uint32_t gt_steps;
  uint64_t fence_gt; /* the value last written to kctl->serve_until_gt */
  struct stage stg;  /* the tcp transport's staging (above) */
};

/* ---- the region (cuda_region.c) -------------------------------------- */

/* Device memory, zeroed, for a region of size bytes; streams; gdrcopy
 * mapping. 0 or -errno with the reason in err. */
int lynx__cuda_region_alloc(struct gpu_instance *gi, uint64_t size, char *err,
                            size_t errlen);
/* The caller's host region mapped into the GPU (and the streams). 0 or
 * -errno with the reason in err. */
int lynx__cuda_map_host(struct gpu_instance *gi, uint8_t *host, uint64_t size,
                        char *err, size_t errlen);
/* Unmaps a host region from the GPU (its kernel is gone). */
void lynx__cuda_host_unmap(struct gpu_instance *gi);
/* Sets gi->mem, the region's memory as the transport reaches it. */
void lynx__cuda_region_mem(struct gpu_instance *gi);

/* ---- the tcp transport's copies (cuda_stage.c) ----------------------- */

/* Pinned staging and its events. 0, or -errno with the reason in err. */
int lynx__cuda_stage_init(struct gpu_instance *gi, char *err, size_t errlen);
/* Gives the staging back once no copy uses it (and logs the counters). */
void lynx__cuda_stage_fini(struct gpu_instance *gi);
/* struct lynx_region_mem's ops (transport.h); ctx is the instance. The
 * batch ops only where the instance stages. */
int lynx__cuda_mem_write(void *ctx, uint64_t off, const void *src, size_t len);
int lynx__cuda_mem_read(void *ctx, uint64_t off, void *dst, size_t len);
int lynx__cuda_mem_write_start(void *ctx, uint64_t off, const void *src,
                               size_t len, unsigned flags);
int lynx__cuda_mem_read_start(void *ctx, uint64_t off, size_t len,
                              const void **bytes);
int lynx__cuda_mem_flush(void *ctx);

/* ---- the kernel's clock and lease fence (cuda_fence.c) --------------- */

/* A sample of the kernel's clock gt against the host's host_after (lock
 * held): the offset the fence converts deadlines with. */
void lynx__cuda_clock_sample(struct gpu_instance *gi, uint64_t gt,
                             uint64_t host_after);
/* Writes kctl->serve_until_gt (lock held). */
cudaError_t lynx__cuda_fence_write(struct gpu_instance *gi, uint64_t gt);
/* The offset a host deadline is converted with at host time now_ns: the
 * sample less the drift allowed for since (lock held). */
int64_t lynx__cuda_clock_offset(const struct gpu_instance *gi, uint64_t now_ns);
/* The step %globaltimer moves in, once 3 readings' differences have shown
 * it (their greatest common divisor), else 0. */
uint64_t lynx__cuda_clock_step(const struct gpu_instance *gi);
/* The control block's header: the kernel's clock sample (lock held). */
cudaError_t lynx__cuda_kctl_header(struct gpu_instance *gi,
                                   struct lynx_cuda_kctl *h);

#endif
