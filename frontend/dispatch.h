/*
 * dispatch.h - the Message Dispatcher's policies.
 *
 * Picks the mqueue a request goes to among a worker's mqueues. A mqueue that
 * is out of dispatch (its accelerator left) or whose RX ring is full is
 * skipped, never waited on (except by a busy flow, below).
 *   rr - round robin over the mqueues that have room
 *   lo - least outstanding requests (ties rotate, so equal queues share)
 */
#ifndef LYNX_DISPATCH_H
#define LYNX_DISPATCH_H

#include <stdint.h>

enum lynx_dispatch_policy { LYNX_DISPATCH_RR = 0, LYNX_DISPATCH_LO = 1 };

/* What the dispatcher knows of one mqueue; owned by the worker. */
struct lynx_dq {
  uint32_t rx_prod; /* next RX position the frontend writes */
  uint32_t rx_cons; /* accelerator's consumer index as last polled */
  uint32_t slots;
  uint32_t outstanding; /* dispatched, not yet answered or expired */
  uint32_t up;          /* 1 while in dispatch */
};

struct lynx_dispatcher {
  enum lynx_dispatch_policy policy;
  struct lynx_dq **q;
  uint32_t n;
  uint32_t cursor;
};

/* Index of the chosen mqueue; -ENOSPC when every mqueue in dispatch is full,
 * -ENOENT when none is in dispatch. Does not change the mqueue: the caller
 * advances rx_prod and outstanding when the write succeeded. */
int lynx_dispatch_pick(struct lynx_dispatcher *d);

/*
 * Flow order ("flowlets"): a client flow whose previous requests are still
 * outstanding stays on the mqueue they went to, so the accelerator answers
 * them in order (one mqueue is FIFO end to end) and the client sees its
 * answers in the order it asked. A flow with nothing in flight is placed by
 * the policy, so one client still reaches every accelerator over time.
 * When a busy flow's mqueue is full the request is refused, not moved:
 * answers from another mqueue could overtake those still queued, so at
 * saturation the excess is dropped instead (the caller counts it) and one
 * busy flow is served by one mqueue at a time. A busy flow moves only when
 * its mqueue leaves dispatch; its answers may then overtake each other.
 */
struct lynx_flow {
  uint32_t q;           /* dispatcher index of the flow's mqueue */
  uint32_t outstanding; /* the flow's requests in flight */
};

/* pick, honouring f (NULL: plain pick): also -EBUSY when f is busy and its
 * mqueue is in dispatch but full (drop the request, or wait for room; never
 * pick another). The caller records the result in f->q and counts
 * f->outstanding up, and down as each request completes. */
int lynx_dispatch_pick_flow(struct lynx_dispatcher *d,
                            const struct lynx_flow *f);

/* Hash of a client address (IPv4/IPv6 address and port) for a flow table. */
struct sockaddr;
uint32_t lynx_flow_hash(const struct sockaddr *sa);

#endif
