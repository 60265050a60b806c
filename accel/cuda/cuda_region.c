/*
 * cuda_region.c - an instance's region: in device memory (allocated,
 * aligned to the 64 KiB GPU page GPUDirect RDMA and gdrcopy pin, mapped by
 * gdrcopy where it can be) or a host region mapped into the GPU; its
 * memory as the transport reaches it (struct lynx_region_mem), RDMA
 * registration included; and the instance's reference count, whose last
 * put frees it all.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <linux/mempolicy.h>

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <infiniband/verbs.h>

#include "cuda_internal.h"
#include "gpu.h"
#include "log.h"
#include "util.h"

#define GPU_PAGE (64u * 1024u)

typedef CUresult (*pfn_get_handle)(void *handle, CUdeviceptr dptr, size_t size,
                                   CUmemRangeHandleType type,
                                   unsigned long long flags);
typedef CUresult (*pfn_set_attr)(const void *value,
                                 CUpointer_attribute attribute,
                                 CUdeviceptr ptr);

/* RDMA registration of GPU memory: dma-buf first (upstream kernels, open
 * GPU module), then the device pointer as is (nvidia-peermem). */
static int mem_reg_mr(void *ctx, void *pd, uint64_t off, size_t len, int access,
                      void **mr, char *err, size_t errlen) {
  struct gpu_instance *gi = ctx;
  char dmabuf_why[96] = "";
  struct ibv_mr *m = NULL;
  if (lynx_bounds_ok(gi->alloc, off, len))
    return -EFAULT;
  pthread_mutex_lock(&gi->lock);
  if (gi->dmabuf_fd == -1) {
    pfn_get_handle get =
        (pfn_get_handle)lynx__cuda_driver_fn("cuMemGetHandleForAddressRange");
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
      snprintf(err, errlen,
               "GPU %d: neither dma-buf (%s) nor "
               "nvidia-peermem (ibv_reg_mr: %s) registers its memory; load "
               "nvidia-peermem, or use the open GPU kernel module with a "
               "dma-buf capable kernel (5.12+) and NIC driver",
               gi->device, dmabuf_why[0] ? dmabuf_why : "not tried",
               strerror(errno));
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

/* Unmaps a host region from the GPU (its kernel is gone): the
 * unregistration and the unmapping of our mapping are queued (cuda_calls.c:
 * the driver may make it wait for the device, which other instances'
 * kernels keep busy), so this never waits. */
void lynx__cuda_host_unmap(struct gpu_instance *gi) {
  if (!gi->host)
    return;
  lynx__cuda_call_unregister(gi->device, gi->host, gi->host_map_len);
  gi->host = NULL;
}

/* Host memory the GPU reads across PCIe goes on the GPU's NUMA node: the
 * registration that follows faults in and pins every page there, and the
 * pages already touched (the transport formatted the region) move. A
 * preference, not a binding: a full node still gives memory elsewhere.
 * Where it cannot be done the region stays where it is, said once. */
static void place_near(struct gpu_instance *gi, void *p, size_t len) {
  static int warned;
  unsigned long mask[16] = {0};
  const unsigned long bits = 8 * sizeof(mask[0]);
  if (gi->numa_node < 0 || (unsigned long)gi->numa_node >= 16 * bits)
    return;
  mask[gi->numa_node / bits] = 1ul << (gi->numa_node % bits);
  if (syscall(SYS_mbind, p, len, MPOL_PREFERRED, mask, 16 * bits,
              MPOL_MF_MOVE) != 0 &&
      !__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
    LYNX_WARN("cuda",
              "GPU %d: cannot place its host regions on NUMA node %d "
              "(mbind: %s): they stay where the transport put them",
              gi->device, gi->numa_node, strerror(errno));
}

/* A formatted region in host memory (the transport's), pinned and mapped
 * into the GPU: the kernel reaches it across PCIe at gi->base, with the
 * same acquire loads and release stores as GPU memory (mqueue.md); the
 * frontend (shm) or the tcp agent reach it with plain stores.
 *
 * What is registered is a second mapping of the region's pages, the
 * backend's own (mremap with an old size of 0: the transports map their
 * regions shared, transport.h), so that its unregistration may come after
 * the transport has unmapped its own (lynx__cuda_host_unmap). */
int lynx__cuda_map_host(struct gpu_instance *gi, uint8_t *host, uint64_t size,
                        char *err, size_t errlen) {
  size_t map_len = lynx_align_up(size, (uint64_t)sysconf(_SC_PAGESIZE));
  void *dev = NULL, *ours;
  cudaError_t e = cudaStreamCreateWithFlags(&gi->copy, cudaStreamNonBlocking);
  if (e == cudaSuccess)
    e = cudaStreamCreateWithFlags(&gi->kern, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    lynx__cuda_note(gi->device, e, "host region mapping");
    snprintf(err, errlen, "GPU %d: streams: %s", gi->device,
             cudaGetErrorString(e));
    return lynx__cuda_errno(e);
  }
  ours = mremap(host, 0, map_len, MREMAP_MAYMOVE);
  if (ours == MAP_FAILED) {
    int rc = -errno;
    snprintf(err, errlen,
             "GPU %d: cannot map a %llu-byte host region a second time "
             "(mremap: %s; the transport must map it shared)",
             gi->device, (unsigned long long)size, strerror(-rc));
    return rc;
  }
  place_near(gi, ours, map_len);
  e = lynx__cuda_call_register(gi->device, ours, size, map_len);
  if (e == cudaErrorNotReady) { /* the calls thread undoes it, later */
    snprintf(err, errlen,
             "GPU %d: cudaHostRegister of a %llu-byte host region did not "
             "return within %u ms: this driver makes it wait for the "
             "device, which running persistent kernels keep busy (%u "
             "blocks of this agent's run there; docs/gpu.md)",
             gi->device, (unsigned long long)size, CALL_WAIT_MS,
             lynx__cuda_blocks_held(gi->device));
    return -EBUSY;
  }
  if (e == cudaSuccess) {
    gi->host = ours;
    gi->host_map_len = map_len;
    e = cudaHostGetDevicePointer(&dev, ours, 0);
  } else {
    munmap(ours, map_len);
  }
  if (e != cudaSuccess) {
    lynx__cuda_note(gi->device, e, "host region mapping");
    snprintf(err, errlen,
             "GPU %d: cannot map a %llu-byte host region into "
             "the GPU: %s",
             gi->device, (unsigned long long)size, cudaGetErrorString(e));
    return lynx__cuda_errno(e);
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
    LYNX_ERR("cuda",
             "GPU %d: keeping %llu bytes of a region whose kernel "
             "did not stop, until the agent exits",
             gi->device, (unsigned long long)gi->alloc);
    return;
  }
  if (gi->holds_blocks) /* put without a stop: its kernel is gone */
    lynx__cuda_blocks_hold(gi->device, gi->blocks, 0);
  lynx__cuda_host_unmap(gi);
  if (gi->gva) {
    lynx__cuda_gdr.unmap(lynx__cuda_gdr.g, gi->gmh, gi->gva, gi->alloc);
    lynx__cuda_gdr.unpin(lynx__cuda_gdr.g, gi->gmh);
  }
  if (gi->dmabuf_fd >= 0)
    close(gi->dmabuf_fd);
  lynx__cuda_stage_fini(gi); /* before its stream goes */
  if (gi->copy)
    cudaStreamDestroy(gi->copy);
  if (gi->kern)
    cudaStreamDestroy(gi->kern);
  lynx__cuda_dev_free(gi->device, gi->kctl, gi->kctl_size);
  lynx__cuda_dev_free(gi->device, gi->params, gi->params_size);
  lynx__cuda_dev_free(gi->device, gi->raw, gi->raw_size);
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
int lynx__cuda_region_alloc(struct gpu_instance *gi, uint64_t size, char *err,
                            size_t errlen) {
  cudaError_t e;
  pfn_set_attr set_attr;
  gi->alloc = lynx_align_up(size, GPU_PAGE);
  e = cudaStreamCreateWithFlags(&gi->copy, cudaStreamNonBlocking);
  if (e == cudaSuccess)
    e = cudaStreamCreateWithFlags(&gi->kern, cudaStreamNonBlocking);
  if (e == cudaSuccess)
    e = lynx__cuda_dev_alloc(gi->device, gi->alloc + GPU_PAGE, gi->copy,
                             &gi->raw, &gi->raw_size);
  if (e != cudaSuccess) {
    lynx__cuda_note(gi->device, e, "region allocation");
    snprintf(err, errlen, "GPU %d: cannot allocate a %llu-byte region: %s",
             gi->device, (unsigned long long)size, lynx__cuda_strerror(e));
    return lynx__cuda_errno(e);
  }
  gi->base = (uint8_t *)lynx_align_up((uintptr_t)gi->raw, GPU_PAGE);
  gi->size = size;
  /* GPUDirect RDMA: memory operations on this range synchronise with
   * peer accesses (CUDA's GPUDirect RDMA guide) */
  set_attr = (pfn_set_attr)lynx__cuda_driver_fn("cuPointerSetAttribute");
  if (set_attr) {
    unsigned one = 1;
    if (set_attr(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS,
                 (CUdeviceptr)(uintptr_t)gi->base) != CUDA_SUCCESS)
      LYNX_DBG("cuda", "GPU %d: cannot set SYNC_MEMOPS on the region",
               gi->device);
  }
  lynx__cuda_gdr_open();
  if (lynx__cuda_gdr.g) {
    if (lynx__cuda_gdr.pin(lynx__cuda_gdr.g, (unsigned long)(uintptr_t)gi->base,
                           gi->alloc, 0, 0, &gi->gmh) == 0) {
      if (lynx__cuda_gdr.map(lynx__cuda_gdr.g, gi->gmh, &gi->gva, gi->alloc) !=
          0) {
        lynx__cuda_gdr.unpin(lynx__cuda_gdr.g, gi->gmh);
        gi->gva = NULL;
      }
    }
    LYNX_INFO("cuda", "GPU %d: tcp transport copies %s", gi->device,
              gi->gva ? "through gdrcopy's CPU mapping"
                      : "with cudaMemcpyAsync (gdrcopy could not map)");
  }
  return 0;
}

/* The region's memory as the transport reaches it (gi->mem, for
 * tops->region_attach): the tcp transport's copies (cuda_stage.c), its
 * batch ops only where the instance stages; RDMA registration; the
 * release of the transport's reference. */
void lynx__cuda_region_mem(struct gpu_instance *gi) {
  gi->mem = (struct lynx_region_mem){
      .kind = "cuda",
      .write = lynx__cuda_mem_write,
      .read = lynx__cuda_mem_read,
      .write_start = gi->stg.buf ? lynx__cuda_mem_write_start : NULL,
      .read_start = gi->stg.buf ? lynx__cuda_mem_read_start : NULL,
      .flush = gi->stg.buf ? lynx__cuda_mem_flush : NULL,
      .reg_mr = mem_reg_mr,
      .release = mem_release,
      .dev_addr = (uintptr_t)gi->base,
      .ctrl_mirror = gi->stg.buf ? gi->stg.mirror : NULL,
      .ctx = gi,
  };
}
