/*
 * store.h - operator intent on disk: the services, which nodes the
 * operator drained, and the epoch counter, in DIR/state.json.
 *
 * Saving writes DIR/state.json.tmp, fsyncs it, renames it over state.json
 * and fsyncs DIR, so a crash leaves either the old or the new file, never a
 * torn one. Loading a missing file is an empty state; a file that does not
 * parse is an error (the coordinator refuses to start rather than forget
 * services).
 */
#ifndef LYNX_STORE_H
#define LYNX_STORE_H

#include <stddef.h>

#include <json-c/json.h>

#include "registry.h"

/* A change of operator intent not applied yet: the API saves the state as
 * it will be after the change, and applies the change only once that
 * save succeeded (http.c), so a change the store cannot take is refused
 * with nothing changed. Each field may be NULL. */
struct lynx_state_edit {
  const struct lynx_service_spec *add_service; /* a new service's spec */
  const char *del_service;                     /* a service's name */
  const char *add_drained, *del_drained;       /* a node's drain intent */
};

/* Saves r's state with edit applied (edit may be NULL). 0 or -errno; err
 * gets a sentence on failure. */
int lynx_store_save(const char *dir, const struct lynx_registry *r,
                    const struct lynx_state_edit *edit, char *err,
                    size_t errlen);

/* Creates the services and drain intents in r (r freshly initialised, no
 * nodes yet: drain intents are kept by node id and applied when the node
 * registers). 0, or -errno / -EINVAL with err. */
int lynx_store_load(const char *dir, struct lynx_registry *r, uint64_t now_ms,
                    char *err, size_t errlen);

/* Issues the next epoch (a frontend's when frontend is set) from the
 * state directory's counter: r->epoch_last + 1, in state.json (fsynced)
 * before it is handed out, so epochs grow strictly across restarts of
 * anything, whatever the clocks do. 0 or -errno with err (nothing issued). */
int lynx_store_issue_epoch(const char *dir, struct lynx_registry *r,
                           int frontend, uint64_t *epoch, char *err,
                           size_t errlen);

/* The state's JSON shape ({"version", "services", "drained", and "epoch"
 * and "frontend_epoch" once issued}), which state.json holds and the etcd
 * store splits into keys (store_etcd.c), with edit applied (may be NULL). A
 * new reference, or NULL when out of memory. */
struct json_object *lynx_store_state_obj(const struct lynx_registry *r,
                                         const struct lynx_state_edit *edit);

/* Decodes root (that shape; where names it in errors) and creates its
 * services and drain intents in r, as lynx_store_load does. */
int lynx_store_apply(struct json_object *root, const char *where,
                     struct lynx_registry *r, uint64_t now_ms, char *err,
                     size_t errlen);

#endif
