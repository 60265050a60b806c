/* ctlconn.c - framed control connections; see ctlconn.h. */
#include "ctlconn.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "util.h"

struct ctl_write {
  uv_write_t req;
  struct lynx_ctl *c;
  uint8_t *buf;
};

/* A refusal held back (lynx_ctl_refuse). */
struct lynx_ctl_held {
  uv_timer_t timer;
  struct lynx_ctl *c; /* NULL once the connection went first */
  uint8_t *buf;
  size_t len;
};

void lynx_ctl_init(struct lynx_ctl *c, const char *comp, size_t frame_max,
                   lynx_ctl_msg_cb on_msg, lynx_ctl_close_cb on_close) {
  lynx_frame_reader_init(&c->rd, frame_max < LYNX_CTL_UNTRUSTED_MAX
                                     ? frame_max
                                     : LYNX_CTL_UNTRUSTED_MAX);
  c->frame_max = frame_max;
  c->trusted = 0;
  c->held = NULL;
  c->on_msg = on_msg;
  c->on_close = on_close;
  c->comp = comp;
  c->peer[0] = 0;
  c->closing = 0;
  c->close_after_write = 0;
  c->pending_writes = 0;
  c->dialer = NULL;
  c->tls = NULL;
  c->on_tls_ready = NULL;
  c->on_not_tls = NULL;
  c->tls_failed = 0;
  c->tcp.data = c;
}

static void on_closed(uv_handle_t *h) {
  struct lynx_ctl *c = h->data;
  lynx_frame_reader_free(&c->rd);
  if (c->tls) {
    lynx_tls_conn_free(c->tls);
    free(c->tls);
    c->tls = NULL;
  }
  if (c->on_close)
    c->on_close(c);
}

static void held_closed(uv_handle_t *h) {
  struct lynx_ctl_held *held = h->data;
  free(held->buf);
  free(held);
}

static void ctl_close_level(struct lynx_ctl *c, int level, const char *reason) {
  if (c->closing)
    return;
  c->closing = 1;
  if (c->held) {
    c->held->c = NULL;
    uv_timer_stop(&c->held->timer);
    uv_close((uv_handle_t *)&c->held->timer, held_closed);
    c->held = NULL;
  }
  if (reason && c->trusted) {
    LYNX_LOG(level, c->comp, "closing control connection %s: %s",
             c->peer[0] ? c->peer : "(unconnected)", reason);
  } else if (reason && level <= lynx_log_level) {
    /* a stranger can open as many as it likes: rate-limited, per kind of
     * reason (its text up to the first number or quote), so one flood does
     * not hide other news */
    static __thread struct lynx__log_rl rl[16];
    uint32_t h = 2166136261u;
    uint64_t sup;
    for (const char *r = reason;
         *r && !(*r >= '0' && *r <= '9') && *r != '\'' && *r != '"'; r++)
      h = (h ^ (uint8_t)*r) * 16777619u;
    if (lynx__log_rl_allow(&rl[h % 16], &sup))
      lynx__log(level, c->comp,
                "closing control connection %s: %s (%llu "
                "similar suppressed)",
                c->peer[0] ? c->peer : "(unconnected)", reason,
                (unsigned long long)sup);
  }
  uv_close((uv_handle_t *)&c->tcp, on_closed);
}

void lynx_ctl_trust(struct lynx_ctl *c) {
  c->trusted = 1;
  c->rd.max = c->frame_max;
}

void lynx_ctl_close(struct lynx_ctl *c, const char *reason) {
  ctl_close_level(c, LYNX_LOG_WARN, reason);
}

static void on_alloc(uv_handle_t *h, size_t sz, uv_buf_t *buf) {
  static __thread char chunk[65536];
  (void)h;
  (void)sz;
  *buf = uv_buf_init(chunk, sizeof(chunk));
}

/* Frames from n bytes of plain text, each to on_msg, until c closes. */
static void deliver(struct lynx_ctl *c, const void *p, size_t n) {
  char why[128];
  if (lynx_frame_feed(&c->rd, p, n)) {
    lynx_ctl_close(c, "out of memory buffering a frame");
    return;
  }
  for (;;) {
    Lynx__Envelope *env = NULL;
    int rc = lynx_frame_next(&c->rd, &env);
    if (rc == 0)
      return;
    if (rc == -EMSGSIZE) {
      snprintf(why, sizeof(why), "frame larger than the %zu-byte cap",
               c->rd.max);
      lynx_ctl_close(c, why);
      return;
    }
    if (rc < 0) {
      lynx_ctl_close(c, "frame does not decode as a lynx.Envelope");
      return;
    }
    c->on_msg(c, env);
    lynx__envelope__free_unpacked(env, NULL);
    if (c->closing)
      return;
  }
}

/* n bytes of ciphertext: the handshake advanced, then every complete
 * record decrypted and delivered. Bounded per wakeup by what one read
 * brought (64 KiB) and what GnuTLS holds of a partial record. */
static void tls_input(struct lynx_ctl *c, const void *p, size_t n) {
  static __thread uint8_t plain[16384 + 256]; /* a record's worth */
  char err[320], why[400];
  int rc;
  /* a TLS connection opens with a handshake record (content type 22); a
   * lynx frame opens with its length's high byte, 0 */
  if (!c->tls->fed && n && c->on_not_tls && *(const uint8_t *)p != 22) {
    lynx_tls_conn_free(c->tls);
    free(c->tls);
    c->tls = NULL;
    c->on_not_tls(c);
    return;
  }
  if (lynx_tls_feed(c->tls, p, n)) {
    lynx_ctl_close(c, "out of memory buffering TLS records");
    return;
  }
  if (!c->tls->ready) {
    rc = lynx_tls_handshake(c->tls, err, sizeof(err));
    if (rc == -EAGAIN)
      return;
    if (rc) {
      snprintf(why, sizeof(why), "TLS handshake failed: %s", err);
      c->tls_failed = 1;
      lynx_ctl_close(c, why);
      return;
    }
    if (c->on_tls_ready)
      c->on_tls_ready(c);
    if (c->closing)
      return;
  }
  for (;;) {
    ssize_t r = lynx_tls_recv(c->tls, plain, sizeof(plain), err, sizeof(err));
    if (r == -EAGAIN)
      return;
    if (r == 0) {
      ctl_close_level(c, LYNX_LOG_INFO, "peer closed the TLS session");
      return;
    }
    if (r < 0) {
      snprintf(why, sizeof(why), "TLS: %s", err);
      lynx_ctl_close(c, why);
      return;
    }
    deliver(c, plain, (size_t)r);
    if (c->closing)
      return;
  }
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  struct lynx_ctl *c = s->data;
  char why[128];
  if (n == UV_EOF) {
    if (c->rd.len) {
      snprintf(why, sizeof(why),
               "peer closed the connection in the middle of a frame (%zu "
               "bytes buffered)",
               c->rd.len);
      lynx_ctl_close(c, why);
    } else {
      ctl_close_level(c, LYNX_LOG_INFO, "peer closed the connection");
    }
    return;
  }
  if (n < 0) {
    snprintf(why, sizeof(why), "read error: %s", uv_strerror((int)n));
    lynx_ctl_close(c, why);
    return;
  }
  if (c->closing || n == 0)
    return;
  if (c->tls)
    tls_input(c, buf->base, (size_t)n);
  else
    deliver(c, buf->base, (size_t)n);
}

int lynx_ctl_start(struct lynx_ctl *c) {
  struct sockaddr_storage ss;
  int len = sizeof(ss);
  int rc;
  if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &len) == 0)
    lynx_fmt_addr((struct sockaddr *)&ss, c->peer, sizeof(c->peer));
  uv_tcp_nodelay(&c->tcp, 1);
  rc = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
  if (!rc && c->tls)
    tls_input(c, NULL, 0); /* a client's first flight; a server waits */
  return c->closing ? -EPROTO : rc;
}

static void on_written(uv_write_t *req, int status) {
  struct ctl_write *w = container_of(req, struct ctl_write, req);
  struct lynx_ctl *c = w->c;
  free(w->buf);
  free(w);
  c->pending_writes--;
  if (status < 0 && status != UV_ECANCELED) {
    char why[128];
    snprintf(why, sizeof(why), "write error: %s", uv_strerror(status));
    lynx_ctl_close(c, why);
  } else if (c->close_after_write && c->pending_writes == 0) {
    lynx_ctl_close(c, NULL);
  }
}

/* Writes len bytes of buf, which it owns (frees) from here on. */
static int stream_write(struct lynx_ctl *c, uint8_t *buf, size_t len) {
  struct ctl_write *w = calloc(1, sizeof(*w));
  uv_buf_t b;
  int rc;
  if (!w) {
    free(buf);
    return -ENOMEM;
  }
  w->c = c;
  w->buf = buf;
  b = uv_buf_init((char *)buf, (unsigned)len);
  rc = uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, on_written);
  if (rc) {
    free(buf);
    free(w);
    return rc;
  }
  c->pending_writes++;
  return 0;
}

/* GnuTLS's ciphertext, copied: its buffer is gone when we return. */
static int tls_push(void *arg, const void *p, size_t n) {
  uint8_t *copy = malloc(n ? n : 1);
  if (!copy)
    return -ENOMEM;
  memcpy(copy, p, n);
  return stream_write(arg, copy, n);
}

/* A frame to the peer: encrypted when TLS is on. Owns buf. */
static int write_buf(struct lynx_ctl *c, uint8_t *buf, size_t len) {
  int rc;
  if (!c->tls)
    return stream_write(c, buf, len);
  rc = c->tls->ready ? lynx_tls_send(c->tls, buf, len) : -ENOTCONN;
  free(buf);
  return rc;
}

int lynx_ctl_tls(struct lynx_ctl *c, const struct lynx_tls *t, const char *host,
                 void (*on_ready)(struct lynx_ctl *c), char *err,
                 size_t errlen) {
  int rc;
  c->tls = calloc(1, sizeof(*c->tls));
  if (!c->tls)
    return lynx_fail(err, errlen, -ENOMEM, "TLS: out of memory");
  rc = lynx_tls_conn_init(c->tls, t, host, tls_push, c, err, errlen);
  if (rc) {
    free(c->tls);
    c->tls = NULL;
    return rc;
  }
  c->on_tls_ready = on_ready;
  return 0;
}

int lynx_ctl_send(struct lynx_ctl *c, const Lynx__Envelope *env) {
  uint8_t *buf;
  size_t len;
  int rc;
  if (c->closing)
    return -EPIPE;
  rc = lynx_frame_encode(env, c->frame_max, &buf, &len);
  if (rc)
    return rc;
  return write_buf(c, buf, len);
}

static void held_fire(uv_timer_t *t) {
  struct lynx_ctl_held *held = t->data;
  struct lynx_ctl *c = held->c;
  uint8_t *buf = held->buf;
  held->buf = NULL;
  c->held = NULL;
  uv_close((uv_handle_t *)&held->timer, held_closed);
  c->close_after_write = 1;
  if (write_buf(c, buf, held->len))
    lynx_ctl_close(c, NULL);
}

int lynx_ctl_refuse(struct lynx_ctl *c, const Lynx__Envelope *env,
                    uint64_t delay_ms) {
  struct lynx_ctl_held *held;
  int rc;
  if (c->closing || c->held)
    return -EPIPE;
  if (!delay_ms) {
    rc = lynx_ctl_send(c, env);
    if (!rc)
      c->close_after_write = 1;
    return rc;
  }
  held = calloc(1, sizeof(*held));
  if (!held)
    return -ENOMEM;
  rc = lynx_frame_encode(env, c->frame_max, &held->buf, &held->len);
  if (rc) {
    free(held);
    return rc;
  }
  uv_read_stop((uv_stream_t *)&c->tcp);
  held->c = c;
  uv_timer_init(c->tcp.loop, &held->timer);
  held->timer.data = held;
  uv_timer_start(&held->timer, held_fire, delay_ms, 0);
  c->held = held;
  return 0;
}

/* ---- dialer ------------------------------------------------------------ */

int lynx_dialer_init(struct lynx_dialer *d, uv_loop_t *loop, const char *addrs,
                     const char *comp, const char *target, size_t frame_max) {
  if (lynx_parse_hostports(addrs, d->addrs, d->addr_str, LYNX_ADDRS_MAX,
                           &d->n_addr))
    return -EINVAL;
  d->cur = 0;
  d->accepted = 0;
  d->loop = loop;
  d->comp = comp;
  d->target = target;
  d->frame_max = frame_max;
  d->backoff_ms = 0;
  d->backoff_max_ms = 0;
  d->connect_status = 0;
  d->ctl = NULL;
  d->tls = NULL;
  d->hello_timeout_ms = 0;
  d->closed_cb = NULL;
  uv_timer_init(loop, &d->retry);
  d->retry.data = d;
  uv_timer_init(loop, &d->hello);
  d->hello.data = d;
  d->timers_open = 2;
  return 0;
}

const char *lynx_dialer_addr(const struct lynx_dialer *d) {
  return d->addr_str[d->cur];
}

static void dialer_closed(struct lynx_ctl *c) {
  struct lynx_dialer *d = c->dialer;
  d->ctl = NULL;
  uv_timer_stop(&d->hello);
  /* not accepted there: the next address gets the next attempt */
  if (!d->accepted && d->n_addr > 1)
    d->cur = (d->cur + 1) % d->n_addr;
  if (d->on_close)
    d->on_close(c);
  free(c);
}

/* Our Hello: once connected, or with TLS once the handshake is done (the
 * token goes only to a peer whose certificate the CA signed). */
static void dialer_say_hello(struct lynx_ctl *c) {
  struct lynx_dialer *d = c->dialer;
  Lynx__Envelope env = LYNX__ENVELOPE__INIT;
  Lynx__Hello h = LYNX__HELLO__INIT;
  h.proto_version = LYNX_PROTO_VERSION;
  h.role = (char *)d->role;
  h.id = (char *)d->id;
  h.token = (char *)(d->token ? d->token : "");
  h.epoch = d->epoch ? *d->epoch : 0;
  if (d->produces && d->n_produces) {
    h.produces = *d->produces;
    h.n_produces = *d->produces ? *d->n_produces : 0;
  }
  env.msg_case = LYNX__ENVELOPE__MSG_HELLO;
  env.hello = &h;
  if (lynx_ctl_send(c, &env))
    lynx_ctl_close(c, "cannot send hello");
}

static void dialer_on_connected(uv_connect_t *req, int status) {
  struct lynx_ctl *c = req->data;
  struct lynx_dialer *d = c->dialer;
  free(req);
  d->connect_status = status < 0 ? status : 0;
  if (status < 0) {
    LYNX_LOG_RL(LYNX_LOG_WARN, d->comp, "cannot reach %s%s%s: %s", d->target,
                d->n_addr > 1 ? " at " : "",
                d->n_addr > 1 ? d->addr_str[d->cur] : "", uv_strerror(status));
    lynx_ctl_close(c, NULL);
    return;
  }
  if (lynx_ctl_start(c)) {
    lynx_ctl_close(c, "cannot start reading");
    return;
  }
  if (!c->tls)
    dialer_say_hello(c);
}

/* The host of "HOST:PORT" or "[V6]:PORT" into buf. */
static const char *dial_host(const char *addr, char *buf, size_t len) {
  const char *end = strrchr(addr, ':');
  size_t n = end ? (size_t)(end - addr) : strlen(addr);
  if (n >= 2 && addr[0] == '[' && addr[n - 1] == ']') {
    addr++;
    n -= 2;
  }
  snprintf(buf, len, "%.*s", (int)n, addr);
  return buf;
}

/* Connected (or not) and said Hello, but no answer within the timeout: a
 * peer that does not run (stopped, wedged) behind a listening socket. */
static void dialer_hello_late(uv_timer_t *t) {
  struct lynx_dialer *d = t->data;
  char why[160];
  if (!d->ctl || d->accepted)
    return;
  snprintf(why, sizeof(why),
           "no answer within %llu ms (the peer does not "
           "run?)%s",
           (unsigned long long)d->hello_timeout_ms,
           d->n_addr > 1 ? ": trying the next address" : "");
  lynx_ctl_close(d->ctl, why);
}

void lynx_dialer_connect(struct lynx_dialer *d) {
  struct lynx_ctl *c;
  uv_connect_t *req;
  if (d->ctl)
    return;
  c = calloc(1, sizeof(*c));
  req = calloc(1, sizeof(*req));
  if (!c || !req) {
    free(c);
    free(req);
    lynx_dialer_retry(d);
    return;
  }
  uv_tcp_init(d->loop, &c->tcp);
  lynx_ctl_init(c, d->comp, d->frame_max, d->on_msg, dialer_closed);
  lynx_ctl_trust(c); /* the peer is the address we were told to reach */
  c->dialer = d;
  c->data = d->data;
  d->ctl = c;
  d->accepted = 0;
  if (d->tls) {
    char host[LYNX_ADDR_STR_MAX], err[256];
    if (lynx_ctl_tls(c, d->tls,
                     dial_host(d->addr_str[d->cur], host, sizeof(host)),
                     dialer_say_hello, err, sizeof(err))) {
      free(req);
      lynx_ctl_close(c, err);
      return;
    }
  }
  req->data = c;
  if (d->hello_timeout_ms)
    uv_timer_start(&d->hello, dialer_hello_late, d->hello_timeout_ms, 0);
  d->connect_status = uv_tcp_connect(
      req, &c->tcp, (struct sockaddr *)&d->addrs[d->cur], dialer_on_connected);
  if (d->connect_status) {
    free(req);
    lynx_ctl_close(c, "connect failed");
  }
}

static void dialer_fire(uv_timer_t *t) { lynx_dialer_connect(t->data); }

void lynx_dialer_retry(struct lynx_dialer *d) {
  uint64_t max = d->backoff_max_ms ? d->backoff_max_ms : 2000;
  /* with several addresses the wait grows once per round of them, to at
   * most 500 ms: a leader that just took over is found within a round,
   * and a follower's refusal costs it little */
  if (d->n_addr > 1 && max > 500)
    max = 500;
  if (!d->backoff_ms || d->n_addr == 1 || d->cur == 0)
    d->backoff_ms = d->backoff_ms ? d->backoff_ms * 2 : 100;
  if (d->backoff_ms > max)
    d->backoff_ms = max;
  uv_timer_start(&d->retry, dialer_fire,
                 d->backoff_ms / 2 + (uint64_t)rand() % (d->backoff_ms / 2 + 1),
                 0);
}

void lynx_dialer_connected(struct lynx_dialer *d) {
  d->backoff_ms = 0;
  d->accepted = 1;
  uv_timer_stop(&d->hello);
}

void lynx_dialer_silent(struct lynx_dialer *d, const char *what,
                        uint64_t quiet_ms) {
  char why[200];
  if (!d->ctl)
    return;
  snprintf(why, sizeof(why),
           "%s for %llu ms: the peer does not run or "
           "cannot be reached; trying %s",
           what, (unsigned long long)quiet_ms,
           d->n_addr > 1 ? "the next address" : "again");
  d->accepted = 0; /* dialer_closed moves on */
  lynx_ctl_close(d->ctl, why);
}

static void dialer_timer_closed(uv_handle_t *h) {
  struct lynx_dialer *d = h->data;
  if (--d->timers_open == 0 && d->closed_cb)
    d->closed_cb((uv_handle_t *)&d->retry);
}

void lynx_dialer_close(struct lynx_dialer *d, uv_close_cb cb) {
  uv_timer_stop(&d->retry);
  uv_timer_stop(&d->hello);
  d->closed_cb = cb;
  uv_close((uv_handle_t *)&d->retry, dialer_timer_closed);
  uv_close((uv_handle_t *)&d->hello, dialer_timer_closed);
}
