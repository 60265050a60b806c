/*
 * tcp_fuzz.h - what the tcp transport harnesses (fuzz_tcp_agent.c,
 * fuzz_tcp_frontend.c) and their seeds (gen_seeds.c) agree on: the
 * region a byte of the input chooses, and the wire format's constants
 * and header as docs/design.md ("tcp transport") gives them
 * (transport/transport_tcp.c keeps its own private).
 */
#ifndef LYNX_FUZZ_TCP_H
#define LYNX_FUZZ_TCP_H

#include <stdint.h>
#include <string.h>

#include "mqueue.h"

#define FZ_TCP_EPOCH 0x5EED0000F022ull
#define FZ_TCP_ACCEL 7u
#define FZ_TCP_HDR 24u
#define FZ_TCP_HELLO 40u /* version 3's */
#define FZ_TCP_MAGIC 0x3154584Cu
#define FZ_TCP_VERSION 3u

enum {
  FZ_OP_HELLO = 1,
  FZ_OP_HELLO_REPLY = 2,
  FZ_OP_WRITE = 3,
  FZ_OP_READ = 4,
  FZ_OP_READ_RESP = 5,
  FZ_OP_READ_TX = 6,
  FZ_OP_READ_TX_RESP = 7,
  FZ_OP_FENCED = 8,
};

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

/* A frame header: {u8 op, u8 flags, u16 0, u32 len, u64 off, u64 wr_id}. */
static inline void fz_tcp_hdr(uint8_t *p, uint8_t op, uint8_t flags,
                              uint32_t len, uint64_t off, uint64_t wr_id) {
  memset(p, 0, FZ_TCP_HDR);
  p[0] = op;
  p[1] = flags;
  fz_le(p + 4, len, 4);
  fz_le(p + 8, off, 8);
  fz_le(p + 16, wr_id, 8);
}

/* A HELLO frame (FZ_TCP_HDR + FZ_TCP_HELLO bytes): {u32 magic, u16
 * version, u16 0, u64 key, epoch, region size, producer} presenting key,
 * the region's epoch and size, and the frontend epoch producer. */
static inline void fz_tcp_hello(uint8_t *p, uint64_t key, uint64_t size,
                                uint64_t producer) {
  fz_tcp_hdr(p, FZ_OP_HELLO, 0, FZ_TCP_HELLO, 0, 0);
  p += FZ_TCP_HDR;
  memset(p, 0, FZ_TCP_HELLO);
  fz_le(p, FZ_TCP_MAGIC, 4);
  fz_le(p + 4, FZ_TCP_VERSION, 2);
  fz_le(p + 8, key, 8);
  fz_le(p + 16, FZ_TCP_EPOCH, 8);
  fz_le(p + 24, size, 8);
  fz_le(p + 32, producer, 8);
}

#endif
