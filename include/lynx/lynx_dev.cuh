/*
 * lynx_dev.cuh - the per-threadblock device I/O library.
 *
 * The GPU form of include/lynx/lynx_io.h: what a persistent kernel's
 * threadblock uses to serve its mqueues. The ring logic is
 * include/lynx/mqueue.h, the same code the CPU backend and the unit tests run;
 * this file only adds the threadblock around it (docs/mqueue.md, "On the GPU"):
 *
 *  - One thread of the block, threadIdx.x == 0 (the "I/O thread"), owns the
 *    block's struct lynx_mq objects and makes every metadata access: it polls
 *    seq words, reads metadata, reserves, commits, releases. That is the
 *    paper's design (§5.3): one poller per block, so a block's other warps
 *    are not slowed by polling device/host memory and the ring state needs
 *    no locks. Blocks are 1-D (threadIdx.y == threadIdx.z == 0).
 *  - Results are broadcast to the block through one shared-memory cell, so
 *    every thread sees the same return value and control flow stays uniform.
 *  - Every thread of the block may take part in copying payloads
 *    (lynx_block_copy, lynx_block_send).
 *  - A block calls a back end through a client mqueue of its own
 *    (lynx_block_call, the GPU's lynx_call).
 *
 * Calling rule: every function named lynx_block_* is called by ALL threads
 * of the block, from uniform control flow, with the same arguments (like
 * __syncthreads(), which most of them contain). Pointers to a struct lynx_mq
 * are only dereferenced by the I/O thread, so the mqueue may live in shared
 * memory or in the I/O thread's own local memory (other threads may then
 * pass any pointer, it is never read).
 *
 * Needs sm_70 or later (__nanosleep, independent thread scheduling).
 * Compiled for sm_80 and sm_90 by every build (tests/cuda/nvcc-check.sh,
 * the lynx_cuda_kernels target); what has run on a GPU is in docs/gpu.md,
 * "What has run". Part of the SDK: a GPU application's handler uses it
 * (lynx_kernel.cuh).
 */
#ifndef LYNX_DEV_CUH
#define LYNX_DEV_CUH

#if !defined(__CUDACC__)
#error "lynx_dev.cuh is CUDA device code: compile it with nvcc"
#endif

#include <stdint.h>

#include "lynx_call.h"
#include "mqueue.h"

#define LYNX_DEV static __device__ __forceinline__

/* __nanosleep's argument is capped by the hardware at about 1 ms. */
#define LYNX_NANOSLEEP_MAX_NS 1000000u
/* First sleep of the idle backoff, doubled on every idle pass. */
#define LYNX_IDLE_MIN_NS 64u
/* Nap between %globaltimer reads while emulating work or hanging. */
#define LYNX_WORK_NAP_NS 256u

/* ---- time ------------------------------------------------------------ */

/* The GPU's global nanosecond timer (PTX %globaltimer): the same clock on
 * every SM, unlike clock64(), which counts the SM's own cycles. Its update
 * granularity is coarser than 1 ns on some GPUs (up to 1 us), which is fine
 * for work emulation in microseconds and hang times in milliseconds. */
LYNX_DEV uint64_t lynx_globaltimer_ns(void) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/* ---- block primitives -------------------------------------------------- */

LYNX_DEV int lynx_block_io_thread(void) { return threadIdx.x == 0; }

/* The block's broadcast cell: written by the I/O thread, read by all after a
 * barrier. One per translation unit (a function-local __shared__ variable is
 * static), reused by every call: each broadcast ends with a second barrier,
 * so no thread can still be reading the previous value when the I/O thread
 * writes the next. */
struct lynx_block_cell {
  int rc;
  uint32_t u;
  uint8_t *buf;
  struct lynx_msg m;
};

LYNX_DEV struct lynx_block_cell *lynx_block_bc(void) {
  __shared__ struct lynx_block_cell bc;
  return &bc;
}

/* Who reads what the block publishes (lynx_block_commit's fences), set for
 * the block once before its first send: 1 when every reader is a thread
 * of the system (the frontend's or the tcp agent's CPU threads reading a
 * region in host memory, with acquire loads), 0 when one may be a NIC or a
 * copy engine (a region in GPU memory, or rdma). */
LYNX_DEV uint32_t *lynx_block_thread_readers(void) {
  __shared__ uint32_t v;
  return &v;
}

/* Sets it (any thread; the barrier after the block's set-up publishes it). */
LYNX_DEV void lynx_block_set_readers(int threads_only) {
  if (lynx_block_io_thread())
    *lynx_block_thread_readers() = threads_only ? 1u : 0u;
}

/* Before the barrier of a publish: each writer's system fence where a
 * reader may be a NIC or copy engine (lynx_block_commit says why). */
LYNX_DEV void lynx_block_writer_fence(void) {
  if (!*lynx_block_thread_readers())
    __threadfence_system();
}

/* 1 in every thread when pred is non-zero in any thread (a barrier). */
LYNX_DEV int lynx_block_any(int pred) { return __syncthreads_or(pred) != 0; }

/* The I/O thread's v, in every thread. */
LYNX_DEV uint32_t lynx_block_bcast_u32(uint32_t v) {
  struct lynx_block_cell *bc = lynx_block_bc();
  if (lynx_block_io_thread())
    bc->u = v;
  __syncthreads();
  v = bc->u;
  __syncthreads();
  return v;
}

/* The I/O thread's *m, in every thread's *m. */
LYNX_DEV void lynx_block_bcast_msg(struct lynx_msg *m) {
  struct lynx_block_cell *bc = lynx_block_bc();
  if (lynx_block_io_thread())
    bc->m = *m;
  __syncthreads();
  *m = bc->m;
  __syncthreads();
}

/* A host-written flag (e.g. a stop word in device memory), read by the I/O
 * thread with a volatile load, so it is fetched from L2 each time, never
 * from a register or an L1 line; 1 in every thread when it is non-zero. */
LYNX_DEV int lynx_block_flag(const uint32_t *flag) {
  return lynx_block_any(lynx_block_io_thread() &&
                        *(const volatile uint32_t *)flag != 0);
}

/* ---- payload copies ------------------------------------------------------ */

/*
 * Why payload loads bypass L1: request payloads are written into GPU memory
 * by the NIC (GPUDirect RDMA) or by a copy engine (the tcp transport's
 * agent), not by an SM. Those writes land in L2/DRAM; the SM's L1 is not
 * coherent with them and is never told. A slot is reused every S requests,
 * so an L1 line left from an earlier lap of this block's own reads could
 * still hold the old bytes. The I/O thread's acquire (ld.acquire.sys in
 * mqueue.h) keeps its own load off a stale L1 line, but the NIC is not a
 * PTX thread, so the memory model promises
 * nothing about its writes, and the threads that copy the payload did not
 * execute that acquire themselves (they follow the I/O thread through a
 * barrier). ld.global.cg (__ldcg: cache in L2 only) reads the point where
 * the NIC's writes land, costs nothing here (a payload is read once, L1 would
 * not be reused) and does not depend on the fence's implementation.
 * A source in shared or local memory is read with ordinary loads.
 */
LYNX_DEV uint8_t lynx_ld_bypass_u8(const uint8_t *p, int global) {
  return global ? __ldcg(p) : *p;
}

/* One thread copies n bytes with L1-bypassing loads (e.g. the I/O thread
 * peeking at a request header into its own registers/local memory). */
LYNX_DEV void lynx_dev_peek(uint8_t *dst, const uint8_t *src, uint32_t n) {
  int global = __isGlobal(src);
  for (uint32_t i = 0; i < n; i++)
    dst[i] = lynx_ld_bypass_u8(src + i, global);
}

/*
 * All threads copy len bytes from src to dst, 16 bytes per load when both
 * are 16-byte aligned (RX payloads and TX reservations always are: slots are
 * Z-aligned in a 4096-aligned ring and payload offsets are multiples of 16),
 * L1-bypassing loads from global memory (above). Each thread issues
 * LYNX_COPY_INFLIGHT loads before it stores any of them: src and dst never
 * overlap (an RX slot and a TX slot or shared memory), but the compiler
 * cannot know it and would keep one load in flight, so a 64 KiB message
 * from host memory would be 32 PCIe round trips in series instead of 8.
 * Ends with a barrier: on return every byte is written and visible to the
 * whole block (not yet to the host or NIC: lynx_block_commit adds that).
 */
#define LYNX_COPY_INFLIGHT 4u
/* This thread's share of n16 16-byte words, LYNX_COPY_INFLIGHT loads at a
 * time; global a constant where it is inlined, so no branch sits between
 * the loads. Returns nothing: lynx_block_copy does the tail. */
__device__ __forceinline__ void lynx_copy16(uint4 *d4, const uint4 *s4,
                                            uint32_t n16, uint32_t step,
                                            const int global) {
  uint32_t i;
  for (i = threadIdx.x; i + (LYNX_COPY_INFLIGHT - 1u) * step < n16;
       i += LYNX_COPY_INFLIGHT * step) {
    uint4 v[LYNX_COPY_INFLIGHT];
#pragma unroll
    for (uint32_t k = 0; k < LYNX_COPY_INFLIGHT; k++)
      v[k] = global ? __ldcg(s4 + i + k * step) : s4[i + k * step];
#pragma unroll
    for (uint32_t k = 0; k < LYNX_COPY_INFLIGHT; k++)
      d4[i + k * step] = v[k];
  }
  for (; i < n16; i += step)
    d4[i] = global ? __ldcg(s4 + i) : s4[i];
}
LYNX_DEV void lynx_block_copy(uint8_t *dst, const uint8_t *src, uint32_t len) {
  uint32_t step = blockDim.x, done = 0, i;
  int global = __isGlobal(src);
  if (((uintptr_t)dst | (uintptr_t)src) % 16u == 0) {
    uint32_t n16 = len / 16u;
    if (global)
      lynx_copy16((uint4 *)dst, (const uint4 *)src, n16, step, 1);
    else
      lynx_copy16((uint4 *)dst, (const uint4 *)src, n16, step, 0);
    done = n16 * 16u;
  }
  for (i = done + threadIdx.x; i < len; i += step)
    dst[i] = lynx_ld_bypass_u8(src + i, global);
  __syncthreads();
}

/* ---- mqueue I/O (lynx_io.h, per block) --------------------------------- */

/*
 * One poll attempt on mq: 0 and *m (in every thread) when a request was
 * received, -11 (EAGAIN) when there is none, -105 (ENOBUFS) when every RX
 * slot is held unreleased. The same rc in all threads. m->data points into
 * the RX slot (zero copy) until lynx_block_release; read it with
 * lynx_block_copy / lynx_dev_peek (L1 bypass, above), not plain loads.
 *
 * The seq word is read by lynx_mq_recv with an acquire (ld.acquire.sys:
 * from the point of coherence, never a register or L1), so the metadata the
 * I/O thread reads next is the message's. Malformed slots are skipped and
 * counted in mq->bad there. lynx_block_recv_seen: positions before acq are
 * known published (the look-ahead's acquire load, lathist.h), so their seq
 * is not loaded again (lynx_mq_recv_seen).
 */
LYNX_DEV int lynx_block_recv_seen(struct lynx_mq *mq, struct lynx_msg *m,
                                  uint32_t acq) {
  struct lynx_block_cell *bc = lynx_block_bc();
  int rc;
  if (lynx_block_io_thread())
    bc->rc = lynx_mq_recv_seen(mq, &bc->m, acq);
  __syncthreads();
  rc = bc->rc;
  if (rc == 0)
    *m = bc->m;
  __syncthreads();
  return rc;
}

LYNX_DEV int lynx_block_recv(struct lynx_mq *mq, struct lynx_msg *m) {
  return lynx_block_recv_seen(mq, m, mq->rx_head);
}

/*
 * Hands the oldest received request's slot back to the frontend. Starts with
 * a barrier: once rx_cons moves the frontend may overwrite the slot, so every
 * thread must be done reading it first. Each payload load has delivered its
 * value before the thread reaches the barrier (the value was stored or used),
 * and the I/O thread's store-release of rx_cons is ordered after the barrier.
 */
LYNX_DEV void lynx_block_release(struct lynx_mq *mq) {
  __syncthreads();
  if (lynx_block_io_thread())
    lynx_mq_release(mq);
}

/*
 * Reserves a TX slot for a response of at most max_len bytes: 0 and *buf (in
 * every thread), -11 (EAGAIN) when the TX ring is full, -90 (EMSGSIZE) when
 * max_len exceeds the slot. When the ring looks full, lynx_mq_reserve re-reads
 * fctrl->tx_cons (acquire), which the frontend writes back lazily.
 */
LYNX_DEV int lynx_block_reserve(struct lynx_mq *mq, uint32_t max_len,
                                uint8_t **buf) {
  struct lynx_block_cell *bc = lynx_block_bc();
  int rc;
  if (lynx_block_io_thread()) {
    bc->buf = NULL;
    bc->rc = lynx_mq_reserve(mq, max_len, &bc->buf);
  }
  __syncthreads();
  rc = bc->rc;
  *buf = bc->buf;
  __syncthreads();
  return rc;
}

/*
 * Publishes the reserved slot as the response to tag (status OK): len bytes
 * at the reserved pointer, len <= the reserved max_len.
 *
 * Fences: __syncthreads(), so the I/O thread continues only after every
 * writer's stores; then the I/O thread's commit, whose store-release of seq
 * (st.release.sys) orders them before it. The PTX memory model's releases
 * are cumulative: the release after the barrier covers the writes of the
 * threads it synchronized with through bar.sync (CTA scope), for every
 * observer that acquires at system scope, host threads included. That is
 * all a region in host memory needs, whose readers are CPU threads with
 * acquire loads (the frontend over shm, the tcp agent's server):
 * lynx_block_set_readers(1).
 *
 * Where a reader may be a NIC (rdma) or a copy engine (the tcp agent's
 * staged copies out of GPU memory), not a thread of the memory model, every
 * thread also executes __threadfence_system() (fence.sc.sys) before the
 * barrier: "my writes are out of the SM and at the point of coherence
 * before I reach it" needs no argument about cumulativity to such readers.
 * Threads that wrote nothing pay one fence; commits are rare next to the
 * copies they follow.
 */
LYNX_DEV void lynx_block_commit(struct lynx_mq *mq, uint32_t tag, uint32_t len,
                                uint32_t max_len) {
  lynx_block_writer_fence();
  __syncthreads();
  if (lynx_block_io_thread())
    lynx_mq_commit(mq, tag, len, max_len, LYNX_ST_OK);
}

/* Copies len bytes of data into a TX slot (all threads) and publishes it for
 * tag. 0, -11 (EAGAIN: TX ring full, try again later), -90 (EMSGSIZE). */
LYNX_DEV int lynx_block_send(struct lynx_mq *mq, uint32_t tag,
                             const uint8_t *data, uint32_t len) {
  uint8_t *buf;
  int rc = lynx_block_reserve(mq, len, &buf);
  if (rc)
    return rc;
  lynx_block_copy(buf, data, len);
  lynx_block_commit(mq, tag, len, len);
  return 0;
}

/* The request with this tag gets no reply: a zero-length DROPPED slot, so
 * the frontend frees its tag at once. 0 or -11 (TX full). */
LYNX_DEV int lynx_block_drop(struct lynx_mq *mq, uint32_t tag) {
  struct lynx_block_cell *bc = lynx_block_bc();
  int rc;
  if (lynx_block_io_thread())
    bc->rc = lynx_mq_drop(mq, tag);
  __syncthreads();
  rc = bc->rc;
  __syncthreads();
  return rc;
}

/* ---- client mqueue calls (lynx_call of apps.h, per block) --------------- */

/*
 * A block's client mqueue of one back end (docs/client-mqueues.md, "On a
 * GPU"). The block is its only user: the agent gives every block its own
 * client mqueue per back end, so a call needs no lock, no other block ever
 * takes its reply, and one block waiting for a slow back end holds up no
 * other. (The CPU's threads share one under a mutex, struct lynx_client.)
 * Like a served mqueue it is read and written by the I/O thread only; it
 * may live in shared memory.
 */
struct lynx_dev_client {
  struct lynx_mq mq;
  uint32_t next_tag; /* the last call's tag */
};

/* Polls while a call waits, from LYNX_CALL_NAP_MIN_NS doubling to
 * LYNX_CALL_NAP_MAX_NS: a back end answers in tens of microseconds at
 * best, and each poll of a host-mapped ring is a PCIe round trip. */
#define LYNX_CALL_NAP_MIN_NS 128u
#define LYNX_CALL_NAP_MAX_NS 4096u

/* The I/O thread: 1 when the call must end now, with *rc set to
 * LYNX_CALL_ECANCELED (the host set the stop word) or LYNX_CALL_ETIMEDOUT
 * (%globaltimer reached end); else naps (doubling *nap) and returns 0. */
LYNX_DEV int lynx_dev_call_wait(const uint32_t *stop, uint64_t end,
                                uint32_t *nap, int *rc) {
  if (stop && *(const volatile uint32_t *)stop) {
    *rc = LYNX_CALL_ECANCELED;
    return 1;
  }
  if (lynx_globaltimer_ns() >= end) {
    *rc = LYNX_CALL_ETIMEDOUT;
    return 1;
  }
  __nanosleep(*nap);
  *nap = *nap * 2u > LYNX_CALL_NAP_MAX_NS ? LYNX_CALL_NAP_MAX_NS : *nap * 2u;
  return 0;
}

/*
 * Sends len bytes of req to the client mqueue's back end (all threads copy,
 * lynx_block_copy, so req may be the block's shared memory or global
 * memory) and waits for the reply carrying the call's tag: 0 and *reply (in
 * every thread), a view of the reply in the client mqueue's RX slot, valid
 * until lynx_block_call_done (read it with lynx_block_copy / lynx_dev_peek,
 * like a request); or, with nothing to release:
 *   LYNX_CALL_EHOSTDOWN  the frontend reports the back end unreachable,
 *   LYNX_CALL_EMSGSIZE   the reply did not fit a slot, or req does not,
 *   LYNX_CALL_ETIMEDOUT  no TX room or no reply within timeout_ns,
 *   LYNX_CALL_ECANCELED  the stop word (host-written) was set meanwhile.
 * The same rc in all threads. The GPU twin of lynx_call (apps.h), with the
 * same reply rule (lynx_call_poll, app_logic.h): a late reply to a call
 * that timed out is released and skipped by tag.
 *
 * The wait is the I/O thread's, on %globaltimer, napping with __nanosleep
 * (lynx_dev_call_wait) and reading the stop word every nap, so a block
 * waiting for a back end never holds up the kernel's stop; the other
 * threads wait at the barrier, which costs no issue slots. The request is
 * published like a response (lynx_block_commit's fences: every writer's
 * __threadfence_system(), a barrier, the I/O thread's store-release of
 * seq and tx_prod); the reply is received like a request (lynx_mq_recv's
 * acquire, payload loads that bypass L1).
 */
LYNX_DEV int lynx_block_call(struct lynx_dev_client *c, const uint8_t *req,
                             uint32_t len, struct lynx_msg *reply,
                             uint64_t timeout_ns, const uint32_t *stop) {
  struct lynx_block_cell *bc = lynx_block_bc();
  uint64_t end = 0;
  uint32_t nap = LYNX_CALL_NAP_MIN_NS;
  uint8_t *buf;
  int rc = 0;
  /* a TX slot: the frontend takes requests as the back end's connection
   * has room, so a full ring is waited for, within the same deadline */
  if (lynx_block_io_thread()) {
    end = lynx_globaltimer_ns() + timeout_ns;
    bc->buf = NULL;
    while ((rc = lynx_mq_reserve(&c->mq, len, &bc->buf)) == -11 &&
           !lynx_dev_call_wait(stop, end, &nap, &rc))
      ;
    bc->rc = rc == -90 ? LYNX_CALL_EMSGSIZE : rc;
  }
  __syncthreads();
  rc = bc->rc;
  buf = bc->buf;
  __syncthreads();
  if (rc)
    return rc;
  lynx_block_copy(buf, req, len);
  lynx_block_writer_fence();
  __syncthreads();
  if (lynx_block_io_thread()) {
    uint32_t tag = ++c->next_tag;
    lynx_mq_commit(&c->mq, tag, len, len, LYNX_ST_OK);
    nap = LYNX_CALL_NAP_MIN_NS;
    while ((rc = lynx_call_poll(&c->mq, tag, UINT32_MAX, &bc->m)) == -11 &&
           !lynx_dev_call_wait(stop, end, &nap, &rc))
      ;
    bc->rc = rc;
  }
  __syncthreads();
  rc = bc->rc;
  if (rc == 0)
    *reply = bc->m;
  __syncthreads();
  return rc;
}

/* Hands the reply of a call that returned 0 back to the frontend: a
 * release (every thread done reading it first). */
LYNX_DEV void lynx_block_call_done(struct lynx_dev_client *c) {
  lynx_block_release(&c->mq);
}

/* ---- work emulation and idling ------------------------------------------- */

/*
 * Emulated per-request work of us microseconds (uniform across the block):
 * the I/O thread waits on %globaltimer, napping between reads with
 * __nanosleep so the SM issues other blocks' warps meanwhile; the block's
 * other warps wait at the barrier, which costs no issue slots. Holds the
 * block as a real computation would hold it, without stealing the SM from
 * other blocks.
 */
LYNX_DEV void lynx_block_work_us(uint32_t us) {
  if (!us)
    return;
  if (lynx_block_io_thread()) {
    uint64_t end = lynx_globaltimer_ns() + (uint64_t)us * 1000u;
    while (lynx_globaltimer_ns() < end)
      __nanosleep(LYNX_WORK_NAP_NS);
  }
  __syncthreads();
}

/*
 * Adaptive idle backoff, kept by every thread (the same values everywhere,
 * since it is updated with uniform arguments). A GPU block cannot sleep on a
 * futex (the doorbell, docs/mqueue.md), and spinning flat out on seq words
 * keeps the memory system and the SM's issue slots busy for nothing; after
 * an idle pass the block sleeps (__nanosleep), doubling from
 * LYNX_IDLE_MIN_NS up to max_ns, and any work resets it. max_ns 0: never
 * sleep (lowest latency, a full spin).
 */
struct lynx_idle {
  uint32_t cur_ns, max_ns;
};

LYNX_DEV void lynx_idle_init(struct lynx_idle *b, uint32_t max_ns) {
  b->cur_ns = 0;
  b->max_ns = max_ns > LYNX_NANOSLEEP_MAX_NS ? LYNX_NANOSLEEP_MAX_NS : max_ns;
}

/* Called once per pass over the block's mqueues by all threads, work
 * uniform: non-zero when the pass served anything. */
LYNX_DEV void lynx_block_idle(struct lynx_idle *b, int work) {
  if (work || !b->max_ns) {
    b->cur_ns = 0;
    return;
  }
  b->cur_ns = b->cur_ns ? 2u * b->cur_ns : LYNX_IDLE_MIN_NS;
  if (b->cur_ns > b->max_ns)
    b->cur_ns = b->max_ns;
  __nanosleep(b->cur_ns);
}

#endif /* LYNX_DEV_CUH */
