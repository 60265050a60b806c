/*
 * tcp_frontend.c - the frontend side of the tcp transport: a frontend
 * worker's connection to one remote region (transport_tcp.c has the
 * design). connect opens it and makes the handshake (HELLO, the agent's
 * CHALLENGE, our PROOF of the key, HELLO_REPLY) and a read of the region
 * header checked against the descriptor, all synchronous and bounded by
 * TCP_CONNECT_MS; from then on nothing blocks. writev, read and read_tx
 * (READ_TX, the compound read) append frames to one buffer that flush
 * sends with one send(); poll reaps the replies in order, each checked
 * against the read it answers; a connection the agent cut (FENCED) dies
 * with -ESTALE. subscribe (SUBSCRIBE) asks the agent to push answers:
 * poll applies every PUSH frame that comes between the replies to the
 * subscription's buffers, checked as strictly as a reply.
 *
 * One worker thread per connection: no locks.
 */
#include <endian.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "mqueue.h"
#include "tcp_auth.h"
#include "tcp_internal.h"
#include "transport.h"
#include "util.h"

#define TCP_OUT_MAX (32u << 20) /* unsent bytes before -ENOBUFS */
#define TCP_READS_MAX 4096u     /* reads in flight */
#define TCP_CONNECT_MS 1500

struct pending_read {
  uint64_t wr_id;
  void *dst; /* READ_TX: of the control array */
  uint32_t len;
  int compound;            /* a READ_TX */
  int sub;                 /* a SUBSCRIBE */
  int ntx;                 /* READ_TX: entries of tx */
  struct lynx_tx_read *tx; /* READ_TX: the caller's */
};

struct tcp_conn {
  struct lynx_tconn base;
  int fd;
  struct lynx_geom g;
  struct tcp_buf out; /* posted, not yet sent */
  struct tcp_buf in;  /* received, not yet parsed */
  struct pending_read *reads;
  uint32_t r_head, r_tail; /* FIFO of reads in flight, TCP_READS_MAX */
  int dead;                /* 0, or the -errno every call returns from now on */
  int stalled; /* a flush's bytes the kernel did not take: poll sends them */
  /* the subscription (NULL: none, or refused) and, per mqueue, its
   * entry's index + 1 (0: not subscribed) */
  struct lynx_push *push;
  uint32_t *push_of;
};

static int errno_dead(int e) {
  return (e == EPIPE || e == ECONNRESET || e == ENOTCONN || e == ETIMEDOUT ||
          e == EHOSTUNREACH || e == ENETUNREACH)
             ? -ECONNRESET
             : -e;
}

/* The connection failed with err: if the agent said FENCED before it
 * closed (a newer frontend took the region over), that is the error,
 * -ESTALE. Whatever the kernel still holds is read to find out; the
 * frames before it are replies nobody waits for any more. Sticky. */
static int tc_dead(struct tcp_conn *c, int err) {
  size_t at;
  if (c->dead)
    return c->dead;
  while (!lynx__tcp_buf_reserve(&c->in, 4096, TCP_OP_MAX + TCP_HDR + 65536)) {
    ssize_t k =
        recv(c->fd, c->in.p + c->in.len, c->in.cap - c->in.len, MSG_DONTWAIT);
    if (k <= 0 && !(k < 0 && errno == EINTR))
      break;
    if (k > 0)
      c->in.len += (size_t)k;
  }
  for (at = c->in.head; c->in.len - at >= TCP_HDR;) {
    struct tcp_hdr h;
    lynx__tcp_hdr_get(c->in.p + at, &h);
    if (h.op == OP_FENCED) {
      char why[160];
      size_t n = c->in.len - at - TCP_HDR;
      n = n < h.len ? n : h.len;
      n = n < sizeof(why) - 1 ? n : sizeof(why) - 1;
      memcpy(why, c->in.p + at + TCP_HDR, n);
      why[n] = 0;
      LYNX_LOG_RL(LYNX_LOG_WARN, "tcp", "%s: agent cut this connection: %s",
                  c->base.desc.locator, why);
      err = -ESTALE;
      break;
    }
    /* a frame cut short is the last received: nothing follows it */
    if (h.len > TCP_OP_MAX || h.len > c->in.len - at - TCP_HDR)
      break;
    at += TCP_HDR + (size_t)h.len;
  }
  c->dead = err;
  return err;
}

/* Sends what is buffered, without blocking. */
static int tc_send(struct tcp_conn *c) {
  while (c->out.head < c->out.len) {
    ssize_t n = send(c->fd, c->out.p + c->out.head, c->out.len - c->out.head,
                     MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        c->stalled = 1;
        return 0;
      }
      if (errno == EINTR)
        continue;
      return tc_dead(c, errno_dead(errno));
    }
    c->out.head += (size_t)n;
  }
  c->out.head = c->out.len = 0;
  c->stalled = 0;
  return 0;
}

/* Waits up to the deadline for fd to become ready for events. */
static int wait_fd(int fd, short events, uint64_t deadline_ns) {
  for (;;) {
    struct pollfd p = {fd, events, 0};
    uint64_t now = lynx_now_ns();
    int ms, rc;
    if (now >= deadline_ns)
      return -ETIMEDOUT;
    ms = (int)((deadline_ns - now) / 1000000u) + 1;
    rc = poll(&p, 1, ms);
    if (rc > 0)
      return 0;
    if (rc < 0 && errno != EINTR)
      return -errno;
  }
}

/* Sends or receives exactly n bytes before the deadline (connection set-up
 * only; the data path never blocks). */
static int xfer_all(int fd, uint8_t *p, size_t n, int sending,
                    uint64_t deadline) {
  while (n) {
    ssize_t k = sending ? send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL)
                        : recv(fd, p, n, MSG_DONTWAIT);
    if (k == 0 && !sending)
      return -ECONNRESET;
    if (k < 0) {
      int rc;
      if (errno == EINTR)
        continue;
      if (errno != EAGAIN)
        return errno_dead(errno);
      rc = wait_fd(fd, sending ? POLLOUT : POLLIN, deadline);
      if (rc)
        return rc;
      continue;
    }
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

static int send_all(int fd, const uint8_t *p, size_t n, uint64_t deadline) {
  return xfer_all(fd, (uint8_t *)p, n, 1, deadline);
}

static int recv_all(int fd, uint8_t *p, size_t n, uint64_t deadline) {
  return xfer_all(fd, p, n, 0, deadline);
}

/* Sends n bytes of frame and reads the header of the answer into h. */
static int tc_ask(int fd, const uint8_t *frame, size_t n, struct tcp_hdr *h,
                  uint64_t deadline) {
  uint8_t hdr[TCP_HDR];
  int rc = send_all(fd, frame, n, deadline);
  if (!rc)
    rc = recv_all(fd, hdr, TCP_HDR, deadline);
  if (!rc)
    lynx__tcp_hdr_get(hdr, h);
  return rc;
}

/* HELLO, the agent's CHALLENGE and our PROOF of the key (which itself
 * never crosses the wire), its reply, then a read of the region header
 * checked against the descriptor. */
static int tc_handshake(struct tcp_conn *c, const struct lynx_region_desc *d,
                        uint64_t deadline) {
  uint8_t frame[TCP_HDR + sizeof(struct tcp_hello)];
  uint8_t hdr[TCP_HDR];
  uint8_t regionhdr[sizeof(struct lynx_region_hdr)];
  char why[257], err[256];
  struct tcp_hello m = {htole32(TCP_MAGIC),
                        htole16(TCP_VERSION),
                        0,
                        htole64(lynx__tcp_region_id(d->key)),
                        htole64(d->epoch),
                        htole64(d->region_size),
                        htole64(d->producer)};
  struct tcp_hdr h;
  int rc;
  lynx__tcp_hdr_put(frame, OP_HELLO, 0, sizeof(m), 0, 0);
  memcpy(frame + TCP_HDR, &m, sizeof(m));
  rc = tc_ask(c->fd, frame, sizeof(frame), &h, deadline);
  if (rc)
    return rc;
  if (h.op == OP_CHALLENGE && h.len == LYNX_TCP_NONCE) {
    uint8_t nonce[LYNX_TCP_NONCE], proof[TCP_HDR + LYNX_TCP_PROOF];
    rc = recv_all(c->fd, nonce, sizeof(nonce), deadline);
    if (rc)
      return rc;
    lynx__tcp_hdr_put(proof, OP_PROOF, 0, LYNX_TCP_PROOF, 0, 0);
    if (lynx__tcp_proof(d->key, nonce, &m, sizeof(m), proof + TCP_HDR))
      return -EIO;
    rc = tc_ask(c->fd, proof, sizeof(proof), &h, deadline);
    if (rc)
      return rc;
  }
  if (h.op != OP_HELLO_REPLY || h.len >= sizeof(why)) {
    LYNX_WARN("tcp", "%s: not a lynx tcp agent (reply op %u)", d->locator,
              h.op);
    return -EPROTO;
  }
  rc = recv_all(c->fd, (uint8_t *)why, h.len, deadline);
  if (rc)
    return rc;
  why[h.len] = 0;
  if (h.off) {
    LYNX_WARN("tcp", "%s: agent refused the connection: %s", d->locator, why);
    return h.off == ENOENT || h.off == ESTALE ? -ESTALE : -EPROTO;
  }
  lynx__tcp_hdr_put(hdr, OP_READ, 0, sizeof(regionhdr), 0, 0);
  rc = send_all(c->fd, hdr, TCP_HDR, deadline);
  if (!rc)
    rc = recv_all(c->fd, hdr, TCP_HDR, deadline);
  if (rc)
    return rc;
  lynx__tcp_hdr_get(hdr, &h);
  if (h.op != OP_READ_RESP || h.len != sizeof(regionhdr))
    return -EPROTO;
  rc = recv_all(c->fd, regionhdr, sizeof(regionhdr), deadline);
  if (rc)
    return rc;
  rc = lynx_region_validate(regionhdr, d->region_size, d, err, sizeof(err));
  if (rc)
    LYNX_WARN("tcp", "%s: refused: %s", d->locator, err);
  return rc;
}

void lynx__tcp_close(struct lynx_tconn *tc) {
  struct tcp_conn *c = container_of(tc, struct tcp_conn, base);
  if (c->fd >= 0)
    close(c->fd);
  lynx__tcp_buf_free(&c->out);
  lynx__tcp_buf_free(&c->in);
  free(c->reads);
  free(c->push_of);
  free(c);
}

int lynx__tcp_conn_open(const struct lynx_transport_ops *ops,
                        const struct lynx_region_desc *d,
                        struct lynx_tconn **out) {
  struct sockaddr_storage ss;
  struct tcp_conn *c;
  uint64_t deadline = lynx_now_ns() + TCP_CONNECT_MS * 1000000ull;
  int one = 1, sz = 4 << 20, rc;
  if (lynx_parse_hostport(d->locator, &ss))
    return -EINVAL;
  c = calloc(1, sizeof(*c));
  if (!c)
    return -ENOMEM;
  c->base.ops = ops;
  c->base.desc = *d;
  c->fd = -1;
  c->reads = calloc(TCP_READS_MAX, sizeof(*c->reads));
  if (!c->reads || lynx_geom_init(&c->g, d->n_mqueues, d->slots, d->slot_size,
                                  d->large_bytes)) {
    rc = c->reads ? -EINVAL : -ENOMEM;
    goto fail;
  }
  c->fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (c->fd < 0) {
    rc = -errno;
    goto fail;
  }
  setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(c->fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
  setsockopt(c->fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
  if (connect(c->fd, (struct sockaddr *)&ss,
              ss.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                       : sizeof(struct sockaddr_in)) != 0) {
    int e = 0;
    socklen_t el = sizeof(e);
    if (errno != EINPROGRESS) {
      rc = -errno;
      goto fail;
    }
    rc = wait_fd(c->fd, POLLOUT, deadline);
    if (rc)
      goto fail;
    getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &e, &el);
    if (e) {
      rc = -e;
      goto fail;
    }
  }
  rc = tc_handshake(c, d, deadline);
  if (rc)
    goto fail;
  *out = &c->base;
  return 0;
fail:
  lynx__tcp_close(&c->base);
  return rc;
}

int lynx__tcp_writev(struct lynx_tconn *tc, uint64_t off,
                     const struct iovec *iov, int iovcnt, unsigned flags) {
  struct tcp_conn *c = container_of(tc, struct tcp_conn, base);
  uint64_t total = 0;
  uint8_t *p;
  int rc = lynx_writev_check(&c->g, off, iov, iovcnt, flags, &total);
  if (rc)
    return rc;
  if (c->dead)
    return c->dead;
  if (total > TCP_OP_MAX)
    return -EMSGSIZE;
  rc = lynx__tcp_buf_reserve(&c->out, TCP_HDR + total, TCP_OUT_MAX);
  if (rc)
    return rc;
  p = c->out.p + c->out.len;
  lynx__tcp_hdr_put(p, OP_WRITE, (flags & LYNX_WR_PUBLISH) ? F_PUBLISH : 0,
                    (uint32_t)total, off, 0);
  p += TCP_HDR;
  for (int i = 0; i < iovcnt; i++) {
    memcpy(p, iov[i].iov_base, iov[i].iov_len);
    p += iov[i].iov_len;
  }
  c->out.len += TCP_HDR + total;
  return 0;
}

int lynx__tcp_read(struct lynx_tconn *tc, uint64_t off, void *dst, size_t len,
                   uint64_t wr_id) {
  struct tcp_conn *c = container_of(tc, struct tcp_conn, base);
  struct pending_read *r;
  int rc;
  if (lynx_bounds_ok(c->g.region_size, off, len))
    return -EFAULT;
  if (len > TCP_OP_MAX)
    return -EMSGSIZE;
  if (c->dead)
    return c->dead;
  if (c->r_tail - c->r_head >= TCP_READS_MAX)
    return -ENOBUFS;
  rc = lynx__tcp_buf_reserve(&c->out, TCP_HDR, TCP_OUT_MAX);
  if (rc)
    return rc;
  lynx__tcp_hdr_put(c->out.p + c->out.len, OP_READ, 0, (uint32_t)len, off,
                    wr_id);
  c->out.len += TCP_HDR;
  r = &c->reads[c->r_tail++ % TCP_READS_MAX];
  r->wr_id = wr_id;
  r->dst = dst;
  r->len = (uint32_t)len;
  r->compound = 0;
  r->sub = 0;
  return 0;
}

int lynx__tcp_read_tx(struct lynx_tconn *tc, void *actrl,
                      struct lynx_tx_read *tx, int n, uint64_t wr_id) {
  struct tcp_conn *c = container_of(tc, struct tcp_conn, base);
  const struct lynx_geom *g = &c->g;
  uint64_t worst = 8ull * g->n_mqueues;
  uint32_t len = TXR_HDR + (uint32_t)n * TXR_ENT;
  struct pending_read *r;
  uint8_t *p;
  int rc;
  if (n < 0 || (uint32_t)n > g->n_mqueues || (n && !tx))
    return -EINVAL;
  for (int i = 0; i < n; i++) {
    if (tx[i].q >= g->n_mqueues || tx[i].max > g->slots)
      return -EFAULT;
    worst += 4 + (uint64_t)tx[i].max * g->slot_size;
  }
  if (worst > TCP_OP_MAX)
    return -EMSGSIZE;
  if (c->dead)
    return c->dead;
  if (c->r_tail - c->r_head >= TCP_READS_MAX)
    return -ENOBUFS;
  rc = lynx__tcp_buf_reserve(&c->out, TCP_HDR + len, TCP_OUT_MAX);
  if (rc)
    return rc;
  p = c->out.p + c->out.len;
  lynx__tcp_hdr_put(p, OP_READ_TX, 0, len, 0, wr_id);
  p += TCP_HDR;
  lynx__tcp_put32(p, (uint32_t)n);
  lynx__tcp_put32(p + 4, 0);
  for (int i = 0; i < n; i++) {
    uint8_t *e = p + TXR_HDR + (size_t)i * TXR_ENT;
    lynx__tcp_put32(e, tx[i].q);
    lynx__tcp_put32(e + 4, tx[i].from);
    lynx__tcp_put32(e + 8, tx[i].max);
    lynx__tcp_put32(e + 12, 0);
    tx[i].got = 0;
  }
  c->out.len += TCP_HDR + len;
  r = &c->reads[c->r_tail++ % TCP_READS_MAX];
  r->wr_id = wr_id;
  r->dst = actrl;
  r->len = 8u * g->n_mqueues;
  r->compound = 1;
  r->sub = 0;
  r->ntx = n;
  r->tx = tx;
  return 0;
}

int lynx__tcp_subscribe(struct lynx_tconn *tc, struct lynx_push *p,
                        uint64_t wr_id) {
  struct tcp_conn *c = container_of(tc, struct tcp_conn, base);
  const struct lynx_geom *g = &c->g;
  uint32_t len;
  struct pending_read *r;
  uint8_t *f;
  int rc;
  if (!p || p->n < 1 || (uint32_t)p->n > g->n_mqueues || !p->sub)
    return -EINVAL;
  if (c->dead)
    return c->dead;
  if (c->push)
    return -EALREADY;
  if (c->r_tail - c->r_head >= TCP_READS_MAX)
    return -ENOBUFS;
  if (!c->push_of) {
    c->push_of = calloc(g->n_mqueues, sizeof(*c->push_of));
    if (!c->push_of)
      return -ENOMEM;
  }
  memset(c->push_of, 0, g->n_mqueues * sizeof(*c->push_of));
  for (int i = 0; i < p->n; i++) {
    const struct lynx_tx_sub *t = &p->sub[i];
    if (t->q >= g->n_mqueues || c->push_of[t->q] || !t->ring ||
        (g->large_bytes && (!t->large || !t->lmsg)))
      return -EINVAL;
    c->push_of[t->q] = (uint32_t)i + 1;
  }
  len = TXR_HDR + (uint32_t)p->n * TXR_ENT;
  rc = lynx__tcp_buf_reserve(&c->out, TCP_HDR + len, TCP_OUT_MAX);
  if (rc)
    return rc;
  f = c->out.p + c->out.len;
  lynx__tcp_hdr_put(f, OP_SUBSCRIBE, 0, len, 0, wr_id);
  lynx__tcp_put32(f + TCP_HDR, (uint32_t)p->n);
  lynx__tcp_put32(f + TCP_HDR + 4, 0);
  for (int i = 0; i < p->n; i++) {
    uint8_t *e = f + TCP_HDR + TXR_HDR + (size_t)i * TXR_ENT;
    p->sub[i].prod = p->sub[i].from;
    lynx__tcp_put32(e, p->sub[i].q);
    lynx__tcp_put32(e + 4, p->sub[i].from);
    lynx__tcp_put32(e + 8, p->sub[i].rx_cons);
    lynx__tcp_put32(e + 12, p->sub[i].flags & LYNX_SUB_RX_EAGER);
  }
  c->out.len += TCP_HDR + len;
  p->state = 0;
  c->push = p;
  r = &c->reads[c->r_tail++ % TCP_READS_MAX];
  memset(r, 0, sizeof(*r));
  r->wr_id = wr_id;
  r->sub = 1;
  return 0;
}

/* Applies a PUSH frame of len bytes at p to the subscription: each entry
 * must continue its mqueue where the last ended and every record lie
 * inside the buffers (a large message inside the large area), so a
 * confused or hostile agent can neither overrun a buffer nor skip a
 * position. 0 or -EPROTO (the connection dies: what was applied of the
 * frame is never consumed). */
static int tc_take_push(struct tcp_conn *c, const uint8_t *p, uint32_t len) {
  const struct lynx_geom *g = &c->g;
  uint32_t z = g->slot_size, L = g->large_bytes, count, at = TXR_HDR;
  if (!c->push || c->push->state != 1 || len < TXR_HDR ||
      lynx__tcp_get32(p + 4))
    return -EPROTO;
  count = lynx__tcp_get32(p);
  for (uint32_t i = 0; i < count; i++) {
    struct lynx_tx_sub *t;
    uint32_t q, idx, from, n;
    if (len - at < PUSH_ENT)
      return -EPROTO;
    q = lynx__tcp_get32(p + at);
    from = lynx__tcp_get32(p + at + 8);
    n = lynx__tcp_get32(p + at + 12);
    idx = q < g->n_mqueues ? c->push_of[q] : 0;
    if (!idx || n > g->slots)
      return -EPROTO;
    t = &c->push->sub[idx - 1];
    if (from != t->prod)
      return -EPROTO;
    t->rx_cons = lynx__tcp_get32(p + at + 4);
    at += PUSH_ENT;
    for (uint32_t k = 0; k < n; k++) {
      uint32_t pos = (from + k) & (g->slots - 1), llen, loff;
      if (len - at < PUSH_REC + z)
        return -EPROTO;
      llen = lynx__tcp_get32(p + at);
      loff = lynx__tcp_get32(p + at + 4);
      at += PUSH_REC;
      if (llen && (llen > L || loff > L - llen || len - at - z < llen))
        return -EPROTO;
      memcpy(t->ring + (size_t)pos * z, p + at, z);
      at += z;
      if (llen)
        memcpy(t->large + loff, p + at, llen);
      at += llen;
      if (t->lmsg)
        t->lmsg[pos] = (struct lynx_tx_large){loff, llen};
      t->prod = from + k + 1;
    }
  }
  return at == len ? 0 : -EPROTO;
}

/* Unpacks a READ_TX answer of len bytes at p into r's buffers. Every count
 * must be the one the control array in the same answer gives
 * (lynx__tcp_txr_count), so a confused or hostile agent can neither
 * overrun a buffer nor make up slots. 0 or -EPROTO. */
static int tc_take_tx(struct tcp_conn *c, struct pending_read *r,
                      const uint8_t *p, uint32_t len) {
  uint32_t z = c->g.slot_size, at = r->len;
  if (len < r->len)
    return -EPROTO;
  for (int i = 0; i < r->ntx; i++) {
    struct lynx_tx_read *t = &r->tx[i];
    uint32_t n;
    if (len - at < 4)
      return -EPROTO;
    n = lynx__tcp_get32(p + at);
    at += 4;
    if (n != lynx__tcp_txr_count(&c->g, p, t->q, t->from, t->max) ||
        (uint64_t)n * z > len - at)
      return -EPROTO;
    memcpy(t->dst, p + at, (size_t)n * z);
    t->got = n;
    at += n * z;
  }
  if (at != len)
    return -EPROTO;
  memcpy(r->dst, p, r->len);
  return 0;
}

/* Whether the frame of len bytes at in.head is all here: 1, or 0 with
 * room made for the rest (receive more), or -errno. */
static int tc_whole(struct tcp_conn *c, uint32_t len) {
  size_t have = c->in.len - c->in.head;
  int rc;
  if (have >= TCP_HDR + (size_t)len)
    return 1;
  rc = lynx__tcp_buf_reserve(&c->in, TCP_HDR + len - have,
                             TCP_OP_MAX + TCP_HDR + 65536);
  return rc ? rc : 0;
}

/* A frame of a kind poll did not expect, or one that does not parse: the
 * stream is out of step. */
static int tc_protocol(struct tcp_conn *c, const char *what, uint32_t len) {
  LYNX_LOG_RL(LYNX_LOG_WARN, "tcp", "%s: malformed %s (%u bytes)",
              c->base.desc.locator, what, len);
  return -EPROTO;
}

/* The agent's answer to the subscription: pushing from now on, or
 * refused (the reason logged; the caller polls). */
static void tc_subscribed(struct tcp_conn *c, const struct tcp_hdr *h,
                          const uint8_t *why) {
  if (!h->off) {
    c->push->state = 1;
    return;
  }
  LYNX_LOG_RL(LYNX_LOG_INFO, "tcp", "%s: agent does not push answers: %.*s",
              c->base.desc.locator, (int)h->len, (const char *)why);
  c->push->state = h->off < 4096 ? -(int)h->off : -EPROTO;
  c->push = NULL;
}

int lynx__tcp_flush(struct lynx_tconn *tc) {
  struct tcp_conn *c = container_of(tc, struct tcp_conn, base);
  return c->dead ? c->dead : tc_send(c);
}

int lynx__tcp_poll(struct lynx_tconn *tc, uint64_t *ids, int max) {
  struct tcp_conn *c = container_of(tc, struct tcp_conn, base);
  int n = 0, rc;
  if (c->dead)
    return c->dead;
  /* finish what the kernel did not take of a flush (what was posted
   * since waits for the next flush) */
  if (c->stalled && c->out.len > c->out.head) {
    rc = tc_send(c);
    if (rc)
      return rc;
  }
  if (c->r_head == c->r_tail && !c->push)
    return 0; /* nothing expected; a close shows up at the next send */
  for (int rounds = 0; rounds < 8 && n < max; rounds++) {
    /* parse what is here */
    while (n < max && c->in.len - c->in.head >= TCP_HDR) {
      struct pending_read *r = &c->reads[c->r_head % TCP_READS_MAX];
      struct tcp_hdr h;
      lynx__tcp_hdr_get(c->in.p + c->in.head, &h);
      if (h.op == OP_FENCED)
        return tc_dead(c, -ECONNRESET);
      if (h.op == OP_PUSH) { /* unasked, between the replies */
        if (h.len > TCP_OP_MAX)
          return tc_protocol(c, "push", h.len);
        rc = tc_whole(c, h.len);
        if (rc < 0)
          return rc;
        if (!rc)
          break;
        if (tc_take_push(c, c->in.p + c->in.head + TCP_HDR, h.len))
          return tc_protocol(c, "push", h.len);
        c->in.head += TCP_HDR + h.len;
        continue;
      }
      if (c->r_head == c->r_tail)
        return tc_protocol(c, "reply nobody asked for", h.len);
      if (h.wr_id != r->wr_id ||
          (r->sub        ? h.op != OP_SUBSCRIBE_RESP || h.len > 255
           : r->compound ? h.op != OP_READ_TX_RESP || h.len > TCP_OP_MAX
                         : h.op != OP_READ_RESP || h.len != r->len)) {
        LYNX_LOG_RL(LYNX_LOG_WARN, "tcp",
                    "%s: reply out of step (op %u, "
                    "%u bytes, expected a %u-byte read)",
                    c->base.desc.locator, h.op, h.len, r->len);
        return -EPROTO;
      }
      rc = tc_whole(c, h.len);
      if (rc < 0)
        return rc;
      if (!rc)
        break;
      if (r->sub) {
        tc_subscribed(c, &h, c->in.p + c->in.head + TCP_HDR);
      } else if (!r->compound) {
        memcpy(r->dst, c->in.p + c->in.head + TCP_HDR, h.len);
      } else if (tc_take_tx(c, r, c->in.p + c->in.head + TCP_HDR, h.len)) {
        LYNX_LOG_RL(LYNX_LOG_WARN, "tcp",
                    "%s: compound reply of %u bytes "
                    "does not match its request",
                    c->base.desc.locator, h.len);
        return -EPROTO;
      }
      c->in.head += TCP_HDR + h.len;
      ids[n++] = r->wr_id;
      c->r_head++;
    }
    if (n == max || (c->r_head == c->r_tail && !c->push))
      break;
    /* receive more */
    rc = lynx__tcp_buf_reserve(&c->in, 65536, TCP_OP_MAX + TCP_HDR + 65536);
    if (rc)
      return rc;
    ssize_t k =
        recv(c->fd, c->in.p + c->in.len, c->in.cap - c->in.len, MSG_DONTWAIT);
    if (k == 0)
      return tc_dead(c, -ECONNRESET);
    if (k < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        break;
      if (errno == EINTR)
        continue;
      return tc_dead(c, errno_dead(errno));
    }
    c->in.len += (size_t)k;
  }
  if (c->in.head == c->in.len)
    c->in.head = c->in.len = 0;
  return n;
}

int lynx__tcp_wait_fd(struct lynx_tconn *tc) {
  return container_of(tc, struct tcp_conn, base)->fd;
}

/* The agent wakes a sleeping accelerator after every batch of writes. */
int lynx__tcp_notify(struct lynx_tconn *tc) {
  (void)tc;
  return 0;
}
