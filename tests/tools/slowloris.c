/*
 * lynx-slowloris - a slow HTTP client, to test that a server bounds how long
 * a request's headers (or body) may take however the bytes trickle.
 *
 * Opens --conns TCP connections to --host:--port, each from --source (bound
 * before connect: any 127.x.y.z is loopback on Linux, so a test can play a
 * second client on one machine), and then sends one byte per connection
 * every --interval-ms, never finishing:
 *   --mode header: "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: aaaa..."
 *                  (the headers never end);
 *   --mode body:   a whole POST header block announcing a body of
 *                  --content-length bytes (default 60000: under the
 *                  coordinator's default --body-max, so it is read rather
 *                  than refused with 413), then the body one byte at a time.
 * --header "Name: value" adds a header line (e.g. the API's Authorization,
 * so that the body is read rather than refused from the headers).
 * A connection the server closes (end of stream, reset, or a send that
 * fails) is closed here too and its lifetime recorded, from the end of
 * connect() to the moment the close was seen. With --reopen 1 it is
 * opened again at the next send (a client that keeps the pressure on, as
 * a script retrying in a loop does), until --duration-ms; without, nothing
 * is ever reopened.
 *
 * Output (stdout):
 *   slowloris: ready conns=N connected=C          once every connect ended
 *   slowloris: conns=N connected=C closed=K open=O short=S long=L bytes=B
 *              reopened=R      (one line, at the end)
 * where short/long count the closed connections that lived less / at least
 * --long-ms (connected and closed count the reopened ones too). The
 * server's answer, if any, is read and ignored.
 *
 * Runs until every connection is closed or --duration-ms has passed.
 * Exit status: 0 (the summary says what happened), 2 usage or socket errors.
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

struct slow {
  int fd;           /* -1 when closed (or never connected) */
  uint64_t open_ms; /* when connect() returned */
  size_t sent;      /* bytes of the script sent so far */
};

#define USAGE                                                                  \
  "usage: lynx-slowloris --port P [--host 127.0.0.1] [--source "               \
  "127.0.0.2] [--conns 300] [--interval-ms 1500] [--duration-ms "              \
  "60000] [--long-ms 1000] [--mode header|body] [--path /healthz] "            \
  "[--header 'Name: value'] [--content-length 60000] [--reopen 0|1]\n"

struct cfg {
  char *host, *source, *mode, *path, *extra;
  uint32_t port, conns, interval_ms, reopen;
  uint64_t duration_ms, long_ms, content_length;
};

#define O(f) offsetof(struct cfg, f)
static const struct lynx_opt opts[] = {
    {"host", LYNX_OPT_STR, O(host), "127.0.0.1", 0, 0, NULL, ""},
    {"port", LYNX_OPT_U32, O(port), "0", 0, 65535, NULL, ""},
    {"source", LYNX_OPT_STR, O(source), "127.0.0.2", 0, 0, NULL, ""},
    {"conns", LYNX_OPT_U32, O(conns), "300", 0, 1000000, NULL, ""},
    {"interval-ms", LYNX_OPT_U32, O(interval_ms), "1500", 0, 3600000, NULL, ""},
    {"duration-ms", LYNX_OPT_U64, O(duration_ms), "60000", 0, UINT64_MAX, NULL,
     ""},
    {"long-ms", LYNX_OPT_U64, O(long_ms), "1000", 0, UINT64_MAX, NULL, ""},
    {"mode", LYNX_OPT_STR, O(mode), "header", 0, 0, NULL, ""},
    {"path", LYNX_OPT_STR, O(path), "/healthz", 0, 0, NULL, ""},
    {"header", LYNX_OPT_STR, O(extra), NULL, 0, 0, NULL, ""},
    {"content-length", LYNX_OPT_U64, O(content_length), "60000", 0, UINT64_MAX,
     NULL, ""},
    {"reopen", LYNX_OPT_U32, O(reopen), "0", 0, 1, NULL, ""},
    LYNX_OPT_END,
};
#undef O

/* The next byte of connection s's endless script. */
static char script_byte(const char *head, size_t head_len, size_t pos) {
  return pos < head_len ? head[pos] : 'a';
}

/* Opens s from src to dst: 1 connected, 0 refused at the TCP level
 * (counted as not connected), -1 on a socket error (said on stderr). */
static int slow_open(struct slow *s, const struct sockaddr_in *src,
                     const struct sockaddr_in *dst, const char *src_name) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    fprintf(stderr, "slowloris: socket: %s\n", strerror(errno));
    return -1;
  }
  if (bind(fd, (const struct sockaddr *)src, sizeof(*src))) {
    fprintf(stderr, "slowloris: bind %s: %s\n", src_name, strerror(errno));
    close(fd);
    return -1;
  }
  if (connect(fd, (const struct sockaddr *)dst, sizeof(*dst))) {
    close(fd);
    return 0;
  }
  s->fd = fd;
  s->open_ms = tool_now_ms();
  s->sent = 0;
  return 1;
}

int main(int argc, char **argv) {
  static struct cfg cfg; /* its strings live as long as the process */
  struct sockaddr_in dst, src;
  struct slow *c;
  struct pollfd *pfd;
  char head[1024], hx[600] = "";
  size_t head_len;
  unsigned connected = 0, closed = 0, n_short = 0, n_long = 0, open_now;
  unsigned reopened = 0;
  uint64_t bytes = 0, t_end, next_send;
  int rc;

  if ((rc = tool_opts(opts, &cfg, argc, argv, USAGE, NULL)) >= 0)
    return rc;
  if (!cfg.port || !cfg.conns || !cfg.interval_ms ||
      tool_ipv4(cfg.host, cfg.port, &dst) || tool_ipv4(cfg.source, 0, &src) ||
      (strcmp(cfg.mode, "header") && strcmp(cfg.mode, "body")) ||
      (cfg.extra && strlen(cfg.extra) > sizeof(hx) - 3))
    return tool_usage(USAGE);
  if (cfg.extra)
    snprintf(hx, sizeof(hx), "%s\r\n", cfg.extra);
  if (!strcmp(cfg.mode, "header"))
    snprintf(head, sizeof(head),
             "GET %s HTTP/1.1\r\nHost: %s\r\n%sX-Slow: ", cfg.path, cfg.host,
             hx);
  else
    snprintf(head, sizeof(head),
             "POST %s HTTP/1.1\r\nHost: %s\r\n%sContent-Type: "
             "application/json\r\nContent-Length: %llu\r\n\r\n",
             cfg.path, cfg.host, hx, (unsigned long long)cfg.content_length);
  head_len = strlen(head);
  c = calloc(cfg.conns, sizeof(*c));
  pfd = calloc(cfg.conns, sizeof(*pfd));
  if (!c || !pfd) {
    fprintf(stderr, "slowloris: out of memory\n");
    return 2;
  }
  for (unsigned i = 0; i < cfg.conns; i++) {
    c[i].fd = -1;
    if ((rc = slow_open(&c[i], &src, &dst, cfg.source)) < 0)
      return 2;
    connected += (unsigned)rc;
  }
  printf("slowloris: ready conns=%u connected=%u\n", connected, connected);
  fflush(stdout);

  t_end = tool_now_ms() + cfg.duration_ms;
  next_send = tool_now_ms(); /* the first byte at once */
  for (;;) {
    uint64_t now = tool_now_ms();
    unsigned n = 0;
    int timeout;
    open_now = connected - closed;
    if ((open_now == 0 && !cfg.reopen) || now >= t_end)
      break;
    if (now >= next_send) {
      for (unsigned i = 0; i < cfg.conns; i++) {
        char b;
        if (c[i].fd < 0 && cfg.reopen) {
          if ((rc = slow_open(&c[i], &src, &dst, cfg.source)) < 0)
            return 2;
          connected += (unsigned)rc;
          reopened += (unsigned)rc;
        }
        if (c[i].fd < 0)
          continue;
        b = script_byte(head, head_len, c[i].sent);
        /* in body cfg.mode the header block goes out whole, then the body
         * byte by byte */
        if (!strcmp(cfg.mode, "body") && c[i].sent == 0) {
          ssize_t k = send(c[i].fd, head, head_len, MSG_NOSIGNAL);
          if (k > 0) {
            c[i].sent += (size_t)k;
            bytes += (uint64_t)k;
          }
          continue;
        }
        if (send(c[i].fd, &b, 1, MSG_NOSIGNAL | MSG_DONTWAIT) == 1) {
          c[i].sent++;
          bytes++;
        } /* a failed send shows as a close below */
      }
      next_send = now + cfg.interval_ms;
    }
    for (unsigned i = 0; i < cfg.conns; i++) {
      if (c[i].fd < 0)
        continue;
      pfd[n].fd = c[i].fd;
      pfd[n].events = POLLIN;
      pfd[n].revents = 0;
      n++;
    }
    timeout = (int)((next_send < t_end ? next_send : t_end) - now);
    if (poll(pfd, n, timeout < 0 ? 0 : timeout) < 0 && errno != EINTR) {
      fprintf(stderr, "slowloris: poll: %s\n", strerror(errno));
      return 2;
    }
    now = tool_now_ms();
    for (unsigned i = 0, k = 0; i < cfg.conns; i++) {
      char buf[4096];
      ssize_t r;
      if (c[i].fd < 0)
        continue;
      if (!pfd[k++].revents)
        continue;
      r = recv(c[i].fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (r > 0 || (r < 0 && (errno == EAGAIN || errno == EINTR)))
        continue; /* an answer, or nothing after all: keep trickling */
      close(c[i].fd);
      c[i].fd = -1;
      closed++;
      if (now - c[i].open_ms >= cfg.long_ms)
        n_long++;
      else
        n_short++;
    }
  }
  open_now = connected - closed;
  printf("slowloris: conns=%u connected=%u closed=%u open=%u short=%u "
         "long=%u bytes=%llu reopened=%u\n",
         cfg.conns, connected, closed, open_now, n_short, n_long,
         (unsigned long long)bytes, reopened);
  for (unsigned i = 0; i < cfg.conns; i++)
    if (c[i].fd >= 0)
      close(c[i].fd);
  free(c);
  free(pfd);
  return 0;
}
