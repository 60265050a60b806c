/*
 * coord.h - the coordinator daemon's shared context.
 *
 * Two threads touch the registry: the libuv loop thread (agent and frontend
 * control connections, the lease tick) and libmicrohttpd's threads (the
 * JSON API, one thread per connection so /v1/watch can block). Both take
 * `lock` around every registry access; `changed` is broadcast whenever
 * registry.version grows (watchers wait on it). Registry action callbacks
 * never do I/O under the lock: they queue work for the loop thread, which
 * sends the messages (coordinator/actions.c).
 */
#ifndef LYNX_COORD_H
#define LYNX_COORD_H

#include <pthread.h>
#include <stdint.h>

#include "connguard.h"
#include "registry.h"
#include "util.h"

struct lynx_state_edit; /* store.h */
struct json_object;

struct lynx_coord {
  pthread_mutex_t lock;
  /* Changes of operator intent (the API's, and a reload from the store)
   * one at a time: taken before lock, and held while the store is written
   * with lock released (http.c), so that heartbeats and the loop never
   * wait on the store (docs/etcd.md, "When etcd stalls or is slow"). */
  pthread_mutex_t change_lock;
  pthread_cond_t changed;
  struct lynx_registry reg;
  const char *state_dir;
  /* Where operator intent persists instead of state_dir (main.c: etcd,
   * --etcd), NULL: state_dir. Called with change_lock held and lock NOT
   * held (a network call), before a change is applied, with the state as
   * it will be after the change (store.h, lynx_store_state_obj, built
   * under lock): 0 or -errno with err (-EAGAIN, -ETIMEDOUT,
   * -ECONNREFUSED, -EHOSTUNREACH: the store is unreachable or cannot
   * serve: 503). save_where names it in messages. */
  int (*save)(void *arg, struct json_object *state, char *err, size_t errlen);
  void *save_arg;
  const char *save_where;
  const char *token; /* NULL: no token; mutating API calls then need loopback */
  /* The API's key and certificate (PEM text, --tls-key/--tls-cert): it is
   * served over HTTPS, and redirects to the leader say https. NULL: HTTP. */
  const char *tls_cert_pem, *tls_key_pem;
  size_t body_max; /* largest accepted request body (413 above) */
  /* API connection limits (http.c, docs/api.md "Connections"); 0 takes
   * http.c's default: open connections in all (one thread each), open
   * connections per client address, how long a request's headers may take
   * from the connection's start or the previous request's end, and how long
   * its body may take from the end of its headers */
  unsigned http_conn_max, http_conn_per_client;
  uint32_t http_header_timeout_ms, http_body_timeout_ms;
  /* The control port's caps and counters (connguard.h): used by the loop
   * thread, read by /metrics with relaxed loads. */
  struct lynx_guard ctl_guard;
  int ready; /* /readyz: state loaded and control port listening */
  /* Several coordinators on etcd (--etcd, elect.c): ha is set, and only
   * the leader (leader: 1, atomic) takes agents, frontends and API
   * changes; a follower redirects changes to leader_api (the leader's API
   * host:port as it advertises it, "" while none leads; under lock). */
  int ha, leader;
  /* The leader's lease, as far as this coordinator can vouch for it
   * (elect.c; atomic): until this lynx_now_ns() instant nobody else can
   * lead (the send time of its last etcd keepalive that etcd took, plus
   * 2/3 of the lease's TTL). A leader past it (it did not run, or etcd did
   * not answer) is not sure it still leads: it answers nothing that
   * renews or decides anything (heartbeats, Hellos, tables, lease
   * expiries) until etcd says (lynx_coord_leads). */
  uint64_t lead_until_ns;
  /* Hellos and messages refused, and connections closed, because this
   * leader was not sure it still led (ctlport.c, tick.c; atomic, for /metrics)
   */
  uint64_t unsure_refusals;
  char leader_api[128];
  /* A follower that knows of no leader (elect.c; under lock): no leader
   * key is held (an election under way), or etcd has not answered this
   * coordinator for longer than a poll (quorum lost, or cut off from it),
   * so what it last read of the key may be stale. leader_api is "" then;
   * Hellos are refused with HelloReply.no_leader (agents keep their
   * lease: docs/etcd.md) and the API answers 503 no_leader with
   * no_leader_why instead of redirecting. */
  int no_leader;
  char no_leader_why[320];
  void *http; /* http.c's private state (the MHD daemon): opaque */
  /* Given by whoever makes the context (main.c; the tests), before
   * lynx_http_start and the election: the registry's clock (monotonic
   * milliseconds in the daemon), and what follows any change of the
   * registry (called with lock held: wakes the watchers). The API and the
   * election call these, never the daemon's main.c. */
  uint64_t (*now_ms)(void);
  void (*on_change)(struct lynx_coord *c);
};

/* Whether this coordinator may act as the leader now: always without
 * etcd; with it, while it leads and its lease is vouched for
 * (lead_until_ns). Any thread. */
static inline int lynx_coord_leads(const struct lynx_coord *c) {
  return !c->ha ||
         (__atomic_load_n(&c->leader, __ATOMIC_ACQUIRE) &&
          lynx_now_ns() < __atomic_load_n(&c->lead_until_ns, __ATOMIC_ACQUIRE));
}

/* http.c: the JSON API on addr ("host:port"). 0 or -errno. */
int lynx_http_start(struct lynx_coord *c, const char *addr);
void lynx_http_stop(struct lynx_coord *c);

/* http_reply.c: an API request's body (len bytes from the network; NULL or 0:
 * none) as one JSON object, refusing what json-c would take without a
 * word: a key twice in one object, data after the value. The object (the
 * caller puts it), or NULL with the HTTP status to answer (400, 413, 500)
 * in *status and the reason in msg (msglen bytes, terminated). Also what
 * tests/fuzz/fuzz_http_body.c runs. */
struct json_object;
struct json_object *lynx_http_body_parse(const char *body, size_t len,
                                         unsigned *status, char *msg,
                                         size_t msglen);

#endif
