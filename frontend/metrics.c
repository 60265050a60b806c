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

struct metrics_ctx {
  struct frontend **list;
  pthread_mutex_t *lock;
};

struct mq_pass {
  const struct frontend *fe;
  FILE *disp, *resp, *drop;
  uint64_t dispatched, responded, qdrops[FE_QDROP_MAX];
};

static void mq_line(void *arg, const struct fe_worker *w,
                    const struct fe_conn *c, const struct fe_mq *mq) {
  struct mq_pass *p = arg;
  char inst[24], acc[12], q[12], wid[12];
  struct lynx_prom_label l[] = {
      {"service", p->fe->service}, {"node", c->acc.node}, {"instance", inst},
      {"accel", acc}, {"mqueue", q}, {"worker", wid}, {NULL, NULL}, /* reason */
      {NULL, NULL}};
  uint64_t d = lynx_cnt_get(&mq->dispatched), r = lynx_cnt_get(&mq->responded);
  snprintf(inst, sizeof(inst), "%llu", (unsigned long long)c->acc.instance_id);
  snprintf(acc, sizeof(acc), "%u", c->acc.desc.accel_id);
  snprintf(q, sizeof(q), "%u", mq->q);
  snprintf(wid, sizeof(wid), "%u", w->id);
  p->dispatched += d;
  p->responded += r;
  lynx_prom_u64(p->disp, "lynx_mqueue_dispatched_total", l, d);
  lynx_prom_u64(p->resp, "lynx_mqueue_responded_total", l, r);
  l[6].name = "reason";
  for (int k = 0; k < FE_QDROP_MAX; k++) {
    uint64_t v = lynx_cnt_get(&mq->drops[k]);
    p->qdrops[k] += v;
    l[6].value = fe_qdrop_names[k];
    lynx_prom_u64(p->drop, "lynx_mqueue_dropped_total", l, v);
  }
}

static void write_metrics(FILE *f, struct metrics_ctx *m) {
  char *bd = NULL, *br = NULL, *bq = NULL;
  size_t ld = 0, lr = 0, lq = 0;
  FILE *fd = open_memstream(&bd, &ld), *fr = open_memstream(&br, &lr),
       *fq = open_memstream(&bq, &lq);
  if (!fd || !fr || !fq)
    goto out;
  /* every family's header first (the order operators' scrapes have),
   * then each service's samples */
  lynx_prom_family(f, "lynx_frontend_received_total", "counter",
                   "Datagrams received.");
  lynx_prom_family(f, "lynx_frontend_dispatched_total", "counter",
                   "Requests written to an mqueue.");
  lynx_prom_family(f, "lynx_frontend_responded_total", "counter",
                   "Responses sent to clients.");
  lynx_prom_family(f, "lynx_frontend_dropped_total", "counter",
                   "Requests or responses dropped, by reason.");
  lynx_prom_family(f, "lynx_frontend_tcp_connections_total", "counter",
                   "TCP service connections: accepted, and closed by reason.");
  lynx_prom_family(f, "lynx_frontend_tcp_clients", "gauge",
                   "TCP service connections open now.");
  lynx_prom_family(f, "lynx_frontend_flow_moves_total", "counter",
                   "Requests of a client flow sent to another mqueue while "
                   "earlier ones were in flight (its mqueue was full or left "
                   "dispatch): answers may be reordered.");
  lynx_prom_family(fd, "lynx_mqueue_dispatched_total", "counter",
                   "Requests written to this mqueue.");
  lynx_prom_family(fr, "lynx_mqueue_responded_total", "counter",
                   "Responses from this mqueue sent to clients.");
  lynx_prom_family(fq, "lynx_mqueue_dropped_total", "counter",
                   "Drops attributed to this mqueue, by reason.");
  pthread_mutex_lock(m->lock);
  for (struct frontend *fe = *m->list; fe; fe = fe->next) {
    struct mq_pass p;
    uint64_t rcv = 0, moves = 0, wd[FE_WDROP_MAX] = {0}, tev[FE_TCPEV_MAX] = {0};
    memset(&p, 0, sizeof(p));
    p.fe = fe;
    p.disp = fd;
    p.resp = fr;
    p.drop = fq;
    for (uint32_t i = 0; fe->w && i < fe->n_w; i++) {
      const struct fe_worker *w = &fe->w[i];
      rcv += lynx_cnt_get(&w->received);
      moves += lynx_cnt_get(&w->flow_moves);
      for (int r = 0; r < FE_TCPEV_MAX; r++)
        tev[r] += lynx_cnt_get(&w->tcp[r]);
      for (int r = 0; r < FE_WDROP_MAX; r++)
        wd[r] += lynx_cnt_get(&w->drops[r]);
      p.dispatched += lynx_cnt_get(&w->retired_dispatched);
      p.responded += lynx_cnt_get(&w->retired_responded);
      for (int r = 0; r < FE_QDROP_MAX; r++)
        p.qdrops[r] += lynx_cnt_get(&w->retired_drops[r]);
    }
    fe_foreach_mq(fe, mq_line, &p);
    struct lynx_prom_label l[] = {{"service", fe->service},
                                  {NULL, NULL}, /* event or reason */
                                  {NULL, NULL}};
    lynx_prom_u64(f, "lynx_frontend_received_total", l, rcv);
    lynx_prom_u64(f, "lynx_frontend_flow_moves_total", l, moves);
    if (fe->proto == FE_PROTO_TCP) {
      uint64_t gone = 0;
      l[1].name = "event";
      for (int r = 0; r < FE_TCPEV_MAX; r++) {
        l[1].value = fe_tcpev_names[r];
        lynx_prom_u64(f, "lynx_frontend_tcp_connections_total", l, tev[r]);
        if (r != FE_TCP_ACCEPTED)
          gone += tev[r];
      }
      l[1].name = NULL;
      lynx_prom_u64(f, "lynx_frontend_tcp_clients", l,
                    tev[FE_TCP_ACCEPTED] - gone);
    }
    lynx_prom_u64(f, "lynx_frontend_dispatched_total", l, p.dispatched);
    lynx_prom_u64(f, "lynx_frontend_responded_total", l, p.responded);
    l[1].name = "reason";
    for (int r = 0; r < FE_WDROP_MAX; r++) {
      l[1].value = fe_wdrop_names[r];
      lynx_prom_u64(f, "lynx_frontend_dropped_total", l, wd[r]);
    }
    for (int r = 0; r < FE_QDROP_MAX; r++) {
      l[1].value = fe_qdrop_names[r];
      lynx_prom_u64(f, "lynx_frontend_dropped_total", l, p.qdrops[r]);
    }
  }
  pthread_mutex_unlock(m->lock);
out:
  if (fd)
    fclose(fd);
  if (fr)
    fclose(fr);
  if (fq)
    fclose(fq);
  if (bd)
    fwrite(bd, 1, ld, f);
  if (br)
    fwrite(br, 1, lr, f);
  if (bq)
    fwrite(bq, 1, lq, f);
  free(bd);
  free(br);
  free(bq);
}

static void write_cb(FILE *f, void *arg) { write_metrics(f, arg); }

int fe_metrics_start(const char *addr, struct frontend **list,
                     pthread_mutex_t *list_lock, void **daemon) {
  static struct metrics_ctx ctx;
  ctx.list = list;
  ctx.lock = list_lock;
  return lynx_prom_start(addr, write_cb, &ctx, daemon);
}

void fe_metrics_stop(void *daemon) { lynx_prom_stop(daemon); }

struct totals {
  uint64_t disp, resp;
};

static void add_totals(void *arg, const struct fe_worker *w,
                       const struct fe_conn *c, const struct fe_mq *mq) {
  struct totals *t = arg;
  (void)w;
  (void)c;
  t->disp += lynx_cnt_get(&mq->dispatched);
  t->resp += lynx_cnt_get(&mq->responded);
}

void fe_log_totals(struct frontend *fe) {
  struct totals t = {0, 0};
  uint64_t rcv = 0;
  for (uint32_t i = 0; fe->w && i < fe->n_w; i++) {
    rcv += lynx_cnt_get(&fe->w[i].received);
    t.disp += lynx_cnt_get(&fe->w[i].retired_dispatched);
    t.resp += lynx_cnt_get(&fe->w[i].retired_responded);
  }
  fe_foreach_mq(fe, add_totals, &t);
  LYNX_INFO("frontend", "service %s: %llu received, %llu dispatched, %llu "
            "responded", fe->service, (unsigned long long)rcv,
            (unsigned long long)t.disp, (unsigned long long)t.resp);
}
