/*
 * test_etcd.c - the etcd client (coordinator/etcd.c) and the operator
 * intent stored in etcd (coordinator/store_etcd.c), against a real etcd
 * server: each case starts its own single-member etcd on free loopback
 * ports in a fresh data directory and kills it at the end. Skipped (77)
 * when the etcd binary (Debian's etcd-server) is missing.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>

#include "etcd.h"
#include "registry.h"
#include "store_etcd.h"
#include "ut_main.h"
#include "ut_spec.h"
#include "util.h"

struct fx {
  pid_t pid;
  char dir[64];
  char url[64];
  struct lynx_etcd *e;
  char err[512];
};

static unsigned free_port(void) {
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof(a);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  unsigned port = 0;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0)
    close(fd);
  return port;
}

static int have_etcd(void) {
  return system("command -v etcd >/dev/null 2>&1") == 0;
}

static int fx_setup(void **state) {
  struct fx *f = calloc(1, sizeof(*f));
  char client[64], peer[64], cluster[96];
  unsigned cport = free_port(), pport = free_port();
  if (!f)
    return -1;
  *state = f;
  if (!have_etcd())
    ut_skip("etcd-server is not installed (deploy/install-deps.sh test)");
  snprintf(f->dir, sizeof(f->dir), "/tmp/lynx-ut-etcd-XXXXXX");
  if (!mkdtemp(f->dir) || !cport || !pport)
    return -1;
  snprintf(f->url, sizeof(f->url), "http://127.0.0.1:%u", cport);
  snprintf(client, sizeof(client), "http://127.0.0.1:%u", cport);
  snprintf(peer, sizeof(peer), "http://127.0.0.1:%u", pport);
  snprintf(cluster, sizeof(cluster), "ut=%s", peer);
  f->pid = fork();
  if (f->pid < 0)
    return -1;
  if (f->pid == 0) {
    int devnull = open("/dev/null", 1);
    /* a case that crashes (an assertion, a sanitizer) takes etcd along */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(devnull, 1);
    dup2(devnull, 2);
    execlp("etcd", "etcd", "--name", "ut", "--data-dir", f->dir,
           "--listen-client-urls", client, "--advertise-client-urls", client,
           "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
           "--initial-cluster", cluster, (char *)NULL);
    _exit(127);
  }
  if (lynx_etcd_open(&f->e, f->url, 1000, f->err, sizeof(f->err)))
    return -1;
  /* serving within 10 s */
  for (int i = 0; i < 200; i++) {
    struct lynx_etcd_kvs k;
    if (lynx_etcd_get(f->e, "probe", 0, &k, f->err, sizeof(f->err)) == 0) {
      lynx_etcd_kvs_free(&k);
      return 0;
    }
    usleep(50000);
  }
  fprintf(stderr, "etcd did not start: %s\n", f->err);
  return -1;
}

static int fx_teardown(void **state) {
  struct fx *f = *state;
  char cmd[96];
  if (!f)
    return 0;
  lynx_etcd_close(f->e);
  if (f->pid > 0) {
    kill(f->pid, SIGKILL);
    waitpid(f->pid, NULL, 0);
  }
  if (f->dir[0]) {
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", f->dir);
    if (system(cmd) != 0)
      fprintf(stderr, "cannot remove %s\n", f->dir);
  }
  free(f);
  return 0;
}

static void put_ok(struct fx *f, const char *k, const char *v) {
  assert_int_equal(
      lynx_etcd_put(f->e, k, v, strlen(v), 0, f->err, sizeof(f->err)), 0);
}

/* ---- the client ---------------------------------------------------------- */

/* Keys and values are bytes: what is put is read back, a prefix reads its
 * keys in order and no other, a missing key is an empty answer, and a
 * delete (of one key or a prefix) removes exactly that. */
static void test_put_get_delete(void **state) {
  struct fx *f = *state;
  struct lynx_etcd_kvs k;
  const char bin[] = {'a', 0, (char)0xff, '"', '\\', '\n'};
  put_ok(f, "/t/b", "two");
  put_ok(f, "/t/a", "one");
  put_ok(f, "/t0", "outside");
  assert_int_equal(lynx_etcd_put(f->e, "/t/bin", bin, sizeof(bin), 0, f->err,
                                 sizeof(f->err)),
                   0);
  assert_int_equal(lynx_etcd_get(f->e, "/t/", 1, &k, f->err, sizeof(f->err)),
                   0);
  assert_int_equal(k.n, 3);
  assert_string_equal(k.kv[0].key, "/t/a");
  assert_string_equal(k.kv[0].value, "one");
  assert_string_equal(k.kv[1].key, "/t/b");
  assert_string_equal(k.kv[2].key, "/t/bin");
  assert_int_equal(k.kv[2].value_len, sizeof(bin));
  assert_memory_equal(k.kv[2].value, bin, sizeof(bin));
  assert_true(k.kv[0].create_rev > 0 && k.revision >= k.kv[2].mod_rev);
  lynx_etcd_kvs_free(&k);
  assert_int_equal(lynx_etcd_get(f->e, "/none", 0, &k, f->err, sizeof(f->err)),
                   0);
  assert_int_equal(k.n, 0);
  lynx_etcd_kvs_free(&k);
  assert_int_equal(lynx_etcd_del(f->e, "/t/b", 0, f->err, sizeof(f->err)), 0);
  assert_int_equal(lynx_etcd_get(f->e, "/t/", 1, &k, f->err, sizeof(f->err)),
                   0);
  assert_int_equal(k.n, 2);
  lynx_etcd_kvs_free(&k);
  assert_int_equal(lynx_etcd_del(f->e, "/t/", 1, f->err, sizeof(f->err)), 0);
  assert_int_equal(lynx_etcd_get(f->e, "/t", 1, &k, f->err, sizeof(f->err)), 0);
  assert_int_equal(k.n, 1); /* /t0 stays */
  assert_string_equal(k.kv[0].key, "/t0");
  lynx_etcd_kvs_free(&k);
}

/* A transaction's comparisons decide which branch runs, atomically: a
 * create-if-absent succeeds once, then fails; a compare on the mod
 * revision guards an update. */
static void test_txn(void **state) {
  struct fx *f = *state;
  struct lynx_etcd_cmp absent = {"/lock", LYNX_ETCD_CREATE, 0, 0, NULL};
  struct lynx_etcd_op mine = {LYNX_ETCD_PUT, "/lock", "me", 2, 0};
  struct lynx_etcd_op theirs = {LYNX_ETCD_PUT, "/other", "lost", 4, 0};
  struct lynx_etcd_kvs k;
  int ok = -1;
  int64_t rev = 0, mod;
  assert_int_equal(lynx_etcd_txn(f->e, &absent, 1, &mine, 1, &theirs, 1, &ok,
                                 &rev, f->err, sizeof(f->err)),
                   0);
  assert_int_equal(ok, 1);
  assert_true(rev > 0);
  mine.value = "you";
  mine.value_len = 3;
  assert_int_equal(lynx_etcd_txn(f->e, &absent, 1, &mine, 1, &theirs, 1, &ok,
                                 NULL, f->err, sizeof(f->err)),
                   0);
  assert_int_equal(ok, 0);
  assert_int_equal(lynx_etcd_get(f->e, "/lock", 0, &k, f->err, sizeof(f->err)),
                   0);
  assert_string_equal(k.kv[0].value, "me"); /* unchanged */
  mod = k.kv[0].mod_rev;
  lynx_etcd_kvs_free(&k);
  assert_int_equal(lynx_etcd_get(f->e, "/other", 0, &k, f->err, sizeof(f->err)),
                   0);
  assert_int_equal(k.n, 1); /* the failure branch ran */
  lynx_etcd_kvs_free(&k);
  {
    struct lynx_etcd_cmp at = {"/lock", LYNX_ETCD_MOD, 0, mod, NULL};
    struct lynx_etcd_cmp val = {"/lock", LYNX_ETCD_VALUE, 0, 0, "me"};
    struct lynx_etcd_cmp both[2] = {at, val};
    assert_int_equal(lynx_etcd_txn(f->e, both, 2, &mine, 1, NULL, 0, &ok, NULL,
                                   f->err, sizeof(f->err)),
                     0);
    assert_int_equal(ok, 1);
    /* the same guard again is stale now */
    assert_int_equal(lynx_etcd_txn(f->e, &at, 1, &mine, 1, NULL, 0, &ok, NULL,
                                   f->err, sizeof(f->err)),
                     0);
    assert_int_equal(ok, 0);
  }
}

/* A key put with a lease lives while the lease is kept alive and goes
 * when it is revoked; an expired or unknown lease keeps alive with 0. */
static void test_leases(void **state) {
  struct fx *f = *state;
  struct lynx_etcd_kvs k;
  int64_t id = 0, left = -1;
  assert_int_equal(lynx_etcd_lease_grant(f->e, 5, &id, f->err, sizeof(f->err)),
                   0);
  assert_true(id != 0);
  assert_int_equal(
      lynx_etcd_put(f->e, "/leader", "me", 2, id, f->err, sizeof(f->err)), 0);
  assert_int_equal(
      lynx_etcd_lease_keepalive(f->e, id, &left, f->err, sizeof(f->err)), 0);
  assert_true(left > 0 && left <= 5);
  assert_int_equal(
      lynx_etcd_get(f->e, "/leader", 0, &k, f->err, sizeof(f->err)), 0);
  assert_int_equal(k.n, 1);
  assert_true(k.kv[0].lease == id);
  lynx_etcd_kvs_free(&k);
  assert_int_equal(lynx_etcd_lease_revoke(f->e, id, f->err, sizeof(f->err)), 0);
  assert_int_equal(
      lynx_etcd_get(f->e, "/leader", 0, &k, f->err, sizeof(f->err)), 0);
  assert_int_equal(k.n, 0);
  lynx_etcd_kvs_free(&k);
  assert_int_equal(
      lynx_etcd_lease_keepalive(f->e, id, &left, f->err, sizeof(f->err)), 0);
  assert_int_equal(left, 0);
  /* a put on a lease that is gone is refused */
  assert_int_equal(
      lynx_etcd_put(f->e, "/leader", "me", 2, id, f->err, sizeof(f->err)),
      -ENOENT);
}

/* Endpoints: bad ones are refused at open; a dead first endpoint is passed
 * over for a live one (which later calls go to first); with none alive a
 * call fails within the timeout, saying why. */
static void test_endpoints(void **state) {
  struct fx *f = *state;
  struct lynx_etcd *e;
  struct lynx_etcd_kvs k;
  char eps[160];
  uint64_t t0;
  int rc;
  assert_int_equal(lynx_etcd_open(&e, "", 1000, f->err, sizeof(f->err)),
                   -EINVAL);
  assert_int_equal(
      lynx_etcd_open(&e, "127.0.0.1:2379", 1000, f->err, sizeof(f->err)),
      -EINVAL);
  assert_non_null(strstr(f->err, "http://"));
  assert_int_equal(lynx_etcd_open(&e, "https://127.0.0.1:2379", 1000, f->err,
                                  sizeof(f->err)),
                   -EINVAL);
  snprintf(eps, sizeof(eps), "http://127.0.0.1:%u, %s/", free_port(), f->url);
  assert_int_equal(lynx_etcd_open(&e, eps, 1000, f->err, sizeof(f->err)), 0);
  assert_string_equal(lynx_etcd_endpoint(e), "");
  put_ok(f, "/k", "v");
  assert_int_equal(lynx_etcd_get(e, "/k", 0, &k, f->err, sizeof(f->err)), 0);
  assert_int_equal(k.n, 1);
  lynx_etcd_kvs_free(&k);
  assert_string_equal(lynx_etcd_endpoint(e), f->url);
  lynx_etcd_close(e);

  snprintf(eps, sizeof(eps), "http://127.0.0.1:%u,http://127.0.0.1:%u",
           free_port(), free_port());
  assert_int_equal(lynx_etcd_open(&e, eps, 500, f->err, sizeof(f->err)), 0);
  t0 = lynx_now_ns();
  rc = lynx_etcd_get(e, "/k", 0, &k, f->err, sizeof(f->err));
  assert_true(rc == -ECONNREFUSED || rc == -EHOSTUNREACH || rc == -ETIMEDOUT);
  assert_true(lynx_now_ns() - t0 < ut_scaled(2000000000ull));
  assert_non_null(strstr(f->err, "127.0.0.1"));
  lynx_etcd_close(e);
}

/* ---- operator intent in etcd --------------------------------------------- */

static void reg_new(struct lynx_registry *r) {
  struct lynx_reg_ops ops = {NULL, NULL, NULL, NULL, NULL};
  lynx_reg_init(r, 3000, 10000, &ops);
}

static void add_svc(struct lynx_registry *r, const char *name, uint32_t port) {
  struct lynx_service_spec s = ut_spec(name, port, 0, NULL);
  struct lynx_reg_err e;
  assert_int_equal(lynx_reg_service_create(r, &s, 0, &e), 0);
}

/* r's state saved to etcd, as the coordinator's API does it (the state
 * built, then the save hook): 0 or -errno with f->err. */
static int save(struct fx *f, struct lynx_store_etcd *s,
                const struct lynx_registry *r) {
  struct json_object *state = lynx_store_state_obj(r, NULL);
  int rc;
  assert_non_null(state);
  rc = lynx_store_etcd_save_state(s, state, f->err, sizeof(f->err));
  json_object_put(state);
  return rc;
}

static int64_t mod_rev(struct fx *f, const char *key) {
  struct lynx_etcd_kvs k;
  int64_t m;
  assert_int_equal(lynx_etcd_get(f->e, key, 0, &k, f->err, sizeof(f->err)), 0);
  m = k.n ? k.kv[0].mod_rev : 0;
  lynx_etcd_kvs_free(&k);
  return m;
}

/* Services and drain intents saved, then loaded into a fresh registry:
 * the same services with the same specs, the same drained nodes; a save
 * writes only what changed (an untouched service's key keeps its
 * revision) and deletes what went. */
static void test_store_round_trip(void **state) {
  struct fx *f = *state;
  struct lynx_store_etcd s;
  struct lynx_registry r, back;
  struct lynx_reg_err e;
  int64_t keep;
  assert_int_equal(
      lynx_store_etcd_init(&s, f->e, "/lynx", f->err, sizeof(f->err)), 0);
  assert_string_equal(s.prefix, "/lynx/");
  reg_new(&r);
  /* nothing stored: an empty state */
  reg_new(&back);
  assert_int_equal(lynx_store_etcd_load(&s, &back, 0, f->err, sizeof(f->err)),
                   0);
  assert_null(back.services);
  lynx_reg_free(&back);

  add_svc(&r, "alpha", 9001);
  add_svc(&r, "beta", 9002);
  assert_int_equal(lynx_reg_drain_intent_add(&r, "node-7"), 0);
  assert_int_equal(save(f, &s, &r), 0);
  keep = mod_rev(f, "/lynx/services/alpha");
  assert_true(keep > 0);
  assert_true(mod_rev(f, "/lynx/drained/node-7") > 0);
  assert_true(mod_rev(f, "/lynx/version") > 0);

  assert_int_equal(lynx_reg_service_delete(&r, "beta", 0, &e), 0);
  add_svc(&r, "gamma", 9003);
  assert_int_equal(save(f, &s, &r), 0);
  assert_true(mod_rev(f, "/lynx/services/alpha") == keep);
  assert_true(mod_rev(f, "/lynx/services/beta") == 0);
  assert_true(mod_rev(f, "/lynx/services/gamma") > keep);

  reg_new(&back);
  assert_int_equal(lynx_store_etcd_load(&s, &back, 0, f->err, sizeof(f->err)),
                   0);
  assert_non_null(lynx_reg_service_find(&back, "alpha"));
  assert_null(lynx_reg_service_find(&back, "beta"));
  assert_non_null(lynx_reg_service_find(&back, "gamma"));
  assert_int_equal(lynx_reg_service_find(&back, "gamma")->spec.port, 9003);
  assert_non_null(back.drain_intents);
  assert_string_equal(back.drain_intents->id, "node-7");
  lynx_reg_free(&back);
  lynx_reg_free(&r);
}

/* What the coordinator refuses to start on rather than forget services: a
 * layout version it does not know, a value that is not a spec, a spec
 * stored under another name's key. Bad prefixes are refused. */
static void test_store_refuses(void **state) {
  struct fx *f = *state;
  struct lynx_store_etcd s;
  struct lynx_registry r;
  assert_int_equal(lynx_store_etcd_init(&s, f->e, "", f->err, sizeof(f->err)),
                   -EINVAL);
  assert_int_equal(
      lynx_store_etcd_init(&s, f->e, "/a b", f->err, sizeof(f->err)), -EINVAL);
  assert_int_equal(
      lynx_store_etcd_init(&s, f->e, "/p/", f->err, sizeof(f->err)), 0);
  put_ok(f, "/p/version", "2");
  reg_new(&r);
  assert_int_equal(lynx_store_etcd_load(&s, &r, 0, f->err, sizeof(f->err)),
                   -EINVAL);
  assert_non_null(strstr(f->err, "different release"));
  assert_int_equal(save(f, &s, &r), -EINVAL);
  put_ok(f, "/p/version", "1");
  put_ok(f, "/p/services/x", "{not json");
  assert_int_equal(lynx_store_etcd_load(&s, &r, 0, f->err, sizeof(f->err)),
                   -EINVAL);
  assert_non_null(strstr(f->err, "/p/services/x"));
  put_ok(f, "/p/services/x", "{\"name\": \"y\"}");
  assert_int_equal(lynx_store_etcd_load(&s, &r, 0, f->err, sizeof(f->err)),
                   -EINVAL);
  /* a spec the API would refuse (no port) is refused too, naming it */
  put_ok(f, "/p/services/x", "{\"name\": \"x\", \"app\": \"echo\"}");
  assert_int_equal(lynx_store_etcd_load(&s, &r, 0, f->err, sizeof(f->err)),
                   -EINVAL);
  assert_null(r.services);
  lynx_reg_free(&r);
}

/* etcd gone: a save fails with a transport error (the API answers 503),
 * fast, and works again once etcd is back (a new server on the same data
 * directory keeps what was saved). */
static void test_store_etcd_down(void **state) {
  struct fx *f = *state;
  struct lynx_store_etcd s;
  struct lynx_registry r;
  uint64_t t0;
  int rc;
  assert_int_equal(
      lynx_store_etcd_init(&s, f->e, "/lynx/", f->err, sizeof(f->err)), 0);
  reg_new(&r);
  add_svc(&r, "alpha", 9001);
  assert_int_equal(save(f, &s, &r), 0);
  kill(f->pid, SIGSTOP); /* alive but not answering: a timeout */
  add_svc(&r, "beta", 9002);
  t0 = lynx_now_ns();
  rc = save(f, &s, &r);
  assert_int_equal(rc, -ETIMEDOUT);
  assert_true(lynx_now_ns() - t0 < ut_scaled(3000000000ull));
  kill(f->pid, SIGCONT);
  assert_int_equal(save(f, &s, &r), 0);
  assert_true(mod_rev(f, "/lynx/services/beta") > 0);
  lynx_reg_free(&r);
}

/* A fenced save (elect.c's leader) writes only while the fence key is the
 * one it names (its create revision); once another holds it, the save
 * fails -ECANCELED and writes nothing. */
static void test_store_fenced(void **state) {
  struct fx *f = *state;
  struct lynx_store_etcd s;
  struct lynx_registry r;
  struct lynx_etcd_kvs k;
  int64_t rev;
  assert_int_equal(
      lynx_store_etcd_init(&s, f->e, "/lynx/", f->err, sizeof(f->err)), 0);
  put_ok(f, "/lynx/leader", "me");
  assert_int_equal(
      lynx_etcd_get(f->e, "/lynx/leader", 0, &k, f->err, sizeof(f->err)), 0);
  rev = k.kv[0].create_rev;
  lynx_etcd_kvs_free(&k);
  s.fence_key = "/lynx/leader";
  s.fence_rev = rev;
  reg_new(&r);
  add_svc(&r, "alpha", 9001);
  assert_int_equal(save(f, &s, &r), 0);
  assert_true(mod_rev(f, "/lynx/services/alpha") > 0);
  /* another leader: the key deleted and created again */
  assert_int_equal(
      lynx_etcd_del(f->e, "/lynx/leader", 0, f->err, sizeof(f->err)), 0);
  put_ok(f, "/lynx/leader", "other");
  add_svc(&r, "beta", 9002);
  assert_int_equal(save(f, &s, &r), -ECANCELED);
  assert_non_null(strstr(f->err, "no longer leads"));
  assert_true(mod_rev(f, "/lynx/services/beta") == 0);
  /* the lead over (elect.c clears the revision on stepping down): no
   * save goes through unfenced, whatever the key holds now */
  s.fence_rev = 0;
  f->err[0] = '\0';
  assert_int_equal(save(f, &s, &r), -ECANCELED);
  assert_non_null(strstr(f->err, "no longer leads"));
  assert_true(mod_rev(f, "/lynx/services/beta") == 0);
  lynx_reg_free(&r);
}

/* Epochs from etcd: revisions, so strictly increasing whoever issues
 * them (two coordinators' stores here) and across restarts; a load gives
 * the newest frontend epoch; a fenced issue fails once another leads, and
 * an unfenced one once this store's lead is over. */
static void test_store_epochs(void **state) {
  struct fx *f = *state;
  struct lynx_store_etcd s1, s2;
  struct lynx_registry back;
  uint64_t a, b, fe, c;
  assert_int_equal(
      lynx_store_etcd_init(&s1, f->e, "/lynx/", f->err, sizeof(f->err)), 0);
  s2 = s1;
  assert_int_equal(
      lynx_store_etcd_put_epoch(&s1, 0, &a, f->err, sizeof(f->err)), 0);
  assert_int_equal(
      lynx_store_etcd_put_epoch(&s2, 0, &b, f->err, sizeof(f->err)), 0);
  assert_true(b > a && a > 0);
  assert_int_equal(
      lynx_store_etcd_put_epoch(&s1, 1, &fe, f->err, sizeof(f->err)), 0);
  assert_true(fe > b && (uint64_t)mod_rev(f, "/lynx/epochs/frontend") == fe);
  reg_new(&back);
  assert_int_equal(lynx_store_etcd_load(&s2, &back, 0, f->err, sizeof(f->err)),
                   0);
  assert_true(back.frontend_epoch == fe);
  lynx_reg_free(&back);
  /* fenced by a leader key another coordinator now holds */
  put_ok(f, "/lynx/leader", "me");
  s1.fence_key = "/lynx/leader";
  s1.fence_rev = mod_rev(f, "/lynx/leader");
  assert_int_equal(
      lynx_store_etcd_put_epoch(&s1, 0, &c, f->err, sizeof(f->err)), 0);
  assert_true(c > fe);
  assert_int_equal(
      lynx_etcd_del(f->e, "/lynx/leader", 0, f->err, sizeof(f->err)), 0);
  put_ok(f, "/lynx/leader", "other");
  assert_int_equal(
      lynx_store_etcd_put_epoch(&s1, 1, &c, f->err, sizeof(f->err)),
      -ECANCELED);
  /* nothing issued: the newest frontend epoch is still fe */
  assert_true((uint64_t)mod_rev(f, "/lynx/epochs/frontend") == fe);
  /* the lead over (a step-down clears the revision): nothing unfenced */
  s1.fence_rev = 0;
  assert_int_equal(
      lynx_store_etcd_put_epoch(&s1, 0, &c, f->err, sizeof(f->err)),
      -ECANCELED);
}

/* A second client puts a key after a while (the watch's peer). */
struct later_put {
  const char *url, *key;
  unsigned delay_ms;
};

static void *put_later(void *arg) {
  const struct later_put *lp = arg;
  struct lynx_etcd *e;
  char err[256];
  usleep(lp->delay_ms * 1000u);
  if (lynx_etcd_open(&e, lp->url, 1000, err, sizeof(err)) == 0) {
    lynx_etcd_put(e, lp->key, "x", 1, 0, err, sizeof(err));
    lynx_etcd_close(e);
  }
  return NULL;
}

/* A watch (a follower's wait, elect.c) ends as soon as a key under its
 * prefix changes, not at its timeout; with nothing changing it waits the
 * timeout and says 0; a change since the given revision (made before the
 * watch began) is reported at once; a change outside the prefix is not;
 * the stop flag ends it early; a dead endpoint is an error, fast. */
static void test_watch(void **state) {
  struct fx *f = *state;
  struct lynx_etcd_kvs k;
  struct later_put lp = {f->url, "/w/leader", 300};
  pthread_t t;
  uint64_t t0, ms;
  int64_t rev;
  int stop = 0;
  struct lynx_etcd *dead;
  char url[64];
  put_ok(f, "/w/leader", "a");
  assert_int_equal(lynx_etcd_get(f->e, "/w/", 1, &k, f->err, sizeof(f->err)),
                   0);
  rev = k.revision;
  lynx_etcd_kvs_free(&k);

  t0 = lynx_now_ns();
  assert_int_equal(lynx_etcd_watch(f->e, "/w/", 1, rev + 1, 400, &stop, f->err,
                                   sizeof(f->err)),
                   0);
  ms = (lynx_now_ns() - t0) / 1000000u;
  assert_true(ms >= 350 && ms < ut_scaled(2000));

  put_ok(f, "/x/outside", "b");
  assert_int_equal(lynx_etcd_watch(f->e, "/w/", 1, rev + 1, 300, NULL, f->err,
                                   sizeof(f->err)),
                   0);

  assert_int_equal(pthread_create(&t, NULL, put_later, &lp), 0);
  t0 = lynx_now_ns();
  assert_int_equal(lynx_etcd_watch(f->e, "/w/", 1, rev + 1, 5000, &stop, f->err,
                                   sizeof(f->err)),
                   1);
  ms = (lynx_now_ns() - t0) / 1000000u;
  pthread_join(t, NULL);
  assert_true(ms >= 250 && ms < ut_scaled(3000));

  /* the put is in the past now: reported at once */
  t0 = lynx_now_ns();
  assert_int_equal(lynx_etcd_watch(f->e, "/w/", 1, rev + 1, 5000, NULL, f->err,
                                   sizeof(f->err)),
                   1);
  assert_true((lynx_now_ns() - t0) / 1000000u < ut_scaled(1000));

  /* stopping */
  stop = 1;
  t0 = lynx_now_ns();
  assert_int_equal(
      lynx_etcd_watch(f->e, "/w/", 1, 0, 10000, &stop, f->err, sizeof(f->err)),
      0);
  assert_true((lynx_now_ns() - t0) / 1000000u < ut_scaled(3000));

  snprintf(url, sizeof(url), "http://127.0.0.1:%u", free_port());
  assert_int_equal(lynx_etcd_open(&dead, url, 1000, f->err, sizeof(f->err)), 0);
  assert_true(lynx_etcd_watch(dead, "/w/", 1, 0, 1000, NULL, f->err,
                              sizeof(f->err)) < 0);
  assert_non_null(strstr(f->err, "watch"));
  lynx_etcd_close(dead);
}

static int g_argc;
static char **g_argv;

int main(int argc, char **argv) {
#define T(fn) cmocka_unit_test_setup_teardown(fn, fx_setup, fx_teardown)
  const struct CMUnitTest tests[] = {
      T(test_put_get_delete),   T(test_txn),
      T(test_leases),           T(test_endpoints),
      T(test_store_round_trip), T(test_store_refuses),
      T(test_store_etcd_down),  T(test_store_fenced),
      T(test_store_epochs),     T(test_watch),
  };
#undef T
  int rc;
  g_argc = argc;
  g_argv = argv;
  curl_global_init(CURL_GLOBAL_DEFAULT);
  rc = LYNX_UT_MAIN(g_argc, g_argv, "etcd", tests, NULL, NULL);
  curl_global_cleanup();
  return rc;
}
