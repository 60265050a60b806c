/*
 * cmd_node.c - lynxctl's commands on nodes and their accelerators: the
 * lists (nodes, accelerators), node drain [--wait], undrain and forget.
 *
 * The node table is watch's too (ctl_node_cols). An accelerator's health
 * is said in the words of top's HEALTH column (top.c), and a node's row
 * names the accelerators that are not healthy. node drain --wait follows
 * the registry's changes (/v1/watch, cmd_watch.c) until the node is
 * drained, riding out coordinator restarts and leader changes: a
 * coordinator that cannot say how the node is now is asked again every
 * second, until the timeout.
 */
#include <errno.h>
#include <json-c/json.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lynxctl.h"
#include "options.h"
#include "top.h"
#include "util.h"

/* ---- tables ------------------------------------------------------------- */

static void f_count(struct json_object *v, char *out, size_t n) {
  if (v && json_object_is_type(v, json_type_array))
    snprintf(out, n, "%zu", json_object_array_length(v));
  else
    ctl_f_str(v, out, n);
}

static void f_bytes(struct json_object *v, char *out, size_t n) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double x;
  unsigned u = 0;
  if (!v || !json_object_is_type(v, json_type_int)) {
    ctl_f_str(v, out, n);
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

/* An accelerator's "health" object in a few words: "ok", "lost",
 * "failed: <last error>", "stalled 1 mq 2.3s", joined with ", " (top.c,
 * whose HEALTH column says the same). */
static void f_health(struct json_object *v, char *out, size_t n) {
  struct lynx_top_health h;
  if (!v || !json_object_is_type(v, json_type_object)) {
    ctl_f_str(v, out, n);
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
    ctl_f_str(v, out, n);
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

const struct col ctl_node_cols[] = {
    {"ID", "id", ctl_f_str},
    {"STATE", "state", ctl_f_str},
    {"ADDRESS", "address", ctl_f_str},
    {"EPOCH", "epoch", ctl_f_str},
    {"ACCELS", "accelerators", f_count},
    {"LABELS", "labels", ctl_f_labels},
    {"LAST-HEARTBEAT", "last_heartbeat_ms", ctl_f_ms_ago},
    {"HEALTH", "accelerators", f_node_health},
    {NULL, NULL, NULL},
};

static const struct col accel_cols[] = {
    {"ID", "id", ctl_f_str},
    {"NODE", "node", ctl_f_str},
    {"KIND", "kind", ctl_f_str},
    {"MODEL", "model", ctl_f_str},
    {"PCI-BUS", "pci_bus_id", ctl_f_str_dash},
    {"MEMORY", "memory_bytes", f_bytes},
    {"ORDERING", "ordering", ctl_f_str},
    {"STATE", "state", ctl_f_str},
    {"HEALTH", "health", f_health},
    {"REQUESTS", "requests", ctl_f_str},
    {"RESPONSES", "responses", ctl_f_str},
    {"QUEUE-P50/P99", "latency", f_lat_queue},
    {"SERVICE-P50/P99", "latency", f_lat_service},
    {NULL, NULL, NULL},
};

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
static int node_state_of(struct ctl *t, const char *path, char *st, size_t sz,
                         char *why, size_t whylen) {
  char err[ERR_MAX];
  struct buf b;
  long status = 0;
  struct json_object *j, *v;
  int rc = ctl_http_call(t, "GET", path, NULL, CALL_TIMEOUT_MS, &status, &b,
                         err, sizeof(err));
  st[0] = 0;
  if (rc == -EINTR)
    return EX_API;
  if (rc || status == 503 || status == 404) {
    snprintf(why, whylen, "%s",
             rc              ? err
             : status == 404 ? "it does not know the node (now)"
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
  if (ctl_api(t, "GET", "/v1/nodes?limit=1", NULL, &j, &raw) == EX_OK)
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
  if (ctl_scan_cmd(drain_tab, &c, argc - 1, argv + 1, &scan, &rc))
    return rc;
  errno = 0;
  timeout_s = strtod(c.timeout, &end);
  if (errno || end == c.timeout || *end || !(timeout_s > 0) ||
      timeout_s > 86400)
    rc = ctl_usage_err("node drain --timeout: expected seconds above 0, at "
                       "most 86400, got '%s'",
                       c.timeout);
  else if ((scan.given & 2) && !c.wait)
    rc = ctl_usage_err("node drain: --timeout goes with --wait");
  lynx_opts_free(drain_tab, &c);
  if (rc)
    return rc;
  rc = ctl_object(t, "POST", "/v1/nodes/", id, "/drain", "node",
                  "drain requested");
  if (rc || !c.wait)
    return rc;
  if (ctl_path_with(t, path, sizeof(path), "/v1/nodes/", id, ""))
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
        fprintf(stderr,
                "lynxctl: the coordinator at %s cannot say how node "
                "%s is (%s): asking every second\n",
                ctl_api_names(t), id, why);
      told = 1;
      if (lynx_now_ns() >= deadline || ctl_stop) {
        fprintf(stderr, "lynxctl: node %s not seen drained within %g s\n", id,
                timeout_s);
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
      fprintf(stderr,
              "lynxctl: node %s is %s, not draining: it will not "
              "be drained\n",
              id, st[0] ? st : "gone");
      return EX_API;
    }
    if (lynx_now_ns() >= deadline) {
      fprintf(stderr,
              "lynxctl: node %s still draining after %g s (the "
              "drain goes on; the coordinator's --drain-timeout-ms ends "
              "it)\n",
              id, timeout_s);
      return EX_API;
    }
    rc = ctl_watch_wait(t, version, deadline, &lost);
    if (rc)
      return rc;
  }
}

/* ---- the commands ------------------------------------------------------- */

int ctl_cmd_nodes(struct ctl *t, int argc, char **argv) {
  (void)argc;
  (void)argv;
  return ctl_list(t, "/v1/nodes", ctl_node_cols);
}

int ctl_cmd_accelerators(struct ctl *t, int argc, char **argv) {
  (void)argc;
  (void)argv;
  return ctl_list(t, "/v1/accelerators", accel_cols);
}

/* node drain ID [--wait [--timeout S]] | node undrain ID | node forget ID */
int ctl_cmd_node(struct ctl *t, int argc, char **argv) {
  const char *sub = argc > 1 ? argv[1] : NULL;

  if (sub && argc >= 3 && strcmp(sub, "drain") == 0)
    return cmd_node_drain(t, argc - 1, argv + 1);
  if (sub && argc == 3) {
    if (strcmp(sub, "undrain") == 0)
      return ctl_object(t, "POST", "/v1/nodes/", argv[2], "/undrain", "node",
                        "undrained");
    if (strcmp(sub, "forget") == 0)
      return ctl_object(t, "DELETE", "/v1/nodes/", argv[2], "", "node",
                        "forgotten");
  }
  return ctl_usage_err("node: expected 'drain ID', 'undrain ID' or "
                       "'forget ID'");
}
