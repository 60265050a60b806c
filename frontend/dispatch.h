/*
 * dispatch.h - the Message Dispatcher's policies.
 *
 * Picks the mqueue a request goes to among a worker's mqueues. A mqueue that
 * is out of dispatch (its accelerator left) or whose RX ring is full is
 * skipped, never waited on.
 *   rr - round robin over the mqueues that have room
 *   lo - least outstanding requests (ties rotate, so equal queues share)
 */
#ifndef LYNX_DISPATCH_H
#define LYNX_DISPATCH_H

#include <stdint.h>

enum lynx_dispatch_policy { LYNX_DISPATCH_RR = 0, LYNX_DISPATCH_LO = 1 };

/* What the dispatcher knows of one mqueue; owned by the worker. */
struct lynx_dq {
  uint32_t rx_prod;     /* next RX position the frontend writes */
  uint32_t rx_cons;     /* accelerator's consumer index as last polled */
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

#endif
