/*
 * cmd_service.c - lynxctl's commands on services and their mqueues: the
 * lists (services, mqueues), service show and service delete; service
 * create, which builds a spec from options, is cmd_service_create.c.
 *
 * service show reads two answers: the service (its fields, its back ends,
 * its instance counts) and /v1/mqueues, the only list that says where
 * each ready instance runs, whose mqueues it folds into a row per
 * instance. The service is printed before the second call is made, so
 * that a coordinator lost between the two still shows what it said.
 */
#include <errno.h>
#include <json-c/json.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lynxctl.h"
#include "util.h"

/* ---- tables ------------------------------------------------------------- */

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
      ctl_f_labels(sel, s, sizeof(s));
      snprintf(out + w, n - (size_t)w, " where %s", s);
    }
    return;
  }
  ctl_f_str(v, out, n);
}

static void f_instances(struct json_object *v, char *out, size_t n) {
  struct json_object *r, *w;
  if (v && json_object_is_type(v, json_type_object) &&
      json_object_object_get_ex(v, "ready", &r) &&
      json_object_object_get_ex(v, "wanted", &w))
    snprintf(out, n, "%s/%s", json_object_get_string(r),
             json_object_get_string(w));
  else
    ctl_f_str(v, out, n);
}

/* A service's framing: "len32", "fixed:N"; "-" for udp (none). */
static void f_framing(struct json_object *v, char *out, size_t n) {
  struct json_object *fx;
  if (v && json_object_is_type(v, json_type_object) &&
      json_object_object_get_ex(v, "fixed", &fx))
    snprintf(out, n, "fixed:%s", json_object_get_string(fx));
  else
    ctl_f_str(v, out, n);
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

static const struct col mq_cols[] = {
    {"ID", "id", ctl_f_str},
    {"SERVICE", "service", ctl_f_str},
    {"NODE", "node", ctl_f_str},
    {"ACCEL", "accel", ctl_f_str},
    {"INSTANCE", "instance", ctl_f_str},
    {"SLOTS", "slots", ctl_f_str},
    {"SLOT-SIZE", "slot_size", ctl_f_str},
    {"TRANSPORT", "transport", ctl_f_str},
    {"FRONTEND", "frontend", ctl_f_str},
    {"DISPATCHED", "dispatched", ctl_f_str},
    {"RESPONDED", "responded", ctl_f_str},
    {"OUTSTANDING", "outstanding", ctl_f_str},
    {"DISPATCH", "dispatchable", ctl_f_bool},
    {NULL, NULL, NULL},
};

const struct col ctl_svc_cols[] = {
    {"NAME", "name", ctl_f_str},
    {"PROTO", "proto", ctl_f_str},
    {"FRAMING", "framing", f_framing},
    {"PORT", "port", ctl_f_str},
    {"APP", "app", ctl_f_str},
    {"SLOT-SIZE", "slot_size", ctl_f_str},
    {"SLOTS", "slots", ctl_f_str},
    {"MQUEUES", "mqueues_per_accel", ctl_f_str},
    {"WORK-US", "work_us", ctl_f_str},
    {"BACKENDS", "backends", f_backends},
    {"PLACEMENT", "placement", f_placement},
    {"INSTANCES", "instances", f_instances},
    {"STATE", "state", ctl_f_str},
    {"REASON", "reason", ctl_f_str},
    {NULL, NULL, NULL},
};

/* ---- service show ------------------------------------------------------ */

static const struct col backend_cols[] = {
    {"BACKEND", "name", ctl_f_str},
    {"ADDRESS", "address", ctl_f_str},
    {"PROTO", "proto", ctl_f_str},
    {NULL, NULL, NULL},
};

/* the rows service show makes of /v1/mqueues: one per instance */
static const struct col inst_cols[] = {
    {"INSTANCE", "instance", ctl_f_str},
    {"NODE", "node", ctl_f_str},
    {"ACCEL", "accel", ctl_f_str},
    {"MQUEUES", "mqueues", ctl_f_str},
    {"TRANSPORT", "transport", ctl_f_str},
    {"FRONTEND", "frontend", ctl_f_str_dash},
    {"DISPATCH", "dispatchable", ctl_f_bool},
    {"DISPATCHED", "dispatched", ctl_f_str},
    {"RESPONDED", "responded", ctl_f_str},
    {"OUTSTANDING", "outstanding", ctl_f_str},
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
    int l = snprintf(out, n, "%s ready of %s wanted", json_object_get_string(r),
                     json_object_get_string(w));
    if (l > 0 && (size_t)l < n &&
        json_object_object_get_ex(v, "failed_starts", &fs))
      snprintf(out + l, n - (size_t)l, ", %s failed start(s)",
               json_object_get_string(fs));
  } else {
    ctl_f_str(v, out, n);
  }
}

static uint64_t u64_of(struct json_object *o, const char *key) {
  struct json_object *v;
  return json_object_object_get_ex(o, key, &v) ? json_object_get_uint64(v) : 0;
}

/* The ready instances of service name, from the items of /v1/mqueues: a
 * row each into rows, in the order they come (an instance's mqueues come
 * one after another; by_id finds its row when they do not). */
static int instance_rows(struct json_object *items, const char *name,
                         struct json_object *rows) {
  static const char *const keys[] = {"instance", "node", "accel", "transport",
                                     "frontend"};
  static const char *const sums[] = {"dispatched", "responded", "outstanding"};
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
      json_object_object_add(last, "dispatchable", json_object_new_boolean(0));
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
      json_object_object_add(last, "dispatchable", json_object_new_boolean(1));
  }
  json_object_put(by_id);
  return 0;
}

/* service show NAME: the service's fields, its back ends, and where its
 * ready instances run (/v1/mqueues); --json: the service as the API has
 * it. */
int ctl_service_show(struct ctl *t, const char *name) {
  char path[1024], msg[MSG_MAX];
  struct json_object *j = NULL, *mqs = NULL, *v, *items, *rows;
  char *raw = NULL, *mraw = NULL;
  int rc;

  if (ctl_path_with(t, path, sizeof(path), "/v1/services/", name, ""))
    return EX_API;
  rc = ctl_api(t, "GET", path, NULL, &j, &raw);
  if (rc || ctl_stop) {
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
  show_field(j, "name", "name", ctl_f_str, NULL);
  show_field(j, "state", "state", ctl_f_str, NULL);
  show_field(j, "reason", "reason", ctl_f_str_dash, NULL);
  show_field(j, "proto", "proto", ctl_f_str, NULL);
  show_field(j, "framing", "framing", f_framing, NULL);
  show_field(j, "port", "port", ctl_f_str, NULL);
  show_field(j, "app", "app", ctl_f_str, NULL);
  show_field(j, "app-config", "app_config", ctl_f_str, NULL);
  show_field(j, "slot-size", "slot_size", ctl_f_str, " bytes");
  show_field(j, "slots", "slots", ctl_f_str, " per ring");
  show_field(j, "msg-max", "msg_max", ctl_f_str, " bytes");
  show_field(j, "mqueues", "mqueues_per_accel", ctl_f_str, " per accelerator");
  show_field(j, "work-us", "work_us", ctl_f_str, NULL);
  show_field(j, "placement", "placement", f_placement, NULL);
  show_field(j, "instances", "instances", f_inst_long, NULL);
  if (json_object_object_get_ex(j, "backends", &v) &&
      json_object_is_type(v, json_type_array) &&
      json_object_array_length(v) > 0) {
    printf("%-12s %zu\n\n", "backends:", json_object_array_length(v));
    ctl_print_table(stdout, v, backend_cols);
  } else {
    printf("%-12s %s\n", "backends:", "none");
  }
  fflush(stdout);

  /* where they run: the API's service has counts only; /v1/mqueues lists
   * every mqueue of every ready instance */
  rc =
      ctl_api_msg(t, "GET", "/v1/mqueues", NULL, &mqs, &mraw, msg, sizeof(msg));
  free(mraw);
  if (rc == EX_OK && !ctl_stop &&
      (!mqs || !json_object_object_get_ex(mqs, "items", &items) ||
       !json_object_is_type(items, json_type_array))) {
    snprintf(msg, sizeof(msg),
             "the coordinator's answer to GET /v1/mqueues "
             "has no \"items\"");
    rc = EX_API;
  }
  if (rc != EX_OK) {
    fprintf(stderr,
            "lynxctl: where service %s's instances run is unknown: "
            "%s\n",
            name, msg);
    json_object_put(mqs);
    json_object_put(j);
    return rc;
  }
  if (ctl_stop) {
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
    ctl_print_table(stdout, rows, inst_cols);
  }
  json_object_put(rows);
  json_object_put(mqs);
  json_object_put(j);
  return rc;
}

/* ---- the commands ------------------------------------------------------- */

int ctl_cmd_services(struct ctl *t, int argc, char **argv) {
  (void)argc;
  (void)argv;
  return ctl_list(t, "/v1/services", ctl_svc_cols);
}

int ctl_cmd_mqueues(struct ctl *t, int argc, char **argv) {
  (void)argc;
  (void)argv;
  return ctl_list(t, "/v1/mqueues", mq_cols);
}
