/*
 * output.c - how lynxctl prints what the API answered: aligned tables of
 * a list's items, a line for a change, or with --json the answer as it
 * came.
 *
 * A table is an array of columns (struct col, lynxctl.h): a heading, the
 * key it shows and a formatter that turns the item's value into a cell.
 * The formatters every family uses are here; those of one family's
 * resources live in its file (cmd_node.c, cmd_service.c). Cells are cut
 * at 511 bytes; a column is as wide as its widest cell.
 */
#include <errno.h>
#include <json-c/json.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lynxctl.h"
#include "util.h"

void ctl_f_str(struct json_object *v, char *out, size_t n) {
  if (!v || json_object_is_type(v, json_type_null))
    snprintf(out, n, "-");
  else
    snprintf(out, n, "%s", json_object_get_string(v));
}

void ctl_f_labels(struct json_object *v, char *out, size_t n) {
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

void ctl_f_ms_ago(struct json_object *v, char *out, size_t n) {
  uint64_t ms;
  if (!v || !(json_object_is_type(v, json_type_int) ||
              json_object_is_type(v, json_type_double))) {
    ctl_f_str(v, out, n);
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

void ctl_f_bool(struct json_object *v, char *out, size_t n) {
  if (v && json_object_is_type(v, json_type_boolean))
    snprintf(out, n, "%s", json_object_get_boolean(v) ? "yes" : "no");
  else
    ctl_f_str(v, out, n);
}

/* "-" for an absent or empty string (a cpu accelerator's pci_bus_id). */
void ctl_f_str_dash(struct json_object *v, char *out, size_t n) {
  if (v && json_object_is_type(v, json_type_string) &&
      json_object_get_string_len(v) == 0)
    snprintf(out, n, "-");
  else
    ctl_f_str(v, out, n);
}

/* Prints items (a JSON array of objects) as an aligned table. */
int ctl_print_table(FILE *f, struct json_object *items,
                    const struct col *cols) {
  size_t nc = 0, nr, w[16] = {0};
  char **cells;
  char cell[512];

  while (nc < LYNX_ARRAY_SIZE(w) && cols[nc].head)
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

int ctl_list(struct ctl *t, const char *path, const struct col *cols) {
  struct json_object *j, *items = NULL;
  char *raw;
  int rc = ctl_api(t, "GET", path, NULL, &j, &raw);
  if (rc)
    return rc;
  if (t->json) {
    fputs(raw ? raw : "", stdout);
  } else {
    if (!j || !json_object_object_get_ex(j, "items", &items)) {
      fprintf(stderr, "lynxctl: the coordinator's answer has no \"items\"\n");
      rc = EX_API;
    } else if (ctl_print_table(stdout, items, cols)) {
      rc = EX_API;
    }
  }
  json_object_put(j);
  free(raw);
  return rc;
}

/* DELETE / POST on one object; prints `done` (with the object's state when
 * it has one) or the raw answer with --json. */
int ctl_object(struct ctl *t, const char *method, const char *prefix,
               const char *id, const char *suffix, const char *what,
               const char *done) {
  char path[1024];
  struct json_object *j, *state;
  char *raw;
  int rc;
  if (ctl_path_with(t, path, sizeof(path), prefix, id, suffix))
    return EX_API;
  rc = ctl_api(t, method, path, NULL, &j, &raw);
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
