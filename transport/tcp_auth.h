/*
 * tcp_auth.h - how a tcp data connection proves it knows its region's key
 * without sending it (protocol version 4; docs/design.md, "The tcp
 * transport").
 *
 * The HELLO names the region by its id, a one-way function of the key, so
 * that anyone who reads the wire learns which region was asked for but not
 * the key. The agent answers CHALLENGE {a fresh random nonce}; the
 * frontend answers PROOF {HMAC-SHA256(key, nonce || its HELLO)}, which
 * binds the proof to this connection's parameters (epoch, size, producer)
 * and cannot be replayed on another connection. The agent compares it in
 * constant time. Both sides use these helpers; GnuTLS computes the HMAC.
 */
#ifndef LYNX_TCP_AUTH_H
#define LYNX_TCP_AUTH_H

#include <stddef.h>
#include <stdint.h>

#define LYNX_TCP_NONCE 32u /* CHALLENGE's payload */
#define LYNX_TCP_PROOF 32u /* PROOF's payload: an HMAC-SHA256 */

/* The region id of key: the first 8 bytes of HMAC-SHA256(key, "lynx tcp
 * region id"), little-endian. */
uint64_t lynx__tcp_region_id(uint64_t key);
/* out = HMAC-SHA256(key, nonce || hello[0..hello_len)). 0 or -EIO. */
int lynx__tcp_proof(uint64_t key, const uint8_t nonce[LYNX_TCP_NONCE],
                    const void *hello, size_t hello_len,
                    uint8_t out[LYNX_TCP_PROOF]);
/* 1 when a and b (n bytes) are equal, in time independent of where they
 * differ. */
int lynx__ct_equal(const uint8_t *a, const uint8_t *b, size_t n);

#endif
