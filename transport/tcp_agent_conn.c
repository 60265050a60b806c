/*
 * tcp_agent_conn.c - the agent side of one tcp data connection, on its
 * handle's thread (tcp_agent.c): accepted and admitted by the data port's
 * guard, the handshake (HELLO, CHALLENGE, PROOF, HELLO_REPLY; a held-back
 * refusal for a source that keeps presenting wrong credentials), fencing
 * by frontend epoch (a takeover cuts the older connections with FENCED),
 * then every operation a read() brings applied in stream order and the
 * replies queued and written (transport_tcp.c has the design).
 *
 * Pushing (version 5): a connection may SUBSCRIBE mqueues; from then on
 * every TX slot published there is sent to it in PUSH frames, unasked,
 * batched (one frame carries every mqueue's new slots, up to TCP_OP_MAX),
 * with the control words the frontend needs (rx_cons) and, from host
 * memory, the large message a slot names. A pushed slot is not consumed:
 * the frontend still writes its tx_cons back. What tells the thread
 * something was published: for a region whose CPU accelerator rings
 * response bells, the thread's own bell, named in fctrl.waiter while the
 * thread sleeps (armed before it looks, a full fence between, as a
 * frontend worker's arm: common/bell.h); for others (a GPU's: host-mapped,
 * or device memory with a host copy of its control words), the words are
 * watched, spinning while answers are owed (requests published since the
 * last push) and shortly after, else every TCP_TICK_MS. Device memory
 * without such a copy is not pushed from: SUBSCRIBE is refused (ENOTSUP)
 * and the frontend polls with READ_TX.
 *
 * A connection holds a reference to the export it is bound to
 * (lynx__tcp_export_put drops one); the sweep closes those whose region
 * was unlisted by region_free, and those that said no hello in time.
 */
#include <endian.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <uv.h>

#include "connguard.h"
#include "log.h"
#include "mqueue.h"
#include "tcp_auth.h"
#include "tcp_internal.h"
#include "transport.h"
#include "util.h"

#define TCP_HELLO_MIN 32u /* version 2's HELLO: magic and version in it */
#define TCP_SRV_OUT_MAX (16u << 20) /* queued replies before reading stops */
#define TCP_HELLO_MS 5000           /* a connection must say hello */

struct srv_conn {
  uv_tcp_t tcp;
  struct tcp_agent *srv;
  struct tcp_export *ex; /* NULL until the PROOF passes */
  /* after a HELLO that named a region: the region (referenced), the
   * HELLO and the nonce its PROOF must answer */
  struct tcp_export *cand;
  struct tcp_hello hello;
  uint8_t nonce[LYNX_TCP_NONCE];
  uint64_t producer; /* its frontend epoch, admitted by ex->fence */
  struct tcp_buf in;
  struct tcp_buf out; /* replies not yet handed to the kernel */
  uv_write_t wreq;
  uint8_t *wbuf; /* bytes of the write in flight */
  int writing, reading, closing;
  int admitted;               /* counted by srv->guard */
  int authed;                 /* proved the key (admitted, or fenced): the guard
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
    size_t at;         /* the reply's bytes, from out.head */
    const void *bytes; /* the memory's staged copy */
    uint32_t len;
  } * pend;
  size_t npend, pend_cap;
  int batched; /* batch ops made since the last flush */
  /* its subscription (pushing): one entry per mqueue, sub_of[q] its
   * index + 1 (0: not subscribed); rings: the region's accelerator rings
   * the thread's bell; held: a push waits for the replies queued to be
   * written */
  struct srv_sub {
    uint32_t q, next; /* pushed up to next */
    uint32_t rx_cons; /* the last the frontend was sent */
    uint32_t owed;    /* requests published since (watched regions) */
    uint32_t flags;   /* LYNX_SUB_* */
  } * subs;
  uint32_t nsubs, *sub_of;
  int rings, held;
  uint64_t owed_ns; /* since when the oldest answer owed is (0: none) */
  struct srv_conn *next;
};

void lynx__tcp_export_put(struct tcp_export *ex) {
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
    lynx__tcp_export_put(c->ex);
  }
  if (c->cand)
    lynx__tcp_export_put(c->cand);
  if (c->admitted)
    lynx_guard_closed(&srv->guard, c->src, c->authed);
  free(c->subs);
  free(c->sub_of);
  lynx__tcp_buf_free(&c->in);
  lynx__tcp_buf_free(&c->out);
  free(c->wbuf);
  free(c->pend);
  free(c);
}

static void srv_arm(struct srv_conn *c, int on);

static void srv_close(struct srv_conn *c, const char *why) {
  if (c->closing)
    return;
  srv_arm(c, 0);
  c->closing = 1;
  if (why)
    LYNX_LOG_RL(LYNX_LOG_WARN, "tcp", "data connection from %s closed: %s",
                c->peer, why);
  uv_close((uv_handle_t *)&c->tcp, srv_on_closed);
}

static void srv_flush(struct srv_conn *c);
static int srv_push(struct srv_conn *c, int force_rx);
static void srv_answered(struct srv_conn *c);
static void srv_push_now(struct srv_conn *c, int force_rx);
static void srv_fence_sync(struct tcp_agent *srv, struct tcp_export *ex);

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
  if (c->held && !c->writing) /* the backlog is written: push again */
    srv_push_now(c, 0);
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
static int srv_fill(struct srv_conn *c, uint64_t off, uint32_t len, size_t at) {
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
  if (lynx__tcp_buf_reserve(&c->out, TCP_HDR + len,
                            TCP_SRV_OUT_MAX + TCP_OP_MAX + 64))
    return -ENOBUFS;
  lynx__tcp_hdr_put(c->out.p + c->out.len, op, 0, len, off, wr_id);
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

/* The {u32 count, u32 0, count entries of TXR_ENT} payload of READ_TX and
 * SUBSCRIBE: 0 with *count when it is one of at most max entries, -1. */
static int txr_entries(const struct tcp_hdr *h, const uint8_t *p, uint32_t max,
                       uint32_t *count) {
  *count = h->len >= TXR_HDR ? lynx__tcp_get32(p) : 0;
  if (h->len < TXR_HDR || *count > max || lynx__tcp_get32(p + 4) ||
      h->len != TXR_HDR + (uint64_t)*count * TXR_ENT)
    return -1;
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
  const uint32_t *w;
  uint64_t worst = alen;
  size_t base, at;
  uint8_t *reply;
  int rc;
  if (txr_entries(h, p, g->n_mqueues, &count)) {
    snprintf(why, wl, "malformed compound read (%u bytes)", h->len);
    return -EPROTO;
  }
  for (uint32_t i = 0; i < count; i++) {
    const uint8_t *e = p + TXR_HDR + (size_t)i * TXR_ENT;
    if (lynx__tcp_get32(e) >= g->n_mqueues ||
        lynx__tcp_get32(e + 8) > g->slots || lynx__tcp_get32(e + 12)) {
      snprintf(why, wl,
               "compound read of %u slots of mqueue %u: outside "
               "the region's TX rings",
               lynx__tcp_get32(e + 8), lynx__tcp_get32(e));
      return -EFAULT;
    }
    worst += 4 + (uint64_t)lynx__tcp_get32(e + 8) * g->slot_size;
  }
  if (worst > TCP_OP_MAX) {
    snprintf(why, wl, "compound read of up to %llu bytes, over %u",
             (unsigned long long)worst, TCP_OP_MAX);
    return -EMSGSIZE;
  }
  if (lynx__tcp_buf_reserve(&c->out, TCP_HDR + worst,
                            TCP_SRV_OUT_MAX + TCP_OP_MAX + 64)) {
    snprintf(why, wl, "reply buffer full");
    return -ENOBUFS;
  }
  base = c->out.len - c->out.head;
  reply = c->out.p + c->out.len;
  /* the array first, complete: every slot before a tx_prod it holds was
   * published before it, and the slot reads below come after */
  /* host memory, or the accelerator's own copy of the array in host
   * memory (a region in GPU memory whose kernel keeps one): word by word;
   * else a copy out of the device memory */
  w = ex->mem ? ex->mem->ctrl_mirror
              : (const uint32_t *)(ex->base + g->actrl_off);
  if (w) {
    for (uint32_t i = 0; i < alen / 4; i++) {
      uint32_t v = __atomic_load_n(&w[i], __ATOMIC_RELAXED);
      memcpy(reply + TCP_HDR + 4 * i, &v, 4);
    }
    /* the slot reads below come after (from host memory; or started on the
     * device memory's copy stream, waited for with the batch's) */
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    rc = 0;
  } else {
    rc = ex->mem->read(ex->mem->ctx, g->actrl_off, reply + TCP_HDR, alen);
  }
  at = TCP_HDR + alen;
  for (uint32_t i = 0; !rc && i < count; i++) {
    const uint8_t *e = p + TXR_HDR + (size_t)i * TXR_ENT;
    uint32_t q = lynx__tcp_get32(e), from = lynx__tcp_get32(e + 4);
    uint32_t n = lynx__tcp_txr_count(g, reply + TCP_HDR, q, from,
                                     lynx__tcp_get32(e + 8));
    uint64_t ring = lynx_tx_ring_off(g, q);
    lynx__tcp_put32(reply + at, n);
    at += 4;
    for (uint32_t done = 0; !rc && done < n;) {
      uint32_t pos = (from + done) & (g->slots - 1);
      uint32_t k = g->slots - pos < n - done ? g->slots - pos : n - done;
      rc = srv_fill(c, ring + (uint64_t)pos * g->slot_size, k * g->slot_size,
                    base + at);
      at += (size_t)k * g->slot_size;
      done += k;
    }
  }
  if (rc) {
    snprintf(why, wl, "%s memory read failed: %s",
             ex->mem ? ex->mem->kind : "region", strerror(-rc));
    return rc;
  }
  lynx__tcp_hdr_put(reply, OP_READ_TX_RESP, 0, (uint32_t)(at - TCP_HDR), 0,
                    h->wr_id);
  c->out.len += at;
  return 0;
}

/* ---- pushing --------------------------------------------------------- */

/* Queued replies beyond which a push waits for them to be written. */
#define PUSH_HIGH (TCP_SRV_OUT_MAX / 2)
/* A PUSH frame's payload, at most (one record alone may be longer, up to
 * TCP_OP_MAX): the frontend applies a frame once all of it is in, so a
 * frame of a whole ring of 64 KiB slots would hold back its first answer
 * until the last arrived */
#define PUSH_FRAME_MAX (256u * 1024u)
#define OUT_LIMIT (TCP_SRV_OUT_MAX + TCP_OP_MAX + 64)

/* The control words pushes are made from: the region's (host memory), or
 * the accelerator's own copy of them in host memory; NULL: none. */
static const uint32_t *ex_ctrl_words(const struct tcp_export *ex) {
  if (ex->base)
    return (const uint32_t *)(ex->base + ex->g.actrl_off);
  return ex->mem ? ex->mem->ctrl_mirror : NULL;
}

/* The large message the published TX slot at slot (host memory) names,
 * where its metadata and reference are sound: *off and *len, else *len 0
 * (the frontend's forwarder judges the slot as it would a read one). */
static void large_of(const struct lynx_geom *g, const uint8_t *slot,
                     uint32_t *off, uint32_t *len) {
  struct lynx_slot_meta m;
  struct lynx_large_ref ref;
  *len = 0;
  if (lynx_slot_large(slot, g->slot_size, g->large_bytes, &m, &ref)) {
    *off = ref.off;
    *len = ref.len;
  }
}

/* Ends the PUSH frame whose header is at fat (from out.head): count
 * entries, and its length. */
static void push_close(struct srv_conn *c, size_t fat, uint32_t count) {
  uint8_t *f = c->out.p + c->out.head + fat;
  lynx__tcp_hdr_put(f, OP_PUSH, 0,
                    (uint32_t)(c->out.len - c->out.head - fat - TCP_HDR), 0, 0);
  lynx__tcp_put32(f + TCP_HDR, count);
  lynx__tcp_put32(f + TCP_HDR + 4, 0);
}

/* Appends one record of the slot at ring position pos of mqueue q to the
 * open frame (payload used bytes so far): unless it would make the frame
 * longer than PUSH_FRAME_MAX and first says the frame has other records
 * (a large message that fits no frame, TCP_OP_MAX, goes without its
 * bytes: the frontend reads it). 1 appended, 0 the frame is full, or
 * -errno. */
static int push_record(struct srv_conn *c, uint32_t q, uint32_t pos,
                       size_t used, int first) {
  struct tcp_export *ex = c->ex;
  const struct lynx_geom *g = &ex->g;
  uint32_t z = g->slot_size, loff = 0, llen = 0;
  uint64_t soff = lynx_tx_ring_off(g, q) + (uint64_t)pos * z;
  size_t at;
  uint8_t *rec;
  if (ex->base)
    large_of(g, ex->base + soff, &loff, &llen);
  if (used + PUSH_REC + z + llen > PUSH_FRAME_MAX) {
    if (!first)
      return 0;
    if (used + PUSH_REC + z + llen > TCP_OP_MAX)
      llen = 0;
  }
  if (lynx__tcp_buf_reserve(&c->out, PUSH_REC + z + llen, OUT_LIMIT))
    return -ENOBUFS;
  at = c->out.len - c->out.head;
  rec = c->out.p + c->out.len;
  lynx__tcp_put32(rec, llen);
  lynx__tcp_put32(rec + 4, loff);
  if (ex->base) {
    memcpy(rec + PUSH_REC, ex->base + soff, z);
    if (llen)
      memcpy(rec + PUSH_REC + z, ex->base + lynx_tx_large_off(g, q) + loff,
             llen);
  } else {
    /* device memory: staged with the batch, filled at its end */
    int rc = srv_fill(c, soff, z, at + PUSH_REC);
    if (rc)
      return rc;
  }
  c->out.len += PUSH_REC + z + llen;
  return 1;
}

/*
 * Queues what was published on c's subscribed mqueues since the last push:
 * for each whose tx_prod moved, an entry of its new slots with its rx_cons,
 * in frames of at most PUSH_FRAME_MAX; where only rx_cons moved, an entry
 * without slots if force_rx or the mqueue is LYNX_SUB_RX_EAGER (a server
 * mqueue's accelerator releases a request after publishing its answer:
 * pushing that alone would cost the frontend a wake-up per request for
 * nothing; it comes with the next answer, or the tick's push). The control word
 * is loaded (acquire) before the slots it announces. Stops, held, once
 * PUSH_HIGH bytes wait to be written (the rest goes when they are). Device
 * memory's slots are staged in the open batch: the caller ends it
 * (srv_batch_end), then flushes. 0 or -errno (the connection must close).
 */
static int srv_push(struct srv_conn *c, int force_rx) {
  struct tcp_export *ex = c->ex;
  const struct lynx_geom *g;
  const uint32_t *w;
  size_t fat = 0; /* the open frame's header, from out.head */
  uint32_t count = 0;
  int open = 0, rc = 0;
  if (!ex || !c->nsubs || c->closing)
    return 0;
  c->held = 0;
  g = &ex->g;
  w = ex_ctrl_words(ex);
  for (uint32_t i = 0; i < c->nsubs && !rc && !c->held; i++) {
    struct srv_sub *s = &c->subs[i];
    uint32_t tx = __atomic_load_n(&w[2 * s->q], __ATOMIC_ACQUIRE);
    uint32_t rxc = __atomic_load_n(&w[2 * s->q + 1], __ATOMIC_RELAXED);
    uint32_t avail = tx - s->next;
    if (avail > g->slots) {
      LYNX_LOG_RL(LYNX_LOG_WARN, "tcp",
                  "region %s mqueue %u: tx_prod %u more than a ring ahead "
                  "of %u: not pushed",
                  ex->fence.name, s->q, tx, s->next);
      avail = 0;
    }
    if (!avail &&
        (rxc == s->rx_cons || !(force_rx || (s->flags & LYNX_SUB_RX_EAGER))))
      continue;
    for (;;) { /* an entry per frame this mqueue's slots take */
      uint32_t n = 0;
      size_t eat;
      uint8_t *e;
      if (!open) {
        if (lynx__tcp_buf_reserve(&c->out, TCP_HDR + TXR_HDR, OUT_LIMIT)) {
          rc = -ENOBUFS;
          break;
        }
        fat = c->out.len - c->out.head;
        c->out.len += TCP_HDR + TXR_HDR;
        count = 0;
        open = 1;
      }
      if (lynx__tcp_buf_reserve(&c->out, PUSH_ENT, OUT_LIMIT)) {
        rc = -ENOBUFS;
        break;
      }
      eat = c->out.len - c->out.head;
      c->out.len += PUSH_ENT;
      while (n < avail) {
        int k = push_record(c, s->q, (s->next + n) & (g->slots - 1),
                            c->out.len - c->out.head - fat - TCP_HDR,
                            count == 0 && n == 0);
        if (k < 0)
          rc = k;
        if (k <= 0)
          break;
        n++;
      }
      e = c->out.p + c->out.head + eat;
      lynx__tcp_put32(e, s->q);
      lynx__tcp_put32(e + 4, rxc);
      lynx__tcp_put32(e + 8, s->next);
      lynx__tcp_put32(e + 12, n);
      count++;
      s->next += n;
      s->rx_cons = rxc;
      s->owed = s->owed > n ? s->owed - n : 0;
      avail -= n;
      if (n)
        srv_answered(c);
      if (rc || !avail)
        break;
      /* the frame is full: the rest in the next */
      push_close(c, fat, count);
      open = 0;
      if (c->out.len - c->out.head >= PUSH_HIGH) {
        c->held = 1;
        break;
      }
    }
  }
  if (open)
    push_close(c, fat, count);
  if (!rc && c->out.len - c->out.head >= PUSH_HIGH)
    c->held = 1;
  return rc;
}

/* Answers were pushed on c: the time they took feeds the estimate a
 * ringing accelerator's answers are spun for by; the next owed counts
 * from now. */
static void srv_answered(struct srv_conn *c) {
  struct tcp_agent *srv = c->srv;
  uint64_t now = lynx_now_ns();
  int owed = 0;
  if (!c->rings) {
    srv->active_ns = now;
    return;
  }
  if (c->owed_ns) {
    uint64_t took = now - c->owed_ns;
    if (took > TCP_OWED_NS)
      took = TCP_OWED_NS;
    srv->answer_ns = srv->answer_ns - (srv->answer_ns >> 3) + (took >> 3);
  }
  for (uint32_t i = 0; i < c->nsubs && !owed; i++)
    owed = c->subs[i].owed != 0;
  c->owed_ns = owed ? now : 0;
}

/* Pushes outside a read()'s batch (the bell, the loop's prepare, a
 * backlog written): ends the batch and writes; while the kernel takes
 * all, a held push goes on. */
static void srv_push_now(struct srv_conn *c, int force_rx) {
  if (c->ex && !c->closing)
    srv_fence_sync(c->srv, c->ex); /* never to a fenced one: cuts c */
  for (int round = 0; round < 8 && !c->closing; round++) {
    int rc = srv_push(c, force_rx), rb = srv_batch_end(c);
    if (rc || rb) {
      char why[96];
      snprintf(why, sizeof(why), "cannot push answers: %s",
               rc == -ENOBUFS ? "reply buffer full"
                              : strerror(-(rc ? rc : rb)));
      srv_close(c, why);
      return;
    }
    srv_flush(c);
    if (!c->held || c->writing)
      return;
  }
}

/* c has no subscription (any half-built one freed). */
static void subs_drop(struct srv_conn *c) {
  free(c->subs);
  free(c->sub_of);
  c->subs = NULL;
  c->sub_of = NULL;
  c->nsubs = 0;
}

/* A subscription: the mqueues named, from the positions named. Answered
 * (SUBSCRIBE_RESP, in reply order) with 0 and pushed at once from the
 * positions on, or refused with ENOTSUP when the region's memory offers
 * no control words to watch (the frontend polls). 0, or -errno with why
 * (a malformed one closes the connection). */
static int srv_subscribe(struct srv_conn *c, const struct tcp_hdr *h,
                         const uint8_t *p, char *why, size_t wl) {
  struct tcp_export *ex = c->ex;
  const struct lynx_geom *g = &ex->g;
  uint32_t count;
  char note[160] = "";
  int err = 0, rc;
  if (txr_entries(h, p, g->n_mqueues, &count) || count == 0) {
    snprintf(why, wl, "malformed subscription (%u bytes)", h->len);
    return -EPROTO;
  }
  if (c->nsubs) {
    snprintf(why, wl, "second subscription");
    return -EPROTO;
  }
  c->sub_of = calloc(g->n_mqueues, sizeof(*c->sub_of));
  c->subs = calloc(count, sizeof(*c->subs));
  if (!c->sub_of || !c->subs) {
    snprintf(why, wl, "out of memory for a subscription");
    rc = -ENOMEM;
    goto drop;
  }
  for (uint32_t i = 0; i < count; i++) {
    const uint8_t *e = p + TXR_HDR + (size_t)i * TXR_ENT;
    uint32_t q = lynx__tcp_get32(e);
    if (q >= g->n_mqueues || c->sub_of[q] ||
        (lynx__tcp_get32(e + 12) & ~LYNX_SUB_RX_EAGER)) {
      snprintf(why, wl,
               "subscription of mqueue %u: outside the region or "
               "named twice",
               q);
      rc = -EFAULT;
      goto drop;
    }
    c->sub_of[q] = i + 1;
    c->subs[i] =
        (struct srv_sub){q, lynx__tcp_get32(e + 4), lynx__tcp_get32(e + 8), 0,
                         lynx__tcp_get32(e + 12)};
  }
  if (!ex_ctrl_words(ex)) {
    err = ENOTSUP;
    snprintf(note, sizeof(note),
             "answers are not pushed from %s memory without a host copy "
             "of its control words: poll",
             ex->mem->kind);
    subs_drop(c);
  } else {
    const struct lynx_region_hdr *hdr = (const void *)ex->base;
    c->nsubs = count;
    c->rings =
        hdr && c->srv->bell.fd >= 0 &&
        (__atomic_load_n(&hdr->flags, __ATOMIC_RELAXED) & LYNX_HDR_RESP_BELL);
    if (!c->rings)
      c->srv->active_ns = lynx_now_ns();
  }
  rc = srv_reply(c, OP_SUBSCRIBE_RESP, (uint64_t)err, h->wr_id, note,
                 (uint32_t)strlen(note));
  if (!rc && !err)
    rc = srv_push(c, 1);
  if (rc)
    snprintf(why, wl, "cannot answer a subscription: %s",
             rc == -ENOBUFS ? "reply buffer full" : strerror(-rc));
  return rc;
drop:
  subs_drop(c);
  return rc;
}

/* A request published at off: one more answer owed on its mqueue, if
 * subscribed (the thread spins for it: lynx__tcp_srv_watch). */
static void srv_owe(struct srv_conn *c, uint64_t off) {
  const struct lynx_geom *g = &c->ex->g;
  uint64_t rel, q;
  if (off < g->rings_off)
    return;
  rel = off - g->rings_off;
  q = rel / g->ring_bytes;
  if (q < g->n_mqueues && rel % g->ring_bytes < g->slots_bytes &&
      c->sub_of[q]) {
    uint64_t now = lynx_now_ns();
    c->subs[c->sub_of[q] - 1].owed++;
    if (!c->owed_ns)
      c->owed_ns = now;
    if (!c->rings)
      c->srv->active_ns = now;
  }
}

/* Names the thread's bell in (on) or withdraws it from (only where it is
 * still ours) fctrl.waiter of c's subscribed mqueues, where they ring. */
static void srv_arm(struct srv_conn *c, int on) {
  struct lynx_fctrl *f;
  uint32_t id = c->srv->bell.id;
  if (!c->rings || !c->nsubs || c->closing || !c->ex)
    return;
  f = (struct lynx_fctrl *)(c->ex->base + c->ex->g.fctrl_off);
  for (uint32_t i = 0; i < c->nsubs; i++) {
    uint32_t *wt = &f[c->subs[i].q].waiter;
    if (on) {
      __atomic_store_n(wt, id, __ATOMIC_RELAXED);
    } else {
      uint32_t mine = id;
      __atomic_compare_exchange_n(wt, &mine, 0, 0, __ATOMIC_RELAXED,
                                  __ATOMIC_RELAXED);
    }
  }
}

void lynx__tcp_srv_arm(struct tcp_agent *srv, int on) {
  for (struct srv_conn *c = srv->conns; c; c = c->next) {
    if (on && c->ex && !c->closing)
      srv_fence_sync(srv, c->ex); /* never a fenced one's bell */
    srv_arm(c, on);
  }
  /* Dekker with the accelerator (common/bell.h): our waiter stores, a
   * full fence, then the loads of its indices (the push after this) */
  if (on)
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

void lynx__tcp_srv_push_all(struct tcp_agent *srv, int force_rx) {
  for (struct srv_conn *c = srv->conns; c; c = c->next)
    if (c->nsubs && !c->closing)
      srv_push_now(c, force_rx);
}

/* Whether an rx_cons of c's subscription moved and was not pushed. */
static int rx_unsent(const struct srv_conn *c) {
  const uint32_t *w = ex_ctrl_words(c->ex);
  for (uint32_t i = 0; i < c->nsubs; i++)
    if (__atomic_load_n(&w[2 * c->subs[i].q + 1], __ATOMIC_RELAXED) !=
        c->subs[i].rx_cons)
      return 1;
  return 0;
}

int lynx__tcp_srv_watch(struct tcp_agent *srv, uint64_t now_ns) {
  uint64_t quiet = now_ns - srv->active_ns;
  int watched = 0, tick = 0;
  /* a ringing accelerator's answer is spun for where it comes sooner
   * than a wake-up (then the bell ends the sleep): at saturation answers
   * queue, take long, and the thread sleeps between the bells instead of
   * taking a core from the accelerators */
  uint64_t est = srv->answer_ns,
           ring_spin = est < TCP_SPIN_PAYS_NS ? TCP_SPIN_WAITS * est : 0;
  for (struct srv_conn *c = srv->conns; c; c = c->next) {
    /* where it does not ring, an answer owed is spun for a second at most
     * (one owed longer will not come: an application that drops requests
     * unanswered; the tick looks on) */
    uint64_t spin = c->rings ? ring_spin : TCP_OWED_NS;
    uint64_t since = c->rings ? now_ns - c->owed_ns : quiet;
    if (!c->nsubs || c->closing)
      continue;
    for (uint32_t i = 0; i < c->nsubs && since < spin; i++)
      if (c->subs[i].owed)
        return 2;
    watched |= !c->rings;
    tick |= c->rings && rx_unsent(c);
  }
  if (watched)
    return quiet < TCP_SPIN_NS ? 2 : 1;
  return tick;
}

/* Cuts a connection of an older frontend: FENCED after its last reply,
 * then closed (reading stops with it, so nothing more of it is applied). */
static void srv_cut(struct srv_conn *c, const char *why) {
  srv_reply(c, OP_FENCED, ESTALE, 0, why, (uint32_t)strlen(why));
  srv_flush(c);
  srv_close(c, NULL); /* the takeover is logged once, not per connection */
}

/* Cuts every connection of ex but keep whose epoch is older than
 * producer; how many it cut. */
static unsigned srv_cut_older(struct tcp_agent *srv, struct tcp_export *ex,
                              const struct srv_conn *keep, uint64_t producer) {
  char note[160];
  unsigned n = 0;
  snprintf(note, sizeof(note),
           "fenced: frontend epoch %llu took this region "
           "over",
           (unsigned long long)producer);
  for (struct srv_conn *o = srv->conns; o; o = o->next)
    if (o != keep && o->ex == ex && !o->closing && o->producer < producer) {
      srv_cut(o, note);
      n++;
    }
  return n;
}

/* The header word of a shared region: frontends that map the file fence
 * through it themselves (transport_shm.c's CAS-max). */
static uint64_t *ex_fence_word(const struct tcp_export *ex) {
  return (uint64_t *)(ex->base + LYNX_OFF_FENCE);
}

/* A shared region's takeover by a frontend that maps it: a newer epoch in
 * the header word than this thread admitted. Adopted as a HELLO's
 * takeover is: every connection of an older epoch cut (FENCED), so none
 * of them writes, reads or is pushed to after the shm frontend's connect
 * but for the batch being applied (the window transport_shm.c leaves its
 * own frontends). Called before each batch of a connection, each push and
 * arm, and each admission: one load where nothing changed. */
static void srv_fence_sync(struct tcp_agent *srv, struct tcp_export *ex) {
  uint64_t w, was;
  if (!ex->shared)
    return;
  w = __atomic_load_n(ex_fence_word(ex), __ATOMIC_ACQUIRE);
  was = __atomic_load_n(&ex->fence.epoch, __ATOMIC_RELAXED);
  if (w <= was)
    return;
  __atomic_store_n(&ex->fence.epoch, w, __ATOMIC_RELAXED);
  __atomic_store_n(&ex->fence.producers, 0, __ATOMIC_RELAXED);
  lynx_fence_took_over(&ex->fence, was, w, srv_cut_older(srv, ex, NULL, w));
}

/* Fencing of a HELLO that presents producer for ex (docs/mqueue.md
 * "Fencing"). 0: admitted (c->producer set; on a takeover every
 * connection of ex with an older epoch is cut and the header word
 * written: CAS-maxed where frontends map the region too), or -ESTALE
 * with the reason in why. */
static int srv_fence(struct srv_conn *c, struct tcp_export *ex,
                     uint64_t producer, char *why, size_t wl) {
  uint64_t was = 0, now = 0;
  int rc;
  srv_fence_sync(c->srv, ex); /* a local frontend's takeover first */
  rc = lynx_fence_admit(&ex->fence, producer, &was, why, wl);
  if (rc < 0)
    return rc;
  c->producer = producer;
  if (rc != LYNX_FENCE_TAKEOVER)
    return 0;
  if (ex->shared && lynx_fence_cas(ex_fence_word(ex), producer, &now)) {
    /* a frontend that maps the file took it over in between: refused,
     * and the newer epoch adopted */
    c->producer = 0;
    lynx_fence_why(why, wl, producer, now);
    __atomic_fetch_add(&ex->fence.refused, 1, __ATOMIC_RELAXED);
    srv_fence_sync(c->srv, ex);
    return -ESTALE;
  }
  if (!ex->shared && lynx_fence_store(ex->base, ex->mem, producer))
    LYNX_LOG_RL(LYNX_LOG_WARN, "tcp",
                "region %s: cannot write its fence "
                "word",
                ex->fence.name);
  lynx_fence_took_over(&ex->fence, was, producer,
                       srv_cut_older(c->srv, ex, c, producer));
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
    lynx__tcp_export_put(ex);
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
      LYNX_LOG_RL(LYNX_LOG_WARN, "tcp",
                  "data connection from %s refused: "
                  "%s",
                  c->peer, why);
    return -err;
  }
  {
    uint64_t now = lynx_now_ns();
    uint64_t hold = lynx_guard_auth_failed(&c->srv->guard, c->src, now);
    LYNX_LOG_RL(LYNX_LOG_WARN, "tcp", "data connection from %s refused: %s%s",
                c->peer, why,
                hold ? " (answer held back: this address keeps "
                       "presenting wrong credentials)"
                     : "");
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
    snprintf(why, sizeof(why),
             "bad magic 0x%08x or version %u (this agent "
             "speaks %u: the versions differ)",
             le32toh(m.magic), le16toh(m.version), TCP_VERSION);
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
    return srv_answer(c, NULL, ENOENT, 0,
                      "no region with this id (the "
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
    snprintf(why, sizeof(why),
             "wrong region key (its proof of the key "
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
static int srv_op(struct srv_conn *c, const struct tcp_hdr *h, const uint8_t *p,
                  int *wrote, char *why, size_t wl) {
  struct tcp_export *ex = c->ex;
  if (h->op == OP_WRITE) {
    int cls = lynx_region_class(&ex->g, h->off, h->len);
    if (cls != LYNX_MR_WRITE) {
      snprintf(why, wl, "write of %u bytes at %llu %s", h->len,
               (unsigned long long)h->off,
               cls < 0 ? "outside the region"
                       : "outside fctrl and the RX rings");
      return -EFAULT;
    }
    if (h->flags & F_PUBLISH) {
      uint32_t last;
      if (h->len < 4 || ((h->off + h->len) & 3)) {
        snprintf(why, wl,
                 "publishing write of %u bytes at %llu is not "
                 "word-aligned",
                 h->len, (unsigned long long)h->off);
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
          rc = ex->mem->write(ex->mem->ctx, h->off + h->len - 4, p + h->len - 4,
                              4);
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
    if (c->nsubs && (h->flags & F_PUBLISH))
      srv_owe(c, h->off);
    return 0;
  }
  if (h->op == OP_READ) {
    if (lynx_bounds_ok(ex->size, h->off, h->len)) {
      snprintf(why, wl,
               "read of %u bytes at %llu outside the %llu-byte "
               "region",
               h->len, (unsigned long long)h->off,
               (unsigned long long)ex->size);
      return -EFAULT;
    }
    int rc = srv_reply(c, OP_READ_RESP, h->off, h->wr_id, NULL, h->len);
    if (rc) {
      snprintf(why, wl,
               rc == -ENOBUFS ? "reply buffer full"
                              : "%s memory read failed: %s",
               ex->mem ? ex->mem->kind : "region", strerror(-rc));
      return rc;
    }
    return 0;
  }
  if (h->op == OP_READ_TX)
    return srv_read_tx(c, h, p, why, wl);
  if (h->op == OP_SUBSCRIBE)
    return srv_subscribe(c, h, p, why, wl);
  snprintf(why, wl, "unknown operation %u", h->op);
  return -EPROTO;
}

static void srv_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b) {
  struct srv_conn *c = h->data;
  /* before HELLO only a HELLO may come: nothing bigger is buffered for a
   * peer that has not shown a key */
  size_t want = c->ex ? 65536 : TCP_HDR + sizeof(struct tcp_hello);
  (void)hint;
  if (lynx__tcp_buf_reserve(&c->in, want,
                            c->ex ? TCP_OP_MAX + TCP_HDR + 65536
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
  if (c->ex) {
    srv_fence_sync(c->srv, c->ex); /* cuts c if a local frontend took over */
    if (c->closing)
      return;
  }
  while (!c->closing && c->in.len - c->in.head >= TCP_HDR) {
    struct tcp_hdr h;
    const uint8_t *p = c->in.p + c->in.head;
    uint64_t need;
    lynx__tcp_hdr_get(p, &h);
    if (h.zero || h.len > TCP_OP_MAX ||
        (h.op != OP_HELLO && h.op != OP_WRITE && h.op != OP_READ &&
         h.op != OP_READ_TX && h.op != OP_PROOF && h.op != OP_SUBSCRIBE)) {
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
      if (lynx__tcp_buf_reserve(&c->in, need - (c->in.len - c->in.head),
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

void lynx__tcp_srv_on_conn(uv_stream_t *l, int status) {
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
      LYNX_LOG_RL(LYNX_LOG_WARN, "tcp",
                  "data connection from %s refused: "
                  "%s (caps: %u connections, %u not authenticated, %u of "
                  "those per address)",
                  c->peer, lynx_guard_reason_names[r], srv->guard.conn_max,
                  srv->guard.unauth_max, srv->guard.per_source);
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
void lynx__tcp_srv_sweep(struct tcp_agent *srv) {
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

void lynx__tcp_srv_close_all(struct tcp_agent *srv) {
  for (struct srv_conn *c = srv->conns; c; c = c->next)
    srv_close(c, NULL);
}
