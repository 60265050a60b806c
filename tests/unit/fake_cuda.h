/*
 * fake_cuda.h - a fake CUDA runtime for unit_cuda_backend.
 *
 * fake_cuda.c defines every CUDA runtime function accel/cuda/cuda_accel.c calls
 * (the exact symbols the real headers map them to), the kernel-side
 * interface of accel/cuda/lynx_cuda.h, the two driver entry points it looks
 * up (cuMemGetHandleForAddressRange, cuPointerSetAttribute) and the verbs
 * registrations (ibv_reg_dmabuf_mr, ibv_reg_mr). Host memory registered
 * with cudaHostRegister maps to itself (cudaHostGetDevicePointer returns
 * the same address), so a fake kernel serves a host region in place; an
 * unregistration while a kernel serves that memory is counted
 * (unmapped_live), as is one of memory never registered (bad_unregisters).
 * Device memory is host
 * memory; every call is recorded; the test sets the GPUs and injects
 * errors. A launched "persistent kernel" is a thread that serves the region
 * with the real ring code (include/lynx/mqueue.h), echoing, until it sees
 * kctl->stop (or never: a hung kernel), and writes its counters into
 * kctl->blocks; for mc-get and face-verify it calls the back end through
 * each block's own client mqueue as apps.cu does, with the shared logic
 * (app_logic.h, face.h), so a test playing the frontend's relay by hand
 * sees the kernel's requests and answers.
 *
 * Pinned host memory (cudaHostAlloc) is host memory the fake knows;
 * events (cudaEventCreateWithFlags, Record, Query, Synchronize, Destroy)
 * mark a point in their stream. Copies complete at the call, except with
 * defer_copies set: a copy from or to pinned memory then stays in flight,
 * as a DMA would, until its stream is synchronised, an event recorded
 * after it is waited for (or queried, with query_completes), or another
 * copy or memset on the stream needs it done first. A source that changed
 * between the call and the copy's completion is counted (src_races: the
 * caller reused a buffer the copy was still reading), and bytes copied to
 * the host are not there before completion.
 *
 * Checks a real GPU would turn into a hang or corruption are counted
 * instead: a copy or memset touching no live allocation (bad_copies), a
 * cudaFree of something not allocated or freed twice (bad_frees), and
 * calls that wait for a running persistent kernel (blocking_calls:
 * cudaFree, cudaDeviceSynchronize on its device, cudaStreamSynchronize of
 * its stream, cudaFreeHost on its device). With block_calls set, the calls
 * a driver may make wait for the device (page-locking, allocation) do wait
 * while a kernel runs on theirs.
 */
#ifndef LYNX_FAKE_CUDA_H
#define LYNX_FAKE_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "lynx_cuda.h"

#define FAKE_GPUS 8
#define FAKE_LOG 8192

struct fake_gpu {
  char name[256];
  char pci_bus_id[32];
  size_t memory;
  int major, minor, sms;
  int gpudirect_rdma;  /* cudaDevAttrGPUDirectRDMASupported */
  int writes_ordering; /* cudaDevAttrGPUDirectRDMAWritesOrdering */
};

struct fake_kernel;

/* What a module handler returns to fault as a kernel that dereferences a
 * bad address does: the kernel ends, its GPU's context poisoned
 * (cudaErrorIllegalAddress). */
#define FAKE_TRAP (-2)

/* One copy or memset, in call order. */
struct fake_op {
  int memset; /* 0: cudaMemcpyAsync */
  enum cudaMemcpyKind kind;
  cudaStream_t stream;
  const void *dev; /* the device side */
  size_t len;
  uint32_t word; /* H2D: the first 4 bytes copied (when len >= 4) */
};

struct fake_cuda {
  /* set by the test */
  int n_gpus;
  struct fake_gpu gpu[FAKE_GPUS];
  cudaError_t err_device_count;        /* cudaGetDeviceCount */
  int driver_version, runtime_version; /* cudaDriverGetVersion, ... */
  cudaError_t err_properties;          /* cudaGetDeviceProperties */
  cudaError_t err_attr[FAKE_GPUS];     /* cudaDeviceGetAttribute(PciBusId) */
  cudaError_t err_malloc;              /* cudaMalloc */
  cudaError_t err_memcpy_once;         /* the next cudaMemcpyAsync */
  int err_launch;                      /* lynx_cuda_start's return */
  int hang_next;                       /* the next kernel ignores stop */
  uint32_t resident;                   /* lynx_cuda_resident_blocks */
  /* blocks resident at once on one GPU, every kernel's together (0: no
   * limit). A launch's blocks beyond what is left do not start
   * (kctl->started counts those that did) until a kernel of that GPU
   * ends. */
  uint32_t capacity;
  int no_get_handle;                /* cuMemGetHandleForAddressRange absent */
  CUresult err_get_handle;          /* ... fails */
  int err_dmabuf_mr, err_reg_mr;    /* errno: the registration fails */
  cudaError_t err_host_register;    /* cudaHostRegister */
  cudaError_t err_host_devptr;      /* cudaHostGetDevicePointer */
  cudaError_t err_host_alloc;       /* cudaHostAlloc */
  cudaError_t err_event_create;     /* cudaEventCreateWithFlags */
  cudaError_t err_stream_sync_once; /* the next cudaStreamSynchronize */
  cudaError_t err_event_sync_once;  /* the next cudaEventSynchronize */
  /* cudaMalloc, cudaHostAlloc, cudaHostRegister and cudaHostUnregister
   * wait while a kernel runs on the current device (counted in
   * blocked_calls), as a driver that makes them wait for the device would
   * (make gpu-prove's probe says whether one does) */
  int block_calls;
  int defer_copies; /* copies from/to pinned memory stay in flight */
  /* %globaltimer moves in steps of this many ns (0: every ns), as some
   * GPUs' does in steps of about 1 us */
  uint64_t timer_step_ns;
  int query_completes; /* ... and cudaEventQuery completes them */
  /* CUDA modules (cuLibraryLoadData and the rest, through the driver's
   * entry points): a module's kernels and globals are found by their
   * names in its bytes; a GPU finds code in it when a cubin for its
   * compute capability or PTX of one at most its own is there (the fatbin's
   * entries, read by the fake itself), and a global's value is its
   * symbol's in that GPU's cubin (a module with PTX only has none here).
   * A module's kernel answers each request with module_handler's answer
   * (a host twin of the module's handler: its length, or -1 to drop the
   * request). */
  CUresult err_library_load;  /* cuLibraryLoadData */
  CUresult err_module_launch; /* cuLaunchKernel */
  int module_per_sm;          /* occupancy of a module's kernel (0: 1) */
  int (*module_handler)(const struct lynx_cuda_launch *l, const uint8_t *req,
                        uint32_t len, uint8_t *out, uint32_t cap);
  int library_loads, library_unloads, module_launches, occupancy_queries,
      get_functions;
  /* A GPU whose context a kernel's fault poisoned (a module handler's
   * FAKE_TRAP): every call on it returns this sticky error from then on,
   * as on a GPU (cudaSuccess: none) */
  cudaError_t poisoned[FAKE_GPUS];

  /* recorded */
  int get_device_count, set_device, mallocs, frees, bad_frees, memsets, memcpys,
      bad_copies, stream_creates, stream_destroys, stream_syncs, queries,
      device_syncs, blocking_calls, launches, get_handles, set_attrs,
      dmabuf_mrs, reg_mrs, host_registers, host_unregisters, bad_unregisters,
      unmapped_live, host_allocs, host_frees, event_creates, event_destroys,
      event_records, event_queries, event_syncs, deferred, src_races,
      blocked_calls;
  size_t malloc_bytes;          /* bytes cudaMalloc gave, all calls */
  unsigned host_alloc_flags;    /* the last cudaHostAlloc's flags */
  unsigned host_register_flags; /* the last cudaHostRegister's flags */
  int n_ops;
  struct fake_op ops[FAKE_LOG];
  CUdeviceptr sync_memops_ptr; /* cuPointerSetAttribute(SYNC_MEMOPS) */
  CUdeviceptr handle_ptr;      /* cuMemGetHandleForAddressRange */
  size_t handle_size;
  int handle_fd; /* the fd it returned */
  struct {       /* the last ibv_reg_dmabuf_mr */
    void *pd;
    uint64_t offset, iova;
    size_t length;
    int fd, access;
  } dmabuf;
  struct { /* the last ibv_reg_mr */
    void *pd, *addr;
    size_t length;
    int access;
  } regmr;
};

extern struct fake_cuda fake;

/* A launched kernel: what lynx_cuda_start was given. */
struct fake_kernel {
  struct lynx_cuda_launch l;
  cudaStream_t stream;
  int device;
  int hang;               /* ignores kctl->stop */
  uint32_t resident;      /* of its blocks, those that started (capacity) */
  int running;            /* the thread serves */
  cudaError_t crashed;    /* cudaStreamQuery reports it once the thread ended */
  uint64_t fenced_passes; /* mqueue turns skipped for the lease fence */
  uint64_t launch_fence;  /* kctl->serve_until_gt when it was launched */
  uint64_t calls;         /* client mqueue calls made (mc-get, face-verify) */
  const char *function;   /* a module's kernel: the one launched (NULL:
                             lynx_cuda_start's) */
  int last_call_rc;       /* the last one's: 0 or a LYNX_CALL_* code */
};

/* The fake %globaltimer: the host's monotonic clock plus an offset, so a
 * deadline the agent forgets to convert shows. */
#define FAKE_GT_OFFSET_NS (5000ull * 1000000000ull)
uint64_t fake_cuda_globaltimer(void);

/* Forgets recorded calls and injections (not the GPUs, not allocations). */
void fake_cuda_reset(void);
/* n identical-but-numbered GPUs ("Fake GPU i", 0000:0i:00.0, 80 GiB,
 * sm_90, 132 SMs, GPUDirect RDMA, writes ordering owner). */
void fake_cuda_gpus(int n);
/* The i-th kernel launched since the start (NULL when there is none). */
struct fake_kernel *fake_cuda_kernel(int i);
int fake_cuda_kernels(void);
/* The kernel dies: its thread ends, its stream reports e. */
void fake_cuda_crash(struct fake_kernel *k, cudaError_t e);
/* Host ranges registered and not unregistered. */
int fake_cuda_host_registered(void);
/* Device allocations not freed; whether p is one. */
int fake_cuda_live(void);
int fake_cuda_is_live(const void *p);
/* Copies (cudaMemcpyAsync) recorded from op index from on, on stream s
 * (NULL: on any stream). */
int fake_cuda_copies(int from, cudaStream_t s);
/* Pinned allocations not freed. */
int fake_cuda_pinned_live(void);
/* Copies in flight (defer_copies); completes all of them. */
int fake_cuda_inflight(void);
void fake_cuda_complete(void);
/* At exit: ends every kernel thread (hung ones too) and frees whatever
 * device memory, streams and MRs are left. */
void fake_cuda_reap(void);

#endif
