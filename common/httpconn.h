/*
 * httpconn.h - the connections of a libmicrohttpd server that strangers,
 * stuck scripts and the operator's own tools share: caps that shed before
 * they refuse, and deadlines however slowly the bytes come.
 *
 * The coordinator's JSON API and the frontend's and agent's /metrics
 * endpoints each own one (struct lynx_hc). The server runs libmicrohttpd
 * in epoll mode on one thread, so an open connection costs a socket and a
 * little memory, not a thread, and thousands fit.
 *
 * Every connection is tracked from libmicrohttpd's STARTED notification to
 * its CLOSED one, with the phase its current request is in (enum
 * lynx_hc_phase, set by the server as the request goes on). At a cap (the
 * client's address holds per_client, or the server conn_max), a new
 * connection is admitted and one that has not completed its request is
 * shed in its place: the connection longest in its phase of waiting for
 * headers or a body, of that address at the per-client cap, of anyone at
 * the total; then, only when there is none, the oldest long poll
 * (LYNX_HC_WAIT: answered early, which its protocol allows). A connection
 * whose request is being handled or answered is never shed; when every
 * connection is such, the new one is refused. So a trickling or leaking
 * client can no longer refuse the one request that would complete: a
 * well-formed request is in within milliseconds and becomes busy before
 * it is the oldest of anything.
 *
 * Deadlines: a request's headers must be whole within header_timeout_ms
 * of the connection's start or of the previous answer (an idle keep-alive
 * connection included), its body within body_timeout_ms of its headers. A
 * reaper thread shutdown()s the socket of a connection past its deadline
 * (and the thread that sheds does the same to its victim); libmicrohttpd
 * then sees the end of the stream and closes it as usual. The fd touched
 * is always the connection's own: it is touched only under the lock while
 * the connection is tracked, CLOSED untracks it under the lock, and
 * libmicrohttpd closes the fd only after CLOSED returns
 * (MHD_cleanup_connections in 0.9.75).
 *
 * Threads: the accept policy and the notifications run on the server's
 * thread; lynx_hc_phase, lynx_hc_was_shed and lynx_hc_stats on any. One
 * lock inside (never held while calling out: cfg.wake runs without it).
 */
#ifndef LYNX_HTTPCONN_H
#define LYNX_HTTPCONN_H

#include <microhttpd.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>

/* Where a connection's current request stands. */
enum lynx_hc_phase {
  LYNX_HC_HEADERS, /* waiting for a request's headers (deadline; shed) */
  LYNX_HC_BODY,    /* reading a request's body (deadline; shed) */
  LYNX_HC_BUSY,    /* the request is in: handled, then answered */
  LYNX_HC_WAIT,    /* a long poll waiting for news (shed last) */
};

/* Which cap a connection met. */
enum lynx_hc_cap { LYNX_HC_PER_CLIENT, LYNX_HC_TOTAL, LYNX_HC_CAPS };
/* What a shed connection was doing. */
enum lynx_hc_kind { LYNX_HC_INCOMPLETE, LYNX_HC_WAITING, LYNX_HC_KINDS };

struct lynx_hc_cfg {
  unsigned conn_max;   /* live connections (0: LYNX_HC_CONN_MAX_DEFAULT) */
  unsigned per_client; /* of them from one address (0: conn_max / 4) */
  uint64_t header_timeout_ms, body_timeout_ms; /* 0: 10 s, 30 s */
  const char *comp;                            /* log component, e.g. "http" */
  const char *opt; /* the options' prefix in log lines, e.g. "--http"
                    * (NULL: the caps are not options) */
  /* Told that connections in LYNX_HC_WAIT were shed (lynx_hc_was_shed now
   * says so of them): the owner answers them. Runs on the server's thread
   * with no lock of this module held. NULL when no request ever waits. */
  void (*wake)(void *arg);
  void *arg;
};

#define LYNX_HC_CONN_MAX_DEFAULT 4096u
#define LYNX_HC_HEADER_TIMEOUT_MS_DEFAULT 10000u
#define LYNX_HC_BODY_TIMEOUT_MS_DEFAULT 30000u

/* What /metrics shows. */
struct lynx_hc_stats {
  unsigned open; /* live: tracked, neither shed nor reaped */
  unsigned conn_max, per_client;
  uint64_t header_timeout_ms, body_timeout_ms;
  uint64_t shed[LYNX_HC_CAPS][LYNX_HC_KINDS];
  uint64_t refused[LYNX_HC_CAPS];
  uint64_t timeouts_header, timeouts_body;
};

struct lynx_hc;

/* A tracker with cfg (copied; its strings must outlive the tracker) and
 * its reaper thread. 0 or -errno. */
int lynx_hc_new(const struct lynx_hc_cfg *cfg, struct lynx_hc **out);
/* Stops the reaper and frees hc: after MHD_stop_daemon (whose CLOSED
 * notifications still use it). NULL is a no-op. */
void lynx_hc_free(struct lynx_hc *hc);

/* MHD_OPTION_CONNECTION_LIMIT for the server: conn_max and room for shed
 * connections that libmicrohttpd has not closed yet (lynx_hc_limit_for
 * says it of a conn_max before a tracker exists: the descriptors a cap
 * takes). */
unsigned lynx_hc_mhd_limit(const struct lynx_hc *hc);
unsigned lynx_hc_limit_for(unsigned conn_max);
/* The daemon flags of such a server on address family: one internal
 * thread polling every connection (epoll, else poll: no FD_SETSIZE
 * limit), its errors logged, IPv6 for AF_INET6. */
unsigned lynx_hc_mhd_flags(int family);

/* libmicrohttpd's accept policy (cls: the tracker) and connection
 * notification (MHD_OPTION_NOTIFY_CONNECTION, cls: the tracker). The
 * server must use both, and its notification's socket context is the
 * tracker's. */
enum MHD_Result lynx_hc_on_accept(void *cls, const struct sockaddr *addr,
                                  socklen_t addrlen);
void lynx_hc_on_connection(void *cls, struct MHD_Connection *conn,
                           void **socket_context,
                           enum MHD_ConnectionNotificationCode code);
/* Moves conn's connection to phase ph; entering HEADERS or BODY starts
 * that phase's deadline now (and ends a connection that was shed while it
 * waited: its answer is out). Any thread. */
void lynx_hc_phase(struct lynx_hc *hc, struct MHD_Connection *conn,
                   enum lynx_hc_phase ph);
/* Whether conn's connection was shed while in LYNX_HC_WAIT (its answer is
 * due now, and it closes after it). Any thread. */
int lynx_hc_was_shed(struct lynx_hc *hc, struct MHD_Connection *conn);

void lynx_hc_stats(struct lynx_hc *hc, struct lynx_hc_stats *s);

/* libmicrohttpd's message (its external logger's fmt and ap) into buf,
 * without its line end. 1 when it is a client's routine doing, for the
 * debug level only: a hang-up mid-request, or a connection this module
 * closed (a flood of slow clients would otherwise be a flood of lines; the
 * sheds and timeouts are logged here), else 0. */
int lynx_hc_mhd_msg(char *buf, size_t len, const char *fmt, va_list ap);

/* The families of s under prefix (e.g. "lynx_coordinator_api"):
 * prefix_connections, _connections_max, _connections_per_client_max,
 * _connections_shed_total{reason,kind}, _connections_refused_total{reason},
 * _connections_timed_out_total{phase}. opt names the options in the help
 * texts ("--http"). */
void lynx_hc_metrics(FILE *f, const char *prefix, const char *opt,
                     const struct lynx_hc_stats *s);

#endif
