/*
 * tagtab.h - request tags: which client a response goes to.
 *
 * One table per frontend worker (no locks). A tag is (generation << bits) |
 * index; the generation changes on every allocation of an entry, so a tag
 * that was freed, expired or never issued is recognised as stale and never
 * delivered to whoever holds the entry now. Entries remember the mqueue
 * they were dispatched to: a response on another mqueue is stale too.
 */
#ifndef LYNX_TAGTAB_H
#define LYNX_TAGTAB_H

#include <netinet/in.h>
#include <stdint.h>

union lynx_sockaddr {
  struct sockaddr sa;
  struct sockaddr_in v4;
  struct sockaddr_in6 v6;
};

struct lynx_tag_entry {
  union lynx_sockaddr peer;
  uint64_t t_ns; /* dispatch time */
  uint64_t seq;  /* caller's dispatch order (responses go out in it) */
  uint32_t tag;  /* current tag of this entry; valid when in_use */
  uint32_t mq;   /* frontend-wide mqueue index */
  uint32_t flow; /* caller's flow-table slot */
  uint32_t in_use;
  uint32_t cli, cli_gen; /* TCP services: client slot and its generation */
};

/* The entries are touched only as they are first used: [0, fresh) have
 * been handed out at least once (the free stack holds those released),
 * [fresh, size) never were, and their memory (calloc: pages the kernel
 * maps on first write) costs nothing until then. A worker's table of
 * 65,536 entries is 4.7 MB of address space and, for a service that sees
 * a few requests at a time, a few pages of memory (issue 38). */
struct lynx_tagtab {
  struct lynx_tag_entry *e;
  uint32_t *free_stack; /* released entries, the last released on top */
  uint32_t n_stack;     /* on the free stack */
  uint32_t fresh;       /* entries ever handed out: [0, fresh) */
  uint32_t n_free;      /* free in all: n_stack + size - fresh */
  uint32_t size, bits;
  uint32_t gen0; /* a never-used entry's generation */
  uint32_t in_use;
  uint32_t cursor; /* where the next expiry scan starts, < fresh */
};

/* A table of at least min_entries (rounded up to a power of two, at most
 * 2^20) whose entries start at generation gen0 (pass a random value so that
 * two tables never hand out the same tags in step; only its low 32 - bits
 * bits count). 0 or -ENOMEM/-EINVAL. */
int lynx_tagtab_init(struct lynx_tagtab *t, uint32_t min_entries,
                     uint32_t gen0);
void lynx_tagtab_free(struct lynx_tagtab *t);

/* Allocates an entry for a request to mqueue mq from peer (NULL for a TCP
 * client, whose slot the caller records in cli/cli_gen); returns the entry
 * and its tag in *tag, or NULL when the table is full. */
struct lynx_tag_entry *lynx_tag_alloc(struct lynx_tagtab *t, uint32_t mq,
                                      const struct sockaddr *peer,
                                      uint64_t now_ns, uint32_t *tag);

/* The entry for tag if it is outstanding on mqueue mq, else NULL (stale). */
struct lynx_tag_entry *lynx_tag_lookup(struct lynx_tagtab *t, uint32_t tag,
                                       uint32_t mq);

void lynx_tag_release(struct lynx_tagtab *t, struct lynx_tag_entry *e);

/* Scans up to max entries from where the last scan stopped (bounded work
 * per wakeup), calls cb for and releases each one dispatched before
 * deadline_ns; returns how many it released. */
uint32_t lynx_tag_expire(struct lynx_tagtab *t, uint64_t deadline_ns,
                         uint32_t max,
                         void (*cb)(void *arg, const struct lynx_tag_entry *e),
                         void *arg);

/* Releases every entry on mqueue mq (its accelerator left), calling cb (if
 * not NULL) for each first; returns the count. */
uint32_t lynx_tag_release_mq(struct lynx_tagtab *t, uint32_t mq,
                             void (*cb)(void *arg,
                                        const struct lynx_tag_entry *e),
                             void *arg);

#endif
