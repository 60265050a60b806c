/*
 * tcp_fuzz.h - what the tcp transport harnesses (fuzz_tcp_agent.c,
 * fuzz_tcp_frontend.c) and their seeds (gen_seeds.c) agree on: the
 * region a byte of the input chooses, the wire format's constants and
 * header as docs/design.md ("tcp transport") gives them
 * (transport/tcp_internal.h keeps its own private), and version 4's
 * proof of the key, made with the transport's own functions (tcp_auth.h)
 * so that a harness takes part in the handshake the way a peer does.
 */
#ifndef LYNX_FUZZ_TCP_H
#define LYNX_FUZZ_TCP_H

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

#include "mqueue.h"
#include "tcp_auth.h"
#include "tcp_wire.h"
#include "util.h"

#define FZ_TCP_EPOCH 0x5EED0000F022ull
#define FZ_TCP_ACCEL 7u
#define FZ_TCP_HELLO 40u /* version 4's (and 5's) */
#define FZ_PUSH_ENT 16u  /* a PUSH entry: {q, rx_cons, from, n} */
#define FZ_PUSH_REC 8u   /* before each pushed slot: {llen, loff} */

/* The region sel chooses: 1-4 mqueues of 2-16 slots of 64-512 bytes,
 * bit 6 a 4 KiB large-message area, bit 7 the fenced ordering. */
static inline void fz_tcp_geom(uint8_t sel, struct lynx_geom *g,
                               uint32_t *ordering) {
  memset(g, 0, sizeof(*g)); /* (every choice is a valid geometry) */
  lynx_geom_init(g, 1u + (sel & 3u), 2u << ((sel >> 2) & 3u),
                 64u << ((sel >> 4) & 3u), sel & 0x40 ? 4096u : 0);
  *ordering = sel & 0x80 ? LYNX_ORDER_FENCED : LYNX_ORDER_COALESCED;
}

/* n bytes of v, little-endian, at p. */
static inline void fz_le(uint8_t *p, uint64_t v, unsigned n) {
  for (unsigned i = 0; i < n; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

/* The n-byte little-endian value at p. */
static inline uint64_t fz_le_get(const uint8_t *p, unsigned n) {
  uint64_t v = 0;
  for (unsigned i = n; i--;)
    v = v << 8 | p[i];
  return v;
}

/* A frame header: {u8 op, u8 flags, u16 0, u32 len, u64 off, u64 wr_id}. */
static inline void fz_tcp_hdr(uint8_t *p, uint8_t op, uint8_t flags,
                              uint32_t len, uint64_t off, uint64_t wr_id) {
  memset(p, 0, TCP_HDR);
  p[0] = op;
  p[1] = flags;
  fz_le(p + 4, len, 4);
  fz_le(p + 8, off, 8);
  fz_le(p + 16, wr_id, 8);
}

/* A HELLO frame (TCP_HDR + FZ_TCP_HELLO bytes): {u32 magic, u16
 * version, u16 0, u64 region id, epoch, region size, producer} naming the
 * region of key, presenting its epoch and size and the frontend epoch
 * producer. */
static inline void fz_tcp_hello(uint8_t *p, uint64_t key, uint64_t size,
                                uint64_t producer) {
  fz_tcp_hdr(p, OP_HELLO, 0, FZ_TCP_HELLO, 0, 0);
  p += TCP_HDR;
  memset(p, 0, FZ_TCP_HELLO);
  fz_le(p, TCP_MAGIC, 4);
  fz_le(p + 4, TCP_VERSION, 2);
  fz_le(p + 8, lynx__tcp_region_id(key), 8);
  fz_le(p + 16, FZ_TCP_EPOCH, 8);
  fz_le(p + 24, size, 8);
  fz_le(p + 32, producer, 8);
}

/* The PROOF frame (TCP_HDR + LYNX_TCP_PROOF bytes) answering nonce
 * for the HELLO frame hello with key. 0, or -EIO. */
static inline int fz_tcp_proof(uint8_t *p, uint64_t key,
                               const uint8_t nonce[LYNX_TCP_NONCE],
                               const uint8_t *hello) {
  fz_tcp_hdr(p, OP_PROOF, 0, LYNX_TCP_PROOF, 0, 0);
  return lynx__tcp_proof(key, nonce, hello + TCP_HDR, FZ_TCP_HELLO,
                         p + TCP_HDR);
}

/* Exactly n bytes from fd by end_ns (a harness's side of the handshake,
 * which waits for one frame at a time). 0, or -1 when the peer closed or
 * the time ran out. */
static inline int fz_tcp_recv(int fd, uint8_t *p, size_t n, uint64_t end_ns) {
  while (n) {
    struct pollfd pf = {fd, POLLIN, 0};
    ssize_t k;
    if (lynx_now_ns() >= end_ns)
      return -1;
    if (poll(&pf, 1, 100) <= 0)
      continue;
    k = recv(fd, p, n, MSG_DONTWAIT);
    if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR))
      return -1;
    if (k > 0) {
      p += k;
      n -= (size_t)k;
    }
  }
  return 0;
}

/* Sends the n bytes at p (a handshake frame: a fresh connection's socket
 * buffer takes it whole). 0, or -1. */
static inline int fz_tcp_send(int fd, const uint8_t *p, size_t n) {
  return send(fd, p, n, MSG_NOSIGNAL) == (ssize_t)n ? 0 : -1;
}

#endif
