/* test_rxring.c - unit tests of frontend/rxring.c over loopback UDP.
 * Skipped (77) where this process cannot use io_uring (its probe says
 * why). */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "rxring.h"
#include "ut_main.h"

#define MAXD 512

/* What the ring delivered: each datagram's size, first byte, sender
 * port, truncation. */
struct got {
  unsigned n;
  size_t len[MAXD];
  int first[MAXD], trunc[MAXD];
  uint16_t port[MAXD];
};

struct fx {
  int rx, tx; /* the ring's socket, the sender */
  struct sockaddr_in to;
  struct lynx_rxring r;
  int ring_up;
  uint8_t *buf;
  struct got g;
};

static void on_dgram(void *arg, const void *data, size_t len,
                     const struct sockaddr *from, int truncated) {
  struct got *g = arg;
  if (g->n >= MAXD)
    return;
  g->len[g->n] = len;
  g->first[g->n] = len ? ((const uint8_t *)data)[0] : -1;
  g->trunc[g->n] = truncated;
  g->port[g->n] = from->sa_family == AF_INET
                      ? ntohs(((const struct sockaddr_in *)from)->sin_port)
                      : 0;
  g->n++;
}

static int udp_bound(struct sockaddr_in *a) {
  socklen_t alen = sizeof(*a);
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), big;
  assert_true(s >= 0);
  memset(a, 0, sizeof(*a));
  a->sin_family = AF_INET;
  a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(bind(s, (struct sockaddr *)a, sizeof(*a)), 0);
  assert_int_equal(getsockname(s, (struct sockaddr *)a, &alen), 0);
  big = 8 << 20; /* room for the burst tests' datagrams */
  setsockopt(s, SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof(big));
  setsockopt(s, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
  return s;
}

static int fx_setup(void **state) {
  char why[320];
  struct fx *f;
  struct sockaddr_in a;
  if (lynx_rxring_probe(why, sizeof(why)) != 0) {
    printf("SKIP: io_uring cannot receive here: %s\n", why);
    *state = NULL;
    return 0;
  }
  f = calloc(1, sizeof(*f));
  assert_non_null(f);
  f->buf = calloc(1, 65536);
  assert_non_null(f->buf);
  f->rx = udp_bound(&f->to);
  f->tx = udp_bound(&a);
  assert_int_equal(lynx_rxring_init(&f->r, f->rx), 0);
  f->ring_up = 1;
  *state = f;
  return 0;
}

static int fx_teardown(void **state) {
  struct fx *f = *state;
  if (!f)
    return 0;
  if (f->ring_up)
    lynx_rxring_free(&f->r);
  close(f->rx);
  close(f->tx);
  free(f->buf);
  free(f);
  return 0;
}

static struct fx *fx_get(void **state) {
  if (!*state)
    skip();
  return *state;
}

static void send_len(struct fx *f, size_t len, int first) {
  if (len)
    f->buf[0] = (uint8_t)first;
  assert_int_equal(
      sendto(f->tx, f->buf, len, 0, (struct sockaddr *)&f->to, sizeof(f->to)),
      (ssize_t)len);
}

/* Polls until want datagrams were delivered (at most 2 s). */
static void harvest(struct fx *f, unsigned want, unsigned max) {
  for (int i = 0; i < 200 && f->g.n < want; i++) {
    struct pollfd p = {lynx_rxring_fd(&f->r), POLLIN, 0};
    int rc = lynx_rxring_poll(&f->r, max, on_dgram, &f->g);
    assert_true(rc >= 0);
    if (f->g.n < want)
      poll(&p, 1, 10);
  }
  assert_int_equal(f->g.n, want);
}

/* Sizes from empty to UDP's largest, each whole and from its sender. */
static void test_sizes(void **state) {
  struct fx *f = fx_get(state);
  static const size_t sizes[] = {0, 1, 14, 1400, 2032, 9000, 65507};
  const unsigned n = sizeof(sizes) / sizeof(sizes[0]);
  struct sockaddr_in a;
  socklen_t alen = sizeof(a);
  assert_int_equal(getsockname(f->tx, (struct sockaddr *)&a, &alen), 0);
  assert_true(lynx_rxring_poll(&f->r, 16, on_dgram, &f->g) >= 0); /* arm */
  for (unsigned i = 0; i < n; i++)
    send_len(f, sizes[i], (int)i + 1);
  harvest(f, n, 16);
  for (unsigned i = 0; i < n; i++) {
    assert_int_equal(f->g.len[i], sizes[i]);
    assert_int_equal(f->g.first[i], sizes[i] ? (int)i + 1 : -1);
    assert_int_equal(f->g.trunc[i], 0);
    assert_int_equal(f->g.port[i], ntohs(a.sin_port));
  }
  /* arming was the only system call: at the start, and after the empty
   * datagram (the kernel ends a multishot receive on a 0-byte payload) */
  assert_int_equal(f->r.enters, 2);
  assert_int_equal(f->r.nobufs, 0);
}

/* More datagrams than buffers, none harvested meanwhile: the receive ends
 * for want of buffers, is armed again once they are back, and every
 * datagram still arrives, in order. */
static void test_out_of_buffers(void **state) {
  struct fx *f = fx_get(state);
  const unsigned n = LYNX_RXRING_BUFS + 72;
  struct pollfd p;
  assert_true(lynx_rxring_poll(&f->r, MAXD, on_dgram, &f->g) >= 0);
  for (unsigned i = 0; i < n; i++)
    send_len(f, 64, (int)(i & 0xff));
  /* the kernel fills every buffer before the first harvest */
  p = (struct pollfd){lynx_rxring_fd(&f->r), POLLIN, 0};
  for (int i = 0; i < 100 && io_uring_cq_ready(&f->r.ring) <= LYNX_RXRING_BUFS;
       i++)
    poll(&p, 1, 10);
  harvest(f, n, MAXD);
  for (unsigned i = 0; i < n; i++)
    assert_int_equal(f->g.first[i], (int)(i & 0xff));
  assert_true(f->r.nobufs >= 1);
  assert_int_equal(f->r.enters, 1 + f->r.nobufs);
}

/* Bounded work: at most max per call, the rest at the next. */
static void test_bounded(void **state) {
  struct fx *f = fx_get(state);
  struct pollfd p;
  assert_true(lynx_rxring_poll(&f->r, 4, on_dgram, &f->g) >= 0);
  for (unsigned i = 0; i < 10; i++)
    send_len(f, 20, (int)i);
  p = (struct pollfd){lynx_rxring_fd(&f->r), POLLIN, 0};
  for (int i = 0; i < 100 && io_uring_cq_ready(&f->r.ring) < 10; i++)
    poll(&p, 1, 10);
  assert_int_equal(lynx_rxring_poll(&f->r, 4, on_dgram, &f->g), 4);
  harvest(f, 10, 4);
  for (unsigned i = 0; i < 10; i++)
    assert_int_equal(f->g.first[i], (int)i);
}

/* The ring's fd wakes a sleeper on a datagram. */
static void test_fd_wakes(void **state) {
  struct fx *f = fx_get(state);
  struct pollfd p;
  assert_int_equal(lynx_rxring_poll(&f->r, 8, on_dgram, &f->g), 0);
  p = (struct pollfd){lynx_rxring_fd(&f->r), POLLIN, 0};
  assert_int_equal(poll(&p, 1, 0), 0); /* nothing yet */
  send_len(f, 5, 9);
  assert_int_equal(poll(&p, 1, 2000), 1);
  assert_int_equal(lynx_rxring_poll(&f->r, 8, on_dgram, &f->g), 1);
  assert_int_equal(f->g.first[0], 9);
}

/* Freed with its receive armed and datagrams queued: cancelled, nothing
 * left behind (ASan), the socket still usable; freeing twice is a no-op. */
static void test_free_armed(void **state) {
  struct fx *f = fx_get(state);
  char b[8];
  assert_true(lynx_rxring_poll(&f->r, 8, on_dgram, &f->g) >= 0);
  send_len(f, 3, 1);
  lynx_rxring_free(&f->r);
  lynx_rxring_free(&f->r);
  f->ring_up = 0;
  assert_int_equal(lynx_rxring_fd(&f->r), -1);
  assert_int_equal(lynx_rxring_poll(&f->r, 8, on_dgram, &f->g), -EINVAL);
  send_len(f, 4, 2);
  usleep(20000);
  /* the socket reads on without the ring (the first datagram may have
   * gone to the ring before the cancel) */
  assert_true(recv(f->rx, b, sizeof(b), 0) >= 3);
  /* a ring set up again on the same socket receives */
  assert_int_equal(lynx_rxring_init(&f->r, f->rx), 0);
  f->ring_up = 1;
  assert_true(lynx_rxring_poll(&f->r, 8, on_dgram, &f->g) >= 0);
  f->g.n = 0;
  send_len(f, 6, 7);
  harvest(f, 1, 8);
  assert_int_equal(f->g.len[0], 6);
}

/* A ring whose receive keeps failing (not a socket) says so. */
static void test_error_gives_up(void **state) {
  struct fx *f = fx_get(state);
  struct lynx_rxring r;
  int p[2], rc = 0;
  assert_int_equal(pipe(p), 0);
  assert_int_equal(lynx_rxring_init(&r, p[0]), 0);
  for (int i = 0; i < 100 && rc >= 0; i++) {
    struct pollfd pfd = {lynx_rxring_fd(&r), POLLIN, 0};
    rc = lynx_rxring_poll(&r, 8, on_dgram, &f->g);
    if (rc >= 0)
      poll(&pfd, 1, 10);
  }
  assert_int_equal(rc, -ENOTSOCK); /* the completions' own error */
  assert_int_equal(f->g.n, 0);
  assert_true(r.errors >= 8);
  lynx_rxring_free(&r);
  close(p[0]);
  close(p[1]);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_sizes, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_out_of_buffers, fx_setup,
                                      fx_teardown),
      cmocka_unit_test_setup_teardown(test_bounded, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_fd_wakes, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_free_armed, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_error_gives_up, fx_setup,
                                      fx_teardown),
  };
  return LYNX_UT_MAIN(argc, argv, "rxring", tests, NULL, NULL);
}
