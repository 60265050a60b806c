/*
 * rmq.h - the Remote Message Queue Manager (Lynx paper §4.2): a worker's
 * connections to its accelerators and the mqueues in their memory.
 *
 * Owns: the connection set (struct fe_rmq), each connection's state machine
 * (read the control array, then the new TX slots), the one-sided writes of
 * RX slots and TX consumer indices, the doorbells, and reconnecting with
 * backoff. It reaches the remote rings only through the transport ops
 * table; it does not know what a request is or where an answer goes, nor
 * what a worker is. It is made (fe_rmq_init) with its options (which
 * mqueues are its worker's, the service's back ends, the tag table and
 * backoff jitter it shares) and its hooks, with an opaque context they
 * get back: what it finds (a response slot) or loses (requests on a
 * connection that went down) it hands up through them, so it calls no
 * other frontend file (see the call graph in frontend.h) and a test makes
 * one alone (tests/unit/test_rmq.c).
 *
 * Thread: everything here runs on its worker's thread, except
 * fe_rmq_foreach_mq, which other threads call (under the set's lock).
 */
#ifndef LYNX_FE_RMQ_H
#define LYNX_FE_RMQ_H

#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>

#include "dispatch.h"
#include "beframe.h"
#include "mqueue.h"
#include "tagtab.h"
#include "transport.h"
#include "util.h"
#include "wire.h"

struct fe_backend;

/* Drop reasons counted per mqueue. */
enum fe_qdrop {
  FE_QDROP_STALE_TAG,    /* response carried a tag not outstanding here */
  FE_QDROP_TX_OVERSIZE,  /* response metadata breaks the bounds rule */
  FE_QDROP_TX_SEQ,       /* TX index moved but slot not published */
  FE_QDROP_BAD_INDEX,    /* accelerator index out of range */
  FE_QDROP_APP,          /* the application dropped the request */
  FE_QDROP_EXPIRED,      /* no response within the request timeout */
  FE_QDROP_LOST,         /* its node was declared down: never runs later */
  FE_QDROP_WRITE_ERR,    /* transport refused the request write */
  FE_QDROP_SEND_ERR,     /* the response could not be sent to the client */
  FE_QDROP_CLIENT_GONE,  /* TCP: the client closed before its answer came */
  FE_QDROP_BACKEND_DOWN, /* client mqueue: request answered "back end down" */
  FE_QDROP_IN_DOUBT,     /* given up while its accelerator may still run it
                            (connection broke, frontend stopped) */
  FE_QDROP_FENCED,       /* its connection was cut: a newer frontend (epoch)
                            took the region over (docs/mqueue.md "Fencing") */
  FE_QDROP_MAX
};

extern const char *const fe_qdrop_names[FE_QDROP_MAX];

/* An accelerator instance as the frontend knows it: what the agent (static
 * mode) or the coordinator's table said. Each connection holds a copy. */
struct fe_accel {
  struct lynx_region_desc desc;
  const struct lynx_transport_ops *ops;
  /* desc is the agent's offer of shm to a frontend where it is (the
   * descriptor named this transport, and the file): "" when desc is the
   * descriptor as it came */
  char offered[16];
  struct lynx_geom g;
  char node[LYNX_ID_MAX];
  uint64_t instance_id; /* static mode: the accelerator index */
  /* mqueues [0, n_server) are server mqueues; the rest are client
   * mqueues, n_server + j * B + k the j-th of the service's back end k of B
   * (j = 0 only on a CPU; one j per block of a GPU kernel) */
  uint32_t n_server;
};

/* A back end of a service (client mqueues). */
struct fe_backend_cfg {
  char name[LYNX_BACKEND_NAME_MAX];
  char address[LYNX_ADDR_MAX];
  struct sockaddr_storage addr;
  enum fe_be_proto proto;
};

struct fe_conn;

/* One mqueue, owned by one worker. */
struct fe_mq {
  struct lynx_dq dq; /* the dispatcher's view */
  struct fe_conn *conn;
  uint32_t q;   /* index within its accelerator */
  uint32_t gid; /* frontend-wide index */
  uint32_t tx_cons;
  uint32_t tx_staged; /* slots read this forwarder cycle */
  uint32_t tx_cons_dirty;
  uint32_t tx_cons_flushed;        /* as of the last flush after index writes */
  uint32_t bad_value, bad_seq_pos; /* last reported (+1), to count once */
  struct fe_backend *be; /* a client mqueue: its back-end connection */
  uint8_t *stage;        /* staging for TX slot reads */
  uint32_t stage_slots;
  /* Large messages (docs/mqueue.md): the RX large area this worker
   * allocates, with the ring positions and ends of the large requests the
   * accelerator has not released yet (a FIFO of up to slots entries); the
   * TX large messages of the staged slots, read into lbuf (the area's
   * size), each staged slot's (ldata NULL: not large or malformed). */
  struct lynx_large_alloc rx_la;
  uint32_t *rx_lpos, *rx_lend;
  uint32_t rx_lfirst, rx_ln;
  uint8_t *lbuf;
  const uint8_t **ldata;
  uint32_t *llen;
  lynx_counter dispatched, responded;
  lynx_counter drops[FE_QDROP_MAX];
};

enum fe_conn_state {
  FE_CONN_IDLE,  /* nothing posted */
  FE_CONN_CTRL,  /* read of the actrl array posted, or a compound read
                    of it and the new TX slots (transports with read_tx);
                    never where answers are pushed */
  FE_CONN_SLOTS, /* reads of TX slots posted */
  FE_CONN_LARGE, /* reads of the staged slots' large messages posted */
  FE_CONN_DEAD,  /* accelerator left or transport failed */
};

/* One worker's connection to one accelerator instance. */
/* The transport operations a worker's connections post, by what they are
 * for (lynx_frontend_transport_ops_total's op label): what a change to the
 * remote path (answers pushed instead of polled for) is seen to remove. */
enum fe_op {
  FE_OP_POLL,          /* a poll for answers: the control array's read, or
                          the compound read (READ_TX) that carries it */
  FE_OP_SLOT_READ,     /* TX slots the control array said were published */
  FE_OP_LARGE_READ,    /* a large answer's bytes */
  FE_OP_FENCE_READ,    /* the barrier read of a fenced request write */
  FE_OP_OPEN_READ,     /* opening, resuming, the takeover scan */
  FE_OP_REQUEST_WRITE, /* a request's slot, or its large-area bytes */
  FE_OP_INDEX_WRITE,   /* a TX consumer index written back */
  FE_OP_SUBSCRIBE,     /* answers asked to be pushed (opening, resuming) */
  FE_OP_MAX
};
extern const char *const fe_op_names[FE_OP_MAX];

struct fe_conn {
  struct fe_accel acc;
  struct lynx_tconn *tc;
  lynx_counter *op_counts; /* its manager's (struct fe_rmq), by enum fe_op */
  struct lynx_actrl *snap; /* target of the actrl read */
  struct fe_mq *mqs;       /* this worker's mqueues on this accelerator */
  uint32_t n_mqs;
  /* the compound read's entries, one per mqueue of mqs (its stage); the
   * transport lacks one or cannot carry it (two_step): array, then slots */
  struct lynx_tx_read *txr;
  int two_step;
  /* pushed answers (transports with subscribe: tcp): the subscription,
   * one entry per mqueue of mqs (its buffers a copy of the mqueue's TX
   * ring and large area, allocated at the first); pushing while the
   * agent pushes, when the cycle reads nothing */
  struct lynx_tx_sub *sub;
  struct lynx_push push;
  int pushing;
  int index_lazy; /* consumer indices posted, not flushed yet */
  /* response doorbell (fe_rmq_arm): the entries, one per mqueue of mqs;
   * armed while the worker sleeps on its bell; no_bell once the transport
   * said its accelerator does not ring */
  struct lynx_arm *arm;
  int armed, no_bell;
  enum fe_conn_state state;
  uint32_t reads_pending;
  int dirty;       /* requests written since the last flush */
  int flush_again; /* a doorbell got -ENOBUFS: ring it at the next cycle */
  int removing;    /* out of dispatch; freed once nothing is outstanding */
  uint32_t n_client_mqs; /* of mqs: client mqueues (polled always) */
  /* a dead connection that is still in the table is reopened at retry_ns;
   * the wait doubles from 100 ms to 5 s while it keeps failing */
  uint64_t retry_ns, retry_wait_ns;
  uint32_t failures;
};

/* What the layers above the manager do when it finds or loses something.
 * One table, registered at fe_rmq_init (the worker's: worker.c); every
 * member is set. ctx is the context registered with it. */
struct fe_rmq_hooks {
  /* The connection set changed (called with the set's lock held): rebuild
   * what depends on it (dispatch order, payload cap, response batch). 0,
   * or -errno and nothing changed: the manager undoes its change. */
  int (*changed)(void *ctx);
  /* One staged TX slot of mq at ring position pos (the Message
   * Forwarder); a large message's bytes are at large (large_len of them),
   * NULL when the slot is not large or its reference is malformed. 0 when
   * consumed, -EAGAIN when it is not published yet (the next cycle reads
   * it again, and those after it). */
  int (*slot)(void *ctx, struct fe_mq *mq, const uint8_t *slot, uint32_t pos,
              const uint8_t *large, uint32_t large_len);
  /* A request outstanding on a connection that went down ended without an
   * answer (its tag is released after). */
  void (*lost)(void *ctx, const struct lynx_tag_entry *e);
  /* A client mqueue of a new connection: open its back end (sets mq->be),
   * 0 or -errno; close one when its connection is freed. */
  int (*be_open)(void *ctx, struct fe_mq *mq, const struct fe_backend_cfg *cfg);
  void (*be_close)(struct fe_backend *be);
};

/* What a manager is made with (fe_rmq_init copies it). Each accelerator
 * names its own transport (struct fe_accel, at fe_rmq_add). */
struct fe_rmq_opts {
  /* its worker, of n_workers: it owns mqueue q of every accelerator when
   * q % n_workers == worker (also the "worker %u" of its log lines) */
  uint32_t worker, n_workers;
  /* the service's back ends: client mqueue n_server + j * B + k is back
   * end k's of B (n_backends; the array outlives the manager) */
  const struct fe_backend_cfg *backends;
  uint32_t n_backends;
  /* shared with its worker: the requests in flight (those on a connection
   * that goes down are released here, through hooks->lost), and the seed
   * of its backoffs' jitter */
  struct lynx_tagtab *tags;
  unsigned *retry_seed;
  int no_push; /* --tcp-answers poll: never subscribe */
};

/* A worker's connection set (state of the Remote Message Queue Manager). */
struct fe_rmq {
  struct fe_rmq_opts opts;
  const struct fe_rmq_hooks *hooks;
  void *ctx; /* given back to every hook */
  /* Guards conns against the readers in other threads (metrics, status);
   * the data path never takes it. */
  pthread_mutex_t lock;
  struct fe_conn **conns;
  uint32_t n_conns;
  uint32_t next_gid;
  uint32_t n_client_mqs; /* client mqueues this worker owns */
  char fence_scratch[8]; /* target of the fenced writes' barrier reads */
  /* counters of mqueues whose accelerator was released (fe_rmq_reap), so
   * the service's totals never go back; read like the mqueues' */
  lynx_counter retired_dispatched, retired_responded;
  lynx_counter retired_drops[FE_QDROP_MAX];
  /* transport operations posted (every connection's), by enum fe_op */
  lynx_counter op_counts[FE_OP_MAX];
};

/* outstanding is written by its worker only and read by the status and
 * metrics threads: relaxed atomic stores, no locked instruction */
static inline void fe_mq_outstanding_set(struct fe_mq *mq, uint32_t v) {
  __atomic_store_n(&mq->dq.outstanding, v, __ATOMIC_RELAXED);
}

/* Requests in flight on a connection's mqueues. */
uint32_t fe_conn_outstanding(const struct fe_conn *c);
/* Response doorbell (common/bell.h): before the worker sleeps, asks c's
 * accelerator to ring bell when it publishes on any of the worker's
 * mqueues there; bell 0 withdraws it (after the sleep). 1: something is
 * published already (do not sleep), 0: done, -errno: c's accelerator
 * cannot ring (-ENOTSUP: tcp, rdma, a GPU; remembered, not asked again). */
int fe_rmq_arm(struct fe_conn *c, uint32_t bell);

/* Writes one message into mq's RX ring (a request, or a back end's reply
 * into a client mqueue); published, not yet rung (see fe_rmq_doorbells).
 * The caller checked there is a slot and moves rx_prod. A message longer
 * than a slot's payload goes into the ring's large area. 0 or -errno
 * (-ENOBUFS: the transport's queues are full for now; -ENOSPC: the large
 * area has no room for now; -EMSGSIZE: longer than the region takes). */
int fe_write_rx(struct fe_rmq *r, struct fe_mq *mq, const void *data,
                uint32_t len, uint32_t tag, uint16_t status);

/* Rings every connection written to since the last call: one flush and
 * one notify each. A connection whose transport fails goes down. */
void fe_rmq_doorbells(struct fe_rmq *r);

/* Sends the consumer indices written back lazily (where answers are
 * pushed, they wait for the next request's doorbell): the worker calls
 * this when its work runs out, so an agent always sees what was
 * forwarded (its count of answers no frontend read) within a pass. */
void fe_rmq_flush_indices(struct fe_rmq *r);

/* Advances one connection's state machine: reads its control array, then
 * its new TX slots (both in one compound read where the transport has
 * one), hands each to hooks->slot and writes the consumer
 * indices back. Returns slots handled (>= 0); a transport error takes the
 * connection down. */
int fe_rmq_progress(struct fe_rmq *r, struct fe_conn *c);

/* Takes a connection out of dispatch after a transport error rc (< 0):
 * its outstanding requests are in doubt; it is reopened with backoff. */
void fe_rmq_fail(struct fe_rmq *r, struct fe_conn *c, int rc);

/* The commands (worker thread). Add connects to a new instance (one that
 * cannot be reached yet stays, out of dispatch, and is retried); 0 or
 * -errno. Remove takes it out of dispatch while its answers still come;
 * down ends its outstanding requests, counted as reason. */
int fe_rmq_add(struct fe_rmq *r, const struct fe_accel *acc);
void fe_rmq_remove(struct fe_rmq *r, struct fe_conn *c);
void fe_rmq_down(struct fe_rmq *r, struct fe_conn *c, const char *why,
                 enum fe_qdrop reason);
/* The connection to an instance, or NULL; one being removed counts only
 * when any_state. */
struct fe_conn *fe_rmq_find(const struct fe_rmq *r, uint64_t instance_id,
                            int any_state);
/* The mqueue with frontend-wide index gid, or NULL. */
struct fe_mq *fe_rmq_mq(const struct fe_rmq *r, uint32_t gid);
/* Frees removed connections that have nothing outstanding. */
void fe_rmq_reap(struct fe_rmq *r);
/* Reopens dead connections whose retry time came by now_ns (the loop's
 * clock). */
void fe_rmq_retry(struct fe_rmq *r, uint64_t now_ns);
/* 1 when neither fe_rmq_reap nor fe_rmq_retry has anything to do, nor
 * will have until a connection changes (none removed, none dead). */
int fe_rmq_quiet(const struct fe_rmq *r);

/* Set-up and tear-down of a worker's set (main thread): init (of any
 * memory; opts copied, hooks and their ctx kept) before the worker starts,
 * free after it was joined (frees every connection). */
void fe_rmq_init(struct fe_rmq *r, const struct fe_rmq_opts *opts,
                 const struct fe_rmq_hooks *hooks, void *ctx);
void fe_rmq_free(struct fe_rmq *r);

/* Calls fn for every mqueue of r, under its lock (any thread). */
void fe_rmq_foreach_mq(struct fe_rmq *r,
                       void (*fn)(void *arg, const struct fe_rmq *rmq,
                                  const struct fe_conn *c,
                                  const struct fe_mq *mq),
                       void *arg);

#endif
