/*
 * metrics.c - Prometheus text on --metrics (common/promhttp.c: its own
 * thread).
 *
 * Reads the workers' counters with relaxed loads. The list of services is
 * read under the main thread's list lock, each worker's connections under
 * that worker's lock (taken by the worker only when connections come or
 * go, never on the data path).
 *
 *   GET /metrics  counters per service and per mqueue
 *   GET /healthz  200 "ok" while serving
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend.h"
#include "log.h"
#include "prom.h"
#include "promhttp.h"

/* lynx_frontend_sleeps_total's woken_by labels, by enum fe_wake (the
 * poller that counts them is worker.c's; the names are only labels) */
static const char *const wake_names[FE_WAKE_MAX] = {"bell", "fd", "timer",
                                                    "transport"};

struct metrics_ctx {
  struct frontend **list;
  pthread_mutex_t *lock;
  const uint64_t *table_version;
};

/* The families (fams[] in the enum's order), in the order they are
 * written: the service-level ones, then the per-mqueue ones (F_MQ_FIRST
 * on). The text format wants all of a family's samples in one group after
 * its HELP and TYPE, and the services are walked once, so each family's
 * samples are gathered in a buffer of their own and written after its
 * header. */
enum {
  F_RECEIVED,
  F_DISPATCHED,
  F_RESPONDED,
  F_DROPPED,
  F_TCP_CONNS,
  F_TCP_CLIENTS,
  F_FLOW_MOVES,
  F_RX_PATH,
  F_RX_CALLS,
  F_RX_NOBUFS,
  F_SLEEPS,
  F_TRANSPORT_OPS,
  F_DURATION,
  F_MQ_DISPATCHED,
  F_MQ_RESPONDED,
  F_MQ_DROPPED,
  F_MAX
};
#define F_MQ_FIRST F_MQ_DISPATCHED

static const struct {
  const char *name, *type, *help;
} fams[F_MAX] = {
    {"lynx_frontend_received_total", "counter", "Datagrams received."},
    {"lynx_frontend_dispatched_total", "counter",
     "Requests written to an mqueue."},
    {"lynx_frontend_responded_total", "counter", "Responses sent to clients."},
    {"lynx_frontend_dropped_total", "counter",
     "Requests or responses dropped, by reason."},
    {"lynx_frontend_tcp_connections_total", "counter",
     "TCP service connections: accepted, and closed by reason."},
    {"lynx_frontend_tcp_clients", "gauge", "TCP service connections open now."},
    {"lynx_frontend_flow_moves_total", "counter",
     "Requests of a client flow sent to another mqueue while earlier ones "
     "were in flight (its mqueue left dispatch): answers may be reordered."},
    {"lynx_frontend_rx_path", "gauge",
     "Workers of a UDP service receiving on each path: socket (recvmmsg) "
     "or uring (io_uring multishot recvmsg)."},
    {"lynx_frontend_rx_syscalls_total", "counter",
     "System calls the UDP receive path made: recvmmsg calls (socket), "
     "io_uring_enter calls to arm or cancel the receive (uring)."},
    {"lynx_frontend_rx_nobufs_total", "counter",
     "io_uring receives ended for want of a free buffer (armed again)."},
    {"lynx_frontend_sleeps_total", "counter",
     "Sleeps of the workers' adaptive poller, by what ended them: the "
     "response doorbell a CPU accelerator rings over shm (bell), a "
     "remote transport's socket (transport: an answer pushed or read), "
     "another descriptor (fd: a datagram, a TCP client), or the timeout "
     "(timer)."},
    {"lynx_frontend_transport_ops_total", "counter",
     "Operations the workers posted on their accelerators' transports, by "
     "what they are for: poll (a poll for answers: the control array's "
     "read, or tcp's compound read that carries it), slot_read, "
     "large_read, fence_read (a fenced request's barrier), open_read "
     "(opening, resuming, the takeover scan), request_write, "
     "index_write (a TX consumer index written back), subscribe "
     "(answers asked to be pushed: tcp)."},
    {"lynx_frontend_request_duration_seconds", "histogram",
     "End-to-end time of the requests answered: from their dispatch, in the "
     "worker's pass that received them, to the answer handed to the "
     "kernel. _count equals the responses sent to clients."},
    {"lynx_mqueue_dispatched_total", "counter",
     "Requests written to this mqueue."},
    {"lynx_mqueue_responded_total", "counter",
     "Responses from this mqueue sent to clients."},
    {"lynx_mqueue_dropped_total", "counter",
     "Drops attributed to this mqueue, by reason."},
};

/* Calls fn for every mqueue of every worker of fe (each under its
 * worker's lock). */
static void foreach_mq(struct frontend *fe,
                       void (*fn)(void *arg, const struct fe_rmq *rmq,
                                  const struct fe_conn *c,
                                  const struct fe_mq *mq),
                       void *arg) {
  for (uint32_t i = 0; fe->w && i < fe->n_w; i++)
    fe_rmq_foreach_mq(&fe->w[i].rmq, fn, arg);
}

/* One sample of family fam per reason (or event): the label *lab, one of
 * l's, is named key and takes each of names[] in turn. */
static void per_reason(FILE *f, int fam, struct lynx_prom_label *l,
                       struct lynx_prom_label *lab, const char *key,
                       const char *const *names, const uint64_t *v, int n) {
  lab->name = key;
  for (int r = 0; r < n; r++) {
    lab->value = names[r];
    lynx_prom_u64(f, fams[fam].name, l, v[r]);
  }
}

struct mq_pass {
  const struct frontend *fe;
  FILE **out; /* every family's buffer */
  uint64_t dispatched, responded, qdrops[FE_QDROP_MAX];
};

static void mq_line(void *arg, const struct fe_rmq *rmq,
                    const struct fe_conn *c, const struct fe_mq *mq) {
  struct mq_pass *p = arg;
  char inst[24], acc[12], q[12], wid[12];
  struct lynx_prom_label l[] = {{"service", p->fe->service},
                                {"node", c->acc.node},
                                {"instance", inst},
                                {"accel", acc},
                                {"mqueue", q},
                                {"worker", wid},
                                {NULL, NULL}, /* reason */
                                {NULL, NULL}};
  uint64_t d = lynx_cnt_get(&mq->dispatched), r = lynx_cnt_get(&mq->responded);
  uint64_t v[FE_QDROP_MAX];
  snprintf(inst, sizeof(inst), "%llu", (unsigned long long)c->acc.instance_id);
  snprintf(acc, sizeof(acc), "%u", c->acc.desc.accel_id);
  snprintf(q, sizeof(q), "%u", mq->q);
  snprintf(wid, sizeof(wid), "%u", rmq->opts.worker);
  p->dispatched += d;
  p->responded += r;
  lynx_prom_u64(p->out[F_MQ_DISPATCHED], fams[F_MQ_DISPATCHED].name, l, d);
  lynx_prom_u64(p->out[F_MQ_RESPONDED], fams[F_MQ_RESPONDED].name, l, r);
  for (int k = 0; k < FE_QDROP_MAX; k++) {
    v[k] = lynx_cnt_get(&mq->drops[k]);
    p->qdrops[k] += v[k];
  }
  per_reason(p->out[F_MQ_DROPPED], F_MQ_DROPPED, l, &l[6], "reason",
             fe_qdrop_names, v, FE_QDROP_MAX);
}

/* One service's samples, each family's into its buffer out[family]. */
static void service_lines(FILE **out, struct frontend *fe) {
  struct mq_pass p;
  uint64_t rcv = 0, moves = 0, wd[FE_WDROP_MAX] = {0}, tev[FE_TCPEV_MAX] = {0};
  uint64_t paths[FE_RX_MAX] = {0}, rx_calls = 0, rx_nobufs = 0;
  uint64_t sleeps[FE_WAKE_MAX] = {0}, ops[FE_OP_MAX] = {0};
  struct lynx_lat_hist e2e;
  struct lynx_prom_label l[] = {{"service", fe->service},
                                {NULL, NULL}, /* event or reason */
                                {NULL, NULL}};
  memset(&p, 0, sizeof(p));
  memset(&e2e, 0, sizeof(e2e));
  p.fe = fe;
  p.out = out;
  for (uint32_t i = 0; fe->w && i < fe->n_w; i++) {
    const struct fe_worker *w = &fe->w[i];
    rcv += lynx_cnt_get(&w->ingress.received);
    moves += lynx_cnt_get(&w->ingress.flow_moves);
    rx_calls += lynx_cnt_get(&w->ingress.rx_calls);
    rx_nobufs += lynx_cnt_get(&w->ingress.rx_nobufs);
    if (__atomic_load_n(&w->ingress.udp_open, __ATOMIC_RELAXED))
      paths[__atomic_load_n(&w->ingress.rx_path, __ATOMIC_RELAXED)]++;
    for (int r = 0; r < FE_TCPEV_MAX; r++)
      tev[r] += lynx_cnt_get(&w->tcpsvc.events[r]);
    for (int r = 0; r < FE_WAKE_MAX; r++)
      sleeps[r] += lynx_cnt_get(&w->sleeps[r]);
    for (int r = 0; r < FE_OP_MAX; r++)
      ops[r] += lynx_cnt_get(&w->rmq.op_counts[r]);
    for (int r = 0; r < FE_WDROP_MAX; r++)
      wd[r] += lynx_cnt_get(&w->ingress.drops[r]);
    lynx_lat_merge(&e2e, &w->egress.e2e);
    p.dispatched += lynx_cnt_get(&w->rmq.retired_dispatched);
    p.responded += lynx_cnt_get(&w->rmq.retired_responded);
    for (int r = 0; r < FE_QDROP_MAX; r++)
      p.qdrops[r] += lynx_cnt_get(&w->rmq.retired_drops[r]);
  }
  foreach_mq(fe, mq_line, &p);
  lynx_prom_u64(out[F_RECEIVED], fams[F_RECEIVED].name, l, rcv);
  lynx_prom_histogram(out[F_DURATION], fams[F_DURATION].name, l, &e2e);
  lynx_prom_u64(out[F_FLOW_MOVES], fams[F_FLOW_MOVES].name, l, moves);
  per_reason(out[F_SLEEPS], F_SLEEPS, l, &l[1], "woken_by", wake_names, sleeps,
             FE_WAKE_MAX);
  per_reason(out[F_TRANSPORT_OPS], F_TRANSPORT_OPS, l, &l[1], "op", fe_op_names,
             ops, FE_OP_MAX);
  l[1].name = NULL;
  if (fe->proto == FE_PROTO_UDP) {
    per_reason(out[F_RX_PATH], F_RX_PATH, l, &l[1], "path", fe_rx_path_names,
               paths, FE_RX_MAX);
    l[1].name = NULL;
    lynx_prom_u64(out[F_RX_CALLS], fams[F_RX_CALLS].name, l, rx_calls);
    lynx_prom_u64(out[F_RX_NOBUFS], fams[F_RX_NOBUFS].name, l, rx_nobufs);
  }
  if (fe->proto == FE_PROTO_TCP) {
    uint64_t gone = 0;
    per_reason(out[F_TCP_CONNS], F_TCP_CONNS, l, &l[1], "event", fe_tcpev_names,
               tev, FE_TCPEV_MAX);
    for (int r = 0; r < FE_TCPEV_MAX; r++)
      if (r != FE_TCP_ACCEPTED)
        gone += tev[r];
    l[1].name = NULL;
    lynx_prom_u64(out[F_TCP_CLIENTS], fams[F_TCP_CLIENTS].name, l,
                  tev[FE_TCP_ACCEPTED] - gone);
  }
  lynx_prom_u64(out[F_DISPATCHED], fams[F_DISPATCHED].name, l, p.dispatched);
  lynx_prom_u64(out[F_RESPONDED], fams[F_RESPONDED].name, l, p.responded);
  per_reason(out[F_DROPPED], F_DROPPED, l, &l[1], "reason", fe_wdrop_names, wd,
             FE_WDROP_MAX);
  per_reason(out[F_DROPPED], F_DROPPED, l, &l[1], "reason", fe_qdrop_names,
             p.qdrops, FE_QDROP_MAX);
}

static void write_metrics(FILE *f, struct metrics_ctx *m) {
  FILE *out[F_MAX] = {NULL};
  char *buf[F_MAX] = {NULL};
  size_t len[F_MAX] = {0};
  int ok = 1;
  for (int k = 0; k < F_MAX && ok; k++)
    ok = (out[k] = open_memstream(&buf[k], &len[k])) != NULL;
  if (ok) { /* (without memory for the buffers, the scrape is empty) */
    pthread_mutex_lock(m->lock);
    for (struct frontend *fe = *m->list; fe; fe = fe->next)
      service_lines(out, fe);
    pthread_mutex_unlock(m->lock);
  }
  /* each family: its header, then its samples of every service */
  for (int k = 0; k < F_MAX; k++) {
    if (out[k])
      fclose(out[k]);
    if (ok) {
      lynx_prom_family(f, fams[k].name, fams[k].type, fams[k].help);
      fwrite(buf[k], 1, len[k], f);
    }
    free(buf[k]);
    if (ok && k == F_MQ_FIRST - 1) { /* the last service-level family */
      lynx_prom_family(f, "lynx_frontend_table_version", "gauge",
                       "The dispatch table every worker runs (coordinator "
                       "mode; 0 in static mode): behind "
                       "lynx_coordinator_table_version while a table is "
                       "being applied.");
      lynx_prom_u64(f, "lynx_frontend_table_version", NULL,
                    __atomic_load_n(m->table_version, __ATOMIC_RELAXED));
    }
  }
}

static void write_cb(FILE *f, void *arg) { write_metrics(f, arg); }

int fe_metrics_start(const char *addr, struct frontend **list,
                     pthread_mutex_t *list_lock, const uint64_t *table_version,
                     void **daemon) {
  static struct metrics_ctx ctx;
  ctx.list = list;
  ctx.lock = list_lock;
  ctx.table_version = table_version;
  return lynx_prom_start(addr, "lynx_frontend_metrics", write_cb, &ctx, daemon);
}

void fe_metrics_stop(void *daemon) { lynx_prom_stop(daemon); }

struct totals {
  uint64_t disp, resp;
};

static void add_totals(void *arg, const struct fe_rmq *rmq,
                       const struct fe_conn *c, const struct fe_mq *mq) {
  struct totals *t = arg;
  (void)rmq;
  (void)c;
  t->disp += lynx_cnt_get(&mq->dispatched);
  t->resp += lynx_cnt_get(&mq->responded);
}

void fe_log_totals(struct frontend *fe) {
  struct totals t = {0, 0};
  uint64_t rcv = 0;
  for (uint32_t i = 0; fe->w && i < fe->n_w; i++) {
    rcv += lynx_cnt_get(&fe->w[i].ingress.received);
    t.disp += lynx_cnt_get(&fe->w[i].rmq.retired_dispatched);
    t.resp += lynx_cnt_get(&fe->w[i].rmq.retired_responded);
  }
  foreach_mq(fe, add_totals, &t);
  LYNX_INFO("frontend",
            "service %s: %llu received, %llu dispatched, %llu "
            "responded",
            fe->service, (unsigned long long)rcv, (unsigned long long)t.disp,
            (unsigned long long)t.resp);
}
