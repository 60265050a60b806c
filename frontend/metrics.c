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
  char labels[320];
  uint64_t d = lynx_cnt_get(&mq->dispatched), r = lynx_cnt_get(&mq->responded);
  snprintf(labels, sizeof(labels),
           "service=\"%s\",node=\"%s\",instance=\"%llu\",accel=\"%u\","
           "mqueue=\"%u\",worker=\"%u\"",
           p->fe->service, c->acc.node, (unsigned long long)c->acc.instance_id,
           c->acc.desc.accel_id, mq->q, w->id);
  p->dispatched += d;
  p->responded += r;
  fprintf(p->disp, "lynx_mqueue_dispatched_total{%s} %llu\n", labels,
          (unsigned long long)d);
  fprintf(p->resp, "lynx_mqueue_responded_total{%s} %llu\n", labels,
          (unsigned long long)r);
  for (int k = 0; k < FE_QDROP_MAX; k++) {
    uint64_t v = lynx_cnt_get(&mq->drops[k]);
    p->qdrops[k] += v;
    fprintf(p->drop, "lynx_mqueue_dropped_total{%s,reason=\"%s\"} %llu\n",
            labels, fe_qdrop_names[k], (unsigned long long)v);
  }
}

static void write_metrics(FILE *f, struct metrics_ctx *m) {
  char *bd = NULL, *br = NULL, *bq = NULL;
  size_t ld = 0, lr = 0, lq = 0;
  FILE *fd = open_memstream(&bd, &ld), *fr = open_memstream(&br, &lr),
       *fq = open_memstream(&bq, &lq);
  if (!fd || !fr || !fq)
    goto out;
  fprintf(f, "# HELP lynx_frontend_received_total Datagrams received.\n"
             "# TYPE lynx_frontend_received_total counter\n"
             "# HELP lynx_frontend_dispatched_total Requests written to an mqueue.\n"
             "# TYPE lynx_frontend_dispatched_total counter\n"
             "# HELP lynx_frontend_responded_total Responses sent to clients.\n"
             "# TYPE lynx_frontend_responded_total counter\n"
             "# HELP lynx_frontend_dropped_total Requests or responses dropped, by reason.\n"
             "# TYPE lynx_frontend_dropped_total counter\n"
             "# HELP lynx_frontend_tcp_connections_total TCP service connections: accepted, and closed by reason.\n"
             "# TYPE lynx_frontend_tcp_connections_total counter\n"
             "# HELP lynx_frontend_tcp_clients TCP service connections open now.\n"
             "# TYPE lynx_frontend_tcp_clients gauge\n"
             "# HELP lynx_frontend_flow_moves_total Requests of a client flow sent to another mqueue while earlier ones were in flight (its mqueue was full or left dispatch): answers may be reordered.\n"
             "# TYPE lynx_frontend_flow_moves_total counter\n");
  fprintf(fd, "# HELP lynx_mqueue_dispatched_total Requests written to this mqueue.\n"
              "# TYPE lynx_mqueue_dispatched_total counter\n");
  fprintf(fr, "# HELP lynx_mqueue_responded_total Responses from this mqueue sent to clients.\n"
              "# TYPE lynx_mqueue_responded_total counter\n");
  fprintf(fq, "# HELP lynx_mqueue_dropped_total Drops attributed to this mqueue, by reason.\n"
              "# TYPE lynx_mqueue_dropped_total counter\n");
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
    fprintf(f, "lynx_frontend_received_total{service=\"%s\"} %llu\n",
            fe->service, (unsigned long long)rcv);
    fprintf(f, "lynx_frontend_flow_moves_total{service=\"%s\"} %llu\n",
            fe->service, (unsigned long long)moves);
    if (fe->proto == FE_PROTO_TCP) {
      uint64_t gone = 0;
      for (int r = 0; r < FE_TCPEV_MAX; r++) {
        fprintf(f, "lynx_frontend_tcp_connections_total{service=\"%s\","
                   "event=\"%s\"} %llu\n",
                fe->service, fe_tcpev_names[r], (unsigned long long)tev[r]);
        if (r != FE_TCP_ACCEPTED)
          gone += tev[r];
      }
      fprintf(f, "lynx_frontend_tcp_clients{service=\"%s\"} %llu\n",
              fe->service,
              (unsigned long long)(tev[FE_TCP_ACCEPTED] - gone));
    }
    fprintf(f, "lynx_frontend_dispatched_total{service=\"%s\"} %llu\n",
            fe->service, (unsigned long long)p.dispatched);
    fprintf(f, "lynx_frontend_responded_total{service=\"%s\"} %llu\n",
            fe->service, (unsigned long long)p.responded);
    for (int r = 0; r < FE_WDROP_MAX; r++)
      fprintf(f, "lynx_frontend_dropped_total{service=\"%s\",reason=\"%s\"} %llu\n",
              fe->service, fe_wdrop_names[r], (unsigned long long)wd[r]);
    for (int r = 0; r < FE_QDROP_MAX; r++)
      fprintf(f, "lynx_frontend_dropped_total{service=\"%s\",reason=\"%s\"} %llu\n",
              fe->service, fe_qdrop_names[r], (unsigned long long)p.qdrops[r]);
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
