/*
 * apps.cu - the persistent kernel that serves a GPU's server mqueues, its
 * applications, and the host-callable interface of lynx_cuda.h.
 *
 * One launch, every block resident for the kernel's lifetime (the agent
 * checks lynx_cuda_resident_blocks first: a block that waits for another to
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
 *   serve: for each marked mqueue, at most one request (as
 *          accel/cpu_accel.c: requests spread over the mqueues are answered
 *          in arrival order and none starves): a held request first (one the
 *          app could not answer because the TX ring was full), else one
 *          receive unless the lease fence (kctl->serve_until_gt) has passed;
 *          emulated work; the app; release. Taking and finishing a request
 *          are stamped with %globaltimer into the block's queueing and
 *          service histograms. Block 0 publishes %globaltimer
 *          (kctl->now_gt). Then the block's counters go to kctl->blocks[b],
 *          and an idle pass sleeps (lynx_block_idle).
 *
 * So one block serves many mqueues without polling each one in turn, and
 * the agent launches about one block per SM however many mqueues there are
 * (docs/gpu.md, "Blocks and mqueues"), instead of one block per mqueue
 * competing for the SMs' issue slots and memory system.
 *
 * The applications are the CPU handlers' twins (accel/apps.c), with the
 * per-request decisions in accel/app_logic.h and accel/face.h, which the
 * CPU handlers and unit tests run too. mc-get and face-verify call back end
 * "db" through their block's own client mqueue (lynx_block_call).
 * Each is called by all threads of the block and returns, in all threads,
 * 0 (finished with the request: the caller releases it), APP_AGAIN (the TX
 * ring is full: the request is kept unreleased and retried on a later pass)
 * or APP_STOP (the host asked the kernel to stop while the app was holding
 * the block).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cuda_runtime.h>

#include "app_logic.h"
#include "face.h"
#include "face_dev.cuh"
#include "lenet_dev.cuh"
#include "lynx_cuda.h"
#include "lynx_dev.cuh"

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
  uint64_t taken_gt;     /* when the request in hand was taken */
  struct lynx_seen seen; /* first-seen stamps (lathist.h) */
};

/* The block's latency histograms: kept in shared memory, each changed
 * word also stored to the control block (a posted store, no read back),
 * where the agent copies them from. Thread 0 only. */
struct klat {
  struct lynx_lat sh;
  struct lynx_lat *gl;
};

static __device__ void lat_add(struct lynx_lat_hist *sh,
                               struct lynx_lat_hist *gl, uint64_t ns) {
  uint32_t b = lynx_lat_bucket(ns);
  uint64_t v = sh->b[b] + 1u;
  sh->b[b] = v;
  ((volatile uint64_t *)gl->b)[b] = v;
  v = sh->sum_ns + ns;
  sh->sum_ns = v;
  *(volatile uint64_t *)&gl->sum_ns = v;
}

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

/* ---- applications that call a back end (client mqueues) --------------- */

/* The block's client mqueue of the back end its app calls ("db"), its own
 * (lynx_cuda.h, lynx_cuda_client_mq): bound by the kernel's I/O thread at
 * start when the app calls one. */
static __device__ struct lynx_dev_client *block_client(void) {
  __shared__ struct lynx_dev_client c;
  return &c;
}

/* Shared memory of the apps below, one at a time (a kernel runs one app):
 * a memcached reply's first line and its END tail, the command, and for
 * face-verify the request, the stored image and both descriptors in one
 * array (the probe's counts in the low 16 bits of each word, the stored
 * image's in the high ones: at most 64 per bin, so neither spills into the
 * other), about 6 KiB. Arrays a block copies into are 16-byte aligned
 * (lynx_block_copy's 16-byte loads). */
struct mc_reply_buf {
  __align__(16) uint8_t head[LYNX_MC_LINE_MAX];
  __align__(16) uint8_t tail[16];
};

union app_mem {
  struct {
    struct mc_reply_buf r;
    __align__(16) uint8_t cmd[LYNX_MC_GET_CMD_MAX];
  } mc;
  struct {
    struct mc_reply_buf r;
    __align__(16) uint8_t req[FACE_REQ_LEN];
    __align__(16) uint8_t stored[FACE_PIXELS];
    __align__(16) uint8_t cmd[FACE_KEY_MAX + 8];
    uint32_t cmd_len;
    uint32_t hist[FACE_HIST_BINS];
    unsigned long long sum;
  } face;
  struct {
    struct lenet_smem act; /* 23.5 KiB */
    float logits[LENET_CLASSES];
  } lenet;
};

static __device__ union app_mem *app_scratch(void) {
  __shared__ union app_mem s;
  return &s;
}

/*
 * A memcached reply to "get" (all threads, uniform result): the block
 * copies its first line and, for a hit, the 7 bytes after the value into
 * shared memory (L1-bypassing loads, a few parallel loads instead of one
 * thread's byte after byte, which over host-mapped memory would be a PCIe
 * round trip each) and the I/O thread parses them with app_logic.h's
 * lynx_mc_get_head and lynx_mc_get_end, the code the CPU's mc-get runs on
 * the whole reply. 0 (hit: the value at rep->data + *voff, *vlen bytes),
 * -2 (miss), -74 (anything else).
 */
static __device__ int mc_reply(struct mc_reply_buf *b,
                               const struct lynx_msg *rep, uint32_t *voff,
                               uint32_t *vlen) {
  uint32_t avail = rep->len < LYNX_MC_LINE_MAX ? rep->len : LYNX_MC_LINE_MAX;
  uint32_t o = 0, n = 0;
  int rc = 0;
  lynx_block_copy(b->head, rep->data, avail);
  if (lynx_block_io_thread())
    rc = lynx_mc_get_head(b->head, avail, rep->len, &o, &n);
  rc = (int)lynx_block_bcast_u32((uint32_t)rc);
  if (rc)
    return rc;
  o = lynx_block_bcast_u32(o);
  n = lynx_block_bcast_u32(n);
  lynx_block_copy(b->tail, rep->data + o + n, 7);
  rc = lynx_block_any(lynx_block_io_thread() && !lynx_mc_get_end(b->tail)) ? -74
                                                                           : 0;
  *voff = o;
  *vlen = n;
  return rc;
}

/* "ERROR" into an answer's slot (the I/O thread). */
static __device__ void put_error(uint8_t *out) {
  const char *e = "ERROR";
  for (int i = 0; i < 5; i++)
    out[i] = (uint8_t)e[i];
}

/*
 * mc-get, the twin of the CPU handler (accel/apps.c) over app_logic.h's
 * key check, command and reply parser: a request is a memcached key; the
 * answer is its value from back end "db", empty on a miss, "ERROR" for an
 * invalid key, a back end that is down or errs, or no reply within
 * l->call_timeout_ns. The answer's TX slot is reserved first, for a whole
 * slot (the value's length is known only from the reply; any reply fits a
 * client slot of the same size, so any value fits): a full TX ring returns
 * APP_AGAIN before the back end is called, and the retry calls it once
 * (the CPU handler calls again on its retry; the answer is the same). The
 * value goes from the client mqueue's RX slot to the answer's TX slot in
 * one block copy.
 */
static __device__ int app_mc_get(const struct lynx_cuda_launch *l,
                                 struct lynx_mq *mq, const struct lynx_msg *req,
                                 int *replied) {
  struct lynx_dev_client *cl = block_client();
  uint8_t *cmd = app_scratch()->mc.cmd;
  uint32_t cap = lynx_slot_cap(l->slot_size), len = 0, voff, vlen;
  struct lynx_msg rep;
  uint8_t *out;
  int ok = 0, err = 1, rc;
  *replied = 0;
  rc = lynx_block_reserve(mq, cap, &out);
  if (rc)
    return rc == -11 ? APP_AGAIN : 0;
  if (req->len >= 1 && req->len <= LYNX_MC_KEY_MAX) {
    /* the key straight into the command, then checked there */
    lynx_block_copy(cmd + 4, req->data, req->len);
    if (lynx_block_io_thread() && lynx_mc_key_ok(cmd + 4, req->len)) {
      lynx_mc_get_cmd(cmd, cmd + 4, req->len);
      ok = 1;
    }
  }
  if (lynx_block_any(ok)) {
    rc = lynx_block_call(cl, cmd, req->len + 6u, &rep, l->call_timeout_ns,
                         &l->kctl->stop);
    if (rc == LYNX_CALL_ECANCELED)
      return APP_STOP; /* unanswered: the kernel is going away */
    if (rc == 0) {
      rc = mc_reply(&app_scratch()->mc.r, &rep, &voff, &vlen);
      if (rc == 0) {
        lynx_block_copy(out, rep.data + voff, vlen);
        len = vlen;
        err = 0;
      } else if (rc == -2) {
        err = 0; /* a miss: empty */
      }
      lynx_block_call_done(cl);
    }
  }
  if (err) {
    if (lynx_block_io_thread())
      put_error(out);
    len = 5;
  }
  lynx_block_commit(mq, req->tag, len, cap);
  *replied = 1;
  return 0;
}

/*
 * face-verify (paper §6.4), the twin of the CPU handler (accel/apps.c):
 * a request is a 12-byte label and a 32x32 image; the stored image of the
 * label comes from back end "db" (key "face:" + label, face.h's face_key
 * and app_logic.h's command and parser); the answer is the 8-byte match
 * and distance, or "ERROR" for a malformed request, an unknown label, a
 * stored value that is not 1024 bytes, a back end that is down or errs,
 * or no reply in time. The answer's slot is reserved first, as mc-get's.
 */
static __device__ int app_face_verify(const struct lynx_cuda_launch *l,
                                      struct lynx_mq *mq,
                                      const struct lynx_msg *req,
                                      int *replied) {
  struct lynx_dev_client *cl = block_client();
  uint8_t *cmd = app_scratch()->face.cmd;
  uint32_t len = FACE_ERROR_LEN, voff, vlen;
  struct lynx_msg rep;
  uint8_t *out;
  int ok = 0, rc;
  *replied = 0;
  rc = lynx_block_reserve(mq, FACE_RESP_LEN, &out);
  if (rc)
    return rc == -11 ? APP_AGAIN : 0;
  if (req->len == FACE_REQ_LEN) {
    lynx_block_copy(app_scratch()->face.req, req->data, FACE_REQ_LEN);
    if (lynx_block_io_thread()) {
      const uint8_t *label, *probe;
      char key[FACE_KEY_MAX];
      int klen;
      if (face_req_parse(app_scratch()->face.req, req->len, &label, &probe) ==
              0 &&
          (klen = face_key(label, key)) > 0) {
        app_scratch()->face.cmd_len =
            lynx_mc_get_cmd(cmd, (const uint8_t *)key, (uint32_t)klen);
        ok = 1;
      }
    }
  }
  if (lynx_block_any(ok)) { /* the barrier publishes cmd and cmd_len */
    rc = lynx_block_call(cl, cmd, app_scratch()->face.cmd_len, &rep,
                         l->call_timeout_ns, &l->kctl->stop);
    if (rc == LYNX_CALL_ECANCELED)
      return APP_STOP;
    ok = 0;
    if (rc == 0) {
      if (mc_reply(&app_scratch()->face.r, &rep, &voff, &vlen) == 0 &&
          vlen == FACE_PIXELS) {
        lynx_block_copy(app_scratch()->face.stored, rep.data + voff,
                        FACE_PIXELS);
        ok = 1;
      }
      lynx_block_call_done(cl);
    }
    if (ok) {
      face_block_verify(app_scratch()->face.req + FACE_LABEL_LEN,
                        app_scratch()->face.stored, app_scratch()->face.hist,
                        &app_scratch()->face.sum, out);
      len = FACE_RESP_LEN;
    }
  }
  if (len == FACE_ERROR_LEN && lynx_block_io_thread())
    put_error(out);
  lynx_block_commit(mq, req->tag, len, FACE_RESP_LEN);
  *replied = 1;
  return 0;
}

/*
 * lenet (docs/lenet.md), the twin of the CPU handler (accel/apps.c): the
 * answer's TX slot is reserved first (a full TX ring is retried before any
 * inference, never after one), then the block runs LeNet-5 on the image in
 * the RX slot (lenet_dev.cuh: the per-element code of lenet.h, so the
 * logits are the CPU's bit for bit) and the I/O thread encodes the class,
 * the logits and the request's cookie. A request of any other length is
 * dropped, as on the CPU.
 */
static __device__ int app_lenet(const struct lynx_cuda_launch *l,
                                struct lynx_mq *mq, const struct lynx_msg *req,
                                int *replied) {
  int clen = lenet_req_cookie_len(req->len);
  uint8_t *buf;
  int rc;
  *replied = 0;
  if (clen < 0 || !l->lenet_params)
    return lynx_block_drop(mq, req->tag) == -11 ? APP_AGAIN : 0;
  rc = lynx_block_reserve(mq, LENET_RESP_MAX, &buf);
  if (rc == -11)
    return APP_AGAIN;
  if (rc) /* a slot too small for the answer: the service's spec */
    return lynx_block_drop(mq, req->tag) == -11 ? APP_AGAIN : 0;
  lenet_block_infer(l->lenet_params, req->data, app_scratch()->lenet.logits,
                    &app_scratch()->lenet.act);
  if (lynx_block_io_thread()) {
    uint8_t cookie[LENET_COOKIE_MAX];
    lynx_dev_peek(cookie, req->data + LENET_PIXELS, (uint32_t)clen);
    lenet_resp_encode(buf, lenet_argmax(app_scratch()->lenet.logits),
                      app_scratch()->lenet.logits, cookie, (uint32_t)clen);
  }
  lynx_block_commit(mq, req->tag, LENET_RESP_HDR + (uint32_t)clen,
                    LENET_RESP_MAX);
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
  case LYNX_CUDA_APP_MC_GET:
    return app_mc_get(l, mq, req, replied);
  case LYNX_CUDA_APP_FACE_VERIFY:
    return app_face_verify(l, mq, req, replied);
  case LYNX_CUDA_APP_LENET:
    return app_lenet(l, mq, req, replied);
  default: /* refused by lynx_cuda_start */
    *replied = 0;
    return 0;
  }
}

/* ---- the persistent kernel --------------------------------------------- */

/* 1 in every thread while the lease fence stops new requests: read right
 * before each receive, so no request is taken past the host's deadline. */
static __device__ int fenced(const struct lynx_cuda_kctl *kctl) {
  int f = 0;
  if (lynx_block_io_thread()) {
    uint64_t until = *(const volatile uint64_t *)&kctl->serve_until_gt;
    f = until && lynx_globaltimer_ns() >= until;
  }
  return lynx_block_any(f);
}

/*
 * One mqueue's turn in a pass: 1 when a request was finished with, 0 when
 * nothing was (none waiting, or the TX ring still full), APP_STOP. st and
 * lat are the I/O thread's counters and histograms (other threads' copies
 * are unused).
 */
static __device__ int serve_mq(const struct lynx_cuda_launch *l, struct kmq *s,
                               struct lynx_cuda_block_stats *st,
                               struct klat *lat) {
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
      lat_add(&lat->sh.queue, &lat->gl->queue,
              now - lynx_seen_at(&s->seen, s->mq.rx_head - 1u, now));
    }
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
    uint64_t now = lynx_globaltimer_ns();
    lat_add(&lat->sh.service, &lat->gl->service,
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
static __device__ void publish_stats(struct lynx_cuda_block_stats *out,
                                     const struct lynx_cuda_block_stats *st) {
  volatile struct lynx_cuda_block_stats *v = out;
  v->requests = st->requests;
  v->responses = st->responses;
  v->drops = st->drops;
  v->bad = st->bad;
}

#define READY_WORDS ((LYNX_CUDA_MQS_PER_BLOCK + 31u) / 32u)

/*
 * The scan: the block's first warp, lane i looking at mqueues i, i + 32,
 * ...: stamps what each ring newly shows (lynx_seen_scan: seq-word loads
 * only, the lanes' loads in flight together) and sets ready[] bit k when
 * mqueue k has a request waiting at its head or a held one. The kmq state
 * it reads was last written by thread 0 before the barrier that precedes
 * the scan; lane i writes only its mqueues' seen stamps, which thread 0
 * reads after the barrier that follows. Called by all threads.
 */
static __device__ void scan(struct kmq *kmqs, uint32_t n, uint32_t *ready) {
  if (threadIdx.x < 32u) {
    uint32_t lane = threadIdx.x;
    uint64_t now = lynx_globaltimer_ns();
    /* every word, also those past n: the serve loop reads them all */
    for (uint32_t base = 0; base < READY_WORDS * 32u; base += 32u) {
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

/* The persistent kernel's body, in two kernels that differ only in the
 * registers ptxas may give a thread (issue 35, finding 9): bounded for 1,024
 * threads a block, a thread gets at most 64 and spilled 48 bytes to local
 * memory; unbounded it takes 88 and spills nothing (ptxas -v, sm_90), so
 * blocks of up to LYNX_CUDA_NARROW_MAX threads (the default 128 among them)
 * run lynx_cuda_kernel, wider ones lynx_cuda_kernel_wide. */
#define LYNX_CUDA_NARROW_MAX 512u

static __device__ __forceinline__ void
lynx_cuda_kernel_body(struct lynx_cuda_launch l) {
  __shared__ struct kmq kmqs[LYNX_CUDA_MQS_PER_BLOCK];
  __shared__ uint32_t ready[READY_WORDS];
  __shared__ struct klat lat;
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
    if (lynx_cuda_app_calls(l.app) && l.n_backends &&
        lynx_geom_init(&g, l.n_mqueues, l.slots, l.slot_size, l.large_bytes) ==
            0) {
      lynx_mq_bind_mirrored(&block_client()->mq, (uint8_t *)l.region, &g,
                            lynx_cuda_client_mq(&l, blockIdx.x, l.app_backend),
                            (struct lynx_actrl *)l.actrl_mirror);
      block_client()->next_tag = 0;
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
    scan(kmqs, n, ready);
    for (uint32_t w = 0; w < READY_WORDS && !stop; w++) {
      uint32_t bits = ready[w]; /* the same in every thread */
      while (bits) {
        uint32_t i = w * 32u + (uint32_t)(__ffs(bits) - 1);
        int rc;
        bits &= bits - 1u;
        rc = serve_mq(&l, &kmqs[i], &st, &lat);
        if (rc == APP_STOP) {
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
        bad += kmqs[i].mq.bad; /* counted by the ring code (lynx_mq_recv) */
      if (lynx_cuda_app_calls(l.app) && l.n_backends) /* bad replies */
        bad += block_client()->mq.bad;
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

__global__ void lynx_cuda_kernel(struct lynx_cuda_launch l) {
  lynx_cuda_kernel_body(l);
}

__global__ void __launch_bounds__(LYNX_CUDA_THREADS_MAX)
    lynx_cuda_kernel_wide(struct lynx_cuda_launch l) {
  lynx_cuda_kernel_body(l);
}

/* The kernel blocks of threads threads run. */
static const void *kernel_for(uint32_t threads) {
  return threads <= LYNX_CUDA_NARROW_MAX ? (const void *)lynx_cuda_kernel
                                         : (const void *)lynx_cuda_kernel_wide;
}

/* ---- host interface (lynx_cuda.h) ---------------------------------------- */

static int fail(int rc, char *err, size_t errlen, const char *what,
                cudaError_t e) {
  if (err && errlen)
    snprintf(err, errlen, "%s: %s", what, cudaGetErrorString(e));
  return rc;
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
  /* the largest shared-memory carveout first: the occupancy query counts
   * blocks by the carveout the kernel will launch with, and a small one
   * chosen by the driver for an earlier launch would leave blocks the
   * query promised without SMs to start on */
  e = cudaFuncSetAttribute(kernel_for(threads),
                           cudaFuncAttributePreferredSharedMemoryCarveout,
                           (int)cudaSharedmemCarveoutMaxShared);
  if (e == cudaSuccess)
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm, kernel_for(threads), (int)threads, 0);
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

int lynx_cuda_start(const struct lynx_cuda_launch *l, void *stream, char *err,
                    size_t errlen) {
  struct lynx_geom g;
  uint32_t per_block;
  cudaError_t e;
  if (!l || !l->region || !l->kctl)
    return einval(err, errlen, "launch: no region or no control block");
  if (lynx_geom_init(&g, l->n_mqueues, l->slots, l->slot_size, l->large_bytes))
    return einval(err, errlen, "launch: region geometry out of bounds");
  if (l->n_server < 1 || l->n_server > l->n_mqueues)
    return einval(err, errlen,
                  "launch: server mqueues must be 1..the region's mqueues");
  if (l->app != LYNX_CUDA_APP_ECHO && l->app != LYNX_CUDA_APP_SOCKPERF_ECHO &&
      l->app != LYNX_CUDA_APP_SOCKPERF_FAULT &&
      l->app != LYNX_CUDA_APP_MC_GET && l->app != LYNX_CUDA_APP_FACE_VERIFY &&
      l->app != LYNX_CUDA_APP_LENET)
    return einval(err, errlen, "launch: no CUDA kernel for that application");
  if (l->app == LYNX_CUDA_APP_LENET && !l->lenet_params)
    return einval(err, errlen, "launch: lenet without its weights");
  /* a block per client mqueue of each back end, and nothing else after
   * the server mqueues (lynx_cuda_client_mq) */
  if (lynx_cuda_app_calls(l->app) &&
      (l->n_backends < 1 || l->app_backend >= l->n_backends ||
       l->client_base != l->n_server || l->blocks < 1 ||
       (uint64_t)l->client_base + (uint64_t)l->blocks * l->n_backends !=
           l->n_mqueues))
    return einval(err, errlen,
                  "launch: the application calls a back end: the region "
                  "needs each block's own client mqueue of every back end "
                  "after the server mqueues");
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
  {
    /* the kernel the residency query asked about (kernel_for) */
    struct lynx_cuda_launch arg = *l;
    void *args[] = {&arg};
    e = cudaLaunchKernel(kernel_for(l->threads), dim3(l->blocks),
                         dim3(l->threads), args, 0, (cudaStream_t)stream);
  }
  if (e != cudaSuccess)
    return fail((int)e, err, errlen, "launch of the persistent kernel", e);
  return 0;
}
