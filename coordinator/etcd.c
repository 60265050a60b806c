/* etcd.c - etcd v3 through its gRPC-JSON gateway (see etcd.h). */
#include "etcd.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>
#include <json-c/json.h>
#include <openssl/evp.h>

#include "util.h"

#define RESP_MAX (64u << 20) /* an answer larger than this is refused */
#define ENDPOINT_MAX 256

struct lynx_etcd {
  CURL *curl;
  struct curl_slist *hdrs;
  char ep[LYNX_ETCD_ENDPOINTS_MAX][ENDPOINT_MAX];
  unsigned n_ep, cur;
  int used; /* a call reached ep[cur] */
  uint32_t timeout_ms;
};

struct buf {
  char *p;
  size_t len, cap;
  int over;
};

/* ---- base64 (keys and values are bytes on the wire) ---------------------- */

static char *b64_enc(const void *p, size_t len) {
  char *out = malloc(4 * ((len + 2) / 3) + 1);
  if (out)
    EVP_EncodeBlock((unsigned char *)out, p, (int)len);
  return out;
}

/* NUL-terminated copy of the bytes s encodes; NULL when s is not base64
 * (or out of memory). */
static char *b64_dec(const char *s, size_t *len) {
  size_t n = strlen(s), pad = 0;
  unsigned char *out;
  int got;
  if (n % 4)
    return NULL;
  if (n && s[n - 1] == '=')
    pad++;
  if (n > 1 && s[n - 2] == '=')
    pad++;
  out = malloc(n / 4 * 3 + 1);
  if (!out)
    return NULL;
  got = n ? EVP_DecodeBlock(out, (const unsigned char *)s, (int)n) : 0;
  if (got < 0 || (size_t)got < pad) {
    free(out);
    return NULL;
  }
  *len = (size_t)got - pad;
  out[*len] = '\0';
  return (char *)out;
}

/* Adds key (base64 of s) to o; with prefix, range_end too: s with its last
 * byte that is not 0xff incremented (the whole keyspace for ""). */
static int add_key(struct json_object *o, const char *s, int prefix) {
  char *k = b64_enc(s, strlen(s));
  if (!k)
    return -ENOMEM;
  json_object_object_add(o, "key", json_object_new_string(k));
  free(k);
  if (prefix) {
    size_t n = strlen(s);
    unsigned char *end = malloc(n + 1);
    if (!end)
      return -ENOMEM;
    memcpy(end, s, n);
    while (n && end[n - 1] == 0xff)
      n--;
    if (n)
      end[n - 1]++;
    else
      end[n++] = 0; /* "\0": every key */
    k = b64_enc(end, n);
    free(end);
    if (!k)
      return -ENOMEM;
    json_object_object_add(o, "range_end", json_object_new_string(k));
    free(k);
  }
  return 0;
}

/* ---- the client ---------------------------------------------------------- */

int lynx_etcd_open(struct lynx_etcd **out, const char *endpoints,
                   uint32_t timeout_ms, char *err, size_t errlen) {
  struct lynx_etcd *e;
  const char *p = endpoints;
  *out = NULL;
  if (!endpoints || !*endpoints)
    return lynx_fail(err, errlen, -EINVAL, "no etcd endpoint");
  e = calloc(1, sizeof(*e));
  if (!e)
    return lynx_fail(err, errlen, -ENOMEM, "out of memory");
  while (*p) {
    const char *c = strchr(p, ',');
    size_t n = c ? (size_t)(c - p) : strlen(p);
    while (n && isspace((unsigned char)*p))
      p++, n--;
    while (n && isspace((unsigned char)p[n - 1]))
      n--;
    if (n) {
      if (e->n_ep == LYNX_ETCD_ENDPOINTS_MAX) {
        free(e);
        return lynx_fail(err, errlen, -EINVAL, "more than %d etcd endpoints",
                         LYNX_ETCD_ENDPOINTS_MAX);
      }
      if (n < 8 || strncmp(p, "http://", 7) || n >= ENDPOINT_MAX ||
          memchr(p, ' ', n)) {
        free(e);
        return lynx_fail(err, errlen, -EINVAL,
                         "etcd endpoint '%.*s': want http://host:port", (int)n,
                         p);
      }
      memcpy(e->ep[e->n_ep], p, n);
      /* no trailing slash: paths are appended */
      while (n > 7 && e->ep[e->n_ep][n - 1] == '/')
        n--;
      e->ep[e->n_ep][n] = '\0';
      e->n_ep++;
    }
    p += c ? (size_t)(c - p) + 1 : strlen(p);
  }
  if (!e->n_ep) {
    free(e);
    return lynx_fail(err, errlen, -EINVAL, "no etcd endpoint in '%s'",
                     endpoints);
  }
  e->timeout_ms = timeout_ms ? timeout_ms : 2000;
  e->curl = curl_easy_init();
  e->hdrs = curl_slist_append(NULL, "Content-Type: application/json");
  if (!e->curl || !e->hdrs) {
    lynx_etcd_close(e);
    return lynx_fail(err, errlen, -ENOMEM, "cannot set up libcurl");
  }
  *out = e;
  return 0;
}

void lynx_etcd_close(struct lynx_etcd *e) {
  if (!e)
    return;
  if (e->curl)
    curl_easy_cleanup(e->curl);
  curl_slist_free_all(e->hdrs);
  free(e);
}

const char *lynx_etcd_endpoint(const struct lynx_etcd *e) {
  return e->used ? e->ep[e->cur] : "";
}

static size_t on_data(char *p, size_t sz, size_t n, void *arg) {
  struct buf *b = arg;
  size_t len = sz * n;
  if (b->len + len + 1 > RESP_MAX) {
    b->over = 1;
    return 0; /* curl reports a write error */
  }
  if (b->len + len + 1 > b->cap) {
    char *q = lynx_grow(b->p, &b->cap, b->len + len + 1, 4096, 0);
    if (!q)
      return 0;
    b->p = q;
  }
  memcpy(b->p + b->len, p, len);
  b->len += len;
  b->p[b->len] = '\0';
  return len;
}

/* gRPC status codes in the gateway's error bodies, as -errno */
static int grpc_errno(int64_t code) {
  switch (code) {
  case 3:  /* INVALID_ARGUMENT */
  case 11: /* OUT_OF_RANGE */
    return -EINVAL;
  case 4: /* DEADLINE_EXCEEDED */
    return -ETIMEDOUT;
  case 5: /* NOT_FOUND */
    return -ENOENT;
  case 7:  /* PERMISSION_DENIED */
  case 16: /* UNAUTHENTICATED */
    return -EACCES;
  case 8: /* RESOURCE_EXHAUSTED */
    return -ENOSPC;
  case 9:  /* FAILED_PRECONDITION */
  case 10: /* ABORTED */
    return -ECANCELED;
  case 14: /* UNAVAILABLE */
    return -EAGAIN;
  default:
    return -EPROTO;
  }
}

/* Readies e->curl for one POST of body to url, the answer to write(data):
 * the options every etcd request shares (plain http only). */
static void post_setup(struct lynx_etcd *e, const char *url, const char *body,
                       curl_write_callback write, void *data) {
  curl_easy_reset(e->curl);
  curl_easy_setopt(e->curl, CURLOPT_URL, url);
  curl_easy_setopt(e->curl, CURLOPT_HTTPHEADER, e->hdrs);
  curl_easy_setopt(e->curl, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(e->curl, CURLOPT_WRITEFUNCTION, write);
  curl_easy_setopt(e->curl, CURLOPT_WRITEDATA, data);
  curl_easy_setopt(e->curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e->curl, CURLOPT_PROTOCOLS_STR, "http");
}

/* POSTs req to path on the endpoints, from the last one that answered; the
 * answer's JSON object in *resp. */
static int call(struct lynx_etcd *e, const char *path, struct json_object *req,
                struct json_object **resp, char *err, size_t errlen) {
  const char *body =
      json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN);
  uint64_t deadline = lynx_now_ns() + (uint64_t)e->timeout_ms * 1000000u;
  int rc = -ETIMEDOUT;
  char why[256] = "no endpoint tried";
  *resp = NULL;
  if (!body)
    return lynx_fail(err, errlen, -ENOMEM, "out of memory");
  for (unsigned k = 0; k < e->n_ep; k++) {
    unsigned i = (e->cur + k) % e->n_ep;
    char url[ENDPOINT_MAX + 64];
    struct buf b = {0};
    uint64_t now = lynx_now_ns();
    long left_ms = now < deadline ? (long)((deadline - now) / 1000000u) : 0;
    long status = 0;
    CURLcode cc;
    if (left_ms <= 0) {
      rc = -ETIMEDOUT;
      snprintf(why, sizeof(why), "no answer within %u ms", e->timeout_ms);
      break;
    }
    snprintf(url, sizeof(url), "%s%s", e->ep[i], path);
    post_setup(e, url, body, on_data, &b);
    curl_easy_setopt(e->curl, CURLOPT_TIMEOUT_MS, left_ms);
    curl_easy_setopt(
        e->curl, CURLOPT_CONNECTTIMEOUT_MS,
        left_ms < (long)e->timeout_ms / 3 ? left_ms : (long)e->timeout_ms / 3);
    cc = curl_easy_perform(e->curl);
    curl_easy_getinfo(e->curl, CURLINFO_RESPONSE_CODE, &status);
    if (cc != CURLE_OK) {
      rc = cc == CURLE_OPERATION_TIMEDOUT ? -ETIMEDOUT
           : cc == CURLE_COULDNT_CONNECT  ? -ECONNREFUSED
           : b.over                       ? -EMSGSIZE
                                          : -EHOSTUNREACH;
      snprintf(why, sizeof(why), "%s: %s", e->ep[i],
               b.over ? "answer too large" : curl_easy_strerror(cc));
      free(b.p);
      if (b.over)
        break;
      continue;
    }
    {
      struct json_object *j = b.p ? json_tokener_parse(b.p) : NULL;
      free(b.p);
      if (status == 200 && json_object_is_type(j, json_type_object)) {
        e->cur = i;
        e->used = 1;
        *resp = j;
        return 0;
      }
      if (status >= 400 && status < 500 &&
          json_object_is_type(j, json_type_object)) {
        struct json_object *m = NULL, *c = NULL;
        json_object_object_get_ex(j, "message", &m);
        json_object_object_get_ex(j, "code", &c);
        rc = grpc_errno(c ? json_object_get_int64(c) : 0);
        e->cur = i;
        e->used = 1;
        lynx_fail(err, errlen, rc, "etcd %s: %s", e->ep[i],
                  m ? json_object_get_string(m) : "refused the request");
        json_object_put(j);
        return rc;
      }
      if (status >= 500 && json_object_is_type(j, json_type_object)) {
        struct json_object *m = NULL;
        json_object_object_get_ex(j, "message", &m);
        rc = -EAGAIN;
        snprintf(why, sizeof(why), "%s: %s", e->ep[i],
                 m ? json_object_get_string(m) : "unavailable");
      } else {
        rc = -EPROTO;
        snprintf(why, sizeof(why), "%s: HTTP %ld, not an etcd v3 answer",
                 e->ep[i], status);
      }
      json_object_put(j);
    }
  }
  return lynx_fail(err, errlen, rc, "etcd: %s", why);
}

/* ---- watch --------------------------------------------------------------- */

/* The gateway streams a watch as JSON objects one after the other:
 * {"result": {"header", "created"}} first, then {"result": {"events": [...]}}
 * per change (or "canceled"/"compact_revision" when the watch cannot go
 * on). */
struct watch_state {
  struct json_tokener *tok;
  const int *stop;
  int changed, ended, bad;
};

static void watch_message(struct watch_state *w, struct json_object *j) {
  struct json_object *r = NULL, *ev = NULL, *x = NULL;
  if (!json_object_object_get_ex(j, "result", &r) ||
      !json_object_is_type(r, json_type_object)) {
    w->bad = 1; /* e.g. {"error": ...}: not a watch response */
    return;
  }
  if (json_object_object_get_ex(r, "events", &ev) &&
      json_object_is_type(ev, json_type_array) &&
      json_object_array_length(ev) > 0)
    w->changed = 1;
  /* history compacted past our revision, or the watch cancelled: what we
   * read may be stale, so the caller reads again */
  if ((json_object_object_get_ex(r, "compact_revision", &x) &&
       json_object_get_int64(x) > 0) ||
      (json_object_object_get_ex(r, "canceled", &x) &&
       json_object_get_boolean(x)))
    w->ended = 1;
}

static size_t on_watch(char *p, size_t sz, size_t n, void *arg) {
  struct watch_state *w = arg;
  size_t len = sz * n, off = 0;
  while (off < len && !w->changed && !w->ended && !w->bad) {
    struct json_object *j =
        json_tokener_parse_ex(w->tok, p + off, (int)(len - off));
    if (!j) {
      if (json_tokener_get_error(w->tok) == json_tokener_continue)
        return len; /* the rest of the object comes with the next chunk */
      w->bad = 1;
      break;
    }
    off += json_tokener_get_parse_end(w->tok);
    json_tokener_reset(w->tok);
    watch_message(w, j);
    json_object_put(j);
  }
  /* 0 ends the transfer: we know what we waited for */
  return (w->changed || w->ended || w->bad) ? 0 : len;
}

static int on_watch_progress(void *arg, curl_off_t dt, curl_off_t dn,
                             curl_off_t ut, curl_off_t un) {
  const struct watch_state *w = arg;
  (void)dt, (void)dn, (void)ut, (void)un;
  return w->stop && __atomic_load_n(w->stop, __ATOMIC_ACQUIRE);
}

int lynx_etcd_watch(struct lynx_etcd *e, const char *key, int prefix,
                    int64_t from_rev, uint32_t timeout_ms, const int *stop,
                    char *err, size_t errlen) {
  struct json_object *req = json_object_new_object(),
                     *cr = json_object_new_object();
  struct watch_state w = {json_tokener_new(), stop, 0, 0, 0};
  char url[ENDPOINT_MAX + 64];
  const char *body;
  CURLcode cc;
  long status = 0;
  int rc;
  if (!req || !cr || !w.tok || add_key(cr, key, prefix)) {
    rc = lynx_fail(err, errlen, -ENOMEM, "out of memory");
    goto out;
  }
  if (from_rev > 0)
    json_object_object_add(cr, "start_revision",
                           json_object_new_int64(from_rev));
  json_object_object_add(req, "create_request", cr);
  cr = NULL;
  body = json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN);
  /* the endpoint that answered last: a watch is a wait, not worth a
   * tour of the others (the caller reads again after it anyway) */
  snprintf(url, sizeof(url), "%s/v3/watch", e->ep[e->cur]);
  post_setup(e, url, body, on_watch, &w);
  curl_easy_setopt(e->curl, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(e->curl, CURLOPT_XFERINFOFUNCTION, on_watch_progress);
  curl_easy_setopt(e->curl, CURLOPT_XFERINFODATA, &w);
  curl_easy_setopt(e->curl, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
  curl_easy_setopt(e->curl, CURLOPT_CONNECTTIMEOUT_MS, (long)timeout_ms);
  cc = curl_easy_perform(e->curl);
  curl_easy_getinfo(e->curl, CURLINFO_RESPONSE_CODE, &status);
  if (w.changed || w.ended)
    rc = 1;
  else if (w.bad || (status && status != 200))
    rc = lynx_fail(err, errlen, -EPROTO,
                   "etcd %s: a watch answered HTTP "
                   "%ld, not a watch response",
                   e->ep[e->cur], status);
  else if (cc == CURLE_OK || cc == CURLE_OPERATION_TIMEDOUT ||
           cc == CURLE_ABORTED_BY_CALLBACK)
    rc = 0; /* nothing changed within timeout_ms, or stopping */
  else
    rc = lynx_fail(err, errlen,
                   cc == CURLE_COULDNT_CONNECT ? -ECONNREFUSED : -EHOSTUNREACH,
                   "etcd %s: watch: %s", e->ep[e->cur], curl_easy_strerror(cc));
out:
  json_object_put(cr);
  json_object_put(req);
  if (w.tok)
    json_tokener_free(w.tok);
  return rc;
}

static int64_t jint(struct json_object *o, const char *k) {
  struct json_object *v;
  return json_object_object_get_ex(o, k, &v) ? json_object_get_int64(v) : 0;
}

static int64_t header_rev(struct json_object *o) {
  struct json_object *h;
  return json_object_object_get_ex(o, "header", &h) ? jint(h, "revision") : 0;
}

void lynx_etcd_kvs_free(struct lynx_etcd_kvs *k) {
  for (size_t i = 0; k->kv && i < k->n; i++) {
    free(k->kv[i].key);
    free(k->kv[i].value);
  }
  free(k->kv);
  k->kv = NULL;
  k->n = 0;
}

/* a range answer's kvs into out */
static int take_kvs(struct json_object *r, struct lynx_etcd_kvs *out, char *err,
                    size_t errlen) {
  struct json_object *kvs;
  size_t n;
  out->revision = header_rev(r);
  if (!json_object_object_get_ex(r, "kvs", &kvs))
    return 0; /* none: proto3 leaves the empty list out */
  if (!json_object_is_type(kvs, json_type_array))
    return lynx_fail(err, errlen, -EPROTO, "etcd: kvs is not a list");
  n = json_object_array_length(kvs);
  out->kv = calloc(n ? n : 1, sizeof(*out->kv));
  if (!out->kv)
    return lynx_fail(err, errlen, -ENOMEM, "out of memory");
  for (size_t i = 0; i < n; i++) {
    struct json_object *o = json_object_array_get_idx(kvs, i), *k, *v;
    struct lynx_etcd_kv *kv = &out->kv[out->n];
    size_t klen;
    if (!json_object_object_get_ex(o, "key", &k) ||
        !(kv->key = b64_dec(json_object_get_string(k), &klen))) {
      lynx_etcd_kvs_free(out);
      return lynx_fail(err, errlen, -EPROTO, "etcd: a key that is not base64");
    }
    out->n++;
    kv->value = json_object_object_get_ex(o, "value", &v)
                    ? b64_dec(json_object_get_string(v), &kv->value_len)
                    : calloc(1, 1);
    if (!kv->value) {
      lynx_etcd_kvs_free(out);
      return lynx_fail(err, errlen, -EPROTO,
                       "etcd: a value that is not base64");
    }
    kv->create_rev = jint(o, "create_revision");
    kv->mod_rev = jint(o, "mod_revision");
    kv->version = jint(o, "version");
    kv->lease = jint(o, "lease");
  }
  return 0;
}

int lynx_etcd_get(struct lynx_etcd *e, const char *key, int prefix,
                  struct lynx_etcd_kvs *out, char *err, size_t errlen) {
  struct json_object *req = json_object_new_object(), *resp;
  int rc;
  memset(out, 0, sizeof(*out));
  if (!req || add_key(req, key, prefix)) {
    json_object_put(req);
    return lynx_fail(err, errlen, -ENOMEM, "out of memory");
  }
  rc = call(e, "/v3/kv/range", req, &resp, err, errlen);
  json_object_put(req);
  if (rc)
    return rc;
  rc = take_kvs(resp, out, err, errlen);
  json_object_put(resp);
  return rc;
}

static struct json_object *op_obj(const struct lynx_etcd_op *op) {
  struct json_object *o = json_object_new_object(),
                     *in = json_object_new_object();
  if (!o || !in || add_key(in, op->key, op->kind == LYNX_ETCD_DEL_PREFIX))
    goto oom;
  if (op->kind == LYNX_ETCD_PUT) {
    char *v = b64_enc(op->value ? op->value : "", op->value_len);
    if (!v)
      goto oom;
    json_object_object_add(in, "value", json_object_new_string(v));
    free(v);
    if (op->lease)
      json_object_object_add(in, "lease", json_object_new_int64(op->lease));
    json_object_object_add(o, "request_put", in);
  } else {
    json_object_object_add(o, "request_delete_range", in);
  }
  return o;
oom:
  json_object_put(o);
  json_object_put(in);
  return NULL;
}

static struct json_object *cmp_obj(const struct lynx_etcd_cmp *c) {
  static const char *const targets[] = {"CREATE", "MOD", "VALUE"};
  static const char *const fields[] = {"create_revision", "mod_revision",
                                       "value"};
  struct json_object *o = json_object_new_object();
  if (!o || add_key(o, c->key, 0)) {
    json_object_put(o);
    return NULL;
  }
  json_object_object_add(o, "target",
                         json_object_new_string(targets[c->target]));
  json_object_object_add(
      o, "result",
      json_object_new_string(c->not_equal ? "NOT_EQUAL" : "EQUAL"));
  if (c->target == LYNX_ETCD_VALUE) {
    char *v =
        b64_enc(c->value ? c->value : "", c->value ? strlen(c->value) : 0);
    if (!v) {
      json_object_put(o);
      return NULL;
    }
    json_object_object_add(o, fields[c->target], json_object_new_string(v));
    free(v);
  } else {
    json_object_object_add(o, fields[c->target], json_object_new_int64(c->rev));
  }
  return o;
}

static int add_ops(struct json_object *req, const char *name,
                   const struct lynx_etcd_op *ops, size_t n) {
  struct json_object *a = json_object_new_array();
  if (!a)
    return -ENOMEM;
  json_object_object_add(req, name, a);
  for (size_t i = 0; i < n; i++) {
    struct json_object *o = op_obj(&ops[i]);
    if (!o)
      return -ENOMEM;
    json_object_array_add(a, o);
  }
  return 0;
}

int lynx_etcd_txn(struct lynx_etcd *e, const struct lynx_etcd_cmp *cmp,
                  size_t ncmp, const struct lynx_etcd_op *ok, size_t nok,
                  const struct lynx_etcd_op *fail_ops, size_t nfail,
                  int *succeeded, int64_t *rev, char *err, size_t errlen) {
  struct json_object *req = json_object_new_object(), *resp, *a, *s;
  int rc = req ? 0 : -ENOMEM;
  if (!rc && !(a = json_object_new_array()))
    rc = -ENOMEM;
  if (!rc) {
    json_object_object_add(req, "compare", a);
    for (size_t i = 0; i < ncmp && !rc; i++) {
      struct json_object *o = cmp_obj(&cmp[i]);
      if (o)
        json_object_array_add(a, o);
      else
        rc = -ENOMEM;
    }
  }
  if (!rc)
    rc = add_ops(req, "success", ok, nok);
  if (!rc)
    rc = add_ops(req, "failure", fail_ops, nfail);
  if (rc) {
    json_object_put(req);
    return lynx_fail(err, errlen, rc, "out of memory");
  }
  rc = call(e, "/v3/kv/txn", req, &resp, err, errlen);
  json_object_put(req);
  if (rc)
    return rc;
  if (succeeded)
    *succeeded = json_object_object_get_ex(resp, "succeeded", &s) &&
                 json_object_get_boolean(s);
  if (rev)
    *rev = header_rev(resp);
  json_object_put(resp);
  return 0;
}

int lynx_etcd_put(struct lynx_etcd *e, const char *key, const char *value,
                  size_t value_len, int64_t lease, char *err, size_t errlen) {
  struct lynx_etcd_op op = {LYNX_ETCD_PUT, key, value, value_len, lease};
  return lynx_etcd_txn(e, NULL, 0, &op, 1, NULL, 0, NULL, NULL, err, errlen);
}

int lynx_etcd_del(struct lynx_etcd *e, const char *key, int prefix, char *err,
                  size_t errlen) {
  struct lynx_etcd_op op = {prefix ? LYNX_ETCD_DEL_PREFIX : LYNX_ETCD_DEL, key,
                            NULL, 0, 0};
  return lynx_etcd_txn(e, NULL, 0, &op, 1, NULL, 0, NULL, NULL, err, errlen);
}

/* ---- leases -------------------------------------------------------------- */

static int lease_call(struct lynx_etcd *e, const char *path, const char *k,
                      int64_t v, struct json_object **resp, char *err,
                      size_t errlen) {
  struct json_object *req = json_object_new_object();
  int rc;
  if (!req)
    return lynx_fail(err, errlen, -ENOMEM, "out of memory");
  json_object_object_add(req, k, json_object_new_int64(v));
  rc = call(e, path, req, resp, err, errlen);
  json_object_put(req);
  return rc;
}

int lynx_etcd_lease_grant(struct lynx_etcd *e, uint32_t ttl_s, int64_t *id,
                          char *err, size_t errlen) {
  struct json_object *resp;
  int rc = lease_call(e, "/v3/lease/grant", "TTL", ttl_s, &resp, err, errlen);
  if (rc)
    return rc;
  *id = jint(resp, "ID");
  json_object_put(resp);
  if (*id == 0)
    return lynx_fail(err, errlen, -EPROTO, "etcd: lease grant without an ID");
  return 0;
}

int lynx_etcd_lease_keepalive(struct lynx_etcd *e, int64_t id,
                              int64_t *ttl_left, char *err, size_t errlen) {
  struct json_object *resp, *r = NULL;
  int rc = lease_call(e, "/v3/lease/keepalive", "ID", id, &resp, err, errlen);
  if (rc)
    return rc;
  /* a stream of one: {"result": {..., "TTL": n}}, no TTL once expired */
  *ttl_left =
      json_object_object_get_ex(resp, "result", &r) ? jint(r, "TTL") : 0;
  if (!r) {
    struct json_object *er = NULL;
    json_object_object_get_ex(resp, "error", &er);
    rc = lynx_fail(err, errlen, -EPROTO, "etcd: lease keepalive: %s",
                   er ? json_object_to_json_string(er) : "no result");
  }
  json_object_put(resp);
  return rc;
}

int lynx_etcd_lease_revoke(struct lynx_etcd *e, int64_t id, char *err,
                           size_t errlen) {
  struct json_object *resp;
  int rc = lease_call(e, "/v3/lease/revoke", "ID", id, &resp, err, errlen);
  if (!rc)
    json_object_put(resp);
  return rc;
}
