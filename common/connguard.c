/* connguard.c - connection caps and authentication back-off; see
 * connguard.h. */
#include "connguard.h"

#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#include "prom.h"
#include "util.h"

const char *const lynx_guard_reason_names[LYNX_GUARD_REASONS] = {
    "admitted", "conn_max", "unauth_max", "per_source"};

static void add(uint64_t *v, int64_t d) {
  __atomic_store_n(v, __atomic_load_n(v, __ATOMIC_RELAXED) + (uint64_t)d,
                   __ATOMIC_RELAXED);
}

void lynx_guard_init(struct lynx_guard *g, uint32_t conn_max,
                     uint32_t unauth_max, uint32_t per_source) {
  memset(g, 0, sizeof(*g));
  g->conn_max = conn_max;
  g->unauth_max = unauth_max;
  g->per_source = per_source;
}

/* The record of key: found, a free one, or the least recently seen one
 * with no connection pending; NULL when every record has one pending. */
static struct lynx_guard_src *src_find(struct lynx_guard *g,
                                       const uint8_t key[16], uint64_t now) {
  struct lynx_guard_src *free_src = NULL, *old = NULL;
  for (int i = 0; i < LYNX_GUARD_SOURCES; i++) {
    struct lynx_guard_src *s = &g->src[i];
    if (!s->used) {
      if (!free_src)
        free_src = s;
      continue;
    }
    if (!memcmp(s->addr, key, 16))
      return s;
    if (!s->unauth && (!old || s->last_ns < old->last_ns))
      old = s;
  }
  if (!free_src)
    free_src = old;
  if (free_src) {
    memset(free_src, 0, sizeof(*free_src));
    memcpy(free_src->addr, key, 16);
    free_src->used = 1;
    free_src->last_ns = now;
  }
  return free_src;
}

enum lynx_guard_refusal lynx_guard_admit(struct lynx_guard *g,
                                         const struct sockaddr_storage *peer,
                                         uint64_t now_ns,
                                         struct lynx_guard_src **src) {
  uint8_t key[16];
  struct lynx_guard_src *s = NULL;
  enum lynx_guard_refusal why = LYNX_GUARD_ADMIT;
  *src = NULL;
  if (peer && lynx_addr_key((const struct sockaddr *)peer, key) == 0)
    s = src_find(g, key, now_ns);
  if (g->conn_max && g->open >= g->conn_max)
    why = LYNX_GUARD_CONN_MAX;
  else if (g->unauth_max && g->unauth >= g->unauth_max)
    why = LYNX_GUARD_UNAUTH_MAX;
  else if (g->per_source && s && s->unauth >= g->per_source)
    why = LYNX_GUARD_PER_SOURCE;
  if (why != LYNX_GUARD_ADMIT) {
    add(&g->refused[why], 1);
    return why;
  }
  if (s) {
    s->unauth++;
    s->last_ns = now_ns;
  }
  add(&g->accepted, 1);
  add(&g->open, 1);
  add(&g->unauth, 1);
  *src = s;
  return LYNX_GUARD_ADMIT;
}

void lynx_guard_auth_ok(struct lynx_guard *g, struct lynx_guard_src *src) {
  add(&g->auth_ok, 1);
  add(&g->unauth, -1);
  if (src) {
    src->unauth--;
    src->failures = 0;
    src->backoff_ns = 0;
  }
}

uint64_t lynx_guard_auth_failed(struct lynx_guard *g,
                                struct lynx_guard_src *src, uint64_t now_ns) {
  add(&g->auth_failed, 1);
  if (!src)
    return 0;
  src->last_ns = now_ns;
  if (!src->failures || now_ns - src->first_fail_ns > LYNX_GUARD_WINDOW_NS) {
    src->failures = 0; /* a new window */
    src->backoff_ns = 0;
    src->first_fail_ns = now_ns;
  }
  if (++src->failures <= LYNX_GUARD_FAILS_FREE)
    return 0;
  src->backoff_ns =
      src->backoff_ns ? src->backoff_ns * 2 : LYNX_GUARD_BACKOFF_MIN_NS;
  if (src->backoff_ns > LYNX_GUARD_BACKOFF_MAX_NS)
    src->backoff_ns = LYNX_GUARD_BACKOFF_MAX_NS;
  src->first_fail_ns = now_ns; /* the window runs from the latest */
  add(&g->delayed, 1);
  return src->backoff_ns;
}

void lynx_guard_closed(struct lynx_guard *g, struct lynx_guard_src *src,
                       int authed) {
  add(&g->open, -1);
  if (authed)
    return;
  add(&g->unauth, -1);
  if (src && src->unauth)
    src->unauth--;
}

/* A family's name and HELP text, both built from the guard's prefix and
 * port description. */
static void family(FILE *f, char *name, size_t nsz, const char *prefix,
                   const char *suffix, const char *type, const char *help) {
  snprintf(name, nsz, "%s%s", prefix, suffix);
  lynx_prom_family(f, name, type, help);
}

void lynx_guard_metrics(FILE *f, const char *prefix, const char *what,
                        const struct lynx_guard *g) {
  uint64_t open = lynx_guard_get(&g->open), unauth = lynx_guard_get(&g->unauth);
  char name[160], help[256];
  snprintf(help, sizeof(help),
           "Open connections to the %s, by whether they authenticated.", what);
  family(f, name, sizeof(name), prefix, "_connections", "gauge", help);
  lynx_prom_u64(f, name,
                (const struct lynx_prom_label[]){{"state", "authenticated"},
                                                 {NULL, NULL}},
                open >= unauth ? open - unauth : 0);
  lynx_prom_u64(f, name,
                (const struct lynx_prom_label[]){{"state", "unauthenticated"},
                                                 {NULL, NULL}},
                unauth);
  snprintf(help, sizeof(help), "Connections to the %s admitted.", what);
  family(f, name, sizeof(name), prefix, "_connections_accepted_total",
         "counter", help);
  lynx_prom_u64(f, name, NULL, lynx_guard_get(&g->accepted));
  snprintf(help, sizeof(help),
           "Connections to the %s closed at once, by the cap they met.", what);
  family(f, name, sizeof(name), prefix, "_connections_refused_total", "counter",
         help);
  for (int r = 1; r < LYNX_GUARD_REASONS; r++)
    lynx_prom_u64(f, name,
                  (const struct lynx_prom_label[]){
                      {"reason", lynx_guard_reason_names[r]}, {NULL, NULL}},
                  lynx_guard_get(&g->refused[r]));
  snprintf(help, sizeof(help),
           "Connections to the %s that presented a wrong credential.", what);
  family(f, name, sizeof(name), prefix, "_auth_failures_total", "counter",
         help);
  lynx_prom_u64(f, name, NULL, lynx_guard_get(&g->auth_failed));
  family(f, name, sizeof(name), prefix, "_auth_delayed_total", "counter",
         "Refusals held back because their source kept presenting wrong "
         "credentials.");
  lynx_prom_u64(f, name, NULL, lynx_guard_get(&g->delayed));
}
