/*
 * gpu.h - the CUDA backend's own API: GPUs as accelerators.
 *
 * Discovery (--cuda-accels all|0,1,...), and instances whose mqueue region
 * lives in GPU memory (cudaMalloc) with the application running as a
 * persistent kernel (accel/cuda). The transport reaches the region through
 * struct lynx_region_mem: tcp with cudaMemcpyAsync on a dedicated stream
 * through pinned staging, in batches (gdrcopy's CPU mapping when libgdrapi
 * is present), rdma with dma-buf
 * registration (cuMemGetHandleForAddressRange + ibv_reg_dmabuf_mr), falling
 * back to ibv_reg_mr on the device pointer (nvidia-peermem).
 *
 * Implemented by the cuda_*.c files (cuda_accel.c says what each holds),
 * built when the CUDA toolkit is (LYNX_CUDA=ON|AUTO). The agent reaches it
 * through the accelerator ops table (accel.h, lynx_accel_cuda at the end
 * of cuda_accel.c); the unit test unit_cuda_backend calls it directly.
 * Without the toolkit, cuda_none.c's table says that the agent was built
 * without CUDA. docs/gpu.md.
 */
#ifndef LYNX_CUDA_GPU_H
#define LYNX_CUDA_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "accel.h"
#include "transport.h"

struct gpu_info {
  int device; /* CUDA ordinal */
  char name[64];
  char pci_bus_id[32];
  int numa_node; /* sysfs's numa_node of its PCI device; -1: none known */
  uint64_t memory;
  int cc_major, cc_minor, sms;
  int gpudirect_rdma;            /* cudaDevAttrGPUDirectRDMASupported */
  uint32_t rdma_writes_ordering; /* cudaDevAttrGPUDirectRDMAWritesOrdering */
  uint32_t ordering; /* enum lynx_ordering it needs: fenced without native
                        ordering of GPUDirect RDMA writes */
};

/* 1 when this agent was built with the CUDA backend. */
int gpu_built(void);

/* Finds the GPUs spec names ("all" or "0,1,..."): *out (free it) of *n.
 * 0, or -errno with a message naming CUDA/the GPU in err (no driver, no
 * device, an ordinal that does not exist, a malformed list). */
int gpu_discover(const char *spec, struct gpu_info **out, uint32_t *n,
                 char *err, size_t errlen);

struct gpu_instance;

/* Starts l->app's kernel on GPU l->acc: allocates the region in GPU memory,
 * attaches it to the transport (r), formats and exports it (or, where
 * l->acc does not own the memory, maps the caller's host region l->region
 * into the GPU), and launches the persistent kernel. 0 or -errno with the
 * reason in err; on error nothing is left (r freed, or a host region
 * unmapped from the GPU and left to its owner). */
int gpu_instance_start(const struct lynx_accel_launch *l, struct lynx_region *r,
                       struct gpu_instance **out, char *err, size_t errlen);

/* Asks the kernel to stop and waits for it (bounded); a host region is
 * then unmapped from the GPU (its owner may free it). 0, or -ETIMEDOUT
 * when it did not stop (a hung kernel: its memory is then kept until the
 * agent exits, never freed under it; a host region stays pinned). Counters
 * stay readable. */
int gpu_instance_stop(struct gpu_instance *gi);

/* Moves the kernel's lease fence: it takes no new request once the host's
 * monotonic clock (lynx_now_ns) would read serve_until_ns (UINT64_MAX: no
 * fence). The deadline is converted to the GPU's %globaltimer with an
 * offset measured from what the kernel publishes, rounded so that the GPU
 * stops no later than the host deadline. 0 or -errno. */
int gpu_instance_fence(struct gpu_instance *gi, uint64_t serve_until_ns);

/* The kernel's counters (summed over its blocks). 0 or -errno. */
int gpu_instance_counters(struct gpu_instance *gi, uint64_t *req,
                          uint64_t *resp, uint64_t *drops, uint64_t *bad);

/* The kernel's queueing and service times (summed over its blocks,
 * %globaltimer ns, totals since start; kept at stop). 0 or -errno (the
 * last histograms read are still set). */
int gpu_instance_latency(struct gpu_instance *gi, struct lynx_lat *out);

/* Drops the instance's handle; the region's memory goes when the
 * transport releases it (after tops->region_free). */
void gpu_instance_put(struct gpu_instance *gi);

/* How the transport reached an instance's region in GPU memory (tcp,
 * docs/gpu.md): totals since start. */

/* The instance's copy counters (logged when its memory goes). */
void gpu_instance_copy_stats(struct gpu_instance *gi,
                             struct lynx_accel_copies *st);

/* At exit, after every instance stopped: gives device memory back. */
void gpu_shutdown(void);

/* Health of GPU device, as of now: *lost when it no longer answers, the
 * last error any call on it or any of its kernels reported (err, "" for
 * none), *failed when that error is sticky (the context is unusable). */
void gpu_health(const struct gpu_info *g, int *lost, int *failed, char *err,
                size_t errlen);

#endif
