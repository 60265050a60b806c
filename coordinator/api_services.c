/*
 * api_services.c - the API's services: /v1/services (list, one, create,
 * delete). A follower that knows of no leader says why their runtime
 * fields are unknown (rq->unknown, set by http.c).
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_internal.h"
#include "log.h"
#include "store.h"

void api_services(struct http_req *rq, struct http_out *out) {
  struct json_object *j;
  pthread_mutex_lock(&rq->c->lock);
  j = lynx_json_services(&rq->c->reg, rq->unknown[0] ? rq->unknown : NULL);
  pthread_mutex_unlock(&rq->c->lock);
  http_reply_encoded(out, 200, j);
}

void api_service(struct http_req *rq, struct http_out *out) {
  struct json_object *j = NULL;
  struct lynx_reg_service *s;
  pthread_mutex_lock(&rq->c->lock);
  s = lynx_reg_service_find(&rq->c->reg, rq->params[0]);
  if (s)
    j = lynx_json_service(&rq->c->reg, s, rq->unknown[0] ? rq->unknown : NULL);
  pthread_mutex_unlock(&rq->c->lock);
  if (!s)
    http_reply_err(out, 404, "not_found", "service '%s' not found",
                   rq->params[0]);
  else
    http_reply_encoded(out, 200, j);
}

static int url_safe(const char *s) {
  for (; *s; s++)
    if (!isalnum((unsigned char)*s) && !strchr("._-~", *s))
      return 0;
  return 1;
}

void api_service_create(struct http_req *rq, struct http_out *out) {
  struct lynx_service_spec spec;
  struct lynx_reg_err err;
  struct lynx_reg_service *s;
  struct json_object *body, *j = NULL;
  int rc;

  body = http_parse_body(rq, out);
  if (!body)
    return;
  memset(&spec, 0, sizeof(spec));
  memset(&err, 0, sizeof(err));
  rc = lynx_json_service_spec(body, &spec, &err);
  json_object_put(body);
  if (rc) {
    http_reply_reg_err(out, rc, &err);
    return;
  }
  http_change_begin(rq);
  rc = lynx_reg_service_prepare(&rq->c->reg, &spec, &s, &err);
  if (rc == 0) {
    struct lynx_state_edit edit = {.add_service = &s->spec};
    /* services change only under change_lock: prepared still holds */
    if (http_save_first(rq, out, "service create", &edit)) {
      http_change_end(rq);
      free(s);
      return;
    }
    lynx_reg_service_add(&rq->c->reg, s, rq->c->now_ms());
    lynx_ev_add(&rq->c->reg.ev, LYNX_EV_SERVICE_CREATED, spec.name,
                "service %s created (%s on port %u)", spec.name, spec.app,
                (unsigned)spec.port);
    rq->c->on_change(rq->c);
    j = lynx_json_service(&rq->c->reg, s, NULL);
  }
  http_change_end(rq);
  if (rc) {
    http_reply_reg_err(out, rc, &err);
    return;
  }
  LYNX_INFO(COMP, "service %s created (port %u, app %s)", spec.name, spec.port,
            spec.app);
  if (url_safe(spec.name))
    snprintf(out->location, sizeof(out->location), "/v1/services/%s",
             spec.name);
  http_reply_encoded(out, 201, j);
}

/* 200 with the service as it was just before it was deleted. */
void api_service_delete(struct http_req *rq, struct http_out *out) {
  struct lynx_state_edit edit = {.del_service = rq->params[0]};
  struct lynx_reg_err err;
  struct lynx_reg_service *s;
  struct json_object *j;
  int rc;

  memset(&err, 0, sizeof(err));
  http_change_begin(rq);
  s = lynx_reg_service_find(&rq->c->reg, rq->params[0]);
  if (!s) {
    http_change_end(rq);
    http_reply_err(out, 404, "not_found", "service '%s' not found",
                   rq->params[0]);
    return;
  }
  if (http_save_first(rq, out, "service delete", &edit)) {
    http_change_end(rq);
    return;
  }
  /* services change only under change_lock: still there */
  s = lynx_reg_service_find(&rq->c->reg, rq->params[0]);
  j = s ? lynx_json_service(&rq->c->reg, s, NULL) : NULL;
  rc = lynx_reg_service_delete(&rq->c->reg, rq->params[0], rq->c->now_ms(),
                               &err);
  if (rc == 0)
    lynx_ev_add(&rq->c->reg.ev, LYNX_EV_SERVICE_DELETED, rq->params[0],
                "service %s deleted: its instances stop", rq->params[0]);
  http_finish_mutation(rq, out, rc, &err, j, "service delete", 200, 1);
}
