/*
 * frontend.h - the network server: UDP listeners, Message Dispatcher,
 * Message Forwarder and Remote Message Queue Manager.
 *
 * Threads: the main thread owns configuration, the control connection to
 * the agent and signals; W worker threads own the data path. Each worker has
 * its own SO_REUSEPORT UDP socket, its own transport connection to every
 * accelerator, its own tag table, and a partition of the mqueues: worker w
 * owns mqueue q of every accelerator when q % W == w, so every worker
 * reaches every accelerator and one client flow (hashed to one worker by the
 * kernel) still spreads over all of them. Nothing on the data path is
 * shared between workers, so it takes no locks. The main thread talks to
 * workers through the `up` flag of an accelerator and the stop flag (atomic
 * stores) and a uv_async wake-up.
 */
#ifndef LYNX_FRONTEND_H
#define LYNX_FRONTEND_H

#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

#include "dispatch.h"
#include "mqueue.h"
#include "beframe.h"
#include "outq.h"
#include "tagtab.h"
#include "transport.h"
#include "util.h"

#define FE_SEND_BATCH 64
#define FE_RECV_CHUNKS 20 /* libuv's recvmmsg width */
#define FE_DGRAM_MAX 65536
#define FE_FLOWS 4096 /* flow-table slots per worker (power of two) */

/* Drop reasons counted per worker (not attributable to one mqueue). */
enum fe_wdrop {
  FE_DROP_OVERSIZE,  /* datagram longer than the slot */
  FE_DROP_RING_FULL, /* every RX ring in dispatch was full */
  FE_DROP_NO_MQUEUE, /* no mqueue in dispatch */
  FE_DROP_TAG_FULL,  /* too many requests outstanding */
  FE_DROP_SHUTDOWN,  /* arrived while stopping */
  FE_WDROP_MAX
};

/* Drop reasons counted per mqueue. */
enum fe_qdrop {
  FE_QDROP_STALE_TAG,   /* response carried a tag not outstanding here */
  FE_QDROP_TX_OVERSIZE, /* response metadata breaks the bounds rule */
  FE_QDROP_TX_SEQ,      /* TX index moved but slot not published */
  FE_QDROP_BAD_INDEX,   /* accelerator index out of range */
  FE_QDROP_APP,         /* the application dropped the request */
  FE_QDROP_EXPIRED,     /* no response within the request timeout */
  FE_QDROP_LOST,        /* its node was declared down: never runs later */
  FE_QDROP_WRITE_ERR,   /* transport refused the request write */
  FE_QDROP_SEND_ERR,    /* the response could not be sent to the client */
  FE_QDROP_CLIENT_GONE, /* TCP: the client closed before its answer came */
  FE_QDROP_BACKEND_DOWN, /* client mqueue: request answered "back end down" */
  FE_QDROP_IN_DOUBT,    /* given up while its accelerator may still run it
                           (connection broke, frontend stopped) */
  FE_QDROP_MAX
};

/* TCP client connections closed by the frontend, by reason, and other
 * per-worker TCP events. */
enum fe_tcpev {
  FE_TCP_ACCEPTED,    /* connections accepted */
  FE_TCP_CLOSED,      /* closed by the client */
  FE_TCP_OVERSIZE,    /* closed: a frame longer than a slot's payload */
  FE_TCP_SLOW_READER, /* closed: its unsent answers passed the bound */
  FE_TCP_ABORTED,     /* closed: a request of it expired or was lost */
  FE_TCP_ERROR,       /* closed: socket error */
  FE_TCP_NO_MQUEUE,   /* closed: no accelerator in dispatch */
  FE_TCPEV_MAX
};

extern const char *const fe_wdrop_names[FE_WDROP_MAX];
extern const char *const fe_tcpev_names[FE_TCPEV_MAX];
extern const char *const fe_qdrop_names[FE_QDROP_MAX];

/* An accelerator instance as the frontend knows it: what the agent (static
 * mode) or the coordinator's table said. Each connection holds a copy. */
struct fe_accel {
  struct lynx_region_desc desc;
  const struct lynx_transport_ops *ops;
  struct lynx_geom g;
  char node[64];
  uint64_t instance_id; /* static mode: the accelerator index */
  /* mqueues [0, n_server) are server mqueues; n_server + k is the client
   * mqueue of the service's back end k */
  uint32_t n_server;
};

/* A back end of a service (client mqueues). */
struct fe_backend_cfg {
  char name[32];
  char address[64];
  struct sockaddr_storage addr;
  enum fe_be_proto proto;
};
struct fe_backend;

struct fe_conn;
struct fe_mq;

/* A response ready to send; data points into its mqueue's staging. */
struct fe_resp {
  uint64_t seq;
  union lynx_sockaddr addr;
  uint32_t cli, cli_gen; /* TCP services: the client connection */
  const uint8_t *data;
  uint32_t len;
  struct fe_mq *mq;
};

/* One mqueue, owned by one worker. */
struct fe_mq {
  struct lynx_dq dq; /* the dispatcher's view */
  struct fe_conn *conn;
  uint32_t q;   /* index within its accelerator */
  uint32_t gid; /* frontend-wide index */
  uint32_t tx_cons;
  uint32_t tx_staged; /* slots read this forwarder cycle */
  uint32_t tx_cons_dirty;
  uint32_t bad_value, bad_seq_pos; /* last reported (+1), to count once */
  struct fe_backend *be; /* a client mqueue: its back-end connection */
  uint8_t *stage; /* staging for TX slot reads */
  uint32_t stage_slots;
  lynx_counter dispatched, responded;
  lynx_counter drops[FE_QDROP_MAX];
};

enum fe_conn_state {
  FE_CONN_IDLE,  /* nothing posted */
  FE_CONN_CTRL,  /* read of the actrl array posted */
  FE_CONN_SLOTS, /* reads of TX slots posted */
  FE_CONN_DEAD,  /* accelerator left or transport failed */
};

/* One worker's connection to one accelerator instance. */
struct fe_conn {
  struct fe_accel acc;
  struct lynx_tconn *tc;
  struct lynx_actrl *snap; /* target of the actrl read */
  struct fe_mq *mqs;       /* this worker's mqueues on this accelerator */
  uint32_t n_mqs;
  enum fe_conn_state state;
  uint32_t reads_pending;
  int dirty;    /* requests written since the last flush */
  int flush_again; /* a doorbell got -ENOBUFS: ring it at the next cycle */
  int removing; /* out of dispatch; freed once nothing is outstanding */
  uint32_t n_client_mqs; /* of mqs: client mqueues (polled always) */
  /* a dead connection that is still in the table is reopened at retry_ns;
   * the wait doubles from 100 ms to 5 s while it keeps failing */
  uint64_t retry_ns, retry_wait_ns;
  uint32_t failures;
};

/* A change the main thread asks a worker to make. */
enum fe_cmd_kind {
  FE_CMD_ADD,    /* connect to acc and dispatch to it */
  FE_CMD_REMOVE, /* stop dispatching; answer what is in flight, then close */
  FE_CMD_LOST,   /* the accelerator is gone: in-flight requests are lost */
  FE_CMD_ABANDON, /* out of dispatch at once, though the accelerator may
                     live on: in-flight requests are in doubt */
};

struct fe_cmd {
  enum fe_cmd_kind kind;
  struct fe_accel acc; /* ADD */
  uint64_t instance_id;
  uint64_t seq;
  struct fe_cmd *next;
};

struct frontend;

struct fe_worker {
  struct frontend *fe;
  uint32_t id;
  pthread_t tid;
  int started;
  uv_loop_t loop;
  uv_udp_t udp;
  uv_async_t wake;
  int udp_open, loop_ready;
  /* The service's socket could not be bound (the port is taken): the errno
   * (read by the status thread: relaxed atomics), and when to try again
   * (backoff 1 s doubling to 30 s) */
  int listen_err;
  uint64_t listen_retry_ns, listen_wait_ns;
  unsigned retry_seed;
  /* Guards conns/dqs against the readers in other threads (metrics,
   * status) and the command queue; the data path never takes it. */
  pthread_mutex_t lock;
  struct fe_cmd *cmds, **cmds_tail;
  uint32_t cmds_pending; /* atomic hint: take the lock only when set */
  uint64_t applied_seq;  /* atomic: last command carried out */
  uint32_t cap; /* largest payload every accelerator's slots take */
  struct fe_conn **conns;
  uint32_t n_conns;
  struct lynx_dq **dqs;
  uint32_t n_mqs, next_gid;
  uint32_t n_client_mqs; /* client mqueues this worker owns */
  struct lynx_dispatcher disp;
  struct lynx_flow *flows; /* NULL with --order none */
  uint32_t flow_mask;
  struct lynx_tagtab tags;
  char *rbuf;
  uint32_t got; /* datagrams in this loop pass */
  uint64_t now_ns;
  /* responses gathered in one forwarder pass over every accelerator, sent
   * in dispatch order so one client's answers from several accelerators do
   * not overtake each other needlessly */
  struct fe_resp *resp;
  uint32_t n_resp, max_resp;
  uint64_t dispatch_seq;
  struct mmsghdr out[FE_SEND_BATCH];
  struct iovec out_iov[FE_SEND_BATCH];
  lynx_counter received;
  /* a flow with requests in flight moved mqueue (its ring was full or
   * left dispatch): its answers may come back out of order */
  lynx_counter flow_moves;
  lynx_counter drops[FE_WDROP_MAX];
  /* counters of mqueues whose accelerator was released, so the service's
   * totals never go back */
  lynx_counter retired_dispatched, retired_responded;
  lynx_counter retired_drops[FE_QDROP_MAX];
  char fence_scratch[8];
  /* TCP services (tcpsvc.c) */
  uv_tcp_t listener;
  int listener_open;
  struct fe_client **clients; /* by slot; NULL = free */
  uint32_t n_slots, n_clients;
  struct fe_client *paused;   /* clients with a frame waiting for room */
  lynx_counter tcp[FE_TCPEV_MAX];
};

/* A TCP client connection of a TCP service (owned by one worker). */
struct fe_client {
  uv_tcp_t h;
  struct fe_worker *w;
  uint32_t slot, gen;
  uint8_t *in;                /* received, not yet dispatched */
  uint32_t in_len, in_cap;
  struct fe_outq out;         /* answers the kernel did not take yet */
  int reading, closing, paused;
  struct fe_client *next_paused;
};

struct fe_cfg {
  char *agent, *coordinator, *udp, *tcp, *framing, *bind, *metrics,
      *frontend_id, *log_level, *token_file;
  uint32_t fixed_len; /* --framing fixed:N, parsed */
  uint32_t workers, spin_us, timeout_ms, drain_ms, frame_max, rcvbuf_kb;
  int dispatch, poll, order;
};

enum fe_proto { FE_PROTO_UDP = 0, FE_PROTO_TCP = 1 };

/* One service: its port, its protocol, its workers. */
struct frontend {
  const struct fe_cfg *cfg;
  char service[64];
  enum fe_proto proto;
  uint32_t fixed_len; /* TCP framing: 0 = len32, else fixed-size messages */
  struct fe_backend_cfg backends[8]; /* client mqueues' back ends */
  uint32_t n_backends;
  struct sockaddr_storage udp_addr;
  struct fe_worker *w;
  uint32_t n_w;
  uint32_t stopping; /* set by the main thread (atomic) */
  uint64_t stop_deadline_ns;
  int workers_running;
  uint64_t cmd_seq; /* main thread: last command posted */
  struct fe_inst {
    uint64_t id;
    char node[64];
  } *instances; /* main thread: the instances in dispatch */
  uint32_t n_instances;
  struct frontend *next;
};

/* worker.c (worker thread): dispatches one request from a UDP peer (cli
 * unused) or a TCP client (peer NULL). 0 when written; a fe_wdrop reason
 * (> 0; FE_WDROP_MAX: counted on the mqueue) when dropped; with hold,
 * -EAGAIN instead when the request must wait for room (a TCP stream keeps
 * its order and loses nothing). */
int fe_submit(struct fe_worker *w, const void *data, uint32_t len,
              uint32_t flow, const struct sockaddr *peer, uint32_t cli,
              uint32_t cli_gen, int hold);

/* worker.c: writes one message into mq's RX ring (a request, or a back
 * end's reply into a client mqueue). The caller checked there is room. */
int fe_write_rx(struct fe_worker *w, struct fe_mq *mq, const void *data,
                uint32_t len, uint32_t tag, uint16_t status);

/* backend.c (worker thread): client mqueues' back-end connections */
int fe_backend_open(struct fe_worker *w, struct fe_mq *mq,
                    const struct fe_backend_cfg *cfg);
void fe_backend_close(struct fe_backend *be);
/* The application's request (tag) from the client mqueue's TX ring: sent
 * to the back end, or answered at once with LYNX_ST_BACKEND_DOWN. 0 when
 * consumed, -EAGAIN to retry next cycle. */
int fe_backend_request(struct fe_worker *w, struct fe_mq *mq,
                       const uint8_t *data, uint32_t len, uint32_t tag);
/* Hands replies that waited for RX room to the client mqueues. */
int fe_backend_progress(struct fe_worker *w);

/* tcpsvc.c (worker thread) */
int fe_tcp_open(struct fe_worker *w);
void fe_tcp_stop_accepting(struct fe_worker *w);
void fe_tcp_close_all(struct fe_worker *w);
/* Frames an answer onto its client's connection; counts and drops it when
 * the client is gone. */
void fe_tcp_send(struct fe_worker *w, const struct fe_resp *r);
/* A request of this client will never be answered (expired, lost): the
 * stream cannot stay in step, so the connection is closed. */
void fe_tcp_abort(struct fe_worker *w, uint32_t cli, uint32_t gen);
/* Retries clients whose next frame waited for room; work done. */
int fe_tcp_resume(struct fe_worker *w);

/* worker.c (main thread) */
/* Starts n_w workers on fe->udp_addr with no accelerator yet. */
int fe_workers_start(struct frontend *fe);
/* 0 while every worker listens on the service's port, else the errno of
 * the first that cannot bind it (any thread). */
int fe_listen_error(const struct frontend *fe);
/* "cannot bind UDP 0.0.0.0:7000: Address already in use" into buf. */
void fe_listen_error_str(const struct frontend *fe, int err, char *buf,
                         size_t len);
/* Stops receiving, answers in flight until stop_deadline, joins, frees. */
void fe_workers_stop(struct frontend *fe);
/* Posts a command to every worker; returns its sequence number. */
uint64_t fe_post(struct frontend *fe, enum fe_cmd_kind kind,
                 const struct fe_accel *acc, uint64_t instance_id);
/* 1 when every worker carried out the commands up to seq. */
int fe_applied(struct frontend *fe, uint64_t seq);
/* Calls fn for every mqueue of every worker (under each worker's lock). */
void fe_foreach_mq(struct frontend *fe,
                   void (*fn)(void *arg, const struct fe_worker *w,
                              const struct fe_conn *c, const struct fe_mq *mq),
                   void *arg);

/* metrics.c: Prometheus text for every service in the list; the list is
 * read under *list_lock. */
int fe_metrics_start(const char *addr, struct frontend **list,
                     pthread_mutex_t *list_lock, void **daemon);
void fe_metrics_stop(void *daemon);
/* One log line with the service's totals. */
void fe_log_totals(struct frontend *fe);

#endif
