/* tcpframe.c - a TCP service's framing; see tcpframe.h. */
#include "tcpframe.h"

#include <arpa/inet.h>
#include <string.h>

#include "mqueue.h"

uint32_t fe_tcp_frame_max(uint32_t fixed, uint32_t cap) {
  return (fixed ? fixed : cap ? cap : LYNX_SLOT_MAX) + 4u;
}

long fe_tcp_frame_len(uint32_t fixed, uint32_t cap, const uint8_t *p, size_t n,
                      uint32_t *len) {
  uint32_t hdr = fixed ? 0 : 4;
  if (n < (fixed ? fixed : 4u))
    return 0;
  if (fixed) {
    *len = fixed;
  } else {
    uint32_t be;
    memcpy(&be, p, 4);
    *len = ntohl(be);
  }
  /* (64-bit: a length word near 4 GiB must not wrap past the bound) */
  if ((cap && *len > cap) ||
      (uint64_t)*len + hdr > fe_tcp_frame_max(fixed, cap))
    return -1;
  if (n < (uint64_t)hdr + *len)
    return 0;
  return (long)hdr + *len;
}

uint32_t fe_tcp_frame_want(uint32_t fixed, uint32_t cap, const uint8_t *in,
                           uint32_t in_len) {
  uint32_t max = fe_tcp_frame_max(fixed, cap) + 4096u, want = in_len + 65536u;
  if (!fixed && in_len >= 4) {
    uint32_t be;
    memcpy(&be, in, 4);
    if (ntohl(be) < max && 4u + ntohl(be) > want)
      want = 4u + ntohl(be);
  } else if (fixed && fixed + 4096u > want) {
    want = fixed + 4096u;
  }
  return want > max ? max : want;
}
