/*
 * apps.cu - the persistent kernel that serves a GPU's server mqueues, its
 * applications, and the host-callable interface of lynx_cuda.h.
 *
 * One launch, every block resident for the kernel's lifetime (the agent
 * checks lynx_cuda_resident_blocks first: a block that waits for another to
 * finish would leave its mqueues unserved forever). Block b serves server
 * mqueues b, b + blocks, b + 2*blocks, ... and loops until the host sets
 * kctl->stop:
 *
 *   pass:  for each of its mqueues, at most one request (as accel/cpu_accel.c:
 *          requests spread over the mqueues are answered in arrival order and
 *          none starves): a held request first (one the app could not answer
 *          because the TX ring was full), else one receive attempt unless the
 *          lease fence (kctl->serve_until_gt) has passed; emulated work; the
 *          app; release. Block 0 publishes %globaltimer (kctl->now_gt).
 *          Then the block's counters go to kctl->blocks[b], and an idle pass
 *          sleeps (lynx_block_idle).
 *
 * The applications are the CPU handlers' twins (accel/apps.c), with the
 * per-request decisions in accel/app_logic.h, which the CPU unit tests run.
 * Each is called by all threads of the block and returns, in all threads,
 * 0 (finished with the request: the caller releases it), APP_AGAIN (the TX
 * ring is full: the request is kept unreleased and retried on a later pass)
 * or APP_STOP (the host asked the kernel to stop while the app was holding
 * the block). Nothing here has run on a GPU (docs/mqueue.md, "On the GPU").
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cuda_runtime.h>

#include "app_logic.h"
#include "lynx_cuda.h"
#include "lynx_dev.cuh"

/* Mqueues one block can serve: their state lives in the block's shared
 * memory (LYNX_CUDA_MQS_PER_BLOCK * sizeof(struct kmq), 6 KiB). Launch more
 * blocks for more mqueues. */
#define LYNX_CUDA_MQS_PER_BLOCK 64u
#define LYNX_CUDA_THREADS_MAX 1024u

#define APP_AGAIN (-11) /* EAGAIN */
#define APP_STOP (-125) /* ECANCELED */
#define LYNX_EINVAL (-22)

/* One served mqueue, in shared memory, read and written by the I/O thread
 * only (other threads learn what they need through broadcasts). */
struct kmq {
  struct lynx_mq mq;
  struct lynx_msg held; /* a request the app could not answer yet */
  uint32_t has_held;
};

/* ---- applications ---------------------------------------------------- */

static __device__ int app_echo(struct lynx_mq *mq, const struct lynx_msg *req,
                               int *replied) {
  int rc = lynx_block_send(mq, req->tag, req->data, req->len);
  *replied = rc == 0;
  return rc == -11 ? APP_AGAIN : 0;
}

/* Like sockperf's own server: answer pong requests with the client flag
 * cleared, drop everything else (the frontend frees its tag at once). */
static __device__ int app_sockperf(struct lynx_mq *mq,
                                   const struct lynx_msg *req, int *replied) {
  uint8_t hdr[LYNX_SOCKPERF_HDR];
  uint8_t *buf;
  int want = 0, rc;
  *replied = 0;
  if (lynx_block_io_thread()) {
    /* lynx_sockperf_wants_reply reads only the header and only when len
     * covers it: a peek of at most 14 bytes (L1 bypass) decides */
    lynx_dev_peek(hdr, req->data,
                  req->len < LYNX_SOCKPERF_HDR ? req->len : LYNX_SOCKPERF_HDR);
    want = lynx_sockperf_wants_reply(hdr, req->len);
  }
  if (!lynx_block_any(want))
    return lynx_block_drop(mq, req->tag) == -11 ? APP_AGAIN : 0;
  rc = lynx_block_reserve(mq, req->len, &buf);
  if (rc)
    return rc == -11 ? APP_AGAIN : 0;
  lynx_block_copy(buf, req->data, req->len);
  /* after lynx_block_copy's barrier: bytes 8 and 9 are written, whoever
   * copied them; the commit's fences cover this write too */
  if (lynx_block_io_thread())
    lynx_sockperf_make_reply(buf);
  lynx_block_commit(mq, req->tag, req->len, req->len);
  *replied = 1;
  return 0;
}

/* Thread 0: waits ms milliseconds on %globaltimer, checking the stop word
 * every nap; 1 when stopped. */
static __device__ int hang_ms(uint32_t ms, const uint32_t *stop) {
  uint64_t end = lynx_globaltimer_ns() + (uint64_t)ms * 1000000u;
  while (lynx_globaltimer_ns() < end) {
    if (*(const volatile uint32_t *)stop)
      return 1;
    __nanosleep(LYNX_NANOSLEEP_MAX_NS / 10u); /* 100 us */
  }
  return 0;
}

/*
 * sockperf-fault: sockperf-echo with fault injection, the twin of the CPU
 * handler (accel/apps.c). "LYNX-HANG <ms>" (app_logic.h) holds the block for
 * ms milliseconds without releasing the RX slot, so the agent's liveness
 * check sees rx_cons stand still, as for a hung kernel; then the request is
 * handled as by sockperf-echo (a LYNX-HANG request is no pong request: it is
 * dropped).
 * The request is first copied into a reserved TX slot and inspected there:
 * lynx_fault_hang_ms may read the whole request (leading zeros), the copy is
 * the block's own memory (no stale-L1 question), and the reservation holds
 * across the hang, so the answer or drop after it cannot find the TX ring
 * full: a request is never held twice.
 */
static __device__ int app_sockperf_fault(struct lynx_mq *mq,
                                         const struct lynx_msg *req,
                                         int *replied, const uint32_t *stop) {
  uint8_t *buf;
  int stopped = 0, want = 0, rc;
  *replied = 0;
  rc = lynx_block_reserve(mq, req->len, &buf);
  if (rc)
    return rc == -11 ? APP_AGAIN : 0;
  lynx_block_copy(buf, req->data, req->len);
  if (lynx_block_io_thread()) {
    uint32_t ms = lynx_fault_hang_ms(buf, req->len);
    if (ms)
      stopped = hang_ms(ms, stop);
    want = !stopped && lynx_sockperf_wants_reply(buf, req->len);
  }
  if (lynx_block_any(stopped))
    return APP_STOP; /* unanswered: the kernel is going away */
  if (!lynx_block_any(want)) {
    /* the open reservation guarantees the room: this cannot be -EAGAIN */
    lynx_block_drop(mq, req->tag);
    return 0;
  }
  if (lynx_block_io_thread())
    lynx_sockperf_make_reply(buf);
  lynx_block_commit(mq, req->tag, req->len, req->len);
  *replied = 1;
  return 0;
}

static __device__ int run_app(const struct lynx_cuda_launch *l,
                              struct lynx_mq *mq, const struct lynx_msg *req,
                              int *replied) {
  switch (l->app) { /* uniform: a kernel parameter */
  case LYNX_CUDA_APP_ECHO:
    return app_echo(mq, req, replied);
  case LYNX_CUDA_APP_SOCKPERF_ECHO:
    return app_sockperf(mq, req, replied);
  case LYNX_CUDA_APP_SOCKPERF_FAULT:
    return app_sockperf_fault(mq, req, replied, &l->kctl->stop);
  default: /* refused by lynx_cuda_start */
    *replied = 0;
    return 0;
  }
}

/* ---- the persistent kernel --------------------------------------------- */

/*
 * One mqueue's turn in a pass: 1 when a request was finished with, 0 when
 * nothing was (none waiting, or the TX ring still full), APP_STOP. st is the
 * I/O thread's counters (other threads' copies are unused).
 */
/* 1 in every thread while the lease fence stops new requests: read right
 * before each receive, so no request is taken past the host's deadline. */
static __device__ int fenced(const struct lynx_cuda_kctl *kctl) {
  int f = 0;
  if (lynx_block_io_thread()) {
    uint64_t until =
        *(const volatile uint64_t *)&kctl->serve_until_gt;
    f = until && lynx_globaltimer_ns() >= until;
  }
  return lynx_block_any(f);
}

static __device__ int serve_mq(const struct lynx_cuda_launch *l, struct kmq *s,
                               struct lynx_cuda_block_stats *st) {
  struct lynx_msg m = {NULL, 0, 0, 0};
  int held = lynx_block_any(lynx_block_io_thread() && s->has_held);
  int replied = 0, rc;
  if (held) {
    if (lynx_block_io_thread())
      m = s->held;
    lynx_block_bcast_msg(&m);
  } else {
    if (fenced(l->kctl))
      return 0;
    if (lynx_block_recv(&s->mq, &m) != 0)
      return 0;
    if (lynx_block_io_thread())
      st->requests++;
    lynx_block_work_us(l->work_us); /* once per request, not per retry */
  }
  rc = run_app(l, &s->mq, &m, &replied);
  if (rc == APP_STOP)
    return APP_STOP;
  if (rc == APP_AGAIN) {
    if (lynx_block_io_thread()) {
      s->held = m;
      s->has_held = 1;
    }
    return 0;
  }
  if (lynx_block_io_thread()) {
    s->has_held = 0;
    if (replied)
      st->responses++;
    else
      st->drops++;
  }
  lynx_block_release(&s->mq);
  return 1;
}

/* The host copies kctl->blocks out while the kernel runs: volatile stores,
 * so each update really reaches memory (L2) instead of staying in registers
 * across the endless loop; a reader may see a mix of two consecutive
 * snapshots, which is fine for monotonic counters. */
static __device__ void publish_stats(struct lynx_cuda_block_stats *out,
                                     const struct lynx_cuda_block_stats *st) {
  volatile struct lynx_cuda_block_stats *v = out;
  v->requests = st->requests;
  v->responses = st->responses;
  v->drops = st->drops;
  v->bad = st->bad;
}

__global__ void __launch_bounds__(LYNX_CUDA_THREADS_MAX)
    lynx_cuda_kernel(struct lynx_cuda_launch l) {
  __shared__ struct kmq kmqs[LYNX_CUDA_MQS_PER_BLOCK];
  __shared__ uint32_t n_kmqs;
  struct lynx_cuda_kctl *kctl = l.kctl;
  struct lynx_cuda_block_stats st = {0, 0, 0, 0};
  struct lynx_idle idle;
  uint64_t published_requests = 0;
  uint32_t n;

  if (lynx_block_io_thread()) {
    struct lynx_geom g;
    n = 0;
    /* checked by lynx_cuda_start; a failure here serves nothing */
    if (lynx_geom_init(&g, l.n_mqueues, l.slots, l.slot_size) == 0)
      for (uint32_t q = blockIdx.x;
           q < l.n_server && n < LYNX_CUDA_MQS_PER_BLOCK; q += l.blocks) {
        lynx_mq_bind(&kmqs[n].mq, (uint8_t *)l.region, &g, q);
        kmqs[n].has_held = 0;
        n++;
      }
    n_kmqs = n;
    if (blockIdx.x == 0)
      *(volatile uint64_t *)&kctl->now_gt = lynx_globaltimer_ns();
    atomicAdd(&kctl->started, 1u);
  }
  __syncthreads();
  n = n_kmqs;
  lynx_idle_init(&idle, l.idle_ns);

  while (!lynx_block_flag(&kctl->stop)) {
    int work = 0, stop = 0;
    for (uint32_t i = 0; i < n; i++) {
      int rc = serve_mq(&l, &kmqs[i], &st);
      if (rc == APP_STOP) {
        stop = 1;
        break;
      }
      work += rc;
    }
    if (lynx_block_io_thread()) {
      uint64_t bad = 0;
      if (blockIdx.x == 0) /* the agent's clock calibration */
        *(volatile uint64_t *)&kctl->now_gt = lynx_globaltimer_ns();
      for (uint32_t i = 0; i < n; i++)
        bad += kmqs[i].mq.bad; /* counted by the ring code (lynx_mq_recv) */
      /* requests too: one held for a full TX ring counts before it is done */
      if (work || bad != st.bad || st.requests != published_requests) {
        st.bad = bad;
        published_requests = st.requests;
        publish_stats(&kctl->blocks[blockIdx.x], &st);
      }
    }
    if (stop)
      break;
    lynx_block_idle(&idle, work);
  }

  if (lynx_block_io_thread()) {
    publish_stats(&kctl->blocks[blockIdx.x], &st);
    __threadfence_system(); /* counters before the exit count */
    atomicAdd(&kctl->exited, 1u);
  }
}

/* ---- host interface (lynx_cuda.h) ----------------------------------------- */

static int fail(int rc, char *err, size_t errlen, const char *what,
                cudaError_t e) {
  if (err && errlen)
    snprintf(err, errlen, "%s: %s", what, cudaGetErrorString(e));
  return rc;
}

size_t lynx_cuda_kctl_size(uint32_t blocks) {
  return sizeof(struct lynx_cuda_kctl) +
         (size_t)blocks * sizeof(struct lynx_cuda_block_stats);
}

static int threads_ok(uint32_t threads) {
  return threads >= 32 && threads <= LYNX_CUDA_THREADS_MAX && threads % 32 == 0;
}

int lynx_cuda_resident_blocks(int device, uint32_t threads, uint32_t *max,
                              char *err, size_t errlen) {
  int cur = 0, per_sm = 0, sms = 0;
  cudaError_t e, e2;
  *max = 0;
  if (!threads_ok(threads)) {
    if (err && errlen)
      snprintf(err, errlen,
               "%u threads per block: must be a multiple of 32 in 32..%u",
               threads, LYNX_CUDA_THREADS_MAX);
    return (int)cudaErrorInvalidValue;
  }
  e = cudaGetDevice(&cur);
  if (e != cudaSuccess)
    return fail((int)e, err, errlen, "cudaGetDevice", e);
  /* the occupancy query is for the current device: switch, then restore */
  e = cudaSetDevice(device);
  if (e != cudaSuccess)
    return fail((int)e, err, errlen, "cudaSetDevice", e);
  e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, lynx_cuda_kernel,
                                                    (int)threads, 0);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  e2 = cudaSetDevice(cur);
  if (e != cudaSuccess)
    return fail((int)e, err, errlen, "occupancy of the persistent kernel", e);
  if (e2 != cudaSuccess)
    return fail((int)e2, err, errlen, "cudaSetDevice (restore)", e2);
  if (per_sm <= 0 || sms <= 0) {
    /* e.g. more registers per thread than a block of that size can get */
    if (err && errlen)
      snprintf(err, errlen,
               "device %d cannot run the persistent kernel with %u threads "
               "per block",
               device, threads);
    return (int)cudaErrorInvalidConfiguration;
  }
  *max = (uint32_t)per_sm * (uint32_t)sms;
  return 0;
}

static int einval(char *err, size_t errlen, const char *msg) {
  if (err && errlen)
    snprintf(err, errlen, "%s", msg);
  return LYNX_EINVAL;
}

int lynx_cuda_start(const struct lynx_cuda_launch *l, void *stream,
                     char *err, size_t errlen) {
  struct lynx_geom g;
  uint32_t per_block;
  cudaError_t e;
  if (!l || !l->region || !l->kctl)
    return einval(err, errlen, "launch: no region or no control block");
  if (lynx_geom_init(&g, l->n_mqueues, l->slots, l->slot_size))
    return einval(err, errlen, "launch: region geometry out of bounds");
  if (l->n_server < 1 || l->n_server > l->n_mqueues)
    return einval(err, errlen,
                  "launch: server mqueues must be 1..the region's mqueues");
  if (l->app != LYNX_CUDA_APP_ECHO && l->app != LYNX_CUDA_APP_SOCKPERF_ECHO &&
      l->app != LYNX_CUDA_APP_SOCKPERF_FAULT)
    return einval(err, errlen, "launch: no CUDA kernel for that application");
  if (!threads_ok(l->threads))
    return einval(err, errlen,
                  "launch: threads per block must be a multiple of 32 in "
                  "32..1024");
  if (l->blocks < 1 || l->blocks > (uint32_t)INT32_MAX)
    return einval(err, errlen, "launch: bad block count");
  per_block = (l->n_server + l->blocks - 1) / l->blocks;
  if (per_block > LYNX_CUDA_MQS_PER_BLOCK) {
    if (err && errlen)
      snprintf(err, errlen,
               "launch: %u server mqueues over %u blocks is %u per block; a "
               "block serves at most %u (launch at least %u blocks)",
               l->n_server, l->blocks, per_block, LYNX_CUDA_MQS_PER_BLOCK,
               (l->n_server + LYNX_CUDA_MQS_PER_BLOCK - 1) /
                   LYNX_CUDA_MQS_PER_BLOCK);
    return LYNX_EINVAL;
  }
  lynx_cuda_kernel<<<l->blocks, l->threads, 0, (cudaStream_t)stream>>>(*l);
  e = cudaGetLastError();
  if (e != cudaSuccess)
    return fail((int)e, err, errlen, "launch of the persistent kernel", e);
  return 0;
}
