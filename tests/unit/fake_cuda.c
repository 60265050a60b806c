/*
 * fake_cuda.c - a fake CUDA runtime, driver entry points, persistent
 * kernel and verbs registration for unit_cuda_backend (fake_cuda.h).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <elf.h>
#include <infiniband/verbs.h>

#include "app_logic.h"
#include "face.h"
#include "fake_cuda.h"
#include "lenet_model.h"
#include "mqueue.h"
#include "util.h"

struct fake_cuda fake;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static __thread int cur_dev;

#define BUMP(field) __atomic_add_fetch(&fake.field, 1, __ATOMIC_SEQ_CST)

/* ---- device memory ---------------------------------------------------- */

static int device_busy(int dev);

/* fake.block_calls: a call the driver may make wait for the device waits
 * here while a kernel runs on the current device (counted once in
 * blocked_calls), as a real one would never return while a persistent
 * kernel spins. */
static void wait_device_idle(void) {
  int counted = 0;
  pthread_mutex_lock(&lock);
  while (__atomic_load_n(&fake.block_calls, __ATOMIC_ACQUIRE) &&
         device_busy(cur_dev)) {
    if (!counted++)
      fake.blocked_calls++;
    pthread_mutex_unlock(&lock);
    usleep(1000);
    pthread_mutex_lock(&lock);
  }
  pthread_mutex_unlock(&lock);
}

struct alloc {
  void *p;
  size_t size;
  int device, live;
  struct alloc *next;
};
static struct alloc *allocs;

/* Under lock: the live allocation holding [p, p + len), or NULL. */
static struct alloc *find_live(const void *p, size_t len) {
  for (struct alloc *a = allocs; a; a = a->next) {
    const uint8_t *b = a->p;
    if (a->live && (const uint8_t *)p >= b &&
        (uint64_t)((const uint8_t *)p - b) + len <= a->size)
      return a;
  }
  return NULL;
}

int fake_cuda_live(void) {
  int n = 0;
  pthread_mutex_lock(&lock);
  for (struct alloc *a = allocs; a; a = a->next)
    n += a->live;
  pthread_mutex_unlock(&lock);
  return n;
}

int fake_cuda_is_live(const void *p) {
  int live;
  pthread_mutex_lock(&lock);
  live = find_live(p, 1) != NULL;
  pthread_mutex_unlock(&lock);
  return live;
}

/* ---- streams and kernels ---------------------------------------------- */

struct kern {
  struct fake_kernel pub; /* first */
  pthread_t thread;
  int kill;
  struct kern *next;
};
static struct kern *kernels;
static int n_kernels;

/* A copy still in flight on its stream (fake.defer_copies): applied when
 * the stream is synchronised, an event after it is waited for, or a query
 * is allowed to complete it. */
struct inflight {
  void *dst;
  const void *src;
  size_t n;
  uint8_t *snap; /* host to device: the source as it was at the call */
  uint64_t seq;
  struct inflight *next;
};

struct CUstream_st {
  int device, destroyed;
  struct kern *k;              /* the kernel launched on it */
  uint64_t enq;                /* copies deferred on it so far */
  struct inflight *q, **qtail; /* in flight, oldest first */
  struct CUstream_st *next;
};
static struct CUstream_st *streams;

static int kernel_running(const struct kern *k) {
  return __atomic_load_n(&k->pub.running, __ATOMIC_ACQUIRE);
}

/* Under lock: a kernel runs on device dev. */
static int device_busy(int dev) {
  for (struct kern *k = kernels; k; k = k->next)
    if (k->pub.device == dev && kernel_running(k))
      return 1;
  return 0;
}

struct fake_kernel *fake_cuda_kernel(int i) {
  struct kern *k;
  pthread_mutex_lock(&lock);
  for (k = kernels; k && i < n_kernels - 1; k = k->next, i++)
    ;
  pthread_mutex_unlock(&lock);
  return k ? &k->pub : NULL;
}

int fake_cuda_kernels(void) {
  int n;
  pthread_mutex_lock(&lock);
  n = n_kernels;
  pthread_mutex_unlock(&lock);
  return n;
}

/* Emulated work (apps.cu's lynx_block_work_us), asleep. */
static void work_us(uint32_t us) {
  struct timespec ts = {0, (long)us * 1000};
  if (us)
    nanosleep(&ts, NULL);
}

/* ---- the fake kernel's client mqueue calls ------------------------------- */

/* A block's client mqueue (lynx_dev.cuh's struct lynx_dev_client). */
struct fake_client {
  struct lynx_mq mq;
  uint32_t next_tag;
};

/* While a call waits: 1 with *rc set when it must end (the kernel is
 * killed or asked to stop: LYNX_CALL_ECANCELED; the deadline on the fake
 * %globaltimer passed: LYNX_CALL_ETIMEDOUT), else a short nap and 0. A
 * hung kernel ignores the stop word here too. */
static int call_wait(struct kern *k, uint64_t end, int *rc) {
  if (__atomic_load_n(&k->kill, __ATOMIC_ACQUIRE) ||
      (!k->pub.hang && lynx_load_acquire32(&k->pub.l.kctl->stop))) {
    *rc = LYNX_CALL_ECANCELED;
    return 1;
  }
  if (fake_cuda_globaltimer() >= end) {
    *rc = LYNX_CALL_ETIMEDOUT;
    return 1;
  }
  usleep(50);
  return 0;
}

/* A call as lynx_block_call makes it, by one thread: a TX slot of the
 * block's client mqueue (waited for within the deadline), the request
 * published with the next tag, then app_logic.h's lynx_call_poll until the
 * reply with that tag, l->call_timeout_ns or the stop word. 0 and *rep (to
 * release) or a LYNX_CALL_* code, as on the GPU. */
static int fake_call(struct kern *k, struct fake_client *c, const uint8_t *req,
                     uint32_t len, struct lynx_msg *rep) {
  uint64_t end = fake_cuda_globaltimer() + k->pub.l.call_timeout_ns;
  uint8_t *buf = NULL;
  uint32_t tag;
  int rc;
  __atomic_add_fetch(&k->pub.calls, 1, __ATOMIC_RELAXED);
  while ((rc = lynx_mq_reserve(&c->mq, len, &buf)) == -11 &&
         !call_wait(k, end, &rc))
    ;
  if (rc)
    return rc;
  memcpy(buf, req, len);
  tag = ++c->next_tag;
  lynx_mq_commit(&c->mq, tag, len, len, LYNX_ST_OK);
  while ((rc = lynx_call_poll(&c->mq, tag, UINT32_MAX, rep)) == -11 &&
         !call_wait(k, end, &rc))
    ;
  return rc;
}

/* mc-get and face-verify as apps.cu runs them, over the same shared logic
 * (app_logic.h, face.h), into the answer's slot reserved beforehand
 * (out): the answer's length, or -1 when the kernel must stop (the request
 * stays unanswered, as APP_STOP leaves it). */
static int fake_app_call(struct kern *k, struct fake_client *c,
                         const struct lynx_msg *m, uint8_t *out) {
  uint8_t cmd[LYNX_MC_GET_CMD_MAX];
  const uint8_t *label = NULL, *probe = NULL;
  struct lynx_msg rep = {NULL, 0, 0, 0};
  uint32_t n = 0, voff, vlen;
  char key[FACE_KEY_MAX];
  int klen, rc, len = -2; /* -2: "ERROR" */
  if (k->pub.l.app == LYNX_CUDA_APP_MC_GET) {
    if (lynx_mc_key_ok(m->data, m->len))
      n = lynx_mc_get_cmd(cmd, m->data, m->len);
  } else if (face_req_parse(m->data, m->len, &label, &probe) == 0 &&
             (klen = face_key(label, key)) > 0) {
    n = lynx_mc_get_cmd(cmd, (const uint8_t *)key, (uint32_t)klen);
  }
  if (n) {
    rc = fake_call(k, c, cmd, n, &rep);
    __atomic_store_n(&k->pub.last_call_rc, rc, __ATOMIC_RELEASE);
    if (rc == LYNX_CALL_ECANCELED)
      return -1;
    if (rc == 0) {
      rc = lynx_mc_parse_get(rep.data, rep.len, &voff, &vlen);
      if (k->pub.l.app == LYNX_CUDA_APP_MC_GET && rc == 0) {
        memcpy(out, rep.data + voff, vlen);
        len = (int)vlen;
      } else if (k->pub.l.app == LYNX_CUDA_APP_MC_GET && rc == -2) {
        len = 0;
      } else if (rc == 0 && vlen == FACE_PIXELS) {
        float d;
        int match = face_verify(probe, rep.data + voff, &d);
        face_resp_encode(out, match, d);
        len = FACE_RESP_LEN;
      }
      lynx_mq_release(&c->mq);
    }
  }
  if (len == -2) {
    memcpy(out, "ERROR", 5);
    len = 5;
  }
  return len;
}

/* The persistent kernel: block b serves server mqueues q % blocks == b with
 * the real ring code, echoing (LYNX_CUDA_APP_ECHO) after work_us until
 * kctl->stop, and stamps queueing and service times into block b's
 * histograms (lathist.h, as apps.cu). mc-get and face-verify call back end
 * app_backend through block b's own client mqueue
 * (lynx_cuda_client_mq(l, b, app_backend), as apps.cu binds it), one
 * request at a time like the real blocks; a stop while a call waits ends
 * the kernel with that request unanswered. Only requests and responses of
 * each block are written, so a test may set drops and bad itself. */
/* Blocks free on GPU dev: its capacity (fake.capacity; 0: no limit)
 * less the started blocks of every running kernel there but self. */
static uint32_t blocks_free(int dev, const struct kern *self) {
  uint32_t cap = fake.capacity ? fake.capacity : UINT32_MAX, used = 0;
  pthread_mutex_lock(&lock);
  for (const struct kern *o = kernels; o; o = o->next)
    if (o != self && o->pub.device == dev &&
        __atomic_load_n(&o->pub.running, __ATOMIC_ACQUIRE))
      used += o->pub.resident;
  pthread_mutex_unlock(&lock);
  return used < cap ? cap - used : 0;
}

static void *kernel_main(void *arg) {
  struct kern *k = arg;
  const struct lynx_cuda_launch *l = &k->pub.l;
  struct lynx_cuda_kctl *kc = l->kctl;
  struct lynx_lat *lat =
      (struct lynx_lat *)((uint8_t *)kc + lynx_cuda_kctl_lat_off(l->blocks));
  struct lynx_geom g;
  struct lynx_mq *mq = calloc(l->n_server, sizeof(*mq));
  struct lynx_seen *seen = calloc(l->n_server, sizeof(*seen));
  uint64_t *req = calloc(l->blocks, sizeof(*req));
  uint64_t *resp = calloc(l->blocks, sizeof(*resp));
  int calls = lynx_cuda_app_calls(l->app) && l->n_backends, stopped = 0;
  struct fake_client *cl = calloc(l->blocks, sizeof(*cl));
  if (!mq || !seen || !req || !resp || !cl ||
      lynx_geom_init(&g, l->n_mqueues, l->slots, l->slot_size, l->large_bytes))
    abort();
  /* the control array's copy kept as apps.cu keeps it */
  for (uint32_t q = 0; q < l->n_server; q++)
    lynx_mq_bind_mirrored(&mq[q], l->region, &g, q, l->actrl_mirror);
  for (uint32_t b = 0; calls && b < l->blocks; b++)
    lynx_mq_bind_mirrored(&cl[b].mq, l->region, &g,
                          lynx_cuda_client_mq(l, b, l->app_backend),
                          l->actrl_mirror);
  __atomic_store_n(&kc->now_gt, fake_cuda_globaltimer(), __ATOMIC_RELEASE);
  __atomic_add_fetch(&kc->started, k->pub.resident, __ATOMIC_SEQ_CST);
  while (!stopped && !__atomic_load_n(&k->kill, __ATOMIC_ACQUIRE)) {
    int busy = 0;
    /* a poisoned context ends every kernel in it, as on a GPU */
    if (__atomic_load_n(&fake.poisoned[k->pub.device], __ATOMIC_ACQUIRE)) {
      k->pub.crashed = fake.poisoned[k->pub.device];
      break;
    }
    if (!k->pub.hang && lynx_load_acquire32(&kc->stop))
      break;
    __atomic_store_n(&kc->now_gt, fake_cuda_globaltimer(), __ATOMIC_RELEASE);
    for (uint32_t q = 0; q < l->n_server; q++)
      lynx_seen_scan(&seen[q], &mq[q], fake_cuda_globaltimer());
    for (uint32_t q = 0; q < l->n_server; q++) {
      uint32_t b = q % l->blocks;
      struct lynx_msg m;
      if (b >= k->pub.resident)
        continue; /* its block never started */
      uint8_t *out = NULL;
      uint64_t until, taken;
      /* apps.cu's mc-get and face-verify reserve their answer's slot
       * first: a whole slot (the value's length comes with the reply),
       * the 8-byte answer */
      uint32_t max = k->pub.function ? lynx_slot_cap(g.slot_size)
                     : l->app == LYNX_CUDA_APP_MC_GET
                         ? lynx_slot_cap(g.slot_size)
                     : l->app == LYNX_CUDA_APP_FACE_VERIFY ? FACE_RESP_LEN
                     : l->app == LYNX_CUDA_APP_LENET       ? LENET_RESP_MAX
                                                           : 0;
      int full, n;
      /* the lease fence, as apps.cu checks it before each receive */
      until = __atomic_load_n(&kc->serve_until_gt, __ATOMIC_ACQUIRE);
      if (until && fake_cuda_globaltimer() >= until) {
        __atomic_add_fetch(&k->pub.fenced_passes, 1, __ATOMIC_RELAXED);
        continue;
      }
      if (lynx_mq_recv(&mq[q], &m))
        continue;
      busy = 1;
      req[b]++;
      taken = fake_cuda_globaltimer();
      lynx_lat_add(&lat[b].queue,
                   taken - lynx_seen_at(&seen[q], mq[q].rx_head - 1, taken));
      work_us(l->work_us);
      if (!max)
        max = m.len;
      while ((full = lynx_mq_reserve(&mq[q], max, &out)) != 0 &&
             !__atomic_load_n(&k->kill, __ATOMIC_ACQUIRE))
        usleep(100);
      if (!full && k->pub.function) { /* a module's kernel */
        int an = fake.module_handler
                     ? fake.module_handler(l, m.data, m.len, out, max)
                     : -1;
        if (an == FAKE_TRAP) { /* the kernel faults: its GPU is poisoned */
          k->pub.crashed = cudaErrorIllegalAddress;
          __atomic_store_n(&fake.poisoned[k->pub.device],
                           cudaErrorIllegalAddress, __ATOMIC_RELEASE);
          stopped = 1;
          break;
        }
        lynx_mq_commit(&mq[q], m.tag, an < 0 ? 0 : (uint32_t)an, max,
                       an < 0 ? LYNX_ST_DROPPED : LYNX_ST_OK);
        resp[b] += an >= 0;
      } else if (!full && l->app == LYNX_CUDA_APP_ECHO) {
        memcpy(out, m.data, m.len);
        lynx_mq_commit(&mq[q], m.tag, m.len, m.len, LYNX_ST_OK);
        resp[b]++;
      } else if (!full && l->app == LYNX_CUDA_APP_LENET) {
        /* apps.cu's lenet: the weights the agent put in "GPU memory"
         * (host memory here), the CPU's per-element code */
        int clen = lenet_req_cookie_len(m.len);
        struct lenet_acts *a = malloc(sizeof(*a));
        if (!a)
          abort();
        if (clen < 0) {
          lynx_mq_commit(&mq[q], m.tag, 0, 0, LYNX_ST_DROPPED);
        } else {
          int cls = lenet_forward(l->app_data, m.data, a);
          lynx_mq_commit(&mq[q], m.tag,
                         lenet_resp_encode(out, cls, a->logits,
                                           m.data + LENET_PIXELS,
                                           (uint32_t)clen),
                         max, LYNX_ST_OK);
          resp[b]++;
        }
        free(a);
      } else if (!full && calls) {
        n = fake_app_call(k, &cl[b], &m, out);
        if (n < 0) { /* APP_STOP: unanswered, unreleased; counted */
          __atomic_store_n(&kc->blocks[b].requests, req[b], __ATOMIC_RELEASE);
          stopped = 1;
          break;
        }
        lynx_mq_commit(&mq[q], m.tag, (uint32_t)n, max, LYNX_ST_OK);
        resp[b]++;
      }
      lynx_lat_add(&lat[b].service, fake_cuda_globaltimer() - taken);
      lynx_mq_release(&mq[q]);
      __atomic_store_n(&kc->blocks[b].requests, req[b], __ATOMIC_RELEASE);
      __atomic_store_n(&kc->blocks[b].responses, resp[b], __ATOMIC_RELEASE);
    }
    if (!busy)
      usleep(200);
  }
  /* blocks that never started run once SMs of this GPU are free (another
   * kernel ended), see the stop and return: until then the kernel, and
   * its stream, are not done */
  while (k->pub.resident < l->blocks &&
         !__atomic_load_n(&k->kill, __ATOMIC_ACQUIRE) &&
         blocks_free(k->pub.device, k) < l->blocks - k->pub.resident)
    usleep(1000);
  __atomic_add_fetch(&kc->exited, l->blocks, __ATOMIC_SEQ_CST);
  free(cl);
  free(mq);
  free(seen);
  free(req);
  free(resp);
  __atomic_store_n(&k->pub.running, 0, __ATOMIC_RELEASE);
  return NULL;
}

static void kernel_end(struct kern *k) {
  __atomic_store_n(&k->kill, 1, __ATOMIC_RELEASE);
  if (k->thread) {
    pthread_join(k->thread, NULL);
    k->thread = 0;
  }
}

void fake_cuda_crash(struct fake_kernel *fk, cudaError_t e) {
  struct kern *k = (struct kern *)fk;
  kernel_end(k);
  k->pub.crashed = e;
}

/* ---- the runtime ------------------------------------------------------ */

static int bad_dev(int d) { return d < 0 || d >= fake.n_gpus; }

/* The sticky error of GPU dev (fake.poisoned), or cudaSuccess. */
static cudaError_t sticky_of(int dev) {
  return dev >= 0 && dev < FAKE_GPUS
             ? __atomic_load_n(&fake.poisoned[dev], __ATOMIC_ACQUIRE)
             : cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *v) {
  *v = fake.driver_version;
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v) {
  *v = fake.runtime_version;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int *count) {
  BUMP(get_device_count);
  if (fake.err_device_count != cudaSuccess)
    return fake.err_device_count;
  *count = fake.n_gpus;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d) {
  if (bad_dev(d))
    return cudaErrorInvalidDevice;
  if (fake.err_properties != cudaSuccess)
    return fake.err_properties;
  memset(p, 0, sizeof(*p));
  snprintf(p->name, sizeof(p->name), "%s", fake.gpu[d].name);
  p->totalGlobalMem = fake.gpu[d].memory;
  p->major = fake.gpu[d].major;
  p->minor = fake.gpu[d].minor;
  p->multiProcessorCount = fake.gpu[d].sms;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char *id, int len, int d) {
  if (bad_dev(d))
    return cudaErrorInvalidDevice;
  snprintf(id, (size_t)len, "%s", fake.gpu[d].pci_bus_id);
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr attr, int d) {
  if (bad_dev(d))
    return cudaErrorInvalidDevice;
  switch (attr) {
  case cudaDevAttrPciBusId:
    if (fake.err_attr[d] != cudaSuccess)
      return fake.err_attr[d];
    *v = d + 1;
    break;
  case cudaDevAttrGPUDirectRDMASupported:
    *v = fake.gpu[d].gpudirect_rdma;
    break;
  case cudaDevAttrGPUDirectRDMAWritesOrdering:
    *v = fake.gpu[d].writes_ordering;
    break;
  case cudaDevAttrMultiProcessorCount:
    *v = fake.gpu[d].sms;
    break;
  case cudaDevAttrComputeCapabilityMajor:
    *v = fake.gpu[d].major;
    break;
  case cudaDevAttrComputeCapabilityMinor:
    *v = fake.gpu[d].minor;
    break;
  default:
    *v = 0;
  }
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int d) {
  BUMP(set_device);
  if (bad_dev(d))
    return cudaErrorInvalidDevice;
  cur_dev = d;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int *d) {
  *d = cur_dev;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t size) {
  struct alloc *a;
  size_t n = (size + 255) & ~(size_t)255;
  wait_device_idle();
  if (fake.err_malloc != cudaSuccess)
    return fake.err_malloc;
  if (sticky_of(cur_dev) != cudaSuccess)
    return sticky_of(cur_dev);
  a = calloc(1, sizeof(*a));
  if (!a)
    return cudaErrorMemoryAllocation;
  a->p = aligned_alloc(256, n);
  if (!a->p) {
    free(a);
    return cudaErrorMemoryAllocation;
  }
  memset(a->p, 0xA5, n); /* cudaMalloc does not zero */
  a->size = size;
  a->device = cur_dev;
  a->live = 1;
  pthread_mutex_lock(&lock);
  a->next = allocs;
  allocs = a;
  fake.mallocs++;
  fake.malloc_bytes += size;
  pthread_mutex_unlock(&lock);
  *p = a->p;
  return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
  struct alloc *a;
  pthread_mutex_lock(&lock);
  fake.frees++;
  if (device_busy(cur_dev))
    fake.blocking_calls++; /* would wait for a kernel that never ends */
  for (a = allocs; a && !(a->live && a->p == p); a = a->next)
    ;
  if (!a) {
    fake.bad_frees++;
    pthread_mutex_unlock(&lock);
    return cudaErrorInvalidValue;
  }
  if (a->device != cur_dev)
    fake.bad_frees++; /* freed with another device current */
  a->live = 0;
  free(a->p);
  a->p = NULL;
  pthread_mutex_unlock(&lock);
  return cudaSuccess;
}

/* ---- host memory mapped into the GPU -------------------------------- */

/* Pinned host memory (cudaHostAlloc, below); mapped with
 * cudaHostAllocMapped, which gives it a device address. */
struct pinned {
  void *p;
  size_t size;
  int live, mapped;
  struct pinned *next;
};
static struct pinned *pinned;

struct host_reg {
  void *p;
  size_t size;
  struct host_reg *next;
};
static struct host_reg *host_regs;

/* Under lock: [p, p + len) lies in a registered host range. */
static int host_mapped(const void *p, size_t len) {
  for (struct host_reg *h = host_regs; h; h = h->next)
    if ((const char *)p >= (char *)h->p &&
        (const char *)p + len <= (char *)h->p + h->size)
      return 1;
  return 0;
}

cudaError_t cudaHostRegister(void *p, size_t size, unsigned int flags) {
  struct host_reg *h;
  wait_device_idle();
  if (fake.err_host_register != cudaSuccess)
    return fake.err_host_register;
  if (!p || !size)
    return cudaErrorInvalidValue;
  h = calloc(1, sizeof(*h));
  if (!h)
    return cudaErrorMemoryAllocation;
  pthread_mutex_lock(&lock);
  for (struct host_reg *o = host_regs; o; o = o->next)
    if ((char *)p < (char *)o->p + o->size && (char *)o->p < (char *)p + size) {
      pthread_mutex_unlock(&lock);
      free(h);
      return cudaErrorHostMemoryAlreadyRegistered;
    }
  h->p = p;
  h->size = size;
  h->next = host_regs;
  host_regs = h;
  fake.host_registers++;
  fake.host_register_flags = flags;
  pthread_mutex_unlock(&lock);
  return cudaSuccess;
}

cudaError_t cudaHostGetDevicePointer(void **dev, void *p, unsigned int flags) {
  cudaError_t e = cudaErrorInvalidValue;
  (void)flags;
  if (fake.err_host_devptr != cudaSuccess)
    return fake.err_host_devptr;
  pthread_mutex_lock(&lock);
  for (struct host_reg *h = host_regs; h; h = h->next)
    if ((char *)p >= (char *)h->p && (char *)p < (char *)h->p + h->size) {
      *dev = p; /* the fake GPU sees host memory at its own address */
      e = cudaSuccess;
    }
  /* and pinned memory allocated mapped */
  for (struct pinned *h = pinned; h; h = h->next)
    if (h->live && h->mapped && (char *)p >= (char *)h->p &&
        (char *)p < (char *)h->p + h->size) {
      *dev = p;
      e = cudaSuccess;
    }
  pthread_mutex_unlock(&lock);
  return e;
}

cudaError_t cudaHostUnregister(void *p) {
  struct host_reg **pp;
  wait_device_idle();
  pthread_mutex_lock(&lock);
  fake.host_unregisters++;
  for (pp = &host_regs; *pp && (*pp)->p != p; pp = &(*pp)->next)
    ;
  if (!*pp) {
    fake.bad_unregisters++;
    pthread_mutex_unlock(&lock);
    return cudaErrorHostMemoryNotRegistered;
  }
  for (struct kern *k = kernels; k; k = k->next)
    if (kernel_running(k) && (char *)k->pub.l.region >= (char *)p &&
        (char *)k->pub.l.region < (char *)p + (*pp)->size)
      fake.unmapped_live++; /* a real kernel would fault */
  {
    struct host_reg *h = *pp;
    *pp = h->next;
    free(h);
  }
  pthread_mutex_unlock(&lock);
  return cudaSuccess;
}

int fake_cuda_host_registered(void) {
  int n = 0;
  pthread_mutex_lock(&lock);
  for (struct host_reg *h = host_regs; h; h = h->next)
    n++;
  pthread_mutex_unlock(&lock);
  return n;
}

/* ---- pinned host memory ------------------------------------------------ */

/* Under lock: [p, p + len) lies in live pinned memory. */
static int is_pinned(const void *p, size_t len) {
  for (struct pinned *h = pinned; h; h = h->next)
    if (h->live && (const char *)p >= (char *)h->p &&
        (uint64_t)((const char *)p - (char *)h->p) + len <= h->size)
      return 1;
  return 0;
}

cudaError_t cudaHostAlloc(void **p, size_t size, unsigned int flags) {
  struct pinned *h;
  wait_device_idle();
  if (fake.err_host_alloc != cudaSuccess)
    return fake.err_host_alloc;
  if (!size)
    return cudaErrorInvalidValue;
  h = calloc(1, sizeof(*h));
  if (!h)
    return cudaErrorMemoryAllocation;
  h->p = malloc(size);
  if (!h->p) {
    free(h);
    return cudaErrorMemoryAllocation;
  }
  memset(h->p, 0x5A, size); /* not zeroed either */
  h->size = size;
  h->live = 1;
  h->mapped = (flags & cudaHostAllocMapped) != 0;
  pthread_mutex_lock(&lock);
  h->next = pinned;
  pinned = h;
  fake.host_allocs++;
  fake.host_alloc_flags = flags;
  pthread_mutex_unlock(&lock);
  *p = h->p;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p) {
  struct pinned *h;
  pthread_mutex_lock(&lock);
  fake.host_frees++;
  if (device_busy(cur_dev))
    fake.blocking_calls++; /* may wait for the device, as cudaFree */
  for (h = pinned; h && !(h->live && h->p == p); h = h->next)
    ;
  if (!h) {
    fake.bad_frees++;
    pthread_mutex_unlock(&lock);
    return cudaErrorInvalidValue;
  }
  h->live = 0;
  free(h->p);
  h->p = NULL;
  pthread_mutex_unlock(&lock);
  return cudaSuccess;
}

int fake_cuda_pinned_live(void) {
  int n = 0;
  pthread_mutex_lock(&lock);
  for (struct pinned *h = pinned; h; h = h->next)
    n += h->live;
  pthread_mutex_unlock(&lock);
  return n;
}

/* ---- copies in flight (fake.defer_copies) ------------------------------ */

/* Under lock: completes s's copies up to seq mark (all: UINT64_MAX), in
 * order. A source that changed since the call means the caller reused it
 * while the copy could still read it. */
static void complete_until(struct CUstream_st *s, uint64_t mark) {
  while (s->q && s->q->seq <= mark) {
    struct inflight *f = s->q;
    s->q = f->next;
    if (!s->q)
      s->qtail = &s->q;
    if (f->snap && memcmp(f->snap, f->src, f->n))
      fake.src_races++;
    memcpy(f->dst, f->src, f->n);
    free(f->snap);
    free(f);
  }
}

int fake_cuda_inflight(void) {
  int n = 0;
  pthread_mutex_lock(&lock);
  for (struct CUstream_st *s = streams; s; s = s->next)
    for (struct inflight *f = s->q; f; f = f->next)
      n++;
  pthread_mutex_unlock(&lock);
  return n;
}

void fake_cuda_complete(void) {
  pthread_mutex_lock(&lock);
  for (struct CUstream_st *s = streams; s; s = s->next)
    complete_until(s, UINT64_MAX);
  pthread_mutex_unlock(&lock);
}

/* ---- events ------------------------------------------------------------- */

struct CUevent_st {
  struct CUstream_st *s; /* where it was last recorded */
  uint64_t mark;         /* the copies before it there */
  int recorded, destroyed;
  struct CUevent_st *next;
};
static struct CUevent_st *events;

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned int flags) {
  struct CUevent_st *e;
  (void)flags;
  if (fake.err_event_create != cudaSuccess)
    return fake.err_event_create;
  e = calloc(1, sizeof(*e));
  if (!e)
    return cudaErrorMemoryAllocation;
  pthread_mutex_lock(&lock);
  fake.event_creates++;
  e->next = events;
  events = e;
  pthread_mutex_unlock(&lock);
  *ev = e;
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  pthread_mutex_lock(&lock);
  fake.event_destroys++;
  if (!e || e->destroyed)
    fake.bad_frees++;
  else
    e->destroyed = 1; /* kept until reap */
  pthread_mutex_unlock(&lock);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  pthread_mutex_lock(&lock);
  fake.event_records++;
  if (!e || e->destroyed || !s || s->destroyed) {
    pthread_mutex_unlock(&lock);
    return cudaErrorInvalidResourceHandle;
  }
  e->s = s;
  e->mark = s->enq;
  e->recorded = 1;
  pthread_mutex_unlock(&lock);
  return cudaSuccess;
}

/* Under lock: every copy before e's record has completed. */
static int event_done(const struct CUevent_st *e) {
  return !e->recorded || !e->s->q || e->s->q->seq > e->mark;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  cudaError_t r = cudaSuccess;
  pthread_mutex_lock(&lock);
  fake.event_queries++;
  if (!e || e->destroyed)
    r = cudaErrorInvalidResourceHandle;
  else if (!event_done(e) && fake.query_completes)
    complete_until(e->s, e->mark);
  else if (!event_done(e))
    r = cudaErrorNotReady;
  pthread_mutex_unlock(&lock);
  return r;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  cudaError_t r = cudaSuccess;
  pthread_mutex_lock(&lock);
  fake.event_syncs++;
  if (!e || e->destroyed)
    r = cudaErrorInvalidResourceHandle;
  else if (fake.err_event_sync_once != cudaSuccess) {
    r = fake.err_event_sync_once;
    fake.err_event_sync_once = cudaSuccess;
  } else if (e->recorded)
    complete_until(e->s, e->mark);
  pthread_mutex_unlock(&lock);
  return r;
}

cudaError_t cudaDeviceSynchronize(void) {
  pthread_mutex_lock(&lock);
  fake.device_syncs++;
  if (device_busy(cur_dev))
    fake.blocking_calls++;
  pthread_mutex_unlock(&lock);
  return cudaSuccess;
}

static void log_op(int is_memset, enum cudaMemcpyKind kind, cudaStream_t s,
                   const void *dev, const void *host, size_t len) {
  struct fake_op *o;
  if (fake.n_ops >= FAKE_LOG)
    return;
  o = &fake.ops[fake.n_ops++];
  o->memset = is_memset;
  o->kind = kind;
  o->stream = s;
  o->dev = dev;
  o->len = len;
  o->word = 0;
  if (host && len >= 4)
    memcpy(&o->word, host, 4);
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
  if (s && sticky_of(s->device) != cudaSuccess)
    return sticky_of(s->device);
  pthread_mutex_lock(&lock);
  fake.memsets++;
  log_op(1, cudaMemcpyHostToDevice, s, p, NULL, n);
  if (!s || s->destroyed || !find_live(p, n)) {
    fake.bad_copies++;
    pthread_mutex_unlock(&lock);
    return cudaErrorInvalidValue;
  }
  complete_until(s, UINT64_MAX); /* stream order */
  memset(p, v, n);
  pthread_mutex_unlock(&lock);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n,
                            enum cudaMemcpyKind kind, cudaStream_t s) {
  const void *dev = kind == cudaMemcpyHostToDevice ? dst : src;
  cudaError_t e = cudaSuccess;
  struct kern *stopped = NULL;
  if (s && sticky_of(s->device) != cudaSuccess)
    return sticky_of(s->device);
  pthread_mutex_lock(&lock);
  fake.memcpys++;
  log_op(0, kind, s, dev, kind == cudaMemcpyHostToDevice ? src : NULL, n);
  if (fake.err_memcpy_once != cudaSuccess) {
    e = fake.err_memcpy_once;
    fake.err_memcpy_once = cudaSuccess;
  } else if ((kind != cudaMemcpyHostToDevice &&
              kind != cudaMemcpyDeviceToHost) ||
             !s || s->destroyed || !find_live(dev, n)) {
    fake.bad_copies++;
    e = cudaErrorInvalidValue;
  } else if (fake.defer_copies &&
             is_pinned(kind == cudaMemcpyHostToDevice ? src : dst, n)) {
    /* pinned host memory: truly asynchronous, in flight until the stream
     * gets there */
    struct inflight *f = calloc(1, sizeof(*f));
    if (f && kind == cudaMemcpyHostToDevice)
      f->snap = malloc(n ? n : 1);
    if (!f || (kind == cudaMemcpyHostToDevice && !f->snap)) {
      free(f);
      e = cudaErrorMemoryAllocation;
    } else {
      if (f->snap)
        memcpy(f->snap, src, n);
      f->dst = dst;
      f->src = src;
      f->n = n;
      f->seq = ++s->enq;
      if (!s->qtail)
        s->qtail = &s->q;
      *s->qtail = f;
      s->qtail = &f->next;
      fake.deferred++;
    }
  } else {
    /* pageable host memory: the runtime stages it (host to device) or
     * returns once done (device to host); either way after what the
     * stream has in flight */
    complete_until(s, UINT64_MAX);
    /* the kernel thread uses the same memory: byte copies are what a copy
     * engine gives too */
    memcpy(dst, src, n);
    /* a kernel asked to stop returns at once (a GPU block sees the word
     * within microseconds), unless it hangs */
    if (kind == cudaMemcpyHostToDevice && n >= 4)
      for (struct kern *k = kernels; k; k = k->next)
        if (dst == (void *)&k->pub.l.kctl->stop && *(const uint32_t *)src &&
            !k->pub.hang && kernel_running(k))
          stopped = k;
  }
  pthread_mutex_unlock(&lock);
  for (int i = 0; stopped && kernel_running(stopped) && i < 2000; i++)
    usleep(1000);
  return e;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
  struct CUstream_st *st = calloc(1, sizeof(*st));
  if (!st)
    return cudaErrorMemoryAllocation;
  st->device = cur_dev;
  pthread_mutex_lock(&lock);
  fake.stream_creates++;
  st->next = streams;
  streams = st;
  pthread_mutex_unlock(&lock);
  *s = st;
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  pthread_mutex_lock(&lock);
  fake.stream_destroys++;
  if (!s || s->destroyed) {
    fake.bad_frees++;
  } else {
    complete_until(s, UINT64_MAX); /* its work completes first */
    s->destroyed = 1;              /* kept: op records point at it */
  }
  pthread_mutex_unlock(&lock);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  BUMP(stream_syncs);
  if (!s || s->destroyed)
    return cudaErrorInvalidResourceHandle;
  if (sticky_of(s->device) != cudaSuccess)
    return sticky_of(s->device);
  pthread_mutex_lock(&lock);
  if (fake.err_stream_sync_once != cudaSuccess) {
    cudaError_t e = fake.err_stream_sync_once;
    fake.err_stream_sync_once = cudaSuccess;
    pthread_mutex_unlock(&lock);
    return e;
  }
  complete_until(s, UINT64_MAX);
  pthread_mutex_unlock(&lock);
  if (s->k && kernel_running(s->k)) {
    BUMP(blocking_calls);
    return cudaErrorNotReady;
  }
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
  BUMP(queries);
  if (!s || s->destroyed)
    return cudaErrorInvalidResourceHandle;
  if (!s->k)
    return cudaSuccess;
  if (kernel_running(s->k))
    return cudaErrorNotReady;
  if (sticky_of(s->device) != cudaSuccess)
    return sticky_of(s->device);
  return s->k->pub.crashed;
}

const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
#define N(x)                                                                   \
  case x:                                                                      \
    return #x;
    N(cudaSuccess)
    N(cudaErrorInvalidValue)
    N(cudaErrorMemoryAllocation)
    N(cudaErrorInsufficientDriver)
    N(cudaErrorNoDevice)
    N(cudaErrorInvalidDevice)
    N(cudaErrorIllegalAddress)
    N(cudaErrorLaunchFailure)
    N(cudaErrorNotReady)
    N(cudaErrorNoKernelImageForDevice)
    N(cudaErrorInvalidResourceHandle)
#undef N
  default:
    return "cudaErrorFake";
  }
}

const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
  case cudaSuccess:
    return "no error";
  case cudaErrorInsufficientDriver:
    return "CUDA driver version is insufficient for CUDA runtime version";
  case cudaErrorNoDevice:
    return "no CUDA-capable device is detected";
  case cudaErrorMemoryAllocation:
    return "out of memory";
  case cudaErrorIllegalAddress:
    return "an illegal memory access was encountered";
  default:
    return "fake error";
  }
}

/* ---- driver entry points ----------------------------------------------- */

static CUresult fake_get_handle(void *handle, CUdeviceptr p, size_t size,
                                CUmemRangeHandleType type,
                                unsigned long long flags) {
  int fd;
  BUMP(get_handles);
  fake.handle_ptr = p;
  fake.handle_size = size;
  if (type != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD || flags)
    return CUDA_ERROR_INVALID_VALUE;
  if (fake.err_get_handle != CUDA_SUCCESS)
    return fake.err_get_handle;
  pthread_mutex_lock(&lock);
  if (!find_live((const void *)(uintptr_t)p, size)) {
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_INVALID_VALUE;
  }
  pthread_mutex_unlock(&lock);
  fd = memfd_create("fake-dmabuf", MFD_CLOEXEC);
  if (fd < 0)
    return CUDA_ERROR_OUT_OF_MEMORY;
  fake.handle_fd = fd;
  *(int *)handle = fd;
  return CUDA_SUCCESS;
}

static CUresult fake_set_attr(const void *v, CUpointer_attribute a,
                              CUdeviceptr p) {
  BUMP(set_attrs);
  if (a == CU_POINTER_ATTRIBUTE_SYNC_MEMOPS && *(const unsigned *)v == 1)
    fake.sync_memops_ptr = p;
  return CUDA_SUCCESS;
}

/* ---- CUDA modules (cuda_module.c's driver calls) ----------------------- */

static int launch(const struct lynx_cuda_launch *l, void *stream,
                  const char *function, char *err, size_t errlen);

struct CUlib_st {
  uint8_t *image; /* a copy, as the driver keeps what it loads */
  size_t len;
  struct CUlib_st *next;
};

/* [off, off + n) lies in a buffer of len bytes (no overflow). */
static int in_bounds(uint64_t off, uint64_t n, size_t len) {
  return off <= len && n <= len - off;
}

/* The bytes of symbol name in an ELF cubin (its initial value), or NULL. */
static const uint8_t *cubin_symbol(const uint8_t *e, size_t len,
                                   const char *name, size_t *size) {
  const Elf64_Ehdr *h = (const Elf64_Ehdr *)e;
  const Elf64_Shdr *sh;
  if (len < sizeof(*h) || memcmp(e, ELFMAG, SELFMAG) ||
      !in_bounds(h->e_shoff, (uint64_t)h->e_shnum * sizeof(*sh), len))
    return NULL;
  sh = (const Elf64_Shdr *)(e + h->e_shoff);
  for (unsigned s = 0; s < h->e_shnum; s++) {
    const Elf64_Shdr *str;
    if (sh[s].sh_type != SHT_SYMTAB || sh[s].sh_link >= h->e_shnum ||
        !in_bounds(sh[s].sh_offset, sh[s].sh_size, len))
      continue;
    str = &sh[sh[s].sh_link];
    if (!in_bounds(str->sh_offset, str->sh_size, len) || !str->sh_size ||
        e[str->sh_offset + str->sh_size - 1])
      continue; /* a string table that does not end with a NUL */
    for (uint64_t i = 0; i < sh[s].sh_size / sizeof(Elf64_Sym); i++) {
      const Elf64_Sym *y = (const Elf64_Sym *)(e + sh[s].sh_offset) + i;
      const Elf64_Shdr *in;
      if (y->st_name >= str->sh_size || y->st_shndx >= h->e_shnum ||
          strcmp((const char *)e + str->sh_offset + y->st_name, name))
        continue;
      in = &sh[y->st_shndx];
      if (!in_bounds(in->sh_offset, in->sh_size, len) ||
          !in_bounds(y->st_value, y->st_size, in->sh_size))
        return NULL;
      *size = y->st_size;
      return e + in->sh_offset + y->st_value;
    }
  }
  return NULL;
}

static struct CUlib_st *libs;

/* Kernels and functions are names in a module: a kernel is its library
 * and name, a function that in a GPU's context. */
struct CUkern_st {
  struct CUlib_st *lib;
  char name[64];
  int device; /* a function's; -1 for a kernel */
  struct CUkern_st *next;
};
static struct CUkern_st *kerns;

/* name, NUL-terminated, among the module's bytes (its symbol tables). */
static int has_name(const struct CUlib_st *l, const char *name) {
  size_t n = strlen(name) + 1;
  for (size_t i = 0; l->len >= n && i <= l->len - n; i++)
    if (!memcmp(l->image + i, name, n))
      return 1;
  return 0;
}

static uint64_t rd_le(const uint8_t *p, unsigned bytes) {
  uint64_t v = 0;
  while (bytes--)
    v = v << 8 | p[bytes];
  return v;
}

/* The fatbin's code for compute capability cc (major * 10 + minor): 2
 * and its cubin (*code, *code_len), 1 for PTX it can compile, 0 none. */
static int has_code(const struct CUlib_st *l, unsigned cc, const uint8_t **code,
                    size_t *code_len) {
  uint64_t hs, end;
  int found = 0;
  if (l->len < 16 || rd_le(l->image, 4) != 0xBA55ED50u)
    return 0;
  hs = rd_le(l->image + 6, 2);
  if (!in_bounds(hs, rd_le(l->image + 8, 8), l->len))
    return 0;
  end = hs + rd_le(l->image + 8, 8);
  for (uint64_t o = hs; o + 32 <= end;) {
    unsigned kind = (unsigned)rd_le(l->image + o, 2);
    unsigned arch = (unsigned)rd_le(l->image + o + 28, 4);
    uint64_t ehs = rd_le(l->image + o + 4, 4), n = rd_le(l->image + o + 8, 8);
    if (ehs < 32 || !in_bounds(o + ehs, n, end))
      return found; /* a malformed entry ends the walk */
    if (kind == 2 && arch == cc) {
      *code = l->image + o + ehs;
      *code_len = n;
      return 2;
    }
    if (kind == 1 && arch <= cc)
      found = 1;
    o += ehs + n;
  }
  return found;
}

static CUresult fake_lib_load(CUlibrary *out, const void *code, CUjit_option *o,
                              void **ov, unsigned no, CUlibraryOption *lo,
                              void **lov, unsigned nlo) {
  struct CUlib_st *l;
  size_t len;
  (void)o, (void)ov, (void)no, (void)lo, (void)lov, (void)nlo;
  BUMP(library_loads);
  if (fake.err_library_load != CUDA_SUCCESS)
    return fake.err_library_load;
  if (rd_le(code, 4) != 0xBA55ED50u)
    return CUDA_ERROR_INVALID_IMAGE;
  /* the header says its size and its entries' (the agent checked both) */
  len =
      rd_le((const uint8_t *)code + 6, 2) + rd_le((const uint8_t *)code + 8, 8);
  l = calloc(1, sizeof(*l));
  if (!l || !(l->image = malloc(len))) {
    free(l);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  memcpy(l->image, code, len);
  l->len = len;
  pthread_mutex_lock(&lock);
  l->next = libs;
  libs = l;
  pthread_mutex_unlock(&lock);
  *out = l;
  return CUDA_SUCCESS;
}

static CUresult fake_lib_unload(CUlibrary l) {
  BUMP(library_unloads);
  (void)l; /* freed at fake_cuda_reap: kernels may still name it */
  return CUDA_SUCCESS;
}

static struct CUkern_st *new_kern(struct CUlib_st *l, const char *name,
                                  int device) {
  struct CUkern_st *k = calloc(1, sizeof(*k));
  if (!k)
    return NULL;
  k->lib = l;
  snprintf(k->name, sizeof(k->name), "%s", name);
  k->device = device;
  pthread_mutex_lock(&lock);
  k->next = kerns;
  kerns = k;
  pthread_mutex_unlock(&lock);
  return k;
}

static CUresult fake_get_kernel(CUkernel *out, CUlibrary l, const char *name) {
  struct CUkern_st *k;
  if (!has_name(l, name))
    return CUDA_ERROR_NOT_FOUND;
  k = new_kern(l, name, -1);
  if (!k)
    return CUDA_ERROR_OUT_OF_MEMORY;
  *out = (CUkernel)k;
  return CUDA_SUCCESS;
}

static CUresult fake_get_function(CUfunction *out, CUkernel kernel) {
  struct CUkern_st *k = (struct CUkern_st *)kernel, *f;
  const struct fake_gpu *g = &fake.gpu[cur_dev];
  const uint8_t *code;
  size_t n;
  BUMP(get_functions);
  if (!has_code(k->lib, (unsigned)(g->major * 10 + g->minor), &code, &n))
    return CUDA_ERROR_NO_BINARY_FOR_GPU;
  f = new_kern(k->lib, k->name, cur_dev);
  if (!f)
    return CUDA_ERROR_OUT_OF_MEMORY;
  *out = (CUfunction)f;
  return CUDA_SUCCESS;
}

/* A global of the current GPU's cubin: its initial value copied into
 * "device memory" (a fresh allocation each time, freed at reap). */
static CUresult fake_get_global(CUdeviceptr *p, size_t *bytes, CUlibrary lib,
                                const char *name) {
  const struct fake_gpu *g = &fake.gpu[cur_dev];
  const uint8_t *code = NULL, *v;
  size_t n = 0, size = 0;
  void *d;
  if (has_code(lib, (unsigned)(g->major * 10 + g->minor), &code, &n) != 2 ||
      !(v = cubin_symbol(code, n, name, &size)))
    return CUDA_ERROR_NOT_FOUND;
  if (cudaMalloc(&d, size ? size : 1) != cudaSuccess)
    return CUDA_ERROR_OUT_OF_MEMORY;
  memcpy(d, v, size);
  *p = (CUdeviceptr)(uintptr_t)d;
  *bytes = size;
  return CUDA_SUCCESS;
}

static CUresult fake_func_set_attr(CUfunction f, CUfunction_attribute a,
                                   int v) {
  (void)f;
  return a == CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT && v == 100
             ? CUDA_SUCCESS
             : CUDA_ERROR_INVALID_VALUE;
}

static CUresult fake_occupancy(int *n, CUfunction fn, int threads,
                               size_t smem) {
  const struct CUkern_st *f = (const struct CUkern_st *)fn;
  BUMP(occupancy_queries);
  /* the narrow kernel for up to 512 threads, the wide one above */
  if (smem || f->device != cur_dev || threads < 32 || threads > 1024 ||
      (threads > 512) != !strcmp(f->name, "lynx_gpu_kernel_wide"))
    return CUDA_ERROR_INVALID_VALUE;
  *n = fake.module_per_sm ? fake.module_per_sm : 1;
  return CUDA_SUCCESS;
}

static CUresult fake_launch_kernel(CUfunction fn, unsigned gx, unsigned gy,
                                   unsigned gz, unsigned bx, unsigned by,
                                   unsigned bz, unsigned smem, CUstream s,
                                   void **params, void **extra) {
  const struct CUkern_st *f = (const struct CUkern_st *)fn;
  const struct lynx_cuda_launch *l = params ? params[0] : NULL;
  char err[128];
  BUMP(module_launches);
  if (fake.err_module_launch != CUDA_SUCCESS)
    return fake.err_module_launch;
  if (sticky_of(cur_dev) != cudaSuccess)
    return (CUresult)sticky_of(cur_dev);
  if (!l || extra || smem || gy != 1 || gz != 1 || by != 1 || bz != 1 ||
      gx != l->blocks || bx != l->threads || f->device != cur_dev)
    return CUDA_ERROR_INVALID_VALUE;
  return launch(l, s, f->name, err, sizeof(err)) ? CUDA_ERROR_INVALID_VALUE
                                                 : CUDA_SUCCESS;
}

static CUresult fake_err_string(CUresult r, const char **s) {
  *s = r == CUDA_ERROR_NO_BINARY_FOR_GPU ? "no kernel image is available for "
                                           "execution on the device"
       : r == CUDA_ERROR_NOT_FOUND       ? "named symbol not found"
                                         : "fake driver error";
  return CUDA_SUCCESS;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n,
                       enum cudaMemcpyKind kind) {
  int ok;
  pthread_mutex_lock(&lock);
  fake.memcpys++;
  ok = kind == cudaMemcpyDeviceToHost ? find_live(src, n) != NULL
                                      : find_live(dst, n) != NULL;
  pthread_mutex_unlock(&lock);
  if (!ok) {
    BUMP(bad_copies);
    return cudaErrorInvalidValue;
  }
  memcpy(dst, src, n);
  return cudaSuccess;
}

cudaError_t
cudaGetDriverEntryPointByVersion(const char *sym, void **fn, unsigned ver,
                                 unsigned long long flags,
                                 enum cudaDriverEntryPointQueryResult *q) {
  *fn = NULL;
  *q = cudaDriverEntryPointSymbolNotFound;
  if (!strcmp(sym, "cuMemGetHandleForAddressRange") && !fake.no_get_handle)
    *fn = (void *)fake_get_handle;
  else if (!strcmp(sym, "cuPointerSetAttribute"))
    *fn = (void *)fake_set_attr;
  else if (!strcmp(sym, "cuLibraryLoadData"))
    *fn = (void *)fake_lib_load;
  else if (!strcmp(sym, "cuLibraryUnload"))
    *fn = (void *)fake_lib_unload;
  else if (!strcmp(sym, "cuLibraryGetKernel"))
    *fn = (void *)fake_get_kernel;
  else if (!strcmp(sym, "cuKernelGetFunction"))
    *fn = (void *)fake_get_function;
  else if (!strcmp(sym, "cuLibraryGetGlobal"))
    *fn = (void *)fake_get_global;
  else if (!strcmp(sym, "cuFuncSetAttribute"))
    *fn = (void *)fake_func_set_attr;
  else if (!strcmp(sym, "cuOccupancyMaxActiveBlocksPerMultiprocessor"))
    *fn = (void *)fake_occupancy;
  else if (!strcmp(sym, "cuLaunchKernel"))
    *fn = (void *)fake_launch_kernel;
  else if (!strcmp(sym, "cuGetErrorString"))
    *fn = (void *)fake_err_string;
  if (*fn)
    *q = cudaDriverEntryPointSuccess;
  return cudaSuccess;
}

/* ---- verbs registration -------------------------------------------------- */

struct mr_node {
  struct ibv_mr mr;
  struct mr_node *next;
};
static struct mr_node *mrs;
static uint32_t next_key = 0x100;

static struct ibv_mr *new_mr(struct ibv_pd *pd, void *addr, size_t len) {
  struct mr_node *n = calloc(1, sizeof(*n));
  if (!n)
    return NULL;
  n->mr.pd = pd;
  n->mr.addr = addr;
  n->mr.length = len;
  pthread_mutex_lock(&lock);
  n->mr.lkey = n->mr.rkey = next_key++;
  n->next = mrs;
  mrs = n;
  pthread_mutex_unlock(&lock);
  return &n->mr;
}

struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset,
                                 size_t length, uint64_t iova, int fd,
                                 int access) {
  BUMP(dmabuf_mrs);
  fake.dmabuf.pd = pd;
  fake.dmabuf.offset = offset;
  fake.dmabuf.length = length;
  fake.dmabuf.iova = iova;
  fake.dmabuf.fd = fd;
  fake.dmabuf.access = access;
  if (fake.err_dmabuf_mr) {
    errno = fake.err_dmabuf_mr;
    return NULL;
  }
  return new_mr(pd, (void *)(uintptr_t)iova, length);
}

#undef ibv_reg_mr
struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length,
                          int access) {
  BUMP(reg_mrs);
  fake.regmr.pd = pd;
  fake.regmr.addr = addr;
  fake.regmr.length = length;
  fake.regmr.access = access;
  if (fake.err_reg_mr) {
    errno = fake.err_reg_mr;
    return NULL;
  }
  return new_mr(pd, addr, length);
}

struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length,
                                uint64_t iova, unsigned int access) {
  return ibv_reg_mr(pd, addr, length, (int)access);
}

/* ---- the kernel-side interface (lynx_cuda.h) ----------------------------- */

int lynx_cuda_resident_blocks(int device, uint32_t threads, uint32_t *max,
                              char *err, size_t errlen) {
  *max = 0;
  if (threads < 32 || threads > 1024 || threads % 32) {
    snprintf(err, errlen, "%u threads per block: must be a multiple of 32",
             threads);
    return (int)cudaErrorInvalidValue;
  }
  if (!fake.resident) {
    snprintf(err, errlen, "not one block fits an SM");
    return (int)cudaErrorInvalidConfiguration;
  }
  *max = fake.resident;
  return 0;
}

/* A launch of l on stream: lynx_cuda_start's, or a module's kernel
 * function (cuLaunchKernel). */
static int launch(const struct lynx_cuda_launch *l, void *stream,
                  const char *function, char *err, size_t errlen) {
  struct CUstream_st *s = stream;
  size_t kn = lynx_cuda_kctl_size(l->blocks);
  struct kern *k;
  pthread_mutex_lock(&lock);
  if (!s || s->destroyed || s->k || !l->blocks ||
      !(find_live(l->region, 4096) || host_mapped(l->region, 4096)) ||
      !find_live(l->kctl, kn) ||
      !find_live(l->config, (size_t)l->config_len + 1)) {
    pthread_mutex_unlock(&lock);
    snprintf(err, errlen, "fake: bad launch");
    return -EINVAL;
  }
  pthread_mutex_unlock(&lock);
  /* what lynx_cuda_launch_check asks of a kernel that calls back ends:
   * each block's own client mqueue of every back end */
  if (l->calls &&
      (l->n_backends < 1 || l->app_backend >= l->n_backends ||
       l->client_base != l->n_server ||
       l->client_base + l->blocks * l->n_backends != l->n_mqueues)) {
    snprintf(err, errlen, "fake: bad client mqueue layout");
    return -EINVAL;
  }
  if (l->config[l->config_len] || strlen(l->config) != l->config_len) {
    snprintf(err, errlen, "fake: configuration of the wrong length");
    return -EINVAL;
  }
  for (size_t i = 0; i < kn; i++)
    if (((const uint8_t *)l->kctl)[i] &&
        (i < offsetof(struct lynx_cuda_kctl, serve_until_gt) ||
         i >= offsetof(struct lynx_cuda_kctl, now_gt))) {
      snprintf(err, errlen, "fake: control block not zeroed");
      return -EINVAL;
    }
  k = calloc(1, sizeof(*k));
  if (!k)
    return (int)cudaErrorMemoryAllocation;
  k->pub.l = *l;
  k->pub.function = function;
  k->pub.launch_fence = l->kctl->serve_until_gt;
  k->pub.stream = s;
  k->pub.device = cur_dev;
  k->pub.hang = fake.hang_next;
  fake.hang_next = 0;
  {
    uint32_t room = blocks_free(cur_dev, NULL);
    k->pub.resident = l->blocks < room ? l->blocks : room;
  }
  k->pub.running = 1;
  pthread_mutex_lock(&lock);
  s->k = k;
  k->next = kernels;
  kernels = k;
  n_kernels++;
  pthread_mutex_unlock(&lock);
  if (pthread_create(&k->thread, NULL, kernel_main, k))
    abort();
  return 0;
}

int lynx_cuda_start(const struct lynx_cuda_launch *l, void *stream, char *err,
                    size_t errlen) {
  BUMP(launches);
  if (fake.err_launch) {
    snprintf(err, errlen, "fake launch failure %d", fake.err_launch);
    return fake.err_launch;
  }
  if (l->calls != (uint32_t)lynx_cuda_app_calls(l->app)) {
    snprintf(err, errlen, "fake: calls is not the app's");
    return -EINVAL;
  }
  return launch(l, stream, NULL, err, errlen);
}

uint64_t fake_cuda_globaltimer(void) {
  uint64_t t = lynx_now_ns() + FAKE_GT_OFFSET_NS;
  uint64_t step = __atomic_load_n(&fake.timer_step_ns, __ATOMIC_RELAXED);
  return step ? t - t % step : t;
}

/* ---- test control ------------------------------------------------------ */

void fake_cuda_reset(void) {
  int n = fake.n_gpus;
  struct fake_gpu g[FAKE_GPUS];
  memcpy(g, fake.gpu, sizeof(g));
  pthread_mutex_lock(&lock);
  memset(&fake, 0, sizeof(fake));
  fake.n_gpus = n;
  memcpy(fake.gpu, g, sizeof(g));
  fake.resident = 8;
  fake.handle_fd = -1;
  fake.driver_version = fake.runtime_version = 13000;
  pthread_mutex_unlock(&lock);
}

void fake_cuda_gpus(int n) {
  fake.n_gpus = n;
  for (int i = 0; i < FAKE_GPUS; i++) {
    struct fake_gpu *g = &fake.gpu[i];
    snprintf(g->name, sizeof(g->name), "Fake GPU %d", i);
    snprintf(g->pci_bus_id, sizeof(g->pci_bus_id), "0000:0%d:00.0", i + 1);
    g->memory = (size_t)80 << 30;
    g->major = 9;
    g->minor = 0;
    g->sms = 132;
    g->gpudirect_rdma = 1;
    g->writes_ordering = cudaGPUDirectRDMAWritesOrderingOwner;
  }
}

int fake_cuda_copies(int from, cudaStream_t s) {
  int n = 0;
  pthread_mutex_lock(&lock);
  for (int i = from; i < fake.n_ops; i++)
    n += !fake.ops[i].memset && (!s || fake.ops[i].stream == s);
  pthread_mutex_unlock(&lock);
  return n;
}

void fake_cuda_reap(void) {
  for (struct kern *k = kernels; k; k = k->next)
    kernel_end(k);
  while (kernels) {
    struct kern *k = kernels;
    kernels = k->next;
    free(k);
  }
  n_kernels = 0;
  while (allocs) {
    struct alloc *a = allocs;
    allocs = a->next;
    free(a->p);
    free(a);
  }
  while (streams) {
    struct CUstream_st *s = streams;
    streams = s->next;
    complete_until(s, UINT64_MAX);
    free(s);
  }
  while (events) {
    struct CUevent_st *e = events;
    events = e->next;
    free(e);
  }
  while (pinned) {
    struct pinned *h = pinned;
    pinned = h->next;
    free(h->p);
    free(h);
  }
  while (kerns) {
    struct CUkern_st *k = kerns;
    kerns = k->next;
    free(k);
  }
  while (libs) {
    struct CUlib_st *l = libs;
    libs = l->next;
    free(l->image);
    free(l);
  }
  while (mrs) {
    struct mr_node *n = mrs;
    mrs = n->next;
    free(n);
  }
  while (host_regs) {
    struct host_reg *h = host_regs;
    host_regs = h->next;
    free(h);
  }
}
