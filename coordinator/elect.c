/* elect.c - leader election among coordinators on etcd (see elect.h). */
#include "elect.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <json-c/json.h>

#include "log.h"
#include "util.h"

#define COMP "coordinator"
#define FOLLOW_MS 250u /* a follower looks at the leader key this often */
/* ... and reads the services this often even when its watch saw nothing */
#define FOLLOW_FULL_MS 5000u
/* etcd unanswered for this long since its last answer: what a follower
 * last read of the leader key may be stale (the leader it names may have
 * stepped down meanwhile: quorum lost), so it knows of no leader. A few
 * polls: a quick failure (a member restarting, its port refused) is
 * retried first; a request that timed out (--etcd-timeout-ms, 1 s by
 * default) is enough on its own. Agents must hear it well within their
 * lease after the leader stopped answering them (docs/etcd.md). */
#define CUT_OFF_MS (FOLLOW_MS * 3u)

/* Waits ms, or less when stopping; 1 when stopping. */
static int nap(struct lynx_elect *e, uint32_t ms) {
  struct timespec ts;
  int stop;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += ms / 1000u;
  ts.tv_nsec += (long)(ms % 1000u) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&e->mu);
  if (!e->stop)
    pthread_cond_timedwait(&e->cv, &e->mu, &ts);
  stop = e->stop;
  pthread_mutex_unlock(&e->mu);
  return stop;
}

/* The leader key's "api", or "" (lock held by the caller: it writes
 * c->leader_api). */
static void leader_api_from(struct lynx_elect *e, const char *value) {
  struct json_object *j = json_tokener_parse(value), *api;
  const char *s = "";
  if (json_object_is_type(j, json_type_object) &&
      json_object_object_get_ex(j, "api", &api) &&
      json_object_is_type(api, json_type_string))
    s = json_object_get_string(api);
  snprintf(e->c->leader_api, sizeof(e->c->leader_api), "%s", s);
  json_object_put(j);
}

/* The outcome of this round's etcd requests (err: NULL when they
 * succeeded), and from it whether this coordinator knows of a leader
 * (c->no_leader, coord.h). */
static void reached(struct lynx_elect *e, const char *err) {
  struct lynx_coord *c = e->c;
  uint64_t now = lynx_now_ns();
  int lead = __atomic_load_n(&c->leader, __ATOMIC_ACQUIRE), was;
  if (!err)
    e->ok_ns = now;
  pthread_mutex_lock(&c->lock);
  was = c->no_leader;
  if (lead) {
    c->no_leader = 0;
  } else if (err) {
    if (now - e->ok_ns > (uint64_t)CUT_OFF_MS * 1000000u) {
      /* a stale leader_api would send API calls (and agents' hopes) to a
       * coordinator that may have stepped down: followers could even
       * redirect to each other */
      c->leader_api[0] = '\0';
      c->no_leader = 1;
      snprintf(c->no_leader_why, sizeof(c->no_leader_why),
               "no coordinator leads: etcd cannot be reached from here "
               "(%.160s; no answer for %llu ms): an election waits for "
               "its quorum", err,
               (unsigned long long)((now - e->ok_ns) / 1000000u));
    } /* else a blip: keep what the last read said */
  } else if (!c->leader_api[0]) {
    c->no_leader = 1;
    snprintf(c->no_leader_why, sizeof(c->no_leader_why),
             "no coordinator leads yet: etcd holds no leader key (an "
             "election is under way)");
  } else if (e->key_mine) {
    /* other coordinators send agents and API calls here: they must hear
     * that nobody leads, not be sent back to a leader_api naming us */
    c->leader_api[0] = '\0';
    c->no_leader = 1;
    snprintf(c->no_leader_why, sizeof(c->no_leader_why),
             "no coordinator leads yet: the leader key is still this "
             "coordinator's from before it stepped down (revoked, or "
             "expiring, now: an election follows)");
  } else {
    c->no_leader = 0;
  }
  if (c->no_leader != was) {
    if (c->no_leader)
      LYNX_WARN(COMP, "%s; agents keep their leases meanwhile, API changes "
                "get 503", c->no_leader_why);
    else
      LYNX_INFO(COMP, "a leader is known again (%s)",
                lead ? "this coordinator" : c->leader_api);
  }
  pthread_mutex_unlock(&c->lock);
}

/* The registry takes what etcd holds (c->lock held). */
static int reload(struct lynx_elect *e, char *err, size_t errlen) {
  struct lynx_coord *c = e->c;
  uint64_t now = lynx_coord_now_ms();
  int rc;
  lynx_reg_intent_clear(&c->reg, now);
  rc = lynx_store_etcd_load(e->store, &c->reg, now, err, errlen);
  c->reg.version++;
  lynx_coord_changed(c);
  return rc;
}

static void set_role(struct lynx_elect *e, int leader) {
  __atomic_store_n(&e->c->leader, leader, __ATOMIC_RELEASE);
  if (e->changed)
    e->changed(e->arg);
}

static void step_down(struct lynx_elect *e, const char *why) {
  struct lynx_coord *c = e->c;
  char err[256];
  pthread_mutex_lock(&c->lock);
  e->store->fence_rev = 0;
  c->leader_api[0] = '\0';
  pthread_mutex_unlock(&c->lock);
  /* the loop then closes the agents' and frontends' connections and
   * releases the nodes (main.c on_role, registry.h) */
  set_role(e, 0);
  LYNX_WARN(COMP, "no longer the leader: %s", why);
  /* revoked: the key goes now, not at the TTL. When etcd cannot take it
   * (no quorum), the key outlives the quorum's return by up to a TTL
   * (etcd's new raft leader extends every lease): it is revoked again as
   * soon as etcd answers (elect_main), so an election need not wait. */
  if (e->lease &&
      lynx_etcd_lease_revoke(e->etcd, e->lease, err, sizeof(err)) != 0)
    e->stale_lease = e->lease;
  e->lease = 0;
  e->sig = 0; /* a follower reloads at once */
  e->follow_due = 1;
}

/* Who holds the key now: c->leader_api from its value (none: ""). *held
 * says whether anyone does, *rev its create revision. */
static int look(struct lynx_elect *e, int *held, int64_t *rev, char *err,
                size_t errlen) {
  struct lynx_etcd_kvs k;
  int rc = lynx_etcd_get(e->etcd, e->key, 0, &k, err, errlen);
  if (rc)
    return rc;
  *held = k.n > 0;
  *rev = k.n ? k.kv[0].create_rev : 0;
  e->seen_rev = k.revision; /* a follower watches for what comes after */
  /* ours, but we do not lead: a key we could not revoke on stepping down */
  e->key_mine = k.n > 0 && strcmp(k.kv[0].value, e->me) == 0 &&
                !__atomic_load_n(&e->c->leader, __ATOMIC_ACQUIRE);
  pthread_mutex_lock(&e->c->lock);
  if (k.n)
    leader_api_from(e, k.kv[0].value);
  else
    e->c->leader_api[0] = '\0';
  pthread_mutex_unlock(&e->c->lock);
  lynx_etcd_kvs_free(&k);
  return 0;
}

/* A follower's wait between two looks at the key: at most FOLLOW_MS, but
 * over at once when anything under the prefix changes (the leader key
 * deleted or expired: campaign now, not at the next poll; a service
 * saved: reload). 1 when stopping. */
static int follower_wait(struct lynx_elect *e) {
  char err[256];
  uint64_t t0 = lynx_now_ns(), spent_ms;
  int rc = lynx_etcd_watch(e->etcd, e->store->prefix, 1,
                           e->seen_rev ? e->seen_rev + 1 : 0, FOLLOW_MS,
                           &e->stop, err, sizeof(err));
  if (__atomic_load_n(&e->stop, __ATOMIC_ACQUIRE))
    return 1;
  if (rc != 0)
    e->follow_due = 1; /* a change, or no watch: read the services again */
  if (rc >= 0)
    return 0;
  /* etcd did not take the watch: the rest of the poll as a nap */
  LYNX_LOG_RL(LYNX_LOG_DEBUG, COMP, "%s", err);
  spent_ms = (lynx_now_ns() - t0) / 1000000u;
  return nap(e, spent_ms < FOLLOW_MS ? FOLLOW_MS - (uint32_t)spent_ms : 1);
}

/* One campaign: when nobody holds the key, create it on a new lease (a
 * transaction that holds only while it is still absent). 1 when we lead
 * now, 0 when another does, -errno when etcd could not say. */
static int campaign(struct lynx_elect *e, char *err, size_t errlen) {
  struct lynx_coord *c = e->c;
  struct lynx_etcd_cmp free_key = {e->key, LYNX_ETCD_CREATE, 0, 0, NULL};
  struct lynx_etcd_op put = {LYNX_ETCD_PUT, e->key, e->me, strlen(e->me), 0};
  int won = 0, held, rc;
  int64_t rev = 0;
  rc = look(e, &held, &rev, err, errlen);
  if (rc || held)
    return rc;
  rc = lynx_etcd_lease_grant(e->etcd, e->ttl_s, &e->lease, err, errlen);
  if (rc)
    return rc;
  put.lease = e->lease;
  rc = lynx_etcd_txn(e->etcd, &free_key, 1, &put, 1, NULL, 0, &won, &rev, err,
                     errlen);
  if (rc || !won) {
    /* another was quicker (or etcd failed): our lease is of no use */
    char why[64];
    lynx_etcd_lease_revoke(e->etcd, e->lease, why, sizeof(why));
    e->lease = 0;
    return rc ? rc : look(e, &held, &rev, err, errlen);
  }
  e->rev = rev; /* the put's revision: the key's create_revision */
  e->renewed_ns = lynx_now_ns();
  pthread_mutex_lock(&c->lock);
  rc = reload(e, err, errlen);
  if (!rc) {
    e->store->fence_key = e->key;
    e->store->fence_rev = e->rev;
    snprintf(c->leader_api, sizeof(c->leader_api), "%s", e->my_api);
    lynx_ev_add(&c->reg.ev, LYNX_EV_LEADER, e->my_api,
                "this coordinator (API %s) leads: nodes and frontends "
                "register with it", e->my_api);
  }
  pthread_mutex_unlock(&c->lock);
  if (rc) {
    /* what etcd holds does not load: do not lead on a partial state */
    LYNX_ERR(COMP, "won the election but cannot load the state: %s", err);
    step_down(e, "state not loadable");
    return rc;
  }
  set_role(e, 1);
  LYNX_INFO(COMP, "leading (etcd %s, lease %lld, %u s)", e->key,
            (long long)e->lease, e->ttl_s);
  return 1;
}

/* A follower's registry follows what etcd holds (reads answer it). */
static int follow(struct lynx_elect *e, char *err, size_t errlen) {
  struct lynx_store_etcd probe = *e->store;
  uint64_t sig, now = lynx_now_ns();
  int rc;
  /* read everything only when the watch saw a change (or could not say),
   * and every FOLLOW_FULL_MS whatever it says */
  if (!e->follow_due && now - e->followed_ns < FOLLOW_FULL_MS * 1000000ull)
    return 0;
  probe.etcd = e->etcd; /* the election's client: not the API's */
  rc = lynx_store_etcd_sig(&probe, &sig, err, errlen);
  if (!rc) {
    e->follow_due = 0;
    e->followed_ns = now;
  }
  if (rc || sig == e->sig)
    return rc;
  pthread_mutex_lock(&e->c->lock);
  if (!__atomic_load_n(&e->c->leader, __ATOMIC_ACQUIRE))
    rc = reload(e, err, errlen);
  if (!rc)
    e->sig = sig;
  pthread_mutex_unlock(&e->c->lock);
  return rc;
}

static void *elect_main(void *arg) {
  struct lynx_elect *e = arg;
  char err[256];
  uint64_t ttl_ns = (uint64_t)e->ttl_s * 1000000000u;
  uint32_t renew_ms = e->ttl_s * 1000u / 3;
  for (;;) {
    int rc;
    if (!__atomic_load_n(&e->c->leader, __ATOMIC_ACQUIRE)) {
      if (e->stale_lease) { /* see step_down */
        rc = lynx_etcd_lease_revoke(e->etcd, e->stale_lease, err,
                                    sizeof(err));
        if (rc == 0 || rc == -ENOENT) {
          LYNX_INFO(COMP, "revoked the lease of the leader key this "
                    "coordinator held before it stepped down");
          e->stale_lease = 0;
        }
      }
      rc = campaign(e, err, sizeof(err));
      if (rc < 0)
        LYNX_LOG_RL(LYNX_LOG_WARN, COMP, "leader election: %s", err);
      if (rc == 0 && follow(e, err, sizeof(err)) < 0)
        reached(e, err);
      else
        reached(e, rc < 0 ? err : NULL);
      if (rc == 1 ? nap(e, renew_ms) : follower_wait(e))
        break;
      continue;
    }
    {
      int64_t left = 0;
      rc = lynx_etcd_lease_keepalive(e->etcd, e->lease, &left, err,
                                     sizeof(err));
      /* when etcd last answered, for after this leader steps down */
      if (rc)
        reached(e, err);
      else
        e->ok_ns = lynx_now_ns();
      if (!rc && left > 0) {
        int held;
        int64_t rev;
        e->renewed_ns = lynx_now_ns();
        /* the key itself (an operator may have deleted it) */
        if (look(e, &held, &rev, err, sizeof(err)) == 0 &&
            (!held || rev != e->rev))
          step_down(e, "the leader key is not ours any more");
      } else if (!rc) {
        step_down(e, "etcd let the lease expire");
      } else if (lynx_now_ns() - e->renewed_ns > ttl_ns * 2 / 3) {
        /* before etcd can let the key go and another win */
        step_down(e, err);
      } else {
        LYNX_LOG_RL(LYNX_LOG_WARN, COMP, "cannot renew the leader lease "
                    "(%s); stepping down if it lasts %u ms", err,
                    e->ttl_s * 2000u / 3);
      }
    }
    if (nap(e, __atomic_load_n(&e->c->leader, __ATOMIC_ACQUIRE) ? renew_ms
                                                                : FOLLOW_MS))
      break;
  }
  if (__atomic_load_n(&e->c->leader, __ATOMIC_ACQUIRE))
    step_down(e, "stopping (lease revoked: a follower takes over now)");
  return NULL;
}

int lynx_elect_start(struct lynx_elect *e, const char *endpoints,
                     uint32_t timeout_ms, uint32_t ttl_s, const char *id,
                     const char *api, const char *control, char *err,
                     size_t errlen) {
  struct json_object *me = json_object_new_object();
  int rc;
  if (!me)
    return lynx_fail(err, errlen, -ENOMEM, "out of memory");
  json_object_object_add(me, "id", json_object_new_string(id));
  json_object_object_add(me, "api", json_object_new_string(api));
  json_object_object_add(me, "control", json_object_new_string(control));
  snprintf(e->me, sizeof(e->me), "%s",
           json_object_to_json_string_ext(me, JSON_C_TO_STRING_PLAIN));
  json_object_put(me);
  snprintf(e->my_api, sizeof(e->my_api), "%s", api);
  snprintf(e->key, sizeof(e->key), "%sleader", e->store->prefix);
  e->ttl_s = ttl_s;
  e->stop = 0;
  e->lease = e->rev = 0;
  e->sig = 0;
  e->follow_due = 1; /* the first follow reads everything */
  e->ok_ns = lynx_now_ns(); /* as if it had: a start is no outage */
  e->stale_lease = 0;
  e->key_mine = 0;
  /* not known yet: until etcd says otherwise another may lead, and an
   * agent told "no leader" would keep its lease on our word */
  pthread_mutex_lock(&e->c->lock);
  e->c->no_leader = 0;
  pthread_mutex_unlock(&e->c->lock);
  rc = lynx_etcd_open(&e->etcd, endpoints, timeout_ms, err, errlen);
  if (rc)
    return rc;
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->cv, NULL);
  e->c->ha = 1; /* before anyone can ask: followers refuse changes */
  rc = pthread_create(&e->tid, NULL, elect_main, e);
  if (rc) {
    lynx_etcd_close(e->etcd);
    e->etcd = NULL;
    return lynx_fail(err, errlen, -rc, "cannot start the election thread");
  }
  e->started = 1;
  return 0;
}

void lynx_elect_stop(struct lynx_elect *e) {
  if (!e->started)
    return;
  pthread_mutex_lock(&e->mu);
  __atomic_store_n(&e->stop, 1, __ATOMIC_RELEASE); /* follower_wait */
  pthread_cond_signal(&e->cv);
  pthread_mutex_unlock(&e->mu);
  pthread_join(e->tid, NULL);
  e->started = 0;
  lynx_etcd_close(e->etcd);
  e->etcd = NULL;
  pthread_mutex_destroy(&e->mu);
  pthread_cond_destroy(&e->cv);
}
