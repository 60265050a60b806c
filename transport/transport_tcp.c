/*
 * transport_tcp.c - the "tcp" backend: one-sided writes and reads of a
 * remote region carried over a TCP connection and applied by the agent.
 *
 * Wire format (docs/design.md, "tcp transport"): every operation is a
 * 24-byte little-endian header {u8 op, u8 flags, u16 zero, u32 len, u64 off,
 * u64 wr_id} followed by len bytes for HELLO, WRITE, READ_TX and the
 * replies. The frontend sends HELLO {magic, version, region id, epoch,
 * region size, producer}; the agent answers CHALLENGE {nonce}, the
 * frontend PROOF {HMAC-SHA256(key, nonce || HELLO)} (version 4: the key
 * never crosses the wire, tcp_auth.h), and the agent HELLO_REPLY (off = 0
 * or an errno, payload = reason; an unknown region id is refused at once).
 * Then WRITE, READ and READ_TX operations; the agent answers one
 * READ_RESP per READ and READ_TX_RESP per READ_TX, in order.
 *
 * Fencing (version 3): producer is the frontend epoch (desc.producer). The
 * agent refuses an older one than the region admitted (HELLO_REPLY
 * ESTALE, "fenced: ..."); a newer one takes the region over: every
 * connection of an older epoch gets FENCED (off = ESTALE, payload =
 * reason) after its last reply and is closed, so that frontend's next op
 * returns -ESTALE. No operation of a cut connection is applied after the
 * HELLO that cut it: one thread serves both.
 *
 * READ_TX (version 2) is the frontend's poll in one round trip: the agent
 * reads the control array and, from that snapshot, the published TX slots
 * of the mqueues named, from the positions named, and answers with both;
 * the two-step path (array, then slots) took two, each a wake-up of the
 * agent's thread and of the frontend's.
 *
 * Semantics match shm: the agent applies operations in stream order, so a
 * read sees every earlier write (the fenced ordering mode's barrier comes
 * free) and a PUBLISH write stores its last word with release semantics
 * after the rest. After each batch of writes the agent wakes a CPU
 * accelerator that sleeps on the region's doorbell, so the frontend's
 * notify costs nothing on the wire.
 *
 * Bounds and access classes are checked on both sides: the frontend refuses
 * to post an access outside the region (-EFAULT) or a write outside fctrl
 * and the RX rings; the agent closes a connection that asks for one, with a
 * logged reason, before touching memory. A frame that does not parse is
 * treated the same way.
 *
 * Batching: the frontend appends operations to one buffer and sends it with
 * one send() per flush (the doorbell); the agent serves every complete
 * operation a read() brings and answers the reads with one write. Both sides
 * pipeline: a frontend may post new operations before earlier reads return.
 * Device memory with batch ops (struct lynx_region_mem: a GPU's) gets the
 * operations of one read() as one batch: writes are started without
 * waiting, reads are started into the memory's staging with their reply
 * space reserved in order, and one flush at the end waits for all of them
 * before the replies are filled.
 *
 * Agent threads: one libuv loop thread per handle (struct tcp_agent, from
 * agent_create) serves every connection of every region exported through
 * it; the handle also owns the data port's guard (connguard.h). An
 * exported region is reference-counted: region_free unlists it and asks
 * the server thread to close its connections; its memory goes with the
 * last reference.
 */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include <gnutls/crypto.h>

#include "connguard.h"
#include "log.h"
#include "mqueue.h"
#include "tcp_auth.h"
#include "tcp_wire.h"
#include "transport.h"
#include "util.h"

#define TCP_HELLO_MIN 32u /* version 2's HELLO: magic and version in it */
#define TCP_OP_MAX (4u << 20)        /* largest write or read, bytes */
#define TCP_OUT_MAX (32u << 20)      /* frontend: unsent bytes before -ENOBUFS */
#define TCP_READS_MAX 4096u          /* frontend: reads in flight */
#define TCP_SRV_OUT_MAX (16u << 20)  /* agent: queued replies before it stops reading */
#define TCP_CONNECT_MS 1500
#define TCP_HELLO_MS 5000            /* agent: a connection must say hello */

/* READ_TX's payload: {u32 count, u32 0}, then count entries {u32 q, u32
 * from, u32 max, u32 0}. Its answer: the control array (8 bytes per
 * mqueue, as in the region), then per entry {u32 n} and n slots. */
#define TXR_HDR 8u
#define TXR_ENT 16u

#define F_PUBLISH 0x1u

struct tcp_hdr {
  uint8_t op, flags;
  uint16_t zero;
  uint32_t len;
  uint64_t off, wr_id;
};

struct tcp_hello {
  uint32_t magic;
  uint16_t version, zero;
  uint64_t id; /* the region's (lynx__tcp_region_id of its key) */
  uint64_t epoch, region_size;
  uint64_t producer; /* the frontend epoch (desc.producer) */
};

/* ---- the proof of the key (tcp_auth.h) ----------------------------------- */

uint64_t lynx__tcp_region_id(uint64_t key) {
  static const char label[] = "lynx tcp region id";
  uint64_t k = htole64(key), id = 0;
  uint8_t mac[32];
  if (gnutls_hmac_fast(GNUTLS_MAC_SHA256, &k, sizeof(k), label,
                       sizeof(label) - 1, mac) == 0)
    memcpy(&id, mac, sizeof(id));
  return le64toh(id);
}

int lynx__tcp_proof(uint64_t key, const uint8_t nonce[LYNX_TCP_NONCE],
                    const void *hello, size_t hello_len,
                    uint8_t out[LYNX_TCP_PROOF]) {
  uint8_t msg[LYNX_TCP_NONCE + 64];
  uint64_t k = htole64(key);
  if (hello_len > sizeof(msg) - LYNX_TCP_NONCE)
    return -EINVAL;
  memcpy(msg, nonce, LYNX_TCP_NONCE);
  memcpy(msg + LYNX_TCP_NONCE, hello, hello_len);
  return gnutls_hmac_fast(GNUTLS_MAC_SHA256, &k, sizeof(k), msg,
                          LYNX_TCP_NONCE + hello_len, out)
             ? -EIO
             : 0;
}

int lynx__ct_equal(const uint8_t *a, const uint8_t *b, size_t n) {
  volatile uint8_t d = 0; /* no early exit the compiler could add */
  for (size_t i = 0; i < n; i++)
    d |= a[i] ^ b[i];
  return d == 0;
}

static void hdr_put(uint8_t *p, uint8_t op, uint8_t flags, uint32_t len,
                    uint64_t off, uint64_t wr_id) {
  uint32_t l = htole32(len);
  uint64_t o = htole64(off), w = htole64(wr_id);
  p[0] = op;
  p[1] = flags;
  p[2] = p[3] = 0;
  memcpy(p + 4, &l, 4);
  memcpy(p + 8, &o, 8);
  memcpy(p + 16, &w, 8);
}

static void hdr_get(const uint8_t *p, struct tcp_hdr *h) {
  uint16_t z;
  uint32_t l;
  uint64_t o, w;
  h->op = p[0];
  h->flags = p[1];
  memcpy(&z, p + 2, 2);
  memcpy(&l, p + 4, 4);
  memcpy(&o, p + 8, 8);
  memcpy(&w, p + 16, 8);
  h->zero = z;
  h->len = le32toh(l);
  h->off = le64toh(o);
  h->wr_id = le64toh(w);
}

static uint32_t get32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return le32toh(v);
}

static void put32(uint8_t *p, uint32_t v) {
  v = htole32(v);
  memcpy(p, &v, 4);
}

/* The slots a compound read takes of mqueue q from position from: those
 * the control array actrl (the region's bytes) says are published, at most
 * max; none when tx_prod is more than a ring ahead (a bad index, which the
 * frontend counts). The one rule both sides apply to the same bytes. */
static uint32_t txr_count(const struct lynx_geom *g, const uint8_t *actrl,
                          uint32_t q, uint32_t from, uint32_t max) {
  struct lynx_actrl a;
  uint32_t avail;
  memcpy(&a, actrl + 8u * q, sizeof(a));
  avail = a.tx_prod - from;
  if (avail > g->slots)
    return 0;
  return avail < max ? avail : max;
}

/* A growable byte buffer: [head, len) holds unconsumed bytes. */
struct buf {
  uint8_t *p;
  size_t head, len, cap;
};

static int buf_reserve(struct buf *b, size_t more, size_t max) {
  size_t need;
  uint8_t *np;
  if (b->head && b->head == b->len)
    b->head = b->len = 0;
  if (b->len + more <= b->cap)
    return 0;
  if (b->head) { /* compact first */
    memmove(b->p, b->p + b->head, b->len - b->head);
    b->len -= b->head;
    b->head = 0;
    if (b->len + more <= b->cap)
      return 0;
  }
  need = b->len + more;
  if (need > max)
    return -ENOBUFS;
  np = lynx_grow(b->p, &b->cap, need, 65536, max);
  if (!np)
    return -ENOMEM;
  b->p = np;
  return 0;
}

static void buf_free(struct buf *b) {
  free(b->p);
  memset(b, 0, sizeof(*b));
}

/* ====================================================================
 * Agent side
 * ==================================================================== */

struct tcp_agent;

struct tcp_export {
  struct tcp_agent *srv; /* the handle it is exported through */
  int refs;           /* the region's owner + every connection */
  int listed;         /* findable by key */
  uint8_t *base;      /* host memory, or NULL: mem */
  const struct lynx_region_mem *mem;
  uint64_t size;
  uint64_t key, id, epoch; /* id: lynx__tcp_region_id(key), on the wire */
  struct lynx_geom g;
  struct lynx_fence fence; /* serving thread only; metrics read it */
  struct tcp_export *next;
};

struct srv_conn {
  uv_tcp_t tcp;
  struct tcp_agent *srv;
  struct tcp_export *ex; /* NULL until the PROOF passes */
  /* after a HELLO that named a region: the region (referenced), the
   * HELLO and the nonce its PROOF must answer */
  struct tcp_export *cand;
  struct tcp_hello hello;
  uint8_t nonce[LYNX_TCP_NONCE];
  uint64_t producer;     /* its frontend epoch, admitted by ex->fence */
  struct buf in;
  struct buf out;        /* replies not yet handed to the kernel */
  uv_write_t wreq;
  uint8_t *wbuf;         /* bytes of the write in flight */
  int writing, reading, closing;
  int admitted;          /* counted by srv->guard */
  int authed;            /* proved the key (admitted, or fenced): the guard
                            counts it authenticated, also when it closes */
  struct lynx_guard_src *src; /* its source's record there, or NULL */
  /* a refused HELLO whose answer is held back (a source backed off for
   * wrong keys): sent and closed at refuse_at_ns */
  uint64_t refuse_at_ns;
  uint64_t since_ns;
  char peer[64];
  /* the batch of the read() being served (device memory with batch ops):
   * reads whose replies have their space in out, filled after the flush */
  struct srv_pending {
    size_t at;          /* the reply's bytes, from out.head */
    const void *bytes;  /* the memory's staged copy */
    uint32_t len;
  } *pend;
  size_t npend, pend_cap;
  int batched; /* batch ops made since the last flush */
  struct srv_conn *next;
};

/* The agent-side handle: base.bound is the "host:port" listened on. */
struct tcp_agent {
  struct lynx_transport_agent base;
  pthread_mutex_t lock; /* exports list, refs, closing requests */
  struct tcp_export *exports;
  int running;
  pthread_t thread;
  uv_loop_t loop;
  uv_tcp_t listener;
  uv_async_t wake;
  uv_timer_t sweep;
  /* set by agent_destroy, read by srv_on_wake: both under lock, which
   * orders it with the wake (tcp_agent_destroy) */
  int stop;
  struct srv_conn *conns;
  struct lynx_guard guard; /* the data port's caps and counters */
};

static void export_put(struct tcp_export *ex) {
  struct tcp_agent *srv = ex->srv;
  int last;
  pthread_mutex_lock(&srv->lock);
  last = --ex->refs == 0;
  pthread_mutex_unlock(&srv->lock);
  if (last) {
    if (ex->mem)
      ex->mem->release(ex->mem->ctx);
    else
      munmap(ex->base, ex->size);
    free(ex);
  }
}

/* Under srv->lock: the listed export with this id, referenced. */
static struct tcp_export *export_get(struct tcp_agent *srv, uint64_t id) {
  struct tcp_export *ex;
  for (ex = srv->exports; ex; ex = ex->next)
    if (ex->listed && ex->id == id) {
      ex->refs++;
      return ex;
    }
  return NULL;
}

static void srv_on_closed(uv_handle_t *h) {
  struct srv_conn *c = h->data;
  struct tcp_agent *srv = c->srv;
  struct srv_conn **pp = &srv->conns;
  while (*pp && *pp != c)
    pp = &(*pp)->next;
  if (*pp)
    *pp = c->next;
  if (c->ex) {
    lynx_fence_release(&c->ex->fence, c->producer);
    export_put(c->ex);
  }
  if (c->cand)
    export_put(c->cand);
  if (c->admitted)
    lynx_guard_closed(&srv->guard, c->src, c->authed);
  buf_free(&c->in);
  buf_free(&c->out);
  free(c->wbuf);
  free(c->pend);
  free(c);
}

static void srv_close(struct srv_conn *c, const char *why) {
  if (c->closing)
    return;
  c->closing = 1;
  if (why)
    LYNX_LOG_RL(LYNX_LOG_WARN, "tcp", "data connection from %s closed: %s",
                c->peer, why);
  uv_close((uv_handle_t *)&c->tcp, srv_on_closed);
}

static void srv_flush(struct srv_conn *c);

static void srv_on_write(uv_write_t *req, int status) {
  struct srv_conn *c = req->data;
  c->writing = 0;
  free(c->wbuf);
  c->wbuf = NULL;
  if (status < 0) {
    if (!c->closing)
      srv_close(c, uv_strerror(status));
    return;
  }
  srv_flush(c);
}

static void srv_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b);
static void srv_on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b);

/* Hands queued replies to the kernel: a direct write when it takes them,
 * else one uv_write of the rest; reading pauses while too much is queued. */
static void srv_flush(struct srv_conn *c) {
  size_t n = c->out.len - c->out.head;
  if (c->closing)
    return;
  if (n && !c->writing) {
    uv_buf_t b = uv_buf_init((char *)c->out.p + c->out.head, (unsigned)n);
    int w = uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
    if (w > 0) {
      c->out.head += (size_t)w;
      n -= (size_t)w;
    } else if (w != UV_EAGAIN) {
      srv_close(c, uv_strerror(w));
      return;
    }
    if (n) { /* the kernel is full: the rest goes in a write of its own */
      c->wbuf = malloc(n);
      if (!c->wbuf) {
        srv_close(c, "out of memory for replies");
        return;
      }
      memcpy(c->wbuf, c->out.p + c->out.head, n);
      c->out.head = c->out.len = 0;
      b = uv_buf_init((char *)c->wbuf, (unsigned)n);
      c->wreq.data = c;
      if (uv_write(&c->wreq, (uv_stream_t *)&c->tcp, &b, 1, srv_on_write)) {
        srv_close(c, "cannot write replies");
        return;
      }
      c->writing = 1;
    } else {
      c->out.head = c->out.len = 0;
    }
  }
  /* backpressure: a frontend that does not read its replies stops being
   * read */
  if (c->writing && c->out.len - c->out.head >= TCP_SRV_OUT_MAX / 2) {
    if (c->reading) {
      uv_read_stop((uv_stream_t *)&c->tcp);
      c->reading = 0;
    }
  } else if (!c->reading) {
    if (uv_read_start((uv_stream_t *)&c->tcp, srv_alloc, srv_on_read) == 0)
      c->reading = 1;
  }
}

/* Ends the batch of device memory with batch ops: one flush waits for
 * every read started since the last, then their replies are filled in the
 * space reserved for them (in operation order). 0 or the memory's -errno. */
static int srv_batch_end(struct srv_conn *c) {
  const struct lynx_region_mem *m = c->ex ? c->ex->mem : NULL;
  int rc;
  if (!c->batched)
    return 0;
  c->batched = 0;
  rc = m->flush(m->ctx);
  for (size_t i = 0; !rc && i < c->npend; i++)
    memcpy(c->out.p + c->out.head + c->pend[i].at, c->pend[i].bytes,
           c->pend[i].len);
  c->npend = 0;
  return rc;
}

/* Copies [off, off + len) of the region into reply space already reserved
 * at `at` bytes from out.head: at once from host memory (acquire, as a shm
 * read) or memory without batch ops, which is ordered after every earlier
 * write; device memory with batch ops has it started now and filled at the
 * batch's end. A read the memory cannot stage in this batch ends it first;
 * one it cannot stage at all is copied on its own (mem->read, ordered after
 * the batch's writes as well). 0 or -errno. */
static int srv_fill(struct srv_conn *c, uint64_t off, uint32_t len,
                    size_t at) {
  const struct lynx_region_mem *m = c->ex->mem;
  uint8_t *dst = c->out.p + c->out.head + at;
  const void *bytes = NULL;
  struct srv_pending *pp;
  int rc;
  if (!len)
    return 0;
  if (!m) {
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    memcpy(dst, c->ex->base + off, len);
    return 0;
  }
  if (!m->read_start)
    return m->read(m->ctx, off, dst, len);
  if (c->npend == c->pend_cap) {
    size_t cap = c->pend_cap ? 2 * c->pend_cap : 64;
    pp = realloc(c->pend, cap * sizeof(*pp));
    if (!pp)
      return -ENOMEM;
    c->pend = pp;
    c->pend_cap = cap;
  }
  c->batched = 1;
  rc = m->read_start(m->ctx, off, len, &bytes);
  if (rc == -ENOBUFS) { /* the staging is full of this batch's reads */
    rc = srv_batch_end(c);
    if (rc)
      return rc;
    c->batched = 1;
    rc = m->read_start(m->ctx, off, len, &bytes);
  }
  if (rc == -ENOBUFS || rc == -E2BIG)
    return m->read(m->ctx, off, dst, len);
  if (rc)
    return rc;
  pp = &c->pend[c->npend++];
  pp->at = at;
  pp->bytes = bytes;
  pp->len = len;
  return 0;
}

/* Queues a reply; data NULL with len: the region's bytes at off. */
static int srv_reply(struct srv_conn *c, uint8_t op, uint64_t off,
                     uint64_t wr_id, const void *data, uint32_t len) {
  size_t at;
  int rc;
  if (buf_reserve(&c->out, TCP_HDR + len, TCP_SRV_OUT_MAX + TCP_OP_MAX + 64))
    return -ENOBUFS;
  hdr_put(c->out.p + c->out.len, op, 0, len, off, wr_id);
  at = c->out.len - c->out.head + TCP_HDR;
  if (data) {
    if (len)
      memcpy(c->out.p + c->out.len + TCP_HDR, data, len);
  } else {
    rc = srv_fill(c, off, len, at);
    if (rc)
      return rc;
  }
  c->out.len += TCP_HDR + len;
  return 0;
}

/* A compound read (READ_TX): the control array, then from what it says,
 * each named mqueue's published TX slots, in one reply. The request names
 * mqueues and positions only: what is read is derived from the region's
 * geometry, inside the control class and the TX rings, so it can reach
 * nothing a frontend may not read anyway. 0, or -errno with why. */
static int srv_read_tx(struct srv_conn *c, const struct tcp_hdr *h,
                       const uint8_t *p, char *why, size_t wl) {
  struct tcp_export *ex = c->ex;
  const struct lynx_geom *g = &ex->g;
  uint32_t count = 0, alen = 8u * g->n_mqueues;
  uint64_t worst = alen;
  size_t base, at;
  uint8_t *reply;
  int rc;
  if (h->len >= TXR_HDR)
    count = get32(p);
  if (h->len < TXR_HDR || count > g->n_mqueues || get32(p + 4) ||
      h->len != TXR_HDR + (uint64_t)count * TXR_ENT) {
    snprintf(why, wl, "malformed compound read (%u bytes)", h->len);
    return -EPROTO;
  }
  for (uint32_t i = 0; i < count; i++) {
    const uint8_t *e = p + TXR_HDR + (size_t)i * TXR_ENT;
    if (get32(e) >= g->n_mqueues || get32(e + 8) > g->slots || get32(e + 12)) {
      snprintf(why, wl, "compound read of %u slots of mqueue %u: outside "
               "the region's TX rings", get32(e + 8), get32(e));
      return -EFAULT;
    }
    worst += 4 + (uint64_t)get32(e + 8) * g->slot_size;
  }
  if (worst > TCP_OP_MAX) {
    snprintf(why, wl, "compound read of up to %llu bytes, over %u",
             (unsigned long long)worst, TCP_OP_MAX);
    return -EMSGSIZE;
  }
  if (buf_reserve(&c->out, TCP_HDR + worst,
                  TCP_SRV_OUT_MAX + TCP_OP_MAX + 64)) {
    snprintf(why, wl, "reply buffer full");
    return -ENOBUFS;
  }
  base = c->out.len - c->out.head;
  reply = c->out.p + c->out.len;
  /* the array first, complete: every slot before a tx_prod it holds was
   * published before it, and the slot reads below come after */
  if (ex->mem) {
    rc = ex->mem->read(ex->mem->ctx, g->actrl_off, reply + TCP_HDR, alen);
  } else {
    const uint32_t *w = (const uint32_t *)(ex->base + g->actrl_off);
    for (uint32_t i = 0; i < alen / 4; i++) {
      uint32_t v = __atomic_load_n(&w[i], __ATOMIC_RELAXED);
      memcpy(reply + TCP_HDR + 4 * i, &v, 4);
    }
    rc = 0; /* srv_fill's acquire fence orders the slot reads after */
  }
  at = TCP_HDR + alen;
  for (uint32_t i = 0; !rc && i < count; i++) {
    const uint8_t *e = p + TXR_HDR + (size_t)i * TXR_ENT;
    uint32_t q = get32(e), from = get32(e + 4);
    uint32_t n = txr_count(g, reply + TCP_HDR, q, from, get32(e + 8));
    uint64_t ring = lynx_tx_ring_off(g, q);
    put32(reply + at, n);
    at += 4;
    for (uint32_t done = 0; !rc && done < n;) {
      uint32_t pos = (from + done) & (g->slots - 1);
      uint32_t k = g->slots - pos < n - done ? g->slots - pos : n - done;
      rc = srv_fill(c, ring + (uint64_t)pos * g->slot_size,
                    k * g->slot_size, base + at);
      at += (size_t)k * g->slot_size;
      done += k;
    }
  }
  if (rc) {
    snprintf(why, wl, "%s memory read failed: %s",
             ex->mem ? ex->mem->kind : "region", strerror(-rc));
    return rc;
  }
  hdr_put(reply, OP_READ_TX_RESP, 0, (uint32_t)(at - TCP_HDR), 0, h->wr_id);
  c->out.len += at;
  return 0;
}

/* Cuts a connection of an older frontend: FENCED after its last reply,
 * then closed (reading stops with it, so nothing more of it is applied). */
static void srv_cut(struct srv_conn *c, const char *why) {
  srv_reply(c, OP_FENCED, ESTALE, 0, why, (uint32_t)strlen(why));
  srv_flush(c);
  srv_close(c, NULL); /* the takeover is logged once, not per connection */
}

/* Fencing of a HELLO that presents producer for ex (docs/mqueue.md
 * "Fencing"). 0: admitted (c->producer set; on a takeover every
 * connection of ex with an older epoch is cut and the header word
 * written), or -ESTALE with the reason in why. */
static int srv_fence(struct srv_conn *c, struct tcp_export *ex,
                     uint64_t producer, char *why, size_t wl) {
  char note[160];
  uint64_t was = 0;
  unsigned n = 0;
  int rc = lynx_fence_admit(&ex->fence, producer, &was, why, wl);
  if (rc < 0)
    return rc;
  c->producer = producer;
  if (rc != LYNX_FENCE_TAKEOVER)
    return 0;
  if (lynx_fence_store(ex->base, ex->mem, producer))
    LYNX_LOG_RL(LYNX_LOG_WARN, "tcp", "region %s: cannot write its fence "
                "word", ex->fence.name);
  snprintf(note, sizeof(note), "fenced: frontend epoch %llu took this region "
           "over", (unsigned long long)producer);
  for (struct srv_conn *o = c->srv->conns; o; o = o->next)
    if (o != c && o->ex == ex && !o->closing && o->producer < producer) {
      srv_cut(o, note);
      n++;
    }
  lynx_fence_took_over(&ex->fence, was, producer, n);
  return 0;
}

/* Ends the HELLO exchange with HELLO_REPLY {err, why}: on err 0 the
 * connection is bound to ex (whose reference it takes over; else it is
 * dropped). 0 when bound. A refusal other than a fence counts as a wrong
 * credential; from a source backed off for those it is held back (-EAGAIN:
 * the answer waits in c->out, reading stops, the sweep sends it at
 * refuse_at_ns). */
static int srv_answer(struct srv_conn *c, struct tcp_export *ex, int err,
                      int fenced, const char *why) {
  if (err && ex) {
    export_put(ex);
    ex = NULL;
  }
  c->ex = ex;
  srv_reply(c, OP_HELLO_REPLY, (uint64_t)err, 0, why, (uint32_t)strlen(why));
  if (!err || fenced) { /* fenced: the right key, an old frontend */
    /* (a fenced one keeps no export: counted authenticated by authed,
     * not by c->ex, or its close would count it unauthenticated again
     * and the guard's count would wrap, refusing every connection) */
    lynx_guard_auth_ok(&c->srv->guard, c->src);
    c->authed = 1;
    if (fenced)
      LYNX_LOG_RL(LYNX_LOG_WARN, "tcp", "data connection from %s refused: "
                  "%s", c->peer, why);
    return -err;
  }
  {
    uint64_t now = lynx_now_ns();
    uint64_t hold = lynx_guard_auth_failed(&c->srv->guard, c->src, now);
    LYNX_LOG_RL(LYNX_LOG_WARN, "tcp", "data connection from %s refused: %s%s",
                c->peer, why, hold ? " (answer held back: this address keeps "
                "presenting wrong credentials)" : "");
    if (hold) {
      c->refuse_at_ns = now + hold;
      return -EAGAIN;
    }
  }
  return -err;
}

/* A HELLO: a region this agent serves is challenged (CHALLENGE {nonce};
 * 0, the PROOF comes next); anything else is refused (srv_answer). */
static int srv_hello(struct srv_conn *c, const struct tcp_hdr *h,
                     const uint8_t *p) {
  struct tcp_hello m;
  struct tcp_export *ex;
  char why[160] = "";
  memset(&m, 0, sizeof(m));
  memcpy(&m, p, h->len < sizeof(m) ? h->len : sizeof(m));
  /* the version first: a peer of another one hears that, not a length */
  if (le32toh(m.magic) != TCP_MAGIC || le16toh(m.version) != TCP_VERSION) {
    snprintf(why, sizeof(why), "bad magic 0x%08x or version %u (this agent "
             "speaks %u: the versions differ)", le32toh(m.magic),
             le16toh(m.version), TCP_VERSION);
    return srv_answer(c, NULL, EPROTO, 0, why);
  }
  if (h->len != sizeof(m)) {
    snprintf(why, sizeof(why), "hello of %u bytes, expected %zu", h->len,
             sizeof(m));
    return srv_answer(c, NULL, EPROTO, 0, why);
  }
  pthread_mutex_lock(&c->srv->lock);
  ex = export_get(c->srv, le64toh(m.id));
  pthread_mutex_unlock(&c->srv->lock);
  if (!ex)
    return srv_answer(c, NULL, ENOENT, 0, "no region with this id (the "
                      "agent restarted or the instance stopped: stale "
                      "descriptor)");
  if (getrandom(c->nonce, sizeof(c->nonce), 0) != (ssize_t)sizeof(c->nonce))
    return srv_answer(c, ex, EIO, 0, "no random bytes for a challenge");
  c->cand = ex;
  c->hello = m;
  srv_reply(c, OP_CHALLENGE, 0, 0, c->nonce, sizeof(c->nonce));
  return 0;
}

/* The PROOF of the key for the region the HELLO named: checked in constant
 * time, then the HELLO's epoch, size and producer; answered (srv_answer). */
static int srv_proof(struct srv_conn *c, const uint8_t *p) {
  struct tcp_export *ex = c->cand;
  const struct tcp_hello *m = &c->hello;
  uint8_t want[LYNX_TCP_PROOF];
  char why[160] = "";
  int err = 0, fenced = 0;
  c->cand = NULL;
  if (lynx__tcp_proof(ex->key, c->nonce, m, sizeof(*m), want) ||
      !lynx__ct_equal(want, p, sizeof(want))) {
    snprintf(why, sizeof(why), "wrong region key (its proof of the key "
             "does not verify)");
    err = EACCES;
  } else if (ex->epoch != le64toh(m->epoch)) {
    snprintf(why, sizeof(why), "epoch %llu, the region's is %llu",
             (unsigned long long)le64toh(m->epoch),
             (unsigned long long)ex->epoch);
    err = ESTALE;
  } else if (ex->size != le64toh(m->region_size)) {
    snprintf(why, sizeof(why), "region size %llu, the region's is %llu",
             (unsigned long long)le64toh(m->region_size),
             (unsigned long long)ex->size);
    err = EPROTO;
  } else {
    err = -srv_fence(c, ex, le64toh(m->producer), why, sizeof(why));
    fenced = err != 0;
  }
  return srv_answer(c, ex, err, fenced, why);
}

/* Applies one operation; a reason in why when the connection must close. */
static int srv_op(struct srv_conn *c, const struct tcp_hdr *h,
                  const uint8_t *p, int *wrote, char *why, size_t wl) {
  struct tcp_export *ex = c->ex;
  if (h->op == OP_WRITE) {
    int cls = lynx_region_class(&ex->g, h->off, h->len);
    if (cls != LYNX_MR_WRITE) {
      snprintf(why, wl, "write of %u bytes at %llu %s", h->len,
               (unsigned long long)h->off,
               cls < 0 ? "outside the region" : "outside fctrl and the RX rings");
      return -EFAULT;
    }
    if (h->flags & F_PUBLISH) {
      uint32_t last;
      if (h->len < 4 || ((h->off + h->len) & 3)) {
        snprintf(why, wl, "publishing write of %u bytes at %llu is not "
                 "word-aligned", h->len, (unsigned long long)h->off);
        return -EPROTO;
      }
      if (ex->mem && ex->mem->write_start) {
        /* the memory lands the last word after the rest */
        int rc = ex->mem->write_start(ex->mem->ctx, h->off, p, h->len,
                                      LYNX_WR_PUBLISH);
        c->batched = 1;
        if (rc) {
          snprintf(why, wl, "%s memory write failed: %s", ex->mem->kind,
                   strerror(-rc));
          return rc;
        }
      } else if (ex->mem) {
        /* ordered copies: the last word lands after the rest */
        int rc = ex->mem->write(ex->mem->ctx, h->off, p, h->len - 4);
        if (!rc)
          rc = ex->mem->write(ex->mem->ctx, h->off + h->len - 4,
                              p + h->len - 4, 4);
        if (rc) {
          snprintf(why, wl, "%s memory write failed: %s", ex->mem->kind,
                   strerror(-rc));
          return rc;
        }
      } else {
        memcpy(ex->base + h->off, p, h->len - 4);
        memcpy(&last, p + h->len - 4, 4);
        lynx_store_release32((uint32_t *)(ex->base + h->off + h->len - 4),
                             last);
      }
    } else if (ex->mem) {
      int rc;
      if (ex->mem->write_start) {
        rc = ex->mem->write_start(ex->mem->ctx, h->off, p, h->len, 0);
        c->batched = 1;
      } else {
        rc = ex->mem->write(ex->mem->ctx, h->off, p, h->len);
      }
      if (rc) {
        snprintf(why, wl, "%s memory write failed: %s", ex->mem->kind,
                 strerror(-rc));
        return rc;
      }
    } else {
      memcpy(ex->base + h->off, p, h->len);
    }
    *wrote = 1;
    return 0;
  }
  if (h->op == OP_READ) {
    if (lynx_bounds_ok(ex->size, h->off, h->len)) {
      snprintf(why, wl, "read of %u bytes at %llu outside the %llu-byte "
               "region", h->len, (unsigned long long)h->off,
               (unsigned long long)ex->size);
      return -EFAULT;
    }
    int rc = srv_reply(c, OP_READ_RESP, h->off, h->wr_id, NULL, h->len);
    if (rc) {
      snprintf(why, wl, rc == -ENOBUFS ? "reply buffer full"
                                       : "%s memory read failed: %s",
               ex->mem ? ex->mem->kind : "region", strerror(-rc));
      return rc;
    }
    return 0;
  }
  if (h->op == OP_READ_TX)
    return srv_read_tx(c, h, p, why, wl);
  snprintf(why, wl, "unknown operation %u", h->op);
  return -EPROTO;
}

static void srv_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b) {
  struct srv_conn *c = h->data;
  /* before HELLO only a HELLO may come: nothing bigger is buffered for a
   * peer that has not shown a key */
  size_t want = c->ex ? 65536 : TCP_HDR + sizeof(struct tcp_hello);
  (void)hint;
  if (buf_reserve(&c->in, want, c->ex ? TCP_OP_MAX + TCP_HDR + 65536
                                      : 2 * (TCP_HDR + sizeof(struct tcp_hello)))) {
    *b = uv_buf_init(NULL, 0); /* libuv reports UV_ENOBUFS */
    return;
  }
  *b = uv_buf_init((char *)c->in.p + c->in.len,
                   (unsigned)(c->in.cap - c->in.len));
}

static void srv_on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
  struct srv_conn *c = s->data;
  char why[192] = "";
  int wrote = 0;
  (void)b;
  if (n < 0) {
    srv_close(c, n == UV_EOF ? NULL : uv_strerror((int)n));
    return;
  }
  c->in.len += (size_t)n;
  while (!c->closing && c->in.len - c->in.head >= TCP_HDR) {
    struct tcp_hdr h;
    const uint8_t *p = c->in.p + c->in.head;
    uint64_t need;
    hdr_get(p, &h);
    if (h.zero || h.len > TCP_OP_MAX ||
        (h.op != OP_HELLO && h.op != OP_WRITE && h.op != OP_READ &&
         h.op != OP_READ_TX && h.op != OP_PROOF)) {
      snprintf(why, sizeof(why), "malformed frame (op %u, length %u)", h.op,
               h.len);
      break;
    }
    if (!c->ex && h.op != OP_HELLO && !(c->cand && h.op == OP_PROOF)) {
      snprintf(why, sizeof(why), "operation %u before hello", h.op);
      break;
    }
    if (h.op == OP_PROOF && c->ex) {
      snprintf(why, sizeof(why), "proof after the hello exchange");
      break;
    }
    if (h.op == OP_PROOF && h.len != LYNX_TCP_PROOF) {
      snprintf(why, sizeof(why), "proof of %u bytes, expected %u", h.len,
               LYNX_TCP_PROOF);
      break;
    }
    if (!c->ex && h.op == OP_HELLO &&
        (h.len < TCP_HELLO_MIN || h.len > sizeof(struct tcp_hello))) {
      /* refused on its header: a stranger's length is never buffered */
      snprintf(why, sizeof(why), "hello of %u bytes, expected %zu", h.len,
               sizeof(struct tcp_hello));
      break;
    }
    if ((c->ex || c->cand) && h.op == OP_HELLO) {
      snprintf(why, sizeof(why), "second hello");
      break;
    }
    need = TCP_HDR + (h.op == OP_READ ? 0 : (uint64_t)h.len);
    if (c->in.len - c->in.head < need) {
      /* make room for the whole frame, then wait for it */
      if (buf_reserve(&c->in, need - (c->in.len - c->in.head),
                      TCP_OP_MAX + TCP_HDR + 65536))
        snprintf(why, sizeof(why), "no memory for a %u-byte frame", h.len);
      break;
    }
    if (h.op == OP_HELLO || h.op == OP_PROOF) {
      int rc = h.op == OP_HELLO ? srv_hello(c, &h, p + TCP_HDR)
                                : srv_proof(c, p + TCP_HDR);
      if (rc == -EAGAIN) { /* the refusal waits; read nothing more */
        uv_read_stop((uv_stream_t *)&c->tcp);
        c->reading = 0;
        return;
      }
      if (rc) {
        srv_flush(c);
        srv_close(c, NULL); /* reason logged and sent */
        return;
      }
    } else if (srv_op(c, &h, p + TCP_HDR, &wrote, why, sizeof(why))) {
      break;
    }
    c->in.head += need;
  }
  /* the batch ends with what this read() brought; a connection closing
   * for a bad operation still lands the writes before it */
  {
    int rc = srv_batch_end(c);
    if (rc && !why[0])
      snprintf(why, sizeof(why), "%s memory copies failed: %s",
               c->ex->mem->kind, strerror(-rc));
  }
  if (why[0]) {
    srv_close(c, why);
    return;
  }
  if (c->in.head == c->in.len)
    c->in.head = c->in.len = 0;
  if (wrote && c->ex->base) /* device memory: its kernel polls */
    lynx_region_wake(c->ex->base);
  srv_flush(c);
}

static void srv_on_conn(uv_stream_t *l, int status) {
  struct tcp_agent *srv = l->data;
  struct srv_conn *c;
  struct sockaddr_storage ss;
  int len = sizeof(ss);
  if (status < 0)
    return;
  c = calloc(1, sizeof(*c));
  if (!c)
    return;
  uv_tcp_init(&srv->loop, &c->tcp);
  c->tcp.data = c;
  c->srv = srv;
  if (uv_accept(l, (uv_stream_t *)&c->tcp)) {
    uv_close((uv_handle_t *)&c->tcp, (uv_close_cb)free);
    return;
  }
  uv_tcp_nodelay(&c->tcp, 1);
  memset(&ss, 0, sizeof(ss));
  if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &len) == 0)
    lynx_fmt_addr((struct sockaddr *)&ss, c->peer, sizeof(c->peer));
  c->since_ns = lynx_now_ns();
  c->next = srv->conns;
  srv->conns = c;
  {
    enum lynx_guard_refusal r =
        lynx_guard_admit(&srv->guard, &ss, c->since_ns, &c->src);
    if (r != LYNX_GUARD_ADMIT) {
      LYNX_LOG_RL(LYNX_LOG_WARN, "tcp", "data connection from %s refused: "
                  "%s (caps: %u connections, %u not authenticated, %u of "
                  "those per address)", c->peer, lynx_guard_reason_names[r],
                  srv->guard.conn_max, srv->guard.unauth_max,
                  srv->guard.per_source);
      srv_close(c, NULL);
      return;
    }
    c->admitted = 1;
  }
  if (uv_read_start((uv_stream_t *)&c->tcp, srv_alloc, srv_on_read) == 0)
    c->reading = 1;
  else
    srv_close(c, "cannot read");
}

/* Closes connections of unlisted regions and silent ones. */
static void srv_sweep_conns(struct tcp_agent *srv) {
  uint64_t now = lynx_now_ns();
  for (struct srv_conn *c = srv->conns; c; c = c->next) {
    int gone;
    if (c->closing)
      continue;
    pthread_mutex_lock(&srv->lock);
    gone = c->ex && !c->ex->listed;
    pthread_mutex_unlock(&srv->lock);
    if (gone) {
      srv_close(c, NULL);
    } else if (c->refuse_at_ns) {
      if (now >= c->refuse_at_ns) { /* the held-back refusal goes now */
        srv_flush(c);
        srv_close(c, NULL);
      }
    } else if (!c->ex && now - c->since_ns > TCP_HELLO_MS * 1000000ull) {
      srv_close(c, "no hello");
    }
  }
}

static void srv_on_wake(uv_async_t *a) {
  struct tcp_agent *srv = a->data;
  int stop;
  srv_sweep_conns(srv);
  pthread_mutex_lock(&srv->lock); /* (see tcp_agent_destroy) */
  stop = srv->stop;
  pthread_mutex_unlock(&srv->lock);
  if (stop) {
    for (struct srv_conn *c = srv->conns; c; c = c->next)
      srv_close(c, NULL);
    uv_close((uv_handle_t *)&srv->listener, NULL);
    uv_close((uv_handle_t *)&srv->wake, NULL);
    uv_close((uv_handle_t *)&srv->sweep, NULL);
  }
}

static void srv_on_sweep(uv_timer_t *t) {
  srv_sweep_conns(t->data);
}

static void *srv_main(void *arg) {
  struct tcp_agent *srv = arg;
  prctl(PR_SET_NAME, "lynx-tcp-srv");
  uv_run(&srv->loop, UV_RUN_DEFAULT);
  return NULL;
}

static int tcp_agent_create(const struct lynx_transport_opts *o,
                            struct lynx_transport_agent **out, char *err,
                            size_t errlen) {
  struct sockaddr_storage ss;
  struct tcp_agent *srv;
  int len = sizeof(ss), rc;
  if (lynx_parse_hostport(o->listen, &ss)) {
    snprintf(err, errlen, "tcp transport: bad listen address '%s' "
             "(expected host:port)", o->listen);
    return -EINVAL;
  }
  srv = calloc(1, sizeof(*srv));
  if (!srv) {
    snprintf(err, errlen, "tcp transport: out of memory");
    return -ENOMEM;
  }
  srv->base.ops = &lynx_transport_tcp;
  srv->base.guard = &srv->guard;
  lynx_guard_init(&srv->guard, o->conn_max, o->unauth_max, o->per_source);
  pthread_mutex_init(&srv->lock, NULL);
  rc = uv_loop_init(&srv->loop);
  if (rc)
    goto fail_msg;
  uv_tcp_init(&srv->loop, &srv->listener);
  uv_async_init(&srv->loop, &srv->wake, srv_on_wake);
  uv_timer_init(&srv->loop, &srv->sweep);
  srv->listener.data = srv->wake.data = srv->sweep.data = srv;
  rc = uv_tcp_bind(&srv->listener, (struct sockaddr *)&ss, 0);
  if (!rc)
    rc = uv_listen((uv_stream_t *)&srv->listener, 256, srv_on_conn);
  if (!rc)
    rc = uv_tcp_getsockname(&srv->listener, (struct sockaddr *)&ss, &len);
  if (rc) {
    snprintf(err, errlen, "tcp transport: cannot listen on %s: %s", o->listen,
             uv_strerror(rc));
    goto fail_loop;
  }
  uv_timer_start(&srv->sweep, srv_on_sweep, 1000, 1000);
  lynx_fmt_addr((struct sockaddr *)&ss, srv->base.bound,
                sizeof(srv->base.bound));
  srv->stop = 0;
  rc = pthread_create(&srv->thread, NULL, srv_main, srv);
  if (rc) {
    snprintf(err, errlen, "tcp transport: cannot start its thread: %s",
             strerror(rc));
    rc = -rc;
    goto fail_loop;
  }
  srv->running = 1;
  *out = &srv->base;
  return 0;
fail_loop:
  uv_close((uv_handle_t *)&srv->listener, NULL);
  uv_close((uv_handle_t *)&srv->wake, NULL);
  uv_close((uv_handle_t *)&srv->sweep, NULL);
  uv_run(&srv->loop, UV_RUN_DEFAULT);
  uv_loop_close(&srv->loop);
  goto fail;
fail_msg:
  snprintf(err, errlen, "tcp transport: cannot listen on %s: %s", o->listen,
           uv_strerror(rc));
fail:
  pthread_mutex_destroy(&srv->lock);
  free(srv);
  return rc;
}

static void tcp_agent_destroy(struct lynx_transport_agent *a) {
  struct tcp_agent *srv;
  int kept;
  if (!a)
    return;
  srv = container_of(a, struct tcp_agent, base);
  if (srv->running) {
    /* stop is written under the lock that srv_on_wake reads it under.
     * A wake sent while another is pending (region_free's, just before)
     * is coalesced with it: uv_async_send sees the pending flag with a
     * plain load and returns, and the one callback that follows must see
     * stop. Unlocked, nothing ordered the store before that load (the CPU
     * may hold a store back past a later load), so the callback could run
     * and read stop as 0, the loop never stopped and the join below hung
     * (fuzz_tcp_agent's timeouts, about one in 100000 inputs). With the
     * lock, either the callback reads stop after this store, or it read
     * it before and then its clearing of the flag came before this send's
     * load, which finds no wake pending and sends one. */
    pthread_mutex_lock(&srv->lock);
    srv->stop = 1;
    pthread_mutex_unlock(&srv->lock);
    uv_async_send(&srv->wake);
    pthread_join(srv->thread, NULL);
    uv_run(&srv->loop, UV_RUN_NOWAIT);
    uv_loop_close(&srv->loop);
    srv->running = 0;
  }
  pthread_mutex_lock(&srv->lock);
  kept = srv->exports != NULL;
  pthread_mutex_unlock(&srv->lock);
  if (kept) { /* their region_free still takes the lock */
    LYNX_WARN("tcp", "agent: transport stopped with regions still exported: "
              "its handle stays for their region_free");
    return;
  }
  pthread_mutex_destroy(&srv->lock);
  free(srv);
}

static int tcp_region_alloc(struct lynx_transport_agent *a,
                            struct lynx_region *r, const char *name,
                            uint64_t size) {
  int rc = lynx_region_map_anon(r, a, size);
  snprintf(r->name, sizeof(r->name), "%s", name ? name : "");
  return rc;
}

static int tcp_region_attach(struct lynx_transport_agent *a,
                             struct lynx_region *r, const char *name,
                             uint64_t size, const struct lynx_region_mem *mem) {
  int rc = lynx_region_attach_served(r, a, size, mem);
  snprintf(r->name, sizeof(r->name), "%s", name ? name : "");
  return rc;
}

static int tcp_region_export(struct lynx_region *r) {
  struct tcp_agent *srv =
      r->agent ? container_of(r->agent, struct tcp_agent, base) : NULL;
  struct lynx_region_hdr h;
  struct tcp_export *ex;
  if (!srv || (!r->base && !r->mem) || r->priv ||
      lynx_region_read(r, 0, &h, sizeof(h)))
    return -EINVAL;
  ex = calloc(1, sizeof(*ex));
  if (!ex)
    return -ENOMEM;
  if (h.magic != LYNX_REGION_MAGIC ||
      lynx_geom_init(&ex->g, h.n_mqueues, h.slots, h.slot_size, h.large_bytes) ||
      ex->g.region_size > r->size) {
    free(ex);
    return -EINVAL;
  }
  if (getrandom(&ex->key, sizeof(ex->key), 0) != sizeof(ex->key)) {
    free(ex);
    return -EIO;
  }
  ex->id = lynx__tcp_region_id(ex->key);
  ex->srv = srv;
  ex->refs = 1;
  ex->listed = 1;
  ex->base = r->base;
  ex->mem = r->mem;
  ex->size = r->size;
  ex->epoch = h.epoch;
  snprintf(ex->fence.name, sizeof(ex->fence.name), "%s",
           r->name[0] ? r->name : r->locator);
  pthread_mutex_lock(&srv->lock);
  ex->next = srv->exports;
  srv->exports = ex;
  pthread_mutex_unlock(&srv->lock);
  r->key = ex->key;
  r->priv = ex;
  r->fence = &ex->fence;
  return 0;
}

static void tcp_region_free(struct lynx_region *r) {
  struct tcp_export *ex = r->priv;
  if (ex) {
    struct tcp_agent *srv = ex->srv;
    struct tcp_export **pp;
    pthread_mutex_lock(&srv->lock);
    ex->listed = 0;
    for (pp = &srv->exports; *pp && *pp != ex; pp = &(*pp)->next)
      ;
    if (*pp)
      *pp = ex->next;
    pthread_mutex_unlock(&srv->lock);
    if (srv->running)
      uv_async_send(&srv->wake); /* close its connections */
    export_put(ex);             /* memory goes with the last connection */
  } else if (r->mem) {
    r->mem->release(r->mem->ctx);
  } else if (r->base) {
    munmap(r->base, r->size);
  }
  r->base = NULL;
  r->mem = NULL;
  r->priv = NULL;
  r->fence = NULL;
}

/* ====================================================================
 * Frontend side (one worker thread per connection: no locks)
 * ==================================================================== */

struct pending_read {
  uint64_t wr_id;
  void *dst; /* READ_TX: of the control array */
  uint32_t len;
  int compound;            /* a READ_TX */
  int ntx;                 /* READ_TX: entries of tx */
  struct lynx_tx_read *tx; /* READ_TX: the caller's */
};

struct tcp_conn {
  struct lynx_tconn base;
  int fd;
  struct lynx_geom g;
  struct buf out; /* posted, not yet sent */
  struct buf in;  /* received, not yet parsed */
  struct pending_read *reads;
  uint32_t r_head, r_tail; /* FIFO of reads in flight, TCP_READS_MAX */
  int dead; /* 0, or the -errno every call returns from now on */
};

static int errno_dead(int e) {
  return (e == EPIPE || e == ECONNRESET || e == ENOTCONN || e == ETIMEDOUT ||
          e == EHOSTUNREACH || e == ENETUNREACH)
             ? -ECONNRESET
             : -e;
}

/* The connection failed with err: if the agent said FENCED before it
 * closed (a newer frontend took the region over), that is the error,
 * -ESTALE. Whatever the kernel still holds is read to find out; the
 * frames before it are replies nobody waits for any more. Sticky. */
static int tc_dead(struct tcp_conn *c, int err) {
  size_t at;
  if (c->dead)
    return c->dead;
  while (!buf_reserve(&c->in, 4096, TCP_OP_MAX + TCP_HDR + 65536)) {
    ssize_t k = recv(c->fd, c->in.p + c->in.len, c->in.cap - c->in.len,
                     MSG_DONTWAIT);
    if (k <= 0 && !(k < 0 && errno == EINTR))
      break;
    if (k > 0)
      c->in.len += (size_t)k;
  }
  for (at = c->in.head; c->in.len - at >= TCP_HDR;) {
    struct tcp_hdr h;
    hdr_get(c->in.p + at, &h);
    if (h.op == OP_FENCED) {
      char why[160];
      size_t n = c->in.len - at - TCP_HDR;
      n = n < h.len ? n : h.len;
      n = n < sizeof(why) - 1 ? n : sizeof(why) - 1;
      memcpy(why, c->in.p + at + TCP_HDR, n);
      why[n] = 0;
      LYNX_LOG_RL(LYNX_LOG_WARN, "tcp", "%s: agent cut this connection: %s",
                  c->base.desc.locator, why);
      err = -ESTALE;
      break;
    }
    /* a frame cut short is the last received: nothing follows it */
    if (h.len > TCP_OP_MAX || h.len > c->in.len - at - TCP_HDR)
      break;
    at += TCP_HDR + (size_t)h.len;
  }
  c->dead = err;
  return err;
}

/* Sends what is buffered, without blocking. */
static int tc_send(struct tcp_conn *c) {
  while (c->out.head < c->out.len) {
    ssize_t n = send(c->fd, c->out.p + c->out.head, c->out.len - c->out.head,
                     MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        return 0;
      if (errno == EINTR)
        continue;
      return tc_dead(c, errno_dead(errno));
    }
    c->out.head += (size_t)n;
  }
  c->out.head = c->out.len = 0;
  return 0;
}

/* Waits up to the deadline for fd to become ready for events. */
static int wait_fd(int fd, short events, uint64_t deadline_ns) {
  for (;;) {
    struct pollfd p = {fd, events, 0};
    uint64_t now = lynx_now_ns();
    int ms, rc;
    if (now >= deadline_ns)
      return -ETIMEDOUT;
    ms = (int)((deadline_ns - now) / 1000000u) + 1;
    rc = poll(&p, 1, ms);
    if (rc > 0)
      return 0;
    if (rc < 0 && errno != EINTR)
      return -errno;
  }
}

/* Sends or receives exactly n bytes before the deadline (connection set-up
 * only; the data path never blocks). */
static int xfer_all(int fd, uint8_t *p, size_t n, int sending,
                    uint64_t deadline) {
  while (n) {
    ssize_t k = sending ? send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL)
                        : recv(fd, p, n, MSG_DONTWAIT);
    if (k == 0 && !sending)
      return -ECONNRESET;
    if (k < 0) {
      int rc;
      if (errno == EINTR)
        continue;
      if (errno != EAGAIN)
        return errno_dead(errno);
      rc = wait_fd(fd, sending ? POLLOUT : POLLIN, deadline);
      if (rc)
        return rc;
      continue;
    }
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

static int send_all(int fd, const uint8_t *p, size_t n, uint64_t deadline) {
  return xfer_all(fd, (uint8_t *)p, n, 1, deadline);
}

static int recv_all(int fd, uint8_t *p, size_t n, uint64_t deadline) {
  return xfer_all(fd, p, n, 0, deadline);
}

/* Sends n bytes of frame and reads the header of the answer into h. */
static int tc_ask(int fd, const uint8_t *frame, size_t n, struct tcp_hdr *h,
                  uint64_t deadline) {
  uint8_t hdr[TCP_HDR];
  int rc = send_all(fd, frame, n, deadline);
  if (!rc)
    rc = recv_all(fd, hdr, TCP_HDR, deadline);
  if (!rc)
    hdr_get(hdr, h);
  return rc;
}

/* HELLO, the agent's CHALLENGE and our PROOF of the key (which itself
 * never crosses the wire), its reply, then a read of the region header
 * checked against the descriptor. */
static int tc_handshake(struct tcp_conn *c, const struct lynx_region_desc *d,
                        uint64_t deadline) {
  uint8_t frame[TCP_HDR + sizeof(struct tcp_hello)];
  uint8_t hdr[TCP_HDR];
  uint8_t regionhdr[sizeof(struct lynx_region_hdr)];
  char why[257], err[256];
  struct tcp_hello m = {htole32(TCP_MAGIC), htole16(TCP_VERSION), 0,
                        htole64(lynx__tcp_region_id(d->key)),
                        htole64(d->epoch), htole64(d->region_size),
                        htole64(d->producer)};
  struct tcp_hdr h;
  int rc;
  hdr_put(frame, OP_HELLO, 0, sizeof(m), 0, 0);
  memcpy(frame + TCP_HDR, &m, sizeof(m));
  rc = tc_ask(c->fd, frame, sizeof(frame), &h, deadline);
  if (rc)
    return rc;
  if (h.op == OP_CHALLENGE && h.len == LYNX_TCP_NONCE) {
    uint8_t nonce[LYNX_TCP_NONCE], proof[TCP_HDR + LYNX_TCP_PROOF];
    rc = recv_all(c->fd, nonce, sizeof(nonce), deadline);
    if (rc)
      return rc;
    hdr_put(proof, OP_PROOF, 0, LYNX_TCP_PROOF, 0, 0);
    if (lynx__tcp_proof(d->key, nonce, &m, sizeof(m), proof + TCP_HDR))
      return -EIO;
    rc = tc_ask(c->fd, proof, sizeof(proof), &h, deadline);
    if (rc)
      return rc;
  }
  if (h.op != OP_HELLO_REPLY || h.len >= sizeof(why)) {
    LYNX_WARN("tcp", "%s: not a lynx tcp agent (reply op %u)", d->locator,
              h.op);
    return -EPROTO;
  }
  rc = recv_all(c->fd, (uint8_t *)why, h.len, deadline);
  if (rc)
    return rc;
  why[h.len] = 0;
  if (h.off) {
    LYNX_WARN("tcp", "%s: agent refused the connection: %s", d->locator, why);
    return h.off == ENOENT || h.off == ESTALE ? -ESTALE : -EPROTO;
  }
  hdr_put(hdr, OP_READ, 0, sizeof(regionhdr), 0, 0);
  rc = send_all(c->fd, hdr, TCP_HDR, deadline);
  if (!rc)
    rc = recv_all(c->fd, hdr, TCP_HDR, deadline);
  if (rc)
    return rc;
  hdr_get(hdr, &h);
  if (h.op != OP_READ_RESP || h.len != sizeof(regionhdr))
    return -EPROTO;
  rc = recv_all(c->fd, regionhdr, sizeof(regionhdr), deadline);
  if (rc)
    return rc;
  rc = lynx_region_validate(regionhdr, d->region_size, d, err, sizeof(err));
  if (rc)
    LYNX_WARN("tcp", "%s: refused: %s", d->locator, err);
  return rc;
}

static void tcp_close(struct lynx_tconn *tc) {
  struct tcp_conn *c = container_of(tc, struct tcp_conn, base);
  if (c->fd >= 0)
    close(c->fd);
  buf_free(&c->out);
  buf_free(&c->in);
  free(c->reads);
  free(c);
}

static int tcp_connect(const struct lynx_region_desc *d,
                       struct lynx_tconn **out) {
  struct sockaddr_storage ss;
  struct tcp_conn *c;
  uint64_t deadline = lynx_now_ns() + TCP_CONNECT_MS * 1000000ull;
  int one = 1, sz = 4 << 20, rc;
  if (lynx_parse_hostport(d->locator, &ss))
    return -EINVAL;
  c = calloc(1, sizeof(*c));
  if (!c)
    return -ENOMEM;
  c->base.ops = &lynx_transport_tcp;
  c->base.desc = *d;
  c->fd = -1;
  c->reads = calloc(TCP_READS_MAX, sizeof(*c->reads));
  if (!c->reads ||
      lynx_geom_init(&c->g, d->n_mqueues, d->slots, d->slot_size, d->large_bytes)) {
    rc = c->reads ? -EINVAL : -ENOMEM;
    goto fail;
  }
  c->fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (c->fd < 0) {
    rc = -errno;
    goto fail;
  }
  setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(c->fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
  setsockopt(c->fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
  if (connect(c->fd, (struct sockaddr *)&ss,
              ss.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                       : sizeof(struct sockaddr_in)) != 0) {
    int e = 0;
    socklen_t el = sizeof(e);
    if (errno != EINPROGRESS) {
      rc = -errno;
      goto fail;
    }
    rc = wait_fd(c->fd, POLLOUT, deadline);
    if (rc)
      goto fail;
    getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &e, &el);
    if (e) {
      rc = -e;
      goto fail;
    }
  }
  rc = tc_handshake(c, d, deadline);
  if (rc)
    goto fail;
  *out = &c->base;
  return 0;
fail:
  tcp_close(&c->base);
  return rc;
}

static int tcp_writev(struct lynx_tconn *tc, uint64_t off,
                      const struct iovec *iov, int iovcnt, unsigned flags) {
  struct tcp_conn *c = container_of(tc, struct tcp_conn, base);
  uint64_t total = 0;
  uint8_t *p;
  int rc = lynx_writev_check(&c->g, off, iov, iovcnt, flags, &total);
  if (rc)
    return rc;
  if (c->dead)
    return c->dead;
  if (total > TCP_OP_MAX)
    return -EMSGSIZE;
  rc = buf_reserve(&c->out, TCP_HDR + total, TCP_OUT_MAX);
  if (rc)
    return rc;
  p = c->out.p + c->out.len;
  hdr_put(p, OP_WRITE, (flags & LYNX_WR_PUBLISH) ? F_PUBLISH : 0,
          (uint32_t)total, off, 0);
  p += TCP_HDR;
  for (int i = 0; i < iovcnt; i++) {
    memcpy(p, iov[i].iov_base, iov[i].iov_len);
    p += iov[i].iov_len;
  }
  c->out.len += TCP_HDR + total;
  return 0;
}

static int tcp_read(struct lynx_tconn *tc, uint64_t off, void *dst, size_t len,
                    uint64_t wr_id) {
  struct tcp_conn *c = container_of(tc, struct tcp_conn, base);
  struct pending_read *r;
  int rc;
  if (lynx_bounds_ok(c->g.region_size, off, len))
    return -EFAULT;
  if (len > TCP_OP_MAX)
    return -EMSGSIZE;
  if (c->dead)
    return c->dead;
  if (c->r_tail - c->r_head >= TCP_READS_MAX)
    return -ENOBUFS;
  rc = buf_reserve(&c->out, TCP_HDR, TCP_OUT_MAX);
  if (rc)
    return rc;
  hdr_put(c->out.p + c->out.len, OP_READ, 0, (uint32_t)len, off, wr_id);
  c->out.len += TCP_HDR;
  r = &c->reads[c->r_tail++ % TCP_READS_MAX];
  r->wr_id = wr_id;
  r->dst = dst;
  r->len = (uint32_t)len;
  r->compound = 0;
  return 0;
}

static int tcp_read_tx(struct lynx_tconn *tc, void *actrl,
                       struct lynx_tx_read *tx, int n, uint64_t wr_id) {
  struct tcp_conn *c = container_of(tc, struct tcp_conn, base);
  const struct lynx_geom *g = &c->g;
  uint64_t worst = 8ull * g->n_mqueues;
  uint32_t len = TXR_HDR + (uint32_t)n * TXR_ENT;
  struct pending_read *r;
  uint8_t *p;
  int rc;
  if (n < 0 || (uint32_t)n > g->n_mqueues || (n && !tx))
    return -EINVAL;
  for (int i = 0; i < n; i++) {
    if (tx[i].q >= g->n_mqueues || tx[i].max > g->slots)
      return -EFAULT;
    worst += 4 + (uint64_t)tx[i].max * g->slot_size;
  }
  if (worst > TCP_OP_MAX)
    return -EMSGSIZE;
  if (c->dead)
    return c->dead;
  if (c->r_tail - c->r_head >= TCP_READS_MAX)
    return -ENOBUFS;
  rc = buf_reserve(&c->out, TCP_HDR + len, TCP_OUT_MAX);
  if (rc)
    return rc;
  p = c->out.p + c->out.len;
  hdr_put(p, OP_READ_TX, 0, len, 0, wr_id);
  p += TCP_HDR;
  put32(p, (uint32_t)n);
  put32(p + 4, 0);
  for (int i = 0; i < n; i++) {
    uint8_t *e = p + TXR_HDR + (size_t)i * TXR_ENT;
    put32(e, tx[i].q);
    put32(e + 4, tx[i].from);
    put32(e + 8, tx[i].max);
    put32(e + 12, 0);
    tx[i].got = 0;
  }
  c->out.len += TCP_HDR + len;
  r = &c->reads[c->r_tail++ % TCP_READS_MAX];
  r->wr_id = wr_id;
  r->dst = actrl;
  r->len = 8u * g->n_mqueues;
  r->compound = 1;
  r->ntx = n;
  r->tx = tx;
  return 0;
}

/* Unpacks a READ_TX answer of len bytes at p into r's buffers. Every count
 * must be the one the control array in the same answer gives (txr_count),
 * so a confused or hostile agent can neither overrun a buffer nor make up
 * slots. 0 or -EPROTO. */
static int tc_take_tx(struct tcp_conn *c, struct pending_read *r,
                      const uint8_t *p, uint32_t len) {
  uint32_t z = c->g.slot_size, at = r->len;
  if (len < r->len)
    return -EPROTO;
  for (int i = 0; i < r->ntx; i++) {
    struct lynx_tx_read *t = &r->tx[i];
    uint32_t n;
    if (len - at < 4)
      return -EPROTO;
    n = get32(p + at);
    at += 4;
    if (n != txr_count(&c->g, p, t->q, t->from, t->max) ||
        (uint64_t)n * z > len - at)
      return -EPROTO;
    memcpy(t->dst, p + at, (size_t)n * z);
    t->got = n;
    at += n * z;
  }
  if (at != len)
    return -EPROTO;
  memcpy(r->dst, p, r->len);
  return 0;
}

static int tcp_flush(struct lynx_tconn *tc) {
  struct tcp_conn *c = container_of(tc, struct tcp_conn, base);
  return c->dead ? c->dead : tc_send(c);
}

static int tcp_poll(struct lynx_tconn *tc, uint64_t *ids, int max) {
  struct tcp_conn *c = container_of(tc, struct tcp_conn, base);
  int n = 0, rc;
  if (c->dead)
    return c->dead;
  if (c->out.len > c->out.head) { /* finish what the kernel did not take */
    rc = tc_send(c);
    if (rc)
      return rc;
  }
  if (c->r_head == c->r_tail)
    return 0; /* nothing expected; a close shows up at the next send */
  for (int rounds = 0; rounds < 8 && n < max; rounds++) {
    /* parse what is here */
    while (n < max && c->in.len - c->in.head >= TCP_HDR &&
           c->r_head != c->r_tail) {
      struct pending_read *r = &c->reads[c->r_head % TCP_READS_MAX];
      struct tcp_hdr h;
      hdr_get(c->in.p + c->in.head, &h);
      if (h.op == OP_FENCED)
        return tc_dead(c, -ECONNRESET);
      if (h.wr_id != r->wr_id ||
          (r->compound ? h.op != OP_READ_TX_RESP || h.len > TCP_OP_MAX
                 : h.op != OP_READ_RESP || h.len != r->len)) {
        LYNX_LOG_RL(LYNX_LOG_WARN, "tcp", "%s: reply out of step (op %u, "
                    "%u bytes, expected a %u-byte read)",
                    c->base.desc.locator, h.op, h.len, r->len);
        return -EPROTO;
      }
      if (c->in.len - c->in.head < TCP_HDR + (size_t)h.len) {
        rc = buf_reserve(&c->in, TCP_HDR + h.len - (c->in.len - c->in.head),
                         TCP_OP_MAX + TCP_HDR + 65536);
        if (rc)
          return rc;
        break;
      }
      if (!r->compound) {
        memcpy(r->dst, c->in.p + c->in.head + TCP_HDR, h.len);
      } else if (tc_take_tx(c, r, c->in.p + c->in.head + TCP_HDR, h.len)) {
        LYNX_LOG_RL(LYNX_LOG_WARN, "tcp", "%s: compound reply of %u bytes "
                    "does not match its request", c->base.desc.locator,
                    h.len);
        return -EPROTO;
      }
      c->in.head += TCP_HDR + h.len;
      ids[n++] = r->wr_id;
      c->r_head++;
    }
    if (n == max || c->r_head == c->r_tail)
      break;
    /* receive more */
    rc = buf_reserve(&c->in, 65536, TCP_OP_MAX + TCP_HDR + 65536);
    if (rc)
      return rc;
    ssize_t k = recv(c->fd, c->in.p + c->in.len, c->in.cap - c->in.len,
                     MSG_DONTWAIT);
    if (k == 0)
      return tc_dead(c, -ECONNRESET);
    if (k < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        break;
      if (errno == EINTR)
        continue;
      return tc_dead(c, errno_dead(errno));
    }
    c->in.len += (size_t)k;
  }
  if (c->in.head == c->in.len)
    c->in.head = c->in.len = 0;
  return n;
}

static int tcp_wait_fd(struct lynx_tconn *tc) {
  return container_of(tc, struct tcp_conn, base)->fd;
}

/* The agent wakes a sleeping accelerator after every batch of writes. */
static int tcp_notify(struct lynx_tconn *tc) {
  (void)tc;
  return 0;
}

/* The agent's accelerators cannot reach this frontend's bell: the
 * socket (wait_fd) wakes a sleeping worker. */
#define tcp_arm lynx__arm_none

const struct lynx_transport_ops lynx_transport_tcp =
    LYNX_TRANSPORT_OPS("tcp", tcp);
