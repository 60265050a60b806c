/*
 * crashy: a plug-in that fails on purpose, for the fault tests
 * (integration.plugin_faults). It answers every request with its bytes,
 * and on the crash_at-th request an instance has taken (its
 * configuration, default 100) it fails as "how" says: "segv" (a write
 * through a null pointer), "abort", "exit" (exit status 3), "hang"
 * (holds its thread until the instance stops), "fork" (leaves a child
 * that sleeps a minute with its socket, then segv) or "scribble" (writes
 * a wild geometry over its region's header, then segv). "start_ms": N
 * makes every start of an instance take N ms. Counted per instance from
 * its start, so an instance a new process takes over fails again
 * crash_at requests later.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "lynx_app.h"

struct crashy {
  unsigned long crash_at, taken;
  uint32_t n_mqueues;
  char how[12];
};

static volatile int *volatile nowhere; /* NULL, unknown to the compiler */

static int start(const struct lynx_app_start *st, void **state, char *why,
                 size_t whylen) {
  struct crashy *c = calloc(1, sizeof(*c));
  const char *p;
  if (!c) {
    snprintf(why, whylen, "out of memory");
    return -ENOMEM;
  }
  c->crash_at = 100;
  snprintf(c->how, sizeof(c->how), "segv");
  /* {"crash_at": N, "how": "..."}: read without a JSON library, as a
   * plug-in may */
  if ((p = strstr(st->config, "\"crash_at\":")))
    c->crash_at = strtoul(p + 11, NULL, 10);
  if ((p = strstr(st->config, "\"how\":\"")))
    snprintf(c->how, sizeof(c->how), "%.*s", (int)strcspn(p + 7, "\""), p + 7);
  if ((p = strstr(st->config, "\"start_ms\":"))) {
    unsigned long ms = strtoul(p + 11, NULL, 10);
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
  }
  c->n_mqueues = st->n_mqueues;
  if (!c->crash_at || (strcmp(c->how, "segv") && strcmp(c->how, "abort") &&
                       strcmp(c->how, "exit") && strcmp(c->how, "hang") &&
                       strcmp(c->how, "fork") && strcmp(c->how, "scribble"))) {
    snprintf(why, whylen,
             "crash_at must be at least 1 and how one of segv, "
             "abort, exit, hang, fork, scribble");
    free(c);
    return -EINVAL;
  }
  *state = c;
  return 0;
}

/* The region's header, found from the mqueue (whichever it is), given a
 * wild geometry: what the agent must never trust. */
static void scribble(struct lynx_mq *mq, uint32_t n_mqueues) {
  struct lynx_geom g;
  if (lynx_geom_init(&g, n_mqueues, mq->slots, mq->slot_size, mq->large_bytes))
    return;
  for (uint32_t q = 0; q < n_mqueues; q++) {
    struct lynx_region_hdr *h =
        (struct lynx_region_hdr *)(mq->rx - lynx_rx_ring_off(&g, q));
    if (h->magic == LYNX_REGION_MAGIC && h->n_mqueues == n_mqueues) {
      h->n_mqueues = LYNX_MQUEUES_MAX;
      h->slots = LYNX_SLOTS_MAX;
      h->slot_size = LYNX_SLOT_MAX;
      return;
    }
  }
}

static int handle(struct lynx_mq *mq, const struct lynx_msg *req, int *replied,
                  const struct lynx_app_ctx *ctx) {
  struct crashy *c = ctx->state;
  int rc;
  if (__atomic_add_fetch(&c->taken, 1, __ATOMIC_RELAXED) == c->crash_at) {
    if (!strcmp(c->how, "segv"))
      *nowhere = 1;
    else if (!strcmp(c->how, "abort"))
      abort();
    else if (!strcmp(c->how, "exit"))
      exit(3);
    else if (!strcmp(c->how, "fork")) {
      if (fork() == 0) { /* keeps the socket and the region a minute */
        struct timespec ts = {60, 0};
        nanosleep(&ts, NULL);
        _exit(0);
      }
      *nowhere = 1;
    } else if (!strcmp(c->how, "scribble")) {
      scribble(mq, c->n_mqueues);
      *nowhere = 1;
    } else
      while (!*ctx->stop) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
      }
  }
  rc = lynx_send(mq, req->tag, req->data, req->len);
  if (rc == -EAGAIN)
    return -EAGAIN;
  *replied = rc == 0;
  return 0;
}

static void stop(void *state) { free(state); }

static const struct lynx_app_def def = {
    LYNX_APP_DEF_HEAD, .name = "crashy", .help = "echo that fails on purpose",
    .start = start,    .handle = handle, .stop = stop};
LYNX_APP_EXPORT(def)
