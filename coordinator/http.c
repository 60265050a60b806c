/*
 * http.c - the coordinator's operator API: JSON over HTTP (libmicrohttpd,
 * json-c). docs/api.md is the reference. This file is the server:
 * listening, TLS, connection limits, the workers, the watch thread and
 * the route table; the handlers are one file per resource (api_*.c,
 * http_internal.h), and answer through http_reply.c.
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
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "frame.h"
#include "http_internal.h"
#include "log.h"

/* ---- small helpers ------------------------------------------------------ */

static int is_mutating(const char *method) {
  return strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0;
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
        http_reply_encoded(w->result, 200, j); /* a shed one closes after */
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

/* ---- routing ------------------------------------------------------------ */

static const struct route routes[] = {
    {"GET", "/healthz", api_healthz, 1},
    {"GET", "/readyz", api_readyz, 1},
    {"GET", "/metrics", api_metrics, 0},
    {"GET", "/v1/nodes", api_nodes, 0},
    {"GET", "/v1/nodes/{id}", api_node, 0},
    {"DELETE", "/v1/nodes/{id}", api_node_forget, 0},
    {"POST", "/v1/nodes/{id}/drain", api_node_drain, 0},
    {"POST", "/v1/nodes/{id}/undrain", api_node_undrain, 0},
    {"GET", "/v1/accelerators", api_accels, 0},
    {"GET", "/v1/mqueues", api_mqueues, 0},
    {"GET", "/v1/services", api_services, 0},
    {"POST", "/v1/services", api_service_create, 0},
    {"GET", "/v1/services/{name}", api_service, 0},
    {"DELETE", "/v1/services/{name}", api_service_delete, 0},
    {"GET", "/v1/frontends", api_frontends, 0},
    {"POST", "/v1/frontends/{id}/drain", api_frontend_drain, 0},
    {"POST", "/v1/frontends/{id}/undrain", api_frontend_undrain, 0},
    {"GET", "/v1/watch", api_watch, 0},
    {"GET", "/v1/events", api_events, 0},
    {"GET", "/ui/", api_ui, 1},
    {"GET", "/ui/{file}", api_ui, 1},
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
    http_reply_err(
        out, 403, "permission_denied",
        "no API token is configured, so changes are accepted only from "
        "loopback; start the coordinator with --token-file and send "
        "'Authorization: Bearer <token>'");
    return -EPERM;
  }
  auth = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND,
                                     MHD_HTTP_HEADER_AUTHORIZATION);
  if (!auth) {
    http_reply_err(out, 401, "unauthenticated",
                   "missing 'Authorization: Bearer <token>' header");
    out->www_auth = 1;
    return -EACCES;
  }
  if (strncasecmp(auth, "Bearer", 6) != 0 ||
      (auth[6] != ' ' && auth[6] != '\t')) {
    http_reply_err(out, 401, "unauthenticated",
                   "Authorization header: expected 'Bearer <token>'");
    out->www_auth = 1;
    return -EACCES;
  }
  auth += 6;
  while (*auth == ' ' || *auth == '\t')
    auth++;
  if (!lynx_token_equal(auth, token)) {
    http_reply_err(out, 401, "unauthenticated", "wrong token");
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
    http_reply_err(rq->result, 500, "internal", "handler produced no answer");
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
      http_reply_err(rq->result, 503, "shutting_down",
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
    MHD_add_response_header(
        resp, "Content-Security-Policy",
        "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'");
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
  }
  ret = MHD_queue_response(rq->conn, out->status, resp);
  MHD_destroy_response(resp);
  if (ret == MHD_YES) {
    rq->answered = 1;
    lynx_hc_phase(rq->h->hc, rq->conn,
                  LYNX_HC_BUSY); /* a body left unread is skipped */
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
        http_reply_err(&out, 405, "method_not_allowed",
                       "method %.16s not allowed on %.200s (allowed: %s)",
                       method, url, out.allow);
      else
        http_reply_err(&out, 404, "not_found",
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
                 "leader's",
                 none ? why : "an election is under way");
        goto proceed;
      }
      if (none) {
        /* knowing of no leader, this coordinator redirects nowhere: a
         * leader_api read before etcd went away may name one that stepped
         * down (or a follower that redirects back) */
        http_reply_err(&out, 503, "no_leader", "%s; retry", why);
      } else if (api[0]) {
        query_string(conn, query, sizeof(query));
        /* coordinators of one cluster serve their API alike: with TLS
         * here, the leader's is https too */
        const char *scheme = h->c->tls_cert_pem ? "https" : "http";
        int n = snprintf(out.location, sizeof(out.location), "%s://%s%s%s",
                         scheme, api, url, query);
        if (n < 0 || (size_t)n >= sizeof(out.location)) {
          out.location[0] = '\0'; /* no cut-off Location */
          http_reply_err(&out, 414, "uri_too_long",
                         "this coordinator does not lead, and the leader's URL "
                         "for this request is longer than %zu bytes: ask the "
                         "leader, %s://%s, directly",
                         sizeof(out.location) - 1, scheme, api);
        } else {
          http_reply_err(&out, 307, "not_leader",
                         "this coordinator does not lead: %s the leader, "
                         "%s://%s (docs/etcd.md)",
                         is_mutating(method) ? "changes go to"
                                             : "the cluster's runtime state is "
                                               "known to",
                         scheme, api);
        }
      } else {
        http_reply_err(&out, 503, "no_leader",
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
        http_reply_err(
            &out, 413, "payload_too_large",
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
      http_reply_err(&out, 413, "payload_too_large",
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
    http_reply_err(&out, 413, "payload_too_large",
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
      http_reply_err(&out, 503, "shutting_down",
                     "the coordinator is stopping: retry (another coordinator, "
                     "or this one once it is back)");
      return send_out(rq, &out);
    }
  }
  rq->route->fn(rq, &out);
  if (!out.json && !out.text)
    http_reply_err(&out, 500, "internal", "handler produced no answer");
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
    LYNX_LOG_RL(LYNX_LOG_INFO, COMP,
                "libmicrohttpd: %s (a client that "
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
             : rc == -EADDRINUSE  ? " (another process serves that port)"
                                  : "");
    goto out_hc;
  }
  errno = 0; /* libmicrohttpd sets it on some failures only */
  h->d = MHD_start_daemon(
      flags, 0, lynx_hc_on_accept, h->hc, on_request, h,
      /* first, so every message of the daemon goes through our log */
      MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, h, MHD_OPTION_LISTEN_SOCKET, lfd,
      MHD_OPTION_CONNECTION_LIMIT, lynx_hc_mhd_limit(h->hc),
      MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)CONN_TIMEOUT_S,
      MHD_OPTION_NOTIFY_CONNECTION, lynx_hc_on_connection, h->hc,
      MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
      MHD_OPTION_UNESCAPE_CALLBACK, on_unescape, h, MHD_OPTION_ARRAY, tls_opts,
      MHD_OPTION_END);
  if (!h->d) {
    rc = errno ? -errno : -EINVAL;
    LYNX_ERR(COMP,
             "cannot serve the API on %s: libmicrohttpd did not "
             "start (%s)",
             addr, strerror(-rc));
    close(lfd);
    goto out_hc;
  }
  h->watch_running = pthread_create(&h->watch_thread, NULL, watch_main, h) == 0;
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
