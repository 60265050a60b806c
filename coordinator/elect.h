/*
 * elect.h - several coordinators on one etcd prefix, one of them the
 * leader (docs/etcd.md, "Leader election").
 *
 * A thread of its own, with its own etcd client, campaigns for the key
 * P leader: a transaction that creates it only when it does not exist,
 * bound to a lease of ttl_s seconds that the leader keeps alive every
 * ttl_s/3. The winner is the leader until its lease cannot be renewed:
 * it vouches for its lead until the send time of its last keepalive etcd
 * took plus 2/3 of the TTL (c->lead_until_ns: before etcd can let the key
 * expire and another win), steps down when that passes, and at once when
 * etcd says the lease is gone. A coordinator that did not run for a
 * while finds its vouching passed and answers nothing until etcd has
 * said again (coord.h, lynx_coord_leads). Followers read the key every
 * FOLLOW_MS, and at once when a watch on the prefix reports a change, campaign
 * when it is gone, and keep their registry's services in step with etcd, so
 * they answer reads.
 *
 * The leader also issues epochs ahead (a few of each kind, fenced puts),
 * so that the loop thread takes one without waiting on etcd
 * (lynx_elect_take_epoch).
 *
 * On winning, the registry's services are reloaded from etcd (what the
 * last leader saved) and every later save is fenced: its transaction
 * holds only while the leader key is still the one this coordinator
 * created (struct lynx_store_etcd's fence), so a coordinator that lost
 * the lead without knowing yet cannot write. All registry access is under
 * c->lock, and reloads are changes of operator intent (c->change_lock
 * first), made with this thread's own etcd client outside c->lock;
 * changed() (the loop's wake-up) is called after every change of role,
 * from the election thread.
 */
#ifndef LYNX_ELECT_H
#define LYNX_ELECT_H

#include <pthread.h>
#include <stdint.h>

#include "coord.h"
#include "etcd.h"
#include "store_etcd.h"

#define LYNX_EPOCH_POOL 3 /* epochs of each kind issued ahead */

struct lynx_elect {
  struct lynx_coord *c;
  struct lynx_store_etcd *store; /* the API's store (used under c->lock) */
  struct lynx_etcd *etcd;        /* the election's own client */
  char key[LYNX_ETCD_PREFIX_MAX + 8];
  char me[512]; /* the leader key's value: {"id", "api", "control"} */
  char my_api[128];
  uint32_t ttl_s;
  void (*changed)(void *arg);
  void *arg;
  /* the thread */
  pthread_t tid;
  int started;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int stop;
  /* the thread's own */
  int64_t lease, rev;
  uint64_t next_ka_ns;    /* the leader's next keepalive is due */
  uint64_t looked_ns;     /* the leader last checked its key */
  uint64_t sig;           /* what the follower's registry was loaded from */
  uint64_t fail_since_ns; /* etcd has failed this thread since (0: it
                           * answered the last request) */
  int64_t stale_lease;  /* not revoked on stepping down (etcd failed): later */
  int key_mine;         /* the last look found our own key, not leading */
  int64_t seen_rev;     /* etcd's revision at the last look */
  int follow_due;       /* the services must be read again (a change) */
  uint64_t followed_ns; /* when they last were */
  /* Epochs issued ahead while leading, oldest first, per kind (0: node,
   * 1: frontend); under c->lock. Handed out in the order they were
   * issued, so each is newer than every one handed out before it. */
  uint64_t pool[2][LYNX_EPOCH_POOL];
  unsigned n_pool[2];
};

/* e->c, store, changed, arg set by the caller; endpoints and timeout as
 * --etcd gives them; id, api and control: what the leader key says of
 * this coordinator. Starts the thread. 0 or -errno with err. */
int lynx_elect_start(struct lynx_elect *e, const char *endpoints,
                     uint32_t timeout_ms, uint32_t ttl_s, const char *id,
                     const char *api, const char *control, char *err,
                     size_t errlen);
/* Stops the thread; a leader revokes its lease, so that a follower takes
 * over at once rather than after the TTL. */
void lynx_elect_stop(struct lynx_elect *e);

/* An epoch for the loop thread (c->lock held): the oldest issued ahead,
 * r->epoch_last (and r->frontend_epoch) set, and the thread woken to
 * issue another. -EAGAIN with err when none is ready (just elected, or
 * etcd slow or unreachable): the caller retries, nothing waits on etcd. */
int lynx_elect_take_epoch(struct lynx_elect *e, struct lynx_registry *r,
                          int frontend, uint64_t *epoch, char *err,
                          size_t errlen);

#endif
