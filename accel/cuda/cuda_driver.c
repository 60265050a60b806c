/*
 * cuda_driver.c - what the CUDA backend reaches without linking it: the
 * driver API's entry points (through the runtime) and gdrcopy (dlopen).
 *
 * The agent never links libcuda: driver calls (dma-buf export, pointer
 * attributes: cuda_region.c) go through cudaGetDriverEntryPointByVersion.
 * gdrcopy, when libgdrapi is installed and its gdrdrv module loaded, maps
 * GPU memory into the CPU for the tcp transport's accesses (cuda_stage.c).
 */
#include <dlfcn.h>
#include <pthread.h>

#include <cuda_runtime_api.h>

#include "cuda_internal.h"
#include "log.h"

/* ---- driver entry points (no link against libcuda) ------------------ */

void *lynx__cuda_driver_fn(const char *name) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault,
                                       &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess)
    return NULL;
  return fn;
}

/* ---- gdrcopy, when libgdrapi is installed (dlopen) ------------------ */

struct lynx__cuda_gdr lynx__cuda_gdr = {.once = PTHREAD_ONCE_INIT};

static void gdr_load(void) {
  void *h = dlopen("libgdrapi.so.2", RTLD_NOW | RTLD_LOCAL);
  gdr_t (*open_fn)(void);
  if (!h)
    return; /* not installed: cudaMemcpyAsync serves the tcp transport */
  open_fn = (gdr_t(*)(void))dlsym(h, "gdr_open");
  *(void **)&lynx__cuda_gdr.pin = dlsym(h, "gdr_pin_buffer");
  *(void **)&lynx__cuda_gdr.unpin = dlsym(h, "gdr_unpin_buffer");
  *(void **)&lynx__cuda_gdr.map = dlsym(h, "gdr_map");
  *(void **)&lynx__cuda_gdr.unmap = dlsym(h, "gdr_unmap");
  *(void **)&lynx__cuda_gdr.to = dlsym(h, "gdr_copy_to_mapping");
  *(void **)&lynx__cuda_gdr.from = dlsym(h, "gdr_copy_from_mapping");
  if (!open_fn || !lynx__cuda_gdr.pin || !lynx__cuda_gdr.unpin ||
      !lynx__cuda_gdr.map || !lynx__cuda_gdr.unmap || !lynx__cuda_gdr.to ||
      !lynx__cuda_gdr.from) {
    LYNX_WARN("cuda", "libgdrapi.so.2 lacks the gdrcopy 2.x API: not used");
    dlclose(h);
    return;
  }
  lynx__cuda_gdr.g = open_fn(); /* NULL without the gdrdrv kernel module */
  if (!lynx__cuda_gdr.g) {
    LYNX_INFO("cuda", "gdrcopy installed but gdr_open failed (is the gdrdrv "
                      "module loaded?): the tcp transport copies with "
                      "cudaMemcpyAsync");
    dlclose(h);
  }
}

void lynx__cuda_gdr_open(void) { pthread_once(&lynx__cuda_gdr.once, gdr_load); }
