/*
 * fuzz_tcp_agent.c - the agent side of the tcp transport
 * (transport/tcp_agent_conn.c: srv_on_read, srv_hello, srv_proof, srv_op,
 * srv_read_tx, srv_subscribe, srv_push), through its public API: an agent
 * handle on 127.0.0.1 exports one region, and the input is what a frontend
 * sends on a data connection to it. The session ends when the agent closes the
 * connection, after the stream ended (or earlier, refusing a frame).
 *
 * Input: a byte choosing the region (tcp_fuzz.h); a byte of flags: bit 0
 * has the harness make the protocol's handshake first, as a frontend
 * that knows the region's (random) key does (HELLO naming the region's
 * id, the agent's CHALLENGE, the PROOF of the key, HELLO_REPLY), which no
 * input could; without it bit 6 prepends that HELLO alone, so that the
 * stream answers the CHALLENGE (a wrong PROOF: the nonce is random); bit
 * 1 takes the HELLO's frontend epoch from the next 8 bytes (else 0), bits
 * 2-5 the size of the pieces the stream is sent in (0: as it goes); then
 * the stream.
 *
 * Checked besides memory errors: the agent admits the handshake; it
 * closes every connection once its stream ended; its replies are
 * well-formed frames (the HELLO answered first, by a CHALLENGE and then a
 * HELLO_REPLY or by a HELLO_REPLY alone; a reply operation, a length
 * within the region); and nothing outside fctrl and
 * the RX rings changed (the header's fence word aside, which a HELLO with
 * a newer frontend epoch sets), whatever was written.
 */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz.h"
#include "tcp_fuzz.h"
#include "transport.h"
#include "util.h"

#define SESSION_NS (20ull * 1000000000ull) /* an agent that never closes */

/* The agent's replies, checked frame by frame as they come. */
struct replies {
  uint8_t hdr[TCP_HDR];
  size_t have;   /* bytes of hdr */
  uint64_t skip; /* payload bytes of the current frame still to come */
  uint64_t region_size;
  unsigned frames;
  int challenged; /* the first reply was a CHALLENGE */
};

static void replies_take(struct replies *r, const uint8_t *p, size_t n) {
  while (n) {
    size_t k;
    if (r->skip) {
      k = r->skip < n ? (size_t)r->skip : n;
      r->skip -= k;
      p += k;
      n -= k;
      continue;
    }
    k = TCP_HDR - r->have < n ? TCP_HDR - r->have : n;
    memcpy(r->hdr + r->have, p, k);
    r->have += k;
    p += k;
    n -= k;
    if (r->have == TCP_HDR) {
      uint8_t op = r->hdr[0];
      uint32_t len = (uint32_t)fz_le_get(r->hdr + 4, 4);
      int first = r->frames == 0;
      FZ_CHECK(r->hdr[2] == 0 && r->hdr[3] == 0);
      /* the HELLO is answered first, by a CHALLENGE and then (after the
       * PROOF) a HELLO_REPLY, or by a HELLO_REPLY alone; and only then */
      FZ_CHECK(op != OP_CHALLENGE || (first && len == LYNX_TCP_NONCE));
      FZ_CHECK((op == OP_HELLO_REPLY) == ((first && op != OP_CHALLENGE) ||
                                          (r->frames == 1 && r->challenged)));
      r->challenged |= op == OP_CHALLENGE;
      FZ_CHECK(op == OP_HELLO_REPLY || op == OP_CHALLENGE ||
               op == OP_READ_RESP || op == OP_READ_TX_RESP || op == OP_FENCED ||
               op == OP_SUBSCRIBE_RESP || op == OP_PUSH);
      FZ_CHECK(op != OP_READ_RESP || len <= r->region_size);
      FZ_CHECK(len <= (4u << 20));
      r->skip = len;
      r->have = 0;
      r->frames++;
    }
  }
}

/* The handshake of a frontend that knows key (flag bit 0), its replies
 * checked as the stream's are: 1 when the agent admitted the connection.
 * hello: the HELLO frame it sends. */
static int handshake(int fd, uint64_t key, const uint8_t *hello,
                     struct replies *rp) {
  uint64_t end = lynx_now_ns() + SESSION_NS;
  uint8_t in[TCP_HDR + 256], proof[TCP_HDR + LYNX_TCP_PROOF];
  uint64_t len;
  if (fz_tcp_send(fd, hello, TCP_HDR + FZ_TCP_HELLO) ||
      fz_tcp_recv(fd, in, TCP_HDR, end))
    return 0;
  replies_take(rp, in, TCP_HDR);
  if (in[0] != OP_CHALLENGE ||
      fz_tcp_recv(fd, in + TCP_HDR, LYNX_TCP_NONCE, end))
    return 0;
  replies_take(rp, in + TCP_HDR, LYNX_TCP_NONCE);
  if (fz_tcp_proof(proof, key, in + TCP_HDR, hello) ||
      fz_tcp_send(fd, proof, sizeof(proof)) ||
      fz_tcp_recv(fd, in, TCP_HDR, end))
    return 0;
  replies_take(rp, in, TCP_HDR);
  len = fz_le_get(in + 4, 4);
  if (in[0] != OP_HELLO_REPLY || len > sizeof(in) - TCP_HDR ||
      fz_tcp_recv(fd, in + TCP_HDR, (size_t)len, end))
    return 0;
  replies_take(rp, in + TCP_HDR, (size_t)len);
  return fz_le_get(in + 8, 8) == 0; /* off: 0 admitted, else an errno */
}

#define PIECES_PER_POLL 64

/* Sends out[0, n) in pieces of piece bytes while reading the replies,
 * then half-closes and reads until the agent closes. 1 when it did.
 * Pieces go PIECES_PER_POLL at a time while the socket takes them, and
 * the replies are read between (a poll per piece was a third of the time
 * of an input sent a byte at a time). */
static int converse(int fd, const uint8_t *out, size_t n, size_t piece,
                    struct replies *rp) {
  uint64_t end = lynx_now_ns() + SESSION_NS;
  uint8_t buf[65536]; /* (out of the loop: ASan poisons a scope's locals) */
  size_t sent = 0;
  int shut = 0;
  while (lynx_now_ns() < end) {
    struct pollfd pf = {fd, POLLIN, 0};
    ssize_t k;
    for (int i = 0; i < PIECES_PER_POLL && sent < n; i++) {
      size_t want = n - sent < piece ? n - sent : piece;
      k = send(fd, out + sent, want, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (k > 0) {
        sent += (size_t)k;
      } else {
        if (k < 0 && errno != EAGAIN && errno != EINTR)
          sent = n; /* the agent closed: nothing more goes */
        break;
      }
    }
    if (sent == n && !shut) {
      shutdown(fd, SHUT_WR);
      shut = 1;
    }
    if (sent < n)
      pf.events |= POLLOUT;
    if (poll(&pf, 1, 100) <= 0)
      continue;
    if (pf.revents & (POLLIN | POLLHUP | POLLERR)) {
      k = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR))
        return 1;
      if (k > 0)
        replies_take(rp, buf, (size_t)k);
    }
  }
  return 0;
}

/* Whether the bytes a frontend may not write are as they were. */
static int untouched(const uint8_t *before, const uint8_t *now,
                     const struct lynx_geom *g) {
  uint64_t tx = lynx_tx_ring_off(g, 0);
  return !memcmp(before, now, LYNX_OFF_FENCE) &&
         !memcmp(before + LYNX_OFF_FENCE + 8, now + LYNX_OFF_FENCE + 8,
                 g->fctrl_off - LYNX_OFF_FENCE - 8) &&
         !memcmp(before + tx, now + tx, g->region_size - tx);
}

/* An agent handle on 127.0.0.1, on the port the last input's listened on
 * when it is free again. Each input's agent closes its connections first,
 * leaving them in TIME_WAIT for a minute, each holding its port: a search
 * for a free port (bind to port 0) walks past thousands of them and was
 * half of the harness's time. Naming the last port skips the search (the
 * listener's SO_REUSEADDR, which libuv sets, passes over TIME_WAIT). Only
 * the port number is kept from one input to the next. 0, or -errno. */
static int agent_create(struct lynx_transport_agent **ta, char *err,
                        size_t errlen) {
  static char last[LYNX_LOCATOR_MAX] = "127.0.0.1:0";
  const struct lynx_transport_ops *t = &lynx_transport_tcp;
  int rc = t->agent_create(&(struct lynx_transport_opts){.listen = last}, ta,
                           err, errlen);
  if (rc && strcmp(last, "127.0.0.1:0")) { /* taken since: search again */
    snprintf(last, sizeof(last), "127.0.0.1:0");
    rc = t->agent_create(&(struct lynx_transport_opts){.listen = last}, ta, err,
                         errlen);
  }
  if (!rc)
    snprintf(last, sizeof(last), "%s", (*ta)->bound);
  return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const struct lynx_transport_ops *t = &lynx_transport_tcp;
  struct lynx_transport_agent *ta = NULL;
  struct lynx_region r;
  struct lynx_geom g;
  struct replies rp;
  struct sockaddr_storage ss;
  struct fz f = {data, size};
  uint8_t sel = fz_u8(&f), flags = fz_u8(&f), *out = NULL, *before = NULL;
  uint32_t ordering;
  uint64_t producer = flags & 2 ? fz_u64(&f) : 0;
  /* the HELLO goes first in out: sent alone (bit 0) or with the stream */
  size_t n, hello = flags & 0x41 ? TCP_HDR + FZ_TCP_HELLO : 0;
  size_t skip = flags & 1 ? hello : 0; /* bytes of out the handshake sent */
  size_t piece =
      flags & 0x3c ? (size_t)1 << (((flags >> 2) & 15) - 1) : SIZE_MAX;
  const uint8_t *stream = fz_rest(&f, &n);
  char err[256];
  struct linger lg = {1, 0}; /* closed with a reset: no TIME_WAIT left */
  int fd = -1;
  fz_quiet();
  fz_tcp_geom(sel, &g, &ordering);
  memset(&r, 0, sizeof(r));
  r.fd = -1;
  memset(&rp, 0, sizeof(rp));
  rp.region_size = g.region_size;
  if (agent_create(&ta, err, sizeof(err)))
    return 0; /* no port, no thread: nothing was tried */
  if (t->region_alloc(ta, &r, "fuzz", g.region_size) ||
      lynx_region_format(&r, g.n_mqueues, g.slots, g.slot_size, g.large_bytes,
                         ordering, FZ_TCP_EPOCH, FZ_TCP_ACCEL) ||
      t->region_export(&r))
    goto out;
  before = malloc(g.region_size);
  out = malloc(hello + n + 1);
  if (!before || !out || lynx_parse_hostport(r.locator, &ss))
    goto out;
  memcpy(before, r.base, g.region_size);
  if (hello)
    fz_tcp_hello(out, r.key, g.region_size, producer);
  memcpy(out + hello, stream, n);
  fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 ||
      connect(fd, (struct sockaddr *)&ss, sizeof(struct sockaddr_in)) != 0)
    goto out;
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
  if (skip)
    FZ_CHECK(handshake(fd, r.key, out, &rp));
  FZ_CHECK(converse(fd, out + skip, hello + n - skip, piece, &rp));
  FZ_CHECK(untouched(before, r.base, &g));
out:
  if (fd >= 0)
    close(fd);
  free(out);
  free(before);
  t->region_free(&r);
  t->agent_destroy(ta);
  return 0;
}
