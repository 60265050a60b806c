/*
 * http.c - the coordinator's operator API: JSON over HTTP (libmicrohttpd,
 * json-c). docs/api.md is the reference; this file is the implementation.
 *
 * Threads: libmicrohttpd polls every connection on one thread (epoll), so
 * an open connection costs a socket, not a thread. That thread answers
 * what can never wait (/healthz, /readyz, the console's files, refusals
 * decided from the headers) itself; every other request, once whole, is
 * deferred: its connection is suspended and the request queued for a
 * worker (READ_WORKERS for reads, one for changes, so that a change
 * waiting on etcd holds up no read), which runs the handler and resumes
 * the connection; the server's thread then sends the answer. A
 * GET /v1/watch that has to wait is parked among the watchers instead,
 * still suspended, and the watch thread answers it when the registry's
 * version moves, its time is up, or its place is wanted (below). Every
 * handler takes c->lock around registry access, encodes what it needs
 * into json-c objects under the lock, and renders it after releasing it.
 *
 * A request goes through on_request() several times:
 *   1. headers received: the route is resolved (404 / 405), mutating calls
 *      are authorised (401 / 403) and a declared Content-Length above
 *      c->body_max is refused (413) before any byte of the body is read;
 *   2. body chunks: appended to the request's buffer; once a chunked upload
 *      grows past body_max nothing more of it is kept: the 413 goes out at
 *      its end, or the connection is closed if it goes on for more than
 *      DISCARD_MAX bytes (libmicrohttpd 0.9 takes no answer mid-upload);
 *   3. end of request: the route's handler runs (here, or deferred) and
 *      its answer is queued.
 *      A body is parsed by json-c, then checked by jansson for a key that
 *      appears twice in an object (jsondup.h), then decoded.
 * The per-request state (struct http_req) is freed in on_completed(), which
 * libmicrohttpd calls however the request ended.
 *
 * Errors are {"error": {"code": ..., "message": ...}} with the HTTP status
 * that fits; every response body ends with a newline. Bad input never
 * asserts or exits: it gets a 4xx.
 *
 * Connections (slow, stuck or leaking clients, httpconn.h): at most
 * --http-conn-max open, --http-conn-per-client from one address; past
 * either, a new connection takes the place of the oldest that has not
 * completed its request (then of the oldest parked watch, answered with
 * the current version and closed), and is refused only when every one
 * is being answered. A request's headers are due within
 * --http-header-timeout-ms of the connection's start or the previous
 * answer, its body within --http-body-timeout-ms of its headers; a
 * request being handled, answered or watched has no deadline. So the
 * operator's own address, shared by every local client, is always
 * served: a well-formed request completes within milliseconds and is
 * never the oldest incomplete one.
 * Sheds, refusals and timeouts are counted for /metrics.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "coord.h"
#include "frame.h"
#include "httpconn.h"
#include "jsondup.h"
#include "log.h"
#include "prom.h"
#include "registry.h"
#include "regjson.h"
#include "store.h"
#include "ui.h"
#include "util.h"

#define COMP "http"
#define PARAM_MAX 256          /* longest path segment captured ({id}) */
#define WATCH_DEFAULT_MS 30000 /* GET /v1/watch without timeout_ms */
#define WATCH_MAX_MS 60000     /* longest a watch may block */
#define CONN_TIMEOUT_S 90      /* idle connection timeout (> WATCH_MAX_MS) */
/* the connection limits' defaults are httpconn.h's (coord.h: 0 takes them) */
#define READ_WORKERS 2 /* threads that answer deferred reads */
#define WATCH_IDLE_MS 1000 /* the watch thread's longest sleep */
#define STOP_WAIT_MS 2000  /* how long a stop waits for resumed answers */
enum { QUEUE_READ, QUEUE_CHANGE, QUEUE_N };
#define DISCARD_MAX (1u << 20) /* oversized chunked upload read to answer 413  \
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
  int stopping; /* atomic: nothing more is deferred, watchers answer */
  struct list_cache cache[CACHE_N]; /* under c->lock */
  struct page_cache pages[PAGES_N];  /* under c->lock */
  /* the workers and their queues (reads, changes) */
  pthread_mutex_t work_lock;
  struct job_queue q[QUEUE_N];
  struct worker {
    struct http *h;
    int queue;
    pthread_t thread;
  } workers[READ_WORKERS + 1];
  unsigned n_workers;
  int workers_stop;      /* under work_lock */
  unsigned n_suspended;  /* under work_lock: suspended, not yet resumed */
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
  int done;     /* result is ready */
  int parked;   /* a watcher: the watch thread answers it */
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

/* ---- small helpers ------------------------------------------------------ */

static int is_mutating(const char *method) {
  return strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0;
}

static void reply_json(struct http_out *out, unsigned status,
                       struct json_object *j) {
  json_object_put(out->json);
  out->status = status;
  out->json = j;
}

static void reply_err(struct http_out *out, unsigned status, const char *code,
                      const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void reply_err(struct http_out *out, unsigned status, const char *code,
                      const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  reply_json(out, status, lynx_json_error(code, msg));
}

/* The registry's answer to a failed operation, with a fallback for the
 * errno when it left err empty. */
static void reply_reg_err(struct http_out *out, int rc,
                          const struct lynx_reg_err *err) {
  unsigned status;
  const char *code;
  if (err->status >= 400 && err->status <= 599 && err->code[0]) {
    reply_err(out, (unsigned)err->status, err->code, "%s",
              err->message[0] ? err->message : strerror(-rc));
    return;
  }
  switch (rc) {
  case -EINVAL:
    status = 400, code = "invalid_argument";
    break;
  case -ENOENT:
    status = 404, code = "not_found";
    break;
  case -EEXIST:
  case -EADDRINUSE:
  case -EBUSY:
  case -ESTALE:
    status = 409, code = "conflict";
    break;
  case -ENOSPC:
    status = 409, code = "limit_exceeded";
    break;
  case -EFBIG:
    status = 422, code = "limit_exceeded";
    break;
  default:
    status = 500, code = "internal";
    break;
  }
  reply_err(out, status, code, "%s",
            err->message[0] ? err->message : strerror(-rc));
}

static void reply_oom(struct http_out *out) {
  reply_err(out, 500, "internal", "out of memory");
}

/* Encoded under the lock: NULL means the encoder ran out of memory. */
static void reply_encoded(struct http_out *out, unsigned status,
                          struct json_object *j) {
  if (!j)
    reply_oom(out);
  else
    reply_json(out, status, j);
}

/* The answer for a store that could not save (rc < 0): 503 when it cannot
 * be reached or cannot serve now (lost its lead: retry), 507 when it has
 * no room, else 500. */
static unsigned save_err_status(int rc, const char **code) {
  if (rc == -EAGAIN || rc == -ETIMEDOUT || rc == -ECONNREFUSED ||
      rc == -EHOSTUNREACH || rc == -ECANCELED) {
    *code = "store_unavailable";
    return 503;
  }
  if (rc == -ENOSPC || rc == -EDQUOT) {
    *code = "insufficient_storage";
    return 507;
  }
  *code = "internal";
  return 500;
}

/* A change of operator intent begins: one at a time (c->change_lock),
 * then the registry (c->lock). change_end releases both. */
static void change_begin(struct http_req *rq) {
  pthread_mutex_lock(&rq->c->change_lock);
  pthread_mutex_lock(&rq->c->lock);
}

static void change_end(struct http_req *rq) {
  pthread_mutex_unlock(&rq->c->lock);
  pthread_mutex_unlock(&rq->c->change_lock);
}

/* Writes r's state with edit applied (may be NULL) to the store: a state
 * directory under c->lock (a local file, which also holds the epoch
 * counter the loop writes), or the save hook (etcd: a network call) with
 * c->lock released meanwhile, so that heartbeats, registrations and the
 * loop never wait on the store; change_lock keeps other changes out. Both
 * locks held on entry and return. 0 or -errno with err. */
static int store_write(struct lynx_coord *c, const struct lynx_state_edit *edit,
                       char *err, size_t errlen) {
  struct json_object *state;
  int rc;
  if (!c->save)
    return c->state_dir ? lynx_store_save(c->state_dir, &c->reg, edit, err,
                                          errlen)
                        : 0;
  state = lynx_store_state_obj(&c->reg, edit);
  if (!state)
    return lynx_fail(err, errlen, -ENOMEM, "out of memory");
  pthread_mutex_unlock(&c->lock);
  rc = c->save(c->save_arg, state, err, errlen);
  json_object_put(state);
  pthread_mutex_lock(&c->lock);
  return rc;
}

/* A saved change could not be applied after all: the registry changed
 * while the store was written (a node went down or came back, this
 * coordinator stepped down). The store gets the state as it is again, so
 * that it holds what the API shows; should that fail too, the next save
 * writes the whole difference (docs/etcd.md). Both locks held. */
static void store_undo(struct http_req *rq, const char *what) {
  char err[256] = "";
  int rc = store_write(rq->c, NULL, err, sizeof(err));
  if (rc)
    LYNX_LOG_RL(LYNX_LOG_WARN, COMP, "%s was saved but not applied, and the "
                "state as it is could not be saved again: %s (the next "
                "change saves it)", what, err[0] ? err : strerror(-rc));
}

/* Saves operator intent as it will be once the change in edit is applied,
 * before it is applied (store_write: both locks held, c->lock released
 * during a network save, so callers find again what they hold of the
 * registry): 0, or -errno with the refusal in out and a log line, the
 * change not to be applied. The store says why: 503 when it cannot be
 * reached or cannot serve (etcd; this coordinator no longer leads), 507
 * when it has no room, else 500. With etcd, a save that timed out may
 * still reach etcd; the next save writes the state as this coordinator
 * holds it over it. */
static int save_first(struct http_req *rq, struct http_out *out,
                      const char *what, const struct lynx_state_edit *edit) {
  struct lynx_coord *c = rq->c;
  const char *where = c->save ? c->save_where : c->state_dir;
  char err[256] = "";
  const char *code;
  unsigned status;
  int rc = store_write(c, edit, err, sizeof(err));
  if (rc == 0)
    return 0;
  LYNX_LOG_RL(LYNX_LOG_ERROR, COMP, "%s refused: it cannot be saved in %s: %s",
              what, where, err[0] ? err : strerror(-rc));
  status = save_err_status(rc, &code);
  reply_err(out, status, code,
            "%s: not applied: it cannot be saved in %s (%s)", what, where,
            err[0] ? err : strerror(-rc));
  return rc;
}

/* ---- read-only endpoints ------------------------------------------------ */

static void h_healthz(struct http_req *rq, struct http_out *out) {
  struct json_object *j = json_object_new_object();
  (void)rq;
  if (j)
    json_object_object_add(j, "status", json_object_new_string("ok"));
  reply_encoded(out, 200, j);
}

static void h_readyz(struct http_req *rq, struct http_out *out) {
  struct json_object *j;
  if (!__atomic_load_n(&rq->c->ready, __ATOMIC_ACQUIRE)) {
    reply_err(out, 503, "not_ready",
              "not ready: state not loaded or control port not listening yet");
    return;
  }
  j = json_object_new_object();
  if (j) {
    json_object_object_add(j, "status", json_object_new_string("ready"));
    if (rq->c->ha) { /* which coordinator leads (docs/etcd.md) */
      int lead = __atomic_load_n(&rq->c->leader, __ATOMIC_ACQUIRE);
      json_object_object_add(j, "role", json_object_new_string(
                                            lead ? "leader" : "follower"));
      pthread_mutex_lock(&rq->c->lock);
      json_object_object_add(j, "leader_api",
                             json_object_new_string(rq->c->leader_api));
      /* a follower that knows of no leader says why (changes get 503) */
      if (!lead && rq->c->no_leader) {
        json_object_object_add(j, "no_leader", json_object_new_boolean(1));
        json_object_object_add(j, "why", json_object_new_string(
                                             rq->c->no_leader_why));
      }
      pthread_mutex_unlock(&rq->c->lock);
    }
  }
  reply_encoded(out, 200, j);
}

/* Whether an encoding made at at_ms of registry version `version` must be
 * made again: the registry changed, or it is LIST_CACHE_MS old. */
static int cache_stale(const struct lynx_registry *r, uint64_t version,
                       uint64_t at_ms, uint64_t now) {
  return version != r->version || now - at_ms >= LIST_CACHE_MS;
}

/* Answers a big list from the cache, encoding it first when the registry
 * changed or the cached body is older than LIST_CACHE_MS. */
static void reply_list(struct http_req *rq, struct http_out *out, int which) {
  struct list_cache *lc = &rq->h->cache[which];
  struct lynx_registry *r = &rq->c->reg;
  uint64_t now = lynx_coord_now_ms();
  char *copy = NULL;
  size_t len = 0;
  pthread_mutex_lock(&rq->c->lock);
  if (!lc->body || cache_stale(r, lc->version, lc->at_ms, now)) {
    struct json_object *j = which == CACHE_NODES    ? lynx_json_nodes(r, now)
                            : which == CACHE_ACCELS ? lynx_json_accels(r, now)
                                                    : lynx_json_mqueues(r);
    const char *s = j ? json_object_to_json_string_ext(
                            j, JSON_C_TO_STRING_PLAIN |
                                   JSON_C_TO_STRING_NOSLASHESCAPE)
                      : NULL;
    char *body = s ? malloc(strlen(s) + 2) : NULL;
    if (body) {
      size_t n = strlen(s);
      memcpy(body, s, n);
      body[n++] = '\n';
      body[n] = 0;
      free(lc->body);
      lc->body = body;
      lc->len = n;
      lc->version = r->version;
      lc->at_ms = now;
    }
    json_object_put(j);
  }
  if (lc->body && (copy = malloc(lc->len + 1)) != NULL) {
    memcpy(copy, lc->body, lc->len + 1);
    len = lc->len;
  }
  pthread_mutex_unlock(&rq->c->lock);
  if (!copy) {
    reply_oom(out);
    return;
  }
  out->status = 200;
  out->text = copy;
  out->text_len = len;
  out->ctype = "application/json";
}

#define PAGE_MAX 10000u /* the largest ?limit= */

/* lynx_json_each_by_id's callback: appends one item to a page cache. */
static void page_add(void *arg, const char *node, uint32_t idx,
                     struct json_object *o) {
  struct page_cache *pc = arg;
  const char *t = o ? json_object_to_json_string_ext(
                          o, JSON_C_TO_STRING_PLAIN |
                                 JSON_C_TO_STRING_NOSLASHESCAPE)
                    : NULL;
  size_t tl = t ? strlen(t) : 0;
  if (!t || pc->oom)
    goto out;
  if (pc->n + 2 > pc->n_cap) {
    size_t nc = pc->n_cap ? 2 * pc->n_cap : 256;
    size_t *off = realloc(pc->off, nc * sizeof(*off));
    struct page_key *key = off ? realloc(pc->key, nc * sizeof(*key)) : NULL;
    if (off)
      pc->off = off;
    if (!key)
      goto oom;
    pc->key = key;
    pc->n_cap = nc;
  }
  if (pc->len + tl + 2 > pc->cap) {
    char *b = lynx_grow(pc->body, &pc->cap, pc->len + tl + 2, 65536, 0);
    if (!b)
      goto oom;
    pc->body = b;
  }
  pc->off[pc->n] = pc->len;
  snprintf(pc->key[pc->n].node, sizeof(pc->key[pc->n].node), "%s", node);
  pc->key[pc->n].idx = idx;
  memcpy(pc->body + pc->len, t, tl);
  pc->len += tl;
  pc->body[pc->len++] = ',';
  pc->n++;
  pc->off[pc->n] = pc->len;
  goto out;
oom:
  pc->oom = 1;
out:
  json_object_put(o);
}

/* Whether item key k comes after `after` (node id, and with has_idx an
 * accelerator index on it; without, every accelerator of that node is
 * before). */
static int page_after(const struct page_key *k, const char *node,
                      int has_idx, uint32_t idx) {
  int c = strcmp(k->node, node);
  return c > 0 || (c == 0 && has_idx && k->idx > idx);
}

/* ?limit=N[&after=ID]: one page of a big list, cut from the id-ordered
 * encoding (rebuilt like the list's cache). 1 when answered, 0 when the
 * request asks for the whole list. */
static int reply_page(struct http_req *rq, struct http_out *out, int which) {
  const char *s_limit =
      MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "limit");
  const char *after =
      MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "after");
  struct page_cache *pc = &rq->h->pages[which == CACHE_NODES ? PAGES_NODES
                                                             : PAGES_ACCELS];
  struct lynx_registry *r = &rq->c->reg;
  char node[LYNX_ID_MAX] = "", head[64], *text = NULL, *next = NULL;
  uint64_t limit, now = lynx_coord_now_ms(), idx = 0;
  size_t lo, hi, end, hl, nl = 0, len = 0;
  int has_idx = 0;
  if (!s_limit) {
    if (after)
      reply_err(out, 400, "invalid_argument",
                "after: only with limit (a page of the list)");
    return after != NULL;
  }
  if (lynx_parse_u64(s_limit, 1, PAGE_MAX, &limit)) {
    reply_err(out, 400, "invalid_argument",
              "limit: expected 1 to %u items, got '%.64s'", PAGE_MAX, s_limit);
    return 1;
  }
  if (after && *after) {
    /* accelerators: "node/idx", or a node id (all of its are before) */
    const char *slash = which == CACHE_NODES ? NULL : strrchr(after, '/');
    size_t n = slash ? (size_t)(slash - after) : strlen(after);
    if (n >= sizeof(node) ||
        (slash && lynx_parse_u64(slash + 1, 0, UINT32_MAX, &idx))) {
      reply_err(out, 400, "invalid_argument",
                "after: expected an id as a page's \"next\" gives it, got "
                "'%.64s'", after);
      return 1;
    }
    memcpy(node, after, n);
    node[n] = 0;
    has_idx = slash != NULL;
  }
  pthread_mutex_lock(&rq->c->lock);
  if (!pc->body || pc->oom || cache_stale(r, pc->version, pc->at_ms, now)) {
    pc->len = pc->n = 0;
    pc->oom = 0;
    if (lynx_json_each_by_id(r, now, which != CACHE_NODES, page_add, pc))
      pc->oom = 1;
    pc->version = r->version;
    pc->at_ms = now;
  }
  if (!pc->oom) {
    /* the first item after `after`: items are in key order */
    lo = 0;
    hi = pc->n;
    while (node[0] && lo < hi) {
      size_t mid = lo + (hi - lo) / 2;
      if (page_after(&pc->key[mid], node, has_idx, (uint32_t)idx))
        hi = mid;
      else
        lo = mid + 1;
    }
    end = pc->n - lo > limit ? lo + (size_t)limit : pc->n;
    if (end < pc->n) {
      /* more follow: "next" is the last item's id, JSON-escaped */
      char id[LYNX_ID_MAX + 16];
      struct json_object *js;
      if (which == CACHE_NODES)
        snprintf(id, sizeof(id), "%s", pc->key[end - 1].node);
      else
        snprintf(id, sizeof(id), "%s/%" PRIu32, pc->key[end - 1].node,
                 pc->key[end - 1].idx);
      js = json_object_new_string(id);
      next = js ? strdup(json_object_to_json_string_ext(
                      js, JSON_C_TO_STRING_PLAIN |
                              JSON_C_TO_STRING_NOSLASHESCAPE))
                : NULL;
      json_object_put(js);
      nl = next ? strlen(next) : 0;
    }
    hl = (size_t)snprintf(head, sizeof(head), "{\"version\":%" PRIu64
                          ",\"items\":[", pc->version);
    /* the slice, less the comma after its last item */
    len = lo < end ? pc->off[end] - 1 - pc->off[lo] : 0;
    if (end == pc->n || next)
      text = malloc(hl + len + nl + 16);
    if (text) {
      size_t o = 0;
      memcpy(text, head, hl);
      o += hl;
      if (len) /* (no body at all while the list is empty) */
        memcpy(text + o, pc->body + pc->off[lo], len);
      o += len;
      text[o++] = ']';
      if (next) {
        memcpy(text + o, ",\"next\":", 8);
        o += 8;
        memcpy(text + o, next, nl);
        o += nl;
      }
      text[o++] = '}';
      text[o++] = '\n';
      text[o] = 0;
      len = o;
    }
  }
  pthread_mutex_unlock(&rq->c->lock);
  free(next);
  if (!text) {
    reply_oom(out);
    return 1;
  }
  out->status = 200;
  out->text = text;
  out->text_len = len;
  out->ctype = "application/json";
  return 1;
}

static void h_nodes(struct http_req *rq, struct http_out *out) {
  if (!reply_page(rq, out, CACHE_NODES))
    reply_list(rq, out, CACHE_NODES);
}

static void h_node(struct http_req *rq, struct http_out *out) {
  struct json_object *j = NULL;
  struct lynx_reg_node *n;
  pthread_mutex_lock(&rq->c->lock);
  n = lynx_reg_node_find(&rq->c->reg, rq->params[0]);
  if (n)
    j = lynx_json_node(&rq->c->reg, n, lynx_coord_now_ms());
  pthread_mutex_unlock(&rq->c->lock);
  if (!n)
    reply_err(out, 404, "not_found", "node '%s' not found", rq->params[0]);
  else
    reply_encoded(out, 200, j);
}

static void h_accels(struct http_req *rq, struct http_out *out) {
  if (!reply_page(rq, out, CACHE_ACCELS))
    reply_list(rq, out, CACHE_ACCELS);
}

static void h_mqueues(struct http_req *rq, struct http_out *out) {
  reply_list(rq, out, CACHE_MQUEUES);
}

static void h_services(struct http_req *rq, struct http_out *out) {
  struct json_object *j;
  pthread_mutex_lock(&rq->c->lock);
  j = lynx_json_services(&rq->c->reg, rq->unknown[0] ? rq->unknown : NULL);
  pthread_mutex_unlock(&rq->c->lock);
  reply_encoded(out, 200, j);
}

static void h_service(struct http_req *rq, struct http_out *out) {
  struct json_object *j = NULL;
  struct lynx_reg_service *s;
  pthread_mutex_lock(&rq->c->lock);
  s = lynx_reg_service_find(&rq->c->reg, rq->params[0]);
  if (s)
    j = lynx_json_service(&rq->c->reg, s, rq->unknown[0] ? rq->unknown : NULL);
  pthread_mutex_unlock(&rq->c->lock);
  if (!s)
    reply_err(out, 404, "not_found", "service '%s' not found", rq->params[0]);
  else
    reply_encoded(out, 200, j);
}

static void h_frontends(struct http_req *rq, struct http_out *out) {
  struct json_object *j;
  pthread_mutex_lock(&rq->c->lock);
  j = lynx_json_frontends(&rq->c->reg, lynx_coord_now_ms());
  pthread_mutex_unlock(&rq->c->lock);
  reply_encoded(out, 200, j);
}

/* ---- /metrics ----------------------------------------------------------- */

/* One accelerator's health series, copied under the lock. */
struct metrics_accel {
  char node[LYNX_ID_MAX];
  uint32_t idx;
  int dispatchable;
  uint32_t stalled_mqueues;
  uint64_t outages;
};

/* lynx_node_*: one series per registered node. */
struct metrics_node {
  char id[LYNX_ID_MAX];
  enum lynx_node_state state;
  int64_t lease_left_ms; /* until its lease runs out (not for down nodes) */
};

struct metrics_snap {
  int leader, no_leader;
  uint64_t lease_ms;
  uint64_t n_nodes;
  struct metrics_node *nodes_v; /* n_nodes entries, or NULL (no memory) */
  struct lynx_hc_stats api; /* the API's connections */
  unsigned api_watches;     /* parked watches */
  uint64_t nodes[4];
  uint64_t accels, requests, responses;
  uint64_t services, frontends, frontends_active;
  uint64_t fe_assigned, fe_moves;
  uint64_t version, table_version;
  uint64_t lease_expiries, table_pushes, registrations, refused_epochs;
  uint64_t new_incarnations, pauses, paused_ms, moves_started, moves_done;
  uint64_t suspect, suspicions, unsure_refusals, suspect_ms;
  struct metrics_accel *acc; /* m.accels entries, or NULL (out of memory) */
};

/* lynx_accel_*: one series per accelerator of every registered node. */
static void metrics_accels(FILE *f, const struct metrics_snap *m) {
  static const struct {
    const char *name, *type, *help;
  } fam[] = {
      {"lynx_accel_dispatchable", "gauge",
       "1 when the accelerator's health lets it take requests (not lost, not "
       "failed, no stalled mqueue), else 0; its node's state is separate."},
      {"lynx_accel_stalled_mqueues", "gauge",
       "Mqueues of the accelerator with a request pending whose consumer has "
       "not moved for the agent's stall period."},
      {"lynx_accel_health_outages_total", "counter",
       "Times the accelerator went out of dispatch for its health."},
  };
  if (!m->acc)
    return;
  for (size_t k = 0; k < LYNX_ARRAY_SIZE(fam); k++) {
    lynx_prom_family(f, fam[k].name, fam[k].type, fam[k].help);
    for (uint64_t i = 0; i < m->accels; i++) {
      const struct metrics_accel *a = &m->acc[i];
      uint64_t v = k == 0 ? (uint64_t)(a->dispatchable ? 1 : 0)
                   : k == 1 ? a->stalled_mqueues
                            : a->outages;
      char idx[16];
      snprintf(idx, sizeof(idx), "%" PRIu32, a->idx);
      lynx_prom_u64(f, fam[k].name,
                    (const struct lynx_prom_label[]){{"node", a->node},
                                                     {"accel", idx},
                                                     {NULL, NULL}},
                    v);
    }
  }
}

static const char *const node_states[4] = {"ready", "draining", "drained",
                                           "down"};

/* lynx_node_state (1 for the node's state, 0 for the others) and
 * lynx_node_lease_remaining_seconds (nodes not down): what alerts on a
 * node going down or missing heartbeats name the node by. */
static void metrics_nodes(FILE *f, const struct metrics_snap *m) {
  if (!m->nodes_v)
    return;
  lynx_prom_family(f, "lynx_node_state", "gauge",
                   "1 for the node's state (ready, draining, drained, down), "
                   "0 for the others.");
  for (uint64_t i = 0; i < m->n_nodes; i++)
    for (int k = 0; k < 4; k++)
      lynx_prom_u64(f, "lynx_node_state",
                    (const struct lynx_prom_label[]){
                        {"node", m->nodes_v[i].id},
                        {"state", node_states[k]},
                        {NULL, NULL}},
                    (unsigned)m->nodes_v[i].state == (unsigned)k);
  lynx_prom_family(f, "lynx_node_lease_remaining_seconds", "gauge",
                   "Time until the node's lease runs out unless a heartbeat "
                   "renews it (heartbeats come every third of a lease); "
                   "nodes that are down have none.");
  for (uint64_t i = 0; i < m->n_nodes; i++)
    if (m->nodes_v[i].state != LYNX_NODE_DOWN)
      lynx_prom_double(f, "lynx_node_lease_remaining_seconds",
                       (const struct lynx_prom_label[]){
                           {"node", m->nodes_v[i].id}, {NULL, NULL}},
                       (double)m->nodes_v[i].lease_left_ms / 1000.0, 3);
}

static void h_metrics(struct http_req *rq, struct http_out *out) {
  struct metrics_snap m;
  const struct lynx_registry *r = &rq->c->reg;
  char *buf = NULL;
  size_t len = 0;
  FILE *f;
  uint64_t now_ms = lynx_coord_now_ms(), k;

  memset(&m, 0, sizeof(m));
  pthread_mutex_lock(&rq->c->lock);
  m.leader = !rq->c->ha || __atomic_load_n(&rq->c->leader, __ATOMIC_ACQUIRE);
  m.no_leader = rq->c->ha && !m.leader && rq->c->no_leader;
  m.lease_ms = r->lease_ms;
  for (const struct lynx_reg_node *n = r->nodes; n; n = n->next)
    m.n_nodes++;
  m.nodes_v = m.n_nodes ? calloc(m.n_nodes, sizeof(*m.nodes_v)) : NULL;
  k = 0;
  for (const struct lynx_reg_node *n = r->nodes; n; n = n->next, k++) {
    if (m.nodes_v) {
      struct metrics_node *v = &m.nodes_v[k];
      snprintf(v->id, sizeof(v->id), "%s", n->id);
      v->state = n->state;
      v->lease_left_ms = (int64_t)n->lease_deadline_ms - (int64_t)now_ms;
    }
    if ((unsigned)n->state < 4)
      m.nodes[n->state]++;
    m.suspect += n->suspect != 0;
    m.accels += n->n_accels;
    for (uint32_t i = 0; i < n->n_accels && i < LYNX_ACCELS_MAX; i++) {
      m.requests += n->accels[i].requests;
      m.responses += n->accels[i].responses;
    }
  }
  /* the per-accelerator series are formatted after the lock is released;
   * without memory for the copy they are left out, the rest still answers */
  m.acc = m.accels ? calloc(m.accels, sizeof(*m.acc)) : NULL;
  if (m.acc) {
    k = 0;
    for (const struct lynx_reg_node *n = r->nodes; n; n = n->next)
      for (uint32_t i = 0; i < n->n_accels && i < LYNX_ACCELS_MAX; i++, k++) {
        const struct lynx_reg_accel *a = &n->accels[i];
        snprintf(m.acc[k].node, sizeof(m.acc[k].node), "%s", n->id);
        m.acc[k].idx = a->info.idx;
        m.acc[k].dispatchable = lynx_reg_accel_dispatchable(a);
        m.acc[k].stalled_mqueues = a->stalled_mqueues;
        m.acc[k].outages = a->health_outages;
      }
  }
  for (const struct lynx_reg_service *s = r->services; s; s = s->next)
    m.services++;
  for (const struct lynx_reg_frontend *fe = r->frontends; fe; fe = fe->next) {
    m.frontends += fe->connected ? 1 : 0;
    m.frontends_active += fe->connected && fe->active;
  }
  m.fe_assigned = r->fe_assigned;
  m.fe_moves = r->fe_moves;
  m.version = r->version;
  m.table_version = r->table_version;
  m.lease_expiries = r->lease_expiries;
  m.table_pushes = r->table_pushes;
  m.registrations = r->registrations;
  m.refused_epochs = r->refused_epochs;
  m.new_incarnations = r->new_incarnations;
  m.moves_started = r->moves_started;
  m.moves_done = r->moves_done;
  m.pauses = r->pauses;
  m.paused_ms = r->paused_ms;
  m.suspicions = r->suspicions;
  m.suspect_ms = lynx_reg_suspect_ms(r);
  m.unsure_refusals = __atomic_load_n(&rq->c->unsure_refusals,
                                      __ATOMIC_RELAXED);
  m.api_watches = rq->h->n_watchers;
  pthread_mutex_unlock(&rq->c->lock);
  lynx_hc_stats(rq->h->hc, &m.api);

  f = open_memstream(&buf, &len);
  if (!f) {
    free(m.nodes_v);
    free(m.acc);
    reply_oom(out);
    return;
  }
  lynx_prom_family(f, "lynx_coordinator_nodes", "gauge",
                   "Registered nodes by state.");
  for (int i = 0; i < 4; i++)
    lynx_prom_u64(f, "lynx_coordinator_nodes",
                  (const struct lynx_prom_label[]){{"state", node_states[i]},
                                                   {NULL, NULL}},
                  m.nodes[i]);
#define ONE(type, name, help, v)                                               \
  do {                                                                         \
    lynx_prom_family(f, name, type, help);                                     \
    lynx_prom_u64(f, name, NULL, v);                                           \
  } while (0)
#define GAUGE(name, help, v) ONE("gauge", name, help, v)
#define COUNTER(name, help, v) ONE("counter", name, help, v)
  GAUGE("lynx_coordinator_accelerators",
        "Accelerators of registered nodes (any state).", m.accels);
  COUNTER("lynx_coordinator_requests_total",
          "Requests reported by the accelerators' heartbeats, summed.",
          m.requests);
  COUNTER("lynx_coordinator_responses_total",
          "Responses reported by the accelerators' heartbeats, summed.",
          m.responses);
  COUNTER("lynx_coordinator_lease_expiries_total",
          "Nodes marked down because their lease expired.", m.lease_expiries);
  GAUGE("lynx_coordinator_nodes_suspect",
        "Nodes silent past their heartbeat lease (--suspect-ms): out of the "
        "dispatch tables until heard again, not down yet.",
        m.suspect);
  COUNTER("lynx_coordinator_suspicions_total",
          "Times a node went suspect (silent past --suspect-ms).",
          m.suspicions);
  COUNTER("lynx_coordinator_unsure_refusals_total",
          "Hellos, messages and connections of agents and frontends refused "
          "because this leader was not sure it still led (it did not run, "
          "or etcd did not answer, past what it could vouch for).",
          m.unsure_refusals);
  COUNTER("lynx_coordinator_table_pushes_total",
          "Dispatch tables pushed to frontends.", m.table_pushes);
  COUNTER("lynx_coordinator_registrations_total",
          "Agent registrations accepted.", m.registrations);
  COUNTER("lynx_coordinator_refused_epochs_total",
          "Agent messages refused for carrying an old epoch.",
          m.refused_epochs);
  COUNTER("lynx_coordinator_new_incarnations_total",
          "Re-registrations of a declared-down epoch sent back to register "
          "as a new incarnation.",
          m.new_incarnations);
  COUNTER("lynx_coordinator_replica_moves_started_total",
          "Replicas given a replacement on a node the placement prefers "
          "(replicas follow capacity).",
          m.moves_started);
  COUNTER("lynx_coordinator_replica_moves_done_total",
          "Moved-away replicas stopped once quiet (or at the drain "
          "timeout).",
          m.moves_done);
  COUNTER("lynx_coordinator_pauses_total",
          "Times the coordinator found it had not run for more than two "
          "ticks (stopped, starved) and extended every lease by the gap.",
          m.pauses);
  lynx_prom_family(f, "lynx_coordinator_paused_seconds_total", "counter",
                   "Time credited to leases for such pauses.");
  lynx_prom_double(f, "lynx_coordinator_paused_seconds_total", NULL,
                   (double)m.paused_ms / 1000.0, 3);
  GAUGE("lynx_coordinator_leader",
        "1 while this coordinator leads (always, without --etcd), 0 for a "
        "follower.",
        (uint64_t)m.leader);
  GAUGE("lynx_coordinator_no_leader",
        "1 while this follower knows of no leader (an election under way, "
        "or etcd without a quorum: the API answers 503 no_leader).",
        (uint64_t)m.no_leader);
  lynx_prom_family(f, "lynx_coordinator_lease_seconds", "gauge",
                   "The agents' lease (--lease-ms).");
  lynx_prom_double(f, "lynx_coordinator_lease_seconds", NULL,
                   (double)m.lease_ms / 1000.0, 3);
  lynx_prom_family(f, "lynx_coordinator_suspect_seconds", "gauge",
                   "The agents' heartbeat lease (--suspect-ms).");
  lynx_prom_double(f, "lynx_coordinator_suspect_seconds", NULL,
                   (double)m.suspect_ms / 1000.0, 3);
  GAUGE("lynx_coordinator_registry_version",
        "Registry version (grows on every observable change).", m.version);
  GAUGE("lynx_coordinator_table_version", "Dispatch table version.",
        m.table_version);
  GAUGE("lynx_coordinator_services", "Services defined.", m.services);
  GAUGE("lynx_coordinator_frontends", "Frontends connected.", m.frontends);
  GAUGE("lynx_coordinator_frontends_active",
        "Frontends the instances are partitioned among (the others are "
        "standbys).",
        m.frontends_active);
  COUNTER("lynx_coordinator_frontend_assignments_total",
          "Instances given to an active frontend, each with a new epoch "
          "that fences its earlier producers.",
          m.fe_assigned);
  COUNTER("lynx_coordinator_frontend_moves_total",
          "Instances released by a live frontend (it answered what it held "
          "on them, or the drain timeout passed) to go to another.",
          m.fe_moves);
  lynx_hc_metrics(f, "lynx_coordinator_api", "--http", &m.api);
  GAUGE("lynx_coordinator_api_watches",
        "GET /v1/watch long polls waiting for a change (each holds a "
        "connection, no thread).",
        m.api_watches);
#undef GAUGE
#undef COUNTER
#undef ONE
  lynx_guard_metrics(f, "lynx_coordinator_control", "control port",
                     &rq->c->ctl_guard);
  metrics_nodes(f, &m);
  metrics_accels(f, &m);
  free(m.nodes_v);
  free(m.acc);
  if (fclose(f) != 0 || !buf) {
    free(buf);
    reply_oom(out);
    return;
  }
  out->status = 200;
  out->text = buf;
  out->text_len = len;
  out->ctype = "text/plain; version=0.0.4; charset=utf-8";
}

/* ---- /v1/watch ---------------------------------------------------------- */

/* GET /v1/watch[?since=V[&timeout_ms=T]]: the registry version, at once
 * without since or when it is no longer since (a version below since
 * comes from a restarted coordinator: answered at once too, so that the
 * client resynchronises instead of waiting for a number it may never see
 * again); else when it changes or after T ms (WATCH_DEFAULT_MS, at most
 * WATCH_MAX_MS). A waiting watch holds no thread: it is parked among the
 * watchers, its connection suspended, and the watch thread answers it. */
static void h_watch(struct http_req *rq, struct http_out *out) {
  struct lynx_coord *c = rq->c;
  struct http *h = rq->h;
  const char *s_since =
      MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "since");
  const char *s_to = MHD_lookup_connection_value(
      rq->conn, MHD_GET_ARGUMENT_KIND, "timeout_ms");
  uint64_t since = 0, timeout = WATCH_DEFAULT_MS, v;
  struct json_object *j;

  if (s_since && lynx_parse_u64(s_since, 0, UINT64_MAX, &since)) {
    reply_err(out, 400, "invalid_argument",
              "since: expected a registry version (unsigned integer), got "
              "'%.64s'",
              s_since);
    return;
  }
  if (s_to && lynx_parse_u64(s_to, 0, UINT64_MAX, &timeout)) {
    reply_err(out, 400, "invalid_argument",
              "timeout_ms: expected milliseconds (unsigned integer), got "
              "'%.64s'",
              s_to);
    return;
  }
  if (timeout > WATCH_MAX_MS)
    timeout = WATCH_MAX_MS;

  pthread_mutex_lock(&c->lock);
  /* stopping is set under c->lock before the watch thread is told to end,
   * so no watcher is parked after it ended */
  if (s_since && c->reg.version == since &&
      !__atomic_load_n(&h->stopping, __ATOMIC_ACQUIRE) && rq->result) {
    rq->since = since;
    rq->watch_deadline_ns = lynx_now_ns() + timeout * 1000000u;
    rq->parked = 1;
    rq->next = h->watchers;
    h->watchers = rq;
    h->n_watchers++;
    lynx_hc_phase(h->hc, rq->conn, LYNX_HC_WAIT);
    if (rq->watch_deadline_ns < h->watch_at_ns)
      pthread_cond_broadcast(&c->changed); /* the watch thread, sooner */
    pthread_mutex_unlock(&c->lock);
    return;
  }
  v = c->reg.version;
  pthread_mutex_unlock(&c->lock);
  j = json_object_new_object();
  if (j)
    json_object_object_add(j, "version", json_object_new_uint64(v));
  reply_encoded(out, 200, j);
}

static void resume(struct http_req *rq);

/* The watch thread: answers every parked watcher whose version moved,
 * whose time is up or whose connection was shed at a cap (closed after
 * its answer), and all of them once the server stops. It sleeps on
 * c->changed, which every change of the registry's version broadcasts,
 * until the earliest deadline (at most WATCH_IDLE_MS). */
static void *watch_main(void *arg) {
  struct http *h = arg;
  struct lynx_coord *c = h->c;
  pthread_mutex_lock(&c->lock);
  for (;;) {
    int stop = __atomic_load_n(&h->stopping, __ATOMIC_ACQUIRE);
    uint64_t now = lynx_now_ns(), next = now + WATCH_IDLE_MS * 1000000ull;
    struct http_req *ready = NULL, **pp = &h->watchers;
    struct timespec ts;
    while (*pp) {
      struct http_req *w = *pp;
      int shed = lynx_hc_was_shed(h->hc, w->conn);
      if (stop || shed || c->reg.version != w->since ||
          now >= w->watch_deadline_ns) {
        struct json_object *j = json_object_new_object();
        if (j)
          json_object_object_add(j, "version",
                                 json_object_new_uint64(c->reg.version));
        reply_encoded(w->result, 200, j); /* a shed one closes after */
        h->n_watchers--;
        *pp = w->next;
        w->next = ready;
        ready = w;
        continue;
      }
      if (w->watch_deadline_ns < next)
        next = w->watch_deadline_ns;
      pp = &w->next;
    }
    h->watch_at_ns = next;
    if (ready) {
      /* resumed without c->lock: libmicrohttpd's own lock comes after */
      pthread_mutex_unlock(&c->lock);
      while (ready) {
        struct http_req *w = ready;
        ready = w->next;
        resume(w);
      }
      pthread_mutex_lock(&c->lock);
      continue; /* watchers parked meanwhile are looked at */
    }
    if (stop)
      break;
    ts.tv_sec = (time_t)(next / 1000000000u);
    ts.tv_nsec = (long)(next % 1000000000u);
    pthread_cond_clockwait(&c->changed, &c->lock, CLOCK_MONOTONIC, &ts);
  }
  pthread_mutex_unlock(&c->lock);
  return NULL;
}

/* The connection tracker shed watchers at a cap (httpconn.h: the
 * server's thread, no lock held): the watch thread answers them now. */
static void watch_wake(void *arg) {
  struct http *h = arg;
  pthread_mutex_lock(&h->c->lock);
  pthread_cond_broadcast(&h->c->changed);
  pthread_mutex_unlock(&h->c->lock);
}

/* GET /v1/events?since=S&limit=N: the kept events with seq >= S, oldest
 * first, at most N (default 100, at most 1000), and next, the seq to ask
 * for next time. A since beyond what this coordinator has issued comes
 * from a client of an earlier coordinator (restarted, or another leader):
 * answered from the oldest kept, so that it resynchronises. */
#define EVENTS_LIMIT_DEFAULT 100u
#define EVENTS_LIMIT_MAX 1000u
static void h_events(struct http_req *rq, struct http_out *out) {
  struct lynx_coord *c = rq->c;
  const char *s_since =
      MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "since");
  const char *s_limit =
      MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "limit");
  uint64_t since = 0, limit = EVENTS_LIMIT_DEFAULT, seq, oldest, n = 0;
  struct json_object *j, *items;

  if (s_since && lynx_parse_u64(s_since, 0, UINT64_MAX, &since)) {
    reply_err(out, 400, "invalid_argument",
              "since: expected an event seq (unsigned integer), got '%.64s'",
              s_since);
    return;
  }
  if (s_limit && lynx_parse_u64(s_limit, 1, EVENTS_LIMIT_MAX, &limit)) {
    reply_err(out, 400, "invalid_argument",
              "limit: expected 1 to %u, got '%.64s'", EVENTS_LIMIT_MAX,
              s_limit);
    return;
  }
  j = json_object_new_object();
  items = json_object_new_array();
  if (!j || !items) {
    json_object_put(j);
    json_object_put(items);
    reply_oom(out);
    return;
  }
  pthread_mutex_lock(&c->lock);
  oldest = lynx_ev_oldest(&c->reg.ev);
  seq = since > (c->reg.ev.next_seq ? c->reg.ev.next_seq : 1) || since < oldest
            ? oldest
            : since;
  for (; seq < c->reg.ev.next_seq && n < limit; seq++) {
    const struct lynx_event *ev = lynx_ev_get(&c->reg.ev, seq);
    struct json_object *e;
    if (!ev)
      continue; /* lost for want of memory */
    e = json_object_new_object();
    if (!e)
      break; /* next says where to resume */
    json_object_object_add(e, "seq", json_object_new_uint64(ev->seq));
    json_object_object_add(e, "time_ms", json_object_new_uint64(ev->time_ms));
    json_object_object_add(e, "kind",
                           json_object_new_string(lynx_ev_kind_name(ev->kind)));
    json_object_object_add(e, "subject", json_object_new_string(ev->subject));
    json_object_object_add(e, "message", json_object_new_string(ev->message));
    json_object_array_add(items, e);
    n++;
  }
  json_object_object_add(j, "version", json_object_new_uint64(c->reg.version));
  pthread_mutex_unlock(&c->lock);
  json_object_object_add(j, "next", json_object_new_uint64(seq));
  json_object_object_add(j, "items", items);
  reply_encoded(out, 200, j);
}

/* GET /ui/ and /ui/{file}: the web console (ui.h, docs/console.md). */
static void h_ui(struct http_req *rq, struct http_out *out) {
  const char *name = rq->params[0][0] ? rq->params[0] : "index.html";
  for (const struct lynx_ui_file *f = lynx_ui_files; f->name; f++) {
    if (strcmp(f->name, name) != 0)
      continue;
    out->text = malloc(f->len ? f->len : 1);
    if (!out->text) {
      reply_oom(out);
      return;
    }
    memcpy(out->text, f->data, f->len);
    out->text_len = f->len;
    out->status = 200;
    out->ctype = f->type;
    out->page = 1;
    return;
  }
  reply_err(out, 404, "not_found", "the console has no file '%.64s'", name);
}

/* ---- mutating endpoints ------------------------------------------------- */

struct json_object *lynx_http_body_parse(const char *body, size_t len,
                                         unsigned *status, char *msg,
                                         size_t msglen) {
  struct json_tokener *tok;
  struct json_object *j;
  enum json_tokener_error jerr;
  size_t end, line = 1, col = 1;

  *status = 400;
  if (!body || len == 0) {
    snprintf(msg, msglen, "empty body: expected a JSON object");
    return NULL;
  }
  if (len > (size_t)INT32_MAX) { /* json-c takes an int length */
    *status = 413;
    snprintf(msg, msglen, "body too large");
    return NULL;
  }
  tok = json_tokener_new();
  if (!tok)
    goto oom;
  json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
  j = json_tokener_parse_ex(tok, body, (int)len);
  jerr = json_tokener_get_error(tok);
  end = json_tokener_get_parse_end(tok);
  json_tokener_free(tok);
  if (end > len)
    end = len;
  for (size_t i = 0; i < end; i++) {
    if (body[i] == '\n') {
      line++;
      col = 1;
    } else {
      col++;
    }
  }
  if (jerr == json_tokener_continue || (!j && jerr == json_tokener_success)) {
    snprintf(msg, msglen,
             "malformed JSON: unexpected end of input at line %zu, column "
             "%zu (offset %zu)",
             line, col, end);
    return NULL;
  }
  if (jerr != json_tokener_success) {
    json_object_put(j);
    snprintf(msg, msglen,
             "malformed JSON at line %zu, column %zu (offset %zu): %s", line,
             col, end, json_tokener_error_desc(jerr));
    return NULL;
  }
  for (size_t i = end; i < len; i++) {
    if (!isspace((unsigned char)body[i])) {
      json_object_put(j);
      snprintf(msg, msglen,
               "malformed JSON: unexpected data after the JSON value at "
               "line %zu, column %zu (offset %zu)",
               line, col, i);
      return NULL;
    }
  }
  {
    /* json-c kept the last of two equal keys: refuse them instead */
    char key[96];
    int dl = 0, dc = 0, dup;
    dup = lynx_json_dup_key(body, len, key, sizeof(key), &dl, &dc);
    if (dup == -EILSEQ) {
      json_object_put(j);
      snprintf(msg, msglen,
               "a key holds a NUL character (\\u0000) at line %d, column "
               "%d: keys are cut there, and two could be one",
               dl, dc);
      return NULL;
    }
    if (dup) {
      json_object_put(j);
      if (dup != -EEXIST)
        goto oom;
      snprintf(msg, msglen,
               "duplicate key \"%s\" at line %d, column %d: a key may "
               "appear only once in an object",
               key, dl, dc);
      return NULL;
    }
  }
  if (!json_object_is_type(j, json_type_object)) {
    snprintf(msg, msglen, "body: expected a JSON object, got %s",
             json_type_to_name(json_object_get_type(j)));
    json_object_put(j);
    return NULL;
  }
  return j;
oom:
  *status = 500;
  snprintf(msg, msglen, "out of memory");
  return NULL;
}

/* Parses the request body as one JSON object (lynx_http_body_parse). NULL
 * with the refusal in out. */
static struct json_object *parse_body(struct http_req *rq,
                                      struct http_out *out) {
  char msg[512];
  unsigned status;
  struct json_object *j =
      lynx_http_body_parse(rq->body, rq->len, &status, msg, sizeof(msg));
  if (!j)
    reply_err(out, status,
              status == 413   ? "payload_too_large"
              : status == 500 ? "internal"
                              : "invalid_argument",
              "%s", msg);
  return j;
}

static int url_safe(const char *s) {
  for (; *s; s++)
    if (!isalnum((unsigned char)*s) && !strchr("._-~", *s))
      return 0;
  return 1;
}

static void h_service_create(struct http_req *rq, struct http_out *out) {
  struct lynx_service_spec spec;
  struct lynx_reg_err err;
  struct lynx_reg_service *s;
  struct json_object *body, *j = NULL;
  int rc;

  body = parse_body(rq, out);
  if (!body)
    return;
  memset(&spec, 0, sizeof(spec));
  memset(&err, 0, sizeof(err));
  rc = lynx_json_service_spec(body, &spec, &err);
  json_object_put(body);
  if (rc) {
    reply_reg_err(out, rc, &err);
    return;
  }
  change_begin(rq);
  rc = lynx_reg_service_prepare(&rq->c->reg, &spec, &s, &err);
  if (rc == 0) {
    struct lynx_state_edit edit = {.add_service = &s->spec};
    /* services change only under change_lock: prepared still holds */
    if (save_first(rq, out, "service create", &edit)) {
      change_end(rq);
      free(s);
      return;
    }
    lynx_reg_service_add(&rq->c->reg, s, lynx_coord_now_ms());
    lynx_ev_add(&rq->c->reg.ev, LYNX_EV_SERVICE_CREATED, spec.name,
                "service %s created (%s on port %u)", spec.name, spec.app,
                (unsigned)spec.port);
    lynx_coord_changed(rq->c);
    j = lynx_json_service(&rq->c->reg, s, NULL);
  }
  change_end(rq);
  if (rc) {
    reply_reg_err(out, rc, &err);
    return;
  }
  LYNX_INFO(COMP, "service %s created (port %u, app %s)", spec.name, spec.port,
            spec.app);
  if (url_safe(spec.name))
    snprintf(out->location, sizeof(out->location), "/v1/services/%s",
             spec.name);
  reply_encoded(out, 201, j);
}

/* Finishes a change of operator intent, saved first (save_first) and then
 * applied under c->lock, and releases the locks (change_end): on success
 * (rc 0) wakes the watchers and answers status with j; otherwise answers
 * the registry's error, and when the change was saved (saved) puts the
 * store back to the state as it is. Takes j (may be NULL on error). */
static void finish_mutation(struct http_req *rq, struct http_out *out, int rc,
                            const struct lynx_reg_err *err,
                            struct json_object *j, const char *what,
                            unsigned status, int saved) {
  if (rc == 0)
    lynx_coord_changed(rq->c);
  else if (saved)
    store_undo(rq, what);
  change_end(rq);
  if (rc) {
    json_object_put(j);
    reply_reg_err(out, rc, err);
    return;
  }
  LYNX_INFO(COMP, "%s %s", what, rq->params[0]);
  reply_encoded(out, status, j);
}

/* 200 with the service as it was just before it was deleted. */
static void h_service_delete(struct http_req *rq, struct http_out *out) {
  struct lynx_state_edit edit = {.del_service = rq->params[0]};
  struct lynx_reg_err err;
  struct lynx_reg_service *s;
  struct json_object *j;
  int rc;

  memset(&err, 0, sizeof(err));
  change_begin(rq);
  s = lynx_reg_service_find(&rq->c->reg, rq->params[0]);
  if (!s) {
    change_end(rq);
    reply_err(out, 404, "not_found", "service '%s' not found", rq->params[0]);
    return;
  }
  if (save_first(rq, out, "service delete", &edit)) {
    change_end(rq);
    return;
  }
  /* services change only under change_lock: still there */
  s = lynx_reg_service_find(&rq->c->reg, rq->params[0]);
  j = s ? lynx_json_service(&rq->c->reg, s, NULL) : NULL;
  rc = lynx_reg_service_delete(&rq->c->reg, rq->params[0], lynx_coord_now_ms(),
                               &err);
  if (rc == 0)
    lynx_ev_add(&rq->c->reg.ev, LYNX_EV_SERVICE_DELETED, rq->params[0],
                "service %s deleted: its instances stop", rq->params[0]);
  finish_mutation(rq, out, rc, &err, j, "service delete", 200, 1);
}

/* drain / undrain: 200 with the node as it is afterwards. */
static void node_op(struct http_req *rq, struct http_out *out, int drain) {
  const char *what = drain ? "node drain" : "node undrain";
  struct lynx_state_edit edit = {0};
  struct lynx_reg_err err;
  struct lynx_reg_node *n;
  struct json_object *j = NULL;
  uint64_t now = lynx_coord_now_ms();
  int rc, saved = 0;

  memset(&err, 0, sizeof(err));
  change_begin(rq);
  if (!lynx_reg_node_find(&rq->c->reg, rq->params[0])) {
    change_end(rq);
    reply_err(out, 404, "not_found", "node '%s' not found", rq->params[0]);
    return;
  }
  rc = drain ? lynx_reg_drain_check(&rq->c->reg, rq->params[0], &n, &err)
             : lynx_reg_undrain_check(&rq->c->reg, rq->params[0], &n, &err);
  if (rc == 0) {
    if (drain)
      edit.add_drained = rq->params[0];
    else
      edit.del_drained = rq->params[0];
    if (save_first(rq, out, what, &edit)) {
      change_end(rq);
      return;
    }
    saved = 1;
    /* checked again: the node may have gone down or away meanwhile */
    rc = drain ? lynx_reg_drain(&rq->c->reg, rq->params[0], now, &err)
               : lynx_reg_undrain(&rq->c->reg, rq->params[0], now, &err);
  }
  if (rc == 0 && (n = lynx_reg_node_find(&rq->c->reg, rq->params[0])) != NULL)
    j = lynx_json_node(&rq->c->reg, n, now);
  finish_mutation(rq, out, rc, &err, j, what, 200, saved);
}

static void h_node_drain(struct http_req *rq, struct http_out *out) {
  node_op(rq, out, 1);
}

static void h_node_undrain(struct http_req *rq, struct http_out *out) {
  node_op(rq, out, 0);
}

/* A frontend drained or undrained: 200 with the frontend. The intent is
 * runtime state (like the frontend itself): not saved. */
static void frontend_op(struct http_req *rq, struct http_out *out, int drain) {
  struct lynx_reg_err err;
  struct lynx_reg_frontend *f;
  struct json_object *j = NULL;
  int rc;

  memset(&err, 0, sizeof(err));
  pthread_mutex_lock(&rq->c->lock);
  rc = lynx_reg_frontend_drain(&rq->c->reg, rq->params[0], drain, &err);
  if (rc == 0 &&
      (f = lynx_reg_frontend_find(&rq->c->reg, rq->params[0])) != NULL)
    j = lynx_json_frontend(&rq->c->reg, f, lynx_coord_now_ms());
  if (rc == 0)
    lynx_coord_changed(rq->c);
  pthread_mutex_unlock(&rq->c->lock);
  if (rc) {
    json_object_put(j);
    reply_reg_err(out, rc, &err);
    return;
  }
  LYNX_INFO(COMP, "frontend %s %s", drain ? "drain" : "undrain",
            rq->params[0]);
  reply_encoded(out, 200, j);
}

static void h_frontend_drain(struct http_req *rq, struct http_out *out) {
  frontend_op(rq, out, 1);
}

static void h_frontend_undrain(struct http_req *rq, struct http_out *out) {
  frontend_op(rq, out, 0);
}

/* Forget a down node: 200 with the node as it was. Its drain intent, if
 * any, leaves the state file with it. */
static void h_node_forget(struct http_req *rq, struct http_out *out) {
  struct lynx_reg_err err;
  struct lynx_reg_node *n;
  struct json_object *j = NULL;
  int rc, saved = 0;

  memset(&err, 0, sizeof(err));
  change_begin(rq);
  n = lynx_reg_node_find(&rq->c->reg, rq->params[0]);
  if (!n) {
    change_end(rq);
    reply_err(out, 404, "not_found", "node '%s' not found", rq->params[0]);
    return;
  }
  rc = lynx_reg_forget_check(&rq->c->reg, rq->params[0], &n, &err);
  if (rc == 0) {
    struct lynx_state_edit edit = {.del_drained = rq->params[0]};
    if (save_first(rq, out, "node forget", &edit)) {
      change_end(rq);
      return;
    }
    saved = 1;
    /* checked again: the node may have come back meanwhile */
    rc = lynx_reg_forget_check(&rq->c->reg, rq->params[0], &n, &err);
    if (rc == 0) {
      j = lynx_json_node(&rq->c->reg, n, lynx_coord_now_ms());
      rc = lynx_reg_forget(&rq->c->reg, rq->params[0], &err);
    }
  }
  if (rc == 0)
    lynx_ev_add(&rq->c->reg.ev, LYNX_EV_NODE_FORGOTTEN, rq->params[0],
                "node %s forgotten by an operator", rq->params[0]);
  finish_mutation(rq, out, rc, &err, j, "node forget", 200, saved);
}

/* ---- routing ------------------------------------------------------------ */

static const struct route routes[] = {
    {"GET", "/healthz", h_healthz, 1},
    {"GET", "/readyz", h_readyz, 1},
    {"GET", "/metrics", h_metrics, 0},
    {"GET", "/v1/nodes", h_nodes, 0},
    {"GET", "/v1/nodes/{id}", h_node, 0},
    {"DELETE", "/v1/nodes/{id}", h_node_forget, 0},
    {"POST", "/v1/nodes/{id}/drain", h_node_drain, 0},
    {"POST", "/v1/nodes/{id}/undrain", h_node_undrain, 0},
    {"GET", "/v1/accelerators", h_accels, 0},
    {"GET", "/v1/mqueues", h_mqueues, 0},
    {"GET", "/v1/services", h_services, 0},
    {"POST", "/v1/services", h_service_create, 0},
    {"GET", "/v1/services/{name}", h_service, 0},
    {"DELETE", "/v1/services/{name}", h_service_delete, 0},
    {"GET", "/v1/frontends", h_frontends, 0},
    {"POST", "/v1/frontends/{id}/drain", h_frontend_drain, 0},
    {"POST", "/v1/frontends/{id}/undrain", h_frontend_undrain, 0},
    {"GET", "/v1/watch", h_watch, 0},
    {"GET", "/v1/events", h_events, 0},
    {"GET", "/ui/", h_ui, 1},
    {"GET", "/ui/{file}", h_ui, 1},
};

/* Does url match pattern? Captures {..} segments into params (non-empty,
 * shorter than PARAM_MAX). A single trailing slash on url is ignored. */
static int path_match(const char *pattern, const char *url,
                      char params[2][PARAM_MAX]) {
  const char *p = pattern, *u = url;
  int np = 0;
  size_t ulen = strlen(url);
  const char *uend = url + ulen;
  size_t plen = strlen(pattern);
  const char *pend = pattern + plen;
  if (ulen > 1 && url[ulen - 1] == '/')
    uend--;
  if (plen > 1 && pattern[plen - 1] == '/') /* "/ui/" matches "/ui" too */
    pend--;
  while (p < pend && u < uend) {
    if (*p == '{') {
      const char *seg = u;
      const char *close = strchr(p, '}');
      size_t n;
      while (u < uend && *u != '/')
        u++;
      n = (size_t)(u - seg);
      if (!close || n == 0 || n >= PARAM_MAX || np >= 2)
        return 0;
      memcpy(params[np], seg, n);
      params[np][n] = 0;
      np++;
      p = close + 1;
    } else {
      if (*p != *u)
        return 0;
      p++;
      u++;
    }
  }
  return p == pend && u == uend;
}

/* Finds the route for (method, url). NULL with *status 404, or 405 and the
 * allowed methods in allow. HEAD is served by the GET route. */
static const struct route *route_find(const char *method, const char *url,
                                      char params[2][PARAM_MAX],
                                      unsigned *status, char *allow,
                                      size_t allow_len) {
  const char *m = strcmp(method, "HEAD") == 0 ? "GET" : method;
  char tmp[2][PARAM_MAX];
  int path_known = 0;
  allow[0] = 0;
  for (size_t i = 0; i < LYNX_ARRAY_SIZE(routes); i++) {
    memset(tmp, 0, sizeof(tmp)); /* a route with fewer captures sees "" */
    if (!path_match(routes[i].pattern, url, tmp))
      continue;
    if (strcmp(routes[i].method, m) == 0) {
      memcpy(params, tmp, sizeof(tmp));
      allow[0] = 0;
      return &routes[i];
    }
    path_known = 1;
    if (!strstr(allow, routes[i].method)) {
      size_t l = strlen(allow);
      snprintf(allow + l, allow_len - l, "%s%s", l ? ", " : "",
               routes[i].method);
      if (strcmp(routes[i].method, "GET") == 0 && !strstr(allow, "HEAD")) {
        l = strlen(allow);
        snprintf(allow + l, allow_len - l, ", HEAD");
      }
    }
  }
  *status = path_known ? 405 : 404;
  return NULL;
}

/* ---- authorisation ------------------------------------------------------ */

static int peer_is_loopback(struct MHD_Connection *conn) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  const struct sockaddr *sa = ci ? ci->client_addr : NULL;
  if (!sa)
    return 0;
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
    if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr))
      return 1;
    return IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) &&
           in6->sin6_addr.s6_addr[12] == 127;
  }
  return 0;
}

/* 0 when rq may mutate; else fills out (401 / 403). */
static int authorise(struct http_req *rq, struct http_out *out) {
  const char *token = rq->c->token;
  const char *auth;
  if (!token || !token[0]) {
    if (peer_is_loopback(rq->conn))
      return 0;
    reply_err(out, 403, "permission_denied",
              "no API token is configured, so changes are accepted only from "
              "loopback; start the coordinator with --token-file and send "
              "'Authorization: Bearer <token>'");
    return -EPERM;
  }
  auth = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND,
                                     MHD_HTTP_HEADER_AUTHORIZATION);
  if (!auth) {
    reply_err(out, 401, "unauthenticated",
              "missing 'Authorization: Bearer <token>' header");
    out->www_auth = 1;
    return -EACCES;
  }
  if (strncasecmp(auth, "Bearer", 6) != 0 ||
      (auth[6] != ' ' && auth[6] != '\t')) {
    reply_err(out, 401, "unauthenticated",
              "Authorization header: expected 'Bearer <token>'");
    out->www_auth = 1;
    return -EACCES;
  }
  auth += 6;
  while (*auth == ' ' || *auth == '\t')
    auth++;
  if (!lynx_token_equal(auth, token)) {
    reply_err(out, 401, "unauthenticated", "wrong token");
    out->www_auth = 1;
    return -EACCES;
  }
  return 0;
}

/* ---- deferred requests --------------------------------------------------- */

/* rq's answer is in rq->result: the server's thread queues it once it
 * resumes the connection (it calls on_request again). Any thread. */
static void resume(struct http_req *rq) {
  if (!rq->result->json && !rq->result->text)
    reply_err(rq->result, 500, "internal", "handler produced no answer");
  __atomic_store_n(&rq->done, 1, __ATOMIC_RELEASE);
  MHD_resume_connection(rq->conn);
}

/* A worker: answers the requests of its queue, one at a time, until the
 * server stops and the queue is empty. A request queued while the server
 * stops is answered 503 rather than run. */
static void *worker_main(void *arg) {
  struct worker *w = arg;
  struct http *h = w->h;
  struct job_queue *q = &h->q[w->queue];
  pthread_mutex_lock(&h->work_lock);
  for (;;) {
    struct http_req *rq;
    while (!q->head && !h->workers_stop)
      pthread_cond_wait(&q->wake, &h->work_lock);
    if (!q->head)
      break;
    rq = q->head;
    q->head = rq->next;
    if (!q->head)
      q->tail = &q->head;
    rq->next = NULL;
    pthread_mutex_unlock(&h->work_lock);
    if (__atomic_load_n(&h->stopping, __ATOMIC_ACQUIRE))
      reply_err(rq->result, 503, "shutting_down",
                "the coordinator is stopping: retry (another coordinator, "
                "or this one once it is back)");
    else
      rq->route->fn(rq, rq->result);
    if (!rq->parked)
      resume(rq);
    pthread_mutex_lock(&h->work_lock);
  }
  pthread_mutex_unlock(&h->work_lock);
  return NULL;
}

/* Hands rq (its request whole) to a worker: changes to the one that makes
 * them, one at a time, reads to the others, so that a change waiting on
 * the store holds up no read. The connection is suspended until the
 * answer is ready (resume). 0, or -1 when the workers are gone or memory
 * is short: the caller answers on this thread. */
static int defer(struct http *h, struct http_req *rq) {
  struct job_queue *q =
      &h->q[is_mutating(rq->method) ? QUEUE_CHANGE : QUEUE_READ];
  rq->result = calloc(1, sizeof(*rq->result));
  if (!rq->result)
    return -1;
  pthread_mutex_lock(&h->work_lock);
  if (h->workers_stop) {
    pthread_mutex_unlock(&h->work_lock);
    free(rq->result);
    rq->result = NULL;
    return -1;
  }
  MHD_suspend_connection(rq->conn);
  h->n_suspended++;
  *q->tail = rq;
  q->tail = &rq->next;
  pthread_cond_signal(&q->wake);
  pthread_mutex_unlock(&h->work_lock);
  return 0;
}

/* ---- libmicrohttpd glue ------------------------------------------------- */

static enum MHD_Result send_out(struct http_req *rq, struct http_out *out) {
  struct MHD_Response *resp;
  enum MHD_Result ret;
  char *buf;
  size_t len;
  static const char oom[] =
      "{\"error\":{\"code\":\"internal\",\"message\":\"out of memory\"}}\n";

  if (out->text) {
    buf = out->text;
    len = out->text_len;
    out->text = NULL;
  } else {
    const char *s = out->json
                        ? json_object_to_json_string_ext(
                              out->json, JSON_C_TO_STRING_PLAIN |
                                             JSON_C_TO_STRING_NOSLASHESCAPE)
                        : NULL;
    len = s ? strlen(s) : 0;
    buf = s ? malloc(len + 2) : NULL;
    if (buf) {
      memcpy(buf, s, len);
      buf[len++] = '\n';
      buf[len] = 0;
    }
    out->ctype = "application/json";
  }
  if (buf) {
    resp = MHD_create_response_from_buffer(len, buf, MHD_RESPMEM_MUST_FREE);
    if (!resp)
      free(buf);
  } else {
    out->status = 500;
    resp = MHD_create_response_from_buffer(sizeof(oom) - 1, (void *)oom,
                                           MHD_RESPMEM_PERSISTENT);
  }
  json_object_put(out->json);
  out->json = NULL;
  if (!resp)
    return MHD_NO;
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                          out->ctype ? out->ctype : "application/json");
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  if (out->allow[0])
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, out->allow);
  if (out->location[0])
    MHD_add_response_header(resp, MHD_HTTP_HEADER_LOCATION, out->location);
  if (out->www_auth)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE,
                            "Bearer realm=\"lynx\"");
  if (lynx_hc_was_shed(rq->h->hc, rq->conn))
    /* shed at a cap: its place is taken */
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
  if (out->page) {
    /* the console runs only its own scripts and talks only to this API */
    MHD_add_response_header(resp, "Content-Security-Policy",
                            "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'");
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
  }
  ret = MHD_queue_response(rq->conn, out->status, resp);
  MHD_destroy_response(resp);
  if (ret == MHD_YES) {
    rq->answered = 1;
    lynx_hc_phase(rq->h->hc, rq->conn, LYNX_HC_BUSY); /* a body left unread is skipped */
    if (out->status >= 500 || (is_mutating(rq->method) && out->status >= 400))
      LYNX_WARN(COMP, "%s %s: %u", rq->method,
                rq->route ? rq->route->pattern : "?", out->status);
  }
  return ret;
}

/* Does the request carry a body (that answering early would leave unread)? */
static int has_body(struct MHD_Connection *conn) {
  const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                               MHD_HTTP_HEADER_CONTENT_LENGTH);
  if (MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                  MHD_HTTP_HEADER_TRANSFER_ENCODING))
    return 1;
  return cl && strcmp(cl, "0") != 0;
}

/* An answer decided from the headers alone. With a body coming it goes out
 * now: libmicrohttpd then skips the body and closes the connection. Without
 * one it waits for the end of the request, so the connection stays open. */
static enum MHD_Result answer_early(struct http_req *rq, struct http_out *out) {
  if (has_body(rq->conn))
    return send_out(rq, out);
  rq->early = malloc(sizeof(*rq->early));
  if (!rq->early) {
    json_object_put(out->json);
    free(out->text);
    return MHD_NO;
  }
  *rq->early = *out;
  rq->pending = 1;
  return MHD_YES;
}

/* What only the leader answers when several coordinators run on etcd
 * (docs/etcd.md): changes, and everything under /v1/, which holds runtime
 * state that agents and frontends report to the leader alone (a service's
 * instances and state too: a follower knows only its intent). */
static int leader_only(const struct route *r, const char *method) {
  /* the console too: it reads what only the leader answers, so a follower
   * sends the browser to the leader's */
  return is_mutating(method) || !strncmp(r->pattern, "/ui/", 4) ||
         !strncmp(r->pattern, "/v1/", 4);
}

/* What a follower that knows of no leader still answers from what it
 * holds: the services' intent (kept in step with etcd), their runtime
 * fields marked unknown, so that operators can read what is defined
 * during an election. */
static int intent_read(const struct route *r, const char *method) {
  return !is_mutating(method) && !strncmp(r->pattern, "/v1/services", 12);
}

struct query_buf {
  char *p;
  size_t len, cap;
};

static enum MHD_Result add_arg(void *cls, enum MHD_ValueKind kind,
                               const char *key, const char *value) {
  struct query_buf *q = cls;
  const char *parts[2] = {key, value ? value : ""};
  (void)kind;
  for (int k = 0; k < 2; k++) {
    if (q->len + 2 < q->cap) {
      char sep = k ? '=' : (q->len ? '&' : '?');
      q->p[q->len++] = sep;
    }
    for (const char *c = parts[k]; *c && q->len + 4 < q->cap; c++) {
      if (isalnum((unsigned char)*c) || strchr("-._~", *c))
        q->p[q->len++] = *c;
      else
        q->len += (size_t)snprintf(q->p + q->len, q->cap - q->len, "%%%02X",
                                   (unsigned char)*c);
    }
  }
  q->p[q->len] = '\0';
  return MHD_YES;
}

/* The request's query string, re-encoded ("" when none): a redirect keeps
 * it (libmicrohttpd hands the path and the decoded arguments apart). */
static void query_string(struct MHD_Connection *conn, char *out, size_t cap) {
  struct query_buf q = {out, 0, cap};
  out[0] = '\0';
  MHD_get_connection_values(conn, MHD_GET_ARGUMENT_KIND, add_arg, &q);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn,
                                  const char *url, const char *method,
                                  const char *version, const char *upload,
                                  size_t *upload_size, void **req_cls) {
  struct http *h = cls;
  struct http_req *rq = *req_cls;
  struct http_out out;
  (void)version;

  memset(&out, 0, sizeof(out));
  if (!rq) { /* headers received */
    unsigned status = 0;
    const char *cl;
    rq = calloc(1, sizeof(*rq));
    if (!rq)
      return MHD_NO;
    *req_cls = rq;
    rq->h = h;
    rq->c = h->c;
    rq->conn = conn;
    snprintf(rq->method, sizeof(rq->method), "%s", method);
    /* the headers are in: the body's deadline starts, or none applies */
    lynx_hc_phase(h->hc, conn, has_body(conn) ? LYNX_HC_BODY : LYNX_HC_BUSY);
    rq->route = route_find(method, url, rq->params, &status, out.allow,
                           sizeof(out.allow));
    if (!rq->route) {
      if (status == 405)
        reply_err(&out, 405, "method_not_allowed",
                  "method %.16s not allowed on %.200s (allowed: %s)", method,
                  url, out.allow);
      else
        reply_err(&out, 404, "not_found",
                  "no such endpoint: %.200s (see docs/api.md)", url);
      return answer_early(rq, &out);
    }
    if (is_mutating(method) && authorise(rq, &out))
      return answer_early(rq, &out);
    if (h->c->ha && leader_only(rq->route, method) &&
        !__atomic_load_n(&h->c->leader, __ATOMIC_ACQUIRE)) {
      char api[sizeof(h->c->leader_api)], query[256];
      char why[sizeof(h->c->no_leader_why)];
      int none;
      pthread_mutex_lock(&h->c->lock);
      snprintf(api, sizeof(api), "%s", h->c->leader_api);
      none = h->c->no_leader;
      snprintf(why, sizeof(why), "%s", h->c->no_leader_why);
      pthread_mutex_unlock(&h->c->lock);
      if ((none || !api[0]) && intent_read(rq->route, method)) {
        snprintf(rq->unknown, sizeof(rq->unknown),
                 "this coordinator does not lead and knows of no leader "
                 "(%s): the service's instances and state are the "
                 "leader's", none ? why : "an election is under way");
        goto proceed;
      }
      if (none) {
        /* knowing of no leader, this coordinator redirects nowhere: a
         * leader_api read before etcd went away may name one that stepped
         * down (or a follower that redirects back) */
        reply_err(&out, 503, "no_leader", "%s; retry", why);
      } else if (api[0]) {
        query_string(conn, query, sizeof(query));
        /* coordinators of one cluster serve their API alike: with TLS
         * here, the leader's is https too */
        const char *scheme = h->c->tls_cert_pem ? "https" : "http";
        int n = snprintf(out.location, sizeof(out.location), "%s://%s%s%s",
                         scheme, api, url, query);
        if (n < 0 || (size_t)n >= sizeof(out.location)) {
          out.location[0] = '\0'; /* no cut-off Location */
          reply_err(&out, 414, "uri_too_long",
                    "this coordinator does not lead, and the leader's URL "
                    "for this request is longer than %zu bytes: ask the "
                    "leader, %s://%s, directly", sizeof(out.location) - 1,
                    scheme, api);
        } else {
          reply_err(&out, 307, "not_leader",
                    "this coordinator does not lead: %s the leader, "
                    "%s://%s (docs/etcd.md)",
                    is_mutating(method) ? "changes go to"
                                        : "the cluster's runtime state is "
                                          "known to",
                    scheme, api);
        }
      } else {
        reply_err(&out, 503, "no_leader",
                  "no coordinator leads yet (etcd election under way or "
                  "etcd unreachable): retry");
      }
      return answer_early(rq, &out);
    }
  proceed:
    cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                     MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl) {
      uint64_t n;
      if (lynx_parse_u64(cl, 0, UINT64_MAX, &n) == 0 && n > h->c->body_max) {
        reply_err(&out, 413, "payload_too_large",
                  "body of %llu bytes is larger than the limit of %zu bytes",
                  (unsigned long long)n, h->c->body_max);
        return send_out(rq, &out); /* the body is never read */
      }
    }
    return MHD_YES;
  }

  if (*upload_size) { /* a piece of the body */
    size_t n = *upload_size;
    *upload_size = 0;
    if (rq->answered || rq->pending)
      return MHD_YES; /* libmicrohttpd skips it; nothing to keep anyway */
    if (rq->too_big) {
      /* libmicrohttpd 0.9.x takes no response in the middle of an upload:
       * read a bounded amount more to answer 413 at its end, then give up
       * on the connection */
      rq->discarded += n;
      if (rq->discarded > DISCARD_MAX) {
        LYNX_WARN(COMP,
                  "%s %s: chunked body far over the limit of %zu "
                  "bytes: connection closed",
                  rq->method, rq->route->pattern, h->c->body_max);
        return MHD_NO;
      }
      return MHD_YES;
    }
    if (n > h->c->body_max - rq->len) { /* rq->len <= body_max */
      rq->too_big = 1;
      rq->discarded = n;
      free(rq->body);
      rq->body = NULL;
      rq->len = rq->cap = 0;
      reply_err(&out, 413, "payload_too_large",
                "body larger than the limit of %zu bytes", h->c->body_max);
      /* accepted by libmicrohttpd versions that allow an early answer here */
      send_out(rq, &out);
      return MHD_YES;
    }
    if (rq->len + n + 1 > rq->cap) {
      char *nb = lynx_grow(rq->body, &rq->cap, rq->len + n + 1, 1024,
                           h->c->body_max + 1);
      if (!nb)
        return MHD_NO;
      rq->body = nb;
    }
    memcpy(rq->body + rq->len, upload, n);
    rq->len += n;
    rq->body[rq->len] = 0;
    return MHD_YES;
  }

  /* the whole request is in */
  if (__atomic_load_n(&rq->done, __ATOMIC_ACQUIRE)) {
    /* resumed: a worker or the watch thread made the answer */
    out = *rq->result;
    free(rq->result);
    rq->result = NULL;
    rq->done = 0;
    pthread_mutex_lock(&h->work_lock);
    h->n_suspended--;
    pthread_cond_broadcast(&h->resumed);
    pthread_mutex_unlock(&h->work_lock);
    lynx_hc_phase(h->hc, conn, LYNX_HC_BUSY); /* a watch's answer is no wait */
    return send_out(rq, &out);
  }
  lynx_hc_phase(h->hc, conn, LYNX_HC_BUSY);
  if (rq->answered)
    return MHD_YES;
  if (rq->pending) {
    out = *rq->early;
    free(rq->early);
    rq->early = NULL;
    rq->pending = 0;
    return send_out(rq, &out);
  }
  if (rq->too_big) {
    reply_err(&out, 413, "payload_too_large",
              "body larger than the limit of %zu bytes", h->c->body_max);
    return send_out(rq, &out);
  }
  if (!rq->route->now) {
    /* while the server stops, reads are answered here (a watch at once)
     * and changes refused */
    if (!__atomic_load_n(&h->stopping, __ATOMIC_ACQUIRE)) {
      if (defer(h, rq) == 0)
        return MHD_YES;
    } else if (is_mutating(rq->method)) {
      reply_err(&out, 503, "shutting_down",
                "the coordinator is stopping: retry (another coordinator, "
                "or this one once it is back)");
      return send_out(rq, &out);
    }
  }
  rq->route->fn(rq, &out);
  if (!out.json && !out.text)
    reply_err(&out, 500, "internal", "handler produced no answer");
  return send_out(rq, &out);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **req_cls,
                         enum MHD_RequestTerminationCode toe) {
  struct http_req *rq = *req_cls;
  (void)toe;
  /* the next request's headers are due within the header timeout */
  lynx_hc_phase(((struct http *)cls)->hc, conn, LYNX_HC_HEADERS);
  if (!rq)
    return;
  if (rq->early) { /* the request ended before its early answer went out */
    json_object_put(rq->early->json);
    free(rq->early->text);
    free(rq->early);
  }
  if (rq->result) { /* cannot happen: a suspended request does not end */
    json_object_put(rq->result->json);
    free(rq->result->text);
    free(rq->result);
  }
  free(rq->body);
  free(rq);
  *req_cls = NULL;
}

static int hexval(char ch) {
  if (ch >= '0' && ch <= '9')
    return ch - '0';
  if (ch >= 'a' && ch <= 'f')
    return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F')
    return ch - 'A' + 10;
  return -1;
}

/* Percent-decoding of the path and query arguments, except "%00", which is
 * kept as written: a decoded NUL would silently cut "/v1/nodes/%00x" down
 * to "/v1/nodes/". */
static size_t on_unescape(void *cls, struct MHD_Connection *conn, char *s) {
  char *w = s;
  const char *r = s;
  (void)cls;
  (void)conn;
  while (*r) {
    int hi, lo;
    if (r[0] == '%' && (hi = hexval(r[1])) >= 0 && (lo = hexval(r[2])) >= 0 &&
        (hi | lo) != 0) {
      *w++ = (char)(hi * 16 + lo);
      r += 3;
    } else {
      *w++ = *r++;
    }
  }
  *w = 0;
  return (size_t)(w - s);
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
  char msg[256];
  (void)cls;
  if (lynx_hc_mhd_msg(msg, sizeof(msg), fmt, ap)) {
    LYNX_DBG(COMP, "libmicrohttpd: %s", msg);
    return;
  }
  /* a failed TLS handshake is the client's (plain HTTP to an https API,
   * or our certificate not trusted there), and anyone can cause one:
   * rate-limited */
  if (strstr(msg, "handshake") || strstr(msg, "TLS")) {
    LYNX_LOG_RL(LYNX_LOG_INFO, COMP, "libmicrohttpd: %s (a client that "
                "speaks plain HTTP, or does not trust our certificate?)",
                msg);
    return;
  }
  LYNX_WARN(COMP, "libmicrohttpd: %s", msg);
}

/* The API's listening socket on ss (non-blocking, close-on-exec, address
 * reuse as libmicrohttpd would set it): ours, so that a failure says why
 * (EADDRINUSE, EADDRNOTAVAIL, EACCES) rather than libmicrohttpd's NULL.
 * The fd, or -errno. */
static int api_listen(const struct sockaddr_storage *ss) {
  int one = 1, fd, e;
  socklen_t len = ss->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                            : sizeof(struct sockaddr_in);
  fd = socket(ss->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -errno;
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
      (ss->ss_family == AF_INET6 &&
       setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one))) ||
      bind(fd, (const struct sockaddr *)ss, len) || listen(fd, 511)) {
    e = errno;
    close(fd);
    return -e;
  }
  return fd;
}

int lynx_http_start(struct lynx_coord *c, const char *addr) {
  struct sockaddr_storage ss;
  struct http *h;
  struct lynx_hc_stats st;
  /* one thread polls every connection (lynx_hc_mhd_flags); what may wait
   * runs on the workers, with the connection suspended meanwhile */
  unsigned flags = MHD_ALLOW_SUSPEND_RESUME;
  /* the key and certificate with TLS; none (the end) without */
  struct MHD_OptionItem tls_opts[3] = {{MHD_OPTION_END, 0, NULL},
                                       {MHD_OPTION_END, 0, NULL},
                                       {MHD_OPTION_END, 0, NULL}};
  struct lynx_hc_cfg hcfg = {
      .conn_max = c ? c->http_conn_max : 0,
      .per_client = c ? c->http_conn_per_client : 0,
      .header_timeout_ms = c ? c->http_header_timeout_ms : 0,
      .body_timeout_ms = c ? c->http_body_timeout_ms : 0,
      .comp = COMP,
      .opt = "--http",
      .wake = watch_wake,
  };
  int rc, lfd;

  if (!c || c->http)
    return -EINVAL;
  if (lynx_parse_hostport(addr, &ss)) {
    LYNX_ERR(COMP, "bad --http address '%s' (expected host:port)",
             addr ? addr : "");
    return -EINVAL;
  }
  flags |= lynx_hc_mhd_flags(ss.ss_family);
  if (c->tls_cert_pem) {
    if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
      LYNX_ERR(COMP, "cannot serve the API over HTTPS: this libmicrohttpd "
               "was built without TLS");
      return -ENOTSUP;
    }
    flags |= MHD_USE_TLS;
    tls_opts[0] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0,
                                          (void *)c->tls_key_pem};
    tls_opts[1] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0,
                                          (void *)c->tls_cert_pem};
  }
  h = calloc(1, sizeof(*h));
  if (!h)
    return -ENOMEM;
  h->c = c;
  h->watch_at_ns = UINT64_MAX;
  hcfg.arg = h;
  pthread_mutex_init(&h->work_lock, NULL);
  pthread_cond_init(&h->resumed, NULL);
  for (int i = 0; i < QUEUE_N; i++) {
    h->q[i].head = NULL;
    h->q[i].tail = &h->q[i].head;
    pthread_cond_init(&h->q[i].wake, NULL);
  }
  rc = lynx_hc_new(&hcfg, &h->hc);
  if (rc) {
    LYNX_ERR(COMP, "cannot track the API's connections: %s", strerror(-rc));
    goto out_sync;
  }
  lfd = api_listen(&ss);
  if (lfd < 0) {
    rc = lfd;
    LYNX_ERR(COMP, "cannot serve the API on %s: %s%s", addr, strerror(-rc),
             rc == -EADDRNOTAVAIL ? " (no interface of this host has that "
                                    "address)"
             : rc == -EADDRINUSE ? " (another process serves that port)"
                                 : "");
    goto out_hc;
  }
  errno = 0; /* libmicrohttpd sets it on some failures only */
  h->d = MHD_start_daemon(
      flags, 0, lynx_hc_on_accept, h->hc, on_request, h,
      /* first, so every message of the daemon goes through our log */
      MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, h, MHD_OPTION_LISTEN_SOCKET,
      lfd, MHD_OPTION_CONNECTION_LIMIT, lynx_hc_mhd_limit(h->hc),
      MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)CONN_TIMEOUT_S,
      MHD_OPTION_NOTIFY_CONNECTION, lynx_hc_on_connection, h->hc,
      MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
      MHD_OPTION_UNESCAPE_CALLBACK, on_unescape, h,
      MHD_OPTION_ARRAY, tls_opts, MHD_OPTION_END);
  if (!h->d) {
    rc = errno ? -errno : -EINVAL;
    LYNX_ERR(COMP, "cannot serve the API on %s: libmicrohttpd did not "
             "start (%s)", addr, strerror(-rc));
    close(lfd);
    goto out_hc;
  }
  h->watch_running =
      pthread_create(&h->watch_thread, NULL, watch_main, h) == 0;
  for (int i = 0; h->watch_running && i < READ_WORKERS + 1; i++) {
    struct worker *w = &h->workers[i];
    w->h = h;
    w->queue = i < READ_WORKERS ? QUEUE_READ : QUEUE_CHANGE;
    if (pthread_create(&w->thread, NULL, worker_main, w))
      break;
    h->n_workers++;
  }
  if (h->n_workers < READ_WORKERS + 1) {
    rc = -EAGAIN;
    LYNX_ERR(COMP, "cannot start the API's threads");
    c->http = h;
    lynx_http_stop(c);
    return rc;
  }
  c->http = h;
  lynx_hc_stats(h->hc, &st);
  LYNX_INFO(COMP,
            "API on %s://%s (at most %u connections, %u per client, the "
            "oldest incomplete shed past either; headers within %llu ms, "
            "bodies within %llu ms)",
            c->tls_cert_pem ? "https" : "http", addr, st.conn_max,
            st.per_client, (unsigned long long)st.header_timeout_ms,
            (unsigned long long)st.body_timeout_ms);
  return 0;

out_hc:
  lynx_hc_free(h->hc);
out_sync:
  for (int i = 0; i < QUEUE_N; i++)
    pthread_cond_destroy(&h->q[i].wake);
  pthread_cond_destroy(&h->resumed);
  pthread_mutex_destroy(&h->work_lock);
  free(h);
  return rc;
}

void lynx_http_stop(struct lynx_coord *c) {
  struct http *h;
  struct timespec ts;
  uint64_t until;
  if (!c || !c->http)
    return;
  h = c->http;
  /* the watchers are answered at once, and nothing more is deferred */
  pthread_mutex_lock(&c->lock);
  __atomic_store_n(&h->stopping, 1, __ATOMIC_RELEASE);
  pthread_cond_broadcast(&c->changed);
  pthread_mutex_unlock(&c->lock);
  if (h->watch_running)
    pthread_join(h->watch_thread, NULL);
  /* the workers answer what is queued (503) and end */
  pthread_mutex_lock(&h->work_lock);
  h->workers_stop = 1;
  for (int i = 0; i < QUEUE_N; i++)
    pthread_cond_broadcast(&h->q[i].wake);
  pthread_mutex_unlock(&h->work_lock);
  for (unsigned i = 0; i < h->n_workers; i++)
    pthread_join(h->workers[i].thread, NULL);
  /* every suspended connection has been resumed: let the server's thread
   * send their answers before the daemon stops (it would close them) */
  until = lynx_now_ns() + STOP_WAIT_MS * 1000000ull;
  ts.tv_sec = (time_t)(until / 1000000000u);
  ts.tv_nsec = (long)(until % 1000000000u);
  pthread_mutex_lock(&h->work_lock);
  while (h->n_suspended &&
         pthread_cond_clockwait(&h->resumed, &h->work_lock, CLOCK_MONOTONIC,
                                &ts) != ETIMEDOUT)
    ;
  pthread_mutex_unlock(&h->work_lock);
  /* every CLOSED notification runs in here; it closes the listening
   * socket too (given or its own) */
  MHD_stop_daemon(h->d);
  lynx_hc_free(h->hc);
  c->http = NULL;
  for (int i = 0; i < CACHE_N; i++)
    free(h->cache[i].body);
  for (int i = 0; i < PAGES_N; i++) {
    free(h->pages[i].body);
    free(h->pages[i].off);
    free(h->pages[i].key);
  }
  for (int i = 0; i < QUEUE_N; i++)
    pthread_cond_destroy(&h->q[i].wake);
  pthread_cond_destroy(&h->resumed);
  pthread_mutex_destroy(&h->work_lock);
  free(h);
}
