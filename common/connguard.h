/*
 * connguard.h - what a port that strangers can reach admits: connection
 * caps and a back-off for peers that fail to authenticate.
 *
 * Every listening socket of a daemon (an agent's data port and static
 * control port, the coordinator's control port) owns one guard. A
 * connection is admitted only while the port holds fewer than conn_max
 * connections, fewer than unauth_max that have not authenticated yet, and
 * fewer than per_source unauthenticated ones from the same address; one
 * over a cap is closed at once and counted by reason. The unauthenticated
 * caps bound what strangers can hold (memory, descriptors) and keep room
 * for peers that authenticate.
 *
 * A source address that fails to authenticate (a wrong region key or
 * token) GUARD_FAILS_FREE times within GUARD_WINDOW_NS is backed off: its
 * next failures are answered only after a delay that doubles from 1 s to
 * 60 s, while it holds the connection (within its per-source cap), so
 * guessing a key gets slower and slower; a peer that presents the right
 * credential is served at once, backed off or not, and clears its
 * source's record. A stale credential (a frontend that has not yet heard
 * of an agent's new regions) fails a few times at most before it is told
 * the new ones, well under the free allowance.
 *
 * Thread: a guard is used by the thread of its port's loop; the counters
 * and gauges are also read by a metrics thread (relaxed atomics).
 */
#ifndef LYNX_CONNGUARD_H
#define LYNX_CONNGUARD_H

#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>

#define LYNX_GUARD_SOURCES 256 /* source addresses remembered */
#define LYNX_GUARD_FAILS_FREE 5
#define LYNX_GUARD_WINDOW_NS (60ull * 1000000000ull)
#define LYNX_GUARD_BACKOFF_MIN_NS (1000ull * 1000000ull)
#define LYNX_GUARD_BACKOFF_MAX_NS (60ull * 1000000000ull)

enum lynx_guard_refusal {
  LYNX_GUARD_ADMIT = 0,
  LYNX_GUARD_CONN_MAX,   /* the port holds conn_max connections */
  LYNX_GUARD_UNAUTH_MAX, /* unauth_max have not authenticated yet */
  LYNX_GUARD_PER_SOURCE, /* per_source of this address have not */
  LYNX_GUARD_REASONS
};
extern const char *const lynx_guard_reason_names[LYNX_GUARD_REASONS];

/* What the guard remembers of one source address. */
struct lynx_guard_src {
  uint8_t addr[16]; /* IPv6, or IPv4-mapped */
  int used;
  uint32_t unauth;   /* its connections not authenticated yet */
  uint32_t failures; /* within the window */
  uint64_t first_fail_ns, backoff_ns, last_ns;
};

struct lynx_guard {
  uint32_t conn_max, unauth_max, per_source; /* 0: no cap */
  /* gauges and counters (read by other threads with relaxed loads) */
  uint64_t open, unauth;
  uint64_t accepted, refused[LYNX_GUARD_REASONS];
  uint64_t auth_ok, auth_failed, delayed;
  struct lynx_guard_src src[LYNX_GUARD_SOURCES];
};

/* Sets the caps and clears everything else. */
void lynx_guard_init(struct lynx_guard *g, uint32_t conn_max,
                     uint32_t unauth_max, uint32_t per_source);

/* A connection from peer arrived at now_ns: LYNX_GUARD_ADMIT (counted
 * open and unauthenticated; *src is its source's record, or NULL when the
 * table is full of sources with connections pending) or the refusal
 * (counted; the caller closes the connection at once). */
enum lynx_guard_refusal lynx_guard_admit(struct lynx_guard *g,
                                         const struct sockaddr_storage *peer,
                                         uint64_t now_ns,
                                         struct lynx_guard_src **src);

/* The connection admitted with src authenticated: no longer counted as
 * unauthenticated; its source's failures are forgotten. */
void lynx_guard_auth_ok(struct lynx_guard *g, struct lynx_guard_src *src);

/* The connection admitted with src presented a wrong credential at now_ns.
 * Returns how long to hold the refusal before sending it (0: at once). */
uint64_t lynx_guard_auth_failed(struct lynx_guard *g,
                                struct lynx_guard_src *src, uint64_t now_ns);

/* The connection admitted with src closed; authed: it had authenticated
 * (lynx_guard_auth_ok). */
void lynx_guard_closed(struct lynx_guard *g, struct lynx_guard_src *src,
                       int authed);

/* Writes the guard's gauges and counters as Prometheus text, each series
 * named prefix + "_connections..." (prefix e.g. "lynx_agent_data"); what
 * names the port in the help text. */
void lynx_guard_metrics(FILE *f, const char *prefix, const char *what,
                        const struct lynx_guard *g);

/* Relaxed reads for metrics. */
static inline uint64_t lynx_guard_get(const uint64_t *v) {
  return __atomic_load_n(v, __ATOMIC_RELAXED);
}

#endif
