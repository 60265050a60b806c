/*
 * http_internal.h - what the coordinator's API shares between its server
 * (http.c: listening, connection limits, TLS, workers, the watch thread,
 * routing) and its handlers, one file per resource (api_*.c), which
 * answer through http_reply.c. Calls go one way: http.c -> api_*.c ->
 * http_reply.c; a handler reaches the server only through the data it is
 * given (struct http_req, and the server's state in rq->h, under the
 * locks its comments name), never by calling into http.c.
 */
#ifndef LYNX_HTTP_INTERNAL_H
#define LYNX_HTTP_INTERNAL_H

#include <json-c/json.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "coord.h"
#include "httpconn.h"
#include "registry.h"
#include "regjson.h"
#include "util.h"

#define COMP "http"

#define PARAM_MAX 256 /* longest path segment captured ({id}) */

#define WATCH_DEFAULT_MS 30000 /* GET /v1/watch without timeout_ms */

#define WATCH_MAX_MS 60000 /* longest a watch may block */

#define CONN_TIMEOUT_S 90 /* idle connection timeout (> WATCH_MAX_MS) */

/* the connection limits' defaults are httpconn.h's (coord.h: 0 takes them) */
#define READ_WORKERS 2 /* threads that answer deferred reads */

#define WATCH_IDLE_MS 1000 /* the watch thread's longest sleep */

#define STOP_WAIT_MS 2000 /* how long a stop waits for resumed answers */

enum { QUEUE_READ, QUEUE_CHANGE, QUEUE_N };

#define DISCARD_MAX                                                            \
  (1u << 20) /* oversized chunked upload read to answer 413                    \
              */

/* Encoded bodies of the big lists (nodes, accelerators, mqueues), reused
 * while the registry version is unchanged and for at most LIST_CACHE_MS:
 * their only other content, counters and heartbeat ages, moves once per
 * heartbeat (lease/3) anyway. Encoding 10,000 accelerators takes tens of
 * milliseconds; copying the cached body, a fraction of one. */
#define LIST_CACHE_MS 1000

enum { CACHE_NODES, CACHE_ACCELS, CACHE_MQUEUES, CACHE_N };

struct list_cache {
  char *body; /* with the trailing newline */
  size_t len;
  uint64_t version, at_ms;
};

/* The same lists in id order, for pages (?limit=, docs/api.md): encoded
 * item by item, each followed by ',', item k at body[off[k] .. off[k+1] -
 * 1), so that a page is a slice of it; key[k] says whose item k is. Kept
 * like the lists (same version, same age). */
enum { PAGES_NODES, PAGES_ACCELS, PAGES_N };

struct page_key {
  char node[LYNX_ID_MAX];
  uint32_t idx;
};

struct page_cache {
  char *body;
  size_t len, cap, n, n_cap;
  size_t *off;          /* n + 1 entries */
  struct page_key *key; /* n entries */
  uint64_t version, at_ms;
  int oom;
};

/* A queue of requests for the workers (deferred, see the top). */
struct job_queue {
  struct http_req *head, **tail;
  pthread_cond_t wake; /* with http.work_lock */
};

/* The server's private state; c->http points at it. */
struct http {
  struct lynx_coord *c;
  struct MHD_Daemon *d;
  struct lynx_hc *hc; /* connection caps, shedding, deadlines */
  int stopping;       /* atomic: nothing more is deferred, watchers answer */
  struct list_cache cache[CACHE_N]; /* under c->lock */
  struct page_cache pages[PAGES_N]; /* under c->lock */
  /* the workers and their queues (reads, changes) */
  pthread_mutex_t work_lock;
  struct job_queue q[QUEUE_N];
  struct worker {
    struct http *h;
    int queue;
    pthread_t thread;
  } workers[READ_WORKERS + 1];
  unsigned n_workers;
  int workers_stop;       /* under work_lock */
  unsigned n_suspended;   /* under work_lock: suspended, not yet resumed */
  pthread_cond_t resumed; /* with work_lock: n_suspended went down */
  /* the watchers (GET /v1/watch waiting for news), under c->lock, and the
   * thread that answers them */
  struct http_req *watchers;
  unsigned n_watchers;
  uint64_t watch_at_ns; /* when the watch thread wakes next */
  pthread_t watch_thread;
  int watch_running;
};

struct http_req;

struct http_out;

typedef void (*handler_fn)(struct http_req *rq, struct http_out *out);

struct route {
  const char *method;
  const char *pattern; /* "/v1/nodes/{id}/drain": {x} matches one segment */
  handler_fn fn;
  int now; /* answered on the server's thread: takes no lock that may wait */
};

struct http_req {
  struct http *h;
  struct lynx_coord *c;
  struct MHD_Connection *conn;
  const struct route *route;
  char method[16];
  char params[2][PARAM_MAX]; /* the {..} segments, in order */
  char *body;                /* the upload, NUL-terminated when set */
  size_t len, cap;
  int too_big; /* the upload passed body_max: it is discarded */
  size_t discarded;
  int answered; /* a response was queued */
  int pending;  /* *early waits for the end of a request without body */
  struct http_out *early;
  /* deferred (see the top): the answer a worker or the watch thread made,
   * queued by the server's thread when it resumes the connection */
  struct http_out *result;
  int done;   /* result is ready */
  int parked; /* a watcher: the watch thread answers it */
  uint64_t since, watch_deadline_ns; /* a watcher's */
  /* a follower that knows of no leader reads its services: the reason the
   * runtime fields are unknown ("": a coordinator that knows them) */
  char unknown[512];
  struct http_req *next; /* in a job queue, or among the watchers */
};

struct http_out {
  unsigned status;
  struct json_object *json; /* owned; rendered with a trailing newline */
  char *text;               /* or a preformatted body (malloc'd) */
  size_t text_len;
  const char *ctype;
  char allow[64];     /* Allow header (405) */
  int page;           /* the console's files: their security headers */
  char location[384]; /* Location header (201; 307 to the leader) */
  int www_auth;       /* WWW-Authenticate header (401) */
};

/* ---- http_reply.c: answers, bodies, changes saved first --------------- */

void http_reply_json(struct http_out *out, unsigned status,
                     struct json_object *j);
void http_reply_err(struct http_out *out, unsigned status, const char *code,
                    const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* The registry's answer to a failed operation, with a fallback for the
 * errno when it left err empty. */
void http_reply_reg_err(struct http_out *out, int rc,
                        const struct lynx_reg_err *err);
void http_reply_oom(struct http_out *out);
/* Encoded under the lock: NULL means the encoder ran out of memory. */
void http_reply_encoded(struct http_out *out, unsigned status,
                        struct json_object *j);
/* A change of operator intent begins: one at a time (c->change_lock),
 * then the registry (c->lock). http_change_end releases both. */
void http_change_begin(struct http_req *rq);
void http_change_end(struct http_req *rq);
/* A saved change could not be applied after all: the store gets the state
 * as it is again. Both locks held. */
void http_store_undo(struct http_req *rq, const char *what);
/* Saves operator intent as it will be once edit is applied, before it is
 * applied: 0, or -errno with the refusal in out (503, 507 or 500). Both
 * locks held on entry and return; c->lock is released during a network
 * save, so callers find again what they hold of the registry. */
struct lynx_state_edit;
int http_save_first(struct http_req *rq, struct http_out *out, const char *what,
                    const struct lynx_state_edit *edit);
/* The request body as one JSON object (lynx_http_body_parse); NULL with
 * the refusal in out. */
struct json_object *http_parse_body(struct http_req *rq, struct http_out *out);
/* Finishes a change saved first and applied under c->lock, and releases
 * the locks: on success wakes the watchers and answers status with j;
 * otherwise the registry's error (and the store put back when saved).
 * Takes j. */
void http_finish_mutation(struct http_req *rq, struct http_out *out, int rc,
                          const struct lynx_reg_err *err, struct json_object *j,
                          const char *what, unsigned status, int saved);

/* ---- the handlers (http.c's routes[]) ---------------------------------- */

/* api_status.c */
void api_healthz(struct http_req *rq, struct http_out *out);
void api_readyz(struct http_req *rq, struct http_out *out);
void api_ui(struct http_req *rq, struct http_out *out);

/* api_nodes.c */
void api_nodes(struct http_req *rq, struct http_out *out);
void api_node(struct http_req *rq, struct http_out *out);
void api_accels(struct http_req *rq, struct http_out *out);
void api_mqueues(struct http_req *rq, struct http_out *out);
void api_node_drain(struct http_req *rq, struct http_out *out);
void api_node_undrain(struct http_req *rq, struct http_out *out);
void api_node_forget(struct http_req *rq, struct http_out *out);

/* api_services.c */
void api_services(struct http_req *rq, struct http_out *out);
void api_service(struct http_req *rq, struct http_out *out);
void api_service_create(struct http_req *rq, struct http_out *out);
void api_service_delete(struct http_req *rq, struct http_out *out);

/* api_frontends.c */
void api_frontends(struct http_req *rq, struct http_out *out);
void api_frontend_drain(struct http_req *rq, struct http_out *out);
void api_frontend_undrain(struct http_req *rq, struct http_out *out);

/* api_metrics.c */
void api_metrics(struct http_req *rq, struct http_out *out);

/* api_watch.c */
void api_watch(struct http_req *rq, struct http_out *out);
void api_events(struct http_req *rq, struct http_out *out);

#endif
