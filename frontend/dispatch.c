/* dispatch.c - dispatch policies; see dispatch.h. */
#include "dispatch.h"

#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

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

int lynx_dispatch_pick_flow(struct lynx_dispatcher *d,
                            const struct lynx_flow *f) {
  if (f && f->outstanding && f->q < d->n) {
    const struct lynx_dq *q = d->q[f->q];
    /* a full ring refuses rather than moves the flow: another mqueue's
     * answers could overtake those still queued on this one */
    if (q->up)
      return has_room(q) ? (int)f->q : -EBUSY;
  }
  return lynx_dispatch_pick(d);
}

static uint32_t mix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

uint32_t lynx_flow_hash(const struct sockaddr *sa) {
  uint32_t h = 0x9e3779b9u;
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *v4 = (const struct sockaddr_in *)sa;
    h = mix32(h ^ v4->sin_addr.s_addr);
    h = mix32(h ^ v4->sin_port);
  } else if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *v6 = (const struct sockaddr_in6 *)sa;
    uint32_t w[4];
    memcpy(w, &v6->sin6_addr, sizeof(w));
    for (int i = 0; i < 4; i++)
      h = mix32(h ^ w[i]);
    h = mix32(h ^ v6->sin6_port);
  }
  return h;
}
