/*
 * api_watch.c - GET /v1/watch (a waiting watch is parked among the
 * server's watchers: http.c's watch thread answers it) and GET /v1/events
 * (the registry's event ring).
 */

#include <string.h>

#include "http_internal.h"

/* GET /v1/watch[?since=V[&timeout_ms=T]]: the registry version, at once
 * without since or when it is no longer since (a version below since
 * comes from a restarted coordinator: answered at once too, so that the
 * client resynchronises instead of waiting for a number it may never see
 * again); else when it changes or after T ms (WATCH_DEFAULT_MS, at most
 * WATCH_MAX_MS). A waiting watch holds no thread: it is parked among the
 * watchers, its connection suspended, and the watch thread answers it. */
void api_watch(struct http_req *rq, struct http_out *out) {
  struct lynx_coord *c = rq->c;
  struct http *h = rq->h;
  const char *s_since =
      MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "since");
  const char *s_to = MHD_lookup_connection_value(
      rq->conn, MHD_GET_ARGUMENT_KIND, "timeout_ms");
  uint64_t since = 0, timeout = WATCH_DEFAULT_MS, v;
  struct json_object *j;

  if (s_since && lynx_parse_u64(s_since, 0, UINT64_MAX, &since)) {
    http_reply_err(out, 400, "invalid_argument",
                   "since: expected a registry version (unsigned integer), got "
                   "'%.64s'",
                   s_since);
    return;
  }
  if (s_to && lynx_parse_u64(s_to, 0, UINT64_MAX, &timeout)) {
    http_reply_err(out, 400, "invalid_argument",
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
  http_reply_encoded(out, 200, j);
}

/* GET /v1/events?since=S&limit=N: the kept events with seq >= S, oldest
 * first, at most N (default 100, at most 1000), and next, the seq to ask
 * for next time. A since beyond what this coordinator has issued comes
 * from a client of an earlier coordinator (restarted, or another leader):
 * answered from the oldest kept, so that it resynchronises. */
#define EVENTS_LIMIT_DEFAULT 100u

#define EVENTS_LIMIT_MAX 1000u

void api_events(struct http_req *rq, struct http_out *out) {
  struct lynx_coord *c = rq->c;
  const char *s_since =
      MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "since");
  const char *s_limit =
      MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "limit");
  uint64_t since = 0, limit = EVENTS_LIMIT_DEFAULT, seq, oldest, n = 0;
  struct json_object *j, *items;

  if (s_since && lynx_parse_u64(s_since, 0, UINT64_MAX, &since)) {
    http_reply_err(
        out, 400, "invalid_argument",
        "since: expected an event seq (unsigned integer), got '%.64s'",
        s_since);
    return;
  }
  if (s_limit && lynx_parse_u64(s_limit, 1, EVENTS_LIMIT_MAX, &limit)) {
    http_reply_err(out, 400, "invalid_argument",
                   "limit: expected 1 to %u, got '%.64s'", EVENTS_LIMIT_MAX,
                   s_limit);
    return;
  }
  j = json_object_new_object();
  items = json_object_new_array();
  if (!j || !items) {
    json_object_put(j);
    json_object_put(items);
    http_reply_oom(out);
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
  http_reply_encoded(out, 200, j);
}
