/*
 * fuzz_tcp_frontend.c - the frontend side of the tcp transport
 * (transport/tcp_frontend.c: tc_handshake, lynx__tcp_poll, tc_take_tx,
 * tc_dead), through its public API: the harness listens on 127.0.0.1 as
 * a fake agent whose answers are the input, connects to it with
 * lynx_transport_tcp.connect, posts reads, compound reads (READ_TX) and
 * a subscription (SUBSCRIBE: then PUSH frames in the input are applied),
 * and polls until every one is reported or the connection fails.
 *
 * Input: a byte choosing the region the descriptor describes
 * (tcp_fuzz.h); a byte whose low 3 bits say how many operations are
 * posted and whose bit 3 has the agent answer the HELLO with the input at
 * once (else it first challenges the frontend as a version 4 agent does:
 * CHALLENGE, the PROOF checked, which no input could make); per operation
 * a byte (bit 0: a compound read of every mqueue from position u8, or with
 * bit 1 a subscription of every mqueue from there, the first only; else a
 * read at u16 offset of u16 bytes, both taken modulo the region); then
 * what the agent sends: its HELLO_REPLY, the READ_RESP of the region
 * header the handshake reads, then the answers (wr_id i + 1 for the
 * operation i).
 *
 * Checked besides memory errors (every buffer the reads fill is its exact
 * size on the heap): the frontend's HELLO names the region by its id and
 * its PROOF answers the challenge with the key; reads are reported once
 * each, in the order posted; a compound read never reports more slots
 * than were asked for; a push moves nothing unless the subscription was
 * accepted, and every large message it says it brought lies inside the
 * large area (every buffer it fills is its exact size on the heap).
 */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz.h"
#include "tcp_fuzz.h"
#include "transport.h"
#include "util.h"

#define SESSION_NS (20ull * 1000000000ull)
#define OPS_MAX 7

/* The fake agent: takes one connection, challenges it (unless told not
 * to), sends the input's answers, then reads (and drops) what the
 * frontend sends until it closes. */
struct agent {
  int lfd;
  int challenge;
  const struct lynx_region_desc *d; /* what the frontend connects with */
  const uint8_t *out;
  size_t n;
};

/* A version 4 agent's side of the handshake: the frontend's HELLO must be
 * the one for a->d, its PROOF the one for this CHALLENGE. A frontend that
 * gave up (closed, or went quiet) ends it without a check. */
static void challenge(int fd, const struct agent *a, uint64_t end) {
  static const uint8_t nonce[LYNX_TCP_NONCE] = "a fixed nonce: any will do";
  uint8_t hello[TCP_HDR + FZ_TCP_HELLO], want[TCP_HDR + FZ_TCP_HELLO];
  uint8_t proof[TCP_HDR + LYNX_TCP_PROOF], right[sizeof(proof)];
  uint8_t ask[TCP_HDR + LYNX_TCP_NONCE];
  if (fz_tcp_recv(fd, hello, sizeof(hello), end))
    return;
  fz_tcp_hello(want, a->d->key, a->d->region_size, a->d->producer);
  FZ_CHECK(!memcmp(hello, want, sizeof(want)));
  fz_tcp_hdr(ask, OP_CHALLENGE, 0, LYNX_TCP_NONCE, 0, 0);
  memcpy(ask + TCP_HDR, nonce, LYNX_TCP_NONCE);
  if (fz_tcp_send(fd, ask, sizeof(ask)) ||
      fz_tcp_recv(fd, proof, sizeof(proof), end))
    return;
  FZ_CHECK(fz_tcp_proof(right, a->d->key, nonce, want) == 0);
  FZ_CHECK(!memcmp(proof, right, sizeof(right)));
}

static void *agent_main(void *arg) {
  struct agent *a = arg;
  uint64_t end = lynx_now_ns() + SESSION_NS;
  size_t sent = 0;
  struct linger lg = {1, 0};
  int fd = -1, shut = 0;
  struct pollfd lp = {a->lfd, POLLIN, 0};
  uint8_t buf[65536]; /* (out of the loop: ASan poisons a scope's locals) */
  if (poll(&lp, 1, (int)(SESSION_NS / 1000000u)) <= 0 ||
      (fd = accept(a->lfd, NULL, NULL)) < 0)
    return NULL; /* the harness gave up on connecting */
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
  if (a->challenge)
    challenge(fd, a, end);
  while (lynx_now_ns() < end) {
    struct pollfd p = {fd, POLLIN | (sent < a->n ? POLLOUT : 0), 0};
    ssize_t k;
    if (sent == a->n && !shut) {
      shutdown(fd, SHUT_WR);
      shut = 1;
    }
    if (poll(&p, 1, 100) <= 0)
      continue;
    if (p.revents & POLLOUT) {
      k = send(fd, a->out + sent, a->n - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (k > 0)
        sent += (size_t)k;
      else if (k < 0 && errno != EAGAIN && errno != EINTR)
        sent = a->n;
    }
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      k = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR))
        break;
    }
  }
  close(fd);
  return NULL;
}

struct op {
  int compound;
  struct lynx_push push; /* a subscription's, sub: one per mqueue */
  struct lynx_tx_sub *sub;
  uint64_t off;
  size_t len;
  uint8_t *dst;            /* a read's bytes, or a compound's array */
  struct lynx_tx_read *tx; /* a compound's entries, one per mqueue */
  int done;
};

static void ops_free(struct op *ops, int n, const struct lynx_geom *g) {
  for (int i = 0; i < n; i++) {
    free(ops[i].dst);
    for (uint32_t q = 0; ops[i].tx && q < g->n_mqueues; q++)
      free(ops[i].tx[q].dst);
    free(ops[i].tx);
    for (uint32_t q = 0; ops[i].sub && q < g->n_mqueues; q++) {
      free(ops[i].sub[q].ring);
      free(ops[i].sub[q].large);
      free(ops[i].sub[q].lmsg);
    }
    free(ops[i].sub);
  }
}

/* What a subscription's pushes left: nothing unless it was accepted, and
 * every large message recorded inside the large area. */
static void check_push(const struct op *o, const struct lynx_geom *g) {
  for (uint32_t q = 0; o->sub && q < g->n_mqueues; q++) {
    const struct lynx_tx_sub *t = &o->sub[q];
    FZ_CHECK(o->push.state == 1 || t->prod == t->from);
    for (uint32_t p = 0; t->lmsg && p < g->slots; p++)
      FZ_CHECK(t->lmsg[p].len <= g->large_bytes &&
               t->lmsg[p].off <= g->large_bytes - t->lmsg[p].len);
  }
}

/* Posts a subscription of every mqueue from position from (the one
 * subscription a connection takes; later ones are refused, -EALREADY). */
static int post_sub(struct lynx_tconn *c, struct op *o, uint32_t from, int i,
                    const struct lynx_geom *g) {
  o->sub = calloc(g->n_mqueues, sizeof(*o->sub));
  if (!o->sub)
    return -1;
  for (uint32_t q = 0; q < g->n_mqueues; q++) {
    struct lynx_tx_sub *t = &o->sub[q];
    t->q = q;
    t->from = from;
    t->ring = malloc(g->slots_bytes);
    t->large = g->large_bytes ? malloc(g->large_bytes) : NULL;
    t->lmsg = g->large_bytes ? calloc(g->slots, sizeof(*t->lmsg)) : NULL;
    if (!t->ring || (g->large_bytes && (!t->large || !t->lmsg)))
      return -1;
  }
  o->push = (struct lynx_push){o->sub, (int)g->n_mqueues, 0};
  return c->ops->subscribe(c, &o->push, (uint64_t)i + 1) ? -1 : 0;
}

/* Posts operation i (wr_id i + 1): 0, or -1 when it could not be. */
static int post(struct lynx_tconn *c, struct op *o, int i, struct fz *f,
                const struct lynx_geom *g) {
  uint8_t kind = fz_u8(f);
  if ((kind & 3) == 3)
    return post_sub(c, o, fz_u8(f), i, g);
  if (kind & 1) {
    uint32_t from = fz_u8(f);
    o->compound = 1;
    o->dst = malloc(8u * g->n_mqueues);
    o->tx = calloc(g->n_mqueues, sizeof(*o->tx));
    if (!o->dst || !o->tx)
      return -1;
    for (uint32_t q = 0; q < g->n_mqueues; q++) {
      o->tx[q] = (struct lynx_tx_read){q, from, g->slots, 0, NULL};
      o->tx[q].dst = malloc((size_t)g->slots * g->slot_size);
      if (!o->tx[q].dst)
        return -1;
    }
    return c->ops->read_tx(c, o->dst, o->tx, (int)g->n_mqueues, (uint64_t)i + 1)
               ? -1
               : 0;
  }
  o->off = fz_u16(f) % g->region_size;
  o->len = 1 + fz_u16(f) % (g->region_size - o->off);
  o->dst = malloc(o->len);
  if (!o->dst)
    return -1;
  return c->ops->read(c, o->off, o->dst, o->len, (uint64_t)i + 1) ? -1 : 0;
}

/* Polls until every posted read is reported or the connection fails. */
static void reap(struct lynx_tconn *c, struct op *ops, int n,
                 const struct lynx_geom *g) {
  uint64_t end = lynx_now_ns() + SESSION_NS;
  int next = 0;
  while (next < n && lynx_now_ns() < end) {
    uint64_t ids[OPS_MAX];
    struct pollfd p = {c->ops->wait_fd(c), POLLIN, 0};
    int k = c->ops->poll(c, ids, OPS_MAX);
    for (int i = 0; i < n; i++)
      check_push(&ops[i], g);
    if (k < 0)
      return;
    FZ_CHECK(k <= n - next);
    for (int i = 0; i < k; i++, next++) {
      FZ_CHECK(ids[i] == (uint64_t)next + 1); /* once each, in order */
      ops[next].done = 1;
      for (uint32_t q = 0; ops[next].tx && q < g->n_mqueues; q++)
        FZ_CHECK(ops[next].tx[q].got <= ops[next].tx[q].max);
    }
    if (!k)
      poll(&p, 1, 100);
  }
  FZ_CHECK(next == n || lynx_now_ns() < end); /* it ended, one way or another */
}

/* The fake agent's listening socket on 127.0.0.1 (*sin: where), on the
 * port the last input's listened on when it is free again: the frontend
 * closes its connection first, leaving it in TIME_WAIT for a minute, each
 * holding a port, and a search for a free one (bind to port 0) walks past
 * thousands of them. SO_REUSEADDR passes over TIME_WAIT. Only the port
 * number is kept from one input to the next. The socket, or -1. */
static int listener(struct sockaddr_in *sin) {
  static uint16_t last; /* network order; 0: search */
  socklen_t sl = sizeof(*sin);
  int one = 1;
  for (int i = 0; i < 2; i++) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
      return -1;
    sin->sin_port = last;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
        bind(fd, (struct sockaddr *)sin, sizeof(*sin)) == 0 &&
        listen(fd, 1) == 0 &&
        getsockname(fd, (struct sockaddr *)sin, &sl) == 0) {
      last = sin->sin_port;
      return fd;
    }
    close(fd);
    if (!last)
      return -1;
    last = 0; /* taken since: search again */
  }
  return -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct fz f = {data, size};
  struct lynx_geom g;
  struct lynx_region_desc d;
  struct sockaddr_in sin = {.sin_family = AF_INET,
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  struct agent a = {.lfd = -1};
  struct op ops[OPS_MAX];
  struct lynx_tconn *c = NULL;
  pthread_t th;
  uint8_t sel = fz_u8(&f), plan_byte = fz_u8(&f);
  int n = plan_byte & OPS_MAX, posted = 0;
  uint32_t ordering;
  fz_quiet();
  memset(ops, 0, sizeof(ops));
  fz_tcp_geom(sel, &g, &ordering);
  a.lfd = listener(&sin);
  if (a.lfd < 0)
    return 0;
  memset(&d, 0, sizeof(d));
  d.accel_id = FZ_TCP_ACCEL;
  snprintf(d.transport, sizeof(d.transport), "tcp");
  snprintf(d.locator, sizeof(d.locator), "127.0.0.1:%u", ntohs(sin.sin_port));
  d.region_size = g.region_size;
  d.epoch = FZ_TCP_EPOCH;
  d.n_mqueues = g.n_mqueues;
  d.slots = g.slots;
  d.slot_size = g.slot_size;
  d.large_bytes = g.large_bytes;
  d.ordering = ordering;
  d.key = 0x6b6579;
  a.d = &d;
  a.challenge = !(plan_byte & 8);
  /* the operations come first in the input, the agent's bytes after */
  {
    struct fz plan = f;
    for (int i = 0; i < n; i++)
      if (fz_u8(&plan) & 1)
        fz_u8(&plan);
      else
        fz_u32(&plan);
    a.out = fz_rest(&plan, &a.n);
  }
  if (pthread_create(&th, NULL, agent_main, &a)) {
    close(a.lfd);
    return 0;
  }
  if (lynx_transport_tcp.connect(&d, &c) == 0) {
    while (posted < n && post(c, &ops[posted], posted, &f, &g) == 0)
      posted++;
    if (c->ops->flush(c) == 0)
      reap(c, ops, posted, &g);
    c->ops->close(c);
  }
  shutdown(a.lfd, SHUT_RDWR); /* an agent still waiting to accept */
  pthread_join(th, NULL);
  close(a.lfd);
  ops_free(ops, n, &g);
  return 0;
}
