/* dispatch.c - dispatch policies; see dispatch.h. */
#include "dispatch.h"

#include <errno.h>

static int has_room(const struct lynx_dq *q) {
  return q->rx_prod - q->rx_cons < q->slots;
}

int lynx_dispatch_pick(struct lynx_dispatcher *d) {
  int best = -1, any_up = 0;
  uint32_t best_out = UINT32_MAX;
  for (uint32_t k = 0; k < d->n; k++) {
    uint32_t i = (d->cursor + k) % d->n;
    const struct lynx_dq *q = d->q[i];
    if (!q->up)
      continue;
    any_up = 1;
    if (!has_room(q))
      continue;
    if (d->policy == LYNX_DISPATCH_RR) {
      best = (int)i;
      break;
    }
    if (q->outstanding < best_out) {
      best_out = q->outstanding;
      best = (int)i;
    }
  }
  if (best < 0)
    return any_up ? -ENOSPC : -ENOENT;
  d->cursor = ((uint32_t)best + 1) % d->n;
  return best;
}
