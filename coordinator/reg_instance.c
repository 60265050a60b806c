/*
 * reg_instance.c - what agents report of the instances they were asked to
 * start: ready with a region, or failed (registry.h,
 * lynx_reg_instance_ready).
 *
 * A report names the node at its epoch (lynx__reg_node_at_epoch): one from
 * another incarnation is refused. A ready instance that replaces another
 * retires the one it replaces (reg_drain.c); a failed one is forgotten,
 * and its accelerator backs off (200 ms doubling to 30 s) before placement
 * tries it again (reg_place.c).
 */
#include "reg_internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static int inst_of_node(struct lynx_registry *r, const char *node_id,
                        uint64_t epoch, uint64_t instance_id,
                        struct lynx_reg_instance ***ppp) {
  struct lynx_reg_node *n;
  struct lynx_reg_instance *i;
  int rc = lynx__reg_node_at_epoch(r, node_id, epoch, &n);
  if (rc)
    return rc;
  i = lynx__reg_inst_find(r, instance_id, ppp);
  if (!i || i->node != n)
    return -ENOENT;
  return 0;
}

/* Field by field: padding bytes are not part of a descriptor. */
static int desc_equal(const struct lynx_region_desc *a,
                      const struct lynx_region_desc *b) {
  return a->accel_id == b->accel_id && !strcmp(a->transport, b->transport) &&
         !strcmp(a->locator, b->locator) && a->region_size == b->region_size &&
         a->epoch == b->epoch && a->n_mqueues == b->n_mqueues &&
         a->slot_size == b->slot_size && a->slots == b->slots &&
         a->large_bytes == b->large_bytes && a->ordering == b->ordering &&
         a->key == b->key && a->remote_addr == b->remote_addr &&
         !memcmp(a->rkeys, b->rkeys, sizeof(a->rkeys));
}

int lynx_reg_instance_ready(struct lynx_registry *r, const char *node_id,
                            uint64_t epoch, uint64_t instance_id,
                            const struct lynx_region_desc *desc,
                            uint64_t now_ms) {
  struct lynx_reg_instance **pp, *i;
  struct lynx_region_desc d;
  int rc;
  if (!desc)
    return -EINVAL;
  rc = inst_of_node(r, node_id, epoch, instance_id, &pp);
  if (rc)
    return rc;
  i = *pp;
  d = *desc;
  d.transport[sizeof(d.transport) - 1] = '\0';
  d.locator[sizeof(d.locator) - 1] = '\0';
  if (i->state == LYNX_INST_READY && desc_equal(&i->desc, &d))
    return 0; /* a repeated report */
  {
    int pos = lynx__reg_accel_pos(i->node, i->accel_idx);
    if (pos >= 0) {
      i->node->accels[pos].failures = 0;
      i->node->accels[pos].retry_at_ms = 0;
    }
  }
  i->desc = d;
  i->state = LYNX_INST_READY;
  if (i->svc->last_error[0]) { /* it starts after all */
    i->svc->last_error[0] = 0;
    i->svc->last_error_ms = 0;
  }
  if (lynx_reg_inst_dispatchable(i))
    r->table_dirty = 1;
  r->version++;
  for (struct lynx_reg_instance *j = r->instances; j; j = j->next)
    if (j->replaced_by == i->id && j->state == LYNX_INST_READY)
      lynx__reg_inst_retire(r, j, now_ms);
  /* no frontend (and settled): at once */
  lynx__reg_retire_check_all(r, now_ms);
  lynx__reg_table_commit(r);
  return 0;
}

int lynx_reg_instance_failed(struct lynx_registry *r, const char *node_id,
                             uint64_t epoch, uint64_t instance_id,
                             const char *why, uint64_t now_ms) {
  struct lynx_reg_instance **pp;
  int rc;
  rc = inst_of_node(r, node_id, epoch, instance_id, &pp);
  if (rc)
    return rc;
  r->now_ms = now_ms;
  {
    struct lynx_reg_instance *i = *pp;
    int pos = lynx__reg_accel_pos(i->node, i->accel_idx);
    /* the operator sees why in the service's state: an agent's text,
     * cleaned (a byte that is not UTF-8 becomes '?') */
    snprintf(i->svc->last_error, sizeof(i->svc->last_error),
             "instance on %s/%u %s: ", node_id, i->accel_idx,
             i->state == LYNX_INST_STARTING ? "failed to start" : "failed");
    lynx_text_clean(i->svc->last_error + strlen(i->svc->last_error),
                    sizeof(i->svc->last_error) - strlen(i->svc->last_error),
                    why ? why : "");
    i->svc->last_error_ms = now_ms;
    i->svc->failures++;
    r->version++;
    if (pos >= 0) {
      struct lynx_reg_accel *a = &i->node->accels[pos];
      uint32_t f = a->failures < 8 ? a->failures : 8;
      uint64_t backoff = 200ull << f;
      a->failures++;
      a->retry_at_ms = now_ms + (backoff > 30000 ? 30000 : backoff);
      if (!r->next_retry_ms || a->retry_at_ms < r->next_retry_ms)
        r->next_retry_ms = a->retry_at_ms;
    }
  }
  /* Forgotten now; placement starts it again once the accelerator's
   * backoff has passed (so an app that cannot start is not hammered). */
  lynx__reg_inst_forget_at(r, pp);
  lynx__reg_table_commit(r);
  return 0;
}
