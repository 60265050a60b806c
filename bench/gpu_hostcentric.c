/*
 * gpu_hostcentric.c - lynx-gpu-hostcentric: the host-centric GPU server
 * Lynx replaces, as the baseline of bench/gpu.sh (issue 13). A host thread
 * receives a datagram, copies it into the GPU, launches a one-block kernel
 * running sockperf-echo (accel/app_logic.h, what Lynx's persistent kernel
 * runs), copies the answer back, waits for the stream and sends it: the
 * host CPU and two copies on every request, one request at a time.
 *
 *   lynx-gpu-hostcentric [--udp HOST:PORT] [--device N] [--work-us US]
 *
 * Runs until SIGINT or SIGTERM; exits 1 when the GPU cannot be used.
 */
#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "gpu_hostcentric.h"
#include "options.h"
#include "util.h"

#define MSG_MAX 65536

struct cfg {
  char *udp;
  uint32_t device, work_us;
};

#define O(f) offsetof(struct cfg, f)
static const struct lynx_opt opts[] = {
    {"udp", LYNX_OPT_ADDR, O(udp), "127.0.0.1:7400", 1, 65535, NULL,
     "UDP address to serve on (HOST:PORT)"},
    {"device", LYNX_OPT_U32, O(device), "0", 0, 63, NULL, "CUDA ordinal"},
    {"work-us", LYNX_OPT_U32, O(work_us), "0", 0, 1000000, NULL,
     "emulated processing per request on the GPU, microseconds"},
    LYNX_OPT_END,
};
#undef O

static const char USAGE[] =
    "usage: lynx-gpu-hostcentric [--udp HOST:PORT] [--device N] "
    "[--work-us US]\n"
    "The host-centric GPU server (recvfrom, copy in, kernel, copy out,\n"
    "sendto) that bench/gpu.sh compares Lynx with; answers like\n"
    "sockperf's server.";

static volatile sig_atomic_t stop;
static void on_signal(int sig) {
  (void)sig;
  stop = 1;
}

/* Serves until stopped: 0, or 1 after a socket or GPU failure. */
static int serve(int fd, struct lynx_hc *h) {
  static uint8_t req[MSG_MAX], resp[MSG_MAX];
  char err[256];
  while (!stop) {
    struct sockaddr_storage peer;
    socklen_t plen = sizeof(peer);
    ssize_t n = recvfrom(fd, req, sizeof(req), 0, (struct sockaddr *)&peer,
                         &plen);
    int rc;
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
        continue;
      fprintf(stderr, "lynx-gpu-hostcentric: recvfrom: %s\n", strerror(errno));
      return 1;
    }
    rc = lynx_hc_serve(h, req, (uint32_t)n, resp, err, sizeof(err));
    if (rc < 0) {
      fprintf(stderr, "lynx-gpu-hostcentric: %s\n", err);
      return 1;
    }
    if (rc > 0)
      (void)sendto(fd, resp, (size_t)n, 0, (struct sockaddr *)&peer, plen);
  }
  return 0;
}

int main(int argc, char **argv) {
  struct cfg cfg;
  struct sockaddr_storage ss;
  struct sigaction sa;
  struct timeval tv = {0, 200000}; /* wake to see a signal */
  struct lynx_hc *h = NULL;
  char err[256];
  int help = 0, fd, rc;
  memset(&cfg, 0, sizeof(cfg));
  if (lynx_opts_parse(opts, &cfg, argc, argv, USAGE, &help))
    return LYNX_EXIT_USAGE;
  if (help) {
    lynx_opts_free(opts, &cfg);
    return 0;
  }
  if (lynx_parse_hostport(cfg.udp, &ss)) {
    fprintf(stderr, "lynx-gpu-hostcentric: --udp %s: not HOST:PORT\n",
            cfg.udp);
    lynx_opts_free(opts, &cfg);
    return LYNX_EXIT_USAGE;
  }
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_signal; /* no SA_RESTART: recvfrom returns EINTR */
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  fd = socket(ss.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) ||
      bind(fd, (struct sockaddr *)&ss, ss.ss_family == AF_INET6
                                           ? sizeof(struct sockaddr_in6)
                                           : sizeof(struct sockaddr_in))) {
    fprintf(stderr, "lynx-gpu-hostcentric: UDP %s: %s\n", cfg.udp,
            strerror(errno));
    lynx_opts_free(opts, &cfg);
    return LYNX_EXIT_RUNTIME;
  }
  if (lynx_hc_open((int)cfg.device, MSG_MAX, cfg.work_us, &h, err,
                   sizeof(err))) {
    fprintf(stderr, "lynx-gpu-hostcentric: GPU %u: %s\n", cfg.device, err);
    close(fd);
    lynx_opts_free(opts, &cfg);
    return LYNX_EXIT_RUNTIME;
  }
  fprintf(stderr, "lynx-gpu-hostcentric: serving UDP %s on GPU %u\n",
          cfg.udp, cfg.device);
  rc = serve(fd, h);
  lynx_hc_close(h);
  close(fd);
  lynx_opts_free(opts, &cfg);
  return rc;
}
