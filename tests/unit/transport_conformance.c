/*
 * transport_conformance.c - the transport conformance suite: what every
 * backend of transport/transport.h promises a frontend, written once against
 * struct lynx_transport_ops and run once per backend (ctest
 * unit_transport_conformance_{shm,tcp,rdma}; the backend is the harness
 * linked in, conformance_<backend>.c, see transport_conformance.h).
 *
 * Covered: the ops table; a formatted region's header and what connect
 * checks against it (refusals: key, epoch, geometry, ordering, header,
 * locator); bounds and access classes (writes only to fctrl and the RX
 * rings, reads only inside the region and, where a backend enforces it,
 * only of header/actrl and TX rings; overflow; PUBLISH alignment), all
 * refused before anything is posted; write ordering and PUBLISH (the
 * accelerator sees a whole request); read completions (each id once, in
 * posting order, at most max per poll, a bound on reads in flight);
 * flush; wait_fd and notify; a region freed or restarted with a new epoch;
 * fencing by frontend epoch (older refused, newer cuts the older, equal
 * admitted, the header word and the agent's counters).
 *
 * Cases never assume a backend completes early: they flush and wait for
 * completions (ut_poll_n), and see the agent's memory only after a read
 * posted behind the writes completed (settle), which the contract's
 * ordering makes sufficient. What only one backend does (shm files, tcp
 * framing and its port guard, verbs work requests on the fake NIC) is in
 * test_transport_<backend>.c.
 */
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "mqueue.h"
#include "transport.h"
#include "transport_conformance.h"
#include "ut_main.h"
#include "ut_region.h"
#include "ut_tconn.h"
#include "util.h"

#define Q TC_Q
#define S TC_S
#define Z TC_Z
#define EPOCH 0x5EED0000CAFEull
#define SETTLE_ID 0x5E771Eull

static const struct tc_backend *const B = &tc_backend;

/* ---- fixture ------------------------------------------------------------ */

struct fx {
  struct tc_region r;
  struct lynx_tconn *c;
  uint8_t *snap;
};

static int fx_setup(void **state) {
  struct fx *f = calloc(1, sizeof(*f));
  if (!f)
    return -1;
  *state = f;
  return B->region_new(&f->r, LYNX_ORDER_COALESCED, EPOCH) ? -1 : 0;
}

static int fx_teardown(void **state) {
  struct fx *f = *state;
  if (!f)
    return 0;
  ut_tconn_close(&f->c);
  B->region_free(&f->r);
  free(f->snap);
  free(f);
  *state = NULL;
  return 0;
}

static int group_setup(void **state) {
  (void)state;
  return B->start ? B->start() : 0;
}

static int group_teardown(void **state) {
  (void)state;
  if (B->stop)
    B->stop();
  return 0;
}

static void connect_ok(struct fx *f) {
  ut_connect_ok(B->connect, &f->r.d, &f->c);
}

static void expect_refused(const struct lynx_region_desc *d, int want) {
  ut_expect_refused(B->connect, d, want);
}

/* Posts a read of the header behind everything posted so far and waits
 * for it: every earlier write has then reached the region. */
static void settle(struct lynx_tconn *c) {
  uint8_t b[8];
  uint64_t id = 0;
  assert_int_equal(c->ops->read(c, 0, b, sizeof(b), SETTLE_ID), 0);
  assert_int_equal(c->ops->flush(c), 0);
  assert_int_equal(ut_poll_n(c, &id, 1), 1);
  assert_true(id == SETTLE_ID);
}

static void snapshot(struct fx *f) {
  free(f->snap);
  f->snap = malloc(f->r.g.region_size);
  assert_non_null(f->snap);
  memcpy(f->snap, f->r.mem, f->r.g.region_size);
}

static void assert_unchanged(struct fx *f) {
  assert_memory_equal(f->r.mem, f->snap, f->r.g.region_size);
}

/* Polls until the connection reports an error (or 2 s pass), keeping a
 * read in flight so that a closed connection shows. */
static int poll_error(struct lynx_tconn *c) {
  uint64_t end = lynx_now_ns() + 2000000000ull, id;
  uint8_t b[8];
  while (lynx_now_ns() < end) {
    int k;
    if (c->ops->read(c, 0, b, sizeof(b), 1) == 0 && c->ops->flush(c) < 0)
      return -ECONNRESET;
    k = c->ops->poll(c, &id, 1);
    if (k < 0)
      return k;
    usleep(1000);
  }
  return 0;
}

/* Writes data, flushes and checks it reached the region; where reads may
 * see the write class, also reads it back through the connection in the
 * same batch (the read is applied after the write). */
static void roundtrip(struct fx *f, uint64_t off, const void *data, size_t len,
                      unsigned flags) {
  uint8_t *back = malloc(len);
  struct iovec iov = {(void *)data, len};
  uint64_t id;
  assert_non_null(back);
  assert_int_equal(f->c->ops->writev(f->c, off, &iov, 1, flags), 0);
  assert_int_equal(f->c->ops->read(f->c, off, back, len, 77), 0);
  assert_int_equal(f->c->ops->flush(f->c), 0);
  assert_int_equal(ut_poll_n(f->c, &id, 1), 1);
  assert_int_equal(id, 77);
  assert_memory_equal(back, data, len);
  settle(f->c);
  assert_memory_equal(f->r.mem + off, data, len);
  free(back);
}

/* ---- the ops table ------------------------------------------------------ */

static void tc_find_and_ops(void **state) {
  const struct lynx_transport_ops *o = lynx_transport_find(B->name);
  char upper[16];
  size_t i;
  (void)state;
  assert_ptr_equal(o, B->ops);
  assert_string_equal(o->name, B->name);
  assert_null(lynx_transport_find("tcp-nope"));
  assert_null(lynx_transport_find(""));
  for (i = 0; B->name[i] && i < sizeof(upper) - 1; i++)
    upper[i] = (char)(B->name[i] - 'a' + 'A');
  upper[i] = 0;
  assert_null(lynx_transport_find(upper));
  /* no member is ever NULL */
  assert_non_null(o->agent_create);
  assert_non_null(o->agent_destroy);
  assert_non_null(o->region_alloc);
  assert_non_null(o->region_attach);
  assert_non_null(o->region_export);
  assert_non_null(o->region_free);
  assert_non_null(o->connect);
  assert_non_null(o->writev);
  assert_non_null(o->read);
  assert_non_null(o->flush);
  assert_non_null(o->poll);
  assert_non_null(o->wait_fd);
  assert_non_null(o->notify);
  assert_non_null(o->arm);
  assert_non_null(o->close);
}

/* ---- a region and a connection to it ------------------------------------ */

static void tc_format_connect(void **state) {
  struct fx *f = *state;
  const struct lynx_region_hdr *h = (const void *)f->r.mem;
  const struct lynx_geom *g = &f->r.g;
  uint8_t buf[64];
  uint64_t id = 0;

  /* the header, as docs/mqueue.md lays it out */
  assert_int_equal(h->magic, LYNX_REGION_MAGIC);
  assert_memory_equal(f->r.mem, "LYNX", 4);
  assert_int_equal(h->layout_version, LYNX_LAYOUT_VERSION);
  assert_int_equal(h->ordering, LYNX_ORDER_COALESCED);
  assert_true(h->epoch == EPOCH);
  assert_int_equal(h->region_size, g->region_size);
  assert_int_equal(h->n_mqueues, Q);
  assert_int_equal(h->slot_size, Z);
  assert_int_equal(h->slots, S);
  assert_int_equal(h->accel_id, TC_ACCEL);
  assert_int_equal(h->actrl_off, g->actrl_off);
  assert_int_equal(h->fctrl_off, g->fctrl_off);
  assert_int_equal(h->rings_off, g->rings_off);
  assert_int_equal(h->flags, 0); /* the accelerator sets its own flags */
  /* the rest of the region starts zeroed */
  for (uint64_t i = sizeof(*h); i < g->region_size; i++)
    if (f->r.mem[i])
      fail_msg("byte %llu not zero", (unsigned long long)i);
  assert_string_equal(f->r.d.transport, B->name);

  connect_ok(f);
  assert_ptr_equal(f->c->ops, B->ops);
  ut_assert_desc_equal(&f->c->desc, &f->r.d);

  /* the frontend's write shows up in the agent's memory ... */
  {
    const char msg[] = "frontend was here";
    struct iovec iov = {(void *)msg, sizeof(msg)};
    uint64_t off = lynx_rx_ring_off(g, 1) + 3 * Z;
    assert_int_equal(f->c->ops->writev(f->c, off, &iov, 1, 0), 0);
    assert_int_equal(f->c->ops->flush(f->c), 0);
    settle(f->c);
    assert_memory_equal(f->r.mem + off, msg, sizeof(msg));
  }
  /* ... and the agent's data in the frontend's reads */
  memcpy(f->r.mem + lynx_tx_ring_off(g, 0), "accelerator says hi", 20);
  assert_int_equal(f->c->ops->read(f->c, lynx_tx_ring_off(g, 0), buf, 20, 7),
                   0);
  assert_int_equal(f->c->ops->flush(f->c), 0);
  assert_int_equal(ut_poll_n(f->c, &id, 1), 1);
  assert_int_equal(id, 7);
  assert_memory_equal(buf, "accelerator says hi", 20);
  /* the header read through the connection */
  assert_int_equal(f->c->ops->read(f->c, 0, buf, 64, 8), 0);
  assert_int_equal(f->c->ops->flush(f->c), 0);
  assert_int_equal(ut_poll_n(f->c, &id, 1), 1);
  assert_int_equal(id, 8);
  assert_memory_equal(buf, f->r.mem, 64);

  /* closing the connection leaves the region with its agent */
  ut_tconn_close(&f->c);
  assert_int_equal(h->magic, LYNX_REGION_MAGIC);
  connect_ok(f);
}

static void tc_write_read_roundtrip(void **state) {
  struct fx *f = *state;
  uint8_t payload[200];
  for (size_t i = 0; i < sizeof(payload); i++)
    payload[i] = (uint8_t)(i * 7 + 1);
  connect_ok(f);
  roundtrip(f, lynx_rx_ring_off(&f->r.g, 1) + Z - sizeof(payload), payload,
            sizeof(payload), LYNX_WR_PUBLISH);
  roundtrip(f, lynx_fctrl_off(&f->r.g, 1), "\x05\0\0\0", 4, LYNX_WR_PUBLISH);
  assert_int_equal(
      ((struct lynx_fctrl *)(f->r.mem + lynx_fctrl_off(&f->r.g, 1)))->tx_cons,
      5);
}

/* ---- refused connects ---------------------------------------------------- */

/* The descriptor of f's region with another geometry q x sl x z of the
 * same size: the header disagrees, connect refuses it. */
static void expect_refused_geometry(struct fx *f, uint32_t q, uint32_t sl,
                                    uint32_t z) {
  struct lynx_geom g2;
  struct lynx_region_desc d = f->r.d;
  assert_int_equal(lynx_geom_init(&g2, q, sl, z, 0), 0);
  assert_int_equal(g2.region_size, f->r.g.region_size);
  d.n_mqueues = q;
  d.slots = sl;
  d.slot_size = z;
  expect_refused(&d, -EPROTO);
}

static void tc_connect_refusals(void **state) {
  struct fx *f = *state;
  struct lynx_region_hdr *h = (struct lynx_region_hdr *)f->r.mem;
  struct lynx_region_desc d;

  if (B->caps & TC_CAP_KEY) {
    d = f->r.d;
    d.key ^= 1; /* not this region's key: a stale or forged descriptor */
    expect_refused(&d, B->err.wrong_key);
  }
  /* wrong epoch (a stale descriptor) */
  d = f->r.d;
  d.epoch = EPOCH + 1;
  expect_refused(&d, B->err.stale_epoch);
  /* a size that does not match the geometry, either way */
  d = f->r.d;
  d.region_size += 4096;
  expect_refused(&d, B->err.bad_desc);
  d = f->r.d;
  d.region_size -= 4096;
  expect_refused(&d, B->err.bad_desc);
  d = f->r.d;
  d.slot_size = 512;
  expect_refused(&d, B->err.bad_desc);
  /* another geometry of the same size: 1 x 16 x 256, 2 x 16 x 128 */
  expect_refused_geometry(f, 1, 16, 256);
  expect_refused_geometry(f, 2, 16, 128);
  /* wrong ordering: the header says coalesced */
  d = f->r.d;
  d.ordering = LYNX_ORDER_FENCED;
  expect_refused(&d, -EPROTO);
  /* a locator that is none of this backend's */
  d = f->r.d;
  snprintf(d.locator, sizeof(d.locator), "not-an-address");
  expect_refused(&d, -EINVAL);

  /* the header itself is checked: version, magic, offsets */
  h->layout_version = LYNX_LAYOUT_VERSION + 1;
  expect_refused(&f->r.d, -EPROTO);
  h->layout_version = LYNX_LAYOUT_VERSION;
  h->magic = 0x584E594D;
  expect_refused(&f->r.d, -EPROTO);
  h->magic = LYNX_REGION_MAGIC;
  h->rings_off += 4096;
  expect_refused(&f->r.d, -EPROTO);
  h->rings_off -= 4096;
  /* and with everything restored it connects */
  connect_ok(f);
}

/* ---- bounds and access classes ------------------------------------------ */

/* Everything outside the region is refused with -EFAULT before it is
 * posted, including sums of iovec lengths that wrap around 2^64; refused
 * reads complete nothing and leave dst alone. */
static void tc_outside_region_efault(void **state) {
  struct fx *f = *state;
  const uint64_t size = f->r.g.region_size;
  uint8_t src[64], dst[64];
  uint64_t ids[4];
  struct iovec one = {src, 4};
  struct iovec two[2] = {{src, 32}, {src + 32, 32}};
  struct iovec big[2] = {{src, 64}, {NULL, 0}};
  struct iovec all = {src, sizeof(src)};
  memset(src, 0xEE, sizeof(src));
  memset(f->r.mem + size - 64, 0x11, 64);
  connect_ok(f);
  snapshot(f);

  /* writes that end past the region */
  assert_int_equal(f->c->ops->writev(f->c, size, &one, 1, 0), -EFAULT);
  assert_int_equal(f->c->ops->writev(f->c, size - 3, &one, 1, 0), -EFAULT);
  assert_int_equal(f->c->ops->writev(f->c, size - 32, &all, 1, 0), -EFAULT);
  assert_int_equal(f->c->ops->writev(f->c, size - 63, two, 2, 0), -EFAULT);
  assert_int_equal(f->c->ops->writev(f->c, size - 60, two, 2, LYNX_WR_PUBLISH),
                   -EFAULT);
  assert_int_equal(f->c->ops->writev(f->c, size + 4096, &one, 1, 0), -EFAULT);
  /* offsets that would wrap around */
  assert_int_equal(f->c->ops->writev(f->c, UINT64_MAX, &one, 1, 0), -EFAULT);
  assert_int_equal(f->c->ops->writev(f->c, UINT64_MAX - 1, &one, 1, 0),
                   -EFAULT);
  assert_int_equal(f->c->ops->writev(f->c, UINT64_MAX - 8, &all, 1, 0),
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

  /* reads likewise, and they complete nothing */
  memset(dst, 0xAB, sizeof(dst));
  assert_int_equal(f->c->ops->read(f->c, size - 63, dst, 64, 1), -EFAULT);
  assert_int_equal(f->c->ops->read(f->c, size - 32, dst, 64, 1), -EFAULT);
  assert_int_equal(f->c->ops->read(f->c, size, dst, 1, 2), -EFAULT);
  assert_int_equal(f->c->ops->read(f->c, UINT64_MAX, dst, 2, 3), -EFAULT);
  assert_int_equal(f->c->ops->read(f->c, 1, dst, (size_t)size, 4), -EFAULT);
  for (size_t i = 0; i < sizeof(dst); i++)
    assert_int_equal(dst[i], 0xAB);
  /* nothing was posted: a flush and a poll find nothing */
  assert_int_equal(f->c->ops->flush(f->c), 0);
  assert_int_equal(f->c->ops->poll(f->c, ids, 4), 0);
  settle(f->c);
  assert_unchanged(f);

  /* right at the end is inside */
  assert_int_equal(f->c->ops->read(f->c, size - 64, dst, 64, 5), 0);
  assert_int_equal(f->c->ops->flush(f->c), 0);
  assert_int_equal(ut_poll_n(f->c, ids, 1), 1);
  assert_int_equal(ids[0], 5);
  for (size_t i = 0; i < sizeof(dst); i++)
    assert_int_equal(dst[i], 0x11);
  assert_int_equal(f->c->ops->poll(f->c, ids, 4), 0);
}

/* Writes go only where a frontend writes (fctrl, RX rings): the header,
 * actrl and the TX rings are refused even inside the region, and so is a
 * write straddling two classes. Reads outside header/actrl and the TX
 * rings are refused where the backend enforces read classes. */
static void tc_access_classes(void **state) {
  struct fx *f = *state;
  const struct lynx_geom *g = &f->r.g;
  uint8_t src[64], b[64] = {0};
  struct iovec two[2] = {{src, 32}, {src + 32, 32}};
  struct iovec iov = {b, 8};
  struct iovec big[2] = {{b, UINT64_MAX / 2 + 2}, {b, UINT64_MAX / 2 + 2}};
  uint64_t rx = lynx_rx_ring_off(g, 0), tx = lynx_tx_ring_off(g, 0);
  uint64_t end = g->region_size, ids[4];
  uint64_t rx_end = g->rings_off + (uint64_t)Q * S * Z;
  const struct lynx_transport_ops *o;
  memset(src, 0xEE, sizeof(src));
  connect_ok(f);
  o = f->c->ops;
  snapshot(f);

  assert_int_equal(o->writev(f->c, end - 64, two, 2, LYNX_WR_PUBLISH), -EFAULT);
  assert_int_equal(o->writev(f->c, 0, two, 2, 0), -EFAULT); /* header */
  assert_int_equal(o->writev(f->c, 0, &iov, 1, 0), -EFAULT);
  assert_int_equal(o->writev(f->c, g->actrl_off, &iov, 1, 0), -EFAULT);
  assert_int_equal(o->writev(f->c, g->fctrl_off - 4, two, 2, 0),
                   -EFAULT); /* straddles actrl and fctrl */
  assert_int_equal(o->writev(f->c, g->fctrl_off - 4, &iov, 1, 0), -EFAULT);
  assert_int_equal(o->writev(f->c, tx, &iov, 1, 0), -EFAULT);
  assert_int_equal(o->writev(f->c, lynx_slot_off(g, tx, 0), &iov, 1, 0),
                   -EFAULT);
  assert_int_equal(o->writev(f->c, tx - 4, &iov, 1, 0), -EFAULT); /* RX|TX */
  assert_int_equal(o->writev(f->c, end - 4, &iov, 1, 0), -EFAULT);
  assert_int_equal(o->writev(f->c, UINT64_MAX - 3, &iov, 1, 0), -EFAULT);
  assert_int_equal(o->writev(f->c, rx, big, 2, 0), -EFAULT); /* wrap */
  /* reads past the end, whatever the classes */
  assert_int_equal(o->read(f->c, end - 4, b, 8, 1), -EFAULT);
  assert_int_equal(o->read(f->c, UINT64_MAX - 3, b, 8, 1), -EFAULT);
  assert_int_equal(o->read(f->c, 4, b, UINT64_MAX - 2, 1), -EFAULT);
  assert_int_equal(o->flush(f->c), 0);
  assert_int_equal(o->poll(f->c, ids, 4), 0);
  settle(f->c);
  assert_unchanged(f);

  /* and the edges that are legal pass */
  assert_int_equal(o->writev(f->c, rx_end - 64, two, 2, LYNX_WR_PUBLISH), 0);
  assert_int_equal(o->writev(f->c, rx_end - 32, two, 2, 0),
                   -EFAULT); /* straddles RX and TX rings */
  settle(f->c);
  assert_memory_equal(f->r.mem + rx_end - 64, src, 64);
  assert_int_equal(o->writev(f->c, tx - 8, &iov, 1, LYNX_WR_PUBLISH), 0);
  assert_int_equal(o->read(f->c, end - 8, b, 8, 2), 0);
  assert_int_equal(o->read(f->c, g->fctrl_off - 8, b, 8, 3), 0);
  /* every class is readable: a frontend reads what it writes too (the
   * RX rings, fctrl; a takeover resumes after published requests) */
  assert_int_equal(o->read(f->c, tx - 8, b, 8, 4), 0);
  assert_int_equal(o->read(f->c, rx_end - 64, b + 8, 8, 5), 0);
  assert_int_equal(o->flush(f->c), 0);
  assert_int_equal(ut_poll_n(f->c, ids, 4), 4);
  assert_true(ids[0] == 2 && ids[1] == 3 && ids[2] == 4 && ids[3] == 5);
  assert_memory_equal(f->r.mem + tx - 8, b, 8);
  assert_memory_equal(f->r.mem + rx_end - 64, b + 8, 8);
  /* an empty gather write inside fctrl is fine */
  assert_int_equal(o->writev(f->c, g->fctrl_off + 8, &big[0], 0, 0), 0);
  settle(f->c);
}

/* ---- writes and PUBLISH -------------------------------------------------- */

/* A request written the way the frontend writes it (payload, pad, then
 * metadata split so that the published word straddles two iovecs) reaches
 * the accelerator's ring code whole. */
static void tc_publish_request(void **state) {
  struct fx *f = *state;
  const struct lynx_geom *g = &f->r.g;
  const char payload[] = "sockperf-ping";
  const uint32_t len = (uint32_t)sizeof(payload);
  const uint32_t poff = lynx_payload_off(Z, len);
  uint8_t pad[16] = {0};
  struct lynx_slot_meta meta;
  uint64_t slot = lynx_slot_off(g, lynx_rx_ring_off(g, 1), 0);
  struct lynx_mq mq;
  struct lynx_msg m;
  struct iovec iov[4];

  connect_ok(f);
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

  lynx_mq_bind(&mq, f->r.mem, g, 1);
  assert_int_equal(lynx_mq_recv(&mq, &m), -EAGAIN);
  assert_int_equal(
      f->c->ops->writev(f->c, slot + poff, iov, 4, LYNX_WR_PUBLISH), 0);
  assert_int_equal(f->c->ops->flush(f->c), 0);
  settle(f->c);
  assert_memory_equal(f->r.mem + slot + poff, payload, len);
  assert_memory_equal(f->r.mem + slot + Z - 16, &meta, 16);
  assert_int_equal(*(uint32_t *)(f->r.mem + slot + Z - 4), 1);
  /* the accelerator side receives it from its own memory */
  assert_int_equal(lynx_mq_recv(&mq, &m), 0);
  assert_int_equal(m.tag, 0xC0FFEE01u);
  assert_int_equal(m.len, len);
  assert_memory_equal(m.data, payload, len);

  /* the published word alone */
  {
    uint32_t w = 0xA5A5A5A5u;
    struct iovec wi = {&w, 4};
    assert_int_equal(f->c->ops->writev(f->c, 4096, &wi, 1, LYNX_WR_PUBLISH), 0);
    settle(f->c);
    assert_int_equal(*(uint32_t *)(f->r.mem + 4096), 0xA5A5A5A5u);
  }
  /* the last word split in four one-byte iovecs */
  {
    uint8_t b[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    struct iovec bi[5] = {
        {b, 4}, {b + 4, 1}, {b + 5, 1}, {b + 6, 1}, {b + 7, 1}};
    assert_int_equal(f->c->ops->writev(f->c, 6144, bi, 5, LYNX_WR_PUBLISH), 0);
    settle(f->c);
    assert_memory_equal(f->r.mem + 6144, b, 8);
  }
}

/* A request in, through the accelerator's ring code, and its response
 * back through a read of the TX ring. */
static void tc_request_response(void **state) {
  struct fx *f = *state;
  const struct lynx_geom *g = &f->r.g;
  struct lynx_mq mq;
  struct lynx_msg m = {0};
  const char req[] = "what is the answer";
  uint32_t len = sizeof(req);
  uint32_t poff = lynx_payload_off(Z, len);
  struct lynx_slot_meta meta = {len, 0xABCD0001u, LYNX_ST_OK,
                                (uint16_t)(poff / 16u), lynx_seq_for(0)};
  static const uint8_t zeros[Z];
  struct iovec iov[3] = {{(void *)req, len},
                         {(void *)zeros, lynx_slot_cap(Z) - poff - len},
                         {&meta, sizeof(meta)}};
  uint8_t slot[Z];
  struct lynx_slot_meta got;
  uint64_t id;
  connect_ok(f);
  assert_int_equal(f->c->ops->writev(f->c, lynx_rx_ring_off(g, 0) + poff, iov,
                                     3, LYNX_WR_PUBLISH),
                   0);
  assert_int_equal(f->c->ops->flush(f->c), 0);
  lynx_mq_bind(&mq, f->r.mem, g, 0);
  {
    uint64_t end = lynx_now_ns() + 2000000000ull;
    int rc;
    while ((rc = lynx_mq_recv(&mq, &m)) == -EAGAIN && lynx_now_ns() < end)
      usleep(100);
    assert_int_equal(rc, 0);
  }
  assert_int_equal(m.tag, 0xABCD0001u);
  assert_int_equal(m.len, len);
  assert_memory_equal(m.data, req, len);
  {
    uint8_t *out = NULL;
    assert_int_equal(lynx_mq_reserve(&mq, 2, &out), 0);
    memcpy(out, "42", 2);
    lynx_mq_commit(&mq, m.tag, 2, 2, LYNX_ST_OK);
  }
  lynx_mq_release(&mq);
  assert_int_equal(f->c->ops->read(f->c, lynx_tx_ring_off(g, 0), slot, Z, 5),
                   0);
  assert_int_equal(f->c->ops->flush(f->c), 0);
  assert_int_equal(ut_poll_n(f->c, &id, 1), 1);
  assert_int_equal(id, 5);
  memcpy(&got, slot + Z - LYNX_META_SIZE, sizeof(got));
  assert_int_equal(got.seq, lynx_seq_for(0));
  assert_int_equal(got.tag, 0xABCD0001u);
  assert_int_equal(got.len, 2);
  assert_memory_equal(slot + got.off16 * 16u, "42", 2);
}

static void tc_publish_einval(void **state) {
  struct fx *f = *state;
  uint8_t b[16];
  struct iovec iov = {b, 7};
  memset(b, 0x77, sizeof(b));
  connect_ok(f);
  snapshot(f);
  /* end not 4-aligned */
  assert_int_equal(f->c->ops->writev(f->c, 4096, &iov, 1, LYNX_WR_PUBLISH),
                   -EINVAL);
  assert_int_equal(f->c->ops->writev(f->c, lynx_rx_ring_off(&f->r.g, 0), &iov,
                                     1, LYNX_WR_PUBLISH),
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
  iov.iov_len = 3;
  assert_int_equal(f->c->ops->writev(f->c, lynx_rx_ring_off(&f->r.g, 0), &iov,
                                     1, LYNX_WR_PUBLISH),
                   -EINVAL);
  iov.iov_len = 0;
  assert_int_equal(f->c->ops->writev(f->c, 4096, &iov, 1, LYNX_WR_PUBLISH),
                   -EINVAL);
  settle(f->c);
  assert_unchanged(f);
  /* without PUBLISH the same unaligned writes are fine */
  iov.iov_len = 7;
  assert_int_equal(f->c->ops->writev(f->c, 4097, &iov, 1, 0), 0);
  settle(f->c);
  assert_memory_equal(f->r.mem + 4097, b, 7);
  /* 4-aligned end, unaligned start: fine with PUBLISH */
  iov.iov_len = 7;
  assert_int_equal(f->c->ops->writev(f->c, 4097 + 16, &iov, 1, LYNX_WR_PUBLISH),
                   0);
  settle(f->c);
  assert_memory_equal(f->r.mem + 4097 + 16, b, 7);
}

/* ---- reads, completions, flush ------------------------------------------- */

static void tc_read_completions(void **state) {
  struct fx *f = *state;
  const struct lynx_geom *g = &f->r.g;
  uint8_t a[16], b[32], c[8];
  uint64_t ids[300];
  uint64_t off_a = lynx_tx_ring_off(g, 0), off_b = off_a + Z;
  struct lynx_actrl *ac = (struct lynx_actrl *)(f->r.mem + g->actrl_off);
  connect_ok(f);
  memset(f->r.mem + off_a, 0xA1, 16);
  memset(f->r.mem + off_b, 0xB2, 32);
  ac[0].tx_prod = 5;
  ac[1].rx_cons = 9;

  assert_int_equal(f->c->ops->poll(f->c, ids, 8), 0);
  assert_int_equal(f->c->ops->read(f->c, off_a, a, sizeof(a), 11), 0);
  assert_int_equal(f->c->ops->read(f->c, off_b, b, sizeof(b), 22), 0);
  assert_int_equal(
      f->c->ops->read(f->c, g->actrl_off, c, sizeof(c), 0xFFFFFFFFFFull), 0);
  assert_int_equal(f->c->ops->flush(f->c), 0);
  /* reported in posting order, each once, at most max at a time */
  assert_int_equal(ut_poll_n(f->c, ids, 2), 2);
  assert_int_equal(ids[0], 11);
  assert_int_equal(ids[1], 22);
  assert_int_equal(ut_poll_n(f->c, ids, 1), 1);
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
  assert_int_equal(f->c->ops->read(f->c, g->actrl_off + 8, c, 8, 1), 0);
  assert_int_equal(f->c->ops->flush(f->c), 0);
  assert_int_equal(ut_poll_n(f->c, ids, 1), 1);
  {
    struct lynx_actrl got;
    memcpy(&got, c, sizeof(got));
    assert_int_equal(got.rx_cons, 9);
  }

  /* reads in flight are bounded: a full completion queue refuses more
   * reads until polled */
  {
    int posted = 0, rc = 0, want;
    while (posted < B->reads_max &&
           (rc = f->c->ops->read(f->c, 0, c, 4, 1000u + (unsigned)posted)) == 0)
      posted++;
    assert_int_equal(rc, -ENOBUFS);
    assert_true(posted >= 16 && posted < B->reads_max);
    want = posted < 300 ? posted : 300;
    assert_int_equal(f->c->ops->flush(f->c), 0);
    assert_int_equal(ut_poll_n(f->c, ids, want), want);
    for (int i = 0; i < want; i++)
      assert_int_equal(ids[i], 1000 + i);
    assert_int_equal(f->c->ops->read(f->c, 0, c, 4, 77), 0);
  }
}

/* Many operations posted before one flush, reads interleaved with writes:
 * completions come in posting order, every read sees the writes posted
 * before it (where it may read them back), and a read of every TX ring at
 * once arrives whole. */
static void tc_pipelined_batches(void **state) {
  struct fx *f = *state;
  const struct lynx_geom *g = &f->r.g;
  enum { N = 64 };
  uint32_t vals[N], seen[N];
  uint64_t ids[N + 1];
  uint8_t *big = malloc(g->ring_bytes * Q);
  uint64_t off = lynx_fctrl_off(g, 0);
  assert_non_null(big);
  connect_ok(f);
  memset(f->r.mem + lynx_tx_ring_off(g, 0), 0x3C, g->ring_bytes * Q);
  for (int i = 0; i < N; i++) {
    struct iovec iov = {&vals[i], 4};
    vals[i] = 1000u + (uint32_t)i;
    assert_int_equal(f->c->ops->writev(f->c, off, &iov, 1, LYNX_WR_PUBLISH), 0);
    assert_int_equal(f->c->ops->read(f->c, off, &seen[i], 4, (uint64_t)i), 0);
  }
  /* the whole TX area in one read */
  assert_int_equal(f->c->ops->read(f->c, lynx_tx_ring_off(g, 0), big,
                                   g->ring_bytes * Q, 999),
                   0);
  assert_int_equal(f->c->ops->flush(f->c), 0);
  assert_int_equal(ut_poll_n(f->c, ids, N + 1), N + 1);
  for (int i = 0; i < N; i++) {
    assert_int_equal(ids[i], (uint64_t)i);
    assert_int_equal(seen[i], 1000u + (uint32_t)i);
  }
  assert_int_equal(ids[N], 999);
  for (size_t i = 0; i < g->ring_bytes * Q; i++)
    assert_int_equal(big[i], 0x3C);
  assert_int_equal(*(uint32_t *)(f->r.mem + off), 1000u + N - 1);
  free(big);
}

/* A flush with nothing posted rings nothing and completes nothing, as
 * often as it is called. */
static void tc_flush_empty(void **state) {
  struct fx *f = *state;
  uint64_t ids[2];
  connect_ok(f);
  for (int i = 0; i < 3; i++)
    assert_int_equal(f->c->ops->flush(f->c), 0);
  assert_int_equal(f->c->ops->poll(f->c, ids, 2), 0);
  settle(f->c);
  assert_int_equal(f->c->ops->flush(f->c), 0);
  assert_int_equal(f->c->ops->poll(f->c, ids, 2), 0);
}

/* wait_fd turns readable once a completion waits, where a backend has
 * one; -ENOTSUP where completions need no system call. */
static void tc_wait_fd(void **state) {
  struct fx *f = *state;
  uint8_t b[8];
  uint64_t id;
  int fd;
  connect_ok(f);
  fd = f->c->ops->wait_fd(f->c);
  if (!(B->caps & TC_CAP_WAIT_FD)) {
    assert_int_equal(fd, -ENOTSUP);
    return;
  }
  assert_true(fd >= 0);
  assert_int_equal(f->c->ops->read(f->c, 0, b, sizeof(b), 31), 0);
  assert_int_equal(f->c->ops->flush(f->c), 0);
  {
    struct pollfd p = {fd, POLLIN, 0};
    assert_int_equal(poll(&p, 1, 2000), 1);
    assert_true(p.revents & POLLIN);
  }
  assert_int_equal(ut_poll_n(f->c, &id, 1), 1);
  assert_int_equal(id, 31);
}

/* ---- notify -------------------------------------------------------------- */

/* A CPU accelerator that said it sleeps is woken (its doorbell moves)
 * after a write and a notify. */
static void tc_notify_wakes_sleeping(void **state) {
  struct fx *f = *state;
  uint32_t *sleeping = (uint32_t *)(f->r.mem + LYNX_OFF_SLEEPING);
  uint32_t *bell = (uint32_t *)(f->r.mem + LYNX_OFF_DOORBELL);
  uint32_t v = 1, before;
  struct iovec iov = {&v, 4};
  uint64_t end;
  connect_ok(f);
  __atomic_store_n(sleeping, 1, __ATOMIC_SEQ_CST);
  before = __atomic_load_n(bell, __ATOMIC_SEQ_CST);
  assert_int_equal(f->c->ops->writev(f->c, lynx_fctrl_off(&f->r.g, 0), &iov, 1,
                                     LYNX_WR_PUBLISH),
                   0);
  assert_int_equal(f->c->ops->flush(f->c), 0);
  assert_int_equal(f->c->ops->notify(f->c), 0);
  end = lynx_now_ns() + 2000000000ull;
  while (__atomic_load_n(bell, __ATOMIC_SEQ_CST) == before &&
         lynx_now_ns() < end)
    usleep(100);
  assert_int_not_equal(__atomic_load_n(bell, __ATOMIC_SEQ_CST), before);
  assert_int_equal(*sleeping, 1); /* nobody but the accelerator writes it */
}

/* An accelerator that does not sleep is left alone: its doorbell stays. */
static void tc_notify_quiet_when_awake(void **state) {
  struct fx *f = *state;
  uint32_t *sleeping = (uint32_t *)(f->r.mem + LYNX_OFF_SLEEPING);
  uint32_t *bell = (uint32_t *)(f->r.mem + LYNX_OFF_DOORBELL);
  uint32_t v = 1;
  struct iovec iov = {&v, 4};
  *bell = 7;
  __atomic_store_n(sleeping, 0, __ATOMIC_SEQ_CST);
  connect_ok(f);
  for (int i = 0; i < 100; i++) {
    assert_int_equal(f->c->ops->writev(f->c, lynx_fctrl_off(&f->r.g, 0), &iov,
                                       1, LYNX_WR_PUBLISH),
                     0);
    assert_int_equal(f->c->ops->notify(f->c), 0);
  }
  settle(f->c);
  assert_int_equal(__atomic_load_n(bell, __ATOMIC_SEQ_CST), 7);
}

/* A region whose header does not say its accelerator rings response
 * doorbells (as formatted: the CPU accelerator sets the flag itself) is
 * never armed, under any backend, and its waiter words stay untouched. */
static void tc_arm_needs_ringing_accel(void **state) {
  struct fx *f = *state;
  struct lynx_arm a = {0, 0};
  const struct lynx_fctrl *fc =
      (const struct lynx_fctrl *)(f->r.mem + lynx_fctrl_off(&f->r.g, 0));
  connect_ok(f);
  assert_int_equal(f->c->ops->arm(f->c, 0xb311, &a, 1), -ENOTSUP);
  assert_int_equal(f->c->ops->arm(f->c, 0, &a, 1), -ENOTSUP);
  settle(f->c);
  assert_int_equal(__atomic_load_n(&fc->waiter, __ATOMIC_SEQ_CST), 0);
}

/* ---- the region goes away ------------------------------------------------ */

/* Freeing the region (instance stopped): a live frontend sees an error,
 * not silence, where the backend can tell it; a new connect is refused. */
static void tc_region_free(void **state) {
  struct fx *f = *state;
  connect_ok(f);
  B->region_free(&f->r);
  if (B->caps & TC_CAP_FREE_DROPS)
    assert_int_equal(poll_error(f->c), -ECONNRESET);
  expect_refused(&f->r.d, B->err.gone);
  /* freeing again (or a half-built region) is harmless */
  B->region_free(&f->r);
}

/* The agent restarts the region with a new epoch: a descriptor of the old
 * epoch is refused, the new one connects and works. */
static void tc_epoch_renew(void **state) {
  struct fx *f = *state;
  struct lynx_region_desc old = f->r.d;
  struct lynx_tconn *oldc;
  connect_ok(f);
  oldc = f->c;
  f->c = NULL;
  assert_int_equal(B->region_renew(&f->r, EPOCH + 1), 0);
  assert_true(f->r.d.epoch == EPOCH + 1);
  assert_true(((struct lynx_region_hdr *)f->r.mem)->epoch == EPOCH + 1);
  assert_string_equal(f->r.d.locator, old.locator);
  expect_refused(&old, B->err.stale_epoch);
  if (B->caps & TC_CAP_FREE_DROPS)
    assert_int_equal(poll_error(oldc), -ECONNRESET);
  oldc->ops->close(oldc);
  connect_ok(f);
  roundtrip(f, lynx_rx_ring_off(&f->r.g, 0), "new epoch", 10, 0);
}

/* ---- fencing by frontend epoch ------------------------------------------ */

/* The agent's counters reach what a case expects (a close reaches tcp's
 * serving thread a little later); what a backend does not count is not
 * checked. The header word holds the fence on every backend. */
static void fence_expect(struct fx *f, uint64_t fence, uint64_t producers,
                         uint64_t refused, uint64_t cut) {
  uint64_t end = lynx_now_ns() + 2000000000ull;
  struct lynx_fence_stats s;
  for (;;) {
    B->fence_stats(&f->r, &s);
    if (!(B->caps & TC_CAP_FENCE_PRODUCERS) || s.producers == producers ||
        lynx_now_ns() > end)
      break;
    usleep(1000);
  }
  assert_true(s.fence == fence);
  assert_true(__atomic_load_n((uint64_t *)(f->r.mem + LYNX_OFF_FENCE),
                              __ATOMIC_ACQUIRE) == fence);
  if (B->caps & TC_CAP_FENCE_PRODUCERS)
    assert_true(s.producers == producers);
  if (B->caps & TC_CAP_FENCE_COUNTS) {
    assert_true(s.refused == refused);
    assert_true(s.cut == cut);
  }
}

/* What a connection's next producing ops return: a publishing write to
 * fctrl, a read behind it, flush and poll; the first error, or 0. */
static int produce_error(struct fx *f, struct lynx_tconn *c) {
  uint32_t v = 0xFE;
  struct iovec iov = {&v, sizeof(v)};
  uint64_t end = lynx_now_ns() + 2000000000ull, id;
  uint8_t b[8];
  int rc =
      c->ops->writev(c, lynx_fctrl_off(&f->r.g, 0), &iov, 1, LYNX_WR_PUBLISH);
  if (!rc)
    rc = c->ops->read(c, 0, b, sizeof(b), 1);
  if (!rc)
    rc = c->ops->flush(c);
  while (!rc && lynx_now_ns() < end) {
    int k = c->ops->poll(c, &id, 1);
    if (k < 0)
      return k;
    usleep(1000);
  }
  return rc;
}

static void connect_as(const struct fx *f, uint64_t producer,
                       struct lynx_tconn **c) {
  struct lynx_region_desc d = f->r.d;
  d.producer = producer;
  ut_connect_ok(B->connect, &d, c);
}

static void refused_as(const struct fx *f, uint64_t producer) {
  struct lynx_region_desc d = f->r.d;
  d.producer = producer;
  expect_refused(&d, B->err.fenced);
}

/* Epoch 5, then 7 takes over: 5's connection is cut (and what it writes
 * after lands nowhere), 5 is refused from then on, a second 7 (another
 * worker) is admitted and the new frontend works. */
static void tc_fence_takeover(void **state) {
  struct fx *f = *state;
  const struct lynx_fctrl *fc =
      (const struct lynx_fctrl *)(f->r.mem + lynx_fctrl_off(&f->r.g, 0));
  struct lynx_tconn *old, *second;
  connect_as(f, 5, &old);
  fence_expect(f, 5, 1, 0, 0);
  connect_as(f, 7, &f->c);
  fence_expect(f, 7, 1, 0, 1);
  assert_int_equal(produce_error(f, old), B->err.cut);
  assert_int_equal(__atomic_load_n(&fc->tx_cons, __ATOMIC_ACQUIRE), 0);
  old->ops->close(old);
  refused_as(f, 5);
  fence_expect(f, 7, 1, 1, 1);
  connect_as(f, 7, &second);
  fence_expect(f, 7, 2, 1, 1);
  roundtrip(f, lynx_rx_ring_off(&f->r.g, 0), "epoch 7", 8, 0);
  second->ops->close(second);
  fence_expect(f, 7, 1, 1, 1);
  refused_as(f, 6);
  fence_expect(f, 7, 1, 2, 1);
}

/* Publishes a request the way the frontend does at RX ring position pos
 * of mqueue q (one posted write, payload to published word): writev's
 * return. */
static int publish_at(struct fx *f, struct lynx_tconn *c, uint32_t q,
                      uint32_t pos, uint32_t tag) {
  const struct lynx_geom *g = &f->r.g;
  uint8_t slot[Z] = {0};
  struct lynx_slot_meta m = {8, tag, 0, (uint16_t)(lynx_payload_off(Z, 8) / 16),
                             lynx_seq_for(pos)};
  struct iovec iov = {slot, Z};
  memcpy(slot + lynx_payload_off(Z, 8), &tag, 4);
  memcpy(slot + Z - LYNX_META_SIZE, &m, sizeof(m));
  return c->ops->writev(c, lynx_slot_off(g, lynx_rx_ring_off(g, q), pos), &iov,
                        1, LYNX_WR_PUBLISH);
}

/* What a takeover resumes from: the requests the old producer published
 * (and the accelerator has not consumed) are there for the new producer
 * to read, slot metadata included, and nothing the old one writes after
 * the takeover lands (frontend/rmq.c resumes its rings after them). */
static void tc_fence_takeover_resume(void **state) {
  struct fx *f = *state;
  const struct lynx_geom *g = &f->r.g;
  uint64_t ring = lynx_rx_ring_off(g, 1), ids[S];
  struct lynx_slot_meta m[S];
  struct lynx_tconn *old;
  connect_as(f, 5, &old);
  for (uint32_t pos = 0; pos < 3; pos++)
    assert_int_equal(publish_at(f, old, 1, pos, 0x01D00 + pos), 0);
  assert_int_equal(old->ops->flush(old), 0);
  settle(old);
  connect_as(f, 7, &f->c);
  fence_expect(f, 7, 1, 0, 1);
  /* cut: refused at once (shm) or lands nowhere */
  if (publish_at(f, old, 1, 3, 0x01D03) == 0)
    old->ops->flush(old);
  assert_int_equal(produce_error(f, old), B->err.cut);
  old->ops->close(old);
  for (uint32_t pos = 0; pos < S; pos++)
    assert_int_equal(
        f->c->ops->read(f->c, lynx_slot_off(g, ring, pos) + Z - LYNX_META_SIZE,
                        &m[pos], sizeof(m[pos]), pos),
        0);
  assert_int_equal(f->c->ops->flush(f->c), 0);
  assert_int_equal(ut_poll_n(f->c, ids, S), S);
  for (uint32_t pos = 0; pos < 3; pos++) {
    assert_int_equal(m[pos].seq, lynx_seq_for(pos));
    assert_int_equal(m[pos].tag, 0x01D00 + pos);
  }
  for (uint32_t pos = 3; pos < S; pos++)
    assert_int_equal(m[pos].seq, 0);
}

/* Epoch 0 ("no epoch") is admitted only while no epoch was. */
static void tc_fence_epoch0(void **state) {
  struct fx *f = *state;
  struct lynx_tconn *none;
  connect_as(f, 0, &none);
  fence_expect(f, 0, 1, 0, 0);
  connect_as(f, 3, &f->c);
  fence_expect(f, 3, 1, 0, 1);
  assert_int_equal(produce_error(f, none), B->err.cut);
  none->ops->close(none);
  refused_as(f, 0);
  fence_expect(f, 3, 1, 1, 1);
  roundtrip(f, lynx_rx_ring_off(&f->r.g, 1), "epoch 3", 8, 0);
}

/* The accelerator publishes an answer at TX ring position pos of mqueue
 * q: the slot (8 bytes of tag as payload), then its tx_prod (release),
 * as the ring code does. */
static void answer_at(struct fx *f, uint32_t q, uint32_t pos, uint32_t tag) {
  const struct lynx_geom *g = &f->r.g;
  uint8_t *slot = f->r.mem + lynx_slot_off(g, lynx_tx_ring_off(g, q), pos);
  struct lynx_actrl *a = (struct lynx_actrl *)(f->r.mem + lynx_actrl_off(g, q));
  struct lynx_slot_meta m = {8, tag, 0, (uint16_t)(lynx_payload_off(Z, 8) / 16),
                             lynx_seq_for(pos)};
  memcpy(slot + lynx_payload_off(Z, 8), &tag, 4);
  memcpy(slot + Z - LYNX_META_SIZE, &m, sizeof(m));
  __atomic_store_n(&a->tx_prod, pos + 1, __ATOMIC_RELEASE);
}

/* Polls c until the subscription p is answered and, if the agent pushes,
 * mqueue q's entry has slots up to prod: 0, or the error of the poll
 * (-ETIMEDOUT after 5 s). */
static int poll_push(struct lynx_tconn *c, const struct lynx_push *p,
                     uint32_t q, uint32_t prod) {
  uint64_t end = lynx_now_ns() + 5000000000ull, id;
  while (lynx_now_ns() < end) {
    int k = c->ops->poll(c, &id, 1);
    if (k < 0)
      return k;
    if (p->state != 0 && (p->state < 0 || p->sub[q].prod == prod))
      return 0;
    usleep(200);
  }
  return -ETIMEDOUT;
}

/* Pushed answers (subscribe): a backend that has them reports the
 * subscription, then brings each answer the accelerator publishes, unasked
 * (no read posted), into the ring's copy at its position, from where
 * each mqueue was asked; a takeover cuts the subscribed connection (its poll
 * fails as a cut one's ops do). A backend without them says -ENOTSUP. */
static void tc_push(void **state) {
  struct fx *f = *state;
  const struct lynx_geom *g = &f->r.g;
  struct lynx_tx_sub sub[TC_Q];
  struct lynx_push p = {sub, TC_Q, 0};
  uint8_t *ring[TC_Q];
  struct lynx_tconn *nw;
  uint64_t id;
  connect_as(f, 5, &f->c);
  for (uint32_t q = 0; q < TC_Q; q++) {
    ring[q] = calloc(TC_S, Z);
    assert_non_null(ring[q]);
    sub[q] = (struct lynx_tx_sub){.q = q, .from = 2 * q, .ring = ring[q]};
  }
  /* mqueue 1 has two answers before: pushed from position 2 on */
  answer_at(f, 1, 0, 0xA0);
  answer_at(f, 1, 1, 0xA1);
  if (!(B->caps & TC_CAP_PUSH)) {
    assert_int_equal(f->c->ops->subscribe(f->c, &p, 9), -ENOTSUP);
    goto out;
  }
  assert_int_equal(f->c->ops->subscribe(f->c, &p, 9), 0);
  assert_int_equal(f->c->ops->flush(f->c), 0);
  assert_int_equal(poll_push(f->c, &p, 0, 0), 0);
  assert_int_equal(p.state, 1);
  answer_at(f, 1, 2, 0xB2);
  answer_at(f, 1, 3, 0xB3);
  assert_int_equal(poll_push(f->c, &p, 1, 4), 0);
  for (uint32_t pos = 2; pos < 4; pos++) {
    const uint8_t *want =
        f->r.mem + lynx_slot_off(g, lynx_tx_ring_off(g, 1), pos);
    assert_memory_equal(ring[1] + (size_t)pos * Z, want, Z);
  }
  assert_int_equal(sub[1].prod, 4);
  assert_int_equal(sub[0].prod, 0); /* nothing published there */
  /* one on mqueue 0: its own entry, its position */
  answer_at(f, 0, 0, 0xC0);
  assert_int_equal(poll_push(f->c, &p, 0, 1), 0);
  assert_memory_equal(
      ring[0], f->r.mem + lynx_slot_off(g, lynx_tx_ring_off(g, 0), 0), Z);
  /* a newer frontend takes the region over: the subscribed connection,
   * with no read posted, learns it from its poll */
  connect_as(f, 7, &nw);
  {
    uint64_t end = lynx_now_ns() + 5000000000ull;
    int k = 0;
    while (k >= 0 && lynx_now_ns() < end) {
      k = f->c->ops->poll(f->c, &id, 1);
      usleep(1000);
    }
    assert_int_equal(k, B->err.cut);
  }
  nw->ops->close(nw);
out:
  for (uint32_t q = 0; q < TC_Q; q++)
    free(ring[q]);
}

static int g_argc;
static char **g_argv;

static int run(void) {
#define T(fn) cmocka_unit_test_setup_teardown(fn, fx_setup, fx_teardown)
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(tc_find_and_ops),
      T(tc_format_connect),
      T(tc_write_read_roundtrip),
      T(tc_connect_refusals),
      T(tc_outside_region_efault),
      T(tc_access_classes),
      T(tc_publish_request),
      T(tc_request_response),
      T(tc_publish_einval),
      T(tc_read_completions),
      T(tc_pipelined_batches),
      T(tc_flush_empty),
      T(tc_wait_fd),
      T(tc_notify_wakes_sleeping),
      T(tc_notify_quiet_when_awake),
      T(tc_arm_needs_ringing_accel),
      T(tc_region_free),
      T(tc_epoch_renew),
      T(tc_fence_takeover),
      T(tc_fence_takeover_resume),
      T(tc_fence_epoch0),
      T(tc_push),
  };
#undef T
  char group[64];
  snprintf(group, sizeof(group), "transport_conformance_%s", B->name);
  return LYNX_UT_MAIN(g_argc, g_argv, group, tests, group_setup,
                      group_teardown);
}

/* ---- the harness of shm and tcp: their own agent side, in this process -- */

struct tc_agent_region {
  struct lynx_region r;
  char name[64];
};

static struct lynx_transport_agent *g_ta; /* the agent side's handle */

int tc_agent_start(const struct lynx_transport_opts *o) {
  const struct lynx_transport_ops *ops;
  return ut_agent_create(B->name, o, &ops, &g_ta);
}

void tc_agent_stop(void) {
  B->ops->agent_destroy(g_ta);
  g_ta = NULL;
}

/* Allocates, formats and exports a->r; fills t from it. */
static int agent_region_make(struct tc_region *t, struct tc_agent_region *a,
                             uint32_t ordering, uint64_t epoch) {
  int rc;
  ut_region_empty(&a->r);
  rc = ut_region_serve(B->ops, g_ta, &a->r, a->name, &t->g, ordering, epoch,
                       TC_ACCEL, &t->d);
  if (!rc)
    t->mem = a->r.base;
  return rc;
}

int tc_agent_region_new(struct tc_region *t, const char *name,
                        uint32_t ordering, uint64_t epoch) {
  struct tc_agent_region *a = calloc(1, sizeof(*a));
  memset(t, 0, sizeof(*t));
  if (!a)
    return -ENOMEM;
  t->priv = a;
  ut_region_empty(&a->r);
  if (lynx_geom_init(&t->g, Q, S, Z, 0))
    return -EINVAL;
  snprintf(a->name, sizeof(a->name), "%s", name);
  return agent_region_make(t, a, ordering, epoch);
}

int tc_agent_region_renew(struct tc_region *t, uint64_t epoch) {
  struct tc_agent_region *a = t->priv;
  B->ops->region_free(&a->r);
  return agent_region_make(t, a, t->d.ordering, epoch);
}

void tc_agent_region_free(struct tc_region *t) {
  struct tc_agent_region *a = t->priv;
  if (!a)
    return;
  B->ops->region_free(&a->r);
  free(a);
  t->priv = NULL;
  t->mem = NULL;
}

int tc_agent_connect(const struct lynx_region_desc *d,
                     struct lynx_tconn **out) {
  return B->ops->connect(d, out);
}

void tc_agent_fence_stats(struct tc_region *t, struct lynx_fence_stats *out) {
  struct tc_agent_region *a = t->priv;
  lynx_region_fence_stats(&a->r, out);
}

int main(int argc, char **argv) {
  g_argc = argc;
  g_argv = argv;
  return B->main ? B->main(run) : run();
}
