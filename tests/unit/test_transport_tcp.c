/*
 * test_transport_tcp.c - what only the tcp backend (transport/transport_tcp.c)
 * does, against its own agent side on 127.0.0.1: connect refused when
 * nobody listens; the agent side against a raw socket (speaking garbage,
 * writing outside fctrl and the RX rings, reading past the end, or
 * skipping the hello gets its connection closed without a byte of the
 * region changing, while other connections go on; a HELLO's length is
 * checked before its body is buffered, and the data port's guard counts
 * it); a region in device memory served only through its copies. What
 * every backend promises (one-sided writes and reads, PUBLISH, completions,
 * refusals at connect, bounds, region_free) is the conformance suite's
 * (transport_conformance.c, run for tcp as unit_transport_conformance_tcp).
 *
 * The agent side is process-wide (one server thread): started once for
 * the whole file.
 */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "connguard.h"
#include "mqueue.h"
#include "transport.h"
#include "ut_main.h"
#include "ut_region.h"
#include "ut_tconn.h"
#include "util.h"

#define Q 2u
#define S 8u
#define Z 256u
#define EPOCH 0x5EED0000BEEFull

static const struct lynx_transport_ops *T;
static struct lynx_transport_agent *g_ta; /* the agent side's handle */
static char g_bound[LYNX_LOCATOR_MAX];

struct fx {
  struct lynx_region r;
  struct lynx_geom g;
  struct lynx_region_desc d;
  struct lynx_tconn *c;
  uint8_t *snap;
};

static int group_setup(void **state) {
  (void)state;
  return ut_tcp_agent(&T, &g_ta, g_bound, sizeof(g_bound));
}

static int group_teardown(void **state) {
  (void)state;
  T->agent_destroy(g_ta);
  return 0;
}

static int fx_setup(void **state) {
  struct fx *f = calloc(1, sizeof(*f));
  if (!f || lynx_geom_init(&f->g, Q, S, Z))
    return -1;
  *state = f;
  f->r.fd = -1;
  /* nonzero fails the setup, as -1 does */
  return ut_region_serve(T, g_ta, &f->r, "ut", &f->g, LYNX_ORDER_COALESCED,
                         EPOCH, 4, &f->d);
}

static int fx_teardown(void **state) {
  struct fx *f = *state;
  if (!f)
    return 0;
  ut_tconn_close(&f->c);
  T->region_free(&f->r);
  free(f->snap);
  free(f);
  return 0;
}

static void connect_ok(struct fx *f) {
  ut_connect_ok(T->connect, &f->d, &f->c);
}

static void snapshot(struct fx *f) {
  free(f->snap);
  f->snap = malloc(f->r.size);
  assert_non_null(f->snap);
  memcpy(f->snap, f->r.base, f->r.size);
}

/* Writes it, flushes, then reads [off, off+len) back through the
 * connection (the read is applied after the write). */
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
  assert_memory_equal(f->r.base + off, data, len);
  free(back);
}

/* ---- refusals -------------------------------------------------------- */

static void expect_refused(const struct lynx_region_desc *d, int want) {
  ut_expect_refused(T->connect, d, want);
}

static void test_connect_nobody_listening(void **state) {
  struct fx *f = *state;
  struct lynx_region_desc d;
  d = f->d;
  { /* nobody listens on a port we just released */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &al), 0);
    snprintf(d.locator, sizeof(d.locator), "127.0.0.1:%u", ntohs(a.sin_port));
    close(fd);
  }
  expect_refused(&d, -ECONNREFUSED);
  /* and the right descriptor still connects */
  connect_ok(f);
}

/* ---- the agent side against a raw socket ------------------------------ */

static int raw_connect(const struct fx *f) {
  struct sockaddr_storage ss;
  int fd;
  assert_int_equal(lynx_parse_hostport(f->r.locator, &ss), 0);
  fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  assert_int_equal(connect(fd, (struct sockaddr *)&ss,
                           sizeof(struct sockaddr_in)),
                   0);
  return fd;
}

static void put_hdr(uint8_t *p, uint8_t op, uint8_t flags, uint32_t len,
                    uint64_t off, uint64_t wr_id) {
  uint32_t l = htole32(len);
  uint64_t o = htole64(off), w = htole64(wr_id);
  memset(p, 0, 24);
  p[0] = op;
  p[1] = flags;
  memcpy(p + 4, &l, 4);
  memcpy(p + 8, &o, 8);
  memcpy(p + 16, &w, 8);
}

static void raw_send(int fd, const void *p, size_t n) {
  assert_int_equal(send(fd, p, n, MSG_NOSIGNAL), (ssize_t)n);
}

/* Reads until the agent closes the connection (0 from recv) or 2 s pass;
 * returns 1 when it closed. */
static int raw_closed(int fd) {
  uint8_t b[4096];
  uint64_t end = lynx_now_ns() + 2000000000ull;
  while (lynx_now_ns() < end) {
    struct pollfd p = {fd, POLLIN, 0};
    ssize_t n;
    if (poll(&p, 1, 100) <= 0)
      continue;
    n = recv(fd, b, sizeof(b), 0);
    if (n == 0 || (n < 0 && errno == ECONNRESET))
      return 1;
  }
  return 0;
}

static void raw_hello(int fd, const struct fx *f) {
  uint8_t m[24 + 32], r[24];
  uint32_t magic = htole32(0x3154584Cu);
  uint16_t ver = htole16(1);
  uint64_t key = htole64(f->r.key), ep = htole64(EPOCH),
           sz = htole64(f->g.region_size);
  put_hdr(m, 1, 0, 32, 0, 0);
  memset(m + 24, 0, 32);
  memcpy(m + 24, &magic, 4);
  memcpy(m + 28, &ver, 2);
  memcpy(m + 32, &key, 8);
  memcpy(m + 40, &ep, 8);
  memcpy(m + 48, &sz, 8);
  raw_send(fd, m, sizeof(m));
  assert_int_equal(recv(fd, r, sizeof(r), MSG_WAITALL), 24);
  assert_int_equal(r[0], 2);   /* HELLO_REPLY */
  assert_int_equal(r[8], 0);   /* status 0 */
}

/* Each bad frame closes its own connection and changes nothing. */
static void test_agent_closes_on_bad_frames(void **state) {
  struct fx *f = *state;
  uint8_t frame[24 + 64];
  int fd;
  memset(frame + 24, 0xEE, 64);
  snapshot(f);

  /* garbage instead of a hello */
  fd = raw_connect(f);
  raw_send(fd, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27);
  assert_true(raw_closed(fd));
  close(fd);

  /* a write before the hello */
  fd = raw_connect(f);
  put_hdr(frame, 3, 0, 64, lynx_rx_ring_off(&f->g, 0), 0);
  raw_send(fd, frame, sizeof(frame));
  assert_true(raw_closed(fd));
  close(fd);

  /* after a valid hello: a write into the TX ring */
  fd = raw_connect(f);
  raw_hello(fd, f);
  put_hdr(frame, 3, 0, 64, lynx_tx_ring_off(&f->g, 0), 0);
  raw_send(fd, frame, sizeof(frame));
  assert_true(raw_closed(fd));
  close(fd);

  /* a write past the end of the region (offset near 2^64: no wrap) */
  fd = raw_connect(f);
  raw_hello(fd, f);
  put_hdr(frame, 3, 0, 64, UINT64_MAX - 16, 0);
  raw_send(fd, frame, sizeof(frame));
  assert_true(raw_closed(fd));
  close(fd);

  /* a read past the end */
  fd = raw_connect(f);
  raw_hello(fd, f);
  put_hdr(frame, 4, 0, 64, f->g.region_size - 8, 0);
  raw_send(fd, frame, 24);
  assert_true(raw_closed(fd));
  close(fd);

  /* a frame claiming 1 GiB */
  fd = raw_connect(f);
  raw_hello(fd, f);
  put_hdr(frame, 3, 0, 1u << 30, lynx_rx_ring_off(&f->g, 0), 0);
  raw_send(fd, frame, 24);
  assert_true(raw_closed(fd));
  close(fd);

  /* an unknown operation, and a nonzero reserved field */
  fd = raw_connect(f);
  raw_hello(fd, f);
  put_hdr(frame, 42, 0, 0, 0, 0);
  raw_send(fd, frame, 24);
  assert_true(raw_closed(fd));
  close(fd);
  fd = raw_connect(f);
  raw_hello(fd, f);
  put_hdr(frame, 4, 0, 8, 0, 0);
  frame[2] = 1;
  raw_send(fd, frame, 24);
  assert_true(raw_closed(fd));
  close(fd);

  /* a publishing write whose end is not word-aligned */
  fd = raw_connect(f);
  raw_hello(fd, f);
  put_hdr(frame, 3, 1, 7, lynx_rx_ring_off(&f->g, 0), 0);
  raw_send(fd, frame, 24 + 7);
  assert_true(raw_closed(fd));
  close(fd);

  usleep(20000);
  assert_memory_equal(f->r.base, f->snap, f->r.size);
  /* the agent goes on serving well-behaved frontends */
  connect_ok(f);
  roundtrip(f, lynx_rx_ring_off(&f->g, 1), "still here!", 12, 0);
}

/* Before a HELLO, the agent takes only a HELLO of the hello's size: a
 * header announcing 4 MiB is refused on its header, before any byte of
 * that length is buffered (it closes while the stranger is still sending),
 * and the port's guard counts the connection closed. */
static void test_hello_length_checked_first(void **state) {
  struct fx *f = *state;
  uint8_t hdr[24];
  static uint8_t chunk[65536];
  uint64_t accepted0 = lynx_guard_get(&g_ta->guard->accepted);
  size_t sent = 0;
  int fd = raw_connect(f), closed = 0;
  put_hdr(hdr, 1, 0, 4u << 20, 0, 0); /* HELLO of 4 MiB */
  raw_send(fd, hdr, sizeof(hdr));
  assert_true(raw_closed(fd));
  /* what follows finds the connection gone, long before 4 MiB */
  while (sent < (4u << 20)) {
    ssize_t n = send(fd, chunk, sizeof(chunk), MSG_NOSIGNAL);
    if (n < 0) {
      closed = 1;
      break;
    }
    sent += (size_t)n;
  }
  assert_true(closed);
  close(fd);
  /* a WRITE before HELLO: refused the same way */
  fd = raw_connect(f);
  put_hdr(hdr, 3, 0, 4u << 20, lynx_rx_ring_off(&f->g, 0), 0);
  raw_send(fd, hdr, sizeof(hdr));
  assert_true(raw_closed(fd));
  close(fd);
  /* both were admitted and are counted closed again: no connection waits
   * to authenticate (the agent's thread closes them) */
  for (int i = 0; i < 200 && lynx_guard_get(&g_ta->guard->unauth) != 0; i++)
    usleep(10000);
  assert_int_equal(lynx_guard_get(&g_ta->guard->unauth), 0);
  assert_true(lynx_guard_get(&g_ta->guard->accepted) >= accepted0 + 2);
  connect_ok(f);
  roundtrip(f, lynx_rx_ring_off(&f->g, 1), "still fine", 11, 0);
}

/* A well-behaved connection is not disturbed by a bad one next to it. */
static void test_bad_peer_does_not_hurt_others(void **state) {
  struct fx *f = *state;
  int fd;
  connect_ok(f);
  roundtrip(f, lynx_rx_ring_off(&f->g, 0), "before!", 8, 0);
  fd = raw_connect(f);
  raw_hello(fd, f);
  raw_send(fd, "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"
               "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 24);
  assert_true(raw_closed(fd));
  close(fd);
  roundtrip(f, lynx_rx_ring_off(&f->g, 0), "after!!", 8, 0);
}

/* ---- device memory (a GPU's region, reached only through copies) ---- */

struct fake_dev {
  uint8_t *mem; /* not region.base: the transport may not touch it */
  uint64_t size;
  int writes, reads, releases;
  uint64_t last_off;  /* the most recent write */
  size_t last_len;
  int fail_reads;
};

static int fake_write(void *ctx, uint64_t off, const void *src, size_t len) {
  struct fake_dev *d = ctx;
  if (off > d->size || len > d->size - off)
    return -EFAULT;
  memcpy(d->mem + off, src, len);
  __atomic_add_fetch(&d->writes, 1, __ATOMIC_SEQ_CST);
  d->last_off = off;
  d->last_len = len;
  return 0;
}

static int fake_read(void *ctx, uint64_t off, void *dst, size_t len) {
  struct fake_dev *d = ctx;
  if (d->fail_reads)
    return -EIO;
  if (off > d->size || len > d->size - off)
    return -EFAULT;
  memcpy(dst, d->mem + off, len);
  __atomic_add_fetch(&d->reads, 1, __ATOMIC_SEQ_CST);
  return 0;
}

static int fake_reg_mr(void *ctx, void *pd, uint64_t off, size_t len,
                       int access, void **mr, char *err, size_t errlen) {
  (void)ctx, (void)pd, (void)off, (void)len, (void)access, (void)mr;
  snprintf(err, errlen, "not on this fake");
  return -ENOTSUP;
}

static void fake_release(void *ctx) {
  struct fake_dev *d = ctx;
  __atomic_add_fetch(&d->releases, 1, __ATOMIC_SEQ_CST);
}

static int releases_after(struct fake_dev *d, int want) {
  uint64_t end = lynx_now_ns() + 2000000000ull;
  while (__atomic_load_n(&d->releases, __ATOMIC_SEQ_CST) < want &&
         lynx_now_ns() < end)
    usleep(1000);
  return __atomic_load_n(&d->releases, __ATOMIC_SEQ_CST);
}

/* A region in device memory: the agent formats, exports and serves it only
 * through the memory's copies (a publishing write lands as two ordered
 * copies, the word last), and the memory is released exactly once, after
 * the last data connection. shm cannot reach device memory at all. */
static void test_device_memory_region(void **state) {
  struct fake_dev dev = {0};
  struct lynx_region_mem mem = {.kind = "fake", .write = fake_write,
                                .read = fake_read, .reg_mr = fake_reg_mr,
                                .release = fake_release, .ctx = &dev};
  struct lynx_region r = {.fd = -1};
  struct lynx_region_desc d;
  struct lynx_tconn *c;
  struct lynx_geom g;
  uint8_t pay[64], back[64];
  uint64_t ids[1];
  struct iovec iov = {pay, sizeof(pay)};
  (void)state;
  assert_int_equal(lynx_geom_init(&g, Q, S, Z), 0);
  dev.size = g.region_size;
  dev.mem = calloc(1, g.region_size);
  assert_non_null(dev.mem);
  assert_int_equal(T->region_attach(g_ta, &r, "ut-dev", g.region_size, &mem),
                   0);
  assert_null(r.base);
  assert_int_equal(
      lynx_region_format(&r, Q, S, Z, LYNX_ORDER_FENCED, EPOCH, 7), 0);
  /* the magic is the last word written */
  assert_int_equal(dev.last_off, 0);
  assert_int_equal(dev.last_len, 4);
  assert_int_equal(((struct lynx_region_hdr *)dev.mem)->magic,
                   LYNX_REGION_MAGIC);
  assert_int_equal(T->region_export(&r), 0);
  ut_desc_fill(&d, "tcp", r.locator, &g, 7, EPOCH, LYNX_ORDER_FENCED);
  d.key = r.key;
  assert_int_equal(T->connect(&d, &c), 0);
  for (unsigned i = 0; i < sizeof(pay); i++)
    pay[i] = (uint8_t)(i * 7 + 1);
  dev.writes = 0;
  assert_int_equal(c->ops->writev(c, lynx_rx_ring_off(&g, 1), &iov, 1,
                                  LYNX_WR_PUBLISH), 0);
  assert_int_equal(c->ops->read(c, lynx_rx_ring_off(&g, 1), back,
                                sizeof(back), 42), 0);
  assert_int_equal(c->ops->flush(c), 0);
  assert_int_equal(ut_poll_n(c, ids, 1), 1);
  assert_int_equal(ids[0], 42);
  assert_memory_equal(back, pay, sizeof(pay));
  assert_memory_equal(dev.mem + lynx_rx_ring_off(&g, 1), pay, sizeof(pay));
  assert_int_equal(__atomic_load_n(&dev.writes, __ATOMIC_SEQ_CST), 2);
  assert_int_equal(dev.last_off, lynx_rx_ring_off(&g, 1) + sizeof(pay) - 4);
  assert_int_equal(dev.last_len, 4);
  /* a device read that fails closes that connection, with a reason */
  dev.fail_reads = 1;
  assert_int_equal(c->ops->read(c, 0, back, 8, 43), 0);
  assert_int_equal(c->ops->flush(c), 0);
  assert_true(ut_poll_n(c, ids, 1) < 0);
  dev.fail_reads = 0;
  /* memory stays until the last connection is gone, then goes once */
  T->region_free(&r);
  c->ops->close(c);
  assert_int_equal(releases_after(&dev, 1), 1);
  usleep(20000);
  assert_int_equal(__atomic_load_n(&dev.releases, __ATOMIC_SEQ_CST), 1);

  /* shm: refused, and the memory handed back */
  {
    const struct lynx_transport_ops *shm = lynx_transport_find("shm");
    struct lynx_region r2 = {.fd = -1};
    assert_int_equal(shm->region_attach(NULL, &r2, "ut-dev", g.region_size,
                                        &mem),
                     -ENOTSUP);
    assert_int_equal(dev.releases, 2);
  }
  free(dev.mem);
}

#define T_(fn) cmocka_unit_test_setup_teardown(fn, fx_setup, fx_teardown)

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      T_(test_connect_nobody_listening),
      T_(test_agent_closes_on_bad_frames),
      T_(test_bad_peer_does_not_hurt_others),
      T_(test_hello_length_checked_first),
      cmocka_unit_test(test_device_memory_region),
  };
  return LYNX_UT_MAIN(argc, argv, "tests", tests, group_setup, group_teardown);
}
