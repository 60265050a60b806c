/*
 * tcp_agent.c - the agent side of the tcp transport: the handle
 * agent_create returns (struct tcp_agent), its listener, thread and stop,
 * and the regions allocated, exported and freed through it. The
 * connections it accepts are tcp_agent_conn.c's (transport_tcp.c has the
 * design).
 *
 * Agent threads: one libuv loop thread per handle (struct tcp_agent, from
 * agent_create) serves every connection of every region exported through
 * it; the handle also owns the data port's guard (connguard.h). An
 * exported region is reference-counted: region_free unlists it and asks
 * the server thread to close its connections; its memory goes with the
 * last reference.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <uv.h>

#include "connguard.h"
#include "log.h"
#include "mqueue.h"
#include "tcp_auth.h"
#include "tcp_internal.h"
#include "transport.h"
#include "util.h"

/* ---- pushing (tcp_agent_conn.c has the protocol) ----------------------- */

/* An accelerator rang: what it published goes out now. */
static void srv_on_bell(uv_poll_t *p, int status, int events) {
  struct tcp_agent *srv = p->data;
  (void)status;
  (void)events;
  lynx_bell_drain(&srv->bell);
  lynx__tcp_srv_push_all(srv, 0);
}

static void srv_on_tick(uv_timer_t *t) { lynx__tcp_srv_push_all(t->data, 1); }
/* A pass of the loop that does not block: the accelerators it waits for
 * may need the core. */
static void srv_on_spin(uv_idle_t *i) {
  (void)i;
  sched_yield();
}

/* Before the loop blocks: the bell named where accelerators ring (then
 * whatever came before it was named is pushed), and the regions that do
 * not ring watched: a spin (the idle handle keeps the loop from blocking)
 * while answers are owed, else the tick. */
static void srv_on_prepare(uv_prepare_t *p) {
  struct tcp_agent *srv = p->data;
  int need;
  if (srv->bell.fd >= 0)
    lynx__tcp_srv_arm(srv, 1);
  lynx__tcp_srv_push_all(srv, 0);
  need = lynx__tcp_srv_watch(srv, lynx_now_ns());
  if ((need == 2) != srv->spinning) {
    srv->spinning = need == 2;
    if (srv->spinning)
      uv_idle_start(&srv->spin, srv_on_spin);
    else
      uv_idle_stop(&srv->spin);
  }
  if ((need == 1) != srv->ticking) {
    srv->ticking = need == 1;
    if (srv->ticking)
      uv_timer_start(&srv->tick, srv_on_tick, TCP_TICK_MS, TCP_TICK_MS);
    else
      uv_timer_stop(&srv->tick);
  }
}

/* Awake: no bell wanted until the loop is about to block again. */
static void srv_on_check(uv_check_t *c) {
  struct tcp_agent *srv = c->data;
  if (srv->bell.fd >= 0)
    lynx__tcp_srv_arm(srv, 0);
}

/* The thread's bell and the handles of pushing. Without a bell (none
 * could be bound) every subscribed region is watched instead. */
static void push_handles_init(struct tcp_agent *srv) {
  int rc = lynx_bell_open(&srv->bell);
  srv->answer_ns = TCP_SPIN_PAYS_NS / 2; /* spun for until measured */
  if (rc)
    LYNX_WARN("tcp",
              "agent: no response bell (%s): regions of CPU accelerators "
              "are watched for answers to push instead",
              strerror(-rc));
  uv_prepare_init(&srv->loop, &srv->prep);
  uv_check_init(&srv->loop, &srv->check);
  uv_idle_init(&srv->loop, &srv->spin);
  uv_timer_init(&srv->loop, &srv->tick);
  srv->prep.data = srv->check.data = srv->spin.data = srv->tick.data = srv;
  uv_prepare_start(&srv->prep, srv_on_prepare);
  uv_check_start(&srv->check, srv_on_check);
  if (srv->bell.fd >= 0) {
    uv_poll_init(&srv->loop, &srv->bell_poll, srv->bell.fd);
    srv->bell_poll.data = srv;
    uv_poll_start(&srv->bell_poll, UV_READABLE, srv_on_bell);
  }
}

static void push_handles_close(struct tcp_agent *srv) {
  uv_close((uv_handle_t *)&srv->prep, NULL);
  uv_close((uv_handle_t *)&srv->check, NULL);
  uv_close((uv_handle_t *)&srv->spin, NULL);
  uv_close((uv_handle_t *)&srv->tick, NULL);
  if (srv->bell.fd >= 0)
    uv_close((uv_handle_t *)&srv->bell_poll, NULL);
}

static void srv_on_wake(uv_async_t *a) {
  struct tcp_agent *srv = a->data;
  int stop;
  lynx__tcp_srv_sweep(srv);
  pthread_mutex_lock(&srv->lock); /* (see lynx__tcp_agent_destroy) */
  stop = srv->stop;
  pthread_mutex_unlock(&srv->lock);
  if (stop) {
    lynx__tcp_srv_close_all(srv);
    push_handles_close(srv);
    uv_close((uv_handle_t *)&srv->listener, NULL);
    uv_close((uv_handle_t *)&srv->wake, NULL);
    uv_close((uv_handle_t *)&srv->sweep, NULL);
  }
}

static void srv_on_sweep(uv_timer_t *t) { lynx__tcp_srv_sweep(t->data); }

static void *srv_main(void *arg) {
  struct tcp_agent *srv = arg;
  prctl(PR_SET_NAME, "lynx-tcp-srv");
  uv_run(&srv->loop, UV_RUN_DEFAULT);
  return NULL;
}

int lynx__tcp_agent_start(const struct lynx_transport_ops *ops,
                          const struct lynx_transport_opts *o,
                          struct lynx_transport_agent **out, char *err,
                          size_t errlen) {
  struct sockaddr_storage ss;
  struct tcp_agent *srv;
  int len = sizeof(ss), rc;
  if (lynx_parse_hostport(o->listen, &ss)) {
    snprintf(err, errlen,
             "tcp transport: bad listen address '%s' "
             "(expected host:port)",
             o->listen);
    return -EINVAL;
  }
  srv = calloc(1, sizeof(*srv));
  if (!srv) {
    snprintf(err, errlen, "tcp transport: out of memory");
    return -ENOMEM;
  }
  srv->base.ops = ops;
  srv->base.guard = &srv->guard;
  srv->base.share = o->share;
  lynx_guard_init(&srv->guard, o->conn_max, o->unauth_max, o->per_source);
  pthread_mutex_init(&srv->lock, NULL);
  rc = uv_loop_init(&srv->loop);
  if (rc)
    goto fail_msg;
  uv_tcp_init(&srv->loop, &srv->listener);
  uv_async_init(&srv->loop, &srv->wake, srv_on_wake);
  uv_timer_init(&srv->loop, &srv->sweep);
  srv->listener.data = srv->wake.data = srv->sweep.data = srv;
  push_handles_init(srv);
  rc = uv_tcp_bind(&srv->listener, (struct sockaddr *)&ss, 0);
  if (!rc)
    rc = uv_listen((uv_stream_t *)&srv->listener, 256, lynx__tcp_srv_on_conn);
  if (!rc)
    rc = uv_tcp_getsockname(&srv->listener, (struct sockaddr *)&ss, &len);
  if (rc) {
    snprintf(err, errlen, "tcp transport: cannot listen on %s: %s", o->listen,
             uv_strerror(rc));
    goto fail_loop;
  }
  uv_timer_start(&srv->sweep, srv_on_sweep, 1000, 1000);
  lynx_fmt_addr((struct sockaddr *)&ss, srv->base.bound,
                sizeof(srv->base.bound));
  srv->stop = 0;
  rc = pthread_create(&srv->thread, NULL, srv_main, srv);
  if (rc) {
    snprintf(err, errlen, "tcp transport: cannot start its thread: %s",
             strerror(rc));
    rc = -rc;
    goto fail_loop;
  }
  srv->running = 1;
  *out = &srv->base;
  return 0;
fail_loop:
  push_handles_close(srv);
  uv_close((uv_handle_t *)&srv->listener, NULL);
  uv_close((uv_handle_t *)&srv->wake, NULL);
  uv_close((uv_handle_t *)&srv->sweep, NULL);
  uv_run(&srv->loop, UV_RUN_DEFAULT);
  uv_loop_close(&srv->loop);
  goto fail;
fail_msg:
  snprintf(err, errlen, "tcp transport: cannot listen on %s: %s", o->listen,
           uv_strerror(rc));
fail:
  lynx_bell_close(&srv->bell);
  pthread_mutex_destroy(&srv->lock);
  free(srv);
  return rc;
}

void lynx__tcp_agent_destroy(struct lynx_transport_agent *a) {
  struct tcp_agent *srv;
  int kept;
  if (!a)
    return;
  srv = container_of(a, struct tcp_agent, base);
  if (srv->running) {
    /* stop is written under the lock that srv_on_wake reads it under.
     * A wake sent while another is pending (region_free's, just before)
     * is coalesced with it: uv_async_send sees the pending flag with a
     * plain load and returns, and the one callback that follows must see
     * stop. Unlocked, nothing ordered the store before that load (the CPU
     * may hold a store back past a later load), so the callback could run
     * and read stop as 0, the loop never stopped and the join below hung
     * (fuzz_tcp_agent's timeouts, about one in 100000 inputs). With the
     * lock, either the callback reads stop after this store, or it read
     * it before and then its clearing of the flag came before this send's
     * load, which finds no wake pending and sends one. */
    pthread_mutex_lock(&srv->lock);
    srv->stop = 1;
    pthread_mutex_unlock(&srv->lock);
    uv_async_send(&srv->wake);
    pthread_join(srv->thread, NULL);
    uv_run(&srv->loop, UV_RUN_NOWAIT);
    uv_loop_close(&srv->loop);
    lynx_bell_close(&srv->bell);
    srv->running = 0;
  }
  pthread_mutex_lock(&srv->lock);
  kept = srv->exports != NULL;
  pthread_mutex_unlock(&srv->lock);
  if (kept) { /* their region_free still takes the lock */
    LYNX_WARN("tcp", "agent: transport stopped with regions still exported: "
                     "its handle stays for their region_free");
    return;
  }
  pthread_mutex_destroy(&srv->lock);
  free(srv);
}

int lynx__tcp_region_alloc(struct lynx_transport_agent *a,
                           struct lynx_region *r, const char *name,
                           uint64_t size) {
  return lynx_region_map_served(r, a, name, size);
}

int lynx__tcp_region_attach(struct lynx_transport_agent *a,
                            struct lynx_region *r, const char *name,
                            uint64_t size, const struct lynx_region_mem *mem) {
  int rc = lynx_region_attach_served(r, a, size, mem);
  snprintf(r->name, sizeof(r->name), "%s", name ? name : "");
  return rc;
}

int lynx__tcp_region_export(struct lynx_region *r) {
  struct tcp_agent *srv =
      r->agent ? container_of(r->agent, struct tcp_agent, base) : NULL;
  struct lynx_region_hdr h;
  struct tcp_export *ex;
  if (!srv || (!r->base && !r->mem) || r->priv ||
      lynx_region_read(r, 0, &h, sizeof(h)))
    return -EINVAL;
  ex = calloc(1, sizeof(*ex));
  if (!ex)
    return -ENOMEM;
  if (h.magic != LYNX_REGION_MAGIC ||
      lynx_geom_init(&ex->g, h.n_mqueues, h.slots, h.slot_size,
                     h.large_bytes) ||
      ex->g.region_size > r->size) {
    free(ex);
    return -EINVAL;
  }
  if (getrandom(&ex->key, sizeof(ex->key), 0) != sizeof(ex->key)) {
    free(ex);
    return -EIO;
  }
  ex->id = lynx__tcp_region_id(ex->key);
  ex->srv = srv;
  ex->refs = 1;
  ex->listed = 1;
  ex->base = r->base;
  ex->mem = r->mem;
  ex->size = r->size;
  ex->epoch = h.epoch;
  ex->shared = r->shm[0] != '\0';
  snprintf(ex->fence.name, sizeof(ex->fence.name), "%s",
           r->name[0] ? r->name : r->locator);
  pthread_mutex_lock(&srv->lock);
  ex->next = srv->exports;
  srv->exports = ex;
  pthread_mutex_unlock(&srv->lock);
  r->key = ex->key;
  r->priv = ex;
  r->fence = &ex->fence;
  return 0;
}

void lynx__tcp_region_free(struct lynx_region *r) {
  struct tcp_export *ex = r->priv;
  if (ex) {
    struct tcp_agent *srv = ex->srv;
    struct tcp_export **pp;
    pthread_mutex_lock(&srv->lock);
    ex->listed = 0;
    for (pp = &srv->exports; *pp && *pp != ex; pp = &(*pp)->next)
      ;
    if (*pp)
      *pp = ex->next;
    pthread_mutex_unlock(&srv->lock);
    if (srv->running)
      uv_async_send(&srv->wake); /* close its connections */
    lynx__tcp_export_put(ex);    /* memory goes with the last connection */
    lynx_region_unmap_served(r, 0);
  } else if (r->mem) {
    r->mem->release(r->mem->ctx);
  } else {
    lynx_region_unmap_served(r, 1);
  }
  r->base = NULL;
  r->mem = NULL;
  r->priv = NULL;
  r->fence = NULL;
}
