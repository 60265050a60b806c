/*
 * test_app_registry.c - unit tests of accel/app_registry.c: the built-in
 * applications through the plug-in ABI, a plug-in loaded and run (the
 * kv-lookup example, configured per service), and every plug-in the agent
 * must refuse, each with its reason (docs/writing-apps.md).
 */
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "apps.h"
#include "ut_main.h"
#include "ut_ring.h"

#define Z 256u
#define S 4u

#if defined(__x86_64__)
#define HOST_EM EM_X86_64
#else
#define HOST_EM EM_AARCH64
#endif

static char tmpdir[256];

static int setup(void **state) {
  (void)state;
  snprintf(tmpdir, sizeof(tmpdir), "/tmp/lynx-ut-apps-XXXXXX");
  return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
  char cmd[300];
  (void)state;
  lynx_apps_unload();
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
  return system(cmd) == 0 ? 0 : -1;
}

/* The reason the last refusal of name was kept with, or NULL. */
static const char *refusal(const char *name) {
  const char *n, *r, *found = NULL;
  for (size_t i = 0; lynx_app_refused_at(i, &n, &r); i++)
    if (!strcmp(n, name))
      found = r;
  return found;
}

/* Writes len bytes of data into tmpdir/name; its path in out. */
static void put_file(const char *name, const void *data, size_t len, char *out,
                     size_t outlen) {
  FILE *f;
  snprintf(out, outlen, "%s/%s", tmpdir, name);
  f = fopen(out, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, len, f), len);
  assert_int_equal(fclose(f), 0);
}

/* A copy of the plug-in at src, with its ELF machine set to machine. */
static void copy_as_machine(const char *src, const char *name, uint16_t machine,
                            char *out, size_t outlen) {
  static uint8_t buf[4 << 20];
  FILE *f = fopen(src, "rb");
  size_t n;
  assert_non_null(f);
  n = fread(buf, 1, sizeof(buf), f);
  fclose(f);
  assert_true(n > sizeof(Elf64_Ehdr) && n < sizeof(buf));
  memcpy(buf + offsetof(Elf64_Ehdr, e_machine), &machine, sizeof(machine));
  put_file(name, buf, n, out, outlen);
}

static void test_builtins(void **state) {
  static const char *const names[] = {
      "echo",        "sockperf-echo", "sockperf-fault", "mc-get",
      "face-verify", "relay",         "lenet"};
  const struct lynx_app *a;
  size_t n = 0;
  (void)state;
  for (; (a = lynx_app_at(n)); n++) {
    assert_string_equal(a->name, names[n]);
    assert_string_equal(a->origin, "built in");
    assert_null(a->dl);
    /* the same definition a plug-in exports */
    assert_int_equal(a->def->abi_version, LYNX_APP_ABI_VERSION);
    assert_int_equal(a->def->size, sizeof(struct lynx_app_def));
    assert_non_null(a->def->handle);
    assert_true(lynx_app_name_ok(a->name));
  }
  assert_int_equal(n, sizeof(names) / sizeof(names[0]));
  assert_string_equal(lynx_app_find("mc-get")->needs_backend, "db");
  assert_null(lynx_app_find("echo")->needs_backend);
  assert_string_equal(lynx_app_names(), "echo, sockperf-echo, sockperf-fault, "
                                        "mc-get, face-verify, relay, lenet");
  /* relay has no kernel */
  assert_null(strstr(lynx_app_cuda_names(), "relay"));
  assert_non_null(strstr(lynx_app_cuda_names(), "lenet"));
}

static void test_name_rules(void **state) {
  (void)state;
  assert_true(lynx_app_name_ok("kv-lookup"));
  assert_true(lynx_app_name_ok("a.b_c-9"));
  assert_true(lynx_app_name_ok("9lives"));
  assert_false(lynx_app_name_ok(""));
  assert_false(lynx_app_name_ok(NULL));
  assert_false(lynx_app_name_ok("-x"));
  assert_false(lynx_app_name_ok("Upper"));
  assert_false(lynx_app_name_ok("a b"));
  assert_false(lynx_app_name_ok("a/b"));
  assert_false(lynx_app_name_ok("0123456789012345678901234567890x")); /* 32 */
  assert_true(lynx_app_name_ok("0123456789012345678901234567890"));   /* 31 */
}

/* One request through app's instance (config) as the CPU backend runs it:
 * its answer, or "" with *replied 0. */
static void ask(const struct lynx_app *app, struct lynx_app_env *env,
                struct ut_region *r, struct lynx_mq *mq, uint32_t *pos,
                const char *req, char *ans, size_t anslen, int *replied) {
  struct lynx_msg m;
  struct lynx_slot_meta tm = {0};
  const uint8_t *data = NULL;
  ut_put(r, 0, *pos, 7, req, (uint32_t)strlen(req));
  assert_int_equal(lynx_mq_recv(mq, &m), 0);
  *replied = -1;
  assert_int_equal(lynx_app_handle(app, mq, &m, replied, &env->ctx), 0);
  lynx_release(mq);
  ans[0] = 0;
  if (*replied) {
    assert_int_equal(ut_get_tx(r, 0, *pos, &tm, &data), 0);
    assert_int_equal(tm.tag, 7);
    assert_true(tm.len < anslen);
    memcpy(ans, data, tm.len);
    ans[tm.len] = 0;
  }
  (*pos)++;
  ut_fctrl(r, 0)->tx_cons = *pos;
}

static void test_load_and_run(void **state) {
  const char *cfg = "{\"entries\": {\"apple\": \"red\", \"kiwi\": \"green\", "
                    "\"apple\": \"crimson\"}, \"miss\": \"NOT_FOUND\"}";
  const char *bn[] = {"db"};
  const struct lynx_app *a;
  struct lynx_app_env env;
  struct ut_region r;
  struct lynx_mq mq;
  volatile int stop = 0;
  void *st = NULL;
  char why[512], ans[64];
  uint32_t pos = 0;
  int replied;
  (void)state;
  assert_int_equal(lynx_app_load("kv-lookup", KV_SO, why, sizeof(why)), 0);
  a = lynx_app_find("kv-lookup");
  assert_non_null(a);
  assert_string_equal(a->origin, KV_SO);
  assert_non_null(a->dl);
  assert_int_equal(a->cuda_app, LYNX_CUDA_APP_NONE);
  assert_non_null(strstr(lynx_app_names(), ", lenet, kv-lookup"));
  /* after the built-ins: what the agent registers */
  assert_ptr_equal(lynx_app_at(7), a);
  assert_null(lynx_app_at(8));

  /* a configuration the app refuses: the reason, under its name */
  assert_int_equal(lynx_app_start(a, "svc", "{\"colour\": 1}", 1, 240, 240, bn,
                                  1, &st, why, sizeof(why)),
                   -EINVAL);
  assert_null(st);
  assert_non_null(strstr(why, "kv-lookup: configuration: 'colour'"));
  /* none at all, and no default: "{}", an empty table */
  assert_int_equal(
      lynx_app_start(a, "svc", NULL, 1, 240, 240, NULL, 0, &st, why, 512),
      -EINVAL);
  assert_non_null(strstr(why, "the table is empty"));
  /* the agent's default, and a service's own that replaces it whole */
  assert_int_equal(lynx_app_set_default("kv-lookup",
                                        "{\"entries\": {\"d\": "
                                        "\"default\"}}",
                                        why, sizeof(why)),
                   0);
  assert_int_equal(
      lynx_app_start(a, "svc", "", 1, 240, 240, NULL, 0, &st, why, sizeof(why)),
      0);
  assert_non_null(st);
  assert_int_equal(ut_region_init(&r, 1, S, Z), 0);
  lynx_mq_bind(&mq, r.mem, &r.g, 0);
  lynx_app_env_init(&env, a, NULL, 0, st, &stop, 1000000);
  ask(a, &env, &r, &mq, &pos, "d\n", ans, sizeof(ans), &replied);
  assert_int_equal(replied, 1);
  assert_string_equal(ans, "default");
  lynx_app_stop(a, st);

  assert_int_equal(
      lynx_app_start(a, "svc", cfg, 1, 240, 240, bn, 1, &st, why, sizeof(why)),
      0);
  lynx_app_env_init(&env, a, NULL, 0, st, &stop, 1000000);
  ask(a, &env, &r, &mq, &pos, "kiwi", ans, sizeof(ans), &replied);
  assert_string_equal(ans, "green");
  /* of a key given twice, the later pair */
  ask(a, &env, &r, &mq, &pos, "apple\r\n", ans, sizeof(ans), &replied);
  assert_string_equal(ans, "crimson");
  ask(a, &env, &r, &mq, &pos, "pear", ans, sizeof(ans), &replied);
  assert_int_equal(replied, 1);
  assert_string_equal(ans, "NOT_FOUND");
  ask(a, &env, &r, &mq, &pos, "d", ans, sizeof(ans), &replied);
  assert_string_equal(ans, "NOT_FOUND"); /* the default is not merged */
  lynx_app_stop(a, st);
  /* a value no answer of the service holds is refused at start */
  assert_int_equal(lynx_app_start(a, "svc",
                                  "{\"entries\": {\"k\": \"toolong\"}}", 1, 240,
                                  4, NULL, 0, &st, why, sizeof(why)),
                   -EMSGSIZE);
  assert_non_null(strstr(why, "its msg_max"));
  ut_region_free(&r);

  /* the same name again: refused, the first stays */
  assert_int_equal(lynx_app_load(NULL, KV_SO, why, sizeof(why)), -EEXIST);
  assert_non_null(strstr(why, "already loaded from " KV_SO));
  assert_ptr_equal(lynx_app_find("kv-lookup"), a);
}

static void test_refusals(void **state) {
  static const uint8_t fatbin[16] = {0x50, 0xed, 0x55, 0xba, 1, 0, 0x10, 0};
  char why[512], path[512];
  size_t n_before;
  const char *n, *r;
  (void)state;
  /* ABI version */
  assert_int_equal(lynx_app_load(NULL, BAD_ABI_SO, why, sizeof(why)), -EPROTO);
  assert_non_null(strstr(why, "built for plug-in ABI version 2; this agent "
                              "runs version 1"));
  assert_non_null(refusal("future-abi")); /* under its definition's name */
  assert_ptr_equal(lynx_app_refusal("future-abi"), refusal("future-abi"));
  assert_null(lynx_app_refusal("kv-lookup"));
  /* no entry */
  assert_int_equal(lynx_app_load(NULL, NO_ENTRY_SO, why, sizeof(why)), -ENOENT);
  assert_non_null(strstr(why, "no lynx_app_entry: not a Lynx plug-in"));
  assert_non_null(refusal("plugin-no-entry")); /* under the file's name */
  /* a built-in's name */
  assert_int_equal(lynx_app_load(NULL, CLASH_SO, why, sizeof(why)), -EEXIST);
  assert_non_null(strstr(why, "'echo' is the name of a built-in application"));
  assert_string_equal(lynx_app_find("echo")->origin, "built in");
  /* another architecture */
  copy_as_machine(KV_SO, "libkv-arm.so",
                  EM_AARCH64 == HOST_EM ? EM_X86_64 : EM_AARCH64, path,
                  sizeof(path));
  assert_int_equal(lynx_app_load(NULL, path, why, sizeof(why)), -ENOEXEC);
  assert_non_null(strstr(why, EM_AARCH64 == HOST_EM
                                  ? "a shared object for x86-64; this agent "
                                    "runs on aarch64"
                                  : "a shared object for aarch64; this agent "
                                    "runs on x86-64"));
  assert_non_null(refusal("kv-arm"));
  copy_as_machine(KV_SO, "odd.so", 0x7777, path, sizeof(path));
  assert_int_equal(lynx_app_load(NULL, path, why, sizeof(why)), -ENOEXEC);
  assert_non_null(strstr(why, "ELF machine 30583"));
  /* not a shared object at all */
  put_file("text.so", "hello\n", 6, path, sizeof(path));
  assert_int_equal(lynx_app_load(NULL, path, why, sizeof(why)), -ENOEXEC);
  assert_non_null(strstr(why, "not an ELF file"));
  put_file("kernel.fatbin", fatbin, sizeof(fatbin), path, sizeof(path));
  assert_int_equal(lynx_app_load("gpu-app", path, why, sizeof(why)), -ENOEXEC);
  assert_non_null(strstr(why, "a CUDA fatbin"));
  assert_non_null(refusal("gpu-app")); /* under the operator's name */
  /* missing; a name that is not one; one the file does not define */
  assert_int_equal(lynx_app_load(NULL, "/nonexistent/x.so", why, sizeof(why)),
                   -ENOENT);
  assert_non_null(strstr(why, "cannot open it: No such file"));
  assert_int_equal(lynx_app_load("Bad Name", KV_SO, why, sizeof(why)), -EINVAL);
  assert_non_null(strstr(why, "'Bad Name' is not an application name"));
  assert_int_equal(lynx_app_load("other", KV_SO, why, sizeof(why)), -EINVAL);
  assert_non_null(strstr(why, "it defines application 'kv-lookup', not "
                              "'other'"));
  /* nothing refused was added */
  assert_null(lynx_app_find("future-abi"));
  assert_null(lynx_app_find("other"));
  assert_null(lynx_app_find("kv-lookup"));
  assert_null(lynx_app_at(7));
  /* and every refusal is kept, in order */
  n_before = 0;
  while (lynx_app_refused_at(n_before, &n, &r))
    n_before++;
  assert_int_equal(n_before, 10);
  assert_true(lynx_app_refused_at(0, &n, &r));
  assert_string_equal(n, "future-abi");
}

static void test_load_dir(void **state) {
  char why[512], path[512], dir[300], cmd[1200];
  (void)state;
  snprintf(dir, sizeof(dir), "%s/apps", tmpdir);
  assert_int_equal(mkdir(dir, 0755), 0);
  snprintf(cmd, sizeof(cmd), "cp '%s' '%s/b-kv.so' && cp '%s' '%s/a-clash.so'",
           KV_SO, dir, CLASH_SO, dir);
  assert_int_equal(system(cmd), 0);
  snprintf(path, sizeof(path), "%s/README", dir); /* not *.so: not looked at */
  put_file("apps/README", "x", 1, path, sizeof(path));
  assert_int_equal(lynx_app_load_dir(dir, NULL, NULL, why, sizeof(why)), 1);
  assert_non_null(lynx_app_find("kv-lookup"));
  assert_non_null(refusal("echo"));
  assert_int_equal(
      lynx_app_load_dir("/nonexistent-dir", NULL, NULL, why, sizeof(why)),
      -ENOENT);
  assert_non_null(strstr(why, "--app-dir /nonexistent-dir"));
}

static void test_defaults_and_lenet(void **state) {
  const struct lynx_app *lenet = lynx_app_find("lenet");
  char why[512];
  void *st = NULL;
  (void)state;
  assert_int_equal(lynx_app_set_default("nope", "{}", why, sizeof(why)),
                   -ENOENT);
  assert_int_equal(lynx_app_set_default("lenet", "[1]", why, sizeof(why)),
                   -EINVAL);
  assert_non_null(strstr(why, "not a JSON object"));
  /* no weights anywhere: the reason says where they come from */
  assert_int_equal(lynx_app_start(lenet, "svc", NULL, 1, 2032, 2032, NULL, 0,
                                  &st, why, sizeof(why)),
                   -ENOENT);
  assert_non_null(strstr(why, "lenet: no weights file"));
  assert_int_equal(lynx_app_start(lenet, "svc", "{\"model\": \"/nonexistent\"}",
                                  1, 2032, 2032, NULL, 0, &st, why,
                                  sizeof(why)),
                   -ENOENT);
  assert_non_null(strstr(why, "lenet: cannot load its weights"));
  assert_int_equal(lynx_app_start(lenet, "svc", "{\"weights\": \"x\"}", 1, 2032,
                                  2032, NULL, 0, &st, why, sizeof(why)),
                   -EINVAL);
  assert_non_null(strstr(why, "unknown key 'weights'"));
  /* the agent's default (--lenet-model), then a service's own */
  assert_int_equal(lynx_app_set_default("lenet",
                                        "{\"model\": \"" LENET_TEST_MODEL "\"}",
                                        why, sizeof(why)),
                   0);
  assert_int_equal(lynx_app_start(lenet, "svc", NULL, 1, 2032, 2032, NULL, 0,
                                  &st, why, sizeof(why)),
                   0);
  assert_non_null(st);
  lynx_app_stop(lenet, st);
  assert_int_equal(lynx_app_start(lenet, "svc", "{\"model\": \"/nonexistent\"}",
                                  1, 2032, 2032, NULL, 0, &st, why,
                                  sizeof(why)),
                   -ENOENT);
}

/* A back end the service does not give: -ENOENT, never a crash. */
static void test_call_unknown_backend(void **state) {
  struct lynx_app_env env;
  volatile int stop = 0;
  uint8_t reply[8];
  uint32_t len = 0;
  (void)state;
  lynx_app_env_init(&env, lynx_app_find("mc-get"), NULL, 0, NULL, &stop, 1000);
  assert_int_equal(
      lynx_app_call(&env.ctx, "db", "get x\r\n", 7, reply, sizeof(reply), &len),
      -ENOENT);
  assert_int_equal(
      lynx_app_call(&env.ctx, NULL, "x", 1, reply, sizeof(reply), &len),
      -ENOENT);
  assert_string_equal(env.ctx.app, "mc-get");
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_builtins),
      cmocka_unit_test(test_name_rules),
      cmocka_unit_test(test_load_and_run),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_load_dir),
      cmocka_unit_test(test_defaults_and_lenet),
      cmocka_unit_test(test_call_unknown_backend),
  };
  return LYNX_UT_MAIN(argc, argv, "app_registry", tests, setup, teardown);
}
