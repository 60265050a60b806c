/*
 * api.c - lynxctl's HTTP client: every call to the coordinator's JSON API
 * (docs/api.md) goes through here, over libcurl.
 *
 * The addresses come from --api A,B (or $LYNX_API): each call tries them in
 * turn, from the one that answered last, until one answers; a change goes
 * on to the next address only when it surely did not reach a coordinator,
 * so that none is made twice. A connection closed with no answer at all is
 * sent again (a coordinator at its caps sheds requests it has not read).
 * When none answers, the message says what each address said, with a hint
 * where one fits (plain HTTP to an HTTPS port and the other way round, a
 * certificate that is not trusted). SIGINT and SIGTERM abort a call in
 * flight (ctl_stop).
 */
#include <curl/curl.h>
#include <errno.h>
#include <json-c/json.h>
#include <signal.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lynxctl.h"
#include "util.h"

volatile sig_atomic_t ctl_stop;

static void on_signal(int sig) {
  (void)sig;
  ctl_stop = 1;
}

void ctl_catch_stop(void) {
  struct sigaction sa;

  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
}

static size_t on_data(char *p, size_t size, size_t n, void *arg) {
  struct buf *b = arg;
  size_t len = size * n;
  char *nb = realloc(b->p, b->len + len + 1);
  if (!nb)
    return 0; /* curl reports a write error */
  memcpy(nb + b->len, p, len);
  b->p = nb;
  b->len += len;
  b->p[b->len] = 0;
  return len;
}

static int on_progress(void *arg, curl_off_t dt, curl_off_t dn, curl_off_t ut,
                       curl_off_t un) {
  (void)arg;
  (void)dt;
  (void)dn;
  (void)ut;
  (void)un;
  return ctl_stop ? 1 : 0; /* Ctrl-C aborts a long poll */
}

static size_t discard(char *p, size_t size, size_t n, void *arg) {
  (void)p;
  (void)arg;
  return size * n;
}

/* Whether api (an https:// URL) answers plain HTTP: GET /healthz over
 * http://, within a second or two. */
static int answers_plain_http(const char *api) {
  char url[API_LEN + 32];
  CURL *c = curl_easy_init();
  CURLcode rc;
  if (!c)
    return 0;
  snprintf(url, sizeof(url), "http://%s/healthz", api + 8);
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 1000L);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 2000L);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, discard);
  curl_easy_setopt(c, CURLOPT_USERAGENT, "lynxctl");
  rc = curl_easy_perform(c);
  curl_easy_cleanup(c);
  return rc == CURLE_OK;
}

/* How a failed exchange with api (curl's rc, its message err) is to be
 * explained. */
static enum fail_hint hint_of(const char *api, CURLcode rc, const char *err) {
  int https = strncmp(api, "https://", 8) == 0;
  /* plain HTTP to a TLS port: the server fails the handshake on the
   * request's bytes and closes without an answer */
  if (!https && (rc == CURLE_GOT_NOTHING || rc == CURLE_RECV_ERROR))
    return HINT_TRY_HTTPS;
  /* TLS to a plain HTTP port: its answer is no TLS record (OpenSSL "wrong
   * version number", GnuTLS "An unexpected TLS packet was received"), or
   * it closed the connection on the handshake (SSL_ERROR_SYSCALL): asked
   * in plain HTTP, does it answer? */
  if (https && rc == CURLE_SSL_CONNECT_ERROR &&
      (strstr(err, "wrong version number") || strstr(err, "unexpected TLS") ||
       strstr(err, "packet length too long") ||
       strstr(err, "record layer failure") || answers_plain_http(api)))
    return HINT_TRY_HTTP;
  if (rc == CURLE_PEER_FAILED_VERIFICATION || rc == CURLE_SSL_CONNECT_ERROR ||
      rc == CURLE_SSL_CACERT_BADFILE)
    return HINT_TLS_CERT;
  return HINT_NONE;
}

/* Whether a change that failed so (rc; request_size: bytes of requests
 * sent) surely did not reach a coordinator that acts on it, so that it may
 * go to the next address: nothing was sent, or it was refused before an
 * answer (a coordinator answers every request it takes; one it drops
 * unanswered, past its connection limits or at a TLS port, it never
 * read). */
static int change_not_taken(CURLcode rc, long request_size) {
  switch (rc) {
  case CURLE_COULDNT_RESOLVE_HOST:
  case CURLE_COULDNT_CONNECT:
  case CURLE_SSL_CONNECT_ERROR:
  case CURLE_PEER_FAILED_VERIFICATION:
  case CURLE_SSL_CACERT_BADFILE:
  case CURLE_GOT_NOTHING:
    return 1;
  default:
    return request_size == 0;
  }
}

/* One exchange with t->api. 0 with *status and the body in *resp;
 * -EHOSTUNREACH when the coordinator cannot be reached (err, CURL_ERROR_SIZE
 * bytes, says why; *hint how to explain it; *retry whether the request may
 * go to another address; *nothing whether the connection was closed with
 * no answer at all); -EINTR when interrupted. */
static int http_one(struct ctl *t, const char *method, const char *path,
                    const char *body, long timeout_ms, long *status,
                    struct buf *resp, char *err, enum fail_hint *hint,
                    int *retry, int *nothing) {
  char url[API_LEN + 1024], auth[600];
  struct curl_slist *hdrs = NULL, *h;
  long sent = 0;
  CURLcode rc;

  resp->p = NULL;
  resp->len = 0;
  err[0] = 0;
  *hint = HINT_NONE;
  *retry = 0;
  *nothing = 0;
  snprintf(url, sizeof(url), "%s%s", t->api, path);
  curl_easy_reset(t->curl);
  curl_easy_setopt(t->curl, CURLOPT_URL, url);
  curl_easy_setopt(t->curl, CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(t->curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(t->curl, CURLOPT_CONNECTTIMEOUT_MS, 3000L);
  curl_easy_setopt(t->curl, CURLOPT_TIMEOUT_MS, timeout_ms);
  curl_easy_setopt(t->curl, CURLOPT_ERRORBUFFER, err);
  curl_easy_setopt(t->curl, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(t->curl, CURLOPT_WRITEDATA, resp);
  curl_easy_setopt(t->curl, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(t->curl, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt(t->curl, CURLOPT_USERAGENT, "lynxctl");
  if (t->cacert)
    curl_easy_setopt(t->curl, CURLOPT_CAINFO, t->cacert);
  /* a coordinator that does not lead redirects changes to the leader (307,
   * method and body kept; docs/etcd.md), which is a coordinator of the
   * same cluster: the token goes along */
  curl_easy_setopt(t->curl, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(t->curl, CURLOPT_MAXREDIRS, 2L);
  curl_easy_setopt(t->curl, CURLOPT_UNRESTRICTED_AUTH, 1L);
  curl_easy_setopt(t->curl, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  if (body) {
    curl_easy_setopt(t->curl, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(t->curl, CURLOPT_POSTFIELDSIZE_LARGE,
                     (curl_off_t)strlen(body));
    h = curl_slist_append(hdrs, "Content-Type: application/json");
    hdrs = h ? h : hdrs;
  }
  h = curl_slist_append(hdrs, "Accept: application/json");
  hdrs = h ? h : hdrs;
  if (t->token) {
    snprintf(auth, sizeof(auth), "Authorization: Bearer %s", t->token);
    h = curl_slist_append(hdrs, auth);
    hdrs = h ? h : hdrs;
  }
  curl_easy_setopt(t->curl, CURLOPT_HTTPHEADER, hdrs);
  rc = curl_easy_perform(t->curl);
  curl_easy_setopt(t->curl, CURLOPT_HTTPHEADER, NULL);
  curl_slist_free_all(hdrs);
  if (rc == CURLE_ABORTED_BY_CALLBACK && ctl_stop) {
    free(resp->p);
    resp->p = NULL;
    return -EINTR;
  }
  if (rc != CURLE_OK) {
    if (!err[0])
      snprintf(err, CURL_ERROR_SIZE, "%s", curl_easy_strerror(rc));
    *hint = hint_of(t->api, rc, err);
    curl_easy_getinfo(t->curl, CURLINFO_REQUEST_SIZE, &sent);
    *retry = !strcmp(method, "GET") || !strcmp(method, "HEAD") ||
             change_not_taken(rc, sent);
    *nothing = rc == CURLE_GOT_NOTHING;
    free(resp->p);
    resp->p = NULL;
    return -EHOSTUNREACH;
  }
  curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, status);
  return 0;
}

/* A 503 that another coordinator of the cluster may not give: none leads
 * as far as this one knows ("no_leader": a follower cut off from etcd, or
 * no leader elected yet). Its message and code into what. */
static int is_no_leader(long status, const struct buf *b, char *what,
                        size_t n) {
  struct json_object *j, *e, *c, *m;
  int hit = 0;
  if (status != 503 || !b->p)
    return 0;
  j = json_tokener_parse(b->p);
  if (j && json_object_object_get_ex(j, "error", &e) &&
      json_object_object_get_ex(e, "code", &c) &&
      !strcmp(json_object_get_string(c), "no_leader")) {
    hit = 1;
    snprintf(what, n, "%s (HTTP 503, %s)",
             json_object_object_get_ex(e, "message", &m)
                 ? json_object_get_string(m)
                 : "no message",
             json_object_get_string(c));
  }
  json_object_put(j);
  return hit;
}

/* The addresses for a message about all of them: "A, B", or the one. */
const char *ctl_api_names(const struct ctl *t) {
  return t->n_apis > 1 ? t->api_all : t->api;
}

/* t->api := t->apis[i] */
static void use_api(struct ctl *t, int i) {
  t->cur = i;
  memcpy(t->api, t->apis[i], sizeof(t->api)); /* (the same size) */
}

/* --api (or $LYNX_API, named by what) into t->apis: URL[,URL...], each
 * with http:// when no scheme is given and no trailing /; blanks around
 * an address are dropped. 0, or EX_USAGE (said). */
int ctl_set_apis(struct ctl *t, const char *v, const char *what) {
  const char *p = v;
  size_t l;
  t->n_apis = 0;
  t->api_all[0] = 0;
  for (;;) {
    const char *comma = strchr(p, ','), *e = comma ? comma : p + strlen(p);
    char *a;
    while (p < e && (*p == ' ' || *p == '\t'))
      p++;
    while (e > p && (e[-1] == ' ' || e[-1] == '\t'))
      e--;
    if (e == p)
      return ctl_usage_err("%s: an empty address in '%s' (expected URL or "
                           "URL,URL,...)",
                           what, v);
    if (t->n_apis == API_MAX)
      return ctl_usage_err("%s: at most %d addresses, got '%s'", what, API_MAX,
                           v);
    if ((size_t)(e - p) + 8 >= API_LEN)
      return ctl_usage_err("%s: an address longer than %d characters in "
                           "'%.64s...'",
                           what, API_LEN - 9, v);
    a = t->apis[t->n_apis];
    snprintf(a, API_LEN, "%s%.*s",
             memmem(p, (size_t)(e - p), "://", 3) ? "" : "http://",
             (int)(e - p), p);
    l = strlen(a);
    while (l > 0 && a[l - 1] == '/')
      a[--l] = 0;
    l = strlen(t->api_all);
    snprintf(t->api_all + l, sizeof(t->api_all) - l, "%s%s", l ? ", " : "", a);
    t->n_apis++;
    if (!comma)
      break;
    p = comma + 1;
  }
  use_api(t, 0);
  return 0;
}

/*
 * One exchange with the coordinator: with several addresses, each in turn
 * from the one that answered last, until one answers (a GET goes on past
 * any failure, a change only past one that surely did not reach a
 * coordinator: change_not_taken), an answer 503 no_leader counting as no
 * answer but for the last resort. 0 with *status and the body in *resp
 * (t->api the address that answered); -EHOSTUNREACH when none can be
 * reached (err, errlen bytes, says why on one line, t->tried for each);
 * -EINTR when interrupted.
 */
int ctl_http_call(struct ctl *t, const char *method, const char *path,
                  const char *body, long timeout_ms, long *status,
                  struct buf *resp, char *err, size_t errlen) {
  struct buf held = {NULL, 0}; /* a 503 no_leader, the last resort */
  long held_status = 0;
  int held_at = -1, start = t->cur;

  t->n_tried = 0;
  err[0] = 0;
  for (int k = 0; k < t->n_apis; k++) {
    struct attempt *a = &t->tried[t->n_tried];
    char e[CURL_ERROR_SIZE];
    enum fail_hint hint;
    int retry, nothing, rc;
    use_api(t, (start + k) % t->n_apis);
    /* closed with no answer: at its connection caps a coordinator sheds
     * the oldest connection whose request it has not yet read (docs/api.md
     * "Connections"), which on a loaded host under a flood from this
     * address can be ours before its request arrives: it took nothing, so
     * the request is sent again, twice at most */
    for (int again = 0;; again++) {
      rc = http_one(t, method, path, body, timeout_ms, status, resp, e, &hint,
                    &retry, &nothing);
      if (rc != -EHOSTUNREACH || !nothing || again == 2)
        break;
    }
    if (rc == -EINTR) {
      free(held.p);
      return rc;
    }
    memcpy(a->api, t->api, sizeof(a->api));
    a->hint = hint;
    a->answered = rc == 0;
    if (rc == 0) {
      if (t->n_apis == 1 ||
          !is_no_leader(*status, resp, a->what, sizeof(a->what))) {
        free(held.p);
        return 0; /* an answer: this address is the one from now on */
      }
      /* a coordinator that knows of no leader: another may */
      free(held.p);
      held = *resp;
      held_status = *status;
      held_at = t->cur;
      resp->p = NULL;
      resp->len = 0;
      t->n_tried++;
      continue;
    }
    snprintf(a->what, sizeof(a->what), "%s", e);
    t->n_tried++;
    if (!retry)
      break; /* a change that may have arrived is not sent twice */
  }
  if (held_at >= 0) {
    use_api(t, held_at);
    *status = held_status;
    *resp = held;
    return 0;
  }
  /* err: one line, for the messages that have room for one */
  if (t->n_tried == 1) {
    snprintf(err, errlen, "%s", t->tried[0].what);
  } else {
    size_t l = 0;
    for (int i = 0; i < t->n_tried && l + 1 < errlen; i++) {
      int w = snprintf(err + l, errlen - l, "%s%s: %s", i ? "; " : "",
                       t->tried[i].api, t->tried[i].what);
      if (w < 0)
        break;
      l += (size_t)w;
    }
  }
  return -EHOSTUNREACH;
}

/* The hint for an address that failed so, with its URL. */
static void hint_msg(enum fail_hint h, const char *api, int several, char *out,
                     size_t n) {
  const char *rest = strstr(api, "://");
  rest = rest ? rest + 3 : api;
  switch (h) {
  case HINT_TLS_CERT:
    snprintf(out, n,
             "(TLS: is its certificate signed by the CA given with "
             "--cacert or $LYNX_CACERT, and does it name the API's "
             "host?)");
    break;
  case HINT_TRY_HTTPS:
    snprintf(out, n,
             "(no answer to plain HTTP: the coordinator may serve "
             "HTTPS: try --api https://%s with --cacert F)",
             rest);
    break;
  case HINT_TRY_HTTP:
    snprintf(out, n,
             "(no TLS there: the coordinator may serve plain "
             "HTTP: try --api http://%s)",
             rest);
    break;
  default:
    snprintf(out, n, "%s",
             several ? "(is lynx-coordinator running with --http "
                       "on those addresses? set --api "
                       "URL[,URL...] or $LYNX_API)"
                     : "(is lynx-coordinator running with --http "
                       "on that address? set --api URL or "
                       "$LYNX_API)");
  }
}

/* What each address of the last call said, a line each ("  URL: what",
 * its hint below when it has its own), appended to msg (n bytes). */
static void tried_lines(const struct ctl *t, char *msg, size_t n) {
  size_t l = strlen(msg);
  for (int i = 0; i < t->n_tried && l + 1 < n; i++) {
    const struct attempt *a = &t->tried[i];
    char h[API_LEN + 160] = "";
    int w;
    if (!a->answered && a->hint != HINT_NONE)
      hint_msg(a->hint, a->api, 1, h, sizeof(h));
    w = snprintf(msg + l, n - l, "\n  %s: %s%s%s", a->api, a->what,
                 h[0] ? "\n    " : "", h);
    if (w < 0)
      break;
    l += (size_t)w;
  }
}

/* "cannot reach the coordinator at URL: why" and a hint on a second line;
 * with several addresses, a line for each and the hint last. */
static void unreachable_msg(const struct ctl *t, const char *err, char *msg,
                            size_t n) {
  char h[API_LEN + 160];
  int plain = 0; /* an address with nothing to say but unreachable */
  if (t->n_tried <= 1 && t->n_apis <= 1) {
    hint_msg(t->n_tried ? t->tried[0].hint : HINT_NONE, t->api, 0, h,
             sizeof(h));
    snprintf(msg, n, "cannot reach the coordinator at %s: %s\n  %s", t->api,
             err, h);
    return;
  }
  if (t->n_tried < t->n_apis)
    snprintf(msg, n,
             "cannot reach the coordinator at %s, and the change "
             "is not sent to another address (it may have arrived):",
             t->api);
  else
    snprintf(msg, n, "cannot reach the coordinator at any of %s:", t->api_all);
  tried_lines(t, msg, n);
  for (int i = 0; i < t->n_tried; i++)
    plain |= t->tried[i].hint == HINT_NONE;
  if (plain) {
    size_t l = strlen(msg);
    hint_msg(HINT_NONE, t->api, t->n_apis > 1, h, sizeof(h));
    snprintf(msg + l, n - l, "\n  %s", h);
  }
}

/*
 * A call whose answer must be 2xx JSON, printing nothing. EX_OK with *out
 * (a parsed object, or NULL when the body is empty or the call was
 * interrupted) and *raw, the body as it came (malloc'd, or NULL); otherwise
 * the exit code with msg saying what went wrong (without "lynxctl: "), and
 * for a refusal (not 2xx) the refusal's body in *raw.
 */
int ctl_api_msg(struct ctl *t, const char *method, const char *path,
                const char *body, struct json_object **out, char **raw,
                char *msg, size_t msglen) {
  char err[ERR_MAX];
  struct buf b;
  long status = 0;
  struct json_object *j = NULL;
  int rc;

  *out = NULL;
  *raw = NULL;
  msg[0] = 0;
  rc = ctl_http_call(t, method, path, body, CALL_TIMEOUT_MS, &status, &b, err,
                     sizeof(err));
  if (rc == -EINTR)
    return EX_OK;
  if (rc) {
    unreachable_msg(t, err, msg, msglen);
    return EX_UNREACHABLE;
  }
  if (b.p && b.len)
    j = json_tokener_parse(b.p);
  if (status < 200 || status > 299) {
    struct json_object *e, *m, *code;
    if (j && json_object_object_get_ex(j, "error", &e) &&
        json_object_object_get_ex(e, "message", &m)) {
      json_object_object_get_ex(e, "code", &code);
      snprintf(msg, msglen, "%s (HTTP %ld%s%s)", json_object_get_string(m),
               status, code ? ", " : "",
               code ? json_object_get_string(code) : "");
    } else {
      snprintf(msg, msglen, "the coordinator answered HTTP %ld: %.300s", status,
               b.p ? b.p : "(no body)");
    }
    /* every address failed, the last resort a 503 no_leader: what each
     * said */
    if (status == 503 && t->n_tried > 1)
      tried_lines(t, msg, msglen);
    json_object_put(j);
    *raw = b.p;
    return EX_API;
  }
  if (b.p && b.len && !j) {
    snprintf(msg, msglen,
             "the coordinator's answer (HTTP %ld) is not JSON: %.300s", status,
             b.p);
    free(b.p);
    return EX_API;
  }
  *out = j;
  *raw = b.p;
  return EX_OK;
}

/*
 * ctl_api_msg that prints what went wrong (an unreachable coordinator not
 * while t->quiet), with --json a refusal's body on stdout too; raw may be
 * NULL when the body is not wanted.
 */
int ctl_api(struct ctl *t, const char *method, const char *path,
            const char *body, struct json_object **out, char **raw) {
  char msg[MSG_MAX], *r;
  int rc = ctl_api_msg(t, method, path, body, out, &r, msg, sizeof(msg));
  if (rc != EX_OK) {
    if (rc != EX_UNREACHABLE || !t->quiet)
      fprintf(stderr, "lynxctl: %s\n", msg);
    if (t->json && r)
      fputs(r, stdout);
    free(r);
    r = NULL;
  }
  if (raw)
    *raw = r;
  else
    free(r);
  return rc;
}

/* "/v1/nodes/" + escaped id + suffix */
int ctl_path_with(struct ctl *t, char *path, size_t len, const char *prefix,
                  const char *seg, const char *suffix) {
  char *e = curl_easy_escape(t->curl, seg, 0);
  if (!e)
    return -ENOMEM;
  snprintf(path, len, "%s%s%s", prefix, e, suffix);
  curl_free(e);
  return 0;
}

/* ---- the long poll (GET /v1/watch): watch, node drain --wait ----------- */

#define WATCH_POLL_MS 30000L

/* Waits until the registry version differs from version (it grew, or the
 * coordinator restarted with a lower one), or until the monotonic clock
 * (lynx_now_ns) reaches until_ns (0: no end); rides out coordinator
 * outages. EX_OK (also when interrupted: ctl_stop is set) or EX_API. */
int ctl_watch_wait(struct ctl *t, uint64_t version, uint64_t until_ns,
                   int *lost) {
  char err[ERR_MAX], path[128];
  for (;;) {
    struct buf b;
    long status = 0, poll_ms = WATCH_POLL_MS;
    struct json_object *j, *v;
    uint64_t nv, now = lynx_now_ns();
    int rc;
    if (ctl_stop || (until_ns && now >= until_ns))
      return EX_OK;
    if (until_ns && (until_ns - now) / 1000000u < (uint64_t)poll_ms)
      poll_ms = (long)((until_ns - now) / 1000000u) + 1;
    snprintf(path, sizeof(path), "/v1/watch?since=%llu&timeout_ms=%ld",
             (unsigned long long)version, poll_ms);
    rc = ctl_http_call(t, "GET", path, NULL, poll_ms + 10000, &status, &b, err,
                       sizeof(err));
    if (rc == -EINTR)
      return EX_OK;
    if (rc) {
      struct timespec one = {1, 0};
      if (!*lost)
        fprintf(stderr,
                "lynxctl: lost the coordinator at %s (%s); "
                "retrying every second\n",
                ctl_api_names(t), err);
      *lost = 1;
      nanosleep(&one, NULL);
      continue;
    }
    if (*lost) {
      fprintf(stderr, "lynxctl: coordinator back\n");
      *lost = 0;
    }
    j = b.p ? json_tokener_parse(b.p) : NULL;
    if (status != 200 || !j || !json_object_object_get_ex(j, "version", &v)) {
      fprintf(stderr, "lynxctl: watch failed (HTTP %ld): %.300s\n", status,
              b.p ? b.p : "(no body)");
      json_object_put(j);
      free(b.p);
      return EX_API;
    }
    nv = json_object_get_uint64(v);
    json_object_put(j);
    free(b.p);
    if (nv != version)
      return EX_OK;
  }
}
