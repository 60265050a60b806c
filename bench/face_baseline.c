/*
 * lynx-face-baseline - the host-centric face verification server (paper
 * §6.4, "host-centric baseline"): no mqueues, no accelerator; the host CPU
 * receives each request, fetches the stored image from memcached and runs
 * the same face_verify (accel/face.c) the accelerator application runs.
 *
 *   lynx-face-baseline --udp 127.0.0.1:7300 --memcached 127.0.0.1:11211
 *                      [--threads N] [--batch B]
 *
 * Each of the N threads owns a UDP socket bound to the same address
 * (SO_REUSEPORT: the kernel spreads client flows over them) and its own
 * memcached connection. A thread takes up to B datagrams at once
 * (recvmmsg), asks memcached for all their images in one round trip
 * (memcached_mget: the paper's baseline keeps several memcached requests
 * in flight too), verifies each and sends the answers (sendmmsg).
 *
 * Formats are in accel/face.h and docs/face-verify.md. A malformed request
 * (not 1036 bytes, bad label), an unknown label, a stored value that is not
 * 1024 bytes or a memcached failure is answered with the 5 bytes "ERROR";
 * the server never exits on bad input, it counts each kind and logs it at
 * most once per second per thread. SIGINT/SIGTERM print the totals and exit.
 */
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <libmemcached/memcached.h>

#include "face.h"
#include "log.h"
#include "tool_common.h"

#define BATCH_MAX 64

struct cfg {
  char *udp;
  char *memcached;
  uint32_t threads;
  uint32_t batch;
  uint32_t mc_timeout_ms;
  char *log_level;
};

#define O(f) offsetof(struct cfg, f)
static const struct lynx_opt opts[] = {
    {"udp", LYNX_OPT_STR, O(udp), "127.0.0.1:7300", 0, 0, NULL,
     "UDP address to serve on (HOST:PORT)"},
    {"memcached", LYNX_OPT_STR, O(memcached), "127.0.0.1:11211", 0, 0, NULL,
     "memcached holding the stored images (HOST:PORT)"},
    {"threads", LYNX_OPT_U32, O(threads), "2", 1, 64, NULL,
     "server threads, each with its socket and memcached connection"},
    {"batch", LYNX_OPT_U32, O(batch), "16", 1, BATCH_MAX, NULL,
     "requests taken at once and fetched in one memcached round trip"},
    {"mc-timeout-ms", LYNX_OPT_U32, O(mc_timeout_ms), "1000", 1, 60000, NULL,
     "memcached connect and I/O timeout"},
    {"log-level", LYNX_OPT_STR, O(log_level), "info", 0, 0, NULL,
     "error|warn|info|debug"},
    LYNX_OPT_END,
};
#undef O

struct stats {
  lynx_counter requests, answered, matches, malformed, not_found, bad_value,
      mc_errors, send_errors;
};

/* One batch of requests as it goes through the server. */
struct batch {
  int n;
  uint8_t req[BATCH_MAX][FACE_REQ_LEN + 1];
  struct sockaddr_storage from[BATCH_MAX];
  struct mmsghdr rx[BATCH_MAX], tx[BATCH_MAX];
  struct iovec rxv[BATCH_MAX], txv[BATCH_MAX];
  char key[BATCH_MAX][FACE_KEY_MAX];
  size_t key_len[BATCH_MAX];
  int valid[BATCH_MAX]; /* parsed, waiting for its image */
  int done[BATCH_MAX];  /* answer ready in resp */
  uint8_t resp[BATCH_MAX][FACE_RESP_LEN];
  uint32_t resp_len[BATCH_MAX];
};

struct worker {
  pthread_t thread;
  int id;
  int fd;
  memcached_st *mc;
  memcached_result_st result;
  struct stats st;
  struct batch b;
};

static struct cfg cfg;
static struct sockaddr_storage udp_addr, mc_addr;
static char mc_host[NI_MAXHOST];
static unsigned mc_port;
static volatile int stopping;

static memcached_st *open_memcached(void) {
  memcached_st *mc = memcached_create(NULL);
  if (!mc)
    return NULL;
  if (memcached_server_add(mc, mc_host, (in_port_t)mc_port) !=
      MEMCACHED_SUCCESS) {
    memcached_free(mc);
    return NULL;
  }
  memcached_behavior_set(mc, MEMCACHED_BEHAVIOR_TCP_NODELAY, 1);
  memcached_behavior_set(mc, MEMCACHED_BEHAVIOR_CONNECT_TIMEOUT,
                         cfg.mc_timeout_ms);
  memcached_behavior_set(mc, MEMCACHED_BEHAVIOR_POLL_TIMEOUT,
                         cfg.mc_timeout_ms);
  /* after a failure, try the server again after 1 s */
  memcached_behavior_set(mc, MEMCACHED_BEHAVIOR_RETRY_TIMEOUT, 1);
  return mc;
}

static void answer_error(struct batch *b, int i) {
  memcpy(b->resp[i], FACE_ERROR, FACE_ERROR_LEN);
  b->resp_len[i] = FACE_ERROR_LEN;
  b->done[i] = 1;
}

/* Verifies request i against a stored value. */
static void answer(struct worker *w, struct batch *b, int i, const char *val,
                   size_t len) {
  float dist;
  int match;
  if (len != FACE_PIXELS) {
    lynx_cnt_add(&w->st.bad_value, 1);
    LYNX_LOG_RL(LYNX_LOG_WARN, "face",
                "thread %d: %s holds %zu bytes, not an image", w->id, b->key[i],
                len);
    answer_error(b, i);
    return;
  }
  match = face_verify(b->req[i] + FACE_LABEL_LEN, (const uint8_t *)val, &dist);
  face_resp_encode(b->resp[i], match, dist);
  b->resp_len[i] = FACE_RESP_LEN;
  b->done[i] = 1;
  lynx_cnt_add(&w->st.matches, (uint64_t)match);
}

/* Fetches the images of every valid request in one mget and answers them.
 * -1 when memcached failed (the requests left get ERROR). */
static int fetch(struct worker *w, struct batch *b) {
  const char *keys[BATCH_MAX];
  size_t lens[BATCH_MAX];
  memcached_return_t rc;
  int nk = 0;
  for (int i = 0; i < b->n; i++)
    if (b->valid[i]) {
      keys[nk] = b->key[i];
      lens[nk++] = b->key_len[i];
    }
  if (!nk)
    return 0;
  rc = memcached_mget(w->mc, keys, lens, (size_t)nk);
  if (rc != MEMCACHED_SUCCESS) {
    lynx_cnt_add(&w->st.mc_errors, 1);
    LYNX_LOG_RL(LYNX_LOG_WARN, "face", "thread %d: memcached get: %s", w->id,
                memcached_last_error_message(w->mc));
    return -1;
  }
  for (;;) {
    memcached_result_st *r = memcached_fetch_result(w->mc, &w->result, &rc);
    if (!r) {
      if (rc != MEMCACHED_END && rc != MEMCACHED_SUCCESS &&
          rc != MEMCACHED_NOTFOUND) {
        lynx_cnt_add(&w->st.mc_errors, 1);
        LYNX_LOG_RL(LYNX_LOG_WARN, "face", "thread %d: memcached fetch: %s",
                    w->id, memcached_strerror(w->mc, rc));
        return -1;
      }
      return 0;
    }
    const char *k = memcached_result_key_value(r);
    size_t kl = memcached_result_key_length(r);
    /* memcached answers a key once per time it was asked: the first
     * request with that key still waiting gets it */
    for (int i = 0; i < b->n; i++)
      if (b->valid[i] && !b->done[i] && b->key_len[i] == kl &&
          memcmp(b->key[i], k, kl) == 0) {
        answer(w, b, i, memcached_result_value(r), memcached_result_length(r));
        break;
      }
  }
}

static void *worker_main(void *arg) {
  struct worker *w = arg;
  struct batch *b = &w->b;
  const uint8_t *label, *img;
  int mc_failed;
  for (int i = 0; i < BATCH_MAX; i++) {
    b->rxv[i] = (struct iovec){b->req[i], sizeof(b->req[i])};
    b->txv[i] = (struct iovec){b->resp[i], 0};
  }
  while (!stopping) {
    int n = (int)cfg.batch;
    for (int i = 0; i < n; i++) {
      memset(&b->rx[i], 0, sizeof(b->rx[i]));
      b->rx[i].msg_hdr.msg_name = &b->from[i];
      b->rx[i].msg_hdr.msg_namelen = sizeof(b->from[i]);
      b->rx[i].msg_hdr.msg_iov = &b->rxv[i];
      b->rx[i].msg_hdr.msg_iovlen = 1;
    }
    n = recvmmsg(w->fd, b->rx, (unsigned)n, MSG_WAITFORONE, NULL);
    if (n <= 0) {
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        LYNX_LOG_RL(LYNX_LOG_WARN, "face", "thread %d: recv: %s", w->id,
                    strerror(errno));
      continue;
    }
    b->n = n;
    lynx_cnt_add(&w->st.requests, (uint64_t)n);
    for (int i = 0; i < n; i++) {
      size_t len = b->rx[i].msg_len;
      b->valid[i] = b->done[i] = 0;
      if ((b->rx[i].msg_hdr.msg_flags & MSG_TRUNC) ||
          face_req_parse(b->req[i], len, &label, &img) != 0) {
        lynx_cnt_add(&w->st.malformed, 1);
        LYNX_LOG_RL(LYNX_LOG_WARN, "face",
                    "thread %d: malformed request (%zu bytes%s)", w->id, len,
                    (b->rx[i].msg_hdr.msg_flags & MSG_TRUNC) ? ", truncated"
                                                             : "");
        answer_error(b, i);
        continue;
      }
      b->key_len[i] = (size_t)face_key(label, b->key[i]);
      b->valid[i] = 1;
    }
    mc_failed = fetch(w, b) != 0;
    for (int i = 0; i < n; i++) {
      if (!b->done[i]) { /* valid, but memcached failed or had no image */
        if (!mc_failed) {
          lynx_cnt_add(&w->st.not_found, 1);
          LYNX_LOG_RL(LYNX_LOG_INFO, "face", "thread %d: no image for %s",
                      w->id, b->key[i]);
        }
        answer_error(b, i);
      }
      memset(&b->tx[i], 0, sizeof(b->tx[i]));
      b->txv[i].iov_len = b->resp_len[i];
      b->tx[i].msg_hdr.msg_name = &b->from[i];
      b->tx[i].msg_hdr.msg_namelen = b->rx[i].msg_hdr.msg_namelen;
      b->tx[i].msg_hdr.msg_iov = &b->txv[i];
      b->tx[i].msg_hdr.msg_iovlen = 1;
    }
    for (int off = 0; off < n;) {
      int s = sendmmsg(w->fd, b->tx + off, (unsigned)(n - off), 0);
      if (s <= 0) {
        /* skip the datagram that failed (e.g. unreachable source) */
        lynx_cnt_add(&w->st.send_errors, 1);
        LYNX_LOG_RL(LYNX_LOG_WARN, "face", "thread %d: send: %s", w->id,
                    s < 0 ? strerror(errno) : "nothing sent");
        off++;
        continue;
      }
      lynx_cnt_add(&w->st.answered, (uint64_t)s);
      off += s;
    }
  }
  return NULL;
}

int main(int argc, char **argv) {
  int help = 0; /* --help was printed */
  static struct worker workers[64];
  uint32_t started = 0;
  int rc, lvl, exit_code = 1, sig;
  sigset_t set;
  char abuf[128];

  rc = lynx_opts_parse(opts, &cfg, argc, argv,
                       "usage: lynx-face-baseline --udp HOST:PORT --memcached "
                       "HOST:PORT [--threads N]\n"
                       "Host-centric face verification server (the baseline "
                       "of docs/face-verify.md).",
                       &help);
  if (rc || help)
    return rc ? 2 : 0;
  lvl = lynx_log_parse_level(cfg.log_level);
  if (lvl < 0) {
    fprintf(stderr, "--log-level: unknown level '%s'\n", cfg.log_level);
    goto out;
  }
  lynx_log_level = lvl;
  if (lynx_parse_hostport(cfg.udp, &udp_addr)) {
    fprintf(stderr, "--udp: '%s' is not HOST:PORT\n", cfg.udp);
    goto out;
  }
  if (tool_split_hostport(cfg.memcached, &mc_addr, mc_host, sizeof(mc_host),
                          &mc_port)) {
    fprintf(stderr, "--memcached: '%s' is not HOST:PORT\n", cfg.memcached);
    goto out;
  }
  signal(SIGPIPE, SIG_IGN);
  /* the workers inherit a mask without SIGINT/SIGTERM: main waits for them */
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, NULL);

  for (uint32_t i = 0; i < cfg.threads; i++) {
    struct worker *w = &workers[i];
    w->id = (int)i;
    w->fd = tool_udp_server(&udp_addr);
    if (w->fd < 0) {
      LYNX_ERR("face", "udp %s: %s", cfg.udp, strerror(-w->fd));
      goto stop;
    }
    w->mc = open_memcached();
    if (!w->mc || !memcached_result_create(w->mc, &w->result)) {
      LYNX_ERR("face", "memcached %s: cannot create a client", cfg.memcached);
      if (w->mc)
        memcached_free(w->mc);
      close(w->fd);
      goto stop;
    }
    rc = pthread_create(&w->thread, NULL, worker_main, w);
    if (rc) {
      LYNX_ERR("face", "thread: %s", strerror(rc));
      memcached_result_free(&w->result);
      memcached_free(w->mc);
      close(w->fd);
      goto stop;
    }
    started++;
  }
  LYNX_INFO("face",
            "serving face verification on udp %s, memcached %s:%u, "
            "%u threads, batch %u",
            lynx_fmt_addr((struct sockaddr *)&udp_addr, abuf, sizeof(abuf)),
            mc_host, mc_port, cfg.threads, cfg.batch);
  sigwait(&set, &sig);
  LYNX_INFO("face", "%s, shutting down", strsignal(sig));
  exit_code = 0;
stop:
  stopping = 1;
  struct stats t = {0};
  for (uint32_t i = 0; i < started; i++) {
    struct worker *w = &workers[i];
    pthread_join(w->thread, NULL);
    t.requests += w->st.requests;
    t.answered += w->st.answered;
    t.matches += w->st.matches;
    t.malformed += w->st.malformed;
    t.not_found += w->st.not_found;
    t.bad_value += w->st.bad_value;
    t.mc_errors += w->st.mc_errors;
    t.send_errors += w->st.send_errors;
    memcached_result_free(&w->result);
    memcached_free(w->mc);
    close(w->fd);
  }
  if (started)
    LYNX_INFO("face",
              "totals: requests=%llu answered=%llu matches=%llu malformed=%llu "
              "not_found=%llu bad_value=%llu memcached_errors=%llu "
              "send_errors=%llu",
              (unsigned long long)t.requests, (unsigned long long)t.answered,
              (unsigned long long)t.matches, (unsigned long long)t.malformed,
              (unsigned long long)t.not_found, (unsigned long long)t.bad_value,
              (unsigned long long)t.mc_errors,
              (unsigned long long)t.send_errors);
out:
  lynx_opts_free(opts, &cfg);
  return exit_code;
}
