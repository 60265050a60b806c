/* test_registry.c - unit tests of the registry (coordinator/registry.c,
 * reg_*.c): node state machine, leases on an injected clock, epochs, placement,
 * drain, dispatch table versions, service validation. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "mqueue.h"
#include "registry.h"
#include "ut_main.h"
#include "ut_spec.h"

#define LEASE 3000
#define DRAIN_TIMEOUT 10000
#define REC_MAX 512

/* ---- fixture: a registry whose actions are recorded ----------------- */

struct rec_start {
  char node[LYNX_ID_MAX];
  uint64_t id;
  uint32_t accel;
  char svc[LYNX_ID_MAX];
};

struct rec_stop {
  char node[LYNX_ID_MAX];
  uint64_t id;
};

struct fx {
  struct lynx_registry r;
  int n_start, n_stop, n_tables;
  struct rec_start start[REC_MAX];
  struct rec_stop stop[REC_MAX];
  int table_len_at_push; /* dispatchable instances seen by the last push */
};

static void on_start(void *data, struct lynx_reg_node *node,
                     struct lynx_reg_instance *inst) {
  struct fx *f = data;
  assert_true(f->n_start < REC_MAX);
  assert_ptr_equal(inst->node, node);
  assert_int_equal(inst->state, LYNX_INST_STARTING);
  snprintf(f->start[f->n_start].node, LYNX_ID_MAX, "%s", node->id);
  snprintf(f->start[f->n_start].svc, LYNX_ID_MAX, "%s", inst->svc->spec.name);
  f->start[f->n_start].id = inst->id;
  f->start[f->n_start].accel = inst->accel_idx;
  f->n_start++;
}

static void on_stop(void *data, struct lynx_reg_node *node, uint64_t id) {
  struct fx *f = data;
  assert_true(f->n_stop < REC_MAX);
  snprintf(f->stop[f->n_stop].node, LYNX_ID_MAX, "%s", node->id);
  f->stop[f->n_stop].id = id;
  f->n_stop++;
}

static void count_fn(void *arg, const struct lynx_reg_service *svc,
                     const struct lynx_reg_instance *inst) {
  (void)svc;
  (void)inst;
  (*(int *)arg)++;
}

static int table_len(struct lynx_registry *r) {
  int n = 0;
  lynx_reg_table_foreach(r, count_fn, &n);
  return n;
}

static void on_tables(void *data) {
  struct fx *f = data;
  f->n_tables++;
  /* the registry is consistent when it pushes */
  f->table_len_at_push = table_len(&f->r);
}

static int fx_setup(void **state) {
  struct fx *f = calloc(1, sizeof(*f));
  struct lynx_reg_ops ops = {on_start, on_stop, on_tables, NULL, NULL};
  if (!f)
    return -1;
  ops.data = f;
  lynx_reg_init(&f->r, LEASE, DRAIN_TIMEOUT, &ops);
  *state = f;
  return 0;
}

static int fx_teardown(void **state) {
  struct fx *f = *state;
  lynx_reg_free(&f->r);
  free(f);
  return 0;
}

/* ---- helpers -------------------------------------------------------- */

static int reg_node(struct lynx_registry *r, const char *id, uint64_t epoch,
                    uint32_t n_accels, const char *labels, uint64_t now) {
  struct lynx_accel_info acc[LYNX_ACCELS_MAX];
  struct lynx_label lab[LYNX_LABELS_MAX];
  struct lynx_reg_err err;
  uint32_t n_lab = 0, a;
  char addr[64];
  memset(acc, 0, sizeof(acc));
  for (a = 0; a < n_accels; a++) {
    acc[a].idx = a;
    snprintf(acc[a].kind, sizeof(acc[a].kind), "cpu");
    snprintf(acc[a].model, sizeof(acc[a].model), "emulated");
    acc[a].memory_bytes = 1u << 30;
    acc[a].ordering = 0;
  }
  assert_int_equal(lynx_labels_parse(labels, lab, LYNX_LABELS_MAX, &n_lab), 0);
  snprintf(addr, sizeof(addr), "127.0.0.1:%u", (unsigned)(7700 + epoch % 100));
  return lynx_reg_register(r, id, addr, epoch, lab, n_lab, acc, n_accels,
                           (void *)0x1, now, &err);
}

static void add_service(struct lynx_registry *r, const char *name,
                        uint32_t port, uint32_t replicas, const char *sel) {
  struct lynx_service_spec s = ut_spec(name, port, replicas, sel);
  struct lynx_reg_err err;
  assert_int_equal(lynx_reg_service_create(r, &s, 0, &err), 0);
}

static struct lynx_region_desc desc_for(const struct lynx_reg_instance *i) {
  return ut_desc_for(i, 1 << 20);
}

/* Every STARTING instance reports ready. */
static int ready_all(struct lynx_registry *r, uint64_t now) {
  struct lynx_reg_instance *i;
  int n = 0;
  for (i = r->instances; i; i = i->next)
    if (i->state == LYNX_INST_STARTING) {
      struct lynx_region_desc d = desc_for(i);
      assert_int_equal(lynx_reg_instance_ready(r, i->node->id, i->node->epoch,
                                               i->id, &d, now),
                       0);
      n++;
    }
  return n;
}

/* Instances matching node id / service name / state (NULL, NULL, -1: all). */
static int count_inst(struct lynx_registry *r, const char *node,
                      const char *svc, int state) {
  struct lynx_reg_instance *i;
  int n = 0;
  for (i = r->instances; i; i = i->next)
    if ((!node || !strcmp(i->node->id, node)) &&
        (!svc || !strcmp(i->svc->spec.name, svc)) &&
        (state < 0 || (int)i->state == state))
      n++;
  return n;
}

static enum lynx_node_state node_state(struct lynx_registry *r,
                                       const char *id) {
  struct lynx_reg_node *n = lynx_reg_node_find(r, id);
  assert_non_null(n);
  return n->state;
}

static void heartbeat(struct lynx_registry *r, const char *id, uint64_t now) {
  struct lynx_reg_node *n = lynx_reg_node_find(r, id);
  assert_non_null(n);
  assert_int_equal(lynx_reg_heartbeat(r, id, n->epoch, NULL, 0, now), 0);
}

/* A heartbeat from id reporting accelerator idx with this health (other
 * accelerators not reported: theirs stays as it was). */
static int hb_health(struct lynx_registry *r, const char *id, uint64_t now,
                     uint32_t idx, int lost, int failed, uint32_t stalled,
                     uint64_t stall_ms, const char *err) {
  struct lynx_reg_node *n = lynx_reg_node_find(r, id);
  struct lynx_accel_report rep;
  assert_non_null(n);
  memset(&rep, 0, sizeof(rep));
  rep.idx = idx;
  rep.device_lost = lost;
  rep.failed = failed;
  rep.stalled_mqueues = stalled;
  rep.stall_ms = stall_ms;
  snprintf(rep.last_error, sizeof(rep.last_error), "%s", err ? err : "");
  return lynx_reg_heartbeat(r, id, n->epoch, &rep, 1, now);
}

static void hb_ok(struct lynx_registry *r, const char *id, uint64_t now,
                  uint32_t idx) {
  assert_int_equal(hb_health(r, id, now, idx, 0, 0, 0, 0, NULL), 0);
}

/* The dispatch table as instance ids, in table order (n returned). */
struct ids {
  uint64_t id[64];
  int n;
};

static void ids_fn(void *arg, const struct lynx_reg_service *svc,
                   const struct lynx_reg_instance *inst) {
  struct ids *t = arg;
  (void)svc;
  assert_true(t->n < 64);
  t->id[t->n++] = inst->id;
}

static struct ids table_ids(struct lynx_registry *r) {
  struct ids t;
  memset(&t, 0, sizeof(t));
  lynx_reg_table_foreach(r, ids_fn, &t);
  return t;
}

static int table_has(struct lynx_registry *r, uint64_t id) {
  struct ids t = table_ids(r);
  for (int k = 0; k < t.n; k++)
    if (t.id[k] == id)
      return 1;
  return 0;
}

static struct lynx_reg_accel *accel_of(struct lynx_registry *r,
                                       const char *node, uint32_t idx) {
  struct lynx_reg_node *n = lynx_reg_node_find(r, node);
  assert_non_null(n);
  for (uint32_t a = 0; a < n->n_accels; a++)
    if (n->accels[a].info.idx == idx)
      return &n->accels[a];
  fail_msg("node %s has no accelerator %u", node, idx);
  return NULL;
}

/* ---- tests ---------------------------------------------------------- */

static void test_labels_and_names(void **state) {
  struct lynx_label l[4];
  uint32_t n = 99;
  (void)state;
  assert_int_equal(lynx_labels_parse("", l, 4, &n), 0);
  assert_int_equal(n, 0);
  assert_int_equal(lynx_labels_parse(NULL, l, 4, &n), 0);
  assert_int_equal(n, 0);
  assert_int_equal(lynx_labels_parse("gpu=a100,zone=eu-1", l, 4, &n), 0);
  assert_int_equal(n, 2);
  assert_string_equal(l[0].key, "gpu");
  assert_string_equal(l[0].value, "a100");
  assert_string_equal(l[1].key, "zone");
  assert_string_equal(l[1].value, "eu-1");
  assert_int_equal(lynx_labels_parse("k=", l, 4, &n), 0);
  assert_string_equal(l[0].value, "");
  assert_int_equal(lynx_labels_parse("novalue", l, 4, &n), -EINVAL);
  assert_int_equal(lynx_labels_parse("=v", l, 4, &n), -EINVAL);
  assert_int_equal(lynx_labels_parse("a=b,", l, 4, &n), -EINVAL);
  assert_int_equal(lynx_labels_parse("a=b=c", l, 4, &n), -EINVAL);
  assert_int_equal(lynx_labels_parse("a=1,a=2", l, 4, &n), -EINVAL);
  assert_int_equal(lynx_labels_parse("a=1,b=2,c=3", l, 2, &n), -EINVAL);
  {
    char big[200];
    memset(big, 'k', sizeof(big));
    big[150] = '=';
    big[151] = 'v';
    big[152] = '\0';
    assert_int_equal(lynx_labels_parse(big, l, 4, &n), -EINVAL);
  }
  assert_string_equal(lynx_node_state_name(LYNX_NODE_READY), "ready");
  assert_string_equal(lynx_node_state_name(LYNX_NODE_DRAINING), "draining");
  assert_string_equal(lynx_node_state_name(LYNX_NODE_DRAINED), "drained");
  assert_string_equal(lynx_node_state_name(LYNX_NODE_DOWN), "down");
}

static void test_register_validation(void **state) {
  struct fx *f = *state;
  struct lynx_accel_info acc[2];
  struct lynx_reg_err err;
  memset(acc, 0, sizeof(acc));
  acc[1].idx = 1;
  assert_int_equal(
      lynx_reg_register(&f->r, "", "a", 1, NULL, 0, acc, 2, NULL, 0, &err),
      -EINVAL);
  assert_int_equal(err.status, 400);
  assert_string_equal(err.code, "invalid_argument");
  assert_non_null(strstr(err.message, "id"));
  assert_int_equal(
      lynx_reg_register(&f->r, "a/b", "a", 1, NULL, 0, acc, 2, NULL, 0, &err),
      -EINVAL);
  acc[1].idx = 0; /* the same index twice */
  assert_int_equal(
      lynx_reg_register(&f->r, "n1", "a", 1, NULL, 0, acc, 2, NULL, 0, &err),
      -EINVAL);
  assert_non_null(strstr(err.message, "accelerators[1]"));
  acc[1].idx = 1;
  acc[0].ordering = 7;
  assert_int_equal(
      lynx_reg_register(&f->r, "n1", "a", 1, NULL, 0, acc, 2, NULL, 0, &err),
      -EINVAL);
  assert_non_null(strstr(err.message, "ordering"));
  assert_int_equal(lynx_reg_register(&f->r, "n1", "a", 1, NULL, 0, acc,
                                     LYNX_ACCELS_MAX + 1, NULL, 0, &err),
                   -EINVAL);
  assert_null(f->r.nodes);
  assert_int_equal(f->r.registrations, 0);
}

/* ready -> draining -> drained -> undrain -> ready */
static void test_drain_state_machine(void **state) {
  struct fx *f = *state;
  struct lynx_reg_err err;
  struct lynx_reg_frontend *fe;
  struct lynx_reg_node *n;
  uint64_t tv, v;

  assert_int_equal(reg_node(&f->r, "n1", 1, 2, "", 0), 0);
  assert_int_equal(reg_node(&f->r, "n2", 1, 2, "", 0), 0);
  add_service(&f->r, "echo", 7000, 0, NULL);
  assert_int_equal(f->n_start, 4);
  assert_int_equal(ready_all(&f->r, 10), 4);
  assert_int_equal(table_len(&f->r), 4);
  fe = lynx_reg_frontend_connect(&f->r, "fe1", "127.0.0.1:1", (void *)0x2, 10);
  assert_non_null(fe);
  lynx_reg_frontend_status(&f->r, "fe1", f->r.table_version, NULL, 0, 10);

  tv = f->r.table_version;
  v = f->r.version;
  assert_int_equal(lynx_reg_drain(&f->r, "n1", 100, &err), 0);
  n = lynx_reg_node_find(&f->r, "n1");
  assert_int_equal(n->state, LYNX_NODE_DRAINING);
  assert_true(n->drain_intent);
  assert_true(f->r.version > v);
  assert_int_equal(f->r.table_version, tv + 1);
  assert_int_equal(n->drain_table_version, tv + 1);
  assert_int_equal(n->drain_deadline_ms, 100 + DRAIN_TIMEOUT);
  assert_int_equal(table_len(&f->r), 2); /* only n2's */
  assert_int_equal(f->table_len_at_push, 2);
  assert_int_equal(count_inst(&f->r, "n1", NULL, LYNX_INST_READY), 2);
  assert_int_equal(f->n_stop, 0);
  /* draining again is harmless */
  assert_int_equal(lynx_reg_drain(&f->r, "n1", 150, &err), 0);
  assert_int_equal(n->drain_deadline_ms, 100 + DRAIN_TIMEOUT);

  /* the frontend runs the new table with nothing outstanding */
  lynx_reg_frontend_status(&f->r, "fe1", f->r.table_version, NULL, 0, 200);
  assert_int_equal(n->state, LYNX_NODE_DRAINED);
  assert_int_equal(f->n_stop, 2);
  assert_string_equal(f->stop[0].node, "n1");
  assert_string_equal(f->stop[1].node, "n1");
  assert_int_equal(count_inst(&f->r, "n1", NULL, -1), 0);
  assert_int_equal(f->r.table_version, tv + 1); /* n1 was already out */

  /* drained stays drained: ticks place nothing on it */
  heartbeat(&f->r, "n1", 300);
  heartbeat(&f->r, "n2", 300);
  lynx_reg_tick(&f->r, 300);
  assert_int_equal(n->state, LYNX_NODE_DRAINED);
  assert_int_equal(count_inst(&f->r, "n1", NULL, -1), 0);

  /* undrain: READY, instances placed again, then dispatchable */
  f->n_start = 0;
  assert_int_equal(lynx_reg_undrain(&f->r, "n1", 400, &err), 0);
  assert_int_equal(n->state, LYNX_NODE_READY);
  assert_false(n->drain_intent);
  assert_int_equal(f->n_start, 2);
  assert_string_equal(f->start[0].node, "n1");
  assert_int_equal(ready_all(&f->r, 410), 2);
  assert_int_equal(table_len(&f->r), 4);
  assert_int_equal(f->table_len_at_push, 4);
}

static void test_undrain_while_draining(void **state) {
  struct fx *f = *state;
  struct lynx_reg_err err;
  uint64_t tv;
  assert_int_equal(reg_node(&f->r, "n1", 1, 2, "", 0), 0);
  add_service(&f->r, "echo", 7000, 0, NULL);
  ready_all(&f->r, 0);
  assert_non_null(lynx_reg_frontend_connect(&f->r, "fe1", "x", (void *)0x2, 0));
  tv = f->r.table_version;
  assert_int_equal(lynx_reg_drain(&f->r, "n1", 10, &err), 0);
  assert_int_equal(node_state(&f->r, "n1"), LYNX_NODE_DRAINING);
  assert_int_equal(table_len(&f->r), 0);
  assert_int_equal(lynx_reg_undrain(&f->r, "n1", 20, &err), 0);
  assert_int_equal(node_state(&f->r, "n1"), LYNX_NODE_READY);
  /* the same instances come back into the table: nothing restarted */
  assert_int_equal(f->n_stop, 0);
  assert_int_equal(f->n_start, 2);
  assert_int_equal(table_len(&f->r), 2);
  assert_int_equal(f->r.table_version, tv + 2);
  /* a later frontend report does not complete a cancelled drain */
  lynx_reg_frontend_status(&f->r, "fe1", f->r.table_version, NULL, 0, 30);
  heartbeat(&f->r, "n1", 10 + DRAIN_TIMEOUT - 1);
  lynx_reg_tick(&f->r, 10 + DRAIN_TIMEOUT);
  assert_int_equal(node_state(&f->r, "n1"), LYNX_NODE_READY);
}

static void test_drain_waits_for_frontend(void **state) {
  struct fx *f = *state;
  struct lynx_reg_err err;
  struct lynx_reg_node *n;
  struct lynx_reg_instance *i;
  struct lynx_fe_mq_report mq[3];
  uint64_t n1_inst = 0, n2_inst = 0;

  assert_int_equal(reg_node(&f->r, "n1", 1, 1, "", 0), 0);
  assert_int_equal(reg_node(&f->r, "n2", 1, 1, "", 0), 0);
  add_service(&f->r, "echo", 7000, 0, NULL);
  ready_all(&f->r, 0);
  for (i = f->r.instances; i; i = i->next) {
    if (!strcmp(i->node->id, "n1"))
      n1_inst = i->id;
    else
      n2_inst = i->id;
  }
  assert_non_null(lynx_reg_frontend_connect(&f->r, "fe1", "x", (void *)0x2, 0));
  assert_non_null(lynx_reg_frontend_connect(&f->r, "fe2", "y", (void *)0x3, 0));
  /* a disconnected frontend does not hold drains back */
  assert_non_null(lynx_reg_frontend_connect(&f->r, "fe3", "z", (void *)0x4, 0));
  lynx_reg_frontend_disconnected(&f->r, (void *)0x4);

  assert_int_equal(lynx_reg_drain(&f->r, "n1", 1000, &err), 0);
  n = lynx_reg_node_find(&f->r, "n1");
  assert_int_equal(n->state, LYNX_NODE_DRAINING);

  /* fe1 still runs the old table */
  memset(mq, 0, sizeof(mq));
  lynx_reg_frontend_status(&f->r, "fe1", n->drain_table_version - 1, NULL, 0,
                           1100);
  lynx_reg_frontend_status(&f->r, "fe2", n->drain_table_version, NULL, 0, 1100);
  assert_int_equal(n->state, LYNX_NODE_DRAINING);
  lynx_reg_tick(&f->r, 1100);
  assert_int_equal(n->state, LYNX_NODE_DRAINING);

  /* fe1 applied it but still has requests in flight on n1 */
  mq[0].instance_id = n1_inst;
  mq[0].q = 0;
  mq[0].outstanding = 0;
  mq[1].instance_id = n1_inst;
  mq[1].q = 1;
  mq[1].outstanding = 3;
  mq[2].instance_id = n2_inst;
  mq[2].q = 0;
  mq[2].outstanding = 50; /* another node's: irrelevant */
  lynx_reg_frontend_status(&f->r, "fe1", n->drain_table_version, mq, 3, 1200);
  assert_int_equal(n->state, LYNX_NODE_DRAINING);
  assert_int_equal(f->n_stop, 0);

  /* answered: drained, instances stopped */
  mq[1].outstanding = 0;
  lynx_reg_frontend_status(&f->r, "fe1", n->drain_table_version, mq, 3, 1300);
  assert_int_equal(n->state, LYNX_NODE_DRAINED);
  assert_int_equal(f->n_stop, 1);
  assert_int_equal(f->stop[0].id, n1_inst);
  assert_int_equal(count_inst(&f->r, "n2", NULL, LYNX_INST_READY), 1);
}

static void test_drain_deadline(void **state) {
  struct fx *f = *state;
  struct lynx_reg_err err;
  struct lynx_reg_node *n;
  assert_int_equal(reg_node(&f->r, "n1", 1, 2, "", 0), 0);
  add_service(&f->r, "echo", 7000, 0, NULL);
  ready_all(&f->r, 0);
  assert_non_null(lynx_reg_frontend_connect(&f->r, "fe1", "x", (void *)0x2, 0));
  assert_int_equal(lynx_reg_drain(&f->r, "n1", 500, &err), 0);
  n = lynx_reg_node_find(&f->r, "n1");
  /* the frontend never reports; keep the lease alive meanwhile */
  heartbeat(&f->r, "n1", 500 + DRAIN_TIMEOUT - 2000);
  lynx_reg_tick(&f->r, 500 + DRAIN_TIMEOUT - 1);
  assert_int_equal(n->state, LYNX_NODE_DRAINING);
  assert_int_equal(f->n_stop, 0);
  lynx_reg_tick(&f->r, 500 + DRAIN_TIMEOUT);
  assert_int_equal(n->state, LYNX_NODE_DRAINED);
  assert_int_equal(f->n_stop, 2);
}

static void test_drain_without_frontend(void **state) {
  struct fx *f = *state;
  struct lynx_reg_err err;
  assert_int_equal(reg_node(&f->r, "n1", 1, 2, "", 0), 0);
  add_service(&f->r, "echo", 7000, 0, NULL);
  ready_all(&f->r, 0);
  assert_int_equal(lynx_reg_drain(&f->r, "n1", 10, &err), 0);
  lynx_reg_tick(&f->r, 20);
  assert_int_equal(node_state(&f->r, "n1"), LYNX_NODE_DRAINED);
  assert_int_equal(f->n_stop, 2);
  assert_int_equal(count_inst(&f->r, NULL, NULL, -1), 0);
}

/* A stopping agent's node drains to leave (Leave with drain): as an
 * operator's drain, but nothing kept: its next incarnation is READY. */
static void test_leave_drain(void **state) {
  struct fx *f = *state;
  struct lynx_reg_err err;
  struct lynx_reg_node *n;
  const struct lynx_event *ev;
  uint64_t v;

  assert_int_equal(reg_node(&f->r, "n1", 1, 2, "", 0), 0);
  assert_int_equal(reg_node(&f->r, "n2", 1, 2, "", 0), 0);
  add_service(&f->r, "echo", 7000, 0, NULL);
  assert_int_equal(ready_all(&f->r, 10), 4);
  assert_non_null(
      lynx_reg_frontend_connect(&f->r, "fe1", "x", (void *)0x2, 10));
  lynx_reg_frontend_status(&f->r, "fe1", f->r.table_version, NULL, 0, 10);
  n = lynx_reg_node_find(&f->r, "n1");

  assert_int_equal(lynx_reg_leave_drain(&f->r, "nope", 1, 100), -ENOENT);
  assert_int_equal(lynx_reg_leave_drain(&f->r, "n1", 2, 100), -ESTALE);
  assert_int_equal(n->state, LYNX_NODE_READY);

  assert_int_equal(lynx_reg_leave_drain(&f->r, "n1", 1, 100), 0);
  assert_int_equal(n->state, LYNX_NODE_DRAINING);
  assert_true(n->leaving);
  assert_false(n->drain_intent); /* not an operator's: not saved */
  assert_int_equal(n->drain_deadline_ms, 100 + DRAIN_TIMEOUT);
  assert_int_equal(table_len(&f->r), 2); /* only n2's */
  assert_int_equal(f->n_stop, 0);
  ev = lynx_ev_get(&f->r.ev, f->r.ev.next_seq - 1);
  assert_non_null(ev);
  assert_int_equal(ev->kind, LYNX_EV_NODE_DRAINING);
  assert_non_null(strstr(ev->message, "to leave"));
  /* asked again (a repeated Leave): nothing moves */
  assert_int_equal(lynx_reg_leave_drain(&f->r, "n1", 1, 150), 0);
  assert_int_equal(n->drain_deadline_ms, 100 + DRAIN_TIMEOUT);
  /* not undone: the agent stops anyway, and only the drain makes that
   * lossless */
  assert_int_equal(lynx_reg_undrain(&f->r, "n1", 160, &err), -EINVAL);
  assert_int_equal(err.status, 409);
  assert_non_null(strstr(err.message, "its agent is stopping"));
  assert_int_equal(n->state, LYNX_NODE_DRAINING);
  assert_true(n->leaving);

  /* the frontend runs the table without n1, nothing outstanding: its
   * instances are stopped, which tells the agent to leave */
  lynx_reg_frontend_status(&f->r, "fe1", f->r.table_version, NULL, 0, 200);
  assert_int_equal(n->state, LYNX_NODE_DRAINED);
  assert_int_equal(f->n_stop, 2);
  assert_string_equal(f->stop[0].node, "n1");
  assert_true(n->leaving);
  assert_int_equal(lynx_reg_leave(&f->r, "n1", 1, 300), 0);
  assert_int_equal(n->state, LYNX_NODE_DOWN);
  assert_false(n->leaving);
  assert_int_equal(lynx_reg_leave_drain(&f->r, "n1", 1, 310), -ENOTCONN);

  /* restarted: a new incarnation, READY, and given instances again */
  f->n_start = 0;
  assert_int_equal(reg_node(&f->r, "n1", 2, 2, "", 400), 0);
  assert_int_equal(n->state, LYNX_NODE_READY);
  assert_int_equal(f->n_start, 2);
  assert_int_equal(ready_all(&f->r, 410), 2);
  assert_int_equal(table_len(&f->r), 4);

  /* a node an operator drained stays the operator's: still drain_intent,
   * not leaving, and it restarts DRAINED */
  assert_int_equal(lynx_reg_drain(&f->r, "n2", 500, &err), 0);
  v = f->r.version;
  assert_int_equal(lynx_reg_leave_drain(&f->r, "n2", 1, 510), 0);
  n = lynx_reg_node_find(&f->r, "n2");
  assert_int_equal(n->state, LYNX_NODE_DRAINING);
  assert_true(n->drain_intent);
  assert_false(n->leaving);
  assert_int_equal(f->r.version, v);
}

/* While the coordinator settles after a restart (or on becoming the
 * leader), a frontend that holds a draining node's instances may not have
 * reconnected yet: no drain finishes as quiet, and none at once for want
 * of frontends; the deadline still holds. */
static void test_drain_waits_for_settle(void **state) {
  struct fx *f = *state;
  struct lynx_reg_err err;
  struct lynx_reg_node *n;

  assert_int_equal(reg_node(&f->r, "n1", 1, 2, "", 0), 0);
  add_service(&f->r, "echo", 7000, 0, NULL);
  assert_int_equal(ready_all(&f->r, 10), 2);
  n = lynx_reg_node_find(&f->r, "n1");
  f->r.settle_until_ms = 1000000;
  /* no frontend connected: without settling, done at once */
  assert_int_equal(lynx_reg_leave_drain(&f->r, "n1", 1, 100), 0);
  assert_int_equal(n->state, LYNX_NODE_DRAINING);
  lynx_reg_tick(&f->r, 200);
  assert_int_equal(n->state, LYNX_NODE_DRAINING);
  /* a frontend back, running the table without n1, nothing outstanding:
   * still not before the coordinator settled */
  assert_non_null(
      lynx_reg_frontend_connect(&f->r, "fe1", "x", (void *)0x2, 300));
  lynx_reg_frontend_status(&f->r, "fe1", f->r.table_version, NULL, 0, 300);
  assert_int_equal(n->state, LYNX_NODE_DRAINING);
  assert_int_equal(f->n_stop, 0);
  f->r.settle_until_ms = 0;
  lynx_reg_frontend_status(&f->r, "fe1", f->r.table_version, NULL, 0, 400);
  assert_int_equal(n->state, LYNX_NODE_DRAINED);
  assert_int_equal(f->n_stop, 2);

  /* the deadline ends a drain even while settling */
  assert_int_equal(reg_node(&f->r, "n2", 1, 2, "", 500), 0);
  assert_int_equal(ready_all(&f->r, 510), 2);
  f->r.settle_until_ms = 1000000;
  assert_int_equal(lynx_reg_drain(&f->r, "n2", 600, &err), 0);
  n = lynx_reg_node_find(&f->r, "n2");
  heartbeat(&f->r, "n2", 600 + DRAIN_TIMEOUT - 100);
  lynx_reg_tick(&f->r, 600 + DRAIN_TIMEOUT - 1);
  assert_int_equal(n->state, LYNX_NODE_DRAINING);
  lynx_reg_tick(&f->r, 600 + DRAIN_TIMEOUT);
  assert_int_equal(n->state, LYNX_NODE_DRAINED);
}

static void test_drain_errors(void **state) {
  struct fx *f = *state;
  struct lynx_reg_err err;
  assert_int_equal(lynx_reg_drain(&f->r, "nope", 0, &err), -ENOENT);
  assert_int_equal(err.status, 404);
  assert_string_equal(err.code, "not_found");
  assert_int_equal(lynx_reg_undrain(&f->r, "nope", 0, &err), -ENOENT);
  assert_int_equal(err.status, 404);
  assert_int_equal(reg_node(&f->r, "n1", 1, 1, "", 0), 0);
  lynx_reg_tick(&f->r, LEASE);
  assert_int_equal(node_state(&f->r, "n1"), LYNX_NODE_DOWN);
  assert_int_equal(lynx_reg_drain(&f->r, "n1", LEASE, &err), -EINVAL);
  assert_int_equal(lynx_reg_undrain(&f->r, "n1", LEASE, &err), -EINVAL);
}

static void test_lease_expiry(void **state) {
  struct fx *f = *state;
  struct lynx_reg_node *n;
  uint64_t tv;
  assert_int_equal(reg_node(&f->r, "n1", 1, 2, "", 1000), 0);
  assert_int_equal(reg_node(&f->r, "n2", 1, 2, "", 1000), 0);
  add_service(&f->r, "echo", 7000, 0, NULL);
  ready_all(&f->r, 1000);
  n = lynx_reg_node_find(&f->r, "n1");
  assert_int_equal(n->lease_deadline_ms, 1000 + LEASE);

  /* not before the lease */
  lynx_reg_tick(&f->r, 1000 + LEASE - 1);
  assert_int_equal(n->state, LYNX_NODE_READY);
  assert_int_equal(f->r.lease_expiries, 0);
  /* a heartbeat renews it */
  heartbeat(&f->r, "n2", 1000 + LEASE - 1);
  assert_int_equal(lynx_reg_node_find(&f->r, "n2")->last_heartbeat_ms,
                   1000 + LEASE - 1);

  /* exactly at the lease */
  tv = f->r.table_version;
  f->n_tables = 0;
  lynx_reg_tick(&f->r, 1000 + LEASE);
  assert_int_equal(n->state, LYNX_NODE_DOWN);
  assert_int_equal(node_state(&f->r, "n2"), LYNX_NODE_READY);
  assert_int_equal(f->r.lease_expiries, 1);
  assert_int_equal(count_inst(&f->r, "n1", NULL, -1), 0);
  assert_int_equal(f->r.table_version, tv + 1);
  assert_int_equal(f->n_tables, 1);
  assert_int_equal(table_len(&f->r), 2);
  assert_int_equal(f->n_stop, 0); /* its agent is gone: nothing to stop */

  /* a down node must register again */
  assert_int_equal(
      lynx_reg_heartbeat(&f->r, "n1", 1, NULL, 0, 1000 + LEASE + 1), -ENOTCONN);
  /* expiry is counted once */
  lynx_reg_tick(&f->r, 1000 + 2 * LEASE - 2);
  assert_int_equal(f->r.lease_expiries, 1);

  /* the same incarnation comes back (stopped or cut off past its lease):
   * refused, as frontends counted what it had in flight lost; it must come
   * back as a new incarnation, without the old queues */
  f->n_start = 0;
  {
    struct lynx_accel_info acc[2];
    struct lynx_reg_err err;
    struct lynx_reg_adopt ad;
    memset(acc, 0, sizeof(acc));
    memset(&err, 0, sizeof(err));
    memset(&ad, 0, sizeof(ad));
    acc[1].idx = 1;
    ad.instance_id = f->r.next_instance_id - 1; /* one of its instances */
    snprintf(ad.service, sizeof(ad.service), "echo");
    ad.desc.n_mqueues = 4; /* as the service: adoptable were it alive */
    assert_int_equal(lynx_reg_register_adopt(&f->r, "n1", "127.0.0.1:7701", 1,
                                             NULL, 0, acc, 2, &ad, 1,
                                             (void *)0x1, 5000, &err),
                     -ESTALE);
    assert_int_equal(err.new_incarnation, 1);
    assert_int_equal(err.status, 409);
    assert_non_null(strstr(err.message, "new incarnation"));
  }
  assert_int_equal(n->state, LYNX_NODE_DOWN);
  assert_int_equal(f->r.new_incarnations, 1);
  assert_int_equal(count_inst(&f->r, "n1", NULL, -1), 0); /* none adopted */
  assert_int_equal(f->n_start, 0);
  /* the new incarnation is placed again */
  assert_int_equal(reg_node(&f->r, "n1", 2, 2, "", 5001), 0);
  assert_int_equal(n->state, LYNX_NODE_READY);
  assert_int_equal(n->epoch, 2);
  assert_int_equal(f->n_start, 2);
}

/* The same incarnation registers again (its connection broke) while two
 * of its instances were STARTING: the one it reports running is ready with
 * the region it reports, as its lost reply would have made it; the one it
 * does not run (its StartInstance was lost) is started again on the new
 * connection, never left waiting. */
static struct lynx_reg_instance *inst_by_id(struct lynx_registry *r,
                                            uint64_t id) {
  struct lynx_reg_instance *i = r->instances;
  while (i && i->id != id)
    i = i->next;
  return i;
}

static void test_reconnect_settles_starting(void **state) {
  struct fx *f = *state;
  struct lynx_accel_info acc[2];
  struct lynx_reg_err err;
  struct lynx_reg_adopt ad;
  uint64_t id0, id1;
  memset(acc, 0, sizeof(acc));
  memset(&err, 0, sizeof(err));
  memset(&ad, 0, sizeof(ad));
  assert_int_equal(reg_node(&f->r, "n1", 1, 2, "", 1000), 0);
  add_service(&f->r, "echo", 9000, 0, "");
  lynx_reg_tick(&f->r, 1001);
  assert_int_equal(f->n_start, 2);
  assert_int_equal(count_inst(&f->r, "n1", "echo", LYNX_INST_STARTING), 2);
  id0 = f->start[0].id;
  id1 = f->start[1].id;
  /* it runs the first (its reply was lost), not the second */
  acc[1].idx = 1;
  snprintf(acc[0].kind, sizeof(acc[0].kind), "cpu");
  snprintf(acc[1].kind, sizeof(acc[1].kind), "cpu");
  ad.instance_id = id0;
  ad.accel_idx = f->start[0].accel;
  snprintf(ad.service, sizeof(ad.service), "echo");
  ad.desc = desc_for(inst_by_id(&f->r, id0));
  assert_int_equal(lynx_reg_register_adopt(&f->r, "n1", "127.0.0.1:7701", 1,
                                           NULL, 0, acc, 2, &ad, 1, (void *)0x2,
                                           1500, &err),
                   0);
  assert_int_equal(inst_by_id(&f->r, id0)->state, LYNX_INST_READY);
  assert_null(inst_by_id(&f->r, id1));
  assert_int_equal(f->n_start, 3); /* the second, started again */
  assert_int_not_equal(f->start[2].id, id1);
  assert_int_equal(f->start[2].accel, f->start[1].accel);
  assert_int_equal(count_inst(&f->r, "n1", "echo", LYNX_INST_STARTING), 1);
  /* only the one it does not run is stopped (a start still under way) */
  assert_int_equal(f->n_stop, 1);
  assert_int_equal(f->stop[0].id, id1);
}

/* A node whose accelerators say what they run: accel 0 runs only "echo"
 * (a GPU, say), accel 1 runs "echo" and "sockperf-echo". */
static int reg_apps_node(struct lynx_registry *r, const char *id,
                         uint64_t epoch, uint64_t now) {
  struct lynx_accel_info acc[2];
  struct lynx_reg_err err;
  memset(acc, 0, sizeof(acc));
  for (uint32_t a = 0; a < 2; a++) {
    acc[a].idx = a;
    snprintf(acc[a].kind, sizeof(acc[a].kind), a ? "cpu" : "cuda");
    snprintf(acc[a].apps[acc[a].n_apps++], LYNX_APP_NAME_MAX, "echo");
  }
  snprintf(acc[1].apps[acc[1].n_apps++], LYNX_APP_NAME_MAX, "sockperf-echo");
  return lynx_reg_register(r, id, "127.0.0.1:7701", epoch, NULL, 0, acc, 2,
                           (void *)0x1, now, &err);
}

/* An app that calls a back end (mc-get calls "db", as the agent says in
 * AccelInfo.app_backends): a service without it is refused with 400
 * naming the back end, before anything is placed; with it, it is taken.
 * An agent that does not say what its apps call refuses nothing. */
static void test_app_backend_needed(void **state) {
  struct fx *f = *state;
  struct lynx_service_spec s = ut_spec("kv", 7000, 0, NULL);
  struct lynx_accel_info acc[1];
  struct lynx_reg_err err;
  memset(acc, 0, sizeof(acc));
  snprintf(acc[0].kind, sizeof(acc[0].kind), "cpu");
  snprintf(acc[0].apps[0], LYNX_APP_NAME_MAX, "mc-get");
  snprintf(acc[0].apps[1], LYNX_APP_NAME_MAX, "echo");
  acc[0].n_apps = 2;
  snprintf(s.app, sizeof(s.app), "mc-get");

  /* an older agent: it does not say, the service is taken */
  memset(&err, 0, sizeof(err));
  assert_int_equal(lynx_reg_register(&f->r, "old", "127.0.0.1:7701", 1, NULL, 0,
                                     acc, 1, (void *)0x1, 1, &err),
                   0);
  assert_int_equal(lynx_reg_service_create(&f->r, &s, 1, &err), 0);
  assert_int_equal(lynx_reg_service_delete(&f->r, "kv", 2, &err), 0);

  /* one that says mc-get calls "db" */
  acc[0].has_app_backends = 1;
  snprintf(acc[0].app_backends[0], LYNX_BACKEND_NAME_MAX, "db");
  assert_int_equal(lynx_reg_register(&f->r, "new", "127.0.0.1:7702", 2, NULL, 0,
                                     acc, 1, (void *)0x2, 3, &err),
                   0);
  memset(&err, 0, sizeof(err));
  assert_int_equal(lynx_reg_service_create(&f->r, &s, 4, &err), -EINVAL);
  assert_int_equal(err.status, 400);
  assert_string_equal(err.code, "invalid_argument");
  assert_non_null(strstr(err.message, "application 'mc-get' calls back end "
                                      "'db'"));
  assert_non_null(strstr(err.message, "its back ends: none"));
  assert_null(lynx_reg_service_find(&f->r, "kv"));
  /* another back end is not it */
  s.n_backends = 1;
  snprintf(s.backends[0].name, LYNX_BACKEND_NAME_MAX, "cache");
  snprintf(s.backends[0].address, LYNX_ADDR_MAX, "127.0.0.1:11211");
  snprintf(s.backends[0].proto, sizeof(s.backends[0].proto), "memcached");
  memset(&err, 0, sizeof(err));
  assert_int_equal(lynx_reg_service_create(&f->r, &s, 5, &err), -EINVAL);
  assert_non_null(strstr(err.message, "its back ends: cache"));
  /* with "db": taken */
  snprintf(s.backends[0].name, LYNX_BACKEND_NAME_MAX, "db");
  assert_int_equal(lynx_reg_service_create(&f->r, &s, 6, &err), 0);
  assert_non_null(lynx_reg_service_find(&f->r, "kv"));
  /* an app that calls none needs none */
  s = ut_spec("e", 7001, 0, NULL);
  snprintf(s.app, sizeof(s.app), "echo");
  assert_int_equal(lynx_reg_service_create(&f->r, &s, 7, &err), 0);
}

static const char *svc_state(struct lynx_registry *r, const char *name,
                             char *reason, size_t len, uint64_t *ready,
                             uint64_t *wanted) {
  return lynx_reg_service_state(r, lynx_reg_service_find(r, name), ready,
                                wanted, reason, len);
}

/* The app decides where a service may go: only on accelerators that run
 * it; one no registered accelerator runs is refused with 422 naming what
 * they run, unless nothing (or an agent that does not say) is registered,
 * and then the service is pending with the reason. */
static void test_apps_and_state(void **state) {
  struct fx *f = *state;
  struct lynx_service_spec s = ut_spec("x", 7000, 0, NULL);
  struct lynx_reg_err err;
  char why[512];
  uint64_t ready, wanted;

  /* nothing registered yet: taken, pending, and it says why */
  snprintf(s.app, sizeof(s.app), "nope");
  assert_int_equal(lynx_reg_service_create(&f->r, &s, 0, &err), 0);
  assert_string_equal(svc_state(&f->r, "x", why, sizeof(why), &ready, &wanted),
                      "pending");
  assert_string_equal(why, "no agent has registered");
  assert_int_equal(lynx_reg_service_delete(&f->r, "x", 0, &err), 0);

  /* accelerators that list what they run: an app none runs is refused */
  assert_int_equal(reg_apps_node(&f->r, "n1", 1, 1), 0);
  memset(&err, 0, sizeof(err));
  assert_int_equal(lynx_reg_service_create(&f->r, &s, 1, &err), -EINVAL);
  assert_int_equal(err.status, 422);
  assert_string_equal(err.code, "unknown_app");
  assert_non_null(strstr(err.message, "'nope'"));
  assert_non_null(strstr(err.message, "they run: echo, sockperf-echo"));
  assert_null(lynx_reg_service_find(&f->r, "x"));
  assert_int_equal(f->n_start, 0);

  /* an app one accelerator runs: placed there only */
  snprintf(s.app, sizeof(s.app), "sockperf-echo");
  assert_int_equal(lynx_reg_service_create(&f->r, &s, 2, &err), 0);
  assert_int_equal(f->n_start, 1);
  assert_int_equal(f->start[0].accel, 1);
  assert_string_equal(svc_state(&f->r, "x", why, sizeof(why), &ready, &wanted),
                      "pending");
  assert_int_equal(wanted, 1);
  assert_string_equal(why, "0 of 1 instances ready");

  /* it fails to start: the agent's reason, in the service's state */
  {
    struct lynx_reg_instance *i = f->r.instances;
    assert_int_equal(lynx_reg_instance_failed(&f->r, "n1", 1, i->id,
                                              "cannot allocate a region", 3),
                     0);
  }
  assert_string_equal(svc_state(&f->r, "x", why, sizeof(why), &ready, &wanted),
                      "pending");
  assert_non_null(strstr(why, "instance on n1/1 failed to start: cannot "
                              "allocate a region"));
  assert_int_equal(lynx_reg_service_find(&f->r, "x")->failures, 1);
  /* placed again after its backoff (200 ms), ready: the failure is history */
  lynx_reg_tick(&f->r, 1000);
  assert_int_equal(ready_all(&f->r, 1001), 1);
  assert_string_equal(svc_state(&f->r, "x", why, sizeof(why), &ready, &wanted),
                      "ready");
  assert_string_equal(why, "");

  /* a frontend that cannot open the port: pending, with its reason */
  assert_non_null(lynx_reg_frontend_connect(&f->r, "fe1", "a:1", (void *)1, 0));
  {
    struct lynx_fe_listen l;
    uint64_t v;
    memset(&l, 0, sizeof(l));
    snprintf(l.service, sizeof(l.service), "x");
    snprintf(l.error, sizeof(l.error),
             "cannot bind UDP 0.0.0.0:7000: Address already in use");
    v = f->r.version;
    lynx_reg_frontend_listen(&f->r, "fe1", &l, 1);
    assert_true(f->r.version > v);
    v = f->r.version;
    lynx_reg_frontend_listen(&f->r, "fe1", &l, 1); /* the same: no news */
    assert_int_equal(f->r.version, v);
    assert_string_equal(
        svc_state(&f->r, "x", why, sizeof(why), &ready, &wanted), "pending");
    assert_string_equal(why, "frontend fe1: cannot bind UDP 0.0.0.0:7000: "
                             "Address already in use");
    l.listening = 1;
    l.error[0] = 0;
    lynx_reg_frontend_listen(&f->r, "fe1", &l, 1);
    assert_string_equal(
        svc_state(&f->r, "x", why, sizeof(why), &ready, &wanted), "ready");
  }

  /* an agent that does not say what it runs may run anything */
  assert_int_equal(reg_node(&f->r, "n2", 1, 1, "", 5), 0);
  snprintf(s.name, sizeof(s.name), "y");
  s.port = 7001;
  snprintf(s.app, sizeof(s.app), "nope");
  assert_int_equal(lynx_reg_service_create(&f->r, &s, 6, &err), 0);
}

/* With a heartbeat lease (suspect_ms) shorter than the lease, a silent
 * node leaves the dispatch tables at the first, keeping its instances
 * and without counting what it holds lost, and is back at its next
 * heartbeat; placement puts nothing new on it meanwhile. Only the lease
 * declares it down. A coordinator's pause is credited to both. */
static void test_suspect(void **state) {
  struct fx *f = *state;
  struct lynx_reg_node *n;
  uint64_t tv, sus = LEASE / 3, t, t0;
  f->r.suspect_ms = sus;
  f->r.tick_ms = 100;
  assert_int_equal(reg_node(&f->r, "n1", 1, 2, "", 1000), 0);
  assert_int_equal(reg_node(&f->r, "n2", 1, 2, "", 1000), 0);
  add_service(&f->r, "echo", 7000, 0, NULL);
  ready_all(&f->r, 1000);
  n = lynx_reg_node_find(&f->r, "n1");
  assert_int_equal(table_len(&f->r), 4);
  for (t = 1100; t < 1000 + sus; t += 100) {
    heartbeat(&f->r, "n2", t);
    lynx_reg_tick(&f->r, t);
  }
  assert_false(n->suspect);
  tv = f->r.table_version;
  heartbeat(&f->r, "n2", 1000 + sus);
  lynx_reg_tick(&f->r, 1000 + sus);
  assert_true(n->suspect);
  assert_int_equal(n->state, LYNX_NODE_READY);
  assert_int_equal(f->r.suspicions, 1);
  assert_int_equal(f->r.table_version, tv + 1);
  assert_int_equal(table_len(&f->r), 2);                  /* n2's alone */
  assert_int_equal(count_inst(&f->r, "n1", NULL, -1), 2); /* kept */
  assert_int_equal(f->r.lease_expiries, 0);
  assert_int_equal(f->n_stop, 0);
  /* a new service goes to n2 only while n1 is silent */
  add_service(&f->r, "echo2", 7001, 0, NULL);
  lynx_reg_tick(&f->r, 1000 + sus + 100);
  assert_int_equal(count_inst(&f->r, "n1", "echo2", -1), 0);
  assert_int_equal(count_inst(&f->r, "n2", "echo2", -1), 2);
  /* heard again: back in the tables, nothing restarted */
  f->n_start = 0;
  heartbeat(&f->r, "n1", 1000 + sus + 150);
  assert_false(n->suspect);
  assert_int_equal(table_len(&f->r), 4); /* echo on both; echo2 starting */
  assert_int_equal(f->n_start, 0);
  /* and given the new service at the next placement */
  heartbeat(&f->r, "n2", 1000 + sus + 200);
  lynx_reg_tick(&f->r, 1000 + sus + 200);
  assert_int_equal(f->n_start, 2);
  ready_all(&f->r, 1000 + sus + 210);
  assert_int_equal(table_len(&f->r), 8);
  /* silent again, this time for good: suspect, then down at the lease */
  for (t = 1000 + sus + 200; t < 1000 + sus + 150 + LEASE; t += 100) {
    heartbeat(&f->r, "n2", t);
    lynx_reg_tick(&f->r, t);
  }
  assert_true(n->suspect);
  assert_int_equal(n->state, LYNX_NODE_READY);
  assert_int_equal(f->r.suspicions, 2);
  /* a pause of the coordinator is credited to the suspect deadline too */
  heartbeat(&f->r, "n1", t);
  lynx_reg_tick(&f->r, t);
  assert_false(n->suspect);
  t0 = t;
  lynx_reg_tick(&f->r, t0 + sus + 100); /* stopped: sus credited */
  assert_int_equal(f->r.pauses, 1);
  assert_false(n->suspect);
  for (t = t0 + sus + 200; t < t0 + 2 * sus; t += 100) {
    heartbeat(&f->r, "n2", t);
    lynx_reg_tick(&f->r, t);
  }
  assert_false(n->suspect);
  heartbeat(&f->r, "n2", t0 + 2 * sus);
  lynx_reg_tick(&f->r, t0 + 2 * sus);
  assert_true(n->suspect);
  for (t = t0 + 2 * sus + 100; t < t0 + sus + LEASE; t += 100) {
    heartbeat(&f->r, "n2", t);
    lynx_reg_tick(&f->r, t);
  }
  assert_int_equal(n->state, LYNX_NODE_READY);
  lynx_reg_tick(&f->r, t0 + sus + LEASE);
  assert_int_equal(n->state, LYNX_NODE_DOWN);
  assert_false(n->suspect);
  assert_int_equal(f->r.lease_expiries, 1);
  assert_int_equal(node_state(&f->r, "n2"), LYNX_NODE_READY);
}

/* A coordinator that did not run for a while (SIGSTOP, a starved host)
 * heard no heartbeat then: the gap beyond one tick is added to every
 * lease, so the first tick after it expires nobody, and the heartbeats
 * that waited in its sockets renew the leases next. A node that really
 * stopped is still declared down, a pause later. */
static void test_pause_credit(void **state) {
  struct fx *f = *state;
  struct lynx_reg_node *n1, *n2;
  f->r.tick_ms = 100;
  assert_int_equal(reg_node(&f->r, "n1", 1, 1, "", 1000), 0);
  assert_int_equal(reg_node(&f->r, "n2", 1, 1, "", 1000), 0);
  n1 = lynx_reg_node_find(&f->r, "n1");
  n2 = lynx_reg_node_find(&f->r, "n2");
  for (uint64_t t = 1100; t <= 2000; t += 100)
    lynx_reg_tick(&f->r, t);
  assert_int_equal(f->r.pauses, 0); /* regular ticks are no pause */
  /* stopped for 2.6 s: the lease (3 s) would have run out at 4000 */
  lynx_reg_tick(&f->r, 4600);
  assert_int_equal(f->r.pauses, 1);
  assert_int_equal(f->r.last_pause_ms, 2500);
  assert_int_equal(f->r.paused_ms, 2500);
  assert_int_equal(f->r.lease_expiries, 0);
  assert_int_equal(n1->state, LYNX_NODE_READY);
  assert_int_equal(n1->lease_deadline_ms, 1000 + LEASE + 2500);
  /* n1's heartbeats were waiting: renewed; n2 sent none */
  heartbeat(&f->r, "n1", 4601);
  for (uint64_t t = 4700; t < 1000 + LEASE + 2500; t += 100)
    lynx_reg_tick(&f->r, t);
  assert_int_equal(f->r.last_pause_ms, 0);
  assert_int_equal(n2->state, LYNX_NODE_READY);
  lynx_reg_tick(&f->r, 1000 + LEASE + 2500);
  assert_int_equal(n2->state, LYNX_NODE_DOWN);
  assert_int_equal(n1->state, LYNX_NODE_READY);
  assert_int_equal(f->r.lease_expiries, 1);
}

static void test_heartbeat_counters(void **state) {
  struct fx *f = *state;
  struct lynx_accel_report rep[2];
  struct lynx_reg_node *n;
  uint64_t v;
  memset(rep, 0, sizeof(rep));
  rep[0].idx = 1;
  rep[0].requests = 100;
  rep[0].responses = 99;
  rep[1].idx = 9; /* no such accelerator: ignored */
  rep[1].requests = 5;
  rep[1].responses = 5;
  rep[1].failed = 1;
  assert_int_equal(reg_node(&f->r, "n1", 7, 2, "", 0), 0);
  n = lynx_reg_node_find(&f->r, "n1");
  v = f->r.version;
  assert_int_equal(lynx_reg_heartbeat(&f->r, "n1", 7, rep, 2, 50), 0);
  assert_int_equal(n->accels[1].requests, 100);
  assert_int_equal(n->accels[1].responses, 99);
  assert_int_equal(n->accels[0].requests, 0);
  assert_int_equal(n->last_heartbeat_ms, 50);
  assert_int_equal(n->lease_deadline_ms, 50 + LEASE);
  assert_int_equal(f->r.version, v);
  assert_true(lynx_reg_accel_dispatchable(&n->accels[0]));
  assert_true(lynx_reg_accel_dispatchable(&n->accels[1]));
  assert_int_equal(lynx_reg_heartbeat(&f->r, "n1", 6, NULL, 0, 60), -ESTALE);
  assert_int_equal(lynx_reg_heartbeat(&f->r, "n1", 8, NULL, 0, 60), -ESTALE);
  assert_int_equal(lynx_reg_heartbeat(&f->r, "zz", 7, NULL, 0, 60), -ENOENT);
  /* a reconnect keeps counters of accelerators it still has */
  assert_int_equal(reg_node(&f->r, "n1", 7, 2, "", 70), 0);
  assert_int_equal(n->accels[1].requests, 100);
}

static void test_leave_and_forget(void **state) {
  struct fx *f = *state;
  struct lynx_reg_err err;
  assert_int_equal(reg_node(&f->r, "n1", 5, 2, "", 0), 0);
  assert_int_equal(reg_node(&f->r, "n2", 5, 2, "", 0), 0);
  add_service(&f->r, "echo", 7000, 0, NULL);
  ready_all(&f->r, 0);

  /* forget only when down */
  assert_int_equal(lynx_reg_forget(&f->r, "n1", &err), -EBUSY);
  assert_int_equal(err.status, 409);
  assert_string_equal(err.code, "conflict");
  assert_int_equal(lynx_reg_forget(&f->r, "zz", &err), -ENOENT);
  assert_int_equal(err.status, 404);
  assert_string_equal(err.code, "not_found");

  assert_int_equal(lynx_reg_leave(&f->r, "n1", 4, 10), -ESTALE);
  assert_int_equal(lynx_reg_leave(&f->r, "zz", 5, 10), -ENOENT);
  assert_int_equal(node_state(&f->r, "n1"), LYNX_NODE_READY);
  assert_int_equal(lynx_reg_leave(&f->r, "n1", 5, 10), 0);
  assert_int_equal(node_state(&f->r, "n1"), LYNX_NODE_DOWN);
  assert_int_equal(count_inst(&f->r, "n1", NULL, -1), 0);
  assert_int_equal(table_len(&f->r), 2);
  assert_int_equal(f->n_stop, 0);
  assert_int_equal(lynx_reg_leave(&f->r, "n1", 5, 11), 0); /* again: fine */

  assert_int_equal(lynx_reg_forget(&f->r, "n1", &err), 0);
  assert_null(lynx_reg_node_find(&f->r, "n1"));
  assert_non_null(lynx_reg_node_find(&f->r, "n2"));
  assert_int_equal(lynx_reg_forget(&f->r, "n1", &err), -ENOENT);
}

/* A coordinator that stops leading (elect.c) forgets its live nodes, not
 * the ones it declared down: leading again, it takes the live ones back at
 * their epoch (no new incarnation), the down ones only as new ones. */
static void test_nodes_release(void **state) {
  struct fx *f = *state;
  assert_int_equal(reg_node(&f->r, "n1", 5, 2, "", 0), 0);
  assert_int_equal(reg_node(&f->r, "n2", 5, 2, "", 0), 0);
  add_service(&f->r, "echo", 7000, 0, NULL);
  ready_all(&f->r, 0);
  assert_int_equal(table_len(&f->r), 4);
  assert_int_equal(lynx_reg_leave(&f->r, "n2", 5, 10), 0);
  assert_int_equal(lynx_reg_nodes_release(&f->r), 1);
  assert_null(lynx_reg_node_find(&f->r, "n1"));
  assert_int_equal(node_state(&f->r, "n2"), LYNX_NODE_DOWN);
  assert_int_equal(count_inst(&f->r, "n1", NULL, -1), 0);
  assert_int_equal(table_len(&f->r), 0);
  assert_int_equal(f->n_stop, 0); /* forgotten, not stopped: they serve */
  assert_int_equal(lynx_reg_nodes_release(&f->r), 0);
  /* nothing left to expire */
  lynx_reg_tick(&f->r, 1000000);
  assert_null(lynx_reg_node_find(&f->r, "n1"));
  /* back: n1 at its epoch, n2's declared-down epoch refused */
  assert_int_equal(reg_node(&f->r, "n1", 5, 2, "", 1000001), 0);
  assert_int_equal(node_state(&f->r, "n1"), LYNX_NODE_READY);
  assert_int_equal(f->r.new_incarnations, 0);
  assert_int_equal(reg_node(&f->r, "n2", 5, 2, "", 1000001), -ESTALE);
  assert_int_equal(f->r.new_incarnations, 1);
}

static void test_epochs(void **state) {
  struct fx *f = *state;
  struct lynx_reg_instance *i;
  struct lynx_region_desc d;
  uint64_t ids[2] = {0, 0}, tv;
  int k = 0;

  assert_int_equal(reg_node(&f->r, "n1", 100, 2, "", 0), 0);
  add_service(&f->r, "echo", 7000, 0, NULL);
  ready_all(&f->r, 0);
  for (i = f->r.instances; i; i = i->next)
    ids[k++] = i->id;
  assert_int_equal(k, 2);

  /* older: refused, nothing changes */
  assert_int_equal(reg_node(&f->r, "n1", 99, 2, "", 10), -ESTALE);
  assert_int_equal(f->r.refused_epochs, 1);
  assert_int_equal(lynx_reg_node_find(&f->r, "n1")->epoch, 100);
  assert_int_equal(count_inst(&f->r, "n1", NULL, LYNX_INST_READY), 2);

  /* equal: a reconnect; instances kept, nothing started or pushed */
  tv = f->r.table_version;
  f->n_start = 0;
  f->n_tables = 0;
  assert_int_equal(reg_node(&f->r, "n1", 100, 2, "zone=b", 20), 0);
  assert_int_equal(f->n_start, 0);
  assert_int_equal(f->n_stop, 0);
  assert_int_equal(f->n_tables, 0);
  assert_int_equal(f->r.table_version, tv);
  assert_int_equal(count_inst(&f->r, "n1", NULL, LYNX_INST_READY), 2);
  assert_int_equal(f->r.instances->id, ids[0]);
  assert_int_equal(f->r.instances->next->id, ids[1]);
  assert_int_equal(lynx_reg_node_find(&f->r, "n1")->n_labels, 1);

  /* newer: the agent restarted; old instances forgotten, new ones placed */
  assert_int_equal(reg_node(&f->r, "n1", 101, 2, "", 30), 0);
  assert_int_equal(f->n_stop, 0);
  assert_int_equal(f->n_start, 2);
  assert_int_equal(count_inst(&f->r, "n1", NULL, LYNX_INST_STARTING), 2);
  assert_true(f->r.instances->id > ids[1]);
  assert_int_equal(f->r.table_version, tv + 1);
  assert_int_equal(table_len(&f->r), 0);

  /* anything carrying the old epoch is refused */
  i = f->r.instances;
  d = desc_for(i);
  assert_int_equal(lynx_reg_instance_ready(&f->r, "n1", 100, i->id, &d, 40),
                   -ESTALE);
  assert_int_equal(lynx_reg_instance_failed(&f->r, "n1", 100, i->id, "old", 40),
                   -ESTALE);
  assert_int_equal(lynx_reg_leave(&f->r, "n1", 100, 40), -ESTALE);
  assert_int_equal(lynx_reg_instance_ready(&f->r, "n1", 101, ids[0], &d, 40),
                   -ENOENT);
  assert_int_equal(lynx_reg_instance_ready(&f->r, "zz", 101, i->id, &d, 40),
                   -ENOENT);
  assert_int_equal(lynx_reg_instance_ready(&f->r, "n1", 101, i->id, &d, 40), 0);
  assert_int_equal(table_len(&f->r), 1);
}

static void test_reconnect_drops_missing_accel(void **state) {
  struct fx *f = *state;
  assert_int_equal(reg_node(&f->r, "n1", 1, 3, "", 0), 0);
  add_service(&f->r, "echo", 7000, 0, NULL);
  ready_all(&f->r, 0);
  assert_int_equal(table_len(&f->r), 3);
  /* the same incarnation reports only two accelerators now */
  assert_int_equal(reg_node(&f->r, "n1", 1, 2, "", 10), 0);
  assert_int_equal(f->n_stop, 1);
  assert_int_equal(count_inst(&f->r, "n1", NULL, -1), 2);
  assert_int_equal(table_len(&f->r), 2);
}

static void test_place_all(void **state) {
  struct fx *f = *state;
  char node[8];
  int k, a, seen[3][2];
  uint64_t tv;

  for (k = 0; k < 3; k++) {
    snprintf(node, sizeof(node), "n%d", k);
    assert_int_equal(reg_node(&f->r, node, 1, 2, "", 0), 0);
  }
  assert_int_equal(f->n_start, 0);
  add_service(&f->r, "echo", 7000, 0, NULL);
  assert_int_equal(f->n_start, 6);
  memset(seen, 0, sizeof(seen));
  for (k = 0; k < 6; k++) {
    int nk = f->start[k].node[1] - '0';
    assert_true(nk >= 0 && nk < 3);
    assert_true(f->start[k].accel < 2);
    seen[nk][f->start[k].accel]++;
    assert_string_equal(f->start[k].svc, "echo");
  }
  for (k = 0; k < 3; k++)
    for (a = 0; a < 2; a++)
      assert_int_equal(seen[k][a], 1);
  assert_int_equal(count_inst(&f->r, NULL, "echo", LYNX_INST_STARTING), 6);
  assert_int_equal(table_len(&f->r), 0);

  /* each ready report that changes the table bumps its version once */
  tv = f->r.table_version;
  f->n_tables = 0;
  assert_int_equal(ready_all(&f->r, 10), 6);
  assert_int_equal(f->r.table_version, tv + 6);
  assert_int_equal(f->n_tables, 6);
  assert_int_equal(f->r.table_pushes, f->r.table_version);
  assert_int_equal(table_len(&f->r), 6);

  /* placement is stable: ticks change nothing */
  for (k = 0; k < 3; k++) {
    snprintf(node, sizeof(node), "n%d", k);
    heartbeat(&f->r, node, 100);
  }
  lynx_reg_tick(&f->r, 100);
  lynx_reg_tick(&f->r, 200);
  assert_int_equal(f->n_start, 6);
  assert_int_equal(f->n_stop, 0);
  assert_int_equal(f->r.table_version, tv + 6);

  /* a joining node gets instances at once */
  assert_int_equal(reg_node(&f->r, "n3", 1, 2, "", 300), 0);
  assert_int_equal(f->n_start, 8);
  assert_string_equal(f->start[7].node, "n3");
}

/* A GPU gets no instance its resident-block budget cannot hold
 * (AccelInfo.resident_blocks): the blocks taken are its agent's report,
 * the fewest of each starting instance (one per 64 mqueues in auto, the
 * agent's --gpu-blocks otherwise) and never less than all its instances'
 * fewest; blocks given back make room. A CPU has no budget. */
static int reg_gpu(struct lynx_registry *r, const char *id, uint32_t resident,
                   uint32_t per_instance, uint64_t now) {
  struct lynx_accel_info acc;
  struct lynx_reg_err err;
  memset(&acc, 0, sizeof(acc));
  snprintf(acc.kind, sizeof(acc.kind), "cuda");
  snprintf(acc.model, sizeof(acc.model), "Fake GPU");
  acc.resident_blocks = resident;
  acc.instance_blocks = per_instance;
  return lynx_reg_register(r, id, "127.0.0.1:7790", 1, NULL, 0, &acc, 1,
                           (void *)0x1, now, &err);
}

static void hb_blocks(struct lynx_registry *r, const char *id, uint64_t now,
                      uint32_t held) {
  struct lynx_accel_report rep;
  memset(&rep, 0, sizeof(rep));
  rep.blocks_held = held;
  assert_int_equal(lynx_reg_heartbeat(r, id, 1, &rep, 1, now), 0);
}

static void add_gpu_service(struct lynx_registry *r, const char *name,
                            uint32_t port, uint32_t mqueues) {
  struct lynx_service_spec s = ut_spec(name, port, 1, NULL);
  struct lynx_reg_err err;
  s.mqueues_per_accel = mqueues;
  assert_int_equal(lynx_reg_service_create(r, &s, 0, &err), 0);
}

static void test_place_gpu_blocks(void **state) {
  struct fx *f = *state;
  struct lynx_reg_err err;
  assert_int_equal(reg_gpu(&f->r, "g0", 10, 0, 0), 0);
  /* 256 mqueues take at least 4 blocks: two fit in 10, a third does not */
  add_gpu_service(&f->r, "a", 7000, 256);
  add_gpu_service(&f->r, "b", 7001, 256);
  add_gpu_service(&f->r, "c", 7002, 256);
  assert_int_equal(count_inst(&f->r, "g0", NULL, -1), 2);
  assert_int_equal(count_inst(&f->r, "g0", "c", -1), 0);
  /* ready, and the agent says auto took what was left: nothing fits, not
   * even one block's worth */
  assert_int_equal(ready_all(&f->r, 10), 2);
  hb_blocks(&f->r, "g0", 20, 10);
  add_gpu_service(&f->r, "d", 7003, 64);
  lynx_reg_tick(&f->r, 30);
  assert_int_equal(count_inst(&f->r, "g0", NULL, -1), 2);
  /* a goes: once the agent reports its blocks back, c and d fit */
  assert_int_equal(lynx_reg_service_delete(&f->r, "a", 40, &err), 0);
  lynx_reg_tick(&f->r, 50);
  assert_int_equal(count_inst(&f->r, "g0", "c", -1), 0);
  hb_blocks(&f->r, "g0", 60, 5); /* b's 5 */
  lynx_reg_tick(&f->r, 70);
  assert_int_equal(count_inst(&f->r, "g0", "c", -1), 1);
  assert_int_equal(count_inst(&f->r, "g0", "d", -1), 1);

  /* --gpu-blocks 6: one 256-mqueue instance per GPU of 10; an instance of
   * 2 mqueues takes 2 (no block beyond its mqueues), so two fit beside */
  assert_int_equal(reg_gpu(&f->r, "g1", 10, 6, 100), 0);
  lynx_reg_tick(&f->r, 110);
  assert_int_equal(count_inst(&f->r, "g1", NULL, -1), 1); /* b, c or d */
  for (int k = 0; k < 3; k++) {
    char name[8];
    struct lynx_service_spec s;
    snprintf(name, sizeof(name), "e%d", k);
    s = ut_spec(name, 7004 + k, 0, NULL); /* on every accelerator */
    assert_int_equal(lynx_reg_service_create(&f->r, &s, 120, &err), 0);
  }
  assert_int_equal(count_inst(&f->r, "g1", NULL, -1), 3);
  assert_int_equal(count_inst(&f->r, "g1", "e2", -1), 0); /* 6 + 2 + 2 */
  /* a CPU accelerator has no budget: all three run there */
  assert_int_equal(reg_node(&f->r, "c0", 1, 1, "", 130), 0);
  assert_int_equal(count_inst(&f->r, "c0", NULL, -1), 3);
  assert_int_equal(count_inst(&f->r, "c0", "e2", -1), 1);
}

static void test_place_selector(void **state) {
  struct fx *f = *state;
  assert_int_equal(reg_node(&f->r, "a", 1, 2, "gpu=a100,zone=eu", 0), 0);
  assert_int_equal(reg_node(&f->r, "b", 1, 2, "gpu=t4,zone=eu", 0), 0);
  assert_int_equal(reg_node(&f->r, "c", 1, 2, "gpu=a100,zone=us", 0), 0);
  add_service(&f->r, "big", 7000, 0, "gpu=a100");
  assert_int_equal(count_inst(&f->r, "a", "big", -1), 2);
  assert_int_equal(count_inst(&f->r, "b", "big", -1), 0);
  assert_int_equal(count_inst(&f->r, "c", "big", -1), 2);
  add_service(&f->r, "eu", 7001, 0, "gpu=a100,zone=eu");
  assert_int_equal(count_inst(&f->r, NULL, "eu", -1), 2);
  assert_int_equal(count_inst(&f->r, "a", "eu", -1), 2);
  add_service(&f->r, "t4", 7002, 3, "gpu=t4");
  /* only two accelerators match: as many as there are */
  assert_int_equal(count_inst(&f->r, "b", "t4", -1), 2);
  assert_int_equal(count_inst(&f->r, NULL, "t4", -1), 2);
  add_service(&f->r, "none", 7003, 0, "gpu=h100");
  assert_int_equal(count_inst(&f->r, NULL, "none", -1), 0);
  /* a matching node joins: the short service fills up */
  assert_int_equal(reg_node(&f->r, "d", 1, 1, "gpu=t4", 10), 0);
  assert_int_equal(count_inst(&f->r, NULL, "t4", -1), 3);
  assert_int_equal(count_inst(&f->r, "d", "t4", -1), 1);
  /* labels change on a reconnect: instances that no longer match stop */
  f->n_stop = 0;
  assert_int_equal(reg_node(&f->r, "a", 1, 2, "gpu=t4,zone=eu", 20), 0);
  assert_int_equal(count_inst(&f->r, "a", "big", -1), 0);
  assert_int_equal(count_inst(&f->r, "a", "eu", -1), 0);
  assert_int_equal(f->n_stop, 4);
  assert_int_equal(count_inst(&f->r, NULL, "t4", -1), 3); /* still enough */
}

static void test_replicas_spread_and_replace(void **state) {
  struct fx *f = *state;
  char node[8];
  int k;
  uint64_t tv;
  struct lynx_reg_instance *i;

  for (k = 0; k < 3; k++) {
    snprintf(node, sizeof(node), "n%d", k);
    assert_int_equal(reg_node(&f->r, node, 1, 2, "", 0), 0);
  }
  add_service(&f->r, "rep", 7000, 3, NULL);
  /* spread across nodes first */
  assert_int_equal(f->n_start, 3);
  for (k = 0; k < 3; k++) {
    snprintf(node, sizeof(node), "n%d", k);
    assert_int_equal(count_inst(&f->r, node, "rep", -1), 1);
  }
  ready_all(&f->r, 0);
  assert_int_equal(table_len(&f->r), 3);

  /* least-loaded accelerators: a second service avoids busy ones */
  add_service(&f->r, "two", 7001, 3, NULL);
  for (i = f->r.instances; i; i = i->next) {
    struct lynx_reg_instance *j;
    if (strcmp(i->svc->spec.name, "two"))
      continue;
    for (j = f->r.instances; j; j = j->next)
      if (j != i && j->node == i->node && j->accel_idx == i->accel_idx)
        fail_msg("two instances on %s/%u", i->node->id, i->accel_idx);
  }
  ready_all(&f->r, 0);

  /* n1 dies: its replica is re-placed on another node */
  heartbeat(&f->r, "n0", LEASE - 1);
  heartbeat(&f->r, "n2", LEASE - 1);
  tv = f->r.table_version;
  f->n_start = 0;
  lynx_reg_tick(&f->r, LEASE);
  assert_int_equal(node_state(&f->r, "n1"), LYNX_NODE_DOWN);
  assert_int_equal(f->n_start, 2); /* one per service */
  assert_string_not_equal(f->start[0].node, "n1");
  assert_string_not_equal(f->start[1].node, "n1");
  assert_int_equal(count_inst(&f->r, NULL, "rep", -1), 3);
  assert_int_equal(count_inst(&f->r, NULL, "two", -1), 3);
  assert_int_equal(count_inst(&f->r, "n1", NULL, -1), 0);
  assert_true(f->r.table_version > tv);
  /* still one per accelerator per service */
  for (i = f->r.instances; i; i = i->next) {
    struct lynx_reg_instance *j;
    for (j = i->next; j; j = j->next)
      if (j->svc == i->svc)
        assert_false(j->node == i->node && j->accel_idx == i->accel_idx);
  }
  ready_all(&f->r, LEASE);
  assert_int_equal(table_len(&f->r), 6);

  /* n1 comes back: each service has two replicas on one node and none on
   * n1, so one of each moves there (started; the moved ones serve until
   * their replacements are ready, then stop: no frontend to wait for) */
  f->n_start = 0;
  f->n_stop = 0;
  assert_int_equal(reg_node(&f->r, "n1", 2, 2, "", LEASE + 10), 0);
  assert_int_equal(f->n_start, 2);
  assert_string_equal(f->start[0].node, "n1");
  assert_string_equal(f->start[1].node, "n1");
  assert_int_equal(f->n_stop, 0);
  assert_int_equal(table_len(&f->r), 6);
  ready_all(&f->r, LEASE + 20);
  assert_int_equal(f->n_stop, 2);
  assert_int_equal(table_len(&f->r), 6);
  for (k = 0; k < 3; k++) {
    snprintf(node, sizeof(node), "n%d", k);
    assert_int_equal(count_inst(&f->r, node, "rep", -1), 1);
    assert_int_equal(count_inst(&f->r, node, "two", -1), 1);
  }
  /* balanced: nothing moves any more */
  lynx_reg_tick(&f->r, LEASE + 30);
  assert_int_equal(f->n_start, 2);

  /* with too little capacity, as many as fit; the rest when nodes join */
  add_service(&f->r, "wide", 7002, 8, NULL);
  assert_int_equal(count_inst(&f->r, NULL, "wide", -1), 6);
  assert_int_equal(reg_node(&f->r, "n4", 1, 4, "", LEASE + 20), 0);
  assert_int_equal(count_inst(&f->r, NULL, "wide", -1), 8);
  assert_int_equal(count_inst(&f->r, "n4", "wide", -1), 2);
}

/* Two replicas on n0's two accelerators, a frontend that has applied the
 * table; n1 (one accelerator) joins and a replica moves there. Sets *old
 * and *repl to the moving replica and its replacement. */
static void move_setup(struct fx *f, uint64_t *old, uint64_t *repl) {
  struct lynx_reg_instance *i;
  assert_int_equal(reg_node(&f->r, "n0", 1, 2, "", 0), 0);
  add_service(&f->r, "rep", 7000, 2, NULL);
  ready_all(&f->r, 0);
  assert_int_equal(count_inst(&f->r, "n0", "rep", LYNX_INST_READY), 2);
  assert_non_null(lynx_reg_frontend_connect(&f->r, "fe1", "x", (void *)0x2, 0));
  lynx_reg_frontend_status(&f->r, "fe1", f->r.table_version, NULL, 0, 0);
  f->n_start = f->n_stop = 0;
  assert_int_equal(reg_node(&f->r, "n1", 1, 1, "", 100), 0);
  assert_int_equal(f->n_start, 1);
  assert_string_equal(f->start[0].node, "n1");
  *repl = f->start[0].id;
  *old = 0;
  for (i = f->r.instances; i; i = i->next)
    if (i->replaced_by == *repl)
      *old = i->id;
  assert_true(*old != 0);
}

/* Replicas follow capacity with drain semantics: a node joins that the
 * placement prefers; the replica moving there serves until its
 * replacement is ready, then leaves the table and is stopped only once
 * the frontend runs a table without it and has nothing outstanding on it.
 * A replacement that fails to start leaves the replica where it was. */
static void test_replicas_follow_capacity(void **state) {
  struct fx *f = *state;
  struct lynx_reg_instance *i;
  struct lynx_fe_mq_report mq[1];
  uint64_t old_id, repl_id;
  move_setup(f, &old_id, &repl_id);
  assert_int_equal(f->r.moves_started, 1);
  assert_int_equal(table_len(&f->r), 2);
  /* one move at a time, and none while it runs */
  lynx_reg_tick(&f->r, 200);
  assert_int_equal(f->n_start, 1);

  /* the replacement fails: the replica stays, and the move is tried again
   * after the accelerator's backoff */
  assert_int_equal(
      lynx_reg_instance_failed(&f->r, "n1", 1, repl_id, "boom", 300), 0);
  lynx_reg_tick(&f->r, 310);
  assert_int_equal(count_inst(&f->r, "n0", "rep", LYNX_INST_READY), 2);
  assert_int_equal(f->n_stop, 0);
  assert_int_equal(table_len(&f->r), 2);
  lynx_reg_tick(&f->r, 2000);
  assert_int_equal(f->n_start, 2);
  assert_string_equal(f->start[1].node, "n1");
  repl_id = f->start[1].id;
  for (i = f->r.instances; i; i = i->next)
    if (i->replaced_by == repl_id)
      old_id = i->id;

  /* ready: the moved replica leaves the table, but runs on while the
   * frontend has not applied that table or has requests on it */
  ready_all(&f->r, 2100);
  assert_true(table_has(&f->r, repl_id));
  assert_false(table_has(&f->r, old_id));
  assert_int_equal(table_len(&f->r), 2);
  assert_int_equal(count_inst(&f->r, "n0", "rep", LYNX_INST_RETIRING), 1);
  assert_int_equal(f->n_stop, 0);
  lynx_reg_frontend_status(&f->r, "fe1", f->r.table_version - 1, NULL, 0, 2200);
  assert_int_equal(f->n_stop, 0);
  memset(mq, 0, sizeof(mq));
  mq[0].instance_id = old_id;
  mq[0].outstanding = 4;
  lynx_reg_frontend_status(&f->r, "fe1", f->r.table_version, mq, 1, 2300);
  lynx_reg_tick(&f->r, 2400);
  assert_int_equal(f->n_stop, 0);
  mq[0].outstanding = 0;
  lynx_reg_frontend_status(&f->r, "fe1", f->r.table_version, mq, 1, 2500);
  assert_int_equal(f->n_stop, 1);
  assert_true(f->stop[0].id == old_id);
  assert_int_equal(f->r.moves_done, 1);
  assert_int_equal(count_inst(&f->r, "n0", "rep", -1), 1);
  assert_int_equal(count_inst(&f->r, "n1", "rep", LYNX_INST_READY), 1);
  /* balanced (one each): no more moves */
  lynx_reg_tick(&f->r, 2600);
  assert_int_equal(f->n_start, 2);
}

/* A moved replica whose frontend never reports it quiet is stopped at the
 * drain timeout. */
static void test_replica_move_deadline(void **state) {
  struct fx *f = *state;
  struct lynx_fe_mq_report mq[1];
  uint64_t old_id, repl_id;
  move_setup(f, &old_id, &repl_id);
  ready_all(&f->r, 1000);
  memset(mq, 0, sizeof(mq));
  mq[0].instance_id = old_id;
  mq[0].outstanding = 1;
  for (uint64_t t = 1100; t < 1000 + DRAIN_TIMEOUT; t += 1000) {
    heartbeat(&f->r, "n0", t);
    heartbeat(&f->r, "n1", t);
    lynx_reg_frontend_status(&f->r, "fe1", f->r.table_version, mq, 1, t);
    lynx_reg_tick(&f->r, t);
  }
  lynx_reg_tick(&f->r, 1000 + DRAIN_TIMEOUT - 1);
  assert_int_equal(f->n_stop, 0);
  lynx_reg_tick(&f->r, 1000 + DRAIN_TIMEOUT);
  assert_int_equal(f->n_stop, 1);
  assert_true(f->stop[0].id == old_id);
}

static void test_replicas_during_drain(void **state) {
  struct fx *f = *state;
  struct lynx_reg_err err;
  assert_int_equal(reg_node(&f->r, "n0", 1, 1, "", 0), 0);
  assert_int_equal(reg_node(&f->r, "n1", 1, 1, "", 0), 0);
  assert_int_equal(reg_node(&f->r, "n2", 1, 1, "", 0), 0);
  add_service(&f->r, "rep", 7000, 2, NULL);
  ready_all(&f->r, 0);
  assert_int_equal(count_inst(&f->r, "n2", NULL, -1), 0);
  assert_non_null(lynx_reg_frontend_connect(&f->r, "fe1", "x", (void *)0x2, 0));
  /* n0 drains: its replacement starts on n2 while n0 keeps answering */
  assert_int_equal(lynx_reg_drain(&f->r, "n0", 10, &err), 0);
  assert_int_equal(count_inst(&f->r, "n0", NULL, LYNX_INST_READY), 1);
  assert_int_equal(count_inst(&f->r, "n2", NULL, LYNX_INST_STARTING), 1);
  lynx_reg_tick(&f->r, 20);
  assert_int_equal(count_inst(&f->r, "n0", NULL, LYNX_INST_READY), 1);
  assert_int_equal(node_state(&f->r, "n0"), LYNX_NODE_DRAINING);
}

static void test_instance_failed_retries_after_backoff(void **state) {
  struct fx *f = *state;
  struct lynx_reg_instance *i;
  uint64_t id, tv;
  assert_int_equal(reg_node(&f->r, "n1", 1, 1, "", 0), 0);
  add_service(&f->r, "echo", 7000, 0, NULL);
  assert_int_equal(f->n_start, 1);
  i = f->r.instances;
  id = i->id;
  tv = f->r.table_version;
  assert_int_equal(lynx_reg_instance_failed(&f->r, "n1", 1, id, "no app", 10),
                   0);
  assert_null(f->r.instances);
  assert_int_equal(f->r.table_version, tv); /* it never was dispatchable */
  assert_int_equal(f->n_start, 1);          /* not at once */
  assert_int_equal(lynx_reg_instance_failed(&f->r, "n1", 1, id, "again", 10),
                   -ENOENT);
  /* backoff: 200 ms after the first failure, doubling after each */
  lynx_reg_tick(&f->r, 100);
  assert_int_equal(f->n_start, 1);
  lynx_reg_tick(&f->r, 209);
  assert_int_equal(f->n_start, 1);
  lynx_reg_tick(&f->r, 210);
  assert_int_equal(f->n_start, 2);
  assert_true(f->start[1].id > id);
  assert_int_equal(lynx_reg_instance_failed(&f->r, "n1", 1, f->start[1].id,
                                            "still no app", 220),
                   0);
  lynx_reg_tick(&f->r, 619);
  assert_int_equal(f->n_start, 2);
  lynx_reg_tick(&f->r, 620);
  assert_int_equal(f->n_start, 3);
  ready_all(&f->r, 630);
  assert_int_equal(f->r.table_version, tv + 1);
  /* a start that succeeded resets the backoff */
  assert_int_equal(f->r.nodes->accels[0].failures, 0);
  /* a repeated ready report with the same region changes nothing */
  {
    struct lynx_region_desc d = desc_for(f->r.instances);
    assert_int_equal(
        lynx_reg_instance_ready(&f->r, "n1", 1, f->r.instances->id, &d, 120),
        0);
    assert_int_equal(f->r.table_version, tv + 1);
    /* a new region does */
    d.region_size *= 2;
    assert_int_equal(
        lynx_reg_instance_ready(&f->r, "n1", 1, f->r.instances->id, &d, 130),
        0);
    assert_int_equal(f->r.table_version, tv + 2);
  }
  /* a ready instance failing leaves the table */
  assert_int_equal(lynx_reg_instance_failed(&f->r, "n1", 1, f->r.instances->id,
                                            "crash", 140),
                   0);
  assert_int_equal(f->r.table_version, tv + 3);
  assert_int_equal(f->table_len_at_push, 0);
}

static void expect_invalid(struct lynx_registry *r,
                           const struct lynx_service_spec *s,
                           const char *field) {
  struct lynx_reg_err err;
  char prefix[64];
  memset(&err, 0, sizeof(err));
  assert_int_equal(lynx_reg_service_create(r, s, 0, &err), -EINVAL);
  assert_int_equal(err.status, 400);
  assert_string_equal(err.code, "invalid_argument");
  snprintf(prefix, sizeof(prefix), "%s:", field);
  if (strncmp(err.message, prefix, strlen(prefix)))
    fail_msg("expected a message about %s, got \"%s\"", field, err.message);
}

static void test_service_validation(void **state) {
  struct fx *f = *state;
  struct lynx_service_spec s;
  struct lynx_reg_err err;

  s = ut_spec("", 7000, 0, NULL);
  expect_invalid(&f->r, &s, "name");
  s = ut_spec("a b", 7000, 0, NULL);
  expect_invalid(&f->r, &s, "name");
  s = ut_spec("a/b", 7000, 0, NULL);
  expect_invalid(&f->r, &s, "name");
  s = ut_spec("ok", 7000, 0, NULL);
  snprintf(s.proto, sizeof(s.proto), "sctp");
  expect_invalid(&f->r, &s, "proto");
  /* framing belongs to tcp; a fixed size must fit a slot */
  s = ut_spec("ok", 7000, 0, NULL);
  s.fixed_len = 64;
  expect_invalid(&f->r, &s, "framing");
  snprintf(s.proto, sizeof(s.proto), "tcp");
  s.fixed_len = s.slot_size; /* the slot's payload is 16 bytes less */
  expect_invalid(&f->r, &s, "framing");
  /* back ends: names, addresses, protocols, duplicates */
  s = ut_spec("ok", 7000, 0, NULL);
  s.n_backends = 1;
  snprintf(s.backends[0].name, sizeof(s.backends[0].name), "db");
  snprintf(s.backends[0].address, sizeof(s.backends[0].address),
           "db.example:11211");
  snprintf(s.backends[0].proto, sizeof(s.backends[0].proto), "memcached");
  expect_invalid(&f->r, &s, "backends[0].address");
  snprintf(s.backends[0].address, sizeof(s.backends[0].address),
           "127.0.0.1:11211");
  snprintf(s.backends[0].proto, sizeof(s.backends[0].proto), "redis");
  expect_invalid(&f->r, &s, "backends[0].proto");
  snprintf(s.backends[0].proto, sizeof(s.backends[0].proto), "len32");
  s.backends[1] = s.backends[0];
  s.n_backends = 2;
  expect_invalid(&f->r, &s, "backends[1].name");
  s = ut_spec("ok", 0, 0, NULL);
  expect_invalid(&f->r, &s, "port");
  s = ut_spec("ok", 65536, 0, NULL);
  expect_invalid(&f->r, &s, "port");
  s = ut_spec("ok", 7000, 0, NULL);
  s.app[0] = '\0';
  expect_invalid(&f->r, &s, "app");
  s = ut_spec("ok", 7000, 0, NULL);
  s.slot_size = 100;
  expect_invalid(&f->r, &s, "slot_size");
  assert_int_equal(lynx_reg_service_create(&f->r, &s, 0, &err), -EINVAL);
  assert_string_equal(err.message,
                      "slot_size: must be a power of two between 64 and "
                      "1048576");
  s.slot_size = 32;
  expect_invalid(&f->r, &s, "slot_size");
  s.slot_size = 1u << 21;
  expect_invalid(&f->r, &s, "slot_size");
  s = ut_spec("ok", 7000, 0, NULL);
  s.slots = 3;
  expect_invalid(&f->r, &s, "slots");
  s.slots = 1;
  expect_invalid(&f->r, &s, "slots");
  s.slots = 1u << 17;
  expect_invalid(&f->r, &s, "slots");
  s = ut_spec("ok", 7000, 0, NULL);
  s.mqueues_per_accel = 0;
  expect_invalid(&f->r, &s, "mqueues_per_accel");
  s.mqueues_per_accel = 1025;
  expect_invalid(&f->r, &s, "mqueues_per_accel");
  s = ut_spec("ok", 7000, 0, NULL);
  s.placement = LYNX_PLACE_REPLICAS;
  s.replicas = 0;
  expect_invalid(&f->r, &s, "placement.replicas");
  s = ut_spec("ok", 7000, 0, NULL);
  s.placement = (enum lynx_placement_kind)5;
  expect_invalid(&f->r, &s, "placement");
  s = ut_spec("ok", 7000, 2, "a=1");
  s.selector[0].key[0] = '\0';
  expect_invalid(&f->r, &s, "placement.selector");
  assert_null(f->r.services);

  /* the bounds themselves are fine */
  s = ut_spec("edge.ok_1-x", 65535, 0, NULL);
  s.slot_size = 64;
  s.slots = 65536;
  s.mqueues_per_accel = 1;
  assert_int_equal(lynx_reg_service_create(&f->r, &s, 0, &err), 0);
  s = ut_spec("edge2", 1, 0, NULL);
  s.slot_size = 1u << 20;
  s.slots = 2;
  s.mqueues_per_accel = 1024;
  assert_int_equal(lynx_reg_service_create(&f->r, &s, 0, &err), 0);
}

static void test_service_conflicts_and_delete(void **state) {
  struct fx *f = *state;
  struct lynx_service_spec s;
  struct lynx_reg_err err;
  uint64_t tv;

  assert_int_equal(reg_node(&f->r, "n1", 1, 2, "", 0), 0);
  add_service(&f->r, "echo", 7000, 0, NULL);
  s = ut_spec("echo", 7001, 0, NULL);
  assert_int_equal(lynx_reg_service_create(&f->r, &s, 0, &err), -EEXIST);
  assert_int_equal(err.status, 409);
  assert_string_equal(err.code, "conflict");
  s = ut_spec("other", 7000, 0, NULL);
  assert_int_equal(lynx_reg_service_create(&f->r, &s, 0, &err), -EADDRINUSE);
  assert_int_equal(err.status, 409);
  assert_string_equal(err.code, "conflict");
  assert_non_null(strstr(err.message, "echo"));
  assert_non_null(lynx_reg_service_find(&f->r, "echo"));
  assert_null(lynx_reg_service_find(&f->r, "other"));

  ready_all(&f->r, 0);
  tv = f->r.table_version;
  assert_int_equal(lynx_reg_service_delete(&f->r, "nope", 10, &err), -ENOENT);
  assert_int_equal(err.status, 404);
  assert_string_equal(err.code, "not_found");
  assert_int_equal(lynx_reg_service_delete(&f->r, "echo", 10, &err), 0);
  assert_int_equal(f->n_stop, 2);
  assert_null(f->r.instances);
  assert_null(f->r.services);
  assert_int_equal(f->r.table_version, tv + 1);
  /* the port is free again */
  s = ut_spec("other", 7000, 0, NULL);
  assert_int_equal(lynx_reg_service_create(&f->r, &s, 0, &err), 0);
}

struct order_rec {
  char svc[8][LYNX_ID_MAX];
  uint64_t id[8];
  int n;
};

static void order_fn(void *arg, const struct lynx_reg_service *svc,
                     const struct lynx_reg_instance *inst) {
  struct order_rec *o = arg;
  assert_true(o->n < 8);
  snprintf(o->svc[o->n], LYNX_ID_MAX, "%s", svc->spec.name);
  o->id[o->n] = inst->id;
  o->n++;
}

static void test_table_order(void **state) {
  struct fx *f = *state;
  struct order_rec o;
  int k;
  assert_int_equal(reg_node(&f->r, "n1", 1, 1, "", 0), 0);
  add_service(&f->r, "zeta", 7000, 0, NULL);
  add_service(&f->r, "alpha", 7001, 0, NULL);
  assert_int_equal(reg_node(&f->r, "n2", 1, 1, "", 0), 0);
  ready_all(&f->r, 0);
  memset(&o, 0, sizeof(o));
  lynx_reg_table_foreach(&f->r, order_fn, &o);
  assert_int_equal(o.n, 4);
  /* services in creation order, instances by id */
  assert_string_equal(o.svc[0], "zeta");
  assert_string_equal(o.svc[1], "zeta");
  assert_string_equal(o.svc[2], "alpha");
  assert_string_equal(o.svc[3], "alpha");
  for (k = 0; k < 4; k += 2)
    assert_true(o.id[k] < o.id[k + 1]);
}

static void test_drain_intent_before_register(void **state) {
  struct fx *f = *state;
  struct lynx_reg_err err;
  assert_int_equal(lynx_reg_drain_intent_add(&f->r, "n1"), 0);
  assert_int_equal(lynx_reg_drain_intent_add(&f->r, "n1"), 0);
  assert_int_equal(lynx_reg_drain_intent_add(&f->r, "bad/id"), -EINVAL);
  add_service(&f->r, "echo", 7000, 0, NULL);
  assert_int_equal(reg_node(&f->r, "n1", 1, 2, "", 0), 0);
  assert_int_equal(node_state(&f->r, "n1"), LYNX_NODE_DRAINED);
  assert_true(lynx_reg_node_find(&f->r, "n1")->drain_intent);
  assert_null(f->r.drain_intents);
  assert_int_equal(f->n_start, 0);
  /* a new incarnation of a drained node stays drained */
  assert_int_equal(reg_node(&f->r, "n1", 2, 2, "", 10), 0);
  assert_int_equal(node_state(&f->r, "n1"), LYNX_NODE_DRAINED);
  assert_int_equal(lynx_reg_undrain(&f->r, "n1", 20, &err), 0);
  assert_int_equal(f->n_start, 2);
}

static void test_restart_while_draining(void **state) {
  struct fx *f = *state;
  struct lynx_reg_err err;
  assert_int_equal(reg_node(&f->r, "n1", 1, 2, "", 0), 0);
  add_service(&f->r, "echo", 7000, 0, NULL);
  ready_all(&f->r, 0);
  assert_non_null(lynx_reg_frontend_connect(&f->r, "fe1", "x", (void *)0x2, 0));
  assert_int_equal(lynx_reg_drain(&f->r, "n1", 10, &err), 0);
  assert_int_equal(node_state(&f->r, "n1"), LYNX_NODE_DRAINING);
  /* reconnect of the same agent: still draining, instances kept */
  assert_int_equal(reg_node(&f->r, "n1", 1, 2, "", 20), 0);
  assert_int_equal(node_state(&f->r, "n1"), LYNX_NODE_DRAINING);
  assert_int_equal(count_inst(&f->r, "n1", NULL, -1), 2);
  /* the agent restarted: what ran there is gone, so it is drained */
  assert_int_equal(reg_node(&f->r, "n1", 2, 2, "", 30), 0);
  assert_int_equal(node_state(&f->r, "n1"), LYNX_NODE_DRAINED);
  assert_int_equal(count_inst(&f->r, "n1", NULL, -1), 0);
  assert_int_equal(f->n_stop, 0);
}

static void test_connections(void **state) {
  struct fx *f = *state;
  struct lynx_reg_frontend *fe, *fe2;
  struct lynx_fe_mq_report mq = {5, 0, 1, 2, 3, 0};
  struct lynx_reg_node *n;
  assert_int_equal(reg_node(&f->r, "n1", 1, 1, "", 0), 0);
  n = lynx_reg_node_find(&f->r, "n1");
  assert_ptr_equal(n->conn, (void *)0x1);
  lynx_reg_node_disconnected(&f->r, (void *)0x1);
  assert_null(n->conn);
  assert_int_equal(n->state, LYNX_NODE_READY); /* the lease decides */

  fe = lynx_reg_frontend_connect(&f->r, "fe1", "10.0.0.1:5", (void *)0x9, 5);
  assert_non_null(fe);
  assert_true(fe->connected);
  lynx_reg_frontend_status(&f->r, "fe1", 3, &mq, 1, 6);
  assert_int_equal(fe->table_version_applied, 3);
  assert_int_equal(fe->n_mqs, 1);
  assert_int_equal(fe->mqs[0].dispatched, 2);
  assert_int_equal(fe->last_seen_ms, 6);
  lynx_reg_frontend_status(&f->r, "unknown", 3, &mq, 1, 6); /* ignored */
  lynx_reg_frontend_disconnected(&f->r, (void *)0x9);
  assert_false(fe->connected);
  assert_null(fe->conn);
  /* reconnecting finds the same record, fresh until it reports */
  fe2 = lynx_reg_frontend_connect(&f->r, "fe1", "10.0.0.1:6", (void *)0xa, 7);
  assert_ptr_equal(fe, fe2);
  assert_true(fe->connected);
  assert_int_equal(fe->table_version_applied, 0);
  assert_int_equal(fe->n_mqs, 0);
  assert_string_equal(fe->address, "10.0.0.1:6");
  assert_null(lynx_reg_frontend_connect(&f->r, "", "x", NULL, 0));
  lynx_reg_frontend_status(&f->r, "fe1", 4, &mq, 1, 8); /* freed at the end */
}

static void test_versions_grow(void **state) {
  struct fx *f = *state;
  struct lynx_reg_err err;
  uint64_t v = f->r.version;
#define GREW()                                                                 \
  do {                                                                         \
    assert_true(f->r.version > v);                                             \
    v = f->r.version;                                                          \
  } while (0)
  assert_int_equal(reg_node(&f->r, "n1", 1, 1, "", 0), 0);
  GREW();
  add_service(&f->r, "echo", 7000, 0, NULL);
  GREW();
  ready_all(&f->r, 0);
  GREW();
  assert_non_null(lynx_reg_frontend_connect(&f->r, "fe", "x", (void *)2, 0));
  GREW();
  assert_int_equal(lynx_reg_drain(&f->r, "n1", 0, &err), 0);
  GREW();
  lynx_reg_frontend_status(&f->r, "fe", f->r.table_version, NULL, 0, 1);
  GREW();
  assert_int_equal(lynx_reg_undrain(&f->r, "n1", 2, &err), 0);
  GREW();
  lynx_reg_tick(&f->r, LEASE);
  GREW();
  assert_int_equal(lynx_reg_forget(&f->r, "n1", &err), 0);
  GREW();
  assert_int_equal(lynx_reg_service_delete(&f->r, "echo", 0, &err), 0);
  GREW();
#undef GREW
}

/* ---- accelerator health ---------------------------------------------- */

/* A stalled mqueue takes that accelerator's instances (of every service)
 * out of the table, in one table version; the node's other accelerator
 * and other nodes keep theirs; nothing is stopped. Repeating the stall
 * changes nothing; recovering brings back the very same instances. */
static void test_health_stall_out_and_back(void **state) {
  struct fx *f = *state;
  struct lynx_reg_instance *i;
  struct lynx_reg_accel *a0, *a1;
  struct ids before, after;
  uint64_t tv, v;
  char why[128];
  int starts;

  assert_int_equal(reg_node(&f->r, "n1", 1, 2, "", 0), 0);
  assert_int_equal(reg_node(&f->r, "n2", 1, 1, "", 0), 0);
  add_service(&f->r, "echo", 7000, 0, NULL);
  add_service(&f->r, "kv", 7001, 0, NULL);
  assert_int_equal(ready_all(&f->r, 10), 6);
  before = table_ids(&f->r);
  assert_int_equal(before.n, 6);
  a0 = accel_of(&f->r, "n1", 0);
  a1 = accel_of(&f->r, "n1", 1);
  assert_true(lynx_reg_accel_dispatchable(a0));
  assert_string_equal(lynx_reg_accel_health_str(a0, why, sizeof(why)), "ok");
  starts = f->n_start;
  tv = f->r.table_version;
  v = f->r.version;
  f->n_tables = 0;

  assert_int_equal(hb_health(&f->r, "n1", 100, 0, 0, 0, 1, 2300, NULL), 0);
  assert_false(lynx_reg_accel_dispatchable(a0));
  assert_true(lynx_reg_accel_dispatchable(a1));
  assert_string_equal(lynx_reg_accel_health_str(a0, why, sizeof(why)),
                      "1 mqueue stalled for 2300 ms");
  assert_int_equal(f->r.table_version, tv + 1);
  assert_int_equal(f->n_tables, 1);
  assert_int_equal(f->table_len_at_push, 4);
  assert_true(f->r.version > v);
  for (i = f->r.instances; i; i = i->next) {
    int stalled = !strcmp(i->node->id, "n1") && i->accel_idx == 0;
    assert_int_equal(table_has(&f->r, i->id), !stalled);
    assert_int_equal(lynx_reg_inst_dispatchable(i), !stalled);
    assert_int_equal(i->state, LYNX_INST_READY); /* still placed */
  }
  assert_int_equal(f->n_stop, 0);
  assert_int_equal(f->n_start, starts);
  assert_int_equal(a0->health_outages, 1);
  assert_int_equal(a0->unhealthy_since_ms, 100);
  assert_int_equal(a1->health_outages, 0);

  /* the same stall again, longer: no table, no version, still one outage */
  v = f->r.version;
  assert_int_equal(hb_health(&f->r, "n1", 1100, 0, 0, 0, 1, 3300, NULL), 0);
  assert_int_equal(hb_health(&f->r, "n1", 2100, 0, 0, 0, 1, 4300, NULL), 0);
  hb_ok(&f->r, "n1", 2100, 1); /* the healthy one, healthy again */
  assert_int_equal(f->r.table_version, tv + 1);
  assert_int_equal(f->n_tables, 1);
  assert_int_equal(f->r.version, v);
  assert_int_equal(a0->health_outages, 1);
  assert_int_equal(a0->stall_ms, 4300);
  assert_int_equal(a0->unhealthy_since_ms, 100);
  /* placement leaves the stalled instances where they are */
  lynx_reg_tick(&f->r, 2200);
  assert_int_equal(f->n_stop, 0);
  assert_int_equal(f->n_start, starts);
  assert_int_equal(table_len(&f->r), 4);

  /* it recovers: the same instances are back, nothing restarted */
  hb_ok(&f->r, "n1", 2500, 0);
  assert_true(lynx_reg_accel_dispatchable(a0));
  assert_int_equal(f->r.table_version, tv + 2);
  assert_int_equal(f->n_tables, 2);
  assert_int_equal(f->table_len_at_push, 6);
  after = table_ids(&f->r);
  assert_int_equal(after.n, before.n);
  assert_memory_equal(after.id, before.id, sizeof(before.id[0]) * 6);
  lynx_reg_tick(&f->r, 2600);
  assert_int_equal(f->n_stop, 0);
  assert_int_equal(f->n_start, starts);
  assert_int_equal(a0->health_outages, 1);
  v = f->r.version;
  hb_ok(&f->r, "n1", 2700, 0);
  assert_int_equal(f->r.table_version, tv + 2);
  assert_int_equal(f->r.version, v);

  /* a second outage counts */
  assert_int_equal(hb_health(&f->r, "n1", 2800, 0, 0, 0, 2, 10, NULL), 0);
  assert_int_equal(a0->health_outages, 2);
  assert_int_equal(a0->unhealthy_since_ms, 2800);
  assert_string_equal(lynx_reg_accel_health_str(a0, why, sizeof(why)),
                      "2 mqueues stalled for 10 ms");
  assert_int_equal(f->r.table_version, tv + 3);
}

/* failed and device_lost take an accelerator out like a stall; placement
 * puts no new instance on an unhealthy accelerator, and does on the next
 * tick once it is healthy. */
static void test_health_lost_failed_and_placement(void **state) {
  struct fx *f = *state;
  struct lynx_reg_accel *a0, *a1;
  struct lynx_reg_instance *i;
  uint64_t tv, v;
  char why[256];

  assert_int_equal(reg_node(&f->r, "n1", 1, 2, "", 0), 0);
  a0 = accel_of(&f->r, "n1", 0);
  a1 = accel_of(&f->r, "n1", 1);
  v = f->r.version;
  assert_int_equal(hb_health(&f->r, "n1", 10, 1, 0, 1, 0, 0,
                             "Xid 79: GPU has fallen off the bus"),
                   0);
  assert_true(f->r.version > v);
  assert_false(lynx_reg_accel_dispatchable(a1));
  assert_string_equal(lynx_reg_accel_health_str(a1, why, sizeof(why)),
                      "failed: Xid 79: GPU has fallen off the bus");

  /* a new service: only n1/0; replicas: one, not two on n1/0 */
  add_service(&f->r, "echo", 7000, 0, NULL);
  assert_int_equal(f->n_start, 1);
  assert_int_equal(f->start[0].accel, 0);
  add_service(&f->r, "rep", 7001, 2, NULL);
  assert_int_equal(f->n_start, 2);
  assert_int_equal(f->start[1].accel, 0);
  lynx_reg_tick(&f->r, 20);
  assert_int_equal(f->n_start, 2);
  assert_int_equal(ready_all(&f->r, 20), 2);
  assert_int_equal(table_len(&f->r), 2);

  /* n1/0's device is lost: out, not stopped */
  tv = f->r.table_version;
  f->n_tables = 0;
  assert_int_equal(hb_health(&f->r, "n1", 30, 0, 1, 0, 0, 0, NULL), 0);
  assert_false(lynx_reg_accel_dispatchable(a0));
  assert_string_equal(lynx_reg_accel_health_str(a0, why, sizeof(why)),
                      "device lost");
  assert_int_equal(table_len(&f->r), 0);
  assert_int_equal(f->r.table_version, tv + 1);
  assert_int_equal(f->n_tables, 1);
  assert_int_equal(f->n_stop, 0);
  assert_int_equal(count_inst(&f->r, "n1", NULL, LYNX_INST_READY), 2);
  lynx_reg_tick(&f->r, 40);
  assert_int_equal(f->n_start, 2);
  assert_int_equal(f->n_stop, 0);

  /* several reasons at once, in one string */
  assert_int_equal(hb_health(&f->r, "n1", 45, 0, 1, 1, 3, 700, "ECC"), 0);
  assert_string_equal(lynx_reg_accel_health_str(a0, why, sizeof(why)),
                      "device lost; failed: ECC; 3 mqueues stalled for 700 ms");
  assert_int_equal(f->r.table_version, tv + 1); /* out already */
  assert_int_equal(a0->health_outages, 1);
  /* a tiny buffer is cut, terminated */
  assert_string_equal(lynx_reg_accel_health_str(a0, why, 7), "device");

  /* n1/1 is healthy again: not placed by the heartbeat, by the next tick */
  hb_ok(&f->r, "n1", 50, 1);
  assert_int_equal(f->n_start, 2);
  assert_int_equal(f->r.table_version, tv + 1); /* nothing ready there */
  lynx_reg_tick(&f->r, 60);
  assert_int_equal(f->n_start, 4);
  assert_int_equal(f->start[2].accel, 1);
  assert_int_equal(f->start[3].accel, 1);
  assert_string_equal(f->start[2].svc, "echo");
  assert_string_equal(f->start[3].svc, "rep");
  assert_int_equal(ready_all(&f->r, 60), 2);
  assert_int_equal(table_len(&f->r), 2);
  /* an instance that becomes ready on an unhealthy accelerator stays out */
  for (i = f->r.instances; i; i = i->next)
    assert_int_equal(lynx_reg_inst_dispatchable(i), i->accel_idx == 1);

  /* n1/0 is back (a device reset without an agent restart): its instances
   * return; rep has its two replicas and no third */
  hb_ok(&f->r, "n1", 70, 0);
  assert_int_equal(table_len(&f->r), 4);
  lynx_reg_tick(&f->r, 80);
  assert_int_equal(f->n_start, 4);
  assert_int_equal(f->n_stop, 0);
  assert_int_equal(count_inst(&f->r, NULL, "rep", -1), 2);
}

/* The same agent registering again keeps the health its heartbeats
 * reported; a new epoch starts healthy (the outage count stays). A
 * last_error that fills its field is cut, terminated. */
static void test_health_epochs(void **state) {
  struct fx *f = *state;
  struct lynx_reg_accel *a0;
  struct lynx_accel_report rep;
  uint64_t tv;

  assert_int_equal(reg_node(&f->r, "n1", 1, 2, "", 0), 0);
  add_service(&f->r, "echo", 7000, 0, NULL);
  assert_int_equal(ready_all(&f->r, 10), 2);
  a0 = accel_of(&f->r, "n1", 0);
  memset(&rep, 0, sizeof(rep));
  rep.idx = 0;
  rep.failed = 1;
  memset(rep.last_error, 'x', sizeof(rep.last_error)); /* no terminator */
  assert_int_equal(lynx_reg_heartbeat(&f->r, "n1", 1, &rep, 1, 100), 0);
  assert_int_equal(strlen(a0->last_error), sizeof(a0->last_error) - 1);
  assert_int_equal(table_len(&f->r), 1);
  tv = f->r.table_version;

  /* reconnect, same epoch: still out, nothing restarted */
  assert_int_equal(reg_node(&f->r, "n1", 1, 2, "", 200), 0);
  a0 = accel_of(&f->r, "n1", 0);
  assert_false(lynx_reg_accel_dispatchable(a0));
  assert_true(a0->failed);
  assert_int_equal(a0->unhealthy_since_ms, 100);
  assert_int_equal(table_len(&f->r), 1);
  assert_int_equal(f->r.table_version, tv);
  assert_int_equal(f->n_stop, 0);
  assert_int_equal(f->n_start, 2);

  /* declared down: the same epoch may not come back (a new incarnation
   * must), and the refusal changes nothing */
  lynx_reg_tick(&f->r, 200 + LEASE);
  assert_int_equal(node_state(&f->r, "n1"), LYNX_NODE_DOWN);
  assert_int_equal(reg_node(&f->r, "n1", 1, 2, "", 200 + LEASE + 1), -ESTALE);
  assert_int_equal(node_state(&f->r, "n1"), LYNX_NODE_DOWN);
  assert_true(accel_of(&f->r, "n1", 0)->failed);
  assert_int_equal(f->n_start, 2);

  /* a new agent: fresh health, placed on both, the outage remembered */
  assert_int_equal(reg_node(&f->r, "n1", 2, 2, "", 200 + LEASE + 2), 0);
  a0 = accel_of(&f->r, "n1", 0);
  assert_true(lynx_reg_accel_dispatchable(a0));
  assert_false(a0->failed);
  assert_string_equal(a0->last_error, "");
  assert_int_equal(a0->health_outages, 1);
  assert_int_equal(f->n_start, 4);
  assert_int_equal(ready_all(&f->r, 200 + LEASE + 3), 2);
  assert_int_equal(table_len(&f->r), 2);
}

/* Health and drains: a draining or drained node's health changes move no
 * table, the drain stops instances on unhealthy accelerators too, and an
 * undrained node gets instances only on its healthy accelerators. */
static void test_health_and_drain(void **state) {
  struct fx *f = *state;
  struct lynx_reg_err err;
  struct lynx_reg_node *n1;
  uint64_t tv, v;

  assert_int_equal(reg_node(&f->r, "n1", 1, 2, "", 0), 0);
  assert_int_equal(reg_node(&f->r, "n2", 1, 1, "", 0), 0);
  n1 = lynx_reg_node_find(&f->r, "n1");
  add_service(&f->r, "echo", 7000, 0, NULL);
  assert_int_equal(ready_all(&f->r, 10), 3);
  assert_non_null(
      lynx_reg_frontend_connect(&f->r, "fe1", "127.0.0.1:1", (void *)0x2, 10));
  lynx_reg_frontend_status(&f->r, "fe1", f->r.table_version, NULL, 0, 10);
  assert_int_equal(hb_health(&f->r, "n1", 100, 0, 0, 0, 1, 1500, NULL), 0);
  assert_int_equal(table_len(&f->r), 2);

  tv = f->r.table_version;
  assert_int_equal(lynx_reg_drain(&f->r, "n1", 200, &err), 0);
  assert_int_equal(n1->state, LYNX_NODE_DRAINING);
  assert_int_equal(f->r.table_version, tv + 1);
  assert_int_equal(n1->drain_table_version, tv + 1);
  assert_int_equal(table_len(&f->r), 1);
  tv = f->r.table_version;
  v = f->r.version;
  hb_ok(&f->r, "n1", 250, 0);
  assert_int_equal(hb_health(&f->r, "n1", 260, 1, 1, 0, 0, 0, NULL), 0);
  assert_int_equal(f->r.table_version, tv);
  assert_true(f->r.version > v);
  assert_int_equal(table_len(&f->r), 1);

  lynx_reg_frontend_status(&f->r, "fe1", f->r.table_version, NULL, 0, 300);
  assert_int_equal(n1->state, LYNX_NODE_DRAINED);
  assert_int_equal(f->n_stop, 2);
  assert_int_equal(f->r.table_version, tv);
  hb_ok(&f->r, "n1", 310, 1);
  assert_int_equal(hb_health(&f->r, "n1", 320, 0, 0, 0, 4, 90, NULL), 0);
  assert_int_equal(f->r.table_version, tv);
  lynx_reg_tick(&f->r, 330);
  assert_int_equal(count_inst(&f->r, "n1", NULL, -1), 0);

  /* undrained: only the healthy n1/1 gets an instance */
  f->n_start = 0;
  assert_int_equal(lynx_reg_undrain(&f->r, "n1", 400, &err), 0);
  assert_int_equal(f->n_start, 1);
  assert_int_equal(f->start[0].accel, 1);
  assert_int_equal(ready_all(&f->r, 410), 1);
  assert_int_equal(table_len(&f->r), 2);
  hb_ok(&f->r, "n1", 420, 0);
  lynx_reg_tick(&f->r, 430);
  assert_int_equal(f->n_start, 2);
  assert_int_equal(f->start[1].accel, 0);
}

/* What the API shows as text: valid UTF-8 without control characters. */
static void test_text(void **state) {
  static const char *const ok[] = {
      "",
      "echo",
      "zone-a.b_c",
      "caf\xc3\xa9",
      "\xe2\x82\xac 5",
      "\xf0\x9f\x9a\x80",
      "a b",
      "\xef\xbf\xbd",
  };
  static const char *const bad[] = {
      "\xff",             /* never in UTF-8 */
      "a\x80",            /* a stray continuation byte */
      "\xc0\xaf",         /* overlong '/' */
      "\xe0\x80\xaf",     /* overlong, 3 bytes */
      "\xed\xa0\x80",     /* a surrogate */
      "\xf4\x90\x80\x80", /* above U+10FFFF */
      "\xe2\x82",         /* cut short */
      "a\x01",
      "tab\there",
      "new\nline",
      "esc\x1b[2J",
      "del\x7f",
      "\xc2\x85", /* C1 control NEL */
  };
  char buf[64];
  (void)state;
  for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
    if (!lynx_text_ok(ok[i], strlen(ok[i])))
      fail_msg("'%s' refused", ok[i]);
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    if (lynx_text_ok(bad[i], strlen(bad[i])))
      fail_msg("bad text #%zu accepted", i);
  /* cleaning: bad bytes become '?', controls a space, valid text stays */
  assert_string_equal(lynx_text_clean(buf, sizeof(buf), "caf\xc3\xa9\xff!"),
                      "caf\xc3\xa9?!");
  assert_string_equal(lynx_text_clean(buf, sizeof(buf), "Xid\t79\x1b[2J\xc3"),
                      "Xid 79 [2J?");
  assert_string_equal(lynx_text_clean(buf, sizeof(buf), "\xed\xa0\x80"), "???");
  assert_string_equal(lynx_text_clean(buf, sizeof(buf), "\xc2\x85x"), " x");
  /* in place, and never a character cut in two at the end */
  snprintf(buf, sizeof(buf), "ab\x01\xff\xe2\x82\xac");
  assert_string_equal(lynx_text_clean(buf, sizeof(buf), buf),
                      "ab ?\xe2\x82\xac");
  assert_string_equal(lynx_text_clean(buf, 5, "ab\xe2\x82\xac"), "ab");
  assert_string_equal(lynx_text_clean(buf, 6, "ab\xe2\x82\xac"),
                      "ab\xe2\x82\xac");
  assert_true(lynx_text_ok(buf, strlen(buf)));
}

/* Labels are matched by selectors: bad ones refuse the registration with
 * the reason. Free text (kind, model, bus id, address) is shown only: it is
 * cleaned, so the API's JSON stays valid. */
static void test_register_text(void **state) {
  struct fx *f = *state;
  struct lynx_accel_info acc[1];
  struct lynx_label lab[2];
  struct lynx_reg_err err;
  struct lynx_reg_node *n;
  memset(acc, 0, sizeof(acc));
  memset(lab, 0, sizeof(lab));
  snprintf(acc[0].kind, sizeof(acc[0].kind), "cpu");
  snprintf(lab[0].key, sizeof(lab[0].key), "zone");
  snprintf(lab[0].value, sizeof(lab[0].value), "a\x1b[31m");
  assert_int_equal(lynx_reg_register(&f->r, "n1", "127.0.0.1:1", 1, lab, 1, acc,
                                     1, NULL, 0, &err),
                   -EINVAL);
  assert_int_equal(err.status, 400);
  assert_non_null(strstr(err.message, "labels[0]"));
  assert_non_null(strstr(err.message, "control"));
  snprintf(lab[1].key, sizeof(lab[1].key), "r\xffk");
  snprintf(lab[0].value, sizeof(lab[0].value), "a");
  assert_int_equal(lynx_reg_register(&f->r, "n1", "127.0.0.1:1", 1, lab, 2, acc,
                                     1, NULL, 0, &err),
                   -EINVAL);
  assert_non_null(strstr(err.message, "labels[1]"));
  assert_non_null(strstr(err.message, "UTF-8"));
  assert_null(f->r.nodes);

  snprintf(lab[1].key, sizeof(lab[1].key), "rack");
  snprintf(acc[0].kind, sizeof(acc[0].kind), "cu\x01");
  snprintf(acc[0].model, sizeof(acc[0].model), "GPU \xe2\x82\xac\xff\xfe");
  snprintf(acc[0].pci_bus_id, sizeof(acc[0].pci_bus_id), "0000:\n3b");
  assert_int_equal(lynx_reg_register(&f->r, "n1", "10.0.0.1:\x7f", 1, lab, 2,
                                     acc, 1, NULL, 0, &err),
                   0);
  n = lynx_reg_node_find(&f->r, "n1");
  assert_non_null(n);
  assert_string_equal(n->accels[0].info.kind, "cu ");
  assert_string_equal(n->accels[0].info.model, "GPU \xe2\x82\xac??");
  assert_string_equal(n->accels[0].info.pci_bus_id, "0000: 3b");
  assert_string_equal(n->address, "10.0.0.1: ");
  assert_string_equal(n->labels[0].value, "a");
}

/* An agent's last_error is free text from a device: cleaned when stored. */
static void test_health_last_error_cleaned(void **state) {
  struct fx *f = *state;
  struct lynx_reg_accel *a;
  char why[256];
  assert_int_equal(reg_node(&f->r, "n1", 1, 1, "", 0), 0);
  assert_int_equal(
      hb_health(&f->r, "n1", 10, 0, 0, 1, 0, 0, "Xid 79\x1b[2J \xc3"), 0);
  a = accel_of(&f->r, "n1", 0);
  assert_string_equal(a->last_error, "Xid 79 [2J ?");
  assert_true(lynx_text_ok(a->last_error, strlen(a->last_error)));
  lynx_reg_accel_health_str(a, why, sizeof(why));
  assert_true(lynx_text_ok(why, strlen(why)));
}

/* app and selectors are shown and matched: bad text is refused. */
static void test_service_text(void **state) {
  struct fx *f = *state;
  struct lynx_service_spec s;
  s = ut_spec("ok", 7000, 0, NULL);
  snprintf(s.app, sizeof(s.app), "ec\x01ho");
  expect_invalid(&f->r, &s, "app");
  snprintf(s.app, sizeof(s.app), "ech\xff");
  expect_invalid(&f->r, &s, "app");
  s = ut_spec("ok", 7000, 0, "zone=a");
  snprintf(s.selector[0].value, sizeof(s.selector[0].value), "a\x1b");
  expect_invalid(&f->r, &s, "placement.selector");
  s = ut_spec("ok", 7000, 0, "zone=a");
  snprintf(s.selector[0].key, sizeof(s.selector[0].key), "\xc0\xaf");
  expect_invalid(&f->r, &s, "placement.selector");
  assert_null(f->r.services);
  s = ut_spec("ok", 7000, 0, "zone=caf\xc3\xa9");
  snprintf(s.app, sizeof(s.app),
           "\xc3\xa9"
           "cho");
  assert_int_equal(lynx_reg_service_create(&f->r, &s, 0, NULL), 0);
}

/* --services-max and --region-max-mb (r->services_max, region_max_bytes). */
static void test_service_limits(void **state) {
  struct fx *f = *state;
  struct lynx_service_spec s;
  struct lynx_reg_err err;
  struct lynx_geom g;
  char num[32];
  uint64_t two_mq;

  /* the region is the ring layout's, back ends' client mqueues included */
  s = ut_spec("r", 7000, 0, NULL);
  assert_int_equal(lynx_geom_init(&g, 2, 256, 2048, 0), 0);
  assert_int_equal(lynx_service_region_bytes(&s), g.region_size);
  two_mq = g.region_size;
  s.n_backends = 1;
  snprintf(s.backends[0].name, sizeof(s.backends[0].name), "db");
  snprintf(s.backends[0].address, sizeof(s.backends[0].address),
           "127.0.0.1:11211");
  snprintf(s.backends[0].proto, sizeof(s.backends[0].proto), "len32");
  assert_int_equal(lynx_geom_init(&g, 3, 256, 2048, 0), 0);
  assert_int_equal(lynx_service_region_bytes(&s), g.region_size);
  s.slots = 3;
  assert_int_equal(lynx_service_region_bytes(&s), 0);

  /* a region up to the limit is fine; a back end more is over it */
  f->r.region_max_bytes = two_mq;
  s = ut_spec("r", 7000, 0, NULL);
  assert_int_equal(lynx_reg_service_create(&f->r, &s, 0, &err), 0);
  assert_int_equal(lynx_reg_service_delete(&f->r, "r", 0, &err), 0);
  s.n_backends = 1;
  snprintf(s.backends[0].name, sizeof(s.backends[0].name), "db");
  snprintf(s.backends[0].address, sizeof(s.backends[0].address),
           "127.0.0.1:11211");
  snprintf(s.backends[0].proto, sizeof(s.backends[0].proto), "len32");
  memset(&err, 0, sizeof(err));
  assert_int_equal(lynx_reg_service_create(&f->r, &s, 0, &err), -EFBIG);
  assert_int_equal(err.status, 422);
  assert_string_equal(err.code, "limit_exceeded");
  snprintf(num, sizeof(num), "%llu",
           (unsigned long long)lynx_service_region_bytes(&s));
  assert_non_null(strstr(err.message, num));
  assert_non_null(strstr(err.message, "--region-max-mb"));
  /* every field at its own bound: 128 TiB, refused under 1 GiB */
  f->r.region_max_bytes = 1024ull << 20;
  s = ut_spec("huge", 7000, 0, NULL);
  s.slot_size = LYNX_SLOT_MAX;
  s.slots = LYNX_SLOTS_MAX;
  s.mqueues_per_accel = LYNX_MQUEUES_MAX;
  assert_int_equal(lynx_reg_service_create(&f->r, &s, 0, &err), -EFBIG);
  assert_non_null(strstr(err.message, "1024 MiB"));
  assert_null(f->r.services);

  /* the number of services */
  f->r.services_max = 2;
  add_service(&f->r, "a", 7001, 0, NULL);
  add_service(&f->r, "b", 7002, 0, NULL);
  s = ut_spec("c", 7003, 0, NULL);
  memset(&err, 0, sizeof(err));
  assert_int_equal(lynx_reg_service_create(&f->r, &s, 0, &err), -ENOSPC);
  assert_int_equal(err.status, 409);
  assert_string_equal(err.code, "limit_exceeded");
  assert_non_null(strstr(err.message, "2"));
  assert_non_null(strstr(err.message, "--services-max"));
  assert_null(lynx_reg_service_find(&f->r, "c"));
  /* a duplicate is still told as a duplicate */
  s = ut_spec("a", 7009, 0, NULL);
  assert_int_equal(lynx_reg_service_create(&f->r, &s, 0, &err), -EEXIST);
  assert_int_equal(lynx_reg_service_delete(&f->r, "b", 0, &err), 0);
  s = ut_spec("c", 7003, 0, NULL);
  assert_int_equal(lynx_reg_service_create(&f->r, &s, 0, &err), 0);
}

/* ---- several active frontends (partition.c) -------------------------- */

/* Instances fe produces into (in its table), and the epochs they carry. */
static int fe_count(struct lynx_registry *r, const char *fe, uint64_t *lo,
                    uint64_t *hi) {
  struct lynx_reg_frontend *f = lynx_reg_frontend_find(r, fe);
  int n = 0;
  if (lo)
    *lo = UINT64_MAX;
  if (hi)
    *hi = 0;
  assert_non_null(f);
  for (struct lynx_reg_instance *i = r->instances; i; i = i->next) {
    if (!lynx_reg_fe_produces(f, i))
      continue;
    n++;
    if (lo && i->fe_epoch < *lo)
      *lo = i->fe_epoch;
    if (hi && i->fe_epoch > *hi)
      *hi = i->fe_epoch;
  }
  return n;
}

/* Every dispatchable instance has exactly one producer, or none at all. */
static void one_producer_each(struct lynx_registry *r, int all_owned) {
  for (struct lynx_reg_instance *i = r->instances; i; i = i->next) {
    int producers = 0;
    if (!lynx_reg_inst_dispatchable(i))
      continue;
    for (struct lynx_reg_frontend *f = r->frontends; f; f = f->next)
      producers += lynx_reg_fe_produces(f, i);
    assert_true(producers <= 1);
    if (all_owned)
      assert_int_equal(producers, 1);
  }
}

static void fe_up(struct lynx_registry *r, const char *id, uintptr_t conn,
                  uint64_t now) {
  assert_non_null(lynx_reg_frontend_connect(r, id, "x", (void *)conn, now));
  lynx_reg_frontend_set_active(r, id, 1);
}

/* 2 nodes of 2 accelerators, service "echo" on all four. */
static void four_instances(struct fx *f) {
  assert_int_equal(reg_node(&f->r, "n1", 1, 2, "", 0), 0);
  assert_int_equal(reg_node(&f->r, "n2", 1, 2, "", 0), 0);
  add_service(&f->r, "echo", 7000, 0, NULL);
  assert_int_equal(ready_all(&f->r, 0), 4);
}

static void test_partition_balance(void **state) {
  struct fx *f = *state;
  uint64_t lo1, hi1, lo2, hi2;
  four_instances(f);
  /* no active frontend: nobody produces, nothing is given */
  lynx_reg_partition(&f->r, 10);
  one_producer_each(&f->r, 0);
  assert_int_equal(f->r.fe_assigned, 0);

  fe_up(&f->r, "fe1", 2, 20);
  fe_up(&f->r, "fe2", 3, 20);
  /* a standby gets nothing */
  assert_non_null(lynx_reg_frontend_connect(&f->r, "fe3", "x", (void *)4, 20));
  lynx_reg_partition(&f->r, 20);
  one_producer_each(&f->r, 1);
  assert_int_equal(fe_count(&f->r, "fe1", &lo1, &hi1), 2);
  assert_int_equal(fe_count(&f->r, "fe2", &lo2, &hi2), 2);
  assert_int_equal(fe_count(&f->r, "fe3", NULL, NULL), 0);
  /* one epoch for the round, issued from the registry's counter */
  assert_true(lo1 > 0);
  assert_true(lo1 == hi1 && lo1 == lo2 && lo2 == hi2);
  assert_int_equal(f->r.frontend_epoch, lo1);
  assert_int_equal(f->r.fe_assigned, 4);
  /* stable: nothing moves on the next round */
  lynx_reg_partition(&f->r, 30);
  assert_int_equal(f->r.fe_assigned, 4);
  assert_int_equal(f->r.fe_moves, 0);
}

/* A frontend joins: instances move to it only once their owner answered
 * what it held on them; the owner's other instances keep their epoch. */
static void test_partition_join_waits_for_owner(void **state) {
  struct fx *f = *state;
  struct lynx_fe_mq_report mq[4];
  uint64_t e1, lo, hi;
  uint32_t nmq = 0;
  four_instances(f);
  fe_up(&f->r, "fe1", 2, 10);
  lynx_reg_partition(&f->r, 10);
  assert_int_equal(fe_count(&f->r, "fe1", &e1, &hi), 4);
  assert_int_equal(e1, hi);

  fe_up(&f->r, "fe2", 3, 100);
  lynx_reg_partition(&f->r, 100);
  /* two released by fe1, none given yet: no mqueue has two producers */
  assert_int_equal(fe_count(&f->r, "fe1", NULL, NULL), 2);
  assert_int_equal(fe_count(&f->r, "fe2", NULL, NULL), 0);
  one_producer_each(&f->r, 0);
  assert_true(lynx_reg_fe_serves(&f->r, lynx_reg_frontend_find(&f->r, "fe1"),
                                 f->r.services));
  /* fe1 still runs the older table, then has requests on a released one */
  lynx_reg_frontend_status(&f->r, "fe1", f->r.table_version - 1, NULL, 0, 200);
  lynx_reg_tick(&f->r, 200);
  assert_int_equal(fe_count(&f->r, "fe2", NULL, NULL), 0);
  memset(mq, 0, sizeof(mq));
  for (struct lynx_reg_instance *i = f->r.instances; i; i = i->next) {
    mq[nmq].instance_id = i->id;
    mq[nmq++].outstanding = i->fe_release_version ? 5 : 9;
  }
  lynx_reg_frontend_status(&f->r, "fe1", f->r.table_version, mq, nmq, 300);
  lynx_reg_tick(&f->r, 300);
  assert_int_equal(fe_count(&f->r, "fe2", NULL, NULL), 0);
  assert_int_equal(f->r.fe_moves, 0);
  /* answered: they go to fe2 with a newer epoch; fe1 keeps its two as they
   * were (its connections to them stay) */
  for (uint32_t k = 0; k < nmq; k++)
    for (struct lynx_reg_instance *i = f->r.instances; i; i = i->next)
      if (i->id == mq[k].instance_id && i->fe_release_version)
        mq[k].outstanding = 0;
  lynx_reg_frontend_status(&f->r, "fe1", f->r.table_version, mq, nmq, 400);
  lynx_reg_tick(&f->r, 400);
  assert_int_equal(f->r.fe_moves, 2);
  assert_int_equal(fe_count(&f->r, "fe1", &lo, &hi), 2);
  assert_int_equal(lo, e1);
  assert_int_equal(hi, e1);
  assert_int_equal(fe_count(&f->r, "fe2", &lo, &hi), 2);
  assert_true(lo > e1 && lo == hi);
  one_producer_each(&f->r, 1);
}

/* A releasing owner that never reports quiet loses the instance at the
 * drain timeout (the next owner's epoch fences what is left). */
static void test_partition_release_deadline(void **state) {
  struct fx *f = *state;
  f->r.drain_timeout_ms = 2000; /* within the nodes' lease */
  four_instances(f);
  fe_up(&f->r, "fe1", 2, 10);
  lynx_reg_partition(&f->r, 10);
  fe_up(&f->r, "fe2", 3, 20);
  lynx_reg_partition(&f->r, 20);
  lynx_reg_tick(&f->r, 20 + 2000 - 1);
  assert_int_equal(fe_count(&f->r, "fe2", NULL, NULL), 0);
  lynx_reg_tick(&f->r, 20 + 2000);
  assert_int_equal(fe_count(&f->r, "fe2", NULL, NULL), 2);
  one_producer_each(&f->r, 1);
}

/* A frontend fails: its instances go to the others at once with a newer
 * epoch; a survivor's own instances keep theirs. */
static void test_partition_failover(void **state) {
  struct fx *f = *state;
  uint64_t e0, lo, hi;
  four_instances(f);
  fe_up(&f->r, "fe1", 2, 10);
  fe_up(&f->r, "fe2", 3, 10);
  lynx_reg_partition(&f->r, 10);
  assert_int_equal(fe_count(&f->r, "fe1", &e0, NULL), 2);
  lynx_reg_frontend_disconnected(&f->r, (void *)3);
  lynx_reg_tick(&f->r, 20);
  assert_int_equal(fe_count(&f->r, "fe1", &lo, &hi), 4);
  assert_int_equal(lo, e0);
  assert_true(hi > e0);
  one_producer_each(&f->r, 1);
  /* fe2 returns as a new process: it gets half back, once fe1 let go */
  fe_up(&f->r, "fe2", 5, 30);
  lynx_reg_partition(&f->r, 30);
  assert_int_equal(fe_count(&f->r, "fe1", NULL, NULL), 2);
  lynx_reg_frontend_status(&f->r, "fe1", f->r.table_version, NULL, 0, 40);
  lynx_reg_tick(&f->r, 40);
  assert_int_equal(fe_count(&f->r, "fe2", &lo, NULL), 2);
  assert_true(lo > hi);
  one_producer_each(&f->r, 1);
}

/* After a restart (or an election) nobody produces: the frontends' claims
 * give each instance back to the one with the newest epoch for it; an
 * epoch the store never issued is not taken. */
static void test_partition_claims(void **state) {
  struct fx *f = *state;
  struct lynx_reg_instance *a, *b, *c;
  struct lynx_fe_claim c1[2], c2[2];
  four_instances(f);
  f->r.frontend_epoch = f->r.epoch_last = 10; /* as the store says */
  /* as adopted from the agents after a restart: they may have had
   * producers, so none is fresh */
  for (struct lynx_reg_instance *i = f->r.instances; i; i = i->next)
    i->fe_fresh = 0;
  a = f->r.instances;
  b = a->next;
  c = b->next;
  assert_non_null(lynx_reg_frontend_connect(&f->r, "fe1", "x", (void *)2, 0));
  assert_non_null(lynx_reg_frontend_connect(&f->r, "fe2", "y", (void *)3, 0));
  c1[0] = (struct lynx_fe_claim){a->id, 7};
  c1[1] = (struct lynx_fe_claim){b->id, 7};
  c2[0] = (struct lynx_fe_claim){b->id, 9};
  c2[1] = (struct lynx_fe_claim){c->id, 11};
  assert_int_equal(lynx_reg_frontend_claims(&f->r, "fe1", c1, 2), 0);
  assert_int_equal(lynx_reg_frontend_claims(&f->r, "fe2", c2, 2), 0);
  lynx_reg_frontend_set_active(&f->r, "fe1", 1);
  lynx_reg_frontend_set_active(&f->r, "fe2", 1);
  lynx_reg_partition(&f->r, 10);
  assert_string_equal(a->fe_owner, "fe1");
  assert_int_equal(a->fe_epoch, 7);
  assert_string_equal(b->fe_owner, "fe2");
  assert_int_equal(b->fe_epoch, 9);
  /* c's claimed 11 is beyond what was issued: given anew, with 11 or more */
  assert_true(c->fe_owner[0]);
  assert_true(c->fe_epoch > 10);
  one_producer_each(&f->r, 1);
  /* claims serve once: after its table, fe1's old claim adopts nothing */
  lynx_reg_frontend_claims_done(&f->r, "fe1");
  assert_int_equal(lynx_reg_frontend_find(&f->r, "fe1")->n_claims, 0);
}

/* A claim older than what an instance was given since is stale: fe1,
 * fenced out by fe2 and back with its old claims, gets the instances again
 * when fe2 goes, with an epoch newer than fe2's, not the one it claims
 * (which the regions refuse). */
static void test_partition_stale_claim(void **state) {
  struct fx *f = *state;
  struct lynx_fe_claim c1[4];
  uint64_t e1, e2, lo;
  int n = 0;
  four_instances(f);
  fe_up(&f->r, "fe1", 2, 10);
  lynx_reg_partition(&f->r, 10);
  assert_int_equal(fe_count(&f->r, "fe1", NULL, &e1), 4);
  for (struct lynx_reg_instance *i = f->r.instances; i; i = i->next)
    c1[n++] = (struct lynx_fe_claim){i->id, i->fe_epoch};
  /* fe1 goes silent; fe2 takes everything over */
  lynx_reg_frontend_disconnected(&f->r, (void *)2);
  fe_up(&f->r, "fe2", 3, 20);
  lynx_reg_partition(&f->r, 20);
  assert_int_equal(fe_count(&f->r, "fe2", &lo, &e2), 4);
  assert_true(lo > e1);
  /* fe1 returns, a standby, claiming what it produced into before */
  assert_non_null(lynx_reg_frontend_connect(&f->r, "fe1", "x", (void *)4, 30));
  assert_int_equal(lynx_reg_frontend_claims(&f->r, "fe1", c1, 4), 0);
  lynx_reg_partition(&f->r, 30);
  assert_int_equal(fe_count(&f->r, "fe2", NULL, NULL), 4);
  /* fe2 dies, fe1 is made active: it gets them with a newer epoch */
  lynx_reg_frontend_disconnected(&f->r, (void *)3);
  lynx_reg_frontend_set_active(&f->r, "fe1", 1);
  lynx_reg_partition(&f->r, 40);
  assert_int_equal(fe_count(&f->r, "fe1", &lo, NULL), 4);
  assert_true(lo > e2);
  one_producer_each(&f->r, 1);
}

static int failing_epoch(void *data, uint64_t *epoch) {
  (void)data;
  *epoch = 0;
  return -EIO;
}

/* The store cannot issue an epoch: nothing is given (a frontend without
 * a fencing epoch must not produce); tried again a second later. */
static void test_partition_no_epoch(void **state) {
  struct fx *f = *state;
  uint64_t e, lo, hi;
  four_instances(f);
  f->r.ops.issue_epoch = failing_epoch;
  fe_up(&f->r, "fe1", 2, 100);
  lynx_reg_partition(&f->r, 100);
  assert_int_equal(fe_count(&f->r, "fe1", NULL, NULL), 0);
  f->r.ops.issue_epoch = NULL;
  lynx_reg_partition(&f->r, 600);
  assert_int_equal(fe_count(&f->r, "fe1", NULL, NULL), 0);
  lynx_reg_partition(&f->r, 1100);
  assert_int_equal(fe_count(&f->r, "fe1", &e, NULL), 4);
  /* the store fails again: a new node's new instances (regions nobody
   * produced into) still go to fe1, with the epoch it has */
  f->r.ops.issue_epoch = failing_epoch;
  assert_int_equal(reg_node(&f->r, "n3", 1, 2, "", 1200), 0);
  assert_int_equal(ready_all(&f->r, 1200), 2);
  lynx_reg_partition(&f->r, 1200);
  assert_int_equal(fe_count(&f->r, "fe1", &lo, &hi), 6);
  assert_int_equal(lo, e);
  assert_int_equal(hi, e);
  /* but a moved one (not fresh) waits for an epoch */
  fe_up(&f->r, "fe2", 3, 1300);
  lynx_reg_frontend_status(&f->r, "fe1", f->r.table_version + 1, NULL, 0, 1300);
  lynx_reg_partition(&f->r, 1300);
  lynx_reg_tick(&f->r, 1400);
  assert_int_equal(fe_count(&f->r, "fe2", NULL, NULL), 0);
  f->r.ops.issue_epoch = NULL;
  lynx_reg_tick(&f->r, 2500);
  assert_int_equal(fe_count(&f->r, "fe2", &lo, NULL), 3);
  assert_true(lo > e);
}

/* A service with fewer instances than active frontends is served by its
 * instances' owners only; one with none keeps every port open. */
static void test_partition_serves(void **state) {
  struct fx *f = *state;
  struct lynx_reg_frontend *f1, *f2;
  struct lynx_reg_service *one, *none;
  assert_int_equal(reg_node(&f->r, "n1", 1, 1, "", 0), 0);
  add_service(&f->r, "one", 7000, 0, NULL);
  add_service(&f->r, "none", 7001, 0, "gpu=h100");
  ready_all(&f->r, 0);
  fe_up(&f->r, "fe1", 2, 10);
  fe_up(&f->r, "fe2", 3, 10);
  lynx_reg_partition(&f->r, 10);
  f1 = lynx_reg_frontend_find(&f->r, "fe1");
  f2 = lynx_reg_frontend_find(&f->r, "fe2");
  one = lynx_reg_service_find(&f->r, "one");
  none = lynx_reg_service_find(&f->r, "none");
  assert_non_null(one);
  assert_non_null(none);
  assert_int_equal(lynx_reg_fe_serves(&f->r, f1, one) +
                       lynx_reg_fe_serves(&f->r, f2, one),
                   1);
  assert_true(lynx_reg_fe_serves(&f->r, f1, none));
  assert_true(lynx_reg_fe_serves(&f->r, f2, none));
}

/* A drained frontend lets go of everything (each instance once answered);
 * alone, it keeps what it has. */
static void test_partition_frontend_drain(void **state) {
  struct fx *f = *state;
  struct lynx_reg_err err;
  four_instances(f);
  fe_up(&f->r, "fe1", 2, 10);
  assert_int_equal(lynx_reg_frontend_drain(&f->r, "fe9", 1, &err), -ENOENT);
  assert_int_equal(err.status, 404);
  assert_int_equal(lynx_reg_frontend_drain(&f->r, "fe1", 1, &err), 0);
  lynx_reg_partition(&f->r, 10);
  /* nobody else: it keeps serving (and nothing is given to it meanwhile) */
  assert_int_equal(fe_count(&f->r, "fe1", NULL, NULL), 0);
  assert_int_equal(lynx_reg_frontend_drain(&f->r, "fe1", 0, &err), 0);
  lynx_reg_partition(&f->r, 20);
  assert_int_equal(fe_count(&f->r, "fe1", NULL, NULL), 4);
  assert_int_equal(lynx_reg_frontend_drain(&f->r, "fe1", 1, &err), 0);
  lynx_reg_partition(&f->r, 30);
  assert_int_equal(fe_count(&f->r, "fe1", NULL, NULL), 4);

  fe_up(&f->r, "fe2", 3, 40);
  lynx_reg_partition(&f->r, 40);
  assert_int_equal(fe_count(&f->r, "fe1", NULL, NULL), 0); /* all released */
  assert_int_equal(fe_count(&f->r, "fe2", NULL, NULL), 0);
  one_producer_each(&f->r, 0);
  lynx_reg_frontend_status(&f->r, "fe1", f->r.table_version, NULL, 0, 50);
  lynx_reg_tick(&f->r, 50);
  assert_int_equal(fe_count(&f->r, "fe2", NULL, NULL), 4);
  assert_int_equal(f->r.fe_moves, 4);
  one_producer_each(&f->r, 1);
  /* undrained: it takes its share again */
  assert_int_equal(lynx_reg_frontend_drain(&f->r, "fe1", 0, &err), 0);
  lynx_reg_partition(&f->r, 60);
  lynx_reg_frontend_status(&f->r, "fe2", f->r.table_version, NULL, 0, 70);
  lynx_reg_tick(&f->r, 70);
  assert_int_equal(fe_count(&f->r, "fe1", NULL, NULL), 2);
  assert_int_equal(fe_count(&f->r, "fe2", NULL, NULL), 2);
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, fx_setup, fx_teardown)

/* The events ring (events.h): seqs from 1, the last LYNX_EV_MAX kept,
 * oldest and get agree once it laps, messages cut to fit. */
static void test_events_ring(void **state) {
  struct lynx_events e;
  char longer[400];
  (void)state;
  memset(&e, 0, sizeof(e));
  assert_int_equal(lynx_ev_oldest(&e), 1);
  assert_null(lynx_ev_get(&e, 1));
  for (unsigned i = 0; i < LYNX_EV_MAX + 76; i++)
    lynx_ev_add(&e, LYNX_EV_NODE_DOWN, "n", "event %u", i + 1);
  assert_int_equal(e.next_seq, LYNX_EV_MAX + 77);
  assert_int_equal(lynx_ev_oldest(&e), 77);
  assert_null(lynx_ev_get(&e, 76));
  assert_string_equal(lynx_ev_get(&e, 77)->message, "event 77");
  assert_string_equal(lynx_ev_get(&e, LYNX_EV_MAX + 76)->message, "event 1100");
  assert_null(lynx_ev_get(&e, LYNX_EV_MAX + 77));
  assert_true(lynx_ev_get(&e, 500)->time_ms > 1700000000000ull); /* Unix ms */
  memset(longer, 'x', sizeof(longer) - 1);
  longer[sizeof(longer) - 1] = 0;
  lynx_ev_add(&e, LYNX_EV_ACCEL_OUT, longer, "%s", longer);
  assert_int_equal(strlen(lynx_ev_get(&e, LYNX_EV_MAX + 77)->message),
                   sizeof(e.ring[0].message) - 1);
  assert_int_equal(strlen(lynx_ev_get(&e, LYNX_EV_MAX + 77)->subject),
                   sizeof(e.ring[0].subject) - 1);
  assert_string_equal(lynx_ev_kind_name(LYNX_EV_ACCEL_OUT), "accel_out");
  assert_string_equal(lynx_ev_kind_name(LYNX_EV_KINDS), "unknown");
  lynx_ev_free(&e);
  assert_null(e.ring);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_labels_and_names),
      T(test_register_validation),
      T(test_reconnect_settles_starting),
      T(test_drain_state_machine),
      T(test_undrain_while_draining),
      T(test_drain_waits_for_frontend),
      T(test_drain_deadline),
      T(test_drain_without_frontend),
      T(test_leave_drain),
      T(test_drain_waits_for_settle),
      T(test_drain_errors),
      T(test_lease_expiry),
      T(test_suspect),
      T(test_pause_credit),
      T(test_apps_and_state),
      T(test_app_backend_needed),
      T(test_heartbeat_counters),
      T(test_leave_and_forget),
      T(test_nodes_release),
      T(test_epochs),
      T(test_reconnect_drops_missing_accel),
      T(test_place_all),
      T(test_place_selector),
      T(test_place_gpu_blocks),
      T(test_replicas_spread_and_replace),
      T(test_replicas_follow_capacity),
      T(test_replica_move_deadline),
      T(test_replicas_during_drain),
      T(test_instance_failed_retries_after_backoff),
      T(test_service_validation),
      T(test_service_conflicts_and_delete),
      T(test_table_order),
      T(test_drain_intent_before_register),
      T(test_restart_while_draining),
      T(test_connections),
      T(test_versions_grow),
      T(test_health_stall_out_and_back),
      T(test_health_lost_failed_and_placement),
      T(test_health_epochs),
      T(test_health_and_drain),
      cmocka_unit_test(test_text),
      cmocka_unit_test(test_events_ring),
      T(test_register_text),
      T(test_health_last_error_cleaned),
      T(test_service_text),
      T(test_service_limits),
      T(test_partition_balance),
      T(test_partition_join_waits_for_owner),
      T(test_partition_release_deadline),
      T(test_partition_failover),
      T(test_partition_stale_claim),
      T(test_partition_claims),
      T(test_partition_no_epoch),
      T(test_partition_serves),
      T(test_partition_frontend_drain),
  };
  return LYNX_UT_MAIN(argc, argv, "tests", tests, NULL, NULL);
}
