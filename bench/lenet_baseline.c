/*
 * lynx-lenet-baseline - the host-centric LeNet server bench/lenet.sh
 * compares Lynx with: no mqueues, no accelerator; host threads receive each
 * request, run the same inference the lenet application runs (accel/lenet.c
 * over the same weights file) and answer in the same format (lenet.h,
 * docs/lenet.md).
 *
 *   lynx-lenet-baseline --udp 127.0.0.1:7400 --model FILE [--threads N]
 *                       [--batch B]
 *
 * Each of the N threads owns a UDP socket bound to the same address
 * (SO_REUSEPORT: the kernel spreads client flows over them), takes up to B
 * datagrams at once (recvmmsg) and sends their answers together
 * (sendmmsg). A request of the wrong size gets no answer, as from the
 * application, and is counted. SIGINT/SIGTERM print the totals and exit 0;
 * a weights file that does not load is exit status 1 with the reason.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "lenet_model.h"
#include "log.h"
#include "tool_common.h"

#define BATCH_MAX 64

#ifndef LYNX_LENET_MODEL_DEFAULT
#define LYNX_LENET_MODEL_DEFAULT "models/lenet-fashion.bin"
#endif

struct cfg {
  char *udp, *model, *log_level;
  uint32_t threads, batch;
};

#define O(f) offsetof(struct cfg, f)
static const struct lynx_opt opts[] = {
    {"udp", LYNX_OPT_STR, O(udp), "127.0.0.1:7400", 0, 0, NULL,
     "UDP address to serve on (HOST:PORT)"},
    {"model", LYNX_OPT_STR, O(model), LYNX_LENET_MODEL_DEFAULT, 0, 0, NULL,
     "the weights file (tools/train-lenet.py)"},
    {"threads", LYNX_OPT_U32, O(threads), "2", 1, 64, NULL,
     "server threads, each with its socket"},
    {"batch", LYNX_OPT_U32, O(batch), "16", 1, BATCH_MAX, NULL,
     "datagrams taken (and answered) at once"},
    {"log-level", LYNX_OPT_STR, O(log_level), "info", 0, 0, NULL,
     "error|warn|info|debug"},
    LYNX_OPT_END,
};
#undef O

struct worker {
  pthread_t thread;
  int fd;
  uint64_t requests, answered, malformed, send_errors;
  uint8_t req[BATCH_MAX][LENET_REQ_MAX + 1];
  uint8_t resp[BATCH_MAX][LENET_RESP_MAX];
  struct sockaddr_storage from[BATCH_MAX];
  struct mmsghdr rx[BATCH_MAX], tx[BATCH_MAX];
  struct iovec rxv[BATCH_MAX], txv[BATCH_MAX];
};

static struct cfg cfg;
static struct sockaddr_storage udp_addr;
static struct lenet_model *model;
static volatile int stopping;

static void *worker_main(void *arg) {
  struct worker *w = arg;
  while (!stopping) {
    int n, m = 0;
    for (uint32_t i = 0; i < cfg.batch; i++) {
      w->rxv[i] = (struct iovec){w->req[i], sizeof(w->req[i])};
      w->rx[i].msg_hdr = (struct msghdr){.msg_name = &w->from[i],
                                         .msg_namelen = sizeof(w->from[i]),
                                         .msg_iov = &w->rxv[i],
                                         .msg_iovlen = 1};
    }
    /* one datagram blocks (up to the receive timeout), the rest are taken
     * if already there */
    n = recvmmsg(w->fd, w->rx, cfg.batch, MSG_WAITFORONE, NULL);
    if (n <= 0)
      continue; /* timeout (stopping is checked), EINTR */
    for (int i = 0; i < n; i++) {
      float logits[LENET_CLASSES];
      int clen = lenet_req_cookie_len(w->rx[i].msg_len);
      w->requests++;
      if (clen < 0 || (w->rx[i].msg_hdr.msg_flags & MSG_TRUNC)) {
        w->malformed++;
        LYNX_LOG_RL(LYNX_LOG_INFO, "lenet", "a %u-byte request, dropped",
                    w->rx[i].msg_len);
        continue;
      }
      int cls = lenet_infer(model, w->req[i], logits);
      w->txv[m] =
          (struct iovec){w->resp[m], lenet_resp_encode(w->resp[m], cls, logits,
                                                       w->req[i] + LENET_PIXELS,
                                                       (uint32_t)clen)};
      w->tx[m].msg_hdr =
          (struct msghdr){.msg_name = &w->from[i],
                          .msg_namelen = w->rx[i].msg_hdr.msg_namelen,
                          .msg_iov = &w->txv[m],
                          .msg_iovlen = 1};
      m++;
    }
    for (int done = 0; done < m;) {
      int s = sendmmsg(w->fd, w->tx + done, (unsigned)(m - done), 0);
      if (s <= 0) { /* the rest of the batch is lost */
        w->send_errors += (uint64_t)(m - done);
        break;
      }
      w->answered += (uint64_t)s;
      done += s;
    }
  }
  return NULL;
}

int main(int argc, char **argv) {
  static struct worker workers[64];
  uint32_t started = 0;
  int rc, help = 0, lvl, exit_code = 1, sig;
  sigset_t set;
  char why[512], abuf[64];
  rc = lynx_opts_parse(opts, &cfg, argc, argv,
                       "usage: lynx-lenet-baseline --udp HOST:PORT --model "
                       "FILE [--threads N]\n"
                       "Host-centric LeNet server (the baseline of "
                       "bench/lenet.sh; docs/lenet.md).",
                       &help);
  if (rc || help)
    return rc ? LYNX_EXIT_USAGE : 0;
  lvl = lynx_log_parse_level(cfg.log_level);
  if (lvl < 0) {
    fprintf(stderr, "--log-level: unknown level '%s'\n", cfg.log_level);
    exit_code = LYNX_EXIT_USAGE;
    goto out;
  }
  lynx_log_level = lvl;
  if (lynx_parse_hostport(cfg.udp, &udp_addr)) {
    fprintf(stderr, "--udp: '%s' is not HOST:PORT\n", cfg.udp);
    exit_code = LYNX_EXIT_USAGE;
    goto out;
  }
  if (lenet_model_load(cfg.model, &model, why, sizeof(why))) {
    fprintf(stderr, "lynx-lenet-baseline: %s\n", why);
    goto out;
  }
  /* the workers inherit a mask without SIGINT/SIGTERM: main waits for them */
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  for (uint32_t i = 0; i < cfg.threads; i++) {
    struct worker *w = &workers[i];
    w->fd = tool_udp_server(&udp_addr);
    if (w->fd < 0) {
      LYNX_ERR("lenet", "udp %s: %s", cfg.udp, strerror(-w->fd));
      goto stop;
    }
    rc = pthread_create(&w->thread, NULL, worker_main, w);
    if (rc) {
      LYNX_ERR("lenet", "thread: %s", strerror(rc));
      close(w->fd);
      goto stop;
    }
    started++;
  }
  LYNX_INFO("lenet",
            "serving LeNet on udp %s, %u threads, batch %u, "
            "weights %s (CRC-32 %08x)",
            lynx_fmt_addr((struct sockaddr *)&udp_addr, abuf, sizeof(abuf)),
            cfg.threads, cfg.batch, cfg.model, model->crc);
  sigwait(&set, &sig);
  LYNX_INFO("lenet", "%s, shutting down", strsignal(sig));
  exit_code = 0;
stop:
  stopping = 1;
  uint64_t rq = 0, an = 0, bad = 0, se = 0;
  for (uint32_t i = 0; i < started; i++) {
    pthread_join(workers[i].thread, NULL);
    rq += workers[i].requests;
    an += workers[i].answered;
    bad += workers[i].malformed;
    se += workers[i].send_errors;
    close(workers[i].fd);
  }
  if (started)
    LYNX_INFO("lenet",
              "totals: requests=%llu answered=%llu malformed=%llu "
              "send_errors=%llu",
              (unsigned long long)rq, (unsigned long long)an,
              (unsigned long long)bad, (unsigned long long)se);
out:
  lenet_model_free(model);
  lynx_opts_free(opts, &cfg);
  return exit_code;
}
