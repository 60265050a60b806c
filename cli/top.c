/*
 * top.c - lynxctl top's model: frames of accelerators read from the API's
 * JSON, their rates, their order, and their text (top.h).
 *
 * Pure: JSON in, text out, no I/O but the FILE batch mode writes to, no
 * clock (a frame's time is given). Rows are kept by value in one array,
 * sorted by id; the view is an array of pointers into it, so that a new
 * sort key moves pointers, not rows.
 */
#include <errno.h>
#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>

#include "top.h"
#include "util.h"

static const char *const nstate_names[LYNX_TOP_NSTATES] = {
    [LYNX_TOP_READY] = "ready",     [LYNX_TOP_DRAINING] = "draining",
    [LYNX_TOP_DRAINED] = "drained", [LYNX_TOP_DOWN] = "down",
    [LYNX_TOP_OTHER] = "?",
};

static const char *const key_names[] = {
    [LYNX_TOP_BY_RATE] = "rate",
    [LYNX_TOP_BY_OUTSTANDING] = "outstanding",
    [LYNX_TOP_BY_P99] = "p99",
    [LYNX_TOP_BY_ID] = "id",
};

void lynx_top_frame_init(struct lynx_top_frame *f) { memset(f, 0, sizeof(*f)); }

void lynx_top_frame_free(struct lynx_top_frame *f) {
  free(f->rows);
  free(f->view);
  lynx_top_frame_init(f);
}

/* ---- reading the API's answers ----------------------------------------- */

uint64_t lynx_top_u64(struct json_object *o, const char *key) {
  struct json_object *v;
  if (!o || !json_object_object_get_ex(o, key, &v) ||
      !json_object_is_type(v, json_type_int))
    return 0;
  return json_object_get_uint64(v);
}

int lynx_top_bool(struct json_object *o, const char *key) {
  struct json_object *v;
  return o && json_object_object_get_ex(o, key, &v) &&
         json_object_is_type(v, json_type_boolean) &&
         json_object_get_boolean(v);
}

/* The string at key, or NULL. */
static const char *get_str(struct json_object *o, const char *key) {
  struct json_object *v;
  if (!o || !json_object_object_get_ex(o, key, &v) ||
      !json_object_is_type(v, json_type_string))
    return NULL;
  return json_object_get_string(v);
}

static void copy_str(char *dst, size_t n, const char *s) {
  snprintf(dst, n, "%s", s ? s : "");
}

/* answer's "items" array, or NULL */
static struct json_object *items_of(struct json_object *answer) {
  struct json_object *items;
  if (!answer || !json_object_object_get_ex(answer, "items", &items) ||
      !json_object_is_type(items, json_type_array))
    return NULL;
  return items;
}

static enum lynx_top_nstate nstate_parse(const char *s) {
  for (int i = 0; s && i < LYNX_TOP_OTHER; i++)
    if (strcmp(s, nstate_names[i]) == 0)
      return (enum lynx_top_nstate)i;
  return LYNX_TOP_OTHER;
}

void lynx_top_health_parse(struct json_object *o, struct lynx_top_health *h) {
  memset(h, 0, sizeof(*h));
  h->dispatchable = lynx_top_bool(o, "dispatchable");
  h->lost = lynx_top_bool(o, "device_lost");
  h->failed = lynx_top_bool(o, "failed");
  h->stalled_mqueues = (uint32_t)lynx_top_u64(o, "stalled_mqueues");
  h->stall_ms = lynx_top_u64(o, "stall_ms");
  copy_str(h->last_error, sizeof(h->last_error), get_str(o, "last_error"));
}

/* A new row at the end of f->rows, zeroed; NULL when out of memory. */
static struct lynx_top_row *row_new(struct lynx_top_frame *f) {
  if (f->n == f->cap) {
    size_t cap = f->cap ? f->cap * 2 : 256;
    struct lynx_top_row *r = realloc(f->rows, cap * sizeof(*r));
    if (!r)
      return NULL;
    f->rows = r;
    f->cap = cap;
  }
  memset(&f->rows[f->n], 0, sizeof(f->rows[0]));
  return &f->rows[f->n++];
}

/* Accelerator a of node (id, state, epoch) into a new row. 0, -EINVAL (no
 * "node/index" id: skipped) or -ENOMEM. */
static int add_accel(struct lynx_top_frame *f, const char *node,
                     enum lynx_top_nstate state, uint64_t epoch,
                     uint64_t age_ms, uint64_t sampled_ns,
                     struct json_object *a) {
  const char *id = get_str(a, "id"), *slash;
  struct json_object *health = NULL, *lat = NULL;
  struct lynx_top_row *r;
  uint64_t idx;
  if (!id || !(slash = strrchr(id, '/')) ||
      lynx_parse_u64(slash + 1, 0, UINT32_MAX, &idx))
    return -EINVAL;
  if (!(r = row_new(f)))
    return -ENOMEM;
  copy_str(r->node, sizeof(r->node), node);
  r->idx = (uint32_t)idx;
  r->state = state;
  r->epoch = epoch;
  copy_str(r->kind, sizeof(r->kind), get_str(a, "kind"));
  copy_str(r->model, sizeof(r->model), get_str(a, "model"));
  r->requests = lynx_top_u64(a, "requests");
  r->beat_age_ms = age_ms;
  r->sampled_ns = sampled_ns;
  r->rate = -1;
  json_object_object_get_ex(a, "health", &health);
  lynx_top_health_parse(health, &r->health);
  if (json_object_object_get_ex(a, "latency", &lat)) {
    r->window_requests = lynx_top_u64(lat, "window_requests");
    r->queue_p99_ns = lynx_top_u64(lat, "queue_p99_ns");
    r->service_p99_ns = lynx_top_u64(lat, "service_p99_ns");
  }
  f->dispatchable += r->health.dispatchable && state == LYNX_TOP_READY;
  f->stalled += r->health.stalled_mqueues > 0;
  f->broken += r->health.lost || r->health.failed;
  return 0;
}

int lynx_top_add_nodes(struct lynx_top_frame *f, struct json_object *answer) {
  struct json_object *items = items_of(answer), *v;
  size_t len;
  if (!items)
    return -EINVAL;
  if (!f->have_version && json_object_object_get_ex(answer, "version", &v)) {
    f->version = json_object_get_uint64(v);
    f->have_version = 1;
  }
  len = json_object_array_length(items);
  for (size_t i = 0; i < len; i++) {
    struct json_object *node = json_object_array_get_idx(items, i), *accels;
    const char *id = get_str(node, "id");
    enum lynx_top_nstate state;
    uint64_t epoch, age_ms, ago_ns;
    uint64_t at = f->page_at_ns ? f->page_at_ns : f->at_ns;
    size_t na;
    if (!id)
      continue;
    state = nstate_parse(get_str(node, "state"));
    epoch = lynx_top_u64(node, "epoch");
    /* its counters came with its last heartbeat, that long before the
     * list was encoded (about when this page was asked for) */
    age_ms = lynx_top_u64(node, "last_heartbeat_ms");
    ago_ns = age_ms * 1000000u;
    f->nodes[state]++;
    if (!json_object_object_get_ex(node, "accelerators", &accels) ||
        !json_object_is_type(accels, json_type_array))
      continue;
    na = json_object_array_length(accels);
    for (size_t k = 0; k < na; k++)
      if (add_accel(f, id, state, epoch, age_ms, at > ago_ns ? at - ago_ns : 0,
                    json_object_array_get_idx(accels, k)) == -ENOMEM)
        return -ENOMEM;
  }
  return 0;
}

/* by id: node id, then index as a number */
static int id_cmp(const char *na, uint32_t ia, const char *nb, uint32_t ib) {
  int c = strcmp(na, nb);
  if (c)
    return c;
  return ia < ib ? -1 : ia > ib;
}

static int row_id_cmp(const void *a, const void *b) {
  const struct lynx_top_row *x = a, *y = b;
  return id_cmp(x->node, x->idx, y->node, y->idx);
}

int lynx_top_index(struct lynx_top_frame *f) {
  const struct lynx_top_row **view;
  /* pages come in id order, the accelerators of a node in the agent's:
   * nearly sorted, which qsort does not mind */
  qsort(f->rows, f->n, sizeof(f->rows[0]), row_id_cmp);
  view = realloc(f->view, (f->n ? f->n : 1) * sizeof(*view));
  if (!view)
    return -ENOMEM;
  f->view = view;
  for (size_t i = 0; i < f->n; i++)
    view[i] = &f->rows[i];
  return 0;
}

/* The row of accelerator (node, idx), or NULL: binary search. */
static struct lynx_top_row *row_find(struct lynx_top_frame *f, const char *node,
                                     uint32_t idx) {
  size_t lo = 0, hi = f->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = id_cmp(f->rows[mid].node, f->rows[mid].idx, node, idx);
    if (c == 0)
      return &f->rows[mid];
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return NULL;
}

int lynx_top_add_mqueues(struct lynx_top_frame *f, struct json_object *answer) {
  struct json_object *items = items_of(answer);
  size_t len;
  if (!items)
    return -EINVAL;
  len = json_object_array_length(items);
  for (size_t i = 0; i < len; i++) {
    struct json_object *mq = json_object_array_get_idx(items, i), *a;
    const char *node = get_str(mq, "node");
    struct lynx_top_row *r;
    if (!node || !json_object_object_get_ex(mq, "accel", &a) ||
        !json_object_is_type(a, json_type_int))
      continue;
    r = row_find(f, node, (uint32_t)json_object_get_uint64(a));
    if (r)
      r->outstanding += lynx_top_u64(mq, "outstanding");
  }
  return 0;
}

int lynx_top_add_frontends(struct lynx_top_frame *f,
                           struct json_object *answer) {
  struct json_object *items = items_of(answer);
  size_t len;
  if (!items)
    return -EINVAL;
  len = json_object_array_length(items);
  for (size_t i = 0; i < len; i++) {
    struct json_object *fe = json_object_array_get_idx(items, i);
    if (!lynx_top_bool(fe, "connected"))
      continue;
    f->frontends++;
    f->frontends_active += lynx_top_bool(fe, "active");
  }
  return 0;
}

/* Heartbeats closer than this are one: the API says their age in ms. */
#define SAME_BEAT_NS 1000000u

/* The row of prev for r, or NULL; *j walks prev in id order as r walks
 * the rows of its frame in id order. */
static const struct lynx_top_row *prev_row(const struct lynx_top_frame *prev,
                                           const struct lynx_top_row *r,
                                           size_t *j) {
  int c = 1;
  while (*j < prev->n && (c = id_cmp(prev->rows[*j].node, prev->rows[*j].idx,
                                     r->node, r->idx)) < 0)
    (*j)++;
  return *j < prev->n && c == 0 ? &prev->rows[*j] : NULL;
}

/* Whether f is the encoding of the list prev was read from, read again
 * within its second: every heartbeat age and counter as they were. Per
 * accelerator that says little (an idle one's counter stays, and two ages
 * agree to the ms one time in a few hundred), over a whole list a lot. */
static int same_encoding(const struct lynx_top_frame *f,
                         const struct lynx_top_frame *prev) {
  size_t j = 0;
  if (f->n != prev->n || !f->n)
    return 0;
  for (size_t i = 0; i < f->n; i++) {
    const struct lynx_top_row *r = &f->rows[i], *p = prev_row(prev, r, &j);
    if (!p || p->beat_age_ms != r->beat_age_ms || p->requests != r->requests)
      return 0;
  }
  return 1;
}

void lynx_top_rates(struct lynx_top_frame *f,
                    const struct lynx_top_frame *prev) {
  size_t j = 0;
  int again = prev && same_encoding(f, prev);
  f->rate_sum = 0;
  f->rates_known = 0;
  for (size_t i = 0; i < f->n; i++) {
    struct lynx_top_row *r = &f->rows[i];
    const struct lynx_top_row *p = prev ? prev_row(prev, r, &j) : NULL;
    r->rate = -1;
    if (!p || p->epoch != r->epoch || r->requests < p->requests)
      continue; /* new, or the agent restarted: its counters did */
    if (again || r->sampled_ns < p->sampled_ns + SAME_BEAT_NS) {
      /* the same heartbeat as last frame's: the same encoding of the list
       * again, or no heartbeat since (a refresh shorter than the heartbeat
       * period). Nothing new to divide; a down node's rate is not known
       * any more. */
      if (r->state != LYNX_TOP_DOWN)
        r->rate = p->rate;
    } else {
      r->rate = (double)(r->requests - p->requests) /
                ((double)(r->sampled_ns - p->sampled_ns) / 1e9);
    }
    if (r->rate >= 0) {
      f->rate_sum += r->rate;
      f->rates_known++;
    }
  }
}

/* ---- order --------------------------------------------------------------- */

static int view_id_cmp(const void *a, const void *b) {
  const struct lynx_top_row *x = *(const struct lynx_top_row *const *)a,
                            *y = *(const struct lynx_top_row *const *)b;
  return id_cmp(x->node, x->idx, y->node, y->idx);
}

/* descending by a value, unknown (has == 0) last, then by id */
static int desc_cmp(int hx, double x, int hy, double y,
                    const struct lynx_top_row *rx,
                    const struct lynx_top_row *ry) {
  if (hx != hy)
    return hx ? -1 : 1;
  if (hx && x != y)
    return x > y ? -1 : 1;
  return id_cmp(rx->node, rx->idx, ry->node, ry->idx);
}

static int view_rate_cmp(const void *a, const void *b) {
  const struct lynx_top_row *x = *(const struct lynx_top_row *const *)a,
                            *y = *(const struct lynx_top_row *const *)b;
  return desc_cmp(x->rate >= 0, x->rate, y->rate >= 0, y->rate, x, y);
}

static int view_outstanding_cmp(const void *a, const void *b) {
  const struct lynx_top_row *x = *(const struct lynx_top_row *const *)a,
                            *y = *(const struct lynx_top_row *const *)b;
  return desc_cmp(1, (double)x->outstanding, 1, (double)y->outstanding, x, y);
}

static int view_p99_cmp(const void *a, const void *b) {
  const struct lynx_top_row *x = *(const struct lynx_top_row *const *)a,
                            *y = *(const struct lynx_top_row *const *)b;
  return desc_cmp(x->window_requests > 0, (double)x->service_p99_ns,
                  y->window_requests > 0, (double)y->service_p99_ns, x, y);
}

void lynx_top_sort(struct lynx_top_frame *f, enum lynx_top_key key) {
  int (*cmp)(const void *, const void *) =
      key == LYNX_TOP_BY_RATE          ? view_rate_cmp
      : key == LYNX_TOP_BY_OUTSTANDING ? view_outstanding_cmp
      : key == LYNX_TOP_BY_P99         ? view_p99_cmp
                                       : view_id_cmp;
  if (f->view)
    qsort(f->view, f->n, sizeof(f->view[0]), cmp);
}

int lynx_top_key_parse(const char *s, enum lynx_top_key *key) {
  for (size_t i = 0; i < LYNX_ARRAY_SIZE(key_names); i++)
    if (strcmp(s, key_names[i]) == 0) {
      *key = (enum lynx_top_key)i;
      return 0;
    }
  return -EINVAL;
}

const char *lynx_top_key_name(enum lynx_top_key key) {
  return (size_t)key < LYNX_ARRAY_SIZE(key_names) ? key_names[key] : "?";
}

/* ---- text ---------------------------------------------------------------- */

void lynx_top_fmt_dur(uint64_t ns, char *out, size_t n) {
  if (ns < 1000)
    snprintf(out, n, "%lluns", (unsigned long long)ns);
  else if (ns < 1000000)
    snprintf(out, n, "%.1fus", (double)ns / 1e3);
  else if (ns < 1000000000)
    snprintf(out, n, "%.2fms", (double)ns / 1e6);
  else
    snprintf(out, n, "%.2fs", (double)ns / 1e9);
}

void lynx_top_fmt_rate(double rate, char *out, size_t n) {
  /* the unit moves on where the rounded text would reach 1000.0 */
  if (rate < 0)
    snprintf(out, n, "-");
  else if (rate < 999.95)
    snprintf(out, n, "%.1f", rate);
  else if (rate < 999950.0)
    snprintf(out, n, "%.1fk", rate / 1e3);
  else
    snprintf(out, n, "%.2fM", rate / 1e6);
}

void lynx_top_health_fmt(const struct lynx_top_health *h, char *out, size_t n) {
  size_t l = 0;
  if (h->dispatchable) {
    snprintf(out, n, "ok");
    return;
  }
  out[0] = 0;
  if (h->lost)
    l = lynx_appendf(out, n, l, ", ", "lost");
  if (h->failed)
    l = lynx_appendf(out, n, l, ", ", "failed%s%.80s",
                     h->last_error[0] ? ": " : "", h->last_error);
  if (h->stalled_mqueues)
    lynx_appendf(out, n, l, ", ", "stalled %llu mq %.1fs",
                 (unsigned long long)h->stalled_mqueues,
                 (double)h->stall_ms / 1000.0);
  if (!out[0])
    snprintf(out, n, "out");
}

void lynx_top_row_health(const struct lynx_top_row *r, char *out, size_t n) {
  lynx_top_health_fmt(&r->health, out, n);
  if (r->state == LYNX_TOP_READY)
    return;
  if (strcmp(out, "ok") == 0)
    out[0] = 0;
  lynx_appendf(out, n, strlen(out), ", ", "node %s", nstate_names[r->state]);
}

static int max_i(int a, size_t b) { return (size_t)a > b ? a : (int)b; }

void lynx_top_layout(const struct lynx_top_frame *f,
                     struct lynx_top_layout *lay) {
  lay->id = 2;    /* ID */
  lay->state = 5; /* STATE */
  lay->kind = 4;  /* KIND */
  lay->model = 5; /* MODEL */
  for (size_t i = 0; i < f->n; i++) {
    const struct lynx_top_row *r = &f->rows[i];
    char idx[16];
    size_t il = (size_t)snprintf(idx, sizeof(idx), "%u", r->idx);
    lay->id = max_i(lay->id, strlen(r->node) + 1 + il);
    lay->state = max_i(lay->state, strlen(nstate_names[r->state]));
    lay->kind = max_i(lay->kind, strlen(r->kind));
    lay->model = max_i(lay->model, strlen(r->model));
  }
}

/* the numeric columns' widths: their names', which every value fits
 * (RATE at most "999.9k", a duration at most "999.99ms") but an absurd
 * one, which then only shifts the rest of its line */
#define W_RATE 7
#define W_OUT 11
#define W_QP99 9
#define W_SP99 11

void lynx_top_header(const struct lynx_top_frame *f, const char *api,
                     enum lynx_top_key key, const char *clock, int i, char *out,
                     size_t n) {
  size_t total = 0, l;
  char rate[32];
  for (int s = 0; s < LYNX_TOP_NSTATES; s++)
    total += f->nodes[s];
  switch (i) {
  case 0:
    if (f->have_version)
      snprintf(out, n, "lynxctl top: %s  registry version %llu  %s  sort: %s",
               api, (unsigned long long)f->version, clock,
               lynx_top_key_name(key));
    else
      snprintf(out, n, "lynxctl top: %s  %s  sort: %s", api, clock,
               lynx_top_key_name(key));
    break;
  case 1:
    l = (size_t)snprintf(out, n,
                         "nodes: %zu total, %u ready, %u draining, %u "
                         "drained, %u down",
                         total, f->nodes[LYNX_TOP_READY],
                         f->nodes[LYNX_TOP_DRAINING],
                         f->nodes[LYNX_TOP_DRAINED], f->nodes[LYNX_TOP_DOWN]);
    if (f->nodes[LYNX_TOP_OTHER] && l < n)
      lynx_appendf(out, n, l, ", ", "%u in another state",
                   f->nodes[LYNX_TOP_OTHER]);
    break;
  case 2:
    snprintf(out, n,
             "accelerators: %zu total, %u dispatchable, %u stalled, %u lost "
             "or failed",
             f->n, f->dispatchable, f->stalled, f->broken);
    break;
  case 3:
    lynx_top_fmt_rate(f->rates_known ? f->rate_sum : -1, rate, sizeof(rate));
    snprintf(out, n, "frontends: %u connected, %u active  requests/s: %s",
             f->frontends, f->frontends_active, rate);
    break;
  default:
    out[0] = 0;
  }
}

void lynx_top_columns(const struct lynx_top_layout *lay, char *out, size_t n) {
  snprintf(out, n, "%-*s  %-*s  %-*s  %-*s  %-*s  %-*s  %-*s  %-*s  HEALTH",
           lay->id, "ID", lay->state, "STATE", lay->kind, "KIND", lay->model,
           "MODEL", W_RATE, "RATE", W_OUT, "OUTSTANDING", W_QP99, "QUEUE-P99",
           W_SP99, "SERVICE-P99");
}

void lynx_top_row_text(const struct lynx_top_layout *lay,
                       const struct lynx_top_row *r, char *out, size_t n) {
  char id[LYNX_TOP_TEXT_MAX + 16], rate[32], qp[32], sp[32];
  char health[LYNX_TOP_ERR_MAX + 96];
  snprintf(id, sizeof(id), "%s/%u", r->node, r->idx);
  lynx_top_fmt_rate(r->rate, rate, sizeof(rate));
  if (r->window_requests) {
    lynx_top_fmt_dur(r->queue_p99_ns, qp, sizeof(qp));
    lynx_top_fmt_dur(r->service_p99_ns, sp, sizeof(sp));
  } else {
    snprintf(qp, sizeof(qp), "-"); /* no request in the window */
    snprintf(sp, sizeof(sp), "-");
  }
  lynx_top_row_health(r, health, sizeof(health));
  snprintf(out, n, "%-*s  %-*s  %-*s  %-*s  %-*s  %-*llu  %-*s  %-*s  %s",
           lay->id, id, lay->state, nstate_names[r->state], lay->kind,
           r->kind[0] ? r->kind : "-", lay->model, r->model[0] ? r->model : "-",
           W_RATE, rate, W_OUT, (unsigned long long)r->outstanding, W_QP99, qp,
           W_SP99, sp, health);
}

int lynx_top_print(FILE *out, const struct lynx_top_frame *f, const char *api,
                   enum lynx_top_key key, const char *clock) {
  struct lynx_top_layout lay;
  char line[1024];
  lynx_top_layout(f, &lay);
  for (int i = 0; i < LYNX_TOP_HEADER_LINES; i++) {
    lynx_top_header(f, api, key, clock, i, line, sizeof(line));
    fprintf(out, "%s\n", line);
  }
  lynx_top_columns(&lay, line, sizeof(line));
  fprintf(out, "%s\n", line);
  for (size_t i = 0; i < f->n; i++) {
    lynx_top_row_text(&lay, f->view ? f->view[i] : &f->rows[i], line,
                      sizeof(line));
    fprintf(out, "%s\n", line);
  }
  fputc('\n', out);
  return fflush(out) || ferror(out) ? -EIO : 0;
}
