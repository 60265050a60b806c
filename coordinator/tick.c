/*
 * tick.c - the coordinator's loop timers and wake-ups: the lease tick
 * (leases, drains, placement retries; TICK_MS), settling after a start,
 * the API's wake-up (flush what it queued) and the election's role
 * changes (elect.h), applied on the loop.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordd.h"
#include "log.h"

/* ---- loop ------------------------------------------------------------ */

/* After a restart, or on becoming the leader, with services to serve: the
 * agents are finding us (their reconnect backoff is at most 2 s plus
 * jitter) and their instances are adopted as they register. Tables wait,
 * and no drain finishes, until every instance the frontends serve is
 * adopted again (frontends_settled) or a heartbeat lease (--suspect-ms, 3 s
 * at least) and a second have passed: a node not back by then is
 * suspect, out of the tables, as one that went silent. */
void coord_settle(struct coordinator *co) {
  co->c.reg.settle_until_ms =
      coord_now_ms() + (co->cfg.suspect_ms > 3000 ? co->cfg.suspect_ms : 3000) +
      1000;
}

/* 1 when every instance a connected frontend reports serving is known
 * again (its agent re-registered and it was adopted), and at least one
 * frontend has reported. */
static int frontends_settled(struct coordinator *co) {
  struct lynx_registry *r = &co->c.reg;
  int reported = 0;
  for (const struct lynx_reg_frontend *f = r->frontends; f; f = f->next) {
    if (!f->connected)
      continue;
    if (f->table_version_applied || f->n_mqs)
      reported = 1;
    for (uint32_t i = 0; i < f->n_mqs; i++) {
      int known = 0;
      for (const struct lynx_reg_instance *in = r->instances; in && !known;
           in = in->next)
        known = in->id == f->mqs[i].instance_id && in->state == LYNX_INST_READY;
      if (!known)
        return 0;
    }
  }
  return reported;
}

void coord_on_tick(uv_timer_t *t) {
  struct coordinator *co = t->data;
  uint64_t now = coord_now_ms();
  uint64_t expiries;
  int cut = 0;
  if (__atomic_load_n(&co->c.leader, __ATOMIC_ACQUIRE) &&
      !lynx_coord_leads(&co->c)) {
    /* not sure it still leads: it decides nothing (no lease expires, no
     * frontend is cut off, no table goes out) until etcd says; the tick
     * after credits the time to every lease, as a pause */
    if (!co->unsure) {
      char why[320];
      coord_unsure_why(co, why, sizeof(why));
      LYNX_WARN("coordinator", "%s", why);
    }
    co->unsure = 1;
    return;
  }
  if (co->unsure && __atomic_load_n(&co->c.leader, __ATOMIC_ACQUIRE))
    LYNX_INFO("coordinator", "etcd vouches for this coordinator's lead "
                             "again: it answers agents and frontends");
  co->unsure = 0;
  pthread_mutex_lock(&co->c.lock);
  expiries = co->c.reg.lease_expiries;
  lynx_reg_tick(&co->c.reg, now);
  if (co->c.reg.last_pause_ms)
    for (struct cpeer *p = co->peers; p; p = p->next)
      p->heard_ms = now; /* as leases: we could not hear them meanwhile */
  if (co->c.reg.last_pause_ms)
    LYNX_WARN("coordinator",
              "did not run for %llu ms (stopped or starved of "
              "CPU): every lease is extended by that much, as no heartbeat "
              "could be heard meanwhile",
              (unsigned long long)co->c.reg.last_pause_ms);
  if (co->c.reg.lease_expiries != expiries) /* rare: worth a scan */
    for (struct lynx_reg_node *n = co->c.reg.nodes; n; n = n->next)
      if (n->state == LYNX_NODE_DOWN && n->expired_ms == now)
        LYNX_WARN("coordinator",
                  "node %s is down: no heartbeat for its "
                  "lease; its instances leave the dispatch tables",
                  n->id);
  for (struct cpeer *p = co->peers; p; p = p->next)
    if ((p->role == ROLE_NONE || (p->role == ROLE_AGENT && !p->registered)) &&
        now - p->accepted_ms > HELLO_TIMEOUT_MS)
      lynx_ctl_close(&p->ctl, "no Hello/Register within 10 s");
    else if (p->role == ROLE_FRONTEND && !p->ctl.closing &&
             now - p->heard_ms > co->cfg.frontend_timeout_ms) {
      /* cut off (its host, or the network between): a standby takes over
       * with a newer epoch, which fences this one at the agents */
      char why[96];
      snprintf(why, sizeof(why), "silent for %llu ms (--frontend-timeout-ms)",
               (unsigned long long)(now - p->heard_ms));
      lynx_ctl_close(&p->ctl, why);
      cut = 1;
    }
  if (cut && !co->c.reg.settle_until_ms)
    coord_push_tables(co); /* its instances go to the other frontends now */
  if (co->c.reg.settle_until_ms &&
      (now >= co->c.reg.settle_until_ms || frontends_settled(co))) {
    LYNX_INFO("coordinator", "settled after the restart: pushing tables");
    co->c.reg.settle_until_ms = 0;
    coord_push_tables(co);
  }
  coord_after_change(co);
  pthread_mutex_unlock(&co->c.lock);
}

void coord_on_wake(uv_async_t *a) {
  struct coordinator *co = a->data;
  pthread_mutex_lock(&co->c.lock);
  coord_after_change(co);
  pthread_mutex_unlock(&co->c.lock);
}

/* The election thread says our role changed (elect.h). */
void coord_elect_changed(void *arg) {
  struct coordinator *co = arg;
  /* uv_async_send reads its pending flag with a plain load that nothing
   * orders after the role's store: had it seen the flag of a wake the
   * loop was clearing, coord_on_role could read the old role and no second
   * callback would come. Through role_lock, either the loop takes it
   * after us (and reads the new role) or we take it after the loop
   * cleared the flag (and our send wakes it again). */
  pthread_mutex_lock(&co->role_lock);
  pthread_mutex_unlock(&co->role_lock);
  uv_async_send(&co->role);
}

void coord_on_role(uv_async_t *a) {
  struct coordinator *co = a->data;
  if (co->stopping)
    return;
  pthread_mutex_lock(&co->role_lock); /* see coord_elect_changed */
  pthread_mutex_unlock(&co->role_lock);
  if (__atomic_load_n(&co->c.leader, __ATOMIC_ACQUIRE)) {
    /* as after a restart: the agents are finding us (the reloaded
     * services' instances are adopted as they register) */
    pthread_mutex_lock(&co->c.lock);
    if (co->c.reg.services)
      coord_settle(co);
    coord_after_change(co);
    pthread_mutex_unlock(&co->c.lock);
    return;
  }
  /* not leading: agents and frontends go and find the leader */
  for (struct cpeer *p = co->peers; p; p = p->next)
    lynx_ctl_close(&p->ctl, "this coordinator no longer leads");
  /* a follower follows no node's lease (registry.h): were it to keep
   * them, it would declare them down on its own and, leading again,
   * refuse their epochs and make them discard their instances */
  pthread_mutex_lock(&co->c.lock);
  if (!__atomic_load_n(&co->c.leader, __ATOMIC_ACQUIRE) &&
      lynx_reg_nodes_release(&co->c.reg))
    coord_after_change(co);
  pthread_mutex_unlock(&co->c.lock);
}
