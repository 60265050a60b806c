/*
 * lynx-face-load - database filler and load generator for the face
 * verification service (docs/face-verify.md).
 *
 * Fill mode stores the synthetic database in memcached (libmemcached):
 *
 *   lynx-face-load --fill 127.0.0.1:11211 --identities 1000 --seed 1
 *
 * key "face:" + face_label(seed, i), value face_image(seed, i), for every
 * i < identities; then reads the first and the last back.
 *
 * Client mode sends requests and checks every answer:
 *
 *   lynx-face-load --target 127.0.0.1:7300 --udp|--tcp-len32
 *                  --rate R | --closed-loop C  --seconds T
 *                  --identities N --seed S --impostor-percent P
 *
 * Requests come from a pool (--pool, prepared before the clock starts):
 * entry r asks about a uniformly drawn identity i with a genuine probe
 * (face_probe(seed, i, r)) or, with probability P%, an impostor's
 * (face_probe(seed, face_impostor(seed, i, r, N), r)); its expected answer
 * is the local face_verify of that probe against face_image(seed, i), the
 * image the fill stored. During the run each request is a random pool
 * entry.
 *
 * Transport: --udp, one datagram per message, on --connections connected
 * UDP sockets; --tcp-len32, each message framed as a 4-byte big-endian
 * length and the message, on --connections TCP connections. --rate R is an
 * open loop (R requests/s, round-robin over the connections); --closed-loop
 * C keeps one request outstanding on each of C connections.
 *
 * Checking: answers carry no request id, so an answer on a connection is
 * matched to the oldest request outstanding on that connection whose
 * expected answer it equals (match flag equal, distance within --tol-e6
 * millionths, default 100 = 1e-4); with one request outstanding (closed
 * loop) this is exactly its own answer. An answer that equals none of them
 * ("ERROR", a wrong flag or distance, a malformed answer) is wrong and
 * retires the oldest outstanding request. A request unanswered after
 * --timeout-ms is a timeout; its answer, if it comes later, is counted as
 * late, not as wrong.
 *
 * Output (stdout, one line):
 *   face_load: transport=udp load=rate:R|closed:C seconds=T identities=N
 *     sent=S answered=A wrong=W timeouts=O late=L skipped=K errors=E
 *     matches=M req_per_s=X p50_us=Y p99_us=Z
 * (answered includes wrong; matches: correct answers that said "match";
 * skipped: open-loop sends that found every connection full; errors:
 * socket errors; req_per_s: answers received within the T seconds / T;
 * p50/p99 over the correct answers.) Up to 10 wrong answers are described
 * on stderr.
 *
 * Exit status: 0 when every answer was right and at least one came; 1 on
 * any wrong answer, or none at all; 2 on usage or set-up errors.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <libmemcached/memcached.h>

#include "face.h"
#include "tool_common.h"

#define OUT_MAX 256 /* requests outstanding per connection */
#define TCP_TX_MAX (256u << 10)
#define TCP_RX_MAX (64u << 10)
#define TCP_FRAME_MAX 4096u /* a longer answer frame is a protocol error */
#define WRONG_REPORT_MAX 10

struct cfg {
  char *fill, *target;
  int udp, tcp;
  uint32_t rate, closed, seconds, identities, seed, impostor_pct;
  uint32_t connections, timeout_ms, pool, tol_e6;
};

#define O(f) offsetof(struct cfg, f)
static const struct lynx_opt opts[] = {
    {"fill", LYNX_OPT_STR, O(fill), NULL, 0, 0, NULL,
     "store the database in this memcached (HOST:PORT) and exit"},
    {"target", LYNX_OPT_STR, O(target), NULL, 0, 0, NULL,
     "send requests to this server (HOST:PORT)"},
    {"udp", LYNX_OPT_FLAG, O(udp), NULL, 0, 0, NULL,
     "one datagram per message"},
    {"tcp-len32", LYNX_OPT_FLAG, O(tcp), NULL, 0, 0, NULL,
     "TCP, each message after a 4-byte big-endian length"},
    {"rate", LYNX_OPT_U32, O(rate), "0", 0, 10000000, NULL,
     "open loop: requests per second"},
    {"closed-loop", LYNX_OPT_U32, O(closed), "0", 0, 4096, NULL,
     "closed loop: connections with one request outstanding each"},
    {"seconds", LYNX_OPT_U32, O(seconds), "5", 1, 86400, NULL,
     "how long to send"},
    {"identities", LYNX_OPT_U32, O(identities), "1000", 1, 100000000, NULL,
     "identities in the database"},
    {"seed", LYNX_OPT_U32, O(seed), "1", 0, UINT32_MAX, NULL,
     "database seed (the fill's and the client's must agree)"},
    {"impostor-percent", LYNX_OPT_U32, O(impostor_pct), "50", 0, 100, NULL,
     "share of requests whose probe shows another identity"},
    {"connections", LYNX_OPT_U32, O(connections), "16", 1, 4096, NULL,
     "sockets used by the open loop"},
    {"timeout-ms", LYNX_OPT_U32, O(timeout_ms), "1000", 1, 600000, NULL,
     "a request unanswered this long is a timeout"},
    {"pool", LYNX_OPT_U32, O(pool), "4096", 1, 1000000, NULL,
     "distinct requests prepared before the run"},
    {"tol-e6", LYNX_OPT_U32, O(tol_e6), "100", 0, 1000000000, NULL,
     "distance tolerance in millionths"},
    LYNX_OPT_END,
};
#undef O

static struct cfg cfg;

/* ---- helpers ---- */

static uint64_t rng_state;
static uint64_t rnd(void) { return tool_splitmix(&rng_state); }

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

/* ---- fill ---- */

static int fill(void) {
  struct sockaddr_storage ss;
  char host[NI_MAXHOST], key[FACE_KEY_MAX];
  uint8_t label[FACE_LABEL_LEN], img[FACE_PIXELS];
  unsigned port;
  memcached_return_t rc;
  uint64_t t0 = lynx_now_ns();
  uint32_t failed = 0;
  int exit_code = 2;

  if (tool_split_hostport(cfg.fill, &ss, host, sizeof(host), &port)) {
    fprintf(stderr, "--fill: '%s' is not HOST:PORT\n", cfg.fill);
    return 2;
  }
  memcached_st *mc = memcached_create(NULL);
  if (!mc ||
      memcached_server_add(mc, host, (in_port_t)port) != MEMCACHED_SUCCESS) {
    fprintf(stderr, "face_load: cannot create a memcached client\n");
    goto out;
  }
  memcached_behavior_set(mc, MEMCACHED_BEHAVIOR_TCP_NODELAY, 1);
  memcached_behavior_set(mc, MEMCACHED_BEHAVIOR_CONNECT_TIMEOUT, 2000);
  memcached_behavior_set(mc, MEMCACHED_BEHAVIOR_POLL_TIMEOUT, 2000);
  for (uint32_t i = 0; i < cfg.identities; i++) {
    face_label(cfg.seed, i, label);
    int kl = face_key(label, key);
    face_image(cfg.seed, i, img);
    rc = memcached_set(mc, key, (size_t)kl, (const char *)img, sizeof(img), 0,
                       0);
    if (rc != MEMCACHED_SUCCESS) {
      if (failed++ < WRONG_REPORT_MAX)
        fprintf(stderr, "face_load: set %s: %s\n", key,
                memcached_last_error_message(mc));
      if (failed == 100 && failed == i + 1) {
        fprintf(stderr, "face_load: giving up\n");
        break;
      }
    }
  }
  /* read back the first and the last */
  uint32_t probes[2] = {0, cfg.identities - 1};
  for (int k = 0; k < 2 && !failed; k++) {
    size_t len = 0;
    uint32_t flags;
    face_label(cfg.seed, probes[k], label);
    int kl = face_key(label, key);
    face_image(cfg.seed, probes[k], img);
    char *v = memcached_get(mc, key, (size_t)kl, &len, &flags, &rc);
    if (!v || len != sizeof(img) || memcmp(v, img, len) != 0) {
      fprintf(stderr, "face_load: %s does not read back (%s)\n", key,
              memcached_strerror(mc, rc));
      failed++;
    }
    free(v);
  }
  printf("face_load: filled=%u failed=%u identities=%u seed=%u memcached=%s "
         "ms=%.0f\n",
         cfg.identities - failed, failed, cfg.identities, cfg.seed, cfg.fill,
         (double)(lynx_now_ns() - t0) / 1e6);
  exit_code = failed ? 1 : 0;
out:
  if (mc)
    memcached_free(mc);
  return exit_code;
}

/* ---- client ---- */

struct req {
  uint8_t msg[FACE_REQ_LEN];
  float dist; /* expected answer */
  uint8_t match;
};

struct out {
  uint32_t req;  /* pool index */
  uint8_t late;  /* timed out, still waiting for a late answer */
  uint64_t t_ns; /* sent */
};

struct conn {
  int fd;
  int dead;
  uint32_t n_out, n_active; /* entries, of which not timed out */
  struct out out[OUT_MAX];  /* in send order */
  /* tcp */
  uint8_t *tx, *rx;
  uint32_t tx_len, rx_len;
};

static struct req *pool;
static struct conn *conns;
static uint32_t n_conns;
static struct sockaddr_storage target;

static struct {
  uint64_t sent, answered, wrong, timeouts, late, skipped, errors, matches,
      in_window;
} st;
static uint32_t *lat_us;
static size_t lat_n, lat_cap;

static void prepare_pool(void) {
  uint8_t stored[FACE_PIXELS], probe[FACE_PIXELS], label[FACE_LABEL_LEN];
  uint32_t n = cfg.identities;
  for (uint32_t r = 0; r < cfg.pool; r++) {
    uint32_t i = (uint32_t)(rnd() % n), who = i;
    if (n > 1 && rnd() % 100 < cfg.impostor_pct)
      who = face_impostor(cfg.seed, i, r, n);
    face_label(cfg.seed, i, label);
    face_image(cfg.seed, i, stored);
    face_probe(cfg.seed, who, r, probe);
    face_req_encode(pool[r].msg, label, probe);
    pool[r].match = (uint8_t)face_verify(probe, stored, &pool[r].dist);
  }
}

static int open_conn(struct conn *c) {
  int type = cfg.udp ? SOCK_DGRAM : SOCK_STREAM, one = 1;
  socklen_t sl = target.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                              : sizeof(struct sockaddr_in);
  c->fd = socket(target.ss_family, type | SOCK_CLOEXEC, 0);
  if (c->fd < 0)
    return -errno;
  if (connect(c->fd, (struct sockaddr *)&target, sl))
    return -errno;
  if (cfg.tcp) {
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    c->tx = malloc(TCP_TX_MAX);
    c->rx = malloc(TCP_RX_MAX);
    if (!c->tx || !c->rx)
      return -ENOMEM;
  }
  fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK);
  return 0;
}

static void conn_close(struct conn *c, const char *why) {
  if (c->dead)
    return;
  fprintf(stderr, "face_load: connection %ld closed: %s\n", (long)(c - conns),
          why);
  c->dead = 1;
  st.timeouts += c->n_active; /* never answered */
  c->n_out = c->n_active = 0;
  close(c->fd);
  c->fd = -1;
}

static void out_remove(struct conn *c, uint32_t k) {
  if (!c->out[k].late)
    c->n_active--;
  memmove(&c->out[k], &c->out[k + 1], (c->n_out - k - 1) * sizeof(c->out[0]));
  c->n_out--;
}

static void tcp_flush(struct conn *c) {
  while (c->tx_len) {
    ssize_t w = send(c->fd, c->tx, c->tx_len, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
        return;
      st.errors++;
      conn_close(c, strerror(errno));
      return;
    }
    memmove(c->tx, c->tx + w, c->tx_len - (size_t)w);
    c->tx_len -= (uint32_t)w;
  }
}

/* Sends one random pool entry on c: 0, or -1 when c cannot take it. */
static int send_one(struct conn *c, uint64_t now) {
  uint32_t r = (uint32_t)(rnd() % cfg.pool);
  if (c->dead)
    return -1;
  if (c->n_out == OUT_MAX) { /* drop the oldest late entry, if any */
    uint32_t k = 0;
    while (k < c->n_out && !c->out[k].late)
      k++;
    if (k == c->n_out)
      return -1;
    out_remove(c, k);
  }
  if (cfg.udp) {
    if (send(c->fd, pool[r].msg, FACE_REQ_LEN, 0) != FACE_REQ_LEN) {
      st.errors++; /* e.g. ECONNREFUSED from an earlier ICMP error */
      return 0;
    }
  } else {
    if (c->tx_len + 4 + FACE_REQ_LEN > TCP_TX_MAX)
      return -1;
    uint8_t *p = c->tx + c->tx_len;
    p[0] = p[1] = 0;
    p[2] = (uint8_t)(FACE_REQ_LEN >> 8);
    p[3] = (uint8_t)(FACE_REQ_LEN & 0xff);
    memcpy(p + 4, pool[r].msg, FACE_REQ_LEN);
    c->tx_len += 4 + FACE_REQ_LEN;
    tcp_flush(c);
    if (c->dead)
      return -1;
  }
  c->out[c->n_out++] = (struct out){.req = r, .late = 0, .t_ns = now};
  c->n_active++;
  st.sent++;
  return 0;
}

static int same_answer(const struct req *q, int match, float dist) {
  double d = (double)dist - (double)q->dist;
  return match == q->match && d <= cfg.tol_e6 * 1e-6 && -d <= cfg.tol_e6 * 1e-6;
}

static void report_wrong(const struct conn *c, const struct out *o,
                         const uint8_t *buf, size_t len) {
  char key[FACE_KEY_MAX] = "?";
  if (st.wrong > WRONG_REPORT_MAX)
    return;
  if (o)
    face_key(pool[o->req].msg, key);
  int match;
  float dist;
  if (face_resp_decode(buf, len, &match, &dist) == 0)
    fprintf(stderr,
            "face_load: wrong answer on connection %ld for %s: match=%d "
            "dist=%.4f, expected match=%d dist=%.4f\n",
            (long)(c - conns), key, match, (double)dist,
            o ? pool[o->req].match : -1, o ? (double)pool[o->req].dist : -1.0);
  else
    fprintf(stderr,
            "face_load: wrong answer on connection %ld for %s: %zu bytes "
            "'%.*s'\n",
            (long)(c - conns), key, len, (int)(len < 16 ? len : 16),
            (const char *)buf);
}

static void on_answer(struct conn *c, const uint8_t *buf, size_t len,
                      uint64_t now, uint64_t end_send) {
  int match;
  float dist;
  if (face_resp_decode(buf, len, &match, &dist) == 0) {
    for (int pass = 0; pass < 2; pass++) /* the waiting ones, then late */
      for (uint32_t k = 0; k < c->n_out; k++) {
        struct out *o = &c->out[k];
        if (o->late != pass || !same_answer(&pool[o->req], match, dist))
          continue;
        if (pass) {
          st.late++;
        } else {
          st.answered++;
          st.matches += (uint64_t)match;
          if (now <= end_send)
            st.in_window++;
          if (lat_n == lat_cap) {
            size_t nc = lat_cap ? lat_cap * 2 : 65536;
            uint32_t *nl = realloc(lat_us, nc * sizeof(*nl));
            if (nl) {
              lat_us = nl;
              lat_cap = nc;
            }
          }
          if (lat_n < lat_cap)
            lat_us[lat_n++] = (uint32_t)((now - o->t_ns) / 1000);
        }
        out_remove(c, k);
        return;
      }
  }
  /* wrong: retire the oldest waiting request */
  struct out *o = NULL;
  for (uint32_t k = 0; k < c->n_out; k++)
    if (!c->out[k].late) {
      o = &c->out[k];
      break;
    }
  st.wrong++;
  report_wrong(c, o, buf, len);
  if (o) {
    st.answered++;
    if (now <= end_send)
      st.in_window++;
    out_remove(c, (uint32_t)(o - c->out));
  }
}

static void on_readable(struct conn *c, uint64_t end_send) {
  uint8_t buf[2048];
  if (cfg.udp) {
    for (;;) {
      ssize_t n = recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT | MSG_TRUNC);
      if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
          st.errors++; /* ECONNREFUSED: nobody listens (yet) */
        return;
      }
      on_answer(c, buf, (size_t)n > sizeof(buf) ? sizeof(buf) : (size_t)n,
                lynx_now_ns(), end_send);
    }
  }
  for (;;) {
    ssize_t n =
        recv(c->fd, c->rx + c->rx_len, TCP_RX_MAX - c->rx_len, MSG_DONTWAIT);
    if (n == 0) {
      conn_close(c, "closed by the server");
      return;
    }
    if (n < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        st.errors++;
        conn_close(c, strerror(errno));
      }
      return;
    }
    c->rx_len += (uint32_t)n;
    uint32_t off = 0;
    uint64_t now = lynx_now_ns();
    while (c->rx_len - off >= 4) {
      const uint8_t *p = c->rx + off;
      uint32_t fl = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 |
                    (uint32_t)p[2] << 8 | p[3];
      if (fl > TCP_FRAME_MAX) {
        st.wrong++;
        fprintf(stderr, "face_load: answer frame of %u bytes\n", fl);
        conn_close(c, "protocol error");
        return;
      }
      if (c->rx_len - off < 4 + fl)
        break;
      on_answer(c, p + 4, fl, now, end_send);
      off += 4 + fl;
    }
    memmove(c->rx, c->rx + off, c->rx_len - off);
    c->rx_len -= off;
  }
}

static void expire(uint64_t now) {
  uint64_t to = (uint64_t)cfg.timeout_ms * 1000000ull;
  for (uint32_t i = 0; i < n_conns; i++) {
    struct conn *c = &conns[i];
    for (uint32_t k = 0; k < c->n_out; k++)
      if (!c->out[k].late && now - c->out[k].t_ns > to) {
        c->out[k].late = 1;
        c->n_active--;
        st.timeouts++;
      }
  }
}

static int client(void) {
  struct pollfd *pfd;
  uint64_t start, end_send, next_send, interval = 0, now, waiting;
  uint32_t rr = 0;
  char host[NI_MAXHOST];
  unsigned port;

  if (tool_split_hostport(cfg.target, &target, host, sizeof(host), &port)) {
    fprintf(stderr, "--target: '%s' is not HOST:PORT\n", cfg.target);
    return 2;
  }
  n_conns = cfg.closed ? cfg.closed : cfg.connections;
  pool = calloc(cfg.pool, sizeof(*pool));
  conns = calloc(n_conns, sizeof(*conns));
  pfd = calloc(n_conns, sizeof(*pfd));
  if (!pool || !conns || !pfd) {
    fprintf(stderr, "face_load: out of memory\n");
    return 2;
  }
  rng_state = 0xFACEull << 32 | cfg.seed;
  prepare_pool();
  for (uint32_t i = 0; i < n_conns; i++) {
    int rc = open_conn(&conns[i]);
    if (rc) {
      fprintf(stderr, "face_load: connect %s: %s\n", cfg.target, strerror(-rc));
      return 2;
    }
  }

  start = lynx_now_ns();
  end_send = start + (uint64_t)cfg.seconds * 1000000000ull;
  next_send = start;
  if (cfg.rate)
    interval = 1000000000ull / cfg.rate;
  for (;;) {
    now = lynx_now_ns();
    int sending = now < end_send;
    waiting = 0;
    for (uint32_t i = 0; i < n_conns; i++)
      waiting += conns[i].n_active;
    if (!sending && waiting == 0)
      break;
    if (sending && cfg.rate) {
      /* catch up, but never more than one second's worth at once */
      if (now > next_send + 1000000000ull)
        next_send = now - 1000000000ull;
      while (next_send <= now) {
        uint32_t tried = 0;
        while (tried < n_conns && send_one(&conns[rr], now) != 0) {
          rr = (rr + 1) % n_conns;
          tried++;
        }
        if (tried == n_conns)
          st.skipped++;
        rr = (rr + 1) % n_conns;
        next_send += interval;
      }
    } else if (sending) {
      for (uint32_t i = 0; i < n_conns; i++)
        if (!conns[i].dead && conns[i].n_active == 0)
          send_one(&conns[i], now);
    }

    int alive = 0;
    for (uint32_t i = 0; i < n_conns; i++) {
      pfd[i].fd = conns[i].dead ? -1 : conns[i].fd;
      pfd[i].events = POLLIN | (conns[i].tx_len ? POLLOUT : 0);
      pfd[i].revents = 0;
      alive += !conns[i].dead;
    }
    if (!alive) {
      fprintf(stderr, "face_load: every connection is closed\n");
      break;
    }
    /* wake for the next send, else within 5 ms to expire timeouts */
    uint64_t wait_ns = 5000000;
    if (sending && cfg.rate)
      wait_ns = next_send > now ? next_send - now : 0;
    if (wait_ns > 5000000)
      wait_ns = 5000000;
    struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)wait_ns};
    int n = ppoll(pfd, n_conns, &ts, NULL);
    if (n < 0 && errno != EINTR) {
      perror("face_load: poll");
      return 2;
    }
    for (uint32_t i = 0; n > 0 && i < n_conns; i++) {
      if (!pfd[i].revents || conns[i].dead)
        continue;
      if (pfd[i].revents & (POLLIN | POLLERR | POLLHUP))
        on_readable(&conns[i], end_send);
      if (!conns[i].dead && (pfd[i].revents & POLLOUT))
        tcp_flush(&conns[i]);
    }
    expire(lynx_now_ns());
  }

  double p50 = 0, p99 = 0;
  if (lat_n) {
    qsort(lat_us, lat_n, sizeof(*lat_us), cmp_u32);
    p50 = lat_us[lat_n / 2];
    p99 = lat_us[lat_n * 99 / 100];
  }
  char load[32];
  if (cfg.rate)
    snprintf(load, sizeof(load), "rate:%u", cfg.rate);
  else
    snprintf(load, sizeof(load), "closed:%u", cfg.closed);
  printf("face_load: transport=%s load=%s seconds=%u identities=%u sent=%llu "
         "answered=%llu wrong=%llu timeouts=%llu late=%llu skipped=%llu "
         "errors=%llu matches=%llu req_per_s=%.0f p50_us=%.0f p99_us=%.0f\n",
         cfg.udp ? "udp" : "tcp-len32", load, cfg.seconds, cfg.identities,
         (unsigned long long)st.sent, (unsigned long long)st.answered,
         (unsigned long long)st.wrong, (unsigned long long)st.timeouts,
         (unsigned long long)st.late, (unsigned long long)st.skipped,
         (unsigned long long)st.errors, (unsigned long long)st.matches,
         (double)st.in_window / cfg.seconds, p50, p99);
  fflush(stdout);
  for (uint32_t i = 0; i < n_conns; i++) {
    if (!conns[i].dead)
      close(conns[i].fd);
    free(conns[i].tx);
    free(conns[i].rx);
  }
  free(conns);
  free(pfd);
  free(pool);
  free(lat_us);
  return st.wrong || !st.answered ? 1 : 0;
}

int main(int argc, char **argv) {
  int help = 0; /* --help was printed */
  int rc = lynx_opts_parse(
      opts, &cfg, argc, argv,
      "usage: lynx-face-load --fill HOST:PORT --identities N --seed S\n"
      "       lynx-face-load --target HOST:PORT --udp|--tcp-len32 "
      "--rate R|--closed-loop C\n"
      "                      --seconds T --identities N --seed S "
      "--impostor-percent P\n"
      "Fills memcached with the face database, or sends face verification "
      "requests and checks every answer (docs/face-verify.md).",
      &help);
  if (rc || help)
    return rc ? 2 : 0;
  signal(SIGPIPE, SIG_IGN);
  if (!!cfg.fill + !!cfg.target != 1) {
    fprintf(stderr, "give exactly one of --fill and --target (see --help)\n");
    rc = 2;
  } else if (cfg.fill) {
    rc = fill();
  } else if (cfg.udp + cfg.tcp != 1) {
    fprintf(stderr, "give exactly one of --udp and --tcp-len32\n");
    rc = 2;
  } else if (!!cfg.rate + !!cfg.closed != 1) {
    fprintf(stderr, "give exactly one of --rate and --closed-loop\n");
    rc = 2;
  } else if (cfg.impostor_pct && cfg.identities < 2) {
    fprintf(stderr, "impostors need --identities 2 or more\n");
    rc = 2;
  } else {
    rc = client();
  }
  lynx_opts_free(opts, &cfg);
  return rc;
}
