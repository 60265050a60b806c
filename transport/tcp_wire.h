/*
 * tcp_wire.h - the tcp data transport's wire constants and operation codes
 * (transport_tcp.c, tcp_wire.c; docs/design.md, "tcp transport"), shared
 * with the fuzz harnesses that speak it (tests/fuzz/tcp_fuzz.h).
 */
#ifndef LYNX_TCP_WIRE_H
#define LYNX_TCP_WIRE_H

#define TCP_MAGIC 0x3154584Cu /* "LXT1" */
/* 2: READ_TX (a compound read). 3: HELLO carries the producer epoch,
 * FENCED. 4: HELLO names the region by its id and the key is proven by
 * CHALLENGE/PROOF instead of sent. 5: SUBSCRIBE and PUSH (answers pushed,
 * not polled for). A peer of another version is refused at
 * HELLO with a reason naming both versions (a HELLO as short as version
 * 2's is read that far). */
#define TCP_VERSION 5u
#define TCP_HDR 24u /* every frame's header */

enum tcp_op {
  OP_HELLO = 1,
  OP_HELLO_REPLY = 2,
  OP_WRITE = 3,
  OP_READ = 4,
  OP_READ_RESP = 5,
  OP_READ_TX = 6,
  OP_READ_TX_RESP = 7,
  OP_FENCED = 8,     /* agent: a newer frontend took the region over */
  OP_CHALLENGE = 9,  /* agent: {nonce}, the answer to a HELLO it can serve */
  OP_PROOF = 10,     /* frontend: {HMAC-SHA256(key, nonce || HELLO)} */
  OP_SUBSCRIBE = 11, /* frontend: push these mqueues' answers */
  OP_SUBSCRIBE_RESP = 12, /* agent: off 0 (pushing) or an errno, a reason */
  OP_PUSH = 13,           /* agent, unasked: published TX slots */
};

#endif
