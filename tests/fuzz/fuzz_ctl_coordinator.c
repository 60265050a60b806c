/*
 * fuzz_ctl_coordinator.c - what an agent or a frontend sends the
 * coordinator on its control connection, taken as coordinator/main.c
 * takes it (coordinator/ctlmsg.c, the registry's calls), into a registry
 * of its own: Hello (lynx_hello_check, the id), then for an agent Register
 * (lynx_ctl_register, lynx_reg_register_adopt), Heartbeat, InstanceReady
 * (lynx_desc_from_pb), InstanceFailed and Leave; for a frontend its claims
 * (Hello.produces) and FrontendStatus. After each message the clock moves on
 * (lynx_reg_tick) and the registry is encoded as the JSON API shows it,
 * which must parse back: an agent's strings end up in the API's answers.
 *
 * The registry holds one service (sockperf-echo on every accelerator), so
 * that registering places instances, with ids from 1, and an agent can
 * report them ready or failed, or adopt them.
 *
 * Input: one byte: bits 0-3 the size of the pieces the stream is read in
 * (fuzz_ctl_frame.c), bit 4: the coordinator has a token ("fuzz-token");
 * one byte: milliseconds the clock moves after each message (times 16);
 * then the stream of frames.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <json-c/json.h>

#include "ctl_check.h"
#include "ctlconn.h"
#include "ctlmsg.h"
#include "fuzz.h"
#include "regjson.h"
#include "registry.h"

enum role { ROLE_NONE, ROLE_AGENT, ROLE_FRONTEND };

struct peer {
  struct lynx_registry reg;
  const char *token;
  enum role role;
  int registered;
  char id[LYNX_ID_MAX];
  uint64_t now, step, epochs;
};

static void on_hello(struct peer *p, const Lynx__Hello *h, int *rc) {
  const char *role = h->role ? h->role : "";
  char err[400];
  *rc = FZ_CTL_CLOSE;
  if (lynx_hello_check(h, p->token, err, sizeof(err)) || !h->id || !*h->id ||
      strlen(h->id) >= LYNX_ID_MAX)
    return;
  snprintf(p->id, sizeof(p->id), "%s", h->id);
  if (!strcmp(role, "agent")) {
    p->role = ROLE_AGENT;
  } else if (!strcmp(role, "frontend")) {
    struct lynx_fe_claim *c = lynx_ctl_claims(h);
    p->role = ROLE_FRONTEND;
    lynx_reg_frontend_connect(&p->reg, p->id, "127.0.0.1:1", p, p->now);
    if (c)
      lynx_reg_frontend_claims(&p->reg, p->id, c, (uint32_t)h->n_produces);
    free(c);
    lynx_reg_frontend_set_active(&p->reg, p->id, 1);
    lynx_reg_partition(&p->reg, p->now);
  } else {
    return;
  }
  *rc = FZ_CTL_TRUST;
}

static int on_register(struct peer *p, const Lynx__Register *m) {
  struct lynx_label labels[LYNX_LABELS_MAX];
  struct lynx_accel_info accels[LYNX_ACCELS_MAX];
  struct lynx_reg_adopt *adopt = NULL;
  struct lynx_reg_err err;
  uint64_t epoch = m->epoch ? m->epoch : ++p->epochs; /* the store's */
  uint32_t n_adopt = 0;
  int rc;
  if (!m->node_id || strcmp(m->node_id, p->id))
    return -EINVAL;
  memset(&err, 0, sizeof(err));
  rc = lynx_ctl_register(m, labels, accels, &adopt, &n_adopt, err.message,
                         sizeof(err.message));
  if (!rc)
    rc = lynx_reg_register_adopt(
        &p->reg, m->node_id, m->address ? m->address : "", epoch, labels,
        (uint32_t)m->n_labels, accels, (uint32_t)m->n_accels, adopt, n_adopt, p,
        p->now, &err);
  FZ_CHECK(rc == 0 || err.message[0]);
  if (rc == 0) { /* as ctlport.c: the plug-ins it refused */
    struct lynx_app_refusal ref[LYNX_REFUSED_APPS_MAX];
    uint32_t n = lynx_ctl_refused_apps(m, ref);
    FZ_CHECK(n <= LYNX_REFUSED_APPS_MAX);
    lynx_reg_node_refused(&p->reg, m->node_id, ref, n);
  }
  free(adopt);
  return rc;
}

static int on_agent(struct peer *p, const Lynx__Envelope *env) {
  struct lynx_region_desc d;
  switch (env->msg_case) {
  case LYNX__ENVELOPE__MSG_HEARTBEAT: {
    struct lynx_accel_report rep[LYNX_ACCELS_MAX];
    struct lynx_app_fault faults[LYNX_APP_FAULTS_MAX];
    uint32_t n = lynx_ctl_heartbeat(env->heartbeat, rep);
    int rc = lynx_reg_heartbeat(&p->reg, p->id, env->heartbeat->epoch, rep, n,
                                p->now);
    if (rc == 0) /* as ctlport.c: its plug-ins' deaths */
      lynx_reg_node_app_faults(&p->reg, p->id, faults,
                               lynx_ctl_app_faults(env->heartbeat, faults));
    return rc;
  }
  case LYNX__ENVELOPE__MSG_INSTANCE_READY: {
    const Lynx__InstanceReady *ir = env->instance_ready;
    if (!ir->region || fz_ctl_desc(ir->region, &d))
      return lynx_reg_instance_failed(&p->reg, p->id, ir->epoch,
                                      ir->instance_id, "bad region", p->now);
    return lynx_reg_instance_ready(&p->reg, p->id, ir->epoch, ir->instance_id,
                                   &d, p->now);
  }
  case LYNX__ENVELOPE__MSG_INSTANCE_FAILED: {
    const Lynx__InstanceFailed *f = env->instance_failed;
    return lynx_reg_instance_failed(&p->reg, p->id, f->epoch, f->instance_id,
                                    f->error ? f->error : "", p->now);
  }
  case LYNX__ENVELOPE__MSG_LEAVE:
    if (env->leave->drain)
      return lynx_reg_leave_drain(&p->reg, p->id, env->leave->epoch, p->now);
    return lynx_reg_leave(&p->reg, p->id, env->leave->epoch, p->now);
  default:
    return -EPROTO;
  }
}

static int on_frontend(struct peer *p, const Lynx__Envelope *env) {
  const Lynx__FrontendStatus *st = env->frontend_status;
  struct lynx_fe_mq_report *mq;
  struct lynx_fe_listen *fl;
  uint32_t nl;
  if (env->msg_case != LYNX__ENVELOPE__MSG_FRONTEND_STATUS)
    return -EPROTO;
  mq = lynx_ctl_fe_mqueues(st);
  fl = lynx_ctl_fe_listens(st, &nl);
  if (mq)
    lynx_reg_frontend_status(&p->reg, p->id, st->table_version, mq,
                             (uint32_t)st->n_mqueues, p->now);
  if (mq && fl)
    lynx_reg_frontend_listen(&p->reg, p->id, fl, nl);
  free(mq);
  free(fl);
  return 0;
}

/* The API's answers about everything the peer changed parse as JSON. */
static void check_json(struct peer *p) {
  struct json_object *all[] = {
      lynx_json_nodes(&p->reg, p->now), lynx_json_accels(&p->reg, p->now),
      lynx_json_mqueues(&p->reg), lynx_json_services(&p->reg, NULL),
      lynx_json_frontends(&p->reg, p->now)};
  for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
    const char *s;
    struct json_object *back;
    if (!all[i])
      continue; /* out of memory */
    s = json_object_to_json_string_ext(all[i], JSON_C_TO_STRING_PLAIN);
    back = s ? json_tokener_parse(s) : NULL;
    FZ_CHECK(!s || back);
    json_object_put(back);
    json_object_put(all[i]);
  }
}

static int on_msg(void *arg, const Lynx__Envelope *env) {
  struct peer *p = arg;
  int rc = 0;
  if (p->role == ROLE_NONE) {
    if (env->msg_case != LYNX__ENVELOPE__MSG_HELLO)
      return FZ_CTL_CLOSE;
    on_hello(p, env->hello, &rc);
  } else if (p->role == ROLE_AGENT && !p->registered) {
    if (env->msg_case != LYNX__ENVELOPE__MSG_REGISTER ||
        on_register(p, env->register_))
      return FZ_CTL_CLOSE;
    p->registered = 1;
  } else if (p->role == ROLE_AGENT) {
    rc = on_agent(p, env);
    rc = rc == -EPROTO || rc == -ESTALE || rc == -ENOTCONN || rc == -ENOENT
             ? FZ_CTL_CLOSE
             : 0;
  } else {
    rc = on_frontend(p, env) ? FZ_CTL_CLOSE : 0;
  }
  p->now += p->step;
  lynx_reg_tick(&p->reg, p->now);
  check_json(p);
  return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct fz f = {data, size};
  uint8_t flags = fz_u8(&f);
  struct peer p;
  struct lynx_service_spec spec;
  struct lynx_reg_err err;
  size_t n;
  const uint8_t *stream;
  fz_quiet();
  memset(&p, 0, sizeof(p));
  p.token = flags & 16 ? "fuzz-token" : NULL;
  p.step = 16u * fz_u8(&f);
  p.now = 1000000;
  stream = fz_rest(&f, &n);
  lynx_reg_init(&p.reg, 3000, 10000, NULL);
  memset(&spec, 0, sizeof(spec));
  memset(&err, 0, sizeof(err));
  snprintf(spec.name, sizeof(spec.name), "svc");
  snprintf(spec.proto, sizeof(spec.proto), "udp");
  snprintf(spec.app, sizeof(spec.app), "sockperf-echo");
  spec.port = 7000;
  spec.slot_size = 2048;
  spec.slots = 16;
  spec.mqueues_per_accel = 2;
  FZ_CHECK(lynx_reg_service_create(&p.reg, &spec, p.now, &err) == 0);
  fz_ctl_stream(stream, n,
                flags & 15 ? (size_t)1 << ((flags & 15) - 1) : SIZE_MAX,
                LYNX_CTL_UNTRUSTED_MAX, on_msg, &p);
  if (p.role == ROLE_AGENT)
    lynx_reg_node_disconnected(&p.reg, &p);
  else if (p.role == ROLE_FRONTEND)
    lynx_reg_frontend_disconnected(&p.reg, &p);
  lynx_reg_tick(&p.reg, p.now + 60000); /* leases run out */
  check_json(&p);
  lynx_reg_free(&p.reg);
  return 0;
}
