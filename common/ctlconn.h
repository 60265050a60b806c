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
#include "tls.h"

struct lynx_ctl;
typedef void (*lynx_ctl_msg_cb)(struct lynx_ctl *c, Lynx__Envelope *env);
typedef void (*lynx_ctl_close_cb)(struct lynx_ctl *c);

struct lynx_ctl_held;

struct lynx_ctl {
  uv_tcp_t tcp;
  struct lynx_frame_reader
      rd;                     /* rd.max: LYNX_CTL_UNTRUSTED_MAX until trusted */
  size_t frame_max;           /* the cap once trusted, and on what we send */
  lynx_ctl_msg_cb on_msg;     /* env is freed after on_msg returns */
  lynx_ctl_close_cb on_close; /* last call; owner may free c here */
  const char *comp;           /* log component */
  char peer[64];
  int closing;
  int close_after_write; /* close once pending writes are flushed */
  unsigned pending_writes;
  struct lynx_dialer *dialer; /* set when a dialer made this connection */
  /* The peer proved who it is (its Hello passed; a dialer's peer is the
   * address we were told to reach): frames up to frame_max are read, and a
   * close is logged in full. Before, frames are capped at
   * LYNX_CTL_UNTRUSTED_MAX (a Hello is far smaller) and close reasons are
   * logged rate-limited, so strangers cannot fill memory or the log. */
  int trusted;
  struct lynx_ctl_held *held; /* a refusal waiting to be sent */
  /* TLS (lynx_ctl_tls): every byte on the stream goes through tls; frames
   * flow only once the handshake is done (on_tls_ready then). NULL: plain
   * text. */
  struct lynx_tls_conn *tls;
  void (*on_tls_ready)(struct lynx_ctl *c);
  /* A server's: the peer's first byte cannot start a TLS record (a peer
   * without TLS configured, whose Hello came instead). c is plain text
   * from here on, only so that this may send a refusal the peer can read
   * (lynx_ctl_refuse); what the peer sent is dropped. NULL: the handshake
   * fails (tls_failed). */
  void (*on_not_tls)(struct lynx_ctl *c);
  int tls_failed; /* closed because the handshake failed */
  void *data;
};

#define LYNX_CTL_UNTRUSTED_MAX 4096u

/* Initialises c around an accepted or to-be-connected uv_tcp_t (c->tcp must
 * already be uv_tcp_init'ed). */
void lynx_ctl_init(struct lynx_ctl *c, const char *comp, size_t frame_max,
                   lynx_ctl_msg_cb on_msg, lynx_ctl_close_cb on_close);
/* Makes c a TLS connection on t (call before lynx_ctl_start): a server
 * waits for the peer's handshake, a client starts it in lynx_ctl_start;
 * host: a client's, what the server's certificate must name. on_ready, if
 * not NULL, is called once the handshake is done (a client says its Hello
 * then). A failed handshake closes c with its reason, tls_failed set.
 * Before it is done, what a peer can make c buffer is bounded by GnuTLS's
 * handshake limit (64 KiB) and the frame cap after it. 0 or -errno (err
 * says why). */
int lynx_ctl_tls(struct lynx_ctl *c, const struct lynx_tls *t, const char *host,
                 void (*on_ready)(struct lynx_ctl *c), char *err,
                 size_t errlen);
/* Starts reading; fills c->peer. 0 or -errno. */
int lynx_ctl_start(struct lynx_ctl *c);
/* The peer authenticated: see struct lynx_ctl.trusted. */
void lynx_ctl_trust(struct lynx_ctl *c);
/* Sends env, a refusal, and closes once it is written; with delay_ms,
 * stops reading and sends it only after delay_ms (a peer that keeps
 * presenting wrong credentials waits for its answer). 0 or -errno (the
 * caller closes). */
int lynx_ctl_refuse(struct lynx_ctl *c, const Lynx__Envelope *env,
                    uint64_t delay_ms);
/* Queues env as one frame. 0 or -errno. */
int lynx_ctl_send(struct lynx_ctl *c, const Lynx__Envelope *env);
/* Closes (deferred, idempotent) and logs why when reason is not NULL. */
void lynx_ctl_close(struct lynx_ctl *c, const char *reason);

/*
 * A dialer: the client side of a control connection that must stay up (an
 * agent's or a frontend's link to the coordinator, a frontend's to its
 * agent). It connects, says Hello (role, id, token), hands every message to
 * on_msg, and on any close calls on_close and then frees the connection;
 * the owner decides whether to lynx_dialer_retry, which reconnects after a
 * jittered exponential backoff (100 ms .. backoff_max_ms, 2 s unless set)
 * that a successful exchange resets with lynx_dialer_connected. on_close
 * may read connect_status to tell a refused connection (UV_ECONNREFUSED:
 * nothing listens there) from one that broke or timed out.
 *
 * A dialer may know several addresses (coordinators of which one leads:
 * docs/etcd.md): it starts with the first, and moves to the next after
 * every attempt that did not get as far as lynx_dialer_connected (no
 * connection, or a Hello refused: a follower says it does not lead), so
 * that the one that accepts is found within one round; a connection that
 * was accepted and then broke is tried again at the same address first.
 * The backoff then grows once per round of addresses, to at most 500 ms.
 *
 * A peer that accepts the connection but does not answer (a stopped
 * coordinator: the kernel completes the handshake for it) is given up
 * after hello_timeout_ms without lynx_dialer_connected, and the next
 * address is tried; so is one whose peer stopped answering after it was
 * accepted (lynx_dialer_silent).
 */
#include "util.h"

struct lynx_dialer {
  uv_loop_t *loop;
  struct sockaddr_storage addrs[LYNX_ADDRS_MAX];
  char addr_str[LYNX_ADDRS_MAX][LYNX_ADDR_STR_MAX]; /* for logs */
  unsigned n_addr, cur;
  int accepted; /* the current connection got to lynx_dialer_connected */
  uv_timer_t retry;
  uv_timer_t hello; /* hello_timeout_ms, from the connect to connected */
  int timers_open;  /* of retry and hello, for lynx_dialer_close */
  uv_close_cb closed_cb;
  uint64_t hello_timeout_ms; /* 0: none */
  uint64_t backoff_ms;
  uint64_t backoff_max_ms; /* longest wait between attempts (0: 2 s) */
  int connect_status;      /* the last attempt: 0 connected, else a uv error */
  const char *comp;        /* log component */
  const char *target;      /* "coordinator 127.0.0.1:7700": for logs */
  size_t frame_max;
  const char *role, *id, *token; /* our Hello */
  /* TLS to the peer (the cluster CA, our certificate), or NULL: plain
   * text; its certificate must name the host of the address dialed */
  const struct lynx_tls *tls;
  const uint64_t *epoch; /* our Hello's epoch (a frontend's), or NULL: 0 */
  /* our Hello's produces (a frontend's), read at each connect; NULL: none */
  Lynx__InstanceEpoch ***produces;
  const size_t *n_produces;
  lynx_ctl_msg_cb on_msg;
  lynx_ctl_close_cb on_close; /* c is freed right after it returns */
  struct lynx_ctl *ctl;       /* the connection, or NULL */
  void *data;                 /* the owner's; also every ctl->data */
};

/* Fills d and initialises its timer on loop (close it with
 * lynx_dialer_close). addrs: "HOST:PORT[,HOST:PORT...]", already checked
 * (an option of type LYNX_OPT_ADDRS or LYNX_OPT_ADDR). The strings must
 * outlive the dialer. 0 or -EINVAL. */
int lynx_dialer_init(struct lynx_dialer *d, uv_loop_t *loop, const char *addrs,
                     const char *comp, const char *target, size_t frame_max);
/* The address the current (or last) attempt is for. */
const char *lynx_dialer_addr(const struct lynx_dialer *d);
/* Connects now, unless a connection exists or is being made. */
void lynx_dialer_connect(struct lynx_dialer *d);
/* Connects after the backoff. */
void lynx_dialer_retry(struct lynx_dialer *d);
/* The peer accepted us: the next retry starts from the shortest backoff. */
void lynx_dialer_connected(struct lynx_dialer *d);
/* The peer stopped answering (what: "no heartbeat answered", for quiet_ms):
 * the connection is closed saying so, and the next attempt goes to the
 * next address (another coordinator may lead by now). */
void lynx_dialer_silent(struct lynx_dialer *d, const char *what,
                        uint64_t quiet_ms);
/* Closes the dialer's timers (cb once both are, with the retry timer's
 * handle); the connection is the owner's to close. */
void lynx_dialer_close(struct lynx_dialer *d, uv_close_cb cb);

#endif
