/*
 * metrics.c - Prometheus text on --metrics (libmicrohttpd, its own thread).
 *
 * Reads the workers' counters with relaxed loads; the workers never wait
 * for it. Started after the workers and stopped before them, so the worker
 * array it walks is stable while it runs.
 *
 *   GET /metrics  counters per service and per mqueue
 *   GET /healthz  200 "ok" while serving
 */
#include <errno.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend.h"
#include "log.h"

static void mq_labels(FILE *f, const struct frontend *fe, const struct fe_mq *mq,
                      const struct fe_worker *w) {
  fprintf(f, "{service=\"%s\",node=\"%s\",accel=\"%u\",mqueue=\"%u\",worker=\"%u\"}",
          fe->service, mq->conn->acc->node, mq->conn->acc->desc.accel_id,
          mq->q, w->id);
}

static void write_metrics(FILE *f, const struct frontend *fe) {
  uint64_t rcv = 0, disp = 0, resp = 0, wd[FE_WDROP_MAX] = {0},
           qd[FE_QDROP_MAX] = {0};
  for (uint32_t i = 0; i < fe->n_w; i++) {
    const struct fe_worker *w = &fe->w[i];
    rcv += lynx_cnt_get(&w->received);
    for (int r = 0; r < FE_WDROP_MAX; r++)
      wd[r] += lynx_cnt_get(&w->drops[r]);
    for (uint32_t k = 0; k < w->n_mqs; k++) {
      disp += lynx_cnt_get(&w->mqs[k].dispatched);
      resp += lynx_cnt_get(&w->mqs[k].responded);
      for (int r = 0; r < FE_QDROP_MAX; r++)
        qd[r] += lynx_cnt_get(&w->mqs[k].drops[r]);
    }
  }
  fprintf(f, "# HELP lynx_frontend_received_total Datagrams received.\n"
             "# TYPE lynx_frontend_received_total counter\n"
             "lynx_frontend_received_total{service=\"%s\"} %llu\n",
          fe->service, (unsigned long long)rcv);
  fprintf(f, "# HELP lynx_frontend_dispatched_total Requests written to an mqueue.\n"
             "# TYPE lynx_frontend_dispatched_total counter\n"
             "lynx_frontend_dispatched_total{service=\"%s\"} %llu\n",
          fe->service, (unsigned long long)disp);
  fprintf(f, "# HELP lynx_frontend_responded_total Responses sent to clients.\n"
             "# TYPE lynx_frontend_responded_total counter\n"
             "lynx_frontend_responded_total{service=\"%s\"} %llu\n",
          fe->service, (unsigned long long)resp);
  fprintf(f, "# HELP lynx_frontend_dropped_total Requests or responses dropped, by reason.\n"
             "# TYPE lynx_frontend_dropped_total counter\n");
  for (int r = 0; r < FE_WDROP_MAX; r++)
    fprintf(f, "lynx_frontend_dropped_total{service=\"%s\",reason=\"%s\"} %llu\n",
            fe->service, fe_wdrop_names[r], (unsigned long long)wd[r]);
  for (int r = 0; r < FE_QDROP_MAX; r++)
    fprintf(f, "lynx_frontend_dropped_total{service=\"%s\",reason=\"%s\"} %llu\n",
            fe->service, fe_qdrop_names[r], (unsigned long long)qd[r]);

  fprintf(f, "# HELP lynx_mqueue_dispatched_total Requests written to this mqueue.\n"
             "# TYPE lynx_mqueue_dispatched_total counter\n");
  for (uint32_t i = 0; i < fe->n_w; i++)
    for (uint32_t k = 0; k < fe->w[i].n_mqs; k++) {
      fputs("lynx_mqueue_dispatched_total", f);
      mq_labels(f, fe, &fe->w[i].mqs[k], &fe->w[i]);
      fprintf(f, " %llu\n",
              (unsigned long long)lynx_cnt_get(&fe->w[i].mqs[k].dispatched));
    }
  fprintf(f, "# HELP lynx_mqueue_responded_total Responses from this mqueue sent to clients.\n"
             "# TYPE lynx_mqueue_responded_total counter\n");
  for (uint32_t i = 0; i < fe->n_w; i++)
    for (uint32_t k = 0; k < fe->w[i].n_mqs; k++) {
      fputs("lynx_mqueue_responded_total", f);
      mq_labels(f, fe, &fe->w[i].mqs[k], &fe->w[i]);
      fprintf(f, " %llu\n",
              (unsigned long long)lynx_cnt_get(&fe->w[i].mqs[k].responded));
    }
  fprintf(f, "# HELP lynx_mqueue_dropped_total Drops attributed to this mqueue, by reason.\n"
             "# TYPE lynx_mqueue_dropped_total counter\n");
  for (uint32_t i = 0; i < fe->n_w; i++)
    for (uint32_t k = 0; k < fe->w[i].n_mqs; k++) {
      const struct fe_mq *mq = &fe->w[i].mqs[k];
      for (int r = 0; r < FE_QDROP_MAX; r++) {
        fprintf(f,
                "lynx_mqueue_dropped_total{service=\"%s\",node=\"%s\",accel="
                "\"%u\",mqueue=\"%u\",worker=\"%u\",reason=\"%s\"} %llu\n",
                fe->service, mq->conn->acc->node, mq->conn->acc->desc.accel_id,
                mq->q, fe->w[i].id, fe_qdrop_names[r],
                (unsigned long long)lynx_cnt_get(&mq->drops[r]));
      }
    }
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn,
                                  const char *url, const char *method,
                                  const char *version, const char *upload,
                                  size_t *upload_size, void **req_cls) {
  struct frontend *fe = cls;
  struct MHD_Response *resp;
  enum MHD_Result ret;
  unsigned status = MHD_HTTP_OK;
  char *buf = NULL;
  size_t len = 0;
  (void)version;
  (void)upload;
  (void)upload_size;
  (void)req_cls;
  if (strcmp(method, "GET") != 0) {
    static const char msg[] = "only GET\n";
    resp = MHD_create_response_from_buffer(sizeof(msg) - 1, (void *)msg,
                                           MHD_RESPMEM_PERSISTENT);
    status = MHD_HTTP_METHOD_NOT_ALLOWED;
  } else if (strcmp(url, "/metrics") == 0) {
    FILE *f = open_memstream(&buf, &len);
    if (!f)
      return MHD_NO;
    write_metrics(f, fe);
    fclose(f);
    resp = MHD_create_response_from_buffer(len, buf, MHD_RESPMEM_MUST_FREE);
    if (resp)
      MHD_add_response_header(resp, "Content-Type",
                              "text/plain; version=0.0.4");
  } else if (strcmp(url, "/healthz") == 0) {
    static const char msg[] = "ok\n";
    resp = MHD_create_response_from_buffer(sizeof(msg) - 1, (void *)msg,
                                           MHD_RESPMEM_PERSISTENT);
  } else {
    static const char msg[] = "not found: try /metrics or /healthz\n";
    resp = MHD_create_response_from_buffer(sizeof(msg) - 1, (void *)msg,
                                           MHD_RESPMEM_PERSISTENT);
    status = MHD_HTTP_NOT_FOUND;
  }
  if (!resp) {
    free(buf);
    return MHD_NO;
  }
  ret = MHD_queue_response(conn, status, resp);
  MHD_destroy_response(resp);
  return ret;
}

int fe_metrics_start(struct frontend *fe) {
  struct sockaddr_storage ss;
  if (!fe->cfg.metrics)
    return 0;
  if (lynx_parse_hostport(fe->cfg.metrics, &ss))
    return -EINVAL;
  fe->metrics = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, 0, NULL, NULL,
      on_request, fe, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
      MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u, MHD_OPTION_CONNECTION_LIMIT, 64u,
      MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_END);
  if (!fe->metrics) {
    LYNX_ERR("frontend", "cannot serve metrics on %s", fe->cfg.metrics);
    return -EADDRINUSE;
  }
  return 0;
}

void fe_metrics_stop(struct frontend *fe) {
  if (fe->metrics) {
    MHD_stop_daemon(fe->metrics);
    fe->metrics = NULL;
  }
  /* one line with the totals, so logs tell what happened without scraping */
  if (fe->w) {
    char *buf = NULL;
    size_t len = 0;
    uint64_t rcv = 0, disp = 0, resp = 0;
    for (uint32_t i = 0; i < fe->n_w; i++) {
      rcv += lynx_cnt_get(&fe->w[i].received);
      for (uint32_t k = 0; k < fe->w[i].n_mqs; k++) {
        disp += lynx_cnt_get(&fe->w[i].mqs[k].dispatched);
        resp += lynx_cnt_get(&fe->w[i].mqs[k].responded);
      }
    }
    (void)buf;
    (void)len;
    LYNX_INFO("frontend", "service %s: %llu received, %llu dispatched, %llu "
              "responded", fe->service, (unsigned long long)rcv,
              (unsigned long long)disp, (unsigned long long)resp);
  }
}
