/*
 * cuda_discover.c - finding the GPUs --cuda-accels names (gpu_discover,
 * gpu.h): the list's parsing, and each device's properties as struct
 * gpu_info (memory, compute capability, GPUDirect RDMA and the ordering of
 * its writes, hence the mqueue ordering the region needs).
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_internal.h"
#include "gpu.h"
#include "log.h"
#include "mqueue.h"

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
      snprintf(err, errlen,
               "--cuda-accels '%s': expected 'all' or GPU "
               "ordinals like 0,1",
               spec);
      return -EINVAL;
    }
    if (v >= count) {
      snprintf(err, errlen,
               "--cuda-accels: CUDA GPU %ld does not exist "
               "(this host has %d)",
               v, count);
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

#ifndef LYNX_CUDA_MIN_CC /* CMake passes the build's (accel/cuda/) */
#define LYNX_CUDA_MIN_CC 80
#define LYNX_CUDA_ARCHS_TEXT "sm_80, sm_90"
#endif

/* "13.0" of a CUDA version number (13000), "none" for 0 */
static const char *cuda_version(int v, char *buf, size_t len) {
  if (v <= 0)
    snprintf(buf, len, "none");
  else
    snprintf(buf, len, "%d.%d", v / 1000, v % 1000 / 10);
  return buf;
}

#ifndef PCI_SYSFS /* unit_cuda_backend's own tree */
#define PCI_SYSFS "/sys/bus/pci/devices"
#endif

/* The NUMA node sysfs gives the PCI device bus_id ("0000:3B:00.0", as
 * CUDA writes it; sysfs's names are lower case), or -1: none (no such
 * file, or the kernel knows no node: -1 there too). */
static int pci_numa_node(const char *bus_id) {
  char path[128], id[32];
  int node = -1;
  size_t k;
  FILE *f;
  for (k = 0; bus_id[k] && k + 1 < sizeof(id); k++)
    id[k] = (char)tolower((unsigned char)bus_id[k]);
  id[k] = 0;
  snprintf(path, sizeof(path), "%s/%s/numa_node", PCI_SYSFS, id);
  f = fopen(path, "r");
  if (!f)
    return -1;
  if (fscanf(f, "%d", &node) != 1 || node < 0)
    node = -1;
  fclose(f);
  return node;
}

int gpu_discover(const char *spec, struct gpu_info **out, uint32_t *n,
                 char *err, size_t errlen) {
  int count = 0, ids[GPU_MAX], rc, drv = 0, rt = 0;
  char dv[16], rv[16];
  struct gpu_info *g;
  cudaError_t e;
  /* Before the runtime's first call, which reads it: modules load at
   * start, not at a kernel's first launch (CUDA 12's default is lazy),
   * where loading a later instance's module could wait behind the
   * persistent kernels already running. An operator's own setting stays. */
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  e = cudaGetDeviceCount(&count);
  *out = NULL;
  *n = 0;
  /* the driver's CUDA version answers even where it is too old for the
   * runtime (static: the build's) */
  if (cudaDriverGetVersion(&drv) != cudaSuccess)
    drv = 0;
  if (cudaRuntimeGetVersion(&rt) != cudaSuccess)
    rt = 0;
  cuda_version(drv, dv, sizeof(dv));
  cuda_version(rt, rv, sizeof(rv));
  if (e != cudaSuccess) {
    char drvs[96];
    if (drv > 0)
      snprintf(drvs, sizeof(drvs), "the driver supports CUDA %s", dv);
    else
      snprintf(drvs, sizeof(drvs), "no NVIDIA driver answers");
    snprintf(err, errlen,
             "--cuda-accels %s: no usable CUDA GPU: "
             "cudaGetDeviceCount: %s (%s); %s, this build's runtime is "
             "CUDA %s",
             spec, cudaGetErrorName(e), cudaGetErrorString(e), drvs, rv);
    return -ENODEV;
  }
  if (count == 0) {
    snprintf(err, errlen, "--cuda-accels %s: no CUDA GPU on this host", spec);
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
    g[i].numa_node = pci_numa_node(g[i].pci_bus_id);
    g[i].memory = p.totalGlobalMem;
    g[i].cc_major = p.major;
    g[i].cc_minor = p.minor;
    g[i].sms = p.multiProcessorCount;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrGPUDirectRDMASupported, ids[i]) ==
        cudaSuccess)
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
    if (p.major * 10 + p.minor < LYNX_CUDA_MIN_CC) {
      snprintf(err, errlen,
               "CUDA GPU %d (%s) has compute capability %d.%d; this build's "
               "kernels are for %s (compute capability %d.%d or newer): "
               "build with LYNX_CUDA_ARCHS naming %d%d",
               ids[i], p.name, p.major, p.minor, LYNX_CUDA_ARCHS_TEXT,
               LYNX_CUDA_MIN_CC / 10, LYNX_CUDA_MIN_CC % 10, p.major, p.minor);
      free(g);
      *n = 0;
      return -ENODEV;
    }
  }
  LYNX_INFO("cuda", "CUDA driver %s, runtime %s (static, kernels for %s)", dv,
            rv, LYNX_CUDA_ARCHS_TEXT);
  *out = g;
  return 0;
}
