/*
 * reg_frontend.c - frontends: their connections, reports and drains, which
 * of them are active, and the partition of the instances among them
 * (registry.h, "frontends", "several active frontends").
 *
 * Partitioning itself is partition.c, one layer below every file of the
 * registry: lynx_reg_partition hands it the state it decides on (every
 * instance, whether it is in the table, the frontend that owns it) and
 * commits the table when it says the round changed it. partition.c calls
 * nothing back.
 *
 * A frontend's reports drive drains and retirements forward
 * (lynx_reg_frontend_status: reg_drain.c). A frontend's drain
 * (lynx_reg_frontend_drain) is kept in memory only, not an operator's
 * intent that the store saves.
 */
#include "reg_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

#define COMP "registry"

/* ---- connections and reports ---------------------------------------- */

struct lynx_reg_frontend *lynx_reg_frontend_find(struct lynx_registry *r,
                                                 const char *id) {
  struct lynx_reg_frontend *f;
  if (!id)
    return NULL;
  for (f = r->frontends; f; f = f->next)
    if (!strncmp(f->id, id, sizeof(f->id)))
      return f;
  return NULL;
}

struct lynx_reg_frontend *
lynx_reg_frontend_connect(struct lynx_registry *r, const char *id,
                          const char *address, void *conn, uint64_t now_ms) {
  struct lynx_reg_frontend *f, **tail;
  if (!id || !*id || lynx__reg_slen(id, LYNX_ID_MAX) >= LYNX_ID_MAX)
    return NULL;
  f = lynx_reg_frontend_find(r, id);
  if (!f) {
    f = calloc(1, sizeof(*f));
    if (!f)
      return NULL;
    lynx__reg_copy_str(f->id, sizeof(f->id), id);
    for (tail = &r->frontends; *tail; tail = &(*tail)->next)
      ;
    *tail = f;
  }
  lynx__reg_copy_str(f->address, sizeof(f->address), address);
  f->conn = conn;
  f->connected = 1;
  lynx_ev_add(&r->ev, LYNX_EV_FRONTEND_CONNECTED, f->id,
              "frontend %s connected from %s", f->id, f->address);
  f->active = 0; /* the daemon decides (lynx_reg_frontend_set_active) */
  free(f->claims);
  f->claims = NULL;
  f->n_claims = 0;
  f->last_seen_ms = now_ms;
  /* Until it reports, assume it runs no table and knows nothing: a drain
   * waits for its first report (it may be a new process). */
  f->table_version_applied = 0;
  free(f->mqs);
  f->mqs = NULL;
  f->n_mqs = 0;
  free(f->listen);
  f->listen = NULL;
  f->n_listen = 0;
  r->version++;
  return f;
}

void lynx_reg_frontend_disconnected(struct lynx_registry *r, void *conn) {
  struct lynx_reg_frontend *f;
  if (!conn)
    return;
  for (f = r->frontends; f; f = f->next)
    if (f->conn == conn) {
      lynx_ev_add(&r->ev, LYNX_EV_FRONTEND_GONE, f->id,
                  "frontend %s disconnected%s", f->id,
                  f->active ? ": its instances go to another active frontend"
                            : "");
      f->conn = NULL;
      f->connected = 0;
      f->active = 0;
      r->version++;
    }
}

int lynx_reg_frontend_claims(struct lynx_registry *r, const char *id,
                             const struct lynx_fe_claim *c, uint32_t n) {
  struct lynx_reg_frontend *f = lynx_reg_frontend_find(r, id);
  struct lynx_fe_claim *copy = NULL;
  if (!f)
    return -ENOENT;
  if (n) {
    copy = malloc((size_t)n * sizeof(*copy));
    if (!copy)
      return -ENOMEM;
    memcpy(copy, c, (size_t)n * sizeof(*copy));
  }
  free(f->claims);
  f->claims = copy;
  f->n_claims = n;
  return 0;
}

void lynx_reg_frontend_claims_done(struct lynx_registry *r, const char *id) {
  struct lynx_reg_frontend *f = lynx_reg_frontend_find(r, id);
  if (!f || !f->n_claims)
    return;
  free(f->claims);
  f->claims = NULL;
  f->n_claims = 0;
}

int lynx_reg_frontend_drain(struct lynx_registry *r, const char *id, int drain,
                            struct lynx_reg_err *err) {
  struct lynx_reg_frontend *f = lynx_reg_frontend_find(r, id);
  if (!f) {
    ERR_NOTFOUND(err, "frontend '%s' not found", id ? id : "");
    return -ENOENT;
  }
  if (f->drain_intent == (drain != 0))
    return 0;
  f->drain_intent = drain != 0;
  lynx_ev_add(&r->ev,
              drain ? LYNX_EV_FRONTEND_DRAINING : LYNX_EV_FRONTEND_UNDRAINED,
              f->id, "frontend %s %s", f->id,
              drain ? "drains: its instances move to the other active "
                      "frontends"
                    : "is undrained");
  LYNX_INFO(COMP, "frontend %s %s", f->id,
            drain ? "drains: its instances move to the other active frontends "
                    "once it answered what it holds on them"
                  : "is undrained");
  r->version++;
  r->table_dirty = 1; /* the daemon chooses the active frontends again */
  lynx__reg_table_commit(r);
  return 0;
}

void lynx_reg_frontend_set_active(struct lynx_registry *r, const char *id,
                                  int active) {
  struct lynx_reg_frontend *f = lynx_reg_frontend_find(r, id);
  if (!f || f->active == (active && f->connected))
    return;
  f->active = active && f->connected;
  lynx_ev_add(&r->ev,
              f->active ? LYNX_EV_FRONTEND_ACTIVE : LYNX_EV_FRONTEND_STANDBY,
              f->id, "frontend %s is %s", f->id,
              f->active ? "active: instances are given to it"
                        : "a standby: it serves nothing");
  r->version++;
}

void lynx_reg_frontend_status(struct lynx_registry *r, const char *id,
                              uint64_t table_version,
                              const struct lynx_fe_mq_report *mqs, uint32_t n,
                              uint64_t now_ms) {
  struct lynx_reg_frontend *f = lynx_reg_frontend_find(r, id);
  struct lynx_fe_mq_report *copy = NULL;
  if (!f)
    return;
  f->last_seen_ms = now_ms;
  if (n && mqs) {
    copy = malloc((size_t)n * sizeof(*copy));
    if (!copy)
      return; /* keep the last report: a drain must not see a false 0 */
    memcpy(copy, mqs, (size_t)n * sizeof(*copy));
  } else {
    n = 0;
  }
  free(f->mqs);
  f->mqs = copy;
  f->n_mqs = n;
  if (f->table_version_applied != table_version) {
    f->table_version_applied = table_version;
    r->version++;
  }
  lynx__reg_drain_check_all(r, now_ms);
  lynx__reg_table_commit(r);
}

void lynx_reg_frontend_listen(struct lynx_registry *r, const char *id,
                              const struct lynx_fe_listen *l, uint32_t n) {
  struct lynx_reg_frontend *f = lynx_reg_frontend_find(r, id);
  struct lynx_fe_listen *copy = NULL;
  if (!f)
    return;
  if (n == f->n_listen && (!n || !memcmp(l, f->listen, (size_t)n * sizeof(*l))))
    return; /* as before: no news for watchers */
  if (n) {
    copy = malloc((size_t)n * sizeof(*copy));
    if (!copy)
      return;
    memcpy(copy, l, (size_t)n * sizeof(*copy));
  }
  free(f->listen);
  f->listen = copy;
  f->n_listen = n;
  r->version++;
}

/* ---- several active frontends --------------------------------------- */

int lynx_reg_fe_produces(const struct lynx_reg_frontend *f,
                         const struct lynx_reg_instance *i) {
  return f && i && lynx_reg_inst_dispatchable(i) && !i->fe_release_version &&
         lynx__part_owned_by(i, f);
}

int lynx_reg_fe_serves(const struct lynx_registry *r,
                       const struct lynx_reg_frontend *f,
                       const struct lynx_reg_service *svc) {
  int any = 0;
  for (const struct lynx_reg_instance *i = r->instances; i; i = i->next) {
    if (i->svc != svc || !i->fe_owner[0] || !lynx_reg_inst_dispatchable(i))
      continue;
    if (lynx__part_owned_by(i, f))
      return 1;
    any = 1;
  }
  return !any;
}

/* One round of partitioning (partition.c), handed every instance with what
 * it decides on; the table is committed here, whether the round changed it
 * or an earlier step of the call did. */
void lynx_reg_partition(struct lynx_registry *r, uint64_t now_ms) {
  struct lynx__part_inst *in;
  size_t n = 0, k = 0;
  for (const struct lynx_reg_instance *i = r->instances; i; i = i->next)
    n++;
  in = calloc(n ? n : 1, sizeof(*in));
  if (!in) {
    LYNX_LOG_RL(LYNX_LOG_ERROR, COMP,
                "out of memory partitioning instances "
                "among frontends; retrying at the next tick");
    lynx__reg_table_commit(r);
    return;
  }
  for (struct lynx_reg_instance *i = r->instances; i; i = i->next, k++) {
    in[k].inst = i;
    in[k].owner =
        i->fe_owner[0] ? lynx_reg_frontend_find(r, i->fe_owner) : NULL;
    in[k].dispatchable = lynx_reg_inst_dispatchable(i);
  }
  if (lynx__part_round(r, in, n, now_ms)) {
    r->table_dirty = 1;
    r->version++;
  }
  free(in);
  lynx__reg_table_commit(r);
}
