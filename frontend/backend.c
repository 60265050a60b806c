/*
 * backend.c - client mqueues (paper §4.3): what an application writes into
 * a client mqueue's TX ring is sent to that mqueue's back end on a TCP
 * connection the frontend keeps; the back end's replies come back into the
 * same mqueue's RX ring, in order, each carrying the tag of the request it
 * answers (docs/client-mqueues.md).
 *
 * One connection per (worker, instance, back end): the worker that owns
 * the client mqueue owns its connection, in its own loop, without locks.
 * A connection reaches its worker only through the struct fe_backend_env
 * it was opened with (the manager, the loop, the worker's index and
 * backoff seed), so it is testable without a worker.
 *
 * Replies are cut per the back end's protocol: "len32" (a 4-byte big-endian
 * length, then the bytes) or "memcached" (the text protocol: one line, or
 * VALUE blocks up to END). Back ends answer in order, so a FIFO of tags
 * pairs replies with requests.
 *
 * Failures: a connection that cannot be made or breaks is retried with
 * jittered backoff (100 ms to 5 s). Requests in flight on it, and requests
 * while it is down, are answered at once with status LYNX_ST_BACKEND_DOWN,
 * so the application answers its client promptly instead of waiting. A
 * reply that does not fit a slot comes back as LYNX_ST_TOO_LONG. An
 * unsolicited or malformed reply breaks the connection (and is logged).
 *
 * Bounds: at most BE_TAGS requests in flight and BE_OUT_MAX bytes unsent
 * per connection (beyond, the TX slot waits in the ring: -EAGAIN); a reply
 * may be at most BE_REPLY_MAX bytes.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "beframe.h"
#include "log.h"
#include "outq.h"
#include "rmq.h"
#include "util.h"

#define BE_TAGS 4096u
#define BE_OUT_MAX (4u << 20)
#define BE_RETRY_MIN_MS 100u
#define BE_RETRY_MAX_MS 5000u

enum be_state { BE_DOWN, BE_CONNECTING, BE_UP };

struct fe_backend {
  uv_tcp_t tcp;
  uv_timer_t timer;
  uv_connect_t creq;
  const struct fe_backend_env *env; /* its worker's (backend.h) */
  struct fe_mq *mq;                 /* NULL once its mqueue is gone */
  struct fe_backend_cfg cfg;
  enum be_state state;
  int tcp_open, handles, closing, reading;
  uint64_t retry_ms; /* backoff; 0 while connected */
  uint32_t tags[BE_TAGS];
  uint32_t t_head, t_tail;
  uint8_t *in;
  size_t in_len, in_cap;
  struct fe_outq out;
  char why[96];
};

static void be_connect(struct fe_backend *be);
static void be_flush(struct fe_backend *be);

static void be_handle_closed(uv_handle_t *h) {
  struct fe_backend *be = h->data;
  if (h == (uv_handle_t *)&be->tcp)
    be->tcp_open = 0;
  if (--be->handles == 0 && be->closing) {
    free(be->in);
    fe_outq_free(&be->out);
    free(be);
  }
}

static int rx_room(const struct fe_mq *mq) {
  return mq->dq.rx_prod - mq->dq.rx_cons < mq->dq.slots;
}

/* Puts a reply into the client mqueue. 0, or -EAGAIN when its RX ring is
 * full (try again later). A dead accelerator connection takes nothing:
 * the reply is dropped. */
static int deliver(struct fe_backend *be, const uint8_t *data, uint32_t len,
                   uint32_t tag, uint16_t status) {
  struct fe_mq *mq = be->mq;
  int rc;
  if (!mq || mq->conn->state == FE_CONN_DEAD) {
    if (mq)
      lynx_cnt_add(&mq->drops[FE_QDROP_LOST], 1);
    return 0;
  }
  if (!rx_room(mq))
    return -EAGAIN;
  if (status == LYNX_ST_OK && len > lynx_msg_cap(&mq->conn->acc.g)) {
    status = LYNX_ST_TOO_LONG;
    len = 0;
  }
  rc = fe_write_rx(be->env->rmq, mq, data, len, tag, status);
  if (rc == -ENOBUFS || rc == -ENOSPC)
    return -EAGAIN; /* transport or large area full: delivered later */
  if (rc) {
    lynx_cnt_add(&mq->drops[FE_QDROP_WRITE_ERR], 1);
    return 0;
  }
  mq->dq.rx_prod++;
  mq->conn->dirty = 1;
  if (status == LYNX_ST_OK)
    lynx_cnt_add(&mq->responded, 1);
  else
    lynx_cnt_add(&mq->drops[FE_QDROP_BACKEND_DOWN], 1);
  return 0;
}

/* Answers every request still waiting with BACKEND_DOWN, as far as the RX
 * ring has room (the rest at the next progress call). */
static void fail_pending(struct fe_backend *be) {
  static const uint8_t none[1];
  while (be->t_head != be->t_tail &&
         deliver(be, none, 0, be->tags[be->t_head % BE_TAGS],
                 LYNX_ST_BACKEND_DOWN) == 0)
    be->t_head++;
}

static void on_retry(uv_timer_t *t) { be_connect(t->data); }

static void be_down(struct fe_backend *be, const char *why) {
  uint64_t wait_ms;
  if (be->state == BE_DOWN)
    return;
  be->state = BE_DOWN;
  snprintf(be->why, sizeof(be->why), "%s", why);
  be->in_len = be->out.len = 0;
  be->reading = 0;
  if (be->tcp_open && !uv_is_closing((uv_handle_t *)&be->tcp))
    uv_close((uv_handle_t *)&be->tcp, be_handle_closed);
  fail_pending(be);
  wait_ms = lynx_backoff_next(&be->retry_ms, BE_RETRY_MIN_MS, BE_RETRY_MAX_MS,
                              be->env->retry_seed);
  LYNX_LOG_RL(LYNX_LOG_WARN, "frontend",
              "worker %u: back end %s (%s) down: "
              "%s; retrying in %llu ms",
              be->env->worker, be->cfg.name, be->cfg.address, why,
              (unsigned long long)wait_ms);
  if (!be->closing)
    uv_timer_start(&be->timer, on_retry, wait_ms, 0);
}

/* ---- replies ---------------------------------------------------------- */

/* Delivers complete replies; stops (reading paused) when the RX ring is
 * full. */
static void be_parse(struct fe_backend *be) {
  size_t off = 0;
  while (be->state == BE_UP) {
    long n = fe_be_reply_len(be->cfg.proto, be->in + off, be->in_len - off);
    uint32_t hdr = be->cfg.proto == FE_BE_LEN32 ? 4 : 0;
    if (n == 0)
      break;
    if (n < 0) {
      be_down(be, "malformed reply");
      return;
    }
    if (be->t_head == be->t_tail) {
      be_down(be, "reply without a request");
      return;
    }
    if (deliver(be, be->in + off + hdr, (uint32_t)(n - hdr),
                be->tags[be->t_head % BE_TAGS], LYNX_ST_OK) == -EAGAIN)
      break;
    be->t_head++;
    off += (size_t)n;
  }
  if (be->state != BE_UP)
    return;
  if (off) {
    memmove(be->in, be->in + off, be->in_len - off);
    be->in_len -= off;
  }
}

static void be_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b) {
  struct fe_backend *be = h->data;
  size_t want = be->in_len + 65536;
  (void)hint;
  if (want > BE_REPLY_MAX + 65536 + 1024) {
    *b = uv_buf_init(NULL, 0);
    return;
  }
  if (be->in_cap < want) {
    uint8_t *p = realloc(be->in, want);
    if (!p) {
      *b = uv_buf_init(NULL, 0);
      return;
    }
    be->in = p;
    be->in_cap = want;
  }
  *b = uv_buf_init((char *)be->in + be->in_len,
                   (unsigned)(be->in_cap - be->in_len));
}

static void be_on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
  struct fe_backend *be = s->data;
  (void)b;
  if (n < 0) {
    be_down(be, n == UV_EOF       ? "closed by the back end"
                : n == UV_ENOBUFS ? "reply too long"
                                  : uv_strerror((int)n));
    return;
  }
  be->in_len += (size_t)n;
  be_parse(be);
}

/* ---- requests ------------------------------------------------------------ */

static void be_on_write(uv_write_t *req, int status) {
  struct fe_backend *be = req->data;
  fe_outq_written(&be->out);
  if (status < 0) {
    if (status != UV_ECANCELED)
      be_down(be, uv_strerror(status));
    return;
  }
  be_flush(be);
}

static void be_flush(struct fe_backend *be) {
  int rc;
  if (be->state != BE_UP)
    return;
  rc = fe_outq_flush(&be->out, (uv_stream_t *)&be->tcp, be, be_on_write);
  if (rc)
    be_down(be, uv_strerror(rc));
}

int fe_backend_request(struct fe_mq *mq, const uint8_t *data, uint32_t len,
                       uint32_t tag) {
  struct fe_backend *be = mq->be;
  uint8_t *p;
  lynx_cnt_add(&mq->dispatched, 1);
  if (be->state == BE_DOWN) {
    static const uint8_t none[1];
    if (deliver(be, none, 0, tag, LYNX_ST_BACKEND_DOWN) == -EAGAIN) {
      lynx_cnt_add(&mq->dispatched, (uint64_t)-1);
      return -EAGAIN;
    }
    return 0;
  }
  p = be->t_tail - be->t_head < BE_TAGS
          ? fe_outq_reserve(&be->out, len, BE_OUT_MAX)
          : NULL;
  if (!p) { /* the back end is behind: the slot waits in its ring */
    lynx_cnt_add(&mq->dispatched, (uint64_t)-1);
    return -EAGAIN;
  }
  memcpy(p, data, len);
  be->out.len += len;
  be->tags[be->t_tail++ % BE_TAGS] = tag;
  be_flush(be); /* CONNECTING: sent once connected */
  return 0;
}

/* ---- connection ---------------------------------------------------------- */

static void be_on_connect(uv_connect_t *req, int status) {
  struct fe_backend *be = req->data;
  if (be->closing || be->state != BE_CONNECTING)
    return;
  if (status < 0) {
    be_down(be, uv_strerror(status));
    return;
  }
  be->state = BE_UP;
  if (be->retry_ms)
    LYNX_INFO("frontend", "worker %u: back end %s (%s) up again",
              be->env->worker, be->cfg.name, be->cfg.address);
  be->retry_ms = 0;
  uv_tcp_nodelay(&be->tcp, 1);
  if (uv_read_start((uv_stream_t *)&be->tcp, be_alloc, be_on_read)) {
    be_down(be, "cannot read");
    return;
  }
  be->reading = 1;
  be_flush(be);
}

static void be_connect(struct fe_backend *be) {
  int rc;
  if (be->closing)
    return;
  if (be->tcp_open) { /* the last socket is still closing: a moment later */
    uv_timer_start(&be->timer, on_retry, 10, 0);
    return;
  }
  rc = uv_tcp_init(be->env->loop, &be->tcp);
  if (rc) {
    be->state = BE_CONNECTING;
    be_down(be, uv_strerror(rc));
    return;
  }
  be->tcp.data = be;
  be->tcp_open = 1;
  be->handles++;
  be->state = BE_CONNECTING;
  be->creq.data = be;
  rc = uv_tcp_connect(&be->creq, &be->tcp, (struct sockaddr *)&be->cfg.addr,
                      be_on_connect);
  if (rc)
    be_down(be, uv_strerror(rc));
}

int fe_backend_open(const struct fe_backend_env *env, struct fe_mq *mq,
                    const struct fe_backend_cfg *cfg) {
  struct fe_backend *be = calloc(1, sizeof(*be));
  if (!be)
    return -ENOMEM;
  be->env = env;
  be->mq = mq;
  be->cfg = *cfg;
  be->state = BE_DOWN;
  uv_timer_init(env->loop, &be->timer);
  be->timer.data = be;
  be->handles = 1;
  mq->be = be;
  be_connect(be);
  return 0;
}

void fe_backend_close(struct fe_backend *be) {
  be->closing = 1;
  be->mq = NULL;
  uv_timer_stop(&be->timer);
  uv_close((uv_handle_t *)&be->timer, be_handle_closed);
  if (be->tcp_open && !uv_is_closing((uv_handle_t *)&be->tcp))
    uv_close((uv_handle_t *)&be->tcp, be_handle_closed);
}

int fe_backend_progress(struct fe_rmq *r) {
  int work = 0;
  for (uint32_t i = 0; i < r->n_conns; i++) {
    struct fe_conn *c = r->conns[i];
    for (uint32_t k = 0; c->n_client_mqs && k < c->n_mqs; k++) {
      struct fe_backend *be = c->mqs[k].be;
      uint32_t before;
      if (!be)
        continue;
      before = be->t_head;
      if (be->state == BE_UP && be->in_len)
        be_parse(be);
      else if (be->state == BE_DOWN)
        fail_pending(be);
      work |= be->t_head != before;
    }
  }
  return work;
}
