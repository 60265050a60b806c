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
 * workers through a command queue (fe_post), the stop flag (an atomic
 * store) and a uv_async wake-up.
 *
 * Files, one per component (Lynx paper §4.2), each with its own header and
 * its own part of struct fe_worker:
 *
 *   main.c        the process: flags, agent/coordinator connection, services
 *   worker.c      the worker thread: its loop, its command queue, start/stop
 *   dispatcher.c  Message Dispatcher (ingress)        struct fe_ingress
 *   forwarder.c   Message Forwarder (egress)          struct fe_egress
 *   rmq.c         Remote Message Queue Manager        struct fe_rmq
 *   tcpsvc.c      TCP services' client connections    struct fe_tcpsvc
 *   backend.c     client mqueues' back ends           struct fe_backend_env
 *   metrics.c     Prometheus text and the totals log line
 *   (libraries: dispatch.c policy, tagtab.c tags, outq.c, beframe.c and
 *    tcpframe.c framing, rxring.c the dispatcher's io_uring receive ring)
 *
 * The components take their own struct, not the worker: each is made
 * (fe_rmq_init, fe_dispatcher_init, fe_tcp_init, fe_forwarder_init; a back
 * end's connection is opened with the worker's struct fe_backend_env) with
 * its options and pointers to what it reaches (the manager, the tag table,
 * the dispatcher, the loop and its clock, the stop flag), which worker.c
 * wires at set-up; none includes this header, so each builds, and can be
 * tested, without a worker (tests/unit/test_rmq.c makes a manager alone).
 *
 * Calls between these files go one way only (a DAG; an arrow reads "may
 * call"; tools/check-cycles.py checks it on the objects):
 *
 *   main.c ──▶ worker.c, metrics.c, rmq.c (fe_rmq_foreach_mq)
 *   worker.c ──▶ forwarder.c, tcpsvc.c, backend.c, dispatcher.c, rmq.c,
 *                metrics.c (fe_log_totals)
 *   forwarder.c ──▶ tcpsvc.c, backend.c, dispatcher.c, rmq.c
 *   tcpsvc.c ──▶ dispatcher.c
 *   backend.c ──▶ rmq.c
 *   dispatcher.c ──▶ rmq.c
 *   metrics.c ──▶ rmq.c; the name tables of dispatcher.c and tcpsvc.c
 *   rmq.c ──▶ (none)
 *
 * Upward events go through function pointers the upper layer registers:
 * the manager hands response slots, lost requests, connection-set changes
 * and client mqueues' back ends to the worker's struct fe_rmq_hooks
 * (worker.c, its context the worker), which passes them to the forwarder,
 * dispatcher, tcpsvc and backend. Downward results come back as return
 * values: tcpsvc.c frames an answer and says whether it went, and the
 * forwarder accounts for it (responded and the end-to-end time, or the
 * drop).
 */
#ifndef LYNX_FRONTEND_H
#define LYNX_FRONTEND_H

#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

#include "backend.h"
#include "bell.h"
#include "dispatcher.h"
#include "forwarder.h"
#include "lathist.h"
#include "rmq.h"
#include "tagtab.h"
#include "tcpsvc.h"
#include "util.h"

/* A change the main thread asks a worker to make. */
enum fe_cmd_kind {
  FE_CMD_ADD,     /* connect to acc and dispatch to it */
  FE_CMD_REMOVE,  /* stop dispatching; answer what is in flight, then close */
  FE_CMD_LOST,    /* the accelerator is gone: in-flight requests are lost */
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

/* What ended a sleep of the adaptive poller (lynx_frontend_sleeps_total;
 * its labels are metrics.c's) */
enum fe_wake {
  FE_WAKE_BELL,      /* an accelerator rang the worker's bell (shm) */
  FE_WAKE_FD,        /* a datagram, a TCP client, libuv */
  FE_WAKE_TIMER,     /* the sleep ran out */
  FE_WAKE_TRANSPORT, /* a remote transport's socket: an answer came */
  FE_WAKE_MAX
};

/* One worker: a thread, its loop, and the components' state. Each
 * component's part is its own sub-struct, counters included; what several
 * of them share is here (the loop, the clock, the requests in flight),
 * handed to them by pointer at set-up (worker.c). */
struct fe_worker {
  struct frontend *fe;
  uint32_t id;
  pthread_t tid;
  int started;
  uv_loop_t loop;
  uv_async_t wake;
  int loop_ready;
  /* The service's socket could not be bound (the port is taken): the errno
   * (read by the status thread: relaxed atomics), and when to try again
   * (backoff 1 s doubling to 30 s) */
  int listen_err;
  uint64_t listen_retry_ns, listen_wait_ns;
  unsigned retry_seed; /* jitter of every backoff of this worker */
  /* The command queue (fe_post): guards cmds against the main thread. */
  pthread_mutex_t cmd_lock;
  struct fe_cmd *cmds, **cmds_tail;
  uint32_t cmds_pending; /* atomic hint: take the lock only when set */
  uint64_t applied_seq;  /* atomic: last command carried out */
  uint64_t now_ns;
  /* Requests in flight: tagged by the dispatcher, resolved by the
   * forwarder, expired by the loop, released by the manager when their
   * connection goes down. */
  struct lynx_tagtab tags;
  struct fe_ingress ingress;      /* dispatcher.c */
  struct fe_egress egress;        /* forwarder.c */
  struct fe_rmq rmq;              /* rmq.c */
  struct fe_tcpsvc tcpsvc;        /* tcpsvc.c */
  struct fe_backend_env backends; /* backend.c: what its connections get */
  /* Sleeps of the adaptive poller, by what ended them (worker.c): its
   * response doorbell (common/bell.h), a descriptor (a datagram, libuv, a
   * remote transport), or the timeout. */
  lynx_counter sleeps[FE_WAKE_MAX];
  struct lynx_bell bell; /* fd -1, id 0: none (responses wake no sleep) */
  /* a sleep just before was armed on every connection waited for: the
   * wait for a response may be slept through (worker.c) */
  int bell_covers;
};

/* --rx, in its option's order */
enum fe_rx_opt { FE_RXOPT_AUTO, FE_RXOPT_URING, FE_RXOPT_SOCKET };

struct fe_cfg {
  char *agent, *coordinator, *udp, *tcp, *framing, *bind, *metrics,
      *frontend_id, *log_level, *token_file;
  char *tls_ca, *tls_cert, *tls_key; /* the link to the coordinator */
  uint32_t fixed_len;                /* --framing fixed:N, parsed */
  uint32_t workers, spin_us, timeout_ms, drain_ms, frame_max, rcvbuf_kb;
  int dispatch, poll, order, rx;
  int tcp_answers; /* --tcp-answers: 0 push, 1 poll */
  int rx_uring; /* --rx resolved at start: UDP services receive on io_uring */
};

enum fe_proto { FE_PROTO_UDP = 0, FE_PROTO_TCP = 1 };

/* One service: its port, its protocol, its workers. */
struct frontend {
  const struct fe_cfg *cfg;
  char service[LYNX_ID_MAX];
  enum fe_proto proto;
  uint32_t fixed_len; /* TCP framing: 0 = len32, else fixed-size messages */
  struct fe_backend_cfg
      backends[LYNX_BACKENDS_MAX]; /* client mqueues' back ends */
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
    char node[LYNX_ID_MAX];
    uint64_t epoch; /* the epoch we produce into it with (desc.producer) */
  } * instances;    /* main thread: the instances in dispatch */
  uint32_t n_instances;
  struct frontend *next;
};

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

/* metrics.c: Prometheus text for every service in the list; the list is
 * read under *list_lock. *table_version (atomic): the dispatch table the
 * workers run (coordinator mode; 0 in static mode). */
int fe_metrics_start(const char *addr, struct frontend **list,
                     pthread_mutex_t *list_lock, const uint64_t *table_version,
                     void **daemon);
void fe_metrics_stop(void *daemon);
/* One log line with the service's totals. */
void fe_log_totals(struct frontend *fe);

#endif
