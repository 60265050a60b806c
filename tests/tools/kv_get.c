/*
 * lynx-kv-get - asks a key/value service (e.g. mc-get) for keys over UDP,
 * one at a time, and prints what came back.
 *
 *   lynx-kv-get --target HOST:PORT [--timeout-ms T] KEY...
 *
 * One line per key on stdout:
 *   KEY <tab> reply=<bytes, C-escaped> <tab> len=N <tab> ms=M
 * or, when nothing came back in time:
 *   KEY <tab> timeout <tab> ms=M
 * Exit status: 0 (the caller judges the answers), 2 on usage or socket
 * errors.
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

#include "options.h"

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

#define USAGE "usage: lynx-kv-get --target HOST:PORT [--timeout-ms T] KEY...\n"

struct cfg {
  char *target;
  uint32_t timeout_ms;
};

#define O(f) offsetof(struct cfg, f)
static const struct lynx_opt opts[] = {
    {"target", LYNX_OPT_STR, O(target), NULL, 0, 0, NULL, "HOST:PORT"},
    {"timeout-ms", LYNX_OPT_U32, O(timeout_ms), "2000", 0, 3600000, NULL,
     "wait this long for each answer"},
    LYNX_OPT_END,
};
#undef O

int main(int argc, char **argv) {
  struct cfg cfg = {NULL, 0};
  struct lynx_opts_scan scan = {LYNX_OPTS_POSITIONAL | LYNX_OPTS_USAGE_ONLY,
                                NULL, 0, 0, 0};
  char host[64] = "", **keys;
  unsigned port = 0;
  int timeout, rc, fd;
  struct sockaddr_in sa = {.sin_family = AF_INET};
  static uint8_t buf[65536];
  keys = calloc((size_t)argc, sizeof(*keys));
  if (!keys)
    return 2;
  scan.rest = keys;
  rc = lynx_opts_scan(opts, &cfg, argc, argv, USAGE, &scan);
  if (scan.help)
    return 0;
  if (rc < 0 || !cfg.target ||
      sscanf(cfg.target, "%63[^:]:%u", host, &port) != 2) {
    fprintf(stderr, USAGE);
    return 2;
  }
  timeout = (int)cfg.timeout_ms;
  if (!port || inet_pton(AF_INET, host, &sa.sin_addr) != 1)
    return 2;
  sa.sin_port = htons((uint16_t)port);
  fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)))
    return 2;
  for (int ki = 0; ki < scan.n_rest; ki++) {
    const char *key = keys[ki];
    double t0 = now_ms();
    struct pollfd p = {fd, POLLIN, 0};
    ssize_t n = -1;
    if (send(fd, key, strlen(key), 0) < 0)
      return 2;
    while (poll(&p, 1, timeout) > 0) {
      n = recv(fd, buf, sizeof(buf), 0);
      if (n >= 0 || errno != ECONNREFUSED)
        break;
    }
    if (n < 0) {
      printf("%s\ttimeout\tms=%.1f\n", key, now_ms() - t0);
      continue;
    }
    printf("%s\treply=", key);
    for (ssize_t k = 0; k < n; k++)
      if (buf[k] >= 0x20 && buf[k] < 0x7f && buf[k] != '\\')
        putchar(buf[k]);
      else
        printf("\\x%02x", buf[k]);
    printf("\tlen=%zd\tms=%.1f\n", n, now_ms() - t0);
    fflush(stdout);
  }
  return 0;
}
