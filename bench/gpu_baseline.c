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
 *                     [--streams N] [--work-us US] [--memcached HOST:PORT]
 *
 * face-verify (docs/face-verify.md): the host takes the datagrams waiting
 * for idle streams, fetches their stored images from memcached in one
 * round trip (memcached_mget, as lynx-face-baseline does), answers "ERROR"
 * itself for a malformed request, an unknown label or a failed fetch, and
 * runs the comparison on the GPU with face_dev.cuh, the code of Lynx's
 * face-verify kernel.
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

#include <libmemcached/memcached.h>

#include "face.h"
#include "gpu_baseline.h"
#include "lenet_model.h"
#include "options.h"
#include "util.h"

#define MSG_MAX 65536u

/* in enum lynx_gb_app's order */
static const char *const app_names[] = {"echo", "sockperf-echo", "face-verify",
                                        "lenet", NULL};

struct cfg {
  char *udp, *memcached, *lenet_model;
  uint32_t device, work_us, streams, mc_timeout_ms;
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
    {"memcached", LYNX_OPT_ADDR, O(memcached), "127.0.0.1:11211", 1, 65535,
     NULL, "face-verify: memcached holding the stored images (HOST:PORT)"},
    {"mc-timeout-ms", LYNX_OPT_U32, O(mc_timeout_ms), "500", 1, 60000, NULL,
     "face-verify: memcached connect and poll timeout"},
    {"lenet-model", LYNX_OPT_STR, O(lenet_model), LYNX_LENET_MODEL_DEFAULT, 0,
     0, NULL, "lenet: the weights file (docs/lenet.md)"},
    LYNX_OPT_END,
};
#undef O

static const char USAGE[] =
    "usage: lynx-gpu-baseline [--udp HOST:PORT] [--device N] [--app APP]\n"
    "                         [--streams N] [--work-us US] [--memcached H:P]\n"
    "                         [--lenet-model PATH]\n"
    "The host-centric GPU server (receive, copy in, kernel, copy out, send)\n"
    "that Lynx's GPU applications are compared with.";

static volatile sig_atomic_t stop;
static void on_signal(int sig) {
  (void)sig;
  stop = 1;
}

/* A stream's request: whom to answer, and (face-verify) what it needs. */
struct pending {
  int busy, got; /* got: received, not started yet */
  struct sockaddr_storage peer;
  socklen_t plen;
  uint8_t req[MSG_MAX];
  uint32_t len;
  char key[FACE_KEY_MAX];
  size_t key_len;
  uint8_t stored[FACE_PIXELS];
  int have_stored;
};

struct server {
  int fd;
  int app;
  struct lynx_gb *g;
  memcached_st *mc;
  memcached_result_st result;
  uint32_t n;
  struct pending *p;
  uint64_t received, answered, unanswered, errors;
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

/* face-verify: the stored image of every received request, in one
 * memcached round trip; the request's key and image set where found. */
static void fetch_images(struct server *sv) {
  const char *keys[256];
  size_t lens[256];
  size_t nk = 0;
  memcached_return_t rc;
  for (uint32_t i = 0; i < sv->n; i++) {
    struct pending *p = &sv->p[i];
    const uint8_t *label, *img;
    p->have_stored = 0;
    if (!p->got || face_req_parse(p->req, p->len, &label, &img) != 0)
      continue;
    p->key_len = (size_t)face_key(label, p->key);
    keys[nk] = p->key;
    lens[nk++] = p->key_len;
  }
  if (!nk)
    return;
  rc = memcached_mget(sv->mc, keys, lens, nk);
  if (rc != MEMCACHED_SUCCESS) {
    fprintf(stderr, "lynx-gpu-baseline: memcached get: %s\n",
            memcached_last_error_message(sv->mc));
    return;
  }
  for (;;) {
    memcached_result_st *r = memcached_fetch_result(sv->mc, &sv->result, &rc);
    const char *k;
    size_t kl;
    if (!r)
      return;
    k = memcached_result_key_value(r);
    kl = memcached_result_key_length(r);
    /* memcached answers a key once per time it was asked: the first
     * request with that key still waiting gets it */
    for (uint32_t i = 0; i < sv->n; i++) {
      struct pending *p = &sv->p[i];
      if (!p->got || p->have_stored || p->key_len != kl ||
          memcmp(p->key, k, kl) != 0)
        continue;
      if (memcached_result_length(r) == FACE_PIXELS) {
        memcpy(p->stored, memcached_result_value(r), FACE_PIXELS);
        p->have_stored = 1;
      }
      break;
    }
  }
}

/* Receives into idle streams while datagrams wait, fetches what they need
 * and starts them: the number taken, or -1. */
static int admit(struct server *sv) {
  char err[256];
  int taken = 0;
  for (uint32_t i = 0; i < sv->n; i++) {
    struct pending *p = &sv->p[i];
    ssize_t len;
    if (p->busy)
      continue;
    p->plen = sizeof(p->peer);
    len = recvfrom(sv->fd, p->req, sizeof(p->req), MSG_DONTWAIT,
                   (struct sockaddr *)&p->peer, &p->plen);
    if (len < 0)
      break; /* EAGAIN: nothing waits; an error: the next poll says */
    p->len = (uint32_t)len;
    p->got = 1;
    sv->received++;
    taken++;
  }
  if (taken && sv->app == LYNX_GB_FACE_VERIFY)
    fetch_images(sv);
  for (uint32_t i = 0; i < sv->n; i++) {
    struct pending *p = &sv->p[i];
    if (!p->got)
      continue;
    p->got = 0;
    if (sv->app == LYNX_GB_FACE_VERIFY && !p->have_stored) {
      /* malformed, unknown label, not an image, memcached failed */
      sv->errors++;
      (void)sendto(sv->fd, FACE_ERROR, FACE_ERROR_LEN, 0,
                   (struct sockaddr *)&p->peer, p->plen);
      continue;
    }
    if (lynx_gb_submit(sv->g, i, p->req, p->len,
                       sv->app == LYNX_GB_FACE_VERIFY ? p->stored : NULL,
                       sv->app == LYNX_GB_FACE_VERIFY ? FACE_PIXELS : 0, err,
                       sizeof(err))) {
      fprintf(stderr, "lynx-gpu-baseline: %s\n", err);
      return -1;
    }
    p->busy = 1;
  }
  return taken;
}

/* face-verify's memcached (libmemcached, one connection). 0, or -1 with
 * the reason in err. */
static int open_memcached(struct server *sv, const char *addr,
                          uint32_t timeout_ms, char *err, size_t errlen) {
  char host[256];
  const char *colon = strrchr(addr, ':');
  size_t hl = colon ? (size_t)(colon - addr) : 0;
  if (!colon || hl == 0 || hl >= sizeof(host)) {
    snprintf(err, errlen, "not HOST:PORT");
    return -1;
  }
  memcpy(host, addr, hl);
  host[hl] = 0;
  sv->mc = memcached_create(NULL);
  if (!sv->mc ||
      memcached_server_add(sv->mc, host, (in_port_t)atoi(colon + 1)) !=
          MEMCACHED_SUCCESS ||
      !memcached_result_create(sv->mc, &sv->result)) {
    snprintf(err, errlen, "cannot set up libmemcached");
    if (sv->mc)
      memcached_free(sv->mc);
    sv->mc = NULL;
    return -1;
  }
  memcached_behavior_set(sv->mc, MEMCACHED_BEHAVIOR_TCP_NODELAY, 1);
  memcached_behavior_set(sv->mc, MEMCACHED_BEHAVIOR_CONNECT_TIMEOUT,
                         timeout_ms);
  memcached_behavior_set(sv->mc, MEMCACHED_BEHAVIOR_POLL_TIMEOUT, timeout_ms);
  memcached_behavior_set(sv->mc, MEMCACHED_BEHAVIOR_RETRY_TIMEOUT, 1);
  return 0;
}

static void close_memcached(struct server *sv) {
  if (!sv->mc)
    return;
  memcached_result_free(&sv->result);
  memcached_free(sv->mc);
  sv->mc = NULL;
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
  struct lenet_model *model = NULL;
  char err[320];
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
      bind(sv.fd, (struct sockaddr *)&ss,
           ss.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                    : sizeof(struct sockaddr_in))) {
    fprintf(stderr, "lynx-gpu-baseline: UDP %s: %s\n", cfg.udp,
            strerror(errno));
    if (sv.fd >= 0)
      close(sv.fd);
    lynx_opts_free(opts, &cfg);
    return LYNX_EXIT_RUNTIME;
  }
  if (cfg.app == LYNX_GB_LENET &&
      lenet_model_load(cfg.lenet_model, &model, err, sizeof(err))) {
    fprintf(stderr, "lynx-gpu-baseline: --lenet-model %s: %s\n",
            cfg.lenet_model, err);
    close(sv.fd);
    lynx_opts_free(opts, &cfg);
    return LYNX_EXIT_USAGE;
  }
  gc = (struct lynx_gb_cfg){
      .device = (int)cfg.device,
      .app = (enum lynx_gb_app)cfg.app,
      .streams = cfg.streams,
      .req_max = MSG_MAX,
      .aux_max = cfg.app == LYNX_GB_FACE_VERIFY ? FACE_PIXELS : 0,
      .resp_max = cfg.app == LYNX_GB_FACE_VERIFY ? FACE_RESP_LEN
                  : cfg.app == LYNX_GB_LENET     ? LENET_RESP_MAX
                                                 : MSG_MAX,
      .work_us = cfg.work_us,
      .params = model ? model->params : NULL};
  sv.app = cfg.app;
  sv.n = cfg.streams;
  sv.p = calloc(sv.n, sizeof(*sv.p));
  if (sv.p && sv.app == LYNX_GB_FACE_VERIFY &&
      open_memcached(&sv, cfg.memcached, cfg.mc_timeout_ms, err, sizeof(err))) {
    fprintf(stderr, "lynx-gpu-baseline: --memcached %s: %s\n", cfg.memcached,
            err);
    lenet_model_free(model);
    free(sv.p);
    close(sv.fd);
    lynx_opts_free(opts, &cfg);
    return LYNX_EXIT_USAGE;
  }
  if (!sv.p || lynx_gb_open(&gc, &sv.g, err, sizeof(err))) {
    fprintf(stderr, "lynx-gpu-baseline: GPU %u: %s\n", cfg.device,
            sv.p ? err : "out of memory");
    close_memcached(&sv);
    lenet_model_free(model);
    free(sv.p);
    close(sv.fd);
    lynx_opts_free(opts, &cfg);
    return LYNX_EXIT_RUNTIME;
  }
  fprintf(stderr,
          "lynx-gpu-baseline: serving UDP %s on GPU %u: %s, %u "
          "streams\n",
          cfg.udp, cfg.device, app_names[cfg.app], cfg.streams);
  rc = serve(&sv);
  fprintf(stderr,
          "lynx-gpu-baseline: %llu requests, %llu answered by the "
          "GPU, %llu without an answer, %llu answered ERROR by the host\n",
          (unsigned long long)sv.received, (unsigned long long)sv.answered,
          (unsigned long long)sv.unanswered, (unsigned long long)sv.errors);
  lynx_gb_close(sv.g);
  close_memcached(&sv);
  lenet_model_free(model);
  free(sv.p);
  close(sv.fd);
  lynx_opts_free(opts, &cfg);
  return rc;
}
