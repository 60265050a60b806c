/*
 * lynx_kernel.cuh - the persistent kernel of a GPU application, from the
 * SDK (docs/writing-apps.md, "GPU applications"). The user writes one
 * per-request device function; LYNX_GPU_APP wraps it in this kernel, which
 * does everything else: polling the block's mqueues, ordering and fences,
 * the lease fence, latency stamps, counters and the stop word.
 *
 *   #include <lynx/lynx_kernel.cuh>
 *   static __device__ int handle(const struct lynx_cuda_launch *l,
 *                                struct lynx_mq *mq,
 *                                const struct lynx_msg *req, int *replied)
 *   { ... lynx_block_send(mq, req->tag, out, len) ... }
 *   LYNX_GPU_APP("my-app", "what it does", handle)
 *
 * compiled to a fatbin for the GPUs it runs on (nvcc -fatbin -gencode
 * arch=compute_90,code=sm_90 ...) and loaded by the agent (--app-load).
 * The agent's built-in applications are this kernel too (accel/cuda/apps.cu).
 *
 * One launch, every block resident for the kernel's lifetime (the agent
 * checks the module's occupancy first: a block that waits for another to
 * finish would leave its mqueues unserved forever). Block b serves server
 * mqueues b, b + blocks, b + 2*blocks, ... (up to LYNX_CUDA_MQS_PER_BLOCK)
 * and loops until the host sets kctl->stop:
 *
 *   scan:  the block's first warp looks at all its mqueues at once, one
 *          lane per mqueue (32 seq-word loads in flight, not one after
 *          another: a pass over 64 idle host-mapped mqueues costs two
 *          PCIe round trips, not 64), stamps newly published requests
 *          (lathist.h, first seen) and marks the mqueues with a request
 *          waiting or held;
 *   serve: for each marked mqueue, at most one request (requests spread
 *          over the mqueues are answered in arrival order and none
 *          starves): a held request first (one the handler could not
 *          answer because the TX ring was full), else one receive unless
 *          the lease fence (kctl->serve_until_gt) has passed; emulated
 *          work; the handler; release. Taking and finishing a request are
 *          stamped with %globaltimer into the block's queueing and service
 *          histograms. Block 0 publishes %globaltimer (kctl->now_gt). Then
 *          the block's counters go to kctl->blocks[b], and an idle pass
 *          sleeps (lynx_block_idle).
 *
 * The handler is called by all threads of the block, from uniform control
 * flow (lynx_dev.cuh's calling rule), with the request in its RX slot
 * (req->data, req->len bytes: read it in place or copy it with
 * lynx_block_copy), and returns, in all threads, 0 (finished with the
 * request: the kernel releases it; *replied 1 when it published an
 * answer, 0 when it dropped the request), LYNX_GPU_AGAIN (the TX ring is
 * full: the request is kept unreleased and handed again on a later pass,
 * so a handler returns it only before it has published anything) or
 * LYNX_GPU_STOP (the host asked the kernel to stop while the handler held
 * the block: the request goes unanswered). l is the launch: the service's
 * configuration (l->config, l->config_len), the geometry, the stop word
 * (l->kctl->stop). A handler that calls the back end (LYNX_GPU_APP_CALLS)
 * uses lynx_gpu_client() with lynx_block_call.
 */
#ifndef LYNX_KERNEL_CUH
#define LYNX_KERNEL_CUH

#include <stddef.h>
#include <stdint.h>

#include "lathist.h"
#include "lynx_dev.cuh"
#include "lynx_gpu.h"
#include "mqueue.h"

/* A handler's results besides 0 (above). */
#define LYNX_GPU_AGAIN (-11) /* EAGAIN */
#define LYNX_GPU_STOP (-125) /* ECANCELED */

/* The signature LYNX_GPU_APP wraps. */
typedef int (*lynx_gpu_handler)(const struct lynx_cuda_launch *l,
                                struct lynx_mq *mq, const struct lynx_msg *req,
                                int *replied);

/* One served mqueue, in shared memory, read and written by the I/O thread
 * only (other threads learn what they need through broadcasts). */
struct lynx_kmq {
  struct lynx_mq mq;
  struct lynx_msg held; /* a request the app could not answer yet */
  uint32_t has_held;
  uint64_t taken_gt;     /* when the request in hand was taken */
  struct lynx_seen seen; /* first-seen stamps (lathist.h) */
};

/* The block's latency histograms: kept in shared memory, each changed
 * word also stored to the control block (a posted store, no read back),
 * where the agent copies them from. Thread 0 only. */
struct lynx_klat {
  struct lynx_lat sh;
  struct lynx_lat *gl;
};

static __device__ void lynx_gpu_lat_add(struct lynx_lat_hist *sh,
                                        struct lynx_lat_hist *gl, uint64_t ns) {
  uint32_t b = lynx_lat_bucket(ns);
  uint64_t v = sh->b[b] + 1u;
  sh->b[b] = v;
  ((volatile uint64_t *)gl->b)[b] = v;
  v = sh->sum_ns + ns;
  sh->sum_ns = v;
  *(volatile uint64_t *)&gl->sum_ns = v;
}

/* The block's client mqueue of the back end its app calls, its own
 * (lynx_gpu.h, lynx_cuda_client_mq): bound by the kernel's I/O thread at
 * start when the app calls one (l->calls). */
static __device__ struct lynx_dev_client *lynx_gpu_client(void) {
  __shared__ struct lynx_dev_client c;
  return &c;
}

/* ---- the persistent kernel --------------------------------------------- */

/* 1 in every thread while the lease fence stops new requests: read right
 * before each receive, so no request is taken past the host's deadline. */
static __device__ int lynx_gpu_fenced(const struct lynx_cuda_kctl *kctl) {
  int f = 0;
  if (lynx_block_io_thread()) {
    uint64_t until = *(const volatile uint64_t *)&kctl->serve_until_gt;
    f = until && lynx_globaltimer_ns() >= until;
  }
  return lynx_block_any(f);
}

/*
 * One mqueue's turn in a pass: 1 when a request was finished with, 0 when
 * nothing was (none waiting, or the TX ring still full), LYNX_GPU_STOP. st and
 * lat are the I/O thread's counters and histograms (other threads' copies
 * are unused).
 */
template <lynx_gpu_handler H>
static __device__ int
lynx_gpu_serve_mq(const struct lynx_cuda_launch *l, struct lynx_kmq *s,
                  struct lynx_cuda_block_stats *st, struct lynx_klat *lat) {
  struct lynx_msg m = {NULL, 0, 0, 0};
  int held = lynx_block_any(lynx_block_io_thread() && s->has_held);
  int replied = 0, rc;
  if (held) {
    if (lynx_block_io_thread())
      m = s->held;
    lynx_block_bcast_msg(&m);
  } else {
    if (lynx_gpu_fenced(l->kctl))
      return 0;
    /* what the pass's look-ahead already saw published is not looked at
     * again: one round trip less per request over host memory. The scan's
     * acquire was another lane's; the barrier that ends scan()
     * puts this thread's loads after it, and causality order
     * is transitive, so they see what the producer released */
    if (lynx_block_recv_seen(&s->mq, &m, s->seen.acq) != 0)
      return 0;
    if (lynx_block_io_thread()) {
      uint64_t now = lynx_globaltimer_ns();
      st->requests++;
      s->taken_gt = now;
      lynx_gpu_lat_add(&lat->sh.queue, &lat->gl->queue,
                       now - lynx_seen_at(&s->seen, s->mq.rx_head - 1u, now));
    }
    lynx_block_work_us(l->work_us); /* once per request, not per retry */
  }
  rc = H(l, &s->mq, &m, &replied);
  if (rc == LYNX_GPU_STOP)
    return LYNX_GPU_STOP;
  if (rc == LYNX_GPU_AGAIN) {
    if (lynx_block_io_thread()) {
      s->held = m;
      s->has_held = 1;
    }
    return 0;
  }
  if (lynx_block_io_thread()) {
    uint64_t now = lynx_globaltimer_ns();
    lynx_gpu_lat_add(&lat->sh.service, &lat->gl->service,
                     now > s->taken_gt ? now - s->taken_gt : 0);
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
static __device__ void
lynx_gpu_publish_stats(struct lynx_cuda_block_stats *out,
                       const struct lynx_cuda_block_stats *st) {
  volatile struct lynx_cuda_block_stats *v = out;
  v->requests = st->requests;
  v->responses = st->responses;
  v->drops = st->drops;
  v->bad = st->bad;
}

#define LYNX_GPU_READY_WORDS ((LYNX_CUDA_MQS_PER_BLOCK + 31u) / 32u)

/*
 * The scan: the block's first warp, lane i looking at mqueues i, i + 32,
 * ...: stamps what each ring newly shows (lynx_seen_scan: seq-word loads
 * only, the lanes' loads in flight together) and sets ready[] bit k when
 * mqueue k has a request waiting at its head or a held one. The kmq state
 * it reads was last written by thread 0 before the barrier that precedes
 * the scan; lane i writes only its mqueues' seen stamps, which thread 0
 * reads after the barrier that follows. Called by all threads.
 */
static __device__ void lynx_gpu_scan(struct lynx_kmq *kmqs, uint32_t n,
                                     uint32_t *ready) {
  if (threadIdx.x < 32u) {
    uint32_t lane = threadIdx.x;
    uint64_t now = lynx_globaltimer_ns();
    /* every word, also those past n: the serve loop reads them all */
    for (uint32_t base = 0; base < LYNX_GPU_READY_WORDS * 32u; base += 32u) {
      uint32_t k = base + lane;
      int r = 0;
      if (k < n)
        r = lynx_seen_scan(&kmqs[k].seen, &kmqs[k].mq, now) || kmqs[k].has_held;
      r = __ballot_sync(0xffffffffu, r);
      if (lane == 0)
        ready[base / 32u] = (uint32_t)r;
    }
  }
  __syncthreads();
}

/* The persistent kernel's body over handler H (all threads of a block). */
template <lynx_gpu_handler H>
static __device__ __forceinline__ void
lynx_gpu_kernel_body(struct lynx_cuda_launch l) {
  __shared__ struct lynx_kmq kmqs[LYNX_CUDA_MQS_PER_BLOCK];
  __shared__ uint32_t ready[LYNX_GPU_READY_WORDS];
  __shared__ struct lynx_klat lat;
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
    if (lynx_geom_init(&g, l.n_mqueues, l.slots, l.slot_size, l.large_bytes) ==
        0)
      for (uint32_t q = blockIdx.x;
           q < l.n_server && n < LYNX_CUDA_MQS_PER_BLOCK; q += l.blocks) {
        lynx_mq_bind_mirrored(&kmqs[n].mq, (uint8_t *)l.region, &g, q,
                              (struct lynx_actrl *)l.actrl_mirror);
        kmqs[n].has_held = 0;
        kmqs[n].seen.pos = kmqs[n].seen.acq = kmqs[n].mq.rx_head;
        n++;
      }
    n_kmqs = n;
    lynx_block_set_readers((int)l.thread_readers);
    /* the block's own client mqueue of the back end its app calls */
    if (l.calls && l.n_backends &&
        lynx_geom_init(&g, l.n_mqueues, l.slots, l.slot_size, l.large_bytes) ==
            0) {
      lynx_mq_bind_mirrored(&lynx_gpu_client()->mq, (uint8_t *)l.region, &g,
                            lynx_cuda_client_mq(&l, blockIdx.x, l.app_backend),
                            (struct lynx_actrl *)l.actrl_mirror);
      lynx_gpu_client()->next_tag = 0;
    }
    memset(&lat.sh, 0, sizeof(lat.sh));
    lat.gl = (struct lynx_lat *)((uint8_t *)kctl +
                                 lynx_cuda_kctl_lat_off(l.blocks)) +
             blockIdx.x;
    if (blockIdx.x == 0)
      *(volatile uint64_t *)&kctl->now_gt = lynx_globaltimer_ns();
    atomicAdd(&kctl->started, 1u);
  }
  __syncthreads();
  n = n_kmqs;
  lynx_idle_init(&idle, l.idle_ns);

  while (!lynx_block_flag(&kctl->stop)) {
    int work = 0, stop = 0;
    lynx_gpu_scan(kmqs, n, ready);
    for (uint32_t w = 0; w < LYNX_GPU_READY_WORDS && !stop; w++) {
      uint32_t bits = ready[w]; /* the same in every thread */
      while (bits) {
        uint32_t i = w * 32u + (uint32_t)(__ffs(bits) - 1);
        int rc;
        bits &= bits - 1u;
        rc = lynx_gpu_serve_mq<H>(&l, &kmqs[i], &st, &lat);
        if (rc == LYNX_GPU_STOP) {
          stop = 1;
          break;
        }
        work += rc;
      }
    }
    if (lynx_block_io_thread()) {
      uint64_t bad = 0;
      if (blockIdx.x == 0) /* the agent's clock calibration */
        *(volatile uint64_t *)&kctl->now_gt = lynx_globaltimer_ns();
      for (uint32_t i = 0; i < n; i++)
        bad += kmqs[i].mq.bad;     /* counted by the ring code (lynx_mq_recv) */
      if (l.calls && l.n_backends) /* bad replies */
        bad += lynx_gpu_client()->mq.bad;
      /* requests too: one held for a full TX ring counts before it is done */
      if (work || bad != st.bad || st.requests != published_requests) {
        st.bad = bad;
        published_requests = st.requests;
        lynx_gpu_publish_stats(&kctl->blocks[blockIdx.x], &st);
      }
    }
    if (stop)
      break;
    lynx_block_idle(&idle, work);
  }

  if (lynx_block_io_thread()) {
    lynx_gpu_publish_stats(&kctl->blocks[blockIdx.x], &st);
    __threadfence_system(); /* counters before the exit count */
    atomicAdd(&kctl->exited, 1u);
  }
}

/*
 * The kernel in two forms that differ only in the registers ptxas may give
 * a thread (issue 35, finding 9): bounded for 1,024 threads a block, a
 * thread of the built-in kernel got at most 64 and spilled 48 bytes to
 * local memory; unbounded it takes 88 and spills nothing (ptxas -v, sm_90),
 * so blocks of up to LYNX_GPU_NARROW_MAX threads (the default 128 among
 * them) run the first, wider ones the second.
 */
#define LYNX_GPU_KERNELS(narrow, wide, handler)                                \
  __global__ void narrow(struct lynx_cuda_launch l) {                          \
    lynx_gpu_kernel_body<handler>(l);                                          \
  }                                                                            \
  __global__ void __launch_bounds__(LYNX_GPU_THREADS_MAX)                      \
      wide(struct lynx_cuda_launch l) {                                        \
    lynx_gpu_kernel_body<handler>(l);                                          \
  }

/* A module's application called name_ (LYNX_APP_NAME_MAX), help_ its line
 * for --list-apps, calling back end backend_ ("" for none: the service
 * must then give a back end of that name), over handler: its description
 * and both kernels, by the names the agent looks up (lynx_gpu.h). Once per
 * module. */
#define LYNX_GPU_APP_CALLS(name_, help_, backend_, handler)                    \
  extern "C" __device__ const struct lynx_gpu_app_info lynx_gpu_app_info = {   \
      LYNX_GPU_ABI_VERSION,                                                    \
      sizeof(struct lynx_gpu_app_info),                                        \
      sizeof(struct lynx_cuda_launch),                                         \
      sizeof(struct lynx_cuda_kctl),                                           \
      sizeof(struct lynx_mq),                                                  \
      0,                                                                       \
      name_,                                                                   \
      backend_,                                                                \
      help_};                                                                  \
  extern "C" {                                                                 \
  LYNX_GPU_KERNELS(lynx_gpu_kernel, lynx_gpu_kernel_wide, handler)             \
  }

/* The same for an application that calls no back end. */
#define LYNX_GPU_APP(name_, help_, handler)                                    \
  LYNX_GPU_APP_CALLS(name_, help_, "", handler)

#endif
