/*
 * app_logic.h - the per-request logic of the example applications, shared
 * by the CPU handlers (apps.c) and the CUDA kernels (cuda/apps.cu), so the
 * CPU tests exercise what the GPU runs. Plain C, every function LYNX_HD
 * but the host's sockperf answer (lynx_sockperf_answer).
 */
#ifndef LYNX_APP_LOGIC_H
#define LYNX_APP_LOGIC_H

#include <stdint.h>
#ifndef __CUDACC__
#include <string.h> /* the host's sockperf answer */
#endif

#include "lynx_call.h"
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

#ifndef __CUDACC__
/* sockperf-echo on the host, one request through mq: the answer built in
 * its TX slot with the client flag cleared, anything else dropped (its tag
 * freed). 0, or -11 (EAGAIN) when the TX ring is full (called again).
 * The built-in application's handler (apps.c) and its copy as a plug-in
 * (tests/plugins/sockperf_plugin.c, bench/plugin.sh) are this. */
static inline int lynx_sockperf_answer(struct lynx_mq *mq,
                                       const struct lynx_msg *req,
                                       int *replied) {
  uint8_t *buf;
  int rc;
  *replied = 0;
  if (!lynx_sockperf_wants_reply(req->data, req->len))
    return lynx_mq_drop(mq, req->tag) == -11 ? -11 : 0;
  rc = lynx_mq_reserve(mq, req->len, &buf);
  if (rc)
    return rc == -11 ? -11 : 0;
  memcpy(buf, req->data, req->len);
  lynx_sockperf_make_reply(buf);
  lynx_mq_commit(mq, req->tag, req->len, req->len, LYNX_ST_OK);
  *replied = 1;
  return 0;
}
#endif

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

/* ---- client mqueue calls (docs/client-mqueues.md) ------------------------ */

/* ---- mc-get: memcached's text protocol ----------------------------------- */

#define LYNX_MC_KEY_MAX 250u
#define LYNX_MC_GET_CMD_MAX (LYNX_MC_KEY_MAX + 6u) /* "get " KEY "\r\n" */
/* How far into a reply its first line ("VALUE <key> <flags> <bytes>\r\n")
 * is looked for: a 250-byte key and two 10-digit numbers fit. */
#define LYNX_MC_LINE_MAX 320u

/* 1 when k[0, len) is a key mc-get sends: 1..250 bytes, none a space, a
 * control character or DEL (memcached's own rule). */
LYNX_HD int lynx_mc_key_ok(const uint8_t *k, uint32_t len) {
  if (len < 1 || len > LYNX_MC_KEY_MAX)
    return 0;
  for (uint32_t i = 0; i < len; i++)
    if (k[i] <= ' ' || k[i] == 0x7f)
      return 0;
  return 1;
}

/* Writes "get KEY\r\n" to out (klen + 6 <= LYNX_MC_GET_CMD_MAX bytes) and
 * returns its length. key is either apart from out or already at out + 4
 * (a block copies it there straight from the request). */
LYNX_HD uint32_t lynx_mc_get_cmd(uint8_t *out, const uint8_t *key,
                                 uint32_t klen) {
  out[0] = 'g';
  out[1] = 'e';
  out[2] = 't';
  out[3] = ' ';
  if (key != out + 4)
    for (uint32_t i = 0; i < klen; i++)
      out[4 + i] = key[i];
  out[4 + klen] = '\r';
  out[5 + klen] = '\n';
  return klen + 6u;
}

/* Reads a decimal u32 at r[*i, end): 0 and *v, *i past it; -1 when there is
 * no digit or it does not fit 32 bits. */
LYNX_HD int lynx_mc_u32(const uint8_t *r, uint32_t end, uint32_t *i,
                        uint32_t *v) {
  uint64_t x = 0;
  uint32_t start = *i;
  for (; *i < end && r[*i] >= '0' && r[*i] <= '9'; (*i)++) {
    x = x * 10u + (uint32_t)(r[*i] - '0');
    if (x > 0xffffffffu)
      return -1;
  }
  if (*i == start)
    return -1;
  *v = (uint32_t)x;
  return 0;
}

/*
 * The first part of a reply to "get": r holds the reply's first avail bytes
 * (at least min(n, LYNX_MC_LINE_MAX) of them), n is its whole length.
 * -2 (ENOENT) for a miss ("END\r\n"); 0 for a hit, "VALUE <key> <flags>
 * <bytes>[ <cas>]\r\n" then <bytes> bytes then "\r\nEND\r\n" exactly to the
 * end of the reply, with the value at [*voff, *voff + *vlen), provided the
 * 7 bytes after it are the END line (lynx_mc_get_end: the caller checks,
 * since a GPU reads the head and the tail of a reply separately);
 * -74 (EBADMSG) for anything else (an error reply, a malformed line).
 */
LYNX_HD int lynx_mc_get_head(const uint8_t *r, uint32_t avail, uint32_t n,
                             uint32_t *voff, uint32_t *vlen) {
  const char *value = "VALUE ", *end5 = "END\r\n";
  uint32_t e, i, flags, bytes;
  if (avail > n)
    avail = n;
  if (avail > LYNX_MC_LINE_MAX)
    avail = LYNX_MC_LINE_MAX;
  if (n == 5 && avail == 5) {
    for (i = 0; i < 5 && r[i] == (uint8_t)end5[i]; i++)
      ;
    if (i == 5)
      return -2;
  }
  for (e = 0; e < avail && r[e] != '\n'; e++)
    ;
  if (e == avail || e < 7 || r[e - 1] != '\r')
    return -74;
  for (i = 0; i < 6; i++)
    if (r[i] != (uint8_t)value[i])
      return -74;
  e--; /* the line without its "\r\n": r[0, e) */
  while (i < e && r[i] == ' ')
    i++;
  if (i == e || r[i] <= ' ')
    return -74; /* no key */
  while (i < e && r[i] > ' ')
    i++;
  if (i == e || r[i] != ' ')
    return -74;
  while (i < e && r[i] == ' ')
    i++;
  if (lynx_mc_u32(r, e, &i, &flags) || i == e || r[i] != ' ')
    return -74;
  while (i < e && r[i] == ' ')
    i++;
  if (lynx_mc_u32(r, e, &i, &bytes) || (i < e && r[i] != ' '))
    return -74; /* after the length: the end, or " <cas>" */
  if ((uint64_t)e + 2u + bytes + 7u != n)
    return -74;
  *voff = e + 2u;
  *vlen = bytes;
  return 0;
}

/* 1 when p[0, 7) is "\r\nEND\r\n", what follows a hit's value. */
LYNX_HD int lynx_mc_get_end(const uint8_t *p) {
  const char *end = "\r\nEND\r\n";
  for (uint32_t i = 0; i < 7; i++)
    if (p[i] != (uint8_t)end[i])
      return 0;
  return 1;
}

/* A whole reply to "get" in memory: 0 (hit, the value at [*voff, *voff +
 * *vlen)), -2 (ENOENT: miss) or -74 (EBADMSG: anything else). */
LYNX_HD int lynx_mc_parse_get(const uint8_t *r, uint32_t n, uint32_t *voff,
                              uint32_t *vlen) {
  int rc = lynx_mc_get_head(r, n, n, voff, vlen);
  if (rc == 0 && !lynx_mc_get_end(r + *voff + *vlen))
    rc = -74;
  return rc;
}

#endif
