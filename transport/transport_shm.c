/*
 * transport_shm.c - the "shm" backend: the region is a POSIX shared-memory
 * file that the agent creates and the frontend maps.
 *
 * Writes are copies; LYNX_WR_PUBLISH stores the last word with release
 * semantics after everything else, which gives the coalesced ordering mode
 * its guarantee on weakly ordered CPUs (BlueField's Arm cores) as well as on
 * x86. Reads are copies followed by an acquire fence and complete at once;
 * their ids are handed back by the next poll, as a remote backend would.
 * notify is a futex wake on the region's doorbell word, issued only when the
 * accelerator has said it sleeps. arm is the other direction (common/bell.h):
 * it writes the frontend worker's bell into fctrl.waiter of its mqueues when
 * the region's header says its accelerator rings (a CPU accelerator).
 *
 * Fencing: no agent sits between a frontend and the file, so the fence is
 * the header word LYNX_OFF_FENCE. connect CAS-maxes its producer epoch into
 * it (refused, -ESTALE, when the word holds a newer one); every producing
 * call (writev, flush, arm, poll) loads it once and returns -ESTALE when it
 * is no longer this connection's epoch. The window that leaves is
 * docs/mqueue.md's: a writev that loaded the word just before a takeover
 * still lands, one batch at most.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "mqueue.h"
#include "transport.h"
#include "util.h"

#define SHM_CQ_DEPTH 256

struct shm_conn {
  struct lynx_tconn base;
  uint8_t *mem;
  uint64_t size;
  struct lynx_geom g;
  int bell; /* the accelerator rings response doorbells (LYNX_HDR_RESP_BELL) */
  const uint64_t *fence; /* the header word LYNX_OFF_FENCE */
  int fenced;            /* a newer frontend took the region over */
  uint64_t cq[SHM_CQ_DEPTH];
  unsigned cq_head, cq_tail;
};

/* The frontend maps the file itself: nothing to serve or export, the
 * handle only names the backend. */
static int shm_agent_create(const struct lynx_transport_opts *o,
                            struct lynx_transport_agent **out, char *err,
                            size_t errlen) {
  struct lynx_transport_agent *a = calloc(1, sizeof(*a));
  (void)o;
  if (!a) {
    snprintf(err, errlen, "shm transport: out of memory");
    return -ENOMEM;
  }
  a->ops = &lynx_transport_shm;
  *out = a;
  return 0;
}

static void shm_agent_destroy(struct lynx_transport_agent *a) { free(a); }

static int shm_region_export(struct lynx_region *r) {
  (void)r;
  return 0;
}

static int shm_region_alloc(struct lynx_transport_agent *a,
                            struct lynx_region *r, const char *name,
                            uint64_t size) {
  int fd, rc;
  void *p;
  r->fd = -1;
  r->shm[0] = '\0'; /* the locator is the file already */
  r->base = NULL;
  r->mem = NULL;
  r->agent = NULL;
  r->fence = NULL; /* the header word is the fence */
  if (!a)
    return -ENOTCONN; /* agent_create first */
  snprintf(r->name, sizeof(r->name), "%s", name);
  snprintf(r->locator, sizeof(r->locator), "/%s", name);
  rc = lynx_shm_create(r->locator, size, 0, &fd, &p);
  if (rc)
    return rc;
  r->fd = fd;
  r->base = p;
  r->size = size;
  r->ops = &lynx_transport_shm;
  r->agent = a;
  return 0;
}

static int shm_region_attach(struct lynx_transport_agent *a,
                             struct lynx_region *r, const char *name,
                             uint64_t size, const struct lynx_region_mem *mem) {
  (void)a;
  (void)name;
  (void)size;
  r->fd = -1;
  r->base = NULL;
  r->mem = NULL;
  r->agent = NULL;
  r->fence = NULL;
  mem->release(mem->ctx);
  return -ENOTSUP; /* a frontend maps a file of host memory: use tcp or rdma */
}

static void shm_region_free(struct lynx_region *r) {
  if (r->base)
    munmap(r->base, r->size);
  if (r->fd >= 0) {
    close(r->fd);
    shm_unlink(r->locator);
  }
  r->base = NULL;
  r->fd = -1;
}

/* connect's half of fencing: the CAS-max of the header word. */
static int shm_fence_admit(uint8_t *p, const struct lynx_region_desc *d,
                           char *err, size_t errlen) {
  uint64_t fence;
  int rc =
      lynx_fence_cas((uint64_t *)(p + LYNX_OFF_FENCE), d->producer, &fence);
  if (rc)
    lynx_fence_why(err, errlen, d->producer, fence);
  return rc;
}

/* The producing calls' half: one acquire load per call. 0 or -ESTALE
 * (for good: a fenced connection is dead). */
static int shm_fence_check(struct shm_conn *c) {
  if (!c->fenced &&
      __atomic_load_n(c->fence, __ATOMIC_ACQUIRE) != c->base.desc.producer) {
    c->fenced = 1;
    LYNX_LOG_RL(LYNX_LOG_WARN, "shm",
                "%s: fenced: a newer frontend (epoch "
                "%llu) took this region over from epoch %llu",
                c->base.desc.locator,
                (unsigned long long)__atomic_load_n(c->fence, __ATOMIC_RELAXED),
                (unsigned long long)c->base.desc.producer);
  }
  return c->fenced ? -ESTALE : 0;
}

static int shm_connect(const struct lynx_region_desc *d,
                       struct lynx_tconn **out) {
  struct shm_conn *c;
  struct stat st;
  char err[256];
  void *p;
  int fd, rc;
  if (d->locator[0] != '/' || strchr(d->locator + 1, '/'))
    return -EINVAL;
  fd = shm_open(d->locator, O_RDWR, 0);
  if (fd < 0)
    return -errno;
  if (fstat(fd, &st) != 0) {
    int e = -errno;
    close(fd);
    return e;
  }
  if ((uint64_t)st.st_size != d->region_size) {
    LYNX_WARN("shm", "%s: file is %lld bytes, descriptor says %llu", d->locator,
              (long long)st.st_size, (unsigned long long)d->region_size);
    close(fd);
    return -EPROTO;
  }
  p = mmap(NULL, d->region_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED)
    return -errno;
  rc = lynx_region_validate(p, d->region_size, d, err, sizeof(err));
  if (!rc)
    rc = shm_fence_admit(p, d, err, sizeof(err));
  if (rc) {
    LYNX_WARN("shm", "%s: refused: %s", d->locator, err);
    munmap(p, d->region_size);
    return rc;
  }
  c = calloc(1, sizeof(*c));
  if (!c) {
    munmap(p, d->region_size);
    return -ENOMEM;
  }
  c->base.ops = &lynx_transport_shm;
  c->base.desc = *d;
  lynx_geom_init(&c->g, d->n_mqueues, d->slots, d->slot_size,
                 d->large_bytes); /* validated */
  c->mem = p;
  c->size = d->region_size;
  c->bell = !!(((const struct lynx_region_hdr *)p)->flags & LYNX_HDR_RESP_BELL);
  c->fence = (const uint64_t *)((const uint8_t *)p + LYNX_OFF_FENCE);
  *out = &c->base;
  return 0;
}

static int shm_writev(struct lynx_tconn *tc, uint64_t off,
                      const struct iovec *iov, int iovcnt, unsigned flags) {
  struct shm_conn *c = container_of(tc, struct shm_conn, base);
  uint64_t total = 0, body, done = 0;
  uint8_t *dst;
  /* the frontend writes fctrl and the RX rings only, as under tcp/rdma */
  int rc = lynx_writev_check(&c->g, off, iov, iovcnt, flags, &total);
  if (!rc)
    rc = shm_fence_check(c);
  if (rc)
    return rc;
  dst = c->mem + off;
  body = (flags & LYNX_WR_PUBLISH) ? total - 4 : total;
  union {
    uint32_t w;
    uint8_t b[4];
  } last = {0};
  for (int i = 0; i < iovcnt; i++) {
    const uint8_t *src = iov[i].iov_base;
    size_t n = iov[i].iov_len;
    for (size_t k = 0; k < n;) {
      if (done < body) {
        size_t m = n - k;
        if (m > body - done)
          m = (size_t)(body - done);
        memcpy(dst + done, src + k, m);
        done += m;
        k += m;
      } else {
        last.b[done - body] = src[k];
        done++;
        k++;
      }
    }
  }
  if (flags & LYNX_WR_PUBLISH)
    lynx_store_release32((uint32_t *)(dst + body), last.w);
  return 0;
}

static int shm_read(struct lynx_tconn *tc, uint64_t off, void *dst, size_t len,
                    uint64_t wr_id) {
  struct shm_conn *c = container_of(tc, struct shm_conn, base);
  if (lynx_bounds_ok(c->size, off, len))
    return -EFAULT;
  if (c->cq_tail - c->cq_head >= SHM_CQ_DEPTH)
    return -ENOBUFS;
  memcpy(dst, c->mem + off, len);
  __atomic_thread_fence(__ATOMIC_ACQUIRE);
  c->cq[c->cq_tail++ % SHM_CQ_DEPTH] = wr_id;
  return 0;
}

static int shm_flush(struct lynx_tconn *tc) {
  return shm_fence_check(container_of(tc, struct shm_conn, base));
}

static int shm_poll(struct lynx_tconn *tc, uint64_t *ids, int max) {
  struct shm_conn *c = container_of(tc, struct shm_conn, base);
  int n = 0;
  if (shm_fence_check(c))
    return -ESTALE;
  while (n < max && c->cq_head != c->cq_tail)
    ids[n++] = c->cq[c->cq_head++ % SHM_CQ_DEPTH];
  return n;
}

/* Reads complete at once: the two-step path costs nothing a compound read
 * would save. */
#define shm_read_tx lynx__read_tx_none
#define shm_subscribe lynx__subscribe_none

static int shm_wait_fd(struct lynx_tconn *tc) {
  (void)tc;
  return -ENOTSUP; /* reads complete at once */
}

static int shm_notify(struct lynx_tconn *tc) {
  struct shm_conn *c = container_of(tc, struct shm_conn, base);
  return lynx_region_wake(c->mem);
}

/* The Dekker half of common/bell.h: waiter stores, a full fence, then the
 * TX indices; the accelerator stores its index, fences, loads waiter. */
static int shm_arm(struct lynx_tconn *tc, uint32_t bell,
                   const struct lynx_arm *a, int n) {
  struct shm_conn *c = container_of(tc, struct shm_conn, base);
  int ready = 0;
  if (!c->bell)
    return -ENOTSUP;
  if (shm_fence_check(c))
    return -ESTALE;
  for (int i = 0; i < n; i++) {
    struct lynx_fctrl *f;
    if (a[i].q >= c->g.n_mqueues)
      return -EINVAL;
    f = (struct lynx_fctrl *)(c->mem + lynx_fctrl_off(&c->g, a[i].q));
    __atomic_store_n(&f->waiter, bell, __ATOMIC_RELAXED);
  }
  if (!bell)
    return 0;
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  for (int i = 0; i < n && !ready; i++) {
    const struct lynx_actrl *ac =
        (const struct lynx_actrl *)(c->mem + lynx_actrl_off(&c->g, a[i].q));
    ready = __atomic_load_n(&ac->tx_prod, __ATOMIC_RELAXED) != a[i].cons;
  }
  return ready;
}

static void shm_close(struct lynx_tconn *tc) {
  struct shm_conn *c = container_of(tc, struct shm_conn, base);
  munmap(c->mem, c->size);
  free(c);
}

const struct lynx_transport_ops lynx_transport_shm =
    LYNX_TRANSPORT_OPS("shm", shm);
