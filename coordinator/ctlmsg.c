/* ctlmsg.c - control messages into the registry's types; see ctlmsg.h. */
#include "ctlmsg.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "desc.h"
#include "wire.h"

/* An application's name from an agent the registry can keep: present,
 * shorter than its field, text. */
static int app_name_fits(const char *s) {
  return s && strlen(s) < LYNX_APP_NAME_MAX && lynx_text_ok(s, strlen(s));
}

/* An agent's words shown to operators only, into out: cut to its size,
 * and nothing that is not text. */
static void shown_text(char *out, size_t len, const char *s) {
  if (!s)
    s = "";
  snprintf(out, len, "%s",
           lynx_text_ok(s, strlen(s)) ? s : "(not valid UTF-8)");
}

int lynx_ctl_register(const Lynx__Register *m, struct lynx_label *labels,
                      struct lynx_accel_info *accels,
                      struct lynx_reg_adopt **adopt, uint32_t *n_adopt,
                      char *err, size_t errlen) {
  struct lynx_reg_adopt *a;
  memset(labels, 0, LYNX_LABELS_MAX * sizeof(*labels));
  memset(accels, 0, LYNX_ACCELS_MAX * sizeof(*accels));
  *adopt = NULL;
  *n_adopt = 0;
  if (m->n_labels > LYNX_LABELS_MAX || m->n_accels > LYNX_ACCELS_MAX) {
    snprintf(err, errlen,
             "too many labels (%zu, max %d) or accelerators (%zu, max %d)",
             m->n_labels, LYNX_LABELS_MAX, m->n_accels, LYNX_ACCELS_MAX);
    return -EINVAL;
  }
  for (size_t i = 0; i < m->n_labels; i++) {
    /* a label is matched by selectors: cut, it would silently be another */
    if ((m->labels[i]->key &&
         strlen(m->labels[i]->key) >= sizeof(labels[i].key)) ||
        (m->labels[i]->value &&
         strlen(m->labels[i]->value) >= sizeof(labels[i].value))) {
      snprintf(err, errlen, "labels[%zu]: key or value longer than %zu bytes",
               i, sizeof(labels[i].key) - 1);
      return -EINVAL;
    }
    snprintf(labels[i].key, sizeof(labels[i].key), "%s",
             m->labels[i]->key ? m->labels[i]->key : "");
    snprintf(labels[i].value, sizeof(labels[i].value), "%s",
             m->labels[i]->value ? m->labels[i]->value : "");
  }
  for (size_t i = 0; i < m->n_accels; i++) {
    const Lynx__AccelInfo *ai = m->accels[i];
    accels[i].idx = ai->idx;
    snprintf(accels[i].kind, sizeof(accels[i].kind), "%s",
             ai->kind ? ai->kind : "");
    snprintf(accels[i].model, sizeof(accels[i].model), "%s",
             ai->model ? ai->model : "");
    accels[i].memory_bytes = ai->memory_bytes;
    accels[i].ordering =
        ai->ordering == LYNX__ORDERING__ORDERING_FENCED ? 1u : 0u;
    /* a bus id too long for any real one is cut, not refused: it is only
     * shown to operators */
    snprintf(accels[i].pci_bus_id, sizeof(accels[i].pci_bus_id), "%s",
             ai->pci_bus_id ? ai->pci_bus_id : "");
    accels[i].gpudirect_rdma = ai->gpudirect_rdma ? 1 : 0;
    accels[i].rdma_writes_ordering = ai->rdma_writes_ordering;
    accels[i].resident_blocks = ai->resident_blocks;
    accels[i].instance_blocks = ai->instance_blocks;
    /* an app name no agent could run is dropped, not refused, and so is
     * one whose back-end name no service could give: placement only ever
     * compares names the API took. app_backends[k] belongs to apps[k]:
     * both lists are taken, or only apps. */
    accels[i].has_app_backends = ai->n_app_backends == ai->n_apps;
    for (size_t k = 0; k < ai->n_apps && accels[i].n_apps < LYNX_APPS_MAX;
         k++) {
      const char *be = accels[i].has_app_backends && ai->app_backends[k]
                           ? ai->app_backends[k]
                           : "";
      if (!app_name_fits(ai->apps[k]) || strlen(be) >= LYNX_BACKEND_NAME_MAX ||
          !lynx_text_ok(be, strlen(be)))
        continue;
      snprintf(accels[i].app_backends[accels[i].n_apps], LYNX_BACKEND_NAME_MAX,
               "%s", be);
      snprintf(accels[i].apps[accels[i].n_apps++], LYNX_APP_NAME_MAX, "%s",
               ai->apps[k]);
    }
  }
  a = calloc(m->n_instances + 1, sizeof(*a));
  if (!a) {
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  for (size_t i = 0; i < m->n_instances; i++) {
    const Lynx__InstanceInfo *ii = m->instances[i];
    char why[200];
    /* an instance we cannot understand is adopted under no service, which
     * makes the registry ask the agent to stop it */
    a[i].instance_id = ii->instance_id;
    a[i].accel_idx = ii->accel_idx;
    snprintf(
        a[i].service, sizeof(a[i].service), "%s",
        ii->service && ii->region &&
                lynx_desc_from_pb(ii->region, &a[i].desc, why, sizeof(why)) == 0
            ? ii->service
            : "");
  }
  *adopt = a;
  *n_adopt = (uint32_t)m->n_instances;
  return 0;
}

uint32_t lynx_ctl_refused_apps(const Lynx__Register *m,
                               struct lynx_app_refusal *out) {
  uint32_t n = 0;
  for (size_t i = 0; i < m->n_refused_apps && n < LYNX_REFUSED_APPS_MAX; i++) {
    const Lynx__AppRefused *a = m->refused_apps[i];
    if (!app_name_fits(a->name) || !a->name[0])
      continue;
    snprintf(out[n].name, sizeof(out[n].name), "%s", a->name);
    shown_text(out[n].reason, sizeof(out[n].reason), a->reason);
    n++;
  }
  return n;
}

uint32_t lynx_ctl_app_faults(const Lynx__Heartbeat *hb,
                             struct lynx_app_fault *out) {
  uint32_t n = 0;
  memset(out, 0, LYNX_APP_FAULTS_MAX * sizeof(*out));
  for (size_t i = 0; i < hb->n_app_faults && n < LYNX_APP_FAULTS_MAX; i++) {
    const Lynx__AppFault *a = hb->app_faults[i];
    if (!app_name_fits(a->name) || !a->name[0])
      continue;
    snprintf(out[n].name, sizeof(out[n].name), "%s", a->name);
    shown_text(out[n].last_death, sizeof(out[n].last_death), a->last_death);
    out[n].restarts = a->restarts;
    out[n].lost = a->lost;
    n++;
  }
  return n;
}

uint32_t lynx_ctl_heartbeat(const Lynx__Heartbeat *hb,
                            struct lynx_accel_report *rep) {
  uint32_t n = hb->n_counters > LYNX_ACCELS_MAX ? LYNX_ACCELS_MAX
                                                : (uint32_t)hb->n_counters;
  for (uint32_t i = 0; i < n; i++) {
    const Lynx__AccelCounters *ac = hb->counters[i];
    memset(&rep[i], 0, sizeof(rep[i]));
    rep[i].idx = ac->idx;
    rep[i].requests = ac->requests;
    rep[i].responses = ac->responses;
    rep[i].device_lost = ac->device_lost ? 1 : 0;
    rep[i].failed = ac->failed ? 1 : 0;
    rep[i].stalled_mqueues = ac->stalled_mqueues;
    rep[i].stall_ms = ac->stall_ms;
    rep[i].lat.window_requests = ac->window_requests;
    rep[i].lat.queue_p50_ns = ac->queue_p50_ns;
    rep[i].lat.queue_p99_ns = ac->queue_p99_ns;
    rep[i].lat.service_p50_ns = ac->service_p50_ns;
    rep[i].lat.service_p99_ns = ac->service_p99_ns;
    rep[i].blocks_held = ac->blocks_held;
    /* an agent's error text of any length ends up cut to the field */
    snprintf(rep[i].last_error, sizeof(rep[i].last_error), "%s",
             ac->last_error ? ac->last_error : "");
  }
  return n;
}

struct lynx_fe_claim *lynx_ctl_claims(const Lynx__Hello *h) {
  struct lynx_fe_claim *c = calloc(h->n_produces + 1, sizeof(*c));
  for (size_t k = 0; c && k < h->n_produces; k++) {
    c[k].instance_id = h->produces[k]->instance_id;
    c[k].epoch = h->produces[k]->epoch;
  }
  return c;
}

struct lynx_fe_mq_report *lynx_ctl_fe_mqueues(const Lynx__FrontendStatus *st) {
  struct lynx_fe_mq_report *mq = calloc(st->n_mqueues + 1, sizeof(*mq));
  for (size_t i = 0; mq && i < st->n_mqueues; i++) {
    mq[i].instance_id = st->mqueues[i]->instance_id;
    mq[i].q = st->mqueues[i]->q;
    mq[i].outstanding = st->mqueues[i]->outstanding;
    mq[i].dispatched = st->mqueues[i]->dispatched;
    mq[i].responded = st->mqueues[i]->responded;
    mq[i].transport = 1 + lynx_transport_id(st->mqueues[i]->transport);
  }
  return mq;
}

struct lynx_fe_listen *lynx_ctl_fe_listens(const Lynx__FrontendStatus *st,
                                           uint32_t *n) {
  uint32_t nl = st->n_services < 1024 ? (uint32_t)st->n_services : 1024;
  struct lynx_fe_listen *fl = calloc(nl + 1, sizeof(*fl));
  *n = fl ? nl : 0;
  for (uint32_t k = 0; fl && k < nl; k++) {
    const Lynx__ServiceListen *sl = st->services[k];
    snprintf(fl[k].service, sizeof(fl[k].service), "%s",
             sl->service ? sl->service : "");
    fl[k].listening = sl->listening;
    lynx_text_clean(fl[k].error, sizeof(fl[k].error),
                    sl->error ? sl->error : "");
  }
  return fl;
}
