/* test_regjson.c - unit tests of coordinator/regjson.c (service spec
 * decoding, API object shapes) and coordinator/store.c (state directory
 * round trip, refusal of corrupt files). */
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

#include <json-c/json.h>

#include "registry.h"
#include "regjson.h"
#include "store.h"
#include "ut_main.h"

/* ---- helpers -------------------------------------------------------- */

static int decode(const char *text, struct lynx_service_spec *out,
                  struct lynx_reg_err *err) {
  struct json_object *j = json_tokener_parse(text);
  int rc;
  if (!j)
    fail_msg("test input does not parse: %s", text);
  memset(err, 0, sizeof(*err));
  rc = lynx_json_service_spec(j, out, err);
  json_object_put(j);
  return rc;
}

static struct json_object *get(struct json_object *o, const char *key) {
  struct json_object *v = NULL;
  if (!json_object_object_get_ex(o, key, &v))
    fail_msg("no field %s in %s", key, json_object_to_json_string(o));
  return v;
}

static const char *get_str(struct json_object *o, const char *key) {
  struct json_object *v = get(o, key);
  assert_true(json_object_is_type(v, json_type_string));
  return json_object_get_string(v);
}

static uint64_t get_u64(struct json_object *o, const char *key) {
  struct json_object *v = get(o, key);
  assert_true(json_object_is_type(v, json_type_int));
  return json_object_get_uint64(v);
}

static int n_keys(struct json_object *o) {
  return json_object_object_length(o);
}

static void reg_node(struct lynx_registry *r, const char *id, uint64_t epoch,
                     uint32_t n_accels, const char *labels, uint64_t now) {
  struct lynx_accel_info acc[4];
  struct lynx_label lab[LYNX_LABELS_MAX];
  struct lynx_reg_err err;
  uint32_t n_lab = 0, a;
  memset(acc, 0, sizeof(acc));
  for (a = 0; a < n_accels; a++) {
    acc[a].idx = a;
    snprintf(acc[a].kind, sizeof(acc[a].kind), "cpu");
    snprintf(acc[a].model, sizeof(acc[a].model), "emulated");
    acc[a].memory_bytes = 4096;
    acc[a].ordering = a % 2;
  }
  assert_int_equal(lynx_labels_parse(labels, lab, LYNX_LABELS_MAX, &n_lab), 0);
  assert_int_equal(lynx_reg_register(r, id, "127.0.0.1:7701", epoch, lab, n_lab,
                                     acc, n_accels, NULL, now, &err),
                   0);
}

static void create(struct lynx_registry *r, const char *json) {
  struct lynx_service_spec s;
  struct lynx_reg_err err;
  if (decode(json, &s, &err))
    fail_msg("%s: %s", json, err.message);
  assert_int_equal(lynx_reg_service_create(r, &s, 0, &err), 0);
}

static void ready_all(struct lynx_registry *r) {
  struct lynx_reg_instance *i;
  for (i = r->instances; i; i = i->next) {
    struct lynx_region_desc d;
    memset(&d, 0, sizeof(d));
    snprintf(d.transport, sizeof(d.transport), "shm");
    snprintf(d.locator, sizeof(d.locator), "/lynx-%llu",
             (unsigned long long)i->id);
    d.n_mqueues = i->svc->spec.mqueues_per_accel;
    d.slots = i->svc->spec.slots;
    d.slot_size = i->svc->spec.slot_size;
    assert_int_equal(
        lynx_reg_instance_ready(r, i->node->id, i->node->epoch, i->id, &d, 0),
        0);
  }
}

/* ---- decoding ------------------------------------------------------- */

static void test_decode_defaults(void **state) {
  struct lynx_service_spec s;
  struct lynx_reg_err err;
  (void)state;
  assert_int_equal(
      decode("{\"name\": \"echo\", \"port\": 7000, \"app\": \"echo\"}", &s,
             &err),
      0);
  assert_string_equal(s.name, "echo");
  assert_string_equal(s.proto, "udp");
  assert_int_equal(s.port, 7000);
  assert_string_equal(s.app, "echo");
  assert_int_equal(s.slot_size, 2048);
  assert_int_equal(s.slots, 256);
  assert_int_equal(s.mqueues_per_accel, 4);
  assert_int_equal(s.work_us, 0);
  assert_int_equal(s.placement, LYNX_PLACE_ALL);
  assert_int_equal(s.n_selector, 0);
  /* msg_max: any datagram by default; a tcp service's len32 frame up to
   * 1 MiB, a fixed frame's size; or what the operator says, up to 32 MiB */
  assert_int_equal(s.msg_max, 65507);
  assert_int_equal(decode("{\"name\": \"t\", \"port\": 7000, \"app\": "
                          "\"echo\", \"proto\": \"tcp\"}",
                          &s, &err),
                   0);
  assert_int_equal(s.msg_max, 1048576);
  assert_int_equal(decode("{\"name\": \"t\", \"port\": 7000, \"app\": "
                          "\"echo\", \"proto\": \"tcp\", \"framing\": "
                          "{\"fixed\": 100}}",
                          &s, &err),
                   0);
  assert_int_equal(s.msg_max, 100);
  assert_int_equal(decode("{\"name\": \"t\", \"port\": 7000, \"app\": "
                          "\"echo\", \"msg_max\": 200000}",
                          &s, &err),
                   0);
  assert_int_equal(s.msg_max, 200000);
  assert_int_not_equal(decode("{\"name\": \"t\", \"port\": 7000, "
                              "\"app\": \"echo\", \"msg_max\": "
                              "33554433}",
                              &s, &err),
                       0);
  assert_non_null(strstr(err.message, "msg_max"));
  assert_int_equal(decode("{\"name\": \"t\", \"port\": 7000, \"app\": "
                          "\"echo\", \"msg_max\": 0}",
                          &s, &err),
                   0);
  assert_int_equal(s.msg_max, 65507); /* 0: the protocol's */
  assert_int_equal(
      decode("{\"name\": \"echo\", \"port\": 7000, \"app\": \"echo\"}", &s,
             &err),
      0);

  assert_int_equal(
      decode("{\"name\": \"e-1.x_y\", \"proto\": \"udp\", \"port\": 65535, "
             "\"app\": \"sockperf-echo\", \"slot_size\": 64, \"slots\": "
             "65536, \"mqueues_per_accel\": 1024, \"work_us\": 25, "
             "\"placement\": {\"replicas\": 3, \"selector\": {\"gpu\": "
             "\"a100\", \"zone\": \"eu\"}}}",
             &s, &err),
      0);
  assert_int_equal(s.port, 65535);
  assert_int_equal(s.slot_size, 64);
  assert_int_equal(s.slots, 65536);
  assert_int_equal(s.mqueues_per_accel, 1024);
  assert_int_equal(s.work_us, 25);
  assert_int_equal(s.placement, LYNX_PLACE_REPLICAS);
  assert_int_equal(s.replicas, 3);
  assert_int_equal(s.n_selector, 2);
  assert_string_equal(s.selector[0].key, "gpu");
  assert_string_equal(s.selector[0].value, "a100");
  assert_string_equal(s.selector[1].key, "zone");

  assert_int_equal(decode("{\"name\": \"a\", \"port\": 1, \"app\": \"x\", "
                          "\"placement\": \"all\"}",
                          &s, &err),
                   0);
  assert_int_equal(s.placement, LYNX_PLACE_ALL);
  /* a selector alone: every accelerator of every matching node */
  assert_int_equal(decode("{\"name\": \"a\", \"port\": 1, \"app\": \"x\", "
                          "\"placement\": {\"selector\": {\"gpu\": \"t4\"}}}",
                          &s, &err),
                   0);
  assert_int_equal(s.placement, LYNX_PLACE_ALL);
  assert_int_equal(s.n_selector, 1);
}

struct bad_case {
  const char *json;
  const char *msg; /* expected message prefix */
};

#define SVC(extra)                                                             \
  "{\"name\": \"s\", \"port\": 7000, \"app\": \"echo\"" extra "}"

static void test_decode_bad(void **state) {
  static const struct bad_case cases[] = {
      {"[]", "service: must be a JSON object"},
      {"\"echo\"", "service:"},
      {"{\"port\": 7000, \"app\": \"echo\"}", "name: required"},
      {"{\"name\": \"s\", \"app\": \"echo\"}", "port: required"},
      {"{\"name\": \"s\", \"port\": 7000}", "app: required"},
      {"{\"name\": 5, \"port\": 7000, \"app\": \"echo\"}",
       "name: must be a string"},
      {"{\"name\": null, \"port\": 7000, \"app\": \"echo\"}",
       "name: must be a string"},
      {"{\"name\": \"\", \"port\": 7000, \"app\": \"echo\"}", "name:"},
      {"{\"name\": \"a b\", \"port\": 7000, \"app\": \"echo\"}", "name:"},
      {"{\"name\": \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
       "xxxxxxxxxx\", \"port\": 7000, \"app\": \"echo\"}",
       "name: longer than 63"},
      {"{\"name\": \"s\", \"port\": \"7000\", \"app\": \"echo\"}",
       "port: must be an integer"},
      {"{\"name\": \"s\", \"port\": 7000.5, \"app\": \"echo\"}",
       "port: must be an integer"},
      {"{\"name\": \"s\", \"port\": true, \"app\": \"echo\"}",
       "port: must be an integer"},
      {"{\"name\": \"s\", \"port\": -1, \"app\": \"echo\"}",
       "port: must not be negative"},
      {"{\"name\": \"s\", \"port\": 0, \"app\": \"echo\"}",
       "port: must be between 1 and 65535"},
      {"{\"name\": \"s\", \"port\": 65536, \"app\": \"echo\"}",
       "port: must be between 1 and 65535"},
      {"{\"name\": \"s\", \"port\": 99999999999999999999999, \"app\": "
       "\"echo\"}",
       "port: must be between 1 and 65535"},
      {"{\"name\": \"s\", \"port\": 7000, \"app\": 1}",
       "app: must be a string"},
      {SVC(", \"app\": \"\""), "app:"},
      {SVC(", \"proto\": \"sctp\""), "proto: must be \"udp\" or \"tcp\""},
      {SVC(", \"app_config\": [1]"), "app_config: must be a JSON object"},
      {SVC(", \"app_config\": \"{}\""), "app_config: must be a JSON object"},
      {SVC(", \"proto\": \"quic-and-more\""), "proto: must be"},
      {SVC(", \"framing\": \"len32\""), "framing: only a tcp service"},
      {SVC(", \"proto\": \"tcp\", \"framing\": \"lines\""),
       "framing: must be \"len32\" or {\"fixed\": N}"},
      {SVC(", \"proto\": \"tcp\", \"framing\": {\"fixed\": 0}"),
       "framing.fixed: must be at least 1"},
      {SVC(", \"backends\": {}"), "backends: must be an array"},
      {SVC(", \"backends\": [{\"name\": \"db\"}]"),
       "backends[0]: name and address are required"},
      {SVC(", \"backends\": [{\"name\": \"db\", \"address\": \"x:1\", "
           "\"colour\": 1}]"),
       "backends[0].colour: unknown field"},
      {SVC(", \"proto\": 17"), "proto: must be a string"},
      {SVC(", \"slot_size\": 100"),
       "slot_size: must be a power of two between 64 and 1048576"},
      {SVC(", \"slot_size\": 32"),
       "slot_size: must be a power of two between 64 and 1048576"},
      {SVC(", \"slot_size\": 2097152"),
       "slot_size: must be a power of two between 64 and 1048576"},
      {SVC(", \"slot_size\": 18446744073709551616"),
       "slot_size: must be a power of two between 64 and 1048576"},
      {SVC(", \"slot_size\": -64"), "slot_size: must not be negative"},
      {SVC(", \"slot_size\": \"2k\""), "slot_size: must be an integer"},
      {SVC(", \"slots\": 3"), "slots: must be a power of two between 2 and"},
      {SVC(", \"slots\": 131072"), "slots: must be a power of two"},
      {SVC(", \"slots\": -8"), "slots: must not be negative"},
      {SVC(", \"mqueues_per_accel\": 0"),
       "mqueues_per_accel: must be between 1 and 1024"},
      {SVC(", \"mqueues_per_accel\": 1025"),
       "mqueues_per_accel: must be between 1 and 1024"},
      {SVC(", \"mqueues_per_accel\": [4]"),
       "mqueues_per_accel: must be an integer"},
      {SVC(", \"work_us\": -5"), "work_us: must not be negative"},
      {SVC(", \"work_us\": 20000000"), "work_us: must be between 0 and"},
      {SVC(", \"work_us\": 1e3"), "work_us: must be an integer"},
      {SVC(", \"replica\": 3"), "replica: unknown field"},
      {SVC(", \"placement\": \"some\""), "placement: must be \"all\""},
      {SVC(", \"placement\": \"ALL\""), "placement: must be \"all\""},
      {SVC(", \"placement\": 3"), "placement: must be \"all\""},
      {SVC(", \"placement\": [\"all\"]"), "placement: must be \"all\""},
      {SVC(", \"placement\": null"), "placement: must be \"all\""},
      {SVC(", \"placement\": {\"replicas\": 0}"),
       "placement.replicas: must be between 1 and"},
      {SVC(", \"placement\": {\"replicas\": -3}"),
       "placement.replicas: must not be negative"},
      {SVC(", \"placement\": {\"replicas\": \"3\"}"),
       "placement.replicas: must be an integer"},
      {SVC(", \"placement\": {\"replicas\": 99999999999}"),
       "placement.replicas: must be at most"},
      {SVC(", \"placement\": {\"replicas\": 2, \"spread\": true}"),
       "placement.spread: unknown field"},
      {SVC(", \"placement\": {\"replicas\": 2, \"selector\": [\"a=b\"]}"),
       "placement.selector: must be an object"},
      {SVC(", \"placement\": {\"replicas\": 2, \"selector\": {\"gpu\": 1}}"),
       "placement.selector.gpu: must be a string"},
      {SVC(", \"placement\": {\"replicas\": 2, \"selector\": {\"\": \"x\"}}"),
       "placement.selector: keys must be"},
  };
  struct lynx_service_spec s;
  struct lynx_reg_err err;
  size_t k;
  (void)state;
  for (k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
    memset(&s, 0x5a, sizeof(s));
    if (decode(cases[k].json, &s, &err) != -EINVAL)
      fail_msg("accepted: %s", cases[k].json);
    assert_int_equal(err.status, 400);
    assert_string_equal(err.code, "invalid_argument");
    if (strncmp(err.message, cases[k].msg, strlen(cases[k].msg)))
      fail_msg("%s: expected \"%s...\", got \"%s\"", cases[k].json,
               cases[k].msg, err.message);
  }
  assert_int_equal(lynx_json_service_spec(NULL, &s, &err), -EINVAL);
  /* an app configuration of 4 KiB of JSON or more */
  {
    static char big[LYNX_APP_CONFIG_MAX + 256];
    int l =
        snprintf(big, sizeof(big), "%s", SVC(", \"app_config\": {\"k\": \""));
    l--; /* over SVC's closing brace */
    for (int i = 0; i < LYNX_APP_CONFIG_MAX; i++)
      big[l++] = 'x';
    snprintf(big + l, sizeof(big) - (size_t)l, "\"}}");
    assert_int_equal(decode(big, &s, &err), -EINVAL);
    assert_non_null(strstr(err.message, "app_config:"));
    assert_non_null(strstr(err.message, "at most 4095"));
  }
}

/* Strings the API stores and shows must be text: invalid UTF-8 and
 * control characters are refused with the field named. */
static void test_decode_bad_text(void **state) {
  static const struct bad_case cases[] = {
      {SVC(", \"app\": \"ec\\u0001ho\""),
       "app: must be valid UTF-8 without control characters"},
      {SVC(", \"app\": \"ec\xffho\""),
       "app: must be valid UTF-8 without control characters"},
      {SVC(", \"app\": \"\xc0\xaf\""), "app: must be valid UTF-8"},
      {SVC(", \"app\": \"\\u001b[2J\""), "app: must be valid UTF-8"},
      {SVC(", \"placement\": {\"selector\": {\"zone\": \"a\\u0085\"}}"),
       "placement.selector.zone: must be valid UTF-8"},
      {SVC(", \"placement\": {\"selector\": {\"zone\": \"\xed\xa0\x80\"}}"),
       "placement.selector.zone: must be valid UTF-8"},
      {SVC(", \"placement\": {\"selector\": {\"z\xff\": \"a\"}}"),
       "placement.selector: keys must be valid UTF-8"},
      {SVC(", \"placement\": {\"selector\": {\"z\\n\": \"a\"}}"),
       "placement.selector: keys must be valid UTF-8"},
      {SVC(", \"backends\": [{\"name\": \"d\\u0007b\", \"address\": "
           "\"127.0.0.1:1\"}]"),
       "backends[0].name: must be valid UTF-8"},
      {SVC(", \"backends\": [{\"name\": \"db\", \"address\": "
           "\"127.0.0.1:1\\u0000\"}]"),
       "backends[0].address: contains a NUL"},
  };
  struct lynx_service_spec s;
  struct lynx_reg_err err;
  (void)state;
  for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
    if (decode(cases[k].json, &s, &err) != -EINVAL)
      fail_msg("accepted: %s", cases[k].json);
    assert_int_equal(err.status, 400);
    if (strncmp(err.message, cases[k].msg, strlen(cases[k].msg)))
      fail_msg("%s: expected \"%s...\", got \"%s\"", cases[k].json,
               cases[k].msg, err.message);
  }
  /* text that is text is fine, accents and all */
  assert_int_equal(decode(SVC(", \"app\": \"\xc3\xa9"
                              "cho\", \"placement\": {\"selector\": "
                              "{\"zone\": \"z\xc3\xbcrich\"}}"),
                          &s, &err),
                   0);
  assert_string_equal(s.app, "\xc3\xa9"
                             "cho");
}

/* Renders o and parses it back with UTF-8 validation: fails the test when
 * the text is not valid JSON. Takes o. */
static void expect_valid_json(struct json_object *o) {
  const char *text = json_object_to_json_string_ext(
      o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
  struct json_tokener *tok = json_tokener_new();
  struct json_object *back;
  assert_non_null(tok);
  json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
  back = json_tokener_parse_ex(tok, text, (int)strlen(text));
  if (!back)
    fail_msg("not valid JSON (%s): %s",
             json_tokener_error_desc(json_tokener_get_error(tok)), text);
  json_object_put(back);
  json_tokener_free(tok);
  json_object_put(o);
}

/* Whatever bytes reach the registry by ways that do not check them (an
 * agent's address, a frontend's id, a region locator, a request path in an
 * error message), the API's JSON stays valid UTF-8. */
static void test_encode_never_invalid(void **state) {
  struct lynx_registry r;
  struct lynx_reg_node *n;
  struct lynx_reg_frontend *fe;
  (void)state;
  lynx_reg_init(&r, 3000, 10000, NULL);
  reg_node(&r, "n1", 1, 2, "zone=a", 0);
  create(&r, "{\"name\": \"echo\", \"port\": 7000, \"app\": \"echo\", "
             "\"mqueues_per_accel\": 1}");
  ready_all(&r);
  n = lynx_reg_node_find(&r, "n1");
  assert_non_null(n);
  /* what a future path, or a bug, could leave there */
  snprintf(n->address, sizeof(n->address), "10.0.0.1:\xff\xfe");
  snprintf(n->labels[0].value, sizeof(n->labels[0].value), "a\xc3");
  snprintf(n->accels[0].info.model, sizeof(n->accels[0].info.model),
           "GPU \xe2\x82");
  snprintf(n->accels[1].last_error, sizeof(n->accels[1].last_error),
           "\x80\x1b[2J");
  n->accels[1].failed = 1;
  snprintf(r.instances->desc.locator, sizeof(r.instances->desc.locator),
           "/lynx-\xf5");
  fe = lynx_reg_frontend_connect(&r, "fe-\xff", "127.0.0.1:\xc0", NULL, 0);
  assert_non_null(fe);
  expect_valid_json(lynx_json_nodes(&r, 10));
  expect_valid_json(lynx_json_accels(&r, 10));
  expect_valid_json(lynx_json_mqueues(&r));
  expect_valid_json(lynx_json_frontends(&r, 10));
  expect_valid_json(lynx_json_error("not_found", "node '\xff\x01' not found"));
  lynx_reg_free(&r);
}

/* ---- encoding ------------------------------------------------------- */

static void test_encode_shapes(void **state) {
  struct lynx_registry r;
  struct json_object *o, *items, *a, *p;
  struct lynx_fe_mq_report mq1[2], mq2[1];
  struct lynx_reg_node *n;
  char id[64];
  (void)state;

  lynx_reg_init(&r, 3000, 10000, NULL);
  reg_node(&r, "n1", 42, 2, "gpu=a100,zone=eu", 1000);
  create(&r, "{\"name\": \"echo\", \"port\": 7000, \"app\": \"echo\", "
             "\"mqueues_per_accel\": 2}");
  create(&r, "{\"name\": \"rep\", \"port\": 7001, \"app\": \"echo\", "
             "\"mqueues_per_accel\": 1, \"placement\": {\"replicas\": 5, "
             "\"selector\": {\"gpu\": \"a100\"}}}");
  ready_all(&r);
  n = lynx_reg_node_find(&r, "n1");
  n->accels[1].requests = 10;
  n->accels[1].responses = 9;
  n->accels[1].info.n_apps = 2;
  snprintf(n->accels[1].info.apps[0], LYNX_APP_NAME_MAX, "echo");
  snprintf(n->accels[1].info.apps[1], LYNX_APP_NAME_MAX, "kv-lookup");

  /* the plug-ins its agent refused: listed only when there are some */
  {
    struct lynx_app_refusal ref = {"future-abi", "built for plug-in ABI 2"};
    lynx_reg_node_refused(&r, "n1", &ref, 1);
    o = lynx_json_node(&r, n, 1500);
    assert_int_equal(n_keys(o), 10);
    a = json_object_array_get_idx(get(o, "refused_apps"), 0);
    assert_string_equal(get_str(a, "name"), "future-abi");
    assert_string_equal(get_str(a, "reason"), "built for plug-in ABI 2");
    json_object_put(o);
    lynx_reg_node_refused(&r, "n1", NULL, 0);
    lynx_reg_node_refused(&r, "no-such-node", &ref, 1); /* nothing */
  }
  /* the deaths of its plug-ins' processes: on the node, and on the
   * services of that application */
  {
    struct lynx_app_fault f = {"echo", "killed by signal 11", 3, 2};
    uint64_t v = r.version;
    lynx_reg_node_app_faults(&r, "n1", &f, 1);
    assert_true(r.version > v);
    v = r.version;
    lynx_reg_node_app_faults(&r, "n1", &f, 1); /* the same: no change */
    assert_int_equal(r.version, v);
    o = lynx_json_node(&r, n, 1500);
    assert_int_equal(n_keys(o), 10);
    a = json_object_array_get_idx(get(o, "app_faults"), 0);
    assert_string_equal(get_str(a, "name"), "echo");
    assert_string_equal(get_str(a, "last_death"), "killed by signal 11");
    assert_int_equal(get_u64(a, "restarts"), 3);
    assert_int_equal(get_u64(a, "lost"), 2);
    json_object_put(o);
    for (struct lynx_reg_service *sv = r.services; sv; sv = sv->next) {
      o = lynx_json_service(&r, sv, NULL);
      a = json_object_array_get_idx(get(o, "app_faults"), 0);
      assert_string_equal(get_str(a, "node"), "n1");
      assert_int_equal(get_u64(a, "lost"), 2);
      json_object_put(o);
    }
    lynx_reg_node_app_faults(&r, "n1", NULL, 0);
    o = lynx_json_service(&r, r.services, NULL);
    assert_false(json_object_object_get_ex(o, "app_faults", NULL));
    json_object_put(o);
  }
  /* node */
  o = lynx_json_node(&r, n, 1500);
  assert_int_equal(n_keys(o), 9);
  assert_string_equal(get_str(o, "id"), "n1");
  assert_string_equal(get_str(o, "state"), "ready");
  assert_true(json_object_is_type(get(o, "suspect"), json_type_boolean));
  assert_false(json_object_get_boolean(get(o, "suspect")));
  assert_true(json_object_is_type(get(o, "leaving"), json_type_boolean));
  assert_false(json_object_get_boolean(get(o, "leaving")));
  assert_string_equal(get_str(o, "address"), "127.0.0.1:7701");
  assert_int_equal(get_u64(o, "epoch"), 42);
  assert_int_equal(get_u64(o, "last_heartbeat_ms"), 500);
  a = get(o, "labels");
  assert_true(json_object_is_type(a, json_type_object));
  assert_string_equal(get_str(a, "gpu"), "a100");
  assert_string_equal(get_str(a, "zone"), "eu");
  a = get(o, "accelerators");
  assert_true(json_object_is_type(a, json_type_array));
  assert_int_equal(json_object_array_length(a), 2);
  a = json_object_array_get_idx(a, 1);
  /* accelerator */
  assert_int_equal(n_keys(a), 16);
  /* what it runs, built in and plug-ins alike */
  assert_int_equal(json_object_array_length(get(a, "apps")), 2);
  assert_string_equal(
      json_object_get_string(json_object_array_get_idx(get(a, "apps"), 1)),
      "kv-lookup");
  assert_int_equal(n_keys(get(a, "blocks")), 3); /* a CPU's: all 0 */
  assert_int_equal(get_u64(get(a, "blocks"), "resident"), 0);
  assert_int_equal(get_u64(get(a, "blocks"), "held"), 0);
  assert_int_equal(get_u64(get(a, "blocks"), "per_instance"), 0);
  assert_int_equal(n_keys(get(a, "latency")), 5);
  assert_int_equal(get_u64(get(a, "latency"), "window_requests"), 0);
  assert_string_equal(get_str(a, "id"), "n1/1");
  assert_string_equal(get_str(a, "node"), "n1");
  assert_string_equal(get_str(a, "kind"), "cpu");
  assert_string_equal(get_str(a, "model"), "emulated");
  assert_int_equal(get_u64(a, "memory_bytes"), 4096);
  assert_string_equal(get_str(a, "ordering"), "fenced");
  assert_string_equal(get_str(a, "state"), "ready");
  assert_int_equal(get_u64(a, "requests"), 10);
  assert_int_equal(get_u64(a, "responses"), 9);
  assert_string_equal(get_str(a, "pci_bus_id"), "");
  assert_false(json_object_get_boolean(get(a, "gpudirect_rdma")));
  assert_int_equal(get_u64(a, "rdma_writes_ordering"), 0);
  p = get(a, "health");
  assert_int_equal(n_keys(p), 8);
  assert_true(json_object_is_type(get(p, "dispatchable"), json_type_boolean));
  assert_true(json_object_get_boolean(get(p, "dispatchable")));
  assert_false(json_object_get_boolean(get(p, "device_lost")));
  assert_false(json_object_get_boolean(get(p, "failed")));
  assert_string_equal(get_str(p, "last_error"), "");
  assert_int_equal(get_u64(p, "stalled_mqueues"), 0);
  assert_int_equal(get_u64(p, "stall_ms"), 0);
  assert_int_equal(get_u64(p, "unhealthy_for_ms"), 0);
  assert_int_equal(get_u64(p, "outages"), 0);
  json_object_put(o);

  /* services: placement shapes and instance counts */
  o = lynx_json_services(&r, NULL);
  assert_int_equal(get_u64(o, "version"), r.version);
  items = get(o, "items");
  assert_int_equal(json_object_array_length(items), 2);
  a = json_object_array_get_idx(items, 0);
  assert_int_equal(n_keys(a), 13);
  assert_string_equal(get_str(a, "name"), "echo");
  assert_string_equal(get_str(a, "proto"), "udp");
  assert_int_equal(get_u64(a, "port"), 7000);
  assert_string_equal(get_str(a, "app"), "echo");
  assert_int_equal(get_u64(a, "slot_size"), 2048);
  assert_int_equal(get_u64(a, "slots"), 256);
  assert_int_equal(get_u64(a, "mqueues_per_accel"), 2);
  assert_int_equal(get_u64(a, "work_us"), 0);
  assert_string_equal(get_str(a, "placement"), "all");
  p = get(a, "instances");
  assert_int_equal(get_u64(p, "ready"), 2);
  assert_int_equal(get_u64(p, "wanted"), 2);
  assert_int_equal(get_u64(p, "failed_starts"), 0);
  assert_string_equal(get_str(a, "state"), "ready");
  assert_string_equal(get_str(a, "reason"), "");
  a = json_object_array_get_idx(items, 1);
  p = get(a, "placement");
  assert_true(json_object_is_type(p, json_type_object));
  assert_int_equal(get_u64(p, "replicas"), 5);
  assert_string_equal(get_str(get(p, "selector"), "gpu"), "a100");
  p = get(a, "instances");
  assert_int_equal(get_u64(p, "ready"), 2);
  assert_int_equal(get_u64(p, "wanted"), 5);
  assert_string_equal(get_str(a, "state"), "degraded");
  assert_string_equal(get_str(a, "reason"), "2 of 5 instances ready");
  json_object_put(o);

  /* mqueues: counters summed over frontends; a disconnected frontend's
   * outstanding is stale and not counted */
  assert_non_null(lynx_reg_frontend_connect(&r, "fe1", "a:1", (void *)1, 0));
  assert_non_null(lynx_reg_frontend_connect(&r, "fe2", "b:2", (void *)2, 0));
  /* fe1 active: it produces into every instance (fe2 is a standby) */
  lynx_reg_frontend_set_active(&r, "fe1", 1);
  lynx_reg_partition(&r, 5);
  memset(mq1, 0, sizeof(mq1));
  memset(mq2, 0, sizeof(mq2));
  mq1[0].instance_id = r.instances->id; /* echo on n1/0 */
  mq1[0].q = 1;
  mq1[0].dispatched = 100;
  mq1[0].responded = 90;
  mq1[0].outstanding = 10;
  mq1[1].instance_id = 999; /* unknown: ignored */
  mq1[1].q = 0;
  mq1[1].dispatched = 7;
  mq2[0] = mq1[0];
  mq2[0].dispatched = 5;
  mq2[0].responded = 5;
  mq2[0].outstanding = 4;
  /* how each reached it: the connected frontend's word counts, the
   * disconnected one's last report does not outweigh it */
  mq1[0].transport = 1 + LYNX_TRANSPORT_TCP;
  mq2[0].transport = 1 + LYNX_TRANSPORT_RDMA;
  lynx_reg_frontend_status(&r, "fe1", r.table_version, mq1, 2, 10);
  lynx_reg_frontend_status(&r, "fe2", r.table_version, mq2, 1, 10);
  lynx_reg_frontend_disconnected(&r, (void *)2);

  o = lynx_json_mqueues(&r);
  items = get(o, "items");
  /* echo: 2 accels x 2 mqueues; rep: 2 replicas x 1 */
  assert_int_equal(json_object_array_length(items), 6);
  a = json_object_array_get_idx(items, 1);
  assert_int_equal(n_keys(a), 17);
  assert_true(json_object_get_boolean(get(a, "dispatchable")));
  assert_string_equal(get_str(a, "frontend"), "fe1");
  assert_int_equal(get_u64(a, "epoch"), r.frontend_epoch);
  assert_true(r.frontend_epoch > 0);
  snprintf(id, sizeof(id), "echo/n1/0/1");
  assert_string_equal(get_str(a, "id"), id);
  assert_string_equal(get_str(a, "service"), "echo");
  assert_string_equal(get_str(a, "node"), "n1");
  assert_int_equal(get_u64(a, "accel"), 0);
  assert_int_equal(get_u64(a, "instance"), r.instances->id);
  assert_int_equal(get_u64(a, "index"), 1);
  assert_int_equal(get_u64(a, "slots"), 256);
  assert_int_equal(get_u64(a, "slot_size"), 2048);
  assert_string_equal(get_str(a, "transport"), "tcp"); /* fe1 said */
  assert_int_equal(json_object_array_length(get(a, "transports")), 1);
  assert_string_equal(json_object_get_string(
                          json_object_array_get_idx(get(a, "transports"), 0)),
                      "shm"); /* what the descriptor offers */
  {
    char loc[64];
    snprintf(loc, sizeof(loc), "/lynx-%lld",
             (long long)json_object_get_int64(get(a, "instance")));
    assert_string_equal(get_str(a, "locator"), loc);
  }
  assert_int_equal(get_u64(a, "dispatched"), 105);
  assert_int_equal(get_u64(a, "responded"), 95);
  assert_int_equal(get_u64(a, "outstanding"), 10);
  a = json_object_array_get_idx(items, 0);
  assert_string_equal(get_str(a, "id"), "echo/n1/0/0");
  assert_int_equal(get_u64(a, "dispatched"), 0);
  assert_string_equal(get_str(a, "transport"), "shm"); /* none said */
  a = json_object_array_get_idx(items, 5);
  assert_string_equal(get_str(a, "service"), "rep");
  json_object_put(o);

  /* frontends */
  o = lynx_json_frontends(&r, 110);
  items = get(o, "items");
  assert_int_equal(json_object_array_length(items), 2);
  a = json_object_array_get_idx(items, 0);
  assert_int_equal(n_keys(a), 10);
  assert_string_equal(get_str(a, "id"), "fe1");
  assert_string_equal(get_str(a, "address"), "a:1");
  assert_true(json_object_get_boolean(get(a, "connected")));
  assert_true(json_object_get_boolean(get(a, "active")));
  assert_false(json_object_get_boolean(get(a, "draining")));
  assert_int_equal(get_u64(a, "instances"), 4);
  assert_int_equal(get_u64(a, "releasing"), 0);
  assert_int_equal(get_u64(a, "epoch"), r.frontend_epoch);
  assert_int_equal(get_u64(a, "table_version"), r.table_version);
  assert_int_equal(get_u64(a, "last_seen_ms"), 100);
  a = json_object_array_get_idx(items, 1);
  assert_false(json_object_get_boolean(get(a, "connected")));
  assert_false(json_object_get_boolean(get(a, "active")));
  assert_int_equal(get_u64(a, "instances"), 0);
  json_object_put(o);

  /* the other lists */
  o = lynx_json_nodes(&r, 2000);
  assert_int_equal(n_keys(o), 2);
  assert_int_equal(get_u64(o, "version"), r.version);
  assert_int_equal(json_object_array_length(get(o, "items")), 1);
  json_object_put(o);
  o = lynx_json_accels(&r, 2000);
  items = get(o, "items");
  assert_int_equal(json_object_array_length(items), 2);
  assert_string_equal(get_str(json_object_array_get_idx(items, 0), "id"),
                      "n1/0");
  assert_string_equal(get_str(json_object_array_get_idx(items, 0), "ordering"),
                      "coalesced");
  json_object_put(o);

  /* a drained node's accelerators say so */
  {
    struct lynx_reg_err err;
    lynx_reg_frontend_disconnected(&r, (void *)1);
    assert_int_equal(lynx_reg_drain(&r, "n1", 0, &err), 0);
    o = lynx_json_node(&r, n, 0);
    assert_string_equal(get_str(o, "state"), "drained");
    assert_string_equal(
        get_str(json_object_array_get_idx(get(o, "accelerators"), 0), "state"),
        "drained");
    assert_int_equal(get_u64(o, "last_heartbeat_ms"), 0); /* clock behind */
    json_object_put(o);
    o = lynx_json_service(&r, r.services, NULL);
    assert_int_equal(get_u64(get(o, "instances"), "wanted"), 0);
    json_object_put(o);
  }

  o = lynx_json_error("not_found", "service x not found");
  assert_int_equal(n_keys(o), 1);
  a = get(o, "error");
  assert_int_equal(n_keys(a), 2);
  assert_string_equal(get_str(a, "code"), "not_found");
  assert_string_equal(get_str(a, "message"), "service x not found");
  json_object_put(o);

  lynx_reg_free(&r);
}

/* An encoded service decodes back to the same spec. */
/* Health in the accelerator objects, the mqueues' dispatchable and the
 * services' ready counts; cuda fields as registered. */
static void test_encode_health(void **state) {
  struct lynx_registry r;
  struct lynx_accel_info acc[2];
  struct lynx_accel_report rep;
  struct lynx_reg_err err;
  struct json_object *o, *items, *a, *h;
  size_t k;
  (void)state;

  lynx_reg_init(&r, 3000, 10000, NULL);
  memset(acc, 0, sizeof(acc));
  for (k = 0; k < 2; k++) {
    acc[k].idx = (uint32_t)k;
    snprintf(acc[k].kind, sizeof(acc[k].kind), "cuda");
    snprintf(acc[k].model, sizeof(acc[k].model), "NVIDIA A100-PCIE-40GB");
    acc[k].memory_bytes = 40ull << 30;
    acc[k].ordering = 1;
    snprintf(acc[k].pci_bus_id, sizeof(acc[k].pci_bus_id), "0000:%02zx:00.0",
             0x3b + k);
    acc[k].gpudirect_rdma = 1;
    acc[k].rdma_writes_ordering = 100;
    acc[k].resident_blocks = 540;
    acc[k].instance_blocks = k ? 0 : 4;
  }
  assert_int_equal(lynx_reg_register(&r, "g1", "127.0.0.1:7701", 5, NULL, 0,
                                     acc, 2, NULL, 1000, &err),
                   0);
  create(&r, "{\"name\": \"echo\", \"port\": 7000, \"app\": \"echo\", "
             "\"mqueues_per_accel\": 1}");
  ready_all(&r);

  memset(&rep, 0, sizeof(rep));
  rep.idx = 1;
  rep.requests = 7;
  rep.stalled_mqueues = 1;
  rep.stall_ms = 2300;
  rep.lat = (struct lynx_accel_latency){900, 2100, 48000, 5300, 9900};
  rep.blocks_held = 108;
  snprintf(rep.last_error, sizeof(rep.last_error), "kernel timeout");
  assert_int_equal(lynx_reg_heartbeat(&r, "g1", 5, &rep, 1, 1200), 0);

  o = lynx_json_accels(&r, 1700);
  items = get(o, "items");
  assert_int_equal(json_object_array_length(items), 2);
  a = json_object_array_get_idx(items, 0);
  assert_string_equal(get_str(a, "kind"), "cuda");
  assert_string_equal(get_str(a, "model"), "NVIDIA A100-PCIE-40GB");
  assert_string_equal(get_str(a, "pci_bus_id"), "0000:3b:00.0");
  assert_true(json_object_get_boolean(get(a, "gpudirect_rdma")));
  assert_int_equal(get_u64(a, "rdma_writes_ordering"), 100);
  assert_true(json_object_get_boolean(get(get(a, "health"), "dispatchable")));
  /* the resident-block budget as registered and reported */
  assert_int_equal(get_u64(get(a, "blocks"), "resident"), 540);
  assert_int_equal(get_u64(get(a, "blocks"), "held"), 0);
  assert_int_equal(get_u64(get(a, "blocks"), "per_instance"), 4);
  a = json_object_array_get_idx(items, 1);
  assert_string_equal(get_str(a, "pci_bus_id"), "0000:3c:00.0");
  assert_int_equal(get_u64(a, "requests"), 7);
  assert_int_equal(get_u64(get(a, "blocks"), "held"), 108);
  assert_int_equal(get_u64(get(a, "blocks"), "per_instance"), 0);
  h = get(a, "health");
  assert_false(json_object_get_boolean(get(h, "dispatchable")));
  assert_false(json_object_get_boolean(get(h, "device_lost")));
  assert_false(json_object_get_boolean(get(h, "failed")));
  assert_string_equal(get_str(h, "last_error"), "kernel timeout");
  assert_int_equal(get_u64(h, "stalled_mqueues"), 1);
  assert_int_equal(get_u64(h, "stall_ms"), 2300);
  assert_int_equal(get_u64(h, "unhealthy_for_ms"), 500);
  assert_int_equal(get_u64(h, "outages"), 1);
  /* the accelerator-stamped latency of the last heartbeat, as reported */
  h = get(a, "latency");
  assert_int_equal(get_u64(h, "window_requests"), 900);
  assert_int_equal(get_u64(h, "queue_p50_ns"), 2100);
  assert_int_equal(get_u64(h, "queue_p99_ns"), 48000);
  assert_int_equal(get_u64(h, "service_p50_ns"), 5300);
  assert_int_equal(get_u64(h, "service_p99_ns"), 9900);
  json_object_put(o);

  /* the node carries the same objects */
  o = lynx_json_node(&r, lynx_reg_node_find(&r, "g1"), 1300);
  h = get(json_object_array_get_idx(get(o, "accelerators"), 1), "health");
  assert_int_equal(get_u64(h, "unhealthy_for_ms"), 100);
  json_object_put(o);

  /* in dispatch: only the healthy accelerator's */
  o = lynx_json_mqueues(&r);
  items = get(o, "items");
  assert_int_equal(json_object_array_length(items), 2);
  for (k = 0; k < 2; k++) {
    a = json_object_array_get_idx(items, k);
    assert_int_equal(json_object_get_boolean(get(a, "dispatchable")),
                     get_u64(a, "accel") == 0);
  }
  json_object_put(o);
  o = lynx_json_service(&r, r.services, NULL);
  assert_int_equal(get_u64(get(o, "instances"), "ready"), 1);
  assert_int_equal(get_u64(get(o, "instances"), "wanted"), 2);
  json_object_put(o);

  /* lost; then healthy again: back, the outage counted once */
  rep.stalled_mqueues = 0;
  rep.device_lost = 1;
  assert_int_equal(lynx_reg_heartbeat(&r, "g1", 5, &rep, 1, 1400), 0);
  o = lynx_json_accel(lynx_reg_node_find(&r, "g1"),
                      &lynx_reg_node_find(&r, "g1")->accels[1], 1500);
  h = get(o, "health");
  assert_false(json_object_get_boolean(get(h, "dispatchable")));
  assert_true(json_object_get_boolean(get(h, "device_lost")));
  assert_int_equal(get_u64(h, "unhealthy_for_ms"), 300);
  assert_int_equal(get_u64(h, "outages"), 1);
  json_object_put(o);
  memset(&rep, 0, sizeof(rep));
  rep.idx = 1;
  assert_int_equal(lynx_reg_heartbeat(&r, "g1", 5, &rep, 1, 1600), 0);
  o = lynx_json_accel(lynx_reg_node_find(&r, "g1"),
                      &lynx_reg_node_find(&r, "g1")->accels[1], 1700);
  h = get(o, "health");
  assert_true(json_object_get_boolean(get(h, "dispatchable")));
  assert_int_equal(get_u64(h, "unhealthy_for_ms"), 0);
  assert_int_equal(get_u64(h, "outages"), 1);
  json_object_put(o);
  o = lynx_json_service(&r, r.services, NULL);
  assert_int_equal(get_u64(get(o, "instances"), "ready"), 2);
  json_object_put(o);
  /* as a follower that knows of no leader shows it: the intent, and the
   * runtime fields unknown (never a count it does not have) */
  {
    struct json_object *v;
    o = lynx_json_service(&r, r.services, "no leader (ut)");
    assert_true(json_object_object_get_ex(o, "instances", &v));
    assert_null(v);
    assert_string_equal(json_object_get_string(get(o, "state")), "unknown");
    assert_string_equal(json_object_get_string(get(o, "reason")),
                        "no leader (ut)");
    assert_string_equal(json_object_get_string(get(o, "name")),
                        r.services->spec.name);
    json_object_put(o);
  }

  lynx_reg_free(&r);
}

static void test_service_round_trip(void **state) {
  struct lynx_registry r;
  struct lynx_service_spec s;
  struct lynx_reg_err err;
  struct json_object *o;
  (void)state;
  lynx_reg_init(&r, 3000, 10000, NULL);
  create(&r,
         "{\"name\": \"x\", \"port\": 9, \"app\": \"a\", \"work_us\": 3, "
         "\"placement\": {\"replicas\": 2, \"selector\": {\"k\": "
         "\"v\"}}, \"app_config\": {\"model\": \"/m.bin\", \"k\": [1, 2]}}");
  create(&r, "{\"name\": \"y\", \"port\": 10, \"app\": \"a\", "
             "\"placement\": {\"selector\": {\"k\": \"v\"}}, "
             "\"proto\": \"tcp\", \"framing\": {\"fixed\": 100}, "
             "\"backends\": [{\"name\": \"db\", \"address\": "
             "\"127.0.0.1:11211\", \"proto\": \"memcached\"}, {\"name\": "
             "\"next\", \"address\": \"10.0.0.2:7000\"}]}");
  for (struct lynx_reg_service *sv = r.services; sv; sv = sv->next) {
    o = lynx_json_service_spec_obj(&sv->spec);
    assert_int_equal(lynx_json_service_spec(o, &s, &err), 0);
    json_object_put(o);
    assert_string_equal(s.name, sv->spec.name);
    assert_int_equal(s.port, sv->spec.port);
    assert_int_equal(s.work_us, sv->spec.work_us);
    assert_int_equal(s.placement, sv->spec.placement);
    assert_int_equal(s.replicas, sv->spec.replicas);
    assert_int_equal(s.n_selector, 1);
    assert_string_equal(s.selector[0].key, "k");
    /* what state.json keeps of a tcp service with back ends */
    assert_string_equal(s.proto, sv->spec.proto);
    assert_int_equal(s.fixed_len, sv->spec.fixed_len);
    assert_int_equal(s.n_backends, sv->spec.n_backends);
    for (uint32_t k = 0; k < s.n_backends; k++) {
      assert_string_equal(s.backends[k].name, sv->spec.backends[k].name);
      assert_string_equal(s.backends[k].address, sv->spec.backends[k].address);
      assert_string_equal(s.backends[k].proto, sv->spec.backends[k].proto);
    }
    /* the app's configuration, as compact text; none: "" */
    assert_string_equal(s.app_config, sv->spec.app_config);
    if (!strcmp(s.name, "x"))
      assert_string_equal(s.app_config, "{\"model\":\"\\/m.bin\",\"k\":[1,2]}");
    if (!strcmp(s.name, "y")) {
      assert_string_equal(s.app_config, "");
      assert_string_equal(s.proto, "tcp");
      assert_int_equal(s.fixed_len, 100);
      assert_int_equal(s.n_backends, 2);
      assert_string_equal(s.backends[1].proto, "len32"); /* the default */
    }
  }
  lynx_reg_free(&r);
}

/* ---- store ---------------------------------------------------------- */

struct tmpdir {
  char path[64];
};

static int dir_setup(void **state) {
  struct tmpdir *t = calloc(1, sizeof(*t));
  if (!t)
    return -1;
  snprintf(t->path, sizeof(t->path), "/tmp/lynx-regjson-XXXXXX");
  if (!mkdtemp(t->path)) {
    free(t);
    return -1;
  }
  *state = t;
  return 0;
}

static int dir_teardown(void **state) {
  struct tmpdir *t = *state;
  char p[128];
  snprintf(p, sizeof(p), "%s/state.json", t->path);
  unlink(p);
  snprintf(p, sizeof(p), "%s/state.json.tmp", t->path);
  unlink(p);
  rmdir(t->path);
  free(t);
  return 0;
}

static void write_state(const char *dir, const char *text) {
  char p[128];
  FILE *f;
  snprintf(p, sizeof(p), "%s/state.json", dir);
  f = fopen(p, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static int exists(const char *dir, const char *name) {
  char p[128];
  struct stat st;
  snprintf(p, sizeof(p), "%s/%s", dir, name);
  return stat(p, &st) == 0;
}

static void test_store_round_trip(void **state) {
  struct tmpdir *t = *state;
  struct lynx_registry r, r2;
  struct lynx_reg_service *a, *b;
  struct lynx_reg_drain_intent *d;
  struct lynx_reg_err err;
  char msg[256];
  int seen_n1 = 0, seen_n9 = 0;

  lynx_reg_init(&r, 3000, 10000, NULL);
  reg_node(&r, "n1", 1, 2, "", 0);
  reg_node(&r, "n2", 1, 2, "", 0);
  create(&r, "{\"name\": \"echo\", \"port\": 7000, \"app\": \"echo\", "
             "\"slot_size\": 4096, \"slots\": 64, \"mqueues_per_accel\": 8, "
             "\"work_us\": 12}");
  create(&r, "{\"name\": \"rep\", \"port\": 7001, \"app\": \"sockperf-echo\", "
             "\"placement\": {\"replicas\": 3, \"selector\": {\"gpu\": "
             "\"a100\", \"zone\": \"eu\"}}}");
  assert_int_equal(lynx_reg_drain(&r, "n1", 0, &err), 0);
  assert_int_equal(lynx_reg_drain_intent_add(&r, "n9"), 0);

  /* missing file: an empty state */
  lynx_reg_init(&r2, 3000, 10000, NULL);
  assert_int_equal(lynx_store_load(t->path, &r2, 0, msg, sizeof(msg)), 0);
  assert_null(r2.services);
  assert_null(r2.drain_intents);
  lynx_reg_free(&r2);

  assert_int_equal(lynx_store_save(t->path, &r, NULL, msg, sizeof(msg)), 0);
  assert_true(exists(t->path, "state.json"));
  assert_false(exists(t->path, "state.json.tmp"));
  /* saving again replaces it */
  assert_int_equal(lynx_store_save(t->path, &r, NULL, msg, sizeof(msg)), 0);
  assert_false(exists(t->path, "state.json.tmp"));

  lynx_reg_init(&r2, 3000, 10000, NULL);
  if (lynx_store_load(t->path, &r2, 5, msg, sizeof(msg)))
    fail_msg("load: %s", msg);
  a = r2.services;
  assert_non_null(a);
  b = a->next;
  assert_non_null(b);
  assert_null(b->next);
  assert_string_equal(a->spec.name, "echo");
  assert_string_equal(a->spec.proto, "udp");
  assert_int_equal(a->spec.port, 7000);
  assert_string_equal(a->spec.app, "echo");
  assert_int_equal(a->spec.slot_size, 4096);
  assert_int_equal(a->spec.slots, 64);
  assert_int_equal(a->spec.mqueues_per_accel, 8);
  assert_int_equal(a->spec.work_us, 12);
  assert_int_equal(a->spec.placement, LYNX_PLACE_ALL);
  assert_int_equal(a->created_ms, 5);
  assert_string_equal(b->spec.name, "rep");
  assert_int_equal(b->spec.placement, LYNX_PLACE_REPLICAS);
  assert_int_equal(b->spec.replicas, 3);
  assert_int_equal(b->spec.n_selector, 2);
  assert_string_equal(b->spec.selector[1].key, "zone");
  assert_string_equal(b->spec.selector[1].value, "eu");
  for (d = r2.drain_intents; d; d = d->next) {
    seen_n1 += !strcmp(d->id, "n1");
    seen_n9 += !strcmp(d->id, "n9");
  }
  assert_int_equal(seen_n1, 1);
  assert_int_equal(seen_n9, 1);
  /* the drained node comes back drained, the other one ready */
  reg_node(&r2, "n1", 7, 2, "", 10);
  reg_node(&r2, "n2", 7, 2, "", 10);
  assert_int_equal(lynx_reg_node_find(&r2, "n1")->state, LYNX_NODE_DRAINED);
  assert_int_equal(lynx_reg_node_find(&r2, "n2")->state, LYNX_NODE_READY);
  /* ... and stays in the next save */
  assert_int_equal(lynx_store_save(t->path, &r2, NULL, msg, sizeof(msg)), 0);
  lynx_reg_free(&r2);
  lynx_reg_init(&r2, 3000, 10000, NULL);
  assert_int_equal(lynx_store_load(t->path, &r2, 0, msg, sizeof(msg)), 0);
  seen_n1 = seen_n9 = 0;
  for (d = r2.drain_intents; d; d = d->next) {
    seen_n1 += !strcmp(d->id, "n1");
    seen_n9 += !strcmp(d->id, "n9");
  }
  assert_int_equal(seen_n1 + seen_n9, 2);
  lynx_reg_free(&r2);
  lynx_reg_free(&r);
}

struct corrupt_case {
  const char *text;
  const char *msg; /* expected in the message */
};

static void test_store_corrupt(void **state) {
  static const struct corrupt_case cases[] = {
      {"", "not valid JSON"},
      {"{\"version\": 1, \"services\": [", "not valid JSON"},
      {"{not json}", "not valid JSON"},
      {"{\"version\": 1} trailing", "trailing"},
      {"[1, 2]", "must be a JSON object"},
      {"{\"services\": []}", "version: required"},
      {"{\"version\": 2, \"services\": []}", "version: must be 1"},
      {"{\"version\": \"1\"}", "version: must be 1"},
      {"{\"version\": 1, \"services\": {}}", "services: must be an array"},
      {"{\"version\": 1, \"drained\": \"n1\"}", "drained: must be an array"},
      {"{\"version\": 1, \"drained\": [1]}", "drained[0]"},
      {"{\"version\": 1, \"drained\": [\"bad/id\"]}", "drained[0]"},
      {"{\"version\": 1, \"extra\": 1}", "extra: unknown field"},
      {"{\"version\": 1, \"epoch\": -1}", "epoch: must be a non-negative"},
      {"{\"version\": 1, \"frontend_epoch\": \"7\"}",
       "frontend_epoch: must be a non-negative"},
      {"{\"version\": 1, \"services\": [{\"name\": \"a\", \"port\": 1, "
       "\"app\": \"x\"}, {\"name\": \"b\", \"port\": -1, \"app\": \"x\"}]}",
       "services[1]: port: must not be negative"},
      {"{\"version\": 1, \"services\": [{\"name\": \"a\", \"port\": 1, "
       "\"app\": \"x\"}, {\"name\": \"a\", \"port\": 2, \"app\": \"x\"}]}",
       "services[1]: name: service a already exists"},
  };
  struct tmpdir *t = *state;
  struct lynx_registry r;
  char msg[256];
  size_t k;
  int rc;
  for (k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
    write_state(t->path, cases[k].text);
    lynx_reg_init(&r, 3000, 10000, NULL);
    msg[0] = '\0';
    rc = lynx_store_load(t->path, &r, 0, msg, sizeof(msg));
    if (rc >= 0)
      fail_msg("loaded: %s", cases[k].text);
    if (!strstr(msg, cases[k].msg) || !strstr(msg, "state.json"))
      fail_msg("%s: expected \"%s\" in \"%s\"", cases[k].text, cases[k].msg,
               msg);
    lynx_reg_free(&r);
  }
  /* a well-formed file with nothing in it */
  write_state(t->path, " {\"version\": 1}\n");
  lynx_reg_init(&r, 3000, 10000, NULL);
  assert_int_equal(lynx_store_load(t->path, &r, 0, msg, sizeof(msg)), 0);
  lynx_reg_free(&r);
}

static void test_store_errors(void **state) {
  struct tmpdir *t = *state;
  struct lynx_registry r;
  char msg[256], p[128];
  (void)t;
  lynx_reg_init(&r, 3000, 10000, NULL);
  msg[0] = '\0';
  assert_int_equal(
      lynx_store_save("/nonexistent/lynx-dir", &r, NULL, msg, sizeof(msg)),
      -ENOENT);
  assert_non_null(strstr(msg, "/nonexistent/lynx-dir/state.json.tmp"));
  /* a directory where the file should be */
  snprintf(p, sizeof(p), "%s/state.json", t->path);
  assert_int_equal(mkdir(p, 0700), 0);
  assert_true(lynx_store_load(t->path, &r, 0, msg, sizeof(msg)) < 0);
  assert_non_null(strstr(msg, "state.json"));
  assert_true(lynx_store_save(t->path, &r, NULL, msg, sizeof(msg)) < 0);
  assert_false(exists(t->path, "state.json.tmp"));
  rmdir(p);
  lynx_reg_free(&r);
}

/* Epochs from the state directory: each one issued is beyond every one
 * before it, also across a restart (a registry loaded again), whatever the
 * clock; the newest frontend epoch survives too. A save that fails issues
 * nothing, and the next one still grows. */
static void test_store_epochs(void **state) {
  struct tmpdir *t = *state;
  struct lynx_registry r;
  uint64_t e1, e2, f1, e3, e4;
  char msg[256], p[128];
  lynx_reg_init(&r, 3000, 10000, NULL);
  assert_int_equal(
      lynx_store_issue_epoch(t->path, &r, 0, &e1, msg, sizeof(msg)), 0);
  assert_int_equal(
      lynx_store_issue_epoch(t->path, &r, 0, &e2, msg, sizeof(msg)), 0);
  assert_true(e2 > e1 && e1 > 0);
  assert_int_equal(
      lynx_store_issue_epoch(t->path, &r, 1, &f1, msg, sizeof(msg)), 0);
  assert_true(f1 > e2);
  assert_true(r.frontend_epoch == f1);
  lynx_reg_free(&r);

  /* a restart: the counter comes back from state.json */
  lynx_reg_init(&r, 3000, 10000, NULL);
  assert_int_equal(lynx_store_load(t->path, &r, 0, msg, sizeof(msg)), 0);
  assert_true(r.frontend_epoch == f1);
  assert_int_equal(
      lynx_store_issue_epoch(t->path, &r, 0, &e3, msg, sizeof(msg)), 0);
  assert_true(e3 > f1);
  assert_true(r.frontend_epoch == f1); /* a node's epoch is not a frontend's */

  /* the directory cannot take the file: no epoch, nothing changes */
  snprintf(p, sizeof(p), "%s/state.json.tmp", t->path);
  assert_int_equal(mkdir(p, 0700), 0);
  assert_true(lynx_store_issue_epoch(t->path, &r, 1, &e4, msg, sizeof(msg)) <
              0);
  assert_true(r.epoch_last == e3 && r.frontend_epoch == f1);
  rmdir(p);
  assert_int_equal(
      lynx_store_issue_epoch(t->path, &r, 1, &e4, msg, sizeof(msg)), 0);
  assert_true(e4 > e3 && r.frontend_epoch == e4);
  lynx_reg_free(&r);

  /* a hand-edited file whose frontend epoch is beyond the counter */
  write_state(t->path, "{\"version\": 1, \"epoch\": 3, "
                       "\"frontend_epoch\": 9}");
  lynx_reg_init(&r, 3000, 10000, NULL);
  assert_true(lynx_store_load(t->path, &r, 0, msg, sizeof(msg)) < 0);
  assert_non_null(strstr(msg, "frontend_epoch 9 is beyond epoch 3"));
  lynx_reg_free(&r);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_decode_defaults),
      cmocka_unit_test(test_decode_bad),
      cmocka_unit_test(test_decode_bad_text),
      cmocka_unit_test(test_encode_never_invalid),
      cmocka_unit_test(test_encode_shapes),
      cmocka_unit_test(test_encode_health),
      cmocka_unit_test(test_service_round_trip),
      cmocka_unit_test_setup_teardown(test_store_round_trip, dir_setup,
                                      dir_teardown),
      cmocka_unit_test_setup_teardown(test_store_corrupt, dir_setup,
                                      dir_teardown),
      cmocka_unit_test_setup_teardown(test_store_errors, dir_setup,
                                      dir_teardown),
      cmocka_unit_test_setup_teardown(test_store_epochs, dir_setup,
                                      dir_teardown),
  };
  return LYNX_UT_MAIN(argc, argv, "tests", tests, NULL, NULL);
}
