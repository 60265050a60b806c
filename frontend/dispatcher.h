/*
 * dispatcher.h - the Message Dispatcher (Lynx paper §4.2, ingress): takes
 * a request from the network, picks an mqueue by the dispatch policy
 * (dispatch.h), gives it a tag and writes it into that mqueue's RX ring.
 *
 * Owns: the UDP socket of a UDP service and its receive path (libuv's
 * recvmmsg into a buffer, or an io_uring ring: rxring.h), the
 * dispatch order over the worker's mqueues (rebuilt when connections come
 * or go), the payload cap, the flow table (--order flow), and the counts
 * of what it received and dropped. TCP streams (tcpsvc.c) come in through
 * fe_submit too.
 *
 * It is made (fe_dispatcher_init) with its options and what it shares
 * with its worker (struct fe_ingress_opts): the manager it dispatches
 * over, the tag table, the loop's clock and the stop flag; it knows no
 * worker.
 */
#ifndef LYNX_FE_DISPATCHER_H
#define LYNX_FE_DISPATCHER_H

#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

#include "dispatch.h"
#include "rmq.h"
#include "rxring.h"
#include "tagtab.h"

#define FE_RECV_CHUNKS 20 /* libuv's recvmmsg width */
#define FE_DGRAM_MAX 65536
#define FE_FLOWS 4096 /* flow-table slots per worker (power of two) */

/* Drop reasons counted per worker (not attributable to one mqueue). */
enum fe_wdrop {
  FE_DROP_OVERSIZE,  /* datagram longer than the slot */
  FE_DROP_RING_FULL, /* every RX ring in dispatch was full */
  FE_DROP_FLOW_FULL, /* the busy flow's RX ring was full: moving the flow
                      * to another mqueue would reorder its answers */
  FE_DROP_NO_MQUEUE, /* no mqueue in dispatch */
  FE_DROP_TAG_FULL,  /* too many requests outstanding */
  FE_DROP_SHUTDOWN,  /* arrived while stopping */
  FE_WDROP_MAX       /* (fe_submit: counted on the mqueue instead) */
};

extern const char *const fe_wdrop_names[FE_WDROP_MAX];

/* How a worker receives its UDP service's datagrams (--rx). */
enum fe_rx_path {
  FE_RX_SOCKET, /* libuv's recvmmsg on the socket */
  FE_RX_URING,  /* io_uring's multishot recvmsg (rxring.h) */
  FE_RX_MAX
};

extern const char *const fe_rx_path_names[FE_RX_MAX];

/* What a dispatcher is made with (fe_dispatcher_init copies it). */
struct fe_ingress_opts {
  uint32_t worker;     /* its worker's index (log lines) */
  const char *service; /* its service's name (log lines; outlives it) */
  /* the UDP service's address (outlives it), its sockets' buffers
   * (--rcvbuf-kb, 0: the system's), and whether it receives on io_uring
   * (--rx, resolved at start) */
  const struct sockaddr_storage *addr;
  uint32_t rcvbuf_kb;
  int rx_uring;
  enum lynx_dispatch_policy policy; /* --dispatch */
  int flow_order;                   /* --order flow: keep a flow table */
  uv_loop_t *loop;                  /* its worker's (the UDP socket's) */
  /* shared with its worker, used per request: the manager that writes
   * the requests (and whose connections it dispatches over), the tags of
   * the requests in flight, the loop's clock (now_ns: a request's
   * dispatch time), the service's stop flag (atomic: arriving while it is
   * set, a request is dropped) */
  struct fe_rmq *rmq;
  struct lynx_tagtab *tags;
  const uint64_t *now_ns;
  const uint32_t *stopping;
};

/* The dispatcher's state in a worker. */
struct fe_ingress {
  uv_udp_t udp; /* UDP services; replies go out on its socket either way */
  int udp_open;
  char *rbuf;
  /* the receive path (read by the metrics thread: relaxed), and the ring
   * of the uring path */
  int rx_path;
  struct lynx_rxring rx;
  /* system calls the receive path made (recvmmsg, or io_uring_enter to
   * arm the ring), and ring receives ended for want of buffers: written
   * by the worker, read by the metrics thread */
  lynx_counter rx_calls, rx_nobufs;
  struct fe_ingress_opts opts;
  uint32_t got; /* requests received in this loop pass */
  struct lynx_dispatcher disp;
  struct lynx_dq **dqs; /* dispatch order (server mqueues) */
  uint32_t n_mqs;
  uint32_t cap;            /* largest payload every accelerator's slots take */
  struct lynx_flow *flows; /* NULL with --order none */
  uint32_t flow_mask;
  uint64_t dispatch_seq; /* order of requests, kept by their answers */
  /* Counters, read by other threads (metrics.c, the totals log line) with
   * relaxed loads; also counted by tcpsvc.c for streams. */
  lynx_counter received;
  /* a flow with requests in flight moved mqueue (its mqueue left
   * dispatch; a full one drops instead, flow_full): its answers may come
   * back out of order */
  lynx_counter flow_moves;
  lynx_counter drops[FE_WDROP_MAX];
};

/* Sets up a worker's dispatcher (main thread; any memory): opts copied,
 * its policy and flow table. 0 or -errno; fe_dispatcher_free undoes it,
 * also half-done. */
int fe_dispatcher_init(struct fe_ingress *in, const struct fe_ingress_opts *o);
void fe_dispatcher_free(struct fe_ingress *in);

/* Opens the UDP socket on the service's address and starts receiving on
 * the path the configuration chose: io_uring when --rx resolved to it at
 * start (opts.rx_uring), the socket otherwise or when this worker's ring
 * cannot be set up (logged). 0 or -errno. */
int fe_dispatcher_open_udp(struct fe_ingress *in);
/* Stops receiving (cancels the ring's receive) and closes the socket
 * (idempotent). */
void fe_dispatcher_close_udp(struct fe_ingress *in);
/* The uring path's share of a loop pass (worker thread): dispatches the
 * datagrams the ring received (bounded), arms its receive again where it
 * ended; a ring that keeps failing gives way to the socket path. The
 * socket path runs in the worker's uv_run instead. */
void fe_dispatcher_poll(struct fe_ingress *in);
/* An fd a sleeping worker polls for datagrams besides libuv's (the ring's),
 * or -1. */
int fe_dispatcher_wait_fd(const struct fe_ingress *in);

/* Dispatches one request from a UDP peer (cli unused) or a TCP client
 * (peer NULL). Returns 0 when written; with hold, -EAGAIN when it must
 * wait for room (a TCP stream keeps its order and loses nothing);
 * otherwise it was dropped: a negative errno (-ENOSPC no room, -EBUSY no
 * room on the busy flow's mqueue, -ENOENT no mqueue in dispatch, or the
 * transport's error) with *drop set to where the caller counts it (a
 * fe_wdrop reason; FE_WDROP_MAX: already counted on the mqueue). */
int fe_submit(struct fe_ingress *in, const void *data, uint32_t len,
              uint32_t flow, const struct sockaddr *peer, uint32_t cli,
              uint32_t cli_gen, int hold, enum fe_wdrop *drop);

/* A request ended (answered, dropped, expired, lost): its flow has one
 * fewer in flight. fe_request_done also releases its tag. */
void fe_flow_done(struct fe_ingress *in, const struct lynx_tag_entry *e);
void fe_request_done(struct fe_ingress *in, struct lynx_tag_entry *e);

/* Rebuilds the dispatch order and the payload cap from the connection set
 * (called with the set's lock held). 0 or -ENOMEM (nothing changed). */
int fe_dispatcher_rebuild(struct fe_ingress *in);

#endif
