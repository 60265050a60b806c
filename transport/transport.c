/* transport.c - the helpers every backend shares: a region's header
 * (format, read, validate), its wake, access classes and write checks,
 * served regions and locators, the -ENOTSUP ops, fencing. Below the
 * backends: it names none of them (the table of backends is
 * transport_lookup.c's). */
#include "transport.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log.h"
#include "mqueue.h"

int lynx_region_wake(uint8_t *base) {
  uint32_t *sleeping = (uint32_t *)(base + LYNX_OFF_SLEEPING);
  uint32_t *bell = (uint32_t *)(base + LYNX_OFF_DOORBELL);
  /* Dekker with the accelerator: our published slot and its sleeping flag
   * are both seq_cst, so either it sees the slot or we see the flag. */
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  if (__atomic_load_n(sleeping, __ATOMIC_SEQ_CST) == 0)
    return 0;
  __atomic_fetch_add(bell, 1, __ATOMIC_SEQ_CST);
  if (syscall(SYS_futex, bell, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0) < 0)
    return -errno;
  return 0;
}

int lynx_shm_create(const char *path, uint64_t size, int reserve, int *fd,
                    void **p) {
  int f = shm_open(path, O_RDWR | O_CREAT | O_EXCL, 0600), e;
  void *m;
  if (f < 0)
    return -errno;
  if (ftruncate(f, (off_t)size) != 0)
    goto fail;
  if (reserve && (e = posix_fallocate(f, 0, (off_t)size)) != 0) {
    e = -e; /* posix_fallocate returns the error, errno stays */
    goto out;
  }
  m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
  if (m == MAP_FAILED)
    goto fail;
  *fd = f;
  *p = m;
  return 0;
fail:
  e = -errno;
out:
  close(f);
  shm_unlink(path);
  return e;
}

int lynx_region_map_served(struct lynx_region *r,
                           struct lynx_transport_agent *a, const char *name,
                           uint64_t size) {
  void *p;
  r->fd = -1;
  r->base = NULL;
  r->mem = NULL;
  r->priv = NULL;
  r->agent = NULL;
  r->fence = NULL;
  r->shm[0] = '\0';
  snprintf(r->name, sizeof(r->name), "%s", name ? name : "");
  if (!a)
    return -ENOTCONN; /* agent_create first */
  if (size == 0)
    return -EINVAL;
  p = MAP_FAILED;
  if (a->share && r->name[0]) {
    /* the name the shm transport would give it, so the agent's sweep of
     * dead agents' files (lynx-<node>-<pid>-i<id>) finds it too */
    int fd, rc;
    snprintf(r->shm, sizeof(r->shm), "/%.*s", (int)sizeof(r->shm) - 2, r->name);
    /* its pages reserved now: a /dev/shm too small for it (a container's
     * 64 MiB) says so here, not with SIGBUS at a write later */
    rc = lynx_shm_create(r->shm, size, 1, &fd, &p);
    if (!rc) {
      r->fd = fd; /* frontends open the name; a plug-in's process the fd */
    } else {
      /* still served over this transport, as private memory */
      LYNX_LOG_RL(LYNX_LOG_WARN, "transport",
                  "region %s: no shared-memory file %s (%s): private "
                  "memory, reached over %s only",
                  r->name, r->shm, strerror(-rc), a->ops->name);
      r->shm[0] = '\0';
    }
  }
  if (p == MAP_FAILED) {
    /* a memory file: shared with a plug-in's process by its fd
     * (agent/apphost.c), private to the agent otherwise; pages are
     * touched only when used, as with anonymous memory */
    int fd = memfd_create(r->name[0] ? r->name : "lynx-region",
                          MFD_CLOEXEC | MFD_ALLOW_SEALING),
        e;
    if (fd < 0)
      return -errno;
    /* sealed at its size: a process it is shared with cannot shrink it
     * under the agent (a SIGBUS at its next access) */
    if (ftruncate(fd, (off_t)lynx_align_up(size, 4096)) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) {
      e = -errno;
      close(fd);
      return e;
    }
    p = mmap(NULL, lynx_align_up(size, 4096), PROT_READ | PROT_WRITE,
             MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      e = -errno;
      close(fd);
      return e;
    }
    r->fd = fd;
  }
  r->base = p;
  r->size = size;
  r->ops = a->ops;
  r->agent = a;
  snprintf(r->locator, sizeof(r->locator), "%s", a->bound);
  return 0;
}

void lynx_region_unmap_served(struct lynx_region *r, int unmap) {
  if (r->shm[0])
    shm_unlink(r->shm);
  r->shm[0] = '\0';
  if (r->fd >= 0)
    close(r->fd);
  r->fd = -1;
  if (unmap && r->base)
    munmap(r->base, r->size);
}

int lynx_region_attach_served(struct lynx_region *r,
                              struct lynx_transport_agent *a, uint64_t size,
                              const struct lynx_region_mem *mem) {
  r->fd = -1;
  r->base = NULL;
  r->priv = NULL;
  r->mem = NULL;
  r->agent = NULL;
  r->fence = NULL;
  r->shm[0] = '\0'; /* device memory: no file maps it */
  if (!a || size == 0) {
    mem->release(mem->ctx);
    return !a ? -ENOTCONN : -EINVAL; /* agent_create first */
  }
  r->mem = mem;
  r->size = size;
  r->ops = a->ops;
  r->agent = a;
  snprintf(r->locator, sizeof(r->locator), "%s", a->bound);
  return 0;
}

void lynx_locator_set_host(char *locator, size_t len, const char *host) {
  const char *colon = strrchr(locator, ':');
  char port[16];
  size_t hl;
  if (!colon || !host || !*host)
    return;
  hl = (size_t)(colon - locator);
  if (hl != 0 && !(hl == 7 && !strncmp(locator, "0.0.0.0", 7)) &&
      !(hl == 4 && !strncmp(locator, "[::]", 4)))
    return; /* a specific address: keep it */
  snprintf(port, sizeof(port), "%s", colon + 1);
  if (strchr(host, ':'))
    snprintf(locator, len, "[%s]:%s", host, port);
  else
    snprintf(locator, len, "%s:%s", host, port);
}

int lynx__arm_none(struct lynx_tconn *c, uint32_t bell,
                   const struct lynx_arm *a, int n) {
  (void)c;
  (void)bell;
  (void)a;
  (void)n;
  return -ENOTSUP;
}

int lynx__read_tx_none(struct lynx_tconn *c, void *actrl,
                       struct lynx_tx_read *tx, int n, uint64_t wr_id) {
  (void)c;
  (void)actrl;
  (void)tx;
  (void)n;
  (void)wr_id;
  return -ENOTSUP;
}

int lynx_slot_large(const uint8_t *slot, uint32_t slot_size,
                    uint32_t large_bytes, struct lynx_slot_meta *m,
                    struct lynx_large_ref *ref) {
  memcpy(m, slot + slot_size - LYNX_META_SIZE, sizeof(*m));
  if (!(m->status & LYNX_ST_LARGE) || lynx_meta_check(m, slot_size))
    return 0;
  memcpy(ref, slot + (uint32_t)m->off16 * 16u, sizeof(*ref));
  return lynx_large_check(m, ref, large_bytes) == 0;
}

int lynx__subscribe_none(struct lynx_tconn *c, struct lynx_push *p,
                         uint64_t wr_id) {
  (void)c;
  (void)p;
  (void)wr_id;
  return -ENOTSUP;
}

int lynx_region_class(const struct lynx_geom *g, uint64_t off, uint64_t len) {
  uint64_t tx = g->rings_off + (uint64_t)g->n_mqueues * g->ring_bytes;
  uint64_t end;
  if (lynx_bounds_ok(g->region_size, off, len))
    return -EFAULT;
  end = off + len;
  if (end <= g->fctrl_off)
    return LYNX_MR_CTL;
  if (off >= g->fctrl_off && end <= tx)
    return LYNX_MR_WRITE;
  if (off >= tx)
    return LYNX_MR_TX;
  return -EFAULT;
}

int lynx_writev_check(const struct lynx_geom *g, uint64_t off,
                      const struct iovec *iov, int iovcnt, unsigned flags,
                      uint64_t *total) {
  uint64_t t = 0;
  if (iovcnt < 0 || (iovcnt > 0 && !iov))
    return -EINVAL;
  for (int i = 0; i < iovcnt; i++) {
    if (iov[i].iov_len > g->region_size - t) /* no wrap either */
      return -EFAULT;
    t += iov[i].iov_len;
  }
  if (lynx_region_class(g, off, t) != LYNX_MR_WRITE)
    return -EFAULT;
  if ((flags & LYNX_WR_PUBLISH) && (t < 4 || ((off + t) & 3)))
    return -EINVAL;
  *total = t;
  return 0;
}

int lynx_region_format(struct lynx_region *r, uint32_t q, uint32_t slots,
                       uint32_t slot_size, uint32_t large_bytes,
                       uint32_t ordering, uint64_t epoch, uint32_t accel_id) {
  struct lynx_geom g;
  struct lynx_region_hdr hv = {0}; /* device memory: built here, then copied */
  struct lynx_region_hdr *h = r->mem ? &hv : (struct lynx_region_hdr *)r->base;
  int rc;
  if (lynx_geom_init(&g, q, slots, slot_size, large_bytes) ||
      g.region_size > r->size)
    return -EINVAL;
  memset(h, 0, sizeof(*h));
  h->layout_version = LYNX_LAYOUT_VERSION;
  h->ordering = (uint16_t)ordering;
  h->epoch = epoch;
  h->region_size = g.region_size;
  h->n_mqueues = q;
  h->slot_size = slot_size;
  h->slots = slots;
  h->accel_id = accel_id;
  h->actrl_off = g.actrl_off;
  h->fctrl_off = g.fctrl_off;
  h->rings_off = g.rings_off;
  h->large_bytes = large_bytes;
  if (!r->mem) {
    /* magic last: a reader that sees it sees a complete header */
    lynx_store_release32(&h->magic, LYNX_REGION_MAGIC);
    return 0;
  }
  /* device memory: the same rule through ordered copies */
  rc = r->mem->write(r->mem->ctx, 4, (const uint8_t *)h + 4, sizeof(*h) - 4);
  if (!rc) {
    uint32_t magic = LYNX_REGION_MAGIC;
    rc = r->mem->write(r->mem->ctx, 0, &magic, sizeof(magic));
  }
  return rc;
}

int lynx_region_read(const struct lynx_region *r, uint64_t off, void *dst,
                     size_t len) {
  if (lynx_bounds_ok(r->size, off, len))
    return -EFAULT;
  if (r->mem)
    return r->mem->read(r->mem->ctx, off, dst, len);
  if (!r->base)
    return -EINVAL;
  __atomic_thread_fence(__ATOMIC_ACQUIRE);
  memcpy(dst, r->base + off, len);
  return 0;
}

int lynx_region_validate(const void *base, uint64_t mapped,
                         const struct lynx_region_desc *d, char *err,
                         size_t errlen) {
  const struct lynx_region_hdr *h = base;
  struct lynx_geom g;
  if (mapped < sizeof(*h)) {
    snprintf(err, errlen, "region of %llu bytes is smaller than its header",
             (unsigned long long)mapped);
    return -EPROTO;
  }
  if (lynx_load_acquire32(&h->magic) != LYNX_REGION_MAGIC) {
    snprintf(err, errlen, "bad magic 0x%08x", h->magic);
    return -EPROTO;
  }
  if (h->layout_version != LYNX_LAYOUT_VERSION) {
    snprintf(err, errlen, "layout version %u, this frontend knows %u",
             h->layout_version, LYNX_LAYOUT_VERSION);
    return -EPROTO;
  }
  if (h->epoch != d->epoch) {
    snprintf(err, errlen, "epoch %llu, descriptor says %llu (stale region)",
             (unsigned long long)h->epoch, (unsigned long long)d->epoch);
    return -EPROTO;
  }
  if (h->ordering != d->ordering) {
    snprintf(err, errlen, "ordering mode %u, descriptor says %u", h->ordering,
             d->ordering);
    return -EPROTO;
  }
  if (lynx_geom_init(&g, d->n_mqueues, d->slots, d->slot_size,
                     d->large_bytes) == 0 &&
      h->n_mqueues == d->n_mqueues && h->slots == d->slots &&
      h->slot_size == d->slot_size && h->large_bytes == d->large_bytes &&
      d->region_size == g.region_size && mapped >= g.region_size &&
      h->region_size == g.region_size &&
      (h->actrl_off != g.actrl_off || h->fctrl_off != g.fctrl_off ||
       h->rings_off != g.rings_off)) {
    snprintf(err, errlen,
             "header offsets (%u, %u, %llu) differ from the "
             "layout's (%u, %u, %llu)",
             h->actrl_off, h->fctrl_off, (unsigned long long)h->rings_off,
             g.actrl_off, g.fctrl_off, (unsigned long long)g.rings_off);
    return -EPROTO;
  }
  if (lynx_geom_init(&g, d->n_mqueues, d->slots, d->slot_size,
                     d->large_bytes) ||
      h->n_mqueues != d->n_mqueues || h->slots != d->slots ||
      h->slot_size != d->slot_size || h->large_bytes != d->large_bytes ||
      h->region_size != g.region_size || d->region_size != g.region_size ||
      mapped < g.region_size) {
    snprintf(err, errlen,
             "geometry mismatch: header %u mqueues x %u slots x %u B + %u B "
             "(%llu B), descriptor %u x %u x %u + %u (%llu B)",
             h->n_mqueues, h->slots, h->slot_size, h->large_bytes,
             (unsigned long long)h->region_size, d->n_mqueues, d->slots,
             d->slot_size, d->large_bytes, (unsigned long long)d->region_size);
    return -EPROTO;
  }
  return 0;
}

/* ---- fencing by frontend epoch --------------------------------------- */

enum lynx_fence_verdict lynx_fence_decide(uint64_t fence, uint64_t producer) {
  if (producer < fence)
    return LYNX_FENCE_REFUSE;
  return producer > fence ? LYNX_FENCE_TAKEOVER : LYNX_FENCE_ADMIT;
}

void lynx_fence_why(char *buf, size_t len, uint64_t producer, uint64_t fence) {
  snprintf(buf, len,
           "fenced: frontend epoch %llu is older than %llu, the "
           "newest this region admitted",
           (unsigned long long)producer, (unsigned long long)fence);
}

int lynx_fence_cas(uint64_t *word, uint64_t producer, uint64_t *fence) {
  uint64_t cur = __atomic_load_n(word, __ATOMIC_ACQUIRE);
  for (;;) {
    if (lynx_fence_decide(cur, producer) == LYNX_FENCE_REFUSE) {
      *fence = cur;
      return -ESTALE;
    }
    if (cur == producer)
      return 0;
    /* seq_cst: a takeover is ordered before anything its frontend writes,
     * and an older frontend's next load of the word sees it */
    if (__atomic_compare_exchange_n(word, &cur, producer, 0, __ATOMIC_SEQ_CST,
                                    __ATOMIC_ACQUIRE))
      return 0;
  }
}

int lynx_fence_admit(struct lynx_fence *f, uint64_t producer, uint64_t *was,
                     char *why, size_t wl) {
  uint64_t cur = __atomic_load_n(&f->epoch, __ATOMIC_RELAXED);
  switch (lynx_fence_decide(cur, producer)) {
  case LYNX_FENCE_REFUSE:
    __atomic_fetch_add(&f->refused, 1, __ATOMIC_RELAXED);
    lynx_fence_why(why, wl, producer, cur);
    return -ESTALE;
  case LYNX_FENCE_ADMIT:
    __atomic_fetch_add(&f->producers, 1, __ATOMIC_RELAXED);
    return 0;
  case LYNX_FENCE_TAKEOVER:
  default:
    *was = cur;
    /* the older producers are being cut: this one is the only one left */
    __atomic_store_n(&f->epoch, producer, __ATOMIC_RELAXED);
    __atomic_store_n(&f->producers, 1, __ATOMIC_RELAXED);
    return LYNX_FENCE_TAKEOVER;
  }
}

void lynx_fence_took_over(struct lynx_fence *f, uint64_t was, uint64_t now,
                          unsigned n) {
  __atomic_fetch_add(&f->cut, n, __ATOMIC_RELAXED);
  LYNX_WARN("transport",
            "region %s: frontend epoch %llu takes over from "
            "%llu (%u connections cut)",
            f->name, (unsigned long long)now, (unsigned long long)was, n);
}

void lynx_fence_release(struct lynx_fence *f, uint64_t producer) {
  /* one of an older epoch was taken out of producers at the takeover */
  if (producer == __atomic_load_n(&f->epoch, __ATOMIC_RELAXED) &&
      __atomic_load_n(&f->producers, __ATOMIC_RELAXED) > 0)
    __atomic_fetch_sub(&f->producers, 1, __ATOMIC_RELAXED);
}

int lynx_fence_store(uint8_t *base, const struct lynx_region_mem *mem,
                     uint64_t epoch) {
  if (mem)
    return mem->write(mem->ctx, LYNX_OFF_FENCE, &epoch, sizeof(epoch));
  if (!base)
    return -EINVAL;
  __atomic_store_n((uint64_t *)(base + LYNX_OFF_FENCE), epoch,
                   __ATOMIC_SEQ_CST);
  return 0;
}

void lynx_region_fence_stats(const struct lynx_region *r,
                             struct lynx_fence_stats *out) {
  const struct lynx_fence *f = r->fence;
  memset(out, 0, sizeof(*out));
  if (f) {
    out->fence = __atomic_load_n(&f->epoch, __ATOMIC_RELAXED);
    out->producers = __atomic_load_n(&f->producers, __ATOMIC_RELAXED);
    out->refused = __atomic_load_n(&f->refused, __ATOMIC_RELAXED);
    out->cut = __atomic_load_n(&f->cut, __ATOMIC_RELAXED);
    if (r->shm[0] && r->base) { /* frontends that map it fence it too */
      uint64_t w = __atomic_load_n((const uint64_t *)(r->base + LYNX_OFF_FENCE),
                                   __ATOMIC_ACQUIRE);
      if (w > out->fence)
        out->fence = w;
    }
  } else if (r->base && r->size >= LYNX_OFF_FENCE + 8) {
    /* shm: frontends keep the word themselves */
    out->fence = __atomic_load_n((const uint64_t *)(r->base + LYNX_OFF_FENCE),
                                 __ATOMIC_ACQUIRE);
  }
}
