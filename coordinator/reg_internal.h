/*
 * reg_internal.h - what the registry's files share (registry.h is the one
 * public header; nothing outside coordinator/registry.c, reg_*.c and
 * partition.c includes this one).
 *
 * The files form layers: each calls only files on the lines below its
 * own (tools/check-cycles.py fails on a circle).
 *
 *   reg_node.c, reg_instance.c   agents: registration, heartbeats, leases,
 *                                the tick; what they report of instances
 *   reg_intent.c, reg_accel.c    operator node operations and drain
 *                                intents; accelerator health
 *   reg_service.c, reg_frontend.c  services; frontends, their partition
 *   reg_drain.c                  drains and retirements
 *   reg_place.c                  placement
 *   registry.c, reg_text.c,      helpers, lists, lookups, node states, the
 *   partition.c                  table; text; who produces into which
 *                                instance (handed the state: it calls none
 *                                of the files above)
 *
 * What is shared is declared here under the file that defines it, prefixed
 * lynx__reg_ (the registry's files) or lynx__part_ (partition.c);
 * everything else is static.
 */
#ifndef LYNX_REG_INTERNAL_H
#define LYNX_REG_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "registry.h"

/* ---- registry.c: helpers -------------------------------------------- */

/* Fills err (may be NULL) with an HTTP status, an API code and a message. */
void lynx__reg_set_err(struct lynx_reg_err *err, int status, const char *code,
                       const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define ERR_INVALID(err, ...)                                                  \
  lynx__reg_set_err(err, 400, "invalid_argument", __VA_ARGS__)
#define ERR_NOTFOUND(err, ...)                                                 \
  lynx__reg_set_err(err, 404, "not_found", __VA_ARGS__)
#define ERR_CONFLICT(err, ...)                                                 \
  lynx__reg_set_err(err, 409, "conflict", __VA_ARGS__)

/* strlen bounded by the array: max means "not terminated inside". */
static inline size_t lynx__reg_slen(const char *s, size_t max) {
  return strnlen(s, max);
}

/* An identifier that appears in API paths and label selectors: 1 to
 * max - 1 characters of [A-Za-z0-9_.-], and ':' too when colon. */
int lynx__reg_id_ok(const char *s, size_t max, int colon);
/* snprintf of src ("" for NULL) into dst: always terminated. */
void lynx__reg_copy_str(char *dst, size_t size, const char *src);

/* ---- registry.c: lists, states, the table --------------------------- */

/* The position of accelerator idx in n->accels, or -1. */
int lynx__reg_accel_pos(const struct lynx_reg_node *n, uint32_t idx);
/* Whether i's accelerator lets it serve (one its node no longer reports
 * counts as healthy). */
int lynx__reg_inst_accel_ok(const struct lynx_reg_instance *i);
/* Ends every public call that may have changed the table: bumps the table
 * version and asks for a push if the table changed during the call. */
void lynx__reg_table_commit(struct lynx_registry *r);
/* Moves n to state s: an event, r->version, and the table marked when n
 * enters or leaves READY with instances in it. */
void lynx__reg_node_set_state(struct lynx_registry *r, struct lynx_reg_node *n,
                              enum lynx_node_state s);
/* Unlinks *pp and frees it, without (forget) or after (stop) asking its
 * agent to stop it; the table is marked if it was in it. */
void lynx__reg_inst_forget_at(struct lynx_registry *r,
                              struct lynx_reg_instance **pp);
void lynx__reg_inst_stop_at(struct lynx_registry *r,
                            struct lynx_reg_instance **pp);
/* Forgets (stop = 0) or stops every instance on node n. */
void lynx__reg_node_drop_instances(struct lynx_registry *r,
                                   struct lynx_reg_node *n, int stop);
/* The instance of that id (and where it is linked, in *ppp), or NULL. */
struct lynx_reg_instance *lynx__reg_inst_find(struct lynx_registry *r,
                                              uint64_t id,
                                              struct lynx_reg_instance ***ppp);
/* What an agent's message names: the node id at this epoch. 0 with *out,
 * -ENOENT (no such node), -ESTALE (another epoch: counted refused). */
int lynx__reg_node_at_epoch(struct lynx_registry *r, const char *id,
                            uint64_t epoch, struct lynx_reg_node **out);

/* ---- reg_place.c ---------------------------------------------------- */

/* Placement: forgets the instances of DOWN nodes, stops those of DRAINED
 * ones, then starts and stops instances until every service has what its
 * policy wants (replicas move one at a time). 0 or -ENOMEM. */
int lynx__reg_reconcile(struct lynx_registry *r);

/* ---- reg_drain.c ---------------------------------------------------- */

/* A READY node drains (out of the table now, stopped once quiet); one
 * draining or drained already stays as it is. Commits the table. */
void lynx__reg_drain_begin(struct lynx_registry *r, struct lynx_reg_node *n,
                           uint64_t now_ms);
/* A moved-away instance retires: out of the tables now, stopped once the
 * frontends run a table without it and have nothing outstanding on it. */
void lynx__reg_inst_retire(struct lynx_registry *r, struct lynx_reg_instance *i,
                           uint64_t now_ms);
/* Stops retiring instances that are quiet or past their deadline. */
void lynx__reg_retire_check_all(struct lynx_registry *r, uint64_t now_ms);
/* Finishes every drain that is quiet or past its deadline, then
 * lynx__reg_retire_check_all. */
void lynx__reg_drain_check_all(struct lynx_registry *r, uint64_t now_ms);

/* ---- reg_intent.c --------------------------------------------------- */

/* 1 when the operator drained node id before it registered (the intent is
 * dropped from r->drain_intents: the node carries it from now on). */
int lynx__reg_take_drain_intent(struct lynx_registry *r, const char *id);

/* ---- reg_accel.c ---------------------------------------------------- */

/* Copies the health an agent reported for an accelerator: what the same
 * agent registering again keeps and a new incarnation starts without. */
void lynx__reg_accel_health_copy(struct lynx_reg_accel *dst,
                                 const struct lynx_reg_accel *src);
/* Stores a heartbeat's health report in the accelerator at position pos
 * of n; a change of dispatchability is logged, bumps r->version and marks
 * the table when its instances are in (or come back into) it. */
void lynx__reg_accel_health_update(struct lynx_registry *r,
                                   struct lynx_reg_node *n, uint32_t pos,
                                   const struct lynx_accel_report *rep,
                                   uint64_t now_ms);

/* ---- partition.c ---------------------------------------------------- */

/* One instance as a partition round sees it: what the registry hands over
 * so that partitioning calls nothing back. */
struct lynx__part_inst {
  struct lynx_reg_instance *inst;
  /* the frontend inst->fe_owner names as the round begins (NULL: none, or
   * one the registry does not know); read before any owner changes */
  struct lynx_reg_frontend *owner;
  int dispatchable; /* lynx_reg_inst_dispatchable(inst) */
};

/* One round of lynx_reg_partition (registry.h says what it does) over the
 * n instances in[] (every instance, in r->instances order) and the
 * frontends in r->frontends: writes the instances' fe_* fields and r's
 * partition counters and epochs. Returns 1 when the table changed; the
 * caller commits it. */
int lynx__part_round(struct lynx_registry *r, const struct lynx__part_inst *in,
                     size_t n, uint64_t now_ms);
/* Whether f owns i (releasing or not). */
int lynx__part_owned_by(const struct lynx_reg_instance *i,
                        const struct lynx_reg_frontend *f);

#endif
