/*
 * api_frontends.c - the API's frontends: /v1/frontends and a frontend's
 * drain and undrain (runtime intent, not saved).
 */
#include <string.h>

#include "http_internal.h"
#include "log.h"

void api_frontends(struct http_req *rq, struct http_out *out) {
  struct json_object *j;
  pthread_mutex_lock(&rq->c->lock);
  j = lynx_json_frontends(&rq->c->reg, rq->c->now_ms());
  pthread_mutex_unlock(&rq->c->lock);
  http_reply_encoded(out, 200, j);
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
    j = lynx_json_frontend(&rq->c->reg, f, rq->c->now_ms());
  if (rc == 0)
    rq->c->on_change(rq->c);
  pthread_mutex_unlock(&rq->c->lock);
  if (rc) {
    json_object_put(j);
    http_reply_reg_err(out, rc, &err);
    return;
  }
  LYNX_INFO(COMP, "frontend %s %s", drain ? "drain" : "undrain", rq->params[0]);
  http_reply_encoded(out, 200, j);
}

void api_frontend_drain(struct http_req *rq, struct http_out *out) {
  frontend_op(rq, out, 1);
}

void api_frontend_undrain(struct http_req *rq, struct http_out *out) {
  frontend_op(rq, out, 0);
}
