/*
 * gpu_baseline.c - lynx-gpu-baseline: the host-centric GPU server Lynx is
 * compared with (paper §6; bench/gpu.sh, bench/paper-gpu.sh). One host
 * thread receives datagrams, fetches what a request needs from its back
 * end, and runs each request on one of a pool of CUDA streams: copy in,
 * one kernel, copy out (bench/gpu_baseline_kernel.cu, the same device code
 * the Lynx applications run), then sends the answer once the stream's
 * event says it is done. Several requests are in flight (--streams); with
 * --streams 1 it is the strict one-at-a-time server.
 *
 *   lynx-gpu-baseline [--udp HOST:PORT] [--device N] [--app APP]
 *                     [--streams N] [--work-us US]
 *
 * Bad input never stops it: what the application would drop gets no
 * answer. Runs until SIGINT or SIGTERM (then prints its totals); exits 1
 * when the GPU cannot be used or fails.
 */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gpu_baseline.h"
#include "options.h"
#include "util.h"

#define MSG_MAX 65536u

static const char *const app_names[] = {"echo", "sockperf-echo", NULL};

struct cfg {
  char *udp;
  uint32_t device, work_us, streams;
  int app;
};

#define O(f) offsetof(struct cfg, f)
static const struct lynx_opt opts[] = {
    {"udp", LYNX_OPT_ADDR, O(udp), "127.0.0.1:7400", 1, 65535, NULL,
     "UDP address to serve on (HOST:PORT)"},
    {"device", LYNX_OPT_U32, O(device), "0", 0, 63, NULL, "CUDA ordinal"},
    {"app", LYNX_OPT_ENUM, O(app), "sockperf-echo", 0, 0, app_names,
     "the application the kernel runs"},
    {"streams", LYNX_OPT_U32, O(streams), "4", 1, 256, NULL,
     "CUDA streams, one request in flight on each"},
    {"work-us", LYNX_OPT_U32, O(work_us), "0", 0, 1000000, NULL,
     "emulated processing per request on the GPU, microseconds"},
    LYNX_OPT_END,
};
#undef O

static const char USAGE[] =
    "usage: lynx-gpu-baseline [--udp HOST:PORT] [--device N] [--app APP]\n"
    "                         [--streams N] [--work-us US]\n"
    "The host-centric GPU server (receive, copy in, kernel, copy out, send)\n"
    "that Lynx's GPU applications are compared with.";

static volatile sig_atomic_t stop;
static void on_signal(int sig) {
  (void)sig;
  stop = 1;
}

/* A stream's request in flight: whom to answer. */
struct pending {
  int busy;
  struct sockaddr_storage peer;
  socklen_t plen;
};

struct server {
  int fd;
  struct lynx_gb *g;
  uint32_t n;
  struct pending *p;
  uint64_t received, answered, unanswered;
};

/* Sends the answers of finished streams: the number finished, or -1. */
static int reap(struct server *sv) {
  char err[256];
  int done = 0;
  for (uint32_t i = 0; i < sv->n; i++) {
    const uint8_t *resp;
    uint32_t len;
    int rc;
    if (!sv->p[i].busy)
      continue;
    rc = lynx_gb_poll(sv->g, i, &resp, &len, err, sizeof(err));
    if (rc < 0) {
      fprintf(stderr, "lynx-gpu-baseline: %s\n", err);
      return -1;
    }
    if (!rc)
      continue;
    sv->p[i].busy = 0;
    done++;
    if (!len) {
      sv->unanswered++;
      continue;
    }
    sv->answered++;
    (void)sendto(sv->fd, resp, len, 0, (struct sockaddr *)&sv->p[i].peer,
                 sv->p[i].plen);
  }
  return done;
}

/* Receives into idle streams while datagrams wait: the number started,
 * or -1. */
static int admit(struct server *sv) {
  static uint8_t req[MSG_MAX];
  char err[256];
  int started = 0;
  for (uint32_t i = 0; i < sv->n; i++) {
    struct pending *p = &sv->p[i];
    ssize_t len;
    if (p->busy)
      continue;
    p->plen = sizeof(p->peer);
    len = recvfrom(sv->fd, req, sizeof(req), MSG_DONTWAIT,
                   (struct sockaddr *)&p->peer, &p->plen);
    if (len < 0)
      break; /* EAGAIN: nothing waits; an error: the next poll says */
    sv->received++;
    if (lynx_gb_submit(sv->g, i, req, (uint32_t)len, NULL, 0, err,
                       sizeof(err))) {
      fprintf(stderr, "lynx-gpu-baseline: %s\n", err);
      return -1;
    }
    p->busy = 1;
    started++;
  }
  return started;
}

static int serve(struct server *sv) {
  uint32_t idle = 0;
  while (!stop) {
    int r = reap(sv), a = r < 0 ? -1 : admit(sv), busy = 0;
    if (r < 0 || a < 0)
      return 1;
    for (uint32_t i = 0; i < sv->n; i++)
      busy |= sv->p[i].busy;
    if (r || a) {
      idle = 0;
    } else if (!busy) {
      struct pollfd pf = {sv->fd, POLLIN, 0};
      (void)poll(&pf, 1, 200); /* wake to see a signal */
    } else if (++idle > 64) {
      sched_yield(); /* a kernel runs: leave the core to the client */
    }
  }
  return 0;
}

int main(int argc, char **argv) {
  struct cfg cfg;
  struct sockaddr_storage ss;
  struct sigaction sa;
  struct server sv;
  struct lynx_gb_cfg gc;
  char err[256];
  int help = 0, rc;
  memset(&cfg, 0, sizeof(cfg));
  memset(&sv, 0, sizeof(sv));
  if (lynx_opts_parse(opts, &cfg, argc, argv, USAGE, &help))
    return LYNX_EXIT_USAGE;
  if (help) {
    lynx_opts_free(opts, &cfg);
    return 0;
  }
  if (lynx_parse_hostport(cfg.udp, &ss)) {
    fprintf(stderr, "lynx-gpu-baseline: --udp %s: not HOST:PORT\n", cfg.udp);
    lynx_opts_free(opts, &cfg);
    return LYNX_EXIT_USAGE;
  }
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sv.fd = socket(ss.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (sv.fd < 0 ||
      bind(sv.fd, (struct sockaddr *)&ss, ss.ss_family == AF_INET6
                                               ? sizeof(struct sockaddr_in6)
                                               : sizeof(struct sockaddr_in))) {
    fprintf(stderr, "lynx-gpu-baseline: UDP %s: %s\n", cfg.udp,
            strerror(errno));
    if (sv.fd >= 0)
      close(sv.fd);
    lynx_opts_free(opts, &cfg);
    return LYNX_EXIT_RUNTIME;
  }
  gc = (struct lynx_gb_cfg){.device = (int)cfg.device,
                            .app = (enum lynx_gb_app)cfg.app,
                            .streams = cfg.streams,
                            .req_max = MSG_MAX,
                            .resp_max = MSG_MAX,
                            .work_us = cfg.work_us};
  sv.n = cfg.streams;
  sv.p = calloc(sv.n, sizeof(*sv.p));
  if (!sv.p || lynx_gb_open(&gc, &sv.g, err, sizeof(err))) {
    fprintf(stderr, "lynx-gpu-baseline: GPU %u: %s\n", cfg.device,
            sv.p ? err : "out of memory");
    free(sv.p);
    close(sv.fd);
    lynx_opts_free(opts, &cfg);
    return LYNX_EXIT_RUNTIME;
  }
  fprintf(stderr, "lynx-gpu-baseline: serving UDP %s on GPU %u: %s, %u "
          "streams\n", cfg.udp, cfg.device, app_names[cfg.app], cfg.streams);
  rc = serve(&sv);
  fprintf(stderr, "lynx-gpu-baseline: %llu requests, %llu answered, %llu "
          "without an answer\n", (unsigned long long)sv.received,
          (unsigned long long)sv.answered,
          (unsigned long long)sv.unanswered);
  lynx_gb_close(sv.g);
  free(sv.p);
  close(sv.fd);
  lynx_opts_free(opts, &cfg);
  return rc;
}
