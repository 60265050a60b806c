/*
 * test_transport_tcp.c - what only the tcp backend (transport/transport_tcp.c)
 * does, against its own agent side on 127.0.0.1: connect refused when
 * nobody listens; the agent side against a raw socket (speaking garbage,
 * writing outside fctrl and the RX rings, reading past the end, or
 * skipping the hello gets its connection closed without a byte of the
 * region changing, while other connections go on; a HELLO's length is
 * checked before its body is buffered, and the data port's guard counts
 * it); a region in device memory served only through its copies, and
 * one whose memory takes batches (a received buffer's operations as one
 * batch: replies in order, reads after the writes before them, one flush
 * per buffer, a full staging ending the batch early, a read too large to
 * stage copied on its own, a failing flush closing the connection); a
 * region served by tcp and, as a shared-memory file, by shm at once, with
 * one fence across the two (--transport auto). What
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
#include <fcntl.h>
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
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "connguard.h"
#include "mqueue.h"
#include "tcp_auth.h"
#include "tcp_wire.h"
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
  if (!f || lynx_geom_init(&f->g, Q, S, Z, 0))
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
  assert_int_equal(
      connect(fd, (struct sockaddr *)&ss, sizeof(struct sockaddr_in)), 0);
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

/* Sends a HELLO of protocol version ver for f's region, as long as that
 * version's (32 bytes up to 2; 3 adds the producer epoch, 0 here; 4 names
 * the region by its id, not its key); its 40 bytes into hello if not
 * NULL. */
static void raw_hello_send_copy(int fd, const struct fx *f, uint16_t ver,
                                uint8_t hello[40]) {
  uint8_t m[24 + 40];
  uint32_t magic = htole32(0x3154584Cu);
  uint32_t len = ver >= 3 ? 40 : 32;
  uint64_t key = htole64(ver >= 4 ? lynx__tcp_region_id(f->r.key) : f->r.key),
           ep = htole64(EPOCH), sz = htole64(f->g.region_size);
  ver = htole16(ver);
  put_hdr(m, 1, 0, len, 0, 0);
  memset(m + 24, 0, 40);
  memcpy(m + 24, &magic, 4);
  memcpy(m + 28, &ver, 2);
  memcpy(m + 32, &key, 8);
  memcpy(m + 40, &ep, 8);
  memcpy(m + 48, &sz, 8);
  if (hello)
    memcpy(hello, m + 24, 40);
  raw_send(fd, m, 24 + len);
}

static void raw_hello_send(int fd, const struct fx *f, uint16_t ver) {
  raw_hello_send_copy(fd, f, ver, NULL);
}

/* This version's exchange up to the agent's answer: HELLO, its
 * CHALLENGE, and a PROOF made with key (f's, or another to see it
 * refused). */
static void raw_hello_prove(int fd, const struct fx *f, uint64_t key) {
  uint8_t hello[40], r[24 + LYNX_TCP_NONCE], proof[24 + LYNX_TCP_PROOF];
  raw_hello_send_copy(fd, f, TCP_VERSION, hello);
  assert_int_equal(recv(fd, r, sizeof(r), MSG_WAITALL), (ssize_t)sizeof(r));
  assert_int_equal(r[0], 9); /* CHALLENGE */
  put_hdr(proof, 10, 0, LYNX_TCP_PROOF, 0, 0);
  assert_int_equal(
      lynx__tcp_proof(key, r + 24, hello, sizeof(hello), proof + 24), 0);
  raw_send(fd, proof, sizeof(proof));
}

static void raw_hello(int fd, const struct fx *f) {
  uint8_t r[24];
  raw_hello_prove(fd, f, f->r.key);
  assert_int_equal(recv(fd, r, sizeof(r), MSG_WAITALL), 24);
  assert_int_equal(r[0], 2); /* HELLO_REPLY */
  assert_int_equal(r[8], 0); /* status 0 */
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
  raw_send(fd,
           "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"
           "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",
           24);
  assert_true(raw_closed(fd));
  close(fd);
  roundtrip(f, lynx_rx_ring_off(&f->g, 0), "after!!", 8, 0);
}

/* ---- the compound read (READ_TX) -------------------------------------- */

/* Fills slot pos of mqueue q's TX ring with bytes of its own and publishes
 * it (seq), as an accelerator would. */
static void tx_fill(uint8_t *base, const struct lynx_geom *g, uint32_t q,
                    uint32_t pos) {
  uint8_t *slot = base + lynx_slot_off(g, lynx_tx_ring_off(g, q), pos);
  struct lynx_slot_meta m = {8, pos * 3 + q, 0, 0, lynx_seq_for(pos)};
  for (uint32_t i = 0; i < g->slot_size - LYNX_META_SIZE; i++)
    slot[i] = (uint8_t)(pos * 31 + q * 7 + i);
  memcpy(slot + g->slot_size - LYNX_META_SIZE, &m, sizeof(m));
}

static void actrl_set(uint8_t *base, const struct lynx_geom *g, uint32_t q,
                      uint32_t tx_prod, uint32_t rx_cons) {
  struct lynx_actrl a = {tx_prod, rx_cons};
  memcpy(base + lynx_actrl_off(g, q), &a, sizeof(a));
}

/* Posts a compound read of tx (n entries) into actrl, flushes and waits for
 * it; the poll's result (1, or -errno). */
static int read_tx_wait(struct lynx_tconn *c, void *actrl,
                        struct lynx_tx_read *tx, int n) {
  uint64_t id = 0;
  int rc = c->ops->read_tx(c, actrl, tx, n, 99);
  if (!rc)
    rc = c->ops->flush(c);
  if (!rc)
    rc = ut_poll_n(c, &id, 1);
  if (rc == 1)
    assert_int_equal(id, 99);
  return rc;
}

/* Slot k of a compound read's dst equals the region's slot at from + k. */
static void assert_slots(const uint8_t *base, const struct lynx_geom *g,
                         const struct lynx_tx_read *t) {
  for (uint32_t k = 0; k < t->got; k++)
    assert_memory_equal(
        (const uint8_t *)t->dst + (size_t)k * g->slot_size,
        base + lynx_slot_off(g, lynx_tx_ring_off(g, t->q), t->from + k),
        g->slot_size);
}

/* One compound read brings the control array and, from it, each mqueue's
 * published slots byte for byte: all of them, part of them (max), across
 * the ring's end, none; a tx_prod out of range (ahead by more than a ring,
 * or behind) brings none, and the array still says what it is. */
static void test_read_tx_exact(void **state) {
  struct fx *f = *state;
  const struct lynx_geom *g = &f->g;
  uint8_t actrl[8 * Q], d0[S * Z], d1[S * Z];
  struct lynx_tx_read tx[2] = {{.q = 0, .from = 6, .max = S, .dst = d0},
                               {.q = 1, .from = 3, .max = 2, .dst = d1}};
  connect_ok(f);
  for (uint32_t pos = 0; pos < 2 * S; pos++) {
    tx_fill(f->r.base, g, 0, pos);
    tx_fill(f->r.base, g, 1, pos);
  }
  /* q0: 6..10, wrapping after 7; q1: 3..7, only 2 asked */
  actrl_set(f->r.base, g, 0, 11, 1);
  actrl_set(f->r.base, g, 1, 8, 2);
  assert_int_equal(read_tx_wait(f->c, actrl, tx, 2), 1);
  assert_memory_equal(actrl, f->r.base + g->actrl_off, sizeof(actrl));
  assert_int_equal(tx[0].got, 5);
  assert_int_equal(tx[1].got, 2);
  assert_slots(f->r.base, g, &tx[0]);
  assert_slots(f->r.base, g, &tx[1]);
  /* max caps a wrapping range; nothing new; the positions free-run past
   * 2^32 */
  tx[0] = (struct lynx_tx_read){
      .q = 0, .from = UINT32_MAX - 1, .max = 3, .dst = d0};
  tx[1].from = 8;
  actrl_set(f->r.base, g, 0, 3, 1); /* 2^32 - 2 .. 2 */
  assert_int_equal(read_tx_wait(f->c, actrl, tx, 2), 1);
  assert_int_equal(tx[0].got, 3);
  assert_int_equal(tx[1].got, 0);
  assert_slots(f->r.base, g, &tx[0]);
  /* a misbehaving accelerator: tx_prod a ring and one ahead, then behind */
  tx[0] = (struct lynx_tx_read){.q = 0, .from = 4, .max = S, .dst = d0};
  actrl_set(f->r.base, g, 0, 4 + S + 1, 1);
  assert_int_equal(read_tx_wait(f->c, actrl, tx, 2), 1);
  assert_int_equal(tx[0].got, 0);
  assert_memory_equal(actrl, f->r.base + g->actrl_off, sizeof(actrl));
  actrl_set(f->r.base, g, 0, 3, 1);
  assert_int_equal(read_tx_wait(f->c, actrl, tx, 2), 1);
  assert_int_equal(tx[0].got, 0);
  /* exactly a ring ahead: every slot */
  actrl_set(f->r.base, g, 0, 4 + S, 1);
  assert_int_equal(read_tx_wait(f->c, actrl, tx, 1), 1);
  assert_int_equal(tx[0].got, S);
  assert_slots(f->r.base, g, &tx[0]);
  /* no mqueue at all: the array alone */
  actrl_set(f->r.base, g, 1, 77, 5);
  assert_int_equal(read_tx_wait(f->c, actrl, NULL, 0), 1);
  assert_memory_equal(actrl, f->r.base + g->actrl_off, sizeof(actrl));
  /* pipelined behind a write and a read on the same connection, in
   * order */
  roundtrip(f, lynx_rx_ring_off(g, 0), "before", 7, 0);
}

/* What a compound read may name is checked before it is sent (an mqueue
 * the region lacks, more slots than a ring, more entries than mqueues, an
 * answer larger than one operation), and again by the agent, which closes
 * a connection that asks, without answering a byte of the region. */
static void test_read_tx_refused(void **state) {
  struct fx *f = *state;
  uint8_t actrl[8 * Q], d0[(S + 1) * Z], frame[24 + 8 + 16 * 3];
  struct lynx_tx_read tx[3] = {{.q = Q, .max = 1, .dst = d0},
                               {.q = 0, .max = S + 1, .dst = d0},
                               {.q = 1, .max = 1, .dst = d0}};
  int fd;
  connect_ok(f);
  assert_int_equal(f->c->ops->read_tx(f->c, actrl, &tx[0], 1, 1), -EFAULT);
  assert_int_equal(f->c->ops->read_tx(f->c, actrl, &tx[1], 1, 1), -EFAULT);
  assert_int_equal(f->c->ops->read_tx(f->c, actrl, tx, 3, 1), -EINVAL);
  assert_int_equal(f->c->ops->read_tx(f->c, actrl, tx, -1, 1), -EINVAL);
  /* nothing was posted: the connection still answers */
  roundtrip(f, lynx_rx_ring_off(&f->g, 0), "ok", 3, 0);

  /* the agent, from a raw socket: each of these closes the connection */
  {
    struct {
      uint32_t count, q, max, zero, len;
    } bad[] = {
        {1, Q, 1, 0, 8 + 16},     /* no such mqueue */
        {1, 0, S + 1, 0, 8 + 16}, /* more than a ring */
        {3, 0, 1, 0, 8 + 16 * 3}, /* more entries than mqueues */
        {1, 0, 1, 0, 8 + 16 + 4}, /* length not what count says */
        {1, 0, 1, 9, 8 + 16},     /* a reserved word set */
        {0, 0, 0, 0, 4},          /* shorter than its header */
    };
    for (size_t i = 0; i < LYNX_ARRAY_SIZE(bad); i++) {
      uint32_t w[2 + 4 * 3] = {0};
      w[0] = htole32(bad[i].count);
      for (uint32_t k = 0; k < 3; k++) {
        w[2 + 4 * k] = htole32(bad[i].q);
        w[2 + 4 * k + 2] = htole32(bad[i].max);
        w[2 + 4 * k + 3] = htole32(bad[i].zero);
      }
      fd = raw_connect(f);
      raw_hello(fd, f);
      put_hdr(frame, 6, 0, bad[i].len, 0, 0);
      memcpy(frame + 24, w, sizeof(w));
      raw_send(fd, frame, 24 + bad[i].len);
      assert_true(raw_closed(fd)); /* and no READ_TX_RESP before it */
      close(fd);
    }
  }
  /* a read the agent serves, from a raw socket, answers exactly the array
   * and the slots */
  {
    uint32_t w[2 + 4] = {htole32(1), 0, htole32(1), htole32(0), htole32(2), 0};
    uint8_t r[24 + 8 * Q + 4 + 2 * Z];
    uint32_t n;
    for (uint32_t pos = 0; pos < S; pos++)
      tx_fill(f->r.base, &f->g, 1, pos);
    actrl_set(f->r.base, &f->g, 1, 5, 0);
    fd = raw_connect(f);
    raw_hello(fd, f);
    put_hdr(frame, 6, 0, sizeof(w), 0, 1234);
    memcpy(frame + 24, w, sizeof(w));
    raw_send(fd, frame, 24 + sizeof(w));
    assert_int_equal(recv(fd, r, sizeof(r), MSG_WAITALL), (ssize_t)sizeof(r));
    assert_int_equal(r[0], 7); /* READ_TX_RESP */
    assert_int_equal(r[4] | r[5] << 8, sizeof(r) - 24);
    assert_int_equal(r[16], 1234 & 0xff);
    assert_memory_equal(r + 24, f->r.base + f->g.actrl_off, 8 * Q);
    memcpy(&n, r + 24 + 8 * Q, 4);
    assert_int_equal(le32toh(n), 2);
    assert_memory_equal(r + 24 + 8 * Q + 4,
                        f->r.base + lynx_tx_ring_off(&f->g, 1), 2 * Z);
    close(fd);
  }
}

/* A large answer's slot comes with the compound read; its bytes are read
 * from the TX large area in a second step, as rmq.c does. */
static void test_read_tx_large(void **state) {
  struct lynx_region r = {.fd = -1};
  struct lynx_region_desc d;
  struct lynx_tconn *c;
  struct lynx_geom g;
  uint8_t actrl[8 * Q], st[S * Z], big[3000];
  struct lynx_tx_read tx = {.q = 1, .from = 0, .max = S, .dst = st};
  struct lynx_large_ref ref = {128, sizeof(big), 128 + 3008, 0}, got;
  struct lynx_slot_meta m = {sizeof(ref), 5, LYNX_ST_LARGE, 0, 1}, mg;
  uint64_t id;
  (void)state;
  assert_int_equal(lynx_geom_init(&g, Q, S, Z, 4096), 0);
  assert_int_equal(ut_region_serve(T, g_ta, &r, "ut-large", &g,
                                   LYNX_ORDER_COALESCED, EPOCH, 4, &d),
                   0);
  for (size_t i = 0; i < sizeof(big); i++)
    r.base[lynx_tx_large_off(&g, 1) + 128 + i] = (uint8_t)(i * 5 + 1);
  memcpy(r.base + lynx_tx_ring_off(&g, 1), &ref, sizeof(ref));
  memcpy(r.base + lynx_tx_ring_off(&g, 1) + Z - LYNX_META_SIZE, &m, sizeof(m));
  actrl_set(r.base, &g, 1, 1, 0);
  ut_connect_ok(T->connect, &d, &c);
  assert_int_equal(read_tx_wait(c, actrl, &tx, 1), 1);
  assert_int_equal(tx.got, 1);
  memcpy(&mg, st + Z - LYNX_META_SIZE, sizeof(mg));
  assert_true(mg.status & LYNX_ST_LARGE);
  memcpy(&got, st, sizeof(got));
  assert_int_equal(lynx_large_check(&mg, &got, g.large_bytes), 0);
  assert_int_equal(
      c->ops->read(c, lynx_tx_large_off(&g, 1) + got.off, big, got.len, 7), 0);
  assert_int_equal(c->ops->flush(c), 0);
  assert_int_equal(ut_poll_n(c, &id, 1), 1);
  assert_memory_equal(big, r.base + lynx_tx_large_off(&g, 1) + 128,
                      sizeof(big));
  c->ops->close(c);
  T->region_free(&r);
}

/* ---- fencing ----------------------------------------------------------- */

/* Reads one agent frame's header and its payload (a reason) into why. */
static void raw_frame(int fd, uint8_t *op, uint64_t *off, char *why,
                      size_t wl) {
  uint8_t r[24];
  uint32_t len;
  assert_int_equal(recv(fd, r, sizeof(r), MSG_WAITALL), 24);
  *op = r[0];
  memcpy(off, r + 8, 8);
  *off = le64toh(*off);
  memcpy(&len, r + 4, 4);
  len = le32toh(len);
  assert_true(len < wl);
  assert_int_equal(recv(fd, why, len, MSG_WAITALL), (ssize_t)len);
  why[len] = 0;
}

/* The agent's next frame is op with status err and a reason holding
 * text, and it then closes the connection (which this closes too). */
static void raw_refused(int fd, uint8_t want_op, uint64_t err,
                        const char *text) {
  char why[200];
  uint64_t off;
  uint8_t op;
  raw_frame(fd, &op, &off, why, sizeof(why));
  assert_int_equal(op, want_op);
  assert_int_equal(off, err);
  assert_non_null(strstr(why, text));
  assert_true(raw_closed(fd));
  close(fd);
}

/* On the wire: a connection of an older epoch (a raw one, epoch 0) gets
 * FENCED {ESTALE, reason} when a newer one (9) takes the region over, and
 * is closed; a HELLO of the older epoch is then refused with ESTALE and
 * the reason; the agent counts both and writes the header word. */
static void test_fence_on_the_wire(void **state) {
  struct fx *f = *state;
  struct lynx_region_desc d = f->d;
  struct lynx_fence_stats s;
  int fd = raw_connect(f);
  raw_hello(fd, f);
  d.producer = 9;
  assert_int_equal(T->connect(&d, &f->c), 0);
  raw_refused(fd, 8 /* FENCED */, ESTALE, "epoch 9 took this region over");
  fd = raw_connect(f);
  raw_hello_prove(fd, f, f->r.key);
  raw_refused(fd, 2 /* HELLO_REPLY */, ESTALE,
              "fenced: frontend epoch 0 is older than 9, the newest this "
              "region admitted");
  lynx_region_fence_stats(&f->r, &s);
  assert_true(s.fence == 9 && s.refused == 1 && s.cut == 1 && s.producers == 1);
  assert_true(*(const uint64_t *)(f->r.base + LYNX_OFF_FENCE) == 9);
  /* a fenced frontend proved the key: the guard counts its connection
   * authenticated, once, also when it closes (counted unauthenticated
   * again, the count wrapped and the data port refused everyone: a
   * promoted standby could never connect) */
  {
    uint64_t end = lynx_now_ns() + 2000000000ull;
    struct lynx_tconn *second = NULL;
    while (lynx_guard_get(&g_ta->guard->unauth) != 0) {
      assert_true(lynx_now_ns() < end);
      usleep(1000);
    }
    assert_int_equal(T->connect(&d, &second), 0);
    ut_tconn_close(&second);
  }
}

/* ---- the proof of the key (version 4) ---------------------------------- */

/* The key never crosses the wire: the HELLO names the region by an id the
 * key does not show in; a PROOF made with another key is refused (EACCES,
 * counted as a wrong credential); a PROOF before any HELLO, or of another
 * length, closes the connection; the right one is served. */
static void test_key_proof(void **state) {
  struct fx *f = *state;
  uint8_t hello[40], frame[24 + LYNX_TCP_PROOF];
  uint64_t key = htole64(f->r.key);
  uint64_t fails0 = lynx_guard_get(&g_ta->guard->auth_failed);
  int fd = raw_connect(f);
  raw_hello_send_copy(fd, f, TCP_VERSION, hello);
  assert_null(memmem(hello, sizeof(hello), &key, sizeof(key)));
  close(fd);

  fd = raw_connect(f);
  raw_hello_prove(fd, f, f->r.key ^ 1);
  raw_refused(fd, 2 /* HELLO_REPLY */, EACCES, "wrong region key");
  assert_int_equal(lynx_guard_get(&g_ta->guard->auth_failed), fails0 + 1);

  fd = raw_connect(f);
  put_hdr(frame, 10, 0, LYNX_TCP_PROOF, 0, 0);
  memset(frame + 24, 0, LYNX_TCP_PROOF);
  raw_send(fd, frame, sizeof(frame));
  assert_true(raw_closed(fd));
  close(fd);

  fd = raw_connect(f);
  raw_hello_send(fd, f, TCP_VERSION);
  assert_int_equal(recv(fd, frame, 24, MSG_WAITALL), 24);
  assert_int_equal(frame[0], 9); /* CHALLENGE */
  put_hdr(frame, 10, 0, 8, 0, 0);
  raw_send(fd, frame, 24 + 8);
  assert_true(raw_closed(fd));
  close(fd);

  fd = raw_connect(f);
  raw_hello(fd, f);
  close(fd);
}

/* ---- protocol versions ------------------------------------------------- */

/* Frontends of older protocol versions are refused at their HELLO with a
 * reason that names both versions, before any operation: version 2 (no
 * producer epoch: it cannot be fenced; a shorter HELLO) and version 4
 * (the one before pushed answers: it would poll, and could not be told
 * the agent pushes). */
static void test_old_frontend_refused(void **state) {
  struct fx *f = *state;
  static const uint16_t old[] = {2, 4};
  for (size_t i = 0; i < sizeof(old) / sizeof(old[0]); i++) {
    uint8_t r[24];
    char why[200] = "", want[32];
    uint32_t len;
    uint64_t st;
    int fd = raw_connect(f);
    raw_hello_send(fd, f, old[i]);
    assert_int_equal(recv(fd, r, sizeof(r), MSG_WAITALL), 24);
    assert_int_equal(r[0], 2); /* HELLO_REPLY */
    memcpy(&st, r + 8, 8);
    assert_int_equal(le64toh(st), EPROTO);
    memcpy(&len, r + 4, 4);
    len = le32toh(len);
    assert_true(len > 0 && len < sizeof(why));
    assert_int_equal(recv(fd, why, len, MSG_WAITALL), (ssize_t)len);
    snprintf(want, sizeof(want), "version %u", old[i]);
    assert_non_null(strstr(why, want));
    snprintf(want, sizeof(want), "speaks %u", TCP_VERSION);
    assert_non_null(strstr(why, want));
    assert_true(raw_closed(fd));
    close(fd);
  }
}

/* An agent of another version that refuses this frontend's HELLO the way
 * this one refuses any version but its own (HELLO_REPLY, EPROTO, a
 * reason): connect fails with -EPROTO, no operation sent. A stand-in agent
 * on a thread answers so. (A real version-2 agent checks the HELLO's
 * length first and closes without a reply: connect then fails with
 * -ECONNRESET.) */
struct old_agent {
  int lfd;
  uint16_t seen_version;
  uint8_t seen_after; /* bytes after the HELLO before the close */
};

static void *old_agent_main(void *arg) {
  struct old_agent *o = arg;
  uint8_t in[24 + 40], out[24 + 64];
  const char *why = "bad magic 0x3154584c or version 5 (this agent speaks 4)";
  uint32_t l = (uint32_t)strlen(why);
  int fd = accept(o->lfd, NULL, NULL);
  if (fd < 0)
    return NULL;
  if (recv(fd, in, sizeof(in), MSG_WAITALL) == (ssize_t)sizeof(in)) {
    uint16_t v;
    memcpy(&v, in + 28, 2);
    o->seen_version = le16toh(v);
    put_hdr(out, 2, 0, l, EPROTO, 0);
    memcpy(out + 24, why, l);
    send(fd, out, 24 + l, MSG_NOSIGNAL);
    {
      struct pollfd p = {fd, POLLIN, 0};
      uint8_t b[64];
      if (poll(&p, 1, 500) > 0 && recv(fd, b, sizeof(b), 0) > 0)
        o->seen_after = 1;
    }
  }
  close(fd);
  return NULL;
}

/* A listening socket on 127.0.0.1 for a stand-in agent; d's locator
 * names it. */
static int stand_in_listen(struct lynx_region_desc *d) {
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof(a);
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(lfd >= 0);
  assert_int_equal(bind(lfd, (struct sockaddr *)&a, sizeof(a)), 0);
  assert_int_equal(listen(lfd, 1), 0);
  assert_int_equal(getsockname(lfd, (struct sockaddr *)&a, &al), 0);
  snprintf(d->locator, sizeof(d->locator), "127.0.0.1:%u", ntohs(a.sin_port));
  return lfd;
}

static void test_old_agent_refuses(void **state) {
  struct fx *f = *state;
  struct old_agent o = {0};
  struct lynx_region_desc d = f->d;
  pthread_t t;
  o.lfd = stand_in_listen(&d);
  assert_int_equal(pthread_create(&t, NULL, old_agent_main, &o), 0);
  expect_refused(&d, -EPROTO);
  pthread_join(t, NULL);
  close(o.lfd);
  assert_int_equal(o.seen_version, TCP_VERSION);
  assert_int_equal(o.seen_after, 0);
}

/* ---- a reply cut short ------------------------------------------------ */

/* A stand-in agent that passes the handshake for f's region, answers a
 * first READ of 256 bytes whole, with the bytes of a FENCED frame 64 bytes
 * into its payload, and a second READ of 64 bytes with its header and 10
 * bytes only, then closes. */
struct cut_agent {
  int lfd;
  const uint8_t *region;
};

static void *cut_agent_main(void *arg) {
  struct cut_agent *a = arg;
  uint8_t in[24 + 40], out[24 + 256];
  const size_t hl = sizeof(struct lynx_region_hdr);
  int fd = accept(a->lfd, NULL, NULL);
  if (fd < 0)
    return NULL;
  memset(out, 0, sizeof(out));
  if (recv(fd, in, sizeof(in), MSG_WAITALL) != (ssize_t)sizeof(in))
    goto out;
  put_hdr(out, 2, 0, 0, 0, 0); /* HELLO_REPLY: welcome */
  send(fd, out, 24, MSG_NOSIGNAL);
  if (recv(fd, in, 24, MSG_WAITALL) != 24) /* the header's READ */
    goto out;
  put_hdr(out, 5, 0, (uint32_t)hl, 0, 0);
  memcpy(out + 24, a->region, hl);
  send(fd, out, 24 + hl, MSG_NOSIGNAL);
  if (recv(fd, in, 24, MSG_WAITALL) != 24) /* read 1 */
    goto out;
  put_hdr(out, 5, 0, 256, 0, 1);
  memset(out + 24, 0, 256);
  put_hdr(out + 24 + 64, 8, 0, 6, ESTALE, 0);
  memcpy(out + 24 + 64 + 24, "phony!", 6);
  send(fd, out, 24 + 256, MSG_NOSIGNAL);
  if (recv(fd, in, 24, MSG_WAITALL) != 24) /* read 2 */
    goto out;
  put_hdr(out, 5, 0, 64, 0, 2);
  send(fd, out, 24 + 10, MSG_NOSIGNAL);
out:
  close(fd);
  return NULL;
}

/* An agent that closes in the middle of a reply: the frontend's read fails
 * with -ECONNRESET, judged on the bytes it received. A reproducer of the
 * fuzzer (tests/fuzz/corpus/tcp_frontend/crash-tc-dead-reads-past-a-cut-
 * reply): looking for a FENCED frame among them, tc_dead stepped over the
 * cut reply's announced length, past what it received, and read on in its
 * buffer, here into the previous reply's bytes, which held a FENCED
 * frame: the read failed with -ESTALE, the log quoted bytes no agent sent
 * as its reason, and past the buffer's end it read out of bounds. */
static void test_cut_reply_not_read_past(void **state) {
  struct fx *f = *state;
  struct cut_agent a = {.region = f->r.base};
  struct lynx_region_desc d = f->d;
  uint8_t b1[256], b2[64];
  uint64_t id = 0;
  pthread_t t;
  a.lfd = stand_in_listen(&d);
  assert_int_equal(pthread_create(&t, NULL, cut_agent_main, &a), 0);
  assert_int_equal(T->connect(&d, &f->c), 0);
  assert_int_equal(f->c->ops->read(f->c, 0, b1, sizeof(b1), 1), 0);
  assert_int_equal(f->c->ops->flush(f->c), 0);
  assert_int_equal(ut_poll_n(f->c, &id, 1), 1);
  assert_int_equal(id, 1);
  assert_int_equal(f->c->ops->read(f->c, 0, b2, sizeof(b2), 2), 0);
  assert_int_equal(f->c->ops->flush(f->c), 0);
  assert_int_equal(ut_poll_n(f->c, &id, 1), -ECONNRESET);
  ut_tconn_close(&f->c);
  pthread_join(t, NULL);
  close(a.lfd);
}

/* ---- device memory (a GPU's region, reached only through copies) ---- */

struct fake_dev {
  uint8_t *mem; /* not region.base: the transport may not touch it */
  uint64_t size;
  int writes, reads, releases;
  uint64_t last_off; /* the most recent write */
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
  struct lynx_region_mem mem = {.kind = "fake",
                                .write = fake_write,
                                .read = fake_read,
                                .reg_mr = fake_reg_mr,
                                .release = fake_release,
                                .ctx = &dev};
  struct lynx_region r = {.fd = -1};
  struct lynx_region_desc d;
  struct lynx_tconn *c;
  struct lynx_geom g;
  uint8_t pay[64], back[64];
  uint64_t ids[1];
  struct iovec iov = {pay, sizeof(pay)};
  (void)state;
  assert_int_equal(lynx_geom_init(&g, Q, S, Z, 0), 0);
  dev.size = g.region_size;
  dev.mem = calloc(1, g.region_size);
  assert_non_null(dev.mem);
  assert_int_equal(T->region_attach(g_ta, &r, "ut-dev", g.region_size, &mem),
                   0);
  assert_null(r.base);
  assert_int_equal(
      lynx_region_format(&r, Q, S, Z, 0, LYNX_ORDER_FENCED, EPOCH, 7), 0);
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
  assert_int_equal(
      c->ops->writev(c, lynx_rx_ring_off(&g, 1), &iov, 1, LYNX_WR_PUBLISH), 0);
  assert_int_equal(
      c->ops->read(c, lynx_rx_ring_off(&g, 1), back, sizeof(back), 42), 0);
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
    assert_int_equal(
        shm->region_attach(NULL, &r2, "ut-dev", g.region_size, &mem), -ENOTSUP);
    assert_int_equal(dev.releases, 2);
  }
  free(dev.mem);
}

/* ---- device memory with batches -------------------------------------- */

/* A device whose copies run in order but complete only at flush, the way
 * a GPU's stream does: write_start queues its bytes, read_start queues a
 * copy into a small staging area that holds garbage until the flush, and
 * single writes and reads complete the queue first. */
#define BD_STAGE 1024u
#define BD_QMAX 256

struct bdev_op {
  int write;
  uint64_t off;
  size_t len;
  uint8_t *data; /* write: its bytes; read: where in stage */
};

struct bdev {
  struct fake_dev d;
  uint8_t stage[BD_STAGE];
  size_t staged; /* stage bytes this batch's reads took */
  int handed;    /* the last flush handed reads over: stage reused next */
  struct bdev_op q[BD_QMAX];
  int nq;
  int write_starts, read_starts, flushes, fail_flush;
  int reads_max;     /* the most reads one flush completed */
  int publish_words; /* publishing writes seen */
};

static void bd_complete(struct bdev *b) {
  int reads = 0;
  for (int i = 0; i < b->nq; i++) {
    struct bdev_op *o = &b->q[i];
    if (o->write) {
      memcpy(b->d.mem + o->off, o->data, o->len);
      free(o->data);
    } else {
      memcpy(o->data, b->d.mem + o->off, o->len);
      reads++;
    }
  }
  b->nq = 0;
  if (reads > b->reads_max)
    b->reads_max = reads;
}

static int bd_write(void *ctx, uint64_t off, const void *src, size_t len) {
  bd_complete(ctx);
  return fake_write(&((struct bdev *)ctx)->d, off, src, len);
}

static int bd_read(void *ctx, uint64_t off, void *dst, size_t len) {
  bd_complete(ctx);
  return fake_read(&((struct bdev *)ctx)->d, off, dst, len);
}

static void bd_next(struct bdev *b) {
  if (b->handed) {
    b->handed = 0;
    b->staged = 0;
    memset(b->stage, 0xEE, sizeof(b->stage)); /* used: gone */
  }
}

static int bd_write_start(void *ctx, uint64_t off, const void *src, size_t len,
                          unsigned flags) {
  struct bdev *b = ctx;
  struct bdev_op *o;
  bd_next(b);
  if (off > b->d.size || len > b->d.size - off)
    return -EFAULT;
  if (b->nq == BD_QMAX)
    bd_complete(b); /* not a flush: reads stay the caller's to use later */
  o = &b->q[b->nq++];
  o->write = 1;
  o->off = off;
  o->len = len;
  o->data = malloc(len ? len : 1);
  assert_non_null(o->data);
  memcpy(o->data, src, len);
  b->write_starts++;
  b->publish_words += !!(flags & LYNX_WR_PUBLISH);
  return 0;
}

static int bd_read_start(void *ctx, uint64_t off, size_t len,
                         const void **bytes) {
  struct bdev *b = ctx;
  struct bdev_op *o;
  bd_next(b);
  if (off > b->d.size || len > b->d.size - off)
    return -EFAULT;
  if (len > BD_STAGE)
    return -E2BIG;
  if (b->staged + len > BD_STAGE || b->nq == BD_QMAX)
    return -ENOBUFS;
  o = &b->q[b->nq++];
  o->write = 0;
  o->off = off;
  o->len = len;
  o->data = b->stage + b->staged;
  memset(o->data, 0xEE, len); /* not there before the flush */
  b->staged += len;
  *bytes = o->data;
  b->read_starts++;
  return 0;
}

static int bd_flush(void *ctx) {
  struct bdev *b = ctx;
  b->flushes++;
  bd_complete(b);
  b->handed = 1;
  return b->fail_flush ? -EIO : 0;
}

/* A region whose memory takes batches: what one frontend flush sends is
 * one batch (one flush of the memory), answered in order, each read seeing
 * exactly the writes before it; reads beyond the staging end the batch
 * early, one larger than the staging is a single read; a flush that fails
 * closes the connection. */
static void test_device_memory_batches(void **state) {
  struct bdev *b = calloc(1, sizeof(*b));
  struct lynx_region_mem mem = {.kind = "fake",
                                .write = bd_write,
                                .read = bd_read,
                                .write_start = bd_write_start,
                                .read_start = bd_read_start,
                                .flush = bd_flush,
                                .reg_mr = fake_reg_mr,
                                .release = fake_release,
                                .ctx = b};
  struct lynx_region r = {.fd = -1};
  struct lynx_region_desc d;
  struct lynx_tconn *c;
  struct lynx_geom g;
  uint8_t x[48], y[48], bx[48], by[48], big[BD_STAGE + 16];
  uint8_t small[40][32];
  uint64_t ids[40], rx0, rx1;
  struct iovec ix = {x, sizeof(x)}, iy = {y, sizeof(y)};
  int reads0, flushes0;
  (void)state;
  assert_non_null(b);
  assert_int_equal(lynx_geom_init(&g, Q, S, Z, 0), 0);
  assert_true(g.region_size > sizeof(big) + 64);
  b->d.size = g.region_size;
  b->d.mem = calloc(1, g.region_size);
  assert_non_null(b->d.mem);
  for (uint64_t i = 0; i < g.region_size; i++)
    if (i >= sizeof(struct lynx_region_hdr))
      b->d.mem[i] = (uint8_t)(i * 13 + 5);
  assert_int_equal(T->region_attach(g_ta, &r, "ut-bdev", g.region_size, &mem),
                   0);
  assert_int_equal(
      lynx_region_format(&r, Q, S, Z, 0, LYNX_ORDER_FENCED, EPOCH, 7), 0);
  assert_int_equal(T->region_export(&r), 0);
  ut_desc_fill(&d, "tcp", r.locator, &g, 7, EPOCH, LYNX_ORDER_FENCED);
  d.key = r.key;
  assert_int_equal(T->connect(&d, &c), 0); /* its header read: a batch */
  assert_true(b->flushes >= 1);

  /* write x, read, write y, read, a read too large to stage: one buffer */
  memset(x, 0x11, sizeof(x));
  memset(y, 0x22, sizeof(y));
  rx0 = lynx_rx_ring_off(&g, 0);
  rx1 = lynx_rx_ring_off(&g, 1);
  flushes0 = b->flushes;
  reads0 = __atomic_load_n(&b->d.reads, __ATOMIC_SEQ_CST);
  assert_int_equal(c->ops->writev(c, rx0, &ix, 1, LYNX_WR_PUBLISH), 0);
  assert_int_equal(c->ops->read(c, rx0, bx, sizeof(bx), 1), 0);
  assert_int_equal(c->ops->writev(c, rx0, &iy, 1, 0), 0);
  assert_int_equal(c->ops->read(c, rx0, by, sizeof(by), 2), 0);
  assert_int_equal(c->ops->read(c, 0, big, sizeof(big), 3), 0);
  assert_int_equal(c->ops->flush(c), 0);
  assert_int_equal(ut_poll_n(c, ids, 3), 3);
  assert_int_equal(ids[0], 1);
  assert_int_equal(ids[1], 2);
  assert_int_equal(ids[2], 3);
  assert_memory_equal(bx, x, sizeof(x)); /* before y was written */
  assert_memory_equal(by, y, sizeof(y));
  assert_memory_equal(big, b->d.mem, sizeof(big));
  assert_memory_equal(b->d.mem + rx0, y, sizeof(y));
  assert_int_equal(b->flushes, flushes0 + 1);
  assert_int_equal(b->write_starts, 2);
  assert_int_equal(b->publish_words, 1);
  /* the large read went alone, the others through the batch */
  assert_int_equal(__atomic_load_n(&b->d.reads, __ATOMIC_SEQ_CST), reads0 + 1);

  /* 40 reads in one buffer: the staging holds 32, so the batch ends once
   * early; every reply in order with its own bytes */
  flushes0 = b->flushes;
  for (int i = 0; i < 40; i++)
    assert_int_equal(c->ops->read(c, rx1 + (uint64_t)i * 32, small[i], 32,
                                  100 + (uint64_t)i),
                     0);
  assert_int_equal(c->ops->flush(c), 0);
  assert_int_equal(ut_poll_n(c, ids, 40), 40);
  for (int i = 0; i < 40; i++) {
    assert_int_equal(ids[i], 100 + (uint64_t)i);
    assert_memory_equal(small[i], b->d.mem + rx1 + (uint64_t)i * 32, 32);
  }
  assert_true(b->flushes >= flushes0 + 2);
  assert_int_equal(b->reads_max, BD_STAGE / 32);

  /* a batch that fails closes that connection, with a reason */
  b->fail_flush = 1;
  assert_int_equal(c->ops->read(c, rx0, bx, 8, 5), 0);
  assert_int_equal(c->ops->flush(c), 0);
  assert_true(ut_poll_n(c, ids, 1) < 0);
  b->fail_flush = 0;
  c->ops->close(c);
  T->region_free(&r);
  assert_int_equal(releases_after(&b->d, 1), 1);
  bd_complete(b);
  free(b->d.mem);
  free(b);
}

/* ---- a region served by tcp and shm at once (--transport auto) --------- */

/* Until c reports a failure: what it reported (a dead connection's error),
 * or 0 when it still worked after 2 s. Each round posts a read. */
static int until_dead(struct lynx_tconn *c, const struct lynx_geom *g) {
  uint64_t end = lynx_now_ns() + 2000000000ull, id;
  uint8_t word[8];
  while (lynx_now_ns() < end) {
    int rc = c->ops->read(c, lynx_actrl_off(g, 0), word, sizeof(word), 5);
    if (!rc)
      rc = c->ops->flush(c);
    if (!rc)
      rc = c->ops->poll(c, &id, 1);
    if (rc < 0)
      return rc;
    usleep(1000);
  }
  return 0;
}

/* One region, two transports, one fence. An agent handle created with
 * share makes each host-memory region a shared-memory file as well
 * (region.shm, named after the region); a frontend writing through shm
 * and one writing through tcp see the same bytes. Fencing by frontend
 * epoch holds across the two: a local frontend's takeover (its CAS of the
 * header word) cuts the tcp connections of older epochs at their next
 * batch, and is not undone by an older tcp frontend (the agent adopts the
 * word before it admits: epoch 2 is refused after shm took epoch 3); a
 * tcp takeover CAS-maxes the word, so the shm frontend is fenced at its
 * next call. region_free unlinks the file; a file that cannot be made
 * leaves the region private (served over tcp alone); an unshared
 * handle's regions have none. */
static void test_shared_region(void **state) {
  const struct lynx_transport_ops *shm = lynx_transport_find("shm");
  struct lynx_transport_agent *ta = NULL;
  struct lynx_region r = {.fd = -1}, plain = {.fd = -1};
  struct lynx_region_desc d, ds, dp;
  struct lynx_tconn *c1 = NULL, *cs = NULL, *c4 = NULL;
  struct lynx_fence_stats st;
  struct lynx_geom g;
  char name[64];
  const char req[] = "written over shm, read over tcp";
  uint8_t back[sizeof(req)];
  struct iovec iov = {(void *)req, sizeof(req)};
  uint64_t id;
  (void)state;
  assert_int_equal(lynx_geom_init(&g, Q, S, Z, 0), 0);
  assert_int_equal(ut_agent_create("tcp",
                                   &(struct lynx_transport_opts){
                                       .listen = "127.0.0.1:0", .share = 1},
                                   &T, &ta),
                   0);
  snprintf(name, sizeof(name), "ut-share-%d", (int)getpid());
  assert_int_equal(
      ut_region_serve(T, ta, &r, name, &g, LYNX_ORDER_COALESCED, EPOCH, 0, &d),
      0);
  assert_true(r.shm[0] == '/' && strcmp(r.shm + 1, name) == 0);
  ut_desc_fill(&ds, "shm", r.shm, &g, 0, EPOCH, LYNX_ORDER_COALESCED);

  d.producer = 1;
  ut_connect_ok(T->connect, &d, &c1);
  ds.producer = 1; /* the same frontend epoch: both admitted */
  ut_connect_ok(shm->connect, &ds, &cs);
  assert_int_equal(cs->ops->writev(cs, lynx_rx_ring_off(&g, 1), &iov, 1, 0), 0);
  assert_int_equal(cs->ops->flush(cs), 0);
  assert_int_equal(
      c1->ops->read(c1, lynx_rx_ring_off(&g, 1), back, sizeof(back), 9), 0);
  assert_int_equal(c1->ops->flush(c1), 0);
  assert_int_equal(ut_poll_n(c1, &id, 1), 1);
  assert_memory_equal(back, req, sizeof(req));
  ut_tconn_close(&cs);

  /* shm takes over with epoch 3: tcp's epoch 1 is cut */
  ds.producer = 3;
  ut_connect_ok(shm->connect, &ds, &cs);
  assert_int_equal(until_dead(c1, &g), -ESTALE);
  lynx_region_fence_stats(&r, &st);
  assert_true(st.fence == 3 && st.cut == 1);
  /* an older tcp frontend cannot undo it */
  d.producer = 2;
  ut_expect_refused(T->connect, &d, -ESTALE);
  assert_true(*(const uint64_t *)(r.base + LYNX_OFF_FENCE) == 3);
  assert_int_equal(cs->ops->flush(cs), 0);

  /* tcp takes over with epoch 4: the shm frontend is fenced */
  d.producer = 4;
  ut_connect_ok(T->connect, &d, &c4);
  assert_true(*(const uint64_t *)(r.base + LYNX_OFF_FENCE) == 4);
  assert_int_equal(cs->ops->flush(cs), -ESTALE);
  ds.producer = 3;
  ut_expect_refused(shm->connect, &ds, -ESTALE);
  assert_int_equal(until_dead(c4, &g), 0); /* the newest goes on */

  /* the file goes with the region; its mapping stays with whoever has it */
  ut_tconn_close(&c1);
  ut_tconn_close(&c4);
  T->region_free(&r);
  snprintf(name, sizeof(name), "/ut-share-%d", (int)getpid());
  assert_true(shm_open(name, O_RDWR, 0) < 0 && errno == ENOENT);
  ut_tconn_close(&cs);

  /* a file that cannot be made (here: the name is taken) leaves the
   * region private, still served over tcp */
  {
    struct lynx_region r2 = {.fd = -1};
    struct lynx_region_desc d2;
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ut_region_serve(T, ta, &r2, name + 1, &g,
                                     LYNX_ORDER_COALESCED, EPOCH, 0, &d2),
                     0);
    assert_string_equal(r2.shm, "");
    d2.producer = 5;
    ut_connect_ok(T->connect, &d2, &c1);
    ut_tconn_close(&c1);
    T->region_free(&r2);
    /* the file was never the region's: left as it was */
    close(fd);
    assert_int_equal(shm_unlink(name), 0);
  }
  T->agent_destroy(ta);

  /* an unshared handle (the file's handle g_ta): anonymous memory */
  assert_int_equal(ut_region_serve(T, g_ta, &plain, "ut-plain", &g,
                                   LYNX_ORDER_COALESCED, EPOCH, 0, &dp),
                   0);
  assert_string_equal(plain.shm, "");
  T->region_free(&plain);
}

#define T_(fn) cmocka_unit_test_setup_teardown(fn, fx_setup, fx_teardown)

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      T_(test_connect_nobody_listening),
      T_(test_agent_closes_on_bad_frames),
      T_(test_bad_peer_does_not_hurt_others),
      T_(test_hello_length_checked_first),
      T_(test_key_proof),
      T_(test_read_tx_exact),
      T_(test_read_tx_refused),
      cmocka_unit_test(test_read_tx_large),
      T_(test_old_frontend_refused),
      T_(test_fence_on_the_wire),
      T_(test_old_agent_refuses),
      T_(test_cut_reply_not_read_past),
      cmocka_unit_test(test_device_memory_region),
      cmocka_unit_test(test_device_memory_batches),
      cmocka_unit_test(test_shared_region),
  };
  return LYNX_UT_MAIN(argc, argv, "tests", tests, group_setup, group_teardown);
}
