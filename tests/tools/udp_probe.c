/*
 * lynx-udp-probe - waits for a sockperf-echo service to answer.
 *
 * Sends a sockperf-style pong request (14-byte header: u64 seq, u16 flags =
 * client|pong-request, u32 length, network order; then zero padding up to
 * --size bytes) every --interval-ms and exits at the first answer to any of
 * them (the same seq with the pong-request flag and without the client
 * flag). An ICMP "port unreachable" (nothing bound yet) is ignored.
 *
 * Output (stdout, one line):
 *   udp_probe: answered=1 elapsed_ms=T sent=N seq=S realtime_ns=R
 * where T is measured from the probe's start and R is CLOCK_REALTIME at the
 * answer (a script compares it with the time it started something else);
 * or answered=0 after --timeout-ms.
 *
 * Exit status: 0 answered, 1 timed out, 2 usage or socket errors.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tool_common.h"

#define HDR 14u
#define F_CLIENT 0x1u
#define F_PONG 0x2u
#define SEQ_BASE 0x50524f4200000000ull /* "PROB" in the high half */

static uint64_t now_ns(clockid_t clk) {
  struct timespec ts;
  clock_gettime(clk, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#define USAGE                                                                  \
  "usage: lynx-udp-probe [--host 127.0.0.1] --port P [--size 64] "             \
  "[--interval-ms 5] [--timeout-ms 10000]\n"

struct cfg {
  char *host;
  uint32_t port, size, interval_ms, timeout_ms;
};

#define O(f) offsetof(struct cfg, f)
static const struct lynx_opt opts[] = {
    {"host", LYNX_OPT_STR, O(host), "127.0.0.1", 0, 0, NULL, ""},
    {"port", LYNX_OPT_U32, O(port), NULL, 1, 65535, NULL, ""},
    {"size", LYNX_OPT_U32, O(size), "64", HDR, 65507, NULL, ""},
    {"interval-ms", LYNX_OPT_U32, O(interval_ms), "5", 1, INT32_MAX, NULL, ""},
    {"timeout-ms", LYNX_OPT_U32, O(timeout_ms), "10000", 1, INT32_MAX, NULL,
     ""},
    LYNX_OPT_END,
};
#undef O

int main(int argc, char **argv) {
  static struct cfg cfg; /* its strings live as long as the process */
  uint8_t buf[65536], rx[65536];
  uint64_t t0, deadline, next_send, seq = 0;
  int fd, rc;

  if ((rc = tool_opts(opts, &cfg, argc, argv, USAGE, NULL)) >= 0 ||
      (rc = tool_udp_open(
           "lynx-udp-probe", USAGE, cfg.host, cfg.port, SOCK_NONBLOCK,
           "--host: '%s' is not an IPv4 address\n", 2, &fd)) >= 0)
    return rc;
  memset(buf, 0, sizeof(buf));
  t0 = now_ns(CLOCK_MONOTONIC);
  deadline = t0 + (uint64_t)cfg.timeout_ms * 1000000ull;
  next_send = t0;
  for (;;) {
    uint64_t now = now_ns(CLOCK_MONOTONIC);
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int wait_ms;
    if (now >= deadline)
      break;
    if (now >= next_send) {
      seq++;
      tool_sockperf_hdr(buf, SEQ_BASE | seq, F_CLIENT | F_PONG, cfg.size);
      /* ECONNREFUSED from an earlier datagram (port not bound yet) or a
       * full buffer: try again at the next interval */
      (void)!send(fd, buf, (size_t)cfg.size, 0);
      next_send += (uint64_t)cfg.interval_ms * 1000000ull;
      if (next_send < now)
        next_send = now + (uint64_t)cfg.interval_ms * 1000000ull;
    }
    wait_ms = (int)((next_send - now + 999999) / 1000000);
    if (poll(&pfd, 1, wait_ms) <= 0)
      continue;
    for (;;) {
      ssize_t n = recv(fd, rx, sizeof(rx), 0);
      uint64_t rseq;
      uint16_t fl;
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK)
          break;
        continue; /* ECONNREFUSED and the like: nobody there yet */
      }
      if (n < (ssize_t)HDR)
        continue;
      rseq = tool_get_be64(rx);
      fl = (uint16_t)(rx[8] << 8 | rx[9]);
      if ((rseq & 0xffffffff00000000ull) != SEQ_BASE ||
          (rseq & 0xffffffffull) == 0 || (rseq & 0xffffffffull) > seq ||
          !(fl & F_PONG) || (fl & F_CLIENT))
        continue;
      printf("udp_probe: answered=1 elapsed_ms=%.3f sent=%llu seq=%llu "
             "realtime_ns=%llu\n",
             (double)(now_ns(CLOCK_MONOTONIC) - t0) / 1e6,
             (unsigned long long)seq,
             (unsigned long long)(rseq & 0xffffffffull),
             (unsigned long long)now_ns(CLOCK_REALTIME));
      return 0;
    }
  }
  printf("udp_probe: answered=0 elapsed_ms=%.3f sent=%llu\n",
         (double)(now_ns(CLOCK_MONOTONIC) - t0) / 1e6, (unsigned long long)seq);
  return 1;
}
