/*
 * lynxctl - the operator's command line for the coordinator's JSON API
 * (docs/api.md). libcurl for HTTP, json-c for JSON.
 *
 *   lynxctl [--api URL[,URL...]] [--token-file F] [--json] COMMAND
 *
 * Human-readable aligned tables by default; --json prints the API's answer
 * as it came. With several --api addresses (several coordinators, one of
 * them leading) each call tries them in turn, from the one that answered
 * last, until one answers. Exit codes: 0 ok, 1 the API refused (its message
 * is printed) or another runtime failure (a token file that cannot be
 * read), 2 usage error, 3 the coordinator cannot be reached.
 */
#include <curl/curl.h>
#include <errno.h>
#include <json-c/json.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "options.h"
#include "top.h"
#include "util.h"

#define EX_OK 0
#define EX_API 1
#define EX_USAGE 2
#define EX_UNREACHABLE 3

#define DEFAULT_API "http://127.0.0.1:7780"
#define CALL_TIMEOUT_MS 15000L
#define WATCH_POLL_MS 30000L
#define FILE_MAX (16u << 20)

static const char usage_text[] =
    "usage: lynxctl [--api URL[,URL...]] [--token-file F] [--cacert F]\n"
    "               [--json] COMMAND\n"
    "\n"
    "commands:\n"
    "  nodes | accelerators | mqueues | services | frontends\n"
    "  service create --name N --port P --app A [--slot-size Z] [--slots S]\n"
    "                 [--msg-max B] [--mqueues M] [--work-us U]\n"
    "                 [--proto udp|tcp [--framing len32|fixed:N]]\n"
    "                 [--backend NAME=HOST:PORT[/memcached|/len32]]...\n"
    "                 [--placement all | --replicas N] [--selector k=v,...]\n"
    "  service create -f FILE.json      (-f - reads standard input)\n"
    "  service show NAME                its fields, back ends and where its\n"
    "                                   instances run\n"
    "  service delete NAME\n"
    "  node drain ID [--wait [--timeout S]]\n"
    "                                   --wait: until its instances are\n"
    "                                   stopped, S seconds at most (60),\n"
    "                                   else exit 1\n"
    "  node undrain ID | node forget ID\n"
    "  frontend drain ID | frontend undrain ID\n"
    "  watch                            a line and the node table per change\n"
    "  top [-d SECONDS] [-n COUNT] [-s rate|outstanding|p99|id] [-b]\n"
    "                                   accelerators by load, every -d s (1);\n"
    "                                   -n frames, then exit; -b text frames\n"
    "                                   (also when stdout is no terminal);\n"
    "                                   keys: q quit, r o p i sort, space\n"
    "                                   refresh\n"
    "\n"
    "options:\n"
    "  --api URL[,URL...]\n"
    "                    coordinator API (default $LYNX_API, else\n"
    "                    " DEFAULT_API "); several (the coordinators of\n"
    "                    one cluster): each in turn until one answers\n"
    "  --token-file F    send the token in F (default $LYNX_TOKEN_FILE)\n"
    "  --cacert F        trust the API's certificate when this CA signed it\n"
    "                    (https:// URLs; default $LYNX_CACERT, else the\n"
    "                    system's CAs)\n"
    "  --json            print the API's JSON instead of tables\n"
    "\n"
    "exit codes: 0 ok, 1 API error or other runtime failure, 2 usage error, "
    "3 coordinator unreachable\n";

#define API_MAX 8    /* --api addresses */
#define API_LEN 512  /* one address */
#define ERR_MAX 1024 /* what went wrong in one call, on one line */

/* How an address failed, for the hint that goes with it. */
enum fail_hint {
  HINT_NONE,      /* nothing answers there (connection refused, timeout) */
  HINT_TLS_CERT,  /* an https:// handshake failed: the certificate, mostly */
  HINT_TRY_HTTPS, /* http:// got no answer: the API may serve HTTPS */
  HINT_TRY_HTTP,  /* https:// got plain text: the API may serve HTTP */
};

/* One address a call tried and what it said, when it did not do. */
struct attempt {
  char api[API_LEN];
  char what[CURL_ERROR_SIZE + 160];
  enum fail_hint hint;
  int answered; /* it answered (503 no_leader), it was not unreachable */
};

struct ctl {
  char api[API_LEN]; /* the address in use: the one that answered last */
  char apis[API_MAX][API_LEN]; /* --api, in order */
  char api_all[API_MAX * (API_LEN + 2)]; /* "A, B": for messages */
  int n_apis, cur; /* cur: apis[cur] is api */
  /* the last call's addresses that did not do, in the order tried (all of
   * them when the call failed) */
  struct attempt tried[API_MAX];
  int n_tried;
  char *token;
  const char *cacert; /* CA file for an https API, or NULL: the system's */
  int json;
  int quiet; /* do not report an unreachable coordinator (watch retries) */
  CURL *curl;
};

struct buf {
  char *p;
  size_t len;
};

static volatile sig_atomic_t g_stop;

static int usage_err(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

static int usage_err(const char *fmt, ...) {
  va_list ap;
  fputs("lynxctl: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputs("\n(lynxctl --help for usage)\n", stderr);
  return EX_USAGE;
}

/* A command's options into opts (tab's). 1 when the command ends here,
 * with *exit_code: after an error (said, with a hint: EX_USAGE) or --help
 * (EX_OK), opts freed; 0 to go on (*exit_code EX_OK). */
static int scan_cmd(const struct lynx_opt *tab, void *opts, int argc,
                    char **argv, struct lynx_opts_scan *scan, int *exit_code) {
  int rc = lynx_opts_scan(tab, opts, argc, argv, usage_text, scan);
  *exit_code = rc ? EX_USAGE : EX_OK;
  if (!rc && !scan->help)
    return 0;
  lynx_opts_free(tab, opts);
  if (rc)
    fputs("(lynxctl --help for usage)\n", stderr);
  return 1;
}

/* ---- HTTP --------------------------------------------------------------- */

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
  return g_stop ? 1 : 0; /* Ctrl-C aborts a long poll */
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
       strstr(err, "record layer failure") ||
       answers_plain_http(api)))
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
  if (rc == CURLE_ABORTED_BY_CALLBACK && g_stop) {
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
static const char *api_names(const struct ctl *t) {
  return t->n_apis > 1 ? t->api_all : t->api;
}

/* t->api := t->apis[i] */
static void use_api(struct ctl *t, int i) {
  t->cur = i;
  memcpy(t->api, t->apis[i], sizeof(t->api)); /* (the same size) */
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
static int http_call(struct ctl *t, const char *method, const char *path,
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
      rc = http_one(t, method, path, body, timeout_ms, status, resp, e,
                    &hint, &retry, &nothing);
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
static void hint_msg(enum fail_hint h, const char *api, int several,
                     char *out, size_t n) {
  const char *rest = strstr(api, "://");
  rest = rest ? rest + 3 : api;
  switch (h) {
  case HINT_TLS_CERT:
    snprintf(out, n, "(TLS: is its certificate signed by the CA given with "
                     "--cacert or $LYNX_CACERT, and does it name the API's "
                     "host?)");
    break;
  case HINT_TRY_HTTPS:
    snprintf(out, n, "(no answer to plain HTTP: the coordinator may serve "
                     "HTTPS: try --api https://%s with --cacert F)", rest);
    break;
  case HINT_TRY_HTTP:
    snprintf(out, n, "(no TLS there: the coordinator may serve plain "
                     "HTTP: try --api http://%s)", rest);
    break;
  default:
    snprintf(out, n, "%s", several
                               ? "(is lynx-coordinator running with --http "
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
    snprintf(msg, n, "cannot reach the coordinator at %s, and the change "
             "is not sent to another address (it may have arrived):",
             t->api);
  else
    snprintf(msg, n, "cannot reach the coordinator at any of %s:",
             t->api_all);
  tried_lines(t, msg, n);
  for (int i = 0; i < t->n_tried; i++)
    plain |= t->tried[i].hint == HINT_NONE;
  if (plain) {
    size_t l = strlen(msg);
    hint_msg(HINT_NONE, t->api, t->n_apis > 1, h, sizeof(h));
    snprintf(msg + l, n - l, "\n  %s", h);
  }
}

#define MSG_MAX 4096

/*
 * A call whose answer must be 2xx JSON, printing nothing. EX_OK with *out
 * (a parsed object, or NULL when the body is empty or the call was
 * interrupted) and *raw, the body as it came (malloc'd, or NULL); otherwise
 * the exit code with msg saying what went wrong (without "lynxctl: "), and
 * for a refusal (not 2xx) the refusal's body in *raw.
 */
static int api_msg(struct ctl *t, const char *method, const char *path,
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
  rc = http_call(t, method, path, body, CALL_TIMEOUT_MS, &status, &b, err,
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
      snprintf(msg, msglen, "the coordinator answered HTTP %ld: %.300s",
               status, b.p ? b.p : "(no body)");
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
             "the coordinator's answer (HTTP %ld) is not JSON: %.300s",
             status, b.p);
    free(b.p);
    return EX_API;
  }
  *out = j;
  *raw = b.p;
  return EX_OK;
}

/*
 * api_msg that prints what went wrong (an unreachable coordinator not
 * while t->quiet), with --json a refusal's body on stdout too; raw may be
 * NULL when the body is not wanted.
 */
static int api(struct ctl *t, const char *method, const char *path,
               const char *body, struct json_object **out, char **raw) {
  char msg[MSG_MAX], *r;
  int rc = api_msg(t, method, path, body, out, &r, msg, sizeof(msg));
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
static int path_with(struct ctl *t, char *path, size_t len, const char *prefix,
                     const char *seg, const char *suffix) {
  char *e = curl_easy_escape(t->curl, seg, 0);
  if (!e)
    return -ENOMEM;
  snprintf(path, len, "%s%s%s", prefix, e, suffix);
  curl_free(e);
  return 0;
}

/* ---- tables ------------------------------------------------------------- */

typedef void (*fmt_fn)(struct json_object *v, char *out, size_t n);

struct col {
  const char *head;
  const char *key;
  fmt_fn fmt;
};

static void f_str(struct json_object *v, char *out, size_t n) {
  if (!v || json_object_is_type(v, json_type_null))
    snprintf(out, n, "-");
  else
    snprintf(out, n, "%s", json_object_get_string(v));
}

static void f_labels(struct json_object *v, char *out, size_t n) {
  size_t l = 0;
  out[0] = 0;
  if (v && json_object_is_type(v, json_type_object)) {
    json_object_object_foreach(v, k, val) {
      int w = snprintf(out + l, n - l, "%s%s=%s", l ? "," : "", k,
                       json_object_get_string(val));
      if (w < 0 || (size_t)w >= n - l)
        break;
      l += (size_t)w;
    }
  }
  if (!out[0])
    snprintf(out, n, "-");
}

static void f_count(struct json_object *v, char *out, size_t n) {
  if (v && json_object_is_type(v, json_type_array))
    snprintf(out, n, "%zu", json_object_array_length(v));
  else
    f_str(v, out, n);
}

static void f_ms_ago(struct json_object *v, char *out, size_t n) {
  uint64_t ms;
  if (!v || !(json_object_is_type(v, json_type_int) ||
              json_object_is_type(v, json_type_double))) {
    f_str(v, out, n);
    return;
  }
  ms = json_object_get_uint64(v);
  if (ms < 1000)
    snprintf(out, n, "%llums ago", (unsigned long long)ms);
  else if (ms < 60000)
    snprintf(out, n, "%.1fs ago", (double)ms / 1000.0);
  else if (ms < 3600000)
    snprintf(out, n, "%llum%02llus ago", (unsigned long long)(ms / 60000),
             (unsigned long long)(ms / 1000 % 60));
  else
    snprintf(out, n, "%lluh%02llum ago", (unsigned long long)(ms / 3600000),
             (unsigned long long)(ms / 60000 % 60));
}

static void f_bytes(struct json_object *v, char *out, size_t n) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double x;
  unsigned u = 0;
  if (!v || !json_object_is_type(v, json_type_int)) {
    f_str(v, out, n);
    return;
  }
  x = (double)json_object_get_uint64(v);
  while (x >= 1024.0 && u + 1 < LYNX_ARRAY_SIZE(units)) {
    x /= 1024.0;
    u++;
  }
  if (u == 0)
    snprintf(out, n, "%.0f%s", x, units[u]);
  else
    snprintf(out, n, "%.1f%s", x, units[u]);
}

static void f_bool(struct json_object *v, char *out, size_t n) {
  if (v && json_object_is_type(v, json_type_boolean))
    snprintf(out, n, "%s", json_object_get_boolean(v) ? "yes" : "no");
  else
    f_str(v, out, n);
}

/* "-" for an absent or empty string (a cpu accelerator's pci_bus_id). */
static void f_str_dash(struct json_object *v, char *out, size_t n) {
  if (v && json_object_is_type(v, json_type_string) &&
      json_object_get_string_len(v) == 0)
    snprintf(out, n, "-");
  else
    f_str(v, out, n);
}

/* An accelerator's "health" object in a few words: "ok", "lost",
 * "failed: <last error>", "stalled 1 mq 2.3s", joined with ", " (top.c,
 * whose HEALTH column says the same). */
static void f_health(struct json_object *v, char *out, size_t n) {
  struct lynx_top_health h;
  if (!v || !json_object_is_type(v, json_type_object)) {
    f_str(v, out, n);
    return;
  }
  lynx_top_health_parse(v, &h);
  lynx_top_health_fmt(&h, out, n);
}

/* "p50/p99" of an accelerator's "latency" object; "-" when no request was
 * taken in the window. */
static void f_lat_pair(struct json_object *v, const char *p50, const char *p99,
                       char *out, size_t n) {
  char a[24], b[24];
  if (!v || !json_object_is_type(v, json_type_object) ||
      !lynx_top_u64(v, "window_requests")) {
    snprintf(out, n, "-");
    return;
  }
  lynx_top_fmt_dur(lynx_top_u64(v, p50), a, sizeof(a));
  lynx_top_fmt_dur(lynx_top_u64(v, p99), b, sizeof(b));
  snprintf(out, n, "%s/%s", a, b);
}

static void f_lat_queue(struct json_object *v, char *out, size_t n) {
  f_lat_pair(v, "queue_p50_ns", "queue_p99_ns", out, n);
}

static void f_lat_service(struct json_object *v, char *out, size_t n) {
  f_lat_pair(v, "service_p50_ns", "service_p99_ns", out, n);
}

/* A node's accelerators' health: "ok" when all are, else "IDX: health"
 * for each one that is not, joined with "; ". */
static void f_node_health(struct json_object *v, char *out, size_t n) {
  size_t l = 0, len;
  char h[256];
  if (!v || !json_object_is_type(v, json_type_array)) {
    f_str(v, out, n);
    return;
  }
  out[0] = 0;
  len = json_object_array_length(v);
  for (size_t i = 0; i < len; i++) {
    struct json_object *a = json_object_array_get_idx(v, i), *hv = NULL, *id;
    const char *slash;
    int w;
    if (!a || !json_object_object_get_ex(a, "health", &hv) ||
        lynx_top_bool(hv, "dispatchable"))
      continue;
    f_health(hv, h, sizeof(h));
    /* "node/idx": the index is enough inside the node's row */
    slash = json_object_object_get_ex(a, "id", &id)
                ? strrchr(json_object_get_string(id), '/')
                : NULL;
    if (l < n) {
      w = snprintf(out + l, n - l, "%s%s: %s", l ? "; " : "",
                   slash ? slash + 1 : "?", h);
      l += w > 0 ? (size_t)w : 0;
    }
  }
  if (!out[0])
    snprintf(out, n, len ? "ok" : "-");
}

static void f_placement(struct json_object *v, char *out, size_t n) {
  struct json_object *r, *sel;
  if (v && json_object_is_type(v, json_type_object)) {
    char s[256];
    int w = 0;
    if (json_object_object_get_ex(v, "replicas", &r))
      w = snprintf(out, n, "replicas=%s", json_object_get_string(r));
    else
      w = snprintf(out, n, "all"); /* a selector alone: all matching */
    if (json_object_object_get_ex(v, "selector", &sel) &&
        json_object_is_type(sel, json_type_object) &&
        json_object_object_length(sel) > 0 && w >= 0 && (size_t)w < n) {
      f_labels(sel, s, sizeof(s));
      snprintf(out + w, n - (size_t)w, " where %s", s);
    }
    return;
  }
  f_str(v, out, n);
}

static void f_instances(struct json_object *v, char *out, size_t n) {
  struct json_object *r, *w;
  if (v && json_object_is_type(v, json_type_object) &&
      json_object_object_get_ex(v, "ready", &r) &&
      json_object_object_get_ex(v, "wanted", &w))
    snprintf(out, n, "%s/%s", json_object_get_string(r),
             json_object_get_string(w));
  else
    f_str(v, out, n);
}

/* A service's framing: "len32", "fixed:N"; "-" for udp (none). */
static void f_framing(struct json_object *v, char *out, size_t n) {
  struct json_object *fx;
  if (v && json_object_is_type(v, json_type_object) &&
      json_object_object_get_ex(v, "fixed", &fx))
    snprintf(out, n, "fixed:%s", json_object_get_string(fx));
  else
    f_str(v, out, n);
}

/* A service's back ends by name ("db,cache"); "-" when it has none. */
static void f_backends(struct json_object *v, char *out, size_t n) {
  size_t l = 0, len;
  out[0] = 0;
  if (v && json_object_is_type(v, json_type_array)) {
    len = json_object_array_length(v);
    for (size_t i = 0; i < len; i++) {
      struct json_object *b = json_object_array_get_idx(v, i), *name;
      int w;
      if (!b || !json_object_object_get_ex(b, "name", &name))
        continue;
      w = snprintf(out + l, n - l, "%s%s", l ? "," : "",
                   json_object_get_string(name));
      if (w < 0 || (size_t)w >= n - l)
        break;
      l += (size_t)w;
    }
  }
  if (!out[0])
    snprintf(out, n, "-");
}

static const struct col node_cols[] = {
    {"ID", "id", f_str},
    {"STATE", "state", f_str},
    {"ADDRESS", "address", f_str},
    {"EPOCH", "epoch", f_str},
    {"ACCELS", "accelerators", f_count},
    {"LABELS", "labels", f_labels},
    {"LAST-HEARTBEAT", "last_heartbeat_ms", f_ms_ago},
    {"HEALTH", "accelerators", f_node_health},
    {NULL, NULL, NULL},
};

static const struct col accel_cols[] = {
    {"ID", "id", f_str},
    {"NODE", "node", f_str},
    {"KIND", "kind", f_str},
    {"MODEL", "model", f_str},
    {"PCI-BUS", "pci_bus_id", f_str_dash},
    {"MEMORY", "memory_bytes", f_bytes},
    {"ORDERING", "ordering", f_str},
    {"STATE", "state", f_str},
    {"HEALTH", "health", f_health},
    {"REQUESTS", "requests", f_str},
    {"RESPONSES", "responses", f_str},
    {"QUEUE-P50/P99", "latency", f_lat_queue},
    {"SERVICE-P50/P99", "latency", f_lat_service},
    {NULL, NULL, NULL},
};

static const struct col mq_cols[] = {
    {"ID", "id", f_str},
    {"SERVICE", "service", f_str},
    {"NODE", "node", f_str},
    {"ACCEL", "accel", f_str},
    {"INSTANCE", "instance", f_str},
    {"SLOTS", "slots", f_str},
    {"SLOT-SIZE", "slot_size", f_str},
    {"TRANSPORT", "transport", f_str},
    {"FRONTEND", "frontend", f_str},
    {"DISPATCHED", "dispatched", f_str},
    {"RESPONDED", "responded", f_str},
    {"OUTSTANDING", "outstanding", f_str},
    {"DISPATCH", "dispatchable", f_bool},
    {NULL, NULL, NULL},
};

static const struct col svc_cols[] = {
    {"NAME", "name", f_str},
    {"PROTO", "proto", f_str},
    {"FRAMING", "framing", f_framing},
    {"PORT", "port", f_str},
    {"APP", "app", f_str},
    {"SLOT-SIZE", "slot_size", f_str},
    {"SLOTS", "slots", f_str},
    {"MQUEUES", "mqueues_per_accel", f_str},
    {"WORK-US", "work_us", f_str},
    {"BACKENDS", "backends", f_backends},
    {"PLACEMENT", "placement", f_placement},
    {"INSTANCES", "instances", f_instances},
    {"STATE", "state", f_str},
    {"REASON", "reason", f_str},
    {NULL, NULL, NULL},
};

static const struct col fe_cols[] = {
    {"ID", "id", f_str},
    {"ADDRESS", "address", f_str},
    {"CONNECTED", "connected", f_bool},
    {"ACTIVE", "active", f_bool},
    {"DRAINING", "draining", f_bool},
    {"INSTANCES", "instances", f_str},
    {"RELEASING", "releasing", f_str},
    {"EPOCH", "epoch", f_str},
    {"TABLE-VERSION", "table_version", f_str},
    {"LAST-SEEN", "last_seen_ms", f_ms_ago},
    {NULL, NULL, NULL},
};

/* Prints items (a JSON array of objects) as an aligned table. */
static int print_table(FILE *f, struct json_object *items,
                       const struct col *cols) {
  size_t nc = 0, nr, w[16] = {0};
  char **cells;
  char cell[512];

  while (cols[nc].head && nc < LYNX_ARRAY_SIZE(w))
    nc++;
  nr = items && json_object_is_type(items, json_type_array)
           ? json_object_array_length(items)
           : 0;
  cells = calloc(nr * nc + 1, sizeof(*cells));
  if (!cells)
    return -ENOMEM;
  for (size_t c = 0; c < nc; c++)
    w[c] = strlen(cols[c].head);
  for (size_t r = 0; r < nr; r++) {
    struct json_object *it = json_object_array_get_idx(items, r), *v = NULL;
    for (size_t c = 0; c < nc; c++) {
      if (!it || !json_object_object_get_ex(it, cols[c].key, &v))
        v = NULL;
      cols[c].fmt(v, cell, sizeof(cell));
      cells[r * nc + c] = strdup(cell);
      if (cells[r * nc + c] && strlen(cell) > w[c])
        w[c] = strlen(cell);
    }
  }
  for (size_t c = 0; c < nc; c++)
    fprintf(f, "%-*s%s", c + 1 < nc ? (int)w[c] : 0, cols[c].head,
            c + 1 < nc ? "  " : "\n");
  for (size_t r = 0; r < nr; r++)
    for (size_t c = 0; c < nc; c++) {
      const char *s = cells[r * nc + c] ? cells[r * nc + c] : "?";
      fprintf(f, "%-*s%s", c + 1 < nc ? (int)w[c] : 0, s,
              c + 1 < nc ? "  " : "\n");
    }
  for (size_t i = 0; i < nr * nc; i++)
    free(cells[i]);
  free(cells);
  return 0;
}

/* ---- commands ----------------------------------------------------------- */

static int cmd_list(struct ctl *t, const char *path, const struct col *cols) {
  struct json_object *j, *items = NULL;
  char *raw;
  int rc = api(t, "GET", path, NULL, &j, &raw);
  if (rc)
    return rc;
  if (t->json) {
    fputs(raw ? raw : "", stdout);
  } else {
    if (!j || !json_object_object_get_ex(j, "items", &items)) {
      fprintf(stderr, "lynxctl: the coordinator's answer has no \"items\"\n");
      rc = EX_API;
    } else if (print_table(stdout, items, cols)) {
      rc = EX_API;
    }
  }
  json_object_put(j);
  free(raw);
  return rc;
}

static int parse_u32(const char *opt, const char *s, uint32_t *out) {
  uint64_t v;
  if (lynx_parse_u64(s, 0, UINT32_MAX, &v))
    return usage_err("%s: expected a non-negative integer, got '%s'", opt, s);
  *out = (uint32_t)v;
  return 0;
}

static char *read_all(FILE *f, size_t max, int *too_big) {
  size_t len = 0, cap = 4096;
  char *p = malloc(cap), *np;
  *too_big = 0;
  if (!p)
    return NULL;
  for (;;) {
    size_t n;
    if (len + 1 >= cap) {
      if (cap > max) {
        *too_big = 1;
        free(p);
        return NULL;
      }
      np = realloc(p, cap * 2);
      if (!np) {
        free(p);
        return NULL;
      }
      p = np;
      cap *= 2;
    }
    n = fread(p + len, 1, cap - len - 1, f);
    len += n;
    if (n == 0)
      break;
  }
  if (ferror(f)) {
    free(p);
    return NULL;
  }
  p[len] = 0;
  return p;
}

/* "k=v,k2=v2" into a JSON object. */
static int selector_json(const char *s, struct json_object *obj) {
  char *dup = strdup(s), *save = NULL, *tok;
  if (!dup)
    return -ENOMEM;
  for (tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(tok, '=');
    if (!eq || eq == tok) {
      free(dup);
      return -EINVAL;
    }
    *eq = 0;
    json_object_object_add(obj, tok, json_object_new_string(eq + 1));
  }
  free(dup);
  return 0;
}

static int print_service_created(struct ctl *t, struct json_object *j,
                                 const char *raw) {
  struct json_object *arr, *name;
  if (t->json) {
    fputs(raw ? raw : "", stdout);
    return EX_OK;
  }
  if (j && json_object_object_get_ex(j, "name", &name))
    printf("service %s created\n", json_object_get_string(name));
  else
    printf("service created\n");
  arr = json_object_new_array();
  if (arr && j) {
    json_object_array_add(arr, json_object_get(j));
    print_table(stdout, arr, svc_cols);
  }
  json_object_put(arr);
  return EX_OK;
}

/* service create's options (common/options.h); the numbers are sent only
 * when given. --backend, which may be repeated, is taken from the command
 * line before the table sees it (backend_args). */
struct create_opts {
  char *file, *name, *app, *proto, *framing, *placement, *selector;
  uint32_t port, slot_size, slots, msg_max, mqueues, work_us, replicas;
};

#define CO(f) offsetof(struct create_opts, f)
#define CO_STR(name, f) {name, LYNX_OPT_STR, CO(f), NULL, 0, 0, NULL, ""}
#define CO_NUM(name, f)                                                        \
  {name, LYNX_OPT_U32, CO(f), NULL, 0, UINT32_MAX, NULL, ""}
enum { C_FILE, C_F, C_NAME, C_APP, C_PROTO, C_FRAMING, C_PORT, C_SLOT_SIZE,
       C_SLOTS, C_MSG_MAX, C_MQUEUES, C_WORK_US, C_REPLICAS, C_PLACEMENT,
       C_SELECTOR };
static const struct lynx_opt create_tab[] = {
    [C_FILE] = CO_STR("file", file),
    [C_F] = CO_STR("f", file),
    [C_NAME] = CO_STR("name", name),
    [C_APP] = CO_STR("app", app),
    [C_PROTO] = CO_STR("proto", proto),
    [C_FRAMING] = CO_STR("framing", framing),
    [C_PORT] = CO_NUM("port", port),
    [C_SLOT_SIZE] = CO_NUM("slot-size", slot_size),
    [C_SLOTS] = CO_NUM("slots", slots),
    [C_MSG_MAX] = CO_NUM("msg-max", msg_max),
    [C_MQUEUES] = CO_NUM("mqueues", mqueues),
    [C_WORK_US] = CO_NUM("work-us", work_us),
    [C_REPLICAS] = CO_NUM("replicas", replicas),
    [C_PLACEMENT] = CO_STR("placement", placement),
    [C_SELECTOR] = CO_STR("selector", selector),
    LYNX_OPT_END,
};
#undef CO_NUM
#undef CO_STR
#undef CO

/* Whether arg is an option of tab that takes its value from the next
 * argument (--name VALUE, -f FILE; not --name=VALUE, not a flag). */
static int takes_next(const struct lynx_opt *tab, const char *arg) {
  const char *name;
  if (arg[0] != '-' || strchr(arg, '='))
    return 0;
  name = arg[1] == '-' ? arg + 2 : arg + 1;
  for (const struct lynx_opt *o = tab; o->name; o++)
    if (!strcmp(o->name, name))
      return o->type != LYNX_OPT_FLAG;
  return 0;
}

/* argv without its --backend options (into rest, *n_rest of them, argv[0]
 * first), their values in vals (*n_vals; pointers into argv). 0, or
 * EX_USAGE (said). */
static int backend_args(int argc, char **argv, char **rest, int *n_rest,
                        const char **vals, int *n_vals) {
  *n_rest = 0;
  *n_vals = 0;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (i > 0 && (!strcmp(a, "--backend") || !strncmp(a, "--backend=", 10))) {
      if (a[9] == '=')
        vals[(*n_vals)++] = a + 10;
      else if (i + 1 < argc)
        vals[(*n_vals)++] = argv[++i];
      else
        return usage_err("--backend needs a value: NAME=HOST:PORT[/PROTO]");
      continue;
    }
    rest[(*n_rest)++] = argv[i];
    if (i > 0 && takes_next(create_tab, a) && i + 1 < argc)
      rest[(*n_rest)++] = argv[++i]; /* a value, whatever it looks like */
  }
  return 0;
}

/* --backend NAME=HOST:PORT[/PROTO][,NAME=...] into the array backends
 * ({"name", "address"[, "proto"]}: the API's default proto is len32). 0,
 * EX_USAGE (said) or EX_API (out of memory). */
static int backends_json(const char *v, struct json_object *backends) {
  char *dup = strdup(v), *save = NULL, *tok;
  if (!dup)
    return EX_API;
  if (!v[0]) {
    free(dup);
    return usage_err("--backend: expected NAME=HOST:PORT[/PROTO], got ''");
  }
  for (tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(tok, '='), *slash;
    struct json_object *b;
    if (!eq || eq == tok || !eq[1] || eq[1] == '/') {
      int rc = usage_err("--backend: expected NAME=HOST:PORT[/PROTO] (e.g. "
                         "db=127.0.0.1:11211/memcached), got '%s'",
                         tok);
      free(dup);
      return rc;
    }
    *eq = 0;
    slash = strrchr(eq + 1, '/');
    if (slash && !slash[1]) {
      int rc = usage_err("--backend %s: a '/' without a protocol after it "
                         "(memcached or len32)",
                         tok);
      free(dup);
      return rc;
    }
    if (slash)
      *slash = 0;
    b = json_object_new_object();
    if (!b) {
      free(dup);
      return EX_API;
    }
    json_object_object_add(b, "name", json_object_new_string(tok));
    json_object_object_add(b, "address", json_object_new_string(eq + 1));
    if (slash)
      json_object_object_add(b, "proto", json_object_new_string(slash + 1));
    json_object_array_add(backends, b);
  }
  free(dup);
  return 0;
}

/* The request body for the options o (given: which were on the command
 * line; backends: the --backend values, n_backends of them) into *out
 * (malloc'd). An exit code: EX_OK, EX_USAGE (printed) or EX_API (out of
 * memory). */
static int create_body(const struct create_opts *o, uint64_t given,
                       const char *const *backends, int n_backends,
                       char **out) {
  const char *file = o->file, *name = o->name, *app = o->app,
             *placement = o->placement, *selector = o->selector,
             *proto = o->proto, *framing = o->framing;
  uint32_t port = o->port, slot_size = o->slot_size, slots = o->slots,
           msg_max = o->msg_max, mqueues = o->mqueues, work_us = o->work_us,
           replicas = o->replicas;
  int has_port = !!(given & (1ull << C_PORT)),
      has_slot_size = !!(given & (1ull << C_SLOT_SIZE)),
      has_slots = !!(given & (1ull << C_SLOTS)),
      has_msg_max = !!(given & (1ull << C_MSG_MAX)),
      has_mq = !!(given & (1ull << C_MQUEUES)),
      has_work = !!(given & (1ull << C_WORK_US)),
      has_replicas = !!(given & (1ull << C_REPLICAS));
  struct json_object *req = NULL;
  char *body = NULL;
  int rc;

  if (file) {
    FILE *f;
    int too_big = 0;
    if (name || app || placement || selector || proto || framing ||
        has_port || has_slot_size || has_slots || has_msg_max || has_mq ||
        has_work || has_replicas || n_backends)
      return usage_err("service create: -f takes the whole spec; give no "
                       "other option with it");
    f = strcmp(file, "-") == 0 ? stdin : fopen(file, "r");
    if (!f) {
      fprintf(stderr, "lynxctl: cannot open %s: %s\n", file, strerror(errno));
      return EX_USAGE;
    }
    body = read_all(f, FILE_MAX, &too_big);
    if (f != stdin)
      fclose(f);
    if (!body) {
      fprintf(stderr, "lynxctl: cannot read %s: %s\n", file,
              too_big ? "larger than 16 MiB" : "read error");
      return EX_USAGE;
    }
    *out = body;
    return EX_OK;
  }
  if (!name || !has_port || !app)
    return usage_err("service create needs --name, --port and --app (or "
                     "-f FILE.json)");
  if (placement && strcmp(placement, "all") != 0)
    return usage_err("--placement: only 'all' is a placement name; use "
                     "--replicas N for a replica count");
  if (placement && has_replicas)
    return usage_err("--placement all and --replicas exclude each other");
  if (proto && strcmp(proto, "udp") && strcmp(proto, "tcp"))
    return usage_err("--proto: expected udp or tcp, got '%s'", proto);
  if (framing && strcmp(framing, "len32") && strncmp(framing, "fixed:", 6))
    return usage_err("--framing: expected len32 or fixed:N, got '%s'",
                     framing);
  if (framing && (!proto || strcmp(proto, "tcp")))
    return usage_err("--framing goes with --proto tcp (a udp service's "
                     "messages are its datagrams)");
  req = json_object_new_object();
  if (!req)
    return EX_API;
  json_object_object_add(req, "name", json_object_new_string(name));
  json_object_object_add(req, "port", json_object_new_int64(port));
  json_object_object_add(req, "app", json_object_new_string(app));
  if (proto)
    json_object_object_add(req, "proto", json_object_new_string(proto));
  if (framing && strncmp(framing, "fixed:", 6) == 0) {
    struct json_object *f = json_object_new_object();
    uint32_t n = 0;
    if (!f || parse_u32("--framing fixed:N", framing + 6, &n)) {
      json_object_put(f);
      json_object_put(req);
      return f ? EX_USAGE : EX_API;
    }
    json_object_object_add(f, "fixed", json_object_new_int64(n));
    json_object_object_add(req, "framing", f);
  } else if (framing) {
    json_object_object_add(req, "framing", json_object_new_string(framing));
  }
  if (has_slot_size)
    json_object_object_add(req, "slot_size", json_object_new_int64(slot_size));
  if (has_slots)
    json_object_object_add(req, "slots", json_object_new_int64(slots));
  if (has_msg_max)
    json_object_object_add(req, "msg_max", json_object_new_int64(msg_max));
  if (has_mq)
    json_object_object_add(req, "mqueues_per_accel",
                           json_object_new_int64(mqueues));
  if (has_work)
    json_object_object_add(req, "work_us", json_object_new_int64(work_us));
  if (n_backends) {
    struct json_object *a = json_object_new_array();
    if (!a) {
      json_object_put(req);
      return EX_API;
    }
    json_object_object_add(req, "backends", a);
    for (int i = 0; i < n_backends; i++)
      if ((rc = backends_json(backends[i], a)) != 0) {
        json_object_put(req);
        return rc;
      }
  }
  if (has_replicas || selector) {
    /* {"replicas": N, "selector": {...}}; a selector alone (with or
     * without --placement all): every accelerator of the matching nodes */
    struct json_object *p = json_object_new_object(),
                       *sel = json_object_new_object();
    if (!p || !sel) {
      json_object_put(p);
      json_object_put(sel);
      json_object_put(req);
      return EX_API;
    }
    if (has_replicas)
      json_object_object_add(p, "replicas", json_object_new_int64(replicas));
    if (selector && selector_json(selector, sel)) {
      json_object_put(p);
      json_object_put(sel);
      json_object_put(req);
      return usage_err("--selector: expected k=v[,k=v...], got '%s'",
                       selector);
    }
    json_object_object_add(p, "selector", sel);
    json_object_object_add(req, "placement", p);
  } else if (placement) {
    json_object_object_add(req, "placement", json_object_new_string("all"));
  }
  body = strdup(json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN));
  json_object_put(req);
  if (!body)
    return EX_API;
  *out = body;
  return EX_OK;
}

/* argv[0] is "create"; the rest its options. */
static int cmd_service_create(struct ctl *t, int argc, char **argv) {
  struct create_opts o;
  struct lynx_opts_scan scan = {LYNX_OPTS_USAGE_ONLY, NULL, 0, 0, 0};
  struct json_object *resp = NULL;
  char *body = NULL, *raw = NULL, **rest;
  const char **backends;
  int rc, n_rest, n_backends;

  memset(&o, 0, sizeof(o));
  rest = calloc((size_t)argc + 1, sizeof(*rest));
  backends = calloc((size_t)argc + 1, sizeof(*backends));
  if (!rest || !backends) {
    free(rest);
    free(backends);
    return EX_API;
  }
  rc = backend_args(argc, argv, rest, &n_rest, backends, &n_backends);
  if (rc == EX_OK && !scan_cmd(create_tab, &o, n_rest, rest, &scan, &rc)) {
    rc = create_body(&o, scan.given, backends, n_backends, &body);
    lynx_opts_free(create_tab, &o);
  }
  free(rest);
  free(backends);
  if (rc != EX_OK || !body)
    return rc; /* (--help: EX_OK, no body) */
  rc = api(t, "POST", "/v1/services", body, &resp, &raw);
  free(body);
  if (rc == EX_OK)
    rc = print_service_created(t, resp, raw);
  json_object_put(resp);
  free(raw);
  return rc;
}

/* DELETE / POST on one object; prints `done` (with the object's state when
 * it has one) or the raw answer with --json. */
static int cmd_object(struct ctl *t, const char *method, const char *prefix,
                      const char *id, const char *suffix, const char *what,
                      const char *done) {
  char path[1024];
  struct json_object *j, *state;
  char *raw;
  int rc;
  if (path_with(t, path, sizeof(path), prefix, id, suffix))
    return EX_API;
  rc = api(t, method, path, NULL, &j, &raw);
  if (rc == EX_OK) {
    if (t->json)
      fputs(raw ? raw : "", stdout);
    else if (j && strcmp(what, "node") == 0 && strcmp(method, "POST") == 0 &&
             json_object_object_get_ex(j, "state", &state))
      printf("%s %s %s: now %s\n", what, id, done,
             json_object_get_string(state));
    else
      printf("%s %s %s\n", what, id, done);
  }
  json_object_put(j);
  free(raw);
  return rc;
}

/* ---- service show ------------------------------------------------------ */

static const struct col backend_cols[] = {
    {"BACKEND", "name", f_str},
    {"ADDRESS", "address", f_str},
    {"PROTO", "proto", f_str},
    {NULL, NULL, NULL},
};

/* the rows service show makes of /v1/mqueues: one per instance */
static const struct col inst_cols[] = {
    {"INSTANCE", "instance", f_str},
    {"NODE", "node", f_str},
    {"ACCEL", "accel", f_str},
    {"MQUEUES", "mqueues", f_str},
    {"TRANSPORT", "transport", f_str},
    {"FRONTEND", "frontend", f_str_dash},
    {"DISPATCH", "dispatchable", f_bool},
    {"DISPATCHED", "dispatched", f_str},
    {"RESPONDED", "responded", f_str},
    {"OUTSTANDING", "outstanding", f_str},
    {NULL, NULL, NULL},
};

/* "label:  value" of service show, the value by fmt from j's key */
static void show_field(struct json_object *j, const char *label,
                       const char *key, fmt_fn fmt, const char *suffix) {
  struct json_object *v = NULL;
  char cell[512], lab[32];
  if (!json_object_object_get_ex(j, key, &v))
    v = NULL;
  fmt(v, cell, sizeof(cell));
  snprintf(lab, sizeof(lab), "%s:", label);
  printf("%-12s %s%s\n", lab, cell, v && suffix ? suffix : "");
}

static void f_inst_long(struct json_object *v, char *out, size_t n) {
  struct json_object *r, *w, *fs;
  if (v && json_object_is_type(v, json_type_object) &&
      json_object_object_get_ex(v, "ready", &r) &&
      json_object_object_get_ex(v, "wanted", &w)) {
    int l = snprintf(out, n, "%s ready of %s wanted",
                     json_object_get_string(r), json_object_get_string(w));
    if (l > 0 && (size_t)l < n && json_object_object_get_ex(v, "failed_starts",
                                                            &fs))
      snprintf(out + l, n - (size_t)l, ", %s failed start(s)",
               json_object_get_string(fs));
  } else {
    f_str(v, out, n);
  }
}

static uint64_t u64_of(struct json_object *o, const char *key) {
  struct json_object *v;
  return json_object_object_get_ex(o, key, &v) ? json_object_get_uint64(v)
                                               : 0;
}

/* The ready instances of service name, from the items of /v1/mqueues: a
 * row each into rows, in the order they come (an instance's mqueues come
 * one after another; by_id finds its row when they do not). */
static int instance_rows(struct json_object *items, const char *name,
                         struct json_object *rows) {
  static const char *const keys[] = {"instance", "node", "accel",
                                     "transport", "frontend"};
  static const char *const sums[] = {"dispatched", "responded",
                                     "outstanding"};
  struct json_object *last = NULL, *by_id = json_object_new_object();
  size_t n = json_object_array_length(items);
  if (!by_id)
    return -ENOMEM;
  for (size_t i = 0; i < n; i++) {
    struct json_object *mq = json_object_array_get_idx(items, i), *v;
    char id[24];
    if (!mq || !json_object_object_get_ex(mq, "service", &v) ||
        strcmp(json_object_get_string(v), name))
      continue;
    snprintf(id, sizeof(id), "%llu",
             (unsigned long long)u64_of(mq, "instance"));
    if ((!last || u64_of(last, "instance") != u64_of(mq, "instance")) &&
        !json_object_object_get_ex(by_id, id, &last)) {
      last = json_object_new_object();
      if (!last) {
        json_object_put(by_id);
        return -ENOMEM;
      }
      json_object_array_add(rows, last);
      json_object_object_add(by_id, id, json_object_get(last));
      for (size_t k = 0; k < LYNX_ARRAY_SIZE(keys); k++)
        if (json_object_object_get_ex(mq, keys[k], &v))
          json_object_object_add(last, keys[k], json_object_get(v));
      json_object_object_add(last, "mqueues", json_object_new_int64(0));
      json_object_object_add(last, "dispatchable",
                             json_object_new_boolean(0));
      for (size_t k = 0; k < LYNX_ARRAY_SIZE(sums); k++)
        json_object_object_add(last, sums[k], json_object_new_int64(0));
    }
    json_object_object_add(
        last, "mqueues",
        json_object_new_int64((int64_t)u64_of(last, "mqueues") + 1));
    for (size_t k = 0; k < LYNX_ARRAY_SIZE(sums); k++)
      json_object_object_add(
          last, sums[k],
          json_object_new_int64(
              (int64_t)(u64_of(last, sums[k]) + u64_of(mq, sums[k]))));
    if (json_object_object_get_ex(mq, "dispatchable", &v) &&
        json_object_get_boolean(v))
      json_object_object_add(last, "dispatchable",
                             json_object_new_boolean(1));
  }
  json_object_put(by_id);
  return 0;
}

/* service show NAME: the service's fields, its back ends, and where its
 * ready instances run (/v1/mqueues); --json: the service as the API has
 * it. */
static int cmd_service_show(struct ctl *t, const char *name) {
  char path[1024], msg[MSG_MAX];
  struct json_object *j = NULL, *mqs = NULL, *v, *items, *rows;
  char *raw = NULL, *mraw = NULL;
  int rc;

  if (path_with(t, path, sizeof(path), "/v1/services/", name, ""))
    return EX_API;
  rc = api(t, "GET", path, NULL, &j, &raw);
  if (rc || g_stop) {
    json_object_put(j);
    free(raw);
    return rc;
  }
  if (t->json) {
    fputs(raw ? raw : "", stdout);
    json_object_put(j);
    free(raw);
    return EX_OK;
  }
  free(raw);
  if (!j || !json_object_is_type(j, json_type_object)) {
    fprintf(stderr, "lynxctl: the coordinator's answer to GET %s is empty\n",
            path);
    json_object_put(j);
    return EX_API;
  }
  show_field(j, "name", "name", f_str, NULL);
  show_field(j, "state", "state", f_str, NULL);
  show_field(j, "reason", "reason", f_str_dash, NULL);
  show_field(j, "proto", "proto", f_str, NULL);
  show_field(j, "framing", "framing", f_framing, NULL);
  show_field(j, "port", "port", f_str, NULL);
  show_field(j, "app", "app", f_str, NULL);
  show_field(j, "slot-size", "slot_size", f_str, " bytes");
  show_field(j, "slots", "slots", f_str, " per ring");
  show_field(j, "msg-max", "msg_max", f_str, " bytes");
  show_field(j, "mqueues", "mqueues_per_accel", f_str, " per accelerator");
  show_field(j, "work-us", "work_us", f_str, NULL);
  show_field(j, "placement", "placement", f_placement, NULL);
  show_field(j, "instances", "instances", f_inst_long, NULL);
  if (json_object_object_get_ex(j, "backends", &v) &&
      json_object_is_type(v, json_type_array) &&
      json_object_array_length(v) > 0) {
    printf("%-12s %zu\n\n", "backends:", json_object_array_length(v));
    print_table(stdout, v, backend_cols);
  } else {
    printf("%-12s %s\n", "backends:", "none");
  }
  fflush(stdout);

  /* where they run: the API's service has counts only; /v1/mqueues lists
   * every mqueue of every ready instance */
  rc = api_msg(t, "GET", "/v1/mqueues", NULL, &mqs, &mraw, msg, sizeof(msg));
  free(mraw);
  if (rc == EX_OK && !g_stop &&
      (!mqs || !json_object_object_get_ex(mqs, "items", &items) ||
       !json_object_is_type(items, json_type_array))) {
    snprintf(msg, sizeof(msg), "the coordinator's answer to GET /v1/mqueues "
             "has no \"items\"");
    rc = EX_API;
  }
  if (rc != EX_OK) {
    fprintf(stderr, "lynxctl: where service %s's instances run is unknown: "
            "%s\n", name, msg);
    json_object_put(mqs);
    json_object_put(j);
    return rc;
  }
  if (g_stop) {
    json_object_put(mqs);
    json_object_put(j);
    return EX_OK;
  }
  rows = json_object_new_array();
  if (!rows || instance_rows(items, name, rows)) {
    fprintf(stderr, "lynxctl: out of memory\n");
    rc = EX_API;
  } else if (json_object_array_length(rows) == 0) {
    printf("\nno instance is ready\n");
  } else {
    printf("\n");
    print_table(stdout, rows, inst_cols);
  }
  json_object_put(rows);
  json_object_put(mqs);
  json_object_put(j);
  return rc;
}

static void on_signal(int sig) {
  (void)sig;
  g_stop = 1;
}

/* Waits until the registry version differs from version (it grew, or the
 * coordinator restarted with a lower one), or until the monotonic clock
 * (lynx_now_ns) reaches until_ns (0: no end); rides out coordinator
 * outages. EX_OK (also when interrupted: g_stop is set) or EX_API. */
static int watch_wait(struct ctl *t, uint64_t version, uint64_t until_ns,
                      int *lost) {
  char err[ERR_MAX], path[128];
  for (;;) {
    struct buf b;
    long status = 0, poll_ms = WATCH_POLL_MS;
    struct json_object *j, *v;
    uint64_t nv, now = lynx_now_ns();
    int rc;
    if (g_stop || (until_ns && now >= until_ns))
      return EX_OK;
    if (until_ns && (until_ns - now) / 1000000u < (uint64_t)poll_ms)
      poll_ms = (long)((until_ns - now) / 1000000u) + 1;
    snprintf(path, sizeof(path), "/v1/watch?since=%llu&timeout_ms=%ld",
             (unsigned long long)version, poll_ms);
    rc = http_call(t, "GET", path, NULL, poll_ms + 10000, &status, &b,
                   err, sizeof(err));
    if (rc == -EINTR)
      return EX_OK;
    if (rc) {
      struct timespec one = {1, 0};
      if (!*lost)
        fprintf(stderr,
                "lynxctl: lost the coordinator at %s (%s); "
                "retrying every second\n",
                api_names(t), err);
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

static int cmd_watch(struct ctl *t) {
  struct sigaction sa;
  struct json_object *nodes = NULL, *v, *items;
  char *raw = NULL;
  uint64_t version;
  int rc, lost = 0;

  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);

  rc = api(t, "GET", "/v1/nodes", NULL, &nodes, &raw);
  if (rc || g_stop) {
    json_object_put(nodes);
    free(raw);
    return rc;
  }
  t->quiet = 1; /* from now on outages are retried, not fatal */
  for (;;) {
    time_t now = time(NULL);
    struct tm tm;
    char ts[32];
    version = nodes && json_object_object_get_ex(nodes, "version", &v)
                  ? json_object_get_uint64(v)
                  : 0;
    localtime_r(&now, &tm);
    strftime(ts, sizeof(ts), "%H:%M:%S", &tm);
    if (t->json) {
      if (raw)
        fputs(raw, stdout);
    } else {
      items = NULL;
      if (nodes)
        json_object_object_get_ex(nodes, "items", &items);
      printf("--- %s version %llu: %zu node(s)\n", ts,
             (unsigned long long)version,
             items ? json_object_array_length(items) : (size_t)0);
      print_table(stdout, items, node_cols);
    }
    fflush(stdout);
    json_object_put(nodes);
    nodes = NULL;
    free(raw);
    raw = NULL;

    for (;;) { /* the next version, then its node table */
      rc = watch_wait(t, version, 0, &lost);
      if (rc || g_stop)
        return rc;
      rc = api(t, "GET", "/v1/nodes", NULL, &nodes, &raw);
      if (rc == EX_OK && !g_stop)
        break;
      json_object_put(nodes);
      nodes = NULL;
      free(raw);
      raw = NULL;
      if (rc != EX_UNREACHABLE || g_stop)
        return rc;
      if (!lost)
        fprintf(stderr,
                "lynxctl: lost the coordinator at %s; retrying "
                "every second\n",
                api_names(t));
      lost = 1; /* the watch call says when it is back */
    }
  }
}

/* ---- top ----------------------------------------------------------------- */

/* lynx_top_src's get (top.h): the list at path, a page of `page` items at
 * a time (docs/api.md, "Pages of the big lists") when page > 0. */
static int top_get(void *arg, const char *path, unsigned page,
                   int (*each)(void *ctx, struct json_object *answer),
                   void *ctx, char *msg, size_t msglen) {
  struct ctl *t = arg;
  char url[1024], after[256] = "";
  for (;;) {
    struct json_object *j, *next;
    const char *nx;
    char *raw;
    int rc;
    if (!page) {
      snprintf(url, sizeof(url), "%s", path);
    } else if (!after[0]) {
      snprintf(url, sizeof(url), "%s?limit=%u", path, page);
    } else {
      char *e = curl_easy_escape(t->curl, after, 0);
      if (!e) {
        snprintf(msg, msglen, "top: out of memory");
        return EX_API;
      }
      snprintf(url, sizeof(url), "%s?limit=%u&after=%s", path, page, e);
      curl_free(e);
    }
    rc = api_msg(t, "GET", url, NULL, &j, &raw, msg, msglen);
    free(raw);
    if (rc)
      return rc;
    if (!j) {
      if (g_stop)
        return EX_OK; /* interrupted: the caller sees g_stop */
      snprintf(msg, msglen, "the coordinator's answer to GET %s is empty",
               url);
      return EX_API;
    }
    rc = each(ctx, j);
    if (rc) {
      if (rc == -ENOMEM)
        snprintf(msg, msglen, "top: out of memory reading GET %s", url);
      else
        snprintf(msg, msglen,
                 "the coordinator's answer to GET %s is not a list (no "
                 "\"items\" array)",
                 url);
      json_object_put(j);
      return EX_API;
    }
    if (!page || !json_object_object_get_ex(j, "next", &next) ||
        !json_object_is_type(next, json_type_string)) {
      json_object_put(j);
      return EX_OK;
    }
    /* a page must move on: a coordinator that answered the same "next"
     * again would keep us here for ever */
    nx = json_object_get_string(next);
    if (!nx[0] || strlen(nx) >= sizeof(after) || strcmp(nx, after) == 0) {
      snprintf(msg, msglen,
               "the coordinator's pages of %s do not move on (\"next\": "
               "\"%.64s\" after \"%.64s\")",
               path, nx, after);
      json_object_put(j);
      return EX_API;
    }
    snprintf(after, sizeof(after), "%s", nx);
    json_object_put(j);
  }
}

/* top's options (common/options.h): one-letter ones, as top(1) has */
struct top_cli {
  char *delay, *sort;
  uint32_t count;
  int batch;
};

#define TO(f) offsetof(struct top_cli, f)
static const struct lynx_opt top_tab[] = {
    {"d", LYNX_OPT_STR, TO(delay), "1", 0, 0, NULL, "seconds between frames"},
    {"n", LYNX_OPT_U32, TO(count), "0", 0, UINT32_MAX, NULL,
     "frames, then exit (0: until q)"},
    {"s", LYNX_OPT_STR, TO(sort), "rate", 0, 0, NULL,
     "rate, outstanding, p99 or id"},
    {"b", LYNX_OPT_FLAG, TO(batch), NULL, 0, 0, NULL, "text frames on stdout"},
    LYNX_OPT_END,
};
#undef TO

/* argv[0] is "top"; the rest its options. */
static int cmd_top(struct ctl *t, int argc, char **argv) {
  struct top_cli c;
  struct lynx_top_opts o;
  struct lynx_top_src src = {t->api, top_get, t};
  struct lynx_opts_scan scan = {LYNX_OPTS_USAGE_ONLY, NULL, 0, 0, 0};
  struct sigaction sa;
  char *end = NULL;
  int rc;

  memset(&c, 0, sizeof(c));
  memset(&o, 0, sizeof(o));
  if (scan_cmd(top_tab, &c, argc, argv, &scan, &rc))
    return rc;
  errno = 0;
  o.delay_s = strtod(c.delay, &end);
  /* (the negated test also refuses NaN) */
  if (errno || end == c.delay || *end || !(o.delay_s >= 0.1) ||
      o.delay_s > 3600)
    rc = usage_err("top -d: expected seconds from 0.1 to 3600 (1, 0.5), "
                   "got '%s'",
                   c.delay);
  else if (lynx_top_key_parse(c.sort, &o.key))
    rc = usage_err("top -s: expected rate, outstanding, p99 or id, got '%s'",
                   c.sort);
  else if (t->json)
    rc = usage_err("top: --json is not for top (lynxctl --json "
                   "accelerators gives the list as JSON)");
  o.count = c.count;
  /* a pipe or a file gets text frames: no terminal to draw on */
  o.batch = c.batch || !isatty(STDOUT_FILENO);
  lynx_opts_free(top_tab, &c);
  if (rc)
    return rc;

  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  return lynx_top_run(&o, &src, &g_stop);
}

/* ---- node drain --wait ------------------------------------------------- */

struct drain_cli {
  char *timeout;
  int wait;
};

#define DO(f) offsetof(struct drain_cli, f)
static const struct lynx_opt drain_tab[] = {
    {"wait", LYNX_OPT_FLAG, DO(wait), NULL, 0, 0, NULL,
     "until the node is drained"},
    {"timeout", LYNX_OPT_STR, DO(timeout), "60", 0, 0, NULL,
     "seconds --wait waits at most"},
    LYNX_OPT_END,
};
#undef DO

#define NODE_STATE_LATER (-1) /* node_state_of: ask again */

/* The node's state in the API, into st (sz bytes): EX_OK; NODE_STATE_LATER
 * when the coordinator cannot say now (unreachable, 503: starting or no
 * leader, or 404: restarted, the node not registered again yet; why in
 * why); else EX_API with the API's message printed. */
static int node_state_of(struct ctl *t, const char *path, char *st,
                         size_t sz, char *why, size_t whylen) {
  char err[ERR_MAX];
  struct buf b;
  long status = 0;
  struct json_object *j, *v;
  int rc = http_call(t, "GET", path, NULL, CALL_TIMEOUT_MS, &status, &b, err,
                     sizeof(err));
  st[0] = 0;
  if (rc == -EINTR)
    return EX_API;
  if (rc || status == 503 || status == 404) {
    snprintf(why, whylen, "%s", rc ? err : status == 404
                                           ? "it does not know the node (now)"
                                           : "it answers 503");
    free(b.p);
    return NODE_STATE_LATER;
  }
  j = b.p ? json_tokener_parse(b.p) : NULL;
  if (status == 200 && j && json_object_object_get_ex(j, "state", &v))
    snprintf(st, sz, "%s", json_object_get_string(v));
  else
    fprintf(stderr, "lynxctl: GET %s: HTTP %ld: %.300s\n", path, status,
            b.p ? b.p : "(no body)");
  json_object_put(j);
  free(b.p);
  return st[0] ? EX_OK : EX_API;
}

/* The registry's version now (0 when it cannot be read). */
static uint64_t registry_version(struct ctl *t) {
  struct json_object *j = NULL;
  char *raw = NULL;
  uint64_t v = 0;
  if (api(t, "GET", "/v1/nodes?limit=1", NULL, &j, &raw) == EX_OK)
    v = lynx_top_u64(j, "version");
  json_object_put(j);
  free(raw);
  return v;
}

/* argv: "drain", ID, its options. The drain, then with --wait each change
 * of the registry (/v1/watch) until the node is drained: EX_OK; EX_API
 * when it went down or the timeout passed (the drain goes on). */
static int cmd_node_drain(struct ctl *t, int argc, char **argv) {
  struct drain_cli c;
  struct lynx_opts_scan scan = {LYNX_OPTS_USAGE_ONLY, NULL, 0, 0, 0};
  char path[1024], st[32], *end = NULL;
  const char *id = argv[1];
  double timeout_s;
  uint64_t t0, deadline, version;
  int rc, lost = 0, told = 0;

  memset(&c, 0, sizeof(c));
  if (scan_cmd(drain_tab, &c, argc - 1, argv + 1, &scan, &rc))
    return rc;
  errno = 0;
  timeout_s = strtod(c.timeout, &end);
  if (errno || end == c.timeout || *end || !(timeout_s > 0) ||
      timeout_s > 86400)
    rc = usage_err("node drain --timeout: expected seconds above 0, at most "
                   "86400, got '%s'", c.timeout);
  else if ((scan.given & 2) && !c.wait)
    rc = usage_err("node drain: --timeout goes with --wait");
  lynx_opts_free(drain_tab, &c);
  if (rc)
    return rc;
  rc = cmd_object(t, "POST", "/v1/nodes/", id, "/drain", "node",
                  "drain requested");
  if (rc || !c.wait)
    return rc;
  if (path_with(t, path, sizeof(path), "/v1/nodes/", id, ""))
    return EX_API;
  t->quiet = 1; /* from now on outages are waited out, said once */
  t0 = lynx_now_ns();
  deadline = t0 + (uint64_t)(timeout_s * 1e9);
  for (;;) {
    char why[ERR_MAX + 64];
    /* the version first: a change after it wakes the watch below */
    version = registry_version(t);
    rc = node_state_of(t, path, st, sizeof(st), why, sizeof(why));
    if (rc == NODE_STATE_LATER) {
      struct timespec one = {1, 0};
      if (!told)
        fprintf(stderr, "lynxctl: the coordinator at %s cannot say how node "
                "%s is (%s): asking every second\n", api_names(t), id, why);
      told = 1;
      if (lynx_now_ns() >= deadline || g_stop) {
        fprintf(stderr, "lynxctl: node %s not seen drained within %g s\n",
                id, timeout_s);
        return EX_API;
      }
      nanosleep(&one, NULL);
      continue;
    }
    if (rc)
      return rc;
    if (!strcmp(st, "drained")) {
      if (!t->json)
        printf("node %s drained after %.1f s\n", id,
               (double)(lynx_now_ns() - t0) / 1e9);
      return EX_OK;
    }
    if (strcmp(st, "draining")) {
      fprintf(stderr, "lynxctl: node %s is %s, not draining: it will not "
              "be drained\n", id, st[0] ? st : "gone");
      return EX_API;
    }
    if (lynx_now_ns() >= deadline) {
      fprintf(stderr, "lynxctl: node %s still draining after %g s (the "
              "drain goes on; the coordinator's --drain-timeout-ms ends "
              "it)\n", id, timeout_s);
      return EX_API;
    }
    rc = watch_wait(t, version, deadline, &lost);
    if (rc)
      return rc;
  }
}

/* ---- main --------------------------------------------------------------- */

/* The global options, taken wherever they stand (before "--"); the
 * command and its own options are left in order for run(). */
struct global_opts {
  char *api, *token_file, *cacert;
  int json;
};

#define GO(f) offsetof(struct global_opts, f)
enum { G_API, G_TOKEN_FILE, G_CACERT, G_JSON };
static const struct lynx_opt global_tab[] = {
    [G_API] = {"api", LYNX_OPT_STR, GO(api), NULL, 0, 0, NULL,
               "coordinator API: URL[,URL...]"},
    [G_TOKEN_FILE] = {"token-file", LYNX_OPT_STR, GO(token_file), NULL, 0, 0,
                      NULL, "send the token in this file"},
    [G_CACERT] = {"cacert", LYNX_OPT_STR, GO(cacert), NULL, 0, 0, NULL,
                  "the CA that signed the API's certificate (https)"},
    [G_JSON] = {"json", LYNX_OPT_FLAG, GO(json), NULL, 0, 0, NULL,
                "print the API's JSON instead of tables"},
    LYNX_OPT_END,
};
#undef GO

/* --api (or $LYNX_API, named by what) into t->apis: URL[,URL...], each
 * with http:// when no scheme is given and no trailing /; blanks around
 * an address are dropped. 0, or EX_USAGE (said). */
static int set_apis(struct ctl *t, const char *v, const char *what) {
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
      return usage_err("%s: an empty address in '%s' (expected URL or "
                       "URL,URL,...)", what, v);
    if (t->n_apis == API_MAX)
      return usage_err("%s: at most %d addresses, got '%s'", what, API_MAX,
                       v);
    if ((size_t)(e - p) + 8 >= API_LEN)
      return usage_err("%s: an address longer than %d characters in "
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
    snprintf(t->api_all + l, sizeof(t->api_all) - l, "%s%s", l ? ", " : "",
             a);
    t->n_apis++;
    if (!comma)
      break;
    p = comma + 1;
  }
  use_api(t, 0);
  return 0;
}

static int run(struct ctl *t, int argc, char **argv) {
  const char *cmd = argv[0], *sub = argc > 1 ? argv[1] : NULL;

  if (strcmp(cmd, "nodes") == 0 && argc == 1)
    return cmd_list(t, "/v1/nodes", node_cols);
  if ((strcmp(cmd, "accelerators") == 0 || strcmp(cmd, "accels") == 0) &&
      argc == 1)
    return cmd_list(t, "/v1/accelerators", accel_cols);
  if (strcmp(cmd, "mqueues") == 0 && argc == 1)
    return cmd_list(t, "/v1/mqueues", mq_cols);
  if (strcmp(cmd, "services") == 0 && argc == 1)
    return cmd_list(t, "/v1/services", svc_cols);
  if (strcmp(cmd, "frontends") == 0 && argc == 1)
    return cmd_list(t, "/v1/frontends", fe_cols);
  if (strcmp(cmd, "watch") == 0 && argc == 1)
    return cmd_watch(t);
  if (strcmp(cmd, "top") == 0)
    return cmd_top(t, argc, argv);
  if (strcmp(cmd, "service") == 0 && sub) {
    if (strcmp(sub, "create") == 0)
      return cmd_service_create(t, argc - 1, argv + 1);
    if (strcmp(sub, "show") == 0 && argc == 3)
      return cmd_service_show(t, argv[2]);
    if (strcmp(sub, "delete") == 0 && argc == 3)
      return cmd_object(t, "DELETE", "/v1/services/", argv[2], "", "service",
                        "deleted");
    return usage_err("service: expected 'create ...', 'show NAME' or "
                     "'delete NAME'");
  }
  if (strcmp(cmd, "node") == 0 && sub && argc >= 3 &&
      strcmp(sub, "drain") == 0)
    return cmd_node_drain(t, argc - 1, argv + 1);
  if (strcmp(cmd, "node") == 0 && sub && argc == 3) {
    if (strcmp(sub, "undrain") == 0)
      return cmd_object(t, "POST", "/v1/nodes/", argv[2], "/undrain", "node",
                        "undrained");
    if (strcmp(sub, "forget") == 0)
      return cmd_object(t, "DELETE", "/v1/nodes/", argv[2], "", "node",
                        "forgotten");
  }
  if (strcmp(cmd, "node") == 0)
    return usage_err("node: expected 'drain ID', 'undrain ID' or 'forget ID'");
  if (strcmp(cmd, "frontend") == 0 && sub && argc == 3) {
    if (strcmp(sub, "drain") == 0)
      return cmd_object(t, "POST", "/v1/frontends/", argv[2], "/drain",
                        "frontend", "drain requested");
    if (strcmp(sub, "undrain") == 0)
      return cmd_object(t, "POST", "/v1/frontends/", argv[2], "/undrain",
                        "frontend", "undrained");
  }
  if (strcmp(cmd, "frontend") == 0)
    return usage_err("frontend: expected 'drain ID' or 'undrain ID'");
  return usage_err("unknown command or wrong arguments: '%s'", cmd);
}

int main(int argc, char **argv) {
  struct ctl t;
  struct global_opts g;
  struct lynx_opts_scan scan = {
      LYNX_OPTS_POSITIONAL | LYNX_OPTS_PASS_UNKNOWN | LYNX_OPTS_USAGE_ONLY,
      NULL, 0, 0, 0};
  const char *token_file = getenv("LYNX_TOKEN_FILE"), *env_api;
  const char *cacert = getenv("LYNX_CACERT");
  char **args;
  int n, rc;

  memset(&t, 0, sizeof(t));
  memset(&g, 0, sizeof(g));
  env_api = getenv("LYNX_API");
  args = calloc((size_t)argc + 1, sizeof(*args));
  if (!args)
    return EX_API;
  scan.rest = args;
  rc = lynx_opts_scan(global_tab, &g, argc, argv, usage_text, &scan);
  if (rc) {
    fputs("(lynxctl --help for usage)\n", stderr);
  } else if (!scan.help && g.api && !g.api[0]) {
    usage_err("--api needs a URL");
    rc = -EINVAL;
  }
  if (rc || scan.help) {
    lynx_opts_free(global_tab, &g);
    free(args);
    return rc ? EX_USAGE : EX_OK;
  }
  n = scan.n_rest;
  t.json = g.json;
  if (g.api)
    rc = set_apis(&t, g.api, "--api");
  else if (env_api && env_api[0])
    rc = set_apis(&t, env_api, "$LYNX_API");
  else
    rc = set_apis(&t, DEFAULT_API, "the default API");
  if (rc) {
    lynx_opts_free(global_tab, &g);
    free(args);
    return EX_USAGE;
  }
  /* --token-file, even an empty one, overrides $LYNX_TOKEN_FILE */
  if (scan.given & (1ull << G_TOKEN_FILE))
    token_file = g.token_file;
  if (scan.given & (1ull << G_CACERT))
    cacert = g.cacert;
  if (cacert && cacert[0]) {
    FILE *f = fopen(cacert, "r");
    if (!f) {
      fprintf(stderr, "lynxctl: --cacert %s: %s\n", cacert, strerror(errno));
      lynx_opts_free(global_tab, &g);
      free(args);
      return EX_API; /* a file it cannot read: a runtime failure */
    }
    fclose(f);
    t.cacert = cacert;
  }
  if (n == 0) {
    fputs(usage_text, stderr);
    lynx_opts_free(global_tab, &g);
    free(args);
    return EX_USAGE;
  }
  if (token_file && token_file[0]) {
    char err[320];
    rc = lynx_read_token(token_file, &t.token, err, sizeof(err));
    if (rc) {
      fprintf(stderr, "lynxctl: %s\n", err);
      lynx_opts_free(global_tab, &g);
      free(args);
      return EX_API; /* a runtime failure, as in every program */
    }
  }
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK ||
      !(t.curl = curl_easy_init())) {
    fprintf(stderr, "lynxctl: cannot initialise libcurl\n");
    free(t.token);
    lynx_opts_free(global_tab, &g);
    free(args);
    return EX_API;
  }
  rc = run(&t, n, args);
  fflush(stdout);
  curl_easy_cleanup(t.curl);
  curl_global_cleanup();
  free(t.token);
  lynx_opts_free(global_tab, &g);
  free(args);
  return rc;
}
