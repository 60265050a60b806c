/* tagtab.c - request tag table; see tagtab.h. */
#include "tagtab.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int lynx_tagtab_init(struct lynx_tagtab *t, uint32_t min_entries,
                     uint32_t gen0) {
  uint32_t bits = 4;
  memset(t, 0, sizeof(*t));
  if (min_entries > (1u << 20))
    return -EINVAL;
  while ((1u << bits) < min_entries)
    bits++;
  t->bits = bits;
  t->size = 1u << bits;
  /* neither is written here: memory comes as entries are first used */
  t->e = calloc(t->size, sizeof(*t->e));
  t->free_stack = malloc(t->size * sizeof(*t->free_stack));
  if (!t->e || !t->free_stack) {
    lynx_tagtab_free(t);
    return -ENOMEM;
  }
  t->n_free = t->size;
  t->gen0 = gen0;
  return 0;
}

void lynx_tagtab_free(struct lynx_tagtab *t) {
  free(t->e);
  free(t->free_stack);
  memset(t, 0, sizeof(*t));
}

struct lynx_tag_entry *lynx_tag_alloc(struct lynx_tagtab *t, uint32_t mq,
                                      const struct sockaddr *peer,
                                      uint64_t now_ns, uint32_t *tag) {
  struct lynx_tag_entry *e;
  uint32_t idx, gen;
  if (t->n_free == 0)
    return NULL;
  t->n_free--;
  if (t->n_stack) { /* the last released first */
    idx = t->free_stack[--t->n_stack];
    e = &t->e[idx];
  } else { /* then the next never used, in order 0, 1, 2, ... */
    idx = t->fresh++;
    e = &t->e[idx];
    e->tag = (t->gen0 << t->bits) | idx;
  }
  gen = (e->tag >> t->bits) + 1;
  if ((gen << t->bits) == 0) /* wrapped: skip generation 0 */
    gen = 1;
  e->tag = (gen << t->bits) | idx;
  e->mq = mq;
  e->t_ns = now_ns;
  e->in_use = 1;
  e->cli = e->cli_gen = 0;
  if (!peer) /* a TCP client: the caller fills cli and cli_gen */
    memset(&e->peer, 0, sizeof(e->peer));
  else if (peer->sa_family == AF_INET6)
    memcpy(&e->peer.v6, peer, sizeof(e->peer.v6));
  else
    memcpy(&e->peer.v4, peer, sizeof(e->peer.v4));
  t->in_use++;
  *tag = e->tag;
  return e;
}

struct lynx_tag_entry *lynx_tag_lookup(struct lynx_tagtab *t, uint32_t tag,
                                       uint32_t mq) {
  struct lynx_tag_entry *e = &t->e[tag & (t->size - 1)];
  if (!e->in_use || e->tag != tag || e->mq != mq)
    return NULL;
  return e;
}

void lynx_tag_release(struct lynx_tagtab *t, struct lynx_tag_entry *e) {
  if (!e->in_use)
    return;
  e->in_use = 0;
  t->in_use--;
  t->free_stack[t->n_stack++] = (uint32_t)(e - t->e);
  t->n_free++;
}

uint32_t lynx_tag_expire(struct lynx_tagtab *t, uint64_t deadline_ns,
                         uint32_t max,
                         void (*cb)(void *arg, const struct lynx_tag_entry *e),
                         void *arg) {
  uint32_t n = 0;
  /* only entries ever handed out can be in use */
  if (max > t->fresh)
    max = t->fresh;
  for (uint32_t k = 0; k < max && t->in_use; k++) {
    struct lynx_tag_entry *e = &t->e[t->cursor];
    t->cursor = t->cursor + 1 < t->fresh ? t->cursor + 1 : 0;
    if (e->in_use && e->t_ns < deadline_ns) {
      if (cb)
        cb(arg, e);
      lynx_tag_release(t, e);
      n++;
    }
  }
  return n;
}

uint32_t lynx_tag_release_mq(struct lynx_tagtab *t, uint32_t mq,
                             void (*cb)(void *arg,
                                        const struct lynx_tag_entry *e),
                             void *arg) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < t->fresh && t->in_use; i++)
    if (t->e[i].in_use && t->e[i].mq == mq) {
      if (cb)
        cb(arg, &t->e[i]);
      lynx_tag_release(t, &t->e[i]);
      n++;
    }
  return n;
}
