/*
 * rdma_cm.c - the pure parts of the rdma transport's connection set-up: the
 * frontend's connection state machine and the private data both sides
 * exchange through rdma_cm; and the few verbs calls both sides share
 * below the rest of the transport (counting the devices, moving a QP to
 * ERR).
 *
 * The state machine is one function of (state, event, status) so the
 * connect loop in transport_rdma.c and the unit test drive exactly the same
 * transitions; the loop only performs the action it returns. A connection
 * being set up fails on any event it did not ask for; one that is up drops
 * on any event at all (rdma_cm reports nothing harmless on a connected id),
 * and the frontend reconnects with backoff.
 */
#include <errno.h>
#include <string.h>

#include "rdma_internal.h"

/* ---- little-endian fields ------------------------------------------- */

static void put16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v) {
  put16(p, (uint16_t)v);
  put16(p + 2, (uint16_t)(v >> 16));
}

static void put64(uint8_t *p, uint64_t v) {
  put32(p, (uint32_t)v);
  put32(p + 4, (uint32_t)(v >> 32));
}

static uint16_t get16(const uint8_t *p) {
  return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t get32(const uint8_t *p) {
  return get16(p) | ((uint32_t)get16(p + 2) << 16);
}

static uint64_t get64(const uint8_t *p) {
  return get32(p) | ((uint64_t)get32(p + 4) << 32);
}

/* ---- private data ----------------------------------------------------- */

void lynx__rdma_pd_encode(uint8_t *out, uint64_t key, uint64_t epoch,
                          uint64_t producer) {
  put32(out, LYNX_RDMA_PD_MAGIC);
  put16(out + 4, LYNX_RDMA_PD_VERSION);
  put16(out + 6, 0);
  put64(out + 8, key);
  put64(out + 16, epoch);
  put64(out + 24, producer);
}

int lynx__rdma_pd_decode(const void *buf, size_t len, uint64_t *key,
                         uint64_t *epoch, uint64_t *producer) {
  const uint8_t *p = buf;
  if (!p || len < LYNX_RDMA_PD_LEN || get32(p) != LYNX_RDMA_PD_MAGIC ||
      get16(p + 4) != LYNX_RDMA_PD_VERSION)
    return -EPROTO;
  *key = get64(p + 8);
  *epoch = get64(p + 16);
  *producer = get64(p + 24);
  return 0;
}

int lynx__rdma_pd_admit(const void *buf, size_t len, uint64_t key,
                        uint64_t epoch) {
  uint64_t k, e, producer;
  if (lynx__rdma_pd_decode(buf, len, &k, &e, &producer))
    return -EPROTO;
  /* one 64-bit comparison, not memcmp: a frontend cannot learn the key
   * byte by byte from timing */
  if ((k ^ key) != 0)
    return -EACCES;
  return e == epoch ? 0 : -ESTALE;
}

void lynx__rdma_rej_encode(uint8_t *out, enum lynx__rdma_reject why) {
  put32(out, LYNX_RDMA_PD_MAGIC);
  put32(out + 4, (uint32_t)why);
}

enum lynx__rdma_reject lynx__rdma_rej_decode(const void *buf, size_t len) {
  const uint8_t *p = buf;
  uint32_t why;
  if (!p || len < LYNX_RDMA_REJ_LEN || get32(p) != LYNX_RDMA_PD_MAGIC)
    return LYNX_RDMA_REJ_NONE;
  why = get32(p + 4);
  return why < LYNX_RDMA_REJ_COUNT ? (enum lynx__rdma_reject)why
                                   : LYNX_RDMA_REJ_NONE;
}

const char *lynx__rdma_rej_str(enum lynx__rdma_reject why) {
  static const char *const s[LYNX_RDMA_REJ_COUNT] = {
      [LYNX_RDMA_REJ_NONE] = "no reason given (nobody listening, or not a "
                             "Lynx agent)",
      [LYNX_RDMA_REJ_FORMAT] = "private data malformed",
      [LYNX_RDMA_REJ_KEY] = "unknown region key",
      [LYNX_RDMA_REJ_EPOCH] = "stale epoch (the agent restarted)",
      [LYNX_RDMA_REJ_DEVICE] = "request arrived on another RDMA device than "
                               "the region's",
      [LYNX_RDMA_REJ_RESOURCE] = "agent out of QP resources",
      [LYNX_RDMA_REJ_FENCED] = "fenced: a newer frontend epoch took this "
                               "region over",
  };
  return (unsigned)why < LYNX_RDMA_REJ_COUNT ? s[why] : s[0];
}

int lynx__rdma_rej_errno(enum lynx__rdma_reject why, int dflt) {
  return why == LYNX_RDMA_REJ_FENCED ? -ESTALE : dflt;
}

/* ---- devices ---------------------------------------------------------- */

int lynx__rdma_device_count(void) {
  int n = 0;
  struct ibv_device **l = ibv_get_device_list(&n);
  if (!l)
    return 0;
  ibv_free_device_list(l);
  return n;
}

/* ---- fencing ---------------------------------------------------------- */

int (*lynx__rdma_modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr,
                            int attr_mask) = ibv_modify_qp;

int lynx__rdma_qp_err(struct ibv_qp *qp) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_ERR;
  return -lynx__rdma_modify_qp(qp, &a, IBV_QP_STATE); /* it returns errno */
}

/* ---- state machine ---------------------------------------------------- */

const char *lynx__rdma_cm_state_str(enum lynx__rdma_cm_state s) {
  static const char *const n[LYNX_RCM_STATE_COUNT] = {
      "IDLE",        "ADDR_RESOLVING", "ROUTE_RESOLVING", "CONNECTING",
      "ESTABLISHED", "DISCONNECTED",   "FAILED",
  };
  return (unsigned)s < LYNX_RCM_STATE_COUNT ? n[s] : "?";
}

/* An event's status as an errno when it is one, else dflt (REJECTED's
 * status is an IB CM reason code, not an errno). */
static int err_of(int status, int dflt) {
  return status < 0 && status > -4096 ? status : dflt;
}

static struct lynx__rdma_cm_step go(enum lynx__rdma_cm_state next,
                                    enum lynx__rdma_cm_action act, int err) {
  struct lynx__rdma_cm_step st = {next, act, err};
  return st;
}

static struct lynx__rdma_cm_step fail(int err) {
  return go(LYNX_RCM_FAILED, LYNX_RCM_ACT_TEARDOWN, err);
}

static struct lynx__rdma_cm_step on_addr(enum rdma_cm_event_type ev,
                                         int status) {
  if (ev == RDMA_CM_EVENT_ADDR_RESOLVED && status == 0)
    return go(LYNX_RCM_ROUTE_RESOLVING, LYNX_RCM_ACT_RESOLVE_ROUTE, 0);
  if (ev == RDMA_CM_EVENT_ADDR_RESOLVED || ev == RDMA_CM_EVENT_ADDR_ERROR)
    return fail(err_of(status, -EHOSTUNREACH));
  return fail(ev == RDMA_CM_EVENT_DEVICE_REMOVAL ? -ENODEV : -EPROTO);
}

static struct lynx__rdma_cm_step on_route(enum rdma_cm_event_type ev,
                                          int status) {
  if (ev == RDMA_CM_EVENT_ROUTE_RESOLVED && status == 0)
    return go(LYNX_RCM_CONNECTING, LYNX_RCM_ACT_CONNECT, 0);
  if (ev == RDMA_CM_EVENT_ROUTE_RESOLVED || ev == RDMA_CM_EVENT_ROUTE_ERROR)
    return fail(err_of(status, -ENETUNREACH));
  return fail(ev == RDMA_CM_EVENT_DEVICE_REMOVAL ? -ENODEV : -EPROTO);
}

static struct lynx__rdma_cm_step on_connecting(enum rdma_cm_event_type ev,
                                               int status) {
  switch (ev) {
  case RDMA_CM_EVENT_ESTABLISHED:
    if (status == 0)
      return go(LYNX_RCM_ESTABLISHED, LYNX_RCM_ACT_READY, 0);
    return fail(err_of(status, -ECONNREFUSED));
  case RDMA_CM_EVENT_REJECTED:
    return fail(-ECONNREFUSED);
  case RDMA_CM_EVENT_UNREACHABLE:
    return fail(err_of(status, -EHOSTUNREACH));
  case RDMA_CM_EVENT_CONNECT_ERROR:
    return fail(err_of(status, -ECONNREFUSED));
  case RDMA_CM_EVENT_DISCONNECTED:
    return fail(-ECONNRESET);
  case RDMA_CM_EVENT_DEVICE_REMOVAL:
    return fail(-ENODEV);
  default: /* CONNECT_RESPONSE too: the QP lives on the id, rdma_cm
            * completes the handshake itself */
    return fail(-EPROTO);
  }
}

static struct lynx__rdma_cm_step on_established(enum rdma_cm_event_type ev) {
  switch (ev) {
  case RDMA_CM_EVENT_DISCONNECTED:
  case RDMA_CM_EVENT_TIMEWAIT_EXIT:
  case RDMA_CM_EVENT_DEVICE_REMOVAL:
  case RDMA_CM_EVENT_ADDR_CHANGE:
    return go(LYNX_RCM_DISCONNECTED, LYNX_RCM_ACT_TEARDOWN, -ECONNRESET);
  default:
    return go(LYNX_RCM_DISCONNECTED, LYNX_RCM_ACT_TEARDOWN, -EPROTO);
  }
}

struct lynx__rdma_cm_step lynx__rdma_cm_next(enum lynx__rdma_cm_state s,
                                             enum rdma_cm_event_type ev,
                                             int status) {
  switch (s) {
  case LYNX_RCM_ADDR_RESOLVING:
    return on_addr(ev, status);
  case LYNX_RCM_ROUTE_RESOLVING:
    return on_route(ev, status);
  case LYNX_RCM_CONNECTING:
    return on_connecting(ev, status);
  case LYNX_RCM_ESTABLISHED:
    return on_established(ev);
  case LYNX_RCM_DISCONNECTED:
    return go(LYNX_RCM_DISCONNECTED, LYNX_RCM_ACT_NONE, 0);
  case LYNX_RCM_FAILED:
    return go(LYNX_RCM_FAILED, LYNX_RCM_ACT_NONE, 0);
  case LYNX_RCM_IDLE: /* nothing was asked: any event is out of order */
  default:
    return fail(-EPROTO);
  }
}
