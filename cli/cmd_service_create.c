/*
 * cmd_service_create.c - lynxctl service create: a service's spec from
 * the command line's options (or a JSON file, -f), POSTed to
 * /v1/services.
 *
 * The options go through an options table (common/options.h), but for
 * --backend, which may be repeated and is taken out of the command line
 * first. Only what was given is sent: the coordinator fills in its own
 * defaults and checks the spec as a whole (docs/api.md); here only what
 * the options themselves can get wrong is refused, with a usage error.
 */
#include <errno.h>
#include <json-c/json.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lynxctl.h"
#include "options.h"
#include "util.h"

#define FILE_MAX (16u << 20)

static int parse_u32(const char *opt, const char *s, uint32_t *out) {
  uint64_t v;
  if (lynx_parse_u64(s, 0, UINT32_MAX, &v))
    return ctl_usage_err("%s: expected a non-negative integer, got '%s'", opt,
                         s);
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
    ctl_print_table(stdout, arr, ctl_svc_cols);
  }
  json_object_put(arr);
  return EX_OK;
}

/* service create's options (common/options.h); the numbers are sent only
 * when given. --backend, which may be repeated, is taken from the command
 * line before the table sees it (backend_args). */
struct create_opts {
  char *file, *name, *app, *proto, *framing, *placement, *selector, *app_config;
  uint32_t port, slot_size, slots, msg_max, mqueues, work_us, replicas;
};

#define CO(f) offsetof(struct create_opts, f)
#define CO_STR(name, f)                                                        \
  { name, LYNX_OPT_STR, CO(f), NULL, 0, 0, NULL, "" }
#define CO_NUM(name, f)                                                        \
  { name, LYNX_OPT_U32, CO(f), NULL, 0, UINT32_MAX, NULL, "" }
enum {
  C_FILE,
  C_F,
  C_NAME,
  C_APP,
  C_PROTO,
  C_FRAMING,
  C_PORT,
  C_SLOT_SIZE,
  C_SLOTS,
  C_MSG_MAX,
  C_MQUEUES,
  C_WORK_US,
  C_REPLICAS,
  C_PLACEMENT,
  C_SELECTOR,
  C_APP_CONFIG
};
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
    [C_APP_CONFIG] = CO_STR("app-config", app_config),
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
        return ctl_usage_err("--backend needs a value: NAME=HOST:PORT[/PROTO]");
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
    return ctl_usage_err("--backend: expected NAME=HOST:PORT[/PROTO], got ''");
  }
  for (tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(tok, '='), *slash;
    struct json_object *b;
    if (!eq || eq == tok || !eq[1] || eq[1] == '/') {
      int rc = ctl_usage_err("--backend: expected NAME=HOST:PORT[/PROTO] (e.g. "
                             "db=127.0.0.1:11211/memcached), got '%s'",
                             tok);
      free(dup);
      return rc;
    }
    *eq = 0;
    slash = strrchr(eq + 1, '/');
    if (slash && !slash[1]) {
      int rc = ctl_usage_err("--backend %s: a '/' without a protocol after it "
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
             *proto = o->proto, *framing = o->framing,
             *app_config = o->app_config;
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
        app_config || has_port || has_slot_size || has_slots || has_msg_max ||
        has_mq || has_work || has_replicas || n_backends)
      return ctl_usage_err("service create: -f takes the whole spec; give no "
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
    return ctl_usage_err("service create needs --name, --port and --app (or "
                         "-f FILE.json)");
  if (placement && strcmp(placement, "all") != 0)
    return ctl_usage_err("--placement: only 'all' is a placement name; use "
                         "--replicas N for a replica count");
  if (placement && has_replicas)
    return ctl_usage_err("--placement all and --replicas exclude each other");
  if (proto && strcmp(proto, "udp") && strcmp(proto, "tcp"))
    return ctl_usage_err("--proto: expected udp or tcp, got '%s'", proto);
  if (framing && strcmp(framing, "len32") && strncmp(framing, "fixed:", 6))
    return ctl_usage_err("--framing: expected len32 or fixed:N, got '%s'",
                         framing);
  if (framing && (!proto || strcmp(proto, "tcp")))
    return ctl_usage_err("--framing goes with --proto tcp (a udp service's "
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
  if (app_config) {
    /* the coordinator checks it is an object; the app, what it says */
    struct json_object *c = json_tokener_parse(app_config);
    if (!c) {
      json_object_put(req);
      return ctl_usage_err("--app-config: not JSON: '%s'", app_config);
    }
    json_object_object_add(req, "app_config", c);
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
      return ctl_usage_err("--selector: expected k=v[,k=v...], got '%s'",
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
int ctl_service_create(struct ctl *t, int argc, char **argv) {
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
  if (rc == EX_OK && !ctl_scan_cmd(create_tab, &o, n_rest, rest, &scan, &rc)) {
    rc = create_body(&o, scan.given, backends, n_backends, &body);
    lynx_opts_free(create_tab, &o);
  }
  free(rest);
  free(backends);
  if (rc != EX_OK || !body)
    return rc; /* (--help: EX_OK, no body) */
  rc = ctl_api(t, "POST", "/v1/services", body, &resp, &raw);
  free(body);
  if (rc == EX_OK)
    rc = print_service_created(t, resp, raw);
  json_object_put(resp);
  free(raw);
  return rc;
}
