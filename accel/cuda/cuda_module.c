/*
 * cuda_module.c - GPU applications as CUDA modules (docs/writing-apps.md,
 * "GPU applications"): a fatbin of the SDK's persistent kernel
 * (include/lynx/lynx_kernel.cuh) over a user's handler, loaded, checked,
 * sized and launched through the CUDA driver API's library loading.
 *
 * The driver's calls come through cudaGetDriverEntryPointByVersion
 * (lynx__cuda_driver_fn): the agent never links libcuda. A module is
 * loaded once (cuLibraryLoadData) when the agent has found its GPUs, and
 * its two kernels resolved for each of them then (cuKernelGetFunction),
 * before any persistent kernel runs: loading code into a context while a
 * persistent kernel of that context spins is what the driver may make
 * wait. A GPU without code of its own in the module (no cubin for its
 * architecture, no PTX it can compile) is said then, with what the module
 * carries. The module's description (struct lynx_gpu_app_info, lynx_gpu.h)
 * is read from its global and checked against this agent's layout; its
 * residency per GPU comes from the driver's occupancy query of its own
 * kernel, and it launches by name with the same launch description as the
 * agent's built-in kernel.
 *
 * The modules stay loaded until the agent exits (gpu_shutdown unloads
 * them once no kernel runs).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "apps.h"
#include "cuda_internal.h"
#include "log.h"
#include "lynx_cuda.h"
#include "lynx_gpu.h"

/* The driver's functions a module needs (CUDA 12.0 or later). */
static struct {
  pthread_once_t once;
  int ok;
  CUresult (*load)(CUlibrary *, const void *, CUjit_option *, void **, unsigned,
                   CUlibraryOption *, void **, unsigned);
  CUresult (*unload)(CUlibrary);
  CUresult (*get_kernel)(CUkernel *, CUlibrary, const char *);
  CUresult (*get_function)(CUfunction *, CUkernel);
  CUresult (*get_global)(CUdeviceptr *, size_t *, CUlibrary, const char *);
  CUresult (*set_attr)(CUfunction, CUfunction_attribute, int);
  CUresult (*occupancy)(int *, CUfunction, int, size_t);
  CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned,
                     unsigned, unsigned, unsigned, CUstream, void **, void **);
  CUresult (*err_string)(CUresult, const char **);
} drv = {.once = PTHREAD_ONCE_INIT};

static void drv_load(void) {
  *(void **)&drv.load = lynx__cuda_driver_fn("cuLibraryLoadData");
  *(void **)&drv.unload = lynx__cuda_driver_fn("cuLibraryUnload");
  *(void **)&drv.get_kernel = lynx__cuda_driver_fn("cuLibraryGetKernel");
  *(void **)&drv.get_function = lynx__cuda_driver_fn("cuKernelGetFunction");
  *(void **)&drv.get_global = lynx__cuda_driver_fn("cuLibraryGetGlobal");
  *(void **)&drv.set_attr = lynx__cuda_driver_fn("cuFuncSetAttribute");
  *(void **)&drv.occupancy =
      lynx__cuda_driver_fn("cuOccupancyMaxActiveBlocksPerMultiprocessor");
  *(void **)&drv.launch = lynx__cuda_driver_fn("cuLaunchKernel");
  *(void **)&drv.err_string = lynx__cuda_driver_fn("cuGetErrorString");
  drv.ok = drv.load && drv.unload && drv.get_kernel && drv.get_function &&
           drv.get_global && drv.set_attr && drv.occupancy && drv.launch;
}

static const char *cu_text(CUresult r) {
  const char *s = NULL;
  if (drv.err_string && drv.err_string(r, &s) == CUDA_SUCCESS && s)
    return s;
  return "unknown CUDA driver error";
}

/* The driver's result as the runtime's error, for the per-device record
 * (cuda_health.c): the two number their errors alike. */
static cudaError_t cu_as_rt(CUresult r) { return (cudaError_t)r; }

struct lynx__cuda_module {
  CUlibrary lib;
  CUkernel kernel[2];        /* narrow (<= LYNX_GPU_NARROW_MAX threads), wide */
  CUfunction fn[GPU_MAX][2]; /* resolved in each GPU's context; NULL: none */
  char nocode[GPU_MAX][200]; /* why each GPU without code has none */
  int n_nocode;
  struct lynx_gpu_app_info info;
  const char *app; /* its application's name, for log lines */
  struct lynx__cuda_module *next;
};

static struct lynx__cuda_module *modules; /* the agent's loop thread */

static int kernel_of(uint32_t threads) {
  return threads <= LYNX_GPU_NARROW_MAX ? 0 : 1;
}

/* The module's description, read from its global in the current context,
 * checked against this agent's layout: 0, or -errno with the reason. */
static int read_info(struct lynx__cuda_module *m, char *why, size_t whylen) {
  struct lynx_gpu_app_info *in = &m->info;
  CUdeviceptr p = 0;
  size_t bytes = 0;
  CUresult r = drv.get_global(&p, &bytes, m->lib, LYNX_GPU_INFO_NAME);
  cudaError_t e;
  if (r == CUDA_ERROR_NOT_FOUND) {
    snprintf(why, whylen,
             "no %s: not a Lynx GPU module (it defines its application with "
             "LYNX_GPU_APP, lynx_kernel.cuh)",
             LYNX_GPU_INFO_NAME);
    return -ENOENT;
  }
  if (r != CUDA_SUCCESS) {
    snprintf(why, whylen, "its %s: %s", LYNX_GPU_INFO_NAME, cu_text(r));
    return -EIO;
  }
  memset(in, 0, sizeof(*in));
  if (bytes < 2 * sizeof(uint32_t)) {
    snprintf(why, whylen, "its %s has %zu bytes", LYNX_GPU_INFO_NAME, bytes);
    return -EPROTO;
  }
  e = cudaMemcpy(in, (const void *)(uintptr_t)p,
                 bytes < sizeof(*in) ? bytes : sizeof(*in),
                 cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) {
    snprintf(why, whylen, "reading its %s: %s", LYNX_GPU_INFO_NAME,
             cudaGetErrorString(e));
    return -EIO;
  }
  if (in->abi_version != LYNX_GPU_ABI_VERSION) {
    snprintf(why, whylen,
             "built for GPU ABI version %u; this agent's is %u (rebuild it "
             "against this agent's SDK)",
             in->abi_version, LYNX_GPU_ABI_VERSION);
    return -EPROTO;
  }
  if (in->size != sizeof(*in) || bytes != sizeof(*in) ||
      in->launch_size != sizeof(struct lynx_cuda_launch) ||
      in->kctl_size != sizeof(struct lynx_cuda_kctl) ||
      in->mq_size != sizeof(struct lynx_mq)) {
    snprintf(why, whylen,
             "built with another layout than this agent's (description %u, "
             "launch %u, control block %u, mqueue %u bytes; this agent's "
             "%zu, %zu, %zu, %zu): rebuild it against this agent's SDK",
             in->size, in->launch_size, in->kctl_size, in->mq_size, sizeof(*in),
             sizeof(struct lynx_cuda_launch), sizeof(struct lynx_cuda_kctl),
             sizeof(struct lynx_mq));
    return -EPROTO;
  }
  in->name[sizeof(in->name) - 1] = 0;
  in->needs_backend[sizeof(in->needs_backend) - 1] = 0;
  in->help[sizeof(in->help) - 1] = 0;
  return 0;
}

/* Why GPU dev cannot run the module, when its code holds nothing for it:
 * into why (0), or -1 when it does. */
static int no_code_why(const struct lynx_app *app, int dev, char *why,
                       size_t whylen) {
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  if (lynx_app_image_runs_on(app, (unsigned)(major * 10 + minor)))
    return -1;
  snprintf(why, whylen,
           "no code for GPU %d (compute %d.%d): the module holds %s (build "
           "it with -gencode arch=compute_%d%d,code=sm_%d%d too)",
           dev, major, minor, app->image_code[0] ? app->image_code : "none",
           major, minor, major, minor);
  return 0;
}

/* Both kernels resolved in GPU dev's context: 0, -ENOEXEC when this GPU
 * cannot run them (no code for it, PTX its driver cannot compile: the
 * reason in why), another -errno when the device itself fails. */
static int resolve(struct lynx__cuda_module *m, const struct lynx_app *app,
                   int dev, char *why, size_t whylen) {
  cudaError_t e = cudaSetDevice(dev);
  if (e != cudaSuccess) {
    snprintf(why, whylen, "GPU %d: %s", dev, cudaGetErrorString(e));
    return -ENODEV;
  }
  for (int k = 0; k < 2; k++) {
    CUresult r = drv.get_function(&m->fn[dev][k], m->kernel[k]);
    if (r == CUDA_SUCCESS)
      continue;
    m->fn[dev][0] = m->fn[dev][1] = NULL;
    if (r == CUDA_ERROR_NO_BINARY_FOR_GPU &&
        no_code_why(app, dev, why, whylen) == 0)
      return -ENOEXEC;
    snprintf(why, whylen, "GPU %d cannot load it: %s", dev, cu_text(r));
    /* a JIT or image error is this GPU's (its driver, its architecture);
     * a context that fails is the device's */
    return r == CUDA_ERROR_INVALID_CONTEXT || r == CUDA_ERROR_NOT_INITIALIZED ||
                   r == CUDA_ERROR_DEINITIALIZED ||
                   r == CUDA_ERROR_OUT_OF_MEMORY
               ? -EIO
               : -ENOEXEC;
  }
  return 0;
}

static void module_free(struct lynx__cuda_module *m) {
  if (m->lib)
    drv.unload(m->lib);
  free(m);
}

int lynx__cuda_adopt(const struct lynx_accel_dev *devs, uint32_t n,
                     struct lynx_app *app, char *why, size_t whylen) {
  static const char *const names[2] = {LYNX_GPU_KERNEL_NAME,
                                       LYNX_GPU_KERNEL_WIDE_NAME};
  struct lynx__cuda_module *m;
  uint32_t usable = 0;
  int cur = 0, rc = 0, have_info = 0;
  CUresult r;
  pthread_once(&drv.once, drv_load);
  if (!drv.ok) {
    snprintf(why, whylen,
             "the CUDA driver lacks library loading (cuLibraryLoadData: a "
             "CUDA 12.0 or later driver)");
    return -ENOSYS;
  }
  m = calloc(1, sizeof(*m));
  if (!m) {
    snprintf(why, whylen, "out of memory");
    return -ENOMEM;
  }
  m->app = app->name;
  r = drv.load(&m->lib, app->image, NULL, NULL, 0, NULL, NULL, 0);
  if (r != CUDA_SUCCESS) {
    uint32_t i = 0;
    m->lib = NULL;
    /* loaded eagerly (CUDA_MODULE_LOADING=EAGER, the agent's default), a
     * module is refused whole when one context lacks code: say which */
    if (r == CUDA_ERROR_NO_BINARY_FOR_GPU)
      while (i < n && no_code_why(app, devs[i].device, why, whylen))
        i++;
    if (r != CUDA_ERROR_NO_BINARY_FOR_GPU || i == n)
      snprintf(why, whylen, "the CUDA driver refused the module: %s",
               cu_text(r));
    module_free(m);
    return r == CUDA_ERROR_NO_BINARY_FOR_GPU ? -ENOEXEC : -EIO;
  }
  for (int k = 0; k < 2; k++) {
    r = drv.get_kernel(&m->kernel[k], m->lib, names[k]);
    if (r != CUDA_SUCCESS) {
      snprintf(why, whylen,
               r == CUDA_ERROR_NOT_FOUND
                   ? "no kernel %s: not a Lynx GPU module (it defines its "
                     "application with LYNX_GPU_APP, lynx_kernel.cuh)"
                   : "its kernel %s: %s",
               names[k], cu_text(r));
      module_free(m);
      return r == CUDA_ERROR_NOT_FOUND ? -ENOENT : -EIO;
    }
  }
  cudaGetDevice(&cur);
  for (uint32_t i = 0; i < n && !rc; i++) {
    char err[200];
    int d = devs[i].device;
    if (d < 0 || d >= GPU_MAX)
      continue;
    rc = resolve(m, app, d, err, sizeof(err));
    if (rc == -ENOEXEC) { /* this GPU cannot; others may */
      snprintf(m->nocode[d], sizeof(m->nocode[d]), "%s", err);
      if (!m->n_nocode++)
        snprintf(why, whylen, "%s", err);
      rc = 0;
      continue;
    }
    if (rc) {
      snprintf(why, whylen, "%s", err);
      break;
    }
    usable++;
    if (!have_info) {
      rc = read_info(m, why, whylen);
      have_info = !rc;
    }
  }
  cudaSetDevice(cur);
  if (!rc && !usable) {
    if (!m->n_nocode)
      snprintf(why, whylen, "no GPU");
    rc = -ENOEXEC;
  }
  if (!rc)
    rc = lynx_app_adopt(app, m, m->info.name, m->info.help,
                        m->info.needs_backend, why, whylen);
  if (rc) {
    module_free(m);
    return rc;
  }
  m->app = app->name;
  m->next = modules;
  modules = m;
  for (int d = 0; d < GPU_MAX; d++)
    if (m->nocode[d][0])
      LYNX_WARN("cuda", "GPU application '%s': %s; it runs on the others",
                app->name, m->nocode[d]);
  LYNX_INFO("cuda",
            "GPU application '%s' loaded from %s (%s) for %u of %u GPUs",
            app->name, app->origin, app->image_code, usable, n);
  return 0;
}

int lynx__cuda_module_runs(const struct lynx__cuda_module *m, int device) {
  return device >= 0 && device < GPU_MAX && m->fn[device][0];
}

void lynx__cuda_module_why(const struct lynx__cuda_module *m, int device,
                           char *why, size_t whylen) {
  const char *n = device >= 0 && device < GPU_MAX ? m->nocode[device] : "";
  snprintf(why, whylen, "GPU application '%s' cannot run on GPU %d%s%s", m->app,
           device, n[0] ? ": " : " (not one of its GPUs at load)", n);
}

/* The module's kernel for blocks of threads threads on GPU dev, or NULL
 * with the reason. */
static CUfunction fn_for(const struct lynx__cuda_module *m, int dev,
                         uint32_t threads, char *err, size_t errlen) {
  CUfunction f =
      lynx__cuda_module_runs(m, dev) ? m->fn[dev][kernel_of(threads)] : NULL;
  if (!f)
    lynx__cuda_module_why(m, dev, err, errlen);
  return f;
}

int lynx__cuda_module_resident(const struct lynx__cuda_module *m, int device,
                               uint32_t threads, uint32_t *max, char *err,
                               size_t errlen) {
  CUfunction f;
  int per_sm = 0, sms = 0, cur = 0;
  CUresult r;
  *max = 0;
  if (!lynx_cuda_threads_ok(threads)) {
    snprintf(err, errlen,
             "%u threads per block: must be a multiple of 32 in 32..%u",
             threads, LYNX_GPU_THREADS_MAX);
    return -EINVAL;
  }
  f = fn_for(m, device, threads, err, errlen);
  if (!f)
    return -ENOEXEC;
  /* the function is the device's context's: asked with that device
   * current, the calling thread's put back after (as the built-in query) */
  if (cudaGetDevice(&cur) != cudaSuccess ||
      cudaSetDevice(device) != cudaSuccess) {
    snprintf(err, errlen, "GPU %d: cannot make it current", device);
    return -EIO;
  }
  /* the largest shared-memory carveout first, as for the built-in kernel
   * (apps.cu): the query counts blocks by the carveout it launches with */
  r = drv.set_attr(f, CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100);
  if (r == CUDA_SUCCESS)
    r = drv.occupancy(&per_sm, f, (int)threads, 0);
  cudaSetDevice(cur);
  if (r != CUDA_SUCCESS) {
    lynx__cuda_note(device, cu_as_rt(r), "occupancy of a module's kernel");
    snprintf(err, errlen, "occupancy of '%s''s kernel: %s", m->app, cu_text(r));
    return -EIO;
  }
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) !=
          cudaSuccess ||
      per_sm <= 0 || sms <= 0) {
    /* e.g. more registers or shared memory than a block of that size gets */
    snprintf(err, errlen,
             "GPU %d cannot run '%s''s kernel with %u threads per block",
             device, m->app, threads);
    return -EINVAL;
  }
  *max = (uint32_t)per_sm * (uint32_t)sms;
  return 0;
}

int lynx__cuda_module_launch(const struct lynx__cuda_module *m, int device,
                             const struct lynx_cuda_launch *l, void *stream,
                             char *err, size_t errlen) {
  struct lynx_cuda_launch arg;
  void *args[1] = {&arg};
  CUfunction f;
  CUresult r;
  int rc = lynx_cuda_launch_check(l, err, errlen);
  if (rc)
    return rc;
  if (l->app != LYNX_CUDA_APP_NONE)
    return lynx_cuda_einval(err, errlen,
                            "launch: a module's kernel runs no built-in "
                            "application");
  f = fn_for(m, device, l->threads, err, errlen);
  if (!f)
    return -ENOEXEC;
  arg = *l;
  r = drv.launch(f, l->blocks, 1, 1, l->threads, 1, 1, 0, (CUstream)stream,
                 args, NULL);
  if (r != CUDA_SUCCESS) {
    snprintf(err, errlen, "launch of '%s''s persistent kernel: %s", m->app,
             cu_text(r));
    return (int)cu_as_rt(r);
  }
  return 0;
}

void lynx__cuda_modules_unload(void) {
  while (modules) {
    struct lynx__cuda_module *m = modules;
    int hung = 0;
    modules = m->next;
    for (int d = 0; d < GPU_MAX; d++)
      hung |= m->fn[d][0] && lynx__cuda_hung(d);
    if (hung) /* its code still runs there: the process takes it along */
      free(m);
    else
      module_free(m);
  }
}
