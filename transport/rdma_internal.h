/*
 * rdma_internal.h - internals of the "rdma" transport shared by its files
 * (rdma_cm.c, rdma_dp.c, rdma_agent.c, transport_rdma.c) and by its unit
 * test. Not a public header: everything here is lynx__ (docs/rdma.md).
 *
 * Three pieces are pure so the test can drive them without a device:
 *  - the connection manager's state machine (lynx__rdma_cm_next), which the
 *    real frontend connect loop feeds with rdma_cm events;
 *  - the connect private data {magic "LXR1", version, key, epoch,
 *    producer} and the agent's reject reasons;
 *  - the data path (writev/read/flush/poll/notify), which only ever calls
 *    ibv_post_send and ibv_poll_cq (static inlines that go through
 *    qp->context->ops), so a fake ibv_context can stand in for the NIC.
 *    lynx__rdma_attach builds a connection over a caller's QP, CQ and
 *    registered buffer: connect uses it after the real set-up, the test with
 *    fakes.
 */
#ifndef LYNX_RDMA_INTERNAL_H
#define LYNX_RDMA_INTERNAL_H

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <stddef.h>
#include <stdint.h>

#include "mqueue.h"
#include "transport.h"

/* ---- connect private data ------------------------------------------- */

#define LYNX_RDMA_PD_MAGIC 0x3152584Cu /* "LXR1" in memory */
/* 2: the producer (frontend) epoch, for fencing */
#define LYNX_RDMA_PD_VERSION 2u
/* u32 magic, u16 version, u16 0, u64 key, u64 epoch, u64 producer */
#define LYNX_RDMA_PD_LEN 32u

/* Fills out[LYNX_RDMA_PD_LEN], little-endian. */
void lynx__rdma_pd_encode(uint8_t *out, uint64_t key, uint64_t epoch,
                          uint64_t producer);
/* Parses what a CONNECT_REQUEST carried (len may exceed LYNX_RDMA_PD_LEN:
 * the CM pads it). 0, or -EPROTO when short, wrong magic or version. */
int lynx__rdma_pd_decode(const void *buf, size_t len, uint64_t *key,
                         uint64_t *epoch, uint64_t *producer);

/* Why an agent refused a connection; sent back as reject private data
 * {u32 magic, u32 reason} so the frontend can log it. */
enum lynx__rdma_reject {
  LYNX_RDMA_REJ_NONE = 0,
  LYNX_RDMA_REJ_FORMAT = 1,   /* private data missing or malformed */
  LYNX_RDMA_REJ_KEY = 2,      /* no exported region has this key */
  LYNX_RDMA_REJ_EPOCH = 3,    /* key known, epoch differs: stale descriptor */
  LYNX_RDMA_REJ_DEVICE = 4,   /* arrived on a device the region is not on */
  LYNX_RDMA_REJ_RESOURCE = 5, /* the agent could not create the QP */
  LYNX_RDMA_REJ_FENCED = 6,   /* a newer frontend epoch holds the region */
  LYNX_RDMA_REJ_COUNT = 7,
};
#define LYNX_RDMA_REJ_LEN 8u
void lynx__rdma_rej_encode(uint8_t *out, enum lynx__rdma_reject why);
/* The reason in a REJECTED event's private data, or NONE when it carries
 * none of ours (a reject by the CM itself, e.g. nobody listening). */
enum lynx__rdma_reject lynx__rdma_rej_decode(const void *buf, size_t len);
const char *lynx__rdma_rej_str(enum lynx__rdma_reject why);
/* What connect returns for a reject of reason why: -ESTALE when fenced
 * (the frontend counts it apart), else dflt (the CM's error). */
int lynx__rdma_rej_errno(enum lynx__rdma_reject why, int dflt);

/* ---- devices (rdma_cm.c) ----------------------------------------------- */

/* Number of RDMA devices ibv_get_device_list sees (0 on error). */
int lynx__rdma_device_count(void);

/* ---- agent: fencing ---------------------------------------------------- */

/* Moves qp to IBV_QPS_ERR: every work request of its peer on it fails from
 * now on (a fenced frontend's one-sided writes stop at once, before the
 * disconnect is through). 0 or -errno. Goes through lynx__rdma_modify_qp,
 * ibv_modify_qp unless a test put a fake there. */
int lynx__rdma_qp_err(struct ibv_qp *qp);
extern int (*lynx__rdma_modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr,
                                   int attr_mask);

/* Admission of one exported region {key, epoch} against a request's
 * private data: 0, -EPROTO (malformed), -EACCES (other key), -ESTALE (this
 * key, another epoch). */
int lynx__rdma_pd_admit(const void *buf, size_t len, uint64_t key,
                        uint64_t epoch);

/* ---- frontend connection manager state machine ----------------------- */

enum lynx__rdma_cm_state {
  LYNX_RCM_IDLE = 0,        /* id created, nothing asked yet */
  LYNX_RCM_ADDR_RESOLVING,  /* rdma_resolve_addr issued */
  LYNX_RCM_ROUTE_RESOLVING, /* rdma_resolve_route issued */
  LYNX_RCM_CONNECTING,      /* QP created, rdma_connect issued */
  LYNX_RCM_ESTABLISHED,     /* data path usable */
  LYNX_RCM_DISCONNECTED,    /* was up, now down: terminal, close it */
  LYNX_RCM_FAILED,          /* never came up: terminal, close it */
  LYNX_RCM_STATE_COUNT,
};

enum lynx__rdma_cm_action {
  LYNX_RCM_ACT_NONE = 0,      /* nothing to do (e.g. TIMEWAIT_EXIT) */
  LYNX_RCM_ACT_RESOLVE_ROUTE, /* call rdma_resolve_route */
  LYNX_RCM_ACT_CONNECT,       /* create PD/CQ/QP, call rdma_connect */
  LYNX_RCM_ACT_READY,         /* up: validate the region, start the data path */
  LYNX_RCM_ACT_TEARDOWN,      /* report err; the connection is dead */
};

struct lynx__rdma_cm_step {
  enum lynx__rdma_cm_state next;
  enum lynx__rdma_cm_action act;
  int err; /* -errno with TEARDOWN, else 0 */
};

/* The one transition function: state s sees event ev with its status.
 * Pure; every (state, event, status) has an answer. Out-of-order events
 * fail a connection that is being set up and drop one that is up;
 * terminal states absorb everything. */
struct lynx__rdma_cm_step lynx__rdma_cm_next(enum lynx__rdma_cm_state s,
                                             enum rdma_cm_event_type ev,
                                             int status);
const char *lynx__rdma_cm_state_str(enum lynx__rdma_cm_state s);

/* ---- frontend data path ---------------------------------------------- */

#define LYNX_RDMA_SQ_DEPTH 256u    /* send queue entries requested */
#define LYNX_RDMA_INLINE 220u      /* max_inline_data requested */
#define LYNX_RDMA_INLINE_BUF 256u  /* per-WR copy of an inline payload */
#define LYNX_RDMA_SIGNAL_EVERY 32u /* selective signalling period */

enum lynx__rdma_wr_kind {
  LYNX_RWR_WRITE = 1,
  LYNX_RWR_READ = 2,
  LYNX_RWR_SEND = 3, /* notify */
};

/* One send-queue entry, from writev/read/notify until its completion (or a
 * later signalled one: RC completes in order) frees it. */
struct lynx__rdma_wr {
  struct ibv_send_wr wr;
  struct ibv_sge sge;
  uint64_t stage_end;  /* staging tail after this WR: head moves here */
  uint64_t bounce_end; /* bounce tail after this WR */
  uint8_t *bounce;     /* read: where the NIC puts the data */
  void *dst;           /* read: where the caller wants it */
  uint32_t len;
  uint64_t user_id; /* read: the caller's wr_id */
  uint8_t kind;
  uint8_t inl[LYNX_RDMA_INLINE_BUF] __attribute__((aligned(8)));
};

/* What a connection's data path runs over (owned by the caller). */
struct lynx__rdma_attach {
  struct ibv_qp *qp;
  struct ibv_cq *cq;
  uint8_t *buf;          /* stage_size + bounce_size bytes, registered */
  uint32_t lkey;         /* of buf */
  size_t stage_size;     /* gather copies of non-inline writes */
  size_t bounce_size;    /* landing area of reads */
  uint32_t sq_depth;     /* the QP's max_send_wr (the CQ holds as many) */
  uint32_t max_inline;   /* the QP's max_inline_data */
  uint32_t signal_every; /* 0: LYNX_RDMA_SIGNAL_EVERY */
};

struct lynx__rdma_conn {
  struct lynx_tconn base;
  struct lynx_geom g;
  char name[LYNX_LOCATOR_MAX + 16]; /* for log lines */

  /* data path */
  struct ibv_qp *qp;
  struct ibv_cq *cq;
  uint32_t lkey, max_inline, signal_every, sq_cap, ring_mask;
  uint8_t *stage, *bounce;
  uint64_t stage_size, stage_head, stage_tail, stage_mark;
  uint64_t bounce_size, bounce_head, bounce_tail;
  struct lynx__rdma_wr *ring; /* ring_mask + 1 entries */
  uint64_t sq_head;           /* oldest WR not known complete */
  uint64_t sq_posted;         /* first WR not handed to the NIC */
  uint64_t sq_tail;           /* next WR to build */
  uint32_t unsignalled;       /* WRs built since the last signalled one */
  uint64_t *done;             /* completed reads' ids, not yet reported */
  uint32_t done_head, done_tail, reads_held;
  int dead;       /* 0, or the -errno every call returns from now on */
  uint64_t posts; /* ibv_post_send calls (doorbells) */

  /* connection manager; NULL/0 for a lynx__rdma_attach'ed test connection */
  enum lynx__rdma_cm_state cm;
  struct rdma_event_channel *ch;
  struct rdma_cm_id *id;
  struct ibv_pd *pd;
  struct ibv_cq *own_cq;
  struct ibv_mr *mr;
  uint8_t *buf;
  uint64_t next_cm_ns;
  /* wait_fd: an epoll set of the CQ's completion channel, the CM channel
   * and a self-wake eventfd; -1 when there is none (then -ENOTSUP) */
  struct ibv_comp_channel *cc;
  int epfd, efd;
  int armed; /* ibv_req_notify_cq since the last CQ event */
  int woken; /* efd was written: poll clears it */
};

/* Sizes of the staging and bounce areas for a region of geometry g. */
void lynx__rdma_buf_sizes(const struct lynx_geom *g, size_t *stage,
                          size_t *bounce);

/* A connection of table ops (transport_rdma.c's, handed down: this side
 * of the transport does not name it) to the region d with no data path
 * yet (CM state IDLE). 0, -EINVAL (bad geometry), -ENOMEM. Freed with the
 * ops' close. */
int lynx__rdma_conn_new(const struct lynx_transport_ops *ops,
                        const struct lynx_region_desc *d,
                        struct lynx__rdma_conn **out);
/* Starts c's data path over a's resources, which stay the caller's: close
 * frees only what the connection made itself. 0, -EINVAL, -ENOMEM. */
int lynx__rdma_dp_init(struct lynx__rdma_conn *c,
                       const struct lynx__rdma_attach *a);
/* Frees the data path's own memory (never a's resources). */
void lynx__rdma_dp_fini(struct lynx__rdma_conn *c);
/* conn_new + dp_init, CM state ESTABLISHED: a connection over a fake NIC
 * for the unit test (transport_rdma.c, which has the table). Freed with
 * (*out)->ops->close. */
int lynx__rdma_attach(const struct lynx_region_desc *d,
                      const struct lynx__rdma_attach *a,
                      struct lynx_tconn **out);

/* Feeds an rdma_cm event to an established connection (the real poll does
 * this for every event it reads); a dead connection reports -ECONNRESET. */
void lynx__rdma_conn_cm_event(struct lynx__rdma_conn *c,
                              enum rdma_cm_event_type ev, int status);

int lynx__rdma_writev(struct lynx_tconn *tc, uint64_t off,
                      const struct iovec *iov, int iovcnt, unsigned flags);
int lynx__rdma_read(struct lynx_tconn *tc, uint64_t off, void *dst, size_t len,
                    uint64_t wr_id);
int lynx__rdma_flush(struct lynx_tconn *tc);
int lynx__rdma_poll_cq(struct lynx__rdma_conn *c, uint64_t *ids, int max);
int lynx__rdma_notify(struct lynx_tconn *tc);

/* ---- agent side (rdma_agent.c) --------------------------------------- */

/* agent_create for a handle of table ops (transport_rdma.c's, handed
 * down). */
int lynx__rdma_agent_start(const struct lynx_transport_ops *ops,
                           const struct lynx_transport_opts *o,
                           struct lynx_transport_agent **out, char *err,
                           size_t errlen);
void lynx__rdma_agent_destroy(struct lynx_transport_agent *a);
int lynx__rdma_region_alloc(struct lynx_transport_agent *a,
                            struct lynx_region *r, const char *name,
                            uint64_t size);
int lynx__rdma_region_attach(struct lynx_transport_agent *a,
                             struct lynx_region *r, const char *name,
                             uint64_t size, const struct lynx_region_mem *mem);
int lynx__rdma_region_export(struct lynx_region *r);
void lynx__rdma_region_free(struct lynx_region *r);

#endif
