/*
 * app_logic.h - the per-request logic of the example applications, shared
 * by the CPU handlers (apps.c) and the CUDA kernels (cuda/apps.cu), so the
 * CPU tests exercise what the GPU runs. Plain C, every function LYNX_HD.
 */
#ifndef LYNX_APP_LOGIC_H
#define LYNX_APP_LOGIC_H

#include <stdint.h>

#include "mqueue.h"

/* sockperf's 14-byte header: u64 sequence, u16 flags, u32 length, network
 * order. */
#define LYNX_SOCKPERF_HDR 14
#define LYNX_SOCKPERF_CLIENT 0x1u
#define LYNX_SOCKPERF_PONG_REQ 0x2u

/* 1 when a sockperf message asks for an answer (a pong request); sockperf's
 * own server answers nothing else. */
LYNX_HD int lynx_sockperf_wants_reply(const uint8_t *d, uint32_t len) {
  return len >= LYNX_SOCKPERF_HDR &&
         ((uint32_t)(d[8] << 8 | d[9]) & LYNX_SOCKPERF_PONG_REQ) != 0;
}

/* Turns a copy of the request into its answer: clears the client flag. */
LYNX_HD void lynx_sockperf_make_reply(uint8_t *d) {
  uint32_t flags = (uint32_t)(d[8] << 8 | d[9]) & ~LYNX_SOCKPERF_CLIENT;
  d[8] = (uint8_t)(flags >> 8);
  d[9] = (uint8_t)flags;
}

/*
 * sockperf-fault: sockperf-echo, except that a request "LYNX-HANG <ms>"
 * (decimal, 1..600000) holds the accelerator that receives it for ms
 * milliseconds without consuming it (a hung kernel, for liveness tests);
 * then it is dropped like any other non-sockperf message. The hang time,
 * or 0 for an ordinary request.
 */
#define LYNX_FAULT_HANG "LYNX-HANG "
#define LYNX_FAULT_HANG_MAX_MS 600000u

LYNX_HD uint32_t lynx_fault_hang_ms(const uint8_t *d, uint32_t len) {
  const char *p = LYNX_FAULT_HANG;
  uint32_t i = 0, ms = 0;
  for (; p[i]; i++)
    if (i >= len || d[i] != (uint8_t)p[i])
      return 0;
  if (i == len)
    return 0;
  for (; i < len && d[i] >= '0' && d[i] <= '9'; i++) {
    ms = ms * 10u + (uint32_t)(d[i] - '0');
    if (ms > LYNX_FAULT_HANG_MAX_MS)
      return 0;
  }
  return i == len || d[i] == '\n' || d[i] == '\r' ? ms : 0;
}

#endif
