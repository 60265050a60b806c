/*
 * test_http.c - the coordinator's JSON API (coordinator/http.c, api_*.c),
 * in-process.
 *
 * Each test builds a struct lynx_coord (a real registry, a temporary state
 * directory), serves it with lynx_http_start on 127.0.0.1 and a free port,
 * and talks to it with libcurl exactly as an operator's tools would. The
 * last tests run the lynxctl binary against the same server.
 *
 * The daemon's clock and change callback (lynx_coord.now_ms and
 * .on_change, main.c's in the daemon) are this file's.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>
#include <json-c/json.h>

#include "coord.h"
#include "log.h"
#include "registry.h"
#include "regjson.h"
#include "store.h"
#include "ut_main.h"
#include "ut_spec.h"
#include "util.h"

#define BODY_MAX 4096

/* ---- what main.c gives the API in the daemon ---------------------------- */

static uint64_t lynx_coord_now_ms(void) { return lynx_now_ns() / 1000000u; }

static void lynx_coord_changed(struct lynx_coord *c) {
  pthread_cond_broadcast(&c->changed);
}

/* ---- fixture ----------------------------------------------------------- */

struct fx {
  struct lynx_coord c;
  char dir[64];
  char state[128];
  char base[64]; /* http://127.0.0.1:PORT */
  unsigned port;
};

static unsigned free_port(void) {
  struct sockaddr_in sa;
  socklen_t sl = sizeof(sa);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  unsigned port = 0;
  if (fd < 0)
    return 0;
  memset(&sa, 0, sizeof(sa));
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
      getsockname(fd, (struct sockaddr *)&sa, &sl) == 0)
    port = ntohs(sa.sin_port);
  close(fd);
  return port;
}

/* Serves f->c on host:free port; retries when the port was taken meanwhile. */
static int serve(struct fx *f, const char *host) {
  char addr[64];
  for (int tries = 0; tries < 20; tries++) {
    unsigned port = free_port();
    if (!port)
      continue;
    snprintf(addr, sizeof(addr), "%s:%u", host, port);
    if (lynx_http_start(&f->c, addr) == 0) {
      f->port = port;
      snprintf(f->base, sizeof(f->base), "http://127.0.0.1:%u", port);
      return 0;
    }
  }
  return -1;
}

static int setup(void **state) {
  struct fx *f = calloc(1, sizeof(*f));
  if (!f)
    return -1;
  lynx_log_level = LYNX_LOG_ERROR;
  snprintf(f->dir, sizeof(f->dir), "/tmp/lynx-ut-http-XXXXXX");
  if (!mkdtemp(f->dir)) {
    free(f);
    return -1;
  }
  snprintf(f->state, sizeof(f->state), "%s/state.json", f->dir);
  {
    /* error-checking: a store can tell whether its caller holds it */
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_ERRORCHECK);
    pthread_mutex_init(&f->c.lock, &ma);
    pthread_mutexattr_destroy(&ma);
  }
  pthread_mutex_init(&f->c.change_lock, NULL);
  pthread_cond_init(&f->c.changed, NULL);
  f->c.now_ms = lynx_coord_now_ms;
  f->c.on_change = lynx_coord_changed;
  lynx_reg_init(&f->c.reg, 3000, 5000, NULL);
  f->c.state_dir = f->dir;
  f->c.body_max = BODY_MAX;
  f->c.ready = 1;
  if (serve(f, "127.0.0.1")) {
    lynx_reg_free(&f->c.reg);
    rmdir(f->dir);
    free(f);
    return -1;
  }
  *state = f;
  return 0;
}

/* test_refused_when_all_busy's store: saves wait while this is set (and
 * teardown clears it, so that a failed test does not keep a worker in
 * its save) */
static int slow_store_hold;
static unsigned slow_store_saves;

static int teardown(void **state) {
  struct fx *f = *state;
  char path[160];
  __atomic_store_n(&slow_store_hold, 0, __ATOMIC_SEQ_CST);
  lynx_http_stop(&f->c);
  lynx_reg_free(&f->c.reg);
  pthread_cond_destroy(&f->c.changed);
  pthread_mutex_destroy(&f->c.change_lock);
  pthread_mutex_destroy(&f->c.lock);
  unlink(f->state);
  snprintf(path, sizeof(path), "%s/state.json.tmp", f->dir);
  unlink(path);
  for (int i = 0; i < 8; i++) { /* lynxctl test outputs */
    snprintf(path, sizeof(path), "%s/out%d", f->dir, i);
    unlink(path);
  }
  snprintf(path, sizeof(path), "%s/spec.json", f->dir);
  unlink(path);
  rmdir(f->dir);
  free(f);
  return 0;
}

/* ---- HTTP client -------------------------------------------------------- */

struct resp {
  long status;
  char *body;
  size_t len;
  char allow[128];
  char ctype[128];
  char location[128];
  char www_auth[128];
  struct json_object *json; /* parsed body, or NULL */
};

static size_t on_body(char *p, size_t size, size_t n, void *arg) {
  struct resp *r = arg;
  char *nb = realloc(r->body, r->len + size * n + 1);
  if (!nb)
    return 0;
  memcpy(nb + r->len, p, size * n);
  r->body = nb;
  r->len += size * n;
  r->body[r->len] = 0;
  return size * n;
}

static void header_copy(char *dst, size_t dlen, const char *v, size_t n) {
  while (n && (v[n - 1] == '\r' || v[n - 1] == '\n'))
    n--;
  while (n && *v == ' ') {
    v++;
    n--;
  }
  if (n >= dlen)
    n = dlen - 1;
  memcpy(dst, v, n);
  dst[n] = 0;
}

static size_t on_header(char *p, size_t size, size_t n, void *arg) {
  struct resp *r = arg;
  size_t len = size * n;
  static const struct {
    const char *name;
    size_t off;
  } want[] = {
      {"allow:", offsetof(struct resp, allow)},
      {"content-type:", offsetof(struct resp, ctype)},
      {"location:", offsetof(struct resp, location)},
      {"www-authenticate:", offsetof(struct resp, www_auth)},
  };
  for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
    size_t l = strlen(want[i].name);
    if (len > l && strncasecmp(p, want[i].name, l) == 0)
      header_copy((char *)r + want[i].off, 128, p + l, len - l);
  }
  return len;
}

struct upload {
  const char *data;
  size_t len, off;
};

static size_t on_read(char *p, size_t size, size_t n, void *arg) {
  struct upload *u = arg;
  size_t k = size * n;
  if (k > u->len - u->off)
    k = u->len - u->off;
  if (k > 1000) /* several chunks */
    k = 1000;
  memcpy(p, u->data + u->off, k);
  u->off += k;
  return k;
}

/* One request to base+path. headers: NULL-terminated extra header lines.
 * chunked: send body with Transfer-Encoding: chunked (no Content-Length). */
static CURLcode do_req(const char *base, const char *method, const char *path,
                       const char *body, const char *const *headers,
                       int chunked, long timeout_ms, struct resp *r) {
  char url[512];
  CURL *h = curl_easy_init();
  struct curl_slist *hl = NULL;
  struct upload up = {body, body ? strlen(body) : 0, 0};
  CURLcode rc;
  memset(r, 0, sizeof(*r));
  if (!h)
    return CURLE_FAILED_INIT;
  snprintf(url, sizeof(url), "%s%s", base, path);
  curl_easy_setopt(h, CURLOPT_URL, url);
  if (strcmp(method, "HEAD") == 0)
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  else
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, r);
  for (const char *const *x = headers; x && *x; x++)
    hl = curl_slist_append(hl, *x);
  if (body && chunked) {
    hl = curl_slist_append(hl, "Transfer-Encoding: chunked");
    curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
    curl_easy_setopt(h, CURLOPT_READDATA, &up);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
  } else if (body) {
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)up.len);
  }
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
  rc = curl_easy_perform(h);
  if (rc == CURLE_OK) {
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
    if (r->body)
      r->json = json_tokener_parse(r->body);
  }
  curl_slist_free_all(hl);
  curl_easy_cleanup(h);
  return rc;
}

static void resp_free(struct resp *r) {
  json_object_put(r->json);
  free(r->body);
  memset(r, 0, sizeof(*r));
}

/* A request that must complete; returns the status. A GET whose
 * connection the server closed before answering is tried again, up to 4
 * more times 20 ms apart (scaled), as a client would: test_slow_clients
 * runs the server with a 400 ms header timeout, which a loaded machine
 * (make test-busy) can make curl itself miss between connecting and
 * sending its request; and at one connection per client
 * (test_refused_when_all_busy) the connection of this client's previous
 * request, answered, may not have ended at the server yet: refused until
 * it has (back to back retries found it still open under a parallel
 * ctest -L unit). */
static long req(struct fx *f, const char *method, const char *path,
                const char *body, struct resp *r) {
  CURLcode rc = do_req(f->base, method, path, body, NULL, 0, 10000, r);
  for (int tries = 1; tries < 5 && strcmp(method, "GET") == 0 &&
                      (rc == CURLE_RECV_ERROR || rc == CURLE_GOT_NOTHING);
       tries++) {
    resp_free(r);
    usleep((useconds_t)ut_scaled(20000));
    rc = do_req(f->base, method, path, body, NULL, 0, 10000, r);
  }
  if (rc != CURLE_OK)
    fail_msg("%s %s: %s", method, path, curl_easy_strerror(rc));
  return r->status;
}

static const char *jstr(struct json_object *j, const char *a, const char *b) {
  struct json_object *v;
  if (!j || !json_object_object_get_ex(j, a, &v))
    return NULL;
  if (b && !json_object_object_get_ex(v, b, &v))
    return NULL;
  return json_object_get_string(v);
}

/* Checks an error answer: status, JSON shape, code, and words of the
 * message. */
static void expect_error(struct resp *r, long status, const char *code,
                         const char *word1, const char *word2) {
  const char *m;
  if (r->status != status)
    fail_msg("expected HTTP %ld, got %ld: %s", status, r->status,
             r->body ? r->body : "(no body)");
  assert_non_null(r->json);
  assert_non_null(r->body);
  assert_int_equal(r->body[r->len - 1], '\n');
  assert_string_equal(jstr(r->json, "error", "code"), code);
  m = jstr(r->json, "error", "message");
  assert_non_null(m);
  if (word1 && !strstr(m, word1))
    fail_msg("message '%s' does not mention '%s'", m, word1);
  if (word2 && !strstr(m, word2))
    fail_msg("message '%s' does not mention '%s'", m, word2);
}

/* POST /v1/services with body: refused, 400 invalid_argument, with words
 * of the message. */
static void post_refused(struct fx *f, const char *body, const char *word1,
                         const char *word2) {
  struct resp r;
  req(f, "POST", "/v1/services", body, &r);
  expect_error(&r, 400, "invalid_argument", word1, word2);
  resp_free(&r);
}

static char *slurp(const char *path) {
  FILE *fp = fopen(path, "r");
  char *buf;
  long n;
  if (!fp)
    return NULL;
  fseek(fp, 0, SEEK_END);
  n = ftell(fp);
  fseek(fp, 0, SEEK_SET);
  buf = calloc(1, (size_t)n + 1);
  if (buf && fread(buf, 1, (size_t)n, fp) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  fclose(fp);
  return buf;
}

static uint64_t now_ms(void) { return lynx_now_ns() / 1000000u; }

static const char svc_body[] =
    "{\"name\": \"echo-ut\", \"port\": 9123, \"app\": \"echo\", "
    "\"slots\": 64, \"placement\": \"all\"}";

/* ---- tests -------------------------------------------------------------- */

static void test_health_ready(void **state) {
  struct fx *f = *state;
  struct resp r;
  assert_int_equal(req(f, "GET", "/healthz", NULL, &r), 200);
  assert_string_equal(jstr(r.json, "status", NULL), "ok");
  assert_int_equal(r.body[r.len - 1], '\n');
  assert_non_null(strstr(r.ctype, "application/json"));
  resp_free(&r);
  assert_int_equal(req(f, "GET", "/readyz", NULL, &r), 200);
  resp_free(&r);
  __atomic_store_n(&f->c.ready, 0, __ATOMIC_RELEASE);
  req(f, "GET", "/readyz", NULL, &r);
  expect_error(&r, 503, "not_ready", "not ready", NULL);
  resp_free(&r);
  /* HEAD is served by the GET route */
  assert_int_equal(req(f, "HEAD", "/healthz", NULL, &r), 200);
  resp_free(&r);
}

/* Defines svc_body's service in the registry itself, as a follower's
 * reload from etcd does. */
static void add_service(struct fx *f, const char *name) {
  struct lynx_service_spec sp;
  struct lynx_reg_err err;
  struct json_object *j = json_tokener_parse(svc_body);
  memset(&err, 0, sizeof(err));
  assert_non_null(j);
  assert_int_equal(lynx_json_service_spec(j, &sp, &err), 0);
  json_object_put(j);
  snprintf(sp.name, sizeof(sp.name), "%s", name);
  pthread_mutex_lock(&f->c.lock);
  assert_int_equal(
      lynx_reg_service_create(&f->c.reg, &sp, lynx_coord_now_ms(), &err), 0);
  pthread_mutex_unlock(&f->c.lock);
}

/* A follower (several coordinators on etcd: elect.c) sends changes to the
 * leader it knows of (307), and when it knows of none (etcd without a
 * quorum) answers 503 no_leader with the reason instead: its leader_api
 * may be stale, and redirecting on it could bounce between followers. */
static void test_follower_no_leader(void **state) {
  struct fx *f = *state;
  struct resp r;
  struct json_object *v;
  f->c.ha = 1;
  __atomic_store_n(&f->c.leader, 0, __ATOMIC_RELEASE);
  pthread_mutex_lock(&f->c.lock);
  snprintf(f->c.leader_api, sizeof(f->c.leader_api), "127.0.0.1:9");
  f->c.no_leader = 0;
  pthread_mutex_unlock(&f->c.lock);
  assert_int_equal(req(f, "POST", "/v1/services", svc_body, &r), 307);
  assert_string_equal(r.location, "http://127.0.0.1:9/v1/services");
  resp_free(&r);
  /* a service's state and instances are the leader's: reads go there */
  assert_int_equal(req(f, "GET", "/v1/services", NULL, &r), 307);
  assert_string_equal(r.location, "http://127.0.0.1:9/v1/services");
  resp_free(&r);
  assert_int_equal(req(f, "GET", "/v1/services/echo-ut", NULL, &r), 307);
  resp_free(&r);
  assert_int_equal(req(f, "GET", "/readyz", NULL, &r), 200);
  assert_string_equal(jstr(r.json, "role", NULL), "follower");
  assert_false(json_object_object_get_ex(r.json, "no_leader", &v));
  resp_free(&r);

  pthread_mutex_lock(&f->c.lock);
  f->c.no_leader = 1; /* leader_api left stale on purpose */
  snprintf(f->c.no_leader_why, sizeof(f->c.no_leader_why),
           "no coordinator leads: etcd cannot be reached from here (ut): "
           "an election waits for its quorum");
  pthread_mutex_unlock(&f->c.lock);
  req(f, "POST", "/v1/services", svc_body, &r);
  expect_error(&r, 503, "no_leader", "etcd cannot be reached", "quorum");
  resp_free(&r);
  req(f, "DELETE", "/v1/services/echo-ut", NULL, &r);
  expect_error(&r, 503, "no_leader", "etcd cannot be reached", NULL);
  resp_free(&r);
  req(f, "GET", "/v1/nodes", NULL, &r); /* runtime state: the leader's */
  expect_error(&r, 503, "no_leader", "etcd cannot be reached", NULL);
  resp_free(&r);
  /* knowing of no leader, it still shows what is defined, and says that
   * it does not know the runtime state (never "0/0 pending") */
  add_service(f, "echo-ut");
  assert_int_equal(req(f, "GET", "/v1/services", NULL, &r), 200);
  {
    struct json_object *items, *s0, *inst;
    assert_true(json_object_object_get_ex(r.json, "items", &items));
    assert_int_equal(json_object_array_length(items), 1);
    s0 = json_object_array_get_idx(items, 0);
    assert_string_equal(jstr(s0, "name", NULL), "echo-ut");
    assert_string_equal(jstr(s0, "state", NULL), "unknown");
    assert_non_null(strstr(jstr(s0, "reason", NULL), "knows of no leader"));
    assert_non_null(strstr(jstr(s0, "reason", NULL), "the leader's"));
    assert_true(json_object_object_get_ex(s0, "instances", &inst));
    assert_null(inst);
  }
  resp_free(&r);
  assert_int_equal(req(f, "GET", "/v1/services/echo-ut", NULL, &r), 200);
  assert_string_equal(jstr(r.json, "state", NULL), "unknown");
  resp_free(&r);
  assert_int_equal(req(f, "GET", "/readyz", NULL, &r), 200);
  assert_string_equal(jstr(r.json, "role", NULL), "follower");
  assert_string_equal(jstr(r.json, "no_leader", NULL), "true");
  assert_non_null(strstr(jstr(r.json, "why", NULL), "quorum"));
  resp_free(&r);
  f->c.ha = 0;
}

static void test_lists_shape(void **state) {
  struct fx *f = *state;
  static const char *const paths[] = {"/v1/nodes",     "/v1/accelerators",
                                      "/v1/mqueues",   "/v1/services",
                                      "/v1/frontends", "/v1/nodes/"};
  for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
    struct resp r;
    struct json_object *v, *items;
    assert_int_equal(req(f, "GET", paths[i], NULL, &r), 200);
    assert_non_null(r.json);
    assert_true(json_object_object_get_ex(r.json, "version", &v));
    assert_true(json_object_is_type(v, json_type_int));
    assert_true(json_object_object_get_ex(r.json, "items", &items));
    assert_true(json_object_is_type(items, json_type_array));
    assert_int_equal(json_object_array_length(items), 0);
    assert_int_equal(r.body[r.len - 1], '\n');
    resp_free(&r);
  }
}

static void test_service_lifecycle(void **state) {
  struct fx *f = *state;
  struct resp r;
  struct json_object *items;
  char *disk;
  uint64_t v0 = f->c.reg.version;

  assert_int_equal(req(f, "POST", "/v1/services", svc_body, &r), 201);
  assert_string_equal(jstr(r.json, "name", NULL), "echo-ut");
  assert_string_equal(jstr(r.json, "port", NULL), "9123");
  assert_string_equal(jstr(r.json, "placement", NULL), "all");
  assert_string_equal(r.location, "/v1/services/echo-ut");
  resp_free(&r);
  assert_true(f->c.reg.version > v0);

  /* persisted */
  disk = slurp(f->state);
  assert_non_null(disk);
  assert_non_null(strstr(disk, "echo-ut"));
  free(disk);

  assert_int_equal(req(f, "GET", "/v1/services/echo-ut", NULL, &r), 200);
  assert_string_equal(jstr(r.json, "app", NULL), "echo");
  resp_free(&r);
  assert_int_equal(req(f, "GET", "/v1/services", NULL, &r), 200);
  assert_true(json_object_object_get_ex(r.json, "items", &items));
  assert_int_equal(json_object_array_length(items), 1);
  resp_free(&r);

  /* duplicate name, then the same port under another name */
  req(f, "POST", "/v1/services", svc_body, &r);
  expect_error(&r, 409, "conflict", "echo-ut", NULL);
  resp_free(&r);
  req(f, "POST", "/v1/services",
      "{\"name\": \"other\", \"port\": 9123, \"app\": \"echo\"}", &r);
  expect_error(&r, 409, "conflict", "port", NULL);
  resp_free(&r);

  /* delete: 200 with the service as it was */
  assert_int_equal(req(f, "DELETE", "/v1/services/echo-ut", NULL, &r), 200);
  assert_string_equal(jstr(r.json, "name", NULL), "echo-ut");
  resp_free(&r);
  disk = slurp(f->state);
  assert_non_null(disk);
  assert_null(strstr(disk, "echo-ut"));
  free(disk);
  req(f, "GET", "/v1/services/echo-ut", NULL, &r);
  expect_error(&r, 404, "not_found", "echo-ut", NULL);
  resp_free(&r);
  req(f, "DELETE", "/v1/services/echo-ut", NULL, &r);
  expect_error(&r, 404, "not_found", "echo-ut", NULL);
  resp_free(&r);
}

static void test_bad_json(void **state) {
  struct fx *f = *state;
  struct resp r;
  req(f, "POST", "/v1/services", "{\"name\": \"a\", \"port\": ", &r);
  expect_error(&r, 400, "invalid_argument", "malformed JSON", "end of input");
  resp_free(&r);
  req(f, "POST", "/v1/services", "{\"name\":\n  nope}", &r);
  expect_error(&r, 400, "invalid_argument", "malformed JSON", "line 2");
  resp_free(&r);
  req(f, "POST", "/v1/services", "{\"name\": \"a\",}", &r);
  expect_error(&r, 400, "invalid_argument", "malformed JSON", "column");
  resp_free(&r);
  req(f, "POST", "/v1/services", "{} {}", &r); /* points at the 2nd value */
  expect_error(&r, 400, "invalid_argument", "malformed JSON", "column 4");
  resp_free(&r);
  req(f, "POST", "/v1/services", "", &r);
  expect_error(&r, 400, "invalid_argument", "empty body", NULL);
  resp_free(&r);
  req(f, "POST", "/v1/services", "[1, 2]", &r);
  expect_error(&r, 400, "invalid_argument", "JSON object", "array");
  resp_free(&r);
  req(f, "POST", "/v1/services", "\x01\xff garbage", &r);
  expect_error(&r, 400, "invalid_argument", "malformed JSON", NULL);
  resp_free(&r);
  /* nothing was created */
  assert_null(f->c.reg.services);
}

static void test_bad_fields(void **state) {
  struct fx *f = *state;
  struct resp r;
  req(f, "POST", "/v1/services",
      "{\"name\": \"a\", \"port\": \"80\", \"app\": \"echo\"}", &r);
  expect_error(&r, 400, "invalid_argument", "port", NULL);
  resp_free(&r);
  req(f, "POST", "/v1/services",
      "{\"name\": \"a\", \"port\": 80, \"app\": \"echo\", \"replica\": 3}", &r);
  expect_error(&r, 400, "invalid_argument", "replica", NULL);
  resp_free(&r);
  req(f, "POST", "/v1/services", "{\"name\": \"a\", \"app\": \"echo\"}", &r);
  expect_error(&r, 400, "invalid_argument", "port", NULL);
  resp_free(&r);
  req(f, "POST", "/v1/services",
      "{\"name\": \"a\", \"port\": 80, \"app\": \"echo\", "
      "\"placement\": {\"replicas\": -1}}",
      &r);
  expect_error(&r, 400, "invalid_argument", "placement.replicas", NULL);
  resp_free(&r);
  assert_null(f->c.reg.services);
}

/* json-c keeps the last of two equal keys: the API refuses them, naming
 * the key, at any depth; and a key holding a NUL, which json-c would cut
 * into another (found looking at the API's body parser for its fuzz
 * harness, tests/fuzz/fuzz_http_body.c). */
static void test_duplicate_keys(void **state) {
  struct fx *f = *state;
  struct resp r;
  post_refused(f,
               "{\"name\": \"a\", \"port\": 9123, \"app\": \"echo\", "
               "\"name\": \"b\"}",
               "duplicate key \"name\"", "line 1");
  post_refused(f,
               "{\"name\": \"a\", \"port\": 9123, \"app\": \"echo\",\n"
               " \"placement\": {\"replicas\": 1, \"selector\": {\"zone\": "
               "\"a\", \"zone\": \"b\"}}}",
               "duplicate key \"zone\"", "line 2");
  post_refused(f,
               "{\"name\": \"a\", \"port\": 9123, \"app\": \"echo\", "
               "\"backends\": [{\"name\": \"m\", \"address\": "
               "\"127.0.0.1:1\", \"address\": \"127.0.0.1:2\"}]}",
               "duplicate key \"address\"", NULL);
  /* a NUL in a key: json-c cuts the key there, which makes "name\u0000"
   * a second "name" (and renames any key silently); refused too */
  post_refused(f,
               "{\"name\": \"a\", \"port\": 9123, \"app\": \"echo\", "
               "\"name\\u0000\": \"b\"}",
               "NUL character", "line 1");
  post_refused(f,
               "{\"name\": \"a\", \"port\": 9123, \"app\": \"echo\",\n"
               " \"placement\": {\"selector\": {\"zone\\u0000x\": \"a\"}}}",
               "NUL character", "line 2");
  assert_null(f->c.reg.services);
  /* equal keys in different objects are fine */
  assert_int_equal(req(f, "POST", "/v1/services",
                       "{\"name\": \"a\", \"port\": 9123, \"app\": \"echo\", "
                       "\"backends\": [{\"name\": \"m\", \"address\": "
                       "\"127.0.0.1:1\"}]}",
                       &r),
                   201);
  resp_free(&r);
}

/* Text fields refuse invalid UTF-8 and control characters, naming the
 * field; nothing the API answers is invalid UTF-8, a path with %ff
 * included. */
static void test_bad_text(void **state) {
  struct fx *f = *state;
  struct resp r;
  struct json_tokener *tok;
  struct json_object *back;
  req(f, "POST", "/v1/services",
      "{\"name\": \"a\", \"port\": 9123, \"app\": \"ec\xff\xfeho\"}", &r);
  expect_error(&r, 400, "invalid_argument", "app", "UTF-8");
  resp_free(&r);
  req(f, "POST", "/v1/services",
      "{\"name\": \"a\", \"port\": 9123, \"app\": \"\\u001b[31mecho\"}", &r);
  expect_error(&r, 400, "invalid_argument", "app", "control");
  resp_free(&r);
  req(f, "POST", "/v1/services",
      "{\"name\": \"a\", \"port\": 9123, \"app\": \"echo\", \"placement\": "
      "{\"selector\": {\"zone\": \"\xc3\"}}}",
      &r);
  expect_error(&r, 400, "invalid_argument", "placement.selector.zone", NULL);
  resp_free(&r);
  req(f, "POST", "/v1/services",
      "{\"name\": \"a\", \"port\": 9123, \"app\": \"echo\", \"b\xffgus\": 1}",
      &r);
  expect_error(&r, 400, "invalid_argument", "unknown field", NULL);
  resp_free(&r);
  req(f, "GET", "/v1/nodes/x%ffy%01", NULL, &r);
  expect_error(&r, 404, "not_found", NULL, NULL);
  tok = json_tokener_new();
  json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
  back = json_tokener_parse_ex(tok, r.body, (int)r.len);
  if (!back)
    fail_msg("the answer is not valid JSON: %s", r.body);
  json_object_put(back);
  json_tokener_free(tok);
  resp_free(&r);
  assert_null(f->c.reg.services);
}

/* --region-max-mb: 422 with the computed size; --services-max: 409. */
static void test_limits(void **state) {
  struct fx *f = *state;
  struct resp r;
  char body[256];
  f->c.reg.region_max_bytes = 1024ull << 20;
  req(f, "POST", "/v1/services",
      "{\"name\": \"huge\", \"port\": 9123, \"app\": \"echo\", \"slot_size\": "
      "1048576, \"slots\": 65536, \"mqueues_per_accel\": 1024}",
      &r);
  expect_error(&r, 422, "limit_exceeded", "140737488", "1024 MiB");
  resp_free(&r);
  f->c.reg.services_max = 3;
  for (int i = 0; i < 3; i++) {
    snprintf(body, sizeof(body),
             "{\"name\": \"s%d\", \"port\": %d, \"app\": \"echo\"}", i,
             9200 + i);
    assert_int_equal(req(f, "POST", "/v1/services", body, &r), 201);
    resp_free(&r);
  }
  req(f, "POST", "/v1/services",
      "{\"name\": \"s3\", \"port\": 9203, \"app\": \"echo\"}", &r);
  expect_error(&r, 409, "limit_exceeded", "--services-max", "3");
  resp_free(&r);
  assert_null(lynx_reg_service_find(&f->c.reg, "s3"));
  assert_int_equal(req(f, "DELETE", "/v1/services/s0", NULL, &r), 200);
  resp_free(&r);
  assert_int_equal(req(f, "POST", "/v1/services",
                       "{\"name\": \"s3\", \"port\": 9203, \"app\": \"echo\"}",
                       &r),
                   201);
  resp_free(&r);
}

static void test_unknown_path(void **state) {
  struct fx *f = *state;
  struct resp r;
  req(f, "GET", "/v1/nope", NULL, &r);
  expect_error(&r, 404, "not_found", "/v1/nope", NULL);
  resp_free(&r);
  req(f, "GET", "/v1/services/a/b", NULL, &r);
  expect_error(&r, 404, "not_found", NULL, NULL);
  resp_free(&r);
  req(f, "POST", "/", "{}", &r);
  expect_error(&r, 404, "not_found", NULL, NULL);
  resp_free(&r);
  /* an encoded NUL does not cut the path short */
  req(f, "GET", "/v1/nodes/%00x", NULL, &r);
  expect_error(&r, 404, "not_found", NULL, NULL);
  resp_free(&r);
  req(f, "GET", "/v1/services%00", NULL, &r);
  expect_error(&r, 404, "not_found", NULL, NULL);
  resp_free(&r);
}

static void test_wrong_method(void **state) {
  struct fx *f = *state;
  struct resp r;
  req(f, "PUT", "/v1/services", "{}", &r);
  expect_error(&r, 405, "method_not_allowed", "PUT", NULL);
  assert_non_null(strstr(r.allow, "GET"));
  assert_non_null(strstr(r.allow, "POST"));
  resp_free(&r);
  req(f, "POST", "/v1/nodes", NULL, &r);
  expect_error(&r, 405, "method_not_allowed", NULL, NULL);
  assert_string_equal(r.allow, "GET, HEAD");
  resp_free(&r);
  req(f, "GET", "/v1/nodes/n1/drain", NULL, &r);
  expect_error(&r, 405, "method_not_allowed", NULL, NULL);
  assert_string_equal(r.allow, "POST");
  resp_free(&r);
  req(f, "PATCH", "/v1/services/x", NULL, &r);
  expect_error(&r, 405, "method_not_allowed", NULL, NULL);
  assert_non_null(strstr(r.allow, "DELETE"));
  resp_free(&r);
}

static void test_oversized(void **state) {
  struct fx *f = *state;
  struct resp r;
  size_t n = 3 * BODY_MAX;
  char *big = malloc(n + 1);
  CURLcode rc;
  assert_non_null(big);
  memset(big, ' ', n);
  big[0] = '{';
  big[n - 1] = '}';
  big[n] = 0;
  /* declared length: refused before the body is read */
  req(f, "POST", "/v1/services", big, &r);
  expect_error(&r, 413, "payload_too_large", "4096", NULL);
  resp_free(&r);
  /* chunked: refused once it grows past the limit */
  rc = do_req(f->base, "POST", "/v1/services", big, NULL, 1, 10000, &r);
  assert_int_equal(rc, CURLE_OK);
  expect_error(&r, 413, "payload_too_large", NULL, NULL);
  resp_free(&r);
  /* just under the limit is read (and then judged on its content) */
  big[BODY_MAX - 2] = '}';
  big[BODY_MAX - 1] = 0;
  req(f, "POST", "/v1/services", big, &r);
  expect_error(&r, 400, "invalid_argument", "name", NULL);
  resp_free(&r);
  free(big);
  assert_int_equal(req(f, "GET", "/healthz", NULL, &r), 200);
  resp_free(&r);
}

static void test_token(void **state) {
  struct fx *f = *state;
  struct resp r;
  static const char *const none[] = {NULL};
  static const char *const wrong[] = {"Authorization: Bearer nope", NULL};
  static const char *const prefix[] = {"Authorization: Bearer s3cre", NULL};
  static const char *const longer[] = {"Authorization: Bearer s3cret!", NULL};
  static const char *const basic[] = {"Authorization: Basic czNjcmV0", NULL};
  static const char *const right[] = {"Authorization: Bearer s3cret", NULL};
  static const char *const lower[] = {"Authorization: bearer s3cret", NULL};
  const char *const *bad[] = {none, wrong, prefix, longer, basic};

  f->c.token = "s3cret";
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    assert_int_equal(
        do_req(f->base, "POST", "/v1/services", svc_body, bad[i], 0, 10000, &r),
        CURLE_OK);
    expect_error(&r, 401, "unauthenticated", NULL, NULL);
    assert_non_null(strstr(r.www_auth, "Bearer"));
    resp_free(&r);
    assert_int_equal(do_req(f->base, "DELETE", "/v1/services/echo-ut", NULL,
                            bad[i], 0, 10000, &r),
                     CURLE_OK);
    expect_error(&r, 401, "unauthenticated", NULL, NULL);
    resp_free(&r);
  }
  assert_null(f->c.reg.services);
  /* reads need no token */
  assert_int_equal(req(f, "GET", "/v1/services", NULL, &r), 200);
  resp_free(&r);
  assert_int_equal(
      do_req(f->base, "POST", "/v1/services", svc_body, right, 0, 10000, &r),
      CURLE_OK);
  assert_int_equal(r.status, 201);
  resp_free(&r);
  assert_int_equal(do_req(f->base, "DELETE", "/v1/services/echo-ut", NULL,
                          lower, 0, 10000, &r),
                   CURLE_OK);
  assert_int_equal(r.status, 200);
  resp_free(&r);
  f->c.token = NULL;
}

static void test_nodes_unknown(void **state) {
  struct fx *f = *state;
  struct resp r;
  req(f, "POST", "/v1/nodes/ghost/drain", NULL, &r);
  expect_error(&r, 404, "not_found", "ghost", NULL);
  resp_free(&r);
  req(f, "POST", "/v1/nodes/ghost/undrain", NULL, &r);
  expect_error(&r, 404, "not_found", "ghost", NULL);
  resp_free(&r);
  req(f, "DELETE", "/v1/nodes/ghost", NULL, &r);
  expect_error(&r, 404, "not_found", "ghost", NULL);
  resp_free(&r);
  req(f, "GET", "/v1/nodes/ghost", NULL, &r);
  expect_error(&r, 404, "not_found", "ghost", NULL);
  resp_free(&r);
}

static void add_node(struct fx *f, const char *id) {
  struct lynx_label labels[1] = {{"zone", "a"}};
  struct lynx_accel_info acc[2];
  struct lynx_reg_err err;
  int rc;
  memset(acc, 0, sizeof(acc));
  memset(&err, 0, sizeof(err));
  for (uint32_t i = 0; i < 2; i++) {
    acc[i].idx = i;
    snprintf(acc[i].kind, sizeof(acc[i].kind), "cpu");
    snprintf(acc[i].model, sizeof(acc[i].model), "x86-64");
    acc[i].memory_bytes = 1u << 30;
  }
  pthread_mutex_lock(&f->c.lock);
  rc = lynx_reg_register(&f->c.reg, id, "127.0.0.1:40000", 7, labels, 1, acc, 2,
                         NULL, lynx_coord_now_ms(), &err);
  lynx_coord_changed(&f->c);
  pthread_mutex_unlock(&f->c.lock);
  if (rc)
    fail_msg("register %s: %d %s", id, rc, err.message);
}

/* The kinds of an events answer's items, joined by ' ' (into buf); the
 * answer's next in *next. */
static const char *event_kinds(struct json_object *j, char *buf, size_t len,
                               uint64_t *next) {
  struct json_object *items, *v;
  size_t off = 0;
  buf[0] = 0;
  *next = json_object_object_get_ex(j, "next", &v)
              ? (uint64_t)json_object_get_uint64(v)
              : 0;
  if (!json_object_object_get_ex(j, "items", &items))
    return buf;
  for (size_t i = 0; i < json_object_array_length(items); i++) {
    struct json_object *e = json_object_array_get_idx(items, i);
    if (json_object_object_get_ex(e, "kind", &v))
      off += (size_t)snprintf(buf + off, off < len ? len - off : 0, "%s%s",
                              off ? " " : "", json_object_get_string(v));
  }
  return buf;
}

/* GET /v1/events: what operators did and what happened, oldest first, in
 * pages (since, limit, next); bad arguments are 400. */
static void test_events(void **state) {
  struct fx *f = *state;
  struct resp r;
  char kinds[512], path[96];
  uint64_t next;
  add_node(f, "n1");
  assert_int_equal(req(f, "POST", "/v1/nodes/n1/drain", NULL, &r), 200);
  resp_free(&r);
  assert_int_equal(req(f, "POST", "/v1/services",
                       "{\"name\":\"e\",\"port\":9000,\"app\":\"echo\"}", &r),
                   201);
  resp_free(&r);
  assert_int_equal(req(f, "GET", "/v1/events", NULL, &r), 200);
  /* n1 has no instance: draining ends at once, drained */
  assert_string_equal(event_kinds(r.json, kinds, sizeof(kinds), &next),
                      "node_registered node_draining node_drained "
                      "service_created");
  assert_int_equal(next, 5);
  resp_free(&r);
  /* a page of one, then the rest from its next */
  assert_int_equal(req(f, "GET", "/v1/events?since=2&limit=1", NULL, &r), 200);
  assert_string_equal(event_kinds(r.json, kinds, sizeof(kinds), &next),
                      "node_draining");
  assert_int_equal(next, 3);
  resp_free(&r);
  snprintf(path, sizeof(path), "/v1/events?since=%llu",
           (unsigned long long)next);
  assert_int_equal(req(f, "GET", path, NULL, &r), 200);
  assert_string_equal(event_kinds(r.json, kinds, sizeof(kinds), &next),
                      "node_drained service_created");
  resp_free(&r);
  /* caught up: nothing, next unchanged */
  assert_int_equal(req(f, "GET", "/v1/events?since=5", NULL, &r), 200);
  assert_string_equal(event_kinds(r.json, kinds, sizeof(kinds), &next), "");
  assert_int_equal(next, 5);
  resp_free(&r);
  /* a since from an earlier coordinator's count: from the oldest kept */
  assert_int_equal(req(f, "GET", "/v1/events?since=900&limit=1", NULL, &r),
                   200);
  assert_string_equal(event_kinds(r.json, kinds, sizeof(kinds), &next),
                      "node_registered");
  resp_free(&r);
  static const char *const bad[] = {"/v1/events?since=x", "/v1/events?since=-1",
                                    "/v1/events?limit=0",
                                    "/v1/events?limit=1001"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    assert_int_equal(req(f, "GET", bad[i], NULL, &r), 400);
    assert_non_null(strstr(r.body, "invalid_argument"));
    resp_free(&r);
  }
}

/* GET /ui/ serves the console's page, /ui/{file} its files with their
 * types and the headers that keep the page to its own scripts; an unknown
 * file is 404. */
static void test_ui(void **state) {
  struct fx *f = *state;
  struct resp r;
  static const struct {
    const char *path, *type, *has;
  } files[] = {{"/ui/", "text/html", "<canvas id=\"heatmap\""},
               {"/ui", "text/html", "console.js"},
               {"/ui/console.js", "text/javascript", "/v1/watch"},
               {"/ui/console.css", "text/css", ".node"}};
  for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
    assert_int_equal(req(f, "GET", files[i].path, NULL, &r), 200);
    assert_non_null(strstr(r.ctype, files[i].type));
    assert_non_null(strstr(r.body, files[i].has));
    resp_free(&r);
  }
  assert_int_equal(req(f, "GET", "/ui/nope.js", NULL, &r), 404);
  assert_non_null(strstr(r.body, "not_found"));
  resp_free(&r);
  assert_int_equal(req(f, "POST", "/ui/", NULL, &r), 405);
  resp_free(&r);
}

/* ids of a list answer's items, joined by ' ' (into buf) */
static const char *item_ids(struct json_object *j, char *buf, size_t len) {
  struct json_object *items, *id;
  size_t n, off = 0;
  buf[0] = 0;
  if (!json_object_object_get_ex(j, "items", &items))
    return buf;
  n = json_object_array_length(items);
  for (size_t i = 0; i < n && off < len; i++)
    if (json_object_object_get_ex(json_object_array_get_idx(items, i), "id",
                                  &id))
      off += (size_t)snprintf(buf + off, len - off, "%s%s", i ? " " : "",
                              json_object_get_string(id));
  return buf;
}

/* Pages of the big lists: in id order whatever the registration order,
 * "next" only while more follow, after=next continues exactly there (for
 * accelerators also from a node id); bad arguments are 400. */
static void test_list_pages(void **state) {
  struct fx *f = *state;
  struct resp r;
  char ids[256];
  static const char *const bad[] = {
      "/v1/nodes?limit=0", "/v1/nodes?limit=x", "/v1/nodes?limit=10001",
      "/v1/nodes?after=n-a", "/v1/accelerators?limit=-1"};
  add_node(f, "n-c");
  add_node(f, "n-a");
  add_node(f, "n-d");
  add_node(f, "n-b");
  assert_int_equal(req(f, "GET", "/v1/nodes?limit=3", NULL, &r), 200);
  assert_string_equal(item_ids(r.json, ids, sizeof(ids)), "n-a n-b n-c");
  assert_string_equal(jstr(r.json, "next", NULL), "n-c");
  resp_free(&r);
  assert_int_equal(req(f, "GET", "/v1/nodes?limit=3&after=n-c", NULL, &r), 200);
  assert_string_equal(item_ids(r.json, ids, sizeof(ids)), "n-d");
  assert_null(jstr(r.json, "next", NULL));
  resp_free(&r);
  /* nodes that register between two pages: those after the page go on
   * the next one, those before it do not come back */
  add_node(f, "n-e");
  add_node(f, "n-bb");
  assert_int_equal(req(f, "GET", "/v1/nodes?limit=3&after=n-c", NULL, &r), 200);
  assert_string_equal(item_ids(r.json, ids, sizeof(ids)), "n-d n-e");
  resp_free(&r);
  assert_int_equal(req(f, "GET", "/v1/nodes?limit=2&after=n-b", NULL, &r), 200);
  assert_string_equal(item_ids(r.json, ids, sizeof(ids)), "n-bb n-c");
  assert_string_equal(jstr(r.json, "next", NULL), "n-c");
  resp_free(&r);
  assert_int_equal(req(f, "GET", "/v1/nodes?limit=6", NULL, &r), 200);
  assert_string_equal(item_ids(r.json, ids, sizeof(ids)),
                      "n-a n-b n-bb n-c n-d n-e");
  assert_null(jstr(r.json, "next", NULL));
  resp_free(&r);
  assert_int_equal(req(f, "GET", "/v1/nodes?limit=2&after=zz", NULL, &r), 200);
  assert_string_equal(item_ids(r.json, ids, sizeof(ids)), "");
  resp_free(&r);

  assert_int_equal(req(f, "GET", "/v1/accelerators?limit=3", NULL, &r), 200);
  assert_string_equal(item_ids(r.json, ids, sizeof(ids)), "n-a/0 n-a/1 n-b/0");
  assert_string_equal(jstr(r.json, "next", NULL), "n-b/0");
  resp_free(&r);
  assert_int_equal(
      req(f, "GET", "/v1/accelerators?limit=3&after=n-b%2F0", NULL, &r), 200);
  assert_string_equal(item_ids(r.json, ids, sizeof(ids)),
                      "n-b/1 n-bb/0 n-bb/1");
  assert_string_equal(jstr(r.json, "next", NULL), "n-bb/1");
  resp_free(&r);
  assert_int_equal(
      req(f, "GET", "/v1/accelerators?limit=9&after=n-c/1", NULL, &r), 200);
  assert_string_equal(item_ids(r.json, ids, sizeof(ids)),
                      "n-d/0 n-d/1 n-e/0 n-e/1");
  assert_null(jstr(r.json, "next", NULL));
  resp_free(&r);
  assert_int_equal(
      req(f, "GET", "/v1/accelerators?limit=1&after=n-c", NULL, &r), 200);
  assert_string_equal(item_ids(r.json, ids, sizeof(ids)), "n-d/0");
  resp_free(&r);
  /* without limit: the whole list, as before */
  assert_int_equal(req(f, "GET", "/v1/accelerators", NULL, &r), 200);
  assert_null(jstr(r.json, "next", NULL));
  assert_int_equal(strlen(item_ids(r.json, ids, sizeof(ids))) > 40, 1);
  resp_free(&r);
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    req(f, "GET", bad[i], NULL, &r);
    expect_error(&r, 400, "invalid_argument", NULL, NULL);
    resp_free(&r);
  }
}

static void test_node_ops(void **state) {
  struct fx *f = *state;
  struct resp r;
  struct json_object *items, *accels;
  const char *st;
  char *disk;

  add_node(f, "node-a");
  assert_int_equal(req(f, "GET", "/v1/nodes/node-a", NULL, &r), 200);
  assert_string_equal(jstr(r.json, "state", NULL), "ready");
  assert_string_equal(jstr(r.json, "epoch", NULL), "7");
  assert_string_equal(jstr(r.json, "labels", "zone"), "a");
  assert_true(json_object_object_get_ex(r.json, "accelerators", &accels));
  assert_int_equal(json_object_array_length(accels), 2);
  resp_free(&r);
  assert_int_equal(req(f, "GET", "/v1/nodes/node%2Da", NULL, &r), 200);
  assert_string_equal(jstr(r.json, "id", NULL), "node-a");
  resp_free(&r);
  assert_int_equal(req(f, "GET", "/v1/accelerators", NULL, &r), 200);
  assert_true(json_object_object_get_ex(r.json, "items", &items));
  assert_int_equal(json_object_array_length(items), 2);
  resp_free(&r);

  assert_int_equal(req(f, "POST", "/v1/nodes/node-a/drain", NULL, &r), 200);
  st = jstr(r.json, "state", NULL);
  assert_non_null(st);
  assert_true(!strcmp(st, "draining") || !strcmp(st, "drained"));
  resp_free(&r);
  disk = slurp(f->state);
  assert_non_null(disk);
  assert_non_null(strstr(disk, "node-a")); /* the drain intent */
  free(disk);

  /* only a down node can be forgotten */
  req(f, "DELETE", "/v1/nodes/node-a", NULL, &r);
  expect_error(&r, 409, "conflict", NULL, NULL);
  resp_free(&r);

  assert_int_equal(req(f, "POST", "/v1/nodes/node-a/undrain", NULL, &r), 200);
  assert_string_equal(jstr(r.json, "state", NULL), "ready");
  resp_free(&r);
  disk = slurp(f->state);
  assert_non_null(disk);
  assert_null(strstr(disk, "node-a"));
  free(disk);

  assert_int_equal(req(f, "GET", "/metrics", NULL, &r), 200);
  assert_non_null(
      strstr(r.body, "lynx_coordinator_nodes{state=\"ready\"} 1\n"));
  assert_non_null(strstr(r.body, "lynx_coordinator_accelerators 2\n"));
  resp_free(&r);

  /* leave: down, then forgettable */
  pthread_mutex_lock(&f->c.lock);
  assert_int_equal(lynx_reg_leave(&f->c.reg, "node-a", 7, lynx_coord_now_ms()),
                   0);
  pthread_mutex_unlock(&f->c.lock);
  req(f, "POST", "/v1/nodes/node-a/drain", NULL, &r);
  expect_error(&r, 409, "conflict", "down", NULL);
  resp_free(&r);
  assert_int_equal(req(f, "DELETE", "/v1/nodes/node-a", NULL, &r), 200);
  assert_string_equal(jstr(r.json, "state", NULL), "down");
  resp_free(&r);
  req(f, "GET", "/v1/nodes/node-a", NULL, &r);
  expect_error(&r, 404, "not_found", NULL, NULL);
  resp_free(&r);
}

struct bumper {
  struct fx *f;
  unsigned delay_ms;
};

static void *bump_later(void *arg) {
  struct bumper *b = arg;
  struct timespec ts = {0, (long)b->delay_ms * 1000000L};
  nanosleep(&ts, NULL);
  pthread_mutex_lock(&b->f->c.lock);
  b->f->c.reg.version++;
  lynx_coord_changed(&b->f->c);
  pthread_mutex_unlock(&b->f->c.lock);
  return NULL;
}

static uint64_t watch_version(struct resp *r) {
  struct json_object *v;
  assert_int_equal(r->status, 200);
  assert_true(json_object_object_get_ex(r->json, "version", &v));
  return json_object_get_uint64(v);
}

static void test_watch(void **state) {
  struct fx *f = *state;
  struct resp r;
  char path[128];
  uint64_t v, t0, dt;
  pthread_t th;
  struct bumper b = {f, 300};

  /* without since: the current version at once */
  assert_int_equal(req(f, "GET", "/v1/watch", NULL, &r), 200);
  v = watch_version(&r);
  resp_free(&r);
  assert_int_equal(v, f->c.reg.version);

  /* woken by a change from another thread */
  snprintf(path, sizeof(path), "/v1/watch?since=%llu&timeout_ms=10000",
           (unsigned long long)v);
  assert_int_equal(pthread_create(&th, NULL, bump_later, &b), 0);
  t0 = now_ms();
  req(f, "GET", path, NULL, &r);
  dt = now_ms() - t0;
  pthread_join(th, NULL);
  assert_int_equal(watch_version(&r), v + 1);
  resp_free(&r);
  assert_true(dt >= 250);
  assert_true(dt < 5000);

  /* nothing changes: answers the same version at the timeout */
  snprintf(path, sizeof(path), "/v1/watch?since=%llu&timeout_ms=400",
           (unsigned long long)(v + 1));
  t0 = now_ms();
  req(f, "GET", path, NULL, &r);
  dt = now_ms() - t0;
  assert_int_equal(watch_version(&r), v + 1);
  resp_free(&r);
  assert_true(dt >= 350);
  assert_true(dt < 3000);

  /* already past since: at once */
  snprintf(path, sizeof(path), "/v1/watch?since=%llu&timeout_ms=10000",
           (unsigned long long)v);
  t0 = now_ms();
  req(f, "GET", path, NULL, &r);
  assert_int_equal(watch_version(&r), v + 1);
  assert_true(now_ms() - t0 < ut_scaled(2000));
  resp_free(&r);

  /* since from a previous incarnation (higher than now): at once */
  t0 = now_ms();
  req(f, "GET", "/v1/watch?since=999999&timeout_ms=10000", NULL, &r);
  assert_int_equal(watch_version(&r), v + 1);
  assert_true(now_ms() - t0 < ut_scaled(2000));
  resp_free(&r);

  req(f, "GET", "/v1/watch?since=abc", NULL, &r);
  expect_error(&r, 400, "invalid_argument", "since", NULL);
  resp_free(&r);
  req(f, "GET", "/v1/watch?since=1&timeout_ms=-5", NULL, &r);
  expect_error(&r, 400, "invalid_argument", "timeout_ms", NULL);
  resp_free(&r);
}

struct watcher {
  const char *base;
  uint64_t since;
  CURLcode rc;
  struct resp r;
};

static void *watch_thread(void *arg) {
  struct watcher *w = arg;
  char path[128];
  snprintf(path, sizeof(path), "/v1/watch?since=%llu&timeout_ms=60000",
           (unsigned long long)w->since);
  w->rc = do_req(w->base, "GET", path, NULL, NULL, 0, 70000, &w->r);
  return NULL;
}

/* lynx_http_stop does not wait for blocked watchers' timeouts. */
static void test_stop_wakes_watchers(void **state) {
  struct fx *f = *state;
  struct watcher w[3];
  pthread_t th[3];
  struct timespec ts = {0, 300 * 1000000L};
  uint64_t t0;
  for (int i = 0; i < 3; i++) {
    memset(&w[i], 0, sizeof(w[i]));
    w[i].base = f->base;
    w[i].since = f->c.reg.version;
    assert_int_equal(pthread_create(&th[i], NULL, watch_thread, &w[i]), 0);
  }
  nanosleep(&ts, NULL);
  t0 = now_ms();
  lynx_http_stop(&f->c);
  assert_true(now_ms() - t0 < ut_scaled(3000));
  for (int i = 0; i < 3; i++) {
    pthread_join(th[i], NULL);
    resp_free(&w[i].r);
  }
  assert_null(f->c.http);
}

static void test_metrics(void **state) {
  struct fx *f = *state;
  struct resp r;
  static const char *const series[] = {
      "lynx_coordinator_nodes{state=\"ready\"} ",
      "lynx_coordinator_nodes{state=\"draining\"} ",
      "lynx_coordinator_nodes{state=\"drained\"} ",
      "lynx_coordinator_nodes{state=\"down\"} ",
      "lynx_coordinator_accelerators ",
      "lynx_coordinator_requests_total ",
      "lynx_coordinator_lease_expiries_total ",
      "lynx_coordinator_table_pushes_total ",
      "lynx_coordinator_registry_version ",
      "lynx_coordinator_services 1\n",
      "# TYPE lynx_coordinator_requests_total counter\n",
  };
  assert_int_equal(req(f, "POST", "/v1/services", svc_body, &r), 201);
  resp_free(&r);
  assert_int_equal(req(f, "GET", "/metrics", NULL, &r), 200);
  assert_non_null(strstr(r.ctype, "text/plain"));
  for (size_t i = 0; i < sizeof(series) / sizeof(series[0]); i++)
    if (!strstr(r.body, series[i]))
      fail_msg("/metrics lacks '%s':\n%s", series[i], r.body);
  resp_free(&r);
}

/* Without a token, changes come only from loopback peers. */
static void test_loopback_only(void **state) {
  struct fx *f = *state;
  struct ifaddrs *ifa, *i;
  char ip[INET_ADDRSTRLEN] = "", base[64];
  struct resp r;

  assert_int_equal(getifaddrs(&ifa), 0);
  for (i = ifa; i; i = i->ifa_next)
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
        (i->ifa_flags & IFF_UP) && !(i->ifa_flags & IFF_LOOPBACK)) {
      inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, ip,
                sizeof(ip));
      break;
    }
  freeifaddrs(ifa);
  if (!ip[0])
    ut_skip("no non-loopback IPv4 address on this machine");
  lynx_http_stop(&f->c);
  assert_int_equal(serve(f, "0.0.0.0"), 0);
  snprintf(base, sizeof(base), "http://%s:%u", ip, f->port);
  assert_int_equal(
      do_req(base, "POST", "/v1/services", svc_body, NULL, 0, 10000, &r),
      CURLE_OK);
  expect_error(&r, 403, "permission_denied", "loopback", NULL);
  resp_free(&r);
  assert_int_equal(
      do_req(base, "GET", "/v1/services", NULL, NULL, 0, 10000, &r), CURLE_OK);
  assert_int_equal(r.status, 200);
  resp_free(&r);
  /* loopback is still fine */
  assert_int_equal(req(f, "POST", "/v1/services", svc_body, &r), 201);
  resp_free(&r);
  /* with a token, any peer that has it */
  {
    static const char *const right[] = {"Authorization: Bearer t0k", NULL};
    f->c.token = "t0k";
    assert_int_equal(do_req(base, "DELETE", "/v1/services/echo-ut", NULL, right,
                            0, 10000, &r),
                     CURLE_OK);
    assert_int_equal(r.status, 200);
    resp_free(&r);
    f->c.token = NULL;
  }
}

/* POST /v1/services with svc_body: refused with status and code, the
 * message saying "not applied" and word, and the service not created. */
static void create_not_applied(struct fx *f, long status, const char *code,
                               const char *word) {
  struct resp r;
  req(f, "POST", "/v1/services", svc_body, &r);
  expect_error(&r, status, code, "not applied", word);
  resp_free(&r);
  req(f, "GET", "/v1/services/echo-ut", NULL, &r);
  assert_int_equal(r.status, 404);
  resp_free(&r);
}

/* A state directory that cannot be written refuses a change before it is
 * applied: 500 (507 for want of space: tests/faults/coordinator.sh), the
 * reason named, the service not created; with the directory back, the
 * same request succeeds. */
static void test_save_failure(void **state) {
  struct fx *f = *state;
  struct resp r;
  f->c.state_dir = "/nonexistent/lynx-ut-http";
  lynx_log_level = -1; /* the error line is expected */
  create_not_applied(f, 500, "internal", "No such file or directory");
  lynx_log_level = LYNX_LOG_ERROR;
  f->c.state_dir = f->dir;
  req(f, "POST", "/v1/services", svc_body, &r);
  assert_int_equal(r.status, 201);
  resp_free(&r);
}

/* A store in memory behind coord.h's save hook, as etcd is: the state it
 * holds (JSON text, as lynx_store_state_obj encodes it), and the error it
 * answers while it cannot serve. Like etcd it is a network call, made
 * without the registry's lock (heartbeats must not wait on the store):
 * locked counts saves made while the saving thread held c->lock. */
struct memstore {
  char *held;
  int fail; /* -errno to answer; 0: it saves */
  unsigned saves;
  struct lynx_coord *c;
  unsigned locked;
};

static int memstore_save(void *arg, struct json_object *state, char *err,
                         size_t errlen) {
  struct memstore *m = arg;
  m->saves++;
  /* c->lock is error-checking (setup): locking it again from the thread
   * that holds it says so, however other threads use it meanwhile */
  if (pthread_mutex_lock(&m->c->lock) == 0)
    pthread_mutex_unlock(&m->c->lock);
  else
    m->locked++;
  if (m->fail) {
    snprintf(err, errlen, "the memory store is down");
    return m->fail;
  }
  free(m->held);
  m->held = strdup(json_object_to_json_string_ext(
      state, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE));
  return m->held ? 0 : -ENOMEM;
}

/* The node's state, as GET /v1/nodes/{id} says it. */
static void expect_node_state(struct fx *f, const char *id, const char *want) {
  char path[64];
  struct resp r;
  snprintf(path, sizeof(path), "/v1/nodes/%s", id);
  assert_int_equal(req(f, "GET", path, NULL, &r), 200);
  assert_string_equal(jstr(r.json, "state", NULL), want);
  resp_free(&r);
}

/* method path (body): refused with status and code, the message saying
 * word (NULL: anything). */
static void refused(struct fx *f, const char *method, const char *path,
                    const char *body, long status, const char *code,
                    const char *word) {
  struct resp r;
  req(f, method, path, body, &r);
  expect_error(&r, status, code, word, NULL);
  resp_free(&r);
}

/* A change of operator intent is saved before it is applied: while the
 * store cannot take it, every change (service create and delete, node
 * drain, undrain and forget) answers the store's error (503 when it cannot
 * serve, 507 when it has no room), says it was not applied, and nothing
 * changed, in the API or in the store; once the store is back the same
 * request succeeds and the store holds the state as the API shows it. A
 * change the registry refuses is not saved at all. Every save is made
 * with the registry's lock released (the loop answers heartbeats
 * meanwhile, however long the store takes). */
static void test_store_refuses_change(void **state) {
  struct fx *f = *state;
  struct memstore m = {NULL, 0, 0, &f->c, 0};
  struct resp r;
  unsigned saves;

  f->c.save = memstore_save;
  f->c.save_arg = &m;
  f->c.save_where = "the memory store";
  add_node(f, "node-a");
  lynx_log_level = -1; /* the refusals log errors, as they should */

  m.fail = -ETIMEDOUT;
  create_not_applied(f, 503, "store_unavailable", "the memory store is down");
  assert_null(m.held);
  m.fail = 0;
  assert_int_equal(req(f, "POST", "/v1/services", svc_body, &r), 201);
  resp_free(&r);
  assert_non_null(m.held);
  assert_non_null(strstr(m.held, "\"name\":\"echo-ut\""));

  /* refused by the registry: nothing saved */
  saves = m.saves;
  refused(f, "POST", "/v1/services", svc_body, 409, "conflict",
          "already exists");
  refused(f, "POST", "/v1/nodes/node-b/drain", NULL, 404, "not_found", NULL);
  refused(f, "DELETE", "/v1/nodes/node-a", NULL, 409, "conflict",
          "only a down node");
  assert_int_equal(m.saves, saves);

  m.fail = -ECANCELED; /* this coordinator no longer leads */
  refused(f, "DELETE", "/v1/services/echo-ut", NULL, 503, "store_unavailable",
          "service delete: not applied");
  assert_int_equal(req(f, "GET", "/v1/services/echo-ut", NULL, &r), 200);
  resp_free(&r);
  refused(f, "POST", "/v1/nodes/node-a/drain", NULL, 503, "store_unavailable",
          "node drain: not applied");
  expect_node_state(f, "node-a", "ready");
  assert_null(strstr(m.held, "node-a"));

  m.fail = 0;
  assert_int_equal(req(f, "POST", "/v1/nodes/node-a/drain", NULL, &r), 200);
  resp_free(&r);
  assert_non_null(strstr(m.held, "\"drained\":[\"node-a\"]"));
  assert_int_equal(req(f, "POST", "/v1/nodes/node-a/drain", NULL, &r), 200);
  resp_free(&r); /* drained once, listed once */
  assert_non_null(strstr(m.held, "\"drained\":[\"node-a\"]"));
  m.fail = -ENOSPC;
  refused(f, "POST", "/v1/nodes/node-a/undrain", NULL, 507,
          "insufficient_storage", "node undrain: not applied");
  expect_node_state(f, "node-a", "drained");
  assert_non_null(strstr(m.held, "\"drained\":[\"node-a\"]"));

  /* down with its drain intent: forgetting it takes the intent along */
  pthread_mutex_lock(&f->c.lock);
  assert_int_equal(lynx_reg_leave(&f->c.reg, "node-a", 7, lynx_coord_now_ms()),
                   0);
  pthread_mutex_unlock(&f->c.lock);
  m.fail = -ETIMEDOUT;
  refused(f, "DELETE", "/v1/nodes/node-a", NULL, 503, "store_unavailable",
          "node forget: not applied");
  expect_node_state(f, "node-a", "down");
  m.fail = 0;
  assert_int_equal(req(f, "DELETE", "/v1/nodes/node-a", NULL, &r), 200);
  resp_free(&r);
  assert_non_null(strstr(m.held, "\"drained\":[]"));
  assert_int_equal(req(f, "DELETE", "/v1/services/echo-ut", NULL, &r), 200);
  resp_free(&r);
  assert_non_null(strstr(m.held, "\"services\":[]"));
  /* every save ran with the registry free for the loop's heartbeats */
  assert_int_not_equal(m.saves, 0);
  assert_int_equal(m.locked, 0);
  lynx_log_level = LYNX_LOG_ERROR;
  f->c.save = NULL;
  free(m.held);
}

/* ---- slow and greedy clients ----------------------------------------------
 */

/* A raw connection to the API from source address src (any 127.x is
 * loopback), with text sent at once. -1 on failure. */
static int raw_open(struct fx *f, const char *src, const char *text) {
  struct sockaddr_in sa, da;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  memset(&sa, 0, sizeof(sa));
  memset(&da, 0, sizeof(da));
  sa.sin_family = da.sin_family = AF_INET;
  inet_pton(AF_INET, src, &sa.sin_addr);
  inet_pton(AF_INET, "127.0.0.1", &da.sin_addr);
  da.sin_port = htons((uint16_t)f->port);
  if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) ||
      connect(fd, (struct sockaddr *)&da, sizeof(da)) ||
      (text &&
       send(fd, text, strlen(text), MSG_NOSIGNAL) != (ssize_t)strlen(text))) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Sends one byte on every open fds[i] each every_ms, and reads what comes
 * (an answer is kept in got[i] when got is given), until the server has
 * closed each of them or limit_ms passed. life[i]: ms from opened (taken
 * before the connections were opened, so a busy machine's delay before
 * the call does not shorten it) to the close, or -1 when still open (fds[i]
 * is then left open). */
static void trickle(int *fds, int n, long *life, char (*got)[1024],
                    uint64_t opened, unsigned every_ms, unsigned limit_ms,
                    int send_bytes) {
  uint64_t t0 = now_ms(), next = t0;
  size_t glen[8] = {0};
  int open_n = n;
  assert_true(n <= 8);
  for (int i = 0; i < n; i++) {
    life[i] = -1;
    if (got)
      got[i][0] = 0;
  }
  while (open_n > 0 && now_ms() - t0 < limit_ms) {
    struct pollfd p[8];
    if (send_bytes && now_ms() >= next) {
      for (int i = 0; i < n; i++)
        if (life[i] < 0)
          (void)send(fds[i], "a", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      next += every_ms;
    }
    for (int i = 0; i < n; i++) {
      p[i].fd = life[i] < 0 ? fds[i] : -1;
      p[i].events = POLLIN;
      p[i].revents = 0;
    }
    poll(p, (nfds_t)n, 20);
    for (int i = 0; i < n; i++) {
      char buf[1024];
      ssize_t r;
      if (life[i] >= 0 || !p[i].revents)
        continue;
      r = recv(fds[i], buf, sizeof(buf), MSG_DONTWAIT);
      if (r > 0) {
        if (got) {
          size_t k = (size_t)r < sizeof(got[i]) - 1 - glen[i]
                         ? (size_t)r
                         : sizeof(got[i]) - 1 - glen[i];
          memcpy(got[i] + glen[i], buf, k);
          glen[i] += k;
          got[i][glen[i]] = 0;
        }
        continue;
      }
      if (r < 0 && (errno == EAGAIN || errno == EINTR))
        continue;
      life[i] = (long)(now_ms() - opened);
      close(fds[i]);
      open_n--;
    }
  }
}

/* The value of one /metrics sample (full series text with labels). */
static long metric_value(struct fx *f, const char *series) {
  struct resp r;
  char *p;
  long v = -1;
  assert_int_equal(req(f, "GET", "/metrics", NULL, &r), 200);
  /* the sample's line (not its family's # HELP / # TYPE lines) */
  for (p = r.body; p && (p = strstr(p, series)) != NULL; p++)
    if ((p == r.body || p[-1] == '\n') && p[strlen(series)] == ' ') {
      v = strtol(p + strlen(series) + 1, NULL, 10);
      break;
    }
  resp_free(&r);
  if (v < 0)
    fail_msg("/metrics lacks %s", series);
  return v;
}

/* Restarts the fixture's API with these connection limits. */
static void serve_limits(struct fx *f, unsigned conn_max, unsigned per_client,
                         unsigned timeout_ms) {
  lynx_http_stop(&f->c);
  f->c.http_conn_max = conn_max;
  f->c.http_conn_per_client = per_client;
  f->c.http_header_timeout_ms = timeout_ms;
  f->c.http_body_timeout_ms = timeout_ms;
  assert_int_equal(serve(f, "127.0.0.1"), 0);
}

/* Polls /metrics until series reads want three times in a row, 10 ms
 * apart (10 s at most, times the time scale). A gauge of connections may
 * count, for a moment, the connection of the scrape before (curl has
 * closed it, the server has not yet seen it end): one read that matches
 * is not enough, and a read after the wait is not the one waited for
 * (a failure of -j2 runs, 0x4 != 0x3). */
static void await_metric(struct fx *f, const char *series, long want) {
  uint64_t end = now_ms() + ut_scaled(10000);
  long v = -1;
  int same = 0;
  while (same < 3) {
    v = metric_value(f, series);
    same = v == want ? same + 1 : 0;
    if (same == 3)
      break;
    if (now_ms() >= end)
      fail_msg("%s reads %ld, want %ld three times in a row", series, v, want);
    usleep(10000);
  }
}

#define SHED(reason, kind)                                                     \
  "lynx_coordinator_api_connections_shed_total{reason=\"" reason               \
  "\",kind=\"" kind "\"}"
#define REFUSED(reason)                                                        \
  "lynx_coordinator_api_connections_refused_total{reason=\"" reason "\"}"

/* At a cap a new connection takes the place of the oldest that has not
 * completed its request, of its address at the per-client cap, of anyone
 * at the total; so the operator's own address is served however many
 * trickling connections share it. Deadlines hold however slowly the bytes
 * come (and for an idle keep-alive connection), and a watch longer than
 * every timeout is answered at its own. */
static void test_slow_clients(void **state) {
  struct fx *f = *state;
  struct resp r;
  int fds[4];
  long life[4];
  char got[4][1024];
  uint64_t t0;

  serve_limits(f, 16, 2, 400);
  /* headers that never end, from 127.0.0.7: the third takes the first's
   * place */
  t0 = now_ms();
  for (int i = 0; i < 3; i++) {
    fds[i] = raw_open(f, "127.0.0.7", "GET /healthz HTTP/1.1\r\nHost: x\r\n");
    assert_true(fds[i] >= 0);
    if (i < 2) /* in, before the next (with the scrape's own) */
      await_metric(f, "lynx_coordinator_api_connections", i + 2);
  }
  assert_int_equal(req(f, "GET", "/healthz", NULL, &r), 200);
  resp_free(&r);
  /* one byte every 100 ms keeps none of them alive: the first is closed
   * first (shed), the other two at the header timeout, not before */
  trickle(fds, 3, life, NULL, t0, 100, 10000, 1);
  assert_true(life[0] >= 0 && life[1] >= 0 && life[2] >= 0);
  assert_true(life[0] < life[1] && life[0] < life[2]);
  assert_true(life[1] >= 400 && life[2] >= 400);
  assert_int_equal(metric_value(f, SHED("per_client", "incomplete")), 1);
  assert_int_equal(metric_value(f, REFUSED("per_client")), 0);
  assert_int_equal(
      metric_value(f, "lynx_coordinator_api_connections_timed_out_total{"
                      "phase=\"header\"}"),
      2);
  assert_int_equal(
      metric_value(f, "lynx_coordinator_api_connections_per_client_max"), 2);
  assert_int_equal(metric_value(f, "lynx_coordinator_api_connections_max"), 16);

  /* the operator's own address holds its cap with trickling connections:
   * its next requests are answered */
  t0 = now_ms();
  for (int i = 0; i < 2; i++) {
    fds[i] = raw_open(f, "127.0.0.1", "GET /healthz HTTP/1.1\r\nHost: x\r\n");
    assert_true(fds[i] >= 0);
  }
  assert_int_equal(req(f, "GET", "/readyz", NULL, &r), 200);
  resp_free(&r);
  assert_int_equal(req(f, "POST", "/v1/services", svc_body, &r), 201);
  resp_free(&r);
  assert_int_equal(req(f, "DELETE", "/v1/services/echo-ut", NULL, &r), 200);
  resp_free(&r);
  /* the first request took the older one's place (the later ones the
   * newer's, or that of a connection of an earlier request that curl has
   * closed and the server has not yet seen end) */
  trickle(fds, 2, life, NULL, t0, 100, 10000, 1);
  assert_true(life[0] >= 0 && life[0] < 400 && life[1] >= life[0]);
  assert_true(metric_value(f, SHED("per_client", "incomplete")) >= 2);

  /* two watches from 127.0.0.9 hold its cap: a new connection from there
   * takes the older one's place, which is answered at once with the
   * version and closed; the other is answered at its timeout */
  {
    char text[160];
    snprintf(text, sizeof(text),
             "GET /v1/watch?since=%llu&timeout_ms=1500 HTTP/1.1\r\nHost: "
             "x\r\n\r\n",
             (unsigned long long)f->c.reg.version);
    t0 = now_ms();
    for (int i = 0; i < 2; i++) {
      fds[i] = raw_open(f, "127.0.0.9", text);
      assert_true(fds[i] >= 0);
      await_metric(f, "lynx_coordinator_api_watches", i + 1);
    }
    fds[2] =
        raw_open(f, "127.0.0.9", "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_true(fds[2] >= 0);
    trickle(fds, 3, life, got, t0, 100, 10000, 0);
    assert_non_null(strstr(got[0], "HTTP/1.1 200"));
    assert_non_null(strstr(got[0], "\"version\""));
    assert_non_null(strcasestr(got[0], "Connection: close"));
    assert_true(life[0] < 1000 && life[0] < life[1]);
    assert_non_null(strstr(got[1], "HTTP/1.1 200"));
    assert_true(life[1] >= 1400);
    assert_non_null(strstr(got[2], "\"ok\""));
    assert_int_equal(metric_value(f, SHED("per_client", "waiting")), 1);
  }

  /* keep-alive: answered, then closed once idle for the header timeout */
  t0 = now_ms();
  fds[0] = raw_open(f, "127.0.0.8", "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
  assert_true(fds[0] >= 0);
  trickle(fds, 1, life, got, t0, 100, 10000, 0);
  assert_non_null(strstr(got[0], "HTTP/1.1 200"));
  assert_non_null(strstr(got[0], "\"ok\""));
  assert_true(life[0] >= 400);

  /* a body that trickles: closed after the body timeout */
  t0 = now_ms();
  fds[0] = raw_open(f, "127.0.0.10",
                    "POST /v1/services HTTP/1.1\r\nHost: x\r\n"
                    "Content-Length: 100\r\n\r\n{");
  assert_true(fds[0] >= 0);
  trickle(fds, 1, life, got, t0, 100, 10000, 1);
  assert_true(life[0] >= 400);
  assert_null(strstr(got[0], "HTTP/1.1")); /* never answered */
  assert_int_equal(
      metric_value(f, "lynx_coordinator_api_connections_timed_out_total{"
                      "phase=\"body\"}"),
      1);
  assert_null(f->c.reg.services);

  /* the total cap: four trickling connections from four addresses fill
   * it; one more takes the oldest's place (the fourth, or the /healthz
   * after it, whichever comes last: the backlog is accepted in order) */
  serve_limits(f, 4, 4, 2000);
  t0 = now_ms();
  for (int i = 0; i < 4; i++) {
    char src[16];
    snprintf(src, sizeof(src), "127.0.1.%d", i + 1);
    fds[i] = raw_open(f, src, "GET /healthz HTTP/1.1\r\nHost: x\r\n");
    assert_true(fds[i] >= 0);
  }
  assert_int_equal(req(f, "GET", "/healthz", NULL, &r), 200);
  resp_free(&r);
  trickle(fds, 4, life, NULL, t0, 100, 1000, 1);
  assert_true(life[0] >= 0 && life[0] < 1000);
  assert_int_equal(metric_value(f, SHED("total", "incomplete")), 1);
  for (int i = 1; i < 4; i++)
    close(fds[i]);
}

/* A connection is refused only when every one of its address's is being
 * answered: here one whose change waits on the store (slow_save, held
 * while slow_store_hold is set). */
static int slow_save(void *arg, struct json_object *state, char *err,
                     size_t errlen) {
  (void)arg;
  (void)state;
  (void)err;
  (void)errlen;
  __atomic_add_fetch(&slow_store_saves, 1, __ATOMIC_SEQ_CST);
  while (__atomic_load_n(&slow_store_hold, __ATOMIC_SEQ_CST))
    usleep(1000);
  return 0;
}

static void test_refused_when_all_busy(void **state) {
  struct fx *f = *state;
  struct resp r;
  char text[512];
  int fds[2];
  long life[2];
  char got[2][1024];
  uint64_t t0;

  serve_limits(f, 16, 1, 5000);
  f->c.save = slow_save;
  f->c.save_where = "a slow store";
  __atomic_store_n(&slow_store_hold, 1, __ATOMIC_SEQ_CST);
  snprintf(text, sizeof(text),
           "POST /v1/services HTTP/1.1\r\nHost: x\r\nContent-Type: "
           "application/json\r\nContent-Length: %zu\r\n\r\n%s",
           strlen(svc_body), svc_body);
  t0 = now_ms();
  fds[0] = raw_open(f, "127.0.0.11", text);
  assert_true(fds[0] >= 0);
  for (int i = 0;
       i < 1000 && !__atomic_load_n(&slow_store_saves, __ATOMIC_SEQ_CST); i++)
    usleep(10000);
  assert_int_equal(__atomic_load_n(&slow_store_saves, __ATOMIC_SEQ_CST), 1);
  /* its change is being saved: nothing of 127.0.0.11's to shed */
  fds[1] =
      raw_open(f, "127.0.0.11", "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
  assert_true(fds[1] >= 0);
  /* meanwhile reads are answered (they do not wait behind the change) */
  assert_int_equal(req(f, "GET", "/v1/services", NULL, &r), 200);
  resp_free(&r);
  assert_int_equal(req(f, "GET", "/healthz", NULL, &r), 200);
  resp_free(&r);
  /* (127.0.0.1's requests, one after the other, may meet the cap too: a
   * connection whose answer curl has read may not have ended here yet) */
  assert_true(metric_value(f, REFUSED("per_client")) >= 1);
  __atomic_store_n(&slow_store_hold, 0, __ATOMIC_SEQ_CST);
  trickle(fds, 2, life, got, t0, 100, 10000, 0);
  assert_non_null(strstr(got[0], "HTTP/1.1 201"));
  assert_null(strstr(got[1], "HTTP/1.1")); /* refused: never answered */
  assert_true(life[1] >= 0 && life[1] < life[0]);
  f->c.save = NULL;
  assert_int_equal(req(f, "DELETE", "/v1/services/echo-ut", NULL, &r), 200);
  resp_free(&r);
}

/* ---- lynxctl ------------------------------------------------------------ */

#ifdef LYNXCTL
/* Runs lynxctl with args; stdout and stderr into *out / *err (malloc'd).
 * Returns the exit status. */
static int ctl(struct fx *f, char **out, char **err, ...) {
  char *argv[32], po[160], pe[160];
  va_list ap;
  int n = 0, st;
  pid_t pid;
#ifdef LYNXCTL_EMULATOR
  /* a cross build: this test runs under the emulator, and so must the
   * lynxctl it starts (no binfmt_misc to do it) */
  argv[n++] = (char *)LYNXCTL_EMULATOR;
#endif
  argv[n++] = (char *)LYNXCTL;
  va_start(ap, err);
  for (char *a; (a = va_arg(ap, char *)) != NULL && n < 31;)
    argv[n++] = a;
  va_end(ap);
  argv[n] = NULL;
  snprintf(po, sizeof(po), "%s/out0", f->dir);
  snprintf(pe, sizeof(pe), "%s/out1", f->dir);
  pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    int fo = open(po, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int fe = open(pe, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fo < 0 || fe < 0)
      _exit(99);
    dup2(fo, 1);
    dup2(fe, 2);
    unsetenv("LYNX_API");
    unsetenv("LYNX_TOKEN_FILE");
    execv(argv[0], argv);
    _exit(98);
  }
  assert_int_equal(waitpid(pid, &st, 0), pid);
  *out = slurp(po);
  *err = slurp(pe);
  assert_non_null(*out);
  assert_non_null(*err);
  assert_true(WIFEXITED(st));
  return WEXITSTATUS(st);
}

static void test_lynxctl(void **state) {
  struct fx *f = *state;
  char *out, *err, spec[160];
  struct json_object *j, *items;
  FILE *fp;

  assert_int_equal(ctl(f, &out, &err, "--api", f->base, "services", NULL), 0);
  assert_non_null(strstr(out, "NAME"));
  free(out), free(err);

  assert_int_equal(ctl(f, &out, &err, "--api", f->base, "service", "create",
                       "--name", "ctl-svc", "--port", "9200", "--app", "echo",
                       "--slots", "32", "--replicas", "2", "--selector",
                       "zone=a", NULL),
                   0);
  assert_non_null(strstr(out, "ctl-svc"));
  assert_non_null(strstr(out, "replicas=2 where zone=a"));
  free(out), free(err);

  /* again: the API's conflict, exit 1, its message printed */
  assert_int_equal(ctl(f, &out, &err, "--api", f->base, "service", "create",
                       "--name", "ctl-svc", "--port", "9201", "--app", "echo",
                       NULL),
                   1);
  assert_non_null(strstr(err, "ctl-svc"));
  assert_non_null(strstr(err, "409"));
  free(out), free(err);

  /* --json: the API's answer as it came */
  assert_int_equal(
      ctl(f, &out, &err, "services", "--json", "--api", f->base, NULL), 0);
  j = json_tokener_parse(out);
  assert_non_null(j);
  assert_true(json_object_object_get_ex(j, "items", &items));
  assert_int_equal(json_object_array_length(items), 1);
  json_object_put(j);
  free(out), free(err);

  /* -f FILE */
  snprintf(spec, sizeof(spec), "%s/spec.json", f->dir);
  fp = fopen(spec, "w");
  assert_non_null(fp);
  fputs("{\"name\": \"from-file\", \"port\": 9300, \"app\": \"echo\"}\n", fp);
  fclose(fp);
  assert_int_equal(ctl(f, &out, &err, "--api", f->base, "service", "create",
                       "-f", spec, NULL),
                   0);
  assert_non_null(strstr(out, "from-file"));
  free(out), free(err);

  assert_int_equal(ctl(f, &out, &err, "--api", f->base, "service", "delete",
                       "from-file", NULL),
                   0);
  assert_non_null(strstr(out, "deleted"));
  free(out), free(err);

  add_node(f, "ctl-node");
  assert_int_equal(ctl(f, &out, &err, "--api", f->base, "nodes", NULL), 0);
  assert_non_null(strstr(out, "LAST-HEARTBEAT"));
  assert_non_null(strstr(out, "ctl-node"));
  assert_non_null(strstr(out, "zone=a"));
  free(out), free(err);
  assert_int_equal(
      ctl(f, &out, &err, "--api", f->base, "node", "drain", "ctl-node", NULL),
      0);
  assert_non_null(strstr(out, "drain"));
  free(out), free(err);
  assert_int_equal(ctl(f, &out, &err, "--api", f->base, "accelerators", NULL),
                   0);
  assert_non_null(strstr(out, "ctl-node/1"));
  assert_non_null(strstr(out, "1.0GiB"));
  free(out), free(err);

  assert_int_equal(
      ctl(f, &out, &err, "--api", f->base, "node", "drain", "ghost", NULL), 1);
  assert_non_null(strstr(err, "ghost"));
  free(out), free(err);

  /* usage errors */
  assert_int_equal(ctl(f, &out, &err, "--api", f->base, "bogus", NULL), 2);
  free(out), free(err);
  assert_int_equal(ctl(f, &out, &err, "--api", f->base, "service", "create",
                       "--name", "x", NULL),
                   2);
  free(out), free(err);
  assert_int_equal(ctl(f, &out, &err, "--api", f->base, "service", "create",
                       "--name", "x", "--port", "eighty", "--app", "echo",
                       NULL),
                   2);
  free(out), free(err);

  /* nobody there */
  {
    char dead[64];
    snprintf(dead, sizeof(dead), "http://127.0.0.1:%u", free_port());
    assert_int_equal(ctl(f, &out, &err, "--api", dead, "nodes", NULL), 3);
    assert_non_null(strstr(err, "cannot reach the coordinator"));
    free(out), free(err);
  }
}

/* What happens to the registry while lynxctl waits: fn, ms after the
 * thread starts (under the lock; watchers woken). */
struct later {
  struct fx *f;
  void (*fn)(struct fx *f);
  long ms;
};

static void *later_main(void *arg) {
  struct later *l = arg;
  struct timespec d = {l->ms / 1000, (l->ms % 1000) * 1000000L};
  nanosleep(&d, NULL);
  pthread_mutex_lock(&l->f->c.lock);
  l->fn(l->f);
  lynx_coord_changed(&l->f->c);
  pthread_mutex_unlock(&l->f->c.lock);
  return NULL;
}

/* fe1 reports the table without the draining node: the drain ends. */
static void fe1_reports(struct fx *f) {
  lynx_reg_frontend_status(&f->c.reg, "fe1", f->c.reg.table_version, NULL, 0,
                           lynx_coord_now_ms());
}

/* n2's agent leaves. */
static void n2_leaves(struct fx *f) {
  assert_int_equal(lynx_reg_leave(&f->c.reg, "n2", 7, lynx_coord_now_ms()), 0);
}

/* lynxctl node drain --wait: until drained (woken by the watch), or exit 1
 * after --timeout with the drain going on. */
static void test_lynxctl_drain_wait(void **state) {
  struct fx *f = *state;
  char *out, *err;
  pthread_t th;
  struct lynx_reg_node *n;
  struct later report = {f, fe1_reports, 300}, leave = {f, n2_leaves, 1000};

  add_node(f, "n1");
  add_node(f, "n2");
  /* instances on n1 (ready: in the table), and a connected frontend that
   * has not run the table without them: the drain waits for it */
  assert_int_equal(ctl(f, &out, &err, "--api", f->base, "service", "create",
                       "--name", "wait-svc", "--port", "9400", "--app", "echo",
                       "--placement", "all", NULL),
                   0);
  free(out), free(err);
  pthread_mutex_lock(&f->c.lock);
  for (struct lynx_reg_instance *i = f->c.reg.instances; i; i = i->next) {
    struct lynx_region_desc d =
        ut_desc_for(i, lynx_service_region_bytes(&i->svc->spec));
    assert_int_equal(lynx_reg_instance_ready(&f->c.reg, i->node->id,
                                             i->node->epoch, i->id, &d,
                                             lynx_coord_now_ms()),
                     0);
  }
  assert_non_null(lynx_reg_frontend_connect(&f->c.reg, "fe1", "127.0.0.1:1",
                                            (void *)0x2, lynx_coord_now_ms()));
  pthread_mutex_unlock(&f->c.lock);

  assert_int_equal(ctl(f, &out, &err, "--api", f->base, "node", "drain", "n1",
                       "--wait", "--timeout", "0.4", NULL),
                   1);
  assert_non_null(strstr(out, "drain requested"));
  assert_non_null(strstr(err, "still draining after 0.4 s"));
  free(out), free(err);

  assert_int_equal(pthread_create(&th, NULL, later_main, &report), 0);
  assert_int_equal(ctl(f, &out, &err, "--api", f->base, "node", "drain", "n1",
                       "--wait", NULL),
                   0);
  pthread_join(th, NULL);
  assert_non_null(strstr(out, "node n1 drained after"));
  free(out), free(err);
  pthread_mutex_lock(&f->c.lock);
  n = lynx_reg_node_find(&f->c.reg, "n1");
  assert_int_equal(n->state, LYNX_NODE_DRAINED);
  pthread_mutex_unlock(&f->c.lock);

  /* drained already: at once */
  assert_int_equal(ctl(f, &out, &err, "--api", f->base, "node", "drain", "n1",
                       "--wait", NULL),
                   0);
  assert_non_null(strstr(out, "drained after"));
  free(out), free(err);

  /* a node that goes down while lynxctl waits will not be drained: said,
   * exit 1 */
  /* (1 s: lynxctl waits by then, even under an emulator) */
  assert_int_equal(pthread_create(&th, NULL, later_main, &leave), 0);
  assert_int_equal(ctl(f, &out, &err, "--api", f->base, "node", "drain", "n2",
                       "--wait", NULL),
                   1);
  pthread_join(th, NULL);
  assert_non_null(strstr(out, "drain requested"));
  assert_non_null(strstr(err, "node n2 is down, not draining"));
  free(out), free(err);

  /* usage */
  assert_int_equal(ctl(f, &out, &err, "--api", f->base, "node", "drain", "n1",
                       "--timeout", "5", NULL),
                   2);
  assert_non_null(strstr(err, "--timeout goes with --wait"));
  free(out), free(err);
  assert_int_equal(ctl(f, &out, &err, "--api", f->base, "node", "drain", "n1",
                       "--wait", "--timeout", "soon", NULL),
                   2);
  free(out), free(err);
}
#endif

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_health_ready, setup, teardown),
      cmocka_unit_test_setup_teardown(test_follower_no_leader, setup, teardown),
      cmocka_unit_test_setup_teardown(test_lists_shape, setup, teardown),
      cmocka_unit_test_setup_teardown(test_events, setup, teardown),
      cmocka_unit_test_setup_teardown(test_ui, setup, teardown),
      cmocka_unit_test_setup_teardown(test_service_lifecycle, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_json, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_fields, setup, teardown),
      cmocka_unit_test_setup_teardown(test_duplicate_keys, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_text, setup, teardown),
      cmocka_unit_test_setup_teardown(test_limits, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unknown_path, setup, teardown),
      cmocka_unit_test_setup_teardown(test_wrong_method, setup, teardown),
      cmocka_unit_test_setup_teardown(test_oversized, setup, teardown),
      cmocka_unit_test_setup_teardown(test_token, setup, teardown),
      cmocka_unit_test_setup_teardown(test_nodes_unknown, setup, teardown),
      cmocka_unit_test_setup_teardown(test_node_ops, setup, teardown),
      cmocka_unit_test_setup_teardown(test_list_pages, setup, teardown),
      cmocka_unit_test_setup_teardown(test_watch, setup, teardown),
      cmocka_unit_test_setup_teardown(test_stop_wakes_watchers, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_metrics, setup, teardown),
      cmocka_unit_test_setup_teardown(test_loopback_only, setup, teardown),
      cmocka_unit_test_setup_teardown(test_save_failure, setup, teardown),
      cmocka_unit_test_setup_teardown(test_store_refuses_change, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_slow_clients, setup, teardown),
      cmocka_unit_test_setup_teardown(test_refused_when_all_busy, setup,
                                      teardown),
#ifdef LYNXCTL
      cmocka_unit_test_setup_teardown(test_lynxctl, setup, teardown),
      cmocka_unit_test_setup_teardown(test_lynxctl_drain_wait, setup, teardown),
#endif
  };
  int rc;
  curl_global_init(CURL_GLOBAL_DEFAULT);
  rc = LYNX_UT_MAIN(argc, argv, "tests", tests, NULL, NULL);
  curl_global_cleanup();
  return rc;
}
