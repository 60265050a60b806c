/*
 * worker.c - the frontend's worker thread: its loop, its command queue,
 * its start and stop. The data path itself is in the components the loop
 * drives (frontend.h): the Message Dispatcher (dispatcher.c) receives and
 * writes requests, the Remote Message Queue Manager (rmq.c) rings the
 * doorbells and polls each accelerator connection, the Message Forwarder
 * (forwarder.c) sends the responses; tcpsvc.c and backend.c resume what
 * waited for room.
 *
 * Owns: the thread, its libuv loop and wake-up, the service's socket
 * (opened by the dispatcher or tcpsvc.c, retried while the port is taken),
 * the command queue from the main thread (accelerators added, removed,
 * lost), the tag table's expiry, the wiring of the components (each made
 * at set-up with its options and pointers to the parts of this worker it
 * reaches: worker_setup), and the manager's hooks (struct fe_rmq_hooks,
 * their context this worker), which connect the manager to the layers
 * above it.
 *
 * Polling (docs/design.md, "Adaptive polling"): with nothing outstanding
 * the worker keeps an estimate of how long it waits for its next datagram,
 * spins (yielding) only where that is shorter than a sleep and wake-up
 * would cost, and otherwise sleeps in ppoll on libuv's backend fd (and the
 * io_uring receive ring's, rxring.h) until a datagram or timer. With
 * requests outstanding it waits for responses the same way where each
 * connection waited on can wake it: a remote transport's fd, or over shm
 * the worker's response doorbell (common/bell.h), which a CPU accelerator
 * rings when it publishes while the worker sleeps; otherwise (a GPU over
 * shm) it spins for spin_us, then sleeps for a short, growing timeout.
 * --poll busy never sleeps.
 */
#include <errno.h>
#include <sched.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <unistd.h>

#include "frontend.h"
#include "spin.h"
#include "log.h"

#define MAX_BACKOFF_NS (500u * 1000u)
#define MIN_SLEEP_NS (2u * 1000u)
/* A single long wait (an idle minute) counts as this much, so the estimate
 * comes back down within a dozen short waits when traffic returns. */
#define WAIT_SAMPLE_MAX_NS (1000u * 1000u)
#define WAIT_SHIFT 3 /* the estimate is an EWMA with weight 1/8 */
#define EXPIRE_EVERY_NS (10u * 1000u * 1000u)
/* the longest sleep of a worker with nothing in flight and nothing to
 * retry: a wake-up a second */
#define IDLE_SLEEP_MAX_NS (1000ull * 1000u * 1000u)
#define FE_WAIT_FDS 64 /* remote connections a sleeping worker watches */
/* libuv's loop runs every pass where it carries data; otherwise at least
 * this often (and whenever its fd woke a sleep) */
#define UV_EVERY_NS (1000u * 1000u)

/* ---- the manager's hooks -------------------------------------------- */

/* A request on a connection that went down (or left at the shutdown
 * deadline) ends unanswered; a TCP client's stream cannot stay in step. */
static void on_lost(void *arg, const struct lynx_tag_entry *e) {
  struct fe_worker *w = arg;
  fe_flow_done(&w->ingress, e);
  if (w->fe->proto == FE_PROTO_TCP)
    fe_tcp_abort(&w->tcpsvc, e->cli, e->cli_gen);
}

/* The connection set changed: room for the responses of one forwarder
 * pass (a larger buffer than needed is harmless if the rebuild then
 * fails), then the dispatch order. */
static int on_conns_changed(void *arg) {
  struct fe_worker *w = arg;
  int rc = fe_forwarder_reserve(&w->egress);
  return rc ? rc : fe_dispatcher_rebuild(&w->ingress);
}

/* A TX slot: the Message Forwarder's (a direct jump, per slot). */
static int on_slot(void *arg, struct fe_mq *mq, const uint8_t *slot,
                   uint32_t pos, const uint8_t *large, uint32_t large_len) {
  struct fe_worker *w = arg;
  return fe_forward_slot(&w->egress, mq, slot, pos, large, large_len);
}

static int on_be_open(void *arg, struct fe_mq *mq,
                      const struct fe_backend_cfg *cfg) {
  struct fe_worker *w = arg;
  return fe_backend_open(&w->backends, mq, cfg);
}

static const struct fe_rmq_hooks rmq_hooks = {
    .changed = on_conns_changed,
    .slot = on_slot,
    .lost = on_lost,
    .be_open = on_be_open,
    .be_close = fe_backend_close,
};

/* ---- loop ----------------------------------------------------------- */

static void on_expire(void *arg, const struct lynx_tag_entry *e) {
  struct fe_worker *w = arg;
  struct fe_mq *mq = fe_rmq_mq(&w->rmq, e->mq);
  fe_flow_done(&w->ingress, e);
  if (w->fe->proto == FE_PROTO_TCP)
    fe_tcp_abort(&w->tcpsvc, e->cli, e->cli_gen);
  if (!mq)
    return;
  fe_mq_outstanding_set(mq, mq->dq.outstanding - 1);
  lynx_cnt_add(&mq->drops[FE_QDROP_EXPIRED], 1);
}

static uint32_t outstanding(const struct fe_worker *w) {
  return w->tags.in_use;
}

/* Before a sleep with responses awaited: each connection waited on adds
 * its transport's fd to pfd (room for up to *nfd + FE_WAIT_FDS) or asks
 * its accelerator to ring the worker's bell. *covered: every one of them
 * can wake the sleep; *armed: some rings the bell; returns 1 when one has
 * published already (arm said so: no sleep). */
static int sleep_prepare(struct fe_worker *w, struct pollfd *pfd, nfds_t *nfd,
                         int *covered, int *armed) {
  nfds_t top = *nfd + FE_WAIT_FDS - 1;
  int ready = 0;
  *covered = 1;
  *armed = 0;
  for (uint32_t i = 0; i < w->rmq.n_conns; i++) {
    struct fe_conn *c = w->rmq.conns[i];
    int awaited = fe_conn_outstanding(c) || c->n_client_mqs, fd, a;
    if (c->state == FE_CONN_DEAD)
      continue;
    /* tcp's polls are reads in flight, and its pushed answers come
     * unasked: its socket wakes us (a pushing one only while answers are
     * awaited: otherwise what it brings waits there, unread) */
    fd = (c->pushing ? !awaited : c->state == FE_CONN_IDLE) || *nfd > top
             ? -1
             : c->tc->ops->wait_fd(c->tc);
    if (fd >= 0) {
      pfd[(*nfd)++] = (struct pollfd){fd, POLLIN, 0};
      continue;
    }
    if (!awaited)
      continue;
    a = w->bell.id ? fe_rmq_arm(c, w->bell.id) : -ENOTSUP;
    if (a == 0) {
      *armed = 1;
      continue;
    }
    *covered = 0;
    ready |= a > 0;
  }
  return ready;
}

/* After the sleep (or instead of it): the bells asked for are withdrawn,
 * the rings that came drained. */
static void sleep_done(struct fe_worker *w, int rang) {
  for (uint32_t i = 0; i < w->rmq.n_conns; i++)
    if (w->rmq.conns[i]->armed)
      fe_rmq_arm(w->rmq.conns[i], 0);
  if (rang)
    lynx_bell_drain(&w->bell);
}

static void on_wake(uv_async_t *a) { (void)a; }

/* Whether libuv must run every pass: it carries the data of the socket
 * receive path, of a TCP service's clients and of client mqueues' back
 * ends. On the uring path with none of those its handles are the wake-up
 * async (commands and stopping are also seen through their flags) and the
 * socket's close, and an epoll_wait per pass was the worker's most
 * frequent system call (one per request at 10,000 requests/s). */
static int uv_every_pass(const struct fe_worker *w) {
  return w->ingress.rx_path != FE_RX_URING || w->fe->proto == FE_PROTO_TCP ||
         w->rmq.n_client_mqs;
}

/* One step of the worker's estimates (EWMAs of weight 1/8): sample, at
 * most cap, taken into *e. */
static void ewma_add(uint64_t *e, uint64_t sample, uint64_t cap) {
  if (sample > cap)
    sample = cap;
  *e = *e - (*e >> WAIT_SHIFT) + (sample >> WAIT_SHIFT);
}

/* This thread's CPU time: what its sleeps cost it. */
static uint64_t thread_cpu_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* ---- the service's socket ----------------------------------------------- */

#define LISTEN_RETRY_MIN_NS (1000ull * 1000000ull)
#define LISTEN_RETRY_MAX_NS (30000ull * 1000000ull)

static int open_listener(struct fe_worker *w) {
  return w->fe->proto == FE_PROTO_TCP ? fe_tcp_open(&w->tcpsvc)
                                      : fe_dispatcher_open_udp(&w->ingress);
}

/* A socket error that another process or the host's configuration causes,
 * and that may go away: the worker keeps trying. */
static int bind_error(int rc) {
  return rc == -EADDRINUSE || rc == -EACCES || rc == -EADDRNOTAVAIL ||
         rc == -EPERM;
}

void fe_listen_error_str(const struct frontend *fe, int err, char *buf,
                         size_t len) {
  char addr[80];
  lynx_fmt_addr((const struct sockaddr *)&fe->udp_addr, addr, sizeof(addr));
  snprintf(buf, len, "cannot bind %s %s: %s",
           fe->proto == FE_PROTO_TCP ? "TCP" : "UDP", addr, strerror(err));
}

int fe_listen_error(const struct frontend *fe) {
  for (uint32_t i = 0; fe->w && i < fe->n_w; i++) {
    int e = __atomic_load_n(&fe->w[i].listen_err, __ATOMIC_RELAXED);
    if (e)
      return e;
  }
  return 0;
}

/* Opens (or tries again to open) the service's socket. A port that is
 * taken is no reason to give up the service: its accelerators are
 * connected meanwhile, the coordinator hears why clients get no answer,
 * and it serves as soon as the port is free. 0, or the error of anything
 * else. */
static int listen_try(struct fe_worker *w) {
  struct frontend *fe = w->fe;
  char why[160];
  int rc = open_listener(w), was = w->listen_err;
  if (!rc) {
    __atomic_store_n(&w->listen_err, 0, __ATOMIC_RELAXED);
    w->listen_wait_ns = 0;
    if (was && w->id == 0) {
      fe_listen_error_str(fe, was, why, sizeof(why));
      LYNX_INFO("frontend",
                "service %s: listening now (the port was taken: "
                "%s)",
                fe->service, why);
    }
    return 0;
  }
  if (!bind_error(rc))
    return rc;
  __atomic_store_n(&w->listen_err, -rc, __ATOMIC_RELAXED);
  w->listen_retry_ns =
      lynx_now_ns() + lynx_backoff_next(&w->listen_wait_ns, LISTEN_RETRY_MIN_NS,
                                        LISTEN_RETRY_MAX_NS, &w->retry_seed);
  if (w->id == 0) {
    fe_listen_error_str(fe, -rc, why, sizeof(why));
    if (!was)
      LYNX_WARN("frontend",
                "service %s: %s; clients get no answer until it "
                "is free (retrying every 1 s to 30 s)",
                fe->service, why);
    else
      LYNX_LOG_RL(LYNX_LOG_INFO, "frontend", "service %s: still %s",
                  fe->service, why);
  }
  return 0;
}

/* ---- commands from the main thread ------------------------------------ */

static void run_commands(struct fe_worker *w) {
  struct fe_cmd *cmd;
  pthread_mutex_lock(&w->cmd_lock);
  cmd = w->cmds;
  w->cmds = NULL;
  w->cmds_tail = &w->cmds;
  __atomic_store_n(&w->cmds_pending, 0, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&w->cmd_lock);
  while (cmd) {
    struct fe_cmd *next = cmd->next;
    struct fe_conn *c;
    switch (cmd->kind) {
    case FE_CMD_ADD:
      if (!fe_rmq_find(&w->rmq, cmd->acc.instance_id, 0))
        fe_rmq_add(&w->rmq, &cmd->acc);
      break;
    case FE_CMD_REMOVE:
      c = fe_rmq_find(&w->rmq, cmd->instance_id, 0);
      if (c)
        fe_rmq_remove(&w->rmq, c);
      break;
    case FE_CMD_LOST:
    case FE_CMD_ABANDON:
      c = fe_rmq_find(&w->rmq, cmd->instance_id, 1);
      if (c) {
        fe_rmq_remove(&w->rmq, c);
        if (cmd->kind == FE_CMD_LOST)
          fe_rmq_down(&w->rmq, c, "its node was declared down", FE_QDROP_LOST);
        else
          fe_rmq_down(&w->rmq, c,
                      "its agent left (its control connection closed)",
                      FE_QDROP_IN_DOUBT);
      }
      break;
    }
    __atomic_store_n(&w->applied_seq, cmd->seq, __ATOMIC_RELEASE);
    free(cmd);
    cmd = next;
  }
  fe_rmq_reap(&w->rmq);
}

/* ---- the thread ------------------------------------------------------ */

static void worker_loop(struct fe_worker *w) {
  struct frontend *fe = w->fe;
  uint64_t last_work, next_expire, backoff = 0, spin_until = 0, uv_next = 0;
  /* expected wait for a datagram with nothing outstanding; a new worker
   * starts asleep */
  uint64_t est = WAIT_SAMPLE_MAX_NS >> WAIT_SHIFT;
  /* expected wait for work with responses outstanding; a new worker
   * starts spinning for them */
  uint64_t est_resp = SPIN_PAYS_NS;
  /* how much later than asked a timed sleep ends: the price of a wake-up
   * in latency; and in CPU, what a sleep that blocked cost this thread
   * (its CPU time across the ppoll: entry, switch out, switch in) */
  uint64_t late = 0, wake_cpu = WAKE_CPU_INIT_NS;
  /* a long wait for a response is slept until a wake-up before its
   * expected end, then spun out (0: no such sleep pending) */
  uint64_t prewake = 0;
  int waiting = 0, resp = 0, ready_streak = 0;
  uint64_t spin_ns = (uint64_t)fe->cfg->spin_us * 1000u;
  uint64_t timeout_ns = (uint64_t)fe->cfg->timeout_ms * 1000000u;
  int busy = fe->cfg->poll == 1, stopping = 0;
  int bfd = uv_backend_fd(&w->loop);
  /* scan the tag table once per quarter timeout, a slice every 10 ms: an
   * expired request is found at most timeout/4 late, and an idle-but-busy
   * table costs little */
  uint64_t slices = timeout_ns / 4 / EXPIRE_EVERY_NS;
  uint32_t expire_budget =
      slices ? (uint32_t)((w->tags.size + slices - 1) / slices) : w->tags.size;
  if (expire_budget < 64)
    expire_budget = 64;

  w->now_ns = last_work = lynx_now_ns();
  next_expire = w->now_ns + EXPIRE_EVERY_NS;
  for (;;) {
    int work;
    w->ingress.got = 0;
    w->now_ns = lynx_now_ns();
    if (__atomic_load_n(&w->cmds_pending, __ATOMIC_ACQUIRE))
      run_commands(w);
    if (w->now_ns >= uv_next || uv_every_pass(w)) {
      uv_run(&w->loop, UV_RUN_NOWAIT);
      uv_next = w->now_ns + UV_EVERY_NS;
    }
    fe_dispatcher_poll(&w->ingress);
    fe_rmq_doorbells(&w->rmq);
    work = (int)w->ingress.got;
    work += fe_forward(&w->egress);
    if (w->tcpsvc.paused)
      work += fe_tcp_resume(&w->tcpsvc);
    if (w->rmq.n_client_mqs)
      work += fe_backend_progress(&w->rmq);
    w->now_ns = lynx_now_ns();
    if (w->now_ns >= next_expire) {
      next_expire = w->now_ns + EXPIRE_EVERY_NS;
      fe_rmq_reap(&w->rmq);
      fe_rmq_retry(&w->rmq, w->now_ns);
      if (w->listen_err && !stopping && w->now_ns >= w->listen_retry_ns)
        listen_try(w);
      if (w->tags.in_use && w->now_ns > timeout_ns)
        lynx_tag_expire(&w->tags, w->now_ns - timeout_ns, expire_budget,
                        on_expire, w);
    }
    if (!stopping && __atomic_load_n(&fe->stopping, __ATOMIC_ACQUIRE)) {
      stopping = 1;
      /* stop receiving; answer what is in flight */
      fe_dispatcher_close_udp(&w->ingress);
      fe_tcp_stop_accepting(&w->tcpsvc);
    }
    if (stopping && (outstanding(w) == 0 || w->now_ns >= fe->stop_deadline_ns))
      break;
    if (work) {
      if (waiting) {
        /* only waits count: back-to-back work says nothing of the gaps
         * a sleep could fill (and under saturation there are none) */
        ewma_add(resp ? &est_resp : &est, w->now_ns - last_work,
                 WAIT_SAMPLE_MAX_NS);
      }
      waiting = 0;
      ready_streak = 0;
      last_work = w->now_ns;
      backoff = 0;
      continue;
    }
    /* the work ran out: what waited for a doorbell goes now */
    fe_rmq_flush_indices(&w->rmq);
    if (busy) {
      lynx_cpu_relax();
      continue;
    }
    if (!waiting) {
      waiting = 1;
      resp = outstanding(w) || w->rmq.n_client_mqs;
      /* Where a response can wake a sleep (the last one found every
       * connection waited on armed or with an fd), its wait spins only as
       * long as a datagram's would at that expected wait. Where none can,
       * the wait keeps the whole --spin-us, then short sleeps (below):
       * sleeping at once, for a time from the estimate, cost ping-pong
       * 1.4x its p50 on the 2-core VM (docs/design.md). */
      spin_until = last_work + (resp && !w->bell_covers
                                    ? spin_ns
                                    : fe_spin_budget(resp ? est_resp : est,
                                                     late, wake_cpu, spin_ns));
      /* A response expected later than two wake-ups from now is slept
       * for (the bell ends the sleep if it comes early) until that much
       * before it is due, then spun for: ping-pong keeps the latency of a
       * spinning wait, the CPU spins only the last stretch. */
      prewake = resp && w->bell_covers && spin_until == last_work &&
                        est_resp > 2 * late + SPIN_PAYS_NS
                    ? last_work + est_resp - 2 * late
                    : 0;
    }
    if (w->now_ns < spin_until) {
      sched_yield();
      continue;
    }
    {
      struct pollfd pfd[3 + FE_WAIT_FDS];
      nfds_t nfd = 1;
      struct timespec ts;
      uint64_t ns;
      int rfd = fe_dispatcher_wait_fd(&w->ingress), armed = 0, bidx = -1;
      nfds_t tfirst = 0, tlast = 0; /* the transports' fds: [tfirst, tlast) */
      pfd[0] = (struct pollfd){bfd, POLLIN, 0};
      if (rfd >= 0) /* datagrams on the uring path */
        pfd[nfd++] = (struct pollfd){rfd, POLLIN, 0};
      if (outstanding(w) || w->rmq.n_client_mqs) {
        /* responses wake us through a remote transport's fd or our bell;
         * where every connection waited on can, a timer would only wake
         * us for nothing */
        int covered;
        tfirst = nfd;
        if (sleep_prepare(w, pfd, &nfd, &covered, &armed) &&
            ready_streak++ < 2) {
          /* published between the last pass and the bell's arming: take
           * it (twice in a row without work: a slot published out of
           * order, waited for on the timer below) */
          sleep_done(w, 0);
          continue;
        }
        /* a wait every connection's fd or bell ends */
        w->bell_covers = covered && (armed || nfd > tfirst);
        tlast = nfd;
        if (armed) {
          bidx = (int)nfd;
          pfd[nfd++] = (struct pollfd){w->bell.fd, POLLIN, 0};
        }
        backoff = backoff ? backoff * 2 : MIN_SLEEP_NS;
        if (backoff > MAX_BACKOFF_NS || covered)
          backoff = MAX_BACKOFF_NS;
        ns = backoff;
        /* with a bell, until the next expiry scan, or the pre-wake */
        if (w->bell_covers && next_expire > w->now_ns + ns)
          ns = next_expire - w->now_ns;
        if (w->bell_covers && prewake > w->now_ns && prewake - w->now_ns < ns)
          ns = prewake - w->now_ns;
      } else {
        /* nothing in flight: a socket, a command or a libuv timer wakes
         * the sleep; the periodic scan (retries, releases, a port to bind
         * again) needs it within 100 ms only when it has work, and an idle
         * service's worker sleeps a second (hundreds of idle services
         * woke 10 times a second each: issue 38) */
        int ms = uv_backend_timeout(&w->loop);
        uint64_t cap = !w->listen_err && fe_rmq_quiet(&w->rmq)
                           ? IDLE_SLEEP_MAX_NS
                           : 100000000ull;
        ns = ms < 0 || (uint64_t)ms * 1000000u > cap ? cap
                                                     : (uint64_t)ms * 1000000u;
      }
      ts.tv_sec = (time_t)(ns / 1000000000u);
      ts.tv_nsec = (long)(ns % 1000000000u);
      {
        uint64_t c0 = thread_cpu_ns(), t0 = lynx_now_ns(), t1, dc;
        int n = ppoll(pfd, nfd, &ts, NULL);
        int rang = n > 0 && bidx >= 0 && pfd[bidx].revents, by_tc = 0;
        for (nfds_t k = tfirst; n > 0 && k < tlast; k++)
          by_tc |= pfd[k].revents != 0;
        t1 = lynx_now_ns();
        dc = thread_cpu_ns() - c0;
        /* a sleep that blocked (most of it off the CPU) tells what a
         * wake-up costs; one that returned at once, only a system call */
        if (t1 - t0 > 2 * dc)
          ewma_add(&wake_cpu, dc, WAKE_CPU_MAX_NS);
        if (armed)
          sleep_done(w, rang);
        if (prewake && t1 >= prewake) {
          /* woken before the response is due: spin for it, a few
           * wake-ups' worth at most, then sleep on the bell */
          uint64_t b = 4 * late + SPIN_PAYS_NS;
          prewake = 0;
          spin_until = t1 + (b < spin_ns ? b : spin_ns);
        }
        lynx_cnt_add(&w->sleeps[n <= 0  ? FE_WAKE_TIMER
                                : rang  ? FE_WAKE_BELL
                                : by_tc ? FE_WAKE_TRANSPORT
                                        : FE_WAKE_FD],
                     1);
        if (n > 0 && pfd[0].revents)
          uv_next = 0; /* libuv has something: run it next pass */
        /* only sleeps that ran out tell how late a wake-up comes */
        if (n == 0 && t1 - t0 > ns)
          ewma_add(&late, t1 - t0 - ns, MAX_BACKOFF_NS);
      }
    }
  }
  /* Whatever is still outstanding is lost to its clients, though its
   * accelerator may still run it: in doubt. */
  for (uint32_t i = 0; i < w->rmq.n_conns; i++)
    for (uint32_t k = 0; k < w->rmq.conns[i]->n_mqs; k++) {
      struct fe_mq *mq = &w->rmq.conns[i]->mqs[k];
      uint32_t n = lynx_tag_release_mq(&w->tags, mq->gid, on_lost, w);
      if (n) {
        lynx_cnt_add(&mq->drops[FE_QDROP_IN_DOUBT], n);
        LYNX_WARN("frontend",
                  "worker %u: %u requests on mqueue %u unanswered "
                  "at the shutdown deadline",
                  w->id, n, mq->gid);
      }
    }
}

static void *worker_main(void *arg) {
  struct fe_worker *w = arg;
  prctl(PR_SET_TIMERSLACK, 1000UL);
  worker_loop(w);
  fe_dispatcher_close_udp(&w->ingress);
  fe_tcp_close_all(&w->tcpsvc);
  /* back-end connections are handles of this loop: closed before it ends */
  for (uint32_t i = 0; i < w->rmq.n_conns; i++)
    for (uint32_t k = 0; k < w->rmq.conns[i]->n_mqs; k++)
      if (w->rmq.conns[i]->mqs[k].be) {
        fe_backend_close(w->rmq.conns[i]->mqs[k].be);
        w->rmq.conns[i]->mqs[k].be = NULL;
      }
  uv_close((uv_handle_t *)&w->wake, NULL);
  uv_run(&w->loop, UV_RUN_DEFAULT);
  if (uv_loop_close(&w->loop) != 0)
    LYNX_WARN("frontend", "worker %u: loop closed with handles open", w->id);
  return NULL;
}

/* ---- set-up (main thread) -------------------------------------------- */

#define FE_TAGS 65536 /* outstanding requests per worker */

static void worker_free(struct fe_worker *w) {
  fe_rmq_free(&w->rmq);
  lynx_bell_close(&w->bell);
  while (w->cmds) {
    struct fe_cmd *c = w->cmds;
    w->cmds = c->next;
    free(c);
  }
  fe_tcp_free(&w->tcpsvc);
  fe_dispatcher_free(&w->ingress);
  fe_forwarder_free(&w->egress);
  lynx_tagtab_free(&w->tags);
  pthread_mutex_destroy(&w->cmd_lock);
}

static int worker_setup(struct frontend *fe, struct fe_worker *w) {
  struct fe_rmq_opts ro = {
      .worker = w->id,
      .n_workers = fe->n_w,
      .backends = fe->backends,
      .n_backends = fe->n_backends,
      .tags = &w->tags,
      .retry_seed = &w->retry_seed,
      .no_push = fe->cfg->tcp_answers == 1,
  };
  struct fe_ingress_opts io = {
      .worker = w->id,
      .service = fe->service,
      .addr = &fe->udp_addr,
      .rcvbuf_kb = fe->cfg->rcvbuf_kb,
      .rx_uring = fe->cfg->rx_uring,
      .policy = (enum lynx_dispatch_policy)fe->cfg->dispatch,
      .flow_order = fe->cfg->order == 0,
      .loop = &w->loop,
      .rmq = &w->rmq,
      .tags = &w->tags,
      .now_ns = &w->now_ns,
      .stopping = &fe->stopping,
  };
  struct fe_tcpsvc_opts to = {
      .worker = w->id,
      .service = fe->service,
      .addr = &fe->udp_addr,
      .fixed_len = fe->fixed_len,
      .loop = &w->loop,
      .ingress = &w->ingress,
      .stopping = &fe->stopping,
  };
  struct fe_egress_opts eo = {
      .worker = w->id,
      .rmq = &w->rmq,
      .tags = &w->tags,
      .ingress = &w->ingress,
      .tcp = fe->proto == FE_PROTO_TCP ? &w->tcpsvc : NULL,
  };
  uint32_t seed;
  int rc;
  fe_rmq_init(&w->rmq, &ro, &rmq_hooks, w);
  pthread_mutex_init(&w->cmd_lock, NULL);
  w->cmds_tail = &w->cmds;
  w->retry_seed = (unsigned)lynx_now_ns() ^ (w->id * 2654435761u);
  w->backends = (struct fe_backend_env){.rmq = &w->rmq,
                                        .loop = &w->loop,
                                        .worker = w->id,
                                        .retry_seed = &w->retry_seed};
  rc = fe_dispatcher_init(&w->ingress, &io);
  if (rc)
    return rc;
  fe_tcp_init(&w->tcpsvc, &to);
  fe_forwarder_init(&w->egress, &eo);
  /* a random first generation: tags of an earlier frontend on the same
   * rings are not mistaken for ours */
  if (getrandom(&seed, sizeof(seed), 0) != sizeof(seed))
    seed = (uint32_t)lynx_now_ns();
  rc = lynx_tagtab_init(&w->tags, FE_TAGS, seed);
  if (rc)
    return rc;
  rc = uv_loop_init(&w->loop);
  if (rc)
    return rc;
  w->loop_ready = 1;
  rc = uv_async_init(&w->loop, &w->wake, on_wake);
  if (rc)
    return rc;
  w->wake.data = w;
  rc = lynx_bell_open(&w->bell);
  if (rc)
    LYNX_INFO("frontend",
              "worker %u: no response doorbell (%s): it waits "
              "for CPU accelerators' answers over shm spinning and on "
              "timers",
              w->id, strerror(-rc));
  return listen_try(w);
}

int fe_workers_start(struct frontend *fe) {
  int rc;
  fe->w = calloc(fe->n_w, sizeof(*fe->w));
  if (!fe->w)
    return -ENOMEM;
  fe->workers_running = 1;
  for (uint32_t i = 0; i < fe->n_w; i++) {
    struct fe_worker *w = &fe->w[i];
    w->fe = fe;
    w->id = i;
    rc = worker_setup(fe, w);
    if (rc) {
      LYNX_ERR("frontend", "service %s worker %u: set-up failed: %s",
               fe->service, i, strerror(rc < 0 ? -rc : rc));
      return rc;
    }
  }
  for (uint32_t i = 0; i < fe->n_w; i++) {
    rc = pthread_create(&fe->w[i].tid, NULL, worker_main, &fe->w[i]);
    if (rc)
      return -rc;
    fe->w[i].started = 1;
  }
  return 0;
}

uint64_t fe_post(struct frontend *fe, enum fe_cmd_kind kind,
                 const struct fe_accel *acc, uint64_t instance_id) {
  uint64_t seq = ++fe->cmd_seq;
  for (uint32_t i = 0; fe->w && i < fe->n_w; i++) {
    struct fe_worker *w = &fe->w[i];
    struct fe_cmd *c = calloc(1, sizeof(*c));
    if (!c) {
      LYNX_ERR("frontend", "out of memory posting a command");
      continue;
    }
    c->kind = kind;
    if (acc)
      c->acc = *acc;
    c->instance_id = instance_id;
    c->seq = seq;
    pthread_mutex_lock(&w->cmd_lock);
    *w->cmds_tail = c;
    w->cmds_tail = &c->next;
    __atomic_store_n(&w->cmds_pending, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&w->cmd_lock);
    if (w->started)
      uv_async_send(&w->wake);
  }
  return seq;
}

int fe_applied(struct frontend *fe, uint64_t seq) {
  for (uint32_t i = 0; fe->w && i < fe->n_w; i++)
    if (fe->w[i].started &&
        __atomic_load_n(&fe->w[i].applied_seq, __ATOMIC_ACQUIRE) < seq)
      return 0;
  return 1;
}

void fe_workers_stop(struct frontend *fe) {
  if (!fe->workers_running)
    return;
  fe->stop_deadline_ns = lynx_now_ns() + (uint64_t)fe->cfg->drain_ms * 1000000u;
  __atomic_store_n(&fe->stopping, 1, __ATOMIC_RELEASE);
  for (uint32_t i = 0; fe->w && i < fe->n_w; i++)
    if (fe->w[i].started)
      uv_async_send(&fe->w[i].wake);
  for (uint32_t i = 0; fe->w && i < fe->n_w; i++)
    if (fe->w[i].started)
      pthread_join(fe->w[i].tid, NULL);
  fe_log_totals(fe); /* final counts, before the workers are freed */
  for (uint32_t i = 0; fe->w && i < fe->n_w; i++) {
    struct fe_worker *w = &fe->w[i];
    if (w->started) {
      /* joined above */
    } else if (w->loop_ready) {
      /* set up but never started: close its handles here */
      fe_dispatcher_close_udp(&w->ingress);
      fe_tcp_close_all(&w->tcpsvc);
      if (w->wake.loop && !uv_is_closing((uv_handle_t *)&w->wake))
        uv_close((uv_handle_t *)&w->wake, NULL);
      uv_run(&w->loop, UV_RUN_DEFAULT);
      uv_loop_close(&w->loop);
    }
    if (w->fe) /* only workers that were set up hold resources */
      worker_free(w);
  }
  free(fe->w);
  fe->w = NULL;
  fe->workers_running = 0;
}
