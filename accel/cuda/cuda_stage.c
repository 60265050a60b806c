/*
 * cuda_stage.c - the tcp transport's accesses to an instance's region in
 * GPU memory (struct lynx_region_mem's write, read and batch ops, put
 * together in cuda_region.c): gdrcopy's CPU mapping where there is one,
 * else copies on the instance's copy stream through pinned staging.
 *
 * Staging for the tcp transport (without gdrcopy, whose CPU mapping the
 * server loads and stores instead).
 *
 * The server reaches GPU memory with copies on the instance's copy stream.
 * From the caller's pageable memory a copy goes through the driver's own
 * bounce buffer and may be synchronous, and a read that waits for the
 * stream per request puts a PCIe round trip behind every other request of
 * the connection. So an instance has a ring of pinned host memory
 * (STAGE_BYTES, allocated with the instance):
 *
 * - A write is copied into the ring and a cudaMemcpyAsync issued from
 *   there; nothing waits for it. Stream order keeps writes in the order
 *   they were made, and a publishing write is two copies, its last word
 *   after its body. In a batch (write_start), a write adjacent to the
 *   previous one in the region and in the ring joins its copy, which is
 *   held back until a non-adjacent write, a read or the flush; the
 *   publishing word never joins anything.
 * - A batch's reads (read_start) are copies into the ring; the flush waits
 *   once for the stream, after which the server fills its replies from the
 *   ring. Stream order makes each read see the writes before it.
 * - Ring space is reused only once the copy that used it completed: the
 *   span of each batch is closed with an event, and space is reclaimed
 *   oldest span first with cudaEventQuery; only when the ring wrapped onto
 *   a copy still in flight does it wait (cudaEventSynchronize, counted as a
 *   staging wait). A batch's reads keep their span until the server used
 *   their bytes (its next batch call).
 * - What the ring cannot take (an access larger than the ring, or space
 *   held by reads) is copied straight from or to the caller's memory, as
 *   without staging, and counted as unstaged.
 *
 * Positions are bytes since the instance started; the ring offset is the
 * position modulo STAGE_BYTES, and an allocation that would straddle the
 * end skips to the start. Everything here runs under gi->lock.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_internal.h"
#include "gpu.h"
#include "log.h"
#include "util.h"

/* A CUDA error of a copy for the transport: recorded, as -errno. */
static int copy_err(struct gpu_instance *gi, cudaError_t e, const char *what) {
  lynx__cuda_note(gi->device, e, what);
  return lynx__cuda_errno(e);
}

/* Issues the held-back write's copy, if any. */
static int stage_issue(struct gpu_instance *gi) {
  struct stage *sg = &gi->stg;
  cudaError_t e;
  if (!sg->pend.live)
    return 0;
  sg->pend.live = 0;
  sg->st.copies++;
  e = cudaMemcpyAsync(gi->base + sg->pend.off,
                      sg->buf + sg->pend.pos % STAGE_BYTES, sg->pend.len,
                      cudaMemcpyHostToDevice, gi->copy);
  return e == cudaSuccess ? 0 : copy_err(gi, e, "copy into the region");
}

/* Frees the oldest closed span once its copies completed; wait: for them,
 * when they have not (the ring wrapped onto them). 0, -EAGAIN (not
 * complete, no wait), -ENOBUFS (the span holds reads the server has not
 * used yet) or the device's -errno. */
static int stage_reclaim(struct gpu_instance *gi, int wait) {
  struct stage *sg = &gi->stg;
  uint32_t i = sg->seg_first;
  if (sg->hold != STAGE_NONE && sg->seg[i].end > sg->hold)
    return -ENOBUFS;
  if (!sg->seg[i].done) {
    cudaError_t e = cudaEventQuery(sg->ev[i]);
    if (e == cudaErrorNotReady) {
      if (!wait)
        return -EAGAIN;
      sg->st.staging_waits++;
      e = cudaEventSynchronize(sg->ev[i]);
    }
    if (e != cudaSuccess)
      return copy_err(gi, e, "staging: waiting for a copy");
  }
  sg->tail = sg->seg[i].end;
  sg->seg_first = (i + 1) % STAGE_SEGS;
  sg->seg_n--;
  return 0;
}

/* Closes the open span: an event after its copies (the held-back write's
 * issued first). 0 or -errno (-ENOBUFS: every span is in flight and the
 * oldest holds the server's reads). */
static int stage_close(struct gpu_instance *gi) {
  struct stage *sg = &gi->stg;
  uint32_t i;
  cudaError_t e;
  int rc = stage_issue(gi);
  if (rc || sg->head == sg->open_from)
    return rc;
  if (sg->seg_n == STAGE_SEGS && (rc = stage_reclaim(gi, 1)) != 0)
    return rc;
  i = (sg->seg_first + sg->seg_n) % STAGE_SEGS;
  e = cudaEventRecord(sg->ev[i], gi->copy);
  if (e != cudaSuccess)
    return copy_err(gi, e, "staging: recording an event");
  sg->seg[i].end = sg->head;
  sg->seg[i].done = 0;
  sg->seg_n++;
  sg->open_from = sg->head;
  return 0;
}

/* len bytes of the ring at *pos, contiguous, free of any copy in flight.
 * 0, -E2BIG (never fits), -ENOBUFS (the server's reads hold the space) or
 * the device's -errno. */
static int stage_alloc(struct gpu_instance *gi, size_t len, uint64_t *pos) {
  struct stage *sg = &gi->stg;
  if (len > STAGE_BYTES)
    return -E2BIG;
  for (;;) {
    uint64_t at = sg->head % STAGE_BYTES;
    uint64_t skip = at + len > STAGE_BYTES ? STAGE_BYTES - at : 0;
    int rc;
    if (sg->head == sg->tail && at) {
      /* empty: start again at the ring's start, nothing to skip */
      sg->head = sg->tail = sg->open_from = sg->head + STAGE_BYTES - at;
      continue;
    }
    if (STAGE_BYTES - (sg->head - sg->tail) >= skip + len) {
      sg->head += skip;
      *pos = sg->head;
      sg->head += len;
      return 0;
    }
    /* reclaim the oldest span; the open one has to be closed first */
    if (!sg->seg_n && (rc = stage_close(gi)) != 0)
      return rc;
    if ((rc = stage_reclaim(gi, 1)) != 0)
      return rc;
  }
}

/* The next batch call: the bytes the last flush handed over are used. */
static void stage_unhold(struct stage *sg) {
  if (sg->held) {
    sg->held = 0;
    sg->hold = STAGE_NONE;
  }
}

/* A copy straight from the caller's memory, where the ring cannot take
 * it: the driver stages pageable memory itself before the call returns,
 * so src may be reused; stream order lands a publishing word last. */
static int unstaged_write(struct gpu_instance *gi, uint64_t off,
                          const uint8_t *src, size_t len, unsigned flags) {
  size_t body = flags & LYNX_WR_PUBLISH ? len - 4 : len;
  cudaError_t e = cudaSuccess;
  int rc = stage_issue(gi);
  if (rc)
    return rc;
  gi->stg.st.unstaged++;
  if (body) {
    gi->stg.st.copies++;
    e = cudaMemcpyAsync(gi->base + off, src, body, cudaMemcpyHostToDevice,
                        gi->copy);
  }
  if (e == cudaSuccess && body < len) {
    gi->stg.st.copies++;
    e = cudaMemcpyAsync(gi->base + off + body, src + body, 4,
                        cudaMemcpyHostToDevice, gi->copy);
  }
  return e == cudaSuccess ? 0 : copy_err(gi, e, "copy into the region");
}

/* A write through the ring; join: the copy may be held back to join the
 * next adjacent write (a batch), else it is issued now. */
static int stage_write(struct gpu_instance *gi, uint64_t off,
                       const uint8_t *src, size_t len, unsigned flags,
                       int join) {
  struct stage *sg = &gi->stg;
  size_t body = flags & LYNX_WR_PUBLISH ? len - 4 : len;
  uint64_t pos;
  cudaError_t e;
  int rc = stage_alloc(gi, len, &pos);
  if (rc == -E2BIG || rc == -ENOBUFS)
    return unstaged_write(gi, off, src, len, flags);
  if (rc)
    return rc;
  memcpy(sg->buf + pos % STAGE_BYTES, src, len);
  if (body) {
    if (sg->pend.live && sg->pend.off + sg->pend.len == off &&
        sg->pend.pos + sg->pend.len == pos &&
        sg->pend.pos % STAGE_BYTES + sg->pend.len + body <= STAGE_BYTES) {
      sg->pend.len += body; /* one copy for both */
      sg->st.merged++;
    } else {
      rc = stage_issue(gi);
      if (rc)
        return rc;
      sg->pend.off = off;
      sg->pend.pos = pos;
      sg->pend.len = body;
      sg->pend.live = 1;
    }
  }
  if (!join || body < len) {
    rc = stage_issue(gi);
    if (rc)
      return rc;
  }
  if (body < len) {
    /* the publishing word: a copy of its own after its body's */
    sg->st.copies++;
    e = cudaMemcpyAsync(gi->base + off + body,
                        sg->buf + (pos + body) % STAGE_BYTES, 4,
                        cudaMemcpyHostToDevice, gi->copy);
    if (e != cudaSuccess)
      return copy_err(gi, e, "copy into the region");
  }
  return 0;
}

int lynx__cuda_mem_write(void *ctx, uint64_t off, const void *src, size_t len) {
  struct gpu_instance *gi = ctx;
  int rc = 0;
  if (lynx_bounds_ok(gi->size, off, len))
    return -EFAULT;
  pthread_mutex_lock(&gi->lock);
  gi->stg.st.writes++;
  if (gi->gva) {
    lynx__cuda_gdr.to(gi->gmh, (uint8_t *)gi->gva + off, src, len);
    /* write-combined stores leave in order only across a fence; without
     * native ordering of peer writes, a read back makes this write land
     * before the next one (the fenced mode's barrier, done here) */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (gi->writes_ordering < (uint32_t)cudaGPUDirectRDMAWritesOrderingOwner) {
      uint32_t sink;
      lynx__cuda_gdr.from(gi->gmh, &sink, (uint8_t *)gi->gva + (off & ~3ull),
                          4);
    }
  } else {
    cudaSetDevice(gi->device);
    rc = gi->stg.buf ? stage_write(gi, off, src, len, 0, 0)
                     : unstaged_write(gi, off, src, len, 0);
  }
  pthread_mutex_unlock(&gi->lock);
  return rc;
}

/* A single read (the agent's own: the header, health): straight into dst,
 * complete on return. */
int lynx__cuda_mem_read(void *ctx, uint64_t off, void *dst, size_t len) {
  struct gpu_instance *gi = ctx;
  cudaError_t e = cudaSuccess;
  int rc = 0;
  if (lynx_bounds_ok(gi->size, off, len))
    return -EFAULT;
  pthread_mutex_lock(&gi->lock);
  gi->stg.st.reads++;
  if (gi->gva) {
    lynx__cuda_gdr.from(gi->gmh, dst, (uint8_t *)gi->gva + off, len);
  } else {
    cudaSetDevice(gi->device);
    rc = stage_issue(gi); /* a batch's write made before it */
    if (!rc) {
      gi->stg.st.copies++;
      gi->stg.st.syncs++;
      e = cudaMemcpyAsync(dst, gi->base + off, len, cudaMemcpyDeviceToHost,
                          gi->copy);
      if (e == cudaSuccess)
        e = cudaStreamSynchronize(gi->copy);
      if (e != cudaSuccess)
        rc = copy_err(gi, e, "copy out of the region");
    }
  }
  pthread_mutex_unlock(&gi->lock);
  return rc;
}

/* The batch ops (struct lynx_region_mem): set only where the instance
 * stages (no gdrcopy mapping). */
int lynx__cuda_mem_write_start(void *ctx, uint64_t off, const void *src,
                               size_t len, unsigned flags) {
  struct gpu_instance *gi = ctx;
  int rc;
  if (lynx_bounds_ok(gi->size, off, len))
    return -EFAULT;
  if ((flags & LYNX_WR_PUBLISH) && len < 4)
    return -EINVAL;
  pthread_mutex_lock(&gi->lock);
  cudaSetDevice(gi->device);
  stage_unhold(&gi->stg);
  gi->stg.st.writes++;
  rc = stage_write(gi, off, src, len, flags & LYNX_WR_PUBLISH, 1);
  pthread_mutex_unlock(&gi->lock);
  return rc;
}

int lynx__cuda_mem_read_start(void *ctx, uint64_t off, size_t len,
                              const void **bytes) {
  struct gpu_instance *gi = ctx;
  struct stage *sg = &gi->stg;
  uint64_t pos;
  cudaError_t e;
  int rc;
  if (lynx_bounds_ok(gi->size, off, len))
    return -EFAULT;
  pthread_mutex_lock(&gi->lock);
  cudaSetDevice(gi->device);
  stage_unhold(sg);
  rc = stage_issue(gi); /* the read sees it: stream order */
  if (!rc)
    rc = stage_alloc(gi, len, &pos);
  if (!rc) {
    sg->st.reads++;
    sg->st.copies++;
    e = cudaMemcpyAsync(sg->buf + pos % STAGE_BYTES, gi->base + off, len,
                        cudaMemcpyDeviceToHost, gi->copy);
    if (e == cudaSuccess) {
      if (sg->hold == STAGE_NONE)
        sg->hold = pos; /* kept until the server used the bytes */
      sg->reads++;
      *bytes = sg->buf + pos % STAGE_BYTES;
    } else {
      rc = copy_err(gi, e, "copy out of the region");
    }
  }
  pthread_mutex_unlock(&gi->lock);
  return rc;
}

int lynx__cuda_mem_flush(void *ctx) {
  struct gpu_instance *gi = ctx;
  struct stage *sg = &gi->stg;
  cudaError_t e;
  int rc;
  pthread_mutex_lock(&gi->lock);
  cudaSetDevice(gi->device);
  rc = stage_issue(gi);
  if (sg->reads) {
    /* the one wait of the batch: every copy so far has completed after
     * it, so every span is done; the reads' part stays held */
    sg->reads = 0;
    sg->st.syncs++;
    e = cudaStreamSynchronize(gi->copy);
    if (e == cudaSuccess) {
      sg->seg_first = 0;
      sg->seg_n = 0;
      if (sg->hold > sg->tail)
        sg->seg[sg->seg_n++] = (struct stage_seg){sg->hold, 1};
      if (sg->head > sg->hold)
        sg->seg[sg->seg_n++] = (struct stage_seg){sg->head, 1};
      sg->open_from = sg->head;
      sg->held = 1;
    } else {
      sg->hold = STAGE_NONE;
      if (!rc)
        rc = copy_err(gi, e, "copy out of the region");
    }
  } else if (!rc) {
    /* writes only: an event marks when their span is free again */
    rc = stage_close(gi);
    if (rc == -ENOBUFS)
      rc = 0; /* it stays open: closed by a later allocation */
    while (!rc && sg->seg_n && stage_reclaim(gi, 0) == 0)
      ;
  }
  pthread_mutex_unlock(&gi->lock);
  return rc;
}

/* Pinned staging and its events, for an instance whose transport copies
 * (tcp). 0, or -errno with the reason in err. */
int lynx__cuda_stage_init(struct gpu_instance *gi, char *err, size_t errlen) {
  struct stage *sg = &gi->stg;
  void *p = NULL;
  cudaError_t e =
      lynx__cuda_pinned_alloc(gi->device, STAGE_BYTES + STAGE_MIRROR_BYTES, &p);
  const char *what = "pinned staging allocation";
  sg->hold = STAGE_NONE;
  if (e == cudaSuccess) {
    sg->buf = p;
    /* the control array's copy starts as the formatted array: zeros (a
     * pooled buffer held another's) */
    sg->mirror = sg->buf + STAGE_BYTES;
    memset(sg->mirror, 0, STAGE_MIRROR_BYTES);
    what = "the control array's copy";
    e = cudaHostGetDevicePointer(&sg->mirror_dev, sg->mirror, 0);
  }
  if (e == cudaSuccess) {
    what = "staging events";
    for (uint32_t i = 0; i < STAGE_SEGS && e == cudaSuccess; i++)
      e = cudaEventCreateWithFlags(&sg->ev[i], cudaEventDisableTiming);
  }
  if (e != cudaSuccess) {
    lynx__cuda_note(gi->device, e, what);
    snprintf(err, errlen,
             "GPU %d: cannot set up the tcp transport's %u KiB "
             "of pinned staging (%s): %s",
             gi->device, STAGE_BYTES >> 10, what, lynx__cuda_strerror(e));
    return lynx__cuda_errno(e);
  }
  return 0;
}

/* Gives the staging back, once no copy uses it (the copy stream runs no
 * kernel: this waits for copies only). */
void lynx__cuda_stage_fini(struct gpu_instance *gi) {
  struct stage *sg = &gi->stg;
  const struct lynx_accel_copies *st = &sg->st;
  for (uint32_t i = 0; i < STAGE_SEGS; i++)
    if (sg->ev[i])
      cudaEventDestroy(sg->ev[i]);
  if (st->writes || st->reads)
    LYNX_INFO("cuda",
              "GPU %d: the region's tcp copies: %llu writes, %llu "
              "reads, %llu copies (%llu writes merged), %llu stream "
              "synchronisations, %llu staging waits, %llu unstaged",
              gi->device, (unsigned long long)st->writes,
              (unsigned long long)st->reads, (unsigned long long)st->copies,
              (unsigned long long)st->merged, (unsigned long long)st->syncs,
              (unsigned long long)st->staging_waits,
              (unsigned long long)st->unstaged);
  if (!sg->buf)
    return;
  if (gi->copy && cudaStreamSynchronize(gi->copy) != cudaSuccess) {
    LYNX_WARN("cuda",
              "GPU %d: copies on the staging may not have ended: "
              "its %u KiB stay out of use",
              gi->device, STAGE_BYTES >> 10);
    return;
  }
  lynx__cuda_pinned_free(gi->device, sg->buf);
  sg->buf = NULL;
}

void gpu_instance_copy_stats(struct gpu_instance *gi,
                             struct lynx_accel_copies *st) {
  pthread_mutex_lock(&gi->lock);
  *st = gi->stg.st;
  st->staging_bytes = gi->stg.buf ? STAGE_BYTES : 0;
  pthread_mutex_unlock(&gi->lock);
}
