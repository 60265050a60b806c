/*
 * events.c - the coordinator's recent events (events.h).
 */
#include "events.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const kind_names[LYNX_EV_KINDS] = {
    [LYNX_EV_NODE_REGISTERED] = "node_registered",
    [LYNX_EV_NODE_DOWN] = "node_down",
    [LYNX_EV_NODE_SUSPECT] = "node_suspect",
    [LYNX_EV_NODE_HEARD] = "node_heard",
    [LYNX_EV_NODE_LEFT] = "node_left",
    [LYNX_EV_NODE_DRAINING] = "node_draining",
    [LYNX_EV_NODE_DRAINED] = "node_drained",
    [LYNX_EV_NODE_UNDRAINED] = "node_undrained",
    [LYNX_EV_NODE_FORGOTTEN] = "node_forgotten",
    [LYNX_EV_ACCEL_OUT] = "accel_out",
    [LYNX_EV_ACCEL_BACK] = "accel_back",
    [LYNX_EV_FRONTEND_CONNECTED] = "frontend_connected",
    [LYNX_EV_FRONTEND_GONE] = "frontend_gone",
    [LYNX_EV_FRONTEND_ACTIVE] = "frontend_active",
    [LYNX_EV_FRONTEND_STANDBY] = "frontend_standby",
    [LYNX_EV_FRONTEND_DRAINING] = "frontend_draining",
    [LYNX_EV_FRONTEND_UNDRAINED] = "frontend_undrained",
    [LYNX_EV_SERVICE_CREATED] = "service_created",
    [LYNX_EV_SERVICE_DELETED] = "service_deleted",
    [LYNX_EV_LEADER] = "leader",
};

const char *lynx_ev_kind_name(enum lynx_ev_kind k) {
  return (unsigned)k < LYNX_EV_KINDS ? kind_names[k] : "unknown";
}

void lynx_ev_add(struct lynx_events *e, enum lynx_ev_kind kind,
                 const char *subject, const char *fmt, ...) {
  struct lynx_event *ev;
  struct timespec ts;
  va_list ap;
  if (!e->next_seq)
    e->next_seq = 1;
  if (!e->ring && !(e->ring = calloc(LYNX_EV_MAX, sizeof(*e->ring)))) {
    e->lost++; /* the seq is spent all the same: clients see the gap */
    e->next_seq++;
    return;
  }
  ev = &e->ring[e->next_seq % LYNX_EV_MAX];
  clock_gettime(CLOCK_REALTIME, &ts);
  ev->seq = e->next_seq++;
  ev->time_ms = (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
  ev->kind = kind;
  snprintf(ev->subject, sizeof(ev->subject), "%s", subject ? subject : "");
  va_start(ap, fmt);
  vsnprintf(ev->message, sizeof(ev->message), fmt, ap);
  va_end(ap);
}

uint64_t lynx_ev_oldest(const struct lynx_events *e) {
  uint64_t next = e->next_seq ? e->next_seq : 1;
  if (!e->ring)
    return next;
  return next > LYNX_EV_MAX + 1 ? next - LYNX_EV_MAX : 1;
}

const struct lynx_event *lynx_ev_get(const struct lynx_events *e,
                                     uint64_t seq) {
  const struct lynx_event *ev;
  if (!e->ring || seq < lynx_ev_oldest(e) || seq >= e->next_seq)
    return NULL;
  ev = &e->ring[seq % LYNX_EV_MAX];
  return ev->seq == seq ? ev : NULL; /* a seq lost for want of memory */
}

void lynx_ev_free(struct lynx_events *e) {
  free(e->ring);
  memset(e, 0, sizeof(*e));
}
