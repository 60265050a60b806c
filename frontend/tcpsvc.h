/*
 * tcpsvc.h - TCP services (tcpsvc.c): client connections cut into
 * messages for the Message Dispatcher, answers framed back onto them for
 * the Message Forwarder (docs/tcp-services.md). Made with its options and
 * the dispatcher it feeds (struct fe_tcpsvc_opts); it knows no worker.
 */
#ifndef LYNX_FE_TCPSVC_H
#define LYNX_FE_TCPSVC_H

#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

#include "outq.h"
#include "util.h"

struct fe_ingress;
struct fe_tcpsvc;

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

extern const char *const fe_tcpev_names[FE_TCPEV_MAX];

/* A TCP client connection of a TCP service (owned by one worker). */
struct fe_client {
  uv_tcp_t h;
  struct fe_tcpsvc *t;
  uint32_t slot, gen;
  uint8_t *in; /* received, not yet dispatched */
  uint32_t in_len, in_cap;
  struct fe_outq out; /* answers the kernel did not take yet */
  int reading, closing, paused;
  struct fe_client *next_paused;
};

/* What a worker's TCP service is made with (fe_tcp_init copies it). */
struct fe_tcpsvc_opts {
  uint32_t worker;     /* its worker's index (log lines) */
  const char *service; /* its service's name (log lines; outlives it) */
  const struct sockaddr_storage *addr; /* the port (outlives it) */
  uint32_t fixed_len; /* framing: 0 = len32, else fixed-size messages */
  uv_loop_t *loop;    /* its worker's: the listener's and clients' */
  /* where its messages go (and are counted: received, drops), and whose
   * payload cap and flow table it frames and pins flows with */
  struct fe_ingress *ingress;
  const uint32_t *stopping; /* the service's stop flag (atomic) */
};

/* A worker's TCP service state. */
struct fe_tcpsvc {
  struct fe_tcpsvc_opts opts;
  uv_tcp_t listener;
  int listener_open;
  struct fe_client **clients; /* by slot; NULL = free */
  uint32_t n_slots, n_clients;
  struct fe_client *paused; /* clients with a frame waiting for room */
  /* connections accepted and closed, by reason: read by other threads
   * (metrics.c) with relaxed loads */
  lynx_counter events[FE_TCPEV_MAX];
};

/* Sets up t (main thread; any memory): opts copied, no listener yet. */
void fe_tcp_init(struct fe_tcpsvc *t, const struct fe_tcpsvc_opts *opts);
/* Worker thread. Opens the listener: 0 or -errno. */
int fe_tcp_open(struct fe_tcpsvc *t);
void fe_tcp_stop_accepting(struct fe_tcpsvc *t);
void fe_tcp_close_all(struct fe_tcpsvc *t);
/* Frees the client table (main thread, after the loop closed). */
void fe_tcp_free(struct fe_tcpsvc *t);
/* Frames an answer (len bytes at data, copied) onto client (cli, gen)'s
 * connection and hands what the connection holds to the kernel: 0, and
 * *sent_ns the time it was framed (where its end-to-end time ends), or
 * -errno when it was dropped, for the caller to count (-ENOTCONN: the
 * client is gone; -ENOBUFS: past the bound of unsent answers, a slow
 * reader, or out of memory: the connection is closed). */
int fe_tcp_send(struct fe_tcpsvc *t, uint32_t cli, uint32_t gen,
                const uint8_t *data, uint32_t len, uint64_t *sent_ns);
/* A request of this client will never be answered (expired, lost): the
 * stream cannot stay in step, so the connection is closed. */
void fe_tcp_abort(struct fe_tcpsvc *t, uint32_t cli, uint32_t gen);
/* Retries clients whose next frame waited for room; work done. */
int fe_tcp_resume(struct fe_tcpsvc *t);

#endif
