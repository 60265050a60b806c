/* store_etcd.c - operator intent in etcd (see store_etcd.h). */
#include "store_etcd.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "store.h"
#include "util.h"

#define LAYOUT "1"
#define TXN_OPS 64 /* etcd's default --max-txn-ops is 128 */

int lynx_store_etcd_init(struct lynx_store_etcd *s, struct lynx_etcd *e,
                         const char *prefix, char *err, size_t errlen) {
  size_t n = prefix ? strlen(prefix) : 0;
  s->etcd = e;
  s->fence_key = NULL; /* no fence until elect.c wins */
  s->fence_rev = 0;
  if (n == 0 || n + 2 > sizeof(s->prefix))
    return lynx_fail(err, errlen, -EINVAL,
                     "--etcd-prefix: want 1 to %zu characters",
                     sizeof(s->prefix) - 2);
  for (size_t i = 0; i < n; i++)
    if (prefix[i] <= ' ' || prefix[i] > '~')
      return lynx_fail(
          err, errlen, -EINVAL,
          "--etcd-prefix '%s': printable characters only, no space", prefix);
  snprintf(s->prefix, sizeof(s->prefix), "%s%s", prefix,
           prefix[n - 1] == '/' ? "" : "/");
  return 0;
}

/* ---- save ---------------------------------------------------------------- */

struct plan {
  struct lynx_etcd_op *ops;
  char **owned; /* keys and values the ops point at */
  size_t n, n_owned, cap;
};

static int plan_add(struct plan *p, enum lynx_etcd_opkind kind, char *key,
                    char *value) {
  if (p->n == p->cap) {
    size_t cap = p->cap ? 2 * p->cap : 16;
    struct lynx_etcd_op *ops = realloc(p->ops, cap * sizeof(*ops));
    char **owned;
    if (!ops)
      return -ENOMEM;
    p->ops = ops;
    owned = realloc(p->owned, 2 * cap * sizeof(*owned));
    if (!owned)
      return -ENOMEM;
    p->owned = owned;
    p->cap = cap;
  }
  p->ops[p->n++] =
      (struct lynx_etcd_op){kind, key, value, value ? strlen(value) : 0, 0};
  p->owned[p->n_owned++] = key;
  if (value)
    p->owned[p->n_owned++] = value;
  return 0;
}

static void plan_free(struct plan *p) {
  for (size_t i = 0; i < p->n_owned; i++)
    free(p->owned[i]);
  free(p->owned);
  free(p->ops);
}

static char *join2(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  char *s = malloc(la + lb + 1);
  if (s) {
    memcpy(s, a, la);
    memcpy(s + la, b, lb + 1);
  }
  return s;
}

static int kv_cmp(const void *a, const void *b) {
  return strcmp(((const struct lynx_etcd_kv *)a)->key,
                ((const struct lynx_etcd_kv *)b)->key);
}

/* The items of dir (P services/ or P drained/): arr holds what the
 * registry has (value(item) its value, name(item) its key's last part);
 * what etcd holds differently is put, what it holds beyond is deleted. */
static int plan_dir(struct plan *p, const struct lynx_etcd_kvs *have,
                    const char *dir, struct json_object *arr, int services) {
  char *seen = calloc(have->n ? have->n : 1, 1);
  int rc = seen ? 0 : -ENOMEM;
  size_t n = arr ? json_object_array_length(arr) : 0;
  for (size_t i = 0; i < n && !rc; i++) {
    struct json_object *it = json_object_array_get_idx(arr, i), *nm = it;
    const char *val = "";
    struct lynx_etcd_kv probe = {0}, *hit;
    char *key;
    if (services) {
      json_object_object_get_ex(it, "name", &nm);
      val = json_object_to_json_string_ext(
          it, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
    }
    if (!nm || !val || !(key = join2(dir, json_object_get_string(nm)))) {
      rc = -ENOMEM;
      break;
    }
    probe.key = key;
    hit = have->n
              ? bsearch(&probe, have->kv, have->n, sizeof(*have->kv), kv_cmp)
              : NULL;
    if (hit)
      seen[hit - have->kv] = 1;
    if (hit && hit->value_len == strlen(val) &&
        !memcmp(hit->value, val, hit->value_len)) {
      free(key);
      continue;
    }
    {
      char *v = strdup(val);
      rc = v ? plan_add(p, LYNX_ETCD_PUT, key, v) : -ENOMEM;
      if (rc) {
        free(key);
        free(v);
      }
    }
  }
  for (size_t i = 0; i < have->n && !rc; i++) {
    char *key;
    if (seen[i])
      continue;
    key = strdup(have->kv[i].key);
    rc = key ? plan_add(p, LYNX_ETCD_DEL, key, NULL) : -ENOMEM;
    if (rc)
      free(key);
  }
  free(seen);
  return rc;
}

/* etcd answers a prefix range sorted by key, in its byte order: what
 * bsearch with strcmp needs; sorted again all the same, cheaply, in case a
 * proxy in between did not keep the order */
static int get_sorted(struct lynx_etcd *e, const char *key,
                      struct lynx_etcd_kvs *out, char *err, size_t errlen) {
  int rc = lynx_etcd_get(e, key, 1, out, err, errlen);
  if (!rc && out->n > 1)
    qsort(out->kv, out->n, sizeof(*out->kv), kv_cmp);
  return rc;
}

/* What etcd holds under the prefix: the layout version (checked), the
 * services and the drain intents, each sorted by key. */
struct stored {
  char *dsvc, *ddr, *kver; /* P services/, P drained/, P version */
  struct lynx_etcd_kvs ver, svcs, drained;
};

static void stored_free(struct stored *st) {
  lynx_etcd_kvs_free(&st->svcs);
  lynx_etcd_kvs_free(&st->drained);
  lynx_etcd_kvs_free(&st->ver);
  free(st->dsvc);
  free(st->ddr);
  free(st->kver);
}

static int stored_read(const struct lynx_store_etcd *s, struct stored *st,
                       char *err, size_t errlen) {
  int rc;
  memset(st, 0, sizeof(*st));
  st->dsvc = join2(s->prefix, "services/");
  st->ddr = join2(s->prefix, "drained/");
  st->kver = join2(s->prefix, "version");
  if (!st->dsvc || !st->ddr || !st->kver)
    return lynx_fail(err, errlen, -ENOMEM, "out of memory");
  if ((rc = lynx_etcd_get(s->etcd, st->kver, 0, &st->ver, err, errlen)) ||
      (rc = get_sorted(s->etcd, st->dsvc, &st->svcs, err, errlen)) ||
      (rc = get_sorted(s->etcd, st->ddr, &st->drained, err, errlen)))
    return rc;
  if (st->ver.n && strcmp(st->ver.kv[0].value, LAYOUT))
    return lynx_fail(err, errlen, -EINVAL,
                     "%s is '%s', not " LAYOUT
                     ": written by a different release",
                     st->kver, st->ver.kv[0].value);
  return 0;
}

/* The fence a save or an epoch holds by (elect.c sets and clears it under
 * the coordinator's lock; writers read it without: any value read is
 * safe, etcd checks it): *n compares in c (0: unfenced, before any lead).
 * -ECANCELED with err once a lead was won and is over: nothing is written
 * unfenced after it. */
static int fence_of(const struct lynx_store_etcd *s, struct lynx_etcd_cmp *c,
                    size_t *n, char *err, size_t errlen) {
  int64_t rev = __atomic_load_n(&s->fence_rev, __ATOMIC_ACQUIRE);
  *c = (struct lynx_etcd_cmp){s->fence_key, LYNX_ETCD_CREATE, 0, rev, NULL};
  *n = rev ? 1 : 0;
  if (!rev && s->fence_key)
    return lynx_fail(err, errlen, -ECANCELED,
                     "this coordinator no longer "
                     "leads: nothing written");
  return 0;
}

int lynx_store_etcd_save_state(void *arg, struct json_object *state, char *err,
                               size_t errlen) {
  struct lynx_store_etcd *s = arg;
  struct stored st;
  struct json_object *a_svcs = NULL, *a_drained = NULL;
  struct plan p = {0};
  int rc = stored_read(s, &st, err, errlen);
  if (rc)
    goto out;
  json_object_object_get_ex(state, "services", &a_svcs);
  json_object_object_get_ex(state, "drained", &a_drained);
  if (!st.ver.n) {
    char *k = strdup(st.kver), *v = strdup(LAYOUT);
    rc = (k && v) ? plan_add(&p, LYNX_ETCD_PUT, k, v) : -ENOMEM;
    if (rc) {
      free(k);
      free(v);
    }
  }
  if (!rc)
    rc = plan_dir(&p, &st.svcs, st.dsvc, a_svcs, 1);
  if (!rc)
    rc = plan_dir(&p, &st.drained, st.ddr, a_drained, 0);
  if (rc) {
    lynx_fail(err, errlen, rc, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < p.n && !rc; i += TXN_OPS) {
    size_t nf;
    struct lynx_etcd_cmp fence;
    int held = 1;
    rc = fence_of(s, &fence, &nf, err, errlen);
    if (rc)
      break;
    rc = lynx_etcd_txn(s->etcd, &fence, nf, &p.ops[i],
                       p.n - i < TXN_OPS ? p.n - i : TXN_OPS, NULL, 0, &held,
                       NULL, err, errlen);
    if (!rc && !held)
      rc = lynx_fail(err, errlen, -ECANCELED,
                     "this coordinator no longer leads (%s is not the key "
                     "it created): nothing written",
                     s->fence_key);
  }
out:
  plan_free(&p);
  stored_free(&st);
  return rc;
}

/* ---- epochs -------------------------------------------------------------- */

int lynx_store_etcd_put_epoch(struct lynx_store_etcd *s, int frontend,
                              uint64_t *epoch, char *err, size_t errlen) {
  size_t nf;
  struct lynx_etcd_cmp fence;
  char *key;
  struct lynx_etcd_op put = {LYNX_ETCD_PUT, NULL, "", 0, 0};
  int64_t rev = 0;
  int held = 1, rc = fence_of(s, &fence, &nf, err, errlen);
  if (rc)
    return rc;
  key = join2(s->prefix, frontend ? "epochs/frontend" : "epochs/node");
  if (!key)
    return lynx_fail(err, errlen, -ENOMEM, "out of memory");
  put.key = key;
  /* the put's revision is the epoch: etcd's revisions only grow, for
   * every coordinator, across restarts of anything */
  rc = lynx_etcd_txn(s->etcd, &fence, nf, &put, 1, NULL, 0, &held, &rev, err,
                     errlen);
  if (!rc && !held)
    rc = lynx_fail(err, errlen, -ECANCELED,
                   "this coordinator no longer "
                   "leads (%s is not the key it created): no epoch issued",
                   s->fence_key);
  if (!rc && rev <= 0)
    rc = lynx_fail(err, errlen, -EPROTO,
                   "etcd answered the put of %s "
                   "without a revision",
                   key);
  free(key);
  if (rc)
    return rc;
  *epoch = (uint64_t)rev;
  return 0;
}

/* *fe_epoch: the revision of the last put of P epochs/frontend (0: none). */
static int frontend_epoch_read(struct lynx_store_etcd *s, uint64_t *fe_epoch,
                               char *err, size_t errlen) {
  struct lynx_etcd_kvs k;
  char *key = join2(s->prefix, "epochs/frontend");
  int rc;
  if (!key)
    return lynx_fail(err, errlen, -ENOMEM, "out of memory");
  rc = lynx_etcd_get(s->etcd, key, 0, &k, err, errlen);
  free(key);
  if (rc)
    return rc;
  *fe_epoch = k.n && k.kv[0].mod_rev > 0 ? (uint64_t)k.kv[0].mod_rev : 0;
  lynx_etcd_kvs_free(&k);
  return 0;
}

int lynx_store_etcd_sig(struct lynx_store_etcd *s, uint64_t *sig, char *err,
                        size_t errlen) {
  struct stored st;
  int rc = stored_read(s, &st, err, errlen);
  uint64_t h = 1469598103934665603ull; /* FNV-1a over keys and revisions */
  if (!rc) {
    struct lynx_etcd_kvs *sets[2] = {&st.svcs, &st.drained};
    for (int k = 0; k < 2; k++)
      for (size_t i = 0; i < sets[k]->n; i++) {
        const struct lynx_etcd_kv *kv = &sets[k]->kv[i];
        for (const char *c = kv->key; *c; c++)
          h = (h ^ (uint8_t)*c) * 1099511628211ull;
        h = (h ^ (uint64_t)kv->mod_rev) * 1099511628211ull;
      }
    *sig = h;
  }
  stored_free(&st);
  return rc;
}

/* ---- load ---------------------------------------------------------------- */

int lynx_store_etcd_load(struct lynx_store_etcd *s, struct lynx_registry *r,
                         uint64_t now_ms, char *err, size_t errlen) {
  struct lynx_store_etcd_state st;
  int rc = lynx_store_etcd_read(s, &st, err, errlen);
  if (!rc)
    rc = lynx_store_etcd_apply(s, &st, r, now_ms, err, errlen);
  json_object_put(st.root);
  return rc;
}

int lynx_store_etcd_apply(const struct lynx_store_etcd *s,
                          const struct lynx_store_etcd_state *st,
                          struct lynx_registry *r, uint64_t now_ms, char *err,
                          size_t errlen) {
  char where[LYNX_ETCD_PREFIX_MAX + 32];
  int rc;
  snprintf(where, sizeof(where), "etcd %s", s->prefix);
  rc = lynx_store_apply(st->root, where, r, now_ms, err, errlen);
  if (!rc && st->frontend_epoch > r->frontend_epoch)
    r->frontend_epoch = st->frontend_epoch;
  return rc;
}

int lynx_store_etcd_read(struct lynx_store_etcd *s,
                         struct lynx_store_etcd_state *out, char *err,
                         size_t errlen) {
  struct stored st;
  struct json_object *root = json_object_new_object(),
                     *a_svcs = json_object_new_array(),
                     *a_drained = json_object_new_array();
  int rc = stored_read(s, &st, err, errlen);
  out->root = NULL;
  out->frontend_epoch = 0;
  if (!root || !a_svcs || !a_drained) {
    json_object_put(a_svcs);
    json_object_put(a_drained);
    rc = lynx_fail(err, errlen, -ENOMEM, "out of memory");
    goto out;
  }
  json_object_object_add(root, "version", json_object_new_int(1));
  json_object_object_add(root, "services", a_svcs);
  json_object_object_add(root, "drained", a_drained);
  if (rc)
    goto out;
  for (size_t i = 0; i < st.svcs.n; i++) {
    struct json_object *j = json_tokener_parse(st.svcs.kv[i].value), *nm;
    const char *name = st.svcs.kv[i].key + strlen(st.dsvc);
    if (!json_object_is_type(j, json_type_object) ||
        !json_object_object_get_ex(j, "name", &nm) ||
        strcmp(json_object_get_string(nm), name)) {
      json_object_put(j);
      rc = lynx_fail(err, errlen, -EINVAL,
                     "etcd %s: not a service spec named '%s'",
                     st.svcs.kv[i].key, name);
      goto out;
    }
    json_object_array_add(a_svcs, j);
  }
  for (size_t i = 0; i < st.drained.n; i++)
    json_object_array_add(
        a_drained,
        json_object_new_string(st.drained.kv[i].key + strlen(st.ddr)));
  rc = frontend_epoch_read(s, &out->frontend_epoch, err, errlen);
  if (!rc) {
    out->root = root;
    root = NULL;
  }
out:
  stored_free(&st);
  json_object_put(root);
  return rc;
}
