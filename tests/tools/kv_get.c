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
#include <getopt.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
  static const struct option opts[] = {{"target", 1, 0, 't'},
                                       {"timeout-ms", 1, 0, 'T'},
                                       {0, 0, 0, 0}};
  char host[64] = "";
  unsigned port = 0;
  int timeout = 2000, o, fd;
  struct sockaddr_in sa = {.sin_family = AF_INET};
  static uint8_t buf[65536];
  while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    if (o == 't' && sscanf(optarg, "%63[^:]:%u", host, &port) == 2)
      continue;
    if (o == 'T') {
      timeout = atoi(optarg);
      continue;
    }
    fprintf(stderr, "usage: lynx-kv-get --target HOST:PORT [--timeout-ms T] "
                    "KEY...\n");
    return 2;
  }
  if (!port || inet_pton(AF_INET, host, &sa.sin_addr) != 1)
    return 2;
  sa.sin_port = htons((uint16_t)port);
  fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)))
    return 2;
  for (int i = optind; i < argc; i++) {
    double t0 = now_ms();
    struct pollfd p = {fd, POLLIN, 0};
    ssize_t n = -1;
    if (send(fd, argv[i], strlen(argv[i]), 0) < 0)
      return 2;
    while (poll(&p, 1, timeout) > 0) {
      n = recv(fd, buf, sizeof(buf), 0);
      if (n >= 0 || errno != ECONNREFUSED)
        break;
    }
    if (n < 0) {
      printf("%s\ttimeout\tms=%.1f\n", argv[i], now_ms() - t0);
      continue;
    }
    printf("%s\treply=", argv[i]);
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
