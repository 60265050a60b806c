/*
 * partition.c - several active frontends: which one produces into each
 * instance's region (registry.h, docs/frontends.md).
 *
 * The unit given to a frontend is the instance: one accelerator's region
 * with every mqueue in it. That is the unit each transport fences (one
 * tcp connection, one rdma QP, one shm mapping per region, each presenting
 * one epoch), so one producer per region is one producer per mqueue.
 *
 * Epochs: every instance given to a frontend comes with an epoch issued by
 * the store for that round, newer than anything issued before, so the
 * region's agent admits the new producer and refuses every earlier one (a
 * frontend cut off from us that still writes). An instance moving between
 * two live frontends is first released (the owner answers what it holds,
 * nothing new is sent to it), then given: no loss on a planned move.
 *
 * Partitioning is handed the registry's state and calls nothing back: the
 * registry gives it every instance with what it decides on (whether it is
 * in the dispatch table, the frontend that owns it: struct
 * lynx__part_inst), and it writes the instances' fe_* fields and its own
 * counters and epochs in r, and says whether the table changed; the
 * registry commits the table (lynx_reg_partition, reg_frontend.c). So this
 * file sits below every file of the registry (reg_internal.h).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "reg_internal.h"

#define COMP "registry"
#define EPOCH_RETRY_MS 1000 /* the store could not issue an epoch */
#define EPOCH_WAIT_MS 100   /* ... or had none issued ahead yet (-EAGAIN) */

static int fe_usable(const struct lynx_reg_frontend *f) {
  return f && f->connected && f->active;
}

int lynx__part_owned_by(const struct lynx_reg_instance *i,
                        const struct lynx_reg_frontend *f) {
  return i->fe_owner[0] && !strncmp(i->fe_owner, f->id, sizeof(f->id));
}

static void owner_clear(struct lynx_reg_instance *i) {
  i->fe_owner[0] = '\0';
  i->fe_epoch = 0;
  i->fe_release_version = 0;
  i->fe_release_deadline_ms = 0;
}

/* f runs a table without i and reports nothing outstanding on it. */
static int released(const struct lynx_reg_frontend *f,
                    const struct lynx_reg_instance *i) {
  if (f->table_version_applied < i->fe_release_version)
    return 0;
  for (uint32_t m = 0; m < f->n_mqs; m++)
    if (f->mqs[m].instance_id == i->id && f->mqs[m].outstanding)
      return 0;
  return 1;
}

static int claim_cmp(const void *a, const void *b) {
  uint64_t x = ((const struct lynx_fe_claim *)a)->instance_id;
  uint64_t y = ((const struct lynx_fe_claim *)b)->instance_id;
  return x < y ? -1 : x > y;
}

/* Producers that are gone (not active or not connected: the instance goes
 * to another at once, whose newer epoch fences the old one) and moves whose
 * owner answered what it held. Returns whether the table changed. */
static int drop_owners(struct lynx_registry *r,
                       const struct lynx__part_inst *in, size_t n_in,
                       uint64_t now_ms) {
  int changed = 0;
  for (size_t x = 0; x < n_in; x++) {
    struct lynx_reg_instance *i = in[x].inst;
    struct lynx_reg_frontend *f;
    if (!i->fe_owner[0])
      continue;
    f = in[x].owner;
    if (!fe_usable(f)) {
      changed |= in[x].dispatchable && !i->fe_release_version;
      owner_clear(i);
      continue;
    }
    if (!i->fe_release_version)
      continue;
    if (released(f, i) || now_ms >= i->fe_release_deadline_ms) {
      LYNX_INFO(COMP,
                "service %s: instance %" PRIu64 ": frontend %s %s; "
                "it goes to another frontend",
                i->svc->spec.name, i->id, f->id,
                released(f, i) ? "answered what it held on it"
                               : "did not answer all it held on it within the "
                                 "drain timeout (the rest is fenced)");
      owner_clear(i);
      r->fe_moves++;
      changed = 1;
    }
  }
  return changed;
}

/* Claims (Hello.produces) give an instance back to the frontend with the
 * newest epoch for it: after a restart or an election nobody owns it, and
 * the agents admit that frontend already. An epoch beyond the newest the
 * store issued is not ours (a store wiped since): ignored. */
static int adopt_claims(struct lynx_registry *r,
                        const struct lynx__part_inst *in, size_t n_in) {
  int changed = 0;
  for (struct lynx_reg_frontend *f = r->frontends; f; f = f->next) {
    if (!fe_usable(f) || !f->n_claims)
      continue;
    qsort(f->claims, f->n_claims, sizeof(*f->claims), claim_cmp);
    for (size_t x = 0; x < n_in; x++) {
      struct lynx_reg_instance *i = in[x].inst;
      struct lynx_fe_claim key = {.instance_id = i->id};
      const struct lynx_fe_claim *c =
          bsearch(&key, f->claims, f->n_claims, sizeof(*f->claims), claim_cmp);
      if (!c || !c->epoch || c->epoch > r->frontend_epoch ||
          c->epoch <= i->fe_epoch || c->epoch < i->fe_fence ||
          lynx__part_owned_by(i, f))
        continue;
      if (i->fe_owner[0])
        LYNX_INFO(COMP,
                  "instance %" PRIu64 ": frontend %s presents epoch "
                  "%" PRIu64 ", newer than %s's %" PRIu64 ": it is the "
                  "producer",
                  i->id, f->id, c->epoch, i->fe_owner, i->fe_epoch);
      owner_clear(i);
      snprintf(i->fe_owner, sizeof(i->fe_owner), "%s", f->id);
      i->fe_epoch = i->fe_fence = c->epoch;
      changed = 1;
    }
  }
  return changed;
}

struct fe_load {
  struct lynx_reg_frontend *f;
  int draining;   /* takes nothing, lets go of what it has */
  uint64_t epoch; /* the newest it produces with (assign) */
  uint64_t svc;   /* non-releasing dispatchable instances of the service */
  uint64_t total; /* the same over every service */
};

static size_t fe_index(const struct fe_load *ld, size_t n,
                       const struct lynx_reg_instance *i) {
  for (size_t k = 0; k < n; k++)
    if (lynx__part_owned_by(i, ld[k].f))
      return k;
  return n;
}

/* The frontend to give the next instance of a service: the fewest of it,
 * then the fewest overall (services of one instance each spread too); n
 * when every one drains. */
static size_t least(const struct fe_load *ld, const uint64_t *v, size_t n) {
  size_t best = n;
  for (size_t k = 0; k < n; k++)
    if (!ld[k].draining && (best == n || v[k] < v[best] ||
                            (v[k] == v[best] && ld[k].total < ld[best].total)))
      best = k;
  return best;
}

/* The frontend with the most of a service (not draining: n if all are). */
static size_t most(const struct fe_load *ld, const uint64_t *v, size_t n) {
  size_t best = n;
  for (size_t k = 0; k < n; k++)
    if (!ld[k].draining && (best == n || v[k] > v[best]))
      best = k;
  return best;
}

/* pick leaves ld[k]'s table from the next version on; it moves once ld[k]
 * answered what it holds on it. */
static void release(struct lynx_registry *r, const struct fe_load *ld,
                    struct lynx_reg_instance *pick, uint64_t count,
                    uint64_t now_ms) {
  /* the table committed at the end of this call is the first without it */
  r->table_dirty = 1;
  pick->fe_release_version = r->table_version + 1;
  pick->fe_release_deadline_ms = now_ms + r->drain_timeout_ms;
  LYNX_INFO(COMP,
            "service %s: instance %" PRIu64 " moves from frontend %s "
            "(%" PRIu64 " of the service's instances) %s; %s answers what it "
            "holds on it first",
            pick->svc->spec.name, pick->id, ld->f->id, count,
            ld->draining ? "as it drains"
                         : "to balance the active "
                           "frontends",
            ld->f->id);
}

/* Counts each active frontend's instances of s (and overall when s is
 * NULL); returns how many of s have no producer, and adds those on their
 * way to another (released) to *moving when not NULL. */
static uint64_t count_loads(const struct lynx__part_inst *in, size_t n_in,
                            struct fe_load *ld, size_t n,
                            const struct lynx_reg_service *s,
                            uint64_t *moving) {
  uint64_t unowned = 0;
  for (size_t k = 0; k < n; k++)
    ld[k].svc = 0;
  for (size_t x = 0; x < n_in; x++) {
    const struct lynx_reg_instance *i = in[x].inst;
    size_t k;
    if ((s && i->svc != s) || !in[x].dispatchable)
      continue;
    if (!i->fe_owner[0]) {
      unowned++;
      continue;
    }
    if (i->fe_release_version && moving)
      (*moving)++;
    k = fe_index(ld, n, i);
    if (k < n && !i->fe_release_version) {
      if (s)
        ld[k].svc++;
      else
        ld[k].total++;
    }
  }
  return unowned;
}

/* A frontend with more of s than the others (by more than one, counting
 * the unowned as going to the fewest) releases some: they move once it
 * answered what it holds on them. Returns whether the table changed. */
static int balance(struct lynx_registry *r, const struct lynx__part_inst *in,
                   size_t n_in, struct fe_load *ld, uint64_t *v, size_t n,
                   struct lynx_reg_service *s, uint64_t now_ms) {
  uint64_t moving = 0;
  /* those without a producer and those on their way go to the fewest */
  uint64_t unowned = count_loads(in, n_in, ld, n, s, &moving) + moving;
  int changed = 0;
  if (least(ld, v, n) == n)
    return 0; /* every one drains: none can take what another lets go of */
  for (size_t k = 0; k < n; k++)
    v[k] = ld[k].svc;
  while (unowned--)
    v[least(ld, v, n)]++;
  for (size_t k = 0; k < n; k++) {
    if (!ld[k].draining)
      continue;
    for (size_t x = 0; x < n_in; x++) {
      struct lynx_reg_instance *i = in[x].inst;
      if (i->svc == s && in[x].dispatchable && !i->fe_release_version &&
          lynx__part_owned_by(i, ld[k].f)) {
        release(r, &ld[k], i, v[k]--, now_ms);
        v[least(ld, v, n)]++;
        changed = 1;
      }
    }
  }
  for (;;) {
    size_t hi = most(ld, v, n), lo = least(ld, v, n);
    struct lynx_reg_instance *pick = NULL;
    if (v[hi] <= v[lo] + 1)
      break;
    for (size_t x = 0; x < n_in; x++) {
      struct lynx_reg_instance *i = in[x].inst;
      if (i->svc == s && in[x].dispatchable && !i->fe_release_version &&
          lynx__part_owned_by(i, ld[hi].f) && (!pick || i->id > pick->id))
        pick = i;
    }
    if (!pick)
      break; /* its count was of instances not yet owned */
    release(r, &ld[hi], pick, v[hi], now_ms);
    v[hi]--;
    v[lo]++;
    changed = 1;
  }
  return changed;
}

/* One new epoch from the store for this round (*round: 0 until issued);
 * 0, or -errno (logged; the next try waits EPOCH_RETRY_MS, or
 * EPOCH_WAIT_MS for -EAGAIN: none issued ahead yet). */
static int round_epoch(struct lynx_registry *r, uint64_t *round,
                       uint64_t now_ms) {
  int rc = 0;
  if (*round)
    return 0;
  if (now_ms < r->fe_epoch_retry_ms)
    return -EAGAIN;
  if (r->ops.issue_epoch) {
    rc = r->ops.issue_epoch(r->ops.data, round);
  } else {
    *round = ++r->epoch_last;
    r->frontend_epoch = *round;
  }
  if (!rc && *round)
    return 0;
  *round = 0;
  if (rc == -EAGAIN) {
    /* none issued ahead yet (elect.h): one is on its way, not a failure */
    r->fe_epoch_retry_ms = now_ms + EPOCH_WAIT_MS;
    return rc;
  }
  r->fe_epoch_retry_ms = now_ms + EPOCH_RETRY_MS;
  LYNX_LOG_RL(LYNX_LOG_ERROR, COMP,
              "instances wait for a frontend: no "
              "frontend epoch could be issued (%s); retrying in %d ms",
              rc ? strerror(-rc) : "the store issued 0", EPOCH_RETRY_MS);
  return rc ? rc : -EIO;
}

/* Gives every unowned dispatchable instance to an active frontend. A fresh
 * one (started by this registry, never given: its region admitted no
 * producer) takes the epoch its frontend has already, if any; every other
 * needs the round's epoch, issued once (a store round trip) for all of
 * them. Returns how many were given. */
static uint64_t assign(struct lynx_registry *r,
                       const struct lynx__part_inst *in, size_t n_in,
                       struct fe_load *ld, uint64_t *v, size_t n,
                       uint64_t now_ms) {
  uint64_t round = 0, given = 0, reused = 0;
  int no_epoch = 0;
  for (size_t k = 0; k < n; k++) {
    ld[k].total = 0;
    ld[k].epoch = 0;
  }
  for (size_t x = 0; x < n_in; x++) {
    const struct lynx_reg_instance *i = in[x].inst;
    size_t k = i->fe_owner[0] ? fe_index(ld, n, i) : n;
    if (k < n && i->fe_epoch > ld[k].epoch)
      ld[k].epoch = i->fe_epoch;
  }
  if (!count_loads(in, n_in, ld, n, NULL, NULL) ||
      least(ld, v, n) == n) /* every one drains: nobody to give them */
    return 0;
  for (struct lynx_reg_service *s = r->services; s; s = s->next) {
    if (!count_loads(in, n_in, ld, n, s, NULL))
      continue;
    for (size_t k = 0; k < n; k++)
      v[k] = ld[k].svc;
    for (size_t x = 0; x < n_in; x++) {
      struct lynx_reg_instance *i = in[x].inst;
      size_t k;
      uint64_t e;
      if (i->svc != s || i->fe_owner[0] || !in[x].dispatchable)
        continue;
      k = least(ld, v, n);
      if (k == n)
        break; /* every one drains: it waits for one that does not */
      e = i->fe_fresh ? ld[k].epoch : 0;
      reused += e != 0;
      if (!e) {
        if (no_epoch || round_epoch(r, &round, now_ms)) {
          no_epoch = 1;
          continue; /* waits for an epoch */
        }
        e = round;
      }
      snprintf(i->fe_owner, sizeof(i->fe_owner), "%s", ld[k].f->id);
      i->fe_epoch = e;
      if (e > i->fe_fence)
        i->fe_fence = e;
      i->fe_fresh = 0;
      if (e > ld[k].epoch)
        ld[k].epoch = e;
      v[k]++;
      ld[k].total++;
      given++;
    }
  }
  r->fe_assigned += given;
  if (given)
    LYNX_INFO(COMP,
              "%" PRIu64 " instances given to %zu active frontends: "
              "%" PRIu64 " with the new epoch %" PRIu64 " (agents refuse "
              "every earlier producer of them), %" PRIu64 " new regions with "
              "the epoch their frontend has",
              given, n, given - reused, round, reused);
  return given;
}

int lynx__part_round(struct lynx_registry *r, const struct lynx__part_inst *in,
                     size_t n_in, uint64_t now_ms) {
  struct fe_load *ld = NULL;
  uint64_t *v = NULL;
  size_t n = 0, k = 0;
  int changed = drop_owners(r, in, n_in, now_ms);
  for (struct lynx_reg_frontend *f = r->frontends; f; f = f->next)
    n += fe_usable(f);
  if (!n)
    goto out;
  changed |= adopt_claims(r, in, n_in);
  ld = calloc(n, sizeof(*ld));
  v = calloc(n, sizeof(*v));
  if (!ld || !v) {
    LYNX_LOG_RL(LYNX_LOG_ERROR, COMP,
                "out of memory partitioning instances "
                "among frontends; retrying at the next tick");
    goto out;
  }
  for (struct lynx_reg_frontend *f = r->frontends; f; f = f->next)
    if (fe_usable(f)) {
      ld[k].draining = f->drain_intent;
      ld[k++].f = f;
    }
  count_loads(in, n_in, ld, n, NULL, NULL);
  for (struct lynx_reg_service *s = r->services; s; s = s->next)
    changed |= balance(r, in, n_in, ld, v, n, s, now_ms);
  changed |= assign(r, in, n_in, ld, v, n, now_ms) != 0;
out:
  free(ld);
  free(v);
  return changed;
}
