/*
 * api_status.c - /healthz, /readyz and the web console's files (/ui/):
 * what the server's own thread answers (routes marked now in http.c),
 * so it must never wait on a lock that may be held long.
 */
#include <stdlib.h>
#include <string.h>

#include "http_internal.h"
#include "ui.h"

void api_healthz(struct http_req *rq, struct http_out *out) {
  struct json_object *j = json_object_new_object();
  (void)rq;
  if (j)
    json_object_object_add(j, "status", json_object_new_string("ok"));
  http_reply_encoded(out, 200, j);
}

void api_readyz(struct http_req *rq, struct http_out *out) {
  struct json_object *j;
  if (!__atomic_load_n(&rq->c->ready, __ATOMIC_ACQUIRE)) {
    http_reply_err(
        out, 503, "not_ready",
        "not ready: state not loaded or control port not listening yet");
    return;
  }
  j = json_object_new_object();
  if (j) {
    json_object_object_add(j, "status", json_object_new_string("ready"));
    if (rq->c->ha) { /* which coordinator leads (docs/etcd.md) */
      int lead = __atomic_load_n(&rq->c->leader, __ATOMIC_ACQUIRE);
      json_object_object_add(
          j, "role", json_object_new_string(lead ? "leader" : "follower"));
      pthread_mutex_lock(&rq->c->lock);
      json_object_object_add(j, "leader_api",
                             json_object_new_string(rq->c->leader_api));
      /* a follower that knows of no leader says why (changes get 503) */
      if (!lead && rq->c->no_leader) {
        json_object_object_add(j, "no_leader", json_object_new_boolean(1));
        json_object_object_add(j, "why",
                               json_object_new_string(rq->c->no_leader_why));
      }
      pthread_mutex_unlock(&rq->c->lock);
    }
  }
  http_reply_encoded(out, 200, j);
}

/* GET /ui/ and /ui/{file}: the web console (ui.h, docs/console.md). */
void api_ui(struct http_req *rq, struct http_out *out) {
  const char *name = rq->params[0][0] ? rq->params[0] : "index.html";
  for (const struct lynx_ui_file *f = lynx_ui_files; f->name; f++) {
    if (strcmp(f->name, name) != 0)
      continue;
    out->text = malloc(f->len ? f->len : 1);
    if (!out->text) {
      http_reply_oom(out);
      return;
    }
    memcpy(out->text, f->data, f->len);
    out->text_len = f->len;
    out->status = 200;
    out->ctype = f->type;
    out->page = 1;
    return;
  }
  http_reply_err(out, 404, "not_found", "the console has no file '%.64s'",
                 name);
}
