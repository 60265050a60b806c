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
/* etcd failing this thread for this long (since the first request that
 * failed began): what a follower last read of the leader key may be stale
 * (the leader it names may have stepped down meanwhile: quorum lost), so
 * it knows of no leader. A few polls: a quick failure (a member
 * restarting, its port refused) is retried first; a request that timed
 * out (--etcd-timeout-ms, 1 s by default) is enough on its own. Counted
 * from when the failing request began, not from the last answer, so that
 * a coordinator that did not run (stopped) does not take its own pause
 * for etcd's silence. Agents must hear it well within their lease after
 * the leader stopped answering them (docs/etcd.md). */
#define CUT_OFF_MS (FOLLOW_MS * 3u)
/* a leader whose keepalive failed tries again this soon */
#define RETRY_MS 100u

/* Waits until the monotonic instant until_ns (at most), or less when
 * stopping or woken (lynx_elect_take_epoch); 1 when stopping. */
static int nap_until(struct lynx_elect *e, uint64_t until_ns) {
  struct timespec ts;
  int stop;
  uint64_t now = lynx_now_ns();
  uint64_t ms = until_ns > now ? (until_ns - now + 999999u) / 1000000u : 0;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += (time_t)(ms / 1000u);
  ts.tv_nsec += (long)(ms % 1000u) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&e->mu);
  if (!e->stop && ms)
    pthread_cond_timedwait(&e->cv, &e->mu, &ts);
  stop = e->stop;
  pthread_mutex_unlock(&e->mu);
  return stop;
}

static int leading(const struct lynx_elect *e) {
  return __atomic_load_n(&e->c->leader, __ATOMIC_ACQUIRE);
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

/* No coordinator leads as far as this one can tell once etcd has failed
 * it (err) for longer than CUT_OFF_MS, counted from the first failing
 * request (fail_since_ns); before, nothing changes (a blip). c->lock
 * held. */
static void no_leader_if_cut_off(struct lynx_elect *e, const char *err) {
  struct lynx_coord *c = e->c;
  uint64_t failing_ns = e->fail_since_ns ? lynx_now_ns() - e->fail_since_ns : 0;
  if (failing_ns <= (uint64_t)CUT_OFF_MS * 1000000u)
    return;
  /* a stale leader_api would send API calls (and agents' hopes) to a
   * coordinator that may have stepped down: followers could even
   * redirect to each other */
  c->leader_api[0] = '\0';
  c->no_leader = 1;
  snprintf(c->no_leader_why, sizeof(c->no_leader_why),
           "no coordinator leads: etcd cannot be reached from here "
           "(%.160s; failing for %llu ms): an election waits for its quorum",
           err, (unsigned long long)(failing_ns / 1000000u));
}

/* c->no_leader changed from was: said once (c->lock held). */
static void no_leader_log(struct lynx_coord *c, int was, int lead) {
  if (c->no_leader == was)
    return;
  if (c->no_leader)
    LYNX_WARN(COMP,
              "%s; agents keep their leases meanwhile, API changes "
              "get 503",
              c->no_leader_why);
  else
    LYNX_INFO(COMP, "a leader is known again (%s)",
              lead ? "this coordinator" : c->leader_api);
}

/* The outcome of this round's etcd requests, begun at started_ns (err:
 * NULL when they succeeded), and from it whether this coordinator knows
 * of a leader (c->no_leader, coord.h). */
static void reached(struct lynx_elect *e, const char *err,
                    uint64_t started_ns) {
  struct lynx_coord *c = e->c;
  int lead = leading(e), was;
  if (!err)
    e->fail_since_ns = 0;
  else if (!e->fail_since_ns)
    e->fail_since_ns = started_ns;
  pthread_mutex_lock(&c->lock);
  was = c->no_leader;
  if (lead) {
    c->no_leader = 0;
  } else if (err) {
    no_leader_if_cut_off(e, err); /* a blip keeps what the last read said */
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
  no_leader_log(c, was, lead);
  pthread_mutex_unlock(&c->lock);
}

/* The registry takes what etcd holds: a change of operator intent
 * (c->change_lock, so that no API change is half saved meanwhile), read
 * with this thread's client outside c->lock (a network call), applied
 * under it. win: on winning (rev: the key's create revision), which
 * installs the fence and the leader's API in the same breath; otherwise
 * a follower's, applied only while it does not lead. 0 or -errno. */
static int reload(struct lynx_elect *e, int win, char *err, size_t errlen) {
  struct lynx_coord *c = e->c;
  struct lynx_store_etcd probe = *e->store;
  struct lynx_store_etcd_state st;
  int rc;
  probe.etcd = e->etcd; /* the election's client: not the API's */
  pthread_mutex_lock(&c->change_lock);
  rc = lynx_store_etcd_read(&probe, &st, err, errlen);
  pthread_mutex_lock(&c->lock);
  if (!rc && (win || !leading(e))) {
    uint64_t now = c->now_ms();
    lynx_reg_intent_clear(&c->reg, now);
    rc = lynx_store_etcd_apply(e->store, &st, &c->reg, now, err, errlen);
    c->reg.version++;
    c->on_change(c);
  }
  if (!rc && win) {
    e->store->fence_key = e->key;
    __atomic_store_n(&e->store->fence_rev, e->rev, __ATOMIC_RELEASE);
    snprintf(c->leader_api, sizeof(c->leader_api), "%s", e->my_api);
    lynx_ev_add(&c->reg.ev, LYNX_EV_LEADER, e->my_api,
                "this coordinator (API %s) leads: nodes and frontends "
                "register with it",
                e->my_api);
  }
  pthread_mutex_unlock(&c->lock);
  pthread_mutex_unlock(&c->change_lock);
  json_object_put(st.root);
  return rc;
}

static void set_role(struct lynx_elect *e, int leader) {
  __atomic_store_n(&e->c->leader, leader, __ATOMIC_RELEASE);
  if (e->changed)
    e->changed(e->arg);
}

/* etcd_err: the reason is etcd failing this coordinator (it could not
 * renew): it knows of no leader from now on, not after a poll more, when
 * etcd has failed it for longer than CUT_OFF_MS. */
static void step_down(struct lynx_elect *e, const char *why,
                      const char *etcd_err) {
  struct lynx_coord *c = e->c;
  char err[256];
  int was;
  pthread_mutex_lock(&c->lock);
  __atomic_store_n(&e->store->fence_rev, 0, __ATOMIC_RELEASE);
  __atomic_store_n(&c->lead_until_ns, 0, __ATOMIC_RELEASE);
  c->leader_api[0] = '\0';
  e->n_pool[0] = e->n_pool[1] = 0; /* issued for a lead that is over */
  LYNX_WARN(COMP, "no longer the leader: %s", why);
  was = c->no_leader;
  /* another may win once our key expires: none known, once etcd has
   * failed for as long as a follower waits (a quick error right after
   * this coordinator did not run says nothing of etcd: the follower's
   * next look decides) */
  if (etcd_err)
    no_leader_if_cut_off(e, etcd_err);
  no_leader_log(c, was, 0);
  pthread_mutex_unlock(&c->lock);
  /* the loop then closes the agents' and frontends' connections and
   * releases the nodes (tick.c coord_on_role, registry.h) */
  set_role(e, 0);
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
  e->key_mine = k.n > 0 && strcmp(k.kv[0].value, e->me) == 0 && !leading(e);
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
  uint64_t t0 = lynx_now_ns();
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
  return nap_until(e, t0 + (uint64_t)FOLLOW_MS * 1000000u);
}

/* The leader's lead is vouched for until sent_ns (when the keepalive or
 * grant etcd took was sent) plus 2/3 of the TTL: etcd keeps the key at
 * least a TTL after it received that, and nobody can win before. */
static void vouch(struct lynx_elect *e, uint64_t sent_ns) {
  uint64_t until = sent_ns + (uint64_t)e->ttl_s * 1000000000u * 2 / 3;
  __atomic_store_n(&e->c->lead_until_ns, until, __ATOMIC_RELEASE);
}

/* One campaign: when nobody holds the key, create it on a new lease (a
 * transaction that holds only while it is still absent). 1 when we lead
 * now, 0 when another does, -errno when etcd could not say. */
static int campaign(struct lynx_elect *e, char *err, size_t errlen) {
  struct lynx_etcd_cmp free_key = {e->key, LYNX_ETCD_CREATE, 0, 0, NULL};
  struct lynx_etcd_op put = {LYNX_ETCD_PUT, e->key, e->me, strlen(e->me), 0};
  int won = 0, held, rc;
  int64_t rev = 0;
  uint64_t granted_ns;
  rc = look(e, &held, &rev, err, errlen);
  if (rc || held)
    return rc;
  granted_ns = lynx_now_ns();
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
  rc = reload(e, 1, err, errlen);
  if (rc) {
    /* what etcd holds does not load: do not lead on a partial state */
    LYNX_ERR(COMP, "won the election but cannot load the state: %s", err);
    step_down(e, "state not loadable", NULL);
    return rc;
  }
  vouch(e, granted_ns);
  e->next_ka_ns = granted_ns + (uint64_t)e->ttl_s * 1000000000u / 3;
  e->looked_ns = lynx_now_ns();
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
  rc = reload(e, 0, err, errlen);
  if (!rc)
    e->sig = sig;
  return rc;
}

/* The leader's epochs issued ahead: tops up each kind's pool with fenced
 * puts, while the next keepalive is not due; stops at the first etcd
 * failure (tried again next round). */
static void refill(struct lynx_elect *e) {
  struct lynx_store_etcd probe = *e->store;
  char err[256];
  probe.etcd = e->etcd;
  for (int kind = 0; kind < 2; kind++)
    for (;;) {
      uint64_t epoch;
      int rc, full;
      pthread_mutex_lock(&e->c->lock);
      full = e->n_pool[kind] >= LYNX_EPOCH_POOL;
      probe.fence_rev = __atomic_load_n(&e->store->fence_rev, __ATOMIC_ACQUIRE);
      pthread_mutex_unlock(&e->c->lock);
      if (full || !leading(e) || !probe.fence_rev ||
          lynx_now_ns() >= e->next_ka_ns)
        break;
      rc = lynx_store_etcd_put_epoch(&probe, kind, &epoch, err, sizeof(err));
      if (rc) {
        LYNX_LOG_RL(LYNX_LOG_WARN, COMP, "cannot issue a %s epoch ahead: %s",
                    kind ? "frontend" : "node", err);
        return;
      }
      pthread_mutex_lock(&e->c->lock);
      /* still the lead it was issued under (a step-down empties the pool) */
      if (leading(e) &&
          __atomic_load_n(&e->store->fence_rev, __ATOMIC_ACQUIRE) ==
              probe.fence_rev &&
          e->n_pool[kind] < LYNX_EPOCH_POOL) {
        e->pool[kind][e->n_pool[kind]++] = epoch;
        /* a claim of it is no stranger's (partition.c, adopt_claims) */
        if (kind && epoch > e->c->reg.frontend_epoch)
          e->c->reg.frontend_epoch = epoch;
      }
      pthread_mutex_unlock(&e->c->lock);
    }
}

int lynx_elect_take_epoch(struct lynx_elect *e, struct lynx_registry *r,
                          int frontend, uint64_t *epoch, char *err,
                          size_t errlen) {
  int k = frontend ? 1 : 0;
  if (!leading(e) || !e->n_pool[k]) {
    if (e->started) {
      pthread_mutex_lock(&e->mu);
      pthread_cond_signal(&e->cv);
      pthread_mutex_unlock(&e->mu);
    }
    return lynx_fail(err, errlen, -EAGAIN,
                     "no %s epoch issued ahead yet "
                     "(this coordinator just took the lead, or etcd is slow "
                     "or cannot be reached): try again",
                     frontend ? "frontend" : "node");
  }
  *epoch = e->pool[k][0];
  memmove(&e->pool[k][0], &e->pool[k][1],
          (e->n_pool[k] - 1) * sizeof(e->pool[k][0]));
  e->n_pool[k]--;
  if (*epoch > r->epoch_last)
    r->epoch_last = *epoch;
  if (frontend && *epoch > r->frontend_epoch)
    r->frontend_epoch = *epoch;
  pthread_mutex_lock(&e->mu);
  pthread_cond_signal(&e->cv); /* another is issued */
  pthread_mutex_unlock(&e->mu);
  return 0;
}

/* One round of the leader: the keepalive when it is due (vouching for
 * the lead from its send time), the key looked at once per TTL. */
static void lead_round(struct lynx_elect *e) {
  char err[256];
  uint64_t ttl_ns = (uint64_t)e->ttl_s * 1000000000u;
  uint64_t sent = lynx_now_ns();
  int64_t left = 0;
  int rc;
  if (sent < e->next_ka_ns)
    return;
  rc = lynx_etcd_lease_keepalive(e->etcd, e->lease, &left, err, sizeof(err));
  /* etcd's state, for after this leader steps down */
  reached(e, rc ? err : NULL, sent);
  if (!rc && left > 0) {
    vouch(e, sent);
    e->next_ka_ns = sent + ttl_ns / 3;
    if (lynx_now_ns() - e->looked_ns >= ttl_ns) {
      /* the key itself (an operator may have deleted it) */
      int held;
      int64_t rev;
      e->looked_ns = lynx_now_ns();
      if (look(e, &held, &rev, err, sizeof(err)) == 0 &&
          (!held || rev != e->rev))
        step_down(e, "the leader key is not ours any more", NULL);
    }
  } else if (!rc) {
    step_down(e,
              "etcd let the lease expire (this coordinator did not run, "
              "or could not reach etcd, for longer than it)",
              NULL);
  } else if (lynx_now_ns() >=
             __atomic_load_n(&e->c->lead_until_ns, __ATOMIC_ACQUIRE)) {
    /* before etcd can let the key go and another win */
    step_down(e, err, err);
  } else {
    LYNX_LOG_RL(LYNX_LOG_WARN, COMP,
                "cannot renew the leader lease "
                "(%s); stepping down if it lasts %u ms",
                err, e->ttl_s * 2000u / 3);
    e->next_ka_ns = lynx_now_ns() + (uint64_t)RETRY_MS * 1000000u;
  }
}

static void *elect_main(void *arg) {
  struct lynx_elect *e = arg;
  char err[256];
  for (;;) {
    int rc;
    if (!leading(e)) {
      uint64_t t0 = lynx_now_ns();
      if (e->stale_lease) { /* see step_down */
        rc = lynx_etcd_lease_revoke(e->etcd, e->stale_lease, err, sizeof(err));
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
        reached(e, err, t0);
      else
        reached(e, rc < 0 ? err : NULL, t0);
      if (rc == 1)
        continue; /* lead_round and refill next */
      if (follower_wait(e))
        break;
      continue;
    }
    lead_round(e);
    if (leading(e))
      refill(e);
    if (nap_until(e, leading(e)
                         ? e->next_ka_ns
                         : lynx_now_ns() + (uint64_t)FOLLOW_MS * 1000000u))
      break;
  }
  if (leading(e))
    step_down(e, "stopping (lease revoked: a follower takes over now)", NULL);
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
  e->follow_due = 1;    /* the first follow reads everything */
  e->fail_since_ns = 0; /* a start is no outage */
  e->stale_lease = 0;
  e->key_mine = 0;
  e->n_pool[0] = e->n_pool[1] = 0;
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
