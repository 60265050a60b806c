/*
 * accel.h - the accelerator backends behind one ops table.
 *
 * A backend finds its accelerators, starts an *instance* on one (a mqueue
 * region and the application polling it), moves the instance's lease
 * fence, reads its counters, stops it, and says how each device is. Two
 * backends: CPU-emulated accelerators (cpu_accel.c: polling threads over a
 * region in host memory) and GPUs (accel/cuda/: a persistent
 * kernel over a region in GPU memory; accel/cuda/cuda_none.c where the
 * agent was built without CUDA). The agent keeps what discovery returned
 * and the instances' handles, and calls the table: it never asks which
 * kind of accelerator it runs, so a new backend is one more table.
 *
 * Every op is present (an op a backend cannot do returns -ENOTSUP); errors
 * are 0 / -errno, with the reason in err/why where there is one. All ops
 * run on the agent's loop thread unless said otherwise.
 */
#ifndef LYNX_ACCEL_H
#define LYNX_ACCEL_H

#include <stddef.h>
#include <stdint.h>

#include "apps.h"
#include "lathist.h"
#include "wire.h"

struct lynx_accel_ops;
struct lynx_region;          /* transport.h */
struct lynx_transport_ops;   /* transport.h */
struct lynx_transport_agent; /* transport.h */

/* Where an accelerator with memory of its own keeps its mqueue regions
 * (the agent's --region-mem; docs/gpu.md). */
enum lynx_region_where {
  LYNX_REGION_AUTO = 0,   /* host for shm and tcp, device for rdma */
  LYNX_REGION_DEVICE = 1, /* its own memory: GPUDirect RDMA reaches it */
  LYNX_REGION_HOST = 2,   /* pinned host memory mapped into it: a
                                 frontend on the host (shm) or the tcp
                                 agent reach it with plain loads/stores */
};

/* One accelerator as discovery found it; the agent keeps a copy. What it
 * registers with (AccelInfo) and prints for --list-accels. */
struct lynx_accel_dev {
  const struct lynx_accel_ops *ops;
  /* 1: start places the region in the accelerator's own memory (the
   * transport's region_attach) and formats and exports it; 0: the caller
   * allocates, formats and exports it in host memory (region_alloc) before
   * start (which maps it where the accelerator needs), and frees it after
   * stop, or when start fails */
  int own_memory;
  int device;     /* the backend's own number (CUDA ordinal) */
  char model[64]; /* "cpu-emulated", or the GPU's name */
  char pci_bus_id[LYNX_PCI_ID_MAX]; /* "" for none */
  /* the NUMA node its PCI device sits on (sysfs), where the backend places
   * host memory it maps for it; -1: none known (a CPU accelerator) */
  int numa_node;
  uint64_t memory;    /* bytes of its own memory (0: it uses host memory) */
  int gpudirect_rdma; /* the NIC can write its memory directly */
  uint32_t rdma_writes_ordering; /* cudaDevAttrGPUDirectRDMAWritesOrdering */
  /* LYNX_ORDER_FENCED when it does not order a NIC's writes into its
   * memory itself (its regions must then use the fenced mode), else
   * LYNX_ORDER_COALESCED (no demand: the agent's --ordering holds) */
  uint32_t ordering;
  char where[48];  /* how log lines name the device ("GPU 0, 0000:3b:00.0") */
  char about[320]; /* the agent's startup line about it ("": none) */
};

/* What an instance runs, and where (the agent's view). */
struct lynx_accel_launch {
  const struct lynx_accel_dev *acc;
  const struct lynx_transport_ops *tops;
  struct lynx_transport_agent *tagent; /* tops' handle the region uses */
  const char *name;                    /* region name */
  /* own_memory 0: the region the caller formatted in host memory (its
   * base); own_memory 1: NULL, start places it */
  uint8_t *region;
  const struct lynx_app *app;
  const char *service;    /* the service's name */
  const char *app_config; /* its app configuration ("" or NULL: none) */
  /* 1: start may return 1 (started, the app's own start still running:
   * the backend says how it ended through the agent's hook; apphost.c) */
  int async_ok;
  void *app_state; /* the app's start's (lynx_app_start), for its ctx (the
                      CPU backend; a GPU kernel gets its own copy) */
  /* mqueues [0, n_server) are server mqueues; the rest are client
   * mqueues, client_mqs (the op) per back end: mqueue n_server + j *
   * n_backends + k is the j-th client mqueue of back end backends[k]
   * (one each on a CPU: n_server + k, as the frontend always had it) */
  uint32_t n_mqueues, n_server, slots, slot_size, ordering, accel_id;
  uint32_t large_bytes; /* each ring's large-message area (0: none) */
  char (*backends)[LYNX_BACKEND_NAME_MAX];
  uint32_t n_backends;
  uint64_t epoch;
  uint32_t work_us; /* emulated processing time per request */
  int work_sleep;   /* CPU: emulate work_us by sleeping, not spinning */
  uint32_t spin_us; /* CPU: spin this long after a request before sleeping */
  uint32_t cpu_threads; /* CPU: polling threads */
  uint32_t gpu_threads; /* GPU: threads per block of the kernel */
  uint32_t gpu_blocks;  /* GPU: blocks of the kernel (0: one per mqueue up
                           to one per SM) */
  uint32_t gpu_idle_ns; /* GPU: longest __nanosleep of an idle block (0:
                           none) */
  /* Lease fence on lynx_now_ns's clock (NULL or UINT64_MAX: none): no new
   * request is taken once it passes. Owned by the caller, written by its
   * loop and read live by CPU threads; a GPU takes its value at start and
   * learns later values through fence. */
  const uint64_t *serve_until;
};

/* Copies the transport's agent made into and out of an accelerator's own
 * memory for an instance (tcp into GPU memory without a CPU mapping; all
 * zero where the transport reaches the memory with loads and stores). */
struct lynx_accel_copies {
  uint64_t staging_bytes; /* its pinned staging ring (0: none: gdrcopy, rdma) */
  uint64_t writes, reads; /* accesses (a batch's and single ones) */
  uint64_t copies;        /* cudaMemcpyAsync calls they took */
  uint64_t merged;        /* writes that joined the previous write's copy */
  uint64_t syncs;         /* stream synchronisations they waited for */
  uint64_t staging_waits; /* waits for a copy the staging ring wrapped onto */
  uint64_t unstaged;      /* accesses copied from or to the caller's memory
                             (the ring could not take them) */
};

/* An instance's handle; each backend embeds it first in its own. */
struct lynx_accel_inst {
  const struct lynx_accel_ops *ops;
};

struct lynx_accel_ops {
  const char *kind; /* "cpu", "cuda": AccelInfo.kind, RegionDesc.kind */
  const char *noun; /* "CPU", "GPU": the agent's startup line */
  /* The accelerators spec names (the backend's option: CPU a count, CUDA
   * "all" or ordinals), reached through transport tops: *out (free() it)
   * of *n, in the order they are numbered, their regions where mem says
   * (a backend without memory of its own ignores it). 0, or -errno with
   * the reason in
   * err: -EINVAL when the request itself cannot be served (bad spec, a
   * transport that cannot reach it), another -errno when the host lacks
   * what it names. */
  int (*discover)(const char *spec, const struct lynx_transport_ops *tops,
                  enum lynx_region_where mem, struct lynx_accel_dev **out,
                  uint32_t *n, char *err, size_t errlen);
  /* 1 when an instance of app can start on accelerator a of this backend
   * (the coordinator places nothing else; start refuses the others). */
  int (*runs_app)(const struct lynx_accel_dev *a, const struct lynx_app *app);
  /* Takes the device code of GPU application app (app->image, a module
   * read from its file) for the n accelerators devs of this backend that
   * discovery found, before any instance starts: 0 (app->module set, its
   * name, help and back end from the module: lynx_app_adopt), -ENOTSUP
   * when this backend runs no such code, or another -errno with the
   * reason in why (the agent refuses the application with it). */
  int (*adopt)(const struct lynx_accel_dev *devs, uint32_t n,
               struct lynx_app *app, char *why, size_t whylen);
  /* How many client mqueues each back end of an instance of l gets, set
   * in *per_backend before its region is laid out (l->n_mqueues and
   * l->region are not set yet): 1 where the app's threads share one (CPU,
   * apps.h's struct lynx_client), one per block of a GPU kernel that calls
   * back ends (docs/client-mqueues.md, "On a GPU"). 0, or -errno with the
   * reason in why. */
  int (*client_mqs)(const struct lynx_accel_launch *l, uint32_t *per_backend,
                    char *why, size_t whylen);
  /* Starts l->app on l->acc over region r (see own_memory). 0 and *out,
   * or -errno with the reason in why and nothing left running (r freed
   * when own_memory). */
  int (*start)(const struct lynx_accel_launch *l, struct lynx_region *r,
               struct lynx_accel_inst **out, char *why, size_t whylen);
  /* *serve_until moved to serve_until_ns: the instance takes no new request
   * past it. wake: it had passed, so pollers may sleep on the region's
   * doorbell and must look again. 0 or -errno. */
  int (*fence)(struct lynx_accel_inst *in, uint64_t serve_until_ns, int wake);
  /* Requests taken, responses sent, requests the app dropped, malformed
   * slots skipped: totals since start, readable until put. 0 or -errno
   * (the last values read are still set). */
  int (*counters)(struct lynx_accel_inst *in, uint64_t *req, uint64_t *resp,
                  uint64_t *drops, uint64_t *bad);
  /* Queueing and service time of its requests as it stamped them with its
   * own clock (lathist.h): histograms, totals since start, readable until
   * put. 0 or -errno (the last values read are still set). */
  int (*latency)(struct lynx_accel_inst *in, struct lynx_lat *out);
  /* Copies made for it into and out of the accelerator's memory (totals
   * since start, readable until put; zeros when there are none). May run
   * on any thread. */
  void (*copies)(struct lynx_accel_inst *in, struct lynx_accel_copies *out);
  /* Stops it and waits (bounded). 0, or -ETIMEDOUT when it did not stop
   * (its memory is then kept until the agent exits, never freed under
   * it). Counters stay readable. */
  int (*stop)(struct lynx_accel_inst *in);
  /* Drops the handle, after stop and after the transport freed the region
   * (memory the transport still holds goes when it releases it). */
  void (*put)(struct lynx_accel_inst *in);
  /* The device as of now: *lost when it no longer answers, *failed when its
   * last error is sticky (unusable until reset), that error in err ("":
   * none). */
  void (*health)(const struct lynx_accel_dev *a, int *lost, int *failed,
                 char *err, size_t errlen);
  /* The device's budget of resident blocks for kernels of threads threads
   * per block: *resident an empty device keeps at once, *held those the
   * agent's running kernels hold (both 0 where there is no such limit: a
   * CPU). 0, or -errno when the device cannot say. */
  int (*blocks)(const struct lynx_accel_dev *a, uint32_t threads,
                uint32_t *resident, uint32_t *held);
  /* At exit, once every instance is put: gives the backend's memory back. */
  void (*shutdown)(void);
};

/* A backend's table from its functions, each named <prefix>_<member>: one
 * place maps members to functions, and a backend that lacks one does not
 * compile (none is ever NULL). */
#define LYNX_ACCEL_OPS(kind_, noun_, prefix)                                   \
  {                                                                            \
    .kind = kind_, .noun = noun_, .discover = prefix##_discover,               \
    .runs_app = prefix##_runs_app, .adopt = prefix##_adopt,                    \
    .client_mqs = prefix##_client_mqs, .start = prefix##_start,                \
    .fence = prefix##_fence, .counters = prefix##_counters,                    \
    .latency = prefix##_latency, .copies = prefix##_copies,                    \
    .stop = prefix##_stop, .put = prefix##_put, .health = prefix##_health,     \
    .blocks = prefix##_blocks, .shutdown = prefix##_shutdown                   \
  }

extern const struct lynx_accel_ops lynx_accel_cpu;  /* cpu_accel.c */
extern const struct lynx_accel_ops lynx_accel_cuda; /* accel/cuda/ */

#endif
