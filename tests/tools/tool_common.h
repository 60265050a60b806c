/*
 * tool_common.h - what the test tools (tests/tools) and the bench programs
 * (bench/face_*.c) share: the command-line prologue around common/options.c
 * with the tools' exit codes, a monotonic clock in milliseconds, splitmix64,
 * big-endian 64-bit words and sockperf headers, numeric IPv4 addresses and
 * UDP sockets, HOST:PORT for libmemcached.
 *
 * Header-only (static inline): each tool is one .c file linked with
 * lynx_common, and not every tool uses every helper.
 */
#ifndef LYNX_TOOL_COMMON_H
#define LYNX_TOOL_COMMON_H

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "options.h"
#include "util.h"

/* The usage text on stderr; the exit status of a usage error. */
static inline int tool_usage(const char *usage) {
  fputs(usage, stderr);
  return LYNX_EXIT_USAGE;
}

/*
 * Parses argv into cfg the tools' way: --help prints the usage text alone,
 * a usage error prints the parser's message and then the usage text.
 * s: NULL, or the scan with its flags and rest (LYNX_OPTS_USAGE_ONLY is
 * added). Returns -1 when the tool goes on, else its exit status: 0 after
 * --help, LYNX_EXIT_USAGE after an error.
 */
static inline int tool_opts(const struct lynx_opt *tab, void *cfg, int argc,
                            char **argv, const char *usage,
                            struct lynx_opts_scan *s) {
  struct lynx_opts_scan own = {0, NULL, 0, 0, 0};
  if (!s)
    s = &own;
  s->flags |= LYNX_OPTS_USAGE_ONLY;
  if (lynx_opts_scan(tab, cfg, argc, argv, usage, s))
    return tool_usage(usage);
  return s->help ? 0 : -1;
}

static inline uint64_t tool_now_ms(void) { return lynx_now_ns() / 1000000u; }

/* splitmix64: advances *state and returns the next word; small, fast and
 * the same everywhere, so a seed reproduces a run. */
static inline uint64_t tool_splitmix(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static inline void tool_put_be64(uint8_t *p, uint64_t v) {
  for (int i = 7; i >= 0; i--, v >>= 8)
    p[i] = (uint8_t)v;
}

static inline uint64_t tool_get_be64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v = v << 8 | p[i];
  return v;
}

/* A sockperf message header (14 bytes, network order): u64 seq, u16 flags
 * (0x1 client, 0x2 pong request), u32 length of the whole message. */
static inline void tool_sockperf_hdr(uint8_t *p, uint64_t seq, uint16_t flags,
                                     uint32_t len) {
  tool_put_be64(p, seq);
  p[8] = (uint8_t)(flags >> 8);
  p[9] = (uint8_t)flags;
  p[10] = (uint8_t)(len >> 24);
  p[11] = (uint8_t)(len >> 16);
  p[12] = (uint8_t)(len >> 8);
  p[13] = (uint8_t)len;
}

/* A numeric IPv4 host and a port into *sa; -EINVAL when host is not one. */
static inline int tool_ipv4(const char *host, unsigned port,
                            struct sockaddr_in *sa) {
  memset(sa, 0, sizeof(*sa));
  sa->sin_family = AF_INET;
  sa->sin_port = htons((uint16_t)port);
  return inet_pton(AF_INET, host, &sa->sin_addr) == 1 ? 0 : -EINVAL;
}

/* --target HOST:PORT (numeric IPv4) into *sa: -EINVAL when it is missing
 * or not HOST:PORT, -EADDRNOTAVAIL when the port is 0 or the host not an
 * IPv4 address (the tools answer the two differently). */
static inline int tool_ipv4_target(const char *target, struct sockaddr_in *sa) {
  char host[64] = "";
  unsigned port = 0;
  if (!target || sscanf(target, "%63[^:]:%u", host, &port) != 2)
    return -EINVAL;
  if (!port || tool_ipv4(host, port, sa))
    return -EADDRNOTAVAIL;
  return 0;
}

/* HOST:PORT (lynx_parse_hostport: IPv4, [IPv6] or localhost) into *ss, and
 * into the numeric host and the port, for a library that takes those
 * (libmemcached). -EINVAL when s is not HOST:PORT or its port is 0. */
static inline int tool_split_hostport(const char *s,
                                      struct sockaddr_storage *ss, char *host,
                                      size_t hlen, unsigned *port) {
  char pbuf[16];
  socklen_t sl;
  if (lynx_parse_hostport(s, ss))
    return -EINVAL;
  sl = ss->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                 : sizeof(struct sockaddr_in);
  if (getnameinfo((struct sockaddr *)ss, sl, host, (socklen_t)hlen, pbuf,
                  sizeof(pbuf), NI_NUMERICHOST | NI_NUMERICSERV))
    return -EINVAL;
  *port = (unsigned)atoi(pbuf);
  return *port ? 0 : -EINVAL;
}

/* A UDP socket (type_flags: SOCK_NONBLOCK, SOCK_CLOEXEC) connected to *sa;
 * -errno, with errno set, when either step fails (for perror). */
/* A server thread's UDP socket on addr, shared with the process's other
 * threads (SO_REUSEPORT: the kernel spreads client flows over them), a
 * 200 ms receive timeout (the thread checks whether to stop) and 4 MiB
 * buffers (best effort). The descriptor, or -errno. */
static inline int tool_udp_server(const struct sockaddr_storage *addr) {
  int fd = socket(addr->ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0), one = 1;
  struct timeval tv = {.tv_sec = 0, .tv_usec = 200000};
  int buf = 4 << 20;
  if (fd < 0)
    return -errno;
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) ||
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) ||
      bind(fd, (const struct sockaddr *)addr, sizeof(*addr))) {
    int e = -errno;
    close(fd);
    return e;
  }
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
  return fd;
}

static inline int tool_udp_connect(const struct sockaddr_in *sa,
                                   int type_flags) {
  int fd = socket(AF_INET, SOCK_DGRAM | type_flags, 0), e;
  if (fd < 0)
    return -errno;
  if (connect(fd, (const struct sockaddr *)sa, sizeof(*sa)) == 0)
    return fd;
  e = errno;
  close(fd);
  errno = e;
  return -e;
}

/*
 * The UDP tools' --host and --port: *fd a UDP socket connected there and
 * -1 returned, or the tool's exit status after a message: the usage text
 * when --port was not given (0), 2 when host is not an IPv4 address
 * ("PROG: " and host_fmt, the tool's own words, with host as its one %s),
 * sock_exit when the socket fails (perror's "PROG: socket: " and the error).
 */
static inline int tool_udp_open(const char *prog, const char *usage,
                                const char *host, uint32_t port, int type_flags,
                                const char *host_fmt, int sock_exit, int *fd) {
  struct sockaddr_in sa;
  if (port == 0)
    return tool_usage(usage);
  if (tool_ipv4(host, port, &sa)) {
    fprintf(stderr, "%s: ", prog);
    fprintf(stderr, host_fmt, host);
    return 2;
  }
  if ((*fd = tool_udp_connect(&sa, type_flags)) < 0) {
    fprintf(stderr, "%s: socket: %s\n", prog, strerror(errno));
    return sock_exit;
  }
  return -1;
}

#endif
