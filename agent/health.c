/*
 * health.c - what the agent's heartbeat says about each accelerator.
 *
 * Data-path liveness, the same for CPU and CUDA accelerators: the RX
 * consumer index of a server mqueue must move while a request is pending.
 * Every HEALTH_MS the agent reads the server mqueues' indices (actrl and
 * fctrl, one read each) and the seq word of each one's RX slot at rx_cons,
 * through the transport's view of the region (host memory, or copies out of GPU
 * memory). A request is pending when that slot is published for position
 * rx_cons (seq == rx_cons + 1). A mqueue is stalled when a request has been
 * pending at the same rx_cons for the stall period: --stall-ms plus the
 * emulated work of one pass over the instance's mqueues (a busy accelerator is
 * not a hung one). A mqueue whose TX ring is full waits for the frontend, not
 * for its application: not a stall. Client mqueues are not watched: their RX
 * ring holds back-end replies an application collects when it calls, not
 * requests.
 *
 * Device health, from the accelerator's backend (its health op): present,
 * the last error, and whether it is sticky. The coordinator takes an
 * accelerator out of dispatch while it is lost, failed or has a stalled
 * mqueue, and puts it back when that clears: a stalled app that resumes
 * serves again without a restart. A plug-in's process whose instance
 * stalls is killed instead and taken over (apphost.c): one application's
 * hang takes no other out of dispatch.
 */
#include <stdio.h>
#include <string.h>

#include "agent.h"
#include "log.h"
#include "mqueue.h"
#include "options.h"
#include "util.h"

#define HEALTH_MS 250u

/* Watches one instance's server mqueues; adds its stalls to its
 * accelerator's. */
static void watch_instance(struct agent *ag, struct instance *in,
                           uint64_t now_ns) {
  /* every server mqueue's indices in two reads (copies, for a GPU) */
  struct lynx_actrl a[LYNX_MQUEUES_MAX];
  struct lynx_fctrl f[LYNX_MQUEUES_MAX];
  struct agent_accel *acc = &ag->acc[in->accel];
  /* the lease fence holds every accelerator back on purpose: not a stall */
  int fenced = now_ns >= __atomic_load_n(&ag->serve_until_ns, __ATOMIC_ACQUIRE);
  struct lynx_geom g;
  uint64_t period_ns = ((uint64_t)ag->cfg.stall_ms * 1000u +
                        (uint64_t)in->n_server * in->work_us) *
                       1000u;
  if (lynx_geom_init(&g, in->desc.n_mqueues, in->desc.slots, in->desc.slot_size,
                     in->desc.large_bytes) ||
      lynx_region_read(&in->region, lynx_actrl_off(&g, 0), a,
                       in->n_server * sizeof(a[0])) ||
      lynx_region_read(&in->region, lynx_fctrl_off(&g, 0), f,
                       in->n_server * sizeof(f[0])))
    return; /* a device read failed: the backend's health op reports it */
  for (uint32_t q = 0; q < in->n_server; q++) {
    struct mq_watch *w = &in->watch[q];
    uint32_t cons = a[q].rx_cons;
    struct lynx_slot_meta m;
    uint64_t stall_ms;
    int pending;
    if (lynx_region_read(&in->region,
                         lynx_slot_off(&g, lynx_rx_ring_off(&g, q), cons) +
                             g.slot_size - LYNX_META_SIZE,
                         &m, sizeof(m)))
      return;
    /* A full TX ring holds the accelerator back through no fault of its
     * own (the frontend collects no answers): not a stall; nor does the
     * lease fence. */
    pending = m.seq == lynx_seq_for(cons) && !fenced &&
              !lynx_ring_full(a[q].tx_prod, f[q].tx_cons, g.slots);
    if (!pending || cons != w->cons || !w->since_ns) {
      if (w->stalled)
        LYNX_INFO("agent",
                  "%s: accel %u instance %llu (%s): mqueue %u "
                  "consumes again (rx_cons %u)",
                  ag->node_id, in->accel, (unsigned long long)in->id,
                  in->service, q, cons);
      w->stalled = 0;
      w->cons = cons;
      w->since_ns = pending ? now_ns : 0;
      continue;
    }
    if (now_ns - w->since_ns < period_ns)
      continue;
    stall_ms = (now_ns - w->since_ns) / 1000000u;
    /* a plug-in's process that hangs is killed and taken over: its stall
     * takes nothing else on the accelerator out of dispatch */
    if (agent_apphost_hung(ag, in, stall_ms)) {
      w->since_ns = 0;
      continue;
    }
    if (!w->stalled)
      LYNX_WARN("agent",
                "%s: accel %u instance %llu (%s): mqueue %u has had "
                "a request pending for %llu ms without its consumer index "
                "moving (rx_cons %u): the application stopped consuming",
                ag->node_id, in->accel, (unsigned long long)in->id, in->service,
                q, (unsigned long long)stall_ms, cons);
    w->stalled = 1;
    acc->stalled_mqueues++;
    if (stall_ms > acc->stall_ms)
      acc->stall_ms = stall_ms;
  }
}

void agent_health_blocks(struct agent *ag) {
  for (uint32_t i = 0; i < ag->n_acc; i++) {
    struct agent_accel *a = &ag->acc[i];
    uint32_t resident = 0, held = 0;
    /* a device that cannot say keeps what it said last */
    if (a->info.ops->blocks(&a->info, ag->cfg.gpu_threads, &resident, &held) ==
        0) {
      a->resident_blocks = resident;
      a->blocks_held = held;
    }
  }
}

/*
 * Accelerator i's last error is sticky: a GPU whose CUDA context a fault
 * in a kernel poisoned, so that every kernel of this process on it is dead
 * and CUDA gives that context back only to a fresh process ("the process
 * must be terminated and relaunched", cudaErrorIllegalAddress). Each
 * instance on it is reported failed with the error and stopped, so the
 * coordinator places it again elsewhere at once; then the agent drains the
 * others and exits for its supervisor to start it again (ag->restart).
 */
static void device_failed(struct agent *ag, uint32_t i) {
  struct agent_accel *a = &ag->acc[i];
  char why[400];
  uint32_t n = 0;
  snprintf(why, sizeof(why),
           "accel %u (%s) failed: %s (its context is unusable: every "
           "instance on it failed; the agent restarts to recover it)",
           i, a->info.where, a->last_error[0] ? a->last_error : "?");
  for (struct instance *in = ag->instances, *next; in; in = next) {
    next = in->next;
    if (in->accel != i)
      continue;
    if (ag->report_failed)
      ag->report_failed(ag, in->id, why);
    agent_instance_stop(ag, in);
    n++;
  }
  LYNX_ERR("agent",
           "%s: accel %u (%s): %u instances failed with it; CUDA recovers "
           "such a context only in a fresh process: the agent %sexits with "
           "status %d for its supervisor to restart it (systemd: "
           "Restart=on-failure)",
           ag->node_id, i, a->info.where, n,
           ag->report_failed ? "drains its other instances and " : "",
           LYNX_EXIT_RESTART);
  if (ag->restart)
    ag->restart(ag, why);
}

void agent_health_sample(struct agent *ag, uint64_t now_ns) {
  for (uint32_t i = 0; i < ag->n_acc; i++) {
    struct agent_accel *a = &ag->acc[i];
    int lost = 0, failed = 0;
    a->stalled_mqueues = 0;
    a->stall_ms = 0;
    a->info.ops->health(&a->info, &lost, &failed, a->last_error,
                        sizeof(a->last_error));
    if ((lost && !a->device_lost) || (failed && !a->failed))
      LYNX_ERR("agent", "%s: accel %u (%s) %s: %s", ag->node_id, i,
               a->info.where, lost ? "is gone" : "failed", a->last_error);
    a->device_lost = lost;
    if (failed && !a->failed) {
      a->failed = failed;
      device_failed(ag, i);
    }
    a->failed = failed;
  }
  for (struct instance *in = ag->instances; in; in = in->next)
    if (in->running)
      watch_instance(ag, in, now_ns);
  agent_stats_sample(ag, now_ns);
}

static void on_health(uv_timer_t *t) {
  struct agent *ag = t->data;
  agent_health_sample(ag, lynx_now_ns());
}

void agent_health_start(struct agent *ag) {
  uv_timer_init(&ag->loop, &ag->health);
  ag->health.data = ag;
  ag->health_open = 1;
  uv_timer_start(&ag->health, on_health, HEALTH_MS, HEALTH_MS);
}

void agent_health_stop(struct agent *ag) {
  if (!ag->health_open)
    return;
  ag->health_open = 0;
  uv_close((uv_handle_t *)&ag->health, NULL);
}
