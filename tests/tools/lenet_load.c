/*
 * lynx-lenet-load - drives a lenet service (docs/lenet.md) over UDP with
 * Fashion-MNIST test images and checks every answer.
 *
 *   lynx-lenet-load --target HOST:PORT [--count N | --seconds S]
 *                   [--window W | --rate R] [--flows F] [--first K]
 *                   [--malformed M] [--data DIR] [--ref FILE]
 *                   [--timeout-ms T]
 *
 * Request i is test image (K + i) mod 10000 followed by a 12-byte cookie
 * (u64 i and a u32 run id, little-endian) that the service echoes, so
 * answers are matched to requests whatever their order. Pacing: closed
 * loop with W requests outstanding (W = 1: ping-pong), or open loop at R
 * requests per second. Requests go out in turn over F sockets (flows: a
 * server spreading clients by flow, SO_REUSEPORT or the frontend's
 * workers, sees F clients). A request not answered within T ms is lost
 * (an answer after that is counted late and still checked).
 *
 * Every answer is checked: it must decode (lenet.h), carry the cookie of a
 * request that has not been answered yet, and its class must equal the
 * reference class of its image (the training script's, --ref); for the
 * images whose logits the reference keeps, the logits must be bit-equal.
 * The class is also compared with the image's label (accuracy).
 *
 * --malformed M first sends M datagrams the service must drop (wrong
 * sizes: 1, 783, 801 and 1024 bytes, in turn); any answer to them shows up
 * as unexpected.
 *
 * Output: one line
 *   lenet_load: sent=N answered=A lost=L late=LT malformed_sent=M
 *     bad_answers=B unexpected=U disagree=D logits_checked=LC
 *     logit_mismatch=LM correct=C ref_correct=RC accuracy=P
 *     ref_agreement=Q seconds=T req_per_s=R p50_us=X p99_us=Y
 * (ref_correct: how many of the answered images the reference classifies
 * right, the offline accuracy the service must match.)
 * Exit status: 1 when an answer disagrees with the reference, does not
 * decode, has logits that differ, is unexpected or a duplicate; 0
 * otherwise (lost requests are the caller's to judge); 2 on usage errors
 * or unreadable files.
 */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lenet_data.h"
#include "tool_common.h"

#ifndef LENET_REF_DEFAULT
#define LENET_REF_DEFAULT "models/lenet-fashion.ref"
#endif

#define COOKIE_LEN 12
#define FLOWS_MAX 64
#define RUN_MAGIC 0x4C4E5435u /* varied per run below */

struct cfg {
  char *target, *data, *ref;
  uint32_t count, seconds, window, rate, flows, first, malformed, timeout_ms;
};

#define O(f) offsetof(struct cfg, f)
static const struct lynx_opt opts[] = {
    {"target", LYNX_OPT_STR, O(target), NULL, 0, 0, NULL,
     "the lenet service, IPv4 HOST:PORT"},
    {"count", LYNX_OPT_U32, O(count), "1000", 1, 100000000, NULL,
     "requests to send"},
    {"seconds", LYNX_OPT_U32, O(seconds), "0", 0, 3600, NULL,
     "send for this long instead of --count requests (0: off)"},
    {"window", LYNX_OPT_U32, O(window), "1", 1, 65536, NULL,
     "closed loop: requests outstanding (1: ping-pong)"},
    {"rate", LYNX_OPT_U32, O(rate), "0", 0, 10000000, NULL,
     "open loop: requests per second (0: closed loop, --window)"},
    {"flows", LYNX_OPT_U32, O(flows), "1", 1, FLOWS_MAX, NULL,
     "UDP sockets the requests take in turn"},
    {"first", LYNX_OPT_U32, O(first), "0", 0, 1000000, NULL,
     "test image of the first request"},
    {"malformed", LYNX_OPT_U32, O(malformed), "0", 0, 1000000, NULL,
     "wrong-size datagrams sent first (must get no answer)"},
    {"timeout-ms", LYNX_OPT_U32, O(timeout_ms), "1000", 1, 600000, NULL,
     "a request unanswered this long is lost"},
    {"data", LYNX_OPT_STR, O(data), LENET_DATA_DIR, 0, 0, NULL,
     "directory of the Fashion-MNIST test set (t10k-*-ubyte[.gz])"},
    {"ref", LYNX_OPT_STR, O(ref), LENET_REF_DEFAULT, 0, 0, NULL,
     "the reference file of the service's weights (tools/train-lenet.py)"},
    LYNX_OPT_END,
};
#undef O

#define USAGE                                                                  \
  "usage: lynx-lenet-load --target HOST:PORT [--count N | --seconds S]\n"      \
  "                       [--window W | --rate R] [--flows F] [--first K]\n"   \
  "                       [--malformed M] [--data DIR] [--ref FILE]\n"         \
  "                       [--timeout-ms T]\n"                                  \
  "Sends Fashion-MNIST test images to a lenet service and checks each\n"       \
  "answer's class against the reference and the label.\n"

enum { ST_PENDING = 0, ST_ANSWERED, ST_EXPIRED };

struct req {
  uint64_t sent_ns;
  uint32_t image;
  uint8_t state;
};

struct run {
  const struct cfg *cfg;
  struct lenet_testset ts;
  struct lenet_ref ref;
  int fds[FLOWS_MAX];
  uint32_t n_fds, run_id;
  struct req *reqs;
  uint64_t n_reqs, cap, outstanding, expire_from;
  uint64_t *lat; /* ns, one per answer */
  uint64_t answered, late, bad, unexpected, disagree, logits_checked,
      logit_mismatch, correct, ref_correct;
  int reported;
};

static void report(struct run *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void report(struct run *r, const char *fmt, ...) {
  va_list ap;
  if (r->reported++ >= 10)
    return;
  va_start(ap, fmt);
  fputs("lynx-lenet-load: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

static int send_request(struct run *r, uint64_t now) {
  uint8_t buf[LENET_PIXELS + COOKIE_LEN];
  uint64_t i = r->n_reqs;
  uint32_t image = (uint32_t)((r->cfg->first + i) % r->ts.count);
  if (r->n_reqs == r->cap) {
    uint64_t nc = r->cap ? r->cap * 2 : 4096;
    struct req *n = realloc(r->reqs, nc * sizeof(*n));
    uint64_t *l = realloc(r->lat, nc * sizeof(*l));
    if (n)
      r->reqs = n;
    if (l)
      r->lat = l;
    if (!n || !l) {
      fprintf(stderr, "lynx-lenet-load: out of memory\n");
      return -ENOMEM;
    }
    r->cap = nc;
  }
  memcpy(buf, r->ts.images + (size_t)image * LENET_PIXELS, LENET_PIXELS);
  for (int k = 0; k < 8; k++)
    buf[LENET_PIXELS + k] = (uint8_t)(i >> (8 * k));
  for (int k = 0; k < 4; k++)
    buf[LENET_PIXELS + 8 + k] = (uint8_t)(r->run_id >> (8 * k));
  for (int fd = r->fds[i % r->n_fds];;) {
    ssize_t n = send(fd, buf, sizeof(buf), 0);
    if (n == (ssize_t)sizeof(buf))
      break;
    if (n < 0 && (errno == EAGAIN || errno == ENOBUFS || errno == EINTR)) {
      struct pollfd p = {fd, POLLOUT, 0};
      poll(&p, 1, 10);
      continue;
    }
    /* ECONNREFUSED: nobody on the port yet; the request is lost */
    if (n < 0 && errno == ECONNREFUSED)
      break;
    fprintf(stderr, "lynx-lenet-load: send: %s\n", strerror(errno));
    return -errno;
  }
  r->reqs[i].sent_ns = now;
  r->reqs[i].image = image;
  r->reqs[i].state = ST_PENDING;
  r->n_reqs++;
  r->outstanding++;
  return 0;
}

static void check_answer(struct run *r, const uint8_t *buf, uint32_t len,
                         uint64_t now) {
  float logits[LENET_CLASSES];
  const uint8_t *ck;
  uint32_t cklen, run_id = 0;
  uint64_t i = 0;
  int cls;
  struct req *q;
  if (lenet_resp_decode(buf, len, &cls, logits, &ck, &cklen) != 0) {
    r->bad++;
    report(r, "an answer of %u bytes does not decode", len);
    return;
  }
  if (cklen == COOKIE_LEN) {
    for (int k = 0; k < 8; k++)
      i |= (uint64_t)ck[k] << (8 * k);
    for (int k = 0; k < 4; k++)
      run_id |= (uint32_t)ck[8 + k] << (8 * k);
  }
  if (cklen != COOKIE_LEN || run_id != r->run_id || i >= r->n_reqs ||
      r->reqs[i].state == ST_ANSWERED) {
    r->unexpected++;
    report(r,
           "an answer with a cookie of %u bytes matches no outstanding "
           "request (duplicate, or an answer to a malformed request)",
           cklen);
    return;
  }
  q = &r->reqs[i];
  if (cls != r->ref.classes[q->image]) {
    r->disagree++;
    report(r, "request %llu, image %u: class %d, the reference says %u",
           (unsigned long long)i, q->image, cls, r->ref.classes[q->image]);
  }
  if (q->image < r->ref.logit_images) {
    float want[LENET_CLASSES];
    lenet_ref_logits(&r->ref, q->image, want);
    r->logits_checked++;
    if (memcmp(want, logits, sizeof(want)) != 0) {
      r->logit_mismatch++;
      report(r,
             "image %u: logits differ from the reference (first: %a, "
             "want %a)",
             q->image, (double)logits[0], (double)want[0]);
    }
  }
  if (q->state == ST_EXPIRED) { /* counted lost already */
    r->late++;
    q->state = ST_ANSWERED;
    return;
  }
  q->state = ST_ANSWERED;
  r->outstanding--;
  r->lat[r->answered++] = now - q->sent_ns;
  r->correct += (uint32_t)cls == r->ts.labels[q->image];
  r->ref_correct += r->ref.classes[q->image] == r->ts.labels[q->image];
}

/* Reads what has arrived on every flow, waiting up to wait_ms for the
 * first. */
static void drain(struct run *r, int wait_ms) {
  uint8_t buf[2048];
  struct pollfd p[FLOWS_MAX];
  for (uint32_t f = 0; f < r->n_fds; f++)
    p[f] = (struct pollfd){r->fds[f], POLLIN, 0};
  if (poll(p, r->n_fds, wait_ms) <= 0)
    return;
  for (uint32_t f = 0; f < r->n_fds; f++) {
    if (!p[f].revents)
      continue;
    for (;;) {
      ssize_t n = recv(r->fds[f], buf, sizeof(buf), MSG_DONTWAIT);
      if (n < 0)
        break; /* EAGAIN, or ECONNREFUSED from an earlier send */
      check_answer(r, buf, (uint32_t)n, lynx_now_ns());
    }
  }
}

/* Requests pending longer than the timeout become lost (in send order, so
 * a cursor suffices). */
static void expire(struct run *r, uint64_t now) {
  uint64_t t = (uint64_t)r->cfg->timeout_ms * 1000000u;
  while (r->expire_from < r->n_reqs) {
    struct req *q = &r->reqs[r->expire_from];
    if (q->state == ST_PENDING) {
      if (now - q->sent_ns < t)
        break;
      q->state = ST_EXPIRED;
      r->outstanding--;
    }
    r->expire_from++;
  }
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static int send_malformed(struct run *r) {
  static const uint32_t sizes[] = {1, LENET_REQ_MIN - 1, LENET_REQ_MAX + 1,
                                   1024};
  uint8_t buf[1024];
  memset(buf, 0x5a, sizeof(buf));
  for (uint32_t i = 0; i < r->cfg->malformed; i++) {
    uint32_t len = sizes[i % 4];
    if (send(r->fds[0], buf, len, 0) != (ssize_t)len && errno != ECONNREFUSED) {
      fprintf(stderr, "lynx-lenet-load: send: %s\n", strerror(errno));
      return -1;
    }
    if (i % 32 == 31)
      drain(r, 1);
  }
  return 0;
}

static int run_load(struct run *r) {
  const struct cfg *c = r->cfg;
  uint64_t start = lynx_now_ns(), now = start, end_ns = 0, last_send = start;
  uint64_t period = c->rate ? 1000000000ull / c->rate : 0;
  double secs;
  if (c->seconds)
    end_ns = start + (uint64_t)c->seconds * 1000000000ull;
  for (;;) {
    int more = c->seconds ? now < end_ns : r->n_reqs < c->count;
    if (!more)
      break;
    if (c->rate) { /* open loop: every request at its time */
      uint64_t due = start + r->n_reqs * period;
      if (now >= due) {
        if (send_request(r, now))
          return -1;
        last_send = now;
      } else {
        uint64_t wait = (due - now) / 1000000u;
        drain(r, (int)(wait > 5 ? 5 : wait));
      }
    } else if (r->outstanding < c->window) {
      if (send_request(r, now))
        return -1;
      last_send = now;
      continue; /* fill the window first */
    } else {
      drain(r, 5);
    }
    drain(r, 0);
    now = lynx_now_ns();
    expire(r, now);
  }
  /* the stragglers, up to the timeout */
  while (r->outstanding && (now = lynx_now_ns()) - last_send <
                               (uint64_t)c->timeout_ms * 1000000u + 1000000u) {
    drain(r, 5);
    expire(r, lynx_now_ns());
  }
  drain(r, 20); /* late or unexpected answers (to malformed requests) */
  expire(r, UINT64_MAX / 2);
  secs = (double)(lynx_now_ns() - start) / 1e9;

  uint64_t p50 = 0, p99 = 0, lost = r->n_reqs - r->answered;
  if (r->answered) {
    qsort(r->lat, r->answered, sizeof(uint64_t), cmp_u64);
    p50 = r->lat[(r->answered - 1) * 50 / 100];
    p99 = r->lat[(r->answered - 1) * 99 / 100];
  }
  printf("lenet_load: sent=%llu answered=%llu lost=%llu late=%llu "
         "malformed_sent=%u bad_answers=%llu unexpected=%llu disagree=%llu "
         "logits_checked=%llu logit_mismatch=%llu correct=%llu "
         "ref_correct=%llu accuracy=%.2f ref_agreement=%.2f seconds=%.2f "
         "req_per_s=%.0f p50_us=%llu p99_us=%llu\n",
         (unsigned long long)r->n_reqs, (unsigned long long)r->answered,
         (unsigned long long)lost, (unsigned long long)r->late, c->malformed,
         (unsigned long long)r->bad, (unsigned long long)r->unexpected,
         (unsigned long long)r->disagree, (unsigned long long)r->logits_checked,
         (unsigned long long)r->logit_mismatch, (unsigned long long)r->correct,
         (unsigned long long)r->ref_correct,
         r->answered ? 100.0 * (double)r->correct / (double)r->answered : 0.0,
         r->answered + r->late
             ? 100.0 * (double)(r->answered + r->late - r->disagree) /
                   (double)(r->answered + r->late)
             : 0.0,
         secs, (double)r->answered / secs, (unsigned long long)(p50 / 1000),
         (unsigned long long)(p99 / 1000));
  return r->bad || r->unexpected || r->disagree || r->logit_mismatch ? 1 : 0;
}

int main(int argc, char **argv) {
  struct cfg cfg;
  struct run r;
  struct sockaddr_in sa;
  char why[512];
  int rc, buf = 4 << 20;
  memset(&cfg, 0, sizeof(cfg));
  memset(&r, 0, sizeof(r));
  rc = tool_opts(opts, &cfg, argc, argv, USAGE, NULL);
  if (rc < 0 && tool_ipv4_target(cfg.target, &sa)) {
    fprintf(stderr, "lynx-lenet-load: --target '%s' is not IPV4:PORT\n",
            cfg.target ? cfg.target : "");
    rc = tool_usage(USAGE);
  }
  if (rc >= 0)
    goto out;
  r.cfg = &cfg;
  if (lenet_testset_load(cfg.data, &r.ts, why, sizeof(why)) ||
      lenet_ref_load(cfg.ref, &r.ref, why, sizeof(why))) {
    fprintf(stderr, "lynx-lenet-load: %s\n", why);
    rc = LYNX_EXIT_USAGE;
    goto out;
  }
  if (r.ref.images != r.ts.count) {
    fprintf(stderr, "lynx-lenet-load: %s has %u classes for %u test images\n",
            cfg.ref, r.ref.images, r.ts.count);
    rc = LYNX_EXIT_USAGE;
    goto out;
  }
  for (; r.n_fds < cfg.flows; r.n_fds++) {
    int fd = tool_udp_connect(&sa, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      fprintf(stderr, "lynx-lenet-load: socket: %s\n", strerror(errno));
      rc = LYNX_EXIT_USAGE;
      goto out;
    }
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
    r.fds[r.n_fds] = fd;
  }
  r.run_id = RUN_MAGIC ^ (uint32_t)lynx_now_ns() ^ (uint32_t)getpid();
  rc = send_malformed(&r) ? LYNX_EXIT_RUNTIME : run_load(&r);
out:
  for (uint32_t f = 0; f < r.n_fds; f++)
    close(r.fds[f]);
  free(r.reqs);
  free(r.lat);
  lenet_testset_free(&r.ts);
  lenet_ref_free(&r.ref);
  lynx_opts_free(opts, &cfg);
  return rc;
}
