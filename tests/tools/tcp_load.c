/*
 * lynx-tcp-load - drives a TCP echo service through the frontend and checks
 * every answer.
 *
 *   lynx-tcp-load --target HOST:PORT [--conns N] [--messages M]
 *                 [--window W] [--size-max B] [--framing len32|fixed:N]
 *                 [--seed S] [--timeout-ms T]
 *                 [--mode echo|disconnect|garbage|oversize]
 *
 * echo: N connections, each sends M messages (sizes 0..B bytes, contents
 *   from the seed) with at most W in flight, and checks that the answers
 *   come back on the same connection, in order, byte for byte.
 * disconnect: each connection sends W messages and closes without reading
 *   (a client that leaves with requests in flight).
 * garbage: each connection sends a length word of 0xFFFFFFFF and 64 bytes
 *   of junk; the server must close it.
 * oversize: each connection sends one frame of --size-max bytes (larger
 *   than the service's slots); the server must close it.
 * slowreader: each connection sends --messages messages of --size-max
 *   bytes and never reads its answers; the server must close it once its
 *   unsent answers pass the bound.
 *
 * Output, one line:
 *   tcp_load: mode=M conns=N connected=C sent=S answered=A mismatched=X
 *     closed_by_server=K errors=E elapsed_ms=T rate=R
 * Exit status: 0 when every check of the mode held, 1 otherwise, 2 usage.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tool_common.h"

enum mode { M_ECHO, M_DISCONNECT, M_GARBAGE, M_OVERSIZE, M_SLOW };

struct conn {
  int fd;
  uint32_t sent, answered;
  uint8_t *in;
  size_t in_len, in_cap;
  int done, closed_by_server;
};

/* splitmix64 of x: message k of connection c, reproducible on both ends. */
static uint64_t mix(uint64_t x) { return tool_splitmix(&x); }

static uint32_t msg_len(uint64_t seed, uint32_t c, uint32_t k, uint32_t max,
                        uint32_t fixed) {
  return fixed ? fixed
               : (uint32_t)(mix(seed ^ ((uint64_t)c << 32) ^ k) % (max + 1u));
}

static void msg_fill(uint8_t *p, uint32_t len, uint64_t seed, uint32_t c,
                     uint32_t k) {
  uint64_t x = mix(seed ^ ((uint64_t)c << 32) ^ k ^ 0x5555);
  for (uint32_t i = 0; i < len; i++) {
    if ((i & 7) == 0)
      x = mix(x);
    p[i] = (uint8_t)(x >> ((i & 7) * 8));
  }
}

static int send_all(int fd, const uint8_t *p, size_t n) {
  while (n) {
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

/* the run's parameters, set once in main */
static uint64_t seed = 1;
static uint32_t messages = 100, window = 8, size_max = 1024, fixed = 0;

/* Sends connection i's next messages while fewer than window are
 * unanswered; the number sent (a send error counts in *errors). */
static uint64_t fill_window(struct conn *c, uint32_t i, uint8_t *buf,
                            uint64_t *errors) {
  uint64_t n = 0;
  while (c->sent < messages && c->sent - c->answered < window) {
    uint32_t len = msg_len(seed, i, c->sent, size_max, fixed);
    uint32_t hdr = fixed ? 0 : 4, be = htonl(len);
    memcpy(buf, &be, 4);
    msg_fill(buf + hdr, len, seed, i, c->sent);
    if (send_all(c->fd, buf, hdr + len)) {
      (*errors)++;
      break;
    }
    c->sent++;
    n++;
  }
  return n;
}

#define USAGE                                                                  \
  "usage: lynx-tcp-load --target HOST:PORT [--conns N] "                       \
  "[--messages M] [--window W] [--size-max B] "                                \
  "[--framing len32|fixed:N] [--seed S] [--timeout-ms T] "                     \
  "[--mode echo|disconnect|garbage|oversize]\n"

/* The command line; messages, window, size_max and seed are the globals
 * above once parsed. */
struct cfg {
  char *target, *framing;
  uint32_t conns, messages, window, size_max;
  uint64_t seed, timeout_ms;
  int mode;
};

static const char *const mode_names[] = {"echo",     "disconnect", "garbage",
                                         "oversize", "slowreader", NULL};
#define O(f) offsetof(struct cfg, f)
static const struct lynx_opt opts[] = {
    {"target", LYNX_OPT_STR, O(target), NULL, 0, 0, NULL, ""},
    {"conns", LYNX_OPT_U32, O(conns), "1", 0, UINT32_MAX, NULL, ""},
    {"messages", LYNX_OPT_U32, O(messages), "100", 0, UINT32_MAX, NULL, ""},
    {"window", LYNX_OPT_U32, O(window), "8", 0, UINT32_MAX, NULL, ""},
    {"size-max", LYNX_OPT_U32, O(size_max), "1024", 0, UINT32_MAX, NULL, ""},
    {"framing", LYNX_OPT_STR, O(framing), "len32", 0, 0, NULL, ""},
    {"seed", LYNX_OPT_U64, O(seed), "1", 0, UINT64_MAX, NULL, ""},
    {"timeout-ms", LYNX_OPT_U64, O(timeout_ms), "20000", 0, UINT64_MAX, NULL,
     ""},
    {"mode", LYNX_OPT_ENUM, O(mode), "echo", 0, 0, mode_names, ""},
    LYNX_OPT_END,
};
#undef O

int main(int argc, char **argv) {
  static struct cfg cfg; /* its strings live as long as the process */
  uint32_t n_conns;
  uint64_t timeout, start, deadline;
  enum mode mode;
  struct sockaddr_in sa;
  struct conn *cs;
  uint64_t sent = 0, answered = 0, mismatched = 0, closed = 0, errors = 0,
           connected = 0;
  uint8_t *buf;
  int ep, ok, rc;

  if ((rc = tool_opts(opts, &cfg, argc, argv, USAGE, NULL)) >= 0)
    return rc;
  if (tool_ipv4_target(cfg.target, &sa))
    return tool_usage(USAGE);
  if (!strncmp(cfg.framing, "fixed:", 6))
    fixed = (uint32_t)strtoul(cfg.framing + 6, NULL, 0);
  else if (strcmp(cfg.framing, "len32"))
    return tool_usage(USAGE);
  n_conns = cfg.conns;
  messages = cfg.messages;
  window = cfg.window;
  size_max = cfg.size_max;
  seed = cfg.seed;
  timeout = cfg.timeout_ms;
  mode = (enum mode)cfg.mode;
  if (!n_conns || !window || size_max > (64u << 20))
    return tool_usage(USAGE);
  /* thousands of connections: lift the soft descriptor limit */
  lynx_raise_nofile((unsigned long)-1);
  cs = calloc(n_conns, sizeof(*cs));
  buf = malloc(size_max + 8u + 65536u);
  ep = epoll_create1(0);
  if (!cs || !buf || ep < 0)
    return 2;

  start = tool_now_ms();
  deadline = start + timeout;
  for (uint32_t i = 0; i < n_conns; i++) {
    struct conn *c = &cs[i];
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = i};
    int one = 1;
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&sa, sizeof(sa))) {
      fprintf(stderr, "tcp_load: connection %u: %s\n", i, strerror(errno));
      errors++;
      c->done = 1;
      if (c->fd >= 0)
        close(c->fd);
      c->fd = -1;
      continue;
    }
    connected++;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
  }

  /* first sends (all modes) */
  for (uint32_t i = 0; i < n_conns; i++) {
    struct conn *c = &cs[i];
    if (c->done)
      continue;
    if (mode == M_GARBAGE) {
      memset(buf, 0xFF, 4);
      memset(buf + 4, 0x5A, 64);
      if (send_all(c->fd, buf, 68))
        errors++;
      continue;
    }
    if (mode == M_OVERSIZE) {
      uint32_t be = htonl(size_max);
      memcpy(buf, &be, 4);
      memset(buf + 4, 0x33, size_max);
      if (send_all(c->fd, buf, 4u + size_max)) /* the server may close early */
        c->closed_by_server = 1;
      continue;
    }
    if (mode == M_SLOW) { /* send everything, read nothing */
      struct timeval tv = {1, 0};
      uint32_t be = htonl(size_max);
      setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
      memcpy(buf, &be, 4);
      memset(buf + 4, 0x44, size_max);
      for (uint32_t k = 0; k < messages; k++) {
        if (send_all(c->fd, buf, 4u + size_max))
          break; /* closed on us, or it stopped reading us for a second */
        sent++;
      }
      continue;
    }
    sent += fill_window(c, i, buf, &errors);
    if (mode == M_DISCONNECT) {
      close(c->fd); /* requests in flight, nobody to answer */
      c->fd = -1;
      c->done = 1;
    }
  }

  /* a slow reader: let the server's unsent answers pile up, then look */
  if (mode == M_SLOW)
    sleep(2);

  /* answers, refills, closes */
  for (;;) {
    struct epoll_event evs[256];
    uint32_t live = 0;
    int n;
    for (uint32_t i = 0; i < n_conns; i++)
      live += !cs[i].done;
    if (!live || tool_now_ms() >= deadline)
      break;
    n = epoll_wait(ep, evs, 256, 100);
    for (int e = 0; e < n; e++) {
      struct conn *c = &cs[evs[e].data.u32];
      uint32_t i = evs[e].data.u32;
      ssize_t k;
      if (c->done)
        continue;
      if (c->in_cap - c->in_len < 65536) {
        size_t cap = c->in_cap ? c->in_cap * 2 : 65536 + size_max + 8;
        uint8_t *p = realloc(c->in, cap);
        if (!p)
          return 2;
        c->in = p;
        c->in_cap = cap;
      }
      k = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
      if (k <= 0) {
        if (k < 0 && errno == EINTR)
          continue;
        c->closed_by_server = 1;
        c->done = 1;
        closed++;
        close(c->fd);
        c->fd = -1;
        continue;
      }
      c->in_len += (size_t)k;
      if (mode != M_ECHO) {
        c->in_len = 0; /* anything back is unexpected but harmless */
        continue;
      }
      for (;;) { /* whole answers, in order */
        uint32_t hdr = fixed ? 0 : 4, len, want;
        size_t off = 0;
        if (c->in_len < (fixed ? fixed : 4u))
          break;
        if (fixed) {
          len = fixed;
        } else {
          uint32_t be;
          memcpy(&be, c->in, 4);
          len = ntohl(be);
        }
        if (c->in_len < hdr + len)
          break;
        want = msg_len(seed, i, c->answered, size_max, fixed);
        msg_fill(buf, want, seed, i, c->answered);
        if (c->answered >= c->sent || len != want ||
            memcmp(c->in + hdr, buf, len)) {
          if (mismatched++ < 5)
            fprintf(stderr,
                    "tcp_load: connection %u answer %u: %u bytes, "
                    "expected %u%s\n",
                    i, c->answered, len, want,
                    len == want ? " (contents differ)" : "");
        }
        c->answered++;
        answered++;
        off = hdr + len;
        memmove(c->in, c->in + off, c->in_len - off);
        c->in_len -= off;
      }
      sent += fill_window(c, i, buf, &errors);
      if (c->answered == messages) {
        c->done = 1;
        close(c->fd);
        c->fd = -1;
      }
    }
  }
  {
    uint64_t el = tool_now_ms() - start;
    uint64_t timeouts = 0;
    for (uint32_t i = 0; i < n_conns; i++)
      if (!cs[i].done) {
        timeouts++;
        close(cs[i].fd);
      }
    printf("tcp_load: mode=%s conns=%u connected=%llu sent=%llu "
           "answered=%llu mismatched=%llu closed_by_server=%llu errors=%llu "
           "unfinished=%llu elapsed_ms=%llu rate=%.0f\n",
           mode == M_ECHO         ? "echo"
           : mode == M_DISCONNECT ? "disconnect"
           : mode == M_GARBAGE    ? "garbage"
           : mode == M_SLOW       ? "slowreader"
                                  : "oversize",
           n_conns, (unsigned long long)connected, (unsigned long long)sent,
           (unsigned long long)answered, (unsigned long long)mismatched,
           (unsigned long long)closed, (unsigned long long)errors,
           (unsigned long long)timeouts, (unsigned long long)el,
           el ? answered * 1000.0 / (double)el : 0.0);
    switch (mode) {
    case M_ECHO:
      ok = connected == n_conns && !mismatched && !errors && !timeouts &&
           !closed && answered == (uint64_t)n_conns * messages;
      break;
    case M_DISCONNECT:
      ok = connected == n_conns && !errors;
      break;
    default: /* garbage, oversize: the server closed every connection */
      ok = connected == n_conns && closed == n_conns;
      break;
    }
  }
  for (uint32_t i = 0; i < n_conns; i++)
    free(cs[i].in);
  free(cs);
  free(buf);
  close(ep);
  return ok ? 0 : 1;
}
