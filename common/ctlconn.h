/*
 * ctlconn.h - a framed protobuf-c control connection on a libuv TCP stream.
 *
 * Owns the stream handle, the frame reader and the outgoing writes. Every
 * received Envelope is handed to on_msg; a bad frame (oversized, undecodable)
 * or a read error closes the connection with a logged reason and calls
 * on_close once. Closing is deferred: lynx_ctl_close may be called from
 * inside on_msg, and the struct is freed by the owner in on_close.
 */
#ifndef LYNX_CTLCONN_H
#define LYNX_CTLCONN_H

#include <uv.h>

#include "frame.h"

struct lynx_ctl;
typedef void (*lynx_ctl_msg_cb)(struct lynx_ctl *c, Lynx__Envelope *env);
typedef void (*lynx_ctl_close_cb)(struct lynx_ctl *c);

struct lynx_ctl {
  uv_tcp_t tcp;
  struct lynx_frame_reader rd;
  lynx_ctl_msg_cb on_msg;     /* env is freed after on_msg returns */
  lynx_ctl_close_cb on_close; /* last call; owner may free c here */
  const char *comp;           /* log component */
  char peer[64];
  int closing;
  int close_after_write; /* close once pending writes are flushed */
  unsigned pending_writes;
  void *data;
};

/* Initialises c around an accepted or to-be-connected uv_tcp_t (c->tcp must
 * already be uv_tcp_init'ed). */
void lynx_ctl_init(struct lynx_ctl *c, const char *comp, size_t frame_max,
                   lynx_ctl_msg_cb on_msg, lynx_ctl_close_cb on_close);
/* Starts reading; fills c->peer. 0 or -errno. */
int lynx_ctl_start(struct lynx_ctl *c);
/* Queues env as one frame. 0 or -errno. */
int lynx_ctl_send(struct lynx_ctl *c, const Lynx__Envelope *env);
/* Closes (deferred, idempotent) and logs why when reason is not NULL. */
void lynx_ctl_close(struct lynx_ctl *c, const char *reason);

#endif
