/*
 * reg_accel.c - accelerators' health as their agents report it in every
 * heartbeat (registry.h, struct lynx_accel_report).
 *
 * Design notes:
 * - Accelerator health (heartbeats) is part of dispatchability, not of
 *   placement's bookkeeping: instances on an accelerator that is lost,
 *   failed or has a stalled mqueue leave the table but stay placed (and
 *   count as the service's instances), because a stalled application may
 *   recover and then serves again without a restart. Placement only
 *   refuses to put new instances there. Whatever made it unhealthy, the
 *   accelerator is back as soon as a heartbeat reports it healthy; a new
 *   agent epoch starts healthy.
 * - What decides dispatchability (lynx_reg_accel_dispatchable) is in
 *   registry.c, with the rest of the table; this file stores the reports
 *   and says what changed.
 */
#include "reg_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "util.h"

#define COMP "registry"

const char *lynx_reg_accel_health_str(const struct lynx_reg_accel *a, char *buf,
                                      size_t len) {
  size_t l = 0;
  if (!buf || len == 0)
    return buf;
  buf[0] = '\0';
  if (lynx_reg_accel_dispatchable(a)) {
    snprintf(buf, len, "ok");
    return buf;
  }
  if (a->device_lost)
    l = lynx_appendf(buf, len, l, "; ", "device lost");
  if (a->failed)
    l = lynx_appendf(buf, len, l, "; ", "failed%s%.*s",
                     a->last_error[0] ? ": " : "", (int)sizeof(a->last_error),
                     a->last_error);
  else if (a->device_lost && a->last_error[0])
    l = lynx_appendf(buf, len, l, "; ", "last error: %.*s",
                     (int)sizeof(a->last_error), a->last_error);
  if (a->stalled_mqueues)
    lynx_appendf(
        buf, len, l, "; ", "%" PRIu32 " mqueue%s stalled for %" PRIu64 " ms",
        a->stalled_mqueues, a->stalled_mqueues == 1 ? "" : "s", a->stall_ms);
  return buf;
}

/* Health the agent reported for an accelerator: what the same agent
 * registering again keeps and a new incarnation starts without. */
void lynx__reg_accel_health_copy(struct lynx_reg_accel *dst,
                                 const struct lynx_reg_accel *src) {
  dst->device_lost = src->device_lost;
  dst->failed = src->failed;
  dst->stalled_mqueues = src->stalled_mqueues;
  dst->stall_ms = src->stall_ms;
  memcpy(dst->last_error, src->last_error, sizeof(dst->last_error));
  dst->unhealthy_since_ms = src->unhealthy_since_ms;
}

/* Whether the accelerator at position pos of n runs a READY instance. */
static int accel_has_ready_inst(const struct lynx_registry *r,
                                const struct lynx_reg_node *n, uint32_t pos) {
  const struct lynx_reg_instance *i;
  for (i = r->instances; i; i = i->next)
    if (i->node == n && i->state == LYNX_INST_READY &&
        i->accel_idx == n->accels[pos].info.idx)
      return 1;
  return 0;
}

/* What makes an accelerator unhealthy, as bits: a change of these while it
 * stays out of dispatch is worth a log line and a version. */
static unsigned health_bits(const struct lynx_reg_accel *a) {
  return (a->device_lost ? 1u : 0u) | (a->failed ? 2u : 0u) |
         (a->stalled_mqueues ? 4u : 0u);
}

/* Stores rep's health in the accelerator at position pos of n. When its
 * dispatchability changes: logged, r->version bumped, the table marked if
 * its instances are in (or come back into) it. */
void lynx__reg_accel_health_update(struct lynx_registry *r,
                                   struct lynx_reg_node *n, uint32_t pos,
                                   const struct lynx_accel_report *rep,
                                   uint64_t now_ms) {
  struct lynx_reg_accel *a = &n->accels[pos];
  int was_ok = lynx_reg_accel_dispatchable(a), ok;
  unsigned was_bits = health_bits(a);
  size_t el = strnlen(rep->last_error, sizeof(rep->last_error) - 1);
  char why[256], subj[LYNX_ID_MAX + 16];

  a->device_lost = rep->device_lost != 0;
  a->failed = rep->failed != 0;
  a->stalled_mqueues = rep->stalled_mqueues;
  a->stall_ms = rep->stall_ms;
  memset(a->last_error, 0, sizeof(a->last_error));
  memcpy(a->last_error, rep->last_error, el);
  /* a device's message, cut to the field by the daemon: shown as text */
  lynx_text_clean(a->last_error, sizeof(a->last_error), a->last_error);
  ok = lynx_reg_accel_dispatchable(a);
  if (was_ok == ok) {
    if (!ok && health_bits(a) != was_bits) {
      r->version++;
      LYNX_WARN(COMP, "node %s accel %" PRIu32 " still out of dispatch: %s",
                n->id, a->info.idx,
                lynx_reg_accel_health_str(a, why, sizeof(why)));
    }
    return;
  }
  r->version++;
  if (n->state == LYNX_NODE_READY && accel_has_ready_inst(r, n, pos))
    r->table_dirty = 1;
  if (!ok) {
    a->unhealthy_since_ms = now_ms;
    a->health_outages++;
    lynx_reg_accel_health_str(a, why, sizeof(why));
    LYNX_WARN(COMP, "node %s accel %" PRIu32 " out of dispatch: %s", n->id,
              a->info.idx, why);
    snprintf(subj, sizeof(subj), "%s/%" PRIu32, n->id, a->info.idx);
    lynx_ev_add(&r->ev, LYNX_EV_ACCEL_OUT, subj,
                "accelerator %s out of dispatch: %s", subj, why);
  } else {
    uint64_t out =
        now_ms > a->unhealthy_since_ms ? now_ms - a->unhealthy_since_ms : 0;
    snprintf(subj, sizeof(subj), "%s/%" PRIu32, n->id, a->info.idx);
    lynx_ev_add(&r->ev, LYNX_EV_ACCEL_BACK, subj,
                "accelerator %s healthy again after %" PRIu64 " ms", subj, out);
    if (n->state == LYNX_NODE_READY)
      LYNX_INFO(COMP,
                "node %s accel %" PRIu32 " back in dispatch after %" PRIu64
                " ms",
                n->id, a->info.idx, out);
    else
      LYNX_INFO(COMP,
                "node %s accel %" PRIu32 " healthy again after %" PRIu64
                " ms (the node is %s)",
                n->id, a->info.idx, out, lynx_node_state_name(n->state));
  }
}
