/*
 * ctlmsg.h - what the coordinator takes from the control messages agents
 * and frontends send it (lynx.proto) into the registry's types, with the
 * refusals it makes on the way. coordinator/main.c reads every message
 * through these; the fuzzer feeds the registry through them what a
 * hostile peer could send (tests/fuzz/fuzz_ctl_coordinator.c).
 *
 * Everything here comes from the network: every count is bounded by the
 * registry's limits (proto/wire.h) before it is used, a string too long
 * for its field is cut or refused as each function says.
 */
#ifndef LYNX_CTLMSG_H
#define LYNX_CTLMSG_H

#include <stddef.h>
#include <stdint.h>

#include "lynx.pb-c.h"
#include "registry.h"

/* A Register's labels (labels: room for LYNX_LABELS_MAX), accelerators
 * (accels: LYNX_ACCELS_MAX) and the instances the agent still runs
 * (*adopt: malloc'd, the caller frees it; *n_adopt of them). 0, or
 * -EINVAL (too many labels or accelerators; a label longer than its
 * field: a selector would match it as another) or -ENOMEM, with the
 * reason in err. An accelerator's strings too long are cut (they are only
 * shown), an application name no agent could run is dropped; an instance
 * whose service or region does not read is adopted under no service, so
 * that the registry asks the agent to stop it. */
int lynx_ctl_register(const Lynx__Register *m, struct lynx_label *labels,
                      struct lynx_accel_info *accels,
                      struct lynx_reg_adopt **adopt, uint32_t *n_adopt,
                      char *err, size_t errlen);

/* A Register's refused plug-ins into out (room for LYNX_REFUSED_APPS_MAX;
 * more are ignored, texts too long are cut, one without a valid name is
 * dropped): how many. */
uint32_t lynx_ctl_refused_apps(const Lynx__Register *m,
                               struct lynx_app_refusal *out);

/* A Heartbeat's reports of plug-ins' deaths into out (room for
 * LYNX_APP_FAULTS_MAX; texts cut, one without a valid name dropped): how
 * many. */
uint32_t lynx_ctl_app_faults(const Lynx__Heartbeat *hb,
                             struct lynx_app_fault *out);

/* A Heartbeat's counters into rep (room for LYNX_ACCELS_MAX; more are
 * ignored, an error text of any length is cut to its field): how many. */
uint32_t lynx_ctl_heartbeat(const Lynx__Heartbeat *hb,
                            struct lynx_accel_report *rep);

/* What a frontend's Hello says it produces into (Hello.produces), as
 * lynx_reg_frontend_claims takes it: calloc'd, h->n_produces of them, or
 * NULL when out of memory. */
struct lynx_fe_claim *lynx_ctl_claims(const Lynx__Hello *h);

/* A FrontendStatus's per-mqueue counters: calloc'd, st->n_mqueues of
 * them, or NULL when out of memory. */
struct lynx_fe_mq_report *lynx_ctl_fe_mqueues(const Lynx__FrontendStatus *st);

/* Its listeners, at most 1024 (*n of them; error texts made fit for the
 * API, lynx_text_clean): calloc'd, or NULL when out of memory. */
struct lynx_fe_listen *lynx_ctl_fe_listens(const Lynx__FrontendStatus *st,
                                           uint32_t *n);

#endif
