/*
 * http_reply.c - what every handler of the API answers with (http.c's
 * routes): JSON replies and errors, the registry's errors as HTTP
 * statuses, request bodies parsed strictly, and changes of operator
 * intent saved to the store before they are applied.
 */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_internal.h"
#include "jsondup.h"
#include "log.h"
#include "store.h"

void http_reply_json(struct http_out *out, unsigned status,
                     struct json_object *j) {
  json_object_put(out->json);
  out->status = status;
  out->json = j;
}

void http_reply_err(struct http_out *out, unsigned status, const char *code,
                    const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  http_reply_json(out, status, lynx_json_error(code, msg));
}

/* The registry's answer to a failed operation, with a fallback for the
 * errno when it left err empty. */
void http_reply_reg_err(struct http_out *out, int rc,
                        const struct lynx_reg_err *err) {
  unsigned status;
  const char *code;
  if (err->status >= 400 && err->status <= 599 && err->code[0]) {
    http_reply_err(out, (unsigned)err->status, err->code, "%s",
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
  http_reply_err(out, status, code, "%s",
                 err->message[0] ? err->message : strerror(-rc));
}

void http_reply_oom(struct http_out *out) {
  http_reply_err(out, 500, "internal", "out of memory");
}

/* Encoded under the lock: NULL means the encoder ran out of memory. */
void http_reply_encoded(struct http_out *out, unsigned status,
                        struct json_object *j) {
  if (!j)
    http_reply_oom(out);
  else
    http_reply_json(out, status, j);
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
 * then the registry (c->lock). http_change_end releases both. */
void http_change_begin(struct http_req *rq) {
  pthread_mutex_lock(&rq->c->change_lock);
  pthread_mutex_lock(&rq->c->lock);
}

void http_change_end(struct http_req *rq) {
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
    return c->state_dir
               ? lynx_store_save(c->state_dir, &c->reg, edit, err, errlen)
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
void http_store_undo(struct http_req *rq, const char *what) {
  char err[256] = "";
  int rc = store_write(rq->c, NULL, err, sizeof(err));
  if (rc)
    LYNX_LOG_RL(LYNX_LOG_WARN, COMP,
                "%s was saved but not applied, and the "
                "state as it is could not be saved again: %s (the next "
                "change saves it)",
                what, err[0] ? err : strerror(-rc));
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
int http_save_first(struct http_req *rq, struct http_out *out, const char *what,
                    const struct lynx_state_edit *edit) {
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
  http_reply_err(out, status, code,
                 "%s: not applied: it cannot be saved in %s (%s)", what, where,
                 err[0] ? err : strerror(-rc));
  return rc;
}

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
struct json_object *http_parse_body(struct http_req *rq, struct http_out *out) {
  char msg[512];
  unsigned status;
  struct json_object *j =
      lynx_http_body_parse(rq->body, rq->len, &status, msg, sizeof(msg));
  if (!j)
    http_reply_err(out, status,
                   status == 413   ? "payload_too_large"
                   : status == 500 ? "internal"
                                   : "invalid_argument",
                   "%s", msg);
  return j;
}

/* Finishes a change of operator intent, saved first (http_save_first) and then
 * applied under c->lock, and releases the locks (http_change_end): on success
 * (rc 0) wakes the watchers and answers status with j; otherwise answers
 * the registry's error, and when the change was saved (saved) puts the
 * store back to the state as it is. Takes j (may be NULL on error). */
void http_finish_mutation(struct http_req *rq, struct http_out *out, int rc,
                          const struct lynx_reg_err *err, struct json_object *j,
                          const char *what, unsigned status, int saved) {
  if (rc == 0)
    rq->c->on_change(rq->c);
  else if (saved)
    http_store_undo(rq, what);
  http_change_end(rq);
  if (rc) {
    json_object_put(j);
    http_reply_reg_err(out, rc, err);
    return;
  }
  LYNX_INFO(COMP, "%s %s", what, rq->params[0]);
  http_reply_encoded(out, status, j);
}
