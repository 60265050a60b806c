/*
 * cuda_calls.c - CUDA calls that may wait for the device, made on a thread
 * of their own so that the agent's thread never waits behind a persistent
 * kernel (issue 35, finding 2).
 *
 * Page-locking and device allocation are on the CUDA programming guide's
 * list of operations that may synchronise implicitly: cudaHostRegister,
 * cudaHostUnregister, cudaMalloc and cudaHostAlloc are not documented as
 * non-synchronising, and whether a driver makes them wait for running
 * kernels is measured on a GPU host (make gpu-prove's probe says, per
 * call). Where one does, a persistent kernel never ends on its own, so the
 * call would return only once every other instance on the GPU stopped: the
 * agent's thread, which starts and stops instances and sends heartbeats,
 * must never be the one waiting.
 *
 * So each such call is queued to one thread (all of them, in order: an
 * unregistration queued at a stop runs before a registration of the same
 * addresses queued at a later start) and its caller waits a bounded time:
 *   - At a start (registration, allocation): up to CALL_WAIT_MS, then the
 *     start fails with the reason, and the call, still queued or waiting in
 *     the driver, is undone when it returns (a registration unregistered,
 *     memory handed to the caller's give_back: cuda_pool.c's pools).
 *   - At a stop (unregistration): not at all. The host memory registered is
 *     the backend's own mapping of the region's pages (lynx__cuda_map_host),
 *     so the transport may free its mapping at once; the thread unmaps ours
 *     once the driver has let go.
 * gpu_shutdown (cuda_pool.c) drains the queue first, a bounded time.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "cuda_internal.h"
#include "log.h"
#include "util.h"

enum call_kind { CALL_REGISTER, CALL_UNREGISTER, CALL_MALLOC, CALL_HOST_ALLOC };

struct call {
  enum call_kind kind;
  int device;
  void *p;     /* register, unregister: our mapping; alloc: the result */
  size_t size; /* its bytes (the mapping's, page-aligned, for munmap) */
  size_t map_len;
  cudaError_t e;
  lynx__cuda_give_back give_back; /* an abandoned allocation's memory */
  int done;                       /* the call returned (under calls.lock) */
  int abandoned; /* its caller no longer waits: the thread undoes it */
  struct call *next;
};

static struct {
  pthread_mutex_t lock;
  pthread_cond_t cond; /* work queued, or a call done */
  struct call *head, **tail;
  pthread_t thread;
  int started, exiting, exited, pending;
} calls = {.lock = PTHREAD_MUTEX_INITIALIZER,
           .cond = PTHREAD_COND_INITIALIZER,
           .tail = &calls.head};

/* now + ms on CLOCK_REALTIME, pthread_cond_timedwait's clock. */
static struct timespec after_ms(unsigned ms) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  t.tv_sec += ms / 1000;
  t.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (t.tv_nsec >= 1000000000L) {
    t.tv_sec++;
    t.tv_nsec -= 1000000000L;
  }
  return t;
}

static void unmap_ours(struct call *c) {
  if (c->p && c->map_len && munmap(c->p, c->map_len))
    LYNX_WARN("cuda", "GPU %d: cannot unmap a region's mapping: %s", c->device,
              strerror(errno));
}

/* The call itself, on the calls thread. */
static void run(struct call *c) {
  cudaError_t e = cudaSetDevice(c->device);
  if (e != cudaSuccess) {
    c->e = e;
    return;
  }
  switch (c->kind) {
  case CALL_REGISTER:
    c->e = cudaHostRegister(c->p, c->size,
                            cudaHostRegisterMapped | cudaHostRegisterPortable);
    break;
  case CALL_UNREGISTER:
    c->e = cudaHostUnregister(c->p);
    if (c->e != cudaSuccess)
      lynx__cuda_note(c->device, c->e, "host region unregistration");
    unmap_ours(c);
    break;
  case CALL_MALLOC:
    c->e = cudaMalloc(&c->p, c->size);
    break;
  case CALL_HOST_ALLOC:
    c->e = cudaHostAlloc(&c->p, c->size,
                         cudaHostAllocPortable | cudaHostAllocMapped);
    break;
  }
}

/* A call whose caller gave up, returned at last: what it got is undone. */
static void undo(struct call *c) {
  if (c->e != cudaSuccess) {
    if (c->kind == CALL_REGISTER)
      unmap_ours(c);
    return;
  }
  switch (c->kind) {
  case CALL_REGISTER:
    if (cudaHostUnregister(c->p) != cudaSuccess)
      LYNX_WARN("cuda", "GPU %d: a late registration could not be undone",
                c->device);
    unmap_ours(c);
    break;
  case CALL_MALLOC:
  case CALL_HOST_ALLOC:
    c->give_back(c->device, c->p, c->size);
    break;
  case CALL_UNREGISTER:
    break;
  }
  LYNX_INFO("cuda",
            "GPU %d: a call its start gave up on returned at last, and was "
            "undone",
            c->device);
}

static void *calls_main(void *arg) {
  (void)arg;
  pthread_setname_np(pthread_self(), "lynx-cuda-calls");
  pthread_mutex_lock(&calls.lock);
  for (;;) {
    struct call *c = calls.head;
    int forget;
    if (!c) {
      if (calls.exiting)
        break;
      pthread_cond_wait(&calls.cond, &calls.lock);
      continue;
    }
    calls.head = c->next;
    if (!calls.head)
      calls.tail = &calls.head;
    pthread_mutex_unlock(&calls.lock);
    run(c);
    pthread_mutex_lock(&calls.lock);
    c->done = 1;
    /* an unregistration has no waiter; an abandoned call's gave up: done
     * with it (undone) before it stops counting as pending */
    forget = c->kind == CALL_UNREGISTER || c->abandoned;
    if (forget) {
      int abandoned = c->abandoned;
      pthread_mutex_unlock(&calls.lock);
      if (abandoned)
        undo(c);
      free(c);
      pthread_mutex_lock(&calls.lock);
    }
    calls.pending--;
    pthread_cond_broadcast(&calls.cond);
  }
  calls.exited = 1;
  pthread_cond_broadcast(&calls.cond);
  pthread_mutex_unlock(&calls.lock);
  return NULL;
}

/* Under calls.lock: queues c (and starts the thread the first time). */
static int enqueue(struct call *c) {
  if (!calls.started) {
    if (pthread_create(&calls.thread, NULL, calls_main, NULL))
      return -EAGAIN;
    calls.started = 1;
  }
  c->next = NULL;
  *calls.tail = c;
  calls.tail = &c->next;
  calls.pending++;
  pthread_cond_broadcast(&calls.cond);
  return 0;
}

/* Queues c and waits up to CALL_WAIT_MS for it: its result, or
 * cudaErrorNotReady when it has not returned (c is then the thread's; with
 * any other result the caller frees it). */
static cudaError_t call_wait(struct call *c) {
  struct timespec until = after_ms(CALL_WAIT_MS);
  cudaError_t e;
  pthread_mutex_lock(&calls.lock);
  if (enqueue(c)) { /* no thread: c stays the caller's */
    pthread_mutex_unlock(&calls.lock);
    return cudaErrorMemoryAllocation;
  }
  while (!c->done &&
         pthread_cond_timedwait(&calls.cond, &calls.lock, &until) != ETIMEDOUT)
    ;
  if (!c->done) {
    c->abandoned = 1;
    pthread_mutex_unlock(&calls.lock);
    return cudaErrorNotReady;
  }
  pthread_mutex_unlock(&calls.lock);
  e = c->e;
  return e;
}

static struct call *new_call(enum call_kind kind, int device, size_t size) {
  struct call *c = calloc(1, sizeof(*c));
  if (c) {
    c->kind = kind;
    c->device = device;
    c->size = size;
  }
  return c;
}

static cudaError_t alloc_call(enum call_kind kind, int device, size_t size,
                              void **p, lynx__cuda_give_back give_back) {
  struct call *c = new_call(kind, device, size);
  cudaError_t e;
  if (!c)
    return cudaErrorMemoryAllocation;
  c->give_back = give_back;
  e = call_wait(c);
  if (e == cudaSuccess)
    *p = c->p;
  if (e != cudaErrorNotReady)
    free(c);
  return e;
}

cudaError_t lynx__cuda_call_malloc(int device, size_t size, void **p,
                                   lynx__cuda_give_back give_back) {
  return alloc_call(CALL_MALLOC, device, size, p, give_back);
}

cudaError_t lynx__cuda_call_host_alloc(int device, size_t size, void **p,
                                       lynx__cuda_give_back give_back) {
  return alloc_call(CALL_HOST_ALLOC, device, size, p, give_back);
}

cudaError_t lynx__cuda_call_register(int device, void *ours, size_t size,
                                     size_t map_len) {
  struct call *c = new_call(CALL_REGISTER, device, size);
  cudaError_t e;
  if (!c)
    return cudaErrorMemoryAllocation;
  c->p = ours;
  c->map_len = map_len; /* unmapped by the undo only */
  e = call_wait(c);
  if (e != cudaErrorNotReady)
    free(c);
  return e;
}

void lynx__cuda_call_unregister(int device, void *ours, size_t map_len) {
  struct call *c = new_call(CALL_UNREGISTER, device, 0);
  if (!c) { /* out of memory: the registration stays, the mapping too */
    LYNX_WARN("cuda", "GPU %d: out of memory: a host region stays registered",
              device);
    return;
  }
  c->p = ours;
  c->map_len = map_len;
  pthread_mutex_lock(&calls.lock);
  if (enqueue(c)) {
    pthread_mutex_unlock(&calls.lock);
    LYNX_WARN("cuda",
              "GPU %d: no thread for the unregistration of a host "
              "region: it stays registered",
              device);
    free(c);
    return;
  }
  pthread_mutex_unlock(&calls.lock);
}

int lynx__cuda_calls_pending(void) {
  int n;
  pthread_mutex_lock(&calls.lock);
  n = calls.pending;
  pthread_mutex_unlock(&calls.lock);
  return n;
}

int lynx__cuda_calls_drain(unsigned wait_ms) {
  struct timespec until = after_ms(wait_ms);
  int left;
  pthread_mutex_lock(&calls.lock);
  if (!calls.started) {
    pthread_mutex_unlock(&calls.lock);
    return 0;
  }
  calls.exiting = 1;
  pthread_cond_broadcast(&calls.cond);
  while (!calls.exited &&
         pthread_cond_timedwait(&calls.cond, &calls.lock, &until) != ETIMEDOUT)
    ;
  left = calls.pending;
  if (calls.exited) {
    pthread_mutex_unlock(&calls.lock);
    pthread_join(calls.thread, NULL);
    pthread_mutex_lock(&calls.lock);
    calls.started = calls.exiting = calls.exited = 0;
  }
  pthread_mutex_unlock(&calls.lock);
  return left;
}
