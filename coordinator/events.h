/*
 * events.h - the coordinator's recent events, for operators: joins, lease
 * expiries, drains, accelerators going out of dispatch and back, frontend
 * failovers, services created and deleted, leadership. Served as
 * GET /v1/events (docs/api.md) and shown live by the web console (/ui/).
 *
 * A ring of the last LYNX_EV_MAX events, in memory only: a restarted or
 * newly elected coordinator starts empty (the store keeps state, not
 * history; the logs keep everything). Sequence numbers start at 1 and grow
 * by one per event, so a client that asks since its last seq + 1 misses
 * nothing unless the ring lapped it (the answer's oldest seq says so).
 * Written and read under the registry's lock, like the registry.
 */
#ifndef LYNX_EVENTS_H
#define LYNX_EVENTS_H

#include <stdint.h>

#include "wire.h"

#define LYNX_EV_MAX 1024u

enum lynx_ev_kind {
  LYNX_EV_NODE_REGISTERED,
  LYNX_EV_NODE_DOWN,
  LYNX_EV_NODE_SUSPECT,
  LYNX_EV_NODE_HEARD,
  LYNX_EV_NODE_LEFT,
  LYNX_EV_NODE_DRAINING,
  LYNX_EV_NODE_DRAINED,
  LYNX_EV_NODE_UNDRAINED,
  LYNX_EV_NODE_FORGOTTEN,
  LYNX_EV_ACCEL_OUT,
  LYNX_EV_ACCEL_BACK,
  LYNX_EV_FRONTEND_CONNECTED,
  LYNX_EV_FRONTEND_GONE,
  LYNX_EV_FRONTEND_ACTIVE,
  LYNX_EV_FRONTEND_STANDBY,
  LYNX_EV_FRONTEND_DRAINING,
  LYNX_EV_FRONTEND_UNDRAINED,
  LYNX_EV_SERVICE_CREATED,
  LYNX_EV_SERVICE_DELETED,
  LYNX_EV_LEADER,
  LYNX_EV_KINDS
};

struct lynx_event {
  uint64_t seq;
  uint64_t time_ms; /* Unix time (the wall clock: for people) */
  enum lynx_ev_kind kind;
  char subject[LYNX_ID_MAX + 16]; /* node, "node/accel", frontend, service */
  char message[200];
};

struct lynx_events {
  struct lynx_event *ring; /* LYNX_EV_MAX entries, allocated at the first */
  uint64_t next_seq;       /* the seq the next event gets (from 1) */
  uint64_t lost;           /* events not kept for want of memory */
};

/* "node_registered", ... (the API's names). */
const char *lynx_ev_kind_name(enum lynx_ev_kind k);

/* Records an event now; the message is printf-formatted and cut to fit. */
void lynx_ev_add(struct lynx_events *e, enum lynx_ev_kind kind,
                 const char *subject, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The oldest seq still kept (next_seq when none). */
uint64_t lynx_ev_oldest(const struct lynx_events *e);

/* The event of seq (NULL when not kept). */
const struct lynx_event *lynx_ev_get(const struct lynx_events *e, uint64_t seq);

void lynx_ev_free(struct lynx_events *e);

#endif
