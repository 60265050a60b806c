/*
 * tcpsvc.h - TCP services (tcpsvc.c): client connections cut into
 * messages for the Message Dispatcher, answers framed back onto them for
 * the Message Forwarder (docs/tcp-services.md).
 */
#ifndef LYNX_FE_TCPSVC_H
#define LYNX_FE_TCPSVC_H

#include <stdint.h>
#include <uv.h>

#include "outq.h"

struct fe_worker;
struct fe_resp;

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
  struct fe_worker *w;
  uint32_t slot, gen;
  uint8_t *in;                /* received, not yet dispatched */
  uint32_t in_len, in_cap;
  struct fe_outq out;         /* answers the kernel did not take yet */
  int reading, closing, paused;
  struct fe_client *next_paused;
};

/* A worker's TCP service state. */
struct fe_tcpsvc {
  uv_tcp_t listener;
  int listener_open;
  struct fe_client **clients; /* by slot; NULL = free */
  uint32_t n_slots, n_clients;
  struct fe_client *paused;   /* clients with a frame waiting for room */
};

/* Worker thread. Opens the listener: 0 or -errno. */
int fe_tcp_open(struct fe_worker *w);
void fe_tcp_stop_accepting(struct fe_worker *w);
void fe_tcp_close_all(struct fe_worker *w);
/* Frees the client table (main thread, after the loop closed). */
void fe_tcp_free(struct fe_worker *w);
/* Frames an answer onto its client's connection; counts and drops it when
 * the client is gone. */
void fe_tcp_send(struct fe_worker *w, const struct fe_resp *r);
/* A request of this client will never be answered (expired, lost): the
 * stream cannot stay in step, so the connection is closed. */
void fe_tcp_abort(struct fe_worker *w, uint32_t cli, uint32_t gen);
/* Retries clients whose next frame waited for room; work done. */
int fe_tcp_resume(struct fe_worker *w);

#endif
