/*
 * api_nodes.c - the API's nodes and accelerators: /v1/nodes,
 * /v1/accelerators, /v1/mqueues (whole lists cached while the registry's
 * version holds, or one page of them: ?limit=&after=), a node, and the
 * operator's drain, undrain and forget.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_internal.h"
#include "store.h"

/* Whether an encoding made at at_ms of registry version `version` must be
 * made again: the registry changed, or it is LIST_CACHE_MS old. */
static int cache_stale(const struct lynx_registry *r, uint64_t version,
                       uint64_t at_ms, uint64_t now) {
  return version != r->version || now - at_ms >= LIST_CACHE_MS;
}

/* Answers a big list from the cache, encoding it first when the registry
 * changed or the cached body is older than LIST_CACHE_MS. */
static void reply_list(struct http_req *rq, struct http_out *out, int which) {
  struct list_cache *lc = &rq->h->cache[which];
  struct lynx_registry *r = &rq->c->reg;
  uint64_t now = rq->c->now_ms();
  char *copy = NULL;
  size_t len = 0;
  pthread_mutex_lock(&rq->c->lock);
  if (!lc->body || cache_stale(r, lc->version, lc->at_ms, now)) {
    struct json_object *j = which == CACHE_NODES    ? lynx_json_nodes(r, now)
                            : which == CACHE_ACCELS ? lynx_json_accels(r, now)
                                                    : lynx_json_mqueues(r);
    const char *s =
        j ? json_object_to_json_string_ext(
                j, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE)
          : NULL;
    char *body = s ? malloc(strlen(s) + 2) : NULL;
    if (body) {
      size_t n = strlen(s);
      memcpy(body, s, n);
      body[n++] = '\n';
      body[n] = 0;
      free(lc->body);
      lc->body = body;
      lc->len = n;
      lc->version = r->version;
      lc->at_ms = now;
    }
    json_object_put(j);
  }
  if (lc->body && (copy = malloc(lc->len + 1)) != NULL) {
    memcpy(copy, lc->body, lc->len + 1);
    len = lc->len;
  }
  pthread_mutex_unlock(&rq->c->lock);
  if (!copy) {
    http_reply_oom(out);
    return;
  }
  out->status = 200;
  out->text = copy;
  out->text_len = len;
  out->ctype = "application/json";
}

#define PAGE_MAX 10000u /* the largest ?limit= */

/* lynx_json_each_by_id's callback: appends one item to a page cache. */
static void page_add(void *arg, const char *node, uint32_t idx,
                     struct json_object *o) {
  struct page_cache *pc = arg;
  const char *t =
      o ? json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN |
                                                JSON_C_TO_STRING_NOSLASHESCAPE)
        : NULL;
  size_t tl = t ? strlen(t) : 0;
  if (!t || pc->oom)
    goto out;
  if (pc->n + 2 > pc->n_cap) {
    size_t nc = pc->n_cap ? 2 * pc->n_cap : 256;
    size_t *off = realloc(pc->off, nc * sizeof(*off));
    struct page_key *key = off ? realloc(pc->key, nc * sizeof(*key)) : NULL;
    if (off)
      pc->off = off;
    if (!key)
      goto oom;
    pc->key = key;
    pc->n_cap = nc;
  }
  if (pc->len + tl + 2 > pc->cap) {
    char *b = lynx_grow(pc->body, &pc->cap, pc->len + tl + 2, 65536, 0);
    if (!b)
      goto oom;
    pc->body = b;
  }
  pc->off[pc->n] = pc->len;
  snprintf(pc->key[pc->n].node, sizeof(pc->key[pc->n].node), "%s", node);
  pc->key[pc->n].idx = idx;
  memcpy(pc->body + pc->len, t, tl);
  pc->len += tl;
  pc->body[pc->len++] = ',';
  pc->n++;
  pc->off[pc->n] = pc->len;
  goto out;
oom:
  pc->oom = 1;
out:
  json_object_put(o);
}

/* Whether item key k comes after `after` (node id, and with has_idx an
 * accelerator index on it; without, every accelerator of that node is
 * before). */
static int page_after(const struct page_key *k, const char *node, int has_idx,
                      uint32_t idx) {
  int c = strcmp(k->node, node);
  return c > 0 || (c == 0 && has_idx && k->idx > idx);
}

/* ?limit=N[&after=ID]: one page of a big list, cut from the id-ordered
 * encoding (rebuilt like the list's cache). 1 when answered, 0 when the
 * request asks for the whole list. */
static int reply_page(struct http_req *rq, struct http_out *out, int which) {
  const char *s_limit =
      MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "limit");
  const char *after =
      MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "after");
  struct page_cache *pc =
      &rq->h->pages[which == CACHE_NODES ? PAGES_NODES : PAGES_ACCELS];
  struct lynx_registry *r = &rq->c->reg;
  char node[LYNX_ID_MAX] = "", head[64], *text = NULL, *next = NULL;
  uint64_t limit, now = rq->c->now_ms(), idx = 0;
  size_t lo, hi, end, hl, nl = 0, len = 0;
  int has_idx = 0;
  if (!s_limit) {
    if (after)
      http_reply_err(out, 400, "invalid_argument",
                     "after: only with limit (a page of the list)");
    return after != NULL;
  }
  if (lynx_parse_u64(s_limit, 1, PAGE_MAX, &limit)) {
    http_reply_err(out, 400, "invalid_argument",
                   "limit: expected 1 to %u items, got '%.64s'", PAGE_MAX,
                   s_limit);
    return 1;
  }
  if (after && *after) {
    /* accelerators: "node/idx", or a node id (all of its are before) */
    const char *slash = which == CACHE_NODES ? NULL : strrchr(after, '/');
    size_t n = slash ? (size_t)(slash - after) : strlen(after);
    if (n >= sizeof(node) ||
        (slash && lynx_parse_u64(slash + 1, 0, UINT32_MAX, &idx))) {
      http_reply_err(out, 400, "invalid_argument",
                     "after: expected an id as a page's \"next\" gives it, got "
                     "'%.64s'",
                     after);
      return 1;
    }
    memcpy(node, after, n);
    node[n] = 0;
    has_idx = slash != NULL;
  }
  pthread_mutex_lock(&rq->c->lock);
  if (!pc->body || pc->oom || cache_stale(r, pc->version, pc->at_ms, now)) {
    pc->len = pc->n = 0;
    pc->oom = 0;
    if (lynx_json_each_by_id(r, now, which != CACHE_NODES, page_add, pc))
      pc->oom = 1;
    pc->version = r->version;
    pc->at_ms = now;
  }
  if (!pc->oom) {
    /* the first item after `after`: items are in key order */
    lo = 0;
    hi = pc->n;
    while (node[0] && lo < hi) {
      size_t mid = lo + (hi - lo) / 2;
      if (page_after(&pc->key[mid], node, has_idx, (uint32_t)idx))
        hi = mid;
      else
        lo = mid + 1;
    }
    end = pc->n - lo > limit ? lo + (size_t)limit : pc->n;
    if (end < pc->n) {
      /* more follow: "next" is the last item's id, JSON-escaped */
      char id[LYNX_ID_MAX + 16];
      struct json_object *js;
      if (which == CACHE_NODES)
        snprintf(id, sizeof(id), "%s", pc->key[end - 1].node);
      else
        snprintf(id, sizeof(id), "%s/%" PRIu32, pc->key[end - 1].node,
                 pc->key[end - 1].idx);
      js = json_object_new_string(id);
      next =
          js ? strdup(json_object_to_json_string_ext(
                   js, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE))
             : NULL;
      json_object_put(js);
      nl = next ? strlen(next) : 0;
    }
    hl = (size_t)snprintf(head, sizeof(head),
                          "{\"version\":%" PRIu64 ",\"items\":[", pc->version);
    /* the slice, less the comma after its last item */
    len = lo < end ? pc->off[end] - 1 - pc->off[lo] : 0;
    if (end == pc->n || next)
      text = malloc(hl + len + nl + 16);
    if (text) {
      size_t o = 0;
      memcpy(text, head, hl);
      o += hl;
      if (len) /* (no body at all while the list is empty) */
        memcpy(text + o, pc->body + pc->off[lo], len);
      o += len;
      text[o++] = ']';
      if (next) {
        memcpy(text + o, ",\"next\":", 8);
        o += 8;
        memcpy(text + o, next, nl);
        o += nl;
      }
      text[o++] = '}';
      text[o++] = '\n';
      text[o] = 0;
      len = o;
    }
  }
  pthread_mutex_unlock(&rq->c->lock);
  free(next);
  if (!text) {
    http_reply_oom(out);
    return 1;
  }
  out->status = 200;
  out->text = text;
  out->text_len = len;
  out->ctype = "application/json";
  return 1;
}

void api_nodes(struct http_req *rq, struct http_out *out) {
  if (!reply_page(rq, out, CACHE_NODES))
    reply_list(rq, out, CACHE_NODES);
}

void api_node(struct http_req *rq, struct http_out *out) {
  struct json_object *j = NULL;
  struct lynx_reg_node *n;
  pthread_mutex_lock(&rq->c->lock);
  n = lynx_reg_node_find(&rq->c->reg, rq->params[0]);
  if (n)
    j = lynx_json_node(&rq->c->reg, n, rq->c->now_ms());
  pthread_mutex_unlock(&rq->c->lock);
  if (!n)
    http_reply_err(out, 404, "not_found", "node '%s' not found", rq->params[0]);
  else
    http_reply_encoded(out, 200, j);
}

void api_accels(struct http_req *rq, struct http_out *out) {
  if (!reply_page(rq, out, CACHE_ACCELS))
    reply_list(rq, out, CACHE_ACCELS);
}

void api_mqueues(struct http_req *rq, struct http_out *out) {
  reply_list(rq, out, CACHE_MQUEUES);
}

/* drain / undrain: 200 with the node as it is afterwards. */
static void node_op(struct http_req *rq, struct http_out *out, int drain) {
  const char *what = drain ? "node drain" : "node undrain";
  struct lynx_state_edit edit = {0};
  struct lynx_reg_err err;
  struct lynx_reg_node *n;
  struct json_object *j = NULL;
  uint64_t now = rq->c->now_ms();
  int rc, saved = 0;

  memset(&err, 0, sizeof(err));
  http_change_begin(rq);
  if (!lynx_reg_node_find(&rq->c->reg, rq->params[0])) {
    http_change_end(rq);
    http_reply_err(out, 404, "not_found", "node '%s' not found", rq->params[0]);
    return;
  }
  rc = drain ? lynx_reg_drain_check(&rq->c->reg, rq->params[0], &n, &err)
             : lynx_reg_undrain_check(&rq->c->reg, rq->params[0], &n, &err);
  if (rc == 0) {
    if (drain)
      edit.add_drained = rq->params[0];
    else
      edit.del_drained = rq->params[0];
    if (http_save_first(rq, out, what, &edit)) {
      http_change_end(rq);
      return;
    }
    saved = 1;
    /* checked again: the node may have gone down or away meanwhile */
    rc = drain ? lynx_reg_drain(&rq->c->reg, rq->params[0], now, &err)
               : lynx_reg_undrain(&rq->c->reg, rq->params[0], now, &err);
  }
  if (rc == 0 && (n = lynx_reg_node_find(&rq->c->reg, rq->params[0])) != NULL)
    j = lynx_json_node(&rq->c->reg, n, now);
  http_finish_mutation(rq, out, rc, &err, j, what, 200, saved);
}

void api_node_drain(struct http_req *rq, struct http_out *out) {
  node_op(rq, out, 1);
}

void api_node_undrain(struct http_req *rq, struct http_out *out) {
  node_op(rq, out, 0);
}

/* Forget a down node: 200 with the node as it was. Its drain intent, if
 * any, leaves the state file with it. */
void api_node_forget(struct http_req *rq, struct http_out *out) {
  struct lynx_reg_err err;
  struct lynx_reg_node *n;
  struct json_object *j = NULL;
  int rc, saved = 0;

  memset(&err, 0, sizeof(err));
  http_change_begin(rq);
  n = lynx_reg_node_find(&rq->c->reg, rq->params[0]);
  if (!n) {
    http_change_end(rq);
    http_reply_err(out, 404, "not_found", "node '%s' not found", rq->params[0]);
    return;
  }
  rc = lynx_reg_forget_check(&rq->c->reg, rq->params[0], &n, &err);
  if (rc == 0) {
    struct lynx_state_edit edit = {.del_drained = rq->params[0]};
    if (http_save_first(rq, out, "node forget", &edit)) {
      http_change_end(rq);
      return;
    }
    saved = 1;
    /* checked again: the node may have come back meanwhile */
    rc = lynx_reg_forget_check(&rq->c->reg, rq->params[0], &n, &err);
    if (rc == 0) {
      j = lynx_json_node(&rq->c->reg, n, rq->c->now_ms());
      rc = lynx_reg_forget(&rq->c->reg, rq->params[0], &err);
    }
  }
  if (rc == 0)
    lynx_ev_add(&rq->c->reg.ev, LYNX_EV_NODE_FORGOTTEN, rq->params[0],
                "node %s forgotten by an operator", rq->params[0]);
  http_finish_mutation(rq, out, rc, &err, j, "node forget", 200, saved);
}
