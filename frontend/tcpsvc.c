/*
 * tcpsvc.c - TCP services: the frontend accepts client connections, cuts
 * their byte streams into messages, dispatches every message to the same
 * server mqueues UDP requests use, and writes each answer back on the
 * connection its request came from (docs/tcp-services.md).
 *
 * Framing per service: len32 (a 4-byte big-endian length, then the bytes;
 * answers framed the same way) or fixed N (every message and answer is N
 * bytes; an answer of another size is framed to N: cut or zero-padded).
 *
 * Each worker has its own SO_REUSEPORT listener, so the kernel spreads
 * connections over the workers, and a connection lives on one worker: no
 * locks. A connection is a flow (flow order, docs/design.md): its requests
 * in flight stay on one mqueue, so its answers come back in order. When
 * that mqueue is full, or the tag table is, the connection is paused (not
 * read) until there is room, instead of moving or dropping: a stream loses
 * nothing and keeps its order, and TCP's own flow control slows the client.
 *
 * Bounds: a connection holds at most one frame of input (the largest
 * message the accelerators take, msg_max, plus the length word; the
 * buffer grows only as a frame needs it) and FE_TCP_OUT_MAX bytes of
 * answers the kernel has not taken; past that it is a slow reader and is
 * closed. A frame longer than msg_max closes the connection. A
 * client that closes with requests in flight loses their answers, which
 * are counted (dropped_total{reason="client_gone"}). A request that
 * expires or is lost (its accelerator left) closes its connection: the
 * stream could not stay in step.
 *
 * Owns a worker's listener and client connections (struct fe_tcpsvc). It
 * hands messages to the dispatcher it was given at fe_tcp_init and frames
 * the answers the forwarder hands it (fe_tcp_send), which accounts for
 * them: it calls no file above the dispatcher.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dispatcher.h"
#include "log.h"
#include "tcpframe.h"
#include "tcpsvc.h"

#define FE_TCP_OUT_MAX (4u << 20) /* unsent answer bytes per connection */
#define FE_TCP_BACKLOG 4096

const char *const fe_tcpev_names[FE_TCPEV_MAX] = {
    "accepted", "closed", "oversize", "slow_reader",
    "aborted",  "error",  "no_mqueue"};

static void client_on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b);
static void client_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b);

/* ---- connections --------------------------------------------------------- */

static void client_freed(uv_handle_t *h) {
  struct fe_client *c = h->data;
  free(c->in);
  fe_outq_free(&c->out);
  free(c);
}

static void client_unpause(struct fe_tcpsvc *t, struct fe_client *c) {
  struct fe_client **pp = &t->paused;
  if (!c->paused)
    return;
  while (*pp && *pp != c)
    pp = &(*pp)->next_paused;
  if (*pp)
    *pp = c->next_paused;
  c->paused = 0;
}

/* Closes a connection; answers still due to it are discarded and counted
 * when they come (its slot's generation moves on). */
static void client_close(struct fe_client *c, enum fe_tcpev why) {
  struct fe_tcpsvc *t = c->t;
  if (c->closing)
    return;
  c->closing = 1;
  lynx_cnt_add(&t->events[why], 1);
  if (why != FE_TCP_CLOSED)
    LYNX_LOG_RL(LYNX_LOG_INFO, "frontend",
                "service %s worker %u: client "
                "connection closed: %s",
                t->opts.service, t->opts.worker, fe_tcpev_names[why]);
  client_unpause(t, c);
  t->clients[c->slot] = NULL;
  t->n_clients--;
  uv_close((uv_handle_t *)&c->h, client_freed);
}

static struct fe_client *client_get(struct fe_tcpsvc *t, uint32_t slot,
                                    uint32_t gen) {
  struct fe_client *c = slot < t->n_slots ? t->clients[slot] : NULL;
  return c && c->gen == gen && !c->closing ? c : NULL;
}

/* A free slot for a new connection (the table grows by doubling). */
static int slot_alloc(struct fe_tcpsvc *t, uint32_t *slot) {
  for (uint32_t i = t->n_clients; i < t->n_slots; i++)
    if (!t->clients[i]) {
      *slot = i;
      return 0;
    }
  for (uint32_t i = 0; i < t->n_slots; i++)
    if (!t->clients[i]) {
      *slot = i;
      return 0;
    }
  {
    uint32_t n = t->n_slots ? t->n_slots * 2 : 256;
    struct fe_client **tab = realloc(t->clients, n * sizeof(*tab));
    if (!tab)
      return -ENOMEM;
    memset(tab + t->n_slots, 0, (n - t->n_slots) * sizeof(*tab));
    *slot = t->n_slots;
    t->clients = tab;
    t->n_slots = n;
  }
  return 0;
}

static void on_connection(uv_stream_t *l, int status) {
  struct fe_tcpsvc *t = l->data;
  struct fe_client *c;
  static uint32_t gens; /* shared by the workers: atomic */
  uint32_t slot;
  int full;
  if (status < 0) {
    LYNX_LOG_RL(LYNX_LOG_WARN, "frontend",
                "service %s worker %u: accept: "
                "%s",
                t->opts.service, t->opts.worker, uv_strerror(status));
    return;
  }
  c = calloc(1, sizeof(*c));
  if (!c) {
    LYNX_LOG_RL(LYNX_LOG_WARN, "frontend",
                "worker %u: out of memory for a "
                "connection",
                t->opts.worker);
    return; /* it stays in the backlog */
  }
  uv_tcp_init(t->opts.loop, &c->h);
  c->h.data = c;
  c->t = t;
  full = slot_alloc(t, &slot);
  if (uv_accept(l, (uv_stream_t *)&c->h) || full) {
    if (full) { /* accepted only to be closed: out of memory */
      lynx_cnt_add(&t->events[FE_TCP_ACCEPTED], 1);
      lynx_cnt_add(&t->events[FE_TCP_ERROR], 1);
    }
    uv_close((uv_handle_t *)&c->h, client_freed);
    return;
  }
  uv_tcp_nodelay(&c->h, 1);
  c->slot = slot;
  do
    c->gen = __atomic_add_fetch(&gens, 1, __ATOMIC_RELAXED);
  while (c->gen == 0);
  t->clients[slot] = c;
  t->n_clients++;
  lynx_cnt_add(&t->events[FE_TCP_ACCEPTED], 1);
  if (uv_read_start((uv_stream_t *)&c->h, client_alloc, client_on_read) == 0)
    c->reading = 1;
  else
    client_close(c, FE_TCP_ERROR);
}

/* ---- input --------------------------------------------------------------- */

/* Room for what is read next (fe_tcp_frame_want). */
static void client_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b) {
  struct fe_client *c = h->data;
  uint32_t want = fe_tcp_frame_want(c->t->opts.fixed_len,
                                    c->t->opts.ingress->cap, c->in, c->in_len);
  (void)hint;
  if (c->in_cap < want) {
    uint8_t *p = realloc(c->in, want);
    if (!p) {
      *b = uv_buf_init(NULL, 0);
      return;
    }
    c->in = p;
    c->in_cap = want;
  }
  *b = uv_buf_init((char *)c->in + c->in_len, c->in_cap - c->in_len);
}

static uint32_t client_flow(const struct fe_ingress *in,
                            const struct fe_client *c) {
  uint32_t h = c->slot * 0x9E3779B1u ^ c->gen;
  return in->flows ? (h ^ (h >> 15)) & in->flow_mask : 0;
}

/* Dispatches every complete frame; pauses the connection at the first one
 * that must wait for room. 1 when a frame was dispatched. */
static int client_parse(struct fe_client *c) {
  struct fe_tcpsvc *t = c->t;
  struct fe_ingress *in = t->opts.ingress;
  uint32_t off = 0, fixed = t->opts.fixed_len;
  int work = 0;
  while (!c->closing) {
    uint32_t len = 0, hdr = fixed ? 0 : 4;
    enum fe_wdrop drop;
    int rc;
    long n =
        fe_tcp_frame_len(fixed, in->cap, c->in + off, c->in_len - off, &len);
    if (n < 0) {
      LYNX_LOG_RL(LYNX_LOG_INFO, "frontend",
                  "service %s worker %u: %u-byte "
                  "frame is larger than the %u bytes the accelerators take "
                  "(msg_max): closing the connection",
                  t->opts.service, t->opts.worker, len, in->cap);
      client_close(c, FE_TCP_OVERSIZE);
      return work;
    }
    if (n == 0)
      break;
    if (__atomic_load_n(t->opts.stopping, __ATOMIC_RELAXED)) {
      lynx_cnt_add(&in->drops[FE_DROP_SHUTDOWN], 1);
      off += hdr + len;
      continue;
    }
    rc = fe_submit(in, c->in + off + hdr, len, client_flow(in, c), NULL,
                   c->slot, c->gen, 1, &drop);
    if (rc == -EAGAIN) { /* wait for room; reading stops meanwhile */
      if (!c->paused) {
        c->paused = 1;
        c->next_paused = t->paused;
        t->paused = c;
      }
      break;
    }
    lynx_cnt_add(&in->received, 1);
    in->got++;
    work = 1;
    if (rc && drop == FE_DROP_NO_MQUEUE) {
      lynx_cnt_add(&in->drops[drop], 1);
      client_close(c, FE_TCP_NO_MQUEUE); /* no answer will ever come */
      return work;
    }
    if (rc && drop < FE_WDROP_MAX)
      lynx_cnt_add(&in->drops[drop], 1);
    off += hdr + len;
  }
  if (off) {
    memmove(c->in, c->in + off, c->in_len - off);
    c->in_len -= off;
  }
  if (c->paused && c->reading) {
    uv_read_stop((uv_stream_t *)&c->h);
    c->reading = 0;
  } else if (!c->paused && !c->reading && !c->closing &&
             !__atomic_load_n(t->opts.stopping, __ATOMIC_RELAXED)) {
    if (uv_read_start((uv_stream_t *)&c->h, client_alloc, client_on_read) == 0)
      c->reading = 1;
  }
  return work;
}

static void client_on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
  struct fe_client *c = s->data;
  (void)b;
  if (n < 0) {
    client_close(c, n == UV_EOF || n == UV_ECONNRESET ? FE_TCP_CLOSED
                                                      : FE_TCP_ERROR);
    return;
  }
  c->in_len += (uint32_t)n;
  client_parse(c);
}

int fe_tcp_resume(struct fe_tcpsvc *t) {
  struct fe_client *c = t->paused, *next;
  int work = 0;
  t->paused = NULL;
  for (; c; c = next) {
    next = c->next_paused;
    c->paused = 0;
    work |= client_parse(c);
  }
  return work;
}

/* ---- output -------------------------------------------------------------- */

static void client_on_write(uv_write_t *req, int status);

/* Hands buffered answers to the kernel. */
static void client_flush(struct fe_client *c) {
  if (!c->closing &&
      fe_outq_flush(&c->out, (uv_stream_t *)&c->h, c, client_on_write))
    client_close(c, FE_TCP_ERROR);
}

static void client_on_write(uv_write_t *req, int status) {
  struct fe_client *c = req->data;
  fe_outq_written(&c->out);
  if (status < 0) {
    if (!c->closing)
      client_close(c, FE_TCP_ERROR);
    return;
  }
  client_flush(c);
}

int fe_tcp_send(struct fe_tcpsvc *t, uint32_t cli, uint32_t gen,
                const uint8_t *data, uint32_t len, uint64_t *sent_ns) {
  struct fe_client *c = client_get(t, cli, gen);
  uint32_t fixed = t->opts.fixed_len, body = fixed ? fixed : len;
  size_t need = (fixed ? 0 : 4u) + body;
  uint8_t *p;
  if (!c)
    return -ENOTCONN;
  p = fe_outq_reserve(&c->out, need, FE_TCP_OUT_MAX);
  if (!p) { /* past the bound (or out of memory): a slow reader */
    client_close(c, c->out.len + need > FE_TCP_OUT_MAX ? FE_TCP_SLOW_READER
                                                       : FE_TCP_ERROR);
    return -ENOBUFS;
  }
  if (!fixed) {
    uint32_t be = htonl(len);
    memcpy(p, &be, 4);
    p += 4;
  }
  memcpy(p, data, len < body ? len : body);
  if (len < body)
    memset(p + len, 0, body - len);
  c->out.len += need;
  /* its end-to-end time ends here, before the write (the caller accounts
   * for it) */
  *sent_ns = lynx_now_ns();
  /* the worker sends every gathered answer first, then flushes: several
   * answers to one connection leave in one write */
  client_flush(c);
  return 0;
}

void fe_tcp_abort(struct fe_tcpsvc *t, uint32_t cli, uint32_t gen) {
  struct fe_client *c = client_get(t, cli, gen);
  if (c)
    client_close(c, FE_TCP_ABORTED);
}

/* ---- listener ------------------------------------------------------------ */

void fe_tcp_init(struct fe_tcpsvc *t, const struct fe_tcpsvc_opts *opts) {
  memset(t, 0, sizeof(*t));
  t->opts = *opts;
}

int fe_tcp_open(struct fe_tcpsvc *t) {
  const struct sockaddr_storage *addr = t->opts.addr;
  int fd, one = 1, rc;
  socklen_t alen = addr->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                               : sizeof(struct sockaddr_in);
  fd = socket(addr->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -errno;
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
      setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) != 0 ||
      bind(fd, (const struct sockaddr *)addr, alen) != 0) {
    rc = -errno;
    close(fd);
    return rc;
  }
  rc = uv_tcp_init(t->opts.loop, &t->listener);
  if (rc) {
    close(fd);
    return rc;
  }
  t->listener.data = t;
  t->listener_open = 1;
  rc = uv_tcp_open(&t->listener, fd);
  if (rc) {
    close(fd);
    return rc;
  }
  return uv_listen((uv_stream_t *)&t->listener, FE_TCP_BACKLOG, on_connection);
}

void fe_tcp_stop_accepting(struct fe_tcpsvc *t) {
  if (!t->listener_open)
    return;
  uv_close((uv_handle_t *)&t->listener, NULL);
  t->listener_open = 0;
  /* stop reading new requests; answers to the ones in flight still go */
  for (uint32_t i = 0; i < t->n_slots; i++) {
    struct fe_client *c = t->clients[i];
    if (c && c->reading) {
      uv_read_stop((uv_stream_t *)&c->h);
      c->reading = 0;
    }
  }
}

void fe_tcp_close_all(struct fe_tcpsvc *t) {
  fe_tcp_stop_accepting(t);
  for (uint32_t i = 0; i < t->n_slots; i++)
    if (t->clients[i])
      client_close(t->clients[i], FE_TCP_CLOSED);
}

void fe_tcp_free(struct fe_tcpsvc *t) {
  free(t->clients);
  t->clients = NULL;
  t->n_slots = 0;
}
