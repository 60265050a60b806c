/*
 * test_transport_shm.c - unit tests of common/transport.c (region format and
 * validation, descriptor conversion) and common/transport_shm.c (the shm
 * backend: alloc/connect/writev/read/poll/notify/free).
 *
 * Every shm file is named lynx-ut-<pid>-<n>; the fixture's teardown frees it
 * whichever way a test ends, and an atexit handler unlinks anything left.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <dirent.h>
#include <setjmp.h>
#include <sys/wait.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "lynx.pb-c.h"
#include "mqueue.h"
#include "transport.h"
#include "ut_main.h"

#define Q 2u
#define S 8u
#define Z 256u
#define EPOCH 0x5EED0000CAFEull
#define ACCEL 3u

/* ---- shm names, and cleanup on every path ----------------------------- */

#define MAX_NAMES 64
static char g_names[MAX_NAMES][LYNX_LOCATOR_MAX];
static unsigned g_n_names;

static void unlink_all(void) {
  for (unsigned i = 0; i < g_n_names; i++)
    shm_unlink(g_names[i]); /* ENOENT for the ones already freed */
}

/* Removes every file of process pid's tests from /dev/shm, whatever
 * state that process died in. */
static void sweep(pid_t pid) {
  char prefix[64];
  struct dirent *de;
  DIR *d = opendir("/dev/shm");
  if (!d)
    return;
  snprintf(prefix, sizeof(prefix), "lynx-ut-%d-", (int)pid);
  while ((de = readdir(d)) != NULL)
    if (strncmp(de->d_name, prefix, strlen(prefix)) == 0) {
      char loc[300];
      snprintf(loc, sizeof(loc), "/%s", de->d_name);
      shm_unlink(loc);
    }
  closedir(d);
}

/* A fresh name for region_alloc; remembered (with its leading '/') so the
 * atexit handler can unlink it. */
static const char *new_name(char *buf, size_t len) {
  static unsigned seq;
  snprintf(buf, len, "lynx-ut-%d-%u", (int)getpid(), seq++);
  if (g_n_names < MAX_NAMES)
    snprintf(g_names[g_n_names++], LYNX_LOCATOR_MAX, "/%s", buf);
  return buf;
}

static int shm_exists(const char *locator) {
  char path[256];
  struct stat st;
  snprintf(path, sizeof(path), "/dev/shm%s", locator);
  return stat(path, &st) == 0;
}

/* ---- fixture ----------------------------------------------------------- */

struct fx {
  const struct lynx_transport_ops *ops;
  struct lynx_region r, r2; /* r2: a second region some tests need */
  struct lynx_geom g;
  struct lynx_region_desc d;
  struct lynx_tconn *c;
  uint8_t *snap;
};

static void region_init_empty(struct lynx_region *r) {
  memset(r, 0, sizeof(*r));
  r->fd = -1;
}

static void fill_desc(struct lynx_region_desc *d, const struct lynx_region *r,
                      const struct lynx_geom *g, uint64_t epoch) {
  memset(d, 0, sizeof(*d));
  d->accel_id = ACCEL;
  snprintf(d->transport, sizeof(d->transport), "shm");
  snprintf(d->locator, sizeof(d->locator), "%s", r->locator);
  d->region_size = g->region_size;
  d->epoch = epoch;
  d->n_mqueues = g->n_mqueues;
  d->slots = g->slots;
  d->slot_size = g->slot_size;
  d->ordering = LYNX_ORDER_COALESCED;
}

static int fx_setup(void **state) {
  struct fx *f = calloc(1, sizeof(*f));
  char name[64];
  if (!f)
    return -1;
  *state = f;
  region_init_empty(&f->r);
  region_init_empty(&f->r2);
  f->ops = lynx_transport_find("shm");
  if (!f->ops || lynx_geom_init(&f->g, Q, S, Z))
    return -1;
  if (f->ops->region_alloc(&f->r, new_name(name, sizeof(name)),
                           f->g.region_size))
    return -1;
  if (lynx_region_format(&f->r, Q, S, Z, LYNX_ORDER_COALESCED, EPOCH, ACCEL))
    return -1;
  fill_desc(&f->d, &f->r, &f->g, EPOCH);
  return 0;
}

static int fx_teardown(void **state) {
  struct fx *f = *state;
  if (!f)
    return 0;
  if (f->c)
    f->c->ops->close(f->c);
  if (f->ops) {
    f->ops->region_free(&f->r);
    f->ops->region_free(&f->r2);
  }
  free(f->snap);
  free(f);
  *state = NULL;
  return 0;
}

static void connect_ok(struct fx *f) {
  assert_int_equal(f->ops->connect(&f->d, &f->c), 0);
  assert_non_null(f->c);
}

static void snapshot(struct fx *f) {
  free(f->snap);
  f->snap = malloc(f->r.size);
  assert_non_null(f->snap);
  memcpy(f->snap, f->r.base, f->r.size);
}

static void assert_unchanged(struct fx *f) {
  assert_memory_equal(f->r.base, f->snap, f->r.size);
}

static void assert_desc_equal(const struct lynx_region_desc *a,
                              const struct lynx_region_desc *b) {
  assert_int_equal(a->accel_id, b->accel_id);
  assert_string_equal(a->transport, b->transport);
  assert_string_equal(a->locator, b->locator);
  assert_true(a->region_size == b->region_size);
  assert_true(a->epoch == b->epoch);
  assert_int_equal(a->n_mqueues, b->n_mqueues);
  assert_int_equal(a->slot_size, b->slot_size);
  assert_int_equal(a->slots, b->slots);
  assert_int_equal(a->ordering, b->ordering);
  assert_true(a->key == b->key);
  assert_true(a->remote_addr == b->remote_addr);
  assert_memory_equal(a->rkeys, b->rkeys, sizeof(a->rkeys));
}

/* ---- registry and bounds helper --------------------------------------- */

static void test_find_and_ops(void **state) {
  const struct lynx_transport_ops *o = lynx_transport_find("shm");
  (void)state;
  assert_ptr_equal(o, &lynx_transport_shm);
  assert_string_equal(o->name, "shm");
  assert_null(lynx_transport_find("tcp-nope"));
  assert_null(lynx_transport_find(""));
  assert_null(lynx_transport_find("SHM"));
  /* no member is ever NULL */
  assert_non_null(o->region_alloc);
  assert_non_null(o->region_free);
  assert_non_null(o->connect);
  assert_non_null(o->writev);
  assert_non_null(o->read);
  assert_non_null(o->flush);
  assert_non_null(o->poll);
  assert_non_null(o->notify);
  assert_non_null(o->close);
}

static void test_bounds_ok(void **state) {
  (void)state;
  assert_int_equal(lynx_bounds_ok(100, 0, 100), 0);
  assert_int_equal(lynx_bounds_ok(100, 100, 0), 0);
  assert_int_equal(lynx_bounds_ok(100, 99, 1), 0);
  assert_int_equal(lynx_bounds_ok(100, 99, 2), -EFAULT);
  assert_int_equal(lynx_bounds_ok(100, 101, 0), -EFAULT);
  assert_int_equal(lynx_bounds_ok(100, 0, 101), -EFAULT);
  /* no overflow */
  assert_int_equal(lynx_bounds_ok(100, UINT64_MAX, 2), -EFAULT);
  assert_int_equal(lynx_bounds_ok(100, 50, UINT64_MAX - 10), -EFAULT);
  assert_int_equal(lynx_bounds_ok(UINT64_MAX, 1, UINT64_MAX), -EFAULT);
  assert_int_equal(lynx_bounds_ok(UINT64_MAX, 1, UINT64_MAX - 1), 0);
}

/* ---- alloc, format, connect --------------------------------------------- */

static void test_alloc_format_connect(void **state) {
  struct fx *f = *state;
  const struct lynx_region_hdr *h = (const void *)f->r.base;
  uint8_t buf[64];
  uint64_t id = 0;
  struct stat st;
  char path[256];

  assert_ptr_equal(f->r.ops, &lynx_transport_shm);
  assert_int_equal(f->r.size, f->g.region_size);
  assert_int_equal(f->r.locator[0], '/');
  assert_true(f->r.fd >= 0);
  snprintf(path, sizeof(path), "/dev/shm%s", f->r.locator);
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(st.st_size, f->g.region_size);
  assert_int_equal(st.st_mode & 0777, 0600);

  /* the header, as docs/mqueue.md lays it out */
  assert_int_equal(h->magic, LYNX_REGION_MAGIC);
  assert_memory_equal(f->r.base, "LYNX", 4);
  assert_int_equal(h->layout_version, LYNX_LAYOUT_VERSION);
  assert_int_equal(h->ordering, LYNX_ORDER_COALESCED);
  assert_true(h->epoch == EPOCH);
  assert_int_equal(h->region_size, f->g.region_size);
  assert_int_equal(h->n_mqueues, Q);
  assert_int_equal(h->slot_size, Z);
  assert_int_equal(h->slots, S);
  assert_int_equal(h->accel_id, ACCEL);
  assert_int_equal(h->actrl_off, f->g.actrl_off);
  assert_int_equal(h->fctrl_off, f->g.fctrl_off);
  assert_int_equal(h->rings_off, f->g.rings_off);
  assert_int_equal(h->reserved, 0);
  /* the rest of the region starts zeroed */
  for (uint64_t i = sizeof(*h); i < f->r.size; i++)
    if (f->r.base[i])
      fail_msg("byte %llu not zero", (unsigned long long)i);

  connect_ok(f);
  assert_ptr_equal(f->c->ops, &lynx_transport_shm);
  assert_desc_equal(&f->c->desc, &f->d);

  /* the frontend's write shows up in the agent's mapping ... */
  {
    const char msg[] = "frontend was here";
    struct iovec iov = {(void *)msg, sizeof(msg)};
    uint64_t off = lynx_rx_ring_off(&f->g, 1) + 3 * Z;
    assert_int_equal(f->c->ops->writev(f->c, off, &iov, 1, 0), 0);
    assert_int_equal(f->c->ops->flush(f->c), 0);
    assert_memory_equal(f->r.base + off, msg, sizeof(msg));
  }
  /* ... and the agent's data in the frontend's reads */
  memcpy(f->r.base + lynx_tx_ring_off(&f->g, 0), "accelerator says hi", 20);
  assert_int_equal(f->c->ops->read(f->c, lynx_tx_ring_off(&f->g, 0), buf, 20,
                                   7),
                   0);
  assert_int_equal(f->c->ops->poll(f->c, &id, 1), 1);
  assert_int_equal(id, 7);
  assert_memory_equal(buf, "accelerator says hi", 20);
  /* the header read through the connection */
  assert_int_equal(f->c->ops->read(f->c, 0, buf, 64, 8), 0);
  assert_int_equal(f->c->ops->poll(f->c, &id, 1), 1);
  assert_memory_equal(buf, f->r.base, 64);

  /* closing the connection leaves the region with its agent */
  f->c->ops->close(f->c);
  f->c = NULL;
  assert_true(shm_exists(f->r.locator));
  assert_int_equal(h->magic, LYNX_REGION_MAGIC);
  connect_ok(f);
}

static void test_format_rejects(void **state) {
  struct fx *f = *state;
  char name[64];
  /* a region too small for the geometry */
  assert_int_equal(f->ops->region_alloc(&f->r2, new_name(name, sizeof(name)),
                                        4096),
                   0);
  assert_int_equal(lynx_region_format(&f->r2, 1, 2, 64, 0, 1, 0), -EINVAL);
  assert_int_equal(((struct lynx_region_hdr *)f->r2.base)->magic, 0);
  /* a geometry out of bounds */
  assert_int_equal(lynx_region_format(&f->r, 1, 3, 64, 0, 1, 0), -EINVAL);
  assert_int_equal(lynx_region_format(&f->r, 0, 2, 64, 0, 1, 0), -EINVAL);
  assert_int_equal(lynx_region_format(&f->r, 1, 2, 32, 0, 1, 0), -EINVAL);
  /* the valid header was not touched */
  assert_true(((struct lynx_region_hdr *)f->r.base)->epoch == EPOCH);
  connect_ok(f);
}

static void expect_refused(struct fx *f, const struct lynx_region_desc *d,
                           int want) {
  struct lynx_tconn *sentinel = (struct lynx_tconn *)(uintptr_t)0x1;
  struct lynx_tconn *c = sentinel;
  int rc = f->ops->connect(d, &c);
  if (rc == 0 && c != sentinel && c)
    c->ops->close(c);
  assert_int_equal(rc, want);
  assert_ptr_equal(c, sentinel); /* *out untouched on failure */
}

static void test_connect_refuses(void **state) {
  struct fx *f = *state;
  struct lynx_region_desc d;
  struct lynx_region_hdr *h = (struct lynx_region_hdr *)f->r.base;
  struct lynx_geom g2;

  /* wrong epoch (a stale descriptor) */
  d = f->d;
  d.epoch = EPOCH + 1;
  expect_refused(f, &d, -EPROTO);
  /* wrong geometry with the same region size: 1 x 16 x 256 */
  assert_int_equal(lynx_geom_init(&g2, 1, 16, 256), 0);
  assert_int_equal(g2.region_size, f->g.region_size);
  d = f->d;
  d.n_mqueues = 1;
  d.slots = 16;
  expect_refused(f, &d, -EPROTO);
  d = f->d;
  d.slot_size = 512; /* and a size that does not match the geometry */
  expect_refused(f, &d, -EPROTO);
  /* wrong size */
  d = f->d;
  d.region_size += 4096;
  expect_refused(f, &d, -EPROTO);
  d = f->d;
  d.region_size -= 4096;
  expect_refused(f, &d, -EPROTO);
  /* a file shorter than descriptor and header say (truncated behind the
   * agent's back): mapping it would fault on the missing pages */
  assert_int_equal(ftruncate(f->r.fd, (off_t)(f->g.region_size - 4096)), 0);
  expect_refused(f, &f->d, -EPROTO);
  assert_int_equal(ftruncate(f->r.fd, (off_t)f->g.region_size), 0);
  /* wrong ordering */
  d = f->d;
  d.ordering = LYNX_ORDER_FENCED;
  expect_refused(f, &d, -EPROTO);
  /* bad locators */
  d = f->d;
  snprintf(d.locator, sizeof(d.locator), "%s", f->r.locator + 1);
  expect_refused(f, &d, -EINVAL);
  d = f->d;
  snprintf(d.locator, sizeof(d.locator), "/x/%.64s", f->r.locator + 1);
  expect_refused(f, &d, -EINVAL);
  d = f->d;
  snprintf(d.locator, sizeof(d.locator), "/lynx-ut-%d-nonexistent",
           (int)getpid());
  expect_refused(f, &d, -ENOENT);

  /* the header itself is checked: version, magic */
  h->layout_version = LYNX_LAYOUT_VERSION + 1;
  expect_refused(f, &f->d, -EPROTO);
  h->layout_version = LYNX_LAYOUT_VERSION;
  h->magic = 0x584E594D;
  expect_refused(f, &f->d, -EPROTO);
  h->magic = LYNX_REGION_MAGIC;
  h->rings_off += 4096;
  expect_refused(f, &f->d, -EPROTO);
  h->rings_off -= 4096;
  /* and with everything restored it connects */
  connect_ok(f);
}

static void test_connect_unformatted(void **state) {
  struct fx *f = *state;
  struct lynx_region_desc d;
  char name[64];
  assert_int_equal(f->ops->region_alloc(&f->r2, new_name(name, sizeof(name)),
                                        f->g.region_size),
                   0);
  fill_desc(&d, &f->r2, &f->g, EPOCH);
  expect_refused(f, &d, -EPROTO); /* magic 0: not (yet) a region */
  assert_int_equal(
      lynx_region_format(&f->r2, Q, S, Z, LYNX_ORDER_FENCED, EPOCH + 5, 9), 0);
  d.epoch = EPOCH + 5;
  expect_refused(f, &d, -EPROTO); /* ordering still says coalesced */
  d.ordering = LYNX_ORDER_FENCED;
  assert_int_equal(f->ops->connect(&d, &f->c), 0);
}

static void test_region_validate(void **state) {
  struct fx *f = *state;
  char err[256];
  struct lynx_region_desc d = f->d;
  (void)state;
  err[0] = 0;
  assert_int_equal(lynx_region_validate(f->r.base, f->r.size, &d, err,
                                        sizeof(err)),
                   0);
  assert_int_equal(lynx_region_validate(f->r.base, 63, &d, err, sizeof(err)),
                   -EPROTO);
  assert_true(strlen(err) > 0);
  err[0] = 0;
  /* mapped less than the geometry needs */
  assert_int_equal(lynx_region_validate(f->r.base, f->r.size - 1, &d, err,
                                        sizeof(err)),
                   -EPROTO);
  assert_true(strlen(err) > 0);
  d.epoch = 1;
  assert_int_equal(lynx_region_validate(f->r.base, f->r.size, &d, err,
                                        sizeof(err)),
                   -EPROTO);
  assert_non_null(strstr(err, "epoch"));
  d = f->d;
  d.slots = 3; /* invalid geometry in the descriptor */
  assert_int_equal(lynx_region_validate(f->r.base, f->r.size, &d, err,
                                        sizeof(err)),
                   -EPROTO);
}

/* ---- bounds ------------------------------------------------------------- */

static void test_writev_read_outside_efault(void **state) {
  struct fx *f = *state;
  const uint64_t size = f->r.size;
  uint8_t src[64], dst[64];
  uint64_t ids[4];
  struct iovec one = {src, 4};
  struct iovec two[2] = {{src, 32}, {src + 32, 32}};
  struct iovec big[2] = {{src, 64}, {NULL, 0}};
  memset(src, 0xEE, sizeof(src));
  memset(f->r.base + size - 64, 0x11, 64);
  connect_ok(f);
  snapshot(f);

  /* writes that end past the region */
  assert_int_equal(f->c->ops->writev(f->c, size, &one, 1, 0), -EFAULT);
  assert_int_equal(f->c->ops->writev(f->c, size - 3, &one, 1, 0), -EFAULT);
  assert_int_equal(f->c->ops->writev(f->c, size - 63, two, 2, 0), -EFAULT);
  assert_int_equal(f->c->ops->writev(f->c, size - 60, two, 2, LYNX_WR_PUBLISH),
                   -EFAULT);
  assert_int_equal(f->c->ops->writev(f->c, size + 4096, &one, 1, 0), -EFAULT);
  /* offsets that would wrap around */
  assert_int_equal(f->c->ops->writev(f->c, UINT64_MAX, &one, 1, 0), -EFAULT);
  assert_int_equal(f->c->ops->writev(f->c, UINT64_MAX - 1, &one, 1, 0),
                   -EFAULT);
  assert_int_equal(
      f->c->ops->writev(f->c, (uint64_t)0 - size, &one, 1, LYNX_WR_PUBLISH),
      -EFAULT);
  big[1].iov_base = src;
  big[1].iov_len = (size_t)size;
  assert_int_equal(f->c->ops->writev(f->c, 0, big, 2, 0), -EFAULT);
  /* iovec lengths whose sum wraps around 2^64 (to 4, then to 16) describe
   * an access outside the region too; none of them may be read */
  {
    struct iovec wrap[2] = {{src, 8}, {src, SIZE_MAX - 3}};
    struct iovec wrap3[3] = {{src, 16}, {src, SIZE_MAX}, {src, 1}};
    assert_int_equal(f->c->ops->writev(f->c, 4096, wrap, 2, 0), -EFAULT);
    assert_int_equal(f->c->ops->writev(f->c, 4096, wrap, 2, LYNX_WR_PUBLISH),
                     -EFAULT);
    assert_int_equal(f->c->ops->writev(f->c, 4096, wrap3, 3, LYNX_WR_PUBLISH),
                     -EFAULT);
  }
  assert_unchanged(f);

  /* reads likewise, and they complete nothing */
  memset(dst, 0xAB, sizeof(dst));
  assert_int_equal(f->c->ops->read(f->c, size - 63, dst, 64, 1), -EFAULT);
  assert_int_equal(f->c->ops->read(f->c, size, dst, 1, 2), -EFAULT);
  assert_int_equal(f->c->ops->read(f->c, UINT64_MAX, dst, 2, 3), -EFAULT);
  assert_int_equal(f->c->ops->read(f->c, 1, dst, (size_t)size, 4), -EFAULT);
  for (size_t i = 0; i < sizeof(dst); i++)
    assert_int_equal(dst[i], 0xAB);
  assert_int_equal(f->c->ops->poll(f->c, ids, 4), 0);

  /* right at the end is inside */
  assert_int_equal(f->c->ops->read(f->c, size - 64, dst, 64, 5), 0);
  assert_int_equal(f->c->ops->poll(f->c, ids, 4), 1);
  assert_int_equal(ids[0], 5);
  for (size_t i = 0; i < sizeof(dst); i++)
    assert_int_equal(dst[i], 0x11);
  /* writes go only where a frontend writes (fctrl, RX rings): the TX rings
   * and the header are refused even inside the region */
  assert_int_equal(f->c->ops->writev(f->c, size - 64, two, 2, LYNX_WR_PUBLISH),
                   -EFAULT);
  assert_int_equal(f->c->ops->writev(f->c, 0, two, 2, 0), -EFAULT);
  assert_int_equal(f->c->ops->writev(f->c, f->g.fctrl_off - 4, two, 2, 0),
                   -EFAULT); /* straddles actrl and fctrl */
  assert_unchanged(f);
  {
    uint64_t rx_end = f->g.rings_off + (uint64_t)Q * S * Z;
    assert_int_equal(
        f->c->ops->writev(f->c, rx_end - 64, two, 2, LYNX_WR_PUBLISH), 0);
    assert_memory_equal(f->r.base + rx_end - 64, src, 64);
    assert_int_equal(f->c->ops->writev(f->c, rx_end - 32, two, 2, 0),
                     -EFAULT); /* straddles RX and TX rings */
  }
  assert_int_equal(f->c->ops->writev(f->c, f->g.fctrl_off + 8, &big[0], 0, 0), 0);
}

/* ---- writev and PUBLISH ------------------------------------------------- */

static void test_writev_publish(void **state) {
  struct fx *f = *state;
  const char payload[] = "sockperf-ping";
  const uint32_t len = (uint32_t)sizeof(payload);
  const uint32_t poff = lynx_payload_off(Z, len);
  uint8_t pad[16] = {0};
  struct lynx_slot_meta meta;
  uint64_t slot = lynx_slot_off(&f->g, lynx_rx_ring_off(&f->g, 1), 0);
  struct lynx_mq mq;
  struct lynx_msg m;
  struct iovec iov[4];

  connect_ok(f);
  /* the request as the frontend writes it: payload, pad, then metadata
   * split so that the published word straddles two iovecs */
  memset(&meta, 0, sizeof(meta));
  meta.len = len;
  meta.tag = 0xC0FFEE01u;
  meta.off16 = (uint16_t)(poff / 16);
  meta.seq = lynx_seq_for(0);
  iov[0].iov_base = (void *)payload;
  iov[0].iov_len = len;
  iov[1].iov_base = pad;
  iov[1].iov_len = Z - 16 - poff - len;
  iov[2].iov_base = &meta;
  iov[2].iov_len = 14;
  iov[3].iov_base = (uint8_t *)&meta + 14;
  iov[3].iov_len = 2;
  assert_int_equal(Z - poff, len + iov[1].iov_len + 16);

  lynx_mq_bind(&mq, f->r.base, &f->g, 1);
  assert_int_equal(lynx_mq_recv(&mq, &m), -EAGAIN);
  assert_int_equal(f->c->ops->writev(f->c, slot + poff, iov, 4,
                                     LYNX_WR_PUBLISH),
                   0);
  assert_int_equal(f->c->ops->flush(f->c), 0);
  assert_memory_equal(f->r.base + slot + poff, payload, len);
  assert_memory_equal(f->r.base + slot + Z - 16, &meta, 16);
  assert_int_equal(*(uint32_t *)(f->r.base + slot + Z - 4), 1);
  /* the accelerator side receives it from its own mapping */
  assert_int_equal(lynx_mq_recv(&mq, &m), 0);
  assert_int_equal(m.tag, 0xC0FFEE01u);
  assert_int_equal(m.len, len);
  assert_memory_equal(m.data, payload, len);

  /* the published word alone, and a write whose last word is only 4 bytes */
  {
    uint32_t w = 0xA5A5A5A5u;
    struct iovec wi = {&w, 4};
    assert_int_equal(f->c->ops->writev(f->c, 4096, &wi, 1, LYNX_WR_PUBLISH),
                     0);
    assert_int_equal(*(uint32_t *)(f->r.base + 4096), 0xA5A5A5A5u);
  }
  /* the last word split in four one-byte iovecs */
  {
    uint8_t b[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    struct iovec bi[5] = {{b, 4}, {b + 4, 1}, {b + 5, 1}, {b + 6, 1},
                          {b + 7, 1}};
    assert_int_equal(f->c->ops->writev(f->c, 6144, bi, 5, LYNX_WR_PUBLISH), 0);
    assert_memory_equal(f->r.base + 6144, b, 8);
  }
}

static void test_writev_publish_einval(void **state) {
  struct fx *f = *state;
  uint8_t b[16];
  struct iovec iov = {b, 7};
  memset(b, 0x77, sizeof(b));
  connect_ok(f);
  snapshot(f);
  /* end not 4-aligned */
  assert_int_equal(f->c->ops->writev(f->c, 4096, &iov, 1, LYNX_WR_PUBLISH),
                   -EINVAL);
  iov.iov_len = 8;
  assert_int_equal(f->c->ops->writev(f->c, 4097, &iov, 1, LYNX_WR_PUBLISH),
                   -EINVAL);
  assert_int_equal(f->c->ops->writev(f->c, 4098, &iov, 1, LYNX_WR_PUBLISH),
                   -EINVAL);
  /* shorter than the published word */
  iov.iov_len = 2;
  assert_int_equal(f->c->ops->writev(f->c, 4098, &iov, 1, LYNX_WR_PUBLISH),
                   -EINVAL);
  iov.iov_len = 0;
  assert_int_equal(f->c->ops->writev(f->c, 4096, &iov, 1, LYNX_WR_PUBLISH),
                   -EINVAL);
  assert_unchanged(f);
  /* without PUBLISH the same unaligned writes are fine */
  iov.iov_len = 7;
  assert_int_equal(f->c->ops->writev(f->c, 4097, &iov, 1, 0), 0);
  assert_memory_equal(f->r.base + 4097, b, 7);
  /* 4-aligned end, unaligned start: fine with PUBLISH */
  iov.iov_len = 7;
  assert_int_equal(f->c->ops->writev(f->c, 4097 + 16, &iov, 1,
                                     LYNX_WR_PUBLISH),
                   0);
  assert_memory_equal(f->r.base + 4097 + 16, b, 7);
}

/* ---- reads and completions --------------------------------------------- */

static void test_read_completions(void **state) {
  struct fx *f = *state;
  uint8_t a[16], b[32], c[8];
  uint64_t ids[300];
  uint64_t off_a = lynx_tx_ring_off(&f->g, 0), off_b = off_a + Z;
  struct lynx_actrl *ac = (struct lynx_actrl *)(f->r.base + f->g.actrl_off);
  connect_ok(f);
  memset(f->r.base + off_a, 0xA1, 16);
  memset(f->r.base + off_b, 0xB2, 32);
  ac[0].tx_prod = 5;
  ac[1].rx_cons = 9;

  assert_int_equal(f->c->ops->poll(f->c, ids, 8), 0);
  assert_int_equal(f->c->ops->read(f->c, off_a, a, sizeof(a), 11), 0);
  assert_int_equal(f->c->ops->read(f->c, off_b, b, sizeof(b), 22), 0);
  assert_int_equal(
      f->c->ops->read(f->c, f->g.actrl_off, c, sizeof(c), 0xFFFFFFFFFFull), 0);
  assert_int_equal(f->c->ops->flush(f->c), 0);
  /* reported in posting order, at most max at a time */
  assert_int_equal(f->c->ops->poll(f->c, ids, 2), 2);
  assert_int_equal(ids[0], 11);
  assert_int_equal(ids[1], 22);
  assert_int_equal(f->c->ops->poll(f->c, ids, 8), 1);
  assert_true(ids[0] == 0xFFFFFFFFFFull);
  assert_int_equal(f->c->ops->poll(f->c, ids, 8), 0);
  for (int i = 0; i < 16; i++)
    assert_int_equal(a[i], 0xA1);
  for (int i = 0; i < 32; i++)
    assert_int_equal(b[i], 0xB2);
  {
    struct lynx_actrl got;
    memcpy(&got, c, sizeof(got));
    assert_int_equal(got.tx_prod, 5);
    assert_int_equal(got.rx_cons, 0);
  }
  assert_int_equal(f->c->ops->read(f->c, f->g.actrl_off + 8, c, 8, 1), 0);
  assert_int_equal(f->c->ops->poll(f->c, ids, 1), 1);
  {
    struct lynx_actrl got;
    memcpy(&got, c, sizeof(got));
    assert_int_equal(got.rx_cons, 9);
  }

  /* a full completion queue refuses more reads until polled */
  {
    int posted = 0, rc = 0;
    while (posted < 1000 &&
           (rc = f->c->ops->read(f->c, 0, c, 4, 1000u + (unsigned)posted)) == 0)
      posted++;
    assert_int_equal(rc, -ENOBUFS);
    assert_true(posted >= 16 && posted < 1000);
    assert_int_equal(f->c->ops->poll(f->c, ids, 300), posted < 300 ? posted : 300);
    for (int i = 0; i < posted && i < 300; i++)
      assert_int_equal(ids[i], 1000 + i);
    assert_int_equal(f->c->ops->read(f->c, 0, c, 4, 77), 0);
  }
}

/* ---- notify ------------------------------------------------------------ */

struct sleeper {
  uint32_t *bell;
  uint32_t expect;
  long timeout_ms;
  volatile int ready;
  volatile pid_t tid;
  int rc, err;
  uint64_t slept_ns;
};

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void *sleeper_main(void *arg) {
  struct sleeper *s = arg;
  struct timespec ts = {s->timeout_ms / 1000, (s->timeout_ms % 1000) * 1000000};
  uint64_t t0;
  s->tid = (pid_t)syscall(SYS_gettid);
  __atomic_store_n(&s->ready, 1, __ATOMIC_SEQ_CST);
  t0 = now_ns();
  s->rc = (int)syscall(SYS_futex, s->bell, FUTEX_WAIT, s->expect, &ts, NULL, 0);
  s->err = s->rc ? errno : 0;
  s->slept_ns = now_ns() - t0;
  return NULL;
}

/* 1 once thread tid is blocked (state S), 0 after ~5 s. */
static int wait_blocked(pid_t tid) {
  char path[64], buf[256];
  snprintf(path, sizeof(path), "/proc/self/task/%d/stat", (int)tid);
  for (int i = 0; i < 5000; i++) {
    FILE *fp = fopen(path, "r");
    size_t n = 0;
    if (fp) {
      n = fread(buf, 1, sizeof(buf) - 1, fp);
      fclose(fp);
    }
    buf[n] = 0;
    {
      const char *p = strrchr(buf, ')');
      if (p && p[1] == ' ' && p[2] == 'S')
        return 1;
    }
    usleep(1000);
  }
  return 0;
}

/* Starts a thread waiting on the agent's mapping of the doorbell; the
 * frontend notifies through its own mapping of the same file. */
static void start_sleeper(struct fx *f, struct sleeper *s, pthread_t *th,
                          long timeout_ms) {
  memset(s, 0, sizeof(*s));
  s->bell = (uint32_t *)(f->r.base + LYNX_OFF_DOORBELL);
  s->expect = __atomic_load_n(s->bell, __ATOMIC_SEQ_CST);
  s->timeout_ms = timeout_ms;
  assert_int_equal(pthread_create(th, NULL, sleeper_main, s), 0);
  while (!__atomic_load_n(&s->ready, __ATOMIC_SEQ_CST))
    usleep(100);
  if (!wait_blocked(s->tid)) {
    pthread_join(*th, NULL);
    fail_msg("sleeper thread never blocked");
  }
}

static void test_notify_wakes_sleeper(void **state) {
  struct fx *f = *state;
  uint32_t *sleeping = (uint32_t *)(f->r.base + LYNX_OFF_SLEEPING);
  uint32_t *bell = (uint32_t *)(f->r.base + LYNX_OFF_DOORBELL);
  struct sleeper s;
  pthread_t th;
  connect_ok(f);
  *bell = 41;
  __atomic_store_n(sleeping, 1, __ATOMIC_SEQ_CST);
  start_sleeper(f, &s, &th, 10000);
  assert_int_equal(f->c->ops->notify(f->c), 0);
  pthread_join(th, NULL);
  /* woken (0), not timed out, well before the 10 s timeout */
  assert_int_equal(s.rc, 0);
  assert_true(s.slept_ns < 5000000000ull);
  assert_int_equal(__atomic_load_n(bell, __ATOMIC_SEQ_CST), 42);
  /* sleeping is a count of sleeping threads; any nonzero value counts */
  __atomic_store_n(sleeping, 2, __ATOMIC_SEQ_CST);
  assert_int_equal(f->c->ops->notify(f->c), 0);
  assert_int_equal(__atomic_load_n(bell, __ATOMIC_SEQ_CST), 43);
  assert_int_equal(*sleeping, 2); /* notify never writes it */
}

static void test_notify_not_sleeping(void **state) {
  struct fx *f = *state;
  uint32_t *sleeping = (uint32_t *)(f->r.base + LYNX_OFF_SLEEPING);
  uint32_t *bell = (uint32_t *)(f->r.base + LYNX_OFF_DOORBELL);
  struct sleeper s;
  pthread_t th;
  connect_ok(f);
  *bell = 7;
  __atomic_store_n(sleeping, 0, __ATOMIC_SEQ_CST);
  for (int i = 0; i < 100; i++)
    assert_int_equal(f->c->ops->notify(f->c), 0);
  assert_int_equal(__atomic_load_n(bell, __ATOMIC_SEQ_CST), 7);
  /* a waiter (that has not said it sleeps) is not woken either */
  start_sleeper(f, &s, &th, 300);
  assert_int_equal(f->c->ops->notify(f->c), 0);
  pthread_join(th, NULL);
  assert_int_equal(s.rc, -1);
  assert_int_equal(s.err, ETIMEDOUT);
  assert_int_equal(__atomic_load_n(bell, __ATOMIC_SEQ_CST), 7);
}

/* ---- free ---------------------------------------------------------------- */

static void test_region_free_removes_file(void **state) {
  struct fx *f = *state;
  struct lynx_region dup;
  char loc[LYNX_LOCATOR_MAX];
  int fd;
  snprintf(loc, sizeof(loc), "%s", f->r.locator);
  assert_true(shm_exists(loc));

  /* the same name again is refused and must not remove the first one */
  region_init_empty(&dup);
  assert_int_equal(f->ops->region_alloc(&dup, loc + 1, 4096), -EEXIST);
  f->ops->region_free(&dup);
  assert_true(shm_exists(loc));

  connect_ok(f);
  f->c->ops->close(f->c);
  f->c = NULL;
  f->ops->region_free(&f->r);
  assert_false(shm_exists(loc));
  errno = 0;
  fd = shm_open(loc, O_RDONLY, 0);
  assert_int_equal(fd, -1);
  assert_int_equal(errno, ENOENT);
  assert_null(f->r.base);
  assert_int_equal(f->r.fd, -1);
  /* freeing again (or a half-built region) is harmless */
  f->ops->region_free(&f->r);
  /* and a frontend can no longer connect */
  expect_refused(f, &f->d, -ENOENT);
}

/* ---- descriptor <-> protobuf --------------------------------------------- */

static void test_desc_pb_roundtrip(void **state) {
  struct fx *f = *state;
  Lynx__RegionDesc pb;
  struct lynx_region_desc in = f->d, out;
  char err[256];
  in.ordering = LYNX_ORDER_FENCED;
  in.key = 0x1234;
  in.remote_addr = 0xFEDCBA9876543210ull;
  lynx_desc_to_pb(&in, &pb);
  assert_int_equal(pb.ordering, LYNX__ORDERING__ORDERING_FENCED);
  assert_int_equal(lynx_desc_from_pb(&pb, &out, err, sizeof(err)), 0);
  assert_desc_equal(&in, &out);

  /* through the wire format too */
  {
    uint8_t buf[512];
    size_t n = lynx__region_desc__get_packed_size(&pb);
    Lynx__RegionDesc *back;
    assert_true(n <= sizeof(buf));
    lynx__region_desc__pack(&pb, buf);
    back = lynx__region_desc__unpack(NULL, n, buf);
    assert_non_null(back);
    memset(&out, 0, sizeof(out));
    assert_int_equal(lynx_desc_from_pb(back, &out, err, sizeof(err)), 0);
    lynx__region_desc__free_unpacked(back, NULL);
    assert_desc_equal(&in, &out);
  }

  /* invalid descriptors are refused with a reason */
  lynx_desc_to_pb(&in, &pb);
  pb.region_size += 4096;
  err[0] = 0;
  assert_int_equal(lynx_desc_from_pb(&pb, &out, err, sizeof(err)), -EINVAL);
  assert_true(strlen(err) > 0);
  lynx_desc_to_pb(&in, &pb);
  pb.slots = 6;
  assert_int_equal(lynx_desc_from_pb(&pb, &out, err, sizeof(err)), -EINVAL);
  lynx_desc_to_pb(&in, &pb);
  pb.ordering = (Lynx__Ordering)7;
  assert_int_equal(lynx_desc_from_pb(&pb, &out, err, sizeof(err)), -EINVAL);
  lynx_desc_to_pb(&in, &pb);
  pb.transport = NULL;
  assert_int_equal(lynx_desc_from_pb(&pb, &out, err, sizeof(err)), -EINVAL);
  {
    char longloc[LYNX_LOCATOR_MAX + 1];
    memset(longloc, 'a', sizeof(longloc) - 1);
    longloc[0] = '/';
    longloc[LYNX_LOCATOR_MAX] = 0;
    lynx_desc_to_pb(&in, &pb);
    pb.locator = longloc;
    assert_int_equal(lynx_desc_from_pb(&pb, &out, err, sizeof(err)), -EINVAL);
    longloc[LYNX_LOCATOR_MAX - 1] = 0; /* 127 chars fit */
    assert_int_equal(lynx_desc_from_pb(&pb, &out, err, sizeof(err)), 0);
    assert_string_equal(out.locator, longloc);
  }
}

static int run_all(int argc, char **argv) {
#define T(fn) cmocka_unit_test_setup_teardown(fn, fx_setup, fx_teardown)
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_find_and_ops),
      cmocka_unit_test(test_bounds_ok),
      T(test_alloc_format_connect),
      T(test_format_rejects),
      T(test_connect_refuses),
      T(test_connect_unformatted),
      T(test_region_validate),
      T(test_writev_read_outside_efault),
      T(test_writev_publish),
      T(test_writev_publish_einval),
      T(test_read_completions),
      T(test_notify_wakes_sleeper),
      T(test_notify_not_sleeping),
      T(test_region_free_removes_file),
      T(test_desc_pb_roundtrip),
  };
#undef T
  char probe[64];
  int fd;
  atexit(unlink_all);
  /* no POSIX shared memory here (no /dev/shm): skip rather than fail */
  new_name(probe, sizeof(probe));
  fd = shm_open(g_names[g_n_names - 1], O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    fprintf(stderr, "transport_shm: shm_open: %s; skipping\n",
            strerror(errno));
    return 77;
  }
  close(fd);
  unlink_all();
  return LYNX_UT_MAIN(argc, argv, "transport_shm", tests, NULL, NULL);
}

/* The tests run in a child; the parent removes the child's shm files
 * afterwards, so not even a crash leaves one behind (teardowns and an
 * atexit handler clean up in the child on every other path). */
int main(int argc, char **argv) {
  pid_t pid;
  int st;
  fflush(NULL);
  pid = fork();
  if (pid < 0)
    return run_all(argc, argv);
  if (pid == 0)
    exit(run_all(argc, argv));
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) {
      perror("waitpid");
      return 1;
    }
  sweep(pid);
  if (WIFEXITED(st))
    return WEXITSTATUS(st);
  fprintf(stderr, "transport_shm: test process killed by signal %d\n",
          WTERMSIG(st));
  return 128 + WTERMSIG(st);
}
