/*
 * elect.h - several coordinators on one etcd prefix, one of them the
 * leader (docs/etcd.md, "Leader election").
 *
 * A thread of its own, with its own etcd client, campaigns for the key
 * P leader: a transaction that creates it only when it does not exist,
 * bound to a lease of ttl_s seconds that the leader keeps alive every
 * ttl_s/3. The winner is the leader until its lease cannot be renewed:
 * it steps down when a renewal fails for 2/3 of the TTL (before etcd can
 * let the key expire and another win), or at once when etcd says the
 * lease is gone. Followers read the key every FOLLOW_MS, and at once when
 * a watch on the prefix reports a change, campaign when it is gone, and
 * keep their registry's services in step with etcd, so they answer reads.
 *
 * On winning, the registry's services are reloaded from etcd (what the
 * last leader saved) and every later save is fenced: its transaction
 * holds only while the leader key is still the one this coordinator
 * created (struct lynx_store_etcd's fence), so a coordinator that lost
 * the lead without knowing yet cannot write. All registry access is under
 * c->lock; changed() (the loop's wake-up) is called after every change of
 * role, from the election thread.
 */
#ifndef LYNX_ELECT_H
#define LYNX_ELECT_H

#include <pthread.h>
#include <stdint.h>

#include "coord.h"
#include "etcd.h"
#include "store_etcd.h"

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
  uint64_t renewed_ns; /* last successful keepalive */
  uint64_t sig;        /* what the follower's registry was loaded from */
  uint64_t ok_ns;      /* when etcd last answered a request */
  int64_t stale_lease; /* not revoked on stepping down (etcd failed): later */
  int key_mine;        /* the last look found our own key, not leading */
  int64_t seen_rev;    /* etcd's revision at the last look */
  int follow_due;       /* the services must be read again (a change) */
  uint64_t followed_ns; /* when they last were */
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

#endif
