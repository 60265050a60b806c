/*
 * kv-lookup: a Lynx CPU application (plug-in) that answers a key with its
 * value from a table the service's app configuration gives:
 *
 *   "app_config": {"entries": {"apple": "red", "kiwi": "green"},
 *                  "file": "/srv/kv/colours.tsv",
 *                  "miss": "NOT_FOUND"}
 *
 * entries: pairs given inline; file: more pairs, one "KEY<TAB>VALUE" a
 * line (a later pair of the same key wins); miss: the answer to a key the
 * table lacks (default: an empty answer). A request is the key's bytes,
 * a trailing newline ignored. Every instance builds its own sorted table
 * at start and looks keys up with a binary search: no lock, no allocation
 * per request, and the answer is built in its TX slot (lynx_reserve).
 *
 * Built only against the installed SDK:
 *   cc -O2 -shared -fPIC -fvisibility=hidden \
 *      $(pkg-config --cflags lynx json-c) -o kv-lookup.so kv_lookup.c \
 *      $(pkg-config --libs lynx json-c)
 * and loaded with lynx-agent --app-load kv-lookup=/path/to/kv-lookup.so.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>
#include <lynx/lynx_app.h>

#define KV_MAX_ENTRIES (1u << 20)
#define KV_FILE_LINE_MAX 65536

struct kv_entry {
  char *key, *val;
  uint32_t klen, vlen;
  uint32_t order; /* insertion order: of two pairs of a key, the later wins */
};

struct kv_table {
  struct kv_entry *e;
  uint32_t n, cap;
  char *miss;
  uint32_t miss_len;
};

static int kv_cmp(const void *a, const void *b) {
  const struct kv_entry *x = a, *y = b;
  uint32_t n = x->klen < y->klen ? x->klen : y->klen;
  int c = memcmp(x->key, y->key, n);
  return c ? c : (x->klen > y->klen) - (x->klen < y->klen);
}

static void kv_free(void *state) {
  struct kv_table *t = state;
  if (!t)
    return;
  for (uint32_t i = 0; i < t->n; i++) {
    free(t->e[i].key);
    free(t->e[i].val);
  }
  free(t->e);
  free(t->miss);
  free(t);
}

static char *dup_bytes(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (d) {
    memcpy(d, s, n);
    d[n] = 0;
  }
  return d;
}

static int kv_add(struct kv_table *t, const char *k, size_t klen, const char *v,
                  size_t vlen, char *why, size_t whylen) {
  struct kv_entry *e;
  if (!klen || klen > UINT32_MAX || vlen > UINT32_MAX) {
    snprintf(why, whylen, "an empty or oversized key");
    return -EINVAL;
  }
  if (t->n == t->cap) {
    uint32_t cap = t->cap ? t->cap * 2 : 64;
    struct kv_entry *ne;
    if (t->n >= KV_MAX_ENTRIES) {
      snprintf(why, whylen, "more than %u entries", KV_MAX_ENTRIES);
      return -E2BIG;
    }
    ne = realloc(t->e, cap * sizeof(*ne));
    if (!ne) {
      snprintf(why, whylen, "out of memory");
      return -ENOMEM;
    }
    t->e = ne;
    t->cap = cap;
  }
  e = &t->e[t->n];
  e->key = dup_bytes(k, klen);
  e->val = dup_bytes(v, vlen);
  if (!e->key || !e->val) {
    free(e->key);
    free(e->val);
    snprintf(why, whylen, "out of memory");
    return -ENOMEM;
  }
  e->klen = (uint32_t)klen;
  e->vlen = (uint32_t)vlen;
  e->order = t->n++;
  return 0;
}

static int kv_load_file(struct kv_table *t, const char *path, char *why,
                        size_t whylen) {
  static char line[KV_FILE_LINE_MAX];
  FILE *f = fopen(path, "r");
  unsigned no = 0;
  int rc = 0;
  if (!f) {
    snprintf(why, whylen, "file %s: %s", path, strerror(errno));
    return -errno;
  }
  while (!rc && fgets(line, sizeof(line), f)) {
    size_t n = strlen(line);
    char *tab;
    no++;
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
      line[--n] = 0;
    if (!n || line[0] == '#')
      continue;
    tab = memchr(line, '\t', n);
    if (!tab) {
      snprintf(why, whylen, "file %s, line %u: no tab between key and value",
               path, no);
      rc = -EINVAL;
      break;
    }
    rc = kv_add(t, line, (size_t)(tab - line), tab + 1,
                n - (size_t)(tab - line) - 1, why, whylen);
  }
  fclose(f);
  return rc;
}

/* By key, then insertion order. */
static int kv_cmp_order(const void *a, const void *b) {
  const struct kv_entry *x = a, *y = b;
  int c = kv_cmp(a, b);
  return c ? c : (x->order > y->order) - (x->order < y->order);
}

/* Sorts by key and keeps the last pair given of each. */
static void kv_sort(struct kv_table *t) {
  uint32_t w = 0;
  qsort(t->e, t->n, sizeof(*t->e), kv_cmp_order);
  for (uint32_t i = 0; i < t->n; i++) {
    if (w && kv_cmp(&t->e[w - 1], &t->e[i]) == 0) {
      free(t->e[w - 1].key);
      free(t->e[w - 1].val);
      t->e[w - 1] = t->e[i];
      continue;
    }
    t->e[w++] = t->e[i];
  }
  t->n = w;
}

static int kv_start(const struct lynx_app_start *st, void **state, char *why,
                    size_t whylen) {
  struct json_tokener *tok = json_tokener_new();
  struct json_object *cfg = NULL;
  struct kv_table *t = calloc(1, sizeof(*t));
  int rc = 0;
  if (!tok || !t) {
    snprintf(why, whylen, "out of memory");
    rc = -ENOMEM;
    goto out;
  }
  cfg = json_tokener_parse_ex(tok, st->config, (int)st->config_len);
  if (!cfg || !json_object_is_type(cfg, json_type_object)) {
    snprintf(why, whylen, "the configuration is not a JSON object");
    rc = -EINVAL;
    goto out;
  }
  json_object_object_foreach(cfg, key, val) {
    if (!strcmp(key, "entries") && json_object_is_type(val, json_type_object)) {
      json_object_object_foreach(val, k, v) {
        if (!json_object_is_type(v, json_type_string)) {
          snprintf(why, whylen, "entries.%s: the value is not a string", k);
          rc = -EINVAL;
          goto out;
        }
        rc = kv_add(t, k, strlen(k), json_object_get_string(v),
                    (size_t)json_object_get_string_len(v), why, whylen);
        if (rc)
          goto out;
      }
    } else if (!strcmp(key, "file") &&
               json_object_is_type(val, json_type_string)) {
      rc = kv_load_file(t, json_object_get_string(val), why, whylen);
      if (rc)
        goto out;
    } else if (!strcmp(key, "miss") &&
               json_object_is_type(val, json_type_string)) {
      t->miss_len = (uint32_t)json_object_get_string_len(val);
      t->miss = dup_bytes(json_object_get_string(val), t->miss_len);
      if (!t->miss) {
        snprintf(why, whylen, "out of memory");
        rc = -ENOMEM;
        goto out;
      }
    } else {
      snprintf(why, whylen,
               "configuration: '%s' is unknown or of the wrong type (it "
               "takes entries: an object of strings, file: a path, miss: a "
               "string)",
               key);
      rc = -EINVAL;
      goto out;
    }
  }
  if (!t->n) {
    snprintf(why, whylen, "the table is empty (give entries or file)");
    rc = -EINVAL;
    goto out;
  }
  kv_sort(t);
  for (uint32_t i = 0; i < t->n; i++)
    if (t->e[i].vlen > st->msg_max) {
      snprintf(why, whylen,
               "the value of '%.40s' is %u bytes; the service's answers "
               "hold %u (its msg_max)",
               t->e[i].key, t->e[i].vlen, st->msg_max);
      rc = -EMSGSIZE;
      goto out;
    }
  *state = t;
  t = NULL;
out:
  kv_free(t);
  json_object_put(cfg);
  if (tok)
    json_tokener_free(tok);
  return rc;
}

static const struct kv_entry *kv_find(const struct kv_table *t,
                                      const uint8_t *k, uint32_t klen) {
  struct kv_entry probe = {.key = (char *)k, .klen = klen};
  return bsearch(&probe, t->e, t->n, sizeof(*t->e), kv_cmp);
}

static int kv_handle(struct lynx_mq *mq, const struct lynx_msg *req,
                     int *replied, const struct lynx_app_ctx *ctx) {
  const struct kv_table *t = ctx->state;
  uint32_t klen = req->len;
  const struct kv_entry *e;
  const char *ans;
  uint32_t alen;
  uint8_t *buf;
  int rc;
  while (klen && (req->data[klen - 1] == '\n' || req->data[klen - 1] == '\r'))
    klen--;
  e = kv_find(t, req->data, klen);
  ans = e ? e->val : t->miss;
  alen = e ? e->vlen : t->miss_len;
  rc = lynx_reserve(mq, alen, &buf);
  if (rc == -EAGAIN)
    return -EAGAIN; /* the TX ring is full: handed again later */
  if (rc) {         /* larger than a message may be: no answer */
    *replied = 0;
    return lynx_drop(mq, req->tag) == -EAGAIN ? -EAGAIN : 0;
  }
  if (alen)
    memcpy(buf, ans, alen);
  lynx_commit(mq, req->tag, alen, alen);
  *replied = 1;
  return 0;
}

static const struct lynx_app_def kv_def = {
    LYNX_APP_DEF_HEAD,
    .name = "kv-lookup",
    .help = "answer a key with its value from the service's table "
            "(app_config: entries, file, miss)",
    .start = kv_start,
    .handle = kv_handle,
    .stop = kv_free,
};

LYNX_APP_EXPORT(kv_def)
