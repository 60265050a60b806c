/*
 * tcp_auth.c - the proof of a tcp data connection's region key (protocol
 * version 4; tcp_auth.h has the design): the region id a HELLO names, the
 * HMAC a PROOF carries, and the constant-time comparison the agent checks
 * it with. GnuTLS computes the HMACs. Both sides call these, and so do the
 * fuzz harnesses that take part in the handshake (tests/fuzz/tcp_fuzz.h).
 */
#include <endian.h>
#include <errno.h>
#include <string.h>

#include <gnutls/crypto.h>

#include "tcp_auth.h"

uint64_t lynx__tcp_region_id(uint64_t key) {
  static const char label[] = "lynx tcp region id";
  uint64_t k = htole64(key), id = 0;
  uint8_t mac[32];
  if (gnutls_hmac_fast(GNUTLS_MAC_SHA256, &k, sizeof(k), label,
                       sizeof(label) - 1, mac) == 0)
    memcpy(&id, mac, sizeof(id));
  return le64toh(id);
}

int lynx__tcp_proof(uint64_t key, const uint8_t nonce[LYNX_TCP_NONCE],
                    const void *hello, size_t hello_len,
                    uint8_t out[LYNX_TCP_PROOF]) {
  uint8_t msg[LYNX_TCP_NONCE + 64];
  uint64_t k = htole64(key);
  if (hello_len > sizeof(msg) - LYNX_TCP_NONCE)
    return -EINVAL;
  memcpy(msg, nonce, LYNX_TCP_NONCE);
  memcpy(msg + LYNX_TCP_NONCE, hello, hello_len);
  return gnutls_hmac_fast(GNUTLS_MAC_SHA256, &k, sizeof(k), msg,
                          LYNX_TCP_NONCE + hello_len, out)
             ? -EIO
             : 0;
}

int lynx__ct_equal(const uint8_t *a, const uint8_t *b, size_t n) {
  volatile uint8_t d = 0; /* no early exit the compiler could add */
  for (size_t i = 0; i < n; i++)
    d |= a[i] ^ b[i];
  return d == 0;
}
