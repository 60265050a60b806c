/*
 * apps.cu - the agent's built-in GPU applications and the host-callable
 * interface of lynx_cuda.h.
 *
 * The kernel is the SDK's persistent kernel (include/lynx/lynx_kernel.cuh,
 * which a plug-in's module is built from too: docs/writing-apps.md) over
 * run_app, which dispatches on the launch's app (uniform: a kernel
 * parameter). One block serves many mqueues without polling each one in
 * turn, and the agent launches about one block per SM however many
 * mqueues there are (docs/gpu.md, "Blocks and mqueues").
 *
 * The applications are the CPU handlers' twins (accel/apps.c), with the
 * per-request decisions in accel/app_logic.h and accel/face.h, which the
 * CPU handlers and unit tests run too. mc-get and face-verify call back end
 * "db" through their block's own client mqueue (lynx_block_call).
 * Each is a handler of lynx_kernel.cuh's kind: called by all threads of
 * the block, it returns in all threads 0 (finished with the request: the
 * kernel releases it), LYNX_GPU_AGAIN (the TX ring is full: the request is
 * kept unreleased and retried on a later pass) or LYNX_GPU_STOP (the host
 * asked the kernel to stop while the app was holding the block).
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
#include "lynx_kernel.cuh"

/* ---- applications ---------------------------------------------------- */

static __device__ int app_echo(struct lynx_mq *mq, const struct lynx_msg *req,
                               int *replied) {
  int rc = lynx_block_send(mq, req->tag, req->data, req->len);
  *replied = rc == 0;
  return rc == -11 ? LYNX_GPU_AGAIN : 0;
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
    return lynx_block_drop(mq, req->tag) == -11 ? LYNX_GPU_AGAIN : 0;
  rc = lynx_block_reserve(mq, req->len, &buf);
  if (rc)
    return rc == -11 ? LYNX_GPU_AGAIN : 0;
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
    return rc == -11 ? LYNX_GPU_AGAIN : 0;
  lynx_block_copy(buf, req->data, req->len);
  if (lynx_block_io_thread()) {
    uint32_t ms = lynx_fault_hang_ms(buf, req->len);
    if (ms)
      stopped = hang_ms(ms, stop);
    want = !stopped && lynx_sockperf_wants_reply(buf, req->len);
  }
  if (lynx_block_any(stopped))
    return LYNX_GPU_STOP; /* unanswered: the kernel is going away */
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
 * LYNX_GPU_AGAIN before the back end is called, and the retry calls it once
 * (the CPU handler calls again on its retry; the answer is the same). The
 * value goes from the client mqueue's RX slot to the answer's TX slot in
 * one block copy.
 */
static __device__ int app_mc_get(const struct lynx_cuda_launch *l,
                                 struct lynx_mq *mq, const struct lynx_msg *req,
                                 int *replied) {
  struct lynx_dev_client *cl = lynx_gpu_client();
  uint8_t *cmd = app_scratch()->mc.cmd;
  uint32_t cap = lynx_slot_cap(l->slot_size), len = 0, voff, vlen;
  struct lynx_msg rep;
  uint8_t *out;
  int ok = 0, err = 1, rc;
  *replied = 0;
  rc = lynx_block_reserve(mq, cap, &out);
  if (rc)
    return rc == -11 ? LYNX_GPU_AGAIN : 0;
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
      return LYNX_GPU_STOP; /* unanswered: the kernel is going away */
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
  struct lynx_dev_client *cl = lynx_gpu_client();
  uint8_t *cmd = app_scratch()->face.cmd;
  uint32_t len = FACE_ERROR_LEN, voff, vlen;
  struct lynx_msg rep;
  uint8_t *out;
  int ok = 0, rc;
  *replied = 0;
  rc = lynx_block_reserve(mq, FACE_RESP_LEN, &out);
  if (rc)
    return rc == -11 ? LYNX_GPU_AGAIN : 0;
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
      return LYNX_GPU_STOP;
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
  if (clen < 0 || !l->app_data)
    return lynx_block_drop(mq, req->tag) == -11 ? LYNX_GPU_AGAIN : 0;
  rc = lynx_block_reserve(mq, LENET_RESP_MAX, &buf);
  if (rc == -11)
    return LYNX_GPU_AGAIN;
  if (rc) /* a slot too small for the answer: the service's spec */
    return lynx_block_drop(mq, req->tag) == -11 ? LYNX_GPU_AGAIN : 0;
  lenet_block_infer((const float *)l->app_data, req->data,
                    app_scratch()->lenet.logits, &app_scratch()->lenet.act);
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

/* ---- the persistent kernel (lynx_kernel.cuh) ---------------------------- */

LYNX_GPU_KERNELS(lynx_cuda_kernel, lynx_cuda_kernel_wide, run_app)

/* The kernel blocks of threads threads run. */
static const void *kernel_for(uint32_t threads) {
  return threads <= LYNX_GPU_NARROW_MAX ? (const void *)lynx_cuda_kernel
                                        : (const void *)lynx_cuda_kernel_wide;
}

/* ---- host interface (lynx_cuda.h) ---------------------------------------- */

static int fail(int rc, char *err, size_t errlen, const char *what,
                cudaError_t e) {
  if (err && errlen)
    snprintf(err, errlen, "%s: %s", what, cudaGetErrorString(e));
  return rc;
}

int lynx_cuda_resident_blocks(int device, uint32_t threads, uint32_t *max,
                              char *err, size_t errlen) {
  int cur = 0, per_sm = 0, sms = 0;
  cudaError_t e, e2;
  *max = 0;
  if (!lynx_cuda_threads_ok(threads)) {
    if (err && errlen)
      snprintf(err, errlen,
               "%u threads per block: must be a multiple of 32 in 32..%u",
               threads, LYNX_GPU_THREADS_MAX);
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

int lynx_cuda_start(const struct lynx_cuda_launch *l, void *stream, char *err,
                    size_t errlen) {
  cudaError_t e;
  int rc = lynx_cuda_launch_check(l, err, errlen);
  if (rc)
    return rc;
  if (l->app != LYNX_CUDA_APP_ECHO && l->app != LYNX_CUDA_APP_SOCKPERF_ECHO &&
      l->app != LYNX_CUDA_APP_SOCKPERF_FAULT &&
      l->app != LYNX_CUDA_APP_MC_GET && l->app != LYNX_CUDA_APP_FACE_VERIFY &&
      l->app != LYNX_CUDA_APP_LENET)
    return lynx_cuda_einval(err, errlen,
                            "launch: no CUDA kernel for that application");
  if (l->app == LYNX_CUDA_APP_LENET && !l->app_data)
    return lynx_cuda_einval(err, errlen, "launch: lenet without its weights");
  if (!l->calls != !lynx_cuda_app_calls(l->app))
    return lynx_cuda_einval(err, errlen,
                            "launch: calls does not say whether the "
                            "application calls its back end");
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
