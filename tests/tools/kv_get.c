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

#include "tool_common.h"

static double now_ms(void) { return (double)lynx_now_ns() / 1e6; }

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

/* Asks for each key in turn on a socket connected to target. 0, or 2 when
 * the target is no address or a send fails. */
static int get_keys(const struct cfg *cfg, char **keys, int n) {
  int timeout, rc, fd;
  struct sockaddr_in sa;
  static uint8_t buf[65536];
  /* a host or port that is no address fails quietly */
  rc = tool_ipv4_target(cfg->target, &sa);
  timeout = (int)cfg->timeout_ms;
  if (rc || (fd = tool_udp_connect(&sa, 0)) < 0)
    return 2;
  for (int ki = 0; ki < n; ki++) {
    const char *key = keys[ki];
    double t0 = now_ms();
    struct pollfd p = {fd, POLLIN, 0};
    ssize_t r = -1;
    if (send(fd, key, strlen(key), 0) < 0) {
      close(fd);
      return 2;
    }
    while (poll(&p, 1, timeout) > 0) {
      r = recv(fd, buf, sizeof(buf), 0);
      if (r >= 0 || errno != ECONNREFUSED)
        break;
    }
    if (r < 0) {
      printf("%s\ttimeout\tms=%.1f\n", key, now_ms() - t0);
      continue;
    }
    printf("%s\treply=", key);
    for (ssize_t k = 0; k < r; k++)
      if (buf[k] >= 0x20 && buf[k] < 0x7f && buf[k] != '\\')
        putchar(buf[k]);
      else
        printf("\\x%02x", buf[k]);
    printf("\tlen=%zd\tms=%.1f\n", r, now_ms() - t0);
    fflush(stdout);
  }
  close(fd);
  return 0;
}

int main(int argc, char **argv) {
  struct cfg cfg = {NULL, 0};
  struct lynx_opts_scan scan = {LYNX_OPTS_POSITIONAL, NULL, 0, 0, 0};
  struct sockaddr_in sa;
  char **keys;
  int rc;
  keys = calloc((size_t)argc, sizeof(*keys));
  if (!keys)
    return 2;
  scan.rest = keys;
  rc = tool_opts(opts, &cfg, argc, argv, USAGE, &scan);
  /* not HOST:PORT is a usage error */
  if (rc < 0 && tool_ipv4_target(cfg.target, &sa) == -EINVAL)
    rc = tool_usage(USAGE);
  if (rc < 0)
    rc = get_keys(&cfg, keys, scan.n_rest);
  lynx_opts_free(opts, &cfg);
  free(keys);
  return rc;
}
