/*
 * store.c - operator intent on disk (see store.h).
 *
 * DIR/state.json:
 *   {"version": 1,
 *    "services": [ service spec, as POST /v1/services takes it, ... ],
 *    "drained": [ "node-id", ... ]}
 *
 * Services are stored in the API's own shape and read back with the API's
 * decoder, so a spec that was accepted once is accepted again and nothing
 * is validated twice in two ways. The file is small (operator intent, not
 * runtime state), so it is rewritten whole on every change.
 */
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <json-c/json.h>

#include "regjson.h"
#include "util.h"

#define STORE_FILE "state.json"
#define STORE_TMP "state.json.tmp"
#define STORE_VERSION 1
#define STORE_MAX (64u << 20) /* far above any real intent; refuses junk */

static int join(char *out, size_t size, const char *dir, const char *name) {
  int n = snprintf(out, size, "%s/%s", dir, name);
  return (n < 0 || (size_t)n >= size) ? -ENAMETOOLONG : 0;
}

static int same_id(const char *a, const char *b) {
  return a && b && !strcmp(a, b);
}

struct json_object *lynx_store_state_obj(const struct lynx_registry *r,
                                         const struct lynx_state_edit *edit) {
  static const struct lynx_state_edit none;
  struct json_object *root = json_object_new_object();
  struct json_object *svcs = json_object_new_array();
  struct json_object *drained = json_object_new_array();
  const struct lynx_reg_service *s;
  const struct lynx_reg_node *n;
  const struct lynx_reg_drain_intent *d;
  int have_add = 0; /* edit->add_drained drained already */

  if (!edit)
    edit = &none;
  json_object_object_add(root, "version", json_object_new_int(STORE_VERSION));
  for (s = r->services; s; s = s->next)
    if (!edit->del_service ||
        strncmp(s->spec.name, edit->del_service, sizeof(s->spec.name)))
      json_object_array_add(svcs, lynx_json_service_spec_obj(&s->spec));
  if (edit->add_service)
    json_object_array_add(svcs, lynx_json_service_spec_obj(edit->add_service));
  json_object_object_add(root, "services", svcs);
  for (n = r->nodes; n; n = n->next)
    if (n->drain_intent && !same_id(n->id, edit->del_drained)) {
      have_add |= same_id(n->id, edit->add_drained);
      json_object_array_add(drained, json_object_new_string(n->id));
    }
  for (d = r->drain_intents; d; d = d->next)
    if (!same_id(d->id, edit->del_drained)) {
      have_add |= same_id(d->id, edit->add_drained);
      json_object_array_add(drained, json_object_new_string(d->id));
    }
  if (edit->add_drained && !have_add)
    json_object_array_add(drained, json_object_new_string(edit->add_drained));
  json_object_object_add(root, "drained", drained);
  if (r->epoch_last)
    json_object_object_add(root, "epoch",
                           json_object_new_int64((int64_t)r->epoch_last));
  if (r->frontend_epoch)
    json_object_object_add(root, "frontend_epoch",
                           json_object_new_int64((int64_t)r->frontend_epoch));
  return root;
}

int lynx_store_issue_epoch(const char *dir, struct lynx_registry *r,
                           int frontend, uint64_t *epoch, char *err,
                           size_t errlen) {
  uint64_t last = r->epoch_last, fe = r->frontend_epoch;
  int rc;
  r->epoch_last++;
  if (frontend)
    r->frontend_epoch = r->epoch_last;
  rc = lynx_store_save(dir, r, NULL, err, errlen);
  if (rc) {
    /* not handed out: issuing it again later is harmless */
    r->epoch_last = last;
    r->frontend_epoch = fe;
    return rc;
  }
  *epoch = r->epoch_last;
  return 0;
}

static int write_all(int fd, const char *buf, size_t len) {
  while (len) {
    ssize_t w = write(fd, buf, len);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    buf += w;
    len -= (size_t)w;
  }
  return 0;
}

int lynx_store_save(const char *dir, const struct lynx_registry *r,
                    const struct lynx_state_edit *edit, char *err,
                    size_t errlen) {
  char path[PATH_MAX], tmp[PATH_MAX];
  struct json_object *root;
  const char *text;
  int fd, rc, dfd;

  if (!dir || !r)
    return lynx_fail(err, errlen, -EINVAL, "no state directory");
  if (join(path, sizeof(path), dir, STORE_FILE) ||
      join(tmp, sizeof(tmp), dir, STORE_TMP))
    return lynx_fail(err, errlen, -ENAMETOOLONG, "%s: path too long", dir);

  root = lynx_store_state_obj(r, edit);
  text = json_object_to_json_string_ext(
      root, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE);
  if (!text) {
    json_object_put(root);
    return lynx_fail(err, errlen, -ENOMEM, "%s: cannot encode the state", path);
  }

  fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    rc = -errno;
    json_object_put(root);
    return lynx_fail(err, errlen, rc, "%s: open: %s", tmp, strerror(-rc));
  }
  rc = write_all(fd, text, strlen(text));
  if (!rc)
    rc = write_all(fd, "\n", 1);
  json_object_put(root);
  if (rc) {
    lynx_fail(err, errlen, rc, "%s: write: %s", tmp, strerror(-rc));
    goto err_close;
  }
  if (fsync(fd) < 0) {
    rc = -errno;
    lynx_fail(err, errlen, rc, "%s: fsync: %s", tmp, strerror(-rc));
    goto err_close;
  }
  if (close(fd) < 0) {
    rc = -errno;
    lynx_fail(err, errlen, rc, "%s: close: %s", tmp, strerror(-rc));
    goto err_unlink;
  }
  if (rename(tmp, path) < 0) {
    rc = -errno;
    lynx_fail(err, errlen, rc, "%s: rename to %s: %s", tmp, path,
              strerror(-rc));
    goto err_unlink;
  }
  /* the rename itself must reach the disk */
  dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    rc = -errno;
    return lynx_fail(err, errlen, rc, "%s: open: %s", dir, strerror(-rc));
  }
  if (fsync(dfd) < 0) {
    rc = -errno;
    close(dfd);
    return lynx_fail(err, errlen, rc, "%s: fsync: %s", dir, strerror(-rc));
  }
  close(dfd);
  return 0;

err_close:
  close(fd);
err_unlink:
  unlink(tmp);
  return rc;
}

/* Reads the whole file; *buf is NUL-terminated and the caller frees it.
 * -ENOENT when it does not exist. */
static int read_file(const char *path, char **buf, size_t *len, char *err,
                     size_t errlen) {
  struct stat st;
  size_t got = 0;
  char *b;
  int fd = open(path, O_RDONLY | O_CLOEXEC), rc;
  if (fd < 0) {
    rc = -errno;
    if (rc == -ENOENT)
      return rc;
    return lynx_fail(err, errlen, rc, "%s: open: %s", path, strerror(-rc));
  }
  if (fstat(fd, &st) < 0) {
    rc = -errno;
    close(fd);
    return lynx_fail(err, errlen, rc, "%s: stat: %s", path, strerror(-rc));
  }
  if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > STORE_MAX) {
    close(fd);
    return lynx_fail(err, errlen, -EINVAL,
                     "%s: not a regular file of at most %u "
                     "bytes",
                     path, STORE_MAX);
  }
  b = malloc((size_t)st.st_size + 1);
  if (!b) {
    close(fd);
    return lynx_fail(err, errlen, -ENOMEM, "%s: out of memory", path);
  }
  while (got < (size_t)st.st_size) {
    ssize_t n = read(fd, b + got, (size_t)st.st_size - got);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      rc = -errno;
      free(b);
      close(fd);
      return lynx_fail(err, errlen, rc, "%s: read: %s", path, strerror(-rc));
    }
    if (n == 0)
      break; /* shrank under us: parse what is there */
    got += (size_t)n;
  }
  close(fd);
  b[got] = '\0';
  *buf = b;
  *len = got;
  return 0;
}

static int parse_state(const char *path, const char *buf, size_t len,
                       struct json_object **out, char *err, size_t errlen) {
  struct json_tokener *tok = json_tokener_new();
  struct json_object *root;
  enum json_tokener_error je;
  size_t end;
  if (!tok)
    return lynx_fail(err, errlen, -ENOMEM, "%s: out of memory", path);
  root = json_tokener_parse_ex(tok, buf, (int)len);
  je = json_tokener_get_error(tok);
  end = json_tokener_get_parse_end(tok);
  json_tokener_free(tok);
  if (!root || je != json_tokener_success) {
    json_object_put(root);
    return lynx_fail(err, errlen, -EINVAL, "%s: not valid JSON: %s", path,
                     je == json_tokener_continue ? "empty or truncated"
                                                 : json_tokener_error_desc(je));
  }
  for (; end < len; end++)
    if (buf[end] != ' ' && buf[end] != '\n' && buf[end] != '\t' &&
        buf[end] != '\r') {
      json_object_put(root);
      return lynx_fail(err, errlen, -EINVAL,
                       "%s: not valid JSON: trailing data", path);
    }
  *out = root;
  return 0;
}

int lynx_store_load(const char *dir, struct lynx_registry *r, uint64_t now_ms,
                    char *err, size_t errlen) {
  char path[PATH_MAX];
  char *buf = NULL;
  size_t len = 0;
  struct json_object *root = NULL;
  int rc;

  if (!dir || !r)
    return lynx_fail(err, errlen, -EINVAL, "no state directory");
  if (join(path, sizeof(path), dir, STORE_FILE))
    return lynx_fail(err, errlen, -ENAMETOOLONG, "%s: path too long", dir);
  rc = read_file(path, &buf, &len, err, errlen);
  if (rc == -ENOENT)
    return 0; /* first start: nothing decided yet */
  if (rc)
    return rc;
  rc = parse_state(path, buf, len, &root, err, errlen);
  free(buf);
  if (rc)
    return rc;
  rc = lynx_store_apply(root, path, r, now_ms, err, errlen);
  json_object_put(root);
  return rc;
}

int lynx_store_apply(struct json_object *root, const char *path,
                     struct lynx_registry *r, uint64_t now_ms, char *err,
                     size_t errlen) {
  size_t k, n_svcs = 0, n_drained = 0;
  struct json_object *svcs = NULL, *drained = NULL;
  struct lynx_service_spec *specs = NULL;
  struct lynx_reg_err e;
  int rc = -EINVAL, have_version = 0;
  uint64_t epochs[2] = {0, 0}; /* "epoch", "frontend_epoch" */

  if (!json_object_is_type(root, json_type_object)) {
    lynx_fail(err, errlen, rc, "%s: must be a JSON object", path);
    goto out;
  }
  {
    json_object_object_foreach(root, key, val) {
      if (!strcmp(key, "version")) {
        if (!json_object_is_type(val, json_type_int) ||
            json_object_get_int64(val) != STORE_VERSION) {
          lynx_fail(err, errlen, rc,
                    "%s: version: must be %d (written by a "
                    "different release?)",
                    path, STORE_VERSION);
          goto out;
        }
        have_version = 1;
      } else if (!strcmp(key, "services")) {
        if (!json_object_is_type(val, json_type_array)) {
          lynx_fail(err, errlen, rc, "%s: services: must be an array", path);
          goto out;
        }
        svcs = val;
      } else if (!strcmp(key, "drained")) {
        if (!json_object_is_type(val, json_type_array)) {
          lynx_fail(err, errlen, rc, "%s: drained: must be an array", path);
          goto out;
        }
        drained = val;
      } else if (!strcmp(key, "epoch") || !strcmp(key, "frontend_epoch")) {
        if (!json_object_is_type(val, json_type_int) ||
            json_object_get_int64(val) < 0) {
          lynx_fail(err, errlen, rc, "%s: %s: must be a non-negative integer",
                    path, key);
          goto out;
        }
        epochs[key[0] == 'f'] = (uint64_t)json_object_get_int64(val);
      } else {
        lynx_fail(err, errlen, rc, "%s: %s: unknown field", path, key);
        goto out;
      }
    }
  }
  if (!have_version) {
    lynx_fail(err, errlen, rc, "%s: version: required", path);
    goto out;
  }

  /* Decode everything before changing r, so a bad file changes nothing
   * as far as decoding can tell. */
  n_svcs = svcs ? json_object_array_length(svcs) : 0;
  n_drained = drained ? json_object_array_length(drained) : 0;
  if (n_svcs) {
    specs = calloc(n_svcs, sizeof(*specs));
    if (!specs) {
      rc = lynx_fail(err, errlen, -ENOMEM, "%s: out of memory", path);
      goto out;
    }
  }
  for (k = 0; k < n_svcs; k++) {
    memset(&e, 0, sizeof(e));
    if (lynx_json_service_spec(json_object_array_get_idx(svcs, k), &specs[k],
                               &e)) {
      lynx_fail(err, errlen, rc, "%s: services[%zu]: %s", path, k, e.message);
      goto out;
    }
  }
  for (k = 0; k < n_drained; k++) {
    struct json_object *v = json_object_array_get_idx(drained, k);
    if (!json_object_is_type(v, json_type_string) ||
        json_object_get_string_len(v) == 0 ||
        json_object_get_string_len(v) >= LYNX_ID_MAX) {
      lynx_fail(err, errlen, rc, "%s: drained[%zu]: must be a node id", path,
                k);
      goto out;
    }
  }

  for (k = 0; k < n_svcs; k++) {
    memset(&e, 0, sizeof(e));
    rc = lynx_reg_service_create(r, &specs[k], now_ms, &e);
    if (rc) {
      lynx_fail(err, errlen, rc, "%s: services[%zu]: %s", path, k, e.message);
      goto out;
    }
  }
  for (k = 0; k < n_drained; k++) {
    const char *id =
        json_object_get_string(json_object_array_get_idx(drained, k));
    rc = lynx_reg_drain_intent_add(r, id);
    if (rc) {
      lynx_fail(err, errlen, rc, "%s: drained[%zu]: %s", path, k,
                rc == -EINVAL ? "not a valid node id" : strerror(-rc));
      goto out;
    }
  }
  if (epochs[1] > epochs[0]) {
    lynx_fail(err, errlen, rc = -EINVAL,
              "%s: frontend_epoch %llu is beyond "
              "epoch %llu, the last one issued",
              path, (unsigned long long)epochs[1],
              (unsigned long long)epochs[0]);
    goto out;
  }
  if (epochs[0] > r->epoch_last)
    r->epoch_last = epochs[0];
  if (epochs[1] > r->frontend_epoch)
    r->frontend_epoch = epochs[1];
  rc = 0;
out:
  free(specs);
  return rc;
}
