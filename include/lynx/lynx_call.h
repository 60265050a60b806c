/*
 * lynx_call.h - a call from an application to a back end through a client
 * mqueue (docs/client-mqueues.md), the part CPU and GPU code share: the
 * results and how a reply is taken. Part of the SDK (include/lynx).
 */
#ifndef LYNX_CALL_H
#define LYNX_CALL_H

#include <stdint.h>

#include "mqueue.h"

/*
 * An application calls a back end through a client mqueue: it writes the
 * request into the mqueue's TX ring with a tag of its own and the frontend
 * writes the back end's reply into the RX ring with the same tag (status OK,
 * BACKEND_DOWN or TOO_LONG). The CPU's lynx_call (apps.c), the GPU's
 * lynx_block_call (lynx_dev.cuh) and the fake kernel of the CUDA unit
 * test all take replies with lynx_call_poll. Results are -errno as Linux
 * numbers them, spelled out because device code has no errno.h (apps.c
 * checks that they match).
 */
#define LYNX_CALL_EHOSTDOWN (-112) /* the back end is unreachable */
#define LYNX_CALL_EMSGSIZE (-90)   /* the reply did not fit (slot or cap) */
#define LYNX_CALL_ETIMEDOUT (-110) /* no reply in time */
#define LYNX_CALL_ECANCELED (-125) /* GPU: the kernel was asked to stop */

/* How long an application waits for a back end's reply (CPU and GPU). */
#define LYNX_CALL_TIMEOUT_NS (500ull * 1000u * 1000u)

/* What a reply with this status and length means to a caller that takes at
 * most cap bytes: 0 (use it), LYNX_CALL_EHOSTDOWN or LYNX_CALL_EMSGSIZE. */
LYNX_HD int lynx_call_reply_rc(uint16_t status, uint32_t len, uint32_t cap) {
  if (status == LYNX_ST_BACKEND_DOWN)
    return LYNX_CALL_EHOSTDOWN;
  if (status == LYNX_ST_TOO_LONG || len > cap)
    return LYNX_CALL_EMSGSIZE;
  return 0;
}

/*
 * One look at a client mqueue's RX ring for the reply to the call with tag:
 * 0 and *m, a view of the reply in its RX slot, to be released with
 * lynx_mq_release once read; -11 (EAGAIN) when it has not come yet;
 * LYNX_CALL_EHOSTDOWN or LYNX_CALL_EMSGSIZE (lynx_call_reply_rc, the slot
 * released already). A reply with another tag answers an earlier call that
 * timed out: it is released and skipped, so a late reply never passes for
 * the current call's and never blocks the ring.
 */
LYNX_HD int lynx_call_poll(struct lynx_mq *mq, uint32_t tag, uint32_t cap,
                           struct lynx_msg *m) {
  for (;;) {
    int rc = lynx_mq_recv(mq, m);
    if (rc) /* -11; never -105: every reply is released before the next */
      return -11;
    if (m->tag != tag) {
      lynx_mq_release(mq);
      continue;
    }
    rc = lynx_call_reply_rc(m->status, m->len, cap);
    if (rc)
      lynx_mq_release(mq);
    return rc;
  }
}

#endif
