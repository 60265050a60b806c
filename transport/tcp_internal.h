/*
 * tcp_internal.h - internals of the "tcp" transport shared by its files.
 * Not a public header: what is not a type or a wire constant is lynx__
 * (the design: transport_tcp.c).
 *
 * The files form layers, each calling only those below it:
 *  - transport_tcp.c: the ops table, which hands itself to each side when
 *    that side creates a handle or a connection;
 *  - tcp_agent.c: the agent-side handle (listener, thread, exported
 *    regions), over tcp_agent_conn.c: one data connection served (the
 *    handshake, fencing, operations, replies);
 *  - tcp_frontend.c: a frontend's connection to a region;
 *  - tcp_wire.c (the READ_TX rule both sides apply and the buffers frames
 *    are built in and parsed from; the frame codec is inline below), tcp_auth.c
 * (the proof of the key) and transport.c.
 */
#ifndef LYNX_TCP_INTERNAL_H
#define LYNX_TCP_INTERNAL_H

#include <endian.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <uv.h>

#include "bell.h"
#include "connguard.h"
#include "mqueue.h"
#include "tcp_wire.h"
#include "transport.h"

/* ---- wire format (tcp_wire.c) ---------------------------------------- */

#define TCP_OP_MAX (4u << 20) /* largest write or read, bytes */

/* READ_TX's payload: {u32 count, u32 0}, then count entries {u32 q, u32
 * from, u32 max, u32 0}. Its answer: the control array (8 bytes per
 * mqueue, as in the region), then per entry {u32 n} and n slots. */
#define TXR_HDR 8u
#define TXR_ENT 16u

/* SUBSCRIBE's payload: {u32 count, u32 0}, then count entries {u32 q, u32
 * from, u32 rx_cons, u32 flags (LYNX_SUB_*)} (TXR_HDR, TXR_ENT); answered by
 * one SUBSCRIBE_RESP in reply order. PUSH's (sent between replies, never in
 * their place): {u32 count, u32 0}, then count entries {u32 q, u32
 * rx_cons, u32 from, u32 n}, each followed by n records {u32 llen, u32
 * loff, the slot's bytes, llen bytes of the large message it names, to
 * go at loff of the large area (llen 0: not pushed; the frontend reads
 * it)}. Entries of one mqueue follow on: from is where the last ended. */
#define PUSH_ENT 16u
#define PUSH_REC 8u

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

/* A frame header into p[0, TCP_HDR), little-endian (inline: every frame
 * of the data path is built and read with these). */
static inline void lynx__tcp_hdr_put(uint8_t *p, uint8_t op, uint8_t flags,
                                     uint32_t len, uint64_t off,
                                     uint64_t wr_id) {
  uint32_t l = htole32(len);
  uint64_t o = htole64(off), w = htole64(wr_id);
  p[0] = op;
  p[1] = flags;
  p[2] = p[3] = 0;
  memcpy(p + 4, &l, 4);
  memcpy(p + 8, &o, 8);
  memcpy(p + 16, &w, 8);
}

/* The frame header at p[0, TCP_HDR). */
static inline void lynx__tcp_hdr_get(const uint8_t *p, struct tcp_hdr *h) {
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

/* The little-endian u32 at p; and v stored there. */
static inline uint32_t lynx__tcp_get32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return le32toh(v);
}

static inline void lynx__tcp_put32(uint8_t *p, uint32_t v) {
  v = htole32(v);
  memcpy(p, &v, 4);
}

/* READ_TX: the slots its answer carries of mqueue q from position from
 * (at most max), from the control array actrl it carries too. */
uint32_t lynx__tcp_txr_count(const struct lynx_geom *g, const uint8_t *actrl,
                             uint32_t q, uint32_t from, uint32_t max);

/* A growable byte buffer: [head, len) holds unconsumed bytes. */
struct tcp_buf {
  uint8_t *p;
  size_t head, len, cap;
};

/* Room for more bytes after len, compacting first; never beyond max.
 * 0, -ENOBUFS (max) or -ENOMEM. */
int lynx__tcp_buf_reserve(struct tcp_buf *b, size_t more, size_t max);
void lynx__tcp_buf_free(struct tcp_buf *b);

/* ---- agent side (tcp_agent.c over tcp_agent_conn.c) ------------------ */

struct tcp_agent;
struct srv_conn; /* tcp_agent_conn.c's */

/* Watching a region that does not ring (pushing): the agent's thread
 * spins while answers are owed there (for at most TCP_OWED_NS without
 * any coming) or one was pushed within TCP_SPIN_NS; otherwise it looks
 * every TCP_TICK_MS. */
#define TCP_SPIN_NS (200u * 1000u)
#define TCP_OWED_NS (1000ull * 1000u * 1000u)
/* A ringing accelerator's answer is spun for only when it is expected
 * within this (a sleep and a wake-up cost about as much), and for at most
 * TCP_SPIN_WAITS expected answers' time. */
#define TCP_SPIN_PAYS_NS (20u * 1000u)
#define TCP_SPIN_WAITS 4u
#define TCP_TICK_MS 1u

struct tcp_export {
  struct tcp_agent *srv; /* the handle it is exported through */
  int refs;              /* the region's owner + every connection */
  int listed;            /* findable by key */
  uint8_t *base;         /* host memory, or NULL: mem */
  const struct lynx_region_mem *mem;
  uint64_t size;
  uint64_t key, id, epoch; /* id: lynx__tcp_region_id(key), on the wire */
  struct lynx_geom g;
  struct lynx_fence fence; /* serving thread only; metrics read it */
  /* base is a shared-memory file (lynx_region.shm): frontends that map it
   * fence through the header word, which the serving thread follows
   * (tcp_agent_conn.c srv_fence_sync) */
  int shared;
  struct tcp_export *next;
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
   * orders it with the wake (lynx__tcp_agent_destroy) */
  int stop;
  struct srv_conn *conns;
  struct lynx_guard guard; /* the data port's caps and counters */
  /* Pushed answers (tcp_agent_conn.c, "Pushing"). The thread's bell
   * (fd -1: none), named in fctrl.waiter of every subscribed mqueue of a
   * region whose CPU accelerator rings (LYNX_HDR_RESP_BELL) while the
   * thread sleeps: prepare arms it and pushes what is published, check
   * withdraws it; a ringing accelerator's answer is spun for only where
   * it comes within TCP_SPIN_PAYS_NS (answer_ns). Regions that do not
   * ring (a GPU's) are watched: spin (the idle handle) while answers are
   * owed or were pushed within TCP_SPIN_NS, else the tick's timer. */
  struct lynx_bell bell;
  uv_poll_t bell_poll;
  uv_prepare_t prep;
  uv_check_t check;
  uv_idle_t spin;
  uv_timer_t tick;
  int spinning, ticking;
  uint64_t active_ns; /* the last request or push on a watched region */
  /* how long a ringing accelerator takes to answer, from the request's
   * arrival to its push (an EWMA, weight 1/8): the thread spins for an
   * answer only where that is shorter than a wake-up would cost */
  uint64_t answer_ns;
};

/* tcp_agent_conn.c, on the handle's thread unless said otherwise. */

/* Drops a reference to ex (any thread); its memory goes with the last. */
void lynx__tcp_export_put(struct tcp_export *ex);
/* The listener's connection callback: accepts, admits through the guard,
 * starts reading. */
void lynx__tcp_srv_on_conn(uv_stream_t *l, int status);
/* Closes connections of unlisted regions and silent ones, and sends the
 * refusals held back whose time has come. */
void lynx__tcp_srv_sweep(struct tcp_agent *srv);
/* Closes every connection (the handle stops). */
void lynx__tcp_srv_close_all(struct tcp_agent *srv);
/* Pushing (tcp_agent_conn.c): names the thread's bell in (on) or takes it
 * out of (!on) fctrl.waiter of every subscribed mqueue whose accelerator
 * rings; pushes what is published on every subscribed mqueue. */
void lynx__tcp_srv_arm(struct tcp_agent *srv, int on);
/* force_rx: a move of rx_cons alone is pushed too (the tick); otherwise
 * only on mqueues subscribed LYNX_SUB_RX_EAGER. */
void lynx__tcp_srv_push_all(struct tcp_agent *srv, int force_rx);
/* What subscriptions need now: 2 a spin (a watched region, subscribed
 * and not ringing, owes answers or pushed one within TCP_SPIN_NS; a
 * ringing one owes an answer expected within TCP_SPIN_PAYS_NS), 1 the
 * tick (a watched region otherwise, or an rx_cons not pushed yet), 0
 * nothing. */
int lynx__tcp_srv_watch(struct tcp_agent *srv, uint64_t now_ns);

/* tcp_agent.c: the ops table's agent members; agent_start is
 * agent_create for a handle of table ops. */
int lynx__tcp_agent_start(const struct lynx_transport_ops *ops,
                          const struct lynx_transport_opts *o,
                          struct lynx_transport_agent **out, char *err,
                          size_t errlen);
void lynx__tcp_agent_destroy(struct lynx_transport_agent *a);
int lynx__tcp_region_alloc(struct lynx_transport_agent *a,
                           struct lynx_region *r, const char *name,
                           uint64_t size);
int lynx__tcp_region_attach(struct lynx_transport_agent *a,
                            struct lynx_region *r, const char *name,
                            uint64_t size, const struct lynx_region_mem *mem);
int lynx__tcp_region_export(struct lynx_region *r);
void lynx__tcp_region_free(struct lynx_region *r);

/* ---- frontend side (tcp_frontend.c) ----------------------------------- */

/* The ops table's frontend members; conn_open is connect for a
 * connection of table ops. */
int lynx__tcp_conn_open(const struct lynx_transport_ops *ops,
                        const struct lynx_region_desc *d,
                        struct lynx_tconn **out);
int lynx__tcp_writev(struct lynx_tconn *tc, uint64_t off,
                     const struct iovec *iov, int iovcnt, unsigned flags);
int lynx__tcp_read(struct lynx_tconn *tc, uint64_t off, void *dst, size_t len,
                   uint64_t wr_id);
int lynx__tcp_read_tx(struct lynx_tconn *tc, void *actrl,
                      struct lynx_tx_read *tx, int n, uint64_t wr_id);
int lynx__tcp_subscribe(struct lynx_tconn *tc, struct lynx_push *p,
                        uint64_t wr_id);
int lynx__tcp_flush(struct lynx_tconn *tc);
int lynx__tcp_poll(struct lynx_tconn *tc, uint64_t *ids, int max);
int lynx__tcp_wait_fd(struct lynx_tconn *tc);
int lynx__tcp_notify(struct lynx_tconn *tc);
void lynx__tcp_close(struct lynx_tconn *tc);

#endif
