/*
 * store_etcd.h - operator intent in etcd (--etcd), one key per item under
 * a prefix P (--etcd-prefix, default "/lynx/"):
 *
 *   P version            "1": the layout below
 *   P services/<name>    a service spec, as POST /v1/services takes it
 *   P drained/<node-id>  "": the operator drained that node
 *   P epochs/node        "": its puts' revisions are the node epochs issued
 *   P epochs/frontend    "": same for frontend epochs (its mod revision:
 *                        the newest frontend epoch)
 *
 * Saving compares the registry with what etcd holds and writes only the
 * differences (a put per changed service, a delete per one that went),
 * in transactions of up to 64 operations; loading reads both prefixes and
 * applies them as store.c applies state.json. docs/etcd.md.
 */
#ifndef LYNX_STORE_ETCD_H
#define LYNX_STORE_ETCD_H

#include <stddef.h>
#include <stdint.h>

#include "etcd.h"
#include "registry.h"
#include "store.h"

#define LYNX_ETCD_PREFIX_DEFAULT "/lynx/"
#define LYNX_ETCD_PREFIX_MAX 128

struct lynx_store_etcd {
  struct lynx_etcd *etcd;
  char prefix[LYNX_ETCD_PREFIX_MAX];
  /* Fencing (elect.c): with fence_rev set, a save holds only while the
   * key fence_key was created at that revision (this coordinator's
   * leadership); otherwise it writes nothing and fails -ECANCELED. Once
   * fence_key is set (a lead won), a save without fence_rev (the lead is
   * over) fails -ECANCELED too. */
  const char *fence_key;
  int64_t fence_rev;
};

/* prefix: non-empty, printable, no space, at most LYNX_ETCD_PREFIX_MAX - 1
 * bytes (a trailing '/' is added when missing). 0 or -EINVAL with err. */
int lynx_store_etcd_init(struct lynx_store_etcd *s, struct lynx_etcd *e,
                         const char *prefix, char *err, size_t errlen);

/* The coordinator's save hook (coord.h): arg is a struct lynx_store_etcd,
 * state the state's JSON shape (lynx_store_state_obj). A network call:
 * made without the coordinator's lock (fence_rev is read atomically). */
int lynx_store_etcd_save_state(void *arg, struct json_object *state, char *err,
                               size_t errlen);

/* Issues an epoch (a frontend's when frontend is set): the revision of a
 * put of P epochs/node or P epochs/frontend, fenced like saves. The
 * registry is the caller's (elect.c issues epochs ahead and hands them
 * out: lynx_elect_take_epoch). 0 or -errno with err. */
int lynx_store_etcd_put_epoch(struct lynx_store_etcd *s, int frontend,
                              uint64_t *epoch, char *err, size_t errlen);

/* A number that changes whenever the services or drain intents etcd holds
 * change (a follower reloads when it does). 0 or -errno with err. */
int lynx_store_etcd_sig(struct lynx_store_etcd *s, uint64_t *sig, char *err,
                        size_t errlen);

/* As lynx_store_load, from etcd (r->frontend_epoch included): nothing
 * stored is an empty state; a layout version other than 1, or an item that
 * does not decode, is an error (the coordinator refuses to start rather
 * than forget services). */
int lynx_store_etcd_load(struct lynx_store_etcd *s, struct lynx_registry *r,
                         uint64_t now_ms, char *err, size_t errlen);

/* lynx_store_etcd_load in two halves, so that the network call is made
 * without the coordinator's lock: read what etcd holds (root: the state's
 * JSON shape, the caller puts it; NULL on error), then apply it to r. */
struct lynx_store_etcd_state {
  struct json_object *root;
  uint64_t frontend_epoch; /* P epochs/frontend's mod revision (0: none) */
};
int lynx_store_etcd_read(struct lynx_store_etcd *s,
                         struct lynx_store_etcd_state *out, char *err,
                         size_t errlen);
int lynx_store_etcd_apply(const struct lynx_store_etcd *s,
                          const struct lynx_store_etcd_state *st,
                          struct lynx_registry *r, uint64_t now_ms, char *err,
                          size_t errlen);

#endif
